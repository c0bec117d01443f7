//! Mistral 3's Pixtral vision tower and multimodal projector on the CPU against the reference
//! of `scripts/pixtral_reference.py` (transformers' `Mistral3ForConditionalGeneration`
//! `model.vision_tower` then `model.multi_modal_projector` in fp32, or the same math in plain
//! Python where torch is missing; the stored values say which), on a small seeded `mistral3`
//! checkpoint this test writes: 2 blocks of width 32 (4 heads of 8, gated MLP 48), 28-pixel
//! images in 16 patches of 7, merged 2 × 2 into 4 tokens an image, projected (with biases) to
//! width 32.

use std::path::Path;

use vramscope::base::units::relative_l2;
use vramscope::model::models::mistral3::encode_test_images;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model_config_with, GenOptions, ModelConfig};

const IMAGES: usize = 2;

// The reference, as `scripts/pixtral_reference.py` printed it (its first line says which way).
include!("fixtures/pixtral/reference.rs");

// `tiny()` and `write_shards`.
include!("fixtures/pixtral/tiny.rs");

fn write(dir: &Path) {
    write_shards(dir, 1);
}

/// Writes the checkpoint `scripts/pixtral_reference.py` reads (set VRAMSCOPE_PIXTRAL_FIXTURE).
#[test]
#[ignore]
fn write_fixture() {
    write(Path::new(
        &std::env::var("VRAMSCOPE_PIXTRAL_FIXTURE").unwrap(),
    ));
}

/// The stored reference is transformers 5.17.0's (torch 2.11.0, fp32 CPU, docs/gpu-runs.md
/// run 73): the tower's output through `multi_modal_projector`, checked there against
/// `get_image_features` (relative L2 0); the script's plain-Python mode gave 3.1e-8.
#[test]
fn pixtral_and_the_projector_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let ours = encode_test_images(dir.path(), IMAGES).unwrap();
    assert_eq!(ours.len(), IMAGES * 4 * 32);
    let theirs: Vec<f32> = HF_EMBEDS.iter().map(|&v| v as f32).collect();
    let e = relative_l2(&ours, &theirs);
    eprintln!("pixtral: relative L2 against the reference {e:.3e}");
    assert!(e < 1e-3, "relative L2 {e:.3e}");
    let norm = theirs.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "reference norm {norm}");
}

/// The whole V1 profile computes on the CPU with the small checkpoint: a 64-token batch holds
/// 16 images of 4 embeddings under 0.19 (SDPA with the dense block mask) and 10 of 6
/// placeholder tokens (two rows of [IMG] [IMG] [IMG_BREAK], the last [IMG_END]) under 0.11
/// (xFormers on an H100).
#[test]
fn the_profile_computes_the_encoder_on_the_cpu() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use vramscope::device::DeviceSpec;
    use vramscope::model::ModelSource;
    use vramscope::profile::{self, ProfileRequest};
    use vramscope::quant::Quant;

    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let run = |vllm: &str| {
        let req = ProfileRequest {
            model: ModelSource::Path {
                path: dir.path().to_path_buf(),
            },
            quant: Quant::F16,
            device: DeviceSpec::parse("sim:h100-80gb").unwrap(),
            vllm: vllm.into(),
            tokens: 64,
            seqs: 2,
            max_model_len: 128,
            verify: false,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let r = run("0.19");
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!((p.budget_tokens, p.items, p.tokens_per_item), (64, 16, 4));
    assert_eq!(
        e.attention,
        "PyTorch SDPA (memory-efficient, dense block mask)"
    );
    // Pixel values [16, 3, 28, 28] and embeddings [16 × 4, 32] in f16, each rounded to 512.
    assert_eq!(e.held_bytes, 75_264 + 4096);
    let r = run("0.11");
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!((p.budget_tokens, p.items, p.tokens_per_item), (64, 10, 6));
    assert_eq!(
        e.attention,
        "xFormers memory-efficient (block-diagonal bias)"
    );
    // 0.33 (Model Runner V2): uint8 pixels packed, normalized and projected in one product,
    // the images packed into one varlen attention; the batch dies before the text pass, so
    // the embeddings alone stay.
    let r = run("0.33");
    let e = r.encoder.as_ref().unwrap();
    assert_eq!(
        e.attention,
        "FlashAttention varlen (the images packed into one sequence)"
    );
    assert_eq!(e.plan.as_ref().unwrap().items, 16);
    assert_eq!(e.held_bytes, 4096);
}

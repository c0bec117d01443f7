//! LLaVA-NeXT's SigLIP vision tower through its feature layers and the multimodal projector on
//! the CPU against the reference of `scripts/llava_next_reference.py` (transformers'
//! `get_image_features` in fp32, or the same math in plain Python where torch is missing; the
//! stored values say which), on a small seeded `llava_next` checkpoint this test writes: a
//! granite language model of width 32, a tower of 3 layers of width 32 (4 heads of 8, MLP 48)
//! over 28-pixel crops in 16 patches of 7, feature layers [-3, -2] (so the tower is built up to
//! layer 2 of 3), projected from 64 to 32. One image of the 56 × 28 pinpoint (the one of the
//! most features, 56: 16 of the base crop, 2 × 1 tiles of 4 × 4 patches, 8 newlines): 3 crops.

use std::path::Path;

use vramscope::base::units::relative_l2;
use vramscope::model::models::llava_next::{encode_test_image_merged, encode_test_images};
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model_config_with, GenOptions, ModelConfig};

const CROPS: usize = 3;

// The reference, as `scripts/llava_next_reference.py` printed it (its first line says which way).
include!("fixtures/llava_next/reference.rs");

// `tiny()` and `write_shards`.
include!("fixtures/llava_next/tiny.rs");

fn write(dir: &Path) {
    write_shards(dir, 1);
}

/// Writes the checkpoint `scripts/llava_next_reference.py` reads (set
/// VRAMSCOPE_LLAVA_NEXT_FIXTURE).
#[test]
#[ignore]
fn write_fixture() {
    write(Path::new(
        &std::env::var("VRAMSCOPE_LLAVA_NEXT_FIXTURE").unwrap(),
    ));
}

/// The tiny checkpoint is what the test says: the tower built to layer 2 of 3, the projector
/// two feature layers (64) wide, the first pinpoint cut into 3 crops.
#[test]
fn the_tiny_checkpoint_builds_two_of_three_layers() {
    let mm = tiny().llava_next.unwrap();
    assert_eq!((mm.layers_used, mm.feature_width()), (2, 64));
    assert_eq!(mm.pool_indices(), vec![1, 2]);
    assert_eq!(mm.crops_per_image(), CROPS);
}

/// The stored reference is transformers 5.17's (PyTorch 2.11, fp32 CPU, on the GPU machine:
/// `python3 scripts/llava_next_reference.py DIR`, docs/gpu-runs.md run 80): the tower's hidden
/// states at the feature layers, concatenated, through `multi_modal_projector`.
#[test]
fn the_tower_features_and_projector_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let ours = encode_test_images(dir.path(), CROPS).unwrap();
    assert_eq!(ours.len(), CROPS * 16 * 32);
    let theirs: Vec<f32> = HF_EMBEDS.iter().map(|&v| v as f32).collect();
    let e = relative_l2(&ours, &theirs);
    eprintln!("llava_next: relative L2 against the reference {e:.3e}");
    assert!(e < 1e-3, "relative L2 {e:.3e}");
    let norm = theirs.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "reference norm {norm}");
}

/// The merged image (`spatial_unpad`: the base crop, then each row of the tiles' patches closed
/// by `image_newline`) against transformers 5.17's `pack_image_features` (fp32 CPU,
/// docs/gpu-runs.md run 81; the plain-Python mode renders the same math in fp64).
#[test]
fn the_merged_image_matches_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let ours = encode_test_image_merged(dir.path()).unwrap();
    assert_eq!(ours.len(), 56 * 32);
    let theirs: Vec<f32> = HF_MERGED.iter().map(|&v| v as f32).collect();
    let e = relative_l2(&ours, &theirs);
    eprintln!("llava_next merged: relative L2 against the reference {e:.3e}");
    assert!(e < 1e-3, "relative L2 {e:.3e}");
}

/// The whole V1 profile computes on the CPU with the small checkpoint under 0.19: a 128-token
/// batch holds 2 images of 56 embeddings (128 // 56), each of 3 crops through the tower, the
/// projector and the merge, then the granite text pass from the runner's `inputs_embeds`.
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
    let req = ProfileRequest {
        model: ModelSource::Path {
            path: dir.path().to_path_buf(),
        },
        quant: Quant::F16,
        device: DeviceSpec::parse("sim:h100-80gb").unwrap(),
        vllm: "0.19".into(),
        tokens: 128,
        seqs: 2,
        max_model_len: 256,
        verify: false,
        ..ProfileRequest::default()
    };
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!((p.budget_tokens, p.items, p.tokens_per_item), (128, 2, 56));
    assert_eq!(e.attention, "FlashAttention varlen");
    // Pixel values [6, 3, 28, 28] f16 (28,224 bytes, rounded to 512), `image_sizes` [2, 2]
    // int64 (one block), the two merged images [56, 32] f16.
    assert_eq!(e.held_bytes, 28_672 + 512 + 2 * 3584);
    assert!(e.phase_peak_bytes > 0);
}

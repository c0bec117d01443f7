//! Qwen2.5-VL's vision tower and patch merger on the CPU against the reference of
//! `scripts/qwen2_5_vl_reference.py` (transformers' `Qwen2_5_VLForConditionalGeneration`
//! `model.visual(pixel_values, grid_thw=...)` in fp32, or the same math in plain Python where
//! torch is missing; the stored values' first line says which), on a small seeded
//! `qwen2_5_vl` checkpoint this test writes: 3 blocks of width 32 (4 heads of 8, gated MLP
//! 48), block 1 attending over the whole image (`fullatt_block_indexes`), the others in
//! windows of 2 × 2 merged tokens (`window_size` 8 over patches of 2 merged 2 × 2), merged
//! into width 32. Two images: grid (t, h, w) = (1, 6, 10) (3 × 5 merged tokens: padded to
//! 4 × 6, six windows of 4, 4, 2, 2, 2 and 1) and (2, 4, 6) (two frames of 2 × 3 merged
//! tokens: a whole window row of padding, dropped), 108 patches, 27 embeddings.

use std::path::Path;

use vramscope::base::units::relative_l2;
use vramscope::model::models::qwen2_5_vl::encode_test_images;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model_config_with, GenOptions, ModelConfig};

const GRIDS: [(usize, usize, usize); 2] = [(1, 6, 10), (2, 4, 6)];

// The reference, as `scripts/qwen2_5_vl_reference.py` printed it (its first line says which
// way).
include!("fixtures/qwen2_5_vl/reference.rs");

// `tiny()` and `write_shards`.
include!("fixtures/qwen2_5_vl/tiny.rs");

fn write(dir: &Path) {
    write_shards(dir, 1);
}

/// Writes the checkpoint `scripts/qwen2_5_vl_reference.py` reads (set
/// VRAMSCOPE_QWEN2_5_VL_FIXTURE).
#[test]
#[ignore]
fn write_fixture() {
    write(Path::new(
        &std::env::var("VRAMSCOPE_QWEN2_5_VL_FIXTURE").unwrap(),
    ));
}

/// The tower's output through the merger, in the images' order, against the stored
/// reference (see the fixture's first line for how it was made).
#[test]
fn the_tower_and_merger_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let ours = encode_test_images(dir.path(), &GRIDS).unwrap();
    assert_eq!(ours.len(), 27 * 32);
    let theirs: Vec<f32> = HF_EMBEDS.iter().map(|&v| v as f32).collect();
    let e = relative_l2(&ours, &theirs);
    eprintln!("qwen2_5_vl: relative L2 against the reference {e:.3e}");
    assert!(e < 1e-3, "relative L2 {e:.3e}");
    let norm = theirs.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "reference norm {norm}");
}

/// The whole V1 profile computes on the CPU with the small checkpoint and a
/// preprocessor_config.json of `max_pixels` 192 (12 merged tokens of 4 × 4 pixels: a 16 × 12
/// dummy image, grid (1, 6, 8), 12 embeddings). A 128-token context holds a 14-frame dummy
/// video (7 temporal patches, 84 embeddings), more than the image: vLLM profiles one video,
/// budget 84 tokens. With videos limited to 0 it profiles 5 images (64 // 12) into the
/// 64-token batch.
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
    std::fs::write(
        dir.path().join("preprocessor_config.json"),
        r#"{"min_pixels": 16, "max_pixels": 192, "patch_size": 2, "merge_size": 2,
            "temporal_patch_size": 2}"#,
    )
    .unwrap();
    let run = |vllm: &str, videos: Option<u64>| {
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
            limit_mm_videos: videos,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let r = run("0.19", None);
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!(
        (
            p.budget_tokens,
            p.items,
            p.tokens_per_item,
            p.modality.as_str()
        ),
        (84, 1, 84, "video")
    );
    assert_eq!(e.attention, "FlashAttention varlen");
    // pixel_values_videos [336, 24], second_per_grid_ts [1], the embeddings [84, 32] (f16)
    // and the cached cos and sin [336, 4], each block rounded to 512 bytes (video_grid_thw
    // stays on the host).
    assert_eq!(e.held_bytes, 16_384 + 512 + 5_632 + 2 * 3_072);
    let r = run("0.15", Some(0));
    let p = r.encoder.as_ref().unwrap().plan.clone().unwrap();
    assert_eq!(
        (
            p.budget_tokens,
            p.items,
            p.tokens_per_item,
            p.modality.as_str()
        ),
        (64, 5, 12, "image")
    );
    // Model Runner V2 with uint8 pixels normalized on the device (0.28: before the tower,
    // 0.33: inside it, by FusedMMInputNorm's CUDA kernel), computed on the CPU: the batch
    // dies before the text pass, the embeddings [84, 32] (f16) and the cached cos and sin
    // stay; the two f32 [3] buffers load with the tower.
    let r19 = run("0.19", None);
    for v in ["0.28", "0.33"] {
        let r = run(v, None);
        let e = r.encoder.as_ref().unwrap();
        assert_eq!(e.held_bytes, 5_632 + 2 * 3_072, "{v}");
        assert_eq!(
            e.weights_bytes,
            r19.encoder.as_ref().unwrap().weights_bytes + 24,
            "{v}"
        );
    }
}

//! Kimi-VL's MoonViT tower and projector on the CPU against the reference of
//! `scripts/kimi_vl_reference.py` (vLLM 0.19.0's algorithm rendered in PyTorch ops in fp32, or
//! the same math in plain Python where torch is missing; the stored values' first line says
//! which; transformers has no Kimi-VL), on a small seeded `kimi_vl` checkpoint this test
//! writes: a DeepSeek-V3 language model of width 48, a tower of 2 blocks of width 32 (4 heads
//! of 8, MLP 48) over patches of 2 pixels with a 4 × 6 position grid, merged 2 × 2 into the
//! projector (128 → 128 → 48). Three images of (6, 8), (4, 6) and (2, 10) patches: the grid
//! resized up, kept as it is (no interpolation), and squeezed in height while stretched in
//! width; 92 patches, 23 embeddings.

use std::path::Path;

use vramscope::base::units::relative_l2;
use vramscope::model::models::kimi_vl::encode_test_images;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model_config_with, GenOptions, ModelConfig};

const GRIDS: [(usize, usize); 3] = [(6, 8), (4, 6), (2, 10)];

// The reference, as `scripts/kimi_vl_reference.py` printed it (its first line says which way).
include!("fixtures/kimi_vl/reference.rs");

// `tiny()` and `write_shards`.
include!("fixtures/kimi_vl/tiny.rs");

fn write(dir: &Path) {
    write_shards(dir, 1);
}

/// Writes the checkpoint `scripts/kimi_vl_reference.py` reads (set
/// VRAMSCOPE_KIMI_VL_FIXTURE).
#[test]
#[ignore]
fn write_fixture() {
    write(Path::new(
        &std::env::var("VRAMSCOPE_KIMI_VL_FIXTURE").unwrap(),
    ));
}

/// The projector's output for the three images, in their order, against the stored reference.
#[test]
fn the_tower_and_projector_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path());
    let ours = encode_test_images(dir.path(), &GRIDS).unwrap();
    assert_eq!(ours.len(), 23 * 48);
    let theirs: Vec<f32> = HF_EMBEDS.iter().map(|&v| v as f32).collect();
    let e = relative_l2(&ours, &theirs);
    eprintln!("kimi_vl: relative L2 against the reference {e:.3e}");
    assert!(e < 1e-3, "relative L2 {e:.3e}");
    let norm = theirs.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "reference norm {norm}");
}

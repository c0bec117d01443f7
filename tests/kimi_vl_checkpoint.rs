//! A Kimi-VL checkpoint as Hugging Face writes it (moonshotai/Kimi-VL-A3B-Instruct): the
//! language model under `language_model.model.*` and `language_model.lm_head.weight`, the tower
//! under `vision_tower.*`, the projector under `multi_modal_projector.*`, the names vLLM 0.19
//! loads (`AutoWeightsLoader` by module name, kimi_vl.py L414-416, no `hf_to_vllm_mapper`), and
//! the names `gen-model` writes. The small seeded checkpoint of tests/kimi_vl_reference.rs,
//! and the same values under the config's names (the language model at the top, the layout
//! `gen-model` wrote before), which vramscope still reads.

use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use vramscope::app::bench::{self, BenchRequest};
use vramscope::device::DeviceSpec;
use vramscope::model::models::kimi_vl::encode_test_images;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model_config_with, GenOptions, ModelConfig, ModelSource};
use vramscope::quant::Quant;

// `tiny()` and `write_shards`.
include!("fixtures/kimi_vl/tiny.rs");

// `INDEX`, `rewrite`, `stored_names`, `logits`, `bits`, `open_error`.
include!("fixtures/checkpoint_names.rs");

/// The config's name of a tensor `gen-model` writes: the language model's out of
/// `language_model.`, the tower's and the projector's as they are.
fn config_name(name: &str) -> String {
    match name.strip_prefix("language_model.") {
        Some(text) if text.starts_with("model.") || text.starts_with("lm_head.") => text.into(),
        _ => name.to_string(),
    }
}

/// The tiny checkpoint in `shards` files as `gen-model` writes it (Hugging Face's names),
/// each tensor under the names `names` gives its name.
fn write_hf(dir: &Path, shards: usize, names: impl Fn(String) -> Vec<String>) {
    let gen = tempfile::tempdir().unwrap();
    write_shards(gen.path(), shards);
    rewrite(gen.path(), dir, |n| names(n.to_string()));
}

/// `gen-model` writes it sharded as the published checkpoint is (an index and two files),
/// with Hugging Face's names: it loads, and the language model's logits and the tower and
/// projector's embeddings are bit for bit those of the same values under the config's names.
#[test]
fn hugging_face_names_load_and_compute_what_top_level_names_do() {
    let hf = tempfile::tempdir().unwrap();
    write_shards(hf.path(), 2);
    let top = tempfile::tempdir().unwrap();
    rewrite(hf.path(), top.path(), |n| vec![config_name(n)]);
    assert!(stored_names(top.path()).contains(&"model.norm.weight".to_string()));
    let names = stored_names(hf.path());
    assert!(hf.path().join(INDEX).is_file());
    for want in [
        "language_model.model.embed_tokens.weight",
        "language_model.model.layers.1.mlp.experts.3.down_proj.weight",
        "language_model.model.layers.1.mlp.gate.e_score_correction_bias",
        "language_model.model.norm.weight",
        "language_model.lm_head.weight",
        "vision_tower.patch_embed.pos_emb.weight",
        "vision_tower.encoder.blocks.1.wqkv.weight",
        "vision_tower.encoder.final_layernorm.bias",
        "multi_modal_projector.linear_2.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not written");
    }
    assert!(names.iter().all(|n| {
        ["language_model.", "vision_tower.", "multi_modal_projector."]
            .iter()
            .any(|p| n.starts_with(p))
    }));
    assert_eq!(names.len(), tiny().tensor_shapes().len());

    let (ours, theirs) = (logits(hf.path()), logits(top.path()));
    assert_eq!(ours.len(), 2 * 512);
    assert_eq!(bits(&ours), bits(&theirs));
    let norm = ours.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "logits norm {norm}");

    let grids = [(6, 8), (4, 6), (2, 10)];
    let ours = encode_test_images(hf.path(), &grids).unwrap();
    let theirs = encode_test_images(top.path(), &grids).unwrap();
    assert_eq!(ours.len(), 23 * 48);
    assert_eq!(bits(&ours), bits(&theirs));
}

/// A tower tensor left out: one line naming the file and the tensor, with the shape
/// config.json implies.
#[test]
fn a_missing_tower_tensor_is_named_with_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let gone = "vision_tower.encoder.blocks.1.wo.bias";
    write_hf(dir.path(), 1, |n| if n == gone { vec![] } else { vec![n] });
    assert_eq!(
        open_error(dir.path()),
        format!(
            "{}: tensor {gone} is missing (config.json implies [32])",
            dir.path().join("model.safetensors").display()
        )
    );
}

/// The language model's tensors are named as the file would hold them.
#[test]
fn a_missing_language_model_tensor_is_named_under_language_model() {
    let dir = tempfile::tempdir().unwrap();
    let gone = "language_model.lm_head.weight";
    write_hf(dir.path(), 1, |n| if n == gone { vec![] } else { vec![n] });
    assert_eq!(
        open_error(dir.path()),
        format!(
            "{}: tensor {gone} is missing (config.json implies [512, 48])",
            dir.path().join("model.safetensors").display()
        )
    );
}

/// A tensor vLLM would refuse (here a second copy of the final norm at the top, where a
/// Kimi-VL checkpoint has no `model` module) is named with its file; the first of several,
/// the others counted.
#[test]
fn an_unknown_tensor_is_named_with_its_file() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 1, |n| match n.as_str() {
        "language_model.model.norm.weight" => vec!["model.norm.weight".into(), n],
        "vision_tower.encoder.final_layernorm.bias" => {
            vec!["vision_tower.encoder.final_norm.bias".into(), n]
        }
        _ => vec![n],
    });
    assert_eq!(
        open_error(dir.path()),
        format!(
            "{}: tensor model.norm.weight is not a parameter of KimiVLForConditionalGeneration as config.json shapes it, and vLLM refuses a checkpoint holding one (this one keeps its language model's embedding as language_model.model.embed_tokens.weight); 1 more such tensor",
            dir.path().join("model.safetensors").display()
        )
    );
}

/// What vLLM's loader passes over loads: an unused rotary buffer (`AutoWeightsLoader`'s
/// `ROTARY_EMBEDS_UNUSED_WEIGHTS`) and a bias the language model has no parameter for.
#[test]
fn tensors_vllm_passes_over_are_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), 1, |n| match n.as_str() {
        "language_model.model.norm.weight" => vec![
            "language_model.model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            "language_model.model.layers.0.self_attn.o_proj.bias".into(),
            n,
        ],
        _ => vec![n],
    });
    let source = ModelSource::Path {
        path: dir.path().to_path_buf(),
    };
    let opened = vramscope::model::open(&source, 0).unwrap();
    assert!(opened.config.kimi_vl.is_some());
}

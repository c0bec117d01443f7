//! Multimodal checkpoints under the names Hugging Face publishes them with, as vLLM 0.19 maps
//! them (`hf_to_vllm_mapper`): transformers before 4.52 saved `language_model.model.*`,
//! `language_model.lm_head.weight`, `vision_tower.*` and `multi_modal_projector.*`
//! (google/gemma-3-*-it, mistralai/Mistral-Small-3.1-24B-Instruct-2503, llava-hf's and
//! ibm-granite's granite-vision: what `gen-model` writes for these families); 4.52 and later
//! save `model.language_model.*`, `model.vision_tower.*`, `model.multi_modal_projector.*` and
//! `lm_head.weight`. Qwen2.5-VL's original checkpoints hold `model.*`, `visual.*` and
//! `lm_head.weight` (`gen-model`'s names), re-saved ones `model.language_model.*` and
//! `model.visual.*`; Llama 4's hold `language_model.*` (`gen-model`'s names), ModelOpt's
//! `model.*` and `lm_head.weight`. Each is a family's small seeded checkpoint with its tensors
//! renamed from the config's names (the language model's at the top, as a `ForCausalLM` names
//! them: the layout `gen-model` wrote before it wrote the published ones, which still loads),
//! so every value is the one the config's names hold: the logits and the tower's embeddings
//! must match bit for bit.

use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use vramscope::app::bench::{self, BenchRequest};
use vramscope::device::DeviceSpec;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model_config_with, GenOptions, ModelConfig, ModelSource};
use vramscope::quant::Quant;

// `INDEX`, `rewrite`, `stored_names`, `logits`, `bits`, `open_error`.
include!("fixtures/checkpoint_names.rs");

mod gemma3 {
    use super::*;
    include!("fixtures/siglip/tiny.rs");

    /// The checkpoint under the config's names.
    pub(super) fn write(dir: &Path, shards: usize) {
        write_config_names(dir, shards, write_shards);
    }

    /// The checkpoint as `gen-model` writes it.
    pub(super) fn gen(dir: &Path, shards: usize) {
        write_shards(dir, shards);
    }
}
mod mistral3 {
    use super::*;
    include!("fixtures/pixtral/tiny.rs");

    /// The checkpoint under the config's names.
    pub(super) fn write(dir: &Path, shards: usize) {
        write_config_names(dir, shards, write_shards);
    }

    /// The checkpoint as `gen-model` writes it.
    pub(super) fn gen(dir: &Path, shards: usize) {
        write_shards(dir, shards);
    }
}
mod llava_next {
    use super::*;
    include!("fixtures/llava_next/tiny.rs");

    pub(super) fn config() -> ModelConfig {
        tiny()
    }

    /// The checkpoint under the config's names.
    pub(super) fn write(dir: &Path, shards: usize) {
        write_config_names(dir, shards, write_shards);
    }

    /// The checkpoint as `gen-model` writes it.
    pub(super) fn gen(dir: &Path, shards: usize) {
        write_shards(dir, shards);
    }
}
mod qwen2_5_vl {
    use super::*;
    include!("fixtures/qwen2_5_vl/tiny.rs");

    /// The checkpoint under the config's names, `gen-model`'s.
    pub(super) fn write(dir: &Path, shards: usize) {
        write_shards(dir, shards);
    }

    /// The checkpoint as `gen-model` writes it.
    pub(super) fn gen(dir: &Path, shards: usize) {
        write_shards(dir, shards);
    }
}
mod llama4 {
    use super::*;
    include!("fixtures/llama4_vision/tiny.rs");

    /// The checkpoint under the config's names, `gen-model`'s.
    pub(super) fn write(dir: &Path, shards: usize) {
        write_shards(dir, shards);
    }

    /// The checkpoint as `gen-model` writes it.
    pub(super) fn gen(dir: &Path, shards: usize) {
        write_shards(dir, shards);
    }
}

/// The config's name of a language model tensor `gen-model` stores under vLLM's
/// `language_model.` (not for Llama 4, whose config keeps that prefix).
fn config_name(name: &str) -> String {
    match name.strip_prefix("language_model.") {
        Some(text) if text.starts_with("model.") || text.starts_with("lm_head.") => text.into(),
        _ => name.to_string(),
    }
}

/// The checkpoint `gen` writes in `shards` files with each tensor under its config name.
fn write_config_names(dir: &Path, shards: usize, gen: fn(&Path, usize)) {
    let published = tempfile::tempdir().unwrap();
    gen(published.path(), shards);
    rewrite(published.path(), dir, |n| vec![config_name(n)]);
}

/// The modules transformers 4.52 moved under `model.` beside the language model.
const TOWERS: [&str; 4] = [
    "vision_tower.",
    "multi_modal_projector.",
    "image_newline",
    "visual.",
];

/// transformers before 4.52: the `ForCausalLM` under `language_model.`.
fn before_4_52(name: &str) -> String {
    if name.starts_with("model.") || name.starts_with("lm_head.") {
        format!("language_model.{name}")
    } else {
        name.to_string()
    }
}

/// transformers 4.52 and later: the base model's parts under `model.`, `lm_head` at the top.
fn from_4_52(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("model.") {
        format!("model.language_model.{rest}")
    } else if TOWERS.iter().any(|t| name.starts_with(t)) {
        format!("model.{name}")
    } else {
        name.to_string()
    }
}

/// Writes the checkpoint `write` makes in `shards` files, renamed by `rename`, into `dir`.
fn write_renamed(
    dir: &Path,
    write: fn(&Path, usize),
    shards: usize,
    rename: impl Fn(&str) -> Vec<String>,
) {
    let top = tempfile::tempdir().unwrap();
    write(top.path(), shards);
    rewrite(top.path(), dir, rename);
}

/// The checkpoint `write` makes, renamed by `rename` (`want` among the names), loads, and
/// computes what `gen-model`'s names do: the parameters `inspect` counts, every logit of the
/// text pass and every embedding `encode` gives, bit for bit.
fn loads_as_written(
    write: fn(&Path, usize),
    shards: usize,
    rename: fn(&str) -> String,
    want: &[&str],
    encode: impl Fn(&Path) -> Vec<f32>,
) {
    let top = tempfile::tempdir().unwrap();
    write(top.path(), shards);
    let hf = tempfile::tempdir().unwrap();
    rewrite(top.path(), hf.path(), |n| vec![rename(n)]);
    let (ours, theirs) = (stored_names(hf.path()), stored_names(top.path()));
    assert_eq!(ours.len(), theirs.len());
    for w in want {
        assert!(ours.iter().any(|n| n == w), "{w} not written: {ours:?}");
    }
    assert_eq!(shards > 1, hf.path().join(INDEX).is_file());
    let inspected = |dir: &Path| {
        let i = vramscope::model::inspect(dir).unwrap();
        (i.parameters, i.tensors)
    };
    assert_eq!(inspected(hf.path()), inspected(top.path()));

    let (ours, theirs) = (logits(hf.path()), logits(top.path()));
    assert_eq!(bits(&ours), bits(&theirs));
    let norm = ours.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "logits norm {norm}");

    let (ours, theirs) = (encode(hf.path()), encode(top.path()));
    assert!(!ours.is_empty());
    assert_eq!(bits(&ours), bits(&theirs));
    let norm = ours.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "embeddings norm {norm}");
}

/// `gen-model`'s checkpoint of a family (`gen`, in two files): every name under one of
/// `roots`, the modules its published checkpoints hold (so none of the language model's at the
/// top where the family keeps it under `language_model.`), `want` among them; it loads, and
/// computes bit for bit what the same checkpoint under the config's names (`config`, the
/// layout `gen-model` wrote before) computes: the values stay seeded by the config's names.
fn writes_the_published_layout(
    gen: fn(&Path, usize),
    config: fn(&Path, usize),
    roots: &[&str],
    want: &[&str],
    encode: impl Fn(&Path) -> Vec<f32>,
) {
    let published = tempfile::tempdir().unwrap();
    gen(published.path(), 2);
    let names = stored_names(published.path());
    for n in &names {
        assert!(
            roots.iter().any(|r| n.starts_with(r)),
            "{n} outside {roots:?}"
        );
    }
    for w in want {
        assert!(names.iter().any(|n| n == w), "{w} not written: {names:?}");
    }
    assert!(published.path().join(INDEX).is_file());
    let source = ModelSource::Path {
        path: published.path().to_path_buf(),
    };
    vramscope::model::open(&source, 0).unwrap();

    let by_config = tempfile::tempdir().unwrap();
    config(by_config.path(), 2);
    assert_eq!(names.len(), stored_names(by_config.path()).len());
    let inspected = |dir: &Path| {
        let i = vramscope::model::inspect(dir).unwrap();
        (i.parameters, i.tensors)
    };
    assert_eq!(inspected(published.path()), inspected(by_config.path()));
    let (ours, theirs) = (logits(published.path()), logits(by_config.path()));
    assert_eq!(bits(&ours), bits(&theirs));
    let norm = ours.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "logits norm {norm}");
    let (ours, theirs) = (encode(published.path()), encode(by_config.path()));
    assert!(!ours.is_empty());
    assert_eq!(bits(&ours), bits(&theirs));
}

fn gemma3_images(dir: &Path) -> Vec<f32> {
    vramscope::model::models::gemma3_mm::encode_test_images(dir, 2).unwrap()
}

fn mistral3_images(dir: &Path) -> Vec<f32> {
    vramscope::model::models::mistral3::encode_test_images(dir, 2).unwrap()
}

/// The merged image: the tower, the projector and `image_newline`.
fn llava_next_image(dir: &Path) -> Vec<f32> {
    vramscope::model::models::llava_next::encode_test_image_merged(dir).unwrap()
}

fn qwen2_5_vl_images(dir: &Path) -> Vec<f32> {
    vramscope::model::models::qwen2_5_vl::encode_test_images(dir, &[(1, 6, 10), (2, 4, 6)]).unwrap()
}

fn llama4_tiles(dir: &Path) -> Vec<f32> {
    vramscope::model::models::llama4_vision::encode_test_images(dir, 3).unwrap()
}

/// `gen-model` writes Gemma 3 as google/gemma-3-4b-it is published: `language_model.model.*`
/// (tied: no lm_head), `vision_tower.vision_model.*`, `multi_modal_projector.*`, the module's
/// own names (gemma3_mm.py 0.19 L484-492 maps no top-level `model.`, so vLLM would refuse one:
/// utils.py L330-339).
#[test]
fn gen_model_writes_gemma3_as_published() {
    writes_the_published_layout(
        gemma3::gen,
        gemma3::write,
        &[
            "language_model.model.",
            "vision_tower.vision_model.",
            "multi_modal_projector.",
        ],
        &[
            "language_model.model.embed_tokens.weight",
            "language_model.model.layers.0.self_attn.q_proj.weight",
            "language_model.model.norm.weight",
            "vision_tower.vision_model.post_layernorm.weight",
            "multi_modal_projector.mm_input_projection_weight",
        ],
        gemma3_images,
    );
}

/// Mistral 3 as mistralai/Mistral-Small-3.1-24B-Instruct-2503 is published:
/// `language_model.model.*`, `language_model.lm_head.weight`, `vision_tower.*`,
/// `multi_modal_projector.*` (vLLM's own names; its bare `model.` mapping is for PEFT
/// LoRAs, mistral3.py 0.19 L382-384).
#[test]
fn gen_model_writes_mistral3_as_published() {
    writes_the_published_layout(
        mistral3::gen,
        mistral3::write,
        &[
            "language_model.model.",
            "language_model.lm_head.",
            "vision_tower.",
            "multi_modal_projector.",
        ],
        &[
            "language_model.model.layers.0.mlp.down_proj.weight",
            "language_model.lm_head.weight",
            "vision_tower.ln_pre.weight",
            "multi_modal_projector.patch_merger.merging_layer.weight",
        ],
        mistral3_images,
    );
}

/// LLaVA-NeXT as llava-hf's and ibm-granite/granite-vision-3.2-2b are published:
/// `language_model.model.*`, `vision_tower.vision_model.*`, `multi_modal_projector.*`,
/// `image_newline` (llava_next.py 0.19 L228-237 maps no top-level `model.`).
#[test]
fn gen_model_writes_llava_next_as_published() {
    writes_the_published_layout(
        llava_next::gen,
        llava_next::write,
        &[
            "language_model.model.",
            "vision_tower.vision_model.",
            "multi_modal_projector.",
            "image_newline",
        ],
        &[
            "language_model.model.embed_tokens.weight",
            "language_model.model.layers.0.self_attn.o_proj.weight",
            "vision_tower.vision_model.encoder.layers.2.self_attn.q_proj.bias",
            "multi_modal_projector.linear_1.weight",
            "image_newline",
        ],
        llava_next_image,
    );
}

/// Qwen2.5-VL as Qwen/Qwen2.5-VL-*-Instruct are published: the language model at the top
/// (`model.*`, `lm_head.weight`) beside `visual.*`, the "original checkpoint" vLLM's mapper
/// reads (qwen2_5_vl.py 0.19 L1026-1028): the config's names, unchanged.
#[test]
fn gen_model_writes_qwen2_5_vl_as_published() {
    writes_the_published_layout(
        qwen2_5_vl::gen,
        qwen2_5_vl::write,
        &["model.", "lm_head.", "visual."],
        &[
            "model.layers.0.self_attn.q_proj.bias",
            "lm_head.weight",
            "visual.blocks.2.mlp.gate_proj.weight",
            "visual.merger.mlp.2.bias",
        ],
        qwen2_5_vl_images,
    );
}

/// Llama 4 as meta-llama/Llama-4-Scout-17B-16E-Instruct is published: `language_model.*`,
/// `vision_model.*`, `multi_modal_projector.*` (mllama4.py 0.19 L1040-1070 looks them up as
/// they are): the config's names, unchanged.
#[test]
fn gen_model_writes_llama4_as_published() {
    writes_the_published_layout(
        llama4::gen,
        llama4::write,
        &[
            "language_model.model.",
            "language_model.lm_head.",
            "vision_model.",
            "multi_modal_projector.",
        ],
        &[
            "language_model.model.layers.0.feed_forward.experts.gate_up_proj",
            "language_model.lm_head.weight",
            "vision_model.vision_adapter.mlp.fc1.weight",
            "multi_modal_projector.linear_1.weight",
        ],
        llama4_tiles,
    );
}

/// google/gemma-3-*-it's names (sharded as published, an index and two files); vLLM reads
/// them as they are (gemma3_mm.py 0.19 L484-492 maps only 4.52's).
#[test]
fn gemma3_before_4_52_names_load() {
    loads_as_written(
        gemma3::write,
        2,
        before_4_52,
        &[
            "language_model.model.embed_tokens.weight",
            "language_model.model.layers.0.pre_feedforward_layernorm.weight",
            "vision_tower.vision_model.encoder.layers.1.mlp.fc2.bias",
            "multi_modal_projector.mm_input_projection_weight",
        ],
        gemma3_images,
    );
}

/// transformers 4.52's names: `model.language_model.`, `model.vision_tower.`,
/// `model.multi_modal_projector.` (gemma3_mm.py 0.19 L486-490).
#[test]
fn gemma3_4_52_names_load() {
    loads_as_written(
        gemma3::write,
        1,
        from_4_52,
        &[
            "model.language_model.norm.weight",
            "model.vision_tower.vision_model.post_layernorm.weight",
            "model.multi_modal_projector.mm_soft_emb_norm.weight",
        ],
        gemma3_images,
    );
}

/// The config's names (the layout `gen-model` wrote before the published one) with an untied
/// `lm_head.weight` at the top (which vLLM's LLaVA-NeXT mapper would put in the language
/// model) keep their meaning, and 4.52's names of the same checkpoint compute the same.
#[test]
fn llava_next_untied_config_names_load() {
    fn untied(dir: &Path, shards: usize) {
        let mut cfg = llava_next::config();
        cfg.tie_word_embeddings = false;
        let opts = GenOptions {
            dtype: StoredDtype::F16,
            seed: 7,
            shards,
            bnb_int8: false,
            bnb_skip_modules: Vec::new(),
        };
        gen_model_config_with(&cfg, "llava-next-tiny-untied", dir, &opts, None).unwrap();
    }
    fn untied_config_names(dir: &Path, shards: usize) {
        write_config_names(dir, shards, untied);
    }
    let dir = tempfile::tempdir().unwrap();
    untied(dir.path(), 1);
    assert!(stored_names(dir.path()).contains(&"language_model.lm_head.weight".to_string()));
    let dir = tempfile::tempdir().unwrap();
    untied_config_names(dir.path(), 1);
    assert!(stored_names(dir.path()).contains(&"lm_head.weight".to_string()));
    loads_as_written(
        untied_config_names,
        1,
        from_4_52,
        &["lm_head.weight", "model.language_model.norm.weight"],
        llava_next_image,
    );
}

/// mistralai/Mistral-Small-3.1-24B-Instruct-2503's names.
#[test]
fn mistral3_before_4_52_names_load() {
    loads_as_written(
        mistral3::write,
        2,
        before_4_52,
        &[
            "language_model.lm_head.weight",
            "language_model.model.layers.0.mlp.down_proj.weight",
            "vision_tower.transformer.layers.1.feed_forward.gate_proj.weight",
            "multi_modal_projector.patch_merger.merging_layer.weight",
        ],
        mistral3_images,
    );
}

/// 4.52's names, `lm_head.weight` at the top (mistral3.py 0.19 L375-386).
#[test]
fn mistral3_4_52_names_load() {
    loads_as_written(
        mistral3::write,
        1,
        from_4_52,
        &[
            "lm_head.weight",
            "model.language_model.embed_tokens.weight",
            "model.vision_tower.ln_pre.weight",
            "model.multi_modal_projector.linear_2.bias",
        ],
        mistral3_images,
    );
}

/// llava-hf's and granite-vision's names.
#[test]
fn llava_next_before_4_52_names_load() {
    loads_as_written(
        llava_next::write,
        2,
        before_4_52,
        &[
            "language_model.model.embed_tokens.weight",
            "vision_tower.vision_model.encoder.layers.2.self_attn.q_proj.bias",
            "multi_modal_projector.linear_1.weight",
            "image_newline",
        ],
        llava_next_image,
    );
}

/// 4.52's names, `model.image_newline` too (llava_next.py 0.19 L228-237).
#[test]
fn llava_next_4_52_names_load() {
    loads_as_written(
        llava_next::write,
        1,
        from_4_52,
        &[
            "model.language_model.norm.weight",
            "model.vision_tower.vision_model.embeddings.position_embedding.weight",
            "model.multi_modal_projector.linear_2.weight",
            "model.image_newline",
        ],
        llava_next_image,
    );
}

/// A re-saved Qwen2.5-VL: `model.language_model.*`, `model.visual.*`, `lm_head.weight`
/// (qwen2_5_vl.py 0.19 L1021-1031).
#[test]
fn qwen2_5_vl_4_52_names_load() {
    loads_as_written(
        qwen2_5_vl::write,
        2,
        from_4_52,
        &[
            "lm_head.weight",
            "model.language_model.layers.0.self_attn.q_proj.bias",
            "model.visual.blocks.2.mlp.gate_proj.weight",
            "model.visual.merger.mlp.2.bias",
        ],
        qwen2_5_vl_images,
    );
}

/// vLLM's own names (`language_model.model.*`, `language_model.lm_head.weight`, `visual.*`),
/// which its mapper leaves as they are.
#[test]
fn qwen2_5_vl_vllm_names_load() {
    loads_as_written(
        qwen2_5_vl::write,
        1,
        before_4_52,
        &[
            "language_model.lm_head.weight",
            "language_model.model.norm.weight",
            "visual.patch_embed.proj.weight",
        ],
        qwen2_5_vl_images,
    );
}

/// ModelOpt's Llama 4 names: the language model's `model.*` and `lm_head.weight` at the top,
/// moved under `language_model.` by mllama4.py 0.19 L937-979.
#[test]
fn llama4_modelopt_names_load() {
    fn top(name: &str) -> String {
        name.strip_prefix("language_model.")
            .unwrap_or(name)
            .to_string()
    }
    loads_as_written(
        llama4::write,
        2,
        top,
        &[
            "model.embed_tokens.weight",
            "model.layers.0.feed_forward.experts.gate_up_proj",
            "lm_head.weight",
            "vision_model.vision_adapter.mlp.fc1.weight",
            "multi_modal_projector.linear_1.weight",
        ],
        llama4_tiles,
    );
}

/// A Llama 4 checkpoint under a `model.` wrapper (no transformers release writes one) is
/// refused as vLLM 0.19 refuses it: its `model.language_model.*` becomes
/// `language_model.model.language_model.*`, no parameter.
#[test]
fn llama4_under_a_model_wrapper_is_refused_naming_a_tensor() {
    let dir = tempfile::tempdir().unwrap();
    write_renamed(dir.path(), llama4::write, 1, |n| {
        vec![match n.strip_prefix("language_model.") {
            Some(rest) => from_4_52(rest),
            None => format!("model.{n}"),
        }]
    });
    let file = dir.path().join("model.safetensors");
    let names = stored_names(dir.path());
    assert_eq!(names[0], "lm_head.weight");
    assert_eq!(
        open_error(dir.path()),
        format!(
            "{}: tensor model.language_model.embed_tokens.weight is not a parameter of Llama4ForConditionalGeneration as config.json shapes it, and vLLM refuses a checkpoint holding one; {} more such tensors",
            file.display(),
            names.len() - 2
        )
    );
}

/// A missing tensor is named as the file's layout would hold it: 4.52's `lm_head.weight`.
#[test]
fn a_missing_tensor_is_named_in_the_files_layout() {
    let dir = tempfile::tempdir().unwrap();
    write_renamed(dir.path(), mistral3::write, 1, |n| {
        let hf = from_4_52(n);
        if hf == "lm_head.weight" {
            vec![]
        } else {
            vec![hf]
        }
    });
    assert_eq!(
        open_error(dir.path()),
        format!(
            "{}: tensor lm_head.weight is missing (config.json implies [1024, 32])",
            dir.path().join("model.safetensors").display()
        )
    );
    let dir = tempfile::tempdir().unwrap();
    let gone = "model.visual.merger.ln_q.weight";
    write_renamed(dir.path(), qwen2_5_vl::write, 1, |n| {
        Some(from_4_52(n))
            .filter(|h| h != gone)
            .into_iter()
            .collect()
    });
    assert_eq!(
        open_error(dir.path()),
        format!(
            "{}: tensor {gone} is missing (config.json implies [32])",
            dir.path().join("model.safetensors").display()
        )
    );
}

/// A tensor vLLM's module has no place for is named with its file: under 4.52's names a
/// `model.norm.weight` at the top is not the language model's (gemma3_mm.py maps no bare
/// `model.`).
#[test]
fn an_unknown_tensor_is_named_with_its_file() {
    let dir = tempfile::tempdir().unwrap();
    write_renamed(dir.path(), gemma3::write, 1, |n| match n {
        "model.norm.weight" => vec!["model.norm.weight".into(), from_4_52(n)],
        _ => vec![from_4_52(n)],
    });
    assert_eq!(
        open_error(dir.path()),
        format!(
            "{}: tensor model.norm.weight is not a parameter of Gemma3ForConditionalGeneration as config.json shapes it, and vLLM refuses a checkpoint holding one (this one keeps its language model's embedding as model.language_model.embed_tokens.weight)",
            dir.path().join("model.safetensors").display()
        )
    );
}

/// Two stored tensors vLLM would load into one parameter (Mistral 3 maps a bare `model.` to
/// the language model too) are refused, naming both.
#[test]
fn two_names_for_one_parameter_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_renamed(dir.path(), mistral3::write, 1, |n| match n {
        "model.norm.weight" => vec![n.into(), before_4_52(n)],
        _ => vec![before_4_52(n)],
    });
    assert_eq!(
        open_error(dir.path()),
        format!(
            "{}: tensors language_model.model.norm.weight and model.norm.weight both load into Mistral3ForConditionalGeneration's language_model.model.norm.weight: a checkpoint holds one",
            dir.path().join("model.safetensors").display()
        )
    );
}

/// What vLLM's loaders pass over loads: an unused rotary buffer, a bias the language model
/// has no parameter for, and a tied `lm_head` (granite-vision ties its embeddings).
#[test]
fn tensors_vllm_passes_over_are_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_renamed(dir.path(), llava_next::write, 1, |n| match n {
        "model.norm.weight" => vec![
            "model.language_model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            "model.language_model.layers.0.self_attn.o_proj.bias".into(),
            "lm_head.weight".into(),
            from_4_52(n),
        ],
        _ => vec![from_4_52(n)],
    });
    let source = ModelSource::Path {
        path: dir.path().to_path_buf(),
    };
    let opened = vramscope::model::open(&source, 0).unwrap();
    assert!(opened.config.tie_word_embeddings);
}

//! The lists of unquantized modules in a quantized multimodal checkpoint, as `gen-model` writes
//! them and the loader reads them. `gen-model` stores the language model under its family's
//! published prefix (`language_model.model.*` for Gemma 3, Mistral 3, LLaVA-NeXT, Kimi-VL) and
//! quantizes the decoder's linear layers only, so its lists name the lm_head and every linear
//! layer of the tower and the projector as the files name them: LLM Compressor's `ignore` (each
//! unquantized module of a quantized type by its full name, compressed-tensors 0.10.2
//! quant_config.py L178-218), AutoFP8's `ignored_layers`, ModelOpt's `exclude_modules` (`root*`,
//! modelopt.py 0.19 L220-239), and bitsandbytes' `llm_int8_skip_modules` under vLLM's module
//! names (vLLM maps no bitsandbytes list, bitsandbytes.py 0.19 L172-186). vLLM 0.19 maps the
//! other lists with the model's `hf_to_vllm_mapper` before matching (`apply_vllm_mapper`:
//! compressed_tensors.py L122-153, fp8.py L152-154, awq_marlin.py L329-333, modelopt.py
//! L220-239), so transformers 4.52's names (`model.vision_tower.*`, `lm_head`) and the older
//! published ones keep the same layers 16-bit; the loader reads both. Weight bytes compare for
//! bitsandbytes here; tests/multimodal_quantized.rs loads the fp8, W4A16 and AWQ checkpoints
//! (language model quantized, tower 16-bit) and compares theirs.

mod common;

use std::path::Path;

use common::cli::profile_json_under;
use safetensors::SafeTensors;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{
    self, gen_model_config_with, Bnb4Gen, GenOptions, ModelConfig, ModelSource,
};
use vramscope::quant::bnb4::Bnb4Type;
use vramscope::quant::sparse24::Format;

include!("fixtures/multimodal_tiny.rs");

/// The families whose language model `gen-model` stores under a published prefix, and the two
/// that keep the config's names (Qwen2.5-VL's `model.*`, Llama 4's `language_model.*`).
fn families() -> Vec<(&'static str, ModelConfig)> {
    vec![
        ("gemma3", gemma3::config()),
        ("mistral3", mistral3::config()),
        ("llava_next", llava_next::config()),
        ("kimi_vl", kimi_vl::config()),
        ("qwen2_5_vl", qwen2_5_vl::config()),
        ("llama4", llama4::config()),
    ]
}

/// Each quantized format `gen-model` writes at the fixtures' shapes (AWQ, GPTQ, W4A16 and
/// block fp8 need Marlin's or the blocks' larger shapes), and where its list is kept.
fn formats() -> Vec<(&'static str, Gen)> {
    let mut v: Vec<(&'static str, Gen)> = vec![("fp8-channel", |c, d| {
        model::gen_model_config_fp8_channel(c, "mm", d, &opts(StoredDtype::BF16))
    })];
    v.extend(stored_formats());
    let more: [(&'static str, Gen); 3] = [
        ("sparse24-fp8", |c, d| {
            model::gen_sparse24::gen_model_config_sparse24(
                c,
                "mm",
                d,
                &opts(StoredDtype::BF16),
                Format::Bitmask,
                true,
            )
        }),
        ("bnb-nf4", |c, d| {
            let g = Bnb4Gen {
                quant_type: Bnb4Type::Nf4,
                double_quant: false,
            };
            gen_model_config_with(c, "mm", d, &opts(StoredDtype::F16), Some(g))
        }),
        ("bnb-int8", |c, d| {
            let mut o = opts(StoredDtype::F16);
            o.bnb_int8 = true;
            model::gen_model_config(c, "mm", d, &o)
        }),
    ];
    v.extend(more);
    v
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every list of unquantized modules the checkpoint at `dir` carries: (its key, its entries).
fn lists(dir: &Path) -> Vec<(String, Vec<String>)> {
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_string())
            .collect()
    };
    let mut out = Vec::new();
    let q = &read_json(&dir.join("config.json"))["quantization_config"];
    for key in [
        "ignore",
        "ignored_layers",
        "modules_to_not_convert",
        "llm_int8_skip_modules",
    ] {
        if !q[key].is_null() {
            out.push((key.to_string(), strings(&q[key])));
        }
    }
    if !q["sparsity_config"]["ignore"].is_null() {
        out.push((
            "sparsity_config.ignore".into(),
            strings(&q["sparsity_config"]["ignore"]),
        ));
    }
    let hq = dir.join("hf_quant_config.json");
    if hq.is_file() {
        out.push((
            "exclude_modules".into(),
            strings(&read_json(&hq)["quantization"]["exclude_modules"]),
        ));
    }
    out
}

/// (name, dtype, shape) of each stored tensor.
fn stored(dir: &Path) -> Vec<(String, safetensors::Dtype, Vec<usize>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec()))
        .collect();
    out.sort();
    out
}

/// Whether a stored tensor is the language model's.
fn is_text(name: &str) -> bool {
    ["language_model.", "model.", "lm_head."]
        .iter()
        .any(|r| name.starts_with(r))
}

/// Whether the list entry `entry` (a module name, or ModelOpt's `root*`) covers the tensor
/// `name`: the module itself, or for `root*` and a bitsandbytes or AWQ root anything under it.
fn covers(entry: &str, name: &str) -> bool {
    let e = entry.trim_end_matches('*');
    name.starts_with(&format!("{e}."))
}

/// `gen-model`'s lists name modules the written checkpoint holds, under the names it stores
/// them with: the lm_head (or, tied, the embedding that is its weight) and tower and projector
/// modules; none of the decoder's; and every 16-bit linear weight of the tower and the
/// projector falls under an entry, so vLLM (which hands those modules the quant_config) keeps
/// each in 16 bits. Each checkpoint opens: its quantized parts (NVFP4's, 2:4's, Marlin's) are
/// found under the published prefix.
#[test]
fn each_list_entry_names_a_module_of_the_written_checkpoint() {
    for (family, config) in families() {
        for (format, gen) in formats() {
            let dir = tempfile::tempdir().unwrap();
            if let Err(e) = gen(&config, dir.path()) {
                // Kimi-VL's MLA attention has no q/k/v to share one amax, and its 48-wide
                // inputs are not CUTLASS 2:4's multiple of 32.
                let mla = ["nvfp4-ct", "nvfp4-modelopt", "modelopt-fp8", "sparse24-fp8"];
                assert!(
                    family == "kimi_vl" && mla.contains(&format),
                    "{family} {format}: {e}"
                );
                continue;
            }
            check_lists(family, format, &config, dir.path());
            decoder_is_quantized(family, format, dir.path());
            opens(dir.path()).unwrap_or_else(|e| panic!("{family} {format}: {e}"));
        }
    }
}

/// The decoder's projections are what the format quantizes: layer 0's MLP down projection is
/// stored in a quantized form (a non-16-bit weight, or the format's own packed tensors), so a
/// family whose names `gen-model` does not recognise cannot slip through as 16 bits.
fn decoder_is_quantized(family: &str, format: &str, dir: &Path) {
    let tensors = stored(dir);
    let down: Vec<_> = tensors
        .iter()
        .filter(|(n, _, _)| is_text(n) && n.contains("layers.0.") && n.contains("down_proj"))
        .collect();
    assert!(!down.is_empty(), "{family} {format}: no layer 0 down_proj");
    let quantized = down.iter().any(|(n, dtype, _)| {
        !n.ends_with("down_proj.weight")
            || !matches!(dtype, safetensors::Dtype::BF16 | safetensors::Dtype::F16)
    });
    assert!(
        quantized,
        "{family} {format}: layer 0's down_proj is stored 16-bit: {down:?}"
    );
}

/// Gemma 3's tiny shape with a language model wide enough for Marlin's tiles and 128 × 128
/// fp8 blocks (width 128, MLP 256, two KV heads of 64).
fn gemma3_wide() -> ModelConfig {
    ModelConfig::from_hf_json(&gemma3_wide_json()).unwrap()
}

/// The formats the fixtures' widths do not admit, written for `gemma3_wide`: AutoAWQ's
/// `modules_to_not_convert` names the tower's root, AutoGPTQ and block fp8 write no list
/// (vLLM 0.19 finds a GPTQ checkpoint's 16-bit layers in its files, gptq_marlin.py L302-323),
/// LLM Compressor's W4A16 its `ignore`.
#[test]
fn marlin_and_block_formats_list_the_tower_too() {
    use vramscope::quant::marlin::{Format as Packed, Method};
    let config = gemma3_wide();
    let packed = |method, ct| Packed {
        method,
        group_size: 128,
        desc_act: false,
        compressed_tensors: ct,
    };
    for (format, fmt) in [
        ("awq", packed(Method::Awq, false)),
        ("gptq", packed(Method::Gptq, false)),
        ("ct-w4a16", packed(Method::Gptq, true)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        model::gen_model_config_packed4(&config, "mm", dir.path(), &opts(StoredDtype::F16), fmt)
            .unwrap();
        let found = lists(dir.path());
        match format {
            "awq" => assert_eq!(
                found,
                vec![(
                    "modules_to_not_convert".to_string(),
                    vec!["vision_tower".to_string()]
                )]
            ),
            "gptq" => assert_eq!(found, vec![]),
            _ => assert_eq!(found[0].1.len(), 1 + 2 * 6, "{found:?}"),
        }
        if format != "gptq" {
            check_lists("gemma3", format, &config, dir.path());
        }
        opens(dir.path()).unwrap_or_else(|e| panic!("{format}: {e}"));
    }
    let dir = tempfile::tempdir().unwrap();
    model::gen_model_config_fp8_block(
        &config,
        "mm",
        dir.path(),
        &opts(StoredDtype::BF16),
        vramscope::quant::fp8_block::BlockSize { n: 128, k: 128 },
    )
    .unwrap();
    assert_eq!(lists(dir.path()), vec![]);
    opens(dir.path()).unwrap();
}

/// The checks of `each_list_entry_names_a_module_of_the_written_checkpoint` on one checkpoint.
fn check_lists(family: &str, format: &str, config: &ModelConfig, dir: &Path) {
    let tensors = stored(dir);
    let found = lists(dir);
    assert!(!found.is_empty(), "{family} {format}: no list");
    for (key, entries) in &found {
        let what = format!("{family} {format} {key}");
        for e in entries {
            let held = tensors.iter().any(|(n, _, _)| covers(e, n));
            let tied_head = e.ends_with("lm_head")
                && config.tie_word_embeddings
                && tensors.iter().any(|(n, _, _)| {
                    *n == format!("{}model.embed_tokens.weight", &e[..e.len() - 7])
                });
            assert!(held || tied_head, "{what}: {e} names no stored module");
            assert!(
                !e.contains("layers.") || !is_text(e),
                "{what}: {e} is a decoder layer"
            );
        }
        // The lm_head by its stored name: `language_model.lm_head` where the family
        // keeps its language model under that prefix.
        if key != "llm_int8_skip_modules" && key != "modules_to_not_convert" {
            let head = if family == "qwen2_5_vl" {
                "lm_head"
            } else {
                "language_model.lm_head"
            };
            assert_eq!(entries[0], head, "{what}");
        }
        for (n, dtype, shape) in &tensors {
            let tower_linear = !is_text(n)
                && n.ends_with(".weight")
                && shape.len() == 2
                && !n.ends_with("embedding.weight")
                && !n.ends_with("head.attention.out_proj.weight")
                && matches!(dtype, safetensors::Dtype::BF16 | safetensors::Dtype::F16);
            if tower_linear {
                assert!(
                    entries.iter().any(|e| covers(e, n)),
                    "{what}: {n} is left to be quantized: {entries:?}"
                );
            }
        }
    }
}

/// Gemma 3's lists, entry by entry: LLM Compressor's full names in the published layout
/// (SigLIP's six linear layers a block; the projector is a bare parameter, no linear layer),
/// ModelOpt's `vision_tower*`, bitsandbytes' `vision_tower`.
#[test]
fn gemma3_lists_name_the_siglip_tower_as_published() {
    let dir = tempfile::tempdir().unwrap();
    model::gen_model_config_fp8_channel(
        &gemma3::config(),
        "mm",
        dir.path(),
        &opts(StoredDtype::BF16),
    )
    .unwrap();
    let mut want = vec!["language_model.lm_head".to_string()];
    for l in 0..2 {
        for m in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.out_proj",
            "mlp.fc1",
            "mlp.fc2",
        ] {
            want.push(format!("vision_tower.vision_model.encoder.layers.{l}.{m}"));
        }
    }
    assert_eq!(lists(dir.path()), vec![("ignore".to_string(), want)]);

    let mo = tempfile::tempdir().unwrap();
    model::gen_modelopt_fp8::gen_model_config_modelopt_fp8(
        &gemma3::config(),
        "mm",
        mo.path(),
        &opts(StoredDtype::BF16),
    )
    .unwrap();
    assert_eq!(
        lists(mo.path()),
        vec![(
            "exclude_modules".to_string(),
            vec!["language_model.lm_head".into(), "vision_tower*".into()]
        )]
    );
}

/// Rewrites the checkpoint's `ignore` list (config.json) to `entries`.
fn set_ignore(dir: &Path, entries: &[String]) {
    let path = dir.join("config.json");
    let mut cfg = read_json(&path);
    cfg["quantization_config"]["ignore"] = serde_json::json!(entries);
    std::fs::write(&path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
}

/// transformers 4.52's names of a module stored under the published prefix (what LLM
/// Compressor writes from a model loaded by 4.52 or later): vLLM maps them back.
fn from_4_52(entry: &str) -> String {
    if let Some(rest) = entry.strip_prefix("language_model.") {
        return match rest.strip_prefix("model.") {
            Some(body) => format!("model.language_model.{body}"),
            None => rest.to_string(),
        };
    }
    if ["vision_tower.", "multi_modal_projector.", "visual."]
        .iter()
        .any(|r| entry.starts_with(r))
    {
        return format!("model.{entry}");
    }
    entry.to_string()
}

/// The weights' bytes under vLLM 0.19 on an H100, dry: the caching allocator's blocks and the
/// tensors' own bytes.
fn weights_bytes(dir: &Path) -> (u64, u64) {
    let r = profile_json_under(dir, "sim:h100-80gb:dry", "0.19");
    let b = |k: &str| r[k].as_u64().unwrap();
    (b("weights_bytes"), b("weights_tensor_bytes"))
}

fn opens(dir: &Path) -> vramscope::Result<()> {
    model::open(
        &ModelSource::Path {
            path: dir.to_path_buf(),
        },
        0,
    )
    .map(|_| ())
}

/// The FP8_DYNAMIC checkpoint of each family opens under `gen-model`'s list, 4.52's names of
/// it, LLM Compressor's recipe regexes and the lm_head alone (what `gen-model` wrote before):
/// each leaves only the tower, the projector and the lm_head 16-bit, as the files store them.
/// A decoder layer listed under either prefix is still refused by name. (Opening only: the
/// lm_head alone leaves the tower to vLLM's quantization, which the profile refuses,
/// tests/multimodal_quantized.rs.)
#[test]
fn published_and_mapped_names_open_alike() {
    for (family, config) in families() {
        let dir = tempfile::tempdir().unwrap();
        model::gen_model_config_fp8_channel(&config, "mm", dir.path(), &opts(StoredDtype::BF16))
            .unwrap();
        let written = lists(dir.path()).swap_remove(0).1;
        opens(dir.path()).unwrap_or_else(|e| panic!("{family}: {e}"));
        let regex: Vec<String> = std::iter::once("re:.*lm_head".to_string())
            .chain(
                config_roots(&written)
                    .into_iter()
                    .map(|r| format!("re:{r}.*")),
            )
            .collect();
        for (what, list) in [
            ("4.52 names", written.iter().map(|e| from_4_52(e)).collect()),
            ("recipe regexes", regex),
            ("lm_head alone", vec!["lm_head".to_string()]),
        ] {
            set_ignore(dir.path(), &list);
            opens(dir.path()).unwrap_or_else(|e| panic!("{family} {what} {list:?}: {e}"));
        }
        for text in [
            "language_model.model.layers.0.mlp.down_proj",
            "model.language_model.layers.0.mlp.down_proj",
        ] {
            set_ignore(dir.path(), &[text.to_string()]);
            let e = opens(dir.path()).expect_err(text);
            assert!(e.to_string().contains(text), "{family}: {e}");
        }
    }
}

/// The top-level modules a list's entries fall under, the lm_head's aside.
fn config_roots(entries: &[String]) -> Vec<String> {
    let mut roots: Vec<String> = Vec::new();
    for e in entries.iter().filter(|e| !e.ends_with("lm_head")) {
        let r = e.split('.').next().unwrap().to_string();
        if !roots.contains(&r) {
            roots.push(r);
        }
    }
    roots
}

/// Copies config.json alone into a fresh folder: a dry run then sizes the weights from the
/// config, its bitsandbytes skip list deciding which linear layers are 4-bit.
fn config_only(dir: &Path, skip: Option<serde_json::Value>) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let mut cfg = read_json(&dir.join("config.json"));
    if let Some(s) = skip {
        cfg["quantization_config"]["llm_int8_skip_modules"] = s;
    }
    std::fs::write(
        out.path().join("config.json"),
        serde_json::to_vec_pretty(&cfg).unwrap(),
    )
    .unwrap();
    out
}

/// `--bnb-skip-modules model.layers.0.self_attn` (a config name) is written as vLLM names the
/// module, `language_model.model.layers.0.self_attn` (Gemma 3's published name too), beside
/// the tower's root, and the checkpoint keeps that attention in 16 bits. Sized from config.json
/// alone, the list is matched as vLLM 0.19 matches it, a leading path or a whole component of
/// vLLM's module name (`is_layer_skipped_bnb`, bitsandbytes.py L172-186, no mapper): the
/// written list keeps the bytes of the files; the same list without the prefix names no module
/// of vLLM's and sizes the checkpoint as if nothing were skipped.
#[test]
fn a_bnb_skip_list_is_matched_under_vllm_module_names() {
    let g = Bnb4Gen {
        quant_type: Bnb4Type::Nf4,
        double_quant: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(StoredDtype::F16);
    o.bnb_skip_modules = vec!["model.layers.0.self_attn".into()];
    gen_model_config_with(&gemma3::config(), "mm", dir.path(), &o, Some(g)).unwrap();
    assert_eq!(
        lists(dir.path()),
        vec![(
            "llm_int8_skip_modules".to_string(),
            vec![
                "language_model.model.layers.0.self_attn".into(),
                "vision_tower".into()
            ]
        )]
    );
    let tensors = stored(dir.path());
    let q = tensors
        .iter()
        .find(|(n, _, _)| n == "language_model.model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!((q.1, q.2.clone()), (safetensors::Dtype::F16, vec![32, 32]));

    let none = tempfile::tempdir().unwrap();
    gen_model_config_with(
        &gemma3::config(),
        "mm",
        none.path(),
        &opts(StoredDtype::F16),
        Some(g),
    )
    .unwrap();
    let (files, nothing_skipped) = (weights_bytes(dir.path()), weights_bytes(none.path()));
    // The 16-bit q/k/v/o of layer 0 outweigh their NF4 codes and absmax.
    assert!(files.1 > nothing_skipped.1, "{files:?} {nothing_skipped:?}");
    assert_eq!(weights_bytes(config_only(dir.path(), None).path()), files);
    let unprefixed = serde_json::json!(["model.layers.0.self_attn", "vision_tower"]);
    assert_eq!(
        weights_bytes(config_only(dir.path(), Some(unprefixed)).path()),
        nothing_skipped
    );
    assert_eq!(
        weights_bytes(config_only(none.path(), None).path()),
        nothing_skipped
    );
}

/// The loader reads each format's list as vLLM matches it: tower and projector entries (the
/// published names, 4.52's, a regex, AutoAWQ's roots) leave no decoder layer 16-bit and are
/// read; an entry naming a decoder layer is refused naming it.
#[test]
fn tower_entries_are_read_and_decoder_entries_refused() {
    let path = Path::new("config.json");
    let awq = |list: serde_json::Value| {
        serde_json::json!({"num_hidden_layers": 1, "quantization_config": {
            "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true,
            "version": "gemm", "modules_to_not_convert": list}})
    };
    let fp8 = |list: serde_json::Value| {
        serde_json::json!({"num_hidden_layers": 1, "quantization_config": {
            "quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": list}})
    };
    for list in [
        serde_json::json!(["vision_tower", "multi_modal_projector"]),
        serde_json::json!(["visual"]),
        serde_json::json!(["model.vision_tower"]),
    ] {
        vramscope::model::sharded::stored_quant(&awq(list.clone()), path)
            .unwrap_or_else(|e| panic!("awq {list}: {e}"));
    }
    for list in [
        serde_json::json!([
            "language_model.lm_head",
            "vision_tower.vision_model.encoder.layers.0.mlp.fc1"
        ]),
        serde_json::json!([
            "lm_head",
            "model.vision_tower.transformer.layers.0.attention.q_proj"
        ]),
        serde_json::json!(["multi_modal_projector.linear_1", "visual.merger.mlp.0"]),
    ] {
        vramscope::model::sharded::stored_quant(&fp8(list.clone()), path)
            .unwrap_or_else(|e| panic!("fp8 {list}: {e}"));
    }
    for (cfg, entry) in [
        (
            awq(serde_json::json!(["model.layers.0.mlp"])),
            "model.layers.0.mlp",
        ),
        (
            fp8(serde_json::json!([
                "language_model.model.layers.0.self_attn.o_proj"
            ])),
            "language_model.model.layers.0.self_attn.o_proj",
        ),
    ] {
        let e = vramscope::model::sharded::stored_quant(&cfg, path).unwrap_err();
        assert!(e.to_string().contains(entry), "{e}");
    }
}

/// A ModelOpt FP8 multimodal checkpoint's `exclude_modules` is checked against vLLM's names of
/// the decoder (`language_model.model.layers.N.…`, `text_config.num_hidden_layers` of them)
/// after vLLM's mapping: `gen-model`'s list opens; one naming a decoder layer, in the published
/// layout, 4.52's or as ModelOpt's `root*`, is refused naming the layer.
#[test]
fn modelopt_exclude_modules_are_matched_under_vllm_names() {
    let dir = tempfile::tempdir().unwrap();
    model::gen_modelopt_fp8::gen_model_config_modelopt_fp8(
        &mistral3::config(),
        "mm",
        dir.path(),
        &opts(StoredDtype::BF16),
    )
    .unwrap();
    opens(dir.path()).unwrap();
    let hq = dir.path().join("hf_quant_config.json");
    let written = read_json(&hq);
    for (entry, layer) in [
        (
            "language_model.model.layers.0.self_attn.o_proj",
            "language_model.model.layers.0.self_attn.o_proj",
        ),
        (
            "model.language_model.layers.0.mlp.down_proj",
            "language_model.model.layers.0.mlp.down_proj",
        ),
        (
            "language_model.model.layers.0.mlp*",
            "language_model.model.layers.0.mlp.gate_up_proj",
        ),
    ] {
        let mut j = written.clone();
        j["quantization"]["exclude_modules"] = serde_json::json!(["language_model.lm_head", entry]);
        std::fs::write(&hq, serde_json::to_vec_pretty(&j).unwrap()).unwrap();
        let e = opens(dir.path()).expect_err(entry).to_string();
        assert!(
            e.contains(&format!("leaves {layer} in 16 bits")),
            "{entry}: {e}"
        );
    }
}

//! The hostile-file corpus: model files that lie about themselves. Each must give a clear
//! `Error::Model` naming the file and (where there is one) the tensor: no panic, and no
//! allocation sized by a header field (the parsers bound every count by the bytes present).
//!
//! `VRAMSCOPE_WRITE_CORPUS=DIR cargo test --test hostile_files write_corpus -- --ignored`
//! writes the corpus (and the valid files it starts from) as seeds for the fuzz targets.

mod common;

use std::path::{Path, PathBuf};

use common::{gguf_file, safetensors_raw, tiny_gguf_parts, Kv};
use vramscope::model::{self, ModelSource};
use vramscope::Error;

/// One hostile model: files to write in a fresh folder, the one to open, the file the error
/// must name, and words its message must contain.
struct Case {
    name: &'static str,
    files: Vec<(&'static str, Vec<u8>)>,
    open: &'static str,
    blamed: &'static str,
    expect: Vec<&'static str>,
}

/// A small llama: hidden 8, 1 layer, 2 heads (1 kv), ffn 16, vocab 16, tied.
fn config_json() -> String {
    serde_json::json!({
        "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 16, "tie_word_embeddings": true, "torch_dtype": "float32"
    })
    .to_string()
}

const SHAPES: [(&str, &[usize]); 11] = [
    ("model.embed_tokens.weight", &[16, 8]),
    ("model.layers.0.input_layernorm.weight", &[8]),
    ("model.layers.0.self_attn.q_proj.weight", &[8, 8]),
    ("model.layers.0.self_attn.k_proj.weight", &[4, 8]),
    ("model.layers.0.self_attn.v_proj.weight", &[4, 8]),
    ("model.layers.0.self_attn.o_proj.weight", &[8, 8]),
    ("model.layers.0.post_attention_layernorm.weight", &[8]),
    ("model.layers.0.mlp.gate_proj.weight", &[16, 8]),
    ("model.layers.0.mlp.up_proj.weight", &[16, 8]),
    ("model.layers.0.mlp.down_proj.weight", &[8, 16]),
    ("model.norm.weight", &[8]),
];

/// Header entries (name, dtype, shape, start, end) laid out back to back in F32, with edits.
fn entries(edit: impl Fn(&str, &mut String, &mut Vec<usize>)) -> Vec<(String, String, Vec<usize>)> {
    SHAPES
        .iter()
        .map(|(n, s)| {
            let mut dtype = "F32".to_string();
            let mut shape = s.to_vec();
            edit(n, &mut dtype, &mut shape);
            (n.to_string(), dtype, shape)
        })
        .collect()
}

/// A safetensors file whose header is written as given; data is as long as the honest
/// layout needs, minus `cut` bytes.
fn st_file(
    list: &[(String, String, Vec<usize>)],
    offsets: impl Fn(&str, u64, u64) -> (u64, u64),
    cut: usize,
) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut pos = 0u64;
    for (name, dtype, shape) in list {
        let size: u64 = if dtype == "I8" { 1 } else { 4 };
        let len = shape.iter().fold(size, |a, &d| a.wrapping_mul(d as u64));
        let len = if len > 1 << 20 { 256 } else { len };
        let (s, e) = offsets(name, pos, pos + len);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [s, e]}),
        );
        pos += len;
    }
    let mut h = serde_json::Value::Object(header).to_string();
    while !h.len().is_multiple_of(8) {
        h.push(' ');
    }
    let data: Vec<u8> = (0..pos as usize - cut).map(|i| (i % 7) as u8).collect();
    safetensors_raw(&h, &data)
}

fn honest() -> Vec<(String, String, Vec<usize>)> {
    entries(|_, _, _| {})
}

fn same(_: &str, s: u64, e: u64) -> (u64, u64) {
    (s, e)
}

fn st_case(name: &'static str, file: Vec<u8>, expect: Vec<&'static str>) -> Case {
    Case {
        name,
        files: vec![
            ("config.json", config_json().into_bytes()),
            ("model.safetensors", file),
        ],
        open: ".",
        blamed: "model.safetensors",
        expect,
    }
}

fn gguf_case(name: &'static str, file: Vec<u8>, expect: Vec<&'static str>) -> Case {
    Case {
        name,
        files: vec![("model.gguf", file)],
        open: "model.gguf",
        blamed: "model.gguf",
        expect,
    }
}

fn valid_gguf() -> Vec<u8> {
    let (kvs, tensors, _) = tiny_gguf_parts();
    gguf_file(&kvs, &tensors)
}

/// Offset of the first tensor-info entry in `valid_gguf()` (just after the metadata).
fn patch_u64(mut b: Vec<u8>, at: usize, v: u64) -> Vec<u8> {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    b
}

type Edit = dyn Fn(&mut Vec<(&'static str, Kv)>, &mut Vec<common::GgufTensorSpec>);

fn find(t: &[common::GgufTensorSpec], n: &str) -> usize {
    t.iter().position(|x| x.name == n).unwrap()
}

fn corpus() -> Vec<Case> {
    let mut c = Vec::new();
    let q = "model.layers.0.self_attn.q_proj.weight";
    // ---- safetensors ----
    c.push(st_case(
        "st_offset_past_end",
        st_file(
            &honest(),
            |n, s, e| {
                if n == "model.norm.weight" {
                    (s + 1000, e + 1000)
                } else {
                    (s, e)
                }
            },
            0,
        ),
        vec!["model.norm.weight", "past the end"],
    ));
    c.push(st_case(
        "st_overlapping_tensors",
        st_file(
            &honest(),
            |n, s, e| if n == q { (s - 16, e - 16) } else { (s, e) },
            0,
        ),
        vec!["overlap", "self_attn"],
    ));
    c.push(st_case(
        "st_offsets_backwards",
        st_file(&honest(), |n, s, e| if n == q { (e, s) } else { (s, e) }, 0),
        vec![q, "backwards"],
    ));
    c.push(st_case(
        "st_dtype_disagrees_with_size",
        st_file(
            &entries(|n, d, _| {
                if n == q {
                    *d = "F16".into()
                }
            }),
            same,
            0,
        ),
        vec![q, "F16 [8, 8] needs 128 bytes", "hold 256"],
    ));
    c.push(st_case(
        "st_unknown_dtype",
        st_file(
            &entries(|n, d, _| {
                if n == q {
                    *d = "Q9".into()
                }
            }),
            same,
            0,
        ),
        vec![q, "unknown dtype Q9"],
    ));
    c.push(st_case(
        "st_shape_overflows",
        st_file(
            &entries(|n, _, s| {
                if n == q {
                    *s = vec![1 << 40, 1 << 40]
                }
            }),
            |n, s, e| if n == q { (s, s + 256) } else { (s, e) },
            0,
        ),
        vec![q, "overflows"],
    ));
    c.push(st_case(
        "st_truncated_data",
        st_file(&honest(), same, 100),
        vec!["model.layers.0.mlp.down_proj.weight", "past the end"],
    ));
    c.push(st_case(
        "st_header_claims_more_than_file",
        patch_u64(st_file(&honest(), same, 0), 0, 1 << 20),
        vec!["header length 1048576 runs past the end"],
    ));
    c.push(st_case(
        "st_header_length_max",
        patch_u64(st_file(&honest(), same, 0), 0, u64::MAX),
        vec!["runs past the end"],
    ));
    c.push(st_case("st_too_short", vec![1, 2, 3], vec!["too short"]));
    c.push(st_case(
        "st_header_not_json",
        safetensors_raw("{not json}      ", &[0; 8]),
        vec!["not valid JSON"],
    ));
    c.push(st_case(
        "config_shape_disagrees_with_tensor",
        st_file(
            &entries(|n, _, s| {
                if n == q {
                    *s = vec![8, 6]
                }
            }),
            same,
            0,
        ),
        vec![q, "[8, 6]", "config.json implies [8, 8]"],
    ));
    c.push(st_case(
        "config_tensor_missing",
        st_file(
            &honest()
                .into_iter()
                .filter(|(n, _, _)| !n.contains("o_proj"))
                .collect::<Vec<_>>(),
            same,
            0,
        ),
        vec!["model.layers.0.self_attn.o_proj.weight is missing"],
    ));
    c.push(st_case(
        "int8_without_quantization_config",
        st_file(
            &entries(|n, d, _| {
                if n == q {
                    *d = "I8".into()
                }
            }),
            same,
            0,
        ),
        vec![q, "no quantization_config"],
    ));
    let mut bnb_cfg: serde_json::Value = serde_json::from_str(&config_json()).unwrap();
    bnb_cfg["quantization_config"] =
        serde_json::json!({"quant_method": "bitsandbytes", "load_in_8bit": true});
    c.push(Case {
        name: "bnb_int8_scales_missing",
        files: vec![
            ("config.json", bnb_cfg.to_string().into_bytes()),
            (
                "model.safetensors",
                st_file(
                    &entries(|n, d, _| {
                        if n == q {
                            *d = "I8".into()
                        }
                    }),
                    same,
                    0,
                ),
            ),
        ],
        open: ".",
        blamed: "model.safetensors",
        expect: vec![q, "model.layers.0.self_attn.q_proj.SCB are missing"],
    });
    c.push(Case {
        name: "config_not_json",
        files: vec![
            ("config.json", b"{\"model_type\": ".to_vec()),
            ("model.safetensors", st_file(&honest(), same, 0)),
        ],
        open: ".",
        blamed: "config.json",
        expect: vec!["not valid JSON"],
    });
    c.push(Case {
        name: "config_zero_hidden_size",
        files: vec![
            (
                "config.json",
                config_json()
                    .replace("\"hidden_size\":8", "\"hidden_size\":0")
                    .into_bytes(),
            ),
            ("model.safetensors", st_file(&honest(), same, 0)),
        ],
        open: "config.json",
        blamed: "config.json",
        expect: vec!["hidden_size"],
    });
    // ---- sharded ----
    let index = |map: serde_json::Value| {
        serde_json::json!({"weight_map": map})
            .to_string()
            .into_bytes()
    };
    let all_in = |f: &str| {
        serde_json::Value::Object(
            SHAPES
                .iter()
                .map(|(n, _)| (n.to_string(), serde_json::json!(f)))
                .collect(),
        )
    };
    let mut escape = all_in("model-00001-of-00001.safetensors");
    escape["model.norm.weight"] = serde_json::json!("../../etc/passwd.safetensors");
    c.push(Case {
        name: "index_shard_outside_folder",
        files: vec![
            ("config.json", config_json().into_bytes()),
            ("model.safetensors.index.json", index(escape)),
        ],
        open: ".",
        blamed: "model.safetensors.index.json",
        expect: vec![
            "model.norm.weight",
            "../../etc/passwd.safetensors",
            "not a .safetensors file name",
        ],
    });
    c.push(Case {
        name: "index_shard_missing",
        files: vec![
            ("config.json", config_json().into_bytes()),
            (
                "model.safetensors.index.json",
                index(all_in("model-00001-of-00002.safetensors")),
            ),
        ],
        open: "config.json",
        blamed: "model-00001-of-00002.safetensors",
        expect: vec!["shard listed in", "is missing"],
    });
    let mut wrong = all_in("a.safetensors");
    wrong[q] = serde_json::json!("b.safetensors");
    c.push(Case {
        name: "index_names_the_wrong_shard",
        files: vec![
            ("config.json", config_json().into_bytes()),
            ("model.safetensors.index.json", index(wrong)),
            ("a.safetensors", st_file(&honest(), same, 0)),
            ("b.safetensors", st_file(&honest()[..1], same, 0)),
        ],
        open: "model.safetensors.index.json",
        blamed: "b.safetensors",
        expect: vec!["model.embed_tokens.weight", "is also in"],
    });
    let mut split = all_in("a.safetensors");
    split["model.norm.weight"] = serde_json::json!("b.safetensors");
    c.push(Case {
        name: "index_disagrees_with_shards",
        files: vec![
            ("config.json", config_json().into_bytes()),
            ("model.safetensors.index.json", index(split)),
            ("a.safetensors", st_file(&honest(), same, 0)),
            (
                "b.safetensors",
                st_file(
                    &[("extra.weight".to_string(), "F32".to_string(), vec![4])],
                    same,
                    0,
                ),
            ),
        ],
        open: "a.safetensors",
        blamed: "model.safetensors.index.json",
        expect: vec!["model.norm.weight", "the index puts it in b.safetensors"],
    });
    // ---- GGUF ----
    let g = valid_gguf();
    let mut bad_magic = g.clone();
    bad_magic[..4].copy_from_slice(b"GGML");
    c.push(gguf_case(
        "gguf_bad_magic",
        bad_magic,
        vec!["not a GGUF file"],
    ));
    let mut v1 = g.clone();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    c.push(gguf_case("gguf_version_1", v1, vec!["version 1"]));
    c.push(gguf_case(
        "gguf_bogus_tensor_count",
        patch_u64(g.clone(), 8, u64::MAX / 3),
        vec!["tensor count", "impossible"],
    ));
    c.push(gguf_case(
        "gguf_bogus_metadata_count",
        patch_u64(g.clone(), 16, 1 << 40),
        vec!["metadata count", "impossible"],
    ));
    c.push(gguf_case(
        "gguf_bogus_string_length",
        patch_u64(g.clone(), 24, 1 << 50),
        vec!["metadata key", "needs 1125899906842624 bytes"],
    ));
    let alter = |f: &Edit| {
        let (mut kvs, mut tensors, _) = tiny_gguf_parts();
        f(&mut kvs, &mut tensors);
        gguf_file(&kvs, &tensors)
    };
    c.push(gguf_case(
        "gguf_offset_past_end",
        alter(&|_, t| {
            let i = find(t, "blk.1.attn_q.weight");
            t[i].offset = Some(1 << 30);
        }),
        vec!["blk.1.attn_q.weight", "runs past the end"],
    ));
    c.push(gguf_case(
        "gguf_offset_overflows",
        alter(&|_, t| {
            let i = find(t, "blk.0.ffn_up.weight");
            t[i].offset = Some(u64::MAX - 31);
        }),
        vec!["blk.0.ffn_up.weight", "runs past the end"],
    ));
    c.push(gguf_case(
        "gguf_overlapping_tensors",
        alter(&|_, t| {
            let i = find(t, "blk.0.attn_k.weight");
            t[i].offset = Some(0);
        }),
        vec!["overlaps", "blk.0.attn_k.weight"],
    ));
    c.push(gguf_case(
        "gguf_misaligned_offset",
        alter(&|_, t| {
            let i = find(t, "blk.0.attn_v.weight");
            t[i].offset = Some(3);
        }),
        vec!["blk.0.attn_v.weight", "not aligned"],
    ));
    c.push(gguf_case(
        "gguf_unsupported_type",
        alter(&|_, t| {
            let i = find(t, "blk.0.ffn_down.weight");
            t[i].ggml_type = 13;
        }),
        vec!["blk.0.ffn_down.weight", "ggml type 13"],
    ));
    c.push(gguf_case(
        "gguf_dims_overflow",
        alter(&|_, t| {
            let i = find(t, "output_norm.weight");
            t[i].dims = vec![1 << 32, 1 << 32, 1 << 32];
        }),
        vec!["output_norm.weight", "too large"],
    ));
    c.push(gguf_case(
        "gguf_block_size_mismatch",
        alter(&|_, t| {
            let i = find(t, "blk.1.attn_k.weight");
            t[i].dims = vec![48, 32];
        }),
        vec![
            "blk.1.attn_k.weight",
            "not a multiple of the Q4_1 block size 32",
        ],
    ));
    c.push(gguf_case(
        "gguf_dtype_disagrees_with_size",
        alter(&|_, t| {
            let i = find(t, "output_norm.weight");
            t[i].ggml_type = 0;
            t[i].dims = vec![64 * 1024];
        }),
        vec!["output_norm.weight", "runs past the end"],
    ));
    c.push(gguf_case(
        "gguf_shape_disagrees_with_metadata",
        alter(&|kv, _| {
            kv.retain(|(k, _)| *k != "llama.feed_forward_length");
            kv.push(("llama.feed_forward_length", Kv::U32(96)));
        }),
        vec!["blk.0.ffn_gate.weight", "metadata implies"],
    ));
    c.push(gguf_case(
        "gguf_tensor_missing",
        alter(&|_, t| {
            let i = find(t, "blk.1.ffn_norm.weight");
            t.remove(i);
        }),
        vec!["blk.1.ffn_norm.weight", "missing"],
    ));
    c.push(gguf_case(
        "gguf_duplicate_tensor",
        alter(&|_, t| {
            let i = find(t, "blk.0.attn_norm.weight");
            t[i + 1].name = t[i].name.clone();
        }),
        vec!["blk.0.attn_norm.weight", "twice"],
    ));
    c.push(gguf_case(
        "gguf_bogus_array_length",
        alter(&|kv, _| {
            kv.insert(0, ("general.languages", Kv::Strs(vec!["en".into()])));
        }),
        vec!["general.languages", "cannot fit"],
    ));
    let truncated = {
        let mut b = g.clone();
        b.truncate(b.len() - 1000);
        b
    };
    c.push(gguf_case(
        "gguf_truncated",
        truncated,
        vec!["blk.1.ffn_down.weight", "runs past the end"],
    ));
    c.push(gguf_case("gguf_empty", Vec::new(), vec!["not a GGUF file"]));
    hardening_cases(&mut c, &g);
    c
}

/// Issue 14: contradictions that used to be accepted silently, and messages that misled.
fn hardening_cases(c: &mut Vec<Case>, g: &[u8]) {
    let cfg_case = |name: &'static str, edit: &dyn Fn(&mut serde_json::Value), expect| {
        let mut v: serde_json::Value = serde_json::from_str(&config_json()).unwrap();
        edit(&mut v);
        Case {
            name,
            files: vec![
                ("config.json", v.to_string().into_bytes()),
                ("model.safetensors", st_file(&honest(), same, 0)),
            ],
            open: ".",
            blamed: "config.json",
            expect,
        }
    };
    // Issue 26: OPT's keys hold their types too (they were read with a silent default).
    let opt_case = |name: &'static str, key: &str, value: serde_json::Value, expect| {
        let mut v = serde_json::json!({
            "model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 64,
            "word_embed_proj_dim": 64, "do_layer_norm_before": true,
        });
        v[key] = value;
        Case {
            name,
            files: vec![
                ("config.json", v.to_string().into_bytes()),
                ("model.safetensors", st_file(&honest(), same, 0)),
            ],
            open: ".",
            blamed: "config.json",
            expect,
        }
    };
    c.push(opt_case(
        "config_opt_enable_bias_string",
        "enable_bias",
        "false".into(),
        vec!["'enable_bias' is \"false\" (a string), expected true or false"],
    ));
    c.push(opt_case(
        "config_opt_do_layer_norm_before_number",
        "do_layer_norm_before",
        0.into(),
        vec!["'do_layer_norm_before' is 0 (a whole number), expected true or false"],
    ));
    c.push(opt_case(
        "config_opt_activation_function_number",
        "activation_function",
        1.into(),
        vec!["'activation_function' is 1 (a whole number), expected a string"],
    ));
    c.push(cfg_case(
        "config_tie_word_embeddings_yes",
        &|v| v["tie_word_embeddings"] = "yes".into(),
        vec!["'tie_word_embeddings' is \"yes\" (a string), expected true or false"],
    ));
    c.push(cfg_case(
        "config_rms_norm_eps_zero",
        &|v| v["rms_norm_eps"] = 0.into(),
        vec!["'rms_norm_eps' is 0, expected a number above 0 and below 1"],
    ));
    c.push(cfg_case(
        "config_rms_norm_eps_huge",
        &|v| v["rms_norm_eps"] = 1e308.into(),
        vec!["'rms_norm_eps' is 1e+308"],
    ));
    c.push(cfg_case(
        "config_rope_theta_negative",
        &|v| v["rope_theta"] = (-10000.0).into(),
        vec!["'rope_theta' is -10000.0, expected a number above 1"],
    ));
    c.push(cfg_case(
        "config_float_hidden_size",
        &|v| v["hidden_size"] = 8.5.into(),
        vec!["'hidden_size' is 8.5 (a number), expected a positive integer"],
    ));
    c.push(cfg_case(
        "config_int8_threshold_word",
        &|v| {
            v["quantization_config"] = serde_json::json!({"quant_method": "bitsandbytes",
                "load_in_8bit": true, "llm_int8_threshold": "six"})
        },
        vec!["quantization_config: 'llm_int8_threshold' is \"six\" (a string)"],
    ));
    c.push(cfg_case(
        "config_is_a_session_file",
        &|v| *v = serde_json::json!({"format": 3, "events": [], "formulas": []}),
        vec!["model_type is missing"],
    ));
    c.push(Case {
        name: "config_is_a_json_array",
        files: vec![
            ("config.json", b"[1, 2, 3]".to_vec()),
            ("model.safetensors", st_file(&honest(), same, 0)),
        ],
        open: ".",
        blamed: "config.json",
        expect: vec!["config.json holds a JSON array, expected an object"],
    });
    let mut extra_layer = honest();
    extra_layer.push((
        "model.layers.1.input_layernorm.weight".into(),
        "F32".into(),
        vec![8],
    ));
    c.push(st_case(
        "st_more_layers_than_num_hidden_layers",
        st_file(&extra_layer, same, 0),
        vec![
            "num_hidden_layers is 1 but the weights hold layer 1",
            "model.layers.1.input_layernorm.weight",
        ],
    ));
    let mut trailing = st_file(&honest(), same, 0);
    trailing.extend([7u8; 64]);
    c.push(st_case(
        "st_trailing_bytes",
        trailing,
        vec!["64 trailing bytes after the last tensor's data"],
    ));
    let mut trailing = g.to_vec();
    trailing.extend([7u8; 64]);
    c.push(gguf_case(
        "gguf_trailing_bytes",
        trailing,
        vec!["64 trailing bytes after the last tensor's data"],
    ));
    let (_, tensors, _) = tiny_gguf_parts();
    c.push(gguf_case(
        "gguf_tensor_count_one_short",
        patch_u64(g.to_vec(), 8, tensors.len() as u64 - 1),
        vec![
            "trailing bytes after the last tensor's data",
            "GGUF (tensor count ",
        ],
    ));
    let (mut kvs, tensors, _) = tiny_gguf_parts();
    kvs.push(("llama.block_count", Kv::U32(2)));
    c.push(gguf_case(
        "gguf_duplicate_metadata_key",
        gguf_file(&kvs, &tensors),
        vec!["metadata key llama.block_count appears twice"],
    ));
    let (mut kvs, tensors, _) = tiny_gguf_parts();
    kvs.retain(|(k, _)| *k != "llama.block_count");
    kvs.push(("llama.block_count", Kv::U32(1)));
    c.push(gguf_case(
        "gguf_more_layers_than_block_count",
        gguf_file(&kvs, &tensors),
        vec!["llama.block_count is 1 but the weights hold layer 1"],
    ));
    let (mut kvs, tensors, _) = tiny_gguf_parts();
    kvs.retain(|(k, _)| *k != "llama.block_count");
    kvs.push(("llama.block_count", Kv::F32(2.0)));
    c.push(gguf_case(
        "gguf_float_block_count",
        gguf_file(&kvs, &tensors),
        vec!["llama.block_count is 2 (a float), expected a positive integer"],
    ));
    let (mut kvs, tensors, _) = tiny_gguf_parts();
    kvs.retain(|(k, _)| *k != "llama.rope.freq_base");
    kvs.push(("llama.rope.freq_base", Kv::F32(0.0)));
    c.push(gguf_case(
        "gguf_rope_theta_zero",
        gguf_file(&kvs, &tensors),
        vec!["'rope_theta' is 0"],
    ));
}

/// Patches the bogus-array case: its array length is set after writing (the writer is honest).
fn finish(mut case: Case) -> Case {
    if case.name == "gguf_bogus_array_length" {
        let f = &mut case.files[0].1;
        // Key "general.languages" follows the 24-byte preamble: 8 (len) + 17 + 4 (type 9)
        // + 4 (elem type) then the u64 element count.
        let at = 24 + 8 + 17 + 4 + 4;
        f[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    }
    case
}

fn write(case: &Case, dir: &Path) -> PathBuf {
    for (name, bytes) in &case.files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    dir.join(case.open)
}

#[test]
fn corpus_has_at_least_twenty_files() {
    assert!(corpus().len() >= 20, "{}", corpus().len());
}

#[test]
fn every_hostile_file_gives_a_clear_model_error() {
    let mut failures = Vec::new();
    for case in corpus().into_iter().map(finish) {
        let tmp = tempfile::tempdir().unwrap();
        let path = write(&case, tmp.path());
        let results = [
            model::open(&ModelSource::Path { path: path.clone() }, 0).err(),
            model::inspect(&path).err(),
        ];
        for r in results {
            match r {
                Some(Error::Model { path: p, problem }) => {
                    let named = p.file_name().is_some_and(|f| f == case.blamed);
                    let missing: Vec<_> = case
                        .expect
                        .iter()
                        .filter(|w| !problem.contains(**w))
                        .collect();
                    if !named || !missing.is_empty() {
                        failures.push(format!(
                            "{}: {}: {problem} (missing {missing:?})",
                            case.name,
                            p.display()
                        ));
                    }
                }
                other => failures.push(format!(
                    "{}: expected Error::Model, got {other:?}",
                    case.name
                )),
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_valid_files_the_corpus_starts_from_open() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.json"), config_json()).unwrap();
    std::fs::write(
        tmp.path().join("model.safetensors"),
        st_file(&honest(), same, 0),
    )
    .unwrap();
    let m = model::open(
        &ModelSource::Path {
            path: tmp.path().into(),
        },
        0,
    )
    .unwrap();
    assert_eq!(m.config.hidden_size, 8);
    std::fs::write(tmp.path().join("m.gguf"), valid_gguf()).unwrap();
    let g = model::open(
        &ModelSource::Path {
            path: tmp.path().join("m.gguf"),
        },
        0,
    )
    .unwrap();
    assert_eq!(g.config.hidden_size, 64);
}

#[test]
#[ignore = "writes fuzz seeds; set VRAMSCOPE_WRITE_CORPUS"]
fn write_corpus() {
    let Ok(root) = std::env::var("VRAMSCOPE_WRITE_CORPUS") else {
        return;
    };
    let root = PathBuf::from(root);
    let mut all: Vec<(String, String, Vec<u8>)> = vec![
        ("gguf".into(), "valid.gguf".into(), valid_gguf()),
        (
            "safetensors".into(),
            "valid.safetensors".into(),
            st_file(&honest(), same, 0),
        ),
        (
            "config".into(),
            "valid.json".into(),
            config_json().into_bytes(),
        ),
    ];
    for case in corpus().into_iter().map(finish) {
        for (name, bytes) in case.files {
            let target = if name.ends_with(".gguf") {
                "gguf"
            } else if name.ends_with(".safetensors") {
                "safetensors"
            } else if name.ends_with("index.json") {
                "index"
            } else {
                "config"
            };
            all.push((target.into(), format!("{}-{name}", case.name), bytes));
        }
    }
    for (target, name, bytes) in all {
        // The `safetensors` fuzz target reads a header after a 0 byte, an index after a 1.
        let (target, bytes) = match target.as_str() {
            "safetensors" => ("safetensors".to_string(), [vec![0], bytes].concat()),
            "index" => ("safetensors".to_string(), [vec![1], bytes].concat()),
            _ => (target, bytes),
        };
        let d = root.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), bytes).unwrap();
    }
}

// ---- issue 14: bounded reads and bookkeeping (files built by the test itself) ----

/// Runs `f` on a thread and fails if it takes longer than `secs` (a FIFO read hangs).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("still running: hung on a read?")
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

fn model_problem(r: Result<impl Sized, Error>) -> (PathBuf, String) {
    match r.err() {
        Some(Error::Model { path, problem }) => (path, problem),
        other => panic!("expected Error::Model, got {other:?}"),
    }
}

#[test]
fn an_index_json_that_is_a_fifo_is_named_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.json"), config_json()).unwrap();
    let ip = tmp.path().join("model.safetensors.index.json");
    mkfifo(&ip);
    let dir = tmp.path().to_path_buf();
    let (p, problem) = within(20, move || {
        model_problem(model::open(&ModelSource::Path { path: dir }, 0).map(|_| ()))
    });
    assert_eq!(p, ip);
    assert_eq!(
        problem,
        "index file is a FIFO (named pipe), expected a regular file"
    );
}

#[test]
fn a_session_file_that_is_a_fifo_dev_zero_or_sparse_is_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("session.json");
    mkfifo(&fifo);
    let sparse = tmp.path().join("sparse.json");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    let (f, s) = (fifo.clone(), sparse.clone());
    let results = within(20, move || {
        [
            model_problem(vramscope::report::export::json::read(&f).map(|_| ())).1,
            model_problem(
                vramscope::report::export::json::read(Path::new("/dev/zero")).map(|_| ()),
            )
            .1,
            model_problem(vramscope::report::export::json::read(&s).map(|_| ())).1,
        ]
    });
    assert_eq!(
        results[0],
        "session file is a FIFO (named pipe), expected a regular file"
    );
    assert_eq!(
        results[1],
        "session file is a character device, expected a regular file"
    );
    assert!(
        results[2].starts_with("session file is 8.00 GiB (8589934592 bytes), more than the"),
        "{}",
        results[2]
    );
}

#[test]
fn a_safetensors_header_of_a_million_tensors_stops_at_the_bound() {
    // 150k empty tensors (~9 MiB of header): refused while parsing, in well under a second
    // of work and without building the whole header in memory.
    let mut h = String::from("{");
    for i in 0..150_000 {
        if i > 0 {
            h.push(',');
        }
        h.push_str(&format!(
            "\"t{i}\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}"
        ));
    }
    h.push('}');
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.json"), config_json()).unwrap();
    std::fs::write(
        tmp.path().join("model.safetensors"),
        safetensors_raw(&h, &[]),
    )
    .unwrap();
    let start = std::time::Instant::now();
    let (_, problem) = model_problem(model::inspect(tmp.path()));
    assert!(
        problem.contains("more than 100000 tensor entries"),
        "{problem}"
    );
    assert!(start.elapsed().as_secs() < 10);
}

#[test]
fn a_gguf_tensor_count_above_the_bound_is_refused_before_any_entry_is_read() {
    let mut b = valid_gguf();
    b.resize(b.len() + (6 << 20), 0);
    let b = patch_u64(b, 8, 200_000);
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("m.gguf");
    std::fs::write(&p, b).unwrap();
    let (_, problem) = model_problem(model::inspect(&p));
    assert_eq!(
        problem,
        "tensor count 200000 is more than the 100000 tensors this tool reads"
    );
}

//! Block-wise fp8 checkpoints (`quantization_config.weight_block_size`, Qwen/Qwen3-8B-FP8)
//! as vLLM 0.8.5 loads and runs them: the weights' bytes of the published model from its
//! shapes, the load's allocations, a tiny model's logits against its bf16 twin, and the
//! cases refused.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::runtime::Runtime;
use vramscope::model::llama::{LlamaModel, LoadOptions, Mlp};
use vramscope::model::{self, GenOptions, ModelConfig, ModelSource};
use vramscope::quant::fp8::decode;
use vramscope::quant::fp8_block::{dequantize_rows, quantize_weight, BlockSize};
use vramscope::quant::int8::TileLayout;
use vramscope::quant::{FusedLinear, Linear, Quant};

const B128: BlockSize = BlockSize { n: 128, k: 128 };

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .expect("run vramscope")
}

/// Qwen/Qwen3-8B-FP8's config.json, as published.
fn qwen3_8b_fp8_json() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false,
        "hidden_act": "silu", "torch_dtype": "bfloat16",
        "quantization_config": {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128]
        }
    })
}

/// Writes `config.json` and a header-only `model.safetensors` (the data a sparse hole: a dry
/// run reads headers only) with every tensor at its config-implied name and shape: the
/// decoder's linear weights F8_E4M3, each with its F32 `weight_scale_inv` of
/// `[ceil(n/128), ceil(k/128)]`; the rest in BF16. Returns the stored bytes.
fn write_block_headers(dir: &Path, cfg_json: &serde_json::Value) -> u64 {
    let cfg = ModelConfig::from_hf_json(cfg_json).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(cfg_json).unwrap(),
    )
    .unwrap();
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    let mut put = |name: String, dtype: &str, shape: Vec<usize>, size: u64| {
        let bytes = shape.iter().product::<usize>() as u64 * size;
        header.insert(
            name,
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    };
    for (name, shape) in cfg.tensor_shapes() {
        if name.starts_with("model.layers.") && name.ends_with("_proj.weight") {
            let base = name.trim_end_matches(".weight").to_string();
            let grid = vec![shape[0].div_ceil(128), shape[1].div_ceil(128)];
            put(name, "F8_E4M3", shape, 1);
            put(format!("{base}.weight_scale_inv"), "F32", grid, 4);
        } else {
            put(name, "BF16", shape, 2);
        }
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f = std::fs::File::create(dir.join("model.safetensors")).unwrap();
    use std::io::Write;
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    f.set_len(8 + h.len() as u64 + offset).unwrap();
    offset
}

/// A dry `profile --json` of the model in `dir` on a simulated H100: the report.
fn dry_profile(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--vllm", "0.8", "--device", "sim:h100-80gb:dry"];
    args.extend_from_slice(extra);
    profile_json(dir, "r.json", &args).unwrap_or_else(|e| panic!("{e}"))
}

/// `profile -q --json DIR/NAME --model DIR ARGS`: the report, or the error line.
fn profile_json(dir: &Path, name: &str, args: &[&str]) -> Result<serde_json::Value, String> {
    let json = dir.join(name);
    let mut all = vec![
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let out = vramscope(&all);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap())
}

#[test]
fn qwen3_8b_fp8_weighs_its_stored_tensors_plus_the_rotary_cache_and_the_device_identity() {
    let dir = tempfile::tempdir().unwrap();
    let cfg_json = qwen3_8b_fp8_json();
    let stored = write_block_headers(dir.path(), &cfg_json);
    // Counted by hand from the published shapes, per layer: q/k/v (4096 + 2 × 1024) × 4096,
    // o 4096 × 4096, gate/up 2 × 12288 × 4096, down 4096 × 12288 one-byte codes; their
    // scale grids [32,32] + 2 × [8,32] + [32,32] + 2 × [96,32] + [32,96] of 4 bytes; two
    // bf16 norms of 4096 and q_norm, k_norm of 128. Then embed_tokens and lm_head 151936 ×
    // 4096 bf16 and the final norm.
    let per_layer_codes = 6144 * 4096 + 4096 * 4096 + 24576 * 4096 + 4096 * 12288;
    let per_layer_scales = 4 * (32 * 32 + 2 * 8 * 32 + 32 * 32 + 2 * 96 * 32 + 32 * 96);
    let per_layer_norms = 2 * (2 * 4096 + 2 * 128);
    let tables = 2 * 151936 * 4096 * 2;
    let by_hand = 36 * (per_layer_codes + per_layer_scales + per_layer_norms) + tables + 4096 * 2;
    assert_eq!(per_layer_codes, 192_937_984);
    assert_eq!(per_layer_scales, 47_104);
    assert_eq!(stored, by_hand);
    assert_eq!(stored, 9_437_399_040);
    let r = dry_profile(dir.path(), &[]);
    assert_eq!(r["quant"], "fp8", "a stored fp8 checkpoint runs as fp8");
    // vLLM 0.8.5 keeps every stored tensor as it is (block-wise process_weights_after_loading
    // re-wraps them; q/k/v and gate/up stacked: 48 and 192 scale rows), and adds the rotary
    // cache (40960 × 128 in bf16), the process's fp8 device identity (one f32) and the four
    // 0-dim f32 tensors `Attention.__init__` makes in every layer for every model
    // (`_k_scale`, `_v_scale`, `_q_scale`, `_prob_scale`, attention/layer.py L88-93).
    let scalars = 36 * 4 * 4;
    let tensors = stored + 40960 * 128 * 2 + 4 + scalars;
    assert_eq!(r["weights_tensor_bytes"].as_u64().unwrap(), tensors);
    assert_eq!(tensors, 9_447_885_380);
    // What the allocator holds: each tensor in 512-byte blocks (72 q/k norms of 256 bytes,
    // the identity's 4 bytes and the 144 scalars' 4 bytes take a block each), and
    // embed_tokens and lm_head each keep their whole 2 MiB-rounded segment (1 MiB left over
    // is not split off).
    let blocks = tensors + 72 * 256 + 508 + 144 * 508 + 2 * (1 << 20);
    assert_eq!(r["weights_bytes"].as_u64().unwrap(), blocks);
    assert_eq!(blocks, 9_450_074_624);
}

/// `(kind, tensor)` of the load's allocs and frees in layer `layer` of a dry report.
fn load_trace(r: &serde_json::Value, layer: u64) -> Vec<(String, String)> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .take_while(|e| e["tensor"] != "t1")
        .filter(|e| (e["kind"] == "alloc" || e["kind"] == "free") && e["layer"] == layer)
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_string(),
                e["tensor"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_load_makes_the_identity_once_and_the_four_attention_scales_it_deletes_after_loading() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg_json = qwen3_8b_fp8_json();
    cfg_json["num_hidden_layers"] = 2.into();
    write_block_headers(dir.path(), &cfg_json);
    let r = dry_profile(dir.path(), &[]);
    let a = |t: &str| ("alloc".to_string(), t.to_string());
    let f = |t: &str| ("free".to_string(), t.to_string());
    let l = |i: usize, t: &str| format!("model.layers.{i}.{t}");
    let mut want = Vec::new();
    for i in 0..2 {
        if i == 0 {
            want.push(a("fp8.TORCH_DEVICE_IDENTITY"));
        }
        for m in ["self_attn.qkv_proj", "self_attn.o_proj"] {
            want.push(a(&l(i, &format!("{m}.weight"))));
            want.push(a(&l(i, &format!("{m}.weight_scale_inv"))));
        }
        // `Attention.__init__`'s own scalars (kept), then its fp8 KV cache method's.
        for s in ["_k_scale", "_v_scale", "_q_scale", "_prob_scale"] {
            want.push(a(&l(i, &format!("self_attn.attn.{s}"))));
        }
        for s in ["q_scale", "k_scale", "v_scale", "prob_scale"] {
            want.push(a(&l(i, &format!("self_attn.attn.{s}"))));
        }
        for m in ["mlp.gate_up_proj", "mlp.down_proj"] {
            want.push(a(&l(i, &format!("{m}.weight"))));
            want.push(a(&l(i, &format!("{m}.weight_scale_inv"))));
        }
    }
    let mut got: Vec<_> = (0..2).flat_map(|i| load_trace(&r, i)).collect();
    // The 16-bit norms and the rotary cache come between; only fp8's own tensors here.
    got.retain(|(_, t)| {
        t.contains("_proj.weight") || t.contains(".attn.") || t.starts_with("fp8.")
    });
    let (load, after): (Vec<_>, Vec<_>) = got
        .into_iter()
        .partition(|(k, t)| k == "alloc" && !t.ends_with("_gt_0"));
    assert_eq!(load, want);
    // After loading, layer by layer: `q_scale > 0`, `prob_scale > 0`, then k, v, q, prob
    // deleted.
    let mut want_after = Vec::new();
    for i in 0..2 {
        for s in ["q_scale_gt_0", "prob_scale_gt_0"] {
            want_after.push(a(&l(i, &format!("self_attn.attn.{s}"))));
            want_after.push(f(&l(i, &format!("self_attn.attn.{s}"))));
        }
        for s in ["k_scale", "v_scale", "q_scale", "prob_scale"] {
            want_after.push(f(&l(i, &format!("self_attn.attn.{s}"))));
        }
    }
    assert_eq!(after, want_after);
}

/// A tiny Qwen3 whose every linear is a whole number of 128 × 128 blocks: hidden 256, two
/// heads of 128, one KV head (k and v of 128 rows each), MLP 512.
fn tiny_qwen3() -> ModelConfig {
    ModelConfig::from_hf_json(&serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
        "vocab_size": 1024, "max_position_embeddings": 512, "rope_theta": 1000000,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false,
        "hidden_act": "silu", "torch_dtype": "bfloat16"
    }))
    .unwrap()
}

fn bf16_opts() -> GenOptions {
    GenOptions {
        dtype: vramscope::model::weights::StoredDtype::BF16,
        seed: 0,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    }
}

fn compute_runtime() -> Runtime {
    Runtime::new(
        Device::open(&DeviceSpec::parse("sim:h100-80gb:compute").unwrap()).unwrap(),
        Arc::new(AtomicBool::new(false)),
        None,
    )
}

/// One stored tensor: name, dtype, shape, bytes.
type Stored = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

fn read_all(path: &Path) -> Vec<Stored> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect()
}

fn write_all(path: &Path, tensors: &[Stored]) {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn a_stacked_layers_dequantized_weights_are_each_code_times_its_blocks_stored_scale() {
    let dir = tempfile::tempdir().unwrap();
    model::gen_model_config_fp8_block(&tiny_qwen3(), "tiny-qwen3", dir.path(), &bf16_opts(), B128)
        .unwrap();
    let stored = read_all(&dir.path().join("model.safetensors"));
    let get = |n: &str| {
        stored
            .iter()
            .find(|t| t.0 == n)
            .unwrap_or_else(|| panic!("{n}"))
    };
    let opened = model::open(
        &ModelSource::Path {
            path: dir.path().to_path_buf(),
        },
        0,
    )
    .unwrap();
    let rt = compute_runtime();
    let opts = LoadOptions {
        quant: Quant::Fp8,
        int8_threshold: 0.0,
        int8_layout: TileLayout {
            row_pad: 8,
            col_pad: 32,
        },
        attn_scalars: 0,
        marlin: Default::default(),
    };
    let m = LlamaModel::load(&rt, &opened.config, opened.source.as_ref(), &opts).unwrap();
    let Mlp::Dense { gate_up, .. } = &m.layers[1].mlp else {
        panic!("layer 1 is not dense")
    };
    let FusedLinear::Fp8Block { linear, rows } = gate_up else {
        panic!("gate_up_proj is not block-wise fp8")
    };
    assert_eq!(rows, &vec![512, 512]);
    assert_eq!(linear.scale_inv.shape, vec![8, 2]);
    let mut loaded = vec![0f32; 1024 * 256];
    dequantize_rows(
        linear.qweight.u8(),
        linear.scale_inv.f32(),
        256,
        linear.block,
        0..1024,
        &mut loaded,
    );
    // From the file: gate's rows then up's, each code times its block's stored multiplier.
    let mut want = Vec::new();
    for part in ["gate_proj", "up_proj"] {
        let codes = &get(&format!("model.layers.1.mlp.{part}.weight")).3;
        let (_, _, shape, s) = get(&format!("model.layers.1.mlp.{part}.weight_scale_inv"));
        assert_eq!(shape, &vec![4, 2]);
        let s = f32s(s);
        for (i, &c) in codes.iter().enumerate() {
            want.push(decode(c) * s[(i / 256 / 128) * 2 + (i % 256) / 128]);
        }
    }
    assert_eq!(
        loaded.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // And down_proj, a plain layer.
    let Mlp::Dense { down, .. } = &m.layers[0].mlp else {
        panic!("layer 0 is not dense")
    };
    let Linear::Fp8Block(down) = down else {
        panic!("down_proj is not block-wise fp8")
    };
    assert_eq!(
        down.scale_inv.f32(),
        &f32s(&get("model.layers.0.mlp.down_proj.weight_scale_inv").3)[..]
    );
    assert!(m.fp8_identity.is_some());
}

/// Last-token logits of `bench` on a simulated H100 in compute mode.
fn bench_logits(dir: &Path, json_name: &str) -> Vec<f64> {
    bench_logits_as(dir, json_name, "bf16")
}

fn bench_logits_as(dir: &Path, json_name: &str, quant: &str) -> Vec<f64> {
    let json = dir.parent().unwrap().join(json_name);
    let out = vramscope(&[
        "bench",
        "--model",
        dir.to_str().unwrap(),
        "--quant",
        quant,
        "--device",
        "sim:h100-80gb:compute",
        "--tokens",
        "64",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let n: f64 = a.iter().map(|x| x * x).sum();
    (d / n).sqrt()
}

/// The factor block `(rb, cb)` of every linear is scaled by, so that blocks differ in size as
/// trained weights' do (seeded weights are alike everywhere): 1/2, 1, 2 or 4, in a pattern
/// that a transposed reading of the scale grid does not reproduce.
fn block_factor(rb: usize, cb: usize) -> f32 {
    2f32.powi(((rb + 2 * cb) % 4) as i32 - 1)
}

/// The tiny Qwen3's bf16 checkpoint with every linear's blocks scaled by `block_factor`, and
/// its block-wise fp8 twin quantized from exactly those bf16 values (`quantize_weight`, as
/// `gen-model --fp8-block` does); with `column_major_scales` each scale grid is written in
/// the wrong order (its transpose's values under the same shape).
fn twins(root: &Path, column_major_scales: bool) -> (std::path::PathBuf, std::path::PathBuf) {
    let (bf16_dir, fp8_dir) = (root.join("bf16"), root.join("fp8"));
    let cfg = tiny_qwen3();
    model::gen_model_config(&cfg, "tiny-qwen3", &bf16_dir, &bf16_opts()).unwrap();
    model::gen_model_config_fp8_block(&cfg, "tiny-qwen3", &fp8_dir, &bf16_opts(), B128).unwrap();
    let mut bf16 = read_all(&bf16_dir.join("model.safetensors"));
    let mut fp8 = read_all(&fp8_dir.join("model.safetensors"));
    for t in bf16.iter_mut() {
        if !(t.0.starts_with("model.layers.") && t.0.ends_with("_proj.weight")) {
            continue;
        }
        let (n, k) = (t.2[0], t.2[1]);
        let w: Vec<f32> =
            t.3.chunks(2)
                .enumerate()
                .map(|(i, b)| {
                    let v = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
                    half::bf16::from_f32(v * block_factor(i / k / 128, (i % k) / 128)).to_f32()
                })
                .collect();
        t.3 = w
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let (codes, scales) = quantize_weight(&w, n, k, B128);
        let (nb, kb) = (n.div_ceil(128), k.div_ceil(128));
        let scales: Vec<f32> = if column_major_scales {
            (0..nb * kb)
                .map(|i| scales[(i % nb) * kb + i / nb])
                .collect()
        } else {
            scales
        };
        let base = t.0.trim_end_matches(".weight").to_string();
        for s in fp8.iter_mut() {
            if s.0 == t.0 {
                s.3 = codes.clone();
            } else if s.0 == format!("{base}.weight_scale_inv") {
                assert_eq!(s.2, vec![nb, kb]);
                s.3 = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
            }
        }
    }
    write_all(&bf16_dir.join("model.safetensors"), &bf16);
    write_all(&fp8_dir.join("model.safetensors"), &fp8);
    (bf16_dir, fp8_dir)
}

#[test]
fn tiny_block_fp8_logits_stay_near_bf16s_and_a_transposed_scale_grid_does_not() {
    let root = tempfile::tempdir().unwrap();
    let (bf16_dir, fp8_dir) = twins(root.path(), false);
    let bf16 = bench_logits(&bf16_dir, "bf16.json");
    let fp8 = bench_logits(&fp8_dir, "fp8.json");
    let d = rel_l2(&fp8, &bf16);
    let wrong_root = tempfile::tempdir().unwrap();
    let (_, wrong_dir) = twins(wrong_root.path(), true);
    let wrong = bench_logits(&wrong_dir, "wrong.json");
    let d_wrong = rel_l2(&wrong, &bf16);
    // vLLM 0.6.4's in-flight per-tensor fp8 of the same bf16 weights, as a yardstick.
    let d_per_tensor = rel_l2(&bench_logits_as(&bf16_dir, "pt.json", "fp8"), &bf16);
    eprintln!("per-tensor in flight vs bf16 {d_per_tensor:.3e}");
    eprintln!("block fp8 vs bf16 {d:.3e}; column-major scale grids vs bf16 {d_wrong:.3e}");
    // e4m3 keeps 3 mantissa bits: each weight and activation rounds by up to 1/16 of itself,
    // in 8 quantized GEMMs of a model whose logits are small (seeded weights of std 0.02):
    // measured 1.92e-1, where vLLM 0.6.4's per-tensor fp8 of the same bf16 weights (one
    // scale per tensor, activations per tensor) measures 2.01e-1. A scale per block and per
    // token group can only fit the values as tightly or tighter, so block-wise fp8 must not
    // be further from bf16 than per-tensor fp8 is (5% of slack), nor past the bound.
    assert!(d > 0.0 && d < BOUND, "{d}");
    assert!(d < 1.05 * d_per_tensor, "{d} vs per-tensor {d_per_tensor}");
    // Reading the grid in the wrong order swaps blocks' multipliers (2 where 1 belongs, and
    // so on): whole blocks off by 2× or more, far past the rounding (measured 1.13).
    assert!(d_wrong > BOUND, "{d_wrong}");
}

/// The logits' relative L2 distance a correct block-wise fp8 model of `tiny_qwen3` stays
/// within: the measured 0.19 with a quarter of slack.
const BOUND: f64 = 0.25;

// ---- Refusals: one line naming the file (or setting) and the problem, exit status 2 ----

/// The tiny Qwen3 as a block-wise fp8 checkpoint, its tensors rewritten by `edit` and its
/// `quantization_config` by `edit_q`.
fn hostile(
    edit: impl FnOnce(&mut Vec<Stored>),
    edit_q: impl FnOnce(&mut serde_json::Value),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    model::gen_model_config_fp8_block(&tiny_qwen3(), "tiny-qwen3", dir.path(), &bf16_opts(), B128)
        .unwrap();
    let path = dir.path().join("model.safetensors");
    let mut tensors = read_all(&path);
    edit(&mut tensors);
    write_all(&path, &tensors);
    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    edit_q(&mut cfg["quantization_config"]);
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    dir
}

/// `profile` of a refused checkpoint (at `--vllm 0.8` unless `extra` says): exit 2, one line
/// on stderr, no panic, no report written.
fn refused(dir: &Path, device: &str, extra: &[&str]) -> String {
    let json = dir.join("r.json");
    let mut args = vec![
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.to_str().unwrap(),
        "--device",
        device,
    ];
    if !extra.contains(&"--vllm") {
        args.extend_from_slice(&["--vllm", "0.8"]);
    }
    args.extend_from_slice(extra);
    let out = vramscope(&args);
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!json.exists(), "a refused run wrote {}", json.display());
    err
}

fn set(tensors: &mut [Stored], name: &str, f: impl FnOnce(&mut Stored)) {
    f(tensors.iter_mut().find(|t| t.0 == name).expect(name));
}

const O_SCALE: &str = "model.layers.1.self_attn.o_proj.weight_scale_inv";
const QKV_Q: &str = "model.layers.0.self_attn.q_proj.weight_scale_inv";

#[test]
fn a_scale_grid_of_the_wrong_shape_is_refused_naming_the_tensor_and_the_blocks() {
    // o_proj [256, 256]: 2 × 2 blocks, stored as 2 × 1.
    let dir = hostile(
        |t| {
            set(t, O_SCALE, |s| {
                s.2 = vec![2, 1];
                s.3.truncate(8);
            })
        },
        |_| {},
    );
    let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains("model.safetensors")
            && e.contains(&format!("tensor {O_SCALE} has shape [2, 1], expected [2, 2]: one scale per [128, 128] block of the [256, 256] weight")),
        "{e}"
    );
    // q_proj [256, 256] of a stacked layer, its grid stored transposed from k_proj's [1, 2].
    let dir = hostile(|t| set(t, QKV_Q, |s| s.2 = vec![1, 4]), |_| {});
    let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains(&format!("tensor {QKV_Q} has shape [1, 4], expected [2, 2]")),
        "{e}"
    );
}

#[test]
fn a_nan_or_non_positive_block_scale_is_refused_naming_the_tensor_and_the_element() {
    for (v, shown) in [
        (f32::NAN, "NaN"),
        (0.0, "0"),
        (-0.5, "-0.5"),
        (f32::INFINITY, "inf"),
    ] {
        let dir = hostile(
            |t| {
                set(t, O_SCALE, |s| {
                    s.3[12..16].copy_from_slice(&v.to_le_bytes())
                })
            },
            |_| {},
        );
        // A dry run reads headers only; compute mode reads the values and refuses this one.
        let e = refused(dir.path(), "sim:h100-80gb:compute", &[]);
        assert!(
            e.contains("model.safetensors")
                && e.contains(&format!(
                    "tensor {O_SCALE} holds {shown} at element 3, expected finite scales above 0"
                )),
            "{e}"
        );
    }
}

#[test]
fn a_missing_scale_grid_or_a_per_tensor_scale_beside_it_is_refused_naming_it() {
    let dir = hostile(|t| t.retain(|s| s.0 != O_SCALE), |_| {});
    let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains(&format!(
            "tensor {O_SCALE} is missing: a block-wise fp8 weight needs its block scales"
        )),
        "{e}"
    );
    let stray = "model.layers.1.self_attn.o_proj.weight_scale";
    let dir = hostile(
        |t| {
            t.push((
                stray.into(),
                safetensors::Dtype::F32,
                vec![],
                1f32.to_le_bytes().to_vec(),
            ))
        },
        |_| {},
    );
    let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains(&format!(
            "tensor {stray} is stored but the checkpoint is block-wise"
        )),
        "{e}"
    );
}

#[test]
fn a_weight_block_size_vllm_refuses_is_refused_naming_config_json() {
    let cases: [(serde_json::Value, &str); 4] = [
        (
            serde_json::json!([128, 128, 128]),
            "vLLM refuses it: \"The quantization block size of weight must have 2 dimensions, but got 3 dimensions\"",
        ),
        (
            serde_json::json!([128, 0]),
            "expected two positive integers [block_n, block_k]",
        ),
        (serde_json::json!("128x128"), "expected a list of two integers"),
        // k_proj and v_proj have 128 rows: not whole blocks of 256.
        (
            serde_json::json!([256, 128]),
            "qkv_proj (outputs [256, 128, 128], 256 inputs): vLLM refuses it: \"Weight output_partition_size = 128 is not divisible by weight quantization block_n = 256.\"",
        ),
    ];
    for (size, says) in cases {
        let dir = hostile(|_| {}, |q| q["weight_block_size"] = size.clone());
        let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
        assert!(e.contains("config.json") && e.contains(says), "{size}: {e}");
    }
    // Inputs that are not whole groups: per_token_group_quant_fp8 asserts.
    let dir = hostile(
        |_| {},
        |q| q["weight_block_size"] = serde_json::json!([128, 512]),
    );
    let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains("config.json")
            && e.contains("its 256 inputs are not divisible by block_k = 512"),
        "{e}"
    );
    let dir = hostile(|_| {}, |q| q["activation_scheme"] = "static".into());
    let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(e.contains("only supports dynamic activation scheme"), "{e}");
    let dir = hostile(|_| {}, |q| q["fmt"] = "e5m2".into());
    let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(e.contains("quantization_config.fmt is \"e5m2\""), "{e}");
}

#[test]
fn other_releases_gpus_cuda_and_an_fp8_kv_cache_are_refused_naming_what_runs() {
    let dir = hostile(|_| {}, |_| {});
    let e = refused(dir.path(), "sim:h100-80gb:dry", &["--vllm", "0.6.4"]);
    assert!(
        e.contains("block-wise fp8 (weight_block_size) with --vllm 0.6.4")
            && e.contains("use --vllm 0.8"),
        "{e}"
    );
    // 0.10's V1 row has no block-wise linear read (0.9 shares the 0.8 row, unchecked).
    let e = refused(dir.path(), "sim:h100-80gb:dry", &["--vllm", "0.10"]);
    assert!(
        e.contains("with --vllm 0.10") && e.contains("use --vllm 0.8"),
        "{e}"
    );
    let e = refused(dir.path(), "sim:a100-80gb:dry", &[]);
    assert!(e.contains("A100") && e.contains("8.9"), "{e}");
    // A CUDA device is refused before it is opened: this runs without a GPU.
    let e = refused(dir.path(), "cuda:0", &[]);
    assert!(
        e.contains("a block-wise fp8 checkpoint on a CUDA device")
            && e.contains("--device sim:h100-80gb:dry"),
        "{e}"
    );
    let e = refused(
        dir.path(),
        "sim:h100-80gb:dry",
        &["--kv-cache-dtype", "fp8"],
    );
    assert!(
        e.contains("--kv-cache-dtype fp8 with a block-wise fp8 checkpoint"),
        "{e}"
    );
    let e = refused(dir.path(), "sim:h100-80gb:dry", &["--tp", "2"]);
    assert!(
        e.contains("--tp 2 with a pre-quantized fp8 checkpoint"),
        "{e}"
    );
    // And gen-model writes no checkpoint vLLM would refuse (the tiny Llama's 64-row k, v).
    let out = vramscope(&[
        "gen-model",
        "tiny",
        dir.path().join("t").to_str().unwrap(),
        "--fp8-block",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("gen-model --fp8-block") && err.contains("block_n = 128"),
        "{err}"
    );
}

#[test]
fn ada_runs_it_as_hopper_does_and_a_hopper_stream_k_shape_is_refused() {
    // Triton's path on Ada allocates what CUTLASS's does on Hopper: the same weights.
    let dir = hostile(|_| {}, |_| {});
    let h100 = dry_profile(dir.path(), &[]);
    let json = dir.path().join("l40s.json");
    let out = vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.path().to_str().unwrap(),
        "--vllm",
        "0.8",
        "--device",
        "sim:l40s:dry",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l40s: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert_eq!(l40s["weights_bytes"], h100["weights_bytes"]);
    // Llama-3-8B's down_proj (k 14336 > 3 × 4096) takes CUTLASS's stream-K scheduler.
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]
        }
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    let e = refused(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(e.contains("down_proj") && e.contains("stream-K"), "{e}");
    let json = dir.path().join("ada.json");
    let out = vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.path().to_str().unwrap(),
        "--vllm",
        "0.8",
        "--device",
        "sim:l40s:dry",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn each_linear_of_the_pass_allocates_codes_group_scales_and_output_then_frees_the_two() {
    let dir = hostile(|_| {}, |_| {});
    let r = dry_profile(dir.path(), &["--max-num-batched-tokens", "2048"]);
    let ev: Vec<(String, String, u64)> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .skip_while(|e| e["tensor"] != "t1")
        .filter(|e| {
            (e["kind"] == "alloc" || e["kind"] == "free")
                && e["layer"] == 0
                && e["tensor"].as_str().unwrap().contains("o_proj")
        })
        .take(5)
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_string(),
                e["tensor"].as_str().unwrap().to_string(),
                e["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let t = |k: &str, n: &str, b: u64| (k.to_string(), n.to_string(), b);
    // 2048 tokens × 256 inputs: fp8 codes, two f32 group scales a token, the bf16 output.
    let p = ev[0].1.trim_end_matches(".qinput").to_string();
    assert!(p.ends_with("o_proj"), "{ev:?}");
    assert_eq!(
        ev,
        vec![
            t("alloc", &format!("{p}.qinput"), 2048 * 256),
            t("alloc", &format!("{p}.x_scale"), 2048 * 2 * 4),
            t("alloc", &format!("{p}.out"), 2048 * 256 * 2),
            t("free", &format!("{p}.qinput"), 2048 * 256),
            t("free", &format!("{p}.x_scale"), 2048 * 2 * 4),
        ]
    );
    // And the math runs through the whole profile on the host.
    let json = dir.path().join("c.json");
    let out = vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.path().to_str().unwrap(),
        "--vllm",
        "0.8",
        "--device",
        "sim:h100-80gb:compute",
        "--max-num-batched-tokens",
        "2048",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert_eq!(c["weights_bytes"], r["weights_bytes"]);
    // Top logits of each sequence's last token, all finite.
    let logits = c["logits"].as_array().unwrap();
    assert!(!logits.is_empty());
    for seq in logits {
        for pair in seq["top"].as_array().unwrap() {
            assert!(pair[1].as_f64().is_some_and(f64::is_finite), "{pair}");
        }
    }
}

#[test]
fn inspect_counts_the_codes_as_parameters_and_the_scale_grids_apart() {
    let dir = hostile(|_| {}, |_| {});
    let out = vramscope(&["inspect", dir.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // 2 layers × 7 linears: codes (256·(256 + 128 + 128) + 256·256 + 3 · 512·256 bytes),
    // and their grids (q 2·2, k and v 1·2, o 2·2, gate and up 4·2, down 2·4: 36 scales of 4
    // bytes a layer), which are not parameters.
    let codes = 2 * (256 * 512 + 256 * 256 + 3 * 512 * 256);
    assert!(
        text.contains("F8_E4M3    14 tensors") && text.contains(&format!("({codes} bytes)")),
        "{text}"
    );
    assert!(
        text.contains("F32      14 tensors        288 B (288 bytes)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("parameters {} in", tiny_qwen3().param_count())),
        "{text}"
    );
}

/// A Qwen3 of hidden 192 under `[128, 64]` blocks: o_proj and down_proj (192 outputs) end in
/// a partial block of 64 rows, which vLLM 0.8.5 allows for a layer that is not stacked (its
/// grid is `ceil`-shaped, fp8.py L266-271); their inputs are whole groups of 64, and with
/// 192 not a multiple of 128 every linear takes Triton's path even on Hopper.
#[test]
fn partial_blocks_at_the_edge_load_with_ceil_shaped_grids_and_compute() {
    let cfg_json = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 192, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
        "vocab_size": 1024, "max_position_embeddings": 512, "rope_theta": 1000000,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false,
        "hidden_act": "silu", "torch_dtype": "bfloat16"
    });
    let cfg = ModelConfig::from_hf_json(&cfg_json).unwrap();
    let block = BlockSize { n: 128, k: 64 };
    let root = tempfile::tempdir().unwrap();
    let (bf16_dir, fp8_dir) = (root.path().join("bf16"), root.path().join("fp8"));
    model::gen_model_config(&cfg, "partial", &bf16_dir, &bf16_opts()).unwrap();
    model::gen_model_config_fp8_block(&cfg, "partial", &fp8_dir, &bf16_opts(), block).unwrap();
    let stored = read_all(&fp8_dir.join("model.safetensors"));
    let shape = |n: &str| stored.iter().find(|t| t.0 == n).unwrap().2.clone();
    // o_proj [192, 256]: 2 × 4 blocks, the second row of blocks 64 rows deep.
    assert_eq!(
        shape("model.layers.0.self_attn.o_proj.weight_scale_inv"),
        vec![2, 4]
    );
    assert_eq!(
        shape("model.layers.0.mlp.down_proj.weight_scale_inv"),
        vec![2, 4]
    );
    assert_eq!(
        shape("model.layers.0.self_attn.q_proj.weight_scale_inv"),
        vec![2, 3]
    );
    let r = dry_profile(&fp8_dir, &[]);
    let tensors = r["weights_tensor_bytes"].as_u64().unwrap();
    let stored_bytes: u64 = stored.iter().map(|t| t.3.len() as u64).sum();
    // The stored tensors, the rotary cache (512 × 128 bf16), the identity and each layer's
    // four attention scalars.
    assert_eq!(
        tensors,
        stored_bytes + 512 * 128 * 2 + 4 + cfg.num_layers as u64 * 16
    );
    let d = rel_l2(
        &bench_logits(&fp8_dir, "fp8.json"),
        &bench_logits(&bf16_dir, "bf16.json"),
    );
    eprintln!("partial blocks: block fp8 vs bf16 {d:.3e}");
    assert!(d > 0.0 && d < BOUND, "{d}");
}

// ---- The V1 releases (0.11.0, 0.15.1, 0.19.0) ----

/// A `profile --json` of the model in `dir` under `--vllm vllm` on `device`: the report.
fn profile_as(dir: &Path, vllm: &str, device: &str, extra: &[&str]) -> serde_json::Value {
    let json = dir.join(format!("{vllm}-{}.json", device.replace(':', "-")));
    let mut args = vec![
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.to_str().unwrap(),
        "--vllm",
        vllm,
        "--device",
        device,
    ];
    args.extend_from_slice(extra);
    let out = vramscope(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

/// The pass's first `n` allocs and frees of layer 0's o_proj (its fp8 input, scales, padded
/// copies and output): `(kind, tensor name after "o_proj.", block bytes)`.
fn o_proj_pass(r: &serde_json::Value, n: usize) -> Vec<(String, String, u64)> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .skip_while(|e| e["tensor"] != "t1")
        .filter(|e| {
            (e["kind"] == "alloc" || e["kind"] == "free")
                && e["layer"] == 0
                && e["tensor"].as_str().unwrap().contains("o_proj.")
        })
        .take(n)
        .map(|e| {
            let t = e["tensor"].as_str().unwrap();
            (
                e["kind"].as_str().unwrap().to_string(),
                t[t.find("o_proj.").unwrap() + 7..].to_string(),
                e["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn r512(bytes: u64) -> u64 {
    bytes.div_ceil(512) * 512
}

#[test]
fn v1_releases_pad_the_block_fp8_gemm_on_hopper_as_each_release_does() {
    let dir = hostile(|_| {}, |_| {});
    // 2046 tokens: not a multiple of 4. The tiny o_proj has 256 inputs and outputs.
    let tok = ["--max-num-batched-tokens", "2046", "--max-num-seqs", "256"];
    let t = |k: &str, n: &str, b: u64| (k.to_string(), n.to_string(), r512(b));
    // 0.11.0 on Hopper: `F.pad` by 4 - 2046 % 4 = 2 rows first, everything at 2048 rows.
    let r11 = profile_as(dir.path(), "0.11", "sim:h100-80gb:dry", &tok);
    assert_eq!(
        o_proj_pass(&r11, 7),
        vec![
            t("alloc", "padded_input", 2048 * 256 * 2),
            t("alloc", "qinput", 2048 * 256),
            t("alloc", "x_scale", 2048 * 2 * 4),
            t("alloc", "out", 2048 * 256 * 2),
            t("free", "padded_input", 2048 * 256 * 2),
            t("free", "qinput", 2048 * 256),
            t("free", "x_scale", 2048 * 2 * 4),
        ]
    );
    // 0.15.1 and 0.19.0 on Hopper: quantize at 2046, `padded_cutlass`'s copies at 2048.
    for v in ["0.15", "0.19"] {
        let r = profile_as(dir.path(), v, "sim:h100-80gb:dry", &tok);
        assert_eq!(
            o_proj_pass(&r, 9),
            vec![
                t("alloc", "qinput", 2046 * 256),
                t("alloc", "x_scale", 2046 * 2 * 4),
                t("alloc", "padded_qx", 2048 * 256),
                t("alloc", "padded_x_scale", 2048 * 2 * 4),
                t("alloc", "out", 2048 * 256 * 2),
                t("free", "padded_qx", 2048 * 256),
                t("free", "padded_x_scale", 2048 * 2 * 4),
                t("free", "x_scale", 2046 * 2 * 4),
                t("free", "qinput", 2046 * 256),
            ],
            "--vllm {v}"
        );
    }
    // Ada (Triton) pads nothing; the scales still go first.
    let ada = profile_as(dir.path(), "0.19", "sim:l40s:dry", &tok);
    assert_eq!(
        o_proj_pass(&ada, 5),
        vec![
            t("alloc", "qinput", 2046 * 256),
            t("alloc", "x_scale", 2046 * 2 * 4),
            t("alloc", "out", 2046 * 256 * 2),
            t("free", "x_scale", 2046 * 2 * 4),
            t("free", "qinput", 2046 * 256),
        ]
    );
}

#[test]
fn v1_releases_hold_the_stored_tensors_0_11_with_its_identity_and_transposed_scales() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg_json = qwen3_8b_fp8_json();
    cfg_json["num_hidden_layers"] = 2.into();
    let stored = write_block_headers(dir.path(), &cfg_json);
    let w = |r: &serde_json::Value| r["weights_tensor_bytes"].as_u64().unwrap();
    let r11 = profile_as(dir.path(), "0.11", "sim:h100-80gb:dry", &[]);
    let r15 = profile_as(dir.path(), "0.15", "sim:h100-80gb:dry", &[]);
    let r19 = profile_as(dir.path(), "0.19", "sim:h200-141gb:dry", &[]);
    // Every stored tensor, the rotary cache (40960 × 128 bf16) and the seven 0-dim f32
    // scalars V1's attention makes in each layer less the three it re-creates... as the
    // 16-bit model holds them: the fp8 part is exactly what the checkpoint stores.
    assert_eq!(w(&r15), w(&r19));
    // 0.11 adds `TORCH_DEVICE_IDENTITY` (fp8.py L265), 4 bytes.
    assert_eq!(w(&r11), w(&r15) + 4);
    assert!(w(&r15) > stored && w(&r15) - stored < 40960 * 128 * 2 + 4096);
    // 0.11 on Hopper: after loading each layer's grids become `[kb, nb]` copies, the stored
    // grid freed (one alloc and one free a linear, four linears a layer).
    let ev = r11["events"].as_array().unwrap();
    let load: Vec<_> = ev.iter().take_while(|e| e["tensor"] != "t1").collect();
    let made: Vec<&str> = load
        .iter()
        .filter(|e| {
            e["kind"] == "alloc" && e["tensor"].as_str().unwrap().ends_with(".weight_scale")
        })
        .map(|e| e["tensor"].as_str().unwrap())
        .collect();
    assert_eq!(made.len(), 2 * 4, "{made:?}");
    assert!(made[0].ends_with("qkv_proj.weight_scale"), "{made:?}");
    let freed = load
        .iter()
        .filter(|e| {
            e["kind"] == "free" && e["tensor"].as_str().unwrap().ends_with(".weight_scale_inv")
        })
        .count();
    assert_eq!(freed, 2 * 4);
    // 0.15.1 keeps the stored grids as they are.
    let ev15 = r15["events"].as_array().unwrap();
    assert!(!ev15.iter().any(|e| e["tensor"]
        .as_str()
        .unwrap_or("")
        .ends_with(".weight_scale")));
    assert!(!ev15
        .iter()
        .any(|e| e["tensor"] == "fp8.TORCH_DEVICE_IDENTITY"));
}

#[test]
fn v1_padding_and_transposed_scales_leave_the_logits_as_they_were() {
    let dir = hostile(|_| {}, |_| {});
    let tok = ["--max-num-batched-tokens", "2046", "--max-num-seqs", "256"];
    let logits = |v: &str, dev: &str| profile_as(dir.path(), v, dev, &tok)["logits"].clone();
    let r11 = logits("0.11", "sim:h100-80gb:compute");
    assert!(!r11.as_array().unwrap().is_empty());
    assert_eq!(r11, logits("0.19", "sim:h100-80gb:compute"));
    assert_eq!(r11, logits("0.19", "sim:l40s:compute"));
}

/// A dry `profile --json` of Qwen3-8B-FP8's shapes on a simulated `device` under `vllm` at 8192
/// tokens: the report, or the error line.
fn dry_profile_under(dir: &Path, device: &str, vllm: &str) -> Result<serde_json::Value, String> {
    let name = format!("r-{vllm}.json");
    let args = [
        "--vllm", vllm, "--device", device, "--tokens", "8192", "--seqs", "256",
    ];
    profile_json(dir, &name, &args)
}

/// Qwen3-8B-FP8 under 0.21-0.33 on an H100 (docs/reading/vllm-fp8-block-deepgemm.md): DeepGEMM
/// is vendored and on, so every decoder linear (bf16 output, N % 64 == 0, K % 128 == 0) runs
/// `FlashInferFp8DeepGEMMDynamicBlockScaledKernel`; at 8192 tokens vLLM's quantization and
/// DeepGEMM: a `[1]` bf16 placeholder (a 512-byte block), the codes `[M, K]`, the scales
/// `[K/128, M]` f32, the output `[M, N]`, then the codes, the scales and the placeholder die
/// (0.19 freed the scales first and made no placeholder). The weights hold what 0.19's do: the
/// requant to power-of-two scales happens in place.
#[test]
fn qwen3_8b_fp8_under_0_21_on_runs_deep_gemm_on_hopper() {
    let dir = tempfile::tempdir().unwrap();
    write_block_headers(dir.path(), &qwen3_8b_fp8_json());
    let r19 = dry_profile_under(dir.path(), "sim:h100-80gb:dry", "0.19").unwrap();
    let m = 8192u64;
    for vllm in ["0.21", "0.24", "0.29", "0.33"] {
        let r = dry_profile_under(dir.path(), "sim:h100-80gb:dry", vllm)
            .unwrap_or_else(|e| panic!("{vllm}: {e}"));
        assert_eq!(
            r["weights_tensor_bytes"], r19["weights_tensor_bytes"],
            "{vllm}"
        );
        let o: Vec<(String, String, u64)> = r["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["pass"] == 1 && (e["kind"] == "alloc" || e["kind"] == "free"))
            .filter(|e| e["layer"] == 3 && e["tensor"].as_str().unwrap().contains("o_proj."))
            .map(|e| {
                let name = e["tensor"].as_str().unwrap();
                (
                    e["kind"].as_str().unwrap().to_string(),
                    name[name.find("o_proj.").unwrap() + "o_proj.".len()..].to_string(),
                    e["bytes"].as_u64().unwrap(),
                )
            })
            .collect();
        let t = |k: &str, n: &str, b: u64| (k.to_string(), n.to_string(), b);
        assert_eq!(
            o[..7],
            [
                t("alloc", "input_scale_placeholder", 512),
                t("alloc", "qinput", m * 4096),
                t("alloc", "x_scale", m * 32 * 4),
                t("alloc", "out", 2 * m * 4096),
                t("free", "qinput", m * 4096),
                t("free", "x_scale", m * 32 * 4),
                t("free", "input_scale_placeholder", 512),
            ],
            "{vllm}"
        );
    }
    // Off Hopper the kernel choice of 0.21 on was not read: refused in one line.
    let e = dry_profile_under(dir.path(), "sim:l40s:dry", "0.21").unwrap_err();
    assert!(e.contains("off Hopper") && e.contains("--vllm 0.21"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}

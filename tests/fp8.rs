//! `--quant fp8` as vLLM 0.6.4 runs `--quantization fp8` on a 16-bit checkpoint: the load's
//! allocations and bytes counted from the config alone, the logits against fp16's, and the
//! cases it refuses.

use std::process::{Command, Output};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::runtime::Runtime;
use vramscope::model::llama::{LlamaModel, LoadOptions};
use vramscope::model::{self, ModelSource};
use vramscope::quant::int8::TileLayout;
use vramscope::quant::Quant;

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .expect("run vramscope")
}

/// PyTorch's caching allocator hands out multiples of 512 bytes.
fn block(bytes: u64) -> u64 {
    bytes.div_ceil(512) * 512
}

/// (16-bit bytes of everything, bytes with the linear layers' weights at one byte each plus a
/// 512-byte scale block each, the elements of each layer's linears in vLLM's module order),
/// counted from the config as vLLM lays the model out: fused qkv_proj and gate_up_proj, the
/// vocabulary padded to 64, the rotary cache in the model dtype.
fn llama_bytes(c: &vramscope::model::ModelConfig) -> (u64, u64, [u64; 4]) {
    let (h, i, q, kv) = (
        c.hidden_size as u64,
        c.intermediate_size as u64,
        c.q_dim() as u64,
        c.kv_dim() as u64,
    );
    let vp = (c.vocab_size as u64).div_ceil(64) * 64;
    let linears = [(q + 2 * kv) * h, h * q, 2 * i * h, h * i];
    let tables = if c.tie_word_embeddings { 1 } else { 2 };
    let rest = tables * block(2 * vp * h)
        + block(2 * h)
        + c.num_layers as u64 * 2 * block(2 * h)
        + block(2 * (c.max_position_embeddings * c.head_dim) as u64);
    let sixteen = rest + c.num_layers as u64 * linears.iter().map(|&n| block(2 * n)).sum::<u64>();
    let fp8 = rest + c.num_layers as u64 * linears.iter().map(|&n| block(n) + 512).sum::<u64>();
    (sixteen, fp8, linears)
}

#[test]
fn llama_3_8b_loads_in_fp8_to_one_byte_linears_after_holding_the_16_bit_model() {
    let opened = model::open(
        &ModelSource::Preset {
            name: "llama-3-8b".into(),
        },
        0,
    )
    .unwrap();
    let spec = DeviceSpec::parse("sim:h100-80gb:dry").unwrap();
    let rt = Runtime::new(
        Device::open(&spec).unwrap(),
        Arc::new(AtomicBool::new(false)),
        None,
    );
    let before = rt.stats().allocated;
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
    let (sixteen, fp8, linears) = llama_bytes(&opened.config);
    let st = rt.stats();
    assert_eq!(st.allocated - before, fp8);
    // By hand: 32 × (25165824 + 16777216 + 117440512 + 58720256 + 4 × 512) linear bytes,
    // 2 × 1050673152 for embed_tokens and lm_head, 65 norms of 8192, a 2 MiB rotary cache.
    assert_eq!(fp8, 9_083_363_328);
    // The peak: the whole 16-bit model with every attention layer's k_scale and v_scale
    // (Fp8KVCacheMethod: two 0-dim f32 tensors, a 512-byte block each), then module by
    // module an fp8 copy and its scale before the 16-bit weight is freed, and the attention
    // layer's two scales deleted after o_proj; each module frees more than the next one
    // takes, except that gate_up_proj (112 MiB) outgrows what qkv_proj and o_proj gave back.
    let layers = opened.config.num_layers as u64;
    let mut now = sixteen + layers * 1024;
    let mut peak = now;
    for _ in 0..layers {
        for (j, n) in linears.into_iter().enumerate() {
            peak = peak.max(now + block(n) + 512);
            now = now + block(n) + 512 - block(2 * n);
            if j == 1 {
                now -= 1024;
            }
        }
    }
    assert_eq!(now, fp8);
    assert_eq!(st.allocated_peak - before, peak);
    assert_eq!(
        peak,
        sixteen + (layers - 1) * 1024 + linears[2] + 512 - (linears[0] + linears[1] - 1024)
    );
    assert_eq!(m.weight_bytes(), {
        let c = &opened.config;
        let lin = c.num_layers as u64
            * ((c.q_dim() + 2 * c.kv_dim()) * c.hidden_size
                + c.hidden_size * c.q_dim()
                + 3 * c.intermediate_size * c.hidden_size) as u64;
        lin + 4 * 4 * c.num_layers as u64
            + 2 * (c.param_count() - lin)
            + 2 * (c.max_position_embeddings * c.head_dim) as u64
    });
    // The freed 16-bit weights stay cached: reserved holds at least the 16-bit model.
    assert!(st.reserved >= sixteen, "{} < {sixteen}", st.reserved);
}

#[test]
fn the_dry_profile_reports_the_fp8_weights() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let out = vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        "preset:llama-3-8b",
        "--quant",
        "fp8",
        "--vllm",
        "0.6.4",
        "--device",
        "sim:h100-80gb:dry",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let cfg = vramscope::model::presets::preset("llama-3-8b").unwrap();
    assert_eq!(r["weights_bytes"].as_u64().unwrap(), llama_bytes(&cfg).1);
}

/// Last-token logits of `bench` on the tiny preset in compute mode.
fn bench_logits(quant: &str, dir: &std::path::Path) -> Vec<f64> {
    let json = dir.join(format!("{quant}.json"));
    let out = vramscope(&[
        "bench",
        "--model",
        "preset:tiny",
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

#[test]
fn tiny_fp8_logits_are_within_ten_percent_of_fp16s() {
    let dir = tempfile::tempdir().unwrap();
    let out = vramscope(&[
        "profile",
        "-q",
        "--model",
        "preset:tiny",
        "--quant",
        "fp8",
        "--vllm",
        "0.6.4",
        "--device",
        "sim:h100-80gb:compute",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (a, b) = (
        bench_logits("fp16", dir.path()),
        bench_logits("fp8", dir.path()),
    );
    assert_eq!(a.len(), b.len());
    let diff: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    // Measured 6.8e-2 (e4m3 keeps 3 mantissa bits of weights and activations); int8's is
    // 1.5e-2.
    assert!(diff / norm < 0.10, "relative L2 distance {}", diff / norm);
    assert!(diff > 0.0, "fp8 logits equal fp16's: nothing was quantized");
}

/// The one error line of a refused run (exit status 2).
fn refused(args: &[&str]) -> String {
    let mut all = vec!["profile", "-q", "--model", "preset:tiny", "--quant", "fp8"];
    all.extend_from_slice(args);
    let out = vramscope(&all);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn fp8_on_an_a100_is_refused_naming_the_gpu_and_marlin() {
    let e = refused(&["--vllm", "0.6.4", "--device", "sim:a100-80gb:dry"]);
    assert!(
        e.contains("A100") && e.contains("Marlin") && e.contains("8.9"),
        "{e}"
    );
    let e = refused(&["--vllm", "0.6.4", "--device", "sim:t4:dry"]);
    assert!(e.contains("T4") && e.contains("8.0"), "{e}");
}

#[test]
fn fp8_is_refused_for_releases_and_models_not_reproduced() {
    let e = refused(&["--vllm", "0.8", "--device", "sim:h100-80gb:dry"]);
    assert!(e.contains("--vllm 0.8"), "{e}");
    let mut all = vec![
        "profile",
        "-q",
        "--model",
        "preset:qwen2.5-1.5b",
        "--quant",
        "fp8",
    ];
    all.extend_from_slice(&["--vllm", "0.6.4", "--device", "sim:h100-80gb:dry"]);
    let out = vramscope(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("qkv bias"), "{err}");
}

/// A tiny 16-bit checkpoint whose config.json declares `quantization_config`, profiled dry:
/// the exit status and stderr.
fn profile_with_quantization_config(q: serde_json::Value) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    model::gen_model(
        "tiny",
        dir.path(),
        vramscope::model::weights::StoredDtype::F16,
        0,
    )
    .unwrap();
    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["quantization_config"] = q;
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let out = vramscope(&[
        "profile",
        "-q",
        "--model",
        dir.path().to_str().unwrap(),
        "--device",
        "sim:h100-80gb:dry",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    (out.status.code(), err)
}

#[test]
fn a_16_bit_checkpoint_that_says_fp8_is_refused_naming_its_first_linear() {
    for scheme in ["dynamic", "static"] {
        let (code, err) = profile_with_quantization_config(
            serde_json::json!({"quant_method": "fp8", "activation_scheme": scheme}),
        );
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("model.safetensors")
                && err.contains("tensor model.layers.0.self_attn.q_proj.weight is stored as F16, expected F8_E4M3 (quantization_config says fp8)"),
            "{err}"
        );
    }
}

#[test]
fn ignored_layers_other_than_lm_head_are_refused_naming_the_key() {
    let (code, err) = profile_with_quantization_config(serde_json::json!({
        "quant_method": "fp8", "activation_scheme": "dynamic",
        "ignored_layers": ["lm_head", "model.layers.0.mlp.down_proj"],
    }));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("config.json")
            && err.contains(
                "quantization_config.ignored_layers lists \"model.layers.0.mlp.down_proj\""
            ),
        "{err}"
    );
}

#[test]
fn an_fp8_config_without_a_known_activation_scheme_is_refused_naming_the_key() {
    for (q, says) in [
        (
            serde_json::json!({"quant_method": "fp8"}),
            "quantization_config.activation_scheme is missing",
        ),
        (
            serde_json::json!({"quant_method": "fp8", "activation_scheme": "per_token"}),
            "quantization_config.activation_scheme is \"per_token\", expected \"static\" or \"dynamic\"",
        ),
        (
            serde_json::json!({"quant_method": "fp8", "activation_scheme": 1}),
            "quantization_config.activation_scheme is 1,",
        ),
    ] {
        let (code, err) = profile_with_quantization_config(q);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("config.json") && err.contains(says), "{err}");
    }
}

/// The tiny preset's k and v (64 rows each) are not whole [128, 128] blocks: vLLM 0.8.5's
/// `Fp8LinearMethod.create_weights` refuses a merged layer's partition that is not (fp8.py
/// L221-229), before any tensor is read. (Block-wise fp8 itself: tests/fp8_block.rs.)
#[test]
fn a_block_wise_config_whose_kv_rows_are_not_whole_blocks_is_refused_as_vllm_refuses_it() {
    let (code, err) = profile_with_quantization_config(serde_json::json!({
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("config.json")
            && err.contains("qkv_proj (outputs [128, 64, 64], 128 inputs)")
            && err.contains("\"Weight output_partition_size = 64 is not divisible by weight quantization block_n = 128.\""),
        "{err}"
    );
}

// ---- Pre-quantized fp8 checkpoints (F8_E4M3 weights with their scales) ----

/// Writes `config.json` and a header-only `model.safetensors` (the data a sparse hole: a dry
/// run reads headers only) for `cfg_json`, every tensor at its config-implied name and shape:
/// the decoder's linear weights F8_E4M3 with a 0-dim F32 `weight_scale` (and `input_scale`
/// when `static_act`), as AutoFP8 saves them; the rest in BF16. Returns the stored bytes.
fn write_fp8_headers(dir: &std::path::Path, cfg_json: &serde_json::Value, static_act: bool) -> u64 {
    let cfg = vramscope::model::ModelConfig::from_hf_json(cfg_json).unwrap();
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
            put(name, "F8_E4M3", shape, 1);
            put(format!("{base}.weight_scale"), "F32", vec![], 4);
            if static_act {
                put(format!("{base}.input_scale"), "F32", vec![], 4);
            }
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

/// A dry `profile --json` of the model in `dir` at `--vllm 0.6.4`: the report.
fn dry_profile(dir: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    dry_profile_at(dir, "0.6.4", extra)
}

/// `dry_profile` under the release `vllm`.
fn dry_profile_at(dir: &std::path::Path, vllm: &str, extra: &[&str]) -> serde_json::Value {
    let json = dir.join("r.json");
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
        "sim:h100-80gb:dry",
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

/// meta-llama/Meta-Llama-3-8B's config.json (bf16, untied lm_head, 8192 positions) with an
/// AutoFP8 `quantization_config`: with "static" it is
/// neuralmagic/Meta-Llama-3-8B-Instruct-FP8's (per-tensor F8_E4M3 weights, 0-dim F32
/// `weight_scale` and `input_scale` per linear, `ignored_layers: ["lm_head"]`).
fn llama_3_8b_fp8_json(scheme: &str) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false, "hidden_act": "silu", "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8", "activation_scheme": scheme, "ignored_layers": ["lm_head"]
        }
    })
}

#[test]
fn a_stored_llama_3_8b_fp8_checkpoint_loads_its_codes_and_one_scale_per_module() {
    for (scheme, static_act) in [("dynamic", false), ("static", true)] {
        let dir = tempfile::tempdir().unwrap();
        let cfg_json = llama_3_8b_fp8_json(scheme);
        let stored = write_fp8_headers(dir.path(), &cfg_json, static_act);
        // By hand: 32 × 218103808 one-byte linear weights, 2 × 128256 × 4096 bf16 tables,
        // 65 bf16 norms of 4096, and 32 × 7 scales of 4 bytes (twice under static): the
        // 9.08 GB neuralmagic publishes.
        let scale_bytes = if static_act { 1792 } else { 896 };
        assert_eq!(
            stored,
            6_979_321_856 + 2_101_346_304 + 532_480 + scale_bytes
        );
        let r = dry_profile(dir.path(), &[]);
        assert_eq!(r["quant"], "fp8", "a stored fp8 checkpoint runs as fp8");
        let cfg = vramscope::model::ModelConfig::from_hf_json(&cfg_json).unwrap();
        let (rest, _, linears) = {
            let (sixteen, _, lin) = llama_bytes(&cfg);
            let l = cfg.num_layers as u64;
            (
                sixteen - l * lin.iter().map(|&n| block(2 * n)).sum::<u64>(),
                0,
                lin,
            )
        };
        let l = cfg.num_layers as u64;
        let scales_per_module = if static_act { 2 } else { 1 };
        // Counted independently: the codes at one byte, one 4-byte scale (two under the
        // static scheme) per module after vLLM reduces the [3] and [2] ones to their max,
        // the rest in bf16 (vocab 128256 is a multiple of 64: no padding rows), the rotary
        // cache 8192 × 128 in bf16.
        let tensors = l * linears.iter().sum::<u64>()
            + l * 4 * 4 * scales_per_module
            + 2 * 128256 * 4096 * 2
            + (2 * l + 1) * 4096 * 2
            + 8192 * 128 * 2;
        assert_eq!(
            r["weights_tensor_bytes"].as_u64().unwrap(),
            tensors,
            "{scheme}"
        );
        // The same from the stored bytes: each layer stores 7 weight scales (and 7 input
        // scales), vLLM keeps 4 of each; it adds the rotary cache.
        assert_eq!(
            tensors,
            stored - l * 3 * 4 * scales_per_module + 8192 * 128 * 2
        );
        // What the allocator holds: each fp8 weight in its blocks, every scalar in a 512-byte
        // block.
        assert_eq!(
            r["weights_bytes"].as_u64().unwrap(),
            rest + l * linears
                .iter()
                .map(|&n| block(n) + 512 * scales_per_module)
                .sum::<u64>(),
            "{scheme}"
        );
    }
}

/// Writes the tiny preset's seeded weights (seed 0, f16) with `gen-model`, with `extra`
/// flags (`--fp8`, `--fp8-static`) into `dir`.
fn gen_tiny(dir: &std::path::Path, extra: &[&str]) {
    let mut args = vec!["gen-model", "tiny", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = vramscope(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Last-token logits of `bench` in compute mode on the model in `dir`.
fn bench_dir_logits(dir: &std::path::Path, quant: &str, json_name: &str) -> Vec<f64> {
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

#[test]
fn tiny_stored_fp8_logits_against_in_flight_fp8_and_fp16() {
    let root = tempfile::tempdir().unwrap();
    let (f16_dir, dyn_dir, static_dir) = (
        root.path().join("f16"),
        root.path().join("fp8"),
        root.path().join("fp8-static"),
    );
    gen_tiny(&f16_dir, &[]);
    gen_tiny(&dyn_dir, &["--fp8"]);
    gen_tiny(&static_dir, &["--fp8", "--fp8-static"]);
    let fp16 = bench_dir_logits(&f16_dir, "fp16", "fp16.json");
    let in_flight = bench_dir_logits(&f16_dir, "fp8", "in-flight.json");
    let stored = bench_dir_logits(&dyn_dir, "fp8", "stored.json");
    // The default --quant loads it the same way (fp8 as stored, the checkpoint's dtype).
    assert_eq!(
        bench_dir_logits(&dyn_dir, "fp16", "stored-default.json"),
        stored
    );
    let stored_static = bench_dir_logits(&static_dir, "fp8", "static.json");
    let (d_in_flight, d_fp16, d_static) = (
        rel_l2(&stored, &in_flight),
        rel_l2(&stored, &fp16),
        rel_l2(&stored_static, &fp16),
    );
    eprintln!("stored vs in-flight {d_in_flight:.3e}, vs fp16 {d_fp16:.3e}, static vs fp16 {d_static:.3e}");
    // The stored checkpoint holds what in-flight quantization computes for o_proj and
    // down_proj (one scale each, requantized at that scale through float16), and per-shard
    // scales for q/k/v and gate/up that vLLM requantizes at their max: as close to the
    // in-flight model's logits as far as either is from fp16 (the e4m3 errors of two
    // different quantizations). Measured 7.8e-2.
    assert!(d_in_flight > 0.0 && d_in_flight < 0.12, "{d_in_flight}");
    // Against fp16 (measured 9.0e-2; the in-flight path's 6.8e-2).
    assert!(d_fp16 < 0.12, "{d_fp16}");
    // Static activations at one fixed scale (gen-model's 8/448) for every layer: measured
    // 7.2e-2 from fp16.
    assert!(d_static > 0.0 && d_static < 0.12, "{d_static}");
    assert_ne!(stored_static, stored);
}

/// A stored checkpoint holding exactly the codes in-flight quantization makes (each stacked
/// layer's shards at the one scale `scaled_fp8_quant` gives the stack) must run as the
/// in-flight model does: requantizing a shard at its own scale through float16 can only move
/// a code whose value float16 cannot hold.
#[test]
fn a_stored_checkpoint_of_the_in_flight_codes_gives_the_in_flight_logits() {
    use vramscope::quant::fp8::quantize_per_tensor;
    let root = tempfile::tempdir().unwrap();
    let (f16_dir, fp8_dir) = (root.path().join("f16"), root.path().join("fp8"));
    gen_tiny(&f16_dir, &[]);
    gen_tiny(&fp8_dir, &["--fp8"]);
    let bytes = std::fs::read(f16_dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()
    };
    let mut replaced: Vec<(String, Vec<u8>)> = Vec::new();
    for l in 0..4 {
        let p = format!("model.layers.{l}");
        let stacks: [&[&str]; 4] = [
            &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            &["self_attn.o_proj"],
            &["mlp.gate_proj", "mlp.up_proj"],
            &["mlp.down_proj"],
        ];
        for stack in stacks {
            let parts: Vec<Vec<f32>> = stack
                .iter()
                .map(|m| f32s(&format!("{p}.{m}.weight")))
                .collect();
            let (codes, scale) = quantize_per_tensor(&parts.concat());
            let mut at = 0;
            for (m, w) in stack.iter().zip(&parts) {
                replaced.push((format!("{p}.{m}.weight"), codes[at..at + w.len()].to_vec()));
                replaced.push((
                    format!("{p}.{m}.weight_scale"),
                    scale.to_le_bytes().to_vec(),
                ));
                at += w.len();
            }
        }
    }
    let path = fp8_dir.join("model.safetensors");
    let fp8_bytes = std::fs::read(&path).unwrap();
    let fst = safetensors::SafeTensors::deserialize(&fp8_bytes).unwrap();
    let tensors: Vec<Stored> = fst
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let data = replaced
                .iter()
                .find(|r| r.0 == n)
                .map_or_else(|| v.data().to_vec(), |r| r.1.clone());
            (n, v.dtype(), v.shape().to_vec(), data)
        })
        .collect();
    assert_eq!(replaced.len(), 4 * 7 * 2);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let in_flight = bench_dir_logits(&f16_dir, "fp8", "in-flight.json");
    let stored = bench_dir_logits(&fp8_dir, "fp8", "stored.json");
    let fp16 = bench_dir_logits(&f16_dir, "fp16", "fp16.json");
    // Measured: equal, bit for bit (no code moves in the round trip through float16 at its
    // own scale here), while the in-flight logits are 6.8e-2 from fp16's.
    assert_eq!(stored, in_flight);
    assert!(rel_l2(&in_flight, &fp16) > 0.01);
}

/// One stored tensor: name, dtype, shape, bytes.
type Stored = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// A tiny fp8 checkpoint (`gen-model --fp8`, static when asked) whose tensors `edit`
/// rewrites; returns its folder.
fn hostile_fp8(static_act: bool, edit: impl FnOnce(&mut Vec<Stored>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let flags: &[&str] = if static_act {
        &["--fp8", "--fp8-static"]
    } else {
        &["--fp8"]
    };
    gen_tiny(dir.path(), flags);
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<Stored> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    dir
}

/// `profile` of a hostile checkpoint: exit 2, one line on stderr, no report written.
fn refused_checkpoint(dir: &std::path::Path, device: &str, extra: &[&str]) -> String {
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
        args.extend_from_slice(&["--vllm", "0.6.4"]);
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

const O_PROJ: &str = "model.layers.1.self_attn.o_proj";

#[test]
fn a_nan_weight_scale_is_refused_naming_the_tensor() {
    let dir = hostile_fp8(false, |t| {
        set(t, &format!("{O_PROJ}.weight_scale"), |s| {
            s.3 = f32::NAN.to_le_bytes().to_vec()
        })
    });
    // A dry run reads headers only; compute mode reads the value and refuses it.
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:compute", &[]);
    assert!(
        e.contains("model.safetensors")
            && e.contains(&format!(
                "tensor {O_PROJ}.weight_scale is NaN, expected a finite scale above 0"
            )),
        "{e}"
    );
}

#[test]
fn a_scale_of_the_wrong_shape_is_refused_naming_the_tensor() {
    let dir = hostile_fp8(true, |t| {
        set(t, &format!("{O_PROJ}.input_scale"), |s| {
            s.2 = vec![2];
            s.3 = [0.5f32, 0.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        })
    });
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains(&format!(
            "tensor {O_PROJ}.input_scale has shape [2], expected a per-tensor scale of shape [] or [1]"
        )),
        "{e}"
    );
}

#[test]
fn an_fp8_weight_stored_as_f16_is_refused_naming_the_tensor() {
    let dir = hostile_fp8(false, |t| {
        set(t, &format!("{O_PROJ}.weight"), |s| {
            s.1 = safetensors::Dtype::F16;
            s.3 = s.3.iter().flat_map(|&c| [c, 0]).collect();
        })
    });
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains(&format!(
            "tensor {O_PROJ}.weight is stored as F16, expected F8_E4M3 (quantization_config says fp8)"
        )),
        "{e}"
    );
}

#[test]
fn a_missing_weight_scale_or_static_input_scale_is_refused_naming_it() {
    let drop_one = |static_act: bool, part: &'static str| {
        hostile_fp8(static_act, move |t| {
            t.retain(|s| s.0 != format!("{O_PROJ}.{part}"))
        })
    };
    let dir = drop_one(false, "weight_scale");
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains(&format!(
            "tensor {O_PROJ}.weight_scale is missing: an fp8 weight needs its per-tensor scale"
        )),
        "{e}"
    );
    let dir = drop_one(true, "input_scale");
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains(&format!(
            "tensor {O_PROJ}.input_scale is missing: activation_scheme static"
        )),
        "{e}"
    );
}

#[test]
fn a_stored_fp8_checkpoint_refuses_other_quant_tp_and_gpus_without_fp8() {
    let dir = hostile_fp8(false, |_| {});
    for q in ["int8", "nf4"] {
        let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &["--quant", q]);
        assert!(
            e.contains(&format!("--quant {q} with a pre-quantized fp8 checkpoint")),
            "{e}"
        );
    }
    // gen-model writes float16: bf16 activations are not what it says.
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &["--quant", "bf16"]);
    assert!(e.contains("float16, not bf16"), "{e}");
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &["--tp", "2"]);
    assert!(
        e.contains("--tp 2 with a pre-quantized fp8 checkpoint"),
        "{e}"
    );
    // As `--quant fp8`: GPUs without fp8 tensor cores, releases not reproduced, CUDA.
    let e = refused_checkpoint(dir.path(), "sim:a100-80gb:dry", &[]);
    assert!(e.contains("Marlin"), "{e}");
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &["--vllm", "0.8"]);
    assert!(e.contains("--vllm 0.8"), "{e}");
}

#[test]
fn a_dynamic_checkpoint_with_an_input_scale_is_refused() {
    let dir = hostile_fp8(false, |t| {
        t.push((
            format!("{O_PROJ}.input_scale"),
            safetensors::Dtype::F32,
            vec![],
            0.5f32.to_le_bytes().to_vec(),
        ))
    });
    let e = refused_checkpoint(dir.path(), "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains(&format!(
            "tensor {O_PROJ}.input_scale is stored but activation_scheme is dynamic"
        )),
        "{e}"
    );
}

/// Qwen/Qwen3-8B-FP8's config.json: block-wise fp8 (`weight_block_size: [128, 128]`, an F32
/// `weight_scale_inv` of `[ceil(N/128), ceil(K/128)]` per weight). Qwen3 needs vLLM 0.8.5
/// and block-wise fp8 is reproduced for it alone: `--vllm 0.6.4` is refused naming the
/// release to use, `--vllm 0.8` plans it from the config alone.
#[test]
fn qwen3_8b_fp8_block_wise_is_planned_at_0_8_and_refused_at_0_6_4() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128]
        }
    });
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    let e = refused_checkpoint(dir.path(), "sim:h200:dry", &["--vllm", "0.6.4"]);
    assert!(
        e.contains("block-wise fp8 (weight_block_size) with --vllm 0.6.4")
            && e.contains("use --vllm 0.8"),
        "{e}"
    );
    let json = dir.path().join("r.json");
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
        "sim:h200:dry",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    // The stored tensors (codes, scale grids, bf16 tables and norms), the bf16 rotary cache,
    // the fp8 device identity and the attention scalars; tests/fp8_block.rs counts them.
    assert_eq!(r["weights_tensor_bytes"].as_u64().unwrap(), 9_447_885_380);
}

#[test]
fn inspect_counts_an_fp8_checkpoints_codes_and_leaves_its_scales_out_of_the_parameters() {
    let dir = tempfile::tempdir().unwrap();
    gen_tiny(dir.path(), &["--fp8", "--fp8-static"]);
    let out = vramscope(&["inspect", dir.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let cfg = vramscope::model::presets::preset("tiny").unwrap();
    // 4 layers × (128·(128 + 64 + 64) + 128·128 + 3 · 384·128) one-byte codes.
    let codes = 4 * (128 * 256 + 128 * 128 + 3 * 384 * 128);
    assert!(
        text.contains("F8_E4M3    28 tensors") && text.contains(&format!("({codes} bytes)")),
        "{text}"
    );
    // 4 layers × 7 linears × 2 scales of 4 bytes.
    assert!(
        text.contains("F32      56 tensors        224 B (224 bytes)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("parameters {} in 95 tensors", cfg.param_count())),
        "{text}"
    );
}

/// compressed-tensors' FP8_DYNAMIC scheme as LLM Compressor writes it (`gen-model
/// --fp8-channel`: one F32 scale per output channel, `[n, 1]`, dynamic per-token
/// activations): it loads as vLLM's CompressedTensorsW8A8Fp8 does (codes and channel scales
/// kept as stored, no requantization), weighs one byte a linear weight plus four a channel,
/// and its logits are as close to the 16-bit model's as fp8's error allows.
#[test]
fn a_compressed_tensors_fp8_dynamic_checkpoint_runs_channel_scales_and_per_token_activations() {
    let root = tempfile::tempdir().unwrap();
    let (f16_dir, ct_dir) = (root.path().join("f16"), root.path().join("ct"));
    gen_tiny(&f16_dir, &[]);
    gen_tiny(&ct_dir, &["--fp8-channel"]);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ct_dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config["quantization_config"]["quant_method"],
        "compressed-tensors"
    );
    let fp16 = bench_dir_logits(&f16_dir, "fp16", "fp16.json");
    let ct = bench_dir_logits(&ct_dir, "fp8", "ct.json");
    let in_flight = bench_dir_logits(&f16_dir, "fp8", "in-flight.json");
    let (d_fp16, d_in_flight) = (rel_l2(&ct, &fp16), rel_l2(&ct, &in_flight));
    eprintln!(
        "compressed-tensors fp8 vs fp16 {d_fp16:.3e}, vs in-flight per-tensor {d_in_flight:.3e}"
    );
    assert!(d_fp16 > 0.0 && d_fp16 < 0.12, "{d_fp16}");
    assert!(d_in_flight > 0.0, "{d_in_flight}");
    // Dry under 0.19: every linear's codes (a byte an element) and its `[n, 1]` f32 scales.
    let c = vramscope::model::presets::preset("tiny").unwrap();
    let (_, _, linears) = llama_bytes(&c);
    let r = dry_profile_at(&ct_dir, "0.19", &[]);
    let (h, i, q, kv) = (
        c.hidden_size as u64,
        c.intermediate_size as u64,
        c.q_dim() as u64,
        c.kv_dim() as u64,
    );
    let rows = [q + 2 * kv, h, 2 * i, h];
    let quantized: u64 = linears
        .iter()
        .zip(rows)
        .map(|(&n, r)| block(n) + block(4 * r))
        .sum::<u64>()
        * c.num_layers as u64;
    let (sixteen, _, _) = llama_bytes(&c);
    let sixteen_linears: u64 =
        linears.iter().map(|&n| block(2 * n)).sum::<u64>() * c.num_layers as u64;
    // 0.19's attention layers add seven 0-dim f32 scale tensors each (a block apiece).
    let scalars = 7 * 512 * c.num_layers as u64;
    assert_eq!(
        r["weights_bytes"].as_u64().unwrap(),
        sixteen - sixteen_linears + quantized + scalars
    );
    // V0 releases are not modelled for this format: one line naming it.
    let out = vramscope(&[
        "profile",
        "-q",
        "--model",
        ct_dir.to_str().unwrap(),
        "--device",
        "sim:h100-80gb:dry",
        "--vllm",
        "0.6.4",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("compressed-tensors fp8 checkpoint is modelled under the V1 releases"),
        "{err}"
    );
}

/// The compressed-tensors schemes that are not fp8 w8a8, int8 w8a8 or w4a16 are refused
/// naming what they are; a 16-bit checkpoint whose config says w4a16 or int8 w8a8 is refused
/// naming the missing or wrongly stored tensor.
#[test]
fn compressed_tensors_schemes_not_modelled_are_named() {
    let group = |weights: serde_json::Value, acts: serde_json::Value| {
        serde_json::json!({
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                "input_activations": acts}},
            "ignore": ["lm_head"],
        })
    };
    let int4 = serde_json::json!({"type": "int", "num_bits": 4, "strategy": "group",
        "group_size": 128, "symmetric": true, "dynamic": false});
    let (code, err) = profile_with_quantization_config(group(int4, serde_json::Value::Null));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("tensor model.layers.0.self_attn.q_proj.weight_packed is missing"),
        "{err}"
    );
    let mut q = group(
        serde_json::json!({"type": "int", "num_bits": 8, "strategy": "channel",
            "symmetric": true, "dynamic": false}),
        serde_json::json!({"type": "int", "num_bits": 8, "strategy": "token",
            "symmetric": true, "dynamic": true}),
    );
    q["format"] = "int-quantized".into();
    let (code, err) = profile_with_quantization_config(q.clone());
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is stored as F16, expected I8 (quantization_config says int8 w8a8)"),
        "{err}"
    );
    q["format"] = "float-quantized".into();
    let (code, err) = profile_with_quantization_config(q);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("only fp8 (type float, num_bits 8) is modelled yet"),
        "{err}"
    );
}

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
    };
    let m = LlamaModel::load(&rt, &opened.config, opened.source.as_ref(), &opts).unwrap();
    let (sixteen, fp8, linears) = llama_bytes(&opened.config);
    let st = rt.stats();
    assert_eq!(st.allocated - before, fp8);
    // By hand: 32 × (25165824 + 16777216 + 117440512 + 58720256 + 4 × 512) linear bytes,
    // 2 × 1050673152 for embed_tokens and lm_head, 65 norms of 8192, a 2 MiB rotary cache.
    assert_eq!(fp8, 9_083_363_328);
    // The peak: the whole 16-bit model, then module by module an fp8 copy and its scale
    // before the 16-bit weight is freed; each module frees more than the next one takes,
    // except that gate_up_proj (112 MiB) outgrows what qkv_proj and o_proj gave back.
    let mut now = sixteen;
    let mut peak = now;
    for _ in 0..opened.config.num_layers {
        for n in linears {
            peak = peak.max(now + block(n) + 512);
            now = now + block(n) + 512 - block(2 * n);
        }
    }
    assert_eq!(now, fp8);
    assert_eq!(st.allocated_peak - before, peak);
    assert_eq!(
        peak,
        sixteen + linears[2] + 512 - (linears[0] + linears[1] - 1024)
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
fn a_pre_quantized_fp8_checkpoint_is_refused_by_name() {
    for scheme in ["dynamic", "static"] {
        let (code, err) = profile_with_quantization_config(
            serde_json::json!({"quant_method": "fp8", "activation_scheme": scheme}),
        );
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("config.json")
                && err.contains("'fp8'")
                && err.contains(&format!("activation_scheme {scheme}"))
                && err.contains("--quant fp8"),
            "{err}"
        );
    }
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

#[test]
fn block_wise_fp8_is_refused_naming_weight_block_size_and_the_release() {
    let (code, err) = profile_with_quantization_config(serde_json::json!({
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("config.json")
            && err.contains("quantization_config.weight_block_size [128,128]")
            && err.contains("0.6.6"),
        "{err}"
    );
}

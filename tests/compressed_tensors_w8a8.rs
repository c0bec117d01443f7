//! compressed-tensors `int-quantized` int8 W8A8 checkpoints (LLM Compressor's W8A8 scheme,
//! RedHatAI's `…-quantized.w8a8`) as vLLM's CompressedTensorsW8A8Int8 runs them under the V1
//! releases through `CutlassScaledMMLinearKernel` / `CutlassInt8ScaledMMLinearKernel` (the
//! first CUDA int8 scaled-mm kernel: 0.11.0 kernels/scaled_mm/__init__.py L22-27, 0.15.1
//! L50-53, 0.19.0 kernels/linear/__init__.py L98-104): I8 weights `[n, k]` and f32 `[n, 1]`
//! scales kept as loaded (`weight.t()` is a view, cutlass.py L33-52 at 0.11.0), every forward
//! `scaled_int8_quant(x)` (the int8 input `[T, K]`, then f32 scales `[T, 1]`: _custom_ops.py
//! L1351 and L1361 at 0.11.0, L1909 and L1919 at 0.15.1, L1965 and L1975 at 0.19.0) and
//! `cutlass_scaled_mm`'s output in the model dtype. Dry and CPU compute; CUDA refused by name.

mod common;

use common::cli::{gen_tiny as gen, ok, profile_json_under as profile_under, vramscope};
use std::path::Path;

/// `gen-model --ct-w8a8` writes LLM Compressor's W8A8 layout: per linear an I8 `[n, k]`
/// weight (each row at `max |row| / 127.5`, compressed-tensors' symmetric qparams) and an
/// F32 `[n, 1]` `weight_scale`; the config names `format: int-quantized`, channel weights and
/// dynamic symmetric per-token int8 activations.
#[test]
fn gen_model_ct_w8a8_stores_int8_channel_weights() {
    let dir = tempfile::tempdir().unwrap();
    gen(dir.path(), &["--ct-w8a8"]);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
    let q = &cfg["quantization_config"];
    assert_eq!(q["format"], "int-quantized");
    let g = &q["config_groups"]["group_0"];
    assert_eq!(g["weights"]["type"], "int");
    assert_eq!(g["weights"]["num_bits"], 8);
    assert_eq!(g["weights"]["strategy"], "channel");
    assert_eq!(g["input_activations"]["strategy"], "token");
    assert_eq!(g["input_activations"]["dynamic"], true);
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = st.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(
        (format!("{:?}", w.dtype()), w.shape().to_vec()),
        ("I8".into(), vec![128, 384])
    );
    let s = st
        .tensor("model.layers.0.mlp.down_proj.weight_scale")
        .unwrap();
    assert_eq!(
        (format!("{:?}", s.dtype()), s.shape().to_vec()),
        ("F32".into(), vec![128, 1])
    );
    // Each row reaches ±127 or -128 at its absmax (|w| / (max / 127.5) rounds to 127.5 → 128,
    // clamped to 127 on the positive side).
    let codes: Vec<i8> = w.data().iter().map(|&b| b as i8).collect();
    for row in codes.chunks_exact(384) {
        let m = row.iter().map(|&c| (c as i32).abs()).max().unwrap();
        assert!(m == 127 || m == 128, "{m}");
    }
    let i = vramscope::model::inspect(dir.path()).unwrap();
    let tiny = vramscope::model::presets::preset("tiny").unwrap();
    assert_eq!(i.parameters, tiny.param_count());
}

/// The tiny preset's int8 checkpoint under 0.19 on an L40S, by hand: per layer the I8
/// weights qkv 256 × 128, o 128 × 128, gate_up 768 × 128, down 128 × 384 (196,608 bytes)
/// and their f32 `[n, 1]` scales (1,024 + 512 + 3,072 + 512 in 512-byte blocks): 201,728,
/// 806,912 for 4 layers; the embedding and lm_head 2 × 1024 × 128 × 2 = 524,288, the final
/// norm (a 512 block), 8 layer norms (4,096 in blocks), the rotary cache 2048 × 32 × 2 =
/// 131,072, 0.19's seven 0-dim f32 attention scales a layer (7 × 512 × 4 = 14,336 in
/// blocks): 1,481,216 bytes of blocks, 1,464,688 of tensors. Dry and compute allocate alike
/// under 0.11, 0.15 and 0.19 and on an A100 (int8 needs compute capability 7.5); and
/// byte for byte as the compressed-tensors fp8 (FP8_DYNAMIC) checkpoint of the same model,
/// whose weights, scales, per-token quantized input `[T, K]` (one byte an element) and
/// `[T, 1]` f32 scales vLLM allocates in the same sizes and order.
#[test]
fn ct_w8a8_allocates_as_vllm_does_dry_and_in_compute() {
    let (dir, fp8) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    gen(dir.path(), &["--ct-w8a8"]);
    gen(fp8.path(), &["--fp8-channel"]);
    for (device, vllm) in [
        ("sim:l40s", "0.19"),
        ("sim:l40s", "0.15"),
        ("sim:l40s", "0.11"),
        ("sim:a100-80gb", "0.19"),
    ] {
        let dry = profile_under(dir.path(), &format!("{device}:dry"), vllm);
        let cpu = profile_under(dir.path(), &format!("{device}:compute"), vllm);
        for key in ["weights_bytes", "weights_tensor_bytes", "truth"] {
            assert_eq!(dry[key], cpu[key], "{device} {vllm} {key}");
        }
        for t in ["t0", "t1", "t2", "t3"] {
            for key in ["allocated", "allocated_peak", "reserved", "free"] {
                assert_eq!(
                    dry["checkpoints"][t][key], cpu["checkpoints"][t][key],
                    "{device} {vllm} {t} {key}"
                );
            }
        }
        if vllm == "0.19" && device == "sim:l40s" {
            assert_eq!(dry["weights_bytes"].as_u64().unwrap(), 1_481_216);
            assert_eq!(dry["weights_tensor_bytes"].as_u64().unwrap(), 1_464_688);
        }
        if device == "sim:l40s" {
            let f = profile_under(fp8.path(), &format!("{device}:dry"), vllm);
            for t in ["t1", "t2", "t3"] {
                for key in ["allocated", "allocated_peak", "reserved"] {
                    assert_eq!(
                        dry["checkpoints"][t][key], f["checkpoints"][t][key],
                        "{vllm} {t} {key}"
                    );
                }
            }
        }
    }
}

fn bench_logits(model: &str, tmp: &Path, tag: &str) -> Vec<f64> {
    let json = tmp.join(format!("{tag}.json"));
    ok(&vramscope(&[
        "bench",
        "--model",
        model,
        "--quant",
        "fp16",
        "--device",
        "sim:l40s:compute",
        "--tokens",
        "64",
        "--json",
        json.to_str().unwrap(),
    ]));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// CPU logits of the int8 checkpoint against the 16-bit model's: measured relative L2
/// 1.73e-2 (int8 weights per channel, activations per token), where the fp8 FP8_DYNAMIC
/// checkpoint of the same model gives 7.0e-2 (tests/fp8.rs).
#[test]
fn ct_w8a8_logits_are_near_the_16_bit_models() {
    let tmp = tempfile::tempdir().unwrap();
    let (f16, i8_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    gen(f16.path(), &[]);
    gen(i8_dir.path(), &["--ct-w8a8"]);
    let a = bench_logits(f16.path().to_str().unwrap(), tmp.path(), "f16");
    let b = bench_logits(i8_dir.path().to_str().unwrap(), tmp.path(), "i8");
    let d: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt()
        / a.iter().map(|x| x * x).sum::<f64>().sqrt();
    println!("compressed-tensors int8 w8a8 vs fp16: relative L2 {d:.4e}");
    assert!(d > 0.0 && d < 0.03, "{d}");
}

/// What is not modelled is one line each: V0 releases, tensor parallelism, per-tensor
/// weights, static or asymmetric activations, weight-only int8, a 16-bit weight under an
/// int8 config.
#[test]
fn ct_w8a8_refusals_are_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    gen(dir.path(), &["--ct-w8a8"]);
    let run = |extra: &[&str]| -> String {
        let mut args = vec![
            "profile",
            "-q",
            "--model",
            dir.path().to_str().unwrap(),
            "--device",
            "sim:l40s:dry",
            "--max-model-len",
            "256",
        ];
        args.extend_from_slice(extra);
        let out = vramscope(&args);
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let err = run(&["--vllm", "0.6.4"]);
    assert!(
        err.contains("int8 w8a8 checkpoint is modelled under the V1 releases"),
        "{err}"
    );
    let err = run(&["--vllm", "0.19", "--tp", "2"]);
    assert!(
        err.contains("--tp 2 with a compressed-tensors int8 w8a8 checkpoint"),
        "{err}"
    );
    let cfg_path = dir.path().join("config.json");
    let good: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|g| g["weights"]["strategy"] = "tensor".into()),
            "weights.strategy Some(\"tensor\") is not modelled yet",
        ),
        (
            Box::new(|g| g["input_activations"]["dynamic"] = false.into()),
            "only dynamic per-token int8 activations are modelled",
        ),
        (
            Box::new(|g| g["input_activations"]["symmetric"] = false.into()),
            "asymmetric activations (zero points, azp_adj, cutlass_scaled_mm_azp)",
        ),
        (
            Box::new(|g| g["input_activations"] = serde_json::Value::Null),
            "int8 weight-only (w8a16) is not modelled yet",
        ),
        (
            Box::new(|g| g["input_activations"]["type"] = "float".into()),
            "only int8 activations go with int8 weights",
        ),
    ];
    for (edit, want) in cases {
        let mut cfg = good.clone();
        edit(&mut cfg["quantization_config"]["config_groups"]["group_0"]);
        std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
        let err = run(&["--vllm", "0.19"]);
        assert!(err.contains(want), "{err}");
    }
    // A 16-bit checkpoint whose config says int8.
    let f16 = tempfile::tempdir().unwrap();
    gen(f16.path(), &[]);
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f16.path().join("config.json")).unwrap()).unwrap();
    cfg["quantization_config"] = good["quantization_config"].clone();
    std::fs::write(
        f16.path().join("config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    let out = vramscope(&[
        "profile",
        "-q",
        "--model",
        f16.path().to_str().unwrap(),
        "--vllm",
        "0.19",
        "--device",
        "sim:l40s:dry",
        "--max-model-len",
        "256",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("is stored as F16, expected I8 (quantization_config says int8 w8a8)"),
        "{err}"
    );
}

/// RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8's shape (Llama-3.1-8B's config.json
/// with LLM Compressor's W8A8 quantization_config), planned through the binary under 0.19
/// on an L40S, and profiled dry. By hand: per layer the I8 weights qkv 6144 × 4096 =
/// 25,165,824, o 4096 × 4096 = 16,777,216, gate_up 28672 × 4096 = 117,440,512, down 4096 ×
/// 14336 = 58,720,256, their f32 `[n, 1]` scales 4 × (6144 + 4096 + 28672 + 4096) =
/// 172,032 and two bf16 norms 16,384: 218,292,224, 6,985,351,168 for 32 layers; the
/// embedding and lm_head (ignored: bf16) 2 × 128256 × 4096 × 2 = 2,101,346,304, the final
/// norm 8,192, the rotary cache 131072 × 128 × 2 = 33,554,432 and 0.19's seven f32 attention
/// scalars a layer 896: 9,120,260,992 bytes of tensors. CUTLASS's int8 GEMM runs on Hopper
/// too (no Machete here): the H100 plans.
#[test]
fn llama31_8b_w8a8_plans_through_the_binary_to_the_byte() {
    let mut cfg: serde_json::Value = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "hidden_act": "silu"
    });
    let tiny = tempfile::tempdir().unwrap();
    gen(tiny.path(), &["--ct-w8a8"]);
    let q: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tiny.path().join("config.json")).unwrap()).unwrap();
    cfg["quantization_config"] = q["quantization_config"].clone();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    let model = dir.path().display().to_string();
    for device in ["sim:l40s", "sim:h100-sxm"] {
        let out = vramscope(&[
            "plan",
            "--vllm",
            "0.19",
            "--device",
            device,
            "--",
            "vllm",
            "serve",
            &model,
            "--max-model-len",
            "8192",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{device}: {text}");
        assert!(text.contains("weights memory: 8.49GiB"), "{device}: {text}");
    }
    let json = dir.path().join("r.json");
    ok(&vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        &model,
        "--vllm",
        "0.19",
        "--device",
        "sim:l40s:dry",
        "--max-model-len",
        "8192",
    ]));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert_eq!(r["weights_tensor_bytes"].as_u64().unwrap(), 9_120_260_992);
}

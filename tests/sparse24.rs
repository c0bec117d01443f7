//! 2:4 sparse compressed-tensors checkpoints (issue 47) under vLLM 0.11 and 0.15's
//! `CompressedTensors24` on Hopper (docs/reading/vllm-sparse24.md): the forms gen-model
//! writes, the allocations by hand, dry = compute, CPU logits, the published 8B shapes, and
//! the refusals (0.19's NotImplementedError, other GPUs, bad files), one line each.

mod common;

use std::path::Path;

use common::cli::{bench_logits, gen_tiny, ok, profile_json_under, rel_l2, vramscope};

const H100: &str = "sim:h100-80gb:dry";
const H100_CPU: &str = "sim:h100-80gb:compute";

fn header(dir: &Path) -> serde_json::Value {
    let raw = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&raw[8..8 + n]).unwrap()
}

/// The tensors each form holds for a projection (tiny's down_proj, `[128, 384]`), and
/// inspect's parameter count (a bitmask weight's kept values stand for twice their number).
#[test]
fn gen_model_writes_each_form() {
    let base = "model.layers.0.mlp.down_proj";
    for (flags, parts) in [
        (
            &["--sparse24", "dense"][..],
            &[("weight", "F16", [128, 384])][..],
        ),
        (
            &["--sparse24", "bitmask"][..],
            &[
                ("compressed", "F16", [128, 192]),
                ("bitmask", "U8", [128, 48]),
                ("shape", "I64", [2, 1]),
            ][..],
        ),
        (
            &["--sparse24", "bitmask", "--sparse24-fp8"][..],
            &[
                ("compressed", "F8_E4M3", [128, 192]),
                ("bitmask", "U8", [128, 48]),
                ("weight_scale", "F32", [128, 1]),
            ][..],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), flags);
        let h = header(dir.path());
        for (p, dtype, shape) in parts {
            let t = &h[format!("{base}.{p}")];
            assert_eq!(t["dtype"], *dtype, "{flags:?} {p}");
            assert_eq!(t["shape"], serde_json::json!(shape), "{flags:?} {p}");
        }
        assert_eq!(h["lm_head.weight"]["dtype"], "F16");
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap())
                .unwrap();
        let s = &cfg["quantization_config"]["sparsity_config"];
        assert_eq!(s["sparsity_structure"], "2:4");
        assert_eq!(s["targets"], serde_json::json!(["Linear"]));
        let out = vramscope(&["inspect", dir.path().to_str().unwrap()]);
        ok(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("parameters 1049728 in"), "{flags:?}: {text}");
    }
}

/// Tiny (hidden 128, intermediate 384, 4 layers, 2 KV heads, f16) under 0.15 on an H100,
/// after loading, against the 16-bit tiny model: each stacked linear `[n, k]` holds CUTLASS's
/// non-zeros `[n, k/2]` f16 = n·k bytes and metadata `[n, k/8]` U8 (no padding: n a multiple
/// of 64, k of 128) and two f32 `[1]` ones, where the 16-bit one held 2·n·k: qkv 256 × 128,
/// o 128 × 128, gate_up 768 × 128, down 128 × 384 (n·k 32,768 + 16,384 + 98,304 + 49,152 =
/// 196,608): 196,608 + 24,576 + 32 = 221,216 a layer against 393,216, 688,000 fewer bytes over
/// four layers. The bitmask form keeps each layer's `shape [2, 1]` I64 (16 bytes, four a
/// layer): 256 more. fp8 (channel scales, dynamic activations): n·k/2 + n·k/8 + 4n = 128,000
/// a layer, 1,060,864 fewer. Dry and compute allocate the same.
#[test]
fn tiny_sparse24_weighs_by_hand_and_plans_dry_as_it_computes() {
    let plain = tempfile::tempdir().unwrap();
    gen_tiny(plain.path(), &[]);
    let base = profile_json_under(plain.path(), H100, "0.15")["weights_tensor_bytes"]
        .as_i64()
        .unwrap();
    for (flags, less) in [
        (&["--sparse24", "dense"][..], 688_000i64),
        (&["--sparse24", "bitmask"][..], 688_000 - 256),
        (&["--sparse24", "dense", "--sparse24-fp8"][..], 1_060_864),
        (
            &["--sparse24", "bitmask", "--sparse24-fp8"][..],
            1_060_864 - 256,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), flags);
        for vllm in ["0.11", "0.15"] {
            let dry = profile_json_under(dir.path(), H100, vllm);
            let cpu = profile_json_under(dir.path(), H100_CPU, vllm);
            assert_eq!(
                dry["weights_tensor_bytes"].as_i64().unwrap(),
                base - less,
                "{flags:?} {vllm}"
            );
            for key in ["weights_bytes", "weights_tensor_bytes"] {
                assert_eq!(dry[key], cpu[key], "{flags:?} {vllm} {key}");
            }
            for t in ["t0", "t1", "t2", "t3"] {
                for key in ["allocated", "allocated_peak", "reserved"] {
                    assert_eq!(
                        dry["checkpoints"][t][key], cpu["checkpoints"][t][key],
                        "{flags:?} {vllm} {t} {key}"
                    );
                }
            }
        }
    }
}

/// The largest `allocated` while loading: the events before the `t1` checkpoint.
fn load_peak(r: &serde_json::Value) -> i64 {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .take_while(|e| !(e["kind"] == "marker" && e["tensor"] == "t1"))
        .map(|e| e["allocated"].as_i64().unwrap())
        .max()
        .unwrap()
}

/// The load peaks under 0.15 by hand, from the 16-bit tiny model's (its weights, P):
/// `create_weights` holds every layer's parameters before `process_weights_after_loading`
/// runs module by module, so the peak is in layer 0's gate_up (768 × 128, the largest; each
/// module processed before it has shrunk the total).
///
/// - dense 16-bit: P + the two f32 ones of 16 linears (512-byte blocks: 16,384) = A; gate_up's
///   compress allocates metadata n·k/8 and non-zeros n·k while the dense weight is held
///   (1.125 · 98,304 = 110,592; its `== -0.0` mask, n·k, is freed before), after qkv and o
///   each saved 0.875 · n·k (43,008): A + 67,584.
/// - bitmask 16-bit: A + each module's `shape` (512), `compressed` n·k and `bitmask` n·k/8
///   (892,928 over four layers) = A'; each module processed saves 2·n·k (qkv, o: 98,304);
///   gate_up's second shard decompresses with the first held: 98,304 + its dense 98,304 +
///   the two I64 index tensors of its mask (2 × 4 × 49,152 = 393,216): A' + 491,520.
/// - bitmask fp8: P − 266,240 (fp8 `[n, k]` n·k, `[n, 1]` scales 4n, shape, compressed n·k/2,
///   bitmask n·k/8 against 2·n·k) = F; each module saves n·k (49,152); the second shard:
///   49,152 held + 49,152 + 393,216: F + 442,368.
#[test]
fn load_peaks_by_hand() {
    let peak = |flags: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), flags);
        let dry = profile_json_under(dir.path(), H100, "0.15");
        let cpu = profile_json_under(dir.path(), H100_CPU, "0.15");
        assert_eq!(load_peak(&dry), load_peak(&cpu), "{flags:?}");
        load_peak(&dry)
    };
    let p = peak(&[]);
    let dense = peak(&["--sparse24", "dense"]);
    let bitmask = peak(&["--sparse24", "bitmask"]);
    let fp8 = peak(&["--sparse24", "bitmask", "--sparse24-fp8"]);
    println!("load peaks: 16-bit {p}, 2:4 dense {dense}, bitmask {bitmask}, fp8 bitmask {fp8}");
    assert_eq!(dense - p, 16_384 + 67_584);
    assert_eq!(bitmask - p, 16_384 + 892_928 + 491_520);
    assert_eq!(fp8 - p, -266_240 + 442_368);
}

/// CPU logits: the dense and bitmask forms hold the same values, so their logits are equal;
/// the fp8 checkpoint sits within fp8's error of the 16-bit sparse one (relative L2 printed).
#[test]
fn sparse24_logits_are_one_across_forms_and_fp8_is_near() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |flags: &[&str], tag: &str| {
        let dir = tmp.path().join(tag);
        gen_tiny(&dir, flags);
        bench_logits(dir.to_str().unwrap(), H100_CPU, tmp.path(), tag)
    };
    let dense = run(&["--sparse24", "dense"], "dense");
    let bitmask = run(&["--sparse24", "bitmask"], "bitmask");
    assert_eq!(dense, bitmask);
    let fp8 = run(&["--sparse24", "bitmask", "--sparse24-fp8"], "fp8");
    let fp8_dense = run(&["--sparse24", "dense", "--sparse24-fp8"], "fp8d");
    assert_eq!(fp8, fp8_dense);
    let d = rel_l2(&dense, &fp8);
    println!("2:4 fp8 vs 2:4 fp16: relative L2 {d:.3e}");
    assert!(d > 0.0 && d < 0.1, "{d}");
    let base = bench_logits("preset:tiny", H100_CPU, tmp.path(), "f16");
    let p = rel_l2(&base, &dense);
    println!("2:4 pruned vs tiny fp16: relative L2 {p:.3e}");
    assert!(p > 0.05, "pruning half the weights moves the logits: {p}");
}

/// Writes the checkpoints scripts/sparse24_reference.py reads (set VRAMSCOPE_SPARSE24_FIXTURE
/// to a directory; `dense`, `bitmask` and `fp8` are written under it): the same files the
/// reference test makes (seed 0).
#[test]
#[ignore]
fn write_fixture() {
    let root = std::path::PathBuf::from(std::env::var("VRAMSCOPE_SPARSE24_FIXTURE").unwrap());
    gen_tiny(&root.join("dense"), &["--sparse24", "dense"]);
    gen_tiny(&root.join("bitmask"), &["--sparse24", "bitmask"]);
    gen_tiny(
        &root.join("fp8"),
        &["--sparse24", "bitmask", "--sparse24-fp8"],
    );
}

/// Last-token logits at ids 3, 11, ..., 1019 of tiny's 16-token dummy sequence, from the
/// checkpoint `gen-model tiny DIR --sparse24 bitmask` writes: `python3
/// scripts/sparse24_reference.py DIR --pure` (the bitmask decoded independently, a Llama
/// forward in plain Python, float64); the dense form's checkpoint gives the same, and the
/// script's PyTorch 2.11 mode (float32, transformers' `LlamaForCausalLM`) is 3.3e-7 from it
/// for all three forms (docs/gpu-runs.md run 82).
const REFERENCE: [f64; 128] = include!("fixtures/sparse24_reference.in");

/// The same for `--sparse24 bitmask --sparse24-fp8` (the fp8 values times their channel
/// scales; each decoder linear's input rounded to fp8 per token as `scaled_fp8_quant` does,
/// the rest float64).
const REFERENCE_FP8: [f64; 128] = include!("fixtures/sparse24_fp8_reference.in");

fn cpu_logits(dir: &Path) -> Vec<f64> {
    let json = dir.join("b.json");
    ok(&vramscope(&[
        "bench",
        "--model",
        dir.to_str().unwrap(),
        "--quant",
        "fp16",
        "--device",
        H100_CPU,
        "--tokens",
        "16",
        "--seqs",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let logits = r["logits"].as_array().unwrap();
    assert_eq!(logits.len(), 1024);
    (3..1024)
        .step_by(8)
        .map(|i| logits[i].as_f64().unwrap())
        .collect()
}

/// vramscope's CPU forward (CUTLASS's math: fp16 activations and output, f32 accumulation;
/// fp8 activations per token for the fp8 scheme) against the independent reference: 3.6e-4
/// for the 16-bit checkpoints, fp16 activations' error (bound 2e-3); 2.6e-2 for the fp8 one
/// (bound 5e-2): the reference rounds the same inputs to fp8, but from float64 activations
/// rather than fp16 ones, and a value on the other side of an e4m3 rounding boundary moves by
/// up to 1/16 of itself (against the 16-bit reference the fp8 checkpoint is 7.3e-2 away).
#[test]
fn sparse24_cpu_logits_match_the_reference() {
    for (flags, reference, bound) in [
        (&["--sparse24", "bitmask"][..], &REFERENCE, 2e-3),
        (&["--sparse24", "dense"][..], &REFERENCE, 2e-3),
        (
            &["--sparse24", "bitmask", "--sparse24-fp8"][..],
            &REFERENCE_FP8,
            5e-2,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), flags);
        let e = rel_l2(reference, &cpu_logits(dir.path()));
        println!("{flags:?}: CPU logits against the reference, relative L2 {e:.2e}");
        assert!(e < bound, "{flags:?}: {e}");
    }
}

/// The profile of a checkpoint: exit code and stderr's one line.
fn refused(dir: &Path, vllm: &str, device: &str, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec![
        "profile",
        "-q",
        "--model",
        dir.to_str().unwrap(),
        "--vllm",
        vllm,
        "--device",
        device,
        "--max-model-len",
        "256",
    ];
    args.extend_from_slice(extra);
    let out = vramscope(&args);
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    (out.status.code(), err)
}

/// 0.19 raises vLLM's own NotImplementedError (named with its file and line); 0.6.4 is not a
/// release that has the scheme modelled; an A100 fails vLLM's capability check; a CUDA device
/// and tensor parallelism are not modelled: one line each.
#[test]
fn sparse24_releases_and_gpus_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    gen_tiny(dir.path(), &["--sparse24", "bitmask"]);
    let (code, e) = refused(dir.path(), "0.19", H100, &[]);
    assert_eq!(code, Some(2));
    assert!(
        e.contains("vLLM would not start")
            && e.contains("NotImplementedError: Sparse24 models are no longer supported by vLLM")
            && e.contains("compressed_tensors_24.py L27 at 0.19.0"),
        "{e}"
    );
    let (code, e) = refused(dir.path(), "0.6.4", H100, &[]);
    assert_eq!(code, Some(2), "{e}");
    let (code, e) = refused(dir.path(), "0.15", "sim:a100-80gb:dry", &[]);
    assert_eq!(code, Some(2));
    assert!(
        e.contains("Min capability: 90") && e.contains("A100"),
        "{e}"
    );
    let (_, e) = refused(dir.path(), "0.15", "cuda:0", &[]);
    assert!(e.contains("on a CUDA device"), "{e}");
    let (_, e) = refused(dir.path(), "0.15", H100, &["--tp", "2"]);
    assert!(e.contains("use --tp 1"), "{e}");
    let (_, e) = refused(dir.path(), "0.15", H100, &["--quant", "bf16"]);
    assert!(e.contains("use --quant fp16"), "{e}");
}

/// Rewrites one tensor of `dir`'s model.safetensors through `edit(bytes)`.
fn edit_tensor(dir: &Path, name: &str, edit: impl Fn(&mut [u8])) {
    let path = dir.join("model.safetensors");
    let mut raw = std::fs::read(&path).unwrap();
    let h = header(dir);
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let [a, b] = [0, 1].map(|i| h[name]["data_offsets"][i].as_u64().unwrap() as usize);
    edit(&mut raw[8 + n + a..8 + n + b]);
    std::fs::write(&path, raw).unwrap();
}

/// A bitmask with three bits in a group, a `shape` that is not the config's, a dense weight
/// with three non-zeros in a group of four: refused in one line naming the file and tensor.
#[test]
fn bad_sparse24_files_are_one_line_each() {
    let t = "model.layers.1.mlp.down_proj";
    let dir = tempfile::tempdir().unwrap();
    gen_tiny(dir.path(), &["--sparse24", "bitmask"]);
    edit_tensor(dir.path(), &format!("{t}.bitmask"), |b| b[0] |= 0x0F);
    let (code, e) = refused(dir.path(), "0.15", H100, &[]);
    assert_eq!(code, Some(2));
    assert!(
        e.contains("model.safetensors")
            && e.contains(&format!(
                "tensor {t}.bitmask: row 0, inputs 0..4 set 4 bits"
            )),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    gen_tiny(dir.path(), &["--sparse24", "bitmask"]);
    edit_tensor(dir.path(), &format!("{t}.shape"), |b| b[0] = 64);
    let (_, e) = refused(dir.path(), "0.15", H100, &[]);
    assert!(
        e.contains(&format!(
            "tensor {t}.shape holds [64, 384], expected [128, 384]"
        )),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    gen_tiny(dir.path(), &["--sparse24", "dense"]);
    // Every input of row 0's first group made non-zero (f16 1.0).
    edit_tensor(dir.path(), &format!("{t}.weight"), |b| {
        for i in 0..4 {
            b[2 * i..2 * i + 2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
        }
    });
    let (_, e) = refused(dir.path(), "0.15", H100_CPU, &[]);
    assert!(
        e.contains(&format!(
            "tensor {t}.weight: row 0, inputs 0..4 hold more than two non-zeros: the weight is not 2:4 sparse"
        )),
        "{e}"
    );
}

/// Configs CompressedTensors24 does not take, or vramscope does not model yet: one line
/// naming the key.
#[test]
fn sparse24_configs_not_modelled_are_one_line_each() {
    let cases: [(&str, serde_json::Value, &str); 4] = [
        (
            "int8",
            serde_json::json!({"type": "int"}),
            "int8 w8a8 2:4 (CUTLASS int8 sparse GEMM) is not modelled yet",
        ),
        (
            "static",
            serde_json::json!({"strategy": "tensor", "dynamic": false}),
            "only dynamic per-token fp8 activations are modelled for 2:4",
        ),
        (
            "weight-only",
            serde_json::Value::Null,
            "weight-only quantization with a 2:4 sparsity_config",
        ),
        (
            "format",
            serde_json::json!("unstructured"),
            "sparsity_config.format \"sparse-bitmask\"",
        ),
    ];
    for (what, change, expect) in cases {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), &["--sparse24", "dense", "--sparse24-fp8"]);
        let p = dir.path().join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        let q = &mut cfg["quantization_config"];
        let act = &mut q["config_groups"]["group_0"]["input_activations"];
        match what {
            "int8" => {
                act["type"] = change["type"].clone();
                q["config_groups"]["group_0"]["weights"]["type"] = "int".into();
            }
            "static" => {
                act["strategy"] = change["strategy"].clone();
                act["dynamic"] = change["dynamic"].clone();
            }
            "weight-only" => *act = serde_json::Value::Null,
            _ => q["sparsity_config"]["format"] = "sparse-bitmask".into(),
        }
        std::fs::write(&p, cfg.to_string()).unwrap();
        let (code, e) = refused(dir.path(), "0.15", H100, &[]);
        assert_eq!(code, Some(2), "{what}");
        assert!(e.contains(expect), "{what}: {e}");
    }
}

/// Llama-3.1-8B's shape with the 2:4 sparsity_config LLM Compressor writes (16-bit, bf16;
/// RedHatAI/Sparse-Llama-3.1-8B-2of4), from its config alone.
fn llama31_8b_2of4(format: &str, fp8: bool) -> String {
    let mut q = serde_json::json!({
        "quant_method": "compressed-tensors",
        "sparsity_config": {"format": format, "global_sparsity": 0.45, "ignore": ["lm_head"],
            "registry_requires_subclass": false, "sparsity_structure": "2:4",
            "targets": ["Linear"]},
    });
    if fp8 {
        q["format"] = "float-quantized".into();
        q["ignore"] = serde_json::json!(["lm_head"]);
        q["config_groups"] = serde_json::json!({"group_0": {"targets": ["Linear"],
            "weights": {"type": "float", "num_bits": 8, "strategy": "channel",
                "symmetric": true, "dynamic": false},
            "input_activations": {"type": "float", "num_bits": 8, "strategy": "token",
                "symmetric": true, "dynamic": true}}});
    }
    let mut cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    });
    cfg["quantization_config"] = q;
    cfg.to_string()
}

fn weights_8b(config: &str) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let json = dir.path().join("r.json");
    let out = vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.path().to_str().unwrap(),
        "--vllm",
        "0.15",
        "--quant",
        "bf16",
        "--device",
        H100,
        "--max-model-len",
        "8192",
    ]);
    ok(&out);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    r["weights_tensor_bytes"].as_u64().unwrap()
}

/// Sparse-Llama-3.1-8B-2of4 under 0.15 on an H100, after loading, against the dense
/// Llama-3.1-8B of the same config, by hand: per layer each stacked linear `[n, k]` holds
/// CUTLASS's non-zeros n·k bytes (bf16 `[n, k/2]`) and metadata n·k/8 (no padding) and two
/// f32 ones, 8 bytes: qkv (6144 × 4096) 25,165,824 + 3,145,728; o (4096²) 16,777,216 +
/// 2,097,152; gate_up (28672 × 4096) 117,440,512 + 14,680,064; down (4096 × 14336)
/// 58,720,256 + 7,340,032; + 32 = 245,366,816 a layer, where the dense layers hold
/// 436,207,616: 6,106,905,600 fewer bytes over 32 layers. The bitmask form keeps 64 bytes of
/// `shape` a layer (2,048). The FP8-dynamic one (`[n, k/2]` fp8, metadata, `[n, 1]` f32
/// scales) 136,486,912 a layer: 9,591,980,032 fewer.
#[test]
fn llama31_8b_2of4_weighs_by_hand_on_an_h100() {
    let mut dense: serde_json::Value =
        serde_json::from_str(&llama31_8b_2of4("dense", false)).unwrap();
    dense.as_object_mut().unwrap().remove("quantization_config");
    let base = weights_8b(&dense.to_string());
    let (h, i) = (4096u64, 14336u64);
    let linears = [(6144, h), (h, h), (2 * i, h), (h, i)];
    let sparse16: u64 = linears.iter().map(|&(n, k)| n * k + n * k / 8 + 8).sum();
    let dense16: u64 = linears.iter().map(|&(n, k)| 2 * n * k).sum();
    let sparse8: u64 = linears
        .iter()
        .map(|&(n, k)| n * k / 2 + n * k / 8 + 4 * n)
        .sum();
    assert_eq!(sparse16, 245_366_816);
    assert_eq!(dense16, 436_207_616);
    assert_eq!(sparse8, 136_486_912);
    let s16 = weights_8b(&llama31_8b_2of4("dense", false));
    let bm16 = weights_8b(&llama31_8b_2of4("sparse-24-bitmask", false));
    let s8 = weights_8b(&llama31_8b_2of4("dense", true));
    println!("Llama-3.1-8B under 0.15 on an H100: dense {base}, 2:4 {s16} (bitmask {bm16}), 2:4 FP8-dynamic {s8}");
    assert_eq!(base - s16, 32 * (dense16 - sparse16));
    assert_eq!(base - s16, 6_106_905_600);
    assert_eq!(bm16 - s16, 2_048);
    assert_eq!(base - s8, 9_591_062_528);
}

/// The two lines docs/cli.md shows, as written there (from a scratch directory).
#[test]
fn the_docs_lines_run_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let run = |line: &str| {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&words)
            .current_dir(dir.path())
            .output()
            .unwrap();
        ok(&out);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    run("vramscope gen-model tiny ./tiny-2of4 --sparse24 bitmask --sparse24-fp8");
    let text = run("vramscope profile --model ./tiny-2of4 --vllm 0.15 --device sim:h100-80gb:dry");
    assert!(text.contains("weights"), "{text}");
}

/// `plan` under 0.19 takes the would-not-start path: exit 3, vLLM's own words with their file
/// and line, and what would start; under 0.15 on the same GPU it plans.
#[test]
fn plan_under_0_19_says_vllm_would_not_start() {
    let dir = tempfile::tempdir().unwrap();
    gen_tiny(dir.path(), &["--sparse24", "dense"]);
    let plan = |vllm: &str| {
        let out = vramscope(&[
            "plan",
            "--vllm",
            vllm,
            "--device",
            "sim:h100-80gb",
            "--",
            "vllm",
            "serve",
            dir.path().to_str().unwrap(),
            "--max-model-len",
            "256",
        ]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, text) = plan("0.19");
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.contains("vLLM 0.19 would not start")
            && text.contains(
                "\"NotImplementedError: Sparse24 models are no longer supported by vLLM\""
            )
            && text.contains("compressed_tensors_24.py L27")
            && text.contains("--vllm 0.15"),
        "{text}"
    );
    let (code, text) = plan("0.15");
    assert_eq!(code, Some(0), "{text}");
}

//! NVFP4 checkpoints (compressed-tensors `nvfp4-pack-quantized`, ModelOpt `NVFP4`) under vLLM
//! 0.19's Marlin FP4 path (docs/reading/vllm-nvfp4-modelopt.md): the layout gen-model writes,
//! the allocations by hand, dry = compute, CPU logits, the published 8B shape, and the
//! refusals, one line each.

mod common;

use std::path::Path;

use common::cli::{bench_logits, gen_tiny, ok, profile_json_under, rel_l2, vramscope};

/// The simulated GPU the logits are computed on.
const DEVICE: &str = "sim:a100-80gb:compute";

fn header(dir: &Path) -> serde_json::Value {
    let raw = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&raw[8..8 + n]).unwrap()
}

/// The tensors each tool writes for a projection: names, dtypes, shapes.
#[test]
fn gen_model_writes_each_tools_tensors() {
    for (flavor, names) in [
        (
            "ct",
            [
                "weight_packed",
                "weight_scale",
                "weight_global_scale",
                "input_global_scale",
            ],
        ),
        (
            "modelopt",
            ["weight", "weight_scale", "weight_scale_2", "input_scale"],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), &["--nvfp4", flavor]);
        let h = header(dir.path());
        let base = "model.layers.0.mlp.down_proj";
        let t = |s: &str| &h[format!("{base}.{s}")];
        assert_eq!(t(names[0])["dtype"], "U8");
        assert_eq!(t(names[0])["shape"], serde_json::json!([128, 192]));
        assert_eq!(t(names[1])["dtype"], "F8_E4M3");
        assert_eq!(t(names[1])["shape"], serde_json::json!([128, 24]));
        let scalar = if flavor == "ct" {
            serde_json::json!([1])
        } else {
            serde_json::json!([])
        };
        for s in &names[2..] {
            assert_eq!(t(s)["dtype"], "F32");
            assert_eq!(t(s)["shape"], scalar);
        }
        assert_eq!(h["lm_head.weight"]["dtype"], "F16");
        let hq = dir.path().join("hf_quant_config.json");
        assert_eq!(hq.is_file(), flavor == "modelopt");
        // inspect counts two codes a byte and no scales: tiny's 1,049,728 parameters.
        let out = vramscope(&["inspect", dir.path().to_str().unwrap()]);
        ok(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("parameters 1049728 in 123 tensors"), "{text}");
    }
}

/// Tiny (hidden 128, intermediate 384, 4 layers, 4 heads of 32, 2 KV heads, vocab 1024, f16)
/// on a simulated H100 (132 SMs) under 0.19, after loading, by tensor:
///
/// - per layer, each stacked linear `[n, k]`: the repacked words `[k/16, 2n]` I32 = n·k/2,
///   the Marlin scales `[k/16, n]` fp8 = n·k/16, four 0-dim f32 (global, input, its inverse,
///   alpha) = 16, the workspace 132 I32 = 528: qkv 256 × 128, o 128 × 128, gate_up
///   768 × 128, down 128 × 384: 98,304 + 12,288 + 4 × 544 = 112,768; × 4 = 451,072;
/// - the embedding and lm_head 2 × 1024 × 128 × 2 = 524,288, nine norms 2,304;
/// - the rotary cache 2048 × 32 × 2 = 131,072, 0.19's seven attention scalars a layer 112:
///
/// 1,108,848 bytes of tensors, for either flavor; dry and compute the same allocations.
#[test]
fn tiny_nvfp4_weighs_by_hand_and_plans_dry_as_it_computes() {
    for flavor in ["ct", "modelopt"] {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), &["--nvfp4", flavor]);
        let dry = profile_json_under(dir.path(), "sim:h100-80gb:dry", "0.19");
        let cpu = profile_json_under(dir.path(), "sim:h100-80gb:compute", "0.19");
        assert_eq!(dry["weights_tensor_bytes"], 1_108_848, "{flavor}");
        for key in ["weights_bytes", "weights_tensor_bytes"] {
            assert_eq!(dry[key], cpu[key], "{flavor} {key}");
        }
        for t in ["t0", "t1", "t2", "t3"] {
            for key in ["allocated", "allocated_peak", "reserved"] {
                assert_eq!(
                    dry["checkpoints"][t][key], cpu["checkpoints"][t][key],
                    "{flavor} {t} {key}"
                );
            }
        }
        // bf16 activations take _nvfp4_compute_scale_factor's copies while loading, which
        // are freed: the same tensors stay.
        let bf = tempfile::tempdir().unwrap();
        gen_tiny(bf.path(), &["--nvfp4", flavor, "--dtype", "bf16"]);
        let b = profile_json_under(bf.path(), "sim:h100-80gb:dry", "0.19");
        let c = profile_json_under(bf.path(), "sim:h100-80gb:compute", "0.19");
        assert_eq!(b["weights_tensor_bytes"], 1_108_848, "{flavor} bf16");
        assert_eq!(
            b["checkpoints"]["t1"]["allocated_peak"], c["checkpoints"]["t1"]["allocated_peak"],
            "{flavor} bf16"
        );
    }
}

/// CPU logits: both tools' checkpoints hold the same codes and scales (one the other's
/// global scale inverted), so their logits agree to the global scale's last bit, and both
/// sit within 4-bit e2m1's error of the 16-bit model (measured relative L2 printed).
#[test]
fn nvfp4_logits_agree_across_tools_and_are_near_the_16_bit_models() {
    let tmp = tempfile::tempdir().unwrap();
    let base = bench_logits("preset:tiny", DEVICE, tmp.path(), "f16");
    let (ct, mo) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    gen_tiny(ct.path(), &["--nvfp4", "ct"]);
    gen_tiny(mo.path(), &["--nvfp4", "modelopt"]);
    let a = bench_logits(ct.path().to_str().unwrap(), DEVICE, tmp.path(), "ct");
    let b = bench_logits(mo.path().to_str().unwrap(), DEVICE, tmp.path(), "mo");
    let between = rel_l2(&a, &b);
    let d = rel_l2(&base, &a);
    println!("NVFP4 vs fp16: relative L2 {d:.4}; compressed-tensors vs ModelOpt {between:.2e}");
    assert!(between < 2e-3, "{between}");
    assert!(d > 0.0 && d < 0.3, "{d}");
}

/// The profile of a checkpoint: exit code and stderr's one line.
fn refused(dir: &Path, vllm: &str, device: &str) -> (Option<i32>, String) {
    let out = vramscope(&[
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
    ]);
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    (out.status.code(), err)
}

/// Releases, GPUs and configs not modelled, and bad files: one line each, naming the file
/// or the setting.
#[test]
fn nvfp4_refusals_are_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    gen_tiny(dir.path(), &["--nvfp4", "ct"]);
    let (code, e) = refused(dir.path(), "0.21", "sim:h100-80gb:dry");
    assert_eq!(code, Some(2));
    assert!(
        e.contains("--vllm 0.21") && e.contains("use --vllm 0.19"),
        "{e}"
    );
    let (_, e) = refused(dir.path(), "0.19", "sim:b200:dry");
    assert!(e.contains("Blackwell") && e.contains("CUTLASS"), "{e}");
    // Config: weight-only NVFP4, group size 32, a KV cache scheme.
    let cfg_path = dir.path().join("config.json");
    let orig: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    type Patch = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Patch)> = vec![
        (
            "weight-only NVFP4",
            Box::new(|q| {
                q["config_groups"]["group_0"]["input_activations"] = serde_json::Value::Null
            }),
        ),
        (
            "group_size 32",
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["group_size"] = 32.into()),
        ),
        (
            "kv_cache_scheme",
            Box::new(|q| {
                q["kv_cache_scheme"] = serde_json::json!({"num_bits": 8, "type": "float"})
            }),
        ),
        (
            "lists \"re:.*down_proj\"",
            Box::new(|q| q["ignore"] = serde_json::json!(["lm_head", "re:.*down_proj"])),
        ),
    ];
    for (want, f) in cases {
        let mut j = orig.clone();
        f(&mut j["quantization_config"]);
        std::fs::write(&cfg_path, serde_json::to_vec(&j).unwrap()).unwrap();
        let (code, e) = refused(dir.path(), "0.19", "sim:h100-80gb:dry");
        assert_eq!(code, Some(2), "{want}");
        assert!(e.contains(want) && e.contains("config.json"), "{want}: {e}");
    }
    std::fs::write(&cfg_path, serde_json::to_vec(&orig).unwrap()).unwrap();
    // A negative block scale (fp8 sign bit) and a NaN global scale, naming the tensor.
    let st = dir.path().join("model.safetensors");
    let clean = std::fs::read(&st).unwrap();
    let h = header(dir.path());
    let n = u64::from_le_bytes(clean[..8].try_into().unwrap()) as usize;
    let at = |name: &str| 8 + n + h[name]["data_offsets"][0].as_u64().unwrap() as usize;
    let mut bad = clean.clone();
    bad[at("model.layers.1.self_attn.o_proj.weight_scale") + 3] |= 0x80;
    std::fs::write(&st, &bad).unwrap();
    let (_, e) = refused(dir.path(), "0.19", "sim:h100-80gb:dry");
    assert!(
        e.contains("model.layers.1.self_attn.o_proj.weight_scale[0, 3]")
            && e.contains("not negative"),
        "{e}"
    );
    let mut bad = clean.clone();
    let g = at("model.layers.2.mlp.up_proj.weight_global_scale");
    bad[g..g + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&st, &bad).unwrap();
    let (_, e) = refused(dir.path(), "0.19", "sim:h100-80gb:dry");
    assert!(
        e.contains("up_proj.weight_global_scale is NaN") && e.contains("model.safetensors"),
        "{e}"
    );
    // ModelOpt: FP8 and an FP8 KV cache named.
    let mo = tempfile::tempdir().unwrap();
    gen_tiny(mo.path(), &["--nvfp4", "modelopt"]);
    let hq = mo.path().join("hf_quant_config.json");
    let orig: serde_json::Value = serde_json::from_slice(&std::fs::read(&hq).unwrap()).unwrap();
    for (key, value, want) in [
        ("quant_algo", serde_json::json!("FP8_PB_WO"), "'FP8_PB_WO'"),
        (
            "kv_cache_quant_algo",
            serde_json::json!("FP8"),
            "ModelOptFp8KVCacheMethod",
        ),
        ("group_size", serde_json::json!(32), "group_size is 32"),
    ] {
        let mut j = orig.clone();
        j["quantization"][key] = value;
        std::fs::write(&hq, serde_json::to_vec(&j).unwrap()).unwrap();
        let (code, e) = refused(mo.path(), "0.19", "sim:h100-80gb:dry");
        assert_eq!(code, Some(2));
        assert!(e.contains(want), "{want}: {e}");
    }
    let mut j = orig.clone();
    j["quantization"]
        .as_object_mut()
        .unwrap()
        .remove("exclude_modules");
    std::fs::write(&hq, serde_json::to_vec(&j).unwrap()).unwrap();
    let (_, e) = refused(mo.path(), "0.19", "sim:h100-80gb:dry");
    assert!(e.contains("lacks exclude_modules"), "{e}");
    std::fs::write(&hq, serde_json::to_vec(&orig).unwrap()).unwrap();
    let (_, e) = refused(mo.path(), "0.15", "sim:h100-80gb:dry");
    assert!(
        e.contains("flashinfer-cutlass") && e.contains("use --vllm 0.19"),
        "{e}"
    );
}

/// Llama-3.1-8B-Instruct's config.json with the quantization_config LLM Compressor writes for
/// its NVFP4 scheme (RedHatAI's `…-NVFP4`: weights and activations NVFP4, the lm_head
/// ignored).
const LLAMA31_8B_NVFP4: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
 "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
 "max_position_embeddings": 131072, "rope_theta": 500000.0,
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
 "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,
 "quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
   "quantization_status": "compressed", "global_compression_ratio": null,
   "kv_cache_scheme": null, "ignore": ["lm_head"], "sparsity_config": {},
   "config_groups": {"group_0": {"targets": ["Linear"], "output_activations": null,
     "format": "nvfp4-pack-quantized",
     "input_activations": {"num_bits": 4, "type": "float", "symmetric": true,
       "group_size": 16, "strategy": "tensor_group", "dynamic": "local",
       "observer": "minmax", "observer_kwargs": {}, "actorder": null, "block_structure": null},
     "weights": {"num_bits": 4, "type": "float", "symmetric": true, "group_size": 16,
       "strategy": "tensor_group", "dynamic": false, "observer": "minmax",
       "observer_kwargs": {}, "actorder": null, "block_structure": null}}}}}"#;

fn profile_8b(dir: &Path, device: &str) -> (Option<i32>, String, Option<serde_json::Value>) {
    let json = dir.join("r.json");
    let out = vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.to_str().unwrap(),
        "--vllm",
        "0.19",
        "--device",
        device,
        "--max-model-len",
        "8192",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let r = std::fs::read(&json)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap());
    (out.status.code(), err, r)
}

/// The published Llama-3.1-8B NVFP4 shape, from its config alone, under 0.19 on an H100
/// (132 SMs, bf16). After loading, by tensor (derived by hand from
/// compressed_tensors_w4a4_nvfp4.py L88-111 and marlin_utils_fp4.py L203-283 at 0.19.0):
///
/// - per layer, each stacked linear `[n, k]`: the repacked words n·k/2, the Marlin fp8
///   scales n·k/16, four 0-dim f32 = 16, the workspace 132 × 4 = 528: qkv (6144 × 4096)
///   12,582,912 + 1,572,864; o (4096²) 8,388,608 + 1,048,576; gate_up (28672 × 4096)
///   58,720,256 + 7,340,032; down (4096 × 14336) 29,360,128 + 3,670,016; = 122,683,392,
///   + 4 × 544 = 2,176, + two norms 16,384: 122,701,952 a layer, 3,926,462,464 for 32;
/// - the embedding and lm_head (ignored: bf16) 2,101,346,304, the final norm 8,192;
/// - the rotary cache 131072 × 128 × 2 = 33,554,432 and seven 0-dim f32 a layer 896:
///
/// 6,061,372,288 bytes. The checkpoint itself stores 6,027,749,120 bytes (per layer, seven
/// linears' U8 codes n·k/2, F8 scales n·k/16 and two F32 `[1]` scales: 122,683,448, two
/// norms; the embedding, lm_head and final norm).
#[test]
fn llama31_8b_nvfp4_weighs_by_hand_on_an_h100() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), LLAMA31_8B_NVFP4).unwrap();
    let (code, err, r) = profile_8b(dir.path(), "sim:h100-80gb:dry");
    assert_eq!(code, Some(0), "{err}");
    let r = r.unwrap();
    assert_eq!(r["weights_tensor_bytes"].as_u64().unwrap(), 6_061_372_288);
    println!(
        "Llama-3.1-8B NVFP4, 0.19 on an H100: weights {} B of blocks",
        r["weights_bytes"]
    );
    let (h, i, layers) = (4096u64, 14336u64, 32u64);
    let linears = [(h, h), (1024, h), (1024, h), (h, h), (i, h), (i, h), (h, i)];
    let per_layer: u64 = linears
        .iter()
        .map(|&(n, k)| n * k / 2 + n * k / 16 + 8)
        .sum();
    assert_eq!(per_layer, 122_683_448);
    let stored = layers * (per_layer + 2 * h * 2) + 2 * 128_256 * h * 2 + h * 2;
    assert_eq!(stored, 6_027_749_120);
    // nvidia's ModelOpt checkpoints state an FP8 KV cache in hf_quant_config.json: named.
    let mo = tempfile::tempdir().unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(LLAMA31_8B_NVFP4).unwrap();
    cfg.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(mo.path().join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(
        mo.path().join("hf_quant_config.json"),
        r#"{"producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                             "group_size": 16, "exclude_modules": ["lm_head"]}}"#,
    )
    .unwrap();
    let (code, err, _) = profile_8b(mo.path(), "sim:h100-80gb:dry");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("kv_cache_quant_algo is \"FP8\"") && err.contains("ModelOptFp8KVCacheMethod"),
        "{err}"
    );
    // Without it, the same shape weighs the same.
    std::fs::write(
        mo.path().join("hf_quant_config.json"),
        r#"{"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null,
                             "group_size": 16, "exclude_modules": ["lm_head"]}}"#,
    )
    .unwrap();
    let (code, err, r) = profile_8b(mo.path(), "sim:h100-80gb:dry");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        r.unwrap()["weights_tensor_bytes"].as_u64().unwrap(),
        6_061_372_288
    );
}

/// Writes the checkpoint scripts/nvfp4_reference.py reads (set VRAMSCOPE_NVFP4_FIXTURE to a
/// directory; `ct` and `modelopt` are written under it): the same files the reference test
/// makes in its temporary directory (seed 0).
#[test]
#[ignore]
fn write_fixture() {
    let root = std::path::PathBuf::from(std::env::var("VRAMSCOPE_NVFP4_FIXTURE").unwrap());
    gen_tiny(&root.join("ct"), &["--nvfp4", "ct"]);
    gen_tiny(&root.join("modelopt"), &["--nvfp4", "modelopt"]);
}

/// Last-token logits at ids 3, 11, ..., 1019 of tiny's 16-token dummy sequence, from the
/// compressed-tensors checkpoint `gen-model tiny DIR --nvfp4 ct` writes:
/// `python3 scripts/nvfp4_reference.py DIR` (the format's dequantization, then transformers
/// 5.17's LlamaForCausalLM in float32 under PyTorch 2.11 on an H100, docs/gpu-runs.md run 80;
/// the ModelOpt checkpoint gives the same, and the `--pure` plain-Python mode in float64
/// agrees with it).
const REFERENCE: [f64; 128] = [
    -5.030063987e-01,
    1.765199751e-02,
    4.506826401e-03,
    3.697550595e-01,
    2.037792653e-02,
    6.658052560e-03,
    -2.020505071e-01,
    1.371481270e-01,
    -1.987713762e-02,
    -8.788442239e-03,
    1.455604434e-01,
    -1.782616824e-01,
    2.901087999e-01,
    -3.718588054e-01,
    -1.286475658e-01,
    3.380568624e-01,
    -7.382516563e-02,
    -2.951568067e-01,
    -7.408574224e-02,
    -1.756853983e-02,
    -2.388100922e-01,
    -3.088624962e-02,
    -2.062409073e-01,
    -9.225846827e-02,
    9.887729585e-02,
    5.083299279e-01,
    -4.208347797e-01,
    2.866156027e-02,
    4.130990058e-02,
    -2.777377963e-01,
    -3.074070513e-01,
    2.300940603e-01,
    9.202234796e-04,
    4.146734476e-01,
    -3.152649403e-01,
    8.388648927e-02,
    3.030634820e-01,
    2.754337192e-01,
    2.080919966e-02,
    -1.833252311e-01,
    -6.580139697e-02,
    -3.127616346e-01,
    -1.338324696e-01,
    -5.446369573e-02,
    -3.098510802e-01,
    -1.164164916e-01,
    6.804107875e-02,
    1.474583447e-01,
    -2.274728715e-01,
    1.212604903e-02,
    5.328728259e-02,
    -1.555636376e-01,
    1.028336883e-01,
    -2.324644476e-02,
    4.220397025e-02,
    -5.274747610e-01,
    1.758534908e-01,
    3.253231943e-01,
    1.655753404e-01,
    -1.554626822e-01,
    -9.259835631e-02,
    1.027847007e-01,
    3.160511330e-02,
    -2.045579106e-01,
    -3.708460331e-01,
    1.411853433e-01,
    -1.191594973e-01,
    5.201987550e-02,
    -1.779496819e-01,
    -1.171732321e-01,
    2.648901343e-01,
    -5.036926270e-01,
    4.869284630e-01,
    3.645361662e-01,
    4.750492051e-02,
    3.602573276e-01,
    -8.624078333e-02,
    6.126705930e-02,
    9.683825821e-02,
    1.278610826e-01,
    -2.103138864e-01,
    -2.544937134e-01,
    -1.571491919e-02,
    -1.123230904e-01,
    -1.122164130e-01,
    1.792977452e-01,
    -3.308808208e-01,
    2.796457112e-01,
    6.995912641e-02,
    -2.419968843e-01,
    1.184382383e-02,
    1.412223577e-01,
    1.326573044e-01,
    1.120207384e-01,
    2.432656102e-02,
    -2.165940553e-01,
    -1.099260300e-01,
    -3.897876441e-01,
    -1.149158701e-01,
    -5.533188209e-02,
    7.363685966e-02,
    1.488516182e-01,
    -5.315854549e-01,
    2.498538494e-01,
    1.783140600e-01,
    1.158416942e-01,
    4.699276388e-01,
    -1.799813360e-01,
    3.248083591e-02,
    2.894367874e-01,
    -1.228645295e-01,
    -4.308767617e-01,
    7.464546710e-02,
    -2.125107050e-01,
    4.047608972e-01,
    1.065299958e-01,
    -1.865925938e-01,
    -1.072026491e-01,
    8.507498354e-02,
    -4.882169887e-02,
    -2.243417501e-01,
    3.038588539e-02,
    1.330059469e-01,
    1.552104205e-01,
    1.055555069e-03,
    -3.170329630e-01,
    4.470684528e-01,
    -2.438746206e-02,
];

/// vramscope's CPU forward (Marlin's w4a16 math: each code times its block scale in fp16, f32
/// accumulation, the global scale on the product) against the reference: relative L2 3.2e-4,
/// fp16 activations' error (the bound 2e-3 is fp16's, far below NVFP4's 0.21 from the
/// 16-bit model).
#[test]
fn nvfp4_cpu_logits_match_the_reference() {
    for flavor in ["ct", "modelopt"] {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), &["--nvfp4", flavor]);
        let json = dir.path().join("b.json");
        ok(&vramscope(&[
            "bench",
            "--model",
            dir.path().to_str().unwrap(),
            "--quant",
            "fp16",
            "--device",
            "sim:a100-80gb:compute",
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
        let ours: Vec<f64> = (3..1024)
            .step_by(8)
            .map(|i| logits[i].as_f64().unwrap())
            .collect();
        let e = rel_l2(&REFERENCE, &ours);
        println!("{flavor}: CPU logits against the reference, relative L2 {e:.2e}");
        assert!(e < 2e-3, "{flavor}: {e}");
    }
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
    run("vramscope gen-model tiny ./tiny-nvfp4 --nvfp4 ct");
    let text = run("vramscope profile --model ./tiny-nvfp4 --vllm 0.19 --device sim:h100-80gb:dry");
    assert!(text.contains("weights"), "{text}");
}

/// `--quantization` in a pasted `vllm serve` line: modelopt_fp4 runs a ModelOpt checkpoint
/// (vLLM's override turns "modelopt" NVFP4 into it), is the mismatch vLLM raises on a
/// compressed-tensors one, and "Cannot find the config file" on a 16-bit one.
#[test]
fn quantization_modelopt_fp4_in_a_pasted_line() {
    let plan = |dir: &Path, method: &str| {
        let out = vramscope(&[
            "plan",
            "--vllm",
            "0.19",
            "--device",
            "sim:h100-80gb",
            "--",
            "vllm",
            "serve",
            dir.to_str().unwrap(),
            "--quantization",
            method,
            "--max-model-len",
            "256",
        ]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (mo, ct, f16) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    gen_tiny(mo.path(), &["--nvfp4", "modelopt"]);
    gen_tiny(ct.path(), &["--nvfp4", "ct"]);
    gen_tiny(f16.path(), &[]);
    for m in ["modelopt_fp4", "modelopt"] {
        let (code, text) = plan(mo.path(), m);
        assert_eq!(code, Some(0), "{m}: {text}");
    }
    let (code, text) = plan(ct.path(), "compressed-tensors");
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = plan(ct.path(), "modelopt_fp4");
    assert_eq!(code, Some(2));
    assert!(text.contains("does not match"), "{text}");
    let (code, text) = plan(f16.path(), "modelopt_fp4");
    assert_eq!(code, Some(2));
    assert!(
        text.contains("hf_quant_config.json")
            && text.contains("Cannot find the config file for modelopt_fp4"),
        "{text}"
    );
}

/// compressed-tensors NVFP4 under 0.11 and 0.15 (`CompressedTensorsW4A16Fp4` on Marlin):
/// each stacked linear keeps a 16-bit `weight_scale_2` (2 bytes) and its `[shards]` f32
/// input scales (qkv 12, o 4, gate_up 8, down 4) instead of 0.19's four 0-dim f32 (64 a
/// layer): 4 × (64 − 36) = 112 bytes fewer than on the H100 under 0.19, less the L40S's
/// 142 SMs' 40 more bytes of workspace a linear: 1,108,736 + 640; dry = compute, fp16 and
/// bf16.
#[test]
fn ct_nvfp4_under_0_11_and_0_15_keeps_a_16_bit_global_scale() {
    for dtype in ["f16", "bf16"] {
        let dir = tempfile::tempdir().unwrap();
        gen_tiny(dir.path(), &["--nvfp4", "ct", "--dtype", dtype]);
        for vllm in ["0.11", "0.15"] {
            let dry = profile_json_under(dir.path(), "sim:l40s:dry", vllm);
            let cpu = profile_json_under(dir.path(), "sim:l40s:compute", vllm);
            assert_eq!(
                dry["weights_tensor_bytes"],
                1_108_736 + 16 * 40,
                "{dtype} {vllm}"
            );
            for t in ["t1", "t2", "t3"] {
                for key in ["allocated", "allocated_peak", "reserved"] {
                    assert_eq!(
                        dry["checkpoints"][t][key], cpu["checkpoints"][t][key],
                        "{dtype} {vllm} {t} {key}"
                    );
                }
            }
        }
    }
}

//! compressed-tensors `pack-quantized` W4A16 checkpoints (LLM Compressor's W4A16 scheme,
//! RedHatAI's `…-quantized.w4a16`) as vLLM's `CompressedTensorsWNA16` runs them under the V1
//! releases: `choose_mp_linear_kernel` picks Marlin on Ampere and Ada (Machete first on
//! Hopper, modelled: tests/machete.rs), `MarlinLinearKernel` repacks `weight_packed` after
//! transposing it. `gen-model --ct-w4a16` checkpoints against `--gptq` ones of the same weights, the
//! dequantized weights against compressed-tensors' own unpacking, a published checkpoint's
//! shape planned through the binary, and what is refused.

mod common;

use common::cli::{
    bench_logits, gen_tiny as gen, ok, profile_json_under as profile_under, rel_l2, vramscope,
};

/// The simulated GPU the logits are computed on.
const DEVICE: &str = "sim:a100-80gb:compute";
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::runtime::Runtime;
use vramscope::engine::tensor::DType;
use vramscope::model::llama::{LlamaModel, LoadOptions, Mlp};
use vramscope::model::{self, ModelSource};
use vramscope::quant::int8::TileLayout;
use vramscope::quant::marlin::MarlinLinear;
use vramscope::quant::{FusedLinear, Linear, Quant};

/// The tensors of a `model.safetensors`: name → (dtype, shape, bytes).
fn tensors(dir: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                format!("{:?}", v.dtype()),
                v.shape().to_vec(),
                v.data().to_vec(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn find<'a>(
    t: &'a [(String, String, Vec<usize>, Vec<u8>)],
    name: &str,
) -> &'a (String, String, Vec<usize>, Vec<u8>) {
    t.iter()
        .find(|x| x.0 == name)
        .unwrap_or_else(|| panic!("no {name}"))
}

fn words(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `gen-model --ct-w4a16` writes what LLM Compressor writes: per linear `weight_packed` I32
/// `[n, k/8]`, `weight_scale` F16 `[n, k/group]`, `weight_shape` I64 `[2]` = `[n, k]`, no zero
/// point (symmetric), `weight_g_idx` I32 `[k]` under act-order "group"; the config names the
/// scheme. Its codes and scales are `--gptq`'s of the same weights (both quantize
/// symmetric int4 round-to-nearest at `max |w| / 7.5`, stored `q + 8`), transposed: `qweight
/// [k/8, n]` word `(j, c)` is `weight_packed [n, k/8]` word `(c, j)` (eight inputs a word,
/// input `8j + i` at bits `4i`, compressed-tensors' `pack_to_int32`).
#[test]
fn gen_model_ct_w4a16_stores_gptq_codes_in_compressed_tensors_layout() {
    for (flags, gptq_flags) in [
        (
            &["--ct-w4a16", "--group-size", "32"][..],
            &["--gptq", "--group-size", "32"][..],
        ),
        (
            &["--ct-w4a16", "--group-size", "64", "--desc-act"][..],
            &["--gptq", "--group-size", "64", "--desc-act"][..],
        ),
    ] {
        let (ct_dir, gq_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        gen(ct_dir.path(), flags);
        gen(gq_dir.path(), gptq_flags);
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(ct_dir.path().join("config.json")).unwrap())
                .unwrap();
        let q = &cfg["quantization_config"];
        assert_eq!(q["quant_method"], "compressed-tensors");
        assert_eq!(q["format"], "pack-quantized");
        let w = &q["config_groups"]["group_0"]["weights"];
        assert_eq!(w["num_bits"], 4);
        assert_eq!(w["type"], "int");
        assert_eq!(w["symmetric"], true);
        assert_eq!(w["strategy"], "group");
        let desc_act = flags.contains(&"--desc-act");
        assert_eq!(
            w["actorder"],
            if desc_act {
                "group".into()
            } else {
                serde_json::Value::Null
            }
        );
        assert!(q["config_groups"]["group_0"]["input_activations"].is_null());
        let (ct, gq) = (tensors(ct_dir.path()), tensors(gq_dir.path()));
        let tiny = vramscope::model::presets::preset("tiny").unwrap();
        let g: usize = w["group_size"].as_u64().unwrap() as usize;
        for (name, shape) in tiny.tensor_shapes() {
            let base = name.trim_end_matches(".weight");
            if !(name.starts_with("model.layers.") && name.ends_with("_proj.weight")) {
                assert_eq!(find(&ct, &name).3, find(&gq, &name).3, "{name}");
                continue;
            }
            let (n, k) = (shape[0], shape[1]);
            let wp = find(&ct, &format!("{base}.weight_packed"));
            assert_eq!((wp.1.as_str(), wp.2.clone()), ("I32", vec![n, k / 8]));
            let ws = find(&ct, &format!("{base}.weight_scale"));
            assert_eq!((ws.1.as_str(), ws.2.clone()), ("F16", vec![n, k / g]));
            let sh = find(&ct, &format!("{base}.weight_shape"));
            assert_eq!((sh.1.as_str(), sh.2.clone()), ("I64", vec![2]));
            let dims: Vec<i64> =
                sh.3.chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect();
            assert_eq!(dims, [n as i64, k as i64]);
            assert!(!ct
                .iter()
                .any(|t| t.0 == format!("{base}.weight_zero_point")));
            let packed = words(&wp.3);
            let qweight = words(&find(&gq, &format!("{base}.qweight")).3);
            for c in 0..n {
                for j in 0..k / 8 {
                    assert_eq!(
                        packed[c * (k / 8) + j],
                        qweight[j * n + c],
                        "{base} {c} {j}"
                    );
                }
            }
            let scales = find(&gq, &format!("{base}.scales")).3.clone();
            for c in 0..n {
                for grp in 0..k / g {
                    let at = |b: &[u8], i: usize| [b[2 * i], b[2 * i + 1]];
                    assert_eq!(
                        at(&ws.3, c * (k / g) + grp),
                        at(&scales, grp * n + c),
                        "{base}"
                    );
                }
            }
            let gi = ct.iter().find(|t| t.0 == format!("{base}.weight_g_idx"));
            assert_eq!(gi.is_some(), desc_act, "{base}");
            if let Some(gi) = gi {
                assert_eq!(gi.3, find(&gq, &format!("{base}.g_idx")).3, "{base}");
            }
        }
        // inspect counts the codes as parameters (8 an int32), not scales, shapes or g_idx.
        let i = model::inspect(ct_dir.path()).unwrap();
        assert_eq!(i.parameters, tiny.param_count(), "{flags:?}");
        // 4 layers × 7 linears, an I64 [2] `weight_shape` each: 16 bytes.
        assert!(
            i.by_dtype
                .iter()
                .any(|(d, c, b)| d == "I64" && *c == 28 && *b == 448),
            "{:?}",
            i.by_dtype
        );
    }
}

/// Dry and compute runs allocate alike under 0.11, 0.15 and 0.19 on an L40S (Ada: Marlin).
/// Against the `--gptq` checkpoint of the same weights, after loading vLLM holds the same
/// repacked `[k/16, 2n]` words, permuted scales, workspace (and under act-order the sorted
/// g_idx and its sort indices): GPTQ's `qzeros` and unsorted `g_idx` are dropped for empty
/// tensors, compressed-tensors' symmetric scheme never has them. What differs is
/// `weight_shape` (I64 `[2]`, 16 bytes, which nothing drops): 4 layers × 4 stacked linears ×
/// 16 = 256 bytes of tensors, 16 blocks of 512 in the allocator. The allocator's blocks
/// otherwise differ only where the loading order differs (`zeros_args`' transient
/// `torch.zeros`, the `.contiguous()` copies of the transposed `weight_packed` and
/// `weight_scale`).
#[test]
fn ct_w4a16_profiles_dry_and_compute_alike_and_holds_gptqs_marlin_tensors() {
    for (flags, gptq_flags, vllm) in [
        (
            &["--ct-w4a16", "--group-size", "32"][..],
            &["--gptq", "--group-size", "32"][..],
            "0.19",
        ),
        (
            &["--ct-w4a16", "--group-size", "32"][..],
            &["--gptq", "--group-size", "32"][..],
            "0.11",
        ),
        (
            &["--ct-w4a16", "--group-size", "64", "--desc-act"][..],
            &["--gptq", "--group-size", "64", "--desc-act"][..],
            "0.15",
        ),
    ] {
        let (ct_dir, gq_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        gen(ct_dir.path(), flags);
        gen(gq_dir.path(), gptq_flags);
        let dry = profile_under(ct_dir.path(), "sim:l40s:dry", vllm);
        let cpu = profile_under(ct_dir.path(), "sim:l40s:compute", vllm);
        for key in ["weights_bytes", "weights_tensor_bytes", "truth"] {
            assert_eq!(dry[key], cpu[key], "{flags:?} {vllm} {key}");
        }
        for t in ["t0", "t1", "t2", "t3"] {
            for key in ["allocated", "allocated_peak", "reserved", "free"] {
                assert_eq!(
                    dry["checkpoints"][t][key], cpu["checkpoints"][t][key],
                    "{flags:?} {vllm} {t} {key}"
                );
            }
        }
        let gq = profile_under(gq_dir.path(), "sim:l40s:dry", vllm);
        let tensor_bytes = |r: &serde_json::Value| r["weights_tensor_bytes"].as_u64().unwrap();
        assert_eq!(
            tensor_bytes(&dry),
            tensor_bytes(&gq) + 4 * 4 * 16,
            "{flags:?} {vllm}"
        );
        // Here the blocks differ by exactly those sixteen 512-byte blocks.
        assert_eq!(
            dry["weights_bytes"].as_u64().unwrap(),
            gq["weights_bytes"].as_u64().unwrap() + 16 * 512,
            "{flags:?} {vllm}"
        );
        println!(
            "{flags:?} {vllm}: weights {} B (GPTQ {} B), tensors {} B (GPTQ {} B)",
            dry["weights_bytes"],
            gq["weights_bytes"],
            tensor_bytes(&dry),
            tensor_bytes(&gq)
        );
    }
}

/// CPU logits: the W4A16 checkpoint runs the same codes and scales as the GPTQ one (equal
/// logits), and sits within 4-bit round-to-nearest's error of the 16-bit model: measured
/// relative L2 0.1856 (groups of 32), where AWQ groups of 64 gives 0.1997 and GPTQ act-order
/// groups of 32 0.2011 (tests/awq_gptq.rs).
#[test]
fn ct_w4a16_logits_equal_gptqs_and_are_near_the_16_bit_models() {
    let tmp = tempfile::tempdir().unwrap();
    let base = bench_logits("preset:tiny", DEVICE, tmp.path(), "f16");
    let (ct_dir, gq_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    gen(ct_dir.path(), &["--ct-w4a16", "--group-size", "32"]);
    gen(gq_dir.path(), &["--gptq", "--group-size", "32"]);
    let ct = bench_logits(ct_dir.path().to_str().unwrap(), DEVICE, tmp.path(), "ct");
    let gq = bench_logits(gq_dir.path().to_str().unwrap(), DEVICE, tmp.path(), "gq");
    assert_eq!(ct, gq);
    let d = rel_l2(&base, &ct);
    println!("compressed-tensors w4a16 g32 vs fp16: relative L2 {d:.4}");
    assert!(d > 0.0 && d < 0.2, "{d}");
}

fn marlin_of_fused(f: &FusedLinear) -> (&MarlinLinear, &[usize]) {
    match f {
        FusedLinear::Marlin { linear, rows } => (linear, rows),
        _ => panic!("not a Marlin layer"),
    }
}

fn marlin_of(l: &Linear) -> &MarlinLinear {
    match l {
        Linear::Marlin(l) => l,
        _ => panic!("not a Marlin layer"),
    }
}

/// compressed-tensors' own dequantization, written from its definition rather than
/// vramscope's: `unpack_from_int32` takes nibble `i` of word `(c, j)` of `weight_packed` as
/// input `8j + i` of output `c`, shifts it back by 8 (signed int4), and the weight is that
/// times `weight_scale[c, group]`, the group `weight_g_idx[i]` under act-order, `i / group`
/// otherwise; then rounded to fp16 as Marlin's half multiply takes it.
fn reference(
    st: &[(String, String, Vec<usize>, Vec<u8>)],
    base: &str,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let packed = words(&find(st, &format!("{base}.weight_packed")).3);
    let ws = find(st, &format!("{base}.weight_scale"));
    let groups = ws.2[1];
    let scales: Vec<f32> =
        ws.3.chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
    let g_idx = st
        .iter()
        .find(|t| t.0 == format!("{base}.weight_g_idx"))
        .map(|t| words(&t.3));
    let mut w = vec![0f32; n * k];
    for c in 0..n {
        for i in 0..k {
            let word = packed[c * (k / 8) + i / 8] as u32;
            let q = ((word >> (4 * (i % 8))) & 0xF) as i32 - 8;
            let grp = g_idx.as_ref().map_or(i / (k / groups), |g| g[i] as usize);
            let v = q as f32 * scales[c * groups + grp];
            w[c * k + i] = half::f16::from_f32(v).to_f32();
        }
    }
    w
}

/// Every stacked layer of the loaded model, dequantized as the forward uses it, equals
/// compressed-tensors' unpacking of the stored tensors, shard by shard, value by value.
#[test]
fn ct_w4a16_dequantizes_as_compressed_tensors_unpacks() {
    for flags in [
        &["--ct-w4a16", "--group-size", "32"][..],
        &["--ct-w4a16", "--group-size", "64", "--desc-act"][..],
        &["--ct-w4a16", "--group-size", "-1"][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        gen(dir.path(), flags);
        let st = tensors(dir.path());
        let opened = model::open(
            &ModelSource::Path {
                path: dir.path().to_path_buf(),
            },
            0,
        )
        .unwrap();
        let spec = DeviceSpec::parse("sim:a100-80gb:compute").unwrap();
        let rt = Runtime::new(
            Device::open(&spec).unwrap(),
            Arc::new(AtomicBool::new(false)),
            None,
        );
        let opts = LoadOptions {
            quant: Quant::F16,
            int8_threshold: 0.0,
            int8_layout: TileLayout {
                row_pad: 8,
                col_pad: 32,
            },
            attn_scalars: 0,
            marlin: Default::default(),
        };
        let m = LlamaModel::load(&rt, &opened.config, opened.source.as_ref(), &opts).unwrap();
        let mut checked = 0;
        for (l, layer) in m.layers.iter().enumerate() {
            let Mlp::Dense { gate_up, down } = &layer.mlp else {
                panic!("layer {l} is not dense")
            };
            let (qkv, qkv_rows) = marlin_of_fused(&layer.attn.qkv);
            let (gu, gu_rows) = marlin_of_fused(gate_up);
            let o = marlin_of(&layer.attn.o);
            let d = marlin_of(down);
            let stacks: [(&MarlinLinear, Vec<usize>, Vec<String>); 4] = [
                (
                    qkv,
                    qkv_rows.to_vec(),
                    ["q_proj", "k_proj", "v_proj"]
                        .map(|s| format!("model.layers.{l}.self_attn.{s}"))
                        .to_vec(),
                ),
                (
                    o,
                    vec![o.out_features],
                    vec![format!("model.layers.{l}.self_attn.o_proj")],
                ),
                (
                    gu,
                    gu_rows.to_vec(),
                    ["gate_proj", "up_proj"]
                        .map(|s| format!("model.layers.{l}.mlp.{s}"))
                        .to_vec(),
                ),
                (
                    d,
                    vec![d.out_features],
                    vec![format!("model.layers.{l}.mlp.down_proj")],
                ),
            ];
            for (lin, rows, names) in stacks {
                let w = lin.dequantized(DType::F16);
                let k = lin.in_features;
                let mut r0 = 0;
                for (n, base) in rows.iter().zip(&names) {
                    let want = reference(&st, base, *n, k);
                    assert_eq!(&w[r0 * k..(r0 + n) * k], &want[..], "{flags:?} {base}");
                    r0 += n;
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 4 * 7, "{flags:?}");
    }
}

/// RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16's config.json (the keys vramscope
/// reads, and the quantization_config as LLM Compressor writes it: int4 symmetric groups of
/// 128, the lm_head ignored; the model card: "Symmetric per-group quantization ... group of
/// 128 parameters").
const LLAMA31_8B_W4A16: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
 "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
 "max_position_embeddings": 131072, "rope_theta": 500000.0,
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
 "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,
 "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
   "quantization_status": "compressed", "global_compression_ratio": null,
   "kv_cache_scheme": null, "ignore": ["lm_head"],
   "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
     "output_activations": null,
     "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
       "group_size": 128, "dynamic": false, "actorder": null, "observer": "minmax",
       "observer_kwargs": {}, "block_structure": null}}}}}"#;

/// `vramscope plan --vllm V --device D --json J -- vllm serve DIR --max-model-len 8192`.
fn plan(vllm: &str, device: &str) -> (Option<i32>, String, Option<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), LLAMA31_8B_W4A16).unwrap();
    let json = dir.path().join("plan.json");
    let model = dir.path().display().to_string();
    let out = vramscope(&[
        "plan",
        "--vllm",
        vllm,
        "--device",
        device,
        "--json",
        json.to_str().unwrap(),
        "--",
        "vllm",
        "serve",
        &model,
        "--max-model-len",
        "8192",
    ]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let r = std::fs::read(&json)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap());
    (out.status.code(), text, r)
}

/// The published Llama-3.1-8B w4a16 shape planned through the binary. After loading, vLLM
/// 0.19 on an L40S (142 SMs) holds, by tensor (derived by hand from
/// compressed_tensors_wNa16.py L139-217 and mixed_precision/marlin.py L67-168 at 0.19.0):
///
/// - per layer, each stacked linear `[n, k]`: the repacked words `[k/16, 2n]` I32 = `n·k/2`
///   bytes, the permuted scales `[k/128, n]` bf16 = `n·k/64`, the workspace 142 I32 = 568,
///   `weight_shape` 16: qkv (6144 × 4096) 12,582,912 + 393,216; o (4096 × 4096) 8,388,608 +
///   262,144; gate_up (28672 × 4096) 58,720,256 + 1,835,008; down (4096 × 14336)
///   29,360,128 + 917,504; = 112,459,776, + 4 × (568 + 16) = 2,336, + two RMSNorm weights
///   2 × 8,192: 112,478,496 a layer, 3,599,311,872 for 32;
/// - the embedding and the lm_head (ignored: bf16) 2 × 128256 × 4096 × 2 = 2,101,346,304,
///   the final norm 8,192;
/// - the rotary cos/sin cache 131072 × 128 × 2 = 33,554,432 and 0.19's seven 0-dim f32
///   attention scales a layer 7 × 4 × 32 = 896:
///
/// 5,734,221,696 bytes of tensors. The checkpoint itself stores 5,700,595,200 bytes
/// (per layer `weight_packed` n·k/2, bf16 `weight_scale` n·k/64 and I64 `weight_shape` 16
/// for each of the seven linears: 112,459,888; the embedding, lm_head and 65 norms).
///
/// On an H100 (Hopper) 0.11, 0.15 and 0.19 choose MacheteLinearKernel first
/// (`_POSSIBLE_KERNELS`: 0.11.0 kernels/mixed_precision/__init__.py L28-37, 0.15.1 L42-53,
/// 0.19.0 kernels/linear/__init__.py L132-140, Machete ahead of AllSpark and Marlin):
/// `machete_prepack_B` keeps the words' bytes, the `[n, groups]` scales are copied to
/// `[groups, n]` (the same bytes), `weight_shape` stays and there is no workspace, so the
/// H100 holds the L40S's tensors less the 4 × 142 int32 workspaces a layer (32 × 4 × 568 =
/// 72,704 bytes): 5,734,148,992. The V0 default is refused as the fp8 scheme is.
#[test]
fn llama31_8b_w4a16_plans_through_the_binary_on_marlin_and_machete() {
    let (code, text, r) = plan("0.19", "sim:l40s");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("weights memory: 5.35GiB"), "{text}");
    let r = r.unwrap();
    let weights = r["terms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["term"] == "weights")
        .unwrap()["vramscope"]
        .as_f64()
        .unwrap();
    println!("Llama-3.1-8B w4a16, 0.19 on an L40S: weights {weights:.4} GiB");
    // The profile's own tensor sum, to the byte (the plan's weights term is the allocator's
    // blocks: 5,741,797,376 bytes, 5.3475 GiB).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), LLAMA31_8B_W4A16).unwrap();
    let json = dir.path().join("r.json");
    ok(&vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.path().to_str().unwrap(),
        "--vllm",
        "0.19",
        "--device",
        "sim:l40s:dry",
        "--max-model-len",
        "8192",
    ]));
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(p["weights_tensor_bytes"].as_u64().unwrap(), 5_734_221_696);
    assert_eq!(p["weights_bytes"].as_u64().unwrap(), 5_741_797_376);
    assert!((weights * (1u64 << 30) as f64 - 5_741_797_376.0).abs() < 1.0);
    // The stored bytes, as a checkpoint of this shape holds them.
    let (h, i, layers) = (4096u64, 14336u64, 32u64);
    let linears = [(h, h), (1024, h), (1024, h), (h, h), (i, h), (i, h), (h, i)];
    let per_layer: u64 = linears
        .iter()
        .map(|&(n, k)| n * k / 2 + n * k / 64 + 16)
        .sum();
    assert_eq!(per_layer, 112_459_888);
    let stored = layers * per_layer + 2 * 128_256 * h * 2 + (2 * layers + 1) * h * 2;
    assert_eq!(stored, 5_700_595_200);
    for vllm in ["0.11", "0.15", "0.19"] {
        let (code, text, _) = plan(vllm, "sim:h100-sxm");
        assert_eq!(code, Some(0), "{vllm}: {text}");
        assert!(!text.contains("MacheteLinearKernel"), "{vllm}: {text}");
    }
    ok(&vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.path().to_str().unwrap(),
        "--vllm",
        "0.19",
        "--device",
        "sim:h100-sxm:dry",
        "--max-model-len",
        "8192",
    ]));
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(
        p["weights_tensor_bytes"].as_u64().unwrap(),
        5_734_221_696 - 32 * 4 * 568
    );
    let (code, text, _) = plan("0.6.4", "sim:l40s");
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("compressed-tensors w4a16 checkpoint is modelled under the V1 releases"),
        "{text}"
    );
}

/// The profile of a checkpoint under 0.19 on an L40S, dry: its exit code and its one line.
fn refused(dir: &Path) -> (Option<i32>, String) {
    let out = vramscope(&[
        "profile",
        "-q",
        "--model",
        dir.to_str().unwrap(),
        "--vllm",
        "0.19",
        "--device",
        "sim:l40s:dry",
        "--max-model-len",
        "256",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    (out.status.code(), err)
}

/// Each bad or unmodelled config is one line naming what it is.
#[test]
fn ct_configs_not_modelled_or_wrong_are_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    gen(dir.path(), &["--ct-w4a16", "--group-size", "32"]);
    let cfg_path = dir.path().join("config.json");
    let good: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "int-quantized holding 4-bit weights",
            Box::new(|q| q["format"] = "int-quantized".into()),
            "weights is \"int\" 4-bit: format int-quantized holds int 8-bit weights",
        ),
        (
            "nvfp4 format over int4 weights",
            Box::new(|q| q["format"] = "nvfp4-pack-quantized".into()),
            "weights is type \"int\" num_bits 4 strategy \"group\" group_size 32 symmetric true: NVFP4 is float, 4 bits, tensor_group, 16, symmetric",
        ),
        (
            "2:4 marlin-24",
            Box::new(|q| q["format"] = "marlin-24".into()),
            "format 'marlin-24' (2:4 sparse 4-bit weights) is not modelled: vLLM 0.11 and 0.15 run it as CompressedTensorsW4A16Sparse24",
        ),
        (
            "2:4 sparsity",
            Box::new(|q| {
                q["sparsity_config"] = serde_json::json!({
                    "format": "sparse-24-bitmask", "sparsity_structure": "2:4",
                    "targets": ["Linear"], "ignore": ["lm_head"], "global_sparsity": 0.45
                })
            }),
            "weight-only quantization with a 2:4 sparsity_config (not CompressedTensors24",
        ),
        (
            "kv cache",
            Box::new(|q| {
                q["kv_cache_scheme"] = serde_json::json!({"num_bits": 8, "type": "float"})
            }),
            "a kv_cache_scheme (stored fp8 KV scales) is not modelled yet",
        ),
        (
            "w8a16",
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["num_bits"] = 8.into()),
            "weights.num_bits is 8: w8a16 (Marlin's uint8b128) is not modelled yet",
        ),
        (
            "asymmetric",
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["symmetric"] = false.into()),
            "weights.symmetric is false: zero points (weight_zero_point",
        ),
        (
            "w4a8",
            Box::new(|q| {
                q["config_groups"]["group_0"]["input_activations"] = serde_json::json!(
                    {"type": "float", "num_bits": 8, "strategy": "token", "dynamic": true})
            }),
            "w4a8 (CutlassW4A8 / Machete with fp8 or int8 activations) is not modelled yet",
        ),
        (
            "group 96",
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["group_size"] = 96.into()),
            "weights.group_size is 96: Marlin takes 32, 64 or 128",
        ),
        (
            "strategy tensor",
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor".into()),
            "weights.strategy Some(\"tensor\") is not modelled",
        ),
        (
            "channel act-order",
            Box::new(|q| {
                let w = &mut q["config_groups"]["group_0"]["weights"];
                w["strategy"] = "channel".into();
                w["actorder"] = "group".into();
            }),
            "activation ordering needs group quantization",
        ),
        (
            "actorder typo",
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["actorder"] = "grup".into()),
            "weights.actorder is \"grup\"",
        ),
        (
            "ignore",
            Box::new(|q| q["ignore"] = serde_json::json!(["lm_head", "re:.*down_proj"])),
            "a linear layer left in 16 bits is not read yet",
        ),
        (
            "two groups",
            Box::new(|q| {
                q["config_groups"]["group_1"] = q["config_groups"]["group_0"].clone();
            }),
            "2 config_groups: only one scheme for every Linear layer is modelled",
        ),
        (
            "act-order without g_idx",
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["actorder"] = "group".into()),
            "weight_g_idx is missing: config_groups' weights.actorder is \"group\"",
        ),
        (
            "group 64 against the stored [n, k/32]",
            Box::new(|q| q["config_groups"]["group_0"]["weights"]["group_size"] = 64.into()),
            "weight_scale has shape [128, 4], expected [128, 2]",
        ),
    ];
    for (what, edit, want) in cases {
        let mut cfg = good.clone();
        edit(&mut cfg["quantization_config"]);
        std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
        let (code, err) = refused(dir.path());
        assert_eq!(code, Some(2), "{what}: {err}");
        assert!(err.contains(want), "{what}: {err}");
    }
}

/// Rewrites one tensor of a `model.safetensors` in place (same dtype and size).
fn patch(dir: &Path, name: &str, f: impl Fn(&mut [u8])) {
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let off = &header[name]["data_offsets"];
    let (a, b) = (
        8 + n + off[0].as_u64().unwrap() as usize,
        8 + n + off[1].as_u64().unwrap() as usize,
    );
    f(&mut bytes[a..b]);
    std::fs::write(&path, bytes).unwrap();
}

/// Bad stored values are one line each: a `weight_shape` that is not the config's `[n, k]`,
/// a NaN or negative scale (compute mode reads them), a `weight_packed` of the wrong shape.
#[test]
fn ct_bad_shapes_and_scales_are_one_line_each() {
    let base = "model.layers.1.self_attn.o_proj";
    let run = |dir: &Path, device: &str| {
        let out = vramscope(&[
            "profile",
            "-q",
            "--model",
            dir.to_str().unwrap(),
            "--vllm",
            "0.19",
            "--device",
            device,
            "--tokens",
            "64",
            "--max-model-len",
            "256",
        ]);
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(out.status.code(), Some(2), "{err}");
        err
    };
    let dir = tempfile::tempdir().unwrap();
    gen(dir.path(), &["--ct-w4a16", "--group-size", "32"]);
    patch(dir.path(), &format!("{base}.weight_shape"), |b| {
        b[..8].copy_from_slice(&64i64.to_le_bytes())
    });
    let err = run(dir.path(), "sim:l40s:dry");
    assert!(
        err.contains(&format!(
            "tensor {base}.weight_shape holds [64, 128], but config.json implies the [128, 128] linear"
        )),
        "{err}"
    );
    for (value, shown) in [(half::f16::NAN, "NaN"), (half::f16::from_f32(-0.5), "-0.5")] {
        let dir = tempfile::tempdir().unwrap();
        gen(dir.path(), &["--ct-w4a16", "--group-size", "32"]);
        patch(dir.path(), &format!("{base}.weight_scale"), |b| {
            b[2 * 5..2 * 5 + 2].copy_from_slice(&value.to_le_bytes())
        });
        let err = run(dir.path(), "sim:l40s:compute");
        assert!(
            err.contains(&format!("tensor {base}.weight_scale[1, 1] is {shown}")),
            "{err}"
        );
    }
}

/// Per-channel W4A16 (`strategy: channel`, one scale per output row) on an A100 under 0.11
/// and 0.19: AllSpark comes before Marlin in `_POSSIBLE_KERNELS` but takes only 8-bit
/// weights (`ALLSPARK_SUPPORTED_QUANT_TYPES = [scalar_types.uint8b128]`, allspark_utils.py
/// L10 at 0.11.0, 0.15.1, 0.19.0), so Marlin runs it, with `[1, n]` scales: 5.24 GiB of
/// weights against 5.35 GiB in groups of 128 (per layer 3,407,872 bytes of bf16 scales
/// become 2 × (6144 + 4096 + 28672 + 4096) = 86,016: 106,299,392 bytes of tensors fewer for
/// 32 layers, 113,639,424 of the allocator's blocks).
#[test]
fn channel_w4a16_on_an_a100_runs_marlin_not_allspark() {
    let mut cfg: serde_json::Value = serde_json::from_str(LLAMA31_8B_W4A16).unwrap();
    let w = &mut cfg["quantization_config"]["config_groups"]["group_0"]["weights"];
    w["strategy"] = "channel".into();
    w["group_size"] = serde_json::Value::Null;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    let model = dir.path().display().to_string();
    for vllm in ["0.11", "0.19"] {
        let out = vramscope(&[
            "plan",
            "--vllm",
            vllm,
            "--device",
            "sim:a100-80gb",
            "--",
            "vllm",
            "serve",
            &model,
            "--max-model-len",
            "8192",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{vllm}: {text}");
        assert!(text.contains("weights memory: 5.24GiB"), "{vllm}: {text}");
    }
}

//! Block-wise fp8 experts and multi-head latent attention under the V1 releases (0.11.0,
//! 0.19.0, 0.21.0 to 0.33.0 on Hopper; 0.15.1 refused), dry, from config.json alone: Qwen/Qwen3-30B-A3B-FP8 (fused MoE with
//! [128, 128] block scales) and deepseek-ai/DeepSeek-V3 (every linear fp8, the routed and
//! shared experts, MLA's kept 16-bit copy of kv_b_proj). The weights are checked against their
//! 16-bit twins (the same config without quantization_config): what differs is exactly the
//! fp8 codes, their f32 grids and what vLLM adds after loading.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::cli::Row;

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .expect("run vramscope")
}

/// Bytes of a block-wise fp8 `[n, k]` weight: one-byte codes and an f32 per [128, 128] block.
fn fp8(n: u64, k: u64) -> u64 {
    n * k + n.div_ceil(128) * k.div_ceil(128) * 4
}

/// Bytes of the same weight in bf16.
fn bf16(n: u64, k: u64) -> u64 {
    n * k * 2
}

/// Qwen/Qwen3-30B-A3B-FP8's config.json: the shapes as published, `modules_to_not_convert`
/// naming each layer's router and norms (as Qwen's FP8 MoE configs do) and the lm_head.
fn qwen3_30b_a3b_fp8_json(layers: usize) -> serde_json::Value {
    let mut skip = vec![serde_json::json!("lm_head")];
    for l in 0..layers {
        for m in ["input_layernorm", "mlp.gate", "post_attention_layernorm"] {
            skip.push(format!("model.layers.{l}.{m}").into());
        }
    }
    serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": layers, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
        "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false, "attention_bias": false, "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128], "modules_to_not_convert": skip
        }
    })
}

/// deepseek-ai/DeepSeek-V3's config.json (DeepSeek-R1's has the same shapes), as the
/// `deepseek-v3` preset holds it, with `layers` decoder layers. The tests below hold it to the
/// published checkpoint's tensor bytes.
fn deepseek_v3_json(layers: usize) -> serde_json::Value {
    let mut j = vramscope::model::presets::published_fp8_json("deepseek-v3").unwrap();
    j["num_hidden_layers"] = layers.into();
    j
}

/// A directory with `config.json` only (a dry run reads no weights).
fn config_dir(json: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec_pretty(json).unwrap(),
    )
    .unwrap();
    dir
}

/// The same model without its quantization_config: its 16-bit twin.
fn twin(json: &serde_json::Value) -> tempfile::TempDir {
    let mut j = json.clone();
    j.as_object_mut().unwrap().remove("quantization_config");
    config_dir(&j)
}

/// A dry `profile --json` of `dir`: the report.
fn profile(dir: &Path, vllm: &str, device: &str, extra: &[&str]) -> serde_json::Value {
    let json = dir.join(format!("{vllm}-{}.json", device.replace(':', "-")));
    let mut args = vec![
        "profile",
        "-q",
        "--no-verify",
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

fn weights(r: &serde_json::Value) -> u64 {
    r["weights_tensor_bytes"].as_u64().unwrap()
}

/// The load's allocations (before the first pass): `(tensor, bytes)`.
fn load_allocs(r: &serde_json::Value) -> Vec<(String, u64)> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .take_while(|e| e["tensor"] != "t1")
        .filter(|e| e["kind"] == "alloc")
        .map(|e| {
            (
                e["tensor"].as_str().unwrap().to_string(),
                e["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The profile pass's allocs and frees in layer 0 whose tensor name contains `part`:
/// `(kind, name after the last '.', bytes)`.
fn pass_events(r: &serde_json::Value, part: &str) -> Vec<(String, String, u64)> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .skip_while(|e| e["tensor"] != "t1")
        .filter(|e| {
            (e["kind"] == "alloc" || e["kind"] == "free")
                && e["layer"] == 0
                && e["tensor"].as_str().unwrap().contains(part)
        })
        .map(|e| {
            let t = e["tensor"].as_str().unwrap();
            (
                e["kind"].as_str().unwrap().to_string(),
                t[t.rfind('.').unwrap() + 1..].to_string(),
                e["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn qwen3_30b_a3b_fp8_holds_its_checkpoints_bytes_under_every_v1_release() {
    // Counted from the published shapes, per layer: q/k/v 4096 + 2 × 512 rows and o_proj
    // 2048 × 4096 in fp8 with their grids, q_norm/k_norm and the two norms in bf16, the
    // router 128 × 2048 in bf16, and 128 experts of gate/up 768 × 2048 and down 2048 × 768
    // in fp8 with grids [6, 16] and [16, 6]; then embed_tokens and lm_head 151936 × 2048 in
    // bf16 and the final norm.
    let attn = fp8(4096, 2048) + 2 * fp8(512, 2048) + fp8(2048, 4096) + 2 * 128 * 2 + 2 * 2048 * 2;
    let moe = 128 * 2048 * 2 + 128 * (2 * fp8(768, 2048) + fp8(2048, 768));
    let tables = 2 * 151936 * 2048 * 2 + 2048 * 2;
    assert_eq!(48 * (attn + moe) + tables, 31_174_545_408);
    // What the same layers weigh in bf16.
    let attn16 =
        bf16(4096, 2048) + 2 * bf16(512, 2048) + bf16(2048, 4096) + 2 * 128 * 2 + 2 * 2048 * 2;
    let moe16 = 128 * 2048 * 2 + 128 * 3 * bf16(768, 2048);
    let json = qwen3_30b_a3b_fp8_json(48);
    let (dir, dir16) = (config_dir(&json), twin(&json));
    // 0.15.1 runs FlashInfer's CUTLASS experts on Hopper (refused: see the refusals test);
    // 0.21 and 0.22 run them for the 16-bit twin (refused), so 0.24 stands for 0.21's runner.
    for v in ["0.11", "0.19", "0.24", "0.29", "0.33"] {
        let r = profile(dir.path(), v, "sim:h100-80gb:dry", &[]);
        let r16 = profile(dir16.path(), v, "sim:h100-80gb:dry", &[]);
        assert_eq!(r["quant"], "fp8", "{v}");
        // Everything but the decoder's linears and experts is the same in both (the
        // rotary cache, the attention scalars); 0.11 adds its fp8 device identity (4 B).
        let identity = if v == "0.11" { 4 } else { 0 };
        assert_eq!(
            weights(&r) - identity - 48 * (attn + moe),
            weights(&r16) - 48 * (attn16 + moe16),
            "{v}"
        );
    }
    // FusedMoE's parameters as Fp8MoEMethod.create_weights makes them: both code tensors,
    // then both grids.
    let r = profile(dir.path(), "0.19", "sim:h100-80gb:dry", &[]);
    let experts: Vec<(String, u64)> = load_allocs(&r)
        .into_iter()
        .filter(|(t, _)| t.starts_with("model.layers.0.mlp.experts."))
        .collect();
    let p = "model.layers.0.mlp.experts.";
    assert_eq!(
        experts,
        vec![
            (format!("{p}w13_weight"), 128 * 1536 * 2048),
            (format!("{p}w2_weight"), 128 * 2048 * 768),
            (format!("{p}w13_weight_scale_inv"), 128 * 12 * 16 * 4),
            (format!("{p}w2_weight_scale_inv"), 128 * 16 * 6 * 4),
        ]
    );
}

/// The fused MoE's quantized activations in the profile pass, `m` tokens of 2048 features
/// and 8 experts each of 768: `per_token_group_quant_fp8`'s codes and f32 group scales.
#[test]
fn fp8_experts_quantize_their_inputs_as_each_release_does() {
    let dir = config_dir(&qwen3_30b_a3b_fp8_json(2));
    // 0.21 on: the same tensors in the same order under 0.21's runner (the fp8 oracle puts
    // Triton first on Hopper; docs/reading/vllm-fp8-block-moe-v021.md §2-3).
    for v in ["0.11", "0.19", "0.21", "0.25", "0.33"] {
        let r = profile(dir.path(), v, "sim:h100-80gb:dry", &[]);
        let ev = pass_events(&r, ".moe.");
        let names: Vec<&str> = ev.iter().map(|e| e.1.as_str()).collect();
        let bytes = |n: &str| ev.iter().find(|e| e.1 == n).map(|e| e.2).unwrap();
        let (a1, a1s, a2, a2s) = if v == "0.11" {
            (
                "qcurr_hidden_states",
                "a1q_scale",
                "qintermediate_cache2",
                "a2q_scale",
            )
        } else {
            ("a1q", "a1q_scale", "qintermediate_cache2", "a2q_scale")
        };
        // The pass's tokens, from the quantized input: `[m, 2048]` one byte each.
        let m = bytes(a1) / 2048;
        assert!(m >= 2048, "{v}: {m}");
        assert_eq!(bytes(a1s), m * 16 * 4, "{v}");
        assert_eq!(bytes(a2), m * 8 * 768, "{v}");
        // 1.5 MiB for 8192 tokens: the caching allocator hands it a 2 MiB segment's block
        // whose remainder (under 1 MiB) it does not split off.
        assert!(
            (m * 8 * 6 * 4..m * 8 * 6 * 4 + (1 << 20)).contains(&bytes(a2s)),
            "{v}"
        );
        // No tuned block-wise file for E=128, N=768 on the H100 in any of them:
        // get_default_config's BLOCK_SIZE_M is 64 (from 0.19: 64 above 64 tokens).
        assert_eq!(bytes("sorted_ids"), (m * 8 + 128 * 63) * 4, "{v}");
        let pos = |k: &str, n: &str| {
            ev.iter()
                .position(|e| e.0 == k && e.1 == n)
                .unwrap_or_else(|| panic!("{v}: no {k} {n} in {names:?}"))
        };
        // The input is quantized before the routing's alignment, the activation after it.
        assert!(pos("alloc", a1) < pos("alloc", "sorted_ids"), "{v}");
        assert!(pos("alloc", "sorted_ids") < pos("alloc", a2), "{v}");
        if v == "0.11" {
            // fused_experts_impl's locals die in declaration order at its return.
            assert!(
                pos("free", a1s) < pos("free", "sorted_ids"),
                "{v}: {names:?}"
            );
            assert!(
                pos("free", "sorted_ids") < pos("free", a2),
                "{v}: {names:?}"
            );
        } else {
            // `prepare` quantizes before the workspace; TritonExperts.apply frees the
            // alignment buffers, then a2q_scale, then the codes; forward frees a1q last.
            let ws = ev.iter().position(|e| e.1 == "workspace");
            if let Some(w) = ws {
                assert!(pos("alloc", a1s) < w, "{v}");
            }
            assert!(
                pos("free", "sorted_ids") < pos("free", a2s),
                "{v}: {names:?}"
            );
            assert!(pos("free", a2s) < pos("free", a2), "{v}: {names:?}");
            assert!(pos("free", a2) < pos("free", a1), "{v}: {names:?}");
        }
    }
}

/// From 0.29 a rank's expert width that the checkpoint's [128, 128] blocks do not divide gets
/// finer blocks for its scales: `gcd(128, 128, I, H)` (`refine_fp8_moe_block_shape`,
/// oracle/fp8.py 0.29.0 L272-304), 64 for Qwen3-30B-A3B's 768 over 4 ranks (192 each) and 32
/// over 8 (96 each). The scales are made on that grid (fp8.py L565-583: `w13_weight_scale_inv
/// [E, 2·I/b, H/b]`, `w2_weight_scale_inv [E, H/b, I/b]`), the inputs quantized in groups of
/// `b` (`a1q_scale [M, H/b]`, `a2q_scale [M·k, I/b]`), and no tuned file exists for the block
/// shape (the default BLOCK_SIZE_M, 64 above 64 tokens).
#[test]
fn fp8_experts_re_blocked_from_0_29() {
    let dir = config_dir(&qwen3_30b_a3b_fp8_json(2));
    for (tp, b) in [(4u64, 64u64), (8, 32)] {
        let i = 768 / tp;
        for v in ["0.29", "0.33"] {
            let r = profile(
                dir.path(),
                v,
                "sim:h100-80gb:dry",
                &["--tp", &tp.to_string()],
            );
            let scale = |n: &str| {
                load_allocs(&r)
                    .iter()
                    .find(|(t, _)| t == &format!("model.layers.0.mlp.experts.{n}"))
                    .map(|a| a.1)
                    .unwrap_or_else(|| panic!("{v}: no {n}"))
            };
            // Small blocks: the allocator rounds to 512 bytes.
            let r512 = |x: u64| x.div_ceil(512) * 512;
            assert_eq!(
                scale("w13_weight_scale_inv"),
                r512(128 * 2 * (i / b) * (2048 / b) * 4),
                "{v} TP {tp}"
            );
            assert_eq!(
                scale("w2_weight_scale_inv"),
                r512(128 * (2048 / b) * (i / b) * 4),
                "{v} TP {tp}"
            );
            let ev = pass_events(&r, ".moe.");
            let bytes = |n: &str| ev.iter().find(|e| e.1 == n).map(|e| e.2).unwrap();
            let m = bytes("a1q") / 2048;
            assert_eq!(bytes("a1q_scale"), m * (2048 / b) * 4, "{v} TP {tp}");
            let a2s = m * 8 * (i / b) * 4;
            assert!(
                (a2s..a2s + (1 << 20)).contains(&bytes("a2q_scale")),
                "{v} TP {tp}"
            );
            assert_eq!(bytes("sorted_ids"), (m * 8 + 128 * 63) * 4, "{v} TP {tp}");
        }
    }
}

/// `plan` answers for the published FP8 MoE and MLA checkpoints' configs, in vLLM's words.
#[test]
fn plan_answers_for_fp8_moe_and_deepseek_v3_configs() {
    let qwen = config_dir(&qwen3_30b_a3b_fp8_json(48));
    let v3 = config_dir(&deepseek_v3_json(61));
    let cases = [
        (
            qwen.path(),
            "sim:h100-80gb:dry",
            vec!["--max-model-len", "32768"],
        ),
        (
            v3.path(),
            "sim:h200-141gb:dry",
            vec!["-tp", "8", "--max-model-len", "32768"],
        ),
    ];
    for (dir, device, flags) in cases {
        for v in ["0.11", "0.19", "0.22", "0.33"] {
            let d = dir.to_str().unwrap();
            let mut args = vec!["plan", "--vllm", v, "--device", device, "--no-verify", "--"];
            args.extend(["vllm", "serve", d]);
            args.extend(flags.iter().copied());
            let out = vramscope(&args);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{v} {d}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(text.contains("GPU KV cache size"), "{v} {d}: {text}");
        }
    }
}

/// Per tensor-parallel rank at TP 8, what DeepSeek-V3's decoder layers hold in fp8 and in
/// bf16: `(attention, dense MLP, MoE)`. MLA: the fused A projection (1536 + 576 rows,
/// replicated, grid 17 × 56), q_a_layernorm, q_b_proj (16 of 128 heads × 192), kv_a_layernorm,
/// kv_b_proj (16 × 256 rows of 512), o_proj (7168 × 16 × 128), the two norms. Dense: gate/up
/// 18432 / 8 rows each, down. MoE: the router (256 × 7168 bf16) and its f32 correction bias,
/// the shared expert (2048 / 8 rows), 256 experts of 2048 / 8.
fn v3_rank_layers(lin: fn(u64, u64) -> u64) -> (u64, u64, u64) {
    let attn = lin(2112, 7168)
        + 1536 * 2
        + lin(3072, 1536)
        + 512 * 2
        + lin(4096, 512)
        + lin(7168, 2048)
        + 2 * 7168 * 2;
    let dense = lin(2 * 2304, 7168) + lin(7168, 2304);
    let moe = 256 * 7168 * 2 + 256 * 4 + lin(2 * 256, 7168) + lin(7168, 256);
    // FusedMoE's stacked experts: w13 [256, 512, 7168] and w2 [256, 7168, 256], with grids
    // [256, 4, 56] and [256, 56, 2] in fp8.
    let experts = 256 * (lin(512, 7168) + lin(7168, 256));
    (attn, dense, moe + experts)
}

#[test]
fn deepseek_v3_at_tp8_holds_its_fp8_shards_and_a_16_bit_kv_b_copy_per_layer() {
    // The whole checkpoint from its shapes (fp8 with grids; bf16 embed_tokens, lm_head,
    // norms and routers; f32 correction biases): 61 layers, 3 of them dense, 256 routed
    // experts of 2048 and a shared one, 129280 × 7168 tables.
    let attn = fp8(1536, 7168)
        + fp8(576, 7168)
        + 1536 * 2
        + fp8(128 * 192, 1536)
        + 512 * 2
        + fp8(128 * 256, 512)
        + fp8(7168, 128 * 128)
        + 2 * 7168 * 2;
    let dense = 2 * fp8(18432, 7168) + fp8(7168, 18432);
    let moe = 256 * 7168 * 2 + 256 * 4 + 257 * (2 * fp8(2048, 7168) + fp8(7168, 2048));
    let tables = 2 * 129280 * 7168 * 2 + 7168 * 2;
    let main = 61 * attn + 3 * dense + 58 * moe + tables;
    assert_eq!(main, 673_150_611_808);
    // The multi-token-prediction layer 61 the repository also stores (and vLLM does not
    // load, deepseek_v2.py L1468-1470 at 0.19.0): one MoE layer, enorm and hnorm, eh_proj
    // 7168 × 14336 in bf16, shared_head.norm, and its own embed_tokens and head.
    let mtp = attn + moe + 3 * 7168 * 2 + bf16(7168, 14336) + 2 * 129280 * 7168 * 2;
    assert_eq!(main + mtp, 688_574_839_360);
    // The repository's 163 safetensors files weigh 688,586,727,753 bytes: these tensors plus
    // each file's JSON header (about 73 KB each), 0.0017 % more.
    let published = 688_586_727_753u64;
    assert!(published - (main + mtp) < 163 * 80_000);

    // At TP 8 each rank holds its shard of each linear; under 0.15.1 and 0.19.0 MLA also
    // keeps kv_b_proj dequantized to bf16 (`scaled_dequantize`, [4096, 512]); under 0.11.0
    // the identity's GEMM output, padded by 4 rows on Hopper ([516, 4096]), plus the fp8
    // device identity.
    let (a8, d8, m8) = v3_rank_layers(fp8);
    let (a16, d16, m16) = v3_rank_layers(bf16);
    let json = deepseek_v3_json(5);
    let (dir, dir16) = (config_dir(&json), twin(&json));
    for (v, kept, identity) in [
        ("0.11", 516 * 4096 * 2, 4),
        ("0.19", 4096 * 512 * 2, 0),
        ("0.24", 512 * 4096 * 2, 0),
    ] {
        let r = profile(dir.path(), v, "sim:h200-141gb:dry", &["--tp", "8"]);
        let r16 = profile(dir16.path(), v, "sim:h200-141gb:dry", &["--tp", "8"]);
        assert_eq!(
            weights(&r) - identity - 5 * (a8 + kept) - 3 * d8 - 2 * m8,
            weights(&r16) - 5 * a16 - 3 * d16 - 2 * m16,
            "{v}"
        );
        // The full model (`plan`, whose report is the text: a JSON of 8 ranks' events would
        // be millions of lines): 56 more MoE layers on each rank; 79.6 GiB a rank under 0.11,
        // 79.7 GiB under 0.19 and 0.24 (FlashInfer-MLA's 128 MiB workspace; 0.24 loads
        // under the 20 MiB split limit, whose blocks of 20 MiB or more count whole).
        let full = config_dir(&deepseek_v3_json(61));
        let d = full.path().to_str().unwrap();
        let out = vramscope(&[
            "plan",
            "--vllm",
            v,
            "--device",
            "sim:h200-141gb:dry",
            "--no-verify",
            "--",
            "vllm",
            "serve",
            d,
            "-tp",
            "8",
            "--max-model-len",
            "8192",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{v}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("weights "))
            .unwrap_or_else(|| panic!("{v}: {text}"));
        let bytes: u64 = line[line.find('(').unwrap() + 1..line.find(" bytes)").unwrap()]
            .parse()
            .unwrap();
        // The line counts the allocator's blocks (a tensor's tail to 512 bytes, a 1.5 MiB
        // one its whole 2 MiB block): 32 MiB over the tensors' own bytes; 43 MiB under the
        // 20 MiB split limit of 0.21's load (blocks of 20 MiB or more count whole).
        let tensors = weights(&r) + 56 * (a8 + kept + m8);
        let slack = if v == "0.24" { 44 << 20 } else { 40 << 20 };
        assert!(
            bytes >= tensors && bytes - tensors < slack,
            "{v}: {bytes} {tensors}"
        );
        let expect = match v {
            "0.11" => 85_452_517_888u64,
            "0.19" => 85_584_736_256,
            _ => 85_596_663_808,
        };
        assert_eq!(bytes, expect, "{v}");
    }
}

#[test]
fn deepseek_v3_keeps_kv_b_proj_dequantized_as_each_release_makes_it() {
    let dir = config_dir(&deepseek_v3_json(4));
    let kv_b = |r: &serde_json::Value| -> Vec<(String, String, u64)> {
        r["events"]
            .as_array()
            .unwrap()
            .iter()
            .take_while(|e| e["tensor"] != "t1")
            .filter(|e| {
                (e["kind"] == "alloc" || e["kind"] == "free")
                    && e["layer"] == 0
                    && e["tensor"]
                        .as_str()
                        .unwrap()
                        .starts_with("model.layers.0.self_attn.kv_b_proj.")
            })
            .map(|e| {
                let t = e["tensor"].as_str().unwrap();
                (
                    e["kind"].as_str().unwrap().to_string(),
                    t["model.layers.0.self_attn.kv_b_proj.".len()..].to_string(),
                    e["bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let s = |k: &str, n: &str, b: u64| (k.to_string(), n.to_string(), b);
    // 0.19.0 at TP 8: [4096, 512] codes and their [32, 4] grid; then `scaled_dequantize`:
    // the grid expanded along the rows ([4096, 4] f32) and the columns ([4096, 512] f32),
    // the codes as f32, their product, the bf16 result (kept).
    let r = profile(dir.path(), "0.19", "sim:h200-141gb:dry", &["--tp", "8"]);
    let (n, k) = (4096u64, 512u64);
    assert_eq!(
        kv_b(&r),
        vec![
            s("alloc", "weight", n * k),
            s("alloc", "weight_scale_inv", 32 * 4 * 4),
            s("alloc", "scale_rows_expanded", n * 4 * 4),
            s("alloc", "scale_expanded", n * k * 4),
            s("free", "scale_rows_expanded", n * 4 * 4),
            s("alloc", "weight_f32", n * k * 4),
            s("alloc", "weight_dequantized_f32", n * k * 4),
            s("free", "weight_f32", n * k * 4),
            s("alloc", "weight_dequantized", n * k * 2),
            s("free", "weight_dequantized_f32", n * k * 4),
            s("free", "scale_expanded", n * k * 4),
        ]
    );
    // 0.11.0 on Hopper: the grid transposed after loading, then the layer run on a 512 × 512
    // identity padded to 516 rows; its [516, 4096] output is kept.
    let r = profile(dir.path(), "0.11", "sim:h200-141gb:dry", &["--tp", "8"]);
    assert_eq!(
        kv_b(&r),
        vec![
            s("alloc", "weight", n * k),
            s("alloc", "weight_scale_inv", 32 * 4 * 4),
            s("alloc", "weight_scale", 4 * 32 * 4),
            s("free", "weight_scale_inv", 32 * 4 * 4),
            s("alloc", "eye", k * k * 2),
            s("alloc", "eye_padded", (k + 4) * k * 2),
            s("alloc", "eye_qinput", (k + 4) * k),
            // Blocks of 512 bytes: 516 × 4 × 4 = 8256 takes 8704.
            s(
                "alloc",
                "eye_x_scale",
                ((k + 4) * 4 * 4).div_ceil(512) * 512
            ),
            s("alloc", "weight_dequantized", (k + 4) * n * 2),
            s("free", "eye_padded", (k + 4) * k * 2),
            s("free", "eye_qinput", (k + 4) * k),
            s("free", "eye_x_scale", ((k + 4) * 4 * 4).div_ceil(512) * 512),
            s("free", "eye", k * k * 2),
        ]
    );
    // 0.21.0 on: DeepGEMM is vendored, so the identity path again, through the release's own
    // block-wise linear (DeepGEMM's `fp8_gemm_nt` at 512 rows: the placeholder scale, the
    // quantized identity and its [512, 4] scales, no padding); the [512, 4096] output kept.
    for v in ["0.21", "0.33"] {
        let r = profile(dir.path(), v, "sim:h200-141gb:dry", &["--tp", "8"]);
        assert_eq!(
            kv_b(&r),
            vec![
                s("alloc", "weight", n * k),
                s("alloc", "weight_scale_inv", 512),
                s("alloc", "eye", k * k * 2),
                s("alloc", "eye_input_scale_placeholder", 512),
                s("alloc", "eye_qinput", k * k),
                s("alloc", "eye_x_scale", k * 4 * 4),
                s("alloc", "weight_dequantized", k * n * 2),
                s("free", "eye_qinput", k * k),
                s("free", "eye_x_scale", k * 4 * 4),
                s("free", "eye_input_scale_placeholder", 512),
                s("free", "eye", k * k * 2),
            ],
            "{v}"
        );
    }
}

/// What vLLM refuses or vramscope does not model, one line each.
#[test]
fn fp8_experts_refusals_name_what_is_missing() {
    let refused = |dir: &Path, vllm: &str, device: &str, extra: &[&str]| -> String {
        let mut args = vec![
            "profile",
            "-q",
            "--model",
            dir.to_str().unwrap(),
            "--vllm",
            vllm,
            "--device",
            device,
        ];
        args.extend_from_slice(extra);
        let out = vramscope(&args);
        assert_eq!(out.status.code(), Some(2), "{vllm} {device} {extra:?}");
        let e = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        e
    };
    let dir = config_dir(&qwen3_30b_a3b_fp8_json(2));
    let e = refused(dir.path(), "0.8", "sim:h100-80gb:dry", &[]);
    assert!(e.contains("V1 releases"), "{e}");
    let e = refused(dir.path(), "0.19", "sim:l40s:dry", &[]);
    assert!(e.contains("off Hopper"), "{e}");
    // TP 4 leaves each rank 192 of an expert's 768: not a multiple of 128.
    let e = refused(dir.path(), "0.19", "sim:h100-80gb:dry", &["--tp", "4"]);
    assert!(
        e.contains("The output_size of gate's and up's weight = 192 is not divisible by weight quantization block_n = 128."),
        "{e}"
    );
    // 0.15.1's fp8 oracle takes FlashInfer's CUTLASS experts on Hopper (flashinfer-python is a
    // dependency of that wheel); from 0.19 it does with expert parallel: modelled under 0.21's
    // runner (tests below), refused under 0.19's.
    let e = refused(dir.path(), "0.15", "sim:h100-80gb:dry", &[]);
    assert!(
        e.contains("FlashInfer's CUTLASS MoE") && e.contains("0.15.1"),
        "{e}"
    );
    for extra in [
        ["--tp", "2", "--enable-expert-parallel"],
        ["--dp", "2", "--enable-expert-parallel"],
    ] {
        let e = refused(dir.path(), "0.19", "sim:h100-80gb:dry", &extra);
        assert!(
            e.contains("expert parallel over 2 ranks") && e.contains("--vllm 0.21 to 0.33"),
            "{e}"
        );
    }
    // 0.28 still refuses it; from 0.29 vLLM re-blocks (the test below).
    let e = refused(dir.path(), "0.28", "sim:h100-80gb:dry", &["--tp", "4"]);
    assert!(
        e.contains("not divisible by weight quantization block_n = 128"),
        "{e}"
    );
    // Without the routers in modules_to_not_convert vLLM would make them fp8.
    let mut j = qwen3_30b_a3b_fp8_json(2);
    j["quantization_config"]
        .as_object_mut()
        .unwrap()
        .remove("modules_to_not_convert");
    let dir = config_dir(&j);
    let e = refused(dir.path(), "0.19", "sim:h100-80gb:dry", &[]);
    assert!(e.contains("mlp.gate"), "{e}");
    // A CPU run needs the experts' fp8 math.
    let dir = config_dir(&deepseek_v3_json(4));
    let e = refused(dir.path(), "0.19", "sim:h200-141gb:compute", &["--tp", "8"]);
    assert!(!e.is_empty());
}

/// moonshotai/Kimi-K2-Instruct's config.json, as the `kimi-k2` preset holds it: DeepSeek-V3's
/// layout with 64 heads, 384 routed experts, one dense layer and a 163840-token vocabulary.
fn kimi_k2_json() -> serde_json::Value {
    vramscope::model::presets::published_fp8_json("kimi-k2").unwrap()
}

/// Kimi-K2 over 8 H200s under 0.19: 121.1 GiB of weights a rank, which leaves the KV cache
/// less than one request at the default 0.9 utilization and 111,808 tokens at 0.95 (V1's
/// baseline taken after the communicators start: their memory is in the initial free memory,
/// not in the non-torch increase).
#[test]
fn kimi_k2_plans_over_eight_h200s_at_095() {
    // Per rank at TP 8: MLA with 8 of 64 heads and its kv_b copy ([2048, 512] bf16), one
    // dense layer, 60 MoE layers of 384 experts of 256, the tables' 20480 rows.
    let attn = fp8(2112, 7168)
        + 1536 * 2
        + fp8(1536, 1536)
        + 512 * 2
        + fp8(2048, 512)
        + fp8(7168, 1024)
        + 2 * 7168 * 2
        + 2048 * 512 * 2;
    let dense = fp8(2 * 2304, 7168) + fp8(7168, 2304);
    let moe = 384 * 7168 * 2 + 384 * 4 + 385 * (fp8(512, 7168) + fp8(7168, 256));
    let tensors = 61 * attn + dense + 60 * moe + 2 * 20480 * 7168 * 2 + 7168 * 2;
    assert_eq!(tensors, 129_873_676_000);
    let dir = config_dir(&kimi_k2_json());
    let d = dir.path().to_str().unwrap();
    let plan = |util: &str| {
        let out = vramscope(&[
            "plan",
            "--vllm",
            "0.19",
            "--device",
            "sim:h200-141gb:dry",
            "--no-verify",
            "--",
            "vllm",
            "serve",
            d,
            "-tp",
            "8",
            "--max-model-len",
            "32768",
            "--gpu-memory-utilization",
            util,
        ]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (ok, text) = plan("0.95");
    assert!(ok, "{text}");
    assert!(text.contains("GPU KV cache size: 111,808 tokens"), "{text}");
    let line = text.lines().find(|l| l.starts_with("weights ")).unwrap();
    let bytes: u64 = line[line.find('(').unwrap() + 1..line.find(" bytes)").unwrap()]
        .parse()
        .unwrap();
    assert_eq!(bytes, 130_042_278_912);
    // Beyond the tensors: FlashInfer-MLA's 128 MiB workspace, the 131072 × 64 bf16 rotary
    // cache (16 MiB), the attention scalars and the allocator's rounding.
    assert!(
        (144 << 20..180 << 20).contains(&(bytes - tensors)),
        "{}",
        bytes - tensors
    );
    // At 0.9 vLLM would not start: 0.30 GiB of KV cache holds 4,544 tokens, less than one
    // request of 32768; the plan says so and exits non-zero.
    let (ok, text) = plan("0.9");
    assert!(!ok, "{text}");
    assert!(
        text.contains("Available KV cache memory: 0.30 GiB")
            && text.contains("the estimated maximum model length is 4544"),
        "{text}"
    );
}

/// Under 0.11 on Hopper `process_weights_after_loading` runs module by module: each layer's
/// qkv_proj and o_proj grids transposed, its attention's KV-cache scales checked and deleted,
/// then its MLP's, before the next layer's (0.11.0 model_loader/utils.py, `named_modules`).
#[test]
fn v0_11_transposes_each_layers_grids_in_module_order() {
    let dir = config_dir(&qwen3_30b_a3b_fp8_json(2));
    let r = profile(dir.path(), "0.11", "sim:h100-80gb:dry", &[]);
    let seq: Vec<String> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .take_while(|e| e["tensor"] != "t1")
        .filter(|e| {
            let t = e["tensor"].as_str().unwrap();
            (e["kind"] == "alloc" && (t.ends_with(".weight_scale") || t.ends_with("_gt_0")))
                || (e["kind"] == "free" && t.ends_with(".attn.prob_scale"))
        })
        .map(|e| {
            let t = e["tensor"].as_str().unwrap();
            format!(
                "{} {}",
                e["kind"].as_str().unwrap(),
                &t["model.layers.".len()..]
            )
        })
        .collect();
    let mut want = Vec::new();
    for l in 0..2 {
        want.push(format!("alloc {l}.self_attn.qkv_proj.weight_scale"));
        want.push(format!("alloc {l}.self_attn.o_proj.weight_scale"));
        want.push(format!("alloc {l}.self_attn.attn.q_scale_gt_0"));
        want.push(format!("alloc {l}.self_attn.attn.prob_scale_gt_0"));
        want.push(format!("free {l}.self_attn.attn.prob_scale"));
    }
    assert_eq!(seq, want);
}

/// deepseek-ai/DeepSeek-V3's 163 published files weigh 688,586,727,753 B. Its tensors, listed by
/// name, dtype and shape as the repository stores them (61 layers and the MTP layer 61, fp8
/// linears with their f32 `weight_scale_inv` grids), weigh 688,574,839,360 B; the rest is the
/// files' safetensors headers: per file 8 bytes of length, then compact JSON (`__metadata__`,
/// and per tensor its dtype, shape and `data_offsets`) padded with spaces to a multiple of 8.
/// Laid out in name order over shards of a 163rd of the total, those headers come to within
/// 0.1 % of the difference (11,891,192 B against 11,888,393 B; the offsets' digits depend on
/// the layout): the files hold these tensors and no others, so the index's `total_size` (the
/// tensors' bytes) is the computed total.
/// A stored tensor: name, safetensors dtype, shape.
type Stored = (String, &'static str, Vec<u64>);

#[test]
fn deepseek_v3_files_are_its_tensors_plus_their_safetensors_headers() {
    let (h, v) = (7168u64, 129280u64);
    let mut ts: Vec<Stored> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![v, h]),
        ("model.norm.weight".into(), "BF16", vec![h]),
        ("lm_head.weight".into(), "BF16", vec![v, h]),
    ];
    let fp8_linear = |ts: &mut Vec<Stored>, n: &str, r: u64, c: u64| {
        ts.push((format!("{n}.weight"), "F8_E4M3", vec![r, c]));
        ts.push((
            format!("{n}.weight_scale_inv"),
            "F32",
            vec![r.div_ceil(128), c.div_ceil(128)],
        ));
    };
    for i in 0..62 {
        let p = format!("model.layers.{i}.");
        for n in ["input_layernorm", "post_attention_layernorm"] {
            ts.push((format!("{p}{n}.weight"), "BF16", vec![h]));
        }
        let a = format!("{p}self_attn.");
        fp8_linear(&mut ts, &format!("{a}q_a_proj"), 1536, h);
        ts.push((format!("{a}q_a_layernorm.weight"), "BF16", vec![1536]));
        fp8_linear(&mut ts, &format!("{a}q_b_proj"), 128 * 192, 1536);
        fp8_linear(&mut ts, &format!("{a}kv_a_proj_with_mqa"), 576, h);
        ts.push((format!("{a}kv_a_layernorm.weight"), "BF16", vec![512]));
        fp8_linear(&mut ts, &format!("{a}kv_b_proj"), 128 * 256, 512);
        fp8_linear(&mut ts, &format!("{a}o_proj"), h, 128 * 128);
        let m = format!("{p}mlp.");
        let mlp = |ts: &mut Vec<Stored>, q: &str, w: u64| {
            fp8_linear(ts, &format!("{q}gate_proj"), w, h);
            fp8_linear(ts, &format!("{q}up_proj"), w, h);
            fp8_linear(ts, &format!("{q}down_proj"), h, w);
        };
        if i < 3 {
            mlp(&mut ts, &m, 18432);
        } else {
            ts.push((format!("{m}gate.weight"), "BF16", vec![256, h]));
            ts.push((format!("{m}gate.e_score_correction_bias"), "F32", vec![256]));
            for e in 0..256 {
                mlp(&mut ts, &format!("{m}experts.{e}."), 2048);
            }
            mlp(&mut ts, &format!("{m}shared_experts."), 2048);
        }
        if i == 61 {
            for n in ["enorm", "hnorm", "shared_head.norm"] {
                ts.push((format!("{p}{n}.weight"), "BF16", vec![h]));
            }
            ts.push((format!("{p}eh_proj.weight"), "BF16", vec![h, 2 * h]));
            ts.push((format!("{p}shared_head.head.weight"), "BF16", vec![v, h]));
            ts.push((format!("{p}embed_tokens.weight"), "BF16", vec![v, h]));
        }
    }
    let bytes = |t: &Stored| {
        let el = match t.1 {
            "BF16" => 2,
            "F32" => 4,
            _ => 1,
        };
        t.2.iter().product::<u64>() * el
    };
    let total: u64 = ts.iter().map(bytes).sum();
    assert_eq!(ts.len(), 91_991);
    assert_eq!(total, 688_574_839_360);
    // One file's header: `{"__metadata__":{"format":"pt"},` then `"name":{"dtype":"D",
    // "shape":[..],"data_offsets":[a,b]}` per tensor, commas between, `}`; padded to 8.
    let header = |entries: &[(&Stored, u64)]| -> u64 {
        let mut len = r#"{"__metadata__":{"format":"pt"}}"#.len();
        for (t, at) in entries {
            let shape: Vec<String> = t.2.iter().map(u64::to_string).collect();
            len += format!(
                r#","{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}}"#,
                t.0,
                t.1,
                shape.join(","),
                at,
                at + bytes(t)
            )
            .len();
        }
        8 + (len as u64).div_ceil(8) * 8
    };
    let shard = total as f64 / 163.0;
    let (mut headers, mut files, mut at) = (0u64, 0, 0u64);
    let mut entries = Vec::new();
    for t in &ts {
        if (at + bytes(t)) as f64 > shard && !entries.is_empty() {
            headers += header(&entries);
            files += 1;
            entries.clear();
            at = 0;
        }
        entries.push((t, at));
        at += bytes(t);
    }
    headers += header(&entries);
    files += 1;
    let published = 688_586_727_753u64;
    let gap = (published - total) as f64;
    eprintln!("{files} files, headers {headers} B, published − tensors {gap} B");
    assert!((163..=164).contains(&files), "{files}");
    assert!(
        (headers as f64 - gap).abs() < 1e-3 * gap,
        "{headers} vs {gap}"
    );
}

/// The hub ids of the published block-wise fp8 checkpoints answer from their built-in config
/// (`vllm serve deepseek-ai/DeepSeek-R1` with nothing on disk) as the same config.json in a
/// folder does (the preset opens config-only, as a folder with config.json alone).
#[test]
fn published_fp8_checkpoints_plan_from_their_built_in_config() {
    let empty = tempfile::tempdir().unwrap();
    let plan = |model: &str, v: &str, tp: &str| -> (String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .env("HF_HUB_CACHE", empty.path())
            .env("HF_HOME", empty.path())
            .env("HOME", empty.path())
            .args([
                "plan",
                "--vllm",
                v,
                "--device",
                "sim:h200-141gb:dry",
                "--no-verify",
                "--",
                "vllm",
                "serve",
                model,
                "-tp",
                tp,
                "--max-model-len",
                "8192",
                "--gpu-memory-utilization",
                "0.95",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{model} {v}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let kv = text
            .lines()
            .find(|l| l.contains("GPU KV cache size"))
            .unwrap_or_else(|| panic!("{model} {v}: {text}"))
            .to_string();
        (kv, String::from_utf8_lossy(&out.stderr).to_string())
    };
    // As docs/models.md writes it.
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .env("HF_HUB_CACHE", empty.path())
        .env("HF_HOME", empty.path())
        .env("HOME", empty.path())
        .args(
            "plan --vllm 0.33 --device sim:h200-141gb:dry -- vllm serve deepseek-ai/DeepSeek-R1 -tp 8"
                .split(' '),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("GPU KV cache size: 609,536 tokens"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Kimi-K2 on eight H200s at 0.9 under 0.28: the graph estimate vLLM applies (from 0.21)
    // is part of what leaves no block, and the utilization that would fit is above 0.9.
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .env("HF_HUB_CACHE", empty.path())
        .env("HF_HOME", empty.path())
        .env("HOME", empty.path())
        .args(
            "plan --vllm 0.28 --device sim:h200-141gb:dry -- vllm serve moonshotai/Kimi-K2-Instruct -tp 8 --max-model-len 32768"
                .split(' '),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("vLLM 0.28 would not start: weights"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("and the CUDA graph estimate take 128.21 GiB of T·u = 126.36 GiB")
            && line.contains("--util 0.92"),
        "{line}"
    );
    let v3 = config_dir(&deepseek_v3_json(61));
    let k2 = config_dir(&kimi_k2_json());
    let qwen = config_dir(&qwen3_30b_a3b_fp8_json(48));
    for (hub, dir, tp) in [
        ("deepseek-ai/DeepSeek-R1", v3.path(), "8"),
        ("deepseek-ai/DeepSeek-V3-0324", v3.path(), "8"),
        ("moonshotai/Kimi-K2-Instruct", k2.path(), "8"),
        ("Qwen/Qwen3-30B-A3B-FP8", qwen.path(), "1"),
    ] {
        for v in ["0.19", "0.33"] {
            let (kv, note) = plan(hub, v, tp);
            assert!(
                note.contains("block-wise fp8; dry runs only"),
                "{hub}: {note}"
            );
            assert_eq!(kv, plan(dir.to_str().unwrap(), v, tp).0, "{hub} {v}");
        }
    }
}

/// DeepSeek-R1 over 8 H200s with `--enable-expert-parallel` (one replica) from 0.21: the fp8
/// oracle's FlashInfer CUTLASS MoE (docs/reading/vllm-flashinfer-cutlass-moe.md §9). By hand,
/// 32 whole experts a rank (I 2048, H 7168, k 8) at 8192 tokens:
/// - load: each MoE layer's `w13` codes flipped into a new `[32, 4096, 7168]` e4m3
///   (939,524,096 B) and its grid into a new `[32, 32, 56]` f32 (229,376 B), then the old
///   two freed;
/// - the manager's buffer r256(2·M·H) = 117,440,512 B; per layer `experts_to_token_score
///   [32, 8192]` f32 (1,048,576 B) and the C++ workspace (no TMA path for bf16 × fp8):
///   2·r128(4R) + 2·r128(4·32·16) + r128(4·32·8192) + r128(8·33) + 2·r128(8·32) +
///   r128(2R·7168) + r128(4R·2048) + max(ws(7168), ws(2048)) = 1,962,637,184, with
///   ws(K) = R·K + 66,528·⌈K/128⌉·4, R = 65,536, plus r128(4R): 1,962,899,328 B, a segment
///   of 1,962,934,272 B (936 × 2 MiB, the 34,944 B left not split off); no input
///   quantization, no alignment buffers.
#[test]
fn deepseek_r1_with_expert_parallel_runs_flashinfers_cutlass_moe_from_0_21() {
    let r = 65_536u64;
    let ws = |k: u64| r * k + 66_528 * k.div_ceil(128) * 4;
    let moe_ws = 2 * 262_144
        + 2 * 2_048
        + 1_048_576
        + 384
        + 2 * 256
        + 2 * r * 7168
        + 4 * r * 2048
        + ws(7168).max(ws(2048));
    assert_eq!(moe_ws + 262_144, 1_962_899_328);
    for vllm in ["0.21", "0.28", "0.33"] {
        let (code, err, rows) = r1_plan_rows(vllm, &["-tp", "8", "--enable-expert-parallel"]);
        assert_eq!(code, Some(0), "{vllm}: {err}");
        // (pass, kind, op, layer, tensor, bytes)
        let flips: Vec<(String, u64)> = rows
            .iter()
            .filter(|e| e.0 == 0 && e.2 == "process_weights_after_loading")
            .filter(|e| e.1 == "alloc" || e.1 == "free")
            .filter(|e| e.4.contains("layers.3."))
            .map(|e| (e.1.clone(), e.5))
            .collect();
        let s = |k: &str, b: u64| (k.to_string(), b);
        assert_eq!(
            flips,
            [
                s("alloc", 939_524_096),
                s("alloc", 229_376),
                s("free", 939_524_096),
                s("free", 229_376)
            ],
            "{vllm}"
        );
        let layer5: Vec<(String, String, u64)> = rows
            .iter()
            .filter(|e| e.0 == 1 && (e.1 == "alloc" || e.1 == "free"))
            .filter(|e| e.4.starts_with("layers.5.moe."))
            .map(|e| {
                (
                    e.1.clone(),
                    e.4.trim_start_matches("layers.5.moe.").to_string(),
                    e.5,
                )
            })
            .collect();
        let has = |k: &str, n: &str, b: u64| layer5.contains(&(k.to_string(), n.to_string(), b));
        assert!(
            has("alloc", "flashinfer_workspace", 1_962_934_272),
            "{vllm}: {layer5:?}"
        );
        assert!(has("alloc", "experts_to_token_score", 1_048_576), "{vllm}");
        assert!(
            !layer5.iter().any(|e| e.1 == "a1q" || e.1 == "sorted_ids"),
            "{vllm}"
        );
        let manager: Vec<u64> = rows
            .iter()
            .filter(|e| e.1 == "alloc" && e.4 == "moe.workspace")
            .map(|e| e.5)
            .collect();
        assert_eq!(manager.first(), Some(&117_440_512), "{vllm}");
    }
}

/// `vllm serve deepseek-ai/DeepSeek-R1 -dp 8 --enable-expert-parallel` on H200s under 0.21:
/// the fp8 oracle never reads the data-parallel size, so FlashInfer's CUTLASS experts run
/// behind the naive dispatch (`MoEPrepareAndFinalizeNaiveDPEPModular`;
/// docs/reading/vllm-flashinfer-moe-dp.md): the bf16 hidden states `[8·8192, 7168]`, the f32
/// weights and i32 ids `[65,536, 8]` gathered, then one FlashInfer call over Mg = 65,536
/// tokens and the rank's 32 experts. By hand (§9 with M = Mg, R = 524,288, tokens per block
/// 1024, 64 blocks): 2·r128(4R) + 2·r128(4·32·64) + r128(4·32·Mg) + 384 + 512 +
/// 2R·7168 + 4R·2048 + max(ws(7168), ws(2048)), ws(K) = R·K + 525,280·⌈K/128⌉·4, plus
/// r128(4R): 15,701,616,512 B while the call runs, the manager grown to r256(2·Mg·H) =
/// 939,524,096 B.
#[test]
fn deepseek_r1_with_data_and_expert_parallel_gathers_before_flashinfer() {
    let r = 524_288u64;
    let ws = |k: u64| r * k + 525_280 * k.div_ceil(128) * 4;
    let total = 2 * 4 * r
        + 2 * 4 * 32 * 64
        + 4 * 32 * 65_536
        + 384
        + 512
        + 2 * r * 7168
        + 4 * r * 2048
        + ws(7168).max(ws(2048))
        + 4 * r;
    assert_eq!(total, 15_701_616_512);
    let (code, err, rows) = r1_plan_rows("0.21", &["-dp", "8", "--enable-expert-parallel"]);
    assert!(matches!(code, Some(0) | Some(3)), "{err}");
    // (kind, tensor, bytes) of the first rank's profile pass, layer 5's MoE.
    let layer5: Vec<(String, String, u64)> = rows
        .into_iter()
        .filter(|f| f.0 == 1)
        .filter(|f| (f.1 == "alloc" || f.1 == "free") && f.4.starts_with("layers.5.moe."))
        .map(|f| {
            (
                f.1,
                f.4.trim_start_matches("layers.5.moe.").to_string(),
                f.5,
            )
        })
        .collect();
    let at = |kind: &str, n: &str| {
        layer5
            .iter()
            .position(|e| e.0 == kind && e.1 == n)
            .unwrap_or_else(|| panic!("no {kind} {n} in {layer5:?}"))
    };
    assert_eq!(
        layer5[at("alloc", "dispatched_hidden_states")].2,
        65_536 * 7168 * 2
    );
    assert!(at("alloc", "output") < at("alloc", "dispatched_hidden_states"));
    assert!(at("alloc", "dispatched_topk_ids") < at("alloc", "flashinfer_workspace"));
    assert!(at("free", "flashinfer_workspace") < at("alloc", "combined"));
    let ws_block = layer5[at("alloc", "flashinfer_workspace")].2;
    assert!((total..total + 512).contains(&ws_block), "{ws_block}");
    assert!(!layer5
        .iter()
        .any(|e| e.1 == "sorted_ids" || e.1 == "expert_ids_mapped"));
}

/// `common::cli::plan_csv` of `vllm serve deepseek-ai/DeepSeek-R1 EXTRA…` on a dry H200.
fn r1_plan_rows(vllm: &str, extra: &[&str]) -> (Option<i32>, String, Vec<Row>) {
    let mut line = vec!["vllm", "serve", "deepseek-ai/DeepSeek-R1"];
    line.extend_from_slice(extra);
    common::cli::plan_csv("sim:h200:dry", vllm, &line)
}

//! Mixture of experts under vLLM 0.29-0.33, where Model Runner V2 runs every model
//! (0.29.0 config/vllm.py L645-677). Read in the 0.29.0-0.33.0 wheels
//! (docs/reading/vllm-v1-fused-moe.md §10): V2's profile pass reaches the same Triton experts
//! as 0.28's V1 runner with the same buffers, so Mixtral and Qwen3-MoE answer there with
//! 0.28's MoE allocations plus V2's own terms (its sampler state, sampler and graph estimate).
//! Qwen2-MoE too, its shared expert inside the op. FlashInfer's experts (Blackwell), data or
//! expert parallel, quantized experts and DeepSeek on V2 stay refused, each in one line.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;

const GIB: f64 = (1u64 << 30) as f64;

use common::cli::Row;

fn plan_csv(device: &str, vllm: &str) -> Vec<Row> {
    plan_csv_of(device, vllm, "preset:qwen3-30b-a3b")
}

/// `plan_csv` for another model.
fn plan_csv_of(device: &str, vllm: &str, model: &str) -> Vec<Row> {
    common::cli::plan_rows(device, vllm, model, &[])
}

fn plan_csv_with(device: &str, vllm: &str, model: &str, flags: &[&str]) -> Vec<Row> {
    common::cli::plan_rows(device, vllm, model, flags)
}

/// The allocations and frees of one MoE layer in the profile pass (pass 1).
fn layer_moe(rows: &[Row], layer: usize) -> Vec<(bool, String, u64)> {
    let prefix = format!("layers.{layer}.moe.");
    rows.iter()
        .filter(|r| r.0 == 1 && r.4.starts_with(&prefix))
        .filter(|r| r.1 == "alloc" || r.1 == "free")
        .map(|r| (r.1 == "alloc", r.4.clone(), r.5))
        .collect()
}

fn r256(v: u64) -> u64 {
    v.div_ceil(256) * 256
}

fn request(model: &str, device: &str, vllm: &str, tp: u32) -> ProfileRequest {
    ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse(device).unwrap(),
        vllm: vllm.into(),
        tp,
        tokens: 0,
        seqs: 0,
        verify: false,
        ..ProfileRequest::default()
    }
}

fn run(req: &ProfileRequest) -> Result<Report, String> {
    profile::run(req, None, Arc::new(AtomicBool::new(false))).map_err(|e| e.to_string())
}

/// Qwen3-30B-A3B bf16, `vllm serve` defaults, on an A100 80GB and an H100 SXM under 0.29 and
/// 0.33. The oracle keeps Triton on both (0.29.0 and 0.33.0 fused_moe/oracle/unquantized.py:
/// FlashInfer's backends moved behind Triton on the 9.x family, neither takes compute
/// capability 8.0), and V2's profile pass runs `TritonExperts` as 0.28 does. By hand, k = 8,
/// I = 768 (N = 2I = 1536), H = 2048, E = 128, bf16:
/// - `workspace_shapes` (experts/triton_moe.py, 0.29.0 L218-233, 0.33.0 L240-255):
///   ws13 (M, k, max(N/2, H)), ws2 (M, k, max(N, H)), out (M, H); `_allocate_buffers`
///   (modular_kernel.py, 0.29.0 L1120-1181, 0.33.0 L1174-1221) takes one region of
///   max(ws13, out) and ws2 from the manager, each rounded to 256 B (`get_simultaneous`):
///   r256(2·M·8·2048) + r256(2·M·8·2048) bytes, made once in layer 0 and kept;
/// - an A100 profiles 2048 tokens (`vllm serve` below 70 GiB or on an A100): 134,217,728 B
///   (128 MiB); an H100 8192: 536,870,912 B (512 MiB);
/// - per layer: sorted ids over M·k + E·(BSM − 1) slots, BSM 128 (no E=128,N=768 16-bit file
///   for either GPU in the wheels: `get_default_config`, 128 above 512 tokens).
///
/// The same layer's allocations as 0.28 on V1's runner, byte for byte; V2's sampler state is
/// there (`output_bin_counts` [max_num_seqs, V] int32).
#[test]
fn qwen3_30b_under_0_29_and_0_33_runs_triton_on_model_runner_v2() {
    let (k, i, h, e) = (8u64, 768u64, 2048u64, 128u64);
    for (device, m, seqs) in [
        ("sim:a100-80gb:dry", 2048u64, 256u64),
        ("sim:h100-sxm:dry", 8192, 1024),
    ] {
        let want = r256(2 * m * k * i.max(h)) + r256(2 * m * k * (2 * i).max(h));
        let rows28 = plan_csv(device, "0.28");
        for vllm in ["0.29", "0.30", "0.31", "0.32", "0.33"] {
            let rows = plan_csv(device, vllm);
            let ws: Vec<(u32, String, u64)> = rows
                .iter()
                .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
                .map(|r| (r.0, r.3.clone(), r.5))
                .collect();
            assert_eq!(ws, [(1, "0".to_string(), want)], "{device} {vllm}");
            let l5 = layer_moe(&rows, 5);
            assert_eq!(l5, layer_moe(&rows28, 5), "{device} {vllm}");
            let sorted: Vec<u64> = l5
                .iter()
                .filter(|(a, n, _)| *a && n.ends_with(".sorted_ids"))
                .map(|x| x.2)
                .collect();
            assert_eq!(sorted, [r256((m * k + e * 127) * 4)], "{device} {vllm}");
            let outputs: Vec<u64> = l5
                .iter()
                .filter(|(a, n, _)| *a && n.ends_with(".output"))
                .map(|x| x.2)
                .collect();
            assert_eq!(outputs, [m * h * 2], "{device} {vllm}");
            // Model Runner V2: its sampler state, made after the weights in `load_model`,
            // under the load's 20 MiB split limit. [seqs, 151936] int32 in a new segment of
            // its size rounded up to 2 MiB, which an oversize request does not split: the
            // whole segment is the block (an A100's 256 rows: 148.4 MiB asked, 150 MiB given).
            let want = seqs * 151_936 * 4;
            assert!(
                rows.iter().any(|r| r.1 == "alloc"
                    && r.4 == "penalties.output_bin_counts"
                    && r.5 == want.next_multiple_of(2 << 20)),
                "{device} {vllm}"
            );
            assert!(
                !rows28.iter().any(|r| r.4 == "penalties.output_bin_counts"),
                "0.28 runs Qwen3-MoE on V1's runner"
            );
        }
    }
    assert_eq!(
        r256(2 * 2048 * 8 * 2048) * 2,
        134_217_728,
        "the A100's workspace"
    );
    assert_eq!(
        r256(2 * 8192 * 8 * 2048) * 2,
        536_870_912,
        "the H100's workspace"
    );
}

/// The KV cache each release grants Qwen3-30B-A3B bf16 with `vllm serve` defaults (max_model_len
/// 40,960), dry: 0.29 and 0.33 on Model Runner V2, budgeted with #49208 (consumed + the
/// transient headroom, V2's graph estimate applied). `Available KV cache memory` and `GPU KV
/// cache size` as the log prints them, and the bytes. 0.33 is above 0.29 by the cuBLAS
/// handles it makes before the baseline (v1/worker/gpu_worker.py:518-529), less what its
/// profile run's 20 MiB split limit leaves unsplit at the peak (1.5-1.9 MB here). For comparison,
/// 0.28 (V1's runner, its sampler's fp32 logits at the peak) grants 13.45 GiB / 146,944 tokens
/// on the A100 and 10.73 GiB / 117,200 on the H100. Printed with `--nocapture`.
#[test]
fn qwen3_30b_kv_cache_under_0_29_and_0_33() {
    for (device, vllm, gib, bytes, tokens) in [
        (
            "sim:a100-80gb:dry",
            "0.29",
            "13.81",
            14_831_391_744i64,
            150_864u64,
        ),
        (
            "sim:a100-80gb:dry",
            "0.33",
            "13.83",
            14_852_559_872,
            151_088,
        ),
        ("sim:h100-sxm:dry", "0.29", "11.88", 12_759_427_736, 129_792),
        ("sim:h100-sxm:dry", "0.33", "11.91", 12_793_555_608, 130_128),
    ] {
        let r = run(&request("preset:qwen3-30b-a3b", device, vllm, 1)).unwrap();
        let a = r.vllm_answer().unwrap();
        let kv = a.kv_bytes as f64 / GIB;
        let (t, concurrency) = r.kv_tokens_and_concurrency(&a);
        println!(
            "{device} {vllm}: {} tokens, {} seqs | KV {kv:.4} GiB ({} B) | {t} tokens | {concurrency:.2}x | estimate applied {} B",
            r.settings.tokens,
            r.settings.seqs,
            a.kv_bytes,
            r.graphs_estimate_applied()
        );
        assert_eq!(
            a.formula.id,
            vramscope::profile::formulas::FormulaId::Pr49208
        );
        assert_eq!(format!("{kv:.2}"), gib, "{device} {vllm}");
        assert_eq!(a.kv_bytes, bytes, "{device} {vllm}");
        assert_eq!(t, tokens, "{device} {vllm}");
        let lines = r.vllm_log_lines().join("\n");
        assert!(
            lines.contains(&format!("Available KV cache memory: {gib} GiB"))
                && lines.contains(&format!(
                    "GPU KV cache size: {} tokens",
                    vramscope::base::units::thousands(tokens)
                )),
            "{lines}"
        );
    }
}

/// The line docs/models.md shows, as written there.
#[test]
fn the_docs_line_for_0_33_on_an_h100_runs() {
    let out = common::cli::vramscope(&[
        "plan",
        "--device",
        "sim:h100-sxm:dry",
        "--vllm",
        "0.33",
        "--",
        "vllm",
        "serve",
        "preset:qwen3-30b-a3b",
    ]);
    common::cli::ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("GPU KV cache size: ") && text.contains("8192 tokens in 1024 seq(s)"),
        "{text}"
    );
}

/// What 0.29-0.33 still refuse, each in one line naming it: FlashInfer's experts on the B200,
/// sequence-parallel MoE for DeepSeek's block, bitsandbytes experts; online fp8 experts and
/// MLA below Hopper (0.33's TRITON_MLA) answer.
#[test]
fn what_0_29_to_0_33_refuse_is_named_in_one_line() {
    let one_line = |e: &str| assert_eq!(e.lines().count(), 1, "{e}");
    for vllm in ["0.29", "0.31", "0.33"] {
        let e = run(&request("preset:qwen3-30b-a3b", "sim:b200:dry", vllm, 1)).unwrap_err();
        assert!(
            e.contains(&format!("--vllm {vllm}")) && e.contains("FlashInfer's TRT-LLM BF16 MoE"),
            "{e}"
        );
        one_line(&e);
        // Data and expert parallel run for DeepSeek's block too; both over two
        // tensor-parallel ranks (sequence-parallel MoE) stay refused.
        let mut dp = request("preset:deepseek-v2-lite", "sim:h100-sxm:dry", vllm, 1);
        dp.dp = 2;
        assert!(run(&dp).is_ok(), "{vllm}");
        let mut ep = request("preset:deepseek-v2-lite", "sim:h100-sxm:dry", vllm, 2);
        ep.enable_expert_parallel = true;
        assert!(run(&ep).is_ok(), "{vllm}");
        ep.dp = 2;
        let e = run(&ep).unwrap_err();
        assert!(e.contains("use_sequence_parallel_moe"), "{e}");
        one_line(&e);
        // DeepSeek runs on V2 (tests/moe_v1_oracle.rs), below Hopper too (TRITON_MLA).
        let ds = run(&request(
            "preset:deepseek-v2-lite",
            "sim:a100-80gb:dry",
            vllm,
            1,
        ));
        assert!(ds.is_ok(), "{vllm}");
        // Online fp8 experts run (tests/fp8_moe.rs); bitsandbytes experts are not modelled.
        let mut q = request("preset:qwen3-30b-a3b", "sim:h100-sxm:dry", vllm, 1);
        q.quant = Quant::Fp8;
        assert!(run(&q).is_ok(), "{vllm}");
        q.quant = Quant::Nf4;
        let e = run(&q).unwrap_err();
        assert!(e.contains("experts"), "nf4: {e}");
        one_line(&e);
    }
}

/// Qwen1.5-MoE-A2.7B at tensor parallel 2: after the op 0.15 and 0.19 sum in the block
/// (`final_hidden_states[0] + final_hidden_states[1]`, the tuple dropped as it is rebound), so
/// the shared and the routed outputs die before the all-reduce (qwen2_moe.py 0.19.0 L187-192);
/// from 0.21 `MoERunner.forward` sums and all-reduces while both are still its locals, so
/// they die after it (runner/moe_runner.py 0.29.0 L749-785). Two [M, H] tensors fewer at the
/// all-reduce under 0.19.
#[test]
fn qwen1_5_moe_at_tp_2_frees_the_shared_output_before_the_all_reduce_under_0_19_only() {
    let dir = common::qwen1_5_moe_dir();
    let model = dir.path().to_str().unwrap();
    let mh = 2048u64 * 2048 * 2;
    let tail = |vllm: &str| {
        let rows: Vec<(bool, String, u64)> = plan_csv_with(
            "sim:a100-80gb:dry",
            vllm,
            model,
            &["--tensor-parallel-size", "2"],
        )
        .into_iter()
        .filter(|r| r.0 == 1 && (r.1 == "alloc" || r.1 == "free"))
        .filter(|r| r.4.starts_with("layers.5.moe.") || r.4 == "layers.5.shared_expert.gated")
        .map(|r| (r.1 == "alloc", r.4, r.5))
        .collect();
        rows[rows.len() - 8..].to_vec()
    };
    let t = |a: bool, n: &str| (a, format!("layers.5.{n}"), mh);
    let logits = (
        false,
        "layers.5.moe.router_logits".to_string(),
        2048 * 60 * 2,
    );
    let after = [
        t(false, "moe.plus_shared"),
        logits.clone(),
        t(false, "moe.all_reduce"),
    ];
    let mut want19 = vec![
        (false, "layers.5.moe.topk_ids".to_string(), 2048 * 4 * 4),
        t(true, "moe.plus_shared"),
        t(false, "shared_expert.gated"),
        t(false, "moe.output"),
        t(true, "moe.all_reduce"),
    ];
    want19.extend(after.iter().cloned());
    let mut want29 = vec![
        (false, "layers.5.moe.topk_ids".to_string(), 2048 * 4 * 4),
        t(true, "moe.plus_shared"),
        t(true, "moe.all_reduce"),
        t(false, "moe.plus_shared"),
        t(false, "shared_expert.gated"),
        t(false, "moe.output"),
    ];
    want29.extend([logits, t(false, "moe.all_reduce")]);
    for (vllm, want) in [
        ("0.15", &want19),
        ("0.19", &want19),
        ("0.21", &want29),
        ("0.29", &want29),
    ] {
        assert_eq!(&tail(vllm), want, "{vllm}");
    }
}

/// Qwen1.5-MoE-A2.7B under every V1 release from 0.15 on an A100 (2048 tokens).
/// Qwen2MoeSparseMoeBlock hands its shared expert to the fused-MoE op (0.15.1/0.19.0
/// `SharedFusedMoE`, qwen2_moe.py L176-194; 0.21.0-0.33.0 `FusedMoE(shared_experts=…)`, 0.29.0
/// L168-177) and keeps its gate outside. Inside the op the shared expert runs first (more than
/// 256 tokens, and NoDPEP's prepare/finalize cannot overlap: 0.15.1 fused_moe/layer.py
/// L1844-1848, 0.19.0 runner/default_moe_runner.py L476-521, 0.29.0 runner/moe_runner.py
/// L592-612, shared_experts.py L105-133), then the routing and the experts; the shared output
/// and the routed one are summed into a new tensor after the op (0.15/0.19 in the block,
/// L187-188; from 0.21 in `MoERunner.forward`, 0.29.0 L780). `Qwen2MoeMLP.forward` scales by
/// its expert gate before it returns (L112-120), so `gate_up` lives through the gate; its
/// `SiluAndMul` is `forward_native` compiled by Inductor (`CustomOp.maybe_compile`,
/// `compile_native=True`: 0.15.1 custom_op.py L164-231, activation.py L130-131): one tensor.
/// docs/reading/vllm-shared-experts-v1.md. By hand, M = 2048, H = 2048, Is = 5632, E = 60,
/// k = 4, I = 1408, bf16:
/// - logits [M, E] 245,760; gate_up [M, 2·Is] 46,137,344; the activation [M, Is]
///   23,068,672; down [M, H] 8,388,608; the expert gate [M, 1] 4,096 and its sigmoid, the
///   gated product [M, H];
/// - the routing [M, k] ×3, 32,768 each, topk_softmax's [M·E] f32 workspace (60 experts: not
///   a power of two) 491,520; the output [M, H]; no E=60,N=1408 tuned file: block 128 from
///   0.19 (`get_default_config` by tokens), 64 under 0.15 (M > E): sorted ids
///   (M·k + E·(B − 1))·4 = 63,248 → 63,488 in the allocator's 512-byte steps (0.15: 47,888 →
///   48,128), expert ids ⌈(M·k + E·(B − 1))/B⌉·4 = 496 → 512 (0.15: 748 → 1,024);
/// - the workspace, once in layer 0: r256(2·M·k·max(I, H)) + r256(2·M·k·max(2I, H)) =
///   33,554,432 + 46,137,344 = 79,691,776 B.
#[test]
fn qwen1_5_moe_runs_its_shared_expert_inside_the_op_from_0_15() {
    let dir = common::qwen1_5_moe_dir();
    let model = dir.path().to_str().unwrap();
    let (m, h, is, e, k, i) = (2048u64, 2048u64, 5632u64, 60u64, 4u64, 1408u64);
    let mh = m * h * 2;
    let mk = m * k * 4;
    let padded = |b: u64| m * k + e * (b - 1);
    assert_eq!(padded(128) * 4, 63_248);
    let r512 = |v: u64| v.div_ceil(512) * 512;
    let t = |a: bool, n: &str, b: u64| (a, format!("layers.5.{n}"), b);
    let want = |block: u64, act: u64| {
        let sorted = r512(padded(block) * 4);
        let ids = r512(padded(block).div_ceil(block) * 4);
        vec![
            t(true, "moe.router_logits", m * e * 2),
            t(true, "shared_expert.gate_up_proj.out", m * 2 * is * 2),
            t(true, "shared_expert.act", act),
            t(true, "shared_expert.down_proj.out", mh),
            t(false, "shared_expert.act", act),
            t(true, "shared_expert_gate.out", m * 2),
            t(true, "shared_expert.gate_sigmoid", m * 2),
            t(false, "shared_expert_gate.out", m * 2),
            t(true, "shared_expert.gated", mh),
            t(false, "shared_expert.gate_sigmoid", m * 2),
            t(false, "shared_expert.down_proj.out", mh),
            t(false, "shared_expert.gate_up_proj.out", m * 2 * is * 2),
            t(true, "moe.topk_weights", mk),
            t(true, "moe.topk_ids", mk),
            t(true, "moe.token_expert_indices", mk),
            t(true, "moe.topk_softmax_workspace", m * e * 4),
            t(false, "moe.topk_softmax_workspace", m * e * 4),
            t(false, "moe.token_expert_indices", mk),
            t(true, "moe.output", mh),
            t(true, "moe.sorted_ids", sorted),
            t(true, "moe.expert_ids", ids),
            t(true, "moe.num_tokens_post_pad", 512),
            t(false, "moe.sorted_ids", sorted),
            t(false, "moe.expert_ids", ids),
            t(false, "moe.num_tokens_post_pad", 512),
            t(false, "moe.topk_weights", mk),
            t(false, "moe.topk_ids", mk),
            t(true, "moe.plus_shared", mh),
            t(false, "shared_expert.gated", mh),
            t(false, "moe.output", mh),
            t(false, "moe.router_logits", m * e * 2),
            // Layer 5's hidden states: they die in layer 6.
            t(false, "moe.plus_shared", mh),
        ]
    };
    assert_eq!(want(64, 0)[19].2, 48_128);
    assert_eq!(want(64, 0)[20].2, 1_024);
    let w = r256(2 * m * k * i.max(h)) + r256(2 * m * k * (2 * i).max(h));
    assert_eq!(w, 79_691_776);
    let act = m * is * 2;
    for vllm in ["0.15", "0.19", "0.21", "0.24", "0.28", "0.29", "0.33"] {
        let block = if vllm == "0.15" { 64 } else { 128 };
        // 0.33 runs the profile under a 20 MiB split limit (gpu_worker.py:688-699): the
        // activation [M, Is] (22 MiB) takes a cached 24 MiB block whole instead of a
        // split-off piece, and frees the 24 MiB.
        let want = want(block, if vllm == "0.33" { 24 << 20 } else { act });
        let rows = plan_csv_of("sim:a100-80gb:dry", vllm, model);
        let l5: Vec<(bool, String, u64)> = rows
            .iter()
            .filter(|r| r.0 == 1 && (r.1 == "alloc" || r.1 == "free"))
            .filter(|r| {
                r.4.starts_with("layers.5.moe.") || r.4.starts_with("layers.5.shared_expert")
            })
            .map(|r| (r.1 == "alloc", r.4.clone(), r.5))
            .collect();
        assert_eq!(l5, want, "{vllm}");
        let ws: Vec<(u32, String, u64)> = rows
            .iter()
            .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
            .map(|r| (r.0, r.3.clone(), r.5))
            .collect();
        assert_eq!(ws, [(1, "0".to_string(), w)], "{vllm}");
    }
    // The KV cache 0.29 grants it (max_model_len 8192).
    let r = run(&request(model, "sim:a100-80gb:dry", "0.29", 1)).unwrap();
    let a = r.vllm_answer().unwrap();
    let (tokens, _) = r.kv_tokens_and_concurrency(&a);
    println!(
        "Qwen1.5-MoE, A100, 0.29: KV {:.4} GiB ({} B), {tokens} tokens",
        a.kv_bytes as f64 / GIB,
        a.kv_bytes
    );
    // 112 tokens more than with a `silu` temporary beside the activation (23,068,672 B at
    // 196,608 B a token, in blocks of 16).
    assert_eq!(format!("{:.2}", a.kv_bytes as f64 / GIB), "44.30");
    assert_eq!(tokens, 241_904);
}

//! Expert and data parallel under vLLM 0.21-0.33 (docs/reading/vllm-expert-parallel-v1.md):
//! from 0.21 the unquantized method owns its modular kernel, so each replica routes its own
//! tokens and `MoEPrepareAndFinalizeNaiveDPEPModular` gathers the hidden states and the top-k
//! weights and ids (not the router's logits, as 0.19's runner did); the expert map's remap
//! tensor goes in 0.31, the combine's temporary in 0.33. The sequence-parallel MoE that vLLM
//! runs for Qwen3-MoE, DeepSeek, Llama 4, gpt-oss and Qwen3-Next with expert parallel over
//! several TP ranks and DP replicas is refused by name in every release.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::memory::EventKind;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;

fn request(
    model: &str,
    device: &str,
    vllm: &str,
    (tp, dp, ep): (u32, u32, bool),
) -> ProfileRequest {
    ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse(device).unwrap(),
        vllm: vllm.into(),
        tp,
        dp,
        enable_expert_parallel: ep,
        max_model_len: 8192,
        tokens: 8192,
        seqs: 256,
        verify: false,
        ..ProfileRequest::default()
    }
}

fn run(req: &ProfileRequest) -> Result<Report, String> {
    profile::run(req, None, Arc::new(AtomicBool::new(false))).map_err(|e| e.to_string())
}

/// The allocations and frees of one MoE layer's `moe.` tensors in the profile pass.
fn layer_moe(r: &Report, layer: usize) -> Vec<(bool, String, u64)> {
    let prefix = format!("layers.{layer}.moe.");
    r.events
        .iter()
        .filter(|e| e.pass == 1 && e.tensor.starts_with(&prefix))
        .filter(|e| matches!(e.kind, EventKind::Alloc | EventKind::Free))
        .map(|e| {
            (
                e.kind == EventKind::Alloc,
                e.tensor[prefix.len()..].to_string(),
                e.bytes,
            )
        })
        .collect()
}

fn workspace(r: &Report) -> Vec<u64> {
    r.events
        .iter()
        .filter(|e| e.pass == 1 && e.kind == EventKind::Alloc && e.tensor == "moe.workspace")
        .map(|e| e.bytes)
        .collect()
}

fn r256(v: u64) -> u64 {
    v.div_ceil(256) * 256
}

/// Mixtral-8x7B at TP 2 with expert parallel on two A100s (Triton: the oracle's FlashInfer
/// backends do not take compute capability 8.0). EP alone (DP 1) takes `MoEPrepareAndFinalize
/// NoDPEPModular`: no dispatch; each rank holds 4 whole experts of the full width I = 14336
/// (N = 2I), so the workspace is twice TP-without-EP's: r256(2·M·k·max(I, H)) +
/// r256(2·M·k·max(2I, H)) with M = 8192, k = 2, H = 4096: 469,762,048 + 939,524,096 =
/// 1,409,286,144 B (1344 MiB). `moe_align_block_size` maps the expert ids through the expert map into a new tensor
/// under 0.21-0.29 (moe_align_block_size.py 0.21.0 L100-101) and not from 0.31
/// (`ignore_invalid_experts`).
#[test]
fn mixtral_with_expert_parallel_alone_remaps_its_expert_ids_until_0_31() {
    let (h, i, k) = (4096u64, 14336u64, 2u64);
    for (vllm, remap) in [
        ("0.21", true),
        ("0.24", true),
        ("0.29", true),
        ("0.31", false),
        ("0.33", false),
    ] {
        let r = run(&request(
            "preset:mixtral-8x7b",
            "sim:a100-80gb:dry",
            vllm,
            (2, 1, true),
        ))
        .unwrap_or_else(|e| panic!("{vllm}: {e}"));
        let l = layer_moe(&r, 3);
        let out = l.iter().find(|x| x.0 && x.1 == "output").unwrap().2;
        let m = out / (h * 2);
        let w = r256(2 * m * k * i.max(h)) + r256(2 * m * k * (2 * i).max(h));
        assert_eq!(
            workspace(&r),
            [w],
            "{vllm}: one workspace, sized for the full width"
        );
        let mapped = l.iter().any(|x| x.0 && x.1 == "expert_ids_mapped");
        assert_eq!(mapped, remap, "{vllm}: {l:?}");
        // No dispatch with one replica.
        assert!(
            !l.iter().any(|x| x.1.starts_with("dispatched")),
            "{vllm}: {l:?}"
        );
        if vllm == "0.21" {
            assert_eq!(m, 8192);
            assert_eq!(w, 1_409_286_144);
        }
    }
}

/// Qwen3-30B-A3B with DP 2 and expert parallel (TP 1) on A100s: each replica routes its own
/// M tokens (the gate inside the op from 0.21), allocates the output `[M, H]` from its input,
/// then gathers `[2M, H]` hidden states, `[2M, k]` f32 weights and `[2M, k]` i32 ids (0.21.0
/// naive_dp_ep.py L112-184); the workspace and the alignment over 2M tokens; the combine into
/// a new `[M, H]` copied into the output (to 0.31; 0.33 reduce-scatters into the output); the
/// gathered ids, weights and hidden states die as `apply` returns, the local routing after.
/// By hand, M = 8192, H = 2048, k = 8, E = 128 (64 a rank), I = 768: the workspace
/// r256(2·2M·k·max(I, H)) + r256(2·2M·k·max(2I, H)) = 536,870,912 + 536,870,912.
#[test]
fn qwen3_moe_with_data_and_expert_parallel_routes_before_the_dispatch_from_0_21() {
    let (h, k, e) = (2048u64, 8u64, 128u64);
    for vllm in ["0.21", "0.28", "0.31", "0.33"] {
        let r = run(&request(
            "preset:qwen3-30b-a3b",
            "sim:a100-80gb:dry",
            vllm,
            (1, 2, true),
        ))
        .unwrap_or_else(|e| panic!("{vllm}: {e}"));
        let l = layer_moe(&r, 3);
        let m = l.iter().find(|x| x.0 && x.1 == "output").unwrap().2 / (h * 2);
        assert_eq!(m, 8192, "{vllm}");
        let (mh, mk) = (m * h * 2, m * k * 4);
        let names: Vec<&str> = l.iter().map(|x| x.1.as_str()).collect();
        let pos = |a: bool, n: &str| {
            l.iter()
                .position(|x| x.0 == a && x.1 == n)
                .unwrap_or_else(|| panic!("{vllm}: no {n} in {names:?}"))
        };
        // The routing on this replica's tokens, then the output, then the gather.
        assert_eq!(l[pos(true, "router_logits")].2, m * e * 2, "{vllm}");
        assert_eq!(l[pos(true, "topk_ids")].2, mk, "{vllm}");
        assert!(pos(true, "topk_ids") < pos(true, "output"), "{vllm}");
        let gathered = [
            ("dispatched_hidden_states", 2 * mh),
            ("dispatched_topk_weights", 2 * mk),
            ("dispatched_topk_ids", 2 * mk),
        ];
        let at = pos(true, "output");
        for (j, (n, b)) in gathered.iter().enumerate() {
            assert_eq!(
                (pos(true, n), l[pos(true, n)].2),
                (at + 1 + j, *b),
                "{vllm}"
            );
        }
        // No gathered router logits (0.19's runner gathered them).
        assert!(!names.contains(&"dispatched_router_logits"), "{vllm}");
        // The alignment over the 2M gathered tokens: (2M·k + E·(B − 1)) slots.
        let sorted = l[pos(true, "sorted_ids")].2;
        assert!(
            sorted >= 2 * m * k * 4 && sorted < (2 * m * k + e * 256) * 4 + 512,
            "{vllm}"
        );
        assert_eq!(
            names.contains(&"expert_ids_mapped"),
            vllm != "0.31" && vllm != "0.33"
        );
        // The combine's temporary until 0.31, then the gathered tensors die.
        let combined = names.contains(&"combined");
        assert_eq!(combined, vllm != "0.33", "{vllm}");
        if combined {
            assert_eq!(l[pos(true, "combined")].2, mh);
            assert_eq!(pos(false, "combined"), pos(true, "combined") + 1);
        }
        let frees: Vec<usize> = [
            "dispatched_topk_ids",
            "dispatched_topk_weights",
            "dispatched_hidden_states",
            "topk_weights",
        ]
        .iter()
        .map(|n| pos(false, n))
        .collect();
        assert!(frees.windows(2).all(|w| w[0] < w[1]), "{vllm}: {frees:?}");
        let w = r256(2 * 2 * m * k * 768u64.max(h)) + r256(2 * 2 * m * k * 1536u64.max(h));
        assert_eq!(workspace(&r), [w], "{vllm}");
        assert_eq!(w, 1_073_741_824);
    }
}

/// Qwen1.5-MoE-A2.7B with DP 2 under 0.21 and 0.33 on A100s: the shared expert runs inside
/// the op on this replica's M tokens before the routing (`NO_OVERLAP`: the naive DP/EP
/// prepare/finalize cannot overlap, 0.21.0 modular_kernel.py L242-247,
/// runner/shared_experts.py L92-112), then the routing on the M tokens, the output, the
/// gather of `[2M, H]`, `[2M, k]` and `[2M, k]`, the experts, and after the op the sum
/// `shared + routed` (runner/moe_runner.py). Under 0.19 (the runner's dispatch) a shared
/// expert with data parallel is refused by name.
#[test]
fn qwen2_moe_with_data_parallel_runs_its_shared_expert_on_the_replicas_tokens_from_0_21() {
    let dir = common::qwen1_5_moe_dir();
    let model = dir.path().to_str().unwrap();
    let (m, h) = (8192u64, 2048u64);
    for vllm in ["0.21", "0.33"] {
        let r = run(&request(model, "sim:a100-80gb:dry", vllm, (1, 2, false)))
            .unwrap_or_else(|e| panic!("{vllm}: {e}"));
        let l: Vec<(bool, String, u64)> = r
            .events
            .iter()
            .filter(|e| e.pass == 1 && matches!(e.kind, EventKind::Alloc | EventKind::Free))
            .filter(|e| {
                e.tensor.starts_with("layers.3.moe.")
                    || e.tensor.starts_with("layers.3.shared_expert")
            })
            .map(|e| {
                (
                    e.kind == EventKind::Alloc,
                    e.tensor["layers.3.".len()..].to_string(),
                    e.bytes,
                )
            })
            .collect();
        let pos = |a: bool, n: &str| {
            l.iter()
                .position(|x| x.0 == a && x.1 == n)
                .unwrap_or_else(|| panic!("{vllm}: no {n} in {l:?}"))
        };
        assert_eq!(l[pos(true, "shared_expert.gated")].2, m * h * 2, "{vllm}");
        assert!(
            pos(true, "shared_expert.gated") < pos(true, "moe.topk_ids"),
            "{vllm}"
        );
        assert!(
            pos(true, "moe.output") < pos(true, "moe.dispatched_hidden_states"),
            "{vllm}"
        );
        assert_eq!(
            l[pos(true, "moe.dispatched_hidden_states")].2,
            2 * m * h * 2,
            "{vllm}"
        );
        assert_eq!(l[pos(true, "moe.output")].2, m * h * 2, "{vllm}");
        assert!(
            pos(false, "moe.dispatched_hidden_states") < pos(true, "moe.plus_shared"),
            "{vllm}"
        );
    }
    let e = run(&request(model, "sim:a100-80gb:dry", "0.19", (1, 2, false))).unwrap_err();
    assert!(
        e.contains("shared expert") && e.contains("data parallel from 0.21"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// What vLLM runs differently is refused in one line naming it: the sequence-parallel MoE
/// (Qwen3-MoE with expert parallel over TP 2 and DP 2; `use_sequence_parallel_moe`, 0.19.0
/// config/parallel.py L530-543) in every V1 release. FlashInfer's CUTLASS experts with
/// expert parallel alone on Hopper under 0.21 (with DP 2 the oracle moves them behind Triton)
/// and DeepSeek's block with data parallel from 0.21 answer.
#[test]
fn what_expert_and_data_parallel_do_not_model_is_named_in_one_line() {
    let one_line = |e: &str| assert_eq!(e.lines().count(), 1, "{e}");
    for vllm in ["0.11", "0.19", "0.21", "0.29", "0.33"] {
        let e = run(&request(
            "preset:qwen3-30b-a3b",
            "sim:a100-80gb:dry",
            vllm,
            (2, 2, true),
        ))
        .unwrap_err();
        assert!(
            e.contains("sequence-parallel") && e.contains("qwen3_moe"),
            "{vllm}: {e}"
        );
        one_line(&e);
    }
    // Mixtral has no sequence-parallel path: TP 2 × DP 2 with EP runs.
    assert!(run(&request(
        "preset:mixtral-8x7b",
        "sim:a100-80gb:dry",
        "0.21",
        (2, 2, true)
    ))
    .is_ok());
    // FlashInfer's CUTLASS experts with expert parallel alone on Hopper under 0.21 (modelled:
    // docs/reading/vllm-flashinfer-cutlass-moe.md), Triton with DP 2.
    for (tp, dp) in [(2, 1), (1, 2)] {
        assert!(run(&request(
            "preset:mixtral-8x7b",
            "sim:h100-sxm:dry",
            "0.21",
            (tp, dp, true)
        ))
        .is_ok());
    }
    // DeepSeek's block with data parallel from 0.21 (tests/moe_v1_oracle.rs).
    assert!(run(&request(
        "preset:deepseek-v2-lite",
        "sim:a100-80gb:dry",
        "0.24",
        (1, 2, false),
    ))
    .is_ok());
}

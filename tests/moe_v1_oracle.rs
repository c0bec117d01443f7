//! Mixture of experts under vLLM 0.21 and later: `select_unquantized_moe_backend` (0.21.0
//! fused_moe/oracle/unquantized.py) picks the experts per GPU. Triton's modular kernel, as
//! 0.19 runs it plus 0.21's runner and workspace manager, is reproduced where it runs (Ampere
//! and Ada under 0.21 and 0.22, Hopper too under 0.23-0.33, from 0.29 on Model Runner V2:
//! tests/moe_v2_runner.rs); FlashInfer's CUTLASS experts, what 0.21 and 0.22 run on Hopper,
//! are reproduced from their reading (docs/reading/vllm-flashinfer-cutlass-moe.md); its
//! experts on Blackwell are refused by name.

mod common;

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::memory::EventKind;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;

use common::cli::Row;

/// `common::cli::plan_csv` on a pasted line (`vllm serve MODEL EXTRA…`, words split at spaces).
fn plan_csv(device: &str, vllm: &str, line: &str) -> (Option<i32>, String, Vec<Row>) {
    common::cli::plan_csv(device, vllm, &line.split(' ').collect::<Vec<_>>())
}

/// The allocations and frees of one MoE layer in the profile pass (pass 1), as
/// (alloc?, tensor, bytes).
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

/// `vllm serve Qwen/Qwen3-30B-A3B` on an A100 80GB under 0.21: FlashInfer's experts need
/// compute capability 9.0 or more (0.21.0 experts/flashinfer_cutlass_moe.py L124-136,
/// trtllm_bf16_moe.py L45-53), so the oracle falls to TRITON (oracle/unquantized.py
/// L282-291): the modular kernel over `TritonExperts` (experts/triton_moe.py L129-144).
/// `vllm serve` on an A100 profiles 2048 tokens (engine/arg_utils.py: 8192 only off the A100).
/// By hand, M = 2048, k = 8, I = 768, H = 2048, E = 128:
/// - the workspace (modular_kernel.py L1041-1102, one region shared by workspace13 and the
///   output, then workspace2): r256(2·M·k·max(I, H)) + r256(2·M·k·max(2I, H))
///   = 2 · 2·2048·8·2048 = 134,217,728 B (128 MiB), made once in layer 0 of the profile pass;
///   0.21's manager empties the cache before it (v1/worker/workspace.py L164-179: the
///   segments the load left cached are returned first), 0.19's does not;
/// - per layer: the router's logits [M, E] bf16 = 524,288 B (inside the op under 0.21:
///   qwen3_moe.py hands `gate` to `FusedMoE`), `fused_topk`'s three [M, k] f32/i32 = 65,536 B
///   each (router/fused_topk_router.py L78-90), the output `empty_like` [M, H] bf16 =
///   8,388,608 B (modular_kernel.py L1395), `moe_align_block_size`'s sorted ids over
///   M·k + E·(BSM − 1) slots with BSM = 128 (no E=128,N=768 file for the A100 in the wheel:
///   `get_default_config`, 128 above 512 tokens) = (16384 + 16256)·4 = 130,560 B, the expert
///   ids ⌈32640/128⌉·4 = 1,020 → 1,024 B and one i32 → 512 B (the allocator's rounding).
#[test]
fn qwen3_30b_under_0_21_on_an_a100_runs_triton_through_the_binary() {
    let line = "vllm serve preset:qwen3-30b-a3b";
    let (code, err, rows) = plan_csv("sim:a100-sxm4-80gb:dry", "0.21", line);
    assert_eq!(code, Some(0), "{err}");
    let (m, k, i, h, e) = (2048u64, 8u64, 768u64, 2048u64, 128u64);
    let want = r256(2 * m * k * i.max(h)) + r256(2 * m * k * (2 * i).max(h));
    assert_eq!(want, 134_217_728);
    let ws: Vec<&Row> = rows
        .iter()
        .filter(|r| r.4 == "moe.workspace" && (r.1 == "alloc" || r.1 == "free"))
        .collect();
    assert_eq!(ws.len(), 1, "{ws:?}");
    assert_eq!((ws[0].0, ws[0].3.as_str(), ws[0].5), (1, "0", want));
    // The cache emptied as the manager grows its buffer, right before the new segment.
    let at = rows
        .iter()
        .position(|r| r.4 == "moe.workspace" && r.1 == "alloc")
        .unwrap();
    let emptied: Vec<&Row> = rows[..at]
        .iter()
        .filter(|r| r.2 == "moe.workspace" && r.4 == "empty_cache")
        .collect();
    assert!(!emptied.is_empty() && emptied.iter().all(|r| r.1 == "segment-unmap"));
    let p = m * k + e * (128 - 1);
    let mk = m * k * 4;
    let t = |a: bool, n: &str, b: u64| (a, format!("layers.5.moe.{n}"), b);
    let want5 = vec![
        t(true, "router_logits", m * e * 2),
        t(true, "topk_weights", mk),
        t(true, "topk_ids", mk),
        t(true, "token_expert_indices", mk),
        t(false, "token_expert_indices", mk),
        t(true, "output", m * h * 2),
        t(true, "sorted_ids", p * 4),
        t(true, "expert_ids", 1024),
        t(true, "num_tokens_post_pad", 512),
        t(false, "sorted_ids", p * 4),
        t(false, "expert_ids", 1024),
        t(false, "num_tokens_post_pad", 512),
        t(false, "topk_weights", mk),
        t(false, "topk_ids", mk),
        t(false, "router_logits", m * e * 2),
        // Layer 5's hidden states: they die in layer 6.
        t(false, "output", m * h * 2),
    ];
    assert_eq!(layer_moe(&rows, 5), want5);
    assert_eq!(p * 4, 130_560);
    // 0.19 on the same GPU: the same buffers, no emptied cache.
    let (code, err, rows19) = plan_csv("sim:a100-sxm4-80gb:dry", "0.19", line);
    assert_eq!(code, Some(0), "{err}");
    assert!(!rows19
        .iter()
        .any(|r| r.2 == "moe.workspace" && r.4 == "empty_cache"));
    assert_eq!(layer_moe(&rows19, 5), want5);
    // The line docs/models.md shows, as written there.
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "plan",
            "--device",
            "sim:a100-sxm4-80gb:dry",
            "--vllm",
            "0.21",
            "--",
            "vllm",
            "serve",
            "preset:qwen3-30b-a3b",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("INFO gpu_worker.py] Available KV cache memory: ")
            && text.contains("2048 tokens in 256 seq(s)"),
        "{text}"
    );
}

/// Mixtral-8x7B over 4 L40S under 0.21: each rank's experts are 14336/4 = 3584 wide, and the
/// wheel has `E=8,N=3584,device_name=NVIDIA_L40S.json` (0.21.0 fused_moe/configs/, the same
/// bytes in 0.22.1-0.25.1), whose key nearest 2048 tokens is 2048 → BLOCK_SIZE_M 64. By hand,
/// M = 2048, k = 2, I = 3584, H = 4096, E = 8: sorted ids (M·k + E·63)·4 = (4096 + 504)·4 =
/// 18,400 → 18,432 B; the workspace r256(2·M·k·max(I, H)) + r256(2·M·k·max(2I, H)) =
/// 33,554,432 + 58,720,256 = 92,274,688 B. Mixtral keeps its gate outside the op
/// (mixtral.py `MixtralMoE.forward`), so the all-reduce's new tensor comes before the logits
/// die. vramscope's 0.19 row reads 0.8.5's Hopper files only (byte for byte as before) and
/// takes the default 128 here: (4096 + 8·127)·4 = 20,448 → 20,480 B.
#[test]
fn mixtral_over_4_l40s_under_0_21_reads_the_l40s_tuned_file() {
    let line = "vllm serve preset:mixtral-8x7b --tensor-parallel-size 4";
    let (code, err, rows) = plan_csv("sim:l40s:dry", "0.21", line);
    assert_eq!(code, Some(0), "{err}");
    let ws: Vec<u64> = rows
        .iter()
        .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
        .map(|r| r.5)
        .collect();
    assert_eq!(ws, [92_274_688]);
    let l5 = layer_moe(&rows, 5);
    let sorted: Vec<u64> = l5
        .iter()
        .filter(|(a, n, _)| *a && n.ends_with(".sorted_ids"))
        .map(|x| x.2)
        .collect();
    assert_eq!(sorted, [18_432]);
    let pos = |alloc: bool, name: &str| {
        l5.iter()
            .position(|(a, n, _)| *a == alloc && n == &format!("layers.5.moe.{name}"))
            .unwrap()
    };
    assert!(pos(true, "all_reduce") < pos(false, "router_logits"));
    let (code, err, rows19) = plan_csv("sim:l40s:dry", "0.19", line);
    assert_eq!(code, Some(0), "{err}");
    let sorted19: Vec<u64> = layer_moe(&rows19, 5)
        .iter()
        .filter(|(a, n, _)| *a && n.ends_with(".sorted_ids"))
        .map(|x| x.2)
        .collect();
    assert_eq!(sorted19, [20_480]);
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

/// Qwen3-MoE hands its gate to `FusedMoE` from 0.21 (qwen3_moe.py), so the router's logits
/// are made inside the op (runner/moe_runner.py `_forward_impl`) and die as it returns, before
/// the tensor-parallel all-reduce outside it (`_maybe_reduce_final_output`); under 0.19 they
/// live until the block returns, after the all-reduce's new tensor. Two A100s: 2048 tokens,
/// logits [2048, 128] bf16 = 524,288 B, the all-reduce's output [2048, 2048] bf16 = 8 MiB.
#[test]
fn qwen3_logits_die_before_the_all_reduce_from_0_21() {
    let order = |vllm: &str| {
        let r = run(&request(
            "preset:qwen3-30b-a3b",
            "sim:a100-sxm4-80gb:dry",
            vllm,
            2,
        ))
        .unwrap();
        r.events
            .iter()
            .filter(|e| e.pass == 1 && e.layer == Some(5))
            .filter(|e| {
                (e.kind == EventKind::Free && e.tensor == "layers.5.moe.router_logits")
                    || (e.kind == EventKind::Alloc && e.tensor == "layers.5.moe.all_reduce")
            })
            .map(|e| (e.tensor.clone(), e.bytes))
            .collect::<Vec<_>>()
    };
    let logits = ("layers.5.moe.router_logits".to_string(), 2048 * 128 * 2);
    let reduced = ("layers.5.moe.all_reduce".to_string(), 2048 * 2048 * 2);
    assert_eq!(order("0.21"), [logits.clone(), reduced.clone()]);
    assert_eq!(order("0.22"), [logits.clone(), reduced.clone()]);
    assert_eq!(order("0.19"), [reduced, logits]);
}

/// 0.23 moves FlashInfer's experts behind Triton on Hopper (0.23.0 oracle/unquantized.py
/// L71-75; 0.24.0 L70-74; 0.26.0-0.28.0 L75-79), so Qwen3-30B-A3B on an H100 runs the same
/// modular kernel under 0.23 to 0.28: 8192 tokens (an H100 is 70 GiB or more and not an A100), workspace 2 · 2·8192·8·2048 = 536,870,912 B (512 MiB);
/// no E=128,N=768 file for the H100 in the wheel, so BSM 128: sorted ids
/// (65536 + 128·127)·4 = 327,168 B. The same line under 0.22 is refused: FlashInfer's CUTLASS
/// MoE runs there.
#[test]
fn qwen3_30b_from_0_23_on_an_h100_runs_triton() {
    let line = "vllm serve preset:qwen3-30b-a3b";
    let (code, err, rows) = plan_csv("sim:h100-sxm:dry", "0.23", line);
    assert_eq!(code, Some(0), "{err}");
    let ws: Vec<(u32, String, u64)> = rows
        .iter()
        .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
        .map(|r| (r.0, r.3.clone(), r.5))
        .collect();
    assert_eq!(ws, [(1, "0".to_string(), 536_870_912)]);
    let sorted: Vec<u64> = layer_moe(&rows, 5)
        .iter()
        .filter(|(a, n, _)| *a && n.ends_with(".sorted_ids"))
        .map(|x| x.2)
        .collect();
    assert_eq!(sorted, [(65_536 + 128 * 127) * 4]);
    // 0.24 wraps the experts in `RoutedExperts` under a `MoERunner`, 0.25 and 0.26 change
    // their loaders and padding options, 0.27 writes the sum straight into the output, 0.28
    // refactors the activation and gives the workspace manager lanes: the same allocations
    // (0.27 and 0.28 budget them with #49208's formula).
    for vllm in ["0.24", "0.25", "0.26", "0.27", "0.28"] {
        let (code, err, later) = plan_csv("sim:h100-sxm:dry", vllm, line);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(layer_moe(&later, 5), layer_moe(&rows, 5), "{vllm}");
        assert_eq!(
            later
                .iter()
                .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
                .map(|r| r.5)
                .collect::<Vec<_>>(),
            [536_870_912],
            "{vllm}"
        );
    }
}

/// `vllm serve Qwen/Qwen3-30B-A3B` on an H100 SXM (132 SMs) under 0.21 and 0.22: the oracle
/// takes FlashInfer's CUTLASS MoE (docs/reading/vllm-flashinfer-cutlass-moe.md). By hand, M =
/// 8192, k = 8, I = 768, H = 2048, E = 128, R = k·M = 65,536:
/// - load: each layer's `w13` flipped into a new `[128, 1536, 2048]` bf16 (805,306,368 B), the
///   old one freed (`swap_w13_to_w31`, §2);
/// - the manager's buffer r256(2·M·H) = 33,554,432 B, once (Triton's: 536,870,912);
/// - per layer after the routing and the output: `[1]` i32 (512 B, the allocator's smallest
///   block), `experts_to_token_score [E, M]` f32 = 4,194,304 B, `[E]` i32 (512 B), then the
///   C++ workspace: 3·r128(4R) + 2·r128(4·E·8) + r128(4·E·M) + r128(8·129) + r128(2R·H) +
///   r128(2R·max(2I, H)) + 2·r128(8E) + 2·27,136 + 512·132 = 786,432 + 8,192 + 4,194,304 +
///   1,152 + 268,435,456 + 268,435,456 + 2,048 + 54,272 + 67,584 = 541,984,896, plus r128(4R)
///   = 262,144: 542,247,040 B, in a new 2 MiB-rounded segment of 543,162,368 B whose 914,944 B
///   left over (under 1 MiB) the allocator does not split off; freed as the op returns, then the
///   three last first; no alignment buffers.
#[test]
fn qwen3_30b_under_0_21_and_0_22_on_an_h100_runs_flashinfers_cutlass_moe() {
    let line = "vllm serve preset:qwen3-30b-a3b";
    let (m, k, e, h) = (8192u64, 8u64, 128u64, 2048u64);
    let mk = m * k * 4;
    let t = |a: bool, n: &str, b: u64| (a, format!("layers.5.moe.{n}"), b);
    let want5 = vec![
        t(true, "router_logits", m * e * 2),
        t(true, "topk_weights", mk),
        t(true, "topk_ids", mk),
        t(true, "token_expert_indices", mk),
        t(false, "token_expert_indices", mk),
        t(true, "output", m * h * 2),
        t(true, "num_active_experts_per_node", 512),
        t(true, "experts_to_token_score", 4 * e * m),
        t(true, "active_expert_global_ids", 512),
        t(true, "flashinfer_workspace", 543_162_368),
        t(false, "flashinfer_workspace", 543_162_368),
        t(false, "active_expert_global_ids", 512),
        t(false, "experts_to_token_score", 4 * e * m),
        t(false, "num_active_experts_per_node", 512),
        t(false, "topk_weights", mk),
        t(false, "topk_ids", mk),
        t(false, "router_logits", m * e * 2),
        t(false, "output", m * h * 2),
    ];
    assert_eq!(
        542_247_040u64.div_ceil(2 << 20) * (2 << 20),
        543_162_368,
        "one 2 MiB-rounded segment"
    );
    for vllm in ["0.21", "0.22"] {
        let (code, err, rows) = plan_csv("sim:h100-sxm:dry", vllm, line);
        assert_eq!(code, Some(0), "{vllm}: {err}");
        assert_eq!(layer_moe(&rows, 5), want5, "{vllm}");
        let ws: Vec<u64> = rows
            .iter()
            .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
            .map(|r| r.5)
            .collect();
        assert_eq!(ws, [33_554_432], "{vllm}");
        // The load's flips: one new w13 and the old one freed, per layer, 48 layers.
        let flips: Vec<(&str, u64)> = rows
            .iter()
            .filter(|r| r.0 == 0 && r.2 == "process_weights_after_loading")
            .filter(|r| r.1 == "alloc" || r.1 == "free")
            .map(|r| (r.1.as_str(), r.5))
            .collect();
        assert_eq!(flips.len(), 96, "{vllm}");
        assert!(flips
            .chunks(2)
            .all(|p| p == [("alloc", 805_306_368), ("free", 805_306_368)]));
    }
}

/// What stays refused, each by name: FlashInfer's experts on Blackwell (TRT-LLM's on the
/// B200), and data or expert parallel (0.21's
/// prepare/finalize). The releases from 0.29 answer (tests/moe_v2_runner.rs).
#[test]
fn what_0_21_and_later_refuse_is_named() {
    let refused = |model: &str, device: &str, vllm: &str, tp: u32| {
        run(&request(model, device, vllm, tp)).unwrap_err()
    };
    let e = refused("preset:mixtral-8x7b", "sim:b200:dry", "0.23", 1);
    assert!(
        e.contains("FlashInfer's TRT-LLM BF16 MoE") && e.contains("Hopper"),
        "{e}"
    );
    for vllm in ["0.29", "0.31", "0.33"] {
        assert!(run(&request(
            "preset:qwen3-30b-a3b",
            "sim:a100-sxm4-80gb:dry",
            vllm,
            1
        ))
        .is_ok());
    }
    // 0.33's TRITON_MLA (below Hopper) answers: its workspace reserve is modelled
    // (tests/mla_v1.rs).
    assert!(run(&request(
        "preset:deepseek-v2-lite",
        "sim:a100-sxm4-80gb:dry",
        "0.33",
        1
    ))
    .is_ok());
    // Data and expert parallel from 0.21 are read for DeepSeek's block too; with both over
    // more than one tensor-parallel rank vLLM runs the MoE sequence-parallel: refused.
    let mut dp = request(
        "preset:deepseek-v2-lite",
        "sim:a100-sxm4-80gb:dry",
        "0.21",
        1,
    );
    dp.dp = 2;
    assert!(run(&dp).is_ok());
    let mut ep = request(
        "preset:deepseek-v2-lite",
        "sim:a100-sxm4-80gb:dry",
        "0.21",
        2,
    );
    ep.enable_expert_parallel = true;
    assert!(run(&ep).is_ok());
    ep.dp = 2;
    let e = run(&ep).unwrap_err();
    assert!(e.contains("use_sequence_parallel_moe"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// DeepSeek-V2-Lite on an A100 under 0.21 (Triton: FlashInfer wants compute capability 9.0).
/// 0.21's `DeepseekV2MoE` hands the gate, the shared experts and the routed scaling to
/// `FusedMoE` (deepseek_v2.py), and `MoERunner.forward` (runner/moe_runner.py) adds the shared
/// output to the routed one out of place (`result = shared_output + fused_output`) where 0.19's
/// block added in place (`final_hidden_states += shared_output`); the factor is 1.0 for
/// V2-Lite, so no scaling. By hand, M = 2048 (an A100), k = 6, I = 1408, H = 2048, E = 64:
/// workspace r256(2·M·k·max(I, H)) + r256(2·M·k·max(2I, H)) = 50,331,648 + 69,206,016 =
/// 119,537,664 B; sorted ids (M·k + E·127)·4 = (12288 + 8128)·4 = 81,664 → 81,920 B (no
/// E=64,N=1408 file: BSM 128); the sum [M, H] bf16 = 8,388,608 B, the shared output and the
/// routed output dying after it (the runner's locals, in that order), the sum living on as
/// layer 5's hidden states until layer 6.
#[test]
fn deepseek_v2_lite_under_0_21_adds_the_shared_output_out_of_place() {
    let line = "vllm serve preset:deepseek-v2-lite";
    let (code, err, rows) = plan_csv("sim:a100-sxm4-80gb:dry", "0.21", line);
    assert_eq!(code, Some(0), "{err}");
    let ws: Vec<u64> = rows
        .iter()
        .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
        .map(|r| r.5)
        .collect();
    assert_eq!(ws, [119_537_664]);
    let tail = |rows: &[Row]| {
        let l5 = layer_moe_and_shared(rows, 5);
        let at = l5
            .iter()
            .position(|(a, n, _)| !a && n == "layers.5.moe.router_logits")
            .unwrap();
        l5[at..].to_vec()
    };
    let mh = 2048 * 2048 * 2;
    let t = |a: bool, n: &str, b: u64| (a, format!("layers.5.{n}"), b);
    assert_eq!(
        tail(&rows),
        [
            t(false, "moe.router_logits", 2048 * 64 * 2),
            t(true, "moe.plus_shared", mh),
            t(false, "shared_experts.down_proj.out", mh),
            t(false, "moe.output", mh),
            t(false, "moe.plus_shared", mh),
        ]
    );
    let sorted: Vec<u64> = layer_moe(&rows, 5)
        .iter()
        .filter(|(a, n, _)| *a && n.ends_with(".sorted_ids"))
        .map(|x| x.2)
        .collect();
    assert_eq!(sorted, [81_920]);
    // 0.19: the shared output added in place, the routed output living on instead.
    let (code, err, rows19) = plan_csv("sim:a100-sxm4-80gb:dry", "0.19", line);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        tail(&rows19),
        [
            t(false, "moe.router_logits", 2048 * 64 * 2),
            t(false, "shared_experts.down_proj.out", mh),
            t(false, "moe.output", mh),
        ]
    );
}

/// `layer_moe` with the shared experts' tensors.
fn layer_moe_and_shared(rows: &[Row], layer: usize) -> Vec<(bool, String, u64)> {
    let (moe, shared) = (
        format!("layers.{layer}.moe."),
        format!("layers.{layer}.shared_experts."),
    );
    rows.iter()
        .filter(|r| r.0 == 1 && (r.4.starts_with(&moe) || r.4.starts_with(&shared)))
        .filter(|r| r.1 == "alloc" || r.1 == "free")
        .map(|r| (r.1 == "alloc", r.4.clone(), r.5))
        .collect()
}

/// DeepSeek-V2-Lite on an H100 from 0.24 to 0.33 (docs/reading/vllm-deepseek-v2-runner.md;
/// Model Runner V2 from 0.24, FLASH_ATTN_MLA at 16, Triton's experts):
/// - 0.24 still imports FlashInfer-MLA's module with its 128 MiB workspace; 0.25.1 makes it on
///   the first decode (flashinfer_mla.py L31-46), so no such buffer from 0.25;
/// - through 0.24 layer 0 clones the embedding into the residual (deepseek_v2.py L1178); from
///   0.25.1 the embedding is the residual (L1282);
/// - from 0.27.1 the one-group router is a `FusedTopKRouter` (router_factory.py L148-196):
///   `fused_topk`'s `[M, k]` f32 weights where 0.26 ran the grouped chain, and
///   `kv_a_layernorm` runs before `q_proj` (layers/mla.py L176-194).
#[test]
fn deepseek_v2_lite_from_0_24_follows_each_release() {
    let line = "vllm serve preset:deepseek-v2-lite";
    let mut seen = Vec::new();
    for vllm in [
        "0.24", "0.25", "0.26", "0.27", "0.28", "0.29", "0.31", "0.33",
    ] {
        let (code, err, rows) = plan_csv("sim:h100-sxm:dry", vllm, line);
        assert_eq!(code, Some(0), "{vllm}: {err}");
        let has = |tensor: &str| rows.iter().any(|r| r.1 == "alloc" && r.4.contains(tensor));
        let fi = has("flashinfer_mla.g_fi_workspace");
        let clone = has("layers.0.residual");
        // Layer 1 is V2-Lite's first MoE layer (first_k_dense_replace 1).
        let moe = layer_moe(&rows, 1);
        let grouped = rows
            .iter()
            .any(|r| r.0 == 1 && r.2 == "moe.grouped_topk" && r.3 == "1");
        let fused = rows
            .iter()
            .any(|r| r.0 == 1 && r.2 == "moe.topk_softmax" && r.3 == "1");
        // Layer 0's attention in the profile pass: kv_a_layernorm's output before q_proj's.
        let at = |tensor: &str| {
            rows.iter()
                .position(|r| r.0 == 1 && r.1 == "alloc" && r.4.starts_with(tensor))
                .unwrap_or_else(|| panic!("{vllm}: no {tensor}"))
        };
        let kv_first = at("layers.0.kv_a_layernorm") < at("layers.0.q_proj");
        assert!(!moe.is_empty(), "{vllm}");
        seen.push((vllm, fi, clone, grouped, fused, kv_first));
    }
    assert_eq!(
        seen,
        vec![
            ("0.24", true, true, true, false, false),
            ("0.25", false, false, true, false, false),
            ("0.26", false, false, true, false, false),
            ("0.27", false, false, false, true, true),
            ("0.28", false, false, false, true, true),
            ("0.29", false, false, false, true, true),
            ("0.31", false, false, false, true, true),
            ("0.33", false, false, false, true, true),
        ]
    );
}

/// Llama-4-Scout's language model (`model_type: llama4_text`, its config's `text_config`).
const SCOUT_TEXT: &str = r#"{"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text",
    "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 202048, "num_local_experts": 16, "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 1, "attention_chunk_size": 8192, "use_qk_norm": true,
    "attn_temperature_tuning": 4, "floor_scale": 8192, "attn_scale": 0.1,
    "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "rms_norm_eps": 1e-05, "max_position_embeddings": 10485760, "tie_word_embeddings": false,
    "attention_bias": false, "hidden_act": "silu", "torch_dtype": "bfloat16"}"#;

/// Llama 4's MoE block under the modular kernel (0.19, and 0.21-0.33 where Triton runs,
/// docs/reading/vllm-llama4-v1.md): `prepare` applies the router weight to a new copy of the
/// input (`a1 = a1 * topk_weights.to(a1.dtype)`, prepare_finalize/no_dp_ep.py L74): a `[M, 1]`
/// bf16 cast that dies at once and an `[M, H]` bf16 product, after the output and before the
/// workspace, alive until the op returns. Scout over 4 H100s: M = 8192, H = 5120, so
/// 83,886,080 bytes. 0.21 and 0.22 run FlashInfer's CUTLASS experts on Hopper after the same
/// copy; Llama 4 with its vision tower stays refused from 0.21.
#[test]
fn llama4_text_weights_its_input_into_a_copy_and_runs_from_0_21_where_triton_does() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), SCOUT_TEXT).unwrap();
    let line = format!(
        "vllm serve {} --tensor-parallel-size 4 --max-model-len 131072",
        dir.path().to_str().unwrap()
    );
    for (device, vllm) in [
        ("sim:h100-sxm:dry", "0.19"),
        ("sim:h100-sxm:dry", "0.23"),
        ("sim:a100-sxm4-80gb:dry", "0.21"),
        ("sim:h100-sxm:dry", "0.28"),
        ("sim:h100-sxm:dry", "0.33"),
    ] {
        let (code, err, rows) = plan_csv(device, vllm, &line);
        assert_eq!(code, Some(0), "{vllm}: {err}");
        let moe = layer_moe(&rows, 0);
        let names: Vec<&str> = moe
            .iter()
            .filter(|r| r.0)
            .map(|r| r.1.trim_start_matches("layers.0.moe."))
            .collect();
        let at = |n: &str| {
            names
                .iter()
                .position(|x| *x == n)
                .unwrap_or_else(|| panic!("{vllm}: no {n} in {names:?}"))
        };
        assert!(at("output") < at("a1_weighted"), "{vllm}: {names:?}");
        let m = if device.contains("a100") { 2048 } else { 8192 };
        let weighted = moe
            .iter()
            .find(|r| r.0 && r.1.ends_with("a1_weighted"))
            .unwrap();
        assert_eq!(weighted.2, m * 5120 * 2, "{vllm}");
        let cast = moe
            .iter()
            .find(|r| r.0 && r.1.ends_with("topk_weights.to(a1.dtype)"))
            .unwrap();
        assert_eq!(cast.2, m * 2, "{vllm}");
    }
    // 0.21 on Hopper: FlashInfer's CUTLASS experts after the same weighted copy.
    let (code, err, rows) = plan_csv("sim:h100-sxm:dry", "0.21", &line);
    assert_eq!(code, Some(0), "{err}");
    let names: Vec<String> = layer_moe(&rows, 0)
        .into_iter()
        .filter(|r| r.0)
        .map(|r| r.1)
        .collect();
    let at = |n: &str| names.iter().position(|x| x.ends_with(n)).unwrap();
    assert!(at("a1_weighted") < at("flashinfer_workspace"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.ends_with("sorted_ids")),
        "{names:?}"
    );
}

/// `vllm serve deepseek-ai/DeepSeek-V2-Lite -dp 2 --enable-expert-parallel` on A100s
/// (docs/reading/vllm-ep-deepseek-llama4-v021.md §3.2): the gate, the shared experts and the
/// routing on this replica's 2048 tokens, then the output and the dispatch of the hidden
/// states and the top-k weights and ids (`[2·2048, 2048]` bf16, `[4096, 6]` f32 and i32:
/// 16,777,216 and 98,304 B each); each rank holds 32 of the 64 experts at full width 1408, so
/// the workspace over Mg = 4096 tokens is r256(2·Mg·6·max(1408, 2048)) +
/// r256(2·Mg·6·max(2816, 2048)) = 100,663,296 + 138,412,032 = 239,075,328 B; the alignment's
/// ids are mapped through the expert map up to 0.29, the combine makes its `[2048, 2048]` up
/// to 0.31; no all-reduce (one tensor-parallel rank). 0.33's TRITON_MLA grows the same buffer
/// first.
#[test]
fn deepseek_v2_lite_with_data_and_expert_parallel_dispatches_after_its_routing() {
    let line = "vllm serve preset:deepseek-v2-lite -dp 2 --enable-expert-parallel";
    let (mg, k, h) = (4096u64, 6u64, 2048u64);
    assert_eq!(
        r256(2 * mg * k * 1408u64.max(h)) + r256(2 * mg * k * 2816u64.max(h)),
        239_075_328
    );
    for (vllm, mapped, combined) in [
        ("0.21", true, true),
        ("0.28", true, true),
        ("0.31", false, true),
        ("0.33", false, false),
    ] {
        let (code, err, rows) = plan_csv("sim:a100-sxm4-80gb:dry", vllm, line);
        assert_eq!(code, Some(0), "{vllm}: {err}");
        let ws: Vec<u64> = rows
            .iter()
            .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
            .map(|r| r.5)
            .collect();
        if vllm == "0.33" {
            // 0.33's TRITON_MLA (below Hopper) grows the shared buffer first, past what the
            // MoE needs (tests/families.rs).
            assert!(ws.len() == 1 && ws[0] > 239_075_328, "{ws:?}");
        } else {
            assert_eq!(ws, [239_075_328], "{vllm}");
        }
        let l5 = layer_moe_and_shared(&rows, 5);
        let at = |alloc: bool, n: &str| {
            l5.iter()
                .position(|r| r.0 == alloc && r.1.ends_with(n))
                .unwrap_or_else(|| panic!("{vllm}: no {n} in {l5:?}"))
        };
        let size = |n: &str| l5[at(true, n)].2;
        assert!(
            at(true, "router_logits") < at(true, "gate_up_proj.out"),
            "{vllm}"
        );
        assert!(
            at(true, "down_proj.out") < at(true, "moe.topk_ids"),
            "{vllm}"
        );
        assert!(at(true, "moe.topk_ids") < at(true, "moe.output"), "{vllm}");
        assert!(at(true, "moe.output") < at(true, "dispatched_hidden_states"));
        assert!(at(true, "dispatched_topk_ids") < at(true, "sorted_ids"));
        assert_eq!(size("dispatched_hidden_states"), mg * h * 2);
        assert_eq!(size("dispatched_topk_weights"), mg * k * 4);
        assert_eq!(size("dispatched_topk_ids"), mg * k * 4);
        assert_eq!(
            l5.iter().any(|r| r.1.ends_with("expert_ids_mapped")),
            mapped,
            "{vllm}"
        );
        assert_eq!(
            l5.iter().any(|r| r.1.ends_with("moe.combined")),
            combined,
            "{vllm}"
        );
        assert!(!l5.iter().any(|r| r.1.contains("all_reduce")), "{vllm}");
    }
}

/// Llama 4 Scout's language model with `-dp 2 --enable-expert-parallel` on H200s under 0.21
/// (Triton: the oracle puts FlashInfer's CUTLASS behind it with data parallel): `prepare`
/// weights this replica's input into a copy before the dispatch and gathers that copy
/// (naive_dp_ep.py 0.21.0 L125-131), which dies as `prepare` returns, before the workspace's
/// alignment; 8 experts a rank at width 8192 over Mg = 16,384 tokens, top 1: r256(2·Mg·8192) +
/// r256(2·Mg·16384) = 805,306,368 B.
#[test]
fn llama4_text_with_data_parallel_gathers_its_weighted_input() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), SCOUT_TEXT).unwrap();
    let line = format!(
        "vllm serve {} -dp 2 --enable-expert-parallel --max-model-len 65536",
        dir.path().to_str().unwrap()
    );
    let (code, err, rows) = plan_csv("sim:h200:dry", "0.21", &line);
    assert_eq!(code, Some(0), "{err}");
    let (mg, h) = (16_384u64, 5120u64);
    let ws: Vec<u64> = rows
        .iter()
        .filter(|r| r.4 == "moe.workspace" && r.1 == "alloc")
        .map(|r| r.5)
        .collect();
    assert_eq!(ws, [r256(2 * mg * 8192) + r256(2 * mg * 16_384)]);
    assert_eq!(ws, [805_306_368]);
    let moe = layer_moe(&rows, 1);
    let at = |alloc: bool, n: &str| {
        moe.iter()
            .position(|r| r.0 == alloc && r.1.ends_with(n))
            .unwrap_or_else(|| panic!("no {n} in {moe:?}"))
    };
    assert!(at(true, "output") < at(true, "a1_weighted"));
    assert!(at(true, "a1_weighted") < at(true, "dispatched_hidden_states"));
    assert!(at(true, "dispatched_topk_ids") < at(false, "a1_weighted"));
    assert!(at(false, "a1_weighted") < at(true, "sorted_ids"));
    assert_eq!(moe[at(true, "a1_weighted")].2, mg / 2 * h * 2);
    assert_eq!(moe[at(true, "dispatched_hidden_states")].2, mg * h * 2);
    // One weighted copy only: the experts do not make their own.
    assert_eq!(
        moe.iter()
            .filter(|r| r.0 && r.1.ends_with("a1_weighted"))
            .count(),
        1
    );
}

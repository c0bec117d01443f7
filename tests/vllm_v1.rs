//! vLLM V1's profile run (`--vllm 0.15`, `--vllm 0.19`): the public V1 log line of
//! ../shared/VLLM_LOGS_PUBLIC.md reproduced with its own settings, `vllm serve`'s defaults by
//! GPU, dry = compute allocation for allocation, the two top-k/top-p paths giving the same
//! tokens, and what is refused.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::memory::EventKind;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;

const GIB: f64 = (1u64 << 30) as f64;

fn run(req: &ProfileRequest) -> Report {
    profile::run(req, None, Arc::new(AtomicBool::new(false))).unwrap()
}

fn request(model: &str, quant: Quant, device: &str, vllm: &str) -> ProfileRequest {
    ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant,
        device: DeviceSpec::parse(device).unwrap(),
        vllm: vllm.into(),
        tokens: 0,
        seqs: 0,
        verify: false,
        ..ProfileRequest::default()
    }
}

/// Q1: vLLM 0.19.0 `vllm serve meta-llama/Llama-3.1-8B-Instruct` on an H100 80GB (total
/// 79.19 GiB), util 0.95, max_model_len 8192: weights 14.99 GiB, torch peak increase
/// 1.89 GiB, non-torch increase 0.25 GiB, 476,016 KV tokens. Weights within 0.5 %, activation
/// within 5 %, tokens within 0.5 %, non-torch within 0.05 GiB: PyTorch's kernel modules and
/// the driver's first-capture reservation that the graph estimate makes inside
/// `memory_profiling` (docs/gpu-runs.md runs 89-90); vLLM's own kernels' modules are not
/// modelled. Its
/// CUDA graph lines (0.84 GiB estimated, 0.91 GiB captured) come after the KV cache and
/// outside 0.19's budget: vramscope captures its own eager kernels' graphs, whose memory the
/// H200 measured (docs/gpu-runs.md runs 54-55), 0.64 and 0.71 GiB. The 22-24 % between them
/// and the log is printed and held here; it is not the compiled pieces (vLLM's procedure
/// replayed with Inductor's pieces gives 0.50 and 0.68 GiB, run 96) but vLLM code that cannot
/// run on the device (docs/vllm-versions.md).
#[test]
fn q1_llama_3_1_8b_on_an_h100_under_0_19() {
    let mut req = request(
        "preset:llama-3.1-8b",
        Quant::BF16,
        "sim:h100-sxm:dry",
        "0.19",
    );
    req.device = req.device.with_total(Some((79.19 * GIB) as u64)).unwrap();
    req.util = 0.95;
    req.max_model_len = 8192;
    let r = run(&req);
    // `vllm serve` on a GPU of 70 GiB or more that is not an A100: 8192 tokens, 1024 requests.
    assert_eq!((r.settings.tokens, r.settings.seqs), (8192, 1024));
    assert_eq!(r.settings.chunked_prefill, Some(true));
    let a = r.vllm_answer().unwrap();
    let weights = r.weights_bytes as f64 / GIB;
    let activation = a.formula.torch_peak_bytes as f64 / GIB;
    let tokens = a.kv_blocks * r.kv_geometry.block_size;
    let non_torch = a.formula.non_torch_bytes as f64 / GIB;
    println!(
        "Q1 | weights 14.99 / {weights:.2} | activation 1.89 / {activation:.2} | non-torch 0.25 / {non_torch:.2} (PyTorch's kernel modules and the driver's first graph capture; vLLM's own modules not modelled) | KV tokens 476,016 / {tokens}"
    );
    // The kernel modules PyTorch loads on first use, measured on the H200: 92 + 77 MiB, the
    // driver's 2 MiB pages making the second 78; then the estimate's first graph capture, 70.
    assert_eq!(a.formula.non_torch_bytes, (92 + 78 + 70) << 20);
    assert!((non_torch - 0.25).abs() < 0.05, "non-torch {non_torch}");
    assert!((weights / 14.99 - 1.0).abs() < 0.005, "weights {weights}");
    assert!(
        (activation / 1.89 - 1.0).abs() < 0.05,
        "activation {activation}"
    );
    assert!(
        (tokens as f64 / 476_016.0 - 1.0).abs() < 0.005,
        "tokens {tokens}"
    );
    // The log lines in V1's words.
    let lines = r.vllm_log_lines().join("\n");
    assert!(
        lines.contains("Requested memory: 0.95 (util), 75.23 GiB"),
        "{lines}"
    );
    assert!(
        lines.contains(&format!(
            "GPU KV cache size: {} tokens",
            vramscope::base::units::thousands(tokens)
        )),
        "{lines}"
    );
    assert!(
        lines.contains("torch peak memory increase: 1.89GiB"),
        "{lines}"
    );
    // The graphs: 51 sizes of 33 pieces and 51 FULL graphs, the estimate as vLLM forms it.
    let g = r.graphs.as_ref().expect("0.19 captures graphs");
    assert_eq!(g.graphs, 51 * 33 + 51);
    let e = g.estimate.as_ref().expect("0.19 estimates");
    assert!(!e.applied);
    let first = e.modes.iter().map(|m| m.first_bytes).max().unwrap();
    let rest: u64 = e.modes.iter().map(|m| m.rest_bytes()).sum();
    assert_eq!(e.total_bytes, first + rest);
    // The FULL graphs' pool holds FlashAttention 3's accumulators at 512 tokens: 32 splits ×
    // 32 heads × 512 × 128 fp32 and 32 × 32 × 512 fp32.
    assert!(g.pool_bytes >= 32 * 32 * 512 * 128 * 4 + 32 * 32 * 512 * 4);
    let (est, actual) = (e.total_bytes as f64 / GIB, g.took_bytes as f64 / GIB);
    println!(
        "Q1 graphs | estimate 0.84 / {est:.2} ({:+.1} %) | actual 0.91 / {actual:.2} ({:+.1} %)",
        (est / 0.84 - 1.0) * 100.0,
        (actual / 0.91 - 1.0) * 100.0
    );
    // Every V1 report quotes this comparison (in GiB as vLLM rounds them): it is held here,
    // so the sentence cannot outlive the numbers.
    let under =
        |ours: f64, log: f64| (100.0 * (1.0 - (ours * 100.0).round() / 100.0 / log)).round();
    let (u_est, u_act) = (under(est, 0.84), under(actual, 0.91));
    let quoted = format!("lands {}-{} % under", u_act.min(u_est), u_act.max(u_est));
    let summary = r.graph_summary().join("\n");
    assert!(summary.contains(&quoted), "{quoted} not in: {summary}");
    assert!((0.60..0.70).contains(&est), "estimate {est}");
    assert!((0.66..0.76).contains(&actual), "actual {actual}");
    let glines = r.vllm_graph_log_lines().join("\n");
    assert!(
        glines.contains(
            "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=51 (largest=512)"
        ),
        "{glines}"
    );
    assert!(glines.contains("In v0.19, CUDA graph memory profiling will be enabled"));
}

/// 0.21 subtracts its estimate from the KV budget, and `--enforce-eager` captures nothing:
/// the profile pass is the same, so the KV bytes differ by the estimate exactly. 0.19 only
/// logs its estimate; 0.21 counts tokens as int(concurrency · max_model_len).
#[test]
fn the_graph_estimate_comes_off_0_21s_budget() {
    let at = |vllm: &str, eager: bool| {
        let mut req = request("preset:llama-3.1-8b", Quant::BF16, "sim:h100-sxm:dry", vllm);
        req.max_model_len = 8000;
        req.enforce_eager = eager;
        run(&req)
    };
    let (r19, r21, eager) = (at("0.19", false), at("0.21", false), at("0.21", true));
    let est = r21.graphs_estimate_applied();
    assert!(est > 0);
    assert_eq!(r19.graphs_estimate_applied(), 0);
    let (a19, a21) = (r19.vllm_answer().unwrap(), r21.vllm_answer().unwrap());
    let a_eager = eager.vllm_answer().unwrap();
    // The estimate comes off the budget, and its samples, the process's first graphs, leave
    // the driver's first-capture reservation in the non-torch memory.
    let first_capture = vramscope::profile::procedure::FIRST_CAPTURE_DRIVER_BYTES as i64;
    assert_eq!(a_eager.kv_bytes - a21.kv_bytes, est as i64 + first_capture);
    assert!(eager.graphs.is_none() && eager.vllm_graph_log_lines().is_empty());
    // 0.21 loads under a 20 MiB split limit: layer 1's fused qkv weight (48 MiB) takes the
    // 64 MiB block the rotary cache's temporaries left cached whole, 16 MiB more weights.
    let slack = eager.weights_bytes - r19.weights_bytes;
    assert_eq!(slack, 16 << 20);
    // 0.21's first sampler run (FlashInfer) leaves its 1 MiB row-state buffer allocated
    // through the second (Triton's), one MiB over 0.19's peak.
    assert_eq!(
        a19.kv_bytes - a_eager.kv_bytes,
        (1 << 20) - first_capture + slack as i64
    );
    // 8000 tokens take 500 blocks of 16: int(blocks / 500 · 8000), as Python computes it.
    let lines = r21.vllm_log_lines().join("\n");
    let tokens = (a21.kv_blocks as f64 / 500.0 * 8000.0) as u64;
    assert!(lines.contains(&format!(
        "GPU KV cache size: {} tokens",
        vramscope::base::units::thousands(tokens)
    )));
    let summary = r21.graph_summary().join("\n");
    assert!(summary.contains("vLLM 0.21 reserves"), "{summary}");
    // The graph pool's blocks are their own category on the timeline, and all go back.
    let pool: i64 = r21
        .events
        .iter()
        .filter(|e| e.category == vramscope::memory::Category::CudaGraph)
        .map(|e| match e.kind {
            EventKind::SegmentMap | EventKind::OutsideAlloc => e.bytes as i64,
            EventKind::SegmentUnmap | EventKind::OutsideFree => -(e.bytes as i64),
            _ => 0,
        })
        .sum();
    assert_eq!(pool, 0);
    assert!(r21.events.iter().any(
        |e| e.category == vramscope::memory::Category::CudaGraph && e.kind == EventKind::Alloc
    ));
}

/// The acceptance's demo: Llama-3-70B over four simulated H100s under 0.21, dry, every rank
/// sampling on the all-gathered logits (V1), graphs captured on every rank.
#[test]
fn llama_3_70b_tp4_under_0_21_shows_the_graphs() {
    let mut req = request(
        "preset:llama-3-70b",
        Quant::BF16,
        "sim:h100-sxm:dry",
        "0.21",
    );
    req.tp = 4;
    let t = std::time::Instant::now();
    let r = run(&req);
    assert!(t.elapsed().as_secs() < 60);
    assert_eq!(r.ranks.len(), 4);
    let g = r.graphs.as_ref().expect("graphs");
    assert_eq!(g.graphs, 51 * 81 + 51);
    assert!(g.estimate.as_ref().unwrap().applied);
    // Every rank samples on the whole vocabulary (V0 samples on rank 0 only), so every rank
    // peaks as rank 0 does, above three [1024, 128256] fp32 tensors.
    let peak = |k: &vramscope::profile::Report| k.vllm_answer().unwrap().formula.torch_peak_bytes;
    for k in &r.ranks {
        assert_eq!(peak(k), peak(&r.ranks[0]));
    }
    assert!(peak(&r.ranks[0]) > 3 * 1024 * 128_256 * 4);
    println!("{}", r.graph_summary().join("\n"));
}

/// The V1 peak of Q1 is the sampler's, and the Triton path's cached buffer stays allocated
/// after the pass; the sort path (0.15) peaks higher on the same batch.
#[test]
fn the_sampler_sets_v1s_peak_and_the_sort_path_costs_more() {
    let at = |vllm: &str| {
        let mut req = request("preset:llama-3.1-8b", Quant::BF16, "sim:h100-sxm:dry", vllm);
        req.max_model_len = 8192;
        run(&req)
    };
    let triton = at("0.19");
    let sort = at("0.15");
    let peak = |r: &Report| r.vllm_answer().unwrap().formula.torch_peak_bytes;
    assert!(peak(&sort) > peak(&triton));
    // Triton's buffer: [min(pow2(min(132, 1024)), 132), 128256] f32 and two 200-entry
    // tables, still allocated at t3.
    let kept: u64 = triton
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc && e.tensor.ends_with("(cached)"))
        .map(|e| e.bytes)
        .sum();
    assert_eq!(kept, 132 * 128_256 * 4 + 2 * 1024);
    let peak_op = |r: &Report| {
        r.profile_events()
            .iter()
            .max_by_key(|e| e.allocated)
            .map(|e| e.op.clone())
            .unwrap()
    };
    assert!(
        peak_op(&triton).starts_with("sampler_v1"),
        "{}",
        peak_op(&triton)
    );
    assert!(
        peak_op(&sort).starts_with("sampler_v1"),
        "{}",
        peak_op(&sort)
    );
    // No attention kernel's buffers in V1's profile (no metadata: zeros of the output).
    assert!(!triton
        .profile_events()
        .iter()
        .any(|e| e.tensor.ends_with(".softmax_lse")));
}

/// `vllm serve`'s defaults by GPU (0.19.0 engine/arg_utils.py:2053-2072): 8192 / 1024 on 70 GiB
/// or more unless an A100, else 2048 / 256; a batch given is kept, and the sequences follow it.
#[test]
fn v1_defaults_follow_the_gpu() {
    for (device, want) in [
        ("sim:h200:dry", (8192, 1024)),
        ("sim:a100-sxm4-80gb:dry", (2048, 256)),
        ("sim:l40s:dry", (2048, 256)),
    ] {
        let r = run(&request("preset:tiny", Quant::F16, device, "0.15"));
        assert_eq!((r.settings.tokens, r.settings.seqs), want, "{device}");
    }
    let mut given = request("preset:tiny", Quant::F16, "sim:h200:dry", "0.15");
    given.tokens = 512;
    let r = run(&given);
    assert_eq!((r.settings.tokens, r.settings.seqs), (512, 512));
}

/// Compute mode makes the allocations of the dry run, and both top-k/top-p paths (and the
/// sort below 8 rows) sample the same tokens from the same logits.
#[test]
fn v1_compute_equals_dry_and_the_paths_agree() {
    let mut tokens = Vec::new();
    for (vllm, seqs) in [("0.15", 16), ("0.19", 16), ("0.19", 4)] {
        let mut dry = request("preset:tiny", Quant::F16, "sim:h100-sxm:dry", vllm);
        dry.tokens = 64;
        dry.seqs = seqs;
        let mut compute = dry.clone();
        compute.device = DeviceSpec::parse("sim:h100-sxm").unwrap();
        let d = run(&dry);
        let c = run(&compute);
        let trace = |r: &Report| -> Vec<(String, u64)> {
            r.profile_events()
                .iter()
                .filter(|e| matches!(e.kind, EventKind::Alloc | EventKind::Free))
                .map(|e| (e.tensor.clone(), e.bytes))
                .collect()
        };
        assert_eq!(trace(&d), trace(&c), "--vllm {vllm}, {seqs} sequences");
        assert_eq!(c.sampled_tokens.len(), seqs.min(8));
        tokens.push(c.sampled_tokens.clone());
    }
    assert_eq!(tokens[0], tokens[1], "sort and Triton paths");
}

/// V1's tensor parallel all-gathers the logits; that collective runs on simulated devices
/// only so far, so GPUs are refused before any work, with the reason.
#[test]
fn v1_over_gpu_ranks_is_refused_with_the_reason() {
    let mut tp = request("preset:tiny", Quant::F16, "cuda:0", "0.15");
    tp.tp = 2;
    let e = profile::run(&tp, None, Arc::new(AtomicBool::new(false)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--tp 2") && e.contains("V1") && e.contains("simulated"),
        "{e}"
    );
}

/// Gemma 3 12B under V1 (0.19): the hybrid KV cache manager puts its 8 global and 40
/// sliding layers in groups of 8 (one full group, five sliding), allocates 8 KV tensors
/// (each shared by a layer of every group), logs the tokens one block of every group holds,
/// and counts a 128k-token request's blocks with the sliding groups holding only their window.
/// V0 (0.8) keeps every layer's cache whole: 48 tensors, and the same memory serves a fifth
/// of the concurrency.
#[test]
fn gemma_3_under_v1_shares_kv_tensors_across_groups_and_windows_the_sliding_layers() {
    let mut req = request(
        "preset:gemma-3-12b",
        Quant::BF16,
        "sim:h100-sxm:dry",
        "0.19",
    );
    req.verify = true;
    let r = run(&req);
    let h = r.kv_geometry.hybrid.expect("V1 groups Gemma 3's layers");
    assert_eq!((h.group_size, h.full_groups, h.sliding_groups), (8, 1, 5));
    assert_eq!((h.sliding_window, h.max_num_batched_tokens), (1024, 8192));
    let a = r.vllm_answer().unwrap();
    // A block: 8 layers' pages of 2 x 16 tokens x 8 KV heads x 256 x 2 bytes.
    assert_eq!(r.kv_geometry.block_bytes(), 8 * 2 * 16 * 8 * 256 * 2);
    assert_eq!(a.kv_blocks, a.kv_bytes as u64 / (1 << 20));
    let log = r.vllm_log_lines().join("\n");
    let tokens = a.kv_blocks / 6 * 16;
    assert!(
        log.contains(&format!(
            "GPU KV cache size: {} tokens",
            vramscope::base::units::thousands(tokens)
        )),
        "{log}"
    );
    // 131,072-token requests: 8192 full blocks + 5 x (ceil((1023 + 8192) / 16) + 1).
    let per_request = 8192 + 5 * (9215u64.div_ceil(16) + 1);
    assert!(log.contains(&format!(
        "Maximum concurrency for 131,072 tokens per request: {:.2}x",
        a.kv_blocks as f64 / per_request as f64
    )));
    // KV tensors per verify pass: the highest `kv-cache[LABEL].layerN` + 1.
    let kv_tensors = |r: &Report| {
        r.events
            .iter()
            .filter(|e| e.kind == EventKind::Alloc && e.tensor.starts_with("kv-cache["))
            .filter_map(|e| e.tensor.rsplit(".layer").next()?.parse::<usize>().ok())
            .max()
            .map_or(0, |l| l + 1)
    };
    assert_eq!(kv_tensors(&r), 8);
    let mut v0 = request("preset:gemma-3-12b", Quant::BF16, "sim:h100-sxm:dry", "0.8");
    v0.verify = true;
    let r0 = run(&v0);
    assert_eq!(r0.kv_geometry.hybrid, None);
    assert_eq!(kv_tensors(&r0), 48);
}

/// Mixtures of experts under V1 where the release runs 0.8.5's `fused_experts_impl` (0.11.0
/// fused_moe.py L1484, in place, per-layer caches, chunks of 32768): a MoE block allocates what
/// 0.8's does, byte for byte, except that `token_expert_indices` dies after the router logits'
/// f32 copy (0.11.0 layer.py L1735: `select_experts` returns it up the stack). The releases with
/// the modular kernel are refused naming why.
#[test]
fn moe_under_0_11_runs_0_8_5s_fused_moe_with_the_indices_freed_late() {
    let block_events = |vllm: &str| {
        let mut req = request(
            "preset:qwen3-30b-a3b",
            Quant::BF16,
            "sim:h200-141gb:dry",
            vllm,
        );
        req.tokens = 8192;
        req.seqs = 256;
        run(&req)
            .events
            .iter()
            .filter(|e| e.pass == 1 && e.tensor.starts_with("layers.5.moe."))
            .filter(|e| matches!(e.kind, EventKind::Alloc | EventKind::Free))
            .map(|e| (e.kind == EventKind::Alloc, e.tensor.clone(), e.bytes))
            .collect::<Vec<_>>()
    };
    let v0 = block_events("0.8");
    let v1 = block_events("0.11");
    assert!(v0.len() > 10, "{v0:?}");
    let at = |ev: &[(bool, String, u64)], n: &str| {
        ev.iter()
            .position(|e| !e.0 && e.1.ends_with(n))
            .unwrap_or_else(|| panic!("no free of {n}"))
    };
    let (idx, gating) = ("token_expert_indicies", "gating_output_float");
    assert!(at(&v0, idx) < at(&v0, gating));
    assert!(at(&v1, idx) > at(&v1, gating));
    let mut swapped = v0.clone();
    let (i, g) = (at(&v0, idx), at(&v0, gating));
    swapped.swap(i, g);
    assert_eq!(v1, swapped);
    // 0.21 on the B200: FlashInfer's TRT-LLM BF16 experts, refused by name (its CUTLASS
    // experts on Hopper are modelled: tests/moe_v1_oracle.rs).
    let err = profile::run(
        &request("preset:qwen3-30b-a3b", Quant::BF16, "sim:b200:dry", "0.21"),
        None,
        Arc::new(AtomicBool::new(false)),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("--vllm 0.21") && err.contains("FlashInfer"),
        "{err}"
    );
}

/// V1's modular fused MoE (0.19.0 modular_kernel.py over TritonExperts;
/// docs/reading/vllm-v1-fused-moe.md §2.3): per MoE layer the routing's three `[M, k]` tensors
/// (no f32 copy of the logits), a new `[M, H]` output and the alignment buffers; one uint8
/// workspace of `r256(2·M·k·max(I, H)) + r256(2·M·k·max(2I, H))` bytes made in the first MoE
/// layer and kept through the passes. Qwen3-30B-A3B at 8192 tokens: 512 MiB, where 0.8.5's
/// per-layer caches were 352 MiB.
#[test]
fn moe_under_0_19_keeps_one_workspace_and_makes_a_new_output() {
    let mut req = request(
        "preset:qwen3-30b-a3b",
        Quant::BF16,
        "sim:h200-141gb:dry",
        "0.19",
    );
    req.tokens = 8192;
    req.seqs = 256;
    let r = run(&req);
    let ws: Vec<_> = r
        .events
        .iter()
        .filter(|e| {
            e.tensor == "moe.workspace" && matches!(e.kind, EventKind::Alloc | EventKind::Free)
        })
        .collect();
    // One allocation, in layer 0 of the profile pass, never freed.
    assert_eq!(ws.len(), 1, "{ws:?}");
    assert_eq!(ws[0].kind, EventKind::Alloc);
    assert_eq!((ws[0].pass, ws[0].layer), (1, Some(0)));
    let (m, k, i, h) = (8192u64, 8u64, 768u64, 2048u64);
    let r256 = |v: u64| v.div_ceil(256) * 256;
    let want = r256(2 * m * k * i.max(h)) + r256(2 * m * k * (2 * i).max(h));
    assert_eq!(ws[0].bytes, want);
    assert_eq!(want, 512 << 20);
    let layer5: Vec<(bool, &str, u64)> = r
        .events
        .iter()
        .filter(|e| e.pass == 1 && e.tensor.starts_with("layers.5.moe."))
        .filter(|e| matches!(e.kind, EventKind::Alloc | EventKind::Free))
        .map(|e| (e.kind == EventKind::Alloc, e.tensor.as_str(), e.bytes))
        .collect();
    let mk = m * k * 4;
    let p = m * k + 128 * (128 - 1);
    assert_eq!(
        layer5,
        [
            (true, "layers.5.moe.router_logits", m * 128 * 2),
            (true, "layers.5.moe.topk_weights", mk),
            (true, "layers.5.moe.topk_ids", mk),
            (true, "layers.5.moe.token_expert_indices", mk),
            (false, "layers.5.moe.token_expert_indices", mk),
            (true, "layers.5.moe.output", m * h * 2),
            (true, "layers.5.moe.sorted_ids", p * 4),
            (
                true,
                "layers.5.moe.expert_ids",
                (p.div_ceil(128) * 4).div_ceil(512) * 512
            ),
            (true, "layers.5.moe.num_tokens_post_pad", 512),
            (false, "layers.5.moe.sorted_ids", p * 4),
            (
                false,
                "layers.5.moe.expert_ids",
                (p.div_ceil(128) * 4).div_ceil(512) * 512
            ),
            (false, "layers.5.moe.num_tokens_post_pad", 512),
            (false, "layers.5.moe.topk_weights", mk),
            (false, "layers.5.moe.topk_ids", mk),
            (false, "layers.5.moe.router_logits", m * 128 * 2),
            // The output is layer 5's hidden states: it dies in layer 6, once the model's
            // loop rebinds them.
            (false, "layers.5.moe.output", m * h * 2),
        ]
    );
}

/// `--kv-cache-memory` skips vLLM's profile, so the checks after it decide: a cache that holds
/// less than one request of max_model_len is refused in vLLM's words, with its estimated
/// maximum length (0.19.0 v1/core/kv_cache_utils.py L633-653: Llama-3-8B's 8192 tokens need
/// 1.00 GiB, and half of that holds 4096); one larger than what is free once the model is
/// loaded runs out of memory allocating the cache.
#[test]
fn kv_cache_memory_too_small_or_too_large_does_not_start() {
    let at = |kv: u64| {
        let mut req = request(
            "preset:llama-3-8b",
            Quant::BF16,
            "sim:h100-80gb:dry",
            "0.19",
        );
        req.kv_cache_memory = Some(kv);
        req.max_model_len = 8192;
        run(&req).does_not_fit()
    };
    assert_eq!(at(1 << 30), None);
    let half = at(512 << 20).unwrap();
    assert!(
        half.contains("(1.00 GiB KV cache is needed, which is larger than the available KV cache memory (0.50 GiB)")
            && half.contains("the estimated maximum model length is 4096")
            && half.contains("--kv-cache-memory of at least 1.00 GiB, or --max-model-len 4096"),
        "{half}"
    );
    let byte = at(1).unwrap();
    assert!(
        byte.contains("To serve at least one request") && !byte.contains("estimated maximum"),
        "{byte}"
    );
    let over = at(200 << 30).unwrap();
    assert!(
        over.contains("--kv-cache-memory 200.00 GiB is more than the")
            && over.contains("OutOfMemoryError"),
        "{over}"
    );
}

/// Q4: vLLM 0.28.0 `vllm serve Qwen/Qwen3-14B` on an L40S (total 44.42 GiB, inferred), all
/// defaults: weights 27.52 GiB, Available KV 11.57 GiB, 75,824 tokens, 1.85x at 40,960.
/// 0.28 runs Qwen3 on Model Runner V2 (its sampler state counts, its graph estimate is 0)
/// and budgets with #49208 (consumed + transient headroom). What stays outside: the memory
/// outside PyTorch that kernels loaded on first use and torch.compile add after the baseline
/// (issue 46, item 2), which vramscope does not model under V1 yet: its KV cache comes out
/// 0.44 GiB larger, +3.8 % in tokens, outside the 2 % aimed for.
#[test]
fn q4_qwen3_14b_on_an_l40s_under_0_28() {
    let mut req = request("preset:qwen3-14b", Quant::BF16, "sim:l40s:dry", "0.28");
    req.device = req.device.with_total(Some((44.42 * GIB) as u64)).unwrap();
    let r = run(&req);
    // `vllm serve` below 70 GiB: 2048 tokens, 256 requests; max_model_len from the model.
    assert_eq!((r.settings.tokens, r.settings.seqs), (2048, 256));
    assert_eq!(r.settings.max_model_len, 40960);
    let a = r.vllm_answer().unwrap();
    assert_eq!(
        a.formula.id,
        vramscope::profile::formulas::FormulaId::Pr49208
    );
    let weights = r.weights_bytes as f64 / GIB;
    let kv = a.kv_bytes as f64 / GIB;
    let (tokens, concurrency) = r.kv_tokens_and_concurrency(&a);
    println!(
        "Q4 | weights 27.52 / {weights:.2} | KV 11.57 / {kv:.2} GiB | tokens 75,824 / {tokens} ({:+.1} %) | 1.85x / {concurrency:.2}x",
        (tokens as f64 / 75_824.0 - 1.0) * 100.0
    );
    assert!((weights / 27.52 - 1.0).abs() < 0.005, "weights {weights}");
    assert!(
        (tokens as f64 / 75_824.0 - 1.0).abs() < 0.04,
        "tokens {tokens}"
    );
    // V2's graph estimate is 0 through 0.28: nothing comes off the budget for the graphs.
    assert!(r.graphs.as_ref().unwrap().estimate.is_none());
    assert_eq!(r.graphs_estimate_applied(), 0);
    // #49208's terms: consumed (F(t0) − F(t3)) + headroom (Â − A(t3)).
    let c = &r.checkpoints;
    assert_eq!(
        a.formula.non_kv_bytes,
        (c.t0.free - c.t3.free) as i64 + (c.t3.allocated_peak - c.t3.allocated) as i64
    );
    // V2's `output_bin_counts` [256, 151936] int32 is in the consumption.
    assert!(a.formula.non_torch_bytes >= 256 * 151_936 * 4);
    let lines = r.vllm_log_lines().join("\n");
    assert!(
        lines.contains("total consumed (from mem_get_info)"),
        "{lines}"
    );
    assert!(
        lines.contains(&format!(
            "GPU KV cache size: {} tokens, Maximum concurrency for 40,960 tokens per request",
            vramscope::base::units::thousands(tokens)
        )),
        "{lines}"
    );
}

/// Q8's suggestion line (0.26.0, Qwen2.5-7B-AWQ on a 16 GB RTX 4080): AWQ is not modelled
/// under V1, so its arithmetic is shown on Qwen2.5-1.5B, which 0.26 also runs on Model
/// Runner V2. V2's graph estimate is 0 there, so the budget keeps no room for the graphs, and
/// the INFO suggestion subtracts their actual memory: it comes out below the KV cache
/// allocated by the graphs plus the 150 MiB margin, as Q8's 7.37 GiB against 8.0 GiB
/// (8.0 − 7.37 = 0.48 + 0.15).
#[test]
fn q8_suggestion_under_0_26_subtracts_graphs_that_were_never_reserved() {
    let mut req = request(
        "preset:qwen2.5-1.5b",
        Quant::BF16,
        "sim:rtx4090:dry",
        "0.26",
    );
    req.device = req.device.with_total(Some((15.99 * GIB) as u64)).unwrap();
    req.max_model_len = 32768;
    let r = run(&req);
    let a = r.vllm_answer().unwrap();
    let g = r.graphs.as_ref().unwrap();
    assert!(g.estimate.is_none());
    let f = r.formula(a.release.formula).unwrap();
    let s = r.kv_cache_memory_suggestion(&a, f, g.took_bytes as f64);
    // requested − (weights + peak + non-torch) − actual − 150 MiB; the KV cache is the same
    // without the graphs' actual memory and the margin.
    assert_eq!(
        a.kv_bytes - s.to_requested,
        g.took_bytes + (150 << 20),
        "{s:?}"
    );
    assert_eq!(s.peak_activation_bytes, f.torch_peak_bytes);
    let glines = r.vllm_graph_log_lines().join("\n");
    assert!(
        glines.contains("INFO gpu_worker.py] Free memory on device ("),
        "{glines}"
    );
    assert!(glines.contains("GiB for non-torch memory"), "{glines}");
    // Q8's own numbers: 15.99 · 0.9 − (5.29 + 1.04 + 0.06 + 0.48) − 150 MiB against its
    // `--kv-cache-memory=7911991092`, within the four terms' rounding (0.005 GiB each), and
    // the 8.0 GiB allocated is requested − weights − peak − non-torch (no estimate).
    let requested = 15.99f64 * 0.9;
    let q8 = requested - (5.29 + 1.04 + 0.06 + 0.48) - 150.0 / 1024.0;
    assert!((q8 - 7_911_991_092.0 / GIB).abs() < 0.02, "{q8}");
    assert!((requested - (5.29 + 1.04 + 0.06) - 8.0).abs() < 0.02);
    println!(
        "Q8 (arithmetic on Qwen2.5-1.5B) | KV {:.2} GiB | suggestion {:.2} GiB | graphs {:.2} GiB",
        a.kv_bytes as f64 / GIB,
        s.to_requested as f64 / GIB,
        g.took_bytes as f64 / GIB
    );
}

/// From 0.29 Model Runner V2 estimates its graphs and the estimate comes off the budget; the
/// suggestion's peak activation holds that estimate and the line adds the actual graph
/// memory again (0.27.1 v1/worker/gpu_worker.py:526-529, :751-782; vLLM issue #57936).
#[test]
fn the_0_29_suggestion_counts_the_graphs_twice() {
    let mut req = request(
        "preset:llama-3.1-8b",
        Quant::BF16,
        "sim:h100-sxm:dry",
        "0.29",
    );
    req.max_model_len = 8192;
    let r = run(&req);
    let a = r.vllm_answer().unwrap();
    let g = r.graphs.as_ref().unwrap();
    let est = r.graphs_estimate_applied() as i64;
    assert!(est > 0);
    let f = r.formula(a.release.formula).unwrap();
    let s = r.kv_cache_memory_suggestion(&a, f, g.took_bytes as f64);
    assert_eq!(s.peak_activation_bytes, f.torch_peak_bytes + est);
    // The KV cache already lost the estimate; the suggestion takes the actual graphs too.
    assert_eq!(
        a.kv_bytes - s.to_requested,
        g.took_bytes + (150 << 20),
        "{s:?}"
    );
    let glines = r.vllm_graph_log_lines().join("\n");
    assert!(
        glines.contains("GiB for consumed memory (weights + non-torch)"),
        "{glines}"
    );
}

/// 0.26 runs Qwen2.5 on Model Runner V2, 0.21 on V1's runner: V2's dummy sampler keeps the
/// logits in bf16 (no fp32 copy, no top-k/top-p), so its peak is lower, and its sampler state
/// sits outside what the reserved-based accounting sees.
#[test]
fn model_runner_v2_changes_the_profile_peak() {
    let at = |vllm: &str| {
        let mut req = request("preset:qwen2.5-1.5b", Quant::BF16, "sim:h100-sxm:dry", vllm);
        req.max_model_len = 4096;
        req.enforce_eager = true;
        run(&req)
    };
    let (r21, r26) = (at("0.21"), at("0.26"));
    let peak = |r: &Report| r.vllm_answer().unwrap().formula.torch_peak_bytes;
    assert!(peak(&r26) < peak(&r21));
    assert!(r26
        .events
        .iter()
        .any(|e| e.tensor.contains("output_bin_counts")));
    assert!(!r21
        .events
        .iter()
        .any(|e| e.tensor.contains("output_bin_counts")));
}

/// `--vllm 0.22` … `--vllm 0.33` and their patch releases name a row each.
#[test]
fn every_release_from_0_22_to_0_33_is_a_row() {
    use vramscope::profile::vllm::release;
    for (asked, row) in [
        ("0.22", "0.22"),
        ("0.22.1", "0.22"),
        ("0.23.0", "0.23"),
        ("0.24", "0.24"),
        ("0.25.1", "0.25"),
        ("0.26.0", "0.26"),
        ("0.27.1", "0.27"),
        ("0.28.0", "0.28"),
        ("0.29", "0.29"),
        ("0.30", "0.29"),
        ("0.31.0", "0.31"),
        ("0.32", "0.31"),
        ("0.33", "0.33"),
        ("v0.33.0", "0.33"),
    ] {
        assert_eq!(release(asked).unwrap().name, row, "{asked}");
    }
    // Model Runner V2's default by release: Qwen3 from 0.22, Llama from 0.23, every dense
    // model from 0.25, quantized Llama from 0.24.
    let v2 = |r: &str, arch: &str, q: bool| release(r).unwrap().runs_v2(arch, q, false);
    assert!(!v2("0.21", "qwen3", false));
    assert!(v2("0.22", "qwen3", false) && !v2("0.22", "llama", false));
    assert!(v2("0.23", "llama", false) && !v2("0.23", "llama", true));
    assert!(v2("0.24", "llama", true) && !v2("0.24", "qwen2", false));
    assert!(v2("0.25", "qwen2", true) && v2("0.33", "gemma2", false));
}

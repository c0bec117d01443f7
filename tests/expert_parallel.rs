//! Expert parallel, data parallel and plans across hosts (issue 48 parts 2 and 3), held
//! against vLLM's own arithmetic: `FusedMoEParallelConfig.make` (experts cut over dp × tp
//! ranks, or whole experts with `--enable-expert-parallel`), `determine_expert_map` (linear
//! placement, the remainder on the first ranks, an int32 `expert_map` per MoE layer), the
//! `allgather_reducescatter` dispatch around each MoE layer with data parallel, and NCCL's
//! network transport between hosts (vLLM 0.11.0, 0.15, 0.19.0; NVIDIA/nccl net.cc).

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::nccl_model::{NcclRules, NetModel, Network};
use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::runtime::Runtime;
use vramscope::engine::tensor::DType;
use vramscope::memory::{Category, EventKind};
use vramscope::model::config::MoeShape;
use vramscope::model::layers::tp::ExpertPlacement;
use vramscope::model::llama::{moe_block_forward, MoeBlock};
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;

fn request(model: &str, device: &str, vllm: &str, (tp, pp, dp): (u32, u32, u32)) -> ProfileRequest {
    ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse(device).unwrap(),
        vllm: vllm.into(),
        tp,
        pp,
        dp,
        max_model_len: 8192,
        verify: false,
        enforce_eager: true,
        ..ProfileRequest::default()
    }
}

fn run(req: &ProfileRequest) -> Report {
    profile::run(req, None, Arc::new(AtomicBool::new(false))).unwrap()
}

fn allocated(r: &Report, name: &str) -> Vec<(u64, Category)> {
    r.events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc && e.tensor == name)
        .map(|e| (e.bytes, e.category))
        .collect()
}

fn outside(r: &Report, label: &str) -> Vec<u64> {
    r.events
        .iter()
        .filter(|e| e.kind == EventKind::OutsideAlloc && e.tensor == label)
        .map(|e| e.bytes)
        .collect()
}

/// Qwen3-235B-A22B's bf16 weights on one of `n` ranks (hidden 4096, 94 layers, 64 heads and 4
/// KV heads of 128, 128 experts of width 1536, vocabulary 151936, 40960 positions, lm_head
/// untied), written from the published config as vLLM cuts it: attention and vocabulary over
/// the `n` tensor-parallel ranks (one KV head each), the router and norms whole, and with
/// expert parallel `128 / n` whole experts (`w13 [E/n, 2·1536, 4096]`, `w2 [E/n, 4096, 1536]`)
/// and an int32 `expert_map [128]` per layer; the rotary cache; the release's 0-dim f32
/// attention scalars of every layer (0.19's `Attention.__init__`: seven, `_k_scale` to
/// `v_range`).
fn qwen3_235b_ep_rank_bytes(n: u64, scalars: u64) -> u64 {
    let (h, layers, heads, kv, hd, experts, width, vocab, pos) = (
        4096u64, 94u64, 64u64, 4u64, 128u64, 128u64, 1536u64, 151936u64, 40960u64,
    );
    let kv_local = if kv >= n { kv / n } else { 1 };
    let qkv = (heads / n + 2 * kv_local) * hd * h;
    let o = h * (heads / n) * hd;
    let router = experts * h;
    let w13 = (experts / n) * 2 * width * h;
    let w2 = (experts / n) * h * width;
    let norms = 2 * h + 2 * hd;
    let per_layer = qkv + o + router + w13 + w2 + norms;
    let vocab_rows = vocab.div_ceil(64) * 64 / n;
    let params = layers * per_layer + 2 * vocab_rows * h + h + pos * hd;
    2 * params + layers * scalars * 4 + layers * experts * 4
}

/// TP 4 with `--enable-expert-parallel` (0.19): each rank holds 32 whole experts of 1536, not
/// 128 quarter-experts of 384; the expert bytes are the same, the difference is the 94
/// expert_maps of 128 int32 entries, allocated with the weights before `w13_weight`.
#[test]
fn qwen3_235b_tp4_with_expert_parallel_holds_32_whole_experts_a_rank() {
    let started = std::time::Instant::now();
    let mut req = request("preset:qwen3-235b-a22b", "sim:h200:dry", "0.19", (4, 1, 1));
    let plain = run(&req);
    req.enable_expert_parallel = true;
    let ep = run(&req);
    assert_eq!(ep.ranks.len(), 4);
    for (k, rank) in ep.ranks.iter().enumerate() {
        assert_eq!(
            rank.weights_tensor_bytes,
            qwen3_235b_ep_rank_bytes(4, 7),
            "rank {k}"
        );
        assert_eq!(
            rank.weights_tensor_bytes - plain.ranks[k].weights_tensor_bytes,
            94 * 128 * 4,
            "rank {k}"
        );
        let maps = allocated(rank, "model.layers.0.mlp.experts.expert_map");
        assert_eq!(maps, vec![(512, Category::Weight)], "rank {k}");
        let w13 = allocated(rank, "model.layers.0.mlp.experts.w13_weight");
        assert_eq!(w13, vec![(32 * 2 * 1536 * 4096 * 2, Category::Weight)]);
    }
    // 105.9 GiB of bf16 weights a rank: FP8 halves the experts (Q3's 27.72 GiB is for 8
    // ranks, see q3_weights_activation_and_kv_at_eight_ranks).
    eprintln!(
        "qwen3-235b bf16 tp4+ep: {:.2} GiB a rank, {:?} for both runs",
        ep.weights_bytes as f64 / (1u64 << 30) as f64,
        started.elapsed()
    );
}

/// `determine_expert_map` with 10 experts over 4 ranks: 3, 3, 2, 2 from 0, 3, 6, 8 (the
/// remainder on the first ranks), −1 for every other rank's expert.
#[test]
fn the_expert_map_places_the_remainder_on_the_first_ranks() {
    let p: Vec<(usize, usize)> = (0..4)
        .map(|r| {
            let e = ExpertPlacement::linear(10, r, 4);
            (e.first, e.local)
        })
        .collect();
    assert_eq!(p, vec![(0, 3), (3, 3), (6, 2), (8, 2)]);
    assert_eq!(
        ExpertPlacement::linear(10, 1, 4).expert_map(),
        vec![-1, -1, -1, 0, 1, 2, -1, -1, -1, -1]
    );
    assert!(!ExpertPlacement::linear(10, 0, 1).mapped);
}

/// Two ranks each holding half the experts (as expert parallel places them) compute, summed,
/// what one rank holding all of them computes: the routing is over every expert on each rank,
/// an expert that is not local adds nothing, and the all-reduce after the block sums the
/// ranks. Both of vLLM's kernels: 0.11's in place and 0.19's modular one.
#[test]
fn experts_split_over_two_ranks_sum_to_the_whole() {
    use std::cell::RefCell;
    use vramscope::engine::ops_moe_v1::{Modular, MoeKernel};
    use vramscope::model::layers::moe::moe_block_forward_as;

    let (h, e, i, k, m) = (16usize, 8usize, 24usize, 2usize, 9usize);
    let spec = DeviceSpec::parse("sim:h100-80gb").unwrap();
    let rt = Runtime::new(Device::open(&spec).unwrap(), Arc::default(), None);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut vals = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    let t = |name: &str, shape: &[usize], data: &[f32]| {
        let mut x = rt
            .tensor(name, Category::Weight, shape, DType::F32)
            .unwrap();
        x.f32_mut().copy_from_slice(data);
        x
    };
    let (xv, gv, w13v, w2v) = (
        vals(m * h),
        vals(e * h),
        vals(e * 2 * i * h),
        vals(e * h * i),
    );
    let block = |experts: std::ops::Range<usize>, placement: ExpertPlacement| MoeBlock {
        gate: vramscope::quant::Linear::Dense(t("gate", &[e, h], &gv)),
        w13: t(
            "w13",
            &[experts.len(), 2 * i, h],
            &w13v[experts.start * 2 * i * h..experts.end * 2 * i * h],
        ),
        w2: t(
            "w2",
            &[experts.len(), h, i],
            &w2v[experts.start * h * i..experts.end * h * i],
        ),
        fp8_scales: None,
        fp8_tensor: None,
        shared: None,
        placement,
        expert_map: None,
        gate_in_op: false,
    };
    let shape = MoeShape {
        num_experts: e,
        top_k: k,
        expert_intermediate_size: i,
        renormalize: true,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        shared_expert_intermediate_size: 0,
    };
    let whole = block(0..e, ExpertPlacement::all(e));
    let halves = [0, 1].map(|r| {
        let p = ExpertPlacement::linear(e, r, 2);
        block(p.first..p.first + p.local, p)
    });
    let modular = MoeKernel::Modular(Modular {
        chunk_tokens: None,
        default_block_m_by_tokens: true,
        v0_21: None,
    });
    for kernel in [
        MoeKernel::InPlace {
            indices_freed_late: true,
        },
        modular,
    ] {
        let ws = RefCell::new(None);
        let run = |b: &MoeBlock| {
            moe_block_forward_as(
                &rt,
                t("x", &[m, h], &xv),
                b,
                &shape,
                (DType::F32, kernel, Some(&ws)),
                "layers.0",
                "NVIDIA H100 80GB HBM3",
            )
            .unwrap()
            .f32()
            .to_vec()
        };
        let want = run(&whole);
        let got: Vec<f32> = run(&halves[0])
            .iter()
            .zip(run(&halves[1]))
            .map(|(a, b)| a + b)
            .collect();
        let err = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-5, "{kernel:?}: {err}");
        assert!(want.iter().any(|v| v.abs() > 1e-3));
    }
    // The plain function is the in-place kernel.
    let _ = moe_block_forward;
}

/// Data parallel 2 × TP 1 with expert parallel (Qwen3-30B-A3B, 0.19): the two replicas' ranks
/// hold 64 experts each; around each MoE layer the dispatch gathers both replicas' hidden
/// states `[2·M, 2048]` and router logits `[2·M, 128]` (bf16) and the combine makes this
/// replica's `[M, 2048]`; each rank makes the data-parallel and the expert-parallel groups'
/// communicators; each replica sizes its own KV cache.
#[test]
fn data_parallel_replicas_gather_their_tokens_around_every_moe_layer() {
    let mut req = request(
        "preset:qwen3-30b-a3b",
        "sim:h100-80gb:dry",
        "0.19",
        (1, 1, 2),
    );
    req.enable_expert_parallel = true;
    let r = run(&req);
    assert_eq!(r.ranks.len(), 2);
    let m = r.settings.tokens as u64;
    for (k, rank) in r.ranks.iter().enumerate() {
        let w13 = allocated(rank, "model.layers.0.mlp.experts.w13_weight");
        assert_eq!(
            w13,
            vec![(64 * 2 * 768 * 2048 * 2, Category::Weight)],
            "rank {k}"
        );
        // The profile pass's (the graph captures after it dispatch their own batches).
        let first = |name: &str| allocated(rank, name)[0];
        let hidden = first("layers.0.moe.dispatched_hidden_states");
        assert_eq!(hidden, (2 * m * 2048 * 2, Category::Activation));
        let logits = first("layers.0.moe.dispatched_router_logits");
        assert_eq!(logits, (2 * m * 128 * 2, Category::Activation));
        let combined = first("layers.0.moe.combined");
        assert_eq!(combined, (m * 2048 * 2, Category::Activation));
        for label in [
            "nccl: data-parallel group pynccl communicator + warm-up all_reduce",
            "nccl: expert-parallel group pynccl communicator + warm-up all_reduce",
        ] {
            assert_eq!(outside(rank, label).len(), 1, "rank {k}: {label}");
        }
        assert!(rank.vllm_answer().unwrap().kv_blocks > 0);
    }
    // Without expert parallel the replicas cut every expert's width in two instead.
    req.enable_expert_parallel = false;
    let cut = run(&req);
    let w13 = allocated(&cut.ranks[1], "model.layers.0.mlp.experts.w13_weight");
    assert_eq!(w13, vec![(128 * 2 * 384 * 2048 * 2, Category::Weight)]);
    assert!(
        outside(
            &cut.ranks[1],
            "nccl: expert-parallel group pynccl communicator + warm-up all_reduce"
        )
        .len()
            == 1
    );
}

/// A dense model's replicas are independent engines: one replica runs for all, and no data-
/// or expert-parallel communicator is made.
#[test]
fn a_dense_models_replicas_are_independent_engines() {
    let r = run(&request(
        "preset:qwen3-8b",
        "sim:h100-80gb:dry",
        "0.19",
        (2, 1, 2),
    ));
    assert_eq!(r.ranks.len(), 2);
    for rank in &r.ranks {
        assert!(rank
            .events
            .iter()
            .all(|e| !e.tensor.contains("data-parallel") && !e.tensor.contains("expert-parallel")));
    }
}

/// NCCL's network transport across hosts: with GPUDirect RDMA (IB, RoCE) 2 channels × (10 MiB
/// received + 10 MiB sent) and the 4 MiB point-to-point pool with cuMem off; over TCP every
/// buffer is host memory.
#[test]
fn the_network_transport_keeps_its_buffers_on_the_gpu_only_with_gpudirect() {
    const MIB: u64 = 1 << 20;
    let ib = NetModel::new(Network::Ib, NcclRules::Nccl221CumemOff);
    assert_eq!(ib.communicator(), 2 * 20 * MIB + 4 * MIB);
    assert_eq!(
        NetModel::new(Network::Roce, NcclRules::Nccl221CumemOff).communicator(),
        ib.communicator()
    );
    assert_eq!(
        NetModel::new(Network::Tcp, NcclRules::Nccl221CumemOff).communicator(),
        0
    );
    assert!(Network::parse("infiniband").is_err());
}

/// Llama-3.1-405B (its published config.json, no weights) as TP 8 × PP 2 on two hosts of
/// eight simulated H200s: every rank holds a sixteenth of the layers' weights, the pipeline
/// group crosses the hosts (the network transport's communicator, not NVLink's), the TP group
/// stays inside one; dry, timed.
#[test]
fn llama_405b_over_two_hosts_of_eight_h200s() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/configs/llama-3.1-405b"
    );
    let mut req = request(dir, "sim:h200:dry", "0.19", (8, 2, 1));
    req.nodes = 2;
    req.quant = Quant::BF16;
    let started = std::time::Instant::now();
    let r = run(&req);
    let took = started.elapsed();
    assert_eq!(r.ranks.len(), 16);
    let label = "nccl: pipeline group pynccl communicator + warm-up all_reduce";
    let net = NetModel::new(Network::Ib, NcclRules::Nccl221CumemOff).communicator();
    for rank in &r.ranks {
        assert_eq!(outside(rank, label), vec![net], "rank {}", rank.rank);
        let a = rank.vllm_answer().unwrap();
        assert!(a.kv_blocks > 0, "rank {}", rank.rank);
    }
    // 126 layers cut 63 + 63; every stage holds its 63 layers' eighth, stage 0 the
    // embedding's eighth, stage 1 the lm_head's.
    let per_layer = 2
        * ((128 / 8 + 2) * 128 * 16384
            + 16384 * (128 / 8) * 128
            + 3 * (53248 / 8) * 16384
            + 2 * 16384) as u64;
    let vocab = 2 * (128256 / 8 * 16384) as u64;
    for rank in &r.ranks {
        let w = rank.weights_tensor_bytes;
        let want = 63 * per_layer + vocab;
        assert!(
            (w as f64 / want as f64 - 1.0).abs() < 0.001,
            "rank {}: {w} vs {want}",
            rank.rank
        );
    }
    eprintln!("llama-3.1-405b tp8 x pp2 on 2 x 8 h200, dry: {took:?}");
    // Without --nodes the 16 GPUs do not fit one host.
    req.nodes = 1;
    let e = profile::run(&req, None, Arc::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("--nodes"), "{e}");
}

/// The binary, run from the repository's root (as the docs' commands are written).
fn vramscope(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .unwrap()
}

/// docs/tensor-parallel.md's expert-parallel line, as written.
#[test]
fn the_documented_expert_parallel_plan_runs() {
    let o = vramscope(&[
        "plan",
        "--vllm",
        "0.19",
        "--device",
        "sim:h200",
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen3-30B-A3B",
        "--tensor-parallel-size",
        "2",
        "--enable-expert-parallel",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.contains(
            "expert parallel over 2 GPUs (tp 2 × dp 1): each holds whole experts, 64 of the 128"
        ),
        "{out}"
    );
    assert!(!err.contains("enable-expert-parallel"), "{err}");
    assert!(out.contains("    vLLM 0.19"), "{out}");
}

/// docs/tensor-parallel.md's data-parallel line, as written.
#[test]
fn the_documented_data_parallel_profile_runs() {
    let o = vramscope(&[
        "profile",
        "--model",
        "preset:qwen3-30b-a3b",
        "--quant",
        "bf16",
        "--device",
        "sim:h100-80gb:dry",
        "--vllm",
        "0.19",
        "-dp",
        "2",
        "-ep",
        "--no-verify",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("data parallel: 2 replicas of 1 GPU(s)"),
        "{out}"
    );
    assert!(
        out.contains("each data-parallel replica is its own engine") && out.contains("replica 1 "),
        "{out}"
    );
    assert!(
        out.contains("  rank 0 (") && out.contains("  rank 1 ("),
        "{out}"
    );
}

/// docs/tensor-parallel.md's two-host line, as written.
#[test]
fn the_documented_two_host_plan_runs() {
    let dir = "tests/fixtures/configs/llama-3.1-405b";
    let o = vramscope(&[
        "profile",
        "--model",
        dir,
        "--dtype",
        "bfloat16",
        "--device",
        "sim:h200:dry",
        "--vllm",
        "0.19",
        "--tp",
        "8",
        "--pp",
        "2",
        "--nodes",
        "2",
        "--no-verify",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("2 hosts of 8"), "{out}");
    assert!(out.contains("  rank 15 ("), "{out}");
    assert!(
        out.contains("across hosts: network transport over ib"),
        "{out}"
    );
    let bad = vramscope(&[
        "profile",
        "--model",
        dir,
        "--device",
        "sim:h200:dry",
        "--vllm",
        "0.19",
        "--tp",
        "8",
        "--pp",
        "2",
        "--nodes",
        "2",
        "--network",
        "ethernet",
    ]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--network 'ethernet': expected ib, roce, tcp"),
        "{err}"
    );
}

/// One `plan --vllm 0.11 --device sim:l40s:dry` of the published
/// Qwen3-235B-A22B-Instruct-2507-FP8 config (block fp8 `[128, 128]`) with expert parallel over
/// `tp` ranks and max_model_len 32K, as the public Q3 line ran it: the process's output.
fn q3_plan(tp: &str) -> std::process::Output {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/configs/qwen3-235b-a22b-instruct-2507-fp8"
    );
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "plan",
            "--vllm",
            "0.11",
            "--device",
            "sim:l40s:dry",
            "--",
            "vllm",
            "serve",
            dir,
            "--tensor-parallel-size",
            tp,
            "--enable-expert-parallel",
            "--max-model-len",
            "32768",
        ])
        .output()
        .unwrap()
}

/// The number after `key` in `text` (commas dropped), e.g. "weights memory: " → 27.72.
fn number_after(text: &str, key: &str) -> f64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
        + key.len();
    let s: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',')
        .filter(|c| *c != ',')
        .collect();
    s.parse().unwrap_or_else(|_| panic!("{key:?} then {s:?}"))
}

/// The public Q3 line (../shared/VLLM_LOGS_PUBLIC.md: Qwen3-235B-A22B-Instruct-2507-FP8 on
/// L40S, ~0.11, expert parallel, max_model_len 32K, batch defaults 2048 / 256): weights 27.72
/// GiB a rank, peak activation 1.4 GiB, 238,208 KV tokens. The line says TP 4, but its
/// numbers are those of 8 ranks: 94 layers × 32 experts × 3 × 1536 × 4096 fp8 bytes are
/// 52.9 GiB a rank over 4 expert-parallel ranks, more than an L40S holds (`plan` at TP 4: vLLM
/// would not start, out of memory while loading; TP 8 would), and the KV tokens need 94 layers a rank
/// (no pipeline stages) with one KV head a rank (TP 4 or 8 alike). At TP 8 the weights come
/// out to the hundredth, the activation too, the initial free memory 43.91 GiB (43.93
/// logged: V1's baseline is taken after the communicators start), non-torch 0.22 GiB (0.21)
/// and the KV tokens 0.4 % under.
#[test]
fn q3_weights_activation_and_kv_at_eight_ranks() {
    let out = q3_plan("8");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let weights = number_after(&text, "weights memory: ");
    assert!((weights / 27.72 - 1.0).abs() < 0.01, "{weights} GiB");
    let act = number_after(&text, "torch peak memory increase: ");
    assert!((act / 1.4 - 1.0).abs() < 0.03, "{act} GiB");
    let tokens = number_after(&text, "GPU KV cache size: ");
    assert!((tokens / 238_208.0 - 1.0).abs() < 0.01, "{tokens} tokens");
    let free = number_after(&text, "Initial free memory: ");
    assert!((free - 43.93).abs() < 0.05, "{free} GiB");
    let non_torch = number_after(&text, "non-torch forward increase memory: ");
    assert!((non_torch - 0.21).abs() < 0.05, "{non_torch} GiB");
    assert!(
        text.contains("each holds whole experts, 16 of the 128"),
        "{text}"
    );
    let four = q3_plan("4");
    let out = String::from_utf8_lossy(&four.stdout);
    assert_eq!(four.status.code(), Some(3), "{out}");
    assert!(
        out.contains("vLLM 0.11 would not start: the GPU ran out of memory while loading")
            && out.contains("(load, layer"),
        "{out}"
    );
    // Eight ranks are what would start: the line's own numbers.
    assert!(out.contains("--tensor-parallel-size 8"), "{out}");
}

/// `explain` on a log whose non-default args set data parallel and expert parallel: it reads
/// and states both (no longer "not modelled"), runs them, and still names what it does not
/// model (decode context parallel).
#[test]
fn explain_reads_data_and_expert_parallel_and_names_what_it_does_not_model() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vllm-logs/pp2-0.19-qwen3-8b-2xl4.log"
    );
    let text = std::fs::read_to_string(fixture).unwrap();
    let text = text
        .replace(
            "'pipeline_parallel_size': 2}",
            "'pipeline_parallel_size': 2, 'data_parallel_size': 2, 'enable_expert_parallel': True, 'decode_context_parallel_size': 2}",
        )
        .replace("data_parallel_size=1, decode_context_parallel_size=1", "data_parallel_size=2, decode_context_parallel_size=2");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("dp.log");
    std::fs::write(&log, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "explain",
            log.to_str().unwrap(),
            "--device",
            "sim:l4:dry",
            "--no-what-if",
        ])
        .env("HF_HUB_CACHE", dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("TP 1, PP 2, DP 2, expert parallel"), "{text}");
    assert!(text.contains("data parallel over 2 replicas"), "{text}");
    let assumed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not modelled"))
        .collect();
    assert_eq!(assumed.len(), 1, "{text}");
    assert!(
        assumed[0].contains("decode_context_parallel_size=2"),
        "{text}"
    );
    assert!(!assumed[0].contains("data_parallel_size=2 ("), "{text}");
    assert!(text.contains("pipeline parallel: 2 stages"), "{text}");
}

/// Every modelled MoE family under TP 2 with expert parallel: half the routed experts whole
/// in `w13_weight` (`[E/2, 2·I, H]`), an int32 `expert_map [E]` per MoE layer, and the run
/// through both of vLLM's kernels (0.11's in place, 0.19's modular).
#[test]
fn every_moe_family_holds_half_its_experts_whole_on_two_ranks() {
    // (preset, release, routed experts, expert width, hidden)
    for (model, vllm, e, i, h) in [
        ("mixtral-8x7b", "0.11", 8u64, 14336u64, 4096u64),
        ("qwen3-30b-a3b", "0.11", 128, 768, 2048),
        ("qwen3-30b-a3b", "0.19", 128, 768, 2048),
        ("deepseek-v2-lite", "0.19", 64, 1408, 2048),
        ("llama-4-scout", "0.19", 16, 8192, 5120),
    ] {
        let mut req = request(&format!("preset:{model}"), "sim:h200:dry", vllm, (2, 1, 1));
        req.enable_expert_parallel = true;
        let r = run(&req);
        for rank in &r.ranks {
            let first = |suffix: &str| {
                rank.events
                    .iter()
                    .find(|ev| ev.kind == EventKind::Alloc && ev.tensor.ends_with(suffix))
                    .map(|ev| (ev.bytes, ev.category))
                    .unwrap_or_else(|| panic!("{model} {vllm}: no {suffix}"))
            };
            assert_eq!(
                first("experts.w13_weight"),
                (e / 2 * 2 * i * h * 2, Category::Weight),
                "{model} {vllm} rank {}",
                rank.rank
            );
            assert_eq!(
                first("experts.expert_map"),
                ((e * 4).next_multiple_of(512), Category::Weight),
                "{model} {vllm}"
            );
        }
    }
}

/// A pasted line's `-dp 2 -ep` (and the long spellings) run data and expert parallel, named
/// on stdout and never in the assumed line.
#[test]
fn plan_reads_vllms_data_and_expert_parallel_flags() {
    for flags in [
        &["-dp", "2", "-ep"][..],
        &["--data-parallel-size", "2", "--enable-expert-parallel"],
        &["--data-parallel-size=2", "--enable_expert_parallel"],
    ] {
        let mut args = vec![
            "plan",
            "--vllm",
            "0.19",
            "--device",
            "sim:h100-80gb",
            "--",
            "vllm",
            "serve",
            "Qwen/Qwen3-30B-A3B",
            "--max-model-len",
            "8192",
        ];
        args.extend_from_slice(flags);
        let o = vramscope(&args);
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{flags:?}: {out}\n{err}");
        assert!(
            out.contains("expert parallel over 2 GPUs (tp 1 × dp 2)"),
            "{flags:?}: {out}"
        );
        assert!(!err.contains("not modelled"), "{flags:?}: {err}");
    }
}

/// What is not modelled is refused in one line, naming the setting.
#[test]
fn unmodelled_combinations_are_refused_in_one_line() {
    let base = [
        "profile",
        "--model",
        "preset:qwen3-30b-a3b",
        "--quant",
        "bf16",
        "--no-verify",
    ];
    for (extra, want) in [
        (
            &[
                "--device",
                "sim:h100-80gb:dry",
                "--vllm",
                "0.8",
                "--tp",
                "2",
                "--ep",
            ][..],
            "modelled for the V1 releases",
        ),
        (
            &[
                "--device",
                "sim:h100-80gb:compute",
                "--vllm",
                "0.19",
                "--dp",
                "2",
            ],
            "runs dry only so far",
        ),
        (
            &[
                "--device",
                "sim:h100-80gb:dry",
                "--vllm",
                "0.19",
                "--tp",
                "8",
                "--nodes",
                "2",
            ],
            "ask for fewer nodes",
        ),
        (
            &[
                "--device",
                "sim:h100-80gb:dry",
                "--vllm",
                "0.19",
                "--tp",
                "4",
                "--pp",
                "4",
            ],
            "give --nodes",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let o = vramscope(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}

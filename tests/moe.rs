//! Mixture-of-experts models (Mixtral, Qwen3-MoE) as vLLM 0.8.5 builds and runs them: the
//! published shapes' weights, tensor parallel's shards of each expert, the fused MoE's
//! allocations against PyTorch replaying them on the H200, and the refusals.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::runtime::Runtime;
use vramscope::engine::tensor::DType;
use vramscope::memory::Category;
use vramscope::model::layers::tp::ExpertPlacement;
use vramscope::model::llama::{moe_block_forward, MoeBlock};
use vramscope::model::presets::preset;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;
use vramscope::Error;

fn run(model: &str, quant: Quant, device: &str, tp: u32, vllm: &str) -> Result<Report, Error> {
    let req = ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant,
        device: DeviceSpec::parse(device).unwrap(),
        tp,
        verify: false,
        vllm: vllm.into(),
        ..ProfileRequest::default()
    };
    profile::run(&req, None, Arc::new(AtomicBool::new(false)))
}

/// Qwen3-235B-A22B's bf16 weights on one of `n` ranks, shard by shard as vLLM 0.8.5 cuts
/// them (config: hidden 4096, 94 layers, 64 heads and 4 KV heads of 128, 128 experts of
/// width 1536, vocabulary 151936, 40960 positions, lm_head untied): each expert's width split
/// over the ranks (`intermediate_size_per_partition`), the router, norms and q/k norms whole,
/// one KV head on each rank when there are more ranks than heads, the rotary cache, and the
/// four 0-dim attention scalars of every layer.
fn qwen3_235b_rank_bytes(n: u64) -> u64 {
    let (h, layers, heads, kv, hd, experts, width, vocab, pos) = (
        4096u64, 94u64, 64u64, 4u64, 128u64, 128u64, 1536u64, 151936u64, 40960u64,
    );
    let kv_local = if kv >= n { kv / n } else { 1 };
    let qkv = (heads / n + 2 * kv_local) * hd * h;
    let o = h * (heads / n) * hd;
    let router = experts * h;
    let w13 = experts * 2 * (width / n) * h;
    let w2 = experts * h * (width / n);
    let norms = 2 * h + 2 * hd;
    let per_layer = qkv + o + router + w13 + w2 + norms;
    let vocab_rows = vocab.div_ceil(64) * 64 / n;
    let params = layers * per_layer + 2 * vocab_rows * h + h + pos * hd;
    2 * params + layers * 4 * 4
}

#[test]
fn qwen3_235b_over_8_gpus_holds_vllms_shards_on_every_rank() {
    let started = std::time::Instant::now();
    let r = run(
        "preset:qwen3-235b-a22b",
        Quant::BF16,
        "sim:h200:dry",
        8,
        "0.8",
    )
    .unwrap();
    assert_eq!(r.ranks.len(), 8);
    for rank in &r.ranks {
        assert_eq!(
            rank.weights_tensor_bytes,
            qwen3_235b_rank_bytes(8),
            "rank {}",
            rank.rank
        );
    }
    // 471.8 GB of weights in all, 59.0 GB a rank.
    assert_eq!(qwen3_235b_rank_bytes(8), 58_970_104_288);
    eprintln!("qwen3-235b-a22b --tp 8 dry: {:?}", started.elapsed());
}

#[test]
fn mixtral_and_qwen3_30b_weigh_their_published_parameters() {
    for (name, params) in [
        ("mixtral-8x7b", 46_702_792_704u64),
        ("qwen3-30b-a3b", 30_532_122_624),
    ] {
        let cfg = preset(name).unwrap();
        let r = run(
            &format!("preset:{name}"),
            Quant::BF16,
            "sim:h200:dry",
            1,
            "0.8",
        )
        .unwrap();
        // The stored parameters (vLLM pads neither vocabulary: 32000 and 151936 are
        // multiples of 64), the rotary cache and the attention scalars.
        let extras = (cfg.max_position_embeddings * cfg.head_dim * 2 + cfg.num_layers * 16) as u64;
        assert_eq!(r.weights_tensor_bytes, 2 * params + extras, "{name}");
        assert_eq!(r.model.parameters, params);
        if name == "mixtral-8x7b" {
            // 32 layers × 8 experts × 3 × 14336 × 4096 in the experts, 90.2 GB of bf16.
            assert_eq!(r.model.expert_parameters, 45_097_156_608);
            assert_eq!(
                r.model.experts_sentence(1).unwrap(),
                "mixture of experts: 45.1 B of its 46.7 B parameters are the experts' \
                 (84.00 GiB of weights, all resident); 12.9 B are active per token"
            );
        }
        // Every MoE layer's three parameters, at their full shapes, in the load's events.
        let m = cfg.moe.as_ref().unwrap();
        let block = if name == "mixtral-8x7b" {
            "block_sparse_moe"
        } else {
            "mlp"
        };
        let bytes = |t: &str| {
            r.events
                .iter()
                .find(|e| e.kind == vramscope::memory::EventKind::Alloc && e.tensor == t)
                .map(|e| e.bytes)
                .unwrap_or_else(|| panic!("{name}: no allocation of {t}"))
        };
        let (e, h, i) = (m.num_experts, cfg.hidden_size, m.expert_intermediate_size);
        let p = format!("model.layers.3.{block}");
        assert_eq!(
            bytes(&format!("{p}.experts.w13_weight")),
            (e * 2 * i * h * 2) as u64
        );
        assert_eq!(
            bytes(&format!("{p}.experts.w2_weight")),
            (e * h * i * 2) as u64
        );
        assert_eq!(bytes(&format!("{p}.gate.weight")), (e * h * 2) as u64);
    }
}

/// The order vLLM 0.8.5's constructors create a layer's MoE parameters: Mixtral's router
/// before its experts (mixtral.py L80-97), Qwen3-MoE's after (qwen3_moe.py L113-126).
#[test]
fn the_router_comes_before_mixtrals_experts_and_after_qwen3s() {
    for (name, block, router_first) in [
        ("mixtral-8x7b", "block_sparse_moe", true),
        ("qwen3-30b-a3b", "mlp", false),
    ] {
        let r = run(
            &format!("preset:{name}"),
            Quant::BF16,
            "sim:h200:dry",
            1,
            "0.8",
        )
        .unwrap();
        let order: Vec<&str> = r
            .events
            .iter()
            .filter(|e| e.kind == vramscope::memory::EventKind::Alloc)
            .map(|e| e.tensor.as_str())
            .filter(|t| t.starts_with(&format!("model.layers.0.{block}.")))
            .collect();
        let want = if router_first {
            ["gate.weight", "experts.w13_weight", "experts.w2_weight"]
        } else {
            ["experts.w13_weight", "experts.w2_weight", "gate.weight"]
        }
        .map(|s| format!("model.layers.0.{block}.{s}"));
        assert_eq!(order, want, "{name}");
    }
}

/// The fused MoE's tensors, named in the pass: the peak of Qwen3-30B-A3B's pass at 8192 tokens
/// is owned by the shared cache1/cache3 buffer and cache2 (256 and 96 MiB), and each MoE layer
/// makes its routing tensors and alignment buffers.
#[test]
fn the_fused_moe_buffers_appear_in_every_moe_layer() {
    let req = ProfileRequest {
        model: ModelSource::parse("preset:qwen3-30b-a3b").unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse("sim:h200:dry").unwrap(),
        tokens: 8192,
        seqs: 32,
        verify: false,
        vllm: "0.8".into(),
        ..ProfileRequest::default()
    };
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    // The profile pass's (the CUDA graph capture after the KV cache runs the layers again).
    let allocs = |suffix: &str| -> Vec<u64> {
        r.profile_events()
            .iter()
            .filter(|e| e.kind == vramscope::memory::EventKind::Alloc && e.tensor.ends_with(suffix))
            .map(|e| e.bytes)
            .collect()
    };
    // M·k·max(2I, H) = 8192 · 8 · 2048 bf16, and M·k·I = 8192 · 8 · 768.
    assert_eq!(allocs("moe.intermediate_cache13"), vec![268_435_456; 48]);
    assert_eq!(allocs("moe.intermediate_cache2"), vec![100_663_296; 48]);
    // BLOCK_SIZE_M 128 from E=128,N=768,device_name=NVIDIA_H200.json: 65536 + 128·127
    // sorted ids, 4 bytes each, in a 512-byte block.
    assert_eq!(allocs("moe.sorted_ids"), vec![327_168; 48]);
    assert_eq!(allocs("moe.topk_weights_renormalized").len(), 48);
    // 128 experts is a power of two: no softmax workspace.
    assert!(allocs("moe.topk_softmax_workspace").is_empty());
}

/// Replays one MoE block of preset `name` at 8192 tokens (bf16, one H200) on the allocator and
/// returns the peak over what was allocated before it, as scripts/moe_replay.py measures it
/// with PyTorch (the block's input and weights allocated, the cuBLAS workspace made by a first
/// matmul, then the peak statistics reset).
fn replayed_block_peak(name: &str) -> u64 {
    let spec = DeviceSpec::parse("sim:h200:dry").unwrap();
    let rt = Runtime::new(Device::open(&spec).unwrap(), Arc::default(), None);
    let cfg = preset(name).unwrap();
    let m = cfg.moe.clone().unwrap();
    let (h, e, i, tokens) = (
        cfg.hidden_size,
        m.num_experts,
        m.expert_intermediate_size,
        8192,
    );
    let t = |n: &str, shape: &[usize]| rt.tensor(n, Category::Weight, shape, DType::BF16).unwrap();
    let x = rt
        .tensor("x", Category::Activation, &[tokens, h], DType::BF16)
        .unwrap();
    let block = MoeBlock {
        gate: vramscope::quant::Linear::Dense(t("gate", &[e, h])),
        w13: t("w13", &[e, 2 * i, h]),
        w2: t("w2", &[e, h, i]),
        fp8_scales: None,
        fp8_tensor: None,
        shared: None,
        placement: ExpertPlacement::all(e),
        expert_map: None,
        gate_in_op: false,
    };
    rt.ensure_library_workspaces().unwrap();
    rt.reset_peak();
    let base = rt.stats().allocated;
    let out =
        moe_block_forward(&rt, x, &block, &m, DType::BF16, "layers.0", "NVIDIA H200").unwrap();
    let peak = rt.stats().allocated_peak - base;
    // The output is the input, written in place: dropping it frees the input, and nothing
    // else is left.
    assert_eq!(out.shape, vec![tokens, h]);
    drop(out);
    let input = (tokens * h * 2) as u64;
    assert_eq!(rt.stats().allocated + input, base, "{name}");
    peak
}

/// PyTorch 2.11 on the H200 replaying vLLM 0.8.5's block (scripts/moe_replay.py, run 52 of
/// docs/gpu-runs.md): `peak_over_input` 372,050,432 B for Qwen3-30B-A3B
/// (`128 8 2048 768 8192 1 128`) and 1,409,619,456 B for Mixtral-8x7B
/// (`8 2 4096 14336 8192 1 128`), nothing left after.
#[test]
fn one_moe_block_peaks_where_pytorch_replaying_vllm_peaks() {
    let peak = replayed_block_peak("qwen3-30b-a3b");
    // At the peak (inside the experts): router logits [8192, 128] bf16 (2 MiB), the
    // renormalised topk weights [8192, 8] f32 and topk ids [8192, 8] int32 (256 KiB each),
    // cache13 (256 MiB), cache2 (96 MiB), sorted ids (327,168 B), expert ids (639 int32 in a
    // 2,560-byte block) and num_tokens_post_pad (one 512-byte block). The f32 copy of the
    // logits and the first weights died with the routing.
    let expected = 2_097_152 + 2 * 262_144 + 268_435_456 + 100_663_296 + 327_168 + 2_560 + 512;
    assert_eq!(expected, 372_050_432);
    assert_eq!(peak, expected);
    assert_eq!(replayed_block_peak("mixtral-8x7b"), 1_409_619_456);
}

#[test]
fn moe_is_refused_where_it_is_not_modelled() {
    let e = run("preset:mixtral-8x7b", Quant::Int8, "sim:h200:dry", 1, "0.8")
        .unwrap_err()
        .to_string();
    assert!(e.contains("16 bits only"), "{e}");
    // 0.21 runs FlashInfer's TRT-LLM BF16 MoE on the B200 (its CUTLASS MoE on Hopper is
    // modelled: tests/moe_v1_oracle.rs).
    let e = run(
        "preset:qwen3-30b-a3b",
        Quant::BF16,
        "sim:b200:dry",
        1,
        "0.21",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--vllm 0.21") && e.contains("TRT-LLM BF16 MoE") && e.contains("Hopper"),
        "{e}"
    );
    // Each expert's width must divide over the GPUs: 768 over 5 does not.
    let e = run(
        "preset:qwen3-30b-a3b",
        Quant::BF16,
        "sim:h200:dry",
        3,
        "0.8",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--tp 3"), "{e}");
    // Qwen2-MoE's shared expert splits over the GPUs too: 96 over 5 does not.
    let mut c = common::qwen1_5_moe_config();
    c["shared_expert_intermediate_size"] = 96.into();
    c["moe_intermediate_size"] = 640.into();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    let e = run(
        dir.path().join("config.json").to_str().unwrap(),
        Quant::BF16,
        "sim:h200:dry",
        5,
        "0.8",
    );
    // 16 heads do not divide over 5 GPUs either: whichever check speaks, it names --tp 5.
    assert!(e.unwrap_err().to_string().contains("--tp 5"));
}

/// Qwen1.5-MoE-A2.7B planned from its config.json: the model card's 14.3 B parameters, 2.7 B
/// active (the shared expert and its gate count in full); the bf16 weights vLLM 0.8.5 holds
/// (each parameter, the rotary cache `[8192, 128]`, four 0-dim attention scalars a layer);
/// per rank over 2 GPUs, each expert's and the shared expert's width halved, the router and the
/// shared expert's gate whole; the shared expert's tensors in every layer's pass.
#[test]
fn qwen1_5_moe_from_its_config_weighs_its_published_parameters() {
    let c = vramscope::model::ModelConfig::from_hf_json(&common::qwen1_5_moe_config()).unwrap();
    let m = c.moe.clone().unwrap();
    assert_eq!(m.shared_expert_intermediate_size, 5632);
    assert!(c.attention_bias);
    let (h, layers, vocab, e, i, s) = (2048u64, 24u64, 151936u64, 60u64, 1408u64, 5632u64);
    let attn = 4 * h * h + 3 * h;
    let per_layer = attn + e * 3 * h * i + 3 * h * s + h + e * h + 2 * h;
    let params = layers * per_layer + 2 * vocab * h + h;
    assert_eq!(params, 14_315_784_192);
    assert_eq!(c.param_count(), params);
    assert_eq!(c.active_param_count(), 2_689_173_504);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, common::qwen1_5_moe_config().to_string()).unwrap();
    let one = run(
        path.to_str().unwrap(),
        Quant::BF16,
        "sim:h200:dry",
        1,
        "0.8",
    )
    .unwrap();
    assert_eq!(
        one.weights_tensor_bytes,
        2 * (params + 8192 * 128) + layers * 16
    );
    let two = run(
        path.to_str().unwrap(),
        Quant::BF16,
        "sim:h200:dry",
        2,
        "0.8",
    )
    .unwrap();
    let rank =
        layers * (attn / 2 + e * 3 * h * i / 2 + 3 * h * s / 2 + h + e * h + 2 * h) + vocab * h + h;
    assert_eq!(
        two.weights_tensor_bytes,
        2 * (rank + 8192 * 128) + layers * 16
    );
    for l in 0..layers {
        for t in [
            "shared_expert.act",
            "shared_expert.gated",
            "moe.plus_shared",
        ] {
            let name = format!("layers.{l}.{t}");
            assert!(
                one.events.iter().any(|ev| ev.tensor == name),
                "no {name} in the pass"
            );
        }
    }
}

/// Qwen2-MoE's sparse block in CPU compute mode against the block written out by hand from
/// vLLM 0.8.5's qwen2_moe.py (L90-94, L140-160) and fused_moe's routing: for each token,
/// `softmax(x·Gᵀ)` in f32, its top-k (not renormalised), `Σ p_e · W2_e(silu(W1_e x) ⊙ W3_e x)`,
/// plus `sigmoid(x·gᵀ) · D(silu(A x) ⊙ B x)` for the shared expert; 6 experts (not a power of
/// two: topk_softmax's workspace), 2 a token, widths 24 and 40 over 16 inputs, 5 tokens. The
/// block as 0.29-0.33 run it (the shared expert inside the modular kernel's op) computes the
/// same.
#[test]
fn qwen2_moe_block_computes_what_its_model_file_computes() {
    use vramscope::model::config::MoeShape;
    use vramscope::model::llama::SharedExpert;
    use vramscope::quant::{FusedLinear, Linear};

    let (h, e, i, s, k, m) = (16usize, 6usize, 24usize, 40usize, 2usize, 5usize);
    let spec = DeviceSpec::parse("sim:h100-80gb").unwrap();
    let rt = Runtime::new(Device::open(&spec).unwrap(), Arc::default(), None);
    // Deterministic values in [-0.5, 0.5): a small LCG, independent of the product's seeding.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut vals = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    };
    let t = |name: &str, shape: &[usize], data: &[f32], cat: Category| {
        let mut x = rt.tensor(name, cat, shape, DType::F32).unwrap();
        x.f32_mut().copy_from_slice(data);
        x
    };
    let (xv, gv) = (vals(m * h, 2.0), vals(e * h, 2.0));
    let (w13v, w2v) = (vals(e * 2 * i * h, 1.0), vals(e * h * i, 1.0));
    let (guv, dv, sgv) = (vals(2 * s * h, 1.0), vals(h * s, 1.0), vals(h, 2.0));
    let block = MoeBlock {
        gate: vramscope::quant::Linear::Dense(t("gate", &[e, h], &gv, Category::Weight)),
        w13: t("w13", &[e, 2 * i, h], &w13v, Category::Weight),
        w2: t("w2", &[e, h, i], &w2v, Category::Weight),
        fp8_scales: None,
        fp8_tensor: None,
        shared: Some(SharedExpert {
            gate_up: FusedLinear::Dense {
                weight: t("gate_up", &[2 * s, h], &guv, Category::Weight),
                rows: vec![s, s],
            },
            down: Linear::Dense(t("down", &[h, s], &dv, Category::Weight)),
            gate: t("shared_gate", &[1, h], &sgv, Category::Weight),
            width: s,
        }),
        placement: ExpertPlacement::all(e),
        expert_map: None,
        gate_in_op: false,
    };
    let shape = MoeShape {
        num_experts: e,
        top_k: k,
        expert_intermediate_size: i,
        renormalize: false,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        shared_expert_intermediate_size: s,
    };
    let x = t("x", &[m, h], &xv, Category::Activation);
    let out = moe_block_forward(&rt, x, &block, &shape, DType::F32, "layers.0", "cpu").unwrap();
    let ours = out.f32().to_vec();
    // 0.29-0.33's modular kernel with the shared expert inside the op (its expert gate applied
    // inside `Qwen2MoeMLP.forward`, the sum `shared + routed` after the op): the same math.
    let x = t("x", &[m, h], &xv, Category::Activation);
    let workspace = std::cell::RefCell::new(None);
    let kernel =
        vramscope::engine::ops_moe_v1::MoeKernel::Modular(vramscope::engine::ops_moe_v1::Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: Some(vramscope::engine::ops_moe_v1::RunnerV021::V0_21),
        });
    let v2 = vramscope::model::layers::moe::moe_block_forward_as(
        &rt,
        x,
        &block,
        &shape,
        (DType::F32, kernel, Some(&workspace)),
        "layers.0",
        "cpu",
    )
    .unwrap();
    let ours_v2 = v2.f32().to_vec();

    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
    let silu = |v: f32| v / (1.0 + (-v).exp());
    // rows × [out, in] weight times x.
    let mv = |w: &[f32], rows: usize, x: &[f32]| -> Vec<f32> {
        (0..rows)
            .map(|r| dot(&w[r * x.len()..(r + 1) * x.len()], x))
            .collect()
    };
    let swiglu = |gate_up: &[f32], down: &[f32], width: usize, x: &[f32]| -> Vec<f32> {
        let gu = mv(gate_up, 2 * width, x);
        let a: Vec<f32> = (0..width).map(|j| silu(gu[j]) * gu[width + j]).collect();
        mv(down, h, &a)
    };
    let mut expected = Vec::new();
    let mut gaps = Vec::new();
    for tok in 0..m {
        let xr = &xv[tok * h..(tok + 1) * h];
        let logits = mv(&gv, e, xr);
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = logits.iter().map(|l| (l - max).exp()).sum();
        let p: Vec<f32> = logits.iter().map(|l| (l - max).exp() / z).collect();
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        gaps.push(p[order[k - 1]] - p[order[k]]);
        let mut y = vec![0f32; h];
        for &ex in &order[..k] {
            let w13 = &w13v[ex * 2 * i * h..(ex + 1) * 2 * i * h];
            let w2 = &w2v[ex * h * i..(ex + 1) * h * i];
            for (d, v) in y.iter_mut().zip(swiglu(w13, w2, i, xr)) {
                *d += p[ex] * v;
            }
        }
        let g = 1.0 / (1.0 + (-dot(&sgv, xr)).exp());
        for (d, v) in y.iter_mut().zip(swiglu(&guv, &dv, s, xr)) {
            *d += g * v;
        }
        expected.extend(y);
    }
    // The routing is not near a tie, so both pick the same experts.
    assert!(gaps.iter().all(|&g| g > 1e-4), "{gaps:?}");
    let err = vramscope::app::bench::relative_l2(&ours, &expected);
    assert!(err < 1e-5, "relative L2 {err:.3e}");
    let err = vramscope::app::bench::relative_l2(&ours_v2, &expected);
    assert!(err < 1e-5, "0.29's block: relative L2 {err:.3e}");
    let norm = expected.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 0.1, "{norm}");
}

/// V1's modular fused MoE (0.15, 0.19) computes what the in-place kernel computes: the same
/// routing (renormalised inside the kernel instead of by two tensors) and the same experts,
/// into a new output instead of the input; the input is left as it was, and the workspace
/// is made once and kept.
#[test]
fn the_modular_kernel_computes_what_the_in_place_kernel_computes() {
    use std::cell::RefCell;
    use vramscope::engine::ops_moe_v1::{Modular, MoeKernel};
    use vramscope::model::config::MoeShape;
    use vramscope::model::layers::moe::moe_block_forward_as;

    let (h, e, i, k, m) = (16usize, 8usize, 24usize, 2usize, 7usize);
    let spec = DeviceSpec::parse("sim:h100-80gb").unwrap();
    let rt = Runtime::new(Device::open(&spec).unwrap(), Arc::default(), None);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
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
    let block = MoeBlock {
        gate: vramscope::quant::Linear::Dense(t("gate", &[e, h], &gv)),
        w13: t("w13", &[e, 2 * i, h], &w13v),
        w2: t("w2", &[e, h, i], &w2v),
        fp8_scales: None,
        fp8_tensor: None,
        shared: None,
        placement: ExpertPlacement::all(e),
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
    let in_place = moe_block_forward(
        &rt,
        t("x", &[m, h], &xv),
        &block,
        &shape,
        DType::F32,
        "layers.0",
        "cpu",
    )
    .unwrap();
    let workspace = RefCell::new(None);
    let kernel = MoeKernel::Modular(Modular {
        chunk_tokens: Some(4),
        default_block_m_by_tokens: true,
        v0_21: None,
    });
    let modular = moe_block_forward_as(
        &rt,
        t("x", &[m, h], &xv),
        &block,
        &shape,
        (DType::F32, kernel, Some(&workspace)),
        "layers.0",
        "cpu",
    )
    .unwrap();
    assert_eq!(in_place.f32(), modular.f32());
    assert!(in_place.f32().iter().any(|v| v.abs() > 1e-3));
    // Two chunks of at most 4 tokens: the workspace holds one chunk's caches and the output.
    let r256 = |v: usize| v.div_ceil(256) * 256;
    let want = r256(4 * 4 * k * i.max(h)) + r256(4 * 4 * k * (2 * i).max(h)) + r256(4 * m * h);
    let ws = workspace.borrow();
    assert!(ws.as_ref().unwrap().nbytes() >= want as u64);
}

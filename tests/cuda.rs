//! Checks that need an NVIDIA GPU (ignored: CI has none). On a GPU machine:
//! `cargo test --release --test cuda -- --ignored --test-threads 1`.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::app::bench::{self, relative_l2, BenchRequest};
use vramscope::device::{Device, DeviceSpec};
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest};
use vramscope::quant::Quant;
use vramscope::Error;

fn logits(
    model: &str,
    quant: Quant,
    device: &str,
    tokens: usize,
    seqs: usize,
    thr: f32,
) -> Vec<f32> {
    let req = BenchRequest {
        model: ModelSource::parse(model).unwrap(),
        quant,
        device: DeviceSpec::parse(device).unwrap(),
        tokens,
        seqs,
        iters: 1,
        fast_weights: false,
        int8_threshold: thr,
        seed: 0,
        op_times: false,
        sampler_rows: 0,
        sampler_seqs: 256,
        tp: 1,
        ep: false,
    };
    let r = bench::run(&req).unwrap();
    assert_eq!(r.logits.len() % seqs, 0);
    r.logits
}

fn gpu_vs_cpu(model: &str, quant: Quant, tokens: usize, seqs: usize, thr: f32) -> f64 {
    let gpu = logits(model, quant, "cuda:0", tokens, seqs, thr);
    let cpu = logits(model, quant, "sim:h100-80gb", tokens, seqs, thr);
    assert_eq!(gpu.len(), cpu.len());
    assert!(gpu.iter().all(|v| v.is_finite()));
    let e = relative_l2(&gpu, &cpu);
    eprintln!("{model} {quant}: relative L2 GPU vs CPU {e:.3e}");
    e
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fp16_logits_on_the_gpu_match_cpu_compute_mode_on_tiny() {
    assert!(gpu_vs_cpu("preset:tiny", Quant::F16, 100, 3, 0.0) < 1e-2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fp16_logits_on_the_gpu_match_cpu_compute_mode_on_smollm2() {
    assert!(gpu_vs_cpu("preset:smollm2-135m", Quant::F16, 96, 2, 0.0) < 1e-2);
}

/// Qwen3's per-head q/k RMSNorm on the GPU (the norm's row is one head: head_dim columns).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qwen3_logits_on_the_gpu_match_cpu_compute_mode() {
    assert!(gpu_vs_cpu("preset:qwen3-0.6b", Quant::F16, 96, 2, 0.0) < 1e-2);
}

/// Profiles `model` (16-bit, `--vllm 0.8`, two passes) on cuda:0 and on a dry H200 and checks
/// that they allocate alike: the weights, each pass's peak, every allocation's bytes and
/// tensor name. Returns the number of allocations.
fn gpu_trace_equals_dry(model: &str, quant: Quant, tokens: usize, seqs: usize, len: u64) -> usize {
    gpu_trace_equals_dry_under(model, quant, (tokens, seqs, len), "0.8")
}

/// The simulated preset of the GPU in `cuda:0` (the tuned MoE and attention configs follow the
/// device's name): an H100's or, for any other card, the H200's.
fn dry_twin() -> &'static str {
    let name = Device::open(&DeviceSpec::parse("cuda:0").unwrap())
        .unwrap()
        .info()
        .name;
    if name.contains("H100") {
        "sim:h100-sxm:dry"
    } else {
        "sim:h200:dry"
    }
}

fn gpu_trace_equals_dry_under(
    model: &str,
    quant: Quant,
    dims: (usize, usize, u64),
    vllm: &str,
) -> usize {
    gpu_trace_equals_dry_with(model, quant, dims, (vllm, false))
}

/// `gpu_trace_equals_dry_under` with `--enforce-eager` when `eager`.
fn gpu_trace_equals_dry_with(
    model: &str,
    quant: Quant,
    (tokens, seqs, len): (usize, usize, u64),
    (vllm, eager): (&str, bool),
) -> usize {
    let run = |device: &str| {
        let req = ProfileRequest {
            model: ModelSource::parse(model).unwrap(),
            quant,
            device: DeviceSpec::parse(device).unwrap(),
            tokens,
            seqs,
            max_model_len: len,
            passes: 2,
            verify: false,
            vllm: vllm.into(),
            enforce_eager: eager,
            ..ProfileRequest::default()
        };
        let t = std::time::Instant::now();
        let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
        eprintln!(
            "{model} under {vllm} on {device}: {:.1} s",
            t.elapsed().as_secs_f64()
        );
        r
    };
    let gpu = run("cuda:0");
    let dry = run(dry_twin());
    assert_eq!(gpu.weights_bytes, dry.weights_bytes);
    for (g, d) in gpu.passes.iter().zip(&dry.passes) {
        eprintln!(
            "{model} pass peak GPU {} dry {}",
            g.peak_allocated, d.peak_allocated
        );
        assert_eq!(g.peak_allocated, d.peak_allocated);
    }
    // Load and passes (to t3): the CUDA graphs after them are captured on the GPU only for
    // dense 16-bit models, dry for every model.
    let allocs = |r: &vramscope::profile::Report| {
        r.profile_events()
            .iter()
            .filter(|e| e.kind == vramscope::memory::EventKind::Alloc)
            .map(|e| (e.bytes, e.tensor.clone()))
            .collect::<Vec<_>>()
    };
    let (g, d) = (allocs(&gpu), allocs(&dry));
    eprintln!("{model}: {} allocations", g.len());
    assert_eq!(g, d);
    g.len()
}

/// A family's small seeded checkpoint (tests/common's reference shapes, the ones its logits
/// are held against transformers with), written to a temporary folder.
fn family_fixture(name: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    common::write_hf_test_model(dir.path(), name);
    let path = dir.path().display().to_string();
    (dir, path)
}

/// Multi-head latent attention (DeepSeek-V2's layout, and V3's low-rank query), Gemma 1, 2
/// and 3 (GemmaRMSNorm, GeGLU, soft-caps, a 4-token sliding window, scaled rotary), Granite's
/// multipliers and Phi-2's LayerNorm, gelu_new and partial rotary: the GPU's logits against
/// the CPU's on the same seeded weights.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_mla_gemma_granite_and_phi_logits_on_the_gpu_match_cpu_compute_mode() {
    let mut worst = Vec::new();
    for name in [
        "deepseek_v2_dense",
        "deepseek_v3_dense",
        "gemma",
        "gemma2",
        "gemma3",
        "granite",
        "phi",
    ] {
        let (_dir, path) = family_fixture(name);
        let e = gpu_vs_cpu(&path, Quant::F16, 100, 3, 0.0);
        eprintln!("{name}: relative L2 GPU vs CPU {e:.3e}");
        worst.push((name, e));
    }
    for (name, e) in worst {
        assert!(e < 1e-2, "{name}: relative L2 {e:.3e}");
    }
}

/// An MLA model (DeepSeek-V2's dense layout at the reference shape) under V1 0.19: its
/// profile pass on the GPU allocates what the dry run allocates, allocation for allocation.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn an_mla_model_on_the_gpu_allocates_what_the_dry_run_allocates() {
    let (_dir, path) = family_fixture("deepseek_v2_dense");
    for vllm in ["0.19", "0.11"] {
        let n = gpu_trace_equals_dry_under(&path, Quant::F16, (1024, 4, 1024), vllm);
        assert!(n > 50, "{n} allocations");
    }
}

/// Gemma 2 at the reference shape (sliding-window and full layers alternating: V1's hybrid
/// KV groups) under V1 0.19: GPU = dry, allocation for allocation.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_sliding_window_model_on_the_gpu_allocates_what_the_dry_run_allocates() {
    let (_dir, path) = family_fixture("gemma2");
    let n = gpu_trace_equals_dry_under(&path, Quant::F16, (1024, 4, 1024), "0.19");
    assert!(n > 50, "{n} allocations");
}

/// Qwen3-0.6B's profile pass on the GPU allocates what the dry run allocates, pass by pass.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn qwen3_gpu_trace_matches_the_dry_run() {
    let max_model_len = ProfileRequest::default().max_model_len;
    gpu_trace_equals_dry("preset:qwen3-0.6b", Quant::F16, 2048, 16, max_model_len);
}

// Sequences of several 64-token tiles, neither a multiple of 64: the fused attention's key
// loop, its diagonal mask and its ragged last tile (head_dim 64, then 32).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fused_attention_over_several_tiles_matches_cpu_compute_mode_on_smollm2() {
    assert!(gpu_vs_cpu("preset:smollm2-135m", Quant::F16, 333, 2, 0.0) < 1e-2);
    assert!(gpu_vs_cpu("preset:smollm2-135m", Quant::BF16, 333, 2, 0.0) < 3e-2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fused_attention_over_several_tiles_matches_cpu_compute_mode_on_tiny() {
    assert!(gpu_vs_cpu("preset:tiny", Quant::F16, 401, 2, 0.0) < 1e-2);
}

// head_dim 128 (Llama 3's): every fused kernel built for it, selected with VRAMSCOPE_FLASH
// (VRAMSCOPE_TEST_FLASH_VARIANTS, comma-separated, narrows the list), against the CPU on a
// small model of that head size. 333 tokens in 2 sequences and 700 in one
// cross the 128- and 256-query tiles and the 32- and 64-key tiles with ragged ends.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_fused_attention_kernel_matches_cpu_compute_mode_at_head_dim_128() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = vramscope::model::presets::preset("tiny").unwrap();
    c.hidden_size = 256;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 128;
    c.num_layers = 2;
    let opts = vramscope::model::GenOptions {
        dtype: vramscope::model::weights::StoredDtype::F16,
        seed: 0,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    vramscope::model::gen_model_config(&c, "d128", dir.path(), &opts).unwrap();
    let model = dir.path().to_str().unwrap().to_string();
    let listed =
        std::env::var("VRAMSCOPE_TEST_FLASH_VARIANTS").unwrap_or_else(|_| ",wgs,wg,w8l,w4".into());
    for variant in listed.split(',') {
        std::env::set_var("VRAMSCOPE_FLASH", variant);
        for (tokens, seqs) in [(333, 2), (700, 1)] {
            let e = gpu_vs_cpu(&model, Quant::F16, tokens, seqs, 0.0);
            eprintln!("VRAMSCOPE_FLASH={variant:?} {tokens} tokens in {seqs}: {e:.3e}");
            assert!(e < 1e-2, "variant {variant:?}: {e}");
        }
        // bf16 through the same kernels (their other template instance).
        let e = gpu_vs_cpu(&model, Quant::BF16, 333, 2, 0.0);
        eprintln!("VRAMSCOPE_FLASH={variant:?} bf16 333 tokens in 2: {e:.3e}");
        assert!(e < 3e-2, "variant {variant:?} bf16: {e}");
    }
    std::env::remove_var("VRAMSCOPE_FLASH");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn bf16_logits_on_the_gpu_match_cpu_compute_mode_on_tiny() {
    assert!(gpu_vs_cpu("preset:tiny", Quant::BF16, 100, 3, 0.0) < 3e-2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn int8_with_outlier_columns_matches_cpu_compute_mode_on_tiny() {
    // A low threshold makes sure some columns take the 16-bit outlier path.
    assert!(gpu_vs_cpu("preset:tiny", Quant::Int8, 100, 3, 1.0) < 2e-2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn nf4_logits_on_the_gpu_match_cpu_compute_mode_on_tiny() {
    assert!(gpu_vs_cpu("preset:tiny", Quant::Nf4, 100, 3, 0.0) < 1e-2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn out_of_memory_is_an_error_and_leaves_free_memory_where_it_was() {
    let mut d = Device::open(&DeviceSpec::Cuda { ordinal: 0 }).unwrap();
    let before = d.mem_info();
    let r = d.alloc_outside(before.total * 2);
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    let after = d.mem_info();
    assert!(
        before.free.abs_diff(after.free) < 4 << 20,
        "{before:?} → {after:?}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_gpu_framework_trace_matches_the_dry_run() {
    let run = |device: &str| {
        let req = ProfileRequest {
            model: ModelSource::parse("preset:tiny").unwrap(),
            quant: Quant::Int8,
            device: DeviceSpec::parse(device).unwrap(),
            tokens: 512,
            max_model_len: 512,
            seqs: 2,
            passes: 2,
            verify: false,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let gpu = run("cuda:0");
    let dry = run("sim:h100-80gb:dry");
    assert_eq!(gpu.weights_bytes, dry.weights_bytes);
    assert_eq!(gpu.passes.len(), dry.passes.len());
    for (g, d) in gpu.passes.iter().zip(&dry.passes) {
        assert_eq!(g.peak_allocated, d.peak_allocated);
        assert_eq!(g.quant_state_allocated_bytes, d.quant_state_allocated_bytes);
    }
    assert_eq!(gpu.quant_state_after_bytes, dry.quant_state_after_bytes);
    assert!(gpu.truth.non_kv_bytes > 0);
    // The NVML sampler's readings come with the report, on the events' clock; none on the
    // simulated device.
    let end = gpu.events.last().unwrap().time_us;
    assert!(
        gpu.device_samples.len() > 10,
        "{}",
        gpu.device_samples.len()
    );
    assert!(gpu.sample_rate_hz.unwrap() > 100.0);
    assert!(gpu
        .device_samples
        .windows(2)
        .all(|w| w[0].time_us <= w[1].time_us));
    assert!(gpu.device_samples.iter().all(|s| s.process_used > 0));
    assert!(gpu.device_samples.first().unwrap().time_us <= end);
    assert!(dry.device_samples.is_empty() && dry.sample_rate_hz.is_none());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn devices_lists_the_gpu_with_its_memory() {
    let (list, why) = vramscope::device::list_devices();
    assert!(why.is_none(), "{why:?}");
    let gpu = list.iter().find(|d| !d.simulated).expect("a GPU");
    assert_eq!(gpu.spec, "cuda:0");
    // Numbered by the CUDA driver's ordinal (what `--device cuda:N` opens), not NVML's index.
    assert!(!gpu.name.contains("numbered by NVML"), "{}", gpu.name);
    assert!(gpu.total_bytes > 1 << 30);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn an_allocation_too_big_fails_after_emptying_the_cache_and_frees_everything() {
    use vramscope::engine::runtime::Runtime;
    use vramscope::memory::Category;
    let d = Device::open(&DeviceSpec::Cuda { ordinal: 0 }).unwrap();
    let start = d.mem_info();
    let rt = Runtime::new(d, Arc::new(AtomicBool::new(false)), None);
    let t = rt
        .reserve_bytes("cached", Category::Activation, 1 << 30)
        .unwrap();
    drop(t);
    assert!(rt.stats().reserved >= 1 << 30, "the block stays cached");
    let r = rt.reserve_bytes("too-big", Category::Activation, start.total * 2);
    assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}");
    assert_eq!(rt.stats().reserved, 0, "the retry emptied the cache");
    let end = rt.with_device(|d| d.mem_info());
    assert!(
        start.free.abs_diff(end.free) < 4 << 20,
        "{start:?} → {end:?}"
    );
}

// Issue 4's int8 acceptance on the real GPU: Llama-3-8B int8 at 8192 tokens. Weights and the
// framework peak of every pass equal the dry run's; the old formula counts the surviving CxB
// state as non-torch memory (so its KV budget is smaller by that much); the new formula's
// non-KV is within max(1 %, 64 MiB) of the measured truth; its verify pass (KV cache it grants
// + one more max-batch pass, inside T·u) gets through.
#[test]
#[ignore = "needs an NVIDIA GPU with 40 GB free"]
fn int8_llama_3_8b_on_the_gpu_shows_what_the_formulas_predict() {
    use vramscope::profile::formulas::FormulaId;
    let run = |device: &str| {
        let req = ProfileRequest {
            model: ModelSource::parse("preset:llama-3-8b").unwrap(),
            quant: Quant::Int8,
            device: DeviceSpec::parse(device).unwrap(),
            tokens: 8192,
            // vLLM's profile pass and the two serving passes after it: the state made in the
            // first pass is freed and rebuilt in the second.
            passes: 3,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let gpu = run("cuda:0");
    let dry = run("sim:h200-141gb:dry");
    assert_eq!(gpu.weights_bytes, dry.weights_bytes);
    let profile_passes = |r: &profile::Report| -> Vec<u64> {
        r.passes
            .iter()
            .filter(|p| p.verify_for.is_none())
            .map(|p| p.peak_allocated)
            .collect()
    };
    assert_eq!(profile_passes(&gpu).len(), 3);
    assert_eq!(profile_passes(&gpu), profile_passes(&dry));
    let state = gpu.quant_state_after_bytes as i64;
    assert_eq!(state, dry.quant_state_after_bytes as i64);
    assert!(state > 6 << 30, "{state}");
    let old = gpu.formula(FormulaId::Pr9352).unwrap();
    let new = gpu.formula(FormulaId::Pr9516).unwrap();
    // The old budget is smaller by the surviving state, less what only the new formula charges:
    // the memory this process held before the pass (CUDA context, NVRTC module).
    let t0 = &gpu.checkpoints.t0;
    let context = (t0.total - t0.free) as i64;
    let gap = new.kv_bytes - old.kv_bytes;
    assert!(
        (gap - (state - context)).abs() < 64 << 20,
        "gap {gap}, state {state}, context {context}"
    );
    // With vLLM's sampler in the pass, the new formula misses the allocator's fragmentation at
    // the sampler's peak (R − A there, not at t3): about 400 MiB here (docs/gpu-runs.md run
    // 26). The GPU must show what the dry run predicts, to within the context's difference.
    let truth = gpu.truth.non_kv_bytes;
    let dry_new = dry.formula(FormulaId::Pr9516).unwrap().error_bytes;
    assert!(
        (new.error_bytes - dry_new).abs() <= 96 << 20,
        "new formula's error {} on the GPU, {dry_new} in the dry run (truth {truth})",
        new.error_bytes
    );
    assert!(
        new.error_bytes.unsigned_abs() < t0.total / 200,
        "{}",
        new.error_bytes
    );
    let v = new.verify.clone().unwrap();
    eprintln!("new formula verify: {v:?}");
    assert!(v.ran && !v.oom, "{v:?}");
    let t = gpu.truth.verify.clone().unwrap();
    assert!(t.ran && !t.oom, "{t:?}");
}

// vLLM's `test_memory_profiling` on the real GPU: another process holds 512 MiB, 512 MiB of
// weights, a 1 GiB activation spike and 256 MiB outside the framework during the pass. #10511's
// terms come out as vLLM's test expects; #9516 charges the other process, whose own CUDA
// context comes on top of what it was asked to hold (the report keeps the measured amount).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn vllm_test_memory_profiling_on_the_gpu() {
    use vramscope::profile::formulas::FormulaId;
    const MIB: i64 = 1 << 20;
    let req = ProfileRequest {
        model: ModelSource::parse("synthetic:512MiB:1GiB").unwrap(),
        device: DeviceSpec::parse("cuda:0").unwrap(),
        outside_before: 512 << 20,
        outside_during: 256 << 20,
        ..ProfileRequest::default()
    };
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    let f = r.formula(FormulaId::Pr10511).unwrap();
    assert_eq!(f.torch_peak_bytes, 1024 * MIB);
    assert!(
        (f.non_torch_bytes - 256 * MIB).abs() <= 256 * MIB / 20,
        "non-torch increase {}",
        f.non_torch_bytes
    );
    let other = r.other_process_bytes as i64;
    assert!((512 * MIB..2048 * MIB).contains(&other), "{other}");
    let new = r.formula(FormulaId::Pr9516).unwrap();
    assert!(
        new.non_torch_bytes >= other + 256 * MIB,
        "{}",
        new.non_torch_bytes
    );
}

/// vLLM's sampler on the GPU and on the CPU, on the same fp16 logits `[256, 50304]` with the
/// same draws: the same probs (to f32 rounding of the reductions) and the same sampled tokens
/// wherever the winning margin is not within rounding.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_gpu_sampler_matches_the_cpu_sampler() {
    use vramscope::engine::runtime::Runtime;
    use vramscope::engine::tensor::DType;
    use vramscope::memory::Category;
    use vramscope::model::llama::Batch;
    use vramscope::model::sampler::{self, Sampler};
    let (rows, vocab, padded) = (256usize, 50_272usize, 50_304usize);
    // Logits with the spread of a real model's: a few large, a long tail.
    let values: Vec<f32> = (0..rows * padded)
        .map(|i| {
            let (r, c) = (i / padded, i % padded);
            if c >= vocab {
                return 0.0;
            }
            let h = ((c as u64 * 2_654_435_761 + r as u64 * 97) % 10_007) as f32 / 10_007.0;
            half::f16::from_f32(8.0 * h * h * h - 2.0).to_f32()
        })
        .collect();
    let run = |spec: &str| {
        let dev = Device::open(&DeviceSpec::parse(spec).unwrap()).unwrap();
        let rt = Runtime::new(dev, Arc::new(AtomicBool::new(false)), None);
        let batch = Batch::dummy(2048, rows, vocab);
        let input = sampler::prepare_model_input(&rt, &batch).unwrap();
        let mut logits = rt
            .tensor("logits", Category::Sampler, &[rows, padded], DType::F16)
            .unwrap();
        if spec.starts_with("cuda") {
            vramscope::engine::ops::upload_f32(&rt, &mut logits, &values).unwrap();
        } else {
            logits.f32_mut().copy_from_slice(&values);
        }
        let s = Sampler::new(11);
        s.head_rows.set(rows);
        let out = s.forward(&rt, &logits, vocab, &input).unwrap();
        (out, rt.stats().allocated_peak)
    };
    let (gpu, gpu_peak) = run("cuda:0");
    let (cpu, cpu_peak) = run("sim:h200-141gb");
    assert_eq!(gpu_peak, cpu_peak, "the same allocations on both");
    let err = gpu
        .probs_head
        .iter()
        .zip(&cpu.probs_head)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("sampler probs GPU vs CPU: max abs error {err:.3e}");
    assert!(err < 1e-5, "{err}");
    let same = gpu.ids.iter().zip(&cpu.ids).filter(|(a, b)| a == b).count();
    eprintln!("sampled tokens equal in {same} of {rows} rows");
    assert!(same >= rows - 2, "{same} of {rows}");
}

/// fp8 on the GPU against CPU compute mode on the same model: `(GPU fp8 vs CPU fp8, CPU fp8
/// vs CPU fp16)`, relative L2 of the logits. The first is not held to fp16's 1e-2: Hopper's
/// fp8 tensor cores accumulate with about 14 bits (see the one-linear test), and every
/// activation quantized to e4m3 (3 mantissa bits) that lands on the other side of a rounding
/// boundary moves a whole fp8 step; through the layers of a model with random weights these
/// grow to a fraction of fp8's own distance from fp16. A wrong kernel (a shard, a scale, a
/// layout) lands at fp8's distance or beyond; the bound is below it.
fn gpu_vs_cpu_fp8(model: &str, tokens: usize, seqs: usize) -> (f64, f64) {
    let gpu = logits(model, Quant::Fp8, "cuda:0", tokens, seqs, 0.0);
    let cpu = logits(model, Quant::Fp8, "sim:h100-80gb", tokens, seqs, 0.0);
    let cpu16 = logits(model, Quant::F16, "sim:h100-80gb", tokens, seqs, 0.0);
    assert!(gpu.iter().all(|v| v.is_finite()));
    let (e, q) = (relative_l2(&gpu, &cpu), relative_l2(&cpu, &cpu16));
    eprintln!("{model} fp8: relative L2 GPU vs CPU {e:.3e}; fp8 vs fp16 on the CPU {q:.3e}");
    (e, q)
}

#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.9 or more"]
fn fp8_logits_on_the_gpu_match_cpu_compute_mode_on_tiny() {
    let (e, q) = gpu_vs_cpu_fp8("preset:tiny", 100, 3);
    assert!(e < 0.75 * q, "{e} vs {q}");
}

#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.9 or more"]
fn fp8_logits_on_the_gpu_match_cpu_compute_mode_on_smollm2() {
    let (e, q) = gpu_vs_cpu_fp8("preset:smollm2-135m", 96, 2);
    assert!(e < 0.75 * q, "{e} vs {q}");
}

/// Llama-3-8B in fp8 on the GPU against CPU compute mode on the same quantized weights, and
/// how far fp8 moves the logits from the 16-bit model's (reported).
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.9 or more, 100 GB of host memory"]
fn fp8_llama_3_8b_logits_on_the_gpu_match_cpu_compute_mode() {
    let (e, q) = gpu_vs_cpu_fp8("preset:llama-3-8b", 16, 1);
    assert!(e < 0.75 * q, "{e} vs {q}");
}

/// The allocations (size, op) of the load and the first pass: the KV cache's, whose size is
/// each run's own budget, and those of the verify passes after it left out.
fn load_and_pass_allocs(r: &vramscope::profile::Report) -> Vec<(u64, String)> {
    r.events
        .iter()
        .filter(|e| e.kind == vramscope::memory::EventKind::Alloc && e.op != "kv_cache")
        .take_while(|e| e.pass <= 1)
        .map(|e| (e.bytes, e.op.clone()))
        .collect()
}

/// Llama-3-8B's fp8 profile pass on the GPU allocates what the dry run allocates: the load
/// (16-bit weights, then each layer's fp8 copy and scale, the 16-bit freed) and every
/// `scaled_fp8_quant` / `cutlass_scaled_mm` of the pass, allocation for allocation.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.9 or more with 40 GB free"]
fn fp8_llama_3_8b_gpu_trace_matches_the_dry_run() {
    let run = |device: &str| {
        let req = ProfileRequest {
            model: ModelSource::parse("preset:llama-3-8b").unwrap(),
            quant: Quant::Fp8,
            device: DeviceSpec::parse(device).unwrap(),
            passes: 1,
            verify: false,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let gpu = run("cuda:0");
    let dry = run("sim:h200-141gb:dry");
    eprintln!(
        "fp8 llama-3-8b (in flight): weights GPU {} dry {}",
        gpu.weights_bytes, dry.weights_bytes
    );
    assert_eq!(gpu.weights_bytes, dry.weights_bytes);
    assert_eq!(gpu.weights_bytes, 9_083_363_328);
    for (g, d) in gpu.passes.iter().zip(&dry.passes) {
        eprintln!(
            "fp8 llama-3-8b pass peak GPU {} dry {}",
            g.peak_allocated, d.peak_allocated
        );
        assert_eq!(g.peak_allocated, d.peak_allocated);
    }
    let (g, d) = (load_and_pass_allocs(&gpu), load_and_pass_allocs(&dry));
    eprintln!("fp8 llama-3-8b: {} allocations", g.len());
    assert_eq!(g, d);
}

/// A preset's LLM.int8 weights quantized on the GPU where they are made equal the host
/// path's `quant::int8::quantize_rows` of the host-made values, bit for bit (CB and SCB): a
/// whole tensor, a column slice (a row-parallel shard) and padding rows.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn int8_weights_made_on_the_gpu_equal_the_hosts_quantization_bit_for_bit() {
    use vramscope::device::synth::{reference_fill, SynthFill};
    use vramscope::engine::tensor::DType;
    use vramscope::memory::Category;
    use vramscope::model::weights::{StoredDtype, SyntheticWeights, WeightSource};
    let rt = cuda_runtime();
    let (n, k) = (1000usize, 333usize);
    for stored in [StoredDtype::BF16, StoredDtype::F16] {
        let w = SyntheticWeights {
            preset: "llama-3-8b".into(),
            seed: 5,
            dtype: stored,
        };
        let base = w.synthetic("model.layers.3.mlp.down_proj.weight").unwrap();
        for (cols, fill) in [
            (
                k,
                SynthFill {
                    count: (n * k) as u64,
                    row_len: k as u64,
                    stride: k as u64,
                    ..base.clone()
                },
            ),
            (
                100,
                SynthFill {
                    count: (n * 100) as u64,
                    elem0: 77,
                    row_len: 100,
                    stride: k as u64,
                    ..base.clone()
                },
            ),
            (
                k,
                SynthFill {
                    count: (n * k) as u64,
                    row_len: k as u64,
                    stride: k as u64,
                    valid_rows: 900,
                    ..base.clone()
                },
            ),
        ] {
            let mut cb = rt
                .tensor("cb", Category::Weight, &[n, cols], DType::I8)
                .unwrap();
            let mut scb = rt
                .tensor("scb", Category::Weight, &[n], DType::F32)
                .unwrap();
            vramscope::engine::ops::synth_int8(&rt, &mut cb, &mut scb, &fill).unwrap();
            let (got_cb, got_scb) = rt
                .with_device(|d| {
                    let c = d.cuda().unwrap();
                    Ok::<_, vramscope::base::error::Error>((
                        c.download_bytes(&cb)?,
                        c.download_f32(&scb)?,
                    ))
                })
                .unwrap();
            let (want_cb, want_scb) =
                vramscope::quant::int8::quantize_rows(&reference_fill(&fill), n, cols);
            let cb_diff = got_cb
                .iter()
                .zip(&want_cb)
                .filter(|(a, b)| **a as i8 != **b)
                .count();
            let scb_diff = got_scb
                .iter()
                .zip(&want_scb)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                (cb_diff, scb_diff),
                (0, 0),
                "{stored:?} {fill:?}: codes and scales that differ"
            );
            assert!(want_scb[..10].iter().all(|&a| a > 0.0));
        }
    }
}

/// Values with magnitudes over several binades (and signs), rounded to f16, from a fixed LCG.
fn f16_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f64 / (1u64 << 24) as f64) as f32;
            let mag = (u * 8.0 - 6.0).exp2();
            let v = if (s >> 20) & 1 == 1 { -mag } else { mag };
            half::f16::from_f32(v).to_f32()
        })
        .collect()
}

fn cuda_runtime() -> vramscope::engine::runtime::Runtime {
    vramscope::engine::runtime::Runtime::new(
        Device::open(&DeviceSpec::parse("cuda:0").unwrap()).unwrap(),
        Arc::new(AtomicBool::new(false)),
        None,
    )
}

/// One fused fp8 linear (three shards, as q/k/v) on the GPU against the host on the same
/// values: the weight's codes and scale bit for bit (the GPU's `scaled_fp8_quant` kernels round
/// as c10 does), and each output of the cuBLASLt GEMM within Hopper's fp8 accumulation of the
/// exact scaled product of the codes. The fp8 tensor cores keep about 14 bits while they
/// accumulate (cuBLASLt and CUTLASS promote to f32 every so many products; DeepSeek-V3's report,
/// section 3.3.2), so an output's error is bounded by 2^-12 of the sum of its terms' magnitudes
/// (run 46: at most 0.61 of that),
/// not by its own size: a sum that cancels can be far off in its own ulps.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.9 or more"]
fn one_fp8_linear_on_the_gpu_equals_the_host_within_fp8_accumulation() {
    use vramscope::engine::tensor::DType;
    use vramscope::memory::Category;
    use vramscope::quant::fp8::{self, Fp8Linear};
    let (m, k, rows) = (37, 256, [64usize, 16, 16]);
    let n: usize = rows.iter().sum();
    let (w, x) = (f16_values(n * k, 1), f16_values(m * k, 2));
    let rt = cuda_runtime();
    let cuda = |f: &mut dyn FnMut(&mut vramscope::device::cuda::CudaDevice)| {
        rt.with_device(|d| f(d.cuda().unwrap()))
    };
    let mut wt = rt
        .tensor("l.weight", Category::Weight, &[n, k], DType::F16)
        .unwrap();
    cuda(&mut |c| c.upload_f32(&mut wt, &w).unwrap());
    let lin = Fp8Linear::quantize_in_flight(&rt, &wt).unwrap();
    let (host_codes, host_scale) = fp8::quantize_per_tensor(&w);
    let mut codes = Vec::new();
    cuda(&mut |c| codes = c.download_bytes(&lin.qweight).unwrap());
    assert_eq!(lin.weight_scale_value.to_bits(), host_scale.to_bits());
    let same = codes
        .iter()
        .zip(&host_codes)
        .filter(|(a, b)| a == b)
        .count();
    assert_eq!(same, n * k, "weight codes equal to the host's");
    let mut xt = rt
        .tensor("x", Category::Activation, &[m, k], DType::F16)
        .unwrap();
    cuda(&mut |c| c.upload_f32(&mut xt, &x).unwrap());
    let out = lin.forward(&rt, &xt, "l", DType::F16, &rows).unwrap();
    let mut got = Vec::new();
    cuda(&mut |c| got = c.download_f32(&out).unwrap());
    let xs = fp8::dynamic_scale(&x);
    let mut xc = vec![0u8; m * k];
    fp8::quantize_with_scale(&x, xs, &mut xc);
    let (mut worst, mut worst_own, mut block, mut j0) = (0f64, 0f64, 0usize, 0usize);
    for &rn in &rows {
        for r in 0..m {
            for jj in 0..rn {
                let j = j0 + jj;
                let terms = (0..k).map(|i| {
                    fp8::decode(xc[r * k + i]) as f64 * fp8::decode(host_codes[j * k + i]) as f64
                });
                let (acc, mag) = terms.fold((0f64, 0f64), |(a, g), t| (a + t, g + t.abs()));
                let s = xs as f64 * host_scale as f64;
                let exact = s * acc;
                let ulp = (exact.abs() * 2f64.powi(-10)).max(2f64.powi(-24));
                // Shard blocks: `[m, rn]` each, one after the other.
                let e = (got[block + r * rn + jj] as f64 - exact).abs();
                worst = worst.max(e / (s * mag * 2f64.powi(-12) + ulp));
                worst_own = worst_own.max(e / ulp);
            }
        }
        block += m * rn;
        j0 += rn;
    }
    eprintln!(
        "fp8 linear on the GPU: worst error {worst:.3} of the accumulation bound ({worst_own:.1} f16 ulps of the output itself)"
    );
    assert!(worst <= 1.0, "{worst}");
}

/// A stored checkpoint's shards requantized at the largest scale on the GPU: the codes equal
/// the host's `requantize_with_max_scale` bit for bit.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.9 or more"]
fn stored_fp8_shards_requantize_on_the_gpu_as_on_the_host() {
    use vramscope::engine::tensor::DType;
    use vramscope::memory::Category;
    use vramscope::quant::fp8::{self, Fp8Linear};
    let (rows, k) = ([64usize, 32, 32], 128);
    let n: usize = rows.iter().sum();
    let stored: Vec<u8> = (0..n * k).map(|i| ((i * 37 + i / 7) % 256) as u8).collect();
    let stored: Vec<u8> = stored
        .into_iter()
        .map(|c| if c & 0x7f == 0x7f { c ^ 1 } else { c })
        .collect();
    let scales = [0.5f32, 0.0137, 2.25];
    let rt = cuda_runtime();
    let mut q = rt
        .tensor(
            "l.qkv_proj.weight",
            Category::Weight,
            &[n, k],
            DType::F8E4M3,
        )
        .unwrap();
    let s = rt
        .tensor(
            "l.qkv_proj.weight_scale",
            Category::Weight,
            &[3],
            DType::F32,
        )
        .unwrap();
    rt.with_device(|d| d.cuda().unwrap().upload_bytes(&mut q, &stored))
        .unwrap();
    let lin = Fp8Linear::requantize_stored(&rt, q, (s, &scales), None, &rows).unwrap();
    let mut host = stored.clone();
    let max = fp8::requantize_with_max_scale(&mut host, k, &rows, &scales);
    let got = rt
        .with_device(|d| d.cuda().unwrap().download_bytes(&lin.qweight))
        .unwrap();
    assert_eq!(lin.weight_scale_value, max);
    let same = got.iter().zip(&host).filter(|(a, b)| a == b).count();
    assert_eq!(same, n * k, "requantized codes equal to the host's");
}

/// A pre-quantized fp8 checkpoint written by `gen_model_fp8` (the in-flight codes and scales
/// of the seeded 16-bit model) and `(the preset, device)`'s logits.
fn stored_fp8_logits(dir: &std::path::Path, device: &str) -> Vec<f32> {
    let path = dir.join("config.json");
    logits(path.to_str().unwrap(), Quant::Fp8, device, 100, 3, 0.0)
}

fn gen_fp8(preset: &str, dir: &std::path::Path) {
    let opts = vramscope::model::GenOptions {
        dtype: vramscope::model::weights::StoredDtype::F16,
        seed: 0,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    vramscope::model::gen_model_fp8(preset, dir, &opts, false).unwrap();
}

/// The stored checkpoint loads its codes onto the GPU and requantizes them there: its logits
/// against CPU compute mode's on the same checkpoint land where the in-flight path's do
/// (`fp8_logits_on_the_gpu_match_cpu_compute_mode_on_tiny`), and its distance from the
/// in-flight path on the GPU is the CPU's (gen-model's codes come from the f32 values, the
/// in-flight ones from the f16 weights: tests/fp8.rs measures 7.8e-2 on the host).
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.9 or more"]
fn a_stored_fp8_checkpoint_on_the_gpu_gives_the_in_flight_logits() {
    let dir = tempfile::tempdir().unwrap();
    gen_fp8("tiny", dir.path());
    let stored = stored_fp8_logits(dir.path(), "cuda:0");
    let in_flight = logits("preset:tiny", Quant::Fp8, "cuda:0", 100, 3, 0.0);
    let cpu = stored_fp8_logits(dir.path(), "sim:h100-80gb");
    let e_flight = relative_l2(&stored, &in_flight);
    let e_cpu = relative_l2(&stored, &cpu);
    eprintln!("stored fp8 tiny on the GPU: vs in flight {e_flight:.3e}, vs CPU {e_cpu:.3e}");
    assert!(e_cpu < 0.1, "{e_cpu}");
    assert!(e_flight > 0.0 && e_flight < 0.12, "{e_flight}");
}

/// Llama-3-8B stored in fp8: the GPU's load (codes uploaded, shards requantized on the
/// device) and profile pass allocate what the dry run allocates.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.9 or more with 40 GB free, 10 GB of disk"]
fn stored_fp8_llama_3_8b_gpu_trace_matches_the_dry_run() {
    let dir = tempfile::tempdir().unwrap();
    gen_fp8("llama-3-8b", dir.path());
    let run = |device: &str| {
        let req = ProfileRequest {
            model: ModelSource::parse(dir.path().join("config.json").to_str().unwrap()).unwrap(),
            quant: Quant::Fp8,
            device: DeviceSpec::parse(device).unwrap(),
            passes: 1,
            verify: false,
            ..ProfileRequest::default()
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let gpu = run("cuda:0");
    let dry = run("sim:h200-141gb:dry");
    eprintln!(
        "stored fp8 llama-3-8b: weights GPU {} dry {}; pass peak GPU {} dry {}",
        gpu.weights_bytes,
        dry.weights_bytes,
        gpu.passes[0].peak_allocated,
        dry.passes[0].peak_allocated
    );
    assert_eq!(gpu.weights_bytes, dry.weights_bytes);
    assert_eq!(gpu.passes[0].peak_allocated, dry.passes[0].peak_allocated);
    assert_eq!(load_and_pass_allocs(&gpu), load_and_pass_allocs(&dry));
}

/// One AWQ or GPTQ linear (three shards, as q/k/v) loaded, repacked and multiplied on the GPU
/// by the fused 4-bit kernel against the exact product of the host's dequantized weight (the
/// format's own rule, `MarlinLinear::dequantized`): every output within one rounding of the
/// 16-bit output plus f32 accumulation (2^-14 of the sum of its terms' magnitudes). Shards of
/// 192 (one full and one partial 128-column tile) and 32, rows across three 128-row tiles, act
/// order and one group over all inputs included.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more"]
fn one_awq_or_gptq_linear_on_the_gpu_equals_the_formats_dequantized_product() {
    use vramscope::engine::runtime::Runtime;
    use vramscope::engine::tensor::DType;
    use vramscope::memory::Category;
    use vramscope::quant::marlin::{self, Format, MarlinLinear, Method};
    let (k, rows) = (256usize, [192usize, 32, 32]);
    let n: usize = rows.iter().sum();
    let host = Runtime::new(
        Device::open(&DeviceSpec::parse("sim:h100-80gb").unwrap()).unwrap(),
        Arc::new(AtomicBool::new(false)),
        None,
    );
    let rt = cuda_runtime();
    // From 256 rows the weight is dequantized a slice at a time into the call's temporary for
    // cuBLAS (once cuBLAS holds its workspace); each case runs the fused kernel, the slices
    // the temporary allows, and slices of 64 columns (several per shard).
    rt.ensure_library_workspaces().unwrap();
    let cases = [
        (Method::Awq, 64, false, DType::F16, 300),
        (Method::Awq, -1, false, DType::BF16, 37),
        (Method::Awq, 128, false, DType::BF16, 260),
        (Method::Gptq, 32, true, DType::F16, 300),
        (Method::Gptq, 64, false, DType::BF16, 129),
        (Method::Gptq, 32, false, DType::F16, 256),
    ];
    let paths = [(true, None), (false, None), (false, Some(64))];
    for ((method, group_size, desc_act, act, m), (fused, cols)) in cases
        .into_iter()
        .flat_map(|c| paths.into_iter().map(move |p| (c, p)))
    {
        rt.with_device(|d| d.cuda().unwrap().set_w4_path(fused, cols));
        let fmt = Format {
            method,
            group_size,
            desc_act,
            compressed_tensors: false,
        };
        let w: Vec<f32> = f16_values(n * k, 3).iter().map(|v| v * 0.05).collect();
        let x: Vec<f32> = f16_values(m * k, 4)
            .iter()
            .map(|&v| act.round(v * 0.5))
            .collect();
        let parts = marlin::quantize(&fmt, &w, n, k, act);
        let load = |rt: &Runtime| {
            let mut l =
                MarlinLinear::load(rt, fmt, "l", (n, k), Some(&parts), act, Default::default())
                    .unwrap();
            l.after_loading(rt, act).unwrap();
            l
        };
        let wq = load(&host).dequantized(act);
        let lin = load(&rt);
        let mut xt = rt.tensor("x", Category::Activation, &[m, k], act).unwrap();
        rt.with_device(|d| d.cuda().unwrap().upload_f32(&mut xt, &x))
            .unwrap();
        let out = lin.forward(&rt, &xt, "l", act, &rows).unwrap();
        let got = rt
            .with_device(|d| d.cuda().unwrap().download_f32(&out))
            .unwrap();
        let ulp = if act == DType::BF16 { -7 } else { -10 };
        let (mut worst, mut block, mut j0) = (0f64, 0usize, 0usize);
        for &rn in &rows {
            for r in 0..m {
                for jj in 0..rn {
                    let j = j0 + jj;
                    let (acc, mag) = (0..k)
                        .map(|i| x[r * k + i] as f64 * wq[j * k + i] as f64)
                        .fold((0f64, 0f64), |(a, g), t| (a + t, g + t.abs()));
                    let bound = acc.abs() * 2f64.powi(ulp) + mag * 2f64.powi(-14) + 1e-30;
                    let e = (got[block + r * rn + jj] as f64 - acc).abs();
                    worst = worst.max(e / bound);
                }
            }
            block += m * rn;
            j0 += rn;
        }
        eprintln!(
            "{} group {group_size} act-order {desc_act} {} m {m} fused {fused} slice {cols:?}: worst error {worst:.3} of the bound",
            method.name(),
            act.name()
        );
        assert!(worst <= 1.0, "{worst}");
    }
}

/// `gen_model_packed4` of a preset into `dir`: AWQ with groups of `group` (GPTQ with act-order
/// when `gptq`).
fn gen_packed4(preset: &str, dir: &std::path::Path, gptq: bool, group: i64) {
    use vramscope::quant::marlin::{Format, Method};
    let opts = vramscope::model::GenOptions {
        dtype: vramscope::model::weights::StoredDtype::F16,
        seed: 0,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    let fmt = Format {
        method: if gptq { Method::Gptq } else { Method::Awq },
        group_size: group,
        desc_act: gptq,
        compressed_tensors: false,
    };
    vramscope::model::gen_model_packed4(preset, dir, &opts, fmt).unwrap();
}

/// A 4-bit checkpoint's logits on the GPU against CPU compute mode on the same checkpoint
/// (both dequantize by the format's rule to the same 16-bit values; only the order of the f32
/// sums differs), and the CPU's distance from the preset's 16-bit model (reported).
fn packed4_gpu_vs_cpu(preset: &str, gptq: bool, group: i64, tokens: usize, seqs: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    gen_packed4(preset, dir.path(), gptq, group);
    let model = dir.path().join("config.json");
    let model = model.to_str().unwrap();
    let gpu = logits(model, Quant::F16, "cuda:0", tokens, seqs, 0.0);
    let cpu = logits(model, Quant::F16, "sim:h100-80gb", tokens, seqs, 0.0);
    let cpu16 = logits(
        &format!("preset:{preset}"),
        Quant::F16,
        "sim:h100-80gb",
        tokens,
        seqs,
        0.0,
    );
    assert!(gpu.iter().all(|v| v.is_finite()));
    let (e, q) = (relative_l2(&gpu, &cpu), relative_l2(&cpu, &cpu16));
    eprintln!(
        "{preset} {} group {group}: relative L2 GPU vs CPU {e:.3e}; 4-bit vs fp16 on the CPU {q:.3e}",
        if gptq { "gptq act-order" } else { "awq" }
    );
    e
}

#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more"]
fn awq_and_gptq_logits_on_the_gpu_match_cpu_compute_mode_on_tiny() {
    // 100 tokens: the fused kernel; 300: the timed pass (after the warm-up took cuBLAS's
    // workspace) multiplies dequantized slices with cuBLAS.
    for tokens in [100, 300] {
        assert!(packed4_gpu_vs_cpu("tiny", false, 64, tokens, 3) < 1e-2);
        assert!(packed4_gpu_vs_cpu("tiny", true, 32, tokens, 3) < 1e-2);
    }
}

/// A compressed-tensors w4a16 checkpoint (LLM Compressor's `pack-quantized` layout, groups of
/// 32, with and without act-order): read into GPTQ's Marlin layout, its logits on the GPU
/// against CPU compute mode on the same checkpoint.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more"]
fn ct_w4a16_logits_on_the_gpu_match_cpu_compute_mode_on_tiny() {
    use vramscope::quant::marlin::{Format, Method};
    for desc_act in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let opts = vramscope::model::GenOptions {
            dtype: vramscope::model::weights::StoredDtype::F16,
            seed: 0,
            shards: 1,
            bnb_int8: false,
            bnb_skip_modules: Vec::new(),
        };
        let fmt = Format {
            method: Method::Gptq,
            group_size: 32,
            desc_act,
            compressed_tensors: true,
        };
        vramscope::model::gen_model_packed4("tiny", dir.path(), &opts, fmt).unwrap();
        let model = dir.path().join("config.json");
        let model = model.to_str().unwrap();
        let gpu = logits(model, Quant::F16, "cuda:0", 100, 3, 0.0);
        let cpu = logits(model, Quant::F16, "sim:h100-80gb", 100, 3, 0.0);
        assert!(gpu.iter().all(|v| v.is_finite()));
        let e = relative_l2(&gpu, &cpu);
        eprintln!(
            "compressed-tensors w4a16 g32 act-order {desc_act}: relative L2 GPU vs CPU {e:.3e}"
        );
        assert!(e < 1e-2, "{e}");
    }
}

/// GPTQ (groups of 128, and of 64 with act-order) and compressed-tensors w4a16 on a Hopper
/// GPU under vLLM 0.19: `MacheteLinearKernel`'s allocations (docs/reading/vllm-machete.md)
/// made on the GPU, the stored words multiplied by the 4-bit kernel inside them, equal to the
/// dry run allocation for allocation; AWQ through Machete is refused by name on the GPU.
/// Not run yet (written without a GPU).
#[test]
#[ignore = "needs an H100 or H200 (compute capability 9.0)"]
fn gptq_and_ct_w4a16_through_machete_on_hopper_gpu_equal_the_dry_run() {
    for flags in [
        &["--gptq", "--group-size", "128"][..],
        &["--gptq", "--group-size", "64", "--desc-act"][..],
        &["--ct-w4a16", "--group-size", "64"][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["gen-model", "tiny", dir.path().to_str().unwrap()];
        args.extend_from_slice(flags);
        common::cli::ok(&common::cli::vramscope(&args));
        let model = dir.path().join("config.json");
        let n =
            gpu_trace_equals_dry_under(model.to_str().unwrap(), Quant::F16, (256, 2, 256), "0.19");
        eprintln!("{flags:?} through Machete: {n} allocations");
    }
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "gen-model",
        "tiny",
        dir.path().to_str().unwrap(),
        "--awq",
        "--group-size",
        "64",
    ];
    common::cli::ok(&common::cli::vramscope(&args));
    let req = ProfileRequest {
        model: ModelSource::parse(dir.path().join("config.json").to_str().unwrap()).unwrap(),
        device: DeviceSpec::parse("cuda:0").unwrap(),
        vllm: "0.19".into(),
        ..ProfileRequest::default()
    };
    let err = profile::run(&req, None, Arc::new(AtomicBool::new(false)))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("MacheteLinearKernel"), "{err}");
}

/// Llama-3-8B as an AWQ checkpoint (groups of 128, as AutoAWQ's default): `AWQ_8B_DIR` if a
/// device run already wrote it with `gen-model llama-3-8b DIR --awq` (and timed and benched
/// it), else a fresh one in `dir`.
fn awq_8b(dir: &std::path::Path) -> std::path::PathBuf {
    match std::env::var("AWQ_8B_DIR") {
        Ok(d) => std::path::PathBuf::from(d).join("config.json"),
        Err(_) => {
            gen_packed4("llama-3-8b", dir, false, 128);
            dir.join("config.json")
        }
    }
}

/// Llama-3-8B AWQ: the GPU's load (stored words uploaded, Marlin's repack allocations) and
/// profile pass allocate what the dry run allocates (run 50: 5,739,454,464 B of weights,
/// 7,088,263,168 B peak, 2,550 allocations).
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more with 40 GB free, 10 GB of disk"]
fn awq_llama_3_8b_gpu_trace_matches_the_dry_run() {
    awq_llama_3_8b_gpu_equals_dry_under("380e1863");
}

/// The same under vLLM 0.15, whose refactored Marlin kernel keeps one int32 of workspace per
/// SM (the GPU's own count) and a per-SM f32 reduce buffer, with no `a_tmp`.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more with 40 GB free, 10 GB of disk"]
fn awq_llama_3_8b_under_0_15_gpu_trace_matches_the_dry_run() {
    awq_llama_3_8b_gpu_equals_dry_under("0.15");
}

fn awq_llama_3_8b_gpu_equals_dry_under(vllm: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = awq_8b(dir.path());
    let run = |device: &str| {
        let req = ProfileRequest {
            model: ModelSource::parse(model.to_str().unwrap()).unwrap(),
            device: DeviceSpec::parse(device).unwrap(),
            passes: 1,
            verify: false,
            vllm: vllm.into(),
            ..ProfileRequest::default()
        };
        // A V1 release's batch stated, so that the GPU's total and the preset's agree on it.
        let req = if vllm == "380e1863" {
            req
        } else {
            ProfileRequest {
                tokens: 8192,
                seqs: 256,
                max_model_len: 8192,
                ..req
            }
        };
        profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
    };
    let gpu = run("cuda:0");
    let dry = run("sim:h200-141gb:dry");
    eprintln!(
        "awq llama-3-8b under {vllm}: weights GPU {} dry {}; pass peak GPU {} dry {}",
        gpu.weights_bytes,
        dry.weights_bytes,
        gpu.passes[0].peak_allocated,
        dry.passes[0].peak_allocated
    );
    assert_eq!(gpu.weights_bytes, dry.weights_bytes);
    assert_eq!(gpu.passes[0].peak_allocated, dry.passes[0].peak_allocated);
    let (g, d) = (load_and_pass_allocs(&gpu), load_and_pass_allocs(&dry));
    eprintln!("awq llama-3-8b: {} allocations", g.len());
    assert_eq!(g, d);
}

/// Llama-3-8B AWQ's logits on the GPU against CPU compute mode on the same checkpoint, and
/// AWQ's distance from the 16-bit model (reported). Not yet completed on the device: run 50
/// gave it what was left of a 260 s limit after the trace test, and CPU compute of the 8B
/// model (dequantizing every weight each pass) did not finish in it.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more with 40 GB free, 100 GB of host memory, 10 GB of disk"]
fn awq_llama_3_8b_logits_on_the_gpu_match_cpu_compute_mode() {
    let dir = tempfile::tempdir().unwrap();
    let model = awq_8b(dir.path());
    let m = model.to_str().unwrap();
    let gl = logits(m, Quant::F16, "cuda:0", 16, 1, 0.0);
    let cl = logits(m, Quant::F16, "sim:h100-80gb", 16, 1, 0.0);
    let c16 = logits("preset:llama-3-8b", Quant::F16, "sim:h100-80gb", 16, 1, 0.0);
    let (e, q) = (relative_l2(&gl, &cl), relative_l2(&cl, &c16));
    eprintln!("awq llama-3-8b: relative L2 GPU vs CPU {e:.3e}; AWQ vs fp16 on the CPU {q:.3e}");
    assert!(e < 1e-2, "{e}");
}

/// The fused MoE on the GPU (host routing, the grouped GEMMs on the tensor cores, silu_and_mul,
/// moe_sum) against CPU compute mode on the same weights: few tokens (BLOCK_SIZE_M 16, the
/// 16-row tiles) and many (64, the 64-row tiles), f16 and bf16.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more"]
fn moe_logits_on_the_gpu_match_cpu_compute_mode() {
    for arch in ["mixtral", "qwen3_moe", "qwen2_moe"] {
        let dir = tempfile::tempdir().unwrap();
        // Mixtral: 4 experts of width 96, 2 a token, renormalised; Qwen3-MoE: 8 of width 64,
        // 3 a token, not renormalised, layer 1 dense; Qwen2-MoE: its shared expert scaled by
        // the sigmoid of its gate on the GPU.
        common::write_hf_test_model(dir.path(), arch);
        let model = dir.path().to_str().unwrap();
        for (quant, tokens, seqs) in [(Quant::F16, 4, 2), (Quant::BF16, 300, 3)] {
            let e = gpu_vs_cpu(model, quant, tokens, seqs, 0.0);
            eprintln!("{arch} {quant} {tokens} tokens: relative L2 GPU vs CPU {e:.3e}");
            assert!(e < 1e-2, "{arch} {quant} {tokens} tokens: {e:.3e}");
        }
    }
}

/// Qwen3-30B-A3B (bf16, seeded weights) profiled on the GPU at 8192 tokens allocates what the
/// dry run allocates, allocation for allocation, and peaks at the same byte.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more with 80 GB free, 130 GB of host memory"]
fn qwen3_30b_a3b_gpu_trace_matches_the_dry_run() {
    gpu_trace_equals_dry("preset:qwen3-30b-a3b", Quant::BF16, 8192, 256, 8192);
}

/// Qwen3-30B-A3B (bf16, seeded weights) under vLLM 0.19 (V1's modular fused MoE: the router's
/// three tensors, a new output in each layer, one workspace grown in the first MoE layer and
/// kept, the alignment buffers per chunk) profiled on the GPU allocates what the dry run
/// allocates, allocation for allocation, with `vllm serve`'s batch on a large GPU. Eager: the
/// GPU path routes on the host, which a graph cannot capture (the dry run's graphs are
/// compared elsewhere).
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more with 80 GB free, 130 GB of host memory"]
fn qwen3_30b_a3b_under_0_19_gpu_trace_matches_the_dry_run() {
    let n = gpu_trace_equals_dry_with(
        "preset:qwen3-30b-a3b",
        Quant::BF16,
        (8192, 1024, 8192),
        ("0.19", true),
    );
    assert!(n > 1000, "{n}");
}

/// The same under 0.23, whose oracle runs Triton on Hopper with 0.21's runner (the cache
/// emptied before the workspace grows, Qwen3's gate inside the op, the wheel's tuned files).
#[test]
#[ignore = "needs an NVIDIA Hopper GPU with 80 GB free"]
fn qwen3_30b_a3b_under_0_23_gpu_trace_matches_the_dry_run() {
    let n = gpu_trace_equals_dry_with(
        "preset:qwen3-30b-a3b",
        Quant::BF16,
        (8192, 1024, 8192),
        ("0.23", true),
    );
    assert!(n > 1000, "{n}");
}

/// The same under 0.33 on Model Runner V2, whose MoE path allocates what 0.28's Triton path
/// does (docs/reading/vllm-v1-fused-moe.md §10).
#[test]
#[ignore = "needs an NVIDIA Hopper GPU with 80 GB free"]
fn qwen3_30b_a3b_under_0_33_gpu_trace_matches_the_dry_run() {
    let n = gpu_trace_equals_dry_with(
        "preset:qwen3-30b-a3b",
        Quant::BF16,
        (8192, 1024, 8192),
        ("0.33", true),
    );
    assert!(n > 1000, "{n}");
}

/// The modular fused MoE's GPU path (the experts read the layer's input, their sum lands in a
/// new output, caches 1-3 are views of the kept workspace) against CPU compute mode on the
/// same weights, as 0.15.1 (chunks of 16384 tokens, the earlier default block size) and
/// 0.19.0 (no chunking, the block size by tokens) run it: few tokens and many, f16 and bf16.
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more"]
fn modular_moe_logits_on_the_gpu_match_cpu_compute_mode() {
    use vramscope::engine::ops_moe_v1::{Modular, MoeKernel};
    let kernels = [
        Modular {
            chunk_tokens: Some(16384),
            default_block_m_by_tokens: false,
            v0_21: None,
        },
        Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: None,
        },
    ];
    for arch in ["mixtral", "qwen3_moe"] {
        let dir = tempfile::tempdir().unwrap();
        common::write_hf_test_model(dir.path(), arch);
        let model = dir.path().to_str().unwrap();
        for how in kernels {
            for (quant, tokens, seqs) in [(Quant::F16, 4, 2), (Quant::BF16, 300, 3)] {
                let run = |device: &str| {
                    kernel_logits(
                        model,
                        quant,
                        device,
                        (tokens, seqs),
                        MoeKernel::Modular(how),
                    )
                };
                let (gpu, cpu) = (run("cuda:0"), run("sim:h100-80gb"));
                assert_eq!(gpu.len(), cpu.len());
                assert!(gpu.iter().all(|v| v.is_finite()));
                let e = relative_l2(&gpu, &cpu);
                eprintln!("{arch} {how:?} {quant} {tokens} tokens: relative L2 GPU vs CPU {e:.3e}");
                assert!(e < 1e-2, "{arch} {how:?} {quant} {tokens} tokens: {e:.3e}");
            }
        }
    }
}

/// Last-token logits of one pass of `model` on `device` with the fused MoE `kernel`.
fn kernel_logits(
    model: &str,
    quant: Quant,
    device: &str,
    (tokens, seqs): (usize, usize),
    kernel: vramscope::engine::ops_moe_v1::MoeKernel,
) -> Vec<f32> {
    use vramscope::engine::{ops, runtime::Runtime};
    use vramscope::model::{batch::Batch, sampler, CausalLm, LoadOptions};
    let opened = vramscope::model::open(&ModelSource::parse(model).unwrap(), 0).unwrap();
    let dev = Device::open(&DeviceSpec::parse(device).unwrap()).unwrap();
    let int8_layout = dev.int8_tile_layout();
    let rt = Runtime::new(dev, Arc::new(AtomicBool::new(false)), None);
    let opts = LoadOptions {
        quant,
        int8_threshold: 0.0,
        int8_layout,
        attn_scalars: 0,
        marlin: Default::default(),
    };
    let mut m = CausalLm::load(&rt, &opened.config, opened.source.as_ref(), &opts).unwrap();
    m.set_moe_kernel(kernel);
    let batch = Batch::dummy(tokens, seqs, opened.config.vocab_size);
    let hidden = m.forward_hidden(&rt, &batch).unwrap();
    let rows = sampler::last_token_rows(&batch.seq_lens);
    let out = sampler::logits_f32(
        &rt,
        &hidden,
        m.logits_head().unwrap(),
        &rows,
        opened.config.vocab_size,
    )
    .unwrap()
    .expect("one device: the logits are here");
    ops::read_f32(&rt, &out).unwrap().unwrap_or_default()
}

/// vLLM 0.19's CUDA graphs for Llama-3-8B on the H200 with `vllm serve`'s defaults (8192
/// tokens, 1024 sequences: 51 PIECEWISE sizes of 33 pieces and 51 FULL graphs): every graph
/// captured after the KV cache, each replay's output equal to its eager warm-up's, and the
/// graph pool's blocks and segments equal to the dry run's, allocation for allocation.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn llama3_cuda_graphs_replay_and_match_the_dry_pool() {
    graphs_replay_and_match_the_dry_pool("preset:llama-3-8b", Quant::F16, 0.9);
}

/// Q1's start (Llama-3.1-8B, bf16, util 0.95) under 0.19 on the GPU: Llama 3's scaled rope
/// stages its cos/sin table from the host in every piece, 33 × 51 × 2 of them, which once
/// filled the 64 MiB input arena after 295 graphs (docs/gpu-runs.md run 96); captures now
/// copy bytes the arena already holds from the same place.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn llama3_1_scaled_rope_graphs_replay_and_match_the_dry_pool() {
    graphs_replay_and_match_the_dry_pool("preset:llama-3.1-8b", Quant::BF16, 0.95);
}

/// vLLM 0.19's 1,734 graphs of `model` with `vllm serve`'s batch on `cuda:0`: every replay
/// equal to its eager warm-up and the graph pool equal to the dry run's, allocation for
/// allocation.
fn graphs_replay_and_match_the_dry_pool(model: &str, quant: Quant, util: f64) {
    let run = |device: DeviceSpec| {
        let req = ProfileRequest {
            model: ModelSource::parse(model).unwrap(),
            quant,
            device,
            tokens: 8192,
            seqs: 1024,
            max_model_len: 8192,
            passes: 1,
            verify: false,
            util,
            vllm: "0.19".into(),
            ..ProfileRequest::default()
        };
        let t = std::time::Instant::now();
        let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
        eprintln!("{}: {:.1} s", req.device, t.elapsed().as_secs_f64());
        r
    };
    let gpu = run(DeviceSpec::parse("cuda:0").unwrap());
    let g = gpu.graphs.clone().expect("the GPU run captured graphs");
    for line in gpu
        .vllm_graph_log_lines()
        .iter()
        .chain(&gpu.graph_summary())
    {
        eprintln!("{line}");
    }
    let per = |x: u64| x as f64 / g.graphs as f64;
    eprintln!(
        "graphs {} ops {} nodes {:?} pool {} exec {} ({:.0} B/graph, {:.1} B/op) side {} took {} NVML process delta {} capture {:.2} s",
        g.graphs,
        g.ops,
        g.nodes,
        g.pool_bytes,
        g.exec_bytes,
        per(g.exec_bytes),
        g.exec_bytes as f64 / g.ops as f64,
        g.side_stream_bytes,
        g.took_bytes,
        g.process_delta_bytes,
        g.capture_s
    );
    let replay = g.replay.clone().expect("replays checked");
    assert_eq!(g.graphs, 51 * 33 + 51);
    assert_eq!(replay.checked, 102);
    assert!(replay.worst_rel_l2 < 1e-3, "{replay:?}");
    let dry = run(DeviceSpec::parse("sim:h200:dry")
        .unwrap()
        .with_total(Some(gpu.checkpoints.t0.total))
        .unwrap());
    let d = dry.graphs.clone().expect("the dry run captured graphs");
    assert_eq!((g.graphs, g.ops), (d.graphs, d.ops));
    assert_eq!(g.pool_bytes, d.pool_bytes);
    assert_eq!(g.side_stream_bytes, d.side_stream_bytes);
    let pool_allocs = |r: &vramscope::profile::Report| {
        r.events
            .iter()
            .filter(|e| {
                e.category == vramscope::memory::Category::CudaGraph
                    && matches!(
                        e.kind,
                        vramscope::memory::EventKind::Alloc
                            | vramscope::memory::EventKind::SegmentMap
                    )
            })
            .map(|e| (e.kind, e.bytes, e.tensor.clone()))
            .collect::<Vec<_>>()
    };
    let (ga, da) = (pool_allocs(&gpu), pool_allocs(&dry));
    eprintln!("graph pool: {} allocations and segment maps", ga.len());
    assert_eq!(ga, da);
    let (ge, de) = (
        g.estimate.clone().expect("0.19 estimates"),
        d.estimate.clone().expect("0.19 estimates"),
    );
    eprintln!("estimate GPU {ge:?}\nestimate dry {de:?}");
}

/// Seeded preset weights made on the GPU equal the host's, bit for bit: the kernel against
/// its host reference (`device::synth::reference_fill`, itself held to the host generator by a
/// unit test), for a whole tensor, a column slice, padding rows, fp16 and bf16.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn weights_made_on_the_gpu_equal_the_hosts_bit_for_bit() {
    use vramscope::device::synth::{reference_fill, SynthFill};
    use vramscope::engine::tensor::DType;
    use vramscope::memory::Category;
    use vramscope::model::weights::{StoredDtype, SyntheticWeights, WeightSource};
    let rt = cuda_runtime();
    let (n, k) = (1000usize, 333usize);
    for (stored, act, name) in [
        (
            StoredDtype::BF16,
            DType::BF16,
            "model.layers.7.mlp.gate_proj.weight",
        ),
        (StoredDtype::BF16, DType::F16, "model.norm.weight"),
        (StoredDtype::F16, DType::F16, "lm_head.weight"),
    ] {
        let w = SyntheticWeights {
            preset: "llama-3-8b".into(),
            seed: 3,
            dtype: stored,
        };
        let base = w.synthetic(name).unwrap();
        for fill in [
            SynthFill {
                count: (n * k) as u64,
                row_len: k as u64,
                stride: k as u64,
                ..base.clone()
            },
            SynthFill {
                count: (n * 100) as u64,
                elem0: 77,
                row_len: 100,
                stride: k as u64,
                ..base.clone()
            },
            SynthFill {
                count: (n * k) as u64,
                row_len: k as u64,
                stride: k as u64,
                valid_rows: 900,
                ..base.clone()
            },
        ] {
            let mut t = rt
                .tensor("w", Category::Weight, &[fill.count as usize], act)
                .unwrap();
            vramscope::engine::ops::fill_synthetic(&rt, &mut t, std::slice::from_ref(&fill))
                .unwrap();
            let got = rt
                .with_device(|d| d.cuda().unwrap().download_f32(&t))
                .unwrap();
            let want: Vec<f32> = reference_fill(&fill)
                .iter()
                .map(|&v| act.round(v))
                .collect();
            let diff = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(diff, 0, "{name} {act:?} {fill:?}: {diff} values differ");
        }
    }
}

/// The grouped GEMM's kernels against the host in f64, on a layout with every case the tiles
/// meet: an expert's run of one block and of three, padding slots, a 128-row tile whose two
/// blocks have two experts, and an odd count of blocks (the last tile half empty); widths a
/// multiple of 256 (Hopper's 128-row tiles) and of 128 only (its 64-row tiles), the first GEMM
/// gathering token rows (`a_div` = k) and the second reading slot rows with routing weights.
/// Every kernel is within bf16's rounding of the exact product (relative L2 below 3e-3) and
/// within 1e-3 of the `mma.sync` kernel (the same products, summed in another order).
#[test]
#[ignore = "needs an NVIDIA GPU of compute capability 8.0 or more"]
fn grouped_gemm_kernels_on_the_gpu_match_the_host() {
    use vramscope::device::cuda::{GroupedGemm, MoeGemmTiles, Sorted};
    use vramscope::engine::tensor::DType;
    use vramscope::memory::Category;
    let (tokens, top_k, experts, block_m) = (200usize, 2usize, 4usize, 64usize);
    let total = tokens * top_k;
    // Expert e takes the slots whose hash falls in its share: 70, 30, 150, 150 slots (blocks
    // e0 e0 | e1 e2 | e2 e2 | e3 e3 | e3: a two-expert tile and a half tile).
    let bounds = [70usize, 100, 250, 400];
    let mut order: Vec<usize> = (0..total).collect();
    order.sort_by_key(|&i| (i * 7919) % total);
    let mut sorted = Vec::new();
    let mut expert_of_block = Vec::new();
    let mut expert_of_slot = vec![0usize; total];
    let mut lo = 0;
    for (e, &hi) in bounds.iter().enumerate() {
        for &slot in &order[lo..hi] {
            sorted.push(slot as i32);
            expert_of_slot[slot] = e;
        }
        while sorted.len() % block_m != 0 {
            sorted.push(total as i32);
        }
        expert_of_block.resize(sorted.len() / block_m, e as i32);
        lo = hi;
    }
    assert_eq!(expert_of_block, [0, 0, 1, 2, 2, 2, 3, 3, 3]);
    let used = sorted.len();
    let rt = cuda_runtime();
    let cuda = |f: &mut dyn FnMut(&mut vramscope::device::cuda::CudaDevice)| {
        rt.with_device(|d| f(d.cuda().unwrap()))
    };
    let ids = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut st = rt
        .tensor("sorted", Category::Activation, &[used], DType::I32)
        .unwrap();
    let mut et = rt
        .tensor(
            "experts",
            Category::Activation,
            &[expert_of_block.len()],
            DType::I32,
        )
        .unwrap();
    cuda(&mut |c| {
        c.upload_bytes(&mut st, &ids(&sorted)).unwrap();
        c.upload_bytes(&mut et, &ids(&expert_of_block)).unwrap();
    });
    let s = Sorted {
        sorted: st.cuda_ptr(),
        experts: et.cuda_ptr(),
        block_m,
        used,
        total,
    };
    let mut hopper = false;
    cuda(&mut |c| hopper = c.has_wgmma_moe_gemm());
    let bf = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter()
            .map(|x| half::bf16::from_f32(x).to_f32())
            .collect()
    };
    for (n, k, a_div, scaled) in [
        (512, 192, top_k, false),
        (384, 128, 1, true),
        (256, 64, 1, false),
    ] {
        let a_rows = total / a_div;
        let a = bf(f16_values(a_rows * k, n as u64));
        let w = bf(f16_values(experts * n * k, 3 + k as u64));
        let scale: Vec<f32> = (0..total).map(|i| 0.5 + (i % 7) as f32 * 0.125).collect();
        let mut at = rt
            .tensor("a", Category::Activation, &[a_rows, k], DType::BF16)
            .unwrap();
        let mut wt = rt
            .tensor("w", Category::Weight, &[experts * n, k], DType::BF16)
            .unwrap();
        let mut sc = rt
            .tensor("scale", Category::Activation, &[total], DType::F32)
            .unwrap();
        let ct = rt
            .tensor("c", Category::Activation, &[total, n], DType::BF16)
            .unwrap();
        cuda(&mut |c| {
            c.upload_f32(&mut at, &a).unwrap();
            c.upload_f32(&mut wt, &w).unwrap();
            c.upload_f32(&mut sc, &scale).unwrap();
        });
        let exact: Vec<f64> = (0..total * n)
            .map(|x| {
                let (slot, j) = (x / n, x % n);
                let row = &a[slot / a_div * k..][..k];
                let wr = &w[(expert_of_slot[slot] * n + j) * k..][..k];
                let dot: f64 = row.iter().zip(wr).map(|(p, q)| *p as f64 * *q as f64).sum();
                if scaled {
                    dot * scale[slot] as f64
                } else {
                    dot
                }
            })
            .collect();
        let g = GroupedGemm {
            dtype: DType::BF16,
            a: at.cuda_ptr(),
            a_div,
            w: wt.cuda_ptr(),
            c: ct.cuda_ptr(),
            scale: if scaled { sc.cuda_ptr() } else { 0 },
            n,
            k,
        };
        let rel = |x: &[f32], y: &dyn Fn(usize) -> f64| {
            let (mut e, mut m) = (0f64, 0f64);
            for (i, v) in x.iter().enumerate() {
                e += (*v as f64 - y(i)).powi(2);
                m += y(i).powi(2);
            }
            (e / m).sqrt()
        };
        let mut mma = Vec::new();
        let wg64 = if n % 256 == 0 {
            "moe_gemm_wg2"
        } else {
            "moe_gemm_wg1"
        };
        let wide = if n % 256 == 0 {
            "moe_gemm_wgp"
        } else {
            "moe_gemm_wg1"
        };
        let mut kernels = vec![(Some(MoeGemmTiles::Mma), "moe_gemm64")];
        if hopper {
            kernels.push((Some(MoeGemmTiles::Wg64), wg64));
            kernels.push((None, wide));
        }
        for (forced, label) in kernels {
            let mut got = Vec::new();
            cuda(&mut |c| {
                let ran = c.moe_gemm_with(&g, &s, forced).unwrap();
                assert_eq!(ran, label, "{forced:?} n {n}");
                got = c.download_f32(&ct).unwrap();
            });
            let e = rel(&got, &|i| exact[i]);
            if mma.is_empty() {
                mma = got.clone();
            }
            let d = rel(&got, &|i| mma[i] as f64);
            eprintln!(
                "grouped GEMM n {n} k {k}, {label}: relative L2 {e:.3e} from f64, {d:.3e} from mma.sync"
            );
            assert!(e < 3e-3, "{label} n {n}: {e:.3e}");
            assert!(d < 1e-3, "{label} n {n}: {d:.3e} from mma.sync");
        }
    }
    eprintln!("Hopper kernels built: {hopper}");
}

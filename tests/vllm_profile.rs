//! vLLM's profile run as vramscope reproduces it (vLLM 380e1863, PR #9516): the sampler step
//! after the forward, vLLM's batch defaults, the verify verdicts, and planning from a
//! config.json alone.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::runtime::Runtime;
use vramscope::engine::tensor::DType;
use vramscope::memory::{Category, EventKind};
use vramscope::model::llama::Batch;
use vramscope::model::sampler::{self, Sampler};
use vramscope::model::weights::StoredDtype;
use vramscope::model::ModelSource;
use vramscope::profile::formulas::FormulaId;
use vramscope::profile::{self, ProfileRequest};
use vramscope::quant::Quant;

fn runtime(spec: &str) -> Runtime {
    let dev = Device::open(&DeviceSpec::parse(spec).unwrap()).unwrap();
    Runtime::new(dev, Arc::new(AtomicBool::new(false)), None)
}

fn request(model: &str, quant: Quant, device: &str) -> ProfileRequest {
    ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant,
        device: DeviceSpec::parse(device).unwrap(),
        ..ProfileRequest::default()
    }
}

/// torch 2.11 on the H200 (scripts/torch_probe.py, docs/gpu-runs.md run 24) replayed vLLM's
/// sampler on fp16 logits [256, V] and measured `max_memory_allocated` over the logits and
/// sampling tensors: 1,183,842,304 B for V = 128,256 and 463,307,264 B for V = 50,272. The same
/// steps through vramscope's allocator, on a warm cache as torch's was, peak at exactly the
/// first; the second depends on which cached blocks torch's earlier probes left (2 MiB
/// segment rounding of unsplit blocks), so it is held to 4 MiB.
#[test]
fn sampler_peak_over_its_input_equals_torch_on_the_h200() {
    for (vocab, torch_peak, tolerance) in [
        (128_256usize, 1_183_842_304u64, 0u64),
        (50_272, 463_307_264, 4 << 20),
    ] {
        let rt = runtime("sim:h200-141gb:dry");
        let seqs = 256;
        let batch = Batch::dummy(2048, seqs, vocab);
        let input = sampler::prepare_model_input(&rt, &batch).unwrap();
        let padded = vocab.div_ceil(64) * 64;
        let logits = rt
            .tensor("logits", Category::Sampler, &[seqs, padded], DType::F16)
            .unwrap();
        let s = Sampler::new(0);
        // The replay made the sampling tensors before it measured; so does a first call here.
        s.forward(&rt, &logits, vocab, &input).unwrap();
        rt.reset_peak();
        let base = rt.stats().allocated;
        s.forward(&rt, &logits, vocab, &input).unwrap();
        let peak = rt.stats().allocated_peak;
        // The second call frees the first call's sampling tensors and makes new ones of the
        // same blocks, so they add nothing over `base`.
        assert!(
            (peak - base).abs_diff(torch_peak) <= tolerance,
            "vocab {vocab}: {} B over the input, torch {torch_peak}",
            peak - base
        );
    }
}

/// top_k = vocab − 1 drops the smallest logit, top_p = 0.99 the tail below 1 − fp16(0.99);
/// the draws must follow softmax over what is left (chi-square, 3 degrees of freedom, p = 0.001).
#[test]
fn sampled_tokens_follow_the_top_k_top_p_distribution() {
    let rt = runtime("sim:h100-80gb");
    let rows = 20_000;
    let vocab = 6;
    let batch = Batch::dummy(rows, rows, vocab);
    let input = sampler::prepare_model_input(&rt, &batch).unwrap();
    let mut logits = rt
        .tensor("logits", Category::Sampler, &[rows, 8], DType::F16)
        .unwrap();
    let row = [0.0f32, 0.5, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0];
    for r in logits.f32_mut().chunks_exact_mut(8) {
        r.copy_from_slice(&row);
    }
    let out = Sampler::new(42)
        .forward(&rt, &logits, vocab, &input)
        .unwrap();
    assert_eq!(out.ids.len(), rows);
    let mut counts = [0usize; 6];
    for &id in &out.ids {
        counts[id as usize] += 1;
    }
    // Token 0 is cut by top-k; token 1 (p = 0.0026 ≤ 0.0103) by top-p.
    assert_eq!(counts[0], 0, "{counts:?}");
    assert_eq!(counts[1], 0, "{counts:?}");
    let e: Vec<f64> = [3.0f64, 4.0, 5.0, 6.0].iter().map(|v| v.exp()).collect();
    let sum: f64 = e.iter().sum();
    let chi2: f64 = (0..4)
        .map(|i| {
            let expect = rows as f64 * e[i] / sum;
            (counts[i + 2] as f64 - expect).powi(2) / expect
        })
        .sum();
    assert!(chi2 < 16.27, "chi2 {chi2} for {counts:?}");
}

/// With vLLM's defaults a Llama-3-8B profile pass is 8192 tokens in 256 sequences, and the
/// sampler's sort, not the model, sets the framework peak.
#[test]
fn llama_3_8b_with_vllm_defaults_peaks_in_the_sampler() {
    let mut req = request("preset:llama-3-8b", Quant::F16, "sim:h100-80gb:dry");
    req.verify = false;
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(r.settings.tokens, 8192);
    assert_eq!(r.settings.seqs, 256);
    assert_eq!(r.settings.max_model_len, 8192);
    let peak = r.checkpoints.t2.allocated_peak;
    let at_peak = r
        .events
        .iter()
        .find(|e| e.kind == EventKind::Alloc && e.pass == 1 && e.allocated == peak)
        .expect("an allocation reaches the peak in pass 1");
    assert_eq!(at_peak.category, Category::Sampler, "{at_peak:?}");
    assert_eq!(at_peak.tensor, "sort.cub_temp_storage");
    // The sampler step over the model-dtype logits: 36 bytes per element of [256, 128256].
    let n = 256u64 * 128_256;
    let before = r
        .events
        .iter()
        .find(|e| e.pass == 1 && e.tensor == "sampler.logits_f32")
        .unwrap()
        .allocated
        - 4 * n;
    assert!(peak - before >= 36 * n && peak - before < 36 * n + (8 << 20));
    // Without the sampler the forward owns a lower peak: in vLLM's MLP, gate_up [8192, 28672]
    // (448 MiB) and SiluAndMul's output (224 MiB) beside the residual stream, the previous
    // layer's output and o_proj's (64 MiB each) and the cuBLAS workspace: about 0.94 GiB
    // over the weights, against the sampler's 1.26 GiB.
    let mut fwd = req.clone();
    fwd.sampler = false;
    let r2 = profile::run(&fwd, None, Arc::new(AtomicBool::new(false))).unwrap();
    let peak2 = r2.checkpoints.t2.allocated_peak;
    let w = r2.weights_bytes;
    assert!(
        peak - peak2 > 256 << 20,
        "without the sampler {peak2} B vs {peak} B"
    );
    let mib = 1 << 20;
    let fwd_over_weights = peak2 - w;
    assert!(
        fwd_over_weights >= 960 * mib && fwd_over_weights < 980 * mib,
        "forward peak over the weights: {} MiB",
        fwd_over_weights / mib
    );
    let owner = r2
        .events
        .iter()
        .find(|e| e.kind == EventKind::Alloc && e.pass == 1 && e.allocated == peak2)
        .unwrap();
    assert_eq!(owner.category, Category::Activation, "{owner:?}");
    // The CSV names the sampler's tensors.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    vramscope::report::export::csv::write(&r, &csv).unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    for name in [
        "sampler.logits_sort",
        "sort.cub_temp_storage",
        "sampler.probs",
        "sampler",
    ] {
        assert!(text.contains(name), "CSV lacks {name}");
    }
}

/// vLLM sets no cap on itself: a budget that does not charge the instance's own context is
/// "over budget" by about what it missed (the context and more), and only running out of the
/// device is an OOM.
#[test]
fn verify_tells_over_budget_from_out_of_memory() {
    let req = request("preset:llama-3-8b", Quant::F16, "sim:h100-80gb:dry");
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    let context = 512i64 << 20;
    for id in [FormulaId::V0_6_3, FormulaId::Pr10511, FormulaId::Pr12126] {
        let f = r.formulas.iter().find(|f| f.id == id).unwrap();
        let v = f.verify.clone().unwrap();
        assert!(v.ran && !v.oom && !v.within_budget, "{id:?}: {v:?}");
        // It misses at least the context, and the pass overruns by what it missed (to within
        // the rounding of the 32 per-layer KV tensors to 2 MiB segment units).
        assert!(-f.error_bytes >= context, "{id:?}: error {}", f.error_bytes);
        assert!(
            (v.overrun_bytes + f.error_bytes).abs() < 32 * (2 << 20),
            "{id:?}: over by {} for an error of {}",
            v.overrun_bytes,
            f.error_bytes
        );
        assert!(v.message.starts_with("over budget by"), "{}", v.message);
        assert!(v.device_room_left_bytes > 0);
    }
    let truth = r.truth.verify.clone().unwrap();
    assert!(
        !truth.oom && truth.overrun_bytes < 32 * (2 << 20),
        "{truth:?}"
    );

    // Another process holding most of what is left: the granted cache no longer fits.
    let mut crowded = req.clone();
    crowded.outside_before = 15 << 29;
    let r = profile::run(&crowded, None, Arc::new(AtomicBool::new(false))).unwrap();
    let new = r
        .formulas
        .iter()
        .find(|f| f.id == FormulaId::Pr9516)
        .unwrap()
        .verify
        .clone()
        .unwrap();
    // #9516 charges the other process, so its grant still fits; #10511 does not, and runs the
    // device out of memory.
    assert!(!new.oom, "{new:?}");
    let old = r
        .formulas
        .iter()
        .find(|f| f.id == FormulaId::Pr10511)
        .unwrap()
        .verify
        .clone()
        .unwrap();
    assert!(old.oom && old.message.starts_with("OOM"), "{old:?}");
    assert!(old.device_room_left_bytes <= 0 || old.message.contains("out of memory"));
}

/// Plan before downloading: a folder with only config.json gives, in a dry run, the weights,
/// peak and budgets the full checkpoint gives.
#[test]
fn a_config_json_alone_plans_like_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full");
    vramscope::model::gen_model("tiny", &full, StoredDtype::F16, 1).unwrap();
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    std::fs::copy(full.join("config.json"), bare.join("config.json")).unwrap();
    for quant in [Quant::F16, Quant::Int8, Quant::Nf4] {
        let a = profile::run(
            &request(full.to_str().unwrap(), quant, "sim:h100-80gb:dry"),
            None,
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
        let b = profile::run(
            &request(bare.to_str().unwrap(), quant, "sim:h100-80gb:dry"),
            None,
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
        assert_eq!(a.weights_bytes, b.weights_bytes, "{quant}");
        assert_eq!(
            a.checkpoints.t2.allocated_peak, b.checkpoints.t2.allocated_peak,
            "{quant}"
        );
        for (fa, fb) in a.formulas.iter().zip(&b.formulas) {
            assert_eq!(fa.kv_bytes, fb.kv_bytes, "{quant} {:?}", fa.id);
        }
    }
    // Compute mode needs the weights, and says so.
    let err = profile::run(
        &request(bare.to_str().unwrap(), Quant::F16, "sim:h100-80gb"),
        None,
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("config.json") && err.contains("needs the weights"),
        "{err}"
    );
}

const GIB: f64 = (1u64 << 30) as f64;

/// vLLM's own tests/worker/test_profile.py (380e1863 and, for the old formula, de4008e2):
/// facebook/opt-125m in fp16 with vLLM's defaults on a GPU mocked to 10 GiB where free memory
/// is 10 GiB − torch allocated. Under #9352 it expects a torch peak of 0.7077 GiB, 0.0079 GiB
/// "non-torch" (really the cuBLAS workspace that survives the pass) and 8.2843 GiB of KV cache
/// within 5 blocks; under #9516 no non-torch memory and 8.2923 GiB within 10 blocks. vramscope
/// reaches them through its normal procedure, in dry and in compute mode.
#[test]
fn vllm_test_profile_is_reproduced_on_opt_125m() {
    let block = 2 * 16 * 12 * 12 * 64 * 2u64; // opt-125m, fp16, block_size 16
    let mut dry = request("preset:opt-125m", Quant::F16, "sim:mock-10gib:dry");
    dry.verify = false;
    let mut compute = dry.clone();
    compute.device = DeviceSpec::parse("sim:mock-10gib").unwrap();
    compute.passes = 1;
    let d = profile::run(&dry, None, Arc::new(AtomicBool::new(false))).unwrap();
    let c = profile::run(&compute, None, Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!((d.settings.tokens, d.settings.seqs), (2048, 256));
    for r in [&d, &c] {
        assert_eq!(r.kv_geometry.block_bytes(), block);
        let old = r.formula(FormulaId::Pr9352).unwrap();
        let new = r.formula(FormulaId::Pr9516).unwrap();
        // vLLM's test prints 4 decimals of GiB; with vLLM's fused qkv_proj and flash-attn's
        // allocations vramscope lands on them (the tolerances vLLM's test allows are 5 and 10
        // blocks; these are 1).
        assert!(
            (old.torch_peak_bytes as f64 / GIB - 0.7077).abs() < 0.0001,
            "torch peak {} GiB",
            old.torch_peak_bytes as f64 / GIB
        );
        assert_eq!(
            (old.non_torch_bytes as f64 / GIB * 1e4).round(),
            79.0,
            "#9352 non-torch {} B",
            old.non_torch_bytes
        );
        assert_eq!(new.non_torch_bytes, 0);
        let expect_old = (8.2843 * GIB) as u64 / block;
        let expect_new = (8.2923 * GIB) as u64 / block;
        assert!(
            old.kv_blocks.abs_diff(expect_old) <= 1,
            "#9352: {} blocks, vLLM {expect_old}",
            old.kv_blocks
        );
        assert!(
            new.kv_blocks.abs_diff(expect_new) <= 1,
            "#9516: {} blocks, vLLM {expect_new}",
            new.kv_blocks
        );
    }
    // Compute mode makes the dry run's allocations.
    assert_eq!(d.weights_bytes, c.weights_bytes);
    assert_eq!(
        d.checkpoints.t2.allocated_peak,
        c.checkpoints.t2.allocated_peak
    );
    assert_eq!(c.sampled_tokens.len(), 8, "compute mode samples");
}

/// The seed's second 8-bit model, yec019/fbopt-350m-8bit: OPT-350m in LLM.int8 keeps its CxB
/// state after the pass, and #9352 counts it twice.
#[test]
fn opt_350m_int8_state_is_counted_twice_by_the_old_formula() {
    let mut req = request("preset:opt-350m", Quant::Int8, "sim:h100-80gb:dry");
    req.verify = false;
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    let kept = r.quant_state_after_bytes;
    assert!(kept > 250 << 20, "CxB kept after the pass: {kept} B");
    let old = r.formula(FormulaId::Pr9352).unwrap();
    let new = r.formula(FormulaId::Pr9516).unwrap();
    // The old formula's non-torch term is the kept state (plus the workspace and cached
    // segments), which is inside its torch peak already: counted twice. On a model this small
    // the 512 MiB context it misses outweighs it, so the old budget is still too large.
    let extra = old.non_torch_bytes as u64 - kept;
    assert!(
        old.non_torch_bytes as u64 >= kept && extra < 100 << 20,
        "{old:?}"
    );
    assert_eq!(old.torch_peak_bytes, new.torch_peak_bytes);
}

/// The true maximum (`--true-max`): with its blocks, two serving passes after the profile stay
/// within floor(T·u); with one block more they do not. It sits near the truth's count (the
/// truth is the profile pass's own peak), and the new formula's error against it is the slack
/// the serving passes need beyond the profile's peak.
#[test]
fn the_true_maximum_fits_and_one_block_more_does_not() {
    let mut req = request("preset:llama-3-8b", Quant::Int8, "sim:h100-80gb:dry");
    req.true_max = true;
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    let m = r.true_max.as_ref().expect("searched");
    let at = m.verify.as_ref().expect("some blocks fit");
    assert!(at.ran && at.within_budget && !at.oom, "{}", at.message);
    assert!(
        m.one_more.ran && !m.one_more.within_budget,
        "{}",
        m.one_more.message
    );
    assert_eq!(
        m.one_more.kv_allocated_bytes,
        at.kv_allocated_bytes + r.kv_geometry.block_bytes()
    );
    assert_eq!(m.kv_bytes, m.blocks * r.kv_geometry.block_bytes());
    let truth = r.truth.kv_blocks;
    assert!(
        m.blocks.abs_diff(truth) * 100 <= truth,
        "true maximum {} blocks, truth {truth}",
        m.blocks
    );
    assert!(m.probes >= 3 && m.probes < 64, "{} probes", m.probes);
    // Without the flag nothing is searched and the session does not carry the field.
    req.true_max = false;
    let plain = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    assert!(plain.true_max.is_none());
    assert!(!serde_json::to_string(&plain).unwrap().contains("true_max"));
}

/// A model whose weights fit but leave no KV block gets a headline that says vLLM would not
/// start, and what would fit; the `--util` it names does leave a block.
#[test]
fn a_model_that_does_not_fit_says_so_and_what_would() {
    let mut req = request("preset:qwen2.5-7b", Quant::BF16, "sim:a10:dry");
    req.util = 0.7;
    req.max_model_len = 8192;
    req.verify = false;
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    assert_eq!(r.vllm_answer().unwrap().kv_blocks, 0);
    let h = r.does_not_fit().expect("a headline");
    assert!(
        h.contains("would not start") && h.contains("--quant int8"),
        "{h}"
    );
    let util: f64 = h
        .split("--util ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no --util in {h}"));
    assert!(util > req.util && util <= 1.0, "{h}");
    req.util = util;
    let fits = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    assert!(fits.vllm_answer().unwrap().kv_blocks > 0);
    assert!(fits.does_not_fit().is_none());
}

/// V0's CUDA graphs (0.6.4): after the KV cache, the decode inputs for the largest batch, then
/// 35 whole-model graphs for 256 sequences (256 down to 8 in steps of 8, then 4, 2, 1), each
/// after two warm-ups, with FlashAttention 2's split accumulators where its heuristic splits
/// (32 at batch 1); the default release (380e1863) captures none.
#[test]
fn v0_captures_its_decode_graphs_after_the_kv_cache() {
    let mut req = request("preset:llama-3-8b", Quant::F16, "sim:h200:dry");
    req.vllm = "0.6.4".into();
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    let g = r.graphs.as_ref().expect("0.6.4 captures graphs");
    assert_eq!(g.graphs, 35);
    assert!(g.estimate.is_none());
    let allocs = |name: &str| -> Vec<u64> {
        r.events
            .iter()
            .filter(|e| e.kind == EventKind::Alloc && e.tensor == name)
            .map(|e| e.bytes)
            .collect()
    };
    // Block tables [256, 8192 / 16] int32.
    assert_eq!(allocs("graph_inputs.block_tables"), [256 * 512 * 4]);
    // Splits × 32 heads × batch × 128 fp32, in both warm-ups and the capture: 32 × 1, 16 × 2,
    // 4 × 8 and 2 × 16 all make 512 KiB; 7 × 4 and 4 × 24 their own; from 32 on no split.
    let acc = |bytes: u64| {
        allocs("layers.0.attn.out_accum")
            .iter()
            .filter(|&&b| b == bytes)
            .count()
    };
    assert_eq!(acc(32 * 32 * 128 * 4), 4 * 3);
    assert_eq!(acc(7 * 32 * 4 * 128 * 4), 3);
    assert_eq!(acc(4 * 32 * 24 * 128 * 4), 3);
    assert_eq!(allocs("layers.0.attn.out_accum").len(), 6 * 3);
    let lines = r.vllm_graph_log_lines().join("\n");
    assert!(lines.starts_with("INFO model_runner.py] Graph capturing finished in"));
    let mut default = request("preset:llama-3-8b", Quant::F16, "sim:h200:dry");
    default.vllm = profile::vllm::DEFAULT.into();
    let d = profile::run(&default, None, Arc::new(AtomicBool::new(false))).unwrap();
    assert!(d.graphs.is_none() && d.graphs_note.is_none());
}

//! vLLM V1's sampler warm-up after the KV cache, as a phase of the procedure.
//!
//! Once the KV cache is allocated and the CUDA graphs are captured, V1's
//! `Worker.compile_or_warm_up_model` runs, on the last pipeline rank, one more eager dummy
//! forward of `min(max_num_seqs, max_num_batched_tokens)` tokens, one per request
//! (`_dummy_run(num_tokens=max_num_reqs, cudagraph_runtime_mode=NONE)`: no attention metadata,
//! so attention returns zeros as in the profile), and then `_dummy_sampler_run` on its last
//! hidden states: `torch.rand_like`, `compute_logits` to `[R, V]` logits in the model dtype,
//! and the sampler with the profile's dummy metadata (temperature 0.5, top-p 0.9, top-k V − 1,
//! penalties 0.1 each, `no_penalties=True`), the same `Sampler.forward` as the profile's, so
//! the same fp32 copy of the logits, top-k/top-p path and probabilities. "This is called after
//! `capture_model` on purpose to prevent memory buffers from being cleared by
//! `empty_cache`" (the worker's comment): nothing frees memory for it, and the utilization is
//! no limit any more; only the device is. When an allocation of the sampler fails, vLLM
//! re-raises it as "CUDA out of memory occurred when warming up sampler with R dummy requests.
//! …"; one in the dummy forward, `rand_like` or `compute_logits` stays torch's own
//! `OutOfMemoryError` (the `try` holds only the `self.sampler(...)` call).
//!
//! Read for each release (the worker's block, then `_dummy_sampler_run`'s re-raise):
//! 0.11.0 v1/worker/gpu_worker.py L395-414, gpu_model_runner.py L3183-3227; 0.15.1
//! gpu_worker.py L510-530, gpu_model_runner.py L4772-4824; 0.19.0 gpu_worker.py L663-686,
//! gpu_model_runner.py L5556-5608 (`_dummy_run` L5194-5554); 0.21.0 gpu_worker.py L687-710,
//! gpu_model_runner.py L5702-5775 (the sampler run twice, FlashInfer's path then the native
//! one with a generator, as in its profile). The rows after 0.21 are 0.21's code here (not
//! re-read). Model Runner V2 runs `warmup_kernels` instead (0.21.0 gpu_worker.py L687-689):
//! not modelled. The text is the same in every release read.
//!
//! vramscope runs the warm-up with the profile's own workload (the model, the `Sampler` whose
//! cached Triton/FlashInfer buffers the profile left) on a batch of the warm-up's size, where
//! the KV cache of the release's grant is allocated and the graphs are alive. Its peak is this
//! process's peak device memory; where it runs out, the KV cache is given back and the
//! warm-up runs again to measure what it needs, so the shortfall is exact and not found by
//! trying utilizations.

use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::DType;

/// vLLM's message when the sampler of the warm-up runs out of memory (identical in 0.10.0,
/// 0.11.0, 0.15.1, 0.19.0 and 0.21.0).
pub fn vllm_message(num_reqs: u64) -> String {
    format!(
        "RuntimeError: CUDA out of memory occurred when warming up sampler with {num_reqs} \
         dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` \
         when initializing the engine."
    )
}

/// Where `release` (a row of `vllm::RELEASES`) raises it: the re-raise in
/// `_dummy_sampler_run`, and the worker's line that calls it.
pub fn source(release: &str) -> &'static str {
    match release {
        "0.10" => {
            "vLLM 0.10.0 v1/worker/gpu_model_runner.py L2235-2246 (_dummy_sampler_run, from gpu_worker.py L313)"
        }
        "0.11" => {
            "vLLM 0.11.0 v1/worker/gpu_model_runner.py L3219-3227 (_dummy_sampler_run, from gpu_worker.py L413)"
        }
        "0.15" => {
            "vLLM 0.15.1 v1/worker/gpu_model_runner.py L4815-4824 (_dummy_sampler_run, from gpu_worker.py L530)"
        }
        "0.19" => {
            "vLLM 0.19.0 v1/worker/gpu_model_runner.py L5599-5608 (_dummy_sampler_run, from gpu_worker.py L686)"
        }
        "0.21" => {
            "vLLM 0.21.0 v1/worker/gpu_model_runner.py L5766-5775 (_dummy_sampler_run, from gpu_worker.py L710)"
        }
        _ => {
            "vLLM 0.21.0 v1/worker/gpu_model_runner.py L5766-5775 (_dummy_sampler_run, from gpu_worker.py L710; the nearest release read)"
        }
    }
}

/// Where the warm-up ran out of memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WarmUpOom {
    /// In the sampler's own call (vLLM's message), else in the dummy forward, `rand_like`,
    /// the logits or the dummy metadata before it (torch's `OutOfMemoryError`).
    pub in_sampler: bool,
    /// vramscope's op that failed (`sampler_v1.to_float`, …).
    pub op: String,
    /// The allocator's error.
    pub message: String,
}

/// The sampler warm-up after the KV cache, as the instance would run it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplerWarmUp {
    /// `min(max_num_seqs, max_num_batched_tokens)`: the dummy forward's tokens, one per
    /// request, and the sampler's rows.
    pub num_reqs: u64,
    /// The vocabulary the sampler runs over (its logits are `[num_reqs, vocab]`).
    pub vocab: u64,
    /// This process's device memory when it starts (weights, KV cache, graphs, memory outside
    /// PyTorch) and the device's free memory then.
    pub process_before_bytes: u64,
    pub free_before_bytes: u64,
    /// What it takes above `process_before_bytes` at its peak (new segments). Measured in the
    /// run where it fits; where it does not, measured again with the KV cache given back.
    pub need_bytes: u64,
    /// It ran out even without the KV cache: `need_bytes` is what was free then, a lower bound.
    #[serde(default)]
    pub need_at_least: bool,
    /// The instance's peak: `process_before_bytes + need_bytes`.
    pub peak_process_bytes: u64,
    /// Device total − other processes − the peak (negative: short by that much).
    pub room_left_bytes: i64,
    /// Where it ran out, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<WarmUpOom>,
}

impl SamplerWarmUp {
    /// The sampler's unit: one `[num_reqs, vocab]` f32 tensor (its `logits.to(float32)`, the
    /// probabilities, the exponential draws each take one).
    pub fn logits_f32_bytes(&self) -> u64 {
        self.num_reqs * self.vocab * DType::F32.size_bytes()
    }

    /// One line for a run's output.
    pub fn summary(&self, release: &str) -> String {
        use crate::base::units::{fmt_i, fmt_u};
        let head = format!(
            "sampler warm-up after the KV cache (vLLM {release}: a dummy forward of {} tokens, \
             then the sampler on [{}, {}] logits, {} per f32 copy)",
            self.num_reqs,
            self.num_reqs,
            self.vocab,
            fmt_u(self.logits_f32_bytes())
        );
        match &self.failed {
            None => format!(
                "{head}: needs {} with {} free, peak {}, {} of the device left",
                fmt_u(self.need_bytes),
                fmt_u(self.free_before_bytes),
                fmt_u(self.peak_process_bytes),
                fmt_i(self.room_left_bytes)
            ),
            Some(f) => format!(
                "{head}: needs {}{} with {} free — it would run out of memory{} ({} short)",
                if self.need_at_least { "at least " } else { "" },
                fmt_u(self.need_bytes),
                fmt_u(self.free_before_bytes),
                if f.in_sampler {
                    " in the sampler"
                } else {
                    " before the sampler"
                },
                fmt_i(-self.room_left_bytes)
            ),
        }
    }
}

/// What the procedure hands a phase after the KV cache so it can run the warm-up: its size
/// and the pass itself (the profile's workload on the warm-up's batch).
pub(crate) struct WarmUpSpec<'a> {
    pub num_reqs: usize,
    pub vocab: usize,
    /// The release's `capture_model` ends with `empty_cache` (`Release::empties_cache_after_capture`).
    pub empty_first: bool,
    pub pass: &'a mut dyn FnMut() -> Result<()>,
}

/// Whether `op` is the sampler's own call (`self.sampler(...)` in `_dummy_sampler_run`),
/// where vLLM re-raises with its message; the metadata `torch.full`s come before the `try`.
fn in_sampler(op: &str) -> bool {
    op.starts_with("sampler") && op != "sampler_v1.metadata"
}

/// Runs the warm-up (`spec.pass`: the dummy forward and the sampler) with the KV cache
/// allocated, on a device whose total is `total` with `others` held by other processes.
/// `release_kv` gives the KV cache back (called only where the warm-up ran out, to measure
/// what it needs).
pub(crate) fn run(
    rt: &Runtime,
    spec: WarmUpSpec<'_>,
    total: u64,
    others: u64,
    release_kv: &mut dyn FnMut(),
) -> Result<SamplerWarmUp> {
    let WarmUpSpec {
        num_reqs,
        vocab,
        empty_first,
        pass,
    } = spec;
    rt.synchronize()?;
    if empty_first {
        rt.empty_cache();
    }
    rt.set_op("sampler_warm_up");
    rt.set_layer(None);
    rt.marker(&format!("sampler warm-up ({num_reqs} dummy requests)"));
    let s = rt.snapshot();
    let (before, free_before) = (s.process_used, s.mem.free);
    rt.reset_process_peak();
    let first = pass().and_then(|_| rt.synchronize());
    let failed = match first {
        Ok(()) => None,
        Err(e @ Error::OutOfMemory { .. }) => Some(WarmUpOom {
            in_sampler: in_sampler(rt.op()),
            op: rt.op().to_string(),
            message: e.to_string(),
        }),
        Err(e) => return Err(e),
    };
    let (mut need, mut at_least) = (rt.process_peak().saturating_sub(before), false);
    if failed.is_some() {
        // Its allocations do not depend on the KV cache: with the cache given back, the same
        // warm-up shows what it takes.
        release_kv();
        rt.empty_cache();
        rt.set_op("sampler_warm_up");
        rt.marker("sampler warm-up again, the KV cache given back (what it needs)");
        let s = rt.snapshot();
        rt.reset_process_peak();
        match pass().and_then(|_| rt.synchronize()) {
            Ok(()) => need = rt.process_peak().saturating_sub(s.process_used),
            Err(Error::OutOfMemory { .. }) => {
                need = s.mem.free;
                at_least = true;
            }
            Err(e) => return Err(e),
        }
    }
    rt.set_op("sampler_warm_up");
    rt.marker("sampler warm-up end");
    let peak = before + need;
    Ok(SamplerWarmUp {
        num_reqs: num_reqs as u64,
        vocab: vocab as u64,
        process_before_bytes: before,
        free_before_bytes: free_before,
        need_bytes: need,
        need_at_least: at_least,
        peak_process_bytes: peak,
        room_left_bytes: total as i64 - others as i64 - peak as i64,
        failed,
    })
}

/// The warm-up of an instance without CUDA graphs (`--enforce-eager`, or a release whose
/// graphs are not reproduced): the KV cache of `kv_blocks` allocated as
/// `initialize_kv_cache` does, the warm-up, everything given back. `None` where the KV
/// cache itself does not fit (the diagnosis names that first).
pub(crate) fn eager(
    rt: &Runtime,
    geometry: &super::formulas::KvGeometry,
    kv_dtype: DType,
    kv_blocks: u64,
    others: u64,
    spec: WarmUpSpec<'_>,
) -> Result<Option<SamplerWarmUp>> {
    let total = rt.snapshot().mem.total;
    rt.empty_cache();
    let kv = match geometry.allocate(rt, kv_dtype, kv_blocks, "warm-up") {
        Ok(kv) => kv,
        Err(Error::OutOfMemory { .. }) => {
            rt.empty_cache();
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut kv = Some(kv);
    let w = run(rt, spec, total, others, &mut || drop(kv.take()));
    drop(kv);
    rt.empty_cache();
    w.map(Some)
}

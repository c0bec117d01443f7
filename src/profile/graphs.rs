//! vLLM V1's CUDA graphs, as a phase of the procedure: the memory estimator some releases run
//! inside the profile (`profile_cudagraph_memory`) and the capture after the KV cache
//! (`capture_model`), both from the same warm-up and capture sequence (0.19.0
//! v1/worker/gpu_model_runner.py:5862-5960 and :6006-6086; reading notes in
//! docs/reading/vllm-v1-graphs.md).
//!
//! Each capture size is a decode batch: n requests of one token. A PIECEWISE graph set runs
//! the forward with attention skipped (no metadata: zeros) and is cut at every attention
//! layer; a FULL graph holds the whole forward with attention, which on Hopper is
//! FlashAttention 3 with 32 splits. Warm-ups and captures run on a side stream; captures draw
//! on a graph pool shared by all sizes, captured largest first.

use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};
use crate::engine::runtime::{
    CaptureKind, FlashCall, GraphRecord, Runtime, ESTIMATE_POOL, GRAPH_POOL,
};
use crate::engine::tensor::DType;
use crate::memory::Category;
use crate::model::batch::Batch;
use crate::model::CausalLm;

use super::formulas::KvGeometry;

/// FlashAttention 3's split count in vLLM's FULL graphs (0.19.0 config/attention.py:27,
/// `flash_attn_max_num_splits_for_cuda_graph`).
pub const FA3_GRAPH_SPLITS: usize = 32;
/// The estimator's floor per graph (`max(second, 1 MiB)`, 0.19.0 gpu_model_runner.py:5921-5935).
const MIN_PER_GRAPH: u64 = 1 << 20;

/// One mode's samples in vLLM's estimator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EstimateMode {
    pub kind: CaptureKind,
    /// Sizes the release captures in this mode.
    pub sizes: usize,
    pub largest: usize,
    /// Free memory taken by the first (largest) warm-up and capture.
    pub first_bytes: u64,
    /// By the second.
    pub second_bytes: Option<u64>,
}

impl EstimateMode {
    /// `max(second, 1 MiB) · (n − 1)`.
    pub fn rest_bytes(&self) -> u64 {
        self.second_bytes.unwrap_or(0).max(MIN_PER_GRAPH) * (self.sizes as u64).saturating_sub(1)
    }
}

/// vLLM's CUDA graph memory estimate, from its own samples.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Estimate {
    pub modes: Vec<EstimateMode>,
    /// max over modes of the first sample + Σ over modes of the rest (0.19.0 :5949-5960).
    pub total_bytes: u64,
    /// Whether the release subtracts it from the KV budget.
    pub applied: bool,
}

/// Each replayed graph set against its eager warm-up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayCheck {
    pub checked: usize,
    /// The largest relative L2 distance of a replay's output hidden states from the eager
    /// pass's, and where.
    pub worst_rel_l2: f64,
    pub worst: String,
}

/// The capture after the KV cache, as the instance would run it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphReport {
    /// Sizes per mode, largest first.
    pub plan: Vec<(CaptureKind, Vec<usize>)>,
    pub graphs: u64,
    /// Ops captured into them (the same on every backend), and per mode.
    pub ops: u64,
    #[serde(default)]
    pub ops_by_mode: Vec<(CaptureKind, u64)>,
    /// Nodes of the instantiated graphs (GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u64>,
    /// The graph pool's segments after the capture.
    pub pool_bytes: u64,
    /// Device memory of the instantiated graphs: measured (GPU) or modelled.
    pub exec_bytes: u64,
    pub exec_measured: bool,
    /// Segments the capture's side stream holds when vLLM reads free memory: its cuBLAS
    /// workspace and what its warm-ups left cached.
    pub side_stream_bytes: u64,
    /// vLLM's "took": free memory before the capture − after (before its last empty_cache).
    pub took_bytes: i64,
    /// This process's device memory after the capture − before, as NVML lists it (GPU) or
    /// the simulated device's bookkeeping.
    #[serde(default)]
    pub process_delta_bytes: i64,
    pub capture_s: f64,
    /// KV cache blocks allocated while capturing (the release's own grant).
    pub kv_blocks: u64,
    /// The instance's peak device memory while capturing, and what was left of the device.
    pub peak_process_bytes: u64,
    pub room_left_bytes: i64,
    /// The estimator's samples (releases that have it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayCheck>,
    /// Why the capture stopped (out of memory), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// What one capture leaves for the replay check.
struct Captured {
    kind: CaptureKind,
    graphs: Vec<GraphRecord>,
    label: String,
    output: Option<(u64, usize, DType)>,
    eager: Option<Vec<f32>>,
}

/// `hidden_states[logit_indices]` after each dummy run, eager on the side stream (0.19.0
/// gpu_model_runner.py:5549-5553): the indices uploaded, the rows gathered, both dropped. A
/// pipeline stage before the last uploads the indices only (its output is
/// `IntermediateTensors`, whose `__getitem__` of a tensor gathers nothing: sequence.py L41-45).
fn gather_last(rt: &Runtime, n: usize, cols: usize, dtype: DType) -> Result<()> {
    rt.set_op("dummy_run.logit_indices");
    let idx = rt.tensor("logit_indices", Category::Activation, &[n], DType::I64)?;
    if rt.pp().is_some_and(|p| !p.is_last()) {
        drop(idx);
        return Ok(());
    }
    let rows = rt.tensor(
        "last_hidden_states",
        Category::Activation,
        &[n, cols],
        dtype,
    )?;
    drop((rows, idx));
    Ok(())
}

/// Which engine's capture: what a size's warm-ups and graph look like.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Style {
    /// V1: one warm-up, the gather after each run, FULL graphs with FlashAttention 3's 32
    /// splits, PIECEWISE ones with attention skipped. `triton`: the attention backend is
    /// Triton's (`--dtype float32`, which FlashAttention and FlashInfer do not take: 0.19.0
    /// platforms/cuda.py L51-111 and the backends' `supported_dtypes`, triton_attn.py L259-263).
    V1 { triton: bool },
    /// V0: two warm-ups (`_NUM_WARMUP_ITERS`), whole-model graphs, no gather; the decode
    /// attention of `V0Attention` with its splits for this batch.
    V0 {
        attention: super::vllm::V0Attention,
        /// SMs of the GPU, the key length the graphs are captured for (max_seq_len_to_capture
        /// rounded up to whole blocks) and whether the GPU is a Hopper.
        sms: usize,
        keys: usize,
        hopper: bool,
    },
}

impl Style {
    fn warmups(self) -> u32 {
        match self {
            Style::V1 { .. } => 1,
            Style::V0 { .. } => 2,
        }
    }

    /// The attention call of a FULL graph of `n` tokens of model shape `(heads, kv_heads, d)`.
    fn attention(self, n: usize, heads: usize, kv_heads: usize, d: usize) -> FlashCall {
        match self {
            Style::V1 { triton: false } => FlashCall::Fa3 {
                splits: FA3_GRAPH_SPLITS,
            },
            Style::V1 { triton: true } => FlashCall::TritonUnified,
            Style::V0 {
                attention,
                sms,
                keys,
                hopper,
            } => {
                if attention == super::vllm::V0Attention::Fa3OnHopper && hopper {
                    FlashCall::Fa3V0 {
                        splits: fa3_splits(kv_heads, sms, keys.div_ceil(128)),
                    }
                } else {
                    // Decode with grouped heads swaps the query heads of a KV head into rows
                    // (`seqlenq_ngroups_swapped`): batch · kv_heads rows of one m-block.
                    let rows = if heads > kv_heads {
                        n * kv_heads
                    } else {
                        n * heads
                    };
                    let block_n = if d <= 64 {
                        256
                    } else if d <= 128 {
                        128
                    } else {
                        64
                    };
                    FlashCall::Fa2Kvcache {
                        splits: fa2_splits(rows, 2 * sms, keys.div_ceil(block_n)),
                    }
                }
            }
        }
    }
}

/// FlashAttention 2's `num_splits_heuristic` (csrc/flash_attn/flash_api.cpp): no split when
/// the blocks fill 80 % of the SMs, else the fewest splits within 85 % of the best wave
/// efficiency, counting only split counts that change the blocks per split.
pub fn fa2_splits(batch_nheads_mblocks: usize, sms: usize, n_blocks: usize) -> usize {
    if batch_nheads_mblocks as f64 >= 0.8 * sms as f64 {
        return 1;
    }
    let max = 128.min(sms).min(n_blocks).max(1);
    let eligible = |s: usize| s == 1 || n_blocks.div_ceil(s) != n_blocks.div_ceil(s - 1);
    let eff = |s: usize| {
        let w = batch_nheads_mblocks as f64 * s as f64 / sms as f64;
        w / w.ceil()
    };
    let best = (1..=max)
        .filter(|&s| eligible(s))
        .map(eff)
        .fold(0.0, f64::max);
    (1..=max)
        .find(|&s| eligible(s) && eff(s) >= 0.85 * best)
        .unwrap_or(1)
}

/// FlashAttention 3's heuristic for a decode call with dynamic splits (hopper/heuristics.h:
/// the batch taken as 1): `total_mblocks` = KV heads. Causal, so its rule for large
/// non-causal K/V (splits by 50 MiB of L2) never applies.
pub fn fa3_splits(total_mblocks: usize, sms: usize, n_blocks: usize) -> usize {
    if total_mblocks as f64 >= 0.8 * sms as f64 {
        return 1;
    }
    if n_blocks <= 4 {
        return 1;
    }
    let max = 128.min(sms).min(n_blocks).max(1);
    let eff = |s: usize| {
        let w = total_mblocks as f64 * s as f64 / sms as f64;
        w / w.ceil()
    };
    let best = (1..=max).map(eff).fold(0.0, f64::max);
    (1..=max).find(|&s| eff(s) >= 0.85 * best).unwrap_or(1)
}

/// One size: its eager warm-ups, then the capture into `pool`.
fn warmup_and_capture(
    rt: &Runtime,
    model: &CausalLm,
    style: Style,
    kind: CaptureKind,
    n: usize,
    pool: u16,
    keep_reference: bool,
) -> Result<Captured> {
    let cfg = model.config();
    let batch = Batch::dummy(n, n, cfg.vocab_size);
    model.set_skip_attention(kind == CaptureKind::Piecewise);
    rt.set_attention_splits(
        (kind == CaptureKind::Full)
            .then(|| style.attention(n, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)),
    );
    let result = (|| {
        let mut eager = None;
        for w in 0..style.warmups() {
            rt.marker(&format!("warm-up {} {n}", kind.name()));
            let h = model.forward_hidden(rt, &batch)?;
            if keep_reference && w == 0 {
                eager = crate::engine::ops::read_f32(rt, &h)?;
            }
            if matches!(style, Style::V1 { .. }) {
                gather_last(rt, n, h.cols(), h.dtype)?;
            }
            drop(h);
        }
        rt.synchronize()?;
        rt.marker(&format!("capture {} {n}", kind.name()));
        rt.capture_begin(pool, kind)?;
        let out = match model.forward_hidden(rt, &batch) {
            Ok(h) => h,
            Err(e) => {
                let _ = rt.capture_end();
                return Err(e);
            }
        };
        let output = match &out.storage {
            crate::engine::tensor::Storage::Cuda(p) => Some((*p, out.numel(), out.dtype)),
            _ => None,
        };
        let (cols, dtype) = (out.cols(), out.dtype);
        // The output is a weak reference once captured: its block goes back to the pool.
        drop(out);
        let graphs = rt.capture_end()?;
        if matches!(style, Style::V1 { .. }) {
            gather_last(rt, n, cols, dtype)?;
        }
        Ok(Captured {
            kind,
            graphs,
            label: format!("{} {n}", kind.name()),
            output,
            eager,
        })
    })();
    model.set_skip_attention(false);
    rt.set_attention_splits(None);
    result
}

fn free_now(rt: &Runtime) -> u64 {
    rt.snapshot().mem.free
}

/// vLLM's estimator (0.19.0 gpu_model_runner.py:5862-5960): a minimal KV cache of the largest
/// capture size in blocks, a throwaway pool, then per mode the two largest sizes warmed up and
/// captured, each measured by free memory; everything freed after.
pub(crate) fn estimate(
    rt: &Runtime,
    model: &CausalLm,
    plan: &[(CaptureKind, Vec<usize>)],
    geometry: &KvGeometry,
    kv_dtype: DType,
    applied: bool,
    style: Style,
) -> Result<Estimate> {
    let largest = plan
        .iter()
        .flat_map(|(_, s)| s.first().copied())
        .max()
        .unwrap_or(1);
    rt.graph_prepare()?;
    rt.marker("cudagraph estimate");
    let kv = geometry.allocate(rt, kv_dtype, largest as u64, "estimator")?;
    rt.graph_side_stream(true)?;
    let result = (|| {
        rt.synchronize()?;
        rt.empty_cache();
        let mut modes = Vec::new();
        for (kind, sizes) in plan {
            if sizes.is_empty() {
                continue;
            }
            let mut samples = Vec::new();
            for &n in sizes.iter().take(2) {
                let before = free_now(rt);
                warmup_and_capture(rt, model, style, *kind, n, ESTIMATE_POOL, false)?;
                rt.synchronize()?;
                samples.push(before.saturating_sub(free_now(rt)));
            }
            modes.push(EstimateMode {
                kind: *kind,
                sizes: sizes.len(),
                largest: sizes[0],
                first_bytes: samples[0],
                second_bytes: samples.get(1).copied(),
            });
        }
        Ok(modes)
    })();
    rt.graphs_drop(ESTIMATE_POOL)?;
    rt.graph_side_stream(false)?;
    drop(kv);
    rt.empty_cache();
    rt.marker("cudagraph estimate end");
    let modes = result?;
    let first = modes.iter().map(|m| m.first_bytes).max().unwrap_or(0);
    let rest: u64 = modes.iter().map(EstimateMode::rest_bytes).sum();
    Ok(Estimate {
        total_bytes: first + rest,
        modes,
        applied,
    })
}

/// The Triton attention metadata builder's buffers for its 3D decode kernel, made with the
/// KV cache (`initialize_kv_cache`) and kept for the instance's life (0.19.0
/// v1/attention/backends/triton_attn.py L120-190, 0.15.1 the same): the threshold is
/// `128 // kv_heads` sequences (`MIN_LAUNCH_GRID_SIZE_2D`), moved to the nearest capture size
/// when FULL graphs decode (the first of two as near, the sizes ascending), then
/// `softmax_segm_output [t, heads, 16, next_pow2(head_dim)]` and `softmax_segm_max` /
/// `softmax_segm_expsum [t, heads, 16]`, all f32 (this rank's heads).
fn triton_segment_buffers(
    rt: &Runtime,
    model: &CausalLm,
    plan: &[(CaptureKind, Vec<usize>)],
) -> Result<Vec<crate::engine::tensor::Tensor>> {
    const MIN_LAUNCH_GRID_SIZE_2D: usize = 128;
    const SEGMENTS: usize = 16;
    let cfg = model.config();
    let (heads, kv_heads) = match rt.tp() {
        Some(t) => {
            let s = crate::model::layers::tp::TpShard::new(t.rank, t.size);
            (cfg.num_heads / t.size, s.local_kv_heads(cfg))
        }
        None => (cfg.num_heads, cfg.num_kv_heads),
    };
    let raw = MIN_LAUNCH_GRID_SIZE_2D / kv_heads.max(1);
    let mut sizes: Vec<usize> = plan
        .iter()
        .filter(|(k, _)| *k == CaptureKind::Full)
        .flat_map(|(_, s)| s.iter().copied())
        .collect();
    sizes.sort_unstable();
    let threshold = sizes
        .iter()
        .copied()
        .min_by_key(|&s| s.abs_diff(raw))
        .unwrap_or(raw);
    rt.set_op("triton_attn.metadata_builder");
    let d = cfg.head_dim.next_power_of_two();
    Ok(vec![
        rt.tensor(
            "triton_attn.softmax_segm_output",
            Category::KvCache,
            &[threshold, heads, SEGMENTS, d],
            DType::F32,
        )?,
        rt.tensor(
            "triton_attn.softmax_segm_max",
            Category::KvCache,
            &[threshold, heads, SEGMENTS],
            DType::F32,
        )?,
        rt.tensor(
            "triton_attn.softmax_segm_expsum",
            Category::KvCache,
            &[threshold, heads, SEGMENTS],
            DType::F32,
        )?,
    ])
}

/// `capture_model` with the KV cache of `kv_blocks` allocated: every size of every mode,
/// each replayed afterwards against its warm-up on a GPU. An out-of-memory stops the capture
/// and is reported in `failed` (the instance would crash there). Then, with the graphs and
/// the KV cache still alive, V1's sampler warm-up where `warm_up` asks for it (vLLM runs it
/// right after `capture_model`: 0.19.0 v1/worker/gpu_worker.py L588, L663-686).
#[allow(clippy::too_many_arguments)]
pub(crate) fn capture(
    rt: &Runtime,
    model: &CausalLm,
    plan: &[(CaptureKind, Vec<usize>)],
    geometry: &KvGeometry,
    kv_dtype: DType,
    kv_blocks: u64,
    others_bytes: u64,
    estimate: Option<Estimate>,
    style: Style,
    warm_up: Option<super::warmup::WarmUpSpec<'_>>,
) -> Result<(GraphReport, Option<super::warmup::SamplerWarmUp>)> {
    let total = rt.snapshot().mem.total;
    rt.graph_prepare()?;
    rt.empty_cache();
    rt.reset_process_peak();
    rt.marker("cudagraph capture");
    let mut report = GraphReport {
        plan: plan.to_vec(),
        graphs: 0,
        ops: 0,
        ops_by_mode: Vec::new(),
        nodes: None,
        pool_bytes: 0,
        exec_bytes: 0,
        exec_measured: rt.backend() == crate::device::Backend::Cuda,
        side_stream_bytes: 0,
        took_bytes: 0,
        process_delta_bytes: 0,
        capture_s: 0.0,
        kv_blocks,
        peak_process_bytes: 0,
        room_left_bytes: 0,
        estimate,
        replay: None,
        failed: None,
    };
    let kv = match geometry.allocate(rt, kv_dtype, kv_blocks, "graphs") {
        Ok(kv) => kv,
        Err(e @ Error::OutOfMemory { .. }) => {
            report.failed = Some(format!("the KV cache itself: {e}"));
            return Ok((report, None));
        }
        Err(e) => return Err(e),
    };
    let _triton_buffers = match style {
        Style::V1 { triton: true } => match triton_segment_buffers(rt, model, plan) {
            Ok(b) => b,
            Err(e @ Error::OutOfMemory { .. }) => {
                report.failed = Some(format!("Triton attention's segment buffers: {e}"));
                return Ok((report, None));
            }
            Err(e) => return Err(e),
        },
        _ => Vec::new(),
    };
    let check = rt.backend() == crate::device::Backend::Cuda;
    let side_before = rt.side_stream_reserved();
    // V0 reads free memory first, then allocates the decode inputs every graph slices, on
    // the default stream, kept for the instance's life (0.6.4.post1 worker/model_runner.py
    // `capture_model`; docs/reading/vllm-v0-graphs.md).
    let mut v0_inputs = Vec::new();
    let v0_start = match style {
        Style::V0 { keys, .. } => {
            rt.synchronize()?;
            let start = free_now(rt);
            let b = plan
                .iter()
                .flat_map(|(_, s)| s.first().copied())
                .max()
                .unwrap_or(1);
            let m = keys.div_ceil(geometry.block_size.max(1) as usize);
            rt.set_op("capture_model.inputs");
            for (name, shape, dtype) in [
                ("graph_inputs.input_tokens", vec![b], DType::I64),
                ("graph_inputs.input_positions", vec![b], DType::I64),
                ("graph_inputs.slot_mapping", vec![b], DType::I64),
                ("graph_inputs.seq_lens", vec![b], DType::I32),
                ("graph_inputs.block_tables", vec![b, m], DType::I32),
            ] {
                match rt.tensor(name, Category::CudaGraph, &shape, dtype) {
                    Ok(t) => v0_inputs.push(t),
                    Err(e @ Error::OutOfMemory { .. }) => {
                        report.failed = Some(format!("the graphs' decode inputs: {e}"));
                        return Ok((report, None));
                    }
                    Err(e) => return Err(e),
                }
            }
            Some(start)
        }
        Style::V1 { .. } => None,
    };
    rt.graph_side_stream(true)?;
    let started = std::time::Instant::now();
    let mut captured = Vec::new();
    let (mut process_before, mut process_after) = (0u64, 0u64);
    let run = (|| {
        let start_free = match v0_start {
            Some(s) => s,
            None => {
                rt.synchronize()?;
                rt.empty_cache();
                free_now(rt)
            }
        };
        process_before = rt.snapshot().process_used;
        for (kind, sizes) in plan {
            for &n in sizes {
                captured.push(warmup_and_capture(
                    rt, model, style, *kind, n, GRAPH_POOL, check,
                )?);
            }
            rt.synchronize()?;
        }
        rt.synchronize()?;
        let took = start_free as i64 - free_now(rt) as i64;
        process_after = rt.snapshot().process_used;
        Ok::<i64, Error>(took)
    })();
    report.capture_s = started.elapsed().as_secs_f64();
    report.side_stream_bytes = rt.side_stream_reserved().saturating_sub(side_before);
    report.pool_bytes = rt.pool_reserved(GRAPH_POOL);
    for c in &captured {
        report.graphs += c.graphs.len() as u64;
        let ops: u64 = c.graphs.iter().map(|g| g.ops as u64).sum();
        match report.ops_by_mode.iter_mut().find(|(k, _)| *k == c.kind) {
            Some((_, n)) => *n += ops,
            None => report.ops_by_mode.push((c.kind, ops)),
        }
        for g in &c.graphs {
            report.ops += g.ops as u64;
            report.exec_bytes += g.exec_bytes;
            if let Some(n) = g.nodes {
                *report.nodes.get_or_insert(0) += n;
            }
        }
    }
    match run {
        Ok(took) => {
            report.took_bytes = took;
            report.process_delta_bytes = process_after as i64 - process_before as i64;
        }
        Err(e @ Error::OutOfMemory { .. }) => report.failed = Some(e.to_string()),
        Err(e) => {
            let _ = rt.graphs_drop(GRAPH_POOL);
            let _ = rt.graph_side_stream(false);
            return Err(e);
        }
    }
    report.peak_process_bytes = rt.process_peak();
    report.room_left_bytes = total as i64 - others_bytes as i64 - report.peak_process_bytes as i64;
    if check && report.failed.is_none() {
        report.replay = Some(replay_check(rt, &captured)?);
    }
    // The sampler's warm-up on the default stream, once `graph_capture()` is left, the graphs
    // and the KV cache alive.
    let mut kv = Some(kv);
    let warmed = match warm_up {
        Some(spec) if report.failed.is_none() => {
            rt.graph_side_stream(false)?;
            rt.marker("cudagraph capture end");
            Some(super::warmup::run(
                rt,
                spec,
                total,
                others_bytes,
                &mut || drop(kv.take()),
            ))
        }
        _ => None,
    };
    rt.graphs_drop(GRAPH_POOL)?;
    rt.graph_side_stream(false)?;
    drop(v0_inputs);
    drop(kv);
    rt.empty_cache();
    if warmed.is_none() {
        rt.marker("cudagraph capture end");
    }
    Ok((report, warmed.transpose()?))
}

/// Replays each capture's graphs and compares the output with the eager warm-up's.
fn replay_check(rt: &Runtime, captured: &[Captured]) -> Result<ReplayCheck> {
    let mut check = ReplayCheck {
        checked: 0,
        worst_rel_l2: 0.0,
        worst: String::new(),
    };
    for c in captured {
        let (Some((ptr, numel, dtype)), Some(eager)) = (c.output, &c.eager) else {
            continue;
        };
        rt.graphs_replay(&c.graphs)?;
        let Some(got) = rt.download_at(ptr, numel, dtype)? else {
            continue;
        };
        let d = if got.len() == eager.len() {
            crate::base::units::relative_l2(&got, eager)
        } else {
            f64::INFINITY
        };
        check.checked += 1;
        // A NaN distance is the worst of all.
        if d.is_nan() || d > check.worst_rel_l2 {
            check.worst_rel_l2 = d;
            check.worst = c.label.clone();
        }
    }
    Ok(check)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FlashAttention 2's splits for Llama-3-8B's decode graphs on 132 SMs at 8192 keys (8 KV
    /// heads, 64 blocks of 128 keys): as the heuristic in flash_api.cpp gives them
    /// (docs/reading/vllm-v0-graphs.md).
    #[test]
    fn fa2_splits_follow_the_heuristic() {
        let at = |batch: usize| fa2_splits(batch * 8, 2 * 132, 8192usize.div_ceil(128));
        let got: Vec<usize> = [1, 2, 4, 8, 16, 24, 32, 256]
            .iter()
            .map(|&b| at(b))
            .collect();
        assert_eq!(got, [32, 16, 7, 4, 2, 4, 1, 1]);
        // FlashAttention 3 under V0 0.8.5: 15 splits at 8192 keys, 14 at 2048 and 4096.
        assert_eq!(fa3_splits(8, 132, 64), 15);
        assert_eq!(fa3_splits(8, 132, 16), 14);
        assert_eq!(fa3_splits(8, 132, 32), 14);
    }
}

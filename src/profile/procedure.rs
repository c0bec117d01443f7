//! The procedure of FORMULAS.md: t0 (instance created), load, empty_cache + reset_peak, t1,
//! N passes, synchronize, t2, empty_cache, t3; then the formulas, the ground truth, and a
//! verify pass per budget.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::formulas::{self, Checkpoint, Checkpoints, KvGeometry};
use super::report::{
    FormulaResult, ModelInfo, PassStats, Report, TopLogits, TrueMax, Truth, Verify, REPORT_FORMAT,
};
use super::request::{ProfileRequest, TRUE_MAX_SERVING_PASSES};
use super::vllm::Release;
use crate::base::error::{Error, Result};
use crate::device::tensor::DType;
use crate::device::{Device, DeviceSpec, OutsideAlloc};
use crate::engine::ops;
use crate::engine::progress::{Phase, Progress, ProgressSink};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::Tensor;
use crate::memory::{Category, Event, EventKind};
use crate::model::batch::Batch;
use crate::model::loader::LoadOptions;
use crate::model::sampler::{self, Sampler};
use crate::model::{self, presets, CausalLm, ModelSource};
use crate::quant::Quant;

/// What runs in each pass.
enum Workload {
    /// vLLM's profile run: the model input, the forward, the logits, and (unless turned off)
    /// the sampler.
    Model {
        model: Box<CausalLm>,
        batch: Batch,
        sampler: Option<Sampler>,
        /// vLLM V1's sampler run and its top-k/top-p (a V1 release), else V0's.
        /// The sampler runs of V1's `_dummy_sampler_run`, in order (0.21 runs two).
        v1: Option<Vec<sampler::V1TopKTopP>>,
        /// A multimodal model's vision tower and encoder profile (Gemma 3).
        encoder: Option<Box<Encoder>>,
    },
    /// vLLM's `test_memory_profiling`: weights of a given size, a spike of activations.
    Synthetic { _weights: Tensor, spike_bytes: u64 },
}

/// A multimodal model's encoder side: the vision tower (absent where the release skips it)
/// and the profile V1's `profile_run` runs with it before the language model's dummy pass
/// (gpu_model_runner.py 0.11 L3325-3403).
struct Encoder {
    vision: Option<Tower>,
    plan: Option<super::multimodal::EncoderPlan>,
    /// Each output is copied into a zero `[budget, hidden]` tensor (0.11 only; `MmProfile`).
    pads_to_budget: bool,
    /// The vision attention's name on this GPU, for the report.
    attention: &'static str,
    /// The text pass reads the runner's `inputs_embeds` buffer even with no encoder
    /// profile (0.10.0, `MmProfile::text_only_at_zero` false).
    embeds_without_plan: bool,
    /// The dummy batch dies once the tower has run, before the text pass (Model Runner V2's
    /// `profile_encoder_cache`, 0.27.1 on); V1 holds it to the end of `profile_run`.
    frees_inputs: bool,
    /// Model Runner V2 profiles no encoder (0.22-0.26, `v2_encodes_nothing`).
    v2_no_profile: bool,
    /// The release's minor version: which of the batch's small fields stay on the host
    /// (`MultiModalFieldConfig(keep_on_cpu=True)`, docs/reading/vllm-mm-towers-v021.md §0.9).
    release_minor: u32,
    /// Encodes in the profile passes only (the verify passes serve text).
    armed: std::cell::Cell<bool>,
    /// The encoder phase's framework peak and what it left allocated, absolute bytes.
    stats: std::cell::Cell<Option<(u64, u64)>>,
}

/// A multimodal model's vision tower and projector.
enum Tower {
    /// Gemma 3's SigLIP tower and projector.
    Siglip(Box<crate::model::models::gemma3_mm::Gemma3Vision>),
    /// Mistral 3's Pixtral tower and projector.
    Pixtral(Box<crate::model::models::mistral3::Mistral3Vision>),
    /// Qwen2.5-VL's window-attention tower and patch merger.
    Qwen25Vl(Box<crate::model::models::qwen2_5_vl::Qwen25Vision>),
    /// LLaVA-NeXT's SigLIP tower, projector and newline.
    LlavaNext(Box<crate::model::models::llava_next::LlavaNextVision>),
    /// Llama 4's vision model and projector.
    Llama4(Box<crate::model::models::llama4_vision::Llama4Vision>),
    /// Kimi-VL's MoonViT tower and projector.
    KimiVl(Box<crate::model::models::kimi_vl::KimiVlVision>),
}

impl Tower {
    fn weight_bytes(&self) -> u64 {
        match self {
            Tower::Siglip(v) => v.weight_bytes(),
            Tower::Pixtral(v) => v.weight_bytes(),
            Tower::Qwen25Vl(v) => v.weight_bytes(),
            Tower::LlavaNext(v) => v.weight_bytes(),
            Tower::Llama4(v) => v.weight_bytes(),
            Tower::KimiVl(v) => v.weight_bytes(),
        }
    }

    /// What the tower itself keeps on the device after a pass (Qwen2.5-VL's rotary tables
    /// in `get_rope_by_thw`'s `lru_cache`, MoonViT's `precomputed_freqs_cis`), rounded as the
    /// allocator rounds it.
    fn held_after_pass(&self) -> u64 {
        match self {
            Tower::Qwen25Vl(v) => v.cached_rope_bytes(),
            Tower::KimiVl(v) => v.cached_rope_bytes(),
            _ => 0,
        }
    }

    /// The runner's batched dummy inputs (the pixel values first), then the tower and the
    /// projector on all of them in one call. The outputs: one tensor of every item's rows
    /// (Gemma 3, Mistral 3), or one a item (LLaVA-NeXT's merged images).
    fn dummy_and_encode(
        &self,
        rt: &Runtime,
        items: usize,
        minor: u32,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        match self {
            Tower::Siglip(v) => {
                let (px, crops) =
                    crate::model::models::gemma3_mm::dummy_pixels(rt, &v.shape, items, v.act)?;
                let out = v.encode(rt, &px, items)?;
                Ok((vec![px, crops], vec![out]))
            }
            Tower::Pixtral(v) => {
                let px = crate::model::models::mistral3::dummy_pixels(
                    rt,
                    &v.shape,
                    items,
                    v.act,
                    v.input_norm.is_some(),
                )?;
                let out = v.encode(rt, &px, items)?;
                Ok((vec![px], vec![out]))
            }
            Tower::Llama4(v) => {
                let inputs = crate::model::models::llama4_vision::dummy_pixels(
                    rt,
                    &v.shape,
                    items,
                    v.act,
                    // `patches_per_image`, `aspect_ratios`: host from 0.29 (mllama4.py 0.29.0
                    // L655-656).
                    minor >= 29,
                )?;
                let out = v.encode(rt, &inputs[0], items * v.shape.dummy_tiles())?;
                Ok((inputs, vec![out]))
            }
            Tower::LlavaNext(v) => {
                // `image_sizes`: host from 0.22 (llava_next.py 0.22.1 L217).
                let (px, sizes) = crate::model::models::llava_next::dummy_pixels(
                    rt,
                    &v.shape,
                    items,
                    v.act,
                    minor >= 22,
                )?;
                let out = v.encode(rt, &px, items)?;
                Ok((std::iter::once(px).chain(sizes).collect(), out))
            }
            Tower::KimiVl(v) => {
                // `image_grid_hws`: host from 0.29 (kimi_vl.py 0.29.0 L257).
                let (inputs, grids) = crate::model::models::kimi_vl::dummy_pixels(
                    rt,
                    &v.shape,
                    items,
                    v.act,
                    minor >= 29,
                )?;
                let out = v.encode(rt, &inputs[0], &grids)?;
                Ok((inputs, vec![out]))
            }
            Tower::Qwen25Vl(v) => {
                let (inputs, grids) = crate::model::models::qwen2_5_vl::dummy_pixels(
                    rt,
                    &v.shape,
                    items,
                    v.profile_item,
                    v.act,
                    v.release,
                )?;
                let out = v.encode(rt, &inputs[0], &grids)?;
                Ok((inputs, vec![out]))
            }
        }
    }
}

impl Encoder {
    /// The dummy images, the tower and projector on all of them in one call, then under
    /// 0.11 each output copied into a new zero tensor `[budget, hidden]` (L3369-3388); the
    /// pixel values and those copies (or, in 0.10.0 and from 0.15, the outputs themselves:
    /// per-image views of the projector's output) stay allocated through the text pass.
    fn run(&self, rt: &Runtime) -> Result<Option<(Vec<Tensor>, Vec<Tensor>)>> {
        let (Some(v), Some(p), true) = (&self.vision, &self.plan, self.armed.get()) else {
            return Ok(None);
        };
        rt.set_layer(None);
        rt.marker("mm encoder");
        let items = p.items as usize;
        let (mut inputs, mut outs) = v.dummy_and_encode(rt, items, self.release_minor)?;
        let per = p.embeds_per_item as usize;
        let hidden = outs[0].cols();
        let mut cache = Vec::with_capacity(items);
        if self.pads_to_budget && (per as u64) < p.budget_tokens {
            rt.set_op("encoder_cache.expand");
            for i in 0..items {
                let mut z = rt.tensor(
                    format!("encoder_cache.{i}"),
                    Category::Activation,
                    &[p.budget_tokens as usize, hidden],
                    outs[0].dtype,
                )?;
                let part = if outs.len() == items {
                    outs[i].part(format!("encoder_output.{i}"), 0, &[per, hidden])
                } else {
                    outs[0].part(
                        format!("encoder_output.{i}"),
                        i * per * hidden,
                        &[per, hidden],
                    )
                };
                ops::copy_into(rt, &mut z, 0, &part)?;
                cache.push(z);
            }
            // The per-image views die with the list they were in: the projector's output.
            drop(outs);
        } else {
            cache.append(&mut outs);
        }
        if self.frees_inputs {
            // The batch's tensors, in the order the dict holds them.
            rt.set_op("mm_dummy_batch");
            for t in inputs.drain(..) {
                drop(t);
            }
        }
        // What the encoder leaves under the text pass: its pixel values, `num_crops` and the
        // cached outputs, as the allocator rounds them. Not the allocator's growth: the
        // pass's first GEMM also makes the cuBLAS and cuBLASLt workspaces, which the text
        // pass would have made without an encoder.
        let s = rt.stats();
        let held = inputs
            .iter()
            .chain(cache.iter())
            .map(|t| crate::memory::allocator::round_size(t.nbytes()))
            .sum::<u64>()
            + v.held_after_pass();
        self.stats.set(Some((s.allocated_peak, held)));
        rt.marker("mm encoder end");
        Ok(Some((inputs, cache)))
    }
}

/// What a pass hands back: the f32 logits of the first sequences (`rows × vocab`) and the
/// sampled tokens (empty on a dry run).
#[derive(Default)]
struct PassOutput {
    logits_head: Vec<f32>,
    vocab: usize,
    sampled: Vec<u32>,
}

/// Rows of logits a pass brings back for the report.
const LOGITS_ROWS: usize = 8;

impl Workload {
    /// One pass as vLLM's `profile_run` makes it (vllm/worker/model_runner.py L1199-1306):
    /// `prepare_model_input`, `execute_model` (forward L1657-1666, `compute_logits` L1691,
    /// `sample` L1701), then the model input goes when the run returns.
    fn forward(&self, rt: &Runtime, want_logits: bool) -> Result<PassOutput> {
        self.forward_batch(rt, None, want_logits)
    }

    /// `forward` on `batch` instead of the profile's (V1's sampler warm-up after the KV cache).
    fn forward_batch(
        &self,
        rt: &Runtime,
        batch: Option<&Batch>,
        want_logits: bool,
    ) -> Result<PassOutput> {
        match self {
            Workload::Model {
                model,
                batch: profile_batch,
                sampler,
                v1,
                encoder,
            } => {
                // V1's profile_run encodes the dummy images first (profile batch only).
                let encoded = match (batch, encoder) {
                    (None, Some(e)) => e.run(rt)?,
                    _ => None,
                };
                let batch = batch.unwrap_or(profile_batch);
                let vocab = model.config().vocab_size;
                let input = sampler::prepare_model_input(rt, batch)?;
                let (hidden, sent) = model.forward_stage(rt, batch)?;
                let mut out = PassOutput {
                    vocab,
                    ..Default::default()
                };
                if rt.pp().is_some_and(|p| !p.is_last()) {
                    // A stage before the last: no logits, no sampler (gpu_model_runner.py
                    // 0.19 L5785-5791: `_dummy_sampler_run` on the last rank only); what it
                    // would send goes when `profile_run` returns.
                    drop(sent);
                    drop(hidden);
                    drop(input);
                    return Ok(out);
                }
                drop(sent);
                if let (Some(s), Some(path)) = (sampler, v1) {
                    // V1's profile_run: `last_hidden_states` and the sampler run on its
                    // `rand_like`; the forward's hidden states stay alive meanwhile.
                    // Model Runner V2 computes the logits on those hidden states themselves.
                    let v2 = path.contains(&sampler::V1TopKTopP::V2Gumbel);
                    let (last, random, logits) = sampler::compute_logits_v1(
                        rt,
                        &hidden,
                        model.logits_head()?,
                        &input.selected_rows,
                        !v2,
                    )?;
                    s.head_rows.set(if want_logits { LOGITS_ROWS } else { 0 });
                    let mut o = Default::default();
                    for p in path {
                        o = match p {
                            sampler::V1TopKTopP::V2Gumbel => {
                                s.forward_v2_dummy(rt, &logits, vocab)?
                            }
                            _ => s.forward_v1(rt, &logits, vocab, *p)?,
                        };
                    }
                    out.logits_head = o.logits_head;
                    out.sampled = o.ids;
                    drop(logits);
                    drop(random);
                    drop(hidden);
                    drop(last);
                    drop(input);
                    // `encoder_cache.clear()` after the sampler, then the dummy inputs as
                    // `profile_run` returns.
                    if let Some((inputs, cache)) = encoded {
                        drop(cache);
                        drop(inputs);
                    }
                    return Ok(out);
                }
                match sampler {
                    Some(s) => {
                        // With tensor parallel only rank 0 gets the logits and samples; the
                        // others return once their shard is sent (model_runner.py
                        // L1691-1695).
                        if let Some(logits) = sampler::compute_logits(
                            rt,
                            &hidden,
                            model.logits_head()?,
                            &input.selected_rows,
                        )? {
                            s.head_rows.set(if want_logits { LOGITS_ROWS } else { 0 });
                            let o = s.forward(rt, &logits, vocab, &input)?;
                            out.logits_head = o.logits_head;
                            out.sampled = o.ids;
                            drop(logits);
                        }
                    }
                    None => {
                        let logits = sampler::logits_f32(
                            rt,
                            &hidden,
                            model.logits_head()?,
                            &input.selected_rows,
                            vocab,
                        )?;
                        if let (true, Some(logits)) = (want_logits, &logits) {
                            if let Some(mut v) = ops::read_f32(rt, logits)? {
                                v.truncate(LOGITS_ROWS * vocab);
                                out.logits_head = v;
                            }
                        }
                        drop(logits);
                    }
                }
                drop(hidden);
                drop(input);
                Ok(out)
            }
            Workload::Synthetic { spike_bytes, .. } => {
                rt.check_cancel()?;
                rt.set_op("activation_spike");
                let spike =
                    rt.reserve_bytes("activation-spike", Category::Activation, *spike_bytes)?;
                drop(spike);
                Ok(PassOutput::default())
            }
        }
    }
}

fn checkpoint(rt: &Runtime, label: &str) -> Checkpoint {
    rt.set_op("checkpoint");
    rt.set_layer(None);
    rt.marker(label);
    let s = rt.snapshot();
    Checkpoint {
        time_us: s.time_us,
        free: s.mem.free,
        total: s.mem.total,
        allocated: s.stats.allocated,
        allocated_peak: s.stats.allocated_peak,
        reserved: s.stats.reserved,
        reserved_peak: s.stats.reserved_peak,
        process_used: s.process_used,
    }
}

fn pass_stats(
    index: u32,
    verify_for: Option<String>,
    start_us: u64,
    end_us: u64,
    events: &[Event],
) -> PassStats {
    let mut s = PassStats {
        index,
        verify_for,
        start_us,
        end_us,
        peak_allocated: 0,
        allocated_bytes: 0,
        freed_bytes: 0,
        quant_state_allocated_bytes: 0,
        quant_state_freed_bytes: 0,
    };
    for e in events {
        s.peak_allocated = s.peak_allocated.max(e.allocated);
        let qs = e.category == Category::QuantState;
        match e.kind {
            EventKind::Alloc => {
                s.allocated_bytes += e.bytes;
                if qs {
                    s.quant_state_allocated_bytes += e.bytes;
                }
            }
            EventKind::Free => {
                s.freed_bytes += e.bytes;
                if qs {
                    s.quant_state_freed_bytes += e.bytes;
                }
            }
            _ => {}
        }
    }
    s
}

/// Runs one forward pass and returns its statistics and output.
fn one_pass(
    rt: &Runtime,
    work: &Workload,
    index: u32,
    verify_for: Option<String>,
    want_logits: bool,
) -> Result<(PassStats, PassOutput)> {
    rt.set_pass(index);
    rt.set_op("pass");
    rt.set_layer(None);
    rt.marker(&match &verify_for {
        None => format!("pass {index}"),
        Some(f) => format!("verify {f}"),
    });
    let from = rt.event_count();
    let start = rt.elapsed_us();
    let logits = work.forward(rt, want_logits)?;
    rt.synchronize()?;
    let end = rt.elapsed_us();
    let stats = rt.events_since(from, |ev| pass_stats(index, verify_for, start, end, ev));
    Ok((stats, logits))
}

fn top_logits(values: &[f32], vocab: usize, k: usize) -> Vec<TopLogits> {
    values
        .chunks_exact(vocab)
        .enumerate()
        .take(8)
        .map(|(sequence, row)| {
            let mut idx: Vec<usize> = (0..vocab).collect();
            idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            TopLogits {
                sequence,
                top: idx
                    .into_iter()
                    .take(k)
                    .map(|i| (i as u32, row[i]))
                    .collect(),
            }
        })
        .collect()
}

/// Allocates the KV cache a budget grants (`blocks` whole blocks, as one tensor), then runs one
/// more max-batch pass, as the engine would after `determine_num_available_blocks`. vLLM sets
/// no cap on itself: an instance whose peak outgrows floor(T·u) breaks the promise of
/// `gpu_memory_utilization` ("over budget by"), and it only fails when the device itself (with
/// the other processes' memory on it) runs out ("OOM"). Both are reported, apart.
#[allow(clippy::too_many_arguments)]
fn verify(
    rt: &Runtime,
    work: &Workload,
    geometry: &KvGeometry,
    kv_dtype: DType,
    kv_bytes: i64,
    budget: u64,
    others_bytes: u64,
    index: u32,
    label: &str,
    serving_passes: u32,
) -> Result<(Verify, Option<PassStats>)> {
    let blocks = geometry.blocks(kv_bytes);
    if blocks == 0 {
        return Ok((
            Verify {
                ran: false,
                kv_allocated_bytes: 0,
                kv_padding_bytes: 0,
                peak_process_bytes: 0,
                budget_bytes: budget,
                within_budget: false,
                overrun_bytes: -kv_bytes,
                oom: false,
                cache_releases: 0,
                device_room_left_bytes: 0,
                message: "no memory left for KV cache blocks".into(),
            },
            None,
        ));
    }
    rt.empty_cache();
    rt.reset_process_peak();
    rt.set_pass(index);
    rt.set_op("kv_cache");
    rt.set_layer(None);
    let kv_allocated = blocks * geometry.block_bytes();
    let retries_before = rt.stats().alloc_retries;
    let total = rt.snapshot().mem.total;
    // vLLM's CacheEngine allocates one tensor per layer (cache_engine.py
    // `_allocate_kv_cache`: `torch.zeros(kv_cache_shape, dtype)` per layer, shape
    // [2, blocks, block_size, kv_heads, head_dim]; fp8 caches as torch.uint8), each in whole
    // segments.
    // V1's hybrid manager allocates one tensor per layer of a group, shared by a layer of
    // every group (kv_cache_utils.py L1119-1144 at 0.19.0): the same bytes in fewer tensors.
    let layers = geometry.tensors().max(1);
    let shape = geometry.tensor_shape(blocks);
    debug_assert_eq!(
        shape.iter().product::<usize>() as u64 * kv_dtype.size_bytes(),
        kv_allocated / layers
    );
    let mut kv = Vec::with_capacity(layers as usize);
    let mut result = Ok(None);
    for l in 0..layers {
        match rt.reserve(
            format!("kv-cache[{label}].layer{l}"),
            Category::KvCache,
            &shape,
            kv_dtype,
        ) {
            Ok(t) => kv.push(t),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    for _ in 0..serving_passes.max(1) {
        if result.is_ok() {
            result = one_pass(rt, work, index, Some(label.to_string()), false).map(Some);
        }
    }
    drop(kv);
    if let Some((world_rank, world)) = rt.world() {
        // A rank out of memory stops this verify pass on every rank (the others would wait
        // in its collectives); all meet again before the next one. With pipeline parallel
        // the stage's tensor-parallel group meets first, then every rank.
        let stage_tp = rt.tp().filter(|_| rt.pp().is_some());
        if let Err(e @ Error::OutOfMemory { .. }) = &result {
            if let Some(t) = &stage_tp {
                t.group.abort_step(t.rank, &e.to_string());
            }
            world.abort_step(world_rank, &e.to_string());
        }
        let mut peer = None;
        if let Some(t) = &stage_tp {
            peer = t.group.recover()?;
        }
        let peer = world.recover()?.or(peer);
        if let (Ok(_), Some((rank, why))) = (&result, peer) {
            result = Err(Error::PeerStopped { rank, why });
        }
    }
    let peak = rt.process_peak();
    let releases = rt.stats().alloc_retries - retries_before;
    rt.empty_cache();
    let (oom, stats) = match result {
        Ok(r) => (None, r.map(|(stats, _)| stats)),
        Err(e @ (Error::OutOfMemory { .. } | Error::PeerStopped { .. })) => (Some(e), None),
        Err(e) => return Err(e),
    };
    let overrun = peak as i64 - budget as i64;
    let within = oom.is_none() && overrun <= 0;
    let room = total as i64 - others_bytes as i64 - peak as i64;
    let released = if releases > 0 {
        format!(" (the allocator gave its cached segments back {releases}×)")
    } else {
        String::new()
    };
    let message = match &oom {
        Some(e) => format!("OOM: {e}{released}"),
        None if within => format!(
            "fits: peak {} is {} under floor(T·u) = {}; {} of the device left",
            crate::base::units::fmt_u(peak),
            crate::base::units::fmt_i(-overrun),
            crate::base::units::fmt_u(budget),
            crate::base::units::fmt_i(room)
        ),
        None => format!(
            "over budget by {}: peak {} > floor(T·u) = {}, but no OOM ({} of the device left){released}",
            crate::base::units::fmt_i(overrun),
            crate::base::units::fmt_u(peak),
            crate::base::units::fmt_u(budget),
            crate::base::units::fmt_i(room)
        ),
    };
    Ok((
        Verify {
            ran: true,
            kv_allocated_bytes: kv_allocated,
            kv_padding_bytes: 0,
            peak_process_bytes: peak,
            budget_bytes: budget,
            within_budget: within,
            overrun_bytes: overrun,
            oom: oom.is_some(),
            cache_releases: releases,
            device_room_left_bytes: room,
            message,
        },
        stats,
    ))
}

/// This rank of a parallel instance: its index in its tensor-parallel group (of `size`, 1
/// without tensor parallel), where that group meets, and its pipeline stage.
pub(crate) struct RankSpec {
    pub rank: usize,
    pub size: usize,
    pub group: Arc<crate::device::group::RankGroup>,
    pub pp: Option<crate::device::group::PpStage>,
    /// Where the MoE layers sit with data or expert parallel.
    pub moe: Option<crate::device::group::MoeGroup>,
    /// The communicators vLLM makes after the tensor-parallel group's, in
    /// `initialize_model_parallel`'s order (pipeline, data parallel, expert parallel), each
    /// with the network between its hosts when its ranks span several.
    pub comms: Vec<GroupComm>,
}

/// One process group's PyNcclCommunicator beyond the tensor-parallel one.
#[derive(Clone, Debug)]
pub(crate) struct GroupComm {
    pub label: &'static str,
    pub across: Option<crate::device::nccl_model::Network>,
}

impl RankSpec {
    /// This rank among every rank of the instance (its GPU's offset from the first).
    fn world_rank(&self) -> usize {
        self.pp.as_ref().map_or(self.rank, |p| p.world_rank)
    }
}

/// What vLLM refuses of a request on the model's own length, in vLLM's words
/// (`_get_and_verify_max_len`, vllm/config.py), and a default batch vramscope cannot take,
/// said as the config's doing, not as a flag the user never gave.
fn check_against_model(req: &ProfileRequest, max_positions: usize) -> Result<()> {
    let allow_long = std::env::var("VLLM_ALLOW_LONG_MAX_MODEL_LEN").is_ok_and(|v| v == "1");
    if req.max_model_len != 0
        && max_positions > 0
        && req.max_model_len > max_positions as u64
        && !allow_long
    {
        return Err(Error::Request(format!(
            "--max-model-len {}: vLLM refuses it: \"User-specified max_model_len ({}) is greater than the derived max_model_len (max_position_embeddings={max_positions} in model's config.json). This may lead to incorrect model outputs or CUDA errors. To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1\"",
            req.max_model_len, req.max_model_len
        )));
    }
    // The default batch follows the model's length: too large a one is the config's doing.
    let resolved = req.resolved(max_positions);
    let limit = crate::base::limits::MAX_TOKENS;
    if req.tokens == 0 && resolved.tokens as u64 > limit {
        let from = if req.max_model_len == 0 {
            format!("the model's max_position_embeddings ({max_positions})")
        } else {
            format!("--max-model-len {}", req.max_model_len)
        };
        return Err(Error::Request(format!(
            "vLLM's default batch here is max(max_model_len, 2048) = {} tokens, with max_model_len from {from} and chunked prefill off; that is above the {limit} tokens vramscope profiles: give --max-num-batched-tokens, a smaller --max-model-len, or --enable-chunked-prefill true",
            resolved.tokens
        )));
    }
    Ok(())
}

/// A checkpoint stored as bitsandbytes 4-bit loads as stored whatever `--quant` says (as
/// vLLM loads it): a `--quant` naming another quantization would be reported for weights
/// that are not in it, so it is refused.
fn check_quant_matches_checkpoint(req: &ProfileRequest, o: &model::OpenedModel) -> Result<()> {
    let stored = o
        .config
        .tensor_shapes()
        .into_iter()
        .find_map(|(name, _)| o.source.bnb4(&name).map(|m| (name, m.quant_type)));
    let Some((name, ty)) = stored else {
        return Ok(());
    };
    let as_stored = match ty {
        crate::quant::bnb4::Bnb4Type::Nf4 => Quant::Nf4,
        crate::quant::bnb4::Bnb4Type::Fp4 => Quant::Fp4,
    };
    if matches!(req.quant, Quant::Int8 | Quant::Nf4 | Quant::Fp4) && req.quant != as_stored {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "the checkpoint stores its weights as bitsandbytes 4-bit {} (tensor {name}); they load as stored, so --quant {} would be reported for weights that are not {}: use --quant {}",
                ty.name(),
                req.quant,
                req.quant,
                as_stored
            ),
        ));
    }
    Ok(())
}

/// A pre-quantized fp8 checkpoint: vLLM takes `Fp8Config` from its `quantization_config`
/// whatever else it is told, so the run is an fp8 run (`check_fp8` then applies: the GPU,
/// the release, the model), in the checkpoint's dtype. `--quant` may be left at its default
/// (fp16) or say fp8, or bf16 for a bf16 checkpoint; any other is refused, as are
/// tensor-parallel runs (the fp8 shards' cut is not modelled) and checkpoints that store
/// qkv_proj and gate_up_proj fused (Phi-3: one scale for three shards).
fn stored_fp8_request(
    req: &ProfileRequest,
    o: &model::OpenedModel,
) -> Result<Option<ProfileRequest>> {
    let Some(f) = o.source.stored_fp8() else {
        return Ok(None);
    };
    let dtype = if f.dtype == crate::engine::tensor::DType::BF16 {
        "bfloat16"
    } else {
        "float16"
    };
    if f.int8 {
        return stored_int8_request(req, o, f.dtype).map(Some);
    }
    let why = match req.quant {
        Quant::F16 | Quant::Fp8 => None,
        Quant::BF16 if dtype == "bfloat16" => None,
        Quant::BF16 => Some(format!(
            "its activations run in the checkpoint's {dtype}, not bf16"
        )),
        other => Some(format!(
            "its linear layers load as stored (fp8), not as {other}"
        )),
    };
    if let Some(why) = why {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "--quant {} with a pre-quantized fp8 checkpoint: {why}; leave --quant out or say --quant fp8",
                req.quant
            ),
        ));
    }
    // Block-wise fp8 under the V1 releases shards by whole blocks (dry;
    // `Loader::fp8_block_stored` checks them as `validate_fp8_block_shape` does, and refuses
    // reading values of a shard).
    let v1_block = o.source.stored_fp8().is_some_and(|f| f.block.is_some())
        && matches!(req.release()?.engine, super::vllm::Engine::V1 { .. });
    if req.tp > 1 && !v1_block {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "--tp {} with a pre-quantized fp8 checkpoint: cutting its fp8 weights and per-shard scales across ranks is not modelled yet; use --tp 1",
                req.tp
            ),
        ));
    }
    if o.config.fused_checkpoint() {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "a pre-quantized fp8 checkpoint of model_type '{}' stores qkv_proj and gate_up_proj fused (one weight_scale for the shards, vLLM's unfused_module_in_checkpoint case): not read yet",
                o.config.arch
            ),
        ));
    }
    Ok(Some(ProfileRequest {
        quant: Quant::Fp8,
        ..req.clone()
    }))
}

/// A compressed-tensors int8 w8a8 checkpoint (`format: int-quantized`): vLLM's
/// CompressedTensorsW8A8Int8 through `CutlassScaledMMLinearKernel`, the only CUDA kernel in
/// `_POSSIBLE_KERNELS` (0.11.0 kernels/scaled_mm/__init__.py L22-27; 0.15.1 and 0.19.0
/// kernels/.../scaled_mm the same), compute capability 7.5 or more
/// (`get_min_capability`, compressed_tensors_w8a8_int8.py L32-34 at 0.11.0). The run is in
/// the checkpoint's dtype (its label: fp16 or bf16, as for AWQ/GPTQ); V1 releases only
/// (as the fp8 scheme), one GPU, Llama-family layers stored apart. Dry and CPU compute;
/// the loader refuses CUDA by name.
fn stored_int8_request(
    req: &ProfileRequest,
    o: &model::OpenedModel,
    dtype: crate::engine::tensor::DType,
) -> Result<ProfileRequest> {
    let quant = if dtype == crate::engine::tensor::DType::BF16 {
        Quant::BF16
    } else {
        Quant::F16
    };
    let refuse = |why: String| Err(Error::model(o.source.origin(), why));
    if !matches!(req.quant, Quant::F16) && req.quant != quant {
        return refuse(format!(
            "--quant {} with a compressed-tensors int8 w8a8 checkpoint: its linear layers load as stored (int8) and its activations run in the checkpoint's {}; leave --quant out",
            req.quant, quant
        ));
    }
    let release = req.release()?;
    if !matches!(release.engine, super::vllm::Engine::V1 { .. })
        || crate::quant::marlin::Era::of_release(release.name).is_none()
    {
        return refuse(format!(
            "a compressed-tensors int8 w8a8 checkpoint is modelled under the V1 releases (0.11, 0.15, 0.19, 0.21; CUTLASS int8 scaled_mm with per-token activations), not --vllm {}",
            release.name
        ));
    }
    if req.tp > 1 {
        return refuse(format!(
            "--tp {} with a compressed-tensors int8 w8a8 checkpoint: cutting its int8 weights and channel scales across ranks is not modelled yet; use --tp 1",
            req.tp
        ));
    }
    if o.config.fused_checkpoint() {
        return refuse(format!(
            "a compressed-tensors int8 w8a8 checkpoint of model_type '{}' stores qkv_proj and gate_up_proj fused: not read yet",
            o.config.arch
        ));
    }
    if let DeviceSpec::Sim { preset, .. } = &req.device {
        if let Some(p) = crate::device::presets::find(preset) {
            if matches!(p.arch, "Volta" | "Pascal") {
                return Err(Error::Request(format!(
                    "a compressed-tensors int8 w8a8 checkpoint on {} ({}): vLLM's CompressedTensorsW8A8Int8 needs compute capability 7.5 (get_min_capability, compressed_tensors_w8a8_int8.py L32-34 at 0.11.0)",
                    p.name, p.arch
                )));
            }
        }
    }
    check_fp8_model(o)?;
    Ok(ProfileRequest {
        quant,
        ..req.clone()
    })
}

/// gpt-oss with expert or data parallel (docs/reading/vllm-gpt-oss-ep.md): refused in one
/// line that says what the release does. 0.11 and 0.15 fail on Hopper: their MXFP4 Triton
/// kernel (the backend there) ignores the expert map (0.11.0 gpt_oss_triton_kernels_moe.py
/// L72-167, 0.15.1 L81-115; fixed by vLLM PR #34270 in 0.19), and 0.11's loader cuts experts by TP rank alone while the layer
/// makes `I / (D·T)` with data parallel (gpt_oss.py 0.11.0 L313-326). From 0.19 vLLM runs them
/// (whole experts per rank; the monolithic Triton kernel with the expert map on one replica,
/// `OAITritonExperts` behind the naive dispatch with several), not modelled yet.
fn check_gpt_oss_parallel(
    req: &ProfileRequest,
    release: &super::vllm::Release,
    device_major: u32,
) -> Result<()> {
    let (tp, dp) = (req.tp.max(1), req.dp.max(1));
    let ep = req.enable_expert_parallel && tp * dp > 1;
    if !ep && dp == 1 {
        return Ok(());
    }
    let what = match (ep, dp > 1) {
        (true, false) => format!("--enable-expert-parallel over {tp} GPUs"),
        (true, true) => format!("--enable-expert-parallel with --data-parallel-size {dp}"),
        _ => format!("--data-parallel-size {dp}"),
    };
    let minor = release.minor().unwrap_or(0);
    let crash = match (minor, ep) {
        (11 | 15, true) if device_major == 9 => Some(
            "its MXFP4 Triton kernel routes the global expert ids into each rank's experts and ignores the expert map (an illegal memory access, vLLM PR #34270, fixed in 0.19; 0.11 runs Triton on Hopper where triton_kernels is installed beside it, as vramscope's 0.11 row assumes, else Marlin)",
        ),
        (11, false) => Some(
            "its loader cuts the experts by tensor-parallel rank alone while the layer is made for I / (D·T) (a size mismatch at load, fixed in 0.14.1)",
        ),
        _ => None,
    };
    // Modelled: expert parallel over one replica's ranks on Hopper from 0.19, the monolithic
    // Triton kernel with the expert map (docs/reading/vllm-gpt-oss-ep.md §4.1; the loader
    // names what it does not take: 16-bit experts, expert counts the ranks do not divide).
    if crash.is_none() && ep && dp == 1 && minor >= 19 && device_major == 9 {
        return Ok(());
    }
    Err(Error::Request(match crash {
        Some(why) => format!(
            "gpt_oss with {what}: vLLM {} fails here: {why}",
            release.name
        ),
        None if device_major == 9 => format!(
            "gpt_oss with {what} under vLLM {}: data parallel (OAITritonExperts behind the naive dispatch, docs/reading/vllm-gpt-oss-ep.md §4.2-4.3) is not modelled yet; tensor parallel, and expert parallel within one replica on Hopper from 0.19, are",
            release.name
        ),
        None => format!(
            "gpt_oss with {what} under vLLM {}: whole experts per rank on this GPU (Marlin's or TRT-LLM's experts behind an expert map: docs/reading/vllm-gpt-oss-ep.md §4.5) are not modelled yet; tensor parallel is, and expert parallel on Hopper from 0.19",
            release.name
        ),
    }))
}

/// `--dtype float32` is modelled for the dense text families whose pass has no step that
/// depends on the activation dtype beyond its size: where vLLM upcasts to f32 (Gemma's norms,
/// the towers' `forward_native` norms, MoE routing, MLA, the state layers), an f32 model
/// skips copies that vramscope's 16-bit sequence makes.
fn check_float32_family(cfg: &crate::model::config::ModelConfig) -> Result<()> {
    let family = [
        (cfg.moe.is_some(), "mixture of experts"),
        (cfg.deepseek.is_some(), "MLA"),
        (cfg.gpt_oss.is_some(), "gpt-oss"),
        (cfg.llama4.is_some(), "Llama 4"),
        (cfg.qwen3_next.is_some(), "Qwen3-Next"),
        (cfg.gemma.is_some(), "Gemma"),
        (cfg.phi.is_some(), "Phi"),
        (
            cfg.gemma3_mm.is_some()
                || cfg.mistral3.is_some()
                || cfg.qwen2_5_vl.is_some()
                || cfg.llava_next.is_some()
                || cfg.kimi_vl.is_some(),
            "a multimodal model",
        ),
    ]
    .into_iter()
    .find_map(|(is, name)| is.then_some(name));
    match family {
        None => Ok(()),
        Some(name) => Err(Error::Request(format!(
            "--dtype float32 with {name} ({}): float32 is modelled for dense text models \
             (Llama, Mistral, Qwen2/3, Granite, OPT); use --dtype auto, float16 or bfloat16",
            cfg.arch
        ))),
    }
}

/// What `--quant fp8` is reproduced for: CUTLASS's w8a8 path (a GPU of compute capability
/// 8.9 or more: a simulated one's preset is checked here, a CUDA device's own capability when
/// it quantizes), vLLM 0.6.3 to 0.6.5, Llama-family models without a qkv bias. Each refusal
/// says which and why.
fn check_fp8(req: &ProfileRequest, o: &model::OpenedModel) -> Result<()> {
    if req.quant != Quant::Fp8 {
        return Ok(());
    }
    if let Some(block) = o.source.stored_fp8().and_then(|f| f.block) {
        let gpu = check_fp8_block(req, o, block)?;
        return check_fp8_block_model(req, o, gpu);
    }
    let release = req.release()?;
    let v1 = matches!(release.engine, super::vllm::Engine::V1 { .. });
    if o.source.stored_fp8().is_some_and(|f| f.compressed_tensors) && !v1 {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "a compressed-tensors fp8 checkpoint is modelled under the V1 releases (0.11, 0.15, 0.19, 0.21; per-token activations), not --vllm {}",
                release.name
            ),
        ));
    }
    if o.source.stored_fp8().is_some_and(|f| f.modelopt) {
        // ModelOptFp8LinearMethod read in 0.11.0, 0.15.1 and 0.19.0 only.
        if !matches!(release.name, "0.11" | "0.15" | "0.19") {
            return Err(Error::model(
                o.source.origin(),
                format!(
                    "a ModelOpt FP8 checkpoint is modelled as vLLM 0.11, 0.15 and 0.19 run it (ModelOptFp8LinearMethod), not --vllm {}",
                    release.name
                ),
            ));
        }
        if let DeviceSpec::Sim { preset, .. } = &req.device {
            if let Some(p) = crate::device::presets::find(preset) {
                if !matches!(p.arch, "Ada" | "Hopper" | "Blackwell") {
                    return Err(Error::Request(format!(
                        "a ModelOpt FP8 checkpoint on {} ({}): vLLM refuses it below compute capability 8.9 (ModelOptFp8Config.get_min_capability, 0.19.0 modelopt.py L408-409); use an Ada, Hopper or Blackwell preset",
                        p.name, p.arch
                    )));
                }
            }
        }
    }
    match &req.device {
        DeviceSpec::Cuda { .. } => {}
        DeviceSpec::Sim { preset, .. } => {
            if let Some(p) = crate::device::presets::find(preset) {
                crate::quant::fp8::check_gpu(p.arch, p.name)?;
            }
        }
    }
    crate::quant::fp8::check_release(release.name, v1)?;
    if o.config.moe.is_some() {
        return check_fp8_moe(req, o, release.name);
    }
    check_fp8_model(o)
}

/// What online fp8 experts (`--quant fp8` on a 16-bit MoE checkpoint) are reproduced for:
/// vLLM 0.19.0's `Fp8OnlineMoEMethod` (each expert quantized per tensor as its layer loads,
/// fp8.py L922-1043) under `TritonExperts`, which 0.19.0's oracle picks for per-tensor
/// weights with dynamic per-tensor activations on compute capability 8.9 and above
/// (`ops_moe_fp8`), on a simulated device, for Mixtral and Qwen3-MoE. Each refusal names the
/// case and why.
fn check_fp8_moe(req: &ProfileRequest, o: &model::OpenedModel, release: &str) -> Result<()> {
    let c = &o.config;
    let why = if o.source.stored_fp8().is_some() {
        Some("a pre-quantized per-tensor fp8 MoE checkpoint (Fp8MoEMethod's stored w13/w2 weight_scale, w1 and w3 requantized at their max by process_fp8_weight_tensor_strategy_moe, 0.19.0 fp8.py L790-833) is not modelled yet; online --quant fp8 on the 16-bit checkpoint is".to_string())
    } else if release == "0.11" {
        Some("vLLM 0.11.0 quantizes the experts only after the whole 16-bit model has loaded (Fp8MoEMethod.process_weights_after_loading, fp8.py L673-700) and runs the in-place fused_experts over them; not modelled yet: use --vllm 0.19".to_string())
    } else if release == "0.15" {
        Some("vLLM 0.15.1's Fp8OnlineMoEMethod (fp8.py L1047-1180) loads through a patched weight loader and its modular kernel chunks activations (VLLM_FUSED_MOE_CHUNK_SIZE); not checked yet: use --vllm 0.19".to_string())
    } else if req.release()?.minor().is_none_or(|m| m < 19) {
        Some(format!("online fp8 experts are modelled as vLLM 0.19.0 to 0.33.0 run them (Fp8OnlineMoEMethod, TritonExperts), not --vllm {release}"))
    } else if req.dp > 1 {
        Some(format!("with {} data-parallel replicas the experts take the batched activation format, whose fp8 path is not read; tensor and expert parallel over one replica are modelled", req.dp))
    } else if matches!(req.device, DeviceSpec::Cuda { .. }) {
        Some("online fp8 experts have no CUDA kernels here yet; use a simulated device (sim:PRESET, :dry for any size)".to_string())
    } else if !matches!(c.arch.as_str(), "mixtral" | "qwen3_moe") {
        Some(match c.arch.as_str() {
            "qwen2_moe" => "Qwen2-MoE's shared expert runs inside 0.19's modular fused MoE (refused for 16-bit experts too) and its shared_expert linears would be fp8; not modelled yet".to_string(),
            _ => "its fp8 experts are not modelled yet (online fp8 experts are, for Mixtral and Qwen3-MoE under --vllm 0.19)".to_string(),
        })
    } else {
        None
    };
    match why {
        Some(w) => Err(Error::model(
            o.source.origin(),
            format!("--quant fp8 with model_type '{}': {w}", c.arch),
        )),
        None => Ok(()),
    }
}

/// What a block-wise fp8 checkpoint is reproduced for: the release's `fp8_block` era (vLLM
/// 0.8.5, 0.11.0, 0.15.1, 0.19.0) on a simulated Hopper (CUTLASS's blockwise GEMM) or Ada
/// (Triton's) GPU, with the kv-cache in the model's dtype, its shapes as
/// `fp8_block::model_problem` allows them on that GPU. A CUDA device is refused: the GPU
/// kernels are not written yet.
fn check_fp8_block(
    req: &ProfileRequest,
    o: &model::OpenedModel,
    block: crate::quant::fp8_block::BlockSize,
) -> Result<(bool, crate::quant::fp8_block::Fp8BlockEra)> {
    use crate::quant::fp8_block;
    let hopper = fp8_block_hopper(req)?;
    let release = req.release()?;
    let era = fp8_block::check_release(release.fp8_block, release.name, &req.vllm)?;
    if era.deep_gemm() && !hopper {
        return Err(Error::Request(format!(
            "block-wise fp8 with --vllm {} off Hopper: from 0.21 the linear kernel is chosen among DeepGEMM, CUTLASS, Marlin and Triton by each one's support for the GPU (kernels/linear/__init__.py `_POSSIBLE_FP8_BLOCK_KERNELS`), read for Hopper only (docs/reading/vllm-fp8-block-deepgemm.md); use a Hopper preset (h100-80gb, h200-141gb) or --vllm 0.19",
            req.vllm
        )));
    }
    if req.kv_cache_dtype != super::request::KvCacheDtype::Auto {
        return Err(Error::Request(format!(
            "--kv-cache-dtype {} with a block-wise fp8 checkpoint: Fp8KVCacheMethod's handling of stored or unit k/v scales for an fp8 cache is not modelled yet; leave it auto",
            req.kv_cache_dtype.name()
        )));
    }
    match fp8_block::model_problem(block, &o.config.decoder_linears(), (hopper, era)) {
        Some(p) => Err(Error::model(o.source.origin(), p)),
        None => Ok((hopper, era)),
    }
}

/// The models block-wise fp8 is reproduced for: `check_fp8_model`'s, and experts under the V1
/// releases on Hopper where Triton runs them (0.11.0's `fused_experts_impl`; from 0.19 the fp8
/// oracle puts TRITON first on Hopper for block fp8 without expert parallel,
/// fused_moe/oracle/fp8.py 0.19.0 L85-95, 0.21.0 L90-100, 0.33.0 L122-132, under 0.21's runner
/// from 0.21: docs/reading/vllm-fp8-block-moe-v021.md) for Mixtral, Qwen3-MoE with its routers
/// kept 16-bit, and DeepSeek-V2/V3 and Kimi-K2 (whose routers vLLM never quantizes). FlashInfer's
/// CUTLASS experts, which 0.15.1 runs on Hopper and 0.19 on runs with expert parallel, are
/// refused by name.
fn check_fp8_block_model(
    req: &ProfileRequest,
    o: &model::OpenedModel,
    (hopper, era): (bool, crate::quant::fp8_block::Fp8BlockEra),
) -> Result<()> {
    let c = &o.config;
    let release = req.release()?;
    if let (Some(_), true) = (c.moe.as_ref(), hopper) {
        let refuse = |w: String| {
            Err(Error::model(
                o.source.origin(),
                format!(
                    "block-wise fp8 experts with model_type '{}' under vLLM {} on Hopper: {w}",
                    c.arch, release.name
                ),
            ))
        };
        let ep = req.enable_expert_parallel && req.tp.max(1) * req.dp.max(1) > 1;
        if release.name == "0.15" {
            return refuse("the release runs FlashInfer's CUTLASS MoE for them (0.15.1 oracle/fp8.py L145-156 lists FLASHINFER_CUTLASS before TRITON and L308-330 takes the first supported; flashinfer_cutlass_moe.py L128-132 supports block fp8 on compute capability 9.0; flashinfer-python 0.6.1 is a dependency of the wheel), whose workspace FlashInfer's C++ op sizes and is not modelled; use --vllm 0.11, 0.19 or later".into());
        }
        // With expert parallel the fp8 oracle moves FlashInfer's CUTLASS MoE to the front
        // (oracle/fp8.py 0.19.0 L92-93, 0.21.0 L97-98): modelled under 0.21's runner
        // (docs/reading/vllm-flashinfer-cutlass-moe.md §9), with data parallel behind the
        // naive dispatch, the gathered tokens in one call (vllm-flashinfer-moe-dp.md).
        if ep && release.name == "0.19" {
            return refuse(format!("with expert parallel over {} ranks the fp8 oracle moves FlashInfer's CUTLASS MoE to the front (oracle/fp8.py 0.19.0 L92-93, 0.21.0 L97-98); it is modelled under 0.21's runner (--vllm 0.21 to 0.33), not 0.19's; without --enable-expert-parallel Triton runs them and is", req.tp.max(1) * req.dp.max(1)));
        }
        // 0.29.0 on: `refine_fp8_moe_block_shape` re-blocks the scales of a rank's width the
        // checkpoint's blocks do not divide (`Loader::experts_fp8_block`); 0.21 to 0.28 refuse
        // that split at load, as the loader says.
    }
    let Some(_) = c.moe.as_ref() else {
        return check_fp8_model(o);
    };
    let bad = |w: String| {
        Err(Error::model(
            o.source.origin(),
            format!("block-wise fp8 with model_type '{}': {w}", c.arch),
        ))
    };
    if era == crate::quant::fp8_block::Fp8BlockEra::V0_8 {
        return bad("its fp8 experts are modelled under the V1 releases (--vllm 0.11, 0.19 and later on Hopper), not 0.8.5".into());
    }
    // Off Hopper, 0.11.0 runs the same Triton `fused_experts` (fp8.py L1069-1083): Marlin only
    // below capability 8.9 (L447-449), DeepGEMM not installed (L454-463), CUTLASS's
    // block-scaled grouped GEMM on capability 10.0 only (L469-478), FlashInfer only when
    // VLLM_USE_FLASHINFER_MOE_FP8 is set (L440-443); no Ada file among its tuned configs, so
    // `get_default_config`'s BLOCK_SIZE_M 64. 0.15.1 and 0.19.0 pick through their oracle
    // (fused_moe/oracle/fp8.py), whose order off Hopper is not checked here.
    if !hopper && era != crate::quant::fp8_block::Fp8BlockEra::V0_11 {
        return bad("fp8 experts off Hopper are modelled under --vllm 0.11 only (0.15.1's and 0.19.0's fused-MoE oracle, fused_moe/oracle/fp8.py, tries FlashInfer CUTLASS and vLLM's CUTLASS before Triton there, not checked); use --vllm 0.11 or a Hopper preset (h100-80gb, h200-141gb)".into());
    }
    match c.arch.as_str() {
        "mixtral" | "deepseek_v2" | "deepseek_v3" | "kimi_k2" => Ok(()),
        "qwen3_moe" if o.source.stored_fp8().is_some_and(|f| f.routers_unquantized) => Ok(()),
        "qwen3_moe" => bad("vLLM makes the router (mlp.gate) an fp8 layer too unless quantization_config.modules_to_not_convert (or ignored_layers) names every layer's mlp.gate, as Qwen's published FP8 MoE configs do (qwen3_moe.py L176-182 at 0.19.0 passes quant_config); an fp8 router is not modelled".into()),
        _ => bad("its fp8 experts are not modelled yet (Mixtral, Qwen3-MoE and DeepSeek-V2/V3/Kimi-K2 are)".into()),
    }
}

/// Whether a block-wise fp8 checkpoint runs on Hopper (CUTLASS) here: the simulated GPU's
/// preset, checked to be one that runs it (`fp8_block::check_gpu`); a CUDA device refused.
fn fp8_block_hopper(req: &ProfileRequest) -> Result<bool> {
    use crate::quant::fp8_block;
    match &req.device {
        DeviceSpec::Cuda { .. } => Err(fp8_block::cuda_refused()),
        DeviceSpec::Sim { preset, .. } => match crate::device::presets::find(preset) {
            Some(p) => {
                fp8_block::check_gpu(p.arch, p.name)?;
                Ok(p.arch == "Hopper")
            }
            None => Ok(false),
        },
    }
}

/// The models fp8 is reproduced for: Llama-family without biases in the linear layers.
fn check_fp8_model(o: &model::OpenedModel) -> Result<()> {
    let c = &o.config;
    let why = if c.arch == "opt" {
        Some("OPT's linear layers carry biases that CUTLASS adds in its epilogue, not modelled yet")
    } else if c.moe.is_some() {
        Some("fp8 experts (Fp8MoEMethod's weights, scales and fused-MoE kernels) are not modelled yet")
    } else if c.attention_bias {
        Some("the qkv bias goes into CUTLASS's epilogue (no cuBLASLt workspace), not modelled yet")
    } else {
        None
    };
    match why {
        Some(w) => Err(Error::model(
            o.source.origin(),
            format!("--quant fp8 with model_type '{}': {w}", c.arch),
        )),
        None => Ok(()),
    }
}

/// What an AWQ / GPTQ checkpoint is reproduced for: vLLM 0.6.4's Marlin path on a GPU that
/// runs it (`marlin::check_gpu`: a simulated one's preset here, a CUDA device's own
/// capability when it loads), any tensor-parallel size whose cuts fall on whole words and
/// groups (the loader checks each), the Llama-family models whose layers the
/// checkpoint stores apart, activations in fp16 or bf16. Each refusal says which and why.
fn check_packed4(req: &ProfileRequest, o: &model::OpenedModel) -> Result<()> {
    use crate::quant::marlin;
    let Some(fmt) = o.source.packed4() else {
        return Ok(());
    };
    let what = if fmt.compressed_tensors {
        "a compressed-tensors w4a16 checkpoint".to_string()
    } else {
        format!("an {} checkpoint", fmt.method.name().to_uppercase())
    };
    if !matches!(req.quant, Quant::F16 | Quant::BF16) {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "{what} loads as stored: --quant {} would be reported for weights that are not {}; use --quant fp16 or bf16 (the activation dtype)",
                req.quant, req.quant
            ),
        ));
    }
    let c = &o.config;
    if c.arch == "opt" || c.fused_checkpoint() {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "{what} with model_type '{}': {}",
                c.arch,
                if c.arch == "opt" {
                    "OPT's AWQ / GPTQ layers (with biases) are not modelled yet"
                } else {
                    "its qkv_proj and gate_up_proj are stored fused, which the AWQ / GPTQ reader does not cut yet"
                }
            ),
        ));
    }
    // The release first: a GPU check names 0.6.4's kernels, which say nothing of another
    // release's choice.
    let era = marlin::check_release(req.release()?.name)?;
    marlin::check_act_order(&fmt, req.release()?.name)?;
    // compressed-tensors is modelled under the V1 releases only, as its fp8 scheme is: 0.6.4
    // reads the format through an older `CompressedTensorsWNA16` (with its own
    // `MarlinLinearKernel` path) that is not checked here.
    if fmt.compressed_tensors && era == marlin::Era::V0_6_4 {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "{what} is modelled under the V1 releases (0.11, 0.15, 0.19, 0.21; CompressedTensorsWNA16 through choose_mp_linear_kernel), not --vllm {}",
                req.release()?.name
            ),
        ));
    }
    match &req.device {
        // A CUDA device checks its own capability when the first layer loads.
        DeviceSpec::Cuda { .. } => {}
        DeviceSpec::Sim { preset, .. } => {
            if let Some(p) = crate::device::presets::find(preset) {
                let (h, i) = (c.hidden_size, c.intermediate_size);
                let layers = [
                    (c.q_dim() + 2 * c.kv_dim(), h),
                    (h, c.q_dim()),
                    (2 * i, h),
                    (h, i),
                ];
                marlin::check_gpu(&fmt, era, p.arch, p.name, &layers)?;
            }
        }
    }
    Ok(())
}

/// What an NVFP4 checkpoint is reproduced for (`quant::nvfp4::check`): vLLM 0.19's Marlin FP4
/// on a simulated Ampere, Ada or Hopper GPU, activations in fp16 or bf16, the Llama-family
/// models whose layers the checkpoint stores apart; a CUDA device is refused (the FP4 Marlin
/// kernel is not reproduced on the GPU).
fn check_nvfp4(req: &ProfileRequest, o: &model::OpenedModel) -> Result<()> {
    let Some(flavor) = o.source.nvfp4() else {
        return Ok(());
    };
    let what = format!("a {} checkpoint", flavor.label());
    if !matches!(req.quant, Quant::F16 | Quant::BF16) {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "{what} loads as stored: --quant {} would be reported for weights that are not {}; use --quant fp16 or bf16 (the activation dtype)",
                req.quant, req.quant
            ),
        ));
    }
    let c = &o.config;
    if c.arch == "opt" || c.fused_checkpoint() {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "{what} with model_type '{}': only Llama-family models whose projections are stored apart are modelled for NVFP4",
                c.arch
            ),
        ));
    }
    let arch = match &req.device {
        DeviceSpec::Cuda { .. } => {
            return Err(Error::model(
                o.source.origin(),
                format!("{what} on a CUDA device: vramscope plans NVFP4 dry and computes it on the CPU (sim:…:dry or sim:…:compute); vLLM's Marlin FP4 kernel is not reproduced on the GPU"),
            ))
        }
        DeviceSpec::Sim { preset, .. } => {
            crate::device::presets::find(preset).map(|p| (p.arch, p.name))
        }
    };
    crate::quant::nvfp4::check(flavor, req.release()?.name, arch)
        .map_err(|e| Error::model(o.source.origin(), e.to_string()))
}

/// What a 2:4 sparse checkpoint is reproduced for (`quant::sparse24::check`): vLLM 0.11 and
/// 0.15's `CompressedTensors24` on a simulated Hopper GPU, `--quant` the activation dtype, the
/// Llama-family models whose projections are stored apart; 0.19 and later refuse the model
/// (their `NotImplementedError`), a CUDA device is refused (CUTLASS's sparse GEMM is not
/// reproduced on the GPU).
fn check_sparse24(req: &ProfileRequest, o: &model::OpenedModel) -> Result<()> {
    let Some(scheme) = o.source.sparse24() else {
        return Ok(());
    };
    let what = format!("a {} checkpoint", scheme.label());
    let c = &o.config;
    if c.arch == "opt" || c.fused_checkpoint() {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "{what} with model_type '{}': only Llama-family models whose projections are stored apart are modelled for 2:4",
                c.arch
            ),
        ));
    }
    let arch = match &req.device {
        DeviceSpec::Cuda { .. } => None,
        DeviceSpec::Sim { preset, .. } => {
            crate::device::presets::find(preset).map(|p| (p.arch, p.name))
        }
    };
    crate::quant::sparse24::check(scheme, req.release()?.name, arch)
        .map_err(|e| Error::model(o.source.origin(), e.to_string()))?;
    if let DeviceSpec::Cuda { .. } = &req.device {
        return Err(Error::model(
            o.source.origin(),
            format!("{what} on a CUDA device: vramscope plans 2:4 sparse layers dry and computes them on the CPU (sim:H100:dry or sim:H100:compute); CUTLASS's sparse tensor-core GEMM (cutlass_scaled_sparse_mm) is not reproduced on the GPU"),
        ));
    }
    let act = scheme.dtype;
    let want = if act == DType::BF16 {
        Quant::BF16
    } else {
        Quant::F16
    };
    if req.quant != want {
        return Err(Error::model(
            o.source.origin(),
            format!(
                "{what} loads as stored in {}: --quant {} would be reported for weights that are not {}; use --quant {}",
                want, req.quant, req.quant, want
            ),
        ));
    }
    Ok(())
}

/// The procedure on one GPU, or on one rank of a tensor-parallel instance.
/// The device memory PyTorch's lazily loaded kernel modules take while the weights are made
/// (0.604 − 0.514 GiB) and in the first forward (0.679 − 0.604 GiB), H200, PyTorch 2.11,
/// Llama-3-8B shapes in bf16 (issue 46's measurement, rounded to the MiB).
pub const LOAD_MODULE_BYTES: u64 = 92 << 20;
pub const FORWARD_MODULE_BYTES: u64 = 77 << 20;
/// What the CUDA driver reserves at a process's first graph capture and keeps after the
/// graphs are destroyed: +70 MiB at PyTorch 2.11's first capture of a one-kernel graph on an
/// H100, in lazy and eager module loading alike, with 100 more graphs adding 10 MiB
/// (docs/gpu-runs.md run 90; at Llama-3-8B's shapes the first captured forward added 74 MiB
/// and nothing came back when the graphs went, run 89).
pub const FIRST_CAPTURE_DRIVER_BYTES: u64 = 70 << 20;

pub(crate) fn run_rank(
    req: &ProfileRequest,
    sink: Option<ProgressSink>,
    cancel: Arc<AtomicBool>,
    rank: Option<RankSpec>,
) -> Result<Report> {
    req.validate()?;
    let wall = Instant::now();
    // Model files are checked before any device work, so a bad file fails fast.
    let mut opened = match &req.model {
        ModelSource::Synthetic { .. } => None,
        other => Some(model::open(other, req.seed)?),
    };
    // `--mm-processor-kwargs`' pixel bounds: Qwen2.5-VL's image processor (its dummy image,
    // qwen2_vl.py 0.19 L935-947); no other model here reads them.
    if let (Some(o), Some(bounds)) = (
        opened.as_mut(),
        req.mm_processor_kwargs
            .as_deref()
            .and_then(super::multimodal::pixel_bounds_of_kwargs),
    ) {
        match o.config.qwen2_5_vl.as_mut() {
            Some(mm) => mm
                .read_preprocessor(&bounds)
                .map_err(|e| Error::Request(format!("--mm-processor-kwargs: {}", e.replace("preprocessor_config.json: ", ""))))?,
            None => {
                return Err(Error::Request(format!(
                    "--mm-processor-kwargs {bounds}: the image processor's pixel bounds are read for Qwen2.5-VL only, not for model_type {}",
                    o.config.arch
                )))
            }
        }
    }
    if let Some(o) = &opened {
        let dry = matches!(req.device, DeviceSpec::Sim { dry: true, .. });
        if !o.source.has_weights() && !dry {
            return Err(Error::model(
                o.source.origin(),
                format!(
                    "only config.json is here: {} needs the weights; plan with a dry run (--device sim:PRESET:dry)",
                    req.device
                ),
            ));
        }
    }
    // Model Runner V2 where the release runs this model on it by default.
    let v2 = match (&opened, req.release()?.engine) {
        (Some(o), super::vllm::Engine::V1 { .. }) => req.release()?.runs_v2(
            // A multimodal checkpoint's architecture is its `…ForConditionalGeneration`,
            // never in the releases' V2 lists of language models (0.23-0.24 list
            // `MistralForCausalLM`, not `Mistral3ForConditionalGeneration`).
            match &o.config {
                c if c.mistral3.is_some() => "mistral3",
                c if c.gemma3_mm.is_some() => "gemma3",
                c if c.qwen2_5_vl.is_some() => "qwen2_5_vl",
                c if c.llava_next.is_some() => "llava_next",
                c if c.kimi_vl.is_some() => "kimi_vl",
                c => &c.arch,
            },
            !req.quant.unquantized()
                || o.source.packed4().is_some()
                || o.source.nvfp4().is_some()
                || o.source.sparse24().is_some(),
            o.config.moe.is_some() || o.config.deepseek.is_some(),
        ),
        _ => false,
    };
    // A pre-quantized fp8 checkpoint runs as `--quant fp8` from here on.
    let as_fp8 = match &opened {
        Some(o) => stored_fp8_request(req, o)?,
        None => None,
    };
    let req = as_fp8.as_ref().unwrap_or(req);
    if let Some(o) = &opened {
        check_quant_matches_checkpoint(req, o)?;
        check_fp8(req, o)?;
        check_packed4(req, o)?;
        check_nvfp4(req, o)?;
        check_sparse24(req, o)?;
    }
    // vLLM's defaults for what the user left open: max_model_len from the model, the batch
    // max(max_model_len, 2048).
    let max_positions = opened
        .as_ref()
        .map_or(0, |o| o.config.derived_max_model_len() as usize);
    check_against_model(req, max_positions)?;
    req.release()?.check_quant(req.quant)?;
    req.check_batch_covers_length(max_positions)?;
    req.check_default_seqs_fit_batch()?;
    if let Some(o) = &opened {
        req.release()?.check_arch(&o.config.arch)?;
        if req.quant == Quant::F32 {
            check_float32_family(&o.config)?;
        }
    }
    let resolved = req.resolved(max_positions);
    resolved.validate()?;
    let req = &resolved;
    super::host_memory::check(req, opened.as_ref().map(|o| &o.config))?;
    let mut spec = req.device.clone();
    if let (ModelSource::Synthetic { .. }, DeviceSpec::Sim { dry, .. }) = (&req.model, &mut spec) {
        // A synthetic workload has no math to do.
        *dry = true;
    }
    if let (Some(r), DeviceSpec::Cuda { ordinal }) = (&rank, &mut spec) {
        // vLLM's worker i runs on the i-th GPU of the instance.
        let w = r.world_rank();
        *ordinal = ordinal.checked_add(w).ok_or_else(|| Error::Device {
            spec: req.device.to_string(),
            problem: format!("rank {w} has no GPU index (past 2^64)"),
        })?;
    }
    let device = Device::open(&spec)?;
    let device_info = device.info();
    let layout = device.int8_tile_layout();
    let context_bytes = device.simulated_context_bytes();
    let sms = device.sm_count();
    let hopper = device.is_hopper();
    let device_major = device.compute_major();
    let release = req.release()?;
    // Multi-head latent attention: the release's backend for this GPU fixes the KV block size
    // and the buffers its modules make while the model is built.
    let mla_backend = match opened.as_ref().and_then(|o| o.config.deepseek.as_ref()) {
        Some(_) => {
            let kv_fp8 = req
                .kv_cache_dtype
                .storage_dtype(req.quant.activation_dtype())
                .size_bytes()
                == 1;
            Some(release.mla_backend(device.compute_major(), kv_fp8, req.block_size)?)
        }
        None => None,
    };
    // 0.33's TRITON_MLA reserves its decode logits' upper bound in the profile run, over this
    // rank's heads and the GPU's SMs.
    let mla_logits_reserve = match (&mla_backend, opened.as_ref()) {
        (Some(b), Some(o)) if b.logits_reserve => {
            let tp = rank.as_ref().map_or(1, |r| r.size).max(1);
            let kv_lora = o.config.deepseek.as_ref().map_or(0, |d| d.kv_lora_rank);
            super::vllm::triton_mla_logits_bytes(
                req.seqs as u64,
                (o.config.num_heads / tp) as u64,
                req.max_model_len,
                sms.unwrap_or(0),
                kv_lora as u64,
            )
        }
        _ => 0,
    };
    // A hybrid model of attention and state layers (Qwen3-Next): V1 raises the attention
    // block size until its page holds one sequence's state and pads the state page to it.
    let hybrid_pages = match opened.as_ref().and_then(|o| o.config.qwen3_next.as_ref()) {
        Some(q) => Some(hybrid_state_pages(
            &opened.as_ref().expect("opened").config,
            q,
            req,
            (rank.as_ref().map_or(1, |r| r.size), release, device_major),
        )?),
        None => None,
    };
    // The block size that runs is the report's (and the graphs' and the KV cache's): the
    // backend's where it overrides the one asked.
    let ran = mla_backend
        .as_ref()
        .map(|b| b.block_size)
        .or(hybrid_pages.as_ref().map(|h| h.block_size))
        .map(|block_size| ProfileRequest {
            block_size,
            ..req.clone()
        });
    let req = ran.as_ref().unwrap_or(req);
    let nccl_source = rank.as_ref().map(|r| {
        let mut src = device.nccl_source(release.nccl);
        // No V1 release turns cuMem off: env_override.py sets no NCCL_CUMEM_ENABLE in
        // 0.11.0, 0.19.0, 0.22.0 or 0.31.0 (0.8.5's did), so NCCL runs with cuMem and its
        // runtime connection. Those rules are measured only in vramscope's own process on
        // NVLink; the cuMem-off rules are kept, and said to be an assumption.
        if matches!(release.engine, super::vllm::Engine::V1 { .. })
            && release.nccl == crate::device::nccl_model::NcclRules::Nccl221CumemOff
            && spec.is_sim()
        {
            src.push_str(&format!(
                "; vLLM {} runs PyTorch {}'s NCCL with cuMem on (it sets no \
                 NCCL_CUMEM_ENABLE=0): not modelled, these cuMem-off rules are assumed",
                release.name, release.torch
            ));
        }
        if let Some(net) = r.comms.iter().find_map(|c| c.across) {
            let m = crate::device::nccl_model::NetModel::new(net, release.nccl);
            src.push_str("; across hosts: ");
            src.push_str(&m.source());
        }
        src
    });
    let pp_stage = rank.as_ref().and_then(|r| r.pp.clone());
    let moe_group = rank.as_ref().and_then(|r| r.moe);
    if opened.as_ref().is_some_and(|o| o.config.gpt_oss.is_some()) {
        check_gpt_oss_parallel(req, release, device_major)?;
    }
    // The release's fused MoE for this GPU (0.21's oracle picks it by compute capability).
    let moe_kernel = match &opened {
        // gpt-oss's MXFP4 experts run the MXFP4 oracle's backend (`quant::mxfp4`), not the
        // fused MoE kernel.
        Some(o) if o.config.gpt_oss.as_ref().is_some_and(|g| g.mxfp4) => None,
        Some(o) => release.moe_kernel_on(
            &o.config.arch,
            device_major,
            moe_group,
            // Block-wise fp8 experts, or online fp8 ones (`--quant fp8` on a 16-bit MoE): the
            // fp8 oracle's Triton (per-tensor keys: docs/reading/vllm-fp8-online-moe-v021.md §2).
            o.source.stored_fp8().is_some_and(|f| f.block.is_some())
                || (req.quant == Quant::Fp8 && o.source.stored_fp8().is_none()),
        )?,
        None => None,
    };
    // Block-wise fp8 experts with expert parallel on Hopper: the fp8 oracle's FlashInfer
    // CUTLASS MoE, with data parallel too (it never reads `dp_size`:
    // docs/reading/vllm-flashinfer-moe-dp.md; `check_fp8_block_model` has refused 0.19).
    let moe_kernel = match (moe_kernel, &opened, moe_group) {
        (Some(crate::engine::ops_moe_v1::MoeKernel::Modular(mut k)), Some(o), Some(g))
            if g.ep
                && device_major == 9
                && o.source.stored_fp8().is_some_and(|f| f.block.is_some()) =>
        {
            if let Some(r) = k.v0_21.as_mut() {
                r.flashinfer_cutlass = true;
            }
            Some(crate::engine::ops_moe_v1::MoeKernel::Modular(k))
        }
        (k, _, _) => k,
    };
    let group_comms = rank.as_ref().map(|r| r.comms.clone()).unwrap_or_default();
    let tp_rank = rank
        .filter(|r| r.size > 1)
        .map(|r| crate::device::group::TpRank {
            custom_ar: device.custom_all_reduce_for(r.size),
            all_reduce_out_of_place: release.all_reduce == super::vllm::AllReduce::OutOfPlace,
            nccl: release.nccl,
            rank: r.rank,
            size: r.size,
            group: r.group,
        });
    let rt = Runtime::new(device, cancel, sink);
    if let Some(t) = tp_rank {
        rt.set_tp(t);
    }
    rt.set_fp8_act_per_token(matches!(release.engine, super::vllm::Engine::V1 { .. }));
    // `--dtype float32` runs on Triton's attention (`Release::check_float32`).
    rt.set_triton_attention(req.quant == Quant::F32);
    if let (Some(era), DeviceSpec::Sim { preset, .. }) = (release.fp8_block, &req.device) {
        let hopper = crate::device::presets::find(preset).is_some_and(|p| p.arch == "Hopper");
        rt.set_fp8_block_path(era.path(hopper));
    }
    if matches!(release.engine, super::vllm::Engine::V1 { .. }) {
        rt.set_silu_and_mul_fused(req.enforce_eager || release.minor().is_some_and(|m| m >= 15));
    }
    if let Some(m) = release.minor() {
        rt.set_fp8_online_scales(crate::engine::rules::OnlineScales::for_minor(m));
        rt.set_mla_rules(crate::model::layers::mla::MlaModelRules::for_minor(m));
        let gdn = crate::engine::rules::GdnRules::for_minor(
            m,
            // Hopper is compute capability 9.0, the only 9.x.
            device_major == 9,
        );
        rt.set_gdn_rules(crate::engine::rules::GdnRules {
            // Prefix caching as the line sets it; 0.10/0.11 turn it off for hybrids.
            prefix_caching_align: hybrid_prefix_caching(req, m),
            ..gdn
        });
    }
    rt.set_mxfp4_rules(match release.minor() {
        Some(m) => crate::quant::mxfp4::Rules::for_release(
            m,
            crate::quant::mxfp4::hopper_swizzles(release.torch),
        ),
        None => crate::quant::mxfp4::Rules {
            swizzle: crate::quant::mxfp4::hopper_swizzles(release.torch),
            ..crate::quant::mxfp4::Rules::V0_19
        },
    });
    if let Some(p) = pp_stage {
        rt.set_pp(p);
    }
    if let Some(g) = moe_group {
        rt.set_moe_group(g);
    }
    rt.progress(Progress::Phase(Phase::Starting));
    rt.set_op("instance");
    let other_process_bytes = if req.outside_before > 0 {
        let held = rt.with_device(|d| d.hold_foreign(req.outside_before))?;
        rt.marker(&format!(
            "another process holds {} (--outside-before {})",
            crate::base::units::fmt_u(held),
            crate::base::units::fmt_u(req.outside_before)
        ));
        held
    } else {
        0
    };
    let _context = match context_bytes {
        Some(b) if b > 0 => Some(rt.alloc_outside("cuda-context", b)?),
        _ => None,
    };
    if release.cublas_before_baseline {
        // 0.33 makes its cuBLAS and cuBLASLt handles before the baseline snapshot (`torch.mm`,
        // `F.linear` with a bias: 0.33.0 v1/worker/gpu_worker.py:518-529).
        rt.set_op("cublas-handles");
        rt.ensure_library_workspaces()?;
        rt.ensure_lt_workspace()?;
        rt.set_op("instance");
    }
    // V0 reads the instance's free memory before `init_worker_distributed_environment`
    // (worker.py L150-177); V1 takes its baseline snapshot after it, so the communicators
    // and their warm-up all-reduce are not in V1's non-torch increase (0.11.0
    // v1/worker/gpu_worker.py L169 then L182 `init_snapshot`; 0.19.0 L263, L282).
    let v1 = matches!(release.engine, super::vllm::Engine::V1 { .. });
    let (t0, _distributed) = if v1 {
        let d = init_distributed(&rt, release, &group_comms)?;
        (checkpoint(&rt, "t0"), d)
    } else {
        let t0 = checkpoint(&rt, "t0");
        (t0, init_distributed(&rt, release, &group_comms)?)
    };
    let before_load = rt.stats().allocated;
    // From 0.21 vLLM loads under a 20 MiB split limit (`Release::load_max_split_mib`), lifted
    // when `load_model` returns: here after Model Runner V2's sampler state, which
    // `load_model` makes from 0.25.1 (0.22-0.24 make it in the runner's constructor, before
    // the load; vramscope makes it after the weights in every release).
    if let Some(m) = release.load_max_split_mib {
        rt.set_max_split(Some(m << 20));
    }

    rt.progress(Progress::Phase(Phase::Loading));
    let (work, model_info, cfg) = match (&req.model, opened) {
        (
            ModelSource::Synthetic {
                weights_bytes,
                spike_bytes,
            },
            _,
        ) => {
            rt.set_op("load");
            let w = rt.reserve_bytes("synthetic-weights", Category::Weight, *weights_bytes)?;
            let cfg = presets::preset("llama-3-8b").expect("preset");
            let info = ModelInfo::without_shapes(
                "synthetic workload (vLLM test_memory_profiling)".into(),
                req.model.label(),
                "synthetic",
            );
            (
                Workload::Synthetic {
                    _weights: w,
                    spike_bytes: *spike_bytes,
                },
                info,
                cfg,
            )
        }
        (_, Some(opened)) => {
            let opts = LoadOptions {
                quant: req.quant,
                int8_threshold: req.int8_threshold,
                int8_layout: layout,
                attn_scalars: release.attn_scalars,
                marlin: crate::quant::marlin::Kernel {
                    era: crate::quant::marlin::Era::of_release(release.name).unwrap_or_default(),
                    sms: sms.unwrap_or(0) as usize,
                    minor: release
                        .name
                        .strip_prefix("0.")
                        .and_then(|r| r.split('.').next())
                        .and_then(|m| m.parse().ok())
                        .unwrap_or(0),
                    hopper,
                },
            };
            if opened.config.gemma3_mm.is_some() && matches!(req.device, DeviceSpec::Cuda { .. }) {
                return Err(Error::Request(
                    "model_type gemma3 (multimodal): its SigLIP vision tower runs on simulated devices only (--device sim:PRESET or sim:PRESET:dry)".into(),
                ));
            }
            if opened
                .config
                .llama4
                .as_ref()
                .is_some_and(|l| l.vision.is_some())
                && matches!(req.device, DeviceSpec::Cuda { .. })
            {
                return Err(Error::Request(
                    "model_type 'llama4' (multimodal): its vision tower runs on simulated devices only (--device sim:PRESET or sim:PRESET:dry)".into(),
                ));
            }
            if opened.config.llava_next.is_some() && matches!(req.device, DeviceSpec::Cuda { .. }) {
                return Err(Error::Request(
                    "model_type llava_next (multimodal): its SigLIP vision tower runs on simulated devices only (--device sim:PRESET or sim:PRESET:dry)".into(),
                ));
            }
            if opened.config.kimi_vl.is_some() && matches!(req.device, DeviceSpec::Cuda { .. }) {
                return Err(Error::Request(
                    "model_type kimi_vl (multimodal): its MoonViT vision tower runs on simulated devices only (--device sim:PRESET or sim:PRESET:dry)".into(),
                ));
            }
            if opened.config.mistral3.is_some() && matches!(req.device, DeviceSpec::Cuda { .. }) {
                return Err(Error::Request(
                    "model_type mistral3 (multimodal): its Pixtral vision tower runs on simulated devices only (--device sim:PRESET or sim:PRESET:dry)".into(),
                ));
            }
            if opened.config.qwen2_5_vl.is_some() {
                if matches!(req.device, DeviceSpec::Cuda { .. }) {
                    return Err(Error::Request(
                        "model_type qwen2_5_vl (multimodal): its vision tower runs on simulated devices only (--device sim:PRESET or sim:PRESET:dry)".into(),
                    ));
                }
                // The tower's forward read and modelled: 0.15.1, 0.19.0 (the same code for
                // what is allocated) and 0.21-0.33 (docs/reading/vllm-mm-towers-v021.md §1,
                // `TowerRelease::of_minor`); 0.10 and 0.11 were not read.
                if release.minor().is_none_or(|m| m != 15 && m < 19) {
                    return Err(Error::Request(format!(
                        "model_type qwen2_5_vl (multimodal): vLLM {}'s Qwen2.5-VL vision tower is not modelled (read: 0.15, and 0.19 to 0.33)",
                        release.name
                    )));
                }
            }
            // Gemma3ForConditionalGeneration and Mistral3ForConditionalGeneration build their
            // vision tower and projector before the language model (gemma3_mm.py 0.11
            // L505-517, mistral3.py 0.19 L417-441). An item counts its embeddings and its
            // placeholder: Gemma 3's "\n\n<start_of_image>" + the image tokens +
            // "<end_of_image>\n\n" (`full_image_sequence`, gemma3_mm.py 0.11 L166-195,
            // pan-and-scan off); Mistral 3's rows of [IMG] each closed by [IMG_BREAK], the
            // last by [IMG_END] (mistral3.py 0.19 L283-300).
            // LLaVA-NeXT's image is its `<image>` token repeated once an embedding
            // (`get_num_image_tokens`, llava_next.py 0.19 L104-139; the largest image's,
            // L175-190).
            // Qwen2.5-VL's profiled item: `None` when the model has none, `Some(None)` when
            // every image and video limit is 0. 0.15 gives a tie to the image, 0.19 to the
            // video.
            let qwen_item = opened.config.qwen2_5_vl.as_ref().map(|mm| {
                mm.profile_item(
                    req.max_model_len,
                    (req.limit_mm_images, req.limit_mm_videos),
                    release.name != "0.15",
                )
            });
            let c = &opened.config;
            let llama4_vision = c.llama4.as_ref().and_then(|l| l.vision.as_ref());
            let mm_kind = match (&c.gemma3_mm, &c.mistral3, &c.llava_next) {
                (Some(mm), _, _) => Some((
                    "gemma3",
                    (
                        mm.mm_tokens_per_image as u64,
                        mm.mm_tokens_per_image as u64 + 4,
                    ),
                )),
                (None, Some(mm), _) => Some((
                    "mistral3",
                    (mm.embeds_per_image() as u64, mm.placeholder_tokens() as u64),
                )),
                (None, None, Some(mm)) => {
                    let t = mm.max_feature_image().2 as u64;
                    Some(("llava_next", (t, t)))
                }
                // Llama 4: its dummy image's 17 tiles of 144 `<|patch|>` embeddings inside
                // `_prompt_split_image`'s placeholder (`VisionTower::dummy_image_tokens`).
                _ if llama4_vision.is_some() => llama4_vision.map(|v| {
                    let (e, p) = v.dummy_image_tokens();
                    ("llama4", (e as u64, p as u64))
                }),
                // Kimi-VL's dummy image of 1024 × 1024 pixels (`MaxImageTokenMeta`,
                // kimi_vl.py 0.19 L87-91, L214-231), as many `<|media_pad|>` tokens as
                // embeddings (L260-274).
                _ if c.kimi_vl.is_some() => c.kimi_vl.as_ref().map(|mm| {
                    let t = mm.tokens_per_image() as u64;
                    ("kimi_vl", (t, t))
                }),
                // Qwen2.5-VL: its dummy image or video (`profile_item`), as many
                // `<|image_pad|>` / `<|video_pad|>` tokens as embeddings (qwen2_vl.py 0.19
                // L1079-1112).
                _ => qwen_item.map(|i| {
                    let t = i.map_or(0, |i| i.tokens);
                    ("qwen2_5_vl", (t, t))
                }),
            };
            // The limit of the modality profiled: Qwen2.5-VL's video where it profiles one.
            let mm_limit = match qwen_item {
                Some(None) => Some(0),
                Some(Some(i)) if i.video => req.limit_mm_videos,
                _ => req.limit_mm_images,
            };
            let encoder = match mm_kind {
                Some((kind, per_item)) => {
                    let Some(profile) = release.mm else {
                        return Err(Error::Request(format!(
                            "model_type {kind} (multimodal): vLLM {}'s multimodal profile is not modelled; use a V1 release (0.10, 0.11, 0.15, 0.19)",
                            release.name
                        )));
                    };
                    // LLaVA-NeXT is read at 0.19 (llava_next.py, llava.py, siglip.py) and
                    // 0.21-0.33 (docs/reading/vllm-mm-towers-v021.md §3: the same tower and
                    // projector); its tower's position embedding differs from the older
                    // releases' reading.
                    if kind == "llava_next" && release.minor().is_none_or(|m| m < 19) {
                        return Err(Error::Request(format!(
                            "model_type llava_next (multimodal): vLLM {}'s LLaVA-NeXT is not modelled; it is from --vllm 0.19 to 0.33",
                            release.name
                        )));
                    }
                    // Llama 4's tower is read at 0.19 (mllama4.py, llama4_vision_rope.py), the
                    // same through 0.33 (docs/reading/vllm-mm-towers-v021.md §2).
                    if kind == "llama4" && release.minor().is_none_or(|m| m < 19) {
                        return Err(Error::Request(format!(
                            "model_type 'llama4' (multimodal): vLLM {}'s Llama 4 vision tower is not modelled; it is from --vllm 0.19 to 0.33",
                            release.name
                        )));
                    }
                    // Kimi-VL is read at 0.19 (kimi_vl.py, moonvit.py, MMEncoderAttention) and
                    // 0.21-0.33 (vllm-mm-towers-v021.md §4: the eager path unchanged).
                    if kind == "kimi_vl" && release.minor().is_none_or(|m| m < 19) {
                        return Err(Error::Request(format!(
                            "model_type kimi_vl (multimodal): vLLM {}'s Kimi-VL is not modelled; it is from --vllm 0.19 to 0.33",
                            release.name
                        )));
                    }
                    let plan = super::multimodal::plan(
                        per_item,
                        profile,
                        (req.tokens as u64, req.seqs as u64, req.max_model_len),
                        req.chunked_prefill.unwrap_or(true),
                        mm_limit,
                    )
                    .map(|mut p| {
                        if let Some(Some(i)) = qwen_item {
                            if i.video {
                                p.modality = "video".into();
                            }
                        }
                        p
                    });
                    let skipped = plan.is_none() && profile.tower_skipped_at_zero;
                    // Model Runner V2 (docs/reading/vllm-mm-towers-v021.md §0.4): 0.22-0.26's
                    // `profile_run` encodes nothing (the text pass still reads the runner's
                    // `inputs_embeds`); from 0.27.1 `profile_encoder_cache` encodes as V1 does
                    // but its device batch dies as `execute_mm_encoder` returns, before the
                    // text pass.
                    let minor = release.minor().unwrap_or(0);
                    let v2_encodes_nothing = v2 && minor < 27 && plan.is_some();
                    let plan = plan.filter(|_| !v2_encodes_nothing);
                    // Pixtral's attention: xFormers where the wheel brings it (0.10, 0.11) and
                    // the GPU is not a Blackwell, else SDPA with the dense block mask
                    // (pixtral.py 0.11 L57-66, 0.19 L87-98).
                    let pixtral_xformers = matches!(
                        profile.vision_attention,
                        super::vllm::VisionAttention::Xformers
                            | super::vllm::VisionAttention::SdpaOnBlackwell
                    ) && device_major < 10;
                    let vision = if skipped {
                        None
                    } else if kind == "gemma3" {
                        let mut v = crate::model::models::gemma3_mm::Gemma3Vision::load(
                            &rt,
                            &opened.config,
                            opened.source.as_ref(),
                            &opts,
                            matches!(release.name, "0.10" | "0.11"),
                        )?;
                        v.tower.varlen_attention = profile.vision_attention.varlen(device_major);
                        Some(Tower::Siglip(Box::new(v)))
                    } else if kind == "qwen2_5_vl" {
                        let mut v = crate::model::models::qwen2_5_vl::Qwen25Vision::load_for(
                            &rt,
                            &opened.config,
                            opened.source.as_ref(),
                            &opts,
                            crate::model::models::qwen2_5_vl::TowerRelease::of(
                                minor,
                                req.enforce_eager,
                            ),
                        )?;
                        v.profile_item = qwen_item.flatten();
                        Some(Tower::Qwen25Vl(Box::new(v)))
                    } else if kind == "llama4" {
                        let mut v = crate::model::models::llama4_vision::Llama4Vision::load(
                            &rt,
                            &opened.config,
                            opened.source.as_ref(),
                            &opts,
                        )?;
                        v.varlen_attention = profile.vision_attention.varlen(device_major);
                        Some(Tower::Llama4(Box::new(v)))
                    } else if kind == "kimi_vl" {
                        let v = crate::model::models::kimi_vl::KimiVlVision::load(
                            &rt,
                            &opened.config,
                            opened.source.as_ref(),
                            &opts,
                        )?;
                        Some(Tower::KimiVl(Box::new(v)))
                    } else if kind == "llava_next" {
                        let mut v = crate::model::models::llava_next::LlavaNextVision::load(
                            &rt,
                            &opened.config,
                            opened.source.as_ref(),
                            &opts,
                        )?;
                        v.tower.varlen_attention = profile.vision_attention.varlen(device_major);
                        Some(Tower::LlavaNext(Box::new(v)))
                    } else {
                        // 0.33: uint8 pixels normalized on the device in `pixtral_patch_embed`
                        // (`supports_mm_device_do_normalize`, mistral3.py 0.33.0 L426).
                        let mut v = crate::model::models::mistral3::Mistral3Vision::load_for(
                            &rt,
                            &opened.config,
                            opened.source.as_ref(),
                            &opts,
                            minor >= 33,
                        )?;
                        v.xformers = pixtral_xformers;
                        // From 0.29 the images are packed into one varlen attention
                        // (`_make_packed_sequence_metadata`, pixtral.py 0.29.0 L95-120).
                        v.packed_varlen = minor >= 29;
                        // vLLM's `RMSNorm` through the IR from 0.21 (pixtral.py 0.21,
                        // vllm-mm-towers-v021.md §5).
                        v.norm_body =
                            crate::engine::ops_pixtral::RmsNormBody::of(minor, req.enforce_eager);
                        Some(Tower::Pixtral(Box::new(v)))
                    };
                    let attention = if matches!(
                        kind,
                        "gemma3" | "qwen2_5_vl" | "llava_next" | "llama4" | "kimi_vl"
                    ) {
                        profile.vision_attention.label(device_major)
                    } else if kind == "mistral3" && minor >= 29 {
                        "FlashAttention varlen (the images packed into one sequence)"
                    } else if pixtral_xformers {
                        "xFormers memory-efficient (block-diagonal bias)"
                    } else {
                        "PyTorch SDPA (memory-efficient, dense block mask)"
                    };
                    Some(Box::new(Encoder {
                        vision,
                        plan,
                        pads_to_budget: profile.pads_to_budget,
                        attention,
                        embeds_without_plan: !profile.text_only_at_zero || v2_encodes_nothing,
                        frees_inputs: v2 && minor >= 27,
                        v2_no_profile: v2_encodes_nothing,
                        release_minor: minor,
                        armed: std::cell::Cell::new(false),
                        stats: std::cell::Cell::new(None),
                    }))
                }
                None => None,
            };
            let mut model = CausalLm::load(&rt, &opened.config, opened.source.as_ref(), &opts)?;
            model.set_mlp_frees_gate_up(release.llama_mlp_frees_gate_up);
            model.set_normalizer_out_of_place(release.gemma_normalizer_out_of_place);
            if let Some(k) = moe_kernel {
                model.set_moe_kernel(k);
            }
            if let Some(b) = &mla_backend {
                let w =
                    release.mla_workspace_tokens(req.max_model_len, req.seqs as u64, b.block_size);
                model.set_mla_backend(&rt, w as usize, &b.buffers, mla_logits_reserve)?;
            }
            if matches!(moe_kernel, Some(crate::engine::ops_moe_v1::MoeKernel::Modular(k)) if k.v0_21.is_some_and(|r| r.flashinfer_cutlass))
            {
                model.swap_w13_for_flashinfer(&rt)?;
            }
            let c = &opened.config;
            let info = ModelInfo {
                name: opened.name.clone(),
                source: opened.source.origin(),
                arch: c.arch.clone(),
                parameters: c.param_count(),
                layers: c.num_layers,
                hidden_size: c.hidden_size,
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                vocab_size: c.vocab_size,
                expert_parameters: c.expert_param_count(),
                num_experts: c.moe.as_ref().map_or(0, |m| m.num_experts),
                active_parameters: if c.moe.is_some() {
                    c.active_param_count()
                } else {
                    0
                },
            };
            let batch = Batch::dummy(req.tokens, req.seqs, c.vocab_size);
            (
                Workload::Model {
                    model: Box::new(model),
                    batch,
                    sampler: req.sampler.then(|| Sampler::new(req.seed)),
                    encoder,
                    v1: match release.engine {
                        super::vllm::Engine::V0 => None,
                        super::vllm::Engine::V1 { top_k_top_p } => {
                            // A preset without an SM count (the test mock): an H100's.
                            let triton = sampler::V1TopKTopP::Triton {
                                sms: sms.unwrap_or(132),
                            };
                            Some(match top_k_top_p {
                                // V2's dummy sampler has no request state: the Gumbel argmax.
                                _ if v2 => vec![sampler::V1TopKTopP::V2Gumbel],
                                super::vllm::TopKTopP::Sort => vec![sampler::V1TopKTopP::Sort],
                                super::vllm::TopKTopP::Triton => vec![triton],
                                super::vllm::TopKTopP::FlashInferThenTriton => {
                                    vec![sampler::V1TopKTopP::FlashInfer, triton]
                                }
                            })
                        }
                    },
                },
                info,
                opened.config,
            )
        }
        (_, None) => unreachable!("non-synthetic models are opened above"),
    };
    // Kernel modules the CUDA driver loads on first use (lazy loading, PyTorch's default)
    // take device memory outside PyTorch's allocator: measured on the H200 with PyTorch 2.11
    // at Llama-3-8B's shapes in bf16, the process's memory outside the allocator went from
    // 0.514 GiB (the context) to 0.604 GiB while the weights were made and to 0.679 GiB
    // after the first eager forward of 8192 tokens (issue 46's measurement; a compiled pass
    // added nothing more). vLLM V1 counts both in its "non-torch" memory (its baseline is
    // taken before the load: 0.19 v1/worker/gpu_worker.py `init_snapshot`), V0 releases
    // do not here (their rows are reproduced as they were). vLLM's own kernels (custom ops,
    // FlashAttention, Triton) are not in these numbers: not modelled.
    let v1_sim = matches!(release.engine, super::vllm::Engine::V1 { .. })
        && matches!(req.device, DeviceSpec::Sim { .. });
    if v1_sim {
        rt.set_op("cuda-modules");
        rt.alloc_outside(
            "CUDA kernel modules loaded with the weights (PyTorch, measured: +0.090 GiB)",
            LOAD_MODULE_BYTES,
        )?;
        rt.set_op("load");
    }
    let weights_bytes = rt.stats().allocated - before_load;
    // A multimodal model's runner buffer `inputs_embeds [max_num_tokens, hidden]`: made with
    // the runner, outside the weights and before the profile (gpu_model_runner.py 0.11
    // L355-358; 0.10.0 L282-285), so in no term of vLLM's non-KV memory. From 0.11 a model
    // whose every modality is limited to 0 runs text-only (`supports_multimodal_inputs`,
    // multimodal/registry.py 0.11) and embeds its tokens as a text model does; 0.10.0's
    // dummy pass still reads the buffer (`is_multimodal_model`, L2135-2139).
    let mut runner_buffers = Vec::new();
    if let Workload::Model {
        model,
        encoder: Some(e),
        ..
    } = &work
    {
        if e.plan.is_some() || e.embeds_without_plan {
            rt.set_op("model_runner.inputs_embeds");
            let c = model.config();
            let buf = rt.tensor(
                "model_runner.inputs_embeds",
                Category::Activation,
                &[req.tokens, c.hidden_size],
                req.quant.activation_dtype(),
            )?;
            model.set_inputs_embeds(buf)?;
            // Qwen2.5-VL's `is_mm_embed_buffers`: two bool `[max_num_tokens]` buffers made
            // with the runner for a model that takes multimodal inputs (gpu_model_runner.py
            // 0.19 L718-724; 0.15.1 the same). (Gemma 3's and Mistral 3's rows leave them out.)
            // Gone from 0.21: `is_mm_embed` is a host tensor (gpu_model_runner.py 0.21.0 L2994).
            if model.config().qwen2_5_vl.is_some() && release.minor().is_some_and(|m| m < 21) {
                rt.set_op("model_runner.is_mm_embed");
                for i in 0..2 {
                    runner_buffers.push(rt.tensor(
                        format!("model_runner.is_mm_embed.{i}"),
                        Category::Activation,
                        &[req.tokens],
                        DType::U8,
                    )?);
                }
            }
        }
        // M-RoPE's `mrope_positions`: int64 `[3, max_num_tokens + 1]` (one column more on
        // purpose), made with the runner whatever the image limit (`uses_mrope`,
        // gpu_model_runner.py 0.19 L728-741) and kept; the text pass reads its first
        // `num_tokens` columns instead of `positions` (`_get_positions`, L926-931).
        if model.config().qwen2_5_vl.is_some() {
            rt.set_op("model_runner.mrope_positions");
            runner_buffers.push(rt.tensor(
                "model_runner.mrope_positions",
                Category::Activation,
                &[3, req.tokens + 1],
                DType::I64,
            )?);
        }
    }
    // Model Runner V2's sampler state, made with the runner after the weights are measured
    // and kept: `prompt_bin_mask` [max_num_reqs, ⌈V/32⌉] and `output_bin_counts`
    // [max_num_reqs, V], int32 (0.22.1 v1/worker/gpu/sample/penalties.py:32-42, made in
    // `__init__`; from 0.25.1 in `load_model` after `DeviceMemoryProfiler`).
    let _v2_state = match (&work, v2) {
        (Workload::Model { model, .. }, true) => {
            rt.set_op("model_runner_v2.sampler_state");
            let v = model.config().vocab_size;
            Some([
                rt.tensor(
                    "penalties.prompt_bin_mask",
                    Category::Sampler,
                    &[req.seqs, v.div_ceil(32)],
                    DType::I32,
                )?,
                rt.tensor(
                    "penalties.output_bin_counts",
                    Category::Sampler,
                    &[req.seqs, v],
                    DType::I32,
                )?,
            ])
        }
        _ => None,
    };
    let weights_tensor_bytes = match &work {
        Workload::Model { model, encoder, .. } => {
            model.weight_bytes()
                + encoder
                    .as_ref()
                    .and_then(|e| e.vision.as_ref())
                    .map_or(0, |v| v.weight_bytes())
        }
        Workload::Synthetic { .. } => weights_bytes,
    };
    if release.load_max_split_mib.is_some() {
        rt.set_max_split(None);
    }
    rt.empty_cache();
    rt.reset_peak();
    let t1 = checkpoint(&rt, "t1");
    rt.reset_process_peak();

    rt.progress(Progress::Phase(Phase::Profiling));
    let verify_count = if req.verify {
        release.listed_formulas().len() as u32 + 1
    } else {
        0
    };
    let mut passes = Vec::new();
    let mut outside = None;
    let mut logits_top = Vec::new();
    let mut sampled = Vec::new();
    // V1's profile run has no attention metadata: its attention layers return zeros. The
    // serving passes after it (verify) attend for real.
    let v1 = matches!(release.engine, super::vllm::Engine::V1 { .. });
    if let (true, Workload::Model { model, .. }) = (v1, &work) {
        model.set_skip_attention(true);
    }
    if let Workload::Model {
        encoder: Some(e), ..
    } = &work
    {
        e.armed.set(true);
    }
    // From 0.31 the profile run is under a 20 MiB split limit too, lifted before
    // `memory_profiling` measures (`Release::profile_max_split_mib`).
    if let Some(m) = release.profile_max_split_mib {
        rt.set_max_split(Some(m << 20));
    }
    for p in 1..=req.passes {
        rt.progress(Progress::Pass {
            pass: p,
            of: req.passes + verify_count,
            verify: None,
        });
        if p == 1 && req.outside_during > 0 {
            rt.set_pass(1);
            rt.set_op("nccl-init");
            outside = Some(rt.alloc_outside("nccl-like (--outside-during)", req.outside_during)?);
        }
        let (stats, out) = one_pass(&rt, &work, p, None, p == req.passes)?;
        if p == 1 && v1_sim {
            // Held as long as the process (a simulated outside allocation is never freed
            // unless asked).
            rt.set_op("cuda-modules");
            rt.alloc_outside(
                "CUDA kernel modules loaded by the first forward (PyTorch, measured: +0.075 GiB)",
                FORWARD_MODULE_BYTES,
            )?;
        }
        if p == req.passes && out.vocab > 0 && !out.logits_head.is_empty() {
            logits_top = top_logits(&out.logits_head, out.vocab, 5);
            sampled = out.sampled;
        }
        passes.push(stats);
    }
    if req.outside_during_freed {
        if let Some(o) = outside.take() {
            rt.set_op("nccl-free");
            rt.free_outside("nccl-like (--outside-during)", o);
        }
    }
    if let Workload::Model { model, encoder, .. } = &work {
        model.set_skip_attention(false);
        if let Some(e) = encoder {
            e.armed.set(false);
        }
    }
    if release.profile_max_split_mib.is_some() {
        rt.set_max_split(None);
    }
    rt.set_pass(0);
    rt.synchronize()?;
    let t2 = checkpoint(&rt, "t2");
    let truth_peak = rt.process_peak();
    // From 0.19 vLLM captures its graph estimate's samples inside `memory_profiling`, after
    // the profile run (0.19.0 v1/worker/gpu_worker.py L366-381, 0.21.0 L388-407): those are
    // the process's first graphs, and the driver's first-capture reservation stays when
    // they go, so the non-torch increase read at the context's exit holds it.
    let estimate_in_profile = v1_sim
        && matches!(release.graphs, super::vllm::Graphs::V1 { .. })
        && release.estimator_for(v2) != super::vllm::Estimator::Absent
        && !req.enforce_eager
        && req.kv_cache_memory.is_none()
        && matches!(work, Workload::Model { .. });
    if estimate_in_profile {
        rt.set_op("cuda-graph-driver");
        rt.alloc_outside(
            "CUDA driver's first graph capture (the graph estimate's; PyTorch, measured: +70 MiB)",
            FIRST_CAPTURE_DRIVER_BYTES,
        )?;
    }
    rt.empty_cache();
    let t3 = checkpoint(&rt, "t3");

    rt.progress(Progress::Phase(Phase::Measuring));
    let cps = Checkpoints { t0, t1, t2, t3 };
    // Each rank caches its own KV heads (vLLM's `get_num_kv_heads(parallel_config)`).
    let kv_heads = match rt.tp() {
        Some(t) => crate::model::layers::tp::TpShard::new(t.rank, t.size).local_kv_heads(&cfg),
        None => cfg.num_kv_heads,
    };
    let kv_dtype = req
        .kv_cache_dtype
        .storage_dtype(req.quant.activation_dtype());
    // MLA caches one latent per token and layer, whole on every rank (its `num_kv_heads`
    // is 1 whatever the tensor parallelism: 0.19 config/model.py L1217-1221).
    let (kv_heads, kv_dim) = match &cfg.deepseek {
        Some(d) => (1, d.latent_dim()),
        None => (kv_heads, cfg.head_dim),
    };
    // Each pipeline stage caches its own layers (its KV cache spec holds only them:
    // gpu_model_runner.py `get_kv_cache_spec` over the stage's attention layers).
    let cached_layers = rt.pp().map_or(cfg.num_layers, |p| p.layers.len());
    let geometry = KvGeometry {
        block_size: req.block_size,
        num_layers: cached_layers as u64,
        num_kv_heads: kv_heads as u64,
        head_dim: kv_dim as u64,
        dtype_bytes: kv_dtype.size_bytes(),
        latent: cfg.deepseek.is_some(),
        max_model_len: req.max_model_len,
        // V1 groups a model's sliding-window and full-attention layers (Gemma), or its
        // full-attention and state layers (Qwen3-Next): see HybridKv.
        hybrid: match (&cfg.gemma, v1) {
            _ if cfg.qwen3_next.is_some() && v1 => cfg.qwen3_next.as_ref().and_then(|q| {
                let (full, state) = q.layer_counts();
                formulas::HybridKv::of_state_layers(full as u64, state as u64, req.tokens as u64)
                    .map(|h| formulas::HybridKv {
                        mamba_align: rt.gdn_rules().prefix_caching_align,
                        ..h
                    })
            }),
            (Some(g), true) => g.sliding_window.and_then(|w| {
                let sliding = (0..cfg.num_layers).filter(|&l| g.is_sliding(l)).count() as u64;
                formulas::HybridKv::of_layers(
                    cfg.num_layers as u64 - sliding,
                    sliding,
                    w as u64,
                    req.tokens as u64,
                )
            }),
            // gpt-oss: the even layers slide (its sinks leave the page as it is: the same
            // `SlidingWindowSpec` and `FullAttentionSpec` pages, 0.19 attention.py).
            (None, true) => cfg
                .gpt_oss
                .as_ref()
                .and_then(|g| {
                    let sliding = (0..cfg.num_layers).filter(|&l| g.is_sliding(l)).count() as u64;
                    formulas::HybridKv::of_layers(
                        cfg.num_layers as u64 - sliding,
                        sliding,
                        g.sliding_window as u64,
                        req.tokens as u64,
                    )
                })
                // Llama 4's chunked local and full layers, when the release keeps the hybrid
                // manager on for them.
                .or_else(|| llama4_chunked_hybrid(&cfg, release, req.tokens as u64)),
            _ => None,
        },
    };
    let budget = formulas::budget(t0.total, req.util, false);
    let truth_non_kv = truth_peak as i64;
    let mut results: Vec<FormulaResult> = release
        .listed_formulas()
        .iter()
        .map(|&id| {
            let t = formulas::evaluate(id, &cps, weights_bytes, req.util);
            FormulaResult {
                id,
                title: id.title().to_string(),
                torch_peak_bytes: t.torch_peak_bytes,
                non_torch_bytes: t.non_torch_bytes,
                weights_term_bytes: t.weights_term_bytes,
                non_kv_bytes: t.non_kv_bytes,
                kv_bytes: t.kv_bytes,
                kv_blocks: geometry.blocks(t.kv_bytes),
                kv_tokens: geometry.tokens(t.kv_bytes),
                max_concurrency: geometry.max_concurrency(t.kv_bytes),
                error_bytes: t.non_kv_bytes - truth_non_kv,
                verify: None,
            }
        })
        .collect();
    let truth_kv = budget - truth_non_kv;
    let mut truth = Truth {
        non_kv_bytes: truth_non_kv,
        kv_bytes: truth_kv,
        kv_blocks: geometry.blocks(truth_kv),
        kv_tokens: geometry.tokens(truth_kv),
        max_concurrency: geometry.max_concurrency(truth_kv),
        source: device_info.truth_source.clone(),
        verify: None,
    };
    let quant_state_after_bytes = rt.events_since(0, |ev| {
        ev.iter()
            .filter(|e| e.category == Category::QuantState)
            .map(|e| match e.kind {
                EventKind::Alloc => e.bytes as i64,
                EventKind::Free => -(e.bytes as i64),
                _ => 0,
            })
            .sum::<i64>()
            .max(0) as u64
    });
    let outside_framework_bytes = t3.process_used.saturating_sub(t3.reserved);

    // Device memory of other processes, as it stood when the instance started.
    let others = (t0.total - t0.free).saturating_sub(t0.process_used);
    // With tensor parallel the engine takes the fewest blocks over the ranks, and every rank
    // then allocates that many: the verify passes run with the engine's count.
    let engine_blocks: Option<Vec<u64>> = match rt.world() {
        Some((world_rank, world)) => {
            let mine: Vec<u64> = results
                .iter()
                .map(|r| r.kv_blocks)
                .chain([truth.kv_blocks])
                .collect();
            let all = world.all_gather_u64(world_rank, &mine)?;
            Some(
                (0..mine.len())
                    .map(|i| all.iter().map(|v| v[i]).min().unwrap_or(0))
                    .collect(),
            )
        }
        None => None,
    };
    let engine_kv = |i: usize, own: i64| -> i64 {
        match &engine_blocks {
            Some(b) => (b[i] * geometry.block_bytes()) as i64,
            None => own,
        }
    };
    // V1's CUDA graphs: where they are reproduced, on dry and CUDA devices.
    let release_graphs = !matches!(release.graphs, super::vllm::Graphs::NotModelled)
        && !req.enforce_eager
        && matches!(work, Workload::Model { .. });
    let graphs_note = if !release_graphs {
        None
    } else if rt.backend() == crate::device::Backend::Cpu {
        Some(
            "CUDA graphs are captured on dry and CUDA devices; this compute run on the CPU has \
             none (run it dry for their memory)"
                .to_string(),
        )
    } else if rt.backend() == crate::device::Backend::Cuda && rt.tp().is_some() {
        Some("CUDA graphs with tensor parallel are captured on dry devices only so far".into())
    } else if rt.backend() == crate::device::Backend::Cuda
        && (cfg.moe.is_some() || !matches!(req.quant, Quant::F16 | Quant::BF16))
    {
        Some(format!(
            "CUDA graphs of {} are captured on dry devices only so far (their GPU path \
             reads back to the host: MoE routing, int8 outliers)",
            if cfg.moe.is_some() {
                "a mixture of experts".to_string()
            } else {
                format!("--quant {}", req.quant)
            }
        ))
    } else {
        None
    };
    let plan = match (&work, release_graphs && graphs_note.is_none()) {
        (Workload::Model { model, .. }, true) => release.capture_plan_for(
            req.seqs,
            req.tokens,
            model.config().gpt_oss.as_ref().map(|_| {
                // gpt-oss's config class: 1024 from 0.11.1 on, 0.11.0's list up to 992.
                if release.name == "0.11" {
                    992
                } else {
                    1024
                }
            }),
        ),
        _ => Vec::new(),
    };
    let estimate = match (&work, release.estimator_for(v2)) {
        (Workload::Model { model, .. }, e)
            // `--kv-cache-memory` skips vLLM's memory profiling, the estimator with it.
            if !plan.is_empty()
                && e != super::vllm::Estimator::Absent
                && req.kv_cache_memory.is_none() =>
        {
            rt.progress(Progress::Phase(Phase::Measuring));
            Some(super::graphs::estimate(
                &rt,
                model,
                &plan,
                &geometry,
                kv_dtype,
                e == super::vllm::Estimator::Applied,
                super::graphs::Style::V1 {
                    triton: req.quant == Quant::F32,
                },
            )?)
        }
        _ => None,
    };
    if req.verify {
        rt.progress(Progress::Phase(Phase::Verifying));
        let mut index = req.passes;
        for (fi, r) in results.iter_mut().enumerate() {
            index += 1;
            rt.progress(Progress::Pass {
                pass: index,
                of: req.passes + verify_count,
                verify: Some(r.id.short().into()),
            });
            let (v, stats) = verify(
                &rt,
                &work,
                &geometry,
                kv_dtype,
                engine_kv(fi, r.kv_bytes),
                budget as u64,
                others,
                index,
                r.id.key(),
                1,
            )?;
            r.verify = Some(v);
            passes.extend(stats);
        }
        index += 1;
        rt.progress(Progress::Pass {
            pass: index,
            of: req.passes + verify_count,
            verify: Some("truth".into()),
        });
        let (v, stats) = verify(
            &rt,
            &work,
            &geometry,
            kv_dtype,
            engine_kv(release.listed_formulas().len(), truth.kv_bytes),
            budget as u64,
            others,
            index,
            "truth",
            1,
        )?;
        truth.verify = Some(v);
        passes.extend(stats);
    }
    let true_max = if req.true_max {
        rt.progress(Progress::Phase(Phase::Verifying));
        Some(true_maximum(
            &rt,
            &work,
            &geometry,
            kv_dtype,
            truth.kv_blocks,
            budget as u64,
            others,
            req.passes + verify_count + 1,
        )?)
    } else {
        None
    };
    // V1's sampler warm-up after the KV cache (and the graphs): where the release runs it,
    // with the sampler on, on dry and CUDA devices (as the graphs).
    let warm_reqs = release.sampler_warm_up_reqs(v2, req.seqs, req.tokens);
    let (warm_reqs, warm_up_note) = match (&work, warm_reqs) {
        (Workload::Model { .. }, None) if v2 => (
            None,
            Some(
                "Model Runner V2 warms up with `warmup_kernels` after the KV cache (two \
                 scheduler steps with SamplingParams.for_sampler_warmup(), 0.21.0 \
                 v1/worker/gpu_worker.py L687-689, gpu/warmup.py): not modelled"
                    .to_string(),
            ),
        ),
        (Workload::Model { sampler: None, .. }, Some(_)) => (
            None,
            Some("the sampler is off (--no-sampler): no sampler warm-up after the KV cache".into()),
        ),
        (Workload::Model { .. }, Some(_)) if rt.backend() == crate::device::Backend::Cpu => (
            None,
            Some(
                "the sampler warm-up after the KV cache runs on dry and CUDA devices; this \
                 compute run on the CPU has none (run it dry for its memory)"
                    .to_string(),
            ),
        ),
        (Workload::Model { .. }, n) => (n, None),
        _ => (None, None),
    };
    // The KV cache of the release's own grant, as the instance allocates it after the
    // profile: every rank the engine's count, the fewest over the ranks.
    let kv_blocks = if plan.is_empty() && warm_reqs.is_none() {
        0
    } else {
        let applied = estimate
            .as_ref()
            .filter(|e| e.applied)
            .map_or(0, |e| e.total_bytes);
        // `--kv-cache-memory` is the grant itself (the report's answer reads it the same way).
        let own = match req.kv_cache_memory {
            Some(given) => given as i64,
            None => results
                .iter()
                .find(|r| r.id == release.formula)
                .map_or(0, |r| {
                    super::report::release_kv_bytes(
                        release, r.kv_bytes, t0.total, req.util, applied,
                    )
                }),
        };
        let mut blocks = geometry.blocks(own);
        if let Some((world_rank, world)) = rt.world() {
            let all = world.all_gather_u64(world_rank, &[blocks])?;
            blocks = all.iter().map(|v| v[0]).min().unwrap_or(0);
        }
        blocks
    };
    // The warm-up runs on the last pipeline rank only (gpu_worker.py 0.19.0 L666).
    let warm_reqs = warm_reqs.filter(|_| rt.pp().is_none_or(|p| p.is_last()));
    let warm_batch = match &work {
        Workload::Model { model, .. } => warm_reqs.map(|n| {
            (
                n,
                model.config().vocab_size,
                Batch::dummy(n, n, model.config().vocab_size),
            )
        }),
        Workload::Synthetic { .. } => None,
    };
    // `_dummy_run(max_num_reqs, cudagraph_runtime_mode=NONE)`: no attention metadata, so
    // attention returns zeros, as in the profile; then `_dummy_sampler_run`.
    let warm_pass = |batch: &Batch| -> Result<()> {
        if let Workload::Model { model, .. } = &work {
            model.set_skip_attention(true);
        }
        let out = work.forward_batch(&rt, Some(batch), false);
        if let Workload::Model { model, .. } = &work {
            model.set_skip_attention(false);
        }
        out.map(drop)
    };
    let mut warm_fn;
    let warm_spec = match &warm_batch {
        Some((n, vocab, batch)) => {
            warm_fn = || warm_pass(batch);
            Some(super::warmup::WarmUpSpec {
                num_reqs: *n,
                vocab: *vocab,
                empty_first: release.empties_cache_after_capture(),
                pass: &mut warm_fn,
            })
        }
        None => None,
    };
    let mut warm_up = None;
    let graphs = match &work {
        Workload::Model { model, .. } if !plan.is_empty() => {
            rt.set_pass(0);
            rt.progress(Progress::Phase(Phase::Verifying));
            let style = match release.graphs {
                super::vllm::Graphs::V0 { attention } => super::graphs::Style::V0 {
                    attention,
                    sms: sms.unwrap_or(132) as usize,
                    // max_seq_len_to_capture = min(8192, max_model_len), in whole blocks.
                    keys: (req.max_model_len.min(8192) as usize).div_ceil(req.block_size as usize)
                        * req.block_size as usize,
                    hopper,
                },
                _ => super::graphs::Style::V1 {
                    triton: req.quant == Quant::F32,
                },
            };
            let (g, w) = super::graphs::capture(
                &rt, model, &plan, &geometry, kv_dtype, kv_blocks, others, estimate, style,
                warm_spec,
            )?;
            warm_up = w;
            Some(g)
        }
        _ => {
            if let Some(spec) = warm_spec {
                rt.set_pass(0);
                rt.progress(Progress::Phase(Phase::Verifying));
                warm_up = super::warmup::eager(&rt, &geometry, kv_dtype, kv_blocks, others, spec)?;
            }
            None
        }
    };
    rt.set_pass(0);
    rt.progress(Progress::Phase(Phase::Done));
    let encoder = match &work {
        Workload::Model {
            encoder: Some(e), ..
        } => {
            let (peak, held) = e.stats.get().unwrap_or((t1.allocated, 0));
            let phase_peak = peak.saturating_sub(t1.allocated);
            let pass_peak = t2.allocated_peak.saturating_sub(t1.allocated);
            Some(super::report::EncoderReport {
                weights_bytes: e.vision.as_ref().map_or(0, |v| v.weight_bytes()),
                plan: e.plan.clone(),
                phase_peak_bytes: phase_peak,
                held_bytes: held,
                peak_share_bytes: if phase_peak >= pass_peak {
                    phase_peak
                } else {
                    held
                },
                attention: match e.vision {
                    Some(_) => e.attention.into(),
                    None => "none (tower not built)".into(),
                },
                runner: if e.v2_no_profile {
                    Some(super::report::EncoderRunner::V2NoProfile)
                } else if e.frees_inputs {
                    Some(super::report::EncoderRunner::V2FreesInputs)
                } else {
                    None
                },
            })
        }
        _ => None,
    };
    let events = rt.take_events();
    let (device_samples, sample_rate_hz) = rt.device_samples();
    drop(work);
    drop(runner_buffers);
    Ok(Report {
        format: REPORT_FORMAT,
        tool: format!("vramscope {}", env!("CARGO_PKG_VERSION")),
        created_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: model_info,
        quant: req.quant,
        device: device_info,
        settings: req.clone(),
        checkpoints: cps,
        weights_bytes,
        weights_tensor_bytes,
        kv_geometry: geometry,
        formulas: results,
        truth,
        true_max,
        passes,
        quant_state_after_bytes,
        outside_framework_bytes,
        other_process_bytes,
        logits: logits_top,
        sampled_tokens: sampled.into_iter().take(LOGITS_ROWS).collect(),
        wall_time_s: wall.elapsed().as_secs_f64(),
        event_count: events.len(),
        events,
        device_samples,
        sample_rate_hz,
        tp: req.tp,
        // vLLM's global rank: the data-parallel replica's ranks after the replicas before it
        // (`initialize_model_parallel`: dp × pp × tp).
        rank: rt.pp().map_or(rt.tp().map_or(0, |t| t.rank as u32), |p| {
            p.world_rank as u32
        }) + rt.moe_group().map_or(0, |g| {
            (g.rank / req.tp.max(1) as usize) as u32 * req.tp * req.pp
        }),
        pp: req.pp,
        stage: rt.pp().map(|p| super::report::StageInfo {
            stage: p.stage as u32,
            first_layer: p.layers.start as u32,
            end_layer: p.layers.end as u32,
            tp_rank: rt.tp().map_or(0, |t| t.rank as u32),
        }),
        ranks: Vec::new(),
        engine: Vec::new(),
        nccl_source,
        graphs,
        graphs_note,
        warm_up,
        warm_up_note,
        vllm_notes: mla_backend
            .as_ref()
            .and_then(|b| b.note.clone())
            .into_iter()
            .chain(llama4_notes(&cfg, release))
            .chain(hybrid_pages.iter().flat_map(|h| h.log_lines()))
            .chain(
                encoder
                    .as_ref()
                    .and_then(|e| e.plan.as_ref())
                    .map(|p| format!("INFO gpu_model_runner.py] {}", p.log_line())),
            )
            .collect(),
        encoder,
    })
}

/// V1's KV cache groups for Llama 4 (its RoPE layers `ChunkedLocalAttentionSpec`, its NoPE
/// layers full) when the release keeps the hybrid manager on for chunked local attention;
/// `None` otherwise: every layer then holds every token (`unify_hybrid_kv_cache_specs`).
fn llama4_chunked_hybrid(
    cfg: &model::ModelConfig,
    release: &super::vllm::Release,
    max_num_batched_tokens: u64,
) -> Option<formulas::HybridKv> {
    let l4 = cfg.llama4.as_ref()?;
    let chunk = l4.attention_chunk_size?;
    if !release.chunked_local_hybrid {
        return None;
    }
    let chunked = (0..cfg.num_layers).filter(|&l| l4.uses_rope(l)).count() as u64;
    formulas::HybridKv::of_chunked_layers(
        cfg.num_layers as u64 - chunked,
        chunked,
        chunk as u64,
        max_num_batched_tokens,
    )
}

/// What a V1 release logs for Llama 4 before it sizes the KV cache, in its words: with the
/// hybrid manager off for chunked local attention (0.11.0), its warning
/// (config/__init__.py L520-526) and `unify_hybrid_kv_cache_specs`'s (v1/core/
/// kv_cache_utils.py L1111-1115), every layer then full-size.
fn llama4_notes(cfg: &model::ModelConfig, release: &super::vllm::Release) -> Vec<String> {
    let v1 = matches!(release.engine, super::vllm::Engine::V1 { .. });
    let chunked = cfg.llama4.as_ref().is_some_and(|l| {
        l.attention_chunk_size.is_some() && (0..cfg.num_layers).any(|i| l.uses_rope(i))
    });
    if !v1 || !chunked || release.chunked_local_hybrid {
        return Vec::new();
    }
    vec![
        "WARNING config/__init__.py] There is a latency regression when using chunked local attention with the hybrid KV cache manager. Disabling it, by default. To enable it, set the environment VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1.".into(),
        "WARNING kv_cache_utils.py] Hybrid KV cache manager is disabled for this hybrid model, This means we do not enable any optimizations for saving KV cache memory (e.g., dropping the KV cache outside the sliding window). The compute of layers like sliding window is still saved.".into(),
    ]
}

/// The largest KV cache that really serves: the most whole blocks with which, after the
/// profile pass, the instance runs `TRUE_MAX_SERVING_PASSES` max-batch passes with its peak
/// within floor(T·u) and no device OOM. Found by galloping from the truth's count (each probe
/// a verify run) and then bisecting; a dry run's probes are exact, a GPU's are real passes.
#[allow(clippy::too_many_arguments)]
fn true_maximum(
    rt: &Runtime,
    work: &Workload,
    geometry: &KvGeometry,
    kv_dtype: DType,
    start_blocks: u64,
    budget: u64,
    others: u64,
    index: u32,
) -> Result<TrueMax> {
    let block = geometry.block_bytes().max(1);
    let mut probes = 0u32;
    let mut probe = |blocks: u64| -> Result<Verify> {
        probes += 1;
        let (v, _) = verify(
            rt,
            work,
            geometry,
            kv_dtype,
            (blocks * block) as i64,
            budget,
            others,
            index,
            "true-max",
            TRUE_MAX_SERVING_PASSES,
        )?;
        Ok(v)
    };
    // lo fits (with its run in `at`; 0 blocks trivially), hi does not (with its run in
    // `above` once probed; u64::MAX while unknown). Each probe narrows the bracket, and the
    // two runs it ends on are the ones reported: no block count is run twice.
    let (mut lo, mut hi) = (0u64, u64::MAX);
    let (mut at, mut above): (Option<Verify>, Option<Verify>) = (None, None);
    let mut record = |b: u64, v: Verify, lo: &mut u64, hi: &mut u64| {
        if v.ran && v.within_budget {
            *lo = b;
            at = Some(v);
        } else {
            *hi = b;
            above = Some(v);
        }
    };
    let first = start_blocks.max(1);
    record(first, probe(first)?, &mut lo, &mut hi);
    // Gallop away from the truth's count until the bracket closes on both sides.
    let mut step = 1u64;
    while hi == u64::MAX {
        let b = lo + step;
        if b * block > budget {
            // More cache than the whole budget cannot fit: no run needed to know.
            hi = b;
            break;
        }
        record(b, probe(b)?, &mut lo, &mut hi);
        step *= 2;
    }
    step = 1;
    while lo == 0 && hi > 1 {
        let b = hi.saturating_sub(step).max(1);
        record(b, probe(b)?, &mut lo, &mut hi);
        step *= 2;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        record(mid, probe(mid)?, &mut lo, &mut hi);
    }
    let above = match above.filter(|_| hi == lo + 1) {
        Some(v) => v,
        None => probe(lo + 1)?,
    };
    Ok(TrueMax {
        blocks: lo,
        kv_bytes: lo * block,
        serving_passes: TRUE_MAX_SERVING_PASSES,
        probes,
        verify: at,
        one_more: above,
    })
}

/// What the worker's distributed setup keeps for the instance's life: framework tensors, and
/// device memory outside the framework (freed when this is dropped).
struct Distributed<'a> {
    rt: &'a Runtime,
    _kept: Vec<Tensor>,
    outside: Vec<(&'static str, OutsideAlloc)>,
}

impl Drop for Distributed<'_> {
    fn drop(&mut self) {
        for (label, a) in self.outside.drain(..) {
            self.rt.free_outside(label, a);
        }
    }
}

/// vLLM's `init_worker_distributed_environment` after `init_gpu_memory` is read (worker.py
/// L150-177): the PyNcclCommunicator with its warm-up all-reduce, then the custom all-reduce's
/// buffers, kept (custom_all_reduce.py L152-167: `meta` of `meta_size() + max_size` bytes,
/// `buffer` and `rank_data` of 8 MiB): all three from the caching allocator up to 380e1863,
/// `meta` and `buffer` from `cudaMalloc` from 0.6.4 (`Release::custom_ar_ipc_buffers`).
/// Nothing with one GPU.
fn init_distributed<'a>(
    rt: &'a Runtime,
    release: &Release,
    comms: &[GroupComm],
) -> Result<Distributed<'a>> {
    let mut d = Distributed {
        rt,
        _kept: Vec::new(),
        outside: Vec::new(),
    };
    rt.set_op("init_distributed");
    rt.set_layer(None);
    let Some(tp) = rt.tp() else {
        init_groups(rt, release, &mut d, true, comms)?;
        return Ok(d);
    };
    rt.ensure_comm(crate::device::group::CommSetup::PyncclInit)?;
    if tp.custom_ar {
        use crate::device::group::{CUSTOM_AR_MAX_BYTES, CUSTOM_AR_META_BYTES};
        for (name, bytes, ipc) in [
            (
                "custom_all_reduce.meta",
                CUSTOM_AR_META_BYTES + CUSTOM_AR_MAX_BYTES,
                release.custom_ar_ipc_buffers,
            ),
            (
                "custom_all_reduce.buffer",
                CUSTOM_AR_MAX_BYTES,
                release.custom_ar_ipc_buffers,
            ),
            ("custom_all_reduce.rank_data", 8 << 20, false),
        ] {
            if ipc {
                let a = rt.alloc_outside(name, bytes)?;
                d.outside.push((name, a));
            } else {
                d._kept
                    .push(rt.reserve_bytes(name, Category::Workspace, bytes)?);
            }
        }
    }
    init_groups(rt, release, &mut d, false, comms)?;
    Ok(d)
}

/// The communicators of the other groups, made after the tensor-parallel group's in
/// `initialize_model_parallel`'s order (0.11.0 parallel_state.py L1152-1206, 0.19.0
/// L1575-1685: TP, PP, DP, EP), each a PyNcclCommunicator with its warm-up all-reduce kept for
/// the instance's life; the first of the process carries NCCL's once-per-process image and
/// kernel stack. The pipeline group's send/recv connections open at the first served step,
/// after the KV cache is sized (gpu_worker.py 0.19 L790-825, `irecv_tensor_dict` /
/// `isend_tensor_dict`): in no budget.
fn init_groups(
    rt: &Runtime,
    release: &Release,
    d: &mut Distributed<'_>,
    first_in_process: bool,
    comms: &[GroupComm],
) -> Result<()> {
    for (i, c) in comms.iter().enumerate() {
        let first = first_in_process && i == 0;
        let bytes = rt
            .with_device(|dev| dev.group_comm_bytes(release.nccl, first, c.across))
            .ok_or_else(|| {
                Error::Request(format!(
                    "{}: pipeline, data and expert parallel groups run on simulated devices only so far (no GPU was lent to measure their NCCL)",
                    c.label
                ))
            })?;
        let a = rt.alloc_outside(c.label, bytes)?;
        d.outside.push((c.label, a));
    }
    Ok(())
}

/// Whether release `0.minor` runs a hybrid model's state layers with prefix caching ("align"):
/// as the line sets it from 0.15, on by default from 0.28 (`GdnRules::prefix_caching_align`);
/// 0.10/0.11 turn it off.
fn hybrid_prefix_caching(req: &ProfileRequest, minor: u32) -> bool {
    minor >= 15
        && req
            .prefix_caching
            .unwrap_or(crate::engine::rules::GdnRules::for_minor(minor, false).prefix_caching_align)
}

/// `HybridAttentionMambaModelConfig.verify_and_update_config` for a Qwen3-Next model on a
/// rank of `tp` (0.10.2 model_executor/models/config.py L327-414, 0.11.0 L314-401): the
/// attention page of one token (`FullAttentionSpec(block_size=1)`: K and V of this rank's KV
/// heads in the KV cache dtype), one sequence's state page (`gated_delta_net_state_shape`
/// and `_dtype`: `mamba_cache_dtype` auto is the model dtype), and the block size and padding
/// they give. V0 ran these models with its own `MambaCacheManager`, which is not modelled.
fn hybrid_state_pages(
    cfg: &crate::model::config::ModelConfig,
    q: &crate::model::config::Qwen3NextShape,
    req: &ProfileRequest,
    (tp, release, major): (usize, &super::vllm::Release, u32),
) -> Result<formulas::HybridPages> {
    if !matches!(release.engine, super::vllm::Engine::V1 { .. }) {
        return Err(Error::Request(format!(
            "model_type {} under vLLM {}: V0's MambaCacheManager for state layers is not modelled; choose a V1 release (0.11 or later)",
            cfg.arch, release.name
        )));
    }
    let kv_heads = crate::model::layers::tp::TpShard::new(0, tp).local_kv_heads(cfg);
    let act = req.quant.activation_dtype();
    let kv_bytes = req.kv_cache_dtype.storage_dtype(act).size_bytes();
    let (conv, ssm) = q.state_elements(tp);
    let minor = release.minor().unwrap_or(11);
    let prefix_caching = hybrid_prefix_caching(req, minor);
    if minor >= 33 && major == 9 && prefix_caching {
        return Err(Error::Request(format!(
            "model_type {} under vLLM {} on Hopper with prefix caching (on by default): \
             FlashInfer's Gated DeltaNet prefill checkpoints are not modelled (576-token \
             blocks, the workspace grown to [cdiv(max_num_batched_tokens, block), heads, \
             dv, dk] f32 and more warm-up calls: docs/reading/vllm-qwen3-next-mrv2.md); \
             add --no-enable-prefix-caching, or choose --vllm 0.31",
            cfg.arch, release.name
        )));
    }
    let pages = formulas::hybrid_pages_aligned(
        2 * kv_heads as u64 * cfg.head_dim as u64 * kv_bytes,
        formulas::MambaPage {
            conv_elements: conv,
            ssm_elements: ssm,
            dtype_bytes: act.size_bytes(),
        },
        req.block_size,
        if minor >= 21 {
            req.block_size.max(16)
        } else {
            16
        },
    );
    Ok(formulas::HybridPages {
        prefix_caching: match minor {
            ..=11 => formulas::HybridPrefixCaching::Disabled,
            _ if prefix_caching => formulas::HybridPrefixCaching::Align("Qwen3NextForCausalLM"),
            _ => formulas::HybridPrefixCaching::OffByDefault,
        },
        ..pages
    })
}

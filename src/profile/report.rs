//! The Report: everything a run measured, as plain data. Views and exports read it and never
//! recompute; a saved session is this struct as JSON.

use serde::{Deserialize, Serialize};

use super::formulas::{Checkpoints, FormulaId, KvGeometry};
use super::request::ProfileRequest;
use super::vllm::{LogStyle, Release};
use crate::device::DeviceInfo;
use crate::memory::Event;
use crate::quant::Quant;

pub const REPORT_FORMAT: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub source: String,
    pub arch: String,
    pub parameters: u64,
    pub layers: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// A mixture of experts' parameters in its experts (all resident; 0 for a dense model,
    /// and then not written: a dense model's report is what it was before MoE).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expert_parameters: u64,
    /// A mixture of experts' parameters each token multiplies with (the router and `top_k`
    /// experts of each MoE layer, everything else); 0 (not written) for a dense model.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub active_parameters: u64,
    /// A mixture of experts' routed experts per MoE layer (0, not written, for a dense
    /// model).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub num_experts: usize,
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ModelInfo {
    /// What a mixture of experts keeps resident and what each token uses, in one sentence
    /// (`None` for a dense model): `tp` ranks share the experts' width, 16-bit weights.
    pub fn experts_sentence(&self, tp: u32) -> Option<String> {
        self.experts_sentence_as(tp, crate::quant::Quant::BF16)
    }

    /// `experts_sentence` for experts stored as `quant` says (fp8: one byte a parameter,
    /// the block scales left out).
    pub fn experts_sentence_as(&self, tp: u32, quant: crate::quant::Quant) -> Option<String> {
        if self.expert_parameters == 0 {
            return None;
        }
        let bytes = if quant == crate::quant::Quant::Fp8 {
            1
        } else {
            2
        };
        let per_rank = self.expert_parameters * bytes / u64::from(tp.max(1));
        self.experts_sentence_with(tp, per_rank)
    }

    /// `experts_sentence` with the bytes of experts a rank holds given (measured from the
    /// load: `Report::resident_expert_bytes`).
    pub fn experts_sentence_with(&self, tp: u32, per_rank: u64) -> Option<String> {
        if self.expert_parameters == 0 {
            return None;
        }
        let b = |n: u64| format!("{:.1} B", n as f64 / 1e9);
        Some(format!(
            "mixture of experts: {} of its {} parameters are the experts' ({} of weights{}, all resident); {} are active per token",
            b(self.expert_parameters),
            b(self.parameters),
            crate::base::units::fmt_u(per_rank),
            if tp > 1 { " a rank" } else { "" },
            b(self.active_parameters),
        ))
    }

    /// A workload that is not a model (a synthetic scenario, a PyTorch snapshot): its name,
    /// where it came from and what it is, every shape zero.
    pub fn without_shapes(name: String, source: String, arch: &str) -> Self {
        ModelInfo {
            name,
            source,
            arch: arch.into(),
            parameters: 0,
            layers: 0,
            hidden_size: 0,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            vocab_size: 0,
            expert_parameters: 0,
            num_experts: 0,
            active_parameters: 0,
        }
    }
}

/// The strongest check of a budget: allocate the KV cache it grants and run one more max-batch
/// pass inside T·u: no framework segment may take this instance over floor(T·u) (plus the KV
/// tensor's allocator padding); as PyTorch's allocator does under a memory limit, it gives
/// cached segments back and retries first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verify {
    /// False when the budget grants no KV memory (nothing to allocate).
    pub ran: bool,
    /// The KV cache granted: whole blocks × block bytes.
    pub kv_allocated_bytes: u64,
    /// Allocator rounding charged off the KV tensor; 0 since the verify pass runs uncapped, as
    /// vLLM does (reports of format 1 capped it at floor(T·u)).
    #[serde(default)]
    pub kv_padding_bytes: u64,
    /// This instance's peak device memory during the verify pass (KV cache included).
    pub peak_process_bytes: u64,
    /// floor(T·u).
    pub budget_bytes: u64,
    /// The pass got through and its peak stayed within floor(T·u).
    pub within_budget: bool,
    /// peak − floor(T·u): positive = "over budget by" that much (the promise of
    /// `gpu_memory_utilization` broken, which is not an OOM by itself).
    pub overrun_bytes: i64,
    /// The device really ran out of memory (allocating the cache or during the pass), with
    /// the other processes' memory on it.
    pub oom: bool,
    /// How often the allocator gave its cached segments back and retried after the device
    /// refused a segment (0 in reports written before this was counted).
    #[serde(default)]
    pub cache_releases: u64,
    /// Device memory left at the instance's peak: total − other processes − peak (negative
    /// with an OOM: what was missing).
    #[serde(default)]
    pub device_room_left_bytes: i64,
    pub message: String,
}

impl Verify {
    /// One short phrase, as the CLI's table prints it.
    pub fn short(&self) -> String {
        if !self.ran {
            "no KV memory".into()
        } else if self.oom {
            "OOM".into()
        } else if self.within_budget {
            format!(
                "ok ({} spare)",
                crate::base::units::fmt_i(-self.overrun_bytes)
            )
        } else {
            format!(
                "over budget by {}",
                crate::base::units::fmt_i(self.overrun_bytes)
            )
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FormulaResult {
    pub id: FormulaId,
    pub title: String,
    pub torch_peak_bytes: i64,
    pub non_torch_bytes: i64,
    pub weights_term_bytes: i64,
    pub non_kv_bytes: i64,
    pub kv_bytes: i64,
    pub kv_blocks: u64,
    pub kv_tokens: u64,
    pub max_concurrency: f64,
    /// non_kv − truth: positive = KV memory wasted, negative = the cache it grants would
    /// overrun the budget.
    pub error_bytes: i64,
    pub verify: Option<Verify>,
}

/// The most KV blocks with which the instance, after the profile pass, runs `serving_passes`
/// max-batch passes within floor(T·u) and without a device OOM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrueMax {
    pub blocks: u64,
    pub kv_bytes: u64,
    pub serving_passes: u32,
    /// Verify runs the search took.
    pub probes: u32,
    /// The run with `blocks` (none when not even one block fits).
    pub verify: Option<Verify>,
    /// The run with one block more, which does not fit.
    pub one_more: Verify,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Truth {
    /// G: the instance's own peak device memory during the profile passes.
    pub non_kv_bytes: i64,
    pub kv_bytes: i64,
    pub kv_blocks: u64,
    pub kv_tokens: u64,
    pub max_concurrency: f64,
    /// How G was measured.
    pub source: String,
    pub verify: Option<Verify>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PassStats {
    /// 1-based; verify passes follow the profile passes.
    pub index: u32,
    /// Which budget a verify pass checks; `None` for profile passes.
    pub verify_for: Option<String>,
    pub start_us: u64,
    pub end_us: u64,
    pub peak_allocated: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    pub quant_state_allocated_bytes: u64,
    pub quant_state_freed_bytes: u64,
}

/// The top logits of one sequence's last token (compute modes only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopLogits {
    pub sequence: usize,
    /// (token id, logit), best first.
    pub top: Vec<(u32, f32)>,
}

pub use crate::device::DeviceSample;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub format: u32,
    pub tool: String,
    pub created_unix_s: u64,
    pub model: ModelInfo,
    pub quant: Quant,
    pub device: DeviceInfo,
    pub settings: ProfileRequest,
    pub checkpoints: Checkpoints,
    /// W: framework allocated after the load minus before.
    pub weights_bytes: u64,
    /// The weight tensors' own sizes, summed (W less the allocator's rounding: PyTorch keeps a
    /// large block whole when splitting would leave 1 MiB or less of its segment).
    #[serde(default)]
    pub weights_tensor_bytes: u64,
    pub kv_geometry: KvGeometry,
    pub formulas: Vec<FormulaResult>,
    pub truth: Truth,
    /// The largest KV cache that really serves (`--true-max`), found by verify runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub true_max: Option<TrueMax>,
    pub passes: Vec<PassStats>,
    /// Quantization state (CxB, subB) alive after the profile passes.
    pub quant_state_after_bytes: u64,
    /// Device memory this instance holds outside the framework at t3 (context, workspaces,
    /// scenario allocations).
    pub outside_framework_bytes: u64,
    /// What `--outside-before` took from the device: the drop in free memory the other process
    /// caused. On a GPU its own CUDA context comes on top of the bytes asked for (0 when not
    /// set, and in reports written before this was kept).
    #[serde(default)]
    pub other_process_bytes: u64,
    pub logits: Vec<TopLogits>,
    /// The token the sampler drew for each of the first sequences in the last profile pass
    /// (empty on a dry run or without the sampler).
    #[serde(default)]
    pub sampled_tokens: Vec<u32>,
    pub wall_time_s: f64,
    pub event_count: usize,
    pub events: Vec<Event>,
    /// NVML readings taken during the run on a GPU (none on the simulated device, whose
    /// bookkeeping is exact in every event).
    #[serde(default)]
    pub device_samples: Vec<DeviceSample>,
    /// Readings per second the sampler reached.
    #[serde(default)]
    pub sample_rate_hz: Option<f64>,
    /// Tensor-parallel ranks of the instance (1: one GPU).
    #[serde(default = "one")]
    pub tp: u32,
    /// The rank these fields describe: with tensor parallel, the top level is the rank that
    /// binds #9516's budget, and `ranks` holds every rank's own report.
    #[serde(default)]
    pub rank: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<Report>,
    /// What the engine takes with tensor parallel, per formula and for the truth: the fewest
    /// KV blocks over the ranks (distributed_gpu_executor.py `determine_num_available_blocks`:
    /// `min(b[0] for b in num_blocks)`), and which rank sets it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine: Vec<EngineBudget>,
    /// With tensor parallel: where this rank's NCCL entries come from (the simulated
    /// topology's model and its sources, or NVML's measurement on GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_source: Option<String>,
    /// The CUDA graphs the release captures after its KV cache (V1 releases without
    /// `--enforce-eager`), with its estimate where it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graphs: Option<super::graphs::GraphReport>,
    /// Why no graphs were captured when the release would capture some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graphs_note: Option<String>,
    /// V1's sampler warm-up after the KV cache and the graphs (`compile_or_warm_up_model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_up: Option<super::warmup::SamplerWarmUp>,
    /// Why it did not run where the release runs one (or runs another, not modelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_up_note: Option<String>,
    /// What the release logs about this start before it profiles, in its words (MLA's
    /// "Forcing kv cache block size to 64 for FlashMLA backend.").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vllm_notes: Vec<String>,
    /// Pipeline stages of the instance (vLLM's `--pipeline-parallel-size`; 1 without). The
    /// ranks are `tp × pp`, rank `stage × tp + tp_rank`, as vLLM numbers its workers.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pp: u32,
    /// This rank's pipeline stage and its layers (`None` without pipeline parallel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<StageInfo>,
    /// A multimodal model's vision tower and its encoder profile (Gemma 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder: Option<EncoderReport>,
}

/// The encoder's share of a multimodal model's non-KV memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EncoderReport {
    /// The vision tower's and projector's weights on this rank (0 when the release skips
    /// them: `--limit-mm-per-prompt '{"image":0}'` from 0.15).
    pub weights_bytes: u64,
    /// The profile V1 runs; `None`: no encoder profile (every image limit 0).
    pub plan: Option<super::multimodal::EncoderPlan>,
    /// The framework's peak during the encoder phase over its level at t1.
    pub phase_peak_bytes: u64,
    /// What the encoder phase leaves allocated under the language model's pass: the dummy
    /// pixel values and the encoder cache's outputs.
    pub held_bytes: u64,
    /// The encoder's bytes in the profile's torch peak increase: all of it when the peak is
    /// the encoder phase's, else what it holds under the text pass.
    pub peak_share_bytes: u64,
    /// The vision attention backend (FlashAttention's varlen call or PyTorch's SDPA).
    pub attention: String,
    /// Where Model Runner V2 profiles the encoder otherwise than V1 (absent under V1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<EncoderRunner>,
}

/// How Model Runner V2 treats the encoder in the profile (docs/reading/vllm-mm-towers-v021.md
/// §0.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncoderRunner {
    /// 0.22-0.26: `profile_run` is the text pass alone (it reads the runner's
    /// `inputs_embeds`); the tower is loaded, never run.
    V2NoProfile,
    /// 0.27 on: `profile_encoder_cache` encodes as V1 does, and the dummy batch dies as
    /// `execute_mm_encoder` returns, before the text pass.
    V2FreesInputs,
}

/// The encoder's share of the non-KV memory: its weights, and its part of the profile's
/// torch peak increase (the encoder phase's own peak, or what it holds under the text pass).
impl Report {
    /// Bytes of routed-expert weights this rank holds after loading, from the load's events
    /// (every `….experts.…` weight made less those freed, the expert map left out); `None`
    /// when the events name none (a dense model, or a report without its events).
    pub fn resident_expert_bytes(&self) -> Option<u64> {
        use crate::memory::EventKind;
        let mut held = 0i64;
        for e in self.events.iter().filter(|e| {
            e.pass == 0
                && e.category == crate::memory::Category::Weight
                && e.tensor.contains(".experts.")
                && !e.tensor.contains("expert_map")
        }) {
            match e.kind {
                EventKind::Alloc => held += e.bytes as i64,
                EventKind::Free => held -= e.bytes as i64,
                _ => {}
            }
        }
        (held > 0).then_some(held as u64)
    }

    /// The mixture of experts' sentence with what this rank holds as measured from its load
    /// (`resident_expert_bytes`), or estimated from the parameters where the events name no
    /// experts.
    pub fn experts_sentence(&self) -> Option<String> {
        let ranks = self.tp.max(1) * self.settings.dp.max(1);
        match self.resident_expert_bytes() {
            Some(b) => self.model.experts_sentence_with(ranks, b),
            None => self.model.experts_sentence_as(ranks, self.quant),
        }
    }

    pub fn encoder_sentence(&self) -> Option<String> {
        let r = self;
        let e = self.encoder.as_ref()?;
        let t1 = r.checkpoints.t1.allocated;
        let peak = r.checkpoints.t2.allocated_peak.saturating_sub(t1);
        let pct = |a: u64, b: u64| {
            if b == 0 {
                0.0
            } else {
                100.0 * a as f64 / b as f64
            }
        };
        let non_kv = r
            .formulas
            .iter()
            .find(|f| f.id == super::formulas::FormulaId::Pr12126)
            .or(r.formulas.last())
            .map_or(0, |f| f.non_kv_bytes.max(0) as u64);
        let share = e.weights_bytes + e.peak_share_bytes;
        let held_what = if e.runner == Some(EncoderRunner::V2FreesInputs) {
            "the encoder cache; Model Runner V2 frees the pixel values first"
        } else {
            "pixel values and the encoder cache"
        };
        Some(match &e.plan {
        Some(p) => format!(
            "encoder (vision tower + projector): weights {} ({:.1} % of the weights); profile of {} {}s of {} tokens into a budget of {} tokens ({} attention): its phase peaks at {}, it holds {} ({held_what}) under the text pass, so {} of the {} peak activation ({:.1} %) is the encoder's; with its weights {} of the non-KV {} ({:.1} %)",
            crate::base::units::fmt_u(e.weights_bytes),
            pct(e.weights_bytes, r.weights_bytes),
            p.items,
            p.modality,
            p.tokens_per_item,
            p.budget_tokens,
            e.attention,
            crate::base::units::fmt_u(e.phase_peak_bytes),
            crate::base::units::fmt_u(e.held_bytes),
            crate::base::units::fmt_u(e.peak_share_bytes),
            crate::base::units::fmt_u(peak),
            pct(e.peak_share_bytes, peak),
            crate::base::units::fmt_u(share),
            crate::base::units::fmt_u(non_kv),
            pct(share, non_kv),
        ),
        None if e.runner == Some(EncoderRunner::V2NoProfile) => format!(
            "encoder (vision tower + projector): weights {}, loaded; no encoder profile: Model Runner V2's profile_run under 0.22-0.26 is the text pass alone, reading its inputs_embeds buffer",
            crate::base::units::fmt_u(e.weights_bytes)
        ),
        None => format!(
            "encoder (vision tower + projector): weights {}; no encoder profile (every image and video limit 0: text-only, as vLLM runs it)",
            crate::base::units::fmt_u(e.weights_bytes)
        ),
    })
    }
}

/// A pipeline-parallel rank's stage: which decoder layers it holds (`get_pp_indices`), and its
/// rank in the stage's tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageInfo {
    pub stage: u32,
    pub first_layer: u32,
    /// One past the last layer.
    pub end_layer: u32,
    pub tp_rank: u32,
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// The KV bytes `release` grants from its formula's result `formula_kv` (computed with the
/// formulas list's budget rounding): its own rounding of T·u, less the CUDA graph estimate it
/// subtracts.
pub fn release_kv_bytes(
    release: &super::vllm::Release,
    formula_kv: i64,
    total: u64,
    util: f64,
    estimate_applied: u64,
) -> i64 {
    // The formulas list computes #12126 as V1 does (ceil); V0 releases floor.
    let ceil_in_list = release.formula.ceils_budget();
    formula_kv + super::formulas::budget(total, util, release.ceil_budget)
        - super::formulas::budget(total, util, ceil_in_list)
        - estimate_applied as i64
}

fn one() -> u32 {
    1
}

/// The engine's KV blocks under one formula (or the truth) with tensor parallel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineBudget {
    /// A formula's key (`pr9516`, …) or `truth`.
    pub key: String,
    pub title: String,
    /// min over ranks.
    pub kv_blocks: u64,
    /// The rank with the fewest blocks (the lowest such rank on a tie).
    pub binding_rank: u32,
    /// Each rank's own count, in rank order.
    pub rank_blocks: Vec<u64>,
}

/// The numbers of a release's `--kv-cache-memory` suggestion line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheMemorySuggestion {
    /// ceil(T·u).
    pub requested_bytes: i64,
    /// Weights + non-torch (#49208: total consumed).
    pub consumed_bytes: i64,
    /// What the line calls peak activation.
    pub peak_activation_bytes: i64,
    /// `--kv-cache-memory` to fit into the requested memory.
    pub to_requested: i64,
    /// To fully use the free memory at start.
    pub to_gpu: i64,
}

/// What the vLLM release a run reproduces grants: its formula's KV budget, with T·u rounded
/// as that release rounds it.
#[derive(Clone, Copy, Debug)]
pub struct VllmAnswer<'a> {
    pub release: &'static Release,
    pub formula: &'a FormulaResult,
    pub kv_bytes: i64,
    pub kv_blocks: u64,
}

impl Report {
    /// A copy of everything but the passes and the events (the JSON export writes those
    /// itself). Every field is named, so a new one is not left out.
    pub(crate) fn without_lists(&self) -> Report {
        let Report {
            format,
            tool,
            created_unix_s,
            model,
            quant,
            device,
            settings,
            checkpoints,
            weights_bytes,
            weights_tensor_bytes,
            kv_geometry,
            formulas,
            truth,
            true_max,
            passes: _,
            quant_state_after_bytes,
            outside_framework_bytes,
            other_process_bytes,
            logits,
            sampled_tokens,
            wall_time_s,
            event_count,
            events: _,
            device_samples,
            sample_rate_hz,
            tp,
            rank,
            ranks,
            engine,
            nccl_source,
            graphs,
            graphs_note,
            warm_up,
            warm_up_note,
            vllm_notes,
            pp,
            stage,
            encoder,
        } = self;
        Report {
            format: *format,
            tool: tool.clone(),
            created_unix_s: *created_unix_s,
            model: model.clone(),
            quant: *quant,
            device: device.clone(),
            settings: settings.clone(),
            checkpoints: *checkpoints,
            weights_bytes: *weights_bytes,
            weights_tensor_bytes: *weights_tensor_bytes,
            kv_geometry: *kv_geometry,
            formulas: formulas.clone(),
            truth: truth.clone(),
            true_max: true_max.clone(),
            passes: Vec::new(),
            quant_state_after_bytes: *quant_state_after_bytes,
            outside_framework_bytes: *outside_framework_bytes,
            other_process_bytes: *other_process_bytes,
            logits: logits.clone(),
            sampled_tokens: sampled_tokens.clone(),
            wall_time_s: *wall_time_s,
            event_count: *event_count,
            events: Vec::new(),
            device_samples: device_samples.clone(),
            sample_rate_hz: *sample_rate_hz,
            tp: *tp,
            rank: *rank,
            ranks: ranks.clone(),
            engine: engine.clone(),
            nccl_source: nccl_source.clone(),
            graphs: graphs.clone(),
            graphs_note: graphs_note.clone(),
            warm_up: warm_up.clone(),
            warm_up_note: warm_up_note.clone(),
            vllm_notes: vllm_notes.clone(),
            pp: *pp,
            stage: *stage,
            encoder: encoder.clone(),
        }
    }

    /// The answer of the release in `settings.vllm` (`None` for a snapshot, which has no
    /// formulas, or a session naming a release this build does not know).
    pub fn vllm_answer(&self) -> Option<VllmAnswer<'_>> {
        let release = self.settings.release().ok()?;
        let formula = self.formula(release.formula)?;
        let total = self.checkpoints.t0.total;
        let util = self.settings.util;
        let kv_bytes = match self.settings.kv_cache_memory {
            Some(given) => given as i64,
            None => release_kv_bytes(
                release,
                formula.kv_bytes,
                total,
                util,
                self.graphs_estimate_applied(),
            ),
        };
        Some(VllmAnswer {
            release,
            formula,
            kv_bytes,
            kv_blocks: self.kv_geometry.blocks(kv_bytes),
        })
    }

    /// The CUDA graph memory estimate the release subtracts from the KV budget (0 when it
    /// subtracts none).
    pub fn graphs_estimate_applied(&self) -> u64 {
        self.graphs
            .as_ref()
            .and_then(|g| g.estimate.as_ref())
            .filter(|e| e.applied)
            .map_or(0, |e| e.total_bytes)
    }

    /// The blocks the release's engine takes: its answer on one GPU, the fewest over the ranks
    /// with tensor parallel (distributed_gpu_executor.py `determine_num_available_blocks`).
    pub fn vllm_engine_blocks(&self) -> Option<u64> {
        if self.ranks.is_empty() {
            return self.vllm_answer().map(|a| a.kv_blocks);
        }
        self.ranks
            .iter()
            .map(|k| k.vllm_answer().map(|a| a.kv_blocks))
            .min()
            .flatten()
    }

    /// What the release counts against T·u before the KV cache, in bytes, and what it is: T·u
    /// less the KV bytes it grants (weights, the activation peak and the non-torch memory;
    /// #49208's consumed memory and headroom from 0.27; the CUDA graph estimate where the
    /// release applies it, 0.21 on).
    pub fn release_non_kv(&self, a: &VllmAnswer) -> (f64, &'static str) {
        let requested = self.checkpoints.t0.total as f64 * self.settings.util;
        let what = if self.graphs_estimate_applied() > 0 {
            "weights, activation peak, non-torch memory and the CUDA graph estimate"
        } else {
            "weights, activation peak and non-torch memory"
        };
        (requested - a.kv_bytes as f64, what)
    }

    /// When the release grants no KV block at all (weights + activation peak + non-torch
    /// memory over T·u; vLLM then refuses to start: "No available memory for the cache
    /// blocks"), a headline that says so and what would fit. `None` when blocks remain.
    pub fn does_not_fit(&self) -> Option<String> {
        let a = self.vllm_answer()?;
        // With `--kv-cache-memory` vLLM skips the profile: a budget of a byte is available
        // memory all the same, and the one-request check is the one that refuses it.
        if a.kv_blocks > 0 || self.settings.kv_cache_memory.is_some() {
            return self.v1_request_does_not_fit(&a);
        }
        let total = self.checkpoints.t0.total as f64;
        let (non_kv, what) = self.release_non_kv(&a);
        let block = self.kv_geometry.block_bytes() as f64;
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let mut fixes = Vec::new();
        // The smallest gpu_memory_utilization that leaves one block.
        let util = (non_kv + block) / total;
        if util <= 1.0 {
            fixes.push(format!("--util {:.2}", (util * 100.0).ceil() / 100.0));
        }
        let w = self.weights_bytes as f64;
        let short = non_kv + block - total * self.settings.util;
        if matches!(self.quant, Quant::F16 | Quant::BF16) {
            // 8-bit weights take about half, 4-bit about a quarter (plus their scales).
            for (q, share) in [("int8", 0.5), ("nf4", 0.28)] {
                if w * (1.0 - share) >= short {
                    fixes.push(format!(
                        "--quant {q} (weights about {:.1} GiB, estimated)",
                        gib(w * share)
                    ));
                    break;
                }
            }
        }
        if self.settings.tp < 8 && w / 2.0 >= short {
            fixes.push(format!("--tp {}", self.settings.tp * 2));
        }
        fixes.push("a shorter --max-model-len or --max-num-batched-tokens".into());
        Some(format!(
            "vLLM {} would not start: {what} take {:.2} GiB of T·u = {:.2} GiB, {:.2} GiB short \
             of one KV block; what would fit: {}",
            a.release.name,
            gib(non_kv),
            gib(total * self.settings.util),
            gib(short),
            fixes.join(", ")
        ))
    }

    /// A V1 release that grants blocks, but fewer than one request of `max_model_len` needs,
    /// refuses to start (`_check_enough_kv_cache_memory`, 0.19.0 v1/core/kv_cache_utils.py
    /// L633-653): its message, and what would fit. With `--kv-cache-memory` the budget is the
    /// user's, and so is the fix.
    fn v1_request_does_not_fit(&self, a: &VllmAnswer) -> Option<String> {
        if !matches!(a.release.engine, super::vllm::Engine::V1 { .. }) {
            return None;
        }
        let gib = |b: f64| b / (1u64 << 30) as f64;
        // `--kv-cache-memory` skips the profile, so nothing checks it against the GPU before
        // `initialize_kv_cache` allocates it: more than is free after the model loads runs out
        // of memory there.
        let free = self.checkpoints.t3.free;
        if self.settings.kv_cache_memory.is_some() && a.kv_bytes > free as i64 {
            return Some(format!(
                "vLLM {} would not start: --kv-cache-memory {:.2} GiB is more than the {:.2} GiB free on the GPU once the model is loaded and profiled, so allocating the KV cache raises torch.OutOfMemoryError (CUDA out of memory) in initialize_kv_cache; what would fit: --kv-cache-memory of at most {:.2} GiB",
                a.release.name,
                gib(a.kv_bytes as f64),
                gib(free as f64),
                gib(free as f64),
            ));
        }
        let (needed, longest) = self.kv_geometry.v1_one_request(a.kv_bytes);
        let longest = longest?;
        let estimate = if longest > 0 {
            format!(
                "Based on the available memory, the estimated maximum model length is {longest}. "
            )
        } else {
            String::new()
        };
        let shorter = if longest > 0 {
            format!(", or --max-model-len {longest}")
        } else {
            String::new()
        };
        let fix = if self.settings.kv_cache_memory.is_some() {
            format!(
                "--kv-cache-memory of at least {:.2} GiB{shorter}",
                gib(needed as f64)
            )
        } else {
            format!("a higher --util{shorter}")
        };
        Some(format!(
            "vLLM {} would not start: \"To serve at least one request with the models's max seq len ({}), ({:.2} GiB KV cache is needed, which is larger than the available KV cache memory ({:.2} GiB). {estimate}Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\"; what would fit: {fix}",
            a.release.name,
            self.kv_geometry.max_model_len,
            gib(needed as f64),
            gib(a.kv_bytes as f64),
        ))
    }

    /// The lines the release would log for this run, in its own words and rounding (GiB =
    /// 2^30 bytes, two decimals), then its block count.
    pub fn vllm_log_lines(&self) -> Vec<String> {
        let Some(a) = self.vllm_answer() else {
            return Vec::new();
        };
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let c = &self.checkpoints;
        let used = |cp: &super::formulas::Checkpoint| (cp.total - cp.free) as f64;
        let f = a.formula;
        let mut out = Vec::new();
        match a.release.log {
            LogStyle::BlocksOnly => {}
            LogStyle::MemoryProfilingResults { gib_typo } => out.push(format!(
                "INFO worker.py:260] Memory profiling results: total_gpu_memory={:.2}GiB initial_memory_usage={:.2}GiB peak_torch_memory={:.2}GiB memory_usage_post_profile={:.2}{} non_torch_memory={:.2}GiB kv_cache_size={:.2}GiB gpu_memory_utilization={:.2}",
                gib(c.t0.total as f64),
                gib(used(&c.t1)),
                gib(f.torch_peak_bytes as f64),
                gib(used(&c.t3)),
                if gib_typo { "Gib" } else { "GiB" },
                gib(used(&c.t3) - c.t3.allocated as f64),
                gib(a.kv_bytes as f64),
                self.settings.util
            )),
            LogStyle::InstanceCanUse => {
                let total = gib(c.t0.total as f64);
                // The profile pass's own time (t1 to t2), as vLLM times `memory_profiling`.
                let secs = c.t2.time_us.saturating_sub(c.t1.time_us) as f64 / 1e6;
                out.push(format!(
                    "INFO worker.py] Memory profiling takes {secs:.2} seconds"
                ));
                out.push(format!(
                    "the current vLLM instance can use total_gpu_memory ({total:.2}GiB) x gpu_memory_utilization ({:.2}) = {:.2}GiB",
                    self.settings.util,
                    total * self.settings.util
                ));
                out.push(format!(
                    "model weights take {:.2}GiB; non_torch_memory takes {:.2}GiB; PyTorch activation peak memory takes {:.2}GiB; the rest of the memory reserved for KV Cache is {:.2}GiB.",
                    gib(f.weights_term_bytes as f64),
                    gib(f.non_torch_bytes as f64),
                    gib(f.torch_peak_bytes as f64),
                    gib(a.kv_bytes as f64)
                ));
            }
            LogStyle::V1 if self.settings.kv_cache_memory.is_some() => {
                // 0.19.0 v1/worker/gpu_worker.py:349-361 (format_gib: two decimals).
                out.push(format!(
                    "INFO gpu_worker.py] Initial free memory {:.2} GiB, reserved {:.2} GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. This does not respect the gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual control of KV cache memory size. If OOM'ed, check the difference of initial free memory between the current run and the previous run where kv_cache_memory_bytes is suggested and update it correspondingly.",
                    gib(c.t0.free as f64),
                    gib(a.kv_bytes as f64)
                ));
                out.extend(self.v1_kv_lines(&a));
            }
            LogStyle::V1 => {
                out.extend(self.vllm_notes.iter().cloned());
                let secs = c.t2.time_us.saturating_sub(c.t1.time_us) as f64 / 1e6;
                let requested = super::formulas::budget(c.t0.total, self.settings.util, true);
                out.push(format!(
                    "DEBUG gpu_worker.py] Initial free memory: {:.2} GiB; Requested memory: {:.2} (util), {:.2} GiB",
                    gib(c.t0.free as f64),
                    self.settings.util,
                    gib(requested as f64)
                ));
                if f.id == FormulaId::Pr49208 {
                    // 0.27.1 utils/mem_utils.py:220-230: the increase is still printed, beside
                    // what #49208 counts instead of the non-torch increase.
                    out.push(format!(
                        "DEBUG gpu_worker.py] Memory profiling takes {secs:.2} seconds. Total non KV cache memory: {:.2}GiB; torch peak memory increase: {:.2}GiB; total consumed (from mem_get_info): {:.2}GiB; weights memory: {:.2}GiB.",
                        gib(f.non_kv_bytes as f64),
                        gib(c.t3.allocated_peak as f64 - c.t1.allocated as f64),
                        gib((f.non_torch_bytes + f.weights_term_bytes) as f64),
                        gib(f.weights_term_bytes as f64)
                    ));
                } else {
                    out.push(format!(
                        "DEBUG gpu_worker.py] Memory profiling takes {secs:.2} seconds. Total non KV cache memory: {:.2}GiB; torch peak memory increase: {:.2}GiB; non-torch forward increase memory: {:.2}GiB; weights memory: {:.2}GiB.",
                        gib(f.non_kv_bytes as f64),
                        gib(f.torch_peak_bytes as f64),
                        gib(f.non_torch_bytes as f64),
                        gib(f.weights_term_bytes as f64)
                    ));
                }
                out.push(format!(
                    "INFO gpu_worker.py] Available KV cache memory: {:.2} GiB",
                    gib(a.kv_bytes as f64)
                ));
                out.extend(self.v1_kv_lines(&a));
            }
        }
        out
    }

    /// V1's KV cache lines (kv_cache_utils.py): tokens and the maximum concurrency.
    fn v1_kv_lines(&self, a: &VllmAnswer<'_>) -> Vec<String> {
        let (tokens, concurrency) = self.kv_tokens_and_concurrency(a);
        if a.release.kv_line_combined {
            // 0.28.0 v1/core/kv_cache_utils.py:1869-1875.
            return vec![format!(
                "INFO kv_cache_utils.py] GPU KV cache size: {} tokens, Maximum concurrency for {} tokens per request: {:.2}x",
                crate::base::units::thousands(tokens),
                crate::base::units::thousands(self.settings.max_model_len.max(1)),
                concurrency
            )];
        }
        vec![
            format!(
                "INFO kv_cache_utils.py] GPU KV cache size: {} tokens",
                crate::base::units::thousands(tokens)
            ),
            format!(
                "INFO kv_cache_utils.py] Maximum concurrency for {} tokens per request: {:.2}x",
                crate::base::units::thousands(self.settings.max_model_len.max(1)),
                concurrency
            ),
        ]
    }

    /// The KV cache's tokens and the maximum concurrency at max_model_len as the release logs
    /// them (V1: kv_cache_utils.py; V0: blocks × block size / max_model_len).
    pub fn kv_tokens_and_concurrency(&self, a: &VllmAnswer<'_>) -> (u64, f64) {
        let len = self.settings.max_model_len.max(1);
        let geometry = KvGeometry {
            max_model_len: len,
            ..self.kv_geometry
        };
        if !matches!(a.release.engine, super::vllm::Engine::V1 { .. }) {
            let blocks = self.vllm_engine_blocks().unwrap_or(a.kv_blocks);
            let tokens = blocks * self.kv_geometry.block_size;
            return (tokens, tokens as f64 / len as f64);
        }
        // The engine's count: this GPU's, or the fewest over every rank (V1 sets each
        // worker's num_blocks to the minimum: kv_cache_utils.py 0.19 L1599-1612).
        let blocks = self.vllm_engine_blocks().unwrap_or(a.kv_blocks);
        let concurrency = geometry.v1_max_concurrency(blocks);
        let tokens = if a.release.tokens_from_concurrency {
            (concurrency * len as f64) as u64
        } else {
            self.kv_geometry.tokens_of_blocks(blocks)
        };
        (tokens, concurrency)
    }

    /// The CUDA graph lines the release logs (its estimator's, the capture's, the comparison,
    /// the `--kv-cache-memory` suggestion), in its words; then none when no graphs ran.
    pub fn vllm_graph_log_lines(&self) -> Vec<String> {
        let (Some(g), Some(a)) = (&self.graphs, self.vllm_answer()) else {
            return Vec::new();
        };
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let mib = |b: f64| b / (1u64 << 20) as f64;
        // Python's round(x, 2) printed with str(): 0.9 prints as 0.9.
        let r2 = |b: f64| {
            let v = (gib(b) * 100.0).round() / 100.0;
            let t = format!("{v:.2}");
            let t = t.trim_end_matches('0');
            if t.ends_with('.') {
                format!("{t}0")
            } else {
                t.to_string()
            }
        };
        let mut out = Vec::new();
        if let Some(e) = &g.estimate {
            out.push(format!(
                "INFO gpu_model_runner.py] Profiling CUDA graph memory: {}",
                e.modes
                    .iter()
                    .map(|m| format!("{}={} (largest={})", m.kind.name(), m.sizes, m.largest))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            for m in &e.modes {
                out.push(format!(
                    "DEBUG gpu_model_runner.py] Estimated {} CUDA graph memory: {:.2} MiB first-capture + ({}-1) × {:.2} MiB per-graph",
                    m.kind.name(),
                    mib(m.first_bytes as f64),
                    m.sizes,
                    mib((m.second_bytes.unwrap_or(0).max(1 << 20)) as f64)
                ));
            }
            out.push(format!(
                "INFO gpu_model_runner.py] Estimated CUDA graph memory: {:.2} GiB total",
                gib(e.total_bytes as f64)
            ));
        }
        if let Some(f) = &g.failed {
            out.push(format!("(the capture stops: {f})"));
            return out;
        }
        let v0 = matches!(a.release.engine, super::vllm::Engine::V0);
        out.push(format!(
            "INFO {}] Graph capturing finished in {:.0} secs, took {:.2} GiB",
            if v0 {
                "model_runner.py"
            } else {
                "gpu_model_runner.py"
            },
            g.capture_s,
            gib(g.took_bytes as f64)
        ));
        if v0 {
            return out;
        }
        let actual = g.took_bytes.max(0) as f64;
        if let Some(e) = &g.estimate {
            let diff = (actual - e.total_bytes as f64).abs();
            out.push(format!(
                "INFO gpu_worker.py] CUDA graph pool memory: {} GiB (actual), {} GiB (estimated), difference: {} GiB ({:.1}%).",
                r2(actual),
                r2(e.total_bytes as f64),
                r2(diff),
                100.0 * diff / actual.max(1.0)
            ));
        }
        // The suggestion only when the budget came from profiling (0.19.0 gpu_worker.py:606).
        let profiled = self.settings.kv_cache_memory.is_none();
        if let Some(f) = self.formula(a.release.formula).filter(|_| profiled) {
            let c = &self.checkpoints;
            let s = self.kv_cache_memory_suggestion(&a, f, actual);
            let level = match a.release.suggestion {
                super::vllm::Suggestion::Debug => "DEBUG",
                super::vllm::Suggestion::Info | super::vllm::Suggestion::Consumed => "INFO",
            };
            let usage = if a.release.suggestion == super::vllm::Suggestion::Consumed {
                // 0.27.1 v1/worker/gpu_worker.py:766-786.
                format!(
                    "{} GiB for consumed memory (weights + non-torch), {} GiB for peak activation, and {} GiB for CUDAGraph memory",
                    r2(s.consumed_bytes as f64),
                    r2(s.peak_activation_bytes as f64),
                    r2(actual)
                )
            } else {
                format!(
                    "{} GiB for weight, {} GiB for peak activation, {} GiB for non-torch memory, and {} GiB for CUDAGraph memory",
                    r2(f.weights_term_bytes as f64),
                    r2(s.peak_activation_bytes as f64),
                    r2(f.non_torch_bytes as f64),
                    r2(actual)
                )
            };
            out.push(format!(
                "{level} gpu_worker.py] Free memory on device ({}/{} GiB) on startup. Desired GPU memory utilization is ({}, {} GiB). Actual usage is {usage}. Replace gpu_memory_utilization config with `--kv-cache-memory={}` ({} GiB) to fit into requested memory, or `--kv-cache-memory={}` ({} GiB) to fully utilize gpu memory. Current kv cache memory in use is {} GiB.",
                r2(c.t0.free as f64),
                r2(c.t0.total as f64),
                self.settings.util,
                r2(s.requested_bytes as f64),
                s.to_requested,
                r2(s.to_requested as f64),
                s.to_gpu,
                r2(s.to_gpu as f64),
                r2(a.kv_bytes as f64)
            ));
        }
        if let Some(e) = &g.estimate {
            let total = self.checkpoints.t0.total as f64;
            let u = self.settings.util;
            let delta = e.total_bytes as f64 / total;
            let round4 = |x: f64| (x * 1e4).round() / 1e4;
            let suggested = round4(u + delta).min(1.0);
            out.push(if e.applied {
                format!(
                    "INFO gpu_worker.py] CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization={u:.4} is equivalent to --gpu-memory-utilization={:.4} without CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase --gpu-memory-utilization to {suggested:.4}. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
                    round4(u - delta)
                )
            } else {
                format!(
                    "INFO gpu_worker.py] In v0.19, CUDA graph memory profiling will be enabled by default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1), which more accurately accounts for CUDA graph memory during KV cache allocation. To try it now, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 and increase --gpu-memory-utilization from {u:.4} to {suggested:.4} to maintain the same effective KV cache size."
                )
            });
        }
        out
    }

    /// The `--kv-cache-memory` suggestion's arithmetic (0.19.0 v1/worker/gpu_worker.py:
    /// 620-660; 0.27.1 :740-786): requested (and free memory at start) less the non-KV
    /// memory it sums, less a 150 MiB margin. From 0.27 its peak activation holds the
    /// estimate the budget applied, and the graphs' actual memory is added on top of it.
    pub fn kv_cache_memory_suggestion(
        &self,
        a: &VllmAnswer<'_>,
        f: &FormulaResult,
        graphs_actual: f64,
    ) -> KvCacheMemorySuggestion {
        let c = &self.checkpoints;
        let requested = super::formulas::budget(c.t0.total, self.settings.util, true);
        let consumed = f.weights_term_bytes + f.non_torch_bytes;
        let (peak, non_kv) = match a.release.suggestion {
            super::vllm::Suggestion::Consumed => {
                let peak = f.torch_peak_bytes + self.graphs_estimate_applied() as i64;
                (peak, consumed + peak)
            }
            _ => (f.torch_peak_bytes, consumed + f.torch_peak_bytes),
        };
        let non_kv = non_kv as f64 + graphs_actual;
        let margin = (150u64 << 20) as f64;
        KvCacheMemorySuggestion {
            requested_bytes: requested,
            consumed_bytes: consumed,
            peak_activation_bytes: peak,
            to_requested: (requested as f64 - non_kv - margin) as i64,
            to_gpu: (c.t0.free as f64 - non_kv - margin) as i64,
        }
    }

    /// vramscope's account of the graphs: what they hold, measured or modelled, and what the
    /// release's budget does with them, in one sentence computed from this run.
    pub fn graph_summary(&self) -> Vec<String> {
        let Some(g) = &self.graphs else {
            return self
                .graphs_note
                .iter()
                .map(|n| format!("CUDA graphs: {n}"))
                .collect();
        };
        let gib = |b: f64| b / (1u64 << 30) as f64;
        let mut out = Vec::new();
        let sizes: Vec<String> = g
            .plan
            .iter()
            .map(|(k, s)| format!("{} {} sizes", s.len(), k.name()))
            .collect();
        out.push(format!(
            "CUDA graphs: {} graphs ({}), {} ops captured{}; graph pool {}, graphs' own memory {} ({}), side stream {} (its cuBLAS workspace and cache); vLLM's \"took\" {:.2} GiB, this process's memory {} more{}",
            g.graphs,
            sizes.join(" + "),
            g.ops,
            g.nodes.map_or(String::new(), |n| format!(", {n} graph nodes")),
            crate::base::units::fmt_u(g.pool_bytes),
            crate::base::units::fmt_u(g.exec_bytes),
            if g.exec_measured {
                "measured: free memory around each instantiation"
            } else {
                "modelled from the H200's driver, docs/gpu-runs.md run 54"
            },
            crate::base::units::fmt_u(g.side_stream_bytes),
            gib(g.took_bytes as f64),
            crate::base::units::fmt_i(g.process_delta_bytes),
            if g.exec_measured { " (NVML)" } else { "" }
        ));
        if let Some(r) = &g.replay {
            out.push(format!(
                "replays: {} graph sets replayed, worst relative L2 against the eager pass {:.2e} ({})",
                r.checked, r.worst_rel_l2, r.worst
            ));
        }
        let v1 = self
            .settings
            .release()
            .is_ok_and(|r| matches!(r.engine, super::vllm::Engine::V1 { .. }));
        if v1 {
            out.push(
                "compiled: approximated by the eager allocation sequence (vLLM captures pieces \
                 torch.compile made, vramscope its own eager kernels; vLLM 0.19's estimator and \
                 capture replayed on an H100 with Inductor's pieces estimated 23 % and took 4 % \
                 less than this sequence: docs/gpu-runs.md run 96; against vLLM 0.19's public \
                 log Q1 the graphs' memory lands 22-24 % under, held by tests/vllm_v1.rs: \
                 docs/vllm-versions.md)"
                    .into(),
            );
        }
        if let Some(f) = &g.failed {
            out.push(format!(
                "the instance would crash while capturing its graphs: {f}"
            ));
            return out;
        }
        let name = self.settings.release().map_or("?", |r| r.name);
        let actual = g.took_bytes.max(0) as u64;
        let block = self.kv_geometry.block_bytes().max(1);
        match &g.estimate {
            Some(e) if e.applied => {
                let lost = e.total_bytes as i64 - actual as i64;
                let blocks = lost.unsigned_abs() / block;
                out.push(format!(
                    "vLLM {name} reserves {:.2} GiB for graphs that take {:.2} GiB: {:.2} GiB of KV cache {} ({} blocks, {} tokens)",
                    gib(e.total_bytes as f64),
                    gib(actual as f64),
                    gib(lost.unsigned_abs() as f64),
                    if lost >= 0 { "lost" } else { "over-granted, taken from the device's margin" },
                    crate::base::units::thousands(blocks),
                    crate::base::units::thousands(self.kv_geometry.tokens_of_blocks(blocks))
                ));
            }
            other => {
                let est = other.as_ref().map_or(String::new(), |e| {
                    format!(
                        " (its estimate, {:.2} GiB, is only logged)",
                        gib(e.total_bytes as f64)
                    )
                });
                out.push(format!(
                    "vLLM {name} leaves the graphs' {:.2} GiB out of its budget{est}: after the capture the instance holds {:.2} GiB, {:.2} GiB of the device left{}",
                    gib(actual as f64),
                    gib(g.peak_process_bytes as f64),
                    gib(g.room_left_bytes as f64),
                    if g.room_left_bytes < 0 { " — it would run out of memory" } else { "" }
                ));
            }
        }
        out
    }

    /// V1's sampler warm-up after the KV cache, in one line (or why it did not run); with
    /// pipeline parallel the last stage's.
    pub fn warm_up_summary(&self) -> Vec<String> {
        let name = self.settings.release().map_or("?", |r| r.name);
        let w = std::iter::once(self)
            .chain(self.ranks.iter())
            .find_map(|r| r.warm_up.as_ref());
        match (w, &self.warm_up_note) {
            (Some(w), _) => vec![w.summary(name)],
            (None, Some(n)) => vec![format!("sampler warm-up: {n}")],
            (None, None) => Vec::new(),
        }
    }

    pub fn formula(&self, id: FormulaId) -> Option<&FormulaResult> {
        self.formulas.iter().find(|f| f.id == id)
    }

    /// Device memory NCCL took on this rank, outside the framework (its first-use entries).
    pub fn nccl_bytes(&self) -> u64 {
        self.events
            .iter()
            .filter(|e| {
                e.kind == crate::memory::EventKind::OutsideAlloc && e.tensor.starts_with("nccl")
            })
            .map(|e| e.bytes)
            .sum()
    }

    /// Events up to and including checkpoint t3 (the profile; the verify passes follow).
    pub fn profile_events(&self) -> &[Event] {
        let end = self
            .events
            .iter()
            .position(|e| e.kind == crate::memory::EventKind::Marker && e.tensor == "t3")
            .map_or(self.events.len(), |p| p + 1);
        &self.events[..end]
    }

    /// Bytes of the sampler's tensors still allocated after the profile (V1's cached Triton
    /// buffer), if any.
    fn sampler_cache_after(&self) -> Option<u64> {
        let kept: i64 = self
            .profile_events()
            .iter()
            .filter(|e| {
                e.category == crate::memory::Category::Sampler && e.tensor.ends_with("(cached)")
            })
            .map(|e| match e.kind {
                crate::memory::EventKind::Alloc => e.bytes as i64,
                crate::memory::EventKind::Free => -(e.bytes as i64),
                _ => 0,
            })
            .sum();
        (kept > 0).then_some(kept as u64)
    }

    /// Framework tensors made in a profile pass and still alive at t3 (other than int8 state
    /// and the sampler's cache, which have sentences of their own), as the lifetime view's key
    /// finds them: each free paired with the oldest live allocation of the same tensor name,
    /// size and category. The largest category and all their bytes.
    fn kept_after_profile(&self) -> Option<(crate::memory::Category, u64)> {
        use crate::memory::{Category, EventKind};
        use std::collections::{HashMap, VecDeque};
        let passes = 1..=self.settings.passes;
        let mut open: HashMap<(&str, u64, Category), VecDeque<bool>> = HashMap::new();
        for e in self.profile_events() {
            let key = (e.tensor.as_str(), e.bytes, e.category);
            match e.kind {
                EventKind::Alloc => open
                    .entry(key)
                    .or_default()
                    .push_back(passes.contains(&e.pass)),
                EventKind::Free => {
                    open.get_mut(&key).and_then(|q| q.pop_front());
                }
                _ => {}
            }
        }
        let mut by: HashMap<Category, u64> = HashMap::new();
        for ((tensor, bytes, category), q) in &open {
            if *category == Category::QuantState
                || (*category == Category::Sampler && tensor.ends_with("(cached)"))
            {
                continue;
            }
            *by.entry(*category).or_default() += bytes * q.iter().filter(|k| **k).count() as u64;
        }
        let total: u64 = by.values().sum();
        let (category, _) = by.into_iter().max_by_key(|(c, b)| (*b, c.label()))?;
        (total > 0).then_some((category, total))
    }

    /// One sentence on why the old (#9352) and new (#9516) budgets differ, from the numbers.
    pub fn old_vs_new_explanation(&self) -> String {
        let (Some(old), Some(new)) = (
            self.formula(FormulaId::Pr9352),
            self.formula(FormulaId::Pr9516),
        ) else {
            return String::new();
        };
        let diff = new.kv_bytes - old.kv_bytes;
        let mib = |b: i64| crate::base::units::fmt_i(b);
        // Two budgets below zero: neither leaves a KV cache, and which is "larger" says
        // nothing.
        if old.kv_bytes <= 0 && new.kv_bytes <= 0 {
            return format!(
                "Neither formula leaves room for a KV cache: the old one is {} short of it, the new one {}.",
                mib(-old.kv_bytes),
                mib(-new.kv_bytes)
            );
        }
        let state = self.quant_state_after_bytes as i64;
        let ctx_like = self.outside_framework_bytes as i64;
        // What lives outside the framework: with tensor parallel, NCCL's buffers beside the
        // context.
        let outside = if self.nccl_bytes() > 0 {
            "the CUDA context and NCCL's buffers"
        } else {
            "the CUDA context"
        };
        if state > 0 {
            format!(
                "The old formula counts the {} of int8 state (CxB) that survives the pass twice: once in the torch peak and again in the free-memory drop; the new one subtracts live tensors, but also charges the {} the instance holds outside the framework ({outside}), so its budget is {} {}.",
                mib(state),
                mib(ctx_like),
                mib(diff.abs()),
                if diff >= 0 { "larger" } else { "smaller" }
            )
        } else if let Some(kept) = self.sampler_cache_after() {
            format!(
                "The sampler leaves {} cached on the device (V1's Triton top-k/top-p buffer and tables): the old formula counts it twice, in the torch peak and in the free-memory drop; the new one also charges the {} outside the framework ({outside}), so its budget is {} {}.",
                mib(kept as i64),
                mib(new.non_torch_bytes),
                mib(diff.abs()),
                if diff >= 0 { "larger" } else { "smaller" }
            )
        } else if let Some((category, kept)) = self.kept_after_profile() {
            format!(
                "The pass leaves {} of framework tensors ({} the largest) alive: the old formula counts them twice, in the torch peak and in the free-memory drop; the new one subtracts live tensors but charges the {} outside the framework ({outside}, cached segments, other processes), so its budget is {} {}.",
                mib(kept as i64),
                category.label(),
                mib(new.non_torch_bytes),
                mib(diff.abs()),
                if diff >= 0 { "larger" } else { "smaller" }
            )
        } else if diff.abs() < (1 << 20) {
            "Old and new agree: nothing of the framework survives the pass, and no memory outside it changed during the pass.".to_string()
        } else {
            format!(
                "No framework tensor survives the pass; they differ by {} because the new formula charges all memory outside the framework at the end ({}: {outside}, cached segments, other processes) while the old one sees only what appeared during the pass.",
                mib(diff.abs()),
                mib(new.non_torch_bytes)
            )
        }
    }
}

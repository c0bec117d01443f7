//! What the user asked for: one profile run.

use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};
use crate::device::tensor::DType;
use crate::device::DeviceSpec;
use crate::model::ModelSource;
use crate::quant::Quant;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileRequest {
    pub model: ModelSource,
    pub quant: Quant,
    pub device: DeviceSpec,
    /// Tokens in the profile batch (vLLM's `max_num_batched_tokens`); 0: vLLM's default,
    /// max(max_model_len, 2048) with chunked prefill off (vllm/config.py L1018-1048). A report
    /// holds the value that ran.
    pub tokens: usize,
    /// Sequences the tokens are split into (vLLM's `max_num_seqs`, default 256).
    pub seqs: usize,
    /// Passes between t1 and t2. vLLM's `profile_run` is one (the default); more show what the
    /// serving passes after it do (bitsandbytes' state freed in the next pass, segments the
    /// second pass maps), and the truth then covers them all.
    pub passes: u32,
    /// gpu_memory_utilization.
    pub util: f64,
    pub block_size: u64,
    /// vLLM's `max_model_len`; 0: the model's `max_position_embeddings`, as vLLM takes it. A
    /// report holds the value that ran.
    pub max_model_len: u64,
    /// Run vLLM's sampler step after the forward, as vLLM's profile run does.
    #[serde(default = "yes")]
    pub sampler: bool,
    /// LLM.int8 outlier threshold (0 = no decomposition; Hugging Face checkpoints use 6.0).
    pub int8_threshold: f32,
    /// Held by another process before the instance starts.
    pub outside_before: u64,
    /// Allocated outside the framework during the first pass (NCCL-like).
    pub outside_during: u64,
    /// Whether the during-pass allocation is freed after the passes (else it stays).
    pub outside_during_freed: bool,
    /// Run the verify pass for each budget.
    pub verify: bool,
    pub seed: u64,
    /// Tensor-parallel ranks (vLLM's `--tensor-parallel-size`): one GPU each, `cuda:N` and
    /// the N − 1 GPUs after it, or that many simulated devices.
    #[serde(default = "one")]
    pub tp: u32,
    /// Pipeline stages (vLLM's `--pipeline-parallel-size`): the model's layers cut over `pp`
    /// stages of `tp` GPUs each, `tp × pp` GPUs in all (simulated devices, V1 releases).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pp: u32,
    /// vLLM's `--enable-expert-parallel`: a MoE model's routed experts spread whole over the
    /// `dp × tp` ranks of each stage instead of every expert cut over them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_expert_parallel: bool,
    /// vLLM's `--data-parallel-size`: replicas of the `tp × pp` instance, each its own engine
    /// with its own KV cache; a MoE model's experts span the replicas (`dp × tp` ranks).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub dp: u32,
    /// Hosts the instance spans (`--nodes`), each with [`MAX_TP`] GPUs of the device's kind:
    /// ranks fill one host after another in vLLM's order (global rank = dp × pp × tp order),
    /// and a group whose ranks sit on different hosts talks through NCCL's network transport.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub nodes: u32,
    /// How the hosts reach each other (`--network`): InfiniBand or RoCE with GPUDirect RDMA,
    /// or TCP sockets.
    #[serde(
        default,
        skip_serializing_if = "crate::device::nccl_model::Network::is_default"
    )]
    pub network: crate::device::nccl_model::Network,
    /// vLLM's `VLLM_PP_LAYER_PARTITION`: the layers of each stage, given (`None`: vLLM's own
    /// partition, `get_pp_indices`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_layer_partition: Option<Vec<usize>>,
    /// The vLLM release whose profile run, defaults and formula to reproduce (`--vllm`;
    /// `super::vllm::RELEASES`). Left out of a session when it is the default, so sessions
    /// of the default release read as they always did.
    #[serde(default = "default_vllm", skip_serializing_if = "is_default_vllm")]
    pub vllm: String,
    /// vLLM's `--enable-chunked-prefill`; `None`: vLLM's own rule (on above a 32k context).
    /// A report holds `Some(true)` when it ran with chunked prefill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunked_prefill: Option<bool>,
    /// Search the largest KV cache that really serves (`--true-max`): verify runs after the
    /// formulas' (one GPU).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub true_max: bool,
    /// vLLM's `--kv-cache-dtype` (sessions written before it existed load as "auto").
    #[serde(default, skip_serializing_if = "KvCacheDtype::is_auto")]
    pub kv_cache_dtype: KvCacheDtype,
    /// vLLM's `--enforce-eager`: no CUDA graphs (a V1 release otherwise captures them after
    /// the KV cache, and 0.19 on estimates their memory).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enforce_eager: bool,
    /// vLLM's `--enable-prefix-caching` / `--no-enable-prefix-caching` where given (`None`:
    /// the release's default). It changes the startup memory of a hybrid model only: from
    /// 0.15 Qwen3-Next's state layers then keep two pages a request ("align"), and 0.28 turns
    /// it on by default (`engine::rules::GdnRules::prefix_caching_align`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_caching: Option<bool>,
    /// vLLM's `--kv-cache-memory` (V1, 0.11 on): the KV cache's bytes per GPU, given. vLLM
    /// still runs its profile pass but skips the memory profiling, so neither
    /// gpu_memory_utilization nor the graph estimate sets the budget (0.19.0
    /// v1/worker/gpu_worker.py:344-362).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_memory: Option<u64>,
    /// V1's batch defaults of the Python `LLM` class (usage context `LLM_CLASS`: `LLM(...)`,
    /// `vllm bench latency`, `vllm bench throughput`) instead of `vllm serve`'s
    /// (`vllm::v1_default_batch`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub llm_class: bool,
    /// vLLM's `--limit-mm-per-prompt` (`{"image": 0}` or `image=0`): images per prompt; 0
    /// turns the encoder's profile off (and from 0.15 the vision tower's weights). `None`:
    /// vLLM's default (999 under V1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_mm_images: Option<u64>,
    /// The same flag's videos per prompt (Qwen2.5-VL profiles a dummy video where its
    /// tokens reach the image's; `{"image": 0, "video": 0}` runs it text-only). `None`:
    /// vLLM's default (999).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_mm_videos: Option<u64>,
    /// vLLM's `--mm-processor-kwargs` (JSON, checked by `multimodal::check_processor_kwargs`):
    /// Qwen2.5-VL's `min_pixels` / `max_pixels` / `size` set its image processor's bounds,
    /// hence its dummy image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mm_processor_kwargs: Option<String>,
}

fn default_vllm() -> String {
    super::vllm::DEFAULT.to_string()
}

fn is_default_vllm(v: &String) -> bool {
    v == super::vllm::DEFAULT
}

/// vLLM's `--kv-cache-dtype`. "auto" stores K and V in the model's activation dtype; every fp8
/// name maps to one byte per element (vllm/utils.py `STR_DTYPE_TO_TORCH_DTYPE`: "fp8",
/// "fp8_e4m3", "fp8_e5m2" → `torch.uint8`), so `CacheEngine.get_cache_block_size` halves
/// against fp16/bf16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtype {
    #[default]
    Auto,
    Fp8,
    #[serde(rename = "fp8_e4m3")]
    Fp8E4m3,
    #[serde(rename = "fp8_e5m2")]
    Fp8E5m2,
}

impl KvCacheDtype {
    pub const ALL: [KvCacheDtype; 4] = [
        KvCacheDtype::Auto,
        KvCacheDtype::Fp8,
        KvCacheDtype::Fp8E4m3,
        KvCacheDtype::Fp8E5m2,
    ];

    /// The name vLLM takes on its command line.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fp8 => "fp8",
            KvCacheDtype::Fp8E4m3 => "fp8_e4m3",
            KvCacheDtype::Fp8E5m2 => "fp8_e5m2",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::Request(format!(
                    "--kv-cache-dtype '{s}': expected auto, fp8, fp8_e4m3 or fp8_e5m2"
                ))
            })
    }

    fn is_auto(&self) -> bool {
        *self == KvCacheDtype::Auto
    }

    /// The element type of the KV cache tensors when the model computes in `activation`.
    pub fn storage_dtype(self, activation: DType) -> DType {
        match self {
            KvCacheDtype::Auto => activation,
            // vLLM allocates fp8 caches as torch.uint8 and views them as fp8 in its kernels.
            _ => DType::U8,
        }
    }
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// The most tensor-parallel ranks a request may ask for (vLLM's largest custom all-reduce
/// group; larger instances span hosts, which vramscope does not model).
pub const MAX_TP: u32 = 8;

/// The most hosts a dry plan may span (`--nodes`).
pub const MAX_NODES: u32 = 16;

impl Default for ProfileRequest {
    fn default() -> Self {
        ProfileRequest {
            model: ModelSource::Preset {
                name: "llama-3-8b".into(),
            },
            quant: Quant::F16,
            device: DeviceSpec::Sim {
                preset: "h100-80gb".into(),
                dry: true,
                total: None,
                topology: None,
            },
            tokens: 0,
            seqs: VLLM_MAX_NUM_SEQS,
            passes: 1,
            util: 0.9,
            block_size: 16,
            max_model_len: 0,
            sampler: true,
            int8_threshold: 0.0,
            outside_before: 0,
            outside_during: 0,
            outside_during_freed: false,
            verify: true,
            seed: 0,
            tp: 1,
            pp: 1,
            enable_expert_parallel: false,
            dp: 1,
            nodes: 1,
            network: Default::default(),
            pp_layer_partition: None,
            vllm: default_vllm(),
            chunked_prefill: None,
            true_max: false,
            enforce_eager: false,
            prefix_caching: None,
            kv_cache_dtype: KvCacheDtype::Auto,
            kv_cache_memory: None,
            llm_class: false,
            limit_mm_images: None,
            limit_mm_videos: None,
            mm_processor_kwargs: None,
        }
    }
}

fn yes() -> bool {
    true
}

/// Serving passes each true-maximum probe (`--true-max`) runs after allocating its cache.
pub const TRUE_MAX_SERVING_PASSES: u32 = 2;

/// vLLM's default `max_num_seqs` (vllm/engine/arg_utils.py L116).
pub const VLLM_MAX_NUM_SEQS: usize = 256;

/// vLLM's floor of `max_num_batched_tokens` with chunked prefill off (vllm/config.py L1030).
pub const VLLM_MIN_BATCHED_TOKENS: usize = 2048;

impl ProfileRequest {
    /// The release this request reproduces (`--vllm`).
    pub fn release(&self) -> Result<&'static super::vllm::Release> {
        super::vllm::release(&self.vllm)
    }

    /// Hosts, at least one.
    pub fn nodes(&self) -> u32 {
        self.nodes.max(1)
    }

    /// Every GPU of the deployment: `dp × pp × tp`.
    pub fn gpus(&self) -> u32 {
        self.dp * self.pp * self.tp
    }

    /// Whether data or expert parallel changes the MoE layers (vLLM's `use_ep` needs
    /// `dp × tp > 1`).
    pub fn moe_spans_ranks(&self) -> bool {
        self.dp > 1 || (self.enable_expert_parallel && self.tp > 1)
    }

    /// Whether the profile batch is chunked prefill's: as asked, else vLLM's rule (on when
    /// max_model_len is above 32k).
    pub fn chunked(&self) -> bool {
        self.chunked_prefill
            .unwrap_or(self.max_model_len > super::vllm::CHUNKED_PREFILL_ABOVE)
    }

    /// The request with vLLM's defaults filled in for a model whose
    /// `max_position_embeddings` is `max_positions`: max_model_len from the model; V0: the
    /// batch max(max_model_len, 2048), or with chunked prefill the release's chunk (512 up to
    /// 0.6.4, 2048 after; config.py `SchedulerConfig.__init__`), and 256 sequences; V1:
    /// chunked prefill always, the batch and sequences of `vllm serve` (or of the `LLM` class)
    /// for this GPU (`vllm::v1_default_batch`). 0 sequences means vLLM's default; fewer when the batch is
    /// smaller (V1 takes min(max_num_seqs, max_num_batched_tokens); V0 refuses a given batch
    /// below its 256, `check_default_seqs_fit_batch`).
    pub fn resolved(&self, max_positions: usize) -> ProfileRequest {
        let mut r = self.clone();
        if r.max_model_len == 0 {
            r.max_model_len = max_positions.max(1) as u64;
        }
        let v1 = self
            .release()
            .ok()
            .filter(|rel| matches!(rel.engine, super::vllm::Engine::V1 { .. }));
        if let Some(rel) = v1 {
            // V1 chunks unless told not to (`enable_chunked_prefill: bool = True`, 0.19.0
            // config/scheduler.py L83).
            let chunked = self.chunked_prefill != Some(false);
            r.chunked_prefill = Some(chunked);
            let (tokens, seqs) = match self.device_total_and_name() {
                Some((total, name)) => {
                    super::vllm::v1_default_batch(total, &name, rel, self.llm_class)
                }
                None if self.llm_class => (8192, 256),
                None => (2048, 256),
            };
            if r.tokens == 0 {
                r.tokens = if chunked {
                    tokens
                } else if rel.name == "0.11" {
                    // 0.11.0 engine/arg_utils.py L1667-1668: max_model_len itself.
                    r.max_model_len as usize
                } else {
                    // 0.15.1 engine/arg_utils.py L1993-1998, 0.19.0 L2217-2222, 0.28.0
                    // L2799-2804: "If max_model_len is too short, use the default".
                    (r.max_model_len as usize).max(tokens)
                };
            }
            if r.seqs == 0 {
                r.seqs = seqs.min(r.tokens);
            }
            return r;
        }
        let chunked = r.chunked();
        if chunked {
            r.chunked_prefill = Some(true);
        }
        if r.tokens == 0 {
            r.tokens = match (chunked, self.release()) {
                (true, Ok(rel)) => rel.chunked_prefill_tokens,
                _ => (r.max_model_len as usize).max(VLLM_MIN_BATCHED_TOKENS),
            };
        }
        if r.seqs == 0 {
            r.seqs = VLLM_MAX_NUM_SEQS.min(r.tokens);
        }
        r
    }

    /// The total the request's device reports and its name: a simulated preset's (or
    /// `--total`), a GPU's as the driver lists it; `None` when the GPU cannot be opened.
    pub fn device_total_and_name(&self) -> Option<(u64, String)> {
        match &self.device {
            DeviceSpec::Sim { preset, total, .. } => {
                let p = crate::device::presets::find(preset)?;
                Some((total.unwrap_or(p.total_bytes), p.name.to_string()))
            }
            DeviceSpec::Cuda { .. } => {
                let spec = self.device.to_string();
                crate::device::list_devices()
                    .0
                    .into_iter()
                    .find(|d| d.spec == spec)
                    .map(|d| (d.total_bytes, d.name))
            }
        }
    }

    /// vLLM's scheduler check, in every release: with chunked prefill off, a
    /// `max_num_batched_tokens` below `max_model_len` is refused at start ("ValueError:
    /// max_num_batched_tokens (…) is smaller than max_model_len (…)", `SchedulerConfig.
    /// _verify_args`, 0.6.3 vllm/config.py L1023-1032; V1 `verify_max_model_len`, 0.11.0
    /// config/scheduler.py L234-243, 0.19.0 L259-270, 0.28.0 L249-260). V0 chunks by itself
    /// above a 32k context only; V1 always, unless `--enable-chunked-prefill false`.
    /// `max_positions`: the model's length, which max_model_len is when not given (0: not
    /// known yet; the check then waits for it). Only a given batch can fall short: vLLM's
    /// default batch with chunked prefill off is never below max_model_len.
    pub fn check_batch_covers_length(&self, max_positions: usize) -> Result<()> {
        let len = match (self.max_model_len, max_positions) {
            (0, 0) => return Ok(()),
            (0, p) => p as u64,
            (l, _) => l,
        };
        let tokens = self.tokens as u64;
        if tokens == 0 || tokens >= len {
            return Ok(());
        }
        let v1 = self
            .release()
            .is_ok_and(|r| matches!(r.engine, super::vllm::Engine::V1 { .. }));
        let chunked = if v1 {
            self.chunked_prefill != Some(false)
        } else {
            self.chunked_prefill
                .unwrap_or(len > super::vllm::CHUNKED_PREFILL_ABOVE)
        };
        if chunked {
            return Ok(());
        }
        let with = if self.max_model_len == 0 {
            format!("max_model_len {len} (the model's max_position_embeddings)")
        } else {
            format!("--max-model-len {len}")
        };
        Err(Error::Request(format!(
            "--max-num-batched-tokens {tokens} with {with} and chunked prefill off: vLLM refuses it: \"ValueError: max_num_batched_tokens ({tokens}) is smaller than max_model_len ({len}). This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.\" (give --max-model-len {tokens} or --enable-chunked-prefill true)"
        )))
    }

    /// vLLM's other scheduler check: `max_num_batched_tokens` below `max_num_seqs` is refused
    /// ("ValueError: max_num_batched_tokens (…) must be greater than or equal to max_num_seqs
    /// (…)", 0.6.3 vllm/config.py L1034-1038, 0.8.5 L2033-2037). V0 keeps its 256 sequences
    /// whatever batch is given (0.6.3 engine/arg_utils.py L115; 0.8.5 L1561-1563), so a batch
    /// below 256 tokens with `--max-num-seqs` left out does not start; V1 takes
    /// min(its default, the batch) (0.11.0 engine/arg_utils.py L1676-1679). A given
    /// `--max-num-seqs` above the batch is `validate`'s.
    pub fn check_default_seqs_fit_batch(&self) -> Result<()> {
        let v1 = self
            .release()
            .is_ok_and(|r| matches!(r.engine, super::vllm::Engine::V1 { .. }));
        let tokens = self.tokens;
        if v1 || self.seqs != 0 || tokens == 0 || tokens >= VLLM_MAX_NUM_SEQS {
            return Ok(());
        }
        Err(Error::Request(format!(
            "--max-num-batched-tokens {tokens} with vLLM's default max_num_seqs {VLLM_MAX_NUM_SEQS}: vLLM refuses it: \"ValueError: max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({VLLM_MAX_NUM_SEQS}).\" (give --max-num-seqs {tokens} or fewer)"
        )))
    }

    /// Rejects settings that cannot work, naming the setting (0 tokens or max_model_len mean
    /// vLLM's defaults, filled in by `resolved`).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Request(m));
        use crate::base::limits::{count, count_usize, MAX_MODEL_LEN, MAX_TOKENS};
        // 0 tokens or max_model_len: vLLM's defaults, filled in by `resolved`.
        if self.tokens != 0 {
            count_usize("--max-num-batched-tokens", self.tokens, 1, MAX_TOKENS)?;
        }
        if self.max_model_len != 0 {
            count("--max-model-len", self.max_model_len, 1, MAX_MODEL_LEN)?;
        }
        for (what, bytes) in [
            ("--outside-before", self.outside_before),
            ("--outside-during", self.outside_during),
        ] {
            count(what, bytes, 0, crate::base::limits::MAX_BYTES)?;
        }
        self.check_batch_covers_length(0)?;
        self.check_default_seqs_fit_batch()?;
        // 0 sequences: vLLM's default, filled in by `resolved` (the CLI refuses a given 0).
        if self.tokens > 0 && self.seqs > self.tokens {
            return bad(format!(
                "--max-num-seqs {} must be between 1 and --max-num-batched-tokens ({})",
                self.seqs, self.tokens
            ));
        }
        let release = self.release()?;
        if matches!(release.engine, super::vllm::Engine::V1 { .. })
            && self.tp > 1
            && !self.device.is_sim()
        {
            return bad(format!(
                "--vllm {} --tp {}: vLLM V1's tensor parallel (logits all-gathered, every \
                 rank sampling) runs on simulated devices only so far; run one GPU, a \
                 simulated device or a V0 release",
                self.vllm, self.tp
            ));
        }
        if self.dp == 0 || self.dp > MAX_TP * MAX_NODES {
            return bad(format!(
                "--data-parallel-size {} must be between 1 and {}",
                self.dp,
                MAX_TP * MAX_NODES
            ));
        }
        let v1 = matches!(release.engine, super::vllm::Engine::V1 { .. });
        if (self.dp > 1 || self.enable_expert_parallel) && !v1 {
            return bad(format!(
                "{} with --vllm {}: expert and data parallel are modelled for the V1 releases (0.11 on) so far",
                if self.dp > 1 { "--data-parallel-size" } else { "--enable-expert-parallel" },
                self.vllm
            ));
        }
        if (self.dp > 1 || self.enable_expert_parallel) && !self.device.is_sim() {
            return bad(
                "expert and data parallel run on simulated devices only so far".to_string(),
            );
        }
        if self.dp > 1 && !self.device.is_dry() {
            return bad(format!(
                "--data-parallel-size {}: the replicas' token exchange (all-gather and reduce-scatter around each MoE layer) runs dry only so far: use sim:PRESET:dry",
                self.dp
            ));
        }
        if self.dp > 1 && (self.true_max || matches!(self.model, ModelSource::Synthetic { .. })) {
            return bad(format!(
                "--data-parallel-size {}: run it without --true-max, on a model (not the synthetic workload)",
                self.dp
            ));
        }
        let gpus = self.tp as u64 * self.pp as u64 * self.dp as u64;
        // A tensor-parallel group larger than a host is refused below, as it always was.
        if self.tp <= MAX_TP && gpus > (MAX_TP * self.nodes()) as u64 {
            return bad(format!(
                "--tp {} × --pp {} × --data-parallel-size {}: {gpus} GPUs; {} node(s) of {MAX_TP} hold {} (give --nodes)",
                self.tp,
                self.pp,
                self.dp,
                self.nodes(),
                MAX_TP * self.nodes()
            ));
        }
        if self.nodes == 0 || self.nodes > MAX_NODES {
            return bad(format!(
                "--nodes {} must be between 1 and {MAX_NODES}",
                self.nodes
            ));
        }
        if self.nodes > 1 {
            if !self.device.is_sim() || !self.device.is_dry() {
                return bad(format!(
                    "--nodes {}: a plan across hosts runs dry on simulated devices (sim:PRESET:dry)",
                    self.nodes
                ));
            }
            if !v1 {
                return bad(format!(
                    "--nodes {} with --vllm {}: plans across hosts are modelled for the V1 releases (0.11 on)",
                    self.nodes, self.vllm
                ));
            }
            if gpus <= ((self.nodes() - 1) * MAX_TP) as u64 {
                return bad(format!(
                    "--nodes {}: {gpus} GPUs fill {} host(s) of {MAX_TP}; ask for fewer nodes",
                    self.nodes,
                    gpus.div_ceil(MAX_TP as u64)
                ));
            }
        }
        if self.pp == 0
            || (self.pp > 1 && self.nodes() == 1 && self.tp.saturating_mul(self.pp) > MAX_TP)
        {
            return bad(format!(
                "--pp {} with --tp {}: {} GPUs; vramscope runs the GPUs of one host, {MAX_TP} at most (tp × pp)",
                self.pp,
                self.tp,
                self.tp as u64 * self.pp as u64
            ));
        }
        if self.pp > 1 {
            if !matches!(release.engine, super::vllm::Engine::V1 { .. }) {
                return bad(format!(
                    "--pp {} with --vllm {}: pipeline parallel is modelled for the V1 releases (0.11 on) so far",
                    self.pp, self.vllm
                ));
            }
            if !self.device.is_sim() {
                return bad(format!(
                    "--pp {}: pipeline stages run on simulated devices only so far",
                    self.pp
                ));
            }
            if self.true_max {
                return bad(format!(
                    "--true-max searches one GPU's cache; with --pp {} run it without",
                    self.pp
                ));
            }
            if matches!(self.model, ModelSource::Synthetic { .. }) {
                return bad(format!(
                    "--pp {}: the synthetic workload (vLLM's test_memory_profiling) runs on one GPU",
                    self.pp
                ));
            }
        }
        if let Some(p) = &self.pp_layer_partition {
            if p.len() != self.pp as usize {
                return bad(format!(
                    "VLLM_PP_LAYER_PARTITION {}: vLLM refuses it: \"ValueError: len(partitions)={} does not match pp_size={}.\"",
                    p.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
                    p.len(),
                    self.pp
                ));
            }
        }
        if self.true_max && self.tp > 1 {
            return bad(format!(
                "--true-max searches one GPU's cache; with --tp {} run it without",
                self.tp
            ));
        }
        if self.tp == 0 || self.tp > MAX_TP {
            return bad(format!(
                "--tp {} must be between 1 and {MAX_TP} (the GPUs of one host)",
                self.tp
            ));
        }
        if self.tp > 1 && matches!(self.model, ModelSource::Synthetic { .. }) {
            return bad(format!(
                "--tp {}: the synthetic workload (vLLM's test_memory_profiling) runs on one GPU",
                self.tp
            ));
        }
        if self.passes == 0 || self.passes > 1000 {
            return bad(format!(
                "--passes {} must be between 1 and 1000",
                self.passes
            ));
        }
        if let Some(bytes) = self.kv_cache_memory {
            if !matches!(release.engine, super::vllm::Engine::V1 { .. }) {
                return bad(format!(
                    "--kv-cache-memory: vLLM {} has no such flag (V1 releases have it, 0.11 on)",
                    self.vllm
                ));
            }
            count(
                "--kv-cache-memory",
                bytes,
                1,
                crate::base::limits::MAX_BYTES,
            )?;
        }
        if !(self.util > 0.0 && self.util <= 1.0) {
            return bad(format!("--util {} must be in (0, 1]", self.util));
        }
        if self.block_size == 0 || self.block_size > 4096 {
            return bad(format!(
                "--block-size {} must be between 1 and 4096",
                self.block_size
            ));
        }
        if !(self.int8_threshold >= 0.0 && self.int8_threshold.is_finite()) {
            return bad(format!(
                "--int8-threshold {} must be a finite number ≥ 0",
                self.int8_threshold
            ));
        }
        Ok(())
    }
}

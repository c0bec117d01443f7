//! The vLLM releases whose profile run vramscope reproduces, as data: one row per release,
//! read from that release's own Python source (its wheel on PyPI; 380e1863 from vLLM's git).
//! Everything that differs between them and changes the KV budget is a field here, so a
//! release is added by adding a row, not by `if`s in the procedure.
//!
//! Citations are `file:line` in the release named. What the rows agree on (the sampler's
//! memory path, the last-token logits, the dummy `SamplingParams(top_p=0.99, top_k=V−1)`,
//! 256 sequences, block bytes) is modelled once, in `model` and `procedure`.

use serde::{Deserialize, Serialize};

use super::formulas::FormulaId;
use crate::base::error::{Error, Result};
use crate::device::nccl_model::NcclRules;
use crate::engine::ops_moe_v1::{Modular, MoeKernel, RunnerV021};
use crate::quant::fp8_block::Fp8BlockEra;

/// The log lines a release prints after its profile run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStyle {
    /// 0.6.3: no memory line, only the engine's `# GPU blocks: N, # CPU blocks: M`.
    BlocksOnly,
    /// #9516 (380e1863, 0.6.4): `Memory profiling results: total_gpu_memory=… …`
    /// (0.6.4.post1 worker/worker.py:232-243; 380e1863 and plain 0.6.4 print `Gib` after
    /// memory_usage_post_profile, a typo fixed in 0.6.4.post1).
    MemoryProfilingResults { gib_typo: bool },
    /// #10511 and later (0.6.5 worker/worker.py:225-241, 0.7.0 :250-266, 0.10.0 :279-295):
    /// `Memory profiling takes … seconds` / `the current vLLM instance can use …` / `model
    /// weights take …; non_torch_memory takes …; PyTorch activation peak memory takes …; the
    /// rest of the memory reserved for KV Cache is ….`
    InstanceCanUse,
    /// The V1 engine (0.15.1 and 0.19.0 v1/worker/gpu_worker.py; v1/core/kv_cache_utils.py):
    /// INFO `Available KV cache memory: … GiB`, `GPU KV cache size: N tokens`, `Maximum
    /// concurrency for L tokens per request: X.XXx`, and at DEBUG the profiling result
    /// (`Memory profiling takes … seconds. Total non KV cache memory: …GiB; torch peak memory
    /// increase: …GiB; non-torch forward increase memory: …GiB; weights memory: …GiB.`).
    V1,
}

/// Which engine a release profiles with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// `Worker.determine_num_available_blocks` with V0's `ModelRunner.profile_run`.
    V0,
    /// `Worker.determine_available_memory` with V1's `GPUModelRunner.profile_run`: chunked
    /// prefill always on; one `_dummy_run` of max_num_batched_tokens split into
    /// min(tokens, max_num_seqs) requests, attention skipped (no attention metadata: the
    /// backend returns zeros, 0.19.0 v1/attention/backends/flash_attn.py:666-668); then
    /// `_dummy_sampler_run` on the last token of each request, through `torch.rand_like`
    /// of those hidden states (0.19.0 v1/worker/gpu_model_runner.py:5556-5601); the baseline
    /// is taken after NCCL starts (0.19.0 v1/worker/gpu_worker.py:263, :282).
    V1 { top_k_top_p: TopKTopP },
}

/// How V1's sampler applies top-k and top-p (v1/sample/ops/topk_topp_sampler.py).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopKTopP {
    /// PyTorch's sort (0.15.1 topk_topp_sampler.py:243-300): sorted values and their
    /// indices, the masks, the sorted probabilities, scattered back in place.
    Sort,
    /// A Triton kernel from 8 rows on (0.19.0 topk_topp_sampler.py:245-255,
    /// topk_topp_triton.py:965-1040): in place, with one cached `[min(pow2(R'), SMs), V]`
    /// buffer in the logits' dtype (R' = min(SMs, rows)) that stays allocated; PyTorch's sort
    /// below 8 rows.
    Triton,
    /// 0.21: the dummy sampler runs twice (0.21.0 v1/worker/gpu_model_runner.py:5746-5765):
    /// first FlashInfer's top-k/top-p sampling (the default from 0.21 on compute capability
    /// 7.5 to 12.1), then with a generator, which takes the native path, Triton's.
    FlashInferThenTriton,
}

/// How a row-parallel layer's all-reduce allocates with tensor parallel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllReduce {
    /// 380e1863 to 0.6.4: vLLM's custom all-reduce (under 8 MiB) returns a new tensor;
    /// larger ones are reduced in place through torch.distributed, whose NCCL communicator
    /// is made at the first such call (pynccl is disabled outside graph capture:
    /// 0.6.3.post1 distributed/device_communicators/pynccl.py:99-102,
    /// distributed/parallel_state.py:367-375).
    InPlaceAboveCustom,
    /// 0.6.5 and later (#10121): always out of place; above the custom kernel's size through
    /// pynccl, which is enabled from the start and allocates `torch.empty_like(input)`
    /// (0.6.5 distributed/parallel_state.py:357-378, pynccl.py:109-132).
    OutOfPlace,
}

/// The CUDA graphs a release captures after its KV cache, and what its budget knows of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Graphs {
    /// Not reproduced: 380e1863, kept as the seed's reference (its reports stay byte for
    /// byte), and 0.7 (its attention backend in decode is not read yet).
    NotModelled,
    /// V0's `ModelRunner.capture_model` (0.6.4.post1 worker/model_runner.py; 0.8.5 the same
    /// shape): the persistent decode inputs, then per batch size `[1, 2, 4] + 8k` up to
    /// max_num_seqs rounded up to 8, largest first, two eager warm-ups and one whole-model
    /// graph with attention (docs/reading/vllm-v0-graphs.md).
    V0 { attention: V0Attention },
    /// V1: FULL_AND_PIECEWISE at the optimization level's default, sizes `[1, 2, 4] +
    /// range(8, 256, 8) + range(256, max + 1, 16)` with max = min(2 · max_num_seqs, 512,
    /// max_num_batched_tokens) (0.19.0 config/vllm.py:1352-1353, 1399-1403), PIECEWISE first,
    /// each largest first (v1/cudagraph_dispatcher.py:325-349), one warm-up per size
    /// (config/vllm.py:1023-1031).
    V1 {
        /// 0.11 steps by 8 all the way: `[1, 2, 4] + range(8, max + 1, 8)` (0.11.0
        /// config/__init__.py:592-606, 67 sizes for max 512).
        step8: bool,
        /// 0.21 adds max_num_batched_tokens itself when it is at most the largest size
        /// (0.21.0 config/vllm.py:1526-1586).
        adds_batch_size: bool,
        estimator: Estimator,
        /// `capture_model` ends with `synchronize()` and `empty_cache()` (0.19.0
        /// v1/worker/gpu_model_runner.py L6035-6036; 0.21.0 L6232-6233), so the segments its
        /// side stream cached are gone before the sampler's warm-up; 0.11.0 (L3466-3482) and
        /// 0.15.1 (L5045-5069) keep them.
        empties_cache: bool,
    },
}

/// The attention kernel of V0's decode graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V0Attention {
    /// vllm-flash-attn 2's `flash_attn_with_kvcache`, its splits from FA2's heuristic.
    Fa2,
    /// FlashAttention 3 on Hopper (0.8.5's V0 backend; FA2 elsewhere).
    Fa3OnHopper,
}

/// vLLM's CUDA graph memory estimator (`profile_cudagraph_memory`, PR #37426's line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimator {
    /// Not in the release (0.15.1 has no `profile_cudagraph_memory`).
    Absent,
    /// Computed and logged, not subtracted: `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`
    /// defaults to 0 (0.19.0 envs.py:1654-1655, v1/worker/gpu_worker.py:379-399).
    Computed,
    /// Subtracted from the KV budget: the variable defaults to 1 (0.21.0 envs.py:1768-1769,
    /// gpu_worker.py:421-447).
    Applied,
}

/// One vLLM release's profile run and budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Release {
    /// As the user names it (`--vllm 0.6.4`).
    pub name: &'static str,
    /// Other spellings that mean the same code (`0.6.4.post1`, `0.7.3`).
    pub aliases: &'static [&'static str],
    /// The formula `Worker.determine_num_available_blocks` applies.
    pub formula: FormulaId,
    /// Whether T·u is rounded up (V1's gpu_worker) or taken as vLLM's float product, floored
    /// into blocks (every V0 release: `total_gpu_memory * gpu_memory_utilization`).
    pub ceil_budget: bool,
    /// Llama's MLP rebinds `x` to `act_fn(gate_up)`, so `gate_up` dies before `down_proj`
    /// (#10339, in 0.6.4: 0.6.4.post1 model_executor/models/llama.py:92-96). Qwen2's MLP
    /// never did (qwen2.py in every release here).
    pub llama_mlp_frees_gate_up: bool,
    /// Gemma 1's and 2's `embed_input_ids` return `embed_tokens(ids) * normalizer`, a new
    /// tensor (0.19.0 gemma.py L296, gemma2.py L287; the same in 0.21.0); up to 0.15 the
    /// forward scales in place (`hidden_states *= self.normalizer`, 0.15.1 gemma.py L310,
    /// gemma2.py L304; 0.11.0 gemma.py L306).
    pub gemma_normalizer_out_of_place: bool,
    pub all_reduce: AllReduce,
    /// The custom all-reduce's `meta` and `buffer` are `cudaMalloc`ed IPC buffers outside the
    /// caching allocator (#10030, in 0.6.4: 0.6.4 distributed/device_communicators/
    /// custom_all_reduce.py:153-175); only `rank_data` (8 MiB) stays a torch tensor. Before,
    /// all three came from the caching allocator (0.6.3.post1 custom_all_reduce.py:152-167).
    pub custom_ar_ipc_buffers: bool,
    /// `max_num_batched_tokens` when chunked prefill is on and the user gave none: 512 up
    /// to 0.6.4 (0.6.4.post1 config.py:1103-1118), 2048 from 0.6.5 (0.6.5 config.py:1333-1348).
    pub chunked_prefill_tokens: usize,
    pub log: LogStyle,
    /// The torch release its wheel pins (the caching allocator's rules are the same ones).
    pub torch: &'static str,
    /// The NCCL a simulated tensor-parallel instance of this release models: the one its
    /// PyTorch ships, with cuMem off as the release sets it. 380e1863 keeps vramscope's own,
    /// measured NCCL, so its dry entries stay equal to the GPU runs'.
    pub nccl: NcclRules,
    /// What changed in this release, for `--vllm list` and docs.
    pub changes: &'static str,
    pub engine: Engine,
    /// The wheel has vllm/model_executor/models/qwen3.py (0.8.5's has, 0.7.3's has not).
    pub has_qwen3: bool,
    /// The wheel has vllm/model_executor/models/gemma3.py (0.8.5's has, 0.7.3's has not).
    pub has_gemma3: bool,
    /// The wheel has vllm/model_executor/models/gpt_oss.py (0.10.1's has, 0.10.0's has not).
    pub has_gpt_oss: bool,
    /// Its quantized linear paths (bitsandbytes, fp8) were read and are reproduced; `false`:
    /// 16-bit models only, the others refused by name (0.10, read for Gemma 3).
    pub quantized_read: bool,
    /// How the release runs an unquantized mixture of experts on one GPU or with tensor
    /// parallel (no expert parallel).
    pub fused_moe: FusedMoe,
    /// How the release runs multi-head latent attention (DeepSeek, Kimi); `None`: not
    /// modelled (the V0 releases).
    pub mla: Option<MlaEra>,
    /// How the release runs block-wise fp8 linears (`weight_block_size`); `None`: not
    /// modelled (refused by name).
    pub fp8_block: Option<Fp8BlockEra>,
    /// 0-dim f32 tensors every attention layer makes on the device while the model is built
    /// (under the loader's `with target_device`; `LoadOptions::attn_scalars`): none up to
    /// 0.6.6 (`self._k_scale = 1.0`, a float: 0.6.6 attention/layer.py L72); `_k_scale`,
    /// `_v_scale` in 0.7 (0.7.0 attention/layer.py L77-78, 0.7.3 L80-81); with `_q_scale`
    /// and `_prob_scale` in 0.8.5 (L88-93); V1's `set_default_quant_scales` adds `q_range`,
    /// `k_range`, `v_range` (0.15.0 attention/layer.py L60-81, 0.19.0
    /// model_executor/layers/attention/attention.py L89-114).
    pub attn_scalars: usize,
    pub graphs: Graphs,
    /// V1's `GPU KV cache size` line: `int(max_concurrency · max_model_len)` tokens from 0.21
    /// (0.21.0 v1/core/kv_cache_utils.py:1708-1715), blocks · block_size before.
    pub tokens_from_concurrency: bool,
    /// Which models the release runs on Model Runner V2 when `VLLM_USE_V2_MODEL_RUNNER` is
    /// unset.
    pub runner_v2: RunnerV2,
    /// What Model Runner V2 does in this release where it differs from V1's runner (`None`:
    /// the release has no V2 runner by default).
    pub v2: Option<V2>,
    /// How the release words its `--kv-cache-memory` suggestion and what it sums.
    pub suggestion: Suggestion,
    /// `vllm serve` takes 16384 tokens and 1024 sequences on a GPU of 160 GiB or more
    /// (0.28.0 engine/arg_utils.py:2582-2591; not in 0.27.1 :2544).
    pub serve_batch_160gib: bool,
    /// The worker makes its cuBLAS and cuBLASLt handles (and PyTorch their workspaces) before
    /// the baseline snapshot, so they are not in the instance's consumption (0.33.0
    /// v1/worker/gpu_worker.py:518-529; not in 0.32.0).
    pub cublas_before_baseline: bool,
    /// `max_split_size_mb` vLLM sets on PyTorch's allocator around its weight load
    /// (`_scoped_allocator_max_split(max_split_size_mb=20)` over `load_model`: 0.21.0
    /// v1/worker/gpu_worker.py:338-344, 0.28.0 :450-457) and around its profile run (0.31.0
    /// :615-626, 0.33.0 :688-699; memory_profiling measures after the limit is lifted).
    pub load_max_split_mib: Option<u64>,
    pub profile_max_split_mib: Option<u64>,
    /// One `GPU KV cache size: N tokens, Maximum concurrency for L tokens per request: X.XXx`
    /// line (0.28.0 v1/core/kv_cache_utils.py:1869-1875) instead of two.
    pub kv_line_combined: bool,
    /// The hybrid KV cache manager stays on for a model with chunked local attention (Llama 4):
    /// `VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE` defaults to 1 (0.15.1 envs.py
    /// L1472-1474, 0.19.0 L1459-1461); 0.11.0 defaults it to 0 (envs.py L1389-1391) and turns
    /// the manager off with a warning (config/__init__.py L512-528, #21761), every layer then
    /// holding every token (`unify_hybrid_kv_cache_specs`, v1/core/kv_cache_utils.py
    /// L1096-1145).
    pub chunked_local_hybrid: bool,
    /// How the release profiles a multimodal model's encoder (V1's `profile_run`); `None`:
    /// not modelled (V0).
    pub mm: Option<MmProfile>,
}

/// A V1 release's multimodal profile, as far as it differs between releases
/// (docs/reading/vllm-multimodal-profile.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmProfile {
    /// An item's tokens for the encoder budget count its whole placeholder (0.11:
    /// `get_mm_max_contiguous_tokens`, multimodal/profiling.py L266-284; Gemma 3's
    /// `\n\n<boi>` + 256 image tokens + `<eoi>\n\n`: 260) rather than its embeddings (0.15:
    /// multimodal/registry.py L195; 0.19: multimodal/encoder_budget.py `get_num_embeds`: 256).
    pub placeholder_tokens: bool,
    /// The images a prompt may hold are capped at `max_model_len // tokens per item`, and
    /// the requests at `max_num_batched_tokens // tokens per item` without chunked prefill
    /// (`MultiModalBudget.get_max_items`, 0.11.0 v1/worker/utils.py L24-127); 0.10.0 takes
    /// `max_num_seqs × --limit-mm-per-prompt` as it is (gpu_model_runner.py L2366-2379).
    pub items_capped_by_model_len: bool,
    /// Each dummy output shorter than the budget is copied into a new zero `[budget,
    /// hidden]` tensor (`new_zeros`, then `expanded[:n].copy_(output)`) and those are what
    /// the encoder cache holds through the text pass: 0.11 only (0.11.0
    /// v1/worker/gpu_model_runner.py L3369-3385). 0.10.0 caches the outputs as the model
    /// returns them (L2403-2412: `self.encoder_cache["tmp"] = dict(enumerate(...))`), and so
    /// do 0.15 and later (0.15.1 L4978-4983, 0.19.0 L5774-5779, 0.26.0 L6421, 0.28.0 L6615:
    /// `self.encoder_cache[f"tmp_{i}"] = output`): views of one projector output.
    pub pads_to_budget: bool,
    /// `--limit-mm-per-prompt` 0 for every modality also skips building the tower
    /// (`_mark_tower_model`, 0.15 and 0.19 models/interfaces.py L249-288); 0.10 and 0.11
    /// build it (0.10.0 gemma3_mm.py L493-509).
    pub tower_skipped_at_zero: bool,
    /// With every modality limited to 0 the runner embeds the token ids as a text model does
    /// (`supports_mm_inputs`, 0.11.0 v1/worker/gpu_model_runner.py L243); 0.10.0 keys the
    /// dummy pass on `is_multimodal_model` (`multimodal_config is not None`, config.py
    /// L1555-1556; gpu_model_runner.py L126, L2135-2139) and still hands the model its
    /// `inputs_embeds` buffer.
    pub text_only_at_zero: bool,
    /// The vision tower's attention kernel.
    pub vision_attention: VisionAttention,
}

/// How a release runs the vision tower's attention (vLLM's `MultiHeadAttention` /
/// `MMEncoderAttention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionAttention {
    /// FlashAttention's varlen call with its `cu_seqlens` (0.15, 0.19 and later).
    FlashVarlen,
    /// PyTorch's SDPA on Blackwell (0.11 platforms/cuda.py L217-220: "force TORCH_SDPA for
    /// now"), FlashAttention's varlen call elsewhere.
    SdpaOnBlackwell,
    /// xFormers' `memory_efficient_attention_forward` on `[N, S, heads, head_dim]` views, no
    /// `cu_seqlens` (0.10.0 attention/layer.py L334-355 maps the text backend FlashAttention
    /// to XFORMERS, L377-383; xformers==0.0.31 is a dependency of the 0.10.0 wheel on x86_64
    /// Linux, FlashInfer is not, so FlashAttention is the text backend on Blackwell too,
    /// platforms/cuda.py L264-292). Its output and f32 log-sum-exp as FlashAttention's.
    Xformers,
}

impl VisionAttention {
    /// Whether the call builds `cu_seqlens` on a GPU of compute capability `major`.
    pub fn varlen(self, major: u32) -> bool {
        match self {
            VisionAttention::FlashVarlen => true,
            VisionAttention::SdpaOnBlackwell => major < 10,
            VisionAttention::Xformers => false,
        }
    }

    /// Its name in the report, on a GPU of compute capability `major`.
    pub fn label(self, major: u32) -> &'static str {
        match self {
            VisionAttention::Xformers => "xFormers memory-efficient",
            _ if self.varlen(major) => "FlashAttention varlen",
            _ => "PyTorch SDPA",
        }
    }
}

/// Which models run on Model Runner V2 (`vllm/v1/worker/gpu/model_runner.py`) by default:
/// `VllmConfig.use_v2_model_runner` with `VLLM_USE_V2_MODEL_RUNNER` unset. The names are
/// vramscope's model types (config.json `model_type`) for vLLM's architectures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunnerV2 {
    /// Never (the variable defaults to off: 0.21.0 envs.py, `VLLM_USE_V2_MODEL_RUNNER`).
    Off,
    /// Dense, unquantized models of these types (0.22.1 config/vllm.py:69, :518-532;
    /// 0.23.0 :69-75, :544-558).
    DenseUnquantized(&'static [&'static str]),
    /// Models of these types, quantized or not (0.24.0 config/vllm.py:68-77, :550-561).
    Listed(&'static [&'static str]),
    /// Every model without experts, quantized or not, that is neither hybrid nor
    /// attention-free, and a few listed mixtures of experts (0.25.1 config/vllm.py:557-574;
    /// 0.26.0 :605-622; 0.27.1 :637-660; 0.28.0 :691-714).
    EveryDense,
    /// Every model, unless a feature V2 lacks is asked for (0.29.0 config/vllm.py:645-677;
    /// 0.33.0 the same shape).
    Every,
}

/// Model Runner V2's profile run, where it differs from V1's (`GPUModelRunner`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V2 {
    /// `profile_cudagraph_memory` measures the graphs (`_profile_cudagraph_memory`, from
    /// 0.29.0 v1/worker/gpu/model_runner.py:896-898); before, it returns 0 (0.22.1
    /// :620-622 … 0.28.0 :843-845), so nothing comes off the KV budget for the graphs.
    pub estimates_graphs: bool,
    /// 0.33 runs the dummy sampler a second time with `SamplingParams.for_sampler_warmup()`
    /// for every request (0.33.0 v1/worker/gpu/model_runner.py:1008-1014). Not modelled:
    /// vramscope runs the first, default pass only.
    pub warmup_sampler_pass: bool,
}

/// The `--kv-cache-memory` suggestion `compile_or_warm_up_model` prints after the capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suggestion {
    /// DEBUG, weights + torch peak increase + non-torch increase + the graphs' actual memory
    /// (0.19.0 v1/worker/gpu_worker.py:620-660; 0.25.1 :796-835).
    Debug,
    /// The same sum at INFO (0.26.0 v1/worker/gpu_worker.py:857).
    Info,
    /// #49208's terms at INFO: total consumed + peak activation + the graphs' actual memory,
    /// where peak activation is the transient headroom *plus the estimate applied*, so the
    /// graphs count twice (0.27.1 v1/worker/gpu_worker.py:526-529, :751-782; vLLM issue
    /// #57936).
    Consumed,
}

/// How a release runs an unquantized mixture of experts (no expert parallel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedMoe {
    /// Reproduced, with this kernel.
    Kernel(MoeKernel),
    /// 0.21's oracle (`select_unquantized_moe_backend`, 0.21.0 fused_moe/oracle/unquantized.py
    /// L150-295): the first of FlashInfer TRT-LLM, FlashInfer CUTLASS, Triton whose
    /// `is_supported_config` takes the GPU. FlashInfer is a hard dependency of the wheel
    /// (`flashinfer-python==0.6.8.post1` in 0.21.0's METADATA, 0.6.11.post2 in 0.22.1's,
    /// 0.6.12 in 0.23.0's); its CUTLASS experts take compute capability 9.0, the 10.x and the
    /// 12.x families (experts/flashinfer_cutlass_moe.py L124-136, unquantized from 9.0:
    /// L150-159), TRT-LLM's the 10.x family (experts/trtllm_bf16_moe.py L45-53), so Triton
    /// runs on Ampere and Ada (sm80-sm89), reproduced with `triton`. From 0.23 Hopper moves
    /// both FlashInfer backends behind Triton (0.23.0 oracle/unquantized.py L71-75: "On Hopper
    /// (SM90), the FlashInfer unquantized MoE kernels are slower than Triton").
    Oracle {
        triton: Modular,
        /// FlashInfer's CUTLASS experts take Hopper (0.21, 0.22); `false`: Triton does (0.23).
        flashinfer_on_hopper: bool,
        /// DeepSeek's block (`DeepseekV2MoE`, MLA models) is read for this release: 0.21-0.33
        /// (Model Runner V2 runs DeepSeek-V2 from 0.24, V3 and Kimi-K2 from 0.29;
        /// docs/reading/vllm-deepseek-v2-runner.md).
        deepseek: bool,
    },
    /// Not reproduced, and why.
    Unmodelled(&'static str),
}

/// The release a request names when it names none: PR #9516's own commit, the seed's
/// reference, reproduced allocation for allocation.
pub const DEFAULT: &str = "380e1863";

/// Every release vramscope reproduces, oldest first.
pub const RELEASES: &[Release] = &[
    Release {
        name: "0.6.3",
        aliases: &["0.6.3.post1"],
        formula: FormulaId::V0_6_3,
        ceil_budget: false,
        llama_mlp_frees_gate_up: false,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::InPlaceAboveCustom,
        custom_ar_ipc_buffers: false,
        chunked_prefill_tokens: 512,
        log: LogStyle::BlocksOnly,
        torch: "2.4.0",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "free memory at init_device minus free memory right after the profile pass, \
                  read before empty_cache (worker/worker.py:205-254); no memory log line",
        engine: Engine::V0,
        has_qwen3: false,
        has_gemma3: false,
        has_gpt_oss: false,
        quantized_read: true,
        fused_moe: FusedMoe::Unmodelled(
            "0.6.x chunks and names its fused MoE buffers differently from 0.8.5",
        ),
        mla: None,
        fp8_block: None,
        attn_scalars: 0,
        graphs: Graphs::V0 {
            attention: V0Attention::Fa2,
        },
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: false,
        mm: None,
    },
    Release {
        name: "380e1863",
        aliases: &["pr9516", "#9516"],
        formula: FormulaId::Pr9516,
        ceil_budget: false,
        llama_mlp_frees_gate_up: false,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::InPlaceAboveCustom,
        custom_ar_ipc_buffers: false,
        chunked_prefill_tokens: 512,
        log: LogStyle::MemoryProfilingResults { gib_typo: true },
        torch: "2.4.0",
        nccl: NcclRules::Nccl228Measured,
        changes: "#9516 total-minus-torch: Â + max(0, U(t3) − A(t3)); Llama's gate_up alive \
                  through down_proj",
        engine: Engine::V0,
        has_qwen3: false,
        has_gemma3: false,
        has_gpt_oss: false,
        quantized_read: true,
        fused_moe: FusedMoe::Unmodelled(
            "0.6.x chunks and names its fused MoE buffers differently from 0.8.5",
        ),
        mla: None,
        fp8_block: None,
        attn_scalars: 0,
        graphs: Graphs::NotModelled,
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: false,
        mm: None,
    },
    Release {
        name: "0.6.4",
        aliases: &["0.6.4.post1"],
        formula: FormulaId::Pr9516,
        ceil_budget: false,
        llama_mlp_frees_gate_up: true,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::InPlaceAboveCustom,
        custom_ar_ipc_buffers: true,
        chunked_prefill_tokens: 512,
        log: LogStyle::MemoryProfilingResults { gib_typo: false },
        torch: "2.5.1",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "#9516's formula; #10339: Llama's MLP drops gate_up before down_proj \
                  (models/llama.py:92-96)",
        engine: Engine::V0,
        has_qwen3: false,
        has_gemma3: false,
        has_gpt_oss: false,
        quantized_read: true,
        fused_moe: FusedMoe::Unmodelled(
            "0.6.x chunks and names its fused MoE buffers differently from 0.8.5",
        ),
        mla: None,
        fp8_block: None,
        attn_scalars: 0,
        graphs: Graphs::V0 {
            attention: V0Attention::Fa2,
        },
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: false,
        mm: None,
    },
    Release {
        name: "0.6.5",
        aliases: &["0.6.6", "0.6.6.post1"],
        formula: FormulaId::Pr10511,
        ceil_budget: false,
        llama_mlp_frees_gate_up: true,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::OutOfPlace,
        custom_ar_ipc_buffers: true,
        chunked_prefill_tokens: 2048,
        log: LogStyle::InstanceCanUse,
        torch: "2.5.1",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "#10511 per-instance formula (worker/worker.py:177-248, utils.py:1661-1738); \
                  #10121: every all-reduce out of place through pynccl; chunked prefill's \
                  batch 2048",
        engine: Engine::V0,
        has_qwen3: false,
        has_gemma3: false,
        has_gpt_oss: false,
        quantized_read: true,
        fused_moe: FusedMoe::Unmodelled(
            "0.6.x chunks and names its fused MoE buffers differently from 0.8.5",
        ),
        mla: None,
        fp8_block: None,
        attn_scalars: 0,
        graphs: Graphs::V0 {
            attention: V0Attention::Fa2,
        },
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: false,
        mm: None,
    },
    Release {
        name: "0.7",
        aliases: &["0.7.0", "0.7.1", "0.7.2", "0.7.3"],
        formula: FormulaId::Pr12126,
        ceil_budget: false,
        llama_mlp_frees_gate_up: true,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::OutOfPlace,
        custom_ar_ipc_buffers: true,
        chunked_prefill_tokens: 2048,
        log: LogStyle::InstanceCanUse,
        torch: "2.5.1",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "#12126 reserved-based formula, V0 without the ceil (0.7.0 worker/worker.py:\
                  204-273, utils.py:1983-2056)",
        engine: Engine::V0,
        has_qwen3: false,
        has_gemma3: false,
        has_gpt_oss: false,
        quantized_read: true,
        fused_moe: FusedMoe::Unmodelled("0.7.3's fused MoE is not checked against 0.8.5's yet"),
        mla: None,
        fp8_block: None,
        attn_scalars: 2,
        graphs: Graphs::NotModelled,
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: false,
        mm: None,
    },
    Release {
        name: "0.8",
        aliases: &["0.8.5", "0.9", "0.9.2"],
        formula: FormulaId::Pr12126,
        ceil_budget: false,
        llama_mlp_frees_gate_up: true,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::OutOfPlace,
        custom_ar_ipc_buffers: true,
        chunked_prefill_tokens: 2048,
        log: LogStyle::InstanceCanUse,
        torch: "2.6.0 / 2.7.1",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "0.8 to 0.10, the V0 engine under VLLM_USE_V1=0 (bitsandbytes forced it onto V0; \
                  0.10's default V1 engine is the 0.10 row): 0.7's \
                  profile run and formula (0.8.5 worker/worker.py:225-291)",
        engine: Engine::V0,
        has_qwen3: true,
        has_gemma3: true,
        has_gpt_oss: false,
        quantized_read: true,
        fused_moe: FusedMoe::Kernel(MoeKernel::InPlace {
            indices_freed_late: false,
        }),
        mla: None,
        fp8_block: Some(Fp8BlockEra::V0_8),
        attn_scalars: 4,
        graphs: Graphs::V0 {
            attention: V0Attention::Fa3OnHopper,
        },
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: false,
        mm: None,
    },
    Release {
        name: "0.10",
        aliases: &["0.10.0"],
        formula: FormulaId::Pr12126,
        // `requested_memory = total_memory * gpu_memory_utilization`, a float (0.10.0
        // v1/worker/gpu_worker.py L164-165), as 0.11.
        ceil_budget: false,
        llama_mlp_frees_gate_up: true,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::OutOfPlace,
        custom_ar_ipc_buffers: true,
        chunked_prefill_tokens: 2048,
        log: LogStyle::V1,
        torch: "2.7.1",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "V1, vLLM 0.10.0's default engine (read from its wheel for Gemma 3, the model \
                  Q10 ran): the profile baseline, formula and dummy pass as 0.11 (v1/worker/\
                  gpu_worker.py L211-259, utils/__init__.py L2642-2715, gpu_model_runner.py \
                  L2072-2200, T·u a float), the sampler's sort (FlashInfer is not a \
                  dependency of the wheel); the multimodal profile counts an image's 256 \
                  embeddings (`get_num_embeds`, multimodal/profiling.py L180-189), caches the \
                  encoder outputs as returned, no budget-sized copies (gpu_model_runner.py \
                  L2342-2427), the vision attention through xFormers (attention/layer.py \
                  L334-355), the inputs_embeds buffer even with every image limit 0. Not read, \
                  so not modelled: its CUDA graphs (PIECEWISE only, sizes up to min(2 · \
                  max_num_seqs, 512) in steps of 8: config.py L4756-4776), mixtures of \
                  experts, MLA, block-wise fp8; 0.10.1 counts the 260-token placeholder \
                  (multimodal/registry.py L174) and is not listed",
        engine: Engine::V1 {
            top_k_top_p: TopKTopP::Sort,
        },
        has_qwen3: true,
        has_gemma3: true,
        has_gpt_oss: false,
        quantized_read: false,
        fused_moe: FusedMoe::Unmodelled("0.10.0's fused MoE is not read"),
        mla: None,
        fp8_block: None,
        // `_k_scale`, `_v_scale`, `_q_scale`, `_prob_scale` and `q_range`, `k_range`,
        // `v_range` (0.10.0 attention/layer.py L122-127, L214-216).
        attn_scalars: 7,
        graphs: Graphs::NotModelled,
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        // No VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE in 0.10.0's envs.py.
        chunked_local_hybrid: false,
        mm: Some(MmProfile {
            placeholder_tokens: false,
            items_capped_by_model_len: false,
            pads_to_budget: false,
            tower_skipped_at_zero: false,
            text_only_at_zero: false,
            vision_attention: VisionAttention::Xformers,
        }),
    },
    Release {
        name: "0.11",
        aliases: &["0.11.0"],
        formula: FormulaId::Pr12126,
        ceil_budget: false,
        llama_mlp_frees_gate_up: true,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::OutOfPlace,
        custom_ar_ipc_buffers: true,
        chunked_prefill_tokens: 2048,
        log: LogStyle::V1,
        torch: "2.8",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "V1 as 0.15 but requested = T·u as a float, not rounded up (v1/worker/\
                  gpu_worker.py:182-184); capture sizes in steps of 8 up to 512 (67 for \
                  1024 sequences, config/__init__.py:592-606); no graph estimate; the \
                  sampler's sort, as `pip install vllm==0.11.0` runs it (FlashInfer, whose \
                  sampler would take 14 bytes per logit instead of the sort's, is an optional \
                  extra there: METADATA `extra == \"flashinfer\"`)",
        engine: Engine::V1 {
            top_k_top_p: TopKTopP::Sort,
        },
        has_qwen3: true,
        has_gemma3: true,
        has_gpt_oss: true,
        quantized_read: true,
        fused_moe: FusedMoe::Kernel(MoeKernel::InPlace {
            indices_freed_late: true,
        }),
        mla: Some(MlaEra::V0_11),
        fp8_block: Some(Fp8BlockEra::V0_11),
        attn_scalars: 7,
        graphs: Graphs::V1 {
            step8: true,
            adds_batch_size: false,
            estimator: Estimator::Absent,
            empties_cache: false,
        },
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: false,
        mm: Some(MmProfile {
            placeholder_tokens: true,
            items_capped_by_model_len: true,
            pads_to_budget: true,
            tower_skipped_at_zero: false,
            text_only_at_zero: true,
            vision_attention: VisionAttention::SdpaOnBlackwell,
        }),
    },
    Release {
        name: "0.15",
        aliases: &["0.15.0", "0.15.1"],
        formula: FormulaId::Pr12126,
        ceil_budget: true,
        llama_mlp_frees_gate_up: true,
        gemma_normalizer_out_of_place: false,
        all_reduce: AllReduce::OutOfPlace,
        custom_ar_ipc_buffers: true,
        chunked_prefill_tokens: 2048,
        log: LogStyle::V1,
        torch: "2.9",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "V1: requested = ceil(T·u) (v1/worker/utils.py:250-255); non-KV = weights + \
                  torch peak increase + non-torch increase since the baseline after NCCL \
                  (v1/worker/gpu_worker.py:218-340); profile batch 8192 tokens / 1024 \
                  requests on a GPU of 70 GiB or more that is not an A100, else 2048 / 256 \
                  (engine/arg_utils.py, `vllm serve`); attention skipped in the profile; the \
                  sampler's top-k/top-p by PyTorch's sort; CUDA graphs after the KV cache, \
                  outside the budget, with no estimate",
        engine: Engine::V1 {
            top_k_top_p: TopKTopP::Sort,
        },
        has_qwen3: true,
        has_gemma3: true,
        has_gpt_oss: true,
        quantized_read: true,
        // 0.15.1 fused_moe/modular_kernel.py over TritonExperts, chunks of 16384
        // (VLLM_FUSED_MOE_CHUNK_SIZE with activation chunking on, envs.py).
        fused_moe: FusedMoe::Kernel(MoeKernel::Modular(Modular {
            chunk_tokens: Some(16384),
            default_block_m_by_tokens: false,
            v0_21: None,
        })),
        mla: Some(MlaEra::V0_15),
        fp8_block: Some(Fp8BlockEra::V0_15),
        attn_scalars: 7,
        graphs: Graphs::V1 {
            step8: false,
            adds_batch_size: false,
            estimator: Estimator::Absent,
            empties_cache: false,
        },
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: true,
        mm: Some(MmProfile {
            placeholder_tokens: false,
            items_capped_by_model_len: true,
            pads_to_budget: false,
            tower_skipped_at_zero: true,
            text_only_at_zero: true,
            vision_attention: VisionAttention::FlashVarlen,
        }),
    },
    Release {
        name: "0.19",
        aliases: &["0.19.0"],
        formula: FormulaId::Pr12126,
        ceil_budget: true,
        llama_mlp_frees_gate_up: true,
        gemma_normalizer_out_of_place: true,
        all_reduce: AllReduce::OutOfPlace,
        custom_ar_ipc_buffers: true,
        chunked_prefill_tokens: 2048,
        log: LogStyle::V1,
        torch: "2.10",
        nccl: NcclRules::Nccl221CumemOff,
        changes: "V1 as 0.15; the sampler's top-k/top-p by a Triton kernel from 8 rows \
                  (v1/sample/ops/topk_topp_sampler.py:245-255) with a cached buffer; the CUDA \
                  graph memory estimate computed but not subtracted \
                  (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0, v1/worker/gpu_worker.py:379-399)",
        engine: Engine::V1 {
            top_k_top_p: TopKTopP::Triton,
        },
        has_qwen3: true,
        has_gemma3: true,
        has_gpt_oss: true,
        quantized_read: true,
        // 0.19.0 fused_moe/modular_kernel.py over TritonExperts, no chunking (the setting is
        // gone), get_default_config's new block sizes.
        fused_moe: FusedMoe::Kernel(MoeKernel::Modular(Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: None,
        })),
        mla: Some(MlaEra::V0_19),
        fp8_block: Some(Fp8BlockEra::V0_15),
        attn_scalars: 7,
        graphs: Graphs::V1 {
            step8: false,
            adds_batch_size: false,
            estimator: Estimator::Computed,
            empties_cache: true,
        },
        tokens_from_concurrency: false,
        runner_v2: RunnerV2::Off,
        v2: None,
        suggestion: Suggestion::Debug,
        serve_batch_160gib: false,
        cublas_before_baseline: false,
        load_max_split_mib: None,
        profile_max_split_mib: None,
        kv_line_combined: false,
        chunked_local_hybrid: true,
        mm: Some(MmProfile {
            placeholder_tokens: false,
            items_capped_by_model_len: true,
            pads_to_budget: false,
            tower_skipped_at_zero: true,
            text_only_at_zero: true,
            vision_attention: VisionAttention::FlashVarlen,
        }),
    },
    R0_21,
    R0_22,
    Release {
        name: "0.23",
        aliases: &["0.23.0"],
        changes: "as 0.22, with Model Runner V2 the default for Llama and Mistral too, dense \
                  and unquantized (config/vllm.py:69-75, :544-558); its graph estimate still \
                  0 (gpu/model_runner.py:660-662)",
        runner_v2: RunnerV2::DenseUnquantized(&["llama", "mistral", "qwen3"]),
        // 0.23.0 prefers Triton on Hopper (oracle/unquantized.py L71-75); its Triton path
        // reads as 0.22.1's: experts/triton_moe.py (`supports_expert_map` dropped),
        // modular_kernel.py (the in-place option removed: the output always `empty_like`,
        // as torch 2.11 had it), fused_moe.py (the in-place op removed), runner/
        // moe_runner.py, moe_align_block_size.py, router/fused_topk_router.py,
        // v1/worker/workspace.py the same; mixtral.py and qwen3_moe.py only load kv-cache
        // scales; the tuned files the same bytes.
        fused_moe: FusedMoe::Oracle {
            triton: Modular {
                chunk_tokens: None,
                default_block_m_by_tokens: true,
                v0_21: Some(RunnerV021::V0_21),
            },
            flashinfer_on_hopper: false,
            deepseek: true,
        },
        ..R0_22
    },
    Release {
        name: "0.24",
        aliases: &["0.24.0"],
        changes: "as 0.23, with Model Runner V2 for Qwen3, Llama and Mistral quantized or not \
                  and three mixtures of experts (config/vllm.py:68-77, :550-561: \
                  Qwen2-MoE, DeepSeek-V2, Granite-MoE, not modelled there; Mixtral and \
                  Qwen3-MoE stay on V1's runner); its graph estimate 0 \
                  (gpu/model_runner.py:684-686); \
                  the snapshot keeps `torch_allocated` (utils/mem_utils.py), unused by the \
                  budget yet",
        runner_v2: RunnerV2::Listed(&["llama", "mistral", "qwen3", "qwen2_moe", "deepseek_v2"]),
        // 0.24.0 wraps the experts in `RoutedExperts` under a `MoERunner` (layer.py
        // `FusedMoE(...)` builds both; runner/moe_runner.py, routed_experts.py
        // `forward_modular` → the quant method's `apply`), with the same allocations for
        // unquantized Triton experts: experts/triton_moe.py (LoRA's deferred quantization,
        // swiglu parameters), modular_kernel.py (activation keywords, LoRA's stash),
        // unquantized_fused_moe_method.py (the quant config's swiglu parameters) only;
        // fused_moe.py, moe_align_block_size.py, v1/worker/workspace.py,
        // prepare_finalize/no_dp_ep.py, mixtral.py and qwen3_moe.py as 0.23.0's; the oracle as 0.23's on Hopper (L70-74);
        // Mixtral and Qwen3-MoE stay on V1's runner (config/vllm.py L68-77).
        fused_moe: FusedMoe::Oracle {
            triton: Modular {
                chunk_tokens: None,
                default_block_m_by_tokens: true,
                v0_21: Some(RunnerV021::V0_21),
            },
            flashinfer_on_hopper: false,
            deepseek: true,
        },
        fp8_block: Some(Fp8BlockEra::V0_24),
        ..R0_22
    },
    Release {
        name: "0.25",
        aliases: &["0.25.0", "0.25.1"],
        changes: "as 0.24, with Model Runner V2 the default for every model without experts \
                  that is neither hybrid nor attention-free, quantized or not (0.25.1 \
                  config/vllm.py:557-574); the sampler state now made in load_model after \
                  the weights are measured (gpu/model_runner.py:273-325); its graph \
                  estimate 0 (:680-682)",
        runner_v2: RunnerV2::EveryDense,
        // 0.25.1 as 0.24.0 for unquantized Triton experts: mixtral.py and qwen3_moe.py load
        // through `AutoWeightsLoader` and `RoutedExperts.load_weights` (per-expert copies into
        // the stacked parameters, as before), their blocks' forwards unchanged; runner/
        // moe_runner.py (final all-reduce skippable, sequence-parallel dispatch), router/
        // base_router.py (EPLB's padded tokens), experts/triton_moe.py (static scales),
        // modular_kernel.py (`VLLM_MOE_SKIP_PADDING`, off by default), fused_moe.py (swap-AB,
        // block-quant defaults) change nothing unquantized allocates; workspace.py,
        // moe_align_block_size.py, no_dp_ep.py and the tuned files the same. Mixtral and
        // Qwen3-MoE stay on V1's runner (config/vllm.py L557-574).
        fused_moe: FusedMoe::Oracle {
            triton: Modular {
                chunk_tokens: None,
                default_block_m_by_tokens: true,
                v0_21: Some(RunnerV021::V0_21),
            },
            flashinfer_on_hopper: false,
            deepseek: true,
        },
        mla: Some(MlaEra::V0_25),
        fp8_block: Some(Fp8BlockEra::V0_24),
        ..R0_22
    },
    Release {
        name: "0.26",
        aliases: &["0.26.0"],
        changes: "as 0.25; the `--kv-cache-memory` suggestion at INFO (v1/worker/\
                  gpu_worker.py:857; the sum unchanged, :818-850). Under Model Runner V2 \
                  the graph estimate is 0 (gpu/model_runner.py:705-707), so the suggestion, \
                  which subtracts the graphs' actual memory, comes out below the KV cache \
                  allocated: the graphs were never reserved (Q8)",
        runner_v2: RunnerV2::EveryDense,
        suggestion: Suggestion::Info,
        // 0.26.0 as 0.25.1: runner/moe_runner.py (PCP only), modular_kernel.py (the
        // activation's extra arguments), fused_moe.py (`get_device_name_as_file_name`:
        // spaces and slashes to underscores, the same names here), routed_experts.py (fused
        // checkpoint tensors), the oracle (lists of classes, TRT-LLM LoRA); experts/
        // triton_moe.py, workspace.py and the model files the same.
        fused_moe: FusedMoe::Oracle {
            triton: Modular {
                chunk_tokens: None,
                default_block_m_by_tokens: true,
                v0_21: Some(RunnerV021::V0_21),
            },
            flashinfer_on_hopper: false,
            deepseek: true,
        },
        mla: Some(MlaEra::V0_25),
        fp8_block: Some(Fp8BlockEra::V0_24),
        ..R0_22
    },
    R0_27,
    R0_28,
    R0_29,
    R0_31,
    Release {
        name: "0.33",
        aliases: &["0.33.0"],
        changes: "as 0.31; the cuBLAS and cuBLASLt handles, with PyTorch's workspaces, made \
                  before the baseline snapshot, so outside the consumption (v1/worker/\
                  gpu_worker.py:518-529); V2's dummy sampler runs a second time with \
                  `SamplingParams.for_sampler_warmup()` (gpu/model_runner.py:993-1014; \
                  sampling_params.py:1477-1493: top-k 50, top-p, min-p, penalties, logit \
                  bias, bad words, logprobs 5): not modelled, vramscope runs the first \
                  pass only, so its peak is under 0.33's by that pass's fp32 pipeline; the \
              fused MoE's allocations as 0.31's (modular_kernel.py:1174-1221: a \
              prepare/finalize-provided output only for naive DP/EP; the output \
              `new_empty` of the same shape, :1536-1541)",
        // 0.33.0 for unquantized Triton experts: modular_kernel.py
        // (`allocate_fused_expert_output`, None unless naive DP/EP's prepare/finalize
        // provides one, L203-216, L1174-1221; a `post_gemm2_hook`, None unless set, L494-496;
        // the output `new_empty` of `output_hidden_dim(K)` = K, L1536-1541; routed-experts
        // capture only with `enable_return_routed_experts`), experts/triton_moe.py (the hook,
        // UVA-offloaded weights, L353-393), fused_moe.py (`weights_host_resident`,
        // L1543-1572), router/fused_topk_router.py (AITER's `topk_gating` on ROCm only,
        // L64-130; the three [M, k] tensors L155-166), v1/worker/workspace.py (the grown
        // buffer made under `alloc_context`, a null context without the cuMem allocator:
        // gpu_worker.py L396-401, L558-564), gate_linear.py (more tiers, every one needing an
        // fp32 `out_dtype` or fp32 weights: F.linear in bf16, L355-370) change nothing it
        // allocates; moe_align_block_size.py, no_dp_ep.py, mixtral.py and the tuned 16-bit
        // files for these GPUs the same as 0.32.0's.
        cublas_before_baseline: true,
        v2: Some(V2 {
            estimates_graphs: true,
            warmup_sampler_pass: true,
        }),
        fp8_block: Some(Fp8BlockEra::V0_24),
        ..R0_31
    },
];

/// 0.21, the row the later ones start from.
const R0_21: Release = Release {
    name: "0.21",
    aliases: &["0.21.0"],
    formula: FormulaId::Pr12126,
    ceil_budget: true,
    llama_mlp_frees_gate_up: true,
    gemma_normalizer_out_of_place: true,
    all_reduce: AllReduce::OutOfPlace,
    custom_ar_ipc_buffers: true,
    chunked_prefill_tokens: 2048,
    log: LogStyle::V1,
    torch: "2.10",
    nccl: NcclRules::Nccl221CumemOff,
    changes: "V1 as 0.19, with the CUDA graph memory estimate subtracted from the KV budget \
              by default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, envs.py:1768-1769; \
              v1/worker/gpu_worker.py:421-447); max_num_batched_tokens joins the capture \
              sizes when it is at most the largest (config/vllm.py:1526-1586); KV tokens \
              int(max concurrency · max_model_len) (v1/core/kv_cache_utils.py:1708-1715); \
              the dummy sampler twice, FlashInfer's top-k/top-p sampling then Triton's \
              (gpu_model_runner.py:5746-5765); the weight load under max_split_size_mb=20 \
              (v1/worker/gpu_worker.py:338-344: blocks of 20 MiB or more are never split, \
              nor handed to smaller requests)",
    engine: Engine::V1 {
        top_k_top_p: TopKTopP::FlashInferThenTriton,
    },
    has_qwen3: true,
    has_gemma3: true,
    has_gpt_oss: true,
    quantized_read: true,
    // 0.21.0's oracle: Triton on Ampere and Ada (docs/reading/vllm-v1-fused-moe.md §2.4).
    fused_moe: FusedMoe::Oracle {
        triton: Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: Some(RunnerV021::V0_21),
        },
        flashinfer_on_hopper: true,
        deepseek: true,
    },
    mla: Some(MlaEra::V0_19),
    // 0.21-0.23: DeepGEMM's dense kernel where a linear is aligned, else 0.19's padded
    // CUTLASS (docs/reading/vllm-fp8-block-deepgemm.md §2).
    fp8_block: Some(Fp8BlockEra::V0_21),
    attn_scalars: 7,
    graphs: Graphs::V1 {
        step8: false,
        adds_batch_size: true,
        estimator: Estimator::Applied,
        empties_cache: true,
    },
    tokens_from_concurrency: true,
    runner_v2: RunnerV2::Off,
    v2: None,
    suggestion: Suggestion::Debug,
    serve_batch_160gib: false,
    cublas_before_baseline: false,
    load_max_split_mib: Some(20),
    profile_max_split_mib: None,
    kv_line_combined: false,
    chunked_local_hybrid: true,
    mm: Some(MmProfile {
        placeholder_tokens: false,
        items_capped_by_model_len: true,
        pads_to_budget: false,
        tower_skipped_at_zero: true,
        text_only_at_zero: true,
        vision_attention: VisionAttention::FlashVarlen,
    }),
};

const R0_22: Release = Release {
    name: "0.22",
    aliases: &["0.22.0", "0.22.1"],
    changes: "V1 as 0.21 (v1/worker/gpu_worker.py:392-451 and utils/mem_utils.py read \
              unchanged in 0.22.1), but Model Runner V2 by default for Qwen3, dense and \
              unquantized (config/vllm.py:69, :493-532). V2's profile run: the sampler \
              state `output_bin_counts` [max_num_seqs, V] int32 made with the runner, \
              outside the weights and before the profile (v1/worker/gpu/sample/\
              penalties.py:40-42), which this accounting does not see; logits on the \
              last hidden states themselves, no rand_like (gpu/model_runner.py:569-580); \
              the dummy sampler with no request state: no fp32 copy, no top-k/top-p, \
              only the Gumbel argmax's [R, V/1024] int64 and f32 partials \
              (gpu/sample/sampler.py, gumbel.py:194-215); its graph estimate returns 0 \
              (gpu/model_runner.py:620-622), so nothing comes off the budget for graphs. \
              V1's runner (every other model) as 0.21. Not modelled: MoE (as 0.21), \
              the model files are 0.21's (not re-read)",
    // 0.22.1 reads as 0.21.0 for unquantized experts: the oracle's priority and the experts'
    // `is_supported_config` (oracle/unquantized.py, experts/flashinfer_cutlass_moe.py,
    // trtllm_bf16_moe.py: only imports, the shared experts' plumbing and swiglu limits
    // changed), experts/triton_moe.py (LoRA's dual stream only), modular_kernel.py,
    // moe_align_block_size.py, fused_moe.py, v1/worker/workspace.py, router/
    // fused_topk_router.py, mixtral.py and qwen3_moe.py; the tuned files the same bytes.
    fused_moe: FusedMoe::Oracle {
        triton: Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: Some(RunnerV021::V0_21),
        },
        flashinfer_on_hopper: true,
        deepseek: true,
    },
    runner_v2: RunnerV2::DenseUnquantized(&["qwen3"]),
    v2: Some(V2 {
        estimates_graphs: false,
        warmup_sampler_pass: false,
    }),
    ..R0_21
};

const R0_27: Release = Release {
    name: "0.27",
    aliases: &["0.27.0", "0.27.1"],
    formula: FormulaId::Pr49208,
    changes: "#49208's accounting: non-KV = total consumed (free memory at the baseline \
              minus after the profile, so every persistent tensor, V2's sampler state \
              included) + the transient headroom (torch peak − torch allocated after the \
              profile) (0.27.1 utils/mem_utils.py:314-326; v1/worker/gpu_worker.py:\
              500-548); the DEBUG result says `total consumed (from mem_get_info)` \
              (mem_utils.py:220-230); the suggestion sums consumed + peak activation \
              (headroom + the estimate applied) + the graphs' actual memory, so with an \
              estimate the graphs count twice (gpu_worker.py:526-529, :751-782; vLLM \
              issue #57936). V2's graph estimate still 0 (gpu/model_runner.py:749-751)",
    runner_v2: RunnerV2::EveryDense,
    suggestion: Suggestion::Consumed,
    // 0.27.1 as 0.26.0 for unquantized Triton experts: modular_kernel.py writes the experts'
    // sum straight into the output when its shape matches (`use_output_alias`, L1322-1340:
    // the workspace and the output are still allocated as before, only the copy goes),
    // routing-replay buffers only with `enable_return_routed_experts`; runner/moe_runner.py
    // (latent transforms), router/fused_topk_router.py (`VLLM_MOE_SKIP_PADDING`, off),
    // fused_moe.py (`get_default_config`'s wna16 branch only), activation.py (SITU),
    // routed_experts.py (bias loading, non-persistent buffers), layer.py and the model
    // files (`FusedMoEFactory`, renamed) change nothing else; workspace.py,
    // moe_align_block_size.py and no_dp_ep.py the same; Hopper still Triton (oracle L75-79).
    fused_moe: FusedMoe::Oracle {
        triton: Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: Some(RunnerV021::V0_21),
        },
        flashinfer_on_hopper: false,
        deepseek: true,
    },
    mla: Some(MlaEra::V0_25),
    fp8_block: Some(Fp8BlockEra::V0_24),
    ..R0_22
};

const R0_28: Release = Release {
    name: "0.28",
    aliases: &["0.28.0"],
    changes: "as 0.27; `vllm serve` takes 16384 tokens / 1024 sequences on a GPU of \
              160 GiB or more (engine/arg_utils.py:2582-2591); one KV line `GPU KV cache \
              size: N tokens, Maximum concurrency for …` (v1/core/kv_cache_utils.py:\
              1869-1875); V2's graph estimate still 0 (gpu/model_runner.py:843-845)",
    serve_batch_160gib: true,
    kv_line_combined: true,
    // 0.28.0 as 0.27.1 for unquantized Triton experts: experts/triton_moe.py (a
    // padded-experts check, the activation config), modular_kernel.py and activation.py
    // (`ApplyMoEActivationConfig`: SiLU still `silu_and_mul` into the cache), the
    // unquantized method and the oracle (the CPU path), routed_experts.py (checkpoint
    // layouts, the expert map's source), runner/moe_runner.py (`maybe_init_modular_kernel`
    // gone; the gate still inside `_forward_impl`), qwen3_moe.py and mixtral.py (EP
    // bookkeeping, tied heads) change nothing unquantized allocates; the workspace manager
    // has lanes, one unless a draft model runs (v1/worker/gpu_worker.py L415-421);
    // fused_moe.py, moe_align_block_size.py, no_dp_ep.py and the tuned files the same.
    ..R0_27
};

const R0_29: Release = Release {
    name: "0.29",
    aliases: &["0.29.0", "0.30", "0.30.0"],
    changes: "as 0.28, with Model Runner V2 for every model unless a feature it lacks \
              is asked for (0.29.0 config/vllm.py:645-677; 0.30.0 :675-720); V2 \
              estimates its graphs (gpu/model_runner.py:896-898, cudagraph_utils.py: \
              PIECEWISE captured whole in a throwaway pool, FULL from its two largest \
              sizes), applied by default (envs.py VLLM_MEMORY_PROFILER_ESTIMATE_\
              CUDAGRAPHS=1); vramscope forms it as V1's estimator does (two largest \
              sizes per mode), which extrapolates PIECEWISE too. Mixtral and Qwen3-MoE run \
              on V2 (config/vllm.py:645-677) through the same Triton experts as 0.28 where \
              the oracle picks them (A100, L40S, L4, Hopper: fused_moe/oracle/\
              unquantized.py:48-96), with the same workspace (modular_kernel.py:1120-1181); \
              V2's profile batch marks every dummy token as padding (gpu/input_batch.py:\
              165, model_runner.py:1617), which `topk_softmax` reads (VLLM_MOE_SKIP_PADDING=1, \
              router/fused_topk_router.py:19-22): the routes change, no buffer's shape does. \
              Qwen2-MoE's shared expert runs inside the op before the routing (fused_moe/\
              runner/moe_runner.py:592-612, shared_experts.py:105-133: NO_OVERLAP above 256 \
              tokens), its sigmoid gate inside `Qwen2MoeMLP.forward` (qwen2_moe.py:112-120), \
              then `shared_output + fused_output` into a new tensor (moe_runner.py:780)",
    runner_v2: RunnerV2::Every,
    v2: Some(V2 {
        estimates_graphs: true,
        warmup_sampler_pass: false,
    }),
    // 0.29.0 runs every mixture of experts on Model Runner V2 (config/vllm.py L645-677), whose
    // profile pass reaches the experts as V1's runner does: `profile_run` →
    // `_dummy_run(max_num_tokens, skip_attn=True, is_profile=True)` → `execute_model`
    // (v1/worker/gpu/model_runner.py L695-849, L851-889), the EPLB hooks idle without
    // `--enable-eplb` (gpu/eplb_utils.py L48-52, L132-140), one workspace lane without a DSpark
    // draft (v1/worker/gpu_worker.py L101-107, L448-454), the padding mask `is_padding` a view
    // of the runner's `[max_num_tokens]` bool input buffer (gpu/input_batch.py L30) that
    // `topk_softmax` reads in its kernel (router/fused_topk_router.py L19-22,
    // `VLLM_MOE_SKIP_PADDING=1` already in 0.28.0 envs.py L1595). Its Triton path allocates
    // as 0.28.0's: the oracle (oracle/unquantized.py L48-96, Hopper still behind Triton),
    // experts/triton_moe.py (`workspace_shapes`; `num_align_experts` = w1.shape[0] = E
    // without an expert map, L332-340), modular_kernel.py (`_allocate_buffers` L1120-1181,
    // the output `empty_like` L1479; only a deferred finalize that no unquantized Triton
    // path requests), fused_moe.py, moe_align_block_size.py, v1/worker/workspace.py,
    // router/fused_topk_router.py the same; qwen3_moe.py as 0.28.0's, mixtral.py (a
    // W8A8 name mapping); the tuned 16-bit files the same. 0.30.0 the same files (the
    // unquantized method's kernel set-up moved to `_init_moe_kernel`, `_maybe_pad_weight`
    // ROCm only; an A100 PCIe E=256,N=512 file). Qwen2-MoE: its `SharedExperts` read
    // (`moe.rs` `shared_expert_in_op`; docs/reading/vllm-shared-experts-v1.md). docs/reading/vllm-v1-fused-moe.md
    // §10.
    fused_moe: FusedMoe::Oracle {
        triton: Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: Some(RunnerV021::V0_21),
        },
        flashinfer_on_hopper: false,
        deepseek: true,
    },
    ..R0_28
};

const R0_31: Release = Release {
    name: "0.31",
    aliases: &["0.31.0", "0.32", "0.32.0"],
    changes: "as 0.29; the profile run under max_split_size_mb=20 (0.31.0 v1/worker/\
              gpu_worker.py:615-626: blocks of 20 MiB or more are never split, nor handed to \
              smaller requests), as the weight load since 0.21; \
              V2's profile batch routes its dummy tokens to the experts (`is_padding=not \
              is_profile`, gpu/model_runner.py:1795-1802); Mixtral's and Qwen3-MoE's gate a \
              `GateLinear` (mixtral.py:111, qwen3_moe.py:170) that falls to `F.linear` in \
              bf16 without an fp32 `out_dtype` (fused_moe/router/gate_linear.py:234-249), \
              the fused MoE's allocations as 0.29's",
    profile_max_split_mib: Some(20),
    // 0.31.0 (0.32.0 the same files for these): the oracle (a MoonEP backend, XPU's
    // fallback, `unquantized_round_up_hidden_size_and_intermediate_size` rounding only for
    // TRT-LLM, oracle/unquantized.py L374-382), experts/triton_moe.py (XPU, EP's
    // `ignore_invalid_experts`, a pad-aware `moe_sum` with an expert map only),
    // modular_kernel.py (a deferred finalize no unquantized Triton path takes; the CPU
    // skips the workspace manager, L1053-1070), moe_align_block_size.py (`scatter_idx` only
    // when asked: L128-136), v1/worker/workspace.py (keyed persistent resources, used by
    // Marlin and moe_permute_unpermute only, L130-177), runner/moe_runner.py (the AITER
    // fused gate's GEMM dispatch) change nothing Triton's unquantized path allocates;
    // fused_moe.py, the router and no_dp_ep.py the same; Mixtral's and Qwen3-MoE's gate a
    // `GateLinear`, bf16 `F.linear` here. 0.32.0: the oracle (AITER's intermediate
    // alignment), gate_linear.py (ROCm tiers) and modular_kernel.py
    // (`allocate_fused_expert_output` and the routed-experts sink, read with 0.33's below)
    // only.
    ..R0_29
};

/// Model types every release here has a model file for (vllm/model_executor/models/:
/// llama.py, which Mistral uses too, qwen2.py, opt.py, phi3.py: `Phi3ForCausalLM` is
/// `LlamaForCausalLM` with its checkpoint names packed, in 0.6.3 through 0.19; gemma2.py, in
/// 0.6.3.post1 through 0.10.0 here and in vLLM's tree since 0.5.1; gemma.py, granite.py and
/// phi.py, read in the 0.6.3.post1, 0.6.4, 0.8.5 and 0.19.0 wheels, gemma.py and granite.py in
/// 0.11.0, 0.15.1 and 0.21.0 too).
const ALWAYS: &[&str] = &[
    "llama", "mistral", "qwen2", "opt", "phi3", "gemma", "gemma2", "granite", "phi",
];

impl Release {
    /// Whether vramscope reproduces this release with weights quantized as `quant`.
    pub fn check_quant(&self, quant: crate::quant::Quant) -> Result<()> {
        use crate::quant::Quant;
        if quant == Quant::F32 {
            return self.check_float32();
        }
        if self.quantized_read || matches!(quant, Quant::F16 | Quant::BF16) {
            return Ok(());
        }
        Err(Error::Request(format!(
            "--vllm {} with --quant {quant}: this release's quantized linear paths are not read \
             (it is reproduced for 16-bit models); use --vllm 0.11 or later, or 0.8 for V0",
            self.name
        )))
    }

    /// `--dtype float32`: FlashAttention and FlashInfer take fp16 and bf16 only, so V1 picks
    /// the next backend that takes f32. Read in 0.15.1, 0.19.0 and 0.21.0: TRITON_ATTN, third
    /// in `_get_backend_priorities` (0.19.0 platforms/cuda.py L100-111, 0.15.1 L68-80, 0.21.0
    /// L140-146; f32 in triton_attn.py's `supported_dtypes`, 0.19.0 L259-263, 0.15.1
    /// L257-261, 0.21.0 L266-270; the metadata builder's buffers alike, 0.21.0 L125-198).
    /// 0.11.0 falls back to FlexAttention instead (platforms/cuda.py L357-388), which is not
    /// modelled.
    fn check_float32(&self) -> Result<()> {
        match self.name {
            "0.15" | "0.19" | "0.21" => Ok(()),
            "0.11" => Err(Error::Request(
                "--vllm 0.11 with --dtype float32: 0.11 runs float32 on FlexAttention \
                 (platforms/cuda.py L357-388), which is not modelled; use --vllm 0.15, 0.19 \
                 or 0.21 (Triton's attention)"
                    .into(),
            )),
            name => Err(Error::Request(format!(
                "--vllm {name} with --dtype float32: float32 is modelled for the V1 releases \
                 whose attention choice was read for it (0.15, 0.19, 0.21: Triton's attention)"
            ))),
        }
    }

    /// The minor number of a release named `0.N` (the V1 rows and the named V0 ones); `None`
    /// for a commit.
    pub fn minor(&self) -> Option<u32> {
        self.name
            .strip_prefix("0.")
            .and_then(|m| m.split('.').next())
            .and_then(|m| m.parse::<u32>().ok())
    }

    /// Whether this release can load a model of `model_type` `arch`: the 0.8.5 wheel has
    /// vllm/model_executor/models/qwen3.py and the 0.7.3 wheel has not, so the rows from 0.8
    /// on run Qwen3.
    pub fn check_arch(&self, arch: &str) -> Result<()> {
        let mla = matches!(arch, "deepseek_v2" | "deepseek_v3" | "kimi_k2");
        if mla {
            // The V0 releases are refused with what they would need.
            self.mla_backend(9, false, 16)?;
        }
        if arch == "gpt_oss" {
            // gpt_oss.py arrived with vLLM 0.10.1, V1 only; its 16-bit experts run the
            // release's fused MoE (with biases and swigluoai).
            return match (self.engine, self.fused_moe) {
                _ if !self.has_gpt_oss => Err(Error::Request(format!(
                    "--vllm {}: that release has no model file for model_type 'gpt_oss' \
                     (gpt_oss.py arrived in vLLM 0.10.1, for V1 only); use --vllm 0.11 or later",
                    self.name
                ))),
                (Engine::V1 { .. }, FusedMoe::Kernel(_)) => Ok(()),
                (Engine::V0, _) => Err(Error::Request(format!(
                    "--vllm {}: model_type 'gpt_oss' runs on V1 only",
                    self.name
                ))),
                (_, FusedMoe::Unmodelled(why)) => Err(Error::Request(format!(
                    "--vllm {}: model_type 'gpt_oss' (mixture of experts) is not modelled under \
                     this release: {why}",
                    self.name
                ))),
                // The MXFP4 experts' backend and their weights per release are read
                // (`quant::mxfp4::Rules`); 16-bit experts run the unquantized oracle (`moe_kernel_on`).
                (_, FusedMoe::Oracle { .. }) => Ok(()),
            };
        }
        if matches!(arch, "llama4" | "llama4_text") {
            // llama4.py is in vLLM from 0.8.3; vramscope follows its V1 forms (0.11.0, 0.15.1,
            // 0.19.0) and their fused MoE.
            if !matches!(self.engine, Engine::V1 { .. }) {
                return Err(Error::Request(format!(
                    "--vllm {}: model_type '{arch}' is modelled under the V1 releases only (0.11, 0.15, 0.19)",
                    self.name
                )));
            }
            return match self.fused_moe {
                FusedMoe::Kernel(_) => Ok(()),
                FusedMoe::Unmodelled(why) => Err(Error::Request(format!(
                    "--vllm {}: model_type '{arch}' (mixture of experts) is not modelled under this \
                     release: {why}; it is reproduced for --vllm 0.11, 0.15 and 0.19",
                    self.name
                ))),
                // Llama 4's block under 0.21's runner: the shared expert inside the op before
                // the routing, the sum and the all-reduce after it, the same tensors as 0.19's
                // (docs/reading/vllm-llama4-v1.md); the backend per GPU from `moe_kernel_on`.
                // Its vision tower and encoder profile are 0.19's through 0.33
                // (docs/reading/vllm-mm-towers-v021.md §2).
                FusedMoe::Oracle { .. } => Ok(()),
            };
        }
        if arch == "qwen3_next" {
            // qwen3_next.py is in 0.10.2 on; V0 ran it with its MambaCacheManager.
            if !matches!(self.engine, Engine::V1 { .. }) {
                return Err(Error::Request(format!(
                    "--vllm {}: model_type 'qwen3_next' under V0 (its MambaCacheManager for the \
                     Gated DeltaNet states) is not modelled; it is reproduced for --vllm 0.11",
                    self.name
                )));
            }
            // 0.10/0.11 (the in-place kernel), 0.15/0.19 (the modular kernel, the gate and the
            // shared expert inside its op), 0.21-0.28 (the same under 0.21's runner, where
            // Triton runs: `moe_kernel_on`) and 0.29 on (Model Runner V2, whose profile run
            // takes the same metadata-less path: docs/reading/vllm-qwen3-next-mrv2.md; 0.33's
            // FlashInfer checkpoints refused in `hybrid_state_pages`); the Gated DeltaNet's
            // profile path by `engine::rules::GdnRules`: docs/reading/vllm-qwen3-next-v1.md.
            return match self.fused_moe {
                FusedMoe::Kernel(_) | FusedMoe::Oracle { .. } => Ok(()),
                FusedMoe::Unmodelled(why) => Err(Error::Request(format!(
                    "--vllm {}: model_type 'qwen3_next' (mixture of experts) is not modelled \
                     under this release: {why}; it is reproduced for --vllm 0.11 to 0.33",
                    self.name
                ))),
            };
        }
        if mla || matches!(arch, "mixtral" | "qwen2_moe" | "qwen3_moe") {
            // Every release here has mixtral.py and 0.8.5 on has qwen3_moe.py; the fused MoE's
            // allocations are reproduced where the release runs 0.8.5's `fused_experts_impl`.
            return match self.fused_moe {
                FusedMoe::Kernel(_) => Ok(()),
                FusedMoe::Oracle { .. } if matches!(arch, "mixtral" | "qwen3_moe") => Ok(()),
                FusedMoe::Oracle { deepseek: true, .. } if mla => Ok(()),
                // Qwen2-MoE's shared expert inside the op: docs/reading/vllm-shared-experts-v1.md.
                FusedMoe::Oracle { .. } if arch == "qwen2_moe" => Ok(()),
                FusedMoe::Oracle { .. } => Err(Error::Request(format!(
                    "--vllm {}: model_type '{arch}' is not modelled under this release: its fused \
                     MoE from 0.21 is reproduced for Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek \
                     only (the DeepSeek block under this release is not read); it is reproduced \
                     for --vllm 0.11 to 0.33 where Triton runs",
                    self.name,
                ))),
                FusedMoe::Unmodelled(why) => Err(Error::Request(format!(
                    "--vllm {}: model_type '{arch}' (mixture of experts) is not modelled under this \
                     release: {why}; it is reproduced for --vllm 0.8, 0.11, 0.15 and 0.19 (and \
                     0.21-0.33 for Mixtral, Qwen2-MoE and Qwen3-MoE where Triton runs)",
                    self.name
                ))),
            };
        }
        if ALWAYS.contains(&arch)
            || (arch == "qwen3" && self.has_qwen3)
            || (arch == "gemma3_text" && self.has_gemma3)
        {
            return Ok(());
        }
        let file = match arch {
            "gemma3_text" => "gemma3.py",
            "qwen3" => "qwen3.py",
            _ => {
                return Err(Error::Request(format!(
                    "--vllm {}: model_type '{arch}' is not modelled under this release",
                    self.name
                )))
            }
        };
        Err(Error::Request(format!(
            "--vllm {}: that release has no model file for model_type '{arch}' ({file} is in \
             vLLM 0.8.5, not in 0.7.3); use --vllm 0.8 or a V1 release (0.15, 0.19)",
            self.name
        )))
    }
}

impl Release {
    /// The fused MoE this release runs for model type `arch` on a GPU of compute capability
    /// `major` (a simulated preset's architecture's: Hopper 9, Blackwell 10), with this MoE
    /// group (`None`: one GPU or tensor parallel only); `None` where the release's is not
    /// reproduced (`check_arch` has refused the MoE types already). Under 0.21's oracle:
    /// Triton where FlashInfer does not take the GPU, FlashInfer refused by name.
    /// `fp8_experts`: block-wise fp8 experts, which the fp8 oracle puts on Triton on Hopper
    /// without expert parallel (oracle/fp8.py 0.21.0 L90-100, 0.33.0 L122-132; the other
    /// cases refused in `procedure::check_fp8_block_model`), or online per-tensor ones (Triton
    /// on 8.9 and up: docs/reading/vllm-fp8-online-moe-v021.md §2), not the unquantized oracle.
    pub fn moe_kernel_on(
        &self,
        arch: &str,
        major: u32,
        group: Option<crate::device::group::MoeGroup>,
        fp8_experts: bool,
    ) -> Result<Option<MoeKernel>> {
        let (dp, ep) = group.map_or((1, false), |g| (g.dp.max(1), g.ep));
        let tp = group.map_or(1, |g| g.size / g.dp.max(1));
        // With expert parallel over more than one TP rank and DP replicas these models cut the
        // tokens over the TP ranks before their MoE op (`use_sequence_parallel_moe`,
        // config/parallel.py 0.11.0 L292-298, 0.19.0 L530-543; `sequence_parallel_chunk`,
        // then an all-gather after: qwen3_moe.py 0.19.0 L232-247), in every V1 release.
        let sequence_parallel = matches!(
            arch,
            "qwen3_moe"
                | "deepseek_v2"
                | "deepseek_v3"
                | "kimi_k2"
                | "llama4_text"
                | "llama4"
                | "gpt_oss"
                | "qwen3_next"
        );
        if ep && tp > 1 && dp > 1 && sequence_parallel {
            return Err(Error::Request(format!(
                "--vllm {}: model_type '{arch}' with expert parallel over {tp} tensor-parallel \
                 ranks and {dp} data-parallel replicas is not modelled: vLLM runs its MoE \
                 layers sequence-parallel there (use_sequence_parallel_moe: each rank's \
                 1/{tp} of the tokens through the op, then an all-gather; \
                 docs/reading/vllm-expert-parallel-v1.md §3.3); expert parallel with one of \
                 the two is",
                self.name
            )));
        }
        let (triton, flashinfer_on_hopper, deepseek) = match self.fused_moe {
            FusedMoe::Kernel(k) => return Ok(Some(k)),
            FusedMoe::Unmodelled(_) => return Ok(None),
            FusedMoe::Oracle {
                triton,
                flashinfer_on_hopper,
                deepseek,
            } => (triton, flashinfer_on_hopper, deepseek),
        };
        let mla = matches!(arch, "deepseek_v2" | "deepseek_v3" | "kimi_k2");
        // gpt-oss with 16-bit experts (its MXFP4 ones run the MXFP4 oracle: `quant::mxfp4`):
        // swigluoai, which TRT-LLM's BF16 experts do not take (experts/trtllm_bf16_moe.py
        // L68-70) and FlashInfer's CUTLASS ones do (flashinfer_cutlass_moe.py L180-186); from
        // 0.25.1 the oracle puts both behind Triton for it (oracle/unquantized.py L87-92).
        let gpt_oss = arch == "gpt_oss";
        if !(matches!(arch, "mixtral" | "qwen3_moe" | "llama4_text" | "qwen3_next")
            || gpt_oss
            || (deepseek && mla)
            || arch == "qwen2_moe")
        {
            return Ok(None);
        }
        let swigluoai_behind_triton = gpt_oss && self.minor().is_some_and(|m| m >= 25);
        // FlashInfer's CUTLASS MoE on Hopper for SiLU experts (0.21 and 0.22 without data
        // parallel): modelled (docs/reading/vllm-flashinfer-cutlass-moe.md).
        let flashinfer_cutlass =
            major == 9 && flashinfer_on_hopper && dp == 1 && !gpt_oss && !fp8_experts;
        let flashinfer = match major {
            _ if swigluoai_behind_triton || fp8_experts || flashinfer_cutlass => None,
            10 if gpt_oss => Some(
                "FlashInfer's CUTLASS MoE on the 10.x family for swigluoai (TRT-LLM's BF16 \
                 experts take SiLU only), ahead of Triton until 0.25.1 (oracle/unquantized.py)",
            ),
            // With data parallel the oracle moves FlashInfer's CUTLASS behind Triton
            // (oracle/unquantized.py 0.21.0 L67-72 with `dp_size > 1`).
            9 if flashinfer_on_hopper && dp == 1 => Some(
                "FlashInfer's CUTLASS MoE on Hopper (compute capability 9.0: \
                 experts/flashinfer_cutlass_moe.py L124-136 takes it, ahead of Triton in \
                 oracle/unquantized.py L67-72)",
            ),
            10.. => Some(
                "FlashInfer's TRT-LLM BF16 MoE on the 10.x family (B200: \
                 experts/trtllm_bf16_moe.py L45-53, Renormalize routing), its CUTLASS MoE on \
                 the 12.x family (experts/flashinfer_cutlass_moe.py L124-136), both ahead of \
                 Triton (oracle/unquantized.py)",
            ),
            _ => None,
        };
        if let Some(which) = flashinfer {
            return Err(Error::Request(format!(
                "--vllm {}: model_type '{arch}' (mixture of experts) on this GPU is not modelled: \
                 the release runs {which}; vramscope reproduces Triton's experts on Ampere, Ada \
                 and Hopper and FlashInfer's CUTLASS MoE for SiLU experts on Hopper (0.21, \
                 0.22), not its 12.x grouped GEMM, its swigluoai path nor TRT-LLM's BF16 \
                 MoE{}",
                self.name,
                if gpt_oss {
                    "; gpt-oss's 16-bit experts run Triton everywhere from --vllm 0.25"
                } else {
                    ""
                }
            )));
        }
        // Expert and data parallel from 0.21 (docs/reading/vllm-expert-parallel-v1.md): read for
        // the blocks of Mixtral, Qwen3-MoE and Qwen2-MoE (whose shared expert runs on this
        // replica's tokens before the routing: `MoEPrepareAndFinalizeNaiveDPEPModular` inherits
        // `supports_async() -> False`, so `NO_OVERLAP`; 0.21.0 modular_kernel.py L242-247,
        // runner/shared_experts.py L92-112).
        // DeepSeek's and Llama 4's blocks route, run their shared experts and scale on this
        // replica's tokens before the same dispatch (docs/reading/vllm-ep-deepseek-llama4-v021.md
        // §1-4); the sequence-parallel case is refused above.
        let read = matches!(
            arch,
            "mixtral"
                | "qwen3_moe"
                | "qwen2_moe"
                | "deepseek_v2"
                | "deepseek_v3"
                | "kimi_k2"
                | "llama4_text"
                | "llama4"
        );
        if (dp > 1 || ep) && !read {
            return Err(Error::Request(format!(
                "--vllm {}: model_type '{arch}' with {} is not modelled under this release: \
                 from 0.21 the unquantized experts route before a dispatch of the top-k \
                 weights and ids (MoEPrepareAndFinalizeNaiveDPEPModular) and the expert map \
                 changes by release; read for Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek and Llama 4, \
                 not for this block; tensor parallel alone is reproduced",
                self.name,
                if dp > 1 {
                    "data parallel"
                } else {
                    "expert parallel"
                }
            )));
        }
        let mut triton = triton;
        if let (Some(r), Some(minor)) = (triton.v0_21.as_mut(), self.minor()) {
            *r = RunnerV021 {
                gate_in_op: r.gate_in_op,
                flashinfer_cutlass,
                ..RunnerV021::for_minor(minor)
            };
        }
        Ok(Some(MoeKernel::Modular(triton)))
    }
}

/// How a V1 release picks and sizes multi-head latent attention's backend
/// (docs/reading/vllm-mla.md §2-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaEra {
    /// 0.11: `check_and_update_config` forces FlashMLA's 64 on Hopper, CUTLASS-MLA's 128 on
    /// Blackwell; only the chosen backend's module is imported (platforms/cuda.py L108-183,
    /// L240-300).
    V0_11,
    /// 0.15: 64 still forced on Hopper (FLASH_ATTN_MLA then takes it), FlashInfer-MLA at 64
    /// on Blackwell; every backend of the priority list is imported, FlashInfer-MLA's module
    /// making its 128 MiB workspace (platforms/cuda.py L150-245; flashinfer_mla.py L97).
    V0_15,
    /// 0.19 and 0.21 to 0.24: no forcing; the backend's preferred block size (FLASH_ATTN_MLA
    /// keeps 16 on Hopper, FlashInfer-MLA takes 32 on Blackwell), set after the model loads
    /// (platforms/interface.py L427-472); FlashInfer-MLA's and, on Blackwell, CUTLASS-MLA's
    /// modules make 128 MiB each.
    V0_19,
    /// 0.25.1 on: the same choices, but FlashInfer-MLA's workspace is made on its first
    /// decode, not at import (0.25.1 flashinfer_mla.py L31-46, L217): only CUTLASS-MLA's
    /// module buffer remains, on Blackwell. 0.33's TRITON_MLA (below Hopper) grows the
    /// workspace in the profile run (`reserve_workspace`, mla_attention.py L948):
    /// `MlaBackend::logits_reserve`.
    V0_25,
}

/// The MLA backend a release runs on a GPU, its KV block size and the buffers importing the
/// backends makes while the model is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlaBackend {
    pub name: &'static str,
    pub block_size: u64,
    /// Module-level workspaces (`g_fi_workspace`, `g_sm100_workspace`): name and bytes.
    pub buffers: Vec<(&'static str, u64)>,
    /// What vLLM logs when it overrides the block size asked for.
    pub note: Option<String>,
    /// 0.33's TRITON_MLA grows the shared workspace in the profile run to its decode
    /// split-KV logits' upper bound (`reserve_workspace`, triton_mla.py L234-243, L53-71):
    /// `[max_num_seqs, heads, splits, kv_lora_rank + 1]` f32 ([`triton_mla_logits_bytes`]).
    pub logits_reserve: bool,
}

/// The bytes TRITON_MLA's `reserve_workspace` asks of the workspace manager (0.33.0
/// triton_mla.py L44-71): `max_num_seqs` decode rows (one token each without speculative
/// decoding: `max_decode_query_len`, attention/backend.py L572-588) × this rank's heads × the
/// splits `min(next_pow2(max(1, max_model_len // 512)), 2 · SMs)` × `kv_lora_rank + 1` f32,
/// rounded up to 256 (`get_simultaneous`, v1/worker/workspace.py L181-207).
pub fn triton_mla_logits_bytes(
    max_num_seqs: u64,
    heads: u64,
    max_model_len: u64,
    sms: u64,
    kv_lora_rank: u64,
) -> u64 {
    let splits = (max_model_len / 512)
        .max(1)
        .next_power_of_two()
        .min(2 * sms);
    (max_num_seqs * heads * splits * (kv_lora_rank + 1) * 4).div_ceil(256) * 256
}

/// FlashInfer-MLA's and CUTLASS-MLA's module workspaces: 128 MiB each.
const MLA_MODULE_WORKSPACE: u64 = 128 << 20;

impl Release {
    /// The MLA backend this release picks on a GPU of compute capability `major`, with an fp8
    /// KV cache or not, for `block_size` asked (16 when not given): docs/reading/vllm-mla.md
    /// §2 holds the table and its sources. A V0 release is refused by name.
    pub fn mla_backend(&self, major: u32, kv_fp8: bool, block_size: u64) -> Result<MlaBackend> {
        let Some(era) = self.mla else {
            return Err(Error::Request(format!(
                "--vllm {}: multi-head latent attention under this release is not modelled (V0 runs the prefill attention in the profile pass and sizes its workspace at 128k tokens; 0.10's V1 MLA backends are not read); it is reproduced for --vllm 0.11, 0.15 and 0.19",
                self.name
            )));
        };
        let fi = ("flashinfer_mla.g_fi_workspace", MLA_MODULE_WORKSPACE);
        let cutlass = ("cutlass_mla.g_sm100_workspace", MLA_MODULE_WORKSPACE);
        // `check_and_update_config` overrides a block size the backend cannot take, and says
        // so (0.11 platforms/cuda.py L163-178, 0.15.1 L218-242, in these words).
        let pick =
            |name: &'static str, forced: Option<(u64, &str)>, buffers: Vec<(&'static str, u64)>| {
                match forced {
                    Some((b, label)) => MlaBackend {
                        name,
                        block_size: b,
                        buffers,
                        note: Some(format!(
                            "INFO cuda.py] Forcing kv cache block size to {b} for {label} backend."
                        )),
                        logits_reserve: false,
                    },
                    None => MlaBackend {
                        name,
                        block_size,
                        buffers,
                        note: None,
                        logits_reserve: false,
                    },
                }
            };
        let b = block_size;
        Ok(match (era, major) {
            (MlaEra::V0_11, 9) => pick("FLASHMLA", (b != 64).then_some((64, "FlashMLA")), vec![]),
            (MlaEra::V0_11, 10) => pick(
                "CUTLASS_MLA",
                (b != 128).then_some((128, "CUTLASS_MLA")),
                vec![cutlass],
            ),
            (MlaEra::V0_11, _) => pick("TRITON_MLA", None, vec![]),
            // 0.15.1: FlashMLA's rule forces a multiple of 64 on Hopper; FLASH_ATTN_MLA, first
            // in the priority list, then runs at it (FLASHMLA with an fp8 cache).
            (MlaEra::V0_15, 9) => pick(
                if kv_fp8 { "FLASHMLA" } else { "FLASH_ATTN_MLA" },
                (!b.is_multiple_of(64)).then_some((64, "FlashMLA")),
                vec![fi],
            ),
            (MlaEra::V0_15, 10) => pick(
                "FLASHINFER_MLA",
                (b != 32 && !b.is_multiple_of(64)).then_some((64, "FlashInferMLA")),
                vec![fi],
            ),
            (MlaEra::V0_15, _) => pick("TRITON_MLA", None, vec![fi]),
            (MlaEra::V0_19, 9) if kv_fp8 => MlaBackend {
                block_size: if b.is_multiple_of(64) { b } else { 64 },
                ..pick("FLASHMLA", None, vec![fi])
            },
            (MlaEra::V0_19, 9) => pick("FLASH_ATTN_MLA", None, vec![fi]),
            // FlashInfer-MLA takes 32 or 64: the default 16 becomes its smallest, 32.
            (MlaEra::V0_19, 10) => MlaBackend {
                block_size: if b == 16 { 32 } else { b },
                ..pick("FLASHINFER_MLA", None, vec![fi, cutlass])
            },
            (MlaEra::V0_19, _) => pick("TRITON_MLA", None, vec![fi]),
            (MlaEra::V0_25, 9) if kv_fp8 => MlaBackend {
                block_size: if b.is_multiple_of(64) { b } else { 64 },
                ..pick("FLASHMLA", None, vec![])
            },
            (MlaEra::V0_25, 9) => pick("FLASH_ATTN_MLA", None, vec![]),
            (MlaEra::V0_25, 10) => MlaBackend {
                block_size: if b == 16 { 32 } else { b },
                ..pick("FLASHINFER_MLA", None, vec![cutlass])
            },
            (MlaEra::V0_25, _) if self.minor().is_some_and(|m| m >= 33) => MlaBackend {
                logits_reserve: true,
                ..pick("TRITON_MLA", None, vec![])
            },
            (MlaEra::V0_25, _) => pick("TRITON_MLA", None, vec![]),
        })
    }

    /// The tokens of MLA's chunked-prefill workspace, which the profile run allocates per
    /// layer: `max(min(max(8 · max_model_len, 4 · max_num_seqs · B), 65536), max_num_seqs ·
    /// B)` with the final block size (0.19 mla_attention.py L1393-1421; 0.11
    /// v1/attention/backends/mla/common.py L442-467); from 0.28 without the `max_num_seqs · B`
    /// floor, at least B and rounded up to a multiple of B (0.28.0 mla_attention.py
    /// L1995-2019).
    pub fn mla_workspace_tokens(
        &self,
        max_model_len: u64,
        max_num_seqs: u64,
        block_size: u64,
    ) -> u64 {
        let chunked = (8 * max_model_len)
            .max(4 * max_num_seqs * block_size)
            .min(64 * 1024);
        if self.minor().is_some_and(|m| m >= 28) {
            let b = block_size.max(1);
            chunked.max(b).next_multiple_of(b)
        } else {
            chunked.max(max_num_seqs * block_size)
        }
    }
}

impl Release {
    /// The formulas a report of this release lists: `FormulaId::ALL`, and the release's own
    /// where it is not among them (#49208 for 0.27 on).
    pub fn listed_formulas(&self) -> Vec<FormulaId> {
        let mut ids = FormulaId::ALL.to_vec();
        if !ids.contains(&self.formula) {
            ids.push(self.formula);
        }
        ids
    }

    /// Whether this release profiles a model of type `arch` on Model Runner V2 by default
    /// (`RunnerV2`): `quantized` for a checkpoint's quantization (AWQ, GPTQ, FP8,
    /// bitsandbytes), `moe` for a mixture of experts.
    pub fn runs_v2(&self, arch: &str, quantized: bool, moe: bool) -> bool {
        match self.runner_v2 {
            RunnerV2::Off => false,
            RunnerV2::DenseUnquantized(types) => types.contains(&arch) && !quantized && !moe,
            RunnerV2::Listed(types) => types.contains(&arch),
            RunnerV2::EveryDense => !moe || matches!(arch, "qwen2_moe" | "deepseek_v2"),
            RunnerV2::Every => true,
        }
    }

    /// The graph-memory estimator this release runs for a model on V2 (`v2`) or V1's runner.
    pub fn estimator_for(&self, v2: bool) -> Estimator {
        match (v2, self.v2) {
            (
                true,
                Some(V2 {
                    estimates_graphs: false,
                    ..
                }),
            ) => Estimator::Absent,
            _ => self.estimator(),
        }
    }

    /// The CUDA graphs this release captures, per mode, each list largest first (PIECEWISE
    /// then FULL); empty for a release whose graphs are not reproduced. FULL graphs are the
    /// uniform-decode batches: sizes up to max_num_seqs (0.19.0
    /// v1/cudagraph_dispatcher.py:206-230).
    pub fn capture_plan(
        &self,
        max_num_seqs: usize,
        max_num_batched_tokens: usize,
    ) -> Vec<(crate::engine::runtime::CaptureKind, Vec<usize>)> {
        self.capture_plan_for(max_num_seqs, max_num_batched_tokens, None)
    }

    /// `capture_plan` for a model whose vLLM config class sets its own largest capture size
    /// (`model_max`; `None`: the release's default): gpt-oss's `GptOssForCausalLMConfig`
    /// (0.19 model_executor/models/config.py L113-133: `max_cudagraph_capture_size = 1024`,
    /// 83 sizes, taken as set rather than as min(2·max_num_seqs, 512), config/vllm.py
    /// L1388-1403; 0.11.0 config.py L248-273: the list 1, 2, 4, 8…248 by 8, 256…992 by 16).
    /// Sizes above 256 step by 16 in both.
    pub fn capture_plan_for(
        &self,
        max_num_seqs: usize,
        max_num_batched_tokens: usize,
        model_max: Option<usize>,
    ) -> Vec<(crate::engine::runtime::CaptureKind, Vec<usize>)> {
        use crate::engine::runtime::CaptureKind;
        if let Graphs::V0 { .. } = self.graphs {
            // `_BATCH_SIZES_TO_CAPTURE` up to `_get_graph_batch_size(max_num_seqs)`, capped at
            // 8192 (0.6.4.post1 worker/model_runner.py: [1, 2, 4] + [8 · i]).
            let candidates = [1usize, 2, 4].into_iter().chain((1..=1024).map(|i| 8 * i));
            let top = candidates
                .clone()
                .find(|&c| c >= max_num_seqs.max(1))
                .unwrap_or(8192);
            let mut sizes: Vec<usize> = candidates.filter(|&c| c <= top).collect();
            sizes.reverse();
            return vec![(CaptureKind::Full, sizes)];
        }
        let Graphs::V1 {
            step8,
            adds_batch_size,
            ..
        } = self.graphs
        else {
            return Vec::new();
        };
        let max = model_max
            .unwrap_or((2 * max_num_seqs).min(512))
            .min(max_num_batched_tokens);
        let step8 = step8 && model_max.is_none();
        let (top8, step) = if step8 { (513, 8) } else { (256, 16) };
        let mut sizes: Vec<usize> = [1, 2, 4]
            .into_iter()
            .chain((8..top8).step_by(8))
            .chain((256..=max.max(256)).step_by(step).filter(|_| !step8))
            .filter(|&n| n <= max)
            .collect();
        if adds_batch_size
            && max_num_batched_tokens <= max
            && !sizes.contains(&max_num_batched_tokens)
        {
            sizes.push(max_num_batched_tokens);
            sizes.sort_unstable();
        }
        sizes.reverse();
        let full: Vec<usize> = sizes
            .iter()
            .copied()
            .filter(|&n| n <= max_num_seqs)
            .collect();
        vec![(CaptureKind::Piecewise, sizes), (CaptureKind::Full, full)]
    }

    /// The dummy requests of the sampler warm-up V1's `compile_or_warm_up_model` runs after
    /// the KV cache and the CUDA graphs: `_dummy_run(min(max_num_seqs,
    /// max_num_batched_tokens))`, then `_dummy_sampler_run` on its last hidden states, on the
    /// last pipeline rank (0.11.0 v1/worker/gpu_worker.py L395-414; 0.15.1 L510-530; 0.19.0
    /// L667-686; 0.21.0 L691-710; profile/warmup.rs). `None` where the release runs none of
    /// it: V0 (its `_warm_up_model` only captures), and a model on Model Runner V2 (`v2`),
    /// which runs `warmup_kernels` instead (0.21.0 gpu_worker.py L687-689, gpu/warmup.py:
    /// two scheduler steps with `SamplingParams.for_sampler_warmup()`; not modelled).
    pub fn sampler_warm_up_reqs(
        &self,
        v2: bool,
        max_num_seqs: usize,
        max_num_batched_tokens: usize,
    ) -> Option<usize> {
        match self.engine {
            Engine::V1 { .. } if !v2 => Some(max_num_seqs.min(max_num_batched_tokens)),
            _ => None,
        }
    }

    /// Whether `capture_model` empties the cache after its graphs (`Graphs::V1::empties_cache`).
    pub fn empties_cache_after_capture(&self) -> bool {
        matches!(
            self.graphs,
            Graphs::V1 {
                empties_cache: true,
                ..
            }
        )
    }

    pub fn estimator(&self) -> Estimator {
        match self.graphs {
            Graphs::V1 { estimator, .. } => estimator,
            Graphs::NotModelled | Graphs::V0 { .. } => Estimator::Absent,
        }
    }
}

/// The release `name` means (a name or an alias), or an error that lists them.
pub fn release(name: &str) -> Result<&'static Release> {
    let n = name.trim().trim_start_matches(['v', 'V']);
    RELEASES
        .iter()
        .find(|r| r.name == n || r.aliases.contains(&n))
        .ok_or_else(|| {
            Error::Request(format!(
                "--vllm {name}: not a release vramscope reproduces (one of {})",
                names().join(", ")
            ))
        })
}

/// The releases' names, oldest first.
pub fn names() -> Vec<&'static str> {
    RELEASES.iter().map(|r| r.name).collect()
}

/// vLLM turns chunked prefill on by itself for a long context: `max_model_len > 32768` on a
/// GPU, with no sliding window, speculative decoding, LoRA or prompt adapter, in every V0
/// release here (0.6.4 engine/arg_utils.py:996-1020; 0.8.5 :1501-1532).
pub const CHUNKED_PREFILL_ABOVE: u64 = 32768;

/// V1's profile batch when the user gives none, for `vllm serve` (usage context
/// OPENAI_API_SERVER, 0.15.1 and 0.19.0 engine/arg_utils.py:2053-2072): 8192 tokens and 1024
/// sequences on a GPU whose total is 70 GiB or more and that is not an A100, else 2048 and
/// 256; from 0.28, 16384 and 1024 on 160 GiB or more (0.28.0 engine/arg_utils.py:2582-2591).
/// For the Python `LLM` class (`llm_class`: usage context LLM_CLASS, which `vllm bench
/// latency` and `vllm bench throughput` start through `LLM.from_engine_args`, 0.26.0
/// entrypoints/llm.py L339 and L376-378): 16384 and 1024 on the large GPUs, 8192 and 256
/// below, in every V1 release (0.11.0 engine/arg_utils.py L1605-1622, 0.19.0 L2053-2070,
/// 0.26.0 L2460-2478, 0.28.0 L2582-2609).
pub fn v1_default_batch(
    total_bytes: u64,
    device_name: &str,
    release: &Release,
    llm_class: bool,
) -> (usize, usize) {
    let big = total_bytes >= 70 << 30 && !device_name.to_ascii_lowercase().contains("a100");
    let huge = release.serve_batch_160gib && total_bytes >= 160 << 30;
    match (llm_class, big || huge) {
        (true, true) => (16384, 1024),
        (true, false) => (8192, 256),
        (false, _) if huge => (16384, 1024),
        (false, true) => (8192, 1024),
        (false, false) => (2048, 256),
    }
}

#[cfg(test)]
mod tests {

    /// MLA's profile workspace: 0.19-0.27 keep the `max_num_seqs · B` floor, 0.28 drops it and
    /// rounds to the block (mla_attention.py L1995-2019). 2048 sequences at B = 64 and 1,024
    /// positions: min(max(8,192, 524,288), 65,536) = 65,536, floored to 131,072 before 0.28.
    /// FlashInfer-MLA's module workspace is gone from 0.25 (made on the first decode).
    #[test]
    fn mla_workspace_and_module_buffers_follow_the_release() {
        let r = |v: &str| release(v).unwrap();
        assert_eq!(r("0.27").mla_workspace_tokens(1024, 2048, 64), 131_072);
        assert_eq!(r("0.28").mla_workspace_tokens(1024, 2048, 64), 65_536);
        // 8 · 1000 = 8,000 is not a multiple of 48: rounded up to 8,016 from 0.28.
        assert_eq!(r("0.28").mla_workspace_tokens(1000, 1, 48), 8_016);
        assert_eq!(r("0.27").mla_workspace_tokens(1000, 1, 48), 8_000);
        let buffers = |v: &str, major| {
            r(v).mla_backend(major, false, 16)
                .unwrap()
                .buffers
                .iter()
                .map(|b| b.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(buffers("0.24", 9), vec!["flashinfer_mla.g_fi_workspace"]);
        assert!(buffers("0.25", 9).is_empty());
        assert_eq!(buffers("0.33", 10), vec!["cutlass_mla.g_sm100_workspace"]);
        assert_eq!(r("0.33").mla_backend(10, false, 16).unwrap().block_size, 32);
        let triton = r("0.33").mla_backend(8, false, 16).unwrap();
        assert_eq!((triton.name, triton.logits_reserve), ("TRITON_MLA", true));
        assert!(!r("0.31").mla_backend(8, false, 16).unwrap().logits_reserve);
        // DeepSeek-V2-Lite on an A100 (108 SMs) at 256 sequences and 8192 tokens: 16 splits
        // of 513 f32 per head and sequence; at 163840 tokens the SMs cap the splits at 216.
        assert_eq!(
            triton_mla_logits_bytes(256, 16, 8192, 108, 512),
            134_479_872
        );
        assert_eq!(
            triton_mla_logits_bytes(256, 16, 163_840, 108, 512),
            256 * 16 * 216 * 513 * 4
        );
        assert_eq!(
            r("0.31").mla_backend(8, false, 16).unwrap().name,
            "TRITON_MLA"
        );
    }
    use super::*;

    /// Q1's "51 PIECEWISE + 51 FULL capture sizes (largest 512)" with 1024 sequences and
    /// 8192 tokens; a small max_num_seqs bounds both lists.
    /// The issue's "83 up to 1024" for gpt-oss under 0.19, 81 up to 992 under 0.11.0,
    /// whatever max_num_seqs says (256 here).
    #[test]
    fn gpt_oss_captures_its_own_sizes() {
        let p19 = release("0.19")
            .unwrap()
            .capture_plan_for(256, 8192, Some(1024));
        assert_eq!(p19[0].1.len(), 83);
        assert_eq!(p19[0].1[..2], [1024, 1008]);
        assert_eq!(p19[1].1[0], 256);
        let p11 = release("0.11")
            .unwrap()
            .capture_plan_for(256, 8192, Some(992));
        assert_eq!(p11[0].1.len(), 81);
        assert_eq!(p11[0].1[0], 992);
    }

    #[test]
    fn capture_sizes_follow_each_release() {
        use crate::engine::runtime::CaptureKind;
        let plan = release("0.19").unwrap().capture_plan(1024, 8192);
        assert_eq!(plan[0].0, CaptureKind::Piecewise);
        assert_eq!(plan[0].1.len(), 51);
        assert_eq!(plan[1].1.len(), 51);
        assert_eq!(plan[0].1[..3], [512, 496, 480]);
        assert_eq!(plan[0].1[48..], [4, 2, 1]);
        let small = release("0.19").unwrap().capture_plan(4, 2048);
        assert_eq!(small[0].1, [8, 4, 2, 1]);
        assert_eq!(small[1].1, [4, 2, 1]);
        // 0.21 adds a batch size at most the largest one.
        let p21 = release("0.21").unwrap().capture_plan(256, 300);
        assert_eq!(p21[0].1[..3], [300, 288, 272]);
        assert!(release("0.19").unwrap().capture_plan(256, 300)[0].1[0] == 288);
        // V0: whole-model graphs for [1, 2, 4] + 8k up to max_num_seqs rounded up to 8; the
        // default release keeps none.
        let p08 = release("0.8").unwrap().capture_plan(256, 2048);
        assert_eq!(p08.len(), 1);
        assert_eq!(p08[0].0, CaptureKind::Full);
        assert_eq!(p08[0].1.len(), 35);
        assert_eq!(p08[0].1[..2], [256, 248]);
        assert_eq!(
            release("0.6.4").unwrap().capture_plan(3, 2048)[0].1,
            [4, 2, 1]
        );
        assert!(release(DEFAULT).unwrap().capture_plan(256, 2048).is_empty());
        // 0.11: steps of 8 to 512, 67 sizes.
        let p11 = release("0.11").unwrap().capture_plan(1024, 8192);
        assert_eq!(p11[0].1.len(), 67);
        assert_eq!(p11[0].1[..3], [512, 504, 496]);
    }

    #[test]
    fn names_and_aliases_find_their_release() {
        assert_eq!(release("0.6.4.post1").unwrap().name, "0.6.4");
        assert_eq!(release("v0.7.1").unwrap().name, "0.7");
        assert_eq!(release("0.10.0").unwrap().name, "0.10");
        assert_eq!(release("0.9.2").unwrap().name, "0.8");
        // 0.10.0 runs V1 by default, with no gpt_oss.py (0.10.1's wheel has it).
        let r = release("0.10").unwrap();
        assert!(matches!(r.engine, Engine::V1 { .. }));
        let e = r.check_arch("gpt_oss").unwrap_err().to_string();
        assert!(e.contains("no model file for model_type 'gpt_oss'"), "{e}");
        assert!(r.check_arch("gemma3_text").is_ok());
        assert!(r.check_arch("mixtral").is_err());
        assert!(r.check_quant(crate::quant::Quant::BF16).is_ok());
        let e = r
            .check_quant(crate::quant::Quant::Fp8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--vllm 0.10 with --quant fp8"), "{e}");
        assert_eq!(release(DEFAULT).unwrap().formula, FormulaId::Pr9516);
        let e = release("0.5.0").unwrap_err().to_string();
        assert!(e.contains("--vllm 0.5.0") && e.contains("380e1863"), "{e}");
    }

    #[test]
    fn qwen3_needs_a_release_that_has_its_model_file() {
        assert!(release("0.8.5").unwrap().check_arch("qwen3").is_ok());
        assert!(release("0.19").unwrap().check_arch("qwen3").is_ok());
        let e = release("0.7")
            .unwrap()
            .check_arch("qwen3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--vllm 0.7") && e.contains("qwen3"), "{e}");
        assert!(release(DEFAULT).unwrap().check_arch("llama").is_ok());
    }

    #[test]
    fn gemma2_runs_everywhere_and_gemma3_from_0_8() {
        for r in RELEASES {
            assert!(r.check_arch("gemma2").is_ok(), "{}", r.name);
            assert!(r.check_arch("phi").is_ok(), "{}", r.name);
        }
        assert!(release("0.8").unwrap().check_arch("gemma3_text").is_ok());
        for moe in ["mixtral", "qwen3_moe"] {
            for ok in [
                "0.8.5", "0.11", "0.15", "0.19", "0.21", "0.22", "0.23", "0.24", "0.28", "0.29",
                "0.30", "0.31", "0.32", "0.33",
            ] {
                assert!(release(ok).unwrap().check_arch(moe).is_ok(), "{ok}");
            }
            // From 0.21 the GPU decides: Triton on Ampere/Ada (8), FlashInfer's CUTLASS MoE
            // on Hopper (9) until 0.23 (modelled), FlashInfer on Blackwell (10, refused).
            // `Some(cutlass)`: answered, on FlashInfer's CUTLASS or Triton; `None`: refused.
            for (vllm, major, answer) in [
                ("0.21", 8, Some(false)),
                ("0.21", 9, Some(true)),
                ("0.22", 9, Some(true)),
                ("0.23", 9, Some(false)),
                ("0.23", 10, None),
                ("0.24", 9, Some(false)),
                ("0.29", 8, Some(false)),
                ("0.29", 9, Some(false)),
                ("0.33", 9, Some(false)),
                ("0.33", 10, None),
            ] {
                let k = release(vllm)
                    .unwrap()
                    .moe_kernel_on(moe, major, None, false);
                match k {
                    Ok(Some(MoeKernel::Modular(m))) => assert_eq!(
                        m.v0_21.map(|r| r.flashinfer_cutlass),
                        answer,
                        "{vllm} {major}"
                    ),
                    Err(e) => assert!(
                        answer.is_none() && e.to_string().contains("FlashInfer"),
                        "{e}"
                    ),
                    Ok(k) => panic!("{vllm} {major}: {k:?}"),
                }
            }
            // With data parallel the oracle puts FlashInfer's CUTLASS behind Triton.
            let dp = crate::device::group::MoeGroup {
                rank: 0,
                size: 2,
                dp: 2,
                ep: false,
            };
            match release("0.21")
                .unwrap()
                .moe_kernel_on(moe, 9, Some(dp), false)
            {
                Ok(Some(MoeKernel::Modular(m))) => {
                    assert_eq!(m.v0_21.map(|r| r.flashinfer_cutlass), Some(false))
                }
                k => panic!("{k:?}"),
            }
            let e = release("0.10.0")
                .unwrap()
                .check_arch(moe)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("reproduced for --vllm 0.8") && e.contains("0.21-0.33"),
                "{e}"
            );
            assert!(release(DEFAULT).unwrap().check_arch(moe).is_err());
        }
        // DeepSeek's block is read for every release from 0.21 (Model Runner V2 from 0.24).
        for ok in ["0.21", "0.22", "0.23", "0.24", "0.28", "0.29", "0.33"] {
            assert!(
                release(ok).unwrap().check_arch("deepseek_v2").is_ok(),
                "{ok}"
            );
        }
        // Qwen2-MoE's shared expert inside the op is read for every V1 release from 0.15
        // (docs/reading/vllm-shared-experts-v1.md).
        for ok in ["0.15", "0.19", "0.21", "0.24", "0.28", "0.29", "0.33"] {
            assert!(release(ok).unwrap().check_arch("qwen2_moe").is_ok(), "{ok}");
        }
        let e = release("0.6.4")
            .unwrap()
            .check_arch("gemma3_text")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gemma3.py") && e.contains("gemma3_text"), "{e}");
    }

    #[test]
    fn every_name_is_unique() {
        let mut all: Vec<&str> = RELEASES
            .iter()
            .flat_map(|r| std::iter::once(r.name).chain(r.aliases.iter().copied()))
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}

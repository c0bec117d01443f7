//! The command line: `profile`, `devices`, `inspect`, `gen-model`; no subcommand opens the app.
//! Errors print one line and exit with code 2.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::base::error::Result;
use crate::base::units::{fmt_i, fmt_u, parse_bytes};
use crate::device::{self, DeviceSpec};
use crate::engine::progress::{Phase, Progress};
use crate::model::weights::StoredDtype;
use crate::model::{self, ModelSource};
use crate::profile::formulas::FormulaId;
use crate::profile::request::KvCacheDtype;
use crate::profile::{self, ProfileRequest, Report};
use crate::quant::Quant;
use crate::report::export;

#[derive(Parser, Debug)]
#[command(
    name = "vramscope",
    version,
    about = "Where GPU memory goes during an LLM's forward passes, and how much vLLM's budget formulas leave for the KV cache"
)]
pub struct Cli {
    /// Open the app, profile the default preset, save the window as this PNG, and exit.
    #[arg(long, value_name = "FILE")]
    pub screenshot: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

// Parsed once per process; boxing the largest variant would only obscure the clap derive.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the profile procedure and compare vLLM's KV-cache budget formulas.
    Profile(ProfileArgs),
    /// List CUDA GPUs and simulated devices.
    Devices,
    /// Show a model's config, parameter count and bytes per dtype.
    Inspect { path: PathBuf },
    /// Write a preset with seeded synthetic weights as safetensors (+ index) and config.json.
    GenModel {
        preset: String,
        dir: PathBuf,
        #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
        dtype: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Split the weights into this many shards with model.safetensors.index.json.
        #[arg(long, default_value_t = 1)]
        shards: usize,
        /// Write a bitsandbytes 8-bit checkpoint (int8 CB + SCB, quantization_config).
        #[arg(long)]
        bnb_int8: bool,
        /// Write a pre-quantized bitsandbytes 4-bit checkpoint of this type.
        #[arg(long, value_parser = ["nf4", "fp4"])]
        bnb_4bit: Option<String>,
        /// With --bnb-4bit: double-quantize the absmax (bnb_4bit_use_double_quant).
        #[arg(long, requires = "bnb_4bit")]
        double_quant: bool,
        /// Write a pre-quantized per-tensor fp8 checkpoint (F8_E4M3 linear weights with their
        /// weight_scale, quantization_config as AutoFP8 writes it).
        #[arg(long, conflicts_with_all = ["bnb_int8", "bnb_4bit", "awq", "gptq"])]
        fp8: bool,
        /// With --fp8: the static activation scheme (an input_scale per linear layer).
        #[arg(long, requires = "fp8")]
        fp8_static: bool,
        /// Write a block-wise fp8 checkpoint as Qwen/Qwen3-8B-FP8 is published (F8_E4M3
        /// linear weights with an F32 weight_scale_inv per [128, 128] block, vLLM 0.8.5).
        #[arg(long, conflicts_with_all = ["fp8", "bnb_int8", "bnb_4bit", "awq", "gptq"])]
        fp8_block: bool,
        /// Write a compressed-tensors FP8_DYNAMIC checkpoint as LLM Compressor saves one
        /// (F8_E4M3 linear weights with an F32 [n, 1] weight_scale per output channel, dynamic
        /// per-token activations; RedHatAI's …-FP8-dynamic).
        #[arg(long, conflicts_with_all = ["fp8", "fp8_block", "bnb_int8", "bnb_4bit", "awq", "gptq"])]
        fp8_channel: bool,
        /// Write an AWQ 4-bit checkpoint (AutoAWQ GEMM: qweight, qzeros, scales).
        #[arg(long, conflicts_with_all = ["gptq", "bnb_int8", "bnb_4bit"])]
        awq: bool,
        /// Write a GPTQ 4-bit checkpoint (AutoGPTQ, symmetric: qweight, qzeros, scales, g_idx).
        #[arg(long, conflicts_with_all = ["bnb_int8", "bnb_4bit"])]
        gptq: bool,
        /// Write a compressed-tensors int8 W8A8 checkpoint as LLM Compressor saves one
        /// (int-quantized: I8 linear weights with an F32 [n, 1] weight_scale per output
        /// channel, dynamic per-token int8 activations; RedHatAI's …-quantized.w8a8).
        #[arg(long, conflicts_with_all = ["fp8", "fp8_static", "fp8_block", "fp8_channel", "bnb_int8", "bnb_4bit", "awq", "gptq", "ct_w4a16"])]
        ct_w8a8: bool,
        /// Write a compressed-tensors W4A16 checkpoint as LLM Compressor saves one
        /// (pack-quantized: weight_packed, weight_scale, weight_shape; int4 symmetric, the
        /// same codes as --gptq; RedHatAI's …-quantized.w4a16).
        #[arg(long, conflicts_with_all = ["awq", "gptq", "bnb_int8", "bnb_4bit", "fp8", "fp8_static", "fp8_block", "fp8_channel"])]
        ct_w4a16: bool,
        /// Write an NVFP4 checkpoint: "ct" as LLM Compressor saves one (compressed-tensors
        /// nvfp4-pack-quantized: weight_packed, weight_scale, weight_global_scale,
        /// input_global_scale) or "modelopt" as NVIDIA ModelOpt does (weight, weight_scale,
        /// weight_scale_2, input_scale, and hf_quant_config.json).
        #[arg(long, value_parser = ["ct", "modelopt"], conflicts_with_all = ["awq", "gptq", "ct_w4a16", "bnb_int8", "bnb_4bit", "fp8", "fp8_static", "fp8_block", "fp8_channel"])]
        nvfp4: Option<String>,
        /// Write an NVIDIA ModelOpt FP8 checkpoint (quant_algo FP8: F8_E4M3 weight, F32 []
        /// weight_scale and input_scale per projection, q/k/v and gate/up sharing one amax,
        /// hf_quant_config.json; as nvidia/Llama-3.1-8B-Instruct-FP8 is published).
        #[arg(long, conflicts_with_all = ["awq", "gptq", "ct_w4a16", "ct_w8a8", "bnb_int8", "bnb_4bit", "fp8", "fp8_static", "fp8_block", "fp8_channel", "nvfp4"])]
        modelopt_fp8: bool,
        /// Write a 2:4 sparse compressed-tensors checkpoint as LLM Compressor saves one (every
        /// decoder projection pruned to two of every four inputs): "dense" (the pruned weight)
        /// or "bitmask" (sparse-24-bitmask: compressed, bitmask, shape); 16-bit unless
        /// --sparse24-fp8 (as RedHatAI's Sparse-Llama-3.1-8B-2of4 and …-2of4-FP8-dynamic).
        #[arg(long, value_parser = ["dense", "bitmask"], conflicts_with_all = ["awq", "gptq", "ct_w4a16", "ct_w8a8", "bnb_int8", "bnb_4bit", "fp8", "fp8_static", "fp8_block", "fp8_channel", "nvfp4", "modelopt_fp8"])]
        sparse24: Option<String>,
        /// With --sparse24: fp8 weights (F8_E4M3, an F32 [n, 1] weight_scale per output
        /// channel) and dynamic per-token fp8 activations (FP8_DYNAMIC).
        #[arg(long, requires = "sparse24")]
        sparse24_fp8: bool,
        /// With --awq, --gptq or --ct-w4a16: inputs per quantization group (32, 64, 128, or
        /// -1 for one).
        #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
        group_size: i64,
        /// With --gptq (desc_act) or --ct-w4a16 (actorder "group"): act-order, each input's
        /// group read from g_idx / weight_g_idx.
        #[arg(long)]
        desc_act: bool,
        /// With --bnb-4bit or --bnb-int8: modules kept 16-bit and listed in
        /// llm_int8_skip_modules, comma-separated (as Unsloth's dynamic 4-bit checkpoints
        /// keep some), e.g. model.layers.0.self_attn,model.layers.1.mlp (a multimodal
        /// model's are written under vLLM's names, language_model.model.layers.0.self_attn).
        #[arg(long, value_delimiter = ',')]
        bnb_skip_modules: Vec<String>,
    },
    /// Time forward passes on a device (GPU speed; logits for comparisons).
    Bench(BenchArgs),
    /// Profile a pasted `vllm serve` line: `vramscope plan -- vllm serve MODEL [vLLM flags]`.
    Plan(PlanArgs),
    /// Read a vLLM startup log, run the same profile with its release, and print vLLM's
    /// numbers beside vramscope's, term by term.
    Explain(ExplainArgs),
    /// Open a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) and report or export
    /// its timeline (framework allocator only).
    Report(ReportArgs),
    /// Internal: hold GPU memory in a separate process until stdin closes (--outside-before).
    #[command(hide = true)]
    HoldGpuMemory {
        #[arg(long)]
        ordinal: usize,
        #[arg(long)]
        bytes: u64,
    },
}

/// What runs: the model, its quantization and the batch (shared by `profile` and `bench`).
#[derive(clap::Args, Debug)]
pub struct WorkloadArgs {
    /// PATH (folder, config.json, index json, .safetensors shard or .gguf), preset:NAME, or
    /// synthetic:WEIGHTS:SPIKE (profile only).
    #[arg(long, default_value = "preset:llama-3-8b")]
    pub model: String,
    /// fp16, bf16, int8 (bitsandbytes LLM.int8), nf4 (bitsandbytes NF4, double-quantized, as
    /// vLLM quantizes in flight) or fp4 (bitsandbytes FP4, f32 absmax: transformers'
    /// `load_in_4bit` default; vLLM's in-flight 4-bit is always NF4, model_loader/loader.py
    /// L928-931 at 0.6.4, so an FP4 run is what a pre-quantized FP4 checkpoint serves as).
    /// A pre-quantized bitsandbytes checkpoint loads as stored. fp8: vLLM's `--quantization
    /// fp8` on a 16-bit checkpoint (float8_e4m3fn weights with a per-tensor scale, dynamic
    /// activation scales per tensor under 0.6.3 to 0.6.5, per token under the V1 releases,
    /// simulated there; GPUs of compute capability 8.9 or more).
    #[arg(long, default_value = "fp16", value_parser = ["fp16", "bf16", "int8", "nf4", "fp4", "fp8"])]
    pub quant: String,
    /// vLLM's max_num_batched_tokens: tokens in the profile batch. Default for profile: vLLM's,
    /// max(max_model_len, 2048) (chunked prefill off); for bench: 8192.
    #[arg(
        long = "max-num-batched-tokens",
        visible_alias = "tokens",
        value_name = "N"
    )]
    pub tokens: Option<usize>,
    /// vLLM's max_num_seqs: sequences the batch is split into, as vLLM's profile run splits it.
    /// Default for profile: vLLM's 256 (V1: at most --max-num-batched-tokens; V0 refuses a
    /// smaller batch, as vLLM does); for bench: 1.
    #[arg(long = "max-num-seqs", visible_alias = "seqs", value_name = "N")]
    pub seqs: Option<usize>,
    /// LLM.int8 outlier threshold (Hugging Face checkpoints use 6.0).
    #[arg(long, default_value_t = 0.0)]
    pub int8_threshold: f32,
    /// Seed of a preset's synthetic weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub work: WorkloadArgs,
    /// cuda:N, or sim:PRESET for the CPU reference.
    #[arg(long, default_value = "cuda:0")]
    pub device: String,
    /// Timed passes (after one warm-up pass).
    #[arg(long, default_value_t = 3)]
    pub iters: u32,
    /// Fast hash weights instead of the preset's seeded ones (speed only).
    #[arg(long)]
    pub fast_weights: bool,
    /// Tensor-parallel GPUs: cuda:N and the N-1 after it (or that many simulated devices);
    /// rank 0's times are reported.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub tp: u32,
    /// vLLM's --enable-expert-parallel over the --tp ranks: a MoE model's routed experts whole
    /// on each rank (E / tp each) instead of every expert cut over them.
    #[arg(long = "enable-expert-parallel", visible_alias = "ep")]
    pub ep: bool,
    /// Write the result and the last-token logits as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// After the timed passes, run one more with GPU events at every op and print where its
    /// time went (CUDA only).
    #[arg(long)]
    pub op_times: bool,
    /// Print where the time went, phase by phase (opening the GPU, making and uploading the
    /// weights, the time to the first pass).
    #[arg(long, short)]
    pub verbose: bool,
    /// Compare the logits with those in this JSON (written by bench or gpu_reference.py).
    #[arg(long, value_name = "FILE")]
    pub compare: Option<PathBuf>,
    /// Also run vLLM's sampler step once on the profile batch (256 sequences), time it, and
    /// write its first 4 rows of f32 logits and probs (raw little-endian f32) and the sampled
    /// ids into this folder, for scripts/sampler_reference.py.
    #[arg(long, value_name = "DIR")]
    pub sampler_dump: Option<PathBuf>,
}

fn size_arg(s: &str) -> std::result::Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub work: WorkloadArgs,
    /// sim:PRESET[:dry|:compute] or cuda:N. Default: an H100 as vLLM sees it (h100-sxm:
    /// cudaMemGetInfo's 79.22 GiB, vLLM's total_gpu_memory; h100-80gb simulates nvidia-smi's
    /// 79.65 GiB).
    #[arg(long, default_value = "sim:h100-sxm:dry")]
    pub device: String,
    /// The total the simulated GPU reports (what `torch.cuda.mem_get_info()[1]` says on your
    /// GPU, vLLM's `total_gpu_memory`), instead of the preset's; the preset still gives the
    /// architecture (context, cuBLAS workspace).
    #[arg(long, value_parser = size_arg, value_name = "SIZE")]
    pub total: Option<u64>,
    /// How the simulated GPUs of `--tp` reach each other: nvlink, pcie (peer to peer) or
    /// pcie-no-p2p (through host memory). Sets NCCL's memory and whether vLLM's custom
    /// all-reduce runs. Default: the preset's (NVLink for SXM boards, pcie for data-center
    /// PCIe cards, pcie-no-p2p for GeForce cards).
    #[arg(long, value_name = "TOPOLOGY")]
    pub topology: Option<String>,
    /// vLLM's --kv-cache-dtype: auto (the model's dtype), fp8, fp8_e4m3 or fp8_e5m2 (one byte
    /// per element).
    #[arg(long, default_value = "auto", value_name = "DTYPE")]
    pub kv_cache_dtype: String,
    /// Passes between t1 and t2: 1 is vLLM's profile run; more show the serving passes after
    /// it (the truth then covers them all).
    #[arg(long, default_value_t = 1)]
    pub passes: u32,
    /// gpu_memory_utilization.
    #[arg(long, visible_alias = "gpu-memory-utilization", default_value_t = 0.9)]
    pub util: f64,
    #[arg(long, default_value_t = 16)]
    pub block_size: u64,
    /// Tensor-parallel GPUs (vLLM's --tensor-parallel-size, -tp): cuda:N and the N-1 GPUs
    /// after it, or that many simulated devices. The engine takes the fewest KV blocks over
    /// the ranks.
    #[arg(
        long,
        visible_alias = "tensor-parallel-size",
        default_value_t = 1,
        value_name = "N"
    )]
    pub tp: u32,
    /// Pipeline stages (vLLM's --pipeline-parallel-size, -pp): the layers cut over N stages
    /// as vLLM cuts them, each stage --tp GPUs (tp × pp simulated devices, V1 releases). The
    /// engine takes the fewest KV blocks over every rank.
    #[arg(
        long,
        visible_alias = "pipeline-parallel-size",
        default_value_t = 1,
        value_name = "N"
    )]
    pub pp: u32,
    /// vLLM's VLLM_PP_LAYER_PARTITION: the layers of each stage, e.g. 24,16 (default: vLLM's
    /// own partition).
    #[arg(long, value_name = "LIST")]
    pub pp_layer_partition: Option<String>,
    /// vLLM's --enable-expert-parallel (-ep): a MoE model's routed experts spread whole over
    /// the tp × dp GPUs of each stage (E / (tp × dp) each, the remainder on the first),
    /// instead of every expert cut over them (V1 releases, simulated devices).
    #[arg(long = "enable-expert-parallel", visible_alias = "ep")]
    pub enable_expert_parallel: bool,
    /// vLLM's --data-parallel-size (-dp): replicas of the tp × pp instance, each with its own
    /// KV cache; a MoE model's experts span the replicas, which exchange tokens around every
    /// MoE layer (V1 releases, dry).
    #[arg(
        long = "data-parallel-size",
        visible_alias = "dp",
        default_value_t = 1,
        value_name = "N"
    )]
    pub dp: u32,
    /// Hosts of 8 GPUs of the --device kind the instance spans (dry plans): ranks fill one
    /// host after another in vLLM's order, and a group across hosts talks through NCCL's
    /// network transport.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub nodes: u32,
    /// How the hosts reach each other with --nodes: ib (default), roce (both GPUDirect RDMA)
    /// or tcp.
    #[arg(long, value_name = "NETWORK")]
    pub network: Option<String>,
    /// vLLM's --dtype: auto (config.json's torch_dtype, float32 as float16), half, float16,
    /// bfloat16, float32 (V1 0.15, 0.19, 0.21, dense text models, simulated devices). Instead of
    /// --quant.
    #[arg(long, value_name = "DTYPE", conflicts_with = "quant")]
    pub dtype: Option<String>,
    /// vLLM's --quantization: fp8, bitsandbytes (in-flight NF4), or awq, gptq, awq_marlin,
    /// gptq_marlin, marlin, compressed-tensors for a checkpoint stored that way
    /// (compressed-tensors: its fp8 w8a8, int8 w8a8 and int4 w4a16 schemes, V1 releases). Instead of --quant.
    #[arg(long, value_name = "METHOD", conflicts_with = "quant")]
    pub quantization: Option<String>,
    /// vLLM's --kv-cache-memory (V1 releases, 0.11 on): the KV cache's size per GPU, given
    /// (e.g. 57GiB or 61258029056); gpu_memory_utilization and the graph estimate then do not
    /// set the budget.
    #[arg(long, value_parser = size_arg, value_name = "SIZE")]
    pub kv_cache_memory: Option<u64>,
    /// vLLM's --limit-mm-per-prompt for a multimodal model (`{"image": 0}` or `image=0`):
    /// images per prompt; 0 runs it text-only (no encoder profile; from 0.15 no vision tower).
    #[arg(long, value_name = "JSON")]
    pub limit_mm_per_prompt: Option<String>,
    /// vLLM's --mm-processor-kwargs: `{"do_pan_and_scan": false}` (Gemma 3's default) is
    /// modelled; pan-and-scan and other keys are refused by name. Qwen2.5-VL's `max_pixels`,
    /// `min_pixels` and `size` set its image processor's bounds (its dummy image).
    #[arg(long, value_name = "JSON")]
    pub mm_processor_kwargs: Option<String>,
    /// The vLLM release to reproduce: its profile run, defaults, formula and log lines
    /// (0.6.3, 380e1863, 0.6.4, 0.6.5, 0.7, 0.8; V1: 0.10, 0.11, 0.15, 0.19, 0.21 … 0.33;
    /// aliases such as 0.6.4.post1, 0.10.0 or 0.19.0).
    #[arg(long, default_value = crate::profile::vllm::DEFAULT, value_name = "RELEASE")]
    pub vllm: String,
    /// vLLM's --enable-chunked-prefill (default: vLLM's rule, on above a 32k context in V0,
    /// always in V1; the batch is then the release's chunk, 512 or 2048 tokens). Off, a
    /// --max-num-batched-tokens below max_model_len is refused, as vLLM refuses it.
    #[arg(long, value_name = "BOOL")]
    pub enable_chunked_prefill: Option<bool>,
    /// Also search the largest KV cache that really serves: the most blocks with which two
    /// max-batch passes after the profile stay within floor(T·u) without an OOM (verify runs;
    /// one GPU).
    #[arg(long)]
    pub true_max: bool,
    /// vLLM's --enforce-eager: no CUDA graphs. Without it a V1 release (0.15 on) captures its
    /// graphs after the KV cache, as the instance would, and reports their memory (0.19 on:
    /// beside vLLM's own estimate; 0.21 on: the estimate comes off the KV budget).
    #[arg(long)]
    pub enforce_eager: bool,
    /// vLLM's --enable-prefix-caching (on) or --no-enable-prefix-caching (off); the release's
    /// default when not given. Only a hybrid model's startup memory depends on it (Qwen3-Next:
    /// two state pages a request when on, from 0.15; on by default from 0.28).
    #[arg(long, value_parser = ["on", "off"])]
    pub prefix_caching: Option<String>,
    /// V1's batch defaults of vLLM's Python `LLM` class (`LLM(...)`, `vllm bench latency`,
    /// `vllm bench throughput`): 8192 tokens and 256 sequences below 70 GiB, 16384 and 1024
    /// above, where `vllm serve` takes 2048/256 and 8192/1024.
    #[arg(long)]
    pub llm_class: bool,
    /// vLLM's max_model_len (default: the model's max_position_embeddings, times its rope
    /// scaling's factor where vLLM applies one, as vLLM derives it).
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<u64>,
    /// Leave vLLM's sampler step out of the profile pass (forward and logits only, as before
    /// vramscope followed vLLM's profile run step by step).
    #[arg(long)]
    pub no_sampler: bool,
    /// Memory another process holds before the instance starts (e.g. 512MiB).
    #[arg(long, value_parser = size_arg, default_value = "0")]
    pub outside_before: u64,
    /// Memory allocated outside the framework during the first pass (NCCL-like).
    #[arg(long, value_parser = size_arg, default_value = "0")]
    pub outside_during: u64,
    /// Free the --outside-during allocation after the passes (default: it stays).
    #[arg(long)]
    pub outside_during_freed: bool,
    /// Skip the verify passes.
    #[arg(long)]
    pub no_verify: bool,
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Timeline CSV; the summary goes beside it as NAME.summary.csv.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Also write the trace as a PyTorch memory snapshot (opens in torch.cuda._memory_viz).
    #[arg(long, value_name = "FILE")]
    pub torch_snapshot: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print where the time went, phase by phase, at the end (to stderr).
    #[arg(long, short)]
    pub verbose: bool,
    /// Run even when the estimated host memory exceeds what the machine has.
    #[arg(long)]
    pub allow_host_memory: bool,
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// `profile` options (`--device`, `--total`, `--vllm`, `--json`, …), then `--`, then the
    /// pasted line: `vllm serve MODEL [vLLM flags]`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "[PROFILE OPTIONS] -- LINE"
    )]
    pub words: Vec<String>,
}

impl PlanArgs {
    /// The first word of a pasted serve line: `vllm`, `python`/`python3` (`-m vllm…`), or an
    /// environment assignment (`NAME=VALUE`, never a `profile` option or its value).
    fn starts_a_line(w: &str) -> bool {
        matches!(w, "vllm" | "python" | "python3")
            || w.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty()
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            })
    }

    /// The `profile` options and the pasted line, split at the first `--`. With no profile
    /// option, `plan -- vllm serve MODEL` reaches here without its `--` (the argument parser
    /// takes the first one as the end of its options): the words are then the line itself.
    fn split(&self) -> Result<(&[String], &[String])> {
        match self.words.iter().position(|w| w == "--") {
            Some(at) => Ok((&self.words[..at], &self.words[at + 1..])),
            None if self.words.first().is_some_and(|w| !w.starts_with('-')) => {
                Ok((&[], &self.words[..]))
            }
            // `plan --vllm 0.19 vllm serve …`: the profile options, then the line from its
            // first word.
            None if self.words.iter().any(|w| Self::starts_a_line(w)) => {
                let at = self
                    .words
                    .iter()
                    .position(|w| Self::starts_a_line(w))
                    .unwrap_or(0);
                Ok((&self.words[..at], &self.words[at..]))
            }
            None => Err(crate::Error::Request(
                "plan: the vLLM line goes after `--`: vramscope plan [profile options] -- vllm serve MODEL …"
                    .into(),
            )),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The log vLLM printed at startup (V0 or V1, TP workers' lines included).
    pub log: PathBuf,
    /// Where the log's model is, when it is not on disk under the name it logs (a folder or
    /// config.json, or preset:NAME).
    #[arg(long)]
    pub model: Option<String>,
    /// The GPU as sim:PRESET (default: the preset whose total is nearest the log's).
    #[arg(long)]
    pub device: Option<String>,
    /// The release, when the log names none.
    #[arg(long, value_name = "RELEASE")]
    pub vllm: Option<String>,
    /// Skip the runs that show what would change the answer.
    #[arg(long)]
    pub no_what_if: bool,
    /// Also write the comparison as JSON: the log's settings, each term side by side, the
    /// largest difference and the what-ifs.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A PyTorch memory snapshot (.pickle).
    pub snapshot: PathBuf,
    /// Which CUDA device's timeline to export (default: the one with the most events).
    #[arg(long)]
    pub device: Option<u32>,
    /// The device's total memory T, if known (a snapshot does not record it).
    #[arg(long, value_parser = size_arg)]
    pub total: Option<u64>,
    /// The timeline as a vramscope session (reopens in the app).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Timeline CSV; the summary goes beside it as NAME.summary.csv.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}

impl ProfileArgs {
    pub fn request(&self) -> Result<ProfileRequest> {
        if self.work.seqs == Some(0) {
            return Err(crate::Error::Request(
                "--max-num-seqs 0: it must be at least 1 (vLLM's max_num_seqs)".into(),
            ));
        }
        // 0 is not "vLLM's default" (that is the flag left out): vLLM refuses it.
        for (flag, given) in [
            (
                "--max-num-batched-tokens",
                self.work.tokens.map(|t| t as u64),
            ),
            ("--max-model-len", self.max_model_len),
        ] {
            if given == Some(0) {
                return Err(crate::Error::Request(format!(
                    "{flag} 0: it must be at least 1 (leave the flag out for vLLM's default)"
                )));
            }
        }
        let model = ModelSource::parse(&self.work.model)?;
        let quant = match (&self.dtype, &self.quantization) {
            (None, None) => Quant::parse(&self.work.quant)?,
            (dtype, method) => {
                crate::profile::vllm_args::quant_of(&model, dtype.as_deref(), method.as_deref())?
            }
        };
        let mut device = DeviceSpec::parse(&self.device)?;
        // `sim:PRESET` with no mode, for a model of which only config.json is here: there is
        // nothing to compute with, so the run is dry, as `sim:PRESET:dry` would say
        // (`:compute` still asks for the weights).
        if let (DeviceSpec::Sim { dry, .. }, ModelSource::Path { path }) = (&mut device, &model) {
            if self.device.split(':').count() == 2
                && crate::model::resolve_files(path)
                    .is_ok_and(|f| f.format == crate::model::FileFormat::ConfigOnly)
            {
                *dry = true;
            }
        }
        let r = ProfileRequest {
            model,
            quant,
            device: device.with_total(self.total)?.with_topology(
                self.topology
                    .as_deref()
                    .map(crate::device::nccl_model::Topology::parse)
                    .transpose()?,
            )?,
            tokens: self.work.tokens.unwrap_or(0),
            // 0: the release's default for this GPU (V0: 256; fewer when the batch given is
            // smaller, as vLLM takes), filled in with the batch.
            seqs: self.work.seqs.unwrap_or(0),
            passes: self.passes,
            util: self.util,
            block_size: self.block_size,
            max_model_len: self.max_model_len.unwrap_or(0),
            sampler: !self.no_sampler,
            int8_threshold: self.work.int8_threshold,
            outside_before: self.outside_before,
            outside_during: self.outside_during,
            outside_during_freed: self.outside_during_freed,
            verify: !self.no_verify,
            seed: self.work.seed,
            tp: self.tp,
            pp: self.pp,
            enable_expert_parallel: self.enable_expert_parallel,
            dp: self.dp,
            nodes: self.nodes,
            network: self
                .network
                .as_deref()
                .map(crate::device::nccl_model::Network::parse)
                .transpose()?
                .unwrap_or_default(),
            pp_layer_partition: self
                .pp_layer_partition
                .as_deref()
                .map(crate::model::layers::pp::parse_partition)
                .transpose()?,
            vllm: self.vllm.clone(),
            chunked_prefill: self.enable_chunked_prefill,
            true_max: self.true_max,
            enforce_eager: self.enforce_eager,
            prefix_caching: self.prefix_caching.as_deref().map(|v| v == "on"),
            kv_cache_dtype: KvCacheDtype::parse(&self.kv_cache_dtype)?,
            kv_cache_memory: self.kv_cache_memory,
            llm_class: self.llm_class,
            limit_mm_images: match &self.limit_mm_per_prompt {
                Some(v) => crate::profile::multimodal::parse_limit(v)?,
                None => None,
            },
            limit_mm_videos: match &self.limit_mm_per_prompt {
                Some(v) => crate::profile::multimodal::parse_limit_of(v, "video")?,
                None => None,
            },
            mm_processor_kwargs: self.mm_processor_kwargs.clone(),
        };
        if let Some(v) = &self.mm_processor_kwargs {
            crate::profile::multimodal::check_processor_kwargs(v)?;
        }
        r.validate()?;
        Ok(r)
    }
}

/// Entry point; returns the process exit code.
pub fn main() -> i32 {
    crate::base::timing::mark_start();
    let cli = match Cli::try_parse_from(vllm_spellings(std::env::args_os())) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return 0;
            }
            let text = e.render().to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            eprintln!("vramscope: error: {first}");
            return 2;
        }
    };
    let result = match cli.command {
        None => crate::app::gui::run_app(cli.screenshot),
        Some(Command::Profile(args)) => cmd_profile(&args),
        Some(Command::Devices) => cmd_devices(),
        Some(Command::Inspect { path }) => cmd_inspect(&path),
        Some(Command::GenModel {
            preset,
            dir,
            dtype,
            seed,
            shards,
            bnb_int8,
            bnb_4bit,
            double_quant,
            fp8,
            fp8_static,
            fp8_block,
            fp8_channel,
            awq,
            gptq,
            ct_w4a16,
            ct_w8a8,
            nvfp4,
            modelopt_fp8,
            sparse24,
            sparse24_fp8,
            group_size,
            desc_act,
            bnb_skip_modules,
        }) => {
            if desc_act && !gptq && !ct_w4a16 {
                eprintln!("vramscope: error: --desc-act needs --gptq or --ct-w4a16 (act-order is a GPTQ form)");
                return 2;
            }
            let bnb4 = bnb_4bit.as_deref().and_then(|t| {
                crate::quant::bnb4::Bnb4Type::parse(t).map(|quant_type| model::Bnb4Gen {
                    quant_type,
                    double_quant,
                })
            });
            let fp8 = match (fp8, fp8_block, fp8_channel || ct_w8a8) {
                (true, _, _) => Some(model::Fp8Gen::PerTensor(fp8_static)),
                (_, true, _) => Some(model::Fp8Gen::Block(crate::quant::fp8_block::BlockSize {
                    n: 128,
                    k: 128,
                })),
                (_, _, true) if ct_w8a8 => Some(model::Fp8Gen::Int8Channel),
                (_, _, true) => Some(model::Fp8Gen::Channel),
                _ => None,
            };
            use crate::quant::marlin::{Format, Method};
            let method = match (awq, gptq || ct_w4a16) {
                (true, _) => Some(Method::Awq),
                (_, true) => Some(Method::Gptq),
                _ => None,
            };
            let packed4 = method.map(|method| Format {
                method,
                group_size,
                desc_act,
                compressed_tensors: ct_w4a16,
            });
            let opts = model::GenOptions {
                dtype: match dtype.as_str() {
                    "f32" => StoredDtype::F32,
                    "bf16" => StoredDtype::BF16,
                    _ => StoredDtype::F16,
                },
                seed,
                shards,
                bnb_int8,
                bnb_skip_modules,
            };
            if modelopt_fp8 {
                return match model::gen_modelopt_fp8::gen_model_modelopt_fp8(&preset, &dir, &opts) {
                    Ok(files) => {
                        println!("wrote {}", files.weights.display());
                        println!("wrote {}", files.config.display());
                        println!("wrote {}", dir.join("hf_quant_config.json").display());
                        0
                    }
                    Err(e) => {
                        eprintln!("vramscope: error: {}", one_line(&e.to_string()));
                        2
                    }
                };
            }
            if let Some(f) = sparse24.as_deref() {
                use crate::quant::sparse24::Format;
                let format = if f == "bitmask" {
                    Format::Bitmask
                } else {
                    Format::Dense
                };
                return match model::gen_sparse24::gen_model_sparse24(
                    &preset,
                    &dir,
                    &opts,
                    format,
                    sparse24_fp8,
                ) {
                    Ok(files) => {
                        println!("wrote {}", files.weights.display());
                        println!("wrote {}", files.config.display());
                        0
                    }
                    Err(e) => {
                        eprintln!("vramscope: error: {}", one_line(&e.to_string()));
                        2
                    }
                };
            }
            if let Some(f) = nvfp4.as_deref() {
                use crate::quant::nvfp4::Flavor;
                let flavor = if f == "ct" {
                    Flavor::CompressedTensors
                } else {
                    Flavor::ModelOpt
                };
                return match model::gen_nvfp4::gen_model_nvfp4(&preset, &dir, &opts, flavor) {
                    Ok(files) => {
                        println!("wrote {}", files.weights.display());
                        println!("wrote {}", files.config.display());
                        0
                    }
                    Err(e) => {
                        eprintln!("vramscope: error: {}", one_line(&e.to_string()));
                        2
                    }
                };
            }
            cmd_gen(
                &preset,
                &dir,
                opts,
                bnb4.map(Gen::Bnb4)
                    .or(packed4.map(Gen::Packed4))
                    .or(fp8.map(Gen::Fp8)),
            )
        }
        Some(Command::Bench(args)) => cmd_bench(&args),
        // The notes (the model's origin, the release, flags not modelled) follow a run that
        // worked: a refusal stays one line.
        Some(Command::Plan(args)) => match cmd_plan(&args) {
            Ok(true) => Ok(()),
            // vLLM would not start: the diagnosis is printed; exit 3.
            Ok(false) => return 3,
            Err(e) => Err(e),
        },
        Some(Command::Explain(args)) => super::explain::run(
            &args.log,
            &crate::profile::explain::Overrides {
                model: args.model.clone(),
                device: args.device.clone(),
                vllm: args.vllm.clone(),
            },
            args.no_what_if,
            args.json.as_deref(),
        ),
        Some(Command::Report(args)) => cmd_report(&args),
        Some(Command::HoldGpuMemory { ordinal, bytes }) => {
            device::cuda::hold_memory_child(ordinal, bytes)
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("vramscope: error: {}", one_line(&e.to_string()));
            2
        }
    }
}

/// A pasted `vllm serve` line as `profile` flags: the same parser reads both, so a vLLM flag
/// means exactly what its vramscope spelling means. Returns the notes to print (the model's
/// origin, flags that change nothing or are not modelled).
pub fn plan_profile_args(p: &PlanArgs) -> Result<(ProfileArgs, Vec<String>)> {
    let (profile, pasted) = p.split()?;
    let line = crate::profile::vllm_args::parse_serve(pasted)?;
    let (model, note) = crate::profile::vllm_args::resolve_model(&line.model)?;
    let given = |flag: &str| {
        profile
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    let vllm_given = given("--vllm");
    let mut argv: Vec<String> = vec![
        "vramscope".into(),
        "profile".into(),
        "--model".into(),
        model,
    ];
    argv.extend(profile.iter().cloned());
    // vLLM's --dtype auto when nothing names the dtype or a quantization.
    let named = |a: &String| a == "--dtype" || a == "--quantization";
    if !line.args.iter().any(named)
        && !["--dtype", "--quantization", "--quant"]
            .iter()
            .any(|f| given(f))
    {
        argv.extend(["--dtype".to_string(), "auto".to_string()]);
    }
    argv.extend(line.args.iter().cloned());
    let cli = Cli::try_parse_from(&argv).map_err(|e| {
        let text = e.render().to_string();
        crate::Error::Request(format!(
            "plan: {}",
            text.lines()
                .next()
                .unwrap_or("invalid")
                .trim_start_matches("error: ")
        ))
    })?;
    let Some(Command::Profile(args)) = cli.command else {
        return Err(crate::Error::Request(
            "the vLLM line did not read as a profile".into(),
        ));
    };
    // A plan needs the allocations, not the logits: a simulated device named without a mode
    // runs dry (the same bytes, seconds instead of a CPU forward of the whole model).
    let mut args = args;
    if args.device.starts_with("sim:") && args.device.split(':').count() == 2 {
        args.device.push_str(":dry");
    }
    let mut notes: Vec<String> = note.into_iter().collect();
    if !vllm_given {
        notes.push(format!(
            "vLLM {} (vramscope's default release): --vllm RELEASE before the -- for the one you run",
            crate::profile::vllm::DEFAULT
        ));
    }
    if args.llm_class {
        notes.push(
            "the LLM class's batch defaults (`vllm bench latency|throughput` start vLLM through \
             Python's `LLM`): 8192 tokens and 256 sequences below 70 GiB, 16384 and 1024 above, \
             where `vllm serve` takes 2048/256 and 8192/1024"
                .into(),
        );
    }
    let mistral3 = mistral3_format(&args.work.model, &args.vllm, &line.config_format);
    // The format's note replaces the flag's "no effect" warning.
    let format_flag = format!("--config-format {}:", line.config_format);
    notes.extend(
        line.warnings
            .iter()
            .filter(|w| mistral3.is_none() || !w.starts_with(&format_flag))
            .map(|w| format!("warning: {w}")),
    );
    let mut unmodelled = line.unmodelled.clone();
    unmodelled.extend(mistral3);
    notes.extend(crate::profile::vllm_args::assumed_line(&unmodelled));
    Ok((args, notes))
}

/// The note for a Mistral 3 checkpoint that vLLM would load in the Mistral format
/// (`vllm_args::mistral3_format_note`): the preset of a hub id, or a folder whose config.json
/// names `Mistral3ForConditionalGeneration` (its `params.json` looked for beside it).
fn mistral3_format(model: &str, vllm: &str, config_format: &str) -> Option<String> {
    let minor = crate::profile::vllm::release(vllm).ok()?.minor()?;
    let params_json = if let Some(name) = model.strip_prefix("preset:") {
        let cfg = crate::model::presets::preset(name)?;
        cfg.mistral3.as_ref()?;
        None
    } else {
        let dir = std::path::Path::new(model);
        let dir = if dir.is_dir() { dir } else { dir.parent()? };
        let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
        if !text.contains("Mistral3ForConditionalGeneration") {
            return None;
        }
        Some(dir.join("params.json").exists())
    };
    crate::profile::vllm_args::mistral3_format_note(config_format, minor, params_json)
}

/// Where the routed experts are on each rank, with expert or data parallel.
fn moe_parallel_sentence(r: &Report) -> String {
    let n = (r.tp.max(1) * r.settings.dp.max(1)) as usize;
    let e = r.model.num_experts;
    if r.settings.enable_expert_parallel && n > 1 {
        let (base, rem) = (e / n, e % n);
        format!(
            "expert parallel over {n} GPUs (tp {} × dp {}): each holds whole experts, {}{} of the {e} (determine_expert_map, linear), with an int32 expert_map of {e} entries per MoE layer",
            r.tp.max(1),
            r.settings.dp.max(1),
            base,
            if rem > 0 {
                format!(" (the first {rem}: {})", base + 1)
            } else {
                String::new()
            }
        )
    } else {
        format!(
            "experts cut over {n} GPUs (tp {} × dp {}): each holds 1/{n} of every expert's width (FusedMoE's tp_size is dp × tp)",
            r.tp.max(1),
            r.settings.dp.max(1)
        )
    }
}

/// vLLM's one-dash `-tp N` (and `-tp=N`) read as `--tp`, up to where `plan`'s pasted line
/// starts: a `--`, or with none the line's first word (`vllm`, `python`, `python3`, or an
/// environment assignment such as `VLLM_PP_LAYER_PARTITION=20,16`); `plan` reads the line
/// itself.
fn vllm_spellings(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut past = false;
    let mut plan = false;
    args.enumerate()
        .map(|(i, a)| {
            plan |= i == 1 && a == "plan";
            past |=
                a == "--" || (plan && i >= 2 && a.to_str().is_some_and(PlanArgs::starts_a_line));
            match a.to_str() {
                Some("-tp") if !past => "--tp".into(),
                Some(t) if !past && t.starts_with("-tp=") => format!("--tp={}", &t[4..]).into(),
                Some("-pp") if !past => "--pp".into(),
                Some(t) if !past && t.starts_with("-pp=") => format!("--pp={}", &t[4..]).into(),
                Some("-dp") if !past => "--dp".into(),
                Some(t) if !past && t.starts_with("-dp=") => format!("--dp={}", &t[4..]).into(),
                Some("-ep") if !past => "--ep".into(),
                _ => a,
            }
        })
        .collect()
}

fn one_line(s: &str) -> String {
    s.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

fn cmd_profile(args: &ProfileArgs) -> Result<()> {
    run_profile(args, None).map(|_| ())
}

/// `profile` as a command: the run, its exports and its summary (`model_name`: the name the
/// summary gives the model, a pasted line's hub id instead of the hub cache's folder).
fn run_profile(args: &ProfileArgs, model_name: Option<&str>) -> Result<Report> {
    if args.verbose {
        crate::base::timing::enable();
    }
    let out = cmd_profile_inner(args, model_name);
    if args.verbose {
        print_timing();
    }
    out
}

/// The hub id a pasted line names, where the run reads it from the hub cache's snapshot
/// folder (whose name is a commit hash, not the model's).
fn plan_hub_id(p: &PlanArgs) -> Option<String> {
    let (_, pasted) = p.split().ok()?;
    let line = crate::profile::vllm_args::parse_serve(pasted).ok()?;
    let (resolved, _) = crate::profile::vllm_args::resolve_model(&line.model).ok()?;
    (resolved != line.model && !resolved.starts_with("preset:")).then_some(line.model)
}

/// `plan`: vLLM's checks before the start, the run, then its checks after the profile. Prints
/// the summary (or only the diagnosis of a configuration vLLM refuses) and, where vLLM would
/// not start, the diagnosis; `--json` writes the plan document (`PlanDoc`). `Ok(false)`: vLLM
/// would not start.
fn cmd_plan(args: &PlanArgs) -> Result<bool> {
    use crate::app::explain::{plan_doc, PlanDoc};
    use crate::profile::diagnose;
    let (mut p, notes) = plan_profile_args(args)?;
    let hub_id = plan_hub_id(args);
    let json = p.json.take();
    if let Some(j) = &json {
        export::check_writable(j)?;
    }
    let req = p.request()?;
    let print_notes = |quiet: bool| {
        if !quiet {
            for n in &notes {
                eprintln!("vramscope: {n}");
            }
        }
    };
    let write = |doc: &PlanDoc| -> Result<()> {
        if let Some(path) = &json {
            let bytes = serde_json::to_vec_pretty(doc)
                .map_err(|err| crate::Error::Request(format!("{}: {err}", path.display())))?;
            crate::base::atomic::atomic_write(path, &bytes)?;
        }
        Ok(())
    };
    // A start that fails without a run to report: the document and the diagnosis alone.
    let fails = |d: diagnose::Diagnosis| -> Result<bool> {
        write(&plan_doc(
            &req,
            None,
            Some(d.clone()),
            &notes,
            json.is_some(),
        ))?;
        for l in d.lines() {
            println!("{l}");
        }
        print_notes(p.quiet);
        Ok(false)
    };
    if let Some(d) = diagnose::before_run(&req, None)? {
        return fails(d);
    }
    let report = match run_profile(&p, hub_id.as_deref()) {
        Ok(r) => r,
        // The run stopped where vLLM's load or profile would raise torch.OutOfMemoryError:
        // vLLM would not start, and that is the answer.
        Err(e @ crate::Error::OutOfMemory { .. }) => {
            return match diagnose::of_oom(&req, &e) {
                Some(d) => fails(d),
                None => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    let d = diagnose::of_run(&req, &report);
    write(&plan_doc(
        &req,
        Some(&report),
        d.clone(),
        &notes,
        json.is_some(),
    ))?;
    if let Some(d) = &d {
        println!();
        for l in d.lines() {
            println!("{l}");
        }
    }
    print_notes(p.quiet);
    Ok(d.is_none())
}

fn cmd_profile_inner(args: &ProfileArgs, model_name: Option<&str>) -> Result<Report> {
    let req = args.request()?;
    // Every name checked (length, folder, no two exports naming one file) before the run.
    let mut targets = export::report_targets(
        args.json.as_deref(),
        args.csv.as_deref(),
        args.png.as_deref(),
    );
    targets.extend(args.torch_snapshot.clone());
    export::check_targets(targets.iter().map(|p| p.as_path()))?;
    profile::host_memory::insist(args.allow_host_memory);
    // Every run, dry ones too: the event log of every rank and the exports are counted, and
    // the address-space limit (ulimit -v) is respected; refused before the estimate is
    // printed, so an error stays one line.
    let estimate =
        profile::host_memory::estimate_request(&req)?.with_exports(profile::host_memory::Exports {
            json: args.json.is_some(),
            csv: args.csv.is_some(),
            png: args.png.is_some(),
            torch_snapshot: args.torch_snapshot.is_some(),
        });
    profile::host_memory::check_estimate(&estimate)?;
    if !args.quiet && matches!(req.device, DeviceSpec::Sim { dry: false, .. }) {
        eprintln!("{}", estimate.summary());
    }
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {prefix:>18} [{bar:30}] {pos}/{len} {msg}",
            )
            .expect("template")
            .progress_chars("=> "),
        );
        b
    });
    let sink = bar.clone().map(|b| {
        Box::new(move |p: Progress| match p {
            Progress::Phase(ph) => {
                b.set_prefix(ph.label());
                if ph == Phase::Done {
                    b.finish_and_clear();
                }
            }
            Progress::Load {
                index,
                count,
                tensor,
                ..
            } => {
                b.set_length(count as u64);
                b.set_position(index as u64 + 1);
                b.set_message(tensor);
            }
            Progress::Pass { pass, of, verify } => {
                b.set_length(of as u64);
                b.set_position(pass as u64);
                b.set_message(verify.map(|v| format!("verify {v}")).unwrap_or_default());
            }
            Progress::Layer { layer, of } => b.set_message(format!("layer {}/{of}", layer + 1)),
            Progress::Events(_) => b.tick(),
        }) as crate::engine::progress::ProgressSink
    });
    let report = profile::run(&req, sink, Arc::new(AtomicBool::new(false)));
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = report?;
    // Each export streams into its temporary file; all are renamed only once every one was
    // written: a failing export leaves no partial set behind.
    let mut files = export::report_renders(
        &report,
        args.json.as_deref(),
        args.csv.as_deref(),
        args.png.as_deref(),
    )?;
    if let Some(p) = &args.torch_snapshot {
        let report = &report;
        files.push((
            p.clone(),
            Box::new(move |w: &mut dyn std::io::Write| {
                crate::report::snapshot::write::write_to(report, p, w)
            }),
        ));
    }
    export::write_streamed(files)?;
    if !args.quiet {
        match model_name {
            // The first line opens with the model's name.
            Some(name) => print!(
                "{}",
                summary_text(&report).replacen(
                    &report.model.name,
                    &format!("{name} (the hub cache's copy)"),
                    1
                )
            ),
            None => print!("{}", summary_text(&report)),
        }
    }
    Ok(report)
}

/// `report SNAPSHOT.pickle`: read a PyTorch memory snapshot, print what it says, export one
/// device's timeline. Every check runs before anything is written.
fn cmd_report(args: &ReportArgs) -> Result<()> {
    // Every name checked (length, folder, no two exports naming one file) before the read.
    export::check_targets(
        export::report_targets(
            args.json.as_deref(),
            args.csv.as_deref(),
            args.png.as_deref(),
        )
        .iter()
        .map(|p| p.as_path()),
    )?;
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("reading [{bar:30}] {bytes}/{total_bytes}")
                .expect("template")
                .progress_chars("=> "),
        );
        b
    });
    let started = std::time::Instant::now();
    let mut on_progress = |read: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(read);
        }
    };
    let imported = crate::report::snapshot::read(&args.snapshot, Some(&mut on_progress));
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let mut imported = imported?;
    let seconds = started.elapsed().as_secs_f64();
    let summary = imported.summary_text(args.total);
    let (file_bytes, path) = (imported.file_bytes, imported.path.clone());
    let devices = imported
        .devices
        .iter()
        .map(|t| format!("cuda:{}", t.device))
        .collect::<Vec<_>>()
        .join(", ");
    let timeline = imported
        .take_device(args.device)
        .ok_or_else(|| crate::Error::Snapshot {
            path: path.clone(),
            problem: match args.device {
                Some(d) => format!("no device {d} in the snapshot (it has {devices})"),
                None => "the snapshot holds no segments and no trace entries".into(),
            },
        })?;
    drop(imported);
    if args.json.is_some() || args.csv.is_some() || args.png.is_some() {
        let report = timeline.into_report(&path, args.total);
        let files = export::report_renders(
            &report,
            args.json.as_deref(),
            args.csv.as_deref(),
            args.png.as_deref(),
        )?;
        export::write_streamed(files)?;
        // The process ends next: freeing a million events one by one would only delay it.
        std::mem::forget(report);
    } else {
        std::mem::forget(timeline);
    }
    if !args.quiet {
        print!("{summary}");
        let peak = crate::report::snapshot::peak_memory_bytes();
        println!(
            "read in {seconds:.2} s{}",
            peak.map(|p| format!(
                "; peak memory of this process {} ({:.2}x the file)",
                fmt_u(p),
                p as f64 / file_bytes.max(1) as f64
            ))
            .unwrap_or_default()
        );
    }
    Ok(())
}

/// The stdout summary: a vLLM-style log line and one row per formula.
pub fn summary_text(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let sim = if r.device.simulated {
        " [simulated device]"
    } else {
        ""
    };
    let _ = writeln!(
        s,
        "{} {} on {}{}: {} tokens in {} seq(s), {} pass(es), util {}",
        r.model.name,
        r.quant,
        r.device.name,
        sim,
        r.settings.tokens,
        r.settings.seqs,
        r.settings.passes,
        r.settings.util
    );
    // The release's own log lines (380e1863 by default: vllm/worker/worker.py L260-271), with
    // the numbers it would print, so a user can hold them against theirs.
    for line in r.vllm_log_lines() {
        let _ = writeln!(s, "{line}");
    }
    for line in r.vllm_graph_log_lines() {
        let _ = writeln!(s, "{line}");
    }
    for line in r.graph_summary() {
        let _ = writeln!(s, "{line}");
    }
    for line in r.warm_up_summary() {
        let _ = writeln!(s, "{line}");
    }
    if let Some(h) = r.does_not_fit() {
        let _ = writeln!(s, "{h}");
    }
    if let Some(a) = r
        .vllm_answer()
        .filter(|a| a.release.name != profile::vllm::DEFAULT)
    {
        let _ = writeln!(
            s,
            "vLLM {} ({}): # GPU blocks: {}; batch {} tokens in {} sequences{}",
            a.release.name,
            a.formula.id.short(),
            a.kv_blocks,
            r.settings.tokens,
            r.settings.seqs,
            if r.settings.chunked_prefill == Some(true) {
                ", chunked prefill"
            } else {
                ""
            }
        );
    }
    if let Some(n) = r.formula(FormulaId::Pr9516) {
        let _ = writeln!(
            s,
            "#9516: {} KV cache blocks of {} tokens, max concurrency {:.2}x for {} tokens; batch {} tokens in {} sequences{}",
            n.kv_blocks,
            r.kv_geometry.block_size,
            n.max_concurrency,
            r.kv_geometry.max_model_len,
            r.settings.tokens,
            r.settings.seqs,
            if r.settings.sampler { ", sampler on" } else { ", no sampler" }
        );
    }
    if let Some(m) = &r.true_max {
        let _ = writeln!(
            s,
            "true maximum: {} KV blocks ({}) run {} serving passes within floor(T·u); one block more: {} ({} verify runs)",
            m.blocks,
            fmt_u(m.kv_bytes),
            m.serving_passes,
            m.one_more.message,
            m.probes
        );
    }
    if r.settings.kv_cache_dtype != KvCacheDtype::Auto {
        let _ = writeln!(
            s,
            "kv_cache_dtype {}: {} byte(s) per element, {} per block",
            r.settings.kv_cache_dtype.name(),
            r.kv_geometry.dtype_bytes,
            fmt_u(r.kv_geometry.block_bytes())
        );
    }
    if r.settings.device.total_override().is_some() {
        let _ = writeln!(
            s,
            "total {} ({} bytes) given with --total",
            fmt_u(r.checkpoints.t0.total),
            r.checkpoints.t0.total
        );
    }
    let _ = writeln!(
        s,
        "weights {} ({} bytes); int8 state alive after the pass {}; outside the framework {}; truth (peak of this instance) {}",
        fmt_u(r.weights_bytes),
        r.weights_bytes,
        fmt_u(r.quant_state_after_bytes),
        fmt_u(r.outside_framework_bytes),
        fmt_i(r.truth.non_kv_bytes)
    );
    if let Some(e) = r.encoder_sentence() {
        let _ = writeln!(s, "{e}");
    }
    if let Some(e) = r.experts_sentence() {
        let _ = writeln!(s, "{e}");
    }
    if r.model.expert_parameters > 0 && (r.settings.enable_expert_parallel || r.settings.dp > 1) {
        let _ = writeln!(s, "{}", moe_parallel_sentence(r));
    }
    if r.settings.dp > 1 {
        let _ = writeln!(
            s,
            "data parallel: {} replicas of {} GPU(s), each its own engine with its own KV cache{}",
            r.settings.dp,
            r.tp.max(1) * r.pp.max(1),
            if r.model.expert_parameters > 0 {
                "; the replicas exchange their tokens around every MoE layer (all-gather before the experts, reduce-scatter after: VLLM_ALL2ALL_BACKEND's default allgather_reducescatter), and every replica's ranks run below"
            } else {
                "; a dense model's replicas are independent engines (vLLM runs each as data_parallel_size 1), so one replica's ranks stand for all"
            }
        );
    }
    if r.settings.nodes() > 1 {
        let _ = writeln!(
            s,
            "{} hosts of {} {} GPUs ({} used), over {}: ranks fill one host after another",
            r.settings.nodes(),
            crate::profile::request::MAX_TP,
            r.device.name,
            r.settings.gpus(),
            r.settings.network.name()
        );
    }
    if r.pp > 1 {
        let _ = writeln!(
            s,
            "pipeline parallel over {} stages of {} GPU(s) ({} ranks): the lines above and the table below are rank {}'s, the rank with the fewest #9516 blocks",
            r.pp,
            r.tp,
            r.pp * r.tp,
            r.rank
        );
    } else if r.tp > 1 {
        let _ = writeln!(
            s,
            "tensor parallel over {} GPUs: the lines above and the table below are rank {}'s, the rank with the fewest #9516 blocks",
            r.tp, r.rank
        );
    }
    if r.tp > 1 || r.pp > 1 || r.settings.dp > 1 {
        for k in &r.ranks {
            let stage = k.stage.map_or(String::new(), |st| {
                format!(
                    "stage {}, layers {}-{}, ",
                    st.stage,
                    st.first_layer,
                    st.end_layer.saturating_sub(1)
                )
            });
            let _ = writeln!(
                s,
                "  rank {} ({stage}{}): weights {}, framework peak {}, NCCL {}, truth non-KV {}, #9516 non-KV {} ({} blocks)",
                k.rank,
                k.device.spec,
                fmt_u(k.weights_bytes),
                fmt_u(k.checkpoints.t2.allocated_peak),
                fmt_u(k.nccl_bytes()),
                fmt_i(k.truth.non_kv_bytes),
                k.formula(FormulaId::Pr9516)
                    .map_or(String::new(), |f| fmt_i(f.non_kv_bytes)),
                k.formula(FormulaId::Pr9516).map_or(0, |f| f.kv_blocks),
            );
            if let Some(a) = k.vllm_answer() {
                let f = a.formula;
                let _ = writeln!(
                    s,
                    "    vLLM {}: weights {}, activation {}, non-torch {}, KV {} ({} blocks)",
                    a.release.name,
                    fmt_i(f.weights_term_bytes),
                    fmt_i(f.non_kv_bytes - f.non_torch_bytes - f.weights_term_bytes),
                    fmt_i(f.non_torch_bytes),
                    fmt_i(a.kv_bytes),
                    a.kv_blocks
                );
            }
        }
        if let Some(src) = &r.nccl_source {
            let _ = writeln!(s, "  NCCL: {src}");
        }
        let engine: Vec<String> = r
            .engine
            .iter()
            .map(|e| format!("{} {} (rank {})", e.key, e.kv_blocks, e.binding_rank))
            .collect();
        let _ = writeln!(
            s,
            "  the engine takes the fewest blocks over the ranks: {}",
            engine.join(", ")
        );
        // Each data-parallel replica is its own engine (v1/engine/core.py 0.19.0
        // L1049-1082): the fewest blocks over its own ranks.
        let per_replica = (r.tp.max(1) * r.pp.max(1)) as usize;
        if r.settings.dp > 1 && r.ranks.len() > per_replica {
            let replicas: Vec<String> = r
                .ranks
                .chunks(per_replica)
                .enumerate()
                .map(|(d, ks)| {
                    let blocks = ks
                        .iter()
                        .filter_map(|k| k.vllm_answer().map(|a| a.kv_blocks))
                        .min()
                        .unwrap_or(0);
                    format!("replica {d} {blocks}")
                })
                .collect();
            let _ = writeln!(
                s,
                "  each data-parallel replica is its own engine, its blocks the fewest over its ranks (vLLM {}): {}",
                r.settings.vllm,
                replicas.join(", ")
            );
        }
    }
    if r.other_process_bytes > 0 {
        let _ = writeln!(
            s,
            "another process held {} before the instance (--outside-before {}{})",
            fmt_u(r.other_process_bytes),
            fmt_u(r.settings.outside_before),
            if r.device.simulated {
                ""
            } else {
                "; its own CUDA context comes on top"
            }
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<34} {:>12} {:>12} {:>12} {:>12} {:>9} {:>12}  verify",
        "formula", "torch peak", "non-torch", "non-KV", "KV budget", "blocks", "error"
    );
    let verify_text = |v: &Option<profile::report::Verify>| {
        v.as_ref().map_or_else(|| "-".to_string(), |v| v.short())
    };
    for f in &r.formulas {
        let _ = writeln!(
            s,
            "{:<34} {:>12} {:>12} {:>12} {:>12} {:>9} {:>12}  {}",
            f.title,
            fmt_i(f.torch_peak_bytes),
            fmt_i(f.non_torch_bytes),
            fmt_i(f.non_kv_bytes),
            fmt_i(f.kv_bytes),
            f.kv_blocks,
            fmt_i(f.error_bytes),
            verify_text(&f.verify)
        );
    }
    let t = &r.truth;
    let _ = writeln!(
        s,
        "{:<34} {:>12} {:>12} {:>12} {:>12} {:>9} {:>12}  {}",
        "measured truth",
        "",
        "",
        fmt_i(t.non_kv_bytes),
        fmt_i(t.kv_bytes),
        t.kv_blocks,
        "",
        verify_text(&t.verify)
    );
    if let Some(m) = &r.true_max {
        let _ = writeln!(s, "against the true maximum ({} blocks):", m.blocks);
        for f in &r.formulas {
            let d = f.kv_blocks as i64 - m.blocks as i64;
            let _ = writeln!(
                s,
                "  {:<32} {:+} blocks ({})",
                f.title,
                d,
                fmt_i(d * r.kv_geometry.block_bytes() as i64)
            );
        }
    }
    let why = r.old_vs_new_explanation();
    if !why.is_empty() {
        let _ = writeln!(s, "\n{why}");
    }
    let _ = writeln!(s, "{} events, {:.2} s", r.event_count, r.wall_time_s);
    s
}

fn cmd_devices() -> Result<()> {
    let (list, why) = device::list_devices();
    if let Some(w) = why {
        println!("no CUDA GPU: {}", one_line(&w));
    }
    let gpus: Vec<_> = list.iter().filter(|d| d.preset.is_none()).collect();
    for d in &gpus {
        println!("{:<22} {:>12}  {}", d.spec, fmt_u(d.total_bytes), d.name);
    }
    if !gpus.is_empty() {
        println!();
    }
    println!(
        "{:<22} {:>12} {:>12} {:>12}  {:<9} {:<9} name; source of the cudaMemGetInfo total",
        "simulated", "simulates", "cudaMemGetInfo", "nvidia-smi", "arch", "total is"
    );
    for d in &list {
        let Some(p) = &d.preset else { continue };
        let kind = match (p.superseded_by, p.total_measured) {
            (Some(_), _) => "smi",
            (None, true) => "measured",
            (None, false) => "estimated",
        };
        let name = match p.superseded_by {
            Some(new) => format!("{} (kept name; sim:{new} simulates vLLM's total)", p.name),
            None => p.name.to_string(),
        };
        println!(
            "{:<22} {:>12} {:>14} {:>12}  {:<9} {:<9} {name}; {}",
            d.spec,
            fmt_u(p.total_bytes),
            fmt_u(p.mem_get_info_bytes),
            fmt_u(p.smi_bytes),
            p.arch,
            kind,
            p.total_source
        );
    }
    Ok(())
}

fn cmd_inspect(path: &std::path::Path) -> Result<()> {
    let i = model::inspect(path)?;
    let c = &i.config;
    println!("{}", i.path.display());
    println!(
        "{}: hidden {}, intermediate {}, layers {}, heads {} (kv {}), head_dim {}, vocab {}, rope_theta {}, rms_eps {}, tied embeddings {}",
        c.arch, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size, c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings
    );
    println!(
        "parameters {} in {} tensors ({} file(s))",
        i.parameters, i.tensors, i.shards
    );
    for (k, v) in &i.metadata {
        println!("  {k} = {v}");
    }
    for (dtype, count, bytes) in &i.by_dtype {
        println!(
            "  {dtype:<5} {count:>5} tensors {:>12} ({bytes} bytes)",
            fmt_u(*bytes)
        );
    }
    Ok(())
}

/// A quantized checkpoint `gen-model` writes.
enum Gen {
    Bnb4(model::Bnb4Gen),
    Packed4(crate::quant::marlin::Format),
    /// Per-tensor or block-wise fp8.
    Fp8(model::Fp8Gen),
}

fn cmd_gen(
    preset: &str,
    dir: &std::path::Path,
    opts: model::GenOptions,
    quantized: Option<Gen>,
) -> Result<()> {
    let files = match quantized {
        Some(Gen::Fp8(model::Fp8Gen::PerTensor(static_act))) => {
            model::gen_model_fp8(preset, dir, &opts, static_act)?
        }
        Some(Gen::Fp8(model::Fp8Gen::Block(b))) => {
            model::gen_model_fp8_block(preset, dir, &opts, b)?
        }
        Some(Gen::Fp8(f @ (model::Fp8Gen::Channel | model::Fp8Gen::Int8Channel))) => {
            let config = model::presets::preset(preset).ok_or_else(|| {
                crate::base::error::Error::Request(format!("unknown preset '{preset}'"))
            })?;
            if f == model::Fp8Gen::Int8Channel {
                model::gen_model_config_int8_channel(&config, preset, dir, &opts)?
            } else {
                model::gen_model_config_fp8_channel(&config, preset, dir, &opts)?
            }
        }
        Some(Gen::Bnb4(g)) => model::gen_model_bnb4(preset, dir, &opts, g)?,
        Some(Gen::Packed4(f)) => {
            if !crate::quant::marlin::MARLIN_GROUP_SIZES.contains(&f.group_size) {
                return Err(crate::base::error::Error::Request(format!(
                    "--group-size {}: expected 32, 64, 128 or -1 (the group sizes vLLM's Marlin runs)",
                    f.group_size
                )));
            }
            model::gen_model_packed4(preset, dir, &opts, f)?
        }
        None => model::gen_model_with(preset, dir, &opts)?,
    };
    for s in &files.shards {
        println!("wrote {}", s.display());
    }
    if files.shards.len() > 1 {
        println!("wrote {}", files.weights.display());
    }
    println!("wrote {}", files.config.display());
    Ok(())
}

/// `-v`: the phases, then the wall time since the process started.
fn print_timing() {
    eprintln!("where the time went (wall):");
    for l in crate::base::timing::report() {
        eprintln!("{l}");
    }
    eprintln!(
        "  {:<44} {:>8.3} s",
        "process start to now",
        crate::base::timing::since_start()
    );
}

fn cmd_bench(a: &BenchArgs) -> Result<()> {
    if a.verbose {
        crate::base::timing::enable();
    }
    let req = crate::app::bench::BenchRequest {
        model: ModelSource::parse(&a.work.model)?,
        quant: Quant::parse(&a.work.quant)?,
        device: DeviceSpec::parse(&a.device)?,
        tokens: a.work.tokens.unwrap_or(8192),
        seqs: a.work.seqs.unwrap_or(1),
        iters: a.iters,
        fast_weights: a.fast_weights,
        int8_threshold: a.work.int8_threshold,
        seed: a.work.seed,
        op_times: a.op_times,
        sampler_rows: if a.sampler_dump.is_some() { 4 } else { 0 },
        sampler_seqs: crate::profile::request::VLLM_MAX_NUM_SEQS,
        tp: a.tp,
        ep: a.ep,
    };
    // No timed pass would leave the median undefined (NaN in the output).
    crate::base::limits::count("--iters", a.iters as u64, 1, crate::base::limits::MAX_ITERS)?;
    // The comparison file is checked before the run, so a bad one fails in a second.
    let compare = a
        .compare
        .as_deref()
        .map(crate::app::bench::read_compare_logits)
        .transpose()?;
    if let Some(p) = &a.json {
        export::check_writable(p)?;
    }
    let r = crate::app::bench::run(&req);
    if a.verbose {
        print_timing();
    }
    let r = r?;
    if let (Some(dir), Some(out)) = (&a.sampler_dump, &r.sampler) {
        std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, e))?;
        let raw = |name: &str, v: &[f32]| -> Result<()> {
            let p = dir.join(name);
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            std::fs::write(&p, bytes).map_err(|e| crate::Error::io(&p, e))
        };
        raw("logits.f32", &out.logits_head)?;
        raw("probs.f32", &out.probs_head)?;
        let meta = serde_json::json!({
            "rows": out.logits_head.len() / r.vocab.max(1),
            "vocab": r.vocab,
            "sampled_ids": out.ids.iter().take(16).collect::<Vec<_>>(),
            "sampler_ms": r.sampler_ms,
            "seqs": r.sampler_seqs,
            "model": r.model,
            "quant": r.quant,
            "device": r.device,
        });
        let p = dir.join("sampler.json");
        std::fs::write(&p, meta.to_string()).map_err(|e| crate::Error::io(&p, e))?;
    }
    if let Some(ms) = r.sampler_ms {
        println!(
            "vLLM sampler step on {} sequences x {} vocabulary: {ms:.2} ms",
            r.sampler_seqs, r.vocab
        );
    }
    println!(
        "{} {} on {}: {} tokens in {} seq(s); load {:.1} s ({:.1} s making or reading the weights, {:.1} s quantizing); pass {:.2} ms median of {:?}; {:.1} TFLOP/s ({:.3e} FLOP); weights {} B; peak allocated {} B; process peak {} B",
        r.model, r.quant, r.device, r.tokens, r.seqs, r.load_s, r.load_read_s, r.load_quantize_s, r.median_ms,
        r.pass_ms.iter().map(|v| (v * 100.0).round() / 100.0).collect::<Vec<_>>(),
        r.tflops, r.flops, r.weights_bytes, r.peak_allocated_bytes, r.process_peak_bytes
    );
    if r.tp > 1 {
        println!(
            "tensor parallel over {} ranks (times of rank 0): weights per rank {:?} B; process peak per rank {:?} B",
            r.tp, r.rank_weights_bytes, r.rank_process_peak_bytes
        );
    }
    if let Some(hz) = r.nvml_rate_hz {
        println!("NVML sampler: {hz:.0} reads/s");
    }
    if !r.op_ms.is_empty() {
        let total: f64 = r.op_ms.iter().map(|(_, t)| t).sum();
        let mut rows = r.op_ms.clone();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        println!("GPU time per op in one more pass ({total:.2} ms in all):");
        for (op, ms) in rows {
            println!("  {op:<24} {ms:>9.2} ms {:>5.1} %", 100.0 * ms / total);
        }
    }
    if let (Some(p), Some(other)) = (&a.compare, compare) {
        if other.len() != r.logits.len() {
            return Err(crate::Error::model(
                p,
                format!("{} logits, this run has {}", other.len(), r.logits.len()),
            ));
        }
        println!(
            "relative L2 error against {}: {:.3e}",
            p.display(),
            crate::app::bench::relative_l2(&r.logits, &other)
        );
    }
    if let Some(p) = &a.json {
        crate::app::bench::write_json(&r, p, true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile_request(flags: &str) -> ProfileRequest {
        let argv: Vec<&str> = ["vramscope", "profile"]
            .into_iter()
            .chain(flags.split_whitespace())
            .collect();
        let cli = Cli::try_parse_from(vllm_spellings(argv.into_iter().map(Into::into)))
            .unwrap_or_else(|e| panic!("{flags}: {e}"));
        let Some(Command::Profile(p)) = cli.command else {
            panic!("not profile")
        };
        p.request().unwrap_or_else(|e| panic!("{flags}: {e}"))
    }

    fn plan(line: &str) -> (ProfileRequest, Vec<String>) {
        let argv: Vec<&str> = ["vramscope", "plan", "--vllm", "0.19", "--"]
            .into_iter()
            .chain(line.split_whitespace())
            .collect();
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{line}: {e}"));
        let Some(Command::Plan(p)) = cli.command else {
            panic!("not plan")
        };
        let (args, notes) = plan_profile_args(&p).unwrap_or_else(|e| panic!("{line}: {e}"));
        (args.request().unwrap(), notes)
    }

    /// Every vLLM flag `plan` reads gives the request its vramscope spelling gives.
    #[test]
    fn each_vllm_flag_plans_as_its_vramscope_spelling() {
        let base = "--model preset:llama-3-8b --vllm 0.19 --quant bf16";
        for (vllm, ours) in [
            ("-tp 2", "--tp 2"),
            ("--tensor-parallel-size 2", "--tp 2"),
            ("--gpu-memory-utilization 0.95", "--util 0.95"),
            ("--max-model-len 4096", "--max-model-len 4096"),
            ("--max-model-len 4k", "--max-model-len 4000"),
            ("--max-num-seqs 64", "--max-num-seqs 64"),
            (
                "--max-num-batched-tokens 4096",
                "--max-num-batched-tokens 4096",
            ),
            (
                "--enable-chunked-prefill --max-model-len 65536",
                "--enable-chunked-prefill true --max-model-len 65536",
            ),
            ("--kv-cache-dtype fp8", "--kv-cache-dtype fp8"),
            ("--enforce-eager", "--enforce-eager"),
            ("--enable-prefix-caching", "--prefix-caching on"),
            ("--no-enable-prefix-caching", "--prefix-caching off"),
            ("--block-size 32", "--block-size 32"),
            // human_readable_int: G is 2^30 (vLLM refuses "40GiB").
            ("--kv-cache-memory 40G", "--kv-cache-memory 40GiB"),
            (
                "--kv-cache-memory-bytes 42949672960",
                "--kv-cache-memory 40GiB",
            ),
            ("--dtype half", "--quant fp16"),
        ] {
            let (planned, _) = plan(&format!("vllm serve meta-llama/Meta-Llama-3-8B {vllm}"));
            let ours = profile_request(
                &format!("{base} {ours}").replace("--quant bf16 --quant fp16", "--quant fp16"),
            );
            assert_eq!(planned, ours, "{vllm}");
        }
        // --quantization: fp8 on the preset, as `--quant fp8`.
        let (planned, _) = plan("vllm serve meta-llama/Meta-Llama-3-8B --quantization fp8");
        assert_eq!(
            planned,
            profile_request("--model preset:llama-3-8b --vllm 0.19 --quant fp8")
        );
        // vLLM's -tp on profile itself.
        assert_eq!(
            profile_request(&format!("{base} -tp 2")),
            profile_request(&format!("{base} --tensor-parallel-size 2"))
        );
    }

    #[test]
    fn flags_vramscope_does_not_model_are_named() {
        let (_, notes) =
            plan("vllm serve meta-llama/Meta-Llama-3-8B --speculative-config x --port 8000");
        assert!(notes[0].contains("built-in preset llama-3-8b"), "{notes:?}");
        let assumed: Vec<&String> = notes.iter().filter(|n| n.starts_with("assumed:")).collect();
        assert_eq!(assumed.len(), 1, "{notes:?}");
        assert!(
            assumed[0].contains("--speculative-config x (a draft model"),
            "{notes:?}"
        );
        assert!(assumed[0].ends_with("not modelled, so their memory is not in vramscope's answer"));
        assert!(notes.iter().any(|n| n.contains("--port 8000: no effect")));
    }

    #[test]
    fn kv_cache_memory_sets_the_budget_and_skips_the_estimate() {
        let r = crate::profile::run(
            &profile_request(
                "--model preset:llama-3-8b --vllm 0.21 --kv-cache-memory 40GiB --no-verify",
            ),
            None,
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
        let a = r.vllm_answer().unwrap();
        assert_eq!(a.kv_bytes, 40 << 30);
        assert_eq!(r.graphs_estimate_applied(), 0);
        assert!(r.graphs.as_ref().unwrap().estimate.is_none());
        let lines = r.vllm_log_lines().join("\n");
        assert!(
            lines.contains("reserved 40.00 GiB memory for KV Cache"),
            "{lines}"
        );
        let cli = Cli::try_parse_from(
            "vramscope profile --model preset:llama-3-8b --vllm 0.6.4 --kv-cache-memory 4GiB"
                .split_whitespace(),
        )
        .unwrap();
        let Some(Command::Profile(p)) = cli.command else {
            panic!("not profile")
        };
        let e = p.request().unwrap_err().to_string();
        assert!(e.contains("vLLM 0.6.4 has no such flag"), "{e}");
    }
}

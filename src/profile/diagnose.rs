//! Why a vLLM start fails: each failure vLLM users hit, in the words of the release that
//! raises it (its message, file and line), one sentence of cause, and what would start.
//!
//! `explain` reads these from a failed start's log (`read_failure`, one log line at a time);
//! `plan` finds the same before the start, running vLLM's checks in vLLM's order
//! (`before_start` on the configuration, then `after_profile` on vramscope's run). One enum
//! serves both, so a log and a plan of the same command say the same thing.
//!
//! Sources, read for each message: vLLM 0.19.0 (V1) and 0.6.4.post1 (V0), and 0.10.2/0.11.0
//! where V1's wording differs (the free-memory check moved from `v1/worker/gpu_worker.py` to
//! `v1/worker/utils.py` in between).

use serde::{Deserialize, Serialize};

use super::log_numbers;
use super::vllm::{Engine, Release};

const GIB: f64 = (1u64 << 30) as f64;

/// Where a start that ran out of memory after the KV cache was allocated was: vLLM's warm-up
/// steps after `initialize_kv_cache` (0.19.0 v1/worker/gpu_worker.py L550-690).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarmUp {
    /// `_dummy_sampler_run` (gpu_worker.py L686): the sampler on max_num_seqs dummy requests.
    Sampler,
    /// `capture_model` (gpu_worker.py L588): the CUDA graphs.
    CudaGraphs,
    /// A `torch.OutOfMemoryError` the log does not place (no traceback frame it names).
    Unplaced,
}

impl WarmUp {
    fn words(self) -> &'static str {
        match self {
            WarmUp::Sampler => "the sampler's warm-up",
            WarmUp::CudaGraphs => "the CUDA graph capture",
            WarmUp::Unplaced => "a step the log does not name",
        }
    }
}

/// A failed start, with the numbers vLLM's message gives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StartFailure {
    /// V1: free memory at start below `ceil(total × util)`.
    FreeMemoryBelowUtil {
        free_gib: f64,
        total_gib: f64,
        util: f64,
        requested_gib: f64,
    },
    /// The profile left nothing for the KV cache.
    NoCacheBlocks,
    /// Some KV cache, but less than one request of max_model_len needs.
    KvBelowMaxModelLen {
        max_model_len: u64,
        /// V1: the KV one request needs and the KV available (GiB).
        needed_gib: Option<f64>,
        available_gib: Option<f64>,
        /// V0: the tokens the blocks hold.
        kv_tokens: Option<u64>,
        /// V1: "the estimated maximum model length is N".
        estimated_max_len: Option<u64>,
    },
    /// `torch.OutOfMemoryError` after the KV cache was allocated (V1 warm-ups).
    OutOfMemoryAfterKv {
        phase: WarmUp,
        tried_gib: Option<f64>,
        free_gib: Option<f64>,
        /// The sampler's dummy requests (its message names them).
        num_reqs: Option<u64>,
    },
    /// `torch.OutOfMemoryError` before any KV line: loading or profiling.
    OutOfMemory {
        tried_gib: Option<f64>,
        free_gib: Option<f64>,
        /// What PyTorch's message calls "reserved by PyTorch but unallocated": cached free
        /// blocks, none of which could take the request when it is larger than the request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unallocated_gib: Option<f64>,
    },
    MaxModelLenOverPositions {
        max_model_len: u64,
        derived: u64,
        /// The config key the derived length came from ("max_position_embeddings").
        key: String,
    },
    HeadsNotDivisible {
        heads: u64,
        tp: u32,
    },
    /// `divide` in a parallel layer (vocabulary, MLP width, KV heads).
    NotDivisible {
        numerator: u64,
        denominator: u64,
    },
    /// TP × PP above the GPUs of the node (`tp`: the tensor-parallel size, 0 where the
    /// message does not give it).
    WorldOverGpus {
        world: u32,
        tp: u32,
        gpus: u32,
    },
    /// A data-parallel rank with no GPU left for it.
    DataParallelOverGpus {
        range: String,
        visible: String,
    },
    UnknownArchitecture {
        architectures: String,
    },
    UnknownQuantization {
        method: String,
    },
    /// The model id is no local folder and the hub could not be asked (`network`: the log
    /// shows a connection error) or does not have it.
    ModelNotFound {
        model: String,
        network: bool,
    },
    /// A 2:4 sparse compressed-tensors checkpoint under a release whose `CompressedTensors24`
    /// raises (0.19 on: `quant::sparse24::release_refusal`).
    Sparse24Removed,
}

impl StartFailure {
    /// Memory is the cause: vramscope can reproduce it.
    pub fn is_memory(&self) -> bool {
        matches!(
            self,
            StartFailure::FreeMemoryBelowUtil { .. }
                | StartFailure::NoCacheBlocks
                | StartFailure::KvBelowMaxModelLen { .. }
                | StartFailure::OutOfMemoryAfterKv { .. }
                | StartFailure::OutOfMemory { .. }
        )
    }

    /// An out-of-memory error while PyTorch held at least `FRAGMENTED_BYTES`, and at least the
    /// request, reserved but unallocated: no free block could take it.
    pub fn is_fragmentation(&self) -> bool {
        match self {
            StartFailure::OutOfMemory {
                tried_gib: Some(t),
                unallocated_gib: Some(u),
                ..
            } => *u >= t.max(FRAGMENTED_BYTES as f64 / GIB),
            _ => false,
        }
    }

    /// The cause, in one sentence.
    pub fn cause(&self) -> String {
        match self {
            StartFailure::FreeMemoryBelowUtil {
                free_gib,
                total_gib,
                util,
                requested_gib,
            } => format!(
                "another process held GPU memory: only {free_gib:.2} of {total_gib:.2} GiB were \
                 free at start, less than the {requested_gib:.2} GiB that \
                 gpu_memory_utilization {util} asks for, so vLLM refused before loading the \
                 model ({:.2} GiB short).",
                requested_gib - free_gib
            ),
            StartFailure::NoCacheBlocks => "the weights, the profile pass's activations and the \
                 memory outside PyTorch took all of total × gpu_memory_utilization, leaving no \
                 memory for a single KV cache block."
                .into(),
            StartFailure::KvBelowMaxModelLen {
                max_model_len,
                needed_gib,
                available_gib,
                kv_tokens,
                ..
            } => match (needed_gib, available_gib, kv_tokens) {
                (Some(n), Some(a), _) => format!(
                    "the KV cache left after the profile ({a:.2} GiB) holds less than one \
                     request of max_model_len {max_model_len} needs ({n:.2} GiB, {:.2} GiB \
                     short).",
                    n - a
                ),
                (_, _, Some(t)) => format!(
                    "the KV cache left after the profile holds {t} tokens, fewer than one \
                     request of max_model_len {max_model_len}."
                ),
                _ => format!(
                    "the KV cache left after the profile holds less than one request of \
                     max_model_len {max_model_len}."
                ),
            },
            StartFailure::OutOfMemoryAfterKv {
                phase,
                tried_gib,
                free_gib,
                ..
            } => format!(
                "the GPU ran out of memory in {} after the KV cache was allocated{}: the KV \
                 cache took the memory the warm-up needed, which the profile did not count.",
                phase.words(),
                short_words(*tried_gib, *free_gib)
            ),
            StartFailure::OutOfMemory {
                tried_gib,
                free_gib,
                unallocated_gib,
            } => format!(
                "the GPU ran out of memory while loading or profiling the model, before any KV \
                 cache{}{}.",
                short_words(*tried_gib, *free_gib),
                match unallocated_gib {
                    Some(u) if self.is_fragmentation() => format!(
                        ", though PyTorch held {u:.2} GiB reserved but unallocated: free blocks \
                         inside segments that other tensors keep, none of which could take the \
                         request (fragmentation)"
                    ),
                    _ => String::new(),
                }
            ),
            StartFailure::MaxModelLenOverPositions {
                max_model_len,
                derived,
                key,
            } => format!(
                "max_model_len {max_model_len} is more than the model's positions ({key} = \
                 {derived}), which vLLM refuses unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
            ),
            StartFailure::HeadsNotDivisible { heads, tp } => format!(
                "tensor_parallel_size {tp} does not divide the model's {heads} attention heads."
            ),
            StartFailure::NotDivisible {
                numerator,
                denominator,
            } => format!(
                "a parallel layer's {numerator} rows (vocabulary, MLP width or KV heads) do not \
                 divide over {denominator} GPUs."
            ),
            StartFailure::WorldOverGpus { world, gpus, .. } => {
                format!("tensor × pipeline parallel asks for {world} GPUs and the node has {gpus}.")
            }
            StartFailure::DataParallelOverGpus { range, visible } => format!(
                "data parallel asks for more GPUs than are visible: a rank's GPUs {range} are \
                 past the visible devices \"{visible}\" (each data-parallel rank needs TP × PP \
                 GPUs of its own)."
            ),
            StartFailure::UnknownArchitecture { architectures } => format!(
                "this vLLM release has no model class for the architecture {architectures} \
                 (the model is newer than the release, or needs a plugin)."
            ),
            StartFailure::UnknownQuantization { method } => {
                format!("this vLLM release does not know the quantization method '{method}'.")
            }
            StartFailure::Sparse24Removed => "the checkpoint is 2:4 sparse (a compressed-tensors \
                 sparsity_config), and this release removed CompressedTensors24, the scheme \
                 that ran it: it raises for every 2:4 layer."
                .into(),
            StartFailure::ModelNotFound { model, network } => {
                if *network {
                    format!(
                        "there was no network to the Hugging Face hub, and '{model}' is neither \
                         a local folder nor in the local cache."
                    )
                } else {
                    format!(
                        "'{model}' is neither a local folder with a config.json nor a model id \
                         the hub has (or it is gated and no token was given)."
                    )
                }
            }
        }
    }

    /// The file and line of the release that raises it (its source read for each).
    pub fn source(&self, release: &Release) -> String {
        let v1 = matches!(release.engine, Engine::V1 { .. });
        let free_memory_at = match release.name {
            "0.10" => "vLLM 0.10.0 v1/worker/gpu_worker.py L166-177",
            "0.11" => "vLLM 0.11.0 v1/worker/gpu_worker.py L185-195 (0.10.2: L178-188)",
            _ if release_at_least(release, 19) => "vLLM 0.19.0 v1/worker/utils.py L412-420",
            _ if v1 => "vLLM 0.19.0 v1/worker/utils.py L412-420, the nearest release read",
            _ => "",
        };
        let (v1_at, v0_at) = match self {
            StartFailure::FreeMemoryBelowUtil { .. } => (free_memory_at, ""),
            StartFailure::NoCacheBlocks => (
                "vLLM 0.19.0 v1/core/kv_cache_utils.py L625-631",
                "vLLM 0.6.4 worker/worker.py L492-495",
            ),
            StartFailure::KvBelowMaxModelLen { .. } => (
                "vLLM 0.19.0 v1/core/kv_cache_utils.py L633-653",
                "vLLM 0.6.4 worker/worker.py L496-503",
            ),
            StartFailure::OutOfMemoryAfterKv {
                phase: WarmUp::Sampler,
                ..
            } => (super::warmup::source(release.name), ""),
            StartFailure::OutOfMemoryAfterKv {
                phase: WarmUp::CudaGraphs,
                ..
            } => (
                "vLLM 0.19.0 v1/worker/gpu_worker.py L588 (capture_model, gpu_model_runner.py L5963)",
                "vLLM 0.6.4 worker/model_runner.py capture_model (after the KV cache)",
            ),
            StartFailure::OutOfMemoryAfterKv { .. } | StartFailure::OutOfMemory { .. } => (
                "PyTorch's caching allocator (torch.OutOfMemoryError)",
                "PyTorch's caching allocator (torch.OutOfMemoryError)",
            ),
            StartFailure::MaxModelLenOverPositions { .. } => (
                "vLLM 0.19.0 config/model.py L2153-2181",
                "vLLM 0.6.4 config.py L1979-1993",
            ),
            StartFailure::HeadsNotDivisible { .. } => (
                "vLLM 0.19.0 config/model.py L1111-1116",
                "vLLM 0.6.4 config.py L529-533",
            ),
            StartFailure::NotDivisible { .. } => (
                "vLLM 0.19.0 distributed/utils.py L53-57 (ensure_divisibility)",
                "vLLM 0.6.4 distributed/utils.py ensure_divisibility",
            ),
            StartFailure::WorldOverGpus { .. } => (
                "vLLM 0.19.0 config/parallel.py L714-724",
                "vLLM 0.6.4 executor/multiproc_gpu_executor.py L135-143",
            ),
            StartFailure::DataParallelOverGpus { .. } => {
                ("vLLM 0.19.0 v1/engine/utils.py L220-250 (get_device_indices)", "")
            }
            StartFailure::UnknownArchitecture { .. } => (
                "vLLM 0.19.0 model_executor/models/registry.py L968-971",
                "vLLM 0.6.4 model_executor/models/registry.py L352-354",
            ),
            StartFailure::UnknownQuantization { .. } => (
                "vLLM 0.19.0 config/model.py L996-1001",
                "vLLM 0.6.4 config.py L413-416",
            ),
            StartFailure::Sparse24Removed => (
                "vLLM 0.19.0 model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_24.py L27 (CompressedTensors24.__init__, from get_scheme, compressed_tensors.py L724-741); releases after 0.19 not checked here",
                "",
            ),
            StartFailure::ModelNotFound { .. } => (
                "vLLM 0.19.0 transformers_utils/config.py L675-689",
                "vLLM 0.6.4 transformers_utils/config.py L160-176 (file_exists on the hub)",
            ),
        };
        let at = if v1 { v1_at } else { v0_at };
        if at.is_empty() {
            format!("no such check in vLLM {}", release.name)
        } else {
            at.to_string()
        }
    }

    /// vLLM's own message for this failure, as `release` raises it (the exception's type and
    /// text; numbers formatted as Python formats them). `None` where the release has no such
    /// message (V0 has no free-memory check at start, nor V1's sampler message).
    pub fn vllm_text(&self, release: &Release) -> Option<String> {
        let v1 = matches!(release.engine, Engine::V1 { .. });
        Some(match self {
            StartFailure::FreeMemoryBelowUtil {
                free_gib,
                total_gib,
                util,
                requested_gib,
            } if v1 => {
                // 0.19.0 names the device (v1/worker/utils.py L414); 0.10.0 and 0.11.0 did not.
                let device = if release_at_least(release, 15) {
                    "cuda:0 "
                } else {
                    ""
                };
                format!(
                    "ValueError: Free memory on device {device}({}/{} GiB) on startup is less than \
                     desired GPU memory utilization ({util}, {} GiB). Decrease GPU memory \
                     utilization or reduce GPU memory used by other processes.",
                    py_round2(*free_gib),
                    py_round2(*total_gib),
                    py_round2(*requested_gib)
                )
            }
            StartFailure::FreeMemoryBelowUtil { .. } => return None,
            StartFailure::NoCacheBlocks if v1 => "ValueError: No available memory for the cache \
                 blocks. Try increasing `gpu_memory_utilization` when initializing the engine. \
                 See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more \
                 details."
                .into(),
            StartFailure::NoCacheBlocks => "ValueError: No available memory for the cache \
                 blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
                .into(),
            StartFailure::KvBelowMaxModelLen {
                max_model_len,
                needed_gib,
                available_gib,
                estimated_max_len,
                ..
            } if v1 => {
                let est = match estimated_max_len {
                    Some(n) if *n > 0 => format!(
                        "Based on the available memory, the estimated maximum model length is \
                         {n}. "
                    ),
                    _ => String::new(),
                };
                format!(
                    "ValueError: To serve at least one request with the models's max seq len \
                     ({max_model_len}), ({} GiB KV cache is needed, which is larger than the \
                     available KV cache memory ({} GiB). {est}Try increasing \
                     `gpu_memory_utilization` or decreasing `max_model_len` when initializing \
                     the engine. See \
                     https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more \
                     details.",
                    py_round2(needed_gib.unwrap_or(0.0)),
                    py_round2(available_gib.unwrap_or(0.0))
                )
            }
            StartFailure::KvBelowMaxModelLen {
                max_model_len,
                kv_tokens,
                ..
            } => format!(
                "ValueError: The model's max seq len ({max_model_len}) is larger than the maximum \
                 number of tokens that can be stored in KV cache ({}). Try increasing \
                 `gpu_memory_utilization` or decreasing `max_model_len` when initializing the \
                 engine.",
                kv_tokens.unwrap_or(0)
            ),
            StartFailure::OutOfMemoryAfterKv {
                phase: WarmUp::Sampler,
                num_reqs: Some(n),
                ..
            } if v1 => super::warmup::vllm_message(*n),
            StartFailure::OutOfMemoryAfterKv {
                tried_gib,
                free_gib,
                ..
            }
            | StartFailure::OutOfMemory {
                tried_gib,
                free_gib,
                ..
            } => match (tried_gib, free_gib) {
                (Some(t), Some(f)) => {
                    let unallocated = match self {
                        StartFailure::OutOfMemory {
                            unallocated_gib: Some(u),
                            ..
                        } => format!(
                            " … {} GiB is reserved by PyTorch but unallocated. If reserved but \
                             unallocated memory is large try setting \
                             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid \
                             fragmentation.",
                            py_round2(*u)
                        ),
                        _ => String::new(),
                    };
                    format!(
                        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {} GiB. \
                         GPU 0 has … of which {} GiB is free.{unallocated}",
                        py_round2(*t),
                        py_round2(*f)
                    )
                }
                _ => "torch.OutOfMemoryError: CUDA out of memory.".into(),
            },
            StartFailure::MaxModelLenOverPositions {
                max_model_len,
                derived,
                key,
            } => {
                let tail = if v1 {
                    " To allow overriding this maximum, set the env var \
                     VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used \
                     with extreme caution. …"
                } else {
                    " This may lead to incorrect model outputs or CUDA errors. To allow \
                     overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
                };
                format!(
                    "ValueError: User-specified max_model_len ({max_model_len}) is greater than \
                     the derived max_model_len ({key}={derived} or model_max_length=None in \
                     model's config.json).{tail}"
                )
            }
            StartFailure::HeadsNotDivisible { heads, tp } => format!(
                "ValueError: Total number of attention heads ({heads}) must be divisible by \
                 tensor parallel size ({tp})."
            ),
            StartFailure::NotDivisible {
                numerator,
                denominator,
            } => format!("AssertionError: {numerator} is not divisible by {denominator}"),
            StartFailure::WorldOverGpus { world, gpus, .. } if v1 => format!(
                "ValueError: World size ({world}) is larger than the number of available GPUs \
                 ({gpus}) in this node. If this is intentional and you are using: - ray, set \
                 '--distributed-executor-backend ray'. - multiprocessing, set '--nnodes' \
                 appropriately."
            ),
            // The TP-only message first (multiproc_gpu_executor.py L137-139), then the world's.
            StartFailure::WorldOverGpus { tp, gpus, .. } if tp > gpus && !v1 => format!(
                "AssertionError: please set tensor_parallel_size ({tp}) to less than max local \
                 gpu count ({gpus})"
            ),
            StartFailure::WorldOverGpus { world, gpus, .. } => format!(
                "AssertionError: please ensure that world_size ({world}) is less than than max \
                 local gpu count ({gpus})"
            ),
            StartFailure::DataParallelOverGpus { range, visible } if v1 => format!(
                "Exception: Error setting CUDA_VISIBLE_DEVICES: local range: {range} base \
                 value: \"{visible}\""
            ),
            StartFailure::DataParallelOverGpus { .. } => return None,
            StartFailure::UnknownArchitecture { architectures } => format!(
                "ValueError: Model architectures {architectures} are not supported for now. \
                 Supported architectures: …"
            ),
            StartFailure::UnknownQuantization { method } => {
                format!("ValueError: Unknown quantization method: {method}. Must be one of […].")
            }
            StartFailure::Sparse24Removed if v1 => {
                "NotImplementedError: Sparse24 models are no longer supported by vLLM".into()
            }
            StartFailure::Sparse24Removed => return None,
            StartFailure::ModelNotFound { model, .. } if v1 => format!(
                "ValueError: Invalid repository ID or local directory specified: '{model}'."
            ),
            StartFailure::ModelNotFound { .. } => {
                "requests.exceptions.ConnectionError: … Max retries exceeded with url: \
                 /api/models/… (huggingface_hub.file_exists)"
                    .into()
            }
        })
    }

    /// The shortfall in GiB where vLLM's message gives one (what was asked less what was
    /// there).
    pub fn shortfall_gib(&self) -> Option<f64> {
        match self {
            StartFailure::FreeMemoryBelowUtil {
                free_gib,
                requested_gib,
                ..
            } => Some(requested_gib - free_gib),
            StartFailure::KvBelowMaxModelLen {
                needed_gib: Some(n),
                available_gib: Some(a),
                ..
            } => Some(n - a),
            StartFailure::OutOfMemoryAfterKv {
                tried_gib: Some(t),
                free_gib: Some(f),
                ..
            }
            | StartFailure::OutOfMemory {
                tried_gib: Some(t),
                free_gib: Some(f),
                ..
            } => Some(t - f),
            _ => None,
        }
    }
}

/// ", X GiB short (asked for T GiB with F GiB free)".
fn short_words(tried: Option<f64>, free: Option<f64>) -> String {
    match (tried, free) {
        (Some(t), Some(f)) => format!(
            " ({:.2} GiB short: it asked for {t:.2} GiB with {f:.2} GiB free)",
            t - f
        ),
        _ => String::new(),
    }
}

/// Python's `str(round(x, 2))`: "78.68", "78.7", "80.0".
pub fn py_round2(x: f64) -> String {
    let s = format!("{:.2}", (x * 100.0).round() / 100.0);
    let t = s.trim_end_matches('0');
    if t.ends_with('.') {
        format!("{t}0")
    } else {
        t.to_string()
    }
}

/// A release at or after 0.N (V1 minor numbers).
fn release_at_least(r: &Release, minor: u32) -> bool {
    r.minor().is_some_and(|m| m >= minor)
}

/// Memory PyTorch holds reserved but unallocated from which a failure is called
/// fragmentation: at least this, and at least the request.
const FRAGMENTED_BYTES: u64 = 1 << 30;

/// A size and its unit as torch prints them ("1.98 GiB", "512.00 MiB"), in GiB.
fn size_with_unit(s: &str) -> Option<f64> {
    let v = log_numbers::size(s).ok()??;
    let rest = s.trim_start()[v.text.len()..].trim_start();
    let unit = rest.split(|c: char| !c.is_ascii_alphabetic()).next()?;
    let scale = match unit {
        "GiB" | "GB" => 1.0,
        "MiB" | "MB" => 1.0 / 1024.0,
        "KiB" | "KB" => 1.0 / (1024.0 * 1024.0),
        "TiB" => 1024.0,
        "B" | "bytes" => 1.0 / GIB,
        _ => return None,
    };
    Some(v.value * scale)
}

fn after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.find(key).map(|i| &line[i + key.len()..])
}

fn count_after(line: &str, key: &str) -> Option<u64> {
    log_numbers::count(after(line, key)?).ok()?
}

/// The text between the first `open` after `key` and the next `close`.
fn between<'a>(line: &'a str, key: &str, close: &str) -> Option<&'a str> {
    let rest = after(line, key)?;
    Some(&rest[..rest.find(close)?])
}

/// The failure a log line states, if it states one (vLLM's exception messages, and the
/// warm-up a traceback frame names). `oom_after_kv` says the log already printed its KV
/// cache, so an out-of-memory error is a warm-up's.
pub fn read_failure(line: &str, after_kv: bool) -> Option<StartFailure> {
    if let Some(rest) = after(
        line,
        "on startup is less than desired GPU memory utilization (",
    ) {
        // "(F/T GiB) on startup is less than desired GPU memory utilization (u, R GiB)".
        let (f, t) = between(line, "Free memory on device", " GiB)")
            .and_then(|s| s.rsplit_once('('))
            .and_then(|(_, s)| s.split_once('/'))?;
        let (u, r) = rest.split_once(", ")?;
        return Some(StartFailure::FreeMemoryBelowUtil {
            free_gib: f.trim().parse().ok()?,
            total_gib: t.trim().parse().ok()?,
            util: u.trim().parse().ok()?,
            requested_gib: log_numbers::size(r).ok()??.value,
        });
    }
    if line.contains("No available memory for the cache blocks") {
        return Some(StartFailure::NoCacheBlocks);
    }
    if line.contains("To serve at least one request with the models's max seq len (") {
        let len = count_after(line, "max seq len (")?;
        let needed = after(line, "), (").and_then(|s| log_numbers::size(s).ok()?);
        let avail =
            after(line, "available KV cache memory (").and_then(|s| log_numbers::size(s).ok()?);
        return Some(StartFailure::KvBelowMaxModelLen {
            max_model_len: len,
            needed_gib: needed.map(|v| v.value),
            available_gib: avail.map(|v| v.value),
            kv_tokens: None,
            estimated_max_len: count_after(line, "the estimated maximum model length is "),
        });
    }
    if line.contains("is larger than the maximum number of tokens that can be stored in KV cache") {
        return Some(StartFailure::KvBelowMaxModelLen {
            max_model_len: count_after(line, "max seq len (")?,
            needed_gib: None,
            available_gib: None,
            kv_tokens: count_after(line, "stored in KV cache ("),
            estimated_max_len: None,
        });
    }
    if line.contains("CUDA out of memory occurred when warming up sampler with ") {
        return Some(StartFailure::OutOfMemoryAfterKv {
            phase: WarmUp::Sampler,
            tried_gib: None,
            free_gib: None,
            num_reqs: count_after(line, "warming up sampler with "),
        });
    }
    if line.contains("OutOfMemoryError") && line.contains("CUDA out of memory") {
        let tried = after(line, "Tried to allocate ").and_then(size_with_unit);
        let free = after(line, " of which ").and_then(size_with_unit);
        return Some(if after_kv {
            StartFailure::OutOfMemoryAfterKv {
                phase: WarmUp::Unplaced,
                tried_gib: tried,
                free_gib: free,
                num_reqs: None,
            }
        } else {
            StartFailure::OutOfMemory {
                tried_gib: tried,
                free_gib: free,
                unallocated_gib: line
                    .find(" is reserved by PyTorch but unallocated")
                    .and_then(|i| line[..i].rsplit("and ").next())
                    .and_then(size_with_unit),
            }
        });
    }
    if let Some(rest) = after(line, "User-specified max_model_len (") {
        let (key, derived) =
            between(line, "the derived max_model_len (", " or ").and_then(|s| s.split_once('='))?;
        return Some(StartFailure::MaxModelLenOverPositions {
            max_model_len: log_numbers::count(rest).ok()??,
            derived: derived.trim().parse().ok()?,
            key: key.trim().to_string(),
        });
    }
    if line.contains("must be divisible by tensor parallel size") {
        return Some(StartFailure::HeadsNotDivisible {
            heads: count_after(line, "Total number of attention heads (")?,
            tp: count_after(line, "tensor parallel size (")? as u32,
        });
    }
    if let Some(i) = line.find(" is not divisible by ") {
        let num = line[..i]
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()?;
        return Some(StartFailure::NotDivisible {
            numerator: num,
            denominator: count_after(line, " is not divisible by ")?,
        });
    }
    if line.contains("is larger than the number of available GPUs") {
        return Some(StartFailure::WorldOverGpus {
            world: count_after(line, "World size (")? as u32,
            tp: 0,
            gpus: count_after(line, "available GPUs (")? as u32,
        });
    }
    if line.contains("please ensure that world_size (") {
        return Some(StartFailure::WorldOverGpus {
            world: count_after(line, "world_size (")? as u32,
            tp: 0,
            gpus: count_after(line, "max local gpu count (")? as u32,
        });
    }
    if line.contains("please set tensor_parallel_size (") {
        let tp = count_after(line, "tensor_parallel_size (")? as u32;
        return Some(StartFailure::WorldOverGpus {
            world: tp,
            tp,
            gpus: count_after(line, "max local gpu count (")? as u32,
        });
    }
    if let Some(rest) = after(line, "Error setting CUDA_VISIBLE_DEVICES: local range: ") {
        let (range, visible) = rest.split_once(" base value: ")?;
        return Some(StartFailure::DataParallelOverGpus {
            range: range.trim().to_string(),
            visible: visible.trim().trim_matches('"').to_string(),
        });
    }
    if let Some(a) = between(line, "Model architectures ", " are not supported for now") {
        return Some(StartFailure::UnknownArchitecture {
            architectures: a.to_string(),
        });
    }
    if line.contains("Sparse24 models are no longer supported by vLLM") {
        return Some(StartFailure::Sparse24Removed);
    }
    if let Some(m) = between(line, "Unknown quantization method: ", ". Must be one of") {
        return Some(StartFailure::UnknownQuantization {
            method: m.to_string(),
        });
    }
    if let Some(m) = between(
        line,
        "Invalid repository ID or local directory specified: '",
        "'",
    ) {
        return Some(StartFailure::ModelNotFound {
            model: m.to_string(),
            network: false,
        });
    }
    None
}

/// A line that shows the hub could not be reached (requests', urllib3's and
/// huggingface_hub's words for it).
pub fn is_network_error(line: &str) -> bool {
    (line.contains("huggingface.co")
        && (line.contains("Max retries exceeded")
            || line.contains("Network is unreachable")
            || line.contains("Temporary failure in name resolution")
            || line.contains("Failed to resolve")
            || line.contains("ConnectionError")))
        || line.contains("LocalEntryNotFoundError")
        || line.contains("OfflineModeIsEnabled")
}

/// The warm-up a traceback frame names ("in _dummy_sampler_run", "in capture_model").
pub fn warm_up_of(line: &str) -> Option<WarmUp> {
    if line.contains("_dummy_sampler_run") {
        Some(WarmUp::Sampler)
    } else if line.contains("capture_model") || line.contains("_capture_cudagraphs") {
        Some(WarmUp::CudaGraphs)
    } else {
        None
    }
}

/// What was found, said as a release says it: the failure, vLLM's text and its source, the
/// cause in one sentence, the shortfall, and what would start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub failure: StartFailure,
    /// The release whose words these are ("0.19").
    pub release: String,
    /// vLLM's message as that release raises it (`None`: the release has no such check).
    pub vllm_text: Option<String>,
    /// The file and line that raise it.
    pub source: String,
    /// The cause, in one sentence.
    pub cause: String,
    /// How much memory was missing (GiB), where memory is the cause.
    pub shortfall_gib: Option<f64>,
    /// vramscope's reproduction, where memory is the cause and the model is one it has.
    pub reproduced: Option<String>,
    /// Settings that would start, each with the answer of vramscope's run of it.
    pub would_start: Vec<String>,
    /// Where the failure is fragmentation (memory PyTorch holds reserved but cannot hand
    /// out), which changes with the release's loader and PyTorch: the other V1 releases
    /// vramscope reproduces under which the same command starts, each with its KV.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_releases: Vec<String>,
    /// The log line the failure is on (explain).
    pub line: Option<u64>,
}

impl Diagnosis {
    pub fn new(failure: StartFailure, release: &Release) -> Self {
        Diagnosis {
            vllm_text: failure.vllm_text(release),
            source: failure.source(release),
            cause: failure.cause(),
            shortfall_gib: failure.shortfall_gib(),
            release: release.name.to_string(),
            failure,
            reproduced: None,
            would_start: Vec::new(),
            other_releases: Vec::new(),
            line: None,
        }
    }

    /// The diagnosis as printed: the cause, vLLM's words, the reproduction, what would start.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "vLLM {} would not start{}: {}",
            self.release,
            self.line.map_or(String::new(), |n| format!(" (line {n})")),
            self.cause
        )];
        if let Some(t) = &self.vllm_text {
            out.push(format!(
                "  vLLM {} says: \"{t}\" ({})",
                self.release, self.source
            ));
        } else {
            out.push(format!("  ({})", self.source));
        }
        if let Some(s) = self.shortfall_gib {
            out.push(format!("  short by {s:.2} GiB"));
        }
        if let Some(r) = &self.reproduced {
            out.push(format!("  vramscope: {r}"));
        }
        if !self.would_start.is_empty() {
            out.push("  what would start:".into());
            for w in &self.would_start {
                out.push(format!("    {w}"));
            }
        }
        if !self.other_releases.is_empty() {
            out.push("  the same command starts under:".into());
            for w in &self.other_releases {
                out.push(format!("    {w}"));
            }
        }
        out
    }
}

/// The checks vLLM makes on the configuration before it loads anything, in its order
/// (`ModelConfig` then `verify_with_parallel_config`, then the executor's GPU count): the
/// first that fails. `gpus`: the GPUs of the node, where known.
pub fn before_start(
    cfg: &crate::model::config::ModelConfig,
    req: &super::ProfileRequest,
    gpus: Option<u32>,
) -> Option<StartFailure> {
    // vLLM's derived length: the positions times a rope scaling's factor.
    let positions = cfg.derived_max_model_len();
    let allow_long = std::env::var("VLLM_ALLOW_LONG_MAX_MODEL_LEN").is_ok_and(|v| v == "1");
    if req.max_model_len > positions && positions > 0 && !allow_long {
        return Some(StartFailure::MaxModelLenOverPositions {
            max_model_len: req.max_model_len,
            derived: positions,
            key: "max_position_embeddings".into(),
        });
    }
    let tp = req.tp.max(1);
    if !(cfg.num_heads as u64).is_multiple_of(tp as u64) {
        return Some(StartFailure::HeadsNotDivisible {
            heads: cfg.num_heads as u64,
            tp,
        });
    }
    if let Some(g) = gpus {
        let world = tp * req.pp.max(1);
        if world > g {
            return Some(StartFailure::WorldOverGpus { world, tp, gpus: g });
        }
    }
    None
}

/// V1's free-memory check at start (`request_memory`): another process's memory
/// (`--outside-before`) leaving less free than ceil(total × util).
pub fn free_memory_at_start(
    total_bytes: u64,
    others_bytes: u64,
    util: f64,
) -> Option<StartFailure> {
    let requested = (total_bytes as f64 * util).ceil();
    let free = total_bytes.saturating_sub(others_bytes) as f64;
    (free < requested).then(|| StartFailure::FreeMemoryBelowUtil {
        free_gib: free / GIB,
        total_gib: total_bytes as f64 / GIB,
        util,
        requested_gib: requested / GIB,
    })
}

/// A run's answer as the release would give it: the KV cache (GiB, and tokens on V1 or blocks
/// on V0), and the failure it would stop at, if any.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub kv_gib: f64,
    pub count: u64,
    pub unit: String,
    pub failure: Option<StartFailure>,
}

impl Outcome {
    pub fn starts(&self) -> bool {
        self.failure.is_none()
    }

    /// "KV 12.34 GiB, 101,056 tokens".
    pub fn kv_words(&self) -> String {
        format!(
            "KV {:.2} GiB, {} {}",
            self.kv_gib,
            crate::base::units::thousands(self.count),
            self.unit
        )
    }
}

/// What vramscope's run of a request shows vLLM would do, in vLLM's order after the profile:
/// the KV checks (`_check_enough_kv_cache_memory`, V0's `raise_if_cache_size_invalid`), the
/// KV cache's own allocation (`--kv-cache-memory` past what is free), then the warm-ups after
/// it (the CUDA graph capture).
pub fn after_profile(r: &super::Report) -> Option<StartFailure> {
    let a = r.vllm_answer()?;
    let v1 = matches!(a.release.engine, Engine::V1 { .. });
    let g = &r.kv_geometry;
    if r.settings.kv_cache_memory.is_some() && a.kv_bytes > r.checkpoints.t3.free as i64 {
        return Some(StartFailure::OutOfMemory {
            tried_gib: Some(a.kv_bytes as f64 / GIB),
            free_gib: Some(r.checkpoints.t3.free as f64 / GIB),
            unallocated_gib: None,
        });
    }
    let blocks = r.vllm_engine_blocks().unwrap_or(a.kv_blocks);
    if blocks == 0 && r.settings.kv_cache_memory.is_none() {
        return Some(StartFailure::NoCacheBlocks);
    }
    if v1 {
        let (needed, longest) = g.v1_one_request(a.kv_bytes);
        if longest.is_some() {
            return Some(StartFailure::KvBelowMaxModelLen {
                max_model_len: g.max_model_len,
                needed_gib: Some(needed as f64 / GIB),
                available_gib: Some(a.kv_bytes as f64 / GIB),
                kv_tokens: None,
                estimated_max_len: longest,
            });
        }
    } else if blocks * g.block_size < g.max_model_len {
        return Some(StartFailure::KvBelowMaxModelLen {
            max_model_len: g.max_model_len,
            needed_gib: None,
            available_gib: None,
            kv_tokens: Some(blocks * g.block_size),
            estimated_max_len: None,
        });
    }
    // The warm-ups after the KV cache, in the worker's order: the graph capture, then the
    // sampler's (0.19.0 v1/worker/gpu_worker.py L588, then L686).
    if r.graphs.as_ref().is_some_and(|gr| gr.failed.is_some()) {
        return Some(StartFailure::OutOfMemoryAfterKv {
            phase: WarmUp::CudaGraphs,
            tried_gib: None,
            free_gib: None,
            num_reqs: None,
        });
    }
    if let Some((w, f)) = failed_warm_up(r) {
        // What it takes beyond what it had, against what was free when it started.
        return Some(StartFailure::OutOfMemoryAfterKv {
            phase: if f.in_sampler {
                WarmUp::Sampler
            } else {
                WarmUp::Unplaced
            },
            tried_gib: Some(w.need_bytes as f64 / GIB),
            free_gib: Some(w.free_before_bytes as f64 / GIB),
            num_reqs: Some(w.num_reqs),
        });
    }
    None
}

/// The sampler warm-up that ran out of memory, on this rank or another (the last pipeline
/// stage runs it).
fn failed_warm_up(
    r: &super::Report,
) -> Option<(&super::warmup::SamplerWarmUp, &super::warmup::WarmUpOom)> {
    std::iter::once(r)
        .chain(r.ranks.iter())
        .filter_map(|x| x.warm_up.as_ref())
        .find_map(|w| w.failed.as_ref().map(|f| (w, f)))
}

/// The largest utilization, in hundredths, at which the sampler warm-up that was `short`
/// bytes short starts: the KV cache grows with T·u and the warm-up does not, so it is
/// `util − short/T` rounded down, checked by a run of it (and 0.01 lower while it does not
/// start, a few times: the KV cache is allocated in whole blocks).
pub fn warm_up_fit(
    req: &super::ProfileRequest,
    short_bytes: f64,
    total_bytes: f64,
) -> Option<(f64, Outcome)> {
    let mut util = ((req.util - short_bytes / total_bytes) * 100.0).floor() / 100.0;
    for _ in 0..5 {
        if util <= 0.0 {
            return None;
        }
        let r = super::ProfileRequest {
            util,
            ..req.clone()
        };
        if let Some(o) = try_run(&r).ok().filter(Outcome::starts) {
            return Some((util, o));
        }
        util = ((util - 0.01) * 100.0).round() / 100.0;
    }
    None
}

/// A run's outcome.
pub fn outcome(r: &super::Report) -> Option<Outcome> {
    let a = r.vllm_answer()?;
    let v1 = matches!(a.release.engine, Engine::V1 { .. });
    let (tokens, _) = r.kv_tokens_and_concurrency(&a);
    Some(Outcome {
        kv_gib: a.kv_bytes.max(0) as f64 / GIB,
        count: if v1 {
            tokens
        } else {
            r.vllm_engine_blocks().unwrap_or(a.kv_blocks)
        },
        unit: if v1 { "tokens" } else { "blocks" }.into(),
        failure: after_profile(r),
    })
}

/// Runs a request dry and says what vLLM would do with it (`Err`: vramscope cannot run it).
pub fn try_run(req: &super::ProfileRequest) -> crate::base::error::Result<Outcome> {
    let r = super::run(
        req,
        None,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )?;
    outcome(&r).ok_or_else(|| {
        crate::base::error::Error::Request("the run gave no answer for this release".into())
    })
}

/// The settings to try for a failure, each one change from `req`: the utilization that
/// would fit, the longest max_model_len that fits, fewer sequences, an 8-bit KV cache, twice
/// the GPUs, fp8 weights, and (V1, 0.11 on) `--kv-cache-memory`.
pub fn candidates(
    req: &super::ProfileRequest,
    failure: &StartFailure,
    shortfall_gib: Option<f64>,
    total_gib: f64,
) -> Vec<(String, super::ProfileRequest)> {
    use super::request::KvCacheDtype;
    let mut out: Vec<(String, super::ProfileRequest)> = Vec::new();
    let with = |label: String, f: &dyn Fn(&mut super::ProfileRequest)| {
        let mut r = req.clone();
        f(&mut r);
        (label, r)
    };
    let util2 = |u: f64| (u * 100.0).floor() / 100.0;
    match failure {
        StartFailure::FreeMemoryBelowUtil {
            free_gib,
            total_gib,
            ..
        } => {
            // The highest util the free memory allows, two decimals down.
            let u = util2(free_gib / total_gib);
            if u > 0.0 {
                out.push(with(format!("--gpu-memory-utilization {u:.2}"), &|r| {
                    r.util = u
                }));
            }
        }
        StartFailure::OutOfMemoryAfterKv {
            phase, num_reqs, ..
        } => {
            // The warm-up needs the shortfall (and the 0.01 the log's rounding hides) out of
            // the KV cache.
            if let Some(s) = shortfall_gib {
                let u = util2(req.util - (s + 0.01) / total_gib);
                if u > 0.0 {
                    out.push(with(format!("--gpu-memory-utilization {u:.2}"), &|r| {
                        r.util = u
                    }));
                }
            } else {
                for step in [0.02, 0.05] {
                    let u = util2(req.util - step);
                    out.push(with(format!("--gpu-memory-utilization {u:.2}"), &|r| {
                        r.util = u
                    }));
                }
            }
            if *phase == WarmUp::Sampler {
                let seqs = num_reqs.map_or(req.seqs, |n| n as usize).max(2) / 2;
                out.push(with(format!("--max-num-seqs {seqs}"), &|r| r.seqs = seqs));
            }
            if *phase == WarmUp::CudaGraphs && !req.enforce_eager {
                out.push(with("--enforce-eager".into(), &|r| r.enforce_eager = true));
            }
        }
        StartFailure::NoCacheBlocks | StartFailure::KvBelowMaxModelLen { .. } => {
            for u in [0.95, 0.98] {
                if u > req.util {
                    out.push(with(format!("--gpu-memory-utilization {u:.2}"), &|r| {
                        r.util = u
                    }));
                }
            }
            // V0: the tokens the blocks hold (its batch shrinks with max_model_len too);
            // no block at all: half the length.
            let v0_len = match failure {
                StartFailure::KvBelowMaxModelLen {
                    kv_tokens: Some(t), ..
                } => Some(*t),
                StartFailure::NoCacheBlocks if req.max_model_len >= 4096 => {
                    Some(req.max_model_len / 2)
                }
                _ => None,
            };
            if let Some(n) = v0_len.filter(|n| *n > 0) {
                out.push(with(format!("--max-model-len {n}"), &|r| {
                    r.max_model_len = n
                }));
            }
            if let StartFailure::KvBelowMaxModelLen {
                estimated_max_len: Some(n),
                ..
            } = failure
            {
                if *n > 0 {
                    out.push(with(format!("--max-model-len {n}"), &|r| {
                        r.max_model_len = *n
                    }));
                }
            }
            if req.seqs > 16 {
                let seqs = req.seqs / 4;
                out.push(with(format!("--max-num-seqs {seqs}"), &|r| r.seqs = seqs));
            }
        }
        StartFailure::OutOfMemory { .. } if req.seqs > 16 => {
            let seqs = req.seqs / 4;
            out.push(with(format!("--max-num-seqs {seqs}"), &|r| r.seqs = seqs));
        }
        _ => {}
    }
    if failure.is_memory() {
        if req.kv_cache_dtype == KvCacheDtype::Auto {
            out.push(with("--kv-cache-dtype fp8".into(), &|r| {
                r.kv_cache_dtype = KvCacheDtype::Fp8
            }));
        }
        if req.tp * 2 * req.pp <= super::request::MAX_TP && req.device.is_sim() {
            out.push(with(
                format!("--tensor-parallel-size {}", req.tp * 2),
                &|r| r.tp *= 2,
            ));
        }
        if matches!(
            req.quant,
            crate::quant::Quant::F16 | crate::quant::Quant::BF16
        ) {
            out.push(with("--quantization fp8".into(), &|r| {
                r.quant = crate::quant::Quant::Fp8
            }));
        }
    }
    out
}

/// The candidates that start, each with its KV, and the largest `--kv-cache-memory` (V1,
/// 0.11 on) that leaves the failing warm-up its memory. Candidates vramscope cannot run are
/// left out.
pub fn would_start(
    req: &super::ProfileRequest,
    failure: &StartFailure,
    shortfall_gib: Option<f64>,
    total_gib: f64,
    kv_gib: Option<f64>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (label, mut r) in candidates(req, failure, shortfall_gib, total_gib) {
        let Ok(mut o) = try_run(&r) else { continue };
        // A length from the log's estimate that vramscope's KV cache holds a little less of:
        // its own estimate instead.
        if let (
            Some(StartFailure::KvBelowMaxModelLen {
                estimated_max_len: Some(m),
                ..
            }),
            true,
        ) = (&o.failure, label.starts_with("--max-model-len"))
        {
            if *m > 0 && *m < r.max_model_len {
                r.max_model_len = *m;
                match try_run(&r) {
                    Ok(again) => o = again,
                    Err(_) => continue,
                }
            }
        }
        // A utilization that passes the check at start but leaves the warm-up after the KV
        // cache too little (another process holding memory, the sampler's 1024 dummy
        // requests): the next lower ones, as a user would step down.
        if label.starts_with("--gpu-memory-utilization")
            && matches!(o.failure, Some(StartFailure::OutOfMemoryAfterKv { .. }))
        {
            for step in [0.01, 0.02, 0.03, 0.05, 0.10] {
                let u = ((r.util - step) * 100.0).round() / 100.0;
                if u <= 0.0 {
                    break;
                }
                let lower = super::ProfileRequest {
                    util: u,
                    ..r.clone()
                };
                if let Ok(again) = try_run(&lower) {
                    if again.starts() {
                        (r, o) = (lower, again);
                        break;
                    }
                }
            }
        }
        if o.starts() {
            let label = if label.starts_with("--max-model-len") {
                format!("--max-model-len {}", r.max_model_len)
            } else if label.starts_with("--gpu-memory-utilization") {
                format!("--gpu-memory-utilization {:.2}", r.util)
            } else {
                label
            };
            out.push(format!("{label:<34} {}", o.kv_words()));
        }
    }
    // --kv-cache-memory skips the profile: the KV the failed start had less the shortfall.
    let kv_flag =
        super::vllm::release(&req.vllm).is_ok_and(|rel| matches!(rel.engine, Engine::V1 { .. }));
    if let (true, Some(kv), Some(s), StartFailure::OutOfMemoryAfterKv { .. }) =
        (kv_flag, kv_gib, shortfall_gib, failure)
    {
        let bytes = ((kv - s - 0.15).max(0.0) * GIB) as u64;
        if bytes > 0 {
            let mut r = req.clone();
            r.kv_cache_memory = Some(bytes);
            if let Ok(o) = try_run(&r) {
                if o.starts() {
                    out.push(format!(
                        "{:<34} {} (the failed start's KV less the {s:.2} GiB short and a 0.15 GiB margin)",
                        format!("--kv-cache-memory {bytes}"),
                        o.kv_words()
                    ));
                }
            }
        }
    }
    out
}

/// For an out-of-memory after the KV cache that vramscope's own run shows (the graph
/// capture): the highest utilization, 0.01 to 0.20 below the request's, at which the same run
/// starts, and by how much the failing one was short: at the lower utilization the warm-up
/// leaves `room` of the GPU, and the failing run's KV cache is larger by `ΔKV`, so it was
/// short by `ΔKV − room`.
pub fn oom_after_kv_search(
    req: &super::ProfileRequest,
    failing: &super::Report,
) -> Option<(f64, f64, Outcome)> {
    let kv_fail = failing.vllm_answer()?.kv_bytes as f64;
    for step in [0.01, 0.02, 0.05, 0.10, 0.20] {
        let util = ((req.util - step) * 100.0).round() / 100.0;
        if util <= 0.0 {
            break;
        }
        let r = super::ProfileRequest {
            util,
            ..req.clone()
        };
        let Ok(ok) = super::run(
            &r,
            None,
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        ) else {
            continue;
        };
        let Some(o) = outcome(&ok).filter(|o| o.starts()) else {
            continue;
        };
        let room = ok.graphs.as_ref().map_or(0, |g| g.room_left_bytes) as f64;
        let kv_ok = ok.vllm_answer()?.kv_bytes as f64;
        return Some((util, ((kv_fail - kv_ok) - room) / GIB, o));
    }
    None
}

/// `plan`'s diagnosis of a request before anything runs: vLLM's configuration checks in its
/// order, then V1's free-memory check at start. `gpus`: the GPUs of the node, where known.
pub fn before_run(
    req: &super::ProfileRequest,
    gpus: Option<u32>,
) -> crate::base::error::Result<Option<Diagnosis>> {
    let release = req.release()?;
    let Ok(opened) = crate::model::open(&req.model, req.seed) else {
        // The run names what is wrong with the model.
        return Ok(None);
    };
    if let Some(f) = before_start(&opened.config, req, gpus) {
        let mut d = Diagnosis::new(f.clone(), release);
        d.would_start = config_fixes(&f);
        return Ok(Some(d));
    }
    if opened.source.sparse24().is_some()
        && crate::quant::sparse24::release_refusal(release.name).is_some()
    {
        let mut d = Diagnosis::new(StartFailure::Sparse24Removed, release);
        d.would_start = vec![
            "--vllm 0.15 (or 0.11) on an H100 or H200: CompressedTensors24 runs it there".into(),
        ];
        return Ok(Some(d));
    }
    if matches!(release.engine, Engine::V1 { .. }) {
        let total = match &req.device {
            crate::device::DeviceSpec::Sim { preset, .. } => req
                .device
                .total_override()
                .or_else(|| crate::device::presets::find(preset).map(|p| p.mem_get_info_bytes)),
            _ => None,
        };
        if let Some(total) = total {
            if let Some(f) = free_memory_at_start(total, req.outside_before, req.util) {
                let mut d = Diagnosis::new(f.clone(), release);
                d.reproduced = Some(format!(
                    "--outside-before {:.2} GiB leaves {:.2} GiB of the {:.2} GiB free at start",
                    req.outside_before as f64 / GIB,
                    total.saturating_sub(req.outside_before) as f64 / GIB,
                    total as f64 / GIB
                ));
                d.would_start = would_start(req, &f, d.shortfall_gib, total as f64 / GIB, None);
                return Ok(Some(d));
            }
        }
    }
    Ok(None)
}

/// The other V1 releases (oldest first) under which `req` starts, each with its KV: asked
/// where a failure is fragmentation, whose amount follows the release's loader and PyTorch.
/// Releases that refuse the model are left out.
pub fn other_releases(req: &super::ProfileRequest) -> Vec<String> {
    let mut v1: Vec<_> = super::vllm::RELEASES
        .iter()
        .filter(|r| matches!(r.engine, Engine::V1 { .. }) && r.name != req.vllm)
        .filter_map(|r| r.minor().map(|m| (m, r.name)))
        .collect();
    v1.sort();
    v1.into_iter()
        .filter_map(|(_, name)| {
            let r = super::ProfileRequest {
                vllm: name.to_string(),
                ..req.clone()
            };
            let o = try_run(&r).ok().filter(Outcome::starts)?;
            Some(format!("{:<34} {}", format!("--vllm {name}"), o.kv_words()))
        })
        .collect()
}

/// `plan`'s diagnosis of a run that ran out of memory before any KV cache (loading the
/// weights or in the profile run): vLLM raises `torch.OutOfMemoryError` at the same request,
/// since vramscope's allocator is PyTorch's. The reproduction names the allocation and the
/// allocator's state; what would start is run as for any memory failure. `None` for an
/// error without the allocator's state (memory outside the framework).
pub fn of_oom(req: &super::ProfileRequest, e: &crate::Error) -> Option<Diagnosis> {
    let crate::Error::OutOfMemory {
        device,
        during,
        state: Some(s),
        ..
    } = e
    else {
        return None;
    };
    let release = req.release().ok()?;
    let unallocated = s.reserved.saturating_sub(s.allocated);
    let f = StartFailure::OutOfMemory {
        tried_gib: Some(s.requested as f64 / GIB),
        free_gib: Some(s.free as f64 / GIB),
        unallocated_gib: Some(unallocated as f64 / GIB),
    };
    let mut d = Diagnosis::new(f.clone(), release);
    d.reproduced = Some(format!(
        "the run on {device} stops while {during}: {:.2} GiB asked for, {:.2} GiB of the \
         {:.2} GiB free; PyTorch holds {:.2} GiB, {:.2} GiB of it allocated",
        s.requested as f64 / GIB,
        s.free as f64 / GIB,
        s.total as f64 / GIB,
        s.reserved as f64 / GIB,
        s.allocated as f64 / GIB,
    ));
    // The candidates change the settings that ran: vLLM's defaults filled in.
    let ran = crate::model::open(&req.model, req.seed).map_or_else(
        |_| req.clone(),
        |o| req.resolved(o.config.derived_max_model_len() as usize),
    );
    d.would_start = would_start(&ran, &f, d.shortfall_gib, s.total as f64 / GIB, None);
    if f.is_fragmentation() {
        d.other_releases = other_releases(req);
    }
    Some(d)
}

/// `plan`'s diagnosis of vramscope's run: the failure vLLM would stop at after the profile,
/// its shortfall, and what would start.
pub fn of_run(req: &super::ProfileRequest, r: &super::Report) -> Option<Diagnosis> {
    let release = super::vllm::release(&r.settings.vllm).ok()?;
    let f = after_profile(r)?;
    let total_gib = r.checkpoints.t0.total as f64 / GIB;
    let mut d = Diagnosis::new(f.clone(), release);
    let o = outcome(r)?;
    let (non_kv, what) = r.vllm_answer().map_or(
        (0.0, "weights, activation peak and non-torch memory"),
        |a| {
            let (b, what) = r.release_non_kv(&a);
            (b / GIB, what)
        },
    );
    match &f {
        StartFailure::NoCacheBlocks => {
            let short = non_kv - total_gib * r.settings.util;
            d.shortfall_gib = Some(short);
            d.reproduced = Some(format!(
                "{what} take {non_kv:.2} GiB of T·u = {:.2} GiB",
                total_gib * r.settings.util
            ));
        }
        StartFailure::OutOfMemoryAfterKv { .. } if failed_warm_up(r).is_some() => {
            let (w, f) = failed_warm_up(r)?;
            let short = -w.room_left_bytes;
            let fit = warm_up_fit(req, short as f64, r.checkpoints.t0.total as f64);
            let fmt = crate::base::units::fmt_u;
            d.reproduced = Some(format!(
                "the sampler warm-up ({} dummy requests, [{}, {}] logits) would run out of \
                 memory after the KV cache is allocated ({}): {} short, needing {}{} with {} \
                 free{}{}",
                w.num_reqs,
                w.num_reqs,
                w.vocab,
                o.kv_words(),
                crate::base::units::fmt_i(short),
                if w.need_at_least { "at least " } else { "" },
                fmt(w.need_bytes),
                fmt(w.free_before_bytes),
                if f.in_sampler {
                    ""
                } else {
                    " (in the dummy forward before the sampler: torch's own error)"
                },
                match &fit {
                    Some((u, _)) => format!("; --gpu-memory-utilization {u:.2} leaves it room"),
                    None => "; no utilization down to 0.05 below leaves it room".into(),
                }
            ));
            if let Some((util, ok)) = fit {
                d.would_start.push(format!(
                    "{:<34} {}",
                    format!("--gpu-memory-utilization {util:.2}"),
                    ok.kv_words()
                ));
            }
        }
        StartFailure::OutOfMemoryAfterKv { .. } => {
            d.reproduced = Some(format!(
                "the KV cache takes {} and the CUDA graph capture then runs out of memory",
                o.kv_words()
            ));
            if let Some((util, short, ok)) = oom_after_kv_search(req, r) {
                d.shortfall_gib = Some(short);
                d.would_start.push(format!(
                    "{:<34} {}",
                    format!("--gpu-memory-utilization {util:.2}"),
                    ok.kv_words()
                ));
            }
        }
        _ => {}
    }
    // Memory PyTorch keeps reserved but cannot hand out: vLLM's budget counts no tensor in it
    // (neither the weights nor the peak nor the memory outside PyTorch), so it is given to the
    // KV cache, which cannot use it either.
    let t3 = &r.checkpoints.t3;
    let stranded = t3.reserved.saturating_sub(t3.allocated);
    if f.is_memory() && stranded >= FRAGMENTED_BYTES {
        let words = format!(
            "after the profile PyTorch still holds {:.2} GiB reserved but unallocated (free \
             blocks inside segments that live tensors keep), which vLLM's budget counts as free",
            stranded as f64 / GIB
        );
        d.reproduced = Some(match d.reproduced.take() {
            Some(r) => format!("{r}; {words}"),
            None => words,
        });
        d.other_releases = other_releases(req);
    }
    for w in would_start(req, &f, d.shortfall_gib, total_gib, Some(o.kv_gib)) {
        if !d.would_start.iter().any(|x| {
            x.split_whitespace().next() == w.split_whitespace().next()
                && x.split_whitespace().nth(1) == w.split_whitespace().nth(1)
        }) {
            d.would_start.push(w);
        }
    }
    // One utilization: the highest that starts (the search's coarse steps and the shortfall's
    // arithmetic can each find one).
    let util_of = |w: &String| -> Option<f64> {
        w.strip_prefix("--gpu-memory-utilization ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    if let Some(best) = d.would_start.iter().filter_map(util_of).reduce(f64::max) {
        d.would_start
            .retain(|w| util_of(w).is_none_or(|u| u == best));
    }
    Some(d)
}

/// What would start for a configuration vLLM refuses.
pub fn config_fixes(f: &StartFailure) -> Vec<String> {
    match f {
        StartFailure::MaxModelLenOverPositions { derived, .. } => {
            vec![format!(
                "--max-model-len {derived} (the model's positions) or less"
            )]
        }
        StartFailure::HeadsNotDivisible { heads, tp } => {
            let ok: Vec<String> = (1..=*tp * 2)
                .filter(|t| heads % (*t as u64) == 0)
                .map(|t| t.to_string())
                .collect();
            vec![format!(
                "--tensor-parallel-size {} (those up to {} that divide the {heads} heads)",
                ok.join(" or "),
                tp * 2
            )]
        }
        StartFailure::WorldOverGpus { gpus, .. } => vec![format!(
            "--tensor-parallel-size × --pipeline-parallel-size of at most {gpus}"
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_rounding_drops_trailing_zeros_as_str_round_does() {
        assert_eq!(py_round2(78.684), "78.68");
        assert_eq!(py_round2(78.70), "78.7");
        assert_eq!(py_round2(80.0), "80.0");
    }

    #[test]
    fn each_message_reads_back_with_its_numbers() {
        let l = "(EngineCore_DP0 pid=1) ValueError: Free memory on device cuda:0 (60.12/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.";
        let f = read_failure(l, false).unwrap();
        assert_eq!(
            f,
            StartFailure::FreeMemoryBelowUtil {
                free_gib: 60.12,
                total_gib: 79.19,
                util: 0.9,
                requested_gib: 71.27
            }
        );
        assert!((f.shortfall_gib().unwrap() - 11.15).abs() < 1e-9);
        let r = super::super::vllm::release("0.19").unwrap();
        // vLLM's own text, rebuilt from the numbers, is the line's.
        assert!(
            l.ends_with(&f.vllm_text(r).unwrap()),
            "{}",
            f.vllm_text(r).unwrap()
        );
        let oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.07 GiB is free.";
        assert_eq!(
            read_failure(oom, true),
            Some(StartFailure::OutOfMemoryAfterKv {
                phase: WarmUp::Unplaced,
                tried_gib: Some(2.32),
                free_gib: Some(1.07),
                num_reqs: None
            })
        );
        let mib = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 256.00 MiB is free.";
        let Some(StartFailure::OutOfMemory {
            tried_gib,
            free_gib,
            unallocated_gib,
        }) = read_failure(mib, false)
        else {
            panic!()
        };
        assert_eq!(
            (tried_gib, free_gib, unallocated_gib),
            (Some(0.5), Some(0.25), None)
        );
        // PyTorch's whole message (2.x): the reserved but unallocated part is read too.
        let whole = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 301.06 MiB is free. Including non-PyTorch memory, this process has 78.88 GiB memory in use. Of the allocated memory 67.71 GiB is allocated by PyTorch, and 10.67 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";
        let f = read_failure(whole, false).unwrap();
        let StartFailure::OutOfMemory {
            unallocated_gib: Some(u),
            ..
        } = f
        else {
            panic!("{f:?}")
        };
        assert_eq!(u, 10.67);
        assert!(
            f.cause().contains("10.67 GiB reserved but unallocated"),
            "{}",
            f.cause()
        );
        assert_eq!(
            read_failure("AssertionError: 128256 is not divisible by 3", false),
            Some(StartFailure::NotDivisible {
                numerator: 128256,
                denominator: 3
            })
        );
    }
}

/// The sampler warm-up after the KV cache (src/profile/warmup.rs), through the runs and
/// diagnoses that read it.
#[cfg(test)]
mod warm_up_tests {
    use crate::profile::diagnose::{self, StartFailure, WarmUp};
    use crate::profile::warmup::*;
    use crate::profile::ProfileRequest;

    const MIB: u64 = 1 << 20;

    /// `vllm serve meta-llama/Meta-Llama-3-8B --max-model-len 8192` under 0.19 on a simulated
    /// H100 80GB, dry: `vllm serve`'s 8192 tokens and 1024 sequences on a GPU of 70 GiB or more.
    fn llama(util: f64) -> ProfileRequest {
        ProfileRequest {
            model: crate::model::ModelSource::parse("preset:llama-3-8b").unwrap(),
            quant: crate::quant::Quant::BF16,
            device: crate::device::DeviceSpec::parse("sim:h100-80gb:dry").unwrap(),
            vllm: "0.19".into(),
            util,
            tokens: 0,
            seqs: 0,
            max_model_len: 8192,
            verify: false,
            ..ProfileRequest::default()
        }
    }

    fn run(req: &ProfileRequest) -> crate::profile::Report {
        crate::profile::run(
            req,
            None,
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        )
        .unwrap()
    }

    /// What the sampler holds at once at its peak, from its shapes (0.19's Triton path,
    /// `random_sample`): the `[R, V]` logits of `compute_logits` in bf16, their fp32 copy,
    /// the probabilities and the exponential draws, fp32 each.
    fn sampler_peak_bytes(r: u64, v: u64) -> u64 {
        r * v * 2 + 3 * r * v * 4
    }

    #[test]
    fn each_v1_release_warms_up_min_seqs_tokens_and_v0_and_runner_v2_do_not() {
        for name in ["0.11", "0.15", "0.19", "0.21", "0.22", "0.33"] {
            let r = crate::profile::vllm::release(name).unwrap();
            assert_eq!(
                r.sampler_warm_up_reqs(false, 1024, 8192),
                Some(1024),
                "{name}"
            );
            assert_eq!(r.sampler_warm_up_reqs(false, 256, 128), Some(128), "{name}");
            assert_eq!(r.sampler_warm_up_reqs(true, 1024, 8192), None, "{name}");
        }
        for name in ["0.6.4", "0.8", "380e1863"] {
            let r = crate::profile::vllm::release(name).unwrap();
            assert_eq!(r.sampler_warm_up_reqs(false, 256, 2048), None, "{name}");
        }
        assert!(crate::profile::vllm::release("0.19")
            .unwrap()
            .empties_cache_after_capture());
        assert!(!crate::profile::vllm::release("0.15")
            .unwrap()
            .empties_cache_after_capture());
        assert!(source("0.15").starts_with("vLLM 0.15.1 "));
    }

    /// Llama-3-8B at util 0.90 leaves the warm-up room; at 0.99 its sampler runs out after
    /// the KV cache, short by exactly what it needs less what is free, in vLLM's words; the
    /// utilization the plan offers starts and 0.01 above it does not.
    #[test]
    fn llama_3_8b_warm_up_fits_at_0_90_and_runs_out_at_0_99() {
        let ok = run(&llama(0.90));
        let w = ok.warm_up.clone().expect("0.19 runs the warm-up");
        assert_eq!(
            w.num_reqs as usize,
            ok.settings.seqs.min(ok.settings.tokens)
        );
        assert_eq!((w.num_reqs, w.vocab), (1024, 128256));
        assert_eq!(w.logits_f32_bytes(), 1024 * 128256 * 4);
        assert!(w.failed.is_none(), "{w:?}");
        let floor = sampler_peak_bytes(w.num_reqs, w.vocab);
        // The sampler's tensors, each in new segments; the dummy forward's of 1024 tokens
        // (its MLP's [1024, 2·14336] bf16 the largest) stay cached below 128 MiB.
        assert!(
            w.need_bytes >= floor && w.need_bytes < floor + 128 * MIB,
            "need {} against the sampler's {floor}",
            w.need_bytes
        );
        let total = ok.checkpoints.t0.total as i64;
        assert_eq!(w.peak_process_bytes, w.process_before_bytes + w.need_bytes);
        assert_eq!(w.room_left_bytes, total - w.peak_process_bytes as i64);
        assert_eq!(
            w.room_left_bytes,
            w.free_before_bytes as i64 - w.need_bytes as i64
        );
        assert!(w.room_left_bytes > 0);
        assert_eq!(diagnose::after_profile(&ok), None);

        let req = llama(0.99);
        let bad = run(&req);
        let b = bad.warm_up.clone().unwrap();
        let f = b.failed.as_ref().expect("out of memory at 0.99");
        assert!(f.in_sampler, "{f:?}");
        // Its need does not depend on the KV cache.
        assert_eq!(b.need_bytes, w.need_bytes);
        assert!(!b.need_at_least);
        let short = b.need_bytes as i64 - b.free_before_bytes as i64;
        assert_eq!(-b.room_left_bytes, short);
        assert!(short > 0);
        let failure = diagnose::after_profile(&bad).unwrap();
        let StartFailure::OutOfMemoryAfterKv {
            phase: WarmUp::Sampler,
            tried_gib: Some(t),
            free_gib: Some(fr),
            num_reqs: Some(1024),
        } = &failure
        else {
            panic!("{failure:?}")
        };
        assert!(((t - fr) * GIB_F - short as f64).abs() < 1.0);
        let release = crate::profile::vllm::release("0.19").unwrap();
        assert_eq!(
            failure.vllm_text(release).unwrap(),
            "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy \
             requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when \
             initializing the engine."
        );
        // The KV cache grows by T·Δu and the warm-up does not.
        let (u, o) = diagnose::warm_up_fit(&req, short as f64, total as f64).unwrap();
        let expect = ((0.99 - short as f64 / total as f64) * 100.0).floor() / 100.0;
        assert!(u <= expect + 1e-9 && u > expect - 0.05, "{u} {expect}");
        assert!(o.starts());
        let above = run(&llama(((u + 0.01) * 100.0).round() / 100.0));
        assert!(above.warm_up.unwrap().failed.is_some());
    }

    const GIB_F: f64 = (1u64 << 30) as f64;
}

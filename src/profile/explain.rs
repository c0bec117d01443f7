//! `vramscope explain vllm.log`: a vLLM startup log read back into what it states (release,
//! model, settings, GPU total and the memory lines), the same profile run with that release,
//! and the two side by side, term by term.
//!
//! The reader streams: a line longer than `MAX_LINE` is cut there and the rest skipped, and
//! only the facts are kept, so a log of any size is read in bounded memory. The lines it knows
//! are the ones each release prints (cited by pattern below); everything else is noise.

use std::io::{BufRead, Read};

use crate::base::error::{Error, Result};
use crate::device::DeviceSpec;
use crate::model::ModelSource;
use crate::quant::Quant;

use super::request::{KvCacheDtype, ProfileRequest};
use super::Report;

/// The longest line kept; vLLM's longest (the engine config) is a few KB.
pub const MAX_LINE: usize = 64 << 10;

const GIB: f64 = (1u64 << 30) as f64;

use super::log_numbers;
pub use super::log_numbers::Logged;

/// What a vLLM startup log states.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogFacts {
    /// The version as printed ("0.6.4.post1", "0.19.0").
    pub release: Option<String>,
    pub model: Option<String>,
    /// `dtype=torch.bfloat16` → "bfloat16".
    pub dtype: Option<String>,
    pub quantization: Option<String>,
    pub max_model_len: Option<u64>,
    pub tp: Option<u32>,
    /// `pipeline_parallel_size`.
    pub pp: Option<u32>,
    /// `data_parallel_size`.
    pub dp: Option<u32>,
    /// `enable_expert_parallel` (the non-default args' dict; the engine line does not print it).
    pub enable_expert_parallel: Option<bool>,
    pub enforce_eager: Option<bool>,
    pub kv_cache_dtype: Option<String>,
    pub chunked_prefill: Option<bool>,
    pub util: Option<f64>,
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub block_size: Option<u64>,
    pub kv_cache_memory: Option<u64>,
    /// GiB: total_gpu_memory (V0) or the device total of V1's DEBUG line.
    pub total: Option<Logged>,
    /// V1: "Requested memory: U (util), R GiB".
    pub requested: Option<Logged>,
    pub weights: Option<Logged>,
    /// "Loading model weights took X GB" (V0, four decimals; the memory line's two-decimal
    /// figure is preferred where both are printed).
    pub loaded_weights: Option<Logged>,
    /// 0.6.4: peak_torch_memory, weights included.
    pub peak_torch: Option<Logged>,
    /// 0.6.5 on: PyTorch activation peak memory; V1: torch peak memory increase.
    pub activation: Option<Logged>,
    pub non_torch: Option<Logged>,
    pub kv: Option<Logged>,
    pub blocks: Option<u64>,
    pub tokens: Option<u64>,
    pub concurrency: Option<Logged>,
    pub graph_estimate: Option<Logged>,
    pub graph_took: Option<Logged>,
    /// Which format the memory lines were in.
    pub style: Option<Style>,
    /// With pipeline parallel, each stage's own lines (its first worker's, `Worker_PP{k}`):
    /// "Model loading took" and "Available KV cache memory".
    pub stage_weights: std::collections::BTreeMap<u32, Logged>,
    pub stage_kv: std::collections::BTreeMap<u32, Logged>,
    /// Settings the log states that change memory and that vramscope does not model, each
    /// as the log prints it with what it changes and its line.
    pub unmodelled: Vec<String>,
    /// The failure the log shows, if the start failed, and its line (the first exception
    /// vLLM raised; a later message about the same failure completes it).
    pub failure: Option<super::diagnose::StartFailure>,
    pub failure_line: Option<u64>,
    /// A line shows the Hugging Face hub could not be reached.
    pub network_error: bool,
    /// The warm-up the last traceback frame named (`_dummy_sampler_run`, `capture_model`).
    pub warm_up: Option<super::diagnose::WarmUp>,
    pub lines: u64,
    pub recognised: u64,
    /// The GPU a line names, and the line: the `device_name=` of the fused MoE (or block
    /// fp8 / int8) config file vLLM looked for, `torch.cuda.get_device_name()` with spaces as
    /// underscores (0.19.0 fused_moe.py L1018-1029: every H200 as `NVIDIA_H200`).
    pub device_name: Option<(String, u64)>,
    /// How the GPUs reach each other as the custom all-reduce found it, and the line: its
    /// warnings (0.19.0 distributed/device_communicators/custom_all_reduce.py L150-170).
    pub topology: Option<(crate::device::nccl_model::Topology, u64)>,
    /// The line each fact was read from, by its name as the log prints it
    /// ("max_num_batched_tokens", "kv_cache_size"): errors about a setting name its line.
    pub at: std::collections::BTreeMap<&'static str, u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// 0.6.4's "Memory profiling results: total_gpu_memory=…" (worker.py:233).
    MemoryProfilingResults,
    /// 0.6.5-0.8's "the current vLLM instance can use …" lines.
    InstanceCanUse,
    /// V1's gpu_worker.py and kv_cache_utils.py lines.
    V1,
}

impl Style {
    /// The format in words, for a log that mixes two.
    fn words(self) -> &'static str {
        match self {
            Style::MemoryProfilingResults => "V0 memory line of 0.6.4 (\"Memory profiling results\")",
            Style::InstanceCanUse => "V0 memory line of 0.6.5-0.8 (\"the current vLLM instance can use\", \"model weights take\")",
            Style::V1 => "V1 memory line (\"Requested memory\", \"torch peak memory increase\", \"Available KV cache memory\")",
        }
    }
}

/// A fact's value as the log printed it, and whether two are the same.
trait Fact: Clone {
    fn shown(&self) -> String;
    fn same(&self, other: &Self) -> bool;
}

impl Fact for Logged {
    fn shown(&self) -> String {
        self.text.clone()
    }
    fn same(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Fact for f64 {
    /// The shortest text that reads back exactly (`1e-300`, not three hundred zeros).
    fn shown(&self) -> String {
        format!("{self:?}")
    }
    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

macro_rules! plain_fact {
    ($($t:ty),*) => {$(
        impl Fact for $t {
            fn shown(&self) -> String {
                self.to_string()
            }
            fn same(&self, other: &Self) -> bool {
                self == other
            }
        }
    )*};
}
plain_fact!(String, u64, u32, usize, bool);

/// A number that does not fit its kind, refused naming the line and the field (`key` as the
/// line prints it, less its punctuation).
fn misread(line_no: u64, key: &str, problem: String) -> Error {
    let field = key.trim_matches(|c: char| " =:('\",".contains(c));
    Error::Request(format!("line {line_no}: {field} {problem}"))
}

/// The size after the first `key` in `line`; `None` where the key or its number is missing.
fn size_after(line: &str, key: &str, line_no: u64) -> Result<Option<Logged>> {
    let Some(i) = line.find(key) else {
        return Ok(None);
    };
    log_numbers::size(&line[i + key.len()..]).map_err(|p| misread(line_no, key, p))
}

/// `size_after` for a figure a failed start prints below zero (V1's "Available KV cache
/// memory: -0.32 GiB", 0.6.4's "kv_cache_size=-0.85GiB": the profile left no room, and the
/// exception follows).
fn signed_size_after(line: &str, key: &str, line_no: u64) -> Result<Option<Logged>> {
    let Some(i) = line.find(key) else {
        return Ok(None);
    };
    let rest = &line[i + key.len()..];
    match rest.trim_start().strip_prefix('-') {
        Some(abs) => Ok(log_numbers::size(abs)
            .map_err(|p| misread(line_no, key, p))?
            .map(|l| Logged {
                value: -l.value,
                text: format!("-{}", l.text),
            })),
        None => size_after(line, key, line_no),
    }
}

/// The ratio after the first `key` in `line`; `None` where the key or its number is missing.
fn ratio_after(line: &str, key: &str, line_no: u64) -> Result<Option<Logged>> {
    let Some(i) = line.find(key) else {
        return Ok(None);
    };
    log_numbers::ratio(&line[i + key.len()..]).map_err(|p| misread(line_no, key, p))
}

/// The count after the first `key` in `line`, as `T` (a count past `T` is refused as one
/// past 64 bits is); `None` where the key or its number is missing.
fn count_after<T: TryFrom<u64>>(line: &str, key: &str, line_no: u64) -> Result<Option<T>> {
    let Some(i) = line.find(key) else {
        return Ok(None);
    };
    narrow(log_numbers::count(&line[i + key.len()..]), key, line_no)
}

/// A config field's count (`max_seq_len=8192`); `None` where the field is missing.
fn count_field<T: TryFrom<u64>>(line: &str, key: &str, line_no: u64) -> Result<Option<T>> {
    let Some(v) = field(line, key) else {
        return Ok(None);
    };
    narrow(log_numbers::count(v), key, line_no)
}

fn narrow<T: TryFrom<u64>>(
    n: std::result::Result<Option<u64>, String>,
    key: &str,
    line_no: u64,
) -> Result<Option<T>> {
    match n.map_err(|p| misread(line_no, key, p))? {
        None => Ok(None),
        Some(n) => T::try_from(n).map(Some).map_err(|_| {
            misread(
                line_no,
                key,
                format!("'{n}' is larger than this count can be"),
            )
        }),
    }
}

/// A config field `key=value` (value up to ", " or the end; quotes dropped).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(i) = line[from..].find(key) {
        let at = from + i;
        let before = line[..at].chars().last();
        if at == 0 || matches!(before, Some(' ' | ',' | ':' | '(' | '{')) {
            let rest = &line[at + key.len()..];
            let end = rest
                .find(", ")
                .or_else(|| rest.find(')'))
                .unwrap_or(rest.len());
            return Some(rest[..end].trim().trim_matches(['\'', '"']));
        }
        from = at + key.len();
    }
    None
}

/// The pipeline stage a V1 worker's prefix names: "(Worker_PP1 pid=…)", "(Worker_PP0_TP1
/// pid=…)" (v1/executor/multiproc_executor.py 0.19 L978-990).
fn stage_of(line: &str) -> Option<u32> {
    let prefix = &line[..line.find(')')?];
    let at = prefix.find("_PP")? + 3;
    let digits: String = prefix[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The top-level `'key': value` pairs of a Python dict as vLLM prints its non-default args
/// (`{'model': 'x', 'speculative_config': {'num_speculative_tokens': 3}}`): nested braces,
/// brackets and quoted strings are stepped over, values kept as printed.
fn dict_items(text: &str) -> Vec<(String, String)> {
    let Some(open) = text.find('{') else {
        return Vec::new();
    };
    let mut items = Vec::new();
    let (mut depth, mut quote, mut start) = (0i32, None::<char>, open + 1);
    for (i, c) in text.char_indices().skip_while(|(i, _)| *i < open) {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => {
                depth -= 1;
                if depth == 0 {
                    items.push(&text[start..i]);
                    break;
                }
            }
            ',' if depth == 1 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
        .into_iter()
        .filter_map(|item| {
            let (k, v) = item.split_once(':')?;
            let k = k.trim().trim_matches(['\'', '"']);
            (!k.is_empty()).then(|| (k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The non-default args vramscope reads (or that change nothing it models): every other key
/// of that line is named as not modelled.
const ARGS_READ: &[&str] = &[
    "model",
    "model_tag",
    "gpu_memory_utilization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "kv_cache_memory_bytes",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "max_model_len",
    "enforce_eager",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "enable_chunked_prefill",
    "host",
    "port",
    "api_key",
    "served_model_name",
    "trust_remote_code",
    "tokenizer",
    "tokenizer_mode",
    "revision",
    "tokenizer_revision",
    "download_dir",
    "seed",
    "chat_template",
    "response_role",
    "disable_log_requests",
    "disable_log_stats",
    "enable_log_requests",
    "enable_auto_tool_choice",
    "tool_call_parser",
    "reasoning_parser",
    "uvicorn_log_level",
    "load_format",
    "config_format",
    "generation_config",
    "max_logprobs",
    "disable_frontend_multiprocessing",
    "disable_fastapi_docs",
    "allowed_origins",
    "root_path",
    "middleware",
    "ssl_keyfile",
    "ssl_certfile",
    "hf_token",
];

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "True" | "true" => Some(true),
        "False" | "false" => Some(false),
        _ => None,
    }
}

/// The memory facts a log states, by name.
#[derive(Clone, Copy)]
enum Field {
    Total,
    Requested,
    Weights,
    LoadedWeights,
    PeakTorch,
    Activation,
    NonTorch,
    Kv,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Total => "total_gpu_memory",
            Field::Requested => "requested memory",
            Field::Weights => "weights",
            Field::LoadedWeights => "loaded weights",
            Field::PeakTorch => "peak_torch_memory",
            Field::Activation => "activation",
            Field::NonTorch => "non_torch_memory",
            Field::Kv => "kv_cache_size",
        }
    }

    fn slot_fn(self) -> fn(&mut LogFacts) -> &mut Option<Logged> {
        match self {
            Field::Total => |f| &mut f.total,
            Field::Requested => |f| &mut f.requested,
            Field::Weights => |f| &mut f.weights,
            Field::LoadedWeights => |f| &mut f.loaded_weights,
            Field::PeakTorch => |f| &mut f.peak_torch,
            Field::Activation => |f| &mut f.activation,
            Field::NonTorch => |f| &mut f.non_torch,
            Field::Kv => |f| &mut f.kv,
        }
    }
}

struct Reader {
    facts: LogFacts,
    /// The memory facts rank 0's own lines (no worker prefix) stated.
    from_driver: std::collections::HashSet<&'static str>,
}

impl Reader {
    fn cut(line_no: u64, what: &str) -> Error {
        Error::Request(format!(
            "line {line_no} is cut short: its {what} is incomplete (a truncated log?)"
        ))
    }

    /// Records `v` as the fact `key` (its slot in `LogFacts` is `slot`). A TP worker's line
    /// fills only what rank 0 did not say; rank 0 (or, for a setting, any line) saying two
    /// different values is a log that contradicts itself, refused naming both lines.
    fn put<T: Fact>(
        &mut self,
        key: &'static str,
        slot: fn(&mut LogFacts) -> &mut Option<T>,
        v: T,
        worker: bool,
        line_no: u64,
    ) -> Result<()> {
        let driver_had = self.from_driver.contains(key);
        let earlier = self.facts.at.get(key).copied();
        let cur = slot(&mut self.facts);
        match (cur.as_ref(), worker) {
            (Some(_), true) => return Ok(()),
            (Some(old), false) if driver_had && !old.same(&v) => {
                return Err(Error::Request(format!(
                    "line {line_no}: {key} {}, but {} earlier (line {}): the log contradicts \
                     itself (two startups or two instances in one log); keep one",
                    v.shown(),
                    old.shown(),
                    earlier.unwrap_or(0)
                )));
            }
            (Some(_), false) if driver_had => return Ok(()),
            _ => *cur = Some(v),
        }
        self.facts.at.insert(key, line_no);
        if !worker {
            self.from_driver.insert(key);
        }
        Ok(())
    }

    /// Names a setting vramscope does not model (once, at its first line).
    fn unmodelled(&mut self, name: &str, value: &str, line_no: u64) {
        let value: String = value.chars().take(80).collect();
        let text = format!(
            "{name}={value} ({}; line {line_no})",
            super::vllm_args::not_modelled_why(name)
        );
        let named = |u: &String| u.starts_with(&format!("{name}="));
        if !self.facts.unmodelled.iter().any(named) {
            self.facts.unmodelled.push(text);
        }
    }

    /// `put` for a setting: any line states it for the whole instance.
    fn setting<T: Fact>(
        &mut self,
        key: &'static str,
        slot: fn(&mut LogFacts) -> &mut Option<T>,
        v: T,
        line_no: u64,
    ) -> Result<()> {
        self.put(key, slot, v, false, line_no)
    }

    /// A count vLLM refuses at 0 (max_num_batched_tokens, max_num_seqs, block_size, TP,
    /// max_model_len): a log stating 0 is not one vLLM printed at startup.
    fn positive<T: Fact + Default + PartialEq>(
        &mut self,
        key: &'static str,
        slot: fn(&mut LogFacts) -> &mut Option<T>,
        v: T,
        line_no: u64,
    ) -> Result<()> {
        if v == T::default() {
            return Err(Error::Request(format!(
                "line {line_no}: {key} 0: vLLM refuses 0 (it must be at least 1), so no vLLM \
                 instance started with it"
            )));
        }
        self.setting(key, slot, v, line_no)
    }

    /// Sets memory facts (see `put`).
    fn set(&mut self, items: &[(Field, Logged)], worker: bool, line_no: u64) -> Result<()> {
        for (field, v) in items {
            self.put(field.name(), field.slot_fn(), v.clone(), worker, line_no)?;
        }
        Ok(())
    }

    /// The memory lines' format: one log holds one release's, so a V1 line after a V0 one (or
    /// 0.6.4's after 0.6.5's) is refused naming both lines.
    fn style(&mut self, style: Style, line_no: u64) -> Result<()> {
        match self.facts.style {
            Some(old) if old != style => Err(Error::Request(format!(
                "line {line_no}: a {} after line {}'s {}: the log mixes two engines' or \
                 releases' startups; keep one",
                style.words(),
                self.facts.at.get("memory format").copied().unwrap_or(0),
                old.words()
            ))),
            Some(_) => Ok(()),
            None => {
                self.facts.style = Some(style);
                self.facts.at.insert("memory format", line_no);
                Ok(())
            }
        }
    }

    /// A failed start's lines: the exception vLLM raised (the first one, completed by a later
    /// message about the same failure), the warm-up its traceback names, a network error.
    fn failure(&mut self, line: &str, line_no: u64) {
        use super::diagnose::{self, StartFailure, WarmUp};
        self.facts.network_error |= diagnose::is_network_error(line);
        if let Some(w) = diagnose::warm_up_of(line) {
            self.facts.warm_up = Some(w);
        }
        let after_kv =
            self.facts.kv.is_some() || self.facts.tokens.is_some() || self.facts.blocks.is_some();
        let Some(mut f) = diagnose::read_failure(line, after_kv) else {
            return;
        };
        if let StartFailure::OutOfMemoryAfterKv { phase, .. } = &mut f {
            if *phase == WarmUp::Unplaced {
                *phase = self.facts.warm_up.unwrap_or(WarmUp::Unplaced);
            }
        }
        match (&mut self.facts.failure, f) {
            (None, f) => {
                self.facts.failure = Some(f);
                self.facts.failure_line = Some(line_no);
            }
            // torch's error first, then the sampler's message raised from it: one failure,
            // with the numbers of the first and the phase and requests of the second.
            (
                Some(StartFailure::OutOfMemoryAfterKv {
                    phase, num_reqs, ..
                }),
                StartFailure::OutOfMemoryAfterKv {
                    phase: p,
                    num_reqs: n,
                    ..
                },
            ) if p != WarmUp::Unplaced => {
                *phase = p;
                *num_reqs = num_reqs.or(n);
            }
            _ => {}
        }
    }

    fn line(&mut self, line: &str, line_no: u64) -> Result<()> {
        let n = line_no;
        self.failure(line, n);
        // TP workers prefix their lines: "(VllmWorkerProcess pid=…)", "(Worker_TP1 pid=…)".
        let worker = line.trim_start().starts_with('(')
            && (line.contains("Worker") || line.contains("pid="))
            && !line.contains("EngineCore");
        let mut known = true;
        if let Some(i) = line.find("device_name=") {
            // "Using configuration from …/E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json
            // for MoE layer." or "Config file not found at …" (fused_moe.py L1078, L1092).
            let name: String = line[i + "device_name=".len()..]
                .split([',', '\'', '"', ']', ' '])
                .next()
                .unwrap_or("")
                .trim_end_matches(".json")
                .to_string();
            if !name.is_empty() && self.facts.device_name.is_none() {
                self.facts.device_name = Some((name, n));
            }
        } else if line.contains("Custom allreduce is disabled") {
            use crate::device::nccl_model::Topology;
            let t = if line.contains("lacks GPU P2P capability") {
                Some(Topology::PcieNoP2p)
            } else if line.contains("more than two PCIe-only GPUs") {
                Some(Topology::Pcie)
            } else {
                None
            };
            match t {
                Some(t) if self.facts.topology.is_none() => self.facts.topology = Some((t, n)),
                _ => known = false,
            }
        } else if let Some(i) = line
            .find("LLM engine (v")
            .filter(|_| line.contains("Initializing"))
        {
            // llm_engine.py:250 (0.6.4), :235 (0.7.2); V1 v1/engine/core.py:106.
            let rest = &line[i + "LLM engine (v".len()..];
            let v = rest.split(')').next().unwrap_or("").to_string();
            self.setting("vLLM version", |f| &mut f.release, v, n)?;
            if let Some(m) = field(line, "model=") {
                self.setting("model", |f| &mut f.model, m.to_string(), n)?;
            }
            if let Some(d) = field(line, "dtype=") {
                let d = d.trim_start_matches("torch.").to_string();
                self.setting("dtype", |f| &mut f.dtype, d, n)?;
            }
            if let Some(len) = count_field(line, "max_seq_len=", n)? {
                self.positive("max_model_len", |f| &mut f.max_model_len, len, n)?;
            }
            if let Some(tp) = count_field(line, "tensor_parallel_size=", n)? {
                self.positive("tensor_parallel_size", |f| &mut f.tp, tp, n)?;
            }
            if let Some(pp) = count_field(line, "pipeline_parallel_size=", n)? {
                self.positive("pipeline_parallel_size", |f| &mut f.pp, pp, n)?;
            }
            // The engine config's settings that change memory and are not modelled
            // (config/vllm.py 0.19 `__str__`), named where they differ from vLLM's default.
            if let Some(v) = field(line, "speculative_config=").filter(|v| *v != "None") {
                self.unmodelled("speculative_config", v, n);
            }
            if let Some(dp) = count_field(line, "data_parallel_size=", n)? {
                self.positive("data_parallel_size", |f| &mut f.dp, dp, n)?;
            }
            if let Some(v) = field(line, "decode_context_parallel_size=").filter(|v| *v != "1") {
                self.unmodelled("decode_context_parallel_size", v, n);
            }
            if field(line, "disable_custom_all_reduce=") == Some("True") {
                self.unmodelled("disable_custom_all_reduce", "True", n);
            }
            if let Some(q) = field(line, "quantization=").filter(|q| *q != "None") {
                self.setting("quantization", |f| &mut f.quantization, q.to_string(), n)?;
            }
            if let Some(b) = field(line, "enforce_eager=").and_then(parse_bool) {
                self.setting("enforce_eager", |f| &mut f.enforce_eager, b, n)?;
            }
            if let Some(d) = field(line, "kv_cache_dtype=") {
                self.setting(
                    "kv_cache_dtype",
                    |f| &mut f.kv_cache_dtype,
                    d.to_string(),
                    n,
                )?;
            }
            if let Some(b) = field(line, "chunked_prefill_enabled=")
                .or_else(|| field(line, "enable_chunked_prefill="))
                .and_then(|v| parse_bool(v.split_whitespace().next().unwrap_or(v)))
            {
                self.setting("enable_chunked_prefill", |f| &mut f.chunked_prefill, b, n)?;
            }
        } else if line.contains("args: Namespace(") {
            // V0's api_server prints its argparse Namespace (0.6.4 entrypoints/openai/
            // api_server.py L586, "args: %s"): the settings a failed start never got to
            // print in its engine line.
            if let Some(m) = field(line, "model=") {
                self.setting("model", |f| &mut f.model, m.to_string(), n)?;
            }
            if let Some(tp) = count_field(line, "tensor_parallel_size=", n)? {
                self.positive("tensor_parallel_size", |f| &mut f.tp, tp, n)?;
            }
            if let Some(len) = field(line, "max_model_len=").filter(|v| *v != "None") {
                let len = log_numbers::count(len).map_err(|p| misread(n, "max_model_len", p))?;
                if let Some(len) = len {
                    self.positive("max_model_len", |f| &mut f.max_model_len, len, n)?;
                }
            }
            if let Some(u) = ratio_after(line, "gpu_memory_utilization=", n)? {
                self.setting("gpu_memory_utilization", |f| &mut f.util, u.value, n)?;
            }
            if let Some(q) = field(line, "quantization=").filter(|q| *q != "None") {
                self.setting("quantization", |f| &mut f.quantization, q.to_string(), n)?;
            }
        } else if let Some(i) = line.find("API server version ") {
            let v = line[i + "API server version ".len()..].trim().to_string();
            self.setting("vLLM version", |f| &mut f.release, v, n)?;
        } else if line.contains("non-default args: {") {
            // V1's api_server: a Python dict of what the user set.
            let key = |k: &str| format!("'{k}': ");
            if let Some(u) = ratio_after(line, &key("gpu_memory_utilization"), n)? {
                self.setting("gpu_memory_utilization", |f| &mut f.util, u.value, n)?;
            }
            if let Some(v) = count_after(line, &key("max_num_seqs"), n)? {
                self.positive("max_num_seqs", |f| &mut f.max_num_seqs, v, n)?;
            }
            if let Some(v) = count_after(line, &key("max_num_batched_tokens"), n)? {
                self.positive(
                    "max_num_batched_tokens",
                    |f| &mut f.max_num_batched_tokens,
                    v,
                    n,
                )?;
            }
            if let Some(v) = count_after(line, &key("block_size"), n)? {
                self.positive("block_size", |f| &mut f.block_size, v, n)?;
            }
            if let Some(v) = count_after(line, &key("kv_cache_memory_bytes"), n)? {
                self.positive("kv_cache_memory_bytes", |f| &mut f.kv_cache_memory, v, n)?;
            }
            if let Some(tp) = count_after(line, &key("tensor_parallel_size"), n)? {
                self.positive("tensor_parallel_size", |f| &mut f.tp, tp, n)?;
            }
            if let Some(pp) = count_after(line, &key("pipeline_parallel_size"), n)? {
                self.positive("pipeline_parallel_size", |f| &mut f.pp, pp, n)?;
            }
            if let Some(dp) = count_after(line, &key("data_parallel_size"), n)? {
                self.positive("data_parallel_size", |f| &mut f.dp, dp, n)?;
            }
            if let Some(b) = field(line, &key("enable_expert_parallel"))
                .and_then(|v| parse_bool(v.trim_end_matches([',', '}'])))
            {
                self.setting(
                    "enable_expert_parallel",
                    |f| &mut f.enable_expert_parallel,
                    b,
                    n,
                )?;
            }
            let at = line.find("non-default args: {").unwrap_or(0);
            for (k, v) in dict_items(&line[at..]) {
                if !ARGS_READ.contains(&k.as_str()) {
                    self.unmodelled(&k, &v, n);
                }
            }
            if let Some(len) = count_after(line, &key("max_model_len"), n)? {
                self.positive("max_model_len", |f| &mut f.max_model_len, len, n)?;
            }
            if line.contains("'enforce_eager': True") {
                self.setting("enforce_eager", |f| &mut f.enforce_eager, true, n)?;
            }
            for k in ["model_tag", "model"] {
                if let Some(m) = field(line, &format!("'{k}': ")) {
                    let m = m.trim_matches(['\'', '}']).to_string();
                    self.setting("model", |f| &mut f.model, m, n)?;
                    break;
                }
            }
        } else if line.contains("Memory profiling results: total_gpu_memory=") {
            // 0.6.4 worker.py:233-244: every field, gpu_memory_utilization last.
            // Only the KV size goes below zero (a start with no room left); the others are
            // device and allocator readings (worker.py:205-215).
            let g = |k: &str| size_after(line, &format!("{k}="), n);
            let (Some(total), Some(peak), Some(nt), Some(kv), Some(u)) = (
                g("total_gpu_memory")?,
                g("peak_torch_memory")?,
                g("non_torch_memory")?,
                signed_size_after(line, "kv_cache_size=", n)?,
                ratio_after(line, "gpu_memory_utilization=", n)?,
            ) else {
                return Err(Self::cut(n, "memory profiling line"));
            };
            self.style(Style::MemoryProfilingResults, n)?;
            self.setting("gpu_memory_utilization", |f| &mut f.util, u.value, n)?;
            self.set(
                &[
                    (Field::Total, total),
                    (Field::PeakTorch, peak),
                    (Field::NonTorch, nt),
                    (Field::Kv, kv),
                ],
                worker,
                n,
            )?;
        } else if line.contains("the current vLLM instance can use total_gpu_memory (") {
            // 0.6.5-0.8 worker.py: "… total_gpu_memory (T GiB) x gpu_memory_utilization (u) = …".
            let (Some(total), Some(u)) = (
                size_after(line, "total_gpu_memory (", n)?,
                ratio_after(line, "gpu_memory_utilization (", n)?,
            ) else {
                return Err(Self::cut(n, "memory line"));
            };
            self.style(Style::InstanceCanUse, n)?;
            self.setting("gpu_memory_utilization", |f| &mut f.util, u.value, n)?;
            self.set(&[(Field::Total, total)], worker, n)?;
        } else if line.contains("model weights take ") && line.contains("reserved for KV Cache is")
        {
            let g = |k: &str| size_after(line, k, n);
            let (Some(w), Some(nt), Some(act), Some(kv)) = (
                g("model weights take ")?,
                // An increase between two readings (#12126): below zero when other
                // processes freed memory meanwhile.
                signed_size_after(line, "non_torch_memory takes ", n)?,
                g("PyTorch activation peak memory takes ")?,
                signed_size_after(line, "reserved for KV Cache is ", n)?,
            ) else {
                return Err(Self::cut(n, "memory line"));
            };
            self.style(Style::InstanceCanUse, n)?;
            self.set(
                &[
                    (Field::Weights, w),
                    (Field::NonTorch, nt),
                    (Field::Activation, act),
                    (Field::Kv, kv),
                ],
                worker,
                n,
            )?;
        } else if let Some(w) = size_after(line, "Loading model weights took ", n)? {
            // V0 model_runner.py:1077 ("%.4f GB", GiB in fact).
            self.set(&[(Field::LoadedWeights, w)], worker, n)?;
        } else if let Some(w) = size_after(line, "Model loading took ", n)? {
            // V1 gpu_model_runner.py:4821.
            if let Some(st) = stage_of(line).filter(|_| worker) {
                self.facts.stage_weights.entry(st).or_insert(w.clone());
            }
            self.set(&[(Field::Weights, w)], worker, n)?;
        } else if line.contains("Requested memory: ") && line.contains("(util)") {
            // V1 gpu_worker.py DEBUG "Initial free memory: F GiB; Requested memory: u (util), R GiB".
            let (Some(u), Some(r)) = (
                ratio_after(line, "Requested memory: ", n)?,
                size_after(line, "(util), ", n)?,
            ) else {
                return Err(Self::cut(n, "requested-memory line"));
            };
            self.style(Style::V1, n)?;
            self.setting("gpu_memory_utilization", |f| &mut f.util, u.value, n)?;
            self.set(&[(Field::Requested, r)], worker, n)?;
        } else if line.contains("torch peak memory increase: ") {
            // V1 DEBUG "Memory profiling takes …; torch peak memory increase: …; non-torch
            // forward increase memory: …; weights memory: …".
            let (Some(a), Some(nt)) = (
                size_after(line, "torch peak memory increase: ", n)?,
                size_after(line, "non-torch forward increase memory: ", n)?,
            ) else {
                return Err(Self::cut(n, "memory profiling line"));
            };
            self.style(Style::V1, n)?;
            self.set(&[(Field::Activation, a), (Field::NonTorch, nt)], worker, n)?;
            if let Some(w) = size_after(line, "weights memory: ", n)? {
                self.set(&[(Field::Weights, w)], worker, n)?;
            }
        } else if let Some(kv) = signed_size_after(line, "Available KV cache memory: ", n)? {
            self.style(Style::V1, n)?;
            if let Some(st) = stage_of(line).filter(|_| worker) {
                self.facts.stage_kv.entry(st).or_insert(kv.clone());
            }
            self.set(&[(Field::Kv, kv)], worker, n)?;
        } else if let Some(tokens) = count_after(line, "GPU KV cache size: ", n)? {
            self.put("GPU KV cache size", |f| &mut f.tokens, tokens, worker, n)?;
        } else if let Some(key) = ["# GPU blocks: ", "# CUDA blocks: ", "# cuda blocks: "]
            .into_iter()
            .find(|k| line.contains(k))
        {
            let Some(blocks) = count_after(line, key, n)? else {
                return Err(Self::cut(n, "block count"));
            };
            self.setting("GPU blocks", |f| &mut f.blocks, blocks, n)?;
        } else if let Some(i) = line.find("Maximum concurrency for ") {
            let rest = &line[i..];
            let Some(x) = ratio_after(rest, "per request: ", n)? else {
                return Err(Self::cut(n, "concurrency line"));
            };
            self.put("maximum concurrency", |f| &mut f.concurrency, x, worker, n)?;
        } else if let Some(e) = size_after(line, "Estimated CUDA graph memory: ", n)? {
            self.put(
                "estimated CUDA graph memory",
                |f| &mut f.graph_estimate,
                e,
                worker,
                n,
            )?;
        } else if line.contains("Graph capturing finished in ") {
            let Some(t) = size_after(line, ", took ", n)? else {
                return Err(Self::cut(n, "graph capture line"));
            };
            self.put("graph capturing took", |f| &mut f.graph_took, t, worker, n)?;
        } else if let Some(i) = line.find("Free memory on device (") {
            // V1 DEBUG "Free memory on device (F/T GiB) on startup".
            let rest = &line[i + "Free memory on device (".len()..];
            let total = match rest.split_once('/') {
                Some((_, t)) => {
                    log_numbers::size(t).map_err(|p| misread(n, "Free memory on device", p))?
                }
                None => None,
            };
            if let Some(t) = total {
                self.set(&[(Field::Total, t)], worker, n)?;
            }
        } else if let Some(i) = line.find(CHUNKED_BATCH) {
            // V1's INFO "Chunked prefill is enabled with max_num_batched_tokens=N." (0.11.0
            // config/scheduler.py L204-207, 0.19.0 L237-240, 0.26.0 L251-255): the batch the
            // profile runs, whoever set it (the user, `vllm serve`'s or the `LLM` class's
            // defaults). A line without its closing period is cut.
            let rest = line[i + CHUNKED_BATCH.len()..].trim_end();
            let Some(number) = rest.strip_suffix('.') else {
                return Err(Self::cut(n, "chunked prefill line"));
            };
            if let Some(v) = narrow(log_numbers::count(number), "max_num_batched_tokens", n)? {
                self.positive(
                    "max_num_batched_tokens",
                    |f| &mut f.max_num_batched_tokens,
                    v,
                    n,
                )?;
            }
        } else if line.contains("usage context") && line.contains(" max_num_") {
            // "Setting max_num_seqs to 1024 for OPENAI_API_SERVER usage context." (0.11.0
            // engine/arg_utils.py:1672-1681, DEBUG); later releases say "Defaulting". The
            // default applies where the user set none.
            let count = |k: &str| count_after(line, &format!("max_num_{k} to "), n);
            if let Some(v) = count("seqs")? {
                if self.facts.max_num_seqs.is_none() {
                    self.positive("max_num_seqs", |f| &mut f.max_num_seqs, v, n)?;
                }
            } else if let Some(v) = count("batched_tokens")? {
                if self.facts.max_num_batched_tokens.is_none() {
                    self.positive(
                        "max_num_batched_tokens",
                        |f| &mut f.max_num_batched_tokens,
                        v,
                        n,
                    )?;
                }
            } else {
                known = false;
            }
        } else {
            known = false;
        }
        if known {
            self.facts.recognised += 1;
        }
        Ok(())
    }
}

/// V1's line that states the profile batch.
const CHUNKED_BATCH: &str = "Chunked prefill is enabled with max_num_batched_tokens=";

/// Reads a log. `name` names it in errors.
pub fn read_log(name: &str, mut input: impl BufRead) -> Result<LogFacts> {
    let mut r = Reader {
        facts: LogFacts::default(),
        from_driver: Default::default(),
    };
    let mut buf = Vec::with_capacity(4096);
    let io = |e: std::io::Error| Error::Request(format!("{name}: {e}"));
    loop {
        buf.clear();
        let n = input
            .by_ref()
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut buf)
            .map_err(io)?;
        if n == 0 {
            break;
        }
        r.facts.lines += 1;
        if buf.last() != Some(&b'\n') && n == MAX_LINE {
            // Longer than any vLLM line: skip the rest of it.
            let mut skip = Vec::new();
            loop {
                skip.clear();
                let m = input
                    .by_ref()
                    .take(MAX_LINE as u64)
                    .read_until(b'\n', &mut skip)
                    .map_err(io)?;
                if m == 0 || skip.last() == Some(&b'\n') {
                    break;
                }
            }
            continue;
        }
        let line = String::from_utf8_lossy(&buf);
        let line_no = r.facts.lines;
        let recognised = r.facts.recognised;
        let read = r.line(line.trim_end(), line_no);
        // No newline: the log ends inside this line. A line of numbers cut there may have lost
        // digits ("# GPU blocks: 368" of 3686), so it is refused rather than read.
        if buf.last() != Some(&b'\n') && (read.is_err() || r.facts.recognised > recognised) {
            return Err(Error::Request(format!(
                "{name}: line {line_no} is cut short: the log ends inside it, with no newline \
                 (a truncated log?): {}",
                line.trim().chars().take(160).collect::<String>()
            )));
        }
        read.map_err(|e| match e {
            // The line's own message, prefixed once with the log's name.
            Error::Request(m) => Error::Request(format!("{name}: {m}")),
            other => other,
        })?;
    }
    let mut f = r.facts;
    if f.weights.is_none() {
        f.weights = f.loaded_weights.clone();
    }
    use super::diagnose::StartFailure;
    match &mut f.failure {
        Some(StartFailure::ModelNotFound { network, .. }) => *network |= f.network_error,
        // V0 (0.6.4) asks the hub with file_exists and stops at the connection error itself.
        None if f.network_error => {
            f.failure = Some(StartFailure::ModelNotFound {
                model: f.model.clone().unwrap_or_else(|| "(the model)".into()),
                network: true,
            });
        }
        // The free-memory message states the total and util the run asked for.
        Some(StartFailure::FreeMemoryBelowUtil {
            total_gib, util, ..
        }) => {
            if f.total.is_none() {
                f.total = Some(Logged {
                    value: *total_gib,
                    text: super::diagnose::py_round2(*total_gib),
                });
            }
            f.util = f.util.or(Some(*util));
        }
        _ => {}
    }
    if f.failure.is_none() && f.style.is_none() && f.kv.is_none() && f.blocks.is_none() {
        return Err(Error::Request(format!(
            "{name} is not a vLLM startup log: none of its {} lines is a memory line vLLM \
             prints (\"Memory profiling results\", \"the rest of the memory reserved for KV \
             Cache\", \"Available KV cache memory\", \"# GPU blocks\")",
            f.lines
        )));
    }
    sane(name, &f)?;
    Ok(f)
}

/// Numbers no GPU and no vLLM produce.
fn sane(name: &str, f: &LogFacts) -> Result<()> {
    // "line N: " of the fact `key`, where the log stated it.
    let at = |key: &str| {
        f.at.get(key)
            .map_or(String::new(), |n| format!("line {n}: "))
    };
    let on = |key: &str| {
        f.at.get(key)
            .map_or(String::new(), |n| format!(" (line {n})"))
    };
    let bad = |key: &str, what: String| {
        Err(Error::Request(format!(
            "{name}: {}{what}: not a number a vLLM startup prints",
            at(key)
        )))
    };
    let total = f.total.as_ref().map(|t| t.value);
    if let Some(t) = total {
        if !(0.5..=4096.0).contains(&t) {
            return bad("total_gpu_memory", format!("total_gpu_memory {t} GiB"));
        }
    }
    if let Some(u) = f.util {
        if !(u > 0.0 && u <= 1.0) {
            return bad(
                "gpu_memory_utilization",
                format!("gpu_memory_utilization {u:?}"),
            );
        }
    }
    for (what, key, v) in [
        ("weights", "weights", &f.weights),
        ("peak torch memory", "peak_torch_memory", &f.peak_torch),
        ("activation", "activation", &f.activation),
        ("non-torch memory", "non_torch_memory", &f.non_torch),
        ("KV cache", "kv_cache_size", &f.kv),
    ] {
        if let Some(v) = v {
            let over = total.is_some_and(|t| v.value > t) || v.value > 4096.0;
            if over {
                return bad(
                    key,
                    format!(
                        "{what} {} GiB{}",
                        v.text,
                        total
                            .map(|t| format!(" on a {t} GiB GPU"))
                            .unwrap_or_default()
                    ),
                );
            }
        }
    }
    // vLLM sizes the KV cache inside util × total (V1: the requested memory), unless
    // --kv-cache-memory gave it; a log's KV cache past that contradicts its own util.
    if let (Some(kv), None) = (&f.kv, f.kv_cache_memory) {
        let budget = match (&f.requested, total, f.util) {
            (Some(r), _, _) => Some((
                r.value,
                format!("the requested {} GiB{}", r.text, on("requested memory")),
            )),
            (None, Some(t), Some(u)) => Some((
                t * u,
                format!(
                    "gpu_memory_utilization {u:?} of the {t} GiB GPU{}",
                    on("gpu_memory_utilization")
                ),
            )),
            _ => None,
        };
        // Each figure is printed to 0.01 GiB.
        if let Some((budget, what)) = budget.filter(|(b, _)| kv.value > b + 0.02) {
            return Err(Error::Request(format!(
                "{name}: {}KV cache {} GiB is more than {what} allows ({budget:.2} GiB): the log \
                 contradicts itself",
                at("kv_cache_size"),
                kv.text
            )));
        }
    }
    if let Some(tp) = f.tp {
        if tp > super::request::MAX_TP {
            return bad("tensor_parallel_size", format!("tensor_parallel_size {tp}"));
        }
    }
    if let Some(pp) = f.pp {
        if pp > super::request::MAX_TP {
            return bad(
                "pipeline_parallel_size",
                format!("pipeline_parallel_size {pp}"),
            );
        }
    }
    if let Some(len) = f.max_model_len {
        if len > crate::base::limits::MAX_MODEL_LEN {
            return bad("max_model_len", format!("max_model_len {len}"));
        }
    }
    Ok(())
}

/// The release a log's version names; without one, the release its memory lines' format
/// belongs to (an assumption, said).
pub fn release_of(f: &LogFacts, assumptions: &mut Vec<String>) -> Result<String> {
    if let Some(v) = &f.release {
        if let Ok(r) = super::vllm::release(v) {
            return Ok(r.name.to_string());
        }
        // A patch or dev build of a modelled release ("0.19.1", "0.10.1.1", "0.7.3.dev12"):
        // the release its major.minor names, said.
        let parts: Vec<&str> = v.split(['.', '+']).collect();
        for n in (2..parts.len()).rev() {
            if let Ok(r) = super::vllm::release(&parts[..n].join(".")) {
                assumptions.push(format!(
                    "vLLM {}: the log's {v} is not modelled by itself; its series is",
                    r.name
                ));
                return Ok(r.name.to_string());
            }
        }
        let at =
            f.at.get("vLLM version")
                .map_or(String::new(), |n| format!("line {n}: "));
        return Err(Error::Request(format!(
            "{at}the log is vLLM {v}, which vramscope does not reproduce (it does {})",
            super::vllm::names().join(", ")
        )));
    }
    let (name, why) = match f.style {
        Some(Style::MemoryProfilingResults) => ("0.6.4", "its single memory line is 0.6.4's"),
        Some(Style::InstanceCanUse) => ("0.6.5", "its memory lines are 0.6.5-0.8's"),
        _ => ("0.19", "its lines are V1's"),
    };
    assumptions.push(format!(
        "vLLM {name}: the log names no version, and {why} (--vllm to say which)"
    ));
    Ok(name.to_string())
}

/// Totals closer than this to the log's cannot tell two GPUs apart: the log's two decimals
/// and an estimated total's error are both about this size.
const SAME_TOTAL_GIB: f64 = 0.05;

/// The simulated GPU whose total is nearest the log's, and the others as near (within
/// `SAME_TOTAL_GIB` of it). Among those, a preset whose total was measured (a vLLM log, a
/// driver's `cudaMemGetInfo`) goes before one whose total is estimated from nvidia-smi: an
/// H100 SXM's measured 79.22 GiB before an H100 PCIe's estimated 79.21 for a 79.19 GiB log.
fn device_of(total_gib: f64) -> (&'static str, Vec<&'static str>) {
    use crate::device::presets::SimPreset;
    let d = |p: &SimPreset| (p.total_bytes as f64 / GIB - total_gib).abs();
    let mut all: Vec<&SimPreset> = crate::device::presets::SIM_PRESETS
        .iter()
        .filter(|p| !p.id.starts_with("mock") && p.superseded_by.is_none())
        .collect();
    all.sort_by(|a, b| d(a).total_cmp(&d(b)));
    let Some(best) = all.first().map(|p| d(p)) else {
        return ("h100-sxm", Vec::new());
    };
    let mut near: Vec<&SimPreset> = all
        .into_iter()
        .filter(|p| d(p) <= best + SAME_TOTAL_GIB)
        .collect();
    // Stable: measured totals first, each group nearest first.
    near.sort_by_key(|p| !p.total_measured);
    let mut ids = near.iter().map(|p| p.id);
    let first = ids.next().unwrap_or("h100-sxm");
    (first, ids.collect())
}

/// The simulated GPU whose name is `device_name` as vLLM spells it in a config file's name
/// (`torch.cuda.get_device_name()`, spaces as underscores; every H200 as `NVIDIA_H200`): the
/// preset's name before " (simulated…)". The current preset where an older one has the same name.
fn preset_named(device_name: &str) -> Option<&'static str> {
    let wanted = device_name.replace('_', " ");
    crate::device::presets::SIM_PRESETS
        .iter()
        .filter(|p| !p.id.starts_with("mock") && p.superseded_by.is_none())
        .find(|p| p.name.split(" (").next() == Some(wanted.as_str()))
        .map(|p| p.id)
}

/// What the explain run is given besides the log.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--model`: where the log's model is, when it is not on disk under its name.
    pub model: Option<String>,
    /// `--device sim:PRESET`: the GPU, when the total is not enough to tell.
    pub device: Option<String>,
    pub vllm: Option<String>,
}

/// The profile request a log describes, and the assumptions made for what it does not say.
pub fn request_of(f: &LogFacts, o: &Overrides) -> Result<(ProfileRequest, Vec<String>)> {
    let mut assumptions = Vec::new();
    let vllm = match &o.vllm {
        Some(v) => super::vllm::release(v)?.name.to_string(),
        None => release_of(f, &mut assumptions)?,
    };
    let release = super::vllm::release(&vllm)?;
    let v1 = matches!(release.engine, super::vllm::Engine::V1 { .. });
    let named = o.model.clone().or(f.model.clone()).ok_or_else(|| {
        Error::Request(
            "the log names no model (no \"Initializing … engine\" line): pass --model".into(),
        )
    })?;
    let (model, note) = super::vllm_args::resolve_model(&named)?;
    assumptions.extend(note);
    let model = ModelSource::parse(&model)?;
    // Errors name the log's line that states the setting, not a flag.
    let named = |key: &str| match f.at.get(key) {
        Some(n) => format!("line {n}: {key}"),
        None => key.to_string(),
    };
    let quant: Quant = super::vllm_args::quant_named(
        &model,
        (f.dtype.as_deref(), &named("dtype")),
        (f.quantization.as_deref(), &named("quantization")),
    )?;
    // The total: stated (V0, V1's DEBUG line), else V1's requested memory over util.
    let total_gib = match (&f.total, &f.requested, f.util) {
        (Some(t), _, _) => t.value,
        (None, Some(r), Some(u)) => {
            assumptions.push(format!(
                "GPU total {:.2} GiB: the requested {} GiB over util {u} (the log's DEBUG \
                 \"Free memory on device\" line would say it exactly)",
                r.value / u,
                r.text
            ));
            r.value / u
        }
        _ => {
            return Err(Error::Request(
                "the log states no GPU total (no total_gpu_memory, no requested memory)".into(),
            ))
        }
    };
    let named_gpu = f
        .device_name
        .as_ref()
        .and_then(|(d, n)| preset_named(d).map(|p| (p, d, n)));
    let device = match (&o.device, named_gpu) {
        (Some(d), _) => DeviceSpec::parse(d)?,
        (None, Some((p, d, n))) => {
            assumptions.push(format!(
                "GPU sim:{p}: line {n} names it (device_name={d}, the fused MoE config vLLM \
                 looked for; the total is the log's)"
            ));
            DeviceSpec::parse(&format!("sim:{p}:dry"))?
        }
        (None, None) => {
            if let Some((d, n)) = &f.device_name {
                assumptions.push(format!(
                    "line {n} names the GPU device_name={d}, which is no preset's: the total \
                     picks one"
                ));
            }
            let (name, as_near) = device_of(total_gib);
            let others = if as_near.is_empty() {
                String::new()
            } else {
                format!(
                    "; as near: {} (another board, and another topology under --tp)",
                    as_near
                        .iter()
                        .map(|p| format!("sim:{p}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            assumptions.push(format!(
                "GPU sim:{name}: the preset nearest the log's {total_gib:.2} GiB, a measured total \
                 before an estimated one (its context and cuBLAS workspace; the total is the \
                 log's){others}: --device sim:PRESET to say which"
            ));
            DeviceSpec::parse(&format!("sim:{name}:dry"))?
        }
    }
    .with_total(Some((total_gib * GIB).round() as u64))?;
    // The topology the custom all-reduce reported, where the device is simulated.
    let device = match (&f.topology, &device) {
        (Some((t, n)), DeviceSpec::Sim { .. }) => {
            assumptions.push(format!(
                "topology {}: line {n} (the custom all-reduce's check)",
                t.name()
            ));
            device.with_topology(Some(*t))?
        }
        _ => device,
    };
    let mut default = |what: &str, value: String| {
        assumptions.push(format!(
            "{what} {value}: the release's default (the log does not say)"
        ));
    };
    let util = f.util.unwrap_or_else(|| {
        default("gpu_memory_utilization", "0.9".into());
        0.9
    });
    let tp = f.tp.unwrap_or(1);
    let pp = f.pp.unwrap_or(1);
    let max_model_len = f.max_model_len.unwrap_or_else(|| {
        default(
            "max_model_len",
            "the model's max_position_embeddings".into(),
        );
        0
    });
    if f.max_num_seqs.is_none() {
        default(
            "max_num_seqs",
            if v1 {
                "by GPU and entry point".into()
            } else {
                "256".into()
            },
        );
    }
    let kv_cache_dtype = match f.kv_cache_dtype.as_deref() {
        None | Some("auto") => KvCacheDtype::Auto,
        Some(d) => KvCacheDtype::parse(d).map_err(|_| {
            Error::Request(format!(
                "{} '{d}': expected auto, fp8, fp8_e4m3 or fp8_e5m2",
                named("kv_cache_dtype")
            ))
        })?,
    };
    let req = ProfileRequest {
        model,
        quant,
        device,
        tokens: f.max_num_batched_tokens.unwrap_or(0),
        seqs: f.max_num_seqs.unwrap_or(0),
        util,
        block_size: f.block_size.unwrap_or(16),
        max_model_len,
        tp,
        pp,
        dp: f.dp.unwrap_or(1),
        enable_expert_parallel: f.enable_expert_parallel.unwrap_or(false),
        vllm,
        chunked_prefill: if v1 { None } else { f.chunked_prefill },
        enforce_eager: f.enforce_eager.unwrap_or(false),
        kv_cache_dtype,
        kv_cache_memory: f.kv_cache_memory.filter(|_| v1),
        verify: false,
        ..ProfileRequest::default()
    };
    req.validate().map_err(|e| in_log_terms(e, f))?;
    Ok((req, assumptions))
}

/// The request's flags and the log's names for the same settings.
const LOG_NAMES: &[(&str, &str)] = &[
    ("--max-num-batched-tokens", "max_num_batched_tokens"),
    ("--max-num-seqs", "max_num_seqs"),
    ("--max-model-len", "max_model_len"),
    ("--kv-cache-memory", "kv_cache_memory_bytes"),
    ("--kv-cache-dtype", "kv_cache_dtype"),
    ("--block-size", "block_size"),
    ("--dtype", "dtype"),
    ("--util", "gpu_memory_utilization"),
    ("--tp", "tensor_parallel_size"),
    ("--pp", "pipeline_parallel_size"),
    ("--data-parallel-size", "data_parallel_size"),
    ("--enable-expert-parallel", "enable_expert_parallel"),
];

/// A refusal of the request a log describes, in the log's terms: each flag named by the
/// setting the log prints, and the lines that state them first (`explain` takes no such
/// flags, so naming them would point the user at something they never gave).
pub fn in_log_terms(e: Error, f: &LogFacts) -> Error {
    let Error::Request(mut m) = e else {
        return e;
    };
    // A refusal that names a release names the log's, and gives no advice to pass a flag
    // explain does not take ("with --vllm 0.19 … ; use --vllm 0.6.4").
    if let Some(r) = &f.release {
        for (from, to) in [("with --vllm ", "under vLLM "), ("--vllm ", "vLLM ")] {
            if let Some(i) = m.find(from) {
                let tail: String = m[i + from.len()..]
                    .chars()
                    .take_while(|c| !c.is_whitespace() && *c != ':' && *c != ',')
                    .collect();
                if !tail.is_empty() && r.starts_with(&tail) {
                    m = format!(
                        "{}{to}{tail} (the release the log ran){}",
                        &m[..i],
                        &m[i + from.len() + tail.len()..]
                    );
                }
            }
        }
        if let Some(i) = m.find("; use --vllm ") {
            m.truncate(i);
        }
    }
    let mut lines = Vec::new();
    for (flag, key) in LOG_NAMES {
        let mut from = 0;
        while let Some(i) = m[from..].find(flag).map(|i| from + i) {
            let end = i + flag.len();
            let whole = !m[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-');
            if whole {
                m.replace_range(i..end, key);
                lines.extend(f.at.get(key).copied());
                from = i + key.len();
            } else {
                from = end;
            }
        }
    }
    lines.sort();
    lines.dedup();
    let lines: Vec<String> = lines.iter().map(|n| format!("line {n}")).collect();
    if lines.is_empty() {
        Error::Request(m)
    } else {
        Error::Request(format!("{}: {m}", lines.join(", ")))
    }
}

/// One term: vLLM's logged value (as printed) and vramscope's, in GiB (or a count).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub term: &'static str,
    pub logged: Option<Logged>,
    pub ours: Option<f64>,
    /// GiB rows print two decimals; counts none.
    pub gib: bool,
}

impl Row {
    /// vramscope − vLLM, relative to vLLM's.
    pub fn relative(&self) -> Option<f64> {
        let (l, o) = (self.logged.as_ref()?.value, self.ours?);
        (l != 0.0).then(|| o / l - 1.0)
    }

    fn with_unit(&self, v: String) -> String {
        if self.gib {
            format!("{v} GiB")
        } else if self.term == "max concurrency" {
            format!("{v}x")
        } else {
            v
        }
    }

    /// The log's value as it printed it, with its unit ("—" when the log does not state it).
    pub fn logged_text(&self) -> String {
        self.logged
            .as_ref()
            .map_or("—".into(), |l| self.with_unit(l.text.clone()))
    }

    /// vramscope's value, in the log's precision.
    pub fn ours_text(&self) -> String {
        self.ours.map_or("—".into(), |v| {
            if self.gib || self.term == "max concurrency" {
                self.with_unit(format!("{v:.2}"))
            } else {
                crate::base::units::thousands(v as u64)
            }
        })
    }

    /// vramscope against the log, in percent ("" when either is missing).
    pub fn difference_text(&self) -> String {
        self.relative()
            .map_or(String::new(), |d| format!("{:+.1} %", d * 100.0))
    }
}

/// The comparison of a log with vramscope's run of it.
#[derive(Clone, Debug)]
pub struct Explanation {
    pub rows: Vec<Row>,
    /// The largest difference, in words.
    pub largest: Option<String>,
    /// With pipeline parallel, each stage's answer beside the log's lines for it.
    pub stages: Vec<StageRow>,
}

/// One pipeline stage: its layers, and its weights and KV cache, logged and vramscope's
/// (GiB), with the KV blocks vramscope's stage grants before the engine's minimum.
#[derive(Clone, Debug, PartialEq)]
pub struct StageRow {
    pub stage: u32,
    pub first_layer: u32,
    pub end_layer: u32,
    pub weights: Row,
    pub kv: Row,
    pub kv_blocks: u64,
    /// This stage's blocks are the engine's (the fewest over every rank).
    pub binding: bool,
}

/// Term by term, and the largest difference in words.
pub fn compare(f: &LogFacts, r: &Report) -> Explanation {
    let Some(a) = r.vllm_answer() else {
        return Explanation {
            rows: Vec::new(),
            largest: None,
            stages: Vec::new(),
        };
    };
    // With pipeline parallel the top-level report is one stage's (the binding one): its
    // lines are held against the log's lines of the same stage where the log has them.
    let own_stage = r.stage.map(|st| st.stage);
    let logged_weights = own_stage
        .and_then(|st| f.stage_weights.get(&st).cloned())
        .or(f.weights.clone());
    let logged_kv = own_stage
        .and_then(|st| f.stage_kv.get(&st).cloned())
        .or(f.kv.clone());
    let gib = |b: f64| b / GIB;
    let fm = a.formula;
    let (tokens, concurrency) = r.kv_tokens_and_concurrency(&a);
    let mut rows = vec![Row {
        term: "weights",
        logged: logged_weights,
        ours: Some(gib(r.weights_bytes as f64)),
        gib: true,
    }];
    if f.peak_torch.is_some() {
        rows.push(Row {
            term: "peak torch memory",
            logged: f.peak_torch.clone(),
            ours: Some(gib(fm.torch_peak_bytes as f64)),
            gib: true,
        });
    } else {
        rows.push(Row {
            term: "activation",
            logged: f.activation.clone(),
            ours: Some(gib(fm.torch_peak_bytes as f64)),
            gib: true,
        });
    }
    rows.push(Row {
        term: "non-torch",
        logged: f.non_torch.clone(),
        ours: Some(gib(fm.non_torch_bytes as f64)),
        gib: true,
    });
    if let Some(g) = &r.graphs {
        rows.push(Row {
            term: "CUDA graphs, estimate",
            logged: f.graph_estimate.clone(),
            ours: g.estimate.as_ref().map(|e| gib(e.total_bytes as f64)),
            gib: true,
        });
        rows.push(Row {
            term: "CUDA graphs, took",
            logged: f.graph_took.clone(),
            ours: Some(gib(g.took_bytes as f64)),
            gib: true,
        });
    }
    rows.push(Row {
        term: "KV cache",
        logged: logged_kv,
        ours: Some(gib(a.kv_bytes as f64)),
        gib: true,
    });
    let blocks = r.vllm_engine_blocks();
    if matches!(a.release.engine, super::vllm::Engine::V1 { .. }) {
        rows.push(Row {
            term: "KV tokens",
            logged: f.tokens.map(|t| Logged {
                value: t as f64,
                text: crate::base::units::thousands(t),
            }),
            ours: Some(tokens as f64),
            gib: false,
        });
    } else {
        rows.push(Row {
            term: "KV blocks",
            logged: f.blocks.map(|b| Logged {
                value: b as f64,
                text: b.to_string(),
            }),
            ours: blocks.map(|b| b as f64),
            gib: false,
        });
    }
    rows.push(Row {
        term: "max concurrency",
        logged: f.concurrency.clone(),
        ours: Some(concurrency),
        gib: false,
    });
    // The largest difference among the terms the budget subtracts.
    let largest = rows
        .iter()
        .filter(|row| row.gib && row.term != "KV cache")
        .filter_map(|row| Some((row, row.ours? - row.logged.as_ref()?.value)))
        .max_by(|x, y| x.1.abs().total_cmp(&y.1.abs()))
        .filter(|(_, d)| d.abs() >= 0.01)
        .map(|(row, d)| match f.unmodelled.is_empty() {
            true => words(row, d, r),
            // A setting the run leaves out changes memory: the difference is not put down to
            // anything else.
            false => format!(
                "{} ({:+.2} GiB): the log sets {}, which vramscope does not model; its memory \
                 is not in vramscope's numbers, so this difference is not put down to anything \
                 else until it is",
                row.term,
                d,
                f.unmodelled
                    .iter()
                    .map(|u| u.split(" (").next().unwrap_or(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    let stages = stage_rows(f, r);
    Explanation {
        rows,
        largest,
        stages,
    }
}

/// Each pipeline stage's answer (its first tensor-parallel rank's) beside the log's lines for
/// that stage; empty without pipeline parallel.
fn stage_rows(f: &LogFacts, r: &Report) -> Vec<StageRow> {
    let engine = r.vllm_engine_blocks();
    let gib = |b: f64| b / GIB;
    r.ranks
        .iter()
        .filter_map(|k| Some((k, k.stage?)))
        .filter(|(_, st)| st.tp_rank == 0)
        .filter_map(|(k, st)| {
            let a = k.vllm_answer()?;
            Some(StageRow {
                stage: st.stage,
                first_layer: st.first_layer,
                end_layer: st.end_layer,
                weights: Row {
                    term: "weights",
                    logged: f.stage_weights.get(&st.stage).cloned(),
                    ours: Some(gib(k.weights_bytes as f64)),
                    gib: true,
                },
                kv: Row {
                    term: "KV cache",
                    logged: f.stage_kv.get(&st.stage).cloned(),
                    ours: Some(gib(a.kv_bytes as f64)),
                    gib: true,
                },
                kv_blocks: a.kv_blocks,
                binding: engine == Some(a.kv_blocks),
            })
        })
        .collect()
}

fn words(row: &Row, diff: f64, r: &Report) -> String {
    let logged = row
        .logged
        .as_ref()
        .map_or(String::new(), |l| l.text.clone());
    let ours = row.ours.unwrap_or(0.0);
    let tp = r.settings.tp;
    let what = match row.term {
        "non-torch" if tp > 1 => format!(
            "your log's non-torch {logged} GiB is, on {tp} GPUs, mostly NCCL's buffers and the \
             custom all-reduce's; vramscope's NCCL model on {} gives {ours:.2} GiB. NCCL's memory \
             follows the links and its version (on a PCIe pair it is far below two NVLink \
             GPUs'): --topology nvlink, pcie or pcie-no-p2p if yours differ",
            r.settings.device
        ),
        "non-torch" if diff < 0.0 => format!(
            "your log's non-torch {logged} GiB against vramscope's {ours:.2} GiB: memory outside \
             PyTorch that this release counts (the CUDA context's growth, kernels the first pass \
             loads, another process on the GPU); vramscope holds only what its own pass made \
             (--outside-before SIZE adds another process)"
        ),
        "non-torch" => format!(
            "vramscope's non-torch {ours:.2} GiB against your log's {logged} GiB: the simulated \
             {} takes its own CUDA context and cuBLAS workspace, which your GPU and driver size \
             differently; --device sim:PRESET nearer your GPU",
            r.settings.device
        ),
        "activation" | "peak torch memory" => format!(
            "the profile pass's peak: {logged} GiB logged, {ours:.2} GiB here. A lower log \
             usually means a smaller profile batch (--max-num-seqs, --max-num-batched-tokens); \
             a higher one, a kernel or sampler path this model takes in your build"
        ),
        "weights" => format!(
            "the weights: {logged} GiB logged, {ours:.2} GiB here: another checkpoint (tied \
             embeddings, a vision tower), dtype or quantization than the run's {}",
            r.quant.label()
        ),
        _ => format!(
            "the CUDA graphs: {logged} GiB logged, {ours:.2} GiB here; vLLM captures pieces \
             torch.compile made, vramscope its own eager kernels (docs/vllm-versions.md)"
        ),
    };
    format!("{} ({:+.2} GiB): {what}", row.term, diff)
}

/// What would change the answer: the same run with one setting moved.
pub fn variants(req: &ProfileRequest) -> Vec<(String, ProfileRequest)> {
    let mut out = Vec::new();
    let util = if req.util <= 0.94 {
        req.util + 0.05
    } else {
        req.util - 0.05
    };
    out.push((
        format!("--gpu-memory-utilization {util:.2}"),
        ProfileRequest {
            util,
            ..req.clone()
        },
    ));
    if req.kv_cache_dtype == KvCacheDtype::Auto {
        out.push((
            "--kv-cache-dtype fp8".to_string(),
            ProfileRequest {
                kv_cache_dtype: KvCacheDtype::Fp8,
                ..req.clone()
            },
        ));
    }
    if req.max_model_len >= 2 {
        let half = req.max_model_len / 2;
        out.push((
            format!("--max-model-len {half}"),
            ProfileRequest {
                max_model_len: half,
                ..req.clone()
            },
        ));
    }
    if matches!(req.quant, Quant::F16 | Quant::BF16) {
        out.push((
            "--quantization fp8".to_string(),
            ProfileRequest {
                quant: Quant::Fp8,
                ..req.clone()
            },
        ));
    }
    if req.tp * 2 * req.pp <= super::request::MAX_TP && req.device.is_sim() {
        out.push((
            format!("--tensor-parallel-size {}", req.tp * 2),
            ProfileRequest {
                tp: req.tp * 2,
                ..req.clone()
            },
        ));
    }
    // The other topology: what NCCL and the custom all-reduce would take over NVLink where
    // the run assumed PCIe, and over PCIe where it assumed NVLink or no peer-to-peer.
    if let (
        true,
        DeviceSpec::Sim {
            preset, topology, ..
        },
    ) = (req.tp >= 2, &req.device)
    {
        use crate::device::nccl_model::Topology;
        let current = topology.or_else(|| crate::device::presets::find(preset).map(|p| p.topology));
        let other = match current {
            Some(Topology::Pcie) => Some(Topology::Nvlink),
            Some(Topology::Nvlink | Topology::PcieNoP2p) => Some(Topology::Pcie),
            None => None,
        };
        if let Some(device) = other.and_then(|t| req.device.clone().with_topology(Some(t)).ok()) {
            out.push((
                format!("--topology {}", other.map_or("", |t| t.name())),
                ProfileRequest {
                    device,
                    ..req.clone()
                },
            ));
        }
    }
    if req.tp >= 2 && req.device.is_sim() {
        // The same GPUs as stages: half the ranks per stage, twice the stages (a given
        // partition no longer fits, so vLLM's own is taken).
        out.push((
            format!(
                "--tensor-parallel-size {} --pipeline-parallel-size {}",
                req.tp / 2,
                req.pp * 2
            ),
            ProfileRequest {
                tp: req.tp / 2,
                pp: req.pp * 2,
                pp_layer_partition: None,
                ..req.clone()
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 79.19 GiB log (Q1's H100) is as near the H100 PCIe's estimated 79.21 GiB as the SXM
    /// board's measured 79.22: the measured one is taken, the other named; an H200's total
    /// has no rival.
    #[test]
    fn a_total_two_boards_share_takes_the_measured_one_and_names_the_other() {
        assert_eq!(device_of(79.19), ("h100-sxm", vec!["h100-pcie"]));
        let (h200, rivals) = device_of(139.81);
        assert_eq!(h200, "h200");
        assert!(rivals.is_empty(), "{rivals:?}");
    }

    #[test]
    fn numbers_and_fields_read_as_printed() {
        let l = "INFO GPU KV cache size: 476,016 tokens";
        assert_eq!(
            count_after::<u64>(l, "GPU KV cache size: ", 1).unwrap(),
            Some(476_016)
        );
        let line = "config: model='meta-llama/Llama-3.1-8B', dtype=torch.bfloat16, max_seq_len=20000, quantization=None";
        assert_eq!(field(line, "model="), Some("meta-llama/Llama-3.1-8B"));
        assert_eq!(field(line, "dtype="), Some("torch.bfloat16"));
        assert_eq!(field(line, "max_seq_len="), Some("20000"));
    }

    #[test]
    fn a_patch_release_runs_as_its_series() {
        let f = LogFacts {
            release: Some("0.19.1".into()),
            ..LogFacts::default()
        };
        let mut a = Vec::new();
        assert_eq!(release_of(&f, &mut a).unwrap(), "0.19");
        assert!(a[0].contains("0.19.1"), "{a:?}");
        let f = LogFacts {
            release: Some("0.34.0".into()),
            ..LogFacts::default()
        };
        assert!(release_of(&f, &mut a).is_err());
        // 0.33.0 is a row of its own.
        let f = LogFacts {
            release: Some("0.33.0".into()),
            ..LogFacts::default()
        };
        assert_eq!(release_of(&f, &mut a).unwrap(), "0.33");
    }

    #[test]
    fn a_request_refusal_is_said_in_the_logs_names_and_lines() {
        let mut f = LogFacts::default();
        f.at.insert("max_num_seqs", 12);
        f.at.insert("max_num_batched_tokens", 3);
        let e = in_log_terms(
            Error::Request(
                "--max-num-seqs 512 must be between 1 and --max-num-batched-tokens (256)".into(),
            ),
            &f,
        );
        assert_eq!(
            e.to_string(),
            "invalid setting: line 3, line 12: max_num_seqs 512 must be between 1 and \
             max_num_batched_tokens (256)"
        );
        // A refusal naming the release names the log's, without advice to pass --vllm.
        let g = LogFacts {
            release: Some("0.19.0".into()),
            ..LogFacts::default()
        };
        let e = in_log_terms(
            Error::Request(
                "an AWQ or GPTQ checkpoint with --vllm 0.19: vramscope reproduces vLLM 0.6.4's \
                 Marlin repack; use --vllm 0.6.4"
                    .into(),
            ),
            &g,
        );
        assert_eq!(
            e.to_string(),
            "invalid setting: an AWQ or GPTQ checkpoint under vLLM 0.19 (the release the log \
             ran): vramscope reproduces vLLM 0.6.4's Marlin repack"
        );
        // A flag that only starts like one of the table's is left alone.
        let e = in_log_terms(Error::Request("--tpx 2".into()), &f);
        assert_eq!(e.to_string(), "invalid setting: --tpx 2");
    }

    /// V1's INFO line of the profile batch is read (an `LLM`-class start's 8192 on a small
    /// GPU, where `vllm serve` would take 2048); cut, or against the user's value, refused.
    #[test]
    fn the_chunked_prefill_line_states_the_batch() {
        let line = "INFO 12-05 10:00:00 [scheduler.py:253] Chunked prefill is enabled with max_num_batched_tokens=8192.";
        let kv = "INFO [gpu_worker.py:436] Available KV cache memory: 7.93 GiB";
        let f = read_log("x.log", format!("{line}\n{kv}\n").as_bytes()).unwrap();
        assert_eq!(f.max_num_batched_tokens, Some(8192));
        let e = read_log("x.log", format!("{}\n", &line[..line.len() - 1]).as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1 is cut short"), "{e}");
        let both = format!(
            "INFO [api_server.py] non-default args: {{'max_num_batched_tokens': 4096}}\n{line}\n"
        );
        let e = read_log("x.log", both.as_bytes()).unwrap_err().to_string();
        assert!(
            e.contains("max_num_batched_tokens") && e.contains("4096") && e.contains("8192"),
            "{e}"
        );
    }

    #[test]
    fn a_cut_line_and_noise_are_refused() {
        let cut = "INFO worker.py:233] Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.";
        let e = read_log("x.log", cut.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("line 1 is cut short"), "{e}");
        let e = read_log("x.log", "hello\nworld\n".as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a vLLM startup log"), "{e}");
    }
}

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
    pub lines: u64,
    pub recognised: u64,
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

    fn slot(self, f: &mut LogFacts) -> &mut Option<Logged> {
        match self {
            Field::Total => &mut f.total,
            Field::Requested => &mut f.requested,
            Field::Weights => &mut f.weights,
            Field::LoadedWeights => &mut f.loaded_weights,
            Field::PeakTorch => &mut f.peak_torch,
            Field::Activation => &mut f.activation,
            Field::NonTorch => &mut f.non_torch,
            Field::Kv => &mut f.kv,
        }
    }
}

struct Reader {
    facts: LogFacts,
    /// Whether a memory fact came from rank 0's own line (no worker prefix).
    from_driver: std::collections::HashSet<&'static str>,
}

impl Reader {
    fn cut(line_no: u64, what: &str) -> Error {
        Error::Request(format!(
            "line {line_no} is cut short: its {what} is incomplete (a truncated log?)"
        ))
    }

    /// Sets memory facts; a worker's line fills only what rank 0 did not say, and rank 0
    /// saying two different values means two startups in one log.
    fn set(&mut self, items: &[(Field, Logged)], worker: bool, line_no: u64) -> Result<()> {
        for (field, v) in items {
            let key = field.name();
            let driver_had = self.from_driver.contains(key);
            let cur = field.slot(&mut self.facts);
            match (cur.as_ref(), worker) {
                (None, _) => *cur = Some(v.clone()),
                (Some(_), true) => {}
                (Some(_), false) if !driver_had => *cur = Some(v.clone()),
                (Some(old), false) => {
                    if old.text != v.text {
                        return Err(Error::Request(format!(
                            "line {line_no}: {key} {} after {} earlier: the log holds two \
                             startups; keep one",
                            v.text, old.text
                        )));
                    }
                }
            }
            if !worker {
                self.from_driver.insert(key);
            }
        }
        Ok(())
    }

    fn same<T: PartialEq + std::fmt::Display + Clone>(
        slot: &mut Option<T>,
        v: T,
        what: &str,
        line_no: u64,
    ) -> Result<()> {
        match slot {
            Some(old) if *old != v => Err(Error::Request(format!(
                "line {line_no}: {what} {v}, but {old} earlier: the log holds two different \
                 instances; keep one"
            ))),
            _ => {
                *slot = Some(v);
                Ok(())
            }
        }
    }

    /// `same` for the utilization, shown as the shortest text that reads back exactly
    /// (`1e-300`, not three hundred zeros).
    fn same_util(slot: &mut Option<f64>, v: f64, line_no: u64) -> Result<()> {
        match slot {
            Some(old) if *old != v => Err(Error::Request(format!(
                "line {line_no}: gpu_memory_utilization {v:?}, but {old:?} earlier: the log \
                 holds two different instances; keep one"
            ))),
            _ => {
                *slot = Some(v);
                Ok(())
            }
        }
    }

    fn line(&mut self, line: &str, line_no: u64) -> Result<()> {
        let f = &mut self.facts;
        // TP workers prefix their lines: "(VllmWorkerProcess pid=…)", "(Worker_TP1 pid=…)".
        let worker = line.trim_start().starts_with('(')
            && (line.contains("Worker") || line.contains("pid="))
            && !line.contains("EngineCore");
        let mut known = true;
        if let Some(i) = line
            .find("LLM engine (v")
            .filter(|_| line.contains("Initializing"))
        {
            // llm_engine.py:250 (0.6.4), :235 (0.7.2); V1 v1/engine/core.py:106.
            let rest = &line[i + "LLM engine (v".len()..];
            let v = rest.split(')').next().unwrap_or("").to_string();
            Self::same(&mut f.release, v, "vLLM version", line_no)?;
            if let Some(m) = field(line, "model=") {
                Self::same(&mut f.model, m.to_string(), "model", line_no)?;
            }
            if let Some(d) = field(line, "dtype=") {
                f.dtype = Some(d.trim_start_matches("torch.").to_string());
            }
            if let Some(n) = count_field(line, "max_seq_len=", line_no)? {
                Self::same(&mut f.max_model_len, n, "max_model_len", line_no)?;
            }
            if let Some(n) = count_field(line, "tensor_parallel_size=", line_no)? {
                Self::same(&mut f.tp, n, "tensor_parallel_size", line_no)?;
            }
            if let Some(q) = field(line, "quantization=").filter(|q| *q != "None") {
                f.quantization = Some(q.to_string());
            }
            if let Some(b) = field(line, "enforce_eager=").and_then(parse_bool) {
                f.enforce_eager = Some(b);
            }
            if let Some(d) = field(line, "kv_cache_dtype=") {
                f.kv_cache_dtype = Some(d.to_string());
            }
            if let Some(b) = field(line, "chunked_prefill_enabled=")
                .or_else(|| field(line, "enable_chunked_prefill="))
                .and_then(|v| parse_bool(v.split_whitespace().next().unwrap_or(v)))
            {
                f.chunked_prefill = Some(b);
            }
        } else if let Some(i) = line.find("API server version ") {
            let v = line[i + "API server version ".len()..].trim().to_string();
            Self::same(&mut f.release, v, "vLLM version", line_no)?;
        } else if line.contains("non-default args: {") {
            // V1's api_server: a Python dict of what the user set.
            let key = |k: &str| format!("'{k}': ");
            if let Some(u) = ratio_after(line, &key("gpu_memory_utilization"), line_no)? {
                Self::same_util(&mut f.util, u.value, line_no)?;
            }
            if let Some(n) = count_after(line, &key("max_num_seqs"), line_no)? {
                f.max_num_seqs = Some(n);
            }
            if let Some(n) = count_after(line, &key("max_num_batched_tokens"), line_no)? {
                f.max_num_batched_tokens = Some(n);
            }
            if let Some(n) = count_after(line, &key("block_size"), line_no)? {
                f.block_size = Some(n);
            }
            if let Some(n) = count_after(line, &key("kv_cache_memory_bytes"), line_no)? {
                f.kv_cache_memory = Some(n);
            }
            if let Some(n) = count_after(line, &key("tensor_parallel_size"), line_no)? {
                Self::same(&mut f.tp, n, "tensor_parallel_size", line_no)?;
            }
            if let Some(n) = count_after(line, &key("max_model_len"), line_no)? {
                Self::same(&mut f.max_model_len, n, "max_model_len", line_no)?;
            }
            if line.contains("'enforce_eager': True") {
                f.enforce_eager = Some(true);
            }
            for k in ["model_tag", "model"] {
                if let Some(m) = field(line, &format!("'{k}': ")) {
                    let m = m.trim_matches(['\'', '}']).to_string();
                    Self::same(&mut f.model, m, "model", line_no)?;
                    break;
                }
            }
        } else if line.contains("Memory profiling results: total_gpu_memory=") {
            // 0.6.4 worker.py:233-244: every field, gpu_memory_utilization last.
            let g = |k: &str| size_after(line, &format!("{k}="), line_no);
            let (Some(total), Some(peak), Some(nt), Some(kv), Some(u)) = (
                g("total_gpu_memory")?,
                g("peak_torch_memory")?,
                g("non_torch_memory")?,
                g("kv_cache_size")?,
                ratio_after(line, "gpu_memory_utilization=", line_no)?,
            ) else {
                return Err(Self::cut(line_no, "memory profiling line"));
            };
            f.style = Some(Style::MemoryProfilingResults);
            Self::same_util(&mut f.util, u.value, line_no)?;
            self.set(
                &[
                    (Field::Total, total),
                    (Field::PeakTorch, peak),
                    (Field::NonTorch, nt),
                    (Field::Kv, kv),
                ],
                worker,
                line_no,
            )?;
        } else if line.contains("the current vLLM instance can use total_gpu_memory (") {
            // 0.6.5-0.8 worker.py: "… total_gpu_memory (T GiB) x gpu_memory_utilization (u) = …".
            let (Some(total), Some(u)) = (
                size_after(line, "total_gpu_memory (", line_no)?,
                ratio_after(line, "gpu_memory_utilization (", line_no)?,
            ) else {
                return Err(Self::cut(line_no, "memory line"));
            };
            f.style = Some(Style::InstanceCanUse);
            Self::same_util(&mut f.util, u.value, line_no)?;
            self.set(&[(Field::Total, total)], worker, line_no)?;
        } else if line.contains("model weights take ") && line.contains("reserved for KV Cache is")
        {
            let g = |k: &str| size_after(line, k, line_no);
            let (Some(w), Some(nt), Some(act), Some(kv)) = (
                g("model weights take ")?,
                g("non_torch_memory takes ")?,
                g("PyTorch activation peak memory takes ")?,
                g("reserved for KV Cache is ")?,
            ) else {
                return Err(Self::cut(line_no, "memory line"));
            };
            self.set(
                &[
                    (Field::Weights, w),
                    (Field::NonTorch, nt),
                    (Field::Activation, act),
                    (Field::Kv, kv),
                ],
                worker,
                line_no,
            )?;
        } else if let Some(w) = size_after(line, "Loading model weights took ", line_no)? {
            // V0 model_runner.py:1077 ("%.4f GB", GiB in fact).
            self.set(&[(Field::LoadedWeights, w)], worker, line_no)?;
        } else if let Some(w) = size_after(line, "Model loading took ", line_no)? {
            // V1 gpu_model_runner.py:4821.
            self.set(&[(Field::Weights, w)], worker, line_no)?;
        } else if line.contains("Requested memory: ") && line.contains("(util)") {
            // V1 gpu_worker.py DEBUG "Initial free memory: F GiB; Requested memory: u (util), R GiB".
            let (Some(u), Some(r)) = (
                ratio_after(line, "Requested memory: ", line_no)?,
                size_after(line, "(util), ", line_no)?,
            ) else {
                return Err(Self::cut(line_no, "requested-memory line"));
            };
            f.style = Some(Style::V1);
            Self::same_util(&mut f.util, u.value, line_no)?;
            self.set(&[(Field::Requested, r)], worker, line_no)?;
        } else if line.contains("torch peak memory increase: ") {
            // V1 DEBUG "Memory profiling takes …; torch peak memory increase: …; non-torch
            // forward increase memory: …; weights memory: …".
            let (Some(a), Some(nt)) = (
                size_after(line, "torch peak memory increase: ", line_no)?,
                size_after(line, "non-torch forward increase memory: ", line_no)?,
            ) else {
                return Err(Self::cut(line_no, "memory profiling line"));
            };
            f.style = Some(Style::V1);
            self.set(
                &[(Field::Activation, a), (Field::NonTorch, nt)],
                worker,
                line_no,
            )?;
            if let Some(w) = size_after(line, "weights memory: ", line_no)? {
                self.set(&[(Field::Weights, w)], worker, line_no)?;
            }
        } else if let Some(kv) = size_after(line, "Available KV cache memory: ", line_no)? {
            f.style = Some(Style::V1);
            self.set(&[(Field::Kv, kv)], worker, line_no)?;
        } else if let Some(tokens) = count_after(line, "GPU KV cache size: ", line_no)? {
            if f.tokens.is_none() || !worker {
                f.tokens = Some(tokens);
            }
        } else if let Some(key) = ["# GPU blocks: ", "# CUDA blocks: ", "# cuda blocks: "]
            .into_iter()
            .find(|k| line.contains(k))
        {
            let Some(blocks) = count_after(line, key, line_no)? else {
                return Err(Self::cut(line_no, "block count"));
            };
            Self::same(&mut f.blocks, blocks, "GPU blocks", line_no)?;
        } else if let Some(i) = line.find("Maximum concurrency for ") {
            let rest = &line[i..];
            let Some(x) = ratio_after(rest, "per request: ", line_no)? else {
                return Err(Self::cut(line_no, "concurrency line"));
            };
            f.concurrency = Some(x);
        } else if let Some(e) = size_after(line, "Estimated CUDA graph memory: ", line_no)? {
            f.graph_estimate = Some(e);
        } else if line.contains("Graph capturing finished in ") {
            let Some(t) = size_after(line, ", took ", line_no)? else {
                return Err(Self::cut(line_no, "graph capture line"));
            };
            f.graph_took = Some(t);
        } else if let Some(i) = line.find("Free memory on device (") {
            // V1 DEBUG "Free memory on device (F/T GiB) on startup".
            let rest = &line[i + "Free memory on device (".len()..];
            let total = match rest.split_once('/') {
                Some((_, t)) => log_numbers::size(t)
                    .map_err(|p| misread(line_no, "Free memory on device", p))?,
                None => None,
            };
            if let Some(t) = total {
                self.set(&[(Field::Total, t)], worker, line_no)?;
            }
        } else if line.contains("usage context") && line.contains(" max_num_") {
            // "Setting max_num_seqs to 1024 for OPENAI_API_SERVER usage context." (0.11.0
            // engine/arg_utils.py:1672-1681, DEBUG); later releases say "Defaulting".
            let n = |k: &str| count_after(line, &format!("max_num_{k} to "), line_no);
            if let Some(n) = n("seqs")? {
                f.max_num_seqs = f.max_num_seqs.or(Some(n));
            } else if let Some(n) = n("batched_tokens")? {
                f.max_num_batched_tokens = f.max_num_batched_tokens.or(Some(n));
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
    if f.style.is_none() && f.kv.is_none() && f.blocks.is_none() {
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
    let bad = |what: String| {
        Err(Error::Request(format!(
            "{name}: {what}: not a number a vLLM startup prints"
        )))
    };
    let total = f.total.as_ref().map(|t| t.value);
    if let Some(t) = total {
        if !(0.5..=4096.0).contains(&t) {
            return bad(format!("total_gpu_memory {t} GiB"));
        }
    }
    if let Some(u) = f.util {
        if !(u > 0.0 && u <= 1.0) {
            return bad(format!("gpu_memory_utilization {u:?}"));
        }
    }
    for (what, v) in [
        ("weights", &f.weights),
        ("peak torch memory", &f.peak_torch),
        ("activation", &f.activation),
        ("non-torch memory", &f.non_torch),
        ("KV cache", &f.kv),
    ] {
        if let Some(v) = v {
            let over = total.is_some_and(|t| v.value > t) || v.value > 4096.0;
            if over {
                return bad(format!(
                    "{what} {} GiB{}",
                    v.text,
                    total
                        .map(|t| format!(" on a {t} GiB GPU"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    // vLLM sizes the KV cache inside util × total (V1: the requested memory), unless
    // --kv-cache-memory gave it; a log's KV cache past that contradicts its own util.
    if let (Some(kv), None) = (&f.kv, f.kv_cache_memory) {
        let budget = match (&f.requested, total, f.util) {
            (Some(r), _, _) => Some((r.value, format!("the requested {} GiB", r.text))),
            (None, Some(t), Some(u)) => Some((
                t * u,
                format!("gpu_memory_utilization {u:?} of the {t} GiB GPU"),
            )),
            _ => None,
        };
        // Each figure is printed to 0.01 GiB.
        if let Some((budget, what)) = budget.filter(|(b, _)| kv.value > b + 0.02) {
            return Err(Error::Request(format!(
                "{name}: KV cache {} GiB is more than {what} allows ({budget:.2} GiB): the log \
                 contradicts itself",
                kv.text
            )));
        }
    }
    if let Some(tp) = f.tp {
        if tp == 0 || tp > super::request::MAX_TP {
            return bad(format!("tensor_parallel_size {tp}"));
        }
    }
    if let Some(len) = f.max_model_len {
        if len == 0 || len > crate::base::limits::MAX_MODEL_LEN {
            return bad(format!("max_model_len {len}"));
        }
    }
    Ok(())
}

/// The release a log's version names; without one, the release its memory lines' format
/// belongs to (an assumption, said).
fn release_of(f: &LogFacts, assumptions: &mut Vec<String>) -> Result<String> {
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
        return Err(Error::Request(format!(
            "the log is vLLM {v}, which vramscope does not reproduce (it does {})",
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

/// The simulated GPU whose total is nearest the log's.
fn device_of(total_gib: f64) -> &'static str {
    crate::device::presets::SIM_PRESETS
        .iter()
        .filter(|p| !p.id.starts_with("mock"))
        .min_by(|a, b| {
            let d = |p: &crate::device::presets::SimPreset| {
                (p.total_bytes as f64 / GIB - total_gib).abs()
            };
            d(a).total_cmp(&d(b))
        })
        .map_or("h100-80gb", |p| p.id)
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
    let quant: Quant =
        super::vllm_args::quant_of(&model, f.dtype.as_deref(), f.quantization.as_deref())?;
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
    let device = match &o.device {
        Some(d) => DeviceSpec::parse(d)?,
        None => {
            let name = device_of(total_gib);
            assumptions.push(format!(
                "GPU sim:{name}: the preset nearest the log's {total_gib:.2} GiB (its context and \
                 cuBLAS workspace; the total is the log's): --device sim:PRESET to say which"
            ));
            DeviceSpec::parse(&format!("sim:{name}:dry"))?
        }
    }
    .with_total(Some((total_gib * GIB).round() as u64))?;
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
        Some(d) => KvCacheDtype::parse(d)?,
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
        vllm,
        chunked_prefill: if v1 { None } else { f.chunked_prefill },
        enforce_eager: f.enforce_eager.unwrap_or(false),
        kv_cache_dtype,
        kv_cache_memory: f.kv_cache_memory.filter(|_| v1),
        verify: false,
        ..ProfileRequest::default()
    };
    req.validate()?;
    Ok((req, assumptions))
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
}

/// Term by term, and the largest difference in words.
pub fn compare(f: &LogFacts, r: &Report) -> Explanation {
    let Some(a) = r.vllm_answer() else {
        return Explanation {
            rows: Vec::new(),
            largest: None,
        };
    };
    let gib = |b: f64| b / GIB;
    let fm = a.formula;
    let (tokens, concurrency) = r.kv_tokens_and_concurrency(&a);
    let mut rows = vec![Row {
        term: "weights",
        logged: f.weights.clone(),
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
        logged: f.kv.clone(),
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
        .map(|(row, d)| words(row, d, r));
    Explanation { rows, largest }
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
    if req.tp * 2 <= 8 && req.device.is_sim() {
        out.push((
            format!("--tensor-parallel-size {}", req.tp * 2),
            ProfileRequest {
                tp: req.tp * 2,
                ..req.clone()
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
            release: Some("0.33.0".into()),
            ..LogFacts::default()
        };
        assert!(release_of(&f, &mut a).is_err());
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

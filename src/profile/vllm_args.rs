//! vLLM's own spellings: a pasted `vllm serve MODEL [flags…]` line read into vramscope's
//! `profile` flags, a Hugging Face model id found on disk (a folder, the hub cache) or as the
//! built-in preset of the same shapes, and `--dtype` / `--quantization` read as vLLM reads
//! them. Flags vramscope does not model are named, never dropped silently.

use std::path::{Path, PathBuf};

use crate::base::error::{Error, Result};
use crate::base::fsguard;
use crate::model::ModelSource;
use crate::quant::Quant;

/// A `vllm serve` line read into vramscope's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeLine {
    /// MODEL as the line gives it (a hub id or a path).
    pub model: String,
    /// The equivalent `vramscope profile` flags (without `--model`).
    pub args: Vec<String>,
    /// One line per flag that changes nothing vramscope models.
    pub warnings: Vec<String>,
    /// The settings of the line that change memory and that vramscope does not model, each
    /// as given with what it changes: said together in one "assumed" line, never dropped.
    pub unmodelled: Vec<String>,
    /// `--config-format` as given (`auto` when absent): `mistral` loads `params.json`, which
    /// for a Mistral 3 checkpoint is another model class (`mistral3_format_note`).
    pub config_format: String,
}

/// What vLLM runs for a Mistral 3 checkpoint (`Mistral3ForConditionalGeneration` in
/// config.json) that vramscope answers in its HF format. `--config-format mistral`, or `auto`
/// from 0.15 where the repository holds `params.json` (0.19 on: and `consolidated*.safetensors`;
/// transformers_utils/config.py 0.15.1 L580-587, 0.19.0 L637-647, 0.33.0 L889-900), makes vLLM
/// read `params.json` and run `PixtralForConditionalGeneration`: vLLM's own Pixtral vision
/// transformer on mistral_common's float32 pixels, normalized on the host. `params_json`:
/// whether the checkpoint has one (`None`: a hub id, whose repository is not read here).
pub fn mistral3_format_note(
    config_format: &str,
    release_minor: u32,
    params_json: Option<bool>,
) -> Option<String> {
    let why = "vLLM then reads params.json and runs PixtralForConditionalGeneration (vLLM's own Pixtral vision transformer on mistral_common's float32 pixels, normalized on the host); vramscope answers for the HF format (Mistral3ForConditionalGeneration: the same weights, another encoder pass), as with --config-format hf --load-format hf";
    match (config_format, params_json) {
        ("mistral", _) => Some(format!("--config-format mistral ({why})")),
        ("auto", Some(true)) if release_minor >= 15 => Some(format!(
            "--config-format auto with params.json beside config.json, which vLLM 0.15 and later take first ({why})"
        )),
        ("auto", None) if release_minor >= 15 => Some(format!(
            "--config-format auto: where the repository holds params.json and consolidated safetensors, as Mistral's publish them (not read from here), vLLM 0.15 and later take the Mistral format ({why})"
        )),
        _ => None,
    }
}

/// Flags and engine settings that change GPU memory and that vramscope does not model, with
/// what each changes (a flag not in this list and not mapped is named as not read).
const NOT_MODELLED: &[(&str, &str)] = &[
    (
        "speculative-config",
        "a draft model or speculative heads, their weights, KV cache and graphs",
    ),
    ("speculative-model", "a draft model's weights and KV cache"),
    (
        "num-speculative-tokens",
        "speculative decoding's extra tokens per step",
    ),
    (
        "enable-lora",
        "LoRA adapters' weights and the punica buffers",
    ),
    ("max-loras", "LoRA slots held on the GPU"),
    ("max-lora-rank", "the size of each LoRA slot"),
    ("max-cpu-loras", "LoRA adapters cached in host memory"),
    ("lora-modules", "LoRA adapters loaded at startup"),
    (
        "fully-sharded-loras",
        "how LoRA weights are cut over the GPUs",
    ),
    (
        "swap-space",
        "host memory for preempted requests' KV blocks",
    ),
    (
        "cpu-offload-gb",
        "weights kept in host memory instead of the GPU",
    ),
    ("kv-offloading-size", "KV blocks offloaded to host memory"),
    (
        "kv-transfer-config",
        "a KV connector's buffers (disaggregated prefill)",
    ),
    ("enable-eplb", "redundant experts for load balancing"),
    (
        "decode-context-parallel-size",
        "the KV cache split over decode context-parallel ranks",
    ),
    (
        "disable-custom-all-reduce",
        "the custom all-reduce's buffers (NCCL only)",
    ),
    ("num-gpu-blocks-override", "the KV block count, set by hand"),
    ("cuda-graph-sizes", "which CUDA graphs are captured"),
    ("max-seq-len-to-capture", "which CUDA graphs are captured"),
    (
        "compilation-config",
        "torch.compile and CUDA graph settings",
    ),
    (
        "cc.cudagraph-mm-encoder",
        "the vision encoder's CUDA graphs (CompilationConfig.cudagraph_mm_encoder, off by default; Qwen2.5-VL implements them from 0.21)",
    ),
    (
        "mm-device-do-normalize",
        "where pixels are normalized (by default uint8 pixels normalized on the GPU: Qwen2.5-VL from 0.28, Mistral 3 from 0.33)",
    ),
    ("hf-overrides", "the model's config"),
    ("rope-scaling", "the rotary cache's length"),
    (
        "enable-sleep-mode",
        "how weights and KV cache are allocated (CuMemAllocator)",
    ),
    ("calculate-kv-scales", "fp8 KV scales computed at startup"),
];

/// What a setting vramscope does not model changes, by its name in a flag (`--max-loras`)
/// or an engine config (`max_loras`).
pub fn not_modelled_why(name: &str) -> &'static str {
    let key = name.trim_start_matches('-').replace('_', "-");
    let why = |key: &str| {
        NOT_MODELLED
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, w)| *w)
    };
    // `-cc.KEY=value` is `--compilation-config '{"KEY": value}'` (vLLM's dotted form).
    why(&key)
        .or_else(|| {
            key.starts_with("cc.")
                .then(|| why("compilation-config"))
                .flatten()
        })
        .unwrap_or("not read by vramscope")
}

/// The one line that names every setting vramscope left out of its answer.
pub fn assumed_line(unmodelled: &[String]) -> Option<String> {
    (!unmodelled.is_empty()).then(|| {
        format!(
            "assumed: {}: not modelled, so their memory is not in vramscope's answer",
            unmodelled.join("; ")
        )
    })
}

/// Flags that take a value and do not change GPU memory at startup (serving, tokenizer,
/// logging, download). Named in a note, then skipped with their value.
const NO_MEMORY_EFFECT: &[&str] = &[
    "--host",
    "--port",
    "--api-key",
    "--served-model-name",
    "--uvicorn-log-level",
    "--tokenizer",
    "--tokenizer-mode",
    "--revision",
    "--tokenizer-revision",
    "--download-dir",
    "--seed",
    "--chat-template",
    "--response-role",
    "--root-path",
    "--middleware",
    "--allowed-origins",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--load-format",
    "--config-format",
    "--max-logprobs",
    "--generation-config",
    "--tool-call-parser",
    "--reasoning-parser",
    "--hf-token",
];

/// Switches (no value) that do not change GPU memory at startup.
const NO_MEMORY_EFFECT_SWITCHES: &[&str] = &[
    "--trust-remote-code",
    "--disable-log-requests",
    "--disable-log-stats",
    "--enable-log-requests",
    "--enable-auto-tool-choice",
    "--disable-frontend-multiprocessing",
    "--disable-fastapi-docs",
    // The processor's cache of preprocessed items lives in host memory (multimodal/cache.py).
    "--disable-mm-preprocessor-cache",
];

/// `vllm bench latency` / `throughput` flags that take a value and shape the benchmark's
/// workload, not the engine's startup (0.26.0 benchmarks/latency.py L34-75,
/// benchmarks/throughput.py `add_cli_args`).
const BENCH_NO_MEMORY_EFFECT: &[&str] = &[
    "--input-len",
    "--output-len",
    "--batch-size",
    "--n",
    "--num-iters-warmup",
    "--num-iters",
    "--output-json",
    "--num-prompts",
    "--dataset-name",
    "--dataset-path",
    "--dataset",
    "--hf-max-batch-size",
    "--hf-subset",
    "--hf-split",
    "--random-input-len",
    "--random-output-len",
    "--random-range-ratio",
    "--prefix-len",
];

/// `vllm bench latency` / `throughput` switches of the same kind.
const BENCH_NO_MEMORY_EFFECT_SWITCHES: &[&str] = &[
    "--use-beam-search",
    "--profile",
    "--disable-detokenize",
    "--prequeue-requests",
];

/// vLLM flags that take a value and map onto a `profile` flag of the same meaning.
const MAPPED: &[(&str, &str)] = &[
    ("--tensor-parallel-size", "--tp"),
    ("-tp", "--tp"),
    ("--pipeline-parallel-size", "--pp"),
    ("-pp", "--pp"),
    ("--data-parallel-size", "--dp"),
    ("-dp", "--dp"),
    ("--gpu-memory-utilization", "--util"),
    ("--max-model-len", "--max-model-len"),
    ("--max-num-seqs", "--max-num-seqs"),
    ("--max-num-batched-tokens", "--max-num-batched-tokens"),
    ("--kv-cache-dtype", "--kv-cache-dtype"),
    ("--quantization", "--quantization"),
    ("-q", "--quantization"),
    ("--dtype", "--dtype"),
    ("--block-size", "--block-size"),
    ("--kv-cache-memory", "--kv-cache-memory"),
    ("--kv-cache-memory-bytes", "--kv-cache-memory"),
    ("--limit-mm-per-prompt", "--limit-mm-per-prompt"),
    ("--mm-processor-kwargs", "--mm-processor-kwargs"),
];

/// The flags whose value vLLM reads with `human_readable_int` (0.11.0 engine/arg_utils.py
/// L233-239: max_model_len, max_num_batched_tokens, kv_cache_memory_bytes).
const HUMAN_READABLE: &[&str] = &[
    "--max-model-len",
    "--max-num-batched-tokens",
    "--kv-cache-memory",
];

/// vLLM's refusal of a flag's value, in argparse's words.
fn refused(flag: &str, v: &str, why: String) -> Error {
    Error::Request(format!(
        "{flag} '{v}': vLLM refuses it (argument {flag}: {why})"
    ))
}

/// Python's `int(text)` for a base-10 string: surrounding whitespace, an optional sign, ASCII
/// digits with single underscores between them. `None` where Python raises ValueError.
fn python_int(text: &str) -> Option<i128> {
    let t = text.trim();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let ok = !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    if !ok {
        return None;
    }
    // Past i128 is past any count here: saturate, the bound below refuses it.
    let n = digits
        .bytes()
        .filter(u8::is_ascii_digit)
        .fold(0i128, |n, d| {
            n.saturating_mul(10).saturating_add((d - b'0') as i128)
        });
    Some(if neg { -n } else { n })
}

/// vLLM's `human_readable_int` (0.11.0 engine/arg_utils.py L1740-1778): `\d+(\.\d+)?` then one
/// of k, m, g (powers of 1000, a fraction allowed: `int(float(number) * mult)`, truncated) or
/// K, M, G (powers of 1024, whole numbers only); anything else is Python's `int(value)`, so
/// `1e3`, `1.5`, `1t` and `1.5K` are refused as vLLM refuses them (the error is argparse's
/// message).
fn human_readable_int(v: &str) -> std::result::Result<i128, String> {
    let t = v.trim();
    let invalid = || format!("invalid human_readable_int value: '{v}'");
    if let Some(suffix) = t.chars().last().filter(|c| "kKmMgGtT".contains(*c)) {
        let number = &t[..t.len() - 1];
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if digits(whole) && (!number.contains('.') || digits(frac)) {
            let decimal = match suffix {
                'k' => Some(1e3),
                'm' => Some(1e6),
                'g' => Some(1e9),
                _ => None,
            };
            let binary = match suffix {
                'K' => Some(1i128 << 10),
                'M' => Some(1 << 20),
                'G' => Some(1 << 30),
                _ => None,
            };
            if let Some(mult) = decimal {
                // Python's float(number) * mult, then int(): both correctly rounded IEEE
                // doubles, truncated toward zero.
                let x: f64 = number.parse().map_err(|_| invalid())?;
                let y = (x * mult).trunc();
                return if y.is_finite() && y < 1e30 {
                    Ok(y as i128)
                } else {
                    Err(invalid())
                };
            }
            if let Some(mult) = binary {
                if number.contains('.') {
                    return Err(format!(
                        "Decimals are not allowed with binary suffixes like {suffix}. Did you \
                         mean to use {number}{} instead?",
                        suffix.to_ascii_lowercase()
                    ));
                }
                return python_int(number)
                    .map(|n| n.saturating_mul(mult))
                    .ok_or_else(invalid);
            }
            // t and T match vLLM's pattern but have no multiplier: int(value) raises.
        }
    }
    python_int(t).ok_or_else(invalid)
}

/// A count flag's value as vLLM reads it (`human_readable_int` for the lengths and the KV
/// cache bytes, Python's `int` otherwise), as the whole number `profile` takes.
fn count_value(flag: &str, v: &str) -> Result<String> {
    let n = if HUMAN_READABLE.contains(&flag) {
        human_readable_int(v).map_err(|why| refused(flag, v, why))?
    } else {
        python_int(v).ok_or_else(|| refused(flag, v, format!("invalid int value: '{v}'")))?
    };
    if n < 1 {
        return Err(Error::Request(format!(
            "{flag} '{v}': it must be at least 1"
        )));
    }
    u64::try_from(n)
        .map(|n| n.to_string())
        .map_err(|_| Error::Request(format!("{flag} '{v}': too large (past 64 bits)")))
}

fn is_value(next: Option<&String>) -> bool {
    next.is_some_and(|n| !n.starts_with('-') || n.parse::<f64>().is_ok())
}

/// A flag as vLLM's FlexibleArgumentParser reads it: underscores in a `--` flag's name (up to
/// its first `.`) are dashes (0.11.0 utils/__init__.py L1870-1890).
fn flag_name(word: &str) -> String {
    match word.strip_prefix("--") {
        Some(rest) => {
            let (name, dotted) = rest.split_at(rest.find('.').unwrap_or(rest.len()));
            format!("--{}{dotted}", name.replace('_', "-"))
        }
        None => word.to_string(),
    }
}

/// A pasted command line split into words as a POSIX shell splits it before vLLM sees them:
/// blanks separate, '…' is literal, "…" keeps its blanks (a backslash escapes `"`, `\`, `$`
/// and a backquote in it), a backslash outside quotes escapes the next character, and a
/// backslash before a line break continues the line (a command copied from a README). A `$ `
/// prompt before the command is dropped.
pub fn split_words(text: &str) -> Result<Vec<String>> {
    let text = text.trim_start();
    let text = text.strip_prefix("$ ").unwrap_or(text);
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(n) => word.get_or_insert_with(String::new).push(n),
                None => {}
            },
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(q) => w.push(q),
                        None => return Err(unterminated("'")),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e @ ('"' | '\\' | '$' | '`')) => w.push(e),
                            Some('\n') => {}
                            Some(e) => {
                                w.push('\\');
                                w.push(e);
                            }
                            None => return Err(unterminated("\"")),
                        },
                        Some(q) => w.push(q),
                        None => return Err(unterminated("\"")),
                    }
                }
            }
            c if c.is_whitespace() => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

fn unterminated(quote: &str) -> Error {
    Error::Request(format!(
        "the pasted line opens a {quote} quote and never closes it"
    ))
}

/// Reads a pasted line: `vllm serve MODEL …`, `python -m vllm.entrypoints.openai.api_server
/// --model MODEL …`, `vllm bench latency|throughput --model MODEL …` (the `LLM` class's
/// defaults), or just `MODEL …`; `--flag value` and `--flag=value` alike. A flag given
/// twice takes its last value, as vLLM's argparse does (both spellings of one setting, such
/// as `-tp` and `--tensor-parallel-size`, are one flag).
pub fn parse_serve(words: &[String]) -> Result<ServeLine> {
    let mut i;
    let mut model: Option<String> = None;
    // Each profile flag once, in the order first given, with the last value given.
    let mut set: Vec<(&'static str, Option<String>)> = Vec::new();
    let mut put = |to: &'static str, v: Option<String>| match set.iter_mut().find(|(f, _)| *f == to)
    {
        Some(slot) => slot.1 = v,
        None => set.push((to, v)),
    };
    let mut warnings = Vec::new();
    let mut unmodelled = Vec::new();
    let mut config_format = "auto".to_string();
    // `NAME=value vllm serve …`: the environment vLLM starts in.
    let mut env_from = 0;
    while words
        .get(env_from)
        .and_then(|w| w.split_once('='))
        .is_some_and(|(k, _)| {
            !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
    {
        env_from += 1;
    }
    for word in &words[..env_from] {
        let (k, v) = word.split_once('=').unwrap_or((word, ""));
        if k == "VLLM_PP_LAYER_PARTITION" {
            put("--pp-layer-partition", Some(v.to_string()));
        } else if k.starts_with("VLLM_") || k.starts_with("NCCL_") || k.starts_with("PYTORCH_") {
            unmodelled.push(format!("{k}={v} (not read by vramscope)"));
        } else {
            warnings.push(format!("{k}={v}: no effect on the memory vramscope models"));
        }
    }
    let w = |i: usize| words.get(env_from + i).map(String::as_str);
    let vllm_cli = w(0).is_some_and(|s| s == "vllm" || s.ends_with("/vllm"));
    // `vllm bench latency|throughput` start the engine through the Python `LLM` class
    // (`LLM.from_engine_args`, usage context LLM_CLASS: 0.26.0 benchmarks/latency.py L88,
    // benchmarks/throughput.py L61, entrypoints/llm.py L339), whose batch defaults differ
    // from `vllm serve`'s.
    let bench = vllm_cli && w(1) == Some("bench");
    if bench {
        match w(2) {
            Some("latency" | "throughput") => put("--llm-class", Some(String::new())),
            Some("serve") => {
                return Err(Error::Request(
                    "`vllm bench serve` is a client of a running server: plan the server's \
                     `vllm serve` line"
                        .into(),
                ))
            }
            other => {
                return Err(Error::Request(format!(
                    "`vllm bench {}`: of the bench commands only `latency` and `throughput` \
                     start an engine",
                    other.unwrap_or("")
                )))
            }
        }
    }
    i = if matches!(w(0), Some("python" | "python3")) && w(1) == Some("-m") {
        env_from + 3
    } else if vllm_cli {
        env_from
            + match w(1) {
                Some("serve") => 2,
                Some("bench") => 3,
                _ => 1,
            }
    } else {
        env_from
    };
    while i < words.len() {
        let word = &words[i];
        let (flag, inline) = match word.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (flag_name(f), Some(v.to_string())),
            _ => (flag_name(word), None),
        };
        // The value: inline, or the next word if it is one.
        let take = |i: &mut usize| -> Option<String> {
            if inline.is_some() {
                return inline.clone();
            }
            if is_value(words.get(*i + 1)) {
                *i += 1;
                return Some(words[*i].clone());
            }
            None
        };
        if !flag.starts_with('-') {
            if model.is_some() {
                return Err(Error::Request(format!(
                    "the line names two models ('{}' and '{word}')",
                    model.unwrap_or_default()
                )));
            }
            model = Some(word.clone());
        } else if flag == "--model" {
            let v = take(&mut i).ok_or_else(|| Error::Request("--model needs a value".into()))?;
            if let Some(m) = &model {
                if *m != v {
                    return Err(Error::Request(format!(
                        "the line names two models ('{m}' and '{v}')"
                    )));
                }
            }
            model = Some(v);
        } else if flag == "--enforce-eager" || flag == "--no-enforce-eager" {
            // 0.11.0: a BooleanOptionalAction, so --no-enforce-eager too (engine/arg_utils.py L206-208).
            put(
                "--enforce-eager",
                (flag == "--enforce-eager").then(String::new),
            );
        } else if flag == "--enable-prefix-caching" || flag == "--no-enable-prefix-caching" {
            // A BooleanOptionalAction (0.19.0 engine/arg_utils.py); only a hybrid model's
            // startup memory follows it (`ProfileRequest::prefix_caching`).
            let on = flag == "--enable-prefix-caching";
            put(
                "--prefix-caching",
                Some(if on { "on" } else { "off" }.into()),
            );
            warnings.push(format!(
                "{flag}: changes the startup memory of models with state layers only (Qwen3-Next's state pages a request); blocks shared between requests are not in the startup budget"
            ));
        } else if flag == "--enable-chunked-prefill" {
            let on = match inline.as_deref() {
                Some(v) => v.to_string(),
                None => match words.get(i + 1).map(String::as_str) {
                    Some(v @ ("true" | "True" | "false" | "False")) => {
                        i += 1;
                        v.to_string()
                    }
                    _ => "true".into(),
                },
            };
            put("--enable-chunked-prefill", Some(on.to_ascii_lowercase()));
        } else if flag == "--enable-expert-parallel" || flag == "-ep" {
            // A switch (0.11.0 arg_utils.py L698, 0.19.0 L925-926 `-ep`).
            put("--enable-expert-parallel", Some(String::new()));
        } else if flag == "--no-enable-expert-parallel" {
            put("--enable-expert-parallel", None);
        } else if flag == "--no-enable-chunked-prefill" {
            put("--enable-chunked-prefill", Some("false".into()));
        } else if let Some((_, to)) = MAPPED.iter().find(|(from, _)| *from == flag) {
            let v = take(&mut i).ok_or_else(|| Error::Request(format!("{flag} needs a value")))?;
            let v = match *to {
                "--max-model-len"
                | "--max-num-batched-tokens"
                | "--max-num-seqs"
                | "--kv-cache-memory" => count_value(to, &v)?,
                _ => v,
            };
            put(to, Some(v));
        } else if flag == "--mm-encoder-tp-mode" {
            // MultiModalConfig.mm_encoder_tp_mode (0.19 config/multimodal.py): "weights" (the
            // default) splits the vision tower's layers over the tensor-parallel ranks as
            // modelled; "data" keeps each whole on every rank and shards the images.
            let v = take(&mut i).ok_or_else(|| Error::Request(format!("{flag} needs a value")))?;
            match v.as_str() {
                "weights" => warnings.push(format!(
                    "{flag} weights: the default (the vision tower split over the tensor-parallel ranks)"
                )),
                "data" => {
                    return Err(Error::Request(
                        "--mm-encoder-tp-mode data: the vision tower whole on every rank, each rank encoding its share of the images (`use_data_parallel`), is not modelled; leave it at weights".into(),
                    ))
                }
                _ => {
                    return Err(refused(
                        flag.as_str(),
                        &v,
                        format!("invalid choice: '{v}' (choose from 'weights', 'data')"),
                    ))
                }
            }
        } else if bench && flag == "--async-engine" {
            // `vllm bench throughput --async-engine`: the API server's engine client, with
            // `vllm serve`'s usage context (0.26.0 entrypoints/openai/api_server.py L148-151).
            put("--llm-class", None);
        } else if bench && flag == "--backend" {
            let v = take(&mut i).unwrap_or_default();
            if !matches!(v.as_str(), "vllm" | "vllm-chat") {
                return Err(Error::Request(format!(
                    "--backend {v}: the benchmark does not start vLLM's engine"
                )));
            }
        } else if bench && BENCH_NO_MEMORY_EFFECT_SWITCHES.contains(&flag.as_str()) {
            warnings.push(format!("{flag}: no effect on the memory vramscope models"));
        } else if bench && BENCH_NO_MEMORY_EFFECT.contains(&flag.as_str()) {
            let v = take(&mut i).unwrap_or_default();
            warnings.push(format!(
                "{flag} {v}: the benchmark's workload, no effect on the KV budget"
            ));
        } else if NO_MEMORY_EFFECT_SWITCHES.contains(&flag.as_str()) {
            warnings.push(format!("{flag}: no effect on the memory vramscope models"));
        } else if NO_MEMORY_EFFECT.contains(&flag.as_str()) {
            let v = take(&mut i).unwrap_or_default();
            if flag == "--config-format" {
                config_format = v.clone();
            }
            warnings.push(format!(
                "{flag} {v}: no effect on the memory vramscope models"
            ));
        } else {
            let v = take(&mut i);
            unmodelled.push(format!(
                "{flag}{} ({})",
                v.map(|v| format!(" {v}")).unwrap_or_default(),
                not_modelled_why(&flag)
            ));
        }
        i += 1;
    }
    let model = model.ok_or_else(|| {
        Error::Request("the line names no model: expected `vllm serve MODEL [flags]`".into())
    })?;
    let mut args = Vec::new();
    for (flag, value) in set {
        match (flag, value) {
            // --no-enforce-eager last: the switch is off, so it is not passed.
            ("--enforce-eager", None) => {}
            ("--enforce-eager", Some(_)) => args.push(flag.to_string()),
            ("--llm-class", None) => {}
            ("--llm-class", Some(_)) => args.push(flag.to_string()),
            ("--enable-expert-parallel", None) => {}
            ("--enable-expert-parallel", Some(_)) => args.push(flag.to_string()),
            (_, v) => args.extend([flag.to_string(), v.unwrap_or_default()]),
        }
    }
    Ok(ServeLine {
        model,
        args,
        warnings,
        unmodelled,
        config_format,
    })
}

/// Hub ids whose published config.json a built-in preset reproduces (the `-Instruct`, `-it`
/// and `-chat` variants share their base's shapes).
const HUB_PRESETS: &[(&str, &str)] = &[
    ("meta-llama/meta-llama-3-8b", "llama-3-8b"),
    ("meta-llama/llama-3.1-8b", "llama-3.1-8b"),
    ("meta-llama/meta-llama-3.1-8b", "llama-3.1-8b"),
    ("meta-llama/meta-llama-3-70b", "llama-3-70b"),
    ("meta-llama/llama-3.1-70b", "llama-3.1-70b"),
    ("meta-llama/meta-llama-3.1-70b", "llama-3.1-70b"),
    ("meta-llama/llama-3.3-70b", "llama-3.1-70b"),
    ("deepseek-ai/deepseek-r1-distill-llama-8b", "llama-3.1-8b"),
    ("deepseek-ai/deepseek-r1-distill-llama-70b", "llama-3.1-70b"),
    ("mistralai/mistral-7b-v0.3", "mistral-7b"),
    ("mistralai/mistral-7b-instruct-v0.3", "mistral-7b"),
    ("qwen/qwen2.5-1.5b", "qwen2.5-1.5b"),
    ("qwen/qwen2.5-7b", "qwen2.5-7b"),
    ("qwen/qwen2.5-32b", "qwen2.5-32b"),
    ("qwen/qwen3-0.6b", "qwen3-0.6b"),
    ("qwen/qwen3-4b", "qwen3-4b"),
    ("qwen/qwen3-8b", "qwen3-8b"),
    ("qwen/qwen3-32b", "qwen3-32b"),
    ("qwen/qwen3-14b", "qwen3-14b"),
    ("qwen/qwen3-30b-a3b", "qwen3-30b-a3b"),
    ("qwen/qwen3-30b-a3b-fp8", "qwen3-30b-a3b-fp8"),
    ("qwen/qwen3-235b-a22b-fp8", "qwen3-235b-a22b-fp8"),
    ("deepseek-ai/deepseek-v3", "deepseek-v3"),
    ("deepseek-ai/deepseek-v3-base", "deepseek-v3"),
    ("deepseek-ai/deepseek-v3-0324", "deepseek-v3"),
    ("deepseek-ai/deepseek-r1", "deepseek-v3"),
    ("deepseek-ai/deepseek-r1-0528", "deepseek-v3"),
    ("moonshotai/kimi-k2", "kimi-k2"),
    ("moonshotai/kimi-k2-base", "kimi-k2"),
    ("qwen/qwen3-235b-a22b", "qwen3-235b-a22b"),
    ("huggingfacetb/smollm2-135m", "smollm2-135m"),
    ("facebook/opt-125m", "opt-125m"),
    ("facebook/opt-350m", "opt-350m"),
    ("microsoft/phi-3-mini-4k-instruct", "phi-3-mini-4k"),
    ("microsoft/phi-4", "phi-4"),
    ("microsoft/phi-2", "phi-2"),
    ("deepseek-ai/deepseek-v2-lite", "deepseek-v2-lite"),
    ("deepseek-ai/deepseek-v2", "deepseek-v2"),
    ("meta-llama/llama-4-scout-17b-16e", "llama-4-scout"),
    ("meta-llama/llama-4-maverick-17b-128e", "llama-4-maverick"),
    ("deepseek-ai/deepseek-coder-v2-instruct", "deepseek-v2"),
    ("qwen/qwen3-next-80b-a3b", "qwen3-next-80b-a3b"),
    ("qwen/qwen3-next-80b-a3b-thinking", "qwen3-next-80b-a3b"),
    ("openai/gpt-oss-20b", "gpt-oss-20b"),
    ("openai/gpt-oss-120b", "gpt-oss-120b"),
    ("google/gemma-2-9b", "gemma-2-9b"),
    ("google/gemma-3-4b-it", "gemma-3-4b-it"),
    ("google/gemma-3-4b-pt", "gemma-3-4b-it"),
    ("google/gemma-3-12b-it", "gemma-3-12b-it"),
    ("google/gemma-3-12b-pt", "gemma-3-12b-it"),
    ("google/gemma-3-27b-it", "gemma-3-27b-it"),
    ("google/gemma-3-27b-pt", "gemma-3-27b-it"),
    ("google/gemma-3-12b", "gemma-3-12b"),
    ("google/gemma-2b", "gemma-2b"),
    ("google/gemma-1.1-2b", "gemma-2b"),
    ("google/gemma-7b", "gemma-7b"),
    ("google/gemma-1.1-7b", "gemma-7b"),
    ("ibm-granite/granite-3.1-2b", "granite-3.1-2b"),
    ("ibm-granite/granite-3.1-2b-base", "granite-3.1-2b"),
    ("ibm-granite/granite-3.3-8b", "granite-3.3-8b"),
    ("ibm-granite/granite-3.3-8b-base", "granite-3.3-8b"),
    ("ibm-granite/granite-vision-3.2-2b", "granite-vision-3.2-2b"),
    (
        "mistralai/mistral-small-3.1-24b-instruct-2503",
        "mistral-small-3.1-24b",
    ),
    (
        "mistralai/mistral-small-3.1-24b-base-2503",
        "mistral-small-3.1-24b",
    ),
    (
        "mistralai/mistral-small-3.2-24b-instruct-2506",
        "mistral-small-3.1-24b",
    ),
    ("mistralai/mixtral-8x7b-v0.1", "mixtral-8x7b"),
    ("mistralai/mixtral-8x7b-instruct-v0.1", "mixtral-8x7b"),
    // Kimi-VL-A3B-Thinking-2506 has the same shapes but an image processor of 16384 patches
    // (its preprocessor_config.json, read from a local copy); not mapped to this preset.
    ("moonshotai/kimi-vl-a3b-instruct", "kimi-vl-a3b"),
    ("moonshotai/kimi-vl-a3b-thinking", "kimi-vl-a3b"),
    ("qwen/qwen2.5-vl-7b", "qwen2.5-vl-7b"),
    ("qwen/qwen2.5-vl-32b", "qwen2.5-vl-32b"),
];

/// The preset whose shapes a hub id's published config has.
pub fn preset_for_hub_id(id: &str) -> Option<&'static str> {
    let id = id.trim().to_ascii_lowercase();
    let base = ["-instruct", "-it", "-chat"]
        .iter()
        .find_map(|s| id.strip_suffix(s))
        .unwrap_or(&id);
    HUB_PRESETS
        .iter()
        .find(|(h, _)| *h == id || *h == base)
        .map(|(_, p)| *p)
}

/// The Hugging Face hub cache folders to look in: $HF_HUB_CACHE, $HF_HOME/hub,
/// ~/.cache/huggingface/hub.
fn hub_caches() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        out.push(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        out.push(PathBuf::from(p).join("hub"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        out.push(PathBuf::from(h).join(".cache/huggingface/hub"));
    }
    out
}

/// A hub id's snapshot folder holding config.json in `cache` (the `refs/main` one first).
/// `refs/main` and the snapshot's config.json go through the guarded reads: a FIFO or a
/// device there is refused, naming it, instead of hanging or filling memory.
fn cached_snapshot(cache: &Path, id: &str) -> Result<Option<PathBuf>> {
    let dir = cache.join(format!("models--{}", id.replace('/', "--")));
    let snaps = dir.join("snapshots");
    let refs_main = dir.join("refs/main");
    // A missing ref is an ordinary cache (a download by revision); anything else there is read
    // through the guard.
    if std::fs::symlink_metadata(&refs_main).is_ok() {
        let rev = fsguard::read_text(&refs_main, "refs/main", fsguard::REF_LIMIT)?;
        let rev = rev.trim();
        // A revision is one folder name: never a path out of the snapshots folder.
        if rev.is_empty() || rev.contains(['/', '\\']) || rev == "." || rev == ".." {
            return Err(Error::model(
                &refs_main,
                format!("refs/main holds '{rev}', expected a revision (one folder name)"),
            ));
        }
        let p = snaps.join(rev);
        if let Some(found) = snapshot_with_config(p)? {
            return Ok(Some(found));
        }
    }
    let Ok(entries) = std::fs::read_dir(&snaps) else {
        return Ok(None);
    };
    let mut found: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    found.sort();
    for p in found {
        if let Some(found) = snapshot_with_config(p)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// `snap` when it holds a config.json; one that is there but not a regular file of a
/// config's size is refused.
fn snapshot_with_config(snap: PathBuf) -> Result<Option<PathBuf>> {
    let config = snap.join("config.json");
    if std::fs::symlink_metadata(&config).is_err() {
        return Ok(None);
    }
    fsguard::check_regular(&config, "config.json", fsguard::CONFIG_LIMIT)?;
    Ok(Some(snap))
}

/// MODEL as vLLM takes it, found without a network: a folder or file on disk, the hub cache's
/// snapshot, or the built-in preset of the same shapes (said in the note). A hub id found
/// nowhere says how to fetch its config.
pub fn resolve_model(model: &str) -> Result<(String, Option<String>)> {
    let m = model.trim();
    if m.starts_with("preset:") || m.starts_with("synthetic:") || Path::new(m).exists() {
        return Ok((m.to_string(), None));
    }
    let hub_like = m.split('/').count() == 2 && !m.starts_with('.') && !m.starts_with('/');
    if hub_like {
        for cache in hub_caches() {
            if let Some(snap) = cached_snapshot(&cache, m)? {
                let note = format!("{m}: the hub cache's copy, {}", snap.display());
                return Ok((snap.display().to_string(), Some(note)));
            }
        }
        if let Some(p) = preset_for_hub_id(m) {
            let what = if crate::model::presets::published_fp8_json(p).is_some() {
                "its published config.json, block-wise fp8; dry runs only"
            } else {
                "seeded weights"
            };
            return Ok((
                format!("preset:{p}"),
                Some(format!(
                    "{m} is not on disk: its shapes are the built-in preset {p} ({what}; \
                     for the exact config: hf download {m} config.json, then pass its folder)"
                )),
            ));
        }
        return Err(Error::Request(format!(
            "model '{m}' is not on disk (no folder, nothing in the Hugging Face cache) and no \
             preset has its shapes: vramscope reads no network; fetch its config with \
             `hf download {m} config.json --local-dir DIR` and pass DIR"
        )));
    }
    Err(Error::Request(format!(
        "model '{m}': no such file or folder"
    )))
}

/// config.json of a model on disk (the folder's, or the file itself), read through the
/// guarded read (a FIFO, a device or a multi-GB file is refused, naming it); `Null` when there
/// is none or it is not JSON (the model loader names what is wrong with it).
fn config_json(path: &Path) -> Result<serde_json::Value> {
    let config = if path.is_dir() {
        path.join("config.json")
    } else if path.file_name().is_some_and(|n| n == "config.json") {
        path.to_path_buf()
    } else {
        path.parent()
            .map(|p| p.join("config.json"))
            .unwrap_or_default()
    };
    if std::fs::symlink_metadata(&config).is_err() {
        return Ok(serde_json::Value::Null);
    }
    let text = fsguard::read_text(&config, "config.json", fsguard::CONFIG_LIMIT)?;
    Ok(fsguard::parse_json_bounded(&text).unwrap_or_default())
}

/// `--dtype auto` as vLLM takes it (0.6.4 config.py L1811-1836): config.json's torch_dtype,
/// a missing or float32 one as float16 (bfloat16 for Gemma 2). Presets answer with their
/// published config's dtype.
pub fn auto_dtype(model: &ModelSource) -> Result<Quant> {
    match model {
        ModelSource::Preset { name } => Ok(if name.starts_with("opt-") || name == "tiny" {
            Quant::F16
        } else {
            Quant::BF16
        }),
        ModelSource::Path { path } => {
            let json = config_json(path)?;
            let dtype = json["torch_dtype"].as_str().or(json["dtype"].as_str());
            Ok(match (dtype, json["model_type"].as_str()) {
                (Some("bfloat16"), _) => Quant::BF16,
                (None | Some("float32"), Some("gemma2")) => Quant::BF16,
                _ => Quant::F16,
            })
        }
        ModelSource::Synthetic { .. } => Ok(Quant::F16),
    }
}

/// The 4-bit methods that read a checkpoint stored that way.
const STORED_4BIT: &[&str] = &["awq", "gptq", "awq_marlin", "gptq_marlin", "marlin"];

/// What vLLM does with `--quantization method` on a checkpoint on disk whose config.json has
/// no quantization_config (a 16-bit checkpoint): a 4-bit method looks for its own config file
/// beside it (AWQ: quant_config.json or quantize_config.json, GPTQ and the marlin kernels:
/// quantize_config.json) and, finding none, raises "Cannot find the config file for METHOD"
/// (0.11.0 model_executor/model_loader/weight_utils.py L275-289; the names: awq.py L65-70,
/// gptq.py L111-112, awq_marlin.py L94-95, gptq_marlin.py L160-161). A stored method that is
/// another than the one asked for is _verify_quantization's mismatch (0.11.0
/// config/model.py L948-957; awq_marlin and gptq_marlin are the marlin kernels of awq and
/// gptq checkpoints, L905-946).
fn check_stored(path: &Path, method: &str, named: &str) -> Result<()> {
    let json = config_json(path)?;
    let stored = json
        .get("quantization_config")
        .or_else(|| json.get("compression_config"))
        .filter(|q| !q.is_null());
    let Some(q) = stored else {
        let modelopt = matches!(method, "modelopt" | "modelopt_fp4");
        if !STORED_4BIT.contains(&method) && !modelopt {
            return Ok(());
        }
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        // ModelOpt's config file (0.19.0 modelopt.py L262-263).
        let files: &[&str] = if method == "awq" {
            &["quant_config.json", "quantize_config.json"]
        } else if modelopt {
            &["hf_quant_config.json"]
        } else {
            &["quantize_config.json"]
        };
        if files.iter().any(|f| dir.join(f).exists()) {
            return Ok(());
        }
        return Err(Error::Request(format!(
            "{named} {method}: vLLM refuses it: the checkpoint is not quantized (config.json \
             has no quantization_config, no {} beside it): \"ValueError: Cannot find the \
             config file for {method}\"",
            files.join(" or ")
        )));
    };
    let stored = q["quant_method"]
        .as_str()
        .unwrap_or("")
        .to_ascii_lowercase()
        .replace("compressed_tensors", "compressed-tensors");
    let same = stored == method
        || (stored == "awq" && matches!(method, "awq_marlin" | "marlin"))
        || (stored == "gptq" && matches!(method, "gptq_marlin" | "marlin"))
        // `ModelOptNvFp4Config.override_quantization_method` (0.19.0 modelopt.py L1017-1023):
        // a modelopt config whose algorithm is NVFP4 runs as modelopt_fp4.
        || (stored == "modelopt" && method == "modelopt_fp4");
    if stored.is_empty() || same {
        return Ok(());
    }
    Err(Error::Request(format!(
        "{named} {method}: vLLM refuses it: \"ValueError: Quantization method specified in \
         the model config ({stored}) does not match the quantization method specified in the \
         `quantization` argument ({method}).\""
    )))
}

/// vLLM's `--dtype` and `--quantization` as one vramscope quantization (errors name them as
/// the flags `--dtype` and `--quantization`).
pub fn quant_of(model: &ModelSource, dtype: Option<&str>, method: Option<&str>) -> Result<Quant> {
    quant_named(model, (dtype, "--dtype"), (method, "--quantization"))
}

/// `quant_of` with the names its errors give the two settings (`explain`: the log's line).
pub fn quant_named(
    model: &ModelSource,
    (dtype, dtype_named): (Option<&str>, &str),
    (method, named): (Option<&str>, &str),
) -> Result<Quant> {
    let base = match dtype.map(str::to_ascii_lowercase).as_deref() {
        None | Some("auto") => auto_dtype(model)?,
        Some("half" | "float16" | "fp16") => Quant::F16,
        Some("bfloat16" | "bf16") => Quant::BF16,
        // vLLM's `_STR_DTYPE_TO_TORCH_DTYPE` (0.19.0 config/model.py): "float" is float32.
        Some("float32" | "float") => Quant::F32,
        Some(other) => {
            return Err(Error::Request(format!(
                "{dtype_named} {other}: vramscope runs auto, half, float16, bfloat16 and \
                 float32"
            )))
        }
    };
    let method = method.map(str::to_ascii_lowercase);
    if let (Some(m), ModelSource::Path { path }) = (method.as_deref(), model) {
        if m != "none" {
            check_stored(path, m, named)?;
        }
    }
    match method.as_deref() {
        None | Some("none") => Ok(base),
        Some("fp8") => Ok(Quant::Fp8),
        // vLLM quantizes a 16-bit checkpoint in flight to NF4; a pre-quantized one loads as
        // stored.
        Some("bitsandbytes") => Ok(Quant::Nf4),
        Some(m) if STORED_4BIT.contains(&m) => {
            if matches!(model, ModelSource::Preset { .. }) {
                return Err(Error::Request(format!(
                    "{named} {m} needs a checkpoint stored that way (a preset has 16-bit \
                     weights): pass its folder as the model"
                )));
            }
            Ok(base)
        }
        // A compressed-tensors checkpoint (check_stored has seen its config say so); which
        // of its schemes runs is the loader's to say (fp8 w8a8 is modelled).
        Some("compressed-tensors") if matches!(model, ModelSource::Path { .. }) => Ok(base),
        Some("compressed-tensors") => Err(Error::Request(format!(
            "{named} compressed-tensors needs a checkpoint stored that way (a preset has \
             16-bit weights): pass its folder as the model"
        ))),
        // A ModelOpt checkpoint (its config or hf_quant_config.json says which algorithm:
        // NVFP4 is modelled, the loader refuses the others by name).
        Some("modelopt" | "modelopt_fp4") if matches!(model, ModelSource::Path { .. }) => Ok(base),
        Some(m @ ("modelopt" | "modelopt_fp4")) => Err(Error::Request(format!(
            "{named} {m} needs a checkpoint stored that way (a preset has 16-bit weights): \
             pass its folder as the model"
        ))),
        Some(other) => Err(Error::Request(format!(
            "{named} {other}: not modelled (vramscope models fp8, bitsandbytes, awq, gptq, \
             awq_marlin, gptq_marlin, marlin, compressed-tensors, modelopt and modelopt_fp4)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_pasted_line_splits_as_a_shell_splits_it() {
        let w = split_words(
            "$ vllm serve 'Qwen/Qwen2.5-32B-Instruct' \\\n  --served-model-name \"my model\" -tp=2 a\\ b",
        )
        .unwrap();
        assert_eq!(
            w,
            [
                "vllm",
                "serve",
                "Qwen/Qwen2.5-32B-Instruct",
                "--served-model-name",
                "my model",
                "-tp=2",
                "a b"
            ]
        );
        assert_eq!(
            split_words("vllm serve m ''").unwrap(),
            ["vllm", "serve", "m", ""]
        );
        let e = split_words("vllm serve 'm").unwrap_err().to_string();
        assert!(e.contains("never closes"), "{e}");
    }

    /// `--mm-encoder-tp-mode`: "weights" is the default modelled, "data" is refused by
    /// name, anything else as vLLM's argparse refuses it; Qwen2.5-VL's hub ids name their
    /// presets.
    #[test]
    fn the_encoders_tensor_parallel_mode_is_read() {
        let l = parse_serve(&words(
            "vllm serve Qwen/Qwen2.5-VL-7B-Instruct --mm-encoder-tp-mode weights",
        ))
        .unwrap();
        assert!(l.args.is_empty(), "{:?}", l.args);
        assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
        let e = parse_serve(&words("vllm serve m --mm-encoder-tp-mode=data"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--mm-encoder-tp-mode data"), "{e}");
        assert!(e.contains("not modelled"), "{e}");
        let e = parse_serve(&words("vllm serve m --mm-encoder-tp-mode rows"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid choice: 'rows'"), "{e}");
        assert_eq!(
            preset_for_hub_id("Qwen/Qwen2.5-VL-7B-Instruct"),
            Some("qwen2.5-vl-7b")
        );
        assert_eq!(
            preset_for_hub_id("Qwen/Qwen2.5-VL-32B-Instruct"),
            Some("qwen2.5-vl-32b")
        );
    }

    /// `vllm bench latency|throughput` read as the `LLM` class's start; the other bench
    /// commands and backends start no engine and are refused in one line.
    #[test]
    fn bench_lines_take_the_llm_class_defaults() {
        let l = parse_serve(&words(
            "vllm bench latency --model m --input-len 1024 --use-beam-search -tp 2",
        ))
        .unwrap();
        assert_eq!(l.model, "m");
        assert_eq!(l.args, words("--llm-class --tp 2"));
        assert_eq!(l.warnings.len(), 2, "{:?}", l.warnings);
        assert!(l.unmodelled.is_empty(), "{:?}", l.unmodelled);
        let l = parse_serve(&words(
            "vllm bench throughput --model m --num-prompts 100 --backend vllm --async-engine",
        ))
        .unwrap();
        assert_eq!(l.args, Vec::<String>::new());
        // A workload flag outside bench is not vLLM's.
        let l = parse_serve(&words("vllm serve m --input-len 5")).unwrap();
        assert_eq!(l.unmodelled.len(), 1, "{:?}", l.unmodelled);
        for (line, want) in [
            ("vllm bench serve --model m", "client of a running server"),
            (
                "vllm bench sweep --model m",
                "only `latency` and `throughput`",
            ),
            (
                "vllm bench throughput --model m --backend hf",
                "--backend hf: the benchmark does not start",
            ),
        ] {
            let e = parse_serve(&words(line)).unwrap_err().to_string();
            assert!(e.contains(want), "{line}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn a_pasted_line_maps_flag_for_flag() {
        let l = parse_serve(&words(
            "vllm serve Qwen/Qwen2.5-32B-Instruct -tp 2 --max-model-len 10k --gpu-memory-utilization=0.9 --port 8000 --swap-space 4 --no-enable-chunked-prefill",
        ))
        .unwrap();
        assert_eq!(l.model, "Qwen/Qwen2.5-32B-Instruct");
        assert_eq!(
            l.args,
            words("--tp 2 --max-model-len 10000 --util 0.9 --enable-chunked-prefill false")
        );
        assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
        assert!(l.warnings[0].starts_with("--port 8000: no effect"));
        assert_eq!(
            l.unmodelled,
            vec!["--swap-space 4 (host memory for preempted requests' KV blocks)"]
        );
    }

    #[test]
    fn the_module_form_and_two_models() {
        let l = parse_serve(&words(
            "python -m vllm.entrypoints.openai.api_server --model facebook/opt-125m --enforce-eager --max-model-len 32K",
        ))
        .unwrap();
        assert_eq!(l.model, "facebook/opt-125m");
        assert_eq!(l.args, words("--enforce-eager --max-model-len 32768"));
        let e = parse_serve(&words("vllm serve a/b c/d")).unwrap_err();
        assert!(e.to_string().contains("two models"), "{e}");
        assert!(parse_serve(&words("vllm serve --port 1")).is_err());
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value_as_vllms_argparse_does() {
        let l = parse_serve(&words(
            "vllm serve m --max-model-len 4096 -tp 2 --max_model_len=8k --tensor-parallel-size 4 \
             --enforce-eager --no-enforce-eager --no-enable-chunked-prefill --enable-chunked-prefill",
        ))
        .unwrap();
        assert_eq!(
            l.args,
            words("--max-model-len 8000 --tp 4 --enable-chunked-prefill true")
        );
        let l = parse_serve(&words("vllm serve m -q awq --quantization gptq")).unwrap();
        assert_eq!(l.args, words("--quantization gptq"));
    }

    #[test]
    fn lengths_follow_vllms_human_readable_int() {
        let len = |v: &str| count_value("--max-model-len", v).map_err(|e| e.to_string());
        assert_eq!(len("1k").unwrap(), "1000");
        assert_eq!(len("1K").unwrap(), "1024");
        assert_eq!(len("1m").unwrap(), "1000000");
        assert_eq!(len("2M").unwrap(), "2097152");
        assert_eq!(len("25.6k").unwrap(), "25600");
        // int(float("1.0001") * 1000) truncates.
        assert_eq!(len("1.0001k").unwrap(), "1000");
        assert_eq!(len(" 8192 ").unwrap(), "8192");
        assert_eq!(len("1_024").unwrap(), "1024");
        assert!(len("1.5K").unwrap_err().contains(
            "Decimals are not allowed with binary suffixes like K. Did you mean to use 1.5k instead?"
        ));
        for bad in [
            "1e3", "1.5", "1t", "1T", "k", "1__0", "_1", "1 k", "0x10", "1.k",
        ] {
            assert!(
                len(bad)
                    .unwrap_err()
                    .contains("invalid human_readable_int value"),
                "{bad}"
            );
        }
        assert!(len("0").unwrap_err().contains("at least 1"));
        assert!(len("99999999999999999999999")
            .unwrap_err()
            .contains("64 bits"));
        // max_num_seqs is a plain int in vLLM: no suffixes.
        let seqs = count_value("--max-num-seqs", "1k").unwrap_err().to_string();
        assert!(seqs.contains("invalid int value: '1k'"), "{seqs}");
    }

    #[test]
    fn hub_ids_find_their_presets() {
        assert_eq!(
            preset_for_hub_id("meta-llama/Llama-3.1-8B-Instruct"),
            Some("llama-3.1-8b")
        );
        assert_eq!(
            preset_for_hub_id("Qwen/Qwen2.5-32B-Instruct"),
            Some("qwen2.5-32b")
        );
        assert_eq!(
            preset_for_hub_id("google/gemma-2-9b-it"),
            Some("gemma-2-9b")
        );
        for id in [
            "Qwen/Qwen3-Next-80B-A3B-Instruct",
            "Qwen/Qwen3-Next-80B-A3B-Thinking",
        ] {
            assert_eq!(preset_for_hub_id(id), Some("qwen3-next-80b-a3b"), "{id}");
        }
        for (id, p) in [
            ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b"),
            ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
            ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "llama-3.1-8b"),
            ("Qwen/Qwen3-32B", "qwen3-32b"),
            ("Qwen/Qwen3-4B", "qwen3-4b"),
            ("deepseek-ai/DeepSeek-R1-0528", "deepseek-v3"),
            ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
            ("moonshotai/Kimi-K2-Instruct", "kimi-k2"),
            ("Qwen/Qwen3-30B-A3B-FP8", "qwen3-30b-a3b-fp8"),
            ("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b-fp8"),
        ] {
            assert_eq!(preset_for_hub_id(id), Some(p), "{id}");
        }
        // A Qwen3 FP8 checkpoint is not its 16-bit preset (the -FP8 suffix is kept).
        assert_ne!(
            preset_for_hub_id("Qwen/Qwen3-30B-A3B-FP8"),
            preset_for_hub_id("Qwen/Qwen3-30B-A3B")
        );
        assert_eq!(preset_for_hub_id("someone/unknown-7b"), None);
        let e = resolve_model("someone/unknown-7b").unwrap_err().to_string();
        assert!(
            e.contains("hf download someone/unknown-7b config.json"),
            "{e}"
        );
    }

    #[test]
    fn the_hub_caches_snapshot_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models--Qwen--Qwen2.5-7B-Instruct");
        let snap = repo.join("snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        assert_eq!(
            cached_snapshot(dir.path(), "Qwen/Qwen2.5-7B-Instruct").unwrap(),
            None
        );
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
        assert_eq!(
            cached_snapshot(dir.path(), "Qwen/Qwen2.5-7B-Instruct").unwrap(),
            Some(snap)
        );
    }

    #[test]
    fn dtype_and_quantization_read_as_vllm_reads_them() {
        let llama = ModelSource::Preset {
            name: "llama-3-8b".into(),
        };
        let opt = ModelSource::Preset {
            name: "opt-125m".into(),
        };
        assert_eq!(quant_of(&llama, None, None).unwrap(), Quant::BF16);
        assert_eq!(quant_of(&opt, Some("auto"), None).unwrap(), Quant::F16);
        assert_eq!(quant_of(&llama, Some("half"), None).unwrap(), Quant::F16);
        assert_eq!(quant_of(&llama, None, Some("fp8")).unwrap(), Quant::Fp8);
        assert_eq!(
            quant_of(&llama, None, Some("bitsandbytes")).unwrap(),
            Quant::Nf4
        );
        assert!(quant_of(&llama, None, Some("awq")).is_err());
        assert_eq!(quant_of(&llama, Some("float32"), None).unwrap(), Quant::F32);
        assert_eq!(quant_of(&llama, Some("float"), None).unwrap(), Quant::F32);
        assert!(quant_of(&llama, Some("float64"), None).is_err());
        assert!(quant_of(&llama, None, Some("gguf")).is_err());
        let ct = quant_of(&llama, None, Some("compressed-tensors"))
            .unwrap_err()
            .to_string();
        assert!(
            ct.contains("compressed-tensors needs a checkpoint stored that way"),
            "{ct}"
        );
    }

    #[test]
    fn a_4bit_method_on_a_16_bit_checkpoint_is_refused_as_vllm_refuses_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"torch_dtype": "float16"}"#,
        )
        .unwrap();
        let m = ModelSource::Path {
            path: dir.path().to_path_buf(),
        };
        for method in ["awq", "awq_marlin", "gptq", "gptq_marlin", "marlin"] {
            let e = quant_of(&m, None, Some(method)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("Cannot find the config file for {method}")),
                "{e}"
            );
        }
        // fp8 and bitsandbytes quantize a 16-bit checkpoint in flight.
        assert_eq!(quant_of(&m, None, Some("fp8")).unwrap(), Quant::Fp8);
        assert_eq!(
            quant_of(&m, None, Some("bitsandbytes")).unwrap(),
            Quant::Nf4
        );
        // Another method's checkpoint: _verify_quantization's mismatch.
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"quantization_config": {"quant_method": "awq"}}"#,
        )
        .unwrap();
        let e = quant_of(&m, None, Some("gptq")).unwrap_err().to_string();
        assert!(e.contains("model config (awq) does not match"), "{e}");
        assert_eq!(quant_of(&m, None, Some("awq_marlin")).unwrap(), Quant::F16);
    }
}

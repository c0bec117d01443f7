//! `vramscope explain vllm.log`: the log's numbers beside vramscope's run of the same settings,
//! the largest difference in words, and what would change the answer.

use std::io::BufReader;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::base::error::{Error, Result};
use crate::base::fsguard;
use crate::profile::explain::{self, Explanation, LogFacts, Overrides};
use crate::profile::{self, ProfileRequest, Report};

/// Reads the log, runs it, prints the comparison (and, unless `no_what_if`, the runs that
/// move one setting each); with `json`, writes the same as a JSON document too.
pub fn run(
    log: &std::path::Path,
    overrides: &Overrides,
    no_what_if: bool,
    json: Option<&std::path::Path>,
) -> Result<()> {
    let name = log.display().to_string();
    let file = fsguard::open_bounded(log, "log", fsguard::LOG_LIMIT)?;
    let facts = explain::read_log(&name, BufReader::new(file))?;
    // A refusal of what the log states names the log (its line is in the message).
    let in_log = |e: Error| match e {
        Error::Request(m) => Error::Request(format!("{name}: {m}")),
        other => other,
    };
    let (req, assumptions) = explain::request_of(&facts, overrides).map_err(in_log)?;
    let report = profile::run(&req, None, Arc::new(AtomicBool::new(false))).map_err(in_log)?;
    let e = explain::compare(&facts, &report);
    // Every run first, so that a JSON file is written whole or not at all.
    let base = kv_of(&report);
    let what_ifs: Vec<WhatIf> = if no_what_if {
        Vec::new()
    } else {
        explain::variants(&req)
            .into_iter()
            .map(|(label, v)| {
                let r = profile::run(&v, None, Arc::new(AtomicBool::new(false)))
                    .map(|r| kv_of(&r))
                    .map_err(|err| first_clause(&err.to_string()).to_string());
                (label.to_string(), r)
            })
            .collect()
    };
    if let Some(path) = json {
        let doc = json_doc(&name, &facts, &assumptions, &report, &e, (&base, &what_ifs));
        let bytes = serde_json::to_vec_pretty(&doc)
            .map_err(|err| Error::Request(format!("{}: {err}", path.display())))?;
        crate::base::atomic::atomic_write(path, &bytes)?;
    }
    for line in text(&facts, &req, &assumptions, &report, &e) {
        println!("{line}");
    }
    if !no_what_if {
        println!();
        println!("what would change the answer (the same run, one setting moved):");
        for (label, r) in &what_ifs {
            match r {
                Ok(kv) => println!("  {label:<32} {}", vs(kv, &base)),
                Err(why) => println!("  {label:<32} not run: {why}"),
            }
        }
    }
    Ok(())
}

/// A run's KV GiB and blocks (or tokens), as `kv_of` gives it.
type Kv = Option<(f64, u64, &'static str)>;

/// A what-if: the change, and its run's KV or why it was not run.
type WhatIf = (String, std::result::Result<Kv, String>);

/// The base run's KV and the what-ifs.
type WhatIfs<'a> = (&'a Kv, &'a [WhatIf]);

/// `explain --json`: the log's settings, vramscope's run of them, each term side by side
/// (vLLM's value as logged and as a number, vramscope's, the relative difference), the
/// largest difference in words and the what-ifs.
fn json_doc(
    log: &str,
    f: &LogFacts,
    assumptions: &[String],
    r: &Report,
    e: &Explanation,
    (base, what_ifs): WhatIfs,
) -> serde_json::Value {
    let kv = |v: &Option<(f64, u64, &str)>| match v {
        Some((g, n, unit)) => serde_json::json!({"kv_gib": g, "count": n, "unit": unit}),
        None => serde_json::Value::Null,
    };
    serde_json::json!({
        "log": log,
        "release": f.release,
        "model": f.model,
        "vramscope": {
            "vllm": r.settings.vllm,
            "device": r.device.spec,
            "model": r.model.name,
            "quant": r.quant.label(),
            "tokens": r.settings.tokens,
            "seqs": r.settings.seqs,
            "kv": kv(base),
        },
        "assumed": assumptions,
        "not_modelled": f.unmodelled,
        "pp": f.pp.unwrap_or(1),
        "stages": e.stages.iter().map(|st| serde_json::json!({
            "stage": st.stage,
            "first_layer": st.first_layer,
            "end_layer": st.end_layer,
            "weights_vllm": st.weights.logged.as_ref().map(|l| l.value),
            "weights_vramscope": st.weights.ours,
            "kv_vllm": st.kv.logged.as_ref().map(|l| l.value),
            "kv_vramscope": st.kv.ours,
            "kv_blocks": st.kv_blocks,
            "binding": st.binding,
        })).collect::<Vec<_>>(),
        "terms": e.rows.iter().map(|row| serde_json::json!({
            "term": row.term,
            "unit": if row.gib { "GiB" } else { "count" },
            "vllm_logged": row.logged.as_ref().map(|l| l.text.clone()),
            "vllm": row.logged.as_ref().map(|l| l.value),
            "vramscope": row.ours,
            "relative": row.relative(),
        })).collect::<Vec<_>>(),
        "largest_difference": e.largest,
        "what_if": what_ifs.iter().map(|(label, res)| match res {
            Ok(v) => serde_json::json!({"change": label, "result": kv(v)}),
            Err(why) => serde_json::json!({"change": label, "not_run": why}),
        }).collect::<Vec<_>>(),
    })
}

/// A refusal's first clause, for a what-if row: the reason without the error kind's prefix or
/// the paragraph after it ("--quant fp8 with --vllm 0.19: vramscope reproduces fp8 as vLLM
/// 0.6.3 to 0.6.5 run it").
fn first_clause(msg: &str) -> &str {
    let m = msg.strip_prefix("invalid setting: ").unwrap_or(msg);
    m.split(';').next().unwrap_or(m).trim_end_matches('.')
}

/// KV GiB and blocks (or tokens) of a run, as the release counts them.
fn kv_of(r: &Report) -> Option<(f64, u64, &'static str)> {
    let a = r.vllm_answer()?;
    let v1 = matches!(a.release.engine, profile::vllm::Engine::V1 { .. });
    let (tokens, _) = r.kv_tokens_and_concurrency(&a);
    let count = if v1 {
        tokens
    } else {
        r.vllm_engine_blocks().unwrap_or(a.kv_blocks)
    };
    Some((
        a.kv_bytes as f64 / (1u64 << 30) as f64,
        count,
        if v1 { "tokens" } else { "blocks" },
    ))
}

fn vs(v: &Option<(f64, u64, &str)>, base: &Option<(f64, u64, &str)>) -> String {
    match (v, base) {
        (Some((g, n, unit)), Some((_, b, _))) => format!(
            "KV {g:.2} GiB, {} {unit} ({:+.1} %)",
            crate::base::units::thousands(*n),
            (*n as f64 / (*b).max(1) as f64 - 1.0) * 100.0
        ),
        _ => "no answer".into(),
    }
}

/// The comparison as printed.
pub fn text(
    f: &LogFacts,
    req: &ProfileRequest,
    assumptions: &[String],
    r: &Report,
    e: &Explanation,
) -> Vec<String> {
    let mut out = Vec::new();
    out.push(format!(
        "the log: vLLM {}, {}, {}, TP {}{}, max_model_len {}, util {}, GPU {} GiB",
        f.release.as_deref().unwrap_or("(no version)"),
        f.model.as_deref().unwrap_or("(no model)"),
        f.dtype.as_deref().unwrap_or("dtype not stated"),
        f.tp.unwrap_or(1),
        f.pp.filter(|&p| p > 1)
            .map_or(String::new(), |p| format!(", PP {p}")),
        f.max_model_len
            .map_or("not stated".into(), |l| l.to_string()),
        f.util.map_or("not stated".into(), |u| format!("{u}")),
        f.total
            .as_ref()
            .map_or("not stated".into(), |t| t.text.clone())
    ));
    out.push(format!(
        "vramscope: vLLM {} on {}, {} ({}), {} tokens in {} sequences",
        req.vllm,
        req.device,
        r.model.name,
        r.quant.label(),
        r.settings.tokens,
        r.settings.seqs
    ));
    for a in assumptions {
        out.push(format!("  assumed: {a}"));
    }
    if let Some(line) = crate::profile::vllm_args::assumed_line(&f.unmodelled) {
        out.push(format!("  {line}"));
    }
    if let Some(st) = r.stage.filter(|_| r.pp > 1) {
        out.push(format!(
            "pipeline parallel: {} stages of {} GPU(s); the table is stage {}'s (layers {}-{}), the stage whose KV blocks the engine takes; every stage below",
            r.pp,
            r.tp,
            st.stage,
            st.first_layer,
            st.end_layer.saturating_sub(1)
        ));
    }
    out.push(String::new());
    out.push(format!(
        "{:<24} {:>12} {:>12} {:>10}",
        "term", "vLLM log", "vramscope", "difference"
    ));
    for row in &e.rows {
        out.push(format!(
            "{:<24} {:>12} {:>12} {:>10}",
            row.term,
            row.logged_text(),
            row.ours_text(),
            row.difference_text()
        ));
    }
    if !e.stages.is_empty() {
        out.push(String::new());
        out.push(format!(
            "{:<20} {:>12} {:>12} {:>12} {:>12} {:>10}",
            "stage", "weights log", "vramscope", "KV log", "vramscope", "blocks"
        ));
        for st in &e.stages {
            out.push(format!(
                "{:<20} {:>12} {:>12} {:>12} {:>12} {:>10}{}",
                format!(
                    "{} (layers {}-{})",
                    st.stage,
                    st.first_layer,
                    st.end_layer.saturating_sub(1)
                ),
                st.weights.logged_text(),
                st.weights.ours_text(),
                st.kv.logged_text(),
                st.kv.ours_text(),
                st.kv_blocks,
                if st.binding { "  (the engine's)" } else { "" }
            ));
        }
    }
    if let Some(w) = &e.largest {
        out.push(String::new());
        out.push(format!("largest difference: {w}"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_what_if_refusal_is_one_clause() {
        let m = "invalid setting: --quant fp8 with --vllm 0.19: vramscope reproduces fp8 as vLLM 0.6.3 to 0.6.5 run it; from 0.7 on it allocates differently";
        assert_eq!(
            super::first_clause(m),
            "--quant fp8 with --vllm 0.19: vramscope reproduces fp8 as vLLM 0.6.3 to 0.6.5 run it"
        );
        assert_eq!(super::first_clause("out of memory"), "out of memory");
    }
}

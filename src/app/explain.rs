//! `vramscope explain vllm.log`: the log's numbers beside vramscope's run of the same settings,
//! the largest difference in words, and what would change the answer.

use std::io::BufReader;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::base::error::{Error, Result};
use crate::base::fsguard;
use serde::{Deserialize, Serialize};

use crate::profile::diagnose::{self, Diagnosis, Outcome, StartFailure};
use crate::profile::explain::{self, Explanation, LogFacts, Overrides};
use crate::profile::{self, ProfileRequest, Report};

/// Reads the log, runs it, prints the comparison (and, unless `no_what_if`, the runs that
/// move one setting each); with `json`, writes the same as a JSON document too. A log of a
/// start that failed gets its diagnosis instead (`diagnose_failed`).
pub fn run(
    log: &std::path::Path,
    overrides: &Overrides,
    no_what_if: bool,
    json: Option<&std::path::Path>,
) -> Result<()> {
    let name = log.display().to_string();
    let file = fsguard::open_bounded(log, "log", fsguard::LOG_LIMIT)?;
    let facts = explain::read_log(&name, BufReader::new(file))?;
    if let Some(p) = json {
        crate::report::export::check_writable(p)?;
    }
    let doc = if facts.failure.is_some() {
        diagnose_failed(&name, &facts, overrides, no_what_if)?
    } else {
        compare_started(&name, &facts, overrides, no_what_if)?
    };
    // Every run first, so that a JSON file is written whole or not at all.
    if let Some(path) = json {
        let bytes = serde_json::to_vec_pretty(&doc)
            .map_err(|err| Error::Request(format!("{}: {err}", path.display())))?;
        crate::base::atomic::atomic_write(path, &bytes)?;
    }
    for line in &doc.text {
        println!("{line}");
    }
    Ok(())
}

/// `explain --json`: what `explain` prints, as data (docs/json.md gives the schema; it
/// round-trips through serde).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainDoc {
    /// The log's file name.
    pub log: String,
    /// The release as the log prints it ("0.19.0").
    pub release: Option<String>,
    /// The model as the log names it (a hub id or a path).
    pub model: Option<String>,
    /// Whether the start the log shows got to serve (false: `diagnosis` says why not).
    pub started: bool,
    pub diagnosis: Option<Diagnosis>,
    /// vramscope's run of the log's settings (`None` when it made none).
    pub vramscope: Option<RunDoc>,
    /// What the log does not state, taken from the release's defaults.
    pub assumed: Vec<String>,
    /// Settings the log states that change memory and that vramscope does not model.
    pub not_modelled: Vec<String>,
    pub pp: u32,
    pub stages: Vec<StageDoc>,
    /// vLLM's terms beside vramscope's.
    pub terms: Vec<TermDoc>,
    pub largest_difference: Option<String>,
    /// The same run with one setting moved (those vramscope can run).
    pub what_if: Vec<WhatIfDoc>,
    /// The lines printed.
    pub text: Vec<String>,
}

/// A run: the release, device, model and batch, and its answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunDoc {
    pub vllm: String,
    pub device: String,
    /// Dry: shapes and allocations only.
    pub dry: bool,
    pub model: String,
    pub quant: String,
    pub tokens: usize,
    pub seqs: usize,
    pub kv: Option<Outcome>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TermDoc {
    pub term: String,
    /// "GiB" or "count".
    pub unit: String,
    /// vLLM's value as the log prints it.
    pub vllm_logged: Option<String>,
    pub vllm: Option<f64>,
    pub vramscope: Option<f64>,
    /// vramscope / vLLM − 1.
    pub relative: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageDoc {
    pub stage: u32,
    pub first_layer: u32,
    pub end_layer: u32,
    pub weights_vllm: Option<f64>,
    pub weights_vramscope: Option<f64>,
    pub kv_vllm: Option<f64>,
    pub kv_vramscope: Option<f64>,
    pub kv_blocks: u64,
    pub binding: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatIfDoc {
    /// The change, as a vLLM flag.
    pub change: String,
    pub result: Outcome,
    /// The KV's count relative to the base run's.
    pub relative: Option<f64>,
}

pub fn run_doc(req: &ProfileRequest, r: &Report) -> RunDoc {
    RunDoc {
        vllm: r.settings.vllm.clone(),
        device: r.device.spec.clone(),
        dry: matches!(req.device, crate::device::DeviceSpec::Sim { dry: true, .. }),
        model: r.model.name.clone(),
        quant: r.quant.label().to_string(),
        tokens: r.settings.tokens,
        seqs: r.settings.seqs,
        kv: diagnose::outcome(r),
    }
}

fn in_log(name: &str) -> impl Fn(Error) -> Error + '_ {
    move |e: Error| match e {
        Error::Request(m) => Error::Request(format!("{name}: {m}")),
        other => other,
    }
}

/// The request a log describes, run dry: a `sim:` device named without `:dry` runs dry too
/// (explain computes nothing), and a config-only model is said to run dry.
fn request(f: &LogFacts, o: &Overrides, name: &str) -> Result<(ProfileRequest, Vec<String>)> {
    let (mut req, mut assumptions) = explain::request_of(f, o).map_err(in_log(name))?;
    if let crate::device::DeviceSpec::Sim { dry, .. } = &mut req.device {
        if !*dry {
            *dry = true;
            assumptions.push(format!(
                "{}: runs dry (shapes and allocations; explain computes nothing)",
                req.device
            ));
        }
    }
    if let crate::model::ModelSource::Path { path } = &req.model {
        if crate::model::resolve_files(path)
            .is_ok_and(|f| f.format == crate::model::FileFormat::ConfigOnly)
        {
            assumptions.push(format!(
                "{}: config.json only, so the run is dry (the weights' shapes from the config)",
                path.display()
            ));
        }
    }
    Ok((req, assumptions))
}

/// A log of a start that got to serve: vLLM's numbers beside vramscope's run of them.
fn compare_started(
    name: &str,
    facts: &LogFacts,
    overrides: &Overrides,
    no_what_if: bool,
) -> Result<ExplainDoc> {
    let (req, assumptions) = request(facts, overrides, name)?;
    let report = profile::run(&req, None, Arc::new(AtomicBool::new(false)))
        .map_err(|e| explain::in_log_terms(e, facts))
        .map_err(in_log(name))?;
    let e = explain::compare(facts, &report);
    let base = diagnose::outcome(&report);
    // What-ifs vramscope cannot run (a quantization this release's reproduction lacks, a TP
    // the model does not divide over) are left out, not printed as errors.
    let what_ifs: Vec<WhatIfDoc> = if no_what_if {
        Vec::new()
    } else {
        explain::variants(&req)
            .into_iter()
            .filter_map(|(label, v)| {
                let o = diagnose::try_run(&v).ok()?;
                Some(WhatIfDoc {
                    relative: base
                        .as_ref()
                        .map(|b| o.count as f64 / b.count.max(1) as f64 - 1.0),
                    change: label,
                    result: o,
                })
            })
            .collect()
    };
    let mut text = text(facts, &req, &assumptions, &report, &e);
    if !no_what_if {
        text.push(String::new());
        text.push("what would change the answer (the same run, one setting moved):".into());
        for w in &what_ifs {
            text.push(format!(
                "  {:<32} {}{}{}",
                w.change,
                w.result.kv_words(),
                w.relative
                    .map_or(String::new(), |d| format!(" ({:+.1} %)", d * 100.0)),
                match &w.result.failure {
                    Some(f) => format!("; would not start: {}", f.cause()),
                    None => String::new(),
                }
            ));
        }
    }
    Ok(ExplainDoc {
        log: name.to_string(),
        release: facts.release.clone(),
        model: facts.model.clone(),
        started: true,
        diagnosis: None,
        vramscope: Some(run_doc(&req, &report)),
        assumed: assumptions,
        not_modelled: facts.unmodelled.clone(),
        pp: facts.pp.unwrap_or(1),
        stages: e
            .stages
            .iter()
            .map(|st| StageDoc {
                stage: st.stage,
                first_layer: st.first_layer,
                end_layer: st.end_layer,
                weights_vllm: st.weights.logged.as_ref().map(|l| l.value),
                weights_vramscope: st.weights.ours,
                kv_vllm: st.kv.logged.as_ref().map(|l| l.value),
                kv_vramscope: st.kv.ours,
                kv_blocks: st.kv_blocks,
                binding: st.binding,
            })
            .collect(),
        terms: e
            .rows
            .iter()
            .map(|row| TermDoc {
                term: row.term.to_string(),
                unit: if row.gib { "GiB" } else { "count" }.into(),
                vllm_logged: row.logged.as_ref().map(|l| l.text.clone()),
                vllm: row.logged.as_ref().map(|l| l.value),
                vramscope: row.ours,
                relative: row.relative(),
            })
            .collect(),
        largest_difference: e.largest.clone(),
        what_if: what_ifs,
        text,
    })
}

const GIB: f64 = (1u64 << 30) as f64;

/// A log of a start that failed: the cause in one sentence, vLLM's message and its source
/// for the release the log ran, and where memory is the cause vramscope's run of the same
/// settings (the shortfall) and the settings that would start.
fn diagnose_failed(
    name: &str,
    facts: &LogFacts,
    overrides: &Overrides,
    no_what_if: bool,
) -> Result<ExplainDoc> {
    let Some(failure) = facts.failure.clone() else {
        return Err(Error::Request(format!("{name}: the start did not fail")));
    };
    let mut assumptions = Vec::new();
    let release_name = match &overrides.vllm {
        Some(v) => profile::vllm::release(v)?.name.to_string(),
        None => explain::release_of(facts, &mut assumptions)
            .unwrap_or_else(|_| profile::vllm::DEFAULT.to_string()),
    };
    let release = profile::vllm::release(&release_name)?;
    let mut d = Diagnosis::new(failure.clone(), release);
    d.line = facts.failure_line;
    let mut run = None;
    if failure.is_memory() {
        match request(facts, overrides, name) {
            Ok((req, mut assumed)) => {
                assumptions.append(&mut assumed);
                let total_gib = req.device.total_override().map_or(0.0, |b| b as f64 / GIB);
                // Another process's memory, where the log says how much was free.
                let req = match &failure {
                    StartFailure::FreeMemoryBelowUtil {
                        free_gib,
                        total_gib,
                        ..
                    } => ProfileRequest {
                        outside_before: ((total_gib - free_gib) * GIB) as u64,
                        ..req
                    },
                    _ => req,
                };
                d.reproduced = Some(reproduce(&req, &failure, facts, total_gib, &mut run));
                if !no_what_if {
                    d.would_start = diagnose::would_start(
                        &req,
                        &failure,
                        d.shortfall_gib,
                        total_gib,
                        facts.kv.as_ref().map(|k| k.value),
                    );
                }
            }
            Err(e) => {
                d.reproduced = Some(format!("not reproduced: {}", first_clause(&e.to_string())))
            }
        }
    } else {
        d.would_start = fixes(&failure, facts);
    }
    let mut text = vec![format!(
        "the log: vLLM {}, {}: the start failed",
        facts.release.as_deref().unwrap_or("(no version)"),
        facts.model.as_deref().unwrap_or("(no model)")
    )];
    text.extend(d.lines());
    for a in &assumptions {
        text.push(format!("  assumed: {a}"));
    }
    Ok(ExplainDoc {
        log: name.to_string(),
        release: facts.release.clone(),
        model: facts.model.clone(),
        started: false,
        diagnosis: Some(d),
        vramscope: run,
        assumed: assumptions,
        not_modelled: facts.unmodelled.clone(),
        pp: facts.pp.unwrap_or(1),
        stages: Vec::new(),
        terms: Vec::new(),
        largest_difference: None,
        what_if: Vec::new(),
        text,
    })
}

/// vramscope's run of a failed start's settings, in one sentence: what it shows against
/// what the log shows.
fn reproduce(
    req: &ProfileRequest,
    failure: &StartFailure,
    facts: &LogFacts,
    total_gib: f64,
    run: &mut Option<RunDoc>,
) -> String {
    if let StartFailure::FreeMemoryBelowUtil { util, .. } = failure {
        // Checked before anything loads: the arithmetic is the whole check.
        let total = (total_gib * GIB).round() as u64;
        return match diagnose::free_memory_at_start(total, req.outside_before, *util) {
            Some(f) => format!(
                "with {:.2} GiB held by another process (--outside-before), free memory at start \
                 is below ceil(T·u): refused, {:.2} GiB short",
                req.outside_before as f64 / GIB,
                f.shortfall_gib().unwrap_or(0.0)
            ),
            None => "the free memory the log gives is enough by vramscope's arithmetic".into(),
        };
    }
    let report = match profile::run(req, None, Arc::new(AtomicBool::new(false))) {
        Ok(r) => r,
        Err(e) => return format!("not reproduced: {}", first_clause(&e.to_string())),
    };
    *run = Some(run_doc(req, &report));
    let Some(o) = diagnose::outcome(&report) else {
        return "no answer for this release".into();
    };
    let non_kv = report
        .vllm_answer()
        .map_or(0.0, |a| a.formula.non_kv_bytes as f64 / GIB);
    let budget = total_gib * req.util;
    match (&o.failure, failure) {
        (Some(StartFailure::NoCacheBlocks), _) => format!(
            "the run of the same settings leaves no KV block either: weights, activation and \
             non-torch memory take {non_kv:.2} GiB of T·u = {budget:.2} GiB, {:.2} GiB short",
            non_kv - budget
        ),
        (Some(ours @ StartFailure::KvBelowMaxModelLen { .. }), _) => format!(
            "the run of the same settings fails the same check: {}",
            ours.cause()
        ),
        (Some(StartFailure::OutOfMemoryAfterKv { .. }), _) => format!(
            "the run of the same settings allocates {} and then runs out of memory in the CUDA \
             graph capture",
            o.kv_words()
        ),
        (Some(other), _) => format!("the run stops elsewhere: {}", other.cause()),
        (None, StartFailure::OutOfMemoryAfterKv { phase, .. }) => {
            let logged = facts
                .kv
                .as_ref()
                .map_or(String::new(), |k| format!(" (the log: {} GiB)", k.text));
            let room = report
                .graphs
                .as_ref()
                .map_or(total_gib - budget, |g| g.room_left_bytes as f64 / GIB);
            format!(
                "the run of the same settings allocates {}{logged} and leaves {room:.2} GiB of \
                 the GPU beside it after the graphs; {} after the KV cache is not in \
                 vramscope's run yet, so the shortfall is the log's",
                o.kv_words(),
                match phase {
                    diagnose::WarmUp::Sampler => "the sampler's warm-up",
                    _ => "this warm-up",
                }
            )
        }
        (None, _) => format!(
            "the run of the same settings starts ({}): the log's GPU had less than the \
             simulated one (another process, a larger CUDA context)",
            o.kv_words()
        ),
    }
}

/// What would start for a failure that is not memory.
fn fixes(failure: &StartFailure, facts: &LogFacts) -> Vec<String> {
    match failure {
        StartFailure::MaxModelLenOverPositions { .. }
        | StartFailure::HeadsNotDivisible { .. }
        | StartFailure::WorldOverGpus { .. } => diagnose::config_fixes(failure),
        StartFailure::NotDivisible { denominator, .. } => vec![format!(
            "a --tensor-parallel-size that divides the layer ({denominator} does not; a power \
             of two usually does)"
        )],
        StartFailure::DataParallelOverGpus { .. } => vec![
            "--data-parallel-size 1, or as many data-parallel ranks as the GPUs hold (each \
             takes TP × PP GPUs)"
                .into(),
        ],
        StartFailure::UnknownArchitecture { .. } => vec![format!(
            "a vLLM release newer than {} that has the architecture, or its plugin",
            facts.release.as_deref().unwrap_or("this one")
        )],
        StartFailure::UnknownQuantization { .. } => vec![
            "a --quantization method the release lists, or none (the checkpoint's own \
             quantization_config is read without the flag)"
                .into(),
        ],
        StartFailure::Sparse24Removed => vec![
            "vLLM 0.15 (or 0.11) on an H100 or H200, the last releases read that run \
             CompressedTensors24, or the dense checkpoint"
                .into(),
        ],
        StartFailure::ModelNotFound { model, network } => {
            if *network {
                vec![format!(
                    "download it where there is network (hf download {model}) and serve the \
                     folder, or set HF_HUB_OFFLINE=1 with the model in the cache"
                )]
            } else {
                vec![format!(
                    "a local folder with config.json, or the exact hub id (and HF_TOKEN for a \
                     gated model) instead of '{model}'"
                )]
            }
        }
        _ => Vec::new(),
    }
}

/// `plan --json`: the plan of a pasted line as data (docs/json.md gives the schema; it
/// round-trips through serde).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanDoc {
    /// The request as run (vLLM's defaults filled in where the run resolved them).
    pub settings: ProfileRequest,
    /// Whether vLLM would start (false: `diagnosis` says why not).
    pub starts: bool,
    pub diagnosis: Option<Diagnosis>,
    /// vramscope's run (`None` when a configuration check refused the line before it).
    pub vramscope: Option<RunDoc>,
    /// The terms vLLM would log, as vramscope's run gives them (`vllm` is `null`: no log).
    pub terms: Vec<TermDoc>,
    /// The notes: the model's origin, the release, flags not modelled.
    pub assumed: Vec<String>,
    /// The same run with one setting moved (those vramscope can run).
    pub what_if: Vec<WhatIfDoc>,
}

/// The plan document of a request and its run. `what_ifs`: run the variants (only for
/// `--json`, where they are asked for).
pub fn plan_doc(
    req: &ProfileRequest,
    report: Option<&Report>,
    diagnosis: Option<Diagnosis>,
    notes: &[String],
    what_ifs: bool,
) -> PlanDoc {
    let terms = report.map_or(Vec::new(), |r| {
        explain::compare(&LogFacts::default(), r)
            .rows
            .iter()
            .map(|row| TermDoc {
                term: row.term.to_string(),
                unit: if row.gib { "GiB" } else { "count" }.into(),
                vllm_logged: None,
                vllm: None,
                vramscope: row.ours,
                relative: None,
            })
            .collect()
    });
    let base = report.and_then(diagnose::outcome);
    let what_if = match (what_ifs, report) {
        (true, Some(_)) => explain::variants(req)
            .into_iter()
            .filter_map(|(label, v)| {
                let o = diagnose::try_run(&v).ok()?;
                Some(WhatIfDoc {
                    relative: base
                        .as_ref()
                        .map(|b| o.count as f64 / b.count.max(1) as f64 - 1.0),
                    change: label,
                    result: o,
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    PlanDoc {
        settings: report.map_or_else(|| req.clone(), |r| r.settings.clone()),
        starts: diagnosis.is_none(),
        diagnosis,
        vramscope: report.map(|r| run_doc(req, r)),
        terms,
        assumed: notes.to_vec(),
        what_if,
    }
}

/// A refusal's first clause, for a what-if row: the reason without the error kind's prefix or
/// the paragraph after it ("--quant fp8 with --vllm 0.19: vramscope reproduces fp8 as vLLM
/// 0.6.3 to 0.6.5 run it").
fn first_clause(msg: &str) -> &str {
    let m = msg.strip_prefix("invalid setting: ").unwrap_or(msg);
    m.split(';').next().unwrap_or(m).trim_end_matches('.')
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
        [
            f.pp.filter(|&p| p > 1).map(|p| format!(", PP {p}")),
            f.dp.filter(|&d| d > 1).map(|d| format!(", DP {d}")),
            f.enable_expert_parallel
                .filter(|&e| e)
                .map(|_| ", expert parallel".to_string()),
        ]
        .into_iter()
        .flatten()
        .collect::<String>(),
        f.max_model_len
            .map_or("not stated".into(), |l| l.to_string()),
        f.util.map_or("not stated".into(), |u| format!("{u}")),
        f.total
            .as_ref()
            .map_or("not stated".into(), |t| t.text.clone())
    ));
    // A model read from the hub cache is named by the hub id the log gave, not by its
    // snapshot folder (a commit hash).
    let from_cache = matches!(&req.model, crate::model::ModelSource::Path { path }
        if path.components().any(|c| c.as_os_str() == "snapshots"));
    let model = match (&f.model, from_cache) {
        (Some(id), true) => format!("{id} (the hub cache's copy)"),
        _ => r.model.name.clone(),
    };
    out.push(format!(
        "vramscope: vLLM {} on {}, {} ({}), {} tokens in {} sequences",
        req.vllm,
        req.device,
        model,
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
    if r.model.expert_parameters > 0 && (req.enable_expert_parallel || req.dp > 1) {
        out.push(format!(
            "{}{}: the MoE layers span tp × dp = {} GPUs; the table is the rank whose KV blocks the engine takes",
            if req.enable_expert_parallel {
                "expert parallel (each GPU holds whole experts)"
            } else {
                "experts cut over the replicas"
            },
            if req.dp > 1 {
                format!(", data parallel over {} replicas (each its own engine and KV cache)", req.dp)
            } else {
                String::new()
            },
            req.tp * req.dp
        ));
    } else if req.dp > 1 || req.enable_expert_parallel {
        out.push(format!(
            "{}{}",
            if req.dp > 1 {
                format!("data parallel over {} replicas (each its own engine and KV cache; a dense model's replicas are independent, so one runs for all)", req.dp)
            } else {
                String::new()
            },
            if req.enable_expert_parallel {
                "; enable_expert_parallel: the model has no routed experts, so it changes nothing (vLLM makes no expert-parallel group)"
            } else {
                ""
            }
        ).trim_start_matches("; ").to_string());
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
    // A multimodal model: the encoder's share of the non-KV memory vramscope computed.
    if let Some(enc) = r.encoder_sentence() {
        out.push(enc);
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

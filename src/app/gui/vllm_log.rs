//! The "vLLM log" side tab: a dropped vLLM startup log, its numbers beside the run of its
//! settings, term by term (the same comparison as `vramscope explain`).

use std::io::BufReader;
use std::path::Path;

use egui::RichText;

use super::fit_table::{fit_table, Cell, Row};

use crate::base::error::Result;
use crate::profile::explain::{self, Explanation, LogFacts, Overrides};
use crate::profile::{ProfileRequest, Report};

/// A log the user dropped: what it states, and the request that reproduces it.
pub struct LoadedLog {
    pub name: String,
    pub facts: LogFacts,
    pub request: ProfileRequest,
    pub assumptions: Vec<String>,
    /// The comparison with the report shown, when that report ran the log's settings.
    pub explanation: Option<Explanation>,
}

impl LoadedLog {
    /// Compares the log with `report` (once per report shown).
    pub fn explain(&mut self, report: Option<&Report>) {
        self.explanation = report
            .filter(|r| same_run(&r.settings, &self.request))
            .map(|r| explain::compare(&self.facts, r));
    }
}

/// Whether a dropped file is to be read as a vLLM log (by its name: `.log`, `.txt`, `.out`).
pub fn is_log_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| {
        ["log", "txt", "out", "err"]
            .iter()
            .any(|x| e.eq_ignore_ascii_case(x))
    })
}

/// Reads a log (streamed, bounded) and the request of its settings.
pub fn load(path: &Path) -> Result<LoadedLog> {
    let name = path
        .file_name()
        .map_or(path.display().to_string(), |n| n.to_string_lossy().into());
    let file = crate::base::fsguard::open_bounded(path, "log", crate::base::fsguard::LOG_LIMIT)?;
    let facts = explain::read_log(&name, BufReader::new(file))?;
    let (request, assumptions) = explain::request_of(&facts, &Overrides::default())?;
    Ok(LoadedLog {
        name,
        facts,
        request,
        assumptions,
        explanation: None,
    })
}

/// The tab: the comparison when the shown run has the log's settings.
pub fn ui(ui: &mut egui::Ui, log: Option<&LoadedLog>) {
    let Some(log) = log else {
        ui.label(
            "Already ran vLLM? Drop its startup log (.log or .txt) on the window: vramscope reads \
             the release, model and settings it states, runs the same profile, and shows vLLM's \
             numbers beside its own here. The command line does the same: vramscope explain \
             vllm.log.",
        );
        return;
    };
    ui.label(RichText::new(format!("vLLM log: {}", log.name)).strong());
    ui.label(format!(
        "vLLM {} · {} · TP {} · GPU {}",
        log.facts.release.as_deref().unwrap_or("(no version)"),
        log.facts.model.as_deref().unwrap_or("(no model)"),
        log.facts.tp.unwrap_or(1),
        log.facts
            .total
            .as_ref()
            .map_or("?".into(), |t| gib_text(t.value))
    ));
    if let Some(sum) = kv_arithmetic(&log.facts, &log.request) {
        ui.label(RichText::new(sum).strong());
    }
    for a in &log.assumptions {
        ui.label(RichText::new(format!("assumed: {a}")).weak());
    }
    ui.separator();
    let Some(e) = &log.explanation else {
        ui.label("The run of the log's settings is not the one shown: profile again (Ctrl+R) with the settings the log set.");
        return;
    };
    // Each row on two lines where the panel is narrow (1280x720): no column is cut.
    let header: Vec<Cell> = ["term", "vLLM log", "vramscope", "difference"]
        .into_iter()
        .map(|h| Cell::text(h).strong())
        .collect();
    let rows: Vec<Row> = e
        .rows
        .iter()
        .map(|row| Row {
            name: Cell::text(row.term),
            cells: vec![
                Cell::number(row.logged_text()),
                Cell::number(row.ours_text()),
                Cell::number(row.difference_text()),
            ],
        })
        .collect();
    fit_table(ui, "vllm-log", &header, &rows);
    if let Some(w) = &e.largest {
        ui.add_space(6.0);
        ui.label(RichText::new("Largest difference").strong());
        ui.label(w);
    }
}

/// A GiB figure as vLLM prints it (two decimals).
fn gib_text(gib: f64) -> String {
    format!("{gib:.2} GiB")
}

/// How the release got the log's KV cache from the log's own numbers (T × util, less what it
/// subtracts), and what that gives against what the log prints: "why did my log say 58.11
/// GiB". V0 0.6.4 subtracts the torch peak (weights inside it) and non-torch memory; 0.6.5 to
/// 0.8 and V1 the weights, the activation peak and non-torch memory (0.6.5 worker.py
/// determine_num_available_blocks; 0.19.0 v1/worker/gpu_worker.py L380-420); a release that
/// takes its CUDA graph estimate off the budget (0.21) subtracts that too.
fn kv_arithmetic(f: &LogFacts, request: &ProfileRequest) -> Option<String> {
    let kv = f.kv.as_ref()?;
    let util = f.util.unwrap_or(request.util);
    let budget = match (&f.requested, &f.total) {
        (Some(r), _) => r.value,
        (None, Some(t)) => t.value * util,
        _ => return None,
    };
    let mut terms: Vec<(&str, f64)> = Vec::new();
    match (&f.peak_torch, &f.weights, &f.activation) {
        (Some(p), _, _) => terms.push(("torch peak (weights inside)", p.value)),
        (None, Some(w), Some(a)) => {
            terms.push(("weights", w.value));
            terms.push(("activation peak", a.value));
        }
        _ => return None,
    }
    terms.push(("non-torch", f.non_torch.as_ref()?.value));
    let applied = crate::profile::vllm::release(&request.vllm)
        .is_ok_and(|r| r.estimator() == crate::profile::vllm::Estimator::Applied);
    if let (true, Some(g)) = (applied, &f.graph_estimate) {
        terms.push(("CUDA graph estimate", g.value));
    }
    let head = match (&f.requested, &f.total) {
        (Some(_), _) => format!("requested {}", gib_text(budget)),
        (None, Some(t)) => format!("{} × {util:.2} = {}", gib_text(t.value), gib_text(budget)),
        _ => unreachable!("checked above"),
    };
    let rest: f64 = budget - terms.iter().map(|(_, v)| v).sum::<f64>();
    // Each figure is printed rounded to 0.01 GiB: their sum may miss by as many hundredths.
    let rounding = (rest - kv.value).abs() <= 0.005 * (terms.len() + 2) as f64;
    Some(format!(
        "vLLM's KV cache from the log's numbers: {head}, less {} = {}; the log prints {}{}",
        terms
            .iter()
            .map(|(n, v)| format!("{n} {}", gib_text(*v)))
            .collect::<Vec<_>>()
            .join(", "),
        gib_text(rest),
        gib_text(kv.value),
        if rounding {
            " (its figures are rounded to 0.01 GiB)"
        } else {
            ", the difference is memory these lines do not name"
        }
    ))
}

/// The shown report ran the log's settings (the device total and the settings that set the
/// budget; a report holds the defaults it filled in, so those are not compared).
fn same_run(ran: &ProfileRequest, asked: &ProfileRequest) -> bool {
    ran.model == asked.model
        && ran.quant == asked.quant
        && ran.device == asked.device
        && ran.vllm == asked.vllm
        && ran.tp == asked.tp
        && (ran.util - asked.util).abs() < 1e-9
        && ran.kv_cache_dtype == asked.kv_cache_dtype
        && (asked.max_model_len == 0 || ran.max_model_len == asked.max_model_len)
}

//! The "vLLM log" side tab: a dropped vLLM startup log, its numbers beside the run of its
//! settings, term by term (the same comparison as `vramscope explain`).

use std::io::BufReader;
use std::path::Path;

use egui::RichText;

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
        "vLLM {} · {} · TP {} · GPU {} GiB",
        log.facts.release.as_deref().unwrap_or("(no version)"),
        log.facts.model.as_deref().unwrap_or("(no model)"),
        log.facts.tp.unwrap_or(1),
        log.facts
            .total
            .as_ref()
            .map_or("?".into(), |t| t.text.clone())
    ));
    for a in &log.assumptions {
        ui.label(RichText::new(format!("assumed: {a}")).weak());
    }
    ui.separator();
    let Some(e) = &log.explanation else {
        ui.label("The run of the log's settings is not the one shown: profile again (Ctrl+R) with the settings the log set.");
        return;
    };
    egui::Grid::new("vllm-log")
        .striped(true)
        .num_columns(4)
        .show(ui, |ui| {
            for h in ["term", "vLLM log", "vramscope", "difference"] {
                ui.label(RichText::new(h).strong());
            }
            ui.end_row();
            for row in &e.rows {
                ui.label(row.term);
                ui.label(row.logged_text());
                ui.label(row.ours_text());
                ui.label(row.difference_text());
                ui.end_row();
            }
        });
    if let Some(w) = &e.largest {
        ui.add_space(6.0);
        ui.label(RichText::new("Largest difference").strong());
        ui.label(w);
    }
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

//! Compare two runs: pin one (a run or an opened session), profile again or open another,
//! and read both side by side with the difference (fp16 against int8, old build against new,
//! H100 against L4).

use std::sync::Arc;

use egui::RichText;

use super::fit_table::{fit_table, Cell, Row};

use crate::base::units::fmt_i;
use crate::profile::formulas::FormulaId;
use crate::profile::Report;
use crate::report::lifetimes::Analysis;

/// One row of the delta table: a number of the pinned run (A) and of the shown one (B).
#[derive(Clone, Debug, PartialEq)]
pub struct DeltaRow {
    pub what: String,
    pub a: i64,
    pub b: i64,
    /// A count (blocks, tokens) rather than bytes.
    pub count: bool,
}

impl DeltaRow {
    pub fn delta(&self) -> i64 {
        self.b - self.a
    }
}

/// The numbers two runs are compared on, read from their reports and analyses.
pub fn delta_rows(a: (&Report, &Analysis), b: (&Report, &Analysis)) -> Vec<DeltaRow> {
    let mut rows = Vec::new();
    let mut add = |what: &str, count: bool, f: &dyn Fn(&Report, &Analysis) -> Option<i64>| {
        if let (Some(x), Some(y)) = (f(a.0, a.1), f(b.0, b.1)) {
            rows.push(DeltaRow {
                what: what.to_string(),
                a: x,
                b: y,
                count,
            });
        }
    };
    // The release's own answer first: its KV cache, blocks and tokens (an fp8 KV cache keeps
    // the bytes and doubles the blocks and tokens, which bytes alone showed as no change).
    add("vLLM's KV cache", false, &|r, _| {
        r.vllm_answer().map(|v| v.kv_bytes)
    });
    add("vLLM's KV blocks", true, &|r, _| {
        r.vllm_engine_blocks().map(|n| n as i64)
    });
    add("vLLM's KV tokens", true, &|r, _| {
        let v = r.vllm_answer()?;
        Some(r.kv_tokens_and_concurrency(&v).0 as i64)
    });
    let mut push = |what: &str, f: &dyn Fn(&Report, &Analysis) -> Option<i64>| add(what, false, f);
    push("weights", &|r, _| Some(r.weights_bytes as i64));
    push("framework peak Â", &|r, _| {
        Some(r.checkpoints.t3.allocated_peak as i64)
    });
    push("kept across passes (alive at t3)", &|_, a| {
        Some(a.kept.iter().map(|g| g.bytes_at_t3 as i64).sum())
    });
    for id in [FormulaId::Pr9352, FormulaId::Pr9516] {
        push(&format!("{} non-torch", id.short()), &move |r, _| {
            r.formula(id).map(|f| f.non_torch_bytes)
        });
        push(&format!("{} KV budget", id.short()), &move |r, _| {
            r.formula(id).map(|f| f.kv_bytes)
        });
    }
    push("truth non-KV", &|r, _| Some(r.truth.non_kv_bytes));
    push("truth KV budget", &|r, _| Some(r.truth.kv_bytes));
    push("#9516 - #9352 KV", &|r, _| {
        Some(r.formula(FormulaId::Pr9516)?.kv_bytes - r.formula(FormulaId::Pr9352)?.kv_bytes)
    });
    rows
}

/// A count with thousands separators, "-" below zero.
fn signed_count(v: i64) -> String {
    let t = crate::base::units::thousands(v.unsigned_abs());
    if v < 0 {
        format!("-{t}")
    } else {
        t
    }
}

fn describe(r: &Report) -> String {
    format!(
        "{} {} on {}{}",
        r.model.name,
        r.quant,
        r.device.name,
        // A simulated device's name says so already ("NVIDIA H100 80GB HBM3 (simulated)").
        if r.device.simulated && !r.device.name.contains("simulated") {
            " (simulated)"
        } else {
            ""
        }
    )
}

#[derive(Default)]
pub struct CompareView {
    pinned: Option<(Arc<Report>, Arc<Analysis>)>,
}

impl CompareView {
    pub fn pin(&mut self, r: Arc<Report>, a: Arc<Analysis>) {
        self.pinned = Some((r, a));
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, current: Option<(&Arc<Report>, &Arc<Analysis>)>) {
        ui.heading("Compare two runs");
        let mut unpin = false;
        match (&self.pinned, current) {
            (None, Some((r, a))) => {
                ui.label("Pin this run, then change a setting (fp16 to int8, another device) and profile again, or open another session.");
                if ui.button("Pin this run").clicked() {
                    self.pinned = Some((r.clone(), a.clone()));
                }
            }
            (None, None) => {
                ui.label("Profile or open a session first, then pin it here.");
            }
            (Some((pr, pa)), cur) => {
                ui.label(RichText::new(format!("A (pinned): {}", describe(pr))).strong());
                match cur {
                    Some((r, _)) if Arc::ptr_eq(r, pr) => {
                        ui.label("B: profile again or open a session to compare with A.");
                    }
                    Some((r, a)) => {
                        ui.label(RichText::new(format!("B (shown): {}", describe(r))).strong());
                        let header: Vec<Cell> = ["", "A", "B", "B - A"]
                            .into_iter()
                            .map(|h| Cell::text(h).strong())
                            .collect();
                        let rows: Vec<Row> = delta_rows((pr, pa), (r, a))
                            .into_iter()
                            .map(|row| Row {
                                name: Cell::text(&row.what),
                                cells: [row.a, row.b, row.delta()]
                                    .into_iter()
                                    .map(|v| {
                                        Cell::number(if row.count {
                                            signed_count(v)
                                        } else {
                                            fmt_i(v)
                                        })
                                    })
                                    .collect(),
                            })
                            .collect();
                        fit_table(ui, "delta", &header, &rows);
                    }
                    None => {
                        ui.label("B: waiting for a result.");
                    }
                }
                unpin = ui.button("Unpin").clicked();
            }
        }
        if unpin {
            self.pinned = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delta_of_a_run_with_itself_is_zero_and_rows_read_the_reports() {
        let r = crate::profile::tiny_dry_report(32);
        let a = Analysis::of(&r);
        let rows = delta_rows((&r, &a), (&r, &a));
        assert!(rows.iter().all(|x| x.delta() == 0));
        let kv = rows.iter().find(|x| x.what == "truth KV budget").unwrap();
        assert_eq!(kv.a, r.truth.kv_bytes);
        let w = rows.iter().find(|x| x.what == "weights").unwrap();
        assert_eq!(w.b, r.weights_bytes as i64);
        assert!(!w.count);
    }
}

//! The comparison panel: old (#9352) against new (#9516) against the measured truth, as big
//! budget numbers, a table, a bar chart and the one-sentence reason. Everything is read from
//! the Report; nothing is recomputed here.

use egui::{Color32, RichText};
use egui_plot::{Bar, BarChart, Plot};

use super::style::{c32, legible, BIG};
use crate::base::units::{fmt_i, fmt_u, GIB};
use crate::profile::formulas::FormulaId;
use crate::profile::report::{FormulaResult, Verify};
use crate::profile::Report;
use crate::report::palette;

#[derive(Default)]
pub struct ComparisonView {
    /// Also show v0.6.3, #10511 and #12126.
    pub show_other_formulas: bool,
}

/// The verify cell in the app: the CLI's words, on two lines when they are long, so three
/// columns fit the panel.
pub fn verify_cell(v: &Option<Verify>) -> String {
    match v {
        None => "not run".to_string(),
        Some(v) if v.ran && !v.oom && v.within_budget => {
            format!("ok\n{} spare", fmt_i(-v.overrun_bytes))
        }
        Some(v) if v.ran && !v.oom => format!("over budget by\n{}", fmt_i(v.overrun_bytes)),
        Some(v) => v.short(),
    }
}

fn verify_colour(v: &Option<Verify>, ui: &egui::Ui) -> Color32 {
    match v {
        Some(v) if v.ran && !v.oom && v.within_budget => {
            legible(palette::TRUTH, ui.visuals().dark_mode)
        }
        Some(v) if v.ran => legible(palette::OVER, ui.visuals().dark_mode),
        _ => ui.visuals().text_color(),
    }
}

impl ComparisonView {
    pub fn ui(&mut self, ui: &mut egui::Ui, report: Option<&Report>) {
        let Some(r) = report else {
            ui.heading("Old vs new KV-cache budget");
            ui.label("No results yet: click Profile (Ctrl+R) or open a saved session.");
            return;
        };
        let (Some(old), Some(new)) = (r.formula(FormulaId::Pr9352), r.formula(FormulaId::Pr9516))
        else {
            ui.colored_label(
                ui.visuals().error_fg_color,
                "This report has no #9352/#9516 results.",
            );
            return;
        };
        let dark = ui.visuals().dark_mode;
        ui.horizontal_wrapped(|ui| {
            ui.heading("Old vs new KV-cache budget");
            if r.device.simulated {
                ui.label(
                    RichText::new(format!("simulated device ({})", r.device.mode))
                        .color(ui.visuals().warn_fg_color),
                )
                .on_hover_text(format!("ground truth: {}", r.device.truth_source));
            }
        });
        ui.label(format!(
            "{} · {} · {} · {} tokens × {} seq · util {:.2}",
            r.model.name,
            r.quant,
            r.device.name,
            r.settings.tokens,
            r.settings.seqs,
            r.settings.util
        ));
        if let Some(a) = r
            .vllm_answer()
            .filter(|a| a.release.name != crate::profile::vllm::DEFAULT)
        {
            ui.label(format!(
                "vLLM {} ({}): {} KV blocks, {}{}",
                a.release.name,
                a.formula.id.short(),
                a.kv_blocks,
                fmt_i(a.kv_bytes),
                if r.settings.chunked_prefill == Some(true) {
                    " · chunked prefill"
                } else {
                    ""
                }
            ))
            .on_hover_text(a.release.changes);
        }
        if let Some(h) = r.does_not_fit() {
            ui.colored_label(legible(palette::OVER, ui.visuals().dark_mode), h);
        }
        if let Some(m) = &r.true_max {
            ui.label(format!(
                "true maximum: {} KV blocks ({}) serve {} passes within floor(T·u)",
                m.blocks,
                fmt_u(m.kv_bytes),
                m.serving_passes
            ))
            .on_hover_text(format!(
                "one block more: {} ({} verify runs)",
                m.one_more.message, m.probes
            ));
        }
        ui.add_space(4.0);
        ui.columns(3, |cols| {
            big_number(
                &mut cols[0],
                "#9352 old",
                old.kv_bytes,
                legible(palette::OLD, dark),
            );
            big_number(
                &mut cols[1],
                "#9516 new",
                new.kv_bytes,
                legible(palette::NEW, dark),
            );
            big_number(
                &mut cols[2],
                "measured truth",
                r.truth.kv_bytes,
                legible(palette::TRUTH, dark),
            );
        });
        ui.add_space(4.0);
        let why = r.old_vs_new_explanation();
        if !why.is_empty() {
            ui.label(RichText::new(why).italics());
        }
        ui.add_space(4.0);
        ui.checkbox(
            &mut self.show_other_formulas,
            "Show vLLM's other formulas (v0.6.3, #10511, #12126)",
        );
        let mut shown: Vec<&FormulaResult> = vec![old, new];
        if self.show_other_formulas {
            shown.extend(
                [FormulaId::V0_6_3, FormulaId::Pr10511, FormulaId::Pr12126]
                    .iter()
                    .filter_map(|id| r.formula(*id)),
            );
        }
        table(ui, r, &shown);
        ui.small("* inside the torch peak, not a separate term");
        ui.add_space(6.0);
        bars(ui, r, &shown);
    }
}

fn big_number(ui: &mut egui::Ui, title: &str, bytes: i64, colour: Color32) {
    ui.vertical(|ui| {
        ui.label(RichText::new(title).color(colour).strong());
        // As large as the column holds: a narrow panel (Present at 1280x720) shrinks the
        // number rather than cut it.
        let text = fmt_i(bytes);
        let at_big = ui.fonts_mut(|f| {
            f.layout_no_wrap(text.clone(), egui::FontId::proportional(BIG), colour)
                .size()
                .x
        });
        let size = (BIG * ui.available_width() / at_big.max(1.0))
            .min(BIG)
            .max(12.0);
        ui.label(RichText::new(text).size(size).color(colour).strong());
        ui.label(RichText::new("KV-cache budget").small());
    });
}

/// One cell of the budget table.
struct Cell {
    text: String,
    colour: Option<Color32>,
    hover: Option<String>,
}

impl Cell {
    fn plain(text: String) -> Cell {
        Cell {
            text,
            colour: None,
            hover: None,
        }
    }
}

/// The table's rows: a name (with what it means on hover) and one cell per formula, then the
/// truth's.
fn table_rows(
    r: &Report,
    shown: &[&FormulaResult],
    ui: &egui::Ui,
) -> Vec<(&'static str, Option<&'static str>, Vec<Cell>)> {
    let t = &r.truth;
    let per = |f: &dyn Fn(&FormulaResult) -> String, truth: String| -> Vec<Cell> {
        shown
            .iter()
            .map(|x| Cell::plain(f(x)))
            .chain([Cell::plain(truth)])
            .collect()
    };
    let verify: Vec<Cell> = shown
        .iter()
        .map(|f| &f.verify)
        .chain([&t.verify])
        .map(|v| Cell {
            text: verify_cell(v),
            colour: Some(verify_colour(v, ui)),
            hover: v.as_ref().map(|v| v.message.clone()),
        })
        .collect();
    vec![
        (
            "weights",
            Some("W, the framework memory the load added; marked * where a formula counts it inside the torch peak"),
            per(
                &|f| {
                    if f.weights_term_bytes == 0 {
                        format!("{}*", fmt_u(r.weights_bytes))
                    } else {
                        fmt_i(f.weights_term_bytes)
                    }
                },
                fmt_u(r.weights_bytes),
            ),
        ),
        ("torch peak", None, per(&|f| fmt_i(f.torch_peak_bytes), String::new())),
        ("non-torch", None, per(&|f| fmt_i(f.non_torch_bytes), String::new())),
        ("non-KV total", None, per(&|f| fmt_i(f.non_kv_bytes), fmt_i(t.non_kv_bytes))),
        ("KV budget", None, per(&|f| fmt_i(f.kv_bytes), fmt_i(t.kv_bytes))),
        ("blocks", None, per(&|f| f.kv_blocks.to_string(), t.kv_blocks.to_string())),
        (
            "max concurrency",
            None,
            per(
                &|f| format!("{:.2}x", f.max_concurrency),
                format!("{:.2}x", t.max_concurrency),
            ),
        ),
        ("error vs truth", None, per(&|f| fmt_i(f.error_bytes), String::new())),
        (
            "verify",
            Some("KV cache the budget grants + one more max-batch pass, inside T·u"),
            verify,
        ),
    ]
}

/// Old, new (and the others when asked) beside the truth. Where the panel is too narrow for a
/// name column and every value column on one line (Present at 1280x720), each row drops to two
/// lines: its name, then its values, each column an equal share of the width, a long cell
/// wrapping inside its share. No column is ever cut off.
fn table(ui: &mut egui::Ui, r: &Report, shown: &[&FormulaResult]) {
    let dark = ui.visuals().dark_mode;
    let mut header: Vec<Cell> = shown
        .iter()
        .map(|f| Cell {
            text: f.id.short().to_string(),
            colour: Some(legible(palette::formula(f.id), dark)),
            hover: Some(f.title.clone()),
        })
        .collect();
    header.push(Cell {
        text: "truth".into(),
        colour: Some(legible(palette::TRUTH, dark)),
        hover: None,
    });
    let rows = table_rows(r, shown, ui);
    let mono = egui::TextStyle::Monospace.resolve(ui.style());
    let body = egui::TextStyle::Body.resolve(ui.style());
    let width = |text: &str, font: &egui::FontId| {
        ui.fonts_mut(|f| {
            f.layout_no_wrap(text.to_string(), font.clone(), Color32::WHITE)
                .size()
                .x
        })
    };
    let gap = 8.0;
    let n = header.len();
    let mut col_w: Vec<f32> = header.iter().map(|c| width(&c.text, &body)).collect();
    for (_, _, cells) in &rows {
        for (j, c) in cells.iter().enumerate() {
            col_w[j] = col_w[j].max(width(&c.text, &mono));
        }
    }
    let name_w = rows
        .iter()
        .map(|(name, _, _)| width(name, &body))
        .fold(0.0, f32::max);
    let avail = ui.available_width();
    let one_line = name_w + col_w.iter().sum::<f32>() + gap * n as f32 + 4.0 <= avail;
    let value = |ui: &mut egui::Ui, c: &Cell| {
        let mut t = RichText::new(&c.text).monospace();
        if let Some(col) = c.colour {
            t = t.color(col);
        }
        let resp = ui.add(egui::Label::new(t).wrap());
        if let Some(h) = &c.hover {
            resp.on_hover_text(h);
        }
    };
    let head = |ui: &mut egui::Ui, c: &Cell| {
        let mut t = RichText::new(&c.text).strong();
        if let Some(col) = c.colour {
            t = t.color(col);
        }
        let resp = ui.label(t);
        if let Some(h) = &c.hover {
            resp.on_hover_text(h);
        }
    };
    if one_line {
        egui::Grid::new("comparison")
            .num_columns(n + 1)
            .striped(true)
            .spacing([gap, 6.0])
            .show(ui, |ui| {
                ui.label("");
                header.iter().for_each(|c| head(ui, c));
                ui.end_row();
                for (name, hover, cells) in &rows {
                    let l = ui.label(*name);
                    if let Some(h) = hover {
                        l.on_hover_text(*h);
                    }
                    cells.iter().for_each(|c| value(ui, c));
                    ui.end_row();
                }
            });
    } else {
        let share = ((avail - gap * (n as f32 - 1.0)) / n as f32)
            .floor()
            .max(40.0);
        egui::Grid::new("comparison-two-lines")
            .num_columns(n)
            .striped(true)
            .spacing([gap, 2.0])
            .min_col_width(share)
            .max_col_width(share)
            .show(ui, |ui| {
                header.iter().for_each(|c| head(ui, c));
                ui.end_row();
                for (name, hover, cells) in &rows {
                    let l = ui.add(egui::Label::new(RichText::new(*name).weak()).wrap());
                    if let Some(h) = hover {
                        l.on_hover_text(*h);
                    }
                    ui.end_row();
                    cells.iter().for_each(|c| value(ui, c));
                    ui.end_row();
                }
            });
    }
}

fn bars(ui: &mut egui::Ui, r: &Report, shown: &[&FormulaResult]) {
    let mut items: Vec<(String, i64, Color32)> = shown
        .iter()
        .map(|f| {
            (
                f.id.short().to_string(),
                f.kv_bytes,
                c32(palette::formula(f.id)),
            )
        })
        .collect();
    items.push(("truth".into(), r.truth.kv_bytes, c32(palette::TRUTH)));
    let names: Vec<String> = items.iter().map(|i| i.0.clone()).collect();
    let charts: Vec<BarChart> = items
        .iter()
        .enumerate()
        .map(|(i, (name, bytes, colour))| {
            BarChart::new(
                name.clone(),
                vec![Bar::new(i as f64, *bytes as f64 / GIB as f64)
                    .name(format!("{name}: {}", fmt_i(*bytes)))
                    .fill(*colour)
                    .width(0.7)],
            )
            .color(*colour)
        })
        .collect();
    let height = ui.available_height().clamp(140.0, 260.0);
    Plot::new("budget_bars")
        .height(height)
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .allow_boxed_zoom(false)
        .show_x(false)
        .include_y(0.0)
        .y_axis_label("KV budget (GiB)")
        .x_axis_formatter(move |m, _| {
            let i = m.value.round();
            if (m.value - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .show(ui, |pui| {
            for c in charts {
                pui.bar_chart(c);
            }
        });
}

/// Where T goes per formula, with the truth beside it: stacked horizontal bars in the
/// lifetime view's colours, each piece's size on hover, large numbers as they are.
pub fn waterfall(ui: &mut egui::Ui, r: &Report, a: &crate::report::lifetimes::Analysis) {
    use crate::report::budget::{bars, Piece};
    let dark = ui.visuals().dark_mode;
    ui.heading("Where the device goes");
    ui.label(format!(
        "T = {} split per formula; the KV budget is what is left of T·u = {}.",
        fmt_u(r.checkpoints.t0.total),
        fmt_i(crate::profile::formulas::budget(
            r.checkpoints.t0.total,
            r.settings.util,
            false
        ))
    ));
    let twice: u64 = a.kept.iter().map(|g| g.bytes_at_t3).sum();
    let bars = bars(r, twice);
    let total = r.checkpoints.t0.total.max(1) as f32;
    let label_w = 90.0;
    for b in &bars {
        ui.horizontal(|ui| {
            let (lr, _) = ui.allocate_exact_size(egui::vec2(label_w, 24.0), egui::Sense::hover());
            ui.painter().text(
                lr.left_center(),
                egui::Align2::LEFT_CENTER,
                &b.label,
                egui::FontId::proportional(15.0),
                super::style::legible(b.colour, dark),
            );
            let w = (ui.available_width() - 8.0).max(120.0);
            let (rect, resp) = ui.allocate_exact_size(egui::vec2(w, 24.0), egui::Sense::hover());
            let mut x = rect.left();
            let mut hover = Vec::new();
            for (piece, bytes) in &b.pieces {
                let pw = (*bytes).max(0) as f32 / total * w;
                let pr = egui::Rect::from_min_size(egui::pos2(x, rect.top()), egui::vec2(pw, 24.0));
                ui.painter().rect_filled(pr, 0.0, c32(piece.colour()));
                if *piece == Piece::CountedTwice && pw > 0.0 {
                    ui.painter().rect_stroke(
                        pr,
                        0.0,
                        egui::Stroke::new(1.5, c32(palette::KEPT_OUTLINE)),
                        egui::StrokeKind::Inside,
                    );
                }
                x += pw;
                if *bytes != 0 {
                    hover.push(format!("{}: {}", piece.label(), fmt_i(*bytes)));
                }
            }
            if b.kv_bytes < 0 {
                hover.push(format!("no room for the KV cache ({})", fmt_i(b.kv_bytes)));
            }
            resp.on_hover_text(hover.join("\n"));
        });
    }
    ui.horizontal_wrapped(|ui| {
        for p in Piece::ALL {
            super::style::swatch(ui, c32(p.colour()), p.label());
        }
    });
    egui::Grid::new("waterfall_numbers")
        .striped(true)
        .num_columns(4)
        .show(ui, |ui| {
            ui.label("");
            for h in ["peak above weights", "non-torch", "KV budget"] {
                ui.label(RichText::new(h).strong());
            }
            ui.end_row();
            for b in &bars {
                ui.label(RichText::new(&b.label).color(super::style::legible(b.colour, dark)));
                let get = |p: Piece| b.pieces.iter().find(|x| x.0 == p).map_or(0, |x| x.1);
                ui.monospace(fmt_i(get(Piece::Peak)));
                ui.monospace(fmt_i(get(Piece::NonTorch) + get(Piece::CountedTwice)));
                ui.monospace(fmt_i(b.kv_bytes));
                ui.end_row();
            }
        });
}

/// Who owns the framework peak and the process peak: bytes by category, the ten largest
/// tensors with op and layer, and bytes made and freed per layer per pass.
pub fn peak_owners(ui: &mut egui::Ui, a: &crate::report::lifetimes::Analysis) {
    ui.heading("Who owns the peak");
    for p in [&a.peaks.framework, &a.peaks.process].into_iter().flatten() {
        ui.label(
            RichText::new(format!(
                "{}: framework {} · process {} (event {})",
                p.what,
                fmt_u(p.allocated),
                fmt_u(p.process_used),
                p.event
            ))
            .strong(),
        );
        ui.horizontal_wrapped(|ui| {
            for (cat, bytes) in &p.by_category {
                super::style::swatch(
                    ui,
                    c32(palette::category(*cat)),
                    format!("{} {}", cat.label(), fmt_u(*bytes)),
                );
            }
        });
        egui::Grid::new(format!("top_{}", p.what))
            .striped(true)
            .num_columns(4)
            .show(ui, |ui| {
                for h in ["size", "tensor", "op", "layer"] {
                    ui.label(RichText::new(h).strong());
                }
                ui.end_row();
                for t in &p.top {
                    ui.monospace(fmt_u(t.bytes));
                    let name = RichText::new(&t.tensor);
                    ui.label(if t.kept {
                        name.background_color(c32(palette::KEPT))
                            .color(c32(palette::KEPT_OUTLINE))
                    } else {
                        name
                    });
                    ui.label(&t.op);
                    ui.label(t.layer.map_or("—".to_string(), |l| l.to_string()));
                    ui.end_row();
                }
            });
        ui.add_space(6.0);
    }
    egui::CollapsingHeader::new("Bytes made and freed per layer")
        .default_open(false)
        .show(ui, |ui| {
            egui::Grid::new("layers")
                .striped(true)
                .num_columns(4)
                .show(ui, |ui| {
                    for h in ["pass", "layer", "made", "freed"] {
                        ui.label(RichText::new(h).strong());
                    }
                    ui.end_row();
                    for l in &a.peaks.layers {
                        ui.label(l.pass.to_string());
                        ui.label(l.layer.map_or("—".to_string(), |x| x.to_string()));
                        ui.monospace(fmt_u(l.made_bytes));
                        ui.monospace(fmt_u(l.freed_bytes));
                        ui.end_row();
                    }
                });
        });
}

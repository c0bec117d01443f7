//! The comparison panel: old (#9352) against new (#9516) against the measured truth, as big
//! budget numbers, a table, a bar chart and the one-sentence reason. Everything is read from
//! the Report; nothing is recomputed here.

use egui::{Color32, RichText};
use egui_plot::{Bar, BarChart, Plot};

use super::fit_table::{fit_table, Cell, Row};
use super::fits::Fit;
use super::style::{c32, legible, BIG};
use crate::base::units::{fmt_i, fmt_u, thousands, GIB};
use crate::profile::formulas::FormulaId;
use crate::profile::report::{FormulaResult, Verify, VllmAnswer};
use crate::profile::{ProfileRequest, Report};
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
    /// The Budget tab. For a release other than the default, its own answer in vLLM's terms
    /// comes first and the formula comparison is one click below; for the default release the
    /// old/new comparison is the answer and stays the headline.
    /// `fits`: what would fit, each checked by a dry run, for the report shown or for the
    /// last run, which ran out of memory before it had a report (`unfit`, its headline).
    /// Returns the fit whose *Use* was clicked.
    pub fn ui(
        &mut self,
        ui: &mut egui::Ui,
        report: Option<&Report>,
        fits: Option<&[Fit]>,
        unfit: Option<&str>,
    ) -> Option<ProfileRequest> {
        let mut chosen = None;
        if let Some(h) = unfit {
            ui.label(
                RichText::new(h)
                    .heading()
                    .color(legible(palette::OVER, ui.visuals().dark_mode)),
            );
            if let Some(fits) = fits {
                fits_list(ui, fits, &mut chosen);
            }
            if report.is_some() {
                ui.separator();
                ui.label(RichText::new("The last run that started:").weak());
            }
        }
        // The fits found were the failed run's, not the report's below.
        let fits = if unfit.is_some() { None } else { fits };
        let Some(r) = report else {
            if unfit.is_none() {
                ui.heading("Old vs new KV-cache budget");
                ui.label("No results yet: click Profile (Ctrl+R) or open a saved session.");
            }
            return chosen;
        };
        match r
            .vllm_answer()
            .filter(|a| a.release.name != crate::profile::vllm::DEFAULT)
        {
            Some(a) => {
                release_answer(ui, r, &a, fits, &mut chosen);
                egui::CollapsingHeader::new("Formulas: #9352 vs #9516")
                    .id_salt("formula_comparison")
                    .default_open(false)
                    .show(ui, |ui| self.formulas(ui, r))
                    .header_response
                    .on_hover_text(
                        "The old (#9352) and new (#9516) budget formulas beside the measured \
                         truth, with vLLM's other formulas on request",
                    );
                graphs_section(ui, r);
                true_max_line(ui, r);
            }
            None => {
                heading(ui, r, "Old vs new KV-cache budget", None);
                context_line(ui, r);
                does_not_fit(ui, r, fits, &mut chosen);
                graphs_section(ui, r);
                true_max_line(ui, r);
                self.formulas(ui, r);
            }
        }
        chosen
    }

    /// Old against new beside the truth: big numbers, the reason, the table, the bars.
    fn formulas(&mut self, ui: &mut egui::Ui, r: &Report) {
        let (Some(old), Some(new)) = (r.formula(FormulaId::Pr9352), r.formula(FormulaId::Pr9516))
        else {
            ui.colored_label(
                ui.visuals().error_fg_color,
                "This report has no #9352/#9516 results.",
            );
            return;
        };
        let dark = ui.visuals().dark_mode;
        ui.add_space(4.0);
        ui.columns(3, |cols| {
            big_number(
                &mut cols[0],
                "#9352 old",
                &fmt_i(old.kv_bytes),
                "KV-cache budget",
                legible(palette::OLD, dark),
            );
            big_number(
                &mut cols[1],
                "#9516 new",
                &fmt_i(new.kv_bytes),
                "KV-cache budget",
                legible(palette::NEW, dark),
            );
            big_number(
                &mut cols[2],
                "measured truth",
                &fmt_i(r.truth.kv_bytes),
                "KV-cache budget",
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

/// The tab's heading, with the simulated-device warning beside it.
/// The release's changes, where given, on hover of the title.
fn heading(ui: &mut egui::Ui, r: &Report, title: &str, hover: Option<&str>) {
    ui.horizontal_wrapped(|ui| {
        let h = ui.heading(title);
        if let Some(text) = hover {
            h.on_hover_text(text);
        }
        if r.device.simulated {
            ui.label(
                RichText::new(format!("simulated device ({})", r.device.mode))
                    .color(ui.visuals().warn_fg_color),
            )
            .on_hover_text(format!("ground truth: {}", r.device.truth_source));
        }
    });
}

/// Model, quantization, device and the batch that ran.
fn context_line(ui: &mut egui::Ui, r: &Report) {
    ui.label(format!(
        "{} · {} · {}{} · {} tokens × {} seq · util {:.2}{}",
        r.model.name,
        r.quant,
        r.device.name,
        if r.tp > 1 {
            format!(" × {}", r.tp)
        } else {
            String::new()
        },
        r.settings.tokens,
        r.settings.seqs,
        r.settings.util,
        if r.settings.chunked_prefill == Some(true) {
            " · chunked prefill"
        } else {
            ""
        }
    ));
}

/// The chosen release's answer as its log would give it: the KV cache, its tokens, the
/// maximum concurrency, whether the instance still fits once its CUDA graphs are captured,
/// and the verify of the release's own budget.
fn release_answer(
    ui: &mut egui::Ui,
    r: &Report,
    a: &VllmAnswer<'_>,
    fits: Option<&[Fit]>,
    chosen: &mut Option<ProfileRequest>,
) {
    let dark = ui.visuals().dark_mode;
    heading(
        ui,
        r,
        &format!("vLLM {}: KV cache", a.release.name),
        Some(a.release.changes),
    );
    context_line(ui, r);
    does_not_fit(ui, r, fits, chosen);
    let (tokens, concurrency) = r.kv_tokens_and_concurrency(a);
    let colour = legible(palette::formula(a.formula.id), dark);
    let strong = ui.visuals().strong_text_color();
    ui.add_space(4.0);
    ui.columns(3, |cols| {
        big_number(
            &mut cols[0],
            "KV cache",
            &fmt_i(a.kv_bytes),
            &match engine_blocks(r, a) {
                Some(n) if n != a.kv_blocks => format!(
                    "{} blocks on this rank; the engine takes {} on every rank",
                    thousands(a.kv_blocks),
                    thousands(n)
                ),
                Some(_) => format!("{} blocks on every rank", thousands(a.kv_blocks)),
                None => format!("{} blocks", thousands(a.kv_blocks)),
            },
            colour,
        );
        big_number(
            &mut cols[1],
            "tokens",
            &thousands(tokens),
            "in the KV cache",
            strong,
        );
        big_number(
            &mut cols[2],
            "max concurrency",
            &format!("{concurrency:.2}x"),
            &format!(
                "at {} tokens per request",
                thousands(r.settings.max_model_len.max(1))
            ),
            strong,
        );
    });
    ui.add_space(2.0);
    if let Some((text, ok)) = fits_after_graphs(r) {
        ui.horizontal_wrapped(|ui| {
            ui.label("fits after its CUDA graphs:");
            ui.colored_label(
                legible(if ok { palette::TRUTH } else { palette::OVER }, dark),
                text,
            );
        });
    }
    ui.horizontal_wrapped(|ui| {
        ui.label(format!("verify of its budget ({}):", a.formula.id.short()))
            .on_hover_text(format!(
                "{}: the KV cache it grants, then one more max-batch pass, inside T·u",
                a.formula.title
            ));
        let v = &a.formula.verify;
        let resp = ui.colored_label(verify_colour(v, ui), verify_cell(v).replace('\n', " "));
        if let Some(v) = v {
            resp.on_hover_text(v.message.clone());
        }
    });
}

/// Where the release would not start the run: its headline, then what would, each checked
/// by a dry run (the report's own list of fixes is left out: it is unchecked, and its
/// `--util` could leave a single block).
fn does_not_fit(
    ui: &mut egui::Ui,
    r: &Report,
    fits: Option<&[Fit]>,
    chosen: &mut Option<ProfileRequest>,
) {
    let Some(h) = r.does_not_fit() else {
        // A start that fails later (a warm-up after the KV cache runs out of memory): the
        // fits the worker found say what starts.
        if let Some(fits) = fits.filter(|f| !f.is_empty()) {
            ui.label(
                RichText::new("Does not fit: vLLM would stop after allocating this KV cache.")
                    .strong()
                    .color(legible(palette::OVER, ui.visuals().dark_mode)),
            );
            fits_list(ui, fits, chosen);
        }
        return;
    };
    let head = h.split("; what would fit:").next().unwrap_or(&h);
    ui.label(
        RichText::new(format!("Does not fit. {head}"))
            .strong()
            .color(legible(palette::OVER, ui.visuals().dark_mode)),
    );
    if let Some(fits) = fits {
        fits_list(ui, fits, chosen);
    }
}

/// "What fits, each checked by a dry run:", a *Use* button per fit.
fn fits_list(ui: &mut egui::Ui, fits: &[Fit], chosen: &mut Option<ProfileRequest>) {
    if fits.is_empty() {
        ui.label(
            "Nothing tried fits (smaller weights, up to 8 GPUs of tensor parallel, each run dry).",
        );
        return;
    }
    ui.label("What fits, each checked by a dry run:");
    for f in fits {
        ui.horizontal_wrapped(|ui| {
            if ui
                .button("Use")
                .on_hover_text("Take these settings into the setup and profile them")
                .clicked()
            {
                *chosen = Some(f.request.clone());
            }
            ui.label(RichText::new(&f.change).strong());
            ui.label(&f.answer);
        });
    }
}

/// Whether the instance still fits on the device once its CUDA graphs are captured (after
/// the KV cache, as vLLM captures them), and the words for it; `None` without graphs.
fn fits_after_graphs(r: &Report) -> Option<(String, bool)> {
    let g = r.graphs.as_ref()?;
    if let Some(f) = &g.failed {
        return Some((format!("no, the capture runs out of memory ({f})"), false));
    }
    Some(if g.room_left_bytes >= 0 {
        (
            format!(
                "yes, {} of the device left after the capture",
                fmt_u(g.room_left_bytes as u64)
            ),
            true,
        )
    } else {
        (
            format!(
                "no, {} short after the capture",
                fmt_u(g.room_left_bytes.unsigned_abs())
            ),
            false,
        )
    })
}

/// What the release does with its CUDA graphs, folded (its sentences would push the numbers
/// below the fold), the header in the graphs' colour.
fn graphs_section(ui: &mut egui::Ui, r: &Report) {
    let lines = r.graph_summary();
    if lines.is_empty() {
        return;
    }
    egui::CollapsingHeader::new("CUDA graphs in detail")
        .id_salt("graph_summary")
        .default_open(false)
        .show(ui, |ui| {
            super::style::swatch(
                ui,
                c32(palette::category(crate::memory::Category::CudaGraph)),
                "the graph pool's bands in the views",
            );
            for line in &lines {
                ui.label(line);
            }
        });
}

/// With tensor parallel, the blocks the engine takes on every rank under the release's
/// formula (the fewest over the ranks); `None` on one GPU.
fn engine_blocks(r: &Report, a: &VllmAnswer<'_>) -> Option<u64> {
    // The engine's counts are the formula's; a release that takes its graph estimate off
    // the budget (0.21) grants fewer, so the formula's minimum is not its answer.
    if r.tp < 2 || r.graphs_estimate_applied() > 0 {
        return None;
    }
    r.engine
        .iter()
        .find(|e| e.key == a.formula.id.key())
        .map(|e| e.kv_blocks)
}

fn true_max_line(ui: &mut egui::Ui, r: &Report) {
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
}

fn big_number(ui: &mut egui::Ui, title: &str, text: &str, subtitle: &str, colour: Color32) {
    ui.vertical(|ui| {
        ui.label(RichText::new(title).color(colour).strong());
        // As large as the column holds: a narrow panel (Present at 1280x720) shrinks the
        // number rather than cut it.
        let at_big = ui.fonts_mut(|f| {
            f.layout_no_wrap(text.to_string(), egui::FontId::proportional(BIG), colour)
                .size()
                .x
        });
        let size = (BIG * ui.available_width() / at_big.max(1.0)).clamp(12.0, BIG);
        ui.label(RichText::new(text).size(size).color(colour).strong());
        ui.add(egui::Label::new(RichText::new(subtitle).small()).wrap());
    });
}

/// Old, new (and the others when asked) beside the truth; where the panel is narrow, each
/// row on two lines (`fit_table`), so no column is ever cut off.
fn table(ui: &mut egui::Ui, r: &Report, shown: &[&FormulaResult]) {
    let dark = ui.visuals().dark_mode;
    let mut header = vec![Cell::text("")];
    header.extend(shown.iter().map(|f| {
        Cell::text(f.id.short())
            .strong()
            .colour(legible(palette::formula(f.id), dark))
            .hover(f.title.clone())
    }));
    header.push(
        Cell::text("truth")
            .strong()
            .colour(legible(palette::TRUTH, dark)),
    );
    let t = &r.truth;
    let row = |name: &str, f: &dyn Fn(&FormulaResult) -> String, truth: String| Row {
        name: Cell::text(name),
        cells: shown
            .iter()
            .map(|x| Cell::number(f(x)))
            .chain([Cell::number(truth)])
            .collect(),
    };
    let mut weights = row(
        "weights",
        &|f| {
            if f.weights_term_bytes == 0 {
                format!("{}*", fmt_u(r.weights_bytes))
            } else {
                fmt_i(f.weights_term_bytes)
            }
        },
        fmt_u(r.weights_bytes),
    );
    weights.name = weights.name.hover(
        "W, the framework memory the load added; marked * where a formula counts it inside the torch peak",
    );
    let verify = Row {
        name: Cell::text("verify")
            .hover("KV cache the budget grants + one more max-batch pass, inside T·u"),
        cells: shown
            .iter()
            .map(|f| &f.verify)
            .chain([&t.verify])
            .map(|v| {
                let c = Cell::number(verify_cell(v)).colour(verify_colour(v, ui));
                // The whole story (where it ran out of memory, cache given back) on hover.
                match v {
                    Some(v) => c.hover(v.message.clone()),
                    None => c,
                }
            })
            .collect(),
    };
    let rows = vec![
        weights,
        row("torch peak", &|f| fmt_i(f.torch_peak_bytes), String::new()),
        row("non-torch", &|f| fmt_i(f.non_torch_bytes), String::new()),
        row(
            "non-KV total",
            &|f| fmt_i(f.non_kv_bytes),
            fmt_i(t.non_kv_bytes),
        ),
        row("KV budget", &|f| fmt_i(f.kv_bytes), fmt_i(t.kv_bytes)),
        row(
            "blocks",
            &|f| f.kv_blocks.to_string(),
            t.kv_blocks.to_string(),
        ),
        row(
            "max concurrency",
            &|f| format!("{:.2}x", f.max_concurrency),
            format!("{:.2}x", t.max_concurrency),
        ),
        row("error vs truth", &|f| fmt_i(f.error_bytes), String::new()),
        verify,
    ];
    fit_table(ui, "comparison", &header, &rows);
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
    if let Some(e) = r.experts_sentence() {
        ui.label(e);
    }
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
    let header: Vec<Cell> = ["", "peak above weights", "non-torch", "KV budget"]
        .into_iter()
        .map(|h| Cell::text(h).strong())
        .collect();
    let rows: Vec<Row> = bars
        .iter()
        .map(|b| {
            let get = |p: Piece| b.pieces.iter().find(|x| x.0 == p).map_or(0, |x| x.1);
            Row {
                name: Cell::text(&b.label).colour(super::style::legible(b.colour, dark)),
                cells: vec![
                    Cell::number(fmt_i(get(Piece::Peak))),
                    Cell::number(fmt_i(get(Piece::NonTorch) + get(Piece::CountedTwice))),
                    Cell::number(fmt_i(b.kv_bytes)),
                ],
            }
        })
        .collect();
    fit_table(ui, "waterfall_numbers", &header, &rows);
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
        let header: Vec<Cell> = ["tensor", "size", "op", "layer"]
            .into_iter()
            .map(|h| Cell::text(h).strong())
            .collect();
        let rows: Vec<Row> = p
            .top
            .iter()
            .map(|t| Row {
                name: if t.kept {
                    Cell::text(&t.tensor)
                        .background(c32(palette::KEPT))
                        .colour(c32(palette::KEPT_OUTLINE))
                } else {
                    Cell::text(&t.tensor)
                },
                cells: vec![
                    Cell::number(fmt_u(t.bytes)),
                    Cell::text(&t.op),
                    Cell::text(t.layer.map_or("—".to_string(), |l| l.to_string())),
                ],
            })
            .collect();
        fit_table(ui, &format!("top_{}", p.what), &header, &rows);
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

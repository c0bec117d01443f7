//! The timeline plot: framework allocated/reserved, device used and non-framework memory over
//! time, passes shaded, checkpoints t0..t3 marked, optionally stacked by category. A million
//! events plot smoothly because only what the pixel columns can show is drawn
//! (`crate::report::timeline::reduce`), and reductions are cached per view.

use egui::{Align2, Color32, RichText};
use egui_plot::{Line, LineStyle, PlotPoint, Span, Text, VLine};

use super::axis::AxisKind;
use super::plot::{base_plot, wheel_zoom};
use super::style::{c32, legible, on_bg};
use crate::base::units::{fmt_i, fmt_u};
use crate::memory::{Category, Event, EventKind};
use crate::profile::report::DeviceSample;
use crate::profile::Report;
use crate::report::lifetimes::formula_short;
use crate::report::palette;
use crate::report::timeline::{
    first_at, reduce, reduce_by_index, reduce_samples, Series, NVML_LABEL,
};

/// The line series, in legend order.
const SERIES: [Series; 4] = [
    Series::DeviceUsed,
    Series::Reserved,
    Series::Allocated,
    Series::NonFramework,
];

/// Above this many events in view, draw from a precomputed full-range reduction instead of
/// reducing the view's events again (keeps a zoom/pan frame well under 16 ms).
const LIVE_REDUCE_LIMIT: usize = 60_000;
/// Column counts of the precomputed full-range reductions.
const LEVELS: [usize; 4] = [2048, 8192, 32_768, 131_072];

fn series_colour(s: Series, dark: bool) -> Color32 {
    match s {
        Series::Allocated => legible(palette::ALLOCATED, dark),
        Series::Reserved => legible(palette::RESERVED, dark),
        Series::DeviceUsed => legible(palette::DEVICE_USED, dark),
        Series::ProcessUsed => legible(palette::PROCESS_USED, dark),
        Series::NonFramework => legible(palette::category(Category::NonFramework), dark),
    }
}

/// A pass as the plot shades it.
#[derive(Clone, Debug, PartialEq)]
pub struct PassSpan {
    pub label: String,
    pub start_us: u64,
    pub end_us: u64,
}

/// Timeline options and caches. One per app.
#[derive(Default)]
pub struct TimelineView {
    pub stacked: bool,
    /// x = event index instead of time: a dry run's wall time says little (it is the speed of
    /// the bookkeeping), while event order spreads every pass out evenly.
    pub by_event: bool,
    /// Which of `SERIES` are drawn.
    pub hidden: [bool; 4],
    /// The NVML samples' line (a GPU run's) not drawn.
    pub hide_nvml: bool,
    reset: bool,
    cache: Cache,
    /// Where the last frame drew the plot (for tests that read its axis back).
    last_transform: Option<egui_plot::PlotTransform>,
}

#[derive(Default)]
struct Cache {
    /// Identifies the event source; a new run or session bumps it.
    generation: u64,
    len: usize,
    fresh: bool,
    passes: Vec<PassSpan>,
    /// vLLM's CUDA graph phases (estimate, capture), from their markers.
    graph_phases: Vec<PassSpan>,
    markers: Vec<(u64, String)>,
    /// The highest total (allocated, reserved, device used, process used) of the events seen.
    top_bytes: u64,
    /// Full-range reductions per `LEVELS` entry; [time axis, event axis].
    levels: [Vec<Option<SeriesPoints>>; 2],
    view_key: Option<ViewKey>,
    view_lines: Vec<Vec<[f64; 2]>>,
    /// The GPU's NVML readings reduced to the view (time axis only).
    view_samples: Vec<[f64; 2]>,
    view_stack: Vec<Vec<[f64; 2]>>,
}

/// What a view's reductions were made from: when it changes, they are made again.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ViewKey {
    generation: u64,
    events: usize,
    samples: usize,
    by_event: bool,
    x0: f64,
    x1: f64,
    width_px: usize,
    stacked: bool,
}

/// Reduced points of each of `SERIES`.
type SeriesPoints = [Vec<[f64; 2]>; 4];

/// What the plot needs besides the events.
pub struct TimelineInput<'a> {
    pub events: &'a [Event],
    /// Changes whenever `events` comes from a different run.
    pub generation: u64,
    pub report: Option<&'a Report>,
}

impl TimelineView {
    /// Resets zoom and pan on the next frame (the plot's own double-click does the same).
    pub fn reset_view(&mut self) {
        self.reset = true;
    }

    /// The plot's rectangle on screen in the last frame.
    pub fn plot_rect(&self) -> Option<egui::Rect> {
        self.last_transform.map(|t| *t.frame())
    }

    /// Where (time in s or event index, bytes) landed on screen in the last frame.
    pub fn screen_pos(&self, x: f64, bytes: f64) -> Option<egui::Pos2> {
        self.last_transform
            .map(|t| t.position_from_point(&PlotPoint::new(x, bytes)))
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, input: &TimelineInput<'_>) {
        let dark = ui.visuals().dark_mode;
        ui.horizontal_wrapped(|ui| {
            ui.label(RichText::new("Timeline").heading());
            ui.toggle_value(&mut self.stacked, "Stack by category");
            if ui
                .toggle_value(&mut self.by_event, "x: event order")
                .on_hover_text("Plot against event order instead of time (spreads out dry runs)")
                .changed()
            {
                self.reset = true;
            }
            for (i, s) in SERIES.iter().enumerate() {
                let mut shown = !self.hidden[i];
                let text = RichText::new(s.label())
                    .color(series_colour(*s, dark))
                    .strong();
                if ui.checkbox(&mut shown, text).changed() {
                    self.hidden[i] = !shown;
                }
            }
            // A GPU run's NVML readings are a fifth line, named beside the four.
            if input.report.is_some_and(|r| !r.device_samples.is_empty()) {
                let mut shown = !self.hide_nvml;
                let text = RichText::new(NVML_LABEL)
                    .color(series_colour(Series::ProcessUsed, dark))
                    .strong();
                if ui.checkbox(&mut shown, text).changed() {
                    self.hide_nvml = !shown;
                }
            }
            if ui.button("Reset view").clicked() {
                self.reset = true;
            }
        });
        if self.stacked {
            ui.horizontal_wrapped(|ui| {
                for c in Category::ALL {
                    super::style::swatch(ui, c32(palette::category(c)), c.label());
                }
            });
        }
        if input.events.is_empty() {
            ui.centered_and_justified(|ui| {
                ui.label("Click Profile (Ctrl+R) to record a timeline.");
            });
            return;
        }
        self.refresh(input);
        let by_event = self.by_event;
        let x_end = if by_event {
            input.events.len() as f64
        } else {
            input.events.last().map_or(0, |e| e.time_us) as f64 * 1e-6
        };

        // The series' checkboxes above name the lines in their colours: no legend over the
        // plot. A finished run opens on its profile (t0..t3); the verify passes, with their
        // KV caches, are to the right and set no axis until zoomed out to.
        let x_kind = if by_event {
            AxisKind::Events
        } else {
            AxisKind::Seconds
        };
        let mut plot = base_plot(ui, "timeline", x_kind)
            .include_y(0.0)
            .x_axis_label(if by_event {
                "event order (index in the timeline)"
            } else {
                "time since the run started"
            });
        // The bounds always come from the data, never from the plot's own items: the pass and
        // checkpoint labels hang from the top of the view, and egui_plot's automatic bounds
        // count text, so each frame of a live run grew the axis by its margin (35 GiB, then
        // TiB, for data under 1 GiB). A finished run opens on its profile (to t3); a live run
        // shows everything so far.
        let (x_max, y_max) = match profile_extent(input.events, by_event) {
            // A little past t3, so the t2 and t3 labels (drawn right of their marks) show.
            Some((x, y)) => (x * 1.05, y),
            None => (x_end.max(1e-6), (self.cache.top_bytes as f64).max(1.0)),
        };
        plot = plot
            .default_x_bounds(0.0, x_max)
            // Room above the top for the pass and checkpoint labels hanging from it.
            .default_y_bounds(0.0, y_max * 1.25);
        if self.reset {
            plot = plot.reset();
            self.reset = false;
        }
        let events = input.events;
        // The GPU's NVML readings of this process, on the time axis only (they have no event
        // index).
        let samples = input
            .report
            .map_or(&[][..], |r| r.device_samples.as_slice());
        // Pass and checkpoint labels grow with the text (Present).
        let body = egui::TextStyle::Body.resolve(ui.style()).size;
        // vLLM's CUDA graph estimate and what the graphs took, as two levels over the capture
        // phase: this process's memory when the capture began, plus each.
        let graph_levels = input.report.and_then(|r| {
            let g = r.graphs.as_ref()?;
            let at = |name: &str| {
                events
                    .iter()
                    .find(|e| e.kind == EventKind::Marker && e.tensor == name)
            };
            let (start, end) = (at("cudagraph capture")?, at("cudagraph capture end")?);
            let base = start.process_used as f64;
            Some((
                start.time_us,
                end.time_us,
                base + g.took_bytes as f64,
                g.estimate.as_ref().map(|e| base + e.total_bytes as f64),
            ))
        });
        let cache = &mut self.cache;
        let stacked = self.stacked;
        let hidden = self.hidden;
        let resp = plot.show(ui, |pui| {
            wheel_zoom(pui);
            let b = pui.plot_bounds();
            let width_px = pui.transform().frame().width().max(16.0) as usize;
            let (x0, x1) = if pui.auto_bounds().x || b.width() <= 0.0 {
                (0.0, x_end)
            } else {
                (b.min()[0].max(0.0), b.max()[0].max(0.0))
            };
            cache.update_view(events, samples, by_event, x0, x1, width_px, stacked);
            // Where a time lands on the x axis.
            let xt = |t_us: u64| {
                if by_event {
                    first_at(events, t_us) as f64
                } else {
                    t_us as f64 * 1e-6
                }
            };
            let px_per_x = width_px as f64 / b.width().max(1e-12);
            // Pass and checkpoint labels hang from the top of the view (wherever the data
            // reaches), staggered so neighbours never overwrite each other.
            let label_top = b.max()[1];
            for (i, p) in cache.passes.iter().enumerate() {
                let fill = if i % 2 == 0 { 40 } else { 22 };
                let colour = if dark {
                    Color32::from_white_alpha(fill)
                } else {
                    Color32::from_black_alpha(fill / 2)
                };
                let (sx, ex) = (xt(p.start_us), xt(p.end_us.saturating_add(1)));
                pui.span(Span::new("", sx..=ex).fill(colour).border_width(0.0));
                // Label a pass only where its span is wide enough to hold the text.
                let span_px = (ex - sx) * px_per_x;
                if span_px >= p.label.len() as f64 * 0.45 * body as f64 + 4.0 {
                    pui.text(
                        Text::new(
                            "",
                            PlotPoint::new(sx, label_top - 0.12 * b.height()),
                            RichText::new(&p.label).size(body * 0.85),
                        )
                        .anchor(Align2::LEFT_TOP),
                    );
                }
            }
            // The CUDA graph phases: bands of their own in the graphs' colour, labelled; one
            // right of the view is named at its right edge.
            let graph_colour = on_bg(palette::category(Category::CudaGraph), dark);
            let graph_y = label_top - 0.18 * b.height();
            let mut right_of_view: Vec<&str> = Vec::new();
            for g in &cache.graph_phases {
                let (sx, ex) = (xt(g.start_us), xt(g.end_us.saturating_add(1)));
                if sx > b.max()[0] {
                    right_of_view.push(&g.label);
                    continue;
                }
                pui.span(
                    Span::new("", sx..=ex)
                        .fill(graph_colour.gamma_multiply(0.16))
                        .border_width(0.0),
                );
                if ex >= b.min()[0] {
                    pui.text(
                        Text::new(
                            "",
                            PlotPoint::new(sx.max(b.min()[0]), graph_y),
                            RichText::new(&g.label)
                                .size(body * 0.85)
                                .color(graph_colour),
                        )
                        .anchor(Align2::LEFT_TOP),
                    );
                }
            }
            if !right_of_view.is_empty() {
                pui.text(
                    Text::new(
                        "",
                        PlotPoint::new(b.max()[0], graph_y),
                        RichText::new(format!(
                            "{} right of the view (zoom out)",
                            right_of_view.join(", ")
                        ))
                        .size(body * 0.85)
                        .color(graph_colour),
                    )
                    .anchor(Align2::RIGHT_TOP),
                );
            }
            for (k, (t, label)) in cache.markers.iter().enumerate() {
                let x = xt(*t);
                // Staggered heights, so neighbouring checkpoints do not overwrite each other.
                let y = label_top - if k % 2 == 0 { 0.0 } else { 0.06 * b.height() };
                pui.vline(
                    VLine::new("", x)
                        .color(on_bg(palette::PROCESS_USED, dark))
                        .style(LineStyle::dashed_loose())
                        .width(1.2),
                );
                pui.text(
                    Text::new(
                        "",
                        PlotPoint::new(x, y),
                        RichText::new(format!(" {label}"))
                            .strong()
                            .size(body * 0.95),
                    )
                    .anchor(Align2::LEFT_TOP),
                );
            }
            if stacked {
                // Largest cumulative first, so each smaller one paints over it.
                for (ci, pts) in cache.view_stack.iter().enumerate().rev() {
                    let c = Category::ALL[ci];
                    pui.line(
                        Line::new(format!("stack: {}", c.label()), pts.clone())
                            .color(c32(palette::category(c)))
                            .fill(0.0)
                            .fill_alpha(0.85)
                            .width(1.0),
                    );
                }
            }
            for (i, s) in SERIES.iter().enumerate() {
                if hidden[i] {
                    continue;
                }
                pui.line(
                    Line::new(s.label(), cache.view_lines[i].clone())
                        .color(series_colour(*s, dark))
                        .width(if *s == Series::Allocated { 2.2 } else { 1.6 }),
                );
            }
            if let Some((t0, t1, actual, estimate)) = graph_levels {
                let (x0, x1) = (xt(t0), xt(t1));
                let colour = on_bg(palette::category(Category::CudaGraph), dark);
                pui.line(
                    Line::new("CUDA graphs: actual", vec![[x0, actual], [x1, actual]])
                        .color(colour)
                        .width(2.0),
                );
                if let Some(e) = estimate {
                    pui.line(
                        Line::new("CUDA graphs: vLLM's estimate", vec![[x0, e], [x1, e]])
                            .color(colour)
                            .style(LineStyle::dashed_dense())
                            .width(2.0),
                    );
                }
            }
            if !cache.view_samples.is_empty() && !self.hide_nvml {
                pui.line(
                    Line::new(NVML_LABEL, cache.view_samples.clone())
                        .color(series_colour(Series::ProcessUsed, dark))
                        .style(LineStyle::dashed_dense())
                        .width(1.4),
                );
            }
            pui.pointer_coordinate().and_then(|p| {
                let per_px = b.width().max(1e-9) / width_px as f64;
                if by_event {
                    event_near_index(events, p.x, per_px)
                } else {
                    event_near(events, p.x, per_px)
                }
            })
        });
        self.last_transform = Some(resp.transform);
        if let Some(i) = resp.inner {
            let e = &events[i];
            resp.response
                .on_hover_ui_at_pointer(|ui| event_tooltip(ui, e));
        }
    }

    fn refresh(&mut self, input: &TimelineInput<'_>) {
        let c = &mut self.cache;
        if c.generation != input.generation || input.events.len() < c.len {
            *c = Cache {
                generation: input.generation,
                ..Cache::default()
            };
            self.reset = true;
        }
        if c.fresh && c.len == input.events.len() {
            return;
        }
        c.fresh = true;
        let seen = c.len.min(input.events.len());
        c.top_bytes = input.events[seen..]
            .iter()
            .map(|e| {
                e.allocated
                    .max(e.reserved)
                    .max(e.device_used)
                    .max(e.process_used)
            })
            .fold(c.top_bytes, u64::max);
        c.len = input.events.len();
        c.levels = [vec![None; LEVELS.len()], vec![None; LEVELS.len()]];
        c.view_key = None;
        c.passes = pass_spans(input.events, input.report);
        c.graph_phases = graph_spans(input.events);
        c.markers = input
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Marker && is_checkpoint(&e.tensor))
            .map(|e| (e.time_us, e.tensor.clone()))
            .collect();
    }
}

impl Cache {
    #[allow(clippy::too_many_arguments)]
    fn update_view(
        &mut self,
        events: &[Event],
        samples: &[DeviceSample],
        by_event: bool,
        x0: f64,
        x1: f64,
        width_px: usize,
        stacked: bool,
    ) {
        let key = ViewKey {
            generation: self.generation,
            events: self.len,
            samples: samples.len(),
            by_event,
            x0,
            x1,
            width_px,
            stacked,
        };
        if self.view_key == Some(key) {
            return;
        }
        self.view_key = Some(key);
        let n = events.len();
        let t_end = events.last().map_or(0, |e| e.time_us).max(1);
        let (t0, t1) = ((x0 * 1e6) as u64, ((x1 * 1e6).ceil() as u64).max(1));
        let (i0, i1) = if by_event {
            (
                (x0.floor() as usize).min(n),
                ((x1.ceil() as usize) + 1).min(n),
            )
        } else {
            (first_at(events, t0), first_at(events, t1.saturating_add(1)))
        };
        self.view_lines = if i1.saturating_sub(i0) <= LIVE_REDUCE_LIMIT {
            SERIES
                .iter()
                .map(|s| {
                    if by_event {
                        reduce_by_index(events, *s, i0, i1, width_px)
                    } else {
                        reduce(events, *s, t0, t1.max(t0 + 1), width_px)
                    }
                })
                .collect()
        } else {
            // The coarsest full-range level that still gives a point per pixel column here.
            let x_end = if by_event {
                n as f64
            } else {
                t_end as f64 * 1e-6
            };
            let fraction = (x1 - x0) / x_end.max(1e-12);
            let li = LEVELS
                .iter()
                .position(|&cols| cols as f64 * fraction >= width_px as f64)
                .unwrap_or(LEVELS.len() - 1);
            let level = self.levels[usize::from(by_event)][li].get_or_insert_with(|| {
                SERIES.map(|s| {
                    if by_event {
                        reduce_by_index(events, s, 0, n, LEVELS[li])
                    } else {
                        reduce(events, s, 0, t_end, LEVELS[li])
                    }
                })
            });
            level
                .iter()
                .map(|pts| {
                    let a = pts.partition_point(|p| p[0] < x0).saturating_sub(1);
                    let b = (pts.partition_point(|p| p[0] <= x1) + 1).min(pts.len());
                    pts[a..b].to_vec()
                })
                .collect()
        };
        self.view_stack = if stacked {
            stack_by_category(events, i0, i1, width_px, by_event)
        } else {
            Vec::new()
        };
        self.view_samples = if by_event {
            Vec::new()
        } else {
            reduce_samples(samples, t0, t1.max(t0 + 1), width_px)
        };
    }
}

/// vLLM's CUDA graph phases between their markers (a phase still open ends at the last
/// event: a live run).
fn graph_spans(events: &[Event]) -> Vec<PassSpan> {
    use crate::report::lifetimes::{GRAPH_CAPTURE, GRAPH_ESTIMATE};
    let mut out = Vec::new();
    let mut open: Option<(&str, u64)> = None;
    for e in events.iter().filter(|e| e.kind == EventKind::Marker) {
        match e.tensor.as_str() {
            "cudagraph estimate" => open = Some((GRAPH_ESTIMATE, e.time_us)),
            "cudagraph capture" => open = Some((GRAPH_CAPTURE, e.time_us)),
            "cudagraph estimate end" | "cudagraph capture end" => {
                if let Some((label, start_us)) = open.take() {
                    out.push(PassSpan {
                        label: label.into(),
                        start_us,
                        end_us: e.time_us,
                    });
                }
            }
            _ => {}
        }
    }
    if let (Some((label, start_us)), Some(last)) = (open, events.last()) {
        out.push(PassSpan {
            label: label.into(),
            start_us,
            end_us: last.time_us,
        });
    }
    out
}

fn is_checkpoint(label: &str) -> bool {
    matches!(label, "t0" | "t1" | "t2" | "t3")
}

/// Pass spans from the report when there is one, else from the events' pass numbers (live).
pub fn pass_spans(events: &[Event], report: Option<&Report>) -> Vec<PassSpan> {
    if let Some(r) = report {
        if !r.passes.is_empty() {
            return r
                .passes
                .iter()
                .map(|p| PassSpan {
                    label: match &p.verify_for {
                        None => format!("pass {}", p.index),
                        Some(f) => format!("verify {}", formula_short(f)),
                    },
                    start_us: p.start_us,
                    end_us: p.end_us,
                })
                .collect();
        }
    }
    let mut out: Vec<PassSpan> = Vec::new();
    let mut current: Option<(u32, u64, u64)> = None;
    for e in events {
        match (&mut current, e.pass) {
            (Some((p, _, end)), q) if *p == q => *end = e.time_us,
            (cur, q) => {
                if let Some((p, s, end)) = cur.take() {
                    out.push(PassSpan {
                        label: format!("pass {p}"),
                        start_us: s,
                        end_us: end,
                    });
                }
                if q > 0 {
                    *cur = Some((q, e.time_us, e.time_us));
                }
            }
        }
    }
    if let Some((p, s, end)) = current {
        out.push(PassSpan {
            label: format!("pass {p}"),
            start_us: s,
            end_us: end,
        });
    }
    out
}

/// Running bytes per category (framework blocks by what they hold, plus memory outside the
/// framework), cumulated in `Category::ALL` order so the last series is the stack's top.
/// Covers events `i0..i1`, sampled per pixel column at the column's highest total, so peaks
/// survive; x is the time in seconds, or the event index when `by_event`.
fn stack_by_category(
    events: &[Event],
    i0: usize,
    i1: usize,
    columns: usize,
    by_event: bool,
) -> Vec<Vec<[f64; 2]>> {
    let n = Category::ALL.len();
    let mut out = vec![Vec::with_capacity(columns * 2); n];
    let i1 = i1.min(events.len());
    if i0 >= i1 {
        return out;
    }
    let x_of = |i: usize| {
        if by_event {
            i as f64
        } else {
            events[i].time_us as f64 * 1e-6
        }
    };
    let (x0, x1) = (x_of(i0), x_of(i1 - 1));
    let span = (x1 - x0).max(1e-12);
    let mut totals = [0i64; Category::ALL.len()];
    let mut col: Option<i64> = None;
    let mut best: Option<(f64, [i64; Category::ALL.len()], i64)> = None;
    let push = |out: &mut Vec<Vec<[f64; 2]>>, x: f64, tot: &[i64; Category::ALL.len()]| {
        let mut acc = 0i64;
        for (i, v) in tot.iter().enumerate() {
            acc += (*v).max(0);
            out[i].push([x, acc as f64]);
        }
    };
    // Running totals need every event from the start, even those left of the view.
    for (i, e) in events[..i1].iter().enumerate() {
        let idx = Category::ALL
            .iter()
            .position(|c| *c == e.category)
            .unwrap_or(0);
        match e.kind {
            EventKind::Alloc | EventKind::OutsideAlloc => totals[idx] += e.bytes as i64,
            EventKind::Free | EventKind::OutsideFree => totals[idx] -= e.bytes as i64,
            _ => {}
        }
        if i < i0 {
            continue;
        }
        let x = x_of(i);
        let c = (((x - x0) / span * columns as f64) as i64).min(columns as i64 - 1);
        let sum: i64 = totals.iter().map(|v| (*v).max(0)).sum();
        if col != Some(c) {
            if let Some((bx, tot, _)) = best.take() {
                push(&mut out, bx, &tot);
            }
            col = Some(c);
        }
        if best.is_none_or(|(_, _, s)| sum >= s) {
            best = Some((x, totals, sum));
        }
    }
    if let Some((bx, tot, _)) = best {
        push(&mut out, bx, &tot);
    }
    out
}

/// Event-order twin of `event_near`: x is an event index.
pub fn event_near_index(events: &[Event], x: f64, per_px: f64) -> Option<usize> {
    if events.is_empty() || x < 0.0 {
        return None;
    }
    let lo = ((x - per_px / 2.0).max(0.0).floor() as usize).min(events.len() - 1);
    let hi = ((x + per_px / 2.0).ceil() as usize)
        .clamp(lo + 1, events.len())
        .min(lo + 20_000);
    (lo..hi).max_by_key(|&i| events[i].bytes)
}

/// The event under the pointer: within half a pixel column of `x_s`, the one that moved the
/// most bytes; else the last event before it.
pub fn event_near(events: &[Event], x_s: f64, s_per_px: f64) -> Option<usize> {
    if events.is_empty() || x_s < 0.0 {
        return None;
    }
    let lo_t = ((x_s - s_per_px / 2.0).max(0.0) * 1e6) as u64;
    let hi_t = ((x_s + s_per_px / 2.0) * 1e6).ceil() as u64;
    let lo = first_at(events, lo_t);
    let hi = first_at(events, hi_t.saturating_add(1)).min(lo + 20_000);
    if lo < hi {
        (lo..hi).max_by_key(|&i| events[i].bytes)
    } else {
        lo.checked_sub(1)
    }
}

fn event_tooltip(ui: &mut egui::Ui, e: &Event) {
    egui::Grid::new("event_tip").num_columns(2).show(ui, |ui| {
        let row = |ui: &mut egui::Ui, k: &str, v: String| {
            ui.label(RichText::new(k).weak());
            ui.label(v);
            ui.end_row();
        };
        row(ui, "event", format!("{:?} #{}", e.kind, e.seq));
        row(ui, "time", format!("{:.3} ms", e.time_us as f64 / 1000.0));
        row(
            ui,
            "pass",
            if e.pass == 0 {
                "—".into()
            } else {
                e.pass.to_string()
            },
        );
        row(ui, "op", e.op.clone());
        row(
            ui,
            "layer",
            e.layer.map_or_else(|| "—".into(), |l| l.to_string()),
        );
        row(ui, "tensor", e.tensor.clone());
        row(ui, "category", e.category.label().into());
        row(ui, "bytes", fmt_u(e.bytes));
        row(ui, "allocated", fmt_u(e.allocated));
        row(ui, "reserved", fmt_u(e.reserved));
        row(ui, "device used", fmt_u(e.device_used));
        row(
            ui,
            "non-framework",
            fmt_i(e.process_used as i64 - e.reserved as i64),
        );
    });
}

/// Where the profile ends (t3) on the x axis, and the highest total before it; `None` when
/// there is no t3 (a live run) or nothing comes after it.
pub(crate) fn profile_extent(events: &[Event], by_event: bool) -> Option<(f64, f64)> {
    let t3 = events
        .iter()
        .rposition(|e| e.kind == EventKind::Marker && e.tensor == "t3")?;
    if t3 + 1 >= events.len() {
        return None;
    }
    let top = events[..=t3]
        .iter()
        .map(|e| {
            e.allocated
                .max(e.reserved)
                .max(e.device_used)
                .max(e.process_used)
        })
        .max()
        .unwrap_or(0);
    let x = if by_event {
        (t3 + 1) as f64
    } else {
        events[t3].time_us as f64 * 1e-6
    };
    Some((x.max(1e-6), (top as f64).max(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Category;

    fn ev(t: u64, pass: u32, kind: EventKind, cat: Category, bytes: u64) -> Event {
        Event::test(t, t, pass, kind, cat, bytes)
    }

    #[test]
    fn live_pass_spans_follow_pass_numbers() {
        let a = EventKind::Alloc;
        let w = Category::Weight;
        let evs = vec![
            ev(0, 0, a, w, 1),
            ev(10, 1, a, w, 1),
            ev(20, 1, a, w, 1),
            ev(30, 2, a, w, 1),
            ev(40, 0, a, w, 1),
        ];
        let p = pass_spans(&evs, None);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].start_us, p[0].end_us), (10, 20));
        assert_eq!((p[1].label.as_str(), p[1].start_us), ("pass 2", 30));
    }

    #[test]
    fn stack_tops_sum_categories_and_keep_the_peak() {
        let evs = vec![
            ev(0, 0, EventKind::Alloc, Category::Weight, 100),
            ev(1, 1, EventKind::Alloc, Category::Activation, 50),
            ev(2, 1, EventKind::Free, Category::Activation, 50),
            ev(3, 0, EventKind::OutsideAlloc, Category::NonFramework, 7),
        ];
        // One column: the sample is taken where the total peaks (t=1: 150).
        let s = stack_by_category(&evs, 0, 4, 1, false);
        let top = s.last().unwrap();
        assert_eq!(top, &vec![[1e-6, 150.0]]);
        // By event index, the same peak is event 1.
        let s = stack_by_category(&evs, 0, 4, 1, true);
        assert_eq!(s.last().unwrap(), &vec![[1.0, 150.0]]);
        // Many columns: the final top is weights + outside.
        let s = stack_by_category(&evs, 0, 4, 100, false);
        assert_eq!(s.last().unwrap().last().unwrap()[1], 107.0);
        assert_eq!(s[0].last().unwrap()[1], 100.0);
    }

    #[test]
    fn hover_picks_the_biggest_event_in_the_column() {
        let evs = vec![
            ev(0, 0, EventKind::Alloc, Category::Weight, 5),
            ev(100, 0, EventKind::Alloc, Category::Weight, 9),
            ev(101, 0, EventKind::Alloc, Category::Weight, 3),
            ev(5000, 0, EventKind::Alloc, Category::Weight, 1),
        ];
        assert_eq!(event_near(&evs, 100e-6, 10e-6), Some(1));
        // Between events: the last one before the pointer.
        assert_eq!(event_near(&evs, 2000e-6, 10e-6), Some(2));
    }
}

#[cfg(test)]
mod index_tests {
    use super::*;
    use crate::memory::Category;

    #[test]
    fn index_reduction_keeps_spikes_and_bounds_points() {
        let mut events: Vec<Event> = (0..200_000u64)
            .map(|i| Event {
                allocated: 100,
                reserved: 100,
                device_used: 100,
                process_used: 100,
                ..Event::test(i, i / 7, 0, EventKind::Alloc, Category::Activation, 0)
            })
            .collect();
        events[123_457].allocated = 9_999;
        events[123_457].bytes = 5;
        let pts = reduce_by_index(&events, Series::Allocated, 0, events.len(), 500);
        assert!(pts.len() <= 2000, "{}", pts.len());
        assert!(pts.contains(&[123_457.0, 9_999.0]));
        assert_eq!(
            reduce_by_index(&events, Series::Allocated, 10, 20, 500).len(),
            10
        );
        assert_eq!(event_near_index(&events, 123_457.6, 2.0), Some(123_457));
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;
    use crate::memory::Category;

    /// A mouse-wheel step (`dy` points up).
    fn wheel(dy: f32) -> egui::Event {
        egui::Event::MouseWheel {
            unit: egui::MouseWheelUnit::Point,
            delta: egui::vec2(0.0, dy),
            phase: egui::TouchPhase::Move,
            source: egui::MouseWheelSource::Unknown,
            modifiers: egui::Modifiers::NONE,
        }
    }

    #[test]
    fn a_zoom_gesture_narrows_the_reduced_range_and_reset_restores_it() {
        let events: Vec<Event> = (0..10_000u64)
            .map(|i| Event {
                allocated: i % 977,
                reserved: 1000,
                device_used: 2000,
                process_used: 1500,
                ..Event::test(
                    i,
                    i * 10,
                    1 + (i / 2500) as u32,
                    EventKind::Alloc,
                    Category::Activation,
                    i,
                )
            })
            .collect();
        let ctx = egui::Context::default();
        let mut view = TimelineView::default();
        let size = egui::vec2(1000.0, 700.0);
        let frame = |view: &mut TimelineView, ev: Vec<egui::Event>| {
            let input = egui::RawInput {
                screen_rect: Some(egui::Rect::from_min_size(egui::Pos2::ZERO, size)),
                events: ev,
                ..Default::default()
            };
            let mut out = ctx.run_ui(input, |ui| {
                egui::CentralPanel::default_margins().show(ui, |ui| {
                    view.ui(
                        ui,
                        &TimelineInput {
                            events: &events,
                            generation: 1,
                            report: None,
                        },
                    );
                });
            });
            // No renderer here to upload the font atlas to.
            out.textures_delta.clear();
        };
        let range = |view: &TimelineView| {
            let k = view.cache.view_key.expect("a view was reduced");
            k.x1 - k.x0
        };
        let centre = egui::pos2(500.0, 350.0);
        frame(&mut view, vec![egui::Event::PointerMoved(centre)]);
        frame(&mut view, vec![]);
        let full = range(&view);
        assert!((full - 0.09999).abs() < 1e-3, "full run in view: {full}");
        for _ in 0..3 {
            frame(
                &mut view,
                vec![egui::Event::PointerMoved(centre), wheel(200.0)],
            );
        }
        // Wheel steps are smoothed over a few frames: let them finish.
        for _ in 0..40 {
            frame(&mut view, vec![]);
        }
        let zoomed = range(&view);
        assert!(zoomed < full * 0.5, "zoomed {zoomed} vs full {full}");

        assert_eq!(view.cache.passes.len(), 4);
        view.reset_view();
        frame(&mut view, vec![]);
        frame(&mut view, vec![]);
        assert!((range(&view) - full).abs() < 1e-9);
    }
}

//! The lifetime view: every framework allocation a band from its alloc to its free, stacked as
//! PyTorch's memory viewer stacks them, over event order. Tensors that outlive their pass are
//! yellow with a black outline and named in one sentence; passes, t0..t3 and the budget lines
//! (Â, Â + old / new non-torch, the truth, T·u) are drawn over it. Bands lower than a pixel are
//! merged per column (`Lifetimes::columns`), and a piece that stays at its height over
//! neighbouring columns is one rectangle (`band_rects`), so a million allocations draw as a few
//! thousand rectangles. The rectangles are cached until the view moves, and the tessellated
//! mesh until the view, the theme or the selection changes.

use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

use egui::{Align2, Color32, FontId, Pos2, Rect, RichText, Shape, Stroke};
use egui_plot::{PlotBounds, PlotGeometry, PlotItem, PlotItemBase, PlotPoint, PlotTransform};

use super::axis::AxisKind;
use super::plot::{base_plot, wheel_zoom};
use super::style::{c32, legible};
use crate::base::units::fmt_u;
use crate::memory::Event;
use crate::profile::Report;
use crate::report::lifetimes::{Analysis, BandRect, KeptEdge};
use crate::report::palette;

/// Which events a lifetime view shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Load, the profile passes, t0..t3.
    Profile,
    /// The verify passes, each with its KV cache (their own y-axis).
    Verify,
}

/// One lifetime plot with its cache and selection.
pub struct LifetimeView {
    part: Part,
    id: &'static str,
    generation: u64,
    key: Option<(usize, usize, usize, u64)>,
    rects: Arc<Vec<BandRect>>,
    edges: Arc<Vec<KeptEdge>>,
    /// Bumped whenever the rectangles or the selection change (the mesh cache's key).
    version: u64,
    mesh: Arc<Mutex<MeshCache>>,
    /// The clicked band (a lifetime id) and every band of the same tensor name.
    pub selected: Option<u32>,
    same_name: Arc<Vec<u32>>,
    reset: bool,
    /// Where the plot was last drawn, so tests can click a band by its data coordinates.
    last_transform: Option<PlotTransform>,
    /// Set when the user asks for the three-pass view (the app profiles it).
    pub(crate) wants_three_passes: bool,
}

impl LifetimeView {
    pub fn new(part: Part) -> Self {
        LifetimeView {
            part,
            id: match part {
                Part::Profile => "lifetimes",
                Part::Verify => "lifetimes_verify",
            },
            generation: u64::MAX,
            key: None,
            rects: Arc::new(Vec::new()),
            edges: Arc::new(Vec::new()),
            version: 0,
            mesh: Arc::new(Mutex::new(MeshCache::default())),
            selected: None,
            same_name: Arc::new(Vec::new()),
            reset: false,
            last_transform: None,
            wants_three_passes: false,
        }
    }

    pub fn reset_view(&mut self) {
        self.reset = true;
    }

    /// Screen position of (event index, bytes) in the last drawn frame.
    pub fn screen_pos(&self, event: f64, bytes: f64) -> Option<Pos2> {
        self.last_transform
            .map(|t| t.position_from_point(&PlotPoint::new(event, bytes)))
    }

    /// The plot's data area in the last drawn frame.
    pub fn plot_rect(&self) -> Option<Rect> {
        self.last_transform.map(|t| *t.frame())
    }

    /// The events this view draws, and the part of them it opens on: the profile view
    /// holds the whole run (the CUDA graph phases and the verify passes to the right of t3,
    /// there when zoomed out to) and opens on t0..t3; the verify view holds the verify passes
    /// alone (the graph capture's many events squeezed them into a few pixels).
    fn range(&self, a: &Analysis, events: &[Event]) -> ((usize, usize), (usize, usize)) {
        match self.part {
            Part::Profile => ((0, events.len()), (0, a.lifetimes.profile_end(events))),
            Part::Verify => {
                let r = a.lifetimes.verify_range(events);
                (r, r)
            }
        }
    }

    pub fn ui(&mut self, ui: &mut egui::Ui, r: &Report, a: &Arc<Analysis>, generation: u64) {
        if self.generation != generation {
            self.generation = generation;
            self.key = None;
            self.selected = None;
            self.same_name = Arc::new(Vec::new());
            self.version += 1;
            self.reset = true;
        }
        let dark = ui.visuals().dark_mode;
        let events = &r.events;
        let ((i0, i1), (v0, v1)) = self.range(a, events);
        if v0 >= v1 {
            ui.label(match self.part {
                Part::Profile => "No events recorded.",
                Part::Verify => "No verify passes in this run (turn on \"verify each budget\").",
            });
            return;
        }
        ui.horizontal_wrapped(|ui| {
            if self.part == Part::Profile {
                if let Some(h) = &a.headline {
                    let (rect, _) =
                        ui.allocate_exact_size(egui::vec2(22.0, 16.0), egui::Sense::hover());
                    ui.painter().rect(
                        rect,
                        2.0,
                        c32(palette::KEPT),
                        Stroke::new(1.5, c32(palette::KEPT_OUTLINE)),
                        egui::StrokeKind::Inside,
                    );
                    ui.label(RichText::new(h).strong());
                } else {
                    ui.label("No tensor outlives the pass that made it.");
                }
            } else {
                ui.label(
                    "Verify passes: the KV cache each budget grants, then one more max-batch pass inside T·u.",
                );
                if a.lifetimes.graph_phases().next().is_some() {
                    ui.label("The CUDA graph phases are in Lifetimes and Memory lines.");
                }
            }
            if ui.button("Reset view").clicked() {
                self.reset = true;
            }
            // One pass cannot show state made in one pass and freed in the next.
            if self.part == Part::Profile
                && r.settings.passes == 1
                && !is_snapshot(r)
                && ui
                    .button("Show 3 passes")
                    .on_hover_text(
                        "Profile again with three passes: state made in one pass and freed in the next",
                    )
                    .clicked()
            {
                self.wants_three_passes = true;
            }
        });
        // The band details take the hint's place, in a strip of fixed height: a click never
        // moves the plot.
        details_strip(ui, |ui| match self.selected {
            Some(id) => {
                ui.horizontal_wrapped(|ui| details(ui, a, events, id));
            }
            None => {
                ui.add(egui::Label::new(RichText::new("Scroll: zoom time · Shift/Ctrl+scroll: zoom memory · drag: pan · double-click: reset · click a band for details").small()).wrap());
            }
        });

        let top = match self.part {
            Part::Profile => a.profile_top,
            Part::Verify => a.verify_top,
        };
        // The budget lines set the y-axis only where they are near the data: T·u far above a
        // small model would squeeze its bands into a flat line (its label says where it is).
        let lines: Vec<(String, f64, Color32)> = if self.part == Part::Profile {
            shown_lines(r, a)
                .into_iter()
                .map(|l| {
                    (
                        format!("{} {}", l.label, crate::base::units::fmt_i(l.bytes)),
                        l.bytes as f64,
                        c32(palette::legible(l.colour, dark)),
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        let y_top = lines
            .iter()
            .map(|l| l.1)
            .filter(|&y| y <= top as f64 * 1.6)
            .fold(top as f64, f64::max)
            .max(1.0)
            * 1.12;
        let plot_h = ui.available_height().max(160.0);
        let mut plot = base_plot(ui, self.id, AxisKind::Events)
            .height(plot_h)
            .allow_drag(true)
            .default_x_bounds(v0 as f64, v1 as f64)
            .default_y_bounds(0.0, y_top)
            .x_axis_label("event order (index in the timeline)")
            .y_axis_label("framework allocations");
        if self.reset {
            plot = plot.reset();
            self.reset = false;
        }
        let lt = Arc::clone(a);
        let rects = &mut self.rects;
        let edges = &mut self.edges;
        let version = &mut self.version;
        let mesh = Arc::clone(&self.mesh);
        let key = &mut self.key;
        let same_name = Arc::clone(&self.same_name);
        let selected = self.selected;
        let part = self.part;
        let resp = plot.show(ui, |pui| {
            wheel_zoom(pui);
            let t = *pui.transform();
            let b = t.bounds();
            let width = t.frame().width().max(16.0) as usize;
            let x0 = (b.min()[0].floor().max(i0 as f64) as usize).min(i1);
            let x1 = ((b.max()[0].ceil() + 1.0).max(0.0) as usize).clamp(x0, i1);
            // One pixel of height in bytes: bands lower than that merge.
            let min_bytes = (b.height() / t.frame().height().max(1.0) as f64).max(1.0) as u64;
            let k = (x0, x1, width, min_bytes.next_power_of_two());
            if *key != Some(k) {
                *key = Some(k);
                let stack = lt.lifetimes.stack_rects(events, x0, x1, width, min_bytes);
                *rects = Arc::new(stack.rects);
                *edges = Arc::new(stack.edges);
                *version += 1;
            }
            pui.add(BandsItem {
                base: PlotItemBase::new("allocations".into()),
                rects: Arc::clone(rects),
                edges: Arc::clone(edges),
                version: *version,
                mesh,
                analysis: Arc::clone(&lt),
                same_name,
                selected,
                lines,
                part,
                dark,
                x_range: (v0, v1),
                data_range: (i0, i1),
                y_top,
            });
            (t, pui.pointer_coordinate())
        });
        let (transform, pointer) = resp.inner;
        self.last_transform = Some(transform);
        if resp.response.double_clicked() {
            // The plot resets its view; the clicks that made the double-click select nothing.
            self.select(None, a, events);
        } else if resp.response.clicked() {
            let hit = pointer.and_then(|p| {
                let at = p.x.floor();
                if at < i0 as f64 || at >= i1 as f64 {
                    return None;
                }
                a.lifetimes.band_at(at as usize, p.y)
            });
            self.select(hit, a, events);
        }
    }

    /// Selects a band (or clears the selection) and finds its namesakes in other passes.
    pub fn select(&mut self, id: Option<u32>, a: &Analysis, events: &[Event]) {
        self.selected = id;
        self.version += 1;
        self.same_name = Arc::new(match id {
            Some(id) => {
                let name = &events[a.lifetimes.items[id as usize].alloc_event as usize].tensor;
                a.lifetimes
                    .items
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| &events[l.alloc_event as usize].tensor == name)
                    .map(|(i, _)| i as u32)
                    .collect()
            }
            None => Vec::new(),
        });
    }
}

/// An imported PyTorch snapshot: framework events only, no device truth.
fn is_snapshot(r: &Report) -> bool {
    r.device.mode == "snapshot"
}

/// The budget lines this report can draw: a line whose number is unknown (a snapshot's truth
/// and T·u) is left out rather than drawn at 0 B, and so is an Â that no event on screen
/// reaches (a snapshot whose peak fell outside its recorded trace).
pub fn shown_lines(r: &Report, a: &Analysis) -> Vec<crate::report::lifetimes::RefLine> {
    let truth_known = !r.truth.source.starts_with("unknown") && r.truth.non_kv_bytes > 0;
    let total_known = r.checkpoints.t0.total > 0;
    a.lines
        .iter()
        .filter(|l| match l.colour {
            c if c == palette::TRUTH => truth_known,
            c if c == palette::BUDGET => total_known,
            c if c == palette::PEAK => l.bytes <= a.profile_top as i64,
            _ => true,
        })
        .cloned()
        .collect()
}

/// A strip of fixed height (two lines of text) for the hint or a band's details, so a click
/// never moves the plot; what does not fit is cut at the strip's edge.
fn details_strip(ui: &mut egui::Ui, add: impl FnOnce(&mut egui::Ui)) {
    let line = ui.text_style_height(&egui::TextStyle::Body);
    let h = 2.0 * line + ui.spacing().item_spacing.y + 2.0;
    let (rect, _) =
        ui.allocate_exact_size(egui::vec2(ui.available_width(), h), egui::Sense::hover());
    let mut child = ui.new_child(
        egui::UiBuilder::new()
            .max_rect(rect)
            .layout(egui::Layout::top_down(egui::Align::Min)),
    );
    child.set_clip_rect(rect.intersect(ui.clip_rect()));
    add(&mut child);
}

/// The details of a clicked band, most telling first: name, kept, size, the pass and op that
/// made it and the one that freed it, lifetime, category, layer.
fn details(ui: &mut egui::Ui, a: &Analysis, events: &[Event], id: u32) {
    let l = &a.lifetimes.items[id as usize];
    let made = &events[l.alloc_event as usize];
    let freed = l.free_event.map(|f| &events[f as usize]);
    let pass = |p: u32| {
        if p == 0 {
            "outside the passes".to_string()
        } else if p > a.lifetimes.profile_passes {
            format!("verify pass {}", p - a.lifetimes.profile_passes)
        } else {
            format!("pass {p}")
        }
    };
    ui.spacing_mut().item_spacing.x = 5.0;
    let key = |ui: &mut egui::Ui, k: &str| {
        ui.label(RichText::new(k).weak());
    };
    ui.label(RichText::new(&made.tensor).strong());
    if l.kept {
        ui.label(
            RichText::new("kept across passes")
                .strong()
                .color(c32(palette::KEPT_OUTLINE))
                .background_color(c32(palette::KEPT)),
        );
    }
    ui.label(RichText::new(fmt_u(l.bytes)).strong());
    key(ui, "· made in");
    ui.label(pass(l.made_pass));
    key(ui, "by");
    ui.label(made.op.clone());
    key(ui, "· freed in");
    ui.label(match freed {
        Some(f) => format!("{} · {}", pass(f.pass), f.op),
        None => "never (alive at the end)".into(),
    });
    let end = l
        .free_event
        .map_or(events.len().saturating_sub(1), |f| f as usize);
    let span_us = events[end].time_us.saturating_sub(made.time_us);
    key(ui, "· lifetime");
    ui.label(format!(
        "{} events · {:.3} ms",
        end - l.alloc_event as usize,
        span_us as f64 / 1000.0
    ));
    key(ui, "· category");
    ui.label(l.category.label());
    key(ui, "· layer");
    ui.label(made.layer.map_or_else(|| "—".into(), |x| x.to_string()));
}

/// The bands, pass and checkpoint marks and budget lines, as one plot item.
struct BandsItem {
    base: PlotItemBase,
    rects: Arc<Vec<BandRect>>,
    edges: Arc<Vec<KeptEdge>>,
    /// `LifetimeView::version` when this frame's rectangles and selection were made.
    version: u64,
    mesh: Arc<Mutex<MeshCache>>,
    analysis: Arc<Analysis>,
    same_name: Arc<Vec<u32>>,
    selected: Option<u32>,
    lines: Vec<(String, f64, Color32)>,
    part: Part,
    dark: bool,
    /// The events the view opens on (its default bounds).
    x_range: (usize, usize),
    /// The events it draws.
    data_range: (usize, usize),
    y_top: f64,
}

/// The bands' shapes as last drawn, and what they were drawn from.
#[derive(Default)]
struct MeshCache {
    key: Option<MeshKey>,
    shapes: Vec<Shape>,
}

/// What moves the bands on screen: when it is unchanged, last frame's mesh is drawn again.
#[derive(Clone, Copy, PartialEq)]
struct MeshKey {
    version: u64,
    frame: Rect,
    min: [f64; 2],
    max: [f64; 2],
    dark: bool,
}

/// A band's fill (shared with the PNG report).
pub(crate) fn band_rgb(seg: &crate::report::lifetimes::StackSeg) -> palette::Rgb {
    palette::band(seg.category, seg.kept, seg.life)
}

impl BandsItem {
    /// The bands as one mesh, then the outlines of the kept state and of the selected tensor.
    fn band_shapes(&self, t: &PlotTransform) -> Vec<Shape> {
        let mut mesh = egui::Mesh::default();
        mesh.reserve_triangles(self.rects.len() * 2);
        mesh.reserve_vertices(self.rects.len() * 4);
        let select_outline = if self.dark {
            Color32::WHITE
        } else {
            Color32::BLACK
        };
        let mut outlines: Vec<Shape> = Vec::new();
        for r in self.rects.iter() {
            let s = &r.seg;
            let xa = t.position_from_point_x(r.x0 as f64);
            let xb = t.position_from_point_x(r.x1 as f64).max(xa + 1.0);
            let ya = t.position_from_point_y(s.y0 as f64);
            let yb = t.position_from_point_y(s.y1 as f64);
            let rect = Rect::from_min_max(Pos2::new(xa, yb.min(ya - 0.5)), Pos2::new(xb, ya));
            mesh.add_colored_rect(rect, c32(band_rgb(s)));
            let chosen = s
                .life
                .is_some_and(|id| self.same_name.binary_search(&id).is_ok());
            if chosen {
                let w = if s.life == self.selected { 3.0 } else { 2.0 };
                outlines.push(Shape::rect_stroke(
                    rect,
                    0.0,
                    Stroke::new(w, select_outline),
                    egui::StrokeKind::Middle,
                ));
            }
        }
        let kept = Stroke::new(1.5, c32(palette::KEPT_OUTLINE));
        let mut shapes = vec![Shape::mesh(mesh)];
        shapes.extend(self.edges.iter().map(|e| {
            let y = t.position_from_point_y(e.y as f64);
            let xa = t.position_from_point_x(e.x0 as f64);
            let xb = t.position_from_point_x(e.x1 as f64).max(xa + 1.0);
            Shape::line_segment([Pos2::new(xa, y), Pos2::new(xb, y)], kept)
        }));
        shapes.extend(outlines);
        shapes
    }
}

impl PlotItem for BandsItem {
    fn shapes(&self, ui: &egui::Ui, t: &PlotTransform, shapes: &mut Vec<Shape>) {
        let frame = *t.frame();
        let key = MeshKey {
            version: self.version,
            frame,
            min: t.bounds().min(),
            max: t.bounds().max(),
            dark: self.dark,
        };
        {
            let mut cache = self.mesh.lock().unwrap_or_else(|e| e.into_inner());
            if cache.key != Some(key) {
                cache.shapes = self.band_shapes(t);
                cache.key = Some(key);
            }
            shapes.extend(cache.shapes.iter().cloned());
        }

        let text_colour = ui.visuals().strong_text_color();
        // Labels grow with the text (Present): a shade smaller than body text.
        let font = {
            let body = egui::TextStyle::Body.resolve(ui.style());
            FontId::proportional(body.size * 0.875)
        };
        let line_h = font.size + 6.0;
        let label_bg = ui.visuals().extreme_bg_color.gamma_multiply(0.92);
        let boxed =
            |shapes: &mut Vec<Shape>, pos: Pos2, anchor: Align2, text: String, colour: Color32| {
                let galley = ui
                    .ctx()
                    .fonts_mut(|f| f.layout_no_wrap(text, font.clone(), colour));
                let rect = anchor.anchor_size(pos, galley.size()).expand(2.0);
                shapes.push(Shape::rect_filled(rect, 2.0, label_bg));
                shapes.push(Shape::galley(
                    rect.min + egui::vec2(2.0, 2.0),
                    galley,
                    colour,
                ));
                rect
            };

        // Passes: a boundary line at each start, the label where it fits.
        let a = &self.analysis.lifetimes;
        // Pass labels go in two rows: one that would meet its neighbour's goes a row down (at
        // 1280 px the verify labels of #9516 and #12126 were left out).
        let mut last_label_right = [f32::NEG_INFINITY; 2];
        // The pass and checkpoint labels, which the budget line labels must not cover.
        let mut obstacles: Vec<Rect> = Vec::new();
        let mut last_line_x = f32::NEG_INFINITY;
        let mark = legible(palette::PEAK, self.dark);
        let graph_colour = legible(
            palette::category(crate::memory::Category::CudaGraph),
            self.dark,
        );
        // The CUDA graph phases right of the view, named at its right edge.
        let mut graphs_right: Vec<&str> = Vec::new();
        for p in &a.passes {
            let shown = match self.part {
                Part::Verify => p.verify,
                Part::Profile => true,
            };
            if !shown || p.end <= self.data_range.0 || p.start >= self.data_range.1 {
                continue;
            }
            let x = t.position_from_point_x(p.start as f64);
            let x_end = t.position_from_point_x(p.end as f64);
            if p.graph {
                if x > frame.right() {
                    graphs_right.push(&p.label);
                    continue;
                }
                // A band of its own, in the graphs' colour, under the bands' outlines.
                let band = Rect::from_x_y_ranges(
                    x.max(frame.left())..=x_end.min(frame.right()),
                    frame.y_range(),
                );
                if band.width() > 0.0 {
                    shapes.push(Shape::rect_filled(
                        band,
                        0.0,
                        graph_colour.gamma_multiply(0.16),
                    ));
                }
            }
            // Hundreds of passes zoomed out would hatch the plot (and cost a frame): a
            // boundary closer than a few pixels to the last one drawn is left out.
            if x >= frame.left() && x <= frame.right() && x - last_line_x >= 6.0 {
                last_line_x = x;
                shapes.extend(Shape::dashed_line(
                    &[Pos2::new(x, frame.top()), Pos2::new(x, frame.bottom())],
                    Stroke::new(1.2, mark),
                    6.0,
                    4.0,
                ));
            }
            let lx = x.max(frame.left()) + 3.0;
            let row = last_label_right.iter().position(|right| lx > right + 4.0);
            if let (Some(row), true) = (row, x_end - lx > 40.0) {
                let r = boxed(
                    shapes,
                    Pos2::new(
                        lx,
                        frame.top() + 2.0 * line_h + 2.0 + row as f32 * (line_h + 2.0),
                    ),
                    Align2::LEFT_TOP,
                    p.label.clone(),
                    if p.graph { graph_colour } else { text_colour },
                );
                last_label_right[row] = r.right();
                obstacles.push(r);
            }
        }
        if !graphs_right.is_empty() {
            let r = boxed(
                shapes,
                Pos2::new(frame.right() - 4.0, frame.top() + 2.0 * line_h + 2.0),
                Align2::RIGHT_TOP,
                format!("{} right of the view (zoom out)", graphs_right.join(", ")),
                graph_colour,
            );
            obstacles.push(r);
        }
        if self.part == Part::Profile {
            for (k, (label, i)) in a.checkpoints.iter().enumerate() {
                let x = t.position_from_point_x(*i as f64);
                if x < frame.left() || x > frame.right() {
                    continue;
                }
                shapes.push(Shape::line_segment(
                    [Pos2::new(x, frame.top()), Pos2::new(x, frame.bottom())],
                    Stroke::new(1.5, mark),
                ));
                // Staggered heights, so neighbouring checkpoints never overwrite each other.
                let y = frame.top() + 2.0 + (k % 2) as f32 * line_h;
                let r = boxed(
                    shapes,
                    Pos2::new(x + 2.0, y),
                    Align2::LEFT_TOP,
                    label.clone(),
                    text_colour,
                );
                obstacles.push(r);
            }
        }

        // Budget lines with their labels at the right edge, just above their lines; labels
        // that would overlap are spread as little as they must (a leader joins a moved label
        // to its line); a line above the view is named at the top edge, marked "(above)".
        let mut placed: Vec<(f32, String, Color32, bool)> = self
            .lines
            .iter()
            .map(|(label, y, c)| {
                let sy = t.position_from_point_y(*y);
                let above = sy < frame.top();
                if !above && sy <= frame.bottom() {
                    shapes.push(Shape::line_segment(
                        [Pos2::new(frame.left(), sy), Pos2::new(frame.right(), sy)],
                        Stroke::new(2.0, *c),
                    ));
                }
                (sy.max(frame.top()), label.clone(), *c, above)
            })
            .filter(|p| p.0 <= frame.bottom())
            .collect();
        // Each label goes just above its line, else just below it, else to the nearest free
        // place under it (then over it): never over another label (the pass and checkpoint
        // ones included), and never across another budget line, where there is room (a label
        // on a line reads as that line's: "T·u … (above)" sat on the #9352 line).
        // The lines in view first, top down; a line above the view, which has no place to
        // keep near, last.
        placed.sort_by(|a, b| a.3.cmp(&b.3).then(a.0.total_cmp(&b.0)));
        let drawn: Vec<f32> = placed.iter().filter(|p| !p.3).map(|p| p.0).collect();
        let mut taken: Vec<(f32, f32)> = Vec::new();
        let mut bottoms = Vec::with_capacity(placed.len());
        for (y, label, _, above) in &placed {
            let size = ui
                .ctx()
                .fonts_mut(|f| f.layout_no_wrap(label.clone(), font.clone(), text_colour))
                .size();
            let w = size.x + if *above { 80.0 } else { 4.0 };
            let left = frame.right() - 8.0 - w;
            let in_column = |r: &Rect| r.right() > left;
            let own = (!*above).then_some(*y);
            // The box is drawn 2 px past the text on each side (`boxed`).
            let crosses_a_line = |b: f32| {
                drawn
                    .iter()
                    .filter(|ly| Some(**ly) != own)
                    .any(|ly| *ly >= b - line_h - 3.0 && *ly <= b + 3.0)
            };
            let free = |b: f32, strict: bool| {
                b - line_h >= frame.top()
                    && b <= frame.bottom()
                    && !taken.iter().any(|(t0, b0)| b > *t0 && b - line_h < *b0)
                    && !obstacles
                        .iter()
                        .filter(|r| in_column(r))
                        .any(|r| b > r.top() && b - line_h < r.bottom())
                    && !(strict && crosses_a_line(b))
            };
            let above_line = y - 1.0;
            let below_line = y + 1.0 + line_h;
            let h = frame.height() as i32;
            // Off its line, a label keeps within a label's height of it; a label of a line
            // above the view has no line to keep to.
            // (Within a label and a half of the line, text to line.)
            let reach = if *above {
                h
            } else {
                (1.5 * size.y - 5.0).max(0.0) as i32
            };
            let search = |strict: bool, reach: i32| {
                [above_line, below_line]
                    .into_iter()
                    .find(|b| free(*b, strict))
                    .or_else(|| {
                        (0..reach)
                            .map(|k| below_line + k as f32)
                            .find(|b| free(*b, strict))
                    })
                    .or_else(|| {
                        (0..reach)
                            .map(|k| above_line - k as f32)
                            .find(|b| free(*b, strict))
                    })
            };
            let b = search(true, reach)
                .or_else(|| search(false, h))
                .unwrap_or(above_line);
            taken.push((b - line_h, b));
            bottoms.push(b);
        }
        for ((line_y, label, c, above), bottom) in placed.into_iter().zip(bottoms) {
            let text = if above {
                format!("{label} (above)")
            } else {
                label
            };
            let r = boxed(
                shapes,
                Pos2::new(frame.right() - 4.0, bottom),
                Align2::RIGHT_BOTTOM,
                text,
                c,
            );
            if !above && (r.bottom() - line_y).abs() > 4.0 {
                let y = if r.bottom() < line_y {
                    r.bottom()
                } else {
                    r.top()
                };
                shapes.push(Shape::line_segment(
                    [
                        Pos2::new(r.left() + 8.0, y),
                        Pos2::new(r.left() + 2.0, line_y),
                    ],
                    Stroke::new(1.5, c),
                ));
            }
        }
        let _ = self.y_top;
    }

    fn initialize(&mut self, _x_range: RangeInclusive<f64>) {}

    fn color(&self) -> Color32 {
        c32(palette::KEPT)
    }

    fn geometry(&self) -> PlotGeometry<'_> {
        PlotGeometry::None
    }

    fn bounds(&self) -> PlotBounds {
        PlotBounds::from_min_max(
            [self.x_range.0 as f64, 0.0],
            [self.x_range.1 as f64, self.y_top],
        )
    }

    fn base(&self) -> &PlotItemBase {
        &self.base
    }

    fn base_mut(&mut self) -> &mut PlotItemBase {
        &mut self.base
    }
}

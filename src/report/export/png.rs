//! The PNG report: the timeline with pass shading and checkpoints, and the formula comparison
//! (KV budgets against the measured truth, old vs new in numbers). Rendered on the CPU with
//! an embedded font (egui's Ubuntu Light), so it needs no display and no system fonts.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::base::error::{Error, Result};
use crate::base::units::{fmt_i, fmt_u, GIB};
use crate::profile::formulas::FormulaId;
use crate::profile::report::Verify;
use crate::profile::Report;
use crate::report::budget;
use crate::report::lifetimes::{kept_runs, Analysis};
use crate::report::palette::{self, Rgb};
use crate::report::timeline;

pub const WIDTH: u32 = 1600;
pub const HEIGHT: u32 = 1000;
/// The band of small multiples a tensor-parallel report adds below, one column per rank.
pub const RANKS_HEIGHT: u32 = 300;

/// The image's height: taller by the ranks' band with tensor parallel.
pub fn height(report: &Report) -> u32 {
    if report.ranks.len() > 1 {
        HEIGHT + RANKS_HEIGHT
    } else {
        HEIGHT
    }
}
const FONT: &str = "vramscope-sans";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bundled font is valid; a failure here would only mean no text, not a crash.
        let _ = plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
}

fn c(rgb: Rgb) -> RGBColor {
    RGBColor(rgb.0, rgb.1, rgb.2)
}

fn text(size: u32) -> TextStyle<'static> {
    (FONT, size as f64).into_font().color(&BLACK)
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

fn draw_err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Renders the report to RGB pixels (`WIDTH × HEIGHT × 3`).
pub fn render_rgb(report: &Report) -> std::result::Result<Vec<u8>, String> {
    render_rgb_with(report, &Analysis::of(report))
}

/// `render_rgb` with the analysis already made (the app has it at hand).
pub fn render_rgb_with(report: &Report, a: &Analysis) -> std::result::Result<Vec<u8>, String> {
    register_font();
    let h = height(report);
    let mut buf = vec![255u8; (WIDTH * h * 3) as usize];
    {
        let all = BitMapBackend::with_buffer(&mut buf, (WIDTH, h)).into_drawing_area();
        all.fill(&WHITE).map_err(draw_err)?;
        let (root, ranks) = all.split_vertically(HEIGHT);
        if report.ranks.len() > 1 {
            draw_ranks(&ranks, report)?;
        }
        let (header, body) = root.split_vertically(96);
        draw_header(&header, report)?;
        let (left, right) = body.split_horizontally(1010);
        let (plot, notes) = left.split_vertically(650);
        draw_lifetimes(&plot, report, a)?;
        draw_footer(&notes, report, a)?;
        let (budget, waterfall_and_table) = right.split_vertically(250);
        draw_comparison(&budget, report)?;
        let (water, table) = waterfall_and_table.split_vertically(300);
        draw_waterfall(&water, report, a)?;
        draw_table(&table, report)?;
        all.present().map_err(draw_err)?;
    }
    Ok(buf)
}

/// Encodes the report image as PNG bytes.
pub fn render_png(report: &Report) -> std::result::Result<Vec<u8>, String> {
    encode(render_rgb(report)?)
}

/// `render_png` with the analysis already made (the CSV summary reads the same one).
pub fn render_png_with(report: &Report, a: &Analysis) -> std::result::Result<Vec<u8>, String> {
    encode(render_rgb_with(report, a)?)
}

fn encode(rgb: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
    let h = (rgb.len() / (WIDTH as usize * 3)) as u32;
    let img = image::RgbImage::from_raw(WIDTH, h, rgb).ok_or("pixel buffer has the wrong size")?;
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .map_err(draw_err)?;
    Ok(out.into_inner())
}

/// The one way a PNG report is written, for the CLI (`--png`) and the app (Save PNG report).
pub fn write(report: &Report, path: &Path) -> Result<()> {
    let bytes = render_png(report).map_err(|problem| Error::Export {
        path: path.into(),
        problem,
    })?;
    super::atomic_write(path, &bytes)
}

/// Every rank of a tensor-parallel report side by side: framework allocated and this
/// process's device memory over the profile (same scale for all), NCCL's entries, the truth,
/// the new formula and its blocks; the rank that binds the engine's budget framed.
fn draw_ranks(area: &Area, r: &Report) -> std::result::Result<(), String> {
    let n = r.ranks.len();
    let (w, h) = area.dim_in_pixel();
    let col = w as i32 / n as i32;
    let binding = r
        .engine
        .iter()
        .find(|e| e.key == FormulaId::Pr9516.key())
        .map(|e| (e.binding_rank, e.kv_blocks));
    area.draw(&PathElement::new(
        vec![(0, 1), (w as i32, 1)],
        BLACK.stroke_width(1),
    ))
    .map_err(draw_err)?;
    let title = format!(
        "Tensor parallel over {n} GPUs: above is rank {}, the rank with the fewest #9516 blocks (the engine takes that count for every rank). Each rank, t0 to t3: black this process's device memory, blue framework allocated.",
        r.rank
    );
    area.draw_text(&title, &text(16), (12, 10))
        .map_err(draw_err)?;
    // The profile part of each rank (t0..t3), on one scale.
    let y_max = r
        .ranks
        .iter()
        .flat_map(|k| {
            k.profile_events()
                .iter()
                .map(|e| e.process_used.max(e.reserved))
        })
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let area = area.margin(36, 0, 0, 0);
    let h = h.saturating_sub(36);
    for (i, k) in r.ranks.iter().enumerate() {
        let x0 = i as i32 * col;
        let binds = binding.is_some_and(|(b, _)| b == k.rank);
        if binds {
            area.draw(&Rectangle::new(
                [(x0 + 3, 6), (x0 + col - 3, h as i32 - 3)],
                ShapeStyle::from(&c(palette::NEW)).stroke_width(3),
            ))
            .map_err(draw_err)?;
        }
        // The device once when every rank has the same (the header names it).
        let same_device = r.ranks.iter().all(|o| o.device.spec == k.device.spec);
        let title = format!(
            "rank {}{}{}",
            k.rank,
            if same_device {
                String::new()
            } else {
                format!(" · {}", k.device.spec)
            },
            if binds {
                " · sets the engine's budget"
            } else {
                ""
            }
        );
        let (title, size) = fit_lines(&area, &[title], col - 24, 24, 17);
        area.draw_text(&title[0], &text(size), (x0 + 12, 12))
            .map_err(draw_err)?;
        // The profile part of the rank's timeline, as lines over event order.
        let profile = k.profile_events();
        let end = profile.len().max(2);
        let (px, py, pw, ph) = (x0 + 12, 36, col - 24, 110);
        area.draw_text(
            &fmt_u(y_max as u64),
            &text(13).color(&RGBColor(90, 90, 90)),
            (px + 4, py + 2),
        )
        .map_err(draw_err)?;
        area.draw(&Rectangle::new(
            [(px, py), (px + pw, py + ph)],
            ShapeStyle::from(&RGBColor(200, 200, 200)).stroke_width(1),
        ))
        .map_err(draw_err)?;
        for (get, colour) in [
            (
                (|e: &crate::memory::Event| e.process_used) as fn(&crate::memory::Event) -> u64,
                palette::PROCESS_USED,
            ),
            (|e: &crate::memory::Event| e.allocated, palette::ALLOCATED),
        ] {
            let step = (end / pw.max(1) as usize).max(1);
            let pts: Vec<(i32, i32)> = profile
                .iter()
                .enumerate()
                .step_by(step)
                .map(|(j, e)| {
                    (
                        px + (j as f64 / end as f64 * pw as f64) as i32,
                        py + ph - (get(e) as f64 / y_max * ph as f64) as i32,
                    )
                })
                .collect();
            area.draw(&PathElement::new(pts, c(colour).stroke_width(2)))
                .map_err(draw_err)?;
        }
        let nccl = k.nccl_bytes();
        let new = k.formula(FormulaId::Pr9516);
        let lines = [
            format!(
                "weights {}   framework peak {}",
                fmt_u(k.weights_bytes),
                fmt_u(k.checkpoints.t2.allocated_peak)
            ),
            format!("NCCL outside the framework {}", fmt_u(nccl)),
            format!(
                "truth non-KV {}   #9516 non-KV {} ({})",
                fmt_i(k.truth.non_kv_bytes),
                new.map_or(String::new(), |f| fmt_i(f.non_kv_bytes)),
                new.map_or(String::new(), |f| format!("error {}", fmt_i(f.error_bytes)))
            ),
            format!(
                "#9516: {} blocks here{}",
                new.map_or(0, |f| f.kv_blocks),
                binding.map_or(String::new(), |(_, b)| format!("   the engine takes {b}"))
            ),
        ];
        // Columns narrower than the lines (eight ranks across the image) split them at their
        // gaps and take a smaller font, so no column's text runs into the next.
        let (lines, size) = fit_lines(&area, &lines, col - 24, h as i32 - 154 - 4, 15);
        let step = size as i32 * 3 / 2;
        for (j, l) in lines.iter().enumerate() {
            area.draw_text(l, &text(size), (x0 + 12, 154 + j as i32 * step))
                .map_err(draw_err)?;
        }
    }
    Ok(())
}

/// `lines` laid out in `width` × `height` pixels at the largest font from `largest` down to 10
/// at which they fit (a line 1.5 fonts high): a line too wide is first split at its gaps of
/// three spaces; a line still too wide at 10 is cut with "…". Returns the lines and the font.
fn fit_lines(
    area: &Area,
    lines: &[String],
    width: i32,
    height: i32,
    largest: u32,
) -> (Vec<String>, u32) {
    let wide = |s: &str, size: u32| {
        area.estimate_text_size(s, &text(size))
            .map_or(0, |(w, _)| w as i32)
            > width
    };
    let fits = |ls: &[String], size: u32| {
        ls.len() as i32 * (size as i32 * 3 / 2) <= height && ls.iter().all(|l| !wide(l, size))
    };
    let split: Vec<String> = lines
        .iter()
        .flat_map(|l| l.split("   ").map(|p| p.trim().to_string()))
        .filter(|p| !p.is_empty())
        .collect();
    for size in (10..=largest).rev() {
        if fits(lines, size) {
            return (lines.to_vec(), size);
        }
        if fits(&split, size) {
            return (split, size);
        }
    }
    let cut = split
        .iter()
        .map(|l| {
            if !wide(l, 10) {
                return l.clone();
            }
            let mut t = l.clone();
            while t.pop().is_some() && wide(&format!("{}…", t.trim_end()), 10) {}
            format!("{}…", t.trim_end())
        })
        .collect();
    (cut, 10)
}

fn draw_header(area: &Area, r: &Report) -> std::result::Result<(), String> {
    let sim = if r.device.simulated {
        "  [SIMULATED DEVICE]"
    } else {
        ""
    };
    let title = format!(
        "vramscope: {} {} on {}{}",
        r.model.name, r.quant, r.device.name, sim
    );
    area.draw_text(&title, &text(30), (24, 14))
        .map_err(draw_err)?;
    let s = &r.settings;
    let sub = format!(
        "{} tokens in {} seq(s), {} profile pass(es), gpu_memory_utilization {}, block size {}, max model len {}  |  total {}  |  weights {}  |  {} events",
        s.tokens,
        s.seqs,
        s.passes,
        s.util,
        s.block_size,
        s.max_model_len,
        fmt_u(r.checkpoints.t0.total),
        fmt_u(r.weights_bytes),
        r.event_count
    );
    area.draw_text(&sub, &text(18).color(&RGBColor(70, 70, 70)), (24, 58))
        .map_err(draw_err)?;
    Ok(())
}

/// The lifetime view of the profile part (load, passes, t0..t3), as the app draws it: every
/// framework allocation a band over event order, kept tensors yellow with a black outline,
/// the budget lines labelled in the right margin and passes and checkpoints labelled above
/// the plot, so no label covers data.
fn draw_lifetimes(area: &Area, r: &Report, a: &Analysis) -> std::result::Result<(), String> {
    let events = &r.events;
    let end = a.lifetimes.profile_end(events).max(1);
    let x_max = end as f64;
    let top = a.profile_top as f64;
    let lines: Vec<(String, f64, RGBColor)> = a
        .lines
        .iter()
        .map(|l| {
            (
                format!("{} {}", l.label, fmt_i(l.bytes)),
                l.bytes as f64 / GIB as f64,
                c(palette::legible(l.colour, false)),
            )
        })
        .collect();
    let y_max = (lines
        .iter()
        .map(|l| l.1 * GIB as f64)
        .filter(|&y| y <= top * 1.6)
        .fold(top, f64::max)
        .max(GIB as f64 / 64.0)
        * 1.08)
        / GIB as f64;
    let mut chart = ChartBuilder::on(area)
        .margin_left(16)
        .margin_top(104)
        .margin_bottom(8)
        .margin_right(250)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("event order (index in the timeline)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("framework allocations (GiB)")
        .label_style(text(15))
        .axis_desc_style(text(17))
        .light_line_style(WHITE)
        .draw()
        .map_err(draw_err)?;
    area.draw_text(
        "Every allocation's lifetime (bands stacked as PyTorch's memory viewer)",
        &text(21),
        (24, 2),
    )
    .map_err(draw_err)?;
    let (px, py) = chart.plotting_area().get_pixel_range();
    let width = (px.end - px.start).max(1) as usize;
    let per_px = (y_max * GIB as f64 / (py.end - py.start).max(1) as f64).max(1.0) as u64;
    let cols = a.lifetimes.columns(events, 0, end, width, per_px);
    let g = |b: u64| b as f64 / GIB as f64;
    let outline = c(palette::KEPT_OUTLINE);
    for col in &cols {
        let (x0, x1) = (col.start as f64, col.end as f64);
        for seg in &col.segs {
            let fill = c(palette::band(seg.category, seg.kept, seg.life));
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, g(seg.y0)), (x1, g(seg.y1))],
                    fill.filled(),
                )))
                .map_err(draw_err)?;
        }
        for (y0, y1) in kept_runs(&col.segs, per_px) {
            for y in [g(y0), g(y1)] {
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(x0, y), (x1, y)],
                        outline.stroke_width(2),
                    )))
                    .map_err(draw_err)?;
            }
        }
    }
    // A GPU run's NVML readings of this process, each at the event index of its time.
    if let Some(t_end) = events
        .get(end - 1)
        .map(|e| e.time_us)
        .filter(|_| !r.device_samples.is_empty())
    {
        let pts: Vec<(f64, f64)> = timeline::reduce_samples(&r.device_samples, 0, t_end, 900)
            .iter()
            .map(|p| {
                let t = (p[0] * 1e6).round() as u64;
                let x = events[..end].partition_point(|e| e.time_us < t) as f64;
                (x, (p[1] / GIB as f64).min(y_max))
            })
            .collect();
        chart
            .draw_series(DashedLineSeries::new(
                pts,
                5,
                3,
                c(palette::PROCESS_USED).stroke_width(2),
            ))
            .map_err(draw_err)?;
    }
    // Passes: dashed boundaries, labels in the band above the plot.
    let mark = c(palette::legible(palette::PEAK, false));
    // Pixel of an event index, and of a height in GiB (the plotting area's linear map).
    let (pw, ph) = ((px.end - px.start) as f64, (py.end - py.start) as f64);
    let x_px = |x: f64| px.start + (x / x_max * pw).round() as i32;
    let y_px = |y: f64| py.end - (y / y_max * ph).round() as i32;
    let above = |x: f64, row: i32| (x_px(x), py.start - 24 - row * 22);
    let mut label_right = i32::MIN;
    // The pixel column of the last boundary drawn: with more passes than pixels, most
    // boundaries fall on a column already drawn, which the same opaque dashes would cover
    // again to the same pixels (150,000 passes drew 150,000 lines).
    let mut drawn_px = None;
    // Only what starts inside the view: the graph capture after t3 is not in it, and its
    // label would land on the panel to the right.
    for p in a
        .lifetimes
        .passes
        .iter()
        .filter(|p| !p.verify && (p.start as f64) < x_max)
    {
        let x = p.start as f64;
        let column = chart.backend_coord(&(x, 0.0)).0;
        if drawn_px != Some(column) {
            drawn_px = Some(column);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x, 0.0), (x, y_max)],
                    6,
                    4,
                    mark.stroke_width(1),
                ))
                .map_err(draw_err)?;
        }
        let (bx, by) = above(x, 0);
        let (ex, _) = above((p.end as f64).min(x_max), 0);
        if bx > label_right + 4 && ex - bx > 50 {
            draw_root_text(area, &p.label, 15, BLACK, (bx + 3, by))?;
            label_right = bx + 8 * p.label.len() as i32;
        }
    }
    for (k, (label, i)) in a.lifetimes.checkpoints.iter().enumerate() {
        let x = *i as f64;
        chart
            .draw_series(LineSeries::new(
                vec![(x, 0.0), (x, y_max)],
                mark.stroke_width(2),
            ))
            .map_err(draw_err)?;
        let (bx, by) = above(x, 2 - (k % 2) as i32);
        draw_root_text(area, label, 16, BLACK, (bx + 2, by - 2))?;
    }
    // Budget lines across the plot; their labels in the right margin, pushed apart.
    let mut labels: Vec<(i32, String, RGBColor)> = Vec::new();
    for (label, y, col) in &lines {
        let sy = y_px(*y);
        if *y <= y_max {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, *y), (x_max, *y)],
                    col.stroke_width(2),
                )))
                .map_err(draw_err)?;
            labels.push((sy, label.clone(), *col));
        } else {
            labels.push((py.start, format!("{label} (above)"), *col));
        }
    }
    labels.sort_by_key(|l| l.0);
    let mut next = i32::MIN;
    for (y, label, col) in labels {
        let y = (y - 9).max(next);
        for (k, line) in wrap(&label, 30).iter().enumerate() {
            draw_root_text(area, line, 14, col, (px.end + 8, y + k as i32 * 16))?;
        }
        next = y + 16 * wrap(&label, 30).len() as i32 + 4;
    }
    Ok(())
}

/// Text at a pixel of the area (not a chart coordinate).
fn draw_root_text(
    area: &Area,
    s: &str,
    size: u32,
    colour: RGBColor,
    at: (i32, i32),
) -> std::result::Result<(), String> {
    let (ox, oy) = area.get_base_pixel();
    area.draw_text(s, &text(size).color(&colour), (at.0 - ox, at.1 - oy))
        .map_err(draw_err)
}

fn draw_footer(area: &Area, r: &Report, a: &Analysis) -> std::result::Result<(), String> {
    let mut y = 6;
    if let Some(h) = &a.headline {
        area.draw(&Rectangle::new(
            [(24, y + 2), (50, y + 20)],
            c(palette::KEPT).filled(),
        ))
        .map_err(draw_err)?;
        area.draw(&Rectangle::new(
            [(24, y + 2), (50, y + 20)],
            c(palette::KEPT_OUTLINE).stroke_width(2),
        ))
        .map_err(draw_err)?;
        area.draw_text(h, &text(21), (60, y)).map_err(draw_err)?;
        y += 30;
    }
    for line in wrap(&r.old_vs_new_explanation(), 110) {
        area.draw_text(&line, &text(16), (24, y))
            .map_err(draw_err)?;
        y += 20;
    }
    // The CUDA graphs' sentence (V1 releases), beside the pool's colour in the views.
    if let Some(g) = r.graph_summary().last() {
        area.draw(&Rectangle::new(
            [(24, y + 4), (36, y + 16)],
            c(palette::category(crate::memory::Category::CudaGraph)).filled(),
        ))
        .map_err(draw_err)?;
        for line in wrap(g, 104) {
            area.draw_text(&line, &text(16), (44, y))
                .map_err(draw_err)?;
            y += 20;
        }
    }
    y += 6;
    if let Some(p) = &a.peaks.framework {
        let cats: Vec<String> = p
            .by_category
            .iter()
            .map(|(cat, b)| format!("{} {}", cat.label(), fmt_u(*b)))
            .collect();
        area.draw_text(
            &format!(
                "Who owns the framework peak ({}): {}",
                fmt_u(p.allocated),
                cats.join(", ")
            ),
            &text(16),
            (24, y),
        )
        .map_err(draw_err)?;
        y += 22;
        for (k, t) in p.top.iter().take(6).enumerate() {
            let col = (k % 2) as i32;
            let row = (k / 2) as i32;
            let name = owner_line(fmt_u(t.bytes), &t.tensor, &t.op, t.layer);
            area.draw_text(
                &name,
                &text(14).color(&RGBColor(60, 60, 60)),
                (24 + col * 490, y + row * 19),
            )
            .map_err(draw_err)?;
        }
        y += 3 * 19 + 4;
    }
    let note = format!(
        "int8 state alive after the pass: {}   outside the framework at t3: {}   truth: {}",
        fmt_u(r.quant_state_after_bytes),
        fmt_u(r.outside_framework_bytes),
        r.truth.source
    );
    area.draw_text(&note, &text(14).color(&RGBColor(70, 70, 70)), (24, y))
        .map_err(draw_err)?;
    Ok(())
}

/// One peak owner as its column holds it (58 characters): the bytes, the tensor, its op and
/// layer, the layer left out where the tensor's name already says it (`layers.N.`), and a
/// name too long for the column cut in its middle with "…", so that the op and the layer
/// stay readable.
fn owner_line(bytes: String, tensor: &str, op: &str, layer: Option<u32>) -> String {
    const WIDTH: usize = 58;
    let layer = match layer {
        Some(l) if !tensor.contains(&format!("layers.{l}.")) => format!(", layer {l}"),
        _ => String::new(),
    };
    let tail = format!(" ({op}{layer})");
    let room = WIDTH.saturating_sub(bytes.chars().count() + 1 + tail.chars().count());
    let n = tensor.chars().count();
    let tensor = if n <= room {
        tensor.to_string()
    } else if room < 8 {
        tensor.chars().take(room).collect()
    } else {
        let keep = room - 1;
        let head: String = tensor.chars().take(keep / 2).collect();
        let tail_part: String = tensor.chars().skip(n - (keep - keep / 2)).collect();
        format!("{head}…{tail_part}")
    };
    let line = format!("{bytes} {tensor}{tail}");
    line.chars().take(WIDTH).collect()
}

fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in s.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

fn verify_short(v: &Option<Verify>) -> String {
    match v {
        None => "not run".into(),
        Some(v) => v.short(),
    }
}

fn draw_comparison(area: &Area, r: &Report) -> std::result::Result<(), String> {
    let x0 = 10;
    area.draw_text("KV-cache budget", &text(22), (x0, 6))
        .map_err(draw_err)?;
    // Bars: every formula and the truth.
    let mut rows: Vec<(String, i64, RGBColor)> = r
        .formulas
        .iter()
        .map(|f| {
            (
                f.id.short().to_string(),
                f.kv_bytes,
                c(palette::formula(f.id)),
            )
        })
        .collect();
    rows.push(("truth".into(), r.truth.kv_bytes, c(palette::TRUTH)));
    let max = rows.iter().map(|r| r.1.max(0)).max().unwrap_or(1).max(1) as f64;
    let (bar_x, bar_w) = (110, 330);
    // Rows of 32 pixels while they fit the panel (seven formulas and the truth do not).
    let (_, h) = area.dim_in_pixel();
    let pitch = ((h as i32 - 44) / rows.len().max(1) as i32).clamp(20, 32);
    for (i, (label, kv, color)) in rows.iter().enumerate() {
        let y = 40 + i as i32 * pitch;
        area.draw_text(label, &text(16), (x0, y + 3 - (32 - pitch) / 2))
            .map_err(draw_err)?;
        let w = ((*kv).max(0) as f64 / max * bar_w as f64) as i32;
        area.draw(&Rectangle::new(
            [(bar_x, y), (bar_x + w.max(1), y + pitch - 8)],
            color.filled(),
        ))
        .map_err(draw_err)?;
        area.draw_text(
            &fmt_i(*kv),
            &text(16),
            (bar_x + w + 6, y + 3 - (32 - pitch) / 2),
        )
        .map_err(draw_err)?;
    }
    Ok(())
}

/// Where T goes, per formula and for the truth, in the lifetime view's colours.
fn draw_waterfall(area: &Area, r: &Report, a: &Analysis) -> std::result::Result<(), String> {
    let x0 = 10;
    area.draw_text("Where the device goes (T), per formula", &text(20), (x0, 0))
        .map_err(draw_err)?;
    let twice = a.kept.iter().map(|g| g.bytes_at_t3).sum();
    let bars = budget::bars(r, twice);
    let total = r.checkpoints.t0.total.max(1) as f64;
    let (bar_x, bar_w) = (100, 470);
    for (i, b) in bars.iter().enumerate() {
        let y = 32 + i as i32 * 30;
        area.draw_text(
            &b.label,
            &text(15).color(&c(palette::legible(b.colour, false))),
            (x0, y + 3),
        )
        .map_err(draw_err)?;
        let mut x = bar_x as f64;
        for (piece, bytes) in &b.pieces {
            let w = (*bytes).max(0) as f64 / total * bar_w as f64;
            if w > 0.0 {
                area.draw(&Rectangle::new(
                    [(x as i32, y), ((x + w) as i32, y + 22)],
                    c(piece.colour()).filled(),
                ))
                .map_err(draw_err)?;
                if *piece == budget::Piece::CountedTwice {
                    area.draw(&Rectangle::new(
                        [(x as i32, y), ((x + w) as i32, y + 22)],
                        c(palette::KEPT_OUTLINE).stroke_width(2),
                    ))
                    .map_err(draw_err)?;
                }
            }
            x += w;
        }
    }
    // Legend, two columns.
    let ly = 32 + bars.len() as i32 * 30 + 6;
    for (k, p) in budget::Piece::ALL.iter().enumerate() {
        let (lx, row) = (x0 + (k % 3) as i32 * 195, ly + (k / 3) as i32 * 22);
        area.draw(&Rectangle::new(
            [(lx, row + 2), (lx + 16, row + 16)],
            c(p.colour()).filled(),
        ))
        .map_err(draw_err)?;
        area.draw_text(p.label(), &text(14), (lx + 22, row))
            .map_err(draw_err)?;
    }
    Ok(())
}

/// Old against new in numbers.
fn draw_table(area: &Area, r: &Report) -> std::result::Result<(), String> {
    let x0 = 10;
    let (Some(old), Some(new)) = (r.formula(FormulaId::Pr9352), r.formula(FormulaId::Pr9516))
    else {
        return Ok(());
    };
    let mut y = 4;
    area.draw_text(
        "old #9352",
        &text(19).color(&c(palette::legible(palette::OLD, false))),
        (200, y),
    )
    .map_err(draw_err)?;
    area.draw_text(
        "new #9516",
        &text(19).color(&c(palette::legible(palette::NEW, false))),
        (400, y),
    )
    .map_err(draw_err)?;
    y += 26;
    area.draw_text(
        &fmt_i(old.kv_bytes),
        &text(30).color(&c(palette::legible(palette::OLD, false))),
        (190, y),
    )
    .map_err(draw_err)?;
    area.draw_text(
        &fmt_i(new.kv_bytes),
        &text(30).color(&c(palette::legible(palette::NEW, false))),
        (390, y),
    )
    .map_err(draw_err)?;
    y += 42;
    let g = &r.kv_geometry;
    let table: Vec<(&str, String, String)> = vec![
        ("weights", fmt_u(r.weights_bytes), fmt_u(r.weights_bytes)),
        (
            "torch peak",
            fmt_i(old.torch_peak_bytes),
            fmt_i(new.torch_peak_bytes),
        ),
        (
            "non-torch",
            fmt_i(old.non_torch_bytes),
            fmt_i(new.non_torch_bytes),
        ),
        (
            "non-KV total",
            fmt_i(old.non_kv_bytes),
            fmt_i(new.non_kv_bytes),
        ),
        (
            "KV blocks",
            old.kv_blocks.to_string(),
            new.kv_blocks.to_string(),
        ),
        (
            "max concurrency",
            format!("{:.2}x", old.max_concurrency),
            format!("{:.2}x", new.max_concurrency),
        ),
        (
            "error vs truth",
            fmt_i(old.error_bytes),
            fmt_i(new.error_bytes),
        ),
        (
            "verify",
            verify_short(&old.verify),
            verify_short(&new.verify),
        ),
    ];
    for (label, a, b) in table {
        area.draw_text(label, &text(15), (x0, y))
            .map_err(draw_err)?;
        area.draw_text(&a, &text(15), (200, y)).map_err(draw_err)?;
        area.draw_text(&b, &text(15), (400, y)).map_err(draw_err)?;
        y += 22;
    }
    y += 4;
    let truth = format!(
        "measured truth: non-KV {}, KV {} ({} blocks of {}, max concurrency {:.2}x at {} tokens)",
        fmt_i(r.truth.non_kv_bytes),
        fmt_i(r.truth.kv_bytes),
        r.truth.kv_blocks,
        fmt_u(g.block_bytes()),
        r.truth.max_concurrency,
        g.max_model_len
    );
    for line in wrap(&truth, 66) {
        area.draw_text(
            &line,
            &text(15).color(&c(palette::legible(palette::TRUTH, false))),
            (x0, y),
        )
        .map_err(draw_err)?;
        y += 19;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::report::DeviceSample;

    #[test]
    fn peak_owner_lines_keep_the_op_and_drop_a_layer_the_name_says() {
        let l = owner_line(
            "704.0 MiB".into(),
            "model.layers.1.mlp.experts.w13_weight",
            "load",
            Some(1),
        );
        assert_eq!(l, "704.0 MiB model.layers.1.mlp.experts.w13_weight (load)");
        let l = owner_line("2.0 MiB".into(), "logits", "matmul", Some(3));
        assert_eq!(l, "2.0 MiB logits (matmul, layer 3)");
        let long = "model.language_model.layers.12.self_attn.qkv_proj.weight_scale_inv";
        let l = owner_line("1.0 MiB".into(), long, "load", Some(7));
        assert_eq!(l.chars().count(), 58, "{l}");
        assert!(l.ends_with(" (load, layer 7)") && l.contains('…'), "{l}");
    }

    #[test]
    fn gpu_samples_are_drawn_into_the_timeline() {
        let plain = crate::profile::tiny_dry_report(64);
        let end = plain.events.last().unwrap().time_us;
        let mut sampled = plain.clone();
        sampled.device_samples = (0..=100)
            .map(|i| DeviceSample {
                time_us: end * i / 100,
                device_used: 2 << 30,
                process_used: (1 << 30) + (i << 20),
            })
            .collect();
        let a = render_png(&plain).unwrap();
        let b = render_png(&sampled).unwrap();
        assert!(a.starts_with(b"\x89PNG") && b.starts_with(b"\x89PNG"));
        // Rendering is deterministic, so only the samples can make the difference.
        assert_eq!(render_png(&plain).unwrap(), a);
        assert_ne!(a, b, "the NVML line changes the picture");
    }
}

//! The PNG report: the timeline with pass shading and checkpoints, and the formula comparison
//! (KV budgets against the measured truth, old vs new in numbers). Rendered on the CPU with
//! an embedded font (egui's Ubuntu Light), so it needs no display and no system fonts.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::error::{Error, Result};
use crate::memory::EventKind;
use crate::palette::{self, Rgb};
use crate::profile::formulas::FormulaId;
use crate::profile::report::Verify;
use crate::profile::Report;
use crate::timeline::{self, Series};
use crate::units::{fmt_i, fmt_u, GIB};

pub const WIDTH: u32 = 1600;
pub const HEIGHT: u32 = 1000;
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
    register_font();
    let mut buf = vec![255u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (header, body) = root.split_vertically(96);
        draw_header(&header, report)?;
        let (left, right) = body.split_horizontally(980);
        let (plot, legend_area) = left.split_vertically(790);
        draw_timeline(&plot, report)?;
        draw_footer(&legend_area, report)?;
        draw_comparison(&right, report)?;
        root.present().map_err(draw_err)?;
    }
    Ok(buf)
}

/// Encodes the report image as PNG bytes.
pub fn render_png(report: &Report) -> std::result::Result<Vec<u8>, String> {
    let rgb = render_rgb(report)?;
    let img =
        image::RgbImage::from_raw(WIDTH, HEIGHT, rgb).ok_or("pixel buffer has the wrong size")?;
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .map_err(draw_err)?;
    Ok(out.into_inner())
}

pub fn write(report: &Report, path: &Path) -> Result<()> {
    let bytes = render_png(report).map_err(|problem| Error::Export {
        path: path.into(),
        problem,
    })?;
    super::atomic_write(path, &bytes)
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

/// The x axis is event order: passes get room in proportion to what happens in them, where
/// wall time would give most of the width to loading (host-side reads) or, on a dry run, to
/// scheduling noise.
fn draw_timeline(area: &Area, r: &Report) -> std::result::Result<(), String> {
    let events = &r.events;
    let x_max = events.len().max(1) as f64;
    // A pass's span in event indices, from its start and end times.
    let pass_span = |start: u64, end: u64| -> (f64, f64) {
        let a = events.partition_point(|e| e.time_us < start);
        let b = events.partition_point(|e| e.time_us <= end);
        (a as f64, b as f64)
    };
    let y_max = events
        .iter()
        .map(|e| e.device_used.max(e.process_used).max(e.reserved))
        .max()
        .unwrap_or(GIB) as f64
        / GIB as f64
        * 1.08;
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .caption("Memory timeline (framework allocator and device)", text(22))
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max.max(0.01))
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("event order (index in the timeline)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("GiB")
        .label_style(text(16))
        .axis_desc_style(text(18))
        .light_line_style(WHITE)
        .draw()
        .map_err(draw_err)?;

    // Passes shaded, verify passes in a second tint.
    for (i, p) in r.passes.iter().enumerate() {
        let tint = if p.verify_for.is_some() {
            RGBColor(0, 158, 115)
        } else {
            RGBColor(0, 114, 178)
        };
        let alpha = if i % 2 == 0 { 0.10 } else { 0.16 };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                {
                    let (a, b) = pass_span(p.start_us, p.end_us);
                    [(a, 0.0), (b, y_max)]
                },
                tint.mix(alpha).filled(),
            )))
            .map_err(draw_err)?;
    }

    let step = |pts: Vec<[f64; 2]>| -> Vec<(f64, f64)> {
        let mut out = Vec::with_capacity(pts.len() * 2);
        for (i, p) in pts.iter().enumerate() {
            if i > 0 {
                out.push((p[0], pts[i - 1][1] / GIB as f64));
            }
            out.push((p[0], p[1] / GIB as f64));
        }
        out
    };
    let series = [
        (Series::DeviceUsed, palette::DEVICE_USED, 2),
        (Series::ProcessUsed, palette::PROCESS_USED, 2),
        (Series::Reserved, palette::RESERVED, 2),
        (Series::Allocated, palette::ALLOCATED, 3),
    ];
    for (s, color, width) in series {
        let pts = step(timeline::reduce_by_index(events, s, 0, events.len(), 900));
        let col = c(color);
        chart
            .draw_series(LineSeries::new(pts, col.stroke_width(width)))
            .map_err(draw_err)?
            .label(s.label())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], col.stroke_width(3)));
    }
    // A GPU run's NVML readings of this process, each at the event index of its time.
    if let Some(end) = events
        .last()
        .map(|e| e.time_us)
        .filter(|_| !r.device_samples.is_empty())
    {
        let pts: Vec<(f64, f64)> = timeline::reduce_samples(&r.device_samples, 0, end, 900)
            .iter()
            .map(|p| {
                let t = (p[0] * 1e6).round() as u64;
                let x = events.partition_point(|e| e.time_us < t) as f64;
                (x, p[1] / GIB as f64)
            })
            .collect();
        let col = c(palette::PROCESS_USED);
        chart
            .draw_series(DashedLineSeries::new(pts, 5, 3, col.stroke_width(2)))
            .map_err(draw_err)?
            .label(timeline::NVML_LABEL)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], col.stroke_width(2)));
    }

    // Checkpoints t0..t3 and pass starts.
    let mut last_label_x = f64::NEG_INFINITY;
    for (i, e) in events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == EventKind::Marker)
    {
        let x = i as f64;
        let is_checkpoint = e.tensor.len() == 2 && e.tensor.starts_with('t');
        let is_pass = e.tensor.starts_with("pass ") || e.tensor.starts_with("verify ");
        if !is_checkpoint && !is_pass {
            continue;
        }
        let color = if is_checkpoint {
            RGBColor(40, 40, 40)
        } else {
            RGBColor(110, 110, 110)
        };
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, 0.0), (x, y_max)],
                6,
                4,
                color.stroke_width(1),
            ))
            .map_err(draw_err)?;
        let label = if is_checkpoint {
            e.tensor.clone()
        } else {
            // Labels closer than ~45 px would overlap: keep the line, drop the text.
            if (x - last_label_x) / x_max * 900.0 < 45.0 {
                continue;
            }
            last_label_x = x;
            e.tensor.replace("pass ", "P").replace("verify ", "V:")
        };
        let y = if is_checkpoint {
            y_max * 0.97
        } else {
            y_max * 0.91
        };
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                (x, y),
                text(if is_checkpoint { 18 } else { 13 }),
            )))
            .map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(180, 180, 180))
        .label_font(text(16))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

fn draw_footer(area: &Area, r: &Report) -> std::result::Result<(), String> {
    let why = r.old_vs_new_explanation();
    let mut y = 6;
    for line in wrap(&why, 105) {
        area.draw_text(&line, &text(17), (24, y))
            .map_err(draw_err)?;
        y += 22;
    }
    let note = format!(
        "int8 state alive after the pass: {}   outside the framework at t3: {}   truth: {}",
        fmt_u(r.quant_state_after_bytes),
        fmt_u(r.outside_framework_bytes),
        r.truth.source
    );
    area.draw_text(&note, &text(15).color(&RGBColor(80, 80, 80)), (24, y + 4))
        .map_err(draw_err)?;
    Ok(())
}

fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in s.split_whitespace() {
        if !cur.is_empty() && cur.len() + 1 + word.len() > width {
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
        Some(v) if !v.ran => "no KV memory".into(),
        Some(v) if v.oom => "OOM".into(),
        Some(v) if v.within_budget => format!("fits ({} spare)", fmt_i(-v.overrun_bytes)),
        Some(v) => format!("over by {}", fmt_i(v.overrun_bytes)),
    }
}

fn draw_comparison(area: &Area, r: &Report) -> std::result::Result<(), String> {
    let x0 = 10;
    area.draw_text("KV-cache budget", &text(24), (x0, 10))
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
    for (i, (label, kv, color)) in rows.iter().enumerate() {
        let y = 50 + i as i32 * 34;
        area.draw_text(label, &text(17), (x0, y + 4))
            .map_err(draw_err)?;
        let w = ((*kv).max(0) as f64 / max * bar_w as f64) as i32;
        area.draw(&Rectangle::new(
            [(bar_x, y), (bar_x + w.max(1), y + 24)],
            color.filled(),
        ))
        .map_err(draw_err)?;
        area.draw_text(&fmt_i(*kv), &text(16), (bar_x + w + 6, y + 4))
            .map_err(draw_err)?;
    }

    // Old vs new, in numbers.
    let (Some(old), Some(new)) = (r.formula(FormulaId::Pr9352), r.formula(FormulaId::Pr9516))
    else {
        return Ok(());
    };
    let mut y = 50 + rows.len() as i32 * 34 + 18;
    area.draw_text("old #9352", &text(20).color(&c(palette::OLD)), (200, y))
        .map_err(draw_err)?;
    area.draw_text("new #9516", &text(20).color(&c(palette::NEW)), (400, y))
        .map_err(draw_err)?;
    y += 30;
    area.draw_text(
        &fmt_i(old.kv_bytes),
        &text(34).color(&c(palette::OLD)),
        (190, y),
    )
    .map_err(draw_err)?;
    area.draw_text(
        &fmt_i(new.kv_bytes),
        &text(34).color(&c(palette::NEW)),
        (390, y),
    )
    .map_err(draw_err)?;
    y += 50;
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
        area.draw_text(label, &text(16), (x0, y))
            .map_err(draw_err)?;
        area.draw_text(&a, &text(16), (200, y)).map_err(draw_err)?;
        area.draw_text(&b, &text(16), (400, y)).map_err(draw_err)?;
        y += 26;
    }
    y += 8;
    let truth = format!(
        "measured truth: non-KV {}, KV {} ({} blocks of {}, max concurrency {:.2}x at {} tokens)",
        fmt_i(r.truth.non_kv_bytes),
        fmt_i(r.truth.kv_bytes),
        r.truth.kv_blocks,
        fmt_u(g.block_bytes()),
        r.truth.max_concurrency,
        g.max_model_len
    );
    for line in wrap(&truth, 62) {
        area.draw_text(&line, &text(15).color(&c(palette::TRUTH)), (x0, y))
            .map_err(draw_err)?;
        y += 20;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::report::DeviceSample;

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

//! The axis tick rule (issue 25, item 1), over many random ranges as egui_plot asks for them:
//! every label is its tick's value exactly to the precision shown, none repeats, none is
//! negative, ticks are at least the asked spacing apart and there are enough of them.

use egui_plot::{GridInput, GridMark};
use proptest::prelude::*;
use vramscope::app::gui::axis::{formatter, spacer, ticks, AxisKind};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A label's value in the axis's base unit, and the half-unit of its last digit.
fn parse(kind: AxisKind, s: &str) -> (f64, f64) {
    if s == "0" {
        return (0.0, 0.0);
    }
    let (num, scale) = match kind {
        AxisKind::Bytes => {
            let (n, u) = s.split_once(' ').expect("number and unit");
            let k = match u {
                "B" => 1.0,
                "KiB" => 1024.0,
                "MiB" => 1024.0 * 1024.0,
                "GiB" => GIB,
                "TiB" => GIB * 1024.0,
                _ => panic!("unit in {s}"),
            };
            (n, k)
        }
        AxisKind::Seconds => {
            let (n, u) = s.split_once(' ').expect("number and unit");
            let k = match u {
                "s" => 1.0,
                "ms" => 1e-3,
                "µs" => 1e-6,
                _ => panic!("unit in {s}"),
            };
            (n, k)
        }
        AxisKind::Events => match s.strip_suffix('k') {
            Some(n) => (n, 1e3),
            None => match s.strip_suffix('M') {
                Some(n) => (n, 1e6),
                None => (s, 1.0),
            },
        },
    };
    let decimals = num.split_once('.').map_or(0, |(_, d)| d.len());
    let v: f64 = num.parse().unwrap_or_else(|_| panic!("number in {s}"));
    (v * scale, 0.5 * 10f64.powi(-(decimals as i32)) * scale)
}

/// What egui_plot does: the spacer's marks, each labelled by the formatter.
fn through_plot(kind: AxisKind, lo: f64, hi: f64, px: f64, min_px: f32) -> Vec<(GridMark, String)> {
    let input = GridInput {
        bounds: (lo, hi),
        base_step_size: (hi - lo) / px * 8.0,
    };
    let fmt = formatter(kind);
    spacer(kind, min_px)(input)
        .into_iter()
        .map(|m| (m, fmt(m, &(lo..=hi))))
        .collect()
}

fn check(kind: AxisKind, lo: f64, hi: f64, px: f64, min_px: f32) {
    let marks = through_plot(kind, lo, hi, px, min_px);
    let per_px = (hi - lo) / px;
    let mut labels = Vec::new();
    for (m, label) in &marks {
        assert!(
            m.value >= 0.0,
            "{kind:?} {lo}..{hi}: negative tick {}",
            m.value
        );
        assert!(m.value >= lo - 1e-9 * hi.abs() && m.value <= hi + 1e-6 * hi.abs());
        let (v, _half) = parse(kind, label);
        // Exact: the tick sits on the value its label says (to float rounding).
        assert!(
            (v - m.value).abs() <= 1e-9 * m.value.abs().max(1.0),
            "{kind:?} {lo}..{hi}: '{label}' labels {}",
            m.value
        );
        // Labels at least the asked pixels apart.
        assert!(
            m.step_size / per_px >= min_px as f64 * 0.999,
            "{kind:?}: step {} is {} px",
            m.step_size,
            m.step_size / per_px
        );
        labels.push(label.clone());
    }
    let n = labels.len();
    labels.sort();
    labels.dedup();
    assert_eq!(
        labels.len(),
        n,
        "{kind:?} {lo}..{hi}: repeated labels {marks:?}"
    );
    // Enough ticks to read the axis: a range 5 label spacings long (and past 0) gets 2.
    let whole_steps = (hi - lo.max(0.0)) / per_px / min_px as f64;
    let min_unit = match kind {
        AxisKind::Bytes | AxisKind::Events => 1.0,
        AxisKind::Seconds => 1e-6,
    };
    if whole_steps >= 5.0 && (hi - lo.max(0.0)) >= 10.0 * min_unit {
        assert!(n >= 2, "{kind:?} {lo}..{hi} over {px} px: ticks {marks:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn byte_ticks_are_exact_distinct_and_never_negative(
        top_exp in 0.0f64..44.0,
        span_frac in 1e-7f64..1.0,
        below in -0.3f64..0.9,
        px in 80.0f64..1400.0,
        min_px in 20.0f32..60.0,
    ) {
        let hi = 2f64.powf(top_exp);
        let span = (hi * span_frac).max(1e-3);
        let lo = hi - span * (1.0 + below.max(0.0)) + if below < 0.0 { below * span } else { 0.0 };
        check(AxisKind::Bytes, lo, hi, px, min_px);
    }

    #[test]
    fn event_ticks_are_exact_distinct_and_never_negative(
        hi in 1.0f64..5e7,
        span_frac in 1e-6f64..1.0,
        px in 80.0f64..1900.0,
        min_px in 60.0f32..160.0,
    ) {
        check(AxisKind::Events, hi - hi * span_frac * 1.2, hi, px, min_px);
    }

    #[test]
    fn time_ticks_are_exact_distinct_and_never_negative(
        hi in 1e-5f64..3000.0,
        span_frac in 1e-4f64..1.0,
        px in 80.0f64..1900.0,
        min_px in 60.0f32..160.0,
    ) {
        check(AxisKind::Seconds, hi - hi * span_frac * 1.2, hi, px, min_px);
    }
}

/// The cases of the walkthrough: a memory zoom around 13 GiB shows distinct labels, the full
/// lifetime view reads whole binary steps, and 16.76 GiB is never called "17 GiB".
#[test]
fn walkthrough_ranges_read_exactly() {
    // Zoomed memory around 13 GiB, 400 px tall: labels in tenths or hundredths of a GiB.
    let t = ticks(AxisKind::Bytes, 12.88 * GIB, 13.32 * GIB, 0.04 * GIB);
    let labels: Vec<&str> = t.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "12.90 GiB",
            "12.95 GiB",
            "13.00 GiB",
            "13.05 GiB",
            "13.10 GiB",
            "13.15 GiB",
            "13.20 GiB",
            "13.25 GiB",
            "13.30 GiB"
        ]
    );
    // The whole int8 lifetime view, 0..26.8 GiB over 450 px, 40 px apart: 5 GiB steps.
    let t = ticks(AxisKind::Bytes, 0.0, 26.8 * GIB, 26.8 * GIB / 450.0 * 40.0);
    let labels: Vec<&str> = t.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(
        labels,
        ["0", "5 GiB", "10 GiB", "15 GiB", "20 GiB", "25 GiB"]
    );
    // A pan below zero: no negative tick.
    let t = ticks(
        AxisKind::Bytes,
        -95.0 * 1024.0 * 1024.0,
        900.0 * 1024.0 * 1024.0,
        100.0 * 1024.0 * 1024.0,
    );
    assert_eq!(t[0].label, "0");
    assert_eq!(t[1].label, "100 MiB");
    // Events over 20k at 700 px, 110 px apart: 5k steps, no "1k 1k 1k".
    let t = ticks(AxisKind::Events, 0.0, 20_000.0, 20_000.0 / 700.0 * 110.0);
    let labels: Vec<&str> = t.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(labels, ["0", "5k", "10k", "15k", "20k"]);
    // A few hundred events zoomed: whole events.
    let t = ticks(AxisKind::Events, 1000.0, 1300.0, 80.0);
    let labels: Vec<&str> = t.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(labels, ["1000", "1100", "1200", "1300"]);
    // Seconds: a 0.12 s run over 700 px.
    let t = ticks(AxisKind::Seconds, 0.0, 0.125, 0.125 / 700.0 * 110.0);
    let labels: Vec<&str> = t.iter().map(|t| t.label.as_str()).collect();
    assert_eq!(
        labels,
        ["0", "20 ms", "40 ms", "60 ms", "80 ms", "100 ms", "120 ms"]
    );
}

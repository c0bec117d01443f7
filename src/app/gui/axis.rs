//! Axis ticks that tell the truth: each tick sits exactly on the value its label says. Steps
//! are 1-2-5 of the unit shown (GiB, MiB, KiB or bytes; s, ms or µs; events, k or M), chosen
//! so labels stay a given number of pixels apart; a byte, time or count axis never shows a
//! negative tick, and no label repeats (a step is never finer than the label's precision).
//!
//! `ticks` is the rule; `spacer` and `formatter` hand it to egui_plot, whose formatter gets
//! only a tick's value, its step and the visible range, so the unit is chosen from those alone.

use std::ops::RangeInclusive;

use egui_plot::{GridInput, GridMark};

/// What an axis counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AxisKind {
    /// Bytes, labelled in binary units.
    Bytes,
    /// Seconds since the run started.
    Seconds,
    /// Whole events (an index in the timeline).
    Events,
}

/// One tick: where it sits and what it says.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    pub value: f64,
    pub label: String,
}

const KIB: f64 = 1024.0;
const BYTE_UNITS: [(f64, &str); 5] = [
    (KIB * KIB * KIB * KIB, "TiB"),
    (KIB * KIB * KIB, "GiB"),
    (KIB * KIB, "MiB"),
    (KIB, "KiB"),
    (1.0, "B"),
];
/// Finest step in a unit before the next smaller unit is used (two decimals at most).
const FINEST: f64 = 0.01;

/// The smallest 1-2-5 × 10^k that is at least `x` (x > 0).
fn nice_at_least(x: f64) -> f64 {
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= x * (1.0 - 1e-9) {
            return m * p;
        }
    }
    10.0 * p
}

/// Decimals that show a step of `step` (a 1-2-5 number) exactly.
fn decimals(step: f64) -> usize {
    (-step.log10() - 1e-9).ceil().max(0.0) as usize
}

/// The byte unit for ticks of at least `min_step` bytes on a range reaching `hi`: the largest
/// unit the range reaches in which the step needs at most two decimals.
fn byte_unit_for_min_step(min_step: f64, hi: f64) -> (f64, &'static str) {
    for (u, name) in BYTE_UNITS {
        if u == 1.0 || (hi >= u && nice_at_least(min_step / u) >= FINEST * (1.0 - 1e-9)) {
            return (u, name);
        }
    }
    (1.0, "B")
}

/// The same unit, found again from a tick's step (as egui_plot's formatter sees it).
fn byte_unit_for_step(step: f64, hi: f64) -> (f64, &'static str) {
    for (u, name) in BYTE_UNITS {
        if u == 1.0 || (hi >= u && step / u >= FINEST * (1.0 - 1e-6)) {
            return (u, name);
        }
    }
    (1.0, "B")
}

/// The step for labels at least `min_step` apart, in the axis's units.
fn step_for(kind: AxisKind, min_step: f64, hi: f64) -> f64 {
    let min_step = min_step.max(f64::MIN_POSITIVE);
    match kind {
        AxisKind::Bytes => {
            let (u, _) = byte_unit_for_min_step(min_step, hi);
            let s = nice_at_least(min_step / u) * u;
            if u == 1.0 {
                s.max(1.0)
            } else {
                s
            }
        }
        AxisKind::Events => nice_at_least(min_step).max(1.0),
        AxisKind::Seconds => nice_at_least(min_step).max(1e-6),
    }
}

/// A tick's label, from its value, its step and the top of the visible range.
pub fn label(kind: AxisKind, value: f64, step: f64, hi: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    match kind {
        AxisKind::Bytes => {
            let (u, name) = byte_unit_for_step(step, hi);
            let d = decimals(step / u);
            format!("{:.*} {name}", d, value / u)
        }
        AxisKind::Events => {
            let (u, suffix) = if step >= 1e6 {
                (1e6, "M")
            } else if step >= 1e3 {
                (1e3, "k")
            } else {
                (1.0, "")
            };
            format!("{:.*}{suffix}", decimals(step / u), value / u)
        }
        AxisKind::Seconds => {
            let (u, name) = if step >= 0.1 {
                (1.0, "s")
            } else if step >= 1e-4 {
                (1e-3, "ms")
            } else {
                (1e-6, "µs")
            };
            format!("{:.*} {name}", decimals(step / u), value / u)
        }
    }
}

/// Ticks over `lo..=hi` at least `min_step` apart (in the axis's units), none below zero.
pub fn ticks(kind: AxisKind, lo: f64, hi: f64, min_step: f64) -> Vec<Tick> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= 0.0 || hi < lo {
        return Vec::new();
    }
    let step = step_for(kind, min_step, hi);
    // A tick a rounding error past either edge still counts (0.12 / 0.02 = 5.999…).
    let first = (lo.max(0.0) / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    if last - first > 1000 {
        return Vec::new();
    }
    (first..=last)
        .map(|k| {
            let value = k as f64 * step;
            Tick {
                value,
                label: label(kind, value, step, hi),
            }
        })
        .collect()
}

/// egui_plot's grid for this axis: one tick per step, labels at least `min_px` apart.
pub fn spacer(kind: AxisKind, min_px: f32) -> impl Fn(GridInput) -> Vec<GridMark> {
    move |input: GridInput| {
        // egui_plot's base step is what 8 px hold (its grid_spacing.min).
        let per_px = input.base_step_size / 8.0;
        let min_step = per_px * min_px as f64;
        let (lo, hi) = input.bounds;
        let step = step_for(kind, min_step, hi);
        ticks(kind, lo, hi, min_step)
            .into_iter()
            .map(|t| GridMark {
                value: t.value,
                step_size: step,
            })
            .collect()
    }
}

/// egui_plot's tick label for this axis (the same words `ticks` gives).
pub fn formatter(kind: AxisKind) -> impl Fn(GridMark, &RangeInclusive<f64>) -> String {
    move |m: GridMark, range: &RangeInclusive<f64>| label(kind, m.value, m.step_size, *range.end())
}

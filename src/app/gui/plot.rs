//! What the lifetime view and the memory-lines timeline share: one plot set up the same way
//! (no built-in scroll or zoom, box zoom, double-click reset, no hover readout, byte ticks),
//! the wheel zoom, and the axis tick texts.

use egui_plot::{Plot, PlotUi};

use crate::base::units::GIB;

/// A plot as both views configure it; `x_label` and the x ticks are the caller's.
pub(crate) fn base_plot(id: &'static str) -> Plot<'static> {
    Plot::new(id)
        .allow_scroll(false)
        .allow_zoom(false)
        .allow_boxed_zoom(true)
        .allow_double_click_reset(true)
        .show_x(false)
        .show_y(false)
        .y_axis_formatter(|m, _| axis_bytes(m.value))
        .label_formatter(|_| None)
}

/// Scroll zooms time (x); with Shift, or as Ctrl+scroll / pinch, it zooms memory (y). Drag
/// pans (the plot's own).
pub(crate) fn wheel_zoom(pui: &mut PlotUi<'_>) {
    if !pui.response().contains_pointer() {
        return;
    }
    let (scroll, zoom, mods) = pui
        .ctx()
        .input(|i| (i.smooth_scroll_delta, i.zoom_delta(), i.modifiers));
    let wheel = if scroll.y != 0.0 { scroll.y } else { scroll.x };
    let mut f = egui::vec2(1.0, 1.0);
    if wheel != 0.0 {
        let k = (wheel * 0.004).exp();
        if mods.shift {
            f.y = k;
        } else {
            f.x = k;
        }
    }
    if zoom != 1.0 {
        f.y *= zoom;
    }
    if f != egui::vec2(1.0, 1.0) {
        pui.zoom_bounds_around_hovered(f);
    }
}

/// An event-count tick: 950, 12k, 1.25M.
pub(crate) fn axis_count(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v.abs() >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// A byte tick in whole GiB, or MiB below one GiB.
pub(crate) fn axis_bytes(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= GIB as f64 {
        format!("{:.0} GiB", v / GIB as f64)
    } else {
        format!("{:.0} MiB", v / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_read_as_counts_and_bytes() {
        assert_eq!(axis_count(950.0), "950");
        assert_eq!(axis_count(12_400.0), "12k");
        assert_eq!(axis_count(1_250_000.0), "1.25M");
        assert_eq!(axis_bytes(0.0), "0");
        assert_eq!(axis_bytes(512.0 * (1u64 << 20) as f64), "512 MiB");
        assert_eq!(axis_bytes(19.0 * GIB as f64), "19 GiB");
    }
}

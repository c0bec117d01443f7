//! What the lifetime view and the memory-lines timeline share: one plot set up the same way
//! (no built-in scroll or zoom, box zoom, double-click reset, no hover readout, byte ticks on
//! 1-2-5 steps of a binary unit), the wheel zoom, and the x ticks of each kind.

use egui_plot::{Plot, PlotUi};

use super::axis::{self, AxisKind};

/// Pixels between two labels, in lines of body text: y labels stack, x labels sit side by
/// side and need the room of their text ("12.50 ms").
const Y_LABEL_LINES: f32 = 2.4;
const X_LABEL_EMS: f32 = 6.5;

/// A plot as both views configure it: a byte y-axis and an x-axis of `x` (the x label is the
/// caller's). Tick spacing follows the body text size, so Present spaces them further apart.
pub(crate) fn base_plot(ui: &egui::Ui, id: &'static str, x: AxisKind) -> Plot<'static> {
    let body = egui::TextStyle::Body.resolve(ui.style()).size;
    Plot::new(id)
        .allow_scroll(false)
        .allow_zoom(false)
        .allow_boxed_zoom(true)
        .allow_double_click_reset(true)
        .show_x(false)
        .show_y(false)
        .y_grid_spacer(axis::spacer(AxisKind::Bytes, body * Y_LABEL_LINES))
        .y_axis_formatter(axis::formatter(AxisKind::Bytes))
        .x_grid_spacer(axis::spacer(x, body * X_LABEL_EMS))
        .x_axis_formatter(axis::formatter(x))
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

//! Look: the shared palette as egui colours, and text sizes that read on a projector.

use egui::{Color32, FontFamily, FontId, TextStyle};

use crate::report::palette::Rgb;

pub fn c32(c: Rgb) -> Color32 {
    Color32::from_rgb(c.0, c.1, c.2)
}

/// A palette colour that stays legible on the current background (the palette's black
/// "process used" line turns light in dark mode).
pub fn on_bg(c: Rgb, dark: bool) -> Color32 {
    if dark && c == crate::report::palette::PROCESS_USED {
        Color32::from_gray(230)
    } else {
        c32(c)
    }
}

/// Larger text than egui's defaults: the window is often shown on a projector.
pub fn apply(ctx: &egui::Context) {
    set_text_sizes(ctx, 1.0);
    ctx.all_styles_mut(|style| {
        style.spacing.item_spacing = egui::vec2(8.0, 6.0);
        style.spacing.button_padding = egui::vec2(8.0, 4.0);
    });
}

/// Presentation mode: every text a quarter larger (and back).
pub fn set_presentation(ctx: &egui::Context, on: bool) {
    set_text_sizes(ctx, if on { 1.25 } else { 1.0 });
}

fn set_text_sizes(ctx: &egui::Context, scale: f32) {
    ctx.all_styles_mut(|style| {
        style.text_styles = [
            (TextStyle::Small, 13.0, FontFamily::Proportional),
            (TextStyle::Body, 16.0, FontFamily::Proportional),
            (TextStyle::Button, 16.0, FontFamily::Proportional),
            (TextStyle::Heading, 22.0, FontFamily::Proportional),
            (TextStyle::Monospace, 15.0, FontFamily::Monospace),
        ]
        .into_iter()
        .map(|(t, size, family)| (t, FontId::new(size * scale, family)))
        .collect();
    });
}

/// Size of the two big budget numbers.
pub const BIG: f32 = 34.0;

/// A palette colour as a line or label on this theme's background (≥ 4.5:1).
pub fn legible(c: Rgb, dark: bool) -> Color32 {
    c32(crate::report::palette::legible(c, dark))
}

/// A legend entry: a colour swatch and its label as one widget, so a wrapping row never puts
/// the swatch at one line's end and its label at the next one's start.
pub fn swatch(ui: &mut egui::Ui, fill: Color32, text: impl Into<String>) {
    let text = text.into();
    let colour = ui.visuals().text_color();
    let font = TextStyle::Body.resolve(ui.style());
    let galley = ui.fonts_mut(|f| f.layout_no_wrap(text.clone(), font, colour));
    let side = ui.text_style_height(&TextStyle::Body) * 0.75;
    let gap = 4.0;
    let size = egui::vec2(side + gap + galley.size().x, galley.size().y.max(side));
    let (rect, resp) = ui.allocate_exact_size(size, egui::Sense::hover());
    let sq = egui::Rect::from_center_size(
        egui::pos2(rect.left() + side / 2.0, rect.center().y),
        egui::vec2(side, side),
    );
    ui.painter().rect_filled(sq, 2.0, fill);
    ui.painter().galley(
        egui::pos2(
            rect.left() + side + gap,
            rect.center().y - galley.size().y / 2.0,
        ),
        galley,
        colour,
    );
    resp.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Label, true, &text));
}

//! Look: the shared palette as egui colours, and text sizes that read on a projector.

use egui::{Color32, FontFamily, FontId, TextStyle};

use crate::palette::Rgb;

pub fn c32(c: Rgb) -> Color32 {
    Color32::from_rgb(c.0, c.1, c.2)
}

/// A palette colour that stays legible on the current background (the palette's black
/// "process used" line turns light in dark mode).
pub fn on_bg(c: Rgb, dark: bool) -> Color32 {
    if dark && c == crate::palette::PROCESS_USED {
        Color32::from_gray(230)
    } else {
        c32(c)
    }
}

/// Larger text than egui's defaults: the window is often shown on a projector.
pub fn apply(ctx: &egui::Context) {
    ctx.all_styles_mut(|style| {
        style.text_styles = [
            (
                TextStyle::Small,
                FontId::new(13.0, FontFamily::Proportional),
            ),
            (TextStyle::Body, FontId::new(16.0, FontFamily::Proportional)),
            (
                TextStyle::Button,
                FontId::new(16.0, FontFamily::Proportional),
            ),
            (
                TextStyle::Heading,
                FontId::new(22.0, FontFamily::Proportional),
            ),
            (
                TextStyle::Monospace,
                FontId::new(15.0, FontFamily::Monospace),
            ),
        ]
        .into();
        style.spacing.item_spacing = egui::vec2(8.0, 6.0);
        style.spacing.button_padding = egui::vec2(8.0, 4.0);
    });
}

/// Size of the two big budget numbers.
pub const BIG: f32 = 34.0;

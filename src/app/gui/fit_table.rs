//! A table that never cuts a column: where the panel holds the name column and every value
//! column on one line it is a plain grid; where it does not (Present at 1280x720), each row
//! drops to two lines, its name over its values, each value column an equal share of the
//! width and a long cell wrapping inside its share.

use egui::{Color32, RichText};

/// One cell: its text, colour, font and what it says on hover.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cell {
    pub text: String,
    pub colour: Option<Color32>,
    /// Numbers in monospace; names and headers in the body font.
    pub mono: bool,
    pub strong: bool,
    pub background: Option<Color32>,
    pub hover: Option<String>,
}

impl Cell {
    pub fn text(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            ..Cell::default()
        }
    }

    pub fn number(text: impl Into<String>) -> Cell {
        Cell {
            mono: true,
            ..Cell::text(text)
        }
    }

    pub fn colour(mut self, c: Color32) -> Cell {
        self.colour = Some(c);
        self
    }

    pub fn strong(mut self) -> Cell {
        self.strong = true;
        self
    }

    pub fn background(mut self, c: Color32) -> Cell {
        self.background = Some(c);
        self
    }

    pub fn hover(mut self, h: impl Into<String>) -> Cell {
        self.hover = Some(h.into());
        self
    }

    fn rich(&self) -> RichText {
        let mut t = RichText::new(&self.text);
        if self.mono {
            t = t.monospace();
        }
        if self.strong {
            t = t.strong();
        }
        if let Some(c) = self.colour {
            t = t.color(c);
        }
        if let Some(c) = self.background {
            t = t.background_color(c);
        }
        t
    }

    /// Draws the cell; `wrap` only where its width is known (a two-line row's share): a grid
    /// cell has no width on the grid's first frame and would wrap letter by letter.
    fn show(&self, ui: &mut egui::Ui, wrap: bool) {
        let label = egui::Label::new(self.rich());
        let resp = ui.add(if wrap { label.wrap() } else { label.extend() });
        if let Some(h) = &self.hover {
            resp.on_hover_text(h);
        }
    }

    fn width(&self, ui: &egui::Ui) -> f32 {
        let font = if self.mono {
            egui::TextStyle::Monospace
        } else {
            egui::TextStyle::Body
        }
        .resolve(ui.style());
        ui.fonts_mut(|f| {
            f.layout_no_wrap(self.text.clone(), font, Color32::WHITE)
                .size()
                .x
        })
    }
}

/// A row: its name (the first column) and its values.
pub(crate) struct Row {
    pub name: Cell,
    pub cells: Vec<Cell>,
}

/// Draws the table (`header[0]` heads the name column, the rest the value columns).
pub(crate) fn fit_table(ui: &mut egui::Ui, id: &str, header: &[Cell], rows: &[Row]) {
    let gap = 8.0;
    let n = header.len().saturating_sub(1).max(1);
    let mut col_w: Vec<f32> = header[1..].iter().map(|c| c.width(ui)).collect();
    col_w.resize(n, 0.0);
    for r in rows {
        for (j, c) in r.cells.iter().enumerate().take(n) {
            col_w[j] = col_w[j].max(c.width(ui));
        }
    }
    let name_w = rows
        .iter()
        .map(|r| r.name.width(ui))
        .chain(header.first().map(|c| c.width(ui)))
        .fold(0.0, f32::max);
    let avail = ui.available_width();
    let one_line = name_w + col_w.iter().sum::<f32>() + gap * n as f32 + 4.0 <= avail;
    if one_line {
        egui::Grid::new(id)
            .num_columns(n + 1)
            .striped(true)
            .spacing([gap, 6.0])
            .show(ui, |ui| {
                header.iter().for_each(|c| c.show(ui, false));
                ui.end_row();
                for r in rows {
                    r.name.show(ui, false);
                    r.cells.iter().for_each(|c| c.show(ui, false));
                    ui.end_row();
                }
            });
    } else {
        let share = ((avail - gap * (n as f32 - 1.0)) / n as f32)
            .floor()
            .max(40.0);
        // The values of a row, each in its share of the width.
        let values = |ui: &mut egui::Ui, cells: &[Cell]| {
            ui.horizontal_top(|ui| {
                ui.spacing_mut().item_spacing.x = gap;
                for c in cells {
                    ui.allocate_ui_with_layout(
                        egui::vec2(share, 0.0),
                        egui::Layout::top_down(egui::Align::Min),
                        |ui| {
                            ui.set_width(share);
                            c.show(ui, true);
                        },
                    );
                }
            });
        };
        ui.push_id((id, "two-lines"), |ui| {
            ui.spacing_mut().item_spacing.y = 1.0;
            if !header[0].text.is_empty() {
                header[0].show(ui, true);
            }
            values(ui, &header[1..]);
            ui.add_space(4.0);
            for (i, r) in rows.iter().enumerate() {
                let mut name = r.name.clone();
                if name.colour.is_none() {
                    name.colour = Some(ui.visuals().weak_text_color());
                }
                // Alternate rows on a faint band, as the one-line grid stripes them.
                let fill = if i % 2 == 1 {
                    ui.visuals().faint_bg_color
                } else {
                    Color32::TRANSPARENT
                };
                egui::Frame::new().fill(fill).show(ui, |ui| {
                    ui.set_width(avail);
                    name.show(ui, true);
                    values(ui, &r.cells);
                });
            }
        });
    }
}

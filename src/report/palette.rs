//! Colours shared by the app, the PNG report and the docs, so "old", "new" and "truth" look the
//! same everywhere (chosen to stay apart for common colour-vision deficiencies and on a
//! projector).

/// sRGB colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

/// #9352 activation-release (old formula): vermilion.
pub const OLD: Rgb = Rgb(213, 94, 0);
/// #9516 total-minus-torch (new formula): blue.
pub const NEW: Rgb = Rgb(0, 114, 178);
/// Measured ground truth: bluish green.
pub const TRUTH: Rgb = Rgb(0, 158, 115);
/// The other formulas (v0.6.3, #10511, #12126).
pub const OTHER: [Rgb; 3] = [Rgb(204, 121, 167), Rgb(230, 159, 0), Rgb(86, 180, 233)];

/// A budget broken: "over budget by …" and out of memory (a red that `legible` darkens or
/// lightens to 4.5:1 in each theme; egui's own error red is 3.9:1 on the light panel).
pub const OVER: Rgb = Rgb(215, 25, 28);

/// Timeline series.
pub const ALLOCATED: Rgb = Rgb(0, 114, 178);
pub const RESERVED: Rgb = Rgb(86, 180, 233);
pub const DEVICE_USED: Rgb = Rgb(120, 120, 120);
pub const PROCESS_USED: Rgb = Rgb(0, 0, 0);

/// Per-category stack colours (weight, activation, sampler, quant-state, kv-cache, workspace, cuda-graph,
/// non-framework).
pub fn category(c: crate::memory::Category) -> Rgb {
    use crate::memory::Category::*;
    match c {
        Weight => Rgb(120, 144, 156),
        Activation => Rgb(0, 114, 178),
        // Sky blue: the sampler's buffers sit on top of the activations they follow.
        Sampler => Rgb(86, 180, 233),
        QuantState => Rgb(213, 94, 0),
        KvCache => Rgb(0, 158, 115),
        Workspace => Rgb(230, 159, 0),
        // Yellow (Okabe-Ito): the graph pool's bands stand apart from the activations.
        CudaGraph => Rgb(240, 228, 66),
        NonFramework => Rgb(204, 121, 167),
    }
}

/// A lifetime band's fill: its category colour in one of four shades by allocation order, so
/// neighbouring tensors stay apart; the kept highlight over everything. Merged bands (`life`
/// `None`) take the plain category colour.
pub fn band(c: crate::memory::Category, kept: bool, life: Option<u32>) -> Rgb {
    if kept {
        return KEPT;
    }
    let base = category(c);
    match life {
        Some(id) => {
            let k = [0.0, 0.12, 0.24, 0.36][(id % 4) as usize];
            let mix = |v: u8| (v as f64 + (255.0 - v as f64) * k).round() as u8;
            Rgb(mix(base.0), mix(base.1), mix(base.2))
        }
        None => base,
    }
}

/// Colour of a formula by id.
pub fn formula(id: crate::profile::formulas::FormulaId) -> Rgb {
    use crate::profile::formulas::FormulaId::*;
    match id {
        Pr9352 => OLD,
        Pr9516 => NEW,
        V0_6_3 => OTHER[0],
        Pr10511 => OTHER[1],
        Pr12126 => OTHER[2],
        Pr49208 => OTHER[0],
    }
}

/// Tensors that outlive the pass that made them: Okabe-Ito yellow, a fill no category uses,
/// always drawn with `KEPT_OUTLINE` around it.
pub const KEPT: Rgb = Rgb(240, 228, 66);
pub const KEPT_OUTLINE: Rgb = Rgb(0, 0, 0);
/// The reference lines of the lifetime view: Â (framework peak) and T·u.
pub const PEAK: Rgb = Rgb(60, 60, 60);
pub const BUDGET: Rgb = Rgb(120, 60, 160);

/// The darkest background a light theme draws lines and labels on (egui's faint fills), and
/// the lightest one of a dark theme.
pub const BG_LIGHT: Rgb = Rgb(238, 238, 238);
pub const BG_DARK: Rgb = Rgb(45, 45, 45);
/// WCAG's minimum contrast for text and thin lines.
pub const MIN_CONTRAST: f64 = 4.5;

/// WCAG relative luminance of an sRGB colour.
pub fn luminance(c: Rgb) -> f64 {
    let lin = |v: u8| {
        let s = v as f64 / 255.0;
        if s <= 0.04045 {
            s / 12.92
        } else {
            ((s + 0.055) / 1.055).powf(2.4)
        }
    };
    0.2126 * lin(c.0) + 0.7152 * lin(c.1) + 0.0722 * lin(c.2)
}

/// WCAG contrast ratio (1 to 21).
pub fn contrast(a: Rgb, b: Rgb) -> f64 {
    let (la, lb) = (luminance(a), luminance(b));
    (la.max(lb) + 0.05) / (la.min(lb) + 0.05)
}

/// `c` as a line or label on the theme's background: mixed towards black (light theme) or
/// white (dark theme) just enough to reach `MIN_CONTRAST` against the theme's worst
/// background, so hue stays recognisable and every line reads on a projector.
pub fn legible(c: Rgb, dark: bool) -> Rgb {
    let (bg, to) = if dark {
        (BG_DARK, 255.0)
    } else {
        (BG_LIGHT, 0.0)
    };
    let mix = |v: u8, t: f64| (v as f64 + (to - v as f64) * t).round() as u8;
    let mut t = 0.0;
    loop {
        let m = Rgb(mix(c.0, t), mix(c.1, t), mix(c.2, t));
        if contrast(m, bg) >= MIN_CONTRAST || t >= 1.0 {
            return m;
        }
        t += 0.02;
    }
}

/// Every colour the app and the report draw as a line or label (formulas, truth, series,
/// categories, the lifetime view's reference lines).
pub fn line_colours() -> Vec<Rgb> {
    let mut v = vec![
        OLD,
        NEW,
        TRUTH,
        ALLOCATED,
        RESERVED,
        DEVICE_USED,
        PROCESS_USED,
        PEAK,
        BUDGET,
        KEPT_OUTLINE,
        OVER,
    ];
    v.extend(OTHER);
    v.extend(crate::memory::Category::ALL.map(category));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contrast_of_black_on_white_is_21_and_of_a_colour_on_itself_is_1() {
        assert!((contrast(Rgb(0, 0, 0), Rgb(255, 255, 255)) - 21.0).abs() < 1e-9);
        assert!((contrast(OLD, OLD) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn every_line_and_label_reaches_4_5_to_1_in_both_themes() {
        for c in line_colours() {
            for dark in [false, true] {
                let bg = if dark { BG_DARK } else { BG_LIGHT };
                let l = legible(c, dark);
                let ratio = contrast(l, bg);
                assert!(ratio >= MIN_CONTRAST, "{c:?} dark={dark}: {ratio:.2}");
                // Against the theme's pure background too (white panels, black plots).
                let pure = if dark {
                    Rgb(10, 10, 10)
                } else {
                    Rgb(255, 255, 255)
                };
                assert!(contrast(l, pure) >= MIN_CONTRAST, "{c:?} dark={dark}");
            }
        }
        // The complaints: light-theme reserved at 2.2:1, dark "#9516 new" at 3.3:1.
        assert!(contrast(RESERVED, Rgb(255, 255, 255)) < 2.5);
        assert!(contrast(legible(RESERVED, false), BG_LIGHT) >= MIN_CONTRAST);
        assert!(contrast(legible(NEW, true), BG_DARK) >= MIN_CONTRAST);
        // And the verify cells' "over budget" in egui's pure error red, 3.9:1 on the light panel.
        assert!(contrast(Rgb(255, 0, 0), BG_LIGHT) < MIN_CONTRAST);
        assert!(contrast(legible(OVER, false), BG_LIGHT) >= MIN_CONTRAST);
    }

    #[test]
    fn a_colour_already_legible_is_left_as_it_is() {
        assert_eq!(legible(Rgb(0, 0, 0), false), Rgb(0, 0, 0));
        assert_eq!(legible(Rgb(255, 255, 255), true), Rgb(255, 255, 255));
    }
}

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

/// Timeline series.
pub const ALLOCATED: Rgb = Rgb(0, 114, 178);
pub const RESERVED: Rgb = Rgb(86, 180, 233);
pub const DEVICE_USED: Rgb = Rgb(120, 120, 120);
pub const PROCESS_USED: Rgb = Rgb(0, 0, 0);

/// Per-category stack colours (weight, activation, sampler, quant-state, kv-cache, workspace, non-framework).
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
        NonFramework => Rgb(204, 121, 167),
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
    }
}

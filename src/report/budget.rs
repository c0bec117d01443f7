//! Where the device goes, per formula: T split into the weights, the activation/sampler peak
//! above them, survivors the old formula counts twice, memory outside the framework, the KV
//! budget and the headroom T·(1 − u); the measured truth split the same way beside them. Pure
//! function of the Report, drawn by the app and the PNG report in the timeline's colours.

use crate::profile::formulas::{budget, FormulaId};
use crate::profile::Report;
use crate::report::palette::{self, Rgb};

/// One piece of a bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    Weights,
    /// The framework peak above the weights (activations, sampler, kept state of the pass).
    Peak,
    /// Tensors alive at t3 that #9352 also reads in its free-memory drop.
    CountedTwice,
    NonTorch,
    Kv,
    /// T − T·u: never given to vLLM.
    Headroom,
}

impl Piece {
    pub const ALL: [Piece; 6] = [
        Piece::Weights,
        Piece::Peak,
        Piece::CountedTwice,
        Piece::NonTorch,
        Piece::Kv,
        Piece::Headroom,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Piece::Weights => "weights",
            Piece::Peak => "activation/sampler peak",
            Piece::CountedTwice => "survivors counted twice",
            Piece::NonTorch => "non-torch",
            Piece::Kv => "KV budget",
            Piece::Headroom => "headroom T·(1-u)",
        }
    }

    /// The same colours as the lifetime view's bands.
    pub fn colour(self) -> Rgb {
        use crate::memory::Category;
        match self {
            Piece::Weights => palette::category(Category::Weight),
            Piece::Peak => palette::category(Category::Activation),
            Piece::CountedTwice => palette::KEPT,
            Piece::NonTorch => palette::category(Category::NonFramework),
            Piece::Kv => palette::category(Category::KvCache),
            Piece::Headroom => Rgb(215, 215, 215),
        }
    }
}

/// One bar: a formula's (or the truth's) split of T.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub label: String,
    pub colour: Rgb,
    pub pieces: Vec<(Piece, i64)>,
    /// The KV budget as the formula computes it (negative: no room for the cache).
    pub kv_bytes: i64,
}

impl Bar {
    pub fn total(&self) -> i64 {
        self.pieces.iter().map(|p| p.1.max(0)).sum()
    }
}

/// A bar per formula, then the truth. `counted_twice` is the framework memory alive at t3
/// that was made in the passes (the lifetime view's kept bytes).
pub fn bars(r: &Report, counted_twice: u64) -> Vec<Bar> {
    let total = r.checkpoints.t0.total as i64;
    let w = r.weights_bytes as i64;
    let mut out: Vec<Bar> = r
        .formulas
        .iter()
        .map(|f| {
            let ceil = f.id.ceils_budget();
            let cap = budget(total as u64, r.settings.util, ceil);
            // v0.6.3 has no torch term: its free-memory drop holds the weights too.
            let (peak, non_torch) = if f.id == FormulaId::V0_6_3 {
                (0, f.non_torch_bytes - w)
            } else {
                (
                    f.torch_peak_bytes + f.weights_term_bytes - w,
                    f.non_torch_bytes,
                )
            };
            let twice = if f.id == FormulaId::Pr9352 {
                (counted_twice as i64).clamp(0, f.non_torch_bytes.max(0))
            } else {
                0
            };
            Bar {
                label: f.id.short().to_string(),
                colour: palette::formula(f.id),
                pieces: vec![
                    (Piece::Weights, w),
                    (Piece::Peak, peak),
                    (Piece::CountedTwice, twice),
                    (Piece::NonTorch, non_torch - twice),
                    (Piece::Kv, f.kv_bytes.max(0)),
                    (Piece::Headroom, total - cap),
                ],
                kv_bytes: f.kv_bytes,
            }
        })
        .collect();
    let cap = budget(total as u64, r.settings.util, false);
    let a_hat = r.checkpoints.t3.allocated_peak as i64;
    out.push(Bar {
        label: "truth".into(),
        colour: palette::TRUTH,
        pieces: vec![
            (Piece::Weights, w),
            (Piece::Peak, a_hat - w),
            (Piece::CountedTwice, 0),
            (Piece::NonTorch, r.truth.non_kv_bytes - a_hat),
            (Piece::Kv, r.truth.kv_bytes.max(0)),
            (Piece::Headroom, total - cap),
        ],
        kv_bytes: r.truth.kv_bytes,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bar_adds_up_to_the_device_and_only_the_old_formula_counts_twice() {
        let r = crate::profile::tiny_dry_report(64);
        let bars = bars(&r, 1 << 20);
        assert_eq!(bars.len(), r.formulas.len() + 1);
        let t = r.checkpoints.t0.total as i64;
        for b in &bars {
            if b.kv_bytes >= 0 {
                assert_eq!(b.total(), t, "{}", b.label);
            }
            let twice = b.pieces[2].1;
            if b.label == "#9352 old" {
                let old = r.formula(FormulaId::Pr9352).unwrap();
                assert_eq!(twice, (1i64 << 20).min(old.non_torch_bytes.max(0)));
            } else {
                assert_eq!(twice, 0, "{}", b.label);
            }
        }
        let truth = bars.last().unwrap();
        assert_eq!(truth.label, "truth");
        assert_eq!(truth.pieces[4].1, r.truth.kv_bytes.max(0));
    }
}

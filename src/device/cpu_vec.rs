//! Elementwise host math that the compiler vectorises: `exp` as a polynomial (Cephes' `expf`,
//! about 1 ulp) instead of libm's scalar call, and the loops built on it (SiLU, softmax rows,
//! RMSNorm rows). Each public function picks AVX-512 or AVX2 at run time where the CPU has it
//! and the portable build otherwise; all run the same IEEE operations (no fused multiply-add)
//! and reductions sum in the same fixed lanes, so a result does not depend on which one ran.

/// What both exponentials share: `e^xc = y · 2^n` for a clamped `xc`, with `n` as an integer
/// read from the low mantissa bits of the rounding sum (1.5·2^23 + n): `n as i32` would be a
/// saturating cast, which the compiler does not vectorise.
#[inline(always)]
fn exp_parts(xc: f32) -> (f32, i32) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * z + r + 1.0;
    let ni = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    (y, ni)
}

/// `e^x` for one lane; inlined into each caller's loop so the loop vectorises.
/// Range reduction `x = n·ln2 + r` with ln2 split in two (Cody-Waite), a degree-5 polynomial for
/// `e^r` on `[-ln2/2, ln2/2]`, then `2^n` through the exponent bits. Below −87.3 the result is
/// 0 (as `exp` underflows there), above 88.7 it is +∞, and NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_lane(x: f32) -> f32 {
    let xc = x.clamp(-87.33654, 88.72283);
    // n is within [-126, 128]: 2^n splits in two factors so n = 128 (x near 88.7) does not
    // overflow the exponent field before the multiply. (NaN gives garbage bits here; it is
    // returned below.)
    let (y, ni) = exp_parts(xc);
    let half = ni >> 1;
    let a = f32::from_bits((half.wrapping_add(127) as u32) << 23);
    let b = f32::from_bits((ni.wrapping_sub(half).wrapping_add(127) as u32) << 23);
    let e = y * a * b;
    if x < -87.33654 {
        0.0
    } else if x > 88.72283 {
        f32::INFINITY
    } else if x.is_nan() {
        x
    } else {
        e
    }
}

/// `exp_lane` for `x < 88` (or NaN; a softmax shifted by its max takes `x ≤ 0`): the same
/// operations and results, less the work only the top of the range needs (the upper clamp,
/// `+∞`, `2^n` in two factors), which made a block's exponentials a quarter faster.
#[inline(always)]
pub(crate) fn exp_lane_below_88(x: f32) -> f32 {
    // A NaN compares false here and stays NaN through the arithmetic below.
    let under = x < -87.33654;
    let xc = if under { -87.33654 } else { x };
    // n within [-126, 127]: one exponent field holds 2^n.
    let (y, ni) = exp_parts(xc);
    let e = y * f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    if under {
        0.0
    } else {
        e
    }
}

/// Generates the run-time dispatch: `$name` calls the AVX-512 build of `$body` when the CPU
/// has AVX-512F, else the AVX2 one when it has AVX2, else the portable one.
macro_rules! dispatch {
    ($(#[$doc:meta])* pub(crate) fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn imp($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F, checked on the line above.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, checked on the line above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            imp($($arg),*)
        }
    };
}

/// Lanes of the vectorised reductions: one AVX-512 register of f32 (two AVX2 ones). Element `i`
/// always goes to lane `i % LANES`, so every build adds in the same order.
const LANES: usize = 16;

dispatch! {
    /// `out = silu(gate) · up` (`x / (1 + e^−x) · up`).
    pub(crate) fn silu_mul_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
        for ((o, &g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp_lane(-g)) * u;
        }
    }
}

dispatch! {
    /// `x[i] = e^(x[i] − shift)` for `x[i] − shift < 88` (a softmax's shift is the max),
    /// returning `Σ x[i]` summed in `LANES` lanes (a softmax block: the exponentials and their
    /// sum in one pass over the row).
    pub(crate) fn exp_shifted_sum(x: &mut [f32], shift: f32) -> f32 {
        let mut acc = [0f32; LANES];
        let mut chunks = x.chunks_exact_mut(LANES);
        for c in &mut chunks {
            for (a, v) in acc.iter_mut().zip(c) {
                *v = exp_lane_below_88(*v - shift);
                *a += *v;
            }
        }
        for (a, v) in acc.iter_mut().zip(chunks.into_remainder()) {
            *v = exp_lane_below_88(*v - shift);
            *a += *v;
        }
        acc.iter().sum()
    }
}

dispatch! {
    /// The largest of `init` and `x` (NaNs ignored, as `f32::max` does); exact, whatever the
    /// order, so the lanes change nothing.
    pub(crate) fn max_from(x: &[f32], init: f32) -> f32 {
        let mut acc = [init; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for c in &mut chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a = a.max(v);
            }
        }
        for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
            *a = a.max(v);
        }
        acc.iter().copied().fold(init, f32::max)
    }
}

/// `Σ x[i]²` summed in `LANES` lanes.
#[inline(always)]
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += v * v;
    }
    acc.iter().sum()
}

/// One RMSNorm row: `out = x / √(mean(x²) + eps) · weight`.
#[inline(always)]
fn rms_norm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let inv = 1.0 / (sum_squares(x) / weight.len() as f32 + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * w;
    }
}

dispatch! {
    /// RMSNorm of every `weight.len()`-wide row of `x` into `out`.
    pub(crate) fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let cols = weight.len();
        for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
            rms_norm_row(row, weight, eps, o);
        }
    }
}

dispatch! {
    /// vLLM's `fused_add_rms_norm` row by row: `residual += x`, then `x = rms_norm(residual)`,
    /// each row finished while it is in L1.
    pub(crate) fn add_rms_norm_rows(x: &mut [f32], residual: &mut [f32], weight: &[f32], eps: f32) {
        let cols = weight.len();
        for (row, res) in x.chunks_exact_mut(cols).zip(residual.chunks_exact_mut(cols)) {
            for (r, v) in res.iter_mut().zip(row.iter()) {
                *r += v;
            }
            rms_norm_row(res, weight, eps, row);
        }
    }
}

dispatch! {
    /// `x += y`.
    pub(crate) fn add_assign(x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

dispatch! {
    /// `out[i] = e^(x[i] − max) · scale` (a softmax row once `scale` is 1 / sum).
    pub(crate) fn exp_scaled(x: &[f32], max: f32, scale: f32, out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = exp_lane(v - max) * scale;
        }
    }
}

/// `Σ e^(x[i] − max)` in f32, summed in 8 lanes so the loop vectorises (the order of the
/// additions differs from a left-to-right sum by a few ulp of the total).
pub(crate) fn exp_sum(x: &[f32], max: f32) -> f32 {
    let mut acc = [0f32; 8];
    exp_sum_lanes(x, max, &mut acc);
    acc.iter().sum()
}

dispatch! {
    /// Adds `e^(x[i] − max)` into lane `i % 8` of `acc`.
    pub(crate) fn exp_sum_lanes(x: &[f32], max: f32, acc: &mut [f32; 8]) {
        let mut chunks = x.chunks_exact(8);
        for c in &mut chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += exp_lane(v - max);
            }
        }
        for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
            *a += exp_lane(v - max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_libm_over_the_softmax_range() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp_lane(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max((got - want).abs() / want);
            x += 0.0137;
        }
        // f32's ulp is 2^-23 ≈ 1.19e-7 relative.
        assert!(worst < 2.5e-7, "worst relative error {worst:e}");
    }

    #[test]
    fn lane_max_is_the_sequential_max_and_lane_sum_the_sum() {
        let x: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.1)
            .collect();
        for len in [0, 1, 15, 16, 17, 1000] {
            let row = &x[..len];
            let want = row.iter().copied().fold(-3.0, f32::max);
            assert_eq!(max_from(row, -3.0), want);
            let mut e = row.to_vec();
            let sum = exp_shifted_sum(&mut e, 2.0);
            let want: f64 = row.iter().map(|v| (*v as f64 - 2.0).exp()).sum();
            assert!(
                (sum as f64 - want).abs() <= want * 1e-6,
                "{len}: {sum} vs {want}"
            );
            for (got, v) in e.iter().zip(row) {
                assert_eq!(*got, exp_lane(v - 2.0));
            }
        }
    }

    #[test]
    fn exp_below_88_is_bitwise_exp_lane() {
        let mut x = -90.0f32;
        while x < 88.0 {
            assert_eq!(exp_lane_below_88(x).to_bits(), exp_lane(x).to_bits(), "{x}");
            x += 0.00731;
        }
        for x in [
            0.0,
            -0.0,
            -87.33654,
            -87.3366,
            -1e-30,
            88.3,
            f32::NEG_INFINITY,
        ] {
            assert_eq!(exp_lane_below_88(x).to_bits(), exp_lane(x).to_bits(), "{x}");
        }
        assert!(exp_lane_below_88(f32::NAN).is_nan());
    }

    #[test]
    fn exp_edges_are_those_of_exp() {
        assert_eq!(exp_lane(0.0), 1.0);
        assert_eq!(exp_lane(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_lane(-200.0), 0.0);
        assert_eq!(exp_lane(f32::INFINITY), f32::INFINITY);
        assert!(exp_lane(f32::NAN).is_nan());
        let near_max = 88.7f32;
        assert!((exp_lane(near_max) as f64 / (near_max as f64).exp() - 1.0).abs() < 3e-7);
    }
}

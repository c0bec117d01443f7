//! Elementwise host math that the compiler vectorises: `exp` as a polynomial (Cephes' `expf`,
//! about 1 ulp) instead of libm's scalar call, and the loops built on it (SiLU, softmax rows).
//! Each public function picks AVX2 at run time where the CPU has it and the portable build
//! otherwise; both run the same IEEE operations (no fused multiply-add), so a result does not
//! depend on which one ran.

/// `e^x` for one lane; inlined into each caller's loop so the loop vectorises.
/// Range reduction `x = n·ln2 + r` with ln2 split in two (Cody-Waite), a degree-5 polynomial for
/// `e^r` on `[-ln2/2, ln2/2]`, then `2^n` through the exponent bits. Below −87.3 the result is
/// 0 (as `exp` underflows there), above 88.7 it is +∞, and NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_lane(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.33654, 88.72283);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * z + r + 1.0;
    // n is within [-126, 128]: 2^n splits in two factors so n = 128 (x near 88.7) does not
    // overflow the exponent field before the multiply.
    let ni = n as i32;
    let half = ni >> 1;
    let a = f32::from_bits(((half + 127) as u32) << 23);
    let b = f32::from_bits(((ni - half + 127) as u32) << 23);
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

/// Generates the run-time dispatch: `$name` calls the AVX2 build of `$body` when the CPU has
/// AVX2, else the portable one.
macro_rules! dispatch {
    ($(#[$doc:meta])* pub(crate) fn $name:ident($($arg:ident: $ty:ty),*) $body:block) => {
        $(#[$doc])*
        pub(crate) fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn imp($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) {
                    imp($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, checked on the line above.
                    unsafe { avx2($($arg),*) };
                    return;
                }
            }
            imp($($arg),*)
        }
    };
}

dispatch! {
    /// `x[i] = e^(x[i] − shift)`, returning nothing; the sum is taken by the caller's pass.
    pub(crate) fn exp_shifted(x: &mut [f32], shift: f32) {
        for v in x.iter_mut() {
            *v = exp_lane(*v - shift);
        }
    }
}

dispatch! {
    /// `gate = silu(gate) · up` in place (`x / (1 + e^−x) · up`).
    pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
        for (g, u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + exp_lane(-*g)) * u;
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

//! NF4 (QLoRA / bitsandbytes 4-bit): blocks of 64 weights share one absmax; each weight is the
//! index of the nearest of 16 normal-float levels, two per byte (first in the high nibble).
//! Nothing is kept between passes: each matmul dequantizes into a temporary.

/// bitsandbytes' NF4 code book (`get_4bit_type("nf4")`).
pub const NF4_LEVELS: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

pub const BLOCK: usize = 64;

/// Packed bytes and per-block absmax for `numel` weights.
pub fn packed_len(numel: usize) -> usize {
    numel.div_ceil(2)
}

pub fn absmax_len(numel: usize) -> usize {
    numel.div_ceil(BLOCK)
}

/// The 15 midpoints between neighbouring levels (computed in f64, as bitsandbytes' decision
/// tree compares against them).
const MIDPOINTS: [f32; 15] = {
    let mut m = [0f32; 15];
    let mut i = 0;
    while i < 15 {
        m[i] = ((NF4_LEVELS[i] as f64 + NF4_LEVELS[i + 1] as f64) / 2.0) as f32;
        i += 1;
    }
    m
};

/// The nearest level's index: how many midpoints lie below `x` (a tie goes to the lower
/// level; NaN gives 0). Branch-free, so it vectorises.
pub(crate) fn nearest(x: f32) -> u8 {
    MIDPOINTS.iter().map(|&m| u8::from(x > m)).sum()
}

/// bitsandbytes' `quantize_4bit` (NF4, blocks of 64): packed codes, high nibble first, and
/// each block's absmax. Spread over the cores in runs of whole blocks; the result does not
/// depend on the split.
pub fn quantize(w: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut absmax = vec![0f32; absmax_len(w.len())];
    let mut packed = vec![0u8; packed_len(w.len())];
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
    // Blocks per thread, at least 256 so small tensors stay on one thread.
    let per = absmax.len().div_ceil(threads).max(256);
    std::thread::scope(|s| {
        for ((w, packed), absmax) in w
            .chunks(per * BLOCK)
            .zip(packed.chunks_mut(per * BLOCK / 2))
            .zip(absmax.chunks_mut(per))
        {
            s.spawn(move || quantize_into(w, packed, absmax));
        }
    });
    (packed, absmax)
}

fn quantize_into(w: &[f32], packed: &mut [u8], absmax: &mut [f32]) {
    for (a, b) in absmax.iter_mut().zip(w.chunks(BLOCK)) {
        *a = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    }
    // BLOCK is even, so a block's codes fill whole bytes (the last block may end on a half).
    for ((b, p), &a) in w
        .chunks(BLOCK)
        .zip(packed.chunks_mut(BLOCK / 2))
        .zip(absmax.iter())
    {
        let code = |v: f32| if a > 0.0 { nearest(v / a) } else { 7 };
        for (pair, byte) in b.chunks(2).zip(p.iter_mut()) {
            *byte = code(pair[0]) << 4 | pair.get(1).map_or(0, |&v| code(v));
        }
    }
}

pub fn dequantize(packed: &[u8], absmax: &[f32], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        let byte = packed[i / 2];
        let q = if i % 2 == 0 { byte >> 4 } else { byte & 0x0f };
        *o = NF4_LEVELS[q as usize] * absmax[i / BLOCK];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn midpoint_codes_are_the_nearest_level() {
        let by_distance = |x: f32| {
            (0..16)
                .min_by(|&i, &j| {
                    (x - NF4_LEVELS[i])
                        .abs()
                        .total_cmp(&(x - NF4_LEVELS[j]).abs())
                })
                .unwrap() as u8
        };
        for k in -20_000..=20_000 {
            let x = k as f32 / 10_000.0;
            // Skip values within float noise of a midpoint, where either level is as near.
            if MIDPOINTS.iter().any(|&m| (x - m).abs() < 1e-6) {
                continue;
            }
            assert_eq!(nearest(x), by_distance(x), "{x}");
        }
        assert_eq!(nearest(-1.5), 0);
        assert_eq!(nearest(1.5), 15);
        assert_eq!(nearest(0.0), 7);
        assert_eq!(nearest(MIDPOINTS[7]), 7, "a tie goes to the lower level");
        assert_eq!(nearest(f32::NAN), 0);
    }

    #[test]
    fn the_parallel_split_gives_the_serial_result() {
        // 1000 blocks and an odd tail: several threads' runs and a ragged last block.
        let w: Vec<f32> = (0..64_037)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0)
            .collect();
        let (p, a) = quantize(&w);
        let mut sp = vec![0u8; packed_len(w.len())];
        let mut sa = vec![0f32; absmax_len(w.len())];
        quantize_into(&w, &mut sp, &mut sa);
        assert_eq!(p, sp);
        assert_eq!(a, sa);
        assert_eq!(a.len(), 1001);
    }

    #[test]
    fn round_trip_error_is_bounded_by_level_spacing() {
        let w: Vec<f32> = (0..200).map(|i| ((i as f32) * 0.37).sin() * 0.05).collect();
        let (p, a) = quantize(&w);
        assert_eq!(p.len(), 100);
        assert_eq!(a.len(), 4);
        let mut back = vec![0.0; w.len()];
        dequantize(&p, &a, &mut back);
        for (i, (x, y)) in w.iter().zip(&back).enumerate() {
            // the widest gap between NF4 levels is 0.304 (between 0.723 and 1.0 ... -1 and -0.696)
            assert!(
                (x - y).abs() <= 0.153 * a[i / BLOCK] + 1e-7,
                "{i}: {x} vs {y}"
            );
        }
        // block maxima are exact
        assert!(w.iter().zip(&back).any(|(x, y)| x == y && *x != 0.0));
    }
}

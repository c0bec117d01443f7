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

fn nearest(x: f32) -> u8 {
    let mut best = 0;
    let mut dist = f32::INFINITY;
    for (i, l) in NF4_LEVELS.iter().enumerate() {
        let d = (x - l).abs();
        if d < dist {
            dist = d;
            best = i;
        }
    }
    best as u8
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
    for (i, v) in w.iter().enumerate() {
        let a = absmax[i / BLOCK];
        let q = if a > 0.0 { nearest(v / a) } else { 7 };
        packed[i / 2] |= if i % 2 == 0 { q << 4 } else { q };
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

//! CPU kernels of Kimi-VL's MoonViT tower beyond the ones other towers share
//! (`engine::ops_kimi_vl`): the bicubic resize of the position grid, the 2D rotary on
//! interleaved pairs, and the 2 × 2 patch merge. fp32, as the other CPU kernels.

/// PyTorch's cubic convolution weights for an offset `t` in [0, 1) (`A = -0.75`,
/// `get_cubic_upsample_coefficients` in aten/src/ATen/native/UpSample.h).
fn cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// For each output index along one axis: the source taps (clamped to the input) and their
/// weights, `align_corners=False` with the scale `input / output` (`area_pixel_compute_source
/// _index`, cubic: no clamp of the source position below 0).
fn taps(input: usize, output: usize) -> Vec<([usize; 4], [f32; 4])> {
    let scale = input as f32 / output as f32;
    (0..output)
        .map(|o| {
            let real = scale * (o as f32 + 0.5) - 0.5;
            let floor = real.floor();
            let t = real - floor;
            let base = floor as i64;
            let idx = [-1i64, 0, 1, 2].map(|k| (base + k).clamp(0, input as i64 - 1) as usize);
            (idx, cubic_weights(t))
        })
        .collect()
}

/// `F.interpolate(weight.permute(2, 0, 1)[None], size=(h, w), mode="bicubic")` then
/// `.permute(1, 2, 0).flatten(end_dim=1)`: the `[h0, w0, d]` grid resized to `[h · w, d]`.
pub fn bicubic_resize(
    grid: &[f32],
    (h0, w0, d): (usize, usize, usize),
    (h, w): (usize, usize),
    out: &mut [f32],
) {
    let (ty, tx) = (taps(h0, h), taps(w0, w));
    // Along the width first for every source row, then along the height (PyTorch's order).
    let mut rows = vec![0.0f32; h0 * w * d];
    for y in 0..h0 {
        for (x, (idx, wt)) in tx.iter().enumerate() {
            let o = &mut rows[(y * w + x) * d..][..d];
            for (&i, &c) in idx.iter().zip(wt) {
                let src = &grid[(y * w0 + i) * d..][..d];
                for (a, b) in o.iter_mut().zip(src) {
                    *a += c * b;
                }
            }
        }
    }
    out.fill(0.0);
    for (y, (idx, wt)) in ty.iter().enumerate() {
        for x in 0..w {
            let o = &mut out[(y * w + x) * d..][..d];
            for (&i, &c) in idx.iter().zip(wt) {
                let src = &rows[(i * w + x) * d..][..d];
                for (a, b) in o.iter_mut().zip(src) {
                    *a += c * b;
                }
            }
        }
    }
}

/// `Rope2DPosEmb.precomputed_freqs_cis[:h, :w]` as angles `[h · w, head_dim / 2]`: pair `2i`
/// turns by the column times `θ^(-4i / head_dim)`, pair `2i + 1` by the row (moonvit.py 0.19
/// L217-244: `x_pos` is the flat index mod the width, concatenated first).
pub fn rope_2d_angles((h, w): (usize, usize), head_dim: usize, theta: f32, out: &mut [f32]) {
    let half = head_dim / 2;
    let freqs: Vec<f32> = (0..head_dim / 4)
        .map(|i| 1.0 / theta.powf((4 * i) as f32 / head_dim as f32))
        .collect();
    for r in 0..h {
        for c in 0..w {
            let o = &mut out[(r * w + c) * half..][..half];
            for (i, f) in freqs.iter().enumerate() {
                o[2 * i] = c as f32 * f;
                o[2 * i + 1] = r as f32 * f;
            }
        }
    }
}

/// `apply_rope` (moonvit.py 0.19 L76-96) on `x [L, heads · head_dim]`: each consecutive pair
/// `(x[2j], x[2j + 1])` read as a complex number times `cis(angles[t, j])`.
pub fn apply_rope_interleaved(
    x: &[f32],
    angles: &[f32],
    (heads, head_dim): (usize, usize),
    out: &mut [f32],
) {
    let half = head_dim / 2;
    let width = heads * head_dim;
    for (t, (row, o)) in x.chunks(width).zip(out.chunks_mut(width)).enumerate() {
        let a = &angles[t * half..][..half];
        for hd in 0..heads {
            for (j, &ang) in a.iter().enumerate() {
                let (s, c) = ang.sin_cos();
                let k = hd * head_dim + 2 * j;
                let (re, im) = (row[k], row[k + 1]);
                o[k] = re * c - im * s;
                o[k + 1] = re * s + im * c;
            }
        }
    }
}

/// `patch_merger` (moonvit.py 0.19 L504-530) on one image's `[h · w, d]` rows:
/// `view(h / kh, kh, w / kw, kw, d).permute(0, 2, 1, 3, 4).contiguous()`, so each merged token
/// holds its `kh × kw` patches row by row.
pub fn patch_merge(
    x: &[f32],
    (h, w, d): (usize, usize, usize),
    (kh, kw): (usize, usize),
    out: &mut [f32],
) {
    let (nh, nw) = (h / kh, w / kw);
    let mut at = 0;
    for bi in 0..nh {
        for bj in 0..nw {
            for ki in 0..kh {
                for kj in 0..kw {
                    let src = ((bi * kh + ki) * w + bj * kw + kj) * d;
                    out[at..at + d].copy_from_slice(&x[src..src + d]);
                    at += d;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resize_to_the_same_size_is_the_identity() {
        let grid: Vec<f32> = (0..3 * 4 * 2).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut out = vec![0.0; grid.len()];
        bicubic_resize(&grid, (3, 4, 2), (3, 4), &mut out);
        for (a, b) in out.iter().zip(&grid) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    /// Upsampling a 2-wide ramp 0, 1 to 4: the source positions -0.25, 0.25, 0.75, 1.25, the
    /// taps clamped at the edges, the cubic weights (-0.03515625, 0.26171875, 0.87890625,
    /// -0.10546875 for t = 0.75) overshooting at both ends as PyTorch's bicubic does.
    #[test]
    fn upsampling_a_ramp_overshoots_as_the_cubic_kernel_does() {
        let grid = [0.0f32, 1.0];
        let mut out = [0.0f32; 4];
        bicubic_resize(&grid, (1, 2, 1), (1, 4), &mut out);
        let want = [-0.10546875f64, 0.2265625, 0.7734375, 1.10546875];
        for (a, b) in out.iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn the_merge_groups_two_by_two_patches() {
        // A 2 × 4 grid of one value each: tokens (0, 1, 4, 5) and (2, 3, 6, 7).
        let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let mut out = vec![0.0; 8];
        patch_merge(&x, (2, 4, 1), (2, 2), &mut out);
        assert_eq!(out, [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
    }
}

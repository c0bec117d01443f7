//! CPU kernels of the Pixtral-HF vision tower and Mistral 3's projector (`engine::ops_pixtral`):
//! the 2D rotary embedding (transformers modeling_pixtral.py `PixtralRotaryEmbedding` and
//! `apply_rotary_pos_emb`), the patch merger's `unfold` and the exact (erf) GELU. fp32, as the
//! other CPU kernels.

/// `PixtralRotaryEmbedding`'s angles for the patch at `row`, `col`: `head_dim / 4` row
/// frequencies (`freqs[::2]`), then `head_dim / 4` column ones (`freqs[1::2]`), the whole
/// repeated once (`cat((inv_freq, inv_freq), -1)`), where `freqs[j] = θ^(-2j / head_dim)`.
pub fn rope_angles(row: usize, col: usize, head_dim: usize, theta: f64, out: &mut [f32]) {
    let half = head_dim / 2;
    let freq = |j: usize| -> f32 {
        // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in f32.
        let e = (2 * j) as f32 / head_dim as f32;
        1.0 / (theta as f32).powf(e)
    };
    for k in 0..half / 2 {
        out[k] = row as f32 * freq(2 * k);
        out[half / 2 + k] = col as f32 * freq(2 * k + 1);
    }
    out.copy_within(0..half, half);
}

/// `cos` and `sin` `[tokens, head_dim]` of `images` images of `side × side` patches, each
/// patch's position id `row · max_width + col` (`position_ids_in_meshgrid`).
pub fn rope_cos_sin(
    (images, side, head_dim): (usize, usize, usize),
    theta: f64,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    let mut a = vec![0.0f32; head_dim];
    for n in 0..images {
        for r in 0..side {
            for c in 0..side {
                rope_angles(r, c, head_dim, theta, &mut a);
                let t = (n * side + r) * side + c;
                for (j, &x) in a.iter().enumerate() {
                    cos[t * head_dim + j] = x.cos();
                    sin[t * head_dim + j] = x.sin();
                }
            }
        }
    }
}

/// `x · cos + rotate_half(x) · sin` per head, `rotate_half(x) = cat(-x[d/2:], x[:d/2])`, of
/// `x [tokens, heads · head_dim]` into `out` of the same shape.
pub fn apply_rope(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    (heads, head_dim): (usize, usize),
    out: &mut [f32],
) {
    let w = heads * head_dim;
    let half = head_dim / 2;
    for (t, (xr, or)) in x.chunks(w).zip(out.chunks_mut(w)).enumerate() {
        let (c, s) = (
            &cos[t * head_dim..(t + 1) * head_dim],
            &sin[t * head_dim..(t + 1) * head_dim],
        );
        for h in 0..heads {
            let xh = &xr[h * head_dim..(h + 1) * head_dim];
            let oh = &mut or[h * head_dim..(h + 1) * head_dim];
            for j in 0..head_dim {
                let rot = if j < half {
                    -xh[j + half]
                } else {
                    xh[j - half]
                };
                oh[j] = xh[j] * c[j] + rot * s[j];
            }
        }
    }
}

/// `Mistral3PatchMerger`'s reordering: each image's `[side², d]` patches viewed as `[d, side,
/// side]`, `unfold(kernel = stride = m)` into `[d · m², (side / m)²]`, transposed: merged
/// token `(ly, lx)` holds, for each channel `c`, then `ky`, then `kx`, patch `(m · ly + ky, m ·
/// lx + kx)`'s channel `c`.
pub fn patch_merge(x: &[f32], (images, side, d, m): (usize, usize, usize, usize), out: &mut [f32]) {
    let s = side / m;
    let w = d * m * m;
    for n in 0..images {
        for ly in 0..s {
            for lx in 0..s {
                let o = &mut out[((n * s + ly) * s + lx) * w..((n * s + ly) * s + lx + 1) * w];
                for c in 0..d {
                    for ky in 0..m {
                        for kx in 0..m {
                            let p = (n * side + m * ly + ky) * side + m * lx + kx;
                            o[(c * m + ky) * m + kx] = x[p * d + c];
                        }
                    }
                }
            }
        }
    }
}

/// erf to about 1e-7 (Abramowitz and Stegun 7.1.26 refined by one Newton step is not needed
/// at this tolerance): W. J. Cody's rational form would be exact; this one is within 1.5e-7.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    if x >= 0.0 {
        y
    } else {
        -y
    }
}

/// `nn.GELU()` (exact): `x · ½ · (1 + erf(x / √2))`.
pub fn gelu_erf(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        let v = v as f64;
        *o = (0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2))) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_angles_take_rows_from_even_and_columns_from_odd_frequencies() {
        // head_dim 8, θ 100: freqs = [1, 100^-1/4, 100^-1/2, 100^-3/4].
        let mut a = [0.0f32; 8];
        rope_angles(2, 3, 8, 100.0, &mut a);
        let f = |j: i32| 100f32.powf(-(j as f32) / 4.0);
        let want = [2.0 * f(0), 2.0 * f(2), 3.0 * f(1), 3.0 * f(3)];
        for k in 0..4 {
            assert!((a[k] - want[k]).abs() < 1e-6 && (a[k + 4] - want[k]).abs() < 1e-6);
        }
    }

    #[test]
    fn the_merger_gathers_each_two_by_two_block_channel_first() {
        // One image of 2 × 2 patches of 2 channels: patch p channel c holds 10p + c.
        let x: Vec<f32> = (0..4)
            .flat_map(|p| [10.0 * p as f32, 10.0 * p as f32 + 1.0])
            .collect();
        let mut out = [0.0f32; 8];
        patch_merge(&x, (1, 2, 2, 2), &mut out);
        assert_eq!(out, [0.0, 10.0, 20.0, 30.0, 1.0, 11.0, 21.0, 31.0]);
    }

    #[test]
    fn gelu_is_the_erf_form() {
        let mut o = [0.0f32; 3];
        gelu_erf(&[0.0, 1.0, -1.0], &mut o);
        assert!(o[0].abs() < 1e-7);
        assert!((o[1] - 0.841_344_7).abs() < 1e-6, "{}", o[1]);
        assert!((o[2] + 0.158_655_3).abs() < 1e-6, "{}", o[2]);
    }
}

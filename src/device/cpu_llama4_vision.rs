//! CPU kernels of Llama 4's vision tower (`engine::ops_llama4_vision`): the unfold of the
//! patch embedding, the class token's `cat`, the positional embedding's broadcast add, the 2D
//! vision rotary and the pixel shuffle's permutes. fp32, as the other CPU kernels; the
//! LayerNorm, GELU, attention and linears are the other families'.

/// `nn.Unfold(kernel_size=p, stride=p)` over `images` images `[C, S, S]`: `[images, C · p²,
/// g²]`, column `(c · p + py) · p + px` of patch `gy · g + gx` holding pixel `(c, gy · p + py,
/// gx · p + px)` (im2col's order, the `[D, C, p, p]` weight's flattened order).
pub fn unfold(
    pixels: &[f32],
    (images, channels, size, patch): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    let g = size / patch;
    let (k, l) = (channels * patch * patch, g * g);
    for n in 0..images {
        let img = &pixels[n * channels * size * size..(n + 1) * channels * size * size];
        for c in 0..channels {
            for py in 0..patch {
                for px in 0..patch {
                    let row = (c * patch + py) * patch + px;
                    for gy in 0..g {
                        for gx in 0..g {
                            out[(n * k + row) * l + gy * g + gx] =
                                img[(c * size + gy * patch + py) * size + gx * patch + px];
                        }
                    }
                }
            }
        }
    }
}

/// `torch.cat([patches, class_embedding.expand(N, 1, D)], dim=1)`: each image's `l` patch
/// rows `[l, D]`, then the class row.
pub fn cat_class(patches: &[f32], class: &[f32], (images, l): (usize, usize), out: &mut [f32]) {
    let d = class.len();
    for n in 0..images {
        let o = &mut out[n * (l + 1) * d..(n + 1) * (l + 1) * d];
        o[..l * d].copy_from_slice(&patches[n * l * d..(n + 1) * l * d]);
        o[l * d..].copy_from_slice(class);
    }
}

/// `x + positional_embedding`, the `[seq, D]` table broadcast over each image of `x`.
pub fn add_broadcast(x: &[f32], table: &[f32], out: &mut [f32]) {
    for (o, xs) in out.chunks_mut(table.len()).zip(x.chunks(table.len())) {
        for ((o, a), b) in o.iter_mut().zip(xs).zip(table) {
            *o = a + b;
        }
    }
}

/// The angles of `Llama4VisionRotaryEmbedding._compute_cos_sin_cache` (vLLM 0.19
/// rotary_embedding/llama4_vision_rope.py L30-53), `[g² + 1, head_dim / 2]` as `(cos, sin)`:
/// position `i < g²` is patch `(x, y) = (i % g, i / g)`; complex pair `j` of a head turns by
/// `(x + 1) · θ^(-4j / head_dim)` for `j < head_dim / 4` and by `(y + 1) · θ^(-4(j −
/// head_dim/4) / head_dim)` after; the class token (last) does not turn.
pub fn rope_angles(g: usize, head_dim: usize, theta: f64) -> Vec<(f32, f32)> {
    let quarter = head_dim / 4;
    let rotary_dim = head_dim / 2;
    let inv: Vec<f64> = (0..quarter)
        .map(|j| 1.0 / theta.powf((2 * j) as f64 / rotary_dim as f64))
        .collect();
    let mut out = Vec::with_capacity((g * g + 1) * 2 * quarter);
    for i in 0..=g * g {
        for j in 0..2 * quarter {
            let a = if i == g * g {
                0.0
            } else if j < quarter {
                ((i % g) + 1) as f64 * inv[j]
            } else {
                ((i / g) + 1) as f64 * inv[j - quarter]
            };
            out.push((a.cos() as f32, a.sin() as f32));
        }
    }
    out
}

/// `view_as_real(view_as_complex(x.float().reshape(..., -1, 2)) · freqs_ci)` on `x [images ·
/// seq, heads · head_dim]`: each head's consecutive pairs `(a, b)` turned by the position's
/// angle, `(a cos − b sin, a sin + b cos)`.
pub fn rope_apply(
    x: &[f32],
    angles: &[(f32, f32)],
    (seq, heads, head_dim): (usize, usize, usize),
    out: &mut [f32],
) {
    let half = head_dim / 2;
    for (t, (row, o)) in x
        .chunks(heads * head_dim)
        .zip(out.chunks_mut(heads * head_dim))
        .enumerate()
    {
        let ang = &angles[(t % seq) * half..(t % seq + 1) * half];
        for h in 0..heads {
            for (j, &(c, s)) in ang.iter().enumerate() {
                let i = h * head_dim + 2 * j;
                let (a, b) = (row[i], row[i + 1]);
                o[i] = a * c - b * s;
                o[i + 1] = a * s + b * c;
            }
        }
    }
}

/// `x.permute(0, 2, 1, 3).contiguous()` of `[n, d1, d2, d3]` whose `n` blocks lie `stride`
/// values apart (the encoder's output read without its class rows: `hidden_state[:, :-1, :]`
/// is a view): `[n, d2, d1, d3]`.
pub fn permute_0213(
    x: &[f32],
    stride: usize,
    (n, d1, d2, d3): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    for b in 0..n {
        let src = &x[b * stride..];
        let dst = &mut out[b * d1 * d2 * d3..(b + 1) * d1 * d2 * d3];
        for i in 0..d1 {
            for j in 0..d2 {
                dst[(j * d1 + i) * d3..(j * d1 + i + 1) * d3]
                    .copy_from_slice(&src[(i * d2 + j) * d3..(i * d2 + j + 1) * d3]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pixel shuffle (two permutes) merges each 2 × 2 block of patches into one token:
    /// token `(j, i)` holds patch rows `2j`, `2j + 1` and columns `2i`, `2i + 1` as
    /// `[(2j, 2i), (2j, 2i+1), (2j+1, 2i), (2j+1, 2i+1)]` (mllama4.py 0.19 L180-202).
    #[test]
    fn the_pixel_shuffle_merges_two_by_two_blocks() {
        // One image of 4 × 4 patches of width 1, patch (y, x) holding 10y + x.
        let (g, s, c) = (4, 2, 1);
        let x: Vec<f32> = (0..16).map(|i| (10 * (i / 4) + i % 4) as f32).collect();
        let mut a = vec![0.0; 16];
        permute_0213(&x, 16, (1, g, g / s, s * c), &mut a);
        let mut out = vec![0.0; 16];
        permute_0213(&a, 16, (1, g / s, g / s, s * s * c), &mut out);
        assert_eq!(&out[..4], &[0.0, 1.0, 10.0, 11.0]);
        assert_eq!(&out[4..8], &[2.0, 3.0, 12.0, 13.0]);
        assert_eq!(&out[8..12], &[20.0, 21.0, 30.0, 31.0]);
    }

    #[test]
    fn the_class_token_does_not_turn_and_patches_turn_by_x_then_y() {
        // g = 2, head_dim 8: pairs 0-1 by x + 1, pairs 2-3 by y + 1; θ^(-4j/8).
        let a = rope_angles(2, 8, 100.0);
        assert_eq!(a.len(), 5 * 4);
        let angle = |i: usize, j: usize| a[i * 4 + j].1.atan2(a[i * 4 + j].0);
        // Patch 3 is (x, y) = (1, 1): pair 0 turns by 2, pair 1 by 2 / 10.
        assert!((angle(3, 0) - 2.0).abs() < 1e-5);
        assert!((angle(3, 1) - 0.2).abs() < 1e-6);
        // Patch 1 is (1, 0): pair 2 turns by 1 (y + 1), pair 3 by 0.1.
        assert!((angle(1, 2) - 1.0).abs() < 1e-6 && (angle(1, 3) - 0.1).abs() < 1e-6);
        assert!(a[16..].iter().all(|&(c, s)| c == 1.0 && s == 0.0));
    }
}

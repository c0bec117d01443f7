//! CPU kernels of the SigLIP vision tower and Gemma 3's projector (`engine::ops_siglip`): the
//! patch embedding as a convolution of stride = kernel, full (bidirectional) attention within
//! each image, the projector's average pool, its transposed Gemma RMSNorm and its `[D, H]`
//! matmul. fp32 throughout, as the other CPU kernels.

/// `nn.Conv2d(C, D, p, stride=p)` over `images` images `[C, S, S]` (row-major), written as
/// `[images, patches, D]` (the `flatten(2).transpose(1, 2)` the embeddings take): patch
/// `(gy, gx)` is row `gy · g + gx`. `w` is `[D, C, p, p]`, `b` `[D]`.
pub fn patch_embed(
    pixels: &[f32],
    w: &[f32],
    b: &[f32],
    (images, channels, size, patch): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    let g = size / patch;
    let d = b.len();
    let k = channels * patch * patch;
    let mut col = vec![0.0f32; k];
    for n in 0..images {
        let img = &pixels[n * channels * size * size..(n + 1) * channels * size * size];
        for gy in 0..g {
            for gx in 0..g {
                for c in 0..channels {
                    for py in 0..patch {
                        let row = (c * size + gy * patch + py) * size + gx * patch;
                        col[(c * patch + py) * patch..(c * patch + py + 1) * patch]
                            .copy_from_slice(&img[row..row + patch]);
                    }
                }
                let o = &mut out[((n * g + gy) * g + gx) * d..((n * g + gy) * g + gx + 1) * d];
                for (j, oj) in o.iter_mut().enumerate() {
                    let wr = &w[j * k..(j + 1) * k];
                    *oj = b[j] + wr.iter().zip(&col).map(|(a, x)| a * x).sum::<f32>();
                }
            }
        }
    }
}

/// Softmax attention without a mask within each of `images` sequences of `seq` tokens.
/// `q`, `k` and `v` are each `[images · seq, heads · head_dim]` (a fused projection's parts,
/// each head's columns together, as `view(b, s, heads, head_dim)` reads them); `out` is
/// `[images · seq, heads · head_dim]`.
pub fn vit_attention(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (images, seq, heads, head_dim): (usize, usize, usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    let w = heads * head_dim;
    let mut scores = vec![0.0f32; seq];
    for n in 0..images {
        for h in 0..heads {
            for i in 0..seq {
                let qi = (n * seq + i) * w + h * head_dim;
                let qr = &q[qi..qi + head_dim];
                let mut max = f32::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    let kj = (n * seq + j) * w + h * head_dim;
                    *s = qr
                        .iter()
                        .zip(&k[kj..kj + head_dim])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * scale;
                    max = max.max(*s);
                }
                let mut sum = 0.0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let oi = (n * seq + i) * w + h * head_dim;
                let o = &mut out[oi..oi + head_dim];
                o.fill(0.0);
                for (j, s) in scores.iter().enumerate() {
                    let vj = (n * seq + j) * w + h * head_dim;
                    let p = s / sum;
                    for (ov, vv) in o.iter_mut().zip(&v[vj..vj + head_dim]) {
                        *ov += p * vv;
                    }
                }
            }
        }
    }
}

/// `x.transpose(1, 2)` of `[images, rows, cols]` into `[images, cols, rows]`.
pub fn transpose_12(x: &[f32], (images, rows, cols): (usize, usize, usize), out: &mut [f32]) {
    for n in 0..images {
        for r in 0..rows {
            for c in 0..cols {
                out[(n * cols + c) * rows + r] = x[(n * rows + r) * cols + c];
            }
        }
    }
}

/// `nn.AvgPool2d(k, stride=k)` over `[planes, side, side]` into `[planes, side/k, side/k]`.
pub fn avg_pool(x: &[f32], (planes, side, k): (usize, usize, usize), out: &mut [f32]) {
    let o = side / k;
    let inv = 1.0 / (k * k) as f32;
    for p in 0..planes {
        for oy in 0..o {
            for ox in 0..o {
                let mut s = 0.0f32;
                for y in 0..k {
                    for xx in 0..k {
                        s += x[(p * side + oy * k + y) * side + ox * k + xx];
                    }
                }
                out[(p * o + oy) * o + ox] = s * inv;
            }
        }
    }
}

/// Gemma's RMSNorm (`x / rms(x) · (1 + w)`, in fp32) of the rows of `x` read transposed:
/// `x` is `[images, dim, tokens]`, `out` `[images, tokens, dim]`.
pub fn gemma_rms_norm_transposed(
    x: &[f32],
    w: &[f32],
    eps: f32,
    (images, dim, tokens): (usize, usize, usize),
    out: &mut [f32],
) {
    for n in 0..images {
        for t in 0..tokens {
            let at = |c: usize| x[(n * dim + c) * tokens + t];
            let ms = (0..dim).map(|c| at(c) * at(c)).sum::<f32>() / dim as f32;
            let r = 1.0 / (ms + eps).sqrt();
            let o = &mut out[(n * tokens + t) * dim..(n * tokens + t + 1) * dim];
            for (c, oc) in o.iter_mut().enumerate() {
                *oc = at(c) * r * (1.0 + w[c]);
            }
        }
    }
}

/// `x [m, k] @ w [k, n]` (the projector's weight is stored input-major).
pub fn matmul_nn(x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize), out: &mut [f32]) {
    for i in 0..m {
        let o = &mut out[i * n..(i + 1) * n];
        o.fill(0.0);
        for (kk, &a) in x[i * k..(i + 1) * k].iter().enumerate() {
            for (ov, wv) in o.iter_mut().zip(&w[kk * n..(kk + 1) * n]) {
                *ov += a * wv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_is_the_dot_product_of_its_pixels_with_the_kernel() {
        // One 1-channel 4x4 image, patches of 2: patch (1, 0) holds pixels 8, 9, 12, 13.
        let pixels: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let w = [1.0, 0.0, 0.0, 1.0]; // one output channel: top-left + bottom-right
        let mut out = [0.0f32; 4];
        patch_embed(&pixels, &w, &[0.5], (1, 1, 4, 2), &mut out);
        assert_eq!(out, [0.5 + 5.0, 0.5 + 9.0, 0.5 + 21.0, 0.5 + 25.0]);
    }

    #[test]
    fn attention_of_identical_keys_averages_the_values() {
        // 1 image of 2 tokens, 1 head of 1: equal keys → both rows get the mean of v.
        let (q, k, v) = ([1.0, 3.0], [1.0, 1.0], [2.0, 6.0]);
        let mut out = [0.0f32; 2];
        vit_attention((&q, &k, &v), (1, 2, 1, 1), 1.0, &mut out);
        assert!((out[0] - 4.0).abs() < 1e-6 && (out[1] - 4.0).abs() < 1e-6);
    }

    #[test]
    fn the_pool_averages_each_block() {
        let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let mut out = [0.0f32; 4];
        avg_pool(&x, (1, 4, 2), &mut out);
        assert_eq!(out, [2.5, 4.5, 10.5, 12.5]);
    }
}

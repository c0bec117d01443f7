//! CPU kernels of Qwen2.5-VL's vision tower (`engine::ops_qwen2_5_vl`): the window index and
//! its `cu_seqlens`, the 2-D rotary tables, the rotary embedding on q and k, the
//! variable-length attention over those sequences, the row gathers by index and the patch
//! embedding as one matmul (vLLM's `Conv3dLayer._forward_mulmat`, conv.py 0.19 L219-233).
//! fp32, as the other CPU kernels; the reference is transformers' `Qwen2_5_VisionTransformer`
//! (scripts/qwen2_5_vl_reference.py).

/// One image's window index as `get_window_index_thw` cuts it (vLLM qwen2_5_vl.py 0.19
/// L696-732; transformers' `get_window_index`): the merged-token grid `(t, h / m, w / m)`
/// padded at the bottom and right by `ws - n % ws` (a whole empty window when `n` divides),
/// cut into `ws × ws` windows, row-major within a frame; returns the merged tokens in window
/// order and each window's patches (`seqlens · m²`), the empty windows left out (what
/// `unique_consecutive` of the cumulative sums drops).
pub fn window_index(
    (t, h, w): (usize, usize, usize),
    m: usize,
    ws: usize,
) -> (Vec<usize>, Vec<usize>) {
    let (lh, lw) = (h / m, w / m);
    let (nh, nw) = ((lh + ws - lh % ws) / ws, (lw + ws - lw % ws) / ws);
    let mut index = Vec::with_capacity(t * lh * lw);
    let mut lens = Vec::new();
    for f in 0..t {
        for wy in 0..nh {
            for wx in 0..nw {
                let before = index.len();
                for y in wy * ws..((wy + 1) * ws).min(lh) {
                    for x in wx * ws..((wx + 1) * ws).min(lw) {
                        index.push((f * lh + y) * lw + x);
                    }
                }
                let n = index.len() - before;
                if n > 0 {
                    lens.push(n * m * m);
                }
            }
        }
    }
    (index, lens)
}

/// The 2-D rotary angles of one image's patches in the processor's order (2 × 2 blocks of
/// patches contiguous: `rotary_pos_emb_thw`'s `hpos_ids` / `wpos_ids` reshaped by
/// `spatial_merge_size` and permuted, repeated for each of the `t` frames), each row
/// `rot / 2` row angles then `rot / 2` column angles, `rot = head_dim / 2` and frequency `j`
/// `θ^(-2j / rot)` (`get_rope(head_size, partial_rotary_factor=0.5)`'s `cos_sin_cache`,
/// rotary_embedding/base.py 0.19 L69-92; transformers' `Qwen2_5_VisionRotaryEmbedding(head_dim
/// / 2)`). `out` holds `t · h · w` rows of `rot`.
pub fn rotary_angles(
    (t, h, w): (usize, usize, usize),
    m: usize,
    rot: usize,
    theta: f64,
    out: &mut [f32],
) {
    let half = rot / 2;
    let freq: Vec<f32> = (0..half)
        .map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / rot as f32))
        .collect();
    let mut at = 0;
    for _ in 0..t {
        for by in 0..h / m {
            for bx in 0..w / m {
                for iy in 0..m {
                    for ix in 0..m {
                        let (y, x) = ((by * m + iy) as f32, (bx * m + ix) as f32);
                        let row = &mut out[at * rot..(at + 1) * rot];
                        for j in 0..half {
                            row[j] = y * freq[j];
                            row[half + j] = x * freq[j];
                        }
                        at += 1;
                    }
                }
            }
        }
    }
}

/// Rows of `x` (each `unit · cols` wide: a merged token's `unit` patches) in the order of
/// `index`: `x.reshape(n, unit, -1)[index].reshape(...)`.
pub fn gather_groups(x: &[f32], index: &[usize], group: usize, out: &mut [f32]) {
    for (o, &i) in out.chunks_mut(group).zip(index) {
        o.copy_from_slice(&x[i * group..(i + 1) * group]);
    }
}

/// The Neox-style rotary embedding over the whole head (`ApplyRotaryEmb`, rotary width
/// `head_dim` from `head_dim / 2` angles): `o[j] = x[j]·cos[j] − x[j + d/2]·sin[j]`,
/// `o[j + d/2] = x[j + d/2]·cos[j] + x[j]·sin[j]`, of `x [tokens, heads · head_dim]` with
/// `cos`, `sin` `[tokens, head_dim / 2]`.
pub fn apply_rope_neox(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    (heads, head_dim): (usize, usize),
    out: &mut [f32],
) {
    let half = head_dim / 2;
    let w = heads * head_dim;
    for (t, (xr, or)) in x.chunks(w).zip(out.chunks_mut(w)).enumerate() {
        let (c, s) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for h in 0..heads {
            let xh = &xr[h * head_dim..(h + 1) * head_dim];
            let oh = &mut or[h * head_dim..(h + 1) * head_dim];
            for j in 0..half {
                let (a, b) = (xh[j], xh[j + half]);
                oh[j] = a * c[j] - b * s[j];
                oh[j + half] = b * c[j] + a * s[j];
            }
        }
    }
}

/// Attention within each sequence `cu[i]..cu[i + 1]` (FlashAttention's varlen call, not
/// causal) of `q`, `k`, `v` `[tokens, heads · head_dim]` into `out` of the same shape.
pub fn varlen_attention(
    (q, k, v): (&[f32], &[f32], &[f32]),
    cu: &[usize],
    (heads, head_dim): (usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    let w = heads * head_dim;
    let mut scores = Vec::new();
    for s in cu.windows(2) {
        let (a, b) = (s[0], s[1]);
        scores.resize(b - a, 0.0f32);
        for h in 0..heads {
            for i in a..b {
                let qr = &q[i * w + h * head_dim..i * w + (h + 1) * head_dim];
                let mut max = f32::NEG_INFINITY;
                for (j, sc) in (a..b).zip(scores.iter_mut()) {
                    let kr = &k[j * w + h * head_dim..j * w + (h + 1) * head_dim];
                    *sc = qr.iter().zip(kr).map(|(x, y)| x * y).sum::<f32>() * scale;
                    max = max.max(*sc);
                }
                let mut sum = 0.0f32;
                for sc in scores.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                let o = &mut out[i * w + h * head_dim..i * w + (h + 1) * head_dim];
                o.fill(0.0);
                for (j, sc) in (a..b).zip(&scores) {
                    let p = sc / sum;
                    let vr = &v[j * w + h * head_dim..j * w + (h + 1) * head_dim];
                    for (x, y) in o.iter_mut().zip(vr) {
                        *x += p * y;
                    }
                }
            }
        }
    }
}

/// `F.linear(x, w)` without a bias: `x [m, k]` times `w [n, k]`ᵀ into `out [m, n]` (the patch
/// embedding's `[L, C·T·p·p]` rows and the `[D, C·T·p·p]` view of the Conv3d weight).
pub fn linear_nt(x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize), out: &mut [f32]) {
    for r in 0..m {
        let xr = &x[r * k..(r + 1) * k];
        for c in 0..n {
            out[r * n + c] = xr
                .iter()
                .zip(&w[c * k..(c + 1) * k])
                .map(|(a, b)| a * b)
                .sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 7B's dummy image: 128 × 128 merged tokens in 4 × 4 windows, the padding's 33rd
    /// row and column of windows empty and dropped: 1024 windows of 64 patches.
    #[test]
    fn the_dummy_image_cuts_into_1024_windows() {
        let (index, lens) = window_index((1, 256, 256), 2, 4);
        assert_eq!(index.len(), 16384);
        assert_eq!(lens.len(), 1024);
        assert!(lens.iter().all(|&n| n == 64));
        // The first window: merged rows 0..4, columns 0..4.
        assert_eq!(&index[..5], &[0, 1, 2, 3, 128]);
    }

    /// A 3 × 5 merged grid in 2 × 2 windows: padded to 4 × 6, six windows of 4, 4, 2, 2, 2,
    /// 1 merged tokens; two frames repeat it.
    #[test]
    fn a_grid_that_does_not_divide_has_short_windows() {
        let (index, lens) = window_index((1, 6, 10), 2, 2);
        assert_eq!(lens, vec![16, 16, 8, 8, 8, 4]);
        assert_eq!(
            index,
            vec![0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14]
        );
        let (index, lens) = window_index((2, 4, 6), 2, 2);
        assert_eq!(lens, vec![16, 8, 16, 8]);
        assert_eq!(&index[6..], &[6, 7, 9, 10, 8, 11]);
    }

    #[test]
    fn angles_follow_the_merge_blocks() {
        // 2 × 4 patches in 2 × 2 blocks: block 0 holds (0,0) (0,1) (1,0) (1,1), block 1
        // (0,2) (0,3) (1,2) (1,3). rot 4: freqs 1 and θ^-1/2.
        let mut a = vec![0.0f32; 8 * 4];
        rotary_angles((1, 2, 4), 2, 4, 100.0, &mut a);
        let rows: Vec<(f32, f32)> = a.chunks(4).map(|r| (r[0], r[2])).collect();
        assert_eq!(
            rows,
            vec![
                (0., 0.),
                (0., 1.),
                (1., 0.),
                (1., 1.),
                (0., 2.),
                (0., 3.),
                (1., 2.),
                (1., 3.)
            ]
        );
        assert!((a[4 * 7 + 1] - 0.1).abs() < 1e-7 && (a[4 * 7 + 3] - 0.3).abs() < 1e-6);
    }
}

//! The sampler's kernels in compute mode: real math on the host over `[rows, cols]` row-major
//! f32 tensors, the same steps PyTorch runs for vLLM's sampler (see `model::sampler`).
//! Index tensors are int64 on a GPU; the host keeps them as i32 (a row of a vocabulary fits).

/// The counter-based uniform draw that both the CPU and the CUDA `exponential_` use, so a
/// seed gives the same samples on every backend: splitmix64 of (seed, element index), the top
/// 24 bits as a value in (0, 1].
pub fn uniform_open0(seed: u64, index: u64) -> f32 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z >> 40) as f32 + 1.0) / 16_777_216.0
}

/// `logits[..., :cols]` of a `[rows, src_cols]` tensor, made contiguous (`.to(torch.float)` of
/// the vocabulary-padding view).
pub fn narrow_cols(src: &[f32], src_cols: usize, cols: usize, out: &mut [f32]) {
    for (o, s) in out.chunks_exact_mut(cols).zip(src.chunks_exact(src_cols)) {
        o.copy_from_slice(&s[..cols]);
    }
}

/// `x.div_(t.unsqueeze(1))`: each row divided by its value.
pub fn div_rows(x: &mut [f32], cols: usize, t: &[f32]) {
    for (row, &d) in x.chunks_exact_mut(cols).zip(t) {
        for v in row {
            *v /= d;
        }
    }
}

/// `x.sort(dim=-1)` ascending and stable (ties keep their order), values and indices.
pub fn sort_rows(x: &[f32], cols: usize, values: &mut [f32], indices: &mut [i32]) {
    let mut order: Vec<u32> = Vec::with_capacity(cols);
    for ((row, vals), idx) in x
        .chunks_exact(cols)
        .zip(values.chunks_exact_mut(cols))
        .zip(indices.chunks_exact_mut(cols))
    {
        order.clear();
        order.extend(0..cols as u32);
        order.sort_by(|&a, &b| row[a as usize].total_cmp(&row[b as usize]));
        for ((v, i), &o) in vals.iter_mut().zip(idx.iter_mut()).zip(&order) {
            *v = row[o as usize];
            *i = o as i32;
        }
    }
}

/// `x.gather(1, col.unsqueeze(1))`: one value per row.
pub fn gather_cols(x: &[f32], cols: usize, col: &[i32], out: &mut [f32]) {
    for ((o, row), &c) in out.iter_mut().zip(x.chunks_exact(cols)).zip(col) {
        *o = row[c as usize];
    }
}

/// `x < t.unsqueeze(1)` (or `<=` when `or_equal`), as a bool mask.
pub fn compare_rows(x: &[f32], cols: usize, t: &[f32], or_equal: bool, mask: &mut [u8]) {
    for ((row, m), &th) in x.chunks_exact(cols).zip(mask.chunks_exact_mut(cols)).zip(t) {
        for (m, &v) in m.iter_mut().zip(row) {
            *m = u8::from(if or_equal { v <= th } else { v < th });
        }
    }
}

/// `x.masked_fill_(mask, value)`.
pub fn masked_fill(x: &mut [f32], mask: &[u8], value: f32) {
    for (v, &m) in x.iter_mut().zip(mask) {
        if m != 0 {
            *v = value;
        }
    }
}

/// Row softmax (`log` = log_softmax), in f32 with the row max subtracted first.
pub fn softmax_rows(x: &[f32], cols: usize, out: &mut [f32], log: bool) {
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            o.fill(if log { f32::NEG_INFINITY } else { f32::NAN });
            continue;
        }
        let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
        if log {
            let ls = sum.ln();
            for (o, &v) in o.iter_mut().zip(row) {
                *o = v - max - ls;
            }
        } else {
            let inv = 1.0 / sum;
            for (o, &v) in o.iter_mut().zip(row) {
                *o = (v - max).exp() * inv;
            }
        }
    }
}

/// `x.cumsum(-1)`.
pub fn cumsum_rows(x: &[f32], cols: usize, out: &mut [f32]) {
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let mut acc = 0f32;
        for (o, &v) in o.iter_mut().zip(row) {
            acc += v;
            *o = acc;
        }
    }
}

/// `torch.empty_like(src).scatter_(-1, index, src)`: each row's values back to their columns.
pub fn scatter_rows(src: &[f32], index: &[i32], cols: usize, out: &mut [f32]) {
    for ((s, i), o) in src
        .chunks_exact(cols)
        .zip(index.chunks_exact(cols))
        .zip(out.chunks_exact_mut(cols))
    {
        for (&v, &c) in s.iter().zip(i) {
            o[c as usize] = v;
        }
    }
}

/// `src[rows]` (advanced indexing: a copy of the chosen rows).
pub fn index_rows(src: &[f32], cols: usize, rows: &[i32], out: &mut [f32]) {
    for (o, &r) in out.chunks_exact_mut(cols).zip(rows) {
        let r = r as usize;
        o.copy_from_slice(&src[r * cols..(r + 1) * cols]);
    }
}

/// `q.exponential_()` with the shared counter-based draw: −ln(u), u in (0, 1].
pub fn exponential(q: &mut [f32], seed: u64) {
    for (i, v) in q.iter_mut().enumerate() {
        *v = -uniform_open0(seed, i as u64).ln();
    }
}

/// `x.div_(q)`.
pub fn div_assign(x: &mut [f32], q: &[f32]) {
    for (v, &d) in x.iter_mut().zip(q) {
        *v /= d;
    }
}

/// `x.argmax(dim=1)`: the first index of each row's maximum.
pub fn argmax_rows(x: &[f32], cols: usize, out: &mut [i32]) {
    for (o, row) in out.iter_mut().zip(x.chunks_exact(cols)) {
        let mut best = 0usize;
        for (i, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = i;
            }
        }
        *o = best as i32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_is_ascending_and_stable_with_indices() {
        let x = [3.0, 1.0, 2.0, 1.0, f32::NEG_INFINITY, 0.5];
        let (mut v, mut i) = ([0f32; 6], [0i32; 6]);
        sort_rows(&x, 3, &mut v, &mut i);
        assert_eq!(v, [1.0, 2.0, 3.0, f32::NEG_INFINITY, 0.5, 1.0]);
        assert_eq!(i, [1, 2, 0, 1, 2, 0]);
        let mut back = [0f32; 6];
        scatter_rows(&v, &i, 3, &mut back);
        assert_eq!(back, x);
    }

    #[test]
    fn softmax_and_log_softmax_agree() {
        let x = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
        let (mut p, mut lp) = ([0f32; 4], [0f32; 4]);
        softmax_rows(&x, 4, &mut p, false);
        softmax_rows(&x, 4, &mut lp, true);
        let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
        let s: f64 = e.iter().sum();
        for k in 0..3 {
            assert!((p[k] as f64 - e[k] / s).abs() < 1e-7);
            assert!((lp[k] as f64 - (e[k] / s).ln()).abs() < 1e-6);
        }
        assert_eq!(p[3], 0.0);
        assert_eq!(lp[3], f32::NEG_INFINITY);
    }

    #[test]
    fn uniform_draws_are_in_the_open_interval_and_spread() {
        let n = 100_000;
        let mut sum = 0f64;
        for i in 0..n {
            let u = uniform_open0(7, i);
            assert!(u > 0.0 && u <= 1.0);
            sum += u as f64;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.005);
    }
}

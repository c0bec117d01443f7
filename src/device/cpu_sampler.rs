//! The sampler's kernels in compute mode: real math on the host over `[rows, cols]` row-major
//! f32 tensors, the same steps PyTorch runs for vLLM's sampler (see `model::sampler`).
//! Index tensors are int64 on a GPU; the host keeps them as i32 (a row of a vocabulary fits).

use rayon::prelude::*;

use super::cpu_vec;

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

/// Rows × columns above which a row-wise kernel splits its rows over the cores.
const PARALLEL_ELEMS: usize = 1 << 16;

/// `x.sort(dim=-1)` ascending and stable (ties keep their order), values and indices: an LSD
/// radix sort of each row's f32 keys (stable by construction), rows spread over the cores.
/// `total_cmp`'s order: −NaN < −∞ < … < −0 < +0 < … < +∞ < NaN.
pub fn sort_rows(x: &[f32], cols: usize, values: &mut [f32], indices: &mut [i32]) {
    if cols == 0 {
        return;
    }
    let rows = x
        .par_chunks(cols)
        .zip(values.par_chunks_mut(cols))
        .zip(indices.par_chunks_mut(cols))
        .with_min_len(PARALLEL_ELEMS.div_ceil(cols));
    rows.for_each_init(
        || RadixScratch::new(cols),
        |scr, ((row, vals), idx)| {
            scr.sort(row);
            for ((v, i), &o) in vals.iter_mut().zip(idx.iter_mut()).zip(&scr.order) {
                *v = row[o as usize];
                *i = o as i32;
            }
        },
    );
}

/// An f32's bits turned into a u32 whose unsigned order is `f32::total_cmp`'s.
fn sort_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Buffers of one row's radix sort, reused across the rows a thread sorts.
struct RadixScratch {
    keys: Vec<u32>,
    order: Vec<u32>,
    keys_tmp: Vec<u32>,
    order_tmp: Vec<u32>,
}

impl RadixScratch {
    fn new(cols: usize) -> Self {
        RadixScratch {
            keys: Vec::with_capacity(cols),
            order: Vec::with_capacity(cols),
            keys_tmp: vec![0; cols],
            order_tmp: vec![0; cols],
        }
    }

    /// Leaves in `order` the column indices of `row` in ascending, stable order: three
    /// counting passes of 11, 11 and 10 bits, each skipped when every key has the same digit.
    fn sort(&mut self, row: &[f32]) {
        self.keys.clear();
        self.keys.extend(row.iter().map(|&v| sort_key(v)));
        self.order.clear();
        self.order.extend(0..row.len() as u32);
        for shift in [0u32, 11, 22] {
            let digit = |k: u32| ((k >> shift) & 0x7ff) as usize;
            let mut count = [0u32; 2048];
            for &k in &self.keys {
                count[digit(k)] += 1;
            }
            if count[digit(self.keys[0])] as usize == row.len() {
                continue;
            }
            let mut sum = 0;
            for c in count.iter_mut() {
                let n = *c;
                *c = sum;
                sum += n;
            }
            for (&k, &o) in self.keys.iter().zip(&self.order) {
                let slot = &mut count[digit(k)];
                self.keys_tmp[*slot as usize] = k;
                self.order_tmp[*slot as usize] = o;
                *slot += 1;
            }
            std::mem::swap(&mut self.keys, &mut self.keys_tmp);
            std::mem::swap(&mut self.order, &mut self.order_tmp);
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

/// Row softmax (`log` = log_softmax), in f32 with the row max subtracted first; `exp` is the
/// vectorised polynomial of `cpu_vec` (about 1 ulp), rows spread over the cores.
pub fn softmax_rows(x: &[f32], cols: usize, out: &mut [f32], log: bool) {
    if cols == 0 {
        return;
    }
    x.par_chunks(cols)
        .zip(out.par_chunks_mut(cols))
        .with_min_len(PARALLEL_ELEMS.div_ceil(cols))
        .for_each(|(row, o)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if max == f32::NEG_INFINITY {
                o.fill(if log { f32::NEG_INFINITY } else { f32::NAN });
                return;
            }
            let sum = cpu_vec::exp_sum(row, max);
            if log {
                let ls = sum.ln();
                for (o, &v) in o.iter_mut().zip(row) {
                    *o = v - max - ls;
                }
            } else {
                cpu_vec::exp_scaled(row, max, 1.0 / sum, o);
            }
        });
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
    fn radix_sort_orders_like_a_stable_total_cmp_sort() {
        // Every class of value, many ties, and a row long enough for all three passes.
        let special = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            f32::MAX,
            f32::MIN,
        ];
        let cols = 5000;
        let x: Vec<f32> = (0..2 * cols)
            .map(|i| match i % 7 {
                0 => special[i % special.len()],
                1 => (i % 13) as f32, // ties
                _ => ((i * 7919) % 10007) as f32 * 0.37 - 1800.0,
            })
            .collect();
        let (mut v, mut idx) = (vec![0f32; x.len()], vec![0i32; x.len()]);
        sort_rows(&x, cols, &mut v, &mut idx);
        for r in 0..2 {
            let row = &x[r * cols..(r + 1) * cols];
            let mut want: Vec<u32> = (0..cols as u32).collect();
            want.sort_by(|&a, &b| row[a as usize].total_cmp(&row[b as usize]));
            let got: Vec<u32> = idx[r * cols..(r + 1) * cols]
                .iter()
                .map(|&i| i as u32)
                .collect();
            assert_eq!(got, want);
            for (k, &i) in got.iter().enumerate() {
                assert_eq!(v[r * cols + k].to_bits(), row[i as usize].to_bits());
            }
        }
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

//! Kernels of the simulated device's compute mode: real math on the host, f32 accumulation.
//! GEMMs go through `gemm` (packed, AVX-512/AVX2/NEON picked at run time, on all cores through
//! rayon): on the 2-core development machine it ran the pass's shapes 1.1-1.6× faster than
//! `matrixmultiply`, which has no AVX-512 kernel. The long ones (GEMM, attention)
//! check a cancel flag between blocks of rows, so Cancel lands within a fraction of a second
//! even inside one op of a long compute run.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

pub use super::cpu_attention::{attention_strided, AttnShape, RowLayout, ScoreMods};
use super::cpu_vec;
use crate::base::error::{Error, Result};

/// FLOPs a GEMM row block may take between cancel checks: ~0.04 s on two cores, large enough
/// that re-packing the weight per block costs little (a 2048-token SmolLM2 pass ran 2.5%
/// faster than with a quarter of it).
const GEMM_BLOCK_FLOPS: usize = 8_000_000_000;

fn check(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::Relaxed) {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}

/// Rows of `x` per GEMM block for `k × n` weights (at least 32, so small blocks stay
/// efficient).
fn gemm_rows_per_block(k: usize, n: usize) -> usize {
    (GEMM_BLOCK_FLOPS / (2 * k * n).max(1)).max(32)
}

/// `matmul_nt` in blocks of rows, checking `cancel` before each; every output row is computed
/// exactly as by one whole call (the k-accumulation does not depend on the row split).
pub fn matmul_nt_cancellable(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    (m, k, n): (usize, usize, usize),
    cancel: &AtomicBool,
) -> Result<()> {
    matmul_nt_blocks(x, w, out, (m, k, n), gemm_rows_per_block(k, n), cancel)
}

fn matmul_nt_blocks(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    (m, k, n): (usize, usize, usize),
    rows: usize,
    cancel: &AtomicBool,
) -> Result<()> {
    assert_eq!(x.len(), m * k);
    assert_eq!(out.len(), m * n);
    let mut start = 0;
    while start < m {
        check(cancel)?;
        let r = rows.min(m - start);
        matmul_nt_row_split(
            &x[start * k..(start + r) * k],
            w,
            &mut out[start * n..(start + r) * n],
            r,
            k,
            n,
        );
        start += r;
    }
    Ok(())
}

/// Rows below which a GEMM is left to the `gemm` crate's own threading.
const ROW_SPLIT_MIN_ROWS: usize = 128;

/// `matmul_nt` with the rows of `x` split into one contiguous chunk per pool thread, each
/// chunk's GEMM run on its thread alone. For a pass's skinny shapes (256-2048 tokens, k = 576
/// or 1536, n = 192-1536) the crate's own threading, which splits the columns of each row
/// block and waits on the other core at every block, ran 5-35% slower on the 2-core
/// development machine. Each output row is computed exactly as by one whole call. Up to
/// `COL_SPLIT_MAX_ROWS` rows it splits the columns instead (`matmul_nt_col_split`).
fn matmul_nt_row_split(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    let threads = rayon::current_num_threads();
    if threads < 2 || m < ROW_SPLIT_MIN_ROWS || n == 0 || k == 0 {
        matmul_nt(x, w, out, m, k, n);
        return;
    }
    if m <= COL_SPLIT_MAX_ROWS && n >= COL_SPLIT_MIN_COLS * threads {
        matmul_nt_col_split(x, w, out, m, k, n, threads);
        return;
    }
    let rows = m.div_ceil(threads);
    out.par_chunks_mut(rows * n)
        .zip(x.par_chunks(rows * k))
        .for_each(|(o, x)| gemm_nt(x, w, o, o.len() / n, k, n, gemm::Parallelism::None));
}

/// Rows up to which a GEMM is split by columns instead: with few rows, packing the whole
/// weight on every core (the row split) was a tenth of a 256-token SmolLM2 pass, which ran
/// 4.5% faster split by columns.
const COL_SPLIT_MAX_ROWS: usize = 512;
/// Columns each thread takes at least in a column split.
const COL_SPLIT_MIN_COLS: usize = 128;

/// The output, written by the column split's threads at once.
struct OutCols(*mut f32);
// SAFETY: each thread writes its own columns of the output (disjoint), and the slice outlives
// the parallel loop.
unsafe impl Sync for OutCols {}

/// `matmul_nt` with the weight's rows (the output's columns) split into one contiguous range
/// per pool thread, so each core packs only its part of the weight. Each output value is
/// computed exactly as by one whole call (the crate's k-blocking depends on k alone).
fn matmul_nt_col_split(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    threads: usize,
) {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    assert_eq!(out.len(), m * n);
    // A multiple of 16 columns per thread: the AVX2 kernel's tile (16 rows of its transposed
    // problem), and a width the AVX-512 kernel's 16-row variants cover exactly.
    let cols = n.div_ceil(threads).next_multiple_of(16);
    let dst = OutCols(out.as_mut_ptr());
    let dst = &dst;
    w.par_chunks(cols * k).enumerate().for_each(|(i, w)| {
        let (c0, nc) = (i * cols, w.len() / k);
        // SAFETY: the asserts above bound every index: x is [m, k], this thread's weight rows
        // are [nc, k], and it writes columns c0..c0+nc of the [m, n] output, which no other
        // thread writes.
        unsafe {
            gemm_nt_raw(
                (m, k, nc),
                x.as_ptr(),
                w.as_ptr(),
                (dst.0.add(c0), n),
                gemm::Parallelism::None,
            )
        };
    });
}

/// `out[m×n] = x[m×k] · w[n×k]ᵀ` (a linear layer with PyTorch's `[out, in]` weight layout),
/// on all cores through the `gemm` crate's own threading.
pub fn matmul_nt(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    gemm_nt(x, w, out, m, k, n, gemm::Parallelism::Rayon(0));
}

/// `matmul_nt` on the calling thread alone (for callers that run one GEMM per pool thread).
pub fn matmul_nt_serial(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    gemm_nt(x, w, out, m, k, n, gemm::Parallelism::None);
}

fn gemm_nt(
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    threads: gemm::Parallelism,
) {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    assert_eq!(out.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the asserts above bound every index the GEMM touches through these strides:
    // x is [m, k] row-major, w is [n, k] row-major read as its transpose, out is [m, n].
    unsafe {
        gemm_nt_raw(
            (m, k, n),
            x.as_ptr(),
            w.as_ptr(),
            (out.as_mut_ptr(), n),
            threads,
        )
    };
}

/// `dst[m×n] = x[m×k] · w[n×k]ᵀ` with `dst`'s rows `ld` apart (row-major x and w).
///
/// # Safety
/// `x` holds `m·k` values, `w` `n·k`, and `dst` rows `0..m` of `ld ≥ n` values each.
unsafe fn gemm_nt_raw(
    (m, k, n): (usize, usize, usize),
    x: *const f32,
    w: *const f32,
    (dst, ld): (*mut f32, usize),
    threads: gemm::Parallelism,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        ld as isize,
        false,
        x,
        1,
        k as isize,
        w,
        k as isize,
        1,
        0.0,
        1.0,
        false,
        false,
        false,
        threads,
    );
}

/// Values below which a row-wise or element-wise op stays on the calling thread: handing work
/// to the pool and waiting for it costs some microseconds, more than such an op takes.
const PAR_MIN_VALUES: usize = 1 << 16;

/// Rows per chunk when `rows` rows of `row_len` values are split into one contiguous chunk per
/// pool thread, or `None` when the op is too small to split. Between the GEMMs a pass is a
/// chain of such ops; on one thread they would leave the other cores idle.
fn par_chunk_rows(rows: usize, row_len: usize) -> Option<usize> {
    let threads = rayon::current_num_threads();
    (threads > 1 && rows > 1 && rows * row_len >= PAR_MIN_VALUES).then(|| rows.div_ceil(threads))
}

pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let cols = weight.len();
    if cols == 0 {
        return;
    }
    match par_chunk_rows(x.len() / cols, cols) {
        None => cpu_vec::rms_norm_rows(x, weight, eps, out),
        Some(rows) => out
            .par_chunks_mut(rows * cols)
            .zip(x.par_chunks(rows * cols))
            .for_each(|(o, x)| cpu_vec::rms_norm_rows(x, weight, eps, o)),
    }
}

/// vLLM's `fused_add_rms_norm`: `residual += x`, then `x = rms_norm(residual) · weight`.
pub fn add_rms_norm(x: &mut [f32], residual: &mut [f32], weight: &[f32], eps: f32) {
    let cols = weight.len();
    if cols == 0 {
        return;
    }
    match par_chunk_rows(x.len() / cols, cols) {
        None => cpu_vec::add_rms_norm_rows(x, residual, weight, eps),
        Some(rows) => x
            .par_chunks_mut(rows * cols)
            .zip(residual.par_chunks_mut(rows * cols))
            .for_each(|(x, r)| cpu_vec::add_rms_norm_rows(x, r, weight, eps)),
    }
}

/// Rotary embedding in place, Hugging Face Llama convention (`rotate_half`: the first and
/// second halves of each head are the pair).
pub fn rope(x: &mut [f32], positions: &[usize], heads: usize, head_dim: usize, theta: f32) {
    let table = RopeTable::new(positions, head_dim, theta);
    rope_strided(x, RowLayout::packed(heads * head_dim), heads, &table);
}

/// `cos` and `sin` of every (token, frequency) of a batch, made once per layer and shared by
/// q and k and all heads (the angle is the same; only the vectors differ).
pub struct RopeTable {
    head_dim: usize,
    /// The first dimensions of each head that turn (`head_dim` but for Phi's partial rotary);
    /// the rest pass through.
    rotary_dim: usize,
    /// `[tokens, rotary_dim / 2]` pairs `(cos, sin)` of `position · θ^(−2i / rotary_dim)`.
    pub(crate) cos_sin: Vec<(f32, f32)>,
}

impl RopeTable {
    pub fn new(positions: &[usize], head_dim: usize, theta: f32) -> Self {
        Self::linear_scaled(positions, head_dim, theta, 1.0)
    }

    /// Linear rope scaling (vLLM's `LinearScalingRotaryEmbedding`): position `p` turns by the
    /// angles of `p / factor`.
    pub fn linear_scaled(positions: &[usize], head_dim: usize, theta: f32, factor: f32) -> Self {
        Self::partial(positions, head_dim, head_dim, theta, factor)
    }

    /// Only the first `rotary_dim` dimensions of each head turn, with the frequencies of a
    /// `rotary_dim`-wide embedding (vLLM's `RotaryEmbedding` with `rotary_dim < head_size`,
    /// Hugging Face's `apply_rotary_pos_emb` on `q[..., :rotary_dim]` for Phi).
    pub fn partial(
        positions: &[usize],
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
        factor: f32,
    ) -> Self {
        let half = rotary_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32))
            .collect();
        let cos_sin = positions
            .iter()
            .flat_map(|&pos| {
                let t = if factor == 1.0 {
                    pos as f32
                } else {
                    pos as f32 / factor
                };
                inv_freq.iter().map(move |f| (t * f).sin_cos())
            })
            .map(|(sin, cos)| (cos, sin))
            .collect();
        RopeTable {
            head_dim,
            rotary_dim,
            cos_sin,
        }
    }
}

impl RopeTable {
    /// A table from given frequencies (a scaled rotary embedding's: `RopeScaling::inv_freq`),
    /// each cos and sin times `mscale` (YaRN's), as vLLM's scaled caches hold them.
    pub fn from_inv_freq(
        positions: &[usize],
        head_dim: usize,
        inv_freq: &[f64],
        mscale: f64,
    ) -> Self {
        let cos_sin = positions
            .iter()
            .flat_map(|&pos| {
                inv_freq.iter().map(move |f| {
                    let (sin, cos) = (pos as f64 * f).sin_cos();
                    ((cos * mscale) as f32, (sin * mscale) as f32)
                })
            })
            .collect();
        RopeTable {
            head_dim,
            rotary_dim: 2 * inv_freq.len(),
            cos_sin,
        }
    }
}

/// RoPE in place on `heads` heads of every token row of `x` laid out as `at` (so q and k may
/// be column ranges of one fused tensor).
pub fn rope_strided(x: &mut [f32], at: RowLayout, heads: usize, table: &RopeTable) {
    let (hd, rot, half) = (table.head_dim, table.rotary_dim, table.rotary_dim / 2);
    if half == 0 || table.cos_sin.is_empty() {
        return;
    }
    let x = &mut x[at.off..];
    match par_chunk_rows(table.cos_sin.len() / half, heads * hd) {
        None => rope_rows(x, at.ld, heads, (hd, rot), &table.cos_sin),
        Some(rows) => x
            .par_chunks_mut(rows * at.ld)
            .zip(table.cos_sin.par_chunks(rows * half))
            .for_each(|(x, cs)| rope_rows(x, at.ld, heads, (hd, rot), cs)),
    }
}

/// RoPE on the token rows `x` starts with (row `t` at `t · ld`), one row per `rot / 2` pairs
/// of `cos_sin`: the first `rot` of each head's `hd` dimensions turn, neox style (dimension
/// `i` with `i + rot / 2`).
fn rope_rows(
    x: &mut [f32],
    ld: usize,
    heads: usize,
    (hd, rot): (usize, usize),
    cos_sin: &[(f32, f32)],
) {
    let half = rot / 2;
    for (t, cs) in cos_sin.chunks_exact(half).enumerate() {
        for h in 0..heads {
            let base = t * ld + h * hd;
            let (a, b) = x[base..base + rot].split_at_mut(half);
            for ((a, b), &(cos, sin)) in a.iter_mut().zip(b.iter_mut()).zip(cs) {
                let (x0, x1) = (*a, *b);
                *a = x0 * cos - x1 * sin;
                *b = x1 * cos + x0 * sin;
            }
        }
    }
}

/// Causal grouped-query attention per sequence over packed `[T, heads·head_dim]` q and out and
/// `[T, kv_heads·head_dim]` k and v; `seq_lens` sum to the token count. Blocked, with an online
/// softmax, on all cores (see `cpu_attention`).
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seq_lens: &[usize],
    s: AttnShape,
    out: &mut [f32],
    cancel: &AtomicBool,
) -> Result<()> {
    let (qw, kw) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    attention_strided(
        q,
        RowLayout::packed(qw),
        k,
        RowLayout::packed(kw),
        v,
        RowLayout::packed(kw),
        out,
        RowLayout::packed(qw),
        seq_lens,
        s,
        cancel,
    )
}

/// Elements per chunk to split `n` element-wise over the pool (see `par_chunk_rows`).
fn par_chunk_len(n: usize) -> Option<usize> {
    par_chunk_rows(n, 1)
}

/// `out = silu(gate) * up` (vLLM's `SiluAndMul` into its new output).
pub fn silu_mul_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    match par_chunk_len(out.len()) {
        None => cpu_vec::silu_mul_into(gate, up, out),
        Some(c) => out
            .par_chunks_mut(c)
            .zip(gate.par_chunks(c).zip(up.par_chunks(c)))
            .for_each(|(o, (g, u))| cpu_vec::silu_mul_into(g, u, o)),
    }
}

/// `dst = src` (a view's host copy), split over the pool when large.
pub fn copy(dst: &mut [f32], src: &[f32]) {
    match par_chunk_len(dst.len()) {
        None => dst.copy_from_slice(src),
        Some(c) => dst
            .par_chunks_mut(c)
            .zip(src.par_chunks(c))
            .for_each(|(d, s)| d.copy_from_slice(s)),
    }
}

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    match par_chunk_len(x.len()) {
        None => cpu_vec::add_assign(x, y),
        Some(c) => x
            .par_chunks_mut(c)
            .zip(y.par_chunks(c))
            .for_each(|(x, y)| cpu_vec::add_assign(x, y)),
    }
}

pub fn embedding(ids: &[u32], table: &[f32], hidden: usize, out: &mut [f32]) {
    for (t, &id) in ids.iter().enumerate() {
        out[t * hidden..(t + 1) * hidden]
            .copy_from_slice(&table[id as usize * hidden..(id as usize + 1) * hidden]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive() {
        let (m, k, n) = (3, 5, 4);
        let x: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.1).collect();
        let w: Vec<f32> = (0..n * k).map(|i| 1.0 - i as f32 * 0.05).collect();
        let mut out = vec![0.0; m * n];
        matmul_nt(&x, &w, &mut out, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let e: f32 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
                assert!((out[i * n + j] - e).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn attention_of_first_token_is_its_value() {
        let s = AttnShape {
            heads: 2,
            kv_heads: 1,
            head_dim: 2,
            mods: ScoreMods::default(),
        };
        let q = vec![1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.1];
        let k = vec![1.0, 2.0, 3.0, 4.0];
        let v = vec![5.0, 6.0, 7.0, 8.0];
        let mut out = vec![0.0; 8];
        attention(&q, &k, &v, &[2], s, &mut out, &AtomicBool::new(false)).unwrap();
        assert_eq!(&out[..4], &[5.0, 6.0, 5.0, 6.0]);
        assert!(out[4] > 5.0 && out[4] < 7.0);
    }

    /// Deterministic GEMM operands `x [m, k]` and `w [n, k]` with mixed signs.
    fn gemm_operands(m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let x = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let w = (0..n * k)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021)
            .collect();
        (x, w)
    }

    #[test]
    fn gemm_in_row_blocks_is_bitwise_the_whole_gemm() {
        let (m, k, n) = (300, 77, 129);
        let (x, w) = gemm_operands(m, k, n);
        let mut whole = vec![0.0; m * n];
        matmul_nt(&x, &w, &mut whole, m, k, n);
        let mut blocks = vec![0.0; m * n];
        let no = AtomicBool::new(false);
        matmul_nt_blocks(&x, &w, &mut blocks, (m, k, n), 32, &no).unwrap();
        assert!(whole == blocks);
    }

    /// Asserts that `split` writes every value of `x · wᵀ` bitwise as one whole GEMM does.
    fn assert_bitwise_the_whole_gemm(
        (m, k, n): (usize, usize, usize),
        split: impl Fn(&[f32], &[f32], &mut [f32]),
    ) {
        let (x, w) = gemm_operands(m, k, n);
        let mut whole = vec![0.0; m * n];
        matmul_nt(&x, &w, &mut whole, m, k, n);
        let mut out = vec![f32::NAN; m * n];
        split(&x, &w, &mut out);
        assert!(whole == out);
    }

    #[test]
    fn gemm_split_over_threads_by_columns_is_bitwise_the_whole_gemm() {
        // k = 600 takes two k-blocks; 300 columns split unevenly over the threads.
        let (m, k, n) = (200, 600, 300);
        for threads in [2, 3] {
            assert_bitwise_the_whole_gemm((m, k, n), |x, w, out| {
                matmul_nt_col_split(x, w, out, m, k, n, threads)
            });
        }
    }

    #[test]
    fn gemm_split_over_threads_by_rows_is_bitwise_the_whole_gemm() {
        // k = 600 takes two k-blocks inside the crate; the row chunks must not change them.
        let (m, k, n) = (301, 600, 130);
        assert_bitwise_the_whole_gemm((m, k, n), |x, w, out| {
            matmul_nt_row_split(x, w, out, m, k, n)
        });
    }

    fn wavy(n: usize, salt: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 6.0)
            .collect()
    }

    #[test]
    fn row_ops_split_over_threads_give_the_one_thread_values() {
        // 300 rows of 576: above PAR_MIN_VALUES, so split; odd rows, so chunks differ.
        let (rows, cols) = (301, 576);
        assert!(par_chunk_rows(rows, cols).is_some());
        let (x, w) = (wavy(rows * cols, 1), wavy(cols, 2));
        let mut split = vec![0.0; rows * cols];
        rms_norm(&x, &w, 1e-5, &mut split);
        let mut one = vec![0.0; rows * cols];
        cpu_vec::rms_norm_rows(&x, &w, 1e-5, &mut one);
        assert!(split == one);

        let (mut h_split, mut r_split) = (wavy(rows * cols, 3), wavy(rows * cols, 4));
        let (mut h_one, mut r_one) = (h_split.clone(), r_split.clone());
        add_rms_norm(&mut h_split, &mut r_split, &w, 1e-5);
        cpu_vec::add_rms_norm_rows(&mut h_one, &mut r_one, &w, 1e-5);
        assert!(h_split == h_one && r_split == r_one);

        let up = wavy(rows * cols, 5);
        silu_mul_into(&x, &up, &mut split);
        let mut one = vec![0.0; rows * cols];
        cpu_vec::silu_mul_into(&x, &up, &mut one);
        assert!(split == one);
    }

    #[test]
    fn rope_split_over_threads_gives_the_one_thread_values() {
        // q of a fused [T, 9·64 + 2·3·64] row, as the Llama pass lays it out.
        let (tokens, heads, hd, ld) = (300, 9, 64, 960);
        let positions: Vec<usize> = (0..tokens).collect();
        let table = RopeTable::new(&positions, hd, 10_000.0);
        let mut split = wavy(tokens * ld, 6);
        let mut one = split.clone();
        rope_strided(&mut split, RowLayout { off: 0, ld }, heads, &table);
        rope_rows(&mut one, ld, heads, (hd, hd), &table.cos_sin);
        assert!(split == one);
        assert!(split != wavy(tokens * ld, 6));
    }

    /// Phi's partial rotary: the first `rotary_dim` dimensions of each head turn as a head of
    /// that width would; the others are left as they were.
    #[test]
    fn partial_rope_turns_only_the_first_rotary_dims_of_each_head() {
        let (tokens, heads, hd, rot) = (5, 3, 10, 4);
        let positions: Vec<usize> = (0..tokens).collect();
        let x = wavy(tokens * heads * hd, 3);
        let mut got = x.clone();
        let table = RopeTable::partial(&positions, hd, rot, 10_000.0, 1.0);
        rope_strided(&mut got, RowLayout::packed(heads * hd), heads, &table);
        let narrow = RopeTable::new(&positions, rot, 10_000.0);
        for t in 0..tokens {
            for h in 0..heads {
                let at = t * heads * hd + h * hd;
                let mut head = x[at..at + rot].to_vec();
                rope_strided(
                    &mut head,
                    RowLayout::packed(rot),
                    1,
                    &RopeTable::new(&[t], rot, 10_000.0),
                );
                assert_eq!(got[at..at + rot], head[..], "token {t} head {h}");
                assert_eq!(got[at + rot..at + hd], x[at + rot..at + hd]);
            }
        }
        assert_eq!(narrow.cos_sin.len(), tokens * rot / 2);
    }

    #[test]
    fn a_set_cancel_flag_stops_gemm_and_attention() {
        let yes = AtomicBool::new(true);
        let mut out = vec![0.0; 4];
        let r = matmul_nt_cancellable(&[1.0; 4], &[1.0; 4], &mut out, (2, 2, 2), &yes);
        assert!(matches!(r, Err(Error::Cancelled)));
        let s = AttnShape {
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            mods: ScoreMods::default(),
        };
        let r = attention(&[1.0; 4], &[1.0; 4], &[1.0; 4], &[2], s, &mut out, &yes);
        assert!(matches!(r, Err(Error::Cancelled)));
    }
}

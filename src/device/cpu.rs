//! Kernels of the simulated device's compute mode: real math on the host, f32 accumulation.
//! GEMMs go through `matrixmultiply` (packed, SIMD, threaded). The long ones (GEMM, attention)
//! check a cancel flag between blocks of rows, so Cancel lands within a fraction of a second
//! even inside one op of a long compute run.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// FLOPs a GEMM row block may take between cancel checks: ~0.1 s on two cores, large enough
/// that re-packing the weight per block costs little.
const GEMM_BLOCK_FLOPS: usize = 2_000_000_000;
/// Query rows attention computes between cancel checks.
const ATTENTION_ROWS_PER_CHECK: usize = 16;

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
        matmul_nt(
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

/// `out[m×n] = x[m×k] · w[n×k]ᵀ` (a linear layer with PyTorch's `[out, in]` weight layout).
pub fn matmul_nt(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    assert_eq!(out.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the asserts above bound every index sgemm touches through these strides.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            0.0,
            out.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let cols = weight.len();
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// Rotary embedding in place, Hugging Face Llama convention (`rotate_half`: the first and
/// second halves of each head are the pair).
pub fn rope(x: &mut [f32], positions: &[usize], heads: usize, head_dim: usize, theta: f32) {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    for (t, &pos) in positions.iter().enumerate() {
        for h in 0..heads {
            let base = (t * heads + h) * head_dim;
            for (i, f) in inv_freq.iter().enumerate() {
                let (sin, cos) = (pos as f32 * f).sin_cos();
                let a = x[base + i];
                let b = x[base + i + half];
                x[base + i] = a * cos - b * sin;
                x[base + i + half] = b * cos + a * sin;
            }
        }
    }
}

/// Shape of an attention call: sequences laid end to end, grouped-query heads.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Causal grouped-query attention per sequence; `seq_lens` sum to the token count.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seq_lens: &[usize],
    s: AttnShape,
    out: &mut [f32],
    cancel: &AtomicBool,
) -> Result<()> {
    let (hd, qw, kw) = (s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let group = s.heads / s.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut start = 0;
    let mut scores = Vec::new();
    for &len in seq_lens {
        for h in 0..s.heads {
            let kvh = h / group;
            for i in 0..len {
                if i % ATTENTION_ROWS_PER_CHECK == 0 {
                    check(cancel)?;
                }
                let qi = &q[(start + i) * qw + h * hd..][..hd];
                scores.clear();
                let mut max = f32::NEG_INFINITY;
                for j in 0..=i {
                    let kj = &k[(start + j) * kw + kvh * hd..][..hd];
                    let d = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                    max = max.max(d);
                    scores.push(d);
                }
                let mut sum = 0.0;
                for sc in scores.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                let o = &mut out[(start + i) * qw + h * hd..][..hd];
                o.fill(0.0);
                for (j, sc) in scores.iter().enumerate() {
                    let vj = &v[(start + j) * kw + kvh * hd..][..hd];
                    let p = sc / sum;
                    for (o, x) in o.iter_mut().zip(vj) {
                        *o += p * x;
                    }
                }
            }
        }
        start += len;
    }
    Ok(())
}

/// `gate = silu(gate) * up`, in place.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
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
        };
        let q = vec![1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.1];
        let k = vec![1.0, 2.0, 3.0, 4.0];
        let v = vec![5.0, 6.0, 7.0, 8.0];
        let mut out = vec![0.0; 8];
        attention(&q, &k, &v, &[2], s, &mut out, &AtomicBool::new(false)).unwrap();
        assert_eq!(&out[..4], &[5.0, 6.0, 5.0, 6.0]);
        assert!(out[4] > 5.0 && out[4] < 7.0);
    }

    #[test]
    fn gemm_in_row_blocks_is_bitwise_the_whole_gemm() {
        let (m, k, n) = (300, 77, 129);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021)
            .collect();
        let mut whole = vec![0.0; m * n];
        matmul_nt(&x, &w, &mut whole, m, k, n);
        let mut blocks = vec![0.0; m * n];
        let no = AtomicBool::new(false);
        matmul_nt_blocks(&x, &w, &mut blocks, (m, k, n), 32, &no).unwrap();
        assert!(whole == blocks);
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
        };
        let r = attention(&[1.0; 4], &[1.0; 4], &[1.0; 4], &[2], s, &mut out, &yes);
        assert!(matches!(r, Err(Error::Cancelled)));
    }
}

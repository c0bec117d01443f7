//! Causal grouped-query attention on the host, blocked as flash-attention is: each task takes
//! a block of query rows of one head and walks the key/value rows up to the diagonal in blocks,
//! keeping a running max and sum per row (online softmax), so no `[T, T]` score matrix is ever
//! made. The two small products of a step (`Q·Kᵀ` and `P·V`) go through `gemm`; tasks run on
//! all cores through rayon.
//!
//! Operands are plain slices with an offset and a row stride, so q, k and v may be column
//! ranges of one fused `[T, q_dim + 2·kv_dim]` tensor (vLLM's `QKVParallelLinear`).

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::cpu_vec;
use crate::base::error::{Error, Result};

/// Shape of an attention call: sequences laid end to end, grouped-query heads.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// How the scores differ from `softmax(q·kᵀ / √head_dim)` with a causal mask (Gemma).
    pub mods: ScoreMods,
}

/// Gemma's changes to the attention scores (vLLM's `Attention(scale, logits_soft_cap,
/// per_layer_sliding_window)`): all `None` is the plain causal softmax.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScoreMods {
    /// The score scale; `None` is `1 / √head_dim`.
    pub scale: Option<f32>,
    /// Scores become `tanh(s / cap) · cap` before the mask and softmax.
    pub softcap: Option<f32>,
    /// Query `i` sees keys `i − window + 1 ..= i` only (flash-attention's
    /// `window_size = (window − 1, 0)`).
    pub window: Option<usize>,
}

/// Query rows per task: large enough that the products run near the GEMM rate, small enough
/// that a 2048-token sequence gives each core many tasks.
const Q_BLOCK: usize = 64;
/// Key/value rows per step (a multiple of `Q_BLOCK`, so a step never starts past a task's
/// first query row); the `[Q_BLOCK, KV_BLOCK]` scores stay in L2.
const KV_BLOCK: usize = 256;
const _: () = assert!(KV_BLOCK.is_multiple_of(Q_BLOCK));
/// Query heads of one key/value head a task takes together, their query rows stacked: each
/// step's key and value blocks are packed by `gemm` once for all of them instead of once per
/// head (grouped-query attention).
const HEADS_PER_TASK: usize = 4;

/// Where an operand's heads lie in its slice: head `h` of token `t` is the `head_dim` values
/// from `off + t·ld + h·head_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLayout {
    pub off: usize,
    pub ld: usize,
}

impl RowLayout {
    /// Rows of exactly `width` values, back to back from the start.
    pub fn packed(width: usize) -> Self {
        RowLayout { off: 0, ld: width }
    }

    fn at(self, t: usize, h: usize, head_dim: usize) -> usize {
        self.off + t * self.ld + h * head_dim
    }

    /// One past the last index `tokens` rows of `heads` heads touch.
    fn end(self, tokens: usize, heads: usize, head_dim: usize) -> usize {
        if tokens == 0 {
            0
        } else {
            self.at(tokens - 1, heads - 1, head_dim) + head_dim
        }
    }
}

/// One task: query rows `q0 .. q0 + rows` of heads `head0 .. head0 + heads` (all reading one
/// key/value head) in the sequence starting at token `start`.
#[derive(Clone, Copy)]
struct Task {
    start: usize,
    q0: usize,
    rows: usize,
    head0: usize,
    heads: usize,
    /// Index in `KeysT::blocks` of the sequence's first key block.
    block0: usize,
}

/// The keys transposed, block by block: for each key/value head and each `KV_BLOCK` keys of a
/// sequence, `head_dim` rows of the block's keys. `gemm` reads such a block in place; the
/// strided `[T, kv_heads·head_dim]` keys it would gather into a packed copy on every step,
/// which took a fifth of attention's time.
struct KeysT {
    data: Vec<f32>,
    /// Per block of one head: (first token, keys, offset in the head's part, row stride).
    blocks: Vec<(usize, usize, usize, usize)>,
    per_head: usize,
}

impl KeysT {
    fn new(k: &[f32], k_at: RowLayout, seq_lens: &[usize], kv_heads: usize, hd: usize) -> Self {
        let mut blocks = Vec::new();
        let (mut start, mut per_head) = (0, 0);
        for &len in seq_lens {
            for j0 in (0..len).step_by(KV_BLOCK) {
                let cols = KV_BLOCK.min(len - j0);
                // Rows a multiple of 256 bytes apart would all fall in the same few L1 sets
                // (a whole block's 1 KiB rows use 4 of 64): one cache line more spreads them.
                let ld = if cols.is_multiple_of(64) {
                    cols + 16
                } else {
                    cols
                };
                blocks.push((start + j0, cols, per_head, ld));
                per_head += hd * ld;
            }
            start += len;
        }
        let mut data = vec![0f32; kv_heads * per_head];
        let mut parts = Vec::with_capacity(kv_heads * blocks.len());
        for (kvh, mut head) in data.chunks_mut(per_head.max(1)).enumerate() {
            for &(tok0, cols, _, ld) in &blocks {
                let (part, rest) = head.split_at_mut(hd * ld);
                head = rest;
                parts.push((kvh, tok0, cols, ld, part));
            }
        }
        parts
            .into_par_iter()
            .for_each(|(kvh, tok0, cols, ld, part)| {
                for t in 0..cols {
                    let src = &k[k_at.at(tok0 + t, kvh, hd)..][..hd];
                    for (d, &x) in src.iter().enumerate() {
                        part[d * ld + t] = x;
                    }
                }
            });
        KeysT {
            data,
            blocks,
            per_head,
        }
    }

    /// Block `block` of head `kvh`: its transposed keys and their row stride.
    fn block(&self, kvh: usize, block: usize) -> (&[f32], usize) {
        let (_, _, off, ld) = self.blocks[block];
        (&self.data[kvh * self.per_head + off..], ld)
    }
}

/// The output, written by many tasks at once.
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint `(token, head)` ranges of the output (checked in
// `attention_strided`: its row stride holds all heads side by side), and the slice outlives
// the parallel loop that uses the pointer.
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}

/// A task's working memory, reused across the tasks one thread runs; rows are the task's
/// query rows, head after head.
struct Scratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    acc: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
}

/// Causal attention of sequences laid end to end (`seq_lens` sum to the token count) with
/// grouped-query heads: `out = softmax(q·kᵀ / √head_dim + causal mask) · v` per head, query
/// head `h` reading key/value head `h / (heads / kv_heads)`. Checks `cancel` between blocks.
#[allow(clippy::too_many_arguments)]
pub fn attention_strided(
    q: &[f32],
    q_at: RowLayout,
    k: &[f32],
    k_at: RowLayout,
    v: &[f32],
    v_at: RowLayout,
    out: &mut [f32],
    out_at: RowLayout,
    seq_lens: &[usize],
    s: AttnShape,
    cancel: &AtomicBool,
) -> Result<()> {
    let hd = s.head_dim;
    let tokens: usize = seq_lens.iter().sum();
    assert!(s.kv_heads > 0 && s.heads.is_multiple_of(s.kv_heads) && hd > 0);
    assert!(q_at.end(tokens, s.heads, hd) <= q.len());
    assert!(k_at.end(tokens, s.kv_heads, hd) <= k.len());
    assert!(v_at.end(tokens, s.kv_heads, hd) <= v.len());
    assert!(out_at.end(tokens, s.heads, hd) <= out.len());
    assert!(
        tokens <= 1 || out_at.ld >= s.heads * hd,
        "output rows overlap"
    );
    let group = s.heads / s.kv_heads;
    let scale = s.mods.scale.unwrap_or(1.0 / (hd as f32).sqrt());
    let (softcap, window) = (s.mods.softcap, s.mods.window.unwrap_or(usize::MAX));

    let kt = KeysT::new(k, k_at, seq_lens, s.kv_heads, hd);
    let mut tasks = Vec::new();
    let (mut start, mut block0) = (0, 0);
    let per_task = HEADS_PER_TASK.min(group);
    for &len in seq_lens {
        // Each key/value head's query heads in chunks of `per_task`.
        for (kvh, g0) in
            (0..s.kv_heads).flat_map(|h| (0..group).step_by(per_task).map(move |g| (h, g)))
        {
            let (head0, heads) = (kvh * group + g0, per_task.min(group - g0));
            for q0 in (0..len).step_by(Q_BLOCK) {
                let rows = Q_BLOCK.min(len - q0);
                tasks.push(Task {
                    start,
                    q0,
                    rows,
                    head0,
                    heads,
                    block0,
                });
            }
        }
        start += len;
        block0 += len.div_ceil(KV_BLOCK);
    }
    // The costliest tasks (far down a sequence) first, so the last ones to finish are short.
    tasks.sort_by_key(|t| std::cmp::Reverse(t.q0));

    let out_ptr = OutPtr(out.as_mut_ptr());
    let out_ptr = &out_ptr;
    tasks.par_iter().try_for_each_init(
        || {
            let rows = per_task * Q_BLOCK;
            Scratch {
                q: vec![0.0; rows * hd],
                scores: vec![0.0; rows * KV_BLOCK],
                acc: vec![0.0; rows * hd],
                max: vec![0.0; rows],
                sum: vec![0.0; rows],
            }
        },
        |scr, t| {
            let kvh = t.head0 / group;
            let (rows, kv_end) = (t.rows, t.q0 + t.rows);
            // Stacked rows: row `g·rows + i` is query row `q0 + i` of head `head0 + g`.
            let stacked = t.heads * rows;
            let acc = &mut scr.acc[..stacked * hd];
            acc.fill(0.0);
            scr.max[..stacked].fill(f32::NEG_INFINITY);
            scr.sum[..stacked].fill(0.0);
            let q_blk = &mut scr.q[..stacked * hd];
            for (sr, dst) in q_blk.chunks_exact_mut(hd).enumerate() {
                let (g, i) = (sr / rows, sr % rows);
                dst.copy_from_slice(&q[q_at.at(t.start + t.q0 + i, t.head0 + g, hd)..][..hd]);
            }
            // The first key the task's first query row sees; blocks before it are skipped.
            let kv_start = (t.q0 + 1).saturating_sub(window);
            for j0 in (kv_start / KV_BLOCK * KV_BLOCK..kv_end).step_by(KV_BLOCK) {
                if cancel.load(Ordering::Relaxed) {
                    return Err(Error::Cancelled);
                }
                let cols = KV_BLOCK.min(kv_end - j0);
                let scores = &mut scr.scores[..stacked * cols];
                let (kt_blk, kt_ld) = kt.block(kvh, t.block0 + j0 / KV_BLOCK);
                let v_blk = &v[v_at.at(t.start + j0, kvh, hd)..];
                // SAFETY: the stacked queries are `stacked` rows of `head_dim`; the key block
                // holds `head_dim` rows of `kt_ld ≥ cols` keys.
                unsafe {
                    gemm::gemm(
                        stacked,
                        cols,
                        hd,
                        scores.as_mut_ptr(),
                        1,
                        cols as isize,
                        false,
                        q_blk.as_ptr(),
                        1,
                        hd as isize,
                        kt_blk.as_ptr(),
                        1,
                        kt_ld as isize,
                        0.0,
                        scale,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    );
                }
                for r in 0..stacked {
                    // Query row i sees keys 0..=i (every row sees at least key j0 ≤ q0), or
                    // with a window only the last `window` of them.
                    let i = t.q0 + r % rows;
                    let valid = (i + 1 - j0).min(cols);
                    let first = (i + 1).saturating_sub(window).saturating_sub(j0);
                    let first = first.min(valid);
                    let row = &mut scores[r * cols..(r + 1) * cols];
                    row[..first].fill(0.0);
                    row[valid..].fill(0.0);
                    if first == valid {
                        continue;
                    }
                    let seen = &mut row[first..valid];
                    if let Some(cap) = softcap {
                        for x in seen.iter_mut() {
                            *x = (*x / cap).tanh() * cap;
                        }
                    }
                    let m_old = scr.max[r];
                    let m_new = cpu_vec::max_from(seen, m_old);
                    let blk_sum = cpu_vec::exp_shifted_sum(seen, m_new);
                    let corr = cpu_vec::exp_lane(m_old - m_new);
                    scr.sum[r] = scr.sum[r] * corr + blk_sum;
                    scr.max[r] = m_new;
                    if corr != 1.0 {
                        for a in &mut acc[r * hd..(r + 1) * hd] {
                            *a *= corr;
                        }
                    }
                }
                // SAFETY: v rows `j0..j0+cols` lie in the slice, as for k above.
                unsafe {
                    gemm::gemm(
                        stacked,
                        hd,
                        cols,
                        acc.as_mut_ptr(),
                        1,
                        hd as isize,
                        true,
                        scores.as_ptr(),
                        1,
                        cols as isize,
                        v_blk.as_ptr(),
                        1,
                        v_at.ld as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    );
                }
            }
            for r in 0..stacked {
                let inv = 1.0 / scr.sum[r];
                let o = out_at.at(t.start + t.q0 + r % rows, t.head0 + r / rows, hd);
                // SAFETY: `o..o+hd` is this task's own (token, head) range of the output,
                // in bounds by the asserts above and written by no other task.
                let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(o), hd) };
                for (d, a) in dst.iter_mut().zip(&acc[r * hd..(r + 1) * hd]) {
                    *d = a * inv;
                }
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention as written in the papers, in f64: scores, mask, softmax, weighted sum.
    /// The largest absolute difference between `out` and the f64 reference `want`.
    fn worst_abs(out: &[f32], want: &[f64]) -> f64 {
        out.iter()
            .zip(want)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0f64, f64::max)
    }

    fn naive(q: &[f32], k: &[f32], v: &[f32], seq_lens: &[usize], s: AttnShape) -> Vec<f64> {
        let (hd, qw, kw) = (s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let mut out = vec![0f64; q.len()];
        let mut start = 0;
        for &len in seq_lens {
            for h in 0..s.heads {
                let kvh = h / (s.heads / s.kv_heads);
                for i in 0..len {
                    let qi = &q[(start + i) * qw + h * hd..][..hd];
                    let scale = s.mods.scale.map_or(1.0 / (hd as f64).sqrt(), f64::from);
                    let lo = (i + 1).saturating_sub(s.mods.window.unwrap_or(usize::MAX));
                    let sc: Vec<f64> = (0..=i)
                        .map(|j| {
                            let kj = &k[(start + j) * kw + kvh * hd..][..hd];
                            let x = qi
                                .iter()
                                .zip(kj)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                                * scale;
                            let x = s
                                .mods
                                .softcap
                                .map_or(x, |c| (x / c as f64).tanh() * c as f64);
                            if j < lo {
                                f64::NEG_INFINITY
                            } else {
                                x
                            }
                        })
                        .collect();
                    let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, p) in e.iter().enumerate() {
                        let vj = &v[(start + j) * kw + kvh * hd..][..hd];
                        for d in 0..hd {
                            out[(start + i) * qw + h * hd + d] += p / z * vj[d] as f64;
                        }
                    }
                }
            }
            start += len;
        }
        out
    }

    fn values(n: usize, salt: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 3.0)
            .collect()
    }

    #[test]
    fn blocked_attention_matches_the_f64_definition_across_block_edges() {
        // 300 and 70 tokens cross both block sizes; 6 heads over 2 kv heads.
        let s = AttnShape {
            heads: 6,
            kv_heads: 2,
            head_dim: 16,
            mods: ScoreMods::default(),
        };
        let seq_lens = [300, 70, 1];
        let t: usize = seq_lens.iter().sum();
        let (q, k, v) = (values(t * 96, 1), values(t * 32, 2), values(t * 32, 3));
        let mut out = vec![0f32; t * 96];
        attention_strided(
            &q,
            RowLayout::packed(96),
            &k,
            RowLayout::packed(32),
            &v,
            RowLayout::packed(32),
            &mut out,
            RowLayout::packed(96),
            &seq_lens,
            s,
            &AtomicBool::new(false),
        )
        .unwrap();
        let want = naive(&q, &k, &v, &seq_lens, s);
        let worst = worst_abs(&out, &want);
        assert!(worst < 2e-5, "worst abs error {worst:e}");
    }

    #[test]
    fn query_heads_taken_in_chunks_per_task_match_the_f64_definition() {
        // Groups of 6 and 8 query heads per key/value head: more than `HEADS_PER_TASK`, so a
        // group is split over tasks (6 = 4 + 2); 130 tokens cross a query block.
        for (heads, kv_heads) in [(12, 2), (8, 1)] {
            let s = AttnShape {
                heads,
                kv_heads,
                head_dim: 8,
                mods: ScoreMods::default(),
            };
            let seq_lens = [130, 3];
            let t: usize = seq_lens.iter().sum();
            let (qw, kw) = (heads * 8, kv_heads * 8);
            let (q, k, v) = (values(t * qw, 10), values(t * kw, 11), values(t * kw, 12));
            let mut out = vec![f32::NAN; t * qw];
            let (qa, ka) = (RowLayout::packed(qw), RowLayout::packed(kw));
            let no = AtomicBool::new(false);
            attention_strided(&q, qa, &k, ka, &v, ka, &mut out, qa, &seq_lens, s, &no).unwrap();
            // Every output row written (a NaN left over would escape the max below).
            assert!(out.iter().all(|x| x.is_finite()));
            let want = naive(&q, &k, &v, &seq_lens, s);
            let worst = worst_abs(&out, &want);
            assert!(
                worst < 2e-5,
                "{heads}/{kv_heads} heads: worst abs error {worst:e}"
            );
        }
    }

    /// Gemma 2's attention: its own scale, scores soft-capped by tanh, a sliding window that
    /// crosses both block sizes (rows far down a 300-token sequence skip whole key blocks).
    #[test]
    fn windowed_soft_capped_attention_matches_the_f64_definition() {
        for window in [1, 4, 70, 300] {
            let s = AttnShape {
                heads: 4,
                kv_heads: 2,
                head_dim: 16,
                mods: ScoreMods {
                    scale: Some(0.3),
                    softcap: Some(1.5),
                    window: Some(window),
                },
            };
            let seq_lens = [300, 5];
            let t: usize = seq_lens.iter().sum();
            let (q, k, v) = (values(t * 64, 7), values(t * 32, 8), values(t * 32, 9));
            let mut out = vec![0f32; t * 64];
            let (qa, ka) = (RowLayout::packed(64), RowLayout::packed(32));
            let no = AtomicBool::new(false);
            attention_strided(&q, qa, &k, ka, &v, ka, &mut out, qa, &seq_lens, s, &no).unwrap();
            let want = naive(&q, &k, &v, &seq_lens, s);
            let worst = worst_abs(&out, &want);
            assert!(worst < 2e-5, "window {window}: worst abs error {worst:e}");
        }
        // A window of one: each token attends to itself only, so the output is its value.
        let s = AttnShape {
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            mods: ScoreMods {
                window: Some(1),
                ..ScoreMods::default()
            },
        };
        let (q, kv) = (values(6, 1), values(6, 2));
        let mut out = vec![0f32; 6];
        let l = RowLayout::packed(2);
        attention_strided(
            &q,
            l,
            &kv,
            l,
            &kv,
            l,
            &mut out,
            l,
            &[3],
            s,
            &AtomicBool::new(false),
        )
        .unwrap();
        assert_eq!(out, kv);
    }

    #[test]
    fn fused_qkv_columns_give_the_same_output_as_separate_tensors() {
        let s = AttnShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            mods: ScoreMods::default(),
        };
        let seq_lens = [90, 40];
        let t = 130;
        let (qw, kw) = (32, 16);
        let (q, k, v) = (values(t * qw, 4), values(t * kw, 5), values(t * kw, 6));
        let no = AtomicBool::new(false);
        let mut separate = vec![0f32; t * qw];
        attention_strided(
            &q,
            RowLayout::packed(qw),
            &k,
            RowLayout::packed(kw),
            &v,
            RowLayout::packed(kw),
            &mut separate,
            RowLayout::packed(qw),
            &seq_lens,
            s,
            &no,
        )
        .unwrap();
        // One [T, q + 2·kv] tensor, and an output with a wider row than it needs.
        let ld = qw + 2 * kw;
        let mut fused = vec![0f32; t * ld];
        for r in 0..t {
            fused[r * ld..r * ld + qw].copy_from_slice(&q[r * qw..(r + 1) * qw]);
            fused[r * ld + qw..r * ld + qw + kw].copy_from_slice(&k[r * kw..(r + 1) * kw]);
            fused[r * ld + qw + kw..(r + 1) * ld].copy_from_slice(&v[r * kw..(r + 1) * kw]);
        }
        let mut wide = vec![f32::NAN; t * 40 + 3];
        attention_strided(
            &fused,
            RowLayout { off: 0, ld },
            &fused,
            RowLayout { off: qw, ld },
            &fused,
            RowLayout { off: qw + kw, ld },
            &mut wide,
            RowLayout { off: 3, ld: 40 },
            &seq_lens,
            s,
            &no,
        )
        .unwrap();
        for r in 0..t {
            assert_eq!(
                &wide[3 + r * 40..3 + r * 40 + qw],
                &separate[r * qw..(r + 1) * qw]
            );
        }
    }

    #[test]
    fn a_set_cancel_flag_stops_it() {
        let s = AttnShape {
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            mods: ScoreMods::default(),
        };
        let mut out = vec![0f32; 4];
        let l = RowLayout::packed(2);
        let r = attention_strided(
            &[1.0; 4],
            l,
            &[1.0; 4],
            l,
            &[1.0; 4],
            l,
            &mut out,
            l,
            &[2],
            s,
            &AtomicBool::new(true),
        );
        assert!(matches!(r, Err(Error::Cancelled)));
    }
}

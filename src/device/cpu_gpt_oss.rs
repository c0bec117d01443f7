//! gpt-oss's host math: the attention sinks' share of each softmax, and the experts' clamped
//! SwiGLU (`swigluoai`) over gate and up interleaved.

use rayon::prelude::*;

use super::cpu_attention::AttnShape;

/// Scales each `(token, head)` row of a causal attention output `out` (`[T, heads·head_dim]`,
/// computed without sinks, window as `s.mods.window`) to the softmax with one more logit per
/// head, `sinks[h]`, in the denominator only (Hugging Face's `eager_attention_forward` for
/// gpt-oss; vLLM's FlashAttention `s_aux`): with `lse = log Σ exp(scores)` of the row, the
/// output becomes `out · 1 / (1 + exp(sink − lse))`.
pub fn apply_sinks(
    q: &[f32],
    k: &[f32],
    seq_lens: &[usize],
    s: AttnShape,
    sinks: &[f32],
    out: &mut [f32],
) {
    let (hd, heads, kvh) = (s.head_dim, s.heads, s.kv_heads);
    let group = heads / kvh;
    let scale = s.mods.scale.unwrap_or(1.0 / (hd as f32).sqrt());
    let window = s.mods.window.unwrap_or(usize::MAX);
    let (qw, kw) = (heads * hd, kvh * hd);
    let mut starts = Vec::with_capacity(seq_lens.len());
    let mut t0 = 0;
    for &n in seq_lens {
        starts.push((t0, n));
        t0 += n;
    }
    // Each token row of the output with the start of its sequence.
    let mut seq_of = Vec::with_capacity(t0);
    for &(start, n) in &starts {
        seq_of.extend(std::iter::repeat_n(start, n));
    }
    out.par_chunks_mut(qw).enumerate().for_each(|(t, row)| {
        let start = seq_of[t];
        let i = t - start;
        let first = (i + 1).saturating_sub(window);
        for h in 0..heads {
            let qh = &q[t * qw + h * hd..][..hd];
            let kv = h / group;
            let scores: Vec<f64> = (first..=i)
                .map(|j| {
                    let kj = &k[(start + j) * kw + kv * hd..][..hd];
                    qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() as f64 * scale as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + scores.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            let f = (1.0 / (1.0 + (sinks[h] as f64 - lse).exp())) as f32;
            for x in &mut row[h * hd..(h + 1) * hd] {
                *x *= f;
            }
        }
    });
}

/// `swigluoai` on one row of `gate_up` (`2·I` values, gate and up interleaved: gate `j` at
/// `2j`, up `j` at `2j + 1`) into `out` (`I`): `min(g, limit) · σ(α · min(g, limit)) ·
/// (clamp(u, ±limit) + 1)` (vLLM 0.19 activation.py `SwigluOAIAndMul.forward_native`;
/// transformers' `GptOssExperts._apply_gate`).
pub fn swiglu_oai(gate_up: &[f32], alpha: f32, limit: f32, out: &mut [f32]) {
    for (o, gu) in out.iter_mut().zip(gate_up.chunks_exact(2)) {
        let g = gu[0].min(limit);
        let u = gu[1].clamp(-limit, limit);
        *o = g / (1.0 + (-alpha * g).exp()) * (u + 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu_attention::ScoreMods;

    #[test]
    fn swiglu_oai_clamps_gate_above_and_up_both_ways() {
        let mut out = [0.0; 2];
        swiglu_oai(&[10.0, -10.0, 1.0, 0.5], 1.702, 7.0, &mut out);
        let s = |x: f32| 1.0 / (1.0 + (-1.702 * x).exp());
        assert!((out[0] - 7.0 * s(7.0) * (-7.0 + 1.0)).abs() < 1e-5);
        assert!((out[1] - 1.0 * s(1.0) * 1.5).abs() < 1e-6);
    }

    #[test]
    fn a_sink_takes_its_share_of_the_softmax() {
        // One token, one head: the softmax over {score, sink} gives the value weight
        // 1 / (1 + e^(sink − score)).
        let s = AttnShape {
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            mods: ScoreMods::default(),
        };
        let (q, k) = ([1.0, 1.0], [0.5, 0.5]);
        let mut out = [3.0, 4.0];
        apply_sinks(&q, &k, &[1], s, &[0.2], &mut out);
        let score = 1.0 / 2f64.sqrt();
        let w = 1.0 / (1.0 + (0.2 - score).exp());
        assert!((out[0] as f64 - 3.0 * w).abs() < 1e-6, "{out:?}");
    }
}

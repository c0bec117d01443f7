//! Multi-head latent attention's ops (vLLM's `MLAAttention`, 0.19
//! model_executor/layers/attention/mla_attention.py; docs/reading/vllm-mla.md): DeepSeek's YaRN
//! rotary embedding, GPT-J style (pairs of neighbouring dimensions), on the rope part of each
//! query head and on the one shared rope key, in place; the profile run's skipped attention with
//! its workspace transient; and, outside the profile run, the prefill attention over keys and
//! values expanded from the latent.

use crate::base::error::{Error, Result};
use crate::device::cpu::{self, AttnShape, ScoreMods};
use crate::device::cuda::MlaKvDims;
use crate::device::Backend;
use crate::engine::ops::cuda;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::Tensor;
use crate::memory::Category;

/// DeepSeek's rotary embedding (`DeepseekScalingRotaryEmbedding`, 0.19
/// rotary_embedding/deepseek_scaling_rope.py L25-114): YaRN's blend of interpolated and
/// extrapolated frequencies, cos and sin scaled by `mscale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnRope {
    pub rotary_dim: usize,
    pub base: f64,
    /// 1 for the plain rotary embedding (then the rest is unused).
    pub factor: f64,
    pub original_max_position: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// `get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)`.
    pub mscale: f64,
}

impl YarnRope {
    /// `inv_freq` of each pair (`_compute_inv_freq`, L61-84): the extrapolated frequency on
    /// the fast dimensions, the interpolated one (`/ factor`) on the slow ones, a linear ramp
    /// between the correction range's ends.
    pub fn inv_freq(&self) -> Vec<f64> {
        self.inv_freq_with(true)
    }

    /// `inv_freq` with the correction range's ends rounded to whole dimensions (`truncate`,
    /// DeepSeek's and 0.11.0's YaRN) or not (gpt-oss's `truncate: false` under 0.19,
    /// rotary_embedding/common.py `yarn_find_correction_range`).
    pub fn inv_freq_with(&self, truncate: bool) -> Vec<f64> {
        let d = self.rotary_dim;
        let pos: Vec<f64> = (0..d / 2)
            .map(|i| self.base.powf((2 * i) as f64 / d as f64))
            .collect();
        if self.factor == 1.0 {
            return pos.iter().map(|p| 1.0 / p).collect();
        }
        // `_yarn_find_correction_dim` and `_yarn_find_correction_range` (common.py).
        let dim_of = |rotations: f64| {
            d as f64
                * (self.original_max_position as f64 / (rotations * 2.0 * std::f64::consts::PI))
                    .ln()
                / (2.0 * self.base.ln())
        };
        let (low, high) = (dim_of(self.beta_fast), dim_of(self.beta_slow));
        let (low, high) = if truncate {
            (low.floor(), high.ceil())
        } else {
            (low, high)
        };
        let (low, high) = (low.max(0.0), high.min(d as f64 - 1.0));
        let high = if low == high { high + 0.001 } else { high };
        pos.iter()
            .enumerate()
            .map(|(i, p)| {
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolate = 1.0 - ramp;
                (1.0 / (self.factor * p)) * (1.0 - extrapolate) + (1.0 / p) * extrapolate
            })
            .collect()
    }

    /// `(cos, sin)` of every position and pair, scaled by `mscale`.
    fn table(&self, positions: &[usize]) -> Vec<(f32, f32)> {
        let inv = self.inv_freq();
        positions
            .iter()
            .flat_map(|&p| {
                inv.iter().map(move |f| {
                    let (s, c) = (p as f64 * f).sin_cos();
                    ((c * self.mscale) as f32, (s * self.mscale) as f32)
                })
            })
            .collect()
    }
}

/// The rotary embedding in place on `heads` slices of `rotary_dim` values in every token row
/// of `x` (`row` values a row), the slice of head `h` starting at `h · head_stride + offset`:
/// pairs `(2i, 2i + 1)` turn by pair `i`'s angle (`is_neox_style=False`). No allocation: vLLM
/// writes the rotated query back into `q[..., qk_nope_head_dim:]` (0.19 layers/mla.py L158).
pub fn rope_interleaved(
    rt: &Runtime,
    x: &mut Tensor,
    (heads, head_stride, offset): (usize, usize, usize),
    positions: &[usize],
    rope: &YarnRope,
) -> Result<()> {
    rt.check_cancel()?;
    rt.set_op("rotary_emb (deepseek yarn)");
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cpu => {
            let row = x.cols();
            let half = rope.rotary_dim / 2;
            let table = rope.table(positions);
            let data = x.f32_mut();
            for (t, cs) in table.chunks_exact(half.max(1)).enumerate() {
                for h in 0..heads {
                    let base = t * row + h * head_stride + offset;
                    for (i, &(cos, sin)) in cs.iter().enumerate() {
                        let (a, b) = (data[base + 2 * i], data[base + 2 * i + 1]);
                        data[base + 2 * i] = a * cos - b * sin;
                        data[base + 2 * i + 1] = b * cos + a * sin;
                    }
                }
            }
            Ok(())
        }
        Backend::Cuda => {
            let table = rope.table(positions);
            let half = rope.rotary_dim / 2;
            cuda(rt, |c| {
                c.rope_pairs(x, (heads, head_stride, offset), half, &table)
            })
        }
    }
}

/// What DeepSeek's MoE layers answer on CUDA: MLA, the dense MLPs and the fp16 scaling run
/// there, the grouped top-k routing and the shared experts do not yet.
pub(crate) fn moe_on_cuda() -> Error {
    Error::Request(
        "DeepSeek's MoE layers (grouped top-k routing, shared experts) have no CUDA kernels here yet: on CUDA only MLA models whose layers are all dense run (first_k_dense_replace >= num_hidden_layers); run this one on sim:PRESET"
            .into(),
    )
}

/// The profile run's MLA attention (no attention metadata): the layer's output
/// `torch.empty((T, heads · v_head_dim))` (0.19 mla_attention.py L492), then in
/// `forward_impl` the transient `torch.empty((W, heads, qk_nope + v_head_dim))` that stands
/// for the chunked-prefill context's worst case, freed as it returns, and the output filled
/// with zeros (L552-569; 0.11 v1/attention/backends/mla/common.py L1648-1662, 0.15.1
/// mla_attention.py L1959-1975).
pub fn attention_skipped(
    rt: &Runtime,
    q: &Tensor,
    (heads, v_head_dim, workspace): (usize, usize, [usize; 2]),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("mla attention (skipped: profile run)");
    let out = rt.tensor(
        name,
        Category::Activation,
        &[q.rows(), heads * v_head_dim],
        q.dtype,
    )?;
    let [tokens, width] = workspace;
    drop(rt.tensor_for_overwrite(
        format!("{name}.chunked_prefill_workspace"),
        Category::Activation,
        &[tokens, heads, width],
        q.dtype,
    )?);
    rt.capture_break()?;
    Ok(out)
}

/// The shapes of MLA's prefill attention on this rank.
#[derive(Clone, Copy, Debug)]
pub struct MlaDims {
    pub heads: usize,
    pub qk_nope: usize,
    pub qk_rope: usize,
    pub v_head: usize,
    pub scale: f32,
}

/// MLA's prefill attention outside the profile run (`forward_mha`, 0.19 mla_attention.py):
/// `kv` (`kv_b_proj` of the normed latent, `[T, heads · (qk_nope + v_head)]`) gives each
/// head's key without rotary and its value; the key is that and the one rotary key `k_pe`
/// (`[T, qk_rope]`), the value padded with zeros to the query's width for the varlen kernel.
/// Both are new tensors, as is the kernel's output; the layer's output `[T, heads · v_head]`
/// takes each head's first `v_head` values. Causal, one sequence after another.
pub fn prefill_attention(
    rt: &Runtime,
    q: &Tensor,
    kv: &Tensor,
    k_pe: &Tensor,
    seq_lens: &[usize],
    d: MlaDims,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("mla attention (prefill)");
    let t = q.rows();
    let qk = d.qk_nope + d.qk_rope;
    let t_new = |n: &str, cols: usize| {
        rt.tensor_for_overwrite(
            format!("{name}.{n}"),
            Category::Activation,
            &[t, d.heads * cols],
            q.dtype,
        )
    };
    let mut k = t_new("k", qk)?;
    let mut v = t_new("v_padded", qk)?;
    let shape = AttnShape {
        heads: d.heads,
        kv_heads: d.heads,
        head_dim: qk,
        mods: ScoreMods {
            scale: Some(d.scale),
            ..ScoreMods::default()
        },
    };
    let mut full = t_new("attn_out", qk)?;
    let mut out = rt.tensor_for_overwrite(
        name,
        Category::Activation,
        &[t, d.heads * d.v_head],
        q.dtype,
    )?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let (kvw, kv_src, pe) = (d.qk_nope + d.v_head, kv.f32(), k_pe.f32());
            let (kd, vd) = (k.f32_mut(), v.f32_mut());
            vd.fill(0.0);
            for r in 0..t {
                for h in 0..d.heads {
                    let src = &kv_src[r * d.heads * kvw + h * kvw..][..kvw];
                    let dst = r * d.heads * qk + h * qk;
                    kd[dst..dst + d.qk_nope].copy_from_slice(&src[..d.qk_nope]);
                    kd[dst + d.qk_nope..dst + qk]
                        .copy_from_slice(&pe[r * d.qk_rope..(r + 1) * d.qk_rope]);
                    vd[dst..dst + d.v_head].copy_from_slice(&src[d.qk_nope..]);
                }
            }
            let c = rt.cancel_flag();
            cpu::attention(
                q.f32(),
                k.f32(),
                v.f32(),
                seq_lens,
                shape,
                full.f32_mut(),
                &c,
            )?;
            let (f, o) = (full.f32(), out.f32_mut());
            for r in 0..t {
                for h in 0..d.heads {
                    let at = r * d.heads * qk + h * qk;
                    o[r * d.heads * d.v_head + h * d.v_head..][..d.v_head]
                        .copy_from_slice(&f[at..at + d.v_head]);
                }
            }
        }
        Backend::Cuda => {
            let dims = MlaKvDims {
                heads: d.heads,
                nope: d.qk_nope,
                rope: d.qk_rope,
                v_head: d.v_head,
            };
            cuda(rt, |c| {
                c.mla_kv(kv, k_pe, (&mut k, &mut v), dims)?;
                c.attention(q, &k, &v, seq_lens, shape, &mut full)?;
                c.mla_take_v(&full, &mut out, (d.heads, qk, d.v_head))
            })?;
        }
    }
    drop(full);
    drop((k, v));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::YarnRope;

    /// DeepSeek-V2-Lite's rotary (64 dims, base 10000, factor 40 over 4096 positions, beta 32
    /// and 1): the first pairs keep their frequency, the last are divided by 40, those between
    /// blend on a ramp from dimension 10 to 23 (the correction range
    /// `_yarn_find_correction_range(32, 1, 64, 10000, 4096)`).
    #[test]
    fn yarn_keeps_fast_pairs_and_interpolates_slow_ones() {
        let r = YarnRope {
            rotary_dim: 64,
            base: 10000.0,
            factor: 40.0,
            original_max_position: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
        };
        let f = r.inv_freq();
        let plain = |i: usize| 1.0 / 10000f64.powf(2.0 * i as f64 / 64.0);
        assert_eq!(f.len(), 32);
        for (i, x) in f.iter().enumerate().take(11) {
            assert!((x - plain(i)).abs() < 1e-15, "{i}");
        }
        for (i, x) in f.iter().enumerate().skip(23) {
            assert!((x - plain(i) / 40.0).abs() < 1e-15, "{i}");
        }
        // Halfway up the ramp (low 10, high 23): ramp (16 − 10) / 13.
        let ramp = 6.0 / 13.0;
        let want = plain(16) / 40.0 * ramp + plain(16) * (1.0 - ramp);
        assert!((f[16] - want).abs() < 1e-15);
    }
}

//! The ops Qwen3-Next's layers need beyond the Llama family's (vLLM's qwen3_next.py and the
//! Gated DeltaNet kernels under model_executor/layers/fla/ops and layers/mamba/ops, 0.10.2 and
//! 0.19.0): the gated attention's query/gate split and sigmoid gate, the Gated DeltaNet's
//! reordering of its fused projection, the causal depthwise convolution, the decay and
//! write-strength gating, the gated delta rule over each sequence, and the gated RMSNorm.
//! Like `ops`, each allocates through the framework allocator (the tensors vLLM's code makes,
//! in its order), then runs on the CPU or not at all (dry); there are no CUDA kernels for
//! them, so the model is refused on CUDA when it loads.

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// The one line these ops answer on CUDA.
pub(crate) fn on_cuda() -> Error {
    Error::Request(
        "Qwen3-Next (Gated DeltaNet, gated attention) runs on simulated devices only so far: its conv, gating and delta-rule kernels have no CUDA implementation here; run it on sim:PRESET"
            .into(),
    )
}

fn act(rt: &Runtime, name: impl Into<String>, shape: &[usize], dtype: DType) -> Result<Tensor> {
    rt.tensor_for_overwrite(name, Category::Activation, shape, dtype)
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `Qwen3NextAttention.forward` (0.10.2 qwen3_next.py L703-736): `q_gate` (`[T, heads · 2 ·
/// hd]`, each head's query then its gate) viewed per head, `torch.chunk` into views, each
/// `reshape`d into a new contiguous `[T, heads · hd]` (the views are strided): the query, then
/// the gate.
pub fn split_q_gate(
    rt: &Runtime,
    q_gate: &Tensor,
    (heads, hd): (usize, usize),
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    rt.set_op("qwen3_next.split_q_gate");
    let t = q_gate.rows();
    let mut q = act(rt, format!("{name}.q"), &[t, heads * hd], q_gate.dtype)?;
    let mut g = act(rt, format!("{name}.gate"), &[t, heads * hd], q_gate.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let src = q_gate.f32();
            let (qd, gd) = (q.f32_mut(), g.f32_mut());
            for r in 0..t {
                for h in 0..heads {
                    let s = r * heads * 2 * hd + h * 2 * hd;
                    let d = r * heads * hd + h * hd;
                    qd[d..d + hd].copy_from_slice(&src[s..s + hd]);
                    gd[d..d + hd].copy_from_slice(&src[s + hd..s + 2 * hd]);
                }
            }
        }
        Backend::Cuda => return Err(on_cuda()),
    }
    Ok((q, g))
}

/// `fused_qk_rmsnorm_rope_gate` (0.24.0 models/qwen3_next.py L313-338;
/// layers/fused_qk_norm_rope.py L155-162) before its rotary: from `q_gate` (each head's query
/// then its gate) and `k`, new `q_out` `[T, heads·hd]` (normalised by `(1 + w)` per head),
/// `k_out` `[T, kvh·hd]` and `gate_out` (the gate copied), where the unfused path makes the
/// split's copies and the norms' outputs. `tiny`: the call's arguments
/// `q_norm.weight.float() + 1.0` and the same for k (0.24 to 0.28), each an f32 `[hd]` copy
/// dying as the sum is made, the sums as the call returns. The caller applies the rotary in
/// place (the kernel's, no tensor).
pub fn fused_qk_norm_gate(
    rt: &Runtime,
    (q_gate, k): (&Tensor, &Tensor),
    (q_w, k_w): (&Tensor, &Tensor),
    eps: f32,
    (heads, kvh, hd): (usize, usize, usize),
    tiny: bool,
    name: &str,
) -> Result<(Tensor, Tensor, Tensor)> {
    rt.check_cancel()?;
    rt.set_op("qwen3_next.fused_qk_rmsnorm_rope_gate");
    let mut weights = Vec::new();
    if tiny {
        for n in ["q_norm", "k_norm"] {
            let copy = act(rt, format!("{name}.{n}.weight.float"), &[hd], DType::F32)?;
            weights.push(act(
                rt,
                format!("{name}.{n}.weight_plus_one"),
                &[hd],
                DType::F32,
            )?);
            drop(copy);
        }
    }
    let t = q_gate.rows();
    let mut q_out = act(rt, format!("{name}.q_out"), &[t, heads * hd], q_gate.dtype)?;
    let mut k_out = act(rt, format!("{name}.k_out"), &[t, kvh * hd], k.dtype)?;
    let mut gate_out = act(
        rt,
        format!("{name}.gate_out"),
        &[t, heads * hd],
        q_gate.dtype,
    )?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let src = q_gate.f32();
            let mut q = vec![0.0f32; t * heads * hd];
            let gd = gate_out.f32_mut();
            for r in 0..t {
                for h in 0..heads {
                    let s = r * heads * 2 * hd + h * 2 * hd;
                    let d = r * heads * hd + h * hd;
                    q[d..d + hd].copy_from_slice(&src[s..s + hd]);
                    gd[d..d + hd].copy_from_slice(&src[s + hd..s + 2 * hd]);
                }
            }
            crate::device::cpu_gemma::gemma_rms_norm(&q, q_w.f32(), eps, q_out.f32_mut());
            crate::device::cpu_gemma::gemma_rms_norm(k.f32(), k_w.f32(), eps, k_out.f32_mut());
        }
        Backend::Cuda => return Err(on_cuda()),
    }
    drop(weights);
    Ok((q_out, k_out, gate_out))
}

/// `attn_output * torch.sigmoid(gate)` (L733-735): the sigmoid into a new tensor, the product
/// into another, the sigmoid dying as the layer rebinds `gate`... at its return; here as soon
/// as the product is made (both die before `o_proj`'s output is read back).
pub fn sigmoid_gate(rt: &Runtime, x: &Tensor, gate: &Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("qwen3_next.sigmoid_gate");
    let mut s = act(rt, format!("{name}.sigmoid"), &gate.shape, gate.dtype)?;
    let mut out = act(rt, name.to_string(), &x.shape, x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            for (o, &g) in s.f32_mut().iter_mut().zip(gate.f32()) {
                *o = sigmoid(g);
            }
            for ((o, &a), &g) in out.f32_mut().iter_mut().zip(x.f32()).zip(s.f32()) {
                *o = a * g;
            }
        }
        Backend::Cuda => return Err(on_cuda()),
    }
    drop(s);
    Ok(out)
}

/// The Gated DeltaNet's shape on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnDims {
    /// Key heads and value heads on this rank.
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub kernel: usize,
}

impl GdnDims {
    /// `[q | k | v]` channels on this rank.
    pub fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    fn per_group(&self) -> usize {
        self.v_heads / self.k_heads
    }
}

/// `fix_query_key_value_ordering` and the `torch.cat` after it (0.10.2 qwen3_next.py
/// L316-363, L443-451): `qkvz` holds, per key head, its query, key, `v_heads / k_heads`
/// values and as many z; `ba` per key head its b's then a's. The query, key and value are
/// concatenated into a new `mixed_qkv [T, conv_dim]` (`[q of every head | k | v]`); `z`
/// (`[T, v_heads · v_dim]`), `b` and `a` (`[T, v_heads]`) are reshaped out of strided views,
/// new tensors each. Returns `(mixed_qkv, z, b, a)`.
pub fn reorder_qkvz(
    rt: &Runtime,
    qkvz: &Tensor,
    ba: &Tensor,
    d: GdnDims,
    name: &str,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    rt.check_cancel()?;
    rt.set_op("gdn.fix_query_key_value_ordering");
    let t = qkvz.rows();
    let dt = qkvz.dtype;
    let vw = d.v_heads * d.v_dim;
    let mut z = act(rt, format!("{name}.z"), &[t, vw], dt)?;
    let mut b = act(rt, format!("{name}.b"), &[t, d.v_heads], dt)?;
    let mut a = act(rt, format!("{name}.a"), &[t, d.v_heads], dt)?;
    let mut mixed = act(rt, format!("{name}.mixed_qkv"), &[t, d.conv_dim()], dt)?;
    fill_reorder(rt, (qkvz, ba), d, [&mut mixed, &mut z, &mut b, &mut a])?;
    Ok((mixed, z, b, a))
}

/// The values `reorder_qkvz` writes, on the host: `mixed_qkv`, `z`, `b` and `a` from the two
/// projections' outputs.
fn fill_reorder(
    rt: &Runtime,
    (qkvz, ba): (&Tensor, &Tensor),
    d: GdnDims,
    [mixed, z, b, a]: [&mut Tensor; 4],
) -> Result<()> {
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cpu => {
            let t = qkvz.rows();
            let vw = d.v_heads * d.v_dim;
            let (src, bsrc) = (qkvz.f32(), ba.f32());
            let g = d.per_group();
            let group = 2 * d.k_dim + 2 * g * d.v_dim;
            let kw = d.k_heads * d.k_dim;
            let (cd, zd, bd, ad) = (d.conv_dim(), z.f32_mut(), b.f32_mut(), a.f32_mut());
            let md = mixed.f32_mut();
            for r in 0..t {
                for kh in 0..d.k_heads {
                    let s = r * d.k_heads * group + kh * group;
                    let m = r * cd;
                    let (q0, k0, v0, z0) = (
                        s,
                        s + d.k_dim,
                        s + 2 * d.k_dim,
                        s + 2 * d.k_dim + g * d.v_dim,
                    );
                    md[m + kh * d.k_dim..m + (kh + 1) * d.k_dim]
                        .copy_from_slice(&src[q0..q0 + d.k_dim]);
                    md[m + kw + kh * d.k_dim..m + kw + (kh + 1) * d.k_dim]
                        .copy_from_slice(&src[k0..k0 + d.k_dim]);
                    let vo = m + 2 * kw + kh * g * d.v_dim;
                    md[vo..vo + g * d.v_dim].copy_from_slice(&src[v0..v0 + g * d.v_dim]);
                    let zo = r * vw + kh * g * d.v_dim;
                    zd[zo..zo + g * d.v_dim].copy_from_slice(&src[z0..z0 + g * d.v_dim]);
                    let bs = r * d.k_heads * 2 * g + kh * 2 * g;
                    let bo = r * d.v_heads + kh * g;
                    bd[bo..bo + g].copy_from_slice(&bsrc[bs..bs + g]);
                    ad[bo..bo + g].copy_from_slice(&bsrc[bs + g..bs + 2 * g]);
                }
            }
            Ok(())
        }
        Backend::Cuda => Err(on_cuda()),
    }
}

/// What `fix_query_key_value_ordering`, the `rearrange`s and the `torch.cat` make in eager
/// order where the profile run reaches them (0.15.1 models/qwen3_next.py L370-419, L461-464;
/// 0.19.0 layers/mamba/gdn_linear_attn.py L463-466, L522-525): `value` and `z` (`[T, vh·dv]`)
/// and `b` and `a` (`[T, vh]`), each a `reshape` of a strided split, so a copy; the `query`
/// and `key` (`[T, kh·dk]`), `rearrange`d out of strided views, copies too; then `mixed_qkv`
/// (`[T, conv_dim]`). With one key head on a rank these are views: refused by the caller.
pub struct EagerReorder {
    pub value: Tensor,
    pub z: Tensor,
    pub b: Tensor,
    pub a: Tensor,
    pub query: Tensor,
    pub key: Tensor,
    pub mixed: Tensor,
}

pub fn reorder_qkvz_eager(
    rt: &Runtime,
    qkvz: &Tensor,
    ba: &Tensor,
    d: GdnDims,
    name: &str,
) -> Result<EagerReorder> {
    rt.check_cancel()?;
    rt.set_op("gdn.fix_query_key_value_ordering");
    let (t, dt) = (qkvz.rows(), qkvz.dtype);
    let (kw, vw) = (d.k_heads * d.k_dim, d.v_heads * d.v_dim);
    let mut value = act(rt, format!("{name}.value"), &[t, vw], dt)?;
    let mut z = act(rt, format!("{name}.z"), &[t, vw], dt)?;
    let mut b = act(rt, format!("{name}.b"), &[t, d.v_heads], dt)?;
    let mut a = act(rt, format!("{name}.a"), &[t, d.v_heads], dt)?;
    rt.set_op("gdn.rearrange_qk");
    let mut query = act(rt, format!("{name}.query"), &[t, kw], dt)?;
    let mut key = act(rt, format!("{name}.key"), &[t, kw], dt)?;
    rt.set_op("gdn.cat_mixed_qkv");
    let mut mixed = act(rt, format!("{name}.mixed_qkv"), &[t, d.conv_dim()], dt)?;
    fill_reorder(rt, (qkvz, ba), d, [&mut mixed, &mut z, &mut b, &mut a])?;
    if rt.backend() == Backend::Cpu {
        let cd = d.conv_dim();
        let md = mixed.f32();
        let (qd, kd, vd) = (query.f32_mut(), key.f32_mut(), value.f32_mut());
        for r in 0..t {
            let m = &md[r * cd..(r + 1) * cd];
            qd[r * kw..(r + 1) * kw].copy_from_slice(&m[..kw]);
            kd[r * kw..(r + 1) * kw].copy_from_slice(&m[kw..2 * kw]);
            vd[r * vw..(r + 1) * vw].copy_from_slice(&m[2 * kw..]);
        }
    }
    Ok(EagerReorder {
        value,
        z,
        b,
        a,
        query,
        key,
        mixed,
    })
}

/// `torch.zeros(...)`: a tensor the op fills with zeros (0.15.1 qwen3_next.py L471-475: the
/// `core_attn_out` that `gdn_attention_core` leaves as made in the profile run).
pub fn zeros(rt: &Runtime, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
    rt.set_op("gdn.zeros");
    rt.tensor(name.to_string(), Category::Activation, shape, dtype)
}

/// Which kernels `_warmup_prefill_kernels` runs (`engine::rules::GdnWarmup`) and whether this
/// is the process's first warm-up, whose Triton kernels benchmark their configs.
pub struct Warmup {
    pub backend: crate::engine::rules::GdnWarmup,
    pub autotunes: bool,
    /// The recurrent state's dtype (`mamba_ssm_cache_dtype`, auto: the model's).
    pub state: DType,
    /// 0.21's one pass through `fused_post_conv_prep` (`GdnRules::warmup_post_conv`).
    pub post_conv: bool,
    /// 0.33's extra FlashInfer calls (`GdnRules::flashinfer_variants`).
    pub flashinfer_variants: bool,
}

/// Triton's L2-flush buffer that `triton.testing.do_bench` takes from PyTorch's allocator for
/// each benchmark of an autotune (`torch.empty(64M, int32)`), freed after it: 256 MiB above
/// what is live (measured with Triton 3.6 on an H100, docs/gpu-runs.md run 98).
pub const TRITON_AUTOTUNE_FLUSH_BYTES: usize = 256 << 20;

/// 0.19's `_warmup_prefill_kernels` (layers/mamba/gdn_linear_attn.py L567-665) on this rank's
/// heads: for `T` in 16, 32 and 64, the dummy `q`, `k` (`[1, T, kh, dk]`), `v` (`[1, T, vh, dv]`),
/// `dummy_a`, `dummy_b` (`[T, vh]`), `fused_gdn_gating`'s `g` (f32) and `beta` (`[1, T, vh]`,
/// L1030-1031), the zeroed state `[1, vh, dv, dk]` and `cu_seqlens` `[2]` i32, then the
/// chunked delta rule, its results discarded and every tensor deleted at the pass's end (L663);
/// after the three passes `torch.accelerator.empty_cache()` (L665).
/// - FlashInfer (`fi_chunk_gated_delta_rule`, L63-109): `l2norm_fwd` of q and k (new tensors;
///   fla/ops/l2norm.py L95-103, its default kernel not autotuned), the state in f32 (a copy
///   unless it is f32), `beta` in f32, `exp(g)` (`[T, vh]` f32), then FlashInfer's output
///   `[T, max(kh, vh), dk]` and final state `[1, vh, dk, dk]` f32, `cu_seqlens` in int64
///   (flashinfer's gdn_prefill; its internals not read).
/// - Triton (`fla_chunk_gated_delta_rule`, fla/ops/chunk.py L24-103): l2norm'd q and k, the
///   chunk-local cumsum of g (f32), `A` `[1, T, vh, 64]` f32, `solve_tril`'s zeroed `Ai` (the
///   model dtype; `A` dies), `u`, `w`, `h` `[1, 1, vh, dv, dk]`, the final state (f32),
///   `v_new`, and `o`. The first warm-up of the process benchmarks the autotuned kernels:
///   `TRITON_AUTOTUNE_FLUSH_BYTES` above what is live, at `chunk_fwd_o` (whose key, the chunk
///   size, changes with each `T`), the last and largest point of each pass.
pub fn warmup_prefill(
    rt: &Runtime,
    d: GdnDims,
    act_dt: DType,
    w: &Warmup,
    name: &str,
) -> Result<()> {
    let passes: &[usize] = if w.post_conv { &[64] } else { &[16, 32, 64] };
    for &t in passes {
        rt.check_cancel()?;
        rt.set_op("gdn.warmup_prefill");
        let n = |s: &str| format!("{name}.warmup{t}.{s}");
        let inputs = if w.post_conv {
            warmup_inputs_post_conv(rt, d, act_dt, t, &n)?
        } else {
            warmup_inputs(rt, d, act_dt, t, &n)?
        };
        let state = zeros(rt, &n("state"), &[1, d.v_heads, d.v_dim, d.k_dim], w.state)?;
        rt.set_op("gdn.warmup_prefill");
        let cu = act(rt, n("cu_seqlens"), &[2], DType::I32)?;
        warmup_rule(rt, d, (act_dt, t, w), !w.post_conv, &n)?;
        if w.flashinfer_variants && w.backend == crate::engine::rules::GdnWarmup::FlashInfer {
            flashinfer_variants(rt, d, act_dt, w, name)?;
        }
        drop((state, cu));
        drop(inputs);
    }
    rt.empty_cache();
    Ok(())
}

/// 0.19's dummy inputs of one pass (L609-624): `q`, `k`, `v`, `dummy_a`, `dummy_b`, then
/// `fused_gdn_gating`'s `g` (f32) and `beta` (the model dtype).
fn warmup_inputs(
    rt: &Runtime,
    d: GdnDims,
    act_dt: DType,
    t: usize,
    n: &dyn Fn(&str) -> String,
) -> Result<Vec<Tensor>> {
    let (kh, vh, dk, dv) = (d.k_heads, d.v_heads, d.k_dim, d.v_dim);
    Ok(vec![
        act(rt, n("q"), &[1, t, kh, dk], act_dt)?,
        act(rt, n("k"), &[1, t, kh, dk], act_dt)?,
        act(rt, n("v"), &[1, t, vh, dv], act_dt)?,
        act(rt, n("dummy_a"), &[t, vh], act_dt)?,
        act(rt, n("dummy_b"), &[t, vh], act_dt)?,
        act(rt, n("g"), &[1, t, vh], DType::F32)?,
        act(rt, n("beta"), &[1, t, vh], act_dt)?,
    ])
}

/// 0.21's dummy inputs of its one pass (0.21.0 gdn_linear_attn.py L925-946): the dummy conv
/// output `[T, conv_dim]`, `dummy_a`, `dummy_b`, then `fused_post_conv_prep`'s `q`, `k`
/// (`[T, kh, dk]`), `v` (`[T, vh, dv]`), `g` and `beta` (`[T, vh]` f32; fla/ops/
/// fused_gdn_prefill_post_conv.py L199-203).
fn warmup_inputs_post_conv(
    rt: &Runtime,
    d: GdnDims,
    act_dt: DType,
    t: usize,
    n: &dyn Fn(&str) -> String,
) -> Result<Vec<Tensor>> {
    let (kh, vh, dk, dv) = (d.k_heads, d.v_heads, d.k_dim, d.v_dim);
    Ok(vec![
        act(rt, n("dummy_mixed_qkv"), &[t, d.conv_dim()], act_dt)?,
        act(rt, n("dummy_a"), &[t, vh], act_dt)?,
        act(rt, n("dummy_b"), &[t, vh], act_dt)?,
        act(rt, n("q"), &[t, kh, dk], act_dt)?,
        act(rt, n("k"), &[t, kh, dk], act_dt)?,
        act(rt, n("v"), &[t, vh, dv], act_dt)?,
        act(rt, n("g"), &[t, vh], DType::F32)?,
        act(rt, n("beta"), &[t, vh], DType::F32)?,
    ])
}

/// The chunked delta rule of one warm-up pass, its results discarded; `l2norm`: the rule
/// normalises q and k itself (0.19), not from 0.21. With FlashInfer, `beta` converted to f32
/// only where it is not f32 already (0.19's is the model dtype, 0.21's f32), `exp(g)` always.
fn warmup_rule(
    rt: &Runtime,
    d: GdnDims,
    (act_dt, t, w): (DType, usize, &Warmup),
    l2norm: bool,
    n: &dyn Fn(&str) -> String,
) -> Result<()> {
    use crate::engine::rules::GdnWarmup;
    let (kh, vh, dk, dv) = (d.k_heads, d.v_heads, d.k_dim, d.v_dim);
    rt.set_op("gdn.warmup_prefill.delta_rule");
    let normed = if l2norm {
        vec![
            act(rt, n("q.l2norm"), &[1, t, kh, dk], act_dt)?,
            act(rt, n("k.l2norm"), &[1, t, kh, dk], act_dt)?,
        ]
    } else {
        Vec::new()
    };
    match w.backend {
        GdnWarmup::FlashInfer => {
            flashinfer_call(rt, d, (act_dt, t, w), n, "")?;
            drop(normed);
        }
        GdnWarmup::Triton => {
            let g_cum = act(rt, n("g_cumsum"), &[1, t, vh], DType::F32)?;
            let a_kkt = act(rt, n("A"), &[1, t, vh, 64], DType::F32)?;
            let ai = zeros(rt, &n("Ai"), &[1, t, vh, 64], act_dt)?;
            rt.set_op("gdn.warmup_prefill.delta_rule");
            drop(a_kkt);
            let u = act(rt, n("u"), &[1, t, vh, dv], act_dt)?;
            let w_ = act(rt, n("w"), &[1, t, vh, dk], act_dt)?;
            let h = act(rt, n("h"), &[1, 1, vh, dv, dk], act_dt)?;
            let final_state = act(rt, n("final_state"), &[1, vh, dv, dk], DType::F32)?;
            let v_new = act(rt, n("v_new"), &[1, t, vh, dv], act_dt)?;
            let o = act(rt, n("o"), &[1, t, vh, dv], act_dt)?;
            if w.autotunes {
                rt.set_op("triton.autotune");
                drop(act(
                    rt,
                    n("triton_autotune_l2_flush"),
                    &[TRITON_AUTOTUNE_FLUSH_BYTES / 4],
                    DType::I32,
                )?);
            }
            drop((v_new, h, w_, u, ai, g_cum));
            drop((o, final_state));
            drop(normed);
        }
    }
    Ok(())
}

/// One `fi_chunk_gated_delta_rule` call of the warm-up (0.19.0 gdn_linear_attn.py L63-109;
/// 0.33.0 L313-372): the state in f32 (a copy unless it is f32), `beta` in f32 where it is not
/// (0.19's), `exp(g)`, `cu_seqlens` in int64, FlashInfer's output and final state; all dying as
/// the call returns. `tag` names a variant call.
fn flashinfer_call(
    rt: &Runtime,
    d: GdnDims,
    (act_dt, t, w): (DType, usize, &Warmup),
    n: &dyn Fn(&str) -> String,
    tag: &str,
) -> Result<()> {
    let (kh, vh, dk, dv) = (d.k_heads, d.v_heads, d.k_dim, d.v_dim);
    let m = |s: &str| n(&format!("{tag}{s}"));
    let fi_state = (w.state != DType::F32)
        .then(|| act(rt, m("fi_state"), &[1, vh, dv, dk], DType::F32))
        .transpose()?;
    let fi_beta = (!w.post_conv)
        .then(|| act(rt, m("fi_beta"), &[t, vh], DType::F32))
        .transpose()?;
    let exp_g = act(rt, m("exp_g"), &[t, vh], DType::F32)?;
    let cu64 = act(rt, m("cu_seqlens.i64"), &[2], DType::I64)?;
    let out = act(rt, m("output"), &[t, kh.max(vh), dk], act_dt)?;
    let out_state = act(rt, m("output_state"), &[1, vh, dk, dk], DType::F32)?;
    drop(cu64);
    drop((exp_g, out, out_state));
    drop((fi_state, fi_beta));
    Ok(())
}

/// 0.33's `_warmup_flashinfer_prefill_variants` after the main call, without prefix-caching
/// checkpoints (0.33.0 layers/mamba/gdn/qwen_gdn_linear_attn.py L1450-1492): `cu_seqlens` `[2]`
/// i32 and `checkpoint_cu_starts` `[2]` i64, then one call for each `use_cp` of ("auto",
/// False). With checkpoints (prefix caching on) vramscope refuses the start before the pass.
pub fn flashinfer_variants(
    rt: &Runtime,
    d: GdnDims,
    act_dt: DType,
    w: &Warmup,
    name: &str,
) -> Result<()> {
    let t = 64;
    let n = |s: &str| format!("{name}.warmup{t}.{s}");
    rt.set_op("gdn.warmup_prefill.variants");
    let cu = act(rt, n("variants.cu_seqlens"), &[2], DType::I32)?;
    let starts = act(rt, n("variants.checkpoint_cu_starts"), &[2], DType::I64)?;
    for tag in ["cp_auto.", "cp_off."] {
        flashinfer_call(rt, d, (act_dt, t, w), &n, tag)?;
    }
    drop((cu, starts));
    Ok(())
}

/// `causal_conv1d_fn` over each sequence (prefill: 0.10.2 layers/mamba/ops/causal_conv1d.py,
/// called from qwen3_next.py L490-500): a depthwise convolution of `kernel` taps over the
/// sequence's past tokens (zeros before its start), then SiLU, into a new `[T, C]`. `w` is
/// the conv1d weight `[C, kernel]`.
pub fn causal_conv1d(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    seq_lens: &[usize],
    kernel: usize,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("gdn.causal_conv1d");
    let (t, c) = (x.rows(), x.cols());
    let mut out = act(rt, name.to_string(), &[t, c], x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let (xd, wd, od) = (x.f32(), w.f32(), out.f32_mut());
            let mut start = 0;
            for &n in seq_lens {
                for i in 0..n {
                    for ch in 0..c {
                        let mut acc = 0.0f32;
                        for j in 0..kernel {
                            // Tap j reads token i − (kernel − 1 − j).
                            let back = kernel - 1 - j;
                            if i >= back {
                                acc += wd[ch * kernel + j] * xd[(start + i - back) * c + ch];
                            }
                        }
                        od[(start + i) * c + ch] = silu(acc);
                    }
                }
                start += n;
            }
        }
        Backend::Cuda => return Err(on_cuda()),
    }
    Ok(out)
}

/// `beta = b.sigmoid()` (a new tensor in b's dtype) and `fused_gdn_gating` (0.10.2
/// qwen3_next.py L1251-1298: `g = −exp(A_log) · softplus(a + dt_bias)`, a new f32 tensor):
/// `(g, beta)`, each `[T, v_heads]`.
pub fn gating(
    rt: &Runtime,
    a: &Tensor,
    b: &Tensor,
    (a_log, dt_bias): (&Tensor, &Tensor),
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    rt.set_op("gdn.gating");
    let mut beta = act(rt, format!("{name}.beta"), &b.shape, b.dtype)?;
    let mut g = act(rt, format!("{name}.g"), &a.shape, DType::F32)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            for (o, &x) in beta.f32_mut().iter_mut().zip(b.f32()) {
                *o = sigmoid(x);
            }
            let (al, db) = (a_log.f32(), dt_bias.f32());
            let h = al.len();
            for (i, (o, &x)) in g.f32_mut().iter_mut().zip(a.f32()).enumerate() {
                let v = x + db[i % h];
                // F.softplus with threshold 20: linear above it.
                let sp = if v > 20.0 { v } else { v.exp().ln_1p() };
                *o = -al[i % h].exp() * sp;
            }
        }
        Backend::Cuda => return Err(on_cuda()),
    }
    Ok((g, beta))
}

/// The gated delta rule over each sequence from a zero state, as vLLM's prefill runs it
/// (`chunk_gated_delta_rule` with `use_qk_l2norm_in_kernel=True`, 0.10.2 layers/fla/ops/
/// chunk.py): the query and key L2-normalised (`l2norm_fwd`: a new tensor each), then the fla
/// chunked kernels' buffers in their order (chunk.py L25-66: the local cumsum of g in f32,
/// `A [T, H, 64]` f32, its inverse in the key's dtype, `w [T, H, K]` and `u [T, H, V]`, the
/// chunk states `h [NT, H, K, V]`, `v_new`, the final state `[N, H, K, V]` f32 and the output
/// `o [T, H, V]`), the intermediates dying as the function returns. The output is computed
/// here token by token (the recurrence the chunked form equals): per value head the state
/// `S` (`[K, V]`) decays by `exp(g)`, takes `k ⊗ β(v − Sᵀk)`, and answers `Sᵀq / √K`. Query and
/// key heads serve `v_heads / k_heads` consecutive value heads each. Returns `o` and the final
/// states (f32, `[N, H, K, V]`) which vLLM writes into the cache.
pub fn chunk_gated_delta_rule(
    rt: &Runtime,
    mixed: &Tensor,
    (g, beta): (&Tensor, &Tensor),
    seq_lens: &[usize],
    d: GdnDims,
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    rt.set_op("gdn.chunk_gated_delta_rule");
    let t = mixed.rows();
    let dt = mixed.dtype;
    let (h, k, v) = (d.v_heads, d.k_dim, d.v_dim);
    let kw = d.k_heads * k;
    const BT: usize = 64;
    let chunks: usize = seq_lens.iter().map(|n| n.div_ceil(BT)).sum();
    let n = seq_lens.len();
    let q_n = act(rt, format!("{name}.q_l2norm"), &[t, kw], dt)?;
    let k_n = act(rt, format!("{name}.k_l2norm"), &[t, kw], dt)?;
    let g_cum = act(rt, format!("{name}.g_cumsum"), &[t, h], DType::F32)?;
    let a_kkt = act(rt, format!("{name}.A"), &[t, h, BT], DType::F32)?;
    let a_inv = act(rt, format!("{name}.A_inv"), &[t, h, BT], dt)?;
    drop(a_kkt);
    let u = act(rt, format!("{name}.u"), &[t, h, v], dt)?;
    let w = act(rt, format!("{name}.w"), &[t, h, k], dt)?;
    let states = act(rt, format!("{name}.h"), &[chunks, h, k, v], dt)?;
    let v_new = act(rt, format!("{name}.v_new"), &[t, h, v], dt)?;
    let mut final_state = act(rt, format!("{name}.final_state"), &[n, h, k, v], DType::F32)?;
    let mut o = act(rt, format!("{name}.o"), &[t, h * v], dt)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let (x, gd, bd) = (mixed.f32(), g.f32(), beta.f32());
            let cd = d.conv_dim();
            let per = d.per_group();
            let scale = 1.0 / (k as f32).sqrt();
            let l2 = |s: &[f32]| -> Vec<f32> {
                let inv = 1.0 / (s.iter().map(|a| a * a).sum::<f32>() + 1e-6).sqrt();
                s.iter().map(|a| a * inv).collect()
            };
            let od = o.f32_mut();
            let fd = final_state.f32_mut();
            let mut start = 0;
            for (si, &len) in seq_lens.iter().enumerate() {
                for head in 0..h {
                    let kh = head / per;
                    let mut s = vec![0.0f32; k * v];
                    for i in start..start + len {
                        let row = &x[i * cd..(i + 1) * cd];
                        let q = l2(&row[kh * k..(kh + 1) * k]);
                        let kk = l2(&row[kw + kh * k..kw + (kh + 1) * k]);
                        let vv = &row[2 * kw + head * v..2 * kw + (head + 1) * v];
                        let decay = gd[i * h + head].exp();
                        let b = bd[i * h + head];
                        s.iter_mut().for_each(|e| *e *= decay);
                        for (c, &vc) in vv.iter().enumerate() {
                            let mem: f32 =
                                kk.iter().enumerate().map(|(r, kr)| s[r * v + c] * kr).sum();
                            let delta = (vc - mem) * b;
                            for (r, &kr) in kk.iter().enumerate() {
                                s[r * v + c] += kr * delta;
                            }
                        }
                        let base = i * h * v + head * v;
                        for (c, o) in od[base..base + v].iter_mut().enumerate() {
                            let y: f32 =
                                q.iter().enumerate().map(|(r, qr)| s[r * v + c] * qr).sum();
                            *o = y * scale;
                        }
                    }
                    fd[(si * h + head) * k * v..(si * h + head + 1) * k * v].copy_from_slice(&s);
                }
                start += len;
            }
        }
        Backend::Cuda => return Err(on_cuda()),
    }
    drop((v_new, states, w, u, a_inv, g_cum));
    drop((k_n, q_n));
    Ok((o, final_state))
}

/// `RMSNormGated(x, z)` with `norm_before_gate=True` (0.10.2 layers/fla/ops/layernorm_guard.py
/// L133-175): each `v_dim` row normalised, times the weight, times `silu(z)`, into a new
/// tensor, with the kernel's f32 `rstd` per row made before it and dying after (`mean` is
/// `None` for an RMS norm: 0.11.0 layers/fla/ops/layernorm_guard.py L159-161, 0.19.0
/// L210-215).
pub fn gated_rms_norm(
    rt: &Runtime,
    x: &Tensor,
    z: &Tensor,
    w: &Tensor,
    eps: f32,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("gdn.gated_rms_norm");
    let dim = w.numel();
    let rows = x.numel() / dim.max(1);
    let mut out = act(rt, name.to_string(), &x.shape, x.dtype)?;
    let rstd = act(rt, format!("{name}.rstd"), &[rows], DType::F32)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let (xd, zd, wd, od) = (x.f32(), z.f32(), w.f32(), out.f32_mut());
            for r in 0..rows {
                let xs = &xd[r * dim..(r + 1) * dim];
                let ms = xs.iter().map(|a| a * a).sum::<f32>() / dim as f32;
                let inv = 1.0 / (ms + eps).sqrt();
                let span = r * dim..(r + 1) * dim;
                for (((o, &x), &w), &z) in
                    od[span.clone()].iter_mut().zip(xs).zip(wd).zip(&zd[span])
                {
                    *o = x * inv * w * silu(z);
                }
            }
        }
        Backend::Cuda => return Err(on_cuda()),
    }
    drop(rstd);
    Ok(out)
}

/// `torch.empty_like(hidden_states)`: the decoder layer's `self_attention_output` that the
/// mixer writes into (0.10.2 qwen3_next.py L821; 0.19.0 L409).
pub fn empty_like(rt: &Runtime, x: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("qwen3_next.self_attention_output");
    let mut out = act(rt, name.to_string(), &x.shape, x.dtype)?;
    if rt.backend() == Backend::Cpu {
        out.f32_mut().iter_mut().for_each(|v| *v = 0.0);
    }
    Ok(out)
}

/// `output[:num_tokens] = out_proj(...)`: the mixer's result copied into the layer's output.
pub fn copy_rows(rt: &Runtime, out: &mut Tensor, src: &Tensor) -> Result<()> {
    rt.set_op("qwen3_next.copy_out");
    if rt.backend() == Backend::Cpu {
        out.f32_mut().copy_from_slice(src.f32());
    }
    Ok(())
}

//! The ops of Qwen2.5-VL's vision tower (vLLM qwen2_5_vl.py `Qwen2_5_VisionTransformer`, 0.15.1
//! and 0.19.0) beyond the linear, RMSNorm, SiLU-and-mul, GELU and residual ops others share.
//! The tower runs eagerly (`compile_mm_encoder` off by default: its `@support_torch_compile`
//! classes are not compiled) with vLLM's custom ops off, so its RMSNorms run `forward_native`;
//! `ApplyRotaryEmb(enforce_enable=True)` runs FlashAttention's Triton rotary kernel and the
//! attention FlashAttention's varlen call. Like `ops`, each op allocates through the framework
//! allocator in PyTorch's order, then runs on the CPU or not at all (dry); not on CUDA here.

use crate::base::error::{Error, Result};
use crate::device::{cpu, cpu_qwen2_5_vl, Backend};
use crate::engine::ops_pixtral::RmsNormBody;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

fn cpu_only(rt: &Runtime, op: &str) -> Result<()> {
    match rt.backend() {
        Backend::Cuda => Err(Error::Device {
            spec: "cuda".into(),
            problem: format!("{op}: the Qwen2.5-VL vision tower runs on simulated devices only"),
        }),
        _ => Ok(()),
    }
}

fn act(rt: &Runtime, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
    rt.tensor_for_overwrite(name, Category::Activation, shape, dtype)
}

/// `Qwen2_5_VisionPatchEmbed` on `pixels [L, C·T·p·p]`: the view `[L, C, T, p, p]`, then
/// `Conv3dLayer.forward_native` (custom ops off; kernel == stride) → `_forward_mulmat`
/// (conv.py 0.19 L219-233): the unfolds, permute and reshape are views of the contiguous
/// rows (each patch is one whole kernel), `F.linear` with the weight's `[D, C·T·p·p]` view
/// makes the one output `[L, D]`, its `view`/`permute` views again.
pub fn patch_embed(rt: &Runtime, pixels: &Tensor, w: &Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    cpu_only(rt, "patch_embed")?;
    rt.ensure_library_workspaces()?;
    rt.set_op("conv3d_as_linear");
    let (l, k) = (pixels.rows(), pixels.cols());
    let d = w.numel() / k;
    let mut out = act(rt, name, &[l, d], pixels.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_qwen2_5_vl::linear_nt(pixels.f32(), w.f32(), (l, k, d), out.f32_mut());
    }
    Ok(out)
}

/// A host tensor copied to the device (`tensor.to(device)`: int32 `cu_seqlens`, int64
/// indices); the host never reads it back.
pub fn host_to_device(rt: &Runtime, name: &str, n: usize, dtype: DType) -> Result<Tensor> {
    rt.set_op("h2d");
    rt.tensor(name, Category::Activation, &[n], dtype)
}

/// How a release's `rotary_pos_emb_thw` and `get_rope_by_thw` reach the device with their
/// position ids and window index (docs/reading/vllm-mm-towers-v021.md §1.3 step 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeIds {
    /// 0.15-0.21: host indices; each gather copies its index to the device for itself
    /// (qwen2_5_vl.py 0.19 L651-694, L733-752).
    HostIndex,
    /// 0.22-0.28: `pos_ids.to(cos.device)` once for both gathers, `window_index_thw.to(...)`
    /// once for both reorders (0.22.1 L699, L758).
    DeviceCopy,
    /// 0.29-0.33: the ids built on the device from two `arange`s (0.29.0 L670-700), the window
    /// index copied once as in 0.22.
    OnDevice,
}

/// `get_rope_by_thw(t, h, w)`'s tables for one grid: `rotary_pos_emb_thw` gathers
/// `cos[pos_ids]` and then `sin[pos_ids]` (`[L, 2, rot / 2]` each, in the model dtype), then
/// `get_rope_by_thw` reorders each by the window index (`[L / m²]`), the plain table dying at
/// the rebind. Where the ids and the index come from is `ids`. Returns (cos, sin) in window
/// order, what the cache keeps.
pub fn rope_by_thw(
    rt: &Runtime,
    (t, h, w): (usize, usize, usize),
    (m, ws): (usize, usize),
    (rot, theta): (usize, f64),
    dtype: DType,
    ids: RopeIds,
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.set_op("rope_by_thw");
    let l = t * h * w;
    let ids_name = format!("{name}.pos_ids");
    // The ids both gathers read (None: each gather copies the host ids itself), and the
    // on-device build's flattened axes, which die as `rotary_pos_emb_thw` returns.
    let (shared_ids, axes) = match ids {
        RopeIds::HostIndex => (None, None),
        RopeIds::DeviceCopy => (Some(act(rt, &ids_name, &[l, 2], DType::I64)?), None),
        RopeIds::OnDevice => {
            let ah = act(rt, &format!("{name}.arange_h"), &[h], DType::I64)?;
            let aw = act(rt, &format!("{name}.arange_w"), &[w], DType::I64)?;
            let fh = act(rt, &format!("{name}.hpos_ids"), &[h * w], DType::I64)?;
            drop(ah);
            let fw = act(rt, &format!("{name}.wpos_ids"), &[h * w], DType::I64)?;
            drop(aw);
            let stacked = act(rt, &format!("{name}.stack"), &[h * w, 2], DType::I64)?;
            let rep = act(rt, &ids_name, &[l, 2], DType::I64)?;
            drop(stacked);
            (Some(rep), Some((fh, fw)))
        }
    };
    let mut plain = Vec::with_capacity(2);
    for part in ["cos", "sin"] {
        let own = match shared_ids {
            None => Some(act(rt, &ids_name, &[l, 2], DType::I64)?),
            Some(_) => None,
        };
        plain.push(act(rt, &format!("{name}.{part}_pos"), &[l, rot], dtype)?);
        drop(own);
    }
    drop(axes);
    drop(shared_ids);
    let index_name = format!("{name}.window_index");
    let shared_index = match ids {
        RopeIds::HostIndex => None,
        _ => Some(act(rt, &index_name, &[l / (m * m)], DType::I64)?),
    };
    let mut tables = Vec::with_capacity(2);
    for (part, p) in ["cos", "sin"].into_iter().zip(plain) {
        let own = match shared_index {
            None => Some(act(rt, &index_name, &[l / (m * m)], DType::I64)?),
            Some(_) => None,
        };
        let ordered = act(rt, &format!("{name}.{part}"), &[l, rot], dtype)?;
        drop(own);
        drop(p);
        tables.push(ordered);
    }
    drop(shared_index);
    let mut sin = tables.pop().expect("two tables");
    let mut cos = tables.pop().expect("two tables");
    if rt.backend() == Backend::Cpu {
        let mut angles = vec![0.0f32; l * rot];
        cpu_qwen2_5_vl::rotary_angles((t, h, w), m, rot, theta, &mut angles);
        let (index, _) = cpu_qwen2_5_vl::window_index((t, h, w), m, ws);
        let mut ordered = vec![0.0f32; l * rot];
        cpu_qwen2_5_vl::gather_groups(&angles, &index, m * m * rot, &mut ordered);
        for ((c, s), a) in cos.f32_mut().iter_mut().zip(sin.f32_mut()).zip(&ordered) {
            *c = a.cos();
            *s = a.sin();
        }
    }
    Ok((cos, sin))
}

/// How a release normalizes uint8 pixels on the device (`mm_device_do_normalize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputNormPass {
    /// 0.28-0.29 `FusedInputNorm.forward` (models/vision.py 0.28 L709-733): `x.to(float32)`,
    /// `* weight` (f32), `+ bias` (the product dies), the f32 copy dies at the rebind, then
    /// `.to(dtype)`; the sum dies as it returns.
    Upcast,
    /// 0.31 `FusedMMInputNorm.forward_native` (mm_input_norm.py 0.31 L285-301): `u8 * weight`
    /// promotes to f32 in the kernel (no copy), `+ bias`, the product dies, `.to(dtype)`; the
    /// sum dies as it returns.
    Native,
    /// `FusedMMInputNorm.forward_cuda` (0.31 L303-315, 0.33 L302-314): one output written by
    /// a Triton kernel.
    Cuda,
}

/// The pixel normalization `pass` on uint8 `pixels [P, C·T·p·p]` (channel-major rows) with
/// the per-channel `weight = rescale / std` and `bias = -mean / std` (f32 `[C]`): returns
/// `pixels · weight + bias` in `dtype`.
pub fn input_norm(
    rt: &Runtime,
    pixels: &Tensor,
    (weight, bias): (&Tensor, &Tensor),
    pass: InputNormPass,
    dtype: DType,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("mm_input_norm");
    let shape = pixels.shape.clone();
    let mut out = match pass {
        InputNormPass::Upcast => {
            let a0 = act(rt, &format!("{name}.f32"), &shape, DType::F32)?;
            let a1 = act(rt, &format!("{name}.mul"), &shape, DType::F32)?;
            let a2 = act(rt, &format!("{name}.add"), &shape, DType::F32)?;
            drop(a1);
            drop(a0);
            let out = act(rt, name, &shape, dtype)?;
            drop(a2);
            out
        }
        InputNormPass::Native => {
            let a = act(rt, &format!("{name}.mul"), &shape, DType::F32)?;
            let b = act(rt, &format!("{name}.add"), &shape, DType::F32)?;
            drop(a);
            let out = act(rt, name, &shape, dtype)?;
            drop(b);
            out
        }
        InputNormPass::Cuda => act(rt, name, &shape, dtype)?,
    };
    if rt.backend() == Backend::Cpu {
        let (w, b) = (weight.f32(), bias.f32());
        let per = pixels.cols() / w.len();
        let values: Vec<f32> = match &pixels.storage {
            crate::device::tensor::Storage::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
            _ => pixels.f32().to_vec(),
        };
        for (o, (i, x)) in out.f32_mut().iter_mut().zip(values.iter().enumerate()) {
            let c = (i % pixels.cols()) / per;
            *o = x * w[c] + b[c];
        }
    }
    Ok(out)
}

/// `x.reshape(n, group_rows, -1)[index]`: the gathered copy (the window order of the patch
/// embeddings, the merger's output put back by `reverse_indices`); `index` (merged tokens)
/// is read on the host only.
pub fn gather_groups(
    rt: &Runtime,
    x: &Tensor,
    index: &[usize],
    group_rows: usize,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("index");
    let mut out = act(rt, name, &x.shape, x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_qwen2_5_vl::gather_groups(x.f32(), index, group_rows * x.cols(), out.f32_mut());
    }
    Ok(out)
}

/// `RMSNorm(x, residual=...)` run eagerly by `body`: `forward_static` (layernorm.py 0.19
/// L222-265: `x.to(float32)`, `x + residual` (f32; the first copy dies at the rebind),
/// `residual = x.to(orig_dtype)`, the variance, `x * rsqrt(...)` (the sum stays: `x_var` holds
/// it), `.to(orig_dtype)`, `* weight`); vLLM's C kernel, in place (no allocation: the normed
/// tensor and the sum overwrite `x` and `residual`, which the block does not read again); or
/// the IR `fused_add_rms_norm`'s native body (ir/ops/layernorm.py 0.21 L38-56, the same
/// through 0.33): `x.to(float32)`,
/// `x_residual.to(float32)` (a second f32 copy), their sum (the residual's copy dies as the
/// add returns, the input's at the rebind), `x_residual = x.to(orig_dtype)`, the variance of
/// the sum (held as `x_var`), `x * rsqrt`, then `x.to(weight.dtype) * weight` in one statement
/// (the f32 normed tensor dies only once the product exists); the sum and the variance die as
/// it returns.
pub fn rms_norm_residual_eager(
    rt: &Runtime,
    x: &Tensor,
    residual: &Tensor,
    w: &Tensor,
    eps: f32,
    body: RmsNormBody,
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    if body == RmsNormBody::CKernel {
        rt.set_op("fused_add_rms_norm_c");
        let mut out = x.part(name, 0, &x.shape);
        let mut res = residual.part(format!("{name}.residual"), 0, &residual.shape);
        if rt.backend() == Backend::Cpu {
            for ((o, a), b) in res.f32_mut().iter_mut().zip(x.f32()).zip(residual.f32()) {
                *o = a + b;
            }
            cpu::rms_norm(res.f32(), w.f32(), eps, out.f32_mut());
        }
        return Ok((out, res));
    }
    let ir = body == RmsNormBody::IrNative;
    rt.set_op(if ir {
        "rms_norm_ir_native"
    } else {
        "rms_norm_native"
    });
    let (t, d) = (x.rows(), x.cols());
    let xf = act(rt, &format!("{name}.f32"), &[t, d], DType::F32)?;
    let rf = if ir {
        Some(act(
            rt,
            &format!("{name}.residual_f32"),
            &[t, d],
            DType::F32,
        )?)
    } else {
        None
    };
    let sum = act(rt, &format!("{name}.add_residual"), &[t, d], DType::F32)?;
    drop(rf);
    drop(xf);
    let mut res = act(rt, &format!("{name}.residual"), &[t, d], x.dtype)?;
    let (var, r) = crate::engine::ops_pixtral::variance_rsqrt(rt, t, d, name)?;
    let y = act(rt, &format!("{name}.normed"), &[t, d], DType::F32)?;
    drop(r);
    let yb = act(rt, &format!("{name}.to_dtype"), &[t, d], x.dtype)?;
    let y = if ir {
        Some(y)
    } else {
        drop(y);
        None
    };
    let mut out = act(rt, name, &[t, d], x.dtype)?;
    drop(yb);
    drop(y);
    drop(sum);
    drop(var);
    if rt.backend() == Backend::Cpu {
        for ((o, a), b) in res.f32_mut().iter_mut().zip(x.f32()).zip(residual.f32()) {
            *o = a + b;
        }
        cpu::rms_norm(res.f32(), w.f32(), eps, out.f32_mut());
    }
    Ok((out, res))
}

/// The attention's `qk_reshaped.contiguous()`: q and k (views of the fused projection's
/// output) copied into one `[2, L, heads · head_dim]` tensor.
pub fn qk_contiguous(rt: &Runtime, q: &Tensor, k: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("contiguous");
    let (l, w) = (q.rows(), q.cols());
    let mut out = act(rt, name, &[2 * l, w], q.dtype)?;
    if rt.backend() == Backend::Cpu {
        let o = out.f32_mut();
        o[..l * w].copy_from_slice(q.f32());
        o[l * w..].copy_from_slice(k.f32());
    }
    Ok(out)
}

/// `ApplyRotaryEmb.forward_cuda` (rotary_embedding/common.py 0.19 L226-247): FlashAttention's
/// `apply_rotary_emb` (not in place) writes one new tensor of the input's shape; `cos`/`sin`
/// `[L, head_dim / 2]` serve both halves (q then k) of `qk [2 · L, heads · head_dim]`.
pub fn apply_rope_qk(
    rt: &Runtime,
    qk: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    (heads, head_dim): (usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("apply_rotary_emb");
    let mut out = act(rt, name, &qk.shape, qk.dtype)?;
    if rt.backend() == Backend::Cpu {
        let half = qk.numel() / 2;
        let (c, s) = (cos.f32(), sin.f32());
        let (x, o) = (qk.f32(), out.f32_mut());
        let (o1, o2) = o.split_at_mut(half);
        cpu_qwen2_5_vl::apply_rope_neox(&x[..half], c, s, (heads, head_dim), o1);
        cpu_qwen2_5_vl::apply_rope_neox(&x[half..], c, s, (heads, head_dim), o2);
    }
    Ok(out)
}

/// `MMEncoderAttention._forward_fa` → FlashAttention's varlen call (`cu_seqlens` and
/// `max_seqlen` made before the blocks): the output `[L, heads · head_dim]` in the model
/// dtype and an f32 log-sum-exp `[heads, L]` that dies as the call returns; q, k and v are
/// views (`rearrange "b s ... -> (b s) ..."` of one batch), nothing copied.
pub fn varlen_attention(
    rt: &Runtime,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    cu: &[usize],
    (heads, head_dim): (usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    cpu_only(rt, "vision attention")?;
    rt.set_op("vit_attention");
    let l = q.rows();
    let mut out = act(rt, name, &[l, heads * head_dim], q.dtype)?;
    let lse = act(rt, &format!("{name}.softmax_lse"), &[heads, l], DType::F32)?;
    if rt.backend() == Backend::Cpu {
        cpu_qwen2_5_vl::varlen_attention(
            (q.f32(), k.f32(), v.f32()),
            cu,
            (heads, head_dim),
            (head_dim as f32).powf(-0.5),
            out.f32_mut(),
        );
    }
    drop(lse);
    Ok(out)
}

/// `cast_overflow_tensors` on fp16 output (qwen2_5_vl.py 0.19 L858-861, vision.py): the
/// `isinf` and `isnan` masks (bool, one at a time) that `.any()` reads; a finite tensor is
/// kept as it is.
pub fn overflow_check(rt: &Runtime, x: &Tensor, name: &str) -> Result<()> {
    rt.set_op("cast_overflow_tensors");
    for part in ["isinf", "isnan"] {
        let mask = act(rt, &format!("{name}.{part}"), &x.shape, DType::U8)?;
        let any = act(rt, &format!("{name}.{part}.any"), &[1], DType::U8)?;
        drop(mask);
        drop(any);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, DeviceSpec};
    use crate::engine::ops_pixtral;

    fn dry() -> Runtime {
        let device = Device::open(&DeviceSpec::parse("sim:h100-80gb:dry").unwrap()).unwrap();
        Runtime::new(device, std::sync::Arc::default(), None)
    }

    /// The bytes an op allocates at its peak beyond what was allocated before it, for
    /// `[t, d]` bf16 inputs the caller holds.
    fn peak_of(residual: bool, body: RmsNormBody, (t, d): (usize, usize)) -> u64 {
        let rt = dry();
        let x = act(&rt, "x", &[t, d], DType::BF16).unwrap();
        let r = act(&rt, "r", &[t, d], DType::BF16).unwrap();
        let w = act(&rt, "w", &[d], DType::BF16).unwrap();
        rt.reset_peak();
        let base = rt.stats().allocated;
        if residual {
            let out = rms_norm_residual_eager(&rt, &x, &r, &w, 1e-6, body, "n").unwrap();
            // Both outputs are new bf16 tensors, or (the C kernel) the inputs overwritten.
            let new = if body == RmsNormBody::CKernel { 0 } else { 2 };
            assert_eq!(rt.stats().allocated - base, new * (t * d * 2) as u64);
            drop(out);
        } else {
            let out = ops_pixtral::rms_norm_eager(&rt, &x, &w, 1e-6, body, "n").unwrap();
            assert_eq!(rt.stats().allocated - base, (t * d * 2) as u64);
            drop(out);
        }
        rt.stats().allocated_peak - base
    }

    /// vLLM 0.21's IR bodies hold the f32 normed tensor until the weighted product exists and
    /// (with a residual) make a second f32 copy for the add: per element 4 (f32 input) + 4
    /// (normed) + 2 (cast) + 2 (product) = 12 bytes at the peak without a residual, against
    /// `forward_static`'s 8 (the f32 input and the normed tensor, with the `[t, 1]` f32
    /// variance and its `rsqrt`: 2 KiB each at 512 rows); with one, 4 (the sum) + 2 (the new
    /// residual) + 4 + 2 + 2 = 14 against 12. The variance is live at every peak.
    #[test]
    fn the_ir_norms_peak_above_forward_static() {
        let (t, d) = (512, 1280);
        let e = (t * d) as u64;
        let var = (t * 4) as u64;
        let (s, ir, c) = (
            RmsNormBody::Static,
            RmsNormBody::IrNative,
            RmsNormBody::CKernel,
        );
        assert_eq!(peak_of(false, s, (t, d)), 8 * e + 2 * var);
        assert_eq!(peak_of(false, ir, (t, d)), 12 * e + var);
        assert_eq!(peak_of(true, s, (t, d)), 12 * e + var);
        assert_eq!(peak_of(true, ir, (t, d)), 14 * e + var);
        // The C kernels: the output alone, or nothing (in place).
        assert_eq!(peak_of(false, c, (t, d)), 2 * e);
        assert_eq!(peak_of(true, c, (t, d)), 0);
    }

    /// Which body each release runs: 0.21 the IR's native body even under
    /// `--enforce-eager`; from 0.22 the C kernel there; `forward_static` up to 0.19 unless
    /// custom ops are on.
    #[test]
    fn each_release_runs_its_norm_body() {
        use RmsNormBody::*;
        let of = RmsNormBody::of;
        assert_eq!(
            [of(19, false), of(21, false), of(33, false)],
            [Static, IrNative, IrNative]
        );
        assert_eq!(
            [of(19, true), of(21, true), of(22, true)],
            [CKernel, IrNative, CKernel]
        );
    }
}

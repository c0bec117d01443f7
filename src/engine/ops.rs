//! Device-agnostic ops. Each allocates its output through the framework allocator (the same
//! sequence on every device, so a dry run's trace matches the GPU's) and then runs the math
//! on the CPU, on CUDA, or not at all (dry).

use crate::base::error::{Error, Result};
use crate::device::cpu::{self, AttnShape, RowLayout};
use crate::device::Backend;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Storage, Tensor};
use crate::memory::Category;

/// Runs `f` with the CUDA device (an error on any other device).
pub(crate) fn cuda<R>(
    rt: &Runtime,
    f: impl FnOnce(&mut crate::device::cuda::CudaDevice) -> Result<R>,
) -> Result<R> {
    rt.with_device(|d| match d.cuda() {
        Some(c) => f(c),
        None => Err(Error::Device {
            spec: "cuda".into(),
            problem: "not a CUDA device".into(),
        }),
    })
}

pub fn embedding(rt: &Runtime, ids: &[u32], table: &Tensor, act: DType) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("embedding");
    let hidden = table.cols();
    let mut out =
        rt.tensor_for_overwrite("embed.out", Category::Activation, &[ids.len(), hidden], act)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu::embedding(ids, table.f32(), hidden, out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.embedding(ids, table, &mut out))?,
    }
    Ok(out)
}

pub fn rms_norm(rt: &Runtime, x: &Tensor, w: &Tensor, eps: f32, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("rms_norm");
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &x.shape, x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu::rms_norm(x.f32(), w.f32(), eps, out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.rms_norm(x, w, eps, &mut out))?,
    }
    Ok(out)
}

/// The bias of a linear layer. PyTorch runs `F.linear` with a bias through cuBLASLt's
/// epilogue, which is when it takes the cuBLASLt workspace.
pub fn add_bias(rt: &Runtime, x: &mut Tensor, bias: &Tensor) -> Result<()> {
    rt.ensure_lt_workspace()?;
    rt.set_op("add_bias");
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let b = bias.f32();
            for row in x.f32_mut().chunks_exact_mut(b.len()) {
                cpu::add_assign(row, b);
            }
        }
        Backend::Cuda => cuda(rt, |c| c.add_bias(x, bias))?,
    }
    Ok(())
}

/// Rotary embedding of q and k in place; `(theta, linear_factor)` is the base and Gemma 3's
/// linear position scaling (1 for every other model).
pub fn rope(
    rt: &Runtime,
    q: &mut Tensor,
    k: &mut Tensor,
    positions: &[usize],
    shape: AttnShape,
    rope: (f64, f64),
) -> Result<()> {
    rope_partial(rt, q, k, positions, shape, rope, shape.head_dim)
}

/// `rope` turning only the first `rotary_dim` dimensions of each head (Phi's partial rotary,
/// vLLM's `RotaryEmbedding` with `rotary_dim < head_size`): in place, no allocation.
pub fn rope_partial(
    rt: &Runtime,
    q: &mut Tensor,
    k: &mut Tensor,
    positions: &[usize],
    shape: AttnShape,
    (theta, linear_factor): (f64, f64),
    rotary_dim: usize,
) -> Result<()> {
    rt.check_cancel()?;
    rt.set_op("rope");
    let theta = theta as f32;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let (hd, heads, kv_heads) = (shape.head_dim, shape.heads, shape.kv_heads);
            let table =
                cpu::RopeTable::partial(positions, hd, rotary_dim, theta, linear_factor as f32);
            let (q_at, k_at) = (
                RowLayout::packed(heads * hd),
                RowLayout::packed(kv_heads * hd),
            );
            cpu::rope_strided(q.f32_mut(), q_at, heads, &table);
            cpu::rope_strided(k.f32_mut(), k_at, kv_heads, &table);
        }
        // Gemma 3's scaled positions and Phi's partial rotary from the host's own table.
        Backend::Cuda if linear_factor != 1.0 || rotary_dim != shape.head_dim => {
            let table = cpu::RopeTable::partial(
                positions,
                shape.head_dim,
                rotary_dim,
                theta,
                linear_factor as f32,
            );
            let dims = (shape.heads, shape.kv_heads, shape.head_dim, rotary_dim);
            cuda(rt, |c| c.rope_table((q, k), dims, &table.cos_sin))?
        }
        Backend::Cuda => cuda(rt, |c| c.rope(q, k, positions, shape, theta))?,
    }
    Ok(())
}

/// Rotary embedding of q and k in place with given frequencies (a scaled embedding's: dynamic
/// NTK, YaRN, Llama 3) and cos/sin multiplier (YaRN's), from the host's table on CUDA as Gemma
/// 3's scaled positions are; no allocation.
pub fn rope_scaled(
    rt: &Runtime,
    q: &mut Tensor,
    k: &mut Tensor,
    positions: &[usize],
    shape: AttnShape,
    (inv_freq, mscale): (&[f64], f64),
) -> Result<()> {
    rt.check_cancel()?;
    rt.set_op("rope");
    if rt.backend() == Backend::Dry {
        return Ok(());
    }
    let hd = shape.head_dim;
    let table = cpu::RopeTable::from_inv_freq(positions, hd, inv_freq, mscale);
    match rt.backend() {
        Backend::Cpu => {
            let (heads, kv_heads) = (shape.heads, shape.kv_heads);
            cpu::rope_strided(q.f32_mut(), RowLayout::packed(heads * hd), heads, &table);
            cpu::rope_strided(
                k.f32_mut(),
                RowLayout::packed(kv_heads * hd),
                kv_heads,
                &table,
            );
        }
        _ => {
            let dims = (shape.heads, shape.kv_heads, hd, hd);
            cuda(rt, |c| c.rope_table((q, k), dims, &table.cos_sin))?
        }
    }
    Ok(())
}

/// Fused causal attention (flash-attention style): only the output is allocated.
pub fn attention(
    rt: &Runtime,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_lens: &[usize],
    shape: AttnShape,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("attention");
    // vllm-flash-attn's `mha_varlen_fwd` (called from flash_attn.py L679-692 at 380e1863):
    // `out = empty_like(q)`, `softmax_lse [heads, T]` f32 and `rng_state [2]` int64 come from
    // the caching allocator; the wrapper returns `out` and drops the other two. Our kernels
    // need neither, but the allocator sees them as vLLM's does.
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &q.shape, q.dtype)?;
    use crate::engine::runtime::FlashCall;
    let triton = rt.triton_attention();
    let lse = match rt.attention_splits() {
        _ if triton => None,
        Some(FlashCall::TritonUnified) => None,
        _ => Some(rt.tensor(
            format!("{name}.softmax_lse"),
            Category::Activation,
            &[shape.heads, q.rows()],
            DType::F32,
        )?),
    };
    // A graph's decode call (see `FlashCall`) has no rng_state; with splits it has fp32
    // accumulators. All die when the call returns.
    let t = q.rows();
    // The two accumulators, `out_accum` first (FA3) or `softmax_lse_accum` first (FA2).
    let acc = |rt: &Runtime, d: usize, s: usize, lse_first: bool| -> Result<Vec<Tensor>> {
        let out = |rt: &Runtime| {
            rt.tensor(
                format!("{name}.out_accum"),
                Category::Activation,
                &[s, shape.heads, t, d],
                DType::F32,
            )
        };
        let lse = |rt: &Runtime| {
            rt.tensor(
                format!("{name}.softmax_lse_accum"),
                Category::Activation,
                &[s, shape.heads, t],
                DType::F32,
            )
        };
        Ok(if lse_first {
            let l = lse(rt)?;
            vec![l, out(rt)?]
        } else {
            let o = out(rt)?;
            vec![o, lse(rt)?]
        })
    };
    let rng = match rt.attention_splits() {
        _ if triton => Vec::new(),
        Some(FlashCall::Fa3 { splits }) if splits > 1 => acc(rt, shape.head_dim, splits, false)?,
        Some(FlashCall::Fa3 { .. }) => Vec::new(),
        Some(FlashCall::Fa3V0 { splits }) => {
            let mut v = vec![rt.tensor(
                format!("{name}.tile_count_semaphore"),
                Category::Activation,
                &[1 + t],
                DType::I32,
            )?];
            if splits > 1 {
                v.extend(acc(rt, shape.head_dim, splits, false)?);
            }
            v
        }
        Some(FlashCall::Fa2Kvcache { splits }) if splits > 1 => {
            acc(rt, shape.head_dim.next_multiple_of(32), splits, true)?
        }
        Some(FlashCall::Fa2Kvcache { .. } | FlashCall::TritonUnified) => Vec::new(),
        None => vec![rt.tensor(
            format!("{name}.rng_state"),
            Category::Activation,
            &[2],
            DType::I64,
        )?],
    };
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let (q, k, v, c) = (q.f32(), k.f32(), v.f32(), rt.cancel_flag());
            cpu::attention(q, k, v, seq_lens, shape, out.f32_mut(), &c)?
        }
        Backend::Cuda => cuda(rt, |c| c.attention(q, k, v, seq_lens, shape, &mut out))?,
    }
    drop((lse, rng));
    Ok(out)
}

/// vLLM V1's attention in the profile run: with no attention metadata the layer's output
/// (`torch.empty` of the query's shape, allocated by `Attention.forward`) is filled with zeros
/// and no kernel runs (0.19.0 v1/attention/backends/flash_attn.py:666-668).
///
/// In a PIECEWISE capture the layer's attention is where vLLM splits the graph (its attention
/// ops are `splitting_ops`, 0.19.0 config/compilation.py:703-718): the output buffer belongs to
/// the piece before, the zero fill runs eagerly; here it opens the next piece.
pub fn attention_skipped(rt: &Runtime, q: &Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("attention (skipped: profile run)");
    let mut out = rt.tensor(name, Category::Activation, &q.shape, q.dtype)?;
    rt.capture_break()?;
    if rt.backend() == Backend::Cuda {
        cuda(rt, |c| c.zero(&mut out))?;
    }
    Ok(out)
}

/// `x.clone()`: a new tensor of `x`'s shape and dtype holding its values.
pub fn clone(rt: &Runtime, x: &Tensor, name: &str) -> Result<Tensor> {
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &x.shape, x.dtype)?;
    copy_into(rt, &mut out, 0, x)?;
    Ok(out)
}

/// `out[offset..offset + src.numel()] = src` with a dtype cast, as PyTorch's `copy_` into a
/// slice does: no allocation.
pub fn copy_into(rt: &Runtime, out: &mut Tensor, offset: usize, src: &Tensor) -> Result<()> {
    rt.set_op("copy");
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let dt = out.dtype;
            let dst = &mut out.f32_mut()[offset..offset + src.numel()];
            for (d, &v) in dst.iter_mut().zip(src.f32()) {
                *d = dt.round(v);
            }
        }
        Backend::Cuda => {
            let mut view = out.part(out.name.clone(), offset, &src.shape);
            cuda(rt, |c| c.convert_float(src, &mut view))?
        }
    }
    Ok(())
}

/// vLLM's `RMSNorm.forward_cuda` with a residual (layernorm.py; `fused_add_rms_norm`):
/// `residual += x`, then `x = rms_norm(residual) · w`, both in place: no allocation.
pub fn fused_add_rms_norm(
    rt: &Runtime,
    x: &mut Tensor,
    residual: &mut Tensor,
    w: &Tensor,
    eps: f32,
) -> Result<()> {
    rt.check_cancel()?;
    rt.set_op("fused_add_rms_norm");
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            cpu::add_rms_norm(x.f32_mut(), residual.f32_mut(), w.f32(), eps);
        }
        Backend::Cuda => cuda(rt, |c| c.add_rms_norm(x, residual, w, eps))?,
    }
    Ok(())
}

/// vLLM's `SiluAndMul.forward_cuda` (activation.py): `out = empty([T, I])`, then
/// `silu(gate) · up` from the two halves of the fused gate_up output (given as its views).
/// Both write `out` directly.
pub fn silu_and_mul(rt: &Runtime, gate: &Tensor, up: &Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("silu_and_mul");
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &gate.shape, gate.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            cpu::silu_mul_into(gate.f32(), up.f32(), out.f32_mut());
        }
        Backend::Cuda => cuda(rt, |c| c.silu_mul_into(gate, up, &mut out))?,
    }
    Ok(out)
}

/// `SiluAndMul.forward_native` (activation.py: `F.silu(x[..., :d]) * x[..., d:]`), what runs
/// with vLLM's custom ops off (torch.compile's default) outside the compiled model (inside an
/// opaque op, or in an encoder run eager): under 0.10 and 0.11 eager, `silu(gate)` into a new
/// tensor, the product into another, the first dying as the expression ends; where the runtime
/// says the release compiles it (`Runtime::silu_and_mul_fused`, 0.15 on) one kernel, one
/// tensor.
pub fn silu_and_mul_native(rt: &Runtime, gate: &Tensor, up: &Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    if rt.silu_and_mul_fused() {
        return silu_and_mul(rt, gate, up, name);
    }
    let silu = rt.tensor_for_overwrite(
        format!("{name}.silu"),
        Category::Activation,
        &gate.shape,
        gate.dtype,
    )?;
    let out = silu_and_mul(rt, gate, up, name)?;
    drop(silu);
    Ok(out)
}

pub fn add_assign(rt: &Runtime, x: &mut Tensor, y: &Tensor) -> Result<()> {
    rt.set_op("residual_add");
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu::add_assign(x.f32_mut(), y.f32()),
        Backend::Cuda => cuda(rt, |c| c.add_assign(x, y))?,
    }
    Ok(())
}

pub fn gather_rows(rt: &Runtime, x: &Tensor, rows: &[u32], name: &str) -> Result<Tensor> {
    rt.set_op("gather_last_tokens");
    let cols = x.cols();
    let mut out = rt.tensor(name, Category::Activation, &[rows.len(), cols], x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu::embedding(rows, x.f32(), cols, out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.gather_rows(x, rows, &mut out))?,
    }
    Ok(out)
}

pub fn to_f32(rt: &Runtime, x: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("to_f32");
    let mut out = rt.tensor(name, Category::Activation, &x.shape, DType::F32)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => out.f32_mut().copy_from_slice(x.f32()),
        Backend::Cuda => cuda(rt, |c| c.to_f32(x, &mut out))?,
    }
    Ok(out)
}

/// Host values of a tensor as f32 (copies from the GPU when needed); `None` on a dry run.
pub fn read_f32(rt: &Runtime, x: &Tensor) -> Result<Option<Vec<f32>>> {
    Ok(match &x.storage {
        Storage::None => None,
        Storage::F32(v) => Some(v.clone()),
        Storage::Cuda(_) => Some(cuda(rt, |c| c.download_f32(x))?),
        _ => None,
    })
}

/// A preset's seeded weights made on the GPU (`device::synth`), stretch by stretch.
pub fn fill_synthetic(
    rt: &Runtime,
    t: &mut Tensor,
    fills: &[crate::device::synth::SynthFill],
) -> Result<()> {
    cuda(rt, |c| c.fill_synthetic(t, fills))
}

/// LLM.int8's `CB` and `SCB` of a preset's seeded weight, quantized on the GPU where the
/// weight is made (the host's `quant::int8::quantize_rows` bit for bit).
pub fn synth_int8(
    rt: &Runtime,
    cb: &mut Tensor,
    scb: &mut Tensor,
    fill: &crate::device::synth::SynthFill,
) -> Result<()> {
    cuda(rt, |c| c.synth_int8(cb, scb, fill))
}

pub fn upload_f32(rt: &Runtime, t: &mut Tensor, data: &[f32]) -> Result<()> {
    cuda(rt, |c| c.upload_f32(t, data))
}

pub fn upload_i8(rt: &Runtime, t: &mut Tensor, data: &[i8]) -> Result<()> {
    // SAFETY: i8 and u8 have the same size and alignment; the view covers exactly `data`.
    let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len()) };
    cuda(rt, |c| c.upload_bytes(t, bytes))
}

pub fn upload_i32(rt: &Runtime, t: &mut Tensor, data: &[i32]) -> Result<()> {
    // SAFETY: i32 has no padding; the byte view covers exactly `data`.
    let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 4) };
    cuda(rt, |c| c.upload_bytes(t, bytes))
}

/// f32 values converted into `t`'s dtype from element `offset` on.
pub fn upload_f32_at(rt: &Runtime, t: &mut Tensor, offset: usize, data: &[f32]) -> Result<()> {
    cuda(rt, |c| c.upload_f32_at(t, offset, data))
}

/// Bytes as stored into `t` from byte `offset` on.
pub fn upload_bytes_at(rt: &Runtime, t: &mut Tensor, offset: u64, data: &[u8]) -> Result<()> {
    cuda(rt, |c| c.upload_bytes_at(t, offset, data))
}

pub fn upload_u8(rt: &Runtime, t: &mut Tensor, data: &[u8]) -> Result<()> {
    cuda(rt, |c| c.upload_bytes(t, data))
}

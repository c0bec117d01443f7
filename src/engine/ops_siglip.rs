//! The ops of the SigLIP vision tower and Gemma 3's projector (vLLM siglip.py, gemma3_mm.py)
//! beyond the LayerNorm, GELU, linear and residual ops the text models share. Like `ops`, each
//! allocates through the framework allocator in PyTorch's order, then runs on the CPU or not at
//! all (dry); the vision tower does not run on CUDA here (refused by name before the load).

use crate::base::error::{Error, Result};
use crate::device::{cpu_siglip, Backend};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

fn cpu_only(rt: &Runtime, op: &str) -> Result<()> {
    match rt.backend() {
        Backend::Cuda => Err(Error::Device {
            spec: "cuda".into(),
            problem: format!("{op}: the SigLIP vision tower runs on simulated devices only"),
        }),
        _ => Ok(()),
    }
}

/// `patch_embedding(pixel_values)`: `nn.Conv2d(C, D, p, stride=p)`, PyTorch's output
/// `[N, D, g, g]` (held here as the `[N · g², D]` rows `flatten(2).transpose(1, 2)` reads;
/// the same bytes). cuDNN's convolution workspace is not modelled.
pub fn patch_embed(
    rt: &Runtime,
    pixels: &Tensor,
    w: &Tensor,
    b: &Tensor,
    (images, channels, size, patch): (usize, usize, usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    cpu_only(rt, "patch_embedding")?;
    rt.ensure_library_workspaces()?;
    rt.set_op("conv2d");
    let g = size / patch;
    let d = b.numel();
    let mut out = rt.tensor_for_overwrite(
        name,
        Category::Activation,
        &[images * g * g, d],
        pixels.dtype,
    )?;
    if rt.backend() == Backend::Cpu {
        cpu_siglip::patch_embed(
            pixels.f32(),
            w.f32(),
            b.f32(),
            (images, channels, size, patch),
            out.f32_mut(),
        );
    }
    Ok(out)
}

/// The vision attention of vLLM's `MultiHeadAttention` (0.11 attention/layer.py L448-525) and
/// `MMEncoderAttention` (0.15, 0.19): FlashAttention's varlen call (Hopper and Ampere: its
/// `cu_seqlens_q`/`_k`, int32 `[N + 1]`, made first) or PyTorch's SDPA (0.11 on Blackwell,
/// platforms/cuda.py L217-220; its flash kernel), either way an output `[N · S, heads ·
/// head_dim]` in the model dtype and an f32 log-sum-exp `[heads, N · S]` that dies as the call
/// returns. q, k and v are views of the fused projection's output (its three parts): no
/// copies.
pub fn vit_attention(
    rt: &Runtime,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (images, seq, heads, head_dim): (usize, usize, usize, usize),
    varlen: bool,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    cpu_only(rt, "vision attention")?;
    rt.set_op("vit_attention");
    let cu = if varlen {
        let a = rt.tensor(
            format!("{name}.cu_seqlens_q"),
            Category::Activation,
            &[images + 1],
            DType::I32,
        )?;
        let b = rt.tensor(
            format!("{name}.cu_seqlens_k"),
            Category::Activation,
            &[images + 1],
            DType::I32,
        )?;
        Some((a, b))
    } else {
        None
    };
    let tokens = images * seq;
    let mut out = rt.tensor_for_overwrite(
        name,
        Category::Activation,
        &[tokens, heads * head_dim],
        q.dtype,
    )?;
    let lse = rt.tensor_for_overwrite(
        format!("{name}.softmax_lse"),
        Category::Activation,
        &[heads, tokens],
        DType::F32,
    )?;
    if rt.backend() == Backend::Cpu {
        let w = heads * head_dim;
        for t in [q, k, v] {
            if t.numel() != tokens * w {
                return Err(crate::base::error::Error::Request(format!(
                    "{name}: {} holds {} values for {tokens} × {w}",
                    t.name,
                    t.numel()
                )));
            }
        }
        cpu_siglip::vit_attention(
            (q.f32(), k.f32(), v.f32()),
            (images, seq, heads, head_dim),
            (head_dim as f32).powf(-0.5),
            out.f32_mut(),
        );
    }
    drop(lse);
    drop(cu);
    Ok(out)
}

/// `x.transpose(1, 2).reshape(...)` of `[N, rows, cols]`: a copy `[N, cols, rows]` (the
/// projector's `vision_outputs.transpose(1, 2).reshape(b, d, g, g)`, gemma3_mm.py 0.11 L445-449).
pub fn transpose_copy(
    rt: &Runtime,
    x: &Tensor,
    (images, rows, cols): (usize, usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.set_op("transpose_copy");
    let mut out =
        rt.tensor_for_overwrite(name, Category::Activation, &[images * cols, rows], x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_siglip::transpose_12(x.f32(), (images, rows, cols), out.f32_mut());
    }
    Ok(out)
}

/// `nn.AvgPool2d(k, stride=k)` over `[planes, side, side]`.
pub fn avg_pool(
    rt: &Runtime,
    x: &Tensor,
    (planes, side, k): (usize, usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.set_op("avg_pool2d");
    let o = side / k;
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &[planes, o * o], x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_siglip::avg_pool(x.f32(), (planes, side, k), out.f32_mut());
    }
    Ok(out)
}

/// `mm_soft_emb_norm` (`GemmaRMSNorm`, torch.compile'd into one kernel: one output) on the
/// pooled `[N, D, T]` read as `[N, T, D]` (`flatten(2).transpose(1, 2)`).
pub fn gemma_rms_norm_transposed(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    eps: f32,
    (images, dim, tokens): (usize, usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.set_op("gemma_rms_norm");
    let mut out =
        rt.tensor_for_overwrite(name, Category::Activation, &[images * tokens, dim], x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_siglip::gemma_rms_norm_transposed(
            x.f32(),
            w.f32(),
            eps,
            (images, dim, tokens),
            out.f32_mut(),
        );
    }
    Ok(out)
}

/// `torch.matmul(x, w)` with `w` `[k, n]` (the projector's `mm_input_projection_weight`).
pub fn matmul_nn(rt: &Runtime, x: &Tensor, w: &Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.ensure_library_workspaces()?;
    rt.set_op("matmul");
    let (m, k) = (x.rows(), x.cols());
    let n = w.cols();
    if w.rows() != k {
        return Err(Error::Request(format!(
            "{name}: [{m}, {k}] @ [{}, {n}] do not match",
            w.rows()
        )));
    }
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &[m, n], x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_siglip::matmul_nn(x.f32(), w.f32(), (m, k, n), out.f32_mut());
    }
    Ok(out)
}

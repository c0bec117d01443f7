//! The ops of the Pixtral-HF vision tower and Mistral 3's projector (vLLM pixtral.py,
//! mistral3.py) beyond the linear, SiLU-and-mul and attention ops others share. The tower runs
//! eagerly (it is not under `@support_torch_compile`) with vLLM's custom ops off (V1 with
//! Inductor appends "none" to `custom_ops`, 0.19.0 config/vllm.py L890-897; custom_op.py
//! L272-304), so its `RMSNorm` and `SiluAndMul` run their `forward_native` PyTorch code, each
//! op's temporaries allocated as PyTorch does. Like `ops`, each allocates through the framework
//! allocator, then runs on the CPU or not at all (dry); not on CUDA here.

use crate::base::error::{Error, Result};
use crate::device::{cpu, cpu_pixtral, cpu_siglip, Backend};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

fn cpu_only(rt: &Runtime, op: &str) -> Result<()> {
    match rt.backend() {
        Backend::Cuda => Err(Error::Device {
            spec: "cuda".into(),
            problem: format!("{op}: the Pixtral vision tower runs on simulated devices only"),
        }),
        _ => Ok(()),
    }
}

fn act(rt: &Runtime, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
    rt.tensor_for_overwrite(name, Category::Activation, shape, dtype)
}

/// `patch_conv(img.unsqueeze(0))` for image `n` of `pixels [N, C, S, S]`: `nn.Conv2d` (vLLM
/// 0.19 `Conv2dLayer`) without a bias, PyTorch's output `[1, D, g, g]` held as the `[g², D]`
/// rows `flatten(2).permute(0, 2, 1)` reads (the same bytes). cuDNN's workspace is not
/// modelled.
pub fn patch_conv(
    rt: &Runtime,
    pixels: &Tensor,
    w: &Tensor,
    (n, channels, size, patch, d): (usize, usize, usize, usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    cpu_only(rt, "patch_conv")?;
    rt.ensure_library_workspaces()?;
    rt.set_op("conv2d");
    let g = size / patch;
    let mut out = act(rt, name, &[g * g, d], pixels.dtype)?;
    if rt.backend() == Backend::Cpu {
        let per = channels * size * size;
        cpu_siglip::patch_embed(
            &pixels.f32()[n * per..(n + 1) * per],
            w.f32(),
            &vec![0.0; d],
            (1, channels, size, patch),
            out.f32_mut(),
        );
    }
    Ok(out)
}

/// `pixtral_patch_embed`'s `F.linear(normalized, weight.reshape(D, -1))` (pixtral.py 0.33.0
/// L1525-1526): the projection `[Σ g², D]` of every image's normalized patch rows in one
/// output. On the CPU it is computed from the uint8 `pixels [N, C, S, S]` normalized with
/// `(weight, bias)` per channel, image by image through the convolution's arithmetic (the
/// same sums).
pub fn patch_linear(
    rt: &Runtime,
    pixels: &Tensor,
    (norm_w, norm_b): (&Tensor, &Tensor),
    w: &Tensor,
    (images, channels, size, patch, d): (usize, usize, usize, usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    cpu_only(rt, "patch_linear")?;
    rt.ensure_library_workspaces()?;
    rt.set_op("linear");
    let g = size / patch;
    let mut out = act(rt, name, &[images * g * g, d], w.dtype)?;
    if rt.backend() == Backend::Cpu {
        let per = channels * size * size;
        let values: Vec<f32> = match &pixels.storage {
            crate::device::tensor::Storage::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
            _ => pixels.f32().to_vec(),
        };
        let (nw, nb) = (norm_w.f32(), norm_b.f32());
        for n in 0..images {
            let img: Vec<f32> = values[n * per..(n + 1) * per]
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let c = i / (size * size);
                    x * nw[c] + nb[c]
                })
                .collect();
            cpu_siglip::patch_embed(
                &img,
                w.f32(),
                &vec![0.0; d],
                (1, channels, size, patch),
                &mut out.f32_mut()[n * g * g * d..(n + 1) * g * g * d],
            );
        }
    }
    Ok(out)
}

/// `torch.cat(parts)` along the rows: one new tensor.
pub fn cat_rows(rt: &Runtime, parts: &[&Tensor], name: &str) -> Result<Tensor> {
    rt.set_op("cat");
    let cols = parts[0].cols();
    let rows: usize = parts.iter().map(|p| p.rows()).sum();
    let mut out = act(rt, name, &[rows, cols], parts[0].dtype)?;
    if rt.backend() == Backend::Cpu {
        let mut at = 0;
        for p in parts {
            let v = p.f32();
            out.f32_mut()[at..at + v.len()].copy_from_slice(v);
            at += v.len();
        }
    }
    Ok(out)
}

/// Which body a vision tower's vLLM `RMSNorm` runs (eagerly: the towers are not compiled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmsNormBody {
    /// `forward_static` (layernorm.py 0.19 L222-265): custom ops off under Inductor, 0.19
    /// and before.
    Static,
    /// The vLLM IR op's native body (ir/ops/layernorm.py 0.21 L9-58, the same text through
    /// 0.33): from 0.21 under Inductor (priority "native"), and in 0.21 under
    /// `--enforce-eager` too (its priority is set only inside a forward context, which the
    /// encoder runs outside of).
    IrNative,
    /// vLLM's C kernel: `--enforce-eager` (custom ops on) up to 0.19 (`forward_cuda`), and
    /// from 0.22 (the IR priority `["vllm_c", "native"]`, set at worker start; kernels/vllm_c.py
    /// 0.33 L23-83): one output for `rms_norm`, none for `fused_add_rms_norm` (in place).
    CKernel,
}

impl RmsNormBody {
    /// The body of vLLM 0.`minor`, with `--enforce-eager` or not.
    pub fn of(minor: u32, enforce_eager: bool) -> RmsNormBody {
        match (minor, enforce_eager) {
            (21, _) => RmsNormBody::IrNative,
            (_, true) => RmsNormBody::CKernel,
            (m, false) if m >= 21 => RmsNormBody::IrNative,
            _ => RmsNormBody::Static,
        }
    }
}

/// vLLM's `RMSNorm` run eagerly by `body`.
pub fn rms_norm_eager(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    eps: f32,
    body: RmsNormBody,
    name: &str,
) -> Result<Tensor> {
    let ir = match body {
        RmsNormBody::CKernel => {
            rt.check_cancel()?;
            rt.set_op("rms_norm_c");
            let mut out = act(rt, name, &x.shape, x.dtype)?;
            if rt.backend() == Backend::Cpu {
                cpu::rms_norm(x.f32(), w.f32(), eps, out.f32_mut());
            }
            return Ok(out);
        }
        RmsNormBody::IrNative => true,
        RmsNormBody::Static => false,
    };
    // `forward_static`: `x.to(float32)`, the variance, `x * rsqrt` (the f32 input dies at the
    // rebind), `.to(orig_dtype)` (the f32 normed tensor dies), `* weight`. The IR body: the f32
    // input held as `x_var`, `x.to(weight.dtype) * weight` in one statement (the cast dies,
    // then the f32 normed tensor), the f32 input and the variance dying as it returns.
    rt.check_cancel()?;
    rt.set_op(if ir {
        "rms_norm_ir_native"
    } else {
        "rms_norm_native"
    });
    let (t, d) = (x.rows(), x.cols());
    let xf = act(rt, &format!("{name}.f32"), &[t, d], DType::F32)?;
    let (var, r) = variance_rsqrt(rt, t, d, name)?;
    let y = act(rt, &format!("{name}.normed"), &[t, d], DType::F32)?;
    drop(r);
    let (xf, dtype) = if ir {
        (Some(xf), w.dtype)
    } else {
        drop(xf);
        (None, x.dtype)
    };
    let yb = act(rt, &format!("{name}.to_dtype"), &[t, d], dtype)?;
    let y = if ir {
        Some(y)
    } else {
        drop(y);
        None
    };
    let mut out = act(rt, name, &[t, d], dtype)?;
    drop(yb);
    drop(y);
    drop(xf);
    drop(var);
    if rt.backend() == Backend::Cpu {
        cpu::rms_norm(x.f32(), w.f32(), eps, out.f32_mut());
    }
    Ok(out)
}

/// An RMSNorm's variance of `[t, d]` f32 rows: `pow` (dies at `.mean`), the variance `[t, 1]`,
/// `variance + eps` (dies at `rsqrt`) and the `rsqrt` `[t, 1]`. Returns (variance, rsqrt).
pub(crate) fn variance_rsqrt(
    rt: &Runtime,
    t: usize,
    d: usize,
    name: &str,
) -> Result<(Tensor, Tensor)> {
    let sq = act(rt, &format!("{name}.pow"), &[t, d], DType::F32)?;
    let var = act(rt, &format!("{name}.variance"), &[t, 1], DType::F32)?;
    drop(sq);
    let shifted = act(rt, &format!("{name}.variance_eps"), &[t, 1], DType::F32)?;
    let r = act(rt, &format!("{name}.rsqrt"), &[t, 1], DType::F32)?;
    drop(shifted);
    Ok((var, r))
}

/// `PixtralRotaryEmbedding.forward` on the position ids of `images` images of `side × side`
/// patches: `inv_freq[position_ids]` (f32 `[T, head_dim]`), its `cos` and `sin` (f32), each
/// cast to the model dtype; the f32 tensors die as it returns. Returns `(cos, sin)`.
pub fn rope_cos_sin(
    rt: &Runtime,
    (images, side, head_dim): (usize, usize, usize),
    theta: f64,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    rt.set_op("pixtral_rope");
    let t = images * side * side;
    let freqs = act(rt, "vision.rope.freqs", &[t, head_dim], DType::F32)?;
    let cf = act(rt, "vision.rope.cos_f32", &[t, head_dim], DType::F32)?;
    let sf = act(rt, "vision.rope.sin_f32", &[t, head_dim], DType::F32)?;
    let mut cos = act(rt, "vision.rope.cos", &[t, head_dim], dtype)?;
    let mut sin = act(rt, "vision.rope.sin", &[t, head_dim], dtype)?;
    drop((freqs, cf, sf));
    if rt.backend() == Backend::Cpu {
        cpu_pixtral::rope_cos_sin(
            (images, side, head_dim),
            theta,
            cos.f32_mut(),
            sin.f32_mut(),
        );
    }
    Ok((cos, sin))
}

/// `apply_rotary_pos_emb`'s `(x * cos) + (rotate_half(x) * sin)` on one of q, k (a view of
/// the fused projection): `x * cos`, then `rotate_half`'s `-x2` (half the width) and its `cat`
/// (`-x2` dies), `* sin` (the `cat` dies), the sum; the two products die as it returns. The
/// result keeps the view's `[T, heads, head_dim]` layout, so the `.transpose(1, 2)
/// .contiguous()` before xFormers copies nothing.
pub fn apply_rope(
    rt: &Runtime,
    x: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    (heads, head_dim): (usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("apply_rotary_pos_emb");
    let shape = [x.rows(), x.cols()];
    let a = act(rt, &format!("{name}.x_cos"), &shape, x.dtype)?;
    let neg = act(
        rt,
        &format!("{name}.neg"),
        &[shape[0], shape[1] / 2],
        x.dtype,
    )?;
    let rot = act(rt, &format!("{name}.rotate_half"), &shape, x.dtype)?;
    drop(neg);
    let b = act(rt, &format!("{name}.rot_sin"), &shape, x.dtype)?;
    drop(rot);
    let mut out = act(rt, name, &shape, x.dtype)?;
    drop((a, b));
    if rt.backend() == Backend::Cpu {
        cpu_pixtral::apply_rope(
            x.f32(),
            cos.f32(),
            sin.f32(),
            (heads, head_dim),
            out.f32_mut(),
        );
    }
    Ok(out)
}

/// transformers' `generate_block_attention_mask` (what vLLM passes SDPA where xFormers is
/// missing, pixtral.py 0.19 L1283-1296): `torch.full((T, T), finfo.min)` in the model dtype,
/// each image's block zeroed in place, then an expanded view. Held through the tower.
pub fn block_mask(rt: &Runtime, tokens: usize, dtype: DType) -> Result<Tensor> {
    cpu_only(rt, "block attention mask")?;
    rt.set_op("block_attention_mask");
    // Never read on the host: the CPU attention takes each image's block directly.
    act(rt, "vision.attention_mask", &[tokens, tokens], dtype)
}

/// PyTorch's SDPA with that float mask (`scaled_dot_product_attention(q, k, v,
/// attn_mask=mask)`): FlashAttention takes no mask, so the memory-efficient kernel runs, and
/// its mask's strides must be multiples of 8 elements: `preprocess_mask` (`mem_eff_alignment
/// = 8`, aten/src/ATen/native/transformers/attention.cpp) pads a `[T, T]` mask with T not a
/// multiple of 8 into a new `[T, T + 8 - T % 8]` tensor for the call (`pad_bias`: `at::pad`,
/// then a slice view). The output `[T, heads · head_dim]`; no log-sum-exp without autograd.
pub fn sdpa_masked(
    rt: &Runtime,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (images, seq, heads, head_dim): (usize, usize, usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    cpu_only(rt, "vision attention")?;
    rt.set_op("sdpa_mem_efficient");
    let t = images * seq;
    let padded = if !t.is_multiple_of(8) {
        Some(act(
            rt,
            &format!("{name}.mask_padded"),
            &[t, t + 8 - t % 8],
            q.dtype,
        )?)
    } else {
        None
    };
    let mut out = act(rt, name, &[t, heads * head_dim], q.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_siglip::vit_attention(
            (q.f32(), k.f32(), v.f32()),
            (images, seq, heads, head_dim),
            (head_dim as f32).powf(-0.5),
            out.f32_mut(),
        );
    }
    drop(padded);
    Ok(out)
}

/// `a + b` into a new tensor (the block's `h = hidden_states + r`, `out = h + r`).
pub fn add(rt: &Runtime, a: &Tensor, b: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("add");
    let mut out = act(rt, name, &a.shape, a.dtype)?;
    if rt.backend() == Backend::Cpu {
        for ((o, x), y) in out.f32_mut().iter_mut().zip(a.f32()).zip(b.f32()) {
            *o = x + y;
        }
    }
    Ok(out)
}

/// `Mistral3PatchMerger`'s reordering of `images` images of `side × side` patches of width
/// `d`: per image `unfold` into a new `[d · m², L]` tensor (its `.view(...).t()` a view), the
/// `cat` of them `[N · L, d · m²]`; the per-image ones die as the merger returns (kept here
/// until the caller's `merging_layer` has run: the caller drops them).
pub fn patch_merge(
    rt: &Runtime,
    x: &Tensor,
    (images, side, d, m): (usize, usize, usize, usize),
    name: &str,
) -> Result<(Tensor, Vec<Tensor>)> {
    rt.check_cancel()?;
    rt.set_op("unfold");
    let l = (side / m) * (side / m);
    let mut grids = Vec::with_capacity(images);
    for n in 0..images {
        grids.push(act(
            rt,
            &format!("{name}.unfold.{n}"),
            &[d * m * m, l],
            x.dtype,
        )?);
    }
    rt.set_op("cat");
    let mut out = act(rt, name, &[images * l, d * m * m], x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_pixtral::patch_merge(x.f32(), (images, side, d, m), out.f32_mut());
    }
    Ok((out, grids))
}

/// `nn.GELU()` (exact), one output.
pub fn gelu(rt: &Runtime, x: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("gelu");
    let mut out = act(rt, name, &x.shape, x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_pixtral::gelu_erf(x.f32(), out.f32_mut());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, DeviceSpec};

    /// 0.33's one-matmul patch embedding of uint8 pixels equals the per-image convolution of
    /// the pixels normalized per channel (on the CPU, fp32).
    #[test]
    fn patch_linear_is_the_convolution_of_the_normalized_pixels() {
        let device = Device::open(&DeviceSpec::parse("sim:h100-80gb").unwrap()).unwrap();
        let rt = Runtime::new(device, std::sync::Arc::default(), None);
        let (images, c, size, patch, d) = (2, 3, 8, 4, 5);
        let n = images * c * size * size;
        let raw: Vec<f32> = (0..n).map(|i| ((i * 37) % 256) as f32).collect();
        let (w, b) = ([0.011f32, 0.013, 0.017], [-1.5f32, -1.25, -2.0]);
        let normed: Vec<f32> = raw
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let ch = (i / (size * size)) % c;
                x * w[ch] + b[ch]
            })
            .collect();
        let t = |name: &str, shape: &[usize], v: Vec<f32>| {
            rt.tensor_with_values(name, Category::Activation, shape, DType::F32, v)
                .unwrap()
        };
        let px = t("px", &[images, c, size, size], raw);
        let px_normed = t("px_normed", &[images, c, size, size], normed);
        let weight: Vec<f32> = (0..d * c * patch * patch)
            .map(|i| ((i % 7) as f32 - 3.0) * 0.05)
            .collect();
        let wt = t("w", &[d, c, patch, patch], weight);
        let (nw, nb) = (t("nw", &[3], w.to_vec()), t("nb", &[3], b.to_vec()));
        let lin = patch_linear(
            &rt,
            &px,
            (&nw, &nb),
            &wt,
            (images, c, size, patch, d),
            "lin",
        )
        .unwrap();
        let g = size / patch;
        for img in 0..images {
            let conv = patch_conv(&rt, &px_normed, &wt, (img, c, size, patch, d), "conv").unwrap();
            let rows = &lin.f32()[img * g * g * d..(img + 1) * g * g * d];
            for (a, b) in rows.iter().zip(conv.f32()) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
        }
    }
}

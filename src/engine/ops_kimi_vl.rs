//! The ops of Kimi-VL's MoonViT tower and projector (vLLM 0.19.0 moonvit.py, kimi_vl.py) beyond
//! the linear, LayerNorm, GELU, residual and varlen-attention ops others share. The tower runs
//! eagerly (it is not under `@support_torch_compile`) with vLLM's custom ops off, so its
//! `Conv2dLayer` runs `forward_native`. Like `ops`, each op allocates through the framework
//! allocator in PyTorch's order, then runs on the CPU or not at all (dry); not on CUDA here.

use crate::base::error::{Error, Result};
use crate::device::{cpu_kimi_vl, cpu_qwen2_5_vl, Backend};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

fn cpu_only(rt: &Runtime, op: &str) -> Result<()> {
    match rt.backend() {
        Backend::Cuda => Err(Error::Device {
            spec: "cuda".into(),
            problem: format!("{op}: the MoonViT vision tower runs on simulated devices only"),
        }),
        _ => Ok(()),
    }
}

fn act(rt: &Runtime, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
    rt.tensor_for_overwrite(name, Category::Activation, shape, dtype)
}

/// `MoonVisionPatchEmbed.proj` on `pixels [L, C · p · p]` (the processor's `[L, C, p, p]`
/// patches): `Conv2dLayer.forward_native` with kernel = stride → `_forward_mulmat` (conv.py
/// 0.19 L117-130): the unfolds, permute and reshape are views of the contiguous patches,
/// `F.linear(x, w.view(D, C·p·p), bias)` makes the one output `[L, D]`; its `view`/`permute`
/// and the caller's `.view(L, -1)` are views again.
pub fn patch_embed(
    rt: &Runtime,
    pixels: &Tensor,
    (w, b): (&Tensor, &Tensor),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    cpu_only(rt, "patch_embed")?;
    rt.ensure_library_workspaces()?;
    rt.set_op("conv2d_as_linear");
    let (l, k) = (pixels.rows(), pixels.numel() / pixels.rows());
    let d = b.numel();
    let mut out = act(rt, name, &[l, d], pixels.dtype)?;
    if rt.backend() == Backend::Cpu {
        let o = out.f32_mut();
        cpu_qwen2_5_vl::linear_nt(pixels.f32(), w.f32(), (l, k, d), o);
        for row in o.chunks_mut(d) {
            for (x, y) in row.iter_mut().zip(b.f32()) {
                *x += y;
            }
        }
    }
    Ok(out)
}

/// `Learnable2DInterpPosEmb.forward` (moonvit.py 0.19 L113-130) on the patch embeddings `x
/// [L, D]` of images of `grids` patches: per image the `[h0, w0, D]` weight itself where the
/// grid is its size (a view), else `F.interpolate(..., mode="bicubic")` (a new `[D, h, w]`)
/// whose permuted `flatten` copies it to `[h · w, D]` (the interpolation dying at once); the
/// `cat` of them `[L, D]`; `x + cat` (a new `[L, D]`; the `cat` dies as the sum is made, the
/// per-image copies as the forward returns).
pub fn add_pos_emb(
    rt: &Runtime,
    x: &Tensor,
    weight: &Tensor,
    (h0, w0): (usize, usize),
    grids: &[(usize, usize)],
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    let d = x.cols();
    let mut parts = Vec::with_capacity(grids.len());
    for (n, &(h, w)) in grids.iter().enumerate() {
        if (h, w) == (h0, w0) {
            parts.push(None);
            continue;
        }
        rt.set_op("interpolate_bicubic");
        let resized = act(rt, &format!("{name}.interpolate.{n}"), &[d, h * w], x.dtype)?;
        rt.set_op("flatten");
        let mut flat = act(rt, &format!("{name}.flatten.{n}"), &[h * w, d], x.dtype)?;
        drop(resized);
        if rt.backend() == Backend::Cpu {
            cpu_kimi_vl::bicubic_resize(weight.f32(), (h0, w0, d), (h, w), flat.f32_mut());
        }
        parts.push(Some(flat));
    }
    rt.set_op("cat");
    let mut cat = act(rt, &format!("{name}.cat"), &[x.rows(), d], x.dtype)?;
    if rt.backend() == Backend::Cpu {
        let mut at = 0;
        for (p, &(h, w)) in parts.iter().zip(grids) {
            let src = match p {
                Some(t) => t.f32(),
                None => weight.f32(),
            };
            cat.f32_mut()[at..at + h * w * d].copy_from_slice(&src[..h * w * d]);
            at += h * w * d;
        }
    }
    rt.set_op("add");
    let mut out = act(rt, name, &x.shape, x.dtype)?;
    if rt.backend() == Backend::Cpu {
        for ((o, a), b) in out.f32_mut().iter_mut().zip(x.f32()).zip(cat.f32()) {
            *o = a + b;
        }
    }
    drop(cat);
    drop(parts);
    Ok(out)
}

/// `Rope2DPosEmb.precomputed_freqs_cis` (moonvit.py 0.19 L217-244), a `cached_property`: made
/// on the first forward and kept on the device for the rest of the run. Its temporaries in
/// order: `flat_pos` `[N]` f32, `x_pos` and `y_pos`, `dim_range` and `freqs`, the `outer`
/// products `[N, C/4]` f32, `torch.polar` of each (complex64, each with its `ones_like`),
/// their `cat` `[N, C/4, 2]` complex64 (the table, N = 512²). Returns the table, held here as
/// the f32 `[N, C]` of the same bytes; the CPU reads the angles per grid instead
/// (`rope_freqs`).
pub fn rope_table(rt: &Runtime, (max_h, max_w): (usize, usize), head_dim: usize) -> Result<Tensor> {
    rt.set_op("rope_2d_precompute");
    let n = max_h * max_w;
    let q = head_dim / 4;
    let f32 = DType::F32;
    let flat = act(rt, "vision.rope_2d.flat_pos", &[n], f32)?;
    let x_pos = act(rt, "vision.rope_2d.x_pos", &[n], f32)?;
    let y_pos = act(rt, "vision.rope_2d.y_pos", &[n], f32)?;
    let range = act(rt, "vision.rope_2d.dim_range", &[q], f32)?;
    let freqs = act(rt, "vision.rope_2d.freqs", &[q], f32)?;
    drop(range);
    let x_f = act(rt, "vision.rope_2d.x_freqs", &[n, q], f32)?;
    let y_f = act(rt, "vision.rope_2d.y_freqs", &[n, q], f32)?;
    let ones = act(rt, "vision.rope_2d.ones_like", &[n, q], f32)?;
    let x_cis = act(rt, "vision.rope_2d.x_cis", &[n, 2 * q], f32)?;
    drop(ones);
    let ones = act(rt, "vision.rope_2d.ones_like", &[n, q], f32)?;
    let y_cis = act(rt, "vision.rope_2d.y_cis", &[n, 2 * q], f32)?;
    drop(ones);
    rt.set_op("cat");
    let table = act(rt, "vision.rope_2d.precomputed_freqs_cis", &[n, 4 * q], f32)?;
    drop((x_cis, y_cis, x_f, y_f, freqs));
    drop((flat, x_pos, y_pos));
    Ok(table)
}

/// `get_freqs_cis_by_seqlens` (moonvit.py 0.19 L246-268): per image the `[:h, :w]` slice of
/// the table reshaped (a copy `[h · w, C/2]` complex64 where the slice is not contiguous), the
/// `cat` of them `[L, C/2]` complex64 (held as f32 `[L, C]`; the per-image copies die as it is
/// made). On the CPU it holds the rotary angles `[L, C/2]` then zeros.
pub fn rope_freqs(
    rt: &Runtime,
    grids: &[(usize, usize)],
    (max_w, head_dim, theta): (usize, usize, f32),
    name: &str,
) -> Result<Tensor> {
    rt.set_op("rope_2d_by_seqlens");
    let mut parts = Vec::with_capacity(grids.len());
    for (n, &(h, w)) in grids.iter().enumerate() {
        // A slice of every column (w == 512) is contiguous: `reshape` is a view.
        if w != max_w {
            parts.push(act(
                rt,
                &format!("{name}.reshape.{n}"),
                &[h * w, head_dim],
                DType::F32,
            )?);
        }
    }
    let l: usize = grids.iter().map(|(h, w)| h * w).sum();
    rt.set_op("cat");
    let mut out = act(rt, name, &[l, head_dim], DType::F32)?;
    drop(parts);
    if rt.backend() == Backend::Cpu {
        let half = head_dim / 2;
        let o = out.f32_mut();
        let mut at = 0;
        for &(h, w) in grids {
            cpu_kimi_vl::rope_2d_angles(
                (h, w),
                head_dim,
                theta,
                &mut o[at * half..][..h * w * half],
            );
            at += h * w;
        }
    }
    Ok(out)
}

/// `apply_rope` (moonvit.py 0.19 L76-96) on this rank's q and k `[L, heads · head_dim]`
/// (views of the fused projection's output): `xq.float()` and `xk.float()` (copies unless the
/// model is f32), the complex products `xq_ * freqs_cis` and `xk_ * freqs_cis` (new f32-sized
/// tensors), then `.type_as(xq)` of each (copies unless f32); the f32 copies and products die
/// as the function returns. Returns the rotated q and k.
pub fn apply_rope(
    rt: &Runtime,
    (q, k): (&Tensor, &Tensor),
    angles: &Tensor,
    (heads, head_dim): (usize, usize),
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    cpu_only(rt, "apply_rope")?;
    rt.set_op("apply_rope_2d");
    let shape = q.shape.clone();
    let f32 = DType::F32;
    let upcast = q.dtype != f32;
    let mut temps = Vec::new();
    if upcast {
        temps.push(act(rt, &format!("{name}.q_float"), &shape, f32)?);
        temps.push(act(rt, &format!("{name}.k_float"), &shape, f32)?);
    }
    let mut q_prod = act(rt, &format!("{name}.q_cis"), &shape, f32)?;
    let mut k_prod = act(rt, &format!("{name}.k_cis"), &shape, f32)?;
    if rt.backend() == Backend::Cpu {
        let a = angles.f32();
        cpu_kimi_vl::apply_rope_interleaved(q.f32(), a, (heads, head_dim), q_prod.f32_mut());
        cpu_kimi_vl::apply_rope_interleaved(k.f32(), a, (heads, head_dim), k_prod.f32_mut());
    }
    if !upcast {
        return Ok((q_prod, k_prod));
    }
    let mut q_out = act(rt, &format!("{name}.q_rot"), &shape, q.dtype)?;
    let mut k_out = act(rt, &format!("{name}.k_rot"), &shape, q.dtype)?;
    if rt.backend() == Backend::Cpu {
        q_out.f32_mut().copy_from_slice(q_prod.f32());
        k_out.f32_mut().copy_from_slice(k_prod.f32());
    }
    drop((q_prod, k_prod));
    drop(temps);
    Ok((q_out, k_out))
}

/// `patch_merger` (moonvit.py 0.19 L504-530) on the tower's output `[L, D]`: per image the
/// permuted `contiguous()` copy `[h · w / m, m · D]` (the views around it free); returns the
/// list, which `_process_image_input` concatenates.
pub fn patch_merge(
    rt: &Runtime,
    x: &Tensor,
    grids: &[(usize, usize)],
    (kh, kw): (usize, usize),
    name: &str,
) -> Result<Vec<Tensor>> {
    rt.check_cancel()?;
    rt.set_op("permute.contiguous");
    let d = x.cols();
    let mut out = Vec::with_capacity(grids.len());
    let mut at = 0;
    for (n, &(h, w)) in grids.iter().enumerate() {
        let mut t = act(
            rt,
            &format!("{name}.{n}"),
            &[h * w / (kh * kw), kh * kw * d],
            x.dtype,
        )?;
        if rt.backend() == Backend::Cpu {
            cpu_kimi_vl::patch_merge(
                &x.f32()[at * d..(at + h * w) * d],
                (h, w, d),
                (kh, kw),
                t.f32_mut(),
            );
        }
        at += h * w;
        out.push(t);
    }
    Ok(out)
}

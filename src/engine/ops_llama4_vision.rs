//! The ops of Llama 4's vision tower (vLLM 0.19 mllama4.py `Llama4VisionModel`,
//! `Llama4VisionAttention`, `pixel_shuffle`; rotary_embedding/llama4_vision_rope.py) beyond the
//! LayerNorm, GELU, linear, attention and residual ops the other towers share. The tower runs
//! eagerly: each op allocates through the framework allocator in PyTorch's order, then runs on
//! the CPU or not at all (dry); not on CUDA here.

use crate::base::error::{Error, Result};
use crate::device::{cpu_llama4_vision as cpu, cpu_siglip, Backend};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

fn cpu_only(rt: &Runtime, op: &str) -> Result<()> {
    match rt.backend() {
        Backend::Cuda => Err(Error::Device {
            spec: "cuda".into(),
            problem: format!("{op}: the Llama 4 vision tower runs on simulated devices only"),
        }),
        _ => Ok(()),
    }
}

fn act(rt: &Runtime, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
    rt.tensor_for_overwrite(name, Category::Activation, shape, dtype)
}

/// `Llama4UnfoldConvolution.forward`'s input side (mllama4.py 0.19 L448-451): `self.unfold`
/// makes `[N, C · p², g²]` (im2col), `permute(0, 2, 1)` a view, and the linear's `matmul`
/// copies that view to the `[N · g², C · p²]` rows it multiplies (`reshape` of a permuted
/// tensor). Returns the rows; the unfold's output dies as the caller's `hidden_states` is
/// rebound, after the linear: it is returned too, for the caller to drop then.
pub fn unfold_rows(
    rt: &Runtime,
    pixels: &Tensor,
    (tiles, channels, size, patch): (usize, usize, usize, usize),
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    cpu_only(rt, "the unfold patch embedding")?;
    rt.set_op("unfold");
    let g = size / patch;
    let (k, l) = (channels * patch * patch, g * g);
    let mut unfolded = act(rt, &format!("{name}.unfold"), &[tiles, k, l], pixels.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu::unfold(
            pixels.f32(),
            (tiles, channels, size, patch),
            unfolded.f32_mut(),
        );
    }
    rt.set_op("permute.reshape");
    let mut rows = act(rt, &format!("{name}.rows"), &[tiles * l, k], pixels.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_siglip::transpose_12(unfolded.f32(), (tiles, k, l), rows.f32_mut());
    }
    Ok((rows, unfolded))
}

/// `torch.cat([hidden_state, class_embedding.expand(N, 1, D)], dim=1)` (mllama4.py 0.19
/// L514-517): a new `[N · (g² + 1), D]`.
pub fn cat_class(
    rt: &Runtime,
    patches: &Tensor,
    class: &Tensor,
    tiles: usize,
    name: &str,
) -> Result<Tensor> {
    rt.set_op("cat");
    let d = class.numel();
    let l = patches.numel() / (tiles * d);
    let mut out = act(rt, name, &[tiles * (l + 1), d], patches.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu::cat_class(patches.f32(), class.f32(), (tiles, l), out.f32_mut());
    }
    Ok(out)
}

/// `hidden_state + positional_embedding` (mllama4.py 0.19 L527-530): the `[g² + 1, D]` table
/// broadcast over the tiles, into a new tensor.
pub fn add_positions(rt: &Runtime, x: &Tensor, table: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("add");
    let mut out = act(rt, name, &x.shape, x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu::add_broadcast(x.f32(), table.f32(), out.f32_mut());
    }
    Ok(out)
}

/// `Llama4VisionRotaryEmbedding.forward_native` on q and k (llama4_vision_rope.py 0.19
/// L55-76), each `[N · seq, heads · head_dim]`: `query.float()` and `key.float()` (f32
/// copies), the complex products (complex64, as many bytes as an f32 copy), then
/// `.type_as(query)` of each (new tensors in the model dtype); the f32 copies and the
/// products die as the function returns. `angles` is `cpu::rope_angles`'s table (the
/// complex64 `cos_sin_cache` moved to the device, already there: no allocation).
pub fn rope_qk(
    rt: &Runtime,
    (q, k): (&Tensor, &Tensor),
    angles: &[(f32, f32)],
    (seq, heads, head_dim): (usize, usize, usize),
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    cpu_only(rt, "the vision rotary")?;
    rt.set_op("vision_rope");
    let q32 = act(rt, &format!("{name}.q_float"), &q.shape, DType::F32)?;
    let k32 = act(rt, &format!("{name}.k_float"), &k.shape, DType::F32)?;
    let q_prod = act(rt, &format!("{name}.q_complex"), &q.shape, DType::F32)?;
    let k_prod = act(rt, &format!("{name}.k_complex"), &k.shape, DType::F32)?;
    let mut q_out = act(rt, &format!("{name}.q"), &q.shape, q.dtype)?;
    let mut k_out = act(rt, &format!("{name}.k"), &k.shape, k.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu::rope_apply(q.f32(), angles, (seq, heads, head_dim), q_out.f32_mut());
        cpu::rope_apply(k.f32(), angles, (seq, heads, head_dim), k_out.f32_mut());
    }
    drop((q32, k32, q_prod, k_prod));
    Ok((q_out, k_out))
}

/// `pixel_shuffle(hidden_state[:, :-1, :], ratio)` (mllama4.py 0.19 L180-202, L538-542) on
/// the encoder's `[N · (g² + 1), D]` output: the class rows are dropped by a view, then two
/// `permute(0, 2, 1, 3).contiguous()` copies, `[N, g/s, g, s · D]` and `[N, g/s, g/s, s² ·
/// D]`; the first dies at the rebind. Returns `[N · (g/s)², s² · D]`.
pub fn pixel_shuffle(
    rt: &Runtime,
    x: &Tensor,
    (tiles, g, s): (usize, usize, usize),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("pixel_shuffle");
    let d = x.cols();
    let (l, m) = (g * g, g / s);
    let mut first = act(rt, &format!("{name}.permute_1"), &[tiles * l, d], x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu::permute_0213(x.f32(), (l + 1) * d, (tiles, g, m, s * d), first.f32_mut());
    }
    let mut out = act(rt, name, &[tiles * m * m, s * s * d], x.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu::permute_0213(first.f32(), l * d, (tiles, m, m, s * s * d), out.f32_mut());
    }
    drop(first);
    Ok(out)
}

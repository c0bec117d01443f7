//! The ops of LLaVA-NeXT's image features beyond the SigLIP tower's and the projector's
//! linears (vLLM 0.19 vision.py `resolve_visual_encoder_outputs`, llava_next.py
//! `_merge_image_patch_embeddings`). Each allocates through the framework allocator in
//! PyTorch's order, then runs on the CPU or not at all (dry).

use crate::base::error::Result;
use crate::device::{cpu_llava, Backend};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::Tensor;
use crate::memory::Category;

/// `torch.cat(hs_pool, dim=-1)` of the feature layers' hidden states, each `[T, D]`: one new
/// `[T, D · k]` tensor (vision.py 0.19 L274).
pub fn cat_features(rt: &Runtime, parts: &[&Tensor], name: &str) -> Result<Tensor> {
    rt.set_op("cat");
    let (rows, d) = (parts[0].rows(), parts[0].cols());
    let mut out = rt.tensor_for_overwrite(
        name,
        Category::Activation,
        &[rows, d * parts.len()],
        parts[0].dtype,
    )?;
    if rt.backend() == Backend::Cpu {
        let views: Vec<&[f32]> = parts.iter().map(|p| p.f32()).collect();
        cpu_llava::cat_cols(&views, (rows, d), out.f32_mut());
    }
    Ok(out)
}

/// Where one image's tiles sit once unpadded: the grid `(rows, cols)` of `g × g` patches and
/// `unpad_image`'s window `(top, left, height, width)` in patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnpadGrid {
    pub rows: usize,
    pub cols: usize,
    pub g: usize,
    pub window: (usize, usize, usize, usize),
}

/// `_merge_image_patch_embeddings(strategy="spatial_unpad")` on one image's projected crops
/// `[1 + rows · cols, g², H]` (llava_next.py 0.19 L352-433): the tiles' `permute(...)
/// .contiguous()` (a new `[H, rows · g, cols · g]`), the `cat` with `image_newline`
/// (a new `[H, height, width + 1]`; the permuted copy dies at the rebind), the `cat` with the
/// base crop (a new `[g² + height · (width + 1), H]`; the newline `cat` dies as the function
/// returns). Returns the image's embeddings.
pub fn spatial_unpad_merge(
    rt: &Runtime,
    crops: &Tensor,
    newline: &Tensor,
    grid: UnpadGrid,
    name: &str,
) -> Result<Tensor> {
    let h = crops.cols();
    let UnpadGrid { rows, cols, g, .. } = grid;
    let (top, left, ch, cw) = grid.window;
    let np = g * g;
    let base = crops.part(format!("{name}.base"), 0, &[np, h]);
    let tiles = crops.part(format!("{name}.tiles"), np * h, &[rows * cols * np, h]);
    rt.set_op("permute.contiguous");
    let mut planes = rt.tensor_for_overwrite(
        format!("{name}.permute"),
        Category::Activation,
        &[h, rows * g * cols * g],
        crops.dtype,
    )?;
    if rt.backend() == Backend::Cpu {
        cpu_llava::tiles_to_planes(tiles.f32(), (rows, cols, g, h), planes.f32_mut());
    }
    rt.set_op("cat");
    let mut lined = rt.tensor_for_overwrite(
        format!("{name}.newline_cat"),
        Category::Activation,
        &[h, ch * (cw + 1)],
        crops.dtype,
    )?;
    if rt.backend() == Backend::Cpu {
        cpu_llava::unpad_with_newline(
            planes.f32(),
            newline.f32(),
            (h, rows * g, cols * g),
            (top, left, ch, cw),
            lined.f32_mut(),
        );
    }
    drop(planes);
    let n = ch * (cw + 1);
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &[np + n, h], crops.dtype)?;
    if rt.backend() == Backend::Cpu {
        cpu_llava::base_then_transposed(base.f32(), lined.f32(), (n, h), out.f32_mut());
    }
    drop(lined);
    Ok(out)
}

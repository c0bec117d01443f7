//! Kimi-VL's vision side (`KimiVLForConditionalGeneration`, moonshotai/Kimi-VL-A3B-*) as vLLM
//! 0.19 builds and runs it: the MoonViT tower (`MoonVitPretrainedModel`, moonvit.py 0.19
//! L533-589) and `KimiVLMultiModalProjector` (kimi_vl.py 0.19 L94-129). The language model is
//! DeepSeek-V3's (`deepseek_v2.rs`).
//!
//! Weights (made before the language model's, `__init__` L319-335): the patch embedding
//! (`Conv2dLayer` with bias) and the `[64, 64, D]` position grid, whole on every rank; per block
//! `norm0`, `norm1` (LayerNorms), `mlp.fc0` (ColumnParallelLinear), `mlp.fc1`
//! (RowParallelLinear), `wqkv` (QKVParallelLinear from the checkpoint's fused `wqkv`: this
//! rank's rows of each of q, k, v), `wo` (RowParallelLinear), all with biases (L338-388), in
//! that order; `final_layernorm`; then the projector's `pre_norm`, `linear_1` and `linear_2`
//! (`ReplicatedLinear`: whole on every rank). All in the model dtype.

use std::cell::RefCell;

use crate::base::error::{Error, Result};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_kimi_vl as k, ops_phi, ops_pixtral, ops_qwen2_5_vl, ops_tp};
use crate::memory::Category;
use crate::model::config::kimi_vl::{PROJECTOR, TOWER};
use crate::model::config::{KimiVlShape, ModelConfig};
use crate::model::layers::linear::BiasedLinear;
use crate::model::layers::norm::LayerNorm;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, Loader};
use crate::model::models::vision_check;
use crate::model::weights::WeightSource;
use crate::quant::FusedLinear;

/// The 2D rotary's base and grid (`Rope2DPosEmb(head_dim, 512, 512)`, theta_base 10000,
/// moonvit.py 0.19 L198-212 and L467-469).
const ROPE_THETA: f32 = 10000.0;
const ROPE_GRID: (usize, usize) = (512, 512);

/// `nn.LayerNorm`'s default epsilon: MoonViT's norms and the projector's `pre_norm`
/// (moonvit.py 0.19 L360-361, L479; kimi_vl.py 0.19 L109).
const LN_EPS: f32 = 1e-5;

/// An image's patch grid (rows, columns).
pub type Grid = (usize, usize);

/// One `MoonVitEncoderLayer`.
pub struct MoonVitBlock {
    pub norm0: LayerNorm,
    pub norm1: LayerNorm,
    pub fc0: BiasedLinear,
    pub fc1: BiasedLinear,
    pub wqkv: FusedLinear,
    pub wqkv_bias: Tensor,
    pub wo: BiasedLinear,
}

/// The MoonViT tower and projector of a `KimiVLForConditionalGeneration`.
pub struct KimiVlVision {
    pub shape: KimiVlShape,
    pub act: DType,
    /// This rank's heads (all of them with one GPU).
    pub local_heads: usize,
    /// `[D, C · p · p]` (the conv weight's view) and `[D]`.
    pub patch_w: Tensor,
    pub patch_b: Tensor,
    /// `[h0 · w0, D]`.
    pub pos_emb: Tensor,
    pub blocks: Vec<MoonVitBlock>,
    pub final_layernorm: LayerNorm,
    pub pre_norm: LayerNorm,
    pub linear_1: BiasedLinear,
    pub linear_2: BiasedLinear,
    /// `Rope2DPosEmb.precomputed_freqs_cis`, made on the first forward and kept.
    rope_table: RefCell<Option<Tensor>>,
}

fn layer_norm(ld: &mut Loader, name: &str, d: usize) -> Result<LayerNorm> {
    Ok(LayerNorm {
        w: ld.dense(&format!("{name}.weight"), &[d])?,
        b: ld.dense(&format!("{name}.bias"), &[d])?,
    })
}

impl KimiVlVision {
    /// Loads the tower and projector through the framework allocator in vLLM's order.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg.kimi_vl.clone().ok_or_else(|| {
            Error::Request("this config has no vision tower (model_type kimi_vl)".into())
        })?;
        opts.require_16bit(
            src,
            "kimi_vl (multimodal)",
            "its MoonViT vision tower's quantized linear layers are not modelled",
        )?;
        let s = &shape.vision;
        let shard = TpShard::of_ranks(rt);
        shape.check_tp(shard.size).map_err(Error::Request)?;
        let mut ld = Loader::new(rt, src, opts, shape.tensor_shapes(cfg.hidden_size).len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (d, i, p) = (s.hidden_size, s.intermediate_size, s.patch_size);
        let pe = format!("{TOWER}.patch_embed");
        let patch_w = ld.dense(&format!("{pe}.proj.weight"), &[d, 3, p, p])?;
        let patch_b = ld.dense(&format!("{pe}.proj.bias"), &[d])?;
        let pos_emb = ld.dense(
            &format!("{pe}.pos_emb.weight"),
            &[s.pos_emb_height, s.pos_emb_width, d],
        )?;
        let (h_first, h_len) = (shard.rank * d / shard.size, d / shard.size);
        let (f_first, f_len) = (shard.rank * i / shard.size, i / shard.size);
        let mut blocks = Vec::with_capacity(s.num_layers);
        for l in 0..s.num_layers {
            rt.set_layer(Some(l as u32));
            let b = format!("{TOWER}.encoder.blocks.{l}");
            let norm0 = layer_norm(&mut ld, &format!("{b}.norm0"), d)?;
            let norm1 = layer_norm(&mut ld, &format!("{b}.norm1"), d)?;
            let fc0 = BiasedLinear::load_column(
                &mut ld,
                &format!("{b}.mlp.fc0"),
                (i, d),
                (f_first, f_len),
            )?;
            let fc1 = BiasedLinear::load_row(
                &mut ld,
                &format!("{b}.mlp.fc1"),
                (d, i),
                (f_first, f_len),
                shard.rank,
            )?;
            // The checkpoint's `wqkv` is fused `[3D, D]`: this rank's rows of each of q, k
            // and v (QKVParallelLinear's loader on the packed shard).
            let parts = [
                (h_first, h_len),
                (d + h_first, h_len),
                (2 * d + h_first, h_len),
            ];
            let wqkv = ld.fused_parts(
                &[0, 1, 2].map(|_| format!("{b}.wqkv.weight")),
                &[3 * d; 3],
                &parts,
                d,
                &format!("{b}.wqkv.weight"),
            )?;
            let wqkv_bias = ld.dense_concat_parts(
                &[0, 1, 2].map(|_| format!("{b}.wqkv.bias")),
                &[3 * d; 3],
                &parts,
                &format!("{b}.wqkv.bias"),
            )?;
            let wo = BiasedLinear::load_row(
                &mut ld,
                &format!("{b}.wo"),
                (d, d),
                (h_first, h_len),
                shard.rank,
            )?;
            blocks.push(MoonVitBlock {
                norm0,
                norm1,
                fc0,
                fc1,
                wqkv,
                wqkv_bias,
                wo,
            });
        }
        rt.set_layer(None);
        let final_layernorm = layer_norm(&mut ld, &format!("{TOWER}.encoder.final_layernorm"), d)?;
        let w = s.projector_width();
        let th = cfg.hidden_size;
        let pre_norm = layer_norm(&mut ld, &format!("{PROJECTOR}.pre_norm"), d)?;
        // ReplicatedLinear: the whole weight and bias on every rank.
        let linear_1 =
            BiasedLinear::load_column(&mut ld, &format!("{PROJECTOR}.linear_1"), (w, w), (0, w))?;
        let linear_2 =
            BiasedLinear::load_column(&mut ld, &format!("{PROJECTOR}.linear_2"), (th, w), (0, th))?;
        Ok(KimiVlVision {
            local_heads: s.num_heads / shard.size,
            act,
            patch_w,
            patch_b,
            pos_emb,
            blocks,
            final_layernorm,
            pre_norm,
            linear_1,
            linear_2,
            shape,
            rope_table: RefCell::new(None),
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        let mut b = self.patch_w.nbytes() + self.patch_b.nbytes() + self.pos_emb.nbytes();
        for l in &self.blocks {
            b += l.norm0.bytes()
                + l.norm1.bytes()
                + l.fc0.weight_bytes()
                + l.fc1.weight_bytes()
                + l.wqkv.weight_bytes()
                + l.wqkv_bias.nbytes()
                + l.wo.weight_bytes();
        }
        b + self.final_layernorm.bytes()
            + self.pre_norm.bytes()
            + self.linear_1.weight_bytes()
            + self.linear_2.weight_bytes()
    }

    /// Bytes the tower keeps on the device after a pass: the 2D rotary table (`[512, 512,
    /// head_dim / 2]` complex64, a `cached_property`), rounded as the allocator rounds it.
    pub fn cached_rope_bytes(&self) -> u64 {
        self.rope_table
            .borrow()
            .as_ref()
            .map_or(0, |t| crate::memory::allocator::round_size(t.nbytes()))
    }

    /// `_process_image_input` on the images of `grids` (patch rows, columns) whose
    /// `pixel_values [Σ h·w, C, p, p]` are on the device (kimi_vl.py 0.19 L359-379): the tower
    /// (`MoonVitPretrainedModel.forward`), the `cat` of its per-image merged outputs, the
    /// projector. Returns the embeddings `[Σ h·w / 4, text_hidden]` in the images' order
    /// (vLLM's `split` gives views of it).
    pub fn encode(
        &self,
        rt: &Runtime,
        pixels: &Tensor,
        grids: &[(usize, usize)],
    ) -> Result<Tensor> {
        let s = &self.shape.vision;
        let (heads, hd) = (self.local_heads, s.head_dim());
        let act = self.act;
        let seq: usize = grids.iter().map(|(h, w)| h * w).sum();
        if pixels.rows() != seq {
            return Err(Error::Request(format!(
                "kimi_vl: {} pixel rows for grids of {seq} patches",
                pixels.rows()
            )));
        }
        let (kh, kw) = s.merge_kernel;
        if let Some(&(h, w)) = grids
            .iter()
            .find(|&&(h, w)| h % kh != 0 || w % kw != 0 || h > ROPE_GRID.0 || w > ROPE_GRID.1)
        {
            return Err(Error::Request(format!(
                "kimi_vl: a grid of {h} × {w} patches is not whole {kh} × {kw} groups within 512 × 512"
            )));
        }
        rt.set_layer(None);
        // MoonVisionPatchEmbed.forward (L161-173): the projection, then the position
        // embedding's sum (the projection dies at the rebind).
        let x = k::patch_embed(
            rt,
            pixels,
            (&self.patch_w, &self.patch_b),
            "vision.patch_embed",
        )?;
        let mut hidden = k::add_pos_emb(
            rt,
            &x,
            &self.pos_emb,
            (s.pos_emb_height, s.pos_emb_width),
            grids,
            "vision.pos_emb",
        )?;
        drop(x);
        // MoonVitEncoder.forward (L481-501): the rotary table on the first call, this batch's
        // `freqs_cis`, `lengths` and `cu_seqlens` (int32 on the device).
        if self.rope_table.borrow().is_none() {
            let t = k::rope_table(rt, ROPE_GRID, hd)?;
            *self.rope_table.borrow_mut() = Some(t);
        }
        let freqs = k::rope_freqs(
            rt,
            grids,
            (ROPE_GRID.1, hd, ROPE_THETA),
            "vision.rope_freqs_cis",
        )?;
        // `torch.cat((torch.zeros(1), grid_hw[:, 0] * grid_hw[:, 1]))` (moonvit.py 0.19
        // L486-491; 0.29.0 L557-563 multiplies the host grid and copies the `[N]` product: the
        // same device tensors), the two parts dying with the call; `lengths` is a local of the
        // encoder's forward, held to its end.
        let zero = ops_qwen2_5_vl::host_to_device(rt, "vision.lengths.zero", 1, DType::I64)?;
        let areas =
            ops_qwen2_5_vl::host_to_device(rt, "vision.lengths.areas", grids.len(), DType::I64)?;
        let lengths =
            ops_qwen2_5_vl::host_to_device(rt, "vision.lengths", grids.len() + 1, DType::I64)?;
        drop(zero);
        drop(areas);
        let cu_dev =
            ops_qwen2_5_vl::host_to_device(rt, "vision.cu_seqlens", grids.len() + 1, DType::I32)?;
        let mut cu = vec![0usize];
        for &(h, w) in grids {
            cu.push(cu.last().expect("a leading 0") + h * w);
        }
        for (li, b) in self.blocks.iter().enumerate() {
            rt.set_layer(Some(li as u32));
            let l = format!("vision.blocks.{li}");
            let n0 = ops_phi::layer_norm(
                rt,
                &hidden,
                &b.norm0.w,
                &b.norm0.b,
                LN_EPS,
                &format!("{l}.norm0"),
            )?;
            let attn = self.attention(rt, b, &n0, &freqs, &cu, (heads, hd), &l)?;
            drop(n0);
            let h1 = ops_pixtral::add(rt, &hidden, &attn, &format!("{l}.residual_attn"))?;
            drop(attn);
            drop(hidden);
            let n1 = ops_phi::layer_norm(
                rt,
                &h1,
                &b.norm1.w,
                &b.norm1.b,
                LN_EPS,
                &format!("{l}.norm1"),
            )?;
            let f0 = b.fc0.forward(rt, &n1, &format!("{l}.mlp.fc0"), 0, act)?;
            let g = ops_phi::gelu_new(rt, &f0, &format!("{l}.mlp.act"))?;
            drop(f0);
            let f1 = b.fc1.forward(rt, &g, &format!("{l}.mlp.fc1"), 0, act)?;
            let f1 = ops_tp::all_reduce(rt, f1, &format!("{l}.mlp.fc1.all_reduce"))?;
            drop(g);
            drop(n1);
            let out = ops_pixtral::add(rt, &h1, &f1, &format!("{l}.residual_mlp"))?;
            drop(f1);
            drop(h1);
            hidden = out;
        }
        rt.set_layer(None);
        let normed = ops_phi::layer_norm(
            rt,
            &hidden,
            &self.final_layernorm.w,
            &self.final_layernorm.b,
            LN_EPS,
            "vision.final_layernorm",
        )?;
        drop(hidden);
        // The encoder's locals die as it returns.
        drop(freqs);
        drop(lengths);
        drop(cu_dev);
        let merged = k::patch_merge(rt, &normed, grids, s.merge_kernel, "vision.patch_merger")?;
        drop(normed);
        // `torch.cat(image_features)` (kimi_vl.py 0.19 L379); the list dies with the call.
        let parts: Vec<&Tensor> = merged.iter().collect();
        let cat = ops_pixtral::cat_rows(rt, &parts, "vision.features.cat")?;
        drop(parts);
        drop(merged);
        // The projector: `pre_norm` over the tower's width (the `[N, 4, D]` rows), the
        // `[N, 4D]` view, linear_1, GELU, linear_2 (each intermediate dies at the rebind).
        let d = s.hidden_size;
        let rows = cat.rows() * s.merge_unit();
        let flat = cat.part("projector.rows", 0, &[rows, d]);
        let pn = ops_phi::layer_norm(
            rt,
            &flat,
            &self.pre_norm.w,
            &self.pre_norm.b,
            LN_EPS,
            "projector.pre_norm",
        )?;
        drop(flat);
        drop(cat);
        let view = pn.part(
            "projector.view",
            0,
            &[rows / s.merge_unit(), s.projector_width()],
        );
        let h1 = self
            .linear_1
            .forward(rt, &view, "projector.linear_1", 0, act)?;
        drop(view);
        drop(pn);
        let a = ops_pixtral::gelu(rt, &h1, "projector.act")?;
        drop(h1);
        let out = self
            .linear_2
            .forward(rt, &a, "projector.linear_2", 0, act)?;
        drop(a);
        Ok(out)
    }

    /// `MoonVitEncoderLayer.attention_qkvpacked` (moonvit.py 0.19 L390-429): `wqkv` (one
    /// output), its q/k/v views, the 2D rotary, the packed attention per image, `wo`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        rt: &Runtime,
        b: &MoonVitBlock,
        x: &Tensor,
        freqs: &Tensor,
        cu: &[usize],
        (heads, hd): (usize, usize),
        l: &str,
    ) -> Result<Tensor> {
        let act = self.act;
        let qkv = b.wqkv.forward(rt, x, &format!("{l}.wqkv"), 0, act)?;
        let w = heads * hd;
        let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
        let bias_names = ["q", "k", "v"].map(|n| format!("{l}.{n}_bias"));
        let mut parts = FusedLinear::split(&qkv, &[w; 3], &names);
        for (part, bias) in
            parts
                .iter_mut()
                .zip(FusedLinear::split_flat(&b.wqkv_bias, &[w; 3], &bias_names))
        {
            ops::add_bias(rt, part, &bias)?;
        }
        let (qr, kr) = k::apply_rope(
            rt,
            (&parts[0], &parts[1]),
            freqs,
            (heads, hd),
            &format!("{l}.rope"),
        )?;
        let o = ops_qwen2_5_vl::varlen_attention(
            rt,
            (&qr, &kr, &parts[2]),
            cu,
            (heads, hd),
            &format!("{l}.attn"),
        )?;
        let out = b.wo.forward(rt, &o, &format!("{l}.wo"), 0, act)?;
        let out = ops_tp::all_reduce(rt, out, &format!("{l}.wo.all_reduce"))?;
        // The function's locals die as it returns.
        drop((qr, kr));
        drop(parts);
        drop(qkv);
        drop(o);
        Ok(out)
    }
}

/// The runner's dummy inputs for `items` images of the dummy size, batched on the host and
/// moved to the device: `pixel_values [items · h · w, 3, p, p]` in the model dtype (a flat
/// field: the images' patches concatenated, kimi_vl.py 0.19 L240-250) and `image_grid_hws
/// [items, 2]` int64. Returns them and the images' grids.
pub fn dummy_pixels(
    rt: &Runtime,
    shape: &KimiVlShape,
    items: usize,
    act: DType,
    grid_on_host: bool,
) -> Result<(Vec<Tensor>, Vec<Grid>)> {
    let (h, w) = shape.dummy_grid();
    let p = shape.vision.patch_size;
    rt.set_op("mm_dummy_batch");
    let mut out = vec![rt.tensor(
        "pixel_values",
        Category::Activation,
        &[items * h * w, 3 * p * p],
        act,
    )?];
    if !grid_on_host {
        out.push(rt.tensor(
            "image_grid_hws",
            Category::Activation,
            &[items, 2],
            DType::I64,
        )?);
    }
    Ok((out, vec![(h, w); items]))
}

/// The test images of tests/kimi_vl_reference.rs and scripts/kimi_vl_reference.py:
/// `pixel_values [Σ h·w, 3 · p · p]` whose flat element `i` holds `sin(0.013 · i)`.
pub fn test_pixels(rows: usize, k: usize) -> Vec<f32> {
    (0..rows * k)
        .map(|i| (0.013 * i as f64).sin() as f32)
        .collect()
}

/// The projected embeddings of the test images of `grids` through the tower and projector of
/// the checkpoint at `dir`, computed on the CPU (fp32) by the same load and ops a profile runs.
pub fn encode_test_images(dir: &std::path::Path, grids: &[(usize, usize)]) -> Result<Vec<f32>> {
    let source = crate::model::ModelSource::Path {
        path: dir.to_path_buf(),
    };
    let opened = crate::model::open(&source, 0)?;
    let shape = opened.config.kimi_vl.clone().ok_or_else(|| {
        Error::Request(format!(
            "{}: not a kimi_vl (multimodal) checkpoint",
            dir.display()
        ))
    })?;
    let (rt, opts) = vision_check::sim_runtime("sim:h100-80gb", crate::quant::Quant::F16)?;
    let v = KimiVlVision::load(&rt, &opened.config, opened.source.as_ref(), &opts)?;
    let p = shape.vision.patch_size;
    let k = 3 * p * p;
    let rows: usize = grids.iter().map(|(h, w)| h * w).sum();
    let px = rt.tensor_with_values(
        "pixel_values",
        Category::Activation,
        &[rows, k],
        v.act,
        test_pixels(rows, k),
    )?;
    let out = v.encode(&rt, &px, grids)?;
    ops::read_f32(&rt, &out)?
        .ok_or_else(|| Error::Request("the embeddings were not computed (a dry device)".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kimi-VL-A3B's tower and projector weigh their parameters in bf16 (every one loaded).
    #[test]
    fn the_tower_weighs_what_vllm_loads() {
        let (cfg, rt, opts, src) = vision_check::preset_on_h100("kimi-vl-a3b");
        let v = KimiVlVision::load(&rt, &cfg, src.source.as_ref(), &opts).unwrap();
        let mm = cfg.kimi_vl.as_ref().unwrap();
        assert_eq!(v.weight_bytes(), mm.param_count(2048) * 2);
    }
}

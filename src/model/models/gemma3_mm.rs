//! Gemma 3's vision side as vLLM builds and runs it: the SigLIP vision tower
//! (`model_executor/models/siglip.py` `SiglipVisionModel`) and `Gemma3MultiModalProjector`
//! (`gemma3_mm.py`), op-identical in 0.10.0, 0.11.0, 0.15.0 and 0.19.0 for what is allocated. The
//! language model is gemma3_text's (`llama.rs` with `gemma.rs`).
//!
//! Weights (made before the language model's: `Gemma3ForConditionalGeneration.__init__`,
//! gemma3_mm.py 0.11 L505-517): the patch embedding (`nn.Conv2d`, whole on every rank), the
//! position embedding (`VocabParallelEmbedding`, rows split over tensor-parallel ranks), per
//! layer `layer_norm1`, `qkv_proj` (QKVParallelLinear with bias), `out_proj`
//! (RowParallelLinear), `layer_norm2`, `fc1` (ColumnParallelLinear), `fc2` (RowParallelLinear)
//! (siglip.py 0.11 L146-262), `post_layernorm` (kept: every layer is used, L396-404), then the
//! projector's `mm_input_projection_weight [D, H]` and `mm_soft_emb_norm` (whole on every rank).
//! All in the model dtype.

use crate::base::error::{Error, Result};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_phi, ops_siglip, ops_tp};
use crate::memory::Category;
use crate::model::config::gemma3_mm::{PROJECTOR, TOWER};
use crate::model::config::{Gemma3MmShape, ModelConfig, SiglipShape};
use crate::model::layers::linear::BiasedLinear;
use crate::model::layers::norm::LayerNorm;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, Loader};
use crate::model::models::vision_check;
use crate::model::weights::WeightSource;
use crate::quant::FusedLinear;

/// One `SiglipEncoderLayer`.
pub struct SiglipLayer {
    pub layer_norm1: LayerNorm,
    pub qkv: FusedLinear,
    pub qkv_bias: Tensor,
    pub out_proj: BiasedLinear,
    pub layer_norm2: LayerNorm,
    pub fc1: BiasedLinear,
    pub fc2: BiasedLinear,
}

/// A SigLIP vision tower as vLLM's `SiglipVisionTransformer` builds it (siglip.py), without
/// `post_layernorm` or the pooling head: the families keep those or not (Gemma 3 keeps the
/// norm, LLaVA-NeXT neither). `layers` may be fewer than the checkpoint's
/// (`num_hidden_layers_override`, siglip.py 0.19 L523-553).
pub struct SiglipTower {
    pub shape: SiglipShape,
    pub act: DType,
    /// This rank's heads (all of them with one GPU).
    pub local_heads: usize,
    /// `[D, C, p, p]` and `[D]`.
    pub patch_w: Tensor,
    pub patch_b: Tensor,
    /// This rank's rows of `[num_patches, D]`.
    pub pos_embed: Tensor,
    pub pos_first_row: usize,
    /// `VocabParallelEmbedding` positions (Gemma 3's reading) or an `nn.Embedding`'s.
    pub pos_vocab_parallel: bool,
    pub layers: Vec<SiglipLayer>,
    /// FlashAttention's varlen call (its `cu_seqlens`) or SDPA (none): the release's vision
    /// attention backend on this GPU.
    pub varlen_attention: bool,
}

/// The vision tower and the projector of a `Gemma3ForConditionalGeneration`.
pub struct Gemma3Vision {
    pub shape: Gemma3MmShape,
    pub act: DType,
    pub tower: SiglipTower,
    pub post_layernorm: LayerNorm,
    /// `[D, text_hidden]`.
    pub proj_w: Tensor,
    pub soft_emb_norm: Tensor,
}

impl SiglipTower {
    /// Loads the embeddings and the first `num_layers` encoder layers under `prefix` (the
    /// checkpoint's `vision_tower.vision_model`) through the framework allocator, in vLLM's
    /// order. The position embedding is a `VocabParallelEmbedding` (rows padded to 64 and
    /// split over ranks) with `pos_vocab_parallel`, else an `nn.Embedding` whole on every rank
    /// (siglip.py 0.19 L301-303).
    pub(crate) fn load(
        rt: &Runtime,
        ld: &mut Loader,
        s: &SiglipShape,
        prefix: &str,
        num_layers: usize,
        pos_vocab_parallel: bool,
    ) -> Result<Self> {
        let shard = TpShard::of_ranks(rt);
        if !s.num_heads.is_multiple_of(shard.size)
            || !s.intermediate_size.is_multiple_of(shard.size)
        {
            return Err(Error::Request(format!(
                "--tp {}: the vision tower's {} heads or MLP of {} do not divide over the GPUs",
                shard.size, s.num_heads, s.intermediate_size
            )));
        }
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (d, i) = (s.hidden_size, s.intermediate_size);
        let e = format!("{prefix}.embeddings");
        let patch_w = ld.dense(
            &format!("{e}.patch_embedding.weight"),
            &[d, s.num_channels, s.patch_size, s.patch_size],
        )?;
        let patch_b = ld.dense(&format!("{e}.patch_embedding.bias"), &[d])?;
        let np = s.num_patches();
        let pos_name = format!("{e}.position_embedding.weight");
        let (pos_first_row, pos_embed) = if pos_vocab_parallel {
            let padded = np.div_ceil(64) * 64;
            let (first, len) = shard.vocab_rows(padded);
            (first, ld.vocab_shard(&pos_name, np, d, padded, first, len)?)
        } else {
            (0, ld.dense(&pos_name, &[np, d])?)
        };
        let (q_first, q_len) = (shard.rank * d / shard.size, d / shard.size);
        let (f_first, f_len) = (shard.rank * i / shard.size, i / shard.size);
        let mut layers = Vec::with_capacity(num_layers);
        for l in 0..num_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("{prefix}.encoder.layers.{l}");
            let a = format!("{p}.self_attn");
            let proj = |x: &str| ["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.{x}"));
            let part = [(q_first, q_len); 3];
            let qkv = ld.fused_parts(
                &proj("weight"),
                &[d; 3],
                &part,
                d,
                &format!("{a}.qkv_proj.weight"),
            )?;
            let qkv_bias = ld.dense_concat_parts(
                &proj("bias"),
                &[d; 3],
                &part,
                &format!("{a}.qkv_proj.bias"),
            )?;
            let row = |ld: &mut Loader, name: &str, k: usize, first: usize, len: usize| {
                BiasedLinear::load_row(ld, name, (d, k), (first, len), shard.rank)
            };
            let out_proj = row(ld, &format!("{a}.out_proj"), d, q_first, q_len)?;
            let layer_norm1 = layer_norm(ld, &format!("{p}.layer_norm1"), d)?;
            let fc1_name = format!("{p}.mlp.fc1");
            let fc1 = BiasedLinear::load_column(ld, &fc1_name, (i, d), (f_first, f_len))?;
            let fc2 = row(ld, &format!("{p}.mlp.fc2"), i, f_first, f_len)?;
            let layer_norm2 = layer_norm(ld, &format!("{p}.layer_norm2"), d)?;
            layers.push(SiglipLayer {
                layer_norm1,
                qkv,
                qkv_bias,
                out_proj,
                layer_norm2,
                fc1,
                fc2,
            });
        }
        rt.set_layer(None);
        Ok(SiglipTower {
            shape: s.clone(),
            act,
            local_heads: s.num_heads / shard.size,
            patch_w,
            patch_b,
            pos_embed,
            pos_first_row,
            pos_vocab_parallel,
            layers,
            varlen_attention: true,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        let ln = |n: &LayerNorm| n.bytes();
        let mut b = self.patch_w.nbytes() + self.patch_b.nbytes() + self.pos_embed.nbytes();
        for l in &self.layers {
            b += ln(&l.layer_norm1)
                + l.qkv.weight_bytes()
                + l.qkv_bias.nbytes()
                + l.out_proj.weight_bytes()
                + ln(&l.layer_norm2)
                + l.fc1.weight_bytes()
                + l.fc2.weight_bytes();
        }
        b
    }

    /// `SiglipVisionEmbeddings` and `SiglipEncoder.forward` on `images` images already on the
    /// device (`pixel_values [N, C, S, S]`): returns the encoder's pool, the embeddings first.
    /// With `keep_all` (`return_all_hidden_states`, a list of feature layers: siglip.py 0.19
    /// L555-570) every layer's output stays in it; else only the last one does, each earlier
    /// output dying as the loop rebinds `hidden_states`.
    pub fn forward(
        &self,
        rt: &Runtime,
        pixels: &Tensor,
        images: usize,
        keep_all: bool,
    ) -> Result<Vec<Tensor>> {
        let s = &self.shape;
        let (d, np) = (s.hidden_size, s.num_patches());
        let eps = s.layer_norm_eps as f32;
        rt.set_layer(None);
        // SiglipVisionEmbeddings.forward (L126-138): the convolution, then `embeddings +=
        // position_embedding(position_ids)` in place (the lookup's output dies at once).
        let mut emb = ops_siglip::patch_embed(
            rt,
            pixels,
            &self.patch_w,
            &self.patch_b,
            (images, s.num_channels, s.image_size, s.patch_size),
            "vision.embeddings",
        )?;
        let ids: Vec<u32> = (0..np as u32).collect();
        let pos = if rt.tp().is_some() && self.pos_vocab_parallel {
            ops_tp::vocab_parallel_embedding(
                rt,
                &ids,
                &self.pos_embed,
                self.pos_first_row,
                np,
                self.act,
            )?
        } else {
            ops::embedding(rt, &ids, &self.pos_embed, self.act)?
        };
        rt.set_op("add_position_embedding");
        if rt.backend() == crate::device::Backend::Cpu {
            let p = pos.f32().to_vec();
            for row in emb.f32_mut().chunks_mut(np * d) {
                for (x, y) in row.iter_mut().zip(&p) {
                    *x += y;
                }
            }
        }
        drop(pos);
        // SiglipEncoder.forward (L286-301): `hidden_states_pool = [inputs_embeds]` holds the
        // embeddings through every layer; the loop's `hidden_states` holds each layer's input
        // while it runs.
        let mut pool: Vec<Tensor> = vec![emb];
        for (li, layer) in self.layers.iter().enumerate() {
            rt.set_layer(Some(li as u32));
            let l = format!("vision.layers.{li}");
            let input = pool.last().expect("the pool holds the embeddings");
            // The embeddings are `[N, D, g²]` transposed: `layer_norm_cuda` copies them to a
            // contiguous tensor first (`input.expect_contiguous()`), freed as it returns.
            let staged = if li == 0 {
                Some(ops::clone(
                    rt,
                    input,
                    &format!("{l}.layer_norm1.contiguous"),
                )?)
            } else {
                None
            };
            let ln1 = ops_phi::layer_norm(
                rt,
                input,
                &layer.layer_norm1.w,
                &layer.layer_norm1.b,
                eps,
                &format!("{l}.layer_norm1"),
            )?;
            drop(staged);
            let mut out = self.attention(rt, layer, &ln1, images, &l)?;
            // `hidden_states += residual` in place; the normed input dies as the caller's
            // `hidden_states` is rebound.
            drop(ln1);
            ops::add_assign(rt, &mut out, input)?;
            let ln2 = ops_phi::layer_norm(
                rt,
                &out,
                &layer.layer_norm2.w,
                &layer.layer_norm2.b,
                eps,
                &format!("{l}.layer_norm2"),
            )?;
            let act = self.act;
            let h = layer
                .fc1
                .forward(rt, &ln2, &format!("{l}.mlp.fc1"), 0, act)?;
            let g = ops_phi::gelu_new(rt, &h, &format!("{l}.mlp.act"))?;
            drop(h);
            // RowParallelLinear reduces before fc2 returns; the activation dies at the rebind.
            let y = layer.fc2.forward(rt, &g, &format!("{l}.mlp.fc2"), 0, act)?;
            let mut y = ops_tp::all_reduce(rt, y, &format!("{l}.mlp.fc2.all_reduce"))?;
            drop(g);
            drop(ln2);
            ops::add_assign(rt, &mut y, &out)?;
            drop(out);
            // The encoder's loop rebinds `hidden_states`: the previous layer's output dies
            // (layer 0's input, the embeddings, stays in the pool), unless every layer's
            // output is kept.
            if keep_all || pool.len() == 1 {
                pool.push(y);
            } else if let Some(last) = pool.last_mut() {
                *last = y;
            }
        }
        rt.set_layer(None);
        Ok(pool)
    }

    fn attention(
        &self,
        rt: &Runtime,
        layer: &SiglipLayer,
        x: &Tensor,
        images: usize,
        l: &str,
    ) -> Result<Tensor> {
        let s = &self.shape;
        let act = self.act;
        let qkv = layer.qkv.forward(rt, x, &format!("{l}.qkv_proj"), 0, act)?;
        // The fused output holds q, k and v one after another (`FusedLinear::split`'s views);
        // each gets its third of the bias (`F.linear` adds the fused bias in vLLM).
        let w = self.local_heads * s.head_dim();
        let rows = [w; 3];
        let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
        let bias_names = ["q", "k", "v"].map(|n| format!("{l}.{n}_bias"));
        let mut parts = FusedLinear::split(&qkv, &rows, &names);
        for (part, b) in
            parts
                .iter_mut()
                .zip(FusedLinear::split_flat(&layer.qkv_bias, &rows, &bias_names))
        {
            ops::add_bias(rt, part, &b)?;
        }
        let [q, k, v] = <[Tensor; 3]>::try_from(parts)
            .map_err(|_| Error::Request(format!("{l}: qkv split into other than 3 parts")))?;
        let o = ops_siglip::vit_attention(
            rt,
            (&q, &k, &v),
            (images, s.num_patches(), self.local_heads, s.head_dim()),
            self.varlen_attention,
            &format!("{l}.attn"),
        )?;
        drop((q, k, v));
        let out = layer
            .out_proj
            .forward(rt, &o, &format!("{l}.out_proj"), 0, act)?;
        let out = ops_tp::all_reduce(rt, out, &format!("{l}.out_proj.all_reduce"))?;
        // Locals die as `SiglipAttention.forward` returns: `qkv_states` (its views with it),
        // then `out`.
        drop(qkv);
        drop(o);
        Ok(out)
    }
}

fn layer_norm(ld: &mut Loader, name: &str, d: usize) -> Result<LayerNorm> {
    Ok(LayerNorm {
        w: ld.dense(&format!("{name}.weight"), &[d])?,
        b: ld.dense(&format!("{name}.bias"), &[d])?,
    })
}

impl Gemma3Vision {
    /// Loads the tower and projector through the framework allocator, in vLLM's order.
    /// `pos_vocab_parallel`: the release's SigLIP holds its position embedding as a
    /// `VocabParallelEmbedding` (0.10.0 siglip.py L69, 0.11.0 L70); from 0.15 it is an
    /// `nn.Embedding` whole on every rank (0.15.1 L300, 0.19.0 L303). One GPU holds the same
    /// bytes either way (4096 rows, a multiple of 64).
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
        pos_vocab_parallel: bool,
    ) -> Result<Self> {
        let shape = cfg.gemma3_mm.clone().ok_or_else(|| {
            Error::Request("this config has no vision tower (model_type gemma3)".into())
        })?;
        opts.require_16bit_tower(src, "gemma3 (multimodal)")?;
        let s = &shape.vision;
        let mut ld = Loader::tower(rt, src, opts, shape.tensor_shapes(cfg.hidden_size).len());
        let act = ld.act;
        let d = s.hidden_size;
        let tower = SiglipTower::load(rt, &mut ld, s, TOWER, s.num_layers, pos_vocab_parallel)?;
        let post_layernorm = layer_norm(&mut ld, &format!("{TOWER}.post_layernorm"), d)?;
        let proj_w = ld.dense(
            &format!("{PROJECTOR}.mm_input_projection_weight"),
            &[d, cfg.hidden_size],
        )?;
        let soft_emb_norm = ld.dense(&format!("{PROJECTOR}.mm_soft_emb_norm.weight"), &[d])?;
        Ok(Gemma3Vision {
            shape,
            act,
            tower,
            post_layernorm,
            proj_w,
            soft_emb_norm,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        self.tower.weight_bytes()
            + self.post_layernorm.bytes()
            + self.proj_w.nbytes()
            + self.soft_emb_norm.nbytes()
    }

    /// `get_multimodal_embeddings` on `images` images already on the device (`pixel_values
    /// [N, C, S, S]`): the tower (`SiglipVisionTransformer.forward`, siglip.py 0.11 L425-446)
    /// and the projector (gemma3_mm.py 0.11 L440-461). Returns the projected embeddings
    /// `[N · tokens_per_image, text_hidden]` (vLLM splits them into per-image views).
    pub fn encode(&self, rt: &Runtime, pixels: &Tensor, images: usize) -> Result<Tensor> {
        let eps = self.shape.vision.layer_norm_eps as f32;
        let mut pool = self.tower.forward(rt, pixels, images, false)?;
        let last = pool.pop().expect("the pool holds the embeddings");
        // `resolve_visual_encoder_outputs`: post_layernorm into a new tensor; the last
        // layer's output dies as `encoder_outputs` is rebound (vision.py 0.11); the
        // embeddings (the transformer's `hidden_states`) when its forward returns.
        let post = ops_phi::layer_norm(
            rt,
            &last,
            &self.post_layernorm.w,
            &self.post_layernorm.b,
            eps,
            "vision.post_layernorm",
        )?;
        drop(last);
        drop(pool);
        self.project(rt, post, images)
    }

    /// `Gemma3MultiModalProjector.forward`: the transposed copy `[N, D, g, g]`, the average
    /// pool, `mm_soft_emb_norm`, the matmul with `mm_input_projection_weight`.
    fn project(&self, rt: &Runtime, post: Tensor, images: usize) -> Result<Tensor> {
        let s = &self.shape.vision;
        let d = s.hidden_size;
        let np = s.num_patches();
        let shaped = ops_siglip::transpose_copy(rt, &post, (images, np, d), "projector.reshape")?;
        // The tower's output dies when `_process_image_input` returns; the reshaped copy
        // when the projector's forward does.
        let pooled = ops_siglip::avg_pool(
            rt,
            &shaped,
            (images * d, s.patches_per_side(), self.shape.pool_kernel()),
            "projector.avg_pool",
        )?;
        let t = self.shape.mm_tokens_per_image;
        let normed = ops_siglip::gemma_rms_norm_transposed(
            rt,
            &pooled,
            &self.soft_emb_norm,
            s.layer_norm_eps as f32,
            (images, d, t),
            "projector.mm_soft_emb_norm",
        )?;
        let out =
            ops_siglip::matmul_nn(rt, &normed, &self.proj_w, "projector.mm_input_projection")?;
        // The projector's locals die in order as it returns (the reshaped copy, the pool, the
        // norm); the tower's output when `_process_image_input` returns.
        drop(shaped);
        drop(pooled);
        drop(normed);
        drop(post);
        Ok(out)
    }
}

/// The runner's `pixel_values [N, C, S, S]` on the device: the dummy image of the maximum
/// feature size repeated `images` times, batched on the host and moved in one copy
/// (`group_mm_kwargs_by_modality`, multimodal/utils.py 0.11 L426-455), already in the model
/// dtype (the processor casts it, multimodal/processing.py 0.11 L1016-1029); then `num_crops`
/// (int64 `[N]`).
pub fn dummy_pixels(
    rt: &Runtime,
    shape: &Gemma3MmShape,
    images: usize,
    act: DType,
) -> Result<(Tensor, Tensor)> {
    let s = &shape.vision;
    rt.set_op("mm_dummy_batch");
    let px = rt.tensor(
        "pixel_values",
        Category::Activation,
        &[images, s.num_channels, s.image_size, s.image_size],
        act,
    )?;
    let crops = rt.tensor("num_crops", Category::Activation, &[images], DType::I64)?;
    Ok((px, crops))
}

/// The image embeddings `[images · tokens, text_hidden]` of the test images of
/// tests/siglip_reference.rs and scripts/siglip_reference.py through the tower and projector of
/// the checkpoint at `dir`, computed on the CPU (fp32) by the same load and ops a profile
/// runs.
pub fn encode_test_images(dir: &std::path::Path, images: usize) -> Result<Vec<f32>> {
    let tower = vision_check::TestTower {
        family: "gemma3",
        shape: |c| {
            c.gemma3_mm
                .as_ref()
                .map(|s| (s.vision.num_channels, s.vision.image_size))
        },
        load: |rt, cfg, src, opts| {
            let v = Gemma3Vision::load(rt, cfg, src, opts, false)?;
            let act = v.act;
            Ok((v, act))
        },
        encode: |v, rt, px, n| v.encode(rt, px, n),
    };
    vision_check::encode_test_images(dir, images, &tower)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tower and projector of google/gemma-3-4b-it weigh their parameters in bf16: the
    /// checkpoint's 416,866,032 + 2,950,272 parameters, two bytes each.
    #[test]
    fn the_tower_weighs_its_parameters() {
        let (cfg, rt, opts, src) = vision_check::preset_on_h100("gemma-3-4b-it");
        let v = Gemma3Vision::load(&rt, &cfg, src.source.as_ref(), &opts, false).unwrap();
        assert_eq!(v.weight_bytes(), (416_866_032 + 2_950_272) * 2);
    }
}

//! Mistral 3's vision side as vLLM builds and runs it: the Pixtral-HF vision tower (vLLM
//! pixtral.py `PixtralHFVisionModel`) and `Mistral3MultiModalProjector` (mistral3.py), the same
//! code in 0.10.0, 0.11.0, 0.15.1 and 0.19.0 but for the attention kernel. The language model
//! is the mistral text model (`llama.rs`).
//!
//! Weights (made before the language model's: `Mistral3ForConditionalGeneration.__init__`,
//! mistral3.py 0.19 L417-441): `patch_conv` (no bias, whole on every rank), `ln_pre`, per
//! block `attention_norm`, `qkv_proj` (QKVParallelLinear, no bias), `o_proj`
//! (RowParallelLinear), `gate_up_proj` (MergedColumnParallelLinear), `down_proj`
//! (RowParallelLinear), `ffn_norm` (pixtral.py 0.19 L997-1150; only the blocks up to
//! `vision_feature_layer` are built, `_get_num_hidden_layers`), the rotary table `inv_freq` (a
//! f32 buffer, L1241), then the projector's `norm`, `patch_merger.merging_layer` (`nn.Linear`,
//! whole), `linear_1` (ColumnParallelLinear) and `linear_2` (RowParallelLinear)
//! (mistral3.py L75-172). All in the model dtype but the rotary table.

use crate::base::error::{Error, Result};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_pixtral, ops_siglip, ops_tp};
use crate::memory::Category;
use crate::model::config::mistral3::{PROJECTOR, TOWER};
use crate::model::config::{Mistral3Shape, ModelConfig};
use crate::model::layers::linear::BiasedLinear;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, Loader, Slice};
use crate::model::models::vision_check;
use crate::model::weights::WeightSource;
use crate::quant::{FusedLinear, Linear};

/// RMSNorm's epsilon in the tower and the projector (`RMSNorm(..., eps=1e-5)`).
const EPS: f32 = 1e-5;

/// One `PixtralHFTransformerBlock`.
pub struct PixtralBlock {
    pub attention_norm: Tensor,
    pub qkv: FusedLinear,
    pub o_proj: Linear,
    pub gate_up: FusedLinear,
    pub down: Linear,
    pub ffn_norm: Tensor,
}

/// The vision tower and the projector of a `Mistral3ForConditionalGeneration`.
pub struct Mistral3Vision {
    pub shape: Mistral3Shape,
    pub act: DType,
    pub text_hidden: usize,
    /// This rank's heads and MLP width (all of them with one GPU).
    pub local_heads: usize,
    pub local_inter: usize,
    /// `[D, C, p, p]`.
    pub patch_w: Tensor,
    pub ln_pre: Tensor,
    pub blocks: Vec<PixtralBlock>,
    /// `inv_freq`, f32 `[patches_per_side², head_dim]`.
    pub rope_table: Tensor,
    pub norm: Tensor,
    pub merging: Linear,
    pub linear_1: BiasedLinear,
    pub linear_2: BiasedLinear,
    /// xFormers' `memory_efficient_attention` with a block-diagonal bias (installed with
    /// 0.10 and 0.11 on x86_64 and not on Blackwell, pixtral.py 0.11 L57-66), or SDPA with
    /// transformers' dense block mask (0.15, 0.19: xFormers is no longer a dependency).
    pub xformers: bool,
    /// The body its `RMSNorm`s run (the IR's native body from 0.21).
    pub norm_body: crate::engine::ops_pixtral::RmsNormBody,
    /// A batch's images packed into one sequence for `MMEncoderAttention`'s FlashAttention
    /// varlen call, its `cu_seqlens` made once a forward (0.29 on: pixtral.py 0.29.0 L95-120,
    /// L1292-1322), instead of a block mask.
    pub packed_varlen: bool,
    /// The device-side pixel normalization's `weight` and `bias` (f32 `[3]`, 0.33 on:
    /// `build_mm_input_norm`, mistral3.py 0.33 L478-485): uint8 pixels, packed into patch
    /// rows, normalized and projected in one matrix product (`pixtral_patch_embed`).
    pub input_norm: Option<(Tensor, Tensor)>,
}

impl Mistral3Vision {
    /// Loads the tower and projector through the framework allocator, in vLLM's order.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        Self::load_for(rt, cfg, src, opts, false)
    }

    /// Loads them with, where `device_norm` (0.33 on), the pixel normalization's two buffers
    /// first: `build_mm_input_norm` is an argument of the tower's constructor, computed on the
    /// host and copied (mm_input_norm.py 0.33 L225-251).
    pub fn load_for(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
        device_norm: bool,
    ) -> Result<Self> {
        let shape = cfg.mistral3.clone().ok_or_else(|| {
            Error::Request("this config has no Pixtral vision tower (model_type mistral3)".into())
        })?;
        opts.require_16bit_tower(src, "mistral3 (multimodal)")?;
        let s = &shape.vision;
        let th = cfg.hidden_size;
        let shard = TpShard::of_ranks(rt);
        if !s.num_heads.is_multiple_of(shard.size)
            || !s.intermediate_size.is_multiple_of(shard.size)
            || !th.is_multiple_of(shard.size)
        {
            return Err(Error::Request(format!(
                "--tp {}: the vision tower's {} heads, its MLP of {} or the projector's {} do not divide over the GPUs",
                shard.size, s.num_heads, s.intermediate_size, th
            )));
        }
        let mut ld = Loader::tower(rt, src, opts, shape.tensor_shapes(th).len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let input_norm = if device_norm {
            use crate::model::models::qwen2_5_vl::{norm_buffer, pixel_norm_values};
            let (w, b) = pixel_norm_values();
            Some((
                norm_buffer(rt, "vision_tower.input_norm.weight", w)?,
                norm_buffer(rt, "vision_tower.input_norm.bias", b)?,
            ))
        } else {
            None
        };
        let (d, i) = (s.hidden_size, s.intermediate_size);
        let patch_w = ld.dense(
            &format!("{TOWER}.patch_conv.weight"),
            &[d, s.num_channels, s.patch_size, s.patch_size],
        )?;
        let ln_pre = ld.dense(&format!("{TOWER}.ln_pre.weight"), &[d])?;
        let (q_first, q_len) = (shard.rank * d / shard.size, d / shard.size);
        let (f_first, f_len) = (shard.rank * i / shard.size, i / shard.size);
        let mut blocks = Vec::with_capacity(s.layers_used);
        for l in 0..s.layers_used {
            rt.set_layer(Some(l as u32));
            let p = format!("{TOWER}.transformer.layers.{l}");
            let attention_norm = ld.dense(&format!("{p}.attention_norm.weight"), &[d])?;
            let a = format!("{p}.attention");
            let qkv = ld.fused_parts(
                &["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.weight")),
                &[d; 3],
                &[(q_first, q_len); 3],
                d,
                &format!("{a}.qkv_proj.weight"),
            )?;
            let o_proj = ld.linear_slice(
                &format!("{a}.o_proj.weight"),
                Slice::cols(d, d, q_first, q_len),
            )?;
            let f = format!("{p}.feed_forward");
            let gate_up = ld.fused_parts(
                &["gate_proj", "up_proj"].map(|n| format!("{f}.{n}.weight")),
                &[i; 2],
                &[(f_first, f_len); 2],
                d,
                &format!("{f}.gate_up_proj.weight"),
            )?;
            let down = ld.linear_slice(
                &format!("{f}.down_proj.weight"),
                Slice::cols(d, i, f_first, f_len),
            )?;
            let ffn_norm = ld.dense(&format!("{p}.ffn_norm.weight"), &[d])?;
            blocks.push(PixtralBlock {
                attention_norm,
                qkv,
                o_proj,
                gate_up,
                down,
                ffn_norm,
            });
        }
        rt.set_layer(None);
        // The table's values (computed here on the CPU; a dry device only allocates it).
        let hd = s.head_dim();
        let side = s.patches_per_side();
        let mut table = vec![0.0f32; s.num_patches() * hd];
        if rt.backend() == crate::device::Backend::Cpu {
            for r in 0..side {
                for c in 0..side {
                    let at = (r * side + c) * hd;
                    crate::device::cpu_pixtral::rope_angles(
                        r,
                        c,
                        hd,
                        s.rope_theta,
                        &mut table[at..at + hd],
                    );
                }
            }
        } else {
            table = Vec::new();
        }
        let rope_table = rt.tensor_with_values(
            "vision_tower.patch_positional_embedding.inv_freq",
            Category::Weight,
            &[s.num_patches(), hd],
            DType::F32,
            table,
        )?;
        let norm = ld.dense(&format!("{PROJECTOR}.norm.weight"), &[d])?;
        let m2 = shape.spatial_merge_size * shape.spatial_merge_size;
        let merging = ld.linear(
            &format!("{PROJECTOR}.patch_merger.merging_layer.weight"),
            d,
            d * m2,
        )?;
        let (t_first, t_len) = (shard.rank * th / shard.size, th / shard.size);
        let l1 = format!("{PROJECTOR}.linear_1");
        let linear_1 = BiasedLinear {
            w: ld.linear_slice(&format!("{l1}.weight"), Slice::rows(th, d, t_first, t_len))?,
            b: if shape.projector_bias {
                Some(ld.dense_concat_parts(
                    &[format!("{l1}.bias")],
                    &[th],
                    &[(t_first, t_len)],
                    &format!("{l1}.bias"),
                )?)
            } else {
                None
            },
            adds_bias: true,
        };
        let l2 = format!("{PROJECTOR}.linear_2");
        let linear_2 = BiasedLinear {
            w: ld.linear_slice(&format!("{l2}.weight"), Slice::cols(th, th, t_first, t_len))?,
            b: if shape.projector_bias {
                Some(ld.dense(&format!("{l2}.bias"), &[th])?)
            } else {
                None
            },
            adds_bias: shard.rank == 0,
        };
        Ok(Mistral3Vision {
            local_heads: s.num_heads / shard.size,
            local_inter: f_len,
            text_hidden: th,
            shape,
            act,
            patch_w,
            ln_pre,
            blocks,
            rope_table,
            norm,
            merging,
            linear_1,
            linear_2,
            xformers: false,
            norm_body: crate::engine::ops_pixtral::RmsNormBody::Static,
            packed_varlen: false,
            input_norm,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        let mut b = self.patch_w.nbytes() + self.ln_pre.nbytes() + self.rope_table.nbytes();
        for l in &self.blocks {
            b += l.attention_norm.nbytes()
                + l.qkv.weight_bytes()
                + l.o_proj.weight_bytes()
                + l.gate_up.weight_bytes()
                + l.down.weight_bytes()
                + l.ffn_norm.nbytes();
        }
        let input_norm = self
            .input_norm
            .as_ref()
            .map_or(0, |(w, bias)| w.nbytes() + bias.nbytes());
        b + input_norm
            + self.norm.nbytes()
            + self.merging.weight_bytes()
            + self.linear_1.weight_bytes()
            + self.linear_2.weight_bytes()
    }

    /// `embed_multimodal` on `images` images of the maximum size already on the device
    /// (`pixel_values [N, C, S, S]`): `PixtralHFVisionModel.forward` (pixtral.py 0.19
    /// L1243-1314), `torch.cat` of its per-image outputs and the projector
    /// (`_process_image_input`, mistral3.py 0.19 L461-487). Returns the projected embeddings
    /// `[N · tokens, text_hidden]` (vLLM splits them into per-image views).
    pub fn encode(&self, rt: &Runtime, pixels: &Tensor, images: usize) -> Result<Tensor> {
        let s = &self.shape.vision;
        let (d, g, hd) = (s.hidden_size, s.patches_per_side(), s.head_dim());
        let seq = g * g;
        let tokens = images * seq;
        let act = self.act;
        rt.set_layer(None);
        // The convolution one image at a time; `patch_embeds_list` holds the outputs until
        // the forward returns. From 0.33 (`pixtral_patch_embed`, pixtral.py 0.33.0
        // L1492-1531): the uint8 pixels packed into patch rows, normalized, projected in one
        // `F.linear`; the list's views hold the projection, the packed rows and the
        // normalized ones die as it returns.
        let mut convs = Vec::with_capacity(images);
        let cat = if let Some((w, b)) = &self.input_norm {
            let k = s.num_channels * s.patch_size * s.patch_size;
            rt.set_op("pixtral_patch_embed");
            let packed = rt.tensor_for_overwrite(
                "vision.patch_embed.packed",
                Category::Activation,
                &[tokens, k],
                DType::U8,
            )?;
            let normed = crate::engine::ops_qwen2_5_vl::input_norm(
                rt,
                &packed,
                (w, b),
                crate::engine::ops_qwen2_5_vl::InputNormPass::Cuda,
                act,
                "vision.input_norm",
            )?;
            drop(packed);
            let projected = ops_pixtral::patch_linear(
                rt,
                pixels,
                (w, b),
                &self.patch_w,
                (images, s.num_channels, s.image_size, s.patch_size, d),
                "vision.patch_embed",
            )?;
            drop(normed);
            convs.push(projected);
            None
        } else {
            for n in 0..images {
                convs.push(ops_pixtral::patch_conv(
                    rt,
                    pixels,
                    &self.patch_w,
                    (n, s.num_channels, s.image_size, s.patch_size, d),
                    &format!("vision.patch_conv.{n}"),
                )?);
            }
            Some(ops_pixtral::cat_rows(
                rt,
                &convs.iter().collect::<Vec<_>>(),
                "vision.cat",
            )?)
        };
        // `patch_embeds = self.ln_pre(patch_embeds)`: the concatenation dies at the rebind;
        // the normed embeddings stay (the transformer's `hidden_states_pool[0]`, then the
        // forward's `patch_embeds`).
        let x0 = ops_pixtral::rms_norm_eager(
            rt,
            cat.as_ref().unwrap_or(&convs[0]),
            &self.ln_pre,
            EPS,
            self.norm_body,
            "vision.ln_pre",
        )?;
        drop(cat);
        rt.set_op("position_ids");
        let pos_ids = rt.tensor(
            "vision.position_ids",
            Category::Activation,
            &[tokens],
            DType::I64,
        )?;
        let (cos, sin) = ops_pixtral::rope_cos_sin(rt, (images, g, hd), s.rope_theta, act)?;
        let mask = if self.xformers || self.packed_varlen {
            None
        } else {
            Some(ops_pixtral::block_mask(rt, tokens, act)?)
        };
        // 0.29 on: `_make_packed_sequence_metadata`'s `cu_seqlens` (int32, from the host;
        // `max_seqlen` stays on the host).
        let cu_seqlens = if self.packed_varlen {
            Some(crate::engine::ops_qwen2_5_vl::host_to_device(
                rt,
                "vision.cu_seqlens",
                images + 1,
                DType::I32,
            )?)
        } else {
            None
        };
        let mut hidden: Option<Tensor> = None;
        for (li, b) in self.blocks.iter().enumerate() {
            rt.set_layer(Some(li as u32));
            let l = format!("vision.layers.{li}");
            let input = hidden.as_ref().unwrap_or(&x0);
            let n1 = ops_pixtral::rms_norm_eager(
                rt,
                input,
                &b.attention_norm,
                EPS,
                self.norm_body,
                &format!("{l}.attention_norm"),
            )?;
            let r = self.attention(rt, b, &n1, (&cos, &sin), images, &l)?;
            // The normed input (the call's argument) dies as the attention returns.
            drop(n1);
            let h = ops_pixtral::add(rt, input, &r, &format!("{l}.h"))?;
            let n2 = ops_pixtral::rms_norm_eager(
                rt,
                &h,
                &b.ffn_norm,
                EPS,
                self.norm_body,
                &format!("{l}.ffn_norm"),
            )?;
            let gate_up = b
                .gate_up
                .forward(rt, &n2, &format!("{l}.gate_up_proj"), 0, act)?;
            let w = self.local_inter;
            let names = ["gate", "up"].map(|n| format!("{l}.{n}"));
            let parts = FusedLinear::split(&gate_up, &[w, w], &names);
            let a = ops::silu_and_mul_native(rt, &parts[0], &parts[1], &format!("{l}.act"))?;
            drop(parts);
            let y = b.down.forward(rt, &a, &format!("{l}.down_proj"), 0, act)?;
            let y = ops_tp::all_reduce(rt, y, &format!("{l}.down_proj.all_reduce"))?;
            // `x` (the activation) dies at the rebind, `gate_up` and the normed input as
            // the MLP returns, the attention's output `r` as it is rebound.
            drop(a);
            drop(gate_up);
            drop(n2);
            drop(r);
            let out = ops_pixtral::add(rt, &h, &y, &format!("{l}.out"))?;
            drop(h);
            drop(y);
            // The loop rebinds `x`: the previous block's output dies (not the embeddings).
            hidden = Some(out);
        }
        rt.set_layer(None);
        // The forward returns its output split into per-image views; its locals die: the
        // convolutions, the embeddings, the position ids, cos and sin, the mask.
        let last = match hidden {
            Some(h) => h,
            None => ops::clone(rt, &x0, "vision.out")?,
        };
        drop(convs);
        drop(x0);
        drop(pos_ids);
        drop((cos, sin));
        drop(mask);
        drop(cu_seqlens);
        // `torch.cat(image_features)`: a copy (the tower's views stay referenced until
        // `_process_image_input` returns).
        let feats = ops_pixtral::cat_rows(rt, &[&last], "projector.input")?;
        let out = self.project(rt, &feats, images)?;
        drop(feats);
        drop(last);
        Ok(out)
    }

    fn attention(
        &self,
        rt: &Runtime,
        b: &PixtralBlock,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        images: usize,
        l: &str,
    ) -> Result<Tensor> {
        let s = &self.shape.vision;
        let (hd, seq) = (s.head_dim(), s.num_patches());
        let heads = self.local_heads;
        let act = self.act;
        let qkv = b.qkv.forward(rt, x, &format!("{l}.qkv_proj"), 0, act)?;
        // `qkv_states.chunk(3, dim=-1)`: q, k and v one after another (`FusedLinear::split`).
        let w = heads * hd;
        let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
        let parts = FusedLinear::split(&qkv, &[w; 3], &names);
        let q = ops_pixtral::apply_rope(
            rt,
            &parts[0],
            (cos, sin),
            (heads, hd),
            &format!("{l}.q_rot"),
        )?;
        let k = ops_pixtral::apply_rope(
            rt,
            &parts[1],
            (cos, sin),
            (heads, hd),
            &format!("{l}.k_rot"),
        )?;
        let o = if self.xformers || self.packed_varlen {
            // Like FlashAttention's call: the output and an f32 log-sum-exp that dies.
            ops_siglip::vit_attention(
                rt,
                (&q, &k, &parts[2]),
                (images, seq, heads, hd),
                false,
                &format!("{l}.attn"),
            )?
        } else {
            ops_pixtral::sdpa_masked(
                rt,
                (&q, &k, &parts[2]),
                (images, seq, heads, hd),
                &format!("{l}.attn"),
            )?
        };
        let out = b.o_proj.forward(rt, &o, &format!("{l}.o_proj"), 0, act)?;
        let out = ops_tp::all_reduce(rt, out, &format!("{l}.o_proj.all_reduce"))?;
        // The forward's locals die as it returns: `qkv_states` (v is its view), q, k, `out`.
        drop(parts);
        drop(qkv);
        drop(q);
        drop(k);
        drop(o);
        Ok(out)
    }

    /// `Mistral3MultiModalProjector.forward`: `norm`, the patch merger (its `unfold`s, their
    /// `cat`, `merging_layer`), `linear_1`, GELU, `linear_2`.
    fn project(&self, rt: &Runtime, x: &Tensor, images: usize) -> Result<Tensor> {
        let s = &self.shape.vision;
        let act = self.act;
        let n =
            ops_pixtral::rms_norm_eager(rt, x, &self.norm, EPS, self.norm_body, "projector.norm")?;
        let (merged, grids) = ops_pixtral::patch_merge(
            rt,
            &n,
            (
                images,
                s.patches_per_side(),
                s.hidden_size,
                self.shape.spatial_merge_size,
            ),
            "projector.patch_merger",
        )?;
        let m = self
            .merging
            .forward(rt, &merged, "projector.merging_layer", 0, act)?;
        // The merger's `cat` dies at its rebind, the per-image grids as it returns; the norm's
        // output as the projector rebinds `image_features`.
        drop(merged);
        drop(grids);
        drop(n);
        let h1 = self
            .linear_1
            .forward(rt, &m, "projector.linear_1", 0, act)?;
        let a = ops_pixtral::gelu(rt, &h1, "projector.act")?;
        drop(h1);
        let h2 = self
            .linear_2
            .forward(rt, &a, "projector.linear_2", 0, act)?;
        let h2 = ops_tp::all_reduce(rt, h2, "projector.linear_2.all_reduce")?;
        drop(a);
        drop(m);
        Ok(h2)
    }
}

/// The runner's `pixel_values [N, C, S, S]` on the device: the dummy image of the maximum
/// size (`get_image_size_with_most_features`: `image_size` square, mistral3.py 0.19
/// L191-194) repeated `images` times, batched on the host and moved in one copy, in the model
/// dtype. No `image_sizes` tensor (`_get_mm_fields_config` has only the pixels).
pub fn dummy_pixels(
    rt: &Runtime,
    shape: &Mistral3Shape,
    images: usize,
    act: DType,
    uint8: bool,
) -> Result<Tensor> {
    let s = &shape.vision;
    rt.set_op("mm_dummy_batch");
    rt.tensor(
        "pixel_values",
        Category::Activation,
        &[images, s.num_channels, s.image_size, s.image_size],
        if uint8 { DType::U8 } else { act },
    )
}

/// The image embeddings `[images · tokens, text_hidden]` of the test images of
/// tests/pixtral_reference.rs and scripts/pixtral_reference.py through the tower and projector of
/// the checkpoint at `dir`, computed on the CPU (fp32) by the same load and ops a profile
/// runs.
pub fn encode_test_images(dir: &std::path::Path, images: usize) -> Result<Vec<f32>> {
    let tower = vision_check::TestTower {
        family: "mistral3",
        shape: |c| {
            c.mistral3
                .as_ref()
                .map(|s| (s.vision.num_channels, s.vision.image_size))
        },
        load: |rt, cfg, src, opts| {
            let v = Mistral3Vision::load(rt, cfg, src, opts)?;
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

    /// The tower and projector of Mistral-Small-3.1-24B weigh their parameters in bf16 and
    /// the rotary table in f32.
    #[test]
    fn the_tower_weighs_its_parameters() {
        let (cfg, rt, opts, src) = vision_check::preset_on_h100("mistral-small-3.1-24b");
        let v = Mistral3Vision::load(&rt, &cfg, src.source.as_ref(), &opts).unwrap();
        assert_eq!(
            v.weight_bytes(),
            (403_305_472 + 35_652_608) * 2 + 12100 * 64 * 4
        );
    }
}

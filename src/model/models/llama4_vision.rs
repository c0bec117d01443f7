//! Llama 4's vision side (`Llama4ForConditionalGeneration`, meta-llama/Llama-4-Scout-17B-16E
//! and Maverick) as vLLM 0.19 builds and runs it (mllama4.py): `Llama4VisionModel` — the
//! unfold patch embedding (a linear without bias), the class token appended, the positional
//! embedding added, `layernorm_pre`, `Llama4VisionEncoderLayer`s (LayerNorm, attention with
//! biases and the 2D vision rotary, LayerNorm, MLP with exact GELU), `layernorm_post`, the
//! class token dropped, the pixel shuffle and `Llama4VisionPixelShuffleMLP` — then
//! `Llama4MultiModalProjector.linear_1`. The language model is `Llama4Model`'s.
//!
//! Tensor parallel (`mm_encoder_tp_mode` "weights", the default; "data" is refused by name):
//! the patch linear and the projector are `ColumnParallelLinear(gather_output=True)` (L166-173,
//! L438-446), `qkv_proj` a `QKVParallelLinear` and `o_proj` a `RowParallelLinear`
//! (L279-294), each MLP's fc1 column- and fc2 row-parallel (L130-145); the class and
//! positional embeddings and the LayerNorms are whole on every rank. All in the model dtype
//! (`quant_config=None` for the tower and projector, L758-770).

use crate::base::error::{Error, Result};
use crate::device::cpu_llama4_vision;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops_llama4_vision as ops_l4v, ops_phi, ops_pixtral, ops_siglip, ops_tp};
use crate::memory::Category;
use crate::model::config::llama4::{LAYER_NORM_EPS, PROJECTOR, TOWER};
use crate::model::config::{ModelConfig, VisionTower};
use crate::model::layers::linear::BiasedLinear;
use crate::model::layers::norm::LayerNorm;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, Loader, Slice};
use crate::model::models::vision_check;
use crate::model::weights::WeightSource;
use crate::quant::FusedLinear;

/// One `Llama4VisionEncoderLayer`.
pub struct Llama4VisionLayer {
    pub qkv: FusedLinear,
    pub qkv_bias: Tensor,
    pub o_proj: BiasedLinear,
    pub fc1: BiasedLinear,
    pub fc2: BiasedLinear,
    pub input_layernorm: LayerNorm,
    pub post_attention_layernorm: LayerNorm,
}

/// The vision model and the projector of a `Llama4ForConditionalGeneration`.
pub struct Llama4Vision {
    pub shape: VisionTower,
    pub act: DType,
    /// This rank's heads (all of them with one GPU).
    pub local_heads: usize,
    /// `patch_embedding.linear`: this rank's rows of `[D, C · p²]`, no bias.
    pub patch_linear: BiasedLinear,
    pub class_embedding: Tensor,
    /// `[g² + 1, D]`.
    pub positional_embedding: Tensor,
    pub layernorm_pre: LayerNorm,
    pub layernorm_post: LayerNorm,
    pub layers: Vec<Llama4VisionLayer>,
    /// The rotary's `cos_sin_cache` (complex64 `[g² + 1, head_dim / 2]`, one instance for
    /// every layer: `get_rope` caches it).
    pub rope_cache: Tensor,
    /// Its values on the host, as `(cos, sin)`.
    pub angles: Vec<(f32, f32)>,
    /// `vision_adapter.mlp.fc1` (column) and `fc2` (row), no biases.
    pub adapter_fc1: BiasedLinear,
    pub adapter_fc2: BiasedLinear,
    /// `multi_modal_projector.linear_1`: this rank's rows of `[text_hidden,
    /// vision_output_dim]`, no bias.
    pub linear_1: BiasedLinear,
    /// FlashAttention's varlen call (`MMEncoderAttention` on Hopper and Ampere) or SDPA.
    pub varlen_attention: bool,
}

fn layer_norm(ld: &mut Loader, name: &str, d: usize) -> Result<LayerNorm> {
    Ok(LayerNorm {
        w: ld.dense(&format!("{name}.weight"), &[d])?,
        b: ld.dense(&format!("{name}.bias"), &[d])?,
    })
}

/// A linear without bias, this rank's `slice` of it.
fn unbiased(ld: &mut Loader, name: &str, slice: Slice) -> Result<BiasedLinear> {
    Ok(BiasedLinear {
        w: ld.linear_slice(&format!("{name}.weight"), slice)?,
        b: None,
        adds_bias: false,
    })
}

impl Llama4Vision {
    /// Loads the vision model and the projector through the framework allocator in the order
    /// `__init__` makes them (mllama4.py 0.19 L474-503, L758-770): the patch linear, the
    /// class and positional embeddings, the two outer LayerNorms, per layer `qkv_proj`,
    /// `o_proj`, the rotary cache (first layer), fc1, fc2 and the two LayerNorms, the
    /// adapter's fc1 and fc2, the projector.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg
            .llama4
            .as_ref()
            .and_then(|l| l.vision.clone())
            .ok_or_else(|| {
                Error::Request("this config has no vision tower (model_type llama4)".into())
            })?;
        opts.require_16bit(
            src,
            "llama4 (multimodal)",
            "its vision tower is built unquantized (quant_config=None) and only 16-bit checkpoints of it are modelled",
        )?;
        let s = &shape;
        let shard = TpShard::of_ranks(rt);
        let (d, i, th) = (s.hidden_size, s.intermediate_size, cfg.hidden_size);
        let (pi, po) = (s.projector_input_dim, s.projector_output_dim);
        for (what, n) in [
            ("heads", s.num_attention_heads),
            ("hidden_size", d),
            ("intermediate_size", i),
            ("projector_input_dim", pi),
            ("text hidden_size", th),
        ] {
            if !n.is_multiple_of(shard.size) {
                return Err(Error::Request(format!(
                    "--tp {}: the vision tower's {what} {n} does not divide over the GPUs",
                    shard.size
                )));
            }
        }
        let part = |n: usize| (shard.rank * n / shard.size, n / shard.size);
        let mut ld = Loader::new(rt, src, opts, s.tensor_shapes(th).len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let v = TOWER;
        let k = s.num_channels * s.patch_size * s.patch_size;
        let (d_first, d_len) = part(d);
        let patch_linear = unbiased(
            &mut ld,
            &format!("{v}.patch_embedding.linear"),
            Slice::rows(d, k, d_first, d_len),
        )?;
        let class_embedding = ld.dense(&format!("{v}.class_embedding"), &[d])?;
        let positional_embedding =
            ld.dense(&format!("{v}.positional_embedding_vlm"), &[s.seq_len(), d])?;
        let layernorm_pre = layer_norm(&mut ld, &format!("{v}.layernorm_pre"), d)?;
        let layernorm_post = layer_norm(&mut ld, &format!("{v}.layernorm_post"), d)?;
        let (i_first, i_len) = part(i);
        let mut layers = Vec::with_capacity(s.num_hidden_layers);
        let mut rope_cache = None;
        for l in 0..s.num_hidden_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("{v}.model.layers.{l}");
            let a = format!("{p}.self_attn");
            let proj = |x: &str| ["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.{x}"));
            let parts = [(d_first, d_len); 3];
            let qkv = ld.fused_parts(
                &proj("weight"),
                &[d; 3],
                &parts,
                d,
                &format!("{a}.qkv_proj.weight"),
            )?;
            let qkv_bias = ld.dense_concat_parts(
                &proj("bias"),
                &[d; 3],
                &parts,
                &format!("{a}.qkv_proj.bias"),
            )?;
            let o_proj = BiasedLinear::load_row(
                &mut ld,
                &format!("{a}.o_proj"),
                (d, d),
                (d_first, d_len),
                shard.rank,
            )?;
            if rope_cache.is_none() {
                // `get_rope(..., dtype=torch.complex64)`: a buffer of `[g² + 1, head_dim / 2]`
                // complex64 values, held as as many f32 pairs (mllama4.py 0.19 L302-309).
                rope_cache = Some(rt.tensor(
                    format!("{a}.rotary_emb.cos_sin_cache"),
                    Category::Weight,
                    &[s.seq_len(), s.head_dim()],
                    DType::F32,
                )?);
            }
            let fc1 = BiasedLinear::load_column(
                &mut ld,
                &format!("{p}.mlp.fc1"),
                (i, d),
                (i_first, i_len),
            )?;
            let fc2 = BiasedLinear::load_row(
                &mut ld,
                &format!("{p}.mlp.fc2"),
                (d, i),
                (i_first, i_len),
                shard.rank,
            )?;
            let input_layernorm = layer_norm(&mut ld, &format!("{p}.input_layernorm"), d)?;
            let post_attention_layernorm =
                layer_norm(&mut ld, &format!("{p}.post_attention_layernorm"), d)?;
            layers.push(Llama4VisionLayer {
                qkv,
                qkv_bias,
                o_proj,
                fc1,
                fc2,
                input_layernorm,
                post_attention_layernorm,
            });
        }
        rt.set_layer(None);
        let (p_first, p_len) = part(pi);
        let adapter_fc1 = unbiased(
            &mut ld,
            &format!("{v}.vision_adapter.mlp.fc1"),
            Slice::rows(pi, i, p_first, p_len),
        )?;
        let adapter_fc2 = BiasedLinear {
            adds_bias: false,
            ..unbiased(
                &mut ld,
                &format!("{v}.vision_adapter.mlp.fc2"),
                Slice::cols(po, pi, p_first, p_len),
            )?
        };
        let (t_first, t_len) = part(th);
        let linear_1 = unbiased(
            &mut ld,
            &format!("{PROJECTOR}.linear_1"),
            Slice::rows(th, s.vision_output_dim, t_first, t_len),
        )?;
        let rope_cache = rope_cache.ok_or_else(|| {
            Error::Request("vision_config.num_hidden_layers is 0: no encoder layer".into())
        })?;
        Ok(Llama4Vision {
            angles: cpu_llama4_vision::rope_angles(
                s.patches_per_side(),
                s.head_dim(),
                s.rope_theta,
            ),
            local_heads: s.num_attention_heads / shard.size,
            shape,
            act,
            patch_linear,
            class_embedding,
            positional_embedding,
            layernorm_pre,
            layernorm_post,
            layers,
            rope_cache,
            adapter_fc1,
            adapter_fc2,
            linear_1,
            varlen_attention: true,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        let ln = |n: &LayerNorm| n.bytes();
        let mut b = self.patch_linear.weight_bytes()
            + self.class_embedding.nbytes()
            + self.positional_embedding.nbytes()
            + ln(&self.layernorm_pre)
            + ln(&self.layernorm_post)
            + self.rope_cache.nbytes()
            + self.adapter_fc1.weight_bytes()
            + self.adapter_fc2.weight_bytes()
            + self.linear_1.weight_bytes();
        for l in &self.layers {
            b += l.qkv.weight_bytes()
                + l.qkv_bias.nbytes()
                + l.o_proj.weight_bytes()
                + l.fc1.weight_bytes()
                + l.fc2.weight_bytes()
                + ln(&l.input_layernorm)
                + ln(&l.post_attention_layernorm);
        }
        b
    }

    /// `Llama4VisionModel.forward` then `multi_modal_projector` on `tiles` tiles
    /// `pixel_values [tiles, C, S, S]` (mllama4.py 0.19 L505-544, L857-859). Returns
    /// `[tiles · tokens_per_tile, text_hidden]`, what `_process_image_input` splits per image.
    pub fn encode(&self, rt: &Runtime, pixels: &Tensor, tiles: usize) -> Result<Tensor> {
        let s = &self.shape;
        let act = self.act;
        let g = s.patches_per_side();
        let eps = LAYER_NORM_EPS as f32;
        rt.set_layer(None);
        let (rows, unfolded) = ops_l4v::unfold_rows(
            rt,
            pixels,
            (tiles, s.num_channels, s.image_size, s.patch_size),
            "vision.patch_embedding",
        )?;
        let patches =
            self.patch_linear
                .forward(rt, &rows, "vision.patch_embedding.linear", 0, act)?;
        drop(rows);
        let patches = ops_tp::all_gather_cols(rt, patches, "vision.patch_embedding.gather")?;
        drop(unfolded);
        let with_class = ops_l4v::cat_class(
            rt,
            &patches,
            &self.class_embedding,
            tiles,
            "vision.class_cat",
        )?;
        drop(patches);
        let positioned = ops_l4v::add_positions(
            rt,
            &with_class,
            &self.positional_embedding,
            "vision.positions",
        )?;
        drop(with_class);
        let pre = ops_phi::layer_norm(
            rt,
            &positioned,
            &self.layernorm_pre.w,
            &self.layernorm_pre.b,
            eps,
            "vision.layernorm_pre",
        )?;
        drop(positioned);
        // `hidden_state = self.model(hidden_state)`: the caller's name holds the normed
        // embeddings through the whole encoder; inside it each layer's output replaces the
        // previous one as the loop rebinds `hidden_states` (after the layer returns).
        let mut h: Option<Tensor> = None;
        for (li, layer) in self.layers.iter().enumerate() {
            rt.set_layer(Some(li as u32));
            let x = h.as_ref().unwrap_or(&pre);
            let out = self.layer(rt, layer, x, tiles, &format!("vision.layers.{li}"))?;
            h = Some(out);
        }
        rt.set_layer(None);
        drop(pre);
        let h = h.ok_or_else(|| Error::Request("the vision tower has no layer".into()))?;
        let post = ops_phi::layer_norm(
            rt,
            &h,
            &self.layernorm_post.w,
            &self.layernorm_post.b,
            eps,
            "vision.layernorm_post",
        )?;
        drop(h);
        let shuffled = ops_l4v::pixel_shuffle(
            rt,
            &post,
            (tiles, g, s.shuffle_factor()),
            "vision.pixel_shuffle",
        )?;
        // Llama4VisionMLP(output_activation=True): fc1, GELU, fc2 (reduced), GELU. The
        // shuffled patches (`encoded_patches`) and the post-norm output (the model's
        // `hidden_state`) stay named until the adapter returns.
        let a1 = self
            .adapter_fc1
            .forward(rt, &shuffled, "vision.adapter.fc1", 0, act)?;
        let g1 = ops_pixtral::gelu(rt, &a1, "vision.adapter.act")?;
        drop(a1);
        let a2 = self
            .adapter_fc2
            .forward(rt, &g1, "vision.adapter.fc2", 0, act)?;
        let a2 = ops_tp::all_reduce(rt, a2, "vision.adapter.fc2.all_reduce")?;
        drop(g1);
        let features = ops_pixtral::gelu(rt, &a2, "vision.adapter.out_act")?;
        drop(a2);
        drop(shuffled);
        drop(post);
        let out = self
            .linear_1
            .forward(rt, &features, "projector.linear_1", 0, act)?;
        let out = ops_tp::all_gather_cols(rt, out, "projector.linear_1.gather")?;
        drop(features);
        Ok(out)
    }

    /// One `Llama4VisionEncoderLayer.forward` (mllama4.py 0.19 L364-381): both residual
    /// adds make new tensors (`residual + hidden_state`); the input `x` stays with the
    /// caller (the encoder's `hidden_states`) until the layer returns.
    fn layer(
        &self,
        rt: &Runtime,
        layer: &Llama4VisionLayer,
        x: &Tensor,
        tiles: usize,
        l: &str,
    ) -> Result<Tensor> {
        let act = self.act;
        let eps = LAYER_NORM_EPS as f32;
        let n1 = ops_phi::layer_norm(
            rt,
            x,
            &layer.input_layernorm.w,
            &layer.input_layernorm.b,
            eps,
            &format!("{l}.input_layernorm"),
        )?;
        let a = self.attention(rt, layer, &n1, tiles, l)?;
        drop(n1);
        let h = ops_pixtral::add(rt, x, &a, &format!("{l}.residual_1"))?;
        drop(a);
        let n2 = ops_phi::layer_norm(
            rt,
            &h,
            &layer.post_attention_layernorm.w,
            &layer.post_attention_layernorm.b,
            eps,
            &format!("{l}.post_attention_layernorm"),
        )?;
        let f1 = layer
            .fc1
            .forward(rt, &n2, &format!("{l}.mlp.fc1"), 0, act)?;
        let g = ops_pixtral::gelu(rt, &f1, &format!("{l}.mlp.act"))?;
        drop(f1);
        let f2 = layer.fc2.forward(rt, &g, &format!("{l}.mlp.fc2"), 0, act)?;
        let f2 = ops_tp::all_reduce(rt, f2, &format!("{l}.mlp.fc2.all_reduce"))?;
        drop(g);
        // The normed input dies as `hidden_state` is rebound to the MLP's output.
        drop(n2);
        let out = ops_pixtral::add(rt, &h, &f2, &format!("{l}.residual_2"))?;
        drop(f2);
        drop(h);
        Ok(out)
    }

    /// `Llama4VisionAttention.forward` (mllama4.py 0.19 L311-331): `qkv_proj` (bias in the
    /// GEMM), the split views, the rotary on q and k, the encoder attention without a mask
    /// over each tile, `o_proj` and its all-reduce.
    fn attention(
        &self,
        rt: &Runtime,
        layer: &Llama4VisionLayer,
        x: &Tensor,
        tiles: usize,
        l: &str,
    ) -> Result<Tensor> {
        let s = &self.shape;
        let act = self.act;
        let (seq, hd) = (s.seq_len(), s.head_dim());
        let qkv = layer.qkv.forward(rt, x, &format!("{l}.qkv_proj"), 0, act)?;
        let w = self.local_heads * hd;
        let rows = [w; 3];
        let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
        let bias_names = ["q", "k", "v"].map(|n| format!("{l}.{n}_bias"));
        let mut parts = FusedLinear::split(&qkv, &rows, &names);
        for (part, b) in
            parts
                .iter_mut()
                .zip(FusedLinear::split_flat(&layer.qkv_bias, &rows, &bias_names))
        {
            crate::engine::ops::add_bias(rt, part, &b)?;
        }
        let [q, k, v] = <[Tensor; 3]>::try_from(parts)
            .map_err(|_| Error::Request(format!("{l}: qkv split into other than 3 parts")))?;
        let (q, k) = ops_l4v::rope_qk(
            rt,
            (&q, &k),
            &self.angles,
            (seq, self.local_heads, hd),
            &format!("{l}.rotary"),
        )?;
        let o = ops_siglip::vit_attention(
            rt,
            (&q, &k, &v),
            (tiles, seq, self.local_heads, hd),
            self.varlen_attention,
            &format!("{l}.attn"),
        )?;
        let out = layer
            .o_proj
            .forward(rt, &o, &format!("{l}.o_proj"), 0, act)?;
        let out = ops_tp::all_reduce(rt, out, &format!("{l}.o_proj.all_reduce"))?;
        // The attention's output dies at the rebind to o_proj's; the turned q and k and the
        // fused projection (v's view) as the function returns.
        drop(o);
        drop((q, k, v));
        drop(qkv);
        Ok(out)
    }
}

/// The runner's dummy batch on the device: `pixel_values [images · tiles, C, S, S]` (every
/// image's tiles flattened, `MultiModalFieldConfig.flat_from_sizes`, mllama4.py 0.19
/// L640-652) in the model dtype, then `patches_per_image` (int64 `[images]`) and
/// `aspect_ratios` (int64 `[images, 2]`), which stay on the host from 0.29 (`host_fields`:
/// `keep_on_cpu=True`, mllama4.py 0.29.0 L655-656).
pub fn dummy_pixels(
    rt: &Runtime,
    shape: &VisionTower,
    images: usize,
    act: DType,
    host_fields: bool,
) -> Result<Vec<Tensor>> {
    rt.set_op("mm_dummy_batch");
    let px = rt.tensor(
        "pixel_values",
        Category::Activation,
        &[
            images * shape.dummy_tiles(),
            shape.num_channels,
            shape.image_size,
            shape.image_size,
        ],
        act,
    )?;
    if host_fields {
        return Ok(vec![px]);
    }
    let per = rt.tensor(
        "patches_per_image",
        Category::Activation,
        &[images],
        DType::I64,
    )?;
    let ratios = rt.tensor(
        "aspect_ratios",
        Category::Activation,
        &[images, 2],
        DType::I64,
    )?;
    Ok(vec![px, per, ratios])
}

/// The projected tiles `[tiles · tokens_per_tile, text_hidden]` of the test images (one tile
/// each) of tests/llama4_vision_reference.rs and scripts/llama4_vision_reference.py through
/// the vision model and projector of the checkpoint at `dir`, computed on the CPU (fp32) by
/// the same load and ops a profile runs.
pub fn encode_test_images(dir: &std::path::Path, tiles: usize) -> Result<Vec<f32>> {
    let tower = vision_check::TestTower {
        family: "llama4",
        shape: |c| {
            c.llama4
                .as_ref()
                .and_then(|l| l.vision.as_ref())
                .map(|v| (v.num_channels, v.image_size))
        },
        load: |rt, cfg, src, opts| {
            let v = Llama4Vision::load(rt, cfg, src, opts)?;
            let act = v.act;
            Ok((v, act))
        },
        encode: |v, rt, px, n| v.encode(rt, px, n),
    };
    vision_check::encode_test_images(dir, tiles, &tower)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scout's tower and projector on one GPU weigh the checkpoint's 871,932,416 parameters
    /// in bf16, and the rotary's complex64 cache of 577 × 44 values (8 bytes each).
    #[test]
    fn scouts_tower_weighs_its_parameters_and_the_rotary_cache() {
        let (cfg, rt, opts, src) = vision_check::preset_on_h100("llama-4-scout");
        let v = Llama4Vision::load(&rt, &cfg, src.source.as_ref(), &opts).unwrap();
        assert_eq!(v.shape.dummy_image_tokens(), (2448, 2467));
        assert_eq!(v.shape.dummy_tiles(), 17);
        assert_eq!(v.weight_bytes(), 2 * 871_932_416 + 577 * 44 * 8);
    }
}

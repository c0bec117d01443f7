//! LLaVA-NeXT's vision side (`LlavaNextForConditionalGeneration`, ibm-granite/granite-vision-3.2-2b)
//! as vLLM 0.19 builds and runs it: the SigLIP tower up to its deepest feature layer (no
//! `post_layernorm`, no head), `image_newline`, `LlavaMultiModalProjector` (`linear_1`, GELU,
//! `linear_2`, llava.py 0.19 L128-160); then per image the tiles unpadded and closed by
//! newlines (llava_next.py 0.19 L352-490). The language model is `CausalLm`'s.

use super::gemma3_mm::SiglipTower;
use super::vision_check;
use crate::base::error::{Error, Result};
use crate::engine::ops_llava::{self, UnpadGrid};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops_pixtral, ops_tp};
use crate::memory::Category;
use crate::model::config::llava_next::{NEWLINE, PROJECTOR, TOWER};
use crate::model::config::{LlavaNextShape, ModelConfig};
use crate::model::layers::linear::BiasedLinear;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, Loader};
use crate::model::weights::WeightSource;

/// The tower, `image_newline` and the projector of a `LlavaNextForConditionalGeneration`.
pub struct LlavaNextVision {
    pub shape: LlavaNextShape,
    pub act: DType,
    pub tower: SiglipTower,
    /// `[text_hidden]`.
    pub newline: Tensor,
    pub linear_1: BiasedLinear,
    pub linear_2: BiasedLinear,
}

impl LlavaNextVision {
    /// Loads the tower (its first `layers_used` layers), `image_newline` and the projector
    /// through the framework allocator in the order `__init__` makes them (llava_next.py 0.19
    /// L278-295).
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg.llava_next.clone().ok_or_else(|| {
            Error::Request("this config has no vision tower (model_type llava_next)".into())
        })?;
        opts.require_16bit_tower(src, "llava_next (multimodal)")?;
        if !shape.select_full {
            // "default" slices each feature layer (`feats[:, 1:, :]`, vision.py 0.19 L164-165)
            // before the projector; its copies are not modelled.
            return Err(Error::Request(
                "llava_next with vision_feature_select_strategy \"default\" (a SigLIP tower without a class token) is not modelled; \"full\" (granite-vision) is".into(),
            ));
        }
        let th = cfg.hidden_size;
        let mut ld = Loader::tower(rt, src, opts, shape.tensor_shapes(th).len());
        let act = ld.act;
        let tower = SiglipTower::load(rt, &mut ld, &shape.vision, TOWER, shape.layers_used, false)?;
        rt.set_layer(None);
        let newline = ld.dense(NEWLINE, &[th])?;
        let shard = TpShard::of_ranks(rt);
        if !th.is_multiple_of(shard.size) {
            return Err(Error::Request(format!(
                "--tensor-parallel-size {} does not divide the projector's width {th}",
                shard.size
            )));
        }
        let (t_first, t_len) = (shard.rank * th / shard.size, th / shard.size);
        let fw = shape.feature_width();
        // ColumnParallelLinear then RowParallelLinear, both biased (llava.py 0.19 L140-154).
        let linear_1 = BiasedLinear::load_column(
            &mut ld,
            &format!("{PROJECTOR}.linear_1"),
            (th, fw),
            (t_first, t_len),
        )?;
        let linear_2 = BiasedLinear::load_row(
            &mut ld,
            &format!("{PROJECTOR}.linear_2"),
            (th, th),
            (t_first, t_len),
            shard.rank,
        )?;
        Ok(LlavaNextVision {
            shape,
            act,
            tower,
            newline,
            linear_1,
            linear_2,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        self.tower.weight_bytes()
            + self.newline.nbytes()
            + self.linear_1.weight_bytes()
            + self.linear_2.weight_bytes()
    }

    /// `_process_image_pixels` on `crops` crops `[crops, C, S, S]` (llava_next.py 0.19
    /// L437-455): the tower with every hidden state kept where there are several feature
    /// layers (`return_all_hidden_states`, siglip.py 0.19 L554-570), their `cat` along the
    /// width (vision.py 0.19 L253-274; the list dies as the transformer returns), the
    /// projector. Returns `[crops · g², text_hidden]`, what transformers'
    /// `get_image_features` returns before its split.
    pub fn features(&self, rt: &Runtime, pixels: &Tensor, crops: usize) -> Result<Tensor> {
        let act = self.act;
        let layers = self.shape.pool_indices();
        let pool = self.tower.forward(rt, pixels, crops, layers.len() > 1)?;
        rt.set_layer(None);
        let stacked = if layers.len() > 1 {
            let parts: Vec<&Tensor> = layers.iter().map(|&i| &pool[i]).collect();
            ops_llava::cat_features(rt, &parts, "vision.feature_layers.cat")?
        } else {
            let mut pool = pool;
            let last = pool.pop().expect("the pool holds the embeddings");
            drop(pool);
            last
        };
        // Every hidden state, the embeddings among them, dies with the encoder's list.
        let h1 = self
            .linear_1
            .forward(rt, &stacked, "projector.linear_1", 0, act)?;
        let a = ops_pixtral::gelu(rt, &h1, "projector.act")?;
        drop(h1);
        let h2 = self
            .linear_2
            .forward(rt, &a, "projector.linear_2", 0, act)?;
        let h2 = ops_tp::all_reduce(rt, h2, "projector.linear_2.all_reduce")?;
        drop(a);
        // `stacked_image_features` dies as `_process_image_pixels` returns.
        drop(stacked);
        Ok(h2)
    }

    /// `embed_multimodal` on `images` dummy images of the maximum feature size, each cut into
    /// `crops_per_image` crops (`pixel_values [images · crops, C, S, S]`): `features`, then
    /// each image merged (`spatial_unpad`, llava_next.py 0.19 L467-490, one after another in
    /// the list comprehension). Returns the images' embeddings, `[tokens, text_hidden]` each;
    /// the projector's output dies as `_process_image_input` returns.
    pub fn encode(&self, rt: &Runtime, pixels: &Tensor, images: usize) -> Result<Vec<Tensor>> {
        let per = self.shape.crops_per_image();
        let h2 = self.features(rt, pixels, images * per)?;
        let (h, w, _) = self.shape.max_feature_image();
        let (rows, cols) = self.shape.grid_shape(h, w);
        let g = self.shape.vision.patches_per_side();
        let grid = UnpadGrid {
            rows,
            cols,
            g,
            window: self.shape.unpad_window(h, w),
        };
        let th = h2.cols();
        let mut out = Vec::with_capacity(images);
        for i in 0..images {
            let crops = h2.part(
                format!("patch_embeddings.{i}"),
                i * per * g * g * th,
                &[per * g * g, th],
            );
            out.push(ops_llava::spatial_unpad_merge(
                rt,
                &crops,
                &self.newline,
                grid,
                &format!("image_embeds.{i}"),
            )?);
        }
        drop(h2);
        Ok(out)
    }
}

/// The runner's dummy batch on the device: `pixel_values [images, crops, C, S, S]` (the
/// processor's crops of the `get_image_size_with_most_features` image, the base first; one
/// tensor since every image has as many, `MultiModalFieldConfig.batched`, llava_next.py 0.19
/// L210-219) in the model dtype, then `image_sizes` (int64 `[images, 2]`).
pub fn dummy_pixels(
    rt: &Runtime,
    shape: &LlavaNextShape,
    images: usize,
    act: DType,
    sizes_on_host: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let s = &shape.vision;
    rt.set_op("mm_dummy_batch");
    let px = rt.tensor(
        "pixel_values",
        Category::Activation,
        &[
            images * shape.crops_per_image(),
            s.num_channels,
            s.image_size,
            s.image_size,
        ],
        act,
    )?;
    let sizes = if sizes_on_host {
        None
    } else {
        Some(rt.tensor(
            "image_sizes",
            Category::Activation,
            &[images, 2],
            DType::I64,
        )?)
    };
    Ok((px, sizes))
}

/// The projected crops `[crops · g², text_hidden]` of the test images (each one crop) of
/// tests/llava_next_reference.rs and scripts/llava_next_reference.py through the tower and
/// projector of the checkpoint at `dir`, computed on the CPU (fp32) by the same load and ops a
/// profile runs.
pub fn encode_test_images(dir: &std::path::Path, crops: usize) -> Result<Vec<f32>> {
    let tower = vision_check::TestTower {
        family: "llava_next",
        shape: |c| {
            c.llava_next
                .as_ref()
                .map(|s| (s.vision.num_channels, s.vision.image_size))
        },
        load: |rt, cfg, src, opts| {
            let v = LlavaNextVision::load(rt, cfg, src, opts)?;
            let act = v.act;
            Ok((v, act))
        },
        encode: |v, rt, px, n| v.features(rt, px, n),
    };
    vision_check::encode_test_images(dir, crops, &tower)
}

/// The first test image of tests/llava_next_reference.rs as `embed_multimodal` makes it: its
/// `crops_per_image` crops (the test pixels) through `encode`, the one merged image
/// `[tokens, text_hidden]` of the pinpoint with the most features, on the CPU (fp32).
pub fn encode_test_image_merged(dir: &std::path::Path) -> Result<Vec<f32>> {
    let source = crate::model::ModelSource::Path {
        path: dir.to_path_buf(),
    };
    let opened = crate::model::open(&source, 0)?;
    let shape =
        opened.config.llava_next.clone().ok_or_else(|| {
            Error::Request(format!("{}: not a llava_next checkpoint", dir.display()))
        })?;
    let (rt, opts) = vision_check::sim_runtime("sim:h100-80gb", crate::quant::Quant::F16)?;
    let v = LlavaNextVision::load(&rt, &opened.config, opened.source.as_ref(), &opts)?;
    let s = &shape.vision;
    let crops = shape.crops_per_image();
    let px = rt.tensor_with_values(
        "pixel_values",
        Category::Activation,
        &[crops, s.num_channels, s.image_size, s.image_size],
        v.act,
        vision_check::test_pixels(s.num_channels, s.image_size, crops),
    )?;
    let out = v.encode(&rt, &px, 1)?;
    crate::engine::ops::read_f32(&rt, &out[0])?
        .ok_or_else(|| Error::Request("the embeddings were not computed (a dry device)".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// granite-vision-3.2-2b's tower (27 layers), newline and projector weigh their
    /// parameters in bf16: 1152 × 3 × 14² + 1152 (patch), 729 × 1152 (positions), 27 layers of
    /// 4 × (1152² + 1152) + 2 × 1152 × 4304 + 4304 + 1152 + 4 × 1152, then 2048 (newline),
    /// 4608 × 2048 + 2048 and 2048² + 2048 (projector).
    #[test]
    fn the_tower_weighs_what_vllm_loads() {
        let (cfg, rt, opts, src) = vision_check::preset_on_h100("granite-vision-3.2-2b");
        let v = LlavaNextVision::load(&rt, &cfg, src.source.as_ref(), &opts).unwrap();
        let layer = 4 * (1152 * 1152 + 1152) + 2 * 1152 * 4304 + 4304 + 1152 + 4 * 1152;
        let tower = 1152 * 3 * 14 * 14 + 1152 + 729 * 1152 + 27 * layer;
        let rest = 2048 + 4608 * 2048 + 2048 + 2048 * 2048 + 2048;
        assert_eq!(tower, 412_984_944);
        assert_eq!(rest, 13_637_632);
        assert_eq!(v.weight_bytes(), (tower + rest) * 2);
        let mm = cfg.llava_next.as_ref().unwrap();
        assert_eq!(mm.loaded_param_count(2048), tower + rest);
    }
}

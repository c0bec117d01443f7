//! LLaVA-NeXT's multimodal checkpoint (`model_type` llava_next:
//! `LlavaNextForConditionalGeneration`, ibm-granite/granite-vision-3.2-2b): its `text_config` is
//! the language model (granite here), its `vision_config` a SigLIP vision tower, and
//! `multi_modal_projector` maps the tower's features (the hidden states of the
//! `vision_feature_layer` layers, concatenated) to the language model's width through
//! `linear_1`, GELU and `linear_2`; `image_newline` closes each row of an image's tiles.
//! Read as vLLM 0.19.0's llava_next.py, llava.py, siglip.py and vision.py build it:
//!
//! - the tower is built only up to the deepest feature layer (`_get_num_hidden_layers`,
//!   llava.py 0.19 L438-455, with utils.py's `get_layer_index`: -1 is the last layer) and
//!   without `post_layernorm` (`require_post_norm=False`, llava_next.py 0.19 L279-284) or the
//!   pooling head (`use_head=False`, siglip.py 0.19 L851-869); the checkpoint's other tower
//!   tensors are skipped (siglip.py 0.19 L910-927);
//! - the projector's input is `hidden_size × len(vision_feature_layer)` wide
//!   (llava_next.py 0.19 L253-268), `linear_1` a ColumnParallelLinear and `linear_2` a
//!   RowParallelLinear (llava.py 0.19 L128-160);
//! - an image of `H × W` pixels counts `base + unpadded + newline` tokens
//!   (`get_num_image_tokens`, llava_next.py 0.19 L104-173), the dummy image is the grid
//!   pinpoint with the most (`get_image_size_with_most_features`, L175-190).
//!
//! The CLIP tower (llava-hf/llava-v1.6-*) is not modelled yet and is refused by name.

use serde::{Deserialize, Serialize};

use super::gemma3_mm::SiglipShape;
use super::{count_or, float, ModelConfig};

/// What a `LlavaNextForConditionalGeneration` adds to its language model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlavaNextShape {
    /// The checkpoint's tower (`num_layers` is the checkpoint's count).
    pub vision: SiglipShape,
    /// `vision_feature_layer` as a list (one entry for an int).
    pub feature_layers: Vec<i64>,
    /// The tower's layers vLLM builds: up to the deepest feature layer.
    pub layers_used: usize,
    /// `vision_feature_select_strategy` "full" (every patch) or "default" (drops the first).
    pub select_full: bool,
    /// `image_grid_pinpoints` as `(height, width)`, in the config's order.
    pub pinpoints: Vec<(usize, usize)>,
    /// `multimodal_projector_bias` (true by default).
    pub projector_bias: bool,
    /// The `<image>` token (`image_token_index`).
    pub image_token_index: usize,
    /// Whether the checkpoint holds the tower's pooling head: transformers' SiglipVisionModel
    /// builds one unless `vision_config.vision_use_head` is false (SiglipVisionConfig has no
    /// such key, so granite-vision's saved tower carries it); vLLM never loads it
    /// (`use_head=False`, siglip.py 0.19 L851-860, skipped at L918-921).
    pub head_in_checkpoint: bool,
}

/// Where the tower's, projector's and newline's tensors sit in the checkpoint (transformers
/// 4.49's names; vLLM maps 4.52's `model.vision_tower.` ones the same, llava_next.py 0.19
/// L228-237; vramscope reads both, checkpoint_names.rs).
pub const TOWER: &str = "vision_tower.vision_model";
pub const PROJECTOR: &str = "multi_modal_projector";
pub const NEWLINE: &str = "image_newline";

/// `get_layer_index` (models/utils.py 0.19 L882-892): a negative index counts from the end (-1 is the last
/// layer, `num_layers`); `None` when it is out of range.
pub(crate) fn layer_index(i: i64, num_layers: usize) -> Option<usize> {
    let n = num_layers as i64;
    let at = if i < 0 { n + i + 1 } else { i };
    (0..=n).contains(&at).then_some(at as usize)
}

/// Python's `round(x, 7)` for the non-negative values `_get_num_unpadded_features` rounds.
fn round7(x: f64) -> f64 {
    (x * 1e7).round() / 1e7
}

impl LlavaNextShape {
    /// The projector's input width: the tower's width times the feature layers (4608 for
    /// granite-vision's four layers of 1152).
    pub fn feature_width(&self) -> usize {
        self.vision.hidden_size * self.feature_layers.len()
    }

    /// Which of the encoder's outputs (the embeddings, then each layer's) the feature layers
    /// take, in order: `resolve_visual_encoder_outputs` indexes the list of `layers_used + 1`
    /// by the config's index, a negative one offset by the layers not built (vision.py 0.19
    /// L253-260), which is `get_layer_index` of the checkpoint's count.
    pub fn pool_indices(&self) -> Vec<usize> {
        self.feature_layers
            .iter()
            .map(|&l| layer_index(l, self.vision.num_layers).expect("checked at parse"))
            .collect()
    }

    /// Tokens one tile gives after the feature selection (`get_num_selected_vision_tokens`,
    /// vision.py 0.19 L173-191): SigLIP's patches (`SiglipEncoderInfo`, siglip.py 0.19
    /// L264-281), one fewer with "default".
    pub fn base_tokens(&self) -> usize {
        let n = self.vision.num_patches();
        if self.select_full {
            n
        } else {
            n - 1
        }
    }

    /// transformers' `select_best_resolution` (image_processing_utils): the pinpoint that
    /// keeps the most of an `h × w` image, then wastes the least.
    fn best_resolution(&self, h: usize, w: usize) -> (usize, usize) {
        let (mut best, mut best_eff, mut best_waste) = (self.pinpoints[0], 0u64, u64::MAX);
        for &(ph, pw) in &self.pinpoints {
            let scale = (pw as f64 / w as f64).min(ph as f64 / h as f64);
            let (dw, dh) = ((w as f64 * scale) as u64, (h as f64 * scale) as u64);
            let eff = (dw * dh).min((w * h) as u64);
            let waste = (ph * pw) as u64 - eff;
            if eff > best_eff || (eff == best_eff && waste < best_waste) {
                (best, best_eff, best_waste) = ((ph, pw), eff, waste);
            }
        }
        best
    }

    /// `get_anyres_image_grid_shape`: the tiles `(rows, columns)` an `h × w` image is cut into.
    pub fn grid_shape(&self, h: usize, w: usize) -> (usize, usize) {
        let (ph, pw) = self.best_resolution(h, w);
        let side = self.vision.image_size;
        (ph / side, pw / side)
    }

    /// `_get_num_unpadded_features` (llava_next.py 0.19 L142-173) and `unpad_image`
    /// (transformers' modeling_llava_next): the window `(top, left, height, width)`, in
    /// patches, the tiles of an `h × w` image keep once their padding is cut.
    pub fn unpad_window(&self, h: usize, w: usize) -> (usize, usize, usize, usize) {
        let (rows, cols) = self.grid_shape(h, w);
        let np = self.vision.patches_per_side();
        let (ch, cw) = (np * rows, np * cols);
        let aspect = w as f64 / h as f64;
        let current = cw as f64 / ch as f64;
        if aspect > current {
            let new_h = round7(h as f64 * (cw as f64 / w as f64)) as usize;
            let pad = (ch - new_h.min(ch)) / 2;
            (pad, 0, ch - 2 * pad, cw)
        } else {
            let new_w = round7(w as f64 * (ch as f64 / h as f64)) as usize;
            let pad = (cw - new_w.min(cw)) / 2;
            (0, pad, ch, cw - 2 * pad)
        }
    }

    /// `get_num_image_tokens` (llava_next.py 0.19 L104-139): the base tile's tokens, the
    /// unpadded tiles' and one newline a row.
    pub fn num_image_tokens(&self, h: usize, w: usize) -> usize {
        let (_, _, ch, cw) = self.unpad_window(h, w);
        ch * cw + ch + self.base_tokens()
    }

    /// `get_image_size_with_most_features` (llava_next.py 0.19 L175-190): the first pinpoint
    /// whose image counts the most tokens, `(height, width, tokens)` (3840 × 384 and 8289 for
    /// granite-vision).
    pub fn max_feature_image(&self) -> (usize, usize, usize) {
        let mut best = (0, 0, 0);
        for &(h, w) in &self.pinpoints {
            let t = self.num_image_tokens(h, w);
            if t > best.2 {
                best = (h, w, t);
            }
        }
        best
    }

    /// The crops the processor cuts the dummy image into: the whole image resized to one tile,
    /// then the grid's tiles (11 for granite-vision's 10 × 1 grid).
    pub fn crops_per_image(&self) -> usize {
        let (h, w, _) = self.max_feature_image();
        let (rows, cols) = self.grid_shape(h, w);
        1 + rows * cols
    }

    /// The vision tower's, projector's and newline's tensors as the checkpoint stores them
    /// (every tower layer, `post_layernorm` and the pooling head where saved, which vLLM
    /// skips).
    pub fn tensor_shapes(&self, text_hidden: usize) -> Vec<(String, Vec<usize>)> {
        let s = &self.vision;
        let (d, i) = (s.hidden_size, s.intermediate_size);
        let mut out = s.tower_tensor_shapes(TOWER);
        if self.head_in_checkpoint {
            // SiglipMultiheadAttentionPoolingHead: the probe, nn.MultiheadAttention's packed
            // in_proj and out_proj, a LayerNorm and a SiglipMLP.
            let h = format!("{TOWER}.head");
            out.push((format!("{h}.probe"), vec![1, 1, d]));
            out.push((format!("{h}.attention.in_proj_weight"), vec![3 * d, d]));
            out.push((format!("{h}.attention.in_proj_bias"), vec![3 * d]));
            out.push((format!("{h}.attention.out_proj.weight"), vec![d, d]));
            out.push((format!("{h}.attention.out_proj.bias"), vec![d]));
            out.push((format!("{h}.layernorm.weight"), vec![d]));
            out.push((format!("{h}.layernorm.bias"), vec![d]));
            out.push((format!("{h}.mlp.fc1.weight"), vec![i, d]));
            out.push((format!("{h}.mlp.fc1.bias"), vec![i]));
            out.push((format!("{h}.mlp.fc2.weight"), vec![d, i]));
            out.push((format!("{h}.mlp.fc2.bias"), vec![d]));
        }
        let th = text_hidden;
        out.push((
            format!("{PROJECTOR}.linear_1.weight"),
            vec![th, self.feature_width()],
        ));
        if self.projector_bias {
            out.push((format!("{PROJECTOR}.linear_1.bias"), vec![th]));
        }
        out.push((format!("{PROJECTOR}.linear_2.weight"), vec![th, th]));
        if self.projector_bias {
            out.push((format!("{PROJECTOR}.linear_2.bias"), vec![th]));
        }
        out.push((NEWLINE.to_string(), vec![th]));
        out
    }

    /// Whether vLLM loads a checkpoint tensor: not the layers past the deepest feature
    /// layer, not `post_layernorm`, not the pooling head.
    pub fn loads(&self, name: &str) -> bool {
        if name.starts_with(&format!("{TOWER}.post_layernorm"))
            || name.starts_with(&format!("{TOWER}.head."))
        {
            return false;
        }
        if let Some(rest) = name.strip_prefix(&format!("{TOWER}.encoder.layers.")) {
            let l: usize = rest
                .split('.')
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            return l < self.layers_used;
        }
        true
    }

    /// Parameters of the tower, projector and newline in the checkpoint.
    pub fn param_count(&self, text_hidden: usize) -> u64 {
        self.tensor_shapes(text_hidden)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }

    /// Parameters vLLM loads of them (`loads`).
    pub fn loaded_param_count(&self, text_hidden: usize) -> u64 {
        self.tensor_shapes(text_hidden)
            .iter()
            .filter(|(n, _)| self.loads(n))
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }
}

impl ModelConfig {
    /// A `LlavaNextConfig`: the language model from `text_config` (granite, llama or mistral
    /// read as themselves), the SigLIP tower from `vision_config`, the projector's and
    /// anyres keys.
    pub(super) fn llava_next_from_hf_json(
        v: &serde_json::Value,
    ) -> std::result::Result<Self, String> {
        let Some(text @ serde_json::Value::Object(_)) = v.get("text_config") else {
            return Err(
                "model_type llava_next needs a text_config object (its language model)".into(),
            );
        };
        match text.get("model_type").and_then(serde_json::Value::as_str) {
            Some("granite" | "llama" | "mistral") => {}
            Some(other) => {
                return Err(format!(
                    "text_config.model_type is '{other}' in a llava_next config: granite, llama or mistral are modelled"
                ))
            }
            None => {
                return Err(
                    "text_config.model_type is missing in a llava_next config (LlavaNextConfig's default is llama; give it)"
                        .into(),
                )
            }
        }
        let mut cfg = Self::from_hf_json(text).map_err(|e| format!("text_config: {e}"))?;
        let Some(vis @ serde_json::Value::Object(_)) = v.get("vision_config") else {
            return Err(
                "model_type llava_next needs a vision_config object (its vision tower)".into(),
            );
        };
        match vis.get("model_type").and_then(serde_json::Value::as_str) {
            Some("siglip_vision_model") => {}
            Some("clip_vision_model") | None => {
                return Err(
                    "vision_config is a CLIP tower (clip_vision_model, LlavaNextConfig's default): llava_next with CLIP (llava-hf/llava-v1.6-*) is not modelled yet; its SigLIP tower (ibm-granite/granite-vision-3.2-2b) is"
                        .into(),
                )
            }
            Some(other) => {
                return Err(format!(
                    "vision_config.model_type is '{other}', expected 'siglip_vision_model' in a llava_next config"
                ))
            }
        }
        if let Some(a) = vis.get("hidden_act").filter(|a| !a.is_null()) {
            if a.as_str() != Some("gelu_pytorch_tanh") {
                return Err(format!(
                    "vision_config.hidden_act is {a}, expected \"gelu_pytorch_tanh\" (the only one modelled)"
                ));
            }
        }
        if let Some(a) = v.get("projector_hidden_act").filter(|a| !a.is_null()) {
            if a.as_str() != Some("gelu") {
                return Err(format!(
                    "projector_hidden_act is {a}, expected \"gelu\" (the only one modelled)"
                ));
            }
        }
        let head_in_checkpoint = match vis.get("vision_use_head") {
            None | Some(serde_json::Value::Null) => true,
            Some(b) => b
                .as_bool()
                .ok_or("vision_config.vision_use_head must be true or false")?,
        };
        let e =
            |r: std::result::Result<usize, String>| r.map_err(|e| format!("vision_config: {e}"));
        let vision = SiglipShape {
            hidden_size: e(count_or(vis, "hidden_size", 768, 1 << 16))?,
            intermediate_size: e(count_or(vis, "intermediate_size", 3072, 1 << 18))?,
            num_layers: e(count_or(vis, "num_hidden_layers", 12, 1 << 8))?,
            num_heads: e(count_or(vis, "num_attention_heads", 12, 1 << 8))?,
            num_channels: e(count_or(vis, "num_channels", 3, 4))?,
            image_size: e(count_or(vis, "image_size", 224, 1 << 13))?,
            patch_size: e(count_or(vis, "patch_size", 16, 1 << 8))?,
            layer_norm_eps: float(
                vis,
                "layer_norm_eps",
                1e-6,
                |x| x > 0.0 && x < 1.0,
                "above 0 and below 1",
            )
            .map_err(|e| format!("vision_config: {e}"))?,
        };
        if !vision.hidden_size.is_multiple_of(vision.num_heads) {
            return Err(format!(
                "vision_config: hidden_size {} is not a multiple of num_attention_heads {}",
                vision.hidden_size, vision.num_heads
            ));
        }
        // The convolution is "valid": 384-pixel crops in patches of 14 give 27 a side, the
        // last 6 pixels unread (siglip.py 0.19 L292-300: a "valid" Conv2d, `(image_size //
        // patch_size) ** 2` patches).
        if vision.patch_size > vision.image_size {
            return Err(format!(
                "vision_config: patch_size {} is larger than image_size {}",
                vision.patch_size, vision.image_size
            ));
        }
        // LlavaNextConfig's default feature layer is -2.
        let feature_layers: Vec<i64> = match v.get("vision_feature_layer") {
            None | Some(serde_json::Value::Null) => vec![-2],
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| x.as_i64())
                .collect::<Option<Vec<_>>>()
                .filter(|l| !l.is_empty())
                .ok_or("vision_feature_layer must be an integer or a list of integers")?,
            Some(x) => vec![x
                .as_i64()
                .ok_or("vision_feature_layer must be an integer or a list of integers")?],
        };
        let mut layers_used = 0;
        for &l in &feature_layers {
            let at = layer_index(l, vision.num_layers).ok_or_else(|| {
                format!(
                    "vision_feature_layer {l} is outside the tower's {} layers",
                    vision.num_layers
                )
            })?;
            layers_used = layers_used.max(at);
        }
        let select_full = match v
            .get("vision_feature_select_strategy")
            .and_then(serde_json::Value::as_str)
        {
            None | Some("default") => false,
            Some("full") => true,
            Some(other) => {
                return Err(format!(
                    "vision_feature_select_strategy '{other}': \"default\" or \"full\" are modelled"
                ))
            }
        };
        if v.get("use_image_newline_parameter")
            .and_then(serde_json::Value::as_bool)
            == Some(false)
        {
            return Err("use_image_newline_parameter false: vLLM's llava_next.py always makes image_newline; such a checkpoint is not modelled".into());
        }
        let pinpoints: Vec<(usize, usize)> = match v.get("image_grid_pinpoints") {
            None | Some(serde_json::Value::Null) => {
                // LlavaNextConfig's default.
                vec![(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)]
            }
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|p| {
                    let p = p.as_array()?;
                    match p.as_slice() {
                        [h, w] => Some((h.as_u64()? as usize, w.as_u64()? as usize)),
                        _ => None,
                    }
                })
                .collect::<Option<Vec<_>>>()
                .filter(|p| !p.is_empty())
                .ok_or("image_grid_pinpoints must be a list of [height, width] pairs")?,
            Some(_) => {
                return Err("image_grid_pinpoints must be a list of [height, width] pairs".into())
            }
        };
        let side = vision.image_size;
        if let Some(&(h, w)) = pinpoints.iter().find(|&&(h, w)| {
            h == 0 || w == 0 || h % side != 0 || w % side != 0 || h > 1 << 15 || w > 1 << 15
        }) {
            return Err(format!(
                "image_grid_pinpoints [{h}, {w}] is not a whole number of {side}-pixel tiles"
            ));
        }
        let projector_bias = match v.get("multimodal_projector_bias") {
            None | Some(serde_json::Value::Null) => true,
            Some(b) => b
                .as_bool()
                .ok_or("multimodal_projector_bias must be true or false")?,
        };
        if !projector_bias {
            return Err("multimodal_projector_bias false: a projector without biases is not modelled for llava_next".into());
        }
        cfg.llava_next = Some(LlavaNextShape {
            vision,
            feature_layers,
            layers_used,
            select_full,
            pinpoints,
            projector_bias,
            image_token_index: count_or(v, "image_token_index", 32000, 1 << 24)?,
            head_in_checkpoint,
        });
        Ok(cfg)
    }
}

impl ModelConfig {
    /// The `LlavaNextConfig` a Hugging Face loader reads: the language model as its
    /// `text_config`, the tower's and the anyres keys.
    pub(super) fn llava_next_to_hf_json(
        &self,
        mm: &LlavaNextShape,
        torch_dtype: &str,
    ) -> serde_json::Value {
        let text = ModelConfig {
            llava_next: None,
            kimi_vl: None,
            ..self.clone()
        }
        .to_hf_json(torch_dtype);
        let v = &mm.vision;
        let mut vision = serde_json::json!({
            "model_type": "siglip_vision_model",
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": v.hidden_size,
            "intermediate_size": v.intermediate_size,
            "num_hidden_layers": v.num_layers,
            "num_attention_heads": v.num_heads,
            "num_channels": v.num_channels,
            "image_size": v.image_size,
            "patch_size": v.patch_size,
            "layer_norm_eps": v.layer_norm_eps,
        });
        if !mm.head_in_checkpoint {
            vision["vision_use_head"] = false.into();
        }
        serde_json::json!({
            "architectures": ["LlavaNextForConditionalGeneration"],
            "model_type": "llava_next",
            "image_token_index": mm.image_token_index,
            "image_grid_pinpoints": mm.pinpoints.iter().map(|&(h, w)| [h, w]).collect::<Vec<_>>(),
            "multimodal_projector_bias": mm.projector_bias,
            "projector_hidden_act": "gelu",
            "use_image_newline_parameter": true,
            "vision_feature_layer": mm.feature_layers,
            "vision_feature_select_strategy": if mm.select_full { "full" } else { "default" },
            "tie_word_embeddings": self.tie_word_embeddings,
            "text_config": text,
            "vision_config": vision,
            "torch_dtype": torch_dtype,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granite_vision() -> ModelConfig {
        crate::model::presets::preset("granite-vision-3.2-2b").unwrap()
    }

    #[test]
    fn granite_visions_tower_keeps_every_layer_and_drops_the_post_norm() {
        let c = granite_vision();
        let mm = c.llava_next.as_ref().unwrap();
        // [-24, -20, -12, -1] of 27 layers: layers 4, 8, 16 and 27; the deepest is 27.
        assert_eq!(mm.layers_used, 27);
        assert_eq!(mm.feature_width(), 4608);
        assert_eq!(mm.vision.num_patches(), 729);
        assert!(!mm.loads("vision_tower.vision_model.post_layernorm.weight"));
        assert!(mm.loads("vision_tower.vision_model.encoder.layers.26.mlp.fc1.weight"));
    }

    /// The published checkpoint's parameters, derived by hand from its config and equal to
    /// what transformers 5.17's `LlavaNextForConditionalGeneration` (the class that saved the
    /// checkpoint) holds when built from the same config.json (`scripts/param_count.py`, meta
    /// device, docs/gpu-runs.md run 99; the index file itself is not reachable from here):
    /// the granite language model 2,533,533,696
    /// (49156 × 2048 tied embeddings, 40 layers of q/o 2048², k/v 2048 × 512, gate/up/down
    /// 3 × 2048 × 8192 and two norms, the final norm), the tower as transformers saves it
    /// 428,225,600 (27 layers, `post_layernorm` and the pooling head vLLM skips), the
    /// projector and newline 13,637,632: 2,975,396,928, so 5,950,793,856 bytes in bf16 and
    /// 11,901,587,712 in f32.
    #[test]
    fn granite_visions_checkpoint_counts_its_parameters() {
        let c = granite_vision();
        let mm = c.llava_next.as_ref().unwrap();
        let (tower, post, head, rest) = (412_984_944u64, 2 * 1152, 15_238_352, 13_637_632);
        assert_eq!(mm.param_count(2048), tower + post + head + rest);
        assert_eq!(mm.loaded_param_count(2048), tower + rest);
        assert_eq!(c.param_count(), 2_975_396_928);
        assert_eq!(c.param_count() - mm.param_count(2048), 2_533_533_696);
    }

    #[test]
    fn the_dummy_image_is_the_tallest_pinpoint() {
        let mm = granite_vision().llava_next.unwrap();
        // 3840 × 384: 10 × 1 tiles of 27² patches, 10 rows of 27 newlines, the 729-token base.
        assert_eq!(mm.grid_shape(3840, 384), (10, 1));
        assert_eq!(mm.num_image_tokens(3840, 384), 7290 + 270 + 729);
        // 768 × 1920 has as many tiles but fewer rows: 8073; 384 × 3840 one row: 8046.
        assert_eq!(mm.num_image_tokens(768, 1920), 8073);
        assert_eq!(mm.num_image_tokens(384, 3840), 8046);
        assert_eq!(mm.max_feature_image(), (3840, 384, 8289));
        assert_eq!(mm.crops_per_image(), 11);
        // A padded image: 500 × 1000 is kept whole first by 768 × 1152 (2 × 3 tiles, 54 × 81
        // patches); its aspect 2.0 is wider than the grid's 1.5, so the rows shrink to
        // int(round(500 · 81 / 1000, 7)) = 40 (padding 7 above and below).
        assert_eq!(mm.grid_shape(500, 1000), (2, 3));
        assert_eq!(mm.num_image_tokens(500, 1000), 40 * 81 + 40 + 729);
    }

    #[test]
    fn other_towers_and_layers_are_refused_by_name() {
        let mut v = crate::model::presets::granite_vision_32_2b_json();
        v["vision_config"]["model_type"] = "clip_vision_model".into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("CLIP"), "{e}");
        let mut v = crate::model::presets::granite_vision_32_2b_json();
        v["vision_feature_layer"] = serde_json::json!([-24, -30]);
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("-30"), "{e}");
        let mut v = crate::model::presets::granite_vision_32_2b_json();
        v["vision_feature_select_strategy"] = "class".into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("class"), "{e}");
        // One int: the tower up to that layer (-2 of 27 is 26).
        let mut v = crate::model::presets::granite_vision_32_2b_json();
        v["vision_feature_layer"] = serde_json::json!(-2);
        let c = ModelConfig::from_hf_json(&v).unwrap();
        let mm = c.llava_next.unwrap();
        assert_eq!((mm.layers_used, mm.feature_width()), (26, 1152));
    }
}

//! Mistral 3's multimodal checkpoint (`model_type` mistral3: `Mistral3ForConditionalGeneration`,
//! mistralai/Mistral-Small-3.1-24B-Instruct-2503 and -3.2-24B-Instruct-2506): its `text_config`
//! is a Mistral (Llama-shaped) language model, its `vision_config` the Pixtral-HF vision tower
//! (vLLM pixtral.py `PixtralHFVisionModel`), and `multi_modal_projector` normalizes, merges
//! `spatial_merge_size²` patches into one and projects them to the language model's width
//! (vLLM mistral3.py `Mistral3MultiModalProjector`). The same code in vLLM 0.10.0, 0.11.0,
//! 0.15.1 and 0.19.0; transformers' defaults (`Mistral3Config`, `PixtralVisionConfig`) for the
//! keys a config leaves out.

use serde::{Deserialize, Serialize};

use super::{count_or, ModelConfig};

/// A Pixtral-HF vision tower (`PixtralVisionConfig`) as vLLM keeps it: the patch convolution
/// (no bias), `ln_pre` (RMSNorm), `num_layers` pre-norm blocks (RMSNorm, q/k/v/o without
/// biases, 2D rotary embedding on q and k, a gated SiLU MLP without biases), no final norm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PixtralShape {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    /// The checkpoint's layers (`num_hidden_layers`).
    pub num_layers: usize,
    /// The layers vLLM builds and runs: up to `vision_feature_layer` (mistral3.py 0.19
    /// `_get_num_hidden_layers`; -1, all of them, for the published checkpoints).
    pub layers_used: usize,
    pub num_heads: usize,
    pub num_channels: usize,
    /// The largest image side (`image_size`, 1540): the dummy image's.
    pub image_size: usize,
    pub patch_size: usize,
    pub rope_theta: f64,
}

impl PixtralShape {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Patches along one side of the largest image (110 for 1540 / 14): also the rotary
    /// table's side (`PixtralRotaryEmbedding`'s `max_patches_per_side`).
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches of the largest image: the tower's sequence for one dummy image (12100).
    pub fn num_patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }
}

/// What a `Mistral3ForConditionalGeneration` adds to its language model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mistral3Shape {
    pub vision: PixtralShape,
    /// Patches merged into one image token per side (`spatial_merge_size`, 2).
    pub spatial_merge_size: usize,
    /// `linear_1` and `linear_2` have biases (`multimodal_projector_bias`, false published).
    pub projector_bias: bool,
    /// The `[IMG]` token (`image_token_index`, 10).
    pub image_token_index: usize,
}

/// Where the tower's and projector's tensors sit in the checkpoint (the names the 2503 repo
/// publishes; vLLM's `hf_to_vllm_mapper` also takes transformers 4.52's `model.vision_tower.`,
/// and vramscope reads both, checkpoint_names.rs).
pub const TOWER: &str = "vision_tower";
pub const PROJECTOR: &str = "multi_modal_projector";

impl Mistral3Shape {
    /// Image tokens along one side of the largest image after the merge (55 for 1540 / 28):
    /// `PixtralHFEncoderInfo.get_patch_grid_length` with patch `patch_size ·
    /// spatial_merge_size` (pixtral.py 0.19 L958-972).
    pub fn tokens_per_side(&self) -> usize {
        self.vision.patches_per_side() / self.spatial_merge_size
    }

    /// Embeddings one image of the maximum size yields (`get_num_image_tokens`: `ncols ·
    /// nrows`, 3025).
    pub fn embeds_per_image(&self) -> usize {
        self.tokens_per_side() * self.tokens_per_side()
    }

    /// The image's placeholder in the prompt: each row of `[IMG]` tokens then `[IMG_BREAK]`,
    /// the last one `[IMG_END]` (`_get_prompt_updates`, mistral3.py 0.19 L283-300): `(ncols +
    /// 1) · nrows`, 3080.
    pub fn placeholder_tokens(&self) -> usize {
        (self.tokens_per_side() + 1) * self.tokens_per_side()
    }

    /// The vision tower's and projector's tensors as the checkpoint stores them.
    pub fn tensor_shapes(&self, text_hidden: usize) -> Vec<(String, Vec<usize>)> {
        let s = &self.vision;
        let (d, i) = (s.hidden_size, s.intermediate_size);
        let mut out = vec![
            (
                format!("{TOWER}.patch_conv.weight"),
                vec![d, s.num_channels, s.patch_size, s.patch_size],
            ),
            (format!("{TOWER}.ln_pre.weight"), vec![d]),
        ];
        for l in 0..s.num_layers {
            let p = format!("{TOWER}.transformer.layers.{l}");
            out.push((format!("{p}.attention_norm.weight"), vec![d]));
            for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                out.push((format!("{p}.attention.{n}.weight"), vec![d, d]));
            }
            out.push((format!("{p}.feed_forward.gate_proj.weight"), vec![i, d]));
            out.push((format!("{p}.feed_forward.up_proj.weight"), vec![i, d]));
            out.push((format!("{p}.feed_forward.down_proj.weight"), vec![d, i]));
            out.push((format!("{p}.ffn_norm.weight"), vec![d]));
        }
        let m2 = self.spatial_merge_size * self.spatial_merge_size;
        out.push((format!("{PROJECTOR}.norm.weight"), vec![d]));
        out.push((
            format!("{PROJECTOR}.patch_merger.merging_layer.weight"),
            vec![d, d * m2],
        ));
        out.push((format!("{PROJECTOR}.linear_1.weight"), vec![text_hidden, d]));
        if self.projector_bias {
            out.push((format!("{PROJECTOR}.linear_1.bias"), vec![text_hidden]));
        }
        out.push((
            format!("{PROJECTOR}.linear_2.weight"),
            vec![text_hidden, text_hidden],
        ));
        if self.projector_bias {
            out.push((format!("{PROJECTOR}.linear_2.bias"), vec![text_hidden]));
        }
        out
    }

    /// Parameters of the vision tower alone (403,305,472 for Mistral Small 3.1's).
    pub fn tower_param_count(&self) -> u64 {
        self.tensor_shapes(0)
            .iter()
            .filter(|(n, _)| n.starts_with(&format!("{TOWER}.")))
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }

    /// Parameters of the tower and the projector.
    pub fn param_count(&self, text_hidden: usize) -> u64 {
        self.tensor_shapes(text_hidden)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }

    /// Bytes of the rotary table vLLM keeps on the GPU beside the weights:
    /// `PixtralRotaryEmbedding`'s `inv_freq` buffer, f32 `[patches_per_side², head_dim]`
    /// (transformers modeling_pixtral.py; built in `PixtralHFVisionModel.__init__` under vLLM's
    /// device context, pixtral.py 0.19 L1241).
    pub fn rope_table_bytes(&self) -> u64 {
        (self.vision.num_patches() * self.vision.head_dim() * 4) as u64
    }
}

impl ModelConfig {
    /// A `Mistral3Config`: the language model from `text_config` (a mistral config), the
    /// Pixtral tower from `vision_config` and the projector's keys.
    pub(super) fn mistral3_from_hf_json(
        v: &serde_json::Value,
    ) -> std::result::Result<Self, String> {
        let Some(text @ serde_json::Value::Object(_)) = v.get("text_config") else {
            return Err(
                "model_type mistral3 needs a text_config object (its language model, mistral)"
                    .into(),
            );
        };
        let mut text = text.clone();
        match text.get("model_type").and_then(serde_json::Value::as_str) {
            None | Some("mistral") => {}
            Some(other) => {
                return Err(format!(
                    "text_config.model_type is '{other}', expected 'mistral' in a mistral3 config (ministral3 and other language models are not modelled)"
                ))
            }
        }
        text["model_type"] = "mistral".into();
        let mut cfg = Self::from_hf_json(&text).map_err(|e| format!("text_config: {e}"))?;
        let Some(vis @ serde_json::Value::Object(_)) = v.get("vision_config") else {
            return Err(
                "model_type mistral3 needs a vision_config object (its Pixtral vision tower)"
                    .into(),
            );
        };
        match vis.get("model_type").and_then(serde_json::Value::as_str) {
            None | Some("pixtral") => {}
            Some(other) => {
                return Err(format!(
                    "vision_config.model_type is '{other}', expected 'pixtral'"
                ))
            }
        }
        if let Some(a) = vis.get("hidden_act").filter(|a| !a.is_null()) {
            if a.as_str() != Some("silu") {
                return Err(format!(
                    "vision_config.hidden_act is {a}, expected \"silu\" (the gated MLP modelled)"
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
        let e =
            |r: std::result::Result<usize, String>| r.map_err(|e| format!("vision_config: {e}"));
        let num_layers = e(count_or(vis, "num_hidden_layers", 24, 1 << 8))?;
        let layers_used = match v.get("vision_feature_layer") {
            None | Some(serde_json::Value::Null) => num_layers,
            Some(x) => match x.as_i64() {
                // vision.py `get_layer_index`: a negative index counts from the end.
                Some(i) if i < 0 && (-i) as usize <= num_layers + 1 => {
                    (num_layers as i64 + i + 1) as usize
                }
                Some(i) if i > 0 && i as usize <= num_layers => i as usize,
                _ => {
                    return Err(format!(
                        "vision_feature_layer {x}: one layer index of the {num_layers} is modelled (several are not)"
                    ))
                }
            },
        };
        if layers_used == 0 {
            return Err("vision_feature_layer selects no layer of the vision tower".into());
        }
        let rope_theta = match vis
            .get("rope_theta")
            .or_else(|| vis.get("rope_parameters").and_then(|r| r.get("rope_theta")))
        {
            None | Some(serde_json::Value::Null) => 10000.0,
            Some(x) => x
                .as_f64()
                .filter(|t| *t > 1.0)
                .ok_or_else(|| format!("vision_config: rope_theta {x} is not above 1"))?,
        };
        let vision = PixtralShape {
            hidden_size: e(count_or(vis, "hidden_size", 1024, 1 << 16))?,
            intermediate_size: e(count_or(vis, "intermediate_size", 4096, 1 << 18))?,
            num_layers,
            layers_used,
            num_heads: e(count_or(vis, "num_attention_heads", 16, 1 << 8))?,
            num_channels: e(count_or(vis, "num_channels", 3, 4))?,
            image_size: e(count_or(vis, "image_size", 1024, 1 << 13))?,
            patch_size: e(count_or(vis, "patch_size", 16, 1 << 8))?,
            rope_theta,
        };
        if !vision.hidden_size.is_multiple_of(vision.num_heads)
            || !vision.head_dim().is_multiple_of(4)
        {
            return Err(format!(
                "vision_config: hidden_size {} over {} heads is not a head size divisible by 4 (the 2D rotary embedding's halves)",
                vision.hidden_size, vision.num_heads
            ));
        }
        if let Some(h) = vis.get("head_dim").and_then(serde_json::Value::as_u64) {
            if h as usize != vision.head_dim() {
                return Err(format!(
                    "vision_config.head_dim {h} is not hidden_size / num_attention_heads {} (vLLM's PixtralHFAttention takes the latter)",
                    vision.head_dim()
                ));
            }
        }
        let mm = Mistral3Shape {
            spatial_merge_size: count_or(v, "spatial_merge_size", 2, 16)?,
            projector_bias: match v.get("multimodal_projector_bias") {
                None | Some(serde_json::Value::Null) => true,
                Some(b) => b.as_bool().ok_or_else(|| {
                    format!("multimodal_projector_bias is {b}, expected a boolean")
                })?,
            },
            image_token_index: count_or(v, "image_token_index", 10, 1 << 24)?,
            vision,
        };
        let unit = mm.vision.patch_size * mm.spatial_merge_size;
        if !mm.vision.image_size.is_multiple_of(unit) {
            return Err(format!(
                "vision_config.image_size {} is not a multiple of patch_size × spatial_merge_size {unit} (the dummy image's resize is not modelled)",
                mm.vision.image_size
            ));
        }
        cfg.mistral3 = Some(mm);
        Ok(cfg)
    }

    /// The `Mistral3Config` of this shape (`to_hf_json`'s part).
    pub(super) fn mistral3_to_hf_json(
        &self,
        mm: &Mistral3Shape,
        torch_dtype: &str,
    ) -> serde_json::Value {
        let mut text = ModelConfig {
            mistral3: None,
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
            ..self.clone()
        }
        .to_hf_json(torch_dtype);
        text["model_type"] = "mistral".into();
        text["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        let v = &mm.vision;
        serde_json::json!({
            "architectures": ["Mistral3ForConditionalGeneration"],
            "model_type": "mistral3",
            "image_token_index": mm.image_token_index,
            "multimodal_projector_bias": mm.projector_bias,
            "projector_hidden_act": "gelu",
            "spatial_merge_size": mm.spatial_merge_size,
            "vision_feature_layer": -1 - (v.num_layers - v.layers_used) as i64,
            "text_config": text,
            "vision_config": {
                "model_type": "pixtral",
                "hidden_size": v.hidden_size,
                "intermediate_size": v.intermediate_size,
                "num_hidden_layers": v.num_layers,
                "num_attention_heads": v.num_heads,
                "head_dim": v.head_dim(),
                "num_channels": v.num_channels,
                "image_size": v.image_size,
                "patch_size": v.patch_size,
                "rope_theta": v.rope_theta,
                "hidden_act": "silu",
            },
            "torch_dtype": torch_dtype,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_config_reads_as_vllm_builds_it() {
        let c = crate::model::presets::preset("mistral-small-3.1-24b").unwrap();
        let mm = c.mistral3.as_ref().unwrap();
        assert_eq!(c.arch, "mistral");
        assert_eq!((c.hidden_size, c.num_layers, c.num_heads), (5120, 40, 32));
        assert_eq!((c.num_kv_heads, c.head_dim, c.vocab_size), (8, 128, 131072));
        assert_eq!(mm.vision.num_patches(), 12100);
        assert_eq!(mm.vision.layers_used, 24);
        assert_eq!(
            (mm.embeds_per_image(), mm.placeholder_tokens()),
            (3025, 3080)
        );
        // 24 layers of 16,779,264 + the convolution's 602,112 + ln_pre's 1024.
        assert_eq!(mm.tower_param_count(), 403_305_472);
        // norm 1024 + merging 4,194,304 + linear_1 5,242,880 + linear_2 26,214,400.
        assert_eq!(
            mm.param_count(c.hidden_size) - mm.tower_param_count(),
            35_652_608
        );
        assert_eq!(mm.rope_table_bytes(), 12100 * 64 * 4);
        // All of it: the language model's 23,572,403,200 (embeddings and lm_head untied)
        // and the tower and projector's 438,958,080; 48,022,722,560 bytes in bf16. The
        // published model.safetensors.index.json is not reachable from here, but the
        // published checkpoint's count is: keras-hub's preset metadata, counted from the
        // converted checkpoint (keras-team/keras-hub keras_hub/src/models/mistral3/
        // mistral3_presets.py: `"params": 24011361280` for 3.1 Base, 3.1 Instruct and 3.2
        // Instruct), every tensor bf16.
        assert_eq!(c.param_count(), 24_011_361_280);
        assert_eq!(
            c.param_count() - mm.param_count(c.hidden_size),
            23_572_403_200
        );
        // The config round-trips through to_hf_json.
        let back = ModelConfig::from_hf_json(&c.to_hf_json("bfloat16")).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn what_is_not_modelled_is_refused_by_name() {
        let base = crate::model::presets::mistral_small_31_json();
        let mut v = base.clone();
        v["vision_feature_layer"] = serde_json::json!([-1, -2]);
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("vision_feature_layer"), "{e}");
        let mut v = base.clone();
        v["text_config"]["model_type"] = "ministral3".into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("ministral3"), "{e}");
        let mut v = base.clone();
        v["vision_config"]["image_size"] = 1024.into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("image_size 1024"), "{e}");
        let mut v = base;
        v["vision_feature_layer"] = (-2).into();
        let c = ModelConfig::from_hf_json(&v).unwrap();
        assert_eq!(c.mistral3.unwrap().vision.layers_used, 23);
    }
}

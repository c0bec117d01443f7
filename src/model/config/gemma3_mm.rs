//! Gemma 3's multimodal checkpoint (`model_type` gemma3: `Gemma3ForConditionalGeneration`):
//! its `text_config` is the gemma3_text language model, its `vision_config` a SigLIP vision
//! tower, and `multi_modal_projector` pools and projects the tower's patches to the language
//! model's width. Read as vLLM's gemma3_mm.py and siglip.py build it (0.11.0, 0.15.0 and
//! 0.19.0 alike), with Hugging Face's defaults (`Gemma3Config`, `Gemma3TextConfig`,
//! `SiglipVisionConfig`) for the keys a config leaves out.

use serde::{Deserialize, Serialize};

use super::{count_or, float, ModelConfig};

/// A SigLIP vision tower (`SiglipVisionConfig`) as vLLM's `SiglipVisionModel` keeps it: the
/// patch embedding (`nn.Conv2d` with a bias), the learned position embedding (one row a
/// patch), `num_layers` pre-LayerNorm encoder layers (q/k/v and out projections with biases,
/// a gelu_pytorch_tanh MLP with biases) and `post_layernorm` (kept: Gemma 3 uses every layer,
/// siglip.py 0.11 L396-404); no pooling head (`vision_use_head: false`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiglipShape {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_channels: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub layer_norm_eps: f64,
}

impl SiglipShape {
    /// The tower's tensors under `prefix` as a checkpoint stores them: the embeddings, every
    /// encoder layer and `post_layernorm` (transformers' `SiglipVisionTransformer`, without
    /// the pooling head).
    pub fn tower_tensor_shapes(&self, prefix: &str) -> Vec<(String, Vec<usize>)> {
        let s = self;
        let (d, i) = (s.hidden_size, s.intermediate_size);
        let mut out = vec![
            (
                format!("{prefix}.embeddings.patch_embedding.weight"),
                vec![d, s.num_channels, s.patch_size, s.patch_size],
            ),
            (format!("{prefix}.embeddings.patch_embedding.bias"), vec![d]),
            (
                format!("{prefix}.embeddings.position_embedding.weight"),
                vec![s.num_patches(), d],
            ),
        ];
        for l in 0..s.num_layers {
            let p = format!("{prefix}.encoder.layers.{l}");
            for n in ["layer_norm1", "layer_norm2"] {
                out.push((format!("{p}.{n}.weight"), vec![d]));
                out.push((format!("{p}.{n}.bias"), vec![d]));
            }
            for n in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                out.push((format!("{p}.self_attn.{n}.weight"), vec![d, d]));
                out.push((format!("{p}.self_attn.{n}.bias"), vec![d]));
            }
            out.push((format!("{p}.mlp.fc1.weight"), vec![i, d]));
            out.push((format!("{p}.mlp.fc1.bias"), vec![i]));
            out.push((format!("{p}.mlp.fc2.weight"), vec![d, i]));
            out.push((format!("{p}.mlp.fc2.bias"), vec![d]));
        }
        out.push((format!("{prefix}.post_layernorm.weight"), vec![d]));
        out.push((format!("{prefix}.post_layernorm.bias"), vec![d]));
        out
    }

    /// Patches along one side of the image (64 for 896 / 14).
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches of one image: the encoder's sequence length (4096 for Gemma 3).
    pub fn num_patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// One patch flattened: `channels · patch²` (588).
    pub fn patch_dim(&self) -> usize {
        self.num_channels * self.patch_size * self.patch_size
    }
}

/// What a `Gemma3ForConditionalGeneration` adds to its language model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gemma3MmShape {
    pub vision: SiglipShape,
    /// Image tokens after the projector's average pool (`mm_tokens_per_image`, 256).
    pub mm_tokens_per_image: usize,
    /// The token the image's embeddings replace (`image_token_index`, 262144).
    pub image_token_index: usize,
}

/// Where the vision tower's and projector's tensors sit in the checkpoint (the names
/// google/gemma-3-*-it publish; vLLM's `hf_to_vllm_mapper` also takes transformers 4.52's
/// `model.vision_tower.` ones, gemma3_mm.py 0.11 L484-491; vramscope reads both,
/// checkpoint_names.rs).
pub const TOWER: &str = "vision_tower.vision_model";
pub const PROJECTOR: &str = "multi_modal_projector";

impl Gemma3MmShape {
    /// Tokens along one side of the pooled image (16).
    pub fn tokens_per_side(&self) -> usize {
        (self.mm_tokens_per_image as f64).sqrt() as usize
    }

    /// `nn.AvgPool2d`'s kernel and stride: patches per side over tokens per side (64 / 16 = 4,
    /// gemma3_mm.py 0.11 L434-438).
    pub fn pool_kernel(&self) -> usize {
        self.vision.patches_per_side() / self.tokens_per_side()
    }

    /// The vision tower's and projector's tensors as the checkpoint stores them.
    pub fn tensor_shapes(&self, text_hidden: usize) -> Vec<(String, Vec<usize>)> {
        let s = &self.vision;
        let d = s.hidden_size;
        let mut out = s.tower_tensor_shapes(TOWER);
        out.push((
            format!("{PROJECTOR}.mm_input_projection_weight"),
            vec![d, text_hidden],
        ));
        out.push((format!("{PROJECTOR}.mm_soft_emb_norm.weight"), vec![d]));
        out
    }

    /// Parameters of the vision tower alone (416,866,032 for Gemma 3's SigLIP).
    pub fn tower_param_count(&self) -> u64 {
        self.tensor_shapes(0)
            .iter()
            .filter(|(n, _)| n.starts_with(TOWER))
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
}

/// `Gemma3TextConfig`'s defaults (transformers 4.50+) for the keys google/gemma-3-4b-it's
/// sparse `text_config` leaves out; a key the config has is kept.
fn text_defaults() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        ("model_type", json!("gemma3_text")),
        ("vocab_size", json!(262208)),
        ("hidden_size", json!(2304)),
        ("intermediate_size", json!(9216)),
        ("num_hidden_layers", json!(26)),
        ("num_attention_heads", json!(8)),
        ("num_key_value_heads", json!(4)),
        ("head_dim", json!(256)),
        ("hidden_activation", json!("gelu_pytorch_tanh")),
        ("max_position_embeddings", json!(131072)),
        ("rms_norm_eps", json!(1e-6)),
        ("rope_theta", json!(1_000_000.0)),
        ("query_pre_attn_scalar", json!(256)),
        ("sliding_window", json!(4096)),
        ("rope_local_base_freq", json!(10000.0)),
    ]
}

impl ModelConfig {
    /// A `Gemma3Config`: the language model from `text_config` (a gemma3_text config, with
    /// `Gemma3TextConfig`'s defaults for what it leaves out), the SigLIP tower from
    /// `vision_config` (`SiglipVisionConfig`'s defaults) and the projector's keys.
    pub(super) fn gemma3_mm_from_hf_json(
        v: &serde_json::Value,
    ) -> std::result::Result<Self, String> {
        let text = match v.get("text_config") {
            Some(t @ serde_json::Value::Object(_)) => t,
            _ => return Err(
                "model_type gemma3 needs a text_config object (its language model, gemma3_text)"
                    .into(),
            ),
        };
        let mut text = text.clone();
        match text.get("model_type").and_then(serde_json::Value::as_str) {
            None | Some("gemma3_text") => {}
            Some(other) => {
                return Err(format!(
                    "text_config.model_type is '{other}', expected 'gemma3_text' in a gemma3 config"
                ))
            }
        }
        let obj = text.as_object_mut().expect("checked an object above");
        for (k, d) in text_defaults() {
            if obj.get(k).is_none_or(serde_json::Value::is_null) {
                obj.insert(k.into(), d);
            }
        }
        let mut cfg = Self::from_hf_json(&text).map_err(|e| format!("text_config: {e}"))?;
        let vis = match v.get("vision_config") {
            Some(x @ serde_json::Value::Object(_)) => x,
            _ => {
                return Err(
                    "model_type gemma3 needs a vision_config object (its SigLIP vision tower)"
                        .into(),
                )
            }
        };
        match vis.get("model_type").and_then(serde_json::Value::as_str) {
            None | Some("siglip_vision_model") => {}
            Some(other) => {
                return Err(format!(
                    "vision_config.model_type is '{other}', expected 'siglip_vision_model'"
                ))
            }
        }
        if vis
            .get("vision_use_head")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true)
        {
            return Err(
                "vision_config.vision_use_head must be false (Gemma 3's tower has no pooling head; vLLM's SiglipVisionModel would build one)"
                    .into(),
            );
        }
        if let Some(a) = vis.get("hidden_act").filter(|a| !a.is_null()) {
            if a.as_str() != Some("gelu_pytorch_tanh") {
                return Err(format!(
                    "vision_config.hidden_act is {a}, expected \"gelu_pytorch_tanh\" (the only one modelled)"
                ));
            }
        }
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
        if vision.patch_size > vision.image_size
            || !vision.image_size.is_multiple_of(vision.patch_size)
        {
            return Err(format!(
                "vision_config: image_size {} is not a multiple of patch_size {}",
                vision.image_size, vision.patch_size
            ));
        }
        let mm = Gemma3MmShape {
            vision,
            mm_tokens_per_image: count_or(v, "mm_tokens_per_image", 256, 1 << 16)?,
            image_token_index: count_or(v, "image_token_index", 262144, 1 << 24)?,
        };
        let side = mm.tokens_per_side();
        if side * side != mm.mm_tokens_per_image
            || !mm.vision.patches_per_side().is_multiple_of(side)
        {
            return Err(format!(
                "mm_tokens_per_image {} must be a square whose side divides the {} patches per side",
                mm.mm_tokens_per_image,
                mm.vision.patches_per_side()
            ));
        }
        cfg.gemma3_mm = Some(mm);
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// google/gemma-3-4b-it's config.json as published (its sparse text_config).
    pub(crate) fn gemma3_4b_it() -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
            "mm_tokens_per_image": 256,
            "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                "model_type": "gemma3_text", "num_hidden_layers": 34,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
            "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                "model_type": "siglip_vision_model", "num_attention_heads": 16,
                "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false},
            "torch_dtype": "bfloat16"
        })
    }

    #[test]
    fn the_sparse_text_config_takes_gemma3_text_defaults() {
        let c = ModelConfig::from_hf_json(&gemma3_4b_it()).unwrap();
        assert_eq!(c.arch, "gemma3_text");
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (8, 4, 256));
        assert_eq!(c.vocab_size, 262208);
        let mm = c.gemma3_mm.as_ref().unwrap();
        assert_eq!(mm.vision.num_patches(), 4096);
        assert_eq!(mm.pool_kernel(), 4);
        // transformers' SiglipVisionModel of google/gemma-3-4b-it: 416,866,032 parameters.
        assert_eq!(mm.tower_param_count(), 416_866_032);
    }

    #[test]
    fn a_vision_config_with_a_head_or_another_activation_is_refused() {
        let mut v = gemma3_4b_it();
        v["vision_config"]["vision_use_head"] = true.into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("vision_use_head"), "{e}");
        let mut v = gemma3_4b_it();
        v["vision_config"]["hidden_act"] = "gelu".into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("gelu_pytorch_tanh"), "{e}");
        let mut v = gemma3_4b_it();
        v["vision_config"] = serde_json::Value::Null;
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("vision_config"), "{e}");
    }
}

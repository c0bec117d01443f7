//! Llama 4's shape (`model_type` llama4_text: `Llama4ForCausalLM`; llama4: the language model
//! of `Llama4ForConditionalGeneration`, read from its `text_config` as vLLM's mllama4.py does,
//! 0.19 L772-778 `with_hf_config(config.text_config, ...)`), with Hugging Face's defaults
//! (`Llama4TextConfig`, configuration_llama4.py at transformers 5.25) for the keys a config
//! leaves out. vLLM's llama4.py reads the same keys (0.11.0 and 0.19.0 `Llama4Attention`,
//! `Llama4DecoderLayer`, `Llama4MoE`).

use serde::{Deserialize, Serialize};

use super::{boolean, count_or, float, json_as, ModelConfig, MoeShape};

/// What a Llama 4 decoder has beyond the Llama fields. `ModelConfig::intermediate_size` is
/// the dense layers' MLP width (`intermediate_size_mlp`); `MoeShape::expert_intermediate_size`
/// each expert's and the shared expert's (`intermediate_size`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Llama4Shape {
    /// Per layer, whether it turns q and k by RoPE (`no_rope_layers[l] == 1`: the list names
    /// the layers that are *not* NoPE). A NoPE layer is global: full causal attention, no
    /// q/k norm, temperature tuning (llama4.py 0.19 L187-190, L270-276).
    pub rope_layers: Vec<bool>,
    /// RoPE layers attend within chunks of this many positions (`ChunkedLocalAttention`,
    /// llama4.py 0.19 L272-287); `None`: every layer full.
    pub attention_chunk_size: Option<usize>,
    /// `use_qk_norm`: the weightless RMS ("L2") norm over each head of q and k, RoPE layers
    /// only (llama4.py 0.19 L190, L206-215; Scout has it, Maverick not).
    pub use_qk_norm: bool,
    /// `attn_temperature_tuning` on NoPE layers: q times
    /// `log(floor((p + 1) / floor_scale) + 1) · attn_scale + 1`. Transformers reads it from the config (Scout's says 4, truthy);
    /// vLLM overrides it from generation_config.json or `max_model_len > 32768`
    /// (llama4.py 0.19 L715-721): this is the config's value.
    pub attn_temperature_tuning: bool,
    pub floor_scale: f64,
    pub attn_scale: f64,
    /// Llama 3's frequency-dependent `rope_scaling` (Scout: factor 8, low 1, high 4 over 8192
    /// positions); `None`: the plain rotary embedding (Maverick).
    pub rope_llama3: Option<Llama3Rope>,
    /// The vision tower of a `Llama4ForConditionalGeneration` checkpoint (its tensors then
    /// live under `language_model.`): counted, not run. `None` for `Llama4ForCausalLM`.
    pub vision: Option<VisionTower>,
}

/// `rope_scaling: {"rope_type": "llama3", ...}` (vLLM's `Llama3RotaryEmbedding`,
/// rotary_embedding/llama3_rope.py 0.19 L10-55: the cache keeps `max_position` rows).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

impl Llama3Rope {
    /// `_compute_inv_freq` (llama3_rope.py 0.19 L33-54): wavelengths shorter than
    /// `orig / high` kept, longer than `orig / low` divided by `factor`, smoothed between.
    pub fn scale_inv_freq(&self, inv_freq: f64) -> f64 {
        let orig = self.original_max_position_embeddings as f64;
        let (low_wl, high_wl) = (orig / self.low_freq_factor, orig / self.high_freq_factor);
        let wave_len = 2.0 * std::f64::consts::PI / inv_freq;
        if wave_len < high_wl {
            inv_freq
        } else if wave_len > low_wl {
            inv_freq / self.factor
        } else {
            let smooth = if self.low_freq_factor != self.high_freq_factor {
                (orig / wave_len - self.low_freq_factor)
                    / (self.high_freq_factor - self.low_freq_factor)
            } else {
                0.0
            };
            (1.0 - smooth) * inv_freq / self.factor + smooth * inv_freq
        }
    }
}

/// `vision_config` of a `Llama4ForConditionalGeneration` (`Llama4VisionConfig`), as vLLM
/// 0.19's mllama4.py builds and runs it: `Llama4VisionModel` (L460-544: the unfold patch
/// embedding, the class and positional embeddings, `layernorm_pre`, the encoder,
/// `layernorm_post`, the class token dropped, `vision_adapter`), `Llama4VisionEncoderLayer`
/// (L334-381), `Llama4VisionAttention` with its 2D rotary (L233-331), the pixel shuffle and
/// `Llama4VisionPixelShuffleMLP` (L180-230) and `Llama4MultiModalProjector` (L158-177).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VisionTower {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub num_channels: usize,
    /// The rotary's base (`rope_theta`, 10000 in transformers' `Llama4VisionConfig`).
    pub rope_theta: f64,
    /// `pixel_shuffle_ratio` (0.5: 2 × 2 patches merged into one token of 4× the width).
    pub pixel_shuffle_ratio: f64,
    pub vision_output_dim: usize,
    pub projector_input_dim: usize,
    pub projector_output_dim: usize,
    /// Always false here: transformers' `Llama4VisionMLP2` has no biases, and vLLM would
    /// build them from this key (mllama4.py 0.19 L218-226), so true is refused at parse.
    pub multi_modal_projector_bias: bool,
}

/// Where the tower's and the projector's tensors sit in the checkpoint
/// (`Llama4ForConditionalGeneration`'s `vision_model` and `multi_modal_projector`,
/// mllama4.py 0.19 L758-770).
pub const TOWER: &str = "vision_model";
pub const PROJECTOR: &str = "multi_modal_projector";

/// `max_patches` of `Llama4ImageProcessorFast` (its default, and Scout's and Maverick's
/// preprocessor_config.json): the most tiles an image is cut into besides the global one.
pub const MAX_TILES: usize = 16;

/// Every LayerNorm of the tower: `nn.LayerNorm(hidden)`'s default in the encoder layers
/// (mllama4.py 0.19 L361-362) and `eps=1e-5` given for the pre and post norms (L489-490).
pub const LAYER_NORM_EPS: f64 = 1e-5;

impl VisionTower {
    /// Patches a side of a tile (`image_size // patch_size`).
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches a tile (without the class token).
    pub fn num_patches(&self) -> usize {
        self.patches_per_side().pow(2)
    }

    /// The encoder's sequence a tile: the patches and the class token (mllama4.py 0.19 L474).
    pub fn seq_len(&self) -> usize {
        self.num_patches() + 1
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Patches merged a side by the pixel shuffle (`1 / pixel_shuffle_ratio`, 2).
    pub fn shuffle_factor(&self) -> usize {
        (1.0 / self.pixel_shuffle_ratio).round() as usize
    }

    /// Tokens one tile gives the language model: `get_patch_per_chunk` (mllama4.py 0.19
    /// L561-572), `(image_size // patch_size)² // round(1 / ratio²)` (144 for Scout).
    pub fn tokens_per_tile(&self) -> usize {
        self.num_patches() / self.shuffle_factor().pow(2)
    }

    /// The dummy image of V1's encoder profile: `get_image_size_with_most_features`
    /// (mllama4.py 0.19 L574-582), `max_patches` tiles high and one wide (16 × 1 with the
    /// image processor's default `max_patches` 16, `Llama4ImageProcessorFast`), cut into its
    /// tiles and the global one (`patches_per_image`, L631-633): 17 tiles.
    pub fn dummy_tiles(&self) -> usize {
        1 + MAX_TILES
    }

    /// `(embeddings, placeholder tokens)` of the dummy image: 144 `<|patch|>` embeddings a tile
    /// (2448), and `_prompt_split_image` of the 16 × 1 grid (transformers' processing_llama4):
    /// `<|image_start|>`, each row's tile of patches closed by `<|tile_y_separator|>`,
    /// `<|image|>`, the global tile's patches, `<|image_end|>` (2467 for Scout).
    pub fn dummy_image_tokens(&self) -> (usize, usize) {
        let t = self.tokens_per_tile();
        (self.dummy_tiles() * t, MAX_TILES * (t + 1) + 1 + t + 2)
    }

    /// The tower's and the projector's tensors as the checkpoint stores them
    /// (transformers' `Llama4VisionModel` and `Llama4MultiModalProjector` names): the unfold
    /// convolution's linear (no bias), the class and positional embeddings (`g² + 1` rows),
    /// the pre and post LayerNorms, per layer q/k/v/o with biases, fc1/fc2 with biases and two
    /// LayerNorms, the pixel-shuffle MLP (`intermediate_size → projector_input_dim →
    /// projector_output_dim`, no biases), and `multi_modal_projector.linear_1`
    /// (`vision_output_dim → text_hidden`, no bias).
    pub fn tensor_shapes(&self, text_hidden: usize) -> Vec<(String, Vec<usize>)> {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let patch_in = self.num_channels * self.patch_size * self.patch_size;
        let v = TOWER;
        let mut out = vec![
            (
                format!("{v}.patch_embedding.linear.weight"),
                vec![h, patch_in],
            ),
            (format!("{v}.class_embedding"), vec![h]),
            (
                format!("{v}.positional_embedding_vlm"),
                vec![self.seq_len(), h],
            ),
            (format!("{v}.layernorm_pre.weight"), vec![h]),
            (format!("{v}.layernorm_pre.bias"), vec![h]),
            (format!("{v}.layernorm_post.weight"), vec![h]),
            (format!("{v}.layernorm_post.bias"), vec![h]),
        ];
        for l in 0..self.num_hidden_layers {
            let p = format!("{v}.model.layers.{l}");
            for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                out.push((format!("{p}.self_attn.{n}.weight"), vec![h, h]));
                out.push((format!("{p}.self_attn.{n}.bias"), vec![h]));
            }
            out.push((format!("{p}.mlp.fc1.weight"), vec![i, h]));
            out.push((format!("{p}.mlp.fc1.bias"), vec![i]));
            out.push((format!("{p}.mlp.fc2.weight"), vec![h, i]));
            out.push((format!("{p}.mlp.fc2.bias"), vec![h]));
            for n in ["input_layernorm", "post_attention_layernorm"] {
                out.push((format!("{p}.{n}.weight"), vec![h]));
                out.push((format!("{p}.{n}.bias"), vec![h]));
            }
        }
        let (pi, po) = (self.projector_input_dim, self.projector_output_dim);
        out.push((format!("{v}.vision_adapter.mlp.fc1.weight"), vec![pi, i]));
        out.push((format!("{v}.vision_adapter.mlp.fc2.weight"), vec![po, po]));
        out.push((
            format!("{PROJECTOR}.linear_1.weight"),
            vec![text_hidden, self.vision_output_dim],
        ));
        out
    }

    /// Parameters the checkpoint stores for the vision model and the projector.
    pub fn param_count(&self, text_hidden: usize) -> u64 {
        self.tensor_shapes(text_hidden)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }
}

impl Llama4Shape {
    /// Whether layer `l` turns q and k (a local, chunked layer when a chunk size is set).
    pub fn uses_rope(&self, l: usize) -> bool {
        self.rope_layers.get(l).copied().unwrap_or(true)
    }

    /// The chunk layer `l` attends within: RoPE layers only (llama4.py 0.19 L272).
    pub fn chunk(&self, l: usize) -> Option<usize> {
        self.attention_chunk_size.filter(|_| self.uses_rope(l))
    }

    /// Where the language model's tensors sit in the checkpoint: `language_model.` in a
    /// `Llama4ForConditionalGeneration`'s (mllama4.py 0.19 L940-977), nothing in a
    /// `Llama4ForCausalLM`'s.
    pub fn prefix(&self) -> &'static str {
        if self.vision.is_some() {
            "language_model."
        } else {
            ""
        }
    }
}

/// A required count.
fn count(v: &serde_json::Value, k: &str, limit: u64) -> std::result::Result<usize, String> {
    if v[k].is_null() {
        return Err(format!("'{k}' is missing"));
    }
    count_or(v, k, 0, limit)
}

impl ModelConfig {
    /// A `Llama4TextConfig` (model_type llama4_text), or a `Llama4Config` (model_type llama4)
    /// whose `text_config` is its language model and whose `vision_config` its vision tower.
    pub(super) fn llama4_from_hf_json(
        top: &serde_json::Value,
        arch: String,
    ) -> std::result::Result<Self, String> {
        let (v, vision) = if arch == "llama4" {
            let t = &top["text_config"];
            if !t.is_object() {
                return Err(
                    "model_type llama4 (Llama4ForConditionalGeneration) needs a text_config object: its language model".into(),
                );
            }
            (t, Some(vision_from_hf_json(&top["vision_config"])?))
        } else {
            (top, None)
        };
        let hidden_size = count(v, "hidden_size", 1 << 17)?;
        let num_layers = count(v, "num_hidden_layers", 1 << 10)?;
        let num_heads = count_or(v, "num_attention_heads", 40, 1 << 10)?;
        let num_kv_heads = count_or(v, "num_key_value_heads", num_heads, 1 << 10)?;
        let head_dim = count_or(v, "head_dim", hidden_size / num_heads, 1 << 12)?;
        if num_heads % num_kv_heads != 0 || head_dim % 2 != 0 {
            return Err(format!(
                "num_attention_heads {num_heads}, num_key_value_heads {num_kv_heads} and head_dim {head_dim}: heads must be a multiple of KV heads and head_dim even"
            ));
        }
        let expert_width = count_or(v, "intermediate_size", 8192, 1 << 19)?;
        let dense_width = count_or(v, "intermediate_size_mlp", 16384, 1 << 19)?;
        let num_experts = count_or(v, "num_local_experts", 16, 1 << 12)?;
        let top_k = count_or(v, "num_experts_per_tok", 1, 1 << 12)?;
        if top_k != 1 {
            // `apply_router_weight_on_input` (llama4.py 0.19 L139) asserts one expert a token
            // in vLLM's fused MoE.
            return Err(format!(
                "num_experts_per_tok {top_k}: vLLM's Llama 4 MoE scales each token's input by its router weight, which it allows for one expert a token only"
            ));
        }
        let step = count_or(v, "interleave_moe_layer_step", 1, 1 << 10)?;
        // transformers builds `moe_layers` from the step when absent; vLLM reads only the
        // step (llama4.py 0.19 L325-328), so a list that disagrees would run differently.
        if let Some(list) = v.get("moe_layers").filter(|x| !x.is_null()) {
            let want: Vec<u64> = (0..num_layers as u64)
                .filter(|l| (l + 1) % step as u64 == 0)
                .collect();
            let got: Option<Vec<u64>> = list
                .as_array()
                .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect());
            if got.as_ref() != Some(&want) {
                return Err(format!(
                    "moe_layers {list} differs from every {step}th layer (interleave_moe_layer_step), which is what vLLM's llama4.py builds"
                ));
            }
        }
        let interval = count_or(v, "no_rope_layer_interval", 4, 1 << 10)?;
        let rope_layers = match v
            .get("no_rope_layers")
            .filter(|x| !x.is_null() && x.as_array().is_none_or(|a| !a.is_empty()))
        {
            None => (0..num_layers).map(|l| (l + 1) % interval != 0).collect(),
            Some(list) => {
                let a = list.as_array().ok_or_else(|| {
                    format!("'no_rope_layers' is {list}, expected a list of 0 and 1")
                })?;
                if a.len() < num_layers {
                    return Err(format!(
                        "no_rope_layers has {} entries for {num_layers} layers",
                        a.len()
                    ));
                }
                a.iter()
                    .take(num_layers)
                    .map(|x| match x.as_u64() {
                        Some(0) => Ok(false),
                        Some(1) => Ok(true),
                        _ => Err(format!("no_rope_layers holds {x}, expected 0 or 1")),
                    })
                    .collect::<std::result::Result<Vec<bool>, String>>()?
            }
        };
        let attention_chunk_size = match v.get("attention_chunk_size") {
            Some(serde_json::Value::Null) => None,
            None => Some(8192),
            Some(_) => Some(count(v, "attention_chunk_size", 1 << 24)?),
        };
        // Scout's config says `"attn_temperature_tuning": 4`: transformers tests its truth.
        let attn_temperature_tuning = match v.get("attn_temperature_tuning") {
            None | Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(x) => {
                json_as(
                    "attn_temperature_tuning",
                    x,
                    serde_json::Value::as_f64,
                    "true, false or a number",
                )? != 0.0
            }
        };
        let rope_llama3 = llama3_from_hf_json(v)?;
        if boolean(v, "attention_bias", false)? {
            return Err(
                "attention_bias true is not supported for llama4 (vLLM's llama4.py builds q/k/v and o without bias)".into(),
            );
        }
        let act = super::text_or(v, "hidden_act", "silu")?;
        if act != "silu" {
            return Err(format!(
                "hidden_act '{act}': vLLM's llama4.py runs silu whatever the config says"
            ));
        }
        let llama4 = Llama4Shape {
            rope_layers,
            attention_chunk_size,
            use_qk_norm: boolean(v, "use_qk_norm", true)?,
            attn_temperature_tuning,
            floor_scale: float(v, "floor_scale", 8192.0, |x| x >= 1.0, "at least 1")?,
            attn_scale: float(
                v,
                "attn_scale",
                0.1,
                |x| (0.0..=1e3).contains(&x),
                "0 to 1000",
            )?,
            rope_llama3,
            vision,
        };
        Ok(ModelConfig {
            rope_scaling: None,
            hidden_size,
            intermediate_size: dense_width,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: count_or(v, "vocab_size", 202048, 1 << 23)?,
            rope_theta: float(
                v,
                "rope_theta",
                500000.0,
                |x| x > 1.0 && x <= 1e12,
                "above 1 and at most 1e12",
            )?,
            rms_norm_eps: float(
                v,
                "rms_norm_eps",
                1e-5,
                |x| x > 0.0 && x < 1.0,
                "above 0 and below 1",
            )?,
            tie_word_embeddings: boolean(v, "tie_word_embeddings", false)?,
            attention_bias: false,
            max_position_embeddings: count_or(
                v,
                "max_position_embeddings",
                131072,
                crate::base::limits::MAX_MODEL_LEN,
            )?,
            arch,
            opt: None,
            phi: None,
            gemma: None,
            gpt_oss: None,
            qwen3_next: None,
            gemma3_mm: None,
            mistral3: None,
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
            moe: Some(MoeShape {
                num_experts,
                top_k,
                expert_intermediate_size: expert_width,
                renormalize: false,
                decoder_sparse_step: step,
                mlp_only_layers: Vec::new(),
                shared_expert_intermediate_size: expert_width,
            }),
            granite: None,
            deepseek: None,
            llama4: Some(llama4),
        })
    }

    /// The language model's tensors as `Llama4ForCausalLM.state_dict()` names them (under
    /// `language_model.` in a multimodal checkpoint, the vision tower's and the projector's
    /// after them, `VisionTower::tensor_shapes`): q/k/v/o, the two norms, and per layer
    /// `feed_forward` either a dense MLP (`gate_proj`, `up_proj`, `down_proj` of
    /// `intermediate_size_mlp`) or the MoE: `router [E, H]`, the experts stored fused as
    /// `experts.gate_up_proj [E, H, 2I]` and `experts.down_proj [E, I, H]` (transposed to
    /// `FusedMoE`'s layout on load, llama4.py 0.19 L441-450), and the shared expert.
    pub(super) fn llama4_tensor_shapes(&self, s: &Llama4Shape) -> Vec<(String, Vec<usize>)> {
        let pre = s.prefix();
        let (h, q, kv, v) = (
            self.hidden_size,
            self.q_dim(),
            self.kv_dim(),
            self.vocab_size,
        );
        let mut out = vec![(format!("{pre}model.embed_tokens.weight"), vec![v, h])];
        for l in 0..self.num_layers {
            let p = format!("{pre}model.layers.{l}");
            out.push((format!("{p}.input_layernorm.weight"), vec![h]));
            out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
            out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
            out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
            out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            let f = format!("{p}.feed_forward");
            match self.moe.as_ref().filter(|_| self.is_moe_layer(l)) {
                Some(m) => {
                    let (e, i) = (m.num_experts, m.expert_intermediate_size);
                    out.push((format!("{f}.router.weight"), vec![e, h]));
                    out.push((format!("{f}.experts.gate_up_proj"), vec![e, h, 2 * i]));
                    out.push((format!("{f}.experts.down_proj"), vec![e, i, h]));
                    out.push((format!("{f}.shared_expert.gate_proj.weight"), vec![i, h]));
                    out.push((format!("{f}.shared_expert.up_proj.weight"), vec![i, h]));
                    out.push((format!("{f}.shared_expert.down_proj.weight"), vec![h, i]));
                }
                None => {
                    let i = self.intermediate_size;
                    out.push((format!("{f}.gate_proj.weight"), vec![i, h]));
                    out.push((format!("{f}.up_proj.weight"), vec![i, h]));
                    out.push((format!("{f}.down_proj.weight"), vec![h, i]));
                }
            }
        }
        out.push((format!("{pre}model.norm.weight"), vec![h]));
        if !self.tie_word_embeddings {
            out.push((format!("{pre}lm_head.weight"), vec![v, h]));
        }
        if let Some(t) = &s.vision {
            out.extend(t.tensor_shapes(h));
        }
        out
    }

    /// The keys of a `Llama4TextConfig` (meta-llama/Llama-4-Scout-17B-16E's `text_config`),
    /// wrapped in a `Llama4Config` with its `vision_config` for model_type llama4.
    pub(super) fn llama4_to_hf_json(
        &self,
        s: &Llama4Shape,
        torch_dtype: &str,
    ) -> serde_json::Value {
        let m = self.moe.as_ref();
        let mut text = serde_json::json!({
            "architectures": ["Llama4ForCausalLM"],
            "model_type": "llama4_text",
            "hidden_size": self.hidden_size,
            "intermediate_size": m.map_or(self.intermediate_size, |m| m.expert_intermediate_size),
            "intermediate_size_mlp": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "num_local_experts": m.map_or(1, |m| m.num_experts),
            "num_experts_per_tok": m.map_or(1, |m| m.top_k),
            "interleave_moe_layer_step": m.map_or(1, |m| m.decoder_sparse_step),
            "no_rope_layers": s.rope_layers.iter().map(|&r| u8::from(r)).collect::<Vec<_>>(),
            "attention_chunk_size": s.attention_chunk_size,
            "use_qk_norm": s.use_qk_norm,
            "attn_temperature_tuning": s.attn_temperature_tuning,
            // `Llama4TextConfig.floor_scale` is an int in transformers (strict).
            "floor_scale": if s.floor_scale.fract() == 0.0 {
                serde_json::json!(s.floor_scale as u64)
            } else {
                serde_json::json!(s.floor_scale)
            },
            "attn_scale": s.attn_scale,
            "rope_theta": self.rope_theta,
            "rope_scaling": s.rope_llama3.map(|r| serde_json::json!({
                "rope_type": "llama3", "factor": r.factor,
                "low_freq_factor": r.low_freq_factor, "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position_embeddings,
            })),
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": false,
            "hidden_act": "silu",
            "torch_dtype": torch_dtype,
        });
        let Some(vt) = &s.vision else {
            return text;
        };
        let o = text.as_object_mut().expect("an object");
        o.remove("architectures");
        serde_json::json!({
            "architectures": ["Llama4ForConditionalGeneration"],
            "model_type": "llama4",
            "text_config": text,
            "vision_config": {
                "model_type": "llama4_vision_model",
                "hidden_size": vt.hidden_size,
                "intermediate_size": vt.intermediate_size,
                "num_hidden_layers": vt.num_hidden_layers,
                "num_attention_heads": vt.num_attention_heads,
                "rope_theta": vt.rope_theta,
                "pixel_shuffle_ratio": vt.pixel_shuffle_ratio,
                "image_size": vt.image_size,
                "patch_size": vt.patch_size,
                "num_channels": vt.num_channels,
                "vision_output_dim": vt.vision_output_dim,
                "projector_input_dim": vt.projector_input_dim,
                "projector_output_dim": vt.projector_output_dim,
                "multi_modal_projector_bias": vt.multi_modal_projector_bias,
            },
            "tie_word_embeddings": false,
            "torch_dtype": torch_dtype,
        })
    }
}

/// `rope_scaling` (or transformers 5's `rope_parameters`) of type llama3, or none.
fn llama3_from_hf_json(v: &serde_json::Value) -> std::result::Result<Option<Llama3Rope>, String> {
    let rs = match (&v["rope_scaling"], &v["rope_parameters"]) {
        (serde_json::Value::Null, serde_json::Value::Null) => return Ok(None),
        (serde_json::Value::Null, p) => p,
        (r, _) => r,
    };
    if !rs.is_object() {
        return Err(format!("rope_scaling is {rs}, expected an object or null"));
    }
    let kind = rs
        .get("rope_type")
        .or_else(|| rs.get("type"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok(None),
        "llama3" => Ok(Some(Llama3Rope {
            factor: float(rs, "factor", 8.0, |x| x >= 1.0, "at least 1")?,
            low_freq_factor: float(rs, "low_freq_factor", 1.0, |x| x > 0.0, "above 0")?,
            high_freq_factor: float(rs, "high_freq_factor", 4.0, |x| x > 0.0, "above 0")?,
            original_max_position_embeddings: count_or(
                rs,
                "original_max_position_embeddings",
                8192,
                crate::base::limits::MAX_MODEL_LEN,
            )?,
        })),
        other => Err(format!(
            "rope_scaling '{other}' is not supported for llama4 (expected llama3 or none)"
        )),
    }
}

/// `Llama4VisionConfig`'s keys with transformers' defaults (configuration_llama4.py 5.25:
/// hidden 768, 34 layers, 12 heads, intermediate 5632, image 448, patch 14, rope_theta 10000,
/// pixel_shuffle_ratio 0.5, output 7680, projector 4096 → 4096; Scout's and Maverick's
/// configs set hidden 1408, 16 heads, image 336, output 4096). What the two classes would run
/// differently, or not at all, is refused by name.
fn vision_from_hf_json(v: &serde_json::Value) -> std::result::Result<VisionTower, String> {
    if !v.is_object() {
        return Err("model_type llama4 needs a vision_config object (its vision tower)".into());
    }
    let e = |r: std::result::Result<usize, String>| r.map_err(|e| format!("vision_config: {e}"));
    let t = VisionTower {
        hidden_size: e(count_or(v, "hidden_size", 768, 1 << 17))?,
        intermediate_size: e(count_or(v, "intermediate_size", 5632, 1 << 19))?,
        num_hidden_layers: e(count_or(v, "num_hidden_layers", 34, 1 << 10))?,
        num_attention_heads: e(count_or(v, "num_attention_heads", 12, 1 << 10))?,
        image_size: e(count_or(v, "image_size", 448, 1 << 16))?,
        patch_size: e(count_or(v, "patch_size", 14, 1 << 10))?,
        num_channels: e(count_or(v, "num_channels", 3, 1 << 10))?,
        rope_theta: float(
            v,
            "rope_theta",
            10000.0,
            |x| x > 1.0 && x <= 1e12,
            "above 1",
        )
        .map_err(|e| format!("vision_config: {e}"))?,
        pixel_shuffle_ratio: float(
            v,
            "pixel_shuffle_ratio",
            0.5,
            |x| x > 0.0 && x <= 1.0,
            "above 0 and at most 1",
        )
        .map_err(|e| format!("vision_config: {e}"))?,
        vision_output_dim: e(count_or(v, "vision_output_dim", 7680, 1 << 17))?,
        projector_input_dim: e(count_or(v, "projector_input_dim", 4096, 1 << 17))?,
        projector_output_dim: e(count_or(v, "projector_output_dim", 4096, 1 << 17))?,
        multi_modal_projector_bias: boolean(v, "multi_modal_projector_bias", false)?,
    };
    let (h, heads) = (t.hidden_size, t.num_attention_heads);
    if heads == 0 || !h.is_multiple_of(heads) || !(h / heads).is_multiple_of(4) {
        return Err(format!(
            "vision_config: hidden_size {h} over num_attention_heads {heads} must give a head size that is a multiple of 4 (the 2D rotary turns a quarter of it by x and a quarter by y)"
        ));
    }
    if t.patch_size == 0 || !t.image_size.is_multiple_of(t.patch_size) {
        return Err(format!(
            "vision_config: image_size {} is not a multiple of patch_size {} (mllama4.py asserts it)",
            t.image_size, t.patch_size
        ));
    }
    let s = t.shuffle_factor();
    if (1.0 / s as f64 - t.pixel_shuffle_ratio).abs() > 1e-9
        || !t.patches_per_side().is_multiple_of(s)
        || t.intermediate_size != h * s * s
    {
        return Err(format!(
            "vision_config: pixel_shuffle_ratio {} over {} patches a side of width {h} must be 1/n of them and give intermediate_size {} (the pixel-shuffle MLP's input); it gives {}",
            t.pixel_shuffle_ratio,
            t.patches_per_side(),
            t.intermediate_size,
            h * s * s
        ));
    }
    if t.projector_input_dim != t.projector_output_dim
        || t.vision_output_dim != t.projector_output_dim
    {
        return Err(format!(
            "vision_config: projector_input_dim {}, projector_output_dim {} and vision_output_dim {} must agree (transformers' Llama4VisionMLP2 builds fc2 as output × output and the projector reads vision_output_dim)",
            t.projector_input_dim, t.projector_output_dim, t.vision_output_dim
        ));
    }
    if t.multi_modal_projector_bias {
        return Err(
            "vision_config: multi_modal_projector_bias true: vLLM 0.19 would build biases into the pixel-shuffle MLP (mllama4.py L218-226) that transformers' Llama4VisionMLP2 never saves; not modelled"
                .into(),
        );
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use crate::model::config::ModelConfig;

    fn scout_text() -> serde_json::Value {
        serde_json::json!({"model_type": "llama4_text", "hidden_size": 5120,
            "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_hidden_layers": 48,
            "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 202048, "num_local_experts": 16, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1, "attention_chunk_size": 8192,
            "attn_temperature_tuning": 4, "no_rope_layers": []})
    }

    /// Scout's text_config: every layer MoE, every 4th NoPE (the empty `no_rope_layers`
    /// falls back to the interval), chunks on the RoPE layers only, and the truthy 4 of
    /// `attn_temperature_tuning` read as on.
    #[test]
    fn scout_layers_are_moe_chunked_and_every_fourth_global() {
        let c = ModelConfig::from_hf_json(&scout_text()).unwrap();
        let l = c.llama4.as_ref().unwrap();
        assert!((0..48).all(|i| c.is_moe_layer(i)));
        let global: Vec<usize> = (0..48).filter(|&i| !l.uses_rope(i)).collect();
        assert_eq!(global, (3..48).step_by(4).collect::<Vec<_>>());
        assert_eq!((l.chunk(0), l.chunk(3)), (Some(8192), None));
        assert!(l.attn_temperature_tuning && l.use_qk_norm);
        assert_eq!(c.intermediate_size, 16384);
        assert_eq!(c.moe.as_ref().unwrap().expert_intermediate_size, 8192);
        // Written and read back the same.
        assert_eq!(
            ModelConfig::from_hf_json(&c.to_hf_json("bfloat16")).unwrap(),
            c
        );
    }

    /// A `Llama4ForConditionalGeneration` config runs its text_config; its language model's
    /// tensors live under `language_model.` and its vision tower is not among them.
    #[test]
    fn multimodal_checkpoint_names_sit_under_language_model() {
        let v = serde_json::json!({"model_type": "llama4", "text_config": scout_text(),
            "vision_config": {"hidden_size": 1408, "image_size": 336,
                "num_attention_heads": 16, "vision_output_dim": 4096}});
        let c = ModelConfig::from_hf_json(&v).unwrap();
        let names: Vec<String> = c.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], "language_model.model.embed_tokens.weight");
        // 48 layers of 12 tensors (6 of attention and norms, 6 of the MoE), the embedding, norm
        // and lm_head; then the tower's 7,
        // 34 layers of 16, the adapter's 2 and the projector's 1.
        let (text, tower) = names.split_at(3 + 48 * 12);
        assert!(text.iter().all(|n| n.starts_with("language_model.")));
        assert_eq!(tower.len(), 7 + 34 * 16 + 3);
        assert_eq!(tower[0], "vision_model.patch_embedding.linear.weight");
        assert_eq!(
            tower.last().unwrap(),
            "multi_modal_projector.linear_1.weight"
        );
        assert!(names.contains(
            &"language_model.model.layers.0.feed_forward.experts.gate_up_proj".to_string()
        ));
        let v = c.llama4.as_ref().unwrap().vision.as_ref().unwrap();
        assert_eq!(2 * v.param_count(c.hidden_size), 1_743_864_832);
        assert_eq!(
            ModelConfig::from_hf_json(&c.to_hf_json("bfloat16")).unwrap(),
            c
        );
    }

    /// What vLLM's llama4.py would run differently is refused, naming the key.
    #[test]
    fn settings_vllm_runs_otherwise_are_refused_by_name() {
        let with = |k: &str, x: serde_json::Value| {
            let mut v = scout_text();
            v[k] = x;
            ModelConfig::from_hf_json(&v).unwrap_err()
        };
        assert!(with("num_experts_per_tok", 2.into()).contains("num_experts_per_tok 2"));
        assert!(with("moe_layers", serde_json::json!([1, 3])).contains("moe_layers"));
        assert!(with("hidden_act", "gelu".into()).contains("hidden_act 'gelu'"));
        let e = with("rope_scaling", serde_json::json!({"rope_type": "yarn"}));
        assert!(e.contains("rope_scaling 'yarn'"), "{e}");
        let e =
            ModelConfig::from_hf_json(&serde_json::json!({"model_type": "llama4"})).unwrap_err();
        assert!(e.contains("text_config"), "{e}");
    }

    /// Llama 3's scaling keeps short wavelengths, divides long ones by the factor and
    /// blends between (llama3_rope.py 0.19 L33-54).
    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let r = super::Llama3Rope {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        assert_eq!(r.scale_inv_freq(1.0), 1.0);
        let low = 2.0 * std::f64::consts::PI / 10000.0;
        assert!((r.scale_inv_freq(low) - low / 8.0).abs() < 1e-15);
        // Wavelength 4096: smooth = (8192 / 4096 − 1) / 3 = 1/3.
        let mid = 2.0 * std::f64::consts::PI / 4096.0;
        let want = (2.0 / 3.0) * mid / 8.0 + mid / 3.0;
        assert!((r.scale_inv_freq(mid) - want).abs() < 1e-15);
    }
}

//! Llama-family shapes: from a Hugging Face `config.json` (llama, mistral, qwen2, qwen3, phi3,
//! gemma2, gemma3_text; opt; phi) or a preset.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};
use crate::device::cpu::{AttnShape, ScoreMods};
use crate::model::models::registry::{self, Family, QkvBias};

pub mod gemma3_mm;
pub mod llama4;
pub mod mistral3;
pub use gemma3_mm::{Gemma3MmShape, SiglipShape};
pub use llama4::{Llama3Rope, Llama4Shape, VisionTower};
pub use mistral3::{Mistral3Shape, PixtralShape};
pub mod kimi_vl;
pub use kimi_vl::{KimiVlShape, MoonVitShape};
pub mod llava_next;
pub use llava_next::LlavaNextShape;
pub mod qwen2_5_vl;
pub use qwen2_5_vl::{ProfileItem, Qwen25VisionShape, Qwen25VlShape};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// `model_type` of the config ("llama", "mistral", "qwen2").
    pub arch: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2).
    pub attention_bias: bool,
    pub max_position_embeddings: usize,
    /// A Llama-family config's `rope_scaling` (linear, dynamic, yarn, llama3), as vLLM's
    /// `get_rope` builds it; `None`: the plain rotary embedding (and the families with their
    /// own: Gemma, DeepSeek, gpt-oss, Llama 4, Qwen3-Next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// OPT's extra shape (`model_type: "opt"`); `None` for the Llama family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opt: Option<OptShape>,
    /// Phi's extra shape (`model_type: "phi"`: phi-1_5, phi-2); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phi: Option<PhiShape>,
    /// Gemma 2 / Gemma 3's extra shape (`model_type: "gemma2"` or `"gemma3_text"`); `None`
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemma: Option<GemmaShape>,
    /// A mixture-of-experts decoder's extra shape (`model_type: "mixtral"`, `"qwen2_moe"` or
    /// `"qwen3_moe"`);
    /// `None` for a dense one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeShape>,
    /// Granite's multipliers (`model_type: "granite"`); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granite: Option<GraniteShape>,
    /// DeepSeek-V2/V3's and Kimi-K2's multi-head latent attention and MoE routing
    /// (`model_type: "deepseek_v2"`, `"deepseek_v3"`, `"kimi_k2"`); `None` otherwise. Their
    /// routed experts are `moe` too (its `mlp_only_layers` the dense first layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deepseek: Option<DeepseekShape>,
    /// gpt-oss's sliding layers, attention sinks, YaRN and clamped SwiGLU experts
    /// (`model_type: "gpt_oss"`, `config/gpt_oss.rs`); `None` otherwise. Its experts are `moe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpt_oss: Option<GptOssShape>,
    /// Llama 4's chunked and NoPE layers, interleaved MoE and vision tower
    /// (`model_type: "llama4_text"`, `"llama4"`); `None` otherwise. Its routed experts are
    /// `moe` too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama4: Option<Llama4Shape>,
    /// Qwen3-Next's hybrid layers (`model_type: "qwen3_next"`): Gated DeltaNet and gated
    /// full attention; `None` otherwise. Its experts are `moe` (with the shared expert).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qwen3_next: Option<Qwen3NextShape>,
    /// Gemma 3's vision tower and projector (`model_type: "gemma3"`,
    /// `Gemma3ForConditionalGeneration`, `config/gemma3_mm.rs`): the language model is the
    /// rest of this config (gemma3_text); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemma3_mm: Option<Gemma3MmShape>,
    /// Mistral 3's Pixtral vision tower and projector (`model_type: "mistral3"`,
    /// `Mistral3ForConditionalGeneration`, `config/mistral3.rs`): the language model is the
    /// rest of this config (mistral); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mistral3: Option<Mistral3Shape>,
    /// Qwen2.5-VL's vision tower and merger and its M-RoPE sections (`model_type:
    /// "qwen2_5_vl"`, `Qwen2_5_VLForConditionalGeneration`, `config/qwen2_5_vl.rs`): the
    /// language model is the rest of this config (qwen2); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qwen2_5_vl: Option<Qwen25VlShape>,
    /// LLaVA-NeXT's SigLIP tower, projector and newline (`model_type: "llava_next"`,
    /// `LlavaNextForConditionalGeneration`, `config/llava_next.rs`): the language model is
    /// the rest of this config (granite for granite-vision); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llava_next: Option<LlavaNextShape>,
    /// Kimi-VL's MoonViT tower and projector (`model_type: "kimi_vl"`,
    /// `KimiVLForConditionalGeneration`, `config/kimi_vl.rs`): the language model is the rest
    /// of this config (deepseek_v3); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kimi_vl: Option<KimiVlShape>,
}

mod gpt_oss;
pub use gpt_oss::GptOssShape;

/// What a DeepSeek-V2/V3 decoder has beyond the Llama fields (Hugging Face
/// `DeepseekV2Config` / `DeepseekV3Config`; vLLM's deepseek_v2.py reads the same keys, 0.19
/// L820-997 for the attention, L240-380 for the MoE; docs/reading/vllm-mla.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeepseekShape {
    /// The query's low-rank projection (`q_a_proj`, `q_a_layernorm`, `q_b_proj`); `None`:
    /// one `q_proj` (DeepSeek-V2-Lite).
    pub q_lora_rank: Option<usize>,
    /// The latent's width: what the cache holds per token and layer, with the rope key.
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// `rope_scaling` of type yarn (every published DeepSeek and Kimi); `None`: plain rotary.
    pub yarn: Option<YarnScaling>,
    /// Multi-token-prediction layers after `num_hidden_layers` in the checkpoint: vLLM's main
    /// model skips their weights (0.19 deepseek_v2.py L1468-1470) and gives them no KV cache.
    pub num_nextn_predict_layers: usize,
    /// `n_shared_experts`: a dense MLP of `n_shared_experts · moe_intermediate_size` every
    /// token of a MoE layer passes through, added to the routed experts' sum.
    pub n_shared_experts: usize,
    /// "greedy" (V2: top-k of the softmax), "group_limited_greedy" or "noaux_tc" (V3: sigmoid
    /// scores plus `e_score_correction_bias` choose, within the best `topk_group` groups).
    pub topk_method: String,
    /// "softmax" or "sigmoid".
    pub scoring_func: String,
    pub n_group: usize,
    pub topk_group: usize,
    /// The routed experts' output is multiplied by it before the shared experts' is added.
    pub routed_scaling_factor: f64,
    /// The dense MLP layers before the first MoE layer.
    pub first_k_dense_replace: usize,
}

/// A Llama-family `rope_scaling` as vLLM's `get_rope` reads it (rotary_embedding/__init__.py
/// at 0.19): the rotary frequencies, the cos/sin multiplier and the cache's length of each
/// type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// "linear", "dynamic", "yarn" or "llama3".
    pub rope_type: String,
    pub factor: f64,
    /// YaRN's and Llama 3's `original_max_position_embeddings`.
    pub original_max_position_embeddings: usize,
    /// Llama 3's band: wavelengths below `original / high_freq_factor` keep their frequency,
    /// those above `original / low_freq_factor` are divided by the factor.
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    /// YaRN's correction range (`beta_fast` 32, `beta_slow` 1 by default) and `attn_factor`
    /// (vLLM's key; 0 when `apply_yarn_scaling` is false: no multiplier at all).
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub attn_factor: f64,
    /// YaRN's `truncate` (the correction range's ends rounded to whole dimensions).
    #[serde(default = "yes")]
    pub truncate: bool,
}

fn yes() -> bool {
    true
}

impl RopeScaling {
    /// The rotary frequency of each pair of `rotary_dim` dimensions at `base`:
    /// - linear: the plain ones (positions are divided by the factor instead);
    /// - dynamic (`DynamicNTKScalingRotaryEmbedding`, dynamic_ntk_scaling_rope.py at 0.19): the
    ///   base raised to `base · (factor² − factor + 1)^(d / (d − 2))`, the cache's length being
    ///   `max_position · factor`;
    /// - yarn (`YaRNScalingRotaryEmbedding`, yarn_scaling_rope.py): the extrapolated frequency on
    ///   the fast dimensions, the interpolated one (`/ factor`) on the slow ones, a linear ramp
    ///   between the correction range's ends (`yarn_find_correction_range` over the original
    ///   length, floor and ceil);
    /// - llama3 (`Llama3RotaryEmbedding`, llama3_rope.py): wavelengths shorter than
    ///   `original / high_freq_factor` keep their frequency, longer than `original /
    ///   low_freq_factor` are divided by the factor, a smooth blend between.
    pub fn inv_freq(&self, rotary_dim: usize, base: f64) -> Vec<f64> {
        let d = rotary_dim as f64;
        let plain = |b: f64| -> Vec<f64> {
            (0..rotary_dim / 2)
                .map(|i| 1.0 / b.powf(2.0 * i as f64 / d))
                .collect()
        };
        match self.rope_type.as_str() {
            "dynamic" => {
                let f = self.factor;
                plain(base * (f * f - f + 1.0).powf(d / (d - 2.0)))
            }
            "yarn" => {
                let y = crate::engine::ops_mla::YarnRope {
                    rotary_dim,
                    base,
                    factor: self.factor,
                    original_max_position: self.original_max_position_embeddings,
                    beta_fast: self.beta_fast,
                    beta_slow: self.beta_slow,
                    mscale: self.mscale(),
                };
                y.inv_freq_with(self.truncate)
            }
            "llama3" => {
                let old = self.original_max_position_embeddings as f64;
                let (low, high) = (old / self.low_freq_factor, old / self.high_freq_factor);
                plain(base)
                    .into_iter()
                    .map(|f| {
                        let wave = 2.0 * std::f64::consts::PI / f;
                        if wave < high {
                            f
                        } else if wave > low {
                            f / self.factor
                        } else {
                            let smooth = (old / wave - self.low_freq_factor)
                                / (self.high_freq_factor - self.low_freq_factor);
                            (1.0 - smooth) * f / self.factor + smooth * f
                        }
                    })
                    .collect()
            }
            _ => plain(base),
        }
    }

    /// What cos and sin are multiplied by: YaRN's `yarn_get_mscale(factor) · attn_factor`
    /// (yarn_scaling_rope.py L40-44 at 0.19; 1 with `apply_yarn_scaling` false), 1 otherwise.
    pub fn mscale(&self) -> f64 {
        if self.rope_type == "yarn" && self.attn_factor == 0.0 {
            1.0
        } else if self.rope_type == "yarn" {
            YarnScaling::get_mscale(self.factor, 1.0) * self.attn_factor
        } else {
            1.0
        }
    }

    /// The linear factor positions are divided by (1 but for "linear").
    pub fn linear_factor(&self) -> f64 {
        if self.rope_type == "linear" {
            self.factor
        } else {
            1.0
        }
    }

    /// Rows of the `cos_sin_cache` for a model of `max_position` positions: `max_position ·
    /// factor` (linear, dynamic), `original · factor` (yarn), `max_position` (llama3).
    pub fn cache_rows(&self, max_position: usize) -> usize {
        match self.rope_type.as_str() {
            "yarn" => (self.original_max_position_embeddings as f64 * self.factor) as usize,
            "llama3" => max_position,
            _ => (max_position as f64 * self.factor) as usize,
        }
    }
}

/// A Llama-family config's `rope_scaling` (or transformers 5's `rope_parameters`, where
/// `rope_type` "default" is none): the types vLLM's `get_rope` builds for these models; any
/// other is refused by name.
fn rope_scaling_from_hf_json(
    v: &serde_json::Value,
    arch: &str,
    max_position: usize,
) -> std::result::Result<Option<RopeScaling>, String> {
    let rs = match (&v["rope_scaling"], &v["rope_parameters"]) {
        (r, _) if r.is_object() => r,
        (_, r) if r.is_object() => r,
        (r, p) if r.is_null() && p.is_null() => return Ok(None),
        (r, p) => {
            let bad = if r.is_null() { p } else { r };
            return Err(format!("rope_scaling is {bad}, expected an object or null"));
        }
    };
    let kind = rs
        .get("rope_type")
        .or_else(|| rs.get("type"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("default");
    if kind == "default" {
        return Ok(None);
    }
    if !matches!(kind, "linear" | "dynamic" | "yarn" | "llama3") {
        return Err(format!(
            "rope_scaling '{kind}' is not supported for {arch} yet (linear, dynamic, yarn and llama3 are)"
        ));
    }
    let num = |key: &str, default: Option<f64>| -> std::result::Result<f64, String> {
        match (rs.get(key).and_then(serde_json::Value::as_f64), default) {
            (Some(x), _) if x.is_finite() => Ok(x),
            (None, Some(d)) if rs.get(key).is_none_or(serde_json::Value::is_null) => Ok(d),
            _ => Err(format!(
                "rope_scaling '{kind}' needs a number '{key}' (it has {})",
                rs.get(key).map_or("none".into(), |x| x.to_string())
            )),
        }
    };
    let factor = num("factor", None)?;
    if !(1.0..=1024.0).contains(&factor) {
        return Err(format!(
            "rope_scaling factor {factor} is not from 1 to 1024"
        ));
    }
    let original = match kind {
        "yarn" | "llama3" => num(
            "original_max_position_embeddings",
            (kind == "yarn").then_some(max_position as f64),
        )?,
        _ => max_position as f64,
    };
    if !(1.0..=16_777_216.0).contains(&original) {
        return Err(format!(
            "rope_scaling original_max_position_embeddings {original} is not from 1 to 16777216"
        ));
    }
    let (low, high) = if kind == "llama3" {
        (
            num("low_freq_factor", None)?,
            num("high_freq_factor", None)?,
        )
    } else {
        (1.0, 4.0)
    };
    if kind == "llama3" && !(low > 0.0 && high > low) {
        return Err(format!(
            "rope_scaling llama3 needs 0 < low_freq_factor < high_freq_factor (it has {low} and {high})"
        ));
    }
    // YaRN's keys as vLLM's get_rope passes them on (rotary_embedding/__init__.py L233-273 at
    // 0.19): attn_factor, beta_fast, beta_slow, apply_yarn_scaling, truncate,
    // extrapolation_factor.
    let flag = |key: &str| {
        rs.get(key)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true)
    };
    if num("extrapolation_factor", Some(1.0))? != 1.0 {
        return Err(format!(
            "rope_scaling '{kind}' with extrapolation_factor {} is not supported yet (1 is)",
            num("extrapolation_factor", Some(1.0))?
        ));
    }
    let scaling = RopeScaling {
        rope_type: kind.into(),
        factor,
        original_max_position_embeddings: original as usize,
        low_freq_factor: low,
        high_freq_factor: high,
        beta_fast: num("beta_fast", Some(32.0))?,
        beta_slow: num("beta_slow", Some(1.0))?,
        attn_factor: if flag("apply_yarn_scaling") {
            num("attn_factor", Some(1.0))?
        } else {
            0.0
        },
        truncate: flag("truncate"),
    };
    if scaling.cache_rows(max_position) > crate::base::limits::MAX_TOKENS as usize {
        return Err(format!(
            "rope_scaling '{kind}' makes a rotary cache of {} positions, more than vramscope models ({})",
            scaling.cache_rows(max_position),
            crate::base::limits::MAX_TOKENS
        ));
    }
    Ok(Some(scaling))
}

/// DeepSeek's YaRN rotary scaling (`rope_scaling: {"type": "yarn", ...}`; vLLM's
/// `DeepseekScalingRotaryEmbedding`, rotary_embedding/deepseek_scaling_rope.py at 0.19).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct YarnScaling {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: f64,
    pub mscale_all_dim: f64,
}

impl YarnScaling {
    /// `yarn_get_mscale(scale, mscale)`: `0.1 · mscale · ln(scale) + 1` above scale 1.
    pub fn get_mscale(scale: f64, mscale: f64) -> f64 {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * mscale * scale.ln() + 1.0
        }
    }

    /// The cos/sin multiplier: `get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)`
    /// (deepseek_scaling_rope.py L55-59 at 0.19; `attn_factor` 1).
    pub fn cos_sin_mscale(&self) -> f64 {
        Self::get_mscale(self.factor, self.mscale)
            / Self::get_mscale(self.factor, self.mscale_all_dim)
    }
}

impl DeepseekShape {
    /// Each head's query and key width: the part without rotary, then the rotary part.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// What the latent cache holds per token and layer: `kv_lora_rank + qk_rope_head_dim`
    /// values, one "head" with no separate V (`MLAAttentionSpec`, 0.19
    /// v1/kv_cache_interface.py L191-206; 576 for every published model).
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// The softmax scale MLA runs with: `qk_head_dim^-0.5 · m²`, `m` YaRN's
    /// `get_mscale(factor, mscale_all_dim)` (0.19 deepseek_v2.py L936-939).
    pub fn softmax_scale(&self) -> f64 {
        let m = self
            .yarn
            .as_ref()
            .map_or(1.0, |y| YarnScaling::get_mscale(y.factor, y.mscale_all_dim));
        (self.qk_head_dim() as f64).powf(-0.5) * m * m
    }
}

/// What a Granite decoder has beyond the Llama fields (Hugging Face `GraniteConfig`; vLLM's
/// granite.py reads the same keys, 0.19 L141, L199, L307, L425-431).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraniteShape {
    /// The embedding is multiplied by it, in place.
    pub embedding_multiplier: f64,
    /// Each branch (attention, MLP) is multiplied by it before its residual add.
    pub residual_multiplier: f64,
    /// The attention's softmax scale, in place of `head_dim^-0.5`.
    pub attention_multiplier: f64,
    /// The logits are divided by it (`LogitsProcessor(scale=1/logits_scaling)`).
    pub logits_scaling: f64,
}

/// What the logits processor does to the logits beyond `lm_head`: Gemma 2's soft-cap, then
/// Granite's scale (vLLM's `LogitsProcessor._get_logits`, logits_processor.py L66-72 at 0.19).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LogitsMods {
    pub soft_cap: Option<f64>,
    /// `logits *= scale`, in place on the `[rows, vocab]` view.
    pub scale: Option<f64>,
}

/// What a mixture-of-experts decoder has beyond the Llama fields (Hugging Face
/// `MixtralConfig`, `Qwen3MoeConfig`; vLLM 0.8.5 model_executor/models/mixtral.py and
/// qwen3_moe.py read the same keys).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeShape {
    /// `num_local_experts` (Mixtral) or `num_experts` (Qwen3-MoE).
    pub num_experts: usize,
    /// `num_experts_per_tok`: the experts each token is routed to.
    pub top_k: usize,
    /// Each expert's MLP width: Mixtral's `intermediate_size`, Qwen3-MoE's
    /// `moe_intermediate_size` (its `intermediate_size` is the dense layers').
    pub expert_intermediate_size: usize,
    /// The top-k routing weights divided by their sum: always for Mixtral (`renormalize=True`,
    /// mixtral.py L93 at 0.8.5), `norm_topk_prob` for Qwen3-MoE (qwen3_moe.py L118).
    pub renormalize: bool,
    /// Layer `l` is a MoE layer when `(l + 1) % decoder_sparse_step == 0` and it is not in
    /// `mlp_only_layers` (qwen3_moe.py L271-286 at 0.8.5); every Mixtral layer is.
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    /// Qwen2-MoE's shared expert: a dense SwiGLU MLP of this width that every token passes
    /// through, scaled by `sigmoid(shared_expert_gate(x))` (`[1, H]`) and added to the
    /// experts' sum (qwen2_moe.py L126-160 at 0.8.5); 0 for none (Mixtral, Qwen3-MoE).
    #[serde(default)]
    pub shared_expert_intermediate_size: usize,
}

/// What a Gemma 2 or Gemma 3 decoder has beyond the Llama fields (Hugging Face
/// `Gemma2Config` / `Gemma3TextConfig`; vLLM 0.6.4 and 0.8.5 model_executor/models/gemma2.py,
/// 0.8.5 gemma3.py read the same keys).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmaShape {
    /// The attention scale is `query_pre_attn_scalar^-0.5`, not `head_dim^-0.5`
    /// (gemma2.py L120 at 0.6.4, gemma3.py L125 at 0.8.5).
    pub query_pre_attn_scalar: f64,
    /// `tanh(s / cap) · cap` on the attention scores (Gemma 2: 50; Gemma 3: none).
    pub attn_logit_softcapping: Option<f64>,
    /// `tanh(l / cap) · cap` on the logits (Gemma 2: 30; Gemma 3: none), vLLM's
    /// `LogitsProcessor(soft_cap=...)` (logits_processor.py L72-75 at 0.8.5).
    pub final_logit_softcapping: Option<f64>,
    /// Keys a sliding layer's query sees: itself and the `sliding_window − 1` before it.
    pub sliding_window: Option<usize>,
    /// Layer `l` is global when `(l + 1) % sliding_window_pattern == 0`, sliding otherwise:
    /// 2 for Gemma 2 (even layers slide; HF `Gemma2Attention`), 6 for Gemma 3 (gemma3.py
    /// L148-151 at 0.8.5).
    pub sliding_window_pattern: usize,
    /// Gemma 3's rotary base on sliding layers (`rope_local_base_freq`, with no scaling);
    /// `None` for Gemma 2, whose layers all use `rope_theta` (gemma3.py L153-162 at 0.8.5).
    pub rope_local_base_freq: Option<f64>,
    /// Gemma 3's `rope_scaling: {"rope_type": "linear", "factor": f}` on global layers.
    pub rope_linear_factor: Option<f64>,
}

impl GemmaShape {
    /// Whether layer `layer` uses sliding-window attention.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_window.is_some() && !(layer + 1).is_multiple_of(self.sliding_window_pattern)
    }
}

/// What an OPT decoder has beyond the Llama fields (Hugging Face `OPTConfig`; `ffn_dim` is
/// `intermediate_size`). vLLM's opt.py reads the same keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptShape {
    /// Pre-LN (125m, 1.3b, ...) when true; post-LN (350m) when false.
    pub do_layer_norm_before: bool,
    /// Width of the token embedding and the tied lm_head; `project_in`/`project_out` map it
    /// to and from `hidden_size` when they differ (opt-350m: 512 vs 1024).
    pub word_embed_proj_dim: usize,
    /// Linear layers carry biases.
    pub enable_bias: bool,
    /// `nn.LayerNorm`'s eps (OPT never changes PyTorch's default).
    pub layer_norm_eps: f64,
    /// `_remove_final_layer_norm` (only old OPT checkpoints set it).
    pub remove_final_layer_norm: bool,
}

/// What a Phi decoder (`PhiConfig`, configuration_phi.py at transformers 4.57.0) has beyond
/// the Llama fields; vLLM's phi.py reads the same keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhiShape {
    /// The share of each head the rotary embedding turns: `rotary_dim = int(head_size ·
    /// partial_rotary_factor)` (vLLM rotary_embedding/__init__.py L62-66 at 0.19).
    pub partial_rotary_factor: f64,
    /// Both `nn.LayerNorm`s' eps (phi.py L182-184, L225-227 at 0.19).
    pub layer_norm_eps: f64,
}

/// vLLM's `OPTLearnedPositionalEmbedding` offset (opt.py L48-58): the table has two rows more
/// than `max_position_embeddings` and position p reads row p + 2.
pub const OPT_POSITION_OFFSET: usize = 2;

impl OptShape {
    /// Whether the decoder ends with `final_layer_norm` (opt.py L211-216).
    pub fn has_final_norm(&self) -> bool {
        self.do_layer_norm_before && !self.remove_final_layer_norm
    }
}

impl ModelConfig {
    /// FLOPs of one forward pass over sequences of `seq_lens` tokens, as vLLM's profile run
    /// does it: the linear layers, causal attention, and the lm_head on each sequence's last
    /// token.
    pub fn forward_flops(&self, seq_lens: &[usize]) -> f64 {
        let t: f64 = seq_lens.iter().sum::<usize>() as f64;
        let (h, i, q, kv) = (
            self.hidden_size as f64,
            self.intermediate_size as f64,
            self.q_dim() as f64,
            self.kv_dim() as f64,
        );
        let attn = h * q + 2.0 * h * kv + q * h;
        // A MoE layer: the router, then `top_k` experts per token.
        let mlp: f64 = (0..self.num_layers)
            .map(|l| match &self.moe {
                Some(m) if self.is_moe_layer(l) => {
                    h * m.num_experts as f64
                        + m.top_k as f64 * 3.0 * h * m.expert_intermediate_size as f64
                }
                _ => 3.0 * h * i,
            })
            .sum();
        2.0 * t * (self.num_layers as f64 * attn + mlp)
            + self.attention_flops(seq_lens)
            + 2.0 * seq_lens.len() as f64 * h * self.vocab_size as f64
    }

    /// The causal attention's share of `forward_flops` (QKᵀ and PV over the lower triangle).
    pub fn attention_flops(&self, seq_lens: &[usize]) -> f64 {
        let causal_pairs: f64 = seq_lens
            .iter()
            .map(|&n| n as f64 * (n as f64 + 1.0) / 2.0)
            .sum();
        self.num_layers as f64
            * 2.0
            * 2.0
            * self.num_heads as f64
            * self.head_dim as f64
            * causal_pairs
    }

    /// Whether decoder layer `layer` routes its tokens to experts.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| {
            (layer + 1).is_multiple_of(m.decoder_sparse_step) && !m.mlp_only_layers.contains(&layer)
        })
    }

    /// Weights each token multiplies with: every dense parameter, and of each MoE layer the
    /// router and `top_k` of its experts (the "A3B" of Qwen3-30B-A3B).
    pub fn active_param_count(&self) -> u64 {
        let Some(m) = &self.moe else {
            return self.param_count();
        };
        // The shared expert and its gate are dense: counted in full, as the router is.
        let per_expert = 3 * (self.hidden_size * m.expert_intermediate_size) as u64;
        let moe_layers = (0..self.num_layers)
            .filter(|&l| self.is_moe_layer(l))
            .count() as u64;
        self.param_count() - moe_layers * (m.num_experts - m.top_k) as u64 * per_expert
    }

    /// Bytes of the experts' weights at `bytes_per_param` (all experts of every MoE layer).
    pub fn expert_param_count(&self) -> u64 {
        let Some(m) = &self.moe else { return 0 };
        let moe_layers = (0..self.num_layers)
            .filter(|&l| self.is_moe_layer(l))
            .count() as u64;
        moe_layers
            * m.num_experts as u64
            * 3
            * (self.hidden_size * m.expert_intermediate_size) as u64
    }

    /// The attention heads' shape, as the engine's attention and rotary ops take it.
    pub fn attn_shape(&self) -> AttnShape {
        AttnShape {
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            mods: ScoreMods::default(),
        }
    }

    /// The head dimensions the rotary embedding turns (the first ones of each head), and the
    /// width of its `cos_sin_cache`: all of them but for Phi's partial rotary.
    pub fn rotary_dim(&self) -> usize {
        match (&self.phi, &self.qwen3_next) {
            (Some(p), _) => (self.head_dim as f64 * p.partial_rotary_factor) as usize,
            (None, Some(q)) => (self.head_dim as f64 * q.partial_rotary_factor) as usize,
            (None, None) => self.head_dim,
        }
    }

    /// The registry's entry for this `model_type`: its vLLM file, decoder and twists.
    pub fn family(&self) -> Option<&'static Family> {
        registry::family(&self.arch)
    }

    /// Qwen3's per-head RMSNorm of q and k before the rotary embedding (vLLM
    /// model_executor/models/qwen3.py `Qwen3Attention`: `q_norm`, `k_norm` of `head_dim`).
    pub fn qk_norm(&self) -> bool {
        self.family().is_some_and(|f| f.qk_norm)
    }

    /// Phi-3 (and Phi-4, a phi3 model) stores q/k/v as one `qkv_proj` and gate/up as one
    /// `gate_up_proj` in the checkpoint; vLLM's `Phi3ForCausalLM` is its `LlamaForCausalLM`
    /// with those names packed (model_executor/models/phi3.py, every release here).
    pub fn fused_checkpoint(&self) -> bool {
        self.family().is_some_and(|f| f.fused_checkpoint)
    }

    /// Gemma 2 or Gemma 3: GemmaRMSNorm (`x · (1 + w)`), four norms per layer, GeGLU, the
    /// embedding scaled by `√hidden` (vLLM gemma2.py, gemma3.py).
    pub fn is_gemma(&self) -> bool {
        self.gemma.is_some()
    }

    /// The attention math of layer `layer`: Gemma's scale, soft-cap and sliding window; the
    /// plain causal softmax for every other architecture.
    pub fn score_mods(&self, layer: usize) -> ScoreMods {
        match &self.gemma {
            None => ScoreMods {
                // Granite's `attention_multiplier` is the softmax scale (granite.py L141).
                scale: self.granite.as_ref().map(|g| g.attention_multiplier as f32),
                ..ScoreMods::default()
            },
            Some(g) => ScoreMods {
                scale: Some((g.query_pre_attn_scalar as f32).powf(-0.5)),
                softcap: g.attn_logit_softcapping.map(|c| c as f32),
                window: g.sliding_window.filter(|_| g.is_sliding(layer)),
            },
        }
    }

    /// The rotary base and linear scaling factor of layer `layer`: Gemma 3's sliding layers
    /// use `rope_local_base_freq` unscaled, its global ones `rope_theta` with the config's
    /// linear factor (gemma3.py L153-162 at 0.8.5); every other model `(rope_theta, 1)`.
    pub fn layer_rope(&self, layer: usize) -> (f64, f64) {
        match &self.gemma {
            Some(g) => match (g.rope_local_base_freq, g.is_sliding(layer)) {
                (Some(local), true) => (local, 1.0),
                _ => (self.rope_theta, g.rope_linear_factor.unwrap_or(1.0)),
            },
            None => (
                self.rope_theta,
                self.rope_scaling
                    .as_ref()
                    .map_or(1.0, RopeScaling::linear_factor),
            ),
        }
    }

    /// The longest context vLLM derives from this config (`_get_and_verify_max_len`, 0.19.0
    /// config/model.py L2098-2128, 0.11.0 config/model.py L1839-1864): `max_position_embeddings`
    /// times the rope scaling's factor, from YaRN's original length, but for "su", "longrope",
    /// "llama3" and Gemma 3 (whose length is already scaled). Returns it and the key vLLM
    /// names.
    pub fn derived_max_model_len(&self) -> u64 {
        let base = self.max_position_embeddings as f64;
        let len = match &self.rope_scaling {
            Some(r) if r.rope_type == "yarn" => {
                r.original_max_position_embeddings as f64 * r.factor
            }
            Some(r) if r.rope_type != "llama3" => base * r.factor,
            _ => base,
        };
        len as u64
    }

    /// Gemma's final logit soft-cap, if any.
    pub fn final_logit_softcap(&self) -> Option<f64> {
        self.gemma.as_ref().and_then(|g| g.final_logit_softcapping)
    }

    /// What vLLM's logits processor applies to this model's logits.
    pub fn logits_mods(&self) -> LogitsMods {
        LogitsMods {
            soft_cap: self.final_logit_softcap(),
            scale: self.granite.as_ref().map(|g| 1.0 / g.logits_scaling),
        }
    }

    /// Tensors the loader reads: one per stored tensor, and for a checkpoint-fused one each
    /// part (q, k, v; gate, up) read as its own rows.
    pub fn loader_reads(&self) -> usize {
        let extra = if self.fused_checkpoint() { 3 } else { 0 };
        self.tensor_shapes().len() + extra * self.num_layers
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Each decoder layer's linear layers as vLLM stacks them: the name, the output
    /// partitions (q, k, v; gate, up; or the one) and the inputs.
    pub fn decoder_linears(&self) -> Vec<(&'static str, Vec<usize>, usize)> {
        let (h, i, q, kv) = (
            self.hidden_size,
            self.intermediate_size,
            self.q_dim(),
            self.kv_dim(),
        );
        if let Some(d) = &self.deepseek {
            // MLA's linears (deepseek_v2.py L867-916 at 0.19.0), whole: the A projection
            // (fused with the low-rank query's), the query's, kv_b_proj, o_proj; the dense
            // first layers' MLP and the shared experts' (the routed experts are checked as
            // FusedMoE makes them).
            let heads = self.num_heads;
            let latent = d.kv_lora_rank + d.qk_rope_head_dim;
            let mut out = match d.q_lora_rank {
                Some(r) => vec![
                    ("fused_qkv_a_proj", vec![r, latent], h),
                    ("q_b_proj", vec![heads * d.qk_head_dim()], r),
                ],
                None => vec![
                    ("kv_a_proj_with_mqa", vec![latent], h),
                    ("q_proj", vec![heads * d.qk_head_dim()], h),
                ],
            };
            out.push((
                "kv_b_proj",
                vec![heads * (d.qk_nope_head_dim + d.v_head_dim)],
                d.kv_lora_rank,
            ));
            out.push(("o_proj", vec![h], heads * d.v_head_dim));
            if d.first_k_dense_replace > 0 {
                out.push(("gate_up_proj", vec![i, i], h));
                out.push(("down_proj", vec![h], i));
            }
            if let Some(m) = self.moe.as_ref().filter(|_| d.n_shared_experts > 0) {
                let w = d.n_shared_experts * m.expert_intermediate_size;
                out.push(("shared_experts.gate_up_proj", vec![w, w], h));
                out.push(("shared_experts.down_proj", vec![h], w));
            }
            return out;
        }
        vec![
            ("qkv_proj", vec![q, kv, kv], h),
            ("o_proj", vec![h], q),
            ("gate_up_proj", vec![i, i], h),
            ("down_proj", vec![h], i),
        ]
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Vocabulary rows as vLLM's VocabParallelEmbedding and ParallelLMHead allocate them (padded to 64).
    pub fn padded_vocab(&self) -> usize {
        self.vocab_size.div_ceil(64) * 64
    }

    /// The tensors a checkpoint of this shape holds, in Hugging Face names, with shapes.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        if let Some(mm) = &self.gemma3_mm {
            // The language model's tensors, then the vision tower's and the projector's.
            let text = ModelConfig {
                gemma3_mm: None,
                mistral3: None,
                qwen2_5_vl: None,
                llava_next: None,
                kimi_vl: None,
                ..self.clone()
            };
            let mut out = text.tensor_shapes();
            out.extend(mm.tensor_shapes(self.hidden_size));
            return out;
        }
        if let Some(mm) = &self.mistral3 {
            let text = ModelConfig {
                mistral3: None,
                qwen2_5_vl: None,
                llava_next: None,
                kimi_vl: None,
                ..self.clone()
            };
            let mut out = text.tensor_shapes();
            out.extend(mm.tensor_shapes(self.hidden_size));
            return out;
        }
        if let Some(mm) = &self.llava_next {
            let text = ModelConfig {
                llava_next: None,
                kimi_vl: None,
                ..self.clone()
            };
            let mut out = text.tensor_shapes();
            out.extend(mm.tensor_shapes(self.hidden_size));
            return out;
        }
        if let Some(mm) = &self.kimi_vl {
            let text = ModelConfig {
                kimi_vl: None,
                ..self.clone()
            };
            let mut out = text.tensor_shapes();
            out.extend(mm.tensor_shapes(self.hidden_size));
            return out;
        }
        if let Some(mm) = &self.qwen2_5_vl {
            let text = ModelConfig {
                qwen2_5_vl: None,
                llava_next: None,
                kimi_vl: None,
                ..self.clone()
            };
            let mut out = text.tensor_shapes();
            out.extend(mm.tensor_shapes());
            return out;
        }
        if let Some(opt) = &self.opt {
            return self.opt_tensor_shapes(opt);
        }
        if self.phi.is_some() {
            return self.phi_tensor_shapes();
        }
        if let Some(d) = &self.deepseek {
            return self.deepseek_tensor_shapes(d);
        }
        if let Some(g) = &self.gpt_oss {
            return self.gpt_oss_tensor_shapes(g);
        }
        if let Some(s) = &self.llama4 {
            return self.llama4_tensor_shapes(s);
        }
        if let Some(q) = &self.qwen3_next {
            return self.qwen3_next_tensor_shapes(q);
        }
        let (h, i, q, kv, v) = (
            self.hidden_size,
            self.intermediate_size,
            self.q_dim(),
            self.kv_dim(),
            self.vocab_size,
        );
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            out.push((format!("{p}.input_layernorm.weight"), vec![h]));
            if self.fused_checkpoint() {
                out.push((
                    format!("{p}.self_attn.qkv_proj.weight"),
                    vec![q + 2 * kv, h],
                ));
            } else {
                out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
                out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
                out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
            }
            if self.attention_bias {
                out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
                out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
                out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
            }
            out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
            if self.qk_norm() {
                out.push((format!("{p}.self_attn.q_norm.weight"), vec![self.head_dim]));
                out.push((format!("{p}.self_attn.k_norm.weight"), vec![self.head_dim]));
            }
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            if self.family().is_some_and(|f| f.feedforward_norms) {
                out.push((format!("{p}.pre_feedforward_layernorm.weight"), vec![h]));
                out.push((format!("{p}.post_feedforward_layernorm.weight"), vec![h]));
            }
            let names = self.family().and_then(|f| f.moe);
            if let (Some(m), Some(names)) =
                (self.moe.as_ref().filter(|_| self.is_moe_layer(l)), names)
            {
                let (block, [gate, up, down]) = (names.block, names.experts);
                let ie = m.expert_intermediate_size;
                out.push((format!("{p}.{block}.gate.weight"), vec![m.num_experts, h]));
                for e in 0..m.num_experts {
                    let x = format!("{p}.{block}.experts.{e}");
                    out.push((format!("{x}.{gate}.weight"), vec![ie, h]));
                    out.push((format!("{x}.{up}.weight"), vec![ie, h]));
                    out.push((format!("{x}.{down}.weight"), vec![h, ie]));
                }
                let se = m.shared_expert_intermediate_size;
                if se > 0 {
                    let x = format!("{p}.{block}.shared_expert");
                    out.push((format!("{x}.gate_proj.weight"), vec![se, h]));
                    out.push((format!("{x}.up_proj.weight"), vec![se, h]));
                    out.push((format!("{x}.down_proj.weight"), vec![h, se]));
                    out.push((format!("{p}.{block}.shared_expert_gate.weight"), vec![1, h]));
                }
                continue;
            }
            if self.fused_checkpoint() {
                out.push((format!("{p}.mlp.gate_up_proj.weight"), vec![2 * i, h]));
            } else {
                out.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
                out.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
            }
            out.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }

    /// OPT's tensors as `OPTForCausalLM.state_dict()` names them (the tied lm_head is not
    /// stored separately); the embedding keeps its unpadded vocabulary rows.
    fn opt_tensor_shapes(&self, opt: &OptShape) -> Vec<(String, Vec<usize>)> {
        let (h, f, v, p) = (
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            opt.word_embed_proj_dim,
        );
        let d = "model.decoder";
        let mut out = vec![
            (format!("{d}.embed_tokens.weight"), vec![v, p]),
            (
                format!("{d}.embed_positions.weight"),
                vec![self.max_position_embeddings + OPT_POSITION_OFFSET, h],
            ),
        ];
        if opt.has_final_norm() {
            out.push((format!("{d}.final_layer_norm.weight"), vec![h]));
            out.push((format!("{d}.final_layer_norm.bias"), vec![h]));
        }
        if p != h {
            out.push((format!("{d}.project_out.weight"), vec![p, h]));
            out.push((format!("{d}.project_in.weight"), vec![h, p]));
        }
        for l in 0..self.num_layers {
            let pre = format!("{d}.layers.{l}");
            let mut lin = |name: String, n: usize, k: usize| {
                out.push((format!("{name}.weight"), vec![n, k]));
                if opt.enable_bias {
                    out.push((format!("{name}.bias"), vec![n]));
                }
            };
            for proj in ["k_proj", "v_proj", "q_proj", "out_proj"] {
                lin(format!("{pre}.self_attn.{proj}"), h, h);
            }
            lin(format!("{pre}.fc1"), f, h);
            lin(format!("{pre}.fc2"), h, f);
            for norm in ["self_attn_layer_norm", "final_layer_norm"] {
                out.push((format!("{pre}.{norm}.weight"), vec![h]));
                out.push((format!("{pre}.{norm}.bias"), vec![h]));
            }
        }
        out
    }

    /// DeepSeek's tensors as `DeepseekV2ForCausalLM.state_dict()` names them
    /// (deepseek-ai/DeepSeek-V2-Lite's index; V3's adds the low-rank query and
    /// `e_score_correction_bias`), the main model's layers only: the multi-token-prediction
    /// layers a checkpoint may hold after them are skipped by vLLM's main model.
    fn deepseek_tensor_shapes(&self, d: &DeepseekShape) -> Vec<(String, Vec<usize>)> {
        let (h, i, v, heads) = (
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            self.num_heads,
        );
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        let q_out = heads * d.qk_head_dim();
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            out.push((format!("{p}.input_layernorm.weight"), vec![h]));
            match d.q_lora_rank {
                None => out.push((format!("{a}.q_proj.weight"), vec![q_out, h])),
                Some(r) => {
                    out.push((format!("{a}.q_a_proj.weight"), vec![r, h]));
                    out.push((format!("{a}.q_a_layernorm.weight"), vec![r]));
                    out.push((format!("{a}.q_b_proj.weight"), vec![q_out, r]));
                }
            }
            out.push((
                format!("{a}.kv_a_proj_with_mqa.weight"),
                vec![d.latent_dim(), h],
            ));
            out.push((format!("{a}.kv_a_layernorm.weight"), vec![d.kv_lora_rank]));
            out.push((
                format!("{a}.kv_b_proj.weight"),
                vec![heads * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank],
            ));
            out.push((format!("{a}.o_proj.weight"), vec![h, heads * d.v_head_dim]));
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            let mlp = |out: &mut Vec<(String, Vec<usize>)>, x: String, w: usize| {
                out.push((format!("{x}.gate_proj.weight"), vec![w, h]));
                out.push((format!("{x}.up_proj.weight"), vec![w, h]));
                out.push((format!("{x}.down_proj.weight"), vec![h, w]));
            };
            match self.moe.as_ref().filter(|_| self.is_moe_layer(l)) {
                Some(m) => {
                    out.push((format!("{p}.mlp.gate.weight"), vec![m.num_experts, h]));
                    if d.topk_method == "noaux_tc" {
                        out.push((
                            format!("{p}.mlp.gate.e_score_correction_bias"),
                            vec![m.num_experts],
                        ));
                    }
                    for e in 0..m.num_experts {
                        mlp(
                            &mut out,
                            format!("{p}.mlp.experts.{e}"),
                            m.expert_intermediate_size,
                        );
                    }
                    if d.n_shared_experts > 0 {
                        mlp(
                            &mut out,
                            format!("{p}.mlp.shared_experts"),
                            d.n_shared_experts * m.expert_intermediate_size,
                        );
                    }
                }
                None => mlp(&mut out, format!("{p}.mlp"), i),
            }
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        out.push(("lm_head.weight".to_string(), vec![v, h]));
        out
    }

    /// Phi's tensors as `PhiForCausalLM.state_dict()` names them (microsoft/phi-2's index):
    /// every linear layer and LayerNorm with its bias, the lm_head too.
    fn phi_tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        let lin = |out: &mut Vec<_>, name: String, n: usize, k: usize| {
            out.push((format!("{name}.weight"), vec![n, k]));
            out.push((format!("{name}.bias"), vec![n]));
        };
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            out.push((format!("{p}.input_layernorm.weight"), vec![h]));
            out.push((format!("{p}.input_layernorm.bias"), vec![h]));
            for proj in ["q_proj", "k_proj", "v_proj", "dense"] {
                lin(&mut out, format!("{p}.self_attn.{proj}"), h, h);
            }
            lin(&mut out, format!("{p}.mlp.fc1"), i, h);
            lin(&mut out, format!("{p}.mlp.fc2"), h, i);
        }
        out.push(("model.final_layernorm.weight".to_string(), vec![h]));
        out.push(("model.final_layernorm.bias".to_string(), vec![h]));
        lin(&mut out, "lm_head".to_string(), v, h);
        out
    }

    /// Refuses weights that hold a layer the config does not count (`prefix` + index: the
    /// extra layers would be silently ignored). `key` names the count for the message.
    pub(crate) fn check_layers_present<'a>(
        &self,
        names: impl Iterator<Item = &'a str>,
        prefix: &str,
        key: &str,
    ) -> std::result::Result<(), String> {
        // DeepSeek's multi-token-prediction layers follow the main model's in the checkpoint;
        // vLLM's main model skips them (0.19 deepseek_v2.py L1468-1470).
        let mtp = self
            .deepseek
            .as_ref()
            .map_or(0, |d| d.num_nextn_predict_layers);
        let beyond = names
            .filter_map(|n| {
                let rest = n.strip_prefix(prefix)?;
                let layer: usize = rest.split('.').next()?.parse().ok()?;
                (layer >= self.num_layers + mtp).then_some((layer, n))
            })
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)));
        match beyond {
            Some((layer, name)) => Err(format!(
                "{key} is {} but the weights hold layer {layer} (tensor {name}): expected layers 0 to {}",
                self.num_layers,
                self.num_layers - 1
            )),
            None => Ok(()),
        }
    }

    pub fn param_count(&self) -> u64 {
        self.tensor_shapes()
            .iter()
            .map(|(n, s)| {
                let numel = s.iter().product::<usize>() as u64;
                // gpt-oss's MXFP4 blocks hold two values a byte; their scales are not
                // parameters.
                if n.ends_with("_blocks") {
                    2 * numel
                } else if n.ends_with("_scales") {
                    0
                } else {
                    numel
                }
            })
            .sum()
    }

    /// Reads a Hugging Face `config.json` (a regular file of at most 16 MiB, a JSON object).
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let v = read_config_json(path)?;
        Self::from_hf_json(&v).map_err(|problem| Error::model(path, problem))
    }

    /// The shape a `config.json` describes. Every key present must hold the type it is read
    /// as (`tie_word_embeddings: "yes"` is an error, not `false`), and every number must be
    /// one a model can have; messages say the key, the value found and what was expected.
    pub fn from_hf_json(v: &serde_json::Value) -> std::result::Result<Self, String> {
        let Some(obj) = v.as_object() else {
            return Err(format!(
                "holds a JSON {}, expected an object with model_type, hidden_size, ...",
                crate::base::fsguard::json_kind(v)
            ));
        };
        let arch = match obj.get("model_type") {
            None => {
                return Err(format!(
                    "model_type is missing (expected {}); is this a config.json?",
                    registry::supported_list()
                ))
            }
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(format!(
                    "model_type is {other} (a {}), expected a string: {}",
                    crate::base::fsguard::json_kind(other),
                    registry::supported_list()
                ))
            }
        };
        // Gemma 3's multimodal checkpoint: its text_config is the language model (gemma3_text),
        // its vision_config the SigLIP tower (config/gemma3_mm.rs).
        if arch == "gemma3" {
            return Self::gemma3_mm_from_hf_json(v);
        }
        // Mistral 3's: its text_config a Mistral language model, its vision_config the
        // Pixtral tower (config/mistral3.rs).
        if arch == "mistral3" {
            return Self::mistral3_from_hf_json(v);
        }
        // Qwen2.5-VL's: a Qwen2 language model with M-RoPE and the window-attention ViT
        // (config/qwen2_5_vl.rs).
        if arch == "qwen2_5_vl" {
            return Self::qwen2_5_vl_from_hf_json(v);
        }
        // LLaVA-NeXT's: its text_config the language model, its vision_config the SigLIP
        // tower (config/llava_next.rs).
        if arch == "llava_next" {
            return Self::llava_next_from_hf_json(v);
        }
        // Kimi-VL's: its text_config a DeepSeek-V3 language model, its vision_config MoonViT
        // (config/kimi_vl.rs).
        if arch == "kimi_vl" {
            return Self::kimi_vl_from_hf_json(v);
        }
        // Model types vramscope knows and does not run yet: refused by name, with what
        // running them would need.
        if let Some(why) = registry::refusal(&arch) {
            return Err(why);
        }
        let Some(family) = registry::family(&arch) else {
            return Err(format!(
                "model_type '{arch}' is not supported (expected {})",
                registry::supported_list()
            ));
        };
        let get = |k: &str| -> std::result::Result<usize, String> {
            // Far above any published model, low enough that no shape or count derived
            // from them can overflow or size a huge allocation.
            let limit: u64 = match k {
                "num_hidden_layers" | "num_attention_heads" | "num_key_value_heads" => 1 << 10,
                "head_dim" => 1 << 12,
                "hidden_size" => 1 << 17,
                "intermediate_size" => 1 << 19,
                "max_position_embeddings" => crate::base::limits::MAX_MODEL_LEN,
                _ => 1 << 23,
            };
            let found = match v.get(k) {
                None | Some(serde_json::Value::Null) => return Err(format!("'{k}' is missing")),
                Some(x) => x,
            };
            let n = json_as(k, found, serde_json::Value::as_u64, "a positive integer")?;
            if n == 0 || n > limit {
                return Err(format!("'{k}' is {n}, expected 1 to {limit}"));
            }
            Ok(n as usize)
        };
        if family.decoder == registry::Decoder::Llama4 {
            return Self::llama4_from_hf_json(v, arch);
        }
        let hidden_size = get("hidden_size")?;
        if arch == "opt" {
            return Self::opt_from_hf_json(v, hidden_size, &get);
        }
        if arch == "phi" {
            return Self::phi_from_hf_json(v, hidden_size, &get);
        }
        if family.decoder == registry::Decoder::Deepseek {
            return Self::deepseek_from_hf_json(v, arch, hidden_size, &get);
        }
        if family.decoder == registry::Decoder::GptOss {
            return Self::gpt_oss_from_hf_json(v, hidden_size, &get);
        }
        if family.decoder == registry::Decoder::Qwen3Next {
            return Self::qwen3_next_from_hf_json(v, hidden_size, &get);
        }
        if arch == "phi3" {
            // Phi-3-mini-128k, Phi-3.5-mini and Phi-4-mini scale their rotary embedding
            // (LongRoPE: two factor sets and a second cache) and Phi-4-mini rotates 3/4 of each
            // head; vramscope's rotary cache is the plain one (Phi-3-mini-4k, Phi-4).
            if let Some(rs) = v.get("rope_scaling").filter(|r| !r.is_null()) {
                let kind = rs
                    .get("type")
                    .or_else(|| rs.get("rope_type"))
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("?");
                return Err(format!(
                    "rope_scaling '{kind}' (Phi-3's LongRoPE) is not supported yet: only phi3 checkpoints with rope_scaling null (Phi-3-mini-4k, Phi-4) are"
                ));
            }
            let partial = float(
                v,
                "partial_rotary_factor",
                1.0,
                |x| x > 0.0 && x <= 1.0,
                "above 0 and at most 1",
            )?;
            if partial != 1.0 {
                return Err(format!(
                    "partial_rotary_factor {partial} is not supported yet (every head dimension is rotated)"
                ));
            }
        }
        let num_heads = get("num_attention_heads")?;
        let num_kv_heads = if v["num_key_value_heads"].is_null() {
            num_heads
        } else {
            get("num_key_value_heads")?
        };
        let mut gemma = match arch.as_str() {
            "gemma2" | "gemma3_text" => {
                Some(gemma_from_hf_json(v, &arch, get("num_hidden_layers")?)?)
            }
            "gemma" => Some(gemma1_from_hf_json(v)?),
            _ => None,
        };
        let granite = if arch == "granite" {
            Some(granite_from_hf_json(v)?)
        } else {
            None
        };
        let moe = match arch.as_str() {
            "mixtral" | "qwen2_moe" | "qwen3_moe" => Some(moe_from_hf_json(v, &arch, &get)?),
            _ => None,
        };
        let head_dim = if v["head_dim"].is_null() {
            // Gemma2Config and Gemma3TextConfig default to 256 (every published Gemma 2/3).
            if gemma.is_some() {
                256
            } else {
                hidden_size / num_heads
            }
        } else {
            get("head_dim")?
        };
        if num_heads % num_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            ));
        }
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(format!(
                "head_dim {head_dim} must be even and positive for rotary embeddings"
            ));
        }
        if let (Some(g), "gemma") = (gemma.as_mut(), arch.as_str()) {
            // GemmaAttention's scale is head_dim^-0.5 (gemma.py L156 at 0.19).
            g.query_pre_attn_scalar = head_dim as f64;
        }
        let max_position_embeddings = if v["max_position_embeddings"].is_null() {
            match arch.as_str() {
                "gemma" | "gemma2" => 8192,
                "granite" => 2048,
                "gemma3_text" => 131072,
                _ => 4096,
            }
        } else {
            get("max_position_embeddings")?
        };
        // Gemma reads its own (linear on Gemma 3's global layers).
        let rope_scaling = if gemma.is_some() {
            None
        } else {
            rope_scaling_from_hf_json(v, &arch, max_position_embeddings)?
        };
        Ok(ModelConfig {
            hidden_size,
            intermediate_size: get("intermediate_size")?,
            num_layers: get("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: get("vocab_size")?,
            // rope_theta: a base above 1 (real ones run 1e4 to 5e8); eps: a small positive
            // number (1e-6 .. 1e-5 in practice; 1 or more would flatten every activation).
            rope_theta: float(
                // transformers 5 writes the base inside `rope_parameters`.
                if v["rope_theta"].is_null() && v["rope_parameters"]["rope_theta"].is_number() {
                    &v["rope_parameters"]
                } else {
                    v
                },
                "rope_theta",
                // Gemma3TextConfig's default; every other config's is 10000.
                if arch == "gemma3_text" { 1e6 } else { 10000.0 },
                |x| x > 1.0 && x <= 1e12,
                "above 1 and at most 1e12",
            )?,
            rms_norm_eps: float(
                v,
                "rms_norm_eps",
                1e-6,
                |x| x > 0.0 && x < 1.0,
                "above 0 and below 1",
            )?,
            tie_word_embeddings: boolean(v, "tie_word_embeddings", gemma.is_some())?,
            // Qwen2-MoE's q/k/v always carry a bias in vLLM (qwen2_moe.py L207 at 0.8.5).
            attention_bias: match family.qkv_bias {
                QkvBias::Always => true,
                QkvBias::Config { default } => boolean(v, "attention_bias", default)?,
            },
            max_position_embeddings,
            rope_scaling,
            arch,
            opt: None,
            phi: None,
            gemma,
            moe,
            granite,
            deepseek: None,
            gpt_oss: None,
            llama4: None,
            qwen3_next: None,
            gemma3_mm: None,
            mistral3: None,
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
        })
    }

    /// A `DeepseekV2Config` / `DeepseekV3Config` as vLLM's deepseek_v2.py reads it (0.19
    /// L820-1080), with Hugging Face's defaults for the keys a config leaves out (V2's greedy
    /// softmax routing; V3's sigmoid `noaux_tc` in 8 groups, 4 kept, scaled by 2.5).
    /// `kimi_k2` is V3's shape (vLLM maps it to `DeepseekV3Config`).
    fn deepseek_from_hf_json(
        v: &serde_json::Value,
        arch: String,
        hidden_size: usize,
        get: &dyn Fn(&str) -> std::result::Result<usize, String>,
    ) -> std::result::Result<Self, String> {
        let v2 = arch == "deepseek_v2";
        let or = |k: &str, default: usize| {
            if v[k].is_null() {
                Ok(default)
            } else {
                get(k)
            }
        };
        let string = |k: &str, default: &str| text_or(v, k, default).map(str::to_string);
        let num_layers = get("num_hidden_layers")?;
        let num_heads = get("num_attention_heads")?;
        let q_lora_rank = if v["q_lora_rank"].is_null() {
            None
        } else {
            Some(get("q_lora_rank")?)
        };
        let (kv_lora_rank, qk_nope, qk_rope, v_head) = (
            get("kv_lora_rank")?,
            get("qk_nope_head_dim")?,
            get("qk_rope_head_dim")?,
            get("v_head_dim")?,
        );
        if qk_rope % 2 != 0 {
            return Err(format!(
                "qk_rope_head_dim {qk_rope} must be even for rotary embeddings"
            ));
        }
        let moe_layer_freq = or("moe_layer_freq", 1)?;
        if moe_layer_freq != 1 {
            return Err(format!(
                "moe_layer_freq {moe_layer_freq} is not supported yet (every published DeepSeek and Kimi has 1)"
            ));
        }
        let first_k_dense_replace = or("first_k_dense_replace", if v2 { 0 } else { 3 })?;
        let topk_method = string("topk_method", if v2 { "greedy" } else { "noaux_tc" })?;
        let scoring_func = string("scoring_func", if v2 { "softmax" } else { "sigmoid" })?;
        if !matches!(
            topk_method.as_str(),
            "greedy" | "group_limited_greedy" | "noaux_tc"
        ) {
            return Err(format!(
                "topk_method '{topk_method}' is not supported (expected greedy, group_limited_greedy or noaux_tc)"
            ));
        }
        if !matches!(scoring_func.as_str(), "softmax" | "sigmoid") {
            return Err(format!(
                "scoring_func '{scoring_func}' is not supported (expected softmax or sigmoid)"
            ));
        }
        let (n_group, topk_group) = (
            or("n_group", if v2 { 1 } else { 8 })?,
            or("topk_group", if v2 { 1 } else { 4 })?,
        );
        let moe = if v["n_routed_experts"].is_null() {
            None
        } else {
            let num_experts = get("n_routed_experts")?;
            let top_k = get("num_experts_per_tok")?;
            if top_k > num_experts || topk_group > n_group || num_experts % n_group != 0 {
                return Err(format!(
                    "num_experts_per_tok {top_k}, n_group {n_group} and topk_group {topk_group} do not fit n_routed_experts {num_experts}"
                ));
            }
            Some(MoeShape {
                num_experts,
                top_k,
                expert_intermediate_size: get("moe_intermediate_size")?,
                renormalize: boolean(v, "norm_topk_prob", !v2)?,
                decoder_sparse_step: 1,
                mlp_only_layers: (0..first_k_dense_replace.min(num_layers)).collect(),
                shared_expert_intermediate_size: 0,
            })
        };
        let max_position_embeddings = or("max_position_embeddings", 2048)?;
        let yarn = deepseek_yarn(v)?;
        let deepseek = DeepseekShape {
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim: qk_nope,
            qk_rope_head_dim: qk_rope,
            v_head_dim: v_head,
            yarn,
            num_nextn_predict_layers: if v["num_nextn_predict_layers"].is_null() {
                0
            } else {
                json_as(
                    "num_nextn_predict_layers",
                    &v["num_nextn_predict_layers"],
                    serde_json::Value::as_u64,
                    "a count",
                )? as usize
            },
            n_shared_experts: or("n_shared_experts", 0).or_else(|e| {
                (v["n_shared_experts"] == serde_json::json!(0))
                    .then_some(0)
                    .ok_or(e)
            })?,
            topk_method,
            scoring_func,
            n_group,
            topk_group,
            routed_scaling_factor: float(
                v,
                "routed_scaling_factor",
                if v2 { 1.0 } else { 2.5 },
                |x| x > 0.0 && x <= 1e3,
                "above 0 and at most 1000",
            )?,
            first_k_dense_replace,
        };
        if boolean(v, "tie_word_embeddings", false)? {
            return Err(format!(
                "tie_word_embeddings true is not supported for {arch} (vLLM's deepseek_v2.py always makes its own lm_head)"
            ));
        }
        Ok(ModelConfig {
            rope_scaling: None,
            hidden_size,
            intermediate_size: get("intermediate_size")?,
            num_layers,
            num_heads,
            // Every head has its own key and value after kv_b_proj; the cache holds one
            // latent (`kv_cache_layout`).
            num_kv_heads: num_heads,
            head_dim: deepseek.qk_head_dim(),
            vocab_size: get("vocab_size")?,
            rope_theta: float(
                v,
                "rope_theta",
                10000.0,
                |x| x > 1.0 && x <= 1e12,
                "above 1 and at most 1e12",
            )?,
            rms_norm_eps: float(
                v,
                "rms_norm_eps",
                1e-6,
                |x| x > 0.0 && x < 1.0,
                "above 0 and below 1",
            )?,
            tie_word_embeddings: false,
            attention_bias: false,
            max_position_embeddings,
            arch,
            opt: None,
            phi: None,
            gemma: None,
            moe,
            granite: None,
            deepseek: Some(deepseek),
            gpt_oss: None,
            llama4: None,
            qwen3_next: None,
            gemma3_mm: None,
            mistral3: None,
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
        })
    }

    /// A `PhiConfig` as vLLM's phi.py reads it (0.19 L85-150), with Hugging Face's defaults
    /// for the keys a config leaves out. What vLLM ignores and transformers uses
    /// (`intermediate_size`, `num_key_value_heads`, `qk_layernorm`) must match what vLLM
    /// assumes, or the checkpoint would run differently in the two: refused, naming the key.
    fn phi_from_hf_json(
        v: &serde_json::Value,
        hidden_size: usize,
        get: &dyn Fn(&str) -> std::result::Result<usize, String>,
    ) -> std::result::Result<Self, String> {
        let num_heads = get("num_attention_heads")?;
        if !hidden_size.is_multiple_of(num_heads) {
            return Err(format!(
                "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}"
            ));
        }
        // phi.py L149-150: `n_inner = getattr(config, "n_inner", None)`, else 4·hidden;
        // PhiConfig has no n_inner.
        let width = 4 * hidden_size;
        let or = |k: &str, default: usize| {
            if v[k].is_null() {
                Ok(default)
            } else {
                get(k)
            }
        };
        let inter = or("intermediate_size", 8192)?;
        if inter != width {
            return Err(format!(
                "intermediate_size {inter} is not 4 × hidden_size ({width}): vLLM's phi.py sizes fc1 as 4 × hidden_size whatever the config says"
            ));
        }
        let kv = or("num_key_value_heads", num_heads)?;
        if kv != num_heads {
            return Err(format!(
                "num_key_value_heads {kv} differs from num_attention_heads {num_heads}: vLLM's phi.py runs multi-head attention only"
            ));
        }
        if boolean(v, "qk_layernorm", false)? {
            return Err("qk_layernorm true is not supported: vLLM's phi.py ignores it".into());
        }
        if boolean(v, "tie_word_embeddings", false)? {
            return Err(
                "tie_word_embeddings true is not supported for phi (vLLM's phi.py asserts it is false)"
                    .into(),
            );
        }
        let act = text_or(v, "hidden_act", "gelu_new")?;
        if act != "gelu_new" {
            return Err(format!(
                "hidden_act '{act}' is not supported for phi (expected gelu_new)"
            ));
        }
        if let Some(rs) = v.get("rope_scaling").filter(|r| !r.is_null()) {
            return Err(format!(
                "rope_scaling {rs} is not supported for phi (only the plain rotary embedding)"
            ));
        }
        let head_dim = hidden_size / num_heads;
        let partial_rotary_factor = float(
            v,
            "partial_rotary_factor",
            0.5,
            |x| x > 0.0 && x <= 1.0,
            "above 0 and at most 1",
        )?;
        let rotary = (head_dim as f64 * partial_rotary_factor) as usize;
        if rotary == 0 || !rotary.is_multiple_of(2) {
            return Err(format!(
                "partial_rotary_factor {partial_rotary_factor} of head_dim {head_dim} turns {rotary} dimensions: expected an even number above 0"
            ));
        }
        let layer_norm_eps = float(
            v,
            "layer_norm_eps",
            1e-5,
            |x| x > 0.0 && x < 1.0,
            "above 0 and below 1",
        )?;
        Ok(ModelConfig {
            rope_scaling: None,
            arch: "phi".into(),
            hidden_size,
            intermediate_size: width,
            num_layers: get("num_hidden_layers")?,
            num_heads,
            num_kv_heads: num_heads,
            head_dim,
            vocab_size: or("vocab_size", 51200)?,
            rope_theta: float(
                v,
                "rope_theta",
                10000.0,
                |x| x > 1.0 && x <= 1e12,
                "above 1 and at most 1e12",
            )?,
            rms_norm_eps: 0.0,
            tie_word_embeddings: false,
            attention_bias: true,
            max_position_embeddings: or("max_position_embeddings", 2048)?,
            opt: None,
            phi: Some(PhiShape {
                partial_rotary_factor,
                layer_norm_eps,
            }),
            gemma: None,
            moe: None,
            granite: None,
            deepseek: None,
            gpt_oss: None,
            llama4: None,
            qwen3_next: None,
            gemma3_mm: None,
            mistral3: None,
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
        })
    }

    /// An `OPTConfig` (`ffn_dim`, `word_embed_proj_dim`, `do_layer_norm_before`, ...), with
    /// Hugging Face's defaults for the keys a config leaves out.
    fn opt_from_hf_json(
        v: &serde_json::Value,
        hidden_size: usize,
        get: &dyn Fn(&str) -> std::result::Result<usize, String>,
    ) -> std::result::Result<Self, String> {
        let num_heads = get("num_attention_heads")?;
        if !hidden_size.is_multiple_of(num_heads) {
            return Err(format!(
                "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}"
            ));
        }
        // Every key present must hold its type, as for the Llama family: a string "false" or
        // a number is an error naming the key, never the default.
        let act = text_or(v, "activation_function", "relu")?;
        if act != "relu" {
            return Err(format!(
                "activation_function '{act}' is not supported for OPT (expected relu)"
            ));
        }
        if !boolean(v, "layer_norm_elementwise_affine", true)? {
            return Err("layer_norm_elementwise_affine false is not supported for OPT".into());
        }
        if !boolean(v, "tie_word_embeddings", true)? {
            return Err(
                "tie_word_embeddings false is not supported for OPT (its lm_head is the embedding)"
                    .into(),
            );
        }
        let enable_bias = boolean(v, "enable_bias", true)?;
        let do_layer_norm_before = boolean(v, "do_layer_norm_before", true)?;
        let remove_final_layer_norm = boolean(v, "_remove_final_layer_norm", false)?;
        let ffn = get("ffn_dim")?;
        let word_embed_proj_dim = if v["word_embed_proj_dim"].is_null() {
            hidden_size
        } else {
            get("word_embed_proj_dim")?
        };
        Ok(ModelConfig {
            rope_scaling: None,
            arch: "opt".into(),
            hidden_size,
            intermediate_size: ffn,
            num_layers: get("num_hidden_layers")?,
            num_heads,
            num_kv_heads: num_heads,
            head_dim: hidden_size / num_heads,
            vocab_size: get("vocab_size")?,
            rope_theta: 0.0,
            rms_norm_eps: 0.0,
            tie_word_embeddings: true,
            attention_bias: enable_bias,
            max_position_embeddings: get("max_position_embeddings")?,
            gemma: None,
            moe: None,
            granite: None,
            deepseek: None,
            gpt_oss: None,
            llama4: None,
            qwen3_next: None,
            gemma3_mm: None,
            mistral3: None,
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
            phi: None,
            opt: Some(OptShape {
                do_layer_norm_before,
                word_embed_proj_dim,
                enable_bias,
                layer_norm_eps: 1e-5,
                remove_final_layer_norm,
            }),
        })
    }

    /// The `config.json` a Hugging Face loader reads for this shape.
    pub fn to_hf_json(&self, torch_dtype: &str) -> serde_json::Value {
        if let Some(mm) = &self.llava_next {
            return self.llava_next_to_hf_json(mm, torch_dtype);
        }
        if let Some(mm) = &self.kimi_vl {
            return self.kimi_vl_to_hf_json(mm, torch_dtype);
        }
        if let Some(mm) = &self.mistral3 {
            return self.mistral3_to_hf_json(mm, torch_dtype);
        }
        if let Some(mm) = &self.qwen2_5_vl {
            return self.qwen2_5_vl_to_hf_json(mm, torch_dtype);
        }
        if let Some(mm) = &self.gemma3_mm {
            // A `Gemma3Config`: the language model as its text_config, the tower's keys.
            let text = ModelConfig {
                gemma3_mm: None,
                mistral3: None,
                qwen2_5_vl: None,
                llava_next: None,
                kimi_vl: None,
                ..self.clone()
            }
            .to_hf_json(torch_dtype);
            let v = &mm.vision;
            return serde_json::json!({
                "architectures": ["Gemma3ForConditionalGeneration"],
                "model_type": "gemma3",
                "mm_tokens_per_image": mm.mm_tokens_per_image,
                "image_token_index": mm.image_token_index,
                "text_config": text,
                "vision_config": {
                    "model_type": "siglip_vision_model",
                    "hidden_size": v.hidden_size,
                    "intermediate_size": v.intermediate_size,
                    "num_hidden_layers": v.num_layers,
                    "num_attention_heads": v.num_heads,
                    "num_channels": v.num_channels,
                    "image_size": v.image_size,
                    "patch_size": v.patch_size,
                    "layer_norm_eps": v.layer_norm_eps,
                    "hidden_act": "gelu_pytorch_tanh",
                    "vision_use_head": false,
                },
                "torch_dtype": torch_dtype,
            });
        }
        if let Some(s) = &self.llama4 {
            return self.llama4_to_hf_json(s, torch_dtype);
        }
        if let Some(q) = &self.qwen3_next {
            return self.qwen3_next_hf_json(q, torch_dtype);
        }
        if let Some(opt) = &self.opt {
            // The keys of facebook/opt-125m's config.json.
            return serde_json::json!({
                "architectures": ["OPTForCausalLM"],
                "model_type": "opt",
                "hidden_size": self.hidden_size,
                "ffn_dim": self.intermediate_size,
                "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads,
                "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_position_embeddings,
                "word_embed_proj_dim": opt.word_embed_proj_dim,
                "do_layer_norm_before": opt.do_layer_norm_before,
                "enable_bias": opt.enable_bias,
                "_remove_final_layer_norm": opt.remove_final_layer_norm,
                "activation_function": "relu",
                "layer_norm_elementwise_affine": true,
                "tie_word_embeddings": true,
                "bos_token_id": 2,
                "eos_token_id": 2,
                "pad_token_id": 1,
                "torch_dtype": torch_dtype,
            });
        }
        if let Some(phi) = &self.phi {
            // The keys of microsoft/phi-2's config.json (dropout off: the forward is
            // compared at inference).
            return serde_json::json!({
                "architectures": ["PhiForCausalLM"],
                "model_type": "phi",
                "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads,
                "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_position_embeddings,
                "partial_rotary_factor": phi.partial_rotary_factor,
                "layer_norm_eps": phi.layer_norm_eps,
                "rope_theta": self.rope_theta,
                "rope_scaling": null,
                "hidden_act": "gelu_new",
                "qk_layernorm": false,
                "tie_word_embeddings": false,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attention_dropout": 0.0,
                "torch_dtype": torch_dtype,
            });
        }
        if let Some(g) = &self.gpt_oss {
            return self.gpt_oss_hf_json(g, torch_dtype);
        }
        if let Some(d) = &self.deepseek {
            // The keys of deepseek-ai/DeepSeek-V2-Lite's (and V3's) config.json.
            let m = self.moe.as_ref();
            let mut v = serde_json::json!({
                "architectures": [self.family().map_or("DeepseekV2ForCausalLM", |f| f.architecture)],
                "model_type": self.arch,
                "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_heads,
                "vocab_size": self.vocab_size,
                "q_lora_rank": d.q_lora_rank,
                "kv_lora_rank": d.kv_lora_rank,
                "qk_nope_head_dim": d.qk_nope_head_dim,
                "qk_rope_head_dim": d.qk_rope_head_dim,
                "v_head_dim": d.v_head_dim,
                "n_routed_experts": m.map(|m| m.num_experts),
                "num_experts_per_tok": m.map(|m| m.top_k),
                "moe_intermediate_size": m.map(|m| m.expert_intermediate_size),
                "norm_topk_prob": m.is_some_and(|m| m.renormalize),
                "n_shared_experts": d.n_shared_experts,
                "topk_method": d.topk_method,
                "scoring_func": d.scoring_func,
                "n_group": d.n_group,
                "topk_group": d.topk_group,
                "routed_scaling_factor": d.routed_scaling_factor,
                "first_k_dense_replace": d.first_k_dense_replace,
                "moe_layer_freq": 1,
                "num_nextn_predict_layers": d.num_nextn_predict_layers,
                "rope_theta": self.rope_theta,
                "rms_norm_eps": self.rms_norm_eps,
                "max_position_embeddings": self.max_position_embeddings,
                "tie_word_embeddings": false,
                "attention_bias": false,
                "hidden_act": "silu",
                "torch_dtype": torch_dtype,
            });
            if let Some(y) = &d.yarn {
                v.as_object_mut().expect("an object").insert(
                    "rope_scaling".into(),
                    serde_json::json!({
                        "type": "yarn",
                        "factor": y.factor,
                        "original_max_position_embeddings": y.original_max_position_embeddings,
                        "beta_fast": y.beta_fast,
                        "beta_slow": y.beta_slow,
                        "mscale": y.mscale,
                        "mscale_all_dim": y.mscale_all_dim,
                    }),
                );
            }
            return v;
        }
        let arch_class = self.family().map_or("LlamaForCausalLM", |f| f.architecture);
        let mut v = serde_json::json!({
            "architectures": [arch_class],
            "model_type": self.arch,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "torch_dtype": torch_dtype,
        });
        if self.arch == "phi3" {
            // Phi3Config's defaults name token 32000 as padding (an embedding row a small
            // vocabulary lacks) and a 2047-token sliding window; the plain rotary embedding.
            let o = v.as_object_mut().expect("an object");
            o.insert("pad_token_id".into(), 0.into());
            o.insert("sliding_window".into(), serde_json::Value::Null);
            o.insert("rope_scaling".into(), serde_json::Value::Null);
            o.insert(
                "original_max_position_embeddings".into(),
                self.max_position_embeddings.into(),
            );
        }
        if let Some(r) = &self.rope_scaling {
            // The keys of meta-llama/Llama-3.1-8B's config.json (llama3) and of Qwen's YaRN
            // instructions.
            let mut rs = serde_json::json!({"rope_type": r.rope_type, "factor": r.factor});
            let o = rs.as_object_mut().expect("an object");
            match r.rope_type.as_str() {
                "llama3" => {
                    o.insert("low_freq_factor".into(), r.low_freq_factor.into());
                    o.insert("high_freq_factor".into(), r.high_freq_factor.into());
                    o.insert(
                        "original_max_position_embeddings".into(),
                        r.original_max_position_embeddings.into(),
                    );
                }
                "yarn" => {
                    o.insert(
                        "original_max_position_embeddings".into(),
                        r.original_max_position_embeddings.into(),
                    );
                    o.insert("beta_fast".into(), r.beta_fast.into());
                    o.insert("beta_slow".into(), r.beta_slow.into());
                }
                _ => {}
            }
            v.as_object_mut()
                .expect("an object")
                .insert("rope_scaling".into(), rs);
        }
        if let Some(m) = &self.moe {
            // The keys of mistralai/Mixtral-8x7B-v0.1's and Qwen/Qwen3-30B-A3B's config.json.
            let o = v.as_object_mut().expect("an object");
            o.insert("num_experts_per_tok".into(), m.top_k.into());
            o.insert("output_router_logits".into(), false.into());
            if self.arch == "mixtral" {
                o.insert("num_local_experts".into(), m.num_experts.into());
                o.insert("sliding_window".into(), serde_json::Value::Null);
            } else {
                o.insert("num_experts".into(), m.num_experts.into());
                o.insert(
                    "moe_intermediate_size".into(),
                    m.expert_intermediate_size.into(),
                );
                o.insert("norm_topk_prob".into(), m.renormalize.into());
                o.insert("decoder_sparse_step".into(), m.decoder_sparse_step.into());
                o.insert("mlp_only_layers".into(), m.mlp_only_layers.clone().into());
                if self.arch == "qwen2_moe" {
                    // Qwen/Qwen1.5-MoE-A2.7B's keys; transformers' Qwen2MoeConfig reads the
                    // q/k/v bias from `qkv_bias`.
                    o.insert(
                        "shared_expert_intermediate_size".into(),
                        m.shared_expert_intermediate_size.into(),
                    );
                    o.insert("qkv_bias".into(), true.into());
                }
            }
        }
        if let Some(g) = &self.gemma {
            // The keys of google/gemma-2-9b's config.json and gemma-3-12b-it's text_config,
            // with the interleaving also written as `layer_types` (transformers 4.53 on).
            let o = v.as_object_mut().expect("an object");
            let layer_types: Vec<&str> = (0..self.num_layers)
                .map(|l| {
                    if g.is_sliding(l) {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect();
            let pairs = [
                ("hidden_act", "gelu_pytorch_tanh".into()),
                ("hidden_activation", "gelu_pytorch_tanh".into()),
                // An integer where it is one: transformers 5's config class types it `int`
                // and refuses 256.0.
                (
                    "query_pre_attn_scalar",
                    if g.query_pre_attn_scalar.fract() == 0.0 && g.query_pre_attn_scalar < 1e15 {
                        (g.query_pre_attn_scalar as u64).into()
                    } else {
                        g.query_pre_attn_scalar.into()
                    },
                ),
                ("attn_logit_softcapping", g.attn_logit_softcapping.into()),
                ("final_logit_softcapping", g.final_logit_softcapping.into()),
                ("sliding_window", g.sliding_window.into()),
                ("layer_types", layer_types.into()),
                ("attention_dropout", 0.0.into()),
                ("pad_token_id", 0.into()),
                ("bos_token_id", 2.into()),
                ("eos_token_id", 1.into()),
            ];
            for (k, x) in pairs {
                o.insert(k.into(), x);
            }
            if self.arch == "gemma" {
                // GemmaConfig has no window, caps or scalar; its scale is head_dim^-0.5.
                for k in [
                    "query_pre_attn_scalar",
                    "attn_logit_softcapping",
                    "final_logit_softcapping",
                    "sliding_window",
                    "layer_types",
                ] {
                    o.remove(k);
                }
            }
            if self.arch == "gemma3_text" {
                o.insert(
                    "sliding_window_pattern".into(),
                    g.sliding_window_pattern.into(),
                );
                o.insert("rope_local_base_freq".into(), g.rope_local_base_freq.into());
                o.insert(
                    "rope_scaling".into(),
                    g.rope_linear_factor.map_or(
                        serde_json::Value::Null,
                        |f| serde_json::json!({"rope_type": "linear", "factor": f}),
                    ),
                );
            }
        }
        if let Some(g) = &self.granite {
            let o = v.as_object_mut().expect("an object");
            for (k, x) in [
                ("embedding_multiplier", g.embedding_multiplier),
                ("residual_multiplier", g.residual_multiplier),
                ("attention_multiplier", g.attention_multiplier),
                ("logits_scaling", g.logits_scaling),
            ] {
                o.insert(k.into(), x.into());
            }
            o.insert("mlp_bias".into(), false.into());
        }
        v
    }
}

/// Granite's multipliers, with `GraniteConfig`'s defaults (1.0 each) for the ones a config
/// leaves out; `hidden_act` must be silu (granite.py L93-96 raises on anything else) and
/// `mlp_bias` false (no published Granite has one).
fn granite_from_hf_json(v: &serde_json::Value) -> std::result::Result<GraniteShape, String> {
    match &v["hidden_act"] {
        serde_json::Value::Null => {}
        serde_json::Value::String(s) if s == "silu" => {}
        other => {
            return Err(format!(
                "hidden_act {other} is not supported for granite (vLLM's GraniteMLP requires silu)"
            ))
        }
    }
    if boolean(v, "mlp_bias", false)? {
        return Err(
            "mlp_bias true is not supported for granite (no published Granite has one)".into(),
        );
    }
    let positive = |x: f64| x > 0.0 && x <= 1e6;
    let m = |k: &str| float(v, k, 1.0, positive, "above 0 and at most 1e6");
    Ok(GraniteShape {
        embedding_multiplier: m("embedding_multiplier")?,
        residual_multiplier: m("residual_multiplier")?,
        attention_multiplier: m("attention_multiplier")?,
        logits_scaling: m("logits_scaling")?,
    })
}

/// Gemma 1's keys (`GemmaConfig`): GeGLU in its tanh form unless `hidden_activation` says
/// exact `gelu` (vLLM's `_get_gemma_act_fn`, gemma.py L60-87 at 0.19: a missing
/// `hidden_activation` is tanh whatever `hidden_act` says); tied embeddings (vLLM asserts it,
/// L386); no window, no soft-caps.
fn gemma1_from_hf_json(v: &serde_json::Value) -> std::result::Result<GemmaShape, String> {
    if let Some(x) = v
        .get("hidden_act")
        .filter(|x| !x.is_null() && !x.is_string())
    {
        return Err(format!(
            "'hidden_act' is {x} (a {}), expected a string",
            crate::base::fsguard::json_kind(x)
        ));
    }
    match &v["hidden_activation"] {
        serde_json::Value::Null => {}
        serde_json::Value::String(s) if s == "gelu_pytorch_tanh" => {}
        serde_json::Value::String(s) if s == "gelu" => {
            return Err(
                "hidden_activation 'gelu' (vLLM's exact-erf GeluAndMul) is not modelled yet: only the tanh form (gelu_pytorch_tanh, or no hidden_activation, which every published Gemma 1 config has)"
                    .into(),
            )
        }
        other => {
            return Err(format!(
                "hidden_activation {other} is not supported for gemma (vLLM accepts gelu_pytorch_tanh or gelu)"
            ))
        }
    }
    if !boolean(v, "tie_word_embeddings", true)? {
        return Err("tie_word_embeddings false is not supported for gemma (vLLM asserts it: the lm_head is the embedding)".into());
    }
    if boolean(v, "attention_bias", false)? {
        return Err(
            "attention_bias true is not supported for gemma (vLLM's GemmaAttention has no bias)"
                .into(),
        );
    }
    Ok(GemmaShape {
        // Set to head_dim once it is known.
        query_pre_attn_scalar: 256.0,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        sliding_window: None,
        sliding_window_pattern: 1,
        rope_local_base_freq: None,
        rope_linear_factor: None,
    })
}

/// DeepSeek's `rope_scaling` (or transformers 5's `rope_parameters`): `None` when absent,
/// YaRN's factors when its type is yarn (DeepseekScalingRotaryEmbedding's defaults for the keys
/// left out: beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 0), refused otherwise.
fn deepseek_yarn(v: &serde_json::Value) -> std::result::Result<Option<YarnScaling>, String> {
    let rs = match (&v["rope_scaling"], &v["rope_parameters"]) {
        (serde_json::Value::Null, serde_json::Value::Null) => return Ok(None),
        (serde_json::Value::Null, p) => p,
        (s, _) => s,
    };
    if !rs.is_object() {
        return Err(format!("rope_scaling is {rs}, expected an object or null"));
    }
    let kind = rs
        .get("type")
        .or_else(|| rs.get("rope_type"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("default");
    match kind {
        "yarn" | "deepseek_yarn" => {}
        "default" if rs.get("factor").is_none() => return Ok(None),
        other => {
            return Err(format!(
                "rope_scaling '{other}' is not supported for DeepSeek (expected yarn)"
            ))
        }
    }
    let f = |k: &str, default: f64| {
        float(
            rs,
            k,
            default,
            |x| x.is_finite() && (0.0..=1e6).contains(&x),
            "from 0 to 1e6",
        )
    };
    let factor = f("factor", 1.0)?;
    if factor < 1.0 {
        return Err(format!("rope_scaling factor {factor} is below 1"));
    }
    let orig = f("original_max_position_embeddings", 4096.0)?;
    if orig < 1.0
        || orig.fract() != 0.0
        || orig * factor > crate::base::limits::MAX_MODEL_LEN as f64
    {
        return Err(format!(
            "rope_scaling original_max_position_embeddings {orig} × factor {factor} is not a position count vramscope can cache (1 to {})",
            crate::base::limits::MAX_MODEL_LEN
        ));
    }
    Ok(Some(YarnScaling {
        factor,
        original_max_position_embeddings: orig as usize,
        beta_fast: f("beta_fast", 32.0)?,
        beta_slow: f("beta_slow", 1.0)?,
        mscale: f("mscale", 1.0)?,
        mscale_all_dim: f("mscale_all_dim", 0.0)?,
    }))
}

/// Mixtral's, Qwen2-MoE's and Qwen3-MoE's keys, with Hugging Face's defaults for the ones a
/// config leaves out (`MixtralConfig`: 8 experts, 2 per token; `Qwen2MoeConfig`: 60, 4, width
/// 1408, a shared expert of 5632; `Qwen3MoeConfig`: 128, 8, width 768; both Qwen ones
/// `norm_topk_prob` false, every layer sparse).
fn moe_from_hf_json(
    v: &serde_json::Value,
    arch: &str,
    get: &dyn Fn(&str) -> std::result::Result<usize, String>,
) -> std::result::Result<MoeShape, String> {
    let or = |k: &str, default: usize| {
        if v[k].is_null() {
            Ok(default)
        } else {
            get(k)
        }
    };
    let layers = get("num_hidden_layers")?;
    let (num_experts, top_k, width, renormalize) = if arch == "mixtral" {
        (
            or("num_local_experts", 8)?,
            or("num_experts_per_tok", 2)?,
            get("intermediate_size")?,
            true,
        )
    } else if arch == "qwen2_moe" {
        (
            or("num_experts", 60)?,
            or("num_experts_per_tok", 4)?,
            or("moe_intermediate_size", 1408)?,
            boolean(v, "norm_topk_prob", false)?,
        )
    } else {
        (
            or("num_experts", 128)?,
            or("num_experts_per_tok", 8)?,
            or("moe_intermediate_size", 768)?,
            boolean(v, "norm_topk_prob", false)?,
        )
    };
    let shared_expert_intermediate_size = if arch == "qwen2_moe" {
        // 0 is a model without one (vLLM's `if config.shared_expert_intermediate_size > 0`).
        match &v["shared_expert_intermediate_size"] {
            serde_json::Value::Null => 5632,
            x if x.as_u64() == Some(0) => 0,
            _ => get("shared_expert_intermediate_size")?,
        }
    } else {
        0
    };
    if num_experts > 1024 {
        return Err(format!(
            "{num_experts} experts: expected at most 1024 (vLLM's topk_softmax kernels)"
        ));
    }
    if top_k > num_experts {
        return Err(format!(
            "num_experts_per_tok {top_k} is more than the {num_experts} experts"
        ));
    }
    let decoder_sparse_step = or("decoder_sparse_step", 1)?;
    let mlp_only_layers = match v.get("mlp_only_layers") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| match x.as_u64() {
                Some(l) if (l as usize) < layers => Ok(l as usize),
                _ => Err(format!(
                    "mlp_only_layers holds {x}: expected layer indices 0 to {}",
                    layers - 1
                )),
            })
            .collect::<std::result::Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "mlp_only_layers is {other}, expected a list of layer indices"
            ))
        }
    };
    Ok(MoeShape {
        num_experts,
        top_k,
        expert_intermediate_size: width,
        renormalize,
        decoder_sparse_step,
        mlp_only_layers,
        shared_expert_intermediate_size,
    })
}

/// Gemma 2's and Gemma 3's keys, with Hugging Face's defaults for the ones a config leaves
/// out (`Gemma2Config`, `Gemma3TextConfig`). Variants vLLM's model files do not run the way
/// transformers does are refused by name.
fn gemma_from_hf_json(
    v: &serde_json::Value,
    arch: &str,
    num_layers: usize,
) -> std::result::Result<GemmaShape, String> {
    let gemma3 = arch == "gemma3_text";
    // vLLM's Gemma2MLP requires hidden_act == hidden_activation == gelu_pytorch_tanh
    // (gemma2.py L71-75 at 0.6.4); Gemma3MLP only hidden_activation (gemma3.py L78-82 at
    // 0.8.5), the one key Gemma3TextConfig has (a stray `hidden_act` must still be a string).
    for key in ["hidden_activation", "hidden_act"] {
        if gemma3 && key == "hidden_act" {
            if let Some(x) = v.get(key).filter(|x| !x.is_null() && !x.is_string()) {
                return Err(format!(
                    "'{key}' is {x} (a {}), expected a string",
                    crate::base::fsguard::json_kind(x)
                ));
            }
            continue;
        }
        match &v[key] {
            serde_json::Value::Null => {}
            serde_json::Value::String(s) if s == "gelu_pytorch_tanh" => {}
            serde_json::Value::String(s) => {
                return Err(format!(
                    "{key} '{s}' is not supported for {arch} (expected gelu_pytorch_tanh, as vLLM requires)"
                ))
            }
            other => {
                return Err(format!(
                    "'{key}' is {other} (a {}), expected a string such as \"gelu_pytorch_tanh\"",
                    crate::base::fsguard::json_kind(other)
                ))
            }
        }
    }
    if !boolean(v, "tie_word_embeddings", true)? {
        return Err(format!(
            "tie_word_embeddings false is not supported for {arch} (vLLM's Gemma models assert it: the lm_head is the embedding)"
        ));
    }
    if boolean(v, "attention_bias", false)? {
        return Err(format!(
            "attention_bias true is not supported for {arch} (no published Gemma has one)"
        ));
    }
    let positive = |x: f64| x > 0.0 && x <= 1e9;
    let query_pre_attn_scalar = float(
        v,
        "query_pre_attn_scalar",
        256.0,
        positive,
        "above 0 and at most 1e9",
    )?;
    // A soft-cap key: absent gives the class default, null none.
    let cap = |key: &str, default: Option<f64>| -> std::result::Result<Option<f64>, String> {
        match v.get(key) {
            None => Ok(default),
            Some(serde_json::Value::Null) => Ok(None),
            Some(_) => float(v, key, 0.0, positive, "above 0 and at most 1e9").map(Some),
        }
    };
    let attn_logit_softcapping = cap("attn_logit_softcapping", (!gemma3).then_some(50.0))?;
    if gemma3 {
        if let Some(c) = attn_logit_softcapping {
            // vLLM's Gemma3DecoderLayer passes attn_logits_soft_cap=None whatever the config
            // says (gemma3.py L297 at 0.8.5); transformers would apply it.
            return Err(format!(
                "attn_logit_softcapping {c} is not supported for gemma3_text (vLLM ignores it; expected null)"
            ));
        }
    }
    let final_logit_softcapping = cap("final_logit_softcapping", (!gemma3).then_some(30.0))?;
    let sliding_window = match v.get("sliding_window") {
        None => Some(4096),
        Some(serde_json::Value::Null) => None,
        Some(x) => {
            let n = json_as(
                "sliding_window",
                x,
                serde_json::Value::as_u64,
                "a positive integer",
            )?;
            if n == 0 || n > crate::base::limits::MAX_MODEL_LEN {
                return Err(format!(
                    "'sliding_window' is {n}, expected 1 to {}",
                    crate::base::limits::MAX_MODEL_LEN
                ));
            }
            Some(n as usize)
        }
    };
    let mut pattern = if gemma3 {
        let p = json_as(
            "sliding_window_pattern",
            v.get("sliding_window_pattern")
                .unwrap_or(&serde_json::json!(6)),
            serde_json::Value::as_u64,
            "a positive integer",
        )?;
        if p == 0 || p > 1 << 10 {
            return Err(format!(
                "'sliding_window_pattern' is {p}, expected 1 to 1024"
            ));
        }
        p as usize
    } else {
        2
    };
    // transformers 4.53 on writes the pattern out as `layer_types`; it must be one vLLM's
    // rule `(l + 1) % pattern` gives (gemma3.py L148-151 at 0.8.5).
    if let Some(types) = v.get("layer_types").filter(|t| !t.is_null()) {
        let Some(list) = types.as_array() else {
            return Err(format!(
                "'layer_types' is {types} (a {}), expected a list of \"sliding_attention\" and \"full_attention\"",
                crate::base::fsguard::json_kind(types)
            ));
        };
        if list.len() != num_layers {
            return Err(format!(
                "'layer_types' lists {} layers, num_hidden_layers is {num_layers}",
                list.len()
            ));
        }
        let mut sliding = Vec::with_capacity(list.len());
        for t in list {
            sliding.push(match t.as_str() {
                Some("sliding_attention") => true,
                Some("full_attention") => false,
                _ => {
                    return Err(format!(
                    "'layer_types' holds {t}, expected \"sliding_attention\" or \"full_attention\""
                ))
                }
            });
        }
        pattern = sliding
            .iter()
            .position(|s| !s)
            .map_or(num_layers + 1, |i| i + 1);
        if sliding
            .iter()
            .enumerate()
            .any(|(l, &s)| s == (l + 1).is_multiple_of(pattern))
        {
            return Err(format!(
                "'layer_types' is not one global layer every {pattern} (the only interleaving vLLM's Gemma models build)"
            ));
        }
    }
    let rope_local_base_freq = if gemma3 {
        Some(float(
            v,
            "rope_local_base_freq",
            10000.0,
            |x| x > 1.0 && x <= 1e12,
            "above 1 and at most 1e12",
        )?)
    } else {
        None
    };
    let rope_linear_factor = match v.get("rope_scaling").filter(|r| !r.is_null()) {
        None => None,
        Some(rs) => {
            let kind = rs
                .get("rope_type")
                .or_else(|| rs.get("type"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or("?");
            if !gemma3 || kind != "linear" {
                return Err(format!(
                    "rope_scaling '{kind}' is not supported for {arch} (only gemma3_text's linear scaling is)"
                ));
            }
            Some(float(
                rs,
                "factor",
                1.0,
                |x| (1.0..=1024.0).contains(&x),
                "from 1 to 1024",
            )?)
        }
    };
    if v.get("rope_parameters").is_some_and(|r| !r.is_null()) {
        return Err(format!(
            "'rope_parameters' (transformers 5's form) is not read yet for {arch}: write rope_theta, rope_local_base_freq and rope_scaling as the published config.json does"
        ));
    }
    Ok(GemmaShape {
        query_pre_attn_scalar,
        attn_logit_softcapping,
        final_logit_softcapping,
        sliding_window,
        sliding_window_pattern: pattern,
        rope_local_base_freq,
        rope_linear_factor,
    })
}

/// Reads `config.json` as a JSON object (bounded, regular file only).
pub(crate) fn read_config_json(path: &Path) -> Result<serde_json::Value> {
    crate::base::fsguard::read_json_object(path, "config.json", crate::base::fsguard::CONFIG_LIMIT)
}

/// An optional boolean key: absent or null gives `default`; anything but true/false is an
/// error naming the key and the value.
pub(crate) fn boolean(
    v: &serde_json::Value,
    k: &str,
    default: bool,
) -> std::result::Result<bool, String> {
    match v.get(k) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(serde_json::Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "'{k}' is {other} (a {}), expected true or false",
            crate::base::fsguard::json_kind(other)
        )),
    }
}

/// An optional number key in a stated range: absent or null gives `default`; a string, NaN
/// or a value outside `ok` is an error naming the key, the value and the range.
pub(crate) fn float(
    v: &serde_json::Value,
    k: &str,
    default: f64,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> std::result::Result<f64, String> {
    let x = match v.get(k) {
        None | Some(serde_json::Value::Null) => return Ok(default),
        Some(x) => x,
    };
    let n = json_as(
        k,
        x,
        serde_json::Value::as_f64,
        &format!("a number {range}"),
    )?;
    if !n.is_finite() || !ok(n) {
        // As written in the file (1e308, not 309 digits).
        return Err(format!("'{k}' is {x}, expected a number {range}"));
    }
    Ok(n)
}

/// `x` (the value of `k` in config.json) as the type `conv` reads, or the error that says what
/// it is instead.
/// A string key, `default` when absent; any other JSON type is an error naming the key.
fn text_or<'a>(
    v: &'a serde_json::Value,
    k: &str,
    default: &'a str,
) -> std::result::Result<&'a str, String> {
    match &v[k] {
        serde_json::Value::Null => Ok(default),
        serde_json::Value::String(s) => Ok(s.as_str()),
        other => Err(format!(
            "'{k}' is {other} (a {}), expected a string such as \"{default}\"",
            crate::base::fsguard::json_kind(other)
        )),
    }
}

/// The count under `k`, `default` when absent or null; refused unless 1 to `limit`.
pub(super) fn count_or(
    v: &serde_json::Value,
    k: &str,
    default: usize,
    limit: u64,
) -> std::result::Result<usize, String> {
    match v.get(k) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(x) => {
            let n = json_as(k, x, serde_json::Value::as_u64, "a positive integer")?;
            if n == 0 || n > limit {
                return Err(format!("'{k}' is {n}, expected 1 to {limit}"));
            }
            Ok(n as usize)
        }
    }
}

fn json_as<T>(
    k: &str,
    x: &serde_json::Value,
    conv: impl Fn(&serde_json::Value) -> Option<T>,
    expected: &str,
) -> std::result::Result<T, String> {
    conv(x).ok_or_else(|| {
        format!(
            "'{k}' is {x} (a {}), expected {expected}",
            crate::base::fsguard::json_kind(x)
        )
    })
}

#[cfg(test)]
mod tests {
    fn llama_json(rope_scaling: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5, "max_position_embeddings": 40960, "rope_scaling": rope_scaling,
        })
    }

    /// vLLM's derived length (`_get_and_verify_max_len`, 0.19.0 config/model.py L2098-2128):
    /// YaRN from its original length times the factor (Qwen3's instructions: 32768 · 4),
    /// linear and dynamic the positions times the factor, Llama 3 not scaled; and the cache
    /// `get_rope` builds for each.
    #[test]
    fn rope_scaling_sets_the_derived_length_and_the_cache() {
        let yarn = super::ModelConfig::from_hf_json(&llama_json(serde_json::json!({
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768
        })))
        .unwrap();
        assert_eq!(yarn.derived_max_model_len(), 131072);
        let r = yarn.rope_scaling.as_ref().unwrap();
        assert_eq!(r.cache_rows(40960), 131072);
        assert_eq!((r.beta_fast, r.beta_slow, r.attn_factor), (32.0, 1.0, 1.0));
        // yarn_get_mscale(4) = 0.1 · ln 4 + 1.
        assert!((r.mscale() - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
        let old = super::ModelConfig::from_hf_json(&llama_json(serde_json::json!({
            "type": "linear", "factor": 2.0
        })))
        .unwrap();
        assert_eq!(old.derived_max_model_len(), 81920);
        assert_eq!(old.layer_rope(0), (500000.0, 2.0));
        let l3 = super::ModelConfig::from_hf_json(&llama_json(serde_json::json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        })))
        .unwrap();
        assert_eq!(l3.derived_max_model_len(), 40960);
        assert_eq!(l3.rope_scaling.as_ref().unwrap().cache_rows(40960), 40960);
        let plain = super::ModelConfig::from_hf_json(&llama_json(serde_json::Value::Null)).unwrap();
        assert_eq!(
            (plain.rope_scaling.clone(), plain.derived_max_model_len()),
            (None, 40960)
        );
        // transformers 5's form: the base inside rope_parameters, "default" no scaling.
        let mut v5 = llama_json(serde_json::Value::Null);
        let o = v5.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "default", "rope_theta": 1e6}),
        );
        let c = super::ModelConfig::from_hf_json(&v5).unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling), (1e6, None));
    }

    /// Llama 3's frequencies, written out from llama3_rope.py (0.19) for Llama 3.1's
    /// settings: the fastest pair keeps its frequency, the slowest is divided by 8, a pair in
    /// the band is blended; YaRN's interpolated pairs are divided by the factor.
    #[test]
    fn scaled_frequencies_follow_each_type() {
        let l3 = super::RopeScaling {
            rope_type: "llama3".into(),
            factor: 8.0,
            original_max_position_embeddings: 8192,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attn_factor: 1.0,
            truncate: true,
        };
        let f = l3.inv_freq(128, 500000.0);
        let plain = |i: usize| 1.0 / 500000f64.powf(2.0 * i as f64 / 128.0);
        assert_eq!(f[0], plain(0));
        assert!((f[63] - plain(63) / 8.0).abs() < 1e-20);
        // Pair 40: wavelength 2π / 500000^(-80/128) ≈ 22,000 > 8192: divided by 8. Pair 30:
        // ≈ 2,900, between 2048 and 8192: blended with smooth (8192 / λ − 1) / 3.
        assert!((f[40] - plain(40) / 8.0).abs() < 1e-20);
        let lam = 2.0 * std::f64::consts::PI / plain(30);
        assert!(lam > 2048.0 && lam < 8192.0, "{lam}");
        let smooth = (8192.0 / lam - 1.0) / 3.0;
        let want = (1.0 - smooth) * plain(30) / 8.0 + smooth * plain(30);
        assert!((f[30] - want).abs() < 1e-18);
        let dynamic = super::RopeScaling {
            rope_type: "dynamic".into(),
            ..l3.clone()
        };
        // DynamicNTKScalingRotaryEmbedding: base · (8·8 − 8 + 1)^(128/126).
        let b = 500000.0 * 57f64.powf(128.0 / 126.0);
        assert!((dynamic.inv_freq(128, 500000.0)[1] - 1.0 / b.powf(2.0 / 128.0)).abs() < 1e-15);
        let yarn = super::RopeScaling {
            rope_type: "yarn".into(),
            factor: 4.0,
            original_max_position_embeddings: 32768,
            ..l3
        };
        let y = yarn.inv_freq(128, 1e6);
        let p = |i: usize| 1.0 / 1e6f64.powf(2.0 * i as f64 / 128.0);
        assert_eq!(y[0], p(0));
        assert!((y[63] - p(63) / 4.0).abs() < 1e-20);
    }

    /// A rope scaling vLLM builds but vramscope does not is refused by name.
    #[test]
    fn other_rope_scalings_are_named() {
        let e = super::ModelConfig::from_hf_json(&llama_json(serde_json::json!({
            "rope_type": "longrope", "factor": 4.0
        })))
        .unwrap_err();
        assert_eq!(
            e,
            "rope_scaling 'longrope' is not supported for llama yet (linear, dynamic, yarn and llama3 are)"
        );
        let e = super::ModelConfig::from_hf_json(&llama_json(serde_json::json!({
            "rope_type": "yarn"
        })))
        .unwrap_err();
        assert_eq!(
            e,
            "rope_scaling 'yarn' needs a number 'factor' (it has none)"
        );
    }

    /// Phi-3: fused checkpoint names; LongRoPE and a partial rotary factor refused by name.
    #[test]
    fn phi3_reads_with_fused_names_and_refuses_longrope() {
        let base = serde_json::json!({
            "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 32,
            "vocab_size": 32064, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096, "rope_scaling": null,
        });
        let c = ModelConfig::from_hf_json(&base).unwrap();
        assert!(c.fused_checkpoint() && !c.attention_bias && c.head_dim == 96);
        let names: Vec<String> = c.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"model.layers.1.self_attn.qkv_proj.weight".to_string()));
        assert!(names.contains(&"model.layers.0.mlp.gate_up_proj.weight".to_string()));
        assert!(!names.iter().any(|n| n.ends_with("q_proj.weight")
            || n.ends_with("up_proj.weight") && !n.ends_with("gate_up_proj.weight")));
        assert_eq!(c.loader_reads(), c.tensor_shapes().len() + 3 * 2);
        let mut long = base.clone();
        long["rope_scaling"] =
            serde_json::json!({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]});
        let e = ModelConfig::from_hf_json(&long).unwrap_err();
        assert!(
            e.contains("rope_scaling 'longrope'") && e.contains("not supported"),
            "{e}"
        );
        let mut partial = base.clone();
        partial["partial_rotary_factor"] = serde_json::json!(0.75);
        let e = ModelConfig::from_hf_json(&partial).unwrap_err();
        assert!(e.contains("partial_rotary_factor 0.75"), "{e}");
        // gen-model's config.json reads back as the same shape.
        let back = ModelConfig::from_hf_json(&c.to_hf_json("float16")).unwrap();
        assert_eq!(back.tensor_shapes(), c.tensor_shapes());
    }

    use super::*;

    /// google/gemma-2-9b's config.json (the keys that shape the model).
    fn gemma2_9b() -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
            "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
            "vocab_size": 256000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
            "sliding_window": 4096, "attention_bias": false
        })
    }

    #[test]
    fn gemma2_reads_as_its_preset_with_the_window_on_even_layers() {
        let c = ModelConfig::from_hf_json(&gemma2_9b()).unwrap();
        assert!(c.tie_word_embeddings && c.head_dim == 256 && c.is_gemma());
        let m0 = c.score_mods(0);
        assert_eq!(m0.window, Some(4096));
        assert_eq!(c.score_mods(1).window, None);
        assert_eq!(m0.softcap, Some(50.0));
        assert_eq!(m0.scale, Some(1.0 / 16.0));
        assert_eq!(c.final_logit_softcap(), Some(30.0));
        assert_eq!(c.layer_rope(1), (10000.0, 1.0));
        // Four norms a layer, no q/k norm.
        let names: Vec<String> = c.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"model.layers.41.pre_feedforward_layernorm.weight".into()));
        assert!(names.contains(&"model.layers.0.post_feedforward_layernorm.weight".into()));
        assert!(!names
            .iter()
            .any(|n| n.contains("q_norm") || n == "lm_head.weight"));
        // Left out, the soft-caps and window take Gemma2Config's defaults; null removes them.
        let mut v = gemma2_9b();
        let o = v.as_object_mut().unwrap();
        for k in [
            "attn_logit_softcapping",
            "final_logit_softcapping",
            "sliding_window",
            "head_dim",
        ] {
            o.remove(k);
        }
        let d = ModelConfig::from_hf_json(&v).unwrap();
        assert_eq!(d, c);
        v["final_logit_softcapping"] = serde_json::Value::Null;
        v["sliding_window"] = serde_json::Value::Null;
        let n = ModelConfig::from_hf_json(&v).unwrap();
        assert_eq!(
            (n.final_logit_softcap(), n.score_mods(0).window),
            (None, None)
        );
        let back = ModelConfig::from_hf_json(&c.to_hf_json("bfloat16")).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn gemma_keys_must_hold_their_types_and_supported_values() {
        let with = |k: &str, x: serde_json::Value| {
            let mut v = gemma2_9b();
            v[k] = x;
            ModelConfig::from_hf_json(&v)
        };
        assert_eq!(
            with("query_pre_attn_scalar", "256".into()).unwrap_err(),
            "'query_pre_attn_scalar' is \"256\" (a string), expected a number above 0 and at most 1e9"
        );
        assert_eq!(
            with("attn_logit_softcapping", 0.into()).unwrap_err(),
            "'attn_logit_softcapping' is 0, expected a number above 0 and at most 1e9"
        );
        assert_eq!(
            with("sliding_window", 4.5.into()).unwrap_err(),
            "'sliding_window' is 4.5 (a number), expected a positive integer"
        );
        let e = with("hidden_activation", "gelu".into()).unwrap_err();
        assert!(
            e.starts_with("hidden_activation 'gelu' is not supported for gemma2"),
            "{e}"
        );
        let e = with("hidden_act", true.into()).unwrap_err();
        assert!(e.starts_with("'hidden_act' is true (a boolean)"), "{e}");
        let e = with("tie_word_embeddings", false.into()).unwrap_err();
        assert!(
            e.starts_with("tie_word_embeddings false is not supported for gemma2"),
            "{e}"
        );
        let e = with("attention_bias", true.into()).unwrap_err();
        assert!(e.starts_with("attention_bias true is not supported"), "{e}");
        let e = with(
            "rope_scaling",
            serde_json::json!({"rope_type": "linear", "factor": 2.0}),
        )
        .unwrap_err();
        assert!(
            e.starts_with("rope_scaling 'linear' is not supported for gemma2"),
            "{e}"
        );
        let e = with("layer_types", serde_json::json!(["full_attention"])).unwrap_err();
        assert_eq!(e, "'layer_types' lists 1 layers, num_hidden_layers is 42");
    }

    fn gemma3_12b_text() -> serde_json::Value {
        serde_json::json!({
            "model_type": "gemma3_text", "hidden_size": 3840, "intermediate_size": 15360,
            "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 8,
            "head_dim": 256, "vocab_size": 262208, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "query_pre_attn_scalar": 256, "sliding_window": 1024,
            "sliding_window_pattern": 6, "final_logit_softcapping": null,
            "attn_logit_softcapping": null, "hidden_activation": "gelu_pytorch_tanh"
        })
    }

    #[test]
    fn gemma3_slides_five_layers_of_six_with_a_local_rotary_base() {
        let c = ModelConfig::from_hf_json(&gemma3_12b_text()).unwrap();
        let sliding: Vec<bool> = (0..12).map(|l| c.score_mods(l).window.is_some()).collect();
        assert_eq!(
            sliding,
            [true, true, true, true, true, false, true, true, true, true, true, false]
        );
        assert_eq!(c.layer_rope(0), (10000.0, 1.0));
        assert_eq!(c.layer_rope(5), (1e6, 8.0));
        assert_eq!(
            (c.score_mods(0).softcap, c.final_logit_softcap()),
            (None, None)
        );
        assert!(c.qk_norm());
        let names: Vec<String> = c.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"model.layers.47.self_attn.k_norm.weight".into()));
        // `layer_types` written out (transformers 4.53 on) must match the pattern.
        let mut v = gemma3_12b_text();
        v["layer_types"] = c.to_hf_json("bfloat16")["layer_types"].clone();
        assert_eq!(ModelConfig::from_hf_json(&v).unwrap(), c);
        let mut types = v["layer_types"].clone();
        types[0] = "full_attention".into();
        v["layer_types"] = types;
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(
            e.starts_with("'layer_types' is not one global layer every 1"),
            "{e}"
        );
        // vLLM's Gemma 3 ignores an attention soft-cap that transformers would apply.
        let mut v = gemma3_12b_text();
        v["attn_logit_softcapping"] = 50.0.into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(
            e.starts_with("attn_logit_softcapping 50 is not supported for gemma3_text"),
            "{e}"
        );
        // Gemma3MLP reads hidden_activation only.
        let mut v = gemma3_12b_text();
        v["hidden_act"] = "gelu".into();
        assert_eq!(ModelConfig::from_hf_json(&v).unwrap(), c);
        let mut v = gemma3_12b_text();
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 8.0});
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.starts_with("rope_scaling 'yarn' is not supported"), "{e}");
        let back = ModelConfig::from_hf_json(&c.to_hf_json("bfloat16")).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn the_multimodal_gemma3_config_reads_its_text_model_and_its_tower() {
        let v = serde_json::json!({
            "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
            "text_config": gemma3_12b_text(), "vision_config": {"model_type": "siglip_vision_model"}
        });
        // SiglipVisionConfig defaults to a pooling head Gemma 3 has not: refused by name.
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("vision_use_head"), "{e}");
        let mut v = v;
        v["vision_config"]["vision_use_head"] = false.into();
        // SiglipVisionConfig's 224-pixel images in 14 × 14 patches do not pool to 16 × 16.
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("mm_tokens_per_image 256"), "{e}");
        v["vision_config"]["image_size"] = 896.into();
        v["vision_config"]["patch_size"] = 14.into();
        let c = ModelConfig::from_hf_json(&v).unwrap();
        assert_eq!(c.arch, "gemma3_text");
        let text = ModelConfig::from_hf_json(&gemma3_12b_text()).unwrap();
        assert_eq!(
            ModelConfig {
                gemma3_mm: None,
                mistral3: None,
                qwen2_5_vl: None,
                llava_next: None,
                kimi_vl: None,
                ..c.clone()
            },
            text
        );
        assert_eq!(c.gemma3_mm.unwrap().vision.num_patches(), 4096);
    }

    fn base() -> serde_json::Value {
        serde_json::json!({
            "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 16
        })
    }

    fn with(k: &str, x: serde_json::Value) -> std::result::Result<ModelConfig, String> {
        let mut v = base();
        v[k] = x;
        ModelConfig::from_hf_json(&v)
    }

    #[test]
    fn a_word_for_a_boolean_is_an_error_not_false() {
        assert_eq!(
            with("tie_word_embeddings", "yes".into()).unwrap_err(),
            "'tie_word_embeddings' is \"yes\" (a string), expected true or false"
        );
        assert!(
            with("tie_word_embeddings", true.into())
                .unwrap()
                .tie_word_embeddings
        );
    }

    #[test]
    fn rms_norm_eps_must_be_small_and_positive() {
        for bad in [0.0, -1e-6, 1e308] {
            let e = with("rms_norm_eps", bad.into()).unwrap_err();
            assert!(e.starts_with("'rms_norm_eps' is "), "{e}");
            assert!(e.ends_with("expected a number above 0 and below 1"), "{e}");
        }
        assert_eq!(
            with("rms_norm_eps", 1e-5.into()).unwrap().rms_norm_eps,
            1e-5
        );
    }

    #[test]
    fn rope_theta_must_be_a_base_above_one() {
        assert_eq!(
            with("rope_theta", 0.into()).unwrap_err(),
            "'rope_theta' is 0, expected a number above 1 and at most 1e12"
        );
        assert!(with("rope_theta", (-5.0).into()).is_err());
        assert!(with("rope_theta", "big".into()).is_err());
    }

    #[test]
    fn a_float_where_an_integer_belongs_says_so() {
        assert_eq!(
            with("hidden_size", 8.5.into()).unwrap_err(),
            "'hidden_size' is 8.5 (a number), expected a positive integer"
        );
        assert_eq!(
            with("num_hidden_layers", 0.into()).unwrap_err(),
            "'num_hidden_layers' is 0, expected 1 to 1024"
        );
    }

    #[test]
    fn a_json_array_or_a_session_is_not_called_an_unsupported_model_type() {
        let e = ModelConfig::from_hf_json(&serde_json::json!([1, 2])).unwrap_err();
        assert!(
            e.starts_with("holds a JSON array, expected an object"),
            "{e}"
        );
        let e =
            ModelConfig::from_hf_json(&serde_json::json!({"format": 3, "events": []})).unwrap_err();
        assert!(e.starts_with("model_type is missing"), "{e}");
    }
}

/// What a Qwen3-Next decoder has beyond the Llama fields (Hugging Face `Qwen3NextConfig`;
/// vLLM's qwen3_next.py reads the same keys, 0.10.2 L183-320 for the Gated DeltaNet, L622-700
/// for the gated attention): which layers are full attention, the linear-attention heads and
/// the partial rotary factor. Layers not listed as full are Gated DeltaNet layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qwen3NextShape {
    /// `layer_types[l] == "full_attention"` for each layer (from `full_attention_interval`
    /// when the config has no `layer_types`: every `interval`-th layer).
    pub full_attention: Vec<bool>,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    /// The share of each attention head the rotary embedding turns (0.25 published).
    pub partial_rotary_factor: f64,
}

impl Qwen3NextShape {
    /// `key_dim`: the query's (and the key's) width, all key heads.
    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    /// `value_dim`: the value's (and z's) width, all value heads.
    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// `conv_dim = key_dim · 2 + value_dim`: the channels the causal convolution mixes.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    pub fn is_full(&self, layer: usize) -> bool {
        self.full_attention.get(layer).copied().unwrap_or(false)
    }

    /// Full-attention layers and Gated DeltaNet layers.
    pub fn layer_counts(&self) -> (usize, usize) {
        let full = self.full_attention.iter().filter(|&&f| f).count();
        (full, self.full_attention.len() - full)
    }

    /// One sequence's state elements on a rank of `tp`: the conv state
    /// `(kernel − 1, conv_dim / tp)` and the recurrent state `(v_heads / tp, k_dim, v_dim)`
    /// (`MambaStateShapeCalculator.gated_delta_net_state_shape`, 0.10.2
    /// layers/mamba/mamba_utils.py L177-202, V1 layout; no speculative tokens).
    pub fn state_elements(&self, tp: usize) -> (u64, u64) {
        let tp = tp.max(1);
        let conv = (self.linear_conv_kernel_dim - 1) * (self.conv_dim() / tp);
        let ssm = (self.linear_num_value_heads / tp)
            * self.linear_key_head_dim
            * self.linear_value_head_dim;
        (conv as u64, ssm as u64)
    }
}

impl ModelConfig {
    /// A `Qwen3NextConfig` as vLLM's qwen3_next.py reads it (0.10.2, 0.11.0, 0.19.0), with
    /// Hugging Face's defaults for the keys a config leaves out. The rotary base and partial
    /// factor are read at the top level (the published config.json) or from
    /// `rope_parameters` (transformers 5).
    fn qwen3_next_from_hf_json(
        v: &serde_json::Value,
        hidden_size: usize,
        get: &dyn Fn(&str) -> std::result::Result<usize, String>,
    ) -> std::result::Result<Self, String> {
        let or = |k: &str, default: usize| {
            if v[k].is_null() {
                Ok(default)
            } else {
                get(k)
            }
        };
        let num_layers = get("num_hidden_layers")?;
        let num_heads = get("num_attention_heads")?;
        let num_kv_heads = or("num_key_value_heads", 2)?;
        if num_heads % num_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            ));
        }
        let head_dim = or("head_dim", 256)?;
        let act = text_or(v, "hidden_act", "silu")?;
        if act != "silu" {
            return Err(format!(
                "hidden_act '{act}' is not supported for qwen3_next (expected silu)"
            ));
        }
        if boolean(v, "attention_bias", false)? {
            return Err(
                "attention_bias true is not supported for qwen3_next (vLLM's qwen3_next.py makes qkv_proj without a bias)"
                    .into(),
            );
        }
        if let Some(rs) = v.get("rope_scaling").filter(|r| !r.is_null()) {
            return Err(format!(
                "rope_scaling {rs} is not supported for qwen3_next yet (only the plain partial rotary embedding)"
            ));
        }
        let rope = v.get("rope_parameters").filter(|r| r.is_object());
        if let Some(kind) = rope.and_then(|r| r["rope_type"].as_str()) {
            if kind != "default" {
                return Err(format!(
                    "rope_parameters.rope_type '{kind}' is not supported for qwen3_next yet (only default)"
                ));
            }
        }
        let from_rope = |k: &str| rope.map(|r| r[k].clone()).filter(|x| !x.is_null());
        let top_or_rope = |k: &str| -> serde_json::Value {
            let mut o = serde_json::Map::new();
            if let Some(x) = v.get(k).filter(|x| !x.is_null()).cloned().or(from_rope(k)) {
                o.insert(k.into(), x);
            }
            serde_json::Value::Object(o)
        };
        let rope_theta = float(
            &top_or_rope("rope_theta"),
            "rope_theta",
            10000.0,
            |x| x > 1.0 && x <= 1e12,
            "above 1 and at most 1e12",
        )?;
        let partial_rotary_factor = float(
            &top_or_rope("partial_rotary_factor"),
            "partial_rotary_factor",
            0.25,
            |x| x > 0.0 && x <= 1.0,
            "above 0 and at most 1",
        )?;
        let rotary = (head_dim as f64 * partial_rotary_factor) as usize;
        if rotary == 0 || !rotary.is_multiple_of(2) {
            return Err(format!(
                "partial_rotary_factor {partial_rotary_factor} of head_dim {head_dim} turns {rotary} dimensions: expected an even number above 0"
            ));
        }
        let full_attention: Vec<bool> = match v.get("layer_types").filter(|x| !x.is_null()) {
            Some(serde_json::Value::Array(a)) => {
                if a.len() != num_layers {
                    return Err(format!(
                        "layer_types lists {} layers, num_hidden_layers is {num_layers}",
                        a.len()
                    ));
                }
                a.iter()
                    .map(|t| match t.as_str() {
                        Some("full_attention") => Ok(true),
                        Some("linear_attention") => Ok(false),
                        _ => Err(format!(
                            "layer_types holds {t}, expected \"full_attention\" or \"linear_attention\""
                        )),
                    })
                    .collect::<std::result::Result<_, _>>()?
            }
            Some(other) => {
                return Err(format!(
                    "'layer_types' is {other}, expected a list of layer kinds"
                ))
            }
            None => {
                // Qwen3NextConfig (transformers 4.57): every `full_attention_interval`-th
                // layer is full attention.
                let interval = or("full_attention_interval", 4)?;
                (0..num_layers).map(|l| (l + 1) % interval == 0).collect()
            }
        };
        let shape = Qwen3NextShape {
            full_attention,
            linear_num_key_heads: or("linear_num_key_heads", 16)?,
            linear_num_value_heads: or("linear_num_value_heads", 32)?,
            linear_key_head_dim: or("linear_key_head_dim", 128)?,
            linear_value_head_dim: or("linear_value_head_dim", 128)?,
            linear_conv_kernel_dim: or("linear_conv_kernel_dim", 4)?,
            partial_rotary_factor,
        };
        if shape.linear_conv_kernel_dim < 2
            || !shape
                .linear_num_value_heads
                .is_multiple_of(shape.linear_num_key_heads)
        {
            return Err(format!(
                "linear_conv_kernel_dim {} (at least 2) and linear_num_value_heads {} (a multiple of linear_num_key_heads {}) do not fit",
                shape.linear_conv_kernel_dim,
                shape.linear_num_value_heads,
                shape.linear_num_key_heads
            ));
        }
        let num_experts = if v["num_experts"] == serde_json::json!(0) {
            0
        } else {
            or("num_experts", 512)?
        };
        let moe = if num_experts == 0 {
            None
        } else {
            let top_k = or("num_experts_per_tok", 10)?;
            if top_k > num_experts {
                return Err(format!(
                    "num_experts_per_tok {top_k} is more than num_experts {num_experts}"
                ));
            }
            let mlp_only_layers = match v.get("mlp_only_layers").filter(|x| !x.is_null()) {
                None => Vec::new(),
                Some(x) => x
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|n| n.as_u64().map(|n| n as usize))
                            .collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| {
                        format!("'mlp_only_layers' is {x}, expected a list of layer indices")
                    })?,
            };
            Some(MoeShape {
                num_experts,
                top_k,
                expert_intermediate_size: or("moe_intermediate_size", 512)?,
                renormalize: boolean(v, "norm_topk_prob", true)?,
                decoder_sparse_step: or("decoder_sparse_step", 1)?,
                mlp_only_layers,
                shared_expert_intermediate_size: if v["shared_expert_intermediate_size"]
                    == serde_json::json!(0)
                {
                    0
                } else {
                    or("shared_expert_intermediate_size", 512)?
                },
            })
        };
        Ok(ModelConfig {
            rope_scaling: None,
            arch: "qwen3_next".into(),
            hidden_size,
            intermediate_size: or("intermediate_size", 5632)?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: or("vocab_size", 151936)?,
            rope_theta,
            rms_norm_eps: float(
                v,
                "rms_norm_eps",
                1e-6,
                |x| x > 0.0 && x < 1.0,
                "above 0 and below 1",
            )?,
            tie_word_embeddings: boolean(v, "tie_word_embeddings", false)?,
            attention_bias: false,
            max_position_embeddings: or("max_position_embeddings", 32768)?,
            opt: None,
            phi: None,
            gemma: None,
            moe,
            granite: None,
            deepseek: None,
            gpt_oss: None,
            llama4: None,
            qwen3_next: Some(shape),
            gemma3_mm: None,
            mistral3: None,
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
        })
    }

    /// Qwen3-Next's tensors as the published checkpoints name them (Qwen/Qwen3-Next-80B-A3B-
    /// Instruct's index): per layer `linear_attn.*` (in_proj_qkvz, in_proj_ba, conv1d `[C, 1,
    /// K]`, dt_bias, A_log, norm, out_proj) or `self_attn.*` (q_proj holding each head's query
    /// and gate, k/v/o, q_norm, k_norm), the MLP or sparse block with its shared expert, two
    /// norms. The multi-token-prediction tensors (`mtp.*`) vLLM's main model skips (0.10.2
    /// qwen3_next.py L993-994) are not listed.
    fn qwen3_next_tensor_shapes(&self, q: &Qwen3NextShape) -> Vec<(String, Vec<usize>)> {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let hd = self.head_dim;
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            if q.is_full(l) {
                let a = format!("{p}.self_attn");
                out.push((
                    format!("{a}.q_proj.weight"),
                    vec![self.num_heads * hd * 2, h],
                ));
                out.push((
                    format!("{a}.k_proj.weight"),
                    vec![self.num_kv_heads * hd, h],
                ));
                out.push((
                    format!("{a}.v_proj.weight"),
                    vec![self.num_kv_heads * hd, h],
                ));
                out.push((format!("{a}.o_proj.weight"), vec![h, self.num_heads * hd]));
                out.push((format!("{a}.q_norm.weight"), vec![hd]));
                out.push((format!("{a}.k_norm.weight"), vec![hd]));
            } else {
                let a = format!("{p}.linear_attn");
                let hv = q.linear_num_value_heads;
                out.push((
                    format!("{a}.in_proj_qkvz.weight"),
                    vec![2 * q.key_dim() + 2 * q.value_dim(), h],
                ));
                out.push((format!("{a}.in_proj_ba.weight"), vec![2 * hv, h]));
                out.push((
                    format!("{a}.conv1d.weight"),
                    vec![q.conv_dim(), 1, q.linear_conv_kernel_dim],
                ));
                out.push((format!("{a}.dt_bias"), vec![hv]));
                out.push((format!("{a}.A_log"), vec![hv]));
                out.push((format!("{a}.norm.weight"), vec![q.linear_value_head_dim]));
                out.push((format!("{a}.out_proj.weight"), vec![h, q.value_dim()]));
            }
            let mlp = |out: &mut Vec<(String, Vec<usize>)>, x: String, w: usize| {
                out.push((format!("{x}.gate_proj.weight"), vec![w, h]));
                out.push((format!("{x}.up_proj.weight"), vec![w, h]));
                out.push((format!("{x}.down_proj.weight"), vec![h, w]));
            };
            match self.moe.as_ref().filter(|_| self.is_moe_layer(l)) {
                Some(m) => {
                    out.push((format!("{p}.mlp.gate.weight"), vec![m.num_experts, h]));
                    for e in 0..m.num_experts {
                        mlp(
                            &mut out,
                            format!("{p}.mlp.experts.{e}"),
                            m.expert_intermediate_size,
                        );
                    }
                    if m.shared_expert_intermediate_size > 0 {
                        mlp(
                            &mut out,
                            format!("{p}.mlp.shared_expert"),
                            m.shared_expert_intermediate_size,
                        );
                        out.push((format!("{p}.mlp.shared_expert_gate.weight"), vec![1, h]));
                    }
                }
                None => mlp(&mut out, format!("{p}.mlp"), i),
            }
            out.push((format!("{p}.input_layernorm.weight"), vec![h]));
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }

    /// The keys of Qwen/Qwen3-Next-80B-A3B-Instruct's config.json, with the interleaving
    /// also written as `layer_types` and the rotary keys as transformers 5's
    /// `rope_parameters`.
    fn qwen3_next_hf_json(&self, q: &Qwen3NextShape, torch_dtype: &str) -> serde_json::Value {
        let m = self.moe.as_ref();
        let layer_types: Vec<&str> = q
            .full_attention
            .iter()
            .map(|&f| {
                if f {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        serde_json::json!({
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "partial_rotary_factor": q.partial_rotary_factor,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": q.partial_rotary_factor,
            },
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": false,
            "hidden_act": "silu",
            "layer_types": layer_types,
            "linear_num_key_heads": q.linear_num_key_heads,
            "linear_num_value_heads": q.linear_num_value_heads,
            "linear_key_head_dim": q.linear_key_head_dim,
            "linear_value_head_dim": q.linear_value_head_dim,
            "linear_conv_kernel_dim": q.linear_conv_kernel_dim,
            "num_experts": m.map_or(0, |m| m.num_experts),
            "num_experts_per_tok": m.map_or(1, |m| m.top_k),
            "moe_intermediate_size": m.map_or(1, |m| m.expert_intermediate_size),
            "shared_expert_intermediate_size": m.map_or(0, |m| m.shared_expert_intermediate_size),
            "norm_topk_prob": m.is_none_or(|m| m.renormalize),
            "decoder_sparse_step": m.map_or(1, |m| m.decoder_sparse_step),
            "mlp_only_layers": m.map_or(Vec::new(), |m| m.mlp_only_layers.clone()),
            "torch_dtype": torch_dtype,
        })
    }
}

//! gpt-oss's config (`model_type: "gpt_oss"`, Hugging Face `GptOssConfig`, configuration_gpt_oss.py
//! at transformers 5.25; vLLM 0.11.0 and 0.19.0 model_executor/models/gpt_oss.py read the same
//! keys): its tensors as the published checkpoints name them, and the config.json written for
//! a generated one.

use serde::{Deserialize, Serialize};

use super::{boolean, deepseek_yarn, float, json_as, ModelConfig, MoeShape, YarnScaling};

/// What a gpt-oss decoder has beyond the Llama fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptOssShape {
    /// Keys a sliding layer's query sees: itself and the `sliding_window − 1` before it.
    pub sliding_window: usize,
    /// YaRN over `rope_theta` (vLLM passes `rope_type: "yarn"` whatever the config says:
    /// 0.19 gpt_oss.py L83-99).
    pub yarn: YarnScaling,
    /// `rope_scaling.truncate`: the correction range's ends rounded to whole dimensions.
    /// gpt-oss ships `false`; 0.19 passes it on (L96), 0.11.0's YaRN always truncates.
    pub truncate: bool,
    /// The experts' activation: `gate · sigmoid(α · gate) · (up + 1)` with gate clamped
    /// above at `limit` and up to ±`limit` (vLLM's `swigluoai`; α 1.702, limit 7.0).
    pub swiglu_alpha: f64,
    pub swiglu_limit: f64,
    /// `quantization_config.quant_method: "mxfp4"`: the experts stored as `*_blocks` (two
    /// e2m1 codes a byte) and `*_scales` (one e8m0 exponent per 32 values).
    pub mxfp4: bool,
}

/// MXFP4's block: one scale per 32 values (`OCP_MX_BLOCK_SIZE`).
pub const MX_BLOCK: usize = 32;

impl GptOssShape {
    /// vLLM's rule (0.11.0 and 0.19 gpt_oss.py: `sliding_window if layer_idx % 2 == 0`): the
    /// even layers slide. `layer_types` must say the same (checked when read).
    pub fn is_sliding(&self, layer: usize) -> bool {
        layer.is_multiple_of(2)
    }
}

impl ModelConfig {
    /// A `GptOssConfig` as vLLM's gpt_oss.py reads it, with Hugging Face's defaults for the
    /// keys a config leaves out. vLLM hard-codes what transformers reads from the config
    /// (RMSNorm eps 1e-5, every even layer sliding, biases on q/k/v/o, the swiglu constants):
    /// a config that says otherwise would run differently in the two and is refused by key.
    pub(super) fn gpt_oss_from_hf_json(
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
        let num_kv_heads = or("num_key_value_heads", num_heads)?;
        if num_heads % num_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            ));
        }
        let head_dim = or("head_dim", hidden_size / num_heads)?;
        if head_dim % 2 != 0 {
            return Err(format!(
                "head_dim {head_dim} must be even for rotary embeddings"
            ));
        }
        let intermediate_size = get("intermediate_size")?;
        let num_experts = or("num_local_experts", 128)?;
        let top_k = or("num_experts_per_tok", 4)?;
        if top_k > num_experts {
            return Err(format!(
                "num_experts_per_tok {top_k} is above num_local_experts {num_experts}"
            ));
        }
        let sliding_window = or("sliding_window", 128)?;
        if let Some(types) = v.get("layer_types").filter(|t| !t.is_null()) {
            let list = json_as(
                "layer_types",
                types,
                |x| x.as_array().cloned(),
                "a list of sliding_attention / full_attention",
            )?;
            if list.len() != num_layers {
                return Err(format!(
                    "layer_types has {} entries for num_hidden_layers {num_layers}",
                    list.len()
                ));
            }
            for (l, t) in list.iter().enumerate() {
                let want = if l % 2 == 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                };
                if t.as_str() != Some(want) {
                    return Err(format!(
                        "layer_types[{l}] is {t}, expected \"{want}\": vLLM's gpt_oss.py slides the even layers whatever layer_types says"
                    ));
                }
            }
        }
        if !boolean(v, "attention_bias", true)? {
            return Err(
                "attention_bias false is not supported for gpt_oss: vLLM's gpt_oss.py always makes q/k/v/o biases"
                    .into(),
            );
        }
        if boolean(v, "tie_word_embeddings", false)? {
            return Err(
                "tie_word_embeddings true is not supported for gpt_oss (vLLM's gpt_oss.py always makes its own lm_head)"
                    .into(),
            );
        }
        let eps = float(
            v,
            "rms_norm_eps",
            1e-5,
            |x| x > 0.0 && x < 1.0,
            "above 0 and below 1",
        )?;
        if eps != 1e-5 {
            return Err(format!(
                "rms_norm_eps {eps} is not supported for gpt_oss: vLLM's gpt_oss.py builds every RMSNorm with eps 1e-5"
            ));
        }
        let swiglu_alpha = float(v, "swiglu_alpha", 1.702, |x| x == 1.702, "1.702")
            .map_err(|e| format!("{e} (vLLM's swigluoai kernel fixes alpha)"))?;
        let swiglu_limit = float(
            v,
            "swiglu_limit",
            7.0,
            |x| x > 0.0 && x.is_finite(),
            "above 0",
        )?;
        // The rotary embedding: `rope_scaling` (4.55 configs) or `rope_parameters` (5.x),
        // YaRN with gpt-oss's defaults where a key is left out.
        let rs = match (&v["rope_scaling"], &v["rope_parameters"]) {
            (serde_json::Value::Null, p) => p,
            (s, _) => s,
        };
        let kind = rs
            .get("rope_type")
            .or_else(|| rs.get("type"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("yarn");
        if kind != "yarn" {
            return Err(format!(
                "rope_scaling '{kind}' is not supported for gpt_oss (vLLM's gpt_oss.py always builds YaRN)"
            ));
        }
        let yarn_in = serde_json::json!({
            "rope_scaling": {
                "type": "yarn",
                "factor": rs.get("factor").cloned().unwrap_or(32.0.into()),
                "original_max_position_embeddings": rs
                    .get("original_max_position_embeddings")
                    .cloned()
                    .unwrap_or(4096.into()),
                "beta_fast": rs.get("beta_fast").cloned().unwrap_or(32.0.into()),
                "beta_slow": rs.get("beta_slow").cloned().unwrap_or(1.0.into()),
            }
        });
        let yarn = deepseek_yarn(&yarn_in)?.ok_or("rope_scaling: no YaRN factor")?;
        let truncate = boolean(rs, "truncate", true)?;
        let rope_theta = match rs.get("rope_theta").filter(|t| !t.is_null()) {
            Some(_) => float(
                rs,
                "rope_theta",
                150000.0,
                |x| x > 1.0 && x <= 1e12,
                "above 1 and at most 1e12",
            )?,
            None => float(
                v,
                "rope_theta",
                150000.0,
                |x| x > 1.0 && x <= 1e12,
                "above 1 and at most 1e12",
            )?,
        };
        let mxfp4 = match v.get("quantization_config").filter(|q| !q.is_null()) {
            None => false,
            Some(q) => match q.get("quant_method").and_then(serde_json::Value::as_str) {
                Some("mxfp4") => true,
                other => {
                    return Err(format!(
                        "quantization_config quant_method {} is not supported for gpt_oss (expected mxfp4, as published, or none)",
                        other.map_or("missing".to_string(), |m| format!("'{m}'"))
                    ))
                }
            },
        };
        if mxfp4
            && (!hidden_size.is_multiple_of(MX_BLOCK)
                || !intermediate_size.is_multiple_of(MX_BLOCK))
        {
            return Err(format!(
                "hidden_size {hidden_size} and intermediate_size {intermediate_size} must be multiples of {MX_BLOCK} for MXFP4 blocks"
            ));
        }
        Ok(ModelConfig {
            rope_scaling: None,
            arch: "gpt_oss".into(),
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: get("vocab_size")?,
            rope_theta,
            rms_norm_eps: eps,
            tie_word_embeddings: false,
            attention_bias: true,
            max_position_embeddings: or("max_position_embeddings", 131072)?,
            opt: None,
            phi: None,
            gemma: None,
            // GptOssMLP: a biased router, top-k then softmax over the k (vLLM's FusedMoE with
            // `renormalize=True`, the same weights), every layer sparse.
            moe: Some(MoeShape {
                num_experts,
                top_k,
                expert_intermediate_size: intermediate_size,
                renormalize: true,
                decoder_sparse_step: 1,
                mlp_only_layers: Vec::new(),
                shared_expert_intermediate_size: 0,
            }),
            granite: None,
            deepseek: None,
            llama4: None,
            qwen3_next: None,
            gemma3_mm: None,
            mistral3: None,
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
            gpt_oss: Some(GptOssShape {
                sliding_window,
                yarn,
                truncate,
                swiglu_alpha,
                swiglu_limit,
                mxfp4,
            }),
        })
    }

    /// The tensors of a gpt-oss checkpoint as openai/gpt-oss-20b's index names them (MXFP4
    /// experts) or as transformers saves an unquantized `GptOssForCausalLM` (`gate_up_proj`
    /// `[E, H, 2I]` with gate and up interleaved, `down_proj` `[E, I, H]`).
    pub(super) fn gpt_oss_tensor_shapes(&self, g: &GptOssShape) -> Vec<(String, Vec<usize>)> {
        let (h, i, v, q, kv) = (
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            self.q_dim(),
            self.kv_dim(),
        );
        let e = self.moe.as_ref().map_or(0, |m| m.num_experts);
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            out.push((format!("{p}.input_layernorm.weight"), vec![h]));
            for (n, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                out.push((format!("{a}.{n}.weight"), vec![rows, h]));
            }
            for (n, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                out.push((format!("{a}.{n}.bias"), vec![rows]));
            }
            out.push((format!("{a}.o_proj.weight"), vec![h, q]));
            out.push((format!("{a}.o_proj.bias"), vec![h]));
            out.push((format!("{a}.sinks"), vec![self.num_heads]));
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            let m = format!("{p}.mlp");
            out.push((format!("{m}.router.weight"), vec![e, h]));
            out.push((format!("{m}.router.bias"), vec![e]));
            let x = format!("{m}.experts");
            if g.mxfp4 {
                out.push((
                    format!("{x}.gate_up_proj_blocks"),
                    vec![e, 2 * i, h / MX_BLOCK, MX_BLOCK / 2],
                ));
                out.push((
                    format!("{x}.gate_up_proj_scales"),
                    vec![e, 2 * i, h / MX_BLOCK],
                ));
            } else {
                out.push((format!("{x}.gate_up_proj"), vec![e, h, 2 * i]));
            }
            out.push((format!("{x}.gate_up_proj_bias"), vec![e, 2 * i]));
            if g.mxfp4 {
                out.push((
                    format!("{x}.down_proj_blocks"),
                    vec![e, h, i / MX_BLOCK, MX_BLOCK / 2],
                ));
                out.push((format!("{x}.down_proj_scales"), vec![e, h, i / MX_BLOCK]));
            } else {
                out.push((format!("{x}.down_proj"), vec![e, i, h]));
            }
            out.push((format!("{x}.down_proj_bias"), vec![e, h]));
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        out.push(("lm_head.weight".to_string(), vec![v, h]));
        out
    }

    /// Bytes of the checkpoint's tensors: `*_blocks` and `*_scales` a byte an element, the
    /// rest 16-bit (what a model.safetensors.index.json's `total_size` counts).
    pub fn gpt_oss_checkpoint_bytes(&self) -> u64 {
        self.tensor_shapes()
            .iter()
            .map(|(n, s)| {
                let numel = s.iter().product::<usize>() as u64;
                if n.ends_with("_blocks") || n.ends_with("_scales") {
                    numel
                } else {
                    2 * numel
                }
            })
            .sum()
    }

    /// The keys of openai/gpt-oss-20b's config.json.
    pub(super) fn gpt_oss_hf_json(&self, g: &GptOssShape, torch_dtype: &str) -> serde_json::Value {
        let m = self.moe.as_ref();
        let layer_types: Vec<&str> = (0..self.num_layers)
            .map(|l| {
                if g.is_sliding(l) {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        let mut v = serde_json::json!({
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "num_local_experts": m.map(|m| m.num_experts),
            "num_experts_per_tok": m.map(|m| m.top_k),
            "experts_per_token": m.map(|m| m.top_k),
            "sliding_window": g.sliding_window,
            "layer_types": layer_types,
            "rope_theta": self.rope_theta,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": g.yarn.factor,
                "original_max_position_embeddings": g.yarn.original_max_position_embeddings,
                "beta_fast": g.yarn.beta_fast,
                "beta_slow": g.yarn.beta_slow,
                "truncate": g.truncate,
            },
            "swiglu_limit": g.swiglu_limit,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": true,
            "attention_dropout": 0.0,
            "tie_word_embeddings": false,
            "hidden_act": "silu",
            "output_router_logits": false,
            "torch_dtype": torch_dtype,
        });
        if g.mxfp4 {
            v.as_object_mut().expect("an object").insert(
                "quantization_config".into(),
                serde_json::json!({
                    "modules_to_not_convert": ["model.layers.*.self_attn",
                        "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
                    "quant_method": "mxfp4",
                }),
            );
        }
        v
    }
}

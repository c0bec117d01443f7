//! Llama-family shapes: from a Hugging Face `config.json` (llama, mistral, qwen2) or a preset.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Vocabulary rows as vLLM's VocabParallelEmbedding and ParallelLMHead allocate them (padded to 64).
    pub fn padded_vocab(&self) -> usize { self.vocab_size.div_ceil(64) * 64 }

    /// The tensors a checkpoint of this shape holds, in Hugging Face names, with shapes.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
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
            out.push((format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
            out.push((format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
            out.push((format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
            if self.attention_bias {
                out.push((format!("{p}.self_attn.q_proj.bias"), vec![q]));
                out.push((format!("{p}.self_attn.k_proj.bias"), vec![kv]));
                out.push((format!("{p}.self_attn.v_proj.bias"), vec![kv]));
            }
            out.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            out.push((format!("{p}.mlp.gate_proj.weight"), vec![i, h]));
            out.push((format!("{p}.mlp.up_proj.weight"), vec![i, h]));
            out.push((format!("{p}.mlp.down_proj.weight"), vec![h, i]));
        }
        out.push(("model.norm.weight".to_string(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, h]));
        }
        out
    }

    pub fn param_count(&self) -> u64 {
        self.tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::model(
                    path,
                    "config.json not found (it must sit beside the weights)",
                )
            } else {
                Error::io(path, e)
            }
        })?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::model(path, format!("not valid JSON: {e}")))?;
        Self::from_hf_json(&v).map_err(|problem| Error::model(path, problem))
    }

    pub fn from_hf_json(v: &serde_json::Value) -> std::result::Result<Self, String> {
        let arch = v["model_type"].as_str().unwrap_or("").to_string();
        if !matches!(arch.as_str(), "llama" | "mistral" | "qwen2") {
            return Err(format!(
                "model_type '{arch}' is not supported (expected llama, mistral or qwen2)"
            ));
        }
        let get = |k: &str| -> std::result::Result<usize, String> {
            let n = v[k]
                .as_u64()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("'{k}' is missing or not a positive integer"))?;
            // Far above any published model, low enough that no shape or count derived
            // from them can overflow or size a huge allocation.
            let limit: u64 = match k {
                "num_hidden_layers" | "num_attention_heads" | "num_key_value_heads" => 1 << 10,
                "head_dim" => 1 << 12,
                "hidden_size" => 1 << 17,
                "intermediate_size" => 1 << 19,
                _ => 1 << 23,
            };
            if n > limit {
                return Err(format!("'{k}' = {n} is implausibly large (limit {limit})"));
            }
            Ok(n as usize)
        };
        let hidden_size = get("hidden_size")?;
        let num_heads = get("num_attention_heads")?;
        let num_kv_heads = if v["num_key_value_heads"].is_null() {
            num_heads
        } else {
            get("num_key_value_heads")?
        };
        let head_dim = if v["head_dim"].is_null() {
            hidden_size / num_heads
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
        Ok(ModelConfig {
            hidden_size,
            intermediate_size: get("intermediate_size")?,
            num_layers: get("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: get("vocab_size")?,
            rope_theta: v["rope_theta"].as_f64().unwrap_or(10000.0),
            rms_norm_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
            attention_bias: v["attention_bias"].as_bool().unwrap_or(arch == "qwen2"),
            max_position_embeddings: v["max_position_embeddings"].as_u64().unwrap_or(4096) as usize,
            arch,
        })
    }

    /// The `config.json` a Hugging Face loader reads for this shape.
    pub fn to_hf_json(&self, torch_dtype: &str) -> serde_json::Value {
        let arch_class = match self.arch.as_str() {
            "mistral" => "MistralForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            _ => "LlamaForCausalLM",
        };
        serde_json::json!({
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
        })
    }
}

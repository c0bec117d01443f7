//! The registry, as vLLM's `model_executor/models/registry.py` maps `architectures` to a model
//! file: each `model_type` vramscope runs, the `architectures` name its checkpoints carry, the
//! vLLM file it follows, the vramscope file that composes it, and the twists that file reads
//! (which layer kinds, which checkpoint names). Model types vramscope knows but does not run
//! are listed too, each with what running it would need.
//!
//! Data only: it imports nothing, so `config` and the family files can both read it.

/// How a family's decoder is composed, one per vramscope family file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoder {
    /// `models/llama.rs`: pre-norm RMSNorm layers, fused add-norm in place, SiLU-gated MLP or
    /// a sparse MoE block (vLLM's `LlamaDecoderLayer` and the files built like it).
    Llama,
    /// `models/gemma.rs`: Gemma's `x · (1 + w)` norms as new tensors, four per layer, GeGLU,
    /// the embedding scaled by √hidden (vLLM's `Gemma2DecoderLayer`, `Gemma3DecoderLayer`).
    Gemma,
    /// `models/granite.rs`: Llama's layers with a plain RMSNorm into a new tensor for every
    /// norm and each branch scaled before its residual add (vLLM's `GraniteDecoderLayer`).
    Granite,
    /// `models/opt.rs`: LayerNorm with bias, learned positions, ReLU MLP (vLLM's
    /// `OPTDecoderLayer`).
    Opt,
    /// `models/phi.rs`: LayerNorm with bias, attention and MLP side by side on one norm's
    /// output, partial rotary, gelu_new MLP with biases (vLLM's `PhiLayer`).
    Phi,
    /// `models/deepseek_v2.rs`: Llama's pre-norm layers with multi-head latent attention
    /// (one latent per token cached) and DeepSeek's MoE (shared experts beside grouped
    /// top-k routed ones) after the dense first layers (vLLM's `DeepseekV2DecoderLayer`).
    Deepseek,
    /// `models/gpt_oss.rs`: pre-norm layers of attention with sinks (sliding-window on even
    /// layers), biased q/k/v/o, YaRN, and a MoE of clamped-SwiGLU experts with biases after a
    /// biased router (vLLM's `TransformerBlock` in gpt_oss.py).
    GptOss,
    /// `models/llama4.rs`: Llama's pre-norm layers with chunked local attention on RoPE
    /// layers and global NoPE layers, the L2 q/k norm and temperature tuning, a sigmoid
    /// top-1 MoE with a shared expert in every `interleave_moe_layer_step`-th layer (vLLM's
    /// `Llama4DecoderLayer`).
    Llama4,
    /// `models/qwen3_next.rs`: Gated DeltaNet layers (a conv state and a recurrent state per
    /// sequence) with a gated full-attention layer every fourth, zero-centred `(1 + w)`
    /// norms, Qwen2-MoE's sparse block with its gated shared expert (vLLM's
    /// `Qwen3NextDecoderLayer`).
    Qwen3Next,
}

/// Where a sparse block's tensors sit in the checkpoint and in which order vLLM makes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeNames {
    /// The block's module name (`block_sparse_moe` for Mixtral, `mlp` for the Qwen MoEs).
    pub block: &'static str,
    /// Each expert's gate, up and down projections.
    pub experts: [&'static str; 3],
    /// The router is made before the experts (Mixtral, mixtral.py L80-97 at 0.8.5) or after
    /// them (Qwen3-MoE, qwen3_moe.py L113-126).
    pub router_first: bool,
}

/// Whether q, k and v carry a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvBias {
    /// As config.json's `attention_bias` says, with this default when it is absent.
    Config { default: bool },
    /// Always, whatever the config says (vLLM's Qwen2-MoE: qwen2_moe.py L207 at 0.8.5).
    Always,
}

/// One model type vramscope runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// config.json's `model_type`.
    pub model_type: &'static str,
    /// The class its checkpoints name in `architectures` (what `to_hf_json` writes).
    pub architecture: &'static str,
    /// vLLM's model file, under `vllm/model_executor/models/`.
    pub vllm_file: &'static str,
    pub decoder: Decoder,
    /// Per-head RMSNorm of q and k (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// q/k/v stored as one `qkv_proj`, gate/up as one `gate_up_proj` (Phi-3's checkpoints).
    pub fused_checkpoint: bool,
    /// Whether this family's MLP is Llama's, which drops `gate_up` before `down_proj` from
    /// vLLM #10339 on (0.6.4); Qwen2's (and the files that import it) keeps it in every
    /// release, Gemma's too.
    pub mlp_frees_gate_up: bool,
    pub qkv_bias: QkvBias,
    /// `pre_feedforward_layernorm` and `post_feedforward_layernorm` around the MLP (Gemma 2
    /// and 3).
    pub feedforward_norms: bool,
    /// The mixture-of-experts families' checkpoint layout.
    pub moe: Option<MoeNames>,
}

const LLAMA: Family = Family {
    model_type: "llama",
    architecture: "LlamaForCausalLM",
    vllm_file: "llama.py",
    decoder: Decoder::Llama,
    qk_norm: false,
    fused_checkpoint: false,
    mlp_frees_gate_up: true,
    qkv_bias: QkvBias::Config { default: false },
    feedforward_norms: false,
    moe: None,
};

const QWEN_MOE: MoeNames = MoeNames {
    block: "mlp",
    experts: ["gate_proj", "up_proj", "down_proj"],
    router_first: false,
};

/// Every model type vramscope runs, in the order error messages list them.
pub const FAMILIES: &[Family] = &[
    LLAMA,
    // vLLM maps MistralForCausalLM to llama.py.
    Family {
        model_type: "mistral",
        architecture: "MistralForCausalLM",
        ..LLAMA
    },
    Family {
        model_type: "qwen2",
        architecture: "Qwen2ForCausalLM",
        vllm_file: "qwen2.py",
        mlp_frees_gate_up: false,
        qkv_bias: QkvBias::Config { default: true },
        ..LLAMA
    },
    // qwen3.py: Qwen3Attention adds q_norm and k_norm; its MLP is Qwen2MLP.
    Family {
        model_type: "qwen3",
        architecture: "Qwen3ForCausalLM",
        vllm_file: "qwen3.py",
        qk_norm: true,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    // phi3.py: `Phi3ForCausalLM` is `LlamaForCausalLM` with its checkpoint names packed.
    Family {
        model_type: "phi3",
        architecture: "Phi3ForCausalLM",
        vllm_file: "phi3.py",
        fused_checkpoint: true,
        ..LLAMA
    },
    // gemma.py: Gemma 1, Gemma 2's layer without the feedforward norms, window or soft-caps.
    Family {
        model_type: "gemma",
        architecture: "GemmaForCausalLM",
        vllm_file: "gemma.py",
        decoder: Decoder::Gemma,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    Family {
        model_type: "gemma2",
        architecture: "Gemma2ForCausalLM",
        vllm_file: "gemma2.py",
        decoder: Decoder::Gemma,
        feedforward_norms: true,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    Family {
        model_type: "gemma3_text",
        architecture: "Gemma3ForCausalLM",
        vllm_file: "gemma3.py",
        decoder: Decoder::Gemma,
        feedforward_norms: true,
        qk_norm: true,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    // granite.py: Llama's weights; GraniteMLP keeps `gate_up` through down_proj in every
    // release (0.6.4 L87-91, 0.19 L99-103).
    Family {
        model_type: "granite",
        architecture: "GraniteForCausalLM",
        vllm_file: "granite.py",
        decoder: Decoder::Granite,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    Family {
        model_type: "mixtral",
        architecture: "MixtralForCausalLM",
        vllm_file: "mixtral.py",
        moe: Some(MoeNames {
            block: "block_sparse_moe",
            experts: ["w1", "w3", "w2"],
            router_first: true,
        }),
        ..LLAMA
    },
    Family {
        model_type: "qwen2_moe",
        architecture: "Qwen2MoeForCausalLM",
        vllm_file: "qwen2_moe.py",
        mlp_frees_gate_up: false,
        qkv_bias: QkvBias::Always,
        moe: Some(QWEN_MOE),
        ..LLAMA
    },
    Family {
        model_type: "qwen3_moe",
        architecture: "Qwen3MoeForCausalLM",
        vllm_file: "qwen3_moe.py",
        qk_norm: true,
        mlp_frees_gate_up: false,
        moe: Some(QWEN_MOE),
        ..LLAMA
    },
    Family {
        model_type: "opt",
        architecture: "OPTForCausalLM",
        vllm_file: "opt.py",
        decoder: Decoder::Opt,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    // phi.py: phi-1_5 and phi-2 (PhiForCausalLM), not the phi3 file's.
    Family {
        model_type: "phi",
        architecture: "PhiForCausalLM",
        vllm_file: "phi.py",
        decoder: Decoder::Phi,
        mlp_frees_gate_up: false,
        qkv_bias: QkvBias::Always,
        ..LLAMA
    },
    // deepseek_v2.py runs V2, V3 (`DeepseekV3ForCausalLM` is a subclass) and Kimi-K2 (its
    // config is mapped to `DeepseekV3Config`: 0.19 transformers_utils/config.py L95).
    Family {
        model_type: "deepseek_v2",
        architecture: "DeepseekV2ForCausalLM",
        vllm_file: "deepseek_v2.py",
        decoder: Decoder::Deepseek,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    Family {
        model_type: "deepseek_v3",
        architecture: "DeepseekV3ForCausalLM",
        vllm_file: "deepseek_v2.py",
        decoder: Decoder::Deepseek,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    Family {
        model_type: "kimi_k2",
        architecture: "DeepseekV3ForCausalLM",
        vllm_file: "deepseek_v2.py",
        decoder: Decoder::Deepseek,
        mlp_frees_gate_up: false,
        ..LLAMA
    },
    // gpt_oss.py (0.11.0 on): OAIAttention and MLPBlock; its experts are MXFP4 as published.
    Family {
        model_type: "gpt_oss",
        architecture: "GptOssForCausalLM",
        vllm_file: "gpt_oss.py",
        decoder: Decoder::GptOss,
        mlp_frees_gate_up: false,
        qkv_bias: QkvBias::Always,
        ..LLAMA
    },
    // llama4.py: `Llama4ForCausalLM`; mllama4.py wraps it as the language model of
    // `Llama4ForConditionalGeneration` (its text_config), whose vision tower is
    // models/llama4_vision.rs's.
    Family {
        model_type: "llama4_text",
        architecture: "Llama4ForCausalLM",
        vllm_file: "llama4.py",
        decoder: Decoder::Llama4,
        mlp_frees_gate_up: true,
        ..LLAMA
    },
    Family {
        model_type: "llama4",
        architecture: "Llama4ForConditionalGeneration",
        vllm_file: "mllama4.py",
        decoder: Decoder::Llama4,
        mlp_frees_gate_up: true,
        ..LLAMA
    },
    // qwen3_next.py: Qwen3-Next (the Qwen3.5 family follows it in qwen3_5.py, not modelled).
    Family {
        model_type: "qwen3_next",
        architecture: "Qwen3NextForCausalLM",
        vllm_file: "qwen3_next.py",
        decoder: Decoder::Qwen3Next,
        qk_norm: true,
        mlp_frees_gate_up: false,
        moe: Some(QWEN_MOE),
        ..LLAMA
    },
];

/// A model type vramscope knows and does not run yet.
pub struct Refused {
    pub model_type: &'static str,
    /// The classes its checkpoints name.
    pub architectures: &'static str,
    /// What running it would take.
    pub needs: &'static str,
}

/// Model types vramscope knows and refuses, each with what it would take to run it (Gemma 3's
/// and Mistral 3's multimodal checkpoints run, `config/gemma3_mm.rs`, `config/mistral3.rs`).
pub const REFUSED: &[Refused] = &[
    Refused {
        model_type: "pixtral",
        architectures: "PixtralForConditionalGeneration, Mistral's native format (params.json, consolidated.safetensors) served with --tokenizer-mode mistral",
        needs: "its native vision encoder and adapter (vLLM pixtral.py VisionTransformer and VisionLanguageAdapter) and mistral_common's image processing are not modelled; the Hugging Face format (model_type mistral3, Mistral3ForConditionalGeneration) is",
    },
    Refused {
        model_type: "gemma4",
        architectures: "Gemma4ForConditionalGeneration (google/gemma-4-*), vLLM 0.19 on (models/gemma4.py, gemma4_mm.py)",
        needs: "its language model (per-layer input embeddings and the runner's `per_layer_embeddings` buffer, layers that share another layer's KV cache, its MoE router), its vision and audio towers (built through transformers' AutoModel) and their video profile are not modelled",
    },
    Refused {
        model_type: "gemma3n",
        architectures: "Gemma3nForConditionalGeneration (google/gemma-3n-*), vLLM models/gemma3n.py, gemma3n_mm.py",
        needs: "its language model (AltUp, LAuReL, per-layer input embeddings, KV sharing) and its MobileNet vision and audio towers are not modelled",
    },
];

/// The family of `model_type`, if vramscope runs it.
pub fn family(model_type: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.model_type == model_type)
}

/// Why `model_type` is refused, when vramscope knows it: "model_type 'X' (its classes) is not
/// supported: what it needs".
pub fn refusal(model_type: &str) -> Option<String> {
    REFUSED
        .iter()
        .find(|r| r.model_type == model_type)
        .map(|r| {
            format!(
                "model_type '{}' ({}) is not supported: {}",
                r.model_type, r.architectures, r.needs
            )
        })
}

/// The model types vramscope runs, as a message lists them ("llama, mistral, … or opt").
pub fn supported_list() -> String {
    // gemma3, mistral3, llava_next and kimi_vl (multimodal) read their text_config
    // (gemma3_text, mistral, granite, deepseek_v3) before the families.
    let names: Vec<&str> = FAMILIES
        .iter()
        .map(|f| f.model_type)
        .flat_map(|t| {
            if t == "gemma3_text" {
                vec![t, "gemma3"]
            } else if t == "mistral" {
                vec![t, "mistral3"]
            } else if t == "granite" {
                // LLaVA-NeXT reads its text_config (granite for granite-vision).
                vec![t, "llava_next"]
            } else if t == "deepseek_v3" {
                // Kimi-VL reads its text_config (deepseek_v3, Moonlight's shape).
                vec![t, "kimi_vl"]
            } else {
                vec![t]
            }
        })
        .collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

#[cfg(test)]
mod tests {
    use crate::model::models::registry::{refusal, supported_list, Decoder, FAMILIES, REFUSED};

    #[test]
    fn every_model_type_appears_once_and_none_is_both_run_and_refused() {
        let mut seen = std::collections::HashSet::new();
        for f in FAMILIES {
            assert!(seen.insert(f.model_type), "{} twice", f.model_type);
            assert!(refusal(f.model_type).is_none(), "{}", f.model_type);
            assert!(f.vllm_file.ends_with(".py"), "{}", f.model_type);
        }
        for r in REFUSED {
            assert!(seen.insert(r.model_type), "{} twice", r.model_type);
        }
    }

    #[test]
    fn a_model_type_that_runs_is_not_refused() {
        // gemma3 (multimodal) runs since its tower and encoder profile are modelled.
        for runs in [
            "qwen3_next",
            "gpt_oss",
            "llama4",
            "llama4_text",
            "gemma3",
            "mistral3",
            "llava_next",
            "kimi_vl",
        ] {
            assert!(refusal(runs).is_none(), "{runs}");
        }
        assert!(refusal("llama").is_none());
        assert!(refusal("deepseek_v3").is_none());
    }

    #[test]
    fn the_list_reads_as_the_messages_always_did() {
        assert_eq!(
            supported_list(),
            "llama, mistral, mistral3, qwen2, qwen3, phi3, gemma, gemma2, gemma3_text, gemma3, granite, llava_next, mixtral, qwen2_moe, qwen3_moe, opt, phi, deepseek_v2, deepseek_v3, kimi_vl, kimi_k2, gpt_oss, llama4_text, llama4 or qwen3_next"
        );
        let e = refusal("pixtral").unwrap();
        assert!(
            e.starts_with("model_type 'pixtral' (PixtralForConditionalGeneration"),
            "{e}"
        );
        assert!(e.contains("--tokenizer-mode mistral"), "{e}");
    }

    #[test]
    fn only_the_llama_files_mlp_drops_gate_up_early() {
        let early: Vec<&str> = FAMILIES
            .iter()
            .filter(|f| f.mlp_frees_gate_up && f.decoder == Decoder::Llama)
            .map(|f| f.model_type)
            .collect();
        assert_eq!(early, ["llama", "mistral", "phi3", "mixtral"]);
    }
}

//! Built-in model shapes, from each model's published `config.json`.

use super::config::{GemmaShape, GraniteShape, ModelConfig, MoeShape, OptShape, PhiShape};

#[allow(clippy::too_many_arguments)]
fn cfg(
    arch: &str,
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    kv: usize,
    vocab: usize,
    theta: f64,
    eps: f64,
    tied: bool,
    max_pos: usize,
) -> ModelConfig {
    ModelConfig {
        rope_scaling: None,
        arch: arch.into(),
        hidden_size: hidden,
        intermediate_size: inter,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim: hidden / heads,
        vocab_size: vocab,
        rope_theta: theta,
        rms_norm_eps: eps,
        tie_word_embeddings: tied,
        attention_bias: arch == "qwen2",
        max_position_embeddings: max_pos,
        opt: None,
        phi: None,
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
    }
}

#[allow(clippy::too_many_arguments)]
/// A Gemma 2 or Gemma 3 (text) shape: head_dim 256 over 16 heads, 8 KV heads, tied
/// embeddings, eps 1e-6.
fn gemma(
    arch: &str,
    hidden: usize,
    inter: usize,
    layers: usize,
    vocab: usize,
    theta: f64,
    max_pos: usize,
    shape: GemmaShape,
) -> ModelConfig {
    ModelConfig {
        head_dim: 256,
        gemma: Some(shape),
        moe: None,
        ..cfg(
            arch, hidden, inter, layers, 16, 8, vocab, theta, 1e-6, true, max_pos,
        )
    }
}

/// An OPT shape (`facebook/opt-*` config.json): MHA with biases, ReLU MLP, learned positions.
fn opt(
    hidden: usize,
    ffn: usize,
    layers: usize,
    heads: usize,
    proj: usize,
    pre_norm: bool,
) -> ModelConfig {
    ModelConfig {
        rope_scaling: None,
        arch: "opt".into(),
        hidden_size: hidden,
        intermediate_size: ffn,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: hidden / heads,
        vocab_size: 50272,
        rope_theta: 0.0,
        rms_norm_eps: 0.0,
        tie_word_embeddings: true,
        attention_bias: true,
        max_position_embeddings: 2048,
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
            do_layer_norm_before: pre_norm,
            word_embed_proj_dim: proj,
            enable_bias: true,
            layer_norm_eps: 1e-5,
            remove_final_layer_norm: false,
        }),
    }
}

/// A Granite 3.x shape: GQA 32/8, tied embeddings, eps 1e-5, 131072 positions, and the
/// multipliers of its config.json (embedding 12, residual 0.22, logits `logits_scaling`).
fn granite(
    hidden: usize,
    inter: usize,
    vocab: usize,
    theta: f64,
    attention_multiplier: f64,
    logits_scaling: f64,
) -> ModelConfig {
    ModelConfig {
        granite: Some(GraniteShape {
            embedding_multiplier: 12.0,
            residual_multiplier: 0.22,
            attention_multiplier,
            logits_scaling,
        }),
        ..cfg(
            "granite", hidden, inter, 40, 32, 8, vocab, theta, 1e-5, true, 131072,
        )
    }
}

/// A Gemma 1 shape (`google/gemma-*` config.json): head_dim 256, tied embeddings, eps 1e-6,
/// 8192 positions, rope_theta 10000, no window or soft-cap (scale 256^-0.5).
fn gemma1(hidden: usize, inter: usize, layers: usize, heads: usize, kv: usize) -> ModelConfig {
    ModelConfig {
        head_dim: 256,
        gemma: Some(GemmaShape {
            query_pre_attn_scalar: 256.0,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            sliding_window: None,
            sliding_window_pattern: 1,
            rope_local_base_freq: None,
            rope_linear_factor: None,
        }),
        ..cfg(
            "gemma", hidden, inter, layers, heads, kv, 256000, 10000.0, 1e-6, true, 8192,
        )
    }
}

pub const PRESET_NAMES: [&str; 39] = [
    "tiny",
    "smollm2-135m",
    "llama-3-8b",
    "llama-3.1-8b",
    "llama-3-70b",
    "llama-3.1-70b",
    "mistral-7b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "qwen2.5-32b",
    "qwen3-0.6b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "phi-3-mini-4k",
    "phi-4",
    "gemma-2-9b",
    "gemma-3-12b",
    "gemma-3-4b-it",
    "gemma-3-12b-it",
    "gemma-3-27b-it",
    "gemma-2b",
    "gemma-7b",
    "granite-3.1-2b",
    "granite-3.3-8b",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "opt-125m",
    "opt-350m",
    "phi-2",
    "deepseek-v2-lite",
    "deepseek-v2",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "llama-4-scout",
    "llama-4-maverick",
    "qwen3-next-80b-a3b",
];

/// moonshotai/Kimi-VL-A3B-Instruct's config.json (-Thinking and -Thinking-2506 have the same
/// shapes): the language model is Moonlight-16B-A3B's DeepSeek-V3 shape (27 MLA layers of
/// 2048, 16 heads, a 512-wide latent and no query LoRA; a dense first layer of 11264, then 64
/// experts of 1408, 6 a token by sigmoid scores with `noaux_tc`, beside 2 shared ones;
/// vocabulary 163840, untied) with Kimi-VL's 128K context (rope_theta 800000); MoonViT's
/// `vision_config` holds `MoonViTConfig`'s defaults (27 blocks of 1152, 16 heads, MLP 4304,
/// patches of 14, a 64 × 64 position grid, 2 × 2 merge). The keys the memory depends on.
pub(crate) fn kimi_vl_a3b_json() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["KimiVLForConditionalGeneration"], "model_type": "kimi_vl",
        "ignore_index": -100, "media_placeholder_token_id": 163605, "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "text_config": {"model_type": "deepseek_v3", "hidden_size": 2048,
            "intermediate_size": 11264, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
            "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2,
            "n_routed_experts": 64, "num_experts_per_tok": 6, "routed_scaling_factor": 2.446,
            "kv_lora_rank": 512, "q_lora_rank": null, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
            "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": true,
            "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-05, "rope_theta": 800000.0, "rope_scaling": null,
            "tie_word_embeddings": false, "vocab_size": 163840, "num_nextn_predict_layers": 0,
            "torch_dtype": "bfloat16"},
        "vision_config": {"model_type": "moonvit", "hidden_size": 1152,
            "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
            "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
            "merge_kernel_size": [2, 2], "torch_dtype": "bfloat16"}
    })
}

/// ibm-granite/granite-vision-3.2-2b's config.json (transformers 4.49): a granite language
/// model of 40 layers of 2048 (32 heads over 8 KV heads, MLP 8192, vocabulary 49156 with the
/// `<image>` token 49155, tied embeddings), the SigLIP so400m tower at 384 pixels
/// (`vision_feature_layer` [-24, -20, -12, -1], "full" selection) and 26 grid pinpoints of
/// 384-pixel tiles, 1 × 2 to 10 × 1. The keys the memory depends on; rope_theta and the
/// granite multipliers are granite-3.1-2b's.
pub(crate) fn granite_vision_32_2b_json() -> serde_json::Value {
    let mut pinpoints = Vec::new();
    for w in (768..=3840).step_by(384) {
        pinpoints.push([384, w]);
    }
    for w in (384..=1920).step_by(384) {
        pinpoints.push([768, w]);
    }
    for (h, ws) in [(1152, 3), (1536, 2), (1920, 2)] {
        for k in 1..=ws {
            pinpoints.push([h, 384 * k]);
        }
    }
    for h in (2304..=3840).step_by(384) {
        pinpoints.push([h, 384]);
    }
    serde_json::json!({
        "architectures": ["LlavaNextForConditionalGeneration"], "model_type": "llava_next",
        "image_grid_pinpoints": pinpoints, "image_seq_length": 576,
        "image_token_index": 49155, "multimodal_projector_bias": true,
        "projector_hidden_act": "gelu", "tie_word_embeddings": true,
        "use_image_newline_parameter": true,
        "vision_feature_layer": [-24, -20, -12, -1], "vision_feature_select_strategy": "full",
        "text_config": {"architectures": ["GraniteForCausalLM"], "attention_multiplier": 0.015625,
            "embedding_multiplier": 12.0, "hidden_size": 2048, "intermediate_size": 8192,
            "logits_scaling": 8.0, "max_position_embeddings": 131072, "model_type": "granite",
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
            "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_theta": 5000000.0,
            "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 49156},
        "vision_config": {"hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
            "image_size": 384, "intermediate_size": 4304, "layer_norm_eps": 1e-06,
            "model_type": "siglip_vision_model", "num_attention_heads": 16,
            "num_hidden_layers": 27, "patch_size": 14},
        "torch_dtype": "float32"
    })
}

/// google/gemma-3-4b-it's config.json as published (its sparse `text_config` takes
/// `Gemma3TextConfig`'s defaults: 8 heads over 4 KV heads of 256, vocabulary 262208); -12b-it
/// and -27b-it differ in `text_config` only.
fn gemma3_mm(text: serde_json::Value) -> ModelConfig {
    let v = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
        "mm_tokens_per_image": 256, "text_config": text,
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
            "model_type": "siglip_vision_model", "num_attention_heads": 16,
            "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false},
        "torch_dtype": "bfloat16"
    });
    ModelConfig::from_hf_json(&v).expect("the preset is a Gemma 3 config")
}

/// mistralai/Mistral-Small-3.1-24B-Instruct-2503's config.json as published (transformers
/// 4.50.0.dev0; -3.2-24B-Instruct-2506 has the same shapes): a Mistral language model of 40
/// layers of 5120 (32 heads of 128 over 8 KV heads, MLP 32768, vocabulary 131072), the
/// Pixtral tower (24 layers of 1024, 16 heads, MLP 4096, 1540-pixel images in patches of 14)
/// and the projector merging 2 × 2 patches, without biases.
pub(crate) fn mistral_small_31_json() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
        "image_token_index": 10, "multimodal_projector_bias": false,
        "projector_hidden_act": "gelu", "spatial_merge_size": 2,
        "text_config": {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 32768,
            "max_position_embeddings": 131072, "model_type": "mistral",
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0, "sliding_window": null,
            "use_cache": true, "vocab_size": 131072},
        "torch_dtype": "bfloat16",
        "vision_config": {"attention_dropout": 0.0, "head_dim": 64, "hidden_act": "silu",
            "hidden_size": 1024, "image_size": 1540, "initializer_range": 0.02,
            "intermediate_size": 4096, "model_type": "pixtral", "num_attention_heads": 16,
            "num_channels": 3, "num_hidden_layers": 24, "patch_size": 14, "rope_theta": 10000.0},
        "vision_feature_layer": -1
    })
}

/// Qwen/Qwen2.5-VL-7B-Instruct's config.json as published (transformers 4.41.2 era keys,
/// the language model's at the top level): Qwen2.5-7B's language model (28 layers of 3584,
/// 28 heads of 128 over 4 KV heads, MLP 18944, vocabulary 152064, untied) with M-RoPE
/// sections 16/24/24, the vision tower of 32 blocks of 1280 (16 heads, MLP 3420, windows of
/// 112 pixels, full attention in blocks 7, 15, 23, 31) merging 2 × 2 patches out to 3584.
pub(crate) fn qwen25_vl_7b_json() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
        "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
        "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 3584,
        "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000,
        "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28,
        "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
        "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
            "intermediate_size": 3420, "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584,
            "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
            "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2, "temporal_patch_size": 2},
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vocab_size": 152064
    })
}

/// Qwen/Qwen2.5-VL-32B-Instruct's: Qwen2.5-32B's language model (64 layers of 5120, 40 heads
/// over 8 KV heads, MLP 27648) and the tower's MLP 3456 with the merger out to 5120.
fn qwen25_vl_32b_json() -> serde_json::Value {
    let mut v = qwen25_vl_7b_json();
    for (k, x) in [
        ("hidden_size", 5120),
        ("intermediate_size", 27648),
        ("max_window_layers", 64),
        ("num_attention_heads", 40),
        ("num_hidden_layers", 64),
        ("num_key_value_heads", 8),
    ] {
        v[k] = x.into();
    }
    v["vision_config"]["intermediate_size"] = 3456.into();
    v["vision_config"]["out_hidden_size"] = 5120.into();
    v
}

/// The `vision_config` meta-llama/Llama-4-Scout-17B-16E-Instruct and
/// Llama-4-Maverick-17B-128E-Instruct share (models/llama4_vision.rs).
const LLAMA4_VISION: &str = r#"{"model_type": "llama4_vision_model", "hidden_size": 1408,
    "intermediate_size": 5632, "num_hidden_layers": 34, "num_attention_heads": 16,
    "image_size": 336, "patch_size": 14, "num_channels": 3, "vision_output_dim": 4096,
    "projector_input_dim": 4096, "projector_output_dim": 4096,
    "multi_modal_projector_bias": false, "pixel_shuffle_ratio": 0.5}"#;

/// meta-llama/Llama-4-Scout-17B-16E-Instruct's config.json: the keys of its text_config that
/// vLLM's llama4.py reads (48 layers, every one MoE of 16 experts with a shared expert, RoPE
/// layers chunked by 8192 with the L2 q/k norm, every 4th layer NoPE, Llama 3 rope scaling,
/// 10M positions) and its vision_config.
fn llama4_scout() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
        "text_config": {"model_type": "llama4_text", "hidden_size": 5120,
            "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 202048, "num_local_experts": 16,
            "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
            "attention_chunk_size": 8192, "use_qk_norm": true, "attn_temperature_tuning": 4,
            "floor_scale": 8192, "attn_scale": 0.1, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "rms_norm_eps": 1e-05, "max_position_embeddings": 10485760,
            "tie_word_embeddings": false, "attention_bias": false, "hidden_act": "silu"},
        "vision_config": serde_json::from_str::<serde_json::Value>(LLAMA4_VISION)
            .expect("the preset is JSON"),
        "tie_word_embeddings": false, "torch_dtype": "bfloat16"
    })
}

/// meta-llama/Llama-4-Maverick-17B-128E-Instruct's config.json: Scout's layers with 128
/// experts in every other layer (dense layers of 16384 between), no q/k norm, no rope
/// scaling, 1M positions.
fn llama4_maverick() -> serde_json::Value {
    let mut v = llama4_scout();
    let t = &mut v["text_config"];
    t["num_local_experts"] = 128.into();
    t["interleave_moe_layer_step"] = 2.into();
    t["use_qk_norm"] = false.into();
    t["rope_scaling"] = serde_json::Value::Null;
    t["max_position_embeddings"] = 1048576.into();
    v
}

/// deepseek-ai/DeepSeek-V2-Lite's config.json (DeepSeek-V2-Lite-Chat's is the same), the keys
/// vLLM's deepseek_v2.py reads.
const DEEPSEEK_V2_LITE: &str = r#"{"model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2,
    "n_routed_experts": 64, "num_experts_per_tok": 6, "routed_scaling_factor": 1.0,
    "kv_lora_rank": 512, "q_lora_rank": null, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "qk_nope_head_dim": 128, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
    "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": false,
    "scoring_func": "softmax", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": false, "rope_theta": 10000,
    "vocab_size": 102400, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
    "type": "yarn"}, "torch_dtype": "bfloat16"}"#;

/// deepseek-ai/DeepSeek-V2's config.json (DeepSeek-V2-Chat and DeepSeek-Coder-V2-Instruct
/// have the same shape): the low-rank query, 160 routed experts in 8 groups (3 kept) beside
/// 2 shared ones, routed output × 16.
const DEEPSEEK_V2: &str = r#"{"model_type": "deepseek_v2", "hidden_size": 5120,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 60,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 2,
    "n_routed_experts": 160, "num_experts_per_tok": 6, "routed_scaling_factor": 16.0,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "qk_nope_head_dim": 128, "topk_method": "group_limited_greedy", "n_group": 8,
    "topk_group": 3, "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": false,
    "scoring_func": "softmax", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": false, "rope_theta": 10000,
    "vocab_size": 102400, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
    "type": "yarn"}, "torch_dtype": "bfloat16"}"#;

/// openai/gpt-oss-20b's config.json, the keys vLLM's gpt_oss.py reads: 24 layers (even ones
/// sliding over 128 tokens), 64 heads of 64 over 8 KV heads, 32 experts of 2880 (4 a token),
/// YaRN ×32 over 4096 positions, MXFP4 experts. gpt-oss-120b's is the same but 36 layers of
/// 128 experts.
const GPT_OSS_20B: &str = r#"{"model_type": "gpt_oss", "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
    "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128,
    "vocab_size": 201088, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 150000, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0,
    "factor": 32.0, "original_max_position_embeddings": 4096, "rope_type": "yarn",
    "truncate": false}, "swiglu_limit": 7.0, "attention_bias": true,
    "tie_word_embeddings": false, "quantization_config": {"quant_method": "mxfp4"},
    "torch_dtype": "bfloat16"}"#;

/// `GPT_OSS_20B` with gpt-oss-120b's depth and experts.
fn gpt_oss(layers: usize, experts: usize) -> ModelConfig {
    let mut v: serde_json::Value = serde_json::from_str(GPT_OSS_20B).expect("the preset is JSON");
    let layer_types: Vec<&str> = (0..layers)
        .map(|l| {
            if l % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let o = v.as_object_mut().expect("an object");
    o.insert("num_hidden_layers".into(), layers.into());
    o.insert("num_local_experts".into(), experts.into());
    o.insert("layer_types".into(), layer_types.into());
    ModelConfig::from_hf_json(&v).expect("the preset is a gpt_oss config")
}

fn gpt_oss_tiny() -> ModelConfig {
    let mut v: serde_json::Value = serde_json::from_str(GPT_OSS_20B).expect("the preset is JSON");
    let o = v.as_object_mut().expect("an object");
    for (k, n) in [
        ("hidden_size", 128),
        ("intermediate_size", 96),
        ("num_hidden_layers", 4),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("head_dim", 32),
        ("num_local_experts", 8),
        ("num_experts_per_tok", 2),
        ("experts_per_token", 2),
        ("sliding_window", 4),
        ("vocab_size", 1024),
        ("max_position_embeddings", 2048),
    ] {
        o.insert(k.into(), n.into());
    }
    o.insert(
        "rope_scaling".into(),
        serde_json::json!({"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 512, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": false}),
    );
    ModelConfig::from_hf_json(&v).expect("the preset is a gpt_oss config")
}

/// Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (the Thinking model's is the same): 48
/// layers, every fourth gated full attention (16 heads of 256, 2 KV heads, a quarter of each
/// head rotated), the others Gated DeltaNet (16 key heads and 32 value heads of 128, a 4-tap
/// conv); every layer a sparse block of 512 experts of 512 (10 a token) beside a shared
/// expert of 512; 262,144 positions.
const QWEN3_NEXT_80B_A3B: &str = r#"{"model_type": "qwen3_next", "hidden_size": 2048,
    "intermediate_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "num_experts": 512,
    "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "hidden_act": "silu", "max_position_embeddings": 262144,
    "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_scaling": null,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": false, "vocab_size": 151936,
    "torch_dtype": "bfloat16"}"#;

/// Every layer sparse, no dense-only layers (the published Mixtral and Qwen3-MoE configs).
fn moe(num_experts: usize, top_k: usize, width: usize, renormalize: bool) -> MoeShape {
    MoeShape {
        num_experts,
        top_k,
        expert_intermediate_size: width,
        renormalize,
        decoder_sparse_step: 1,
        mlp_only_layers: Vec::new(),
        shared_expert_intermediate_size: 0,
    }
}

/// deepseek-ai/DeepSeek-V3's config.json as published (DeepSeek-V3-0324, DeepSeek-R1 and
/// DeepSeek-R1-0528 have the same): 61 MLA layers of 7168 (128 heads, a 512-wide latent, a
/// 1536-wide query LoRA), 3 dense layers of 18432, then 256 experts of 2048 (8 a token by
/// sigmoid scores over 8 groups, 4 kept, `noaux_tc`) beside a shared one; the MTP layer vLLM
/// does not load; block-wise fp8 `[128, 128]` with dynamic activations. The keys vLLM's
/// deepseek_v2.py and fp8.py read.
const DEEPSEEK_V3: &str = r#"{"architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "vocab_size": 129280, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
    "type": "yarn"}, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "num_nextn_predict_layers": 1, "hidden_act": "silu", "attention_bias": false,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
    "quant_method": "fp8", "weight_block_size": [128, 128]}}"#;

/// Qwen/Qwen3-30B-A3B-FP8's (`layers` 48, `hidden` 2048, experts of 768, 32 heads, dense width
/// 6144) or Qwen/Qwen3-235B-A22B-FP8's (94, 4096, 1536, 64, 12288) config.json: the 16-bit
/// model's shapes with block-wise fp8 `[128, 128]` and `modules_to_not_convert` naming every
/// layer's router and norms and the lm_head, as Qwen publishes its FP8 MoE configs.
fn qwen3_moe_fp8(
    layers: usize,
    hidden: usize,
    width: usize,
    heads: usize,
    dense: usize,
) -> serde_json::Value {
    let mut skip = vec![serde_json::json!("lm_head")];
    for l in 0..layers {
        for m in ["input_layernorm", "mlp.gate", "post_attention_layernorm"] {
            skip.push(format!("model.layers.{l}.{m}").into());
        }
    }
    serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": hidden, "intermediate_size": dense, "moe_intermediate_size": width,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 4,
        "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
        "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false, "attention_bias": false, "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128], "modules_to_not_convert": skip
        }
    })
}

/// The config.json of a checkpoint published block-wise fp8, for the presets that stand for
/// one: opened as a config-only model (`model::open`), so they run dry (the fp8 experts' math
/// runs dry only). Not in `PRESET_NAMES` (the app's list).
pub fn published_fp8_json(name: &str) -> Option<serde_json::Value> {
    let v3 =
        || -> serde_json::Value { serde_json::from_str(DEEPSEEK_V3).expect("the preset is JSON") };
    Some(match name.to_ascii_lowercase().as_str() {
        "deepseek-v3" => v3(),
        // moonshotai/Kimi-K2-Instruct (and -Base): DeepSeek-V3's layout with 64 heads, 384
        // routed experts in one group, one dense layer, a 163840-token vocabulary, 128K
        // positions (YaRN ×32 over 4096), no MTP layer.
        "kimi-k2" => {
            let mut j = v3();
            for (k, v) in [
                ("model_type", serde_json::json!("kimi_k2")),
                ("num_attention_heads", 64.into()),
                ("num_key_value_heads", 64.into()),
                ("n_routed_experts", 384.into()),
                ("first_k_dense_replace", 1.into()),
                ("vocab_size", 163840.into()),
                ("max_position_embeddings", 131072.into()),
                ("n_group", 1.into()),
                ("topk_group", 1.into()),
                ("rope_theta", 50000.into()),
                ("routed_scaling_factor", serde_json::json!(2.827)),
                ("num_nextn_predict_layers", 0.into()),
                (
                    "rope_scaling",
                    serde_json::json!({"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0,
                        "mscale": 1.0, "mscale_all_dim": 1.0,
                        "original_max_position_embeddings": 4096, "type": "yarn"}),
                ),
            ] {
                j[k] = v;
            }
            j
        }
        "qwen3-30b-a3b-fp8" => qwen3_moe_fp8(48, 2048, 768, 32, 6144),
        "qwen3-235b-a22b-fp8" => qwen3_moe_fp8(94, 4096, 1536, 64, 12288),
        _ => return None,
    })
}

/// A built-in shape by name.
pub fn preset(name: &str) -> Option<ModelConfig> {
    if let Some(json) = published_fp8_json(name) {
        return Some(ModelConfig::from_hf_json(&json).expect("the preset is a model config"));
    }
    Some(match name.to_ascii_lowercase().as_str() {
        // meta-llama/Meta-Llama-3-8B
        "llama-3-8b" => cfg(
            "llama", 4096, 14336, 32, 32, 8, 128256, 500000.0, 1e-5, false, 8192,
        ),
        // meta-llama/Llama-3.1-8B(-Instruct): Llama-3-8B's shapes, 128k positions (the rotary
        // cache vLLM builds is that long) and its config.json's llama3 rope scaling.
        "llama-3.1-8b" => ModelConfig {
            rope_scaling: Some(crate::model::config::RopeScaling {
                rope_type: "llama3".into(),
                factor: 8.0,
                original_max_position_embeddings: 8192,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attn_factor: 1.0,
                truncate: true,
            }),
            ..cfg(
                "llama", 4096, 14336, 32, 32, 8, 128256, 500000.0, 1e-5, false, 131072,
            )
        },
        // meta-llama/Llama-3.1-70B(-Instruct) and Llama-3.3-70B-Instruct: Llama-3-70B's
        // shapes with Llama 3.1's 128k positions and llama3 rope scaling.
        "llama-3.1-70b" => ModelConfig {
            rope_scaling: preset("llama-3.1-8b").and_then(|c| c.rope_scaling),
            ..cfg(
                "llama", 8192, 28672, 80, 64, 8, 128256, 500000.0, 1e-5, false, 131072,
            )
        },
        // meta-llama/Meta-Llama-3-70B
        "llama-3-70b" => cfg(
            "llama", 8192, 28672, 80, 64, 8, 128256, 500000.0, 1e-5, false, 8192,
        ),
        // mistralai/Mistral-7B-v0.3
        "mistral-7b" => cfg(
            "mistral", 4096, 14336, 32, 32, 8, 32768, 1e6, 1e-5, false, 32768,
        ),
        // Qwen/Qwen2.5-7B
        "qwen2.5-7b" => cfg(
            "qwen2", 3584, 18944, 28, 28, 4, 152064, 1e6, 1e-6, false, 32768,
        ),
        // Qwen/Qwen2.5-1.5B-Instruct (config.json: tied embeddings, 32k positions)
        "qwen2.5-1.5b" => cfg(
            "qwen2", 1536, 8960, 28, 12, 2, 151936, 1e6, 1e-6, true, 32768,
        ),
        // Qwen/Qwen2.5-32B-Instruct
        "qwen2.5-32b" => cfg(
            "qwen2", 5120, 27648, 64, 40, 8, 152064, 1e6, 1e-6, false, 32768,
        ),
        // Qwen/Qwen3-8B (config.json: head_dim 128, no attention bias, 40960 positions)
        "qwen3-8b" => cfg(
            "qwen3", 4096, 12288, 36, 32, 8, 151936, 1e6, 1e-6, false, 40960,
        ),
        // Qwen/Qwen3-14B (config.json: 40 layers of 40 heads of 128, 8 KV heads, 40960
        // positions, untied embeddings)
        "qwen3-14b" => cfg(
            "qwen3", 5120, 17408, 40, 40, 8, 151936, 1e6, 1e-6, false, 40960,
        ),
        // Qwen/Qwen3-4B: 36 layers of 32 heads of 128 over a 2560-wide model, 8 KV heads,
        // tied embeddings.
        "qwen3-4b" => ModelConfig {
            head_dim: 128,
            ..cfg(
                "qwen3", 2560, 9728, 36, 32, 8, 151936, 1e6, 1e-6, true, 40960,
            )
        },
        // Qwen/Qwen3-32B: 64 layers of 64 heads of 128 over a 5120-wide model, 8 KV heads,
        // untied embeddings.
        "qwen3-32b" => ModelConfig {
            head_dim: 128,
            ..cfg(
                "qwen3", 5120, 25600, 64, 64, 8, 151936, 1e6, 1e-6, false, 40960,
            )
        },
        // Qwen/Qwen3-0.6B: head_dim 128 over 16 heads of a 1024-wide model, tied embeddings.
        "qwen3-0.6b" => ModelConfig {
            head_dim: 128,
            ..cfg(
                "qwen3", 1024, 3072, 28, 16, 8, 151936, 1e6, 1e-6, true, 40960,
            )
        },
        // HuggingFaceTB/SmolLM2-135M
        "smollm2-135m" => cfg(
            "llama", 576, 1536, 30, 9, 3, 49152, 100000.0, 1e-5, true, 8192,
        ),
        // facebook/opt-125m: pre-LN, no projection.
        "opt-125m" => opt(768, 3072, 12, 12, 768, true),
        // facebook/opt-350m: post-LN, 512-wide embedding with project_in/project_out.
        "opt-350m" => opt(1024, 4096, 24, 16, 512, false),
        // deepseek-ai/DeepSeek-V2-Lite: multi-head latent attention (a 512-wide latent, 16
        // heads of 128 + 64 for q/k, 128 for v, one q_proj), a dense first layer, then 26 MoE
        // layers of 64 experts of 1408 (6 a token) beside 2 shared ones.
        "deepseek-v2-lite" => ModelConfig::from_hf_json(
            &serde_json::from_str(DEEPSEEK_V2_LITE).expect("the preset is JSON"),
        )
        .expect("the preset is a DeepSeek-V2 config"),
        // deepseek-ai/DeepSeek-V2: 60 layers of MLA (a 1536-wide low-rank query, 128 heads),
        // a dense first layer, then 59 MoE layers of 160 experts of 1536 (6 a token, in 3 of
        // 8 groups) beside 2 shared ones.
        // google/gemma-3-4b-it, -12b-it, -27b-it (Gemma3ForConditionalGeneration): the
        // language model of each text_config, the SigLIP tower (27 layers of 1152, MLP 4304,
        // 4096 patches of 14 over 896-pixel images) and the projector to 256 tokens an image.
        "gemma-3-4b-it" => gemma3_mm(serde_json::json!({"hidden_size": 2560,
            "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024})),
        "gemma-3-12b-it" => gemma3_mm(serde_json::json!({"hidden_size": 3840,
            "intermediate_size": 15360, "model_type": "gemma3_text", "num_attention_heads": 16,
            "num_hidden_layers": 48, "num_key_value_heads": 8,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024})),
        "gemma-3-27b-it" => gemma3_mm(serde_json::json!({"head_dim": 128, "hidden_size": 5376,
            "intermediate_size": 21504, "model_type": "gemma3_text", "num_attention_heads": 32,
            "num_hidden_layers": 62, "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024})),
        // mistralai/Mistral-Small-3.1-24B-Instruct-2503 (and 3.2-2506): the Mistral language
        // model, the Pixtral tower and the projector. Not in `PRESET_NAMES` (the app's list).
        "mistral-small-3.1-24b" => ModelConfig::from_hf_json(&mistral_small_31_json())
            .expect("the preset is a Mistral 3 config"),
        // ibm-granite/granite-vision-3.2-2b (LlavaNextForConditionalGeneration): the granite
        // language model of granite-3.1-2b with the image token added, the SigLIP tower (27
        // layers of 1152 over 384-pixel tiles in patches of 14), four feature layers into the
        // projector, anyres up to 10 tiles. Not in `PRESET_NAMES` (the app's list).
        "granite-vision-3.2-2b" => ModelConfig::from_hf_json(&granite_vision_32_2b_json())
            .expect("the preset is a LLaVA-NeXT config"),
        // moonshotai/Kimi-VL-A3B-Instruct (and -Thinking; KimiVLForConditionalGeneration):
        // Moonlight's DeepSeek-V3 language model, the MoonViT tower and its projector. Not in
        // `PRESET_NAMES` (the app's list).
        "kimi-vl-a3b" => {
            ModelConfig::from_hf_json(&kimi_vl_a3b_json()).expect("the preset is a Kimi-VL config")
        }
        // Qwen/Qwen2.5-VL-7B-Instruct and -32B-Instruct: the Qwen2 language model (M-RoPE),
        // the window-attention ViT and its merger. Not in `PRESET_NAMES` (the app's list).
        "qwen2.5-vl-7b" => ModelConfig::from_hf_json(&qwen25_vl_7b_json())
            .expect("the preset is a Qwen2.5-VL config"),
        "qwen2.5-vl-32b" => ModelConfig::from_hf_json(&qwen25_vl_32b_json())
            .expect("the preset is a Qwen2.5-VL config"),
        // Llama 4: its language model, vision tower and projector.
        "llama-4-scout" => {
            ModelConfig::from_hf_json(&llama4_scout()).expect("the preset is a Llama 4 config")
        }
        "llama-4-maverick" => {
            ModelConfig::from_hf_json(&llama4_maverick()).expect("the preset is a Llama 4 config")
        }
        "deepseek-v2" => ModelConfig::from_hf_json(
            &serde_json::from_str(DEEPSEEK_V2).expect("the preset is JSON"),
        )
        .expect("the preset is a DeepSeek-V2 config"),
        // openai/gpt-oss-20b and openai/gpt-oss-120b (MXFP4 experts, as published).
        "gpt-oss-20b" => gpt_oss(24, 32),
        "gpt-oss-120b" => gpt_oss(36, 128),
        // A gpt-oss small enough to compute on the CPU, MXFP4 experts as published: 4
        // layers of hidden 128 (4 heads of 32 over 2 KV heads, a 4-token window on the even
        // ones), 8 experts of 96 (2 a token), 1024 words, YaRN ×4 over 512 positions. For
        // `gen-model` and tests; not in `PRESET_NAMES` (the app's list).
        "gpt-oss-tiny" => gpt_oss_tiny(),
        // Qwen/Qwen3-Next-80B-A3B-Instruct (and -Thinking): 36 Gated DeltaNet and 12 gated
        // attention layers, each with 512 experts beside a shared one.
        "qwen3-next-80b-a3b" => ModelConfig::from_hf_json(
            &serde_json::from_str(QWEN3_NEXT_80B_A3B).expect("the preset is JSON"),
        )
        .expect("the preset is a Qwen3-Next config"),
        // microsoft/phi-2 config.json: hidden 2560, 32 layers of 32 heads of 80, MLP 10240 (4 ×
        // hidden, as vLLM's phi.py sizes it), vocabulary 51200, 2048 positions, rotary on 0.4 of
        // each head (32 dims), LayerNorm eps 1e-5, untied lm_head with a bias, fp16.
        "phi-2" => ModelConfig {
            arch: "phi".into(),
            rms_norm_eps: 0.0,
            attention_bias: true,
            phi: Some(PhiShape {
                partial_rotary_factor: 0.4,
                layer_norm_eps: 1e-5,
            }),
            ..cfg(
                "phi", 2560, 10240, 32, 32, 32, 51200, 10000.0, 0.0, false, 2048,
            )
        },
        // A few MB, for tests and compute mode on a laptop.
        // microsoft/Phi-3-mini-4k-instruct (phi3: fused qkv_proj and gate_up_proj stored).
        "phi-3-mini-4k" => cfg(
            "phi3", 3072, 8192, 32, 32, 32, 32064, 10000.0, 1e-5, false, 4096,
        ),
        // microsoft/phi-4 (phi3, GQA 40/10, head_dim 128).
        "phi-4" => cfg(
            "phi3", 5120, 17920, 40, 40, 10, 100352, 250000.0, 1e-5, false, 16384,
        ),
        // google/gemma-2-9b config.json: hidden 3584, 42 layers, 16 heads over 8 KV heads of
        // 256, MLP 14336, vocabulary 256000, 8192 positions, rope_theta 10000,
        // query_pre_attn_scalar 256, soft-caps 50 (attention) and 30 (logits), a 4096-token
        // window on every other layer. 9,241,705,984 parameters from these shapes: the model
        // card's 9.24B (bf16: 18,483,411,968 bytes).
        "gemma-2-9b" => gemma(
            "gemma2",
            3584,
            14336,
            42,
            256000,
            10000.0,
            8192,
            GemmaShape {
                query_pre_attn_scalar: 256.0,
                attn_logit_softcapping: Some(50.0),
                final_logit_softcapping: Some(30.0),
                sliding_window: Some(4096),
                sliding_window_pattern: 2,
                rope_local_base_freq: None,
                rope_linear_factor: None,
            },
        ),
        // The language model of google/gemma-3-12b-it (its config.json's text_config, model_type
        // gemma3_text): hidden 3840, 48 layers, 16 heads over 8 KV heads of 256, MLP 15360,
        // vocabulary 262208, 131072 positions, rope_theta 1e6 with linear scaling 8 on the
        // global layers and 10000 on the sliding ones, a 1024-token window on five layers of
        // six, query_pre_attn_scalar 256, no soft-caps. 11,766,034,176 parameters from these
        // shapes: the checkpoint's `language_model.*` tensors (its 12,187,325,040 in all add
        // the SigLIP vision tower and the projector).
        "gemma-3-12b" => gemma(
            "gemma3_text",
            3840,
            15360,
            48,
            262208,
            1e6,
            131072,
            GemmaShape {
                query_pre_attn_scalar: 256.0,
                attn_logit_softcapping: None,
                final_logit_softcapping: None,
                sliding_window: Some(1024),
                sliding_window_pattern: 6,
                rope_local_base_freq: Some(10000.0),
                rope_linear_factor: Some(8.0),
            },
        ),
        // mistralai/Mixtral-8x7B-v0.1: 8 experts of width 14336, 2 per token, every layer.
        "mixtral-8x7b" => ModelConfig {
            moe: Some(moe(8, 2, 14336, true)),
            ..cfg(
                "mixtral", 4096, 14336, 32, 32, 8, 32000, 1e6, 1e-5, false, 32768,
            )
        },
        // Qwen/Qwen3-30B-A3B: 128 experts of width 768, 8 per token, renormalised; head_dim
        // 128 over 32 heads of a 2048-wide model; the dense width (6144) no layer uses.
        "qwen3-30b-a3b" => ModelConfig {
            head_dim: 128,
            moe: Some(moe(128, 8, 768, true)),
            ..cfg(
                "qwen3_moe",
                2048,
                6144,
                48,
                32,
                4,
                151936,
                1e6,
                1e-6,
                false,
                40960,
            )
        },
        // Qwen/Qwen3-235B-A22B: 128 experts of width 1536, 8 per token, 94 layers.
        "qwen3-235b-a22b" => ModelConfig {
            head_dim: 128,
            moe: Some(moe(128, 8, 1536, true)),
            ..cfg(
                "qwen3_moe",
                4096,
                12288,
                94,
                64,
                4,
                151936,
                1e6,
                1e-6,
                false,
                40960,
            )
        },
        // google/gemma-2b: hidden 2048, 18 layers, 8 heads over one KV head of 256, MLP 16384.
        "gemma-2b" => gemma1(2048, 16384, 18, 8, 1),
        // google/gemma-7b: hidden 3072, 28 layers, 16 heads of 256 (4096 wide, not 3072),
        // MLP 24576.
        "gemma-7b" => gemma1(3072, 24576, 28, 16, 16),
        // ibm-granite/granite-3.1-2b-instruct: hidden 2048, MLP 8192, vocabulary 49155,
        // rope_theta 5e6, attention_multiplier 0.015625, logits_scaling 8.
        "granite-3.1-2b" => granite(2048, 8192, 49155, 5e6, 0.015625, 8.0),
        // ibm-granite/granite-3.3-8b-instruct: hidden 4096, MLP 12800, vocabulary 49159,
        // rope_theta 1e7, attention_multiplier 0.0078125, logits_scaling 16.
        "granite-3.3-8b" => granite(4096, 12800, 49159, 1e7, 0.0078125, 16.0),
        "tiny" => cfg("llama", 128, 384, 4, 4, 2, 1024, 10000.0, 1e-5, false, 2048),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-Next-80B-A3B's main model, computed from its config.json (the hub index's
    /// total_size adds the `mtp.*` tensors, one more attention layer with its sparse block,
    /// which vLLM's main model skips): 79,674,391,296 parameters, 159,348,782,592 bytes in
    /// bf16; the model card's "80B".
    #[test]
    fn qwen3_next_80b_weighs_its_main_model() {
        let c = preset("qwen3-next-80b-a3b").unwrap();
        assert_eq!(c.param_count(), 79_674_391_296);
        assert_eq!(c.qwen3_next.as_ref().unwrap().layer_counts(), (12, 36));
        assert!(c
            .tensor_shapes()
            .iter()
            .all(|(n, _)| !n.starts_with("mtp.")));
        // The published checkpoint (Qwen/Qwen3-Next-80B-A3B-Instruct: Hugging Face's
        // safetensors total, 81,324,862,720 parameters, 162,649,725,440 bytes in bf16) is the
        // main model and the MTP module vLLM's main model skips: one more full-attention
        // layer with its sparse block (`mtp.layers.0.*`), `mtp.fc` [h, 2h] and three norms
        // (`pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `norm`).
        let q = c.qwen3_next.as_ref().unwrap();
        let full = (0..c.num_layers).find(|&l| q.is_full(l)).unwrap();
        let prefix = format!("model.layers.{full}.");
        let layer: u64 = c
            .tensor_shapes()
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum();
        let h = c.hidden_size as u64;
        let mtp = layer + 2 * h * h + 3 * h;
        assert_eq!(c.param_count() + mtp, 81_324_862_720);
    }

    #[test]
    fn published_parameter_counts() {
        assert_eq!(preset("llama-3-8b").unwrap().param_count(), 8_030_261_248);
        assert_eq!(preset("llama-3-70b").unwrap().param_count(), 70_553_706_496);
        assert_eq!(preset("mistral-7b").unwrap().param_count(), 7_248_023_552);
        assert_eq!(preset("qwen2.5-7b").unwrap().param_count(), 7_615_616_512);
        // The model cards' counts: 1.54B and 32.5B.
        assert_eq!(preset("qwen2.5-1.5b").unwrap().param_count(), 1_543_714_304);
        assert_eq!(preset("qwen2.5-32b").unwrap().param_count(), 32_763_876_352);
        assert_eq!(preset("smollm2-135m").unwrap().param_count(), 134_515_008);
        // Hugging Face's counts (unpadded embedding, tied lm_head).
        assert_eq!(preset("opt-125m").unwrap().param_count(), 125_239_296);
        assert_eq!(preset("opt-350m").unwrap().param_count(), 331_196_416);
        // microsoft/phi-2's model.safetensors.index.json total_size (fp16) halved:
        // 5,559,367,680 bytes.
        assert_eq!(preset("phi-2").unwrap().param_count(), 2_779_683_840);
        // deepseek-ai/DeepSeek-V2-Lite's model.safetensors.index.json total_size, 31,412,968,448
        // (bf16), halved.
        assert_eq!(
            preset("deepseek-v2-lite").unwrap().param_count(),
            31_412_968_448 / 2
        );
        // Llama 4, computed from the configs (config.json and the HF classes'
        // shapes): Scout's language model 107,769,861,120 parameters and its vision tower and
        // projector 871,932,416, Maverick's 400,711,848,960 and the same tower. In all they are
        // the published checkpoints' Hugging Face safetensors totals, 108,641,793,536
        // (meta-llama/Llama-4-Scout-17B-16E-Instruct, bf16: 217,283,587,072 bytes) and
        // 401,583,781,376 (…-Maverick-17B-128E-Instruct: 803,167,562,752 bytes); the tower's
        // tensors are among the checkpoint's (`VisionTower::tensor_shapes`).
        let scout = preset("llama-4-scout").unwrap();
        let vision = |c: &ModelConfig| {
            let l = c.llama4.as_ref().unwrap();
            l.vision.as_ref().unwrap().param_count(c.hidden_size)
        };
        assert_eq!(vision(&scout), 871_932_416);
        assert_eq!(scout.param_count() - vision(&scout), 107_769_861_120);
        let maverick = preset("llama-4-maverick").unwrap();
        assert_eq!(vision(&maverick), 871_932_416);
        assert_eq!(maverick.param_count() - vision(&maverick), 400_711_848_960);
        assert_eq!(scout.param_count(), 108_641_793_536);
        assert_eq!(maverick.param_count(), 401_583_781_376);
        assert_eq!(scout.param_count() * 2, 217_283_587_072);
        // DeepSeek-V2: its model card's "236B total parameters" (the index's total_size is
        // not checked here).
        let v2 = preset("deepseek-v2").unwrap().param_count() as f64;
        assert_eq!((v2 / 1e9).round(), 236.0, "{v2}");
        // The total_size of their model.safetensors.index.json (bf16) halved: 7,642,159,104
        // and 29,319,014,400 bytes.
        assert_eq!(
            preset("phi-3-mini-4k").unwrap().param_count(),
            3_821_079_552
        );
        assert_eq!(preset("phi-4").unwrap().param_count(), 14_659_507_200);
        // Computed from the published shapes (the presets' comments say where each is from).
        assert_eq!(preset("gemma-2-9b").unwrap().param_count(), 9_241_705_984);
        // The model cards' 2.51B and 8.54B; Granite 3.3-8B's 8,170,864,640 as a third-party
        // table of the checkpoint lists it; Granite 3.1-2B's 2.53B (vocabulary 49155). In
        // bf16, twice these are the checkpoints' bytes (no tensor is stored twice: all four
        // tie their lm_head to the embedding).
        assert_eq!(preset("gemma-2b").unwrap().param_count(), 2_506_172_416);
        assert_eq!(preset("gemma-7b").unwrap().param_count(), 8_537_680_896);
        assert_eq!(
            preset("granite-3.3-8b").unwrap().param_count(),
            8_170_864_640
        );
        assert_eq!(
            preset("granite-3.1-2b").unwrap().param_count(),
            2_533_531_648
        );
        assert_eq!(preset("gemma-3-12b").unwrap().param_count(), 11_766_034_176);
        // Gemma3ForConditionalGeneration in bf16, language model + SigLIP tower + projector:
        // google/gemma-3-4b-it's safetensors total 4,300,079,472 parameters (its index's
        // total_size 8,600,158,944 bytes), -12b-it's 12,187,325,040, -27b-it's 27,432,406,640.
        for (name, params) in [
            ("gemma-3-4b-it", 4_300_079_472u64),
            ("gemma-3-12b-it", 12_187_325_040),
            ("gemma-3-27b-it", 27_432_406_640),
        ] {
            let c = preset(name).unwrap();
            assert_eq!(c.param_count(), params, "{name}");
            let mm = c.gemma3_mm.as_ref().unwrap();
            assert_eq!(mm.tower_param_count(), 416_866_032, "{name}");
            assert_eq!(c.param_count() - mm.param_count(c.hidden_size), {
                let text = ModelConfig {
                    gemma3_mm: None,
                    mistral3: None,
                    qwen2_5_vl: None,
                    llava_next: None,
                    kimi_vl: None,
                    ..c.clone()
                };
                text.param_count()
            });
        }
        // The 12B's language model is the text-only preset's.
        let it = preset("gemma-3-12b-it").unwrap();
        assert_eq!(
            ModelConfig {
                gemma3_mm: None,
                mistral3: None,
                qwen2_5_vl: None,
                llava_next: None,
                kimi_vl: None,
                ..it
            },
            preset("gemma-3-12b").unwrap()
        );
        // The total_size of their model.safetensors.index.json (bf16) halved; Mixtral's
        // 46.7 B, Qwen3's 30.5 B and 235 B of the model cards.
        let mixtral = preset("mixtral-8x7b").unwrap();
        assert_eq!(mixtral.param_count(), 46_702_792_704);
        let q30 = preset("qwen3-30b-a3b").unwrap();
        assert_eq!(q30.param_count(), 30_532_122_624);
        assert_eq!(
            preset("qwen3-235b-a22b").unwrap().param_count(),
            235_093_634_560
        );
        // Active per token (embeddings and lm_head counted): the model cards' 12.9 B and 3.3 B.
        assert_eq!(mixtral.active_param_count(), 12_879_925_248);
        assert_eq!(q30.active_param_count(), 3_353_032_704);
    }

    /// The `total_size` of openai/gpt-oss-20b's model.safetensors.index.json,
    /// 13,761,264,768 bytes, and of gpt-oss-120b's, 65,248,815,744: MXFP4 experts (a byte per
    /// two values plus a byte per 32), everything else bf16. The model cards' 20.9 B and
    /// 116.8 B parameters count each expert value once.
    #[test]
    fn gpt_oss_checkpoints_weigh_their_index_total_size() {
        let small = preset("gpt-oss-20b").unwrap();
        assert_eq!(small.gpt_oss_checkpoint_bytes(), 13_761_264_768);
        let large = preset("gpt-oss-120b").unwrap();
        assert_eq!(large.gpt_oss_checkpoint_bytes(), 65_248_815_744);
        // The model cards' 20.9 B and 116.8 B: two values a block byte, scales not counted.
        assert_eq!(small.param_count(), 20_914_757_184);
        assert_eq!(large.param_count(), 116_829_156_672);
        let g = small.gpt_oss.as_ref().unwrap();
        assert!(g.mxfp4 && !g.truncate && g.sliding_window == 128);
        assert!(g.is_sliding(0) && !g.is_sliding(1) && g.is_sliding(22));
    }

    #[test]
    fn opt_vocabulary_pads_as_vllm_pads_it() {
        let c = preset("opt-125m").unwrap();
        assert_eq!(c.padded_vocab(), 50304);
        // vLLM's count: the embedding with its 32 padded rows.
        let padded = c.param_count() + ((c.padded_vocab() - c.vocab_size) * 768) as u64;
        assert_eq!(padded, 125_263_872);
        assert_eq!(preset("llama-3-8b").unwrap().padded_vocab(), 128256);
    }

    /// Parameter counts of the published checkpoints: Llama-3.1-70B's index holds
    /// 141,107,412,992 bf16 bytes; Qwen3-4B and -32B are published as 4.0B and 32.8B.
    #[test]
    fn the_newer_presets_weigh_what_was_published() {
        assert_eq!(
            preset("llama-3.1-70b").unwrap().param_count() * 2,
            141_107_412_992
        );
        let b = |n: &str| preset(n).unwrap().param_count() as f64 / 1e9;
        assert_eq!(format!("{:.1}", b("qwen3-4b")), "4.0");
        assert_eq!(format!("{:.1}", b("qwen3-32b")), "32.8");
    }

    /// Writes the config.json of the multimodal presets whose published index could not be
    /// read from here, for `scripts/param_count.py` (transformers' own classes on the meta
    /// device): `VRAMSCOPE_PRESET_CONFIGS=DIR cargo test --lib -- --ignored
    /// write_multimodal_preset_configs`.
    #[test]
    #[ignore = "writes fixtures for a reference run"]
    fn write_multimodal_preset_configs() {
        let dir = std::path::PathBuf::from(
            std::env::var("VRAMSCOPE_PRESET_CONFIGS").expect("VRAMSCOPE_PRESET_CONFIGS=DIR"),
        );
        for (name, json) in [
            ("granite-vision-3.2-2b", granite_vision_32_2b_json()),
            ("kimi-vl-a3b", kimi_vl_a3b_json()),
            // Controls whose published index totals are known.
            ("qwen2.5-vl-7b", qwen25_vl_7b_json()),
            ("mistral-small-3.1-24b", mistral_small_31_json()),
        ] {
            let d = dir.join(name);
            std::fs::create_dir_all(&d).unwrap();
            let text = serde_json::to_string_pretty(&json).unwrap();
            std::fs::write(d.join("config.json"), text).unwrap();
        }
    }

    #[test]
    fn every_name_resolves() {
        for n in PRESET_NAMES {
            assert!(preset(n).is_some(), "{n}");
        }
    }
}

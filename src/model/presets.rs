//! Built-in model shapes, from each model's published `config.json`.

use super::config::ModelConfig;

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
    }
}

pub const PRESET_NAMES: [&str; 6] = [
    "tiny",
    "smollm2-135m",
    "llama-3-8b",
    "llama-3-70b",
    "mistral-7b",
    "qwen2.5-7b",
];

/// A built-in shape by name.
pub fn preset(name: &str) -> Option<ModelConfig> {
    Some(match name.to_ascii_lowercase().as_str() {
        // meta-llama/Meta-Llama-3-8B
        "llama-3-8b" => cfg(
            "llama", 4096, 14336, 32, 32, 8, 128256, 500000.0, 1e-5, false, 8192,
        ),
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
        // HuggingFaceTB/SmolLM2-135M
        "smollm2-135m" => cfg(
            "llama", 576, 1536, 30, 9, 3, 49152, 100000.0, 1e-5, true, 8192,
        ),
        // A few MB, for tests and compute mode on a laptop.
        "tiny" => cfg("llama", 128, 384, 4, 4, 2, 1024, 10000.0, 1e-5, false, 2048),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_parameter_counts() {
        assert_eq!(preset("llama-3-8b").unwrap().param_count(), 8_030_261_248);
        assert_eq!(preset("llama-3-70b").unwrap().param_count(), 70_553_706_496);
        assert_eq!(preset("mistral-7b").unwrap().param_count(), 7_248_023_552);
        assert_eq!(preset("qwen2.5-7b").unwrap().param_count(), 7_615_616_512);
        assert_eq!(preset("smollm2-135m").unwrap().param_count(), 134_515_008);
    }

    #[test]
    fn every_name_resolves() {
        for n in PRESET_NAMES {
            assert!(preset(n).is_some(), "{n}");
        }
    }
}

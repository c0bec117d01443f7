//! Published checkpoints' weights, as a dry run loads them: each test writes the checkpoint's
//! `config.json` (its published values) and a safetensors file whose header lists every tensor
//! at its published name, shape and dtype, with the data left as a sparse hole (a dry run reads
//! headers only), then profiles it. The weights the run loads must be exactly the stored
//! tensors' bytes plus what vLLM adds on the device (the rotary cos/sin cache,
//! `max_position_embeddings × head_dim` in the model's dtype, and each attention layer's 0-dim
//! scales), and the parameter count the model card's.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::model::{ModelConfig, ModelSource};
use vramscope::profile::{self, ProfileRequest};
use vramscope::quant::Quant;

/// Writes `config.json` and a header-only `model.safetensors` (bf16) for `cfg_json`; returns
/// the stored tensors' bytes.
fn write_checkpoint(dir: &Path, cfg_json: &serde_json::Value) -> (ModelConfig, u64) {
    let cfg = ModelConfig::from_hf_json(cfg_json).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(cfg_json).unwrap(),
    )
    .unwrap();
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in cfg.tensor_shapes() {
        let bytes = shape.iter().product::<usize>() as u64 * 2;
        header.insert(
            name,
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let path = dir.join("model.safetensors");
    let mut f = std::fs::File::create(&path).unwrap();
    use std::io::Write;
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    // The data as a hole: the file has its full length without taking the disk.
    f.set_len(8 + h.len() as u64 + offset).unwrap();
    (cfg, offset)
}

fn dry_weights(dir: &Path) -> (u64, u64) {
    let req = ProfileRequest {
        model: ModelSource::Path {
            path: dir.to_path_buf(),
        },
        quant: Quant::BF16,
        device: DeviceSpec::parse("sim:h200:dry").unwrap(),
        tokens: 256,
        max_model_len: 256,
        seqs: 4,
        verify: false,
        // The first release here with qwen3.py (and phi3.py, as every one).
        vllm: "0.8".into(),
        ..ProfileRequest::default()
    };
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    (r.weights_tensor_bytes, r.weights_bytes)
}

/// The 0-dim f32 tensors 0.8.5's `Attention.__init__` makes on the device in every layer:
/// `_k_scale`, `_v_scale`, `_q_scale`, `_prob_scale` (0.8.5 attention/layer.py L88-93).
fn attention_scalars(cfg: &ModelConfig) -> u64 {
    cfg.num_layers as u64 * 4 * 4
}

fn check(cfg_json: serde_json::Value, params: u64) {
    let cfg = ModelConfig::from_hf_json(&cfg_json).unwrap();
    let rotary = (cfg.max_position_embeddings * cfg.head_dim * 2) as u64;
    check_with_device_extras(cfg_json, params, rotary + attention_scalars(&cfg));
}

/// `check` where vLLM adds `device_extras` bytes beyond the stored tensors.
fn check_with_device_extras(cfg_json: serde_json::Value, params: u64, device_extras: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, stored) = write_checkpoint(dir.path(), &cfg_json);
    assert_eq!(
        cfg.param_count(),
        params,
        "the model card's parameter count"
    );
    assert_eq!(stored, params * 2);
    let (tensors, allocated) = dry_weights(dir.path());
    assert_eq!(tensors, stored + device_extras);
    // What the allocator holds after loading covers the tensors (block rounding on top).
    assert!(allocated >= tensors);
}

/// Qwen/Qwen3-8B's config.json (8.19 B parameters; q_norm/k_norm per layer; untied lm_head).
#[test]
fn qwen3_8b_loads_its_stored_bytes() {
    check(
        serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "attention_bias": false,
            "torch_dtype": "bfloat16"
        }),
        8_190_735_360,
    );
}

/// microsoft/phi-4's config.json (14.66 B parameters; qkv_proj and gate_up_proj stored fused).
#[test]
fn phi_4_loads_its_stored_bytes() {
    check(
        serde_json::json!({
            "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
            "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
            "num_attention_heads": 40, "num_key_value_heads": 10, "vocab_size": 100352,
            "max_position_embeddings": 16384, "original_max_position_embeddings": 16384,
            "rope_theta": 250000.0, "rope_scaling": null, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false, "sliding_window": null, "torch_dtype": "bfloat16"
        }),
        14_659_507_200,
    );
}

/// google/gemma-2-9b's config.json (9.24 B parameters; four norms a layer, tied embedding).
/// vLLM adds the rotary cache, the one-element `normalizer` buffer and the attention scalars.
#[test]
fn gemma_2_9b_loads_its_stored_bytes() {
    let rotary = 8192 * 256 * 2;
    let published = serde_json::json!({
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
        "vocab_size": 256000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "sliding_window": 4096, "attention_bias": false, "attention_dropout": 0.0,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "torch_dtype": "float32"
    });
    // The preset is the published config.
    assert_eq!(
        ModelConfig::from_hf_json(&published).unwrap(),
        vramscope::model::presets::preset("gemma-2-9b").unwrap()
    );
    let scalars = attention_scalars(&ModelConfig::from_hf_json(&published).unwrap());
    check_with_device_extras(published, 9_241_705_984, rotary + 2 + scalars);
}

/// google/gemma-3-12b-it's `text_config` as a text-only (gemma3_text) checkpoint: the
/// language model's 11.77 B parameters. vLLM builds two rotary caches (gemma3.py L153-170 at
/// 0.8.5): the sliding layers' (base 10000, 131072 rows) and the global layers' linear-scaled
/// one (131072 × 8 rows), both `head_dim` wide in bf16, the `normalizer` buffer and the
/// attention scalars.
#[test]
fn gemma_3_12b_text_loads_its_stored_bytes() {
    let local = 131072 * 256 * 2;
    let global = 8 * local;
    let published = serde_json::json!({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 48,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
        "vocab_size": 262208, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "query_pre_attn_scalar": 256, "sliding_window": 1024, "sliding_window_pattern": 6,
        "final_logit_softcapping": null, "attn_logit_softcapping": null,
        "hidden_activation": "gelu_pytorch_tanh", "attention_bias": false,
        "torch_dtype": "bfloat16"
    });
    // The preset is the published config.
    assert_eq!(
        ModelConfig::from_hf_json(&published).unwrap(),
        vramscope::model::presets::preset("gemma-3-12b").unwrap()
    );
    let scalars = attention_scalars(&ModelConfig::from_hf_json(&published).unwrap());
    check_with_device_extras(published, 11_766_034_176, local + global + 2 + scalars);
}

/// microsoft/phi-2's config.json: 2.78 B parameters, every linear layer, LayerNorm and the
/// lm_head with a bias. Its model.safetensors.index.json's total_size is 5,559,367,680 bytes
/// (fp16; research §4). vLLM adds one rotary cache `[2048, rotary_dim = 80 · 0.4 = 32]`
/// (phi.py L112 with get_rope's `rotary_dim`, research §3) in the model's dtype, and the
/// attention scalars.
#[test]
fn phi_2_loads_its_stored_bytes() {
    let published = serde_json::json!({
        "architectures": ["PhiForCausalLM"], "model_type": "phi",
        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 51200,
        "max_position_embeddings": 2048, "partial_rotary_factor": 0.4,
        "layer_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": null,
        "hidden_act": "gelu_new", "qk_layernorm": false, "tie_word_embeddings": false,
        "resid_pdrop": 0.1, "embd_pdrop": 0.0, "attention_dropout": 0.0,
        "bos_token_id": 50256, "eos_token_id": 50256, "initializer_range": 0.02,
        "torch_dtype": "float16", "use_cache": true
    });
    let cfg = ModelConfig::from_hf_json(&published).unwrap();
    assert_eq!(cfg, vramscope::model::presets::preset("phi-2").unwrap());
    assert_eq!(cfg.param_count() * 2, 5_559_367_680);
    let rotary = 2048 * 32 * 2;
    check_with_device_extras(published, 2_779_683_840, rotary + attention_scalars(&cfg));
}

/// phi-2's KV cache per token as vLLM sizes it: 2 (K and V) × 32 layers × 32 heads (MHA:
/// phi.py's QKVParallelLinear has no KV heads of its own, 0.19 L92-98) × head_size 80
/// (hidden / heads, L88) × 2 bytes = 327,680; partial rotary does not narrow the cache
/// (research §5). A page of one layer at block 16: 163,840 bytes.
#[test]
fn phi_2_caches_327680_bytes_per_token() {
    for vllm in ["0.8", "0.19"] {
        let req = ProfileRequest {
            model: ModelSource::Preset {
                name: "phi-2".into(),
            },
            quant: Quant::F16,
            device: DeviceSpec::parse("sim:h100-80gb:dry").unwrap(),
            tokens: 256,
            max_model_len: 256,
            seqs: 4,
            verify: false,
            vllm: vllm.into(),
            ..ProfileRequest::default()
        };
        let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
        let g = &r.kv_geometry;
        assert_eq!(g.block_bytes() / g.block_size, 327_680, "--vllm {vllm}");
        assert_eq!(g.page_bytes(), 163_840 * g.block_size / 16, "--vllm {vllm}");
        assert_eq!((g.num_layers, g.num_kv_heads, g.head_dim), (32, 32, 80));
    }
}

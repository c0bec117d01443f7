//! Published checkpoints' weights, as a dry run loads them: each test writes the checkpoint's
//! `config.json` (its published values) and a safetensors file whose header lists every tensor
//! at its published name, shape and dtype, with the data left as a sparse hole (a dry run reads
//! headers only), then profiles it. The weights the run loads must be exactly the stored
//! tensors' bytes plus what vLLM adds on the device (the rotary cos/sin cache,
//! `max_position_embeddings × head_dim` in the model's dtype), and the parameter count the
//! model card's.

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
        seqs: 4,
        verify: false,
        // The first release here with qwen3.py (and phi3.py, as every one).
        vllm: "0.8".into(),
        ..ProfileRequest::default()
    };
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    (r.weights_tensor_bytes, r.weights_bytes)
}

fn check(cfg_json: serde_json::Value, params: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, stored) = write_checkpoint(dir.path(), &cfg_json);
    assert_eq!(
        cfg.param_count(),
        params,
        "the model card's parameter count"
    );
    assert_eq!(stored, params * 2);
    let (tensors, allocated) = dry_weights(dir.path());
    let rotary = (cfg.max_position_embeddings * cfg.head_dim * 2) as u64;
    assert_eq!(tensors, stored + rotary);
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

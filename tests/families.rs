//! The families added to the model layer's registry (issue 43): their KV bytes per token under
//! each release as vLLM's model files make their attention layers, their published shapes,
//! and the commands that name them.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;

fn run(model: &str, vllm: &str, tp: u32) -> Report {
    let req = ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse("sim:h200-141gb:dry").unwrap(),
        vllm: vllm.into(),
        tokens: 0,
        seqs: 0,
        verify: false,
        tp,
        ..ProfileRequest::default()
    };
    profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
}

/// KV bytes per token: 2 (K and V) × layers × KV heads × head_dim × 2 (bf16), as vLLM's
/// `Attention(num_kv_heads=…, head_size=self.head_dim)` in gemma.py (L183-190 at 0.19: head_dim
/// from the config, 256, not hidden / heads) and granite.py (L166-174: plain GQA) sizes each
/// layer's cache; under tensor parallel Gemma 2B's one KV head is replicated on every rank
/// (`max(1, kv / tp)`), so a rank's cache per token does not shrink.
#[test]
fn kv_bytes_per_token_equal_vllms_for_every_release() {
    for (preset, per_token) in [
        ("gemma-2b", 2 * 18 * 256 * 2),
        ("gemma-7b", 2 * 28 * 16 * 256 * 2),
        ("granite-3.1-2b", 2 * 40 * 8 * 64 * 2),
        ("granite-3.3-8b", 2 * 40 * 8 * 128 * 2),
    ] {
        for vllm in ["380e1863", "0.8", "0.15", "0.19", "0.21"] {
            let r = run(&format!("preset:{preset}"), vllm, 1);
            let g = &r.kv_geometry;
            assert_eq!(
                g.block_bytes() / g.block_size,
                per_token,
                "{preset} under {vllm}"
            );
            assert!(
                r.vllm_answer().is_some() || vllm == "380e1863",
                "{preset} {vllm}"
            );
        }
    }
    assert_eq!(18_432, 2 * 18 * 256 * 2);
    let tp2 = run("preset:gemma-2b", "0.19", 2);
    for rank in std::iter::once(&tp2).chain(tp2.ranks.iter()) {
        let g = &rank.kv_geometry;
        assert_eq!(g.num_kv_heads, 1);
        assert_eq!(g.block_bytes() / g.block_size, 18_432);
    }
}

/// Granite's logits are scaled in place (no allocation) and its embedding too: the pass
/// allocates what Llama's would plus the two scaled sums per layer, never a logits copy.
#[test]
fn granite_scales_logits_and_embedding_in_place() {
    let r = run("preset:granite-3.1-2b", "0.8", 1);
    let names: Vec<&str> = r.events.iter().map(|e| e.tensor.as_str()).collect();
    assert!(!names
        .iter()
        .any(|n| n.contains("logits.scale") || n.contains("embed.multiplier")));
    assert!(names.contains(&"layers.39.residual_mlp.scaled"));
}

/// `plan` takes the new families' hub ids as pasted (Gemma 1, Granite, Phi-2), through the presets of their published
/// shapes, and a model type vLLM runs but vramscope does not yet is refused by name.
#[test]
fn plan_accepts_gemma_granite_and_phi_and_names_what_it_refuses() {
    let cache = tempfile::tempdir().unwrap();
    let plan = |line: &str| {
        let mut args = vec!["plan", "--vllm", "0.19", "--no-verify", "--"];
        args.extend(line.split(' '));
        std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .env("HF_HUB_CACHE", cache.path())
            .output()
            .unwrap()
    };
    for line in [
        "vllm serve google/gemma-7b --max-model-len 4096",
        "vllm serve google/gemma-1.1-2b-it",
        "vllm serve ibm-granite/granite-3.3-8b-instruct --max-model-len 32768",
        "vllm serve microsoft/phi-2",
    ] {
        let out = plan(line);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{line}: {err}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("GPU KV cache size"), "{line}: {text}");
    }
    // A DeepSeek config on disk: refused naming its model type and what it needs.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"],
            "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
            "kv_lora_rank": 512, "vocab_size": 102400, "intermediate_size": 10944}"#,
    )
    .unwrap();
    let out = plan(&format!("vllm serve {}", dir.path().display()));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model_type 'deepseek_v2' (DeepseekV2ForCausalLM)"),
        "{err}"
    );
    assert!(err.contains("multi-head latent attention"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

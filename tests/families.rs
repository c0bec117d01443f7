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
    // A Qwen3-Next config on disk whose activation vLLM's qwen3_next.py does not run: one
    // line naming the key (the family itself runs: tests/hybrid_state.rs).
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
            "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
            "vocab_size": 151936, "intermediate_size": 5120, "hidden_act": "gelu"}"#,
    )
    .unwrap();
    let out = plan(&format!("vllm serve {}", dir.path().display()));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hidden_act 'gelu' is not supported for qwen3_next"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// DeepSeek-V2-Lite's latent cache: one plane of `kv_lora_rank + qk_rope_head_dim` = 576
/// values per token and layer, 27 × 576 × 2 = 31,104 bytes a token in bf16, under every V1
/// release (`MLAAttentionSpec`: 0.11 v1/kv_cache_interface.py L142-153, 0.19 L191-206), whole
/// on every tensor-parallel rank (`num_kv_heads` 1); the block is FlashMLA's forced 64 on a
/// Hopper under 0.11 and 0.15 (platforms/cuda.py L165 at 0.11, L223 at 0.15.1), FA-MLA's 16
/// under 0.19. The V0 releases are refused by name.
#[test]
fn mla_caches_one_latent_per_token_whole_on_every_rank() {
    for (vllm, block) in [("0.11", 64), ("0.15", 64), ("0.19", 16)] {
        let r = run("preset:deepseek-v2-lite", vllm, 1);
        let g = &r.kv_geometry;
        assert!(g.latent, "{vllm}");
        assert_eq!(g.block_size, block, "{vllm}");
        assert_eq!(g.block_bytes() / g.block_size, 31_104, "{vllm}");
        // The profile run's workspace transient: 65536 tokens × 16 heads × 256 × 2 bytes in
        // every MLA layer.
        let ws: Vec<u64> = r
            .events
            .iter()
            .filter(|e| e.tensor.ends_with("attn.chunked_prefill_workspace"))
            .map(|e| e.bytes)
            .collect();
        assert!(ws.len() >= 27, "{vllm}: {}", ws.len());
        assert!(ws.iter().all(|&b| b == 512 << 20), "{vllm}");
        // 0.11 and 0.15 say why the block is not the 16 asked (platforms/cuda.py L167 at
        // 0.11, L224 at 0.15.1), among the lines the release logs.
        let forcing = "INFO cuda.py] Forcing kv cache block size to 64 for FlashMLA backend.";
        assert_eq!(
            r.vllm_notes.iter().any(|n| n == forcing),
            block == 64,
            "{vllm}"
        );
        assert_eq!(
            r.vllm_log_lines().iter().any(|l| l == forcing),
            block == 64,
            "{vllm}"
        );
    }
    let tp2 = run("preset:deepseek-v2-lite", "0.19", 2);
    for rank in std::iter::once(&tp2).chain(tp2.ranks.iter()) {
        let g = &rank.kv_geometry;
        assert_eq!((g.num_kv_heads, g.head_dim), (1, 576));
        assert_eq!(g.block_bytes() / g.block_size, 31_104);
    }
    let req = ProfileRequest {
        model: ModelSource::parse("preset:deepseek-v2-lite").unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse("sim:h200-141gb:dry").unwrap(),
        vllm: "0.8".into(),
        verify: false,
        ..ProfileRequest::default()
    };
    let err = profile::run(&req, None, Arc::new(AtomicBool::new(false)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--vllm 0.8: multi-head latent attention"),
        "{err}"
    );
}

/// 0.33's TRITON_MLA (below Hopper) reserves its decode logits' upper bound in the shared
/// workspace during the profile run, in the first MLA layer after its kv_b_proj transient
/// (mla_attention.py 0.33.0 L934-948, triton_mla.py L53-71, L234-243): 256 sequences × 16
/// heads × 16 splits (8192 tokens / 512, under the A100's 2 × 108 SMs) × 513 f32 on
/// DeepSeek-V2-Lite, 134,479,872 bytes in the allocator's 2 MiB-rounded 130 MiB; the fused
/// MoE's own need (119 MiB) then fits in it, so the workspace is made once. 0.31 makes the
/// MoE's alone.
#[test]
fn triton_mla_reserves_its_logits_in_the_shared_workspace_under_0_33() {
    let ws = |vllm: &str| -> Vec<(String, String, u64)> {
        let req = ProfileRequest {
            model: ModelSource::parse("preset:deepseek-v2-lite").unwrap(),
            quant: Quant::BF16,
            device: DeviceSpec::parse("sim:a100-80gb:dry").unwrap(),
            vllm: vllm.into(),
            tokens: 2048,
            seqs: 256,
            max_model_len: 8192,
            verify: false,
            ..ProfileRequest::default()
        };
        let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
        r.events
            .iter()
            .filter(|e| {
                e.tensor == "moe.workspace"
                    && matches!(
                        e.kind,
                        vramscope::memory::EventKind::Alloc | vramscope::memory::EventKind::Free
                    )
            })
            .map(|e| (format!("{:?}", e.kind), e.op.clone(), e.bytes))
            .collect()
    };
    let w33 = ws("0.33");
    assert_eq!(
        w33[0],
        (
            "Alloc".to_string(),
            "mla.reserve_workspace (TRITON_MLA decode logits)".to_string(),
            65 << 21
        )
    );
    assert!(w33.iter().all(|w| w.2 == 65 << 21), "{w33:?}");
    let w31 = ws("0.31");
    assert!(w31.iter().all(|w| w.1 == "moe.workspace"), "{w31:?}");
    assert!(w31[0].2 < 65 << 21, "{w31:?}");
}

/// `plan` takes DeepSeek-V2-Lite's and DeepSeek-V2-Chat's hub ids as pasted (the latter over
/// 8 GPUs) and answers in vLLM's words.
#[test]
fn plan_accepts_deepseek_v2_lite_and_v2() {
    let cache = tempfile::tempdir().unwrap();
    for line in [
        "vllm serve deepseek-ai/DeepSeek-V2-Lite --max-model-len 32768",
        "vllm serve deepseek-ai/DeepSeek-V2-Chat -tp 8 --max-model-len 8192",
    ] {
        let mut args = vec!["plan", "--vllm", "0.19", "--no-verify", "--"];
        args.extend(line.split(' '));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .env("HF_HUB_CACHE", cache.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("GPU KV cache size"), "{line}: {text}");
    }
}

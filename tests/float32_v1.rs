//! `--dtype float32` under V1 (issue 46, item 5). FlashAttention and FlashInfer take fp16 and
//! bf16 only, so vLLM 0.15 and 0.19 run an f32 model on Triton's `unified_attention`
//! (0.19.0 platforms/cuda.py L100-111, triton_attn.py L259-263): the weights, activations
//! and KV cache are f32, attention allocates nothing but its output, the sampler's
//! `logits.to(float32)` is the logits themselves, and the Triton metadata builder keeps its
//! 3D kernel's segment buffers beside the KV cache. Releases and families not read for it
//! are refused by name.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use common::cli::{ok, vramscope};
use vramscope::device::DeviceSpec;
use vramscope::engine::runtime::CaptureKind;
use vramscope::memory::EventKind;
use vramscope::model::ModelSource;
use vramscope::profile::formulas::FormulaId;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;
use vramscope::Error;

fn run(model: &str, quant: Quant, vllm: &str) -> Result<Report, Error> {
    let req = ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant,
        device: DeviceSpec::parse("sim:h100-sxm:dry").unwrap(),
        verify: false,
        vllm: vllm.into(),
        ..ProfileRequest::default()
    };
    profile::run(&req, None, Arc::new(AtomicBool::new(false)))
}

fn allocs(r: &Report, name: &str) -> Vec<u64> {
    r.events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc && e.tensor.contains(name))
        .map(|e| e.bytes)
        .collect()
}

/// Llama-3-8B (32 layers, 32 heads and 8 KV heads of 128) on an H100 under 0.19: twice the
/// bf16 weights but for the 7 f32 scalars each attention layer makes in either dtype
/// (`set_default_quant_scales`), an f32 KV cache whose blocks are the budget over
/// 16 × 32 × 8 × 128 × 2 × 4 bytes, and Triton's attention throughout.
#[test]
fn llama3_8b_in_float32_under_0_19() {
    let f = run("preset:llama-3-8b", Quant::F32, "0.19").unwrap();
    let b = run("preset:llama-3-8b", Quant::BF16, "0.19").unwrap();
    assert_eq!(
        f.weights_tensor_bytes,
        2 * b.weights_tensor_bytes - 32 * 7 * 4
    );
    assert_eq!(f.weights_tensor_bytes, 32_125_240_192);
    assert_eq!(f.kv_geometry.dtype_bytes, 4);
    assert_eq!(b.kv_geometry.dtype_bytes, 2);
    let v1 = f
        .formulas
        .iter()
        .find(|x| x.id == FormulaId::Pr12126)
        .unwrap();
    let block = 16 * 32 * 8 * 128 * 2 * 4;
    assert_eq!(v1.kv_blocks, v1.kv_bytes as u64 / block);
    assert_eq!(v1.kv_tokens, 16 * v1.kv_blocks);
    // FlashAttention's log-sum-exp and FULL graphs' split accumulators exist in bf16 only
    // (and its eager rng state nowhere in f32).
    for name in ["softmax_lse", "out_accum", "rng_state"] {
        assert!(allocs(&f, name).is_empty(), "{name}");
    }
    for name in ["softmax_lse", "out_accum"] {
        assert!(!allocs(&b, name).is_empty(), "{name}");
    }
    // `logits.to(float32)` copies 16-bit logits only.
    assert!(allocs(&f, "sampler.logits_f32").is_empty());
    assert!(!allocs(&b, "sampler.logits_f32").is_empty());
    // The builder's buffers: 128 // 8 = 16 sequences (a capture size), 32 heads, 16
    // segments, head_dim 128.
    assert_eq!(
        allocs(&f, "softmax_segm_output"),
        vec![16 * 32 * 16 * 128 * 4]
    );
    assert_eq!(allocs(&f, "softmax_segm_max"), vec![16 * 32 * 16 * 4]);
    assert_eq!(allocs(&f, "softmax_segm_expsum"), vec![16 * 32 * 16 * 4]);
    assert!(allocs(&b, "softmax_segm").is_empty());
}

/// With tensor parallel the threshold is over this rank's KV heads: 128 // 4 = 32 at TP2,
/// 16 heads a rank.
#[test]
fn triton_segment_buffers_follow_the_ranks_heads() {
    let req = ProfileRequest {
        model: ModelSource::parse("preset:llama-3-8b").unwrap(),
        quant: Quant::F32,
        device: DeviceSpec::parse("sim:h100-sxm:dry").unwrap(),
        verify: false,
        vllm: "0.19".into(),
        tp: 2,
        ..ProfileRequest::default()
    };
    let r = profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    let rank = if r.ranks.is_empty() { &r } else { &r.ranks[0] };
    assert_eq!(
        allocs(rank, "softmax_segm_output"),
        vec![32 * 16 * 16 * 128 * 4]
    );
}

/// The releases and families float32 is not modelled for, each refused with the reason.
#[test]
fn float32_is_refused_where_it_is_not_modelled() {
    let msg = |model: &str, vllm: &str| run(model, Quant::F32, vllm).err().unwrap().to_string();
    assert!(msg("preset:llama-3-8b", "0.11").contains("FlexAttention"));
    assert!(msg("preset:llama-3-8b", "0.6.4").contains("0.15, 0.19, 0.21"));
    assert!(msg("preset:llama-3-8b", "0.22").contains("0.15, 0.19, 0.21"));
    assert!(msg("preset:qwen3-30b-a3b", "0.19").contains("mixture of experts"));
    assert!(run("preset:llama-3-8b", Quant::F32, "0.15").is_ok());
    // 0.21 applies the graph estimate; its FULL sample holds no FlashAttention 3 split
    // accumulators on Triton's attention.
    let full_first = |r: &Report| {
        let e = r.graphs.as_ref().unwrap().estimate.as_ref().unwrap();
        e.modes
            .iter()
            .find(|m| m.kind == CaptureKind::Full)
            .unwrap()
            .first_bytes
    };
    let f = run("preset:llama-3-8b", Quant::F32, "0.21").unwrap();
    let b = run("preset:llama-3-8b", Quant::BF16, "0.21").unwrap();
    assert!(f.graphs_estimate_applied() > 0);
    assert!(
        full_first(&f) * 4 < full_first(&b),
        "{} {}",
        full_first(&f),
        full_first(&b)
    );
}

/// The command docs/cli.md shows, as written.
#[test]
fn float32_profile_command_as_docs_show_it() {
    let out = vramscope(&[
        "profile",
        "--model",
        "preset:llama-3-8b",
        "--dtype",
        "float32",
        "--vllm",
        "0.19",
        "--device",
        "sim:h100-sxm:dry",
    ]);
    ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("weights memory: 29.92GiB"), "{text}");
    assert!(text.contains("GPU KV cache size: 161,472 tokens"), "{text}");
    // FULL graphs decode on Triton's kernel: no FlashAttention 3 accumulators in the sample.
    assert!(
        text.contains("Estimated FULL CUDA graph memory: 2.00 MiB first-capture"),
        "{text}"
    );
}

//! V1's KV cache manager for a model with state layers beside attention (Qwen3-Next's Gated
//! DeltaNet): the attention block raised until its page holds one sequence's conv and
//! recurrent state, the state page padded to it, groups of 12 layers, tokens per group, and
//! the public log Q2 (../shared/VLLM_LOGS_PUBLIC.md: Qwen3-Next-80B-A3B-Instruct on 2× H200,
//! TP2, util 0.9, max_model_len 262144, max_num_batched_tokens 8192) reproduced.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::model::{presets::preset, ModelSource};
use vramscope::profile::formulas::{hybrid_pages, HybridKv, KvGeometry, MambaPage};
use vramscope::profile::{self, ProfileRequest};
use vramscope::quant::Quant;

const GIB: f64 = (1u64 << 30) as f64;

/// Qwen3-Next-80B on a rank of two: conv state 3 × 4096 and recurrent state 16 × 128 × 128
/// in bf16 = 548,864 bytes; one token of attention is K and V of one KV head of 256 in bf16 =
/// 1,024 bytes; 16 · cdiv(548864, 16384) = 544 tokens, a page of 557,056 bytes, the state
/// padded by 1.49 % (0.10.2 model_executor/models/config.py L357-414).
#[test]
fn the_attention_block_holds_a_state_page_and_the_state_is_padded_to_it() {
    let cfg = preset("qwen3-next-80b-a3b").unwrap();
    let q = cfg.qwen3_next.as_ref().unwrap();
    assert_eq!(q.layer_counts(), (12, 36));
    let (conv, ssm) = q.state_elements(2);
    assert_eq!((conv, ssm), (3 * 4096, 16 * 128 * 128));
    let state = MambaPage {
        conv_elements: conv,
        ssm_elements: ssm,
        dtype_bytes: 2,
    };
    assert_eq!(state.bytes(), 548_864);
    let p = hybrid_pages(1024, state, 16);
    assert_eq!(p.block_size, 544);
    assert!(p.block_size_set);
    assert_eq!(p.page_bytes, 557_056);
    assert_eq!(format!("{:.2}", p.padding_pct.unwrap()), "1.49");
    let lines = p.log_lines();
    assert!(lines.contains(&"Setting attention block size to 544 tokens to ensure that attention page size is >= mamba page size.".to_string()));
    assert!(lines.contains(&"Padding mamba page size by 1.49% to ensure that mamba page size and attention page size are exactly equal.".to_string()));
    // A block size asked above 544 is kept, the state padded to its larger page.
    let big = hybrid_pages(1024, state, 1024);
    assert_eq!((big.block_size, big.block_size_set), (1024, false));
    assert_eq!(big.page_bytes, 1024 * 1024);
    // One GPU: two KV heads and the whole state; 16 · cdiv(1,097,728, 32,768) = 544 again.
    let (c1, s1) = q.state_elements(1);
    let one = MambaPage {
        conv_elements: c1,
        ssm_elements: s1,
        dtype_bytes: 2,
    };
    assert_eq!(hybrid_pages(2048, one, 16).block_size, 544);
}

/// 12 attention and 36 state layers make groups of 12: one full-attention group and three
/// state groups share each block of 12 pages. Q2's 7,162 blocks hold (7,162 // 4) × 544 =
/// 973,760 tokens; a request of 262,144 tokens takes 482 attention blocks and one block of
/// each state group, so 7,162 / 485 = 14.77 of them fit at once (0.10.2
/// v1/core/kv_cache_utils.py L768-783, L1022-1032).
#[test]
fn state_groups_take_one_block_per_request_and_tokens_count_per_group() {
    let h = HybridKv::of_state_layers(12, 36, 8192).unwrap();
    assert_eq!((h.group_size, h.full_groups, h.mamba_groups), (12, 1, 3));
    assert_eq!(h.sliding_groups, 0);
    let g = KvGeometry {
        block_size: 544,
        num_layers: 12,
        num_kv_heads: 1,
        head_dim: 256,
        dtype_bytes: 2,
        max_model_len: 262_144,
        hybrid: Some(h),
        latent: false,
    };
    assert_eq!(g.page_bytes(), 557_056);
    assert_eq!(g.block_bytes(), 12 * 557_056);
    assert_eq!(g.tokens_of_blocks(7162), 973_760);
    assert_eq!(g.v1_request_blocks(), 482 + 3);
    assert_eq!(format!("{:.2}", g.v1_max_concurrency(7162)), "14.77");
    // With prefix caching ("align", 0.15 on when asked, 0.28 by default) a request holds two
    // pages of each state group (0.28.0 v1/kv_cache_interface.py L687-696).
    let aligned = KvGeometry {
        hybrid: Some(HybridKv {
            mamba_align: true,
            ..h
        }),
        ..g
    };
    assert_eq!(aligned.v1_request_blocks(), 482 + 6);
    assert_eq!(format!("{:.2}", aligned.v1_max_concurrency(7162)), "14.68");
    // 44.59 GiB (the log's "Available KV cache memory") is 7,162 blocks.
    assert_eq!(g.blocks((44.59 * GIB) as i64), 7162);
    // Gemma's groups serialise as before: no state groups written.
    let gemma = HybridKv::of_layers(8, 40, 1024, 8192).unwrap();
    assert!(!serde_json::to_string(&gemma).unwrap().contains("mamba"));
    assert_eq!(gemma.groups(), 6);
}

fn q2(vllm: &str) -> vramscope::profile::report::Report {
    let device = DeviceSpec::parse("sim:h200-141gb:dry")
        .unwrap()
        .with_total(Some((139.81 * GIB) as u64))
        .unwrap();
    let req = ProfileRequest {
        model: ModelSource::parse("preset:qwen3-next-80b-a3b").unwrap(),
        quant: Quant::BF16,
        device,
        util: 0.9,
        max_model_len: 262_144,
        tokens: 8192,
        seqs: 1024,
        tp: 2,
        vllm: vllm.into(),
        verify: false,
        ..ProfileRequest::default()
    };
    profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
}

/// Q2 under 0.11 (the same hybrid path as the log's 0.10.2: model_executor/models/config.py
/// L314-401 at 0.11.0, the Gated DeltaNet's profile run returning early, qwen3_next.py
/// L401-403): the block size of 544 and the 1.49 % padding as logged, among the release's
/// lines; the weights per rank near the log's 74.28 GiB; the KV tokens within 2 % of 973,760.
#[test]
fn q2_qwen3_next_80b_on_two_h200s_reproduces_block_padding_and_tokens() {
    let r = q2("0.11");
    let g = &r.kv_geometry;
    assert_eq!(g.block_size, 544);
    let h = g.hybrid.expect("hybrid groups");
    assert_eq!((h.group_size, h.full_groups, h.mamba_groups), (12, 1, 3));
    let lines = r.vllm_log_lines();
    for want in [
        "Setting attention block size to 544 tokens",
        "Padding mamba page size by 1.49%",
        "Hybrid or mamba-based model detected: disabling prefix caching",
    ] {
        assert!(lines.iter().any(|l| l.contains(want)), "{want}: {lines:#?}");
    }
    let weights = r.weights_bytes as f64 / GIB;
    eprintln!("Q2: weights {weights:.4} GiB per rank (log 74.2812)");
    assert!((weights / 74.2812 - 1.0).abs() < 0.005, "{weights}");
    let blocks = r.vllm_engine_blocks().unwrap();
    let tokens = g.tokens_of_blocks(blocks);
    eprintln!("Q2: {blocks} blocks, {tokens} tokens (log 7,162 and 973,760)");
    assert!(
        (tokens as f64 / 973_760.0 - 1.0).abs() < 0.02,
        "{tokens} tokens"
    );
}

/// V0 ran these models with its own MambaCacheManager, and 0.33 on Hopper with prefix caching
/// exports FlashInfer's prefill checkpoints (tests/qwen3_next_v1.rs holds 0.15 to 0.33):
/// both refused by name.
#[test]
fn a_v0_release_is_refused_for_state_layers() {
    let req = ProfileRequest {
        model: ModelSource::parse("preset:qwen3-next-80b-a3b").unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse("sim:h200-141gb:dry").unwrap(),
        tp: 2,
        vllm: "0.8".into(),
        verify: false,
        ..ProfileRequest::default()
    };
    let err = profile::run(&req, None, Arc::new(AtomicBool::new(false)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("MambaCacheManager"), "{err}");
    let req = ProfileRequest {
        vllm: "0.33".into(),
        ..req
    };
    let err = profile::run(&req, None, Arc::new(AtomicBool::new(false)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("under vLLM 0.33 on Hopper with prefix caching"),
        "{err}"
    );
}

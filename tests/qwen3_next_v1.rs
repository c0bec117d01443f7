//! Qwen3-Next under vLLM 0.15 to 0.28 (docs/reading/vllm-qwen3-next-v1.md §2-7): in V1's
//! profile run the Gated DeltaNet runs its projections, the reordering's copies, the zeroed
//! `core_attn_out`, the gated norm and `out_proj`, where 0.11 returned before any of it;
//! 0.19 also warms its prefill kernels up once per layer (FlashInfer on Hopper, FLA's
//! autotuned Triton kernels elsewhere, with Triton's 256 MiB flush buffer in the first layer)
//! and empties the cache after, 0.21 in one pass through `fused_post_conv_prep`; the sparse
//! block's gate runs inside the fused-MoE op, so its logits die before the block's sum; 0.24
//! fuses the attention's norms and rotary, 0.26 drops the layer's output buffer, 0.28 turns
//! prefix caching on. Qwen3-Next-80B-A3B's preset on two H200s (Q2's start), held tensor by
//! tensor.

mod common;

use common::cli::Row;

const T: u64 = 8192;

/// Q2's start (`--tensor-parallel-size 2 --max-model-len 262144`) under `vllm` on `device`.
fn q2_rows(device: &str, vllm: &str) -> Vec<Row> {
    common::cli::plan_rows(
        device,
        vllm,
        "preset:qwen3-next-80b-a3b",
        &[
            "--tensor-parallel-size",
            "2",
            "--max-model-len",
            "262144",
            "--gpu-memory-utilization",
            "0.9",
        ],
    )
}

/// `profile -q --json FILE --model preset:qwen3-next-80b-a3b --device DEVICE --tp TP
/// --max-model-len LEN --vllm V EXTRA…`: the report as JSON.
fn profile_json(
    device: &str,
    (tp, len): (&str, &str),
    vllm: &str,
    extra: &[&str],
) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let mut args = vec![
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        "preset:qwen3-next-80b-a3b",
        "--device",
        device,
        "--tp",
        tp,
        "--max-model-len",
        len,
        "--vllm",
        vllm,
    ];
    args.extend_from_slice(extra);
    common::cli::ok(&common::cli::vramscope(&args));
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

/// Layer `layer`'s allocations and frees in the profile pass, up to the post-attention norm.
fn mixer_events(rows: &[Row], layer: &str) -> Vec<(bool, String, u64)> {
    let own = format!("layers.{layer}.");
    let end = format!("layers.{layer}.post_attention_layernorm");
    rows.iter()
        .filter(|r| r.0 == 1 && r.3 == layer && (r.1 == "alloc" || r.1 == "free"))
        .filter(|r| r.4.starts_with(&own))
        .take_while(|r| !r.4.starts_with(&end))
        .map(|r| (r.1 == "alloc", r.4.clone(), r.5))
        .collect()
}

/// The eager sequence of a Gated DeltaNet layer of the 80B model on a rank of two (16 value
/// heads of 128, 8 key heads of 128, hidden 2048) at 8192 tokens, in bf16, rounded as the
/// caching allocator rounds (512 B).
fn gdn_sequence(l: &str) -> Vec<(bool, String, u64)> {
    let (vh, kh, d, h) = (16u64, 8u64, 128u64, 2048u64);
    let a = |n: &str, b: u64| (true, format!("layers.{l}.{n}"), b);
    let f = |n: &str, b: u64| (false, format!("layers.{l}.{n}"), b);
    let qkvz = T * (2 * kh * d + 2 * vh * d) * 2;
    let ba = T * 2 * vh * 2;
    let vw = T * vh * d * 2;
    let kw = T * kh * d * 2;
    let conv = T * (2 * kh * d + vh * d) * 2;
    let rows = T * vh * 4;
    vec![
        a("input_layernorm", T * h * 2),
        a("self_attention_output", T * h * 2),
        a("in_proj_qkvz.out", qkvz),
        a("in_proj_ba.out", ba),
        a("value", vw),
        a("z", vw),
        a("b", T * vh * 2),
        a("a", T * vh * 2),
        a("query", kw),
        a("key", kw),
        a("mixed_qkv", conv),
        a("core_attn_out", vw),
    ]
    .into_iter()
    .chain([
        a("norm", vw),
        a("norm.rstd", rows),
        f("norm.rstd", rows),
        f("core_attn_out", vw),
        a("out_proj.out", T * h * 2),
        a("out_proj.all_reduce", T * h * 2),
        f("out_proj.out", T * h * 2),
        f("out_proj.all_reduce", T * h * 2),
        f("norm", vw),
        f("value", vw),
        f("z", vw),
        f("b", T * vh * 2),
        f("a", T * vh * 2),
        f("query", kw),
        f("key", kw),
        f("mixed_qkv", conv),
        f("in_proj_qkvz.out", qkvz),
        f("in_proj_ba.out", ba),
        f("input_layernorm", T * h * 2),
    ])
    .collect()
}

/// Under 0.15 layer 1 (a Gated DeltaNet layer after layer 0) runs the whole eager sequence
/// (0.15.1 models/qwen3_next.py L440-495), and the full-attention layer 3 is unchanged; under
/// 0.11 the same layer makes only the decoder's `self_attention_output` (L401-403).
#[test]
fn the_gated_deltanet_runs_its_projections_in_the_profile_run_from_0_15() {
    let rows = q2_rows("sim:h200-141gb:dry", "0.15");
    let got: Vec<_> = mixer_events(&rows, "1")
        .into_iter()
        .filter(|e| !e.1.contains("residual"))
        .collect();
    assert_eq!(got, gdn_sequence("1"));
    assert!(
        !rows.iter().any(|r| r.4.contains("warmup")),
        "0.15 has no warm-up"
    );
    let old = q2_rows("sim:h200-141gb:dry", "0.11");
    let names: Vec<String> = mixer_events(&old, "1")
        .into_iter()
        .filter(|e| e.0)
        .map(|e| e.1)
        .collect();
    assert_eq!(
        names,
        [
            "layers.1.input_layernorm.residual",
            "layers.1.input_layernorm",
            "layers.1.self_attention_output"
        ]
    );
    // 0.11 makes `in_proj_qkvz` and `in_proj_ba` as two weights (0.11.0 L247-260).
    let weights: Vec<&str> = old
        .iter()
        .filter(|r| {
            r.0 == 0 && r.1 == "alloc" && r.4.starts_with("model.layers.1.linear_attn.in_proj")
        })
        .map(|r| r.4.as_str())
        .collect();
    assert_eq!(
        weights,
        [
            "model.layers.1.linear_attn.in_proj_qkvz.weight",
            "model.layers.1.linear_attn.in_proj_ba.weight"
        ]
    );
}

/// 0.19 warms the prefill kernels up inside the op of every Gated DeltaNet layer once, in the
/// profile run only: FlashInfer's path on the H200 (compute capability 9.0), three passes of
/// 16, 32 and 64 tokens, then `empty_cache()`; FLA's Triton kernels on an A100, whose first
/// layer's benchmarks take Triton's 256 MiB flush buffer (measured: docs/gpu-runs.md run 98).
#[test]
fn the_0_19_warm_up_runs_once_per_layer_with_flashinfer_on_hopper_and_triton_elsewhere() {
    let rows = q2_rows("sim:h200-141gb:dry", "0.19");
    let warmed: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.1 == "alloc" && r.4.ends_with(".warmup64.q"))
        .map(|r| r.3.as_str())
        .collect();
    // 36 of the 48 layers are Gated DeltaNet layers (every fourth is full attention).
    assert_eq!(warmed.len(), 36);
    assert!(!warmed.contains("3"));
    assert!(rows
        .iter()
        .filter(|r| r.4.contains(".warmup"))
        .all(|r| r.0 == 1));
    // Layer 1: the sequence of 0.15 with the warm-up between the zeros and the norm.
    let got: Vec<_> = mixer_events(&rows, "1")
        .into_iter()
        .filter(|e| !e.1.contains("residual") && !e.1.contains(".warmup"))
        .collect();
    assert_eq!(got, gdn_sequence("1"));
    let fi: Vec<(String, u64)> = rows
        .iter()
        .filter(|r| r.1 == "alloc" && r.3 == "1" && r.4.contains(".warmup64."))
        .map(|r| {
            (
                r.4.trim_start_matches("layers.1.warmup64.").to_string(),
                r.5,
            )
        })
        .collect();
    let (vh, kh, d) = (16u64, 8u64, 128u64);
    let r512 = |b: u64| b.div_ceil(512) * 512;
    assert_eq!(
        fi,
        [
            ("q", 64 * kh * d * 2),
            ("k", 64 * kh * d * 2),
            ("v", 64 * vh * d * 2),
            ("dummy_a", r512(64 * vh * 2)),
            ("dummy_b", r512(64 * vh * 2)),
            ("g", r512(64 * vh * 4)),
            ("beta", r512(64 * vh * 2)),
            ("state", vh * d * d * 2),
            ("cu_seqlens", 512),
            ("q.l2norm", 64 * kh * d * 2),
            ("k.l2norm", 64 * kh * d * 2),
            ("fi_state", vh * d * d * 4),
            ("fi_beta", r512(64 * vh * 4)),
            ("exp_g", r512(64 * vh * 4)),
            ("cu_seqlens.i64", 512),
            ("output", 64 * vh * d * 2),
            ("output_state", vh * d * d * 4),
        ]
        .map(|(n, b)| (n.to_string(), b))
    );
    assert!(!rows.iter().any(|r| r.4.contains("autotune")));
    // After each layer's warm-up the cache is emptied: segments go back to the driver.
    let emptied = rows
        .iter()
        .filter(|r| r.0 == 1 && r.4 == "empty_cache" && r.2 == "gdn.warmup_prefill.delta_rule")
        .map(|r| r.3.as_str())
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(emptied.len(), 36);

    let a100 = common::cli::plan_rows(
        "sim:a100-80gb:dry",
        "0.19",
        "preset:qwen3-next-80b-a3b",
        &["--tensor-parallel-size", "4", "--max-model-len", "32768"],
    );
    let flush: Vec<(&str, &str)> = a100
        .iter()
        .filter(|r| r.1 == "alloc" && r.4.contains("triton_autotune_l2_flush"))
        .map(|r| (r.3.as_str(), r.4.as_str()))
        .collect();
    assert_eq!(
        flush,
        [16, 32, 64]
            .map(|t| ("0", format!("layers.0.warmup{t}.triton_autotune_l2_flush")))
            .iter()
            .map(|(l, n)| (*l, n.as_str()))
            .collect::<Vec<_>>()
    );
    assert!(a100
        .iter()
        .filter(|r| r.4.contains("triton_autotune_l2_flush") && r.1 == "alloc")
        .all(|r| r.5 == 256 << 20));
    assert!(!a100.iter().any(|r| r.4.contains("fi_state")));
}

/// The sparse block's gate runs inside the fused-MoE op from 0.15 (`SharedFusedMoE(gate=...)`,
/// 0.15.1 qwen3_next.py L171-185; 0.19.0 `_maybe_gate`, default_moe_runner.py L561-572): the
/// router's logits are made before the shared expert and die as the op returns, before the
/// block sums the shared and routed outputs. 0.15.1 makes `A_log` in the model dtype (L338-342),
/// 0.19.0 in f32 again.
#[test]
fn the_router_logits_die_inside_the_op_and_a_log_follows_the_release() {
    for vllm in ["0.15", "0.19"] {
        let rows = q2_rows("sim:h200-141gb:dry", vllm);
        let moe: Vec<(bool, &str)> = rows
            .iter()
            .filter(|r| r.0 == 1 && r.3 == "0" && (r.1 == "alloc" || r.1 == "free"))
            .skip_while(|r| r.4 != "layers.0.moe.router_logits")
            .map(|r| (r.1 == "alloc", r.4.as_str()))
            .collect();
        let at = |e: (bool, &str)| moe.iter().position(|x| *x == e).unwrap_or(usize::MAX);
        assert_eq!(moe[0], (true, "layers.0.moe.router_logits"), "{vllm}");
        assert!(
            at((true, "layers.0.shared_expert.gate_up_proj.out"))
                < at((true, "layers.0.moe.topk_weights"))
        );
        assert!(
            at((false, "layers.0.moe.router_logits")) < at((true, "layers.0.moe.plus_shared")),
            "{vllm}: {moe:?}"
        );
    }
    let weights = |vllm: &str| {
        profile_json("sim:h200-141gb:dry", ("2", "262144"), vllm, &[])["weights_tensor_bytes"]
            .as_u64()
            .unwrap()
    };
    // 36 Gated DeltaNet layers, 16 heads a rank: 2 more bytes each in f32.
    assert_eq!(weights("0.19") - weights("0.15"), 36 * 16 * 2);
}

/// 0.21's warm-up is one pass of 64 tokens through `fused_post_conv_prep` (0.21.0
/// layers/mamba/gdn_linear_attn.py L883-985), and the zeroed `core_attn_out` lives until
/// `forward_cuda` returns, past `out_proj` (L665-683, L725-782). On an A100 (Triton's MoE,
/// FLA's kernels), four ranks.
#[test]
fn from_0_21_one_warm_up_pass_and_the_zeros_live_past_out_proj() {
    let rows = common::cli::plan_rows(
        "sim:a100-80gb:dry",
        "0.21",
        "preset:qwen3-next-80b-a3b",
        &["--tensor-parallel-size", "4", "--max-model-len", "32768"],
    );
    let warm: Vec<&str> = rows
        .iter()
        .filter(|r| r.1 == "alloc" && r.3 == "0" && r.4.contains(".warmup"))
        .map(|r| r.4.trim_start_matches("layers.0."))
        .collect();
    assert_eq!(
        &warm[..10],
        [
            "warmup64.dummy_mixed_qkv",
            "warmup64.dummy_a",
            "warmup64.dummy_b",
            "warmup64.q",
            "warmup64.k",
            "warmup64.v",
            "warmup64.g",
            "warmup64.beta",
            "warmup64.state",
            "warmup64.cu_seqlens"
        ]
    );
    assert!(warm.contains(&"warmup64.triton_autotune_l2_flush"));
    assert!(!warm
        .iter()
        .any(|n| n.starts_with("warmup16") || n.contains("l2norm")));
    let layer: Vec<(bool, &str)> = rows
        .iter()
        .filter(|r| r.0 == 1 && r.3 == "1" && (r.1 == "alloc" || r.1 == "free"))
        .map(|r| (r.1 == "alloc", r.4.as_str()))
        .collect();
    let at = |e: (bool, &str)| layer.iter().position(|x| *x == e).unwrap();
    assert!(
        at((false, "layers.1.core_attn_out")) > at((true, "layers.1.out_proj.all_reduce")),
        "{layer:?}"
    );
    assert!(at((false, "layers.1.core_attn_out")) > at((false, "layers.1.norm")));
}

/// From 0.24 the gated attention's split, q/k norms and rotary are one kernel on CUDA
/// (`fused_qk_rmsnorm_rope_gate`: `q_out`, `k_out`, `gate_out`, with the norms' `(1 + w)` made
/// in f32 per call to 0.28); from 0.26 the decoder layer has no `self_attention_output` and
/// takes the mixers' own outputs (0.26.0 models/qwen3_next.py L389-400, L492-570).
#[test]
fn the_attention_fuses_its_norms_from_0_24_and_the_layer_buffer_goes_in_0_26() {
    for (vllm, buffer) in [("0.24", true), ("0.26", false)] {
        let rows = q2_rows("sim:h200-141gb:dry", vllm);
        let names: Vec<&str> = rows
            .iter()
            .filter(|r| r.0 == 1 && r.3 == "3" && r.1 == "alloc")
            .map(|r| r.4.as_str())
            .take_while(|n| !n.starts_with("layers.3.post_attention_layernorm"))
            .collect();
        let mut want = vec![
            "layers.3.input_layernorm.residual",
            "layers.3.input_layernorm",
        ];
        if buffer {
            want.push("layers.3.self_attention_output");
        }
        want.extend([
            "layers.3.qkv_proj.out",
            "layers.3.q_norm.weight.float",
            "layers.3.q_norm.weight_plus_one",
            "layers.3.k_norm.weight.float",
            "layers.3.k_norm.weight_plus_one",
            "layers.3.q_out",
            "layers.3.k_out",
            "layers.3.gate_out",
            "layers.3.attn",
            "layers.3.attn_gated.sigmoid",
            "layers.3.attn_gated",
            "layers.3.o_proj.out",
            "layers.3.o_proj.all_reduce",
        ]);
        assert_eq!(names, want, "{vllm}");
        assert_eq!(
            rows.iter().any(|r| r.4 == "layers.1.self_attention_output"),
            buffer,
            "{vllm}"
        );
    }
}

/// Prefix caching through `plan`'s line and `profile --prefix-caching`: the state groups keep
/// two pages a request with it ("align", `MambaSpec.max_memory_usage_bytes`), which 0.28 turns
/// on by default and names in its log; 0.11 turns it off. 0.21 aligns the block to
/// `--block-size 64` where 0.19 keeps multiples of 16 (0.21.0 platforms/interface.py
/// L613-650). Four ranks: one KV head of 256 in bf16 (1,024 B a token), a state page of
/// 274,432 B: 272 tokens, or 320 aligned to 64.
#[test]
fn prefix_caching_and_the_block_size_follow_the_release_and_the_line() {
    let plan = |vllm: &str, flags: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("r.json");
        let mut args = vec![
            "plan",
            "--json",
            json.to_str().unwrap(),
            "--device",
            "sim:a100-80gb:dry",
            "--vllm",
            vllm,
            "--",
            "vllm",
            "serve",
            "preset:qwen3-next-80b-a3b",
            "--tensor-parallel-size",
            "4",
            "--max-model-len",
            "32768",
            // No graphs: the settings and lines held here come before them.
            "--enforce-eager",
        ];
        args.extend_from_slice(flags);
        let out = common::cli::vramscope(&args);
        common::cli::ok(&out);
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (r["settings"]["block_size"].as_u64().unwrap(), text)
    };
    let line = "Mamba cache mode is set to 'align' for Qwen3NextForCausalLM by default when prefix caching is enabled";
    assert!(plan("0.28", &[]).1.contains(line));
    assert!(!plan("0.28", &["--no-enable-prefix-caching"])
        .1
        .contains(line));
    assert!(plan("0.19", &["--enable-prefix-caching"]).1.contains(line));
    assert!(!plan("0.19", &[]).1.contains(line));
    assert!(plan("0.11", &["--enable-prefix-caching"])
        .1
        .contains("disabling prefix caching"));
    assert_eq!(plan("0.19", &["--block-size", "64"]).0, 272);
    assert_eq!(plan("0.21", &["--block-size", "64"]).0, 320);
    assert_eq!(plan("0.21", &[]).0, 272);

    // The geometry the concurrency and the logged tokens count: one (none) or two (align)
    // pages of each of the three state groups a request (formulas::KvGeometry).
    let profile = |pc: &str| {
        profile_json(
            "sim:a100-80gb:dry",
            ("4", "32768"),
            "0.28",
            &["--prefix-caching", pc],
        )["kv_geometry"]["hybrid"]["mamba_align"]
            .as_bool()
            .unwrap_or(false)
    };
    assert!(profile("on"));
    assert!(!profile("off"));
}

/// From 0.29 Model Runner V2 runs Qwen3-Next (0.29.0 config/vllm.py L645-677), its profile
/// run without attention metadata (`skip_attn`), so the Gated DeltaNet's path is 0.28's
/// (docs/reading/vllm-qwen3-next-mrv2.md). 0.33 on Hopper with prefix caching (its default)
/// exports FlashInfer's prefill checkpoints, not modelled: one line naming them; without
/// prefix caching it runs two more FlashInfer calls per layer after the warm-up's.
#[test]
fn qwen3_next_on_model_runner_v2_and_0_33s_checkpoints_refused_by_name() {
    for vllm in ["0.29", "0.31"] {
        let rows = q2_rows("sim:h200-141gb:dry", vllm);
        assert!(
            rows.iter().any(|r| r.4 == "layers.1.warmup64.output"),
            "{vllm}"
        );
        assert!(
            !rows.iter().any(|r| r.4.contains("weight_plus_one")),
            "{vllm}"
        );
    }
    let out = common::cli::vramscope(&[
        "plan",
        "--device",
        "sim:h200-141gb:dry",
        "--vllm",
        "0.33",
        "--",
        "vllm",
        "serve",
        "preset:qwen3-next-80b-a3b",
        "--tensor-parallel-size",
        "2",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("under vLLM 0.33 on Hopper with prefix caching")
            && err.contains("--no-enable-prefix-caching"),
        "{err}"
    );
    let rows = common::cli::plan_rows(
        "sim:h200-141gb:dry",
        "0.33",
        "preset:qwen3-next-80b-a3b",
        &[
            "--tensor-parallel-size",
            "2",
            "--no-enable-prefix-caching",
            "--enforce-eager",
        ],
    );
    let variants: Vec<&str> = rows
        .iter()
        .filter(|r| r.1 == "alloc" && r.3 == "1" && r.4.contains("warmup64.cp_"))
        .map(|r| r.4.trim_start_matches("layers.1.warmup64."))
        .collect();
    assert_eq!(
        variants,
        ["auto", "off"]
            .iter()
            .flat_map(|v| {
                [
                    "fi_state",
                    "exp_g",
                    "cu_seqlens.i64",
                    "output",
                    "output_state",
                ]
                .map(|n| format!("cp_{v}.{n}"))
            })
            .collect::<Vec<_>>()
    );
    let a100 = common::cli::vramscope(&[
        "plan",
        "--device",
        "sim:a100-80gb:dry",
        "--vllm",
        "0.33",
        "--",
        "vllm",
        "serve",
        "preset:qwen3-next-80b-a3b",
        "--tensor-parallel-size",
        "4",
        "--max-model-len",
        "32768",
        "--enforce-eager",
    ]);
    common::cli::ok(&a100);
}

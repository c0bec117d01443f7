//! gpt-oss through the binary as a user runs it: a small 16-bit checkpoint pasted into `plan`
//! under vLLM 0.19 on a simulated H100, its own CUDA graph sizes, and the releases that have
//! no gpt_oss.py refused by name.

mod common;

use std::process::Command;

fn plan(dir: &std::path::Path, vllm: &str, util: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "plan",
            "--vllm",
            vllm,
            "--device",
            "sim:h100-sxm:dry",
            "--",
            "vllm",
            "serve",
            dir.to_str().unwrap(),
            "--gpu-memory-utilization",
            util,
        ])
        .output()
        .expect("run vramscope");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// GptOssForCausalLMConfig raises the largest capture size to 1024 under 0.19 (83 sizes per
/// mode, whatever the 2 × max_num_seqs rule would give), and the hybrid KV manager groups the
/// sliding and full layers.
#[test]
fn plan_captures_gpt_oss_own_graph_sizes_under_0_19() {
    let dir = tempfile::tempdir().unwrap();
    common::write_hf_test_model(dir.path(), "gpt_oss");
    let (ok, text) = plan(dir.path(), "0.19", "0.95");
    assert!(ok, "{text}");
    assert!(
        text.contains("(83 PIECEWISE sizes + 83 FULL sizes)"),
        "{text}"
    );
    assert!(text.contains("GPU KV cache size:"), "{text}");
}

#[test]
fn a_release_without_gpt_oss_py_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    common::write_hf_test_model(dir.path(), "gpt_oss");
    let (ok, text) = plan(dir.path(), "0.8", "0.9");
    assert!(!ok);
    assert!(
        text.contains("no model file for model_type 'gpt_oss' (gpt_oss.py arrived in vLLM 0.10.1"),
        "{text}"
    );
}

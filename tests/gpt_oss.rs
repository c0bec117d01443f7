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

/// Issue 44, item 3: the hub id as published (MXFP4 experts) plans on a dry H100 under 0.19
/// and prints vLLM's KV cache line.
#[test]
fn openai_gpt_oss_20b_plans_with_its_mxfp4_experts_on_an_h100() {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "plan",
            "--vllm",
            "0.19",
            "--device",
            "sim:h100-80gb:dry",
            "--",
            "vllm",
            "serve",
            "openai/gpt-oss-20b",
        ])
        .output()
        .expect("run vramscope");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("GPU KV cache size:"), "{text}");
}

/// Writes `dir`'s MXFP4 checkpoint again with 16-bit experts holding the dequantized values
/// (`gate_up_proj [E, H, 2I]`, `down_proj [E, I, H]`, as transformers dequantizes them), every
/// other tensor as it is, and config.json without its quantization_config.
fn dequantized_copy(dir: &std::path::Path, out: &std::path::Path) {
    use safetensors::tensor::TensorView;
    use vramscope::quant::mxfp4::{dequantize, BLOCK};
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>, safetensors::Dtype)> = Vec::new();
    for (name, view) in st.tensors() {
        if name.ends_with("_scales") {
            continue;
        }
        if let Some(base) = name.strip_suffix("_blocks") {
            let scales = st.tensor(&format!("{base}_scales")).unwrap();
            let s = view.shape();
            let (e, rows, cols) = (s[0], s[1], s[2] * BLOCK);
            let w = dequantize(view.data(), scales.data(), e * rows, cols);
            // [E, rows, cols] to [E, cols, rows].
            let mut t = vec![0f32; w.len()];
            for x in 0..e {
                for r in 0..rows {
                    for c in 0..cols {
                        t[x * rows * cols + c * rows + r] = w[x * rows * cols + r * cols + c];
                    }
                }
            }
            let data = t
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect();
            owned.push((base.to_string(), vec![e, cols, rows], data, safetensors::Dtype::BF16));
        } else {
            owned.push((
                name.clone(),
                view.shape().to_vec(),
                view.data().to_vec(),
                view.dtype(),
            ));
        }
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, s, d, dt)| (n.clone(), TensorView::new(*dt, s.clone(), d).unwrap()))
        .collect();
    std::fs::create_dir_all(out).unwrap();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(out.join("config.json"), cfg.to_string()).unwrap();
}

fn cpu_logits(dir: &std::path::Path) -> Vec<f32> {
    use vramscope::app::bench::{self, BenchRequest};
    let req = BenchRequest {
        model: vramscope::model::ModelSource::Path {
            path: dir.to_path_buf(),
        },
        quant: vramscope::quant::Quant::BF16,
        device: vramscope::device::DeviceSpec::parse("sim:h100-80gb").unwrap(),
        tokens: 11,
        seqs: 2,
        iters: 0,
        fast_weights: false,
        int8_threshold: 0.0,
        seed: 0,
        op_times: false,
        sampler_rows: 0,
        sampler_seqs: 256,
        tp: 1,
    };
    bench::run(&req).unwrap().logits
}

/// A small seeded MXFP4 checkpoint (`gen-model gpt-oss-tiny`) computes on the CPU the logits
/// of the same model with its experts dequantized into a 16-bit checkpoint: the experts'
/// values are the same (e2m1 · 2^scale is exact in bf16), so only the layout differs.
#[test]
fn mxfp4_experts_compute_the_logits_of_their_dequantized_16_bit_model() {
    let dir = tempfile::tempdir().unwrap();
    let mx = dir.path().join("mxfp4");
    let opts = vramscope::model::GenOptions {
        dtype: vramscope::model::weights::StoredDtype::BF16,
        seed: 5,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    vramscope::model::gen_model_with("gpt-oss-tiny", &mx, &opts).unwrap();
    let dense = dir.path().join("bf16");
    dequantized_copy(&mx, &dense);
    let (a, b) = (cpu_logits(&mx), cpu_logits(&dense));
    assert_eq!(a.len(), b.len());
    let e = vramscope::app::bench::relative_l2(&a, &b);
    eprintln!("gpt-oss-tiny MXFP4 against its dequantized bf16 copy: relative L2 {e:.3e}");
    assert!(e < 1e-6, "relative L2 {e:.3e}");
    let norm = b.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "logits norm {norm}");
}

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
            owned.push((
                base.to_string(),
                vec![e, cols, rows],
                data,
                safetensors::Dtype::BF16,
            ));
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

/// gpt-oss-tiny (`gen-model gpt-oss-tiny`, bf16, `seed`) as published (MXFP4 experts) and
/// its dequantized 16-bit copy, in a temporary folder that lives as long as the first value.
fn tiny_pair(seed: u64) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mx = dir.path().join("mxfp4");
    let opts = vramscope::model::GenOptions {
        dtype: vramscope::model::weights::StoredDtype::BF16,
        seed,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    vramscope::model::gen_model_with("gpt-oss-tiny", &mx, &opts).unwrap();
    let dense = dir.path().join("bf16");
    dequantized_copy(&mx, &dense);
    (dir, mx, dense)
}

fn cpu_logits(dir: &std::path::Path) -> Vec<f32> {
    cpu_logits_tp(dir, 1, vramscope::quant::Quant::BF16)
}

fn cpu_logits_tp(dir: &std::path::Path, tp: u32, quant: vramscope::quant::Quant) -> Vec<f32> {
    cpu_logits_parallel(dir, (tp, false), quant)
}

fn cpu_logits_parallel(
    dir: &std::path::Path,
    (tp, ep): (u32, bool),
    quant: vramscope::quant::Quant,
) -> Vec<f32> {
    use vramscope::app::bench::{self, BenchRequest};
    let req = BenchRequest {
        model: vramscope::model::ModelSource::Path {
            path: dir.to_path_buf(),
        },
        quant,
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
        tp,
        ep,
    };
    bench::run(&req).unwrap().logits
}

/// A small seeded MXFP4 checkpoint (`gen-model gpt-oss-tiny`) computes on the CPU the logits
/// of the same model with its experts dequantized into a 16-bit checkpoint: the experts'
/// values are the same (e2m1 · 2^scale is exact in bf16), so only the layout differs.
#[test]
fn mxfp4_experts_compute_the_logits_of_their_dequantized_16_bit_model() {
    let (_dir, mx, dense) = tiny_pair(5);
    let (a, b) = (cpu_logits(&mx), cpu_logits(&dense));
    assert_eq!(a.len(), b.len());
    let e = vramscope::app::bench::relative_l2(&a, &b);
    eprintln!("gpt-oss-tiny MXFP4 against its dequantized bf16 copy: relative L2 {e:.3e}");
    assert!(e < 1e-6, "relative L2 {e:.3e}");
    let norm = b.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!(norm > 1e-2, "logits norm {norm}");
}

/// transformers 5.25's GptOssForCausalLM on the same checkpoint (`gen-model gpt-oss-tiny DIR
/// --dtype bf16 --seed 5`), which on a CPU dequantizes the MXFP4 experts itself (its
/// `Mxfp4HfQuantizer` falls back to `dequantize`: "We will default to dequantizing the model
/// to bf16"), in fp32 otherwise: the last token's logits at ids 3, 19, ..., 1011 of the two
/// sequences, from `python3 scripts/hf_reference.py DIR gpt_oss_mxfp4` (torch 2.15.0,
/// transformers 5.25.0, accelerate installed, which its MXFP4 quantizer requires).
#[test]
fn mxfp4_logits_match_transformers_dequantizing_them() {
    let dir = tempfile::tempdir().unwrap();
    let opts = vramscope::model::GenOptions {
        dtype: vramscope::model::weights::StoredDtype::BF16,
        seed: 5,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    vramscope::model::gen_model_with("gpt-oss-tiny", dir.path(), &opts).unwrap();
    let ours = cpu_logits(dir.path());
    let picked: Vec<f32> = (0..2)
        .flat_map(|s| (3..1024).step_by(16).map(move |i| (s, i)))
        .map(|(s, i)| ours[s * 1024 + i])
        .collect();
    let theirs: Vec<f32> = HF_GPT_OSS_MXFP4
        .iter()
        .flatten()
        .map(|&v| v as f32)
        .collect();
    let e = vramscope::app::bench::relative_l2(&picked, &theirs);
    eprintln!("gpt-oss-tiny MXFP4 against transformers: relative L2 {e:.3e}");
    assert!(e < 1e-3, "relative L2 {e:.3e}");
}

// gpt_oss_mxfp4: GptOssForCausalLM
#[rustfmt::skip]
#[allow(clippy::excessive_precision)]
const HF_GPT_OSS_MXFP4: [[f64; 64]; 2] = [
    [7.40633532e-02, -2.11009793e-02, 2.17660218e-01, -9.68313813e-02, -5.94566762e-02, -3.79366018e-02, -3.58418256e-01, -7.77272582e-02, -7.76054859e-02, -2.73446292e-01, 6.05058484e-03, 5.18249944e-02, -2.45057091e-01, 1.30755514e-01, -1.02984995e-01, -1.07979231e-01, -1.32828295e-01, 2.06706077e-01, 1.84701145e-01, -5.38592264e-02, 3.72110195e-02, 9.40666273e-02, 5.72565556e-01, 6.92469031e-02, -1.66148126e-01, 1.46646455e-01, -1.37482658e-01, -7.27394149e-02, 9.11235437e-02, 3.61262172e-01, 1.61260128e-01, 1.68753073e-01, -6.61798045e-02, -1.64286196e-02, -8.74523148e-02, 2.46791139e-01, 3.51819322e-02, 7.60730077e-03, 5.67194596e-02, -1.21618792e-01, 1.16727225e-01, -1.28377080e-01, 1.70683205e-01, 1.30918771e-01, -4.04695094e-01, -3.59104984e-02, -4.19203863e-02, -8.03930983e-02, 1.05795518e-01, -1.96583718e-01, 2.04768758e-02, 4.00574833e-01, 3.82351667e-01, -7.52301812e-01, 9.29766744e-02, 1.77918658e-01, 2.89280295e-01, 2.91770428e-01, 6.99849054e-02, 5.16642667e-02, 7.82032236e-02, -2.36931607e-01, -1.68986097e-02, 6.24628723e-01],
    [3.25183719e-01, 1.92901894e-01, 1.10585131e-01, -1.56531587e-01, -9.30048451e-02, 3.32496673e-01, -1.97310925e-01, 1.65811360e-01, -1.88643873e-01, -6.59683645e-02, 1.07149862e-01, -4.53401268e-01, -3.65788847e-01, 2.92994291e-01, 1.67078495e-01, -3.79830264e-02, -3.34175110e-01, -3.69950175e-01, 4.58349437e-02, -5.21053910e-01, -1.60613388e-01, 2.63445795e-01, 6.98514059e-02, -3.70170593e-01, -1.54352680e-01, -6.90806806e-02, -2.02945188e-01, 3.14386457e-01, -3.39034766e-01, 3.64188313e-01, -4.15700637e-02, 1.34152815e-01, -1.82767540e-01, -1.04284473e-01, 4.93966527e-02, 2.50999153e-01, -2.30323318e-02, 2.36474738e-01, -1.99228555e-01, 2.90754259e-01, -7.49095529e-02, 9.16340947e-02, 8.95355269e-02, 2.07237288e-01, -1.14264682e-01, -2.41078258e-01, -4.80049431e-01, -1.38212591e-01, -2.31145322e-03, 8.10000449e-02, 6.46222532e-02, -1.72876969e-01, 8.35989118e-02, 2.42960677e-02, 2.60709375e-02, -1.24745369e-01, 1.53749790e-02, 4.50105369e-01, 1.03059411e-01, 7.75164589e-02, -2.57297993e-01, 4.98396188e-01, -1.36819184e-01, -1.10449068e-01],
];

/// The MXFP4 experts weigh what each GPU class's backend leaves after loading: Marlin's
/// repack at 3072 × 2944 on an A100 gives the 13.72 GiB public vLLM logs print for
/// gpt-oss-20b with the MARLIN backend ("Model loading took 13.72 GiB"); triton_kernels'
/// swizzled layouts on an H100 under 0.19 13.64 GiB, its strided one under 0.11's torch 2.8.0
/// 12.88 GiB.
#[test]
fn gpt_oss_20b_weighs_what_each_backend_leaves() {
    for (device, vllm, weights) in [
        ("sim:a100-80gb:dry", "0.19", "weights memory: 13.72GiB"),
        ("sim:h100-80gb:dry", "0.19", "weights memory: 13.64GiB"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args([
                "plan",
                "--vllm",
                vllm,
                "--device",
                device,
                "--",
                "vllm",
                "serve",
                "openai/gpt-oss-20b",
            ])
            .output()
            .expect("run vramscope");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success() && text.contains(weights),
            "{device}: {text}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "profile",
            "--model",
            "preset:gpt-oss-20b",
            "--device",
            "sim:h200:dry",
            "--vllm",
            "0.11",
        ])
        .output()
        .expect("run vramscope");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains("weights 12.88 GiB (13834954752 bytes)"),
        "{text}"
    );
}

/// A command docs/cli.md shows, checked to be there and run as written: exit code and stdout
/// + stderr.
fn docs_line(line: &str) -> (Option<i32>, String) {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    assert!(docs.contains(line), "{line}");
    let args: Vec<&str> = line.split(' ').skip(1).collect();
    let out = common::cli::vramscope(&args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// `vramscope plan --vllm V --device sim:h100-sxm -- vllm serve openai/gpt-oss-120b ARGS`:
/// exit code and stdout + stderr (the preset's shapes: the model is not on disk).
fn plan_120b(vllm: &str, args: &[&str]) -> (Option<i32>, String) {
    plan_120b_with(&[], vllm, args)
}

/// `plan_120b` with plan options (`--json F`) before the pasted line.
fn plan_120b_with(opts: &[&str], vllm: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut argv = vec!["plan"];
    argv.extend_from_slice(opts);
    argv.extend([
        "--vllm",
        vllm,
        "--device",
        "sim:h100-sxm",
        "--",
        "vllm",
        "serve",
        "openai/gpt-oss-120b",
    ]);
    argv.extend_from_slice(args);
    let out = common::cli::vramscope(&argv);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// vLLM issue #33155 ("gptoss120B is OOM on one H100 after upgrading from v0.11.2 to
/// v0.14.1"), its two commands as filed: under 0.11 both start; under 0.19 the same commands
/// run out of memory, the second even with one sequence of 5K tokens. The cause is the one vLLM
/// PR #41268 describes: the Hopper swizzle of each layer's MXFP4 experts frees the loaded w13
/// values (1,014 MiB segments) and PyTorch places the next swizzled w2 (530 MiB with 0.19's
/// triton_kernels 3.6, which pads to 64) inside one, splitting it, so that memory stays
/// stranded beside it in every such segment; vLLM's budget counts that reserved but
/// unallocated memory as free (0.21 loads under `max_split_size_mb=20` to stop it). The
/// diagnosis names 0.11 as a release the same command starts under.
///
/// 0.14.1 and 0.15.1 as their wheels ship vendor triton_kernels 3.5.1 (the same files as
/// 0.22.1's), whose layout does not pad: the swizzled w13 then fits the freed segment exactly
/// and the first command starts under 0.15 with 0.8 GiB to spare. The issue's 0.14.1 failure
/// is not reproduced from the wheel; a triton_kernels installed beside vLLM takes precedence
/// (`import_triton_kernels`, 0.15.1 utils/import_utils.py L58-84), which vramscope does not
/// model.
#[test]
fn gpt_oss_120b_on_one_h100_starts_under_0_11_and_runs_out_of_memory_under_0_19() {
    let issue = |len: &'static str, seqs: &'static str| {
        [
            "--gpu-memory-utilization",
            "0.97",
            "-O3",
            "--enable-chunked-prefill",
            "--enable-prefix-caching",
            "--async-scheduling",
            "--max_num_seqs",
            seqs,
            "--tool-call-parser",
            "openai",
            "--enable-auto-tool-choice",
            "--tensor-parallel-size",
            "1",
            "--max-model-len",
            len,
        ]
    };
    for (len, seqs) in [("87040", "100"), ("5120", "1")] {
        let (code, text) = plan_120b("0.11", &issue(len, seqs));
        assert_eq!(code, Some(0), "0.11 {len} {seqs}: {text}");
        assert!(text.contains("GPU KV cache size: "), "{text}");
        let (code, text) = plan_120b("0.15", &issue(len, seqs));
        assert_eq!(code, Some(0), "0.15 {len} {seqs}: {text}");
        let vllm = "0.19";
        let (code, text) = plan_120b(vllm, &issue(len, seqs));
        assert_ne!(code, Some(0), "{vllm} {len} {seqs}: {text}");
        assert!(
            text.contains(&format!(
                "vLLM {vllm} would not start: the GPU ran out of memory"
            )),
            "{text}"
        );
        // The stranded blocks, said with the reproduction.
        let stranded: f64 = text
            .split("after the profile PyTorch still holds ")
            .nth(1)
            .and_then(|s| s.split(" GiB").next())
            .unwrap_or_else(|| panic!("{text}"))
            .parse()
            .unwrap();
        assert!(stranded > 9.0, "{stranded}: {text}");
        // The regression as the issue reports it: the same command starts under 0.11.
        let under = text
            .split("the same command starts under:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{text}"));
        assert!(under.trim_start().starts_with("--vllm 0.11 "), "{text}");
    }
}

/// With vLLM's defaults (util 0.9, 1024 sequences on an H100) 0.19 stops in the profile run
/// itself: the sampler's 786 MiB logits copy finds no block among the 10.7 GiB PyTorch holds
/// unallocated. `plan` says so as vLLM's failed start (PyTorch's message, the allocation), and
/// its JSON holds the diagnosis. (No single change starts it on this GPU: a quarter of the
/// sequences gets past the sampler, then 4.61 GiB of KV cache is short of one 131,072-token
/// request.)
#[test]
fn a_profile_that_runs_out_of_memory_is_a_start_that_fails() {
    let (code, text) = docs_line(
        "vramscope plan --vllm 0.19 --device sim:h100-sxm -- vllm serve openai/gpt-oss-120b",
    );
    assert_eq!(code, Some(3), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("plan.json");
    let (code, again) = plan_120b_with(&["--json", json.to_str().unwrap()], "0.19", &[]);
    assert_eq!(
        (code, again.lines().count()),
        (Some(3), text.lines().count()),
        "{again}"
    );
    assert!(text.contains("vLLM 0.19 would not start: the GPU ran out of memory while loading or profiling the model, before any KV cache"), "{text}");
    assert!(text.contains("reserved but unallocated"), "{text}");
    assert!(
        text.contains("stops while allocating sampler.exponential"),
        "{text}"
    );
    assert!(
        text.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{text}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let f = &doc["diagnosis"]["failure"];
    assert_eq!(f["kind"], "out_of_memory", "{doc}");
    let (tried, free, unallocated) = (
        f["tried_gib"].as_f64().unwrap(),
        f["free_gib"].as_f64().unwrap(),
        f["unallocated_gib"].as_f64().unwrap(),
    );
    assert!(tried > free && unallocated > 10.0 * tried, "{f}");
}

/// Tensor parallel cuts gpt-oss as gpt_oss.py's loaders do (0.19 L341-520, L976-1060): each
/// rank its heads and sinks, its rows of qkv and columns of o_proj (the bias added on rank 0),
/// its vocabulary rows, and a slice of every expert's width: MXFP4 in whole 32-wide blocks
/// (`cdiv(I / 32, tp)` a rank: gpt-oss-tiny's width of 96 goes 64 + 32 over 2 ranks and
/// 32 + 32 + 32 + 0 over 4), 16-bit in `cdiv(I, tp)` columns; `w2_bias` on rank 0 only. The
/// ranks' all-reduced logits are one GPU's (in f32, so that only the order of the sums differs).
#[test]
fn tensor_parallel_ranks_compute_the_logits_of_one_gpu() {
    const Q: vramscope::quant::Quant = vramscope::quant::Quant::F32;
    let (_dir, mx, dense) = tiny_pair(7);
    for model in [&mx, &dense] {
        let one = cpu_logits_tp(model, 1, Q);
        for tp in [2, 4] {
            let split = cpu_logits_tp(model, tp, Q);
            assert_eq!(one.len(), split.len());
            let e = vramscope::app::bench::relative_l2(&split, &one);
            eprintln!(
                "{}: TP {tp} against one GPU: relative L2 {e:.3e}",
                model.display()
            );
            assert!(
                e < 1e-5,
                "{}: TP {tp}: relative L2 {e:.3e}",
                model.display()
            );
        }
    }
}

/// Expert parallel: each rank loads its experts whole (gpt-oss-tiny's 8: 4 a rank over 2, 2
/// over 4) with `w2_bias`, routes every token over the 8 through the expert map, and adds
/// nothing for an expert elsewhere; the all-reduce after the block sums the ranks. The logits
/// are one GPU's (in f32). vLLM runs this for MXFP4 checkpoints on Hopper from 0.19.
#[test]
fn expert_parallel_ranks_compute_the_logits_of_one_gpu() {
    const Q: vramscope::quant::Quant = vramscope::quant::Quant::F32;
    let (_dir, mx, _dense) = tiny_pair(11);
    let one = cpu_logits_tp(&mx, 1, Q);
    for n in [2, 4] {
        let split = cpu_logits_parallel(&mx, (n, true), Q);
        assert_eq!(one.len(), split.len());
        let e = vramscope::app::bench::relative_l2(&split, &one);
        eprintln!("EP {n} against one GPU: relative L2 {e:.3e}");
        assert!(e < 1e-5, "EP {n}: relative L2 {e:.3e}");
    }
}

/// vLLM PR #41268 ("Fix OOM by setting PyTorch `max_split_size_mb` during model loading",
/// in 0.21): after the upgrade to PyTorch 2.10 (vLLM 0.19) GPT-OSS 120B at TP 2 on two H100s
/// no longer started at the default utilization. Its description: each rank's swizzled w13
/// takes 530 MiB and w2 270 MiB; the w2 is placed inside a cached 530 MiB segment and split,
/// leaving a 260 MiB remainder nothing else fits. vramscope's TP 2 rank makes those blocks
/// (the rank's experts 1,472 wide, `cdiv(2880 / 32, 2) · 32` = 1,440 loaded, padded to 64 by
/// triton_kernels 3.6: 554,696,704 and 283,115,520 bytes), and the start fails under 0.19 with
/// the stranded memory named; it starts under 0.21 (the PR's `max_split_size_mb=20` around
/// the load) and under 0.15 (PyTorch 2.9, triton_kernels 3.5.1). TP 4 and 8 start under 0.19.
#[test]
fn gpt_oss_120b_at_tp_2_reproduces_vllm_pr_41268() {
    let (code, text) = docs_line("vramscope plan --vllm 0.19 --device sim:h100-sxm -- vllm serve openai/gpt-oss-120b --tensor-parallel-size 2");
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.contains("vLLM 0.19 would not start")
            && text.contains("reserved but unallocated")
            && text.contains("the same command starts under:"),
        "{text}"
    );
    let under = text.split("the same command starts under:").nth(1).unwrap();
    assert!(
        under.contains("--vllm 0.15 ") && under.contains("--vllm 0.21 "),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("tp2.json");
    let out = common::cli::vramscope(&[
        "profile",
        "--model",
        "preset:gpt-oss-120b",
        "--device",
        "sim:h100-sxm:dry",
        "--vllm",
        "0.19",
        "--tp",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let made = |name: &str| -> u64 {
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| {
                e["kind"] == "alloc"
                    && e["tensor"].as_str().is_some_and(|t| {
                        t.starts_with("model.layers.0.mlp.experts.") && t.contains(name)
                    })
            })
            .and_then(|e| e["bytes"].as_u64())
            .unwrap_or_else(|| panic!("no {name} in {}", json.display()))
    };
    // 554,696,704 bytes in a 530 MiB block: PyTorch splits a cached block only when more than
    // 1 MiB would remain, and here exactly 1 MiB does.
    assert_eq!(made("w13_weight (HOPPER_VALUE)"), 530 << 20);
    assert_eq!(made("w2_weight (HOPPER_VALUE)"), 270 << 20);
    for tp in ["4", "8"] {
        let (code, text) = plan_120b("0.19", &["--tensor-parallel-size", tp]);
        assert_eq!(code, Some(0), "TP {tp}: {text}");
    }
}

/// `profile --model preset:gpt-oss-20b --device sim:h100-80gb:dry --vllm V --json F`: the
/// report's `weights_tensor_bytes` (the live weight tensors, not the memory the load took).
fn weights_20b_on_hopper(vllm: &str) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let out = common::cli::vramscope(&[
        "profile",
        "--model",
        "preset:gpt-oss-20b",
        "--device",
        "sim:h100-80gb:dry",
        "--vllm",
        vllm,
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "--vllm {vllm}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    v["weights_tensor_bytes"].as_u64().unwrap()
}

/// gpt-oss-20b's MXFP4 experts on Hopper release by release, against 0.19 (per layer, 24
/// layers; docs/reading/vllm-gpt-oss-v1.md §3.2): 0.15 and 0.22-0.24 vendor triton_kernels
/// 3.5.1, whose value layout keeps gpt-oss's bytes (8,847,360 fewer a layer than 3.6's pad
/// to 64 in 0.19 and 0.21); 0.25.1 also frees the loaded scales (33,730,560 fewer); 0.26 on
/// pads the swizzled scales' groups to 4 (33,157,120 fewer). The runner changes (V1 through
/// 0.28, Model Runner V2 from 0.29) leave the weights alone, and every release starts.
#[test]
fn gpt_oss_20b_weights_follow_each_releases_triton_kernels() {
    let base = weights_20b_on_hopper("0.19");
    for (vllm, fewer_per_layer) in [
        ("0.15", 8_847_360u64),
        ("0.21", 0),
        ("0.22", 8_847_360),
        ("0.24", 8_847_360),
        ("0.25", 33_730_560),
        ("0.26", 33_157_120),
        ("0.28", 33_157_120),
        ("0.29", 33_157_120),
        ("0.33", 33_157_120),
    ] {
        let bytes = weights_20b_on_hopper(vllm);
        assert_eq!(base - bytes, 24 * fewer_per_layer, "--vllm {vllm}");
    }
}

/// A 16-bit gpt-oss checkpoint from 0.21 goes through the unquantized MoE oracle with
/// swigluoai: FlashInfer's CUTLASS experts take it on Hopper under 0.21 and 0.22 and on the
/// B200 until 0.25.1 puts FlashInfer behind Triton for swigluoai (0.25.1
/// oracle/unquantized.py L87-92), refused by name there; Triton's modular experts run it
/// elsewhere (Hopper from 0.23, the B200 from 0.25). The MXFP4 checkpoint runs under 0.21.
#[test]
fn sixteen_bit_gpt_oss_from_0_21_runs_where_triton_does() {
    let (_dir, mx, dense) = tiny_pair(5);
    let on = |device: &str, vllm: &str| {
        let out = common::cli::vramscope(&[
            "plan",
            "--vllm",
            vllm,
            "--device",
            device,
            "--",
            "vllm",
            "serve",
            dense.to_str().unwrap(),
        ]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    for (device, vllm, starts) in [
        ("sim:h100-sxm:dry", "0.21", false),
        ("sim:h100-sxm:dry", "0.23", true),
        ("sim:a100-sxm4-80gb:dry", "0.21", true),
        ("sim:b200:dry", "0.24", false),
        ("sim:b200:dry", "0.25", true),
        ("sim:h100-sxm:dry", "0.33", true),
    ] {
        let (code, text) = on(device, vllm);
        if starts {
            assert_eq!(code, Some(0), "{device} {vllm}: {text}");
        } else {
            assert_eq!(code, Some(2), "{device} {vllm}: {text}");
            assert!(
                text.contains("FlashInfer's CUTLASS MoE") && text.contains("gpt-oss"),
                "{device} {vllm}: {text}"
            );
        }
    }
    let (ok, text) = plan(&mx, "0.21", "0.9");
    assert!(ok, "{text}");
}

/// gpt-oss with expert or data parallel, as pasted: each release's answer in one line. 0.11
/// and 0.15 fail on an H100 with `--enable-expert-parallel` (their MXFP4 Triton kernel ignores
/// the expert map: vLLM PR #34270), 0.11 with `--data-parallel-size` at load; from 0.19 vLLM
/// runs them: expert parallel within one replica on Hopper is modelled (below), data parallel
/// and other GPUs' experts behind an expert map are named as not modelled.
#[test]
fn gpt_oss_with_expert_or_data_parallel_is_answered_release_by_release() {
    let ep = ["-tp", "2", "--enable-expert-parallel"];
    for v in ["0.11", "0.15"] {
        let (code, out) = plan_120b(v, &ep);
        assert_eq!(code, Some(2), "{out}");
        assert_eq!(out.trim().lines().count(), 1, "{out}");
        assert!(
            out.contains(&format!("gpt_oss with --enable-expert-parallel over 2 GPUs: vLLM {v} fails here: its MXFP4 Triton kernel routes the global expert ids")),
            "{out}"
        );
    }
    let (code, out) = plan_120b("0.11", &["--data-parallel-size", "2"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("gpt_oss with --data-parallel-size 2: vLLM 0.11 fails here: its loader cuts the experts by tensor-parallel rank alone"),
        "{out}"
    );
    for v in ["0.19", "0.33"] {
        let (code, out) = plan_120b(v, &["--data-parallel-size", "2"]);
        assert_eq!(code, Some(2), "{out}");
        assert_eq!(out.trim().lines().count(), 1, "{out}");
        assert!(
            out.contains(&format!("gpt_oss with --data-parallel-size 2 under vLLM {v}: data parallel (OAITritonExperts behind the naive dispatch")),
            "{out}"
        );
    }
    // The A100 runs Marlin's experts: with an expert map they are not modelled.
    let out = common::cli::vramscope(&[
        "plan",
        "--vllm",
        "0.19",
        "--device",
        "sim:a100-80gb",
        "--",
        "vllm",
        "serve",
        "openai/gpt-oss-120b",
        "-tp",
        "2",
        "--enable-expert-parallel",
    ]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("Marlin's or TRT-LLM's experts behind an expert map"),
        "{text}"
    );
}

/// `profile` of gpt-oss-20b on simulated H100s (dry) under `vllm`, `tp` ranks, with or
/// without expert parallel: rank 0's report.
fn profile_20b(vllm: &str, tp: u32, ep: bool) -> vramscope::profile::Report {
    use vramscope::profile::{self, ProfileRequest};
    let req = ProfileRequest {
        model: vramscope::model::ModelSource::parse("preset:gpt-oss-20b").unwrap(),
        quant: vramscope::quant::Quant::BF16,
        device: vramscope::device::DeviceSpec::parse("sim:h100-80gb:dry").unwrap(),
        vllm: vllm.into(),
        tp,
        enable_expert_parallel: ep,
        max_model_len: 8192,
        verify: false,
        enforce_eager: true,
        ..ProfileRequest::default()
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    profile::run(&req, None, stop).unwrap()
}

/// Bytes of the first allocation of `layers.0.{suffix}` in the first profile pass.
fn layer0_alloc(r: &vramscope::profile::Report, suffix: &str) -> u64 {
    r.events
        .iter()
        .find(|e| {
            e.kind == vramscope::memory::EventKind::Alloc
                && e.pass == 1
                && e.tensor == format!("layers.0.{suffix}")
        })
        .map(|e| e.bytes)
        .unwrap_or_else(|| panic!("no layers.0.{suffix} in the pass"))
}

/// Expert parallel over the two ranks of one replica on Hopper, from 0.19 (docs/reading/
/// vllm-gpt-oss-ep.md §3, §4.1): each rank loads 16 of gpt-oss-20b's 32 experts whole (the
/// full 2,880 width, `w2_bias` on every rank), so its expert bytes are exactly half one GPU's
/// in every release (the Triton layouts are linear in the expert count); an int32
/// `expert_map [32]` per layer; in the pass the intermediate cache keeps the whole width,
/// `[M·k, 2880]` (TP 2 gives 1,472), and the routing goes through triton_kernels' `topk`, the
/// map and `make_routing_data` (the bitmatrix of 32 experts one uint32 a token row, padded to
/// 32 rows).
#[test]
fn gpt_oss_expert_parallel_ranks_hold_half_the_experts_whole() {
    for vllm in ["0.19", "0.22", "0.33"] {
        let one = profile_20b(vllm, 1, false);
        let ep = profile_20b(vllm, 2, true);
        let tp = profile_20b(vllm, 2, false);
        let (a, b) = (
            one.resident_expert_bytes().unwrap(),
            ep.resident_expert_bytes().unwrap(),
        );
        // The events carry the allocator's blocks, which round each tensor up by under 1 MiB
        // (a block is not split when less would remain): half one GPU's, block by block.
        let blocks = ep
            .events
            .iter()
            .filter(|e| {
                e.pass == 0
                    && e.kind == vramscope::memory::EventKind::Alloc
                    && e.tensor.contains(".experts.")
                    && !e.tensor.ends_with("expert_map")
            })
            .count() as u64;
        assert!(
            (2 * b).abs_diff(a) <= (2 * blocks) << 20,
            "--vllm {vllm}: EP 2 {b} against one GPU {a}"
        );
        assert!((2 * b).abs_diff(a) < a / 200, "--vllm {vllm}: {b} {a}");
        assert!(
            tp.resident_expert_bytes().unwrap() > b,
            "--vllm {vllm}: TP 2 pads each rank's width (1,440 loaded into 1,472)"
        );
        let maps = ep
            .events
            .iter()
            .filter(|e| {
                e.kind == vramscope::memory::EventKind::Alloc
                    && e.tensor.ends_with("experts.expert_map")
            })
            .count();
        assert_eq!(maps, 24, "--vllm {vllm}");
        // The pass's tokens from the router's logits, `[M, 32]` bf16.
        let m = layer0_alloc(&ep, "moe.router_logits") / (32 * 2);
        assert_eq!(m, 8192);
        assert_eq!(
            layer0_alloc(&ep, "moe.intermediate_cache"),
            m * 4 * 2880 * 2
        );
        assert_eq!(
            layer0_alloc(&tp, "moe.intermediate_cache"),
            m * 4 * 1472 * 2
        );
        assert_eq!(
            layer0_alloc(&ep, "moe.topk.bitmatrix (uint32)"),
            m.div_ceil(32) * 32 * 4
        );
        assert_eq!(layer0_alloc(&ep, "moe.combined_indx"), 2 * m * 4 * 4);
        let sentence = ep.experts_sentence().unwrap();
        assert!(
            sentence.contains(&format!(
                "({} of weights a rank",
                vramscope::base::units::fmt_u(b)
            )),
            "{sentence}"
        );
    }
}

/// The documented line: gpt-oss-120b over two H100s with expert parallel under 0.33 plans,
/// each rank holding 64 of the 128 experts.
#[test]
fn the_documented_gpt_oss_expert_parallel_plan_runs() {
    let (code, text) = docs_line("vramscope plan --vllm 0.33 --device sim:h100-sxm -- vllm serve openai/gpt-oss-120b --tensor-parallel-size 2 --enable-expert-parallel");
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("each holds whole experts, 64 of the 128 (determine_expert_map, linear)"),
        "{text}"
    );
}

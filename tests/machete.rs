//! GPTQ, AWQ and compressed-tensors w4a16 on Hopper under the V1 releases: vLLM's
//! `choose_mp_linear_kernel` gives these layers to `MacheteLinearKernel` there
//! (docs/reading/vllm-machete.md). Its load keeps the stored words' bytes (prepacked in an
//! `empty_like` copy), leaves GPTQ's zeros and g_idx allocated (Marlin empties them), turns
//! AWQ's zeros into `[groups, n]` `-s·z` in the activation dtype and makes no workspace; its
//! forward allocates the output and, for some shapes, CUTLASS's stream-K workspace.

mod common;

use common::cli::{gen_tiny as gen, ok, profile_json_under as profile_under, vramscope};
use std::path::Path;

/// A GPTQ 4-bit, group-128 checkpoint of Meta-Llama-3-8B's shape (TheBloke's and others'
/// `…-GPTQ` repositories: `quant_method` gptq, `bits` 4, `group_size` 128, `desc_act` false,
/// `sym` true), config only: a dry plan.
const LLAMA3_8B_GPTQ: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
 "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
 "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
 "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
 "tie_word_embeddings": false, "hidden_act": "silu", "torch_dtype": "float16",
 "quantization_config": {"bits": 4, "group_size": 128, "desc_act": false, "sym": true,
                         "quant_method": "gptq", "damp_percent": 0.01,
                         "true_sequential": true}}"#;

/// `vramscope plan --vllm VLLM --device DEVICE -- vllm serve DIR`: exit code and output.
fn plan(dir: &Path, vllm: &str, device: &str) -> (Option<i32>, String) {
    let out = vramscope(&[
        "plan",
        "--vllm",
        vllm,
        "--device",
        device,
        "--",
        "vllm",
        "serve",
        dir.to_str().unwrap(),
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The number after `key` in the plan's output (`Available KV cache memory: 63.90 GiB`).
fn number_after(text: &str, key: &str) -> f64 {
    let at = text.find(key).unwrap_or_else(|| panic!("{key}: {text}")) + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Meta-Llama-3-8B GPTQ w4 g128 under 0.19: on an H100 SXM (Machete) against an A100 80GB
/// (Marlin), through the binary. By hand, the H100's tensors a layer: the prepacked words
/// `n·k/2` (qkv 6144 × 4096: 12,582,912; o 4096²: 8,388,608; gate_up 28672 × 4096:
/// 58,720,256; down 4096 × 14336: 29,360,128), the fp16 scales `[k/128, n]` (393,216,
/// 262,144, 1,835,008, 917,504), the kept zeros `[k/128, n/8]` int32 (98,304, 65,536,
/// 458,752, 229,376) and g_idx `[k]` int32 (16,384 × 3, 57,344), two norms 16,384 and 0.19's
/// seven 0-dim f32 attention scalars 28: 113,434,652; × 32 = 3,629,908,864; the embedding
/// and lm_head 2 × 128256 × 4096 × 2 = 2,101,346,304, the final norm 8,192 and the rotary
/// cache 8192 × 128 × 2 = 2,097,152: 5,733,360,512 bytes. The A100 holds 32 × (958,464 −
/// 4 × 108 × 4) = 30,615,552 fewer: Marlin empties the zeros and g_idx and adds one int32 a
/// SM per layer.
#[test]
fn llama3_8b_gptq_on_h100_runs_machete_and_on_a100_marlin() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), LLAMA3_8B_GPTQ).unwrap();
    let (code, h100) = plan(dir.path(), "0.19", "sim:h100-sxm");
    assert_eq!(code, Some(0), "{h100}");
    assert!(!h100.contains("MacheteLinearKernel"), "{h100}");
    let (code, a100) = plan(dir.path(), "0.19", "sim:a100-80gb");
    assert_eq!(code, Some(0), "{a100}");
    let kv = |t: &str| number_after(t, "Available KV cache memory:");
    let weights = |t: &str| number_after(t, "weights memory:");
    println!(
        "Llama-3-8B GPTQ g128, 0.19: H100 weights {} GiB, KV {} GiB; A100 weights {} GiB, KV {} GiB",
        weights(&h100),
        kv(&h100),
        weights(&a100),
        kv(&a100)
    );
    assert_eq!((weights(&h100), kv(&h100)), (5.35, 63.83));
    assert_eq!((weights(&a100), kv(&a100)), (5.32, 65.94));
    // 0.15 chooses Machete for GPTQ too; its KV budget is its own (no graph estimate).
    let (code, v015) = plan(dir.path(), "0.15", "sim:h100-sxm");
    assert_eq!(code, Some(0), "{v015}");
    assert_eq!((weights(&v015), kv(&v015)), (5.35, 61.02));
    let tensors = |device: &str| {
        let out = tempfile::tempdir().unwrap();
        let json = out.path().join("r.json");
        ok(&vramscope(&[
            "profile",
            "-q",
            "--json",
            json.to_str().unwrap(),
            "--model",
            dir.path().to_str().unwrap(),
            "--vllm",
            "0.19",
            "--device",
            device,
        ]));
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
        r["weights_tensor_bytes"].as_u64().unwrap()
    };
    let per_layer: u64 = [
        (6144u64, 4096u64, 3u64),
        (4096, 4096, 1),
        (28672, 4096, 2),
        (4096, 14336, 1),
    ]
    .iter()
    .map(|&(n, k, _)| n * k / 2 + k / 128 * n * 2 + k / 128 * n / 8 * 4 + k * 4)
    .sum::<u64>()
        + 2 * 4096 * 2
        + 7 * 4;
    assert_eq!(per_layer, 113_434_652);
    let h100_tensors = tensors("sim:h100-sxm:dry");
    assert_eq!(
        h100_tensors,
        32 * per_layer + 2 * 128_256 * 4096 * 2 + 4096 * 2 + 8192 * 128 * 2
    );
    assert_eq!(h100_tensors, 5_733_360_512);
    assert_eq!(
        h100_tensors - tensors("sim:a100-80gb:dry"),
        32 * (958_464 - 4 * 108 * 4)
    );
}

/// `gen-model --gptq` (with and without act-order) and `--awq` on an H100 under 0.19: the
/// tiny preset's layers all tile Machete's [64, 128] blocks; the dry and the compute-mode
/// profiles make the same allocations (the CPU multiplies the stored codes; Machete's
/// permuted order and AWQ's `-s·z` zero points are reproduced in the tensors it holds).
#[test]
fn gen_model_checkpoints_on_h100_profile_dry_and_compute_alike_through_machete() {
    for flags in [
        &["--gptq", "--group-size", "128"][..],
        &["--gptq", "--group-size", "64", "--desc-act"][..],
        &["--awq", "--group-size", "64"][..],
        &["--ct-w4a16", "--group-size", "64"][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        gen(dir.path(), flags);
        let dry = profile_under(dir.path(), "sim:h100-sxm:dry", "0.19");
        let cpu = profile_under(dir.path(), "sim:h100-sxm:compute", "0.19");
        for key in ["weights_bytes", "weights_tensor_bytes", "truth"] {
            assert_eq!(dry[key], cpu[key], "{flags:?} {key}");
        }
        for t in ["t0", "t1", "t2", "t3"] {
            for key in ["allocated", "allocated_peak", "reserved", "free"] {
                assert_eq!(
                    dry["checkpoints"][t][key], cpu["checkpoints"][t][key],
                    "{flags:?} {t} {key}"
                );
            }
        }
        // Machete's tensors differ from Marlin's (the A100's) for every format here.
        let a100 = profile_under(dir.path(), "sim:a100-80gb:dry", "0.19");
        assert_ne!(
            dry["weights_tensor_bytes"], a100["weights_tensor_bytes"],
            "{flags:?}"
        );
    }
}

/// From 0.31 vLLM refuses act-order (GPTQ `desc_act`, compressed-tensors `actorder`
/// "group"): one line naming it, whatever the GPU.
#[test]
fn act_order_is_refused_from_0_31() {
    for flags in [
        &["--gptq", "--group-size", "64", "--desc-act"][..],
        &["--ct-w4a16", "--group-size", "64", "--desc-act"][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        gen(dir.path(), flags);
        for device in ["sim:h100-sxm:dry", "sim:a100-80gb:dry"] {
            let out = vramscope(&[
                "profile",
                "-q",
                "--model",
                dir.path().to_str().unwrap(),
                "--vllm",
                "0.31",
                "--device",
                device,
            ]);
            assert_eq!(out.status.code(), Some(2), "{out:?}");
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(
                err.contains("no longer supported") && err.contains("--vllm 0.29 or earlier"),
                "{err}"
            );
        }
        // 0.29 still runs it (Machete permutes the inputs on the H100).
        let r = profile_under(dir.path(), "sim:h100-sxm:dry", "0.29");
        assert!(r["weights_tensor_bytes"].as_u64().unwrap() > 0);
    }
}

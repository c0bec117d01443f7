//! Gemma 3's multimodal checkpoint (`Gemma3ForConditionalGeneration`) as vLLM V1 loads and
//! profiles it: the SigLIP vision tower and projector among the weights, the encoder's profile
//! pass before the language model's (its budget, its dummy images, their outputs held in the
//! encoder cache under the text pass), `--limit-mm-per-prompt`, the public log line Q10
//! (../shared/VLLM_LOGS_PUBLIC.md) and `plan` through the binary.

mod common;

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::memory::EventKind;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest, Report};
use vramscope::quant::Quant;
use vramscope::report::lifetimes::Lifetimes;

const GIB: f64 = (1u64 << 30) as f64;

fn run(req: &ProfileRequest) -> Report {
    profile::run(req, None, Arc::new(AtomicBool::new(false))).unwrap()
}

fn request(model: &str, device: &str, vllm: &str) -> ProfileRequest {
    ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        quant: Quant::BF16,
        device: DeviceSpec::parse(device).unwrap(),
        vllm: vllm.into(),
        tokens: 0,
        seqs: 0,
        verify: false,
        ..ProfileRequest::default()
    }
}

/// Q10: vLLM PR #21489's `vllm bench latency` of google/gemma-3-4b-it on a B200 (178.36 GiB,
/// util 0.9, the LLM class: 16384 tokens and 1024 sequences on a GPU of 70 GiB or more,
/// 0.10.0 engine/arg_utils.py L1584-1593): "Actual usage is 8.58 GiB for weight, 9.96 GiB for
/// peak activation". The PR was under review on 2025-07-24, when main was vLLM 0.10.0's code
/// (0.10.1 followed in August), which `--vllm 0.10` reproduces: 64 dummy images of 256
/// embeddings (multimodal/profiling.py L180-189), the outputs cached as the projector returns
/// them (v1/worker/gpu_model_runner.py L2342-2427), the vision attention through xFormers
/// (attention/layer.py L334-355). Weights and activation within 3 %, through the binary's
/// `plan` of the benchmark's own command line; the encoder's share of the activation named.
#[test]
fn q10_gemma_3_4b_it_on_a_b200() {
    let (ok, out, err) = vramscope(&[
        "plan",
        "--vllm",
        "0.10",
        "--device",
        "sim:b200:dry",
        "--total",
        "178.36GiB",
        "--",
        "vllm",
        "bench",
        "latency",
        "--model",
        "google/gemma-3-4b-it",
        "--gpu-memory-utilization",
        "0.9",
    ]);
    assert!(ok, "{err}");
    let gib_after = |key: &str| -> f64 {
        let at = out.find(key).unwrap_or_else(|| panic!("{key}: {out}")) + key.len();
        out[at..]
            .split("GiB")
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let weights = gib_after("weights memory: ");
    let activation = gib_after("torch peak memory increase: ");
    eprintln!(
        "Q10 under 0.10: weights {weights} GiB (log 8.58, {:+.1} %), activation {activation} GiB (log 9.96, {:+.1} %)",
        (weights / 8.58 - 1.0) * 100.0,
        (activation / 9.96 - 1.0) * 100.0
    );
    assert!((weights / 8.58 - 1.0).abs() < 0.03, "weights {weights}");
    assert!(
        (activation / 9.96 - 1.0).abs() < 0.03,
        "activation {activation}"
    );
    assert!(out.contains("Encoder cache will be initialized with a budget of 16384 tokens, and profiled with 64 image items of the maximum feature size."), "{out}");
    // The encoder's share of the activation: the pixel values [64, 3, 896, 896] and the
    // embeddings [64 × 256, 2560] in bf16, `num_crops` [64] int64, held under the text pass.
    let held = 64 * 3 * 896 * 896 * 2 + 64 * 256 * 2560 * 2 + 64 * 8;
    assert_eq!(held, 392_167_936);
    assert!(
        out.contains("profile of 64 images of 256 tokens into a budget of 16384 tokens (xFormers memory-efficient attention)"),
        "{out}"
    );
    assert!(
        out.contains("it holds 374.0 MiB (pixel values and the encoder cache) under the text pass, so 374.0 MiB of the 9.99 GiB peak activation (3.7 %) is the encoder's"),
        "{out}"
    );

    // The same run in the library: the bytes behind those lines.
    let mut req = request("preset:gemma-3-4b-it", "sim:b200:dry", "0.10");
    req.device = req.device.with_total(Some((178.36 * GIB) as u64)).unwrap();
    req.util = 0.9;
    req.tokens = 16384;
    req.seqs = 1024;
    let r = run(&req);
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!(
        (p.budget_tokens, p.items, p.tokens_per_item),
        (16384, 64, 256)
    );
    assert_eq!(e.attention, "xFormers memory-efficient");
    assert_eq!(e.held_bytes, held);
    assert_eq!(e.peak_share_bytes, held);
    let a = r.vllm_answer().unwrap();
    let peak10 = a.formula.torch_peak_bytes as u64;
    // The encoder's own pass peaks below the text pass it is held under.
    assert!(e.phase_peak_bytes < peak10);
    // The text pass and the sampler are 0.11's: with every image limit 0, 0.10.0 still
    // reads the runner's inputs_embeds buffer, so the peak drops by what the encoder held
    // and the 1 MiB cuBLASLt workspace its biased linears made (the text model's GEMMs
    // have no bias and never make it).
    req.limit_mm_images = Some(0);
    let text = run(&req);
    assert_eq!(
        text.vllm_answer().unwrap().formula.torch_peak_bytes as u64 + held + (1 << 20),
        peak10
    );
    assert_eq!(text.encoder.as_ref().unwrap().plan, None);

    // 0.11 on the same line: 63 images of the 260-token placeholder, each output copied
    // into a [16384, 2560] tensor held under the text pass (0.11.0 gpu_model_runner.py
    // L3369-3385), SDPA on Blackwell: 14.83 GiB, 49 % over the log.
    let mut req11 = request("preset:gemma-3-4b-it", "sim:b200:dry", "0.11");
    req11.device = req.device.clone();
    req11.util = 0.9;
    req11.tokens = 16384;
    req11.seqs = 1024;
    let r11 = run(&req11);
    let e11 = r11.encoder.as_ref().unwrap();
    let p11 = e11.plan.as_ref().unwrap();
    assert_eq!(
        (p11.budget_tokens, p11.items, p11.tokens_per_item),
        (16384, 63, 260)
    );
    assert_eq!(e11.attention, "PyTorch SDPA");
    assert!(e11.held_bytes >= 63 * 16384 * 2560 * 2);
    assert!(
        r11.vllm_notes.iter().any(|n| n
            .ends_with("] Encoder cache will be initialized with a budget of 16384 tokens, and profiled with 63 image items of the maximum feature size.")),
        "{:?}",
        r11.vllm_notes
    );
    let a11 = r11.vllm_answer().unwrap();
    assert_eq!(a11.formula.torch_peak_bytes, 15_921_383_424);
    assert_eq!(r11.weights_bytes, r.weights_bytes);
    eprintln!(
        "Q10: 0.10 {:.3} GiB (encoder {:.3} GiB held), 0.11 {:.3} GiB (encoder {:.3} GiB held)",
        peak10 as f64 / GIB,
        held as f64 / GIB,
        a11.formula.torch_peak_bytes as f64 / GIB,
        e11.held_bytes as f64 / GIB
    );
}

/// The encoder's pass is a phase of its own in the lifetime view, inside the profile pass.
#[test]
fn the_encoder_pass_is_its_own_phase() {
    let mut req = request("preset:gemma-3-4b-it", "sim:h100-sxm:dry", "0.19");
    req.tokens = 2048;
    req.seqs = 64;
    let r = run(&req);
    let l = Lifetimes::build(&r.events, r.settings.passes);
    let enc: Vec<_> = l
        .passes
        .iter()
        .filter(|p| p.label == "encoder pass")
        .collect();
    assert_eq!(enc.len(), 1);
    // Its events are the vision tower's and the encoder cache's, and the pass goes on after.
    let names: Vec<&str> = r.events[enc[0].start..enc[0].end]
        .iter()
        .map(|e| e.tensor.as_str())
        .collect();
    assert!(names.contains(&"pixel_values"));
    assert!(names
        .iter()
        .any(|n| n.starts_with("vision.layers.26.mlp.act")));
    // 0.19 caches the projector's output as it is (0.19.0 gpu_model_runner.py L5774-5779):
    // no budget-sized copies, which 0.11 alone makes.
    assert!(names.contains(&"projector.mm_input_projection"));
    assert!(!names.iter().any(|n| n.starts_with("encoder_cache.")));
    assert!(l
        .passes
        .iter()
        .any(|p| p.start >= enc[0].end && p.label != "encoder pass"));
    // 0.19 counts the 256 embeddings: 2048 / 256 = 8 images, FlashAttention on Hopper.
    let e = r.encoder.unwrap();
    assert_eq!(e.plan.unwrap().items, 8);
    assert_eq!(e.attention, "FlashAttention varlen");
}

/// Gemma 3's SigLIP position embedding under tensor parallelism: 0.10/0.11 split it as a
/// `VocabParallelEmbedding` (siglip.py 0.11.0 L70), 0.15 on keep it whole on every rank as an
/// `nn.Embedding` (0.19.0 L303): at TP 2 the tower holds 2048 more rows of 1152 in bf16 per
/// rank under 0.19.
#[test]
fn gemma3_siglip_position_embedding_is_whole_from_0_15() {
    let tower = |vllm: &str| {
        let mut req = request("preset:gemma-3-4b-it", "sim:h100-sxm:dry", vllm);
        req.tokens = 2048;
        req.seqs = 64;
        req.tp = 2;
        run(&req).encoder.unwrap().weights_bytes
    };
    assert_eq!(tower("0.19") - tower("0.11"), 2048 * 1152 * 2);
    assert_eq!(tower("0.15"), tower("0.19"));
}

/// `--limit-mm-per-prompt '{"image":0}'`: no encoder profile (text-only, the runner embeds
/// its tokens); 0.11 still builds the tower, 0.15 and 0.19 skip it (`_mark_tower_model`).
#[test]
fn images_limited_to_zero_run_text_only() {
    let base = |vllm: &str, limit: Option<u64>| {
        let mut req = request("preset:gemma-3-4b-it", "sim:h100-sxm:dry", vllm);
        req.tokens = 2048;
        req.seqs = 64;
        req.limit_mm_images = limit;
        run(&req)
    };
    let tower = 416_866_032u64 * 2 + (1152 * 2560 + 1152) * 2;
    let full19 = base("0.19", None);
    let text19 = base("0.19", Some(0));
    let text11 = base("0.11", Some(0));
    assert_eq!(full19.encoder.as_ref().unwrap().weights_bytes, tower);
    assert_eq!(text19.encoder.as_ref().unwrap().weights_bytes, 0);
    // The weights line is the allocator's growth, not the parameters' bytes: 26 of the 27
    // fused q/k/v weights take a cached block whose remainder is too small to split
    // (8,400,896 bytes for 7,962,624) and small tensors round up to 512 bytes, so text-only
    // serving saves 12,016,416 bytes more than the tower's parameters.
    assert_eq!(full19.weights_bytes - text19.weights_bytes, 851_649_024);
    assert_eq!(851_649_024 - tower, 12_016_416);
    assert_eq!(text11.encoder.as_ref().unwrap().weights_bytes, tower);
    assert!(text19.encoder.as_ref().unwrap().plan.is_none());
    let act = |r: &Report| r.vllm_answer().unwrap().formula.torch_peak_bytes;
    assert!(act(&full19) > act(&text19));
    assert!(!text19.events.iter().any(|e| e.tensor == "pixel_values"));
}

fn vramscope(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// docs/models.md: `vramscope plan --vllm 0.19 -- vllm serve google/gemma-3-27b-it
/// --max-model-len 8192` resolves to the preset and names the encoder's share.
#[test]
fn plan_names_the_encoders_share_for_gemma_3_27b() {
    let (ok, out, err) = vramscope(&[
        "plan",
        "--vllm",
        "0.19",
        "--",
        "vllm",
        "serve",
        "google/gemma-3-27b-it",
        "--max-model-len",
        "8192",
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("gemma-3-27b-it bf16"), "{out}");
    assert!(
        out.contains("encoder (vision tower + projector): weights"),
        "{out}"
    );
    assert!(out.contains("Encoder cache will be initialized with a budget of 8192 tokens, and profiled with 32 image items"), "{out}");
    let (ok, out, err) = vramscope(&[
        "plan",
        "--vllm",
        "0.19",
        "--",
        "vllm",
        "serve",
        "google/gemma-3-27b-it",
        "--max-model-len",
        "8192",
        "--limit-mm-per-prompt",
        r#"{"image":0}"#,
        "--disable-mm-preprocessor-cache",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("no encoder profile"), "{out}");
    let (ok, _, err) = vramscope(&[
        "plan",
        "--vllm",
        "0.19",
        "--",
        "vllm",
        "serve",
        "google/gemma-3-27b-it",
        "--mm-processor-kwargs",
        r#"{"do_pan_and_scan": true}"#,
    ]);
    assert!(!ok);
    assert!(err.contains("pan-and-scan"), "{err}");
}

/// A line of docs/cli.md as a shell splits it: words on spaces, `'…'` kept whole.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut cur, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for ch in line.chars() {
        match ch {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    words
}

/// docs/cli.md's "Multimodal models (Gemma 3)" lines, read from the file and run as written,
/// with the numbers its text quotes.
#[test]
fn the_documented_multimodal_lines_run_as_written() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    let section = doc
        .split("### Multimodal models (Gemma 3)")
        .nth(1)
        .unwrap()
        .split("\n### ")
        .next()
        .unwrap();
    let lines: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("vramscope "))
        .collect();
    assert_eq!(lines.len(), 4, "{section}");
    let outs: Vec<String> = lines
        .iter()
        .map(|line| {
            let words = shell_words(line);
            let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
            let (ok, out, err) = vramscope(&args);
            assert!(ok, "{line}: {err}");
            out
        })
        .collect();
    // The 27B with images, then text-only, then Q10 under 0.10 and 0.11: the numbers the
    // section quotes.
    for (out, want) in [
        (
            &outs[0],
            &[
                "Actual usage is 51.45 GiB for weight, 3.99 GiB for peak activation",
                "Available KV cache memory: 15.62 GiB",
                "it holds 231.0 MiB (pixel values and the encoder cache)",
            ][..],
        ),
        (
            &outs[1],
            &[
                "Actual usage is 50.65 GiB for weight, 3.76 GiB for peak activation",
                "Available KV cache memory: 16.65 GiB",
            ][..],
        ),
        (
            &outs[2],
            &[
                "torch peak memory increase: 9.99GiB",
                "weights memory: 8.58GiB",
                "profiled with 64 image items",
                "it holds 374.0 MiB (pixel values and the encoder cache) under the text pass, so 374.0 MiB of the 9.99 GiB peak activation (3.7 %)",
            ][..],
        ),
        (
            &outs[3],
            &[
                "Actual usage is 8.58 GiB for weight, 14.83 GiB for peak activation",
                "profiled with 63 image items",
                "it holds 5.20 GiB (pixel values and the encoder cache)",
            ][..],
        ),
    ] {
        for w in want {
            assert!(out.contains(w), "{w}: {out}");
        }
    }
    assert!(!outs[2].contains("--kv-cache-memory"));
    assert!(outs[0].contains("Encoder cache will be initialized"));
    assert!(!outs[1].contains("Encoder cache will be initialized"));
    assert!(outs[1].contains("no encoder profile"), "{}", outs[1]);
}

/// docs/cli.md's "Multimodal models (Qwen2.5-VL)" lines, read from the file and run as
/// written, with the numbers its text quotes.
#[test]
fn the_documented_qwen2_5_vl_lines_run_as_written() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    let section = doc
        .split("### Multimodal models (Qwen2.5-VL)")
        .nth(1)
        .unwrap()
        .split("\n### ")
        .next()
        .unwrap();
    let lines: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("vramscope "))
        .collect();
    assert_eq!(lines.len(), 3, "{section}");
    let outs: Vec<String> = lines
        .iter()
        .map(|line| {
            let words = shell_words(line);
            let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
            let (ok, out, err) = vramscope(&args);
            assert!(ok, "{line}: {err}");
            out
        })
        .collect();
    for (out, want) in [
        (
            &outs[0],
            &[
                "profiled with 1 video items",
                "Actual usage is 15.54 GiB for weight, 2.47 GiB for peak activation",
                "Available KV cache memory: 53.05 GiB",
                "weights 1.26 GiB (8.1 % of the weights)",
                "so 269.0 MiB of the 2.47 GiB peak activation (10.6 %) is the encoder's",
            ][..],
        ),
        (
            &outs[1],
            &[
                "Actual usage is 14.27 GiB for weight, 2.21 GiB for peak activation",
                "Available KV cache memory: 54.58 GiB",
                "no encoder profile",
            ][..],
        ),
        (
            &outs[2],
            &[
                "profile of 1 videos of 114688 tokens",
                "its phase peaks at 15.42 GiB",
                "Available KV cache memory: 40.11 GiB",
            ][..],
        ),
    ] {
        for w in want {
            assert!(out.contains(w), "{w}: {out}");
        }
    }
    assert!(!outs[1].contains("Encoder cache will be initialized"));
}

/// mistralai/Mistral-Small-3.1-24B-Instruct-2503's config.json as published, in a hub cache.
const MISTRAL_SMALL_31: &str = r#"{"architectures": ["Mistral3ForConditionalGeneration"],
 "model_type": "mistral3", "image_token_index": 10, "multimodal_projector_bias": false,
 "projector_hidden_act": "gelu", "spatial_merge_size": 2,
 "text_config": {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu",
   "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 32768,
   "max_position_embeddings": 131072, "model_type": "mistral",
   "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
   "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0, "sliding_window": null,
   "use_cache": true, "vocab_size": 131072},
 "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
 "vision_config": {"attention_dropout": 0.0, "head_dim": 64, "hidden_act": "silu",
   "hidden_size": 1024, "image_size": 1540, "initializer_range": 0.02,
   "intermediate_size": 4096, "model_type": "pixtral", "num_attention_heads": 16,
   "num_channels": 3, "num_hidden_layers": 24, "patch_size": 14, "rope_theta": 10000.0},
 "vision_feature_layer": -1}"#;

/// `vramscope plan --vllm 0.19 --device sim:h100-sxm:dry -- vllm serve
/// mistralai/Mistral-Small-3.1-24B-Instruct-2503 --max-model-len 8192` from the hub cache's
/// config.json: the Pixtral tower and projector among the weights (438,958,080 parameters in
/// bf16 and the f32 rotary table [12100, 64]), 2 dummy images of 1540 pixels (8192 // 3025
/// embeddings, 0.19 counting the embeddings), their attention through SDPA with transformers'
/// dense block mask [24200, 24200] (xFormers is no dependency of 0.19), the encoder's share
/// named. Under 0.11 on the same GPU xFormers takes the mask's place and an image counts its
/// 3080-token placeholder ([IMG_BREAK]s and [IMG_END]).
#[test]
fn plan_names_the_encoders_share_for_mistral_small_3_1() {
    let cache = tempfile::tempdir().unwrap();
    let snap = cache
        .path()
        .join("models--mistralai--Mistral-Small-3.1-24B-Instruct-2503/snapshots/rev");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("config.json"), MISTRAL_SMALL_31).unwrap();
    let plan = |vllm: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--vllm",
            vllm,
            "--device",
            "sim:h100-sxm:dry",
            "--",
            "vllm",
            "serve",
            "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
            "--max-model-len",
            "8192",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .env("HF_HUB_CACHE", cache.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = plan("0.19", &[]);
    assert!(
        out.starts_with(
            "mistralai/Mistral-Small-3.1-24B-Instruct-2503 (the hub cache's copy) bf16"
        ),
        "{out}"
    );
    for want in [
        "Encoder cache will be initialized with a budget of 8192 tokens, and profiled with 2 image items of the maximum feature size.",
        "encoder (vision tower + projector): weights 840.2 MiB (1.8 % of the weights); profile of 2 images of 3025 tokens into a budget of 8192 tokens (PyTorch SDPA (memory-efficient, dense block mask) attention): its phase peaks at 2.04 GiB, it holds 86.2 MiB (pixel values and the encoder cache) under the text pass, so 2.04 GiB of the 2.04 GiB peak activation (100.0 %) is the encoder's",
        "Actual usage is 44.76 GiB for weight, 2.04 GiB for peak activation",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    // 0.21 runs the same Pixtral code (pixtral.py's PixtralHF classes unchanged from 0.19.0;
    // mistral3.py adds FP8 weight-name suffixes only).
    let out21 = plan("0.21", &[]);
    assert!(out21.contains("profile of 2 images of 3025 tokens into a budget of 8192 tokens (PyTorch SDPA (memory-efficient, dense block mask) attention): its phase peaks at 2.04 GiB"), "{out21}");
    let out = plan("0.11", &[]);
    assert!(out.contains("profile of 2 images of 3080 tokens into a budget of 8192 tokens (xFormers memory-efficient (block-diagonal bias) attention): its phase peaks at 1.08 GiB, it holds 187.1 MiB"), "{out}");
    // Text only: no encoder profile, and 0.19 does not build the tower.
    let out = plan("0.19", &["--limit-mm-per-prompt", r#"{"image":0}"#]);
    assert!(out.contains("no encoder profile"), "{out}");
    assert!(!out.contains("Encoder cache will be initialized"), "{out}");

    // The same in the library, on the preset: the bytes behind those lines.
    let mut req = request("preset:mistral-small-3.1-24b", "sim:h100-sxm:dry", "0.19");
    req.tokens = 8192;
    req.seqs = 1024;
    req.max_model_len = 8192;
    let r = run(&req);
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!(
        (
            p.budget_tokens,
            p.items,
            p.tokens_per_item,
            p.embeds_per_item
        ),
        (8192, 2, 3025, 3025)
    );
    assert_eq!(
        e.weights_bytes,
        (403_305_472 + 35_652_608) * 2 + 12100 * 64 * 4
    );
    // Held under the text pass: the pixel values [2, 3, 1540, 1540] and the embeddings
    // [2 × 3025, 5120], bf16, as the allocator rounds them (to 512 bytes).
    let held = (2 * 3 * 1540 * 1540 * 2u64).div_ceil(512) * 512 + 2 * 3025 * 5120 * 2;
    assert_eq!(held, 90_411_520);
    assert_eq!(e.held_bytes, held);
    // The dense mask alone is 24200² bf16 values (1.09 GiB), more than half the encoder's
    // phase (SiLU-and-mul one tensor from 0.15: `CustomOp.maybe_compile`).
    let mask = 24200u64 * 24200 * 2;
    assert!(
        e.phase_peak_bytes > mask && e.phase_peak_bytes < 2 * mask,
        "{}",
        e.phase_peak_bytes
    );
    assert_eq!(e.peak_share_bytes, e.phase_peak_bytes);
    // One image (a 4096-token batch): 12100 patches, not a multiple of 8, so each attention
    // call also pads a copy of the mask to 12104 columns (PyTorch's `preprocess_mask`).
    req.tokens = 4096;
    let r = run(&req);
    let e = r.encoder.as_ref().unwrap();
    assert_eq!(e.plan.as_ref().unwrap().items, 1);
    let (mask, padded) = (12100u64 * 12100 * 2, 12100u64 * 12104 * 2);
    assert!(e.phase_peak_bytes > mask + padded, "{}", e.phase_peak_bytes);
    assert!(
        e.phase_peak_bytes < mask + padded + (1 << 30),
        "{}",
        e.phase_peak_bytes
    );
}

/// Pixtral's native format (`PixtralForConditionalGeneration`, params.json, served with
/// `--tokenizer-mode mistral`) is not modelled: a config naming it gets one line saying so.
#[test]
fn native_pixtral_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"architectures": ["PixtralForConditionalGeneration"], "model_type": "pixtral",
            "hidden_size": 5120}"#,
    )
    .unwrap();
    let path = dir.path().to_str().unwrap();
    let (ok, _, err) = vramscope(&["plan", "--vllm", "0.19", "--", "vllm", "serve", path]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("model_type 'pixtral' (PixtralForConditionalGeneration"),
        "{err}"
    );
    assert!(err.contains("model_type mistral3"), "{err}");
}

/// Qwen/Qwen2.5-VL-7B-Instruct's config.json as published (the language model's keys at the
/// top level, the vision tower under vision_config).
const QWEN25_VL_7B: &str = r#"{"architectures": ["Qwen2_5_VLForConditionalGeneration"],
 "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
 "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
 "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
 "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
 "max_position_embeddings": 128000, "max_window_layers": 28, "model_type": "qwen2_5_vl",
 "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
 "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.41.2",
 "use_cache": true, "use_sliding_window": false,
 "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
  "intermediate_size": 3420, "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584,
  "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
  "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
  "temporal_patch_size": 2},
 "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064}"#;

/// `plan -- vllm serve Qwen/Qwen2.5-VL-7B-Instruct …` from the hub cache's config.json on
/// `dir`'s cache: stdout, or the one-line error.
fn plan_qwen25_vl(vllm: &str, extra: &[&str]) -> (bool, String, String) {
    let cache = tempfile::tempdir().unwrap();
    let snap = cache
        .path()
        .join("models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/rev");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("config.json"), QWEN25_VL_7B).unwrap();
    let mut args = vec![
        "plan",
        "--vllm",
        vllm,
        "--device",
        "sim:h100-sxm:dry",
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen2.5-VL-7B-Instruct",
    ];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(&args)
        .env("HF_HUB_CACHE", cache.path())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `plan --vllm 0.19 -- vllm serve Qwen/Qwen2.5-VL-7B-Instruct --max-model-len 8192` from the
/// hub cache's config.json: the tower among the weights (676,550,144 parameters and the
/// rotary cache [8192, 40] in bf16), the encoder's profile pass (the dummy of the processor's
/// `max_pixels`: 3584 × 3584 pixels, 256 × 256 patches, 16384 embeddings; qwen2_vl.py 0.19
/// L914-965), the runner's M-RoPE positions, the encoder's share named. 0.19 profiles a
/// one-frame video (its 16384 tokens tie the image's, and the tie goes to "video":
/// multimodal/encoder_budget.py 0.19 L182-185), 0.15 the image; both run the same tower
/// pass on the same grid.
#[test]
fn plan_names_the_encoders_share_for_qwen2_5_vl_7b() {
    let (ok, out, err) = plan_qwen25_vl("0.19", &["--max-model-len", "8192"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("Qwen/Qwen2.5-VL-7B-Instruct (the hub cache's copy) bf16"),
        "{out}"
    );
    for want in [
        "Encoder cache will be initialized with a budget of 16384 tokens, and profiled with 1 video items of the maximum feature size.",
        "encoder (vision tower + projector): weights 1.26 GiB (8.1 % of the weights); profile of 1 videos of 16384 tokens into a budget of 16384 tokens (FlashAttention varlen attention): its phase peaks at 2.23 GiB, it holds 269.0 MiB (pixel values and the encoder cache) under the text pass, so 269.0 MiB of the 2.47 GiB peak activation (10.6 %) is the encoder's; with its weights 1.52 GiB of the non-KV 18.24 GiB (8.4 %)",
        "Actual usage is 15.54 GiB for weight, 2.47 GiB for peak activation",
        "Available KV cache memory: 53.05 GiB",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    assert!(!err.contains("not modelled yet"), "{err}");
    // 0.15 breaks the tie the other way: the image, the same pass.
    let (ok, out15, err) = plan_qwen25_vl("0.15", &["--max-model-len", "8192"]);
    assert!(ok, "{err}");
    assert!(out15.contains("profiled with 1 image items"), "{out15}");
    assert!(out15.contains("its phase peaks at 2.23 GiB"), "{out15}");
    // Images limited to 0 leave the video: vLLM still builds the tower and profiles it.
    let (ok, out, err) = plan_qwen25_vl(
        "0.19",
        &[
            "--max-model-len",
            "8192",
            "--limit-mm-per-prompt",
            r#"{"image":0}"#,
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("profiled with 1 video items"), "{out}");
    // Both limited to 0: text only, no tower (0.19 `_mark_tower_model` over image and
    // video), the Qwen2's weights alone.
    let (ok, out, err) = plan_qwen25_vl(
        "0.19",
        &[
            "--max-model-len",
            "8192",
            "--limit-mm-per-prompt",
            r#"{"image":0,"video":0}"#,
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("no encoder profile"), "{out}");
    assert!(!out.contains("Encoder cache will be initialized"), "{out}");
    assert!(
        out.contains("Actual usage is 14.27 GiB for weight, 2.21 GiB for peak activation"),
        "{out}"
    );
    // `--mm-processor-kwargs '{"max_pixels": 1003520}'` (1280 merged tokens: a 1120 × 896
    // dummy image): 8192 tokens hold a 12-frame video of 6 temporal patches, 7680 tokens,
    // more than the image's 1280.
    let (ok, out, err) = plan_qwen25_vl(
        "0.19",
        &[
            "--max-model-len",
            "8192",
            "--mm-processor-kwargs",
            r#"{"max_pixels": 1003520}"#,
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("profile of 1 videos of 7680 tokens into a budget of 8192 tokens (FlashAttention varlen attention): its phase peaks at 1.06 GiB"), "{out}");
    // The default context (128000 tokens, the config's max_position_embeddings) holds a
    // 14-frame dummy video: 7 temporal patches of 256 × 256, 114688 embeddings, each
    // frame's full-attention blocks over its 65536 patches.
    let (ok, out, err) = plan_qwen25_vl("0.19", &[]);
    assert!(ok, "{err}");
    assert!(out.contains("profiled with 1 video items"), "{out}");
    assert!(out.contains("profile of 1 videos of 114688 tokens into a budget of 114688 tokens (FlashAttention varlen attention): its phase peaks at 15.42 GiB"), "{out}");
}

/// What is not modelled for Qwen2.5-VL is refused in one line each: the releases whose tower
/// was not read (0.10, 0.11) and `--mm-encoder-tp-mode data`.
#[test]
fn qwen2_5_vl_refuses_what_is_not_modelled_by_name() {
    for v in ["0.10", "0.11"] {
        let (ok, _, err) = plan_qwen25_vl(v, &["--max-model-len", "8192"]);
        assert!(!ok);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!(
                "vLLM {v}'s Qwen2.5-VL vision tower is not modelled (read: 0.15, and 0.19 to 0.33)"
            )),
            "{err}"
        );
    }
    let (ok, _, err) = vramscope(&[
        "plan",
        "--vllm",
        "0.19",
        "--",
        "vllm",
        "serve",
        "google/gemma-3-4b-it",
        "--mm-processor-kwargs",
        r#"{"max_pixels": 1003520}"#,
    ]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("read for Qwen2.5-VL only"), "{err}");
    let (ok, _, err) = plan_qwen25_vl("0.19", &["--mm-encoder-tp-mode", "data"]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--mm-encoder-tp-mode data"), "{err}");
    let (ok, out, err) = plan_qwen25_vl(
        "0.19",
        &["--max-model-len", "8192", "--mm-encoder-tp-mode", "weights"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("profiled with 1 video items"), "{out}");
}

/// The bytes behind those lines, on the preset under 0.19 (8192 batched tokens, 1024
/// sequences, `--max-model-len 8192`).
#[test]
fn qwen2_5_vl_7b_encoder_bytes() {
    let mut req = request("preset:qwen2.5-vl-7b", "sim:h100-sxm:dry", "0.19");
    req.tokens = 8192;
    req.seqs = 1024;
    req.max_model_len = 8192;
    let r = run(&req);
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!(
        (
            p.budget_tokens,
            p.items,
            p.tokens_per_item,
            p.modality.as_str()
        ),
        (16384, 1, 16384, "video")
    );
    assert_eq!(e.attention, "FlashAttention varlen");
    // The tower and merger in bf16 and the rotary cache [8192, 40].
    assert_eq!(e.weights_bytes, 676_550_144 * 2 + 8192 * 40 * 2);
    // Held under the text pass: pixel_values_videos [65536, 1176] and second_per_grid_ts [1]
    // (a 512-byte block; video_grid_thw stays on the host, `keep_on_cpu=True`, qwen2_vl.py
    // 0.19 L756), the embeddings [16384, 3584], and the rotary tables cos and sin [65536, 40]
    // that get_rope_by_thw's lru_cache keeps.
    let held = 65536 * 1176 * 2 + 512 + 16384 * 3584 * 2 + 2 * 65536 * 40 * 2;
    assert_eq!(held, 282_067_456);
    assert_eq!(e.held_bytes, held);
    // The phase's peak is a block's MLP at `down_proj`: the block's hidden state, attention
    // output, normed input, residual sum and `down_proj`'s output [65536, 1280] each, gate_up
    // [65536, 6840] and SiLU-and-mul's one output [65536, 3420] (`forward_native` compiled by
    // Inductor from 0.15: `CustomOp.maybe_compile`; 2,183,659,520 bytes); under them the
    // pixels and `second_per_grid_ts` (154,141,184), the cached tables and their concatenated copies
    // (20,971,520), the `cu_seqlens`, the window index and its inverse (267,264); with the
    // cuBLAS (32 MiB) and cuBLASLt (1 MiB) workspaces and PyTorch's rounding of blocks above
    // 10 MiB to 2 MiB segments left unsplit (the pixels' 147 MiB take 148, gate_up's 855 MiB
    // 856), 2 MiB more.
    let block = 5 * 65536 * 1280 * 2 + 65536 * 6840 * 2 + 65536 * 3420 * 2;
    assert_eq!(block, 2_183_659_520u64);
    assert_eq!(
        PHASE_PEAK,
        block + 154_141_184 + 20_971_520 + 267_264 + (32 << 20) + (1 << 20) + (2 << 20)
    );
    assert_eq!(e.phase_peak_bytes, PHASE_PEAK);
    // The pass peaks later, in the text pass's sampler (2.47 GiB against the phase's 2.23),
    // so the encoder's share of the peak activation is what it holds there.
    assert_eq!(e.peak_share_bytes, e.held_bytes);
    // V1's budget (#12126) for the KV cache.
    let kv = r
        .formulas
        .iter()
        .find(|f| f.id == vramscope::profile::formulas::FormulaId::Pr12126)
        .unwrap()
        .kv_bytes;
    assert_eq!(kv, KV_BYTES);
    assert!(
        (kv as f64 / GIB - 53.05).abs() < 0.005,
        "{}",
        kv as f64 / GIB
    );
}

/// The encoder phase's peak over t1 and V1's KV budget (53.05 GiB) of that run: the pass
/// peaks in the text pass's sampler at 2,653,244,928 B, 23,513,088 below the phase's peak with
/// SiLU's temporary (2,676,758,016 B), which was the pass's peak. The sampler's 7 MiB
/// `rand_like` lands in a cached 8 MiB free block (laid out by the encoder's order of frees)
/// and takes it whole (PyTorch splits a large block only when more than 1 MiB would remain).
const PHASE_PEAK: u64 = 2_395_739_648;
const KV_BYTES: i64 = 56_966_270_616;
/// ibm-granite/granite-vision-3.2-2b's config.json, the keys the memory depends on
/// (`image_grid_pinpoints` as llama.cpp's docs/multimodal/granitevision.md lists them), in a hub
/// cache.
const GRANITE_VISION_32_2B: &str = r#"{"architectures": ["LlavaNextForConditionalGeneration"],
 "model_type": "llava_next", "image_seq_length": 576, "image_token_index": 49155,
 "multimodal_projector_bias": true, "projector_hidden_act": "gelu",
 "tie_word_embeddings": true, "use_image_newline_parameter": true,
 "vision_feature_layer": [-24, -20, -12, -1], "vision_feature_select_strategy": "full",
 "image_grid_pinpoints": [[384, 768], [384, 1152], [384, 1536], [384, 1920], [384, 2304],
   [384, 2688], [384, 3072], [384, 3456], [384, 3840], [768, 384], [768, 768], [768, 1152],
   [768, 1536], [768, 1920], [1152, 384], [1152, 768], [1152, 1152], [1536, 384],
   [1536, 768], [1920, 384], [1920, 768], [2304, 384], [2688, 384], [3072, 384],
   [3456, 384], [3840, 384]],
 "text_config": {"architectures": ["GraniteForCausalLM"], "attention_multiplier": 0.015625,
   "embedding_multiplier": 12.0, "hidden_size": 2048, "intermediate_size": 8192,
   "logits_scaling": 8.0, "max_position_embeddings": 131072, "model_type": "granite",
   "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
   "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_theta": 5000000.0,
   "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 49156},
 "vision_config": {"hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152, "image_size": 384,
   "intermediate_size": 4304, "layer_norm_eps": 1e-06, "model_type": "siglip_vision_model",
   "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14},
 "torch_dtype": "bfloat16"}"#;

/// `vramscope plan --vllm 0.19 --device sim:h100-sxm:dry -- vllm serve
/// ibm-granite/granite-vision-3.2-2b` from the hub cache's config.json: the SigLIP tower (all 27
/// layers: the deepest feature layer is -1; no `post_layernorm`, no head), `image_newline` and
/// the projector among the weights; one dummy image of 3840 × 384 pixels (the pinpoint with the
/// most features, 8289: 729 of the base crop, 10 tiles of 27 × 27 patches, 270 newlines), which
/// is more than the 8192 batched tokens, so the budget is the image; its 11 crops through the
/// tower with every hidden state kept, the four feature layers side by side into the projector,
/// then the unpad-and-newline merge. The text-only what-if drops all of it.
#[test]
fn plan_names_the_encoders_share_for_granite_vision() {
    let cache = tempfile::tempdir().unwrap();
    let snap = cache
        .path()
        .join("models--ibm-granite--granite-vision-3.2-2b/snapshots/rev");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("config.json"), GRANITE_VISION_32_2B).unwrap();
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--vllm",
            "0.19",
            "--device",
            "sim:h100-sxm:dry",
            "--",
            "vllm",
            "serve",
            "ibm-granite/granite-vision-3.2-2b",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .env("HF_HUB_CACHE", cache.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = plan(&[]);
    eprintln!("{out}");
    assert!(
        out.starts_with("ibm-granite/granite-vision-3.2-2b (the hub cache's copy) bf16"),
        "{out}"
    );
    for want in [
        "Encoder cache will be initialized with a budget of 8289 tokens, and profiled with 1 image items of the maximum feature size.",
        "encoder (vision tower + projector): weights 813.7 MiB (14.3 % of the weights); profile of 1 images of 8289 tokens into a budget of 8289 tokens (FlashAttention varlen attention): its phase peaks at 686.8 MiB, it holds 41.7 MiB (pixel values and the encoder cache) under the text pass, so 41.7 MiB of the 812.3 MiB peak activation (5.1 %) is the encoder's",
        "Actual usage is 5.54 GiB for weight, 0.79 GiB for peak activation",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let text = plan(&["--limit-mm-per-prompt", r#"{"image":0}"#]);
    eprintln!("{text}");
    assert!(text.contains("no encoder profile"), "{text}");
    assert!(
        !text.contains("Encoder cache will be initialized"),
        "{text}"
    );

    // Read at 0.19 only: an older release is refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "plan",
            "--vllm",
            "0.11",
            "--device",
            "sim:h100-sxm:dry",
            "--",
            "vllm",
            "serve",
            "ibm-granite/granite-vision-3.2-2b",
        ])
        .env("HF_HUB_CACHE", cache.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("vLLM 0.11's LLaVA-NeXT is not modelled"),
        "{err}"
    );

    // The same in the library, on the preset: the bytes behind those lines.
    let mut req = request("preset:granite-vision-3.2-2b", "sim:h100-sxm:dry", "0.19");
    req.tokens = 8192;
    req.seqs = 1024;
    req.max_model_len = 131072;
    let r = run(&req);
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!(
        (
            p.budget_tokens,
            p.items,
            p.tokens_per_item,
            p.embeds_per_item
        ),
        (8289, 1, 8289, 8289)
    );
    // The tower's 412,984,944 parameters, the newline's and the projector's 13,637,632, bf16.
    assert_eq!(e.weights_bytes, (412_984_944 + 13_637_632) * 2);
    assert_eq!(e.weights_bytes, 853_245_152);
    // Held under the text pass: the pixel values [11, 3, 384, 384] and `image_sizes` [1, 2]
    // int64 (one 512-byte block), the merged image [8289, 2048], bf16.
    let held = 11 * 3 * 384 * 384 * 2 + 512 + 8289 * 2048 * 2;
    assert_eq!(held, 43_684_352);
    assert_eq!(e.held_bytes, held);
    // The tower keeps all 28 of its outputs (the embeddings and 27 layers') of the 11 crops'
    // 8019 patches until the four are concatenated: 517 MiB under the phase's peak.
    let pool = 28 * 8019 * 1152 * 2u64;
    assert!(e.phase_peak_bytes > pool, "{}", e.phase_peak_bytes);

    // The encoder's pass is its own phase: the tower's last layer, the concatenation, the
    // projector and the merge in it, the text pass after it.
    let l = Lifetimes::build(&r.events, r.settings.passes);
    let enc: Vec<_> = l
        .passes
        .iter()
        .filter(|p| p.label == "encoder pass")
        .collect();
    assert_eq!(enc.len(), 1);
    let names: Vec<&str> = r.events[enc[0].start..enc[0].end]
        .iter()
        .map(|e| e.tensor.as_str())
        .collect();
    for want in [
        "pixel_values",
        "image_sizes",
        "vision.feature_layers.cat",
        "projector.linear_2",
        "image_embeds.0.permute",
        "image_embeds.0.newline_cat",
        "image_embeds.0",
    ] {
        assert!(names.iter().any(|n| n.starts_with(want)), "{want}");
    }
    assert!(names
        .iter()
        .any(|n| n.starts_with("vision.layers.26.mlp.act")));
    assert!(l
        .passes
        .iter()
        .any(|p| p.start >= enc[0].end && p.label != "encoder pass"));

    // Text only: 0.19 does not build the tower (`_mark_tower_model`, llava_next.py 0.19
    // L278-295), and no pixel values are made.
    req.limit_mm_images = Some(0);
    let t = run(&req);
    assert_eq!(t.encoder.as_ref().unwrap().weights_bytes, 0);
    assert!(t.encoder.as_ref().unwrap().plan.is_none());
    assert!(!t.events.iter().any(|e| e.tensor == "pixel_values"));
    assert!(r.weights_bytes - t.weights_bytes >= 853_245_152);
    let act = |r: &Report| r.vllm_answer().unwrap().formula.torch_peak_bytes;
    assert!(act(&r) > act(&t));
    eprintln!(
        "granite-vision 0.19: weights {} → {} bytes, peak activation {} → {} bytes, encoder phase peak {}",
        r.weights_bytes,
        t.weights_bytes,
        act(&r),
        act(&t),
        e.phase_peak_bytes
    );
}

/// docs/cli.md's "Multimodal models (LLaVA-NeXT)" lines, read from the file and run as
/// written (the preset: an empty hub cache), with the numbers its text quotes.
#[test]
fn the_documented_llava_next_lines_run_as_written() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    let section = doc
        .split("### Multimodal models (LLaVA-NeXT)")
        .nth(1)
        .unwrap()
        .split("\n### ")
        .next()
        .unwrap();
    let lines: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("vramscope "))
        .collect();
    assert_eq!(lines.len(), 2, "{section}");
    let cache = tempfile::tempdir().unwrap();
    let outs: Vec<String> = lines
        .iter()
        .map(|line| {
            let words = shell_words(line);
            let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
                .args(&words[1..])
                .env("HF_HUB_CACHE", cache.path())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{line}: {err}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect();
    for (out, want) in [
        (
            &outs[0],
            &[
                "granite-vision-3.2-2b bf16",
                "Encoder cache will be initialized with a budget of 8289 tokens, and profiled with 1 image items of the maximum feature size.",
                "Actual usage is 5.54 GiB for weight, 0.79 GiB for peak activation",
                "weights 813.7 MiB (14.3 % of the weights)",
                "its phase peaks at 686.8 MiB, it holds 41.7 MiB (pixel values and the encoder cache)",
            ][..],
        ),
        (
            &outs[1],
            &[
                "Actual usage is 4.74 GiB for weight, 0.75 GiB for peak activation",
                "no encoder profile",
            ][..],
        ),
    ] {
        for w in want {
            assert!(out.contains(w), "{w}: {out}");
        }
    }
    assert!(!outs[1].contains("Encoder cache will be initialized"));
}

/// Llama 4 Scout under 0.19 on 8 GPUs: the vision model and projector are built before the
/// language model and counted among each rank's weights (mllama4.py 0.19 L758-779), split as
/// vLLM splits them; `--limit-mm-per-prompt '{"image":0}'` builds neither
/// (`_mark_tower_model`). Rank 0's share: the patch linear's 176 of 1408 rows (103,488
/// parameters), the class and positional embeddings (1408 + 577 × 1408) and the outer
/// LayerNorms (4 × 1408) whole, 34 layers of 2,983,376 (q/k/v 3 × 1408 × 176 and their 528
/// biases, o_proj 1408 × 176 and its whole bias, fc1 704 × 1408 + 704, fc2 1408 × 704 + 1408,
/// two LayerNorms 4 × 1408), the adapter 512 × 5632 + 4096 × 512, the projector 640 × 4096:
/// 109,959,904 parameters, 219,919,808 bytes in bf16, and the rotary's complex64 cache 577 ×
/// 44 × 8 = 203,104 bytes.
///
/// The encoder's profile: the dummy image is 16 × 1 tiles of 336 pixels
/// (`get_image_size_with_most_features`, mllama4.py 0.19 L574-582), 17 tiles with the global
/// one, 144 embeddings a tile: 2448 a image; the budget is `max_num_batched_tokens` 8192, so 3
/// images (51 tiles). Held under the text pass: `pixel_values [51, 3, 336, 336]` bf16
/// (34,546,176 bytes), `patches_per_image [3]` and `aspect_ratios [3, 2]` int64 (a 512-byte
/// block each) and the projector's output `[7344, 5120]` bf16 (75,202,560 bytes), whose
/// per-image views are the encoder cache.
#[test]
fn llama4_scouts_tower_is_among_each_ranks_weights_and_profiled() {
    let base = |limit: Option<u64>| {
        let mut req = request("preset:llama-4-scout", "sim:h100-sxm:dry", "0.19");
        req.tp = 8;
        req.max_model_len = 8192;
        req.limit_mm_images = limit;
        run(&req)
    };
    let full = base(None);
    let e = full.encoder.as_ref().unwrap();
    let layer = 3 * 1408 * 176 + 528 + 1408 * 176 + 1408 + 2 * 704 * 1408 + 704 + 1408 + 4 * 1408;
    assert_eq!(layer, 2_983_376);
    let params = 1408 * 588 / 8
        + 1408
        + 577 * 1408
        + 4 * 1408
        + 34 * layer
        + 512 * 5632
        + 4096 * 512
        + 640 * 4096;
    assert_eq!(params, 109_959_904);
    assert_eq!(e.weights_bytes, 2 * params as u64 + 577 * 44 * 8);
    assert_eq!(e.weights_bytes, 220_122_912);
    let p = e.plan.as_ref().unwrap();
    assert_eq!(
        (
            p.tokens_per_item,
            p.embeds_per_item,
            p.budget_tokens,
            p.items
        ),
        (2448, 2448, 8192, 3)
    );
    assert_eq!(e.attention, "FlashAttention varlen");
    assert_eq!(e.held_bytes, 34_546_176 + 512 + 512 + 75_202_560);
    assert!(e.phase_peak_bytes > e.held_bytes);
    assert!(full
        .events
        .iter()
        .any(|ev| ev.tensor == "vision.layers.33.rotary.q_float"));
    let text = base(Some(0));
    let t = text.encoder.as_ref().unwrap();
    assert_eq!(t.weights_bytes, 0);
    assert!(t.plan.is_none());
    assert!(!text.events.iter().any(|e| e.tensor == "pixel_values"));
    assert!(full.weights_bytes - text.weights_bytes >= 220_122_912);
}

/// The plan line of Scout (the command of the brief) names the encoder's share; another
/// release's Llama 4 tower is refused by name.
#[test]
fn plan_names_llama4_scouts_encoder_share_and_refuses_other_releases() {
    let line = |vllm: &'static str| {
        vec![
            "plan",
            "--vllm",
            vllm,
            "--device",
            "sim:h100-sxm:dry",
            "--",
            "vllm",
            "serve",
            "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            "--max-model-len",
            "8192",
            "--tensor-parallel-size",
            "8",
        ]
    };
    let (ok, out, err) = vramscope(&line("0.19"));
    assert!(ok, "{err}");
    for want in [
        "Encoder cache will be initialized with a budget of 8192 tokens, and profiled with 3 image items of the maximum feature size.",
        "encoder (vision tower + projector): weights 209.9 MiB (0.7 % of the weights); profile of 3 images of 2448 tokens into a budget of 8192 tokens (FlashAttention varlen attention)",
        "it holds 104.7 MiB (pixel values and the encoder cache) under the text pass",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let (ok, _, err) = vramscope(&line("0.15"));
    assert!(!ok);
    assert!(
        err.contains(
            "model_type 'llama4' (multimodal): vLLM 0.15's Llama 4 vision tower is not modelled"
        ),
        "{err}"
    );
}

/// `vramscope plan --vllm 0.19 --device sim:h100-sxm:dry -- vllm serve
/// moonshotai/Kimi-VL-A3B-Instruct --trust-remote-code --max-model-len 8192` on the preset
/// (an empty hub cache): the dummy image of 1024 × 1024 pixels is scaled to the processor's
/// 4096 patches and padded (66 × 66 patches, 1089 tokens), so the 8192-token budget holds 7;
/// their 30,492 patches through MoonViT's 27 blocks (the bicubic position grid, the 2D rotary
/// table of 512 × 512 × 36 complex64 kept after the pass), the 2 × 2 merge and the projector;
/// the pixel values, the embeddings and the table held under the DeepSeek-V3 text pass. The
/// text-only what-if drops the tower; another release is refused by name.
#[test]
fn plan_names_the_encoders_share_for_kimi_vl() {
    let cache = tempfile::tempdir().unwrap();
    let plan = |vllm: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--vllm",
            vllm,
            "--device",
            "sim:h100-sxm:dry",
            "--",
            "vllm",
            "serve",
            "moonshotai/Kimi-VL-A3B-Instruct",
            "--trust-remote-code",
            "--max-model-len",
            "8192",
        ];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .env("HF_HUB_CACHE", cache.path())
            .output()
            .unwrap()
    };
    let out = plan("0.19", &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    for want in [
        "Encoder cache will be initialized with a budget of 8192 tokens, and profiled with 7 image items of the maximum feature size.",
        "encoder (vision tower + projector): weights 853.6 MiB (2.7 % of the weights); profile of 7 images of 1089 tokens into a budget of 8192 tokens (FlashAttention varlen attention): its phase peaks at 1.13 GiB, it holds 136.0 MiB (pixel values and the encoder cache) under the text pass, so 136.0 MiB of the 2.92 GiB peak activation (4.6 %) is the encoder's",
        "Actual usage is 30.74 GiB for weight, 2.92 GiB for peak activation",
        "GPU KV cache size: 1,291,328 tokens",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let zero = plan("0.19", &["--limit-mm-per-prompt", r#"{"image":0}"#]);
    let zero = String::from_utf8_lossy(&zero.stdout).into_owned();
    assert!(zero.contains("no encoder profile"), "{zero}");
    // Without images 0.19 does not build the tower (`_mark_tower_model`, kimi_vl.py 0.19
    // L319-328): 853.6 MiB less weight, a smaller peak, more KV cache.
    assert!(
        zero.contains("Actual usage is 29.89 GiB for weight, 2.78 GiB for peak activation"),
        "{zero}"
    );
    assert!(
        zero.contains("GPU KV cache size: 1,325,120 tokens"),
        "{zero}"
    );
    assert!(
        !zero.contains("Encoder cache will be initialized"),
        "{zero}"
    );
    let old = plan("0.15", &[]);
    assert!(!old.status.success());
    let err = String::from_utf8_lossy(&old.stderr);
    assert!(err.contains("vLLM 0.15's Kimi-VL is not modelled"), "{err}");

    // The same in the library, on the preset: the bytes behind those lines.
    let mut req = request("preset:kimi-vl-a3b", "sim:h100-sxm:dry", "0.19");
    req.tokens = 8192;
    req.seqs = 1024;
    req.max_model_len = 8192;
    let r = run(&req);
    let e = r.encoder.as_ref().unwrap();
    let p = e.plan.as_ref().unwrap();
    assert_eq!(
        (
            p.budget_tokens,
            p.items,
            p.tokens_per_item,
            p.embeds_per_item
        ),
        (8192, 7, 1089, 1089)
    );
    // The tower's 416,866,032 parameters and the projector's 30,679,808, bf16.
    assert_eq!(e.weights_bytes, (416_866_032 + 30_679_808) * 2);
    // Held under the text pass: the pixel values [7 · 4356, 588] bf16, `image_grid_hws` [7, 2]
    // int64 (one 512-byte block), the embeddings [7 · 1089, 2048] bf16 and the rotary table
    // 512² × 36 complex64, each rounded to the allocator's 512 bytes.
    let round = |b: u64| b.div_ceil(512) * 512;
    let held =
        round(7 * 4356 * 588 * 2) + 512 + round(7 * 1089 * 2048 * 2) + round(512 * 512 * 72 * 4);
    assert_eq!(e.held_bytes, held);
    // A block's MLP over the 30,492 patches: fc0's output [30492, 4304] bf16 and its GELU.
    assert!(
        e.phase_peak_bytes > 2 * 30_492 * 4304 * 2,
        "{}",
        e.phase_peak_bytes
    );
    req.limit_mm_images = Some(0);
    let t = run(&req);
    assert_eq!(t.encoder.as_ref().unwrap().weights_bytes, 0);
    assert!(!t.events.iter().any(|e| e.tensor == "pixel_values"));
}

/// Gemma 3 on Model Runner V2 (dense: V2 by default from 0.25; docs/reading/vllm-mm-towers-v021.md
/// §0.4): 0.25 and 0.26's `profile_run` encodes nothing (gpu/model_runner.py 0.25.1 L648-663:
/// the dummy text pass and the sampler only), the tower still loaded; from 0.27.1
/// `profile_encoder_cache` encodes as V1 does but frees the device batch before the text pass
/// (0.27.1 L702-717), where 0.24's V1 runner holds it to the end of `profile_run`.
#[test]
fn gemma3_on_model_runner_v2_encodes_as_each_release_does() {
    let at = |vllm: &str| {
        let mut req = request("preset:gemma-3-4b-it", "sim:h100-sxm:dry", vllm);
        req.tokens = 2048;
        req.seqs = 64;
        run(&req)
    };
    let pixels = |r: &Report| {
        r.events
            .iter()
            .filter(|e| e.pass == 1 && e.tensor == "pixel_values")
            .filter(|e| matches!(e.kind, EventKind::Alloc | EventKind::Free))
            .map(|e| (e.kind == EventKind::Alloc, e.seq))
            .collect::<Vec<_>>()
    };
    // The first text layer's first allocation in the profile pass.
    let text_start = |r: &Report| {
        r.events
            .iter()
            .find(|e| e.pass == 1 && e.kind == EventKind::Alloc && e.tensor.starts_with("layers."))
            .map(|e| e.seq)
            .unwrap()
    };
    for vllm in ["0.25", "0.26"] {
        let r = at(vllm);
        assert!(pixels(&r).is_empty(), "{vllm}");
        let e = r.encoder.as_ref().unwrap();
        assert!(e.plan.is_none() && e.weights_bytes > 0, "{vllm}");
    }
    let held = at("0.24");
    let p = pixels(&held);
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p[0].0 && !p[1].0 && p[1].1 > text_start(&held), "{p:?}");
    for vllm in ["0.27", "0.29", "0.33"] {
        let r = at(vllm);
        let p = pixels(&r);
        assert_eq!(p.len(), 2, "{vllm}: {p:?}");
        assert!(
            p[0].0 && !p[1].0 && p[1].1 < text_start(&r),
            "{vllm}: {p:?}"
        );
        assert_eq!(r.encoder.as_ref().unwrap().plan.as_ref().unwrap().items, 8);
    }
}

/// Llama 4's tower under 0.21-0.33 is 0.19's (docs/reading/vllm-mm-towers-v021.md §2); from
/// 0.29 its `patches_per_image` and `aspect_ratios` stay on the host (mllama4.py 0.29.0
/// L655-656) and the pixel values die before the text pass (Model Runner V2).
#[test]
fn llama4_vision_runs_from_0_21_with_its_fields_on_the_host_from_0_29() {
    for (vllm, on_device) in [
        ("0.21", true),
        ("0.28", true),
        ("0.29", false),
        ("0.33", false),
    ] {
        let mut req = request("preset:llama-4-scout", "sim:h200:dry", vllm);
        req.tp = 4;
        req.max_model_len = 131_072;
        let r = run(&req);
        let names: Vec<&str> = r
            .events
            .iter()
            .filter(|e| e.pass == 1 && e.kind == EventKind::Alloc)
            .map(|e| e.tensor.as_str())
            .collect();
        assert!(names.contains(&"pixel_values"), "{vllm}");
        assert_eq!(names.contains(&"patches_per_image"), on_device, "{vllm}");
        assert_eq!(names.contains(&"aspect_ratios"), on_device, "{vllm}");
        assert!(r.encoder.as_ref().unwrap().weights_bytes > 0, "{vllm}");
    }
}

/// Qwen2.5-VL-7B's encoder phase from 0.21 to 0.33 (8192 batched tokens, 1024 sequences,
/// `--max-model-len 8192`: one 16384-token dummy video of 65536 patches), against 0.27's:
/// each release's pixels and what the runner holds (docs/reading/vllm-mm-towers-v021.md §1.5).
#[test]
fn qwen2_5_vl_7b_encoder_from_0_21_to_0_33() {
    let encoder = |vllm: &str| {
        let mut req = request("preset:qwen2.5-vl-7b", "sim:h100-sxm:dry", vllm);
        req.tokens = 8192;
        req.seqs = 1024;
        req.max_model_len = 8192;
        run(&req).encoder.unwrap()
    };
    let (e19, e21, e22) = (encoder("0.19"), encoder("0.21"), encoder("0.22"));
    // 0.21 (V1) holds what 0.19 holds: the bf16 pixels, second_per_grid_ts, the embeddings
    // and the cached rotary tables; 0.22 keeps second_per_grid_ts on the host (one 512-byte
    // block less).
    assert_eq!(e21.held_bytes, e19.held_bytes);
    assert_eq!(e22.held_bytes, e21.held_bytes - 512);
    // 0.25-0.26 (Model Runner V2) profile no encoder.
    let e25 = encoder("0.25");
    assert!(e25.plan.is_none());
    assert_eq!((e25.phase_peak_bytes, e25.held_bytes), (0, 0));
    // From 0.27 V2 frees the dummy batch before the text pass: the embeddings [16384, 3584]
    // and the rotary tables [65536, 40] × 2 stay.
    let e27 = encoder("0.27");
    let kept = 16384 * 3584 * 2 + 2 * 65536 * 40 * 2;
    assert_eq!(e27.held_bytes, kept);
    // 0.28 sends uint8 pixels [65536, 1176] (a 74 MiB segment instead of the bf16 pixels'
    // 148 MiB) and normalizes them before the tower; the bf16 result (split from the f32
    // temporaries' freed block: 154,140,672 B) is held through the tower. Its two f32 [3]
    // buffers load with the tower.
    let (e28, e29) = (encoder("0.28"), encoder("0.29"));
    let (u8_px, bf16_px, normed) = (77_594_624u64, 155_189_248u64, 154_140_672u64);
    assert_eq!(
        e28.phase_peak_bytes,
        e27.phase_peak_bytes + u8_px + normed - bf16_px
    );
    assert_eq!(e28.weights_bytes, e27.weights_bytes + 2 * 12);
    assert_eq!((e28.held_bytes, e29.held_bytes), (kept, kept));
    // 0.31 normalizes inside the tower; the result dies at the patch embedding.
    let e31 = encoder("0.31");
    assert_eq!(e31.phase_peak_bytes, e27.phase_peak_bytes + u8_px - bf16_px);
    assert_eq!(e31.weights_bytes, e28.weights_bytes);
}

/// LLaVA-NeXT (granite-vision-3.2-2b) and Kimi-VL (A3B) from 0.21: the same towers, with the
/// runner's fields and runners of each release (8192 batched tokens, 256 sequences,
/// `--max-model-len 8192`).
#[test]
fn llava_next_and_kimi_vl_from_0_21() {
    let encoder = |model: &str, vllm: &str| {
        let mut req = request(model, "sim:h100-sxm:dry", vllm);
        req.tokens = 8192;
        req.seqs = 256;
        req.max_model_len = 8192;
        run(&req).encoder.unwrap()
    };
    let granite = "preset:granite-vision-3.2-2b";
    let g: Vec<_> = ["0.19", "0.21", "0.22", "0.25", "0.27"]
        .iter()
        .map(|v| encoder(granite, v))
        .collect();
    // 0.21 as 0.19; 0.22 keeps `image_sizes [1, 2]` int64 on the host (one 512-byte block
    // less under the text pass).
    assert_eq!(g[1].held_bytes, g[0].held_bytes);
    assert_eq!(g[1].phase_peak_bytes, g[0].phase_peak_bytes);
    assert_eq!(g[2].held_bytes, g[1].held_bytes - 512);
    // Model Runner V2: no encoder phase under 0.25; from 0.27 the pixel values
    // [11, 3, 384, 384] bf16 die before the text pass (the dummy image's base crop and its
    // 10 grid crops: 9,732,096 B).
    assert!(g[3].plan.is_none());
    assert_eq!(g[4].phase_peak_bytes, g[2].phase_peak_bytes);
    assert_eq!(g[4].held_bytes, g[2].held_bytes - 11 * 3 * 384 * 384 * 2);
    let kimi = "preset:kimi-vl-a3b";
    let k: Vec<_> = ["0.19", "0.21", "0.28", "0.29"]
        .iter()
        .map(|v| encoder(kimi, v))
        .collect();
    // V1 (a MoE) through 0.28: the 0.19 encoder.
    assert_eq!(k[1].held_bytes, k[0].held_bytes);
    assert_eq!(k[2].phase_peak_bytes, k[0].phase_peak_bytes);
    // 0.29 runs it on V2: the pixels die before the text pass and `image_grid_hws [1, 2]`
    // stays on the host (512 bytes off the phase's peak).
    assert_eq!(k[3].phase_peak_bytes, k[2].phase_peak_bytes - 512);
    assert!(k[3].held_bytes < k[2].held_bytes);
}

/// Mistral 3 from 0.29: Pixtral packs the two dummy images (110 × 110 patches each) into one
/// FlashAttention varlen call, so the dense `[24200, 24200]` bf16 block mask that 0.15-0.28
/// hold through the tower is gone (its 1,171,280,000 bytes take a 559 × 2 MiB segment; the
/// packed sequence's `cu_seqlens` adds a 512-byte block); 0.33 sends uint8 pixels and
/// normalizes them on the device (two f32 `[3]` buffers with the tower). Qwen2.5-VL answers
/// under 0.33 from a `vllm serve` line.
#[test]
fn mistral3_packs_its_images_from_0_29_and_qwen2_5_vl_plans_under_0_33() {
    let encoder = |v: &str| {
        let mut req = request("preset:mistral-small-3.1-24b", "sim:h100-sxm:dry", v);
        req.max_model_len = 8192;
        run(&req).encoder.unwrap()
    };
    let (e28, e29, e31, e33) = (
        encoder("0.28"),
        encoder("0.29"),
        encoder("0.31"),
        encoder("0.33"),
    );
    assert_eq!(
        e28.attention,
        "PyTorch SDPA (memory-efficient, dense block mask)"
    );
    assert_eq!(
        e29.attention,
        "FlashAttention varlen (the images packed into one sequence)"
    );
    let mask = 24200u64 * 24200 * 2;
    assert_eq!(mask.div_ceil(2 << 20), 559);
    assert_eq!(
        e28.phase_peak_bytes - e29.phase_peak_bytes,
        559 * (2 << 20) - 512
    );
    assert_eq!(e33.weights_bytes, e31.weights_bytes + 2 * 12);
    assert_eq!(e33.held_bytes, e31.held_bytes);
    let (ok, out, err) = plan_qwen25_vl("0.33", &["--max-model-len", "8192"]);
    assert!(ok, "{err}");
    assert!(out.contains("profiled with 1 video items"), "{out}");
}

/// Gemma 4 (public log Q9) and Gemma 3n are refused in one line naming the model type and
/// what is not modelled.
#[test]
fn gemma_4_and_gemma_3n_are_refused_by_name() {
    for (mt, arch) in [
        ("gemma4", "Gemma4ForConditionalGeneration"),
        ("gemma3n", "Gemma3nForConditionalGeneration"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            format!(r#"{{"architectures": ["{arch}"], "model_type": "{mt}"}}"#),
        )
        .unwrap();
        let (ok, _, err) = vramscope(&["inspect", dir.path().to_str().unwrap()]);
        assert!(!ok);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("model_type '{mt}' ({arch}")) && err.contains("not modelled"),
            "{err}"
        );
    }
}

/// The report says which runner profiled the encoder and what it left under the text pass:
/// V1 holds the pixels (0.24), Model Runner V2 runs no encoder profile under 0.25-0.26 and frees
/// the pixels before the text pass from 0.27 (Qwen2.5-VL-7B, 8192 tokens).
#[test]
fn the_report_names_model_runner_v2s_encoder_profile() {
    use vramscope::profile::report::EncoderRunner;
    let report = |vllm: &str| {
        let mut req = request("preset:qwen2.5-vl-7b", "sim:h100-sxm:dry", vllm);
        req.tokens = 8192;
        req.seqs = 1024;
        req.max_model_len = 8192;
        run(&req)
    };
    let (r24, r25, r27) = (report("0.24"), report("0.25"), report("0.27"));
    let runner = |r: &Report| r.encoder.as_ref().unwrap().runner;
    assert_eq!(
        [runner(&r24), runner(&r25), runner(&r27)],
        [
            None,
            Some(EncoderRunner::V2NoProfile),
            Some(EncoderRunner::V2FreesInputs)
        ]
    );
    let s24 = r24.encoder_sentence().unwrap();
    assert!(
        s24.contains("(pixel values and the encoder cache) under the text pass"),
        "{s24}"
    );
    let s25 = r25.encoder_sentence().unwrap();
    assert!(
        s25.contains("weights 1.26 GiB, loaded; no encoder profile: Model Runner V2's profile_run under 0.22-0.26 is the text pass alone"),
        "{s25}"
    );
    let s27 = r27.encoder_sentence().unwrap();
    assert!(
        s27.contains(
            "(the encoder cache; Model Runner V2 frees the pixel values first) under the text pass"
        ),
        "{s27}"
    );
}

/// `plan -- vllm serve …` on Mistral 3, its stderr notes. `extra` follows the model.
fn mistral3_notes(vllm: &str, model: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "plan",
        "--vllm",
        vllm,
        "--device",
        "sim:h100-sxm",
        "--",
        "vllm",
        "serve",
        model,
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = vramscope(&args);
    assert!(ok, "{out}{err}");
    err
}

/// The model card's line for Mistral-Small-3.1 (`--config_format mistral --load_format
/// mistral`), and `auto` from 0.15 where the repository holds params.json, make vLLM run the
/// Mistral-format `PixtralForConditionalGeneration` (transformers_utils/config.py 0.15.1
/// L580-587, 0.19.0 L637-647); vramscope answers for the HF format and says so in its assumed
/// line (not as a flag without effect). `--config-format hf`, or 0.11 (config.json first),
/// say nothing. A folder is looked at: params.json beside config.json.
#[test]
fn mistral3_in_the_mistral_format_is_named() {
    let hub = "mistralai/Mistral-Small-3.1-24B-Instruct-2503";
    let card = mistral3_notes(
        "0.33",
        hub,
        &["--config_format", "mistral", "--load_format", "mistral"],
    );
    assert!(
        card.contains("assumed: --config-format mistral (vLLM then reads params.json and runs PixtralForConditionalGeneration"),
        "{card}"
    );
    assert!(
        !card.contains("--config-format mistral: no effect"),
        "{card}"
    );
    let auto = mistral3_notes("0.19", hub, &[]);
    assert!(
        auto.contains("--config-format auto: where the repository holds params.json"),
        "{auto}"
    );
    for (vllm, extra) in [
        (
            "0.33",
            &["--config-format", "hf", "--load-format", "hf"][..],
        ),
        ("0.11", &[][..]),
    ] {
        let text = mistral3_notes(vllm, hub, extra);
        assert!(
            !text.contains("PixtralForConditionalGeneration"),
            "--vllm {vllm}: {text}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::mistral3_wide_json();
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let path = dir.path().to_str().unwrap();
    assert!(!mistral3_notes("0.19", path, &[]).contains("PixtralForConditionalGeneration"));
    std::fs::write(dir.path().join("params.json"), "{}").unwrap();
    let with = mistral3_notes("0.19", path, &[]);
    assert!(
        with.contains("--config-format auto with params.json beside config.json"),
        "{with}"
    );
}

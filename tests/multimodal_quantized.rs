//! Quantized multimodal checkpoints as they are published (issues 45/47): the language model
//! quantized (compressed-tensors FP8-dynamic and W4A16, AutoAWQ), the vision tower and
//! projector kept in 16 bits by the quantization config's list. vLLM 0.19 hands the tower the
//! model's `quant_config` (gemma3_mm.py L515-520, mistral3.py L418-434, qwen2_5_vl.py
//! L1136-1140), so the list decides: every tower layer on it loads through
//! `UnquantizedLinearMethod`; a layer left off would be quantized, which is refused naming the
//! file and the layer.

mod common;

use std::path::Path;

use common::cli::{profile_json_under, vramscope};
use vramscope::model::weights::StoredDtype;
use vramscope::model::{self, gen_model_config_with, GenOptions, ModelConfig};

include!("fixtures/multimodal_tiny.rs");

/// The simulated GPU and release every profile here runs on.
const DEVICE: &str = "sim:h100-80gb:dry";
const VLLM: &str = "0.19";

/// The weights' tensor bytes of a dry profile.
fn tensor_bytes(dir: &Path) -> u64 {
    profile_json_under(dir, DEVICE, VLLM)["weights_tensor_bytes"]
        .as_u64()
        .unwrap()
}

/// (name, stored bytes) of each tensor of `model.safetensors`, from its header.
fn stored(dir: &Path) -> Vec<(String, u64)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    meta.tensors()
        .into_iter()
        .map(|(n, info)| (n, (info.data_offsets.1 - info.data_offsets.0) as u64))
        .collect()
}

/// Whether a stored name is a linear layer of the language model's decoder (`…layers.N.…_proj`).
fn is_decoder_linear(name: &str) -> bool {
    let body = name
        .strip_prefix("language_model.")
        .unwrap_or(name)
        .strip_prefix("model.");
    body.is_some_and(|b| b.starts_with("layers.") && b.contains("_proj."))
}

/// Whether a stored name is the tower's or the projector's.
fn is_tower(name: &str) -> bool {
    ["vision_tower.", "multi_modal_projector.", "visual."]
        .iter()
        .any(|r| name.starts_with(r))
}

fn sum(t: &[(String, u64)], keep: impl Fn(&str) -> bool) -> u64 {
    t.iter().filter(|(n, _)| keep(n)).map(|(_, b)| b).sum()
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn write_json(path: &Path, v: &serde_json::Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

/// FP8-dynamic (LLM Compressor's `FP8_DYNAMIC`: channel-wise float8_e4m3fn weights, f32
/// `weight_scale [n, 1]`, dynamic per-token activations, RedHatAI's `…-FP8-dynamic`): vLLM
/// 0.19's `CompressedTensorsW8A8Fp8` keeps each weight and its channel scales at their stored
/// sizes (the weight transposed in place, the scales of a fused layer concatenated), so
/// against the bf16 checkpoint of the same model the weights differ by exactly the decoder
/// linears' stored bytes, bf16 against fp8 + scales, read from the two files' headers; the
/// tower's 16-bit tensors are the same bytes in both files. (Qwen2.5-VL's FP8 is refused as
/// its text model's is: the qkv bias in CUTLASS's epilogue is not modelled.)
#[test]
fn fp8_dynamic_loads_the_decoder_in_fp8_and_the_tower_in_16_bits() {
    for (family, config) in [
        ("gemma3", gemma3::config()),
        ("mistral3", mistral3::config()),
        ("llava_next", llava_next::config()),
    ] {
        let bf16 = tempfile::tempdir().unwrap();
        model::gen_model_config(&config, "mm", bf16.path(), &opts(StoredDtype::BF16)).unwrap();
        let fp8 = tempfile::tempdir().unwrap();
        model::gen_model_config_fp8_channel(&config, "mm", fp8.path(), &opts(StoredDtype::BF16))
            .unwrap();
        let (b, q) = (stored(bf16.path()), stored(fp8.path()));
        assert_eq!(sum(&b, is_tower), sum(&q, is_tower), "{family}");
        assert!(sum(&q, is_tower) > 0, "{family}");
        let want =
            tensor_bytes(bf16.path()) - sum(&b, is_decoder_linear) + sum(&q, is_decoder_linear);
        assert_eq!(tensor_bytes(fp8.path()), want, "{family}");
    }
}

/// Mistral 3's tiny shape with a language model as wide (two heads and two KV heads of 64).
fn mistral3_wide() -> serde_json::Value {
    common::mistral3_wide_json()
}

/// Qwen2.5-VL's tiny shape with a language model as wide (width 128, MLP 256, two heads of
/// 64, one KV head).
fn qwen2_5_vl_wide() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1024,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": false, "image_token_id": 10, "video_token_id": 11,
        "vision_start_token_id": 12, "vision_end_token_id": 13,
        "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
        "vision_config": {"depth": 3, "hidden_act": "silu", "hidden_size": 32,
            "intermediate_size": 48, "num_heads": 4, "in_chans": 3, "out_hidden_size": 128,
            "patch_size": 2, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "window_size": 8, "fullatt_block_indexes": [1]}
    })
}

/// The text-only model of a multimodal config: Gemma 3's `text_config` as a
/// `Gemma3ForCausalLM`, Mistral 3's as a `MistralForCausalLM`, Qwen2.5-VL's top level as a
/// `Qwen2ForCausalLM`.
fn text_only(mm: &serde_json::Value) -> serde_json::Value {
    for (family, arch) in [
        ("gemma3", "Gemma3ForCausalLM"),
        ("mistral3", "MistralForCausalLM"),
    ] {
        if mm["model_type"] == family {
            let mut t = mm["text_config"].clone();
            t["architectures"] = serde_json::json!([arch]);
            return t;
        }
    }
    let mut t = mm.clone();
    let o = t.as_object_mut().unwrap();
    for k in [
        "vision_config",
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "rope_scaling",
    ] {
        o.remove(k);
    }
    t["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    t["model_type"] = "qwen2".into();
    t
}

fn config(json: &serde_json::Value) -> ModelConfig {
    ModelConfig::from_hf_json(json).unwrap()
}

/// LLM Compressor's W4A16 (compressed-tensors `pack-quantized`, RedHatAI's
/// `…-quantized.w4a16`) and AutoAWQ (`Qwen/Qwen2.5-VL-7B-Instruct-AWQ`, its
/// `modules_to_not_convert: ["visual"]`): the language model loads through the same kernel
/// and repack as the text-only model of the same shape (Machete on an H100 under 0.19), so the
/// multimodal weights are the text-only quantized model's plus the tower's and projector's
/// 16-bit tensors as the quantized file stores them; the bf16 pair differs by the same bytes.
#[test]
fn w4a16_and_awq_load_the_decoder_as_the_text_model_does() {
    use vramscope::quant::marlin::{Format, Method};
    let packed = |method, ct| Format {
        method,
        group_size: 128,
        desc_act: false,
        compressed_tensors: ct,
    };
    for (family, mm, fmt) in [
        (
            "gemma3 w4a16",
            gemma3_wide_json(),
            packed(Method::Gptq, true),
        ),
        ("gemma3 awq", gemma3_wide_json(), packed(Method::Awq, false)),
        (
            "mistral3 w4a16",
            mistral3_wide(),
            packed(Method::Gptq, true),
        ),
        (
            "qwen2_5_vl awq",
            qwen2_5_vl_wide(),
            packed(Method::Awq, false),
        ),
        (
            "qwen2_5_vl w4a16",
            qwen2_5_vl_wide(),
            packed(Method::Gptq, true),
        ),
    ] {
        let text = text_only(&mm);
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
        let o = opts(StoredDtype::F16);
        model::gen_model_config_packed4(&config(&mm), "mm", dirs[0].path(), &o, fmt).unwrap();
        model::gen_model_config_packed4(&config(&text), "t", dirs[1].path(), &o, fmt).unwrap();
        gen_model_config_with(&config(&mm), "mm", dirs[2].path(), &o, None).unwrap();
        gen_model_config_with(&config(&text), "t", dirs[3].path(), &o, None).unwrap();
        let tower = sum(&stored(dirs[0].path()), is_tower);
        assert!(tower > 0, "{family}");
        assert_eq!(tower, sum(&stored(dirs[2].path()), is_tower), "{family}");
        let w: Vec<u64> = dirs.iter().map(|d| tensor_bytes(d.path())).collect();
        // What the multimodal model holds beyond its language model, alike quantized or not:
        // the tower's stored tensors and the buffers vLLM makes for it: Pixtral's rope table
        // `inv_freq [patches, head_dim]` f32 ((28 / 7)² × 8 × 4 bytes, pixtral.py 0.19 L1241) and
        // Qwen2.5-VL's rotary `cos_sin_cache [8192, head_dim / 2]` in f16 (8192 × 4 × 2,
        // `get_rope`, qwen2_5_vl.py 0.19 L607).
        let buffers = match family.split(' ').next().unwrap() {
            "mistral3" => 16 * 8 * 4,
            "qwen2_5_vl" => 8192 * 4 * 2,
            _ => 0,
        };
        assert_eq!(w[0], w[1] + tower + buffers, "{family}: {w:?}");
        assert_eq!(w[2], w[3] + tower + buffers, "{family}: {w:?}");
        assert!(w[0] < w[2], "{family}: {w:?}");
    }
}

/// `profile` of the checkpoint at `dir`: (exit code, stderr).
fn refused(dir: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec![
        "profile",
        "-q",
        "--model",
        dir.to_str().unwrap(),
        "--vllm",
        VLLM,
        "--device",
        DEVICE,
        "--tokens",
        "256",
        "--max-model-len",
        "256",
    ];
    args.extend_from_slice(extra);
    let out = vramscope(&args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A list that leaves a tower layer to vLLM's quantization is refused in one line naming
/// config.json and the first such layer: FP8-dynamic's `ignore` naming the lm_head alone,
/// AutoAWQ's `modules_to_not_convert` without `visual`, ModelOpt's `exclude_modules` naming the
/// projector but not the tower; `--quant fp8` on the bf16 checkpoint
/// (vLLM quantizes the tower in flight too).
#[test]
fn a_list_leaving_the_tower_to_be_quantized_is_refused_naming_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    model::gen_model_config_fp8_channel(
        &gemma3::config(),
        "mm",
        dir.path(),
        &opts(StoredDtype::BF16),
    )
    .unwrap();
    let path = dir.path().join("config.json");
    let mut cfg = read_json(&path);
    cfg["quantization_config"]["ignore"] = serde_json::json!(["language_model.lm_head"]);
    write_json(&path, &cfg);
    let (code, err) = refused(dir.path(), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("quantized"))
        .unwrap_or(&err);
    assert!(line.contains(&path.display().to_string()), "{err}");
    assert!(
        line.contains("quantization_config.ignore leaves the tower layer vision_tower.vision_model.encoder.layers.0.self_attn.q_proj to be quantized"),
        "{err}"
    );

    let awq = tempfile::tempdir().unwrap();
    use vramscope::quant::marlin::{Format, Method};
    let fmt = Format {
        method: Method::Awq,
        group_size: 128,
        desc_act: false,
        compressed_tensors: false,
    };
    model::gen_model_config_packed4(
        &config(&qwen2_5_vl_wide()),
        "mm",
        awq.path(),
        &opts(StoredDtype::F16),
        fmt,
    )
    .unwrap();
    let path = awq.path().join("config.json");
    let mut cfg = read_json(&path);
    cfg["quantization_config"]["modules_to_not_convert"] = serde_json::json!(null);
    write_json(&path, &cfg);
    let (code, err) = refused(awq.path(), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("quantization_config.modules_to_not_convert leaves the tower layer visual.blocks.0.attn.qkv to be quantized"),
        "{err}"
    );

    let mo = tempfile::tempdir().unwrap();
    model::gen_modelopt_fp8::gen_model_config_modelopt_fp8(
        &mistral3::config(),
        "mm",
        mo.path(),
        &opts(StoredDtype::BF16),
    )
    .unwrap();
    let hq = mo.path().join("hf_quant_config.json");
    let mut q = read_json(&hq);
    q["quantization"]["exclude_modules"] =
        serde_json::json!(["language_model.lm_head", "multi_modal_projector*"]);
    write_json(&hq, &q);
    let (code, err) = refused(mo.path(), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("quantization_config.exclude_modules leaves the tower layer vision_tower.transformer.layers.0."),
        "{err}"
    );

    let bf16 = tempfile::tempdir().unwrap();
    model::gen_model_config(
        &gemma3::config(),
        "mm",
        bf16.path(),
        &opts(StoredDtype::BF16),
    )
    .unwrap();
    let (code, err) = refused(bf16.path(), &["--quant", "fp8"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("would quantize its vision tower too"), "{err}");
}

/// google/gemma-3-27b-it's config.json as published (transformers 4.50's layout).
fn gemma3_27b() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
        "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
        "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
            "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
            "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
            "model_type": "siglip_vision_model", "num_attention_heads": 16,
            "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}
    })
}

/// RedHatAI/gemma-3-27b-it-FP8-dynamic's quantization_config: LLM Compressor's FP8_DYNAMIC
/// (channel-wise fp8 weights, dynamic per-token activations) over every `Linear`, its `ignore`
/// the lm_head and the 27 × 6 linear layers of the SigLIP tower by their full names.
fn fp8_dynamic(tower_layers: usize) -> serde_json::Value {
    let mut ignore = vec!["language_model.lm_head".to_string()];
    for l in 0..tower_layers {
        for m in [
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.q_proj",
            "self_attn.out_proj",
            "mlp.fc1",
            "mlp.fc2",
        ] {
            ignore.push(format!("vision_tower.vision_model.encoder.layers.{l}.{m}"));
        }
    }
    serde_json::json!({
        "config_groups": {"group_0": {
            "input_activations": {"actorder": null, "block_structure": null, "dynamic": true,
                "group_size": null, "num_bits": 8, "observer": null, "observer_kwargs": {},
                "strategy": "token", "symmetric": true, "type": "float"},
            "output_activations": null, "targets": ["Linear"],
            "weights": {"actorder": null, "block_structure": null, "dynamic": false,
                "group_size": null, "num_bits": 8, "observer": "minmax", "observer_kwargs": {},
                "strategy": "channel", "symmetric": true, "type": "float"}}},
        "format": "float-quantized", "ignore": ignore, "kv_cache_scheme": null,
        "quant_method": "compressed-tensors", "quantization_status": "compressed"
    })
}

/// The KV cache bytes of a dry profile of the config-only checkpoint at `dir` on an H100 at
/// max_model_len 8192.
fn kv_bytes(dir: &Path) -> u64 {
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("r.json");
    let o = vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.to_str().unwrap(),
        "--vllm",
        VLLM,
        "--device",
        "sim:h100-sxm:dry",
        "--max-model-len",
        "8192",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_json(&json)["truth"]["kv_bytes"].as_u64().unwrap()
}

/// docs/models.md: `vramscope plan --vllm 0.19 -- vllm serve DIR --max-model-len 8192` with
/// DIR holding RedHatAI/gemma-3-27b-it-FP8-dynamic's config.json plans the fp8 run with the
/// encoder's share named; the fp8 language model leaves the KV cache more room than the bf16
/// checkpoint's (the 62 layers' linears at one byte a weight instead of two: about 25 GB).
#[test]
fn gemma_3_27b_fp8_dynamic_plans_with_a_larger_kv_cache_than_bf16() {
    let root = tempfile::tempdir().unwrap();
    let fp8 = root.path().join("gemma-3-27b-it-FP8-dynamic");
    let bf16 = root.path().join("gemma-3-27b-it");
    for d in [&fp8, &bf16] {
        std::fs::create_dir(d).unwrap();
    }
    let mut cfg = gemma3_27b();
    write_json(&bf16.join("config.json"), &cfg);
    cfg["quantization_config"] = fp8_dynamic(27);
    write_json(&fp8.join("config.json"), &cfg);
    let o = vramscope(&[
        "plan",
        "--vllm",
        "0.19",
        "--",
        "vllm",
        "serve",
        fp8.to_str().unwrap(),
        "--max-model-len",
        "8192",
    ]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("gemma-3-27b-it-FP8-dynamic fp8"), "{out}");
    assert!(
        out.contains("encoder (vision tower + projector): weights"),
        "{out}"
    );
    let (q, b) = (kv_bytes(&fp8), kv_bytes(&bf16));
    // The decoder's linear weights: 62 layers of q, k, v, o (2 × 5376 × 4096 + 2 × 5376 ×
    // 2048) and gate, up, down (3 × 5376 × 21504), one byte each saved, less the f32 channel
    // scales (4 bytes a row); the allocator's rounding and the activation peak aside (1 %).
    let rows = 4096 + 2 * 2048 + 5376 + 2 * 21504 + 5376;
    let saved = 62 * (2 * 5376 * 4096 + 2 * 5376 * 2048 + 3 * 5376 * 21504 - 4 * rows) as u64;
    assert!(q > b, "{q} {b}");
    let gained = (q - b) as f64;
    assert!(
        (gained / saved as f64 - 1.0).abs() < 0.01,
        "{gained} vs {saved}"
    );
}

/// CPU compute of the W4A16 and FP8-dynamic Gemma 3 checkpoints: the multimodal model's
/// last-token logits on a text prompt equal, value for value, those of the text-only
/// `Gemma3ForCausalLM` written from the same seed in the same format (its decoder weights are
/// the same values), so the language model runs the text family's Marlin and fp8 layers.
#[test]
fn quantized_logits_equal_the_text_only_models() {
    use common::cli::bench_logits;
    use vramscope::quant::marlin::{Format, Method};
    let fmt = Format {
        method: Method::Gptq,
        group_size: 128,
        desc_act: false,
        compressed_tensors: true,
    };
    let mm = gemma3_wide_json();
    let text = text_only(&mm);
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(StoredDtype::BF16);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    model::gen_model_config_packed4(&config(&mm), "w", a.path(), &o, fmt).unwrap();
    model::gen_model_config_packed4(&config(&text), "w", b.path(), &o, fmt).unwrap();
    let device = "sim:a100-80gb:compute";
    let la = bench_logits(a.path().to_str().unwrap(), device, tmp.path(), "mm");
    let lb = bench_logits(b.path().to_str().unwrap(), device, tmp.path(), "text");
    assert_eq!(la.len(), 1024);
    assert_eq!(la, lb);
    // Against the 16-bit multimodal model of the same seed: within 4-bit rounding's error
    // (0.2, the bound tests/compressed_tensors_w4a16.rs holds the text model to), not equal.
    let c = tempfile::tempdir().unwrap();
    gen_model_config_with(&config(&mm), "w", c.path(), &o, None).unwrap();
    let lc = bench_logits(c.path().to_str().unwrap(), device, tmp.path(), "bf16");
    let d = common::cli::rel_l2(&lc, &la);
    assert!(d > 0.0 && d < 0.2, "{d}");
    // FP8-dynamic on an H100 (fp8 needs compute capability 8.9): the same equality, and
    // closer to the 16-bit model than 4-bit.
    let (e, f) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    model::gen_model_config_fp8_channel(&config(&mm), "w", e.path(), &o).unwrap();
    model::gen_model_config_fp8_channel(&config(&text), "w", f.path(), &o).unwrap();
    let h100 = "sim:h100-80gb:compute";
    let le = bench_logits(e.path().to_str().unwrap(), h100, tmp.path(), "mm-fp8");
    let lf = bench_logits(f.path().to_str().unwrap(), h100, tmp.path(), "text-fp8");
    assert_eq!(le.len(), 1024);
    assert_eq!(le, lf);
    let lg = bench_logits(c.path().to_str().unwrap(), h100, tmp.path(), "bf16-h100");
    let d8 = common::cli::rel_l2(&lg, &le);
    assert!(d8 > 0.0 && d8 < d, "{d8} {d}");
}

/// The other formats `gen-model` writes for a multimodal model, each list keeping the tower
/// 16-bit: compressed-tensors W8A8 int8, AutoFP8 per-tensor fp8, ModelOpt FP8 and NVFP4 in
/// both flavours (Marlin FP4 on an H100). Each language model loads as the text-only model of
/// the same shape and format loads (the text tests hold those to their files), so the
/// multimodal weights are the text model's plus the tower's stored tensors and buffers.
#[test]
fn other_formats_load_the_decoder_as_the_text_model_does() {
    let formats = stored_formats();
    for (family, mm, buffers) in [
        ("gemma3", gemma3_wide_json(), 0),
        ("mistral3", mistral3_wide(), 16 * 8 * 4),
    ] {
        let text = text_only(&mm);
        for &(format, gen) in &formats {
            let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            gen(&config(&mm), a.path()).unwrap();
            gen(&config(&text), b.path()).unwrap();
            let tower = sum(&stored(a.path()), is_tower);
            assert_eq!(
                tensor_bytes(a.path()),
                tensor_bytes(b.path()) + tower + buffers,
                "{family} {format}"
            );
        }
    }
}

//! `gen-model --nvfp4 ct|modelopt`: a 16-bit synthetic checkpoint rewritten as LLM Compressor
//! (compressed-tensors `nvfp4-pack-quantized`) or NVIDIA ModelOpt (`quant_algo: NVFP4`) save
//! one: every decoder projection quantized by `quant::nvfp4::quantize` with one global scale
//! for the shards vLLM stacks (q/k/v, gate/up: both tools equalize them, as vLLM keeps one),
//! the embeddings, norms and lm_head left 16-bit.

use std::path::Path;

use crate::base::error::{Error, Result};
use crate::quant::nvfp4::{self, Flavor};

use super::{gen_model_config, GenOptions, ModelConfig, ModelFiles};

/// The stacked group a projection belongs to (its siblings' names), for the shared amax.
fn siblings(name: &str) -> Vec<String> {
    for group in [
        &["q_proj", "k_proj", "v_proj"][..],
        &["gate_proj", "up_proj"][..],
    ] {
        if let Some(p) = group.iter().find(|p| name.contains(&format!(".{p}."))) {
            return group
                .iter()
                .map(|s| name.replace(&format!(".{p}."), &format!(".{s}.")))
                .collect();
        }
    }
    vec![name.to_string()]
}

pub fn gen_model_nvfp4(
    preset: &str,
    dir: &Path,
    opts: &GenOptions,
    flavor: Flavor,
) -> Result<ModelFiles> {
    let config = super::presets::preset(preset)
        .ok_or_else(|| Error::Request(format!("unknown preset '{preset}'")))?;
    gen_model_config_nvfp4(&config, preset, dir, opts, flavor)
}

/// `gen_model_nvfp4` for any shape, seeded by `seed_name`.
pub fn gen_model_config_nvfp4(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
    flavor: Flavor,
) -> Result<ModelFiles> {
    if opts.shards != 1 || opts.bnb_int8 || !opts.bnb_skip_modules.is_empty() {
        return Err(Error::Request(
            "gen-model --nvfp4 writes one model.safetensors, not sharded and not bitsandbytes"
                .into(),
        ));
    }
    if config.arch == "opt" || config.fused_checkpoint() || config.phi.is_some() {
        return Err(Error::Request(format!(
            "gen-model --nvfp4: model_type '{}' is not written in that format (Llama-family models with separate projections only)",
            config.arch
        )));
    }
    let files = gen_model_config(config, seed_name, dir, opts)?;
    let raw = std::fs::read(&files.weights).map_err(|e| Error::io(&files.weights, e))?;
    let st = safetensors::SafeTensors::deserialize(&raw)
        .map_err(|e| Error::model(&files.weights, format!("{e}")))?;
    let values = |name: &str| -> Result<(Vec<f32>, Vec<usize>)> {
        let t = st
            .tensor(name)
            .map_err(|e| Error::model(&files.weights, format!("{name}: {e}")))?;
        let d = t.data();
        let v = match t.dtype() {
            safetensors::Dtype::F16 => d
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            safetensors::Dtype::BF16 => d
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => d
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        };
        Ok((v, t.shape().to_vec()))
    };
    let [wn, sn, gn, inn] = flavor.suffixes();
    let mut out: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    for name in &names {
        let projection = super::is_stored_projection(config, name);
        if !projection {
            let t = st.tensor(name).expect("listed");
            out.push((
                name.clone(),
                t.dtype(),
                t.shape().to_vec(),
                t.data().to_vec(),
            ));
            continue;
        }
        let (w, shape) = values(name)?;
        let (n, k) = (shape[0], shape[1]);
        if !k.is_multiple_of(nvfp4::GROUP) {
            return Err(Error::Request(format!(
                "gen-model --nvfp4: {name} [{n}, {k}]: the inputs are not a multiple of 16"
            )));
        }
        let mut amax = 0f32;
        for s in siblings(name) {
            let (v, _) = values(&s)?;
            amax = v.iter().fold(amax, |a, x| a.max(x.abs()));
        }
        let (codes, scales) = nvfp4::quantize(&w, n, k, amax);
        let base = name.trim_end_matches(".weight");
        let scalar = flavor.scalar_shape().to_vec();
        out.push((
            format!("{base}.{wn}"),
            safetensors::Dtype::U8,
            vec![n, k / 2],
            codes,
        ));
        out.push((
            format!("{base}.{sn}"),
            safetensors::Dtype::F8_E4M3,
            vec![n, k / nvfp4::GROUP],
            scales,
        ));
        out.push((
            format!("{base}.{gn}"),
            safetensors::Dtype::F32,
            scalar.clone(),
            flavor.stored_global(amax).to_le_bytes().to_vec(),
        ));
        // The activations' global scale as a calibration of |x| ≤ 8 would store it.
        out.push((
            format!("{base}.{inn}"),
            safetensors::Dtype::F32,
            scalar,
            flavor.stored_global(8.0).to_le_bytes().to_vec(),
        ));
    }
    drop(st);
    let views: Vec<(String, safetensors::tensor::TensorView)> = out
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("sizes match"),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &files.weights)
        .map_err(|e| Error::model(&files.weights, format!("{e}")))?;
    let cfg_text = std::fs::read(&files.config).map_err(|e| Error::io(&files.config, e))?;
    let mut json: serde_json::Value = serde_json::from_slice(&cfg_text)
        .map_err(|e| Error::model(&files.config, format!("{e}")))?;
    let nvfp4_args = serde_json::json!({
        "num_bits": 4, "type": "float", "symmetric": true, "group_size": 16,
        "strategy": "tensor_group", "dynamic": false, "actorder": null,
        "observer": "minmax", "observer_kwargs": {}, "block_structure": null,
    });
    match flavor {
        // What LLM Compressor writes for its NVFP4 preset scheme (RedHatAI's `…-NVFP4`).
        Flavor::CompressedTensors => {
            let mut act = nvfp4_args.clone();
            act["dynamic"] = "local".into();
            json["quantization_config"] = serde_json::json!({
                "quant_method": "compressed-tensors",
                "format": "nvfp4-pack-quantized",
                "quantization_status": "compressed",
                "global_compression_ratio": null,
                "kv_cache_scheme": null,
                "sparsity_config": {},
                "ignore": config.unquantized_linears(),
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": nvfp4_args,
                    "input_activations": act,
                    "output_activations": null,
                    "format": "nvfp4-pack-quantized",
                }},
            });
        }
        // ModelOpt's export: hf_quant_config.json beside a config.json without
        // quantization_config (as nvidia's `…-FP4` checkpoints were first published).
        Flavor::ModelOpt => {
            let hq = serde_json::json!({
                "producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {
                    "quant_algo": "NVFP4",
                    "kv_cache_quant_algo": null,
                    "group_size": 16,
                    "exclude_modules": config.modelopt_excluded(),
                },
            });
            let p = dir.join("hf_quant_config.json");
            std::fs::write(&p, serde_json::to_vec_pretty(&hq).expect("json"))
                .map_err(|e| Error::io(&p, e))?;
        }
    }
    std::fs::write(
        &files.config,
        serde_json::to_vec_pretty(&json).expect("json"),
    )
    .map_err(|e| Error::io(&files.config, e))?;
    Ok(files)
}

//! `gen-model --modelopt-fp8`: a 16-bit synthetic checkpoint rewritten as NVIDIA ModelOpt's
//! unified HF export writes a `quant_algo: FP8` model (nvidia/Llama-3.1-8B-Instruct-FP8):
//! every decoder projection's `weight` F8_E4M3 `[n, k]` with an F32 `weight_scale` `[]`
//! (amax / 448) and an F32 `input_scale` `[]`; the shards vLLM stacks (q/k/v, gate/up) share
//! one amax, as ModelOpt's `preprocess_linear_fusion` makes them before export; embeddings,
//! norms and lm_head 16-bit; `hf_quant_config.json` beside a config.json without
//! `quantization_config`.

use std::path::Path;

use crate::base::error::{Error, Result};
use crate::quant::fp8;

use super::{gen_model_config, GenOptions, ModelConfig, ModelFiles};

/// The stored activation scale: a calibration that saw |x| ≤ 8 (amax / 448).
pub const INPUT_AMAX: f32 = 8.0;

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

pub fn gen_model_modelopt_fp8(preset: &str, dir: &Path, opts: &GenOptions) -> Result<ModelFiles> {
    let config = super::presets::preset(preset)
        .ok_or_else(|| Error::Request(format!("unknown preset '{preset}'")))?;
    gen_model_config_modelopt_fp8(&config, preset, dir, opts)
}

/// `gen_model_modelopt_fp8` for any shape, seeded by `seed_name`.
pub fn gen_model_config_modelopt_fp8(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
) -> Result<ModelFiles> {
    if opts.shards != 1 || opts.bnb_int8 || !opts.bnb_skip_modules.is_empty() {
        return Err(Error::Request(
            "gen-model --modelopt-fp8 writes one model.safetensors, not sharded and not bitsandbytes"
                .into(),
        ));
    }
    if config.arch == "opt" || config.fused_checkpoint() || config.phi.is_some() {
        return Err(Error::Request(format!(
            "gen-model --modelopt-fp8: model_type '{}' is not written in that format (Llama-family models with separate projections only)",
            config.arch
        )));
    }
    let files = gen_model_config(config, seed_name, dir, opts)?;
    let raw = std::fs::read(&files.weights).map_err(|e| Error::io(&files.weights, e))?;
    let st = safetensors::SafeTensors::deserialize(&raw)
        .map_err(|e| Error::model(&files.weights, format!("{e}")))?;
    let values = |name: &str| -> Result<Vec<f32>> {
        let t = st
            .tensor(name)
            .map_err(|e| Error::model(&files.weights, format!("{name}: {e}")))?;
        let d = t.data();
        Ok(match t.dtype() {
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
        })
    };
    let mut out: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    for name in &names {
        let t = st.tensor(name).expect("listed");
        let projection = super::is_stored_projection(config, name);
        if !projection {
            out.push((
                name.clone(),
                t.dtype(),
                t.shape().to_vec(),
                t.data().to_vec(),
            ));
            continue;
        }
        let w = values(name)?;
        let mut amax = 0f32;
        for s in siblings(name) {
            amax = values(&s)?.iter().fold(amax, |a, x| a.max(x.abs()));
        }
        let scale = amax / fp8::E4M3_MAX;
        // ModelOpt's `to_quantized_weight`: `(weight / scale).to(torch.float8_e4m3fn)`.
        let codes: Vec<u8> = w.iter().map(|&x| fp8::encode(x / scale)).collect();
        let base = name.trim_end_matches(".weight");
        out.push((
            name.clone(),
            safetensors::Dtype::F8_E4M3,
            t.shape().to_vec(),
            codes,
        ));
        out.push((
            format!("{base}.weight_scale"),
            safetensors::Dtype::F32,
            vec![],
            scale.to_le_bytes().to_vec(),
        ));
        out.push((
            format!("{base}.input_scale"),
            safetensors::Dtype::F32,
            vec![],
            (INPUT_AMAX / fp8::E4M3_MAX).to_le_bytes().to_vec(),
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
    let hq = serde_json::json!({
        "producer": {"name": "modelopt", "version": "0.19.0"},
        "quantization": {
            "quant_algo": "FP8",
            "kv_cache_quant_algo": null,
            "exclude_modules": config.modelopt_excluded(),
        },
    });
    let p = dir.join("hf_quant_config.json");
    std::fs::write(&p, serde_json::to_vec_pretty(&hq).expect("json"))
        .map_err(|e| Error::io(&p, e))?;
    Ok(files)
}

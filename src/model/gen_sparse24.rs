//! `gen-model --sparse24 dense|bitmask [--sparse24-fp8]`: a synthetic checkpoint rewritten as
//! LLM Compressor saves a 2:4 sparse one: every decoder projection pruned to 2:4
//! (`quant::sparse24::prune`: the two largest magnitudes of every four inputs kept), stored
//! dense or in compressed-tensors' `sparse-24-bitmask` form (`compressed`, `bitmask`,
//! `shape`), 16-bit or fp8 (one F32 scale per output channel, dynamic per-token activations:
//! LLM Compressor's FP8_DYNAMIC, as RedHatAI's `Sparse-Llama-3.1-8B-2of4-FP8-dynamic`); the
//! embeddings, norms and lm_head left as they were.

use std::path::Path;

use crate::base::error::{Error, Result};
use crate::quant::sparse24::{self, Format};

use super::{gen_model_config, GenOptions, ModelConfig, ModelFiles};

pub fn gen_model_sparse24(
    preset: &str,
    dir: &Path,
    opts: &GenOptions,
    format: Format,
    fp8: bool,
) -> Result<ModelFiles> {
    let config = super::presets::preset(preset)
        .ok_or_else(|| Error::Request(format!("unknown preset '{preset}'")))?;
    gen_model_config_sparse24(&config, preset, dir, opts, format, fp8)
}

/// `gen_model_sparse24` for any shape, seeded by `seed_name`.
pub fn gen_model_config_sparse24(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
    format: Format,
    fp8: bool,
) -> Result<ModelFiles> {
    if opts.shards != 1 || opts.bnb_int8 || !opts.bnb_skip_modules.is_empty() {
        return Err(Error::Request(
            "gen-model --sparse24 writes one model.safetensors, not sharded and not bitsandbytes"
                .into(),
        ));
    }
    if config.arch == "opt" || config.fused_checkpoint() || config.phi.is_some() {
        return Err(Error::Request(format!(
            "gen-model --sparse24: model_type '{}' is not written in that format (Llama-family models with separate projections only)",
            config.arch
        )));
    }
    let files = gen_model_config(config, seed_name, dir, opts)?;
    let raw = std::fs::read(&files.weights).map_err(|e| Error::io(&files.weights, e))?;
    let st = safetensors::SafeTensors::deserialize(&raw)
        .map_err(|e| Error::model(&files.weights, format!("{e}")))?;
    let mut out: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    let (mut zeros, mut total) = (0usize, 0usize);
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
        let (n, k) = (t.shape()[0], t.shape()[1]);
        if !k.is_multiple_of(32) || !n.is_multiple_of(16) {
            return Err(Error::Request(format!(
                "gen-model --sparse24: {name} [{n}, {k}]: vLLM's CUTLASS 2:4 GEMM needs the outputs a multiple of 16 and the inputs of 32"
            )));
        }
        let dtype = t.dtype();
        let mut w: Vec<f32> = match dtype {
            safetensors::Dtype::F16 => t
                .data()
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            safetensors::Dtype::BF16 => t
                .data()
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        };
        sparse24::prune(&mut w, k);
        let base = name.trim_end_matches(".weight");
        // The stored values: fp8 codes at one scale per row (amax / 448), or the 16-bit
        // values as they were (pruning only zeroes).
        let (bytes_of, stored_dtype, scales): (Vec<Vec<u8>>, _, Vec<f32>) = if fp8 {
            let mut codes = Vec::with_capacity(n);
            let mut scales = Vec::with_capacity(n);
            for row in w.chunks_exact(k) {
                let s = crate::quant::fp8::dynamic_scale(row).max(f32::MIN_POSITIVE);
                let mut c = vec![0u8; k];
                crate::quant::fp8::quantize_with_scale(row, s, &mut c);
                codes.push(c);
                scales.push(s);
            }
            // A value that quantizes to zero is a zero of the stored weight.
            for (v, &c) in w.iter_mut().zip(codes.iter().flatten()) {
                *v = crate::quant::fp8::decode(c);
            }
            let per_elem = codes.into_iter().flatten().map(|c| vec![c]).collect();
            (per_elem, safetensors::Dtype::F8_E4M3, scales)
        } else {
            let per_elem = w
                .iter()
                .map(|&v| match dtype {
                    safetensors::Dtype::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                    safetensors::Dtype::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                    _ => v.to_le_bytes().to_vec(),
                })
                .collect();
            (per_elem, dtype, Vec::new())
        };
        zeros += w.iter().filter(|v| **v == 0.0).count();
        total += w.len();
        match format {
            Format::Dense => out.push((
                format!("{base}.weight"),
                stored_dtype,
                vec![n, k],
                bytes_of.concat(),
            )),
            Format::Bitmask => {
                let (kept, mask) = sparse24::encode_bitmask(&w, n, k);
                let shape: Vec<u8> = [n as i64, k as i64]
                    .iter()
                    .flat_map(|d| d.to_le_bytes())
                    .collect();
                out.push((
                    format!("{base}.shape"),
                    safetensors::Dtype::I64,
                    vec![2, 1],
                    shape,
                ));
                out.push((
                    format!("{base}.compressed"),
                    stored_dtype,
                    vec![n, k / 2],
                    kept.iter().flat_map(|&i| bytes_of[i].clone()).collect(),
                ));
                out.push((
                    format!("{base}.bitmask"),
                    safetensors::Dtype::U8,
                    vec![n, k / 8],
                    mask,
                ));
            }
        }
        if fp8 {
            out.push((
                format!("{base}.weight_scale"),
                safetensors::Dtype::F32,
                vec![n, 1],
                scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
            ));
        }
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
    // LLM Compressor's list of the linear layers it leaves alone, by their full names.
    let unquantized = config.unquantized_linears();
    // compressed-tensors' SparsityCompressionConfig as LLM Compressor saves it.
    let sparsity = serde_json::json!({
        "format": format.label(),
        "global_sparsity": zeros as f64 / total.max(1) as f64,
        "ignore": unquantized,
        "registry_requires_subclass": false,
        "sparsity_structure": "2:4",
        "targets": ["Linear"],
    });
    json["quantization_config"] = if fp8 {
        serde_json::json!({
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "global_compression_ratio": null,
            "kv_cache_scheme": null,
            "sparsity_config": sparsity,
            "ignore": unquantized,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "channel",
                    "symmetric": true, "dynamic": false, "group_size": null,
                    "observer": "minmax", "actorder": null, "block_structure": null},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "token",
                    "symmetric": true, "dynamic": true, "group_size": null,
                    "observer": null, "actorder": null, "block_structure": null},
                "output_activations": null,
            }},
        })
    } else {
        serde_json::json!({
            "quant_method": "compressed-tensors",
            "sparsity_config": sparsity,
        })
    };
    std::fs::write(
        &files.config,
        serde_json::to_vec_pretty(&json).expect("json"),
    )
    .map_err(|e| Error::io(&files.config, e))?;
    Ok(files)
}

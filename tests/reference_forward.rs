//! Compute mode against an independent f64 implementation of the Llama forward, written here
//! from the Hugging Face modelling code's definitions and reading the safetensors file directly.

use std::path::Path;

use vramscope::app::bench::{self, BenchRequest};
use vramscope::device::DeviceSpec;
use vramscope::model::llama::Batch;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model, ModelConfig, ModelSource};
use vramscope::quant::Quant;

/// One forward pass through the product's own path (`vramscope bench` with no timed passes):
/// the logits of the last token of each sequence of `Batch::dummy(tokens, seqs, vocab)`.
fn logits(
    source: &ModelSource,
    quant: Quant,
    int8_threshold: f32,
    device: &DeviceSpec,
    tokens: usize,
    seqs: usize,
) -> Vec<f32> {
    let req = BenchRequest {
        model: source.clone(),
        quant,
        device: device.clone(),
        tokens,
        seqs,
        iters: 0,
        fast_weights: false,
        int8_threshold,
        seed: 0,
        op_times: false,
        sampler_rows: 0,
        sampler_seqs: 256,
        tp: 1,
        ep: false,
    };
    bench::run(&req).unwrap().logits
}

struct Weights {
    st: Vec<u8>,
}

impl Weights {
    fn get(&self, name: &str) -> Vec<f64> {
        let st = safetensors::SafeTensors::deserialize(&self.st).unwrap();
        let v = st.tensor(name).unwrap();
        match v.dtype() {
            safetensors::Dtype::F16 => v
                .data()
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            safetensors::Dtype::F32 => v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            d => panic!("unexpected dtype {d:?}"),
        }
    }
}

fn linear(x: &[f64], w: &[f64], k: usize) -> Vec<f64> {
    let n = w.len() / k;
    x.chunks_exact(k)
        .flat_map(|row| {
            (0..n).map(move |j| {
                row.iter()
                    .zip(&w[j * k..(j + 1) * k])
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            })
        })
        .collect()
}

fn rms(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let h = w.len();
    x.chunks_exact(h)
        .flat_map(|row| {
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / h as f64 + eps).sqrt();
            row.iter()
                .zip(w)
                .map(move |(v, g)| v * inv * g)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn rope(x: &mut [f64], heads: usize, d: usize, pos: &[usize], theta: f64) {
    for (t, &p) in pos.iter().enumerate() {
        for h in 0..heads {
            let base = (t * heads + h) * d;
            for i in 0..d / 2 {
                let ang = p as f64 / theta.powf(2.0 * i as f64 / d as f64);
                let (a, b) = (x[base + i], x[base + i + d / 2]);
                x[base + i] = a * ang.cos() - b * ang.sin();
                x[base + i + d / 2] = b * ang.cos() + a * ang.sin();
            }
        }
    }
}

fn reference_logits(dir: &Path, batch: &Batch) -> Vec<f64> {
    let cfg = ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
    let w = Weights {
        st: std::fs::read(dir.join("model.safetensors")).unwrap(),
    };
    let (h, d, nh, nkv) = (
        cfg.hidden_size,
        cfg.head_dim,
        cfg.num_heads,
        cfg.num_kv_heads,
    );
    let emb = w.get("model.embed_tokens.weight");
    let mut x: Vec<f64> = batch
        .ids
        .iter()
        .flat_map(|&id| emb[id as usize * h..(id as usize + 1) * h].to_vec())
        .collect();
    let pos: Vec<usize> = batch.seq_lens.iter().flat_map(|&n| 0..n).collect();
    let eps = cfg.rms_norm_eps;
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        let hn = rms(&x, &w.get(&format!("{p}.input_layernorm.weight")), eps);
        let mut q = linear(&hn, &w.get(&format!("{p}.self_attn.q_proj.weight")), h);
        let mut k = linear(&hn, &w.get(&format!("{p}.self_attn.k_proj.weight")), h);
        let v = linear(&hn, &w.get(&format!("{p}.self_attn.v_proj.weight")), h);
        // Qwen3 (modeling_qwen3.py `Qwen3Attention.forward`): RMSNorm over each head of q
        // and k before the rotary embedding.
        if cfg.qk_norm() {
            q = rms(&q, &w.get(&format!("{p}.self_attn.q_norm.weight")), eps);
            k = rms(&k, &w.get(&format!("{p}.self_attn.k_norm.weight")), eps);
        }
        rope(&mut q, nh, d, &pos, cfg.rope_theta);
        rope(&mut k, nkv, d, &pos, cfg.rope_theta);
        let mut att = vec![0.0; q.len()];
        let mut start = 0;
        for &len in &batch.seq_lens {
            for head in 0..nh {
                let kvh = head / (nh / nkv);
                for i in 0..len {
                    let qi = &q[(start + i) * nh * d + head * d..][..d];
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            let kj = &k[(start + j) * nkv * d + kvh * d..][..d];
                            qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, p) in e.iter().enumerate() {
                        for c in 0..d {
                            att[(start + i) * nh * d + head * d + c] +=
                                p / z * v[(start + j) * nkv * d + kvh * d + c];
                        }
                    }
                }
            }
            start += len;
        }
        let o = linear(
            &att,
            &w.get(&format!("{p}.self_attn.o_proj.weight")),
            nh * d,
        );
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let hn = rms(
            &x,
            &w.get(&format!("{p}.post_attention_layernorm.weight")),
            eps,
        );
        let g = linear(&hn, &w.get(&format!("{p}.mlp.gate_proj.weight")), h);
        let u = linear(&hn, &w.get(&format!("{p}.mlp.up_proj.weight")), h);
        let a: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let dn = linear(
            &a,
            &w.get(&format!("{p}.mlp.down_proj.weight")),
            cfg.intermediate_size,
        );
        x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
    }
    let mut last = Vec::new();
    let mut end = 0;
    for &n in &batch.seq_lens {
        end += n;
        last.extend_from_slice(&x[(end - 1) * h..end * h]);
    }
    let xn = rms(&last, &w.get("model.norm.weight"), eps);
    let head = if cfg.tie_word_embeddings {
        emb
    } else {
        w.get("lm_head.weight")
    };
    linear(&xn, &head, h)
}

#[test]
fn tiny_compute_mode_logits_match_f64_reference() {
    let dir = tempfile::tempdir().unwrap();
    gen_model("tiny", dir.path(), StoredDtype::F16, 7).unwrap();
    let batch = Batch::dummy(11, 2, 1024);
    assert_eq!(batch.seq_lens, [6, 5]);
    let ours = logits(
        &ModelSource::Path {
            path: dir.path().to_path_buf(),
        },
        Quant::F16,
        0.0,
        &DeviceSpec::parse("sim:h100-80gb").unwrap(),
        11,
        2,
    );
    let reference = reference_logits(dir.path(), &batch);
    assert_eq!(ours.len(), 2 * 1024);
    let scale = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let max_err = ours
        .iter()
        .zip(&reference)
        .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
    assert!(scale > 1e-3, "logits are all near zero: {scale}");
    assert!(
        max_err / scale < 1e-4,
        "max relative error {} (scale {scale})",
        max_err / scale
    );
}

/// Qwen3: per-head q/k RMSNorm, no qkv bias, a head_dim (64) that is not hidden / heads (32),
/// tied embeddings, as Qwen3-0.6B has them; compute mode against the f64 forward.
#[test]
fn qwen3_compute_mode_logits_match_f64_reference() {
    let v = serde_json::json!({
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1024,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true,
        "max_position_embeddings": 2048,
    });
    let cfg = ModelConfig::from_hf_json(&v).unwrap();
    assert!(cfg.qk_norm() && !cfg.attention_bias);
    let dir = tempfile::tempdir().unwrap();
    let opts = vramscope::model::GenOptions {
        dtype: StoredDtype::F16,
        seed: 5,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    vramscope::model::gen_model_config(&cfg, "qwen3-small", dir.path(), &opts).unwrap();
    let names = safetensors::SafeTensors::deserialize(
        &std::fs::read(dir.path().join("model.safetensors")).unwrap(),
    )
    .unwrap()
    .names()
    .iter()
    .any(|n| n.ends_with("self_attn.q_norm.weight"));
    assert!(names, "the generated checkpoint holds q_norm");
    let batch = Batch::dummy(11, 2, 1024);
    let ours = logits(
        &ModelSource::Path {
            path: dir.path().to_path_buf(),
        },
        Quant::F16,
        0.0,
        &DeviceSpec::parse("sim:h100-80gb").unwrap(),
        11,
        2,
    );
    let reference = reference_logits(dir.path(), &batch);
    let scale = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let max_err = ours
        .iter()
        .zip(&reference)
        .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
    assert!(scale > 1e-3, "logits are all near zero: {scale}");
    assert!(
        max_err / scale < 1e-4,
        "max relative error {} (scale {scale})",
        max_err / scale
    );
}

#[test]
fn quantized_forwards_stay_close_to_fp16() {
    let dir = tempfile::tempdir().unwrap();
    gen_model("tiny", dir.path(), StoredDtype::F16, 3).unwrap();
    let src = ModelSource::Path {
        path: dir.path().to_path_buf(),
    };
    let dev = DeviceSpec::parse("sim:a100-80gb").unwrap();
    let fp16 = logits(&src, Quant::F16, 0.0, &dev, 24, 2);
    let rel = |q: &[f32]| {
        let num: f64 = q
            .iter()
            .zip(&fp16)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let den: f64 = fp16.iter().map(|b| (*b as f64).powi(2)).sum();
        (num / den).sqrt()
    };
    let int8 = logits(&src, Quant::Int8, 0.0, &dev, 24, 2);
    let int8_outliers = logits(&src, Quant::Int8, 0.05, &dev, 24, 2);
    let nf4 = logits(&src, Quant::Nf4, 0.0, &dev, 24, 2);
    // int8 with 8-bit activations: ~1% relative L2; NF4: ~10%.
    assert!(rel(&int8) < 0.03, "int8 {}", rel(&int8));
    assert!(
        rel(&int8_outliers) < rel(&int8),
        "outlier decomposition should help: {} vs {}",
        rel(&int8_outliers),
        rel(&int8)
    );
    assert!(rel(&nf4) < 0.25, "nf4 {}", rel(&nf4));
    assert!(rel(&nf4) > rel(&int8), "nf4 should be coarser than int8");
}

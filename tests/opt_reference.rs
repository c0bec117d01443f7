//! OPT logits in f32 compute mode against Hugging Face `OPTForCausalLM` (PyTorch fp32) on the
//! same seeded weights. The reference numbers were computed once by `scripts/opt_reference.py`
//! (its docstring says how) and are stored below with their provenance.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::ops;
use vramscope::engine::runtime::Runtime;
use vramscope::engine::tensor::DType;
use vramscope::model::llama::{Batch, LoadOptions};
use vramscope::model::opt::OptModel;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{gen_model_config, open, GenOptions, ModelConfig, ModelSource};
use vramscope::quant::int8::TileLayout;
use vramscope::quant::{dense_matmul, Quant};

/// The two sequences `scripts/opt_reference.py` runs, and the ids it prints.
const SEQS: [&[u32]; 2] = [&[5, 17, 900, 3, 42], &[999, 0, 64]];
fn ids() -> Vec<usize> {
    (3..1000).step_by(16).collect()
}

/// A small OPT config: pre-LN shaped like opt-125m, or post-LN with a narrower embedding and
/// project_in/out shaped like opt-350m. Vocabulary 1000 (padded to 1024 rows).
pub fn small_opt(pre_ln: bool) -> ModelConfig {
    let v = serde_json::json!({
        "model_type": "opt",
        "hidden_size": 64,
        "ffn_dim": if pre_ln { 256 } else { 128 },
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 1000,
        "max_position_embeddings": 64,
        "word_embed_proj_dim": if pre_ln { 64 } else { 32 },
        "do_layer_norm_before": pre_ln,
        "enable_bias": true,
        "activation_function": "relu",
    });
    ModelConfig::from_hf_json(&v).unwrap()
}

fn write(dir: &Path, pre_ln: bool) {
    let opts = GenOptions {
        dtype: StoredDtype::F16,
        seed: 7,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    gen_model_config(&small_opt(pre_ln), "opt-small", dir, &opts).unwrap();
}

/// Logits of the last token of each sequence through the product's OPT forward on the
/// simulated device in compute mode: forward_hidden, the last rows, the tied lm_head.
fn logits(dir: &Path) -> Vec<Vec<f32>> {
    let opened = open(
        &ModelSource::Path {
            path: dir.to_path_buf(),
        },
        0,
    )
    .unwrap();
    let dev = Device::open(&DeviceSpec::parse("sim:h100-80gb:compute").unwrap()).unwrap();
    let rt = Runtime::new(dev, Arc::new(AtomicBool::new(false)), None);
    let opts = LoadOptions {
        quant: Quant::F16,
        int8_threshold: 6.0,
        int8_layout: TileLayout {
            row_pad: 8,
            col_pad: 32,
        },
        attn_scalars: 0,
        marlin: Default::default(),
    };
    let model = OptModel::load(&rt, &opened.config, opened.source.as_ref(), &opts).unwrap();
    let batch = Batch {
        ids: SEQS.concat(),
        seq_lens: SEQS.iter().map(|s| s.len()).collect(),
    };
    let h = model.forward_hidden(&rt, &batch).unwrap();
    let last = vec![4u32, 7];
    let hl = ops::gather_rows(&rt, &h, &last, "last").unwrap();
    let out = dense_matmul(&rt, &hl, model.lm_head(), "lm_head", DType::F16).unwrap();
    let v = ops::read_f32(&rt, &out).unwrap().unwrap();
    let vp = opened.config.padded_vocab();
    assert_eq!(v.len(), 2 * vp);
    v.chunks(vp).map(|r| r.to_vec()).collect()
}

fn rel_l2(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

fn check(pre_ln: bool, reference: &[[f64; 63]; 2]) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), pre_ln);
    let got = logits(dir.path());
    for (s, (row, want)) in got.iter().zip(reference).enumerate() {
        let picked: Vec<f32> = ids().iter().map(|&i| row[i]).collect();
        let e = rel_l2(&picked, want);
        eprintln!("pre_ln {pre_ln} sequence {s}: relative L2 {e:.2e}");
        assert!(e < 1e-3, "pre_ln {pre_ln} sequence {s}: relative L2 {e}");
        // The padded rows of the tied table are zero, so their logits are too.
        assert!(row[1000..].iter().all(|&x| x == 0.0));
    }
}

/// Writes the fixtures `scripts/opt_reference.py` reads (set VRAMSCOPE_OPT_FIXTURES).
#[test]
#[ignore]
fn write_fixtures() {
    let root = std::path::PathBuf::from(std::env::var("VRAMSCOPE_OPT_FIXTURES").unwrap());
    write(&root.join("pre_ln"), true);
    write(&root.join("post_ln"), false);
    for (name, ty, dq) in [
        ("nf4_dq", "nf4", true),
        ("nf4", "nf4", false),
        ("fp4_dq", "fp4", true),
        ("fp4", "fp4", false),
    ] {
        let opts = GenOptions {
            dtype: StoredDtype::F16,
            seed: 7,
            shards: 1,
            bnb_int8: false,
            bnb_skip_modules: Vec::new(),
        };
        let g = vramscope::model::Bnb4Gen {
            quant_type: vramscope::quant::bnb4::Bnb4Type::parse(ty).unwrap(),
            double_quant: dq,
        };
        vramscope::model::gen_model_config_with(
            &small_opt(true),
            "opt-small",
            &root.join(name),
            &opts,
            Some(g),
        )
        .unwrap();
    }
}

/// Hugging Face `OPTForCausalLM` (transformers 5.24.0, torch 2.15.0 CPU fp32, python 3.11.7,
/// 2026-11-30) on the pre-LN fixture: last-token logits of each sequence at ids 3, 19, ..., 995.
const HF_PRE_LN: [[f64; 63]; 2] = [
    [
        4.804367e-02,
        -2.798700e-02,
        -2.237590e-01,
        1.891228e-02,
        3.272389e-01,
        1.260220e-02,
        -6.312072e-02,
        2.233788e-01,
        -1.134157e-01,
        -1.145274e-01,
        -2.903650e-01,
        4.040355e-02,
        3.045356e-01,
        -2.572810e-01,
        1.519380e-01,
        1.378337e-01,
        2.407852e-02,
        1.707935e-02,
        -2.480338e-01,
        -1.355487e-01,
        -5.757790e-02,
        3.457477e-01,
        9.510145e-02,
        1.678352e-01,
        -1.347723e-01,
        -7.212162e-03,
        -3.588943e-02,
        7.380022e-02,
        -1.700555e-02,
        2.382942e-02,
        6.810942e-02,
        -2.452770e-01,
        -1.576156e-01,
        8.202785e-02,
        -4.633876e-01,
        -5.563742e-02,
        1.654575e-01,
        4.527682e-02,
        1.238357e-01,
        -4.171260e-02,
        5.018878e-02,
        4.550730e-01,
        -2.122799e-01,
        2.487482e-01,
        -6.229042e-02,
        2.216057e-01,
        1.443848e-01,
        -1.711679e-01,
        -2.601359e-01,
        5.585973e-02,
        1.831933e-02,
        4.271268e-01,
        -1.981169e-01,
        1.515742e-03,
        -2.389079e-01,
        -1.049677e-01,
        -1.326087e-01,
        -1.319530e-01,
        2.050517e-01,
        -1.641153e-02,
        3.462817e-01,
        -4.453553e-02,
        3.048282e-02,
    ],
    [
        -6.608531e-02,
        2.808947e-02,
        -9.999487e-02,
        -7.188328e-02,
        2.073921e-01,
        -1.848948e-01,
        2.645889e-01,
        2.167012e-01,
        9.854463e-02,
        -1.126094e-01,
        -2.116023e-01,
        8.591270e-02,
        8.862974e-03,
        -3.514671e-01,
        1.714647e-01,
        -8.105442e-02,
        1.907495e-02,
        1.776503e-01,
        -2.268532e-01,
        -2.980986e-02,
        -7.711324e-02,
        2.626854e-01,
        3.550095e-01,
        5.678732e-02,
        -2.545319e-01,
        6.102842e-02,
        -8.544993e-02,
        1.582869e-01,
        4.169954e-03,
        5.637956e-02,
        -1.407555e-01,
        -1.229109e-01,
        -5.262945e-02,
        5.929026e-02,
        -3.172185e-01,
        1.465452e-02,
        -5.201061e-02,
        5.599685e-02,
        1.882612e-01,
        1.497666e-01,
        9.411316e-02,
        1.316597e-01,
        -1.038147e-01,
        1.083496e-01,
        1.804842e-01,
        2.711923e-02,
        -4.261743e-02,
        -2.252853e-03,
        -6.079761e-02,
        -4.865444e-03,
        -2.746399e-02,
        4.660180e-01,
        -1.003555e-01,
        4.932779e-02,
        3.553036e-02,
        -1.358833e-01,
        -4.069489e-02,
        -1.318807e-01,
        -8.357070e-02,
        3.117579e-02,
        2.004984e-01,
        -6.205255e-02,
        1.267604e-01,
    ],
];

/// The same for the post-LN fixture with project_in/out.
const HF_POST_LN: [[f64; 63]; 2] = [
    [
        -5.170200e-03,
        -8.798806e-03,
        2.895202e-03,
        -3.796722e-03,
        -8.472676e-04,
        -6.324243e-03,
        -1.626303e-02,
        2.420358e-02,
        -6.969029e-04,
        -7.282867e-03,
        2.565639e-02,
        -6.779354e-03,
        8.333363e-04,
        -4.556751e-03,
        2.614791e-02,
        1.311060e-02,
        2.222749e-02,
        1.527486e-02,
        8.920877e-03,
        -2.224945e-02,
        1.022612e-02,
        -1.291982e-02,
        -6.878471e-03,
        2.153012e-03,
        6.842972e-03,
        -8.286162e-03,
        2.234547e-03,
        5.175474e-03,
        -1.365392e-02,
        -7.405259e-03,
        1.411968e-02,
        6.463534e-03,
        -1.454290e-03,
        -2.433410e-02,
        3.174552e-02,
        1.251522e-02,
        -2.079976e-03,
        9.337273e-03,
        9.219493e-03,
        -1.680649e-02,
        2.295324e-02,
        6.804082e-03,
        4.148514e-03,
        2.307196e-02,
        -7.146912e-03,
        -5.792482e-03,
        -9.424580e-03,
        4.598347e-03,
        1.901642e-02,
        7.170843e-04,
        -1.674481e-02,
        6.084575e-03,
        -1.015499e-02,
        1.877343e-02,
        1.773199e-03,
        -2.892632e-03,
        3.493818e-03,
        -5.378779e-03,
        -8.485186e-03,
        1.661047e-02,
        -1.806600e-02,
        1.921906e-02,
        -1.236210e-02,
    ],
    [
        -1.116347e-02,
        -3.254502e-03,
        8.780004e-03,
        2.873074e-03,
        -3.360777e-03,
        -7.576763e-03,
        -3.978850e-03,
        1.176835e-02,
        -1.109604e-02,
        -6.315718e-03,
        1.167277e-02,
        5.874105e-03,
        5.020308e-03,
        -6.422539e-03,
        4.416594e-04,
        7.372952e-03,
        2.413742e-02,
        6.864513e-03,
        -7.273331e-04,
        -3.315896e-02,
        -5.814810e-04,
        -8.351455e-04,
        -3.860394e-03,
        1.762680e-04,
        -4.437861e-03,
        -8.266274e-03,
        -1.144919e-02,
        -5.964866e-03,
        -3.489253e-02,
        -1.278559e-02,
        -8.767128e-04,
        1.520072e-02,
        -1.426469e-02,
        1.290206e-04,
        3.474994e-02,
        -3.358653e-03,
        3.584105e-03,
        -4.647768e-03,
        1.053960e-02,
        -1.708940e-02,
        1.163957e-02,
        7.842557e-03,
        -4.941155e-03,
        3.243440e-02,
        -7.580891e-03,
        9.730312e-03,
        -2.371811e-02,
        -1.310713e-02,
        2.496932e-02,
        1.606458e-03,
        -1.806433e-02,
        1.192532e-02,
        1.297789e-02,
        3.174612e-02,
        -1.194666e-02,
        -1.101374e-03,
        1.268596e-02,
        -3.200176e-03,
        -1.409857e-02,
        -8.625426e-03,
        1.392725e-02,
        1.711469e-02,
        -3.967145e-03,
    ],
];

#[test]
fn opt_125m_shaped_logits_match_hugging_face() {
    check(true, &HF_PRE_LN);
}

#[test]
fn opt_350m_shaped_post_ln_logits_match_hugging_face() {
    check(false, &HF_POST_LN);
}

#[test]
fn opt_presets_weigh_what_vllm_allocates() {
    // vLLM's parameter counts (embedding padded to 50304 rows) at 2 bytes:
    // 125,263,872 and 331,212,800 (VLLM_PROFILE_RUN.md §5).
    for (name, params) in [("opt-125m", 125_263_872u64), ("opt-350m", 331_212_800)] {
        let opened = open(&ModelSource::Preset { name: name.into() }, 0).unwrap();
        let dev = Device::open(&DeviceSpec::parse("sim:h100-80gb:dry").unwrap()).unwrap();
        let rt = Runtime::new(dev, Arc::new(AtomicBool::new(false)), None);
        let opts = LoadOptions {
            quant: Quant::F16,
            int8_threshold: 6.0,
            int8_layout: TileLayout {
                row_pad: 8,
                col_pad: 32,
            },
            attn_scalars: 0,
            marlin: Default::default(),
        };
        let m = OptModel::load(&rt, &opened.config, opened.source.as_ref(), &opts).unwrap();
        assert_eq!(m.weight_bytes(), 2 * params, "{name}");
        assert_eq!(
            m.lm_head().shape,
            [
                50304,
                opened.config.opt.as_ref().unwrap().word_embed_proj_dim
            ]
        );
        let h = m
            .forward_hidden(&rt, &Batch::dummy(2048, 256, 50272))
            .unwrap();
        assert_eq!(h.shape[0], 2048);
    }
}

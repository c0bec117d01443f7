//! Pre-quantized bitsandbytes 4-bit checkpoints (NF4/FP4, with and without double
//! quantization): written by gen-model, loaded as stored with their stored bytes, dequantized
//! as bitsandbytes dequantizes them; hostile ones refused with one clear error line.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use safetensors::{Dtype, SafeTensors};
use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::runtime::Runtime;
use vramscope::model::llama::{Batch, LoadOptions};
use vramscope::model::opt::OptModel;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{self, open, Bnb4Gen, GenOptions, ModelConfig, ModelSource};
use vramscope::quant::bnb4::{self, Bnb4Type};
use vramscope::quant::int8::TileLayout;
use vramscope::quant::{Linear, Quant};
use vramscope::Error;

/// The pre-LN small OPT of tests/opt_reference.rs (hidden 64, ffn 256, 2 layers, vocab 1000).
fn small_opt() -> ModelConfig {
    ModelConfig::from_hf_json(&serde_json::json!({
        "model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 64,
        "word_embed_proj_dim": 64, "do_layer_norm_before": true,
    }))
    .unwrap()
}

fn write(dir: &Path, ty: Bnb4Type, double_quant: bool) {
    let opts = GenOptions {
        dtype: StoredDtype::F16,
        seed: 7,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    let g = Bnb4Gen {
        quant_type: ty,
        double_quant,
    };
    model::gen_model_config_with(&small_opt(), "opt-small", dir, &opts, Some(g)).unwrap();
}

fn runtime(spec: &str) -> Runtime {
    let dev = Device::open(&DeviceSpec::parse(spec).unwrap()).unwrap();
    Runtime::new(dev, Arc::new(AtomicBool::new(false)), None)
}

fn load(rt: &Runtime, dir: &Path, quant: Quant) -> OptModel {
    let opened = open(
        &ModelSource::Path {
            path: dir.to_path_buf(),
        },
        0,
    )
    .unwrap();
    let opts = LoadOptions {
        quant,
        int8_threshold: 6.0,
        int8_layout: TileLayout {
            row_pad: 8,
            col_pad: 32,
        },
        attn_scalars: 0,
        marlin: Default::default(),
    };
    OptModel::load(rt, &opened.config, opened.source.as_ref(), &opts).unwrap()
}

const KINDS: [(&str, Bnb4Type, bool); 4] = [
    ("nf4_dq", Bnb4Type::Nf4, true),
    ("nf4", Bnb4Type::Nf4, false),
    ("fp4_dq", Bnb4Type::Fp4, true),
    ("fp4", Bnb4Type::Fp4, false),
];

#[test]
fn a_4bit_checkpoint_loads_with_its_stored_bytes() {
    for (name, ty, dq) in KINDS {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), ty, dq);
        let buf = std::fs::read(tmp.path().join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&buf).unwrap();
        let (mut stored, mut blobs, mut nested) = (0u64, 0u64, 0u64);
        for (n, v) in st.tensors() {
            stored += v.data().len() as u64;
            if n.contains(".quant_state.bitsandbytes__") {
                blobs += v.data().len() as u64;
            }
            if n.ends_with(".nested_absmax") {
                nested += 1;
            }
            if n.ends_with("fc1.weight") {
                assert_eq!(v.dtype(), Dtype::U8);
                assert_eq!(v.shape(), [256 * 64 / 2, 1], "{name}");
            }
        }
        assert_eq!(nested, if dq { 12 } else { 0 });
        // The device holds every stored tensor but the JSON blobs (they stay on the host),
        // plus each nested weight's offset scalar and the 24 zero rows padding the vocab.
        let want = stored - blobs + 4 * nested + 24 * 64 * 2;
        for spec in ["sim:h100-80gb:dry", "sim:h100-80gb:compute"] {
            let rt = runtime(spec);
            let m = load(&rt, tmp.path(), Quant::Nf4);
            assert_eq!(m.weight_bytes(), want, "{name} {spec}");
            // As stored whatever --quant says: FP4 stays FP4.
            match &m.layers[0].fc1.w {
                Linear::Bnb4(l) => {
                    assert_eq!(l.quant_type, ty);
                    assert_eq!(l.nested.is_some(), dq);
                }
                _ => panic!("{name}: fc1 is not 4-bit"),
            }
        }
    }
}

/// bitsandbytes 0.50.2's own `dequantize_4bit` (CPU) of `model.decoder.layers.1.fc1.weight`
/// in each checkpoint, from `QuantState.from_dict` on the stored tensors, printed by
/// `scripts/opt_reference.py` (torch 2.15.0, bitsandbytes 0.50.2, 2026-11-30): sum, sum of
/// squares and elements 0, 1, 63, 64, 1000, 4095, 4096, 16383.
const BNB_DEQUANT: [(&str, f64, f64, [f64; 8]); 4] = [
    (
        "nf4_dq",
        -1.6187610626220703,
        6.573401694364293,
        [
            0.0136566162109375,
            0.0,
            -0.01149749755859375,
            -0.004116058349609375,
            -0.0242767333984375,
            0.0216217041015625,
            0.016143798828125,
            0.016632080078125,
        ],
    ),
    (
        "nf4",
        -1.621429443359375,
        6.574050107272342,
        [
            0.0136260986328125,
            0.0,
            -0.01146697998046875,
            -0.004116058349609375,
            -0.0242767333984375,
            0.0216217041015625,
            0.016143798828125,
            0.016632080078125,
        ],
    ),
    (
        "fp4_dq",
        -2.1154316663742065,
        6.592111084511558,
        [
            0.0134735107421875,
            0.0002105236053466797,
            -0.010101318359375,
            -0.0002353191375732422,
            -0.0231170654296875,
            0.0245208740234375,
            0.01593017578125,
            0.0164031982421875,
        ],
    ),
    (
        "fp4",
        -2.119099259376526,
        6.59290935419709,
        [
            0.01343536376953125,
            0.00020992755889892578,
            -0.01007843017578125,
            -0.00023555755615234375,
            -0.0231170654296875,
            0.0245361328125,
            0.01593017578125,
            0.0164031982421875,
        ],
    ),
];

#[test]
fn dequantized_weights_equal_bitsandbytes() {
    for ((name, ty, dq), (rname, sum, sumsq, values)) in KINDS.iter().zip(BNB_DEQUANT) {
        assert_eq!(*name, rname);
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), *ty, *dq);
        let rt = runtime("sim:h100-80gb:compute");
        let m = load(&rt, tmp.path(), Quant::Nf4);
        let Linear::Bnb4(l) = &m.layers[1].fc1.w else {
            panic!("not 4-bit")
        };
        let w = bnb4::dequantize_linear(&rt, l, "fc1").unwrap();
        let w: Vec<f64> = w.f32().iter().map(|&v| v as f64).collect();
        let s: f64 = w.iter().sum();
        let s2: f64 = w.iter().map(|v| v * v).sum();
        assert!(
            (s - sum).abs() <= 1e-9 * sum.abs().max(1.0),
            "{name}: sum {s} vs {sum}"
        );
        assert!(
            (s2 - sumsq).abs() <= 1e-9 * sumsq,
            "{name}: sumsq {s2} vs {sumsq}"
        );
        for (i, v) in [0, 1, 63, 64, 1000, 4095, 4096, 16383].iter().zip(values) {
            assert_eq!(w[*i], v, "{name}[{i}]");
        }
    }
}

#[test]
fn in_flight_nf4_stores_what_bitsandbytes_stores() {
    // Biases (5h + f) and two LayerNorms (4h) per layer stay 16-bit.
    // vLLM quantizes in flight with quantize_4bit(compress_statistics=True, "nf4"): per
    // weight of n values, n/2 packed + n/64 u8 absmax + 4·ceil(n/64/256) nested absmax + 64
    // (code) + 4 (offset); one 256-entry dynamic map (1 KiB) for the process.
    let rt = runtime("sim:h100-80gb:dry");
    let opened = open(
        &ModelSource::Preset {
            name: "opt-125m".into(),
        },
        0,
    )
    .unwrap();
    let q = |n: u64| n / 2 + n / 64 + 4 * (n / 64).div_ceil(256) + 64 + 4;
    let (h, f) = (768u64, 3072u64);
    let per_layer = 4 * q(h * h) + q(h * f) + q(f * h) + (5 * h + f) * 2 + 4 * h * 2;
    let want = 12 * per_layer + 1024 + (50304 * 768 + 2050 * 768 + 2 * 768) * 2;
    for (quant, extra) in [(Quant::Nf4, 0i64), (Quant::Fp4, 0)] {
        let opts = LoadOptions {
            quant,
            int8_threshold: 6.0,
            int8_layout: TileLayout {
                row_pad: 8,
                col_pad: 32,
            },
            attn_scalars: 0,
            marlin: Default::default(),
        };
        let m = OptModel::load(&rt, &opened.config, opened.source.as_ref(), &opts).unwrap();
        if quant == Quant::Nf4 {
            assert_eq!(m.weight_bytes() as i64, want as i64 + extra);
        } else {
            // FP4 in flight keeps the f32 absmax: n/2 + 4·n/64 + 64 per weight.
            let q4 = |n: u64| n / 2 + 4 * n / 64 + 64;
            let per = 4 * q4(h * h) + q4(h * f) + q4(f * h) + (5 * h + f) * 2 + 4 * h * 2;
            assert_eq!(
                m.weight_bytes(),
                12 * per + (50304 * 768 + 2050 * 768 + 2 * 768) * 2
            );
        }
    }
}

#[test]
fn a_4bit_forward_runs_the_same_allocations_dry_and_computed() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), Bnb4Type::Nf4, true);
    let batch = Batch::dummy(12, 3, 1000);
    let mut peaks = Vec::new();
    for spec in ["sim:h100-80gb:dry", "sim:h100-80gb:compute"] {
        let rt = runtime(spec);
        let m = load(&rt, tmp.path(), Quant::Nf4);
        rt.reset_peak();
        let h = m.forward_hidden(&rt, &batch).unwrap();
        assert_eq!(h.shape, [12, 64]);
        peaks.push(rt.stats().allocated_peak);
        if let Some(v) = vramscope::engine::ops::read_f32(&rt, &h).unwrap() {
            assert!(v.iter().all(|x| x.is_finite()));
        }
    }
    assert_eq!(peaks[0], peaks[1]);
}

// ---- hostile 4-bit checkpoints ----

type Entry = (String, Dtype, Vec<usize>, Vec<u8>);

/// Rewrites `dir`'s model.safetensors after `edit` changes its tensor list.
fn rewrite(dir: &Path, edit: impl Fn(&mut Vec<Entry>)) {
    let path = dir.join("model.safetensors");
    let buf = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&buf).unwrap();
    let mut entries: Vec<Entry> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut entries);
    let views: Vec<(String, safetensors::tensor::TensorView)> = entries
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
}

const W: &str = "model.decoder.layers.0.fc1.weight";

fn set_blob(e: &mut [Entry], f: impl Fn(&mut serde_json::Value)) {
    let blob = e
        .iter_mut()
        .find(|x| x.0.starts_with(W) && x.0.contains("quant_state"))
        .unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&blob.3).unwrap();
    f(&mut v);
    blob.3 = v.to_string().into_bytes();
    blob.2 = vec![blob.3.len()];
}

/// Each case: a name, double quant or not, the edit, words the error must hold.
#[allow(clippy::type_complexity)]
fn cases() -> Vec<(
    &'static str,
    bool,
    Box<dyn Fn(&mut Vec<Entry>)>,
    Vec<&'static str>,
)> {
    vec![
        (
            "blob missing",
            true,
            Box::new(|e: &mut Vec<Entry>| {
                e.retain(|x| !(x.0.starts_with(W) && x.0.contains("quant_state")))
            }),
            vec![W, "quant state", "missing"],
        ),
        (
            "blob lies about the shape",
            true,
            Box::new(|e: &mut Vec<Entry>| {
                set_blob(e, |v| v["shape"] = serde_json::json!([128, 64]))
            }),
            vec![W, "packed bytes", "[128, 64]"],
        ),
        (
            "blob lies about the blocksize",
            false,
            Box::new(|e: &mut Vec<Entry>| set_blob(e, |v| v["blocksize"] = 128.into())),
            vec![W, "absmax", "blocksize 128"],
        ),
        (
            "blob names an unsupported blocksize",
            true,
            Box::new(|e: &mut Vec<Entry>| set_blob(e, |v| v["blocksize"] = 100.into())),
            vec![W, "blocksize 100"],
        ),
        (
            "double-quantized absmax of the wrong length",
            true,
            Box::new(|e: &mut Vec<Entry>| {
                let a = e.iter_mut().find(|x| x.0 == format!("{W}.absmax")).unwrap();
                a.3.pop();
                a.2 = vec![a.3.len()];
            }),
            vec![W, "absmax", "[255]"],
        ),
        (
            "f32 absmax of the wrong length",
            false,
            Box::new(|e: &mut Vec<Entry>| {
                let a = e.iter_mut().find(|x| x.0 == format!("{W}.absmax")).unwrap();
                a.3.truncate(a.3.len() - 8);
                a.2 = vec![a.3.len() / 4];
            }),
            vec![W, "absmax", "[254]"],
        ),
        (
            // nf4 and fp4 states for one weight: which one won depended on hash order.
            "a second quant state of the other type",
            false,
            Box::new(|e: &mut Vec<Entry>| {
                let nf4 = e
                    .iter()
                    .find(|x| x.0 == format!("{W}.quant_state.bitsandbytes__nf4"))
                    .unwrap()
                    .clone();
                let mut v: serde_json::Value = serde_json::from_slice(&nf4.3).unwrap();
                v["quant_type"] = "fp4".into();
                let bytes = v.to_string().into_bytes();
                e.push((
                    format!("{W}.quant_state.bitsandbytes__fp4"),
                    nf4.1,
                    vec![bytes.len()],
                    bytes,
                ));
            }),
            vec![
                W,
                "two quant states for one weight",
                "bitsandbytes__nf4 and",
                "bitsandbytes__fp4",
            ],
        ),
        (
            "a quant state that is a JSON array",
            false,
            Box::new(|e: &mut Vec<Entry>| set_blob(e, |v| *v = serde_json::json!(["nf4", 64]))),
            vec![W, "quant state is a JSON array, expected a JSON object"],
        ),
        (
            "nested absmax missing",
            true,
            Box::new(|e: &mut Vec<Entry>| e.retain(|x| x.0 != format!("{W}.nested_absmax"))),
            vec![W, "nested_absmax", "missing"],
        ),
    ]
}

#[test]
fn hostile_4bit_checkpoints_give_a_clear_model_error() {
    for (name, dq, edit, words) in cases() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), Bnb4Type::Nf4, dq);
        rewrite(tmp.path(), edit);
        let err = open(
            &ModelSource::Path {
                path: tmp.path().to_path_buf(),
            },
            0,
        )
        .err();
        match err {
            Some(Error::Model { path, problem }) => {
                assert!(
                    path.ends_with("model.safetensors"),
                    "{name}: {}",
                    path.display()
                );
                for w in &words {
                    assert!(problem.contains(w), "{name}: '{w}' not in: {problem}");
                }
            }
            other => panic!("{name}: expected a model error, got {other:?}"),
        }
    }
}

#[test]
fn the_cli_refuses_a_hostile_4bit_checkpoint_in_one_line_with_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), Bnb4Type::Fp4, true);
    let (_, _, edit, _) = cases().into_iter().next().unwrap();
    rewrite(tmp.path(), edit);
    for args in [
        vec!["inspect", tmp.path().to_str().unwrap()],
        vec![
            "profile",
            "--model",
            tmp.path().to_str().unwrap(),
            "--device",
            "sim:h100-80gb:dry",
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
        assert!(
            err.contains("model.safetensors") && err.contains(W),
            "{err}"
        );
    }
}

#[test]
fn gen_model_writes_4bit_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "gen-model",
            "tiny",
            tmp.path().to_str().unwrap(),
            "--bnb-4bit",
            "fp4",
            "--double-quant",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("config.json")).unwrap())
            .unwrap();
    let q = &cfg["quantization_config"];
    assert_eq!(q["load_in_4bit"], true);
    assert_eq!(q["bnb_4bit_quant_type"], "fp4");
    assert_eq!(q["bnb_4bit_use_double_quant"], true);
    let opened = open(
        &ModelSource::Path {
            path: tmp.path().to_path_buf(),
        },
        0,
    )
    .unwrap();
    let meta = opened
        .source
        .bnb4("model.layers.3.mlp.down_proj.weight")
        .unwrap();
    assert_eq!(meta.shape, [128, 384]);
    assert_eq!(meta.quant_type, Bnb4Type::Fp4);
    assert_eq!(meta.nested_blocksize, Some(256));
    // inspect counts a 4-bit weight by its quant state's shape, not its packed bytes.
    let i = model::inspect(tmp.path()).unwrap();
    assert_eq!(i.parameters, i.config.param_count());
    assert!(i.by_dtype.iter().any(|(d, _, b)| d == "U8" && *b > 0));
}

/// config.json's quantization_config against itself and the weights: contradictions and
/// values of the wrong type are errors naming config.json and the key.
#[test]
fn contradictory_or_mistyped_quantization_config_is_refused() {
    let cases: [(&str, serde_json::Value, &str); 4] = [
        (
            "both 8-bit and 4-bit",
            serde_json::json!({"quant_method": "bitsandbytes", "load_in_8bit": true, "load_in_4bit": true,
                "bnb_4bit_quant_type": "nf4"}),
            "sets both load_in_8bit and load_in_4bit",
        ),
        (
            "4-bit as a string",
            serde_json::json!({"quant_method": "bitsandbytes", "load_in_4bit": "true",
                "bnb_4bit_quant_type": "nf4"}),
            "quantization_config.load_in_4bit is \"true\", expected true or false",
        ),
        (
            "double quant as a number",
            serde_json::json!({"quant_method": "bitsandbytes", "load_in_4bit": true,
                "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": 1}),
            "quantization_config.bnb_4bit_use_double_quant is 1, expected true or false",
        ),
        (
            "8-bit over 4-bit weights",
            serde_json::json!({"quant_method": "bitsandbytes", "load_in_8bit": true}),
            "is bitsandbytes 4-bit but config.json's quantization_config says 8-bit (load_in_8bit)",
        ),
    ];
    for (name, q, words) in cases {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), Bnb4Type::Nf4, false);
        let cfg = tmp.path().join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
        v["quantization_config"] = q;
        std::fs::write(&cfg, v.to_string()).unwrap();
        let err = open(
            &ModelSource::Path {
                path: tmp.path().to_path_buf(),
            },
            0,
        )
        .err()
        .unwrap_or_else(|| panic!("{name}: opened"));
        let text = err.to_string();
        assert!(text.contains(words), "{name}: '{words}' not in: {text}");
    }
}

#[test]
fn quant_int8_on_an_nf4_checkpoint_is_refused_not_reported_as_int8() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), Bnb4Type::Nf4, false);
    let run = |quant: &str| {
        Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args([
                "profile",
                "--model",
                tmp.path().to_str().unwrap(),
                "--device",
                "sim:h100-80gb:dry",
                "--quant",
                quant,
                "--tokens",
                "16",
                "--max-model-len",
                "16",
                "--max-num-seqs",
                "16",
                "--no-verify",
                "-q",
            ])
            .output()
            .unwrap()
    };
    let out = run("int8");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("stores its weights as bitsandbytes 4-bit nf4")
            && err.contains(
                "--quant int8 would be reported for weights that are not int8: use --quant nf4"
            ),
        "{err}"
    );
    let ok = run("nf4");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// Every tensor of a gen-model checkpoint: (stored bytes, JSON blob bytes, nested absmax
/// count, names stored as U8 4-bit codes).
fn stored_parts(dir: &Path) -> (u64, u64, u64, Vec<String>) {
    let buf = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&buf).unwrap();
    let (mut stored, mut blobs, mut nested, mut packed) = (0u64, 0u64, 0u64, Vec::new());
    for (n, v) in st.tensors() {
        stored += v.data().len() as u64;
        if n.contains(".quant_state.bitsandbytes__") {
            blobs += v.data().len() as u64;
        }
        if n.ends_with(".nested_absmax") {
            nested += 1;
        }
        if n.ends_with("_proj.weight") && v.dtype() == Dtype::U8 {
            packed.push(n.clone());
        }
    }
    packed.sort();
    (stored, blobs, nested, packed)
}

fn device_weight_bytes(dir: &Path, spec: &str) -> u64 {
    let opened = open(
        &ModelSource::Path {
            path: dir.to_path_buf(),
        },
        0,
    )
    .unwrap();
    let rt = runtime(spec);
    let opts = LoadOptions {
        quant: Quant::Nf4,
        int8_threshold: 6.0,
        int8_layout: TileLayout {
            row_pad: 8,
            col_pad: 32,
        },
        attn_scalars: 0,
        marlin: Default::default(),
    };
    let m = vramscope::model::models::CausalLm::load(
        &rt,
        &opened.config,
        opened.source.as_ref(),
        &opts,
    )
    .unwrap();
    m.weight_bytes()
}

/// Unsloth's dynamic 4-bit checkpoints keep some modules 16-bit and list them in
/// `llm_int8_skip_modules`; vLLM loads those unquantized (bitsandbytes.py L164-186 at 0.19.0),
/// so the model weighs what its safetensors hold, with a config.json alone too.
#[test]
fn skip_modules_stay_16_bit_as_stored_and_in_a_dry_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let (plain, skip) = (tmp.path().join("plain"), tmp.path().join("skip"));
    for (dir, extra) in [
        (&plain, None),
        (
            &skip,
            Some("model.layers.0.self_attn,model.layers.1.mlp,lm_head"),
        ),
    ] {
        let mut args = vec![
            "gen-model".to_string(),
            "tiny".into(),
            dir.to_str().unwrap().into(),
            "--bnb-4bit".into(),
            "nf4".into(),
            "--double-quant".into(),
        ];
        if let Some(e) = extra {
            args.push("--bnb-skip-modules".into());
            args.push(e.into());
        }
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(skip.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        cfg["quantization_config"]["llm_int8_skip_modules"],
        serde_json::json!(["model.layers.0.self_attn", "model.layers.1.mlp", "lm_head"])
    );
    let (p_stored, p_blobs, p_nested, p_packed) = stored_parts(&plain);
    let (s_stored, s_blobs, s_nested, s_packed) = stored_parts(&skip);
    // Layer 0's q/k/v/o and layer 1's gate/up/down are stored 16-bit; the rest 4-bit.
    assert_eq!(p_packed.len() - s_packed.len(), 7);
    assert!(!s_packed
        .iter()
        .any(|n| n.starts_with("model.layers.0.self_attn") || n.starts_with("model.layers.1.mlp")));
    assert!(s_packed.contains(&"model.layers.0.mlp.down_proj.weight".to_string()));
    // The device holds what is stored but the host-side JSON blobs, plus one offset scalar
    // per double-quantized weight; the same padding in both (the vocabulary's).
    let pad =
        device_weight_bytes(&plain, "sim:h100-80gb:dry") - (p_stored - p_blobs + 4 * p_nested);
    for spec in ["sim:h100-80gb:dry", "sim:h100-80gb:compute"] {
        assert_eq!(
            device_weight_bytes(&skip, spec),
            s_stored - s_blobs + 4 * s_nested + pad,
            "{spec}"
        );
    }
    // config.json alone: the same bytes (the skipped layers are not planned as 4-bit).
    let only = tmp.path().join("only");
    std::fs::create_dir(&only).unwrap();
    std::fs::copy(skip.join("config.json"), only.join("config.json")).unwrap();
    assert_eq!(
        device_weight_bytes(&only, "sim:h100-80gb:dry"),
        device_weight_bytes(&skip, "sim:h100-80gb:dry")
    );
    // Skip modules without a bitsandbytes format are refused by gen-model.
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "gen-model",
            "tiny",
            tmp.path().join("bad").to_str().unwrap(),
            "--bnb-skip-modules",
            "lm_head",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("llm_int8_skip_modules") && err.lines().count() == 1,
        "{err}"
    );
}

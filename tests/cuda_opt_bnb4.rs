//! OPT and bitsandbytes 4-bit on an NVIDIA GPU against CPU compute mode (ignored: CI has no
//! GPU). On a GPU machine:
//! `cargo test --release --test cuda_opt_bnb4 -- --ignored --test-threads 1`.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::app::bench::relative_l2;
use vramscope::device::{Device, DeviceSpec};
use vramscope::engine::ops;
use vramscope::engine::runtime::Runtime;
use vramscope::engine::tensor::DType;
use vramscope::model::llama::{Batch, LoadOptions};
use vramscope::model::opt::OptModel;
use vramscope::model::weights::StoredDtype;
use vramscope::model::{self, open, Bnb4Gen, GenOptions, ModelSource};
use vramscope::quant::bnb4::{self, Bnb4Type};
use vramscope::quant::{dense_matmul, Linear, Quant};

fn runtime(spec: &str) -> Runtime {
    let dev = Device::open(&DeviceSpec::parse(spec).unwrap()).unwrap();
    Runtime::new(dev, Arc::new(AtomicBool::new(false)), None)
}

fn load(rt: &Runtime, source: &ModelSource, quant: Quant) -> (OptModel, usize) {
    let opened = open(source, 0).unwrap();
    let layout = rt.with_device(|d| d.int8_tile_layout());
    let opts = LoadOptions {
        quant,
        int8_threshold: 6.0,
        int8_layout: layout,
        attn_scalars: 0,
        marlin: Default::default(),
    };
    let m = OptModel::load(rt, &opened.config, opened.source.as_ref(), &opts).unwrap();
    (m, opened.config.vocab_size)
}

/// Last-token logits of `Batch::dummy(tokens, seqs)` through forward_hidden and the tied head,
/// and the framework peak of the pass.
fn logits(
    spec: &str,
    source: &ModelSource,
    quant: Quant,
    tokens: usize,
    seqs: usize,
) -> (Vec<f32>, u64) {
    let rt = runtime(spec);
    let (m, vocab) = load(&rt, source, quant);
    let batch = Batch::dummy(tokens, seqs, vocab);
    rt.reset_peak();
    let h = m.forward_hidden(&rt, &batch).unwrap();
    let mut end = 0;
    let last: Vec<u32> = batch
        .seq_lens
        .iter()
        .map(|&n| {
            end += n;
            (end - 1) as u32
        })
        .collect();
    let hl = ops::gather_rows(&rt, &h, &last, "last").unwrap();
    let out = dense_matmul(&rt, &hl, m.lm_head(), "lm_head", m.act).unwrap();
    rt.synchronize().unwrap();
    let peak = rt.stats().allocated_peak;
    (ops::read_f32(&rt, &out).unwrap().unwrap_or_default(), peak)
}

fn gpu_vs_cpu(source: &ModelSource, quant: Quant, tokens: usize, seqs: usize) -> f64 {
    let (gpu, gpu_peak) = logits("cuda:0", source, quant, tokens, seqs);
    let (cpu, cpu_peak) = logits("sim:h100-80gb", source, quant, tokens, seqs);
    let (_, dry_peak) = logits("sim:h100-80gb:dry", source, quant, tokens, seqs);
    assert_eq!(gpu.len(), cpu.len());
    assert!(gpu.iter().all(|v| v.is_finite()));
    // The same allocations on every backend.
    assert_eq!(gpu_peak, cpu_peak);
    assert_eq!(gpu_peak, dry_peak);
    let e = relative_l2(&gpu, &cpu);
    eprintln!("{} {quant}: relative L2 GPU vs CPU {e:.3e}", source.label());
    e
}

fn preset(name: &str) -> ModelSource {
    ModelSource::parse(&format!("preset:{name}")).unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn opt_125m_fp16_logits_on_the_gpu_match_cpu_compute_mode() {
    assert!(gpu_vs_cpu(&preset("opt-125m"), Quant::F16, 96, 3) < 1e-2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn opt_350m_post_ln_logits_on_the_gpu_match_cpu_compute_mode() {
    assert!(gpu_vs_cpu(&preset("opt-350m"), Quant::F16, 64, 2) < 1e-2);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn opt_125m_nf4_and_fp4_in_flight_on_the_gpu_match_cpu_compute_mode() {
    for q in [Quant::Nf4, Quant::Fp4, Quant::Int8] {
        assert!(gpu_vs_cpu(&preset("opt-125m"), q, 64, 2) < 2e-2, "{q}");
    }
}

fn write_4bit(dir: &Path, ty: Bnb4Type, double_quant: bool) -> ModelSource {
    let opts = GenOptions {
        dtype: StoredDtype::F16,
        seed: 3,
        shards: 1,
        bnb_int8: false,
        bnb_skip_modules: Vec::new(),
    };
    let g = Bnb4Gen {
        quant_type: ty,
        double_quant,
    };
    model::gen_model_bnb4("opt-125m", dir, &opts, g).unwrap();
    ModelSource::Path {
        path: dir.to_path_buf(),
    }
}

/// The GPU's dequantization of every pre-quantized kind equals the CPU's to the last bit
/// (both compute `decode(q) * absmax` in f32 and round once to the weight's dtype).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn nf4_and_fp4_dequantization_on_the_gpu_equals_the_cpus() {
    for (ty, dq) in [
        (Bnb4Type::Nf4, true),
        (Bnb4Type::Nf4, false),
        (Bnb4Type::Fp4, true),
        (Bnb4Type::Fp4, false),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let src = write_4bit(tmp.path(), ty, dq);
        let mut outs = Vec::new();
        for spec in ["cuda:0", "sim:h100-80gb"] {
            let rt = runtime(spec);
            let (m, _) = load(&rt, &src, Quant::Nf4);
            let Linear::Bnb4(l) = &m.layers[5].fc1.w else {
                panic!("not 4-bit")
            };
            let w = bnb4::dequantize_linear(&rt, l, "fc1").unwrap();
            assert_eq!(w.dtype, DType::F16);
            outs.push(ops::read_f32(&rt, &w).unwrap().unwrap());
        }
        let bad = outs[0].iter().zip(&outs[1]).filter(|(a, b)| a != b).count();
        assert_eq!(bad, 0, "{ty:?} double quant {dq}: {bad} values differ");
        assert!(gpu_vs_cpu(&src, Quant::Nf4, 64, 2) < 2e-2, "{ty:?} {dq}");
    }
}

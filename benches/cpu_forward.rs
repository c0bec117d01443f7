//! Compute mode's speed on the CPU: forward passes of SmolLM2-135M (256, 1024 and 2048 tokens,
//! one sequence) and OPT-125m at vLLM's defaults (2048 tokens in 256 sequences), each next to a
//! plain f32 GEMM of the same FLOP count through the same GEMM crate, timed in the same run.
//! The summary at the end gives GFLOP/s of both and their ratio, which is what to compare
//! across runs on a machine shared with other work (absolute rates move with the load).

use std::cell::RefCell;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use vramscope::app::bench::fast_weights;
use vramscope::device::{cpu, Device, DeviceSpec};
use vramscope::engine::runtime::Runtime;
use vramscope::model::llama::{Batch, LoadOptions};
use vramscope::model::{self, CausalLm, ModelSource};
use vramscope::quant::Quant;

/// One workload: the model, tokens, sequences.
const CASES: [(&str, usize, usize); 4] = [
    ("smollm2-135m", 256, 1),
    ("smollm2-135m", 1024, 1),
    ("smollm2-135m", 2048, 1),
    ("opt-125m", 2048, 256),
];

/// Each timed pass of a workload with the reference GEMM timed right after it, so the two see
/// the same load on a shared machine: (workload, pass seconds, GEMM seconds).
type Pairs = Vec<(String, f64, f64)>;

thread_local! {
    static PAIRS: RefCell<Pairs> = RefCell::default();
}

/// Medians over a workload's pairs: pass seconds, GEMM seconds, pass rate / GEMM rate.
fn medians(id: &str, pass_flops: f64, gemm_flops: f64) -> Option<(f64, f64, f64)> {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    PAIRS.with(|p| {
        let p = p.borrow();
        let pairs: Vec<(f64, f64)> = p
            .iter()
            .filter(|(i, _, _)| i == id)
            .map(|(_, a, b)| (*a, *b))
            .collect();
        let ratio = pairs
            .iter()
            .map(|(pass, gemm)| (pass_flops / pass) / (gemm_flops / gemm))
            .collect();
        Some((
            median(pairs.iter().map(|x| x.0).collect())?,
            median(pairs.iter().map(|x| x.1).collect())?,
            median(ratio)?,
        ))
    })
}

fn cpu_forward(c: &mut Criterion) {
    let mut g = c.benchmark_group("cpu_forward");
    // Passes take seconds: criterion's minimum sample count, one pass each.
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    let mut ids = Vec::new();
    for (name, tokens, seqs) in CASES {
        let opened = model::open(&ModelSource::Preset { name: name.into() }, 0).unwrap();
        let cfg = opened.config;
        let device = Device::open(&DeviceSpec::parse("sim:h100-80gb").unwrap()).unwrap();
        let opts = LoadOptions {
            quant: Quant::F16,
            int8_threshold: 0.0,
            int8_layout: device.int8_tile_layout(),
            attn_scalars: 0,
            marlin: Default::default(),
        };
        let rt = Runtime::new(device, Arc::new(AtomicBool::new(false)), None);
        let lm = CausalLm::load(&rt, &cfg, &fast_weights(0), &opts).unwrap();
        let batch = Batch::dummy(tokens, seqs, cfg.vocab_size);
        let flops = cfg.forward_flops(&batch.seq_lens);
        // A square GEMM as near the pass's FLOP count as whole sides allow, timed after each
        // pass (outside criterion's measurement, which is the pass alone).
        let side = (flops / 2.0).cbrt().round() as usize;
        let gemm_flops = 2.0 * (side * side * side) as f64;
        let x: Vec<f32> = (0..side * side).map(|i| (i % 13) as f32 * 0.01).collect();
        let w: Vec<f32> = (0..side * side).map(|i| (i % 7) as f32 * 0.01).collect();
        let mut out = vec![0f32; side * side];
        g.throughput(Throughput::Elements(flops as u64));
        let id = format!("{name}_{tokens}x{seqs}");
        g.bench_function(&id, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    drop(lm.forward(&rt, &batch).unwrap());
                    let pass = t.elapsed();
                    total += pass;
                    // The event log would grow with every pass; the benchmark reads none.
                    let _ = rt.take_events();
                    let t = Instant::now();
                    cpu::matmul_nt(&x, &w, &mut out, side, side, side);
                    let gemm = t.elapsed().as_secs_f64();
                    PAIRS.with(|p| p.borrow_mut().push((id.clone(), pass.as_secs_f64(), gemm)));
                }
                total
            })
        });
        ids.push((id, flops, side, gemm_flops));
    }
    g.finish();

    println!(
        "\ncpu_forward summary (medians over the passes; each pass paired with a square f32 GEMM \
         of the same FLOP count, `gemm` crate, timed right after it):"
    );
    let mut pass_s = Vec::new();
    for (id, flops, side, gemm_flops) in &ids {
        let Some((ps, gs, ratio)) = medians(id, *flops, *gemm_flops) else {
            continue;
        };
        pass_s.push((id.clone(), ps));
        println!(
            "  {id:<20} {:>8.1} ms {:>6.1} GFLOP/s   gemm {side}^3 {:>6.1} GFLOP/s   ratio {ratio:.2}",
            ps * 1e3,
            flops / ps / 1e9,
            gemm_flops / gs / 1e9,
        );
    }
    let secs = |id: &str| pass_s.iter().find(|(i, _)| i == id).map(|(_, s)| *s);
    if let (Some(a), Some(b)) = (secs("smollm2-135m_256x1"), secs("smollm2-135m_2048x1")) {
        println!("  smollm2-135m: 2048 tokens cost {:.1}x 256 tokens", b / a);
    }
}

criterion_group!(benches, cpu_forward);
criterion_main!(benches);

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
use vramscope::bench::{fast_weights, forward_flops};
use vramscope::device::{cpu, Device, DeviceSpec};
use vramscope::model::llama::{Batch, LoadOptions};
use vramscope::model::{self, CausalLm, ModelSource};
use vramscope::quant::Quant;
use vramscope::runtime::Runtime;

/// One workload: the model, tokens, sequences.
const CASES: [(&str, usize, usize); 4] = [
    ("smollm2-135m", 256, 1),
    ("smollm2-135m", 1024, 1),
    ("smollm2-135m", 2048, 1),
    ("opt-125m", 2048, 256),
];

/// Median seconds of each timed workload, by criterion id, for the summary.
#[derive(Default)]
struct Seconds(Vec<(String, f64, f64)>);

thread_local! {
    static TIMES: RefCell<Seconds> = RefCell::default();
}

/// Times `f` `iters` times, keeps every duration for the summary's median, returns the total.
fn timed(id: &str, flops: f64, iters: u64, mut f: impl FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let t = Instant::now();
        f();
        let d = t.elapsed();
        total += d;
        TIMES.with(|s| {
            s.borrow_mut()
                .0
                .push((id.to_string(), d.as_secs_f64(), flops))
        });
    }
    total
}

fn median_rate(id: &str) -> Option<(f64, f64)> {
    TIMES.with(|s| {
        let s = s.borrow();
        let mut t: Vec<(f64, f64)> =
            s.0.iter()
                .filter(|(i, _, _)| i == id)
                .map(|(_, d, f)| (*d, *f))
                .collect();
        t.sort_by(|a, b| a.0.total_cmp(&b.0));
        t.get(t.len() / 2).map(|&(d, f)| (d, f / d / 1e9))
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
        };
        let rt = Runtime::new(device, Arc::new(AtomicBool::new(false)), None);
        let lm = CausalLm::load(&rt, &cfg, &fast_weights(0), &opts).unwrap();
        let batch = Batch::dummy(tokens, seqs, cfg.vocab_size);
        let flops = forward_flops(&cfg, &batch.seq_lens);
        g.throughput(Throughput::Elements(flops as u64));
        let pass_id = format!("{name}_{tokens}x{seqs}");
        g.bench_function(&pass_id, |b| {
            b.iter_custom(|iters| {
                timed(&pass_id, flops, iters, || {
                    drop(lm.forward(&rt, &batch).unwrap());
                    // The event log would grow with every pass; the benchmark reads none.
                    let _ = rt.take_events();
                })
            })
        });
        drop(lm);
        // A square GEMM as near the pass's FLOP count as whole sides allow.
        let side = (flops / 2.0).cbrt().round() as usize;
        let gemm_flops = 2.0 * (side * side * side) as f64;
        let x: Vec<f32> = (0..side * side).map(|i| (i % 13) as f32 * 0.01).collect();
        let w: Vec<f32> = (0..side * side).map(|i| (i % 7) as f32 * 0.01).collect();
        let mut out = vec![0f32; side * side];
        g.throughput(Throughput::Elements(gemm_flops as u64));
        let gemm_id = format!("{name}_{tokens}x{seqs}_gemm{side}");
        g.bench_function(&gemm_id, |b| {
            b.iter_custom(|iters| {
                timed(&gemm_id, gemm_flops, iters, || {
                    cpu::matmul_nt(&x, &w, &mut out, side, side, side)
                })
            })
        });
        ids.push((pass_id, gemm_id));
    }
    g.finish();

    println!("\ncpu_forward summary (medians; GFLOP/s of the pass and of the GEMM in this run):");
    let mut pass_s = Vec::new();
    for (pass_id, gemm_id) in &ids {
        let (Some((ps, pr)), Some((_, gr))) = (median_rate(pass_id), median_rate(gemm_id)) else {
            continue;
        };
        pass_s.push((pass_id.clone(), ps));
        println!(
            "  {pass_id:<22} {:>8.1} ms  {pr:>6.1} GFLOP/s   gemm {gr:>6.1} GFLOP/s   ratio {:.2}",
            ps * 1e3,
            pr / gr
        );
    }
    let secs = |id: &str| pass_s.iter().find(|(i, _)| i == id).map(|(_, s)| *s);
    if let (Some(a), Some(b)) = (secs("smollm2-135m_256x1"), secs("smollm2-135m_2048x1")) {
        println!("  smollm2-135m 2048 tokens cost {:.1}x 256 tokens", b / a);
    }
}

criterion_group!(benches, cpu_forward);
criterion_main!(benches);

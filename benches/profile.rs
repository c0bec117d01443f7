//! The whole profile procedure as a dry run (shapes and allocations only): how long a user
//! waits for Llama-3-70B's comparison on a laptop.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::profile::{run, ProfileRequest};
use vramscope::quant::Quant;

fn dry_runs(c: &mut Criterion) {
    let mut g = c.benchmark_group("profile_dry");
    g.sample_size(10);
    for (name, quant, device) in [
        ("llama-3-70b", Quant::F16, "sim:h200-141gb:dry"),
        ("llama-3-70b", Quant::Int8, "sim:h200-141gb:dry"),
        ("llama-3-8b", Quant::Int8, "sim:h100-80gb:dry"),
    ] {
        let req = ProfileRequest {
            model: ModelSource::Preset { name: name.into() },
            quant,
            device: DeviceSpec::parse(device).unwrap(),
            ..ProfileRequest::default()
        };
        g.bench_function(format!("{name}_{quant}"), |b| {
            b.iter(|| {
                run(&req, None, Arc::new(AtomicBool::new(false)))
                    .unwrap()
                    .event_count
            })
        });
    }
    g.finish();
}

criterion_group!(benches, dry_runs);
criterion_main!(benches);

//! Caching-allocator throughput: a forward-pass-like mix of allocations and frees (a few large
//! long-lived blocks, many short-lived activations of varied sizes), in operations per second.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vramscope::memory::{CachingAllocator, SegmentHandle, SegmentSource};

#[derive(Default)]
struct Unlimited {
    next: u64,
}

impl SegmentSource for Unlimited {
    fn map_segment(&mut self, bytes: u64) -> Option<SegmentHandle> {
        self.next += bytes.next_multiple_of(2 << 20);
        Some(SegmentHandle(self.next))
    }
    fn unmap_segment(&mut self, _: SegmentHandle) {}
}

fn layer_pattern(c: &mut Criterion) {
    // Sizes of one Llama-3-8B layer at 512 tokens: norms, q/k/v/o, gate/up/down outputs.
    let sizes: [u64; 8] = [
        4 << 20,
        4 << 20,
        1 << 20,
        1 << 20,
        4 << 20,
        14 << 20,
        14 << 20,
        4 << 20,
    ];
    let ops_per_iter = (sizes.len() * 2 + 2) as u64;
    let mut g = c.benchmark_group("allocator");
    g.throughput(Throughput::Elements(ops_per_iter));
    let mut dev = Unlimited::default();
    let mut a = CachingAllocator::new();
    g.bench_function("layer_alloc_free", |b| {
        b.iter(|| {
            let mut live = Vec::with_capacity(sizes.len());
            for (i, s) in sizes.iter().enumerate() {
                live.push(a.allocate(black_box(s + i as u64 * 512), &mut dev).unwrap());
            }
            let small = a.allocate(black_box(3000), &mut dev).unwrap();
            while let Some(bl) = live.pop() {
                a.free(bl);
            }
            a.free(small);
            a.drain_actions();
        })
    });
    g.finish();
}

criterion_group!(benches, layer_pattern);
criterion_main!(benches);

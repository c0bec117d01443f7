//! Compute mode's host kernels (blocked attention, gemm, the sampler's radix sort) keep their
//! working memory outside the framework allocator: a computed run logs exactly the dry run's
//! allocations, in the same order.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::device::DeviceSpec;
use vramscope::model::ModelSource;
use vramscope::profile::{run, ProfileRequest};

fn trace(model: &str, device: &str) -> Vec<String> {
    let req = ProfileRequest {
        model: ModelSource::parse(model).unwrap(),
        device: DeviceSpec::parse(device).unwrap(),
        // Two sequences longer than one attention block, and the sampler at the end.
        tokens: 600,
        max_model_len: 600,
        seqs: 2,
        passes: 1,
        verify: false,
        ..ProfileRequest::default()
    };
    let report = run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    report
        .events
        .iter()
        .map(|e| {
            format!(
                "{} {:?} {} {:?} {} {:?} {} {} {}",
                e.pass,
                e.kind,
                e.op,
                e.layer,
                e.tensor,
                e.category,
                e.bytes,
                e.allocated,
                e.reserved
            )
        })
        .collect()
}

#[test]
fn computed_and_dry_runs_log_the_same_allocations_in_the_same_order() {
    let dry = trace("preset:tiny", "sim:h100-80gb:dry");
    let computed = trace("preset:tiny", "sim:h100-80gb:compute");
    assert!(dry.len() > 100, "{} events", dry.len());
    assert_eq!(dry, computed);
}

//! The measurement procedure of FORMULAS.md, the formulas, and the Report they produce.

pub mod formulas;
pub mod host_memory;
pub mod procedure;
pub mod report;
pub mod request;
pub mod tp;

pub use procedure::run;
pub use report::Report;
pub use request::ProfileRequest;

/// A dry profile of the `tiny` preset on a simulated H100 (`tokens` tokens), for unit tests.
#[cfg(test)]
pub(crate) fn tiny_dry_report(tokens: usize) -> Report {
    let req = ProfileRequest {
        model: crate::model::ModelSource::parse("preset:tiny").unwrap(),
        device: crate::device::DeviceSpec::parse("sim:h100-80gb:dry").unwrap(),
        tokens,
        seqs: 1,
        ..ProfileRequest::default()
    };
    run(
        &req,
        None,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )
    .unwrap()
}

//! The measurement procedure of FORMULAS.md, the formulas, and the Report they produce.
//! A profile runs vLLM's profile pass (one rank, or every rank of a tensor-parallel
//! instance), takes the checkpoints, applies each formula, and verifies the KV cache each
//! grants.
//!
//! May import: `model` and everything below it.

pub mod diagnose;
pub mod explain;
pub mod formulas;
pub mod graphs;
pub mod host_memory;
mod log_numbers;
pub mod multimodal;
pub mod procedure;
pub mod report;
pub mod request;
pub mod tp;
pub mod vllm;
pub mod vllm_args;
pub mod warmup;

pub use report::Report;
pub use request::ProfileRequest;

/// Runs the whole procedure. `sink` gets progress; setting `cancel` stops the run within one
/// op with `Error::Cancelled`, everything freed. With `--tp N` every rank runs it on its own
/// thread and device (see `tp::run_tp`).
pub fn run(
    req: &ProfileRequest,
    sink: Option<crate::engine::progress::ProgressSink>,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> crate::base::error::Result<Report> {
    req.validate()?;
    if req.tp > 1 || req.pp > 1 || req.dp > 1 {
        return tp::run_tp(req, sink, cancel);
    }
    procedure::run_rank(req, sink, cancel, None)
}

/// A dry profile of the `tiny` preset on a simulated H100 (`tokens` tokens), for unit tests.
#[cfg(test)]
pub(crate) fn tiny_dry_report(tokens: usize) -> Report {
    let req = ProfileRequest {
        model: crate::model::ModelSource::parse("preset:tiny").unwrap(),
        device: crate::device::DeviceSpec::parse("sim:h100-80gb:dry").unwrap(),
        tokens,
        // The length vLLM needs to start with this batch and chunked prefill off.
        max_model_len: tokens as u64,
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

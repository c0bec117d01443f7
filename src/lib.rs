//! vramscope: where GPU memory goes during an LLM's forward passes, and how much vLLM's KV-cache
//! budget formulas (old #9352 and new #9516, and the later ones) leave for the cache, against
//! measured ground truth.
//!
//! Each folder is a layer; a layer imports only the layers below it (`tests/layers.rs` checks):
//!
//! ```text
//! app      the desktop app, the CLI, the bench subcommand
//! report   exports (JSON, CSV, PNG, PyTorch snapshots) and the analyses views and exports share
//! profile  FORMULAS.md's procedure (vLLM's profile run), the formulas, the Report
//! model    architectures, config, checkpoint readers, the sampler
//! quant    bitsandbytes int8 / 4-bit, NF4
//! engine   tensors, the runtime, device-agnostic ops (the allocation sequence), progress
//! device   simulated and CUDA devices: where bytes live and math runs
//! memory   the framework's caching allocator and its event log
//! base     errors, units, limits, guarded file access
//! ```

pub mod app;
pub mod base;
pub mod device;
pub mod engine;
pub mod memory;
pub mod model;
pub mod profile;
pub mod quant;
pub mod report;

pub use base::error::{Error, Result};
pub use profile::{ProfileRequest, Report};

//! vramscope: where GPU memory goes during an LLM's forward passes, and how much vLLM's KV-cache
//! budget formulas (old #9352 and new #9516, and the later ones) leave for the cache, against
//! measured ground truth.

pub mod bench;
pub mod budget;
pub mod device;
pub mod error;
pub mod export;
pub mod lifetimes;
pub mod memory;
pub mod model;
pub mod ops;
pub mod ops_opt;
pub mod ops_tp;
pub mod palette;
pub mod profile;
pub mod progress;
pub mod quant;
pub mod runtime;
pub mod snapshot;
pub mod tensor;
pub mod timeline;
pub mod units;

pub use error::{Error, Result};
pub use profile::{ProfileRequest, Report};
pub mod cli;
pub(crate) mod fsguard;
pub mod gui;
pub mod limits;

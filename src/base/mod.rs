//! The floor every layer stands on: the crate's error type, byte units and their formatting,
//! the limits on user input, and guarded file access (regular files only, bounded reads,
//! all-or-nothing writes). Imports nothing of the crate.

pub mod atomic;
pub mod background;
pub mod error;
pub(crate) mod fsguard;
pub mod limits;
pub mod timing;
pub mod units;

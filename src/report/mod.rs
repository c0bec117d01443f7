//! What is made of a finished profile: the exports (JSON session, CSV, PNG report, PyTorch
//! memory snapshots in and out) and the analyses that the app's views and the exports share
//! (tensor lifetimes, the budget breakdown, the timeline reduced per pixel column, the colours).
//!
//! May import: `profile` and everything below it.

pub mod budget;
pub mod export;
pub mod lifetimes;
pub mod palette;
pub mod snapshot;
pub mod timeline;

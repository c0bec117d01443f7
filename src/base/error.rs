//! The library's one error type: every message names the file or setting and the problem.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model file is missing, truncated, lying or of an unsupported kind.
    #[error("{path}: {problem}", path = path.display())]
    Model { path: PathBuf, problem: String },
    /// A request setting that cannot work (tokens < seqs, utilization out of range, ...).
    #[error("invalid setting: {0}")]
    Request(String),
    #[error("out of memory on {device} while {during}: {detail}")]
    OutOfMemory {
        device: String,
        during: String,
        detail: String,
        /// The caching allocator and the device when a framework allocation failed (what
        /// PyTorch's `OutOfMemoryError` message prints); `None` for memory outside it.
        state: Option<OomState>,
    },
    #[error("cancelled")]
    Cancelled,
    /// Another rank of a tensor-parallel instance stopped (its own error says why), so this
    /// one could not go on with the collective they shared.
    #[error("tensor-parallel rank {rank} stopped: {why}")]
    PeerStopped { rank: usize, why: String },
    #[error("device {spec}: {problem}")]
    Device { spec: String, problem: String },
    #[error("{path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {problem}", path = path.display())]
    Export { path: PathBuf, problem: String },
    /// A PyTorch memory snapshot that is not one, is damaged, or names Python code.
    #[error("{path}: {problem}", path = path.display())]
    Snapshot { path: PathBuf, problem: String },
}

/// Where a framework allocation failed: the request, the caching allocator's reserved and
/// allocated bytes, and the device's free and total memory at that moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomState {
    pub requested: u64,
    pub reserved: u64,
    pub allocated: u64,
    pub free: u64,
    pub total: u64,
}

impl Error {
    pub(crate) fn model(path: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        Error::Model {
            path: path.into(),
            problem: problem.into(),
        }
    }
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

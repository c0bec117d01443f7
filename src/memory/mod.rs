//! The framework allocator ("torch" in vLLM's formulas) and the event log it feeds.
//!
//! May import: `base`.

pub mod allocator;
pub mod events;

pub use allocator::{
    AllocatorStats, BlockRef, CachingAllocator, OutOfMemory, SegmentHandle, SegmentSource,
};
pub use events::{Category, Event, EventKind};

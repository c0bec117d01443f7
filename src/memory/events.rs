//! One timeline event per framework alloc/free/segment map/unmap, and per allocation made
//! outside the framework (context, library workspaces, scenario memory).

use serde::{Deserialize, Serialize};

/// What a block of memory holds, as the timeline stacks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    Weight,
    Activation,
    /// vLLM's sampler step of the profile run (logits in fp32, sort, top-k/top-p, probs).
    Sampler,
    QuantState,
    KvCache,
    Workspace,
    /// CUDA graphs: the blocks a capture takes from its graph pool, and the device memory
    /// the instantiated graphs hold outside the framework.
    CudaGraph,
    /// Memory the device holds outside the framework allocator.
    NonFramework,
}

impl Category {
    pub const ALL: [Category; 8] = [
        Category::Weight,
        Category::Activation,
        Category::Sampler,
        Category::QuantState,
        Category::KvCache,
        Category::Workspace,
        Category::CudaGraph,
        Category::NonFramework,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Category::Weight => "weight",
            Category::Activation => "activation",
            Category::Sampler => "sampler",
            Category::QuantState => "quant-state",
            Category::KvCache => "kv-cache",
            Category::Workspace => "workspace",
            Category::CudaGraph => "cuda-graph",
            Category::NonFramework => "non-framework",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    Alloc,
    Free,
    SegmentMap,
    SegmentUnmap,
    /// Device memory taken outside the framework allocator (context, cuBLAS workspace, NCCL).
    OutsideAlloc,
    OutsideFree,
    /// A checkpoint of the procedure (t0..t3) or a pass boundary; bytes is 0.
    Marker,
}

/// One row of the timeline, with the running totals right after it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    /// Microseconds since the run started.
    pub time_us: u64,
    /// Profile pass (1-based); 0 outside passes (load, checkpoints); verify passes continue
    /// the numbering after the profile passes.
    pub pass: u32,
    pub kind: EventKind,
    pub op: String,
    pub layer: Option<u32>,
    pub tensor: String,
    pub category: Category,
    pub bytes: u64,
    /// Framework allocator: bytes in live blocks, after this event.
    pub allocated: u64,
    /// Framework allocator: bytes in segments, after this event.
    pub reserved: u64,
    /// Device-wide used memory (total - free), after this event.
    pub device_used: u64,
    /// This process's device memory (context, workspaces, segments, outside allocations).
    pub process_used: u64,
    /// Framework events: the block's (or segment's) address, in the allocator's own address
    /// space for a run, the device's for an imported PyTorch snapshot; `None` for the others
    /// and in sessions saved before it was kept. A PyTorch snapshot export needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
}

#[cfg(test)]
impl Event {
    /// A test event: op "op", tensor "x", no layer, running totals 0 (set what a test needs
    /// with struct update syntax).
    pub(crate) fn test(
        seq: u64,
        time_us: u64,
        pass: u32,
        kind: EventKind,
        category: Category,
        bytes: u64,
    ) -> Event {
        Event {
            seq,
            time_us,
            pass,
            kind,
            op: "op".into(),
            layer: None,
            tensor: "x".into(),
            category,
            bytes,
            allocated: 0,
            reserved: 0,
            device_used: 0,
            process_used: 0,
            addr: None,
        }
    }
}

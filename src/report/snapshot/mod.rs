//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`) in and out. In: a snapshot
//! becomes vramscope's event log, one timeline per device, framework side only (Â, A, R; the
//! device terms U, F and non-torch are unknown to it). Out: a run's trace as a snapshot that
//! PyTorch's viewer (`torch.cuda._memory_viz`, pytorch.org/memory_viz) opens.

mod guard;
mod input;
mod raw;
pub mod read;
mod unpickle;
pub mod write;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::base::units::fmt_u;
use crate::device::{DeviceInfo, DeviceSpec};
use crate::memory::{Event, EventKind};
use crate::model::ModelSource;
use crate::profile::formulas::{Checkpoint, Checkpoints, KvGeometry};
use crate::profile::report::{ModelInfo, PassStats, Truth, REPORT_FORMAT};
use crate::profile::{ProfileRequest, Report};
use crate::quant::Quant;

pub use read::{read, read_bytes};
pub use write::{to_bytes, write};

/// Frames a vramscope export writes start with this filename prefix:
/// `vramscope/<category>/<op>`, line = layer (−1: none), name = tensor.
pub(crate) const VRAMSCOPE_FRAME: &str = "vramscope/";
/// Second frame of an export's entry: line = pass, name = what a `snapshot` entry carries
/// (PyTorch's format has no action for vramscope's markers and outside allocations).
pub(crate) const PASS_FRAME: &str = "vramscope/pass";
pub(crate) const MARKER: &str = "marker";
pub(crate) const OUTSIDE_ALLOC: &str = "outside-alloc";
pub(crate) const OUTSIDE_FREE: &str = "outside-free";

/// One device's timeline from a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceTimeline {
    pub device: u32,
    /// Entries in the snapshot's trace for this device.
    pub entries: u64,
    pub events: Vec<Event>,
    /// Â over the trace (blocks, as `torch.cuda.max_memory_allocated` counts them).
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// A and R when the snapshot was taken, from its `segments` (exact).
    pub final_allocated: u64,
    pub final_reserved: u64,
    /// A and R at the end of the replayed trace (equal to the final ones when the trace is
    /// complete and consistent).
    pub replayed_allocated: u64,
    pub replayed_reserved: u64,
    /// Alive before the first entry (the trace is a ring buffer that dropped older entries).
    pub blocks_before_history: u64,
    pub segments_before_history: u64,
    /// Allocations in segments older than the trace, whose block size is the rounded request
    /// (the segment's layout then is unknown).
    pub estimated_block_sizes: u64,
    /// Entries of actions this version does not know (skipped).
    pub ignored_entries: u64,
}

/// A snapshot file, read.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    pub path: PathBuf,
    pub file_bytes: u64,
    pub devices: Vec<DeviceTimeline>,
}

impl Imported {
    /// The device with the most events (the one a user most likely recorded).
    pub fn main_device(&self) -> Option<&DeviceTimeline> {
        self.devices
            .iter()
            .max_by_key(|d| (d.events.len(), d.final_reserved))
    }

    /// Takes one device's timeline out (`None`: the main device), e.g. to turn it into a Report.
    pub fn take_device(&mut self, index: Option<u32>) -> Option<DeviceTimeline> {
        let at = match index {
            Some(i) => self.devices.iter().position(|d| d.device == i)?,
            None => {
                let main = self.main_device()?.device;
                self.devices.iter().position(|d| d.device == main)?
            }
        };
        Some(self.devices.swap_remove(at))
    }

    pub fn device(&self, index: u32) -> Option<&DeviceTimeline> {
        self.devices.iter().find(|d| d.device == index)
    }

    /// The command line's summary of every device.
    pub fn summary_text(&self, total: Option<u64>) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "PyTorch memory snapshot {} ({}): {} device(s); framework allocator only",
            self.path.display(),
            fmt_u(self.file_bytes),
            self.devices.len()
        );
        for d in &self.devices {
            let _ = writeln!(
                s,
                "cuda:{}: {} trace entries -> {} events; peak allocated {} ({} bytes); final allocated {} ({} bytes); final reserved {} ({} bytes); peak reserved {} ({} bytes)",
                d.device,
                d.entries,
                d.events.len(),
                fmt_u(d.peak_allocated),
                d.peak_allocated,
                fmt_u(d.final_allocated),
                d.final_allocated,
                fmt_u(d.final_reserved),
                d.final_reserved,
                fmt_u(d.peak_reserved),
                d.peak_reserved
            );
            if d.blocks_before_history + d.segments_before_history > 0 {
                let _ = writeln!(
                    s,
                    "  history starts after the process did: {} segment(s) and {} block(s) existed before the first entry (peak is over the recorded history)",
                    d.segments_before_history, d.blocks_before_history
                );
            }
            if d.estimated_block_sizes > 0 {
                let _ = writeln!(
                    s,
                    "  {} allocation(s) in segments older than the trace: block size taken as the rounded request",
                    d.estimated_block_sizes
                );
            }
            if d.replayed_allocated != d.final_allocated || d.replayed_reserved != d.final_reserved
            {
                let _ = writeln!(
                    s,
                    "  the replayed trace ends at allocated {} / reserved {}, the segments say {} / {}",
                    d.replayed_allocated, d.replayed_reserved, d.final_allocated, d.final_reserved
                );
            }
            if d.ignored_entries > 0 {
                let _ = writeln!(
                    s,
                    "  {} entries of unknown actions skipped",
                    d.ignored_entries
                );
            }
            match total {
                Some(t) => {
                    let _ = writeln!(
                        s,
                        "  total {} (given): at most {} left beside the framework's reservation; device used (U), free (F) and non-torch memory: unknown (not in a snapshot)",
                        fmt_u(t),
                        fmt_u(t.saturating_sub(d.final_reserved))
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "  device used (U), free (F), total (T) and non-torch memory: unknown (a snapshot records the framework allocator only; give --total)"
                    );
                }
            }
        }
        s
    }
}

impl DeviceTimeline {
    /// `into_report` of a copy (the timeline stays).
    pub fn to_report(&self, source: &std::path::Path, total: Option<u64>) -> Report {
        self.clone().into_report(source, total)
    }

    /// This device's timeline as a Report for the views and exports: framework numbers
    /// filled in, every device-level number 0 and labelled unknown, no formulas. Consumes
    /// the timeline, so a million events are not held twice.
    pub fn into_report(self, source: &std::path::Path, total: Option<u64>) -> Report {
        let name = format!(
            "PyTorch snapshot {}",
            source.file_name().map_or_else(
                || source.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            )
        );
        let total_bytes = total.unwrap_or(0);
        let mut passes: Vec<PassStats> = Vec::new();
        // Pass number → its row: one lookup per event, so 10^5 passes stay linear; a pass's
        // events come in runs, so the last row is tried first, without hashing.
        let mut row_of: foldhash::HashMap<u32, usize> = foldhash::HashMap::default();
        let mut last: Option<(u32, usize)> = None;
        for e in &self.events {
            if e.pass == 0 {
                continue;
            }
            let row = match last {
                Some((pass, i)) if pass == e.pass => Some(i),
                _ => row_of.get(&e.pass).copied(),
            };
            let p = match row {
                Some(i) => {
                    last = Some((e.pass, i));
                    &mut passes[i]
                }
                None => {
                    last = Some((e.pass, passes.len()));
                    row_of.insert(e.pass, passes.len());
                    passes.push(PassStats {
                        index: e.pass,
                        verify_for: None,
                        start_us: e.time_us,
                        end_us: e.time_us,
                        peak_allocated: e.allocated,
                        allocated_bytes: 0,
                        freed_bytes: 0,
                        quant_state_allocated_bytes: 0,
                        quant_state_freed_bytes: 0,
                    });
                    passes.last_mut().expect("pushed")
                }
            };
            p.end_us = e.time_us;
            p.peak_allocated = p.peak_allocated.max(e.allocated);
            // Saturating: a snapshot's sizes were checked one by one, not their sums.
            match e.kind {
                EventKind::Alloc => p.allocated_bytes = p.allocated_bytes.saturating_add(e.bytes),
                EventKind::Free => p.freed_bytes = p.freed_bytes.saturating_add(e.bytes),
                _ => {}
            }
        }
        let end = Checkpoint {
            time_us: self.events.last().map_or(0, |e| e.time_us),
            free: 0,
            total: total_bytes,
            allocated: self.final_allocated,
            allocated_peak: self.peak_allocated,
            reserved: self.final_reserved,
            reserved_peak: self.peak_reserved,
            process_used: 0,
        };
        let start = self.events.first().map_or(end, |e| Checkpoint {
            time_us: e.time_us,
            allocated: e.allocated,
            allocated_peak: e.allocated,
            reserved: e.reserved,
            reserved_peak: e.reserved,
            ..end
        });
        let unknown = "unknown: a PyTorch snapshot records the framework allocator only";
        Report {
            format: REPORT_FORMAT,
            tool: format!(
                "vramscope {} (imported snapshot)",
                env!("CARGO_PKG_VERSION")
            ),
            created_unix_s: 0,
            model: ModelInfo::without_shapes(
                name,
                source.display().to_string(),
                "pytorch-memory-snapshot",
            ),
            quant: Quant::F16,
            device: DeviceInfo {
                spec: format!("cuda:{}", self.device),
                name: format!("cuda:{} (framework side only)", self.device),
                total_bytes,
                simulated: false,
                mode: "snapshot".into(),
                truth_source: unknown.into(),
                total_source: if total_bytes > 0 {
                    "--total (given by the user)".into()
                } else {
                    unknown.into()
                },
            },
            settings: ProfileRequest {
                model: ModelSource::Path {
                    path: source.to_path_buf(),
                },
                device: DeviceSpec::Cuda {
                    ordinal: self.device as usize,
                },
                passes: passes.len() as u32,
                verify: false,
                ..ProfileRequest::default()
            },
            checkpoints: Checkpoints {
                t0: start,
                t1: start,
                t2: end,
                t3: end,
            },
            weights_bytes: 0,
            kv_geometry: KvGeometry {
                block_size: 0,
                num_layers: 0,
                num_kv_heads: 0,
                head_dim: 0,
                dtype_bytes: 0,
                max_model_len: 0,
                hybrid: None,
                latent: false,
            },
            formulas: Vec::new(),
            truth: Truth {
                non_kv_bytes: 0,
                kv_bytes: 0,
                kv_blocks: 0,
                kv_tokens: 0,
                max_concurrency: 0.0,
                source: unknown.into(),
                verify: None,
            },
            true_max: None,
            passes,
            quant_state_after_bytes: 0,
            outside_framework_bytes: 0,
            other_process_bytes: 0,
            logits: Vec::new(),
            sampled_tokens: Vec::new(),
            wall_time_s: 0.0,
            event_count: self.events.len(),
            events: self.events,
            device_samples: Vec::new(),
            sample_rate_hz: None,
            tp: 1,
            rank: 0,
            weights_tensor_bytes: 0,
            ranks: Vec::new(),
            engine: Vec::new(),
            nccl_source: None,
            graphs: None,
            graphs_note: None,
            warm_up: None,
            warm_up_note: None,
            vllm_notes: Vec::new(),
            pp: 1,
            stage: None,
            encoder: None,
        }
    }
}

/// Whether a path names a PyTorch snapshot (by extension, as the app's Open decides).
pub fn is_snapshot_path(path: &std::path::Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "pickle" | "pkl"))
}

/// This process's peak resident memory (Linux `VmHWM`), to report what reading a snapshot took.
pub fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

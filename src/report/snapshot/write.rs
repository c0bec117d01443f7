//! A run's trace out as a PyTorch memory snapshot: `device_traces` with alloc,
//! free_requested/free_completed and segment_alloc/segment_free entries at the events' times,
//! and `segments` with their blocks at the end state, so PyTorch's viewer
//! (`python -m torch.cuda._memory_viz trace_plot|segment_plot F.pickle`) opens it. Each
//! entry's frames name the tensor, op, layer, category and pass; markers and memory outside
//! the framework become `snapshot` entries (the viewer lists them and draws nothing).

use std::collections::BTreeMap;
use std::path::Path;

use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

use super::{MARKER, OUTSIDE_ALLOC, OUTSIDE_FREE, PASS_FRAME, VRAMSCOPE_FRAME};
use crate::base::error::{Error, Result};
use crate::memory::allocator::SMALL_SEGMENT_BYTES;
use crate::memory::{Event, EventKind};
use crate::profile::Report;

#[derive(Serialize)]
struct OutFrame {
    filename: String,
    line: i64,
    name: String,
}

fn frames(e: &Event, what: &str) -> Vec<OutFrame> {
    vec![
        OutFrame {
            filename: format!("{VRAMSCOPE_FRAME}{}/{}", e.category.label(), e.op),
            line: e.layer.map_or(-1, i64::from),
            name: e.tensor.clone(),
        },
        OutFrame {
            filename: PASS_FRAME.into(),
            line: i64::from(e.pass),
            name: what.into(),
        },
    ]
}

#[derive(Serialize)]
struct OutEntry {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: i64,
    time_us: u64,
    frames: Vec<OutFrame>,
    /// The viewer colours allocations by category; segments and extras are 'unknown' (the
    /// viewer expects that category whenever there are categories at all).
    category: &'static str,
}

#[derive(Serialize)]
struct OutBlock {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<OutFrame>,
}

#[derive(Serialize)]
struct OutSegment {
    device: i64,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: i64,
    segment_type: &'static str,
    segment_pool_id: (i64, i64),
    is_expandable: bool,
    frames: Vec<OutFrame>,
    blocks: Vec<OutBlock>,
}

#[derive(Serialize)]
struct OutSettings {
    expandable_segments: bool,
}

/// The trace, serialized entry by entry from the events (never held as a second copy).
struct Trace<'a>(&'a [Event]);

fn entries_of(e: &Event) -> usize {
    match e.kind {
        EventKind::Free => 2,
        _ => 1,
    }
}

impl Serialize for Trace<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let n: usize = self.0.iter().map(entries_of).sum();
        let mut seq = s.serialize_seq(Some(n))?;
        for e in self.0 {
            let entry = |action, addr, size, frames, category| OutEntry {
                action,
                addr,
                size,
                stream: 0,
                time_us: e.time_us,
                frames,
                category,
            };
            let addr = e.addr.unwrap_or(0);
            let cat = e.category.label();
            match e.kind {
                EventKind::Alloc => seq.serialize_element(&entry(
                    "alloc",
                    addr,
                    e.bytes,
                    frames(e, "framework"),
                    cat,
                ))?,
                EventKind::Free => {
                    for action in ["free_requested", "free_completed"] {
                        seq.serialize_element(&entry(
                            action,
                            addr,
                            e.bytes,
                            frames(e, "framework"),
                            cat,
                        ))?;
                    }
                }
                EventKind::SegmentMap => seq.serialize_element(&entry(
                    "segment_alloc",
                    addr,
                    e.bytes,
                    frames(e, "framework"),
                    "unknown",
                ))?,
                EventKind::SegmentUnmap => seq.serialize_element(&entry(
                    "segment_free",
                    addr,
                    e.bytes,
                    frames(e, "framework"),
                    "unknown",
                ))?,
                EventKind::OutsideAlloc | EventKind::OutsideFree | EventKind::Marker => {
                    let what = match e.kind {
                        EventKind::OutsideAlloc => OUTSIDE_ALLOC,
                        EventKind::OutsideFree => OUTSIDE_FREE,
                        _ => MARKER,
                    };
                    seq.serialize_element(&entry(
                        "snapshot",
                        0,
                        e.bytes,
                        frames(e, what),
                        "unknown",
                    ))?
                }
            }
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct OutSnapshot<'a> {
    segments: Vec<OutSegment>,
    device_traces: Vec<Trace<'a>>,
    allocator_settings: OutSettings,
}

fn export_err(path: &Path, problem: impl Into<String>) -> Error {
    Error::Export {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// Segments and their blocks after the last event, from the events' addresses.
fn end_state(path: &Path, events: &[Event], device: i64) -> Result<Vec<OutSegment>> {
    let mut segments: BTreeMap<u64, u64> = BTreeMap::new();
    let mut blocks: BTreeMap<u64, &Event> = BTreeMap::new();
    for e in events {
        let framework = matches!(
            e.kind,
            EventKind::Alloc | EventKind::Free | EventKind::SegmentMap | EventKind::SegmentUnmap
        );
        if !framework {
            continue;
        }
        let Some(addr) = e.addr else {
            return Err(export_err(
                path,
                "this trace has no block addresses (a session saved by an older vramscope); run the profile again to export a PyTorch snapshot",
            ));
        };
        match e.kind {
            EventKind::SegmentMap => {
                segments.insert(addr, e.bytes);
            }
            EventKind::SegmentUnmap => {
                segments.remove(&addr);
            }
            EventKind::Alloc => {
                blocks.insert(addr, e);
            }
            _ => {
                blocks.remove(&addr);
            }
        }
    }
    let mut out = Vec::with_capacity(segments.len());
    for (&base, &size) in &segments {
        let mut list = Vec::new();
        let mut at = base;
        let mut allocated = 0;
        for (&a, e) in blocks.range(base..base + size) {
            if a > at {
                list.push(OutBlock {
                    address: at,
                    size: a - at,
                    requested_size: 0,
                    state: "inactive",
                    frames: Vec::new(),
                });
            }
            list.push(OutBlock {
                address: a,
                size: e.bytes,
                requested_size: e.bytes,
                state: "active_allocated",
                frames: frames(e, "framework"),
            });
            allocated += e.bytes;
            at = a + e.bytes;
        }
        if at < base + size {
            list.push(OutBlock {
                address: at,
                size: base + size - at,
                requested_size: 0,
                state: "inactive",
                frames: Vec::new(),
            });
        }
        out.push(OutSegment {
            device,
            address: base,
            total_size: size,
            allocated_size: allocated,
            active_size: allocated,
            requested_size: allocated,
            stream: 0,
            segment_type: if size == SMALL_SEGMENT_BYTES {
                "small"
            } else {
                "large"
            },
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: Vec::new(),
            blocks: list,
        });
    }
    Ok(out)
}

/// The report's trace as the bytes of a PyTorch memory snapshot (`write_to` into memory).
pub fn to_bytes(report: &Report, path: &Path) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_to(report, path, &mut out)?;
    Ok(out)
}

/// The report's trace as a PyTorch memory snapshot (device 0; with tensor parallel, rank k as
/// device k, one trace each, as PyTorch records one process's GPUs), streamed into `out` entry
/// by entry, for an all-or-nothing set of exports (`export::write_streamed`); `path` names the
/// target in errors.
pub fn write_to(report: &Report, path: &Path, out: &mut dyn std::io::Write) -> Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 16, out);
    let ranks: Vec<&Report> = if report.ranks.is_empty() {
        vec![report]
    } else {
        report.ranks.iter().collect()
    };
    let mut segments = Vec::new();
    for (device, r) in ranks.iter().enumerate() {
        segments.extend(end_state(path, &r.events, device as i64)?);
    }
    let snapshot = OutSnapshot {
        segments,
        device_traces: ranks.iter().map(|r| Trace(&r.events)).collect(),
        allocator_settings: OutSettings {
            expandable_segments: false,
        },
    };
    serde_pickle::to_writer(&mut out, &snapshot, serde_pickle::SerOptions::new()).map_err(|e| {
        crate::Error::Export {
            path: path.to_path_buf(),
            problem: e.to_string(),
        }
    })?;
    std::io::Write::flush(&mut out).map_err(|e| crate::Error::io(path, e))
}

/// Writes the report's trace as a PyTorch memory snapshot (device 0), all or nothing.
pub fn write(report: &Report, path: &Path) -> Result<()> {
    crate::base::atomic::write_streamed(vec![(
        path.to_path_buf(),
        Box::new(move |w: &mut dyn std::io::Write| write_to(report, path, w)),
    )])
}

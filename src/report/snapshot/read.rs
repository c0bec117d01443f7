//! A PyTorch memory snapshot in: the opcode guard, the pickle machine (`unpickle`), then a
//! replay of each device's trace through a model of PyTorch's caching allocator (segments,
//! blocks, splits), which turns the trace's requested sizes into block sizes, so the running
//! `allocated` is what `torch.cuda.memory_allocated()` reported (it counts blocks, not
//! requests).

use std::collections::BTreeMap;
use std::io::{Read, Seek};
use std::path::Path;
use std::rc::Rc;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::raw::{Frame, RawEntry, RawSegment, RawSnapshot, TopFrames};
use super::unpickle::MemoryBudget;
use super::{DeviceTimeline, Imported, VRAMSCOPE_FRAME};
use crate::base::error::{Error, Result};
use crate::memory::allocator::{
    round_size, MIN_BLOCK_BYTES, SMALL_SEGMENT_BYTES, SMALL_SIZE_BYTES,
};
use crate::memory::{Category, Event, EventKind};

fn bad(path: &Path, problem: impl Into<String>) -> Error {
    Error::Snapshot {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// Reads a snapshot file; `progress` gets (bytes read, file size) now and then.
pub fn read(path: &Path, progress: Option<&mut dyn FnMut(u64, u64)>) -> Result<Imported> {
    // A FIFO or a device would hang the guard's read or never end: regular files only.
    let (mut file, size) = crate::base::fsguard::open_regular(path, "snapshot")?;
    super::guard::check(&mut file).map_err(|e| bad(path, e.to_string()))?;
    file.rewind().map_err(|e| Error::io(path, e))?;
    let reader = Progressing {
        inner: file,
        read: 0,
        total: size,
        next_report: 0,
        progress,
    };
    let (raw, budget) =
        super::unpickle::decode(reader, size).map_err(|e| bad(path, e.to_string()))?;
    from_raw(path, raw, size, budget)
}

/// `read` for bytes already in memory (fuzzing, tests).
pub fn read_bytes(path: &Path, bytes: &[u8]) -> Result<Imported> {
    super::guard::check(bytes).map_err(|e| bad(path, e.to_string()))?;
    let (raw, budget) =
        super::unpickle::decode(bytes, bytes.len() as u64).map_err(|e| bad(path, e.to_string()))?;
    from_raw(path, raw, bytes.len() as u64, budget)
}

struct Progressing<'a, R> {
    inner: R,
    read: u64,
    total: u64,
    next_report: u64,
    progress: Option<&'a mut dyn FnMut(u64, u64)>,
}

impl<R: Read> Read for Progressing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read >= self.next_report {
            self.next_report = self.read + (self.total / 100).max(1 << 20);
            if let Some(p) = self.progress.as_mut() {
                p(self.read, self.total);
            }
        }
        Ok(n)
    }
}

/// Heap bytes of the event an entry becomes: the struct and, at most, its op and tensor
/// names (the top frame's name and file name, and a line number).
fn event_bytes(e: &RawEntry) -> u64 {
    let names = e
        .frames
        .0
        .first()
        .map_or(0, |f| f.name.len() + f.filename.len() + 24);
    std::mem::size_of::<Event>() as u64 + names as u64
}

fn from_raw(
    path: &Path,
    raw: RawSnapshot,
    file_bytes: u64,
    mut budget: MemoryBudget,
) -> Result<Imported> {
    if !raw.recognised {
        return Err(bad(
            path,
            "not a PyTorch memory snapshot: the pickle has neither 'segments' nor 'device_traces' (record one with torch.cuda.memory._dump_snapshot)",
        ));
    }
    let mut devices: Vec<i64> = raw.segments.iter().map(|s| s.device).collect();
    devices.extend(
        raw.device_traces
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(i, _)| i as i64),
    );
    devices.sort_unstable();
    devices.dedup();
    if devices.iter().any(|&d| !(0..4096).contains(&d)) {
        return Err(bad(path, "impossible device index in 'segments'"));
    }
    let mut timelines = Vec::new();
    for d in devices {
        let trace: Vec<&RawEntry> = raw
            .device_traces
            .get(d as usize)
            .map_or(&[][..], |t| &t[..])
            .iter()
            .map(|&i| &raw.entries[i as usize])
            .collect();
        let segments: Vec<&RawSegment> = raw.segments.iter().filter(|s| s.device == d).collect();
        let annotations: Vec<(u64, String)> = raw
            .annotations
            .iter()
            .filter(|a| a.device == d)
            .map(|a| {
                let name = a.name.as_deref().unwrap_or("annotation").to_string();
                let label = match &a.stage {
                    Some(s) => format!("{name} {}", s.to_lowercase()),
                    None => name,
                };
                (a.time_us.unwrap_or(0).max(0) as u64, label)
            })
            .collect();
        // The event log is charged before it is built: entries repeated through the memo
        // cost a few bytes of the file each but a whole event each.
        let log_bytes = trace
            .iter()
            .map(|e| event_bytes(e))
            .chain(
                annotations
                    .iter()
                    .map(|a| std::mem::size_of::<Event>() as u64 + a.1.len() as u64),
            )
            .fold(0u64, u64::saturating_add);
        budget
            .charge(log_bytes, file_bytes)
            .map_err(|e| bad(path, e.to_string()))?;
        let t = replay(
            d as u32,
            &trace,
            &segments,
            &annotations,
            raw.expandable_segments,
        )
        .map_err(|p| bad(path, format!("device {d}: {p}")))?;
        timelines.push(t);
    }
    drop(raw);
    Ok(Imported {
        path: path.to_path_buf(),
        file_bytes,
        devices: timelines,
    })
}

/// A block of a segment, in the model of PyTorch's allocator.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Block {
    size: u64,
    /// Allocated (counted in `allocated`) or waiting for its stream (free requested).
    active: bool,
}

#[derive(Debug)]
struct Segment {
    size: u64,
    small: bool,
    /// Blocks by address, covering the segment, when its history is known (made in the
    /// trace); `None` for a segment that existed before the first entry, or an expandable one.
    blocks: Option<BTreeMap<u64, Block>>,
}

#[derive(Default)]
struct Model {
    segments: BTreeMap<u64, Segment>,
    /// Live blocks: address → (size, allocated (not yet free-requested)).
    live: BTreeMap<u64, (u64, bool)>,
    allocated: u64,
    reserved: u64,
    estimated: u64,
}

impl Model {
    fn segment_of(&self, addr: u64) -> Option<(u64, &Segment)> {
        self.segments
            .range(..=addr)
            .next_back()
            .filter(|(base, s)| addr - **base < s.size)
            .map(|(b, s)| (*b, s))
    }

    /// Block size PyTorch gave a request at `addr`: the rounded request, or the whole free
    /// block when the rest would be too small to split off (`should_split`).
    fn alloc(&mut self, addr: u64, requested: u64) -> std::result::Result<u64, String> {
        if self.live.contains_key(&addr) {
            return Err(format!("alloc at 0x{addr:x}, which is already allocated"));
        }
        let Some((base, seg)) = self.segment_of(addr) else {
            return Err(format!("alloc at 0x{addr:x} lies in no segment"));
        };
        let seg_end = end_of(base, seg.size)?;
        let rounded = round_size(requested.max(1));
        if rounded > seg_end - addr {
            return Err(format!(
                "impossible size: alloc of {requested} bytes at 0x{addr:x} runs past its segment's end"
            ));
        }
        let small = seg.small;
        let size = match self.segments.get_mut(&base).and_then(|s| s.blocks.as_mut()) {
            Some(blocks) => {
                let free = blocks.get(&addr).copied().filter(|b| !b.active);
                match free {
                    Some(b) if b.size >= rounded => {
                        let rest = b.size - rounded;
                        let split = if small {
                            rest >= MIN_BLOCK_BYTES
                        } else {
                            rest > SMALL_SIZE_BYTES
                        };
                        let size = if split { rounded } else { b.size };
                        blocks.insert(addr, Block { size, active: true });
                        if split {
                            blocks.insert(
                                addr + size,
                                Block {
                                    size: rest,
                                    active: false,
                                },
                            );
                        }
                        size
                    }
                    _ => {
                        return Err(format!(
                            "alloc of {requested} bytes at 0x{addr:x} does not fit a free block of its segment"
                        ))
                    }
                }
            }
            None => {
                self.estimated += 1;
                rounded
            }
        };
        self.place_live(addr, size)?;
        Ok(size)
    }

    /// A live block of `size` at `addr`, which must not overlap another live block; counted
    /// as allocated (checked: a contradictory trace is refused, never wrapped).
    fn place_live(&mut self, addr: u64, size: u64) -> std::result::Result<(), String> {
        let end = end_of(addr, size)?;
        if let Some((&p, &(psize, _))) = self.live.range(..addr).next_back() {
            if p.saturating_add(psize) > addr {
                return Err(format!(
                    "impossible address: a block of {size} bytes at {} overlaps the live block of {psize} bytes at {}",
                    hex(addr),
                    hex(p)
                ));
            }
        }
        if let Some((&n, _)) = self.live.range(addr..).next() {
            if n < end {
                return Err(format!(
                    "impossible address: a block of {size} bytes at {} overlaps the live block at {}",
                    hex(addr),
                    hex(n)
                ));
            }
        }
        self.allocated = add(self.allocated, size, "allocated bytes")?;
        self.live.insert(addr, (size, true));
        Ok(())
    }

    /// `free_requested`: the block stops counting as allocated.
    fn free_requested(&mut self, addr: u64) -> Option<u64> {
        let entry = self.live.get_mut(&addr)?;
        if !entry.1 {
            return None;
        }
        entry.1 = false;
        // Never below zero: every live block's size was added when it was placed.
        self.allocated = self.allocated.saturating_sub(entry.0);
        Some(entry.0)
    }

    /// `free_completed`: the block goes back to its segment and merges with free neighbours.
    fn free_completed(&mut self, addr: u64) {
        if self.live.remove(&addr).is_none() {
            return;
        }
        let Some((base, _)) = self.segment_of(addr) else {
            return;
        };
        let Some(blocks) = self.segments.get_mut(&base).and_then(|s| s.blocks.as_mut()) else {
            return;
        };
        let Some(mut b) = blocks.remove(&addr) else {
            return;
        };
        b.active = false;
        let mut start = addr;
        let prev = blocks.range(..addr).next_back().map(|(&p, &pb)| (p, pb));
        if let Some((p, pb)) = prev {
            if !pb.active && p.checked_add(pb.size) == Some(addr) {
                blocks.remove(&p);
                start = p;
                b.size += pb.size;
            }
        }
        if let Some(next) = start.checked_add(b.size) {
            if let Some(&nb) = blocks.get(&next) {
                if !nb.active {
                    blocks.remove(&next);
                    b.size = b.size.saturating_add(nb.size);
                }
            }
        }
        blocks.insert(start, b);
    }
}

fn hex(a: u64) -> String {
    format!("0x{a:x}")
}

/// `a + b` of a replay counter; a trace whose sizes add past 2^64 contradicts itself.
fn add(a: u64, b: u64, what: &str) -> std::result::Result<u64, String> {
    a.checked_add(b).ok_or_else(|| {
        format!("impossible sizes: {what} add up past 2^64 bytes ({a} + {b}); the trace contradicts itself")
    })
}

/// Reserved bytes after adding `b`: within 2^64 (`add`) and within what any device holds
/// (`limits::MAX_BYTES`, 1 PiB), so a snapshot claiming exabytes of segments is refused
/// rather than reported.
fn reserve(a: u64, b: u64, what: &str) -> std::result::Result<u64, String> {
    let total = add(a, b, what)?;
    let max = crate::base::limits::MAX_BYTES;
    if total > max {
        return Err(format!(
            "impossible sizes: {what} reach {total} bytes, more than any GPU holds ({max} bytes, \
             1 PiB)"
        ));
    }
    Ok(total)
}

/// The end of `size` bytes at `addr`, which must lie below 2^64.
fn end_of(addr: u64, size: u64) -> std::result::Result<u64, String> {
    addr.checked_add(size).ok_or_else(|| {
        format!(
            "impossible address: {size} bytes at {} run past the end of the address space",
            hex(addr)
        )
    })
}

/// Op, tensor, category, layer and pass of an entry, from its top frames: the ones a
/// vramscope export wrote, or the innermost shown frame of a PyTorch stack.
struct Names {
    op: String,
    tensor: String,
    category: Category,
    layer: Option<u32>,
    pass: u32,
}

fn names(frames: &TopFrames, category: Option<&str>) -> Names {
    let cat = category
        .and_then(category_of)
        .unwrap_or(Category::Activation);
    match frames.0.first() {
        Some(f) if f.filename.starts_with(VRAMSCOPE_FRAME) => {
            let mut parts = f.filename[VRAMSCOPE_FRAME.len()..].splitn(2, '/');
            let category = parts.next().and_then(category_of).unwrap_or(cat);
            let op = parts.next().unwrap_or("").to_string();
            let pass = frames
                .0
                .get(1)
                .filter(|p| &*p.filename == super::PASS_FRAME)
                .map_or(0, |p| p.line.clamp(0, u32::MAX as i64) as u32);
            Names {
                op,
                tensor: String::from(&*f.name),
                category,
                layer: u32::try_from(f.line).ok(),
                pass,
            }
        }
        Some(f) => Names {
            op: String::from(&*f.name),
            tensor: format!("{}:{}", short_file(f), f.line),
            category: cat,
            layer: None,
            pass: 0,
        },
        None => Names {
            op: String::new(),
            tensor: String::new(),
            category: cat,
            layer: None,
            pass: 0,
        },
    }
}

/// The names of the last entry, by its stack and category: an alloc and its free share a
/// stack, and often come one after the other. The names are those of the event made from
/// it, which the caller pushes right after (`events[event]`).
#[derive(Default)]
struct LastNames {
    last: Option<(Rc<TopFrames>, Option<Rc<str>>)>,
    event: usize,
}

impl LastNames {
    fn of(&mut self, e: &RawEntry, events: &[Event]) -> Names {
        if let (Some((frames, category)), Some(made)) = (&self.last, events.get(self.event)) {
            if Rc::ptr_eq(frames, &e.frames) && *category == e.category {
                return Names {
                    op: made.op.clone(),
                    tensor: made.tensor.clone(),
                    category: made.category,
                    layer: made.layer,
                    pass: made.pass,
                };
            }
        }
        self.last = Some((e.frames.clone(), e.category.clone()));
        self.event = events.len();
        names(&e.frames, e.category.as_deref())
    }
}

fn short_file(f: &Frame) -> &str {
    f.filename.rsplit('/').next().unwrap_or(&f.filename)
}

fn category_of(label: &str) -> Option<Category> {
    Category::ALL.into_iter().find(|c| c.label() == label)
}

/// Replays one device's trace into vramscope's event log.
fn replay(
    device: u32,
    trace: &[&RawEntry],
    segments: &[&RawSegment],
    annotations: &[(u64, String)],
    expandable: bool,
) -> std::result::Result<DeviceTimeline, String> {
    // Exact end state, from `segments`.
    let mut end_blocks: HashMap<u64, u64> = HashMap::new();
    let mut final_allocated = 0u64;
    let mut final_reserved = 0u64;
    let mut by_address: Vec<(u64, u64)> = Vec::with_capacity(segments.len());
    for s in segments {
        if s.total_size == 0 || s.address.checked_add(s.total_size).is_none() {
            return Err(format!(
                "impossible segment at {} of {} bytes",
                hex(s.address),
                s.total_size
            ));
        }
        by_address.push((s.address, s.total_size));
    }
    // Two segments at one address, or overlapping, would be counted twice.
    by_address.sort_unstable();
    for w in by_address.windows(2) {
        let ((a, size), (b, _)) = (w[0], w[1]);
        if a == b {
            return Err(format!(
                "two segments at one address, {}, in 'segments'",
                hex(a)
            ));
        }
        if a + size > b {
            return Err(format!(
                "impossible address: segment {} of {size} bytes overlaps segment {} in 'segments'",
                hex(a),
                hex(b)
            ));
        }
    }
    for s in segments {
        final_reserved = reserve(final_reserved, s.total_size, "the segments' sizes")?;
        let mut addr = s.address;
        let mut covered = 0u64;
        for b in &s.blocks {
            let a = b.address.unwrap_or(addr);
            covered = covered.saturating_add(b.size);
            if a < s.address || covered > s.total_size {
                return Err(format!(
                    "impossible block: segment {} of {} bytes holds blocks past its end",
                    hex(s.address),
                    s.total_size
                ));
            }
            if &*b.state == "active_allocated" {
                final_allocated = add(final_allocated, b.size, "the segments' blocks")?;
                end_blocks.insert(a, b.size);
            }
            addr = end_of(a, b.size)?;
        }
        if let Some(declared) = s.allocated_size {
            let sum = s
                .blocks
                .iter()
                .filter(|b| &*b.state == "active_allocated")
                .try_fold(0u64, |t, b| add(t, b.size, "a segment's blocks"))?;
            if declared != sum {
                return Err(format!(
                    "segment {} says {declared} bytes allocated but its blocks hold {sum}",
                    hex(s.address)
                ));
            }
        }
    }

    // First pass: what existed before the first entry (a ring buffer that dropped old
    // entries): segments freed before being made, blocks freed before being allocated, and
    // blocks alive at the end that the trace never allocated.
    let mut seg_seen: HashSet<u64> = HashSet::new();
    let mut pre_segments: BTreeMap<u64, u64> = BTreeMap::new();
    let mut live: HashSet<u64> = HashSet::new();
    let mut freed_here: HashSet<u64> = HashSet::new();
    let mut pre_blocks: HashMap<u64, u64> = HashMap::new();
    for e in trace {
        let Some(addr) = e.addr else { continue };
        match &*e.action {
            "segment_alloc" | "segment_map" => {
                seg_seen.insert(addr);
            }
            // Freed before it was made: the segment predates the history.
            "segment_free" | "segment_unmap" if seg_seen.insert(addr) => {
                pre_segments.insert(addr, e.size);
            }
            "alloc" => {
                live.insert(addr);
                freed_here.remove(&addr);
            }
            // A free (request) of a block the history never allocated: it predates it. A
            // second free of a block the history freed is a double free, said by the replay.
            "free_requested" | "free_completed" if live.remove(&addr) => {
                freed_here.insert(addr);
            }
            "free_requested" if !freed_here.contains(&addr) => {
                pre_blocks.entry(addr).or_insert(round_size(e.size.max(1)));
            }
            _ => {}
        }
    }
    for s in segments {
        if !seg_seen.contains(&s.address) {
            pre_segments.insert(s.address, s.total_size);
        }
    }
    for (&a, &size) in &end_blocks {
        if !live.contains(&a) {
            pre_blocks.insert(a, size);
        }
    }
    // A free of an unknown block is only possible inside a segment that predates the trace.
    let mut model = Model::default();
    for (&base, &size) in &pre_segments {
        let end = end_of(base, size)?;
        if model.segment_of(base).is_some() || model.segments.range(base..end).next().is_some() {
            return Err(format!("segments overlap at {}", hex(base)));
        }
        model.segments.insert(
            base,
            Segment {
                size,
                small: size == SMALL_SEGMENT_BYTES,
                blocks: None,
            },
        );
        model.reserved = reserve(model.reserved, size, "reserved bytes")?;
    }
    for (&a, &size) in &pre_blocks {
        if model.segment_of(a).is_none_or(|(_, s)| s.blocks.is_some()) {
            return Err(format!(
                "free of unknown address {}: no alloc in the trace and no segment it could belong to",
                hex(a)
            ));
        }
        if let Some((base, seg)) = model.segment_of(a) {
            if end_of(a, size)? > end_of(base, seg.size)? {
                return Err(format!(
                    "impossible size: a block of {size} bytes at {} (freed in the trace) runs past its segment {} of {} bytes",
                    hex(a),
                    hex(base),
                    seg.size
                ));
            }
        }
        model.place_live(a, size)?;
    }

    let t0 = trace
        .iter()
        .filter_map(|e| e.time_us)
        .chain(annotations.iter().map(|a| a.0 as i64))
        .min()
        .unwrap_or(0);
    let rel = |t: Option<i64>| t.map_or(0, |t| t.saturating_sub(t0).max(0) as u64);
    let mut events: Vec<Event> = Vec::with_capacity(trace.len() + annotations.len() + 1);
    let push = |events: &mut Vec<Event>, kind, time_us, n: Names, bytes, addr, m: &Model| {
        events.push(Event {
            seq: events.len() as u64,
            time_us,
            pass: n.pass,
            kind,
            op: n.op,
            layer: n.layer,
            tensor: n.tensor,
            category: n.category,
            bytes,
            allocated: m.allocated,
            reserved: m.reserved,
            device_used: 0,
            process_used: 0,
            addr,
        });
    };
    let marker = |label: String| Names {
        op: label,
        tensor: String::new(),
        category: Category::NonFramework,
        layer: None,
        pass: 0,
    };
    let pre_count = pre_blocks.len() + pre_segments.len();
    if pre_count > 0 {
        let label = format!(
            "history starts here: {} segment(s) and {} block(s) existed before the first entry",
            pre_segments.len(),
            pre_blocks.len()
        );
        push(
            &mut events,
            EventKind::Marker,
            0,
            marker(label),
            0,
            None,
            &model,
        );
    }
    let mut peak_allocated = model.allocated;
    let mut peak_reserved = model.reserved;
    let mut ignored = 0u64;
    let mut ann = annotations.to_vec();
    ann.sort_by_key(|a| a.0);
    let mut ann = ann.into_iter().peekable();
    // Entry (index) of the last free of each address not allocated again since: a second
    // free of it is a double free, said as such.
    let mut freed: HashMap<u64, usize> = HashMap::new();
    let double_free = |addr: u64, i: usize, earlier: usize| {
        format!(
            "double free at {}: entry {i} frees a block that entry {earlier} already freed, with no alloc at that address between them",
            hex(addr)
        )
    };
    let mut last_names = LastNames::default();
    for (i, e) in trace.iter().enumerate() {
        let time = rel(e.time_us);
        while let Some((t, label)) = ann.next_if(|a| a.0.saturating_sub(t0 as u64) <= time) {
            push(
                &mut events,
                EventKind::Marker,
                t.saturating_sub(t0 as u64),
                marker(label),
                0,
                None,
                &model,
            );
        }
        let need_addr = || {
            e.addr
                .ok_or_else(|| format!("'{}' entry without 'addr'", e.action))
        };
        match &*e.action {
            "alloc" => {
                let addr = need_addr()?;
                let size = model.alloc(addr, e.size)?;
                freed.remove(&addr);
                let n = last_names.of(e, &events);
                push(
                    &mut events,
                    EventKind::Alloc,
                    time,
                    n,
                    size,
                    Some(addr),
                    &model,
                );
            }
            "free_requested" => {
                let addr = need_addr()?;
                let Some(size) = model.free_requested(addr) else {
                    return Err(match freed.get(&addr) {
                        Some(&earlier) => double_free(addr, i, earlier),
                        None => format!(
                            "free of unknown address {}: no alloc of it in the trace",
                            hex(addr)
                        ),
                    });
                };
                freed.insert(addr, i);
                let n = last_names.of(e, &events);
                push(
                    &mut events,
                    EventKind::Free,
                    time,
                    n,
                    size,
                    Some(addr),
                    &model,
                );
            }
            "free_completed" => {
                let addr = need_addr()?;
                match model.live.get(&addr) {
                    Some((_, false)) => model.free_completed(addr),
                    // A completion with no request before it: both at once.
                    Some((_, true)) => {
                        let size = model.free_requested(addr).unwrap_or(0);
                        freed.insert(addr, i);
                        model.free_completed(addr);
                        let n = last_names.of(e, &events);
                        push(
                            &mut events,
                            EventKind::Free,
                            time,
                            n,
                            size,
                            Some(addr),
                            &model,
                        );
                    }
                    None => {
                        return Err(match freed.get(&addr) {
                            Some(&earlier) => double_free(addr, i, earlier),
                            None => format!(
                                "free of unknown address {}: no alloc of it in the trace",
                                hex(addr)
                            ),
                        })
                    }
                }
            }
            "segment_alloc" | "segment_map" => {
                let addr = need_addr()?;
                if e.size == 0 || addr.checked_add(e.size).is_none() {
                    return Err(format!(
                        "impossible segment at {} of {} bytes",
                        hex(addr),
                        e.size
                    ));
                }
                let expandable_map = &*e.action == "segment_map" || expandable;
                // An expandable segment grows by maps at its end: extend it in place.
                let grown = model
                    .segments
                    .range(..addr)
                    .next_back()
                    .filter(|(b, s)| expandable_map && **b + s.size == addr)
                    .map(|(b, _)| *b);
                if let Some(b) = grown {
                    if model.segments.range(addr..addr + e.size).next().is_some() {
                        return Err(format!(
                            "impossible address: segment_map at {} of {} bytes overlaps a live segment",
                            hex(addr),
                            e.size
                        ));
                    }
                    if let Some(s) = model.segments.get_mut(&b) {
                        s.size = add(s.size, e.size, "an expandable segment's maps")?;
                        s.blocks = None;
                    }
                } else {
                    let overlaps = model.segment_of(addr).is_some()
                        || model.segments.range(addr..addr + e.size).next().is_some();
                    if overlaps {
                        return Err(format!(
                            "impossible address: segment at {} overlaps a live segment",
                            hex(addr)
                        ));
                    }
                    model.segments.insert(
                        addr,
                        Segment {
                            size: e.size,
                            small: e.size == SMALL_SEGMENT_BYTES,
                            blocks: (!expandable_map).then(|| {
                                BTreeMap::from([(
                                    addr,
                                    Block {
                                        size: e.size,
                                        active: false,
                                    },
                                )])
                            }),
                        },
                    );
                }
                model.reserved = reserve(model.reserved, e.size, "reserved bytes")?;
                let n = names(&e.frames, Some("non-framework"));
                push(
                    &mut events,
                    EventKind::SegmentMap,
                    time,
                    n,
                    e.size,
                    Some(addr),
                    &model,
                );
            }
            "segment_free" | "segment_unmap" => {
                let addr = need_addr()?;
                let Some((base, seg)) = model.segment_of(addr) else {
                    return Err(format!("segment_free of unknown segment {}", hex(addr)));
                };
                let seg_end = end_of(base, seg.size)?;
                if e.size == 0 || e.size > seg_end - addr {
                    return Err(format!(
                        "impossible size: {} of {} bytes at {} runs past its segment",
                        e.action,
                        e.size,
                        hex(addr)
                    ));
                }
                if model.live.range(addr..addr + e.size).next().is_some() {
                    return Err(format!(
                        "{} at {} while blocks in it are still allocated",
                        e.action,
                        hex(addr)
                    ));
                }
                let mut seg = model.segments.remove(&base).expect("found above");
                if base < addr {
                    // Unmapping the tail (or the middle) of an expandable segment.
                    seg.size = addr - base;
                    seg.blocks = None;
                    model.segments.insert(base, seg);
                }
                if addr + e.size < seg_end {
                    model.segments.insert(
                        addr + e.size,
                        Segment {
                            size: seg_end - addr - e.size,
                            small: false,
                            blocks: None,
                        },
                    );
                }
                model.reserved = model.reserved.checked_sub(e.size).ok_or_else(|| {
                    format!(
                        "impossible size: {} of {} bytes at {} frees more than is reserved ({} bytes)",
                        e.action,
                        e.size,
                        hex(addr),
                        model.reserved
                    )
                })?;
                let n = names(&e.frames, Some("non-framework"));
                push(
                    &mut events,
                    EventKind::SegmentUnmap,
                    time,
                    n,
                    e.size,
                    Some(addr),
                    &model,
                );
            }
            "oom" => {
                let label = format!(
                    "oom: {} bytes requested, {} free on the device",
                    e.size,
                    e.device_free.unwrap_or(0)
                );
                push(
                    &mut events,
                    EventKind::Marker,
                    time,
                    marker(label),
                    0,
                    None,
                    &model,
                );
            }
            "snapshot" => {
                let (kind, bytes, n) = vramscope_extra(e);
                push(&mut events, kind, time, n, bytes, None, &model);
            }
            _ => ignored += 1,
        }
        peak_allocated = peak_allocated.max(model.allocated);
        peak_reserved = peak_reserved.max(model.reserved);
    }
    for (t, label) in ann {
        let time = t.saturating_sub(t0 as u64);
        push(
            &mut events,
            EventKind::Marker,
            time,
            marker(label),
            0,
            None,
            &model,
        );
    }
    let last_time = events.last().map_or(0, |e| e.time_us);
    if trace.is_empty() && final_reserved > 0 {
        // No history recorded: the end state is all there is.
        model.allocated = final_allocated;
        model.reserved = final_reserved;
        peak_allocated = final_allocated;
        peak_reserved = final_reserved;
        let label = "end state only (no allocation history was recorded)".to_string();
        push(
            &mut events,
            EventKind::Marker,
            last_time,
            marker(label),
            0,
            None,
            &model,
        );
    }
    Ok(DeviceTimeline {
        device,
        entries: trace.len() as u64,
        events,
        peak_allocated,
        peak_reserved,
        final_allocated,
        final_reserved,
        replayed_allocated: model.allocated,
        replayed_reserved: model.reserved,
        blocks_before_history: pre_blocks.len() as u64,
        segments_before_history: pre_segments.len() as u64,
        estimated_block_sizes: model.estimated,
        ignored_entries: ignored,
    })
}

/// A `snapshot` entry: PyTorch's own mark of when the snapshot was taken, or, in a vramscope
/// export, a marker or an allocation outside the framework (which PyTorch's format has no
/// action for).
fn vramscope_extra(e: &RawEntry) -> (EventKind, u64, Names) {
    let n = names(&e.frames, Some("non-framework"));
    let what = e
        .frames
        .0
        .get(1)
        .filter(|f| &*f.filename == super::PASS_FRAME)
        .map(|f| &*f.name);
    let kind = match what {
        Some(super::OUTSIDE_ALLOC) => EventKind::OutsideAlloc,
        Some(super::OUTSIDE_FREE) => EventKind::OutsideFree,
        _ => EventKind::Marker,
    };
    let from_vramscope = what.is_some();
    let n = if from_vramscope {
        n
    } else {
        Names {
            op: "snapshot".into(),
            tensor: String::new(),
            category: Category::NonFramework,
            layer: None,
            pass: 0,
        }
    };
    let bytes = if kind == EventKind::Marker { 0 } else { e.size };
    (kind, bytes, n)
}

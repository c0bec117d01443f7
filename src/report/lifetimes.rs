//! Allocation lifetimes from the event log: every framework allocation as one band from its
//! alloc to its free, stacked as PyTorch's memory viewer stacks them (a band sits on the live
//! bands allocated before it and drops when one under it is freed). Which tensors outlive the
//! pass that made them, who owns the peak, and bytes made and freed per layer. Pure functions
//! of `Report.events`, shared by the app and the PNG report.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt};

use serde::{Deserialize, Serialize};

use crate::base::units::fmt_u;
use crate::memory::{Category, Event, EventKind};
use crate::profile::formulas::FormulaId;
use crate::profile::Report;

/// Live sets are kept every this many events (or a power of two more, see
/// `SNAPSHOT_BUDGET_IDS`), so the stack at any event is at most that many events of replay
/// away. Dense enough that a zoomed-out column (a few thousand events) starts from the
/// snapshot before its highest event instead of replaying all of its events.
const SNAPSHOT_MIN_EVERY: usize = 256;
/// Ids kept in all snapshots together, at most (64 MiB): runs with very many live tensors
/// get sparser snapshots.
const SNAPSHOT_BUDGET_IDS: usize = 16 << 20;
/// The framework total's maximum is kept per block of 8, 64 and 512 events, so a column
/// finds its highest event reading a few dozen maxima instead of every event (events are
/// large; reading one is a cache miss). Each size is a multiple of the one before.
const MAX_BLOCKS: [usize; 3] = [8, 64, 512];
const NONE: u32 = u32::MAX;

/// One framework allocation, from its alloc event to its free event.
#[derive(Clone, Debug, PartialEq)]
pub struct Lifetime {
    /// Index of the alloc event in `Report.events`.
    pub alloc_event: u32,
    /// Index of the free event; `None` while alive at the end of the log.
    pub free_event: Option<u32>,
    pub bytes: u64,
    pub category: Category,
    /// Pass of the alloc event (0: load or between passes).
    pub made_pass: u32,
    pub freed_pass: Option<u32>,
    /// Made in a profile pass and still alive after that pass ended (freed in a later pass,
    /// after the passes, or never).
    pub kept: bool,
}

/// A checkpoint or pass boundary by event index.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexSpan {
    pub label: String,
    pub start: usize,
    /// One past the last event.
    pub end: usize,
    /// A verify pass.
    pub verify: bool,
    /// One of vLLM's CUDA graph phases (the estimate in the profile, the capture after the
    /// KV cache): neither a profile nor a verify pass.
    pub graph: bool,
}

/// Every allocation's lifetime, in allocation order (which is also stack order).
#[derive(Clone, Debug, Default)]
pub struct Lifetimes {
    pub items: Vec<Lifetime>,
    /// Event index of each checkpoint t0..t3 (those present).
    pub checkpoints: Vec<(String, usize)>,
    /// Contiguous runs of events of one pass (profile and verify).
    pub passes: Vec<IndexSpan>,
    /// Profile passes asked for; higher pass numbers are verify passes.
    pub profile_passes: u32,
    /// Per event: the lifetime it allocates or frees (`NONE` for other events).
    event_life: Vec<u32>,
    /// Live lifetime ids (ascending) before event `k * snapshot_every`.
    snapshots: Vec<Vec<u32>>,
    snapshot_every: usize,
    /// Per block of each of `MAX_BLOCKS` events: the highest `allocated` and the (last)
    /// event holding it.
    block_max: [Vec<(u64, u32)>; 3],
}

/// A piece of one pixel column of the stack: one band, or neighbouring bands below a pixel
/// merged into one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StackSeg {
    pub y0: u64,
    pub y1: u64,
    pub category: Category,
    pub kept: bool,
    /// The one lifetime this piece is; `None` when small bands were merged.
    pub life: Option<u32>,
}

/// The stack drawn over events `start..end` (x), at the event of that range where the
/// framework held the most.
#[derive(Clone, Debug, PartialEq)]
pub struct StackColumn {
    pub start: usize,
    pub end: usize,
    pub segs: Vec<StackSeg>,
}

/// The outline of the kept state in one column: y-ranges of runs of kept pieces, bridging
/// gaps of other bands lower than `min_bytes` (a pixel), so the highlight is one outlined
/// shape rather than hundreds of thin outlined slivers.
pub fn kept_runs(segs: &[StackSeg], min_bytes: u64) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for s in segs.iter().filter(|s| s.kept) {
        match runs.last_mut() {
            Some(r) if s.y0.saturating_sub(r.1) < min_bytes.max(1) => r.1 = s.y1,
            _ => runs.push((s.y0, s.y1)),
        }
    }
    runs
}

/// One piece of the stack held over neighbouring columns (`x0..x1` in events): what is drawn
/// as one rectangle.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BandRect {
    pub x0: usize,
    pub x1: usize,
    pub seg: StackSeg,
}

/// A horizontal edge of the kept state's outline over events `x0..x1`, at `y` bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeptEdge {
    pub x0: usize,
    pub x1: usize,
    pub y: u64,
}

/// The stack as rectangles and the kept state's outline as edges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackRects {
    pub rects: Vec<BandRect>,
    pub edges: Vec<KeptEdge>,
}

/// The columns as rectangles: a piece that sits at the same height in the next column
/// continues as the same rectangle. Weights and other long-lived bands at the bottom of the
/// stack then cost one rectangle each instead of one per column, so a million allocations
/// draw as a few thousand rectangles; the pixels are the same as column by column.
pub fn band_rects(columns: &[StackColumn]) -> Vec<BandRect> {
    merged(columns, 1).rects
}

/// The outline of the kept state (`kept_runs` of every column) as edges, an edge at the
/// same height in the next column continuing the same line.
pub fn kept_edges(columns: &[StackColumn], min_bytes: u64) -> Vec<KeptEdge> {
    merged(columns, min_bytes).edges
}

fn merged(columns: &[StackColumn], min_bytes: u64) -> StackRects {
    let mut m = RectMerger::new(min_bytes);
    for c in columns {
        m.push(c.start, c.end, &c.segs);
    }
    m.out
}

/// Joins each column's pieces and kept edges to the previous column's at the same height.
struct RectMerger {
    out: StackRects,
    min_bytes: u64,
    /// Where the previous column ended (a column that does not touch it joins nothing).
    prev_end: Option<usize>,
    /// Indices in `out` of the previous column's rectangles and edges, bottom first.
    open_rects: Vec<usize>,
    open_edges: Vec<usize>,
    next: Vec<usize>,
}

impl RectMerger {
    fn new(min_bytes: u64) -> Self {
        RectMerger {
            out: StackRects::default(),
            min_bytes,
            prev_end: None,
            open_rects: Vec::new(),
            open_edges: Vec::new(),
            next: Vec::new(),
        }
    }

    fn push(&mut self, start: usize, end: usize, segs: &[StackSeg]) {
        let touching = self.prev_end == Some(start);
        self.prev_end = Some(end);
        // Both columns are sorted by height: walk the previous one alongside.
        self.next.clear();
        let mut j = 0;
        for s in segs {
            let rects = &mut self.out.rects;
            while touching && j < self.open_rects.len() && rects[self.open_rects[j]].seg.y0 < s.y0 {
                j += 1;
            }
            match self.open_rects.get(j) {
                Some(&k) if touching && rects[k].seg == *s => {
                    rects[k].x1 = end;
                    self.next.push(k);
                    j += 1;
                }
                _ => {
                    self.next.push(rects.len());
                    rects.push(BandRect {
                        x0: start,
                        x1: end,
                        seg: *s,
                    });
                }
            }
        }
        std::mem::swap(&mut self.open_rects, &mut self.next);

        self.next.clear();
        let mut j = 0;
        for (y0, y1) in kept_runs(segs, self.min_bytes) {
            for y in [y0, y1] {
                let edges = &mut self.out.edges;
                while touching && j < self.open_edges.len() && edges[self.open_edges[j]].y < y {
                    j += 1;
                }
                match self.open_edges.get(j) {
                    Some(&k) if touching && edges[k].y == y => {
                        edges[k].x1 = end;
                        self.next.push(k);
                        j += 1;
                    }
                    _ => {
                        self.next.push(edges.len());
                        edges.push(KeptEdge {
                            x0: start,
                            x1: end,
                            y,
                        });
                    }
                }
            }
        }
        std::mem::swap(&mut self.open_edges, &mut self.next);
    }
}

impl Lifetimes {
    /// Pairs every framework free with its alloc: the oldest live allocation of the same
    /// tensor name, category and size (first in, first out, so a tensor replaced by a
    /// newer one of the same name, as a CxB state is in the next pass, frees the older one).
    pub fn build(events: &[Event], profile_passes: u32) -> Lifetimes {
        let mut items: Vec<Lifetime> = Vec::new();
        let mut event_life = vec![NONE; events.len()];
        let mut open: HashMap<(&str, u64, Category), VecDeque<u32>> = HashMap::new();
        let mut checkpoints = Vec::new();
        let mut passes: Vec<IndexSpan> = Vec::new();
        // The pass of the last span: a span's label names its pass, so the label is made
        // once per span, not once per event.
        let mut span_pass = 0u32;
        // vLLM's CUDA graph phases (V1), between their markers: phases of their own.
        let mut graph_phase: Option<(&'static str, usize)> = None;
        // A multimodal model's encoder pass inside the profile pass (V1's `profile_run`
        // encodes its dummy images first): a span of its own between its markers.
        let mut in_encoder = false;
        for (i, e) in events.iter().enumerate() {
            match e.kind {
                EventKind::Alloc => {
                    let id = items.len() as u32;
                    items.push(Lifetime {
                        alloc_event: i as u32,
                        free_event: None,
                        bytes: e.bytes,
                        category: e.category,
                        made_pass: e.pass,
                        freed_pass: None,
                        kept: false,
                    });
                    open.entry((e.tensor.as_str(), e.bytes, e.category))
                        .or_default()
                        .push_back(id);
                    event_life[i] = id;
                }
                EventKind::Free => {
                    if let Some(id) = open
                        .get_mut(&(e.tensor.as_str(), e.bytes, e.category))
                        .and_then(|q| q.pop_front())
                    {
                        let l = &mut items[id as usize];
                        l.free_event = Some(i as u32);
                        l.freed_pass = Some(e.pass);
                        event_life[i] = id;
                    }
                }
                EventKind::Marker if matches!(e.tensor.as_str(), "t0" | "t1" | "t2" | "t3") => {
                    checkpoints.push((e.tensor.clone(), i));
                }
                EventKind::Marker if e.tensor == "mm encoder" => {
                    in_encoder = true;
                    passes.push(IndexSpan {
                        label: "encoder pass".into(),
                        start: i,
                        end: i + 1,
                        verify: false,
                        graph: false,
                    });
                    continue;
                }
                EventKind::Marker if e.tensor == "mm encoder end" => {
                    if let Some(p) = passes.last_mut().filter(|_| in_encoder) {
                        p.end = i + 1;
                    }
                    in_encoder = false;
                    // The profile pass goes on after it: a new span of the pass.
                    span_pass = 0;
                    continue;
                }
                EventKind::Marker
                    if matches!(
                        e.tensor.as_str(),
                        "cudagraph estimate" | "cudagraph capture"
                    ) =>
                {
                    let label = if e.tensor == "cudagraph estimate" {
                        GRAPH_ESTIMATE
                    } else {
                        GRAPH_CAPTURE
                    };
                    graph_phase = Some((label, i));
                }
                EventKind::Marker
                    if matches!(
                        e.tensor.as_str(),
                        "cudagraph estimate end" | "cudagraph capture end"
                    ) =>
                {
                    if let Some((label, start)) = graph_phase.take() {
                        passes.push(IndexSpan {
                            label: label.into(),
                            start,
                            end: i + 1,
                            verify: false,
                            graph: true,
                        });
                    }
                }
                _ => {}
            }
            if in_encoder {
                if let Some(p) = passes.last_mut() {
                    p.end = i + 1;
                }
                continue;
            }
            if e.pass > 0 {
                match passes.last_mut() {
                    Some(p) if p.end == i && span_pass == e.pass => p.end = i + 1,
                    _ => {
                        span_pass = e.pass;
                        passes.push(IndexSpan {
                            label: pass_label(e.pass, profile_passes),
                            start: i,
                            end: i + 1,
                            verify: e.pass > profile_passes,
                            graph: false,
                        })
                    }
                }
            }
        }
        for l in &mut items {
            let profile_made = (1..=profile_passes).contains(&l.made_pass);
            l.kept = profile_made && l.freed_pass != Some(l.made_pass);
        }
        let snapshot_every = snapshot_stride(&items, &event_life);
        let mut snapshots = Vec::with_capacity(events.len() / snapshot_every + 1);
        let mut live: Vec<u32> = Vec::new();
        for (i, &id) in event_life.iter().enumerate() {
            if i % snapshot_every == 0 {
                snapshots.push(live.clone());
            }
            apply(&items, &mut live, i, id);
        }
        // The smallest blocks from the events, each larger size from the one below (one pass
        // over the events, which are large; the last of equal maxima, as `max_by_key` keeps).
        let mut block_max: [Vec<(u64, u32)>; 3] = Default::default();
        block_max[0] = events
            .chunks(MAX_BLOCKS[0])
            .enumerate()
            .map(|(k, block)| {
                let (at, e) = block
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, e)| e.allocated)
                    .expect("chunks are not empty");
                (e.allocated, (k * MAX_BLOCKS[0] + at) as u32)
            })
            .collect();
        for l in 1..MAX_BLOCKS.len() {
            block_max[l] = block_max[l - 1]
                .chunks(MAX_BLOCKS[l] / MAX_BLOCKS[l - 1])
                .map(|c| {
                    *c.iter()
                        .max_by_key(|(v, _)| *v)
                        .expect("chunks are not empty")
                })
                .collect();
        }
        Lifetimes {
            items,
            checkpoints,
            passes,
            profile_passes,
            event_life,
            snapshots,
            snapshot_every,
            block_max,
        }
    }

    /// The event of `a..b` where the framework held the most (the last of equals).
    fn highest(&self, events: &[Event], a: usize, b: usize) -> usize {
        let mut best: Option<(u64, usize)> = None;
        let mut take = |v: u64, i: usize| {
            if best.is_none_or(|(bv, _)| v >= bv) {
                best = Some((v, i));
            }
        };
        let mut i = a;
        while i < b {
            // The largest block that starts here and ends inside the range, else one event.
            match (0..MAX_BLOCKS.len())
                .rev()
                .find(|&l| i.is_multiple_of(MAX_BLOCKS[l]) && i + MAX_BLOCKS[l] <= b)
            {
                Some(l) => {
                    let (v, at) = self.block_max[l][i / MAX_BLOCKS[l]];
                    take(v, at as usize);
                    i += MAX_BLOCKS[l];
                }
                None => {
                    take(events[i].allocated, i);
                    i += 1;
                }
            }
        }
        best.map_or(a, |(_, i)| i)
    }

    pub fn from_report(r: &Report) -> Lifetimes {
        let mut l = Lifetimes::build(&r.events, r.settings.passes);
        // Name verify passes after the budget they check.
        let verify_names: Vec<&str> = r
            .passes
            .iter()
            .filter_map(|p| p.verify_for.as_deref())
            .collect();
        for (k, p) in l.passes.iter_mut().filter(|p| p.verify).enumerate() {
            if let Some(f) = verify_names.get(k) {
                p.label = format!("verify {}", formula_short(f));
            }
        }
        l
    }

    pub fn checkpoint(&self, label: &str) -> Option<usize> {
        self.checkpoints
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, i)| *i)
    }

    /// Events of the profile part: from the start to just after t3 (verify passes follow).
    pub fn profile_end(&self, events: &[Event]) -> usize {
        self.checkpoint("t3")
            .map_or(events.len(), |i| (i + 1).min(events.len()))
    }

    /// The events of the verify passes: after the profile and the CUDA graph estimate, before
    /// the graph capture (which records far more events than the passes: on its axis they
    /// were squeezed into a few pixels). Empty without verify passes.
    pub fn verify_range(&self, events: &[Event]) -> (usize, usize) {
        let mut a = self.profile_end(events);
        let verify = self.passes.iter().filter(|p| p.verify);
        let (Some(first), Some(last)) = (
            verify.clone().map(|p| p.start).min(),
            verify.map(|p| p.end).max(),
        ) else {
            return (a, a);
        };
        let mut b = events.len();
        for g in self.passes.iter().filter(|p| p.graph) {
            if g.end <= first {
                a = a.max(g.end);
            }
            if g.start >= last {
                b = b.min(g.start);
            }
        }
        (a, b.max(a))
    }

    /// The CUDA graph phases (label, first event, one past the last).
    pub fn graph_phases(&self) -> impl Iterator<Item = &IndexSpan> {
        self.passes.iter().filter(|p| p.graph)
    }

    /// Live lifetime ids right after event `at`, bottom of the stack first.
    pub fn live_after(&self, at: usize) -> Vec<u32> {
        let mut live = Vec::new();
        if self.event_life.is_empty() {
            return live;
        }
        let at = at.min(self.event_life.len() - 1);
        let s = at / self.snapshot_every;
        live.clone_from(&self.snapshots[s]);
        for i in s * self.snapshot_every..=at {
            apply(&self.items, &mut live, i, self.event_life[i]);
        }
        live
    }

    /// The band under (event `at`, height `y` bytes), if any.
    pub fn band_at(&self, at: usize, y: f64) -> Option<u32> {
        if y < 0.0 {
            return None;
        }
        let mut acc = 0u64;
        for id in self.live_after(at) {
            let b = self.items[id as usize].bytes;
            if y < (acc + b) as f64 {
                return Some(id);
            }
            acc += b;
        }
        None
    }

    /// The stack over events `i0..i1` in at most `columns` columns; bands lower than
    /// `min_bytes` (a pixel) merge with their same-kind neighbours. Each column shows the
    /// stack at its event of the highest framework total, so no peak is lost.
    pub fn columns(
        &self,
        events: &[Event],
        i0: usize,
        i1: usize,
        columns: usize,
        min_bytes: u64,
    ) -> Vec<StackColumn> {
        let mut out: Vec<StackColumn> = Vec::with_capacity(columns);
        self.each_column(events, i0, i1, columns, min_bytes, |a, b, segs| {
            // Neighbouring columns that show the same stack are one wider column.
            match out.last_mut() {
                Some(prev) if prev.end == a && prev.segs == segs => prev.end = b,
                _ => out.push(StackColumn {
                    start: a,
                    end: b,
                    segs: segs.to_vec(),
                }),
            }
        });
        out
    }

    /// The same stack as `columns`, as rectangles and kept-outline edges (`band_rects`,
    /// `kept_edges`), made column by column without keeping the columns.
    pub fn stack_rects(
        &self,
        events: &[Event],
        i0: usize,
        i1: usize,
        columns: usize,
        min_bytes: u64,
    ) -> StackRects {
        let mut m = RectMerger::new(min_bytes);
        self.each_column(events, i0, i1, columns, min_bytes, |a, b, segs| {
            m.push(a, b, segs)
        });
        m.out
    }

    /// Calls `f(start, end, pieces)` for each column of `columns` left to right.
    fn each_column(
        &self,
        events: &[Event],
        i0: usize,
        i1: usize,
        columns: usize,
        min_bytes: u64,
        mut f: impl FnMut(usize, usize, &[StackSeg]),
    ) {
        let i1 = i1.min(events.len()).min(self.event_life.len());
        if i0 >= i1 {
            return;
        }
        let columns = columns.max(1);
        let per = ((i1 - i0) as f64 / columns as f64).max(1.0);
        let every = self.snapshot_every;
        let mut live: Vec<u32> = Vec::new();
        // The next event to replay into `live`; none replayed yet.
        let mut next = usize::MAX;
        // The previous column's live ids, pieces and each piece's first index.
        let mut prev: Vec<u32> = Vec::new();
        let mut segs: Vec<StackSeg> = Vec::new();
        let mut firsts: Vec<u32> = Vec::new();
        let mut c = 0usize;
        loop {
            let a = i0 + (c as f64 * per) as usize;
            if a >= i1 {
                break;
            }
            let b = (i0 + ((c + 1) as f64 * per) as usize).clamp(a + 1, i1);
            c += 1;
            let rep = self.highest(events, a, b);
            // Start from the snapshot before `rep` when it is ahead of the replay.
            let s = rep / every;
            if next == usize::MAX || next > rep + 1 || s * every > next {
                live.clone_from(&self.snapshots[s]);
                next = s * every;
            }
            while next <= rep {
                apply(&self.items, &mut live, next, self.event_life[next]);
                next += 1;
            }
            self.segments_after(&live, &prev, min_bytes, &mut segs, &mut firsts);
            prev.clone_from(&live);
            f(a, b, &segs);
        }
    }

    /// The pieces of the stack of `live` (ids bottom first).
    #[cfg(test)]
    fn segments(&self, live: &[u32], min_bytes: u64, segs: &mut Vec<StackSeg>) {
        segs.clear();
        let mut firsts = Vec::new();
        self.segments_from(live, 0, 0, min_bytes, segs, &mut firsts);
    }

    /// The pieces of `live`, given `segs`, the pieces of `prev` (`firsts`: each piece's first
    /// index in `prev`): the bottom of the stack seldom changes from one column to the next,
    /// so only the pieces from the first id where `live` and `prev` differ are made again.
    fn segments_after(
        &self,
        live: &[u32],
        prev: &[u32],
        min_bytes: u64,
        segs: &mut Vec<StackSeg>,
        firsts: &mut Vec<u32>,
    ) {
        // Compared 64 ids at a time (a slice comparison is a memcmp), then one by one.
        let n = live.len().min(prev.len());
        let whole = live[..n]
            .chunks(64)
            .zip(prev[..n].chunks(64))
            .take_while(|(a, b)| a == b)
            .count();
        let whole = (whole * 64).min(n);
        let same = whole
            + live[whole..n]
                .iter()
                .zip(&prev[whole..n])
                .take_while(|(a, b)| a == b)
                .count();
        if same == live.len() && same == prev.len() {
            return;
        }
        // The piece holding the first changed id is made again from its first id: whether an
        // id joins the piece below depends only on the pieces below it.
        let k = firsts
            .partition_point(|&f| (f as usize) < same)
            .saturating_sub(1);
        let (from, y) = match (firsts.get(k), segs.get(k)) {
            (Some(&f), Some(s)) => (f as usize, s.y0),
            _ => (0, 0),
        };
        segs.truncate(k);
        firsts.truncate(k);
        self.segments_from(live, from, y, min_bytes, segs, firsts);
    }

    /// Appends the pieces of `live[from..]`, which starts at height `y`.
    fn segments_from(
        &self,
        live: &[u32],
        from: usize,
        mut y: u64,
        min_bytes: u64,
        segs: &mut Vec<StackSeg>,
        firsts: &mut Vec<u32>,
    ) {
        for (i, &id) in live.iter().enumerate().skip(from) {
            let l = &self.items[id as usize];
            let y1 = y + l.bytes;
            let small = l.bytes < min_bytes;
            match segs.last_mut() {
                Some(s)
                    if small
                        && s.category == l.category
                        && s.kept == l.kept
                        && (s.life.is_none() || s.y1 - s.y0 < min_bytes) =>
                {
                    s.y1 = y1;
                    s.life = None;
                }
                _ => {
                    segs.push(StackSeg {
                        y0: y,
                        y1,
                        category: l.category,
                        kept: l.kept,
                        life: Some(id),
                    });
                    firsts.push(i as u32);
                }
            }
            y = y1;
        }
    }

    /// The tensors that outlive their pass, grouped by what they are: the bytes of them still
    /// alive at t3 (what the old formula sees twice), and how many were made.
    pub fn kept_groups(&self, events: &[Event]) -> Vec<KeptGroup> {
        let t3 = self.checkpoint("t3").unwrap_or(events.len());
        let mut groups: Vec<KeptGroup> = Vec::new();
        for l in self.items.iter().filter(|l| l.kept) {
            let name = &events[l.alloc_event as usize].tensor;
            let what = kept_name(l.category, name);
            let alive_at_t3 =
                (l.alloc_event as usize) < t3 && l.free_event.is_none_or(|f| f as usize > t3);
            let g = match groups.iter_mut().find(|g| g.what == what) {
                Some(g) => g,
                None => {
                    groups.push(KeptGroup {
                        what,
                        category: l.category,
                        count: 0,
                        bytes_made: 0,
                        bytes_at_t3: 0,
                    });
                    groups.last_mut().expect("just pushed")
                }
            };
            g.count += 1;
            g.bytes_made += l.bytes;
            if alive_at_t3 {
                g.bytes_at_t3 += l.bytes;
            }
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.bytes_at_t3));
        groups
    }
}

/// How often to keep the live set: every `SNAPSHOT_MIN_EVERY` events, or a power of two more
/// where that would keep more than `SNAPSHOT_BUDGET_IDS` ids.
fn snapshot_stride(items: &[Lifetime], event_life: &[u32]) -> usize {
    // Live counts at each candidate snapshot (a count needs no replay of the live set).
    let mut samples: Vec<usize> = Vec::with_capacity(event_life.len() / SNAPSHOT_MIN_EVERY + 1);
    let mut count = 0usize;
    for (i, &id) in event_life.iter().enumerate() {
        if i % SNAPSHOT_MIN_EVERY == 0 {
            samples.push(count);
        }
        if id != NONE {
            if items[id as usize].alloc_event as usize == i {
                count += 1;
            } else {
                count = count.saturating_sub(1);
            }
        }
    }
    let mut step = 1usize;
    while step < samples.len() && samples.iter().step_by(step).sum::<usize>() > SNAPSHOT_BUDGET_IDS
    {
        step *= 2;
    }
    SNAPSHOT_MIN_EVERY * step
}

fn apply(items: &[Lifetime], live: &mut Vec<u32>, event: usize, id: u32) {
    if id == NONE {
        return;
    }
    let l = &items[id as usize];
    if l.alloc_event as usize == event {
        // Ids grow with allocation order: a new band goes on top.
        live.push(id);
        return;
    }
    // Most frees are of something allocated a moment ago, near the top.
    let top = live.len().saturating_sub(8);
    let at = match live[top..].iter().rposition(|&x| x == id) {
        Some(p) => Some(top + p),
        None => live[..top].binary_search(&id).ok(),
    };
    if let Some(p) = at {
        live.remove(p);
    }
}

/// The labels of vLLM's CUDA graph phases in the views.
pub const GRAPH_ESTIMATE: &str = "CUDA graph estimate";
pub const GRAPH_CAPTURE: &str = "CUDA graph capture";

fn pass_label(pass: u32, profile_passes: u32) -> String {
    if pass > profile_passes {
        format!("verify {}", pass - profile_passes)
    } else {
        format!("pass {pass}")
    }
}

/// `pr9352` → `#9352 old`; other names as they are.
pub fn formula_short(key: &str) -> &str {
    FormulaId::ALL
        .iter()
        .find(|f| f.key() == key)
        .map_or(key, |f| f.short())
}

/// What a kept tensor is, in the field's words: "int8 state (CxB)" for bitsandbytes' CxB.
fn kept_name(c: Category, tensor: &str) -> String {
    let suffix = tensor.rsplit('.').next().unwrap_or(tensor);
    match c {
        Category::QuantState if suffix == "CxB" || suffix == "subB" => {
            format!("int8 state ({suffix})")
        }
        // "sampler triton_buffer (cached)": a suffix with its own brackets is not bracketed
        // again.
        _ if suffix != tensor && suffix.contains('(') => format!("{} {suffix}", c.label()),
        _ if suffix != tensor => format!("{} ({suffix})", c.label()),
        _ => c.label().to_string(),
    }
}

/// Tensors of one kind that outlive the pass that made them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeptGroup {
    pub what: String,
    pub category: Category,
    pub count: usize,
    pub bytes_made: u64,
    /// Of them, alive at t3: inside both Â and the free-memory drop #9352 reads.
    pub bytes_at_t3: u64,
}

/// The sentence the lifetime view and the PNG put beside the highlighted bands, from the
/// numbers: "int8 state (CxB) kept across passes: 6.50 GiB — counted twice by #9352".
pub fn kept_headline(r: &Report, groups: &[KeptGroup]) -> Option<String> {
    let g = groups.first().filter(|g| g.bytes_made > 0)?;
    let shown = if g.bytes_at_t3 > 0 {
        g.bytes_at_t3
    } else {
        g.bytes_made
    };
    let mut s = format!("{} kept across passes: {}", g.what, fmt_u(shown));
    // #9352's non-torch term is the free-memory drop over the pass, which holds every
    // framework byte alive at t3 that was not there at t1.
    let old = r.formula(FormulaId::Pr9352);
    if g.bytes_at_t3 > 0 && old.is_some_and(|f| f.non_torch_bytes as u64 >= g.bytes_at_t3) {
        s += " — counted twice by #9352";
    }
    Some(s)
}

/// One tensor alive at a peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakTensor {
    pub tensor: String,
    pub category: Category,
    pub bytes: u64,
    /// The op and layer that made it.
    pub op: String,
    pub layer: Option<u32>,
    pub made_pass: u32,
    pub kept: bool,
}

/// Who holds the memory at one instant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakOwners {
    /// Which peak: "framework peak (Â)" or "process peak (truth)".
    pub what: String,
    pub event: usize,
    /// Framework allocated at that event.
    pub allocated: u64,
    /// This process's device memory at that event.
    pub process_used: u64,
    /// Live framework bytes per category, largest first.
    pub by_category: Vec<(Category, u64)>,
    /// The ten largest live tensors.
    pub top: Vec<PeakTensor>,
}

/// Bytes made and freed in one layer of one pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerRollup {
    pub pass: u32,
    /// `None`: outside any layer (embedding, final norm, logits, sampler).
    pub layer: Option<u32>,
    pub made_bytes: u64,
    pub freed_bytes: u64,
}

/// Everything "who owns the peak" shows, in the app, the CSV summary and the JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakReport {
    pub framework: Option<PeakOwners>,
    pub process: Option<PeakOwners>,
    pub layers: Vec<LayerRollup>,
}

impl Lifetimes {
    /// The owners at event `at`.
    pub fn owners_at(&self, events: &[Event], at: usize, what: &str) -> PeakOwners {
        let live = self.live_after(at);
        let mut by_cat: Vec<(Category, u64)> = Vec::new();
        for &id in &live {
            let l = &self.items[id as usize];
            match by_cat.iter_mut().find(|(c, _)| *c == l.category) {
                Some((_, b)) => *b += l.bytes,
                None => by_cat.push((l.category, l.bytes)),
            }
        }
        by_cat.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut ids = live;
        ids.sort_by(|a, b| {
            self.items[*b as usize]
                .bytes
                .cmp(&self.items[*a as usize].bytes)
                .then(a.cmp(b))
        });
        let top = ids
            .iter()
            .take(10)
            .map(|&id| {
                let l = &self.items[id as usize];
                let e = &events[l.alloc_event as usize];
                PeakTensor {
                    tensor: e.tensor.clone(),
                    category: l.category,
                    bytes: l.bytes,
                    op: e.op.clone(),
                    layer: e.layer,
                    made_pass: l.made_pass,
                    kept: l.kept,
                }
            })
            .collect();
        PeakOwners {
            what: what.to_string(),
            event: at,
            allocated: events[at].allocated,
            process_used: events[at].process_used,
            by_category: by_cat,
            top,
        }
    }

    /// Owners at the framework peak and at the process peak of the profile passes (t1..t2),
    /// and the per-layer rollup of the profile passes.
    pub fn peak_report(&self, events: &[Event]) -> PeakReport {
        let from = self.checkpoint("t1").unwrap_or(0);
        let to = self
            .checkpoint("t2")
            .unwrap_or(events.len())
            .min(events.len());
        let peak_of = |f: fn(&Event) -> u64| {
            // The first event at the highest value: where the peak was reached.
            (from..to).rev().max_by_key(|&i| f(&events[i]))
        };
        let framework =
            peak_of(|e| e.allocated).map(|i| self.owners_at(events, i, "framework peak (Â)"));
        let process =
            peak_of(|e| e.process_used).map(|i| self.owners_at(events, i, "process peak (truth)"));
        // Sums per run of events of one layer (a layer's events come together), sorted by
        // pass and layer, then the runs of one layer merged: no lookup per event.
        let mut runs: Vec<LayerRollup> = Vec::new();
        for e in events {
            if e.pass == 0 || e.pass > self.profile_passes {
                continue;
            }
            let (made, freed) = match e.kind {
                EventKind::Alloc => (e.bytes, 0),
                EventKind::Free => (0, e.bytes),
                _ => continue,
            };
            match runs.last_mut() {
                Some(r) if r.pass == e.pass && r.layer == e.layer => {
                    r.made_bytes += made;
                    r.freed_bytes += freed;
                }
                _ => runs.push(LayerRollup {
                    pass: e.pass,
                    layer: e.layer,
                    made_bytes: made,
                    freed_bytes: freed,
                }),
            }
        }
        runs.sort_by_key(|l| (l.pass, l.layer.map_or(u64::MAX, u64::from)));
        let mut layers: Vec<LayerRollup> = Vec::with_capacity(runs.len());
        for r in runs {
            match layers.last_mut() {
                Some(l) if l.pass == r.pass && l.layer == r.layer => {
                    l.made_bytes += r.made_bytes;
                    l.freed_bytes += r.freed_bytes;
                }
                _ => layers.push(r),
            }
        }
        PeakReport {
            framework,
            process,
            layers,
        }
    }
}

/// A horizontal reference line of the lifetime view.
#[derive(Clone, Debug, PartialEq)]
pub struct RefLine {
    pub label: String,
    pub bytes: i64,
    pub colour: crate::report::palette::Rgb,
}

/// Everything the lifetime view and the PNG report derive from one report, made once.
#[derive(Clone, Debug)]
pub struct Analysis {
    pub lifetimes: Lifetimes,
    pub kept: Vec<KeptGroup>,
    pub headline: Option<String>,
    pub peaks: PeakReport,
    /// Â, Â + old non-torch, Â + new non-torch, the truth, T·u.
    pub lines: Vec<RefLine>,
    /// Highest framework total in the profile part (t0..t3), for the y-axis.
    pub profile_top: u64,
    /// Highest framework total in the verify passes.
    pub verify_top: u64,
}

impl Analysis {
    pub fn of(r: &Report) -> Analysis {
        let lifetimes = Lifetimes::from_report(r);
        let kept = lifetimes.kept_groups(&r.events);
        let headline = kept_headline(r, &kept);
        let peaks = lifetimes.peak_report(&r.events);
        let end = lifetimes.profile_end(&r.events);
        let top = |evs: &[Event]| evs.iter().map(|e| e.allocated).max().unwrap_or(0);
        Analysis {
            profile_top: top(&r.events[..end]),
            verify_top: top(&r.events[end..]),
            lines: ref_lines(r),
            lifetimes,
            kept,
            headline,
            peaks,
        }
    }
}

/// The lifetime view's horizontal lines, from the report's numbers.
pub fn ref_lines(r: &Report) -> Vec<RefLine> {
    use crate::report::palette;
    let mut v = vec![RefLine {
        label: "Â (framework peak)".into(),
        bytes: r.checkpoints.t3.allocated_peak as i64,
        colour: palette::PEAK,
    }];
    for (id, what) in [
        (FormulaId::Pr9352, "Â + old non-torch (#9352)"),
        (FormulaId::Pr9516, "Â + new non-torch (#9516)"),
    ] {
        if let Some(f) = r.formula(id) {
            v.push(RefLine {
                label: what.into(),
                bytes: f.non_kv_bytes,
                colour: palette::formula(id),
            });
        }
    }
    v.push(RefLine {
        label: "truth (process peak)".into(),
        bytes: r.truth.non_kv_bytes,
        colour: palette::TRUTH,
    });
    v.push(RefLine {
        label: "T·u".into(),
        bytes: crate::profile::formulas::budget(r.checkpoints.t0.total, r.settings.util, false),
        colour: palette::BUDGET,
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u64, pass: u32, kind: EventKind, cat: Category, tensor: &str, bytes: u64) -> Event {
        Event {
            tensor: tensor.into(),
            ..Event::test(i, i, pass, kind, cat, bytes)
        }
    }

    /// Weights at load; pass 1 makes an activation (freed in the pass) and a CxB state (kept);
    /// pass 2 makes a new CxB of the same name and frees the old one; the new one is alive at t3.
    fn two_passes() -> Vec<Event> {
        use Category::*;
        use EventKind::*;
        let mut v = vec![
            ev(0, 0, Alloc, Weight, "w", 100),
            ev(0, 0, Marker, NonFramework, "t1", 0),
            ev(0, 1, Alloc, Activation, "h", 30),
            ev(0, 1, Alloc, QuantState, "l0.CxB", 10),
            ev(0, 1, Free, Activation, "h", 30),
            ev(0, 2, Alloc, Activation, "h", 30),
            ev(0, 2, Alloc, QuantState, "l0.CxB", 10),
            ev(0, 2, Free, QuantState, "l0.CxB", 10),
            ev(0, 2, Free, Activation, "h", 30),
            ev(0, 0, Marker, NonFramework, "t2", 0),
            ev(0, 0, Marker, NonFramework, "t3", 0),
        ];
        let mut alloc = 0i64;
        for (i, e) in v.iter_mut().enumerate() {
            e.seq = i as u64;
            match e.kind {
                Alloc => alloc += e.bytes as i64,
                Free => alloc -= e.bytes as i64,
                _ => {}
            }
            e.allocated = alloc as u64;
            e.process_used = alloc as u64 + 5;
        }
        v
    }

    #[test]
    fn a_state_freed_in_the_next_pass_and_one_alive_at_t3_are_kept_activations_are_not() {
        let ev = two_passes();
        let l = Lifetimes::build(&ev, 2);
        assert_eq!(l.items.len(), 5);
        let kept: Vec<(usize, bool)> = l
            .items
            .iter()
            .map(|l| (l.alloc_event as usize, l.kept))
            .collect();
        assert_eq!(
            kept,
            vec![(0, false), (2, false), (3, true), (5, false), (6, true)]
        );
        // First in, first out: pass 2's free of l0.CxB frees pass 1's state.
        assert_eq!(l.items[2].free_event, Some(7));
        assert_eq!(l.items[2].freed_pass, Some(2));
        assert_eq!(l.items[4].free_event, None);
        let groups = l.kept_groups(&ev);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].what, "int8 state (CxB)");
        assert_eq!(
            (groups[0].count, groups[0].bytes_made, groups[0].bytes_at_t3),
            (2, 20, 10)
        );
        assert_eq!(l.passes.len(), 2);
        assert_eq!((l.passes[0].start, l.passes[0].end), (2, 5));
        assert_eq!(l.checkpoint("t3"), Some(10));
    }

    #[test]
    fn the_stack_drops_bands_when_one_below_is_freed_and_clicks_find_the_band() {
        let ev = two_passes();
        let l = Lifetimes::build(&ev, 2);
        // After event 4 (h freed): w at 0..100, CxB of pass 1 at 100..110.
        let cols = l.columns(&ev, 4, 5, 1, 0);
        let ys: Vec<(u64, u64)> = cols[0].segs.iter().map(|s| (s.y0, s.y1)).collect();
        assert_eq!(ys, vec![(0, 100), (100, 110)]);
        assert_eq!(l.band_at(4, 105.0), Some(2));
        assert_eq!(l.band_at(4, 111.0), None);
        // Event 6: w, CxB(1), h(2), CxB(2) stacked in allocation order.
        assert_eq!(l.live_after(6), vec![0, 2, 3, 4]);
        assert_eq!(l.band_at(6, 139.0), Some(3));
        assert_eq!(l.band_at(6, 145.0), Some(4));
        // One column over everything: it shows the stack at the highest total (event 6: 150).
        let all = l.columns(&ev, 0, ev.len(), 1, 0);
        assert_eq!(all[0].segs.last().unwrap().y1, 150);
        // The kept state's outline bridges the 30-byte activation between the two states
        // only when it is under a pixel.
        assert_eq!(
            kept_runs(&l.columns(&ev, 6, 7, 1, 0)[0].segs, 1),
            vec![(100, 110), (140, 150)]
        );
        assert_eq!(
            kept_runs(&l.columns(&ev, 6, 7, 1, 31)[0].segs, 31),
            vec![(100, 150)]
        );
        // Bands under a pixel merge with neighbours of the same kind.
        let merged = l.columns(&ev, 6, 7, 1, 50);
        assert_eq!(merged[0].segs.len(), 4, "different kinds never merge");
    }

    #[test]
    fn a_band_at_the_same_height_in_neighbouring_columns_is_one_rectangle() {
        let ev = two_passes();
        let l = Lifetimes::build(&ev, 2);
        let cols = l.columns(&ev, 0, ev.len(), ev.len(), 0);
        let rects = band_rects(&cols);
        // Column by column, the rectangles cover exactly what the columns do.
        for c in &cols {
            for x in c.start..c.end {
                let mut here: Vec<StackSeg> = rects
                    .iter()
                    .filter(|r| (r.x0..r.x1).contains(&x))
                    .map(|r| r.seg)
                    .collect();
                here.sort_by_key(|s| s.y0);
                assert_eq!(here, c.segs, "event {x}");
            }
        }
        // The weight `w` sits at 0..100 from its alloc to the end: one rectangle.
        let w: Vec<&BandRect> = rects.iter().filter(|r| r.seg.life == Some(0)).collect();
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].x0, w[0].x1), (cols[0].start, ev.len()));
        assert!(rects.len() < cols.iter().map(|c| c.segs.len()).sum::<usize>());

        // The kept outline: the pass-1 CxB state's bottom edge lies at 100 from the free of
        // `h` under it (event 4) until the pass-2 `h` takes that place (event 7), then the
        // pass-2 state's from event 8 on: two edges, not one per column.
        let edges = kept_edges(&cols, 1);
        let at_100: Vec<(usize, usize)> = edges
            .iter()
            .filter(|e| e.y == 100)
            .map(|e| (e.x0, e.x1))
            .collect();
        assert_eq!(at_100, vec![(4, 7), (8, ev.len())], "{edges:?}");
        // Made straight from the events, without keeping the columns: the same.
        let direct = l.stack_rects(&ev, 0, ev.len(), ev.len(), 1);
        assert_eq!((direct.rects, direct.edges), (rects.clone(), edges.clone()));
        for c in &cols {
            for (y0, y1) in kept_runs(&c.segs, 1) {
                for y in [y0, y1] {
                    assert!(
                        edges
                            .iter()
                            .any(|e| e.y == y && e.x0 <= c.start && c.end <= e.x1),
                        "edge {y} over {}..{}",
                        c.start,
                        c.end
                    );
                }
            }
        }
    }

    /// Columns from snapshots and per-block maxima are the columns of a plain sweep: each
    /// shows the live set after its highest event (the last of equals).
    #[test]
    fn columns_match_a_plain_sweep_at_every_zoom() {
        let mut rng = 12345u64;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            rng >> 33
        };
        // Two kinds, so merging below a pixel stops at kind boundaries.
        let cat = |name: &str| {
            if name.len().is_multiple_of(2) {
                Category::Activation
            } else {
                Category::Workspace
            }
        };
        let mut v: Vec<Event> = Vec::new();
        let mut live: Vec<(String, u64)> = Vec::new();
        let mut allocated = 0u64;
        for i in 0..20_000u64 {
            let free = !live.is_empty() && next() % 5 < 2;
            let e = if free {
                let (name, bytes) = live.remove(next() as usize % live.len());
                allocated -= bytes;
                ev(i, 1, EventKind::Free, cat(&name), &name, bytes)
            } else {
                let bytes = 1 + next() % 1000;
                let name = format!("t{}", next() % 50);
                live.push((name.clone(), bytes));
                allocated += bytes;
                ev(i, 1, EventKind::Alloc, cat(&name), &name, bytes)
            };
            v.push(Event { allocated, ..e });
        }
        let l = Lifetimes::build(&v, 1);
        // The sweep: live ids after each event.
        let mut sweep: Vec<Vec<u32>> = Vec::new();
        let mut ids: Vec<u32> = Vec::new();
        for i in 0..v.len() {
            apply(&l.items, &mut ids, i, l.event_life[i]);
            sweep.push(ids.clone());
        }
        for (i0, i1, cols, px) in [
            (0, v.len(), 97, 1),
            (0, v.len(), 1000, 300),
            (3_333, 9_000, 50, 5_000),
            (0, v.len(), 20_000, 700),
        ] {
            let mut want_segs = Vec::new();
            let mut seen = 0;
            l.each_column(&v, i0, i1, cols, px, |a, b, segs| {
                let rep = (a..b).max_by_key(|&i| v[i].allocated).unwrap();
                l.segments(&sweep[rep], px, &mut want_segs);
                assert_eq!(segs, want_segs.as_slice(), "column {a}..{b}");
                seen += 1;
            });
            assert!(seen >= cols.min(i1 - i0) * 9 / 10, "{seen} columns");
        }
    }

    #[test]
    fn many_small_bands_of_one_kind_merge_into_one_piece() {
        let mut v: Vec<Event> = (0..10_000u64)
            .map(|i| {
                ev(
                    i,
                    0,
                    EventKind::Alloc,
                    Category::Weight,
                    &format!("w{i}"),
                    7,
                )
            })
            .collect();
        for (i, e) in v.iter_mut().enumerate() {
            e.allocated = 7 * (i as u64 + 1);
        }
        let l = Lifetimes::build(&v, 1);
        let cols = l.columns(&v, 0, v.len(), 100, 1000);
        assert!(cols.len() <= 100);
        let last = cols.last().unwrap();
        assert_eq!(last.segs.len(), 1);
        assert_eq!((last.segs[0].y1, last.segs[0].life), (70_000, None));
        // Far from a snapshot boundary, the replayed live set is the same as a sweep.
        assert_eq!(l.live_after(9_999).len(), 10_000);
        assert_eq!(l.live_after(4_100).len(), 4_101);
    }

    #[test]
    fn peak_owners_name_the_largest_tensors_and_layers_add_up() {
        let ev = two_passes();
        let l = Lifetimes::build(&ev, 2);
        let p = l.peak_report(&ev);
        let f = p.framework.unwrap();
        assert_eq!(f.event, 6);
        assert_eq!(f.allocated, 150);
        assert_eq!(
            f.by_category,
            vec![
                (Category::Weight, 100),
                (Category::Activation, 30),
                (Category::QuantState, 20)
            ]
        );
        assert_eq!(f.top[0].tensor, "w");
        assert_eq!(f.top[1].tensor, "h");
        assert_eq!(f.top.len(), 4);
        let made: u64 = p.layers.iter().map(|r| r.made_bytes).sum();
        let freed: u64 = p.layers.iter().map(|r| r.freed_bytes).sum();
        assert_eq!((made, freed), (80, 70));
        assert_eq!(p.layers.len(), 2, "one row per pass (no layers here)");
    }
}

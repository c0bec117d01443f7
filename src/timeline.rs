//! Timeline series for plotting, reduced to what a pixel column can show: for each column the
//! minimum and maximum of the value over the events that fall in it, so a million events plot
//! as a few thousand points without losing a spike.

use crate::memory::Event;

/// Which running total to plot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Series {
    Allocated,
    Reserved,
    DeviceUsed,
    ProcessUsed,
    /// Process memory outside the framework allocator (process_used − reserved).
    NonFramework,
}

impl Series {
    pub fn value(self, e: &Event) -> u64 {
        match self {
            Series::Allocated => e.allocated,
            Series::Reserved => e.reserved,
            Series::DeviceUsed => e.device_used,
            Series::ProcessUsed => e.process_used,
            Series::NonFramework => e.process_used.saturating_sub(e.reserved),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Series::Allocated => "allocated (framework)",
            Series::Reserved => "reserved (framework)",
            Series::DeviceUsed => "device used",
            Series::ProcessUsed => "this process",
            Series::NonFramework => "non-framework",
        }
    }
}

/// Index of the first event at or after `time_us` (events are in time order).
pub fn first_at(events: &[Event], time_us: u64) -> usize {
    events.partition_point(|e| e.time_us < time_us)
}

/// Step-plot points (x = seconds, y = bytes) of `series` between `t_from_us` and `t_to_us`,
/// reduced to at most ~4 points per column: each column keeps its first value, min, max and
/// last value in time order, so the step shape and every spike survive.
pub fn reduce(
    events: &[Event],
    series: Series,
    t_from_us: u64,
    t_to_us: u64,
    columns: usize,
) -> Vec<[f64; 2]> {
    let columns = columns.max(1);
    let lo = first_at(events, t_from_us).saturating_sub(1);
    let hi = first_at(events, t_to_us.saturating_add(1)).min(events.len());
    let slice = &events[lo..hi];
    if slice.len() <= columns * 4 {
        return slice
            .iter()
            .map(|e| [e.time_us as f64 * 1e-6, series.value(e) as f64])
            .collect();
    }
    let span = (t_to_us.saturating_sub(t_from_us)).max(1) as f64;
    let mut out = Vec::with_capacity(columns * 4);
    let mut i = 0;
    while i < slice.len() {
        let col = (((slice[i].time_us.saturating_sub(t_from_us)) as f64 / span) * columns as f64)
            .floor() as i64;
        let start = i;
        let (mut min_i, mut max_i) = (i, i);
        while i < slice.len() {
            let c = (((slice[i].time_us.saturating_sub(t_from_us)) as f64 / span) * columns as f64)
                .floor() as i64;
            if c != col {
                break;
            }
            let v = series.value(&slice[i]);
            if v < series.value(&slice[min_i]) {
                min_i = i;
            }
            if v > series.value(&slice[max_i]) {
                max_i = i;
            }
            i += 1;
        }
        let mut picks = [start, min_i, max_i, i - 1];
        picks.sort_unstable();
        let mut last = usize::MAX;
        for p in picks {
            if p != last {
                out.push([
                    slice[p].time_us as f64 * 1e-6,
                    series.value(&slice[p]) as f64,
                ]);
                last = p;
            }
        }
    }
    out
}

/// Like `reduce`, with event index as x: each pixel column keeps its first,
/// minimum, maximum and last value, so the step shape and every spike survive.
pub fn reduce_by_index(
    events: &[Event],
    series: Series,
    i0: usize,
    i1: usize,
    columns: usize,
) -> Vec<[f64; 2]> {
    let i1 = i1.min(events.len());
    let point = |i: usize| [i as f64, series.value(&events[i]) as f64];
    if i0 >= i1 {
        return Vec::new();
    }
    let columns = columns.max(1);
    if i1 - i0 <= columns * 4 {
        return (i0..i1).map(point).collect();
    }
    let per = (i1 - i0) as f64 / columns as f64;
    let mut out = Vec::with_capacity(columns * 4);
    for c in 0..columns {
        let a = i0 + (c as f64 * per) as usize;
        let b = (i0 + ((c + 1) as f64 * per) as usize).min(i1);
        if a >= b {
            continue;
        }
        let (mut lo, mut hi) = (a, a);
        for i in a..b {
            let v = series.value(&events[i]);
            if v < series.value(&events[lo]) {
                lo = i;
            }
            if v > series.value(&events[hi]) {
                hi = i;
            }
        }
        let mut picks = [a, lo, hi, b - 1];
        picks.sort_unstable();
        let mut last = usize::MAX;
        for p in picks {
            if p != last {
                out.push(point(p));
                last = p;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Category, EventKind};

    fn ev(t: u64, alloc: u64) -> Event {
        Event {
            seq: t,
            time_us: t,
            pass: 1,
            kind: EventKind::Alloc,
            op: "op".into(),
            layer: None,
            tensor: "x".into(),
            category: Category::Activation,
            bytes: 0,
            allocated: alloc,
            reserved: alloc,
            device_used: alloc,
            process_used: alloc,
        }
    }

    #[test]
    fn reduction_keeps_spikes_and_bounds_points() {
        let mut events: Vec<Event> = (0..1_000_000).map(|t| ev(t, 100)).collect();
        events[500_123].allocated = 9_999;
        let pts = reduce(&events, Series::Allocated, 0, 999_999, 1000);
        assert!(pts.len() <= 4000, "{}", pts.len());
        assert!(pts.iter().any(|p| p[1] == 9_999.0));
    }

    #[test]
    fn small_inputs_are_returned_whole() {
        let events: Vec<Event> = (0..10).map(|t| ev(t, t)).collect();
        assert_eq!(reduce(&events, Series::Allocated, 0, 9, 100).len(), 10);
    }
}

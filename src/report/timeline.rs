//! Timeline series for plotting, reduced to what a pixel column can show: for each column the
//! minimum and maximum of the value over the events that fall in it, so a million events plot
//! as a few thousand points without losing a spike.

use crate::memory::Event;
use crate::profile::report::DeviceSample;

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
    reduce_timed(
        events,
        |e| e.time_us,
        |e| series.value(e),
        t_from_us,
        t_to_us,
        columns,
    )
}

/// Legend of the GPU's sampled per-process memory (app and PNG).
pub const NVML_LABEL: &str = "this process (NVML samples)";

/// `reduce` for the GPU's NVML readings: this process's memory over time.
pub fn reduce_samples(
    samples: &[DeviceSample],
    t_from_us: u64,
    t_to_us: u64,
    columns: usize,
) -> Vec<[f64; 2]> {
    reduce_timed(
        samples,
        |s| s.time_us,
        |s| s.process_used,
        t_from_us,
        t_to_us,
        columns,
    )
}

/// The column reduction behind `reduce` and `reduce_samples`, over anything in time order.
fn reduce_timed<T>(
    items: &[T],
    time: impl Fn(&T) -> u64,
    value: impl Fn(&T) -> u64,
    t_from_us: u64,
    t_to_us: u64,
    columns: usize,
) -> Vec<[f64; 2]> {
    let columns = columns.max(1);
    let at = |t: u64| items.partition_point(|e| time(e) < t);
    let lo = at(t_from_us).saturating_sub(1);
    let hi = at(t_to_us.saturating_add(1)).min(items.len());
    let slice = &items[lo..hi];
    let point = |e: &T| [time(e) as f64 * 1e-6, value(e) as f64];
    if slice.len() <= columns * 4 {
        return slice.iter().map(point).collect();
    }
    let span = (t_to_us.saturating_sub(t_from_us)).max(1) as f64;
    let column = |e: &T| {
        (((time(e).saturating_sub(t_from_us)) as f64 / span) * columns as f64).floor() as i64
    };
    let mut out = Vec::with_capacity(columns * 4);
    let mut i = 0;
    while i < slice.len() {
        let col = column(&slice[i]);
        let start = i;
        let (mut min_i, mut max_i) = (i, i);
        while i < slice.len() && column(&slice[i]) == col {
            let v = value(&slice[i]);
            if v < value(&slice[min_i]) {
                min_i = i;
            }
            if v > value(&slice[max_i]) {
                max_i = i;
            }
            i += 1;
        }
        let mut picks = [start, min_i, max_i, i - 1];
        picks.sort_unstable();
        let mut last = usize::MAX;
        for p in picks {
            if p != last {
                out.push(point(&slice[p]));
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

    #[test]
    fn sample_reduction_keeps_the_spike_the_ends_and_bounds_points() {
        // 100 000 readings 100 µs apart at 1 GiB, one 3 GiB reading at t = 4.2 s.
        let samples: Vec<DeviceSample> = (0..100_000u64)
            .map(|i| DeviceSample {
                time_us: i * 100,
                device_used: 0,
                process_used: if i == 42_000 { 3 << 30 } else { 1 << 30 },
            })
            .collect();
        let pts = reduce_samples(&samples, 0, 10_000_000, 500);
        assert!(pts.len() <= 4 * 500, "{} points", pts.len());
        assert_eq!(pts.first().unwrap(), &[0.0, (1u64 << 30) as f64]);
        assert_eq!(pts.last().unwrap()[0], 99_999.0 * 100.0 * 1e-6);
        let spike = pts
            .iter()
            .find(|p| p[1] == (3u64 << 30) as f64)
            .expect("spike kept");
        assert!((spike[0] - 4.2).abs() < 1e-9, "{spike:?}");
        // A narrow view: only its readings (and the one before, for the step's start).
        let zoom = reduce_samples(&samples, 4_199_950, 4_200_250, 500);
        assert_eq!(zoom.len(), 4, "{zoom:?}");
        assert!(reduce_samples(&[], 0, 10, 10).is_empty());
    }

    fn ev(t: u64, alloc: u64) -> Event {
        Event {
            allocated: alloc,
            reserved: alloc,
            device_used: alloc,
            process_used: alloc,
            ..Event::test(t, t, 1, EventKind::Alloc, Category::Activation, 0)
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

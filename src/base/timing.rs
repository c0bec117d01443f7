//! Where the time of a run goes, phase by phase (`-v` on `bench` and `profile`): named spans
//! add their wall time to a process-wide table, in the order they first ran. Off by default:
//! a span then costs one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static START: OnceLock<Instant> = OnceLock::new();

/// Marks the process's start (the CLI's first line).
pub fn mark_start() {
    START.get_or_init(Instant::now);
}

/// Seconds since `mark_start` (since the first call when it was never marked).
pub fn since_start() -> f64 {
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

static ON: AtomicBool = AtomicBool::new(false);
static TABLE: Mutex<Vec<(&'static str, Duration, u64)>> = Mutex::new(Vec::new());

/// Starts recording (the CLI's `-v`).
pub fn enable() {
    ON.store(true, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Adds `d` to `phase` (and one to its count).
pub fn add(phase: &'static str, d: Duration) {
    if !enabled() {
        return;
    }
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    match t.iter_mut().find(|(p, _, _)| *p == phase) {
        Some((_, total, n)) => {
            *total += d;
            *n += 1;
        }
        None => t.push((phase, d, 1)),
    }
}

/// A span: its wall time goes to `phase` when it ends.
pub struct Span {
    phase: &'static str,
    start: Option<Instant>,
}

pub fn span(phase: &'static str) -> Span {
    Span {
        phase,
        start: enabled().then(Instant::now),
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(s) = self.start {
            add(self.phase, s.elapsed());
        }
    }
}

/// The phases so far: name, seconds, count.
pub fn phases() -> Vec<(&'static str, f64, u64)> {
    TABLE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(p, d, n)| (*p, d.as_secs_f64(), *n))
        .collect()
}

/// The table as printed by `-v`.
pub fn report() -> Vec<String> {
    phases()
        .into_iter()
        .map(|(p, s, n)| format!("  {p:<44} {s:>8.3} s  ({n}×)"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_add_up_by_phase() {
        enable();
        for _ in 0..3 {
            let _s = span("test phase a");
            std::thread::sleep(Duration::from_millis(2));
        }
        add("test phase b", Duration::from_millis(5));
        let p = phases();
        let a = p.iter().find(|x| x.0 == "test phase a").unwrap();
        assert_eq!(a.2, 3);
        assert!(a.1 >= 0.006, "{a:?}");
        let b = p.iter().find(|x| x.0 == "test phase b").unwrap();
        assert!((b.1 - 0.005).abs() < 1e-9);
    }
}

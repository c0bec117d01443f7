//! Work the caller need not wait for.

use std::sync::{Mutex, OnceLock};

use super::timing::span;

/// Frees `v` on a background thread: returning large host buffers to the system (unmapping
/// touched pages) took 1.4-1.6 s of a Llama-3-8B load from host values (docs/gpu-runs.md
/// run 57), and the loader need not wait for it. One buffer waits at most, so the host holds
/// at most two more than it would.
pub fn drop_later<T: Send + 'static>(v: T) {
    use std::sync::mpsc::{sync_channel, SyncSender};
    type Job = Box<dyn Send>;
    static TX: OnceLock<Mutex<Option<SyncSender<Job>>>> = OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = sync_channel::<Job>(1);
        let spawned = std::thread::Builder::new()
            .name("vramscope-free".into())
            .spawn(move || {
                for job in rx {
                    let _t = span("load: host copies freed (in the background)");
                    drop(job);
                }
            });
        Mutex::new(spawned.ok().map(|_| tx))
    });
    let job: Job = Box::new(v);
    let guard = tx.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref() {
        Some(s) => {
            if let Err(back) = s.send(job) {
                drop(back.0);
            }
        }
        None => drop(job),
    }
}

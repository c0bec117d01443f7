//! The profiling worker: one std thread per run, a channel of messages back to the UI, a cancel
//! flag. The Runtime is !Send, so everything it needs is created on the worker thread itself.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::fits::{self, Fit};
use crate::engine::progress::{Progress, ProgressSink};
use crate::profile::{self, ProfileRequest, Report};

/// What the worker sends to the UI thread.
pub enum WorkerMsg {
    Progress(Progress),
    /// The run ended: its report, or the error / panic message to show in the banner.
    Finished(Result<Box<Report>, RunFailure>),
    /// Sent before `Finished` where vLLM would not start the run: the settings that would,
    /// each checked by a dry run (`fits::checked`).
    Fits(Vec<Fit>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum RunFailure {
    Cancelled,
    Error(String),
    Panic(String),
}

impl RunFailure {
    pub fn message(&self) -> String {
        match self {
            RunFailure::Cancelled => "Cancelled; nothing of the run is kept.".into(),
            RunFailure::Error(e) => e.clone(),
            RunFailure::Panic(p) => format!("The profiling worker crashed: {p}"),
        }
    }
}

pub struct Worker {
    rx: Receiver<WorkerMsg>,
    cancel: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts a profile run; `wake` is called after every message so the UI repaints.
    pub fn spawn(req: ProfileRequest, wake: impl Fn() + Send + Clone + 'static) -> Worker {
        Self::spawn_job(
            move |sink, cancel| {
                let out = profile::run(&req, Some(sink), cancel.clone());
                let fits = fits::checked(&req, &out, &cancel);
                (out, fits)
            },
            wake,
        )
    }

    /// Runs `job` on a new thread, with a progress sink into this worker's channel.
    fn spawn_job(
        job: impl FnOnce(ProgressSink, Arc<AtomicBool>) -> (crate::Result<Report>, Option<Vec<Fit>>)
            + Send
            + 'static,
        wake: impl Fn() + Send + Clone + 'static,
    ) -> Worker {
        let (tx, rx) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let handle = std::thread::Builder::new()
            .name("vramscope-profile".into())
            .spawn(move || {
                let sink_tx = tx.clone();
                let sink_wake = wake.clone();
                let sink: ProgressSink = Box::new(move |p: Progress| {
                    // A closed channel means the UI dropped this run; the cancel flag stops it.
                    let _ = sink_tx.send(WorkerMsg::Progress(p));
                    sink_wake();
                });
                let outcome = catch_unwind(AssertUnwindSafe(|| job(sink, flag)));
                let msg = match outcome {
                    Ok((result, fits)) => {
                        if let Some(fits) = fits {
                            let _ = tx.send(WorkerMsg::Fits(fits));
                        }
                        match result {
                            Ok(report) => Ok(Box::new(report)),
                            Err(crate::Error::Cancelled) => Err(RunFailure::Cancelled),
                            Err(e) => Err(RunFailure::Error(e.to_string())),
                        }
                    }
                    Err(payload) => Err(RunFailure::Panic(panic_text(payload.as_ref()))),
                };
                let _ = tx.send(WorkerMsg::Finished(msg));
                wake();
            })
            .expect("spawning a thread");
        Worker {
            rx,
            cancel,
            handle: Some(handle),
        }
    }

    /// Asks the run to stop at its next op boundary.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Messages that arrived since the last call, without waiting. A worker that vanished
    /// without a final message is reported as a crash.
    pub fn drain(&mut self) -> Vec<WorkerMsg> {
        let mut out = Vec::new();
        loop {
            match self.rx.try_recv() {
                Ok(m) => out.push(m),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if !out.iter().any(|m| matches!(m, WorkerMsg::Finished(_))) {
                        out.push(WorkerMsg::Finished(Err(RunFailure::Panic(
                            "the worker thread ended without a result".into(),
                        ))));
                    }
                    break;
                }
            }
        }
        if out.iter().any(|m| matches!(m, WorkerMsg::Finished(_))) {
            if let Some(h) = self.handle.take() {
                // The thread has sent its last message; joining is immediate.
                let _ = h.join();
            }
        }
        out
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the app mid-run: stop the worker rather than leave it computing.
        self.cancel();
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn finish(w: &mut Worker) -> Vec<WorkerMsg> {
        let t = Instant::now();
        let mut all = Vec::new();
        while !all.iter().any(|m| matches!(m, WorkerMsg::Finished(_))) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "worker never finished"
            );
            all.extend(w.drain());
            std::thread::sleep(Duration::from_millis(2));
        }
        all
    }

    #[test]
    fn a_panicking_job_becomes_a_failure_message_not_a_crash() {
        let mut w = Worker::spawn_job(|_, _| panic!("boom in layer 3"), || {});
        let msgs = finish(&mut w);
        match msgs.last() {
            Some(WorkerMsg::Finished(Err(RunFailure::Panic(p)))) => {
                assert_eq!(p, "boom in layer 3")
            }
            _ => panic!("expected a panic failure"),
        }
    }

    #[test]
    fn progress_arrives_before_the_result_and_cancel_reaches_the_job() {
        let mut w = Worker::spawn_job(
            |mut sink, cancel| {
                sink(Progress::Layer { layer: 1, of: 2 });
                while !cancel.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                (Err(crate::Error::Cancelled), None)
            },
            || {},
        );
        std::thread::sleep(Duration::from_millis(20));
        w.cancel();
        let msgs = finish(&mut w);
        assert!(matches!(
            msgs.first(),
            Some(WorkerMsg::Progress(Progress::Layer { layer: 1, of: 2 }))
        ));
        assert!(matches!(
            msgs.last(),
            Some(WorkerMsg::Finished(Err(RunFailure::Cancelled)))
        ));
    }
}

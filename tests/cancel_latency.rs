//! Cancel during a long compute run lands within 0.5 s: the CPU kernels check the flag
//! between row blocks, not only between ops. The app's Cancel sets this same flag (its worker
//! calls `profile::run` with it), so this is the latency a user sees, minus one repaint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramscope::device::DeviceSpec;
use vramscope::engine::progress::{Phase, Progress};
use vramscope::model::ModelSource;
use vramscope::{profile, Error, ProfileRequest};

/// Starts a 4096-token compute run of SmolLM2-135M's shape, cancels it `after` into the
/// profile passes, and returns how long the run took to stop.
fn cancel_latency(after: Duration) -> Duration {
    let req = ProfileRequest {
        model: ModelSource::parse("preset:smollm2-135m").unwrap(),
        device: DeviceSpec::parse("sim:h100-80gb:compute").unwrap(),
        tokens: 4096,
        max_model_len: 4096,
        seqs: 1,
        passes: 1,
        verify: false,
        ..ProfileRequest::default()
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let (phase_tx, phase_rx) = channel();
    let flag = cancel.clone();
    let (done_tx, done_rx) = channel();
    std::thread::spawn(move || {
        // The sink is not Send: made on the run's own thread, as the app's worker does.
        let sink: vramscope::engine::progress::ProgressSink = Box::new(move |p: Progress| {
            if let Progress::Phase(Phase::Profiling) = p {
                let _ = phase_tx.send(());
            }
        });
        let r = profile::run(&req, Some(sink), flag);
        let _ = done_tx.send((Instant::now(), r.err()));
    });
    phase_rx
        .recv_timeout(Duration::from_secs(300))
        .expect("the run reached its profile passes");
    std::thread::sleep(after);
    let set = Instant::now();
    cancel.store(true, Ordering::Relaxed);
    let (stopped, err) = done_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the run stopped");
    assert!(matches!(err, Some(Error::Cancelled)), "{err:?}");
    stopped.duration_since(set)
}

#[test]
fn cancel_lands_within_half_a_second_in_a_4096_token_compute_run() {
    // Early (embedding, first GEMMs) and later (inside a layer's attention).
    let mut worst = Duration::ZERO;
    for after in [Duration::from_millis(700), Duration::from_millis(2500)] {
        let l = cancel_latency(after);
        eprintln!(
            "cancel {:?} into the pass: stopped after {:.3} s",
            after,
            l.as_secs_f64()
        );
        worst = worst.max(l);
    }
    assert!(
        worst < Duration::from_millis(500),
        "cancel took {:.3} s",
        worst.as_secs_f64()
    );
}

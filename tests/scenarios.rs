//! The profile procedure through the library: cancellation and progress.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use vramscope::device::DeviceSpec;
use vramscope::memory::Event;
use vramscope::model::ModelSource;
use vramscope::profile::{run, ProfileRequest};
use vramscope::progress::Progress;
use vramscope::quant::Quant;
use vramscope::Error;

#[test]
fn cancel_mid_pass_stops_and_frees_everything() {
    let cancel = Arc::new(AtomicBool::new(false));
    let events: Arc<Mutex<Vec<Event>>> = Default::default();
    let layers_seen = Arc::new(Mutex::new(0u32));
    let (c, ev, ls) = (cancel.clone(), events.clone(), layers_seen.clone());
    let sink = Box::new(move |p: Progress| match p {
        Progress::Layer { layer, .. } => {
            *ls.lock().unwrap() += 1;
            // Cancel in the middle of the second pass.
            if layer == 10 && *ls.lock().unwrap() > 40 {
                c.store(true, Ordering::Relaxed);
            }
        }
        Progress::Events(batch) => ev.lock().unwrap().extend(batch),
        _ => {}
    });
    let req = ProfileRequest {
        model: ModelSource::Preset {
            name: "llama-3-8b".into(),
        },
        quant: Quant::Int8,
        device: DeviceSpec::parse("sim:h100-80gb:dry").unwrap(),
        ..ProfileRequest::default()
    };
    let result = run(&req, Some(sink), cancel);
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    let seen = *layers_seen.lock().unwrap();
    assert!(
        seen < 32 * 2 + 1,
        "kept running after cancel: {seen} layers"
    );
    let events = events.lock().unwrap();
    let last = events.last().expect("events were streamed");
    assert_eq!(last.allocated, 0, "tensors still allocated after cancel");
    assert_eq!(last.reserved, 0, "segments still held after cancel");
    assert_eq!(
        last.process_used,
        512 << 20,
        "only the (simulated) context remains while the instance lives"
    );
}

#[test]
fn progress_reports_phases_passes_and_layers() {
    let seen: Arc<Mutex<Vec<Progress>>> = Default::default();
    let s = seen.clone();
    let sink = Box::new(move |p: Progress| {
        if !matches!(p, Progress::Events(_) | Progress::Load { .. }) {
            s.lock().unwrap().push(p)
        }
    });
    let req = ProfileRequest {
        model: ModelSource::Preset {
            name: "tiny".into(),
        },
        device: DeviceSpec::parse("sim:h100-80gb").unwrap(),
        tokens: 64,
        seqs: 2,
        passes: 2,
        ..ProfileRequest::default()
    };
    let report = run(&req, Some(sink), Arc::new(AtomicBool::new(false))).unwrap();
    let seen = seen.lock().unwrap();
    let passes: Vec<u32> = seen
        .iter()
        .filter_map(|p| match p {
            Progress::Pass {
                pass, verify: None, ..
            } => Some(*pass),
            _ => None,
        })
        .collect();
    assert_eq!(passes, [1, 2]);
    let layers = seen
        .iter()
        .filter(|p| matches!(p, Progress::Layer { .. }))
        .count();
    // 2 profile passes + 6 verify passes, 4 layers each.
    assert_eq!(layers, 8 * 4);
    assert_eq!(
        report.logits.len(),
        2,
        "compute mode records the top logits of each sequence"
    );
    assert_eq!(report.logits[0].top.len(), 5);
}

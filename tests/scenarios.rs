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
    // 2 profile passes + 2 verify passes (the new formula's and the truth's), 4 layers each.
    // The other four formulas leave out the 512 MiB context, so the KV cache they grant does
    // not fit inside T·u and their verify stops at the cache allocation.
    assert_eq!(layers, 4 * 4);
    use vramscope::profile::formulas::FormulaId;
    let new = report
        .formula(FormulaId::Pr9516)
        .unwrap()
        .verify
        .clone()
        .unwrap();
    assert!(new.ran && new.within_budget && !new.oom, "{new:?}");
    let truth = report.truth.verify.clone().unwrap();
    assert!(truth.within_budget && !truth.oom, "{truth:?}");
    for id in [
        FormulaId::V0_6_3,
        FormulaId::Pr9352,
        FormulaId::Pr10511,
        FormulaId::Pr12126,
    ] {
        let v = report.formula(id).unwrap().verify.clone().unwrap();
        assert!(v.oom && v.message.contains("kv-cache"), "{id:?}: {v:?}");
    }
    assert_eq!(
        report.logits.len(),
        2,
        "compute mode records the top logits of each sequence"
    );
    assert_eq!(report.logits[0].top.len(), 5);
}

// The verify pass runs inside T·u: no framework segment may take the instance over
// floor(T·u), and the allocator gives cached segments back before it gives up (as PyTorch's
// does). On Llama-3-8B int8 the new formula (130 MiB under the truth, allocator fragmentation)
// then fits; the formulas that grant more than the truth leaves room for run out of memory,
// and the old one fits with its double-counted CxB to spare.
#[test]
fn verify_passes_run_inside_the_budget_and_the_new_formula_fits() {
    use vramscope::profile::formulas::FormulaId;
    let req = ProfileRequest {
        model: ModelSource::Preset {
            name: "llama-3-8b".into(),
        },
        quant: Quant::Int8,
        device: DeviceSpec::parse("sim:h200-141gb:dry").unwrap(),
        tokens: 8192,
        ..ProfileRequest::default()
    };
    let r = run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
    let v = |id| r.formula(id).unwrap().verify.clone().unwrap();
    let budget = v(FormulaId::Pr9516).budget_bytes;
    let new = v(FormulaId::Pr9516);
    assert!(r.formula(FormulaId::Pr9516).unwrap().error_bytes < 0);
    assert!(new.ran && !new.oom && new.within_budget, "{new:?}");
    assert!(new.peak_process_bytes <= budget);
    assert!(new.message.starts_with("fits"), "{}", new.message);
    let old = v(FormulaId::Pr9352);
    assert!(
        old.within_budget && old.overrun_bytes < -(5 << 30),
        "{old:?}"
    );
    let truth = r.truth.verify.clone().unwrap();
    assert!(truth.within_budget, "{truth:?}");
    for id in [FormulaId::V0_6_3, FormulaId::Pr10511, FormulaId::Pr12126] {
        let f = r.formula(id).unwrap();
        let x = f.verify.clone().unwrap();
        // Each grants at least 500 MiB more KV than the truth leaves room for.
        assert!(f.error_bytes < -(500 << 20), "{id:?}: {}", f.error_bytes);
        assert!(x.oom && !x.within_budget, "{id:?}: {x:?}");
        // Out of memory only after giving the cached segments back.
        assert!(x.cache_releases >= 1, "{id:?}: {x:?}");
        assert!(x.message.contains("out of memory"), "{}", x.message);
    }
}

// The verify pass is fair: the KV cache the measured truth leaves room for, plus one more pass,
// fits inside T·u for every preset and quantization (the KV tensor's allocator padding, under
// 2 MiB, is reported and not charged).
#[test]
fn the_truths_own_verify_fits_on_every_preset_and_quantization() {
    for model in ["tiny", "smollm2-135m", "llama-3-8b"] {
        for quant in [Quant::F16, Quant::Int8, Quant::Nf4] {
            let req = ProfileRequest {
                model: ModelSource::Preset { name: model.into() },
                quant,
                device: DeviceSpec::parse("sim:h100-80gb:dry").unwrap(),
                tokens: 8192,
                ..ProfileRequest::default()
            };
            let r = run(&req, None, Arc::new(AtomicBool::new(false))).unwrap();
            let v = r.truth.verify.clone().unwrap();
            assert!(
                v.ran && v.within_budget && !v.oom,
                "{model} {quant:?}: {v:?}"
            );
            assert!(v.kv_padding_bytes < 2 << 20, "{v:?}");
            assert!(
                v.kv_allocated_bytes + v.kv_padding_bytes > 0
                    && (v.kv_allocated_bytes + v.kv_padding_bytes).is_multiple_of(2 << 20),
                "the KV tensor takes whole 2 MiB units: {v:?}"
            );
        }
    }
}

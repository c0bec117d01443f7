//! PyTorch memory snapshots: the opcode guard, serde-pickle, the replay of every device's
//! trace, and the Report an imported timeline becomes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("snapshot.pickle");
    if let Ok(imported) = vramscope::report::snapshot::read_bytes(path, data) {
        let _ = imported.summary_text(Some(1 << 30));
        for d in &imported.devices {
            let r = d.to_report(path, None);
            assert_eq!(r.event_count, d.events.len());
        }
    }
});

//! PyTorch memory snapshots in and out: the synthetic fixtures (scripts/make_snapshot_fixtures.py,
//! numbers worked out there by hand), the `report` command, and a vramscope run exported and
//! read back.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::memory::EventKind;
use vramscope::model::ModelSource;
use vramscope::profile::{self, ProfileRequest};
use vramscope::report::snapshot;

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn block_sizes_follow_pytorchs_rounding_and_split_rules() {
    let imported = snapshot::read(&fixture("snapshot_small.pickle"), None).unwrap();
    assert_eq!(imported.devices.len(), 1);
    let d = &imported.devices[0];
    // 1024 + 4096 + a 19.5 MiB request that keeps its whole 20 MiB block.
    assert_eq!(d.peak_allocated, 1024 + 4096 + 20 * MIB);
    assert_eq!(d.final_allocated, 4096 + 3 * MIB);
    assert_eq!(d.final_reserved, 22 * MIB);
    assert_eq!(d.peak_reserved, 22 * MIB);
    assert_eq!(d.replayed_allocated, d.final_allocated);
    assert_eq!(d.replayed_reserved, d.final_reserved);
    assert_eq!((d.entries, d.ignored_entries), (13, 1));
    let kinds: Vec<EventKind> = d.events.iter().map(|e| e.kind).collect();
    use EventKind::*;
    assert_eq!(
        kinds,
        [SegmentMap, Marker, Alloc, Alloc, SegmentMap, Alloc, Free, Alloc, Free, Marker, Marker]
    );
    let big = &d.events[5];
    assert_eq!(
        (big.bytes, big.allocated),
        (20 * MIB, 1024 + 4096 + 20 * MIB)
    );
    // The innermost shown frame names op and tensor, also for frame dicts the pickle shares
    // between stacks (memo references); `CapturedTraceback::gather` is left out as PyTorch's
    // viewer does.
    let named: Vec<(&str, &str)> = d
        .events
        .iter()
        .filter(|e| matches!(e.kind, Alloc | Free))
        .map(|e| (e.op.as_str(), e.tensor.as_str()))
        .collect();
    assert_eq!(
        named,
        [
            ("forward", "modeling_llama.py:178"),
            ("forward", "linear.py:125"),
            ("forward", "linear.py:125"),
            ("forward", "linear.py:125"),
            ("forward", "linear.py:125"),
            ("forward", "modeling_llama.py:178"),
        ]
    );
    assert!(d.events[9].op.starts_with("oom: 67108864 bytes requested"));
    // Times are relative to the first entry.
    assert_eq!((d.events[0].time_us, d.events[10].time_us), (0, 12));
}

#[test]
fn history_that_starts_late_takes_older_blocks_from_segments() {
    let imported = snapshot::read(&fixture("snapshot_truncated.pickle"), None).unwrap();
    let d = &imported.devices[0];
    assert_eq!((d.segments_before_history, d.blocks_before_history), (1, 2));
    let first = &d.events[0];
    assert_eq!(first.kind, EventKind::Marker);
    assert!(first.op.starts_with("history starts here"), "{}", first.op);
    assert_eq!((first.allocated, first.reserved), (5120, 2 * MIB));
    assert_eq!(d.peak_allocated, 5120 + 20 * MIB);
    assert_eq!(d.final_allocated, 4096 + 3 * MIB);
    assert_eq!(d.replayed_allocated, d.final_allocated);
    assert_eq!(d.final_reserved, 22 * MIB);
}

fn vramscope(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn report_prints_exact_numbers_and_writes_the_exports() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let snap = fixture("snapshot_small.pickle");
    let out = vramscope(&[
        "report",
        snap.to_str().unwrap(),
        "--json",
        &p("s.json"),
        "--csv",
        &p("s.csv"),
        "--png",
        &p("s.png"),
        "--total",
        "80GiB",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = |label: &str| {
        let at = stdout
            .find(label)
            .unwrap_or_else(|| panic!("{label} in {stdout}"));
        let rest = stdout[at..].split(" bytes)").next().unwrap();
        rest.rsplit('(').next().unwrap().to_string()
    };
    assert_eq!(after("peak allocated"), "20976640");
    assert_eq!(after("final allocated"), "3149824");
    assert_eq!(after("final reserved"), "23068672");
    assert!(stdout.contains("unknown"), "{stdout}");
    let session = vramscope::report::export::json::read(Path::new(&p("s.json"))).unwrap();
    assert_eq!(session.event_count, 11);
    assert_eq!(session.checkpoints.t2.allocated_peak, 20976640);
    assert_eq!(session.device.total_bytes, 80 << 30);
    let csv = std::fs::read_to_string(p("s.csv")).unwrap();
    assert_eq!(csv.lines().count(), 12);
    assert!(std::fs::metadata(p("s.png")).unwrap().len() > 10_000);
}

fn tiny_run() -> vramscope::Report {
    let req = ProfileRequest {
        model: ModelSource::parse("preset:tiny").unwrap(),
        device: vramscope::device::DeviceSpec::parse("sim:h100-80gb:dry").unwrap(),
        tokens: 64,
        max_model_len: 64,
        seqs: 4,
        outside_during: 3 * MIB,
        ..ProfileRequest::default()
    };
    profile::run(&req, None, Arc::new(AtomicBool::new(false))).unwrap()
}

#[test]
fn an_exported_run_reads_back_as_the_same_timeline() {
    let report = tiny_run();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.pickle");
    snapshot::write(&report, &path).unwrap();
    let back = snapshot::read(&path, None).unwrap();
    assert_eq!(back.devices.len(), 1);
    let d = &back.devices[0];
    assert_eq!(d.events.len(), report.events.len());
    let peak = report.events.iter().map(|e| e.allocated).max().unwrap();
    assert_eq!(d.peak_allocated, peak);
    assert_eq!(
        d.peak_reserved,
        report.events.iter().map(|e| e.reserved).max().unwrap()
    );
    for (a, b) in report.events.iter().zip(&d.events) {
        assert_eq!(
            (
                a.kind,
                a.bytes,
                a.allocated,
                a.reserved,
                a.pass,
                a.layer,
                a.category
            ),
            (
                b.kind,
                b.bytes,
                b.allocated,
                b.reserved,
                b.pass,
                b.layer,
                b.category
            ),
            "event {} ({} {})",
            a.seq,
            a.op,
            a.tensor
        );
        assert_eq!((&a.op, &a.tensor), (&b.op, &b.tensor));
        assert_eq!(a.addr, b.addr);
    }
    // The exported end state (segments and blocks) is where the replayed trace ends.
    let last = report.events.last().unwrap();
    assert_eq!(
        (d.final_allocated, d.final_reserved),
        (last.allocated, last.reserved)
    );
    assert_eq!(
        (d.replayed_allocated, d.replayed_reserved),
        (last.allocated, last.reserved)
    );
    let r = d.to_report(&path, None);
    assert_eq!(r.passes.len(), report.passes.len());
}

#[test]
fn profile_writes_a_torch_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.pickle");
    let out = vramscope(&[
        "profile",
        "--model",
        "preset:tiny",
        "--tokens",
        "64",
        "--max-model-len",
        "64",
        "--max-num-seqs",
        "64",
        "--quiet",
        "--torch-snapshot",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let back = snapshot::read(&path, None).unwrap();
    assert!(back.devices[0].peak_allocated > 0);
}

/// A trace of `pairs` alloc/free rounds (one alloc entry and two free entries each) in one
/// 1 GiB segment, written by the exporter.
fn big_snapshot(path: &Path, pairs: u64) -> u64 {
    use vramscope::memory::{Category, Event};
    let mut report = tiny_run();
    let base = 0x7f00_0000_0000u64;
    let ev = |seq: u64, kind, bytes: u64, addr: u64, allocated: u64| Event {
        seq,
        time_us: seq,
        pass: 1 + (seq / 100_000) as u32,
        kind,
        op: "mlp".into(),
        layer: Some((seq % 32) as u32),
        tensor: format!("layers.{}.mlp.up", seq % 32),
        category: Category::Activation,
        bytes,
        allocated,
        reserved: 1 << 30,
        device_used: 0,
        process_used: 0,
        addr: Some(addr),
    };
    let mut events = vec![ev(0, EventKind::SegmentMap, 1 << 30, base, 0)];
    let block = 64 << 10;
    let per_round = 100;
    let mut allocated = 0;
    let mut n = 0;
    while n < pairs {
        let k = per_round.min(pairs - n);
        for i in 0..k {
            allocated += block;
            let seq = events.len() as u64;
            events.push(ev(
                seq,
                EventKind::Alloc,
                block,
                base + i * block,
                allocated,
            ));
        }
        for i in (0..k).rev() {
            allocated -= block;
            let seq = events.len() as u64;
            events.push(ev(seq, EventKind::Free, block, base + i * block, allocated));
        }
        n += k;
    }
    report.event_count = events.len();
    report.events = events;
    snapshot::write(&report, path).unwrap();
    std::fs::metadata(path).unwrap().len()
}

/// The 10⁶-entry benchmark: writes the snapshot, then times `vramscope report` on it and reads
/// the peak memory the command reports (Linux VmHWM).
/// `cargo test --release --test torch_snapshot million_entry_snapshot -- --ignored --nocapture`
#[test]
#[ignore]
fn million_entry_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.pickle");
    let t = std::time::Instant::now();
    let bytes = big_snapshot(&path, 333_334);
    println!(
        "wrote {} MB (1,000,002 trace entries) in {:.1} s",
        bytes / 1_000_000,
        t.elapsed().as_secs_f64()
    );
    let out = vramscope(&["report", path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("read in")).unwrap();
    let ratio: f64 = line
        .rsplit('(')
        .next()
        .and_then(|s| s.split('x').next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    println!("peak memory / file size = {ratio:.2}");
}

/// A real snapshot recorded by PyTorch 2.11 on an H200 (tests/fixtures/torch_2_11 holds the
/// numbers PyTorch printed just before `_dump_snapshot`; scripts/torch_probe.py made it).
fn torch_numbers(name: &str) -> (u64, u64, u64) {
    let text = std::fs::read_to_string(fixture("torch_2_11/numbers.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let n = &v[name];
    let get = |k: &str| n[k].as_u64().unwrap();
    (
        get("max_memory_allocated"),
        get("memory_allocated"),
        get("memory_reserved"),
    )
}

#[test]
fn a_real_pytorch_2_11_snapshot_gives_pytorchs_own_numbers() {
    let name = "opt_tiny_3passes.pickle";
    let (peak, allocated, reserved) = torch_numbers(name);
    let imported = snapshot::read(&fixture(&format!("torch_2_11/{name}")), None).unwrap();
    let d = imported.main_device().unwrap();
    assert_eq!(d.peak_allocated, peak);
    assert_eq!(d.final_allocated, allocated);
    assert_eq!(d.final_reserved, reserved);
    // The replay of the whole history lands on the snapshot's own end state.
    assert_eq!(d.replayed_allocated, allocated);
    assert_eq!(d.replayed_reserved, reserved);
    assert_eq!(d.estimated_block_sizes, 0);
    assert_eq!(d.entries, 590);
    // 222 allocs + 183 frees + 2 segments.
    assert_eq!(d.events.len(), 407);
    // Every allocation keeps its innermost shown frame as op and tensor, though PyTorch's
    // pickle shares frame dicts (and whole stacks) between entries through its memo. The
    // counts are Python's own reading of the same file (pickle.load, the same frame filter).
    let allocs: Vec<_> = d
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .collect();
    assert_eq!(allocs.len(), 222);
    assert!(allocs
        .iter()
        .all(|e| !e.op.is_empty() && !e.tensor.is_empty()));
    let count = |op: &str, tensor: &str| {
        allocs
            .iter()
            .filter(|e| e.op == op && e.tensor == tensor)
            .count()
    };
    assert_eq!(count("layer_norm", "functional.py:2935"), 45);
    assert_eq!(count("forward", "linear.py:134"), 41);
    assert_eq!(count("convert", "module.py:1370"), 36);
    assert_eq!(count("sdpa_attention_forward", "sdpa_attention.py:158"), 24);
}

#[test]
fn a_real_ring_buffer_snapshot_starts_from_its_segments() {
    let name = "opt_tiny_ring40.pickle";
    let (peak, allocated, reserved) = torch_numbers(name);
    let imported = snapshot::read(&fixture(&format!("torch_2_11/{name}")), None).unwrap();
    let d = imported.main_device().unwrap();
    assert!(d.blocks_before_history > 0);
    assert_eq!(d.segments_before_history, 2);
    assert_eq!(d.final_allocated, allocated);
    assert_eq!(d.final_reserved, reserved);
    assert_eq!(d.replayed_allocated, allocated);
    // max_memory_allocated is the process's peak, which may predate a 40-entry history; here
    // the last forward pass (inside the history) set it.
    assert_eq!(d.peak_allocated, peak);
    assert_eq!(d.events[0].kind, EventKind::Marker);
}

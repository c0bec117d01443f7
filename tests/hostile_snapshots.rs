//! The hostile-snapshot corpus: files given to `vramscope report` as PyTorch memory snapshots
//! that are not one, are damaged, name Python code, or describe impossible memory. Each must
//! give one line naming the file and the problem, exit code 2, and write nothing.
//!
//! `VRAMSCOPE_WRITE_CORPUS=DIR cargo test --test hostile_snapshots write_corpus -- --ignored`
//! writes the corpus (and the valid fixtures) as seeds for the `torch_snapshot` fuzz target.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

const A: u64 = 0x7f3a_0000_0000;
const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap()
}

fn pickle(v: &Value) -> Vec<u8> {
    serde_pickle::to_vec(v, serde_pickle::SerOptions::new()).unwrap()
}

fn seg(address: u64, total: u64, blocks: Value) -> Value {
    json!({"device": 0, "address": address, "total_size": total, "stream": 0,
           "segment_type": "large", "blocks": blocks})
}

fn entry(action: &str, addr: Value, size: u64) -> Value {
    json!({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1, "frames": []})
}

fn with_trace(segments: Value, trace: Vec<Value>) -> Vec<u8> {
    pickle(&json!({"segments": segments, "device_traces": [trace]}))
}

/// (name, file bytes, words the one-line error must contain)
fn corpus() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let small = fixture("snapshot_small.pickle");
    let seg_alloc = entry("segment_alloc", json!(A), 20 * MIB);
    vec![
        ("empty", Vec::new(), "not a pickle"),
        ("text", b"{\"segments\": []}".to_vec(), "not a pickle"),
        ("png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec(), "not a pickle"),
        (
            "unknown_opcode",
            b"\x80\x04\xff\xff.".to_vec(),
            "unknown opcode 0xff",
        ),
        ("truncated_half", small[..small.len() / 2].to_vec(), "truncated"),
        ("truncated_no_stop", small[..small.len() - 1].to_vec(), "truncated"),
        ("list_of_ints", pickle(&json!([1, 2, 3])), "not a PyTorch memory snapshot"),
        ("string", pickle(&json!("segments")), "not a PyTorch memory snapshot"),
        ("other_dict", pickle(&json!({"weights": [1.5, 2.5]})), "neither 'segments' nor 'device_traces'"),
        (
            "non_string_keys",
            b"\x80\x04\x95\x11\x00\x00\x00\x00\x00\x00\x00}\x94(K\x01\x8c\x01x\x94C\x01k\x94K\x02u.".to_vec(),
            "neither 'segments' nor 'device_traces'",
        ),
        (
            "traces_not_a_list",
            pickle(&json!({"segments": [], "device_traces": 7})),
            "not a PyTorch memory snapshot",
        ),
        (
            "global_reduce",
            b"\x80\x02cposix\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.".to_vec(),
            "names a Python global",
        ),
        (
            "stack_global_object",
            b"\x80\x04\x95)\x00\x00\x00\x00\x00\x00\x00\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94\x8c\x01a\x94K\x01s.".to_vec(),
            "names a Python global",
        ),
        (
            "recursive_list",
            b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x08segments\x94]\x94h\x02as.".to_vec(),
            "not a PyTorch memory snapshot",
        ),
        (
            "nested_too_deep",
            {
                let mut v = b"\x80\x04".to_vec();
                v.extend(std::iter::repeat_n(b']', 100_000));
                v.extend(std::iter::repeat_n(b'a', 99_999));
                v.push(b'.');
                v
            },
            "nested more than",
        ),
        (
            "address_too_large",
            b"\x80\x04\x95Y\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\rdevice_traces\x94]\x94]\x94}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00@\x8c\x04size\x94M\x00\x02uaau.".to_vec(),
            "integer too large",
        ),
        (
            "negative_address",
            with_trace(json!([]), vec![entry("alloc", json!(-4096), 512)]),
            "not a PyTorch memory snapshot",
        ),
        // Two segments of 4 EiB each, side by side: 8 EiB, within 2^64 (a pickle's integers
        // stop at 2^63), far past any GPU.
        (
            "segments_of_8_eib",
            pickle(&json!({"segments": [seg(0, 1 << 62, json!([])),
                seg(1 << 62, (1u64 << 62) - 1, json!([]))], "device_traces": []})),
            "the segments' sizes reach 4611686018427387904 bytes, more than any GPU holds",
        ),
        // The same in the trace: segment_alloc after segment_alloc.
        (
            "segment_allocs_of_8_eib",
            with_trace(
                json!([]),
                vec![
                    entry("segment_alloc", json!(0), 1 << 62),
                    entry("segment_alloc", json!(1u64 << 62), 1 << 62),
                ],
            ),
            "reserved bytes reach 4611686018427387904 bytes, more than any GPU holds",
        ),
        (
            "segment_of_zero_bytes",
            pickle(&json!({"segments": [seg(A, 0, json!([]))], "device_traces": []})),
            "impossible segment",
        ),
        (
            "block_past_segment_end",
            pickle(&json!({"segments": [seg(A, 2 * MIB, json!([
                {"address": A, "size": 3 * MIB, "state": "active_allocated"}]))],
                "device_traces": []})),
            "impossible block",
        ),
        (
            "allocated_size_lies",
            pickle(&json!({"segments": [{"device": 0, "address": A, "total_size": 2 * MIB,
                "allocated_size": 4096, "blocks": [
                {"address": A, "size": 2 * MIB, "state": "inactive"}]}], "device_traces": []})),
            "says 4096 bytes allocated",
        ),
        (
            "alloc_outside_every_segment",
            with_trace(json!([]), vec![seg_alloc.clone(), entry("alloc", json!(A - 4096), 512)]),
            "lies in no segment",
        ),
        (
            "alloc_past_segment_end",
            with_trace(json!([]), vec![seg_alloc.clone(), entry("alloc", json!(A), 64 * MIB)]),
            "impossible size",
        ),
        (
            "alloc_twice_at_one_address",
            with_trace(
                json!([]),
                vec![seg_alloc.clone(), entry("alloc", json!(A), 512), entry("alloc", json!(A), 512)],
            ),
            "already allocated",
        ),
        (
            "free_of_unknown_address",
            with_trace(
                json!([]),
                vec![seg_alloc.clone(), entry("free_requested", json!(A + 512), 512)],
            ),
            "free of unknown address 0x7f3a00000200",
        ),
        (
            "free_with_no_segment_at_all",
            with_trace(json!([]), vec![entry("free_requested", json!(A), 512)]),
            "free of unknown address",
        ),
        (
            "overlapping_segments",
            with_trace(
                json!([]),
                vec![seg_alloc.clone(), entry("segment_alloc", json!(A + MIB), 20 * MIB)],
            ),
            "overlaps",
        ),
        (
            "segment_freed_under_live_blocks",
            with_trace(
                json!([]),
                vec![
                    seg_alloc.clone(),
                    entry("alloc", json!(A), 512),
                    entry("segment_free", json!(A), 20 * MIB),
                ],
            ),
            "still allocated",
        ),
        (
            // One trace list referenced 1000 times through the memo, each holding one entry
            // referenced 1000 times: 10^6 entries from a 4 KB file.
            "memo_shared_trace_bomb",
            {
                let mut v = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](]\x94(}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrJ\x00\x00\x01\x00\x8c\x04sizeM\x00\x02u".to_vec();
                v.extend(b"h\x01".repeat(999));
                v.push(b'e');
                v.extend(b"h\x00".repeat(999));
                v.extend(b"eu.");
                v
            },
            "more records than the file could hold",
        ),
        (
            // A frame list that contains itself (a cycle through the memo).
            "frames_contain_themselves",
            b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]]}\x94(\x8c\x06action\x8c\x05alloc\x8c\x04addrK\x00\x8c\x06frames]\x94h\x01auaau.".to_vec(),
            "not a PyTorch memory snapshot",
        ),
        (
            "frames_not_a_list",
            with_trace(json!([]), vec![json!({"action": "alloc", "addr": A, "size": 512, "frames": "top"})]),
            "'frames' is a string, expected a list",
        ),
        (
            // One string or bytes object of 12 GiB declared: refused before it is read.
            "one_huge_bytes_object",
            {
                let mut v = b"\x80\x04\x8e".to_vec();
                v.extend((12u64 << 30).to_le_bytes());
                v.extend([0u8; 64]);
                v
            },
            "string or bytes object of 12884901888 bytes",
        ),
        (
            // Two segments at one address would count its bytes twice as reserved.
            "two_segments_at_one_address",
            pickle(&json!({"segments": [seg(A, 2 * MIB, json!([])), seg(A, 2 * MIB, json!([]))],
                "device_traces": []})),
            "two segments at one address, 0x7f3a00000000",
        ),
        (
            // Segments whose sizes overlap: reserved would pass 2^64 in the old sum.
            "overlapping_segments_in_the_end_state",
            pickle(&json!({"segments": [seg(A, 1 << 62, json!([])), seg(A + MIB, 1 << 62, json!([]))],
                "device_traces": []})),
            "overlaps segment 0x7f3a00100000",
        ),
        (
            // Blocks older than the trace, freed at overlapping addresses with sizes of 2^62
            // each: four of them wrapped `allocated` to 0. (The segment is now the largest a
            // device can hold, 1 PiB, and the blocks 2^48: they still overlap.)
            "old_blocks_overlap_and_wrap_allocated",
            with_trace(
                json!([seg(A, 1 << 50, json!([]))]),
                (0..4)
                    .map(|i| entry("free_requested", json!(A + i * 4096), 1 << 48))
                    .collect(),
            ),
            "overlaps the live block",
        ),
        (
            // An old block larger than the segment it lies in: allocated above reserved.
            "old_block_larger_than_its_segment",
            with_trace(
                json!([seg(A, 8192, json!([]))]),
                vec![entry("free_requested", json!(A + 4096), MIB)],
            ),
            "a block of 1048576 bytes at 0x7f3a00001000 (freed in the trace) runs past its segment",
        ),
        (
            "double_free",
            with_trace(
                json!([]),
                vec![
                    seg_alloc.clone(),
                    entry("alloc", json!(A), 512),
                    entry("free_requested", json!(A), 512),
                    entry("free_completed", json!(A), 512),
                    entry("free_requested", json!(A), 512),
                ],
            ),
            "double free at 0x7f3a00000000: entry 4 frees a block that entry 2 already freed",
        ),
        (
            "alloc_without_address",
            with_trace(
                json!([]),
                vec![seg_alloc, json!({"action": "alloc", "size": 512})],
            ),
            "without 'addr'",
        ),
    ]
}

#[test]
fn every_hostile_snapshot_gives_one_line_exit_2_and_writes_nothing() {
    let cases = corpus();
    assert!(cases.len() >= 15);
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes, expect) in cases {
        let file = dir.path().join(format!("{name}.pickle"));
        std::fs::write(&file, &bytes).unwrap();
        let outs: Vec<PathBuf> = ["json", "csv", "png"]
            .iter()
            .map(|e| dir.path().join(format!("{name}-out.{e}")))
            .collect();
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .arg("report")
            .arg(&file)
            .arg("--json")
            .arg(&outs[0])
            .arg("--csv")
            .arg(&outs[1])
            .arg("--png")
            .arg(&outs[2])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{name}.pickle:")),
            "{name} must be named: {stderr}"
        );
        assert!(
            stderr.contains(expect),
            "{name}: expected '{expect}' in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        for o in &outs {
            assert!(!o.exists(), "{name}: {} was written", o.display());
        }
        // The library gives the same error, as a value.
        let err = vramscope::report::snapshot::read_bytes(&file, &bytes).unwrap_err();
        assert!(
            matches!(err, vramscope::Error::Snapshot { .. }),
            "{name}: {err}"
        );
    }
}

#[test]
#[ignore]
fn write_corpus() {
    let Some(dir) = std::env::var_os("VRAMSCOPE_WRITE_CORPUS") else {
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes, _) in corpus() {
        if bytes.len() < 1 << 16 {
            std::fs::write(dir.join(format!("{name}.pickle")), bytes).unwrap();
        }
    }
    for f in ["snapshot_small.pickle", "snapshot_truncated.pickle"] {
        std::fs::write(dir.join(f), fixture(f)).unwrap();
    }
}

#[test]
fn a_snapshot_path_that_is_a_fifo_or_a_directory_is_named_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("snap.pickle");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for (path, kind) in [
        (fifo, "a FIFO (named pipe)"),
        (dir.path().to_path_buf(), "a directory"),
    ] {
        // A read of the FIFO would block forever: the command must answer at once.
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .arg("report")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("snapshot is {kind}, expected a regular file")),
            "{stderr}"
        );
    }
}

/// Pickles that cost the reader memory far beyond their size (memo ids far apart, a file of
/// empty dicts): under an address-space limit that the old reader ran out of, `report` must
/// refuse them in one line (exit 2) or read them, never abort. The reader's bound is
/// 16 x the file + 64 MiB (`READ_MULTIPLE`, `READ_BASE_BYTES`).
#[test]
fn memory_hungry_pickles_stay_within_the_readers_bound_under_ulimit_v() {
    // Memo ids 4096 apart: a dense memo grows 4096 slots per 6-byte PUT (3 GiB for this
    // 200 KB file); the sparse one grows by one entry.
    let mut memo_ids = b"\x80\x04}".to_vec();
    for i in 0..33_000u32 {
        memo_ids.extend(b"N");
        memo_ids.push(b'r');
        memo_ids.extend((i * 4096).to_le_bytes());
        memo_ids.push(b'0');
    }
    memo_ids.push(b'.');
    // 8 MB of EMPTY_DICT in one list: ~110 bytes of memory each.
    let mut dicts = b"\x80\x04](".to_vec();
    dicts.extend(std::iter::repeat_n(b'}', 8 << 20));
    dicts.extend(b"e.");
    let cases: [(&str, Vec<u8>, &str); 2] = [
        (
            "memo_ids_far_apart",
            memo_ids,
            "neither 'segments' nor 'device_traces'",
        ),
        (
            "empty_dicts",
            dicts,
            "decoding it would take more than 201326688 bytes of memory (16x the file's 8388614 bytes + 64 MiB)",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes, expect) in cases {
        let file = dir.path().join(format!("{name}.pickle"));
        std::fs::write(&file, &bytes).unwrap();
        let json = dir.path().join(format!("{name}.json"));
        let out = Command::new("bash")
            .arg("-c")
            .arg("ulimit -v 1048576 && exec \"$0\" report \"$1\" --json \"$2\"")
            .arg(env!("CARGO_BIN_EXE_vramscope"))
            .arg(&file)
            .arg(&json)
            .env("MALLOC_ARENA_MAX", "2")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{name}: {stderr}");
        assert!(stderr.contains(&format!("{name}.pickle:")), "{stderr}");
        assert!(
            stderr.contains(expect),
            "{name}: expected '{expect}' in {stderr}"
        );
        assert!(!json.exists());
    }
}

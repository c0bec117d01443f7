//! `--vllm 380e1863` is today's behaviour, byte for byte: vLLM's test_profile run (OPT-125m on a
//! mocked 10 GiB GPU) and Llama-3-8B int8 on a simulated H100 give the session JSON and stdout
//! that main gave before releases were data (commit eb7d5bd), less what is a clock reading.
//!
//! The fingerprints were taken with eb7d5bd's binary:
//! `VRAMSCOPE_FINGERPRINT_BIN=path/to/old/vramscope cargo test --test vllm_default_release -- --nocapture`
//! prints that binary's fingerprints (run without `--vllm`, which it did not have).

use std::path::Path;
use std::process::Command;

/// FNV-1a, 64 bits: a fingerprint that does not depend on the Rust release.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Keys whose values are clock readings or the build's name, and the one key added since
/// eb7d5bd (`device.total_source`, which says where the simulated total comes from and
/// changes no number).
const VOLATILE: &[&str] = &[
    "wall_time_s",
    "created_unix_s",
    "tool",
    "time_us",
    "start_us",
    "end_us",
    "total_source",
];

fn strip(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for k in VOLATILE {
                m.remove(*k);
            }
            m.values_mut().for_each(strip);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
        _ => {}
    }
}

/// The run's JSON (volatile keys removed, keys sorted) and stdout (less its last line, the
/// event count and the run's duration in seconds), fingerprinted.
fn fingerprints(bin: &Path, args: &[&str]) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let out = Command::new(bin)
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    strip(&mut v);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let kept: String = stdout
        .lines()
        .filter(|l| !l.ends_with(" s"))
        .map(|l| format!("{l}\n"))
        .collect();
    (
        fnv(serde_json::to_string(&v).unwrap().as_bytes()),
        fnv(kept.as_bytes()),
    )
}

const RUNS: &[(&str, &[&str], (u64, u64))] = &[
    (
        "vLLM test_profile (OPT-125m, mocked 10 GiB GPU)",
        &[
            "profile",
            "--model",
            "preset:opt-125m",
            "--device",
            "sim:mock-10gib:dry",
            "--no-verify",
        ],
        // The JSON as eb7d5bd's; the summary's old-vs-new sentence now names the 8.1 MiB
        // workspace the pass keeps (it said no framework tensor survives: issue 51 item 9).
        (0x89ff7f780d57ae7a, 0x18e2569d35115453),
    ),
    (
        "Llama-3-8B int8 on a simulated H100",
        &[
            "profile",
            "--model",
            "preset:llama-3-8b",
            "--quant",
            "int8",
            "--device",
            "sim:h100-80gb:dry",
        ],
        (0xf363120661adbf03, 0x3187ed52bf61fdeb),
    ),
];

#[test]
fn the_default_release_is_todays_behaviour_byte_for_byte() {
    if let Some(old) = std::env::var_os("VRAMSCOPE_FINGERPRINT_BIN") {
        for (what, args, _) in RUNS {
            let (j, s) = fingerprints(Path::new(&old), args);
            println!("{what}: ({j:#018x}, {s:#018x})");
        }
        return;
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_vramscope"));
    for (what, args, expect) in RUNS {
        let mut with = args.to_vec();
        with.extend(["--vllm", "380e1863"]);
        assert_eq!(
            fingerprints(bin, &with),
            *expect,
            "{what} with --vllm 380e1863"
        );
        assert_eq!(fingerprints(bin, args), *expect, "{what} by default");
    }
}

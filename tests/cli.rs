//! The CLI as a user runs it: the acceptance scenarios of the core engine, and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const MIB: i64 = 1 << 20;

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .expect("run vramscope")
}

fn profile_json(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let mut all = vec!["profile", "--json", json.to_str().unwrap(), "-q"];
    all.extend_from_slice(args);
    let out = vramscope(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

fn formula<'a>(r: &'a Value, id: &str) -> &'a Value {
    r["formulas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap()
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

const LLAMA_8B_DRY: [&str; 8] = [
    "--model",
    "preset:llama-3-8b",
    "--device",
    "sim:h100-80gb:dry",
    "--tokens",
    "8192",
    "--quant",
    "fp16",
];

#[test]
fn fp16_weights_are_two_bytes_per_parameter() {
    let r = profile_json(&LLAMA_8B_DRY);
    assert_eq!(int(&r["model"]["parameters"]), 8_030_261_248);
    assert_eq!(int(&r["weights_bytes"]), 2 * 8_030_261_248);
    for key in ["t0", "t1", "t2", "t3"] {
        for field in ["free", "total", "allocated", "allocated_peak", "reserved"] {
            assert!(r["checkpoints"][key][field].is_u64(), "{key}.{field}");
        }
    }
    let ids: Vec<&str> = r["formulas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["v0_6_3", "pr9352", "pr9516", "pr10511", "pr12126"]);
    assert_eq!(
        r["passes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["verify_for"].is_null())
            .count(),
        3
    );
    assert!(int(&r["event_count"]) > 1000);
}

fn with_quant(q: &'static str) -> Vec<&'static str> {
    let mut a = LLAMA_8B_DRY.to_vec();
    a[7] = q;
    a
}

#[test]
fn old_formula_double_counts_surviving_int8_state() {
    let r = profile_json(&with_quant("int8"));
    let state = int(&r["quant_state_after_bytes"]);
    // CxB: about one byte per parameter of the quantized linears (~6.98e9 for Llama-3-8B).
    assert!(
        (6_900_000_000..7_100_000_000).contains(&state),
        "CxB alive after the pass: {state}"
    );
    let (old, new) = (formula(&r, "pr9352"), formula(&r, "pr9516"));
    assert_eq!(old["torch_peak_bytes"], new["torch_peak_bytes"]);
    // The old non-torch term holds the surviving state (already inside the torch peak) ...
    assert!(int(&old["non_torch_bytes"]) >= state);
    // ... the new one does not.
    assert!(int(&new["non_torch_bytes"]) < state / 4);
    // So the old budget is smaller by about the state, less the context it never sees.
    let context = int(&r["checkpoints"]["t0"]["total"]) - int(&r["checkpoints"]["t0"]["free"]);
    let gap = int(&new["kv_bytes"]) - int(&old["kv_bytes"]);
    assert!(
        (gap - (state - context)).abs() < 64 * MIB,
        "gap {gap}, state {state}, context {context}"
    );
    // The old formula wastes memory, by far more than the new one errs.
    assert!(int(&old["error_bytes"]) > 5 * 1024 * MIB);
    assert!(int(&new["error_bytes"]).abs() < 512 * MIB);
}

#[test]
fn timeline_shows_cxb_allocated_in_one_pass_and_freed_in_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let csv_path = dir.path().join("t.csv");
    let mut args = vec!["profile", "-q", "--csv", csv_path.to_str().unwrap()];
    args.extend(with_quant("int8"));
    assert!(vramscope(&args).status.success());
    let mut rdr = csv::Reader::from_path(&csv_path).unwrap();
    let mut cxb = std::collections::BTreeMap::<(String, String), i64>::new();
    for rec in rdr.records() {
        let rec = rec.unwrap();
        if rec[7] != *"quant-state" || !rec[6].ends_with(".CxB") {
            continue;
        }
        *cxb.entry((rec[2].to_string(), rec[3].to_string()))
            .or_default() += rec[8].parse::<i64>().unwrap();
    }
    let get = |pass: &str, kind: &str| {
        cxb.get(&(pass.to_string(), kind.to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert!(get("1", "alloc") > 6_900_000_000);
    assert_eq!(get("1", "free"), 0);
    // Generation 1: vLLM makes new states; the old CxB is freed and rebuilt in pass 2.
    assert_eq!(get("2", "free"), get("1", "alloc"));
    assert_eq!(get("2", "alloc"), get("1", "alloc"));
    // From generation 2 on the state is reused.
    assert_eq!(get("3", "alloc"), 0);
    assert!(dir.path().join("t.summary.csv").exists());
}

#[test]
fn nf4_non_torch_terms_differ_only_by_memory_outside_the_framework() {
    let r = profile_json(&with_quant("nf4"));
    assert_eq!(int(&r["quant_state_after_bytes"]), 0);
    let t1 = &r["checkpoints"]["t1"];
    let t3 = &r["checkpoints"]["t3"];
    // What survives the pass, as in PyTorch: the cuBLAS workspace (32 MiB on Hopper, taken
    // from the caching allocator at the first GEMM) and the sampler's SamplingTensors (seven
    // [256] vectors: 4,096 B in 512 B blocks), kept until the next pass.
    assert_eq!(
        int(&t3["allocated"]) - int(&t1["allocated"]),
        32 * MIB + 4096,
        "only the workspace and the sampling tensors survive the pass"
    );
    let (old, new) = (formula(&r, "pr9352"), formula(&r, "pr9516"));
    // new − old = U(t1) − A(t3): this instance's memory outside the framework at t1 (context)
    // plus the cached-but-unused part of its segments.
    let used_t1 = int(&t1["total"]) - int(&t1["free"]);
    let diff = int(&new["non_torch_bytes"]) - int(&old["non_torch_bytes"]);
    assert_eq!(diff, used_t1 - int(&t3["allocated"]));
    let context = int(&r["checkpoints"]["t0"]["total"]) - int(&r["checkpoints"]["t0"]["free"]);
    let cached_t1 = int(&t1["reserved"]) - int(&t1["allocated"]);
    assert_eq!(
        diff,
        context + cached_t1 - 32 * MIB - 4096,
        "diff {diff}, context {context}"
    );
}

#[test]
fn vllm_test_memory_profiling_is_reproduced() {
    let r = profile_json(&[
        "--model",
        "synthetic:512MiB:1GiB",
        "--device",
        "sim:h100-80gb",
        "--outside-before",
        "512MiB",
        "--outside-during",
        "256MiB",
    ]);
    let f = formula(&r, "pr10511");
    assert_eq!(int(&f["torch_peak_bytes"]), 1024 * MIB);
    let nt = int(&f["non_torch_bytes"]) as f64;
    assert!(
        (nt - 256.0 * MIB as f64).abs() <= 0.05 * 256.0 * MIB as f64,
        "non-torch increase {nt}"
    );
    assert_eq!(int(&r["weights_bytes"]), 512 * MIB);
    // #9516 charges the other process's 512 MiB (vLLM issue #10451), which the report keeps.
    assert_eq!(int(&r["other_process_bytes"]), 512 * MIB);
    assert!(int(&formula(&r, "pr9516")["non_torch_bytes"]) >= 512 * MIB + 256 * MIB);
}

#[test]
fn png_report_is_written_headless() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("r.png");
    let mut args = vec!["profile", "-q", "--png", png.to_str().unwrap()];
    args.extend(with_quant("int8"));
    let out = vramscope(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let img = image::open(&png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (1600, 1000));
    let distinct: std::collections::HashSet<_> = img.pixels().step_by(97).map(|p| p.0).collect();
    assert!(
        distinct.len() > 30,
        "report image looks blank: {} colours",
        distinct.len()
    );
}

#[test]
fn stdout_has_a_vllm_style_line_and_one_row_per_formula() {
    let mut args = vec!["profile"];
    args.extend(LLAMA_8B_DRY);
    let out = vramscope(&args);
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(
        s.contains("worker.py:260] Memory profiling results: total_gpu_memory="),
        "{s}"
    );
    for t in [
        "v0.6.3",
        "#9352",
        "#9516",
        "#10511",
        "#12126",
        "measured truth",
    ] {
        assert!(s.contains(t), "missing row {t}");
    }
}

// ---- bad input: exit code 2, one line naming the file and the problem, no output written ----

fn expect_clean_error(args: &[&str], must_contain: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    if !args.contains(&"--device") {
        all.extend(["--device", "sim:h100-80gb"]);
    }
    let out = vramscope(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for m in must_contain {
        assert!(err.contains(m), "'{m}' not in: {err}");
    }
    assert!(
        !json.exists(),
        "an output file was written despite the error"
    );
}

fn tiny_model(dir: &Path) -> PathBuf {
    vramscope::model::gen_model("tiny", dir, vramscope::model::weights::StoredDtype::F16, 1)
        .unwrap();
    dir.join("model.safetensors")
}

#[test]
fn missing_model_file() {
    expect_clean_error(
        &["profile", "--model", "/nonexistent/model.safetensors"],
        &["/nonexistent/model.safetensors", "not found"],
    );
}

#[test]
fn truncated_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny_model(dir.path());
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    expect_clean_error(
        &["profile", "--model", w.to_str().unwrap()],
        &["model.safetensors", "truncated"],
    );
}

#[test]
fn header_length_past_end_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny_model(dir.path());
    let mut bytes = std::fs::read(&w).unwrap();
    bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&w, &bytes).unwrap();
    expect_clean_error(
        &["profile", "--model", w.to_str().unwrap()],
        &["model.safetensors", "header length"],
    );
}

/// Rewrites the safetensors header JSON with `edit`, keeping the data.
fn edit_header(w: &Path, edit: impl FnOnce(&mut Value)) {
    let bytes = std::fs::read(w).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(w, out).unwrap();
}

/// The tiny model with `model.norm.weight`'s dtype rewritten in the header: a clean error.
fn norm_dtype_is_refused(dtype: &str, must_contain: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny_model(dir.path());
    edit_header(&w, |h| h["model.norm.weight"]["dtype"] = dtype.into());
    expect_clean_error(&["profile", "--model", w.to_str().unwrap()], must_contain);
}

#[test]
fn unknown_dtype() {
    norm_dtype_is_refused("F13", &["model.safetensors", "dtype"]);
}

#[test]
fn unsupported_dtype_names_the_tensor() {
    // U16 has the same size as F16, so the file stays consistent; the dtype is what is wrong.
    norm_dtype_is_refused("U16", &["model.norm.weight", "U16"]);
}

#[test]
fn tensor_shape_disagrees_with_config() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny_model(dir.path());
    let cfg_path = dir.path().join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["intermediate_size"] = 512.into();
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    expect_clean_error(
        &["profile", "--model", w.to_str().unwrap()],
        &["model.safetensors", "gate_proj", "shape"],
    );
}

#[test]
fn missing_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny_model(dir.path());
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    expect_clean_error(
        &["profile", "--model", w.to_str().unwrap()],
        &["config.json", "not found"],
    );
}

#[test]
fn nonsense_sizes_and_settings() {
    expect_clean_error(&["profile", "--outside-before", "12XB"], &["12XB"]);
    expect_clean_error(&["profile", "--outside-during", "lots"], &["lots"]);
    expect_clean_error(
        &["profile", "--tokens", "many"],
        &["--max-num-batched-tokens", "many"],
    );
    expect_clean_error(&["profile", "--util", "1.5"], &["--util"]);
    expect_clean_error(
        &["profile", "--tokens", "4", "--seqs", "8"],
        &["--max-num-seqs"],
    );
    expect_clean_error(&["profile", "--model", "preset:gpt-5"], &["gpt-5"]);
    expect_clean_error(&["profile", "--model", "synthetic:1GiB:huge"], &["huge"]);
}

#[test]
fn out_of_memory_is_an_error_not_a_panic() {
    // llama-3-70b in fp16 does not fit on a 24 GB card.
    expect_clean_error(
        &[
            "profile",
            "--model",
            "preset:llama-3-70b",
            "--device",
            "sim:l4-24gb:dry",
        ],
        &["out of memory"],
    );
}

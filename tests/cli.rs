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
    // Two bytes a parameter, plus vLLM's rotary cos_sin_cache (8192 positions × 128 × 2 B).
    assert_eq!(int(&r["weights_bytes"]), 2 * 8_030_261_248 + 8192 * 128 * 2);
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
        1,
        "vLLM's profile run is one pass"
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

/// `--quant fp4` quantizes in flight to bitsandbytes FP4 (f32 absmax per 64, no double
/// quantization): the tensors held are the 16-bit rest, the rotary cache, and per checkpoint
/// linear its packed nibbles, its absmax and its 16-entry f32 code book, and NF4's are its
/// nibbles, u8 absmax, nested f32 absmax per 256 blocks, code book and offset.
#[test]
fn fp4_in_flight_holds_nibbles_f32_absmax_and_a_code_book_per_linear() {
    let (h, kv, i, layers, vocab) = (4096i64, 1024i64, 14336i64, 32i64, 128256i64);
    let linears = [h * h, kv * h, kv * h, h * h, i * h, i * h, h * i];
    let p: i64 = linears.iter().sum::<i64>() * layers;
    let count = linears.len() as i64 * layers;
    // Embedding and lm_head (untied), 2L + 1 norms, in fp16; cos/sin cache of 8192 x 128 fp16.
    let rest = (2 * vocab * h + (2 * layers + 1) * h) * 2 + 8192 * 128 * 2;
    let fp4 = profile_json(&with_quant("fp4"));
    assert_eq!(fp4["quant"], "fp4");
    assert_eq!(
        int(&fp4["weights_tensor_bytes"]),
        rest + p / 2 + p / 64 * 4 + count * 16 * 4
    );
    let nf4 = profile_json(&with_quant("nf4"));
    assert_eq!(
        int(&nf4["weights_tensor_bytes"]),
        // nibbles, u8 absmax, f32 absmax of 256 absmax, code book, offset; one dynamic map
        rest + p / 2 + p / 64 + p / 64 / 256 * 4 + count * (16 * 4 + 4) + 256 * 4
    );
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

// ---- hardening (issue 14): files that are not files, numbers near 2^64, all-or-nothing
// exports, contradictions; every case exits 2 with one line and writes nothing ----

/// Runs vramscope and kills it after `secs`: a FIFO read that hangs fails the test instead of
/// hanging it.
fn vramscope_within(args: &[&str], secs: u64) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vramscope");
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed().as_secs() > secs {
            child.kill().unwrap();
            panic!("vramscope {args:?} still running after {secs} s (hung on a read?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn mkfifo(path: &Path) {
    let ok = Command::new("mkfifo").arg(path).status().unwrap().success();
    assert!(ok, "mkfifo {}", path.display());
}

/// `expect_clean_error` with a time limit, for inputs that used to hang.
fn expect_prompt_error(args: &[&str], must_contain: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let out = vramscope_within(&all, 60);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for m in must_contain {
        assert!(err.contains(m), "'{m}' not in: {err}");
    }
    assert!(
        !json.exists(),
        "an output file was written despite the error"
    );
}

#[test]
fn a_fifo_as_config_json_is_named_not_read() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let cfg = dir.path().join("config.json");
    std::fs::remove_file(&cfg).unwrap();
    mkfifo(&cfg);
    expect_prompt_error(
        &[
            "profile",
            "--model",
            dir.path().to_str().unwrap(),
            "--device",
            "sim:h100-80gb:dry",
        ],
        &["config.json", "FIFO", "expected a regular file"],
    );
}

#[test]
fn a_fifo_as_the_weights_is_named_not_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let w = tiny_model(dir.path());
    std::fs::remove_file(&w).unwrap();
    mkfifo(&w);
    expect_prompt_error(
        &[
            "profile",
            "--model",
            dir.path().to_str().unwrap(),
            "--device",
            "sim:h100-80gb:dry",
        ],
        &["model.safetensors", "FIFO"],
    );
}

#[test]
fn a_sparse_multi_gb_config_json_is_refused_by_its_size() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("config.json"))
        .unwrap();
    f.set_len(4 << 30).unwrap();
    expect_prompt_error(
        &[
            "profile",
            "--model",
            dir.path().to_str().unwrap(),
            "--device",
            "sim:h100-80gb:dry",
        ],
        &["config.json is 4.00 GiB", "more than the 16.0 MiB"],
    );
}

#[test]
fn dev_zero_as_compare_file_or_model_is_a_device() {
    expect_prompt_error(
        &[
            "bench",
            "--model",
            "preset:tiny",
            "--device",
            "sim:h100-80gb",
            "--tokens",
            "4",
            "--compare",
            "/dev/zero",
        ],
        &["/dev/zero", "character device"],
    );
    expect_prompt_error(
        &[
            "profile",
            "--model",
            "/dev/zero",
            "--device",
            "sim:h100-80gb:dry",
        ],
        &["/dev/zero", "not a model file"],
    );
}

#[test]
fn a_symlink_loop_is_not_called_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    expect_prompt_error(
        &[
            "profile",
            "--model",
            a.to_str().unwrap(),
            "--device",
            "sim:h100-80gb:dry",
        ],
        &["symlink loop"],
    );
}

#[test]
fn counts_and_sizes_near_two_to_the_64_are_refused_not_wrapped() {
    let max = "18446744073709551615";
    let dry = ["--device", "sim:h100-80gb:dry"];
    let run = |extra: &[&str], words: &[&str]| {
        let mut a = vec!["profile"];
        a.extend_from_slice(&dry);
        a.extend_from_slice(extra);
        expect_prompt_error(&a, words);
    };
    run(
        &["--tokens", max],
        &["--max-num-batched-tokens is 18446744073709551615, expected 1 to 1048576"],
    );
    run(
        &["--tokens", "1000000000000"],
        &["--max-num-batched-tokens is 1000000000000"],
    );
    run(&["--tokens", "16", "--seqs", max], &["--max-num-seqs"]);
    run(
        &["--max-model-len", max],
        &["--max-model-len is 18446744073709551615"],
    );
    run(&["--outside-before", max], &["1 PiB"]);
    run(&["--outside-during", max], &["1 PiB"]);
    run(&["--model", &format!("synthetic:{max}:1GiB")], &["1 PiB"]);
    run(&["--model", &format!("synthetic:1GiB:{max}")], &["1 PiB"]);
}

#[test]
fn an_empty_model_is_named_as_empty() {
    expect_prompt_error(&["profile", "--model", ""], &["--model is empty"]);
}

#[test]
fn bench_with_no_timed_pass_is_refused_not_nan() {
    expect_prompt_error(
        &[
            "bench",
            "--model",
            "preset:tiny",
            "--device",
            "sim:h100-80gb",
            "--tokens",
            "4",
            "--iters",
            "0",
        ],
        &["--iters is 0, expected 1 to 10000"],
    );
}

#[test]
fn non_numeric_compare_logits_are_named_not_nan() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("ref.json");
    std::fs::write(&f, r#"{"logits": [0.5, "x", 1.0]}"#).unwrap();
    expect_prompt_error(
        &[
            "bench",
            "--model",
            "preset:tiny",
            "--device",
            "sim:h100-80gb",
            "--tokens",
            "4",
            "--compare",
            f.to_str().unwrap(),
        ],
        &["ref.json", "logits[1] is \"x\", expected a finite number"],
    );
}

#[test]
fn a_json_array_or_a_session_file_as_config_json_says_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let cfg = dir.path().join("config.json");
    let model = dir.path().to_str().unwrap();
    std::fs::write(&cfg, "[1, 2, 3]").unwrap();
    expect_prompt_error(
        &["profile", "--model", model, "--device", "sim:h100-80gb:dry"],
        &["config.json holds a JSON array, expected an object"],
    );
    std::fs::write(&cfg, r#"{"format": 3, "events": [], "formulas": []}"#).unwrap();
    expect_prompt_error(
        &["profile", "--model", model, "--device", "sim:h100-80gb:dry"],
        &["model_type is missing", "is this a config.json?"],
    );
}

#[test]
fn config_contradictions_name_key_and_value() {
    let cases: [(&str, serde_json::Value, &str); 5] = [
        (
            "tie_word_embeddings",
            "yes".into(),
            "'tie_word_embeddings' is \"yes\" (a string), expected true or false",
        ),
        (
            "rms_norm_eps",
            0.into(),
            "'rms_norm_eps' is 0, expected a number above 0 and below 1",
        ),
        ("rms_norm_eps", 1e308.into(), "'rms_norm_eps' is 1e+308"),
        (
            "rope_theta",
            (-1.0).into(),
            "'rope_theta' is -1.0, expected a number above 1",
        ),
        (
            "hidden_size",
            128.5.into(),
            "'hidden_size' is 128.5 (a number), expected a positive integer",
        ),
    ];
    for (key, value, words) in cases {
        let dir = tempfile::tempdir().unwrap();
        tiny_model(dir.path());
        let cfg = dir.path().join("config.json");
        let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
        v[key] = value;
        std::fs::write(&cfg, v.to_string()).unwrap();
        expect_prompt_error(
            &[
                "profile",
                "--model",
                dir.path().to_str().unwrap(),
                "--device",
                "sim:h100-80gb:dry",
            ],
            &["config.json", words],
        );
    }
}

#[test]
fn fewer_layers_in_config_than_in_the_weights_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let cfg = dir.path().join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["num_hidden_layers"] = 2.into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    expect_prompt_error(
        &[
            "profile",
            "--model",
            dir.path().to_str().unwrap(),
            "--device",
            "sim:h100-80gb:dry",
        ],
        &[
            "model.safetensors",
            "num_hidden_layers is 2 but the weights hold layer 3",
        ],
    );
}

#[test]
fn an_int8_threshold_word_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    vramscope::model::gen_model_with(
        "tiny",
        dir.path(),
        &vramscope::model::GenOptions {
            dtype: vramscope::model::weights::StoredDtype::F16,
            seed: 0,
            shards: 1,
            bnb_int8: true,
            bnb_skip_modules: Vec::new(),
        },
    )
    .unwrap();
    let cfg = dir.path().join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["quantization_config"]["llm_int8_threshold"] = "six".into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    expect_prompt_error(
        &[
            "profile",
            "--model",
            dir.path().to_str().unwrap(),
            "--device",
            "sim:h100-80gb:dry",
            "--quant",
            "int8",
        ],
        &["config.json", "'llm_int8_threshold' is \"six\" (a string)"],
    );
}

/// Lists what a folder holds (names), to show an export wrote nothing there.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn exports_are_all_or_nothing_when_one_target_cannot_be_written() {
    // /proc exists and is a folder, but no file can be created there, even by root: the
    // PNG fails after the JSON and CSV were rendered.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.csv"));
    let out = vramscope_within(
        &[
            "profile",
            "--model",
            "preset:tiny",
            "--device",
            "sim:h100-80gb:dry",
            "--tokens",
            "16",
            "--max-model-len",
            "16",
            "--max-num-seqs",
            "16",
            "-q",
            "--json",
            a.to_str().unwrap(),
            "--csv",
            b.to_str().unwrap(),
            "--png",
            "/proc/vramscope-c.png",
        ],
        120,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("/proc/vramscope-c.png"), "{err}");
    assert_eq!(names_in(dir.path()), Vec::<String>::new(), "{err}");
}

#[test]
fn exports_to_a_read_only_folder_write_nothing_anywhere() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::write(ro.join("probe"), b"x").is_ok() {
        eprintln!("skipped: this user (root?) can write into a read-only folder");
        return;
    }
    let a = dir.path().join("a.json");
    let out = vramscope_within(
        &[
            "profile",
            "--model",
            "preset:tiny",
            "--device",
            "sim:h100-80gb:dry",
            "--tokens",
            "16",
            "--max-model-len",
            "16",
            "--max-num-seqs",
            "16",
            "-q",
            "--json",
            a.to_str().unwrap(),
            "--csv",
            ro.join("b.csv").to_str().unwrap(),
        ],
        120,
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(names_in(dir.path()), vec!["ro".to_string()]);
    assert!(names_in(&ro).is_empty());
}

#[test]
fn exports_to_a_full_disk_write_nothing_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    // A 16 KiB tmpfs is full long before a session JSON fits. Needs root (CAP_SYS_ADMIN).
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"])
        .arg(&full)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)");
        return;
    }
    let b = dir.path().join("b.csv");
    let out = vramscope_within(
        &[
            "profile",
            "--model",
            "preset:tiny",
            "--device",
            "sim:h100-80gb:dry",
            "--tokens",
            "16",
            "--max-model-len",
            "16",
            "--max-num-seqs",
            "16",
            "-q",
            "--csv",
            b.to_str().unwrap(),
            "--json",
            full.join("a.json").to_str().unwrap(),
        ],
        120,
    );
    let listed = names_in(&full);
    let _ = Command::new("umount").arg(&full).status();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(listed.is_empty(), "{listed:?}");
    assert_eq!(names_in(dir.path()), vec!["full".to_string()], "{err}");
}

#[test]
fn the_same_file_for_two_exports_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.csv");
    let summary = dir.path().join("a.summary.csv");
    let out = vramscope_within(
        &[
            "profile",
            "--model",
            "preset:tiny",
            "--device",
            "sim:h100-80gb:dry",
            "--tokens",
            "16",
            "--max-model-len",
            "16",
            "--max-num-seqs",
            "16",
            "-q",
            "--csv",
            a.to_str().unwrap(),
            "--json",
            summary.to_str().unwrap(),
        ],
        120,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("asked for by two exports"));
    assert!(names_in(dir.path()).is_empty());
}

#[test]
fn compute_mode_beyond_host_memory_is_refused_with_the_numbers() {
    // llama-3-8b in compute mode keeps ~32 GiB of f32 weights in host RAM; under a 1.5 GiB
    // address-space limit that is refused up front, with the numbers.
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let run = |extra: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -v 1572864 && exec {bin} profile --model preset:llama-3-8b --device sim:h100-80gb:compute --tokens 16 --max-model-len 16 --max-num-seqs 16 {extra}"
            ))
            .output()
            .unwrap()
    };
    let out = run("");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("of host memory"), "{err}");
    assert!(err.contains("--allow-host-memory"), "{err}");
}

#[test]
fn compute_mode_says_its_host_memory_and_time_before_it_starts() {
    let out = vramscope_within(
        &[
            "profile",
            "--model",
            "preset:tiny",
            "--device",
            "sim:h100-80gb:compute",
            "--tokens",
            "16",
            "--max-model-len",
            "16",
            "--max-num-seqs",
            "16",
            "--passes",
            "1",
            "--no-verify",
        ],
        120,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("estimated host memory"), "{err}");
    assert!(err.contains("compute time about"), "{err}");
}

fn with_kv_dtype(dtype: &'static str) -> Vec<&'static str> {
    let mut a = LLAMA_8B_DRY.to_vec();
    a.extend(["--kv-cache-dtype", dtype]);
    a
}

#[test]
fn fp8_kv_cache_halves_the_block_and_about_doubles_the_blocks() {
    let auto = profile_json(&LLAMA_8B_DRY);
    // Llama-3-8B: 32 layers, 8 KV heads of 128; vLLM's block of 16 tokens; K and V.
    let elements = 2 * 16 * 32 * 8 * 128;
    // "auto" is the default and left out of the session, which then reads as before.
    assert!(auto["settings"].get("kv_cache_dtype").is_none());
    assert_eq!(int(&auto["kv_geometry"]["dtype_bytes"]), 2);
    for name in ["fp8", "fp8_e4m3", "fp8_e5m2"] {
        let fp8 = profile_json(&with_kv_dtype(name));
        assert_eq!(fp8["settings"]["kv_cache_dtype"], name);
        assert_eq!(int(&fp8["kv_geometry"]["dtype_bytes"]), 1, "{name}");
        // The profile pass does not touch the cache: the same budget, twice the blocks.
        let (a, f) = (formula(&auto, "pr9516"), formula(&fp8, "pr9516"));
        assert_eq!(a["kv_bytes"], f["kv_bytes"], "{name}");
        let kv = int(&a["kv_bytes"]);
        assert_eq!(int(&a["kv_blocks"]), kv / (2 * elements));
        assert_eq!(int(&f["kv_blocks"]), kv / elements);
        let (ab, fb) = (int(&a["kv_blocks"]), int(&f["kv_blocks"]));
        assert!(fb == 2 * ab || fb == 2 * ab + 1, "{ab} vs {fb}");
        // The verify pass allocates exactly the blocks granted, one byte per element.
        assert_eq!(int(&f["verify"]["kv_allocated_bytes"]), fb * elements);
        assert_eq!(int(&a["verify"]["kv_allocated_bytes"]), ab * 2 * elements);
    }
}

#[test]
fn a_session_from_before_kv_cache_dtype_and_total_source_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("new.json");
    let out = vramscope(&[
        "profile",
        "--model",
        "preset:tiny",
        "--device",
        "sim:h100-80gb:dry",
        "-q",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // An "auto" cache is not written at all (sessions of the default read as before).
    assert!(v["settings"]
        .as_object_mut()
        .unwrap()
        .remove("kv_cache_dtype")
        .is_none());
    v["device"]
        .as_object_mut()
        .unwrap()
        .remove("total_source")
        .unwrap();
    let old = dir.path().join("old.json");
    std::fs::write(&old, serde_json::to_vec(&v).unwrap()).unwrap();
    let r = vramscope::report::export::json::read(&old).unwrap();
    assert_eq!(
        r.settings.kv_cache_dtype,
        vramscope::profile::request::KvCacheDtype::Auto
    );
    assert_eq!(r.settings.device.total_override(), None);
}

#[test]
fn total_flag_sets_what_the_simulated_gpu_reports() {
    let given = vramscope::base::units::parse_bytes("22.03GiB").unwrap();
    let preset = profile_json(&["--model", "preset:tiny", "--device", "sim:l4:dry"]);
    let custom = profile_json(&[
        "--model",
        "preset:tiny",
        "--device",
        "sim:l4:dry",
        "--total",
        "22.03GiB",
    ]);
    let l4 = vramscope::device::presets::find("l4").unwrap();
    assert_eq!(
        int(&preset["checkpoints"]["t0"]["total"]),
        l4.total_bytes as i64
    );
    assert!(preset["device"]["total_source"]
        .as_str()
        .unwrap()
        .contains("estimated"));
    assert_eq!(int(&custom["checkpoints"]["t0"]["total"]), given as i64);
    assert_eq!(int(&custom["settings"]["device"]["total"]), given as i64);
    assert!(custom["device"]["total_source"]
        .as_str()
        .unwrap()
        .contains("--total"));
    // The same instance; only T·u moved.
    let (p, c) = (formula(&preset, "pr9516"), formula(&custom, "pr9516"));
    assert_eq!(p["non_kv_bytes"], c["non_kv_bytes"]);
    assert_ne!(p["kv_bytes"], c["kv_bytes"]);
}

#[test]
fn bad_total_and_kv_cache_dtype_are_one_line_errors_naming_the_flag() {
    expect_clean_error(&["profile", "--total", "lots"], &["--total", "lots"]);
    expect_clean_error(&["profile", "--total", "1KiB"], &["--total"]);
    expect_clean_error(&["profile", "--total", "2PiB"], &["--total"]);
    expect_clean_error(
        &["profile", "--device", "cuda:0", "--total", "80GiB"],
        &["--total", "cuda:0"],
    );
    expect_clean_error(
        &["profile", "--kv-cache-dtype", "fp4"],
        &["--kv-cache-dtype", "fp4"],
    );
    expect_clean_error(
        &["profile", "--topology", "infiniband"],
        &["--topology", "infiniband", "pcie-no-p2p"],
    );
    expect_clean_error(
        &["profile", "--device", "cuda:0", "--topology", "pcie"],
        &["--topology", "cuda:0"],
    );
}

#[test]
fn a_tensor_parallel_session_says_where_its_nccl_entries_come_from() {
    let v = profile_json(&[
        "--model",
        "preset:tiny",
        "--device",
        "sim:l40s:dry",
        "--tp",
        "2",
        "--topology",
        "pcie-no-p2p",
    ]);
    let src = v["nccl_source"].as_str().unwrap();
    assert!(
        src.contains("--topology pcie-no-p2p") && src.contains("host memory"),
        "{src}"
    );
    // One GPU: no NCCL, no key.
    let one = profile_json(&["--model", "preset:tiny", "--device", "sim:l40s:dry"]);
    assert!(one.get("nccl_source").is_none());
}

#[test]
fn old_preset_names_keep_their_totals_and_new_ones_simulate_vllms() {
    for (old, new) in [("h100-80gb", "h100-sxm"), ("h200-141gb", "h200")] {
        let o = profile_json(&[
            "--model",
            "preset:tiny",
            "--device",
            &format!("sim:{old}:dry"),
        ]);
        let n = profile_json(&[
            "--model",
            "preset:tiny",
            "--device",
            &format!("sim:{new}:dry"),
        ]);
        let (op, np) = (
            vramscope::device::presets::find(old).unwrap(),
            vramscope::device::presets::find(new).unwrap(),
        );
        assert_eq!(int(&o["checkpoints"]["t0"]["total"]), op.smi_bytes as i64);
        assert_eq!(
            int(&n["checkpoints"]["t0"]["total"]),
            np.mem_get_info_bytes as i64
        );
        assert_eq!(op.mem_get_info_bytes, np.mem_get_info_bytes);
    }
}

#[test]
fn devices_lists_every_preset_with_both_totals_and_the_source() {
    let out = vramscope(&["devices"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // A source names a public document, never a path of the machine it was written on.
    for machine in ["/work/", "/home/", "/root/", "/tmp/"] {
        assert!(!text.contains(machine), "{machine} in:\n{text}");
    }
    use vramscope::base::units::fmt_u;
    for p in vramscope::device::presets::SIM_PRESETS {
        let spec = format!("sim:{} ", p.id);
        let line = text
            .lines()
            .find(|l| l.starts_with(&spec))
            .unwrap_or_else(|| panic!("{} not listed:\n{text}", p.id));
        for part in [
            fmt_u(p.mem_get_info_bytes),
            fmt_u(p.smi_bytes),
            p.total_source.into(),
        ] {
            assert!(line.contains(&part), "{part} not in: {line}");
        }
    }
}

/// Runs `vramscope ARGS` in `dir` (relative export paths resolve there).
fn vramscope_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run vramscope")
}

const TINY_DRY: [&str; 7] = [
    "profile",
    "--model",
    "preset:tiny",
    "--device",
    "sim:h100-80gb:dry",
    "-q",
    "--no-verify",
];

#[test]
fn one_file_spelled_two_ways_by_two_exports_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let mut args = TINY_DRY.to_vec();
    args.extend(["--json", "out/o.json", "--png", "./out/o.json"]);
    let out = vramscope_in(dir.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("the same file is asked for by two exports (out/o.json and ./out/o.json)"),
        "{err}"
    );
    assert!(names_in(&dir.path().join("out")).is_empty());
}

#[test]
fn a_derived_name_past_name_max_is_refused_before_any_file_is_written() {
    // The CSV's own name fits in 255 bytes; its summary's (NAME.summary.csv) does not.
    let dir = tempfile::tempdir().unwrap();
    let csv = format!("{}.csv", "t".repeat(247));
    let mut args = TINY_DRY.to_vec();
    args.extend(["--json", "ok.json", "--csv", &csv]);
    let out = vramscope_in(dir.path(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "the file name is 259 bytes, longer than the 255 a file name may have (NAME_MAX)"
        ),
        "{err}"
    );
    assert!(
        names_in(dir.path()).is_empty(),
        "{:?}",
        names_in(dir.path())
    );
}

/// Under an address-space limit, a dry run whose event logs (every rank's) do not fit is
/// refused up front with the numbers, and one that fits runs: never an abort.
#[test]
fn a_dry_run_past_ulimit_v_is_refused_counting_every_rank_and_runs_when_it_fits() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let run = |args: &str| {
        Command::new("bash")
            .arg("-c")
            .arg(format!("ulimit -v 1048576 && exec {bin} profile -q {args}"))
            .env("MALLOC_ARENA_MAX", "2")
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let out = run(
        "--model preset:llama-3-70b --device sim:h200:dry --passes 1000 --tp 8 --json big.json --csv big.csv",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("8 rank(s)"), "{err}");
    assert!(err.contains("the address-space limit (ulimit -v)"), "{err}");
    assert!(!err.contains("memory allocation of"), "{err}");
    assert!(names_in(dir.path()).is_empty());
    // A small run under the same limit is not refused.
    let out = run("--model preset:tiny --device sim:h100-80gb:dry --tokens 16 --max-model-len 16 --max-num-seqs 16 --json small.json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("small.json").exists());
}

#[test]
fn batch_settings_vllm_refuses_are_refused_with_vllms_reason() {
    let dry = [
        "--model",
        "preset:llama-3-8b",
        "--device",
        "sim:h100-80gb:dry",
    ];
    let run = |extra: &[&str], words: &[&str]| {
        let mut a = vec!["profile"];
        a.extend_from_slice(&dry);
        a.extend_from_slice(extra);
        expect_prompt_error(&a, words);
    };
    run(
        &["--max-model-len", "0"],
        &["--max-model-len 0: it must be at least 1"],
    );
    run(
        &["--max-num-batched-tokens", "0"],
        &["--max-num-batched-tokens 0: it must be at least 1"],
    );
    run(
        &["--max-num-seqs", "0"],
        &["--max-num-seqs 0: it must be at least 1 (vLLM's max_num_seqs)"],
    );
    // Llama-3-8B's max_position_embeddings is 8192.
    run(
        &["--max-model-len", "16384"],
        &[
            "User-specified max_model_len (16384) is greater than the derived max_model_len (max_position_embeddings=8192",
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
        ],
    );
    run(
        &[
            "--max-num-batched-tokens",
            "1024",
            "--max-model-len",
            "4096",
        ],
        &["ValueError: max_num_batched_tokens (1024) is smaller than max_model_len (4096)"],
    );
    // cuda:2^64-2 with --tp 2 used to wrap past the GPU count.
    expect_prompt_error(
        &[
            "profile",
            "--model",
            "preset:tiny",
            "--device",
            "cuda:18446744073709551614",
            "--tp",
            "2",
        ],
        &["needs GPUs cuda:18446744073709551614..cuda:18446744073709551615"],
    );
}

#[test]
fn a_long_max_model_len_runs_when_vllms_override_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "profile",
            "--model",
            "preset:llama-3-8b",
            "--device",
            "sim:h100-80gb:dry",
            "--max-model-len",
            "16384",
            "--no-verify",
            "-q",
            "--json",
            json.to_str().unwrap(),
        ])
        .env("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert_eq!(int(&r["settings"]["max_model_len"]), 16384);
    assert_eq!(int(&r["settings"]["tokens"]), 16384);
}

#[test]
fn a_default_batch_too_large_is_said_as_the_configs_doing_not_a_flags() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let cfg = dir.path().join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["max_position_embeddings"] = (1u64 << 22).into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    expect_prompt_error(
        &[
            "profile",
            "--model",
            dir.path().to_str().unwrap(),
            "--device",
            "sim:h100-80gb:dry",
            "--enable-chunked-prefill",
            "false",
        ],
        &[
            "vLLM's default batch here is max(max_model_len, 2048) = 4194304 tokens, with max_model_len from the model's max_position_embeddings (4194304)",
        ],
    );
}

/// `explain` as a user runs it: a public log gives the table; a hostile one one line, exit 2.
#[test]
fn explain_prints_the_table_or_one_line_and_exit_2() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-logs");
    let p6 = fixtures.join("p6-0.6.4-llama-3.1-8b-rtx3090.log");
    let out = vramscope(&["explain", p6.to_str().unwrap(), "--no-what-if"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("peak torch memory"), "{text}");
    assert!(text.contains("17.06 GiB"), "{text}");
    assert!(text.contains("largest difference: "), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.log");
    let two = std::fs::read_to_string(&p6).unwrap();
    std::fs::write(
        &bad,
        format!(
            "{two}{}",
            two.replace("Llama-3.1-8B-Instruct", "Llama-3.1-70B")
        ),
    )
    .unwrap();
    for path in [bad.clone(), dir.path().join("missing.log")] {
        let out = vramscope(&["explain", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains(path.file_name().unwrap().to_str().unwrap()),
            "{err}"
        );
    }
}

/// `plan -- vllm serve …` runs the line and names what it cannot model.
#[test]
fn plan_runs_a_pasted_vllm_line() {
    let out = vramscope(&[
        "plan",
        "--vllm",
        "0.19",
        "--no-verify",
        "--",
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.95",
        "--speculative-config",
        "{}",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("assumed: --speculative-config {} (a draft model")
            && err.contains(": not modelled"),
        "{err}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Available KV cache memory"), "{text}");
}

/// The plan lines README.md and docs/cli.md show, as written: with no profile option before
/// it, the `--` is the argument parser's, and the words after it are still the pasted line.
#[test]
fn the_documented_plan_lines_run_as_written() {
    let cache = tempfile::tempdir().unwrap();
    for line in [
        "plan -- vllm serve Qwen/Qwen2.5-32B-Instruct -tp 2 --max-model-len 10000 --gpu-memory-utilization 0.9",
        "plan --vllm 0.19 --device sim:h100-sxm:dry -- vllm serve meta-llama/Llama-3.1-8B-Instruct",
        "plan --vllm 0.33 -- vllm serve meta-llama/Llama-3.1-8B-Instruct",
        "plan --vllm 0.19 --device sim:l4:dry -- VLLM_PP_LAYER_PARTITION=20,16 vllm serve Qwen/Qwen3-8B -pp 2 --max-model-len 8192",
        "plan --vllm 0.26 --device sim:l4:dry -- vllm bench latency --model Qwen/Qwen2.5-7B-Instruct --max-model-len 32768",
    ] {
        let words: Vec<&str> = line.split(' ').collect();
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&words)
            .env("HF_HUB_CACHE", cache.path())
            .output()
            .expect("run vramscope");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{line}: {err}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("KV cache"), "{line}: {text}");
    }
}

/// A model of which only config.json is here runs dry on `--device sim:PRESET` (the form
/// docs/cli.md shows); `:compute` still asks for its weights, naming the file.
#[test]
fn a_config_only_model_runs_dry_on_a_simulated_device_with_no_mode() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1024}"#,
    )
    .unwrap();
    let model = dir.path().to_str().unwrap();
    let r = profile_json(&["--model", model, "--device", "sim:h100-sxm", "--no-verify"]);
    assert_eq!(r["device"]["mode"], "dry", "{}", r["device"]);
    assert_eq!(r["device"]["spec"], "sim:h100-sxm:dry");
    let out = vramscope(&[
        "profile",
        "--model",
        model,
        "--device",
        "sim:h100-sxm:compute",
        "--no-verify",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config.json") && err.contains("needs the weights"),
        "{err}"
    );
}

/// Each "what would change the answer" row is one line: a run's KV, or why it was not run in
/// one clause (src/app/explain.rs's `first_clause` test holds the clause). Q1 is a 0.19 log:
/// online fp8 halves the weights' 15 GiB and the KV grows by about what that frees.
#[test]
fn explains_what_ifs_are_one_line_each() {
    let q1 = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-logs/q1-0.19-llama-3.1-8b-h100.log");
    let out = vramscope(&["explain", q1.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("what would change"))
        .skip(1)
        .collect();
    assert!(rows.len() >= 4, "{text}");
    let fp8 = rows
        .iter()
        .find(|r| r.contains("--quantization fp8"))
        .unwrap();
    assert!(fp8.contains("KV ") && fp8.contains("(+1"), "{fp8}");
    assert!(fp8.len() < 160, "{fp8}");
    assert!(
        rows.iter()
            .all(|r| r.contains("KV ") || r.contains("not run: ")),
        "{text}"
    );
}

// ---- hardening, third round (issue 50): every file `plan` and `explain` open goes through
// the guarded reads; each case returns within 10 s, under a 2 GiB address-space limit, with
// exit 2 and one stderr line naming the file and the problem ----

/// Runs vramscope under `ulimit -v` 2 GiB (as CI does) with `HF_HUB_CACHE` set to `cache`,
/// killed after 10 s; expects exit 2 and one stderr line holding each of `must_contain`.
fn expect_guarded_refusal(cache: &Path, args: &[&str], must_contain: &[&str]) {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 2097152 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .env("HF_HUB_CACHE", cache)
        .env("HOME", cache)
        .env_remove("HF_HOME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vramscope");
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed().as_secs() >= 10 {
            child.kill().unwrap();
            panic!("vramscope {args:?} still running after 10 s (blocked on a read?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    for m in must_contain {
        assert!(err.contains(m), "'{m}' not in: {err}");
    }
}

/// A model folder `m` in `dir` whose config.json is made by `make`.
fn model_dir_with_config(dir: &Path, make: impl FnOnce(&Path)) -> String {
    let m = dir.join("m");
    std::fs::create_dir(&m).unwrap();
    make(&m.join("config.json"));
    m.to_str().unwrap().to_string()
}

#[test]
fn plan_with_a_fifo_as_config_json_is_refused_not_blocked_on() {
    let dir = tempfile::tempdir().unwrap();
    let m = model_dir_with_config(dir.path(), mkfifo);
    expect_guarded_refusal(
        dir.path(),
        &["plan", "-q", "--", "vllm", "serve", &m],
        &[
            "config.json",
            "a FIFO (named pipe), expected a regular file",
        ],
    );
}

#[cfg(unix)]
#[test]
fn plan_with_config_json_linked_to_dev_zero_is_refused_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let m = model_dir_with_config(dir.path(), |c| {
        std::os::unix::fs::symlink("/dev/zero", c).unwrap()
    });
    expect_guarded_refusal(
        dir.path(),
        &["plan", "-q", "--", "vllm", "serve", &m],
        &["config.json", "a character device"],
    );
}

#[test]
fn plan_with_a_sparse_2_gib_config_json_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let m = model_dir_with_config(dir.path(), |c| {
        std::fs::File::create(c).unwrap().set_len(2 << 30).unwrap()
    });
    expect_guarded_refusal(
        dir.path(),
        &["plan", "-q", "--", "vllm", "serve", &m],
        &["config.json is 2.00 GiB", "more than the 16.0 MiB"],
    );
}

#[test]
fn explain_of_dev_zero_is_refused_as_a_device() {
    let dir = tempfile::tempdir().unwrap();
    expect_guarded_refusal(
        dir.path(),
        &["explain", "/dev/zero", "--no-what-if"],
        &["/dev/zero", "log is a character device"],
    );
}

#[test]
fn explain_of_a_fifo_log_is_refused_not_blocked_on() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("f.log");
    mkfifo(&log);
    expect_guarded_refusal(
        dir.path(),
        &["explain", log.to_str().unwrap(), "--no-what-if"],
        &["f.log", "log is a FIFO (named pipe)"],
    );
}

#[test]
fn explain_with_the_models_config_json_a_fifo_is_refused_not_blocked_on() {
    let dir = tempfile::tempdir().unwrap();
    let m = model_dir_with_config(dir.path(), mkfifo);
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-logs");
    // q1's log with its dtype left out: the dtype is then config.json's.
    let q1 = std::fs::read_to_string(fixtures.join("q1-0.19-llama-3.1-8b-h100.log")).unwrap();
    let log = dir.path().join("no-dtype.log");
    std::fs::write(&log, q1.replace("dtype=torch.bfloat16, ", "")).unwrap();
    expect_guarded_refusal(
        dir.path(),
        &[
            "explain",
            log.to_str().unwrap(),
            "--model",
            &m,
            "--no-what-if",
        ],
        &["config.json", "a FIFO (named pipe)"],
    );
}

/// An HF cache folder holding `models--someone--model` whose `refs/main` is made by `make`.
fn hub_cache_with_ref(cache: &Path, make: impl FnOnce(&Path)) {
    let repo = cache.join("models--someone--model");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots/abc")).unwrap();
    make(&repo.join("refs/main"));
}

#[test]
fn a_fifo_as_the_hub_caches_refs_main_is_refused_not_blocked_on() {
    let cache = tempfile::tempdir().unwrap();
    hub_cache_with_ref(cache.path(), mkfifo);
    expect_guarded_refusal(
        cache.path(),
        &["plan", "-q", "--", "vllm", "serve", "someone/model"],
        &["refs/main is a FIFO (named pipe), expected a regular file"],
    );
}

#[cfg(unix)]
#[test]
fn the_hub_caches_refs_main_linked_to_dev_zero_is_refused_not_read() {
    let cache = tempfile::tempdir().unwrap();
    hub_cache_with_ref(cache.path(), |r| {
        std::os::unix::fs::symlink("/dev/zero", r).unwrap()
    });
    expect_guarded_refusal(
        cache.path(),
        &["plan", "-q", "--", "vllm", "serve", "someone/model"],
        &["refs/main is a character device"],
    );
}

#[test]
fn a_fifo_as_a_hub_snapshots_config_json_is_refused_not_skipped_for_the_preset() {
    let cache = tempfile::tempdir().unwrap();
    let snap = cache
        .path()
        .join("models--meta-llama--Llama-3.1-8B-Instruct/snapshots/abc");
    std::fs::create_dir_all(&snap).unwrap();
    mkfifo(&snap.join("config.json"));
    expect_guarded_refusal(
        cache.path(),
        &[
            "plan",
            "-q",
            "--",
            "vllm",
            "serve",
            "meta-llama/Llama-3.1-8B-Instruct",
        ],
        &["snapshots/abc/config.json", "a FIFO (named pipe)"],
    );
}

// ---- numbers in a log read exactly, and a log cut inside a number line (issue 50) ----

fn public_log(name: &str) -> String {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-logs");
    std::fs::read_to_string(fixtures.join(name)).unwrap()
}

/// `explain` of `log` (written to a file) exits 2 with one line holding each of `must_contain`.
fn explain_refuses(log: &str, must_contain: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vllm.log");
    std::fs::write(&path, log).unwrap();
    expect_guarded_refusal(
        dir.path(),
        &["explain", path.to_str().unwrap(), "--no-what-if"],
        must_contain,
    );
}

/// The 0.6.4 log (p6) with its memory line's `key=VALUE` changed.
fn p6_with(key: &str, old: &str, new: &str) -> String {
    let log = public_log("p6-0.6.4-llama-3.1-8b-rtx3090.log");
    let (from, to) = (format!("{key}={old}"), format!("{key}={new}"));
    assert!(log.contains(&from), "{from}");
    log.replace(&from, &to)
}

#[test]
fn a_kv_cache_size_past_f64_is_refused_as_an_overflow_not_read_as_one() {
    explain_refuses(
        &p6_with("kv_cache_size", "3.81GiB", "1e309GiB"),
        &["vllm.log: line 8: kv_cache_size '1e309GiB' is too large to be a size (overflow)"],
    );
}

#[test]
fn a_kv_cache_size_with_an_exponent_is_read_whole_and_checked() {
    explain_refuses(
        &p6_with("kv_cache_size", "3.81GiB", "1e3GiB"),
        &["KV cache 1e3 GiB on a 23.58 GiB GPU"],
    );
}

#[test]
fn a_tiny_utilization_is_read_exactly_not_as_one() {
    // 0.6.4: one memory line; util 1e-300 leaves no room for its 3.81 GiB of KV cache.
    explain_refuses(
        &p6_with("gpu_memory_utilization", "0.90", "1e-300"),
        &["KV cache 3.81 GiB is more than gpu_memory_utilization 1e-300"],
    );
    // V1: the non-default args say 1e-300, the requested-memory line 0.95.
    let q1 = public_log("q1-0.19-llama-3.1-8b-h100.log").replace(
        "'gpu_memory_utilization': 0.95",
        "'gpu_memory_utilization': 1e-300",
    );
    explain_refuses(
        &q1,
        &["line 7: gpu_memory_utilization 0.95, but 1e-300 earlier"],
    );
}

#[test]
fn a_block_count_past_64_bits_is_refused_not_saturated() {
    let log = public_log("p6-0.6.4-llama-3.1-8b-rtx3090.log").replace(
        "# GPU blocks: 1952",
        "# GPU blocks: 99999999999999999999999",
    );
    explain_refuses(
        &log,
        &["line 9: # GPU blocks '99999999999999999999999' does not fit a 64-bit count (overflow)"],
    );
}

#[test]
fn nan_and_negative_numbers_are_named_not_called_cut_short() {
    explain_refuses(
        &p6_with("kv_cache_size", "3.81GiB", "nanGiB"),
        &["line 8: kv_cache_size 'nanGiB' is NaN"],
    );
    explain_refuses(
        &p6_with("non_torch_memory", "0.35GiB", "-0.35GiB"),
        &["line 8: non_torch_memory '-0.35GiB' is negative"],
    );
    let log = public_log("p6-0.6.4-llama-3.1-8b-rtx3090.log")
        .replace("# GPU blocks: 1952", "# GPU blocks: -1952");
    explain_refuses(&log, &["line 9: # GPU blocks '-1952' is negative"]);
}

/// The log up to and including `keep` of its first line holding `keep`, with no newline after.
fn cut_after(log: &str, keep: &str) -> String {
    let at = log.find(keep).unwrap_or_else(|| panic!("{keep}")) + keep.len();
    log[..at].to_string()
}

#[test]
fn a_last_block_count_line_without_its_newline_is_refused_as_cut() {
    let log = cut_after(
        &public_log("p6-0.6.4-llama-3.1-8b-rtx3090.log"),
        "# GPU blocks: 19",
    );
    explain_refuses(
        &log,
        &[
            "line 9 is cut short: the log ends inside it",
            "# GPU blocks: 19",
        ],
    );
}

#[test]
fn a_v1_log_ending_inside_its_kv_memory_line_is_refused_as_cut() {
    let log = cut_after(
        &public_log("q1-0.19-llama-3.1-8b-h100.log"),
        "Available KV cache memory: 58.",
    );
    explain_refuses(
        &log,
        &["line 11 is cut short", "Available KV cache memory: 58."],
    );
}

/// `explain --json FILE` writes what it prints as data: the log's release, vramscope's run,
/// every term side by side (Q1: 476,016 logged KV tokens against vramscope's), the largest
/// difference and the what-ifs.
#[test]
fn explain_writes_its_comparison_as_json() {
    let q1 = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-logs/q1-0.19-llama-3.1-8b-h100.log");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("q1.json");
    let out = vramscope(&[
        "explain",
        q1.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["release"], "0.19.0");
    let terms = v["terms"].as_array().unwrap();
    let tokens = terms.iter().find(|t| t["term"] == "KV tokens").unwrap();
    assert_eq!(tokens["vllm"].as_f64(), Some(476_016.0));
    assert_eq!(tokens["unit"], "count");
    let ours = tokens["vramscope"].as_f64().unwrap();
    assert_eq!(v["vramscope"]["kv"]["count"].as_f64(), Some(ours));
    assert!((ours / 476_016.0 - 1.0).abs() < 0.01, "{ours}");
    assert!(v["largest_difference"].as_str().is_some());
    let what_if = v["what_if"].as_array().unwrap();
    assert!(what_if.len() >= 4);
    let fp8 = what_if
        .iter()
        .find(|w| w["change"] == "--quantization fp8")
        .unwrap();
    assert!(fp8["result"].is_object(), "{fp8}");
    // The printed table is the same with or without the file.
    let plain = vramscope(&["explain", q1.to_str().unwrap()]);
    assert_eq!(plain.stdout, out.stdout);
}

// ---- vLLM's grammar, contradictions and one-line refusals (issue 50, the rest) ----

/// Runs vramscope as `expect_guarded_refusal` does (2 GiB address space, 10 s, `HF_HUB_CACHE`
/// = `cache`), with the data segment (the heap and anonymous maps) also limited to `data_kib`
/// where given.
fn run_bounded(cache: &Path, args: &[&str], data_kib: Option<u64>) -> Output {
    let limits = match data_kib {
        Some(kib) => format!("ulimit -v 2097152 && ulimit -d {kib}"),
        None => "ulimit -v 2097152".to_string(),
    };
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("{limits} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .env("HF_HUB_CACHE", cache)
        .env("HOME", cache)
        .env_remove("HF_HOME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vramscope");
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed().as_secs() >= 10 {
            child.kill().unwrap();
            panic!("vramscope {args:?} still running after 10 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `plan --json` of a pasted line (after `--`): the settings of the run it made.
fn plan_settings(line: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("plan.json");
    let mut args = vec![
        "plan",
        "-q",
        "--device",
        "sim:h100-80gb:dry",
        "--json",
        json.to_str().unwrap(),
        "--",
    ];
    args.extend(line.split(' '));
    let out = run_bounded(dir.path(), &args, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{line}: {err}");
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    v["settings"].clone()
}

#[test]
fn plan_takes_a_repeated_flags_last_value_as_vllms_argparse_does() {
    let s = plan_settings(
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 4096 --max_model_len 2k \
         -tp 1 --tensor-parallel-size 2 --gpu-memory-utilization 0.8 --gpu-memory-utilization=0.85",
    );
    assert_eq!(s["max_model_len"], 2000, "{s}");
    assert_eq!(s["tp"], 2, "{s}");
    assert_eq!(s["util"], 0.85, "{s}");
}

#[test]
fn plan_reads_lengths_with_vllms_human_readable_int() {
    let s = plan_settings("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 8K");
    assert_eq!(s["max_model_len"], 8192, "{s}");
    let s = plan_settings("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 8k");
    assert_eq!(s["max_model_len"], 8000, "{s}");
    let dir = tempfile::tempdir().unwrap();
    for (v, words) in [
        (
            "1.5K",
            "--max-model-len '1.5K': vLLM refuses it (argument --max-model-len: Decimals are not allowed with binary suffixes like K. Did you mean to use 1.5k instead?)",
        ),
        (
            "1e3",
            "--max-model-len '1e3': vLLM refuses it (argument --max-model-len: invalid human_readable_int value: '1e3')",
        ),
    ] {
        expect_guarded_refusal(
            dir.path(),
            &[
                "plan",
                "--",
                "vllm",
                "serve",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--max-model-len",
                v,
            ],
            &[words],
        );
    }
}

/// A model folder `m` in `dir` holding `config` as its config.json.
fn model_with_config(dir: &Path, config: &str) -> String {
    model_dir_with_config(dir, |c| std::fs::write(c, config).unwrap())
}

#[test]
fn plan_refuses_a_4bit_method_on_a_16_bit_checkpoint_as_vllm_does() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(&dir.path().join("m16"));
    let m = m.to_str().unwrap();
    for method in ["-q=awq_marlin", "--quantization=gptq"] {
        let name = &method[method.find('=').unwrap() + 1..];
        expect_guarded_refusal(
            dir.path(),
            &["plan", "--", "vllm", "serve", m, method],
            &[&format!(
                "vLLM refuses it: the checkpoint is not quantized (config.json has no quantization_config, no quantize_config.json beside it): \"ValueError: Cannot find the config file for {name}\""
            )],
        );
    }
}

/// compressed-tensors is read for its fp8 w8a8 schemes: a config that says only the method
/// is refused naming what it lacks, and the help says which schemes run.
#[test]
fn compressed_tensors_names_what_its_config_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let m = model_with_config(
        dir.path(),
        r#"{"model_type": "llama", "hidden_size": 128, "intermediate_size": 384,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1024,
            "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "compressed-tensors"}}"#,
    );
    expect_guarded_refusal(
        dir.path(),
        &[
            "plan",
            "--",
            "vllm",
            "serve",
            &m,
            "--quantization",
            "compressed-tensors",
        ],
        &["quantization_config (compressed-tensors): config_groups is missing"],
    );
    let help = vramscope(&["profile", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("(compressed-tensors: its fp8"), "{help}");
}

#[test]
fn a_plan_refusal_is_one_line_without_the_notes_before_it() {
    // The hub id's preset and the default release are notes; the batch below max_model_len
    // with chunked prefill off is refused after them.
    let dir = tempfile::tempdir().unwrap();
    expect_guarded_refusal(
        dir.path(),
        &[
            "plan",
            "--vllm",
            "0.6.4",
            "--",
            "vllm",
            "serve",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--max-model-len",
            "8192",
            "--max-num-batched-tokens",
            "4096",
            "--no-enable-chunked-prefill",
        ],
        &["max_num_batched_tokens (4096) is smaller than max_model_len (8192)"],
    );
}

/// Issue 50: a batch below max_model_len with chunked prefill off was accepted when only the
/// batch flag was given. vLLM takes max_model_len from the model (8192 for Llama-3-8B) and
/// refuses the start (0.6.3 vllm/config.py L1023-1032; V1 with `--enable-chunked-prefill
/// false`: 0.19.0 config/scheduler.py L259-270), whichever command describes it.
#[test]
fn a_batch_below_the_models_length_with_chunked_prefill_off_is_refused_as_vllm_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let vllm_says = "max_num_batched_tokens (512) is smaller than max_model_len (8192)";
    for args in [
        &[
            "profile",
            "--tokens",
            "512",
            "--device",
            "sim:h100-80gb:dry",
        ][..],
        &[
            "profile",
            "--max-num-batched-tokens",
            "512",
            "--vllm",
            "0.8",
        ][..],
        &[
            "profile",
            "--tokens",
            "512",
            "--vllm",
            "0.19",
            "--enable-chunked-prefill",
            "false",
        ][..],
        &[
            "plan",
            "--",
            "vllm",
            "serve",
            "meta-llama/Meta-Llama-3-8B",
            "--max-num-batched-tokens",
            "512",
        ][..],
        &[
            "plan",
            "--vllm",
            "0.19",
            "--",
            "vllm",
            "serve",
            "meta-llama/Meta-Llama-3-8B",
            "--max-num-batched-tokens",
            "512",
            "--no-enable-chunked-prefill",
        ][..],
    ] {
        expect_guarded_refusal(
            dir.path(),
            args,
            &[
                vllm_says,
                "(give --max-model-len 512 or --enable-chunked-prefill true)",
            ],
        );
    }
    // The flag named fixes it: vLLM starts with either.
    for extra in [
        &["--max-model-len", "512"][..],
        &["--enable-chunked-prefill", "true"][..],
    ] {
        let mut args = vec!["profile", "-q", "--tokens", "512"];
        args.extend(extra);
        let out = vramscope(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // V1 chunks by default: the same batch starts.
    let out = vramscope(&["profile", "-q", "--tokens", "512", "--vllm", "0.19"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// V0 keeps vLLM's 256 sequences whatever batch is given, so a batch below 256 tokens with
/// `--max-num-seqs` left out is refused as vLLM refuses it ("max_num_batched_tokens (…) must
/// be greater than or equal to max_num_seqs (256)", 0.6.3 vllm/config.py L1034-1038; 0.8.5
/// L2033-2037); V1 takes min(its default, the batch) and starts.
#[test]
fn a_v0_batch_below_vllms_default_sequences_is_refused_as_vllm_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["profile", "--tokens", "64", "--max-model-len", "64"][..],
        &[
            "plan",
            "--vllm",
            "0.8",
            "--",
            "vllm",
            "serve",
            "meta-llama/Meta-Llama-3-8B",
            "--max-model-len",
            "128",
            "--max-num-batched-tokens",
            "128",
        ][..],
    ] {
        expect_guarded_refusal(
            dir.path(),
            args,
            &[
                "must be greater than or equal to max_num_seqs (256)",
                "(give --max-num-seqs",
            ],
        );
    }
    for args in [
        &[
            "profile",
            "-q",
            "--tokens",
            "64",
            "--max-model-len",
            "64",
            "--max-num-seqs",
            "64",
        ][..],
        &["profile", "-q", "--tokens", "64", "--vllm", "0.19"][..],
    ] {
        let out = vramscope(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// V1 with chunked prefill off and no batch given takes the release's own default: 0.11.0
/// max_model_len itself (engine/arg_utils.py L1667-1668), 0.15.1 on max(max_model_len, the
/// chunked default) (0.19.0 L2217-2222), where vramscope took the chunked default.
#[test]
fn v1_with_chunked_prefill_off_takes_the_releases_default_batch() {
    let header = |args: &[&str]| {
        let out = vramscope(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap()
            .to_string()
    };
    let v19 = header(&[
        "profile",
        "--vllm",
        "0.19",
        "--enable-chunked-prefill",
        "false",
        "--device",
        "sim:l40s:dry",
    ]);
    // An L40S (44.42 GiB): the chunked default is 2048 tokens and 256 sequences.
    assert!(v19.contains(": 8192 tokens in 256 seq(s)"), "{v19}");
    let v19_short = header(&[
        "profile",
        "--vllm",
        "0.19",
        "--enable-chunked-prefill",
        "false",
        "--max-model-len",
        "4096",
    ]);
    assert!(
        v19_short.contains(": 8192 tokens in 1024 seq(s)"),
        "{v19_short}"
    );
    let v11 = header(&[
        "profile",
        "--vllm",
        "0.11",
        "--enable-chunked-prefill",
        "false",
        "--max-model-len",
        "4096",
    ]);
    assert!(v11.contains(": 4096 tokens in 1024 seq(s)"), "{v11}");
}

#[test]
fn a_log_mixing_v0_and_v1_memory_lines_is_refused_naming_both() {
    let kv_line = public_log("q1-0.19-llama-3.1-8b-h100.log")
        .lines()
        .find(|l| l.contains("Available KV cache memory"))
        .unwrap()
        .to_string();
    let log = format!(
        "{}{kv_line}\n",
        public_log("p6-0.6.4-llama-3.1-8b-rtx3090.log")
    );
    explain_refuses(
        &log,
        &[
            "vllm.log: line 12: a V1 memory line",
            "after line 8's V0 memory line of 0.6.4 (\"Memory profiling results\")",
        ],
    );
}

#[test]
fn a_log_stating_two_values_for_one_quantity_is_refused_naming_both_lines() {
    let log = format!(
        "{}INFO 12-02 09:41:47 gpu_executor.py:113] # GPU blocks: 1953, # CPU blocks: 2048\n",
        public_log("p6-0.6.4-llama-3.1-8b-rtx3090.log")
    );
    explain_refuses(
        &log,
        &["vllm.log: line 12: GPU blocks 1953, but 1952 earlier (line 9): the log contradicts itself"],
    );
}

#[test]
fn max_num_batched_tokens_0_in_a_log_is_refused_at_its_line() {
    let log = public_log("q1-0.19-llama-3.1-8b-h100.log").replace(
        "'max_model_len': 8192",
        "'max_model_len': 8192, 'max_num_batched_tokens': 0",
    );
    explain_refuses(
        &log,
        &["vllm.log: line 2: max_num_batched_tokens 0: vLLM refuses 0"],
    );
}

/// `explain`'s refusals of what a log states name its lines and its own names for the
/// settings, with the log's name once and no flag the user never gave.
#[test]
fn explain_refusals_name_the_logs_lines_not_flags() {
    let q1 = public_log("q1-0.19-llama-3.1-8b-h100.log");
    let p6 = public_log("p6-0.6.4-llama-3.1-8b-rtx3090.log");
    let cases = [
        (
            q1.replace(
                "'max_model_len': 8192",
                "'max_model_len': 8192, 'max_num_seqs': 99999",
            ),
            "vllm.log: line 2, line 3: max_num_seqs 99999 must be between 1 and max_num_batched_tokens (8192)",
        ),
        (
            p6.replace("quantization=None", "quantization=gguf"),
            "vllm.log: line 4: quantization gguf: not modelled",
        ),
        (
            p6.replace("kv_cache_dtype=auto", "kv_cache_dtype=int4"),
            "vllm.log: line 4: kv_cache_dtype 'int4': expected auto, fp8",
        ),
        (
            p6.replace("dtype=torch.bfloat16", "dtype=torch.float32"),
            "vllm.log: line 4: vLLM 0.6.4 (the release the log ran) with dtype float32: float32 \
             is modelled for the V1 releases",
        ),
    ];
    for (log, words) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vllm.log");
        std::fs::write(&path, log).unwrap();
        let out = run_bounded(
            dir.path(),
            &["explain", path.to_str().unwrap(), "--no-what-if"],
            None,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(words), "'{words}' not in: {err}");
        assert_eq!(err.matches("invalid setting").count(), 1, "{err}");
        assert_eq!(err.matches("vllm.log").count(), 1, "{err}");
        assert!(!err.contains(" --"), "a flag named: {err}");
    }
}

/// 7.6 MiB of nested arrays in config.json: refused by counting before anything is built,
/// within 16x the file + 64 MiB of data segment (serde's values took 350 MiB).
#[test]
fn a_config_json_of_nested_arrays_is_refused_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = format!("{}0{},", "[".repeat(50), "]".repeat(50));
    let n = (76 << 20) / 10 / chunk.len();
    let config = format!(
        "{{\"model_type\": \"llama\", \"x\": [{}0]}}",
        chunk.repeat(n)
    );
    let m = model_with_config(dir.path(), &config);
    let kib = (16 * config.len() as u64 + (64 << 20)) >> 10;
    let out = run_bounded(dir.path(), &["plan", "--", "vllm", "serve", &m], Some(kib));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("config.json holds 3906452 arrays and objects"),
        "{err}"
    );
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-logs")
        .join(name)
}

/// `--pp 2 --tp 2` (and vLLM's spellings) list every rank with its stage and layers, as
/// docs/cli.md and docs/tensor-parallel.md show.
#[test]
fn profile_pp_lists_each_rank_with_its_stage() {
    for spelling in [
        &["--pp", "2"][..],
        &["--pipeline-parallel-size", "2"],
        &["-pp", "2"],
    ] {
        let mut args = vec![
            "profile",
            "--model",
            "preset:llama-3-70b",
            "--quant",
            "fp16",
            "--device",
            "sim:h100-80gb:dry",
            "--vllm",
            "0.19",
            "--tp",
            "2",
        ];
        // As docs/cli.md and docs/tensor-parallel.md show it (the first spelling).
        args.extend_from_slice(spelling);
        args.push("--no-verify");
        let out = vramscope(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("pipeline parallel over 2 stages of 2 GPU(s) (4 ranks)"),
            "{text}"
        );
        assert!(text.contains("rank 0 (stage 0, layers 0-39,"), "{text}");
        assert!(text.contains("rank 3 (stage 1, layers 40-79,"), "{text}");
        assert!(text.contains("GPU KV cache size"), "{text}");
    }
}

/// A pasted line's `-pp` and `VLLM_PP_LAYER_PARTITION` run as stages; every flag that changes
/// memory and is not modelled is named in one "assumed" line.
#[test]
fn plan_reads_pipeline_parallel_and_names_what_it_does_not_model() {
    let cache = tempfile::tempdir().unwrap();
    let line = "plan --vllm 0.19 --no-verify -- VLLM_PP_LAYER_PARTITION=20,16 vllm serve Qwen/Qwen3-8B -pp 2 --max-model-len 8192 --enable-lora --max-loras 4 --swap-space 4 --port 8000";
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(line.split(' '))
        .env("HF_HUB_CACHE", cache.path())
        .output()
        .expect("run vramscope");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rank 0 (stage 0, layers 0-19,"), "{text}");
    assert!(text.contains("rank 1 (stage 1, layers 20-35,"), "{text}");
    let assumed: Vec<&str> = err.lines().filter(|l| l.contains("assumed:")).collect();
    assert_eq!(assumed.len(), 1, "{err}");
    for flag in ["--enable-lora (", "--max-loras 4 (", "--swap-space 4 ("] {
        assert!(assumed[0].contains(flag), "{flag}: {err}");
    }
    assert!(assumed[0].contains("not modelled"), "{err}");
    assert!(!assumed[0].contains("--port"), "{err}");
}

/// `explain` on a pipeline-parallel log states PP and answers stage by stage.
#[test]
fn explain_states_pp_and_answers_per_stage() {
    let log = fixture("pp2-0.19-qwen3-8b-2xl4.log");
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "explain",
            log.to_str().unwrap(),
            "--device",
            "sim:l4:dry",
            "--no-what-if",
        ])
        .env("HF_HUB_CACHE", cache.path())
        .output()
        .expect("run vramscope");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("TP 1, PP 2"), "{text}");
    assert!(text.contains("pipeline parallel: 2 stages"), "{text}");
    let stage = |s: &str| {
        text.lines()
            .find(|l| l.starts_with(s))
            .unwrap_or_else(|| panic!("{s}: {text}"))
            .to_string()
    };
    assert!(stage("0 (layers 0-17)").contains("11.88 GiB"), "{text}");
    assert!(
        stage("1 (layers 18-35)").contains("(the engine's)"),
        "{text}"
    );
    assert!(!text.contains("assumed: enable"), "{text}");
}

/// A log that sets what vramscope does not model (LoRA, speculative decoding) names it in one
/// "assumed" line, and the largest difference is not blamed on anything else.
#[test]
fn explain_names_a_setting_it_does_not_model() {
    let text = std::fs::read_to_string(fixture("pp2-0.19-qwen3-8b-2xl4.log")).unwrap();
    let text = text
        .replace(
            "'pipeline_parallel_size': 2}",
            "'pipeline_parallel_size': 2, 'enable_lora': True, 'max_loras': 4, 'speculative_config': {'method': 'ngram', 'num_speculative_tokens': 3}}",
        )
        .replace("Model loading took 7.64 GiB", "Model loading took 8.64 GiB");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("lora.log");
    std::fs::write(&log, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "explain",
            log.to_str().unwrap(),
            "--device",
            "sim:l4:dry",
            "--no-what-if",
        ])
        .env("HF_HUB_CACHE", dir.path())
        .output()
        .expect("run vramscope");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let assumed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("not modelled"))
        .collect();
    assert_eq!(assumed.len(), 1, "{text}");
    for s in ["enable_lora=True", "max_loras=4", "speculative_config={"] {
        assert!(assumed[0].contains(s), "{s}: {text}");
    }
    assert!(!assumed[0].contains("num_speculative_tokens=3 ("), "{text}");
    let largest = text
        .lines()
        .find(|l| l.starts_with("largest difference"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        largest.contains("which vramscope does not model") && !largest.contains("tied embeddings"),
        "{largest}"
    );
}

/// With TP 2, the what-ifs include the same GPUs as two stages.
#[test]
fn explains_what_ifs_include_half_the_tp_twice_the_pp() {
    let text = std::fs::read_to_string(fixture("pp2-0.19-qwen3-8b-2xl4.log")).unwrap();
    let text = text
        .replace("'pipeline_parallel_size': 2", "'tensor_parallel_size': 2")
        .replace(
            "tensor_parallel_size=1, pipeline_parallel_size=2",
            "tensor_parallel_size=2, pipeline_parallel_size=1",
        )
        .replace("Worker_PP", "Worker_TP");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("tp2.log");
    std::fs::write(&log, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["explain", log.to_str().unwrap(), "--device", "sim:l4:dry"])
        .env("HF_HUB_CACHE", dir.path())
        .output()
        .expect("run vramscope");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.contains("--tensor-parallel-size 1 --pipeline-parallel-size 2"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("KV ") && row.contains("tokens"), "{row}");
}

// ---- failed starts (issue 49) ----

/// `plan -- vllm serve ./model --max-model-len 2048` exactly as a user types it, on a
/// gen-model folder and on a config-only one (which runs dry, and says so in its device), and
/// `plan vllm serve …` without the `--`, `-tp` included: the same answer.
#[test]
fn plan_runs_the_line_as_typed_with_or_without_the_double_dash() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["gen-model", "tiny", "model"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::create_dir(dir.path().join("cfg")).unwrap();
    std::fs::copy(
        dir.path().join("model/config.json"),
        dir.path().join("cfg/config.json"),
    )
    .unwrap();
    let run = |line: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(line.split(' '))
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{line}: {err}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    for m in ["./model", "./cfg"] {
        let with = run(&format!("plan -- vllm serve {m} --max-model-len 2048"));
        let without = run(&format!("plan vllm serve {m} --max-model-len 2048"));
        assert!(with.contains("KV cache blocks"), "{with}");
        // The same run (the event count and time line aside).
        let table = |t: &str| {
            t.lines()
                .filter(|l| !l.contains(" events, "))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(table(&with), table(&without));
    }
    let dry = run("plan --device sim:h100-sxm -- vllm serve ./cfg --max-model-len 2048");
    assert!(dry.contains("[simulated device]"), "{dry}");
    // -tp after the line's first word is the line's, not vramscope's spelling.
    let tp = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args("plan --vllm 0.19 vllm serve ./cfg -tp 2 --max-model-len 2048".split(' '))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&tp.stderr);
    assert!(tp.status.success(), "{err}");
    assert!(!err.contains("--tp 2 (not read"), "{err}");
    assert!(String::from_utf8_lossy(&tp.stdout).contains("tensor parallel over 2 GPUs"));
}

/// `explain` of a failed start: exit 0, the cause in one sentence naming the release and the
/// log's line, vLLM's own message with its source, the shortfall in GiB, and settings that
/// would start (each with its KV); no what-if printed as an error.
#[test]
fn explain_diagnoses_a_failed_start() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-logs/failed");
    // As docs/cli.md writes it, from the repository's root.
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(
            "explain tests/fixtures/vllm-logs/failed/0.19-free-memory-llama-3.1-8b-h100.log"
                .split(' '),
        )
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("vLLM 0.19 would not start (line 9): another process held GPU memory"),
        "{text}"
    );
    assert!(
        text.contains("(vLLM 0.19.0 v1/worker/utils.py L412-420)"),
        "{text}"
    );
    assert!(text.contains("short by 11.15 GiB"), "{text}");
    // The free memory allows 0.75 at start, but at 0.75 the sampler's warm-up after the KV
    // cache finds too little beside the other process's 19.07 GiB: one step lower starts.
    assert!(
        text.contains("--gpu-memory-utilization 0.74      KV "),
        "{text}"
    );
    assert!(!text.contains("not run"), "{text}");
    // A V0 log names its own release's words.
    let log = dir.join("0.6.4-tp2-one-gpu-llama-3.1-8b.log");
    let out = vramscope(&["explain", log.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("vLLM 0.6.4 says: \"AssertionError: please set tensor_parallel_size (2) to less than max local gpu count (1)\""),
        "{text}"
    );
}

/// `plan` says what vLLM would say before the start: a TP that does not divide the heads and a
/// max_model_len over the model's positions get vLLM's text for that release and exit 3;
/// another process's memory below util × total too; and a start that runs out of memory in
/// the CUDA graph capture after its KV cache says by how much, and that one step lower starts.
#[test]
fn plan_says_what_vllm_would_refuse_before_the_start() {
    let plan = |args: &str| {
        let out = vramscope(&args.split(' ').collect::<Vec<_>>());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) =
        plan("plan --vllm 0.19 -- vllm serve meta-llama/Llama-3.1-8B-Instruct -tp 3");
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("vLLM 0.19 says: \"ValueError: Total number of attention heads (32) must be divisible by tensor parallel size (3).\""), "{text}");
    assert!(
        text.contains("--tensor-parallel-size 1 or 2 or 4"),
        "{text}"
    );
    let (code, text) = plan(
        "plan --vllm 0.6.4 -- vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 200000",
    );
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.contains("This may lead to incorrect model outputs or CUDA errors."),
        "{text}"
    );
    let (code, text) = plan(
        "plan --vllm 0.19 --outside-before 20GiB -- vllm serve meta-llama/Llama-3.1-8B-Instruct",
    );
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.contains("on startup is less than desired GPU memory utilization (0.9, "),
        "{text}"
    );
    assert!(text.contains("short by 12.08 GiB"), "{text}");
    // Llama-3.1-8B at util 0.99 with 512 sequences on an H100: the graphs no longer fit.
    let (code, text) = plan(
        "plan --vllm 0.19 --device sim:h100-sxm:dry --no-verify -- vllm serve meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.99 --max-num-seqs 512 --max-model-len 8192",
    );
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.contains("ran out of memory in the CUDA graph capture after the KV cache"),
        "{text}"
    );
    let short: f64 = text
        .split("short by ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(short > 0.0 && short < 1.0, "{short}");
    assert!(
        text.contains("    --gpu-memory-utilization 0.98 "),
        "{text}"
    );
    // And at 0.98 it starts: exit 0, no diagnosis.
    let (code, text) = plan(
        "plan --vllm 0.19 --device sim:h100-sxm:dry --no-verify -- vllm serve meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.98 --max-num-seqs 512 --max-model-len 8192",
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("would not start"), "{text}");
}

/// `explain --json` and `plan --json` read back into the documented types unchanged, and
/// their keys are the ones docs/json.md lists.
#[test]
fn explain_and_plan_json_round_trip_and_match_their_documented_schema() {
    use vramscope::app::explain::{ExplainDoc, PlanDoc};
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/json.md"))
        .unwrap();
    let documented = |section: &str| -> Vec<String> {
        let part = doc.split(&format!("## {section}")).nth(1).unwrap();
        let part = part.split("\n## ").next().unwrap();
        part.lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .map(|l| l.split('`').next().unwrap().to_string())
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vllm-logs");
    for log in [
        "q1-0.19-llama-3.1-8b-h100.log",
        "failed/0.19-sampler-oom-llama-3.1-8b-h100.log",
    ] {
        let json = dir.path().join("e.json");
        let out = vramscope(&[
            "explain",
            fixtures.join(log).to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&json).unwrap();
        let parsed: ExplainDoc = serde_json::from_str(&text).unwrap();
        assert_eq!(
            serde_json::to_string_pretty(&parsed).unwrap(),
            text,
            "{log}"
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        let mut want = documented("explain --json");
        keys.sort();
        want.sort();
        assert_eq!(keys, want, "{log}");
        assert_eq!(v["started"], log.starts_with("q1"));
    }
    let json = dir.path().join("p.json");
    let out = vramscope(&[
        "plan",
        "-q",
        "--vllm",
        "0.19",
        "--device",
        "sim:h100-sxm:dry",
        "--json",
        json.to_str().unwrap(),
        "--",
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "-tp",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let text = std::fs::read_to_string(&json).unwrap();
    let parsed: PlanDoc = serde_json::from_str(&text).unwrap();
    assert_eq!(serde_json::to_string_pretty(&parsed).unwrap(), text);
    assert!(!parsed.starts);
    let v: Value = serde_json::from_str(&text).unwrap();
    let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    let mut want = documented("plan --json");
    keys.sort();
    want.sort();
    assert_eq!(keys, want);
}

/// `vramscope devices` names each preset's source without a path of anyone's machine.
#[test]
fn devices_prints_no_local_path() {
    let out = vramscope(&["devices"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for p in ["/home/", "/Users/", "/root/", "/tmp/", "C:\\"] {
        assert!(!text.contains(p), "{p} in: {text}");
    }
}

/// V1's sampler warm-up after the KV cache and the graphs (`compile_or_warm_up_model`, 0.19.0
/// v1/worker/gpu_worker.py L663-686): Llama-3-8B at util 0.99 on an H100 80GB runs out of
/// memory in it, as vLLM 0.19 does with "warming up sampler with 1024 dummy requests", and
/// `plan` says so in one line, with the shortfall and the utilization that leaves it room;
/// at that utilization it starts and prints the warm-up's peak and headroom. docs/cli.md
/// shows the first command as written here.
#[test]
fn plan_says_the_sampler_warm_up_runs_out_after_the_kv_cache() {
    let plan = |util: &str| {
        let out = vramscope(&[
            "plan",
            "--vllm",
            "0.19",
            "--device",
            "sim:h100-80gb:dry",
            "--no-verify",
            "--",
            "vllm",
            "serve",
            "meta-llama/Meta-Llama-3-8B",
            "--gpu-memory-utilization",
            util,
        ]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) = plan("0.99");
    assert_eq!(code, Some(3), "{text}");
    let line = text
        .lines()
        .find(|l| {
            l.contains(
                "the sampler warm-up (1024 dummy requests, [1024, 128256] logits) would run out \
                 of memory after the KV cache is allocated",
            )
        })
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" short, needing "), "{line}");
    let util = line
        .split("--gpu-memory-utilization ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    assert!(line.ends_with(&format!("--gpu-memory-utilization {util} leaves it room")));
    assert!(
        text.contains("vLLM 0.19 says: \"RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.\" (vLLM 0.19.0 v1/worker/gpu_model_runner.py L5599-5608"),
        "{text}"
    );
    let short: f64 = text
        .split("short by ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    // The warm-up needs the sampler's [1024, 128256] tensors (bf16 logits, then three fp32
    // ones: 1.71 GiB), and the capture left less than that.
    assert!(short > 0.0 && short < 1.71, "{short}");
    assert!(
        text.contains(&format!("    --gpu-memory-utilization {util} ")),
        "{text}"
    );
    let (code, text) = plan(&util);
    assert_eq!(code, Some(0), "{text}");
    let ok = text
        .lines()
        .find(|l| l.starts_with("sampler warm-up after the KV cache (vLLM 0.19"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(ok.contains(" of the device left"), "{ok}");
    assert!(ok.contains(", peak "), "{ok}");
}

/// gpt-oss-20b as published (MXFP4) under 0.19 on an H100 of 79.19 GiB: at util 0.95 the
/// sampler's warm-up after the KV cache runs out (vLLM's "CUDA out of memory occurred when
/// warming up sampler with 1024 dummy requests"), at 0.90 it starts. The command as docs/cli.md
/// writes it, then at 0.90.
#[test]
fn plan_sees_gpt_oss_20b_run_out_warming_up_its_sampler_at_0_95_on_an_h100() {
    let line = "plan --vllm 0.19 --device sim:h100-80gb --total 79.19GiB -- vllm serve openai/gpt-oss-20b --gpu-memory-utilization 0.95";
    let run = |line: &str| {
        let args: Vec<&str> = line.split(' ').collect();
        let out = vramscope(&args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) = run(line);
    assert_eq!(code, Some(3), "{text}");
    let diag = text
        .lines()
        .find(|l| {
            l.contains(
                "the sampler warm-up (1024 dummy requests, [1024, 201088] logits) would run out \
                 of memory after the KV cache is allocated",
            )
        })
        .unwrap_or_else(|| panic!("{text}"));
    // By how much: more than nothing, less than one fp32 copy of the logits (785.5 MiB).
    let short: f64 = diag
        .split("): ")
        .nth(1)
        .and_then(|s| s.split(" MiB short").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{diag}"));
    assert!(short > 0.0 && short < 785.5, "{diag}");
    assert!(diag.contains("leaves it room"), "{diag}");
    let (code, text) = run(&line.replace("0.95", "0.90"));
    assert_eq!(code, Some(0), "{text}");
    let ok = text
        .lines()
        .find(|l| l.starts_with("sampler warm-up after the KV cache (vLLM 0.19"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        ok.contains("[1024, 201088] logits, 785.5 MiB per f32 copy"),
        "{ok}"
    );
    assert!(ok.contains(" of the device left"), "{ok}");
}

/// Llama 4 Scout plans under the V1 releases whose fused MoE is modelled, and a V0 release is
/// refused by name, never with another family's message.
#[test]
fn plan_answers_llama_4_scout_under_v1_and_names_what_it_refuses() {
    let line = "plan --vllm 0.19 --device sim:h200 --tp 4 --max-model-len 131072 -- vllm serve meta-llama/Llama-4-Scout-17B-16E-Instruct";
    let run = |line: &str| {
        let args: Vec<&str> = line.split(' ').collect();
        let out = vramscope(&args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, text, err) = run(line);
    assert_eq!(code, Some(0), "{text}{err}");
    // 3 chunked groups and 1 full group of 12 layers each: tokens are blocks of the group
    // times 16, a multiple of 16.
    let tokens: u64 = text
        .lines()
        .find_map(|l| l.split("GPU KV cache size: ").nth(1))
        .and_then(|s| s.split(" tokens").next())
        .map(|s| s.replace(',', ""))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(tokens % 16, 0, "{tokens}");
    assert!((1_000_000..2_000_000).contains(&tokens), "{tokens}");
    // The vision tower is built and its encoder pass profiled (tests/multimodal.rs).
    assert!(
        text.contains("encoder (vision tower + projector): weights "),
        "{err}{text}"
    );
    let (code, _, err) = run(&line.replace("0.19", "0.8"));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("'llama4'") && err.contains("modelled under the V1 releases only"),
        "{err}"
    );
    assert!(!err.contains("qwen3.py"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // The tower and its profile are 0.19's through 0.33 (docs/reading/vllm-mm-towers-v021.md
    // §2): V1's runner to 0.28 (FlashInfer's CUTLASS experts on Hopper under 0.21), Model
    // Runner V2 from 0.29.
    for vllm in ["0.21", "0.28", "0.29", "0.33"] {
        let (code, text, err) = run(&line.replace("0.19", vllm));
        assert_eq!(code, Some(0), "{vllm}: {err}");
        assert!(
            text.contains("encoder (vision tower + projector): weights "),
            "{vllm}: {text}"
        );
    }
}

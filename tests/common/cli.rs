//! Running the `vramscope` binary from a test: its output, success with stderr shown, a tiny
//! gen-model checkpoint, and a dry or compute profile's JSON report.

use std::path::Path;
use std::process::{Command, Output};

/// `vramscope ARGS`, its output.
pub fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .expect("run vramscope")
}

/// Asserts the run succeeded, showing its stderr if not.
pub fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `gen-model tiny DIR` with `flags` (`--awq`, `--gptq`, `--ct-w4a16`, `--group-size N`, …).
pub fn gen_tiny(dir: &Path, flags: &[&str]) {
    let mut args = vec!["gen-model", "tiny", dir.to_str().unwrap()];
    args.extend_from_slice(flags);
    ok(&vramscope(&args));
}

/// `profile -q --json` of the checkpoint at `dir` under release `vllm` on `device`, 256 tokens
/// (max_model_len 256): the report as JSON.
pub fn profile_json_under(dir: &Path, device: &str, vllm: &str) -> serde_json::Value {
    let out_dir = tempfile::tempdir().unwrap();
    let json = out_dir.path().join("r.json");
    ok(&vramscope(&[
        "profile",
        "-q",
        "--json",
        json.to_str().unwrap(),
        "--model",
        dir.to_str().unwrap(),
        "--vllm",
        vllm,
        "--device",
        device,
        "--tokens",
        "256",
        "--max-model-len",
        "256",
    ]));
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

/// Last-token logits of `bench` in fp16 compute mode on `device` (64 tokens), its JSON report
/// written under `dir` as `TAG.json`.
pub fn bench_logits(model: &str, device: &str, dir: &Path, tag: &str) -> Vec<f64> {
    let json = dir.join(format!("{tag}.json"));
    ok(&vramscope(&[
        "bench",
        "--model",
        model,
        "--quant",
        "fp16",
        "--device",
        device,
        "--tokens",
        "64",
        "--json",
        json.to_str().unwrap(),
    ]));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// Relative L2 distance of `b` from `a`.
pub fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    d / a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// A timeline row of `plan --csv`'s first rank: (pass, kind, op, layer, tensor, bytes).
pub type Row = (u32, String, String, String, String, u64);

/// `vramscope plan -q --csv FILE --device DEVICE --vllm V -- vllm serve MODEL FLAGS…`: the
/// first rank's timeline rows.
pub fn plan_rows(device: &str, vllm: &str, model: &str, flags: &[&str]) -> Vec<Row> {
    let mut line = vec!["vllm", "serve", model];
    line.extend_from_slice(flags);
    let (code, err, rows) = plan_csv(device, vllm, &line);
    assert_eq!(code, Some(0), "{err}");
    rows
}

/// `vramscope plan -q --csv FILE --device DEVICE --vllm V -- LINE…` (the pasted line's
/// words): the exit code, stderr, and the first rank's timeline rows (none when it wrote no
/// timeline).
pub fn plan_csv(device: &str, vllm: &str, line: &[&str]) -> (Option<i32>, String, Vec<Row>) {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let mut args = vec![
        "plan",
        "-q",
        "--csv",
        csv.to_str().unwrap(),
        "--device",
        device,
        "--vllm",
        vllm,
        "--",
    ];
    args.extend_from_slice(line);
    let out = vramscope(&args);
    let rows = std::fs::read_to_string(&csv)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .map(csv_fields)
        .filter(|f| f.last().is_some_and(|r| r == "0"))
        .map(|f| {
            // seq,time_us,pass,kind,op,layer,tensor,category,bytes,…,rank (a tensor's label
            // may be quoted, with commas inside)
            (
                f[2].parse().unwrap(),
                f[3].clone(),
                f[4].clone(),
                f[5].clone(),
                f[6].clone(),
                f[8].parse().unwrap(),
            )
        })
        .collect();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
        rows,
    )
}

/// One CSV row's fields, a double-quoted field taken whole.
pub fn csv_fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

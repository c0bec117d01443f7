//! CSV: the timeline (one row per event, with the running totals) and a summary (one row per
//! formula, plus the measured truth).

use std::path::{Path, PathBuf};

use crate::base::error::Result;
use crate::profile::Report;
use crate::report::lifetimes::Analysis;

/// Writes records with the tensor-parallel rank they belong to as a last column (0 with one
/// GPU), so one file holds every rank.
struct RankRows<'a, W: std::io::Write> {
    w: &'a mut csv::Writer<W>,
    rank: u32,
}

impl<W: std::io::Write> RankRows<'_, W> {
    fn write_record<I, T>(&mut self, record: I) -> std::result::Result<(), csv::Error>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let mut v: Vec<String> = record.into_iter().map(|x| x.as_ref().to_string()).collect();
        v.push(self.rank.to_string());
        self.w.write_record(&v)
    }
}

/// The report of each rank (the report itself with one GPU).
fn each_rank(report: &Report) -> Vec<&Report> {
    if report.ranks.is_empty() {
        vec![report]
    } else {
        report.ranks.iter().collect()
    }
}

pub fn timeline_bytes(report: &Report) -> std::result::Result<Vec<u8>, csv::Error> {
    let mut v = Vec::new();
    write_timeline(report, &mut v)?;
    Ok(v)
}

/// The timeline, streamed row by row into `to` (one event's row in memory at a time).
pub fn write_timeline(
    report: &Report,
    to: impl std::io::Write,
) -> std::result::Result<(), csv::Error> {
    let mut out = csv::Writer::from_writer(to);
    let mut w = RankRows {
        w: &mut out,
        rank: 0,
    };
    w.w.write_record([
        "seq",
        "time_us",
        "pass",
        "kind",
        "op",
        "layer",
        "tensor",
        "category",
        "bytes",
        "allocated",
        "reserved",
        "device_used",
        "process_used",
        "rank",
    ])?;
    for r in each_rank(report) {
        w.rank = r.rank;
        for e in &r.events {
            w.write_record([
                e.seq.to_string(),
                e.time_us.to_string(),
                e.pass.to_string(),
                serde_json::to_value(e.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                e.op.clone(),
                e.layer.map(|l| l.to_string()).unwrap_or_default(),
                e.tensor.clone(),
                e.category.label().to_string(),
                e.bytes.to_string(),
                e.allocated.to_string(),
                e.reserved.to_string(),
                e.device_used.to_string(),
                e.process_used.to_string(),
            ])?;
        }
    }
    out.flush()?;
    Ok(())
}

pub fn summary_bytes(report: &Report) -> std::result::Result<Vec<u8>, csv::Error> {
    let mut v = Vec::new();
    write_summary(report, &mut v)?;
    Ok(v)
}

/// The summary, streamed into `to`.
pub fn write_summary(
    report: &Report,
    to: impl std::io::Write,
) -> std::result::Result<(), csv::Error> {
    let mut out = csv::Writer::from_writer(to);
    let mut w = RankRows {
        w: &mut out,
        rank: 0,
    };
    w.w.write_record([
        "id",
        "title",
        "torch_peak_bytes",
        "non_torch_bytes",
        "weights_term_bytes",
        "non_kv_bytes",
        "kv_bytes",
        "kv_blocks",
        "kv_tokens",
        "max_concurrency",
        "error_bytes",
        "verify_within_budget",
        "verify_overrun_bytes",
        "verify_oom",
        "verify_cache_releases",
        "simulated",
        "bytes",
        "freed_bytes",
        "rank",
    ])?;
    for r in each_rank(report) {
        w.rank = r.rank;
        summary_rows(r, &mut w)?;
    }
    // With tensor parallel, what the engine takes: the fewest blocks over the ranks, per
    // formula, in `kv_blocks`; the rank column names the rank that sets it.
    for e in &report.engine {
        w.rank = e.binding_rank;
        let mut row = vec![
            format!("engine_{}", e.key),
            format!(
                "{}: fewest blocks over {} ranks {:?}",
                e.title, report.tp, e.rank_blocks
            ),
        ];
        row.extend(std::iter::repeat_n(String::new(), 5));
        row.push(e.kv_blocks.to_string());
        row.extend(std::iter::repeat_n(String::new(), 10));
        w.write_record(row)?;
    }
    out.flush()?;
    Ok(())
}

/// One report's rows: a row per formula, the truth, then who owns the peak.
fn summary_rows<W: std::io::Write>(
    report: &Report,
    w: &mut RankRows<W>,
) -> std::result::Result<(), csv::Error> {
    let sim = report.device.simulated.to_string();
    for f in &report.formulas {
        let v = f.verify.as_ref();
        w.write_record([
            f.id.key().to_string(),
            f.title.clone(),
            f.torch_peak_bytes.to_string(),
            f.non_torch_bytes.to_string(),
            f.weights_term_bytes.to_string(),
            f.non_kv_bytes.to_string(),
            f.kv_bytes.to_string(),
            f.kv_blocks.to_string(),
            f.kv_tokens.to_string(),
            format!("{:.3}", f.max_concurrency),
            f.error_bytes.to_string(),
            v.map(|v| v.within_budget.to_string()).unwrap_or_default(),
            v.map(|v| v.overrun_bytes.to_string()).unwrap_or_default(),
            v.map(|v| v.oom.to_string()).unwrap_or_default(),
            v.map(|v| v.cache_releases.to_string()).unwrap_or_default(),
            sim.clone(),
            String::new(),
            String::new(),
        ])?;
    }
    let t = &report.truth;
    let v = t.verify.as_ref();
    w.write_record([
        "truth".to_string(),
        format!("measured peak ({})", t.source),
        String::new(),
        String::new(),
        String::new(),
        t.non_kv_bytes.to_string(),
        t.kv_bytes.to_string(),
        t.kv_blocks.to_string(),
        t.kv_tokens.to_string(),
        format!("{:.3}", t.max_concurrency),
        "0".into(),
        v.map(|v| v.within_budget.to_string()).unwrap_or_default(),
        v.map(|v| v.overrun_bytes.to_string()).unwrap_or_default(),
        v.map(|v| v.oom.to_string()).unwrap_or_default(),
        v.map(|v| v.cache_releases.to_string()).unwrap_or_default(),
        sim,
        String::new(),
        String::new(),
    ])?;
    // Who owns the peak and what outlives its pass: id, title, then `bytes` (and
    // `freed_bytes` for the per-layer rows); the formula columns stay empty.
    let a = Analysis::of(report);
    let mut extra = |id: &str, title: String, bytes: u64, freed: Option<u64>| {
        let mut row = vec![id.to_string(), title];
        row.extend(std::iter::repeat_n(String::new(), 14));
        row.push(bytes.to_string());
        row.push(freed.map(|f| f.to_string()).unwrap_or_default());
        w.write_record(row)
    };
    for g in &a.kept {
        extra(
            "kept_across_passes",
            format!("{} ({} made; bytes alive at t3)", g.what, g.count),
            g.bytes_at_t3,
            None,
        )?;
    }
    for (p, prefix) in [
        (&a.peaks.framework, "framework_peak"),
        (&a.peaks.process, "process_peak"),
    ] {
        let Some(p) = p else { continue };
        for (cat, bytes) in &p.by_category {
            extra(
                &format!("{prefix}_category"),
                cat.label().to_string(),
                *bytes,
                None,
            )?;
        }
        for t in &p.top {
            let layer = t.layer.map_or(String::new(), |l| format!(", layer {l}"));
            extra(
                &format!("{prefix}_tensor"),
                format!("{} ({}{layer}, pass {})", t.tensor, t.op, t.made_pass),
                t.bytes,
                None,
            )?;
        }
    }
    for l in &a.peaks.layers {
        let layer = l
            .layer
            .map_or("outside layers".to_string(), |x| format!("layer {x}"));
        extra(
            "layer",
            format!("pass {} {layer}", l.pass),
            l.made_bytes,
            Some(l.freed_bytes),
        )?;
    }
    Ok(())
}

/// The summary file that goes beside a timeline file: `run.csv` → `run.summary.csv`.
pub fn summary_path(timeline: &Path) -> PathBuf {
    let stem = timeline
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "vramscope".into());
    timeline.with_file_name(format!("{stem}.summary.csv"))
}

/// Writes the timeline to `path` and the summary beside it; returns both paths.
pub fn write(report: &Report, path: &Path) -> Result<(PathBuf, PathBuf)> {
    let summary_file = summary_path(path);
    let files = super::report_renders(report, None, Some(path), None)?;
    super::write_streamed(files)?;
    Ok((path.to_path_buf(), summary_file))
}

//! CSV: the timeline (one row per event, with the running totals) and a summary (one row per
//! formula, plus the measured truth).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::pieces::Pieces;
use crate::base::error::Result;
use crate::profile::Report;
use crate::report::lifetimes::Analysis;

/// Writes records with the tensor-parallel rank they belong to as a last column (0 with one
/// GPU), so one file holds every rank. Fields go straight into a `Pieces` buffer: a timeline
/// has a row per event, millions in a long run. Quoted as the `csv` crate's writer quotes
/// (its defaults: only a field holding a comma, a quote or a line break, quotes doubled).
struct RankRows<W: std::io::Write> {
    out: Pieces<W>,
    rank: u32,
    /// The next field is the first of its record (no comma before it).
    first: bool,
    digits: itoa::Buffer,
}

impl<W: std::io::Write> RankRows<W> {
    fn new(to: W) -> Self {
        RankRows {
            out: Pieces::new(to),
            rank: 0,
            first: true,
            digits: itoa::Buffer::new(),
        }
    }

    fn write_record<I, T>(&mut self, record: I) -> std::io::Result<()>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        for field in record {
            self.text(field.as_ref())?;
        }
        self.end_record()
    }

    #[inline]
    fn separate(&mut self) -> std::io::Result<()> {
        if !std::mem::replace(&mut self.first, false) {
            self.out.write_all(b",")?;
        }
        Ok(())
    }

    fn text(&mut self, field: &str) -> std::io::Result<()> {
        self.separate()?;
        let bytes = field.as_bytes();
        if !bytes
            .iter()
            .any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
        {
            return self.out.write_all(bytes);
        }
        self.out.write_all(b"\"")?;
        for (i, part) in field.split('"').enumerate() {
            if i > 0 {
                self.out.write_all(b"\"\"")?;
            }
            self.out.write_all(part.as_bytes())?;
        }
        self.out.write_all(b"\"")
    }

    fn number(&mut self, n: impl itoa::Integer) -> std::io::Result<()> {
        self.separate()?;
        self.out.write_all(self.digits.format(n).as_bytes())
    }

    /// `n` empty fields.
    fn empty(&mut self, n: usize) -> std::io::Result<()> {
        for _ in 0..n {
            self.separate()?;
        }
        Ok(())
    }

    /// The rank column, then the end of the record.
    fn end_record(&mut self) -> std::io::Result<()> {
        self.number(self.rank)?;
        self.end_header()
    }

    /// The end of a record without a rank column (the header names it).
    fn end_header(&mut self) -> std::io::Result<()> {
        self.first = true;
        self.out.write_all(b"\n")
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
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
    Ok(timeline(report, to)?)
}

fn timeline(report: &Report, to: impl std::io::Write) -> std::io::Result<()> {
    let mut w = RankRows::new(to);
    for name in [
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
    ] {
        w.text(name)?;
    }
    w.end_header()?;
    // A kind's name as the JSON writes it (serde's), made once per kind.
    let mut kind_names: [Option<String>; 8] = Default::default();
    for r in each_rank(report) {
        w.rank = r.rank;
        for e in &r.events {
            let kind = kind_names[e.kind as usize].get_or_insert_with(|| {
                serde_json::to_value(e.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default()
            });
            w.number(e.seq)?;
            w.number(e.time_us)?;
            w.number(e.pass)?;
            w.text(kind)?;
            w.text(&e.op)?;
            match e.layer {
                Some(l) => w.number(l)?,
                None => w.empty(1)?,
            }
            w.text(&e.tensor)?;
            w.text(e.category.label())?;
            w.number(e.bytes)?;
            w.number(e.allocated)?;
            w.number(e.reserved)?;
            w.number(e.device_used)?;
            w.number(e.process_used)?;
            w.end_record()?;
        }
    }
    w.flush()
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
    write_summary_with(report, None, to)
}

/// `write_summary` with the lifetime analysis of `report` itself already made (the PNG reads
/// the same one); a tensor-parallel report's ranks are analysed each.
pub fn write_summary_with(
    report: &Report,
    analysis: Option<&Analysis>,
    to: impl std::io::Write,
) -> std::result::Result<(), csv::Error> {
    Ok(summary(report, analysis, to)?)
}

fn summary(
    report: &Report,
    analysis: Option<&Analysis>,
    to: impl std::io::Write,
) -> std::io::Result<()> {
    let mut w = RankRows::new(to);
    for name in [
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
    ] {
        w.text(name)?;
    }
    w.end_header()?;
    for r in each_rank(report) {
        w.rank = r.rank;
        match analysis.filter(|_| std::ptr::eq(r, report)) {
            Some(a) => summary_rows(r, a, &mut w)?,
            None => summary_rows(r, &Analysis::of(r), &mut w)?,
        }
    }
    // With tensor parallel, what the engine takes: the fewest blocks over the ranks, per
    // formula, in `kv_blocks`; the rank column names the rank that sets it.
    for e in &report.engine {
        w.rank = e.binding_rank;
        w.text(&format!("engine_{}", e.key))?;
        w.text(&format!(
            "{}: fewest blocks over {} ranks {:?}",
            e.title, report.tp, e.rank_blocks
        ))?;
        w.empty(5)?;
        w.number(e.kv_blocks)?;
        w.empty(10)?;
        w.end_record()?;
    }
    w.flush()
}

/// One report's rows: a row per formula, the truth, then who owns the peak.
fn summary_rows<W: std::io::Write>(
    report: &Report,
    a: &Analysis,
    w: &mut RankRows<W>,
) -> std::io::Result<()> {
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
    let mut extra = |id: &str, title: &str, bytes: u64, freed: Option<u64>| {
        w.text(id)?;
        w.text(title)?;
        w.empty(14)?;
        w.number(bytes)?;
        match freed {
            Some(f) => w.number(f)?,
            None => w.text("")?,
        }
        w.end_record()
    };
    for g in &a.kept {
        extra(
            "kept_across_passes",
            &format!("{} ({} made; bytes alive at t3)", g.what, g.count),
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
            extra(&format!("{prefix}_category"), cat.label(), *bytes, None)?;
        }
        for t in &p.top {
            let layer = t.layer.map_or(String::new(), |l| format!(", layer {l}"));
            extra(
                &format!("{prefix}_tensor"),
                &format!("{} ({}{layer}, pass {})", t.tensor, t.op, t.made_pass),
                t.bytes,
                None,
            )?;
        }
    }
    // One title buffer for every layer row: a snapshot of many passes has a row per pass.
    let mut title = String::new();
    for l in &a.peaks.layers {
        use std::fmt::Write;
        title.clear();
        let _ = match l.layer {
            Some(x) => write!(title, "pass {} layer {x}", l.pass),
            None => write!(title, "pass {} outside layers", l.pass),
        };
        extra("layer", &title, l.made_bytes, Some(l.freed_bytes))?;
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

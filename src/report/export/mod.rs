//! Reports out of a run: JSON session, CSV timeline and summary, PNG report image. Every file
//! is streamed to a temporary file beside its destination and renamed into place once all are
//! written, so a reader never sees half a file and a failed export leaves nothing behind.

pub mod csv;
pub mod json;
mod pieces;
pub mod png;
pub mod pretty;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::base::error::{Error, Result};
use crate::report::lifetimes::Analysis;

pub use crate::base::atomic::{
    atomic_write, check_targets, check_writable, write_all, write_streamed, Render,
};

/// The exports asked for (session JSON, CSV timeline + its summary, PNG image), each as a
/// `Render` that streams it into its temporary file (`write_streamed`): the JSON and the
/// timeline are written row by row, never held whole in memory.
pub fn report_renders<'a>(
    report: &'a crate::profile::Report,
    json: Option<&'a Path>,
    csv: Option<&'a Path>,
    png: Option<&'a Path>,
) -> Result<Vec<(PathBuf, Render<'a>)>> {
    let failed = |path: &Path, problem: String| Error::Export {
        path: path.to_path_buf(),
        problem,
    };
    let mut out: Vec<(PathBuf, Render<'a>)> = Vec::new();
    // The CSV summary and the PNG read one lifetime analysis, made by whichever needs it
    // first (they are written side by side).
    let analysis: Arc<OnceLock<Analysis>> = Arc::default();
    if let Some(p) = json {
        out.push((
            p.to_path_buf(),
            Box::new(move |w: &mut dyn std::io::Write| {
                pretty::write_report(w, report).map_err(|e| failed(p, e.to_string()))
            }),
        ));
    }
    if let Some(p) = csv {
        let summary_path = csv::summary_path(p);
        out.push((
            p.to_path_buf(),
            Box::new(move |w: &mut dyn std::io::Write| {
                csv::write_timeline(report, w).map_err(|e| failed(p, e.to_string()))
            }),
        ));
        let analysis = analysis.clone();
        out.push((
            summary_path.clone(),
            Box::new(move |w: &mut dyn std::io::Write| {
                let own = report
                    .ranks
                    .is_empty()
                    .then(|| analysis.get_or_init(|| Analysis::of(report)));
                csv::write_summary_with(report, own, w)
                    .map_err(|e| failed(&summary_path, e.to_string()))
            }),
        ));
    }
    if let Some(p) = png {
        out.push((
            p.to_path_buf(),
            Box::new(move |w: &mut dyn std::io::Write| {
                let a = analysis.get_or_init(|| Analysis::of(report));
                let bytes = png::render_png_with(report, a).map_err(|e| failed(p, e))?;
                w.write_all(&bytes).map_err(|e| Error::io(p, e))
            }),
        ));
    }
    Ok(out)
}

/// The exports' target paths, as `report_renders` writes them (the CSV summary included).
pub fn report_targets(json: Option<&Path>, csv: Option<&Path>, png: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = json.map(Path::to_path_buf).into_iter().collect();
    if let Some(c) = csv {
        out.push(c.to_path_buf());
        out.push(csv::summary_path(c));
    }
    out.extend(png.map(Path::to_path_buf));
    out
}

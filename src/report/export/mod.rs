//! Reports out of a run: JSON session, CSV timeline and summary, PNG report image. Every file
//! is written to a temporary file beside its destination and renamed into place, so a reader
//! never sees half a file and a failed export leaves nothing behind.

pub mod csv;
pub mod json;
pub mod png;

use std::path::{Path, PathBuf};

use crate::base::error::{Error, Result};

pub use crate::base::atomic::{atomic_write, check_writable, write_all};

/// Renders the exports asked for (session JSON, CSV timeline + its summary, PNG image) in
/// memory, as (target, bytes) for `write_all`.
pub fn report_files(
    report: &crate::profile::Report,
    json: Option<&Path>,
    csv: Option<&Path>,
    png: Option<&Path>,
) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let failed = |path: &Path, problem: String| Error::Export {
        path: path.to_path_buf(),
        problem,
    };
    let mut out = Vec::new();
    if let Some(p) = json {
        let bytes = serde_json::to_vec_pretty(report).map_err(|e| failed(p, e.to_string()))?;
        out.push((p.to_path_buf(), bytes));
    }
    if let Some(p) = csv {
        let timeline = csv::timeline_bytes(report).map_err(|e| failed(p, e.to_string()))?;
        let summary_path = csv::summary_path(p);
        let summary =
            csv::summary_bytes(report).map_err(|e| failed(&summary_path, e.to_string()))?;
        out.push((p.to_path_buf(), timeline));
        out.push((summary_path, summary));
    }
    if let Some(p) = png {
        out.push((
            p.to_path_buf(),
            png::render_png(report).map_err(|e| failed(p, e))?,
        ));
    }
    Ok(out)
}

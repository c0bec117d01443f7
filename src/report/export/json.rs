//! The session file: the whole Report as JSON, reopened without re-running.

use std::path::Path;

use crate::base::error::{Error, Result};
use crate::profile::report::REPORT_FORMAT;
use crate::profile::Report;
use crate::report::lifetimes::Analysis;

/// The session: the Report, plus what the lifetime analysis says (`kept_across_passes`,
/// `peak_owners`) for readers of the JSON; `read` ignores those, they are made again.
pub fn write(report: &Report, path: &Path) -> Result<()> {
    let err = |e: serde_json::Error| Error::Export {
        path: path.into(),
        problem: e.to_string(),
    };
    let a = Analysis::of(report);
    // Streamed into the file: the report's fields, then the analysis's two.
    #[derive(serde::Serialize)]
    struct Session<'a, K: serde::Serialize, P: serde::Serialize> {
        #[serde(flatten)]
        report: &'a Report,
        kept_across_passes: &'a K,
        peak_owners: &'a P,
    }
    let session = Session {
        report,
        kept_across_passes: &a.kept,
        peak_owners: &a.peaks,
    };
    super::write_streamed(vec![(
        path.to_path_buf(),
        Box::new(move |w: &mut dyn std::io::Write| {
            super::pretty::write_pretty(w, &session).map_err(err)
        }),
    )])
}

pub fn read(path: &Path) -> Result<Report> {
    let bytes = crate::base::fsguard::read_bounded(
        path,
        "session file",
        crate::base::fsguard::SESSION_LIMIT,
    )?;
    let report: Report = serde_json::from_slice(&bytes).map_err(|e| Error::Export {
        path: path.into(),
        problem: format!("not a vramscope session: {e}"),
    })?;
    if report.format != REPORT_FORMAT {
        return Err(Error::Export {
            path: path.into(),
            problem: format!(
                "session format {} is not supported (expected {REPORT_FORMAT})",
                report.format
            ),
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_written_before_gpu_samples_were_kept_still_opens() {
        let report = crate::profile::tiny_dry_report(32);
        assert!(report.device_samples.is_empty() && report.sample_rate_hz.is_none());
        let mut v = serde_json::to_value(&report).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("device_samples").unwrap();
        o.remove("sample_rate_hz").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        let back = read(&path).unwrap();
        assert!(back.device_samples.is_empty());
        assert_eq!(back.formulas.len(), report.formulas.len());
    }
}

//! PNG report (rendered headless with an embedded font).

use std::path::Path;

use crate::error::{Error, Result};
use crate::profile::Report;

pub fn write(_report: &Report, path: &Path) -> Result<()> {
    Err(Error::Export {
        path: path.into(),
        problem: "PNG export is not built yet".into(),
    })
}

//! The desktop app (eframe/egui).

use std::path::PathBuf;

use crate::error::{Error, Result};

pub fn run_app(_screenshot: Option<PathBuf>) -> Result<()> {
    Err(Error::Request(
        "the desktop app is not built yet; use a subcommand (see --help)".into(),
    ))
}

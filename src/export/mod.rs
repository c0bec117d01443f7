//! Reports out of a run: JSON session, CSV timeline and summary, PNG report image. Every file
//! is written to a temporary file beside its destination and renamed into place, so a reader
//! never sees half a file and a failed export leaves nothing behind.

pub mod csv;
pub mod json;
pub mod png;

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// The folder a file goes into, which must exist.
fn existing_folder_of(path: &Path) -> Result<&Path> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::Export {
            path: path.to_path_buf(),
            problem: format!("folder {} does not exist", dir.display()),
        });
    }
    Ok(dir)
}

/// Writes through `f` into a temporary file in the destination's folder, then renames it.
pub fn atomic_write_with(
    path: &Path,
    f: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<()> {
    let dir = existing_folder_of(path)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(path, e))?;
    f(tmp.as_file_mut()).map_err(|e| Error::io(path, e))?;
    tmp.as_file_mut().flush().map_err(|e| Error::io(path, e))?;
    // Temporary files are private (0600); a report is an ordinary file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tmp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    atomic_write_with(path, |f| f.write_all(bytes))
}

/// Refuses an output path that cannot be written (missing folder), before a run starts.
pub fn check_writable(path: &Path) -> Result<()> {
    existing_folder_of(path)?;
    if path.is_dir() {
        return Err(Error::Export {
            path: path.to_path_buf(),
            problem: "is a folder, expected a file name".into(),
        });
    }
    Ok(())
}

//! All-or-nothing file writes: each file goes to a temporary file beside its target and is
//! renamed into place only when every file of the set was written, so a reader never sees half
//! a file and a failed export leaves nothing behind.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::base::error::{Error, Result};

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

/// Writes every file or none: each is written to a temporary file beside its target, and
/// only when all of them were written (and synced, so a full disk shows here) are they
/// renamed into place. On any failure the temporaries are removed (dropping a `NamedTempFile`
/// deletes it) and no target is touched. A target asked for twice is refused.
pub fn write_all(files: &[(PathBuf, Vec<u8>)]) -> Result<()> {
    let mut staged = Vec::with_capacity(files.len());
    for (i, (path, bytes)) in files.iter().enumerate() {
        if files[..i].iter().any(|(p, _)| p == path) {
            return Err(Error::Export {
                path: path.clone(),
                problem: "the same file is asked for by two exports".into(),
            });
        }
        check_writable(path)?;
        let dir = existing_folder_of(path)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".vramscope-")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(|e| Error::io(path, e))?;
        let f = tmp.as_file_mut();
        f.write_all(bytes)
            .and_then(|()| f.flush())
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io(path, e))?;
        // Temporary files are private (0600); a report is an ordinary file.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = f.set_permissions(std::fs::Permissions::from_mode(0o644));
        }
        staged.push((tmp, path));
    }
    // Renames within one folder are atomic and do not need space: past this point only a
    // folder changed under us can fail, and the files already renamed stay complete.
    for (tmp, path) in staged {
        tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    }
    Ok(())
}

/// Writes one file all-or-nothing.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    write_all(&[(path.to_path_buf(), bytes.to_vec())])
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

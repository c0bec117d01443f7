//! All-or-nothing file writes: every target name is checked first (length, folder, no two
//! exports naming one file), then each file is streamed to a temporary file beside its target,
//! and only when every file of the set was written are they renamed into place, so a reader
//! never sees half a file and a failed export leaves nothing behind.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::base::error::{Error, Result};

/// Longest file name (one path component) Linux file systems take (`NAME_MAX`).
pub const NAME_MAX_BYTES: usize = 255;
/// Longest path a system call takes (`PATH_MAX`, with its terminating NUL).
pub const PATH_MAX_BYTES: usize = 4095;

/// What writes one file's bytes: it is given a buffered writer on the temporary file. `Send`:
/// the files of a set are written side by side (`write_streamed`).
pub type Render<'a> = Box<dyn FnOnce(&mut dyn Write) -> Result<()> + Send + 'a>;

fn export_error(path: &Path, problem: impl Into<String>) -> Error {
    Error::Export {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// The folder a file goes into, which must exist.
fn existing_folder_of(path: &Path) -> Result<&Path> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(export_error(
            path,
            format!("folder {} does not exist", dir.display()),
        ));
    }
    Ok(dir)
}

/// Refuses an output path that cannot be written (missing folder, a folder, a name too long
/// for the file system), before a run starts.
pub fn check_writable(path: &Path) -> Result<()> {
    target_key(path).map(|_| ())
}

/// The file a target names, as one key for every spelling of it (`out/o.json`,
/// `./out/o.json`, `out/../out/o.json`): the canonical folder and the file name. Checks what
/// a rename would refuse later: a name longer than `NAME_MAX`, a path longer than `PATH_MAX`,
/// a missing folder, a folder as the target.
fn target_key(path: &Path) -> Result<PathBuf> {
    let Some(name) = path.file_name() else {
        return Err(export_error(path, "names no file (it ends in '..' or '/')"));
    };
    let name_len = name.len();
    if name_len > NAME_MAX_BYTES {
        return Err(export_error(
            path,
            format!(
                "the file name is {name_len} bytes, longer than the {NAME_MAX_BYTES} a file name may have (NAME_MAX)"
            ),
        ));
    }
    let path_len = path.as_os_str().len();
    if path_len > PATH_MAX_BYTES {
        return Err(export_error(
            path,
            format!("the path is {path_len} bytes, longer than the {PATH_MAX_BYTES} a path may have (PATH_MAX)"),
        ));
    }
    let dir = existing_folder_of(path)?;
    if path.is_dir() {
        return Err(export_error(path, "is a folder, expected a file name"));
    }
    let dir = dir.canonicalize().map_err(|e| Error::io(path, e))?;
    Ok(dir.join(name))
}

/// Checks every target of a set before anything is written: each one writable (see
/// `target_key`), no two naming the same file however they are spelled.
pub fn check_targets<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    let mut seen: Vec<(PathBuf, &Path)> = Vec::new();
    for path in paths {
        let key = target_key(path)?;
        if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
            return Err(export_error(
                path,
                format!(
                    "the same file is asked for by two exports ({} and {})",
                    first.display(),
                    path.display()
                ),
            ));
        }
        seen.push((key, path));
    }
    Ok(())
}

/// Writes every file or none, streaming each through its `Render`: all targets are checked
/// first (`check_targets`), then each file is written to a temporary file beside its target
/// (buffered, then synced, so a full disk shows here), and only when all of them were written
/// are they renamed into place. On any failure the temporaries are removed (dropping a
/// `NamedTempFile` deletes it) and no target is touched. The files of a set are independent
/// (a report's JSON, CSV and PNG read the same report), so they are written side by side, a
/// thread per core taking the next file in the order given (the largest first, when the
/// caller lists it first); the first failure in that order is the one returned.
pub fn write_streamed(files: Vec<(PathBuf, Render<'_>)>) -> Result<()> {
    check_targets(files.iter().map(|(p, _)| p.as_path()))?;
    let count = files.len();
    let writers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(count);
    let staged: Vec<Result<(NamedTempFile, PathBuf)>> = if writers <= 1 {
        files.into_iter().map(|(p, r)| stage(p, r)).collect()
    } else {
        let queue = std::sync::Mutex::new(files.into_iter().enumerate());
        let mut done: Vec<(usize, Result<(NamedTempFile, PathBuf)>)> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..writers)
                .map(|_| {
                    s.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                            let Some((i, (path, render))) = next else {
                                return done;
                            };
                            done.push((i, stage(path, render)));
                        }
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| {
                    t.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        done.sort_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, r)| r).collect()
    };
    debug_assert_eq!(staged.len(), count);
    let staged = staged.into_iter().collect::<Result<Vec<_>>>()?;
    // Renames within one folder are atomic and need no space; the names were checked above,
    // so past this point only a folder changed under us can fail.
    for (tmp, path) in staged {
        tmp.persist(&path).map_err(|e| Error::io(&path, e.error))?;
    }
    Ok(())
}

/// One file of a set, written and synced to a temporary file beside its target.
fn stage(path: PathBuf, render: Render<'_>) -> Result<(NamedTempFile, PathBuf)> {
    let dir = existing_folder_of(&path)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".vramscope-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| Error::io(&path, e))?;
    {
        let mut w = BufWriter::with_capacity(1 << 20, Writeback::new(tmp.as_file_mut()));
        render(&mut w)?;
        w.flush().map_err(|e| Error::io(&path, e))?;
    }
    let f = tmp.as_file_mut();
    f.sync_all().map_err(|e| Error::io(&path, e))?;
    // Temporary files are private (0600); a report is an ordinary file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    Ok((tmp, path))
}

/// Bytes written between two starts of write-back.
const WRITEBACK_BYTES: u64 = 8 << 20;

/// A file being written, whose pages are handed to the disk every `WRITEBACK_BYTES` as it
/// grows (Linux `sync_file_range`, which starts the writes and does not wait for them): the
/// sync at the end then waits for the last pages only, not for the whole file (0.1 s of a
/// 140 MB JSON export).
struct Writeback<'a> {
    file: &'a mut std::fs::File,
    written: u64,
    handed: u64,
}

impl<'a> Writeback<'a> {
    fn new(file: &'a mut std::fs::File) -> Self {
        Writeback {
            file,
            written: 0,
            handed: 0,
        }
    }

    #[cfg(target_os = "linux")]
    fn hand_to_disk(&mut self) {
        use std::os::fd::AsRawFd;
        let (offset, bytes) = (self.handed, self.written - self.handed);
        // SAFETY: a plain system call on a file descriptor this writer holds open; it reads
        // no memory of ours. Its result is only a hint's: the sync at the end reports errors.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                bytes as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.handed = self.written;
    }

    #[cfg(not(target_os = "linux"))]
    fn hand_to_disk(&mut self) {
        self.handed = self.written;
    }
}

impl Write for Writeback<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(bytes)?;
        self.written += n as u64;
        if self.written - self.handed >= WRITEBACK_BYTES {
            self.hand_to_disk();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// `write_streamed` of files already in memory.
pub fn write_all(files: &[(PathBuf, Vec<u8>)]) -> Result<()> {
    write_streamed(
        files
            .iter()
            .map(|(path, bytes)| {
                let render: Render = Box::new(move |w: &mut dyn Write| {
                    w.write_all(bytes).map_err(|e| Error::io(path, e))
                });
                (path.clone(), render)
            })
            .collect(),
    )
}

/// Writes one file all-or-nothing.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    write_all(&[(path.to_path_buf(), bytes.to_vec())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_spelled_two_ways_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("out")).unwrap();
        let a = dir.path().join("out/o.json");
        let b = dir.path().join("out/./../out/o.json");
        let files = vec![(a.clone(), b"a".to_vec()), (b, b"b".to_vec())];
        let e = write_all(&files).unwrap_err().to_string();
        assert!(
            e.contains("the same file is asked for by two exports"),
            "{e}"
        );
        assert!(!a.exists());
    }

    #[test]
    fn a_name_past_name_max_is_refused_before_the_first_rename() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok.csv");
        let long = dir.path().join(format!("{}.summary.csv", "n".repeat(250)));
        let files = vec![(ok.clone(), b"1".to_vec()), (long, b"2".to_vec())];
        let e = write_all(&files).unwrap_err().to_string();
        assert!(e.contains("262 bytes, longer than the 255"), "{e}");
        // Nothing renamed, no temporary left.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_render_that_fails_leaves_no_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        let b = dir.path().join("b.csv");
        let files: Vec<(PathBuf, Render)> = vec![
            (
                a.clone(),
                Box::new(|w: &mut dyn Write| {
                    w.write_all(b"{}").unwrap();
                    Ok(())
                }),
            ),
            (
                b.clone(),
                Box::new(|_: &mut dyn Write| Err(Error::Request("no rows".into()))),
            ),
        ];
        assert!(write_streamed(files).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

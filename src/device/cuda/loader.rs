//! Finds the CUDA libraries at run time. cudarc opens them by bare name and panics on a missing
//! one, so each is looked for first — on the loader's path, in the usual CUDA folders and in
//! PyTorch's pip folders (`site-packages/nvidia/*/lib`) — and preloaded by full path with
//! `RTLD_GLOBAL`, after which cudarc's `dlopen` by name finds the same copy.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One library the backend needs, with the file names it accepts (newest first).
struct Wanted {
    what: &'static str,
    names: &'static [&'static str],
}

const DRIVER: Wanted = Wanted {
    what: "CUDA driver",
    names: &["libcuda.so.1", "libcuda.so"],
};
const NVML: Wanted = Wanted {
    what: "NVML",
    names: &["libnvidia-ml.so.1", "libnvidia-ml.so"],
};
const NVRTC: Wanted = Wanted {
    what: "NVRTC",
    names: &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
};
const CUBLASLT: Wanted = Wanted {
    what: "cuBLASLt",
    names: &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
};
const CUBLAS: Wanted = Wanted {
    what: "cuBLAS",
    names: &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
};

const NCCL: Wanted = Wanted {
    what: "NCCL (tensor parallel)",
    names: &["libnccl.so.2", "libnccl.so"],
};

/// Where the libraries were found (for messages and the report).
#[derive(Clone, Debug)]
pub(crate) struct Found {
    pub nvml: PathBuf,
}

/// Folders searched after the loader's own path.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            dirs.push(Path::new(&v).join("lib64"));
            dirs.push(Path::new(&v).join("lib"));
        }
    }
    for d in [
        "/usr/local/cuda/lib64",
        "/usr/local/nvidia/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    for sp in site_packages() {
        let nv = sp.join("nvidia");
        if let Ok(rd) = std::fs::read_dir(&nv) {
            let mut subs: Vec<PathBuf> = rd.flatten().map(|e| e.path().join("lib")).collect();
            subs.sort();
            dirs.extend(subs.into_iter().filter(|p| p.is_dir()));
        }
    }
    dirs
}

/// Python package folders that may hold PyTorch's CUDA wheels.
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(v) = std::env::var("VIRTUAL_ENV") {
        roots.push(PathBuf::from(v));
    }
    if let Ok(v) = std::env::var("CONDA_PREFIX") {
        roots.push(PathBuf::from(v));
    }
    if let Ok(h) = std::env::var("HOME") {
        roots.push(Path::new(&h).join(".local"));
    }
    roots.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    // Virtual environments one or two levels under /opt (e.g. /opt/torch/.venv).
    if let Ok(rd) = std::fs::read_dir("/opt") {
        for e in rd.flatten() {
            roots.push(e.path());
            roots.push(e.path().join(".venv"));
            roots.push(e.path().join("venv"));
        }
    }
    let mut out = Vec::new();
    for root in roots {
        let lib = root.join("lib");
        let Ok(rd) = std::fs::read_dir(&lib) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("python3") {
                for sub in ["site-packages", "dist-packages"] {
                    let p = e.path().join(sub);
                    if p.is_dir() {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

fn open_global(path: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading a CUDA library runs its initialisers, which only set up the library.
    let lib =
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| e.to_string())?;
    // Kept loaded for the life of the process, as cudarc keeps its own handles.
    std::mem::forget(lib);
    Ok(())
}

/// Loads one library: by name through the loader first, then from each folder in turn.
fn load(w: &Wanted, dirs: &[PathBuf]) -> Result<PathBuf, String> {
    for name in w.names {
        if open_global(Path::new(name)).is_ok() {
            return Ok(PathBuf::from(name));
        }
    }
    let mut broken = Vec::new();
    for d in dirs {
        for name in w.names {
            let p = d.join(name);
            if p.exists() {
                match open_global(&p) {
                    Ok(()) => return Ok(p),
                    Err(e) => broken.push(format!("{} ({e})", p.display())),
                }
            }
        }
    }
    let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let mut msg = format!(
        "{} library not found: no {} on the loader path (LD_LIBRARY_PATH, ldconfig) or in {}",
        w.what,
        w.names.join(" / "),
        shown.join(", ")
    );
    if !broken.is_empty() {
        msg.push_str(&format!("; found but could not load {}", broken.join(", ")));
    }
    Err(msg)
}

/// Finds and preloads every library once per process; the error names the first missing one
/// and where it was looked for.
pub(crate) fn ensure_loaded() -> Result<Found, String> {
    static DONE: OnceLock<Result<Found, String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let dirs = search_dirs();
        load(&DRIVER, &dirs)?;
        let nvml = load(&NVML, &dirs)?;
        load(&NVRTC, &dirs)?;
        load(&CUBLASLT, &dirs)?;
        load(&CUBLAS, &dirs)?;
        // cudarc looks its libraries up by name; make sure it sees what was preloaded.
        // SAFETY: these only try dlopen by name.
        let present = unsafe {
            [
                ("CUDA driver", cudarc::driver::sys::is_culib_present()),
                ("NVRTC", cudarc::nvrtc::sys::is_culib_present()),
                ("cuBLAS", cudarc::cublas::sys::is_culib_present()),
                ("cuBLASLt", cudarc::cublaslt::sys::is_culib_present()),
            ]
        };
        if let Some((what, _)) = present.iter().find(|(_, ok)| !ok) {
            return Err(format!(
                "{what} library was preloaded but cudarc cannot open it by name; add its folder to LD_LIBRARY_PATH"
            ));
        }
        Ok(Found { nvml })
    })
    .clone()
}

/// NCCL, for tensor parallel only (its absence does not stop one-GPU runs): the path of the
/// copy found, or which file names were looked for where.
pub(crate) fn load_nccl() -> Result<PathBuf, String> {
    static DONE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DONE.get_or_init(|| load(&NCCL, &search_dirs())).clone()
}

/// Only the CUDA driver (for numbering GPUs as `cuda:N` opens them, without a context).
pub(crate) fn ensure_driver() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        load(&DRIVER, &search_dirs())?;
        // SAFETY: this only tries dlopen by name.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            Ok(())
        } else {
            Err("the CUDA driver library was preloaded but cudarc cannot open it by name; add its folder to LD_LIBRARY_PATH".into())
        }
    })
    .clone()
}

/// Only NVML (for listing devices without creating a CUDA context).
pub(crate) fn ensure_nvml() -> Result<PathBuf, String> {
    static DONE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DONE.get_or_init(|| load(&NVML, &search_dirs())).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_itself_and_the_folders_searched() {
        let w = Wanted {
            what: "Imaginary",
            names: &["libvramscope-does-not-exist.so.7"],
        };
        let err = load(&w, &[PathBuf::from("/nonexistent/lib64")]).unwrap_err();
        assert!(err.starts_with("Imaginary library not found"), "{err}");
        assert!(err.contains("libvramscope-does-not-exist.so.7"), "{err}");
        assert!(err.contains("/nonexistent/lib64"), "{err}");
    }
}

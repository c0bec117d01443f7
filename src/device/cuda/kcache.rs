//! Kernels compiled once per machine: NVRTC builds a cubin for the GPU's own architecture
//! (`sm_XY`, `sm_90a` on Hopper) and keeps it on disk, keyed by the source, the options and
//! NVRTC's version, so a second run loads it in milliseconds instead of compiling (and the
//! driver's JIT of PTX is skipped too). Where no cubin can be built (an NVRTC older than the
//! GPU), the caller's PTX path runs as before. A cache that cannot be read or written is
//! only slower, never an error.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{result, sys, Ptx};

/// Where cubins are kept: `$VRAMSCOPE_KERNEL_CACHE`, else `$XDG_CACHE_HOME/vramscope/kernels`,
/// else `~/.cache/vramscope/kernels`. `VRAMSCOPE_KERNEL_CACHE=off` keeps nothing.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("VRAMSCOPE_KERNEL_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("vramscope").join("kernels")),
    }
}

fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for b in (p.len() as u64).to_le_bytes().iter().chain(p.iter()) {
            h = (h ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn nvrtc_version() -> (i32, i32) {
    let (mut a, mut b) = (0, 0);
    // SAFETY: two out-parameters.
    let _ = unsafe { sys::nvrtcVersion(&mut a, &mut b) };
    (a, b)
}

/// NVRTC's cubin of `src` for `arch` (e.g. "sm_90a").
fn compile_cubin(src: &str, arch: &str) -> Result<Vec<u8>, String> {
    let c_src = CString::new(src).map_err(|e| e.to_string())?;
    let prog = result::create_program(&c_src, None).map_err(|e| e.to_string())?;
    let opts = [format!("--gpu-architecture={arch}")];
    // SAFETY: `prog` is live until destroyed below; the options are plain strings.
    let out = unsafe { result::compile_program(prog, &opts) }
        .map_err(|e| format!("NVRTC ({arch}): {e}"))
        .and_then(|()| {
            let mut size = 0usize;
            // SAFETY: `prog` compiled; `size` is an out-parameter.
            unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; size];
            // SAFETY: `buf` holds the size NVRTC reported.
            unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) }
                .result()
                .map_err(|e| e.to_string())?;
            Ok(buf)
        });
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The module of `src` built for `arch`, from the cache when it is there; `Err` when NVRTC
/// cannot build a cubin for `arch` (the caller falls back to PTX).
pub fn load_cached(
    ctx: &Arc<CudaContext>,
    src: &str,
    arch: &str,
) -> Result<Arc<CudaModule>, String> {
    let (major, minor) = nvrtc_version();
    let key = fnv(&[
        src.as_bytes(),
        arch.as_bytes(),
        &major.to_le_bytes(),
        &minor.to_le_bytes(),
    ]);
    let path = cache_dir().map(|d| d.join(format!("{key:016x}-{arch}.cubin")));
    if let Some(p) = &path {
        let _t = crate::base::timing::span("open: kernels from the disk cache");
        if let Ok(bytes) = std::fs::read(p) {
            if let Ok(m) = ctx.load_module(Ptx::from_binary(bytes)) {
                return Ok(m);
            }
        }
    }
    let cubin = {
        let _t = crate::base::timing::span("open: kernels compiled by NVRTC (first run)");
        eprintln!(
            "vramscope: compiling the CUDA kernels for {arch} ({} KB of source), once: {}",
            src.len() / 1024,
            path.as_ref().and_then(|p| p.parent()).map_or(
                "no cache folder (VRAMSCOPE_KERNEL_CACHE=off or no HOME)".to_string(),
                |d| format!("kept in {}", d.display())
            )
        );
        compile_cubin(src, arch)?
    };
    if let Some(p) = &path {
        // Written whole under a temporary name, then renamed: a reader never sees half a file.
        if let Some(dir) = p.parent() {
            let tmp = dir.join(format!(".{}.{}", std::process::id(), key));
            let ok = std::fs::create_dir_all(dir).is_ok()
                && std::fs::write(&tmp, &cubin).is_ok()
                && std::fs::rename(&tmp, p).is_ok();
            if !ok {
                let _ = std::fs::remove_file(&tmp);
            }
        }
    }
    ctx.load_module(Ptx::from_binary(cubin))
        .map_err(|e| format!("loading the kernels: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_covers_every_part() {
        assert_ne!(fnv(&[b"ab", b"c"]), fnv(&[b"a", b"bc"]));
        assert_ne!(fnv(&[b"src", b"sm_90a"]), fnv(&[b"src", b"sm_89"]));
        assert_eq!(fnv(&[b"x"]), fnv(&[b"x"]));
    }
}

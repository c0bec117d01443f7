//! Context and memory: what the driver and NVML say is used, framework segments, allocations
//! outside the framework (in this process or held by a child process), the staging and pinned
//! host buffers, and copies between host and device.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use cudarc::driver::{result as drv, CudaContext};

use super::{dev_err, is_oom, loader, nvml, CudaDevice, NvmlSample};
use crate::base::error::{Error, Result};
use crate::device::tensor::{DType, TensorData};
use crate::device::{MemInfo, OutsideAlloc};
use crate::memory::SegmentHandle;

/// Page-locked host memory weight uploads are converted into and copied from, chunk by chunk.
const PINNED_BYTES: usize = 64 << 20;

/// Converts the first `out.len() / 2` values of `src` into `out` as 16-bit floats of type `H`.
fn to_halves<H>(out: &mut [u8], src: &[f32])
where
    [H]: half::slice::HalfFloatSliceExt,
{
    let n = out.len() / 2;
    // SAFETY: `out` is 2-byte aligned (the page-aligned upload buffer or u32 storage, at an
    // even offset) and holds n 16-bit values; f16 and bf16 are plain 2-byte values.
    let h = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<H>(), n) };
    half::slice::HalfFloatSliceExt::convert_from_f32_slice(h, &src[..n]);
}

/// The `vramscope` program that runs `hold-gpu-memory`: `VRAMSCOPE_EXE`, else this program
/// when it is vramscope, else a vramscope beside it or one folder up (a test or bench binary
/// under cargo's `deps/`, or one copied next to the release binary).
fn holder_program() -> std::result::Result<std::path::PathBuf, String> {
    if let Some(p) = std::env::var_os("VRAMSCOPE_EXE") {
        return Ok(p.into());
    }
    let me = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    if me.file_stem().is_some_and(|s| s == "vramscope") {
        return Ok(me);
    }
    let dir = me.parent().unwrap_or(std::path::Path::new("."));
    [dir.join("vramscope"), dir.join("../vramscope")]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no vramscope program beside {} to hold the memory in another process; set VRAMSCOPE_EXE",
                me.display()
            )
        })
}

/// The hidden `hold-gpu-memory` subcommand: allocates `bytes` on the GPU in this (child)
/// process, prints `held N` and keeps it until stdin closes.
pub fn hold_memory_child(ordinal: usize, bytes: u64) -> Result<()> {
    loader::ensure_loaded().map_err(|e| dev_err(ordinal, e))?;
    let ctx = CudaContext::new(ordinal).map_err(|e| dev_err(ordinal, format!("context: {e}")))?;
    ctx.bind_to_thread()
        .map_err(|e| dev_err(ordinal, e.to_string()))?;
    // SAFETY: a plain allocation, freed when the process exits.
    let ptr = unsafe { drv::malloc_sync(bytes as usize) };
    match ptr {
        Ok(_) => {
            println!("held {bytes}");
            let _ = std::io::stdout().flush();
            let mut sink = String::new();
            while std::io::stdin()
                .read_line(&mut sink)
                .map(|n| n > 0)
                .unwrap_or(false)
            {
                sink.clear();
            }
            Ok(())
        }
        Err(e) => {
            println!("failed {e}");
            Err(dev_err(
                ordinal,
                format!("could not hold {bytes} bytes: {e}"),
            ))
        }
    }
}

impl CudaDevice {
    pub fn mem_info(&self) -> MemInfo {
        let _ = self.ctx.bind_to_thread();
        match drv::mem_get_info() {
            Ok((free, total)) => MemInfo {
                free: free as u64,
                total: total as u64,
            },
            Err(_) => MemInfo {
                free: 0,
                total: self.total,
            },
        }
    }

    /// This process's device memory now, as NVML reports it.
    pub fn process_used(&self) -> u64 {
        match nvml::read(&self.nvml, self.nvml_index, std::process::id()) {
            Some(r) => {
                let b = nvml::process_bytes(&r, self.used_before);
                self.sampler.observe(b);
                b
            }
            None => 0,
        }
    }

    pub fn reset_process_peak(&mut self) {
        let now = self.process_used();
        self.sampler.reset_peak(now);
    }

    pub fn process_peak(&mut self) -> u64 {
        self.process_used();
        self.sampler.peak()
    }

    /// NVML samples so far (device and process used memory with times) and the rate reached.
    pub fn nvml_samples(&self) -> (Vec<NvmlSample>, f64) {
        (self.sampler.samples(), self.sampler.rate_hz())
    }

    /// The sampler's readings from `start` on, with times in microseconds since `start`, and
    /// the rate it reached.
    pub fn samples_since(&self, start: Instant) -> (Vec<crate::device::DeviceSample>, f64) {
        let offset = start.saturating_duration_since(self.epoch).as_micros() as u64;
        let samples = self
            .sampler
            .samples()
            .into_iter()
            .filter(|s| s.time_us >= offset)
            .map(|s| crate::device::DeviceSample {
                time_us: s.time_us - offset,
                device_used: s.device_used,
                process_used: s.process_used,
            })
            .collect();
        (samples, self.sampler.rate_hz())
    }

    pub(super) fn malloc(&mut self, bytes: u64, during: &str) -> Result<u64> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        // SAFETY: a plain device allocation, freed through `free`.
        match unsafe { drv::malloc_sync(bytes.max(1) as usize) } {
            Ok(p) => {
                self.process_used();
                Ok(p)
            }
            Err(e) if is_oom(&e) => {
                let free = self.mem_info().free;
                Err(Error::OutOfMemory {
                    device: self.spec(),
                    during: during.into(),
                    detail: format!("{bytes} bytes wanted, {free} free"),
                    state: None,
                })
            }
            Err(e) => Err(self.err(during, e)),
        }
    }

    pub(super) fn free(&mut self, ptr: u64) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from `malloc` and is freed once; cuMemFree waits for the kernels
        // before it that may use it.
        let _ = unsafe { drv::free_sync(ptr) };
    }

    pub fn alloc_outside(&mut self, bytes: u64) -> Result<OutsideAlloc> {
        let ptr = self.malloc(bytes, "allocating outside the framework")?;
        let id = self.next_id;
        self.next_id += 1;
        self.outside.insert(id, (ptr, bytes));
        Ok(OutsideAlloc { id, bytes })
    }

    pub fn free_outside(&mut self, alloc: OutsideAlloc) {
        if let Some((ptr, _)) = self.outside.remove(&alloc.id) {
            self.free(ptr);
        }
    }

    /// Memory held by another process: a child `vramscope hold-gpu-memory` allocates it (its
    /// own CUDA context comes on top, as with any other process) and waits until we exit.
    /// Returns the drop in free memory the child caused.
    pub fn hold_foreign(&mut self, bytes: u64) -> Result<u64> {
        let exe = holder_program().map_err(|e| self.err("--outside-before", e))?;
        let free_before = self.mem_info().free;
        let mut child = Command::new(&exe)
            .args([
                "hold-gpu-memory",
                "--ordinal",
                &self.ordinal.to_string(),
                "--bytes",
                &bytes.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| self.err(&format!("starting {}", exe.display()), e))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        if !line.starts_with("held") {
            let _ = child.kill();
            let _ = child.wait();
            if !line.starts_with("failed") {
                return Err(self.err(
                    "--outside-before",
                    format!(
                        "{} hold-gpu-memory gave no answer ({:?})",
                        exe.display(),
                        line.trim()
                    ),
                ));
            }
            let free = self.mem_info().free;
            return Err(Error::OutOfMemory {
                device: self.spec(),
                during: "holding memory for another process (--outside-before)".into(),
                detail: format!("{bytes} bytes wanted, {free} free ({})", line.trim()),
                state: None,
            });
        }
        self.foreign.push(child);
        Ok(free_before.saturating_sub(self.mem_info().free))
    }

    pub fn synchronize(&mut self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.err("synchronize", e))
    }

    pub fn map_segment(&mut self, bytes: u64) -> Option<SegmentHandle> {
        let ptr = self.malloc(bytes, "mapping a segment").ok()?;
        self.segments.insert(ptr, bytes);
        Some(SegmentHandle(ptr))
    }

    pub fn unmap_segment(&mut self, handle: SegmentHandle) {
        if self.segments.remove(&handle.0).is_some() {
            self.free(handle.0);
        }
    }

    /// Copies small host data (ids, positions, outlier columns) to a reused device buffer
    /// outside the framework; returns its pointer.
    pub(super) fn stage(&mut self, bytes: &[u8]) -> Result<u64> {
        if self.on_side_stream() {
            return self.stage_on_side(bytes);
        }
        let need = (bytes.len() as u64).max(256);
        if self.staging.is_none_or(|(_, b)| b < need) {
            if let Some((p, _)) = self.staging.take() {
                self.free(p);
            }
            let size = need.next_power_of_two();
            let p = self.malloc(size, "staging host data")?;
            self.staging = Some((p, size));
        }
        let (p, _) = self.staging.expect("staging buffer");
        // SAFETY: `bytes` fits the buffer; the copy is ordered after earlier kernels.
        unsafe { drv::memcpy_htod_sync(p, bytes) }.map_err(|e| self.err("copy to GPU", e))?;
        Ok(p)
    }

    pub fn upload_f32(&mut self, t: &mut TensorData, d: &[f32]) -> Result<()> {
        if d.len() != t.numel() {
            return Err(self.err(
                "upload",
                format!("{}: {} values for {} elements", t.name, d.len(), t.numel()),
            ));
        }
        self.upload_f32_at(t, 0, d)
    }

    pub fn upload_bytes(&mut self, t: &mut TensorData, d: &[u8]) -> Result<()> {
        if d.len() as u64 != t.nbytes() {
            return Err(self.err(
                "upload",
                format!("{}: {} bytes for {}", t.name, d.len(), t.nbytes()),
            ));
        }
        self.upload_bytes_at(t, 0, d)
    }

    /// Converts `d` into `t`'s dtype (f32, f16, bf16) from element `offset` on (the whole
    /// tensor, or a part of a fused weight).
    pub fn upload_f32_at(&mut self, t: &mut TensorData, offset: usize, d: &[f32]) -> Result<()> {
        if offset
            .checked_add(d.len())
            .is_none_or(|end| end > t.numel())
        {
            return Err(self.err(
                "upload",
                format!(
                    "{}: {} values at {offset} of {}",
                    t.name,
                    d.len(),
                    t.numel()
                ),
            ));
        }
        let p = t.cuda_ptr() + (offset as u64) * t.dtype.size_bytes();
        match t.dtype {
            DType::F32 => {
                // SAFETY: f32 has no padding; the byte view covers exactly `d`.
                let b = unsafe { std::slice::from_raw_parts(d.as_ptr().cast::<u8>(), d.len() * 4) };
                self.upload_staged(p, b.len(), 4, &|off, out| {
                    out.copy_from_slice(&b[off..off + out.len()])
                })
            }
            DType::F16 => self.upload_staged(p, d.len() * 2, 2, &|off, out| {
                to_halves::<half::f16>(out, &d[off / 2..])
            }),
            DType::BF16 => self.upload_staged(p, d.len() * 2, 2, &|off, out| {
                to_halves::<half::bf16>(out, &d[off / 2..])
            }),
            other => Err(self.err(
                "upload",
                format!("{}: f32 values for a {} tensor", t.name, other.name()),
            )),
        }
    }

    /// Copies `d` into `t` from byte `offset` on (a part of a fused weight, as stored).
    pub fn upload_bytes_at(&mut self, t: &mut TensorData, offset: u64, d: &[u8]) -> Result<()> {
        if offset
            .checked_add(d.len() as u64)
            .is_none_or(|end| end > t.nbytes())
        {
            return Err(self.err(
                "upload",
                format!(
                    "{}: {} bytes at {offset} of {}",
                    t.name,
                    d.len(),
                    t.nbytes()
                ),
            ));
        }
        let p = t.cuda_ptr() + offset;
        self.upload_staged(p, d.len(), 1, &|off, out| {
            out.copy_from_slice(&d[off..off + out.len()])
        })
    }

    /// Copies `bytes` to device address `dst` in chunks through the page-locked buffer:
    /// `fill(offset, out)` writes bytes [offset, offset + out.len()) of the data (converting if
    /// need be), on all cores for large chunks; then one DMA copy per chunk. Without a pinned
    /// buffer, one pageable copy of the whole data.
    fn upload_staged(
        &mut self,
        dst: u64,
        bytes: usize,
        elem: usize,
        fill: &(dyn Fn(usize, &mut [u8]) + Sync),
    ) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        if self.on_side_stream() {
            // The legacy stream's copies do not wait for the side stream's kernels.
            self.synchronize()?;
        }
        let (buf, cap) = self.pinned_buffer();
        if cap == 0 {
            // u32 storage: `fill` may view its bytes as 2- or 4-byte values.
            let mut words = vec![0u32; bytes.div_ceil(4)];
            // SAFETY: the byte view stays inside `words`.
            let host =
                unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), bytes) };
            fill(0, host);
            // SAFETY: the caller checked that `dst` holds `bytes` bytes.
            return unsafe { drv::memcpy_htod_sync(dst, &*host) }
                .map_err(|e| self.err("copy to GPU", e));
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut off = 0;
        while off < bytes {
            let len = cap.min(bytes - off);
            // SAFETY: the pinned buffer holds `cap` bytes, used by this thread only, and the
            // previous chunk's copy finished (synchronous copies).
            let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
            let t = crate::base::timing::span("load: weights into the pinned buffer (convert)");
            if len < 4 << 20 || threads == 1 {
                fill(off, out);
            } else {
                let per = len.div_ceil(threads).next_multiple_of(elem * 64);
                std::thread::scope(|s| {
                    for (i, piece) in out.chunks_mut(per).enumerate() {
                        s.spawn(move || fill(off + i * per, piece));
                    }
                });
            }
            drop(t);
            let _t = crate::base::timing::span("load: pinned buffer to the GPU (DMA)");
            // SAFETY: `dst + off` holds `len` more bytes (checked by the caller).
            unsafe { drv::memcpy_htod_sync(dst + off as u64, out) }
                .map_err(|e| self.err("copy to GPU", e))?;
            off += len;
        }
        Ok(())
    }

    /// The pinned upload buffer (address, bytes); (0, 0) when the driver gives none.
    fn pinned_buffer(&mut self) -> (usize, usize) {
        *self.pinned.get_or_insert_with(|| {
            // SAFETY: a plain page-locked host allocation, freed in Drop.
            match unsafe { drv::malloc_host(PINNED_BYTES, 0) } {
                Ok(p) if !p.is_null() => (p as usize, PINNED_BYTES),
                _ => (0, 0),
            }
        })
    }

    pub fn download_f32(&mut self, x: &TensorData) -> Result<Vec<f32>> {
        let p = x.cuda_ptr();
        let n = x.numel();
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        if self.on_side_stream() {
            self.synchronize()?;
        }
        // SAFETY: the tensor holds n elements of its dtype; the copy waits for the kernels
        // before it on the default stream.
        unsafe {
            match x.dtype {
                DType::F32 => {
                    let mut v = vec![0f32; n];
                    drv::memcpy_dtoh_sync(&mut v, p).map_err(|e| self.err("copy from GPU", e))?;
                    Ok(v)
                }
                DType::F16 => {
                    let mut v = vec![half::f16::ZERO; n];
                    drv::memcpy_dtoh_sync(&mut v, p).map_err(|e| self.err("copy from GPU", e))?;
                    Ok(v.iter().map(|h| h.to_f32()).collect())
                }
                DType::BF16 => {
                    let mut v = vec![half::bf16::ZERO; n];
                    drv::memcpy_dtoh_sync(&mut v, p).map_err(|e| self.err("copy from GPU", e))?;
                    Ok(v.iter().map(|h| h.to_f32()).collect())
                }
                other => Err(self.err(
                    "download",
                    format!("{} is {}, not a float tensor", x.name, other.name()),
                )),
            }
        }
    }
}

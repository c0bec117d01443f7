//! CUDA backend: cudarc (driver, NVRTC, cuBLAS) loaded at run time, NVML for ground truth.
//! Framework segments and memory outside the framework are plain `cuMemAlloc`s; tensors are
//! views into segments. GEMMs run in cuBLAS (16-bit with f32 accumulation, int8 with int32
//! accumulation); everything else in the NVRTC kernels of `kernels.rs`. All work goes to the
//! legacy default stream, so host copies and frees are ordered after the kernels before them.

mod collectives;
mod kernels;
mod loader;
mod nccl;
mod nvml;
mod sampler;

use std::collections::HashMap;
use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::{result as blas, sys as bsys};
use cudarc::driver::{
    result as drv, sys as dsys, CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError,
    LaunchConfig, PushKernelArg,
};

use super::cpu::AttnShape;
use super::{DeviceInfo, DeviceListing, LibraryWorkspace, MemInfo, OutsideAlloc, WorkspaceBytes};
use crate::error::{Error, Result};
use crate::memory::SegmentHandle;
use crate::tensor::{DType, Tensor};
pub use collectives::nccl_library;
pub use nvml::NvmlSample;

/// cuBLAS workspace, PyTorch's default on Hopper (`CUBLAS_WORKSPACE_CONFIG=:4096:8`).
const CUBLAS_WORKSPACE_BYTES: u64 = 32 << 20;
/// Bound on the attention score buffer (f32 scores of one chunk of query rows);
/// `VRAMSCOPE_ATTN_SCRATCH_MIB` changes it (fewer, larger chunks run faster).
const ATTN_SCRATCH_BYTES: u64 = 64 << 20;
/// Page-locked host memory weight uploads are converted into and copied from, chunk by chunk.
const PINNED_BYTES: usize = 64 << 20;

fn attn_scratch_bound() -> u64 {
    std::env::var("VRAMSCOPE_ATTN_SCRATCH_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&m| m > 0)
        .map_or(ATTN_SCRATCH_BYTES, |m| m << 20)
}

pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: HashMap<String, CudaFunction>,
    blas: Option<bsys::cublasHandle_t>,
    /// The cuBLAS workspace: a framework block (address, bytes).
    blas_workspace: Option<(u64, u64)>,
    name: String,
    total: u64,
    cc: (i32, i32),
    nvml: Arc<nvml_wrapper::Nvml>,
    nvml_index: u32,
    used_before: u64,
    per_process: bool,
    sampler: nvml::Sampler,
    outside: HashMap<u64, (u64, u64)>,
    next_id: u64,
    segments: HashMap<u64, u64>,
    staging: Option<(u64, u64)>,
    /// Page-locked host buffer weight uploads go through (address, bytes), made on first use;
    /// `Some((0, 0))` when the driver would not give one (uploads then copy directly).
    pinned: Option<(usize, usize)>,
    attn_scratch: Option<(u64, u64)>,
    foreign: Vec<Child>,
    /// The NVML sampler's clock.
    epoch: Instant,
    /// `VRAMSCOPE_FLASH` when the device opened: a fused attention variant, for measurements.
    flash_variant: String,
    /// `VRAMSCOPE_ATTN=blas`: the cuBLAS attention instead of the fused kernels.
    attention_blas: bool,
    /// Per-op GPU timing (`bench --op-times`): an event recorded at every op boundary.
    op_marks: Option<Vec<(String, CudaEvent)>>,
    /// NCCL communicators when this GPU is one rank of a tensor-parallel instance.
    comms: collectives::Comms,
}

fn dev_err(ordinal: usize, problem: impl Into<String>) -> Error {
    Error::Device {
        spec: format!("cuda:{ordinal}"),
        problem: problem.into(),
    }
}

fn is_oom(e: &DriverError) -> bool {
    e.0 == dsys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Lists the GPUs NVML sees (name, total, used, driver); no CUDA context is made.
pub fn detect() -> Result<Vec<DeviceListing>> {
    let path = loader::ensure_nvml().map_err(|e| dev_err(0, e))?;
    let nv = nvml::init(&path).map_err(|e| dev_err(0, e))?;
    let driver = nv.sys_driver_version().unwrap_or_else(|_| "?".into());
    let count = nv
        .device_count()
        .map_err(|e| dev_err(0, format!("NVML cannot count GPUs: {e}")))?;
    if count == 0 {
        return Err(dev_err(0, "NVML found no GPU"));
    }
    // `cuda:N` is the CUDA driver's ordinal N (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
    // apply); NVML numbers every GPU by PCI order. Match them by UUID, as `open` does.
    let ordinals = cuda_ordinals_to_nvml(&nv);
    let (pairs, note) = match ordinals {
        Ok(pairs) => (pairs, String::new()),
        Err(why) => (
            (0..count).map(|i| (i as usize, i)).collect(),
            format!("; numbered by NVML, not by the CUDA driver ({why})"),
        ),
    };
    if pairs.is_empty() {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES")
            .map(|v| format!(" (CUDA_VISIBLE_DEVICES is \"{v}\")"))
            .unwrap_or_default();
        return Err(dev_err(
            0,
            format!("NVML sees {count} GPU(s) but the CUDA driver sees none{visible}"),
        ));
    }
    let mut out = Vec::new();
    for (ordinal, index) in pairs {
        let d = nv
            .device_by_index(index)
            .map_err(|e| dev_err(ordinal, format!("NVML: {e}")))?;
        let name = d.name().unwrap_or_else(|_| "NVIDIA GPU".into());
        let mem = d
            .memory_info()
            .map_err(|e| dev_err(ordinal, format!("NVML memory info: {e}")))?;
        out.push(DeviceListing {
            spec: format!("cuda:{ordinal}"),
            name: format!(
                "{name} (driver {driver}, {} used{note})",
                crate::units::fmt_u(mem.used)
            ),
            total_bytes: mem.total,
            simulated: false,
        });
    }
    Ok(out)
}

/// (CUDA ordinal, NVML index) of every GPU the CUDA driver sees.
fn cuda_ordinals_to_nvml(
    nv: &nvml_wrapper::Nvml,
) -> std::result::Result<Vec<(usize, u32)>, String> {
    loader::ensure_driver()?;
    let d = |e: DriverError| format!("CUDA driver: {e}");
    match drv::init() {
        // CUDA_VISIBLE_DEVICES hides every GPU: the driver sees none.
        Err(e) if e.0 == dsys::CUresult::CUDA_ERROR_NO_DEVICE => return Ok(Vec::new()),
        r => r.map_err(d)?,
    }
    let count = drv::device::get_count().map_err(d)?;
    (0..count.max(0))
        .map(|ordinal| Ok((ordinal as usize, nvml_index_of(nv, ordinal)?)))
        .collect()
}

/// NVML's index of the GPU the CUDA driver calls `ordinal` (matched by UUID).
fn nvml_index_of(nv: &nvml_wrapper::Nvml, ordinal: i32) -> std::result::Result<u32, String> {
    let d = |e: DriverError| format!("CUDA driver: {e}");
    let dev = drv::device::get(ordinal).map_err(d)?;
    let uuid = drv::device::get_uuid(dev).map_err(d)?;
    nvml::index_of(nv, &uuid.bytes.map(|b| b as u8))
}

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
    /// Loads the libraries, creates the context, compiles the kernels and starts the sampler.
    pub fn open(ordinal: usize) -> Result<Self> {
        let found = loader::ensure_loaded().map_err(|e| dev_err(ordinal, e))?;
        let nv = nvml::init(&found.nvml).map_err(|e| dev_err(ordinal, e))?;
        let d = |e: DriverError| dev_err(ordinal, format!("CUDA driver: {e}"));
        drv::init().map_err(d)?;
        let count = drv::device::get_count().map_err(d)?;
        if ordinal >= count.max(0) as usize {
            return Err(dev_err(
                ordinal,
                format!("no such GPU: the driver sees {count}"),
            ));
        }
        let nvml_index = nvml_index_of(&nv, ordinal as i32).map_err(|e| dev_err(ordinal, e))?;
        let pid = std::process::id();
        let before = nvml::read(&nv, nvml_index, pid)
            .ok_or_else(|| dev_err(ordinal, "NVML cannot read the GPU's memory"))?;
        let ctx = CudaContext::new(ordinal).map_err(d)?;
        let stream = ctx.default_stream();
        let cc = ctx.compute_capability().map_err(d)?;
        let name = ctx.name().map_err(d)?;
        let total = ctx.total_mem().map_err(d)? as u64;
        let funcs = compile_kernels(&ctx, cc).map_err(|e| dev_err(ordinal, e))?;
        let now = nvml::read(&nv, nvml_index, pid);
        let per_process = now.is_some_and(|r| r.process_used.is_some());
        let epoch = Instant::now();
        let sampler = nvml::Sampler::start(nv.clone(), nvml_index, before.device_used, epoch);
        let dev = CudaDevice {
            ordinal,
            ctx,
            stream,
            funcs,
            blas: None,
            blas_workspace: None,
            name,
            total,
            cc,
            nvml: nv,
            nvml_index,
            used_before: before.device_used,
            per_process,
            sampler,
            outside: HashMap::new(),
            next_id: 1,
            segments: HashMap::new(),
            staging: None,
            pinned: None,
            attn_scratch: None,
            foreign: Vec::new(),
            epoch,
            flash_variant: flash_variant_from_env(),
            attention_blas: std::env::var("VRAMSCOPE_ATTN").is_ok_and(|v| v == "blas"),
            op_marks: None,
            comms: collectives::Comms::default(),
        };
        dev.sampler.reset_peak(dev.process_used());
        Ok(dev)
    }

    /// Starts (or stops) timing ops on the GPU: from now on every `mark_op` records an event.
    pub fn time_ops(&mut self, on: bool) {
        self.op_marks = on.then(Vec::new);
    }

    /// An op boundary: the GPU time until the next boundary is charged to `op` (and `detail`,
    /// when not empty, such as the projection of a matmul).
    pub fn mark_op(&mut self, op: &str, detail: &str) {
        let Some(marks) = self.op_marks.as_mut() else {
            return;
        };
        let label = if detail.is_empty() {
            op.to_string()
        } else {
            format!("{op} {detail}")
        };
        // An event that cannot be recorded only loses this op's share of the timing.
        if let Ok(e) = self
            .stream
            .record_event(Some(dsys::CUevent_flags::CU_EVENT_DEFAULT))
        {
            marks.push((label, e));
        }
    }

    /// GPU milliseconds per op since `time_ops(true)`, in order of first appearance; the
    /// marks are cleared. Waits for the recorded work to finish.
    pub fn op_times(&mut self) -> Result<Vec<(String, f64)>> {
        let Some(marks) = self.op_marks.as_mut() else {
            return Ok(Vec::new());
        };
        let end = self
            .stream
            .record_event(Some(dsys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| dev_err(self.ordinal, format!("op timing: {e}")))?;
        let marks = std::mem::take(marks);
        let mut out: Vec<(String, f64)> = Vec::new();
        for (i, (op, e)) in marks.iter().enumerate() {
            let next = marks.get(i + 1).map_or(&end, |(_, n)| n);
            let ms = e
                .elapsed_ms(next)
                .map_err(|e| dev_err(self.ordinal, format!("op timing: {e}")))?;
            match out.iter_mut().find(|(o, _)| o == op) {
                Some((_, t)) => *t += ms as f64,
                None => out.push((op.clone(), ms as f64)),
            }
        }
        Ok(out)
    }

    fn spec(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> Error {
        dev_err(self.ordinal, format!("{what}: {e}"))
    }

    pub fn info(&self) -> DeviceInfo {
        DeviceInfo {
            spec: self.spec(),
            name: format!("{} (cc {}.{})", self.name, self.cc.0, self.cc.1),
            total_bytes: self.total,
            simulated: false,
            mode: "cuda".into(),
            truth_source: if self.per_process {
                "NVML per-process used memory (sampler thread + after each cuMemAlloc)".into()
            } else {
                "NVML device used memory minus the use before this process (NVML does not list this PID)".into()
            },
        }
    }

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

    /// bitsandbytes' CxB row tile: `col_turing` (8) on Turing and Hopper, `col_ampere` (32)
    /// on compute capability 8.x.
    pub fn cxb_row_pad(&self) -> usize {
        if self.cc.0 == 8 {
            32
        } else {
            8
        }
    }

    /// The workspaces PyTorch takes from its caching allocator on this GPU: cuBLAS 32 MiB on
    /// Hopper (`CUBLAS_WORKSPACE_CONFIG` ":4096:8"), 8.125 MiB before; cuBLASLt 1 MiB. Measured
    /// with torch 2.11 on the H200 (scripts/torch_probe.py, docs/gpu-runs.md run 24).
    pub fn library_workspace_bytes(&self) -> WorkspaceBytes {
        WorkspaceBytes {
            cublas: if self.cc.0 >= 9 {
                CUBLAS_WORKSPACE_BYTES
            } else {
                4096 * 1024 * 2 + 16 * 1024 * 8
            },
            cublaslt: 1 << 20,
        }
    }

    /// Gives cuBLAS a framework block as its workspace (as PyTorch's handle pool does).
    pub fn set_library_workspace(&mut self, which: LibraryWorkspace, ptr: u64, bytes: u64) {
        if which != LibraryWorkspace::Cublas {
            // Our GEMMs use no cuBLASLt epilogue; the block is held as PyTorch holds it.
            return;
        }
        self.blas_workspace = Some((ptr, bytes));
        if let Some(h) = self.blas {
            // SAFETY: the block lives until `clear_library_workspaces`, called before it is freed.
            unsafe { bsys::cublasSetWorkspace_v2(h, ptr as *mut c_void, bytes as usize) };
        }
    }

    /// Detaches the workspace before its block is freed.
    pub fn clear_library_workspaces(&mut self) {
        if self.blas_workspace.take().is_some() {
            let _ = self.synchronize();
            if let Some(h) = self.blas {
                // SAFETY: detaches the workspace; cuBLAS falls back to its own.
                unsafe { bsys::cublasSetWorkspace_v2(h, std::ptr::null_mut(), 0) };
            }
        }
    }

    fn malloc(&mut self, bytes: u64, during: &str) -> Result<u64> {
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
                })
            }
            Err(e) => Err(self.err(during, e)),
        }
    }

    fn free(&mut self, ptr: u64) {
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

    // ----- helpers -----

    fn func(&self, name: &str, dt: DType) -> Result<&CudaFunction> {
        let key = match dt {
            DType::F16 => format!("{name}_f16"),
            DType::BF16 => format!("{name}_bf16"),
            _ => name.to_string(),
        };
        self.funcs
            .get(&key)
            .ok_or_else(|| self.err("kernel", format!("{key} was not compiled")))
    }

    fn half(&self, t: &Tensor) -> Result<DType> {
        match t.dtype {
            DType::F16 | DType::BF16 => Ok(t.dtype),
            other => Err(self.err(
                "kernel",
                format!(
                    "tensor {} is {}, expected f16 or bf16",
                    t.name,
                    other.name()
                ),
            )),
        }
    }

    /// Copies small host data (ids, positions, outlier columns) to a reused device buffer
    /// outside the framework; returns its pointer.
    fn stage(&mut self, bytes: &[u8]) -> Result<u64> {
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

    fn launch(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[&dyn KArg]) -> Result<()> {
        let mut b = self.stream.launch_builder(f);
        for a in args {
            a.push(&mut b);
        }
        // SAFETY: every kernel's arguments are checked against its signature in this file and
        // its pointers are live tensors, sized by the shapes passed alongside.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| self.err("kernel launch", e))
    }

    fn blas(&mut self) -> Result<bsys::cublasHandle_t> {
        if let Some(h) = self.blas {
            return Ok(h);
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        let h = blas::create_handle().map_err(|e| self.err("cuBLAS handle", e))?;
        // SAFETY: the handle is new; the null stream and the workspace outlive it.
        unsafe {
            blas::set_stream(h, self.stream.cu_stream() as _)
                .map_err(|e| self.err("cuBLAS stream", e))?;
            if let Some((ws, bytes)) = self.blas_workspace {
                bsys::cublasSetWorkspace_v2(h, ws as *mut c_void, bytes as usize);
            }
        }
        self.blas = Some(h);
        Ok(h)
    }

    /// Row-major GEMM through column-major cuBLAS: `C[m, n] = A[m, k] · B`, with B stored
    /// `[n, k]` when `b_trans` (so `A·Bᵀ`) or `[k, n]` otherwise; strided batches.
    #[allow(clippy::too_many_arguments)]
    fn gemm(&mut self, g: Gemm) -> Result<()> {
        let h = self.blas()?;
        let op_b = if g.b_trans {
            bsys::cublasOperation_t::CUBLAS_OP_T
        } else {
            bsys::cublasOperation_t::CUBLAS_OP_N
        };
        let int = matches!(g.compute, bsys::cublasComputeType_t::CUBLAS_COMPUTE_32I);
        let (af, bf) = (g.alpha, g.beta);
        let (ai, bi) = (g.alpha as i32, g.beta as i32);
        let (alpha, beta): (*const c_void, *const c_void) = if int {
            (&ai as *const i32 as _, &bi as *const i32 as _)
        } else {
            (&af as *const f32 as _, &bf as *const f32 as _)
        };
        // C' = Cᵀ (n×m, column-major) = op(B)ᵀ·Aᵀ.
        // SAFETY: pointers are live device tensors and the leading dimensions match their
        // shapes (checked by the callers).
        if g.batch == 1 {
            let r = unsafe {
                blas::gemm_ex(
                    h,
                    op_b,
                    bsys::cublasOperation_t::CUBLAS_OP_N,
                    g.n as i32,
                    g.m as i32,
                    g.k as i32,
                    alpha,
                    g.b as *const c_void,
                    g.b_type,
                    g.ldb as i32,
                    g.a as *const c_void,
                    g.a_type,
                    g.lda as i32,
                    beta,
                    g.c as *mut c_void,
                    g.c_type,
                    g.ldc as i32,
                    g.compute,
                    bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            };
            return r.map_err(|e| self.err("cuBLAS GEMM", e));
        }
        // SAFETY: as above, for each of the strided batches.
        let r = unsafe {
            blas::gemm_strided_batched_ex(
                h,
                op_b,
                bsys::cublasOperation_t::CUBLAS_OP_N,
                g.n as i32,
                g.m as i32,
                g.k as i32,
                alpha,
                g.b as *const c_void,
                g.b_type,
                g.ldb as i32,
                g.stride_b,
                g.a as *const c_void,
                g.a_type,
                g.lda as i32,
                g.stride_a,
                beta,
                g.c as *mut c_void,
                g.c_type,
                g.ldc as i32,
                g.stride_c,
                g.batch as i32,
                g.compute,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        r.map_err(|e| self.err("cuBLAS GEMM", e))
    }

    // ----- ops -----

    pub fn embedding(&mut self, ids: &[u32], table: &Tensor, out: &mut Tensor) -> Result<()> {
        self.gather(ids, table, out)
    }

    fn gather(&mut self, rows: &[u32], src: &Tensor, out: &mut Tensor) -> Result<()> {
        let dt = self.half(src)?;
        if rows.is_empty() {
            return Ok(());
        }
        let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
        let ids = self.stage(&bytes)?;
        let cols = src.cols() as i64;
        let (t, o) = (src.cuda_ptr(), out.cuda_ptr());
        let f = self.func("embedding", dt)?;
        self.launch(f, blocks(rows.len() as u32, 256), &[&ids, &t, &o, &cols])
    }

    pub fn rms_norm(&mut self, x: &Tensor, w: &Tensor, eps: f32, out: &mut Tensor) -> Result<()> {
        let dt = self.half(x)?;
        let cols = x.cols() as i32;
        let rows = (x.numel() / x.cols()) as u32;
        let (xp, wp, op) = (x.cuda_ptr(), w.cuda_ptr(), out.cuda_ptr());
        let f = if cols % 8 == 0 && aligned16(&[xp, wp, op]) {
            self.func("rms_norm_v8", dt)?
        } else {
            self.func("rms_norm", dt)?
        };
        self.launch(f, blocks(rows, 256), &[&xp, &wp, &op, &cols, &eps])
    }

    pub fn add_bias(&mut self, x: &mut Tensor, b: &Tensor) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let cols = b.numel() as i32;
        let (xp, bp) = (x.cuda_ptr(), b.cuda_ptr());
        let f = self.func("add_bias", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &bp, &n, &cols])
    }

    pub fn rope(
        &mut self,
        q: &mut Tensor,
        k: &mut Tensor,
        pos: &[usize],
        shape: AttnShape,
        theta: f32,
    ) -> Result<()> {
        let dt = self.half(q)?;
        let bytes: Vec<u8> = pos.iter().flat_map(|&p| (p as i32).to_le_bytes()).collect();
        let pp = self.stage(&bytes)?;
        let hd = shape.head_dim as i32;
        let rows = pos.len() as u32;
        if shape.head_dim > 512 {
            // The kernels keep one token's angles in 256 shared floats.
            return Err(self.err("rope", format!("head_dim {} is over 512", shape.head_dim)));
        }
        let (qp, kp) = (q.cuda_ptr(), k.cuda_ptr());
        if shape.head_dim.is_multiple_of(4) && qp.is_multiple_of(4) && kp.is_multiple_of(4) {
            let (h, kvh) = (shape.heads as i32, shape.kv_heads as i32);
            let f = self.func("rope_qk", dt)?;
            return self.launch(
                f,
                blocks(rows, 256),
                &[&qp, &kp, &pp, &h, &kvh, &hd, &theta],
            );
        }
        for (t, heads) in [(&*q, shape.heads), (&*k, shape.kv_heads)] {
            let xp = t.cuda_ptr();
            let h = heads as i32;
            let f = self.func("rope", dt)?;
            self.launch(f, blocks(rows, 128), &[&xp, &pp, &h, &hd, &theta])?;
        }
        Ok(())
    }

    /// Causal GQA attention. On compute capability 8.0+ with a head dimension the fused kernel
    /// is built for, one kernel per sequence keeps the scores on chip (flash attention, no
    /// scratch memory); otherwise `attention_blas`. `VRAMSCOPE_ATTN=blas` forces the latter.
    pub fn attention(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        seq_lens: &[usize],
        shape: AttnShape,
        out: &mut Tensor,
    ) -> Result<()> {
        let dt = self.half(q)?;
        let hd = shape.head_dim;
        let kernel = flash_kernel(hd, &self.flash_variant, |n| {
            self.funcs.contains_key(&format!("{n}_f16"))
        });
        let fused = shape.kv_heads > 0
            && shape.heads.is_multiple_of(shape.kv_heads)
            && !self.attention_blas;
        let Some(kern) = kernel.filter(|_| fused) else {
            return self.attention_blas(q, k, v, seq_lens, shape, out);
        };
        let (heads, kvh) = (shape.heads as i32, shape.kv_heads as i32);
        let (qw, kw) = ((shape.heads * hd) as u64, (shape.kv_heads * hd) as u64);
        let scale_log2 = std::f32::consts::LOG2_E / (hd as f32).sqrt();
        let (qp, kp, vp, op) = (q.cuda_ptr(), k.cuda_ptr(), v.cuda_ptr(), out.cuda_ptr());
        let tile = kern.tile;
        let mut start = 0u64;
        for &len in seq_lens {
            if len > 0 {
                let tiles = len.div_ceil(tile);
                if tiles > 65535 {
                    return Err(self.err(
                        "attention",
                        format!(
                            "a sequence of {len} tokens is longer than the fused kernel's grid"
                        ),
                    ));
                }
                let f = self.func(kern.name, dt)?;
                let lc = LaunchConfig {
                    grid_dim: (heads as u32, tiles as u32, 1),
                    block_dim: (kern.warps as u32 * 32, 1, 1),
                    shared_mem_bytes: kern.smem as u32,
                };
                let (qs, ks, vs, os) = (
                    qp + start * qw * 2,
                    kp + start * kw * 2,
                    vp + start * kw * 2,
                    op + start * qw * 2,
                );
                let len32 = len as i32;
                self.launch(
                    f,
                    lc,
                    &[&qs, &ks, &vs, &os, &len32, &heads, &kvh, &scale_log2],
                )?;
            }
            start += len as u64;
        }
        Ok(())
    }

    /// Causal GQA attention in chunks of query rows: scores of a chunk against the keys up to
    /// its end (cuBLAS, f32), causal softmax in place into 16-bit probabilities, then P·V
    /// (cuBLAS) into the output. The score buffer stays under 64 MiB at any length.
    fn attention_blas(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        seq_lens: &[usize],
        shape: AttnShape,
        out: &mut Tensor,
    ) -> Result<()> {
        let dt = self.half(q)?;
        let (heads, kvh, hd) = (shape.heads, shape.kv_heads, shape.head_dim);
        let group = heads / kvh;
        let (qw, kw) = (heads * hd, kvh * hd);
        let ty = blas_type(dt);
        let esz = 2u64;
        let scale = 1.0 / (hd as f32).sqrt();
        let max_len = seq_lens.iter().copied().max().unwrap_or(0);
        if max_len == 0 {
            return Ok(());
        }
        let ld_max = max_len.div_ceil(8) * 8;
        let row_bytes = (kvh * ld_max * 4) as u64;
        let chunk = ((attn_scratch_bound() / row_bytes) as usize / 16 * 16).clamp(16, ld_max);
        let need = row_bytes * chunk as u64;
        if self.attn_scratch.is_none_or(|(_, b)| b < need) {
            if let Some((p, _)) = self.attn_scratch.take() {
                self.free(p);
            }
            let p = self.malloc(need, "attention score buffer")?;
            self.attn_scratch = Some((p, need));
        }
        let s = self.attn_scratch.expect("scratch").0;
        let (qp, kp, vp, op) = (q.cuda_ptr(), k.cuda_ptr(), v.cuda_ptr(), out.cuda_ptr());
        let mut start = 0usize;
        for &len in seq_lens {
            let mut r0 = 0;
            while r0 < len {
                let rows = chunk.min(len - r0);
                let keys = r0 + rows;
                let ld = keys.div_ceil(8) * 8;
                for g in 0..group {
                    // S[b, rows, keys] = scale · Q_b · K_bᵀ over the kv heads b
                    self.gemm(Gemm {
                        m: rows,
                        n: keys,
                        k: hd,
                        a: qp + ((start + r0) * qw + g * hd) as u64 * esz,
                        a_type: ty,
                        lda: qw,
                        stride_a: (group * hd) as i64,
                        b: kp + (start * kw) as u64 * esz,
                        b_type: ty,
                        ldb: kw,
                        stride_b: hd as i64,
                        b_trans: true,
                        c: s,
                        c_type: bsys::cudaDataType_t::CUDA_R_32F,
                        ldc: ld,
                        stride_c: (rows * ld) as i64,
                        batch: kvh,
                        alpha: scale,
                        beta: 0.0,
                        compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    })?;
                    let (ld64, rows32, keys32, q0) =
                        (ld as i64, rows as i32, keys as i32, r0 as i32);
                    // Up to 8192 keys the row fits in registers (one read of the scores).
                    let name = if keys <= 256 * 32 {
                        "softmax_causal_reg"
                    } else {
                        "softmax_causal"
                    };
                    let f = self.func(name, dt)?;
                    let shape = LaunchConfig {
                        grid_dim: (rows as u32, kvh as u32, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    self.launch(f, shape, &[&s, &ld64, &rows32, &keys32, &q0])?;
                    // O_b[rows, hd] = P_b · V_b, P with 16-bit rows of 2·ld elements
                    self.gemm(Gemm {
                        m: rows,
                        n: hd,
                        k: keys,
                        a: s,
                        a_type: ty,
                        lda: 2 * ld,
                        stride_a: (rows * 2 * ld) as i64,
                        b: vp + (start * kw) as u64 * esz,
                        b_type: ty,
                        ldb: kw,
                        stride_b: hd as i64,
                        b_trans: false,
                        c: op + ((start + r0) * qw + g * hd) as u64 * esz,
                        c_type: ty,
                        ldc: qw,
                        stride_c: (group * hd) as i64,
                        batch: kvh,
                        alpha: 1.0,
                        beta: 0.0,
                        compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    })?;
                }
                r0 += rows;
            }
            start += len;
        }
        Ok(())
    }

    pub fn add_assign(&mut self, x: &mut Tensor, y: &Tensor) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let (xp, yp) = (x.cuda_ptr(), y.cuda_ptr());
        if n % 8 == 0 && aligned16(&[xp, yp]) {
            let n8 = n / 8;
            let f = self.func("add_assign_v8", dt)?;
            return self.launch(f, grid(n8 as u64), &[&xp, &yp, &n8]);
        }
        let f = self.func("add_assign", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &yp, &n])
    }

    pub fn silu_mul(&mut self, g: &mut Tensor, u: &Tensor) -> Result<()> {
        let dt = self.half(g)?;
        let n = g.numel() as i64;
        let (gp, up) = (g.cuda_ptr(), u.cuda_ptr());
        if n % 8 == 0 && aligned16(&[gp, up]) {
            let n8 = n / 8;
            let f = self.func("silu_mul_v8", dt)?;
            return self.launch(f, grid(n8 as u64), &[&gp, &up, &n8]);
        }
        let f = self.func("silu_mul", dt)?;
        self.launch(f, grid(n as u64), &[&gp, &up, &n])
    }

    pub fn gather_rows(&mut self, x: &Tensor, rows: &[u32], out: &mut Tensor) -> Result<()> {
        self.gather(rows, x, out)
    }

    pub fn to_f32(&mut self, x: &Tensor, out: &mut Tensor) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("to_f32", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &op, &n])
    }

    /// `out [m, n] = x [m, k] · w [n, k]ᵀ` in 16 bits with f32 accumulation.
    pub fn gemm_nt(&mut self, x: &Tensor, w: &Tensor, out: &mut Tensor) -> Result<()> {
        let dt = self.half(x)?;
        let ty = blas_type(dt);
        let (m, k, n) = (x.rows(), x.cols(), w.shape[0]);
        self.gemm(Gemm {
            m,
            n,
            k,
            a: x.cuda_ptr(),
            a_type: ty,
            lda: k,
            stride_a: 0,
            b: w.cuda_ptr(),
            b_type: blas_type(self.half(w)?),
            ldb: k,
            stride_b: 0,
            b_trans: true,
            c: out.cuda_ptr(),
            c_type: ty,
            ldc: n,
            stride_c: 0,
            batch: 1,
            alpha: 1.0,
            beta: 0.0,
            compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        })
    }

    // ----- LLM.int8 -----

    /// `F.double_quant`: column absmax (SCAt), the column-wise int8 copy (CAt), and the
    /// row-wise int8 copy without outlier columns (CA, SCA). Returns the outlier columns
    /// (those whose absmax reaches `threshold`; none when it is 0).
    #[allow(clippy::too_many_arguments)]
    pub fn int8_double_quant(
        &mut self,
        x: &Tensor,
        threshold: f32,
        ca: &mut Tensor,
        cat: &mut Tensor,
        sca: &mut Tensor,
        scat: &mut Tensor,
    ) -> Result<Vec<usize>> {
        let dt = self.half(x)?;
        let (m, k) = (x.rows(), x.cols());
        let (xp, cap, catp, scap, scatp) = (
            x.cuda_ptr(),
            ca.cuda_ptr(),
            cat.cuda_ptr(),
            sca.cuda_ptr(),
            scat.cuda_ptr(),
        );
        // SAFETY: scat holds k f32.
        unsafe { drv::memset_d8_async(scatp, 0, k * 4, self.stream.cu_stream()) }
            .map_err(|e| self.err("memset", e))?;
        let (m32, k32) = (m as i32, k as i32);
        let f = self.func("col_absmax", dt)?;
        let cfg = LaunchConfig {
            grid_dim: (k.div_ceil(256) as u32, m.div_ceil(256) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(f, cfg, &[&xp, &scatp, &m32, &k32])?;
        let outliers = if threshold > 0.0 {
            let col = self.download_f32(scat)?;
            (0..k).filter(|&c| col[c] >= threshold).collect()
        } else {
            Vec::new()
        };
        let f = self.func("row_quant", dt)?;
        self.launch(
            f,
            blocks(m as u32, 256),
            &[&xp, &scatp, &threshold, &cap, &scap, &k32],
        )?;
        let n = (m * k) as i64;
        let f = self.func("col_quant", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &scatp, &catp, &n, &k32])?;
        Ok(outliers)
    }

    /// CB `[n, k]` into the padded CxB tile layout `[rp, cp]`.
    pub fn int8_transform_cxb(&mut self, cb: &Tensor, cxb: &mut Tensor) -> Result<()> {
        let (n, k) = (cb.rows() as i32, cb.cols() as i32);
        let (rp, cp) = (cxb.shape[0] as i32, cxb.shape[1] as i32);
        let (src, dst) = (cb.cuda_ptr(), cxb.cuda_ptr());
        let f = self.func("cxb_transform", DType::I8)?;
        self.launch(f, grid(cxb.numel() as u64), &[&src, &dst, &n, &k, &rp, &cp])
    }

    /// Outlier decomposition: `idx` (i64 columns), `subB [no, n]` from CB and SCB, and
    /// `subA [m, no]` from the input.
    #[allow(clippy::too_many_arguments)]
    pub fn int8_outliers(
        &mut self,
        x: &Tensor,
        cols: &[usize],
        cb: &Tensor,
        scb: &Tensor,
        idx: &mut Tensor,
        sub_b: &mut Tensor,
        sub_a: &mut Tensor,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let bytes: Vec<u8> = cols
            .iter()
            .flat_map(|&c| (c as i64).to_le_bytes())
            .collect();
        self.upload_bytes(idx, &bytes)?;
        let (m, k) = (x.rows() as i32, x.cols() as i32);
        let (no, n) = (cols.len() as i32, cb.rows() as i32);
        let (ip, cbp, scbp, sbp) = (
            idx.cuda_ptr(),
            cb.cuda_ptr(),
            scb.cuda_ptr(),
            sub_b.cuda_ptr(),
        );
        let f = self.func("sub_b", dt)?;
        self.launch(
            f,
            grid(sub_b.numel() as u64),
            &[&cbp, &scbp, &ip, &sbp, &no, &n, &k],
        )?;
        let (xp, sap) = (x.cuda_ptr(), sub_a.cuda_ptr());
        let f = self.func("sub_a", dt)?;
        self.launch(
            f,
            grid(sub_a.numel() as u64),
            &[&xp, &ip, &sap, &m, &no, &k],
        )
    }

    /// igemmlt: `out32 [m, n] = C32A [m, kp] · CxB [.., cp]ᵀ` in int8 with int32
    /// accumulation (cuBLAS; a dp4a kernel when cuBLAS refuses), after padding CA into C32A.
    pub fn int8_igemm(
        &mut self,
        ca: &Tensor,
        c32a: &mut Tensor,
        cxb: &Tensor,
        out32: &mut Tensor,
    ) -> Result<()> {
        let (m, k) = (ca.rows(), ca.cols());
        let kp = c32a.cols();
        let n = out32.cols();
        let cp = cxb.cols();
        if cp != kp {
            return Err(self.err(
                "int8 GEMM",
                format!("CxB has {cp} padded columns but C32A has {kp}"),
            ));
        }
        let (src, dst) = (ca.cuda_ptr(), c32a.cuda_ptr());
        let (m32, k32, kp32, n32) = (m as i32, k as i32, kp as i32, n as i32);
        let f = self.func("pad_copy_i8", DType::I8)?;
        self.launch(f, grid((m * kp) as u64), &[&src, &dst, &m32, &k32, &kp32])?;
        let r = self.gemm(Gemm {
            m,
            n,
            k: kp,
            a: dst,
            a_type: bsys::cudaDataType_t::CUDA_R_8I,
            lda: kp,
            stride_a: 0,
            b: cxb.cuda_ptr(),
            b_type: bsys::cudaDataType_t::CUDA_R_8I,
            ldb: cp,
            stride_b: 0,
            b_trans: true,
            c: out32.cuda_ptr(),
            c_type: bsys::cudaDataType_t::CUDA_R_32I,
            ldc: n,
            stride_c: 0,
            batch: 1,
            alpha: 1.0,
            beta: 0.0,
            compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32I,
        });
        if r.is_ok() {
            return Ok(());
        }
        let (bp, cp_) = (cxb.cuda_ptr(), out32.cuda_ptr());
        let f = self.func("igemm_i8", DType::I8)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(32) as u32, m.div_ceil(32) as u32, 1),
            block_dim: (32, 32, 1),
            shared_mem_bytes: 0,
        };
        self.launch(f, cfg, &[&dst, &bp, &cp_, &m32, &n32, &kp32])
    }

    /// mm_dequant: `out = out32 · SCA[row] · SCB[col] / 127²`.
    pub fn int8_dequant(
        &mut self,
        out32: &Tensor,
        sca: &Tensor,
        scb: &Tensor,
        out: &mut Tensor,
    ) -> Result<()> {
        let dt = self.half(out)?;
        let (m, n) = (out.rows() as i32, out.cols() as i32);
        let (ap, sp, bp, op) = (
            out32.cuda_ptr(),
            sca.cuda_ptr(),
            scb.cuda_ptr(),
            out.cuda_ptr(),
        );
        let f = self.func("int8_dequant", dt)?;
        self.launch(f, grid(out.numel() as u64), &[&ap, &sp, &bp, &op, &m, &n])
    }

    /// `out += subA [m, no] · subB [no, n]` (the 16-bit outlier part).
    pub fn int8_add_outliers(
        &mut self,
        sub_a: &Tensor,
        sub_b: &Tensor,
        out: &mut Tensor,
    ) -> Result<()> {
        let ty = blas_type(self.half(out)?);
        let (m, no, n) = (sub_a.rows(), sub_a.cols(), sub_b.cols());
        self.gemm(Gemm {
            m,
            n,
            k: no,
            a: sub_a.cuda_ptr(),
            a_type: ty,
            lda: no,
            stride_a: 0,
            b: sub_b.cuda_ptr(),
            b_type: ty,
            ldb: n,
            stride_b: 0,
            b_trans: false,
            c: out.cuda_ptr(),
            c_type: ty,
            ldc: n,
            stride_c: 0,
            batch: 1,
            alpha: 1.0,
            beta: 1.0,
            compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        })
    }

    /// Fills a 16-bit tensor with small deterministic values on the GPU (benchmark weights).
    pub fn fill_random(&mut self, t: &mut Tensor, seed: u32) -> Result<()> {
        let bf = i32::from(self.half(t)? == DType::BF16);
        let n = t.numel() as i64;
        let p = t.cuda_ptr();
        let f = self.func("fill_random", DType::I8)?;
        self.launch(f, grid(n as u64), &[&p, &n, &seed, &bf])
    }

    // ----- copies -----

    pub fn upload_f32(&mut self, t: &mut Tensor, d: &[f32]) -> Result<()> {
        if d.len() != t.numel() {
            return Err(self.err(
                "upload",
                format!("{}: {} values for {} elements", t.name, d.len(), t.numel()),
            ));
        }
        let p = t.cuda_ptr();
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

    pub fn upload_bytes(&mut self, t: &mut Tensor, d: &[u8]) -> Result<()> {
        if d.len() as u64 != t.nbytes() {
            return Err(self.err(
                "upload",
                format!("{}: {} bytes for {}", t.name, d.len(), t.nbytes()),
            ));
        }
        let p = t.cuda_ptr();
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

    pub fn download_f32(&mut self, x: &Tensor) -> Result<Vec<f32>> {
        let p = x.cuda_ptr();
        let n = x.numel();
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
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

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        if let Some(h) = self.blas.take() {
            // SAFETY: no work is pending; the handle is not used again.
            let _ = unsafe { blas::destroy_handle(h) };
        }
        let ptrs: Vec<u64> = self
            .segments
            .keys()
            .copied()
            .chain(self.outside.values().map(|(p, _)| *p))
            .chain(self.staging.map(|(p, _)| p))
            .chain(self.attn_scratch.map(|(p, _)| p))
            .collect();
        for p in ptrs {
            self.free(p);
        }
        if let Some((p, n)) = self.pinned.take() {
            if n > 0 {
                // SAFETY: from malloc_host, no copy pending (synchronous copies).
                let _ = unsafe { drv::free_host(p as *mut c_void) };
            }
        }
        for mut c in self.foreign.drain(..) {
            drop(c.stdin.take());
            let _ = c.wait();
        }
    }
}

/// The fused attention kernel for a head dimension among those `available` (loaded), or `None`
/// where only the cuBLAS path exists. `variant` is `VRAMSCOPE_FLASH`, for measurements; ""
/// or a variant not built for this head dimension gives the first of `FLASH_DEFAULTS`.
fn flash_kernel(
    head_dim: usize,
    variant: &str,
    available: impl Fn(&str) -> bool,
) -> Option<kernels::FlashKernel> {
    let pick = |v: &str| {
        kernels::FLASH
            .iter()
            .find(|k| k.head_dim == head_dim && k.variant == v && available(k.name))
            .copied()
    };
    pick(variant).or_else(|| kernels::FLASH_DEFAULTS.iter().find_map(|v| pick(v)))
}

/// `VRAMSCOPE_FLASH`, read once per device. A name no kernel carries would silently measure
/// the default, so it is said on stderr (and the default runs).
fn flash_variant_from_env() -> String {
    let v = std::env::var("VRAMSCOPE_FLASH").unwrap_or_default();
    if !v.is_empty() && !kernels::FLASH.iter().any(|k| k.variant == v) {
        let mut known: Vec<&str> = kernels::FLASH.iter().map(|k| k.variant).collect();
        known.dedup();
        eprintln!(
            "vramscope: VRAMSCOPE_FLASH={v} names no fused attention kernel (known: {}); the default runs",
            known.join(", ")
        );
    }
    v
}

/// One GEMM's operands (row-major view), see `CudaDevice::gemm`.
struct Gemm {
    m: usize,
    n: usize,
    k: usize,
    a: u64,
    a_type: bsys::cudaDataType_t,
    lda: usize,
    stride_a: i64,
    b: u64,
    b_type: bsys::cudaDataType_t,
    ldb: usize,
    stride_b: i64,
    b_trans: bool,
    c: u64,
    c_type: bsys::cudaDataType_t,
    ldc: usize,
    stride_c: i64,
    batch: usize,
    alpha: f32,
    beta: f32,
    compute: bsys::cublasComputeType_t,
}

fn blas_type(dt: DType) -> bsys::cudaDataType_t {
    match dt {
        DType::BF16 => bsys::cudaDataType_t::CUDA_R_16BF,
        _ => bsys::cudaDataType_t::CUDA_R_16F,
    }
}

/// One block per row.
fn blocks(rows: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Whether every pointer allows 16-byte vector loads.
fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p.is_multiple_of(16))
}

/// A grid-stride launch over `n` elements.
fn grid(n: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A kernel argument of any of the scalar types the kernels take.
trait KArg {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
}
macro_rules! karg {
    ($($t:ty),*) => {$(
        impl KArg for $t {
            fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
                b.arg(self);
            }
        }
    )*};
}
karg!(u64, i64, i32, u32, f32);

fn compile_kernels(
    ctx: &Arc<CudaContext>,
    cc: (i32, i32),
) -> std::result::Result<HashMap<String, CudaFunction>, String> {
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let source = format!(
        "{}{}{}",
        kernels::SOURCE,
        sampler::SOURCE,
        kernels::OPT_BNB_SOURCE
    );
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map_err(|e| format!("NVRTC could not compile the kernels: {e}"))?;
    let module = ctx
        .load_module(ptx)
        .map_err(|e| format!("loading the kernels: {e}"))?;
    let mut names: Vec<String> = kernels::UNTYPED
        .iter()
        .chain(sampler::UNTYPED)
        .chain(kernels::OPT_BNB_UNTYPED)
        .map(|s| s.to_string())
        .collect();
    for n in kernels::TYPED
        .iter()
        .chain(sampler::TYPED)
        .chain(kernels::OPT_BNB_TYPED)
    {
        names.push(format!("{n}_f16"));
        names.push(format!("{n}_bf16"));
    }
    let mut funcs = HashMap::new();
    for n in names {
        let f = module
            .load_function(&n)
            .map_err(|e| format!("kernel {n}: {e}"))?;
        funcs.insert(n, f);
    }
    // The fused attention uses sm_80 PTX (mma.sync with bf16, cp.async, ldmatrix); older GPUs
    // keep the cuBLAS attention.
    if cc.0 >= 8 {
        let compile = |src: &str, arch: String| {
            let opts = cudarc::nvrtc::CompileOptions {
                options: vec![format!("--gpu-architecture={arch}")],
                ..Default::default()
            };
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
                .map_err(|e| format!("NVRTC could not compile the attention kernels: {e}"))?;
            ctx.load_module(ptx)
                .map_err(|e| format!("loading the attention kernels: {e}"))
        };
        // Hopper also gets the warpgroup-MMA kernels (sm_90a PTX); if that build fails (an
        // older NVRTC), the portable kernels alone.
        let hopper = (cc == (9, 0))
            .then(|| {
                compile(
                    &format!("{}{}", kernels::FLASH_SOURCE, kernels::WGMMA_SOURCE),
                    "compute_90a".into(),
                )
                .ok()
            })
            .flatten();
        let with_wgmma = hopper.is_some();
        let module = match hopper {
            Some(m) => m,
            None => compile(kernels::FLASH_SOURCE, format!("compute_{}{}", cc.0, cc.1))?,
        };
        for k in kernels::FLASH.iter().filter(|k| with_wgmma || !k.sm90a) {
            for suffix in ["f16", "bf16"] {
                let name = format!("{}_{suffix}", k.name);
                let f = module
                    .load_function(&name)
                    .map_err(|e| format!("kernel {name}: {e}"))?;
                if k.smem > 0 {
                    // Above 48 KiB a kernel must ask for its dynamic shared memory. A GPU
                    // without that much keeps the other kernels (the dispatch checks).
                    let attr =
                        dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                    if f.set_attribute(attr, k.smem as i32).is_err() {
                        continue;
                    }
                }
                funcs.insert(name, f);
            }
        }
    }
    Ok(funcs)
}

/// OPT and bitsandbytes 4-bit ops (tensors and scalars in, no quantization types).
impl CudaDevice {
    /// `nn.LayerNorm` with bias, one block a row.
    pub fn layer_norm(
        &mut self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        eps: f32,
        out: &mut Tensor,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let cols = x.cols() as i32;
        let rows = (x.numel() / x.cols()) as u32;
        let (xp, wp, bp, op) = (x.cuda_ptr(), w.cuda_ptr(), b.cuda_ptr(), out.cuda_ptr());
        let f = self.func("layer_norm", dt)?;
        self.launch(f, blocks(rows, 256), &[&xp, &wp, &bp, &op, &cols, &eps])
    }

    pub fn relu(&mut self, x: &Tensor, out: &mut Tensor) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("relu", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &op, &n])
    }

    /// `out = a + b` (same shapes).
    pub fn add(&mut self, a: &Tensor, b: &Tensor, out: &mut Tensor) -> Result<()> {
        let dt = self.half(a)?;
        let n = a.numel() as i64;
        let (ap, bp, op) = (a.cuda_ptr(), b.cuda_ptr(), out.cuda_ptr());
        let f = self.func("add_out", dt)?;
        self.launch(f, grid(n as u64), &[&ap, &bp, &op, &n])
    }

    /// `x.to(out.dtype)` between f16, bf16 and f32 (a copy when they are the same).
    pub fn convert_float(&mut self, x: &Tensor, out: &mut Tensor) -> Result<()> {
        let kind = |d: DType| -> Result<i32> {
            match d {
                DType::F16 => Ok(0),
                DType::BF16 => Ok(1),
                DType::F32 => Ok(2),
                other => Err(self.err("convert", format!("{} is not a float dtype", other.name()))),
            }
        };
        let (from, to) = (kind(x.dtype)?, kind(out.dtype)?);
        let n = x.numel() as i64;
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("convert_float", DType::F32)?;
        self.launch(f, grid(n as u64), &[&xp, &op, &n, &from, &to])
    }

    /// A double-quantized absmax back to f32: `code[q] * nested_absmax[i / nested_blocksize]
    /// + offset` (`offset` a one-element f32 tensor).
    pub fn bnb4_nested_absmax(
        &mut self,
        q: &Tensor,
        nested_absmax: &Tensor,
        code: &Tensor,
        offset: &Tensor,
        nested_blocksize: usize,
        out: &mut Tensor,
    ) -> Result<()> {
        let n = q.numel() as i64;
        let nb = nested_blocksize as i32;
        let (qp, ap, cp, op, outp) = (
            q.cuda_ptr(),
            nested_absmax.cuda_ptr(),
            code.cuda_ptr(),
            offset.cuda_ptr(),
            out.cuda_ptr(),
        );
        let f = self.func("bnb4_nested_absmax", DType::F32)?;
        self.launch(f, grid(n as u64), &[&qp, &ap, &cp, &op, &outp, &n, &nb])
    }

    /// bitsandbytes `dequantize_4bit` into `out` (f16, bf16 or f32): NF4, or FP4 when `fp4`.
    pub fn bnb4_dequantize(
        &mut self,
        packed: &Tensor,
        absmax: &Tensor,
        fp4: bool,
        blocksize: usize,
        out: &mut Tensor,
    ) -> Result<()> {
        let n = out.numel() as i64;
        let (bs, fp) = (blocksize as i32, i32::from(fp4));
        let (pp, ap, op) = (packed.cuda_ptr(), absmax.cuda_ptr(), out.cuda_ptr());
        let f = if out.dtype == DType::F32 {
            self.func("bnb4_dequant_f32", DType::F32)?
        } else {
            self.func("bnb4_dequant", self.half(out)?)?
        };
        self.launch(f, grid(n as u64), &[&pp, &ap, &op, &n, &bs, &fp])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_attention_kernels_cover_the_head_dims_they_claim() {
        let all = |_: &str| true;
        let portable = |n: &str| kernels::FLASH.iter().any(|k| k.name == n && !k.sm90a);
        let name = |hd, v, avail: &dyn Fn(&str) -> bool| flash_kernel(hd, v, avail).map(|k| k.name);
        assert_eq!(name(128, "", &all), Some("flash_attn_d128_wg"));
        assert_eq!(
            name(128, "no-such-variant", &all),
            Some("flash_attn_d128_wg")
        );
        assert_eq!(name(128, "", &portable), Some("flash_attn_d128_w8l"));
        assert_eq!(name(128, "w4", &all), Some("flash_attn_d128_w4"));
        // A Hopper-only variant asked for elsewhere falls back to the portable default.
        assert_eq!(name(128, "wg", &portable), Some("flash_attn_d128_w8l"));
        assert_eq!(name(64, "wg", &all), Some("flash_attn_d64_w8l"));
        assert_eq!(name(32, "", &portable), Some("flash_attn_d32_w8l"));
        assert_eq!(name(80, "", &all), None);
        assert_eq!(name(256, "w4", &all), None);
        assert_eq!(name(128, "", &|_: &str| false), None);
        // Every head dimension has a portable default.
        for &hd in kernels::FLASH_HEAD_DIMS {
            assert!(name(hd, "", &portable).is_some(), "head_dim {hd}");
        }
        // Every kernel listed for loading is instantiated once in the source with the shape
        // the dispatch launches it with.
        for k in kernels::FLASH {
            let (src, macros, per) = if k.sm90a {
                (kernels::WGMMA_SOURCE, &["FA_WG_INST"][..], k.warps / 4)
            } else {
                (kernels::FLASH_SOURCE, &["FA_INST"][..], k.warps)
            };
            let args = format!("({}, {}, {}, ", k.name, k.head_dim, per);
            let found: usize = macros
                .iter()
                .map(|m| src.matches(&format!("{m}{args}")).count())
                .sum();
            assert_eq!(found, 1, "{args}");
            assert!(k.smem <= 227 * 1024, "{}", k.name);
        }
        let wg = flash_kernel(128, "wg", all).unwrap();
        assert_eq!((wg.tile, wg.warps, wg.smem), (128, 8, 4 * 128 * 128 * 2));
    }
}

//! CUDA backend: cudarc (driver, NVRTC, cuBLAS) loaded at run time, NVML for ground truth.
//! Framework segments and memory outside the framework are plain `cuMemAlloc`s; tensors are
//! views into segments. GEMMs run in cuBLAS (16-bit with f32 accumulation, int8 with int32
//! accumulation); everything else in the NVRTC kernels of `kernels.rs`. All work goes to the
//! legacy default stream, so host copies and frees are ordered after the kernels before them.
//!
//! Rooms: this file opens and closes the device and holds the helpers every room shares;
//! `memory` (context memory, segments, outside allocations, host copies), `gemm` (cuBLAS),
//! `ops` (kernel compilation, norms, elementwise ops, RoPE), `attention`, `quant` (LLM.int8
//! and bitsandbytes 4-bit kernels), `fp8` (vLLM's w8a8 fp8: its quantization kernels and the
//! cuBLASLt GEMM), `sampler`, `timing` (per-op GPU times), `nvml` and `loader`. Tensor parallel's collectives are in `collectives`, over the NCCL bindings of `nccl`.

mod attention;
mod collectives;
mod families;
pub use families::MlaKvDims;
mod fp8;
mod gemm;
mod gemm_tune;
mod graphs;
mod kcache;
mod kernels;
mod loader;
mod memory;
mod moe;
mod nccl;
mod nvml;
mod ops;
mod quant;
mod sampler;
mod timing;
mod w4;

pub use graphs::GraphInfo;
pub use moe::{GroupedGemm, Sorted, Tiles as MoeGemmTiles};
pub use w4::W4Weights;

use std::collections::HashMap;
use std::ffi::c_void;
use std::process::Child;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::{result as blas, sys as bsys};
use cudarc::driver::{
    result as drv, sys as dsys, CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError,
    LaunchConfig, PushKernelArg,
};

use super::{DeviceInfo, DeviceListing};
use crate::base::error::{Error, Result};
use crate::device::tensor::{DType, TensorData};
use attention::flash_variant_from_env;
pub use collectives::nccl_library;
pub use memory::hold_memory_child;
pub use nvml::NvmlSample;
use ops::compile_kernels;

pub struct CudaDevice {
    ordinal: usize,
    /// Streaming multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`, what vLLM's
    /// `num_compute_units` reads).
    sms: u64,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: HashMap<String, CudaFunction>,
    blas: Option<bsys::cublasHandle_t>,
    /// The cuBLAS workspace: a framework block (address, bytes).
    blas_workspace: Option<(u64, u64)>,
    /// cuBLASLt, for the fp8 GEMMs, made on first use, and the algorithm chosen per shape.
    blaslt: Option<cudarc::cublaslt::sys::cublasLtHandle_t>,
    lt_algos: HashMap<(usize, usize, usize, u32), cudarc::cublaslt::sys::cublasLtMatmulAlgo_t>,
    /// 16-bit GEMMs take the fastest algorithm timed per shape (off with `VRAMSCOPE_GEMM=default`).
    tune_gemms: bool,
    gemm_picks: HashMap<gemm_tune::PickKey, gemm_tune::Pick>,
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
    /// `VRAMSCOPE_W4=fused`: the fused 4-bit kernel at every size (`w4::w4_slices`).
    w4_fused: bool,
    /// A cap on the columns of one dequantized 4-bit slice (tests).
    w4_slice_cols: Option<usize>,
    /// A cap on a dequantized 4-bit slice's bytes (`VRAMSCOPE_W4=mib:N`, measurements).
    w4_slice_bytes: u64,
    /// Per-op GPU timing (`bench --op-times`): an event recorded at every op boundary.
    op_marks: Option<Vec<(String, CudaEvent)>>,
    /// NCCL communicators when this GPU is one rank of a tensor-parallel instance.
    comms: collectives::Comms,
    /// CUDA graphs: the side stream, the captured graphs, their input arenas.
    graphs: graphs::Graphs,
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
                crate::base::units::fmt_u(mem.used)
            ),
            total_bytes: mem.total,
            simulated: false,
            preset: None,
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

impl CudaDevice {
    /// Loads the libraries, creates the context, compiles the kernels and starts the sampler.
    pub fn open(ordinal: usize) -> Result<Self> {
        use crate::base::timing::span;
        let t = span("open: find and load the CUDA libraries");
        let found = loader::ensure_loaded().map_err(|e| dev_err(ordinal, e))?;
        drop(t);
        let t = span("open: NVML");
        let nv = nvml::init(&found.nvml).map_err(|e| dev_err(ordinal, e))?;
        drop(t);
        let d = |e: DriverError| dev_err(ordinal, format!("CUDA driver: {e}"));
        let t = span("open: CUDA context");
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
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(d)? as u64;
        drop(t);
        let t = span("open: kernels (NVRTC, module load)");
        let funcs = compile_kernels(&ctx, cc).map_err(|e| dev_err(ordinal, e))?;
        drop(t);
        let now = nvml::read(&nv, nvml_index, pid);
        let per_process = now.is_some_and(|r| r.process_used.is_some());
        let epoch = Instant::now();
        let sampler = nvml::Sampler::start(nv.clone(), nvml_index, before.device_used, epoch);
        let dev = CudaDevice {
            sms,
            ordinal,
            ctx,
            stream,
            funcs,
            blas: None,
            blas_workspace: None,
            blaslt: None,
            lt_algos: HashMap::new(),
            tune_gemms: gemm_tune::tuned_from_env(),
            gemm_picks: HashMap::new(),
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
            w4_fused: std::env::var("VRAMSCOPE_W4").is_ok_and(|v| v == "fused"),
            w4_slice_cols: None,
            w4_slice_bytes: std::env::var("VRAMSCOPE_W4")
                .ok()
                .and_then(|v| v.strip_prefix("mib:")?.parse::<u64>().ok())
                .map_or(w4::W4_SLICE_MAX_BYTES, |m| m << 20),
            op_marks: None,
            comms: collectives::Comms::default(),
            graphs: graphs::Graphs::default(),
        };
        dev.sampler.reset_peak(dev.process_used());
        Ok(dev)
    }

    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    pub fn sm_count(&self) -> u64 {
        self.sms
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
            total_source: "cuMemGetInfo total (this GPU)".into(),
        }
    }
}

/// Helpers every kernel launch goes through.
impl CudaDevice {
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

    fn half(&self, t: &TensorData) -> Result<DType> {
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

    fn launch(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[&dyn KArg]) -> Result<()> {
        let mut b = self.stream.launch_builder(f);
        for a in args {
            a.push(&mut b);
        }
        // SAFETY: every kernel's arguments are checked against its signature where it is launched,
        // and its pointers are live tensors, sized by the shapes passed alongside.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| self.err("kernel launch", e))
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        let _ = self.side_stream(false);
        self.drop_graph_arenas();
        if let Some(h) = self.blas.take() {
            // SAFETY: no work is pending; the handle is not used again.
            let _ = unsafe { blas::destroy_handle(h) };
        }
        self.drop_blaslt();
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

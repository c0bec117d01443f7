//! The run-time context every op goes through: the device, the framework allocator, the event
//! log, the scope (pass, op, layer) events are tagged with, the cancel flag and progress.
//! It lives on the worker thread (`Rc`), and tensors hold it so a drop frees their block.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::base::error::{Error, Result};
use crate::device::{Backend, Device, LibraryWorkspace, MemInfo, OutsideAlloc};
use crate::engine::progress::{Progress, ProgressSink};
use crate::engine::tensor::{DType, Storage, Tensor, TensorData};
use crate::memory::allocator::{AllocatorAction, LoggedAction, SegmentHandle, SegmentSource};
use crate::memory::{AllocatorStats, BlockRef, CachingAllocator, Category, Event, EventKind};

mod graphs;
pub use graphs::{CaptureKind, FlashCall, GraphRecord, ESTIMATE_POOL, GRAPH_POOL};

/// How often batches of new events go to the progress sink.
const EVENT_FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// Host buffers of dropped tensors kept for reuse (compute mode on the CPU): a pass allocates
/// the same few activation shapes in every layer, and a fresh buffer costs a memset or new
/// pages each time.
const HOST_POOL_BUFFERS: usize = 8;
/// Buffers smaller than this (f32 values) are not kept: the system allocator serves them fast.
const HOST_POOL_MIN_VALUES: usize = 1 << 14;

thread_local! {
    static RUNTIMES_CREATED: Cell<usize> = const { Cell::new(0) };
    static UI_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as the app's UI thread: creating a Runtime (profiling work) on it
/// afterwards is a bug, caught by a debug assertion in `Runtime::new`.
pub fn mark_ui_thread() {
    UI_THREAD.with(|c| c.set(true));
}

/// How many Runtimes the calling thread has created (lets tests prove the UI thread made none).
pub fn runtimes_created_on_this_thread() -> usize {
    RUNTIMES_CREATED.with(Cell::get)
}

#[derive(Clone)]
pub struct Runtime(Rc<RefCell<Inner>>);

struct Inner {
    device: Device,
    alloc: CachingAllocator,
    events: Vec<Event>,
    pass: u32,
    op: &'static str,
    layer: Option<u32>,
    start: Instant,
    cancel: Arc<AtomicBool>,
    sink: Option<ProgressSink>,
    flushed: usize,
    last_flush: Instant,
    /// Library workspaces PyTorch takes from its caching allocator and keeps (cuBLAS at the
    /// first GEMM, cuBLASLt at the first GEMM with a bias): framework blocks that live as long
    /// as the instance.
    workspaces: Vec<(&'static str, BlockRef)>,
    workspaces_taken: bool,
    lt_workspace_taken: bool,
    device_used: u64,
    process_used: u64,
    /// While set, no new segment may take this process's device memory over it.
    segment_cap: Option<u64>,
    /// This rank of a tensor-parallel instance (`None`: one GPU).
    tp: Option<crate::device::group::TpRank>,
    /// This stage of a pipeline-parallel instance (`None`: no pipeline parallel).
    pp: Option<crate::device::group::PpStage>,
    /// Where this rank's fused-MoE layers sit with data or expert parallel (`None`: the
    /// tensor-parallel group alone).
    moe_group: Option<crate::device::group::MoeGroup>,
    /// Collective-library setups done on this rank, and the simulated memory they hold.
    comms: Vec<crate::device::group::CommSetup>,
    comm_memory: Vec<OutsideAlloc>,
    /// Host f32 buffers of dropped tensors, oldest first (see `HOST_POOL_BUFFERS`).
    host_pool: Vec<Vec<f32>>,
    /// CUDA graph capture: the side stream, the open capture, the graphs' device memory.
    graphs: graphs::GraphState,
    /// fp8 linear layers quantize dynamic activations per token (`[T, 1]` scales), as vLLM V1
    /// does where CUTLASS runs fp8; per tensor (`[1]`) before.
    fp8_act_per_token: bool,
    triton_attention: bool,
    silu_and_mul_fused: bool,
    mxfp4_rules: crate::engine::rules::Mxfp4Rules,
    mla_rules: crate::engine::rules::MlaModelRules,
    gdn_rules: crate::engine::rules::GdnRules,
    fp8_block_path: Fp8BlockPath,
    fp8_online_scales: crate::engine::rules::OnlineScales,
    /// FlashInfer's cached SM90 block-GEMM runner: the most (4-aligned) tokens a call below
    /// 32 has passed in this process (`max_shape_m_4_align_`).
    fp8_flashinfer_rows: usize,
}

/// How a release runs a block-wise fp8 linear (`weight_block_size`) on this GPU, as far as
/// its allocations differ (`quant::fp8_block`). No release here runs DeepGEMM: `pip install
/// vllm` does not install `deep_gemm` (`has_deep_gemm`, 0.11.0 utils/__init__.py L3425,
/// 0.19.0 utils/import_utils.py L410; not in the wheels' METADATA), so `is_deep_gemm_supported`
/// is false and neither DeepGEMM's nor FlashInfer's block GEMM (which needs it) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fp8BlockPath {
    /// Quantize (codes `[m, k]`, then group scales `[m, k / bk]`), GEMM into a new `[m, n]`,
    /// free the codes then the scales: 0.8.5 on Hopper and Ada, 0.11.0's Triton path (Ada).
    #[default]
    Plain,
    /// 0.11.0 on Hopper (`apply_w8a8_block_fp8_linear`, utils/fp8_utils.py L157-172): the
    /// input padded by `4 - m % 4` rows (1 to 4: a multiple of 4 gets 4) before quantizing,
    /// the GEMM's output sliced back (its storage kept); the padded input, the codes and the
    /// scales freed as the function returns; the weight scales transposed after loading.
    PadAlways,
    /// 0.15.1 and 0.19.0 (`W8A8BlockFp8LinearOp`): quantize, GEMM, then the scales freed
    /// before the codes (`input_scale` is an argument of `_run_cutlass` / `_run_triton`,
    /// reassigned, so it is cleared first). On Hopper (`pad_to_four`), `padded_cutlass`
    /// (utils/fp8_utils.py L114-149 at 0.19.0, L115-149 at 0.15.1) makes a zeroed fp8 copy
    /// and a ones-filled scale copy padded to a multiple of 4 tokens when `m % 4 != 0`, runs
    /// the GEMM on them and frees them as it returns. These releases make no device identity
    /// (no `maybe_create_device_identity` in their fp8.py).
    Op { pad_to_four: bool },
    /// 0.21 on, on Hopper: DeepGEMM's dynamic kernel for an aligned bf16 linear
    /// (`quant::fp8_block::deep_gemm_eligible`), CUTLASS for the others, padding as `Op`'s
    /// on Hopper under 0.21-0.23 (`fallback_pads`), not from 0.24.
    DeepGemm { fallback_pads: bool },
}

/// The device as the allocator's segment source, refusing a segment that would take this
/// process over `cap` bytes of device memory. The allocator then gives its wholly free cached
/// segments back and retries once, as PyTorch's caching allocator does under a memory limit.
struct Capped<'a> {
    device: &'a mut Device,
    cap: Option<u64>,
}

impl SegmentSource for Capped<'_> {
    fn map_segment(&mut self, bytes: u64) -> Option<SegmentHandle> {
        if let Some(cap) = self.cap {
            if self.device.process_used().saturating_add(bytes) > cap {
                return None;
            }
        }
        self.device.map_segment(bytes)
    }

    fn unmap_segment(&mut self, handle: SegmentHandle) {
        self.device.unmap_segment(handle)
    }
}

/// A collective library's first use on this rank, between `comm_begin` and `comm_end`.
#[must_use]
pub struct CommFirstUse {
    setup: crate::device::group::CommSetup,
    /// This process's device memory before it (GPU).
    before: u64,
    /// The simulated device's modelled bytes (taken at `comm_begin`).
    modelled: Option<u64>,
}

/// What a new tensor's host storage holds in compute mode on the CPU.
#[derive(PartialEq)]
enum HostData {
    /// Nothing: bytes the host never reads or writes.
    Absent,
    Zeroed,
    /// Any values: the op that made it writes every one.
    Overwritten,
    /// These values (a float tensor's, `numel` of them): a weight read or made on the host
    /// becomes the tensor's storage without a copy.
    Given(Vec<f32>),
}

/// How a marker that sets the allocator's split limit starts (`Runtime::set_max_split`): then
/// the limit in MiB, or `unlimited`.
pub const MAX_SPLIT_MARKER: &str = "allocator max_split_size_mb:";

/// Device and allocator numbers at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub time_us: u64,
    pub mem: MemInfo,
    pub stats: AllocatorStats,
    pub process_used: u64,
}

impl Runtime {
    pub fn new(device: Device, cancel: Arc<AtomicBool>, sink: Option<ProgressSink>) -> Self {
        debug_assert!(
            !UI_THREAD.with(Cell::get),
            "profiling work started on the UI thread; it belongs on the worker"
        );
        RUNTIMES_CREATED.with(|c| c.set(c.get() + 1));
        let mem = device.mem_info();
        let process_used = device.process_used();
        let now = Instant::now();
        Runtime(Rc::new(RefCell::new(Inner {
            device,
            alloc: CachingAllocator::new(),
            events: Vec::new(),
            pass: 0,
            op: "setup",
            layer: None,
            start: now,
            cancel,
            sink,
            flushed: 0,
            last_flush: now,
            workspaces: Vec::new(),
            workspaces_taken: false,
            lt_workspace_taken: false,
            device_used: mem.total - mem.free,
            process_used,
            segment_cap: None,
            tp: None,
            pp: None,
            moe_group: None,
            comms: Vec::new(),
            comm_memory: Vec::new(),
            host_pool: Vec::new(),
            graphs: graphs::GraphState::default(),
            fp8_act_per_token: false,
            triton_attention: false,
            silu_and_mul_fused: false,
            mxfp4_rules: crate::engine::rules::Mxfp4Rules::V0_19,
            mla_rules: crate::engine::rules::MlaModelRules::BEFORE_0_25,
            gdn_rules: crate::engine::rules::GdnRules::V0_11,
            fp8_block_path: Fp8BlockPath::Plain,
            fp8_online_scales: Default::default(),
            fp8_flashinfer_rows: 0,
        })))
    }

    pub fn backend(&self) -> Backend {
        self.0.borrow().device.backend()
    }

    /// Runs `f` with the device (kernels, CUDA handles).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut Device) -> R) -> R {
        f(&mut self.0.borrow_mut().device)
    }

    pub fn device_name(&self) -> String {
        self.0.borrow().device.info().spec
    }

    /// Tags the events that follow with an op.
    pub fn set_op(&self, op: &'static str) {
        self.set_op_for(op, "");
    }

    /// `set_op` with a detail for GPU op timing (`bench --op-times`), such as `q_proj`.
    pub fn set_op_for(&self, op: &'static str, detail: &str) {
        let mut i = self.0.borrow_mut();
        i.op = op;
        i.graphs.count_op();
        if let Some(c) = i.device.cuda() {
            c.mark_op(op, detail);
        }
    }

    /// The op the events are tagged with now (after an error: the op it happened in).
    pub fn op(&self) -> &'static str {
        self.0.borrow().op
    }

    /// Tags the events that follow with a layer (`None` outside the decoder layers).
    pub fn set_layer(&self, layer: Option<u32>) {
        self.0.borrow_mut().layer = layer;
    }

    /// The GPU's NVML readings since this runtime started, on the events' clock, and their
    /// rate (nothing on the simulated device).
    pub fn device_samples(&self) -> (Vec<crate::device::DeviceSample>, Option<f64>) {
        let mut i = self.0.borrow_mut();
        let start = i.start;
        match i.device.cuda() {
            Some(c) => {
                let (s, hz) = c.samples_since(start);
                (s, Some(hz))
            }
            None => (Vec::new(), None),
        }
    }

    /// Caps this process's device memory for new framework segments (`None`: the device's
    /// own limit only). A verify pass runs "inside T·u" this way.
    pub fn set_segment_cap(&self, cap: Option<u64>) {
        self.0.borrow_mut().segment_cap = cap;
    }

    pub fn set_pass(&self, pass: u32) {
        self.0.borrow_mut().pass = pass;
    }

    pub fn pass(&self) -> u32 {
        self.0.borrow().pass
    }

    /// Stops the run with `Error::Cancelled` when the user asked to cancel.
    pub fn check_cancel(&self) -> Result<()> {
        if self.0.borrow().cancel.load(Ordering::Relaxed) {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }

    /// The cancel flag itself, for long CPU kernels that check it between row blocks.
    /// Quantize fp8 layers' dynamic activations per token (vLLM V1's `Fp8LinearMethod` with
    /// CUTLASS: `kFp8DynamicTokenSym`, 0.19 quantization/fp8.py L289-296; 0.11 fp8.py
    /// L245-249: `GroupShape.PER_TOKEN`), or per tensor (the V0 releases').
    pub fn set_fp8_act_per_token(&self, yes: bool) {
        self.0.borrow_mut().fp8_act_per_token = yes;
    }

    pub fn fp8_act_per_token(&self) -> bool {
        self.0.borrow().fp8_act_per_token
    }

    /// Attention runs vLLM's Triton `unified_attention` (V1's TRITON_ATTN, the backend of
    /// `--dtype float32`): it writes the layer's output and allocates nothing else, neither
    /// FlashAttention's `softmax_lse` nor its `rng_state` (0.19.0
    /// v1/attention/backends/triton_attn.py `forward`).
    pub fn set_triton_attention(&self, yes: bool) {
        self.0.borrow_mut().triton_attention = yes;
    }

    pub fn triton_attention(&self) -> bool {
        self.0.borrow().triton_attention
    }

    /// `SiluAndMul` makes one tensor where vLLM would run its `forward_native` eager
    /// (`ops::silu_and_mul_native`): from 0.15 a disabled custom op's `forward_native` is
    /// compiled by Inductor into one kernel (`CustomOp.maybe_compile`, `SiluAndMul(compile_native
    /// =True)`: 0.15.1 model_executor/custom_op.py L164-230, layers/activation.py L130-131;
    /// 0.19.0 custom_op.py L174-230; the same to 0.33.0), and with `--enforce-eager` the op is
    /// enabled (`custom_ops` "all", 0.19.0 config/vllm.py L890-897) and runs `_C.silu_and_mul`.
    /// 0.10 and 0.11 have no `maybe_compile`: `forward_native` runs eager, two tensors.
    pub fn set_silu_and_mul_fused(&self, yes: bool) {
        self.0.borrow_mut().silu_and_mul_fused = yes;
    }

    pub fn silu_and_mul_fused(&self) -> bool {
        self.0.borrow().silu_and_mul_fused
    }

    /// What the release's MXFP4 path does to gpt-oss's experts (`engine::rules::Mxfp4Rules`; 0.19's
    /// unless the procedure says otherwise).
    pub fn set_mxfp4_rules(&self, rules: crate::engine::rules::Mxfp4Rules) {
        self.0.borrow_mut().mxfp4_rules = rules;
    }

    pub fn mxfp4_rules(&self) -> crate::engine::rules::Mxfp4Rules {
        self.0.borrow().mxfp4_rules
    }

    /// What the release's deepseek_v2.py and MLA layer do (`MlaModelRules`; 0.11-0.24's unless
    /// the procedure says otherwise).
    pub fn set_mla_rules(&self, rules: crate::engine::rules::MlaModelRules) {
        self.0.borrow_mut().mla_rules = rules;
    }

    pub fn mla_rules(&self) -> crate::engine::rules::MlaModelRules {
        self.0.borrow().mla_rules
    }

    /// What the release's Gated DeltaNet does (`GdnRules`; 0.11's unless the procedure says
    /// otherwise).
    pub fn set_gdn_rules(&self, rules: crate::engine::rules::GdnRules) {
        self.0.borrow_mut().gdn_rules = rules;
    }

    pub fn gdn_rules(&self) -> crate::engine::rules::GdnRules {
        self.0.borrow().gdn_rules
    }

    /// A call of FlashInfer's SM90 block GEMM with `rows` (4-aligned) tokens: the most any call
    /// has passed so far, which sizes its workspace (`get_fp8_blockscale_gemm_runner_sm90` is
    /// `functools.cache`d, its runner keeps the largest M: flashinfer 0.6.8.post1
    /// gemm/gemm_base.py L6742-6752, fp8_blockscale_gemm_sm90_binding.cu L200-211).
    pub fn note_fp8_flashinfer_rows(&self, rows: usize) -> usize {
        let mut st = self.0.borrow_mut();
        st.fp8_flashinfer_rows = st.fp8_flashinfer_rows.max(rows);
        st.fp8_flashinfer_rows
    }

    /// How block-wise fp8 linears run under the release on this GPU (`Plain` unless the
    /// procedure says otherwise).
    pub fn set_fp8_block_path(&self, path: Fp8BlockPath) {
        self.0.borrow_mut().fp8_block_path = path;
    }

    pub fn fp8_block_path(&self) -> Fp8BlockPath {
        self.0.borrow().fp8_block_path
    }

    /// How online fp8 experts get their scales at load (0.19's dynamic per-expert quant
    /// unless the procedure says otherwise).
    pub fn set_fp8_online_scales(&self, s: crate::engine::rules::OnlineScales) {
        self.0.borrow_mut().fp8_online_scales = s;
    }

    pub fn fp8_online_scales(&self) -> crate::engine::rules::OnlineScales {
        self.0.borrow().fp8_online_scales
    }

    pub(crate) fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.0.borrow().cancel.clone()
    }

    pub fn progress(&self, p: Progress) {
        self.flush_events(false);
        let mut i = self.0.borrow_mut();
        if let Some(sink) = i.sink.as_mut() {
            sink(p);
        }
    }

    /// Sends the events recorded since the last batch (at most every 50 ms unless `force`).
    pub fn flush_events(&self, force: bool) {
        let mut i = self.0.borrow_mut();
        let inner = &mut *i;
        if inner.sink.is_none() || inner.flushed == inner.events.len() {
            return;
        }
        if !force && inner.last_flush.elapsed() < EVENT_FLUSH_INTERVAL {
            return;
        }
        let batch = inner.events[inner.flushed..].to_vec();
        inner.flushed = inner.events.len();
        inner.last_flush = Instant::now();
        if let Some(sink) = inner.sink.as_mut() {
            sink(Progress::Events(batch));
        }
    }

    /// Allocates a tensor through the framework allocator; its data is zeroed in compute mode.
    pub fn tensor(
        &self,
        name: impl Into<String>,
        category: Category,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        self.alloc_tensor(name.into(), category, shape, dtype, HostData::Zeroed)
    }

    /// `tensor` for an output the op then writes in full (a GEMM's, a norm's): on the host its
    /// values may be a dropped tensor's, not zeroes, which spares clearing a buffer the op
    /// overwrites anyway. The allocator sees exactly what `tensor` shows it.
    pub(crate) fn tensor_for_overwrite(
        &self,
        name: impl Into<String>,
        category: Category,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        self.alloc_tensor(name.into(), category, shape, dtype, HostData::Overwritten)
    }

    /// `tensor` holding `values` on the host (compute mode on the CPU; other backends
    /// allocate as `tensor` and ignore them). `values` must have the shape's element count,
    /// or the tensor is zeroes.
    pub(crate) fn tensor_with_values(
        &self,
        name: impl Into<String>,
        category: Category,
        shape: &[usize],
        dtype: DType,
        values: Vec<f32>,
    ) -> Result<Tensor> {
        self.alloc_tensor(name.into(), category, shape, dtype, HostData::Given(values))
    }

    /// A host copy of `values` (a view's), in a recycled buffer when one of that length is
    /// kept.
    pub(crate) fn host_copy(&self, values: &[f32]) -> Vec<f32> {
        match self.take_host_buffer(values.len()) {
            Some(mut v) => {
                crate::device::cpu::copy(&mut v, values);
                v
            }
            None => values.to_vec(),
        }
    }

    /// Keeps a dropped activation's host buffer for a later tensor of the same length.
    pub(crate) fn recycle_host(&self, buffer: Vec<f32>) {
        if buffer.len() < HOST_POOL_MIN_VALUES {
            return;
        }
        let mut i = self.0.borrow_mut();
        if i.host_pool.len() == HOST_POOL_BUFFERS {
            i.host_pool.remove(0);
        }
        i.host_pool.push(buffer);
    }

    fn take_host_buffer(&self, len: usize) -> Option<Vec<f32>> {
        let mut i = self.0.borrow_mut();
        let at = i.host_pool.iter().rposition(|v| v.len() == len)?;
        Some(i.host_pool.remove(at))
    }

    /// Allocates bytes the host never reads or writes (a KV cache, a synthetic spike): device
    /// memory on a GPU, bookkeeping only on the simulated device.
    pub fn reserve_bytes(
        &self,
        name: impl Into<String>,
        category: Category,
        bytes: u64,
    ) -> Result<Tensor> {
        let len = usize::try_from(bytes)
            .map_err(|_| Error::Request(format!("{bytes} bytes is too large")))?;
        self.reserve(name, category, &[len], DType::U8)
    }

    /// A tensor of `shape` and `dtype` whose contents nothing reads (vLLM's KV cache in the
    /// verify pass): allocated on every backend, never filled on the host.
    pub fn reserve(
        &self,
        name: impl Into<String>,
        category: Category,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        self.alloc_tensor(name.into(), category, shape, dtype, HostData::Absent)
    }

    fn alloc_tensor(
        &self,
        name: String,
        category: Category,
        shape: &[usize],
        dtype: DType,
        host_data: HostData,
    ) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        let bytes = numel as u64 * dtype.size_bytes();
        let block = self.alloc_block(&name, category, bytes)?;
        let storage = match self.backend() {
            Backend::Dry => Storage::None,
            Backend::Cpu if host_data == HostData::Absent => Storage::None,
            Backend::Cuda => Storage::Cuda(block.segment.0 + block.offset),
            Backend::Cpu => match dtype {
                DType::F32 | DType::F16 | DType::BF16 => Storage::F32(
                    match host_data {
                        HostData::Overwritten => self.take_host_buffer(numel),
                        HostData::Given(v) if v.len() == numel => Some(v),
                        _ => None,
                    }
                    .unwrap_or_else(|| vec![0.0; numel]),
                ),
                DType::I8 => Storage::I8(vec![0; numel]),
                DType::U8 | DType::F8E4M3 => Storage::U8(vec![0; numel]),
                DType::I32 | DType::I64 => Storage::I32(vec![0; numel]),
            },
        };
        Ok(Tensor {
            data: TensorData {
                shape: shape.to_vec(),
                dtype,
                name,
                storage,
            },
            category,
            block,
            rt: self.clone(),
            view: false,
        })
    }

    /// One block of the framework allocator, logged; an out-of-memory error names the tensor,
    /// the op, the layer and the pass.
    fn alloc_block(&self, name: &str, category: Category, bytes: u64) -> Result<BlockRef> {
        {
            let mut i = self.0.borrow_mut();
            let inner = &mut *i;
            let mut source = Capped {
                device: &mut inner.device,
                cap: inner.segment_cap,
            };
            let result = inner.alloc.allocate(bytes, &mut source);
            inner.record_actions(name, category);
            match result {
                Ok(b) => Ok(b),
                Err(oom) => {
                    let during = format!(
                        "allocating {name} ({}{}, pass {})",
                        inner.op,
                        inner
                            .layer
                            .map(|l| format!(", layer {l}"))
                            .unwrap_or_default(),
                        inner.pass
                    );
                    let mem = inner.device.mem_info();
                    Err(Error::OutOfMemory {
                        device: inner.device.info().spec,
                        during,
                        detail: oom.to_string(),
                        state: Some(crate::base::error::OomState {
                            requested: oom.requested,
                            reserved: oom.reserved,
                            allocated: oom.allocated,
                            free: mem.free,
                            total: mem.total,
                        }),
                    })
                }
            }
        }
    }

    pub(crate) fn release(&self, block: BlockRef, name: &str, category: Category) {
        let mut i = self.0.borrow_mut();
        i.alloc.free(block);
        i.record_actions(name, category);
    }

    /// Takes the cuBLAS workspace the first time a GEMM runs, as PyTorch does: a block of its
    /// caching allocator, kept until the instance ends (measured with torch 2.11 on the H200:
    /// `memory_allocated` grows by 32 MiB at the first `F.linear` and stays; docs/gpu-runs.md).
    pub fn ensure_library_workspaces(&self) -> Result<()> {
        if self.0.borrow().workspaces_taken {
            return Ok(());
        }
        self.0.borrow_mut().workspaces_taken = true;
        let bytes = self.0.borrow().device.library_workspace_bytes();
        self.take_workspace(LibraryWorkspace::Cublas, bytes.cublas)
    }

    /// Takes the cuBLASLt workspace at the first GEMM with a bias (PyTorch routes `addmm` with
    /// a bias vector through cuBLASLt's epilogue; torch 2.11 keeps 1 MiB from its allocator,
    /// torch 2.4 took it per call).
    pub fn ensure_lt_workspace(&self) -> Result<()> {
        if self.0.borrow().lt_workspace_taken {
            return Ok(());
        }
        self.0.borrow_mut().lt_workspace_taken = true;
        let bytes = self.0.borrow().device.library_workspace_bytes();
        self.take_workspace(LibraryWorkspace::CublasLt, bytes.cublaslt)
    }

    fn take_workspace(&self, which: LibraryWorkspace, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let saved = self.0.borrow().op;
        self.0.borrow_mut().op = "library-workspace";
        let block = self.alloc_block(which.label(), Category::Workspace, bytes);
        self.0.borrow_mut().op = saved;
        let block = block?;
        let mut i = self.0.borrow_mut();
        if let Some(c) = i.device.cuda() {
            c.set_library_workspace(which, block.segment.0 + block.offset, bytes);
        }
        i.workspaces.push((which.label(), block));
        Ok(())
    }

    /// Device memory outside the framework allocator, logged on the timeline.
    pub fn alloc_outside(&self, label: &str, bytes: u64) -> Result<OutsideAlloc> {
        let mut i = self.0.borrow_mut();
        let a = i.device.alloc_outside(bytes)?;
        let b = a.bytes;
        i.refresh_device();
        i.push_event(
            EventKind::OutsideAlloc,
            label,
            Category::NonFramework,
            b,
            None,
        );
        Ok(a)
    }

    pub fn free_outside(&self, label: &str, alloc: OutsideAlloc) {
        let mut i = self.0.borrow_mut();
        let b = alloc.bytes;
        i.device.free_outside(alloc);
        i.refresh_device();
        i.push_event(
            EventKind::OutsideFree,
            label,
            Category::NonFramework,
            b,
            None,
        );
    }

    /// Makes this runtime one rank of a tensor-parallel instance.
    pub fn set_tp(&self, tp: crate::device::group::TpRank) {
        self.0.borrow_mut().tp = Some(tp);
    }

    /// This rank, when the instance is tensor parallel.
    pub fn tp(&self) -> Option<crate::device::group::TpRank> {
        self.0.borrow().tp.clone()
    }

    /// Makes this runtime one stage of a pipeline-parallel instance.
    pub fn set_pp(&self, pp: crate::device::group::PpStage) {
        self.0.borrow_mut().pp = Some(pp);
    }

    /// Makes this runtime's MoE layers span data-parallel ranks or hold whole experts.
    pub fn set_moe_group(&self, g: crate::device::group::MoeGroup) {
        self.0.borrow_mut().moe_group = Some(g);
    }

    /// This rank's MoE group, when data or expert parallel is on.
    pub fn moe_group(&self) -> Option<crate::device::group::MoeGroup> {
        self.0.borrow().moe_group
    }

    /// This stage, when the instance is pipeline parallel.
    pub fn pp(&self) -> Option<crate::device::group::PpStage> {
        self.0.borrow().pp.clone()
    }

    /// Where every rank of the instance meets, and this rank's index there: all `tp × pp`
    /// ranks with pipeline parallel, the tensor-parallel group without; `None` on one GPU.
    pub fn world(&self) -> Option<(usize, std::sync::Arc<crate::device::group::RankGroup>)> {
        let i = self.0.borrow();
        match (&i.pp, &i.tp) {
            (Some(p), _) => Some((p.world_rank, p.world.clone())),
            (None, Some(t)) => Some((t.rank, t.group.clone())),
            (None, None) => None,
        }
    }

    /// Starts the first use of `setup` on this rank (NCCL's communicator and the buffers its
    /// first collective connects). Call `comm_end` with the result after the collective: the
    /// device memory taken outside the framework is logged then, as its own entry. The
    /// simulated device takes what its topology's `nccl_model::NcclModel` says; a GPU runs NCCL and NVML tells
    /// what this process took across the whole first use.
    pub fn comm_begin(
        &self,
        setup: crate::device::group::CommSetup,
    ) -> Result<Option<CommFirstUse>> {
        let Some(tp) = self.tp() else {
            return Ok(None);
        };
        if self.0.borrow().comms.contains(&setup) {
            return Ok(None);
        }
        let mut i = self.0.borrow_mut();
        i.device.synchronize()?;
        let before = i.device.process_used();
        let held = i.device.comm_setup(setup, &tp)?;
        i.comms.push(setup);
        let modelled = held.map(|h| {
            let b = h.bytes;
            i.comm_memory.push(h);
            b
        });
        Ok(Some(CommFirstUse {
            setup,
            before,
            modelled,
        }))
    }

    /// Ends the first use `comm_begin` started, logging the bytes it took.
    pub fn comm_end(&self, first: Option<CommFirstUse>) -> Result<()> {
        let Some(f) = first else {
            return Ok(());
        };
        let mut i = self.0.borrow_mut();
        let bytes = match f.modelled {
            Some(b) => b,
            None => {
                i.device.synchronize()?;
                i.device.process_used().saturating_sub(f.before)
            }
        };
        i.refresh_device();
        i.push_event(
            EventKind::OutsideAlloc,
            f.setup.label(),
            Category::NonFramework,
            bytes,
            None,
        );
        Ok(())
    }

    /// `comm_begin` and `comm_end` around nothing: a setup that is complete by itself (the
    /// PyNcclCommunicator with its warm-up).
    pub fn ensure_comm(&self, setup: crate::device::group::CommSetup) -> Result<()> {
        let first = self.comm_begin(setup)?;
        self.comm_end(first)
    }

    /// Records a zero-byte marker (checkpoint, pass boundary) on the timeline.
    pub fn marker(&self, label: &str) {
        let mut i = self.0.borrow_mut();
        i.refresh_device();
        i.push_event(EventKind::Marker, label, Category::NonFramework, 0, None);
    }

    /// Sets the framework allocator's `max_split_size` (`None`: PyTorch's default, no limit),
    /// with a marker on the timeline naming the setting (`scripts/replay_allocator.py` applies
    /// it to PyTorch's allocator at the same point).
    pub fn set_max_split(&self, bytes: Option<u64>) {
        let op = self.op();
        self.0.borrow_mut().op = "allocator-settings";
        self.marker(&match bytes {
            Some(b) => format!("{MAX_SPLIT_MARKER}{}", b >> 20),
            None => format!("{MAX_SPLIT_MARKER}unlimited"),
        });
        let mut i = self.0.borrow_mut();
        i.op = op;
        i.alloc.set_max_split(bytes);
    }

    pub fn empty_cache(&self) {
        let mut i = self.0.borrow_mut();
        let inner = &mut *i;
        inner.alloc.empty_cache(&mut inner.device);
        inner.record_actions("empty_cache", Category::Activation);
    }

    pub fn reset_peak(&self) {
        self.0.borrow_mut().alloc.reset_peak();
    }

    pub fn reset_process_peak(&self) {
        self.0.borrow_mut().device.reset_process_peak();
    }

    pub fn process_peak(&self) -> u64 {
        self.0.borrow_mut().device.process_peak()
    }

    pub fn synchronize(&self) -> Result<()> {
        self.0.borrow_mut().device.synchronize()
    }

    pub fn stats(&self) -> AllocatorStats {
        self.0.borrow().alloc.stats()
    }

    pub fn snapshot(&self) -> Snapshot {
        let i = self.0.borrow();
        Snapshot {
            time_us: i.start.elapsed().as_micros() as u64,
            mem: i.mem_info(),
            stats: i.alloc.stats(),
            process_used: i.device.process_used(),
        }
    }

    pub fn elapsed_us(&self) -> u64 {
        self.0.borrow().start.elapsed().as_micros() as u64
    }

    pub fn event_count(&self) -> usize {
        self.0.borrow().events.len()
    }

    /// All events so far (the report keeps them).
    pub fn take_events(&self) -> Vec<Event> {
        self.flush_events(true);
        let mut i = self.0.borrow_mut();
        i.flushed = 0;
        std::mem::take(&mut i.events)
    }

    /// Events from index `from` on (for per-pass statistics).
    pub fn events_since<R>(&self, from: usize, f: impl FnOnce(&[Event]) -> R) -> R {
        f(&self.0.borrow().events[from..])
    }
}

impl Drop for Inner {
    /// Runs when the last tensor is gone (tensors hold the runtime): give every segment and
    /// workspace back, and send the closing events, so a cancelled or failed run leaves the
    /// device as it found it and its timeline ends at zero.
    fn drop(&mut self) {
        self.op = "teardown";
        self.layer = None;
        if let Some(c) = self.device.cuda() {
            c.clear_library_workspaces();
        }
        for (label, block) in std::mem::take(&mut self.workspaces) {
            self.alloc.free(block);
            self.record_actions(label, Category::Workspace);
        }
        self.alloc.empty_cache(&mut self.device);
        self.record_actions("empty_cache", Category::Activation);
        if let Some(sink) = self.sink.as_mut() {
            if self.flushed < self.events.len() {
                sink(Progress::Events(self.events[self.flushed..].to_vec()));
            }
        }
    }
}

impl Inner {
    /// Free and total as the instance reads them. On a device that mocks `mem_info` as vLLM's
    /// tests/worker/test_profile.py does (free = total − torch allocated), from the allocator.
    fn mem_info(&self) -> MemInfo {
        let m = self.device.mem_info();
        if self.device.free_tracks_allocated() {
            MemInfo {
                free: m.total.saturating_sub(self.alloc.stats().allocated),
                total: m.total,
            }
        } else {
            m
        }
    }

    fn refresh_device(&mut self) {
        let mem = self.mem_info();
        self.device_used = mem.total - mem.free;
        self.process_used = self.device.process_used();
    }

    fn record_actions(&mut self, tensor: &str, category: Category) {
        let actions = self.alloc.drain_actions();
        for LoggedAction {
            action,
            stats,
            pool,
        } in actions
        {
            let category = if graphs::is_graph_pool(pool) {
                Category::CudaGraph
            } else {
                category
            };
            let (kind, bytes, addr) = match action {
                AllocatorAction::SegmentMap { bytes, addr } => (EventKind::SegmentMap, bytes, addr),
                AllocatorAction::SegmentUnmap { bytes, addr } => {
                    (EventKind::SegmentUnmap, bytes, addr)
                }
                AllocatorAction::Alloc { bytes, addr } => (EventKind::Alloc, bytes, addr),
                AllocatorAction::Free { bytes, addr } => (EventKind::Free, bytes, addr),
            };
            if matches!(kind, EventKind::SegmentMap | EventKind::SegmentUnmap) {
                self.refresh_device();
            }
            self.push_event(kind, tensor, category, bytes, Some(stats));
            if let Some(ev) = self.events.last_mut() {
                ev.addr = Some(addr);
            }
        }
    }

    fn push_event(
        &mut self,
        kind: EventKind,
        tensor: &str,
        category: Category,
        bytes: u64,
        stats: Option<AllocatorStats>,
    ) {
        let stats = stats.unwrap_or_else(|| self.alloc.stats());
        let ev = Event {
            seq: self.events.len() as u64,
            time_us: self.start.elapsed().as_micros() as u64,
            pass: self.pass,
            kind,
            op: self.op.to_string(),
            layer: self.layer,
            tensor: tensor.to_string(),
            category,
            bytes,
            allocated: stats.allocated,
            reserved: stats.reserved,
            device_used: self.device_used,
            process_used: self.process_used,
            addr: None,
        };
        self.events.push(ev);
    }
}

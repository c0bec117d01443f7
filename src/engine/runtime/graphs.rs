//! CUDA graph capture on a runtime, as vLLM V1 does it through PyTorch: warm-ups and captures
//! on a side stream whose blocks the default stream never reuses, every capture opened by
//! `torch.cuda.graph.__enter__`'s synchronize and `empty_cache`, the capture's blocks drawn from
//! a private pool shared by all graphs (PyTorch's `graph_pool_handle`), kept while the graphs
//! live. A GPU captures for real (cudarc's stream capture) and the driver says what each
//! instantiated graph takes; the simulated device takes what `modelled_exec_bytes` says.

use serde::{Deserialize, Serialize};

use super::{Inner, Runtime};
use crate::base::error::{Error, Result};
use crate::device::OutsideAlloc;
use crate::memory::{Category, EventKind};

/// vLLM's global graph pool (`current_platform.get_global_graph_pool()`).
pub const GRAPH_POOL: u16 = 1;
/// The throwaway pool of vLLM's CUDA graph memory estimator (`profile_cudagraph_memory`).
pub const ESTIMATE_POOL: u16 = 2;
/// The side stream's blocks in the default pool: PyTorch's caching allocator keys cached
/// blocks by stream, so what the side stream frees is not the default stream's to reuse.
const SIDE_POOL: u16 = 3;

/// Whether blocks of `pool` belong to CUDA graphs (the timeline's cuda-graph category).
pub(super) fn is_graph_pool(pool: u16) -> bool {
    pool == GRAPH_POOL || pool == ESTIMATE_POOL
}

/// Device memory of one instantiated graph on the simulated device: a fixed part and a part
/// per captured op, fitted to what the H200's driver took for vramscope's own graphs
/// (docs/gpu-runs.md run 54, Llama-3-8B with vLLM 0.19's 51 PIECEWISE sizes × 33 pieces and
/// 51 FULL graphs: 387,973,120 B for 1,734 graphs of 29,580 ops, and 6 MiB for the 33 pieces
/// of 290 ops that the estimator's second PIECEWISE sample instantiates; the fit gives
/// 387,090,000 B for the whole capture, 0.2 % under). The same driver took 8.6 % less for
/// those graphs in run 55 (cuBLAS chose other kernels, fewer nodes) and, in run 56, 23 % more
/// than this model for vLLM 0.6.4's 131 whole-model V0 graphs (226,492,416 B against
/// 174,063,616 B): a graph of hundreds of ops costs more per op than a piece of nine. A
/// linear fit of runs 55 and 56 (109,000 B + 5,600 B an op) would move the estimator's
/// PIECEWISE sample from the GPU's 6 MiB to 4 MiB, so the fit of run 54 stays.
pub const EXEC_BYTES_PER_GRAPH: u64 = 155_000;
pub const EXEC_BYTES_PER_OP: u64 = 4_000;
/// The driver's graph memory grows in steps of this size: every free-memory delta of run 54
/// (the estimator's samples of 2 and 6 MiB, the whole capture's 370 MiB) is a multiple of it.
pub const EXEC_CHUNK_BYTES: u64 = 2 << 20;

pub fn modelled_exec_bytes(ops: u32) -> u64 {
    EXEC_BYTES_PER_GRAPH + EXEC_BYTES_PER_OP * ops as u64
}

/// The flash-attention call a decode step's graph makes, for what it allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashCall {
    /// FlashAttention 3 with `num_splits = splits` in vLLM V1's FULL graphs (32 on Hopper:
    /// 0.19.0 v1/attention/backends/flash_attn.py:391-401): `softmax_lse`, then fp32
    /// `out_accum [s, heads, T, d]` and `softmax_lse_accum [s, heads, T]` (flash-attention
    /// hopper/flash_api.cpp:1182-1191); its tile semaphore is V1's persistent scheduler buffer.
    Fa3 { splits: usize },
    /// FlashAttention 3 under V0 (0.8.5 on Hopper): `softmax_lse`, a tile semaphore int32
    /// `[1 + T]`, then the accumulators when splitting.
    Fa3V0 { splits: usize },
    /// vllm-flash-attn 2's `flash_attn_with_kvcache` (V0 0.6.x): `softmax_lse [T · heads]`,
    /// then fp32 `softmax_lse_accum [s, T, heads]` and `out_accum [s, T, heads, d rounded up
    /// to 32]` when splitting (docs/reading/vllm-v0-graphs.md).
    Fa2Kvcache { splits: usize },
    /// vLLM's Triton `unified_attention` (V1's TRITON_ATTN): no `softmax_lse`, and its 3D
    /// kernel's segment buffers are the metadata builder's, allocated once with the KV
    /// cache (0.19.0 v1/attention/backends/triton_attn.py L169-190): nothing per call.
    TritonUnified,
}

/// vLLM's CUDA graph runtime modes (`CUDAGraphMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CaptureKind {
    /// One graph per piece between attention layers; attention runs eagerly between them.
    Piecewise,
    /// The whole forward, attention included, in one graph.
    Full,
}

impl CaptureKind {
    pub fn name(self) -> &'static str {
        match self {
            CaptureKind::Piecewise => "PIECEWISE",
            CaptureKind::Full => "FULL",
        }
    }
}

/// One graph: what was captured into it and the device memory it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphRecord {
    /// Ops captured (the same count on every backend).
    pub ops: u32,
    /// Nodes in the instantiated graph (GPU only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u64>,
    /// Device memory the instantiated graph took: measured on a GPU, modelled on the
    /// simulated device.
    pub exec_bytes: u64,
    /// The device's index of the graph (GPU only), for replays.
    #[serde(skip)]
    pub device_index: Option<usize>,
}

#[derive(Default)]
pub(super) struct GraphState {
    /// FlashAttention 3's split count while vLLM's FULL graphs run attention (see
    /// `Runtime::set_attention_splits`).
    attn_splits: Option<FlashCall>,
    side: bool,
    /// The default stream's workspace flags while a side stream runs: PyTorch keeps a cuBLAS
    /// (and cuBLASLt) workspace per handle and stream, so a new stream takes its own at its
    /// first GEMM and keeps it.
    main_workspaces_taken: Option<(bool, bool)>,
    open: Option<Open>,
    /// The simulated device's graph memory (whole chunks), given back when the graphs go,
    /// and the bytes its graphs use of them.
    sim_exec: Vec<OutsideAlloc>,
    sim_exec_used: u64,
    /// A GPU's graph memory (measured), logged as freed when the graphs go.
    cuda_exec_bytes: u64,
    records: Vec<GraphRecord>,
}

struct Open {
    pool: u16,
    kind: CaptureKind,
    ops: u32,
    first: usize,
}

impl GraphState {
    pub(super) fn count_op(&mut self) {
        if let Some(o) = &mut self.open {
            o.ops += 1;
        }
    }
}

impl Runtime {
    /// With `Some(call)`, attention allocates as that decode call of a CUDA graph does (see
    /// `FlashCall`). `None`: FlashAttention 2's varlen call (the profile passes).
    pub fn set_attention_splits(&self, call: Option<FlashCall>) {
        self.0.borrow_mut().graphs.attn_splits = call;
    }

    pub fn attention_splits(&self) -> Option<FlashCall> {
        self.0.borrow().graphs.attn_splits
    }

    /// Moves the work to a new side stream (`graph_capture()` makes one each time), or back.
    /// The side stream's first GEMM takes its own cuBLAS workspace, as PyTorch's
    /// per-(handle, stream) workspaces do (aten/src/ATen/cuda/CublasHandlePool.cpp), kept for
    /// the instance's life; the default stream's is set again on the way back.
    pub fn graph_side_stream(&self, on: bool) -> Result<()> {
        let mut i = self.0.borrow_mut();
        if i.graphs.open.is_some() {
            return Err(Error::Request(
                "the side stream cannot change while a graph is captured".into(),
            ));
        }
        if on == i.graphs.side {
            return Ok(());
        }
        if let Some(c) = i.device.cuda() {
            c.side_stream(on)?;
        }
        i.graphs.side = on;
        i.alloc.set_capture_pool(on.then_some(SIDE_POOL));
        if on {
            i.graphs.main_workspaces_taken = Some((i.workspaces_taken, i.lt_workspace_taken));
            i.workspaces_taken = false;
            i.lt_workspace_taken = false;
        } else if let Some((ws, lt)) = i.graphs.main_workspaces_taken.take() {
            i.workspaces_taken = ws;
            i.lt_workspace_taken = lt;
            let label = crate::device::LibraryWorkspace::Cublas.label();
            let main = i
                .workspaces
                .iter()
                .find(|(l, _)| *l == label)
                .map(|(_, b)| (b.segment.0 + b.offset, b.bytes));
            if let (Some((ptr, bytes)), Some(c)) = (main, i.device.cuda()) {
                c.set_library_workspace(crate::device::LibraryWorkspace::Cublas, ptr, bytes);
            }
        }
        Ok(())
    }

    /// Makes what captures need outside the framework before any memory is measured (a GPU's
    /// input arenas for captured host copies).
    pub fn graph_prepare(&self) -> Result<()> {
        let mut i = self.0.borrow_mut();
        if let Some(c) = i.device.cuda() {
            c.ensure_arenas()?;
        }
        Ok(())
    }

    /// Opens a capture into private pool `pool`.
    pub fn capture_begin(&self, pool: u16, kind: CaptureKind) -> Result<()> {
        {
            let i = self.0.borrow();
            if !i.graphs.side || i.graphs.open.is_some() {
                return Err(Error::Request(
                    "a capture needs the side stream and no other capture open".into(),
                ));
            }
        }
        let first = self.0.borrow().graphs.records.len();
        self.open_piece(pool)?;
        self.0.borrow_mut().graphs.open = Some(Open {
            pool,
            kind,
            ops: 0,
            first,
        });
        Ok(())
    }

    /// `torch.cuda.graph.__enter__` (synchronize, `empty_cache`), then the capture.
    fn open_piece(&self, pool: u16) -> Result<()> {
        self.synchronize()?;
        self.empty_cache();
        let mut i = self.0.borrow_mut();
        i.alloc.retain_pool(pool);
        i.alloc.set_capture_pool(Some(pool));
        if let Some(c) = i.device.cuda() {
            c.capture_begin()?;
        }
        Ok(())
    }

    /// Closes the open piece: the graph is instantiated and its memory logged.
    fn close_piece(&self) -> Result<()> {
        let mut i = self.0.borrow_mut();
        let inner: &mut Inner = &mut i;
        let Some(open) = &mut inner.graphs.open else {
            return Ok(());
        };
        let ops = std::mem::take(&mut open.ops);
        inner.alloc.set_capture_pool(Some(SIDE_POOL));
        let record = match inner.device.cuda() {
            Some(c) => {
                let (index, info) = c.capture_end()?;
                inner.graphs.cuda_exec_bytes += info.exec_bytes;
                GraphRecord {
                    ops,
                    nodes: Some(info.nodes),
                    exec_bytes: info.exec_bytes,
                    device_index: Some(index),
                }
            }
            None => {
                let held: u64 = inner.graphs.sim_exec.iter().map(|a| a.bytes).sum();
                inner.graphs.sim_exec_used += modelled_exec_bytes(ops);
                let need =
                    inner.graphs.sim_exec_used.div_ceil(EXEC_CHUNK_BYTES) * EXEC_CHUNK_BYTES - held;
                let bytes = if need > 0 {
                    let a = inner.device.alloc_outside(need)?;
                    let b = a.bytes;
                    inner.graphs.sim_exec.push(a);
                    b
                } else {
                    0
                };
                GraphRecord {
                    ops,
                    nodes: None,
                    exec_bytes: bytes,
                    device_index: None,
                }
            }
        };
        inner.refresh_device();
        let label = format!("cuda-graph #{}", inner.graphs.records.len());
        inner.push_event(
            EventKind::OutsideAlloc,
            &label,
            Category::CudaGraph,
            record.exec_bytes,
            None,
        );
        inner.graphs.records.push(record);
        Ok(())
    }

    /// In a PIECEWISE capture: ends this piece's graph and opens the next one (vLLM splits at
    /// every attention layer). Nothing otherwise.
    pub fn capture_break(&self) -> Result<()> {
        let pool = match &self.0.borrow().graphs.open {
            Some(o) if o.kind == CaptureKind::Piecewise => o.pool,
            _ => return Ok(()),
        };
        self.close_piece()?;
        self.open_piece(pool)
    }

    /// Ends the capture; returns its graphs (one, or a PIECEWISE capture's pieces).
    pub fn capture_end(&self) -> Result<Vec<GraphRecord>> {
        self.close_piece()?;
        let mut i = self.0.borrow_mut();
        let first = i.graphs.open.take().map_or(0, |o| o.first);
        Ok(i.graphs.records[first..].to_vec())
    }

    /// Replays `graphs` in order on the GPU (nothing elsewhere) and waits.
    pub fn graphs_replay(&self, graphs: &[GraphRecord]) -> Result<()> {
        let mut i = self.0.borrow_mut();
        if let Some(c) = i.device.cuda() {
            for g in graphs {
                if let Some(idx) = g.device_index {
                    c.graph_replay(idx)?;
                }
            }
        }
        Ok(())
    }

    /// Destroys every graph, gives their memory back and lets pool `pool` go at the next
    /// `empty_cache`.
    pub fn graphs_drop(&self, pool: u16) -> Result<()> {
        let mut i = self.0.borrow_mut();
        if let Some(c) = i.device.cuda() {
            c.graphs_clear()?;
        }
        let sim: Vec<OutsideAlloc> = std::mem::take(&mut i.graphs.sim_exec);
        i.graphs.sim_exec_used = 0;
        let mut bytes = std::mem::take(&mut i.graphs.cuda_exec_bytes);
        for a in sim {
            bytes += a.bytes;
            i.device.free_outside(a);
        }
        i.graphs.records.clear();
        i.alloc.release_pool(pool);
        i.refresh_device();
        i.push_event(
            EventKind::OutsideFree,
            "cuda-graphs destroyed",
            Category::CudaGraph,
            bytes,
            None,
        );
        Ok(())
    }

    /// Bytes in the segments of private pool `pool`.
    pub fn pool_reserved(&self, pool: u16) -> u64 {
        self.0.borrow().alloc.pool_reserved(pool)
    }

    /// Bytes the side stream's cached segments hold.
    pub fn side_stream_reserved(&self) -> u64 {
        self.0.borrow().alloc.pool_reserved(SIDE_POOL)
    }

    /// `numel` floats at `ptr` in `dtype` on a GPU (a graph's output after a replay).
    pub fn download_at(
        &self,
        ptr: u64,
        numel: usize,
        dtype: crate::engine::tensor::DType,
    ) -> Result<Option<Vec<f32>>> {
        let mut i = self.0.borrow_mut();
        match i.device.cuda() {
            Some(c) => c.download_at(ptr, numel, dtype).map(Some),
            None => Ok(None),
        }
    }
}

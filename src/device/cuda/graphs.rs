//! CUDA graphs as vLLM V1 captures them: warm-up runs and captures on a side stream
//! (`graph_capture()` makes one: 0.19.0 distributed/parallel_state.py:1284-1300), stream
//! capture in relaxed mode (the caching allocator maps segments while a capture is open, as
//! PyTorch's does under `cudaStreamCaptureModeRelaxed`), each graph instantiated and uploaded at
//! the end of its capture, and the device memory that takes read from the driver.
//!
//! Host data a captured op needs (token ids, positions) is copied from a page-locked arena into
//! a device arena by an asynchronous copy on the side stream, so the graph holds a copy node
//! that reads the same host bytes at every replay, as vLLM's persistent input buffers are read.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result as drv, sys as dsys, CudaGraph, CudaStream};

use super::CudaDevice;
use crate::base::error::Result;

/// Bytes of each input arena (host and device). Every captured op that reads host data keeps
/// its own place: V0's 131 batch sizes up to 1024 stage about 10 MB of ids and positions.
const ARENA_BYTES: usize = 64 << 20;
/// The part of the arenas that eager (not captured) work on the side stream reuses, after a
/// synchronize, so warm-ups take no permanent place.
const SCRATCH_BYTES: usize = 1 << 20;

#[derive(Default)]
pub(super) struct Graphs {
    /// The side stream warm-ups and captures run on (non-blocking), made on first use.
    side: Option<Arc<CudaStream>>,
    /// The legacy stream, kept here while the side stream is the device's stream.
    parked: Option<Arc<CudaStream>>,
    capturing: bool,
    graphs: Vec<CudaGraph>,
    /// Page-locked host arena (address, bytes) and the device arena (address, bytes).
    host: Option<(usize, usize)>,
    dev: Option<(u64, usize)>,
    used: usize,
    /// Places of the bytes captures staged, by a hash of the bytes and their length: a
    /// capture that stages bytes already in the arena (every layer's rope table, every
    /// piece's positions) copies from the same place, as vLLM's pieces read one persistent
    /// buffer.
    places: foldhash::HashMap<(u64, usize), Vec<usize>>,
}

/// One instantiated graph, as the driver reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphInfo {
    /// Nodes in the captured graph (kernels, copies, memsets).
    pub nodes: u64,
    /// Device memory that instantiating and uploading it took (free memory before − after).
    pub exec_bytes: u64,
}

impl CudaDevice {
    /// Moves all work to the side stream (true) or back to the legacy stream (false),
    /// synchronizing the one left.
    pub fn side_stream(&mut self, on: bool) -> Result<()> {
        if on == self.graphs.parked.is_some() {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.err("synchronize", e))?;
        if on {
            if self.graphs.side.is_none() {
                let s = self
                    .ctx
                    .new_stream()
                    .map_err(|e| self.err("creating the capture stream", e))?;
                self.graphs.side = Some(s);
            }
            self.ensure_arenas()?;
            let side = self.graphs.side.clone().expect("side stream");
            self.graphs.parked = Some(std::mem::replace(&mut self.stream, side));
        } else {
            let legacy = self.graphs.parked.take().expect("parked stream");
            self.stream = legacy;
        }
        if let Some(h) = self.blas {
            // SAFETY: the handle is live; the stream outlives its use (kept in `graphs`).
            unsafe { cudarc::cublas::result::set_stream(h, self.stream.cu_stream() as _) }
                .map_err(|e| self.err("cuBLAS stream", e))?;
        }
        Ok(())
    }

    /// Makes the input arenas now (before a measurement of free memory starts).
    pub fn ensure_arenas(&mut self) -> Result<()> {
        if self.graphs.host.is_none() {
            // SAFETY: a plain page-locked host allocation, freed in `drop_graph_arenas`.
            let p = unsafe { drv::malloc_host(ARENA_BYTES, 0) }
                .map_err(|e| self.err("page-locked memory for graph inputs", e))?;
            self.graphs.host = Some((p as usize, ARENA_BYTES));
        }
        if self.graphs.dev.is_none() {
            let p = self.malloc(ARENA_BYTES as u64, "graph input buffers")?;
            self.graphs.dev = Some((p, ARENA_BYTES));
        }
        Ok(())
    }

    /// Whether work runs on the side stream (host copies must then go through the arena).
    pub(super) fn on_side_stream(&self) -> bool {
        self.graphs.parked.is_some()
    }

    /// `stage` on the side stream: the bytes go to a place of the host arena and an
    /// asynchronous copy on the stream brings them to the device arena. A capture's place is
    /// its own until the graphs go; eager work waits for the stream and reuses the scratch
    /// part at the arena's start.
    pub(super) fn stage_on_side(&mut self, bytes: &[u8]) -> Result<u64> {
        let (Some((host, cap)), Some((dev, _))) = (self.graphs.host, self.graphs.dev) else {
            return Err(self.err("graph inputs", "no input arena (side stream not entered)"));
        };
        if !self.graphs.capturing && bytes.len() <= SCRATCH_BYTES {
            self.stream
                .synchronize()
                .map_err(|e| self.err("synchronize", e))?;
            // SAFETY: the scratch part lies inside the host arena; nothing reads it now.
            let dst = unsafe { std::slice::from_raw_parts_mut(host as *mut u8, bytes.len()) };
            dst.copy_from_slice(bytes);
            // SAFETY: page-locked source, device destination inside the arena.
            unsafe { drv::memcpy_htod_async(dev, &*dst, self.stream.cu_stream()) }
                .map_err(|e| self.err("copy to GPU", e))?;
            return Ok(dev);
        }
        let key = (
            std::hash::BuildHasher::hash_one(&foldhash::quality::FixedState::default(), bytes),
            bytes.len(),
        );
        let same = self.graphs.places.get(&key).and_then(|places| {
            places.iter().copied().find(|&at| {
                // SAFETY: each place lies inside the host arena and holds `len` bytes written
                // once until the graphs are dropped.
                let held =
                    unsafe { std::slice::from_raw_parts((host + at) as *const u8, bytes.len()) };
                held == bytes
            })
        });
        // A place of its own for bytes the arena does not hold yet.
        let at = match same {
            Some(at) => at,
            None => {
                let at = self.graphs.used.max(SCRATCH_BYTES).next_multiple_of(256);
                if at + bytes.len() > cap {
                    return Err(self.err(
                        "graph inputs",
                        format!(
                            "the {} MiB input arena is full after {} captures' inputs",
                            cap >> 20,
                            self.graphs.graphs.len()
                        ),
                    ));
                }
                // SAFETY: [at, at + len) lies inside the host arena, which no pending copy
                // reads (each place is written once until the graphs are dropped).
                unsafe { std::slice::from_raw_parts_mut((host + at) as *mut u8, bytes.len()) }
                    .copy_from_slice(bytes);
                self.graphs.used = at + bytes.len();
                self.graphs.places.entry(key).or_default().push(at);
                at
            }
        };
        // SAFETY: the place lies inside the host arena and holds these bytes.
        let src = unsafe { std::slice::from_raw_parts((host + at) as *const u8, bytes.len()) };
        let d = dev + at as u64;
        // SAFETY: page-locked source, device destination inside the arena, on the side
        // stream: a capture keeps the copy node, which reads the same place at every replay.
        unsafe { drv::memcpy_htod_async(d, src, self.stream.cu_stream()) }
            .map_err(|e| self.err("copy to GPU", e))?;
        Ok(d)
    }

    /// Whether a graph capture is open (work now is recorded, not run).
    pub fn is_capturing(&self) -> bool {
        self.graphs.capturing
    }

    /// Starts capturing the side stream into a new graph.
    pub fn capture_begin(&mut self) -> Result<()> {
        if !self.on_side_stream() || self.graphs.capturing {
            return Err(self.err(
                "graph capture",
                "a capture needs the side stream and no other capture open",
            ));
        }
        self.stream
            .begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| self.err("begin capture", e))?;
        self.graphs.capturing = true;
        Ok(())
    }

    /// Ends the capture: instantiates and uploads the graph and measures the device memory
    /// that took. Returns its index and what the driver reports.
    pub fn capture_end(&mut self) -> Result<(usize, GraphInfo)> {
        if !self.graphs.capturing {
            return Err(self.err("graph capture", "no capture is open"));
        }
        self.graphs.capturing = false;
        let before = self.mem_info().free;
        let g = self
            .stream
            .end_capture(dsys::CUgraphInstantiate_flags(0))
            .map_err(|e| self.err("end capture (instantiate)", e))?
            .ok_or_else(|| self.err("end capture", "the driver returned no graph"))?;
        g.upload().map_err(|e| self.err("graph upload", e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.err("synchronize", e))?;
        let after = self.mem_info().free;
        let mut nodes = 0usize;
        // SAFETY: counting only (a null node array); the graph is live.
        unsafe { dsys::cuGraphGetNodes(g.cu_graph(), std::ptr::null_mut(), &mut nodes) }
            .result()
            .map_err(|e| self.err("graph nodes", e))?;
        self.graphs.graphs.push(g);
        Ok((
            self.graphs.graphs.len() - 1,
            GraphInfo {
                nodes: nodes as u64,
                exec_bytes: before.saturating_sub(after),
            },
        ))
    }

    /// Fills a tensor with zero bytes on the stream (`tensor.fill_(0)`).
    pub fn zero(&mut self, t: &mut crate::device::tensor::TensorData) -> Result<()> {
        // SAFETY: the tensor holds nbytes bytes at its address.
        unsafe {
            drv::memset_d8_async(
                t.cuda_ptr(),
                0,
                t.nbytes() as usize,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| self.err("memset", e))
    }

    /// `numel` floats of `dtype` at device address `ptr` (a graph's output, which the graph
    /// writes at every replay though no tensor holds it any more: vLLM's weak reference).
    pub fn download_at(
        &mut self,
        ptr: u64,
        numel: usize,
        dtype: crate::device::tensor::DType,
    ) -> Result<Vec<f32>> {
        let t = crate::device::tensor::TensorData {
            shape: vec![numel],
            dtype,
            name: "graph output".into(),
            storage: crate::device::tensor::Storage::Cuda(ptr),
        };
        self.download_f32(&t)
    }

    /// Replays graph `index` and waits for it.
    pub fn graph_replay(&mut self, index: usize) -> Result<()> {
        let g = self
            .graphs
            .graphs
            .get(index)
            .ok_or_else(|| self.err("graph replay", format!("no graph {index}")))?;
        g.launch().map_err(|e| self.err("graph launch", e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.err("synchronize", e))
    }

    /// Destroys every graph (their device memory goes back to the driver) and rewinds the
    /// input arenas.
    pub fn graphs_clear(&mut self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.err("synchronize", e))?;
        self.graphs.graphs.clear();
        self.graphs.used = 0;
        self.graphs.places.clear();
        Ok(())
    }

    pub(super) fn drop_graph_arenas(&mut self) {
        self.graphs.graphs.clear();
        self.graphs.used = 0;
        self.graphs.places.clear();
        if let Some((p, _)) = self.graphs.host.take() {
            // SAFETY: from malloc_host; the device was synchronized by the caller.
            let _ = unsafe { drv::free_host(p as *mut c_void) };
        }
        if let Some((p, _)) = self.graphs.dev.take() {
            self.free(p);
        }
    }
}

//! Tensor parallel on GPUs: NCCL communicators made as vLLM's worker makes them, the
//! collectives of a pass (all-reduce, the gather of the logits), and the masked embedding and
//! concatenation around them. Every rank is a thread of this process with its own GPU.

use cudarc::driver::sys as dsys;

use super::{nccl, CudaDevice};
use crate::base::error::Result;
use crate::device::group::{CommSetup, TpRank};
use crate::device::tensor::{DType, TensorData};

/// The NCCL communicators of one rank, destroyed with the device.
#[derive(Default)]
pub(crate) struct Comms {
    /// vLLM's PyNcclCommunicator (made when the worker starts, warmed up, then idle in eager
    /// mode).
    pynccl: Option<nccl::Comm>,
    /// torch.distributed's communicator of the device group (all-reduce, gather).
    device_group: Option<nccl::Comm>,
}

impl Drop for Comms {
    fn drop(&mut self) {
        for c in [self.pynccl.take(), self.device_group.take()]
            .into_iter()
            .flatten()
        {
            // SAFETY: each handle came from ncclCommInitRank and is dropped once, here.
            unsafe { nccl::comm_destroy(c) };
        }
    }
}

fn nccl_dtype(dt: DType) -> Option<std::ffi::c_int> {
    match dt {
        DType::F16 => Some(nccl::NCCL_FLOAT16),
        DType::BF16 => Some(nccl::NCCL_BFLOAT16),
        DType::F32 => Some(nccl::NCCL_FLOAT32),
        _ => None,
    }
}

impl CudaDevice {
    fn nccl_err(&self, e: String) -> crate::base::error::Error {
        self.err("NCCL", e)
    }

    /// Whether this GPU reaches the next `size − 1` GPUs directly (peer access), as vLLM's
    /// `_can_p2p` asks before it turns its custom all-reduce on.
    pub fn peers_reachable(&self, size: usize) -> bool {
        let Ok(count) = cudarc::driver::result::device::get_count() else {
            return false;
        };
        let first = self.ordinal - self.ordinal % size.max(1);
        (first..first + size).all(|peer| {
            if peer == self.ordinal {
                return true;
            }
            if peer >= count.max(0) as usize {
                return false;
            }
            let mut can: std::ffi::c_int = 0;
            let mut dev: dsys::CUdevice = 0;
            // SAFETY: reads one device handle and one flag.
            let asked = unsafe {
                dsys::cuDeviceGet(&mut dev, peer as std::ffi::c_int)
                    .result()
                    .is_ok()
                    && dsys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), dev)
                        .result()
                        .is_ok()
            };
            asked && can != 0
        })
    }

    /// A communicator over the ranks of `tp`: rank 0 makes the id, every rank joins.
    fn new_comm(&mut self, tp: &TpRank) -> Result<nccl::Comm> {
        let mine: Vec<u64> = if tp.rank == 0 {
            let id = nccl::unique_id().map_err(|e| {
                tp.group.abort(tp.rank, &e);
                self.nccl_err(e)
            })?;
            id.internal
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(std::array::from_fn(|i| c[i] as u8)))
                .collect()
        } else {
            Vec::new()
        };
        let all = tp.group.all_gather_u64(tp.rank, &mine)?;
        let mut id = nccl::UniqueId { internal: [0; 128] };
        for (i, w) in all[0].iter().enumerate() {
            for (j, b) in w.to_le_bytes().iter().enumerate() {
                id.internal[i * 8 + j] = *b as std::ffi::c_char;
            }
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        nccl::comm_init_rank(id, tp.rank, tp.size).map_err(|e| {
            tp.group.abort(tp.rank, &e);
            self.nccl_err(e)
        })
    }

    /// Makes what `setup` needs; the caller measures across it and the first collective.
    pub fn comm_setup(&mut self, setup: CommSetup, tp: &TpRank) -> Result<()> {
        match setup {
            CommSetup::PyncclInit => {
                let comm = self.new_comm(tp)?;
                self.comms.pynccl = Some(comm);
                // pynccl.py L93-97: `torch.zeros(1)` all-reduced as warm-up; our one-element
                // buffer is the staging buffer, not a framework block (4 bytes).
                let buf = self.stage(&[0u8; 4])?;
                // SAFETY: `buf` is a live device buffer of at least 4 bytes.
                unsafe {
                    nccl::all_reduce_sum(
                        buf,
                        buf,
                        1,
                        nccl::NCCL_FLOAT32,
                        comm,
                        self.stream.cu_stream().cast(),
                    )
                }
                .map_err(|e| self.nccl_err(e))?;
            }
            CommSetup::DeviceGroup => {
                let comm = self.new_comm(tp)?;
                self.comms.device_group = Some(comm);
            }
            // The connections open inside the first gather itself.
            CommSetup::GatherP2p => {}
        }
        Ok(())
    }

    fn device_group(&self) -> Result<nccl::Comm> {
        self.comms.device_group.ok_or_else(|| {
            self.nccl_err("the device group's communicator was not made before its use".into())
        })
    }

    /// Sums `x` over the ranks: into `out` when given (vLLM's out-of-place custom
    /// all-reduce; NCCL does the sum here too), else in place.
    pub fn all_reduce_sum(
        &mut self,
        x: &TensorData,
        out: Option<&mut TensorData>,
        tp: &TpRank,
    ) -> Result<()> {
        let dt = nccl_dtype(x.dtype)
            .ok_or_else(|| self.err("all_reduce", format!("{} is not a float", x.name)))?;
        let comm = self.device_group()?;
        let send = x.cuda_ptr();
        let recv = out.map_or(send, |o| o.cuda_ptr());
        // SAFETY: both buffers hold `numel` elements of `x`'s dtype on this device.
        unsafe {
            nccl::all_reduce_sum(
                send,
                recv,
                x.numel(),
                dt,
                comm,
                self.stream.cu_stream().cast(),
            )
        }
        .map_err(|e| {
            tp.group.abort(tp.rank, &e);
            self.nccl_err(e)
        })
    }

    /// `torch.distributed.gather` to rank 0: `parts` (rank 0 only) get every rank's `x`.
    pub fn gather_to_first<P: std::ops::Deref<Target = TensorData>>(
        &mut self,
        x: &TensorData,
        parts: &mut [P],
        tp: &TpRank,
    ) -> Result<()> {
        let dt = nccl_dtype(x.dtype)
            .ok_or_else(|| self.err("gather", format!("{} is not a float", x.name)))?;
        let comm = self.device_group()?;
        let recv: Vec<u64> = parts.iter().map(|p| p.cuda_ptr()).collect();
        // SAFETY: every buffer holds `numel` elements of `x`'s dtype on this device.
        unsafe {
            nccl::gather_to_first(
                x.cuda_ptr(),
                &recv,
                x.numel(),
                dt,
                tp.rank,
                comm,
                self.stream.cu_stream().cast(),
            )
        }
        .map_err(|e| {
            tp.group.abort(tp.rank, &e);
            self.nccl_err(e)
        })
    }

    /// `torch.cat(parts, dim=-1)` of `[rows, cols]` parts into `[rows, cols·n]`.
    pub fn cat_cols<P: std::ops::Deref<Target = TensorData>>(
        &mut self,
        parts: &[P],
        out: &mut TensorData,
    ) -> Result<()> {
        let es = out.dtype.size_bytes() as usize;
        let dst_pitch = out.cols() * es;
        let mut at = 0usize;
        for p in parts {
            let width = p.cols() * es;
            let copy = dsys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: dsys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: p.cuda_ptr(),
                srcArray: std::ptr::null_mut(),
                srcPitch: width,
                dstXInBytes: at,
                dstY: 0,
                dstMemoryType: dsys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: out.cuda_ptr(),
                dstArray: std::ptr::null_mut(),
                dstPitch: dst_pitch,
                WidthInBytes: width,
                Height: p.rows(),
            };
            // SAFETY: source and destination are live device tensors of the shapes described.
            unsafe { dsys::cuMemcpy2DAsync_v2(&copy, self.stream.cu_stream()) }
                .result()
                .map_err(|e| self.err("cat", e))?;
            at += width;
        }
        Ok(())
    }

    /// The embedding lookup of one vocabulary shard: rows whose token another rank owns
    /// (`None`) are zero (vLLM's `masked_fill_`).
    pub fn masked_embedding(
        &mut self,
        local: &[Option<u32>],
        table: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let ids: Vec<u32> = local.iter().map(|l| l.unwrap_or(u32::MAX)).collect();
        self.embedding(&ids, table, out)
    }
}

/// NCCL's version and where it was found, or which file was looked for where.
pub fn nccl_library() -> std::result::Result<String, String> {
    nccl::version().map(|(v, path)| format!("NCCL {v} ({path})"))
}

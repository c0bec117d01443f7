//! CUDA backend (cudarc + NVML). Placeholder until the CUDA backend issue lands: opening a
//! CUDA device reports that this build cannot run on a GPU yet.

use super::{DeviceInfo, DeviceListing, MemInfo, OutsideAlloc};
use crate::error::{Error, Result};
use crate::memory::SegmentHandle;
use crate::model::config::ModelConfig;
use crate::quant::Nf4Linear;
use crate::tensor::Tensor;

pub struct CudaDevice {
    _private: (),
}

fn unavailable(ordinal: usize) -> Error {
    Error::Device {
        spec: format!("cuda:{ordinal}"),
        problem: "the CUDA backend is not built into this version; use --device sim:PRESET".into(),
    }
}

pub fn detect() -> Result<Vec<DeviceListing>> {
    Err(unavailable(0))
}

impl CudaDevice {
    pub fn open(ordinal: usize) -> Result<Self> {
        Err(unavailable(ordinal))
    }
    pub fn info(&self) -> DeviceInfo {
        unreachable!("no CudaDevice can be constructed")
    }
    pub fn mem_info(&self) -> MemInfo {
        unreachable!()
    }
    pub fn process_used(&self) -> u64 {
        unreachable!()
    }
    pub fn reset_process_peak(&mut self) {}
    pub fn cxb_row_pad(&self) -> usize {
        8
    }
    pub fn process_peak(&mut self) -> u64 {
        unreachable!()
    }
    pub fn library_workspace_bytes(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    pub fn alloc_outside(&mut self, _bytes: u64) -> Result<OutsideAlloc> {
        Err(unavailable(0))
    }
    pub fn free_outside(&mut self, _alloc: OutsideAlloc) {}
    pub fn hold_foreign(&mut self, _bytes: u64) -> Result<u64> {
        Err(unavailable(0))
    }
    pub fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
    pub fn map_segment(&mut self, _bytes: u64) -> Option<SegmentHandle> {
        None
    }
    pub fn unmap_segment(&mut self, _handle: SegmentHandle) {}
    pub fn embedding(&mut self, _ids: &[u32], _table: &Tensor, _out: &mut Tensor) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn rms_norm(
        &mut self,
        _x: &Tensor,
        _w: &Tensor,
        _eps: f32,
        _out: &mut Tensor,
    ) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn add_bias(&mut self, _x: &mut Tensor, _b: &Tensor) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn rope(
        &mut self,
        _q: &mut Tensor,
        _k: &mut Tensor,
        _pos: &[usize],
        _cfg: &ModelConfig,
    ) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn attention(
        &mut self,
        _q: &Tensor,
        _k: &Tensor,
        _v: &Tensor,
        _seq_lens: &[usize],
        _cfg: &ModelConfig,
        _out: &mut Tensor,
    ) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn add_assign(&mut self, _x: &mut Tensor, _y: &Tensor) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn silu_mul(&mut self, _g: &mut Tensor, _u: &Tensor) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn gather_rows(&mut self, _x: &Tensor, _rows: &[u32], _out: &mut Tensor) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn to_f32(&mut self, _x: &Tensor, _out: &mut Tensor) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn gemm_nt(&mut self, _x: &Tensor, _w: &Tensor, _out: &mut Tensor) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn nf4_dequantize(&mut self, _l: &Nf4Linear, _out: &mut Tensor) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn upload_f32(&mut self, _t: &mut Tensor, _d: &[f32]) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn upload_bytes(&mut self, _t: &mut Tensor, _d: &[u8]) -> Result<()> {
        Err(unavailable(0))
    }
    pub fn download_f32(&mut self, _x: &Tensor) -> Result<Vec<f32>> {
        Err(unavailable(0))
    }
}

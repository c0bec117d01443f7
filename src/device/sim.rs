//! The simulated GPU: exact bookkeeping of device memory, with the math done on the CPU
//! (compute mode) or skipped (dry mode, shapes only).

use super::presets::SimPreset;
use crate::memory::{SegmentHandle, SegmentSource};

/// The CUDA driver hands out device memory in 2 MiB pages.
pub const DRIVER_PAGE_BYTES: u64 = 2 << 20;

#[derive(Debug)]
pub struct SimDevice {
    pub preset: &'static SimPreset,
    pub compute: bool,
    /// How this GPU reaches the others of a tensor-parallel instance (the preset's, or
    /// `--topology`).
    pub topology: super::nccl_model::Topology,
    /// What `cudaMemGetInfo` reports as the total (the preset's, or `--total`).
    total: u64,
    /// Memory held by other processes on the same GPU.
    foreign: u64,
    /// This process: context, workspaces, framework segments, outside allocations.
    process: u64,
    process_peak: u64,
    next_handle: u64,
    segments: std::collections::HashMap<u64, u64>,
}

impl SimDevice {
    pub fn new(preset: &'static SimPreset, compute: bool) -> Self {
        Self {
            preset,
            compute,
            topology: preset.topology,
            total: preset.total_bytes,
            foreign: 0,
            process: 0,
            process_peak: 0,
            next_handle: 0x7f00_0000_0000,
            segments: Default::default(),
        }
    }

    /// What NCCL takes on this GPU under `rules`, over its topology.
    pub fn nccl_model(&self, rules: super::nccl_model::NcclRules) -> super::nccl_model::NcclModel {
        super::nccl_model::NcclModel::new(
            self.topology,
            rules,
            self.preset.arch,
            self.preset.resident_threads,
        )
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// Reports `bytes` as the total instead of the preset's (before anything is allocated).
    pub fn set_total(&mut self, bytes: u64) {
        self.total = bytes;
    }

    pub fn free(&self) -> u64 {
        self.total() - self.foreign - self.process
    }

    pub fn process_used(&self) -> u64 {
        self.process
    }

    pub fn process_peak(&self) -> u64 {
        self.process_peak
    }

    pub fn reset_process_peak(&mut self) {
        self.process_peak = self.process;
    }

    fn rounded(bytes: u64) -> u64 {
        bytes.div_ceil(DRIVER_PAGE_BYTES) * DRIVER_PAGE_BYTES
    }

    /// Takes memory for this process outside any allocator; `None` when it does not fit.
    pub fn take(&mut self, bytes: u64) -> Option<u64> {
        let bytes = Self::rounded(bytes);
        if bytes > self.free() {
            return None;
        }
        self.process += bytes;
        self.process_peak = self.process_peak.max(self.process);
        Some(bytes)
    }

    pub fn give_back(&mut self, rounded_bytes: u64) {
        self.process -= rounded_bytes;
    }

    /// Memory another process holds on the same device.
    pub fn hold_foreign(&mut self, bytes: u64) -> Option<u64> {
        let bytes = Self::rounded(bytes);
        if bytes > self.free() {
            return None;
        }
        self.foreign += bytes;
        Some(bytes)
    }
}

impl SegmentSource for SimDevice {
    fn map_segment(&mut self, bytes: u64) -> Option<SegmentHandle> {
        let taken = self.take(bytes)?;
        let handle = self.next_handle;
        self.next_handle += taken;
        self.segments.insert(handle, taken);
        Some(SegmentHandle(handle))
    }

    fn unmap_segment(&mut self, handle: SegmentHandle) {
        if let Some(bytes) = self.segments.remove(&handle.0) {
            self.give_back(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::presets;

    #[test]
    fn free_memory_counts_foreign_and_own_allocations() {
        let p = presets::find("h100-80gb").unwrap();
        let mut d = SimDevice::new(p, false);
        let t = d.total();
        d.hold_foreign(512 << 20).unwrap();
        d.take(1000).unwrap();
        assert_eq!(d.free(), t - (512 << 20) - DRIVER_PAGE_BYTES);
        assert_eq!(d.process_used(), DRIVER_PAGE_BYTES);
        let h = d.map_segment(20 << 20).unwrap();
        assert_eq!(d.process_peak(), (22 << 20));
        d.unmap_segment(h);
        assert_eq!(d.process_used(), DRIVER_PAGE_BYTES);
        assert!(d.take(t).is_none());
    }
}

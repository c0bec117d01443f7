//! Simulated GPUs. Totals are the framebuffer sizes `nvidia-smi` reports for each card (MiB
//! there); context overheads are typical CUDA 12/13 figures with lazy module loading (our own
//! H200 measurement, docs/gpu-runs.md, saw 527 MiB); workspace sizes are PyTorch's defaults
//! (`CUBLAS_WORKSPACE_CONFIG` ":4096:8" = 32 MiB on Hopper, ":4096:2:16:8" = 8.125 MiB
//! before it; cuBLASLt 1 MiB), both taken from PyTorch's caching allocator and kept, as torch
//! 2.11 does on the H200 (docs/gpu-runs.md run 24). All of it is labelled "simulated" wherever
//! it is shown.

use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimPreset {
    pub id: &'static str,
    pub name: &'static str,
    pub total_bytes: u64,
    /// Device memory the CUDA context takes when the instance starts.
    pub context_bytes: u64,
    /// cuBLAS workspace, allocated by the library on the first GEMM.
    pub cublas_workspace_bytes: u64,
    /// cuBLASLt workspace, allocated on the first int8/Lt GEMM.
    pub cublaslt_workspace_bytes: u64,
    /// Row padding of bitsandbytes' int8 CxB tiles: 8 for `col_turing` (Turing, Hopper), 32
    /// for `col_ampere` (compute capability 8.x: Ampere, Ada).
    pub cxb_row_pad: usize,
    /// Free memory reads as total − framework allocated, nothing else (vLLM's
    /// tests/worker/test_profile.py patches `torch.cuda.mem_get_info` so).
    pub free_is_total_minus_allocated: bool,
    /// The card's SXM form has NVLink to its peers (what vLLM's custom all-reduce needs for
    /// more than two GPUs); PCIe cards have not.
    pub nvlink: bool,
}

const HOPPER_CUBLAS: u64 = 32 * MIB;
const PRE_HOPPER_CUBLAS: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;

pub const SIM_PRESETS: &[SimPreset] = &[
    // vLLM 380e1863 tests/worker/test_profile.py: `mock_mem_info` returns
    // (10 GiB − allocated_bytes.all.current, 10 GiB), so the context and anything outside
    // torch are invisible. The test ran with the torch vLLM pinned (2.4), whose cuBLAS
    // workspace is the pre-Hopper default (8,519,680 B, the test's "0.0079 GiB non-torch"),
    // taken from the caching allocator, and whose cuBLASLt workspace was taken per call.
    SimPreset {
        id: "mock-10gib",
        name: "vLLM test_profile.py mock: 10 GiB, free = total − torch allocated (simulated)",
        total_bytes: 10 << 30,
        context_bytes: 0,
        cublas_workspace_bytes: PRE_HOPPER_CUBLAS,
        cublaslt_workspace_bytes: 0,
        cxb_row_pad: 8,
        free_is_total_minus_allocated: true,
        nvlink: false,
    },
    SimPreset {
        id: "h100-80gb",
        name: "NVIDIA H100 80GB HBM3 (simulated)",
        total_bytes: 81559 * MIB,
        context_bytes: 512 * MIB,
        cublas_workspace_bytes: HOPPER_CUBLAS,
        cublaslt_workspace_bytes: MIB,
        cxb_row_pad: 8,
        free_is_total_minus_allocated: false,
        nvlink: true,
    },
    SimPreset {
        id: "h200-141gb",
        name: "NVIDIA H200 (simulated)",
        total_bytes: 143771 * MIB,
        context_bytes: 527 * MIB,
        cublas_workspace_bytes: HOPPER_CUBLAS,
        cublaslt_workspace_bytes: MIB,
        cxb_row_pad: 8,
        free_is_total_minus_allocated: false,
        nvlink: true,
    },
    SimPreset {
        id: "a100-80gb",
        name: "NVIDIA A100-SXM4-80GB (simulated)",
        total_bytes: 81920 * MIB,
        context_bytes: 420 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_CUBLAS,
        cublaslt_workspace_bytes: MIB,
        cxb_row_pad: 32,
        free_is_total_minus_allocated: false,
        nvlink: true,
    },
    SimPreset {
        id: "a100-40gb",
        name: "NVIDIA A100-SXM4-40GB (simulated)",
        total_bytes: 40960 * MIB,
        context_bytes: 420 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_CUBLAS,
        cublaslt_workspace_bytes: MIB,
        cxb_row_pad: 32,
        free_is_total_minus_allocated: false,
        nvlink: true,
    },
    SimPreset {
        id: "l4-24gb",
        name: "NVIDIA L4 (simulated)",
        total_bytes: 23034 * MIB,
        context_bytes: 300 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_CUBLAS,
        cublaslt_workspace_bytes: MIB,
        cxb_row_pad: 32,
        free_is_total_minus_allocated: false,
        nvlink: false,
    },
    SimPreset {
        id: "rtx4090-24gb",
        name: "NVIDIA GeForce RTX 4090 (simulated)",
        total_bytes: 24564 * MIB,
        context_bytes: 300 * MIB,
        cublas_workspace_bytes: PRE_HOPPER_CUBLAS,
        cublaslt_workspace_bytes: MIB,
        cxb_row_pad: 32,
        free_is_total_minus_allocated: false,
        nvlink: false,
    },
];

pub fn find(id: &str) -> Option<&'static SimPreset> {
    SIM_PRESETS.iter().find(|p| p.id.eq_ignore_ascii_case(id))
}

//! Simulated GPUs. Each preset states two totals: the framebuffer `nvidia-smi` prints (MiB
//! there) and the total `cudaMemGetInfo` / `torch.cuda.mem_get_info()` reports, which is what
//! vLLM divides (`total_gpu_memory`), with where that number comes from: a public vLLM log or
//! PyTorch out-of-memory message ("measured", read to the 0.01 GiB the source prints), our own
//! H200, or "estimated" by the rule of [`ESTIMATED_DRIVER_RESERVE_MIB`]. A preset simulates
//! `cudaMemGetInfo`'s total; the six names from before (`h100-80gb`, `h200-141gb`,
//! `a100-80gb`, `a100-40gb`, `l4-24gb`, `rtx4090-24gb`) keep simulating the `nvidia-smi`
//! total they always had, so old sessions, tests and recorded GPU runs compare as before.
//!
//! Context overheads are typical CUDA 12/13 figures with lazy module loading (our own H200
//! measurement, docs/gpu-runs.md, saw 527 MiB; the others are estimates); workspace sizes are
//! PyTorch's defaults (`CUBLAS_WORKSPACE_CONFIG` ":4096:8" = 32 MiB on Hopper and Blackwell,
//! ":4096:2:16:8" = 8.125 MiB before; cuBLASLt 1 MiB), both taken from PyTorch's caching
//! allocator and kept, as torch 2.11 does on the H200 (docs/gpu-runs.md run 24). All of it
//! is labelled "simulated" wherever it is shown.

use serde::{Deserialize, Serialize};

use super::nccl_model::Topology;

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
    /// How two or more of these cards reach each other by default: NVLink for SXM boards,
    /// PCIe with peer-to-peer for data-center PCIe cards, PCIe without it for GeForce cards
    /// (their driver refuses peer-to-peer over PCIe). `--topology` overrides it.
    pub topology: Topology,
    /// GPU architecture ("Turing", "Ampere", "Ada", "Hopper", "Blackwell").
    pub arch: &'static str,
    /// Threads the GPU holds resident at once: SMs × the most threads per SM (NVIDIA's
    /// architecture specs). The driver reserves a kernel's stack for every one of them, which
    /// is part of what NCCL's first kernels cost (`nccl_model`).
    #[serde(default)]
    pub resident_threads: u64,
    /// Streaming multiprocessors (what `num_compute_units` reads in vLLM).
    #[serde(default)]
    pub sm_count: u64,
    /// The framebuffer `nvidia-smi` prints.
    pub smi_bytes: u64,
    /// The total `cudaMemGetInfo` reports (vLLM's `total_gpu_memory`).
    pub mem_get_info_bytes: u64,
    /// Whether `mem_get_info_bytes` was seen on a real card (else estimated).
    pub total_measured: bool,
    /// Where `mem_get_info_bytes` comes from (a URL and the line), or the estimate's rule.
    pub total_source: &'static str,
    /// For the names kept from before: the preset that simulates vLLM's total instead.
    pub superseded_by: Option<&'static str>,
}

impl SimPreset {
    /// What the `total_bytes` this preset simulates is.
    pub fn simulated_total_label(&self) -> &'static str {
        if self.superseded_by.is_some() {
            "nvidia-smi framebuffer (name kept from before)"
        } else if self.total_measured {
            "cudaMemGetInfo total (measured)"
        } else {
            "cudaMemGetInfo total (estimated)"
        }
    }
}

const HOPPER_CUBLAS: u64 = 32 * MIB;
const PRE_HOPPER_CUBLAS: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;

const GIB: u64 = 1 << 30;

/// A total a log prints in GiB to two decimals (`79.22GiB`), as bytes.
const fn gib_hundredths(h: u64) -> u64 {
    h * GIB / 100
}

/// The driver's reserve, `nvidia-smi` framebuffer − `cudaMemGetInfo` total, where no card of
/// the kind was measured: the median of the eight measured gaps below (316, 430, 438, 439,
/// 451, 582, 615, 666 MiB; median 444.6), rounded. The real gap varies by driver, ECC and
/// display; give `--total` when you know yours.
pub const ESTIMATED_DRIVER_RESERVE_MIB: u64 = 445;

const ESTIMATED: &str =
    "estimated: nvidia-smi framebuffer − 445 MiB (median driver reserve of the measured cards)";

const fn estimated(smi_mib: u64) -> u64 {
    (smi_mib - ESTIMATED_DRIVER_RESERVE_MIB) * MIB
}

/// Architecture defaults; a preset overrides what it knows better.
const fn card(
    id: &'static str,
    name: &'static str,
    arch: &'static str,
    smi_mib: u64,
    context_mib: u64,
) -> SimPreset {
    let hopper_or_later = matches!(arch.as_bytes(), b"Hopper" | b"Blackwell");
    // bitsandbytes 0.44 `get_special_format_str`: col_ampere on compute capability 8.x,
    // col_turing otherwise.
    let ampere_or_ada = matches!(arch.as_bytes(), b"Ampere" | b"Ada");
    SimPreset {
        id,
        name,
        total_bytes: estimated(smi_mib),
        context_bytes: context_mib * MIB,
        cublas_workspace_bytes: if hopper_or_later {
            HOPPER_CUBLAS
        } else {
            PRE_HOPPER_CUBLAS
        },
        cublaslt_workspace_bytes: MIB,
        cxb_row_pad: if ampere_or_ada { 32 } else { 8 },
        free_is_total_minus_allocated: false,
        topology: Topology::Pcie,
        arch,
        resident_threads: 0,
        sm_count: 0,
        smi_bytes: smi_mib * MIB,
        mem_get_info_bytes: estimated(smi_mib),
        total_measured: false,
        total_source: ESTIMATED,
        superseded_by: None,
    }
}

/// `p` with a measured `cudaMemGetInfo` total (what it simulates too).
const fn measured(mut p: SimPreset, bytes: u64, source: &'static str) -> SimPreset {
    p.total_bytes = bytes;
    p.mem_get_info_bytes = bytes;
    p.total_measured = true;
    p.total_source = source;
    p
}

const fn nvlink(mut p: SimPreset) -> SimPreset {
    p.topology = Topology::Nvlink;
    p
}

/// `p` with `sms` streaming multiprocessors of `per_sm` resident threads each.
const fn sms(mut p: SimPreset, sms: u64, per_sm: u64) -> SimPreset {
    p.resident_threads = sms * per_sm;
    p.sm_count = sms;
    p
}

const fn geforce(mut p: SimPreset) -> SimPreset {
    p.topology = Topology::PcieNoP2p;
    p
}

/// A name kept from before: `of`'s card, simulating its `nvidia-smi` total as it always did.
const fn kept(id: &'static str, name: &'static str, of: SimPreset) -> SimPreset {
    let (new_id, smi_bytes) = (of.id, of.smi_bytes);
    let mut p = of;
    p.id = id;
    p.name = name;
    p.total_bytes = smi_bytes;
    p.superseded_by = Some(new_id);
    p
}

const T4: SimPreset = measured(
    sms(card("t4", "NVIDIA Tesla T4 (simulated)", "Turing", 15360, 300), 40, 1024),
    gib_hundredths(1456),
    "vLLM 0.7.2 log `total_gpu_memory=14.56GiB`, public Colab GRPO run log (P3 of the public vLLM logs vramscope is checked against)",
);
const A10: SimPreset = measured(
    sms(card("a10", "NVIDIA A10 (simulated)", "Ampere", 23028, 300), 72, 1536),
    gib_hundredths(2206),
    "PyTorch OOM under vLLM on an A10 24G: `22.06 GiB total capacity`, https://github.com/vllm-project/vllm/issues/928",
);
const A10G: SimPreset = sms(
    card("a10g", "NVIDIA A10G (simulated)", "Ampere", 23028, 300),
    80,
    1536,
);
const RTX3090: SimPreset = measured(
    geforce(sms(card("rtx3090", "NVIDIA GeForce RTX 3090 (simulated)", "Ampere", 24576, 300), 82, 1536)),
    gib_hundredths(2358),
    "vLLM log `total_gpu_memory (23.58GiB)`, https://github.com/vllm-project/vllm/pull/14447 (also issue #10517)",
);
const RTX4090: SimPreset = measured(
    geforce(sms(card("rtx4090", "NVIDIA GeForce RTX 4090 (simulated)", "Ada", 24564, 300), 128, 1536)),
    gib_hundredths(2368),
    "PyTorch OOM on an RTX 4090: `23.68 GiB total capacity`, https://github.com/zai-org/CogVideo/issues/36",
);
const RTX5090: SimPreset = geforce(sms(
    card(
        "rtx5090",
        "NVIDIA GeForce RTX 5090 (simulated)",
        "Blackwell",
        32607,
        300,
    ),
    170,
    1536,
));
const L4: SimPreset = sms(
    card("l4", "NVIDIA L4 (simulated)", "Ada", 23034, 300),
    58,
    1536,
);
const L40S: SimPreset = measured(
    sms(card("l40s", "NVIDIA L40S (simulated)", "Ada", 46068, 300), 142, 1536),
    gib_hundredths(4442),
    "vLLM 0.7.1 log `total_gpu_memory` 44.42 GiB on 2× L40S, https://github.com/vllm-project/vllm/issues/15815",
);
const A100_PCIE_40GB: SimPreset = sms(
    card(
        "a100-pcie-40gb",
        "NVIDIA A100-PCIE-40GB (simulated)",
        "Ampere",
        40960,
        420,
    ),
    108,
    2048,
);
const A100_SXM4_40GB: SimPreset = nvlink(sms(
    card(
        "a100-sxm4-40gb",
        "NVIDIA A100-SXM4-40GB (simulated)",
        "Ampere",
        40960,
        420,
    ),
    108,
    2048,
));
const A100_PCIE_80GB: SimPreset = sms(
    card(
        "a100-pcie-80gb",
        "NVIDIA A100 80GB PCIe (simulated)",
        "Ampere",
        81920,
        420,
    ),
    108,
    2048,
);
const A100_SXM4_80GB: SimPreset = measured(
    nvlink(sms(card("a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB (simulated)", "Ampere", 81920, 420), 108, 2048)),
    gib_hundredths(7935),
    "PyTorch OOM under vLLM on 8× A100 80GB (form factor not stated): `total capacity of 79.35 GiB`, https://github.com/MoonshotAI/Kimi-VL/issues/54",
);
const H100_PCIE: SimPreset = sms(
    card(
        "h100-pcie",
        "NVIDIA H100 PCIe (simulated)",
        "Hopper",
        81559,
        512,
    ),
    114,
    2048,
);
const H100_SXM: SimPreset = measured(
    nvlink(sms(card("h100-sxm", "NVIDIA H100 80GB HBM3 (simulated, vLLM's total)", "Hopper", 81559, 512), 132, 2048)),
    gib_hundredths(7922),
    "vLLM log `total_gpu_memory 79.22GiB`, https://github.com/vllm-project/vllm/pull/10511 (sanity-check comment)",
);
const H200: SimPreset = measured(
    nvlink(sms(
        card(
            "h200",
            "NVIDIA H200 (simulated, vLLM's total)",
            "Hopper",
            143771,
            527,
        ),
        132,
        2048,
    )),
    150_109_880_320,
    "cuMemGetInfo on this project's H200, driver 580 (docs/gpu-runs.md)",
);
const GH200: SimPreset = sms(
    card(
        "gh200",
        "NVIDIA GH200 96GB (simulated)",
        "Hopper",
        97871,
        512,
    ),
    132,
    2048,
);
const B200: SimPreset = nvlink(sms(
    card("b200", "NVIDIA B200 (simulated)", "Blackwell", 183359, 527),
    148,
    2048,
));

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
        topology: Topology::PcieNoP2p,
        arch: "mock",
        resident_threads: 0,
        sm_count: 0,
        smi_bytes: 10 << 30,
        mem_get_info_bytes: 10 << 30,
        total_measured: true,
        total_source: "vLLM 380e1863 tests/worker/test_profile.py `mock_mem_info` (10 GiB)",
        superseded_by: None,
    },
    kept("h100-80gb", "NVIDIA H100 80GB HBM3 (simulated)", H100_SXM),
    kept("h200-141gb", "NVIDIA H200 (simulated)", H200),
    kept(
        "a100-80gb",
        "NVIDIA A100-SXM4-80GB (simulated)",
        A100_SXM4_80GB,
    ),
    kept(
        "a100-40gb",
        "NVIDIA A100-SXM4-40GB (simulated)",
        A100_SXM4_40GB,
    ),
    kept("l4-24gb", "NVIDIA L4 (simulated)", L4),
    kept(
        "rtx4090-24gb",
        "NVIDIA GeForce RTX 4090 (simulated)",
        RTX4090,
    ),
    T4,
    A10,
    A10G,
    L4,
    L40S,
    RTX3090,
    RTX4090,
    RTX5090,
    A100_PCIE_40GB,
    A100_SXM4_40GB,
    A100_PCIE_80GB,
    A100_SXM4_80GB,
    H100_PCIE,
    H100_SXM,
    H200,
    GH200,
    B200,
];

pub fn find(id: &str) -> Option<&'static SimPreset> {
    SIM_PRESETS.iter().find(|p| p.id.eq_ignore_ascii_case(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_kept_from_before_simulate_the_totals_they_always_had() {
        // The numbers these presets had before cudaMemGetInfo totals were added (MiB).
        for (id, mib, context_mib) in [
            ("h100-80gb", 81559, 512),
            ("h200-141gb", 143771, 527),
            ("a100-80gb", 81920, 420),
            ("a100-40gb", 40960, 420),
            ("l4-24gb", 23034, 300),
            ("rtx4090-24gb", 24564, 300),
        ] {
            let p = find(id).unwrap();
            assert_eq!(p.total_bytes, mib * MIB, "{id}");
            assert_eq!(p.context_bytes, context_mib * MIB, "{id}");
            let new = find(p.superseded_by.unwrap()).unwrap();
            assert_eq!(p.mem_get_info_bytes, new.total_bytes, "{id}");
            assert!(new.total_bytes < p.total_bytes, "{id}");
        }
    }

    #[test]
    fn estimated_reserve_is_the_median_of_the_measured_gaps() {
        let mut gaps: Vec<f64> = SIM_PRESETS
            .iter()
            .filter(|p| p.total_measured && p.superseded_by.is_none() && p.arch != "mock")
            .map(|p| (p.smi_bytes - p.mem_get_info_bytes) as f64 / MIB as f64)
            .collect();
        gaps.sort_by(f64::total_cmp);
        assert_eq!(gaps.len(), 8);
        let median = (gaps[3] + gaps[4]) / 2.0;
        assert_eq!(median.round() as u64, ESTIMATED_DRIVER_RESERVE_MIB);
    }

    #[test]
    fn every_preset_states_its_total_and_source() {
        for p in SIM_PRESETS {
            assert!(p.mem_get_info_bytes <= p.smi_bytes, "{}", p.id);
            assert!(!p.total_source.is_empty(), "{}", p.id);
            assert!(
                p.total_measured || p.total_source.starts_with("estimated"),
                "{}",
                p.id
            );
            let hopper_or_later = p.arch == "Hopper" || p.arch == "Blackwell";
            assert_eq!(
                p.cublas_workspace_bytes == 32 * MIB,
                hopper_or_later,
                "{}",
                p.id
            );
        }
    }

    #[test]
    fn the_h200_simulates_the_total_measured_here() {
        assert_eq!(find("h200").unwrap().total_bytes, 150_109_880_320);
        assert_eq!(find("h200-141gb").unwrap().total_bytes, 150_754_820_096);
    }
}

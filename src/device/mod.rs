//! Where bytes live and math runs: a simulated GPU (compute or dry) or a CUDA GPU. Both report
//! free/total as the driver does and hand raw segments to the framework allocator; memory
//! outside the framework (context, library workspaces, scenario allocations) is taken here
//! directly.
//!
//! May import: `memory` (the segments it hands out), `base`.

pub mod cpu;
pub mod cpu_attention;
pub mod cpu_gemma;
pub mod cpu_gpt_oss;
pub mod cpu_kimi_vl;
pub mod cpu_llama4_vision;
pub mod cpu_llava;
pub mod cpu_opt;
pub mod cpu_pixtral;
pub mod cpu_qwen2_5_vl;
pub mod cpu_sampler;
pub mod cpu_siglip;
pub(crate) mod cpu_vec;
pub mod cuda;
pub mod group;
pub mod nccl_model;
pub mod presets;
pub mod sim;
pub mod synth;
pub mod tensor;

use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};
use crate::memory::{SegmentHandle, SegmentSource};
pub use presets::{SimPreset, SIM_PRESETS};
pub use sim::SimDevice;

/// Which device a run uses, as written on the command line: `sim:h100-80gb[:dry|:compute]`,
/// `cuda:0`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DeviceSpec {
    Sim {
        preset: String,
        dry: bool,
        /// The total the simulated device reports instead of the preset's (`--total`: what
        /// `torch.cuda.mem_get_info()` says on the user's own GPU).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<u64>,
        /// How the simulated GPUs of a tensor-parallel instance reach each other instead of
        /// the preset's default (`--topology`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topology: Option<nccl_model::Topology>,
    },
    Cuda {
        ordinal: usize,
    },
}

impl DeviceSpec {
    pub fn parse(s: &str) -> Result<Self> {
        let parts: Vec<&str> = s.split(':').collect();
        let bad = |why: &str| Error::Request(format!("device '{s}': {why}"));
        match parts.as_slice() {
            ["sim", preset] | ["sim", preset, _] => {
                if presets::find(preset).is_none() {
                    let ids: Vec<_> = SIM_PRESETS.iter().map(|p| p.id).collect();
                    return Err(bad(&format!(
                        "unknown preset, expected one of {}",
                        ids.join(", ")
                    )));
                }
                let dry = match parts.get(2) {
                    None | Some(&"compute") => false,
                    Some(&"dry") => true,
                    Some(_) => return Err(bad("mode must be 'dry' or 'compute'")),
                };
                Ok(DeviceSpec::Sim {
                    preset: preset.to_ascii_lowercase(),
                    dry,
                    total: None,
                    topology: None,
                })
            }
            ["cuda"] => Ok(DeviceSpec::Cuda { ordinal: 0 }),
            ["cuda", n] => n
                .parse()
                .map(|ordinal| DeviceSpec::Cuda { ordinal })
                .map_err(|_| bad("expected cuda:N with N a GPU index")),
            _ => Err(bad("expected sim:PRESET[:dry|:compute] or cuda:N")),
        }
    }

    pub fn is_sim(&self) -> bool {
        matches!(self, DeviceSpec::Sim { .. })
    }

    /// A simulated device that allocates without computing (`sim:PRESET:dry`).
    pub fn is_dry(&self) -> bool {
        matches!(self, DeviceSpec::Sim { dry: true, .. })
    }

    /// The spec with the simulated device's total set (`--total`); a CUDA device reports its
    /// own, so asking for one there is an error naming the flag.
    pub fn with_total(mut self, bytes: Option<u64>) -> Result<Self> {
        let Some(bytes) = bytes else {
            return Ok(self);
        };
        match &mut self {
            DeviceSpec::Sim { total, .. } => {
                crate::base::limits::count(
                    "--total",
                    bytes,
                    MIN_TOTAL_BYTES,
                    crate::base::limits::MAX_BYTES,
                )?;
                *total = Some(bytes);
                Ok(self)
            }
            DeviceSpec::Cuda { .. } => Err(Error::Request(format!(
                "--total: {self} reports its own total; --total is for a simulated device"
            ))),
        }
    }

    /// The spec with the simulated GPUs' topology set (`--topology`); GPUs run NCCL for real,
    /// so asking for one there is an error naming the flag.
    pub fn with_topology(mut self, t: Option<nccl_model::Topology>) -> Result<Self> {
        let Some(t) = t else {
            return Ok(self);
        };
        match &mut self {
            DeviceSpec::Sim { topology, .. } => {
                *topology = Some(t);
                Ok(self)
            }
            DeviceSpec::Cuda { .. } => Err(Error::Request(format!(
                "--topology: {self} runs NCCL over its own links and NVML measures what it \
                 takes; --topology is for a simulated device"
            ))),
        }
    }

    /// The total a simulated spec was given (`--total`), if any.
    pub fn total_override(&self) -> Option<u64> {
        match self {
            DeviceSpec::Sim { total, .. } => *total,
            DeviceSpec::Cuda { .. } => None,
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Sim {
                preset, dry: true, ..
            } => write!(f, "sim:{preset}:dry"),
            DeviceSpec::Sim {
                preset, dry: false, ..
            } => write!(f, "sim:{preset}"),
            DeviceSpec::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// How ops run on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Shapes and allocations only.
    Dry,
    /// Real math on the host CPU (simulated device, compute mode).
    Cpu,
    Cuda,
}

/// What a report says about the device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub spec: String,
    pub name: String,
    pub total_bytes: u64,
    pub simulated: bool,
    /// "compute", "dry" or "cuda".
    pub mode: String,
    /// Where the ground truth comes from ("simulated bookkeeping", "NVML per-process").
    pub truth_source: String,
    /// What `total_bytes` is and where it comes from (a preset's source, `--total`, or the
    /// driver); empty in sessions written before it existed.
    #[serde(default)]
    pub total_source: String,
}

/// The smallest total `--total` takes (anything smaller cannot hold a CUDA context and a model).
pub const MIN_TOTAL_BYTES: u64 = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

/// A library workspace that PyTorch takes from its caching allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibraryWorkspace {
    Cublas,
    CublasLt,
}

impl LibraryWorkspace {
    pub fn label(self) -> &'static str {
        match self {
            LibraryWorkspace::Cublas => "cublas-workspace",
            LibraryWorkspace::CublasLt => "cublaslt-workspace",
        }
    }
}

/// Bytes of each library workspace on a device (0: not taken from the allocator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceBytes {
    pub cublas: u64,
    pub cublaslt: u64,
}

/// bitsandbytes' igemmlt tile layout of the int8 weight copy (CxB): rows padded to `row_pad`
/// (8 for `col_turing` on Turing and Hopper, 32 for `col_ampere`), columns to `col_pad` (32).
/// A device fact, so it lives here; quant/ builds CxB with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileLayout {
    pub row_pad: usize,
    pub col_pad: usize,
}

impl TileLayout {
    /// The padded `[rows, cols]` of a weight in this layout.
    pub fn padded(self, rows: usize, cols: usize) -> (usize, usize) {
        (
            rows.div_ceil(self.row_pad) * self.row_pad,
            cols.div_ceil(self.col_pad) * self.col_pad,
        )
    }
}

/// One reading of the GPU's memory by the NVML sampler thread, on the events' clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSample {
    /// Microseconds since the run started (the same clock as `Event::time_us`).
    pub time_us: u64,
    /// Device-wide used memory (all processes).
    pub device_used: u64,
    /// This process's device memory.
    pub process_used: u64,
}

/// A device memory allocation made outside the framework allocator.
#[derive(Debug, PartialEq, Eq)]
pub struct OutsideAlloc {
    pub(crate) id: u64,
    pub bytes: u64,
}

pub enum Device {
    Sim(SimDevice),
    Cuda(Box<cuda::CudaDevice>),
}

impl Device {
    /// Opens the device; for CUDA this creates the context (checkpoint t0 comes after).
    pub fn open(spec: &DeviceSpec) -> Result<Self> {
        match spec {
            DeviceSpec::Sim {
                preset,
                dry,
                total,
                topology,
            } => {
                let p = presets::find(preset).ok_or_else(|| Error::Device {
                    spec: spec.to_string(),
                    problem: "unknown simulated preset".into(),
                })?;
                let mut sim = SimDevice::new(p, !dry);
                if let Some(t) = total {
                    sim.set_total(*t);
                }
                if let Some(t) = topology {
                    sim.topology = *t;
                }
                Ok(Device::Sim(sim))
            }
            DeviceSpec::Cuda { ordinal } => {
                Ok(Device::Cuda(Box::new(cuda::CudaDevice::open(*ordinal)?)))
            }
        }
    }

    pub fn info(&self) -> DeviceInfo {
        match self {
            Device::Sim(s) => DeviceInfo {
                spec: format!("sim:{}{}", s.preset.id, if s.compute { "" } else { ":dry" }),
                name: s.preset.name.to_string(),
                total_bytes: s.total(),
                simulated: true,
                mode: if s.compute { "compute" } else { "dry" }.into(),
                truth_source: "simulated bookkeeping (exact)".into(),
                total_source: if s.total() == s.preset.total_bytes {
                    format!(
                        "{}: {}",
                        s.preset.simulated_total_label(),
                        if s.preset.superseded_by.is_some() {
                            "nvidia-smi"
                        } else {
                            s.preset.total_source
                        }
                    )
                } else {
                    "--total (given by the user)".into()
                },
            },
            Device::Cuda(c) => c.info(),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Device::Sim(s) if s.compute => Backend::Cpu,
            Device::Sim(_) => Backend::Dry,
            Device::Cuda(_) => Backend::Cuda,
        }
    }

    pub fn mem_info(&self) -> MemInfo {
        match self {
            Device::Sim(s) => MemInfo {
                free: s.free(),
                total: s.total(),
            },
            Device::Cuda(c) => c.mem_info(),
        }
    }

    /// This process's device memory now.
    pub fn process_used(&self) -> u64 {
        match self {
            Device::Sim(s) => s.process_used(),
            Device::Cuda(c) => c.process_used(),
        }
    }

    /// Starts measuring this process's peak footprint (ground truth) from now.
    pub fn reset_process_peak(&mut self) {
        match self {
            Device::Sim(s) => s.reset_process_peak(),
            Device::Cuda(c) => c.reset_process_peak(),
        }
    }

    /// This process's peak footprint since the last reset.
    pub fn process_peak(&mut self) -> u64 {
        match self {
            Device::Sim(s) => s.process_peak(),
            Device::Cuda(c) => c.process_peak(),
        }
    }

    /// bitsandbytes' CxB tile layout on this device.
    pub fn int8_tile_layout(&self) -> TileLayout {
        let row_pad = match self {
            Device::Sim(s) => s.preset.cxb_row_pad,
            Device::Cuda(c) => c.cxb_row_pad(),
        };
        TileLayout {
            row_pad,
            col_pad: 32,
        }
    }

    /// Simulated CUDA context creation (a real device made its context in `open`).
    /// Bytes a simulated context takes; `None` on a real GPU, whose context exists already.
    pub fn simulated_context_bytes(&self) -> Option<u64> {
        match self {
            Device::Sim(s) => Some(s.preset.context_bytes),
            Device::Cuda(_) => None,
        }
    }

    /// The library workspaces PyTorch takes from its caching allocator on this device.
    pub fn library_workspace_bytes(&self) -> WorkspaceBytes {
        match self {
            Device::Sim(s) => WorkspaceBytes {
                cublas: s.preset.cublas_workspace_bytes,
                cublaslt: s.preset.cublaslt_workspace_bytes,
            },
            Device::Cuda(c) => c.library_workspace_bytes(),
        }
    }

    /// Whether free memory reads as total − framework allocated (the `mock-10gib` preset,
    /// vLLM's tests/worker/test_profile.py patch of `torch.cuda.mem_get_info`).
    pub fn free_tracks_allocated(&self) -> bool {
        matches!(self, Device::Sim(s) if s.preset.free_is_total_minus_allocated)
    }

    pub fn alloc_outside(&mut self, bytes: u64) -> Result<OutsideAlloc> {
        match self {
            Device::Sim(s) => {
                let free = s.free();
                let taken = s.take(bytes).ok_or_else(|| Error::OutOfMemory {
                    device: s.preset.id.to_string(),
                    during: "allocating outside the framework".into(),
                    detail: format!("{bytes} bytes wanted, {free} free"),
                    state: None,
                })?;
                Ok(OutsideAlloc {
                    id: 0,
                    bytes: taken,
                })
            }
            Device::Cuda(c) => c.alloc_outside(bytes),
        }
    }

    pub fn free_outside(&mut self, alloc: OutsideAlloc) {
        match self {
            Device::Sim(s) => s.give_back(alloc.bytes),
            Device::Cuda(c) => c.free_outside(alloc),
        }
    }

    /// Memory held by another process before the instance starts (vLLM issue #10451).
    pub fn hold_foreign(&mut self, bytes: u64) -> Result<u64> {
        match self {
            Device::Sim(s) => {
                let free = s.free();
                s.hold_foreign(bytes).ok_or_else(|| Error::OutOfMemory {
                    device: s.preset.id.to_string(),
                    during: "holding memory for another process (--outside-before)".into(),
                    detail: format!("{bytes} bytes wanted, {free} free"),
                    state: None,
                })
            }
            Device::Cuda(c) => c.hold_foreign(bytes),
        }
    }

    pub fn synchronize(&mut self) -> Result<()> {
        match self {
            Device::Sim(_) => Ok(()),
            Device::Cuda(c) => c.synchronize(),
        }
    }

    /// A pipeline, data-parallel or expert-parallel group's communicator on this simulated
    /// rank (`nccl_model::NcclModel::group_communicator`); `across`: the network between its
    /// hosts when its ranks span several. `None` on a GPU.
    pub fn group_comm_bytes(
        &self,
        rules: nccl_model::NcclRules,
        first_in_process: bool,
        across: Option<nccl_model::Network>,
    ) -> Option<u64> {
        match self {
            Device::Sim(s) => {
                let net = across.map(|n| nccl_model::NetModel::new(n, rules));
                Some(
                    s.nccl_model(rules)
                        .group_communicator(first_in_process, net.as_ref()),
                )
            }
            Device::Cuda(_) => None,
        }
    }

    /// Sets up what a collective library needs the first time `setup` is asked for on this
    /// rank: the simulated device takes what its topology's [`nccl_model::NcclModel`] says (kept for the
    /// instance's life, returned); a GPU makes the NCCL communicator (the runtime measures).
    pub fn comm_setup(
        &mut self,
        setup: group::CommSetup,
        tp: &group::TpRank,
    ) -> Result<Option<OutsideAlloc>> {
        match self {
            Device::Sim(s) => {
                let bytes = s.nccl_model(tp.nccl).bytes(setup, tp.rank, tp.size);
                Ok(Some(self.alloc_outside(bytes)?))
            }
            Device::Cuda(c) => {
                c.comm_setup(setup, tp)?;
                Ok(None)
            }
        }
    }

    /// Streaming multiprocessors of a simulated GPU (its preset's); `None` on a CUDA GPU.
    /// Whether the GPU is a Hopper (compute capability 9.x): FlashAttention 3's.
    /// The compute capability's major version: the GPU's, or a simulated preset's
    /// architecture's (Ampere and Ada 8, Hopper 9, Blackwell 10, older 7).
    pub fn compute_major(&self) -> u32 {
        match self {
            Device::Sim(s) => match s.preset.arch {
                "Hopper" => 9,
                "Blackwell" => 10,
                "Ampere" | "Ada" => 8,
                _ => 7,
            },
            Device::Cuda(c) => c.compute_capability().0 as u32,
        }
    }

    pub fn is_hopper(&self) -> bool {
        match self {
            Device::Sim(s) => s.preset.arch == "Hopper",
            Device::Cuda(c) => c.compute_capability().0 == 9,
        }
    }

    pub fn sm_count(&self) -> Option<u64> {
        match self {
            Device::Sim(s) => Some(s.preset.sm_count).filter(|&n| n > 0),
            Device::Cuda(c) => Some(c.sm_count()),
        }
    }

    /// Where a tensor-parallel rank's NCCL entries come from on this device.
    pub fn nccl_source(&self, rules: nccl_model::NcclRules) -> String {
        match self {
            Device::Sim(s) => format!(
                "simulated (--topology {}): {}",
                s.topology.name(),
                s.nccl_model(rules).source
            ),
            Device::Cuda(_) => {
                "measured: NVML's per-process memory across each first use of NCCL".into()
            }
        }
    }

    /// Whether the devices of a tensor-parallel instance would run vLLM's custom all-reduce
    /// (NVLink, or peer to peer for two GPUs; custom_all_reduce.py L50-98).
    pub fn custom_all_reduce_for(&self, size: usize) -> bool {
        match self {
            Device::Sim(s) => s.topology.custom_all_reduce(size),
            Device::Cuda(c) => matches!(size, 2 | 4 | 6 | 8) && c.peers_reachable(size),
        }
    }

    pub fn cuda(&mut self) -> Option<&mut cuda::CudaDevice> {
        match self {
            Device::Cuda(c) => Some(c),
            Device::Sim(_) => None,
        }
    }
}

impl SegmentSource for Device {
    fn map_segment(&mut self, bytes: u64) -> Option<SegmentHandle> {
        match self {
            Device::Sim(s) => s.map_segment(bytes),
            Device::Cuda(c) => c.map_segment(bytes),
        }
    }

    fn unmap_segment(&mut self, handle: SegmentHandle) {
        match self {
            Device::Sim(s) => s.unmap_segment(handle),
            Device::Cuda(c) => c.unmap_segment(handle),
        }
    }
}

/// One line per device a user can pick: detected CUDA GPUs, then the simulated presets.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceListing {
    pub spec: String,
    pub name: String,
    /// The total the device reports (a preset: the total it simulates).
    pub total_bytes: u64,
    pub simulated: bool,
    /// A preset's two totals and the source of the cudaMemGetInfo one; `None` for a real GPU.
    #[serde(skip)]
    pub preset: Option<&'static SimPreset>,
}

/// Lists the CUDA GPUs that can be opened (with the reason when none can) and the presets.
pub fn list_devices() -> (Vec<DeviceListing>, Option<String>) {
    let (mut out, why) = match cuda::detect() {
        Ok(gpus) => (gpus, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    out.extend(SIM_PRESETS.iter().map(|p| DeviceListing {
        spec: format!("sim:{}", p.id),
        name: p.name.to_string(),
        total_bytes: p.total_bytes,
        simulated: true,
        preset: Some(p),
    }));
    (out, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs_parse_and_print_back() {
        for s in ["sim:h100-80gb", "sim:a100-40gb:dry", "cuda:1"] {
            assert_eq!(DeviceSpec::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(
            DeviceSpec::parse("cuda").unwrap(),
            DeviceSpec::Cuda { ordinal: 0 }
        );
        assert!(DeviceSpec::parse("sim:nope").is_err());
        assert!(DeviceSpec::parse("sim:h100-80gb:fast").is_err());
        assert!(DeviceSpec::parse("tpu:0").is_err());
    }
}

//! What NCCL takes on a simulated GPU, by how the GPUs reach each other. A CUDA GPU runs NCCL
//! for real and NVML measures it (`device::cuda::collectives`); a simulated device charges what
//! this model says, the first time each [`CommSetup`] is asked for on a rank.
//!
//! The model follows NCCL's own buffer rules (docs/tensor-parallel.md cites them): every
//! collective channel connects a rank to its ring and tree peers, and each connection holds one
//! buffer per protocol it may use, allocated through `cuMem` in 2 MiB granules; a communicator
//! adds its own state, and a process's first communicator the state NCCL makes once per
//! process. Point-to-point operations (`torch.distributed.gather`) open connections of their
//! own. Over NVLink the numbers are the ones measured on two H200s; over PCIe they are derived
//! from the same rules with PCIe's channel count and protocols, and the assumptions are stated
//! in [`NcclModel::source`].

use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};

const MIB: u64 = 1 << 20;

/// What a collective library sets up by itself, outside the framework allocator, the first
/// time each is needed on a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommSetup {
    /// vLLM's `PyNcclCommunicator` when the worker starts (pynccl.py L85-102):
    /// `ncclCommInitRank` and a one-element all-reduce as warm-up, which connects the rings.
    PyncclInit,
    /// torch.distributed's NCCL communicator of the device group: ProcessGroupNCCL makes it at
    /// the group's first collective, the profile pass's first all-reduce (vLLM runs eager
    /// all-reduces through `torch.distributed.all_reduce`, parallel_state.py L365-376).
    DeviceGroup,
    /// The point-to-point connections `torch.distributed.gather` opens for the logits
    /// (parallel_state.py `gather`, to rank 0).
    GatherP2p,
}

impl CommSetup {
    pub fn label(self) -> &'static str {
        match self {
            CommSetup::PyncclInit => "nccl: pynccl communicator + warm-up all_reduce",
            CommSetup::DeviceGroup => "nccl: device-group communicator (first all_reduce)",
            CommSetup::GatherP2p => "nccl: point-to-point connections (logits gather)",
        }
    }
}

/// How the GPUs of a tensor-parallel instance reach each other: what NCCL's topology search
/// finds, and what vLLM's custom all-reduce checks (custom_all_reduce.py L50-98).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// NVLink or NVSwitch between every pair (SXM boards, NVLink bridges).
    Nvlink,
    /// PCIe with peer-to-peer access (data-center PCIe cards under one PCIe switch or root).
    Pcie,
    /// PCIe without peer-to-peer access (GeForce cards, GPUs across CPU sockets): NCCL moves
    /// data through shared host memory and vLLM turns its custom all-reduce off.
    PcieNoP2p,
}

impl Topology {
    pub const ALL: [Topology; 3] = [Topology::Nvlink, Topology::Pcie, Topology::PcieNoP2p];

    pub fn name(self) -> &'static str {
        match self {
            Topology::Nvlink => "nvlink",
            Topology::Pcie => "pcie",
            Topology::PcieNoP2p => "pcie-no-p2p",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Topology::Nvlink => "NVLink/NVSwitch",
            Topology::Pcie => "PCIe with peer-to-peer",
            Topology::PcieNoP2p => "PCIe without peer-to-peer (through host memory)",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                Error::Request(format!(
                    "--topology '{s}': expected {}",
                    Self::ALL.map(Topology::name).join(", ")
                ))
            })
    }

    /// Whether vLLM's custom all-reduce runs on `size` GPUs so connected
    /// (custom_all_reduce.py L50-98: world size 2, 4, 6 or 8; more than two GPUs need NVLink
    /// between all of them; every pair must pass the peer-to-peer access check).
    pub fn custom_all_reduce(self, size: usize) -> bool {
        if !matches!(size, 2 | 4 | 6 | 8) {
            return false;
        }
        match self {
            Topology::Nvlink => true,
            Topology::Pcie => size == 2,
            Topology::PcieNoP2p => false,
        }
    }
}

/// How the hosts of a multi-node instance reach each other (`--network`): what NCCL's network
/// transport (`src/transport/net.cc`) does with a connection's buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Network {
    /// InfiniBand through the IB verbs plugin, the NIC reading and writing GPU memory
    /// (GPUDirect RDMA: `ncclTopoCheckGdr` on, as on DGX/HGX hosts with a NIC per GPU).
    #[default]
    Ib,
    /// RoCE: the same IB verbs plugin and GPUDirect RDMA as InfiniBand.
    Roce,
    /// TCP sockets (`NCCL_NET=Socket`): no GPUDirect, every buffer in host memory.
    Tcp,
}

impl Network {
    pub const ALL: [Network; 3] = [Network::Ib, Network::Roce, Network::Tcp];

    pub fn name(self) -> &'static str {
        match self {
            Network::Ib => "ib",
            Network::Roce => "roce",
            Network::Tcp => "tcp",
        }
    }

    pub fn is_default(&self) -> bool {
        *self == Network::Ib
    }

    pub fn parse(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                Error::Request(format!(
                    "--network '{s}': expected {}",
                    Self::ALL.map(Network::name).join(", ")
                ))
            })
    }

    /// Whether the NIC reads and writes the GPU's buffers (GPUDirect RDMA).
    pub fn gdr(self) -> bool {
        self != Network::Tcp
    }
}

/// NCCL's memory on one rank of a communicator whose peers are on another host, through the
/// network transport (NVIDIA/nccl `src/transport/net.cc`, the same in v2.21.5-1 and v2.28.3-1):
/// - a ring or tree connection (never shared: `sendSetup`/`recvSetup`, `shared = graph ||
///   connIndex == 0 ? 0 : …`) maps its protocol buffers with `NCCL_NET_MAP_ADD_POINTER`: the
///   receiver all three (LL 512 KiB, LL128 4.69 MiB, Simple 4 MiB) on the device under
///   GPUDirect (`recvProxyConnect`), the sender LL128 and Simple on the device and LL in host
///   memory (`sendProxyConnect`: `p != NCCL_PROTO_LL && useGdr`); each rounded to 2 MiB
///   (`ALIGN_SIZE(…, CUDA_IPC_MIN)` with cuMem, cudaMalloc's 2 MiB rounding without): 10 MiB
///   received and 10 MiB sent per channel. Without GPUDirect (TCP) every buffer is host memory;
/// - channels: the inter-node ring search finds one channel per NIC at the NIC's speed and
///   `ncclTopoPostset` doubles it (`src/graph/connect.cc`): 2 channels with one NIC per GPU
///   (DGX/HGX H100 and H200), assumed for every GPU here; two ranks' ring and tree share the
///   connections as inside a host;
/// - with runtime connection off (cuMem off), `sharedNetBuffersInit`'s point-to-point pool of
///   p2p channels × 16 × 128 KiB (`NCCL_P2P_NET_CHUNKSIZE`), on the device under GPUDirect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetModel {
    pub network: Network,
    pub channels: u64,
    pub recv_connection_bytes: u64,
    pub send_connection_bytes: u64,
    pub pool_bytes: u64,
}

impl NetModel {
    pub fn new(network: Network, rules: NcclRules) -> Self {
        let channels = 2;
        let gdr = network.gdr();
        let (recv, send) = if gdr { (10 * MIB, 10 * MIB) } else { (0, 0) };
        let pool = match (rules, gdr) {
            (NcclRules::Nccl221CumemOff, true) => channels * 16 * 128 * 1024,
            _ => 0,
        };
        NetModel {
            network,
            channels,
            recv_connection_bytes: recv,
            send_connection_bytes: send,
            pool_bytes: pool,
        }
    }

    /// One communicator's device memory on a rank whose ring peers are across the network.
    pub fn communicator(&self) -> u64 {
        self.channels * (self.recv_connection_bytes + self.send_connection_bytes) + self.pool_bytes
    }

    pub fn source(&self) -> String {
        format!(
            "network transport over {} ({}): {} channels x ({} MiB received + {} MiB sent) + {} MiB pool per communicator across hosts (NCCL src/transport/net.cc; one NIC per GPU assumed)",
            self.network.name(),
            if self.network.gdr() { "GPUDirect RDMA, buffers on the GPU" } else { "no GPUDirect, buffers in host memory" },
            self.channels,
            self.recv_connection_bytes / MIB,
            self.send_connection_bytes / MIB,
            self.pool_bytes / MIB
        )
    }
}

/// Which NCCL, set up how: the rules differ between the releases in what a communicator keeps
/// on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NcclRules {
    /// NCCL 2.28 with cuMem on and runtime connection (its defaults), in a process that is
    /// not PyTorch's: what vramscope itself runs on GPUs, measured on two H200s
    /// (docs/gpu-runs.md runs 32-35). `--vllm 380e1863` keeps it, so its dry NCCL entries
    /// stay equal to the GPU runs'.
    Nccl228Measured,
    /// NCCL 2.21.5 (PyTorch 2.5.1 and 2.6's) with `NCCL_CUMEM_ENABLE=0`, which every V0
    /// release sets before NCCL starts (0.6.3.post1 worker/worker_base.py:438, 0.6.4 :454,
    /// 0.6.5 :445, 0.7.0 vllm/__init__.py:29, 0.8.5 env_override.py:25). 0.6.3's PyTorch 2.4
    /// shipped 2.20.5 and 0.10's 2.7 shipped 2.26: taken as 2.21's rules (assumed).
    Nccl221CumemOff,
}

impl NcclRules {
    pub fn describe(self) -> &'static str {
        match self {
            NcclRules::Nccl228Measured => "NCCL 2.28, cuMem on (vramscope's own, measured)",
            NcclRules::Nccl221CumemOff => {
                "NCCL 2.21.5 with NCCL_CUMEM_ENABLE=0 (as vLLM V0 runs it)"
            }
        }
    }
}

/// NCCL's device memory per rank, outside any allocator: what its rules give for one
/// topology, NCCL and GPU. Source citations are NVIDIA/nccl v2.21.5-1 and v2.28.3-1
/// (docs/tensor-parallel.md lists them):
/// - a connection's receiver holds a 4 KiB header and the LL (512 KiB), LL128 (4.69 MiB,
///   allocated even where LL128 is off) and Simple (4 MiB) buffers, the sender a header, each
///   rounded to 2 MiB (`src/transport/p2p.cc` recv/send setup, `ALIGN_SIZE(…, CUDA_IPC_MIN)`):
///   10 + 2 MiB per channel for two ranks, whose ring and tree share the connections
///   (`src/transport.cc`: one connector per channel, peer and direction). Without
///   peer-to-peer the shared-memory transport keeps them in host memory;
/// - collective channels: 24 on NVSwitch (H100/H200/A100), 4 over PCIe Gen4 x16
///   (`src/graph/search.cc` ring search, doubled in `connect.cc` `ncclTopoPostset`);
///   point-to-point channels per peer 32 on NVSwitch, 2 on PCIe (`src/graph/paths.cc`);
/// - per communicator: with cuMem on, three 2 MiB-granule structures per point-to-point
///   channel and two more (`src/channel.cc`, `init.cc` devCommSetup); with cuMem off, the
///   shared point-to-point pool of channels × 16 × chunk (128 KiB on PCIe, 512 KiB on
///   NVLink; `src/transport/net.cc` sharedNetBuffersInit) and small structures packed by
///   cudaMalloc;
/// - per process, once: NCCL's kernel image for the architecture, loaded when NCCL queries
///   its kernels at init; and the stack the driver reserves for every resident thread at
///   the first launch of a kernel that needs more than 1 KiB (kept, and grown again by the
///   send/recv kernel's larger stack at the first point-to-point operation), in 2 MiB
///   granules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclModel {
    pub topology: Topology,
    pub rules: NcclRules,
    /// Collective channels NCCL builds between the ranks.
    pub channels: u64,
    /// Point-to-point channels per peer (all connected at the first send or receive).
    pub p2p_channels_per_peer: u64,
    /// Device bytes of one connection on its receiving rank.
    pub recv_connection_bytes: u64,
    /// Device bytes of one connection on its sending rank.
    pub send_connection_bytes: u64,
    /// A communicator's device state beside its connections.
    pub communicator_bytes: u64,
    /// NCCL's kernel image and what the process's first NCCL use takes once.
    pub process_bytes: u64,
    /// The stack reservation after the first collective kernel, and after the first
    /// send/recv kernel.
    pub stack_after_collective_bytes: u64,
    pub stack_after_p2p_bytes: u64,
    /// Where the numbers come from, and what is assumed.
    pub source: String,
}

/// The stack a kernel of `stack` bytes per thread makes the driver reserve over the 1 KiB a
/// context starts with, for every resident thread, in 2 MiB granules.
fn stack_reservation(stack: u64, threads: u64) -> u64 {
    (stack.next_multiple_of(16).saturating_sub(1024) * threads).next_multiple_of(2 * MIB)
}

impl NcclModel {
    /// The model for `topology` and `rules` on a GPU of `resident_threads` threads of
    /// architecture `arch` (`SimPreset`).
    pub fn new(topology: Topology, rules: NcclRules, arch: &str, resident_threads: u64) -> Self {
        let hopper_or_later = matches!(arch, "Hopper" | "Blackwell");
        let nvlink = topology == Topology::Nvlink;
        let (channels, p2p_per_peer, p2p_channels) = if nvlink { (24, 32, 32) } else { (4, 2, 4) };
        let device_buffers = topology != Topology::PcieNoP2p;
        let (recv, send) = if device_buffers {
            (10 * MIB, 2 * MIB)
        } else {
            (0, 0)
        };
        // Kernel stacks per thread (cuobjdump -res-usage of each release's libnccl): the
        // first collective (RING_LL) and the send/recv kernel.
        let (stack_coll, stack_p2p, image, communicator) = match rules {
            NcclRules::Nccl228Measured => (
                1744,
                1984,
                // The measured 862 MiB of the first communicator on an H200, less its
                // connections, state and stack: the sm_90 image (101 MiB) and the first
                // use of a process that is not PyTorch's.
                190 * MIB,
                (3 * p2p_channels + 3) * 2 * MIB,
            ),
            NcclRules::Nccl221CumemOff => {
                let chunk = if nvlink { 512 * 1024 } else { 128 * 1024 };
                let (coll, p2p, image) = if hopper_or_later {
                    (1264, 1480, 85 * MIB)
                } else {
                    // The sm_80 image, which Ampere and Ada (sm_86/89) run; Turing assumed
                    // the same.
                    (1312, 1568, 48 * MIB)
                };
                (coll, p2p, image, p2p_channels * 16 * chunk)
            }
        };
        let after_coll = stack_reservation(stack_coll, resident_threads);
        let after_p2p = stack_reservation(stack_p2p, resident_threads).max(after_coll);
        let source = format!(
            "{}, {}: {} channels x {} MiB received + {} MiB sent, {} MiB of state per \
             communicator, {} MiB of kernel image{}, kernel stacks {} / {} B x {} resident \
             threads, {} point-to-point channels per peer; derived from NCCL's buffer rules \
             (docs/tensor-parallel.md){}",
            rules.describe(),
            topology.describe(),
            channels,
            recv / MIB,
            send / MIB,
            communicator / MIB,
            image / MIB,
            if rules == NcclRules::Nccl228Measured {
                " and first use"
            } else {
                ""
            },
            stack_coll,
            stack_p2p,
            resident_threads,
            p2p_per_peer,
            if rules == NcclRules::Nccl228Measured && nvlink {
                "; equal to the two H200s' measurement (docs/gpu-runs.md runs 32-35)"
            } else {
                "; more than two ranks counted as two (a ring connects each rank to two \
                 peers): assumed"
            }
        );
        NcclModel {
            topology,
            rules,
            channels,
            p2p_channels_per_peer: p2p_per_peer,
            recv_connection_bytes: recv,
            send_connection_bytes: send,
            communicator_bytes: communicator,
            process_bytes: image,
            stack_after_collective_bytes: after_coll,
            stack_after_p2p_bytes: after_p2p,
            source,
        }
    }

    /// One communicator's connections and state.
    pub fn communicator(&self) -> u64 {
        self.channels * (self.recv_connection_bytes + self.send_connection_bytes)
            + self.communicator_bytes
    }

    /// The pipeline group's PyNcclCommunicator and its warm-up all-reduce (vLLM makes one per
    /// group of more than one rank: cuda_communicator.py 0.19 L74-80; the custom all-reduce
    /// only for the tensor-parallel group, L44-48). The process's first communicator when there
    /// is no tensor-parallel one before it (parallel_state.py `initialize_model_parallel`
    /// makes the TP group first): then NCCL's once-per-process image and kernel stack too.
    /// Its ring over two stages is the two-rank ring the rules give; more stages are counted
    /// as two (assumed, as for tensor parallel).
    pub fn pipeline_communicator(&self, first_in_process: bool) -> u64 {
        if first_in_process {
            self.bytes(CommSetup::PyncclInit, 0, 2)
        } else {
            self.communicator()
        }
    }

    /// Another group's PyNcclCommunicator (pipeline, data-parallel or expert-parallel group:
    /// vLLM makes one per group of more than one rank, cuda_communicator.py 0.11.0 L55-60), as
    /// [`Self::pipeline_communicator`]; with its ring peers on other hosts (`net`), the network
    /// transport's connections instead of the ones inside a host.
    pub fn group_communicator(&self, first_in_process: bool, net: Option<&NetModel>) -> u64 {
        let Some(net) = net else {
            return self.pipeline_communicator(first_in_process);
        };
        let once = if first_in_process {
            self.process_bytes + self.stack_after_collective_bytes
        } else {
            0
        };
        once + net.communicator()
    }

    /// Bytes `setup` takes on `rank` of `size` ranks.
    pub fn bytes(&self, setup: CommSetup, rank: usize, size: usize) -> u64 {
        let p2p_stack = self.stack_after_p2p_bytes - self.stack_after_collective_bytes;
        match setup {
            CommSetup::PyncclInit => {
                self.process_bytes + self.communicator() + self.stack_after_collective_bytes
            }
            CommSetup::DeviceGroup => self.communicator(),
            CommSetup::GatherP2p if rank == 0 => {
                self.p2p_channels_per_peer
                    * self.recv_connection_bytes
                    * (size.saturating_sub(1)) as u64
                    + p2p_stack
            }
            CommSetup::GatherP2p => {
                self.p2p_channels_per_peer * self.send_connection_bytes + p2p_stack
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules give, for two H200s (132 SMs x 2048 threads) over NVLink with NCCL 2.28,
    /// exactly what NVML measured there (docs/gpu-runs.md runs 34-35).
    #[test]
    fn the_rules_give_the_h200_pairs_measured_entries() {
        let m = NcclModel::new(
            Topology::Nvlink,
            NcclRules::Nccl228Measured,
            "Hopper",
            132 * 2048,
        );
        assert_eq!(m.bytes(CommSetup::PyncclInit, 0, 2), 903_872_512);
        assert_eq!(m.bytes(CommSetup::DeviceGroup, 1, 2), 509_607_936);
        assert_eq!(m.bytes(CommSetup::GatherP2p, 0, 2), 400_556_032);
        assert_eq!(m.bytes(CommSetup::GatherP2p, 1, 2), 132_120_576);
    }

    /// Two L40S (142 SMs x 1536) over PCIe, NCCL 2.21.5 with cuMem off, as vLLM 0.7.1 ran:
    /// 4 channels x 12 MiB + the 8 MiB pool per communicator, the sm_80 image, stacks of
    /// 1312 and 1568 B (60 and 114 MiB reserved).
    #[test]
    fn a_pcie_pair_of_l40s_under_vllm_0_7() {
        let m = NcclModel::new(
            Topology::Pcie,
            NcclRules::Nccl221CumemOff,
            "Ada",
            142 * 1536,
        );
        assert_eq!(m.communicator(), 56 * MIB);
        assert_eq!(m.bytes(CommSetup::PyncclInit, 0, 2), (48 + 56 + 60) * MIB);
        assert_eq!(m.bytes(CommSetup::GatherP2p, 0, 2), (20 + 54) * MIB);
        assert_eq!(m.bytes(CommSetup::GatherP2p, 1, 2), (4 + 54) * MIB);
        let shm = NcclModel::new(
            Topology::PcieNoP2p,
            NcclRules::Nccl221CumemOff,
            "Ada",
            142 * 1536,
        );
        assert_eq!(shm.communicator(), 8 * MIB);
        assert_eq!(shm.bytes(CommSetup::GatherP2p, 0, 2), 54 * MIB);
    }

    #[test]
    fn topologies_parse_by_name_and_say_what_they_take() {
        for t in Topology::ALL {
            assert_eq!(Topology::parse(t.name()).unwrap(), t);
        }
        let e = Topology::parse("infiniband").unwrap_err().to_string();
        assert!(e.contains("nvlink, pcie, pcie-no-p2p"), "{e}");
        assert!(Topology::Nvlink.custom_all_reduce(8));
        assert!(Topology::Pcie.custom_all_reduce(2));
        assert!(!Topology::Pcie.custom_all_reduce(4));
        assert!(!Topology::PcieNoP2p.custom_all_reduce(2));
        assert!(!Topology::Nvlink.custom_all_reduce(3));
    }
}

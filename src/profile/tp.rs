//! Tensor parallel: vLLM's `--tensor-parallel-size N` as vramscope runs it. One worker per
//! GPU, each profiling its own GPU (worker.py `determine_num_available_blocks` on every rank),
//! the engine taking the fewest KV blocks over them (distributed_gpu_executor.py L28-47).
//! Every rank is a thread with its own runtime and device; rank 0 runs on the caller's thread
//! (it feeds the progress sink, as vLLM's driver worker is the one that logs).
//!
//! Pipeline parallel (`--pp`) runs here too: `tp × pp` ranks, rank `stage × tp + tp_rank` as
//! vLLM numbers them (parallel_state.py `initialize_model_parallel`), each stage's ranks one
//! tensor-parallel group with the stage's layers (`model::layers::pp`), and every rank in one
//! world group where the engine takes the fewest KV blocks (`get_kv_cache_configs`,
//! v1/core/kv_cache_utils.py 0.19 L1599-1612).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::formulas::FormulaId;
use super::procedure::{run_rank, GroupComm, RankSpec};
use super::report::{EngineBudget, Report};
use super::request::ProfileRequest;
use crate::base::error::{Error, Result};
use crate::device::group::RankGroup;
use crate::device::DeviceSpec;
use crate::engine::progress::ProgressSink;
use crate::model::{self, ModelSource};

/// What the preflight learnt of the model: the pipeline partition, and whether it has
/// routed experts.
struct Preflight {
    partition: Option<Vec<usize>>,
    moe: bool,
}

/// Checks what can be checked before any rank starts: enough GPUs, a model that divides.
fn preflight(req: &ProfileRequest) -> Result<Preflight> {
    let partition = preflight_partition(req)?;
    let moe = match &req.model {
        ModelSource::Synthetic { .. } => false,
        m => model::open(m, req.seed)?.config.moe.is_some(),
    };
    // A dense model: vLLM makes no expert-parallel group (0.19.0 parallel_state.py
    // L1661-1662) and `--enable-expert-parallel` changes nothing.
    if (req.enable_expert_parallel || req.dp > 1) && moe {
        let opened = model::open(&req.model, req.seed)?;
        let c = &opened.config;
        let moe_group = req.dp as usize * req.tp as usize;
        for r in 0..moe_group {
            let mut shard =
                crate::model::layers::tp::TpShard::new(r % req.tp as usize, req.tp as usize);
            shard.moe = crate::model::layers::tp::MoeSplit {
                rank: r,
                size: moe_group,
                ep: req.enable_expert_parallel && moe_group > 1,
            };
            shard.check(c)?;
        }
    }
    Ok(Preflight { partition, moe })
}

fn preflight_partition(req: &ProfileRequest) -> Result<Option<Vec<usize>>> {
    let n = req.tp as usize;
    if let DeviceSpec::Cuda { ordinal } = req.device {
        let (gpus, problem) = crate::device::list_devices();
        let count = gpus.iter().filter(|g| !g.spec.starts_with("sim:")).count();
        // Checked: cuda:18446744073709551614 --tp 2 must not wrap past the count.
        if ordinal.checked_add(n).is_none_or(|end| end > count) {
            return Err(Error::Device {
                spec: req.device.to_string(),
                problem: format!(
                    "--tp {n} from cuda:{ordinal} needs GPUs cuda:{ordinal}..cuda:{}; this machine shows {count}{}",
                    (ordinal as u128) + (n as u128) - 1,
                    problem.map(|p| format!(" ({p})")).unwrap_or_default()
                ),
            });
        }
        crate::device::cuda::nccl_library().map_err(|problem| Error::Device {
            spec: req.device.to_string(),
            problem: format!("--tp {n} needs NCCL: {problem}"),
        })?;
    }
    if matches!(req.model, ModelSource::Synthetic { .. }) {
        return Ok(None);
    }
    let opened = model::open(&req.model, req.seed)?;
    crate::model::layers::tp::TpShard::new(0, n).check(&opened.config)?;
    if req.pp <= 1 {
        return Ok(None);
    }
    let c = &opened.config;
    if c.family()
        .is_some_and(|f| f.decoder != crate::model::models::registry::Decoder::Llama)
    {
        return Err(crate::model::layers::pp::refused(&c.arch));
    }
    crate::model::layers::pp::partition(
        c.num_layers,
        req.pp as usize,
        req.pp_layer_partition.as_deref(),
    )
    .map(Some)
}

/// The error to show for a failed instance: the first rank's own failure (not the "another
/// rank stopped" that followed it on the others), naming the rank.
fn root_error(errors: Vec<(usize, Error)>) -> Error {
    let mut first_peer = None;
    for (rank, e) in errors {
        match e {
            Error::PeerStopped { .. } => {
                first_peer.get_or_insert(e);
            }
            Error::OutOfMemory {
                device,
                during,
                detail,
                state,
            } => {
                return Error::OutOfMemory {
                    device: format!("{device} (tensor-parallel rank {rank})"),
                    during,
                    detail,
                    state,
                }
            }
            other => return other,
        }
    }
    first_peer.unwrap_or(Error::Request("tensor-parallel run failed".into()))
}

pub(crate) fn run_tp(
    req: &ProfileRequest,
    sink: Option<ProgressSink>,
    cancel: Arc<AtomicBool>,
) -> Result<Report> {
    let Preflight { partition, moe } = preflight(req)?;
    let tp = req.tp as usize;
    let pp = req.pp as usize;
    // A dense model's data-parallel replicas are independent engines (0.19.0 v1/engine/core.py
    // L1071-1082 runs them as DP = 1): one replica runs, standing for every one. A MoE
    // model's replicas share their MoE layers: all of them run.
    let dp = if moe { req.dp as usize } else { 1 };
    let per_replica = tp * pp;
    let n = per_replica * dp;
    // One tensor-parallel group per stage of each replica, and the world of each replica.
    let groups: Vec<Arc<RankGroup>> = (0..pp * dp).map(|_| Arc::new(RankGroup::new(tp))).collect();
    let worlds: Vec<Arc<RankGroup>> = (0..dp)
        .map(|_| Arc::new(RankGroup::new(per_replica)))
        .collect();
    let host = |rank: usize| rank / crate::profile::request::MAX_TP as usize;
    let across = |ranks: &[usize]| {
        ranks
            .iter()
            .any(|&r| host(r) != host(ranks[0]))
            .then_some(req.network)
    };
    let spec_of = |rank: usize| {
        let (replica, within) = (rank / per_replica, rank % per_replica);
        let (stage, tp_rank) = (within / tp, within % tp);
        let at = |d: usize, s: usize, t: usize| d * per_replica + s * tp + t;
        let mut comms = Vec::new();
        if pp > 1 {
            comms.push(GroupComm {
                label: "nccl: pipeline group pynccl communicator + warm-up all_reduce",
                across: across(&(0..pp).map(|s| at(replica, s, tp_rank)).collect::<Vec<_>>()),
            });
        }
        let moe_spans = moe && req.moe_spans_ranks();
        if moe && dp > 1 {
            comms.push(GroupComm {
                label: "nccl: data-parallel group pynccl communicator + warm-up all_reduce",
                across: across(&(0..dp).map(|d| at(d, stage, tp_rank)).collect::<Vec<_>>()),
            });
        }
        if moe_spans {
            let ranks: Vec<usize> = (0..dp)
                .flat_map(|d| (0..tp).map(move |t| (d, t)))
                .map(|(d, t)| at(d, stage, t))
                .collect();
            comms.push(GroupComm {
                label: "nccl: expert-parallel group pynccl communicator + warm-up all_reduce",
                across: across(&ranks),
            });
        }
        RankSpec {
            rank: tp_rank,
            size: tp,
            group: groups[rank / tp].clone(),
            pp: partition
                .as_ref()
                .map(|parts| crate::device::group::PpStage {
                    stage,
                    stages: pp,
                    layers: crate::model::layers::pp::stage_layers(parts, stage),
                    world_rank: within,
                    world: worlds[replica].clone(),
                }),
            moe: moe_spans.then_some(crate::device::group::MoeGroup {
                rank: replica * tp + tp_rank,
                size: req.dp as usize * tp,
                ep: req.enable_expert_parallel,
                dp: req.dp as usize,
            }),
            comms,
        }
    };
    // A rank that fails stops its group and every rank's meeting point.
    let abort = |rank: usize, why: &str| {
        groups[rank / tp].abort(rank % tp, why);
        worlds[rank / per_replica].abort(rank % per_replica, why);
    };
    let results: Vec<Result<Report>> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..n)
            .map(|rank| {
                let cancel = cancel.clone();
                let spec = spec_of(rank);
                let abort = &abort;
                std::thread::Builder::new()
                    .name(format!("vramscope-rank{rank}"))
                    .spawn_scoped(s, move || {
                        let r = run_rank(req, None, cancel, Some(spec));
                        if let Err(e) = &r {
                            abort(rank, &e.to_string());
                        }
                        r
                    })
            })
            .collect();
        let first = run_rank(req, sink, cancel.clone(), Some(spec_of(0)));
        if let Err(e) = &first {
            abort(0, &e.to_string());
        }
        let mut all = vec![first];
        for (i, h) in handles.into_iter().enumerate() {
            all.push(match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(Error::Request(format!(
                        "tensor-parallel rank {} stopped unexpectedly",
                        i + 1
                    )))
                }),
                Err(e) => Err(Error::Request(format!(
                    "could not start tensor-parallel rank {}: {e}",
                    i + 1
                ))),
            });
        }
        all
    });
    let mut reports = Vec::with_capacity(n);
    let mut errors = Vec::new();
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(rep) => reports.push(rep),
            Err(e) => errors.push((rank, e)),
        }
    }
    if !errors.is_empty() {
        return Err(root_error(errors));
    }
    Ok(combine(reports))
}

/// The fewest blocks and the lowest rank that has them.
fn engine_min(key: &str, title: &str, blocks: Vec<u64>) -> EngineBudget {
    let (binding, min) = blocks
        .iter()
        .copied()
        .enumerate()
        .min_by_key(|&(r, b)| (b, r))
        .unwrap_or((0, 0));
    EngineBudget {
        key: key.into(),
        title: title.into(),
        kv_blocks: min,
        binding_rank: binding as u32,
        rank_blocks: blocks,
    }
}

/// The instance's report: the engine's budget per formula, and the rank that binds #9516's at
/// the top level with every rank's report under `ranks`.
pub(crate) fn combine(reports: Vec<Report>) -> Report {
    // The formulas the ranks list: `ALL`, and the release's own where it is not among them.
    let ids: Vec<FormulaId> = reports[0].formulas.iter().map(|f| f.id).collect();
    let mut engine: Vec<EngineBudget> = ids
        .iter()
        .map(|&id| {
            let blocks = reports
                .iter()
                .map(|r| r.formula(id).map_or(0, |f| f.kv_blocks))
                .collect();
            engine_min(id.key(), id.title(), blocks)
        })
        .collect();
    engine.push(engine_min(
        "truth",
        "measured truth",
        reports.iter().map(|r| r.truth.kv_blocks).collect(),
    ));
    let binding = engine
        .iter()
        .find(|e| e.key == FormulaId::Pr9516.key())
        .map_or(0, |e| e.binding_rank as usize);
    let mut top = reports[binding].clone();
    top.tp = top.settings.tp;
    top.pp = top.settings.pp;
    top.ranks = reports;
    top.engine = engine;
    top
}

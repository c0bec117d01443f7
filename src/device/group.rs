//! The ranks of one tensor-parallel instance, as threads of this process: where they meet.
//!
//! vLLM runs one worker per GPU and the engine gathers what each worker measured
//! (distributed_gpu_executor.py `determine_num_available_blocks`: the minimum over workers).
//! vramscope runs every rank on its own thread with its own runtime and device; this is the
//! host-side meeting point they share: a barrier that a failing rank can break (so no rank
//! waits forever on one that ran out of memory), the exchange of small numbers (block counts),
//! and, for the simulated device, the collectives' data (sum and gather of f32 values).

use std::sync::{Condvar, Mutex};

use crate::base::error::{Error, Result};

/// Where the ranks of one instance meet. Shared (`Arc`) by every rank's thread.
pub struct RankGroup {
    size: usize,
    state: Mutex<State>,
    cv: Condvar,
}

struct State {
    /// Ranks waiting at the current barrier.
    arrived: usize,
    /// Bumped each time a barrier opens, so a rank knows its own wait is over.
    generation: u64,
    /// Set by a rank that stopped: (rank, why, for good). Every wait then ends in error, until
    /// `recover` clears a stop that was not for good (one verify pass that ran out of memory).
    broken: Option<(usize, String, bool)>,
    /// Ranks gathered in `recover`.
    recovering: usize,
    recover_generation: u64,
    /// What the last `recover` cleared.
    recovered: Option<(usize, String)>,
    /// One slot per rank for the data being exchanged.
    slots: Vec<Vec<f32>>,
    numbers: Vec<Vec<u64>>,
}

impl RankGroup {
    pub fn new(size: usize) -> Self {
        RankGroup {
            size,
            state: Mutex::new(State {
                arrived: 0,
                generation: 0,
                broken: None,
                recovering: 0,
                recover_generation: 0,
                recovered: None,
                slots: vec![Vec::new(); size],
                numbers: vec![Vec::new(); size],
            }),
            cv: Condvar::new(),
        }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A rank that panicked while holding the lock leaves the data as it was; the barrier
        // logic stays sound, so the poison is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stopped(broken: &(usize, String, bool)) -> Error {
        Error::PeerStopped {
            rank: broken.0,
            why: broken.1.clone(),
        }
    }

    /// Marks the group stopped by `rank` (it failed with `why`) for good: every rank waiting
    /// now or later gets an error instead of waiting for it.
    pub fn abort(&self, rank: usize, why: &str) {
        self.stop(rank, why, true);
    }

    /// Like `abort`, for the current step only (a verify pass): the ranks give up the step and
    /// meet again in `recover`.
    pub fn abort_step(&self, rank: usize, why: &str) {
        self.stop(rank, why, false);
    }

    fn stop(&self, rank: usize, why: &str, for_good: bool) {
        let mut s = self.lock();
        match &mut s.broken {
            None => s.broken = Some((rank, why.to_string(), for_good)),
            Some(b) => b.2 |= for_good,
        }
        drop(s);
        self.cv.notify_all();
    }

    /// Every rank calls this after a step that may have been aborted: it waits for all of
    /// them, then clears a stop that was not for good and reports it (`Some(rank, why)`).
    pub fn recover(&self) -> Result<Option<(usize, String)>> {
        let mut s = self.lock();
        if let Some(b) = s.broken.as_ref().filter(|b| b.2) {
            return Err(Self::stopped(b));
        }
        let gen = s.recover_generation;
        s.recovering += 1;
        if s.recovering == self.size {
            s.recovering = 0;
            s.recover_generation += 1;
            s.arrived = 0;
            s.recovered = s.broken.take().map(|b| (b.0, b.1));
            self.cv.notify_all();
            return Ok(s.recovered.clone());
        }
        while s.recover_generation == gen {
            if let Some(b) = s.broken.as_ref().filter(|b| b.2) {
                return Err(Self::stopped(b));
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        // The next `recover` cannot finish before this rank arrives, so this is still ours.
        Ok(s.recovered.clone())
    }

    /// Waits until every rank has arrived, or until one of them stopped.
    fn barrier<'a>(
        &'a self,
        mut s: std::sync::MutexGuard<'a, State>,
    ) -> Result<std::sync::MutexGuard<'a, State>> {
        if let Some(b) = &s.broken {
            return Err(Self::stopped(b));
        }
        let gen = s.generation;
        s.arrived += 1;
        if s.arrived == self.size {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return Ok(s);
        }
        while s.generation == gen {
            if let Some(b) = &s.broken {
                let e = Self::stopped(b);
                s.arrived -= 1;
                return Err(e);
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        Ok(s)
    }

    /// Every rank waits for the others.
    pub fn wait(&self) -> Result<()> {
        let s = self.lock();
        self.barrier(s).map(drop)
    }

    /// Every rank hands in `values`; each gets back all ranks' values, in rank order.
    pub fn all_gather_u64(&self, rank: usize, values: &[u64]) -> Result<Vec<Vec<u64>>> {
        let mut s = self.lock();
        s.numbers[rank] = values.to_vec();
        let s = self.barrier(s)?;
        let all = s.numbers.clone();
        drop(s);
        // Nobody may overwrite a slot before every rank has read it.
        self.wait()?;
        Ok(all)
    }

    /// In-place sum over the ranks, in rank order, so every rank gets bit-identical results
    /// (as NCCL's all-reduce gives every rank the same values).
    pub fn all_reduce_sum(&self, rank: usize, data: &mut [f32]) -> Result<()> {
        let mut s = self.lock();
        s.slots[rank] = data.to_vec();
        let s = self.barrier(s)?;
        let slots = &s.slots;
        if slots.iter().any(|v| v.len() != data.len()) {
            return Err(Error::Request(
                "tensor-parallel all-reduce: the ranks sent different sizes".into(),
            ));
        }
        for (i, d) in data.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for v in slots {
                acc += v[i];
            }
            *d = acc;
        }
        drop(s);
        self.wait()
    }

    /// Every rank hands in `data` and gets all of them back in rank order (NCCL's all-gather).
    pub fn all_gather_f32(&self, rank: usize, data: &[f32]) -> Result<Vec<Vec<f32>>> {
        let mut s = self.lock();
        s.slots[rank] = data.to_vec();
        let s = self.barrier(s)?;
        let out = s.slots.clone();
        drop(s);
        self.wait()?;
        Ok(out)
    }

    /// Every rank hands in `data`; rank 0 gets all of them in rank order, the others `None`
    /// (PyTorch's `torch.distributed.gather` to rank 0, as vLLM gathers the logits).
    pub fn gather_to_first(&self, rank: usize, data: &[f32]) -> Result<Option<Vec<Vec<f32>>>> {
        let mut s = self.lock();
        s.slots[rank] = data.to_vec();
        let s = self.barrier(s)?;
        let out = (rank == 0).then(|| s.slots.clone());
        drop(s);
        self.wait()?;
        Ok(out)
    }
}

/// One rank of a tensor-parallel instance: who it is and where it meets the others.
#[derive(Clone)]
pub struct TpRank {
    pub rank: usize,
    pub size: usize,
    pub group: std::sync::Arc<RankGroup>,
    /// vLLM's custom all-reduce is on (custom_all_reduce.py L50-98: world size 2, 4, 6 or 8,
    /// and the GPUs reach each other over NVLink or, for two, peer to peer). Then an
    /// all-reduce under 8 MiB is out of place (`torch.empty_like`), and vLLM takes its three
    /// buffers from the caching allocator when the worker starts.
    pub custom_ar: bool,
    /// Every all-reduce is out of place (vLLM 0.6.5 on, #10121): above the custom kernel's
    /// size pynccl, enabled from the worker's start, reduces into `torch.empty_like(input)`,
    /// so no torch.distributed communicator is made for it.
    pub all_reduce_out_of_place: bool,
    /// Which NCCL the simulated device models (the release's).
    pub nccl: super::nccl_model::NcclRules,
}

/// Where a rank's fused-MoE layers sit among the ranks that share the experts: vLLM's
/// `FusedMoEParallelConfig.make` (0.11.0 fused_moe/config.py L622-730; 0.15 and 0.19 the same)
/// flattens tensor parallel across data parallel (`tp_size = dp × tp`, and `tp_rank` is
/// `dp_rank × tp` plus the TP rank); with `--enable-expert-parallel` that flattened group
/// becomes the expert-parallel one (`ep_size`, `ep_rank`) and each rank holds whole experts,
/// else it cuts every expert's width over it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeGroup {
    /// This rank in the flattened group (`dp_rank × tp + tp_rank`).
    pub rank: usize,
    /// `dp × tp`.
    pub size: usize,
    /// `--enable-expert-parallel` with `dp × tp > 1` (`use_ep`).
    pub ep: bool,
    /// `--data-parallel-size`: with more than one, each MoE layer gathers the tokens of every
    /// data-parallel rank before its experts and reduce-scatters them after
    /// (`do_naive_dispatch_combine`, fused_moe/layer.py 0.11.0 L2001-2004).
    pub dp: usize,
}

/// One stage of a pipeline-parallel instance (vLLM's `--pipeline-parallel-size`): which
/// decoder layers it holds, and where every rank of the instance meets (the engine's minimum
/// over all workers, tensor- and pipeline-parallel alike: `get_kv_cache_configs`,
/// v1/core/kv_cache_utils.py 0.19 L1599-1612).
#[derive(Clone)]
pub struct PpStage {
    pub stage: usize,
    pub stages: usize,
    /// The decoder layers this stage builds and runs (`get_pp_indices`).
    pub layers: std::ops::Range<usize>,
    /// This rank among all `tp × pp` ranks (vLLM's global rank: `pp_rank × tp + tp_rank`,
    /// parallel_state.py `initialize_model_parallel`).
    pub world_rank: usize,
    pub world: std::sync::Arc<RankGroup>,
}

impl PpStage {
    pub fn is_first(&self) -> bool {
        self.stage == 0
    }

    pub fn is_last(&self) -> bool {
        self.stage + 1 == self.stages
    }
}

/// vLLM's custom all-reduce: inputs under this many bytes go through it
/// (custom_all_reduce.py `max_size=8192 * 1024`).
pub const CUSTOM_AR_MAX_BYTES: u64 = 8192 * 1024;

/// `ops.meta_size()`: `sizeof(vllm::Signal)` (csrc/custom_all_reduce.cuh at 380e1863: 36 blocks
/// × 8 uint32 self counters + 2 × 36 × 8 peer counters).
pub const CUSTOM_AR_META_BYTES: u64 = 36 * 8 * 4 + 2 * 36 * 8 * 4;

impl TpRank {
    /// Whether vLLM would all-reduce `bytes` out of place through its custom kernel
    /// (`should_custom_ar`: a multiple of 16 bytes, under `max_size`).
    pub fn custom_ar_takes(&self, bytes: u64) -> bool {
        self.custom_ar && bytes.is_multiple_of(16) && bytes < CUSTOM_AR_MAX_BYTES
    }
}

/// What NCCL sets up the first time each is needed on a rank (its memory: `nccl_model`).
pub use super::nccl_model::CommSetup;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn ranks_sum_gather_and_exchange_on_threads() {
        let g = Arc::new(RankGroup::new(3));
        let handles: Vec<_> = (0..3)
            .map(|r| {
                let g = g.clone();
                std::thread::spawn(move || {
                    let mut d = vec![r as f32 + 1.0, 10.0 * r as f32];
                    g.all_reduce_sum(r, &mut d).unwrap();
                    let gathered = g.gather_to_first(r, &[r as f32]).unwrap();
                    let nums = g.all_gather_u64(r, &[r as u64 * 5]).unwrap();
                    (d, gathered, nums)
                })
            })
            .collect();
        for (r, h) in handles.into_iter().enumerate() {
            let (d, gathered, nums) = h.join().unwrap();
            assert_eq!(d, vec![6.0, 30.0]);
            assert_eq!(nums, vec![vec![0], vec![5], vec![10]]);
            if r == 0 {
                assert_eq!(gathered, Some(vec![vec![0.0], vec![1.0], vec![2.0]]));
            } else {
                assert_eq!(gathered, None);
            }
        }
    }

    #[test]
    fn a_failed_rank_releases_the_others() {
        let g = Arc::new(RankGroup::new(2));
        let g1 = g.clone();
        let waiter = std::thread::spawn(move || g1.wait());
        std::thread::sleep(std::time::Duration::from_millis(20));
        g.abort(1, "out of memory during layer 3");
        let err = waiter.join().unwrap().unwrap_err().to_string();
        assert!(
            err.contains("rank 1") && err.contains("out of memory"),
            "{err}"
        );
        // Later waits fail at once too.
        assert!(g.wait().is_err());
    }

    #[test]
    fn a_step_stopped_by_one_rank_is_recovered_by_all() {
        let g = Arc::new(RankGroup::new(2));
        let g1 = g.clone();
        let other = std::thread::spawn(move || {
            // Rank 0 waits in a collective that rank 1 never reaches.
            let first = g1.wait();
            let seen = g1.recover().unwrap();
            // After recovery the ranks meet again as usual.
            let mut d = [1.0f32];
            g1.all_reduce_sum(0, &mut d).unwrap();
            (first.is_err(), seen, d[0])
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        g.abort_step(1, "out of memory in the verify pass");
        let seen = g.recover().unwrap();
        let mut d = [2.0f32];
        g.all_reduce_sum(1, &mut d).unwrap();
        let (first_failed, seen0, sum0) = other.join().unwrap();
        assert!(first_failed);
        assert_eq!(
            seen,
            Some((1, "out of memory in the verify pass".to_string()))
        );
        assert_eq!(seen0, seen);
        assert_eq!((sum0, d[0]), (3.0, 3.0));
    }
}

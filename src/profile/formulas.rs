//! vLLM's KV-cache budget formulas as pure functions of measured numbers (../FORMULAS.md).
//! Each yields `non_kv`, the memory kept away from the KV cache; KV = T·u − non_kv.

use serde::{Deserialize, Serialize};

/// Device and framework-allocator numbers at one checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub time_us: u64,
    /// F(t): device-wide free memory.
    pub free: u64,
    /// T.
    pub total: u64,
    /// A(t).
    pub allocated: u64,
    /// Â since the last reset.
    pub allocated_peak: u64,
    /// R(t).
    pub reserved: u64,
    pub reserved_peak: u64,
    /// This process's device memory.
    pub process_used: u64,
}

impl Checkpoint {
    /// U(t) = T − F(t).
    pub fn used(&self) -> u64 {
        self.total - self.free
    }
}

/// t0: instance created; t1: before the profile pass (after load, empty_cache, reset_peak);
/// t2: after the pass(es), synchronized; t3: after empty_cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoints {
    pub t0: Checkpoint,
    pub t1: Checkpoint,
    pub t2: Checkpoint,
    pub t3: Checkpoint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FormulaId {
    V0_6_3,
    Pr9352,
    Pr9516,
    Pr10511,
    Pr12126,
}

impl FormulaId {
    pub const ALL: [FormulaId; 5] = [
        FormulaId::V0_6_3,
        FormulaId::Pr9352,
        FormulaId::Pr9516,
        FormulaId::Pr10511,
        FormulaId::Pr12126,
    ];

    pub fn key(self) -> &'static str {
        match self {
            FormulaId::V0_6_3 => "v0_6_3",
            FormulaId::Pr9352 => "pr9352",
            FormulaId::Pr9516 => "pr9516",
            FormulaId::Pr10511 => "pr10511",
            FormulaId::Pr12126 => "pr12126",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            FormulaId::V0_6_3 => "v0.6.3 free-memory drop",
            FormulaId::Pr9352 => "#9352 activation-release (old)",
            FormulaId::Pr9516 => "#9516 total-minus-torch (new)",
            FormulaId::Pr10511 => "#10511 per-instance",
            FormulaId::Pr12126 => "#12126 reserved-based (V1)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            FormulaId::V0_6_3 => "v0.6.3",
            FormulaId::Pr9352 => "#9352 old",
            FormulaId::Pr9516 => "#9516 new",
            FormulaId::Pr10511 => "#10511",
            FormulaId::Pr12126 => "#12126",
        }
    }
}

/// The terms a formula computes (bytes; signed where a difference can go negative).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terms {
    /// Framework peak term (Â, or its increase over A(t1)).
    pub torch_peak_bytes: i64,
    /// Non-framework term.
    pub non_torch_bytes: i64,
    /// Weights counted separately (#10511, #12126), else 0 (already inside Â).
    pub weights_term_bytes: i64,
    pub non_kv_bytes: i64,
    /// KV budget: T·u − non_kv (ceil(T·u) for #12126).
    pub kv_bytes: i64,
}

fn i(x: u64) -> i64 {
    x as i64
}

/// `T·u`, floored as vLLM's `int(total * util)` (or ceiled where #12126 does).
pub fn budget(total: u64, util: f64, ceil: bool) -> i64 {
    let b = total as f64 * util;
    (if ceil { b.ceil() } else { b.floor() }) as i64
}

pub fn evaluate(id: FormulaId, c: &Checkpoints, weights: u64, util: f64) -> Terms {
    let (t0, t1, t2, t3) = (&c.t0, &c.t1, &c.t2, &c.t3);
    let total = t0.total;
    let (torch, non_torch, w, ceil) = match id {
        // v0.6.3 (before #9352): the drop in free memory from instance start to after the pass,
        // read before empty_cache, so cached blocks count.
        FormulaId::V0_6_3 => (0, i(t0.free) - i(t2.free), 0, false),
        // #9352: non-torch = drop in free memory across the pass, after empty_cache; anything of
        // the framework that survives the pass is in Â *and* in that drop (double count).
        FormulaId::Pr9352 => (
            i(t3.allocated_peak),
            (i(t1.free) - i(t3.free)).max(0),
            0,
            false,
        ),
        // #9516: non-torch = device used − framework allocated, at the end.
        FormulaId::Pr9516 => (
            i(t3.allocated_peak),
            (i(t3.used()) - i(t3.allocated)).max(0),
            0,
            false,
        ),
        // #10511: increases over this instance's own baseline B = T − F(t0).
        FormulaId::Pr10511 => {
            let baseline = i(total) - i(t0.free);
            let non_torch_inc =
                i(t3.used()) - baseline - i(weights) - (i(t3.allocated) - i(t1.allocated));
            (
                i(t3.allocated_peak) - i(t1.allocated),
                non_torch_inc,
                i(weights),
                false,
            )
        }
        // #12126 / V1: non-torch(t) = U(t) − R(t), its increase from t0 to t3.
        FormulaId::Pr12126 => {
            let nt = |c: &Checkpoint| i(c.used()) - i(c.reserved);
            (
                i(t3.allocated_peak) - i(t1.allocated),
                nt(t3) - nt(t0),
                i(weights),
                true,
            )
        }
    };
    let non_kv = torch + non_torch + w;
    Terms {
        torch_peak_bytes: torch,
        non_torch_bytes: non_torch,
        weights_term_bytes: w,
        non_kv_bytes: non_kv,
        kv_bytes: budget(total, util, ceil) - non_kv,
    }
}

/// KV-cache geometry (vLLM's `CacheEngine.get_cache_block_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvGeometry {
    pub block_size: u64,
    pub num_layers: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
    pub dtype_bytes: u64,
    pub max_model_len: u64,
}

impl KvGeometry {
    /// 2 (K and V) × block_size × layers × kv_heads × head_dim × dtype bytes.
    pub fn block_bytes(&self) -> u64 {
        2 * self.block_size * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes
    }

    /// Blocks that fit in `kv_bytes` (0 when the budget is negative).
    pub fn blocks(&self, kv_bytes: i64) -> u64 {
        if kv_bytes <= 0 || self.block_bytes() == 0 {
            0
        } else {
            kv_bytes as u64 / self.block_bytes()
        }
    }

    pub fn tokens(&self, kv_bytes: i64) -> u64 {
        self.blocks(kv_bytes) * self.block_size
    }

    /// Requests of `max_model_len` tokens that fit at once.
    pub fn max_concurrency(&self, kv_bytes: i64) -> f64 {
        self.tokens(kv_bytes) as f64 / self.max_model_len.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn cp(total: u64, free: u64, alloc: u64, peak: u64, reserved: u64) -> Checkpoint {
        Checkpoint {
            total,
            free,
            allocated: alloc,
            allocated_peak: peak,
            reserved,
            ..Default::default()
        }
    }

    /// vLLM `test_profile.py` under #9352: a mocked 10 GiB GPU where free = 10 GiB − A, so
    /// tensors surviving the pass appear both in Â and in the free-memory drop.
    #[test]
    fn old_formula_double_counts_surviving_tensors() {
        let t = 10 * GIB;
        let w = 2 * GIB;
        let surviving = 8 * MIB;
        let peak = w + GIB;
        let c = Checkpoints {
            t0: cp(t, t, 0, 0, 0),
            t1: cp(t, t - w, w, w, w),
            t2: cp(t, t - w - surviving, w + surviving, peak, w + surviving),
            t3: cp(t, t - w - surviving, w + surviving, peak, w + surviving),
        };
        let old = evaluate(FormulaId::Pr9352, &c, w, 0.9);
        let new = evaluate(FormulaId::Pr9516, &c, w, 0.9);
        assert_eq!(old.non_torch_bytes, surviving as i64);
        assert_eq!(new.non_torch_bytes, 0);
        assert_eq!(new.kv_bytes - old.kv_bytes, surviving as i64);
        assert_eq!(new.kv_bytes, (t as f64 * 0.9) as i64 - peak as i64);
    }

    /// vLLM `test_memory_profiling` (#10511): 512 MiB held before the instance, 512 MiB weights,
    /// a 1 GiB spike, 256 MiB outside the framework during the pass.
    #[test]
    fn per_instance_formula_separates_other_processes() {
        let t = 80 * GIB;
        let before = 512 * MIB;
        let w = 512 * MIB;
        let nccl = 256 * MIB;
        let c = Checkpoints {
            t0: cp(t, t - before, 0, 0, 0),
            t1: cp(t, t - before - w, w, w, w),
            t2: cp(t, t - before - w - GIB - nccl, w, w + GIB, w + GIB),
            t3: cp(t, t - before - w - nccl, w, w + GIB, w),
        };
        let r = evaluate(FormulaId::Pr10511, &c, w, 0.9);
        assert_eq!(r.torch_peak_bytes, GIB as i64);
        assert_eq!(r.non_torch_bytes, nccl as i64);
        assert_eq!(r.non_kv_bytes, (GIB + nccl + w) as i64);
        // #9516 charges the other process's 512 MiB to this instance (vLLM issue #10451).
        let new = evaluate(FormulaId::Pr9516, &c, w, 0.9);
        assert_eq!(new.non_torch_bytes, (before + nccl) as i64);
        let v1 = evaluate(FormulaId::Pr12126, &c, w, 0.9);
        assert_eq!(v1.non_torch_bytes, nccl as i64);
        assert_eq!(
            v1.kv_bytes,
            (t as f64 * 0.9).ceil() as i64 - (GIB + nccl + w) as i64
        );
        let v063 = evaluate(FormulaId::V0_6_3, &c, w, 0.9);
        assert_eq!(v063.non_kv_bytes, (w + GIB + nccl) as i64);
    }

    #[test]
    fn kv_geometry_of_llama_3_8b() {
        let g = KvGeometry {
            block_size: 16,
            num_layers: 32,
            num_kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
            max_model_len: 8192,
        };
        assert_eq!(g.block_bytes(), 2 * MIB);
        assert_eq!(g.blocks(10 * GIB as i64 + 1), 5120);
        assert_eq!(g.tokens(10 * GIB as i64), 81920);
        assert_eq!(g.max_concurrency(10 * GIB as i64), 10.0);
        assert_eq!(g.blocks(-5), 0);
    }
}

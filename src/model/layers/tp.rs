//! Tensor parallel as vLLM's parallel linear layers and vocabulary embedding cut a model
//! (`model_executor/layers/linear.py`, `vocab_parallel_embedding.py`).

use crate::base::error::{Error, Result};
use crate::engine::runtime::Runtime;
use crate::model::config::ModelConfig;

/// How one tensor-parallel rank's share of a Llama model is cut, as vLLM 380e1863 cuts it
/// (linear.py `QKVParallelLinear` L640-700, `MergedColumnParallelLinear`, `RowParallelLinear`;
/// vocab_parallel_embedding.py `VocabParallelEmbedding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpShard {
    pub rank: usize,
    pub size: usize,
    /// How the routed experts of a fused-MoE layer are cut on this rank: over the
    /// tensor-parallel group by default; over `dp × tp` ranks with data parallel; whole
    /// experts, `E / ep` of them, with expert parallel.
    pub moe: MoeSplit,
}

/// The fused-MoE layers' share of this rank (`FusedMoEParallelConfig`, 0.11.0
/// fused_moe/config.py L695-730): `rank` of `size` ranks (`dp × tp`), and whether they hold
/// whole experts (`use_ep`) or a `1 / size` slice of every expert's width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSplit {
    pub rank: usize,
    pub size: usize,
    pub ep: bool,
}

/// The routed experts one rank holds with expert parallel, as `determine_expert_map` places
/// them ("linear": 0.11.0 fused_moe/layer.py L786-846, 0.19.0 L66-164): `E // ep` each, the
/// remainder one more on the first `E % ep` ranks, contiguous from `rank × (E // ep) +
/// min(rank, E % ep)`. Without expert parallel: every expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertPlacement {
    pub first: usize,
    pub local: usize,
    pub global: usize,
    /// vLLM keeps an `expert_map` (int32 `[E]`, global to local index, −1 elsewhere) on the
    /// GPU per MoE layer (`register_buffer`, made under the model's device context).
    pub mapped: bool,
}

impl ExpertPlacement {
    pub fn all(global: usize) -> Self {
        ExpertPlacement {
            first: 0,
            local: global,
            global,
            mapped: false,
        }
    }

    /// `determine_expert_map(ep_size, ep_rank, E, "linear")`.
    pub fn linear(global: usize, rank: usize, size: usize) -> Self {
        if size <= 1 {
            return Self::all(global);
        }
        let (base, rem) = (global / size, global % size);
        ExpertPlacement {
            first: rank * base + rank.min(rem),
            local: base + usize::from(rank < rem),
            global,
            mapped: true,
        }
    }

    /// The expert_map's values: local index of each global expert, −1 when not here.
    pub fn expert_map(&self) -> Vec<i32> {
        (0..self.global)
            .map(|g| {
                if g >= self.first && g < self.first + self.local {
                    (g - self.first) as i32
                } else {
                    -1
                }
            })
            .collect()
    }
}

impl TpShard {
    /// The runtime's tensor-parallel rank (rank 0 of 1 without tensor parallelism), with no
    /// expert groups of its own: a vision tower's split.
    pub fn of_ranks(rt: &Runtime) -> Self {
        let (rank, size) = rt.tp().map_or((0, 1), |t| (t.rank, t.size));
        TpShard::new(rank, size)
    }

    /// Rank `rank` of `size` tensor-parallel ranks, the experts cut over the same ranks.
    pub fn new(rank: usize, size: usize) -> Self {
        TpShard {
            rank,
            size,
            moe: MoeSplit {
                rank,
                size,
                ep: false,
            },
        }
    }

    /// This runtime's shard, checking that the model divides as vLLM requires
    /// (config.py `verify_with_parallel_config`, linear.py `divide`).
    pub fn of(rt: &Runtime, cfg: &ModelConfig) -> Result<Self> {
        let mut s = TpShard::of_ranks(rt);
        if let Some(g) = rt.moe_group() {
            s.moe = MoeSplit {
                rank: g.rank,
                size: g.size,
                ep: g.ep && g.size > 1,
            };
        }
        s.check(cfg)?;
        Ok(s)
    }

    /// The routed experts this rank holds.
    pub fn experts(&self, global: usize) -> ExpertPlacement {
        if self.moe.ep {
            ExpertPlacement::linear(global, self.moe.rank, self.moe.size)
        } else {
            ExpertPlacement::all(global)
        }
    }

    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        let n = self.size;
        let bad = |what: String| Err(Error::Request(format!("--tp {n}: {what}")));
        if !cfg.num_heads.is_multiple_of(n) {
            return bad(format!(
                "the model's {} attention heads do not divide over {n} GPUs (vLLM requires num_attention_heads % tensor_parallel_size == 0)",
                cfg.num_heads
            ));
        }
        let kv = cfg.num_kv_heads;
        if kv >= n && !kv.is_multiple_of(n) || kv < n && !n.is_multiple_of(kv) {
            return bad(format!(
                "the model's {kv} KV heads and {n} GPUs do not divide either way (vLLM splits KV heads when there are at least as many as GPUs, else replicates each over GPUs: one must divide the other)"
            ));
        }
        if !cfg.intermediate_size.is_multiple_of(n) {
            return bad(format!(
                "the MLP width {} does not divide over {n} GPUs",
                cfg.intermediate_size
            ));
        }
        if let Some(m) = cfg.moe.as_ref() {
            if !self.moe.ep && !m.expert_intermediate_size.is_multiple_of(self.moe.size) {
                return Err(Error::Request(format!(
                    "{}: each expert's width {} does not divide over {} GPUs (FusedMoE asserts intermediate_size % tp_size == 0; with data parallel its tp_size is dp × tp)",
                    if self.moe.size == n { format!("--tp {n}") } else { format!("{} MoE ranks", self.moe.size) },
                    m.expert_intermediate_size,
                    self.moe.size
                )));
            }
            if self.moe.ep && m.num_experts < self.moe.size {
                return Err(Error::Request(format!(
                    "--enable-expert-parallel over {} GPUs: the model has {} experts, fewer than the GPUs (determine_expert_map would leave a GPU with none)",
                    self.moe.size, m.num_experts
                )));
            }
        }
        if n <= 1 {
            return Ok(());
        }
        if let Some(m) = cfg.moe.as_ref() {
            if m.shared_expert_intermediate_size > 0 && n > m.num_experts {
                // Qwen2MoeSparseMoeBlock.__init__ (qwen2_moe.py L108-111 at 0.8.5).
                return bad(format!(
                    "vLLM refuses it: \"Tensor parallel size {n} is greater than the number of experts {}.\"",
                    m.num_experts
                ));
            }
            if !m.shared_expert_intermediate_size.is_multiple_of(n) {
                return bad(format!(
                    "the shared expert's width {} does not divide over {n} GPUs (MergedColumnParallelLinear)",
                    m.shared_expert_intermediate_size
                ));
            }
        }
        if !cfg.padded_vocab().is_multiple_of(n) {
            return bad(format!(
                "the padded vocabulary ({} rows) does not divide over {n} GPUs",
                cfg.padded_vocab()
            ));
        }
        Ok(())
    }

    /// KV heads on each rank: split, or one head replicated over `size / kv` ranks
    /// (linear.py L664-671, `num_kv_head_replicas`).
    pub fn local_kv_heads(&self, cfg: &ModelConfig) -> usize {
        if cfg.num_kv_heads >= self.size {
            cfg.num_kv_heads / self.size
        } else {
            1
        }
    }

    /// The shape this rank computes.
    pub fn local_config(&self, cfg: &ModelConfig) -> ModelConfig {
        let mut c = cfg.clone();
        c.num_heads = cfg.num_heads / self.size;
        c.num_kv_heads = self.local_kv_heads(cfg);
        c.intermediate_size = cfg.intermediate_size / self.size;
        if let Some(m) = &mut c.moe {
            if !self.moe.ep {
                m.expert_intermediate_size /= self.moe.size;
            }
        }
        c
    }

    /// (first row, rows) of q_proj this rank holds.
    pub fn q_rows(&self, cfg: &ModelConfig) -> (usize, usize) {
        let len = cfg.q_dim() / self.size;
        (self.rank * len, len)
    }

    /// (first row, rows) of k_proj (and v_proj): the rank's KV heads, or the one head it
    /// shares with `size / kv` ranks (`shard_id = tp_rank // num_kv_head_replicas`).
    pub fn kv_rows(&self, cfg: &ModelConfig) -> (usize, usize) {
        let heads = self.local_kv_heads(cfg);
        let first_head = if cfg.num_kv_heads >= self.size {
            self.rank * heads
        } else {
            self.rank / (self.size / cfg.num_kv_heads)
        };
        (first_head * cfg.head_dim, heads * cfg.head_dim)
    }

    /// (first row, rows) of each routed expert's gate and up projections (and its down
    /// projection's columns) for an expert `width` wide: `intermediate_size_per_partition`
    /// (fused_moe/layer.py L470-472 at 0.8.5), `width // tp_size` where FusedMoE's tp_size is
    /// `dp × tp`, or 1 with expert parallel (0.11.0 layer.py L1066).
    pub fn expert_rows(&self, width: usize) -> (usize, usize) {
        if self.moe.ep {
            return (0, width);
        }
        let len = width / self.moe.size;
        (self.moe.rank * len, len)
    }

    /// (first row, rows) of a shared expert `width` wide: an MLP of the attention's
    /// tensor-parallel group (`MergedColumnParallelLinear`), whatever the routed experts do.
    pub fn shared_rows(&self, width: usize) -> (usize, usize) {
        let len = width / self.size;
        (self.rank * len, len)
    }

    /// (first row, rows) of gate_proj and up_proj.
    pub fn mlp_rows(&self, cfg: &ModelConfig) -> (usize, usize) {
        let len = cfg.intermediate_size / self.size;
        (self.rank * len, len)
    }

    /// (first row, rows) of the padded vocabulary (embedding and lm_head).
    pub fn vocab_rows(&self, padded_vocab: usize) -> (usize, usize) {
        let len = padded_vocab / self.size;
        (self.rank * len, len)
    }
}

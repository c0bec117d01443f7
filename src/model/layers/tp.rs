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
}

impl TpShard {
    /// This runtime's shard, checking that the model divides as vLLM requires
    /// (config.py `verify_with_parallel_config`, linear.py `divide`).
    pub fn of(rt: &Runtime, cfg: &ModelConfig) -> Result<Self> {
        let (rank, size) = rt.tp().map_or((0, 1), |t| (t.rank, t.size));
        let s = TpShard { rank, size };
        s.check(cfg)?;
        Ok(s)
    }

    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        let n = self.size;
        if n <= 1 {
            return Ok(());
        }
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
            if !m.expert_intermediate_size.is_multiple_of(n) {
                return bad(format!(
                    "each expert's width {} does not divide over {n} GPUs (FusedMoE asserts intermediate_size % tp_size == 0)",
                    m.expert_intermediate_size
                ));
            }
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
            m.expert_intermediate_size /= self.size;
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

    /// (first row, rows) of each expert's gate and up projections (and its down projection's
    /// columns) for an expert `width` wide: `intermediate_size_per_partition`
    /// (fused_moe/layer.py L470-472 at 0.8.5).
    pub fn expert_rows(&self, width: usize) -> (usize, usize) {
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

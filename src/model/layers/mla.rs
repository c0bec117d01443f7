//! Multi-head latent attention as vLLM's DeepSeek file builds it (`DeepseekV2MLAAttention`,
//! 0.19 model_executor/models/deepseek_v2.py L820-997, over `MultiHeadLatentAttentionWrapper`,
//! model_executor/layers/mla.py L116-177; 0.11 and 0.15.1 the same modules with
//! `MergedColumnParallelLinear` for the fused A projection): the query (one `q_proj`, or the
//! low-rank `fused_qkv_a_proj` → `q_a_layernorm` → `q_b_proj`), the latent and the shared rope
//! key (`kv_a_proj_with_mqa`, its columns after the query's in the fused projection), the
//! latent's norm, `kv_b_proj` (each head's key without rotary and its value), `o_proj`.
//! docs/reading/vllm-mla.md has the reading.

use std::cell::RefCell;

use super::tp::TpShard;
use crate::base::error::Result;
use crate::engine::ops;
use crate::engine::ops_mla::{self, MlaDims, YarnRope};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::model::config::{DeepseekShape, ModelConfig};
use crate::model::loader::{Loader, Slice};
use crate::quant::{FusedLinear, Linear};

/// One MLA layer's weights on this rank.
pub struct MlaAttention {
    /// The A projections: `[q_lora_rank | kv_lora_rank | qk_rope]` rows (`fused_qkv_a_proj`,
    /// replicated), or `[kv_lora_rank | qk_rope]` (`kv_a_proj_with_mqa`) without a low-rank
    /// query. One parameter either way; the parts are views of its output.
    pub a_proj: FusedLinear,
    /// `q_a_layernorm` and `q_b_proj` (`[heads · qk_head_dim / tp, q_lora_rank]`), or `q_proj`
    /// (`[heads · qk_head_dim / tp, hidden]`).
    pub q_a_layernorm: Option<Tensor>,
    pub q: Linear,
    pub kv_a_layernorm: Tensor,
    /// `[heads · (qk_nope + v_head) / tp, kv_lora_rank]`
    pub kv_b: Linear,
    /// `[hidden, heads · v_head / tp]`
    pub o: Linear,
    /// A block-wise fp8 `kv_b_proj`'s 16-bit copy that `process_weights_after_loading`
    /// keeps for W_UK / W_UV (`Fp8BlockLinear::mla_dequantized`); a 16-bit layer's are
    /// views of its weight.
    pub kv_b_dequantized: Option<Tensor>,
}

impl MlaAttention {
    pub fn weight_bytes(&self) -> u64 {
        self.a_proj.weight_bytes()
            + self.q_a_layernorm.as_ref().map_or(0, |t| t.nbytes())
            + self.q.weight_bytes()
            + self.kv_a_layernorm.nbytes()
            + self.kv_b.weight_bytes()
            + self.o.weight_bytes()
            + self.kv_b_dequantized.as_ref().map_or(0, |t| t.nbytes())
    }
}

/// This rank's heads: the first and how many (`num_heads // tp_size`).
fn local_heads(cfg: &ModelConfig, shard: &TpShard) -> (usize, usize) {
    let n = cfg.num_heads / shard.size;
    (shard.rank * n, n)
}

/// Loads layer `a`'s attention (`model.layers.3.self_attn`) in the order
/// `DeepseekV2MLAAttention.__init__` makes its parameters (0.19 L867-916): the A projection
/// (fused with the query's when there is a low-rank query), `q_a_layernorm`, `q_b_proj` or
/// `q_proj`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`.
pub(crate) fn load(
    ld: &mut Loader,
    cfg: &ModelConfig,
    d: &DeepseekShape,
    shard: &TpShard,
    a: &str,
) -> Result<MlaAttention> {
    let h = cfg.hidden_size;
    let (first, heads) = local_heads(cfg, shard);
    let (lat, rope, qk) = (d.kv_lora_rank, d.qk_rope_head_dim, d.qk_head_dim());
    let kv_a = format!("{a}.kv_a_proj_with_mqa.weight");
    let latent = d.latent_dim();
    let (names, full, parts) = match d.q_lora_rank {
        Some(r) => (
            vec![format!("{a}.q_a_proj.weight"), kv_a.clone(), kv_a],
            vec![r, latent, latent],
            vec![(0, r), (0, lat), (lat, rope)],
        ),
        None => (
            vec![kv_a.clone(), kv_a],
            vec![latent, latent],
            vec![(0, lat), (lat, rope)],
        ),
    };
    let fused_name = match d.q_lora_rank {
        Some(_) => format!("{a}.fused_qkv_a_proj.weight"),
        None => format!("{a}.kv_a_proj_with_mqa.weight"),
    };
    // A block-wise fp8 checkpoint fills the fused parameter shard by shard, `q_a_proj`
    // then `kv_a_proj_with_mqa` whole (their grids 12 + 5 rows for V3's 1536 + 576: the
    // last shard's block may be partial, 0.19.0 utils/fp8_utils.py L1458-1473).
    let (names, full, parts) = if ld.fp8_block().is_some() {
        let n = names.len();
        (
            names[..n - 1].to_vec(),
            full[..n - 1].to_vec(),
            full[..n - 1].iter().map(|&f| (0, f)).collect(),
        )
    } else {
        (names, full, parts)
    };
    let a_proj = ld.fused_parts(&names, &full, &parts, h, &fused_name)?;
    let (q_a_layernorm, q) = match d.q_lora_rank {
        Some(r) => {
            let norm = ld.dense(&format!("{a}.q_a_layernorm.weight"), &[r])?;
            let q = ld.linear_slice(
                &format!("{a}.q_b_proj.weight"),
                Slice::rows(cfg.num_heads * qk, r, first * qk, heads * qk),
            )?;
            (Some(norm), q)
        }
        None => (
            None,
            ld.linear_slice(
                &format!("{a}.q_proj.weight"),
                Slice::rows(cfg.num_heads * qk, h, first * qk, heads * qk),
            )?,
        ),
    };
    let kv_a_layernorm = ld.dense(&format!("{a}.kv_a_layernorm.weight"), &[lat])?;
    let kvw = d.qk_nope_head_dim + d.v_head_dim;
    let kv_b = ld.linear_slice(
        &format!("{a}.kv_b_proj.weight"),
        Slice::rows(cfg.num_heads * kvw, lat, first * kvw, heads * kvw),
    )?;
    let o = ld.linear_slice(
        &format!("{a}.o_proj.weight"),
        Slice::cols(
            h,
            cfg.num_heads * d.v_head_dim,
            first * d.v_head_dim,
            heads * d.v_head_dim,
        ),
    )?;
    Ok(MlaAttention {
        a_proj,
        q_a_layernorm,
        q,
        kv_a_layernorm,
        kv_b,
        o,
        kv_b_dequantized: None,
    })
}

pub use crate::engine::rules::MlaModelRules;

/// How one MLA layer runs in a pass.
pub struct MlaRun<'a> {
    pub positions: &'a [usize],
    pub seq_lens: &'a [usize],
    pub act: DType,
    pub generation: u32,
    pub eps: f32,
    pub rope: YarnRope,
    /// vLLM V1's profile run: attention skipped, its workspace transient `W` tokens long.
    pub skip: Option<usize>,
    /// 0.33's TRITON_MLA in the profile run: the bytes its `reserve_workspace` asks of the
    /// shared workspace (`ops_moe_v1::grow_workspace`), and that workspace.
    pub logits_reserve: Option<(u64, &'a RefCell<Option<Tensor>>)>,
}

/// `MultiHeadLatentAttentionWrapper.forward` (0.19 layers/mla.py L116-177) on `x`, which stays
/// with the caller: the A projection (`qkv_lora`, alive until the layer returns: its parts are
/// views), `q_a_layernorm` of the query's part into a new tensor and `q_b_proj` (or `q_proj`
/// of `x`), `kv_a_layernorm` of the latent into a new tensor, the rotary embedding in place
/// on the rope part of each query head and on the rope key, the attention (skipped in V1's
/// profile run), `o_proj` and its all-reduce; the locals die as the layer returns.
pub fn forward(
    rt: &Runtime,
    attn: &MlaAttention,
    cfg: &ModelConfig,
    (d, shard): (&DeepseekShape, &TpShard),
    x: &Tensor,
    run: &MlaRun,
    l: &str,
) -> Result<Tensor> {
    let (gen, act) = (run.generation, run.act);
    let (_, heads) = local_heads(cfg, shard);
    let (lat, rope, qk) = (d.kv_lora_rank, d.qk_rope_head_dim, d.qk_head_dim());
    let a_out = attn
        .a_proj
        .forward(rt, x, &format!("{l}.qkv_a_proj"), gen, act)?;
    let (q_c, kv_c, mut k_pe) = match d.q_lora_rank {
        Some(r) => {
            let mut v = FusedLinear::split(
                &a_out,
                &[r, lat, rope],
                &["q_c", "kv_c", "k_pe"].map(|n| format!("{l}.{n}")),
            )
            .into_iter();
            let (Some(q_c), Some(kv_c), Some(k_pe)) = (v.next(), v.next(), v.next()) else {
                unreachable!("three parts");
            };
            (Some(q_c), kv_c, k_pe)
        }
        None => {
            let mut v = FusedLinear::split(
                &a_out,
                &[lat, rope],
                &["kv_c", "k_pe"].map(|n| format!("{l}.{n}")),
            )
            .into_iter();
            let (Some(kv_c), Some(k_pe)) = (v.next(), v.next()) else {
                unreachable!("two parts");
            };
            (None, kv_c, k_pe)
        }
    };
    let kv_norm = || {
        ops::rms_norm(
            rt,
            &kv_c,
            &attn.kv_a_layernorm,
            run.eps,
            &format!("{l}.kv_a_layernorm"),
        )
    };
    let q_c_normed = match (&q_c, &attn.q_a_layernorm) {
        (Some(q_c), Some(norm)) => Some(ops::rms_norm(
            rt,
            q_c,
            norm,
            run.eps,
            &format!("{l}.q_a_layernorm"),
        )?),
        _ => None,
    };
    // From 0.27 the latent is normalised before the query's projection.
    let early = if rt.mla_rules().kv_norm_first {
        Some(kv_norm()?)
    } else {
        None
    };
    let mut q = match &q_c_normed {
        Some(n) => attn.q.forward(rt, n, &format!("{l}.q_b_proj"), gen, act)?,
        None => attn.q.forward(rt, x, &format!("{l}.q_proj"), gen, act)?,
    };
    let kv_c_normed = match early {
        Some(n) => n,
        None => kv_norm()?,
    };
    ops_mla::rope_interleaved(
        rt,
        &mut q,
        (heads, qk, d.qk_nope_head_dim),
        run.positions,
        &run.rope,
    )?;
    ops_mla::rope_interleaved(rt, &mut k_pe, (1, rope, 0), run.positions, &run.rope)?;
    let out = match run.skip {
        Some(w) => {
            let out = ops_mla::attention_skipped(
                rt,
                &q,
                (heads, d.v_head_dim, [w, d.qk_nope_head_dim + d.v_head_dim]),
                &format!("{l}.attn"),
            )?;
            // mla_attention.py 0.33.0 L934-948: after the kv_b_proj transient,
            // `self.impl.reserve_workspace()`.
            if let Some((bytes, ws)) = run.logits_reserve {
                rt.set_op("mla.reserve_workspace (TRITON_MLA decode logits)");
                crate::engine::ops_moe_v1::grow_workspace(rt, ws, bytes, true)?;
            }
            out
        }
        None => {
            let kv = attn
                .kv_b
                .forward(rt, &kv_c_normed, &format!("{l}.kv_b_proj"), gen, act)?;
            let dims = MlaDims {
                heads,
                qk_nope: d.qk_nope_head_dim,
                qk_rope: rope,
                v_head: d.v_head_dim,
                scale: d.softmax_scale() as f32,
            };
            let o = ops_mla::prefill_attention(
                rt,
                &q,
                &kv,
                &k_pe,
                run.seq_lens,
                dims,
                &format!("{l}.attn"),
            )?;
            drop(kv);
            o
        }
    };
    let o = attn.o.forward(rt, &out, &format!("{l}.o_proj"), gen, act)?;
    let o = crate::engine::ops_tp::all_reduce(rt, o, &format!("{l}.o_proj.all_reduce"))?;
    drop(out);
    drop((q, kv_c_normed, q_c_normed));
    drop((q_c, kv_c, k_pe));
    drop(a_out);
    Ok(o)
}

//! Llama 4's attention (`Llama4Attention`, vLLM model_executor/models/llama4.py at 0.11.0 and
//! 0.19.0): `qkv_proj` and `o_proj` without bias as Llama's; on RoPE layers the rotary
//! embedding (one cache shared by them all, `get_rope`), the weightless L2 norm of each q/k
//! head (`use_qk_norm`) and chunked local attention (`ChunkedLocalAttention` with
//! `attention_chunk_size`); on NoPE layers no rotary, no norm, full causal attention, and q
//! scaled by the attention temperature (`attn_temperature_tuning`).

use crate::base::error::{Error, Result};
use crate::device::cpu::AttnShape;
use crate::engine::ops_llama4;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::model::config::{Llama4Shape, ModelConfig};
use crate::model::layers::tp::TpShard;
use crate::model::loader::{Loader, Slice};
use crate::quant::{FusedLinear, Linear};

/// One layer's attention parameters on this rank.
pub struct Llama4Attention {
    pub qkv: FusedLinear,
    pub o: Linear,
    /// Whether the layer turns q and k (a RoPE, local layer) or not (NoPE, global).
    pub rope: bool,
}

impl Llama4Attention {
    pub fn weight_bytes(&self) -> u64 {
        self.qkv.weight_bytes() + self.o.weight_bytes()
    }
}

/// Layer `l`'s parameters in `Llama4Attention.__init__`'s order (llama4.py 0.19 L199-233):
/// `qkv_proj` (this rank's q, k and v rows stacked), `o_proj` (its columns). `p` is the
/// layer's checkpoint prefix (`model.layers.3`, or under `language_model.`).
pub(crate) fn load(
    ld: &mut Loader,
    cfg: &ModelConfig,
    s: &Llama4Shape,
    shard: &TpShard,
    (l, p): (usize, &str),
) -> Result<Llama4Attention> {
    let (h, q, kv) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim());
    let (q_part, kv_part) = (shard.q_rows(cfg), shard.kv_rows(cfg));
    let qkv = ld.fused_parts(
        &["q_proj", "k_proj", "v_proj"].map(|n| format!("{p}.self_attn.{n}.weight")),
        &[q, kv, kv],
        &[q_part, kv_part, kv_part],
        h,
        &format!("{p}.self_attn.qkv_proj.weight"),
    )?;
    let o = ld.linear_slice(
        &format!("{p}.self_attn.o_proj.weight"),
        Slice::cols(h, q, q_part.0, q_part.1),
    )?;
    Ok(Llama4Attention {
        qkv,
        o,
        rope: s.uses_rope(l),
    })
}

/// How a layer's attention runs in a pass.
pub struct Llama4AttentionRun<'a> {
    pub positions: &'a [usize],
    pub seq_lens: &'a [usize],
    /// This rank's heads.
    pub shape: AttnShape,
    /// The rotary embedding's inverse frequencies (`head_dim / 2`).
    pub inv_freq: &'a [f64],
    pub shapes: &'a Llama4Shape,
    pub eps: f32,
    /// vLLM V1's profile run: the attention returns zeros without running.
    pub skip: bool,
    pub generation: u32,
    pub act: DType,
}

/// `Llama4Attention.forward` (llama4.py 0.19 L242-265) on `x`: qkv and its split views, the
/// rotary embedding in place (RoPE layers), the L2 norms into new q and k (RoPE layers with
/// `use_qk_norm`; the views stay with qkv), the temperature into a new q (NoPE layers),
/// attention (chunked on RoPE layers), o_proj and its all-reduce; q, k, v, qkv and the
/// attention output die as it returns.
pub fn forward(
    rt: &Runtime,
    attn: &Llama4Attention,
    x: &Tensor,
    run: &Llama4AttentionRun,
    l: &str,
) -> Result<Tensor> {
    let (gen, act, shape) = (run.generation, run.act, run.shape);
    let qkv = attn
        .qkv
        .forward(rt, x, &format!("{l}.qkv_proj"), gen, act)?;
    let (q_dim, kv_dim) = (
        shape.heads * shape.head_dim,
        shape.kv_heads * shape.head_dim,
    );
    let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
    let mut it = FusedLinear::split(&qkv, &[q_dim, kv_dim, kv_dim], &names).into_iter();
    let (Some(mut q), Some(mut k), Some(v)) = (it.next(), it.next(), it.next()) else {
        return Err(Error::Request(format!("{l}: qkv split")));
    };
    let s = run.shapes;
    if attn.rope {
        ops_llama4::rope_interleaved(rt, &mut q, &mut k, run.positions, shape, run.inv_freq)?;
        if s.use_qk_norm {
            let hd = shape.head_dim;
            q = ops_llama4::l2_norm_heads(rt, &q, hd, run.eps, &format!("{l}.q_norm"))?;
            k = ops_llama4::l2_norm_heads(rt, &k, hd, run.eps, &format!("{l}.k_norm"))?;
        }
    } else if s.attn_temperature_tuning {
        q = ops_llama4::temperature_tune(
            rt,
            &q,
            run.positions,
            (s.floor_scale, s.attn_scale),
            &format!("{l}.q_scaled"),
        )?;
    }
    let chunk = s.attention_chunk_size.filter(|_| attn.rope);
    let a = if run.skip {
        crate::engine::ops::attention_skipped(rt, &q, &format!("{l}.attn"))?
    } else {
        ops_llama4::attention(
            rt,
            (&q, &k, &v),
            run.seq_lens,
            chunk,
            shape,
            &format!("{l}.attn"),
        )?
    };
    let o = attn.o.forward(rt, &a, &format!("{l}.o_proj"), gen, act)?;
    let o = crate::engine::ops_tp::all_reduce(rt, o, &format!("{l}.o_proj.all_reduce"))?;
    drop((q, k, v));
    drop(qkv);
    drop(a);
    Ok(o)
}

/// The rotary embedding's inverse frequencies `θ^(−2i / d)`, scaled as Llama 3's
/// `rope_scaling` says (`Llama3RotaryEmbedding._compute_inv_freq`).
pub fn inv_freq(cfg: &ModelConfig, s: &Llama4Shape) -> Vec<f64> {
    let d = cfg.head_dim;
    (0..d / 2)
        .map(|i| {
            let f = 1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64);
            s.rope_llama3.map_or(f, |r| r.scale_inv_freq(f))
        })
        .collect()
}

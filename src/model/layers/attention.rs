//! The attention block as vLLM's Llama-shaped model files build it (`LlamaAttention` and the
//! classes made like it): `qkv_proj` a `QKVParallelLinear` (q, k and v stacked in one
//! parameter), its bias, `o_proj` a `RowParallelLinear`, optional per-head q/k norms, the rotary
//! embedding (`get_rope`), and the `Attention` layer with its scale tensors and, under fp8, its
//! KV-cache quantization method (`model_executor/layers/attention/`, `quantization/kv_cache.py`).

use super::norm::RmsNormKind;
use super::rotary::rotary_cache;
use crate::base::error::{Error, Result};
use crate::device::cpu::AttnShape;
use crate::engine::ops;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
use crate::model::config::ModelConfig;
use crate::model::loader::{Loader, Slice};
use crate::quant::{FusedLinear, Linear};

/// vLLM's `LlamaAttention` (llama.py at 380e1863): `qkv_proj` is a `QKVParallelLinear`, q, k
/// and v stacked into one parameter.
pub struct Attention {
    pub qkv: FusedLinear,
    pub o: Linear,
    /// The `[q + 2·kv]` bias of `qkv_proj` (Qwen2-style `attention_bias`).
    pub bias: Option<Tensor>,
    /// Qwen3's `q_norm` and `k_norm` (`[head_dim]` each, whole on every rank).
    pub qk_norm: Option<(Tensor, Tensor)>,
}

impl Attention {
    pub fn weight_bytes(&self) -> u64 {
        self.qkv.weight_bytes()
            + self.o.weight_bytes()
            + self.bias.as_ref().map_or(0, |t| t.nbytes())
            + self
                .qk_norm
                .as_ref()
                .map_or(0, |(q, k)| q.nbytes() + k.nbytes())
    }
}

/// How one attention layer is built: this rank's rows of q and of k/v, and the family's and
/// the quantization's twists.
pub struct AttentionBuild {
    pub q_part: (usize, usize),
    pub kv_part: (usize, usize),
    /// The checkpoint stores q, k and v as one `qkv_proj` (Phi-3).
    pub fused_checkpoint: bool,
    pub qk_norm: bool,
    /// `q_norm`/`k_norm` are made before the rotary embedding (Gemma3Attention, gemma3.py
    /// L144-170 at 0.8.5) rather than after the attention layer (Qwen3Attention).
    pub qk_norm_first: bool,
    /// The fp8 KV-cache method's scale tensors are made (`Fp8KVCacheMethod`).
    pub fp8: bool,
    /// Block-wise fp8 (0.8.5's `BaseKVCacheMethod`: four scales, not two).
    pub block_fp8: bool,
    /// `LoadOptions::attn_scalars`: the release's 0-dim scale tensors per attention layer.
    pub attn_scalars: usize,
}

/// What the model keeps of its attention layers' construction beside their weights.
#[derive(Default)]
pub struct AttentionState {
    /// The rotary caches, one per distinct (base, scaling): the first sliding layer's and the
    /// first scaled global layer's (Gemma 3), or the one every layer shares.
    pub rope_cache: Option<Tensor>,
    pub rope_cache_global: Option<Tensor>,
    /// Every attention layer's 0-dim f32 scale tensors.
    pub attn_scalars: Vec<Tensor>,
    /// Each layer's fp8 KV-cache scales, until `process_weights_after_loading` drops them.
    pub kv_scales: Vec<Vec<Tensor>>,
}

/// Layer `l`'s attention parameters in the order vLLM's constructor makes them: qkv_proj,
/// its bias, o_proj, then (per family) q/k norms, the rotary cache with the first layer that
/// needs it, the attention layer's scale tensors and its KV-cache method's.
pub(crate) fn load(
    ld: &mut Loader,
    rt: &Runtime,
    cfg: &ModelConfig,
    l: usize,
    how: &AttentionBuild,
    state: &mut AttentionState,
) -> Result<Attention> {
    let (h, q, kv) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim());
    let (q_part, kv_part) = (how.q_part, how.kv_part);
    let act = ld.act;
    let p = format!("model.layers.{l}");
    let qkv_name = format!("{p}.self_attn.qkv_proj.weight");
    let qkv = if how.fused_checkpoint {
        // This rank's q, k and v rows of the stored [q + 2·kv, h] tensor
        // (QKVParallelLinear.weight_loader with no shard id cuts it the same way).
        let all = q + 2 * kv;
        ld.fused_parts(
            &[qkv_name.clone(), qkv_name.clone(), qkv_name.clone()],
            &[all; 3],
            &[
                q_part,
                (q + kv_part.0, kv_part.1),
                (q + kv + kv_part.0, kv_part.1),
            ],
            h,
            &qkv_name,
        )?
    } else {
        ld.fused_parts(
            &[
                format!("{p}.self_attn.q_proj.weight"),
                format!("{p}.self_attn.k_proj.weight"),
                format!("{p}.self_attn.v_proj.weight"),
            ],
            &[q, kv, kv],
            &[q_part, kv_part, kv_part],
            h,
            &qkv_name,
        )?
    };
    let bias = if cfg.attention_bias {
        Some(ld.dense_concat_parts(
            &[
                format!("{p}.self_attn.q_proj.bias"),
                format!("{p}.self_attn.k_proj.bias"),
                format!("{p}.self_attn.v_proj.bias"),
            ],
            &[q, kv, kv],
            &[q_part, kv_part, kv_part],
            &format!("{p}.self_attn.qkv_proj.bias"),
        )?)
    } else {
        None
    };
    // RowParallelLinear: this rank's columns (the heads it computed).
    let o = ld.linear_slice(
        &format!("{p}.self_attn.o_proj.weight"),
        Slice::cols(h, q, q_part.0, q_part.1),
    )?;
    let mut qk_norm = None;
    for pass in [true, false] {
        if pass == how.qk_norm_first && how.qk_norm {
            let hd = cfg.head_dim;
            qk_norm = Some((
                ld.dense(&format!("{p}.self_attn.q_norm.weight"), &[hd])?,
                ld.dense(&format!("{p}.self_attn.k_norm.weight"), &[hd])?,
            ));
        }
        if pass == how.qk_norm_first {
            continue;
        }
        // One cache per distinct (base, scaling): Gemma 3's first sliding layer makes the
        // local one, its first global layer the scaled global one.
        let (theta, factor) = cfg.layer_rope(l);
        let global = factor != 1.0 || theta != cfg.layer_rope(0).0;
        if !global && state.rope_cache.is_none() {
            state.rope_cache = Some(rotary_cache(rt, cfg, act, (theta, factor))?);
        } else if global && state.rope_cache_global.is_none() {
            state.rope_cache_global = Some(rotary_cache(rt, cfg, act, (theta, factor))?);
        }
        // `Attention.__init__`: the release's 0-dim scale tensors, then (fp8) its KV cache
        // method's.
        state
            .attn_scalars
            .extend(crate::model::loader::attention_scalars(
                rt,
                &format!("{p}.self_attn.attn"),
                how.attn_scalars,
            )?);
        // Under fp8 the attention layer gets `Fp8KVCacheMethod`, whose `create_weights` makes
        // `k_scale` and `v_scale` as `torch.tensor(-1.0)` on the device (0.6.4 kv_cache.py
        // L22-31): two 0-dim f32 tensors, deleted by its `process_weights_after_loading`
        // (L67-68).
        if how.fp8 {
            rt.set_op("load");
            let s = |n: &str| {
                rt.tensor(
                    format!("{p}.self_attn.attn.{n}"),
                    Category::Weight,
                    &[],
                    DType::F32,
                )
            };
            if how.block_fp8 {
                // 0.8.5's `BaseKVCacheMethod.create_weights` makes four, q, k, v and prob
                // (kv_cache.py L35-43); kept in the order L134-137 deletes them.
                let (q, k, v, prob) = (
                    s("q_scale")?,
                    s("k_scale")?,
                    s("v_scale")?,
                    s("prob_scale")?,
                );
                state.kv_scales.push(vec![k, v, q, prob]);
            } else {
                state.kv_scales.push(vec![s("k_scale")?, s("v_scale")?]);
            }
        }
    }
    Ok(Attention {
        qkv,
        o,
        bias,
        qk_norm,
    })
}

/// How one layer's attention runs in a pass.
pub struct AttentionRun<'a> {
    /// Each token's position in its sequence.
    pub positions: &'a [usize],
    pub seq_lens: &'a [usize],
    /// This rank's heads, with the layer's score modifications (scale, soft-cap, window).
    pub shape: AttnShape,
    /// The layer's rotary base and linear scaling.
    pub rope: (f64, f64),
    /// The model's dynamic, YaRN or Llama 3 rope scaling, which replaces the plain
    /// frequencies (linear scaling is `rope`'s factor).
    pub scaling: Option<crate::model::config::RopeScaling>,
    /// The norm of the per-head q/k norms, and its eps.
    pub qk_norm: RmsNormKind,
    pub eps: f32,
    /// vLLM V1's profile run: the attention returns zeros without running.
    pub skip: bool,
    pub generation: u32,
    pub act: DType,
}

/// `LlamaAttention.forward` on `x`: qkv, its split views (and bias), the per-head q/k norms
/// (new tensors; the split views stay with qkv), rotary in place, attention, o_proj and its
/// all-reduce over ranks; q, k, v, qkv and the attention output die as it returns.
pub fn forward(
    rt: &Runtime,
    attn: &Attention,
    x: &Tensor,
    run: &AttentionRun,
    l: &str,
) -> Result<Tensor> {
    let (gen, act) = (run.generation, run.act);
    let qkv = attn
        .qkv
        .forward(rt, x, &format!("{l}.qkv_proj"), gen, act)?;
    let (q_dim, kv_dim) = (
        run.shape.heads * run.shape.head_dim,
        run.shape.kv_heads * run.shape.head_dim,
    );
    let rows = [q_dim, kv_dim, kv_dim];
    let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
    let mut qkv_views = FusedLinear::split(&qkv, &rows, &names);
    if let Some(b) = &attn.bias {
        let bias_names = ["q", "k", "v"].map(|n| format!("{l}.{n}_bias"));
        for (x, bv) in qkv_views
            .iter_mut()
            .zip(FusedLinear::split_flat(b, &rows, &bias_names))
        {
            ops::add_bias(rt, x, &bv)?;
        }
    }
    let mut it = qkv_views.into_iter();
    let (Some(mut q), Some(mut k), Some(v)) = (it.next(), it.next(), it.next()) else {
        return Err(Error::Request("qkv split".into()));
    };
    // Qwen3Attention.forward: `q_norm` over each head of q (a new tensor), then `k_norm` over
    // each head of k. Gemma3Attention.forward the same with GemmaRMSNorm (gemma3.py L192-197
    // at 0.8.5).
    if let Some((qn, kn)) = &attn.qk_norm {
        q = run
            .qk_norm
            .apply(rt, &q, qn, run.eps, &format!("{l}.q_norm"))?;
        k = run
            .qk_norm
            .apply(rt, &k, kn, run.eps, &format!("{l}.k_norm"))?;
    }
    match run.scaling.as_ref().filter(|r| r.rope_type != "linear") {
        Some(r) => {
            let inv_freq = r.inv_freq(run.shape.head_dim, run.rope.0);
            let table = (inv_freq.as_slice(), r.mscale());
            ops::rope_scaled(rt, &mut q, &mut k, run.positions, run.shape, table)?
        }
        None => ops::rope(rt, &mut q, &mut k, run.positions, run.shape, run.rope)?,
    }
    let a = if run.skip {
        ops::attention_skipped(rt, &q, &format!("{l}.attn"))?
    } else {
        ops::attention(
            rt,
            &q,
            &k,
            &v,
            run.seq_lens,
            run.shape,
            &format!("{l}.attn"),
        )?
    };
    let o = attn.o.forward(rt, &a, &format!("{l}.o_proj"), gen, act)?;
    // RowParallelLinear.forward: the partial sums of the ranks, all-reduced.
    let o = crate::engine::ops_tp::all_reduce(rt, o, &format!("{l}.o_proj.all_reduce"))?;
    drop((q, k, v));
    drop(qkv);
    drop(a);
    Ok(o)
}

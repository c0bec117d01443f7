//! Qwen3-Next's two token mixers as vLLM's qwen3_next.py builds them (0.10.2 and 0.11.0;
//! 0.19.0 moves the Gated DeltaNet to model_executor/layers/mamba/gdn_linear_attn.py):
//!
//! - the Gated DeltaNet (`Qwen3NextGatedDeltaNet`, 0.10.2 L183-620): `conv1d`, one merged
//!   `in_proj` over the checkpoint's `in_proj_qkvz` and `in_proj_ba` (two weights from 0.11),
//!   `dt_bias`, `A_log` (f32; the model dtype under 0.15), the gated RMSNorm and `out_proj`;
//!   per sequence a conv state and a recurrent state kept in the KV cache manager's mamba
//!   groups;
//! - the gated full attention (`Qwen3NextAttention`, L622-736): `qkv_proj` whose query part
//!   holds each head's query and output gate, per-head `(1 + w)` norms of q and k, a partial
//!   rotary embedding, and `sigmoid(gate)` on the attention's output before `o_proj`.

use super::tp::TpShard;
use crate::base::error::Result;
use crate::engine::ops_gdn::{self, GdnDims};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_gemma, ops_tp};
use crate::model::config::{ModelConfig, Qwen3NextShape};
use crate::model::loader::{Loader, Slice};
use crate::quant::{FusedLinear, Linear};

/// The Gated DeltaNet's input projections: 0.10.2's merged `in_proj` (`[qkvz / tp | ba / tp,
/// hidden]`, one GEMM whose output is split into views), or from 0.11 `in_proj_qkvz` and
/// `in_proj_ba`, two weights and two GEMMs (`engine::rules::GdnRules::split_in_proj`).
#[allow(clippy::large_enum_variant)]
pub enum InProj {
    Merged(FusedLinear),
    Split { qkvz: Linear, ba: Linear },
}

impl InProj {
    pub fn weight_bytes(&self) -> u64 {
        match self {
            InProj::Merged(f) => f.weight_bytes(),
            InProj::Split { qkvz, ba } => qkvz.weight_bytes() + ba.weight_bytes(),
        }
    }
}

/// One Gated DeltaNet layer's weights on this rank.
pub struct GatedDeltaNet {
    /// `[conv_dim / tp, 1, kernel]`: this rank's q, k and v channels.
    pub conv1d: Tensor,
    pub in_proj: InProj,
    pub dt_bias: Tensor,
    /// f32 (`torch.empty(..., dtype=torch.float32)`, L285-289), the model dtype under 0.15.
    pub a_log: Tensor,
    /// `RMSNormGated`'s weight `[v_dim]`.
    pub norm: Tensor,
    /// `[hidden, value_dim / tp]`
    pub out_proj: Linear,
    pub dims: GdnDims,
    /// This rank's widths of the two projections.
    pub qkvz: usize,
    pub ba: usize,
    /// 0.19's prefill-kernel warm-up has run in this layer (`_prefill_kernels_warmed_up`,
    /// gdn_linear_attn.py L594-596: once per layer instance).
    pub warmed_up: std::cell::Cell<bool>,
}

impl GatedDeltaNet {
    pub fn weight_bytes(&self) -> u64 {
        self.conv1d.nbytes()
            + self.in_proj.weight_bytes()
            + self.dt_bias.nbytes()
            + self.a_log.nbytes()
            + self.norm.nbytes()
            + self.out_proj.weight_bytes()
    }
}

/// The Gated DeltaNet's shape on a rank of `tp`.
pub fn gdn_dims(q: &Qwen3NextShape, tp: usize) -> GdnDims {
    GdnDims {
        k_heads: q.linear_num_key_heads / tp,
        v_heads: q.linear_num_value_heads / tp,
        k_dim: q.linear_key_head_dim,
        v_dim: q.linear_value_head_dim,
        kernel: q.linear_conv_kernel_dim,
    }
}

/// Loads layer `a`'s Gated DeltaNet (`model.layers.0.linear_attn`) in the order
/// `Qwen3NextGatedDeltaNet.__init__` makes its parameters (0.10.2 L208-311): `conv1d`,
/// `in_proj`, `dt_bias`, `A_log`, `norm`, `out_proj`.
pub(crate) fn load_gdn(
    ld: &mut Loader,
    cfg: &ModelConfig,
    q: &Qwen3NextShape,
    (shard, rules): (&TpShard, crate::engine::rules::GdnRules),
    a: &str,
) -> Result<GatedDeltaNet> {
    let (h, tp, r) = (cfg.hidden_size, shard.size, shard.rank);
    let d = gdn_dims(q, tp);
    let (kw, vw) = (q.key_dim(), q.value_dim());
    let (kl, vl) = (kw / tp, vw / tp);
    let conv_full = [q.conv_dim(), 1, q.linear_conv_kernel_dim];
    let conv1d = ld.dense_row_parts(
        &format!("{a}.conv1d.weight"),
        &conv_full,
        &[(r * kl, kl), (kw + r * kl, kl), (2 * kw + r * vl, vl)],
        (&[d.conv_dim(), 1, d.kernel], ld.act),
        &format!("{a}.conv1d.weight"),
    )?;
    let (qkvz_full, ba_full) = (2 * kw + 2 * vw, 2 * q.linear_num_value_heads);
    let (qkvz, ba) = (qkvz_full / tp, ba_full / tp);
    let in_proj = if rules.split_in_proj {
        InProj::Split {
            qkvz: ld.linear_slice(
                &format!("{a}.in_proj_qkvz.weight"),
                Slice::rows(qkvz_full, h, r * qkvz, qkvz),
            )?,
            ba: ld.linear_slice(
                &format!("{a}.in_proj_ba.weight"),
                Slice::rows(ba_full, h, r * ba, ba),
            )?,
        }
    } else {
        InProj::Merged(ld.fused_parts(
            &[
                format!("{a}.in_proj_qkvz.weight"),
                format!("{a}.in_proj_ba.weight"),
            ],
            &[qkvz_full, ba_full],
            &[(r * qkvz, qkvz), (r * ba, ba)],
            h,
            &format!("{a}.in_proj.weight"),
        )?)
    };
    let hv = q.linear_num_value_heads;
    let heads = [(r * d.v_heads, d.v_heads)];
    let dt_bias = ld.dense_row_parts(
        &format!("{a}.dt_bias"),
        &[hv],
        &heads,
        (&[d.v_heads], ld.act),
        &format!("{a}.dt_bias"),
    )?;
    let a_log = ld.dense_row_parts(
        &format!("{a}.A_log"),
        &[hv],
        &heads,
        (
            &[d.v_heads],
            if rules.a_log_in_act {
                ld.act
            } else {
                DType::F32
            },
        ),
        &format!("{a}.A_log"),
    )?;
    let norm = ld.dense(&format!("{a}.norm.weight"), &[d.v_dim])?;
    let out_proj = ld.linear_slice(
        &format!("{a}.out_proj.weight"),
        Slice::cols(h, vw, r * vl, vl),
    )?;
    Ok(GatedDeltaNet {
        conv1d,
        in_proj,
        dt_bias,
        a_log,
        norm,
        out_proj,
        dims: d,
        qkvz,
        ba,
        warmed_up: std::cell::Cell::new(false),
    })
}

/// How a mixer runs in one pass.
pub struct MixerRun<'a> {
    pub positions: &'a [usize],
    pub seq_lens: &'a [usize],
    pub act: DType,
    pub generation: u32,
    pub eps: f32,
    /// vLLM V1's profile run: no attention metadata.
    pub skip: bool,
    /// The process has run Triton's autotune for the warm-up's kernels (the model's flag:
    /// autotune results are process-wide).
    pub autotuned: &'a std::cell::Cell<bool>,
}

/// `Qwen3NextGatedDeltaNet._forward` (0.10.2 L395-620) into `out` (the layer's
/// `self_attention_output`), a prefill of every sequence from a zero state. In V1's profile
/// run it returns before anything (L401-403: `attn_metadata is None`; 0.11.0 the same), so
/// `out` stays as made. Otherwise: `in_proj` (`[T, qkvz | ba]`, split into views), the
/// reordering into `mixed_qkv`, z, b and a, the causal convolution, `beta` and `g`, the
/// sequences' `initial_state` gathered from the cache (`ssm_state[indices].contiguous()`,
/// zeroed where there is no prior state), the chunked delta rule, its final states written
/// back into the cache in the cache's dtype (a converted copy), the gated norm, `out_proj`
/// and its all-reduce, copied into `out`; every local dies as the function returns.
pub fn gdn_forward(
    rt: &Runtime,
    g: &GatedDeltaNet,
    x: &Tensor,
    out: Option<&mut Tensor>,
    run: &MixerRun,
    l: &str,
) -> Result<Option<Tensor>> {
    if run.skip {
        if rt.gdn_rules().profile_projections {
            return profile_forward(rt, g, x, out, run, l);
        }
        return Ok(None);
    }
    let (gen, act) = (run.generation, run.act);
    let d = g.dims;
    let (proj, qkvz, ba) = project(rt, g, x, run, l)?;
    let (mixed, z, b, a) = ops_gdn::reorder_qkvz(rt, &qkvz, &ba, d, l)?;
    let w = g
        .conv1d
        .part(format!("{l}.conv1d.w"), 0, &[d.conv_dim(), d.kernel]);
    let conv = ops_gdn::causal_conv1d(
        rt,
        &mixed,
        &w,
        run.seq_lens,
        d.kernel,
        &format!("{l}.conv_out"),
    )?;
    drop(w);
    let (gate, beta) = ops_gdn::gating(rt, &a, &b, (&g.a_log, &g.dt_bias), l)?;
    let n = run.seq_lens.len();
    let initial = rt.tensor(
        format!("{l}.initial_state"),
        crate::memory::Category::Activation,
        &[n, d.v_heads, d.k_dim, d.v_dim],
        act,
    )?;
    let (core, final_state) = ops_gdn::chunk_gated_delta_rule(
        rt,
        &conv,
        (&gate, &beta),
        run.seq_lens,
        d,
        &format!("{l}.delta_rule"),
    )?;
    // `ssm_state[indices] = last_recurrent_state.to(ssm_state.dtype)` (L580-582).
    rt.set_op("gdn.write_state");
    let written = rt.tensor(
        format!("{l}.final_state.to_cache_dtype"),
        crate::memory::Category::Activation,
        &final_state.shape,
        act,
    )?;
    drop(written);
    let normed = ops_gdn::gated_rms_norm(rt, &core, &z, &g.norm, run.eps, &format!("{l}.norm"))?;
    let o = g
        .out_proj
        .forward(rt, &normed, &format!("{l}.out_proj"), gen, act)?;
    let o = ops_tp::all_reduce(rt, o, &format!("{l}.out_proj.all_reduce"))?;
    let o = deliver(rt, out, o)?;
    drop((normed, final_state, core, initial, gate, beta, conv));
    drop((mixed, z, b, a, qkvz, ba));
    drop(proj);
    Ok(o)
}

/// The mixer's result: copied into the decoder's `self_attention_output` where the release
/// has one (`output[:num_tokens] = ...`, the result dying), or returned (0.26 on).
fn deliver(rt: &Runtime, out: Option<&mut Tensor>, o: Tensor) -> Result<Option<Tensor>> {
    match out {
        Some(out) => {
            ops_gdn::copy_rows(rt, out, &o)?;
            drop(o);
            Ok(None)
        }
        None => Ok(Some(o)),
    }
}

/// The input projections: the merged GEMM's output and its two views (0.10.2), or the two
/// GEMMs' outputs, `[T, qkvz]` then `[T, ba]` (0.11 on).
fn project(
    rt: &Runtime,
    g: &GatedDeltaNet,
    x: &Tensor,
    run: &MixerRun,
    l: &str,
) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    let (gen, act) = (run.generation, run.act);
    match &g.in_proj {
        InProj::Merged(f) => {
            let proj = f.forward(rt, x, &format!("{l}.in_proj"), gen, act)?;
            let mut parts = FusedLinear::split(
                &proj,
                &[g.qkvz, g.ba],
                &[format!("{l}.qkvz"), format!("{l}.ba")],
            )
            .into_iter();
            let (Some(qkvz), Some(ba)) = (parts.next(), parts.next()) else {
                unreachable!("two parts");
            };
            Ok((Some(proj), qkvz, ba))
        }
        InProj::Split { qkvz, ba } => {
            let q = qkvz.forward(rt, x, &format!("{l}.in_proj_qkvz"), gen, act)?;
            let b = ba.forward(rt, x, &format!("{l}.in_proj_ba"), gen, act)?;
            Ok((None, q, b))
        }
    }
}

/// The Gated DeltaNet in V1's profile run from 0.15, where only `gdn_attention_core` returns
/// early (0.15.1 models/qwen3_next.py L440-495; 0.19.0 layers/mamba/gdn_linear_attn.py
/// L489-565; docs/reading/vllm-qwen3-next-v1.md §2-3), in eager order: the two projections,
/// the reordering's copies and `mixed_qkv` (`ops_gdn::reorder_qkvz_eager`), the zeroed
/// `core_attn_out [T, vh, dv]`; inside the op 0.19's prefill-kernel warm-up on the layer's first
/// metadata-less call, then `empty_cache()`; the gated norm over the zeros (a new tensor; the
/// zeros die as the name is rebound), `out_proj` and its all-reduce copied into `out`; every
/// local dies as `forward` returns. The layer's output is zeros, as vLLM's is.
fn profile_forward(
    rt: &Runtime,
    g: &GatedDeltaNet,
    x: &Tensor,
    out: Option<&mut Tensor>,
    run: &MixerRun,
    l: &str,
) -> Result<Option<Tensor>> {
    let d = g.dims;
    if d.k_heads < 2 {
        return Err(crate::base::error::Error::Request(format!(
            "{l}: one Gated DeltaNet key head on this rank: vLLM's reordering then makes views, not copies (0.15.1 qwen3_next.py L370-419), which is not modelled; use fewer tensor-parallel ranks"
        )));
    }
    let (gen, act) = (run.generation, run.act);
    let (proj, qkvz, ba) = project(rt, g, x, run, l)?;
    let r = ops_gdn::reorder_qkvz_eager(rt, &qkvz, &ba, d, l)?;
    let t = x.rows();
    let core = ops_gdn::zeros(
        rt,
        &format!("{l}.core_attn_out"),
        &[t, d.v_heads, d.v_dim],
        act,
    )?;
    let rules = rt.gdn_rules();
    if let Some(backend) = rules.warmup {
        if !g.warmed_up.replace(true) {
            let w = ops_gdn::Warmup {
                backend,
                autotunes: !run.autotuned.replace(true),
                state: act,
                post_conv: rules.warmup_post_conv,
                flashinfer_variants: rules.flashinfer_variants,
            };
            ops_gdn::warmup_prefill(rt, d, act, &w, l)?;
        }
    }
    // The norm runs over `[T·vh, dv]` rows of the zeros and of z (`reshape`s: views); 0.15
    // and 0.19 rebind `core_attn_out` to its output, 0.21 keeps the zeros to the return.
    let normed = ops_gdn::gated_rms_norm(rt, &core, &r.z, &g.norm, run.eps, &format!("{l}.norm"))?;
    let core = if rules.zeros_live_to_return {
        Some(core)
    } else {
        drop(core);
        None
    };
    let flat = normed.part(format!("{l}.norm.flat"), 0, &[t, d.v_heads * d.v_dim]);
    let o = g
        .out_proj
        .forward(rt, &flat, &format!("{l}.out_proj"), gen, act)?;
    let o = ops_tp::all_reduce(rt, o, &format!("{l}.out_proj.all_reduce"))?;
    let o = deliver(rt, out, o)?;
    drop((flat, normed));
    drop(core);
    drop(r);
    drop((qkvz, ba, proj));
    Ok(o)
}

/// One gated attention layer's weights on this rank.
pub struct GatedAttention {
    /// `[q_gate | k | v]` rows: this rank's heads' queries and gates (`2 · heads · hd`), its
    /// KV heads' keys and values.
    pub qkv: FusedLinear,
    pub o: Linear,
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    /// This rank's heads and KV heads.
    pub heads: usize,
    pub kv_heads: usize,
}

impl GatedAttention {
    pub fn weight_bytes(&self) -> u64 {
        self.qkv.weight_bytes()
            + self.o.weight_bytes()
            + self.q_norm.nbytes()
            + self.k_norm.nbytes()
    }
}

/// Loads layer `a`'s attention (`model.layers.3.self_attn`) in the order
/// `Qwen3NextAttention.__init__` makes it (0.10.2 L624-701): `qkv_proj`, `o_proj`, then (after
/// the rotary embedding and the attention layer, the caller's) `q_norm`, `k_norm`.
pub(crate) fn load_attention(
    ld: &mut Loader,
    cfg: &ModelConfig,
    shard: &TpShard,
    a: &str,
) -> Result<(FusedLinear, Linear, usize, usize)> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let heads = cfg.num_heads / shard.size;
    let kv_heads = shard.local_kv_heads(cfg);
    let (kv_first, kv_len) = shard.kv_rows(cfg);
    let qg = 2 * heads * hd;
    let kv_full = cfg.num_kv_heads * hd;
    let qkv = ld.fused_parts(
        &[
            format!("{a}.q_proj.weight"),
            format!("{a}.k_proj.weight"),
            format!("{a}.v_proj.weight"),
        ],
        &[2 * cfg.num_heads * hd, kv_full, kv_full],
        &[
            (shard.rank * qg, qg),
            (kv_first, kv_len),
            (kv_first, kv_len),
        ],
        h,
        &format!("{a}.qkv_proj.weight"),
    )?;
    let o = ld.linear_slice(
        &format!("{a}.o_proj.weight"),
        Slice::cols(h, cfg.num_heads * hd, shard.rank * heads * hd, heads * hd),
    )?;
    Ok((qkv, o, heads, kv_heads))
}

/// `Qwen3NextAttention.forward` (0.10.2 L703-736) into `out`: `qkv_proj` (split into views),
/// the query and gate out of their per-head interleaving (new tensors), `q_norm` and `k_norm`
/// (`GemmaRMSNorm` per head, new tensors), the partial rotary embedding in place, the
/// attention (zeros in V1's profile run), `sigmoid(gate)` and the product, `o_proj` and its
/// all-reduce, copied into `out`.
pub fn attention_forward(
    rt: &Runtime,
    at: &GatedAttention,
    cfg: &ModelConfig,
    x: &Tensor,
    out: Option<&mut Tensor>,
    run: &MixerRun,
    l: &str,
) -> Result<Option<Tensor>> {
    let (gen, act, hd) = (run.generation, run.act, cfg.head_dim);
    let (heads, kvh) = (at.heads, at.kv_heads);
    let qkv = at.qkv.forward(rt, x, &format!("{l}.qkv_proj"), gen, act)?;
    let mut parts = FusedLinear::split(
        &qkv,
        &[2 * heads * hd, kvh * hd, kvh * hd],
        &["q_gate", "k", "v"].map(|n| format!("{l}.{n}")),
    )
    .into_iter();
    let (Some(q_gate), Some(k), Some(v)) = (parts.next(), parts.next(), parts.next()) else {
        unreachable!("three parts");
    };
    let (q, gate, mut qn, mut kn) = match rt.gdn_rules().fused_qk_norm_rope_gate {
        Some(tiny) => {
            let (qn, kn, gate) = ops_gdn::fused_qk_norm_gate(
                rt,
                (&q_gate, &k),
                (&at.q_norm, &at.k_norm),
                run.eps,
                (heads, kvh, hd),
                tiny,
                l,
            )?;
            (None, gate, qn, kn)
        }
        None => {
            let (q, gate) = ops_gdn::split_q_gate(rt, &q_gate, (heads, hd), l)?;
            let qn = ops_gemma::rms_norm(rt, &q, &at.q_norm, run.eps, &format!("{l}.q_norm"))?;
            let kn = ops_gemma::rms_norm(rt, &k, &at.k_norm, run.eps, &format!("{l}.k_norm"))?;
            (Some(q), gate, qn, kn)
        }
    };
    let shape = crate::device::cpu::AttnShape {
        heads,
        kv_heads: kvh,
        head_dim: hd,
        mods: Default::default(),
    };
    ops::rope_partial(
        rt,
        &mut qn,
        &mut kn,
        run.positions,
        shape,
        (cfg.rope_theta, 1.0),
        cfg.rotary_dim(),
    )?;
    let attn = if run.skip {
        ops::attention_skipped(rt, &qn, &format!("{l}.attn"))?
    } else {
        ops::attention(rt, &qn, &kn, &v, run.seq_lens, shape, &format!("{l}.attn"))?
    };
    let gated = ops_gdn::sigmoid_gate(rt, &attn, &gate, &format!("{l}.attn_gated"))?;
    let o = at.o.forward(rt, &gated, &format!("{l}.o_proj"), gen, act)?;
    let o = ops_tp::all_reduce(rt, o, &format!("{l}.o_proj.all_reduce"))?;
    let o = deliver(rt, out, o)?;
    drop((gated, attn, kn, qn, gate, q));
    drop((q_gate, k, v));
    drop(qkv);
    Ok(o)
}

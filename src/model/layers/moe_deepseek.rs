//! DeepSeek's sparse block (`DeepseekV2MoE`, vLLM's model_executor/models/deepseek_v2.py for
//! deepseek_v2, deepseek_v3 and kimi_k2) as vLLM V1 runs it in the profile pass: the router,
//! the grouped top-k routing, the routed experts through the release's fused MoE, the shared
//! experts inside the fused-MoE op, `routed_scaling_factor` and the shared output applied in
//! place, the all-reduce over ranks.
//!
//! Per layer, M tokens (> 256, so no shared-experts stream and no clone), unquantized:
//! - 0.11.0: the gate outside the op (deepseek_v2.py L256); inside `moe_forward_shared`
//!   (fused_moe/layer.py L2164) the shared experts first (L2007-2011), then `select_experts`
//!   → `grouped_topk` (L1709-1721), then `fused_experts(inplace=True)` into the input;
//!   after the op `*=`, `+=` and the all-reduce (deepseek_v2.py L269-285).
//! - 0.15.1: SharedFusedMoE with `gate=self.gate` runs the gate inside the op
//!   (`is_internal_router`, deepseek_v2.py L334-343; layer.py L1785-1786), then the shared
//!   experts (L1846-1848), the routing (L1877) and the modular kernel; the router's logits
//!   die as `forward_impl` returns, before the routing's tensors.
//! - 0.19.0: the same through `DefaultMoERunner.forward_impl` (runner/default_moe_runner.py
//!   L772-825: gate L804, shared experts L488-489, routing L498); the routing's tensors die
//!   as `_apply_quant_method` returns, before the router's logits.

use std::cell::RefCell;

use super::mlp::{mlp_forward, GatedAct, MlpRun};
use super::tp::TpShard;
use crate::base::error::{Error, Result};
use crate::engine::ops_grouped_topk::{self, GroupedTopk, Scoring, TopkRelease};
use crate::engine::ops_moe::{self, Experts};
use crate::engine::ops_moe_v1::{self, MoeKernel};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
use crate::model::config::{DeepseekShape, ModelConfig, MoeShape};
use crate::model::loader::{Loader, Slice};
use crate::quant::{FusedLinear, Linear};

/// A DeepSeek MoE layer's parameters on this rank: the router (`[E, H]`, whole on every rank,
/// model dtype), `e_score_correction_bias` (f32 `[E]`, `noaux_tc` only), `FusedMoE`'s
/// `w13_weight [E, 2·I, H]` and `w2_weight [E, H, I]` (I: this rank's share of
/// `moe_intermediate_size`), and the shared experts.
pub struct DeepseekMoe {
    pub gate: Tensor,
    pub e_score_correction_bias: Option<Tensor>,
    pub w13: Tensor,
    pub w2: Tensor,
    pub shared: Option<DeepseekShared>,
}

/// `shared_experts`: a `DeepseekV2MLP` of `n_shared_experts · moe_intermediate_size` with
/// `reduce_results=False`; `width` is this rank's share.
pub struct DeepseekShared {
    pub gate_up: FusedLinear,
    pub down: Linear,
    pub width: usize,
}

impl DeepseekMoe {
    /// Bytes of every parameter of the layer.
    pub fn weight_bytes(&self) -> u64 {
        let shared = self
            .shared
            .as_ref()
            .map_or(0, |s| s.gate_up.weight_bytes() + s.down.weight_bytes());
        self.gate.nbytes()
            + self.e_score_correction_bias.as_ref().map_or(0, |b| b.nbytes())
            + self.w13.nbytes()
            + self.w2.nbytes()
            + shared
    }

    fn experts(&self, m: &MoeShape) -> Experts<'_> {
        Experts {
            w13: &self.w13,
            w2: &self.w2,
            num_experts: m.num_experts,
            width: self.w2.shape.last().copied().unwrap_or(0),
        }
    }
}

fn shapes<'a>(cfg: &'a ModelConfig, p: &str) -> Result<(&'a MoeShape, &'a DeepseekShape)> {
    match (&cfg.moe, &cfg.deepseek) {
        (Some(m), Some(d)) => Ok((m, d)),
        _ => Err(Error::Request(format!(
            "{p}: a DeepSeek MoE layer needs the config's routed experts and DeepSeek fields"
        ))),
    }
}

/// A DeepSeek MoE layer's parameters in the order `DeepseekV2MoE.__init__` makes them (0.19.0
/// deepseek_v2.py L263-336; 0.11.0 L158-240 the same): the gate, `e_score_correction_bias`
/// (`torch.empty(E, dtype=float32)`, L268-273), the shared experts' `gate_up_proj` and
/// `down_proj` (L293-306), then `FusedMoE`'s `w13_weight` and `w2_weight` (L308-336). `p` is
/// the layer's prefix (`model.layers.3`).
// Called by models/deepseek_v2.rs, being written beside this.
#[allow(dead_code)]
pub(crate) fn load_deepseek_moe(
    ld: &mut Loader,
    cfg: &ModelConfig,
    shard: &TpShard,
    p: &str,
) -> Result<DeepseekMoe> {
    let (m, d) = shapes(cfg, p)?;
    let (h, e, width) = (cfg.hidden_size, m.num_experts, m.expert_intermediate_size);
    let gate = ld.dense(&format!("{p}.mlp.gate.weight"), &[e, h])?;
    let e_score_correction_bias = if d.topk_method == "noaux_tc" {
        Some(ld.dense_as(
            &format!("{p}.mlp.gate.e_score_correction_bias"),
            &[e],
            DType::F32,
        )?)
    } else {
        None
    };
    let shared = match d.n_shared_experts * width {
        0 => None,
        sw => {
            let (first, len) = shard.expert_rows(sw);
            let x = format!("{p}.mlp.shared_experts");
            let gate_up = ld.fused_parts(
                &[
                    format!("{x}.gate_proj.weight"),
                    format!("{x}.up_proj.weight"),
                ],
                &[sw, sw],
                &[(first, len), (first, len)],
                h,
                &format!("{x}.gate_up_proj.weight"),
            )?;
            let down = ld.linear_slice(
                &format!("{x}.down_proj.weight"),
                Slice::cols(h, sw, first, len),
            )?;
            Some(DeepseekShared {
                gate_up,
                down,
                width: len,
            })
        }
    };
    let (first, len) = shard.expert_rows(width);
    let x = |ex: usize, n: &str| format!("{p}.mlp.experts.{ex}.{n}.weight");
    let w13_parts: Vec<(String, Slice)> = (0..e)
        .flat_map(|ex| {
            ["gate_proj", "up_proj"].map(|n| (x(ex, n), Slice::rows(width, h, first, len)))
        })
        .collect();
    let w13 = ld.stacked(
        &w13_parts,
        &[e, 2 * len, h],
        &format!("{p}.mlp.experts.w13_weight"),
    )?;
    let w2_parts: Vec<(String, Slice)> = (0..e)
        .map(|ex| (x(ex, "down_proj"), Slice::cols(h, width, first, len)))
        .collect();
    let w2 = ld.stacked(&w2_parts, &[e, h, len], &format!("{p}.mlp.experts.w2_weight"))?;
    Ok(DeepseekMoe {
        gate,
        e_score_correction_bias,
        w13,
        w2,
        shared,
    })
}

/// A DeepSeek MoE layer on `x` (`[M, H]`, the post-attention norm's output) as the release of
/// `kernel` runs it: `MoeKernel::InPlace` for 0.11.0, `MoeKernel::Modular` for 0.15.1 and
/// 0.19.0 (with the model's persistent `workspace`; its `chunk_tokens` tells 0.15.1, with
/// chunking, from 0.19.0). Returns the layer's output; `x` dies as the layer rebinds its
/// hidden states (it is the output itself under 0.11.0 with one rank). `layer` names the
/// tensors (`layers.3`), `gpu` picks the Triton config. The math equals Hugging Face's
/// `DeepseekV2Moe` / `DeepseekV3MoE`: the routing weights without the scaling factor, the
/// experts' sum multiplied by it, the shared experts' output added.
pub fn deepseek_moe_forward(
    rt: &Runtime,
    x: Tensor,
    moe: &DeepseekMoe,
    cfg: &ModelConfig,
    (act, kernel, workspace): (DType, MoeKernel, Option<&RefCell<Option<Tensor>>>),
    layer: &str,
    gpu: &str,
) -> Result<Tensor> {
    let (m, d) = shapes(cfg, layer)?;
    let scoring = match d.scoring_func.as_str() {
        "softmax" => Scoring::Softmax,
        "sigmoid" => Scoring::Sigmoid,
        other => {
            return Err(Error::Request(format!(
                "{layer}: scoring_func '{other}' (expected softmax or sigmoid)"
            )))
        }
    };
    let routing = GroupedTopk {
        top_k: m.top_k,
        n_group: d.n_group,
        topk_group: d.topk_group,
        scoring,
        renormalize: m.renormalize,
        bias: moe.e_score_correction_bias.as_ref(),
    };
    let name = format!("{layer}.moe");
    let router_logits = |x: &Tensor| {
        crate::quant::dense_matmul_as(
            rt,
            x,
            &moe.gate,
            &format!("{layer}.gate"),
            act,
            &format!("{layer}.moe.router_logits"),
            Category::Activation,
        )
    };
    let shared = |x: &Tensor| -> Result<Option<Tensor>> {
        moe.shared
            .as_ref()
            .map(|se| shared_experts_forward(rt, x, se, act, layer))
            .transpose()
    };
    let experts = moe.experts(m);
    match kernel {
        MoeKernel::InPlace { .. } => {
            let mut x = x;
            // The gate outside the op; inside it the shared experts, the routing and the
            // experts into `x`; the routing dies as `forward_cuda` returns.
            let logits = router_logits(&x)?;
            let shared = shared(&x)?;
            let r =
                ops_grouped_topk::grouped_topk(rt, &logits, &routing, TopkRelease::V0_11, &name)?;
            ops_moe::fused_experts(rt, &mut x, &experts, &r, gpu, &name)?;
            drop(r);
            let out = finish(rt, x, shared, (d, act), layer)?;
            // `forward` returns: router_logits, then (with the tuple) the shared output.
            let (out, shared) = out;
            drop(logits);
            drop(shared);
            Ok(out)
        }
        MoeKernel::Modular(how) => {
            let workspace = workspace.ok_or_else(|| {
                Error::Request(format!(
                    "{layer}: the modular fused MoE needs the model's workspace"
                ))
            })?;
            // 0.15.1 has activation chunking; 0.19.0 removed it.
            let v0_15 = how.chunk_tokens.is_some();
            let logits = router_logits(&x)?;
            let shared = shared(&x)?;
            let r = ops_grouped_topk::grouped_topk(rt, &logits, &routing, TopkRelease::V1, &name)?;
            let out =
                ops_moe_v1::fused_experts(rt, &x, &experts, &r, (how, gpu), workspace, &name)?;
            if v0_15 {
                // `forward_impl`'s locals: router_logits (an argument, rebound) before
                // topk_weights and topk_ids.
                drop(logits);
                drop(r);
            } else {
                drop(r);
                drop(logits);
            }
            let (out, shared) = finish(rt, out, shared, (d, act), layer)?;
            drop(shared);
            drop(x);
            Ok(out)
        }
    }
}

/// After the op (deepseek_v2.py 0.19.0 L376-395, 0.11.0 L269-285): `final_hidden_states *=
/// routed_scaling_factor` in place (in fp16 instead `shared_output *= 1 / factor`, the decoder
/// layer rescaling its residual), `+= shared_output` in place, then the all-reduce over ranks
/// (out of place: the op's output dies as the tuple holding it does, just after). Returns the
/// output and the shared output, which dies as `forward` returns.
fn finish(
    rt: &Runtime,
    mut routed: Tensor,
    mut shared: Option<Tensor>,
    (d, act): (&DeepseekShape, DType),
    layer: &str,
) -> Result<(Tensor, Option<Tensor>)> {
    let f = d.routed_scaling_factor;
    if act != DType::F16 {
        ops_grouped_topk::scale_in_place(rt, &mut routed, f)?;
    } else if let Some(s) = shared.as_mut() {
        ops_grouped_topk::scale_in_place(rt, s, 1.0 / f)?;
    }
    if let Some(s) = &shared {
        crate::engine::ops::add_assign(rt, &mut routed, s)?;
    }
    let out = crate::engine::ops_tp::all_reduce(rt, routed, &format!("{layer}.moe.all_reduce"))?;
    Ok((out, shared.take()))
}

/// The shared experts on the op's input as vLLM runs them inside the fused-MoE op
/// (`DeepseekV2MLP.forward`, deepseek_v2.py 0.19.0 L228-232): `gate_up_proj`, `SiluAndMul`
/// (its `forward_native` under torch.compile's default custom ops: a `silu` temporary, then
/// the product), `down_proj` without all-reduce; the activation dies as `x` is rebound, then
/// `gate_up` as the MLP returns.
fn shared_experts_forward(
    rt: &Runtime,
    x: &Tensor,
    se: &DeepseekShared,
    act: DType,
    layer: &str,
) -> Result<Tensor> {
    let how = MlpRun {
        width: se.width,
        act,
        activation: GatedAct::SiluNative,
        frees_gate_up: false,
        all_reduce: false,
        generation: 0,
    };
    mlp_forward(
        rt,
        x,
        (&se.gate_up, &se.down),
        &how,
        &format!("{layer}.shared_experts"),
    )
}

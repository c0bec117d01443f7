//! Llama 4's sparse block (`Llama4MoE`, vLLM model_executor/models/llama4.py 0.11.0 L60-128,
//! 0.19.0 L68-160): the router (`ReplicatedLinear [E, H]`, outside the fused op), a
//! `SharedFusedMoE` whose shared expert (a `LlamaMLP` of `intermediate_size`, no all-reduce)
//! runs inside the op before the routing, the routing by `custom_routing_function` (the best
//! expert's logit through a sigmoid, one expert a token), the experts on each token's input
//! scaled by its weight (`apply_router_weight_on_input`), then `routed_out + shared_out` into a
//! new tensor and the all-reduce over ranks.

use std::cell::RefCell;

use super::mlp::{load_gated, mlp_forward, GatedAct, MlpRun};
use super::tp::{ExpertPlacement, TpShard};
use crate::base::error::{Error, Result};
use crate::engine::ops_llama4;
use crate::engine::ops_moe::{self, Experts};
use crate::engine::ops_moe_v1::{self, MoeKernel};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
use crate::model::config::{ModelConfig, MoeShape};
use crate::model::loader::Loader;
use crate::quant::{FusedLinear, Linear};

/// A Llama 4 MoE layer's parameters on this rank.
pub struct Llama4Moe {
    /// `router.weight [E, H]`, whole on every rank.
    pub router: Tensor,
    pub shared_gate_up: FusedLinear,
    pub shared_down: Linear,
    /// This rank's share of the shared expert's width.
    pub shared_width: usize,
    /// `FusedMoE`'s `w13_weight [E, 2·I, H]` and `w2_weight [E, H, I]`.
    pub w13: Tensor,
    pub w2: Tensor,
    /// The routed experts this rank holds, and their `expert_map` with expert parallel.
    pub placement: ExpertPlacement,
    pub expert_map: Option<Tensor>,
}

impl Llama4Moe {
    pub fn weight_bytes(&self) -> u64 {
        self.router.nbytes()
            + self.shared_gate_up.weight_bytes()
            + self.shared_down.weight_bytes()
            + self.w13.nbytes()
            + self.w2.nbytes()
            + self.expert_map.as_ref().map_or(0, |t| t.nbytes())
    }

    fn experts(&self, _m: &MoeShape) -> Experts<'_> {
        Experts {
            weight_on_input: true,
            ..super::moe::experts_of(
                &self.w13,
                &self.w2,
                self.w2.shape.last().copied().unwrap_or(0),
                &self.placement,
            )
        }
    }
}

/// The layer's parameters in `Llama4MoE.__init__`'s order (0.19 L90-150): the router, the
/// shared expert (`gate_up_proj`, `down_proj`), then the experts' `w13_weight` and
/// `w2_weight` from the checkpoint's fused `experts.gate_up_proj [E, H, 2I]` (gate columns,
/// then up) and `experts.down_proj [E, I, H]`. `f` is the block's prefix
/// (`model.layers.3.feed_forward`).
pub(crate) fn load(
    ld: &mut Loader,
    cfg: &ModelConfig,
    shard: &TpShard,
    f: &str,
) -> Result<Llama4Moe> {
    let m = cfg
        .moe
        .as_ref()
        .ok_or_else(|| Error::Request(format!("{f}: a Llama 4 MoE layer with no experts")))?;
    let (h, e, i) = (cfg.hidden_size, m.num_experts, m.expert_intermediate_size);
    let router = ld.dense(&format!("{f}.router.weight"), &[e, h])?;
    let part = shard.shared_rows(i);
    let (shared_gate_up, shared_down) =
        load_gated(ld, &format!("{f}.shared_expert"), (h, i), part)?;
    let shared_width = part.1;
    let (first, len) = shard.expert_rows(i);
    let placement = shard.experts(e);
    let local = placement.first..placement.first + placement.local;
    let expert_map = super::moe::load_expert_map(ld, &placement, &format!("{f}.experts"))?;
    let w13 = ld.experts_transposed(
        &format!("{f}.experts.gate_up_proj"),
        [e, h, 2 * i],
        (&[(first, len), (i + first, len)], (0, h)),
        local.clone(),
        &format!("{f}.experts.w13_weight"),
    )?;
    let w2 = ld.experts_transposed(
        &format!("{f}.experts.down_proj"),
        [e, i, h],
        (&[(0, h)], (first, len)),
        local,
        &format!("{f}.experts.w2_weight"),
    )?;
    Ok(Llama4Moe {
        router,
        shared_gate_up,
        shared_down,
        shared_width,
        w13,
        w2,
        placement,
        expert_map,
    })
}

/// The block on `x` (`[M, H]`, the post-attention norm's output) as the release of `kernel`
/// runs it: the router's logits outside the op; inside it the shared expert, the routing,
/// the experts (0.11.0: in place into `x`; 0.15.1 and 0.19.0: the modular kernel into a new
/// output over the model's `workspace`), the routing dying as the op returns; then the sum
/// (a new tensor) and the all-reduce. The logits, the routed and the shared outputs die as
/// the block returns; `x` as the layer rebinds its hidden states.
pub fn forward(
    rt: &Runtime,
    mut x: Tensor,
    moe: &Llama4Moe,
    m: &MoeShape,
    (act, kernel, workspace): (DType, MoeKernel, &RefCell<Option<Tensor>>),
    layer: &str,
    gpu: &str,
) -> Result<Tensor> {
    let dp = crate::engine::ops_tp::moe_dp(rt);
    let name = format!("{layer}.moe");
    let logits = crate::quant::dense_matmul_as(
        rt,
        &x,
        &moe.router,
        &format!("{layer}.router"),
        act,
        &format!("{name}.router_logits"),
        Category::Activation,
    )?;
    let how = MlpRun {
        width: moe.shared_width,
        act,
        // Inside the fused-MoE op under torch.compile's default (custom ops off) `SiluAndMul`
        // runs `forward_native`, as for DeepSeek's shared experts (layers/moe_deepseek.rs);
        // `LlamaMLP` rebinds `x`, so gate_up dies before down_proj.
        activation: GatedAct::SiluNative,
        frees_gate_up: true,
        all_reduce: false,
        generation: 0,
    };
    let shared = mlp_forward(
        rt,
        &x,
        (&moe.shared_gate_up, &moe.shared_down),
        &how,
        &format!("{layer}.shared_expert"),
    )?;
    let mut routing = ops_llama4::sigmoid_top1(rt, &logits, &name)?;
    ops_llama4::weight_on_input(rt, &mut x, &mut routing)?;
    let experts = moe.experts(m);
    let routed = match (kernel, dp) {
        (MoeKernel::InPlace { .. }, None) => {
            ops_moe::fused_experts(rt, &mut x, &experts, &routing, gpu, &name)?;
            drop(routing);
            None
        }
        // With data parallel from 0.21 (`MoEPrepareAndFinalizeNaiveDPEPModular`): this
        // replica's tokens routed and weighted, then gathered
        // (docs/reading/vllm-ep-deepseek-llama4-v021.md §4.2).
        (MoeKernel::Modular(how), dp) if dp.is_none() || how.v0_21.is_some() => {
            let out = ops_moe_v1::fused_experts_on(
                rt,
                &x,
                &experts,
                &routing,
                (how, gpu),
                workspace,
                dp,
                &name,
            )?;
            drop(routing);
            Some(out)
        }
        _ => {
            return Err(Error::Request(format!(
                "{layer}: data parallel's token exchange around Llama 4's MoE layers is modelled from vLLM 0.21 (the dispatch after the routing); expert parallel without data parallel is modelled from 0.11"
            )))
        }
    };
    let sum = {
        let r = routed.as_ref().unwrap_or(&x);
        ops_llama4::add(rt, r, &shared, &format!("{name}.plus_shared"))?
    };
    let out = crate::engine::ops_tp::all_reduce(rt, sum, &format!("{name}.all_reduce"))?;
    drop(routed);
    drop(shared);
    drop(logits);
    drop(x);
    Ok(out)
}

//! vLLM's sparse mixture-of-experts block (`model_executor/layers/fused_moe/`): the router, the
//! top-k routing, the fused experts over `FusedMoE`'s two stacked parameters, and Qwen2-MoE's
//! shared expert beside them.

use super::mlp::{mlp_forward, GatedAct, MlpRun};
use super::tp::{ExpertPlacement, TpShard};
use std::cell::RefCell;

use crate::base::error::Result;
use crate::engine::ops_moe;
use crate::engine::ops_moe_v1::{self, Modular, MoeKernel};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
use crate::model::config::{ModelConfig, MoeShape};
use crate::model::loader::{Loader, NamedSlice, Slice};
use crate::model::models::registry::MoeNames;
use crate::quant::{FusedLinear, Linear};

/// vLLM's `MixtralMoE` / `Qwen3MoeSparseMoeBlock`: the router (`ReplicatedLinear [E, H]`,
/// whole on every rank) and `FusedMoE`'s two stacked parameters, `w13_weight [E, 2·I, H]`
/// and `w2_weight [E, H, I]` (I: this rank's share of each expert's width).
pub struct MoeBlock {
    /// The router: 16-bit, or fp8 where vLLM quantizes it (Qwen3-MoE's under online fp8).
    pub gate: Linear,
    pub w13: Tensor,
    pub w2: Tensor,
    /// Block-wise fp8 experts' `w13_weight_scale_inv` and `w2_weight_scale_inv`.
    pub fp8_scales: Option<[Tensor; 2]>,
    /// Online fp8 experts' per-expert `w13_weight_scale` and `w2_weight_scale`.
    pub fp8_tensor: Option<crate::quant::fp8_moe::Fp8MoeScales>,
    /// Qwen2-MoE's shared expert and its gate.
    pub shared: Option<SharedExpert>,
    /// The routed experts this rank holds (all of them without expert parallel).
    pub placement: ExpertPlacement,
    /// `FusedMoE`'s `expert_map` (int32 `[E]`) with expert parallel.
    pub expert_map: Option<Tensor>,
    /// The model hands its gate to the modular kernel's op (Qwen3-Next from 0.15:
    /// `SharedFusedMoE(gate=self.gate)` called with `router_logits=hidden_states`, 0.15.1
    /// models/qwen3_next.py L171-185, 0.19.0 L147-161): the router's logits are made inside
    /// the op, before the shared expert, and die as it returns, before the block's sum.
    pub gate_in_op: bool,
}

/// `FusedMoE.__init__`'s `expert_map` with expert parallel, made before `create_weights`
/// (0.11.0 fused_moe/layer.py L1043-1051, 0.19.0 L383-393): `torch.full((E,), -1, int32)`
/// under the model's device context, so on the GPU, `[E]` int32 per MoE layer; `None` without
/// expert parallel.
pub(crate) fn load_expert_map(
    ld: &mut Loader,
    placement: &ExpertPlacement,
    prefix: &str,
) -> Result<Option<Tensor>> {
    if !placement.mapped {
        return Ok(None);
    }
    ld.buffer(
        &format!("{prefix}.expert_map"),
        &[placement.global],
        DType::I32,
    )
    .map(Some)
}

/// The fused kernels' view of a rank's routed experts.
pub(crate) fn experts_of<'a>(
    w13: &'a Tensor,
    w2: &'a Tensor,
    width: usize,
    p: &ExpertPlacement,
) -> ops_moe::Experts<'a> {
    ops_moe::Experts {
        w13,
        w2,
        num_experts: p.local,
        width,
        first: p.first,
        global: p.global,
        mapped: p.mapped,
        fp8_block: None,
        fp8_tensor: None,
        weight_on_input: false,
    }
}

/// Qwen2-MoE's `shared_expert` (a `Qwen2MoeMLP` with `reduce_results=False`: this rank's
/// share of the width in `gate_up` and `down`) and `shared_expert_gate` (a plain
/// `torch.nn.Linear(H, 1)`, whole on every rank, in the model dtype).
pub struct SharedExpert {
    pub gate_up: FusedLinear,
    pub down: Linear,
    pub gate: Tensor,
    /// This rank's share of the shared expert's width.
    pub width: usize,
}

impl MoeBlock {
    /// The router's logits `[M, E]` (`self.gate(hidden_states)`, outside the fused op in
    /// every release here).
    fn router_logits(&self, rt: &Runtime, x: &Tensor, act: DType, layer: &str) -> Result<Tensor> {
        match &self.gate {
            Linear::Fp8(l) => l.forward(rt, x, &format!("{layer}.gate"), act, &[l.out_features]),
            Linear::Dense(w) => crate::quant::dense_matmul_as(
                rt,
                x,
                w,
                &format!("{layer}.gate"),
                act,
                &format!("{layer}.moe.router_logits"),
                Category::Activation,
            ),
            _ => Err(crate::base::error::Error::Request(format!(
                "{layer}.gate: a router that is neither 16-bit nor fp8"
            ))),
        }
    }

    /// The experts' weights as the fused kernels take them, for this rank's shape `m`.
    fn experts(&self, m: &MoeShape) -> ops_moe::Experts<'_> {
        ops_moe::Experts {
            fp8_block: self
                .fp8_scales
                .as_ref()
                .map(|[w13, w2]| ops_moe::Fp8BlockScales::new(w13, w2, self.w13.shape[2])),
            fp8_tensor: self.fp8_tensor.as_ref().map(|s| s.view()),
            ..experts_of(
                &self.w13,
                &self.w2,
                m.expert_intermediate_size,
                &self.placement,
            )
        }
    }
}

/// A sparse block on `x` as vLLM 0.8.5 runs it (`MixtralMoE.forward`, mixtral.py L99-106;
/// `Qwen3MoeSparseMoeBlock.forward`, qwen3_moe.py L128-143): the router's logits, the top-k
/// routing, the experts written into `x` in place (`inplace=True`), the routing's tensors
/// dying as `forward_cuda` returns, the all-reduce over ranks (inside `FusedMoE` for Mixtral,
/// in the block for Qwen3: the same point), then the logits as the block returns. The output
/// is `x` itself (a new tensor when the all-reduce is out of place). `m` is this rank's
/// shape (its share of each expert's width), `layer` names the tensors (`layers.3`), `gpu`
/// picks the Triton config.
pub fn moe_block_forward(
    rt: &Runtime,
    x: Tensor,
    block: &MoeBlock,
    m: &MoeShape,
    act: DType,
    layer: &str,
    gpu: &str,
) -> Result<Tensor> {
    let kernel = MoeKernel::InPlace {
        indices_freed_late: false,
    };
    moe_block_forward_as(rt, x, block, m, (act, kernel, None), layer, gpu)
}

/// `moe_block_forward` as a release runs it: the activation dtype, the release's fused MoE
/// and (for V1's modular kernel) the model's persistent workspace.
pub fn moe_block_forward_as(
    rt: &Runtime,
    mut x: Tensor,
    block: &MoeBlock,
    m: &MoeShape,
    (act, kernel, workspace): (DType, MoeKernel, Option<&RefCell<Option<Tensor>>>),
    layer: &str,
    gpu: &str,
) -> Result<Tensor> {
    if let MoeKernel::Modular(how) = kernel {
        return modular_block_forward(rt, x, block, m, (act, how, workspace), layer, gpu);
    }
    let indices_freed_late = matches!(
        kernel,
        MoeKernel::InPlace {
            indices_freed_late: true
        }
    );
    if let Some(dp) = crate::engine::ops_tp::moe_dp(rt) {
        return in_place_dp_forward(rt, x, block, m, (act, indices_freed_late, dp), layer, gpu);
    }
    let shared = match &block.shared {
        Some(se) => Some(shared_expert_forward(rt, &x, se, act, layer)?),
        None => None,
    };
    let logits = block.router_logits(rt, &x, act, layer)?;
    let name = format!("{layer}.moe");
    let routing = ops_moe::fused_topk(
        rt,
        &logits,
        m.top_k,
        m.renormalize,
        indices_freed_late,
        &name,
    )?;
    let experts = block.experts(m);
    ops_moe::fused_experts(rt, &mut x, &experts, &routing, gpu, &name)?;
    drop(routing);
    let Some(shared) = shared else {
        let out = crate::engine::ops_tp::all_reduce(rt, x, &format!("{layer}.moe.all_reduce"))?;
        drop(logits);
        return Ok(out);
    };
    // Qwen2-MoE: `final_hidden_states + shared_output`, a new tensor, then the all-reduce;
    // as the block returns, the shared output, then the router's logits die; the input (the
    // experts' output, in place) dies as the layer rebinds its hidden states.
    let sum = crate::engine::ops_opt::add(rt, &x, &shared, &format!("{layer}.moe.plus_shared"))?;
    let out = crate::engine::ops_tp::all_reduce(rt, sum, &format!("{layer}.moe.all_reduce"))?;
    drop(shared);
    drop(logits);
    drop(x);
    Ok(out)
}

/// The in-place block (0.11.0) with data parallel: the router's logits on this replica's
/// tokens, then `FusedMoE.forward_impl`'s naive dispatch (`do_naive_dispatch_combine`,
/// 0.11.0 fused_moe/layer.py L2001-2021: every replica's hidden states and logits gathered),
/// the routing and the experts in place over the gathered tokens, the combine into this
/// replica's `[M, H]` (the gathered tensors dying as `forward_impl` returns), then the
/// tensor-parallel all-reduce (L2066-2069).
fn in_place_dp_forward(
    rt: &Runtime,
    x: Tensor,
    block: &MoeBlock,
    m: &MoeShape,
    (act, indices_freed_late, dp): (DType, bool, usize),
    layer: &str,
    gpu: &str,
) -> Result<Tensor> {
    if block.shared.is_some() {
        return Err(crate::base::error::Error::Request(format!(
            "{layer}: a shared expert with data parallel is not modelled yet"
        )));
    }
    let logits = block.router_logits(rt, &x, act, layer)?;
    let name = format!("{layer}.moe");
    let (mut xg, lg) = crate::engine::ops_tp::dp_dispatch(rt, &x, &logits, dp, &name)?;
    let routing = ops_moe::fused_topk(rt, &lg, m.top_k, m.renormalize, indices_freed_late, &name)?;
    let experts = block.experts(m);
    ops_moe::fused_experts(rt, &mut xg, &experts, &routing, gpu, &name)?;
    drop(routing);
    let out = crate::engine::ops_tp::dp_combine(rt, &xg, dp, &name)?;
    drop(xg);
    drop(lg);
    let out = crate::engine::ops_tp::all_reduce(rt, out, &format!("{layer}.moe.all_reduce"))?;
    drop(logits);
    drop(x);
    Ok(out)
}

/// Mixtral's and Qwen3-MoE's block as vLLM V1 runs it with the modular kernel (0.15.1, 0.19.0;
/// docs/reading/vllm-v1-fused-moe.md §2.2-2.3): the router's logits outside the op, the
/// routing (three `[M, k]` tensors), the experts into a new output over the persistent
/// workspace, the routing dying as the op returns, the all-reduce outside the op, then the
/// logits as the block returns and the input as the layer rebinds its hidden states.
fn modular_block_forward(
    rt: &Runtime,
    x: Tensor,
    block: &MoeBlock,
    m: &MoeShape,
    (act, how, workspace): (DType, Modular, Option<&RefCell<Option<Tensor>>>),
    layer: &str,
    gpu: &str,
) -> Result<Tensor> {
    // Qwen2-MoE's shared expert runs inside the op, before the routing, in every release from
    // 0.15 (`shared_expert_in_op`; docs/reading/vllm-shared-experts-v1.md), from 0.21 with data
    // parallel too, on this replica's tokens; 0.15's and 0.19's runner dispatch with it is not
    // read.
    if block.shared.is_some() && crate::engine::ops_tp::moe_dp(rt).is_some() && how.v0_21.is_none()
    {
        return Err(crate::base::error::Error::Request(format!(
            "{layer}: a shared expert under vLLM 0.15's and 0.19's modular fused MoE with data parallel is not modelled (one GPU or tensor parallel; data parallel from 0.21)"
        )));
    }
    let workspace = workspace.ok_or_else(|| {
        crate::base::error::Error::Request(format!(
            "{layer}: the modular fused MoE needs the model's workspace"
        ))
    })?;
    let logits = block.router_logits(rt, &x, act, layer)?;
    let name = format!("{layer}.moe");
    // With data parallel the op runs on every replica's tokens (the naive dispatch of
    // `FusedMoE.forward_impl`, 0.19.0 fused_moe/layer.py), and combines back to this one's;
    // from 0.21 the modular kernel dispatches after the routing (`fused_experts_dispatched`).
    let dp = crate::engine::ops_tp::moe_dp(rt);
    let gathered = match dp.filter(|_| how.v0_21.is_none()) {
        Some(dp) => Some((
            crate::engine::ops_tp::dp_dispatch(rt, &x, &logits, dp, &name)?,
            dp,
        )),
        None => None,
    };
    let (xin, lin) = match &gathered {
        Some(((xg, lg), _)) => (xg, lg),
        None => (&x, &logits),
    };
    let shared = match &block.shared {
        Some(se) => Some(shared_expert_in_op(rt, &x, se, act, layer)?),
        None => None,
    };
    let routing = ops_moe_v1::fused_topk(rt, lin, m.top_k, m.renormalize, &name)?;
    let experts = block.experts(m);
    // From 0.21 nothing was gathered above, so `xin` is this replica's input.
    let mut out = ops_moe_v1::fused_experts_on(
        rt,
        xin,
        &experts,
        &routing,
        (how, gpu),
        workspace,
        dp.filter(|_| how.v0_21.is_some()),
        &name,
    )?;
    drop(routing);
    if let Some((_, dp)) = &gathered {
        let combined = crate::engine::ops_tp::dp_combine(rt, &out, *dp, &name)?;
        drop(std::mem::replace(&mut out, combined));
    }
    drop(gathered);
    // Under 0.21 Qwen3-MoE's gate runs inside the op (ops_moe_v1::RunnerV021), Qwen3-Next's
    // from 0.15 (`MoeBlock::gate_in_op`): its logits die as the op returns, before the sum
    // and the all-reduce.
    let mut logits = Some(logits);
    if block.gate_in_op || how.v0_21.is_some_and(|v| v.gate_in_op) {
        drop(logits.take());
    }
    if let Some(shared) = shared {
        if how.v0_21.is_none() {
            // Qwen2-MoE after the op under 0.15 and 0.19: the block sums the op's pair into a new
            // tensor, `final_hidden_states[0] + final_hidden_states[1]`, the rebinding dropping the
            // tuple, so the shared and the routed outputs die before the all-reduce (qwen2_moe.py
            // 0.15.1 L187-192, 0.19.0 the same; `maybe_all_reduce_tensor_model_parallel`, an
            // all-reduce into a new tensor where tp > 1); the router's logits as the block returns.
            let sum = crate::engine::ops_opt::add(
                rt,
                &shared,
                &out,
                &format!("{layer}.moe.plus_shared"),
            )?;
            drop(shared);
            drop(out);
            let red =
                crate::engine::ops_tp::all_reduce(rt, sum, &format!("{layer}.moe.all_reduce"))?;
            drop(logits);
            drop(x);
            return Ok(red);
        }
        // Qwen2-MoE after the op from 0.21 (`MoERunner.forward`, runner/moe_runner.py 0.29.0 L749-785):
        // `result = shared_output + fused_output`, a new tensor, all-reduced over ranks
        // (`_maybe_reduce_final_output`, the sum dying as it is rebound); as `forward`
        // returns its locals die, the shared output, then the routed one; the router's logits
        // as the block returns (qwen2_moe.py L179-192), the input as the layer rebinds it.
        let sum =
            crate::engine::ops_opt::add(rt, &shared, &out, &format!("{layer}.moe.plus_shared"))?;
        let red = crate::engine::ops_tp::all_reduce(rt, sum, &format!("{layer}.moe.all_reduce"))?;
        drop(shared);
        drop(out);
        drop(logits);
        drop(x);
        return Ok(red);
    }
    let out = crate::engine::ops_tp::all_reduce(rt, out, &format!("{layer}.moe.all_reduce"))?;
    drop(logits);
    drop(x);
    Ok(out)
}

/// Qwen2-MoE's shared expert as 0.15-0.33 run it, inside the fused-MoE op before the routing:
/// 0.29's `MoERunner._apply_quant_method` calls `SharedExperts` with `NO_OVERLAP` first
/// (runner/moe_runner.py 0.29.0 L592-612; 0.21.0-0.28.0 the same order, 0.19.0
/// runner/default_moe_runner.py L476-521, 0.15.1 fused_moe/layer.py L1844-1848), the order
/// for more than `VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD` (256) tokens or when the modular
/// kernel cannot overlap (`MoEPrepareAndFinalizeNoDPEPModular.supports_async` is False;
/// runner/shared_experts.py L105-133), and keeps its output until the op returns. The layer
/// is `Qwen2MoeMLP` with `expert_gate` (qwen2_moe.py 0.29.0 L73-118; 0.15.1 L108-116):
/// `gate_up_proj`, `SiluAndMul` (its `forward_native` compiled by Inductor into one tensor:
/// `ops::silu_and_mul_native`), `down_proj` without all-reduce, the activation
/// dying as `out` is rebound; then `F.sigmoid(self.expert_gate(x)[0]) * out` inside the same
/// `forward`, so `gate_up` is still held through the gate (0.8.5 scaled in the block, after
/// the MLP returned); `gate_up` dies as `forward` returns.
fn shared_expert_in_op(
    rt: &Runtime,
    x: &Tensor,
    se: &SharedExpert,
    act: DType,
    layer: &str,
) -> Result<Tensor> {
    let l = format!("{layer}.shared_expert");
    let i = se.width;
    let gate_up = se
        .gate_up
        .forward(rt, x, &format!("{l}.gate_up_proj"), 0, act)?;
    let names = ["gate", "up"].map(|n| format!("{l}.{n}"));
    let mut it = FusedLinear::split(&gate_up, &[i, i], &names).into_iter();
    let (Some(gate), Some(up)) = (it.next(), it.next()) else {
        return Err(crate::base::error::Error::Request(format!(
            "{l}: gate_up split"
        )));
    };
    let act_out = crate::engine::ops::silu_and_mul_native(rt, &gate, &up, &format!("{l}.act"))?;
    drop((gate, up));
    let out = se
        .down
        .forward(rt, &act_out, &format!("{l}.down_proj"), 0, act)?;
    drop(act_out);
    let g = crate::quant::dense_matmul_as(
        rt,
        x,
        &se.gate,
        &format!("{layer}.shared_expert_gate"),
        act,
        &format!("{layer}.shared_expert_gate.out"),
        Category::Activation,
    )?;
    let out = ops_moe::sigmoid_scale(rt, g, out, &l)?;
    drop(gate_up);
    Ok(out)
}

/// Qwen2-MoE's shared expert on the block's input, scaled by its gate, as vLLM 0.8.5 runs it
/// (qwen2_moe.py L90-94, L146-150): `gate_up_proj`, `SiluAndMul` into a new tensor, `down_proj`
/// (no all-reduce: `reduce_results=False`), the activation dying as `x` is rebound and
/// `gate_up` as the MLP returns; then `shared_expert_gate(x)` (`[M, 1]`), its sigmoid, the
/// gate's logit dying, the product with the shared output (a new `[M, H]`), the sigmoid and the
/// unscaled output dying. 16-bit weights only (MoE models are), so no quantized generation.
fn shared_expert_forward(
    rt: &Runtime,
    x: &Tensor,
    se: &SharedExpert,
    act: DType,
    layer: &str,
) -> Result<Tensor> {
    let how = MlpRun {
        width: se.width,
        act,
        activation: GatedAct::Silu,
        frees_gate_up: false,
        all_reduce: false,
        generation: 0,
    };
    let out = mlp_forward(
        rt,
        x,
        (&se.gate_up, &se.down),
        &how,
        &format!("{layer}.shared_expert"),
    )?;
    let g = crate::quant::dense_matmul_as(
        rt,
        x,
        &se.gate,
        &format!("{layer}.shared_expert_gate"),
        act,
        &format!("{layer}.shared_expert_gate.out"),
        Category::Activation,
    )?;
    ops_moe::sigmoid_scale(rt, g, out, &format!("{layer}.shared_expert"))
}

/// The routed experts' stacked `w13_weight [E, 2·len, H]` and `w2_weight [E, H, len]` of
/// this rank's experts (`local` of them, `len` of each expert's width), read from the
/// per-expert tensors `parts`; a block-wise fp8 checkpoint's codes with their
/// `weight_scale_inv` grids (`Loader::experts_fp8_block`). `prefix` is the layer's
/// `….experts`.
pub(crate) fn load_experts(
    ld: &mut Loader,
    parts: (&[NamedSlice], &[NamedSlice]),
    (local, len, h): (usize, usize, usize),
    prefix: &str,
) -> Result<(Tensor, Tensor, Option<[Tensor; 2]>)> {
    match ld.fp8_block() {
        Some(b) => {
            let [w13, w2, s13, s2] = ld.experts_fp8_block(parts, (local, len, h), prefix, b)?;
            Ok((w13, w2, Some([s13, s2])))
        }
        None => Ok((
            ld.stacked(
                parts.0,
                &[local, 2 * len, h],
                &format!("{prefix}.w13_weight"),
            )?,
            ld.stacked(parts.1, &[local, h, len], &format!("{prefix}.w2_weight"))?,
            None,
        )),
    }
}

/// A sparse block's parameters in the order vLLM 0.8.5 creates them: Mixtral's router, then
/// its experts (mixtral.py L80-97); Qwen3-MoE's experts, then its router (qwen3_moe.py
/// L113-126). `w13_weight` holds each expert's gate rows then its up rows, `w2_weight` each
/// expert's down columns, this rank's share of the width in both (`FusedMoE._load_w13`,
/// `_load_w2`, layer.py L579-613); the checkpoint names map through
/// `make_expert_params_mapping` (layer.py L890-906).
pub(crate) fn load_moe_block(
    ld: &mut Loader,
    cfg: &ModelConfig,
    (m, names): (&MoeShape, MoeNames),
    shard: &TpShard,
    p: &str,
) -> Result<MoeBlock> {
    let h = cfg.hidden_size;
    let MoeNames {
        block,
        experts: [gate_n, up_n, down_n],
        router_first,
    } = names;
    let width = m.expert_intermediate_size;
    let (first, len) = shard.expert_rows(width);
    let e = m.num_experts;
    let placement = shard.experts(e);
    let local = placement.first..placement.first + placement.local;
    // Online fp8 (`Fp8OnlineMoEMethod`): each part quantized as soon as it has loaded (vLLM
    // 0.19's layerwise processing, model_loader/reload/layerwise.py L131-182). Qwen3-MoE's
    // router is a `ReplicatedLinear` given the quant_config (qwen3_moe.py L176-182 at
    // 0.19.0), so an fp8 layer too; Mixtral's gets none (mixtral.py L120-126).
    let online = ld.fp8_online();
    let router = |ld: &mut Loader| -> Result<Linear> {
        let w = ld.dense(&format!("{p}.{block}.gate.weight"), &[e, h])?;
        if online && cfg.arch == "qwen3_moe" {
            let rt = ld.runtime();
            let q = crate::quant::fp8::Fp8Linear::quantize_in_flight(rt, &w)?;
            drop(w);
            return Ok(Linear::Fp8(q));
        }
        Ok(Linear::Dense(w))
    };
    let gate = if router_first {
        Some(router(ld)?)
    } else {
        None
    };
    let expert_map = load_expert_map(ld, &placement, &format!("{p}.{block}.experts"))?;
    // With expert parallel a rank reads only its own experts (`FusedMoE.weight_loader` skips
    // an expert whose `expert_map` entry is −1: `_map_global_expert_id_to_local_expert_id`).
    let x = |ex: usize, n: &str| format!("{p}.{block}.experts.{ex}.{n}.weight");
    let w13_parts: Vec<(String, Slice)> = local
        .clone()
        .flat_map(|ex| [gate_n, up_n].map(|n| (x(ex, n), Slice::rows(width, h, first, len))))
        .collect();
    let w2_parts: Vec<(String, Slice)> = local
        .map(|ex| (x(ex, down_n), Slice::cols(h, width, first, len)))
        .collect();
    let (w13, w2, fp8_scales) = super::moe::load_experts(
        ld,
        (&w13_parts, &w2_parts),
        (placement.local, len, h),
        &format!("{p}.{block}.experts"),
    )?;
    let (w13, w2, fp8_tensor) = if online {
        let prefix = format!("{p}.{block}.experts");
        let (q13, q2, s) = crate::quant::fp8_moe::quantize_experts(ld.runtime(), w13, w2, &prefix)?;
        (q13, q2, Some(s))
    } else {
        (w13, w2, None)
    };
    let gate = match gate {
        Some(g) => g,
        None => router(ld)?,
    };
    // Qwen2-MoE's shared expert, then its gate (qwen2_moe.py L126-138).
    let shared = match m.shared_expert_intermediate_size {
        0 => None,
        width => {
            let part = shard.shared_rows(width);
            let (gate_up, down) = super::mlp::load_gated(
                ld,
                &format!("{p}.{block}.shared_expert"),
                (h, width),
                part,
            )?;
            let len = part.1;
            let gate = ld.dense(&format!("{p}.{block}.shared_expert_gate.weight"), &[1, h])?;
            Some(SharedExpert {
                gate_up,
                down,
                gate,
                width: len,
            })
        }
    };
    Ok(MoeBlock {
        gate,
        w13,
        w2,
        fp8_scales,
        fp8_tensor,
        shared,
        placement,
        expert_map,
        gate_in_op: false,
    })
}

/// `swap_w13_to_w31` as `UnquantizedFusedMoEMethod._setup_kernel` runs it for FlashInfer's
/// CUTLASS MoE once every weight is loaded (0.21.0 oracle/unquantized.py L298-323,
/// quantization/utils/flashinfer_utils.py L44-47; 0.22.1 the same;
/// docs/reading/vllm-flashinfer-cutlass-moe.md §2): `flip` makes a new `[E, 2·I, H]`, the
/// layer's parameter is rebound to it, and the old `w13` dies as `_setup_kernel` returns. On
/// the host the copy keeps the gate-then-up order vramscope's experts read (the sum is the
/// same).
///
/// Block-wise fp8 experts (`prepare_fp8_moe_layer_for_fi`, 0.21.0
/// quantization/utils/flashinfer_utils.py; §9) swap their `w13_weight_scale_inv` grid too:
/// the new codes, the new grid, then the old codes and the old grid die as
/// `process_weights_after_loading` returns.
pub fn swap_w13_to_w31(
    rt: &Runtime,
    w13: &mut Tensor,
    fp8_scales: Option<&mut [Tensor; 2]>,
) -> Result<()> {
    rt.check_cancel()?;
    let copy = |t: &Tensor| -> Result<Tensor> {
        let mut swapped = rt.tensor_for_overwrite(
            t.name.clone(),
            crate::memory::Category::Weight,
            &t.shape,
            t.dtype,
        )?;
        if rt.backend() == crate::device::Backend::Cpu {
            swapped.f32_mut().copy_from_slice(t.f32());
        }
        Ok(swapped)
    };
    let swapped = copy(w13)?;
    let old = std::mem::replace(w13, swapped);
    let old_scale = match fp8_scales {
        Some([s13, _]) => {
            let swapped = copy(s13)?;
            Some(std::mem::replace(s13, swapped))
        }
        None => None,
    };
    drop(old);
    drop(old_scale);
    Ok(())
}

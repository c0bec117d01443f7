//! DeepSeek's sparse block (`DeepseekV2MoE`, vLLM's model_executor/models/deepseek_v2.py for
//! deepseek_v2, deepseek_v3 and kimi_k2) as vLLM V1 runs it in the profile pass: the router,
//! the grouped top-k routing, the routed experts through the release's fused MoE, the shared
//! experts inside the fused-MoE op, `routed_scaling_factor` and the shared output applied in
//! place, the all-reduce over ranks.
//!
//! Per layer, M tokens (> 256, so no shared-experts stream and no clone), unquantized:
//! - 0.11.0: the gate outside the op (deepseek_v2.py L254); inside `moe_forward_shared`
//!   (fused_moe/layer.py L2164) the shared experts first (L2007-2011), then `select_experts`
//!   → `grouped_topk` (L1709-1721), then `fused_experts(inplace=True)` into the input;
//!   after the op `*=`, `+=` and the all-reduce (deepseek_v2.py L266-285).
//! - 0.15.1: SharedFusedMoE with `gate=self.gate` runs the gate inside the op
//!   (`is_internal_router`, deepseek_v2.py L338-343; layer.py L1785-1786), then the shared
//!   experts (L1846-1848), the routing (L1877) and the modular kernel; the router's logits
//!   die as `forward_impl` returns, before the routing's tensors.
//! - 0.19.0: the same through `DefaultMoERunner.forward_impl` (runner/default_moe_runner.py
//!   L772-825: gate L804, shared experts L488-489, routing L498); the routing's tensors die
//!   as `_apply_quant_method` returns, before the router's logits.

use std::cell::RefCell;

use super::mlp::{mlp_forward, GatedAct, MlpRun};
use super::tp::{ExpertPlacement, TpShard};
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
    /// Block-wise fp8 experts' `w13_weight_scale_inv` and `w2_weight_scale_inv`.
    pub fp8_scales: Option<[Tensor; 2]>,
    pub shared: Option<DeepseekShared>,
    /// The routed experts this rank holds, and their `expert_map` with expert parallel.
    pub placement: ExpertPlacement,
    pub expert_map: Option<Tensor>,
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
            + self
                .e_score_correction_bias
                .as_ref()
                .map_or(0, |b| b.nbytes())
            + self.w13.nbytes()
            + self.w2.nbytes()
            + self.expert_map.as_ref().map_or(0, |t| t.nbytes())
            + self
                .fp8_scales
                .as_ref()
                .map_or(0, |[a, b]| a.nbytes() + b.nbytes())
            + shared
    }

    fn experts(&self, _m: &MoeShape) -> Experts<'_> {
        Experts {
            fp8_block: self.fp8_scales.as_ref().map(|[w13, w2]| {
                crate::engine::ops_moe::Fp8BlockScales::new(w13, w2, self.w13.shape[2])
            }),
            ..super::moe::experts_of(
                &self.w13,
                &self.w2,
                self.w2.shape.last().copied().unwrap_or(0),
                &self.placement,
            )
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
            let part = shard.shared_rows(sw);
            let (gate_up, down) =
                super::mlp::load_gated(ld, &format!("{p}.mlp.shared_experts"), (h, sw), part)?;
            Some(DeepseekShared {
                gate_up,
                down,
                width: part.1,
            })
        }
    };
    let (first, len) = shard.expert_rows(width);
    let placement = shard.experts(e);
    let local = placement.first..placement.first + placement.local;
    let expert_map = super::moe::load_expert_map(ld, &placement, &format!("{p}.mlp.experts"))?;
    let x = |ex: usize, n: &str| format!("{p}.mlp.experts.{ex}.{n}.weight");
    let w13_parts: Vec<(String, Slice)> = local
        .clone()
        .flat_map(|ex| {
            ["gate_proj", "up_proj"].map(|n| (x(ex, n), Slice::rows(width, h, first, len)))
        })
        .collect();
    let w2_parts: Vec<(String, Slice)> = local
        .map(|ex| (x(ex, "down_proj"), Slice::cols(h, width, first, len)))
        .collect();
    let (w13, w2, fp8_scales) = super::moe::load_experts(
        ld,
        (&w13_parts, &w2_parts),
        (placement.local, len, h),
        &format!("{p}.mlp.experts"),
    )?;
    Ok(DeepseekMoe {
        gate,
        e_score_correction_bias,
        w13,
        w2,
        fp8_scales,
        shared,
        placement,
        expert_map,
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
    let dp = crate::engine::ops_tp::moe_dp(rt);
    if dp.is_some() && !matches!(kernel, MoeKernel::Modular(h) if h.v0_21.is_some()) {
        return Err(Error::Request(format!(
            "{layer}: data parallel's token exchange around DeepSeek's MoE layers is modelled from vLLM 0.21 (the dispatch after the routing); expert parallel without data parallel is modelled from 0.11"
        )));
    }
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
            // From 0.27 a one-group router without a correction bias is a `FusedTopKRouter`
            // (the routed scaling factor applied after the op, as before).
            let one_group =
                routing.n_group <= 1 && routing.topk_group <= 1 && routing.bias.is_none();
            let r = if one_group
                && rt.mla_rules().one_group_fused_topk
                && matches!(routing.scoring, Scoring::Softmax)
            {
                ops_moe_v1::fused_topk(rt, &logits, routing.top_k, routing.renormalize, &name)?
            } else {
                ops_grouped_topk::grouped_topk(rt, &logits, &routing, TopkRelease::V1, &name)?
            };
            // With data parallel from 0.21 the gate, the shared experts and the routing run on
            // this replica's tokens, then the dispatch gathers the hidden states and the top-k
            // weights and ids (docs/reading/vllm-ep-deepseek-llama4-v021.md §3.2).
            let out = ops_moe_v1::fused_experts_on(
                rt,
                &x,
                &experts,
                &r,
                (how, gpu),
                workspace,
                dp,
                &name,
            )?;
            if v0_15 {
                // `forward_impl`'s locals: router_logits (an argument, rebound) before
                // topk_weights and topk_ids.
                drop(logits);
                drop(r);
            } else {
                drop(r);
                drop(logits);
            }
            if how.v0_21.is_some() {
                let out = finish_0_21(rt, out, shared, (d, act), layer)?;
                drop(x);
                return Ok(out);
            }
            let (out, shared) = finish(rt, out, shared, (d, act), layer)?;
            drop(shared);
            drop(x);
            Ok(out)
        }
    }
}

/// After the op under 0.21 (`MoERunner.forward`, runner/moe_runner.py 0.21.0 L650-690; the
/// same through 0.23.0): `_maybe_apply_routed_scale_to_output` scales the routed output in
/// place (the shared output by 1/factor instead in fp16 when there is one; only when the
/// factor is not 1), `result = shared_output + fused_output` is a new tensor (0.19 added in
/// place), then `_maybe_reduce_final_output` all-reduces it over ranks (out of place, the sum
/// dying as the function rebinds it) and returns a view; as `forward` returns, its locals
/// die in order: the shared output, then the routed one.
fn finish_0_21(
    rt: &Runtime,
    mut routed: Tensor,
    mut shared: Option<Tensor>,
    (d, act): (&DeepseekShape, DType),
    layer: &str,
) -> Result<Tensor> {
    let f = d.routed_scaling_factor;
    if f != 1.0 {
        match shared.as_mut() {
            Some(s) if act == DType::F16 => ops_grouped_topk::scale_in_place(rt, s, 1.0 / f)?,
            _ => ops_grouped_topk::scale_in_place(rt, &mut routed, f)?,
        }
    }
    let Some(s) = shared else {
        return crate::engine::ops_tp::all_reduce(rt, routed, &format!("{layer}.moe.all_reduce"));
    };
    let sum = crate::engine::ops_opt::add(rt, &s, &routed, &format!("{layer}.moe.plus_shared"))?;
    let out = crate::engine::ops_tp::all_reduce(rt, sum, &format!("{layer}.moe.all_reduce"))?;
    drop(s);
    drop(routed);
    Ok(out)
}

/// After the op (deepseek_v2.py 0.19.0 L376-395, 0.11.0 L266-285): `final_hidden_states *=
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
/// (its `forward_native` under torch.compile's default custom ops, `custom_ops=["none"]`:
/// a `silu` temporary, then the product; `--enforce-eager` would run `_C.silu_and_mul`, one
/// tensor), `down_proj` without all-reduce; the activation dies as `x` is rebound, then
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, DeviceSpec};
    use crate::engine::ops_moe_v1::Modular;
    use crate::memory::EventKind;
    use std::sync::Arc;

    /// A small DeepSeek-V3: 16 experts in 4 groups (2 kept), top 4, width 32, one shared
    /// expert, noaux_tc over sigmoid scores, hidden 256.
    fn small_v3() -> ModelConfig {
        ModelConfig::from_hf_json(&serde_json::json!({
            "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
            "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 32,
            "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
            "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
            "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
            "vocab_size": 1024, "torch_dtype": "bfloat16"
        }))
        .unwrap()
    }

    /// V2-Lite's routing on the same shapes: greedy top-4 of the softmax, one group, no
    /// correction bias, no renormalisation.
    fn small_v2() -> ModelConfig {
        let mut cfg = small_v3();
        let d = cfg.deepseek.as_mut().unwrap();
        d.topk_method = "greedy".into();
        d.scoring_func = "softmax".into();
        (d.n_group, d.topk_group) = (1, 1);
        cfg.moe.as_mut().unwrap().renormalize = false;
        cfg
    }

    /// One MoE layer at `tokens` tokens on a simulated H200 (dry): (alloc?, name, bytes).
    fn trace(kernel: MoeKernel, tokens: usize) -> Vec<(bool, String, u64)> {
        trace_of(&small_v3(), kernel, tokens)
    }

    fn trace_of(cfg: &ModelConfig, kernel: MoeKernel, tokens: usize) -> Vec<(bool, String, u64)> {
        let noaux = cfg.deepseek.as_ref().unwrap().topk_method == "noaux_tc";
        let rt = Runtime::new(
            Device::open(&DeviceSpec::parse("sim:h200:dry").unwrap()).unwrap(),
            Arc::default(),
            None,
        );
        let (h, e, i) = (256, 16, 32);
        let w = |n: &str, shape: &[usize], dt: DType| {
            rt.tensor(n, Category::Weight, shape, dt).unwrap()
        };
        let moe = DeepseekMoe {
            gate: w("gate", &[e, h], DType::BF16),
            e_score_correction_bias: noaux.then(|| w("bias", &[e], DType::F32)),
            w13: w("w13", &[e, 2 * i, h], DType::BF16),
            w2: w("w2", &[e, h, i], DType::BF16),
            fp8_scales: None,
            shared: Some(DeepseekShared {
                gate_up: FusedLinear::Dense {
                    weight: w("gate_up", &[2 * i, h], DType::BF16),
                    rows: vec![i, i],
                },
                down: Linear::Dense(w("down", &[h, i], DType::BF16)),
                width: i,
            }),
            placement: ExpertPlacement::all(e),
            expert_map: None,
        };
        let x = rt
            .tensor("x", Category::Activation, &[tokens, h], DType::BF16)
            .unwrap();
        rt.ensure_library_workspaces().unwrap();
        let workspace = RefCell::new(None);
        let from = rt.event_count();
        let how = (DType::BF16, kernel, Some(&workspace));
        let out = deepseek_moe_forward(&rt, x, &moe, cfg, how, "layers.1", "NVIDIA H200").unwrap();
        assert_eq!(out.shape, vec![tokens, h]);
        rt.events_since(from, |ev| {
            ev.iter()
                .filter(|e| matches!(e.kind, EventKind::Alloc | EventKind::Free))
                .map(|e| (e.kind == EventKind::Alloc, e.tensor.clone(), e.bytes))
                .collect()
        })
    }

    fn a(n: &str, b: u64) -> (bool, String, u64) {
        (true, format!("layers.1.{n}"), b)
    }
    fn f(n: &str, b: u64) -> (bool, String, u64) {
        (false, format!("layers.1.{n}"), b)
    }

    /// The gate, then the shared experts (gate_up [M, 2I], the forward_native `silu` [M, I]
    /// dying after the product, down [M, H]), both before the routing. M = 512, E = 16, bf16.
    fn gate_and_shared_experts() -> Vec<(bool, String, u64)> {
        vec![
            a("moe.router_logits", 512 * 16 * 2),
            a("shared_experts.gate_up_proj.out", 512 * 64 * 2),
            a("shared_experts.act.silu", 512 * 32 * 2),
            a("shared_experts.act", 512 * 32 * 2),
            f("shared_experts.act.silu", 512 * 32 * 2),
            a("shared_experts.down_proj.out", 512 * 256 * 2),
            f("shared_experts.act", 512 * 32 * 2),
            f("shared_experts.gate_up_proj.out", 512 * 64 * 2),
        ]
    }

    /// vLLM 0.11.0: fused_grouped_topk's scores (bf16), scores + bias (f32), its bf16 copy,
    /// the kernel's group_scores [M, 4], topk_values [M, 4] bf16 and ids; the f32 weights;
    /// then fused_experts_impl in place (cache13 M·k·max(2I, H), cache2 M·k·I, the alignment
    /// buffers with BLOCK_SIZE_M 64: 2048 + 16·63 slots); the routing dies with the op, the
    /// logits and the shared output as the block returns.
    #[test]
    fn v0_11_layer_allocates_as_deepseek_v2_moe_in_place() {
        let mut want = gate_and_shared_experts();
        want.extend([
            a("moe.scores", 16384),
            a("moe.scores_with_bias", 32768),
            a("moe.scores_with_bias.to", 16384),
            a("moe.group_scores", 4096),
            a("moe.topk_values", 4096),
            a("moe.topk_ids", 8192),
            f("moe.group_scores", 4096),
            f("moe.scores_with_bias.to", 16384),
            a("moe.topk_weights", 8192),
            f("moe.scores", 16384),
            f("moe.scores_with_bias", 32768),
            f("moe.topk_values", 4096),
            a("moe.intermediate_cache13", 512 * 4 * 256 * 2),
            a("moe.intermediate_cache2", 512 * 4 * 32 * 2),
            a("moe.sorted_ids", 12288),
            a("moe.expert_ids", 512),
            a("moe.num_tokens_post_pad", 512),
            f("moe.intermediate_cache13", 512 * 4 * 256 * 2),
            f("moe.sorted_ids", 12288),
            f("moe.expert_ids", 512),
            f("moe.num_tokens_post_pad", 512),
            f("moe.intermediate_cache2", 512 * 4 * 32 * 2),
            f("moe.topk_weights", 8192),
            f("moe.topk_ids", 8192),
            f("moe.router_logits", 16384),
            f("shared_experts.down_proj.out", 262144),
        ]);
        let kernel = MoeKernel::InPlace {
            indices_freed_late: true,
        };
        assert_eq!(trace(kernel, 512), want);
    }

    /// vLLM 0.19.0: the gate and shared experts inside the op, the fused kernel's f32 weights
    /// and i32 ids, the new output, the workspace (r256(2·M·k·max(I, H)) + r256(2·M·k·max(2I,
    /// H)), made in this first MoE layer and kept), the alignment buffers; the routing dies as
    /// `_apply_quant_method` returns, then the logits; the shared output after the in-place
    /// scale and sum, the input as the layer rebinds it.
    #[test]
    fn v0_19_layer_allocates_as_deepseek_v2_moe_modular() {
        let mut want = gate_and_shared_experts();
        want.extend([
            a("moe.topk_weights", 8192),
            a("moe.topk_ids", 8192),
            a("moe.output", 262144),
            (true, "moe.workspace".to_string(), 2 * 2 * 512 * 4 * 256),
            a("moe.sorted_ids", 12288),
            a("moe.expert_ids", 512),
            a("moe.num_tokens_post_pad", 512),
            f("moe.sorted_ids", 12288),
            f("moe.expert_ids", 512),
            f("moe.num_tokens_post_pad", 512),
            f("moe.topk_weights", 8192),
            f("moe.topk_ids", 8192),
            f("moe.router_logits", 16384),
            f("shared_experts.down_proj.out", 262144),
            (false, "x".to_string(), 262144),
        ]);
        let kernel = MoeKernel::Modular(Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: None,
        });
        assert_eq!(trace(kernel, 512), want);
    }

    /// 0.15.1 runs the same op as 0.19.0 but its router's logits die before the routing's
    /// tensors (both locals of `forward_impl`, layer.py L1758-1944), and its output is
    /// `zeros_like` (same bytes).
    #[test]
    fn v0_15_frees_the_router_logits_before_the_routing() {
        let kernel = MoeKernel::Modular(Modular {
            chunk_tokens: Some(16384),
            default_block_m_by_tokens: false,
            v0_21: None,
        });
        let frees: Vec<String> = trace(kernel, 512)
            .into_iter()
            .filter(|(alloc, n, _)| !alloc && (n.contains("topk") || n.contains("router")))
            .map(|(_, n, _)| n)
            .collect();
        assert_eq!(
            frees,
            [
                "layers.1.moe.router_logits",
                "layers.1.moe.topk_weights",
                "layers.1.moe.topk_ids"
            ]
        );
    }

    /// V2-Lite's greedy softmax routing has no correction bias, so every release runs the
    /// torch-native grouped_topk (0.19.0 grouped_topk_router.py L113-162), statement by
    /// statement: softmax [M, E] bf16, the group max (values [M, 1], its int64 indices dying),
    /// topk over groups (values dying, int64 indices kept), the group mask, no score-mask copy
    /// (one group: the expand reshapes as a view), the bool mask and its inverse, the masked
    /// scores, topk (bf16 values, int64 ids), their f32 and int32 copies, then the locals.
    #[test]
    fn greedy_routing_runs_the_native_chain() {
        let kernel = MoeKernel::Modular(Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: None,
        });
        let got: Vec<(bool, String, u64)> = trace_of(&small_v2(), kernel, 512)
            .into_iter()
            .skip(gate_and_shared_experts().len())
            .take_while(|(_, n, _)| n != "layers.1.moe.output")
            .collect();
        let me = 512 * 16 * 2;
        let want = vec![
            a("moe.scores", me),
            a("moe.group_scores", 1024),
            a("moe.group_max.indices", 4096),
            f("moe.group_max.indices", 4096),
            a("moe.group_topk.values", 1024),
            a("moe.group_idx", 4096),
            f("moe.group_topk.values", 1024),
            a("moe.group_mask", 1024),
            a("moe.score_mask.bool", 512 * 16),
            a("moe.score_mask.inverted", 512 * 16),
            f("moe.score_mask.bool", 512 * 16),
            a("moe.tmp_scores", me),
            f("moe.score_mask.inverted", 512 * 16),
            a("moe.topk.values", 512 * 4 * 2),
            a("moe.topk.indices", 512 * 4 * 8),
            a("moe.topk_weights", 512 * 4 * 4),
            a("moe.topk_ids", 512 * 4 * 4),
            f("moe.scores", me),
            f("moe.group_scores", 1024),
            f("moe.group_idx", 4096),
            f("moe.group_mask", 1024),
            f("moe.tmp_scores", me),
            f("moe.topk.indices", 512 * 4 * 8),
            f("moe.topk.values", 512 * 4 * 2),
        ];
        assert_eq!(got, want);
    }

    /// On the CPU the block computes Hugging Face's `DeepseekV3MoE`: each token's experts
    /// chosen by sigmoid + bias within the kept groups, weighted by the renormalised unbiased
    /// scores times `routed_scaling_factor` (2.5), plus the shared expert; the in-place
    /// (0.11.0) and modular (0.19.0) kernels agree.
    #[test]
    fn v3_block_computes_hugging_faces_deepseek_v3_moe() {
        use crate::engine::ops_grouped_topk::host_grouped_topk;
        let cfg = small_v3();
        let (h, e, i, k, m) = (256usize, 16usize, 32usize, 4usize, 5usize);
        let rt = Runtime::new(
            Device::open(&DeviceSpec::parse("sim:h100-80gb").unwrap()).unwrap(),
            Arc::default(),
            None,
        );
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut vals = |n: usize, scale: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
                })
                .collect()
        };
        let t = |name: &str, shape: &[usize], data: &[f32]| {
            let mut x = rt
                .tensor(name, Category::Weight, shape, DType::F32)
                .unwrap();
            x.f32_mut().copy_from_slice(data);
            x
        };
        let (xv, gv, bv) = (vals(m * h, 1.0), vals(e * h, 0.5), vals(e, 0.4));
        let (w13v, w2v) = (vals(e * 2 * i * h, 0.2), vals(e * h * i, 0.2));
        let (guv, dv) = (vals(2 * i * h, 0.2), vals(h * i, 0.2));
        let moe = DeepseekMoe {
            gate: t("gate", &[e, h], &gv),
            e_score_correction_bias: Some(t("bias", &[e], &bv)),
            w13: t("w13", &[e, 2 * i, h], &w13v),
            w2: t("w2", &[e, h, i], &w2v),
            fp8_scales: None,
            shared: Some(DeepseekShared {
                gate_up: FusedLinear::Dense {
                    weight: t("gate_up", &[2 * i, h], &guv),
                    rows: vec![i, i],
                },
                down: Linear::Dense(t("down", &[h, i], &dv)),
                width: i,
            }),
            placement: ExpertPlacement::all(e),
            expert_map: None,
        };
        let run = |kernel: MoeKernel| {
            let ws = RefCell::new(None);
            let x = t("x", &[m, h], &xv);
            let out = deepseek_moe_forward(
                &rt,
                x,
                &moe,
                &cfg,
                (DType::F32, kernel, Some(&ws)),
                "layers.1",
                "cpu",
            )
            .unwrap();
            out.f32().to_vec()
        };
        let in_place = run(MoeKernel::InPlace {
            indices_freed_late: true,
        });
        let modular = run(MoeKernel::Modular(Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: None,
        }));
        // 0.21's runner: the routed output scaled in place, the shared output added out of
        // place.
        let runner_0_21 = run(MoeKernel::Modular(Modular {
            chunk_tokens: None,
            default_block_m_by_tokens: true,
            v0_21: Some(crate::engine::ops_moe_v1::RunnerV021::V0_21),
        }));

        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        let silu = |v: f32| v / (1.0 + (-v).exp());
        let mv = |w: &[f32], rows: usize, x: &[f32]| -> Vec<f32> {
            (0..rows)
                .map(|r| dot(&w[r * x.len()..(r + 1) * x.len()], x))
                .collect()
        };
        let swiglu = |gate_up: &[f32], down: &[f32], x: &[f32]| -> Vec<f32> {
            let gu = mv(gate_up, 2 * i, x);
            let a: Vec<f32> = (0..i).map(|j| silu(gu[j]) * gu[i + j]).collect();
            mv(down, h, &a)
        };
        let routing = GroupedTopk {
            top_k: k,
            n_group: 4,
            topk_group: 2,
            scoring: Scoring::Sigmoid,
            renormalize: true,
            bias: None,
        };
        let mut want = Vec::new();
        for tok in 0..m {
            let xr = &xv[tok * h..(tok + 1) * h];
            let (w, ids) = host_grouped_topk(&mv(&gv, e, xr), e, &routing, Some(&bv), 2.5);
            let mut y = swiglu(&guv, &dv, xr);
            for (&ex, &wt) in ids.iter().zip(&w) {
                let ex = ex as usize;
                let w13 = &w13v[ex * 2 * i * h..(ex + 1) * 2 * i * h];
                let w2 = &w2v[ex * h * i..(ex + 1) * h * i];
                for (d, v) in y.iter_mut().zip(swiglu(w13, w2, xr)) {
                    *d += wt * v;
                }
            }
            want.extend(y);
        }
        let relative_l2 = |a: &[f32], b: &[f32]| {
            let d: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
            let n: f32 = b.iter().map(|y| y * y).sum();
            (d / n).sqrt()
        };
        for got in [&in_place, &modular, &runner_0_21] {
            let err = relative_l2(got, &want);
            assert!(err < 1e-5, "relative L2 {err:.3e}");
        }
        assert!(want.iter().map(|v| v * v).sum::<f32>().sqrt() > 0.1);
    }
}

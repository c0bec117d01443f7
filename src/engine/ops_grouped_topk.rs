//! DeepSeek's routing (`use_grouped_topk=True`): vLLM's `grouped_topk`, the torch-native
//! chain of `[M, E]` tensors or, for a correction bias (`noaux_tc`), the fused
//! `_moe_C.grouped_topk` kernel; 0.11.0 model_executor/layers/fused_moe/fused_moe.py
//! L1034-1207, 0.15.1 and 0.19.0 model_executor/layers/fused_moe/router/grouped_topk_router.py
//! L29-162. Allocations in the order the Python runs eagerly (the function is wrapped in
//! `torch.compile(dynamic=True)`, whose fused schedule is not modelled); the math is Hugging
//! Face's `DeepseekV2Moe` / `DeepseekV3TopkRouter`, in f32.

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::ops_moe::Routing;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// How the router's logits become scores (`scoring_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scoring {
    Softmax,
    Sigmoid,
}

/// One layer's routing: `top_k` experts of `n_group` groups, the best `topk_group` groups
/// kept; `bias` is `e_score_correction_bias` (f32 `[E]`, `noaux_tc` only).
pub struct GroupedTopk<'a> {
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub scoring: Scoring,
    pub renormalize: bool,
    pub bias: Option<&'a Tensor>,
}

/// The release whose `grouped_topk` runs: the fused kernel's signature changed between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopkRelease {
    /// 0.11.0: scores and biased scores made in Python, the kernel's outputs in the scores'
    /// dtype, converted to f32 after.
    V0_11,
    /// 0.15.1, 0.19.0: the kernel takes the raw logits and the bias, outputs f32 and i32.
    V1,
}

impl GroupedTopk<'_> {
    /// `grouped_topk` calls the fused kernel when `VLLM_USE_FUSED_MOE_GROUPED_TOPK` (default
    /// 1), on CUDA, `num_expert_group <= 32`, `topk <= 32` and a correction bias is given
    /// (0.11.0 fused_moe.py L1045-1048; 0.19.0 grouped_topk_router.py L92-98).
    fn fused(&self) -> bool {
        self.bias.is_some() && self.n_group <= 32 && self.top_k <= 32
    }
}

/// The routing of every token of `logits` (`[M, E]`, the gate's output in the activation
/// dtype) as vLLM's `select_experts` makes it for DeepSeek, with `routed_scaling_factor=1.0`
/// (DeepseekV2MoE scales the experts' sum instead). Returns f32 weights and i32 ids `[M, k]`.
pub fn grouped_topk(
    rt: &Runtime,
    logits: &Tensor,
    r: &GroupedTopk,
    release: TopkRelease,
    name: &str,
) -> Result<Routing> {
    rt.check_cancel()?;
    rt.set_op("moe.grouped_topk");
    let (m, e) = (logits.rows(), logits.cols());
    let (g, k) = (r.n_group.max(1), r.top_k);
    if e <= g && g > 1 || !e.is_multiple_of(g) || k > e || r.topk_group > g {
        // 0.19.0 grouped_topk_router.py L299-326 falls back to fused_topk(_bias) here.
        return Err(Error::Request(format!(
            "{name}: {e} experts in {g} groups (top {k}, {} groups kept) is not a grouping vLLM's grouped_topk takes",
            r.topk_group
        )));
    }
    if let Some(b) = r.bias {
        if b.numel() != e || b.dtype != DType::F32 {
            return Err(Error::Request(format!(
                "{name}: e_score_correction_bias {} is {:?} {:?}, expected f32 [{e}]",
                b.name, b.dtype, b.shape
            )));
        }
    }
    if rt.backend() == Backend::Cuda {
        return Err(Error::Request(
            "DeepSeek's grouped top-k routing runs on simulated devices only so far".into(),
        ));
    }
    let act = logits.dtype;
    let t = |n: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, shape, dt)
    };
    let (mut weights, mut ids) = match (r.fused(), release) {
        (true, TopkRelease::V0_11) => {
            // fused_grouped_topk (0.11.0 fused_moe.py L1196-1207): scores, scores + bias
            // (f32 by promotion), its copy in the scores' dtype for the kernel; the kernel's
            // group_scores, topk_values (scores' dtype), topk_indices (i32; csrc/moe/
            // grouped_topk_kernels.cu `grouped_topk`), group_scores dying as it returns and
            // the copy as the call returns; `topk_values.to(float32)`; then the locals.
            let scores = t("scores", &[m, e], act)?;
            let with_bias = t("scores_with_bias", &[m, e], DType::F32)?;
            let with_bias_cast = t("scores_with_bias.to", &[m, e], act)?;
            let group_scores = t("group_scores", &[m, g], act)?;
            let values = t("topk_values", &[m, k], act)?;
            let ids = t("topk_ids", &[m, k], DType::I32)?;
            drop(group_scores);
            drop(with_bias_cast);
            let weights = t("topk_weights", &[m, k], DType::F32)?;
            drop(scores);
            drop(with_bias);
            drop(values);
            (weights, ids)
        }
        (true, TopkRelease::V1) => {
            // fused_grouped_topk (0.19.0 grouped_topk_router.py L42-72): the kernel on the raw
            // logits (sigmoid) or on `torch.softmax(logits)`, f32 values and i32 indices.
            // UNVERIFIED for 0.15.1: the csrc at its tag was not read; after vLLM PR #31781
            // (2026-01) the op still made a `group_scores [M, n_group]` scratch in the logits'
            // dtype, the single-kernel version read here (csrc/moe/grouped_topk_kernels.cu on
            // main) makes only its two outputs.
            let scores = match r.scoring {
                Scoring::Softmax => Some(t("scores", &[m, e], act)?),
                Scoring::Sigmoid => None,
            };
            let weights = t("topk_weights", &[m, k], DType::F32)?;
            let ids = t("topk_ids", &[m, k], DType::I32)?;
            drop(scores);
            (weights, ids)
        }
        (false, _) => native_tensors(rt, (m, e), r, act, name)?,
    };
    if rt.backend() == Backend::Cpu {
        let bias = r.bias.map(|b| b.f32());
        let (w, id) = host_grouped_topk(logits.f32(), e, r, bias, 1.0);
        weights.f32_mut().copy_from_slice(&w);
        ids.i32_mut().copy_from_slice(&id);
    }
    Ok(Routing {
        weights,
        ids,
        host_ids: None,
    })
}

/// The torch-native `grouped_topk` statement by statement (0.19.0 grouped_topk_router.py
/// L113-162; 0.11.0 fused_moe.py L1063-1106 is the same code): each temporary dies as its
/// statement ends, the locals as the function returns (CPython clears them in the order they
/// first appear). Returns the f32 weights and i32 ids.
fn native_tensors(
    rt: &Runtime,
    (m, e): (usize, usize),
    r: &GroupedTopk,
    act: DType,
    name: &str,
) -> Result<(Tensor, Tensor)> {
    let (g, tg, k) = (r.n_group.max(1), r.topk_group, r.top_k);
    let t = |n: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, shape, dt)
    };
    // `torch.softmax(gating_output)` / `gating_output.sigmoid()`.
    let scores = t("scores", &[m, e], act)?;
    // With a bias: `original_scores = scores; scores = scores + bias` (f32 by promotion);
    // group score the sum of `topk(2)` (values and indices, the indices dying with the tuple,
    // then the sum, then the values). Without: `.max(dim=-1).values` (the indices die).
    let (biased, group_scores) = if r.bias.is_some() {
        let biased = t("scores_with_bias", &[m, e], DType::F32)?;
        let top2 = t("group_top2.values", &[m, g, 2], DType::F32)?;
        drop(t("group_top2.indices", &[m, g, 2], DType::I64)?);
        let sum = t("group_scores", &[m, g], DType::F32)?;
        drop(top2);
        (Some(biased), sum)
    } else {
        let max = t("group_scores", &[m, g], act)?;
        drop(t("group_max.indices", &[m, g], DType::I64)?);
        (None, max)
    };
    let sdt = group_scores.dtype;
    // `torch.topk(group_scores, k=topk_group)[1]`: the values die with the tuple.
    let values = t("group_topk.values", &[m, tg], sdt)?;
    let group_idx = t("group_idx", &[m, tg], DType::I64)?;
    drop(values);
    let group_mask = t("group_mask", &[m, g], sdt)?;
    // `expand(...).reshape(M, -1)` copies unless the expanded dims merge as a view (one
    // group, or one expert a group).
    let score_mask = if g == 1 || e == g {
        None
    } else {
        Some(t("score_mask", &[m, e], sdt)?)
    };
    // `~score_mask.bool()`: the bool copy dies once inverted; the inverted mask as
    // masked_fill returns.
    let as_bool = t("score_mask.bool", &[m, e], DType::U8)?;
    let inverted = t("score_mask.inverted", &[m, e], DType::U8)?;
    drop(as_bool);
    let tmp_scores = t("tmp_scores", &[m, e], sdt)?;
    drop(inverted);
    let (mut topk_weights, topk_ids) = if r.bias.is_some() {
        // `torch.topk(tmp_scores, k)[1]`, then the unbiased scores gathered.
        let v = t("topk.values", &[m, k], sdt)?;
        let ids = t("topk.indices", &[m, k], DType::I64)?;
        drop(v);
        (t("topk.weights", &[m, k], act)?, ids)
    } else {
        (
            t("topk.values", &[m, k], sdt)?,
            t("topk.indices", &[m, k], DType::I64)?,
        )
    };
    if r.renormalize {
        // `topk_weights / topk_weights.sum(dim=-1, keepdim=True)`.
        let wdt = topk_weights.dtype;
        let sum = t("topk.sum", &[m, 1], wdt)?;
        let q = t("topk.renormalized", &[m, k], wdt)?;
        drop(sum);
        topk_weights = q;
    }
    // `return topk_weights.to(float32), topk_ids.to(int32)`; a conversion to the same dtype
    // returns the tensor itself.
    let weights = if topk_weights.dtype == DType::F32 {
        None
    } else {
        Some(t("topk_weights", &[m, k], DType::F32)?)
    };
    let ids = t("topk_ids", &[m, k], DType::I32)?;
    // The locals, in the order they first appear: `scores` (the biased ones when there is a
    // bias), `original_scores`, group_scores, group_idx, group_mask, score_mask, tmp_scores,
    // topk_ids, topk_weights.
    match biased {
        Some(b) => {
            drop(b);
            drop(scores);
        }
        None => drop(scores),
    }
    drop(group_scores);
    drop(group_idx);
    drop(group_mask);
    drop(score_mask);
    drop(tmp_scores);
    drop(topk_ids);
    let weights = match weights {
        Some(w) => {
            drop(topk_weights);
            w
        }
        None => topk_weights,
    };
    Ok((weights, ids))
}

/// Hugging Face's DeepSeek routing of `logits` (`[M, E]` row-major) in f32: scores (softmax
/// or sigmoid), the experts chosen by the scores plus `bias` within the `topk_group` best
/// groups (a group's score: the sum of its two best biased scores with a bias, its best
/// score without), the unbiased scores of the chosen ones as weights, divided by their sum
/// (+1e-20) when `renormalize`, times `scale`. Ties go to the lower index; the experts of
/// other groups are never chosen (vLLM fills them with -inf). Weights and ids `[M, k]`, the
/// best first.
pub(crate) fn host_grouped_topk(
    logits: &[f32],
    e: usize,
    r: &GroupedTopk,
    bias: Option<&[f32]>,
    scale: f32,
) -> (Vec<f32>, Vec<i32>) {
    let (g, k) = (r.n_group.max(1), r.top_k);
    let per = e / g;
    let rows = logits.len() / e;
    let (mut w, mut id) = (vec![0f32; rows * k], vec![0i32; rows * k]);
    // Larger first, ties to the lower index.
    let best = |v: &[f32], idx: &mut Vec<usize>| {
        idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    };
    for (row, x) in logits.chunks_exact(e).enumerate() {
        let scores: Vec<f32> = match r.scoring {
            Scoring::Softmax => {
                let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = x.iter().map(|&v| (v - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                exps.iter().map(|&v| v / sum).collect()
            }
            Scoring::Sigmoid => x.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect(),
        };
        let choice: Vec<f32> = match bias {
            Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
            None => scores.clone(),
        };
        let group_score: Vec<f32> = choice
            .chunks_exact(per)
            .map(|grp| {
                let mut v = grp.to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                if bias.is_some() {
                    v.iter().take(2).sum()
                } else {
                    v[0]
                }
            })
            .collect();
        let mut groups: Vec<usize> = (0..g).collect();
        best(&group_score, &mut groups);
        let mut kept = vec![false; g];
        for &grp in &groups[..r.topk_group.min(g)] {
            kept[grp] = true;
        }
        let masked: Vec<f32> = choice
            .iter()
            .enumerate()
            .map(|(x, &v)| if kept[x / per] { v } else { f32::NEG_INFINITY })
            .collect();
        let mut order: Vec<usize> = (0..e).collect();
        best(&masked, &mut order);
        let chosen = &order[..k];
        let mut ws: Vec<f32> = chosen.iter().map(|&x| scores[x]).collect();
        if r.renormalize {
            let sum: f32 = ws.iter().sum::<f32>() + 1e-20;
            for v in &mut ws {
                *v /= sum;
            }
        }
        for (j, (&x, v)) in chosen.iter().zip(ws).enumerate() {
            w[row * k + j] = v * scale;
            id[row * k + j] = x as i32;
        }
    }
    (w, id)
}

/// `x *= factor` in place (DeepseekV2MoE's `final_hidden_states *= routed_scaling_factor`
/// and, in fp16, `shared_output *= 1 / routed_scaling_factor`): no allocation.
pub fn scale_in_place(rt: &Runtime, x: &mut Tensor, factor: f64) -> Result<()> {
    rt.set_op("moe.routed_scaling");
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cpu => {
            let f = factor as f32;
            for v in x.f32_mut() {
                *v *= f;
            }
            Ok(())
        }
        Backend::Cuda => crate::engine::ops::cuda(rt, |c| c.scale_in_place(x, factor as f32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (id, weight) pairs of each token, by id (the order within a token is free).
    fn by_id(w: &[f32], id: &[i32], k: usize) -> Vec<Vec<(i32, f32)>> {
        w.chunks_exact(k)
            .zip(id.chunks_exact(k))
            .map(|(w, id)| {
                let mut p: Vec<(i32, f32)> = id.iter().copied().zip(w.iter().copied()).collect();
                p.sort_by_key(|x| x.0);
                p
            })
            .collect()
    }

    fn assert_routes(got: (Vec<f32>, Vec<i32>), ids: &[[i32; 3]], w: &[[f32; 3]], k: usize) {
        let got = by_id(&got.0, &got.1, k);
        let flat_w: Vec<f32> = w.iter().flat_map(|r| r[..k].to_vec()).collect();
        let flat_id: Vec<i32> = ids.iter().flat_map(|r| r[..k].to_vec()).collect();
        let want = by_id(&flat_w, &flat_id, k);
        for (g, w) in got.iter().zip(&want) {
            for ((gi, gw), (wi, ww)) in g.iter().zip(w) {
                assert_eq!(gi, wi, "{got:?} vs {want:?}");
                assert!((gw - ww).abs() < 1e-6, "{got:?} vs {want:?}");
            }
        }
    }

    /// transformers 5's `DeepseekV3TopkRouter` (identity router weight, so the logits are the
    /// input) on 3 tokens, 8 experts in 4 groups, 2 groups kept, top 3, norm_topk_prob,
    /// routed_scaling_factor 2.5 (a seed-0 run of that router in PyTorch on the CPU).
    #[test]
    fn noaux_tc_routing_equals_hugging_faces_deepseek_v3_router() {
        #[rustfmt::skip]
        let logits = [
            -1.69, -1.73, -0.38, -0.65, 1.27, 1.04, -0.47, -3.17,
            0.70, -0.24, 2.17, 0.40, 0.25, 1.31, -0.22, -0.17,
            1.40, 1.89, 3.01, 0.08, 0.93, -0.62, -1.26, -3.47f32,
        ];
        let bias = [0.11, 0.44, 0.28, 0.23, 0.06, 0.38, -0.39, -0.24f32];
        let r = GroupedTopk {
            top_k: 3,
            n_group: 4,
            topk_group: 2,
            scoring: Scoring::Sigmoid,
            renormalize: true,
            bias: None,
        };
        let got = host_grouped_topk(&logits, 8, &r, Some(&bias), 2.5);
        assert_routes(
            got,
            &[[4, 5, 2], [2, 5, 3], [2, 1, 0]],
            &[
                [1.013_572_7, 0.959_186_85, 0.527_240_4],
                [0.982_521_4, 0.862_093_2, 0.655_385_3],
                [0.908_000_4, 0.827_713_1, 0.764_286_6],
            ],
            3,
        );
    }

    /// transformers 5's `DeepseekV2TopkRouter` with `group_limited_greedy`: 6 experts in 3
    /// groups, 2 kept (a group's score its best softmax score), top 2, no renormalisation,
    /// scaled by 1.5. Token 1's second expert (5) is chosen over expert 1 only because expert
    /// 1's group is dropped.
    #[test]
    fn group_limited_greedy_equals_hugging_faces_deepseek_v2_router() {
        #[rustfmt::skip]
        let logits = [
            0.31, -0.68, 2.56, 3.57, -1.69, -0.48,
            -1.64, -0.13, -0.14, 1.03, -2.40, 0.03,
            -1.13, 0.28, 0.93, 0.96, -0.37, 3.45f32,
        ];
        let r = GroupedTopk {
            top_k: 2,
            n_group: 3,
            topk_group: 2,
            scoring: Scoring::Softmax,
            renormalize: false,
            bias: None,
        };
        let got = host_grouped_topk(&logits, 6, &r, None, 1.5);
        assert_routes(
            got,
            &[[3, 2, 0], [3, 5, 0], [5, 3, 0]],
            &[
                [1.042_036_3, 0.379_529_36, 0.0],
                [0.716_547_4, 0.263_603_06, 0.0],
                [1.212_066_4, 0.100_492_39, 0.0],
            ],
            2,
        );
    }

    /// V2's greedy routing is the plain top-k of the softmax (one group): what
    /// `ops_moe::host_topk` computes, times the scaling factor.
    #[test]
    fn greedy_routing_is_the_softmax_top_k() {
        let logits = [0.0, 2f32.ln(), 2f32.ln(), 4f32.ln()];
        let r = GroupedTopk {
            top_k: 2,
            n_group: 1,
            topk_group: 1,
            scoring: Scoring::Softmax,
            renormalize: false,
            bias: None,
        };
        let (w, id) = host_grouped_topk(&logits, 4, &r, None, 1.0);
        assert_eq!(id, [3, 1]);
        assert!((w[0] - 4.0 / 9.0).abs() < 1e-6 && (w[1] - 2.0 / 9.0).abs() < 1e-6);
    }
}

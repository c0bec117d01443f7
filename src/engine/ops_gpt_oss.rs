//! gpt-oss's ops (vLLM 0.11.0 and 0.19.0 model_executor/models/gpt_oss.py): YaRN in neox
//! style on q and k in place, attention with sinks (a learned logit per head in each row's
//! softmax denominator) on sliding-window or full layers, and the experts' clamped SwiGLU with
//! biases. Each allocates as the kernel vLLM runs in its place does (FlashAttention's output
//! and softmax_lse, the fused MoE's buffers), then computes on the CPU or not at all (dry).

use std::cell::RefCell;

use crate::base::error::{Error, Result};
use crate::device::cpu::AttnShape;
use crate::device::{cpu_gpt_oss, Backend};
use crate::engine::ops_mla::YarnRope;
use crate::engine::ops_moe::{Experts, Routing};
use crate::engine::ops_moe_v1::{self, MoeKernel};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_moe};
use crate::memory::Category;

fn on_cuda(what: &str) -> Error {
    Error::Request(format!(
        "gpt-oss's {what} has no CUDA kernel here yet: run it on a simulated device (sim:…)"
    ))
}

/// `YaRNScalingRotaryEmbedding` with `is_neox_style=True` (0.19 rotary_embedding/
/// yarn_scaling_rope.py L12-80): dimension `i` turns with `i + head_dim / 2` by the YaRN
/// frequency of pair `i`, cos and sin scaled by `rope.mscale`; q and k in place.
pub fn rope_yarn(
    rt: &Runtime,
    q: &mut Tensor,
    k: &mut Tensor,
    positions: &[usize],
    shape: AttnShape,
    (rope, truncate): (&YarnRope, bool),
) -> Result<()> {
    rt.check_cancel()?;
    rt.set_op("rotary_emb (yarn)");
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cuda => Err(on_cuda("YaRN rotary embedding")),
        Backend::Cpu => {
            let inv = rope.inv_freq_with(truncate);
            let half = rope.rotary_dim / 2;
            let table: Vec<(f32, f32)> = positions
                .iter()
                .flat_map(|&p| {
                    inv.iter().map(move |f| {
                        let (s, c) = (p as f64 * f).sin_cos();
                        ((c * rope.mscale) as f32, (s * rope.mscale) as f32)
                    })
                })
                .collect();
            let hd = shape.head_dim;
            for (x, heads) in [(q, shape.heads), (k, shape.kv_heads)] {
                let data = x.f32_mut();
                for (t, cs) in table.chunks_exact(half.max(1)).enumerate() {
                    for h in 0..heads {
                        let base = t * heads * hd + h * hd;
                        for (i, &(cos, sin)) in cs.iter().enumerate() {
                            let (a, b) = (data[base + i], data[base + i + half]);
                            data[base + i] = a * cos - b * sin;
                            data[base + i + half] = b * cos + a * sin;
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

/// vLLM's `Attention(..., per_layer_sliding_window, sinks=self.sinks)` (0.19 gpt_oss.py
/// L131-143) outside the profile run: FlashAttention's allocations (`ops::attention`: the
/// output, `softmax_lse`, `rng_state`), the window in `shape.mods.window`, each row's softmax
/// with the head's sink logit in its denominator.
pub fn attention_with_sinks(
    rt: &Runtime,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    seq_lens: &[usize],
    shape: AttnShape,
    sinks: &Tensor,
    name: &str,
) -> Result<Tensor> {
    if rt.backend() == Backend::Cuda {
        return Err(on_cuda("attention with sinks"));
    }
    let mut out = ops::attention(rt, q, k, v, seq_lens, shape, name)?;
    if rt.backend() == Backend::Cpu {
        cpu_gpt_oss::apply_sinks(
            q.f32(),
            k.f32(),
            seq_lens,
            shape,
            sinks.f32(),
            out.f32_mut(),
        );
    }
    Ok(out)
}

/// The experts' weights and biases of one MoE layer as vLLM's `FusedMoE(has_bias=True,
/// activation="swigluoai")` holds them: `w13 [E, 2I, H]` (gate and up rows interleaved, as
/// the checkpoint's `gate_up_proj` after its permute, 0.19 gpt_oss.py L988-998), `w13_bias
/// [E, 2I]`, `w2 [E, H, I]`, `w2_bias [E, H]`.
pub struct OaiExperts<'a> {
    pub experts: Experts<'a>,
    pub w13_bias: &'a Tensor,
    pub w2_bias: &'a Tensor,
    pub alpha: f32,
    pub limit: f32,
}

/// The routing and experts of one MoE layer as the release's fused MoE runs them for 16-bit
/// experts (0.19: the modular kernel's new output over its persistent workspace; 0.11.0: the
/// in-place kernel into `x`'s copy): the allocations are that kernel's (`ops_moe_v1`,
/// `ops_moe`), the math on the CPU is gpt-oss's: for each token its `top_k` experts
/// (softmax over the chosen logits: `topk_softmax` with `renormalize=True` gives the same
/// weights as transformers' top-k then softmax), `swigluoai(x·W13ᵀ + b13)·W2ᵀ + b2`, weighted
/// and summed. Returns the output `[M, H]`; the routing dies before it returns.
pub fn moe_experts(
    rt: &Runtime,
    x: Tensor,
    logits: &Tensor,
    ex: &OaiExperts,
    (top_k, kernel, workspace, gpu): (usize, MoeKernel, &RefCell<Option<Tensor>>, &str),
    name: &str,
) -> Result<Tensor> {
    if rt.backend() == Backend::Cuda {
        return Err(on_cuda("fused MoE with biases and swigluoai"));
    }
    let host_x = (rt.backend() == Backend::Cpu).then(|| x.f32().to_vec());
    let (mut out, routing, x_left) = match kernel {
        MoeKernel::Modular(how) => {
            let routing = ops_moe_v1::fused_topk(rt, logits, top_k, true, name)?;
            let out = ops_moe_v1::fused_experts(
                rt,
                &x,
                &ex.experts,
                &routing,
                (how, gpu),
                workspace,
                name,
            )?;
            (out, routing, Some(x))
        }
        MoeKernel::InPlace { indices_freed_late } => {
            let routing = ops_moe::fused_topk(rt, logits, top_k, true, indices_freed_late, name)?;
            let mut x = x;
            ops_moe::fused_experts(rt, &mut x, &ex.experts, &routing, gpu, name)?;
            (x, routing, None)
        }
    };
    if let Some(xs) = host_x {
        experts_cpu(&xs, &routing, ex, out.f32_mut());
    }
    drop(routing);
    drop(x_left);
    Ok(out)
}

/// The experts' math on the host into `out` (`[M, H]`), in f32.
fn experts_cpu(x: &[f32], routing: &Routing, ex: &OaiExperts, out: &mut [f32]) {
    let w = HostExpertsRef {
        w13: ex.experts.w13.f32(),
        w2: ex.experts.w2.f32(),
        b13: ex.w13_bias.f32(),
        b2: ex.w2_bias.f32(),
        hidden: ex.experts.w2.shape[1],
        width: ex.experts.width,
    };
    let ids = (routing.ids.i32(), routing.weights.f32(), routing.ids.cols());
    let all = 0..ex.experts.num_experts;
    experts_host(x, ids, all, &w, (ex.alpha, ex.limit), out);
}

/// One layer's experts on the host in f32: `w13 [E, 2I, H]` (gate and up rows interleaved),
/// `b13 [E, 2I]`, `w2 [E, H, I]`, `b2 [E, H]`.
pub struct HostExpertsRef<'a> {
    pub w13: &'a [f32],
    pub w2: &'a [f32],
    pub b13: &'a [f32],
    pub b2: &'a [f32],
    pub hidden: usize,
    pub width: usize,
}

/// For each token its `top_k` experts, `swigluoai(x·W13ᵀ + b13)·W2ᵀ + b2`, weighted and
/// summed into `out` (`[M, H]`). `ids` are global expert ids; `local` is the range of them
/// this rank holds (`w`'s experts, from `local.start`): an expert elsewhere adds nothing here
/// (expert parallel: the all-reduce after the block sums the ranks).
fn experts_host(
    x: &[f32],
    (ids, weights, top_k): (&[i32], &[f32], usize),
    local: std::ops::Range<usize>,
    w: &HostExpertsRef,
    (alpha, limit): (f32, f32),
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let (h, i) = (w.hidden, w.width);
    let (w13, w2, b13, b2) = (w.w13, w.w2, w.b13, w.b2);
    out.par_chunks_mut(h).enumerate().for_each(|(t, o)| {
        o.fill(0.0);
        let xt = &x[t * h..(t + 1) * h];
        let mut gu = vec![0f32; 2 * i];
        let mut act = vec![0f32; i];
        for j in 0..top_k {
            let g = ids[t * top_k + j] as usize;
            if !local.contains(&g) {
                continue;
            }
            let e = g - local.start;
            let w = weights[t * top_k + j];
            let w13e = &w13[e * 2 * i * h..(e + 1) * 2 * i * h];
            for (r, g) in gu.iter_mut().enumerate() {
                let row = &w13e[r * h..(r + 1) * h];
                *g = row.iter().zip(xt).map(|(a, b)| a * b).sum::<f32>() + b13[e * 2 * i + r];
            }
            cpu_gpt_oss::swiglu_oai(&gu, alpha, limit, &mut act);
            let w2e = &w2[e * h * i..(e + 1) * h * i];
            for (c, oc) in o.iter_mut().enumerate() {
                let row = &w2e[c * i..(c + 1) * i];
                let d = row.iter().zip(&act).map(|(a, b)| a * b).sum::<f32>() + b2[e * h + c];
                *oc += w * d;
            }
        }
    });
}

/// The global top-k ids of each token and their softmax weights, on the host.
type HostRouting = (Vec<i32>, Vec<f32>);

/// The routing of `triton_kernel_moe_forward` with an expert map (expert parallel, 0.19.0
/// fused_moe/gpt_oss_triton_kernels_moe.py L244-271, make_routing_data L496-546; 0.33.0
/// experts/gpt_oss_triton_kernels_moe.py L634-660, L864-926: the same tensors): triton_kernels'
/// `topk(logits, k, apply_softmax=True)` makes the top-k values in the logits' dtype, int16
/// ids and a bitmatrix `[⌈E/32⌉, ⌈M/32⌉·32]` uint32 (topk.py L41-50), all held to the end of
/// the forward; `expert_map[ids.to(long)]` (the int64 copy dies at once) gives int32 local
/// ids, −1 where the expert is elsewhere; `make_routing_data` copies them to int16, zeroes the
/// local bitmatrix `[M, ⌈E_l/32⌉]`, and writes `where(ids == −1, −1, values)` (its bool mask
/// dies at once); the ragged metadata from the bitmatrix are taken as its two `M·k` int32
/// index halves (`make_bitmatrix_metadata`, bitmatrix.py L110-150) and the gathered `M·k`
/// gate scales; the per-expert sums and offsets (under 4 KiB) are not reproduced. Returns the
/// tensors that live to the end, and on the CPU the global top-k ids and their softmax.
fn ep_routing(
    rt: &Runtime,
    logits: &Tensor,
    top_k: usize,
    local: usize,
    name: &str,
) -> Result<(Vec<Tensor>, Option<HostRouting>)> {
    rt.check_cancel()?;
    rt.set_op("moe.topk (expert map)");
    let (m, e) = (logits.rows(), logits.cols());
    let t = |n: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, shape, dt)
    };
    let mut held = vec![
        t("topk.vals", &[m, top_k], logits.dtype)?,
        t("topk.indx (int16)", &[m, top_k], DType::F16)?,
        t(
            "topk.bitmatrix (uint32)",
            &[e.div_ceil(32), m.div_ceil(32) * 32],
            DType::I32,
        )?,
    ];
    let long = t("topk_ids_raw.long", &[m, top_k], DType::I64)?;
    held.push(t("topk_ids (local)", &[m, top_k], DType::I32)?);
    drop(long);
    rt.set_op("moe.make_routing_data");
    held.push(t("topk_ids (int16)", &[m, top_k], DType::F16)?);
    held.push(rt.tensor(
        format!("{name}.bitmatrix (local, uint32)"),
        Category::Activation,
        &[m, local.div_ceil(32)],
        DType::I32,
    )?);
    let invalid = t("topk_ids == -1 (bool)", &[m, top_k], DType::U8)?;
    held.push(t("topk_weights (where)", &[m, top_k], logits.dtype)?);
    drop(invalid);
    held.push(t("combined_indx", &[2 * m * top_k], DType::I32)?);
    held.push(t("gate_scal", &[m * top_k], logits.dtype)?);
    let host = (rt.backend() == Backend::Cpu).then(|| {
        let (w, id) = ops_moe::host_topk(logits.f32(), e, top_k);
        (id, ops_moe::host_renormalize(&w, top_k))
    });
    Ok((held, host))
}

/// gpt-oss's MXFP4 experts as vLLM's triton_kernels path runs them (0.19
/// `OAITritonMxfp4ExpertsMonolithic.apply` → `triton_kernel_moe_forward`,
/// fused_moe/gpt_oss_triton_kernels_moe.py L198-400; the same tensors in 0.11 to 0.33,
/// docs/reading/vllm-gpt-oss-v1.md §4): the routing, `output = torch.empty_like(hidden_states)`
/// `[M, H]` (L280), `intermediate_cache [M·k, N/2]` in the activation dtype (L346-350, N the
/// swizzled w13's `2I` rounded), the first `matmul_ogs` into it, then the second's scratch
/// `[M·k, H]` (triton_kernels' `init_allocation`: a scatter that is not fused, since
/// `n_expts_act > 1`, matmul_ogs.py L168-170 in 3.5.1, L256-258 in 3.6), reduced into the
/// output and freed as it returns; the intermediate dies last. The routing is taken as
/// `fused_topk`'s `[M, k]` weights and ids: triton_kernels' own topk and ragged metadata are
/// smaller index tensors not reproduced one by one. With expert parallel (`local`: the global
/// experts this rank holds) the routing goes through the expert map (`ep_routing`), and the
/// buffers keep all `M·k` rows (the remote slots are skipped, not dropped).
///
/// `triton`: the backend is triton_kernels'. Marlin and TRT-LLM (not `triton`) run on the
/// hidden states padded to the rounded hidden size `hidden_padded` (`F.pad` in the MoE
/// runner, 0.19 runner/default_moe_runner.py L446-474, 0.11 layer.py L1812-1818: a new
/// `[M, H']` alive through the op) and are otherwise taken to allocate as this path does
/// (their workspaces are not modelled; their output keeps `[M, H]` here, vLLM's is `[M, H']`
/// sliced). On the CPU the math runs on the dequantized experts (`host`, exact: e2m1 ·
/// 2^scale).
pub fn moe_experts_mxfp4(
    rt: &Runtime,
    x: Tensor,
    logits: &Tensor,
    host: Option<&HostExpertsRef>,
    (top_k, width, alpha, limit): (usize, usize, f32, f32),
    (triton, hidden_padded, local): (bool, usize, Option<std::ops::Range<usize>>),
    name: &str,
) -> Result<Tensor> {
    if rt.backend() == Backend::Cuda {
        return Err(on_cuda("MXFP4 fused MoE"));
    }
    let (m, h) = (x.rows(), x.cols());
    let padded = if !triton && hidden_padded != h {
        rt.set_op("moe.pad_hidden");
        Some(rt.tensor_for_overwrite(
            format!("{name}.hidden_padded"),
            Category::Activation,
            &[m, hidden_padded],
            x.dtype,
        )?)
    } else {
        None
    };
    let (routing, ep) = if let Some(l) = &local {
        (None, Some(ep_routing(rt, logits, top_k, l.len(), name)?))
    } else {
        (
            Some(ops_moe_v1::fused_topk(rt, logits, top_k, true, name)?),
            None,
        )
    };
    rt.set_op("moe.matmul_ogs (mxfp4)");
    let mut out = rt.tensor_for_overwrite(
        format!("{name}.output"),
        Category::Activation,
        &[m, h],
        x.dtype,
    )?;
    let cache = rt.tensor_for_overwrite(
        format!("{name}.intermediate_cache"),
        Category::Activation,
        &[m * top_k, width],
        x.dtype,
    )?;
    let scratch = if triton && top_k > 1 {
        Some(rt.tensor_for_overwrite(
            format!("{name}.matmul_ogs.scratch"),
            Category::Activation,
            &[m * top_k, h],
            x.dtype,
        )?)
    } else {
        None
    };
    if rt.backend() == Backend::Cpu {
        let w = host.ok_or_else(|| {
            Error::Request(format!("{name}: MXFP4 experts without their host values"))
        })?;
        let (ids, weights) = match (&routing, &ep) {
            (Some(r), _) => (r.ids.i32(), r.weights.f32()),
            (None, Some((_, Some((ids, w))))) => (&ids[..], &w[..]),
            _ => unreachable!("a routing on the CPU"),
        };
        let local = local.unwrap_or(0..logits.cols());
        experts_host(
            x.f32(),
            (ids, weights, top_k),
            local,
            w,
            (alpha, limit),
            out.f32_mut(),
        );
    }
    drop(scratch);
    drop(cache);
    drop(routing);
    drop(ep);
    drop(padded);
    drop(x);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{experts_host, HostExpertsRef};

    /// Expert parallel on the host: two ranks, each with half the experts (its slice of the
    /// weights and biases, `w2_bias` whole on both), routed by the same global ids, sum to one
    /// rank holding all of them; an expert elsewhere adds nothing.
    #[test]
    fn expert_halves_sum_to_the_whole() {
        let (h, i, e, k, m) = (8usize, 6usize, 4usize, 2usize, 5usize);
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut vals =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random::<f32>() - 0.5).collect() };
        let (x, w13, w2, b13, b2) = (
            vals(m * h),
            vals(e * 2 * i * h),
            vals(e * h * i),
            vals(e * 2 * i),
            vals(e * h),
        );
        let ids: Vec<i32> = (0..m * k).map(|j| ((j * 3 + j / k) % e) as i32).collect();
        let weights = vals(m * k);
        let run = |r: std::ops::Range<usize>| {
            let w = HostExpertsRef {
                w13: &w13[r.start * 2 * i * h..r.end * 2 * i * h],
                w2: &w2[r.start * h * i..r.end * h * i],
                b13: &b13[r.start * 2 * i..r.end * 2 * i],
                b2: &b2[r.start * h..r.end * h],
                hidden: h,
                width: i,
            };
            let mut out = vec![0f32; m * h];
            experts_host(&x, (&ids, &weights, k), r, &w, (1.702, 7.0), &mut out);
            out
        };
        let whole = run(0..e);
        let (a, b) = (run(0..e / 2), run(e / 2..e));
        let err = whole
            .iter()
            .zip(a.iter().zip(&b))
            .map(|(w, (x, y))| (w - (x + y)).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-5, "{err}");
        assert!(a.iter().any(|v| v.abs() > 1e-3) && b.iter().any(|v| v.abs() > 1e-3));
    }
}

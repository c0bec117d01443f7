//! Llama 4's ops beside the shared ones (vLLM's model_executor/models/llama4.py, 0.11.0 and
//! 0.19.0): the rotary embedding with Llama 3's frequency scaling, the weightless L2 norm of
//! each q/k head, the NoPE layers' attention temperature, chunked local attention, and the
//! MoE's top-1 sigmoid routing that scales each token's input. Each allocates as the eager
//! PyTorch code does, then computes on the CPU or not at all (dry); CUDA has no kernels.

use crate::base::error::{Error, Result};
use crate::device::cpu::AttnShape;
use crate::device::Backend;
use crate::engine::ops;
use crate::engine::ops_moe::Routing;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// Llama 4 on a GPU: its ops have no CUDA kernels here.
pub fn on_cuda() -> Error {
    Error::Request(
        "model_type llama4 runs on simulated devices only so far (its chunked attention, L2 q/k norm, temperature tuning and sigmoid routing have no CUDA kernels); use sim:..."
            .into(),
    )
}

/// RoPE on q and k in place with the inverse frequencies `inv_freq` (`head_dim / 2`, the
/// scaled ones under Llama 3's `rope_scaling`). Hugging Face turns each head's interleaved
/// pairs `(2i, 2i+1)` by `p · inv_freq[i]` (`apply_rotary_emb`, complex products); vLLM
/// permutes q_proj's and k_proj's rows on load so that the pairs become `(i, i + d/2)` and
/// turns them neox-style (llama4.py 0.19 L805-840): the same numbers, so the checkpoint's
/// order is kept and the pairs turned where they lie. No allocation.
pub fn rope_interleaved(
    rt: &Runtime,
    q: &mut Tensor,
    k: &mut Tensor,
    positions: &[usize],
    shape: AttnShape,
    inv_freq: &[f64],
) -> Result<()> {
    rt.check_cancel()?;
    rt.set_op("rope");
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cuda => Err(on_cuda()),
        Backend::Cpu => {
            let hd = shape.head_dim;
            // transformers computes `p · inv_freq` in f32, then cos and sin.
            let table: Vec<Vec<(f32, f32)>> = positions
                .iter()
                .map(|&p| {
                    inv_freq
                        .iter()
                        .map(|&f| {
                            let a = (p as f32 * f as f32) as f64;
                            (a.cos() as f32, a.sin() as f32)
                        })
                        .collect()
                })
                .collect();
            for (x, heads) in [(q, shape.heads), (k, shape.kv_heads)] {
                let row = heads * hd;
                for (t, xs) in x.f32_mut().chunks_exact_mut(row).enumerate() {
                    for head in xs.chunks_exact_mut(hd) {
                        for (pair, &(c, s)) in head.chunks_exact_mut(2).zip(&table[t]) {
                            let (a, b) = (pair[0], pair[1]);
                            pair[0] = a * c - b * s;
                            pair[1] = a * s + b * c;
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

/// `self.qk_norm(x.float()).reshape(-1, size).to(x.dtype)` on a split q or k view
/// (llama4.py 0.19 L206-215): `reshape(-1, head_dim)` of the strided view copies it, `.float()`
/// makes an f32 copy, the weightless `RMSNorm` (f32, `has_weight=False`) a new f32 tensor and
/// `.to` the result in the model dtype; the copies die as the statement ends.
pub fn l2_norm_heads(
    rt: &Runtime,
    x: &Tensor,
    head_dim: usize,
    eps: f32,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("qk_norm");
    let t = |n: String, dt: DType| rt.tensor_for_overwrite(n, Category::Activation, &x.shape, dt);
    let copy = t(format!("{name}.reshape"), x.dtype)?;
    let f32_copy = t(format!("{name}.float"), DType::F32)?;
    let normed = t(format!("{name}.rms"), DType::F32)?;
    let mut out = t(name.to_string(), x.dtype)?;
    if rt.backend() == Backend::Cuda {
        return Err(on_cuda());
    }
    if rt.backend() == Backend::Cpu {
        let dt = x.dtype;
        for (o, h) in out
            .f32_mut()
            .chunks_exact_mut(head_dim)
            .zip(x.f32().chunks_exact(head_dim))
        {
            let ms = h.iter().map(|v| v * v).sum::<f32>() / head_dim as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for (a, &b) in o.iter_mut().zip(h) {
                *a = dt.round(b * inv);
            }
        }
    }
    drop((copy, f32_copy, normed));
    Ok(out)
}

/// The NoPE layers' attention temperature (`_get_attn_scale` then `(q * attn_scale).to(
/// q.dtype)`, llama4.py 0.19 L236-240, L260-262): six `[T]` f32 steps (`positions + 1.0`,
/// `/ floor_scale`, `floor`, `+ 1.0`, `log`, `* attn_scale`, `+ 1.0`, each a new tensor, the
/// one before dying), the product promoted to f32 `[T, q]`, its cast into the model dtype;
/// then the scales and the f32 product die. Returns the scaled q.
pub fn temperature_tune(
    rt: &Runtime,
    q: &Tensor,
    positions: &[usize],
    (floor_scale, attn_scale): (f64, f64),
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("attn_temperature_tuning");
    let tokens = q.rows();
    let mut step = None;
    for s in [
        "plus_one",
        "div",
        "floor",
        "floor_plus_one",
        "log",
        "mul",
        "scale",
    ] {
        let next = rt.tensor_for_overwrite(
            format!("{name}.attn_scale.{s}"),
            Category::Activation,
            &[tokens],
            DType::F32,
        )?;
        drop(step.replace(next));
    }
    let prod = rt.tensor_for_overwrite(
        format!("{name}.scaled_f32"),
        Category::Activation,
        &q.shape,
        DType::F32,
    )?;
    let mut out =
        rt.tensor_for_overwrite(name.to_string(), Category::Activation, &q.shape, q.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cuda => return Err(on_cuda()),
        Backend::Cpu => {
            let cols = q.cols();
            let dt = q.dtype;
            for ((o, x), &p) in out
                .f32_mut()
                .chunks_exact_mut(cols)
                .zip(q.f32().chunks_exact(cols))
                .zip(positions)
            {
                let floor = (((p as f32 + 1.0) / floor_scale as f32).floor()) as f64;
                let scale = ((floor + 1.0).ln() * attn_scale + 1.0) as f32;
                for (a, &b) in o.iter_mut().zip(x) {
                    *a = dt.round(b * scale);
                }
            }
        }
    }
    drop(step);
    drop(prod);
    Ok(out)
}

/// Each sequence cut into the chunks chunked local attention keeps apart: positions
/// `[c·C, (c+1)·C)` see only keys of their own chunk, causally (vLLM's
/// `make_local_attention_virtual_batches`, v1/attention/backends/utils.py, turns each chunk
/// into a sequence of its own). Positions start at 0 in every sequence here.
pub fn chunked_seq_lens(seq_lens: &[usize], chunk: usize) -> Vec<usize> {
    seq_lens
        .iter()
        .flat_map(|&n| (0..n.div_ceil(chunk.max(1))).map(move |c| (n - c * chunk).min(chunk)))
        .collect()
}

/// Attention over `seq_lens`, chunked when `chunk` is set: the same allocations as
/// `ops::attention` (its output, `softmax_lse [heads, T]` and the rest, per the whole batch),
/// the math over the chunks as sequences.
pub fn attention(
    rt: &Runtime,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    seq_lens: &[usize],
    chunk: Option<usize>,
    shape: AttnShape,
    name: &str,
) -> Result<Tensor> {
    match chunk {
        None => ops::attention(rt, q, k, v, seq_lens, shape, name),
        Some(c) => ops::attention(rt, q, k, v, &chunked_seq_lens(seq_lens, c), shape, name),
    }
}

/// `Llama4MoE.custom_routing_function` (llama4.py 0.19 L68-78) for one expert a token:
/// `fast_topk` is `torch.max(keepdim=True)` (values `[M, 1]` in the logits' dtype, indices
/// `[M, 1]` int64), `sigmoid(values.float())` (an f32 copy, then the f32 weights) and
/// `indices.to(int32)`; the values, their copy and the int64 indices die as it returns
/// (`CustomRoutingRouter._compute_routing`'s `.to(float32)` and `.to(int32)` are no-ops,
/// router/custom_routing_router.py 0.19 L44-58).
pub fn sigmoid_top1(rt: &Runtime, logits: &Tensor, name: &str) -> Result<Routing> {
    rt.check_cancel()?;
    rt.set_op("moe.llama4_routing");
    let (m, e) = (logits.rows(), logits.cols());
    let t = |n: &str, dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, &[m, 1], dt)
    };
    let values = t("max_values", logits.dtype)?;
    let indices = t("max_indices", DType::I64)?;
    let values_f32 = t("max_values_f32", DType::F32)?;
    let mut weights = t("topk_weights", DType::F32)?;
    let mut ids = t("topk_ids", DType::I32)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cuda => return Err(on_cuda()),
        Backend::Cpu => {
            let mut w = Vec::with_capacity(m);
            let mut id = Vec::with_capacity(m);
            for row in logits.f32().chunks_exact(e) {
                // torch.max: the first of equal maxima.
                let (best, &x) = row.iter().enumerate().fold((0, &row[0]), |acc, (j, x)| {
                    if *x > *acc.1 {
                        (j, x)
                    } else {
                        acc
                    }
                });
                w.push(1.0 / (1.0 + (-x).exp()));
                id.push(best as i32);
            }
            weights.f32_mut().copy_from_slice(&w);
            ids.i32_mut().copy_from_slice(&id);
        }
    }
    drop((values, values_f32, indices));
    Ok(Routing {
        weights,
        ids,
        host_ids: None,
    })
}

/// `apply_router_weight_on_input=True` (llama4.py 0.19 L139): the fused kernel multiplies the
/// first GEMM's rows by the token's weight (`MUL_ROUTED_WEIGHT` on `w13`) and not the second's,
/// which is the expert run on `weight · x`. On the CPU that is done to the rows of `x` and
/// the weights set to 1 for the shared expert kernels. The in-place kernel (0.11) allocates
/// nothing for it; the modular kernel's `prepare` (0.15 on) makes a weighted copy of the
/// input (`Experts::weight_on_input`, allocated in `ops_moe_v1::fused_experts`).
pub fn weight_on_input(rt: &Runtime, x: &mut Tensor, routing: &mut Routing) -> Result<()> {
    if rt.backend() != Backend::Cpu {
        return Ok(());
    }
    let h = x.cols();
    let dt = x.dtype;
    for (row, w) in x
        .f32_mut()
        .chunks_exact_mut(h)
        .zip(routing.weights.f32_mut().iter_mut())
    {
        for v in row.iter_mut() {
            *v = dt.round(*v * *w);
        }
        *w = 1.0;
    }
    Ok(())
}

/// `routed_out + shared_out` (llama4.py 0.19 L156): a new tensor.
pub fn add(rt: &Runtime, a: &Tensor, b: &Tensor, name: &str) -> Result<Tensor> {
    crate::engine::ops_opt::add(rt, a, b, name)
}

#[cfg(test)]
mod tests {
    use super::chunked_seq_lens;

    #[test]
    fn chunks_cut_each_sequence_at_multiples_of_the_chunk() {
        assert_eq!(chunked_seq_lens(&[6, 5], 4), [4, 2, 4, 1]);
        assert_eq!(chunked_seq_lens(&[8, 3], 4), [4, 4, 3]);
        assert_eq!(chunked_seq_lens(&[3], 8192), [3]);
    }
}

//! vLLM 0.8.5's fused mixture-of-experts (model_executor/layers/fused_moe/fused_moe.py, the
//! V0 engine's eager path for 16-bit weights on CUDA): the routing (`fused_topk`), the two
//! grouped GEMMs over the tokens sorted by expert (`fused_experts_impl`) and their buffers,
//! allocated in vLLM's order, with the math on the CPU (dry: the allocations only).

use crate::base::error::{Error, Result};
use crate::device::{cpu, Backend};
use crate::engine::moe_configs::TUNED;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// `VLLM_FUSED_MOE_CHUNK_SIZE`'s default: tokens per pass through the experts (0.8.5
/// envs.py L456-457).
pub const CHUNK_TOKENS: usize = 32768;

/// The top-k routing of every token: its experts' ids and weights (f32), as `fused_topk`
/// returns them (0.8.5 fused_moe.py L851-885).
pub struct Routing {
    pub weights: Tensor,
    pub ids: Tensor,
}

/// `fused_topk(hidden_states, gating_output, topk, renormalize)`: `topk_weights [M, k]` f32,
/// `topk_ids [M, k]` i32 and `token_expert_indicies [M, k]` i32, then `gating_output.float()`
/// (`[M, E]` f32, a copy: the logits are in the model's dtype); the C++ `topk_softmax` takes a
/// `[M·E]` f32 workspace when E is not a power of two or above 256
/// (csrc/moe/topk_softmax_kernels.cu L489-495 at 0.8.5); renormalising divides by a `[M, 1]`
/// sum into a new `[M, k]` tensor (`vllm_topk_softmax`, L839-840), the first one dying as the
/// caller rebinds it; `token_expert_indicies` is deleted (L883), the f32 copy dies on return.
/// Softmax in f32, top-k by value with ties to the lower expert index (the kernel's
/// "lower indices win" argmax).
pub fn fused_topk(
    rt: &Runtime,
    logits: &Tensor,
    top_k: usize,
    renormalize: bool,
    name: &str,
) -> Result<Routing> {
    rt.check_cancel()?;
    rt.set_op("moe.topk_softmax");
    let (m, e) = (logits.rows(), logits.cols());
    let t = |n: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, shape, dt)
    };
    let mut weights = t("topk_weights", &[m, top_k], DType::F32)?;
    let mut ids = t("topk_ids", &[m, top_k], DType::I32)?;
    let token_expert_indicies = t("token_expert_indicies", &[m, top_k], DType::I32)?;
    let mut gating = t("gating_output_float", &[m, e], DType::F32)?;
    if !e.is_power_of_two() || e > 256 {
        drop(t("topk_softmax_workspace", &[m * e], DType::F32)?);
    }
    if rt.backend() == Backend::Cpu {
        gating.f32_mut().copy_from_slice(logits.f32());
        let (w, id) = (weights.f32_mut(), ids.i32_mut());
        for (r, row) in gating.f32().chunks_exact(e).enumerate() {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = row.iter().map(|&x| (x - max).exp()).collect();
            let sum: f32 = exps.iter().sum();
            let mut order: Vec<usize> = (0..e).collect();
            // Larger probability first; equal ones by the lower index.
            order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]).then(a.cmp(&b)));
            for (j, &x) in order[..top_k].iter().enumerate() {
                w[r * top_k + j] = exps[x] / sum;
                id[r * top_k + j] = x as i32;
            }
        }
    }
    if renormalize {
        rt.set_op("moe.renormalize");
        let sum = t("topk_weights_sum", &[m, 1], DType::F32)?;
        let mut renormed = t("topk_weights_renormalized", &[m, top_k], DType::F32)?;
        if rt.backend() == Backend::Cpu {
            let src = weights.f32();
            for (o, row) in renormed
                .f32_mut()
                .chunks_exact_mut(top_k)
                .zip(src.chunks_exact(top_k))
            {
                let s: f32 = row.iter().sum();
                for (d, &x) in o.iter_mut().zip(row) {
                    *d = x / s;
                }
            }
        }
        drop(sum);
        weights = renormed;
    }
    drop(token_expert_indicies);
    drop(gating);
    Ok(Routing { weights, ids })
}

/// `BLOCK_SIZE_M` of the Triton config `try_get_optimal_moe_config` picks for `m` tokens
/// (0.8.5 fused_moe.py L795-830): the tuned file `E={e},N={n},device_name={gpu}.json`
/// (n = `w2.shape[2]`, the expert width on this rank; the GPU's name with spaces as
/// underscores) at the key nearest `m`, ties to the earlier key; without one,
/// `get_default_config`'s 16-bit rule (L738-793): 16 when `m <= e`, else 64. Returns the
/// size and where it came from.
pub fn block_size_m(gpu: &str, e: usize, n: usize, m: usize) -> (usize, String) {
    // A simulated device's name carries its note in parentheses.
    let gpu = gpu
        .split(" (")
        .next()
        .unwrap_or(gpu)
        .trim()
        .replace(' ', "_");
    let file = format!("E={e},N={n},device_name={gpu}.json");
    match TUNED
        .iter()
        .find(|(fe, fn_, fd, _)| *fe == e && *fn_ == n && *fd == gpu)
    {
        Some((_, _, _, keys)) => {
            let mut best = keys[0];
            for &k in &keys[1..] {
                if k.0.abs_diff(m) < best.0.abs_diff(m) {
                    best = k;
                }
            }
            (best.1, format!("{file}, key {}", best.0))
        }
        None => (
            if m <= e { 16 } else { 64 },
            format!("no {file} in vLLM 0.8.5: get_default_config"),
        ),
    }
}

/// The experts' weights of one layer, as `FusedMoE` holds them: `w13 [E, 2·I, H]` (each
/// expert's gate rows, then its up rows) and `w2 [E, H, I]`, `I` this rank's share of the
/// expert width.
pub struct Experts<'a> {
    pub w13: &'a Tensor,
    pub w2: &'a Tensor,
    pub num_experts: usize,
    pub width: usize,
}

/// `fused_experts(x, w13, w2, topk_weights, topk_ids, inplace=True)` into `x`
/// (0.8.5 fused_moe.py L1230-1426): `cache13`, one `[M_c·k·max(2I, H)]` buffer that holds
/// `intermediate_cache1 [M_c, k, 2I]` and `intermediate_cache3 [M_c, k, H]`, then
/// `intermediate_cache2 [M_c·k, I]` (M_c = min(M, `CHUNK_TOKENS`)); per chunk of T tokens
/// `moe_align_block_size`'s `sorted_ids [T·k + E·(B−1)]`, `expert_ids
/// [⌈(T·k + E·(B−1)) / B⌉]` and `num_tokens_post_pad [1]` (int32,
/// moe_align_block_size.py L201-216), allocated before the previous chunk's die. The GEMMs,
/// `silu_and_mul` and `moe_sum` allocate nothing; the output is `x` itself. On return the
/// cache buffer dies, then the chunk's alignment tensors, then cache2. `gpu` picks
/// `BLOCK_SIZE_M` ([`block_size_m`]).
///
/// The math, on the CPU: each token's `top_k` experts, `silu(x·W1ᵀ) ⊙ (x·W3ᵀ)` times `W2ᵀ`,
/// times the routing weight, summed over the `k` experts; in f32 as the engine's other CPU
/// ops.
pub fn fused_experts(
    rt: &Runtime,
    x: &mut Tensor,
    ex: &Experts,
    routing: &Routing,
    gpu: &str,
    name: &str,
) -> Result<()> {
    rt.check_cancel()?;
    rt.set_op("moe.fused_experts");
    let (m, h) = (x.rows(), x.cols());
    let top_k = routing.ids.cols();
    let (e, i) = (ex.num_experts, ex.width);
    let n = 2 * i;
    if ex.w13.numel() != e * n * h || ex.w2.numel() != e * h * i {
        return Err(Error::Request(format!(
            "{name}: experts {} and {} do not hold {e} experts of width {i} over {h} inputs",
            ex.w13.name, ex.w2.name
        )));
    }
    let m_c = m.min(CHUNK_TOKENS);
    let act = x.dtype;
    let t = |nm: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{nm}"), Category::Activation, shape, dt)
    };
    let cache13 = t("intermediate_cache13", &[m_c * top_k * n.max(h)], act)?;
    let cache2 = t("intermediate_cache2", &[m_c * top_k, i], act)?;
    let mut align: Option<[Tensor; 3]> = None;
    let mut start = 0;
    while start < m {
        let tokens = (m - start).min(CHUNK_TOKENS);
        rt.set_op("moe.align_block_size");
        let (b, _) = block_size_m(gpu, e, i, tokens);
        let padded = tokens * top_k + e * (b - 1);
        let next = [
            t("sorted_ids", &[padded], DType::I32)?,
            t("expert_ids", &[padded.div_ceil(b)], DType::I32)?,
            t("num_tokens_post_pad", &[1], DType::I32)?,
        ];
        drop(align.replace(next));
        rt.set_op("moe.fused_experts");
        if rt.backend() == Backend::Cpu {
            experts_cpu(rt, x, ex, routing, start..start + tokens)?;
        }
        start += tokens;
    }
    drop(cache13);
    drop(align);
    drop(cache2);
    Ok(())
}

/// Tokens `rows` of `x` through their experts on the CPU, written back into `x`: per expert,
/// its tokens gathered, the two GEMMs, each product scaled by its routing weight and added
/// to the token's sum.
fn experts_cpu(
    rt: &Runtime,
    x: &mut Tensor,
    ex: &Experts,
    routing: &Routing,
    rows: std::ops::Range<usize>,
) -> Result<()> {
    let h = x.cols();
    let top_k = routing.ids.cols();
    let (e, i) = (ex.num_experts, ex.width);
    let (w13, w2) = (ex.w13.f32(), ex.w2.f32());
    let (ids, weights) = (routing.ids.i32(), routing.weights.f32());
    let cancel = rt.cancel_flag();
    let xs = x.f32_mut();
    let mut sums = vec![0f32; rows.len() * h];
    for expert in 0..e {
        // (token, routing weight) of every token routed to this expert.
        let picked: Vec<(usize, f32)> = rows
            .clone()
            .flat_map(|r| (0..top_k).map(move |j| (r, j)))
            .filter(|&(r, j)| ids[r * top_k + j] as usize == expert)
            .map(|(r, j)| (r, weights[r * top_k + j]))
            .collect();
        if picked.is_empty() {
            continue;
        }
        let p = picked.len();
        let mut xe = Vec::with_capacity(p * h);
        for &(r, _) in &picked {
            xe.extend_from_slice(&xs[r * h..(r + 1) * h]);
        }
        let mut gate_up = vec![0f32; p * 2 * i];
        let w13e = &w13[expert * 2 * i * h..(expert + 1) * 2 * i * h];
        cpu::matmul_nt_cancellable(&xe, w13e, &mut gate_up, (p, h, 2 * i), &cancel)?;
        let mut a = vec![0f32; p * i];
        for (o, gu) in a.chunks_exact_mut(i).zip(gate_up.chunks_exact(2 * i)) {
            cpu::silu_mul_into(&gu[..i], &gu[i..], o);
        }
        let mut y = vec![0f32; p * h];
        let w2e = &w2[expert * h * i..(expert + 1) * h * i];
        cpu::matmul_nt_cancellable(&a, w2e, &mut y, (p, i, h), &cancel)?;
        for (&(r, w), yr) in picked.iter().zip(y.chunks_exact(h)) {
            let s = &mut sums[(r - rows.start) * h..(r - rows.start + 1) * h];
            for (d, &v) in s.iter_mut().zip(yr) {
                *d += w * v;
            }
        }
    }
    xs[rows.start * h..rows.end * h].copy_from_slice(&sums);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_follows_the_tuned_file_nearest_key_or_the_default() {
        // Mixtral-8x7B on one H200: E=8,N=14336's keys 4096 (for 8192 tokens) and 2048.
        assert_eq!(block_size_m("NVIDIA H200", 8, 14336, 8192).0, 128);
        // 100 tokens: key 96 (32) is nearer than 128 (64); 112 is as near to both and the
        // earlier key wins; 113 is nearer 128.
        assert_eq!(block_size_m("NVIDIA H200", 8, 14336, 100).0, 32);
        assert_eq!(block_size_m("NVIDIA H200", 8, 14336, 112).0, 32);
        assert_eq!(block_size_m("NVIDIA H200", 8, 14336, 113).0, 64);
        // Qwen3-235B over 8 H200s (N = 1536 / 8): key 2048 gives 64, 3072 gives 128; 2560
        // is as near to both and the earlier key wins.
        assert_eq!(block_size_m("NVIDIA H200", 128, 192, 2048).0, 64);
        assert_eq!(block_size_m("NVIDIA H200", 128, 192, 2560).0, 64);
        assert_eq!(block_size_m("NVIDIA H200", 128, 192, 2561).0, 128);
        // A simulated device's name finds the same file.
        let (b, why) = block_size_m("NVIDIA H200 (simulated, vLLM's total)", 128, 768, 8192);
        assert_eq!(b, 128);
        assert!(
            why.contains("E=128,N=768,device_name=NVIDIA_H200.json"),
            "{why}"
        );
        // No 16-bit file for the H100 and Mixtral's full width: the default.
        let (b, why) = block_size_m("NVIDIA H100 80GB HBM3", 8, 14336, 8192);
        assert_eq!(b, 64);
        assert!(why.contains("get_default_config"), "{why}");
        assert_eq!(block_size_m("NVIDIA H100 80GB HBM3", 128, 768, 100).0, 16);
    }
}

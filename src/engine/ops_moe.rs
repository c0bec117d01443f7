//! vLLM 0.8.5's fused mixture-of-experts (model_executor/layers/fused_moe/fused_moe.py, the
//! V0 engine's eager path for 16-bit weights on CUDA): the routing (`fused_topk`), the two
//! grouped GEMMs over the tokens sorted by expert (`fused_experts_impl`) and their buffers,
//! allocated in vLLM's order, with the math on the CPU or the GPU (dry: the allocations only).
//! On the GPU the routing (a few values a token) is computed on the host from the router's
//! logits and written into vLLM's routing tensors, the sorted slot layout likewise into
//! `moe_align_block_size`'s; the GEMMs, `silu_and_mul` and `moe_sum` run as kernels.

use crate::base::error::{Error, Result};
use crate::device::cuda::{GroupedGemm, Sorted};
use crate::device::{cpu, Backend};
use crate::engine::moe_configs::TUNED;
use crate::engine::ops;
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
    /// The ids on the host too, on the GPU (the slot layout is built from them there).
    pub host_ids: Option<Vec<i32>>,
}

/// Softmax of each row of `gating` (`e` wide) in f32, its `top_k` largest by value with ties
/// to the lower expert index (`topk_softmax`'s "lower indices win"): weights and ids.
pub(crate) fn host_topk(gating: &[f32], e: usize, top_k: usize) -> (Vec<f32>, Vec<i32>) {
    let rows = gating.len() / e;
    let (mut w, mut id) = (vec![0f32; rows * top_k], vec![0i32; rows * top_k]);
    for (r, row) in gating.chunks_exact(e).enumerate() {
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
    (w, id)
}

/// Each row of `top_k` weights divided by its sum.
pub(crate) fn host_renormalize(w: &[f32], top_k: usize) -> Vec<f32> {
    w.chunks_exact(top_k)
        .flat_map(|row| {
            let s: f32 = row.iter().sum();
            row.iter().map(move |&x| x / s)
        })
        .collect()
}

/// `fused_topk(hidden_states, gating_output, topk, renormalize)`: `topk_weights [M, k]` f32,
/// `topk_ids [M, k]` i32 and `token_expert_indicies [M, k]` i32, then `gating_output.float()`
/// (`[M, E]` f32, a copy: the logits are in the model's dtype); the C++ `topk_softmax` takes a
/// `[M·E]` f32 workspace when E is not a power of two or above 256
/// (csrc/moe/topk_softmax_kernels.cu L489-495 at 0.8.5); renormalising divides by a `[M, 1]`
/// sum into a new `[M, k]` tensor (`vllm_topk_softmax`, L839-840), the first one dying as the
/// caller rebinds it; `token_expert_indicies` is deleted (L883), the f32 copy dies on return.
/// Softmax in f32, top-k by value with ties to the lower expert index (the kernel's
/// "lower indices win" argmax). `indices_freed_late`: `token_expert_indices` dies after the
/// f32 copy, as `select_experts` returns it up the stack (0.11.0 layer.py L1735).
pub fn fused_topk(
    rt: &Runtime,
    logits: &Tensor,
    top_k: usize,
    renormalize: bool,
    indices_freed_late: bool,
    name: &str,
) -> Result<Routing> {
    rt.check_cancel()?;
    rt.set_op("moe.topk_softmax");
    let (m, e) = (logits.rows(), logits.cols());
    let t = |n: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, shape, dt)
    };
    let [mut weights, mut ids, token_expert_indicies] =
        routing_tensors(rt, m, top_k, "token_expert_indicies", name)?;
    let mut gating = t("gating_output_float", &[m, e], DType::F32)?;
    if !e.is_power_of_two() || e > 256 {
        drop(t("topk_softmax_workspace", &[m * e], DType::F32)?);
    }
    let mut host_ids = None;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            gating.f32_mut().copy_from_slice(logits.f32());
            let (w, id) = host_topk(gating.f32(), e, top_k);
            weights.f32_mut().copy_from_slice(&w);
            ids.i32_mut().copy_from_slice(&id);
        }
        Backend::Cuda => {
            // The routing on the GPU into vLLM's tensors; only the ids come to the host, for
            // the slot layout.
            ops::cuda(rt, |c| {
                c.moe_topk_softmax(logits, Some(&mut gating), &mut weights, &mut ids, false)
            })?;
            host_ids = Some(ops::cuda(rt, |c| c.download_ids(&ids, name))?);
        }
    }
    if renormalize {
        rt.set_op("moe.renormalize");
        let sum = t("topk_weights_sum", &[m, 1], DType::F32)?;
        let mut renormed = t("topk_weights_renormalized", &[m, top_k], DType::F32)?;
        match rt.backend() {
            Backend::Dry => {}
            Backend::Cpu => {
                let r = host_renormalize(weights.f32(), top_k);
                renormed.f32_mut().copy_from_slice(&r);
            }
            Backend::Cuda => ops::cuda(rt, |c| c.moe_renorm(&weights, &mut renormed, top_k))?,
        }
        drop(sum);
        weights = renormed;
    }
    if indices_freed_late {
        drop(gating);
        drop(token_expert_indicies);
    } else {
        drop(token_expert_indicies);
        drop(gating);
    }
    Ok(Routing {
        weights,
        ids,
        host_ids,
    })
}

/// `topk_weights [M, k]` f32, `topk_ids [M, k]` i32 and the token-expert indices `[M, k]`
/// i32 (named `indices`: 0.8.5 spells it `token_expert_indicies`), as every release's
/// `fused_topk` makes them first.
pub(crate) fn routing_tensors(
    rt: &Runtime,
    m: usize,
    top_k: usize,
    indices: &str,
    name: &str,
) -> Result<[Tensor; 3]> {
    let t = |n: &str, dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, &[m, top_k], dt)
    };
    Ok([
        t("topk_weights", DType::F32)?,
        t("topk_ids", DType::I32)?,
        t(indices, DType::I32)?,
    ])
}

/// `F.sigmoid(gate) * shared` of Qwen2-MoE's shared expert (qwen2_moe.py L148-150 at 0.8.5):
/// the sigmoid of the gate's `[M, 1]` logits (a new tensor; the logits die as the call
/// returns), the product broadcast over the `[M, H]` shared output (a new tensor), then the
/// sigmoid and the unscaled output die.
pub fn sigmoid_scale(rt: &Runtime, gate: Tensor, shared: Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("moe.shared_expert_gate");
    let (m, h) = (shared.rows(), shared.cols());
    if gate.numel() != m {
        return Err(Error::Request(format!(
            "{name}: a gate of {:?} for a shared output of {:?}",
            gate.shape, shared.shape
        )));
    }
    let compute = rt.backend() == Backend::Cpu;
    let gpu = rt.backend() == Backend::Cuda;
    let act = shared.dtype;
    let t = |n: &str, shape: &[usize]| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, shape, act)
    };
    let mut sig = t("gate_sigmoid", &[m, 1])?;
    if gpu {
        ops::cuda(rt, |c| c.moe_sigmoid(&gate, &mut sig))?;
    }
    if compute {
        for (o, &g) in sig.f32_mut().iter_mut().zip(gate.f32()) {
            *o = 1.0 / (1.0 + (-g).exp());
        }
    }
    drop(gate);
    let mut out = t("gated", &[m, h])?;
    if gpu {
        ops::cuda(rt, |c| c.moe_row_scale(&sig, &shared, &mut out))?;
    }
    if compute {
        let sv = sig.f32();
        for (r, (o, x)) in out
            .f32_mut()
            .chunks_exact_mut(h)
            .zip(shared.f32().chunks_exact(h))
            .enumerate()
        {
            for (d, &v) in o.iter_mut().zip(x) {
                *d = sv[r] * v;
            }
        }
    }
    drop(sig);
    drop(shared);
    Ok(out)
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

/// `block_size_m` as vLLM 0.19 picks it: the tuned file's nearest key where there is one
/// (0.8.5's files for these shapes), else 0.19's `get_default_config` (fused_moe.py
/// L1276-1285): 16 up to 32 tokens, 32 up to 96, 64 up to 512, then 128.
pub fn block_size_m_0_19(gpu: &str, e: usize, n: usize, m: usize) -> (usize, String) {
    let (b, why) = block_size_m(gpu, e, n, m);
    if !why.starts_with("no ") {
        return (b, why);
    }
    let b = match m {
        0..=32 => 16,
        33..=96 => 32,
        97..=512 => 64,
        _ => 128,
    };
    (
        b,
        format!("E={e},N={n}: no tuned file, 0.19's get_default_config"),
    )
}

/// `block_size_m` as vLLM 0.21 to 0.28 pick it for 16-bit experts: the tuned file's nearest
/// key (`try_get_optimal_moe_config` and `get_moe_configs` as 0.19's, 0.21.0 fused_moe.py),
/// among the wheel's files (`TUNED_0_21`), a device whose name has the token `H200` reading
/// `NVIDIA_H200`'s (fused_moe.py L1003-1005 at 0.23.0); without one, 0.19's
/// `get_default_config` (unchanged for 16-bit experts in 0.21.0-0.28.0).
pub fn block_size_m_0_21(gpu: &str, e: usize, n: usize, m: usize) -> (usize, String) {
    let mut name = gpu
        .split(" (")
        .next()
        .unwrap_or(gpu)
        .trim()
        .replace(' ', "_");
    if name.split('_').any(|t| t == "H200") {
        name = "NVIDIA_H200".into();
    }
    let file = format!("E={e},N={n},device_name={name}.json");
    let found = crate::engine::moe_configs::TUNED_0_21
        .iter()
        .find(|(fe, fn_, fd, _)| *fe == e && *fn_ == n && *fd == name);
    if let Some((_, _, _, keys)) = found {
        let mut best = keys[0];
        for &k in &keys[1..] {
            if k.0.abs_diff(m) < best.0.abs_diff(m) {
                best = k;
            }
        }
        return (best.1, format!("{file} in vLLM 0.21.0, key {}", best.0));
    }
    let b = match m {
        0..=32 => 16,
        33..=96 => 32,
        97..=512 => 64,
        _ => 128,
    };
    (b, format!("no {file} in vLLM 0.21.0: get_default_config"))
}

/// The experts' weights of one layer, as `FusedMoE` holds them: `w13 [E, 2·I, H]` (each
/// expert's gate rows, then its up rows) and `w2 [E, H, I]`, `I` this rank's share of the
/// expert width.
pub struct Experts<'a> {
    pub w13: &'a Tensor,
    pub w2: &'a Tensor,
    /// The experts this rank holds (`local_num_experts`).
    pub num_experts: usize,
    pub width: usize,
    /// With expert parallel: the global index of the first local expert, and every expert
    /// the router picks from (`global_num_experts`); without, 0 and `num_experts`.
    pub first: usize,
    pub global: usize,
    /// vLLM passes an `expert_map` to the kernels (expert parallel): `moe_align_block_size`
    /// pads for the global experts and maps its `expert_ids` through the map into a new
    /// tensor (`expert_ids = expert_map[expert_ids]`, 0.11.0 moe_align_block_size.py L84-85,
    /// 0.19.0 L100-101), the unmapped one dying as the function returns.
    pub mapped: bool,
    /// Block-wise fp8 experts (`Fp8MoEMethod` with `block_quant`): `w13` and `w2` hold
    /// float8_e4m3fn codes and these their f32 `weight_scale_inv` grids.
    pub fp8_block: Option<Fp8BlockScales<'a>>,
    /// Per-tensor fp8 experts (`Fp8OnlineMoEMethod`, `--quant fp8` on a 16-bit checkpoint):
    /// `w13` and `w2` hold float8_e4m3fn codes and these their per-expert scales.
    pub fp8_tensor: Option<Fp8TensorScales<'a>>,
    /// `apply_router_weight_on_input` (Llama 4): the modular kernel's `prepare` scales a new
    /// copy of the input by the token's weight (`a1 = a1 * topk_weights.to(a1.dtype)`, 0.15.1
    /// prepare_finalize.py L53, 0.19.0 prepare_finalize/no_dp_ep.py L74, the same in 0.21 to
    /// 0.33); the in-place kernel (0.11) multiplies inside the GEMM instead.
    pub weight_on_input: bool,
}

impl Experts<'_> {
    /// The global expert of local expert `local`.
    pub fn global_id(&self, local: usize) -> usize {
        self.first + local
    }
}

/// `expert_ids = expert_map[expert_ids]`: a new int32 tensor of the same length, the unmapped
/// one replaced (it dies as `moe_align_block_size` returns).
pub(crate) fn map_expert_ids(rt: &Runtime, ids: &mut Tensor, name: &str) -> Result<()> {
    let mapped = rt.tensor_for_overwrite(
        format!("{name}.expert_ids_mapped"),
        Category::Activation,
        &ids.shape,
        DType::I32,
    )?;
    drop(std::mem::replace(ids, mapped));
    Ok(())
}

/// A block-wise fp8 layer's expert scales: `w13_weight_scale_inv [E, 2·⌈I/128⌉, ⌈H/128⌉]` and
/// `w2_weight_scale_inv [E, ⌈H/128⌉, ⌈I/128⌉]` (fp8.py L700-712 at 0.19.0).
#[derive(Clone, Copy)]
pub struct Fp8BlockScales<'a> {
    pub w13: &'a Tensor,
    pub w2: &'a Tensor,
    /// The block side the kernels use: the checkpoint's 128, or the finer block from 0.29
    /// (`refine_fp8_moe_block_shape`, `Loader::experts_fp8_block`), with which the inputs are
    /// quantized in groups of as many and no tuned config file is found.
    pub group: usize,
}

impl<'a> Fp8BlockScales<'a> {
    /// The scales of experts `hidden` wide: their block side read back from `w13`'s grid
    /// (`[E, 2·I/b, H/b]`): the refined block where the grid divides the hidden size into
    /// blocks under 128, else the checkpoint's 128.
    pub fn new(w13: &'a Tensor, w2: &'a Tensor, hidden: usize) -> Self {
        let cols = w13.shape[2].max(1);
        let group = if hidden.is_multiple_of(cols) && hidden / cols < 128 {
            hidden / cols
        } else {
            128
        };
        Fp8BlockScales { w13, w2, group }
    }
}

/// `per_token_group_quant_fp8(A, group)` as the fused MoE quantizes its inputs
/// (`moe_kernel_quantize_input` → `_fp8_quantize`, fused_moe/utils.py L114-136 at 0.11.0,
/// L125-148 at 0.19.0; `group` is the block's k side, 128 but where 0.29 refines it): the
/// codes `[rows, k]` in float8_e4m3fn (`empty_like`), then the f32 group scales
/// `[rows, k / group]`.
pub(crate) fn group_quant(
    rt: &Runtime,
    (rows, k, group): (usize, usize, usize),
    names: [&str; 2],
    name: &str,
) -> Result<[Tensor; 2]> {
    rt.set_op("moe.per_token_group_quant_fp8");
    let t = |nm: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{nm}"), Category::Activation, shape, dt)
    };
    let codes = t(names[0], &[rows, k], DType::F8E4M3)?;
    let scales = t(names[1], &[rows, k.div_ceil(group)], DType::F32)?;
    Ok([codes, scales])
}

/// The refusal for block-wise fp8 experts off the dry path: their math is not written.
pub(crate) fn fp8_block_experts_refused(name: &str) -> Error {
    Error::Request(format!(
        "{name}: block-wise fp8 experts run dry only so far (their fp8 fused-MoE math is not written for the CPU or the GPU); use a :dry simulated device"
    ))
}

/// `BLOCK_SIZE_M` of the Triton config a V1 release picks for block-wise fp8 experts
/// (`try_get_optimal_moe_config` with dtype `fp8_w8a8` and block shape [128, 128]:
/// 0.11.0 fused_moe.py L922-, 0.15.1 L1289-, 0.19.0 L1323-1352): the release's tuned file
/// `E={e},N={n},device_name={gpu},dtype=fp8_w8a8,block_shape=[128,128].json` at the key
/// nearest `m` (ties to the earlier key), else `get_default_config`'s block-wise rule: 64
/// (0.11.0 L877-889, 0.15.1 L1242-1252), or 16 up to 64 tokens and 64 above (0.19.0
/// L1244-1258, the same rule to 0.33.0: docs/reading/vllm-fp8-block-moe-v021.md §5). From
/// 0.21 `release` names whose files the release ships (`RunnerV021::fp8_block_configs`).
pub fn block_size_m_fp8_block(
    release: &str,
    gpu: &str,
    (e, n, block): (usize, usize, usize),
    m: usize,
) -> (usize, String) {
    let gpu = gpu
        .split(" (")
        .next()
        .unwrap_or(gpu)
        .trim()
        .replace(' ', "_");
    let file =
        format!("E={e},N={n},device_name={gpu},dtype=fp8_w8a8,block_shape=[{block},{block}].json");
    // The releases ship tuned files for [128, 128] blocks only.
    let tuned = crate::engine::moe_configs_fp8_block::TUNED_FP8_BLOCK
        .iter()
        .filter(|_| block == 128)
        .find(|(r, fe, fn_, fd, _)| *r == release && *fe == e && *fn_ == n && *fd == gpu);
    match tuned {
        Some((_, _, _, _, keys)) => {
            let mut best = keys[0];
            for &k in &keys[1..] {
                if k.0.abs_diff(m) < best.0.abs_diff(m) {
                    best = k;
                }
            }
            (best.1, format!("{file} in vLLM {release}, key {}", best.0))
        }
        None => {
            let b = if !matches!(release, "0.11.0" | "0.15.1") && m <= 64 {
                16
            } else {
                64
            };
            (
                b,
                format!("no {file} in vLLM {release}: get_default_config"),
            )
        }
    }
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
    if ex.fp8_block.is_some() {
        return fused_experts_fp8_block(rt, x, ex, (top_k, gpu), name);
    }
    if ex.fp8_tensor.is_some() {
        return Err(Error::Request(format!(
            "{name}: per-tensor fp8 experts run under vLLM 0.19's modular kernel only (ops_moe_v1), not the in-place fused_experts"
        )));
    }
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
        // Padded for every expert the router may pick (`global_num_experts`).
        let padded = tokens * top_k + ex.global * (b - 1);
        let mut next = [
            t("sorted_ids", &[padded], DType::I32)?,
            t("expert_ids", &[padded.div_ceil(b)], DType::I32)?,
            t("num_tokens_post_pad", &[1], DType::I32)?,
        ];
        if ex.mapped {
            map_expert_ids(rt, &mut next[1], name)?;
        }
        rt.set_op("moe.fused_experts");
        match rt.backend() {
            Backend::Dry => {}
            Backend::Cpu => experts_cpu(rt, x, ex, routing, start..start + tokens)?,
            Backend::Cuda if ex.mapped => {
                return Err(Error::Request(format!(
                    "{name}: expert parallel runs on simulated devices only so far"
                )))
            }
            Backend::Cuda => {
                let bufs = CudaBuffers {
                    x: x.cuda_ptr(),
                    out: x.cuda_ptr(),
                    cache13: cache13.cuda_ptr(),
                    cache2: cache2.cuda_ptr(),
                    weights: routing.weights.cuda_ptr(),
                };
                chunk_cuda(
                    rt,
                    &mut next,
                    ex,
                    routing,
                    &bufs,
                    (start, tokens, b),
                    (h, act),
                    name,
                )?;
            }
        }
        drop(align.replace(next));
        start += tokens;
    }
    drop(cache13);
    drop(align);
    drop(cache2);
    Ok(())
}

/// `fused_experts_impl` over block-wise fp8 experts as vLLM 0.11.0 runs it in place
/// (fused_moe.py L1484-1700, `use_fp8_w8a8` with block shape [128, 128]; dry only):
/// `cache13 [M_c·k·max(2I, H)]` and `intermediate_cache2 [M_c·k, I]` in the activation dtype
/// as for 16-bit experts; per chunk of T tokens the input quantized (`qcurr_hidden_states
/// [T, H]` fp8 and `a1q_scale [T, H/128]` f32, L1621-1626), `moe_align_block_size`'s three
/// buffers (`BLOCK_SIZE_M` from the block-wise config, [`block_size_m_fp8_block`]), then
/// after the first GEMM and `silu_and_mul` the activation quantized (`qintermediate_cache2
/// [T·k, I]` fp8, `a2q_scale [T·k, I/128]` f32, L1674-1679); a chunk's tensors die as the next
/// rebinds them. On return the locals die in the order the function declares them
/// (`co_varnames`): the cache buffer (with its last view, `intermediate_cache3`),
/// `intermediate_cache2`, `qcurr_hidden_states`, `a1q_scale`, the alignment buffers,
/// `qintermediate_cache2`, `a2q_scale`.
fn fused_experts_fp8_block(
    rt: &Runtime,
    x: &mut Tensor,
    ex: &Experts,
    (top_k, gpu): (usize, &str),
    name: &str,
) -> Result<()> {
    if rt.backend() != Backend::Dry {
        return Err(fp8_block_experts_refused(name));
    }
    let (m, h) = (x.rows(), x.cols());
    let (e, i) = (ex.num_experts, ex.width);
    let m_c = m.min(CHUNK_TOKENS);
    let act = x.dtype;
    let t = |nm: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{nm}"), Category::Activation, shape, dt)
    };
    let cache13 = t("intermediate_cache13", &[m_c * top_k * (2 * i).max(h)], act)?;
    let cache2 = t("intermediate_cache2", &[m_c * top_k, i], act)?;
    // Each of a chunk's tensors dies as the next chunk's is assigned over it (the new ones
    // made first: a tuple unpacked name by name).
    let mut q1: Option<[Tensor; 2]> = None;
    let mut align: Option<[Tensor; 3]> = None;
    let mut q2: Option<[Tensor; 2]> = None;
    let mut start = 0;
    while start < m {
        let tokens = (m - start).min(CHUNK_TOKENS);
        let next = group_quant(
            rt,
            (tokens, h, 128),
            ["qcurr_hidden_states", "a1q_scale"],
            name,
        )?;
        drop(q1.replace(next));
        rt.set_op("moe.align_block_size");
        let (b, _) = block_size_m_fp8_block("0.11.0", gpu, (e, i, 128), tokens);
        let padded = tokens * top_k + e * (b - 1);
        let next = [
            t("sorted_ids", &[padded], DType::I32)?,
            t("expert_ids", &[padded.div_ceil(b)], DType::I32)?,
            t("num_tokens_post_pad", &[1], DType::I32)?,
        ];
        drop(align.replace(next));
        let next = group_quant(
            rt,
            (tokens * top_k, i, 128),
            ["qintermediate_cache2", "a2q_scale"],
            name,
        )?;
        drop(q2.replace(next));
        rt.set_op("moe.fused_experts");
        start += tokens;
    }
    drop(cache13);
    drop(cache2);
    drop(q1);
    drop(align);
    drop(q2);
    Ok(())
}

/// `moe_align_block_size`'s layout of a chunk's `ids` (`[T, k]` flattened: slot `t·k + j`):
/// each expert's slots in slot order, its run padded to a multiple of `b` with the value
/// T·k; `expert_ids` the expert of each block of `b`; the whole `sorted` (length `len`) filled
/// with T·k first, `expert_ids` past the used blocks zero.
pub struct AlignLayout {
    pub sorted: Vec<i32>,
    pub experts: Vec<i32>,
    pub used: usize,
}

pub fn align_block_size(ids: &[i32], e: usize, b: usize, len: usize) -> AlignLayout {
    let total = ids.len() as i32;
    let mut per: Vec<Vec<i32>> = vec![Vec::new(); e];
    for (slot, &x) in ids.iter().enumerate() {
        per[x as usize].push(slot as i32);
    }
    let mut sorted = vec![total; len];
    let mut experts = vec![0i32; len.div_ceil(b)];
    let mut at = 0;
    for (x, slots) in per.iter().enumerate() {
        sorted[at..at + slots.len()].copy_from_slice(slots);
        let run = slots.len().div_ceil(b) * b;
        experts[at / b..(at + run) / b].fill(x as i32);
        at += run;
    }
    AlignLayout {
        sorted,
        experts,
        used: at,
    }
}

/// Device addresses of a chunk's buffers: the experts read `x`'s rows and `moe_sum` writes
/// `out`'s (the same tensor for the in-place kernel).
pub(crate) struct CudaBuffers {
    pub x: u64,
    pub out: u64,
    pub cache13: u64,
    pub cache2: u64,
    pub weights: u64,
}

/// One chunk of `tokens` tokens from `start` on the GPU with blocks of `b` rows: the host's
/// `moe_align_block_size` layout of the chunk's ids uploaded into the three alignment
/// tensors `align` (allocated by the caller, as vLLM's op allocates them), then the experts
/// (`h` wide, in `act`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunk_cuda(
    rt: &Runtime,
    align: &mut [Tensor; 3],
    ex: &Experts,
    routing: &Routing,
    bufs: &CudaBuffers,
    (start, tokens, b): (usize, usize, usize),
    (h, act): (usize, DType),
    name: &str,
) -> Result<()> {
    let top_k = routing.ids.cols();
    let ids = routing.host_ids.as_deref().ok_or_else(|| {
        Error::Request(format!("{name}: the routing has no host copy of its ids"))
    })?;
    let [sorted, expert_ids, post_pad] = align;
    let chunk = &ids[start * top_k..(start + tokens) * top_k];
    let layout = align_block_size(chunk, ex.num_experts, b, sorted.numel());
    ops::upload_i32(rt, sorted, &layout.sorted)?;
    ops::upload_i32(rt, expert_ids, &layout.experts)?;
    ops::upload_i32(rt, post_pad, &[layout.used as i32])?;
    let s = Sorted {
        sorted: sorted.cuda_ptr(),
        experts: expert_ids.cuda_ptr(),
        block_m: b,
        used: layout.used,
        total: tokens * top_k,
    };
    experts_cuda(rt, bufs, ex, &s, (start, tokens, h, top_k), act)
}

/// One chunk (`tokens` tokens from `start`, `h` wide, `k` experts each) through its experts on
/// the GPU, in `fused_experts_impl`'s order (0.8.5 fused_moe.py L1340-1420): the grouped GEMM
/// of the chunk's rows of `x` with `w13` into cache1 (cache13's first `T·k·2I` elements),
/// `silu_and_mul` into cache2, the grouped GEMM of cache2 with `w2` into cache3 (cache13's
/// first `T·k·H`) with each slot's routing weight, `moe_sum` into the chunk's rows of `x`.
fn experts_cuda(
    rt: &Runtime,
    b: &CudaBuffers,
    ex: &Experts,
    s: &Sorted,
    (start, tokens, h, k): (usize, usize, usize, usize),
    act: DType,
) -> Result<()> {
    let i = ex.width;
    let el = act.size_bytes();
    let x = b.x + (start * h) as u64 * el;
    let out = b.out + (start * h) as u64 * el;
    let weights = b.weights + (start * k * 4) as u64;
    ops::cuda(rt, |c| {
        if !c.has_moe_gemm() {
            return Err(Error::Request(
                "the fused MoE on CUDA needs compute capability 8.0 or later (mma.sync)".into(),
            ));
        }
        let g1 = GroupedGemm {
            dtype: act,
            a: x,
            a_div: k,
            w: ex.w13.cuda_ptr(),
            c: b.cache13,
            scale: 0,
            n: 2 * i,
            k: h,
        };
        c.moe_gemm(&g1, s)?;
        c.moe_silu_mul(act, b.cache13, b.cache2, tokens * k, i)?;
        let g2 = GroupedGemm {
            dtype: act,
            a: b.cache2,
            a_div: 1,
            w: ex.w2.cuda_ptr(),
            c: b.cache13,
            scale: weights,
            n: h,
            k: i,
        };
        c.moe_gemm(&g2, s)?;
        c.moe_sum(act, b.cache13, out, (tokens, k, h))
    })
}

/// Tokens `rows` of `x` through their experts on the CPU, written back into `x`: per expert,
/// its tokens gathered, the two GEMMs, each product scaled by its routing weight and added
/// to the token's sum.
/// `experts_cpu` for another module's kernel: the chunk `rows` of `x` through their experts,
/// in place.
pub(crate) fn experts_cpu_rows(
    rt: &Runtime,
    x: &mut Tensor,
    ex: &Experts,
    routing: &Routing,
    rows: std::ops::Range<usize>,
) -> Result<()> {
    experts_cpu(rt, x, ex, routing, rows)
}

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
        // (token, routing weight) of every token routed to this expert (its global index:
        // the others are another rank's, and add nothing here).
        let global = ex.global_id(expert);
        let picked: Vec<(usize, f32)> = rows
            .clone()
            .flat_map(|r| (0..top_k).map(move |j| (r, j)))
            .filter(|&(r, j)| ids[r * top_k + j] as usize == global)
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

/// float8_e4m3fn's codec as vLLM's kernels run it: `scaled_fp8_quant(x, scale=None)`
/// (dynamic per tensor: codes and `max|x| / 448`) and a code's value.
#[derive(Clone, Copy)]
pub struct Fp8Codec {
    pub quantize: fn(&[f32]) -> (Vec<u8>, f32),
    pub decode: fn(u8) -> f32,
}

/// A layer's per-tensor fp8 experts' scales: `w13_weight_scale [E]` and `w2_weight_scale
/// [E]` (f32, one per expert: fp8.py L1016-1030 at 0.19.0), their values on the host.
#[derive(Clone, Copy)]
pub struct Fp8TensorScales<'a> {
    pub w13: &'a Tensor,
    pub w2: &'a Tensor,
    pub w13_values: &'a [f32],
    pub w2_values: &'a [f32],
    pub codec: Fp8Codec,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_fp8_configs_follow_the_files_each_release_ships() {
        let gpu = "NVIDIA H200 (simulated)";
        // DeepSeek-V3 at TP 8 (E=256, N=256): 0.25.1 retunes the smallest keys only.
        assert_eq!(
            block_size_m_fp8_block("0.19.0", gpu, (256, 256, 128), 1).0,
            16
        );
        assert_eq!(
            block_size_m_fp8_block("0.25.1", gpu, (256, 256, 128), 1).0,
            8
        );
        assert_eq!(
            block_size_m_fp8_block("0.25.1", gpu, (256, 256, 128), 8192).0,
            block_size_m_fp8_block("0.19.0", gpu, (256, 256, 128), 8192).0
        );
        // 0.24.0 adds E=512, N=128 on the H100 SXM; 0.19.0 falls back to the default rule.
        let h100 = "NVIDIA H100 80GB HBM3";
        assert_eq!(
            block_size_m_fp8_block("0.24.0", h100, (512, 128, 128), 1024).0,
            32
        );
        let (b, why) = block_size_m_fp8_block("0.19.0", h100, (512, 128, 128), 1024);
        assert_eq!((b, why.contains("get_default_config")), (64, true));
        // The default: 16 up to 64 tokens from 0.19 (also under 0.21's labels), 64 before.
        assert_eq!(
            block_size_m_fp8_block("0.25.1", h100, (96, 64, 128), 64).0,
            16
        );
        assert_eq!(
            block_size_m_fp8_block("0.15.1", h100, (96, 64, 128), 64).0,
            64
        );
    }

    #[test]
    fn align_sorts_slots_by_expert_in_padded_runs() {
        // 3 tokens, 2 experts each, 4 experts, blocks of 4: expert 0 has slots 1, 2; expert 1
        // none; expert 2 slots 0, 3, 5; expert 3 slot 4. Padding is T·k = 6; the buffer
        // holds T·k + E·(B − 1) = 18 entries.
        let ids = [2, 0, 0, 2, 3, 2];
        let l = align_block_size(&ids, 4, 4, 18);
        assert_eq!(
            l.sorted,
            [1, 2, 6, 6, 0, 3, 5, 6, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6]
        );
        assert_eq!(l.used, 12);
        assert_eq!(l.experts, [0, 2, 3, 0, 0]);
        // Every slot appears once; no run crosses a block of another expert.
        let mut seen: Vec<i32> = l.sorted.iter().copied().filter(|&x| x < 6).collect();
        seen.sort();
        assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
        for (i, &slot) in l.sorted[..l.used].iter().enumerate() {
            if slot < 6 {
                assert_eq!(ids[slot as usize], l.experts[i / 4]);
            }
        }
    }

    #[test]
    fn host_topk_and_renormalisation() {
        // Softmax of [0, ln 2, ln 2, ln 4] is [1, 2, 2, 4] / 9: top 2 are expert 3, then the
        // tie between 1 and 2 goes to the lower index.
        let (w, id) = host_topk(&[0.0, 2f32.ln(), 2f32.ln(), 4f32.ln()], 4, 2);
        assert_eq!(id, [3, 1]);
        assert!((w[0] - 4.0 / 9.0).abs() < 1e-6 && (w[1] - 2.0 / 9.0).abs() < 1e-6);
        let r = host_renormalize(&w, 2);
        assert!((r[0] - 2.0 / 3.0).abs() < 1e-6 && (r[1] - 1.0 / 3.0).abs() < 1e-6);
    }

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

//! vLLM V1's modular fused MoE for unquantized experts (`FusedMoEModularKernel` over
//! `TritonExperts`, 0.15.1 and 0.19.0 `model_executor/layers/fused_moe/modular_kernel.py`;
//! docs/reading/vllm-v1-fused-moe.md §2.2-2.3): the routing's three `[M, k]` tensors (the
//! renormalisation inside `topk_softmax`, no f32 copy of the logits), a new output, one
//! persistent workspace grown by the `WorkspaceManager` in the first MoE layer and never freed,
//! and per chunk `moe_align_block_size`'s buffers. The math is the in-place kernel's, run on a
//! copy of the input.

use std::cell::RefCell;

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::ops;
use crate::engine::ops_moe::{self, Experts, Routing};
use crate::engine::ops_moe_fp8;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// Which fused MoE a release runs for unquantized experts (no expert parallel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeKernel {
    /// 0.8.5's `fused_experts_impl`, in place into the hidden states, its caches made and
    /// freed in each layer (0.11.0 runs the same code: fused_moe.py L1484 there).
    InPlace {
        /// `token_expert_indices` lives until `select_experts` returns, after the f32 copy of
        /// the router's logits dies (0.11.0 layer.py L1735); 0.8.5 deletes it inside
        /// `fused_topk`, before.
        indices_freed_late: bool,
    },
    /// The modular kernel (0.15.1, 0.19.0).
    Modular(Modular),
}

/// How a release runs the modular kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modular {
    /// `VLLM_FUSED_MOE_CHUNK_SIZE` with activation chunking on (16384 in 0.15.1, envs.py);
    /// `None` from 0.19, which removed it.
    pub chunk_tokens: Option<usize>,
    /// `get_default_config`'s block size for shapes with no tuned file: 0.19's rule (16, 32,
    /// 64 or 128 by tokens, fused_moe.py L1276-1285) or the earlier one (16 if M ≤ E, else 64).
    pub default_block_m_by_tokens: bool,
    /// What 0.21's runner and workspace manager do around the same `TritonExperts`; `None`
    /// before 0.21.
    pub v0_21: Option<RunnerV021>,
}

/// vLLM 0.21's MoE runner and workspace manager, where they differ from 0.19's (the experts,
/// `_allocate_buffers`, `moe_align_block_size`, `get_default_config` and `fused_topk` read
/// the same: 0.21.0 experts/triton_moe.py L129-144, modular_kernel.py L1041-1102,
/// moe_align_block_size.py, fused_moe.py `get_default_config`, router/fused_topk_router.py):
/// - the workspace manager frees the old buffer, then calls `torch.accelerator.empty_cache()`,
///   then allocates the larger one (v1/worker/workspace.py L164-179; 0.19 does not empty the
///   cache);
/// - the tuned files are looked up for every GPU: the A100 and L40S files of
///   `fused_moe/configs/` too (`moe_configs::TUNED_AMPERE_ADA`);
/// - Qwen3-MoE hands its gate to `FusedMoE` (0.21.0 qwen3_moe.py `FusedMoE(gate=self.gate)`),
///   so the router's logits are made inside the op (runner/moe_runner.py `_forward_impl`:
///   `router_logits, _ = self.gate(hidden_states)`) and die as it returns, before the
///   all-reduce (`_maybe_reduce_final_output`, outside the op); Mixtral keeps its gate
///   outside (mixtral.py `MixtralMoE.forward`), as 0.19.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnerV021 {
    /// The model hands its gate to `FusedMoE` (set per model: `MoeKernel::for_arch`).
    pub gate_in_op: bool,
    /// With an expert map `moe_align_block_size` maps its `expert_ids` through it into a new
    /// tensor (0.21.0 moe_align_block_size.py L100-101, to 0.29.0); from 0.31 the map goes
    /// into the op (`ignore_invalid_experts`, 0.31.0 experts/triton_moe.py L350-372): no
    /// tensor. docs/reading/vllm-expert-parallel-v1.md §3.1.
    pub remaps_expert_ids: bool,
    /// With data parallel the combine's `reduce_scatterv` makes a new `[M, H]` copied into
    /// the output (0.21.0 prepare_finalize/naive_dp_ep.py L186-208, cuda_communicator.py
    /// L281; to 0.31.0); 0.33.0 reduce-scatters into the output (naive_dp_ep.py L260-284).
    pub combine_temp: bool,
    /// Whose tuned block-wise fp8 files the release ships (`moe_configs_fp8_block`): 0.21 to
    /// 0.23 ship 0.19.0's, 0.24.0 adds one, 0.25.1 retunes eight, kept to 0.33.0.
    pub fp8_block_configs: &'static str,
    /// The experts are FlashInfer's CUTLASS fused MoE (`FlashInferExperts`), what 0.21's and
    /// 0.22's unquantized oracle takes on Hopper without data parallel
    /// (docs/reading/vllm-flashinfer-cutlass-moe.md §1); Triton's otherwise.
    pub flashinfer_cutlass: bool,
}

impl RunnerV021 {
    /// 0.21's runner with the gate outside the op.
    pub const V0_21: RunnerV021 = RunnerV021 {
        gate_in_op: false,
        remaps_expert_ids: true,
        combine_temp: true,
        fp8_block_configs: "0.19.0",
        flashinfer_cutlass: false,
    };

    /// The runner of V1 release `0.minor` (0.21 on), the gate outside the op.
    pub fn for_minor(minor: u32) -> RunnerV021 {
        RunnerV021 {
            gate_in_op: false,
            remaps_expert_ids: minor < 31,
            combine_temp: minor < 33,
            fp8_block_configs: match minor {
                ..=23 => "0.19.0",
                24 => "0.24.0",
                _ => "0.25.1",
            },
            flashinfer_cutlass: false,
        }
    }
}

impl MoeKernel {
    /// The kernel as it runs model type `arch`: under 0.21 Qwen3-MoE's gate runs inside the op.
    pub fn for_arch(self, arch: &str) -> MoeKernel {
        match self {
            MoeKernel::Modular(Modular {
                chunk_tokens,
                default_block_m_by_tokens,
                v0_21: Some(r),
            }) => MoeKernel::Modular(Modular {
                chunk_tokens,
                default_block_m_by_tokens,
                v0_21: Some(RunnerV021 {
                    gate_in_op: arch == "qwen3_moe",
                    ..r
                }),
            }),
            k => k,
        }
    }
}

/// `fused_topk` as the V1 router runs it (0.19.0 router/fused_topk_router.py L78-90):
/// `topk_weights [M, k]` f32, `topk_ids [M, k]` i32 and `token_expert_indices [M, k]` i32,
/// renormalised inside the kernel; `token_expert_indices` dies as `_compute_routing` returns.
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
    let [mut weights, mut ids, token_expert_indices] =
        ops_moe::routing_tensors(rt, m, top_k, "token_expert_indices", name)?;
    if !e.is_power_of_two() || e > 256 {
        drop(t("topk_softmax_workspace", &[m * e], DType::F32)?);
    }
    let renorm = |w: Vec<f32>| {
        if renormalize {
            ops_moe::host_renormalize(&w, top_k)
        } else {
            w
        }
    };
    let mut host_ids = None;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let (w, id) = ops_moe::host_topk(logits.f32(), e, top_k);
            weights.f32_mut().copy_from_slice(&renorm(w));
            ids.i32_mut().copy_from_slice(&id);
        }
        Backend::Cuda => {
            // The routing on the GPU into vLLM's tensors, renormalised inside the kernel as
            // V1's; only the ids come to the host, for the slot layout.
            ops::cuda(rt, |c| {
                c.moe_topk_softmax(logits, None, &mut weights, &mut ids, renormalize)
            })?;
            host_ids = Some(ops::cuda(rt, |c| c.download_ids(&ids, name))?);
        }
    }
    drop(token_expert_indices);
    Ok(Routing {
        weights,
        ids,
        host_ids,
    })
}

/// `FusedMoEModularKernel.forward` on `x` (which stays with the caller): the new output
/// (`zeros_like` in 0.15.1 L1324, `empty_like` in 0.19.0 L1350), the workspace grown to
/// `r256(b·M_c·k·max(I, H)) + r256(b·M_c·k·max(2I, H))` bytes (one chunk; with several,
/// `+ r256(b·M·H)` for the output region: `_allocate_buffers`, 0.19.0 L1009-1070), the old
/// buffer freed first (v1/worker/workspace.py L150-160); then per chunk the alignment
/// buffers, freed as `apply` returns; `finalize` copies into the output (no allocation).
pub fn fused_experts(
    rt: &Runtime,
    x: &Tensor,
    ex: &Experts,
    routing: &Routing,
    (how, gpu): (Modular, &str),
    workspace: &RefCell<Option<Tensor>>,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("moe.fused_experts");
    check_experts(rt, x, ex, name)?;
    let mut out = rt.tensor_for_overwrite(
        format!("{name}.output"),
        Category::Activation,
        &x.shape,
        x.dtype,
    )?;
    if rt.backend() == Backend::Cpu {
        out.f32_mut().copy_from_slice(x.f32());
    }
    experts_into(
        rt,
        x,
        Some(&mut out),
        ex,
        routing,
        (how, gpu),
        workspace,
        name,
    )?;
    Ok(out)
}

/// The modular kernel after the routing: behind data parallel's dispatch where the group has
/// `dp` replicas (`fused_experts_dispatched`, 0.21 on), else on this rank's tokens
/// (`fused_experts`).
#[allow(clippy::too_many_arguments)]
pub fn fused_experts_on(
    rt: &Runtime,
    x: &Tensor,
    ex: &Experts,
    routing: &Routing,
    (how, gpu): (Modular, &str),
    workspace: &RefCell<Option<Tensor>>,
    dp: Option<usize>,
    name: &str,
) -> Result<Tensor> {
    match dp {
        Some(dp) => fused_experts_dispatched(rt, x, ex, routing, (how, gpu), workspace, dp, name),
        None => fused_experts(rt, x, ex, routing, (how, gpu), workspace, name),
    }
}

/// `FusedMoEKernelModularImpl.apply` from 0.21 with data parallel
/// (`MoEPrepareAndFinalizeNaiveDPEPModular`, docs/reading/vllm-expert-parallel-v1.md §3.2): the
/// output `[M, H]` made from this replica's input (with the router weight on the input, the
/// weighted copy after it, which is what is gathered), then the dispatch gathers every replica's
/// hidden states and the top-k weights and ids this replica routed (`all_gatherv`, one
/// `torch.empty` each in that order: `[dp·M, H]`, `[dp·M, k]` f32, `[dp·M, k]` i32; 0.21.0
/// naive_dp_ep.py L112-184, cuda_communicator.py L346-392); the workspace and the alignment
/// over the `dp·M` tokens; the combine's `reduce_scatterv` into a new `[M, H]` copied into the
/// output and dying at once (`RunnerV021::combine_temp`, to 0.31; 0.33 writes the output);
/// then the gathered ids, weights and hidden states die as `apply` returns. Runs dry only.
#[allow(clippy::too_many_arguments)]
pub fn fused_experts_dispatched(
    rt: &Runtime,
    x: &Tensor,
    ex: &Experts,
    routing: &Routing,
    (how, gpu): (Modular, &str),
    workspace: &RefCell<Option<Tensor>>,
    dp: usize,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    let Some(runner) = how.v0_21 else {
        return Err(Error::Request(format!(
            "{name}: the dispatch after the routing is 0.21's (earlier releases gather the router's logits)"
        )));
    };
    if rt.backend() != Backend::Dry {
        return Err(Error::Request(
            "data parallel's token exchange runs dry only so far".into(),
        ));
    }
    rt.set_op("moe.fused_experts");
    check_experts(rt, x, ex, name)?;
    let out = rt.tensor_for_overwrite(
        format!("{name}.output"),
        Category::Activation,
        &x.shape,
        x.dtype,
    )?;
    let (m, k) = (x.rows(), routing.ids.cols());
    let g = |what: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{what}"), Category::Activation, shape, dt)
    };
    // `apply_router_weight_on_input` (Llama 4): `prepare` multiplies before it dispatches
    // (naive_dp_ep.py 0.21.0 L125-131, 0.33.0 L185-190): the `[M, k]` cast, the weighted
    // `[M, H]` (the cast dying at once), which is what is gathered; it dies as `prepare`
    // returns, so the experts then see weights of 1 and make no copy of their own.
    let weighted = if ex.weight_on_input {
        rt.set_op("moe.prepare (router weight on input)");
        let cast = g("topk_weights.to(a1.dtype)", &[m, k], x.dtype)?;
        let a1 = g("a1_weighted", &x.shape, x.dtype)?;
        drop(cast);
        Some(a1)
    } else {
        None
    };
    rt.set_op("moe.dispatch (all_gatherv)");
    let hidden = g("dispatched_hidden_states", &[dp * m, x.cols()], x.dtype)?;
    let gathered = Routing {
        weights: g("dispatched_topk_weights", &[dp * m, k], DType::F32)?,
        ids: g("dispatched_topk_ids", &[dp * m, k], DType::I32)?,
        host_ids: None,
    };
    drop(weighted);
    let unweighted = Experts {
        weight_on_input: false,
        ..*ex
    };
    experts_into(
        rt,
        &hidden,
        None,
        &unweighted,
        &gathered,
        (how, gpu),
        workspace,
        name,
    )?;
    if runner.combine_temp {
        rt.set_op("moe.combine (reduce_scatterv)");
        drop(g("combined", &x.shape, x.dtype)?);
    }
    let Routing { weights, ids, .. } = gathered;
    drop(ids);
    drop(weights);
    drop(hidden);
    Ok(out)
}

/// The workspace manager's `_ensure_workspace_size` (v1/worker/workspace.py 0.19.0 L150-160,
/// 0.21.0 L164-179, 0.33.0 L209-268): the one buffer every user of the manager shares (the
/// fused MoE's, 0.33's TRITON_MLA logits) grown to `need` bytes when smaller, the old one freed
/// first, then (`empty_cache`, 0.21 on) `torch.accelerator.empty_cache()`; never shrunk.
pub fn grow_workspace(
    rt: &Runtime,
    workspace: &RefCell<Option<Tensor>>,
    need: u64,
    empty_cache: bool,
) -> Result<()> {
    let mut ws = workspace.borrow_mut();
    if ws.as_ref().is_none_or(|t| t.nbytes() < need) {
        drop(ws.take());
        if empty_cache {
            rt.empty_cache();
        }
        *ws = Some(rt.tensor_for_overwrite(
            "moe.workspace",
            Category::Activation,
            &[need as usize],
            DType::U8,
        )?);
    }
    Ok(())
}

/// The experts hold `num_experts` of `width` over the input's columns, and run where modelled.
fn check_experts(rt: &Runtime, x: &Tensor, ex: &Experts, name: &str) -> Result<()> {
    let h = x.cols();
    let (e, i) = (ex.num_experts, ex.width);
    if ex.w13.numel() != e * 2 * i * h || ex.w2.numel() != e * h * i {
        return Err(Error::Request(format!(
            "{name}: experts {} and {} do not hold {e} experts of width {i} over {h} inputs",
            ex.w13.name, ex.w2.name
        )));
    }
    if rt.backend() == Backend::Cuda && ex.mapped {
        return Err(Error::Request(format!(
            "{name}: expert parallel runs on simulated devices only so far"
        )));
    }
    Ok(())
}

/// The modular kernel's `apply` after its output: the router weight on the input where the
/// model asks, the input's quantization, the workspace, and per chunk the alignment buffers
/// and the experts (into `out`; `None`: dry, the experts' sum left in the workspace).
#[allow(clippy::too_many_arguments)]
fn experts_into(
    rt: &Runtime,
    x: &Tensor,
    mut out: Option<&mut Tensor>,
    ex: &Experts,
    routing: &Routing,
    (how, gpu): (Modular, &str),
    workspace: &RefCell<Option<Tensor>>,
    name: &str,
) -> Result<()> {
    let (m, h) = (x.rows(), x.cols());
    let top_k = routing.ids.cols();
    let (e, i) = (ex.num_experts, ex.width);
    // `apply_router_weight_on_input`: `prepare` casts the `[M, 1]` weights to the input's
    // dtype and multiplies into a new `[M, H]`; the cast dies at once, the product as
    // `forward` returns (the experts then skip the weight in both GEMMs).
    let weighted = if ex.weight_on_input {
        rt.set_op("moe.prepare (router weight on input)");
        let cast = rt.tensor_for_overwrite(
            format!("{name}.topk_weights.to(a1.dtype)"),
            Category::Activation,
            &[m, top_k],
            x.dtype,
        )?;
        let a1 = rt.tensor_for_overwrite(
            format!("{name}.a1_weighted"),
            Category::Activation,
            &x.shape,
            x.dtype,
        )?;
        drop(cast);
        Some(a1)
    } else {
        None
    };
    if how.v0_21.is_some_and(|r| r.flashinfer_cutlass) {
        flashinfer_cutlass_into(rt, x, out, ex, routing, workspace, name)?;
        drop(weighted);
        return Ok(());
    }
    // Block-wise fp8 experts: `prepare` quantizes the whole input once (no_dp_ep.py L27-34 and
    // L67 at 0.19.0: `a1q [M, H]` fp8, `a1q_scale [M, H/128]` f32), before the workspace;
    // both die as `forward` returns.
    let release = match (how.v0_21, how.chunk_tokens) {
        (Some(r), _) => r.fp8_block_configs,
        (None, Some(_)) => "0.15.1",
        (None, None) => "0.19.0",
    };
    // Per-tensor fp8 experts (0.19.0 only): `a1q [M, H]` fp8 and `a1q_scale [1]` f32, the
    // same point.
    let a1q = match (ex.fp8_block, ex.fp8_tensor) {
        (Some(_), _) => {
            if rt.backend() != Backend::Dry {
                return Err(ops_moe::fp8_block_experts_refused(name));
            }
            let g = ex.fp8_block.map_or(128, |s| s.group);
            Some(ops_moe::group_quant(
                rt,
                (m, h, g),
                ["a1q", "a1q_scale"],
                name,
            )?)
        }
        (None, Some(_)) => {
            if rt.backend() == Backend::Cuda || how.chunk_tokens.is_some() {
                return Err(Error::Request(format!(
                    "{name}: per-tensor fp8 experts are modelled for the TritonExperts of vLLM 0.19 on, on a simulated device or the host only"
                )));
            }
            Some(ops_moe_fp8::tensor_quant(
                rt,
                m,
                h,
                ["a1q", "a1q_scale"],
                name,
            )?)
        }
        (None, None) => None,
    };
    let chunk = how.chunk_tokens.map_or(m, |c| m.min(c)).max(1);
    let b = x.dtype.size_bytes();
    let r256 = |v: u64| v.div_ceil(256) * 256;
    let (mc, k) = (chunk as u64, top_k as u64);
    let region13 = r256(b * mc * k * (i.max(h) as u64));
    let mut need = region13 + r256(b * mc * k * ((2 * i).max(h) as u64));
    if chunk < m {
        need += r256(b * (m * h) as u64);
    }
    rt.set_op("moe.workspace");
    grow_workspace(rt, workspace, need, how.v0_21.is_some())?;
    let mut start = 0;
    while start < m {
        let tokens = (m - start).min(chunk);
        rt.set_op("moe.align_block_size");
        let (bm, _) = if ex.fp8_block.is_some() {
            let g = ex.fp8_block.map_or(128, |s| s.group);
            ops_moe::block_size_m_fp8_block(release, gpu, (e, i, g), tokens)
        } else if ex.fp8_tensor.is_some() {
            ops_moe_fp8::block_size_m_fp8_tensor(gpu, e, i, tokens)
        } else if how.v0_21.is_some() {
            ops_moe::block_size_m_0_21(gpu, e, i, tokens)
        } else if how.default_block_m_by_tokens {
            ops_moe::block_size_m_0_19(gpu, e, i, tokens)
        } else {
            ops_moe::block_size_m(gpu, e, i, tokens)
        };
        // `moe_align_block_size`: the padded slots, capped when fewer slots than experts
        // (0.15.1 moe_align_block_size.py), over every expert the router may pick
        // (`global_num_experts`, TritonExperts.apply 0.19.0 fused_moe.py L2069-2071).
        let slots = tokens * top_k;
        let ge = ex.global;
        let mut padded = slots + ge * (bm - 1);
        if slots < ge {
            padded = padded.min(slots * bm);
        }
        let t = |nm: &str, shape: &[usize]| {
            rt.tensor_for_overwrite(
                format!("{name}.{nm}"),
                Category::Activation,
                shape,
                DType::I32,
            )
        };
        let mut align = [
            t("sorted_ids", &[padded])?,
            t("expert_ids", &[padded.div_ceil(bm)])?,
            t("num_tokens_post_pad", &[1])?,
        ];
        if ex.mapped && how.v0_21.is_none_or(|r| r.remaps_expert_ids) {
            ops_moe::map_expert_ids(rt, &mut align[1], name)?;
        }
        // `TritonExperts.apply` quantizes the activation's output after the first GEMM
        // (fused_moe.py L2102-2108 at 0.19.0: `qintermediate_cache2 [T·k, I]` fp8,
        // `a2q_scale [T·k, I/128]` f32); as it returns its locals die in declaration order:
        // the alignment buffers, `a2q_scale`, `qintermediate_cache2`.
        // Per-tensor: `qintermediate_cache2 [T·k, I]` fp8 and `a2q_scale [1]` f32.
        let q2 = match (ex.fp8_block, ex.fp8_tensor) {
            (Some(s), _) => Some(ops_moe::group_quant(
                rt,
                (tokens * top_k, i, s.group),
                ["qintermediate_cache2", "a2q_scale"],
                name,
            )?),
            (None, Some(_)) => Some(ops_moe_fp8::tensor_quant(
                rt,
                tokens * top_k,
                i,
                ["qintermediate_cache2", "a2q_scale"],
                name,
            )?),
            (None, None) => None,
        };
        rt.set_op("moe.fused_experts");
        let out = match (rt.backend(), out.as_deref_mut()) {
            (Backend::Dry, _) => None,
            (_, Some(o)) => Some(o),
            (_, None) => {
                return Err(Error::Request(format!(
                    "{name}: the dispatched experts run dry only so far"
                )))
            }
        };
        match (rt.backend(), out) {
            (Backend::Dry, _) | (_, None) => {}
            (Backend::Cpu, Some(out)) if ex.fp8_tensor.is_some() => {
                if let Some(q) = &ex.fp8_tensor {
                    ops_moe_fp8::experts_cpu_fp8(rt, x, out, ex, routing, q)?;
                }
            }
            (Backend::Cpu, Some(out)) => {
                ops_moe::experts_cpu_rows(rt, out, ex, routing, start..start + tokens)?
            }
            (Backend::Cuda, Some(out)) => {
                // `TritonExperts.apply`'s views of the workspace (0.19.0 fused_moe.py
                // L2040-2050): `intermediate_cache2` in workspace13 (the first region),
                // caches 1 and 3 in workspace2 (the second); the experts read `x` and
                // `finalize` leaves their sum in `out`.
                let ws = workspace.borrow();
                let base = ws.as_ref().map_or(0, |t| t.cuda_ptr());
                let bufs = ops_moe::CudaBuffers {
                    x: x.cuda_ptr(),
                    out: out.cuda_ptr(),
                    cache13: base + region13,
                    cache2: base,
                    weights: routing.weights.cuda_ptr(),
                };
                ops_moe::chunk_cuda(
                    rt,
                    &mut align,
                    ex,
                    routing,
                    &bufs,
                    (start, tokens, bm),
                    (h, x.dtype),
                    name,
                )?;
            }
        }
        drop(align);
        if let Some([codes, scales]) = q2 {
            drop(scales);
            drop(codes);
        }
        start += tokens;
    }
    drop(weighted);
    drop(a1q);
    Ok(())
}

/// FlashInfer's CUTLASS fused MoE (`cutlass_fused_moe`, bf16 or fp16 experts, gated SiLU, on
/// Hopper) after the modular kernel's output, as vLLM 0.21 and 0.22 run it
/// (docs/reading/vllm-flashinfer-cutlass-moe.md §3-6, flashinfer 0.6.8.post1 and 0.6.11.post2):
/// the workspace manager's buffer grown to `r256(b·M·H)` (`FlashInferExperts.workspace_shapes`:
/// `(M, H)` and `(0,)`); FlashInfer's three per-call tensors, `[1]` i32, `[E, M]` f32 and
/// `[E]` i32 (core.py L477-489); the C++ op's one int8 workspace
/// (`flashinfer_cutlass_workspace_bytes`), freed as `runMoe` returns; then the three, last
/// first, as `FlashInferExperts.apply` returns. No alignment buffers; `finalize` copies into
/// the output. Dry, or on the host (the experts' math is Triton's: the same sum).
fn flashinfer_cutlass_into(
    rt: &Runtime,
    x: &Tensor,
    out: Option<&mut Tensor>,
    ex: &Experts,
    routing: &Routing,
    workspace: &RefCell<Option<Tensor>>,
    name: &str,
) -> Result<()> {
    if ex.fp8_tensor.is_some() || (ex.fp8_block.is_some() && rt.backend() != Backend::Dry) {
        return Err(Error::Request(format!(
            "{name}: FlashInfer's CUTLASS MoE is modelled for 16-bit experts, and dry for block-wise fp8 ones"
        )));
    }
    if rt.backend() == Backend::Cuda {
        return Err(Error::Request(format!(
            "{name}: FlashInfer's CUTLASS MoE (vLLM 0.21 and 0.22 on Hopper) runs on simulated devices and the host only; its kernels are FlashInfer's"
        )));
    }
    let (m, h) = (x.rows(), x.cols());
    let k = routing.ids.cols();
    let (e, i) = (ex.num_experts, ex.width);
    let sms = rt.with_device(|d| d.sm_count()).unwrap_or(0);
    if sms == 0 {
        return Err(Error::Request(format!(
            "{name}: FlashInfer's CUTLASS MoE sizes its grouped GEMM's workspace by the GPU's multiprocessors, which this device does not give"
        )));
    }
    rt.set_op("moe.workspace");
    let b = x.dtype.size_bytes();
    grow_workspace(
        rt,
        workspace,
        (b * (m * h) as u64).div_ceil(256) * 256,
        true,
    )?;
    rt.set_op("moe.flashinfer_cutlass_fused_moe");
    let t = |n: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{n}"), Category::Activation, shape, dt)
    };
    let active = t("num_active_experts_per_node", &[1], DType::I32)?;
    let scores = t("experts_to_token_score", &[e, m], DType::F32)?;
    let ids = t("active_expert_global_ids", &[e], DType::I32)?;
    let bytes = flashinfer_cutlass_workspace_bytes(
        FlashInferShape {
            tokens: m as u64,
            hidden: h as u64,
            width: i as u64,
            experts: e as u64,
            top_k: k as u64,
            act_bytes: b,
            fp8_block: ex.fp8_block.is_some(),
        },
        sms,
    );
    let ws = t("flashinfer_workspace", &[bytes as usize], DType::U8)?;
    if let (Backend::Cpu, Some(out)) = (rt.backend(), out) {
        ops_moe::experts_cpu_rows(rt, out, ex, routing, 0..m)?;
    }
    drop(ws);
    drop(ids);
    drop(scores);
    drop(active);
    Ok(())
}

/// The shapes FlashInfer's CUTLASS MoE sizes its workspace by: `tokens` M, `hidden` H, this
/// rank's expert `width` I, its `experts` E, `top_k` k, the activation's bytes, and whether
/// the experts are block-wise fp8 (16-bit activations: the input is quantized inside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashInferShape {
    pub tokens: u64,
    pub hidden: u64,
    pub width: u64,
    pub experts: u64,
    pub top_k: u64,
    pub act_bytes: u64,
    pub fp8_block: bool,
}

/// The bytes of the int8 workspace `getWorkspaceInfo` allocates
/// (flashinfer_cutlass_fused_moe_binding.cu L840-864):
/// `calculateTotalWorkspaceSize([moe_ws, 4·k·M])`, each rounded up to 128, where `moe_ws` is
/// `getWorkspaceDeviceBufferSizes` for 16-bit experts, gated SiLU, SM90's TMA warp-specialized
/// grouped GEMM with the fused finalize (cutlass_fused_moe_kernels.cuh L2474-2640, every term
/// rounded up to 128; docs/reading/vllm-flashinfer-cutlass-moe.md §5.4): three `4R` row maps
/// (R = k·M), the blocked expert counts and their sum `4·E·⌈M/tpb⌉` each, the blocked rows
/// `4·E·M`, the expert offsets `8·(E+1)`, the overlapped GEMM inputs `b·R·max(H, I)` and
/// outputs `b·R·max(2I, H)`, two `8·E` alpha pointer arrays, two TMA inputs of 20 per-expert
/// arrays (`TmaWarpSpecializedGroupedGemmInput::workspaceSize`: 24, 15 × 8, 2 × 20, 12 and 16
/// bytes an expert, each array rounded), and the grouped GEMM's `512·SM` (two warp groups'
/// epilogue and two mainloop tensor maps of 128 B per SM).
pub fn flashinfer_cutlass_workspace_bytes(s: FlashInferShape, sms: u64) -> u64 {
    let r128 = |v: u64| v.div_ceil(128) * 128;
    let (m, h, i, e, b) = (s.tokens, s.hidden, s.width, s.experts, s.act_bytes);
    let rows = s.top_k * m;
    // `computeNumTokensPerBlock` (L525-534): the smallest of 32, 64, … 1024 with
    // ⌈M/tpb⌉·E ≤ tpb, else 1024.
    let tpb = [32u64, 64, 128, 256, 512, 1024]
        .into_iter()
        .find(|&t| m.div_ceil(t) * e <= t)
        .unwrap_or(1024);
    let blocks = m.div_ceil(tpb);
    let common = 2 * r128(4 * rows)
        + 2 * r128(4 * e * blocks)
        + r128(4 * e * m)
        + r128(8 * (e + 1))
        + 2 * r128(8 * e);
    if s.fp8_block {
        // 16-bit activations over e4m3 weights with DeepSeek's 128-block scales
        // (`CutlassMoeFCRunner<bf16, fp8>`, §9): no TMA warp-specialized path, so no final
        // scales, TMA inputs or grouped-GEMM workspace; the inputs region `b·R·max(H, I)`,
        // the outputs `2·b·R·I`, and the block-scale GEMM's `max(ws(H), ws(I))`,
        // `ws(K) = r4(R)·K + P·⌈K/128⌉·4`, `P = ⌊(R + 31·E)/32⌋·32`
        // (fp8_blockscale_gemm.cu L216-262, deep_gemm scheduler.cuh L352-359).
        let padded = (rows + 31 * e) / 32 * 32;
        let ws = |k: u64| rows.div_ceil(4) * 4 * k + padded * k.div_ceil(128) * 4;
        let moe_ws =
            common + r128(b * rows * h.max(i)) + r128(2 * b * rows * i) + r128(ws(h).max(ws(i)));
        return r128(moe_ws) + r128(4 * rows);
    }
    let tma = r128(24 * e) + 15 * r128(8 * e) + 2 * r128(20 * e) + r128(12 * e) + r128(16 * e);
    // The final scales (`4R`: SM90's fused finalize), the two overlapped regions, the TMA
    // inputs and the grouped GEMM's workspace.
    let moe_ws = common
        + r128(4 * rows)
        + r128(b * rows * h.max(i))
        + r128(b * rows * (2 * i).max(h))
        + 2 * tma
        + 512 * sms;
    r128(moe_ws) + r128(4 * rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/reading/vllm-flashinfer-cutlass-moe.md §7, term by term: Qwen3-30B-A3B at 8192
    /// tokens (E 128, k 8, I 768, H 2048, bf16) on 132 SMs (H100 SXM, H200) and 114 (H100
    /// PCIe): the SMs enter only through the grouped GEMM's `512·SM`.
    #[test]
    fn flashinfer_cutlass_workspace_follows_its_terms() {
        let s = FlashInferShape {
            tokens: 8192,
            hidden: 2048,
            width: 768,
            experts: 128,
            top_k: 8,
            act_bytes: 2,
            fp8_block: false,
        };
        assert_eq!(flashinfer_cutlass_workspace_bytes(s, 132), 542_247_040);
        assert_eq!(flashinfer_cutlass_workspace_bytes(s, 114), 542_237_824);
        // Two ranks (I 384): H dominates both overlapped regions, the same bytes.
        let tp2 = FlashInferShape { width: 384, ..s };
        assert_eq!(flashinfer_cutlass_workspace_bytes(tp2, 132), 542_247_040);
        // Eight experts (tokens per block 256, 16 blocks): Mixtral at one rank, 4096 tokens,
        // k 2, I 14336, H 4096. By hand: 3·32,768 + 2·512 + 131,072 + 128 + 2·8192·4096 +
        // 2·8192·28,672 + 2·128 + 2·(256 + 15·128 + 2·256 + 128 + 128) + 512·132 + 32,768.
        let mixtral = FlashInferShape {
            tokens: 4096,
            hidden: 4096,
            width: 14_336,
            experts: 8,
            top_k: 2,
            act_bytes: 2,
            fp8_block: false,
        };
        let by_hand = 3 * 32_768
            + 2 * 512
            + 131_072
            + 128
            + 2 * 8192 * 14_336
            + 2 * 8192 * 28_672
            + 2 * 128
            + 2 * (256 + 15 * 128 + 2 * 256 + 128 + 128)
            + 512 * 132
            + 32_768;
        assert_eq!(flashinfer_cutlass_workspace_bytes(mixtral, 132), by_hand);
        // Block-wise fp8, §9's example: DeepSeek-V3 over 8 expert-parallel ranks (32 experts
        // a rank, I 2048, H 7168, k 8) at 8192 tokens; no SM term.
        let v3 = FlashInferShape {
            tokens: 8192,
            hidden: 7168,
            width: 2048,
            experts: 32,
            top_k: 8,
            act_bytes: 2,
            fp8_block: true,
        };
        assert_eq!(flashinfer_cutlass_workspace_bytes(v3, 132), 1_962_899_328);
        assert_eq!(flashinfer_cutlass_workspace_bytes(v3, 114), 1_962_899_328);
    }
}

//! Tensor-parallel ops, as vLLM 380e1863 runs them on each rank: the all-reduce after a
//! row-parallel layer and after the vocab-parallel embedding, the masked embedding lookup, and
//! the gather of the logits to rank 0. Like every op they allocate through the framework
//! first (the same sequence on every device), then move data: through the rank group on the
//! simulated device, through NCCL on GPUs, not at all on a dry run. With one GPU each is what
//! vLLM does then: nothing.

use crate::base::error::{Error, Result};
use crate::device::group::CommSetup;
use crate::device::Backend;
use crate::engine::ops::cuda;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

fn round_all(dt: DType, v: &mut [f32]) {
    for x in v {
        *x = dt.round(*x);
    }
}

/// `tensor_model_parallel_all_reduce` (parallel_state.py L322-376). Under 8 MiB with vLLM's
/// custom all-reduce on, the result is a new tensor (`torch.empty_like`, custom_all_reduce.py
/// L255-264) and the input dies when the caller rebinds; otherwise NCCL reduces in place
/// through torch.distributed, whose communicator is made at the first such call.
pub fn all_reduce(rt: &Runtime, mut x: Tensor, name: &str) -> Result<Tensor> {
    let Some(tp) = rt.tp() else {
        return Ok(x);
    };
    rt.check_cancel()?;
    rt.set_op("all_reduce");
    let custom = tp.custom_ar_takes(x.nbytes());
    let out_of_place = custom || tp.all_reduce_out_of_place;
    let mut out = if out_of_place {
        Some(rt.tensor(name, Category::Activation, &x.shape, x.dtype)?)
    } else {
        None
    };
    // vLLM's custom all-reduce moves data through buffers it made at start (no NCCL), and
    // from 0.6.5 pynccl's communicator, made when the worker started, takes the rest; only
    // an in-place reduction through torch.distributed makes the device group's communicator.
    // On a GPU vramscope sums through that group's NCCL communicator in every case, so it
    // may appear earlier there than in vLLM.
    let torch_distributed = !custom && !tp.all_reduce_out_of_place;
    let first = if torch_distributed || rt.backend() == Backend::Cuda {
        rt.comm_begin(CommSetup::DeviceGroup)?
    } else {
        None
    };
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            // The sum lands in the output (a copy of the input first, out of place) or in
            // the input itself.
            let target = match out.as_mut() {
                Some(o) => {
                    o.f32_mut().copy_from_slice(x.f32());
                    o
                }
                None => &mut x,
            };
            let dtype = target.dtype;
            let v = target.f32_mut();
            tp.group.all_reduce_sum(tp.rank, v)?;
            round_all(dtype, v);
        }
        Backend::Cuda => {
            // The ranks meet on the host first, so a rank that stopped (out of memory in a
            // verify pass) never leaves the others waiting inside NCCL on the GPU.
            tp.group.wait()?;
            cuda(rt, |c| {
                c.all_reduce_sum(&x, out.as_mut().map(|o| &mut o.data), &tp)
            })?;
        }
    }
    rt.comm_end(first)?;
    Ok(match out {
        Some(o) => {
            drop(x);
            o
        }
        None => x,
    })
}

/// `embed_tokens(input_ids)` on this rank: the vocabulary-parallel lookup of its rows
/// `first_row..` under tensor parallel (`vocab_parallel_embedding`), the plain lookup with one
/// GPU.
pub fn embed_tokens(
    rt: &Runtime,
    ids: &[u32],
    table: &Tensor,
    first_row: usize,
    vocab: usize,
    act: DType,
) -> Result<Tensor> {
    if rt.tp().is_some() {
        vocab_parallel_embedding(rt, ids, table, first_row, vocab, act)
    } else {
        crate::engine::ops::embedding(rt, ids, table, act)
    }
}

/// `VocabParallelEmbedding.forward` with more than one rank (vocab_parallel_embedding.py
/// L388-407): `get_masked_input_and_mask` (L137-155; TorchScript runs its element-wise ops
/// one by one on the first call, each a new tensor), the lookup of this rank's rows,
/// `masked_fill_` of the tokens other ranks own, and the all-reduce that sums the shards.
/// `first_row..first_row + rows` are this rank's rows of the padded vocabulary; `vocab` is the
/// real vocabulary (rows past it are padding no token reaches).
pub fn vocab_parallel_embedding(
    rt: &Runtime,
    ids: &[u32],
    table: &Tensor,
    first_row: usize,
    vocab: usize,
    act: DType,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("embedding.mask");
    let t = ids.len();
    let end = (first_row + table.rows()).min(vocab);
    let mask = |name: &str| rt.tensor(name, Category::Activation, &[t], DType::U8);
    let long = |name: &str| rt.tensor(name, Category::Activation, &[t], DType::I64);
    // org_vocab_mask = (input_ >= start) & (input_ < end)
    let ge = mask("embed.mask_ge")?;
    let lt = mask("embed.mask_lt")?;
    let org_mask = mask("embed.org_vocab_mask")?;
    drop((ge, lt));
    // added_vocab_mask over an empty added range (no LoRA vocabulary)
    let ge = mask("embed.added_ge")?;
    let lt = mask("embed.added_lt")?;
    let added_mask = mask("embed.added_vocab_mask")?;
    drop((ge, lt));
    // valid_offset = start * org_vocab_mask + added_offset * added_vocab_mask
    let a = long("embed.offset_org")?;
    let b = long("embed.offset_added")?;
    let valid_offset = long("embed.valid_offset")?;
    drop((a, b));
    let vocab_mask = mask("embed.vocab_mask")?;
    drop((org_mask, added_mask));
    // input_ = vocab_mask * (input_ - valid_offset)
    let shifted = long("embed.input_shifted")?;
    drop(valid_offset);
    let masked_input = long("embed.masked_input")?;
    drop(shifted);
    // ~vocab_mask, returned as input_mask
    let input_mask = mask("embed.input_mask")?;
    drop(vocab_mask);
    rt.set_op("embedding");
    let hidden = table.cols();
    let mut out = rt.tensor("embed.out", Category::Activation, &[t, hidden], act)?;
    let local: Vec<Option<u32>> = ids
        .iter()
        .map(|&id| {
            let id = id as usize;
            (id >= first_row && id < end).then(|| (id - first_row) as u32)
        })
        .collect();
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let w = table.f32();
            let o = out.f32_mut();
            for (row, l) in local.iter().enumerate() {
                if let Some(l) = l {
                    let l = *l as usize;
                    o[row * hidden..(row + 1) * hidden]
                        .copy_from_slice(&w[l * hidden..(l + 1) * hidden]);
                }
            }
        }
        Backend::Cuda => cuda(rt, |c| c.masked_embedding(&local, table, &mut out))?,
    }
    let out = all_reduce(rt, out, "embed.all_reduce")?;
    drop((masked_input, input_mask));
    Ok(out)
}

/// vLLM V1's `LogitsProcessor._gather_logits` with `use_all_gather` (every rank gets the
/// whole vocabulary and runs the sampler): `GroupCoordinator.all_gather(logits, dim=-1)`
/// allocates `[tp, rows, cols]`, all-gathers into it, and `movedim` + `reshape` copy it to
/// `[rows, tp · cols]` (0.19.0 distributed/device_communicators/base_device_communicator.py
/// `all_gather`); the stacked buffer and the shard die at return.
pub fn all_gather_logits(rt: &Runtime, shard: Tensor) -> Result<Tensor> {
    gather_cols(
        rt,
        shard,
        ("logits.all_gather", "logits"),
        ("logits.all_gather", "logits.all_gather.reshape"),
        Category::Sampler,
    )
}

/// `ColumnParallelLinear(gather_output=True)`'s `tensor_model_parallel_all_gather` of its
/// output along the columns (linear.py 0.19 `ColumnParallelLinear.forward`): the same
/// `GroupCoordinator.all_gather` as the logits', `[tp, rows, cols]` then `[rows, tp · cols]`,
/// the stacked buffer and the shard dying at return.
pub fn all_gather_cols(rt: &Runtime, shard: Tensor, name: &str) -> Result<Tensor> {
    gather_cols(
        rt,
        shard,
        (&format!("{name}.all_gather"), name),
        ("all_gather", "all_gather.reshape"),
        Category::Activation,
    )
}

fn gather_cols(
    rt: &Runtime,
    shard: Tensor,
    (stacked_name, out_name): (&str, &str),
    (op, reshape_op): (&'static str, &'static str),
    category: Category,
) -> Result<Tensor> {
    let Some(tp) = rt.tp() else {
        return Ok(shard);
    };
    rt.check_cancel()?;
    rt.set_op(op);
    let (rows, cols) = (shard.rows(), shard.cols());
    let mut stacked = rt.tensor(stacked_name, category, &[tp.size, rows, cols], shard.dtype)?;
    let first = rt.comm_begin(CommSetup::DeviceGroup)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let all = tp.group.all_gather_f32(tp.rank, shard.f32())?;
            let o = stacked.f32_mut();
            for (r, v) in all.iter().enumerate() {
                if v.len() != rows * cols {
                    return Err(Error::Request(
                        "tensor-parallel all-gather: the ranks sent different sizes".into(),
                    ));
                }
                o[r * rows * cols..(r + 1) * rows * cols].copy_from_slice(v);
            }
        }
        Backend::Cuda => {
            return Err(Error::Request(format!(
                "vLLM V1's all-gather of {out_name} has no GPU collective here yet"
            )))
        }
    }
    rt.comm_end(first)?;
    rt.set_op(reshape_op);
    let mut out = rt.tensor(out_name, category, &[rows, cols * tp.size], shard.dtype)?;
    if rt.backend() == Backend::Cpu {
        let (o, s) = (out.f32_mut(), stacked.f32());
        for r in 0..tp.size {
            for row in 0..rows {
                o[row * cols * tp.size + r * cols..row * cols * tp.size + (r + 1) * cols]
                    .copy_from_slice(&s[(r * rows + row) * cols..(r * rows + row + 1) * cols]);
            }
        }
    }
    drop(stacked);
    drop(shard);
    Ok(out)
}

/// `tensor_model_parallel_gather` of the logits to rank 0 (parallel_state.py `gather`,
/// logits_processor.py `_get_logits`): rank 0 allocates one `empty_like` per rank, receives
/// every shard, and `torch.cat`s them along the vocabulary; the list dies at return. Every
/// other rank sends and gets `None` (it runs no sampler, model_runner.py L1694-1695).
pub fn gather_logits(rt: &Runtime, shard: Tensor) -> Result<Option<Tensor>> {
    let Some(tp) = rt.tp() else {
        return Ok(Some(shard));
    };
    rt.check_cancel()?;
    rt.set_op("logits.gather");
    let (rows, cols) = (shard.rows(), shard.cols());
    let parts = if tp.rank == 0 {
        (0..tp.size)
            .map(|r| {
                rt.tensor(
                    format!("logits.gather[{r}]"),
                    Category::Sampler,
                    &shard.shape,
                    shard.dtype,
                )
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        Vec::new()
    };
    // torch's gather runs on the device group's communicator (made here if no NCCL
    // all-reduce came first), and opens point-to-point connections at its first call.
    let group_first = rt.comm_begin(CommSetup::DeviceGroup)?;
    rt.comm_end(group_first)?;
    let first = rt.comm_begin(CommSetup::GatherP2p)?;
    let mut parts = parts;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            if let Some(all) = tp.group.gather_to_first(tp.rank, shard.f32())? {
                for (p, v) in parts.iter_mut().zip(all) {
                    if v.len() != p.numel() {
                        return Err(Error::Request(
                            "tensor-parallel gather: the ranks sent different sizes".into(),
                        ));
                    }
                    p.f32_mut().copy_from_slice(&v);
                }
            }
        }
        Backend::Cuda => {
            tp.group.wait()?;
            cuda(rt, |c| c.gather_to_first(&shard, &mut parts, &tp))?
        }
    }
    rt.comm_end(first)?;
    drop(shard);
    if tp.rank != 0 {
        return Ok(None);
    }
    rt.set_op("logits.cat");
    let dtype = parts[0].dtype;
    let mut out = rt.tensor("logits", Category::Sampler, &[rows, cols * tp.size], dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let o = out.f32_mut();
            for (r, p) in parts.iter().enumerate() {
                for row in 0..rows {
                    o[row * cols * tp.size + r * cols..row * cols * tp.size + (r + 1) * cols]
                        .copy_from_slice(&p.f32()[row * cols..(row + 1) * cols]);
                }
            }
        }
        Backend::Cuda => cuda(rt, |c| c.cat_cols(&parts, &mut out))?,
    }
    drop(parts);
    Ok(Some(out))
}

/// The data-parallel replicas this rank's MoE layers exchange tokens with (`dp > 1`), else
/// `None`.
pub fn moe_dp(rt: &Runtime) -> Option<usize> {
    rt.moe_group().map(|g| g.dp).filter(|&dp| dp > 1)
}

/// `All2AllManager.dispatch` with `VLLM_ALL2ALL_BACKEND`'s default in 0.11 (envs.py L1240-1245)
/// and `ParallelConfig.all2all_backend`'s in 0.15 and 0.19 (config/parallel.py L154, L160):
/// `allgather_reducescatter`. `AgRsAll2AllManager.dispatch` (0.11.0 all2all.py L106-125)
/// all-gathers the hidden states and the router's logits of every data-parallel rank
/// (`all_gatherv([hidden_states, router_logits])`, cuda_communicator.py L260-300: one
/// `torch.empty` output each, in that order): `[dp·M, H]` and `[dp·M, E]`, every replica's
/// profile batch being the same size. Runs dry only (the replicas' values are not exchanged).
pub fn dp_dispatch(
    rt: &Runtime,
    x: &Tensor,
    logits: &Tensor,
    dp: usize,
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    rt.set_op("moe.dispatch (all_gatherv)");
    if rt.backend() != Backend::Dry {
        return Err(Error::Request(
            "data parallel's token exchange runs dry only so far".into(),
        ));
    }
    let gathered = |t: &Tensor, what: &str| {
        let mut shape = t.shape.clone();
        shape[0] *= dp;
        rt.tensor_for_overwrite(
            format!("{name}.{what}"),
            Category::Activation,
            &shape,
            t.dtype,
        )
    };
    let h = gathered(x, "dispatched_hidden_states")?;
    let l = gathered(logits, "dispatched_router_logits")?;
    Ok((h, l))
}

/// `AgRsAll2AllManager.combine` (0.11.0 all2all.py L127-140): `reduce_scatterv` of the experts'
/// output over the data-parallel ranks into a new `[M, H]` (`torch.empty`,
/// cuda_communicator.py L186-220); the gathered output dies as the caller rebinds.
pub fn dp_combine(rt: &Runtime, out: &Tensor, dp: usize, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("moe.combine (reduce_scatterv)");
    let mut shape = out.shape.clone();
    shape[0] /= dp;
    rt.tensor_for_overwrite(
        format!("{name}.combined"),
        Category::Activation,
        &shape,
        out.dtype,
    )
}

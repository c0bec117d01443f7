//! What vLLM's profile run does around the model's forward (vLLM 380e1863, the commit of PR
//! #9516): the model input and sampling metadata it prepares, `LogitsProcessor.forward`, and
//! `Sampler.forward` with `SamplingParams(top_p=0.99, top_k=vocab_size - 1)`
//! (vllm/worker/model_runner.py L1201). Every tensor is allocated and freed through the
//! framework allocator in vLLM's order, so a dry run, the CPU and the GPU make the same trace;
//! the math runs on the CPU (`device::cpu_sampler`) or on the GPU (`device::cuda::sampler`).
//!
//! The torch allocation sequence was checked on the H200 with torch 2.11 by replaying these
//! steps (scripts/torch_probe.py, docs/gpu-runs.md run 24): for S = 256 rows of V = 50,272
//! the peak over the model-dtype logits is 36·S·V + 512 bytes, as here.

use std::cell::RefCell;

use super::batch::Batch;
use super::config::LogitsMods;
use crate::base::error::{Error, Result};
use crate::device::{cpu_sampler as cpu, Backend};
use crate::engine::ops::cuda;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Storage, Tensor};
use crate::memory::Category;

/// vLLM's profile run samples with `top_p = 0.99` (model_runner.py L1201).
pub const PROFILE_TOP_P: f32 = 0.99;

/// The tensors `ModelRunner.prepare_model_input` puts on the device for the profile batch
/// (model_runner.py L1289-1290; sampling_metadata.py L162-176): alive for the whole pass.
pub struct ModelInput {
    _tensors: Vec<Tensor>,
    /// `selected_token_indices`: the last token of each sequence (logits_processor.py L108-113).
    pub selected: Tensor,
    /// `categorized_sample_indices[RANDOM]`: every sequence samples at random.
    pub random_indices: Tensor,
    pub selected_rows: Vec<u32>,
}

fn upload_i64(rt: &Runtime, t: &mut Tensor, values: &[i64]) -> Result<()> {
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cpu => {
            if let Storage::I32(v) = &mut t.storage {
                for (d, &s) in v.iter_mut().zip(values) {
                    *d = s as i32;
                }
            }
            Ok(())
        }
        Backend::Cuda => rt.with_device(|d| match d.cuda() {
            Some(c) => match t.dtype {
                DType::I64 => c.upload_i64(t, values),
                _ => {
                    let b: Vec<u8> = values
                        .iter()
                        .flat_map(|&v| (v as i32).to_le_bytes())
                        .collect();
                    c.upload_bytes(t, &b)
                }
            },
            None => Ok(()),
        }),
    }
}

fn upload_f32(rt: &Runtime, t: &mut Tensor, values: &[f32]) -> Result<()> {
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cpu => {
            // The host keeps f32; round to the dtype the tensor is accounted in.
            let dt = t.dtype;
            for (d, &v) in t.f32_mut().iter_mut().zip(values) {
                *d = round_to(v, dt);
            }
            Ok(())
        }
        Backend::Cuda => crate::engine::ops::upload_f32(rt, t, values),
    }
}

/// `v` as stored in `dtype` (f16/bf16 round to nearest even).
pub fn round_to(v: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn i64_tensor(rt: &Runtime, name: &str, values: &[i64], dtype: DType) -> Result<Tensor> {
    let mut t = rt.tensor(name, Category::Sampler, &[values.len()], dtype)?;
    upload_i64(rt, &mut t, values)?;
    Ok(t)
}

/// The model input of the profile batch, in the order `_prepare_model_input_tensors` and
/// `SamplingMetadata.prepare` build it: token ids and positions, the attention metadata of
/// FlashAttention's prefill (slot mapping, sequence lengths, start locations; the KV caches are
/// empty, so no block tables), then the sampling indices.
pub fn prepare_model_input(rt: &Runtime, batch: &Batch) -> Result<ModelInput> {
    rt.check_cancel()?;
    rt.set_op("prepare_model_input");
    rt.set_layer(None);
    let t = batch.tokens();
    let s = batch.seq_lens.len();
    let mut tensors = Vec::with_capacity(7);
    let small = |name: &str, n: usize, dtype: DType| -> Result<Tensor> {
        rt.tensor(name, Category::Activation, &[n], dtype)
    };
    tensors.push(small("input_tokens", t, DType::I64)?);
    tensors.push(small("input_positions", t, DType::I64)?);
    tensors.push(small("attn.slot_mapping", t, DType::I64)?);
    tensors.push(small("attn.seq_lens_tensor", s, DType::I32)?);
    tensors.push(small("attn.context_lens_tensor", s, DType::I32)?);
    tensors.push(small("attn.query_start_loc", s + 1, DType::I32)?);
    tensors.push(small("attn.seq_start_loc", s + 1, DType::I32)?);
    let rows = last_token_rows(&batch.seq_lens);
    let sel: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let selected = i64_tensor(rt, "selected_token_indices", &sel, DType::I64)?;
    let seqs: Vec<i64> = (0..s as i64).collect();
    let random_indices = i64_tensor(rt, "categorized_sample_indices", &seqs, DType::I32)?;
    Ok(ModelInput {
        _tensors: tensors,
        selected,
        random_indices,
        selected_rows: rows,
    })
}

/// What `LogitsProcessor` is handed: the lm_head's weight `[Vp, hidden]` (this rank's rows),
/// its bias (Phi's `ParallelLMHead(bias=True)`, phi.py L326-332 and L358 at 0.19), and what it
/// does to the logits after the gather (Gemma 2's final soft-cap, Granite's scale).
#[derive(Clone, Copy)]
pub struct LogitsHead<'a> {
    pub weight: &'a Tensor,
    pub bias: Option<&'a Tensor>,
    pub mods: LogitsMods,
}

impl LogitsHead<'_> {
    /// `F.linear(x, W, b)`: one new `[R, Vp]` output, the bias added in cuBLASLt's epilogue.
    fn project(&self, rt: &Runtime, x: &Tensor, act: DType) -> Result<Tensor> {
        let mut logits = crate::quant::dense_matmul_as(
            rt,
            x,
            self.weight,
            "lm_head",
            act,
            "logits",
            Category::Sampler,
        )?;
        if let Some(b) = self.bias {
            crate::engine::ops::add_bias(rt, &mut logits, b)?;
        }
        Ok(logits)
    }
}

/// `LogitsProcessor.forward` (logits_processor.py L47-74): `_prune_hidden_states` keeps the
/// rows of `selected_token_indices` (L108-113), then `lm_head` over the padded vocabulary
/// (L83-85) gives `[S, Vp]` logits in the model dtype. The pruned rows are freed on return;
/// `execute_model` keeps the logits alive until the sampler is done (model_runner.py
/// L1691-1704). With tensor parallel each rank computes its shard of the vocabulary and
/// `_get_logits` gathers them to rank 0; the other ranks get `None` and return (L1694-1695).
/// `mods` (Gemma 2's `final_logit_softcapping`, Granite's `logits_scaling`) apply on rank 0
/// after the gather.
pub fn compute_logits(
    rt: &Runtime,
    hidden: &Tensor,
    head: LogitsHead<'_>,
    rows: &[u32],
) -> Result<Option<Tensor>> {
    rt.check_cancel()?;
    rt.set_layer(None);
    rt.set_op("logits.index_select");
    let h_sel = select_rows(rt, hidden, rows, "logits.hidden_selected")?;
    let logits = head.project(rt, &h_sel, hidden.dtype)?;
    drop(h_sel);
    match crate::engine::ops_tp::gather_logits(rt, logits)? {
        Some(l) => Ok(Some(process_logits(rt, l, head.mods)?)),
        None => Ok(None),
    }
}

/// vLLM's `LogitsProcessor._get_logits` after the gather (logits_processor.py L66-72 at
/// 0.19): Gemma 2's soft-cap (three new tensors), then Granite's scale, in place on the
/// `[..., :vocab]` view (no allocation).
fn process_logits(rt: &Runtime, logits: Tensor, mods: LogitsMods) -> Result<Tensor> {
    let mut logits = match mods.soft_cap {
        Some(cap) => {
            crate::engine::ops_gemma::soft_cap_logits(rt, logits, cap as f32, Category::Sampler)?
        }
        None => logits,
    };
    if let Some(scale) = mods.scale {
        crate::engine::ops_granite::scale_in_place(rt, &mut logits, scale as f32, "logits.scale")?;
    }
    Ok(logits)
}

/// `hidden[rows]` (advanced indexing: a new `[rows, hidden]` tensor), on every backend.
fn select_rows(rt: &Runtime, hidden: &Tensor, rows: &[u32], name: &str) -> Result<Tensor> {
    let cols = hidden.cols();
    let mut out = rt.tensor(name, Category::Sampler, &[rows.len(), cols], hidden.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => crate::device::cpu::embedding(rows, hidden.f32(), cols, out.f32_mut()),
        Backend::Cuda => rt.with_device(|d| match d.cuda() {
            Some(c) => c.gather_rows(hidden, rows, &mut out),
            None => Ok(()),
        })?,
    }
    Ok(out)
}

/// Forward-only logits: `compute_logits`, then `[..., :vocab].to(torch.float)`, `[S, vocab]`
/// f32 (what a pass without the sampler hands back).
pub fn logits_f32(
    rt: &Runtime,
    hidden: &Tensor,
    head: LogitsHead<'_>,
    rows: &[u32],
    vocab: usize,
) -> Result<Option<Tensor>> {
    let Some(logits_d) = compute_logits(rt, hidden, head, rows)? else {
        return Ok(None);
    };
    rt.set_op("logits.to_float");
    let mut out = rt.tensor(
        "logits_f32",
        Category::Sampler,
        &[rows.len(), vocab],
        DType::F32,
    )?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu::narrow_cols(logits_d.f32(), logits_d.cols(), vocab, out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.sampler_narrow_to_f32(&logits_d, &mut out))?,
    }
    Ok(Some(out))
}

/// The last token of each sequence, laid end to end (vLLM's `selected_token_indices`).
pub fn last_token_rows(seq_lens: &[usize]) -> Vec<u32> {
    let mut rows = Vec::with_capacity(seq_lens.len());
    let mut end = 0usize;
    for &n in seq_lens {
        end += n;
        rows.push((end - 1) as u32);
    }
    rows
}

/// What the sampler produced (nothing on a dry run).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplerOutput {
    /// The sampled token of each sequence.
    pub ids: Vec<u32>,
    /// `probs` of the first rows (for checks against PyTorch), `rows × vocab`.
    pub probs_head: Vec<f32>,
    /// The f32 logits the sampler started from, same rows.
    pub logits_head: Vec<f32>,
}

/// vLLM's `Sampler` for the profile batch. Like vLLM's, it keeps its `SamplingTensors`
/// (`self._sampling_tensors`, sampler.py L180-204) on itself between calls: they survive the
/// pass and are replaced by the next one.
pub struct Sampler {
    kept: RefCell<Vec<Tensor>>,
    /// Seed of the exponential draws (`q.exponential_()`); each pass draws anew.
    pub seed: u64,
    calls: std::cell::Cell<u64>,
    /// How many rows of probs and logits to bring back for checks.
    pub head_rows: std::cell::Cell<usize>,
    /// V1's Triton top-k/top-p buffer and tables, cached on the device after the first call
    /// (`_TRITON_BUFFER_CACHE`, `_TRITON_TABLE_CACHE`).
    v1_cache: RefCell<Vec<Tensor>>,
}

impl Sampler {
    pub fn new(seed: u64) -> Self {
        Sampler {
            kept: RefCell::new(Vec::new()),
            seed,
            calls: std::cell::Cell::new(0),
            head_rows: std::cell::Cell::new(0),
            v1_cache: RefCell::new(Vec::new()),
        }
    }

    /// Device buffers a V1 sampler makes on its first call and keeps (Triton's
    /// `_TRITON_BUFFER_CACHE`, FlashInfer's row states): `make`'s tensors, unless one named
    /// `key…` is kept already.
    fn cache_once(&self, key: &str, make: impl FnOnce() -> Result<Vec<Tensor>>) -> Result<()> {
        if self
            .v1_cache
            .borrow()
            .iter()
            .any(|t| t.name.starts_with(key))
        {
            return Ok(());
        }
        let made = make()?;
        self.v1_cache.borrow_mut().extend(made);
        Ok(())
    }

    /// `SamplingTensors.from_lists` (sampling_metadata.py L487-587): per-row parameters in the
    /// logits dtype (top_ks in int32), copied to the device in this order; penalties are off,
    /// so `prompt_tokens`/`output_tokens` are empty (no allocation).
    fn sampling_tensors(&self, rt: &Runtime, rows: usize, vocab: usize, dt: DType) -> Result<()> {
        rt.set_op("sampler.sampling_tensors");
        // sampler.py L195-198: `self._sampling_tensors = None` frees the previous pass's.
        self.kept.borrow_mut().clear();
        let mut kept = Vec::with_capacity(7);
        let params: [(&str, f32); 6] = [
            ("sampling.temperatures", 1.0),
            ("sampling.top_ps", PROFILE_TOP_P),
            ("sampling.min_ps", 0.0),
            ("sampling.presence_penalties", 0.0),
            ("sampling.frequency_penalties", 0.0),
            ("sampling.repetition_penalties", 1.0),
        ];
        let make = |name: &str, v: f32| -> Result<Tensor> {
            let mut t = rt.tensor(name, Category::Sampler, &[rows], dt)?;
            upload_f32(rt, &mut t, &vec![v; rows])?;
            Ok(t)
        };
        // `from_lists` returns them in the order temperatures, top_ps, top_ks, min_ps, ...
        kept.push(make(params[0].0, params[0].1)?);
        kept.push(make(params[1].0, params[1].1)?);
        let ks = vec![(vocab - 1) as i64; rows];
        kept.push(i64_tensor(rt, "sampling.top_ks", &ks, DType::I32)?);
        for (name, v) in &params[2..] {
            kept.push(make(name, *v)?);
        }
        *self.kept.borrow_mut() = kept;
        Ok(())
    }

    /// `Sampler.forward` (sampler.py L206-313) on `[S, Vp]` model-dtype logits.
    pub fn forward(
        &self,
        rt: &Runtime,
        logits_d: &Tensor,
        vocab: usize,
        input: &ModelInput,
    ) -> Result<SamplerOutput> {
        rt.check_cancel()?;
        rt.set_layer(None);
        let rows = logits_d.rows();
        if input.random_indices.numel() != rows {
            return Err(Error::Request(format!(
                "sampler: {rows} rows of logits for {} sequences",
                input.random_indices.numel()
            )));
        }
        if vocab < 2 || vocab > logits_d.cols() {
            return Err(Error::Request(format!(
                "sampler: vocabulary {vocab} does not fit logits of {} columns",
                logits_d.cols()
            )));
        }
        let dt = logits_d.dtype;
        let backend = rt.backend();
        let call = self.calls.get();
        self.calls.set(call + 1);
        self.sampling_tensors(rt, rows, vocab, dt)?;
        let kept = self.kept.borrow();
        let (temperatures, top_ps) = (&kept[0], &kept[1]);

        // L260-261: `logits.to(torch.float)` of the padding-free view, then the in-place
        // temperature divide.
        rt.set_op("sampler.to_float");
        let mut logits = rt.tensor(
            "sampler.logits_f32",
            Category::Sampler,
            &[rows, vocab],
            DType::F32,
        )?;
        match backend {
            Backend::Dry => {}
            Backend::Cpu => {
                cpu::narrow_cols(logits_d.f32(), logits_d.cols(), vocab, logits.f32_mut());
                cpu::div_rows(logits.f32_mut(), vocab, temperatures.f32());
            }
            Backend::Cuda => cuda(rt, |c| {
                c.sampler_narrow_to_f32(logits_d, &mut logits)?;
                c.sampler_div_rows(&mut logits, temperatures)
            })?,
        }
        let mut out = SamplerOutput::default();
        if self.head_rows.get() > 0 && backend != Backend::Dry {
            out.logits_head = head(rt, &logits, self.head_rows.get())?;
        }

        // L263-265 → L417-443 `_apply_top_k_top_p`.
        let logits = self.top_k_top_p(rt, logits, top_ps, vocab)?;

        // L272, L274: probs and logprobs in f32.
        rt.set_op("sampler.softmax");
        let mut probs = rt.tensor(
            "sampler.probs",
            Category::Sampler,
            &[rows, vocab],
            DType::F32,
        )?;
        rt.set_op("sampler.log_softmax");
        let mut logprobs = rt.tensor(
            "sampler.logprobs",
            Category::Sampler,
            &[rows, vocab],
            DType::F32,
        )?;
        // (allocated in vLLM's order; computed after both exist, which changes no value)
        match backend {
            Backend::Dry => {}
            Backend::Cpu => {
                cpu::softmax_rows(logits.f32(), vocab, probs.f32_mut(), false);
                cpu::softmax_rows(logits.f32(), vocab, logprobs.f32_mut(), true);
            }
            Backend::Cuda => cuda(rt, |c| {
                c.sampler_softmax(&logits, &mut probs, false)?;
                c.sampler_softmax(&logits, &mut logprobs, true)
            })?,
        }
        if self.head_rows.get() > 0 && backend != Backend::Dry {
            out.probs_head = head(rt, &probs, self.head_rows.get())?;
        }

        // L729-858 `_sample_with_torch`, all rows RANDOM: L784 `sample_indices.long()`, then
        // L821-824 `_multinomial(probs[long_sample_indices], 1)` (L615-634).
        rt.set_op("sampler.sample");
        let seqs: Vec<i64> = (0..rows as i64).collect();
        let long_idx = i64_tensor(rt, "sampler.long_sample_indices", &seqs, DType::I64)?;
        let mut chosen = rt.tensor(
            "sampler.probs_selected",
            Category::Sampler,
            &[rows, vocab],
            DType::F32,
        )?;
        let mut q = rt.tensor(
            "sampler.exponential",
            Category::Sampler,
            &[rows, vocab],
            DType::F32,
        )?;
        let mut ids = rt.tensor(
            "sampler.sampled_ids",
            Category::Sampler,
            &[rows],
            DType::I64,
        )?;
        // A fresh stream of draws per call, reproducible from the seed.
        let seed = self.seed ^ call.wrapping_mul(0xD1B5_4A32_D192_ED03);
        match backend {
            Backend::Dry => {}
            Backend::Cpu => {
                cpu::index_rows(probs.f32(), vocab, long_idx.i32(), chosen.f32_mut());
                cpu::exponential(q.f32_mut(), seed);
                cpu::div_assign(chosen.f32_mut(), q.f32());
                cpu::argmax_rows(chosen.f32(), vocab, ids.i32_mut());
                out.ids = ids.i32().iter().map(|&v| v as u32).collect();
            }
            Backend::Cuda => {
                let host = cuda(rt, |c| {
                    c.sampler_index_rows(&probs, &long_idx, &mut chosen)?;
                    c.sampler_exponential(&mut q, seed)?;
                    c.sampler_div_assign(&mut chosen, &q)?;
                    c.sampler_argmax(&chosen, &mut ids)?;
                    c.download_i64(&ids)
                })?;
                out.ids = host.into_iter().map(|v| v as u32).collect();
            }
        }
        // `_multinomial` returns: its argument (the copy) and `q` go; the ids are brought to
        // the host (L515) and the sampler's locals go when it returns.
        drop(chosen);
        drop(q);
        drop(ids);
        drop(probs);
        drop(logprobs);
        drop(logits);
        drop(long_idx);
        Ok(out)
    }

    /// `_apply_top_k_top_p` (sampler.py L417-443) on the f32 logits; returns the new logits
    /// (the old ones are freed when the caller rebinds them, L263).
    fn top_k_top_p(
        &self,
        rt: &Runtime,
        logits: Tensor,
        top_ps: &Tensor,
        vocab: usize,
    ) -> Result<Tensor> {
        let backend = rt.backend();
        let rows = logits.rows();
        let shape = [rows, vocab];
        // L422: `logits.sort(dim=-1, descending=False)`.
        rt.set_op("sampler.sort");
        let mut sorted = rt.tensor("sampler.logits_sort", Category::Sampler, &shape, DType::F32)?;
        let mut idx = rt.tensor("sampler.logits_idx", Category::Sampler, &shape, DType::I64)?;
        sort_rows(rt, &logits, &mut sorted, &mut idx)?;

        // L425: `logits_sort.size(1) - k.to(torch.long)`; L427: gather; L428: `<`.
        rt.set_op("sampler.top_k");
        let ks = vec![(vocab - 1) as i64; rows];
        let k_long = i64_tensor(rt, "sampler.top_k.k_long", &ks, DType::I64)?;
        let kth: Vec<i64> = ks.iter().map(|&k| vocab as i64 - k).collect();
        let kth_t = i64_tensor(rt, "sampler.top_k.index", &kth, DType::I64)?;
        drop(k_long);
        let mut kth_val = rt.tensor(
            "sampler.top_k.value",
            Category::Sampler,
            &[rows, 1],
            DType::F32,
        )?;
        match backend {
            Backend::Dry => {}
            Backend::Cpu => cpu::gather_cols(sorted.f32(), vocab, kth_t.i32(), kth_val.f32_mut()),
            Backend::Cuda => cuda(rt, |c| c.sampler_gather_cols(&sorted, &kth_t, &mut kth_val))?,
        }
        drop(kth_t);
        let mut top_k_mask =
            rt.tensor("sampler.top_k_mask", Category::Sampler, &shape, DType::U8)?;
        compare(rt, &sorted, &kth_val, false, &mut top_k_mask)?;
        drop(kth_val);
        masked_fill(rt, &mut sorted, &top_k_mask)?;

        // L432-437: softmax, cumsum, `probs_sum <= 1 - p`, keep the last, mask.
        rt.set_op("sampler.top_p");
        let mut probs_sort =
            rt.tensor("sampler.probs_sort", Category::Sampler, &shape, DType::F32)?;
        let mut probs_sum =
            rt.tensor("sampler.probs_sum", Category::Sampler, &shape, DType::F32)?;
        match backend {
            Backend::Dry => {}
            Backend::Cpu => {
                cpu::softmax_rows(sorted.f32(), vocab, probs_sort.f32_mut(), false);
                cpu::cumsum_rows(probs_sort.f32(), vocab, probs_sum.f32_mut());
            }
            Backend::Cuda => cuda(rt, |c| {
                c.sampler_softmax(&sorted, &mut probs_sort, false)?;
                c.sampler_cumsum(&probs_sort, &mut probs_sum)
            })?,
        }
        // `1 - p` is computed in the logits dtype (p is), then compared in f32.
        let dt = top_ps.dtype;
        let one_minus: Vec<f32> = vec![round_to(1.0 - round_to(PROFILE_TOP_P, dt), dt); rows];
        let mut thr = rt.tensor("sampler.top_p.one_minus_p", Category::Sampler, &[rows], dt)?;
        upload_f32(rt, &mut thr, &one_minus)?;
        let mut top_p_mask =
            rt.tensor("sampler.top_p_mask", Category::Sampler, &shape, DType::U8)?;
        compare(rt, &probs_sum, &thr, true, &mut top_p_mask)?;
        drop(thr);
        match backend {
            Backend::Dry => {}
            Backend::Cpu => {
                for row in top_p_mask.u8_mut().chunks_exact_mut(vocab) {
                    row[vocab - 1] = 0;
                }
            }
            Backend::Cuda => cuda(rt, |c| c.sampler_clear_last_col(&mut top_p_mask))?,
        }
        masked_fill(rt, &mut sorted, &top_p_mask)?;

        // L440-442: scatter back to vocabulary order into a new tensor.
        rt.set_op("sampler.scatter");
        let mut new = rt.tensor(
            "sampler.logits_top_k_top_p",
            Category::Sampler,
            &shape,
            DType::F32,
        )?;
        match backend {
            Backend::Dry => {}
            Backend::Cpu => cpu::scatter_rows(sorted.f32(), idx.i32(), vocab, new.f32_mut()),
            Backend::Cuda => cuda(rt, |c| c.sampler_scatter(&sorted, &idx, &mut new))?,
        }
        // Returning frees the function's locals in the order they were bound.
        drop(sorted);
        drop(idx);
        drop(top_k_mask);
        drop(probs_sort);
        drop(probs_sum);
        drop(top_p_mask);
        drop(logits);
        Ok(new)
    }
}

/// `x < t.unsqueeze(1)` (`<=` when `or_equal`) into `mask`.
fn compare(rt: &Runtime, x: &Tensor, t: &Tensor, or_equal: bool, mask: &mut Tensor) -> Result<()> {
    let cols = x.cols();
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cpu => {
            cpu::compare_rows(x.f32(), cols, t.f32(), or_equal, mask.u8_mut());
            Ok(())
        }
        Backend::Cuda => cuda(rt, |c| c.sampler_compare_rows(x, t, or_equal, mask)),
    }
}

fn masked_fill(rt: &Runtime, x: &mut Tensor, mask: &Tensor) -> Result<()> {
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cpu => {
            cpu::masked_fill(x.f32_mut(), mask.u8(), f32::NEG_INFINITY);
            Ok(())
        }
        Backend::Cuda => cuda(rt, |c| c.sampler_masked_fill(x, mask, f32::NEG_INFINITY)),
    }
}

/// How PyTorch's CUDA `sort` (aten/src/ATen/native/cuda/SortStable.cu, the stable path for rows
/// longer than 4096) takes transient memory from the caching allocator besides its two
/// outputs, by the number of rows S of an `[S, V]` sort; N = S·V. Measured on the H200 with
/// torch 2.11 (peak over the input, outputs included: 32 bytes per element for S = 1 and
/// S ≥ 128, 44 for 2 ≤ S < 128), and read in the source:
/// - S ≥ 128, `segmented_sort_pairs`: `reverse_indices` int64 [N] (8N), then CUB's temp
///   storage with the alternate keys and values (12N + 255 bytes: the trace shows exactly that).
/// - S = 1, `segmented_sort_large_segments`: the same two buffers (8N, 12N + 255); the
///   measured peak is 0.26 bytes per element higher (CUB's histograms), not modelled.
/// - 2 ≤ S < 128, `segmented_sort_pairs_by_full_sort`: two int2 buffers (8N each), sorted keys
///   (4N) and CUB temp (12N + 255): 44 bytes per element with the outputs.
pub fn sort_transients(rows: usize, cols: usize) -> Vec<(&'static str, u64)> {
    let n = (rows * cols) as u64;
    if (2..128).contains(&rows) {
        vec![
            ("sort.indices_and_segment", 8 * n),
            ("sort.indices_and_segment2", 8 * n),
            ("sort.keys_out", 4 * n),
            ("sort.cub_temp_storage", 12 * n + 255),
        ]
    } else {
        vec![
            ("sort.reverse_indices", 8 * n),
            ("sort.cub_temp_storage", 12 * n + 255),
        ]
    }
}

/// The sort with PyTorch's transient buffers: on the GPU they are the radix sort's working
/// memory; on the host and in a dry run they are allocated and freed the same way.
fn sort_rows(rt: &Runtime, x: &Tensor, values: &mut Tensor, idx: &mut Tensor) -> Result<()> {
    let rows = x.rows();
    let cols = x.cols();
    let mut transients = Vec::new();
    for (name, bytes) in sort_transients(rows, cols) {
        transients.push(rt.reserve_bytes(name, Category::Sampler, bytes)?);
    }
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu::sort_rows(x.f32(), cols, values.f32_mut(), idx.i32_mut()),
        Backend::Cuda => {
            // The last two buffers are always 8N (iota values) and the CUB temp storage.
            let k = transients.len();
            let (head, tail) = transients.split_at_mut(k - 1);
            let (rev, temp) = (&mut head[k - 2], &mut tail[0]);
            cuda(rt, |c| c.sampler_sort_rows(x, values, idx, rev, temp))?;
        }
    }
    // CUB's temp storage goes first, then the index buffers (the order the trace shows).
    while let Some(t) = transients.pop() {
        drop(t);
    }
    Ok(())
}

/// The first `rows` rows of an f32 tensor, on the host.
fn head(rt: &Runtime, x: &Tensor, rows: usize) -> Result<Vec<f32>> {
    let cols = x.cols();
    let take = rows.min(x.rows()) * cols;
    Ok(crate::engine::ops::read_f32(rt, x)?
        .map(|mut v| {
            v.truncate(take);
            v
        })
        .unwrap_or_default())
}

/// How V1's sampler applies top-k and top-p (vLLM v1/sample/ops/topk_topp_sampler.py).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V1TopKTopP {
    /// PyTorch's sort, scattered back into the logits in place (0.15.1 :243-300).
    Sort,
    /// 0.19.0's Triton kernel from 8 rows on (:245-255; topk_topp_triton.py:965-1040): in
    /// place, with a cached `[min(pow2(min(SMs, R)), SMs), V]` buffer in the logits' dtype
    /// and two cached 200-entry tables, which stay allocated. Below 8 rows, the sort.
    Triton { sms: u64 },
    /// FlashInfer 0.6.8.post1's `top_k_top_p_sampling_from_logits` (vLLM 0.21's default on
    /// compute capability 7.5 to 12.1; topk_topp_sampler.py:132-157, 409-451): a 1 MiB row-state
    /// buffer made once and cached, `k.int()`, the masked logits, their softmax, then the
    /// int32 samples and a `valid` flag per row (flashinfer/sampling.py:540-561, 1286-1428,
    /// 200-243; docs/reading/vllm-v011-flashinfer.md). It samples by itself: no exponential
    /// draws.
    FlashInfer,
    /// Model Runner V2's dummy sampler (0.22.1-0.33.0 v1/worker/gpu/model_runner.py
    /// `_dummy_sampler_run`, gpu/sample/sampler.py): no request holds sampling parameters, so
    /// the logits stay in the model dtype (no fp32 copy, no top-k/top-p) and
    /// `gumbel_sample` takes the per-block argmax and maximum, `[R, ⌈V/1024⌉]` int64 and
    /// f32 (gumbel.py:194-215 in 0.22.1, :233-279 in 0.28.0).
    V2Gumbel,
}

/// FlashInfer's cached `top_k_mask_logits_row_states` buffer (1 MiB, uint8 zeros).
const FLASHINFER_ROW_STATES: usize = 1 << 20;

/// V1's dummy sampling metadata (0.19.0 v1/worker/gpu_model_runner.py:5574-5594).
const V1_TEMPERATURE: f32 = 0.5;
const V1_TOP_P: f32 = 0.9;
/// `_SAMPLING_EPS` (v1/sample/sampler.py).
const V1_SAMPLING_EPS: f32 = 1e-5;
/// `_NORMAL_CDF_TO_SIGMA_TABLE` and `_PERCENTILE_TO_STD_TABLE` (topk_topp_triton.py).
const V1_TRITON_TABLE_LEN: usize = 200;

/// Top-k then top-p on f32 rows, as `apply_top_k_top_p_pytorch` computes them, on the host
/// (the values the Triton kernel produces in place; its working memory is its own buffer).
fn top_k_top_p_host(logits: &mut [f32], vocab: usize, k: usize, p: f32) {
    let rows = logits.len() / vocab;
    let mut sorted = vec![0f32; logits.len()];
    let mut idx = vec![0i32; logits.len()];
    cpu::sort_rows(logits, vocab, &mut sorted, &mut idx);
    let kth: Vec<f32> = sorted
        .chunks_exact(vocab)
        .map(|row| row[vocab - k])
        .collect();
    let mut mask = vec![0u8; logits.len()];
    cpu::compare_rows(&sorted, vocab, &kth, false, &mut mask);
    cpu::masked_fill(&mut sorted, &mask, f32::NEG_INFINITY);
    let mut probs = vec![0f32; logits.len()];
    cpu::softmax_rows(&sorted, vocab, &mut probs, false);
    let mut sum = vec![0f32; logits.len()];
    cpu::cumsum_rows(&probs, vocab, &mut sum);
    cpu::compare_rows(&sum, vocab, &vec![1.0 - p; rows], true, &mut mask);
    for row in mask.chunks_exact_mut(vocab) {
        row[vocab - 1] = 0;
    }
    cpu::masked_fill(&mut sorted, &mask, f32::NEG_INFINITY);
    cpu::scatter_rows(&sorted, &idx, vocab, logits);
}

impl Sampler {
    /// vLLM V1's `Sampler.forward` on `_dummy_sampler_run`'s `[R, V]` logits in the model
    /// dtype (0.15.1 and 0.19.0 v1/sample/sampler.py: `logits.to(float32)`, the greedy
    /// argmax, the temperature divided in place, top-k/top-p, then `forward_native`'s
    /// softmax and `random_sample`'s exponential draws, `probs.div_(q).argmax`, and the
    /// `torch.where` of greedy and random). Simulated devices only (dry and CPU).
    pub fn forward_v1(
        &self,
        rt: &Runtime,
        logits_d: &Tensor,
        vocab: usize,
        top_k_top_p: V1TopKTopP,
    ) -> Result<SamplerOutput> {
        rt.check_cancel()?;
        rt.set_layer(None);
        // On a GPU the sampler's buffers are allocated as vLLM's are and the steps with a
        // CUDA op run (PyTorch's sort, the masks); the others (Triton's top-k/top-p, the
        // softmax, the exponential draws) allocate only: vLLM discards the dummy run's
        // tokens, and none are reported from it.
        let backend = rt.backend();
        let rows = logits_d.rows();
        if vocab < 2 || vocab > logits_d.cols() {
            return Err(Error::Request(format!(
                "sampler: vocabulary {vocab} does not fit logits of {} columns",
                logits_d.cols()
            )));
        }
        let call = self.calls.get();
        self.calls.set(call + 1);
        let shape = [rows, vocab];
        let cpu_on = backend == Backend::Cpu;

        // The dummy metadata: `torch.full((num_reqs,), v)`, f32, top_k int64.
        rt.set_op("sampler_v1.metadata");
        let full = |name: &str, v: f32| -> Result<Tensor> {
            let mut t = rt.tensor(name, Category::Sampler, &[rows], DType::F32)?;
            upload_f32(rt, &mut t, &vec![v; rows])?;
            Ok(t)
        };
        let temperature = full("sampling.temperature", V1_TEMPERATURE)?;
        let top_p = full("sampling.top_p", V1_TOP_P)?;
        let top_k = i64_tensor(
            rt,
            "sampling.top_k",
            &vec![(vocab - 1) as i64; rows],
            DType::I64,
        )?;
        let penalties = [
            full("sampling.frequency_penalties", 0.1)?,
            full("sampling.presence_penalties", 0.1)?,
            full("sampling.repetition_penalties", 0.1)?,
        ];

        // `logits.to(torch.float32)`: a copy of 16-bit logits; f32 logits (`--dtype float32`)
        // are returned as they are, a view without the padded columns: no allocation.
        rt.set_op("sampler_v1.to_float");
        let mut logits = if logits_d.dtype == DType::F32 {
            logits_d.part("sampler.logits_f32", 0, &shape)
        } else {
            rt.tensor("sampler.logits_f32", Category::Sampler, &shape, DType::F32)?
        };
        if cpu_on {
            cpu::narrow_cols(logits_d.f32(), logits_d.cols(), vocab, logits.f32_mut());
        }
        let mut out = SamplerOutput::default();
        if self.head_rows.get() > 0 && cpu_on {
            out.logits_head = head(rt, &logits, self.head_rows.get())?;
        }
        // `greedy_sample`: argmax.
        rt.set_op("sampler_v1.greedy");
        let mut greedy = rt.tensor(
            "sampler.greedy_sampled",
            Category::Sampler,
            &[rows],
            DType::I64,
        )?;
        if cpu_on {
            cpu::argmax_rows(logits.f32(), vocab, greedy.i32_mut());
        }
        // `apply_temperature`: `torch.where(temp < eps, 1.0, temp)`, then `div_` in place.
        rt.set_op("sampler_v1.temperature");
        let below = rt.tensor(
            "sampler.temp_below_eps",
            Category::Sampler,
            &[rows],
            DType::U8,
        )?;
        let mut temp = rt.tensor("sampler.temp_where", Category::Sampler, &[rows], DType::F32)?;
        drop(below);
        if cpu_on {
            temp.f32_mut().fill(V1_TEMPERATURE);
            cpu::div_rows(logits.f32_mut(), vocab, temp.f32());
        }
        drop(temp);

        match top_k_top_p {
            V1TopKTopP::Triton { sms } if rows >= 8 => {
                rt.set_op("sampler_v1.top_k_top_p_triton");
                let k32 = rt.tensor(
                    "sampler.top_k_int32",
                    Category::Sampler,
                    &[rows],
                    DType::I32,
                )?;
                self.cache_once("sampler.triton_buffer", || {
                    let programs = (sms.max(1) as usize).min(rows);
                    let buf_rows = programs.next_power_of_two().min(sms.max(1) as usize);
                    let table = |name| {
                        rt.tensor(name, Category::Sampler, &[V1_TRITON_TABLE_LEN], DType::F32)
                    };
                    Ok(vec![
                        rt.tensor(
                            "sampler.triton_buffer (cached)",
                            Category::Sampler,
                            &[buf_rows, vocab],
                            DType::F32,
                        )?,
                        table("sampler.normal_cdf_to_sigma (cached)")?,
                        table("sampler.percentile_to_std (cached)")?,
                    ])
                })?;
                if cpu_on {
                    top_k_top_p_host(logits.f32_mut(), vocab, vocab - 1, V1_TOP_P);
                }
                drop(k32);
            }
            V1TopKTopP::FlashInfer => {}
            _ => {
                rt.set_op("sampler_v1.sort");
                let mut sorted =
                    rt.tensor("sampler.logits_sort", Category::Sampler, &shape, DType::F32)?;
                let mut idx =
                    rt.tensor("sampler.logits_idx", Category::Sampler, &shape, DType::I64)?;
                sort_rows(rt, &logits, &mut sorted, &mut idx)?;
                rt.set_op("sampler_v1.top_k");
                let kth_idx = i64_tensor(rt, "sampler.top_k.index", &vec![1; rows], DType::I64)?;
                let mut kth = rt.tensor(
                    "sampler.top_k.value",
                    Category::Sampler,
                    &[rows, 1],
                    DType::F32,
                )?;
                if cpu_on {
                    cpu::gather_cols(sorted.f32(), vocab, kth_idx.i32(), kth.f32_mut());
                }
                drop(kth_idx);
                let mut top_k_mask =
                    rt.tensor("sampler.top_k_mask", Category::Sampler, &shape, DType::U8)?;
                compare(rt, &sorted, &kth, false, &mut top_k_mask)?;
                drop(kth);
                masked_fill(rt, &mut sorted, &top_k_mask)?;
                rt.set_op("sampler_v1.top_p");
                let mut probs_sort =
                    rt.tensor("sampler.probs_sort", Category::Sampler, &shape, DType::F32)?;
                if cpu_on {
                    cpu::softmax_rows(sorted.f32(), vocab, probs_sort.f32_mut(), false);
                    let copy = probs_sort.f32().to_vec();
                    cpu::cumsum_rows(&copy, vocab, probs_sort.f32_mut());
                }
                let mut thr = rt.tensor(
                    "sampler.top_p.one_minus_p",
                    Category::Sampler,
                    &[rows, 1],
                    DType::F32,
                )?;
                upload_f32(rt, &mut thr, &vec![1.0 - V1_TOP_P; rows])?;
                let mut top_p_mask =
                    rt.tensor("sampler.top_p_mask", Category::Sampler, &shape, DType::U8)?;
                compare(rt, &probs_sort, &thr, true, &mut top_p_mask)?;
                drop(thr);
                if cpu_on {
                    for row in top_p_mask.u8_mut().chunks_exact_mut(vocab) {
                        row[vocab - 1] = 0;
                    }
                }
                masked_fill(rt, &mut sorted, &top_p_mask)?;
                rt.set_op("sampler_v1.scatter");
                if cpu_on {
                    cpu::scatter_rows(sorted.f32(), idx.i32(), vocab, logits.f32_mut());
                }
                drop(sorted);
                drop(idx);
                drop(top_k_mask);
                drop(probs_sort);
                drop(top_p_mask);
            }
        }

        if top_k_top_p == V1TopKTopP::FlashInfer {
            rt.set_op("sampler_v1.flashinfer");
            self.cache_once("sampler.flashinfer_row_states", || {
                Ok(vec![rt.tensor(
                    "sampler.flashinfer_row_states (cached)",
                    Category::Sampler,
                    &[FLASHINFER_ROW_STATES],
                    DType::U8,
                )?])
            })?;
            let k32 = rt.tensor(
                "sampler.top_k_int32",
                Category::Sampler,
                &[rows],
                DType::I32,
            )?;
            let masked = rt.tensor("sampler.mask_logits", Category::Sampler, &shape, DType::F32)?;
            let probs = rt.tensor("sampler.probs", Category::Sampler, &shape, DType::F32)?;
            let samples = rt.tensor(
                "sampler.samples_int32",
                Category::Sampler,
                &[rows],
                DType::I32,
            )?;
            let valid = rt.tensor("sampler.valid", Category::Sampler, &[rows], DType::U8)?;
            drop((valid, probs, masked, k32));
            // `.long()` of the samples, then the `torch.where` with the greedy ids.
            rt.set_op("sampler_v1.where");
            let random = rt.tensor(
                "sampler.random_sampled",
                Category::Sampler,
                &[rows],
                DType::I64,
            )?;
            drop(samples);
            let below = rt.tensor(
                "sampler.temp_below_eps",
                Category::Sampler,
                &[rows],
                DType::U8,
            )?;
            let sampled = rt.tensor("sampler.sampled", Category::Sampler, &[rows], DType::I64)?;
            drop((
                below,
                sampled,
                random,
                greedy,
                logits,
                penalties,
                top_k,
                top_p,
                temperature,
            ));
            return Ok(out);
        }
        // `forward_native`: probs in f32; `random_sample`: q, `probs.div_(q).argmax`.
        rt.set_op("sampler_v1.softmax");
        let mut probs = rt.tensor("sampler.probs", Category::Sampler, &shape, DType::F32)?;
        if cpu_on {
            cpu::softmax_rows(logits.f32(), vocab, probs.f32_mut(), false);
        }
        if self.head_rows.get() > 0 && cpu_on {
            out.probs_head = head(rt, &probs, self.head_rows.get())?;
        }
        rt.set_op("sampler_v1.sample");
        let mut q = rt.tensor("sampler.exponential", Category::Sampler, &shape, DType::F32)?;
        let mut random = rt.tensor(
            "sampler.random_sampled",
            Category::Sampler,
            &[rows],
            DType::I64,
        )?;
        let seed = self.seed ^ call.wrapping_mul(0xD1B5_4A32_D192_ED03);
        if cpu_on {
            cpu::exponential(q.f32_mut(), seed);
            cpu::div_assign(probs.f32_mut(), q.f32());
            cpu::argmax_rows(probs.f32(), vocab, random.i32_mut());
        }
        drop(q);
        drop(probs);
        // `torch.where(temperature < eps, greedy, random)`: every row is random here.
        rt.set_op("sampler_v1.where");
        let below = rt.tensor(
            "sampler.temp_below_eps",
            Category::Sampler,
            &[rows],
            DType::U8,
        )?;
        let mut sampled = rt.tensor("sampler.sampled", Category::Sampler, &[rows], DType::I64)?;
        drop(below);
        if cpu_on {
            let pick_greedy = V1_TEMPERATURE < V1_SAMPLING_EPS;
            let src = if pick_greedy {
                greedy.i32()
            } else {
                random.i32()
            };
            sampled.i32_mut().copy_from_slice(src);
            out.ids = sampled.i32().iter().map(|&v| v as u32).collect();
        }
        drop(sampled);
        drop(random);
        drop(greedy);
        drop(logits);
        drop(penalties);
        drop(top_k);
        drop(top_p);
        drop(temperature);
        Ok(out)
    }
}

/// Model Runner V2's Gumbel block width (`BLOCK_SIZE = 1024`, gpu/sample/gumbel.py).
const V2_GUMBEL_BLOCK: usize = 1024;

impl Sampler {
    /// Model Runner V2's `_dummy_sampler_run` after `compute_logits`: `gumbel_sample` on the
    /// `[R, V]` logits as they are (`V1TopKTopP::V2Gumbel`). The dummy requests hold no
    /// temperature, so the draw is the greedy argmax, which a CPU run computes.
    pub fn forward_v2_dummy(
        &self,
        rt: &Runtime,
        logits_d: &Tensor,
        vocab: usize,
    ) -> Result<SamplerOutput> {
        rt.check_cancel()?;
        rt.set_layer(None);
        let rows = logits_d.rows();
        if vocab < 2 || vocab > logits_d.cols() {
            return Err(Error::Request(format!(
                "sampler: vocabulary {vocab} does not fit logits of {} columns",
                logits_d.cols()
            )));
        }
        let blocks = vocab.div_ceil(V2_GUMBEL_BLOCK);
        rt.set_op("sampler_v2.gumbel");
        let local_argmax = rt.tensor(
            "sampler.local_argmax",
            Category::Sampler,
            &[rows, blocks],
            DType::I64,
        )?;
        let local_max = rt.tensor(
            "sampler.local_max",
            Category::Sampler,
            &[rows, blocks],
            DType::F32,
        )?;
        // `local_max.argmax(dim=-1, keepdim=True)`, then the gather into `sampled`.
        let block_idx = rt.tensor(
            "sampler.max_block_idx",
            Category::Sampler,
            &[rows, 1],
            DType::I64,
        )?;
        let mut sampled = rt.tensor("sampler.sampled", Category::Sampler, &[rows], DType::I64)?;
        let mut out = SamplerOutput::default();
        if rt.backend() == Backend::Cpu {
            let mut f = vec![0f32; rows * vocab];
            cpu::narrow_cols(logits_d.f32(), logits_d.cols(), vocab, &mut f);
            cpu::argmax_rows(&f, vocab, sampled.i32_mut());
            out.ids = sampled.i32().iter().map(|&v| v as u32).collect();
            if self.head_rows.get() > 0 {
                f.truncate(self.head_rows.get().min(rows) * vocab);
                out.logits_head = f;
            }
        }
        drop((block_idx, local_max, local_argmax, sampled));
        Ok(out)
    }
}

/// V1's logits for the profile's sampler run (0.19.0 v1/worker/gpu_model_runner.py: the
/// `_dummy_run` returns `hidden_states[logit_indices]`, the last token of each request, kept
/// by `profile_run` as `last_hidden_states`; `_dummy_sampler_run` replaces it with
/// `torch.rand_like` (:5569) and runs `compute_logits` on that (:5571)). Returns the kept
/// last hidden states, the random ones and the `[R, Vp]` logits. In compute mode the random
/// tensor holds the real hidden states, so the logits and sampled tokens mean something; its
/// shape, dtype and lifetime are V1's. Without `rand_like` (Model Runner V2, 0.22.1
/// v1/worker/gpu/model_runner.py:569-571) the logits are those of the last hidden states.
pub fn compute_logits_v1(
    rt: &Runtime,
    hidden: &Tensor,
    head: LogitsHead<'_>,
    rows: &[u32],
    rand_like: bool,
) -> Result<(Tensor, Option<Tensor>, Tensor)> {
    rt.check_cancel()?;
    rt.set_layer(None);
    rt.set_op("logits_v1.last_hidden_states");
    let last = select_rows(rt, hidden, rows, "last_hidden_states")?;
    if !rand_like {
        rt.set_op("logits_v1.lm_head");
        let logits = head.project(rt, &last, hidden.dtype)?;
        let logits = crate::engine::ops_tp::all_gather_logits(rt, logits)?;
        let logits = process_logits(rt, logits, head.mods)?;
        return Ok((last, None, logits));
    }
    rt.set_op("logits_v1.rand_like");
    let mut random = rt.tensor(
        "sampler_run.rand_like",
        Category::Sampler,
        &last.shape,
        hidden.dtype,
    )?;
    match rt.backend() {
        Backend::Cpu => random.f32_mut().copy_from_slice(last.f32()),
        Backend::Cuda => crate::engine::ops::copy_into(rt, &mut random, 0, &last)?,
        Backend::Dry => {}
    }
    rt.set_op("logits_v1.lm_head");
    let logits = head.project(rt, &random, hidden.dtype)?;
    // With tensor parallel every rank gets the whole vocabulary (V1 all-gathers).
    let logits = crate::engine::ops_tp::all_gather_logits(rt, logits)?;
    let logits = process_logits(rt, logits, head.mods)?;
    Ok((last, Some(random), logits))
}

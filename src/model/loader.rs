//! Loading weights through the framework allocator, one tensor at a time: 16-bit uploads,
//! LLM.int8 (computed or as stored) and bitsandbytes 4-bit (in flight or as stored). Shared by
//! the Llama-family and OPT models.

use super::weights::WeightSource;
use crate::base::error::{Error, Result};
use crate::device::synth::SynthFill;
use crate::device::Backend;
use crate::engine::ops;
use crate::engine::progress::Progress;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
use crate::quant::bnb4::{self, Absmax, Bnb4Meta, Bnb4Type};
use crate::quant::fp8::Fp8Linear;
use crate::quant::fp8_block::{BlockSize, Fp8BlockLinear};
use crate::quant::int8::{Int8Linear, TileLayout};
use crate::quant::marlin::{self, MarlinLinear};
use crate::quant::{Bnb4Linear, Bnb4Nested, FusedLinear, Linear, Quant};
use std::rc::Rc;

/// Measured while loading: bytes read from the weights' source as stored (after the page
/// cache, before conversion) and the time spent reading and converting them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadStats {
    pub source_bytes: u64,
    pub read_seconds: f64,
    /// Time spent quantizing on the host (int8 rows, NF4 blocks).
    pub quantize_seconds: f64,
    pub total_seconds: f64,
}

impl LoadStats {
    /// Stored bytes per second of reading and converting (mmap → f32 or int8).
    pub fn read_gb_per_s(&self) -> Option<f64> {
        (self.read_seconds > 0.0).then(|| self.source_bytes as f64 / self.read_seconds / 1e9)
    }
    /// Stored bytes per second of the whole load, including device upload and quantization.
    pub fn load_gb_per_s(&self) -> Option<f64> {
        (self.total_seconds > 0.0 && self.source_bytes > 0)
            .then(|| self.source_bytes as f64 / self.total_seconds / 1e9)
    }
}

/// What the loader does with each 2-D projection weight.
pub struct LoadOptions {
    pub quant: Quant,
    pub int8_threshold: f32,
    pub int8_layout: TileLayout,
    /// The 0-dim f32 tensors each attention layer makes when the release builds it
    /// (`vllm::Release::attn_scalars`: 0 up to 0.6.6, 2, 4 or 7 after), kept as long as the
    /// model.
    pub attn_scalars: usize,
    /// The release's Marlin generation and the GPU's SMs, for AWQ / GPTQ checkpoints.
    pub marlin: marlin::Kernel,
}

impl LoadOptions {
    /// Refuses a load that is not 16-bit for a family whose quantized layers are not
    /// modelled: a `--quant` other than fp16/bf16, or a checkpoint stored as fp8 or 4-bit.
    /// `why` ends the message ("model_type phi runs in 16 bits only: {why}").
    pub(crate) fn require_16bit(
        &self,
        src: &dyn WeightSource,
        model_type: &str,
        why: &str,
    ) -> Result<()> {
        if self.quant.unquantized()
            && src.stored_fp8().is_none()
            && src.packed4().is_none()
            && src.nvfp4().is_none()
            && src.sparse24().is_none()
        {
            return Ok(());
        }
        Err(Error::Request(format!(
            "model_type {model_type} runs in 16 bits only: {why}"
        )))
    }

    /// Refuses a multimodal tower vLLM would quantize: `--quant` quantizing a 16-bit
    /// checkpoint in flight (the tower gets the same quant_config and no list), or a quantized
    /// checkpoint whose list of unquantized modules leaves a tower layer out
    /// (`WeightSource::quantized_tower`). A tower the list keeps in 16 bits loads through
    /// `Loader::tower`.
    pub(crate) fn require_16bit_tower(
        &self,
        src: &dyn WeightSource,
        model_type: &str,
    ) -> Result<()> {
        let stored = src.stored_fp8().is_some()
            || src.packed4().is_some()
            || src.nvfp4().is_some()
            || src.sparse24().is_some();
        if !self.quant.unquantized() && !stored {
            return Err(Error::Request(format!(
                "model_type {model_type}: --quant {} would quantize its vision tower too (vLLM hands the tower the quant_config), which is not modelled; serve a checkpoint quantized with the tower kept in 16 bits",
                self.quant
            )));
        }
        match src.quantized_tower() {
            Some(t) => Err(Error::Model {
                path: t.path,
                problem: t.problem,
            }),
            None => Ok(()),
        }
    }
}

/// The names of an attention layer's 0-dim f32 tensors, in the order vLLM makes them
/// (`Release::attn_scalars` of them).
const ATTN_SCALARS: [&str; 7] = [
    "_k_scale",
    "_v_scale",
    "_q_scale",
    "_prob_scale",
    "q_range",
    "k_range",
    "v_range",
];

/// `Attention.__init__`'s 0-dim f32 tensors for the attention module `attn`
/// (`model.layers.0.self_attn.attn`), made on the device as vLLM makes them.
pub(crate) fn attention_scalars(rt: &Runtime, attn: &str, n: usize) -> Result<Vec<Tensor>> {
    ATTN_SCALARS[..n.min(ATTN_SCALARS.len())]
        .iter()
        .map(|s| rt.tensor(format!("{attn}.{s}"), Category::Weight, &[], DType::F32))
        .collect()
}

pub(crate) fn upload(
    rt: &Runtime,
    name: &str,
    shape: &[usize],
    dtype: DType,
    data: Option<Vec<f32>>,
) -> Result<Tensor> {
    let numel: usize = shape.iter().product();
    match (rt.backend(), data) {
        // The host keeps f32; values are rounded to the dtype the weight is stored in, as a
        // GPU's fp16/bf16 copy would be. The values become the tensor's storage.
        (Backend::Cpu, Some(mut d)) if dtype.is_float() => {
            d.resize(numel, 0.0);
            dtype.round_slice(&mut d);
            rt.tensor_with_values(name, Category::Weight, shape, dtype, d)
        }
        (Backend::Cuda, Some(d)) => {
            let span = crate::base::timing::span("load: device allocation");
            let mut t = rt.tensor(name, Category::Weight, shape, dtype)?;
            drop(span);
            let span = crate::base::timing::span("load: upload (all of it)");
            ops::upload_f32(rt, &mut t, &d)?;
            drop(span);
            crate::base::background::drop_later(d);
            Ok(t)
        }
        _ => rt.tensor(name, Category::Weight, shape, dtype),
    }
}

/// Reads weights one tensor at a time, reporting progress and honouring cancel.
pub(crate) struct Loader<'a> {
    rt: &'a Runtime,
    src: &'a dyn WeightSource,
    opts: &'a LoadOptions,
    pub(crate) act: DType,
    needs_data: bool,
    count: u32,
    index: u32,
    pub(crate) stats: LoadStats,
    /// bitsandbytes' process-wide dynamic code book (`name2qmap["dynamic"]`), made on the
    /// first double quantization in flight and shared by every weight after it.
    dynamic_map: Option<Rc<Tensor>>,
    /// While set, the tensor being read is a tensor-parallel shard of a larger checkpoint
    /// tensor: read whole, cut, and only the cut reaches the device.
    slice: Option<Slice>,
    /// vLLM 0.8.5's `TORCH_DEVICE_IDENTITY` (w8a8_utils.py L129-133), made by the first
    /// fp8 linear's `create_weights` (fp8.py L201) and kept by the process.
    pub(crate) fp8_identity: Option<Tensor>,
    /// Every linear layer loads 16-bit whatever the checkpoint's format: a multimodal tower
    /// its quantization config lists as unquantized (vLLM's `UnquantizedLinearMethod`).
    keep_16bit: bool,
}

/// A checkpoint tensor's name and the part of it a rank loads.
pub(crate) type NamedSlice = (String, Slice);

/// The part of a `[rows, cols]` checkpoint tensor one tensor-parallel rank holds: a block of
/// rows (column-parallel layers: vLLM's `ColumnParallelLinear.weight_loader` narrows dim 0) or
/// of columns (row-parallel layers: `RowParallelLinear.weight_loader` narrows dim 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slice {
    pub full: [usize; 2],
    pub rows: (usize, usize),
    pub cols: (usize, usize),
}

impl Slice {
    pub(crate) fn whole(n: usize, k: usize) -> Self {
        Slice {
            full: [n, k],
            rows: (0, n),
            cols: (0, k),
        }
    }

    pub(crate) fn rows(n: usize, k: usize, first: usize, len: usize) -> Self {
        Slice {
            rows: (first, len),
            ..Slice::whole(n, k)
        }
    }

    pub(crate) fn cols(n: usize, k: usize, first: usize, len: usize) -> Self {
        Slice {
            cols: (first, len),
            ..Slice::whole(n, k)
        }
    }

    fn is_whole(&self) -> bool {
        *self == Slice::whole(self.full[0], self.full[1])
    }

    fn shape(&self) -> [usize; 2] {
        [self.rows.1, self.cols.1]
    }

    /// The slice of row-major `data` (`full` shaped).
    fn cut<T: Copy>(&self, data: &[T]) -> Vec<T> {
        let k = self.full[1];
        let mut out = Vec::with_capacity(self.rows.1 * self.cols.1);
        for r in self.rows.0..self.rows.0 + self.rows.1 {
            out.extend_from_slice(&data[r * k + self.cols.0..r * k + self.cols.0 + self.cols.1]);
        }
        out
    }
}

impl<'a> Loader<'a> {
    /// A loader for `count` tensors.
    pub(crate) fn new(
        rt: &'a Runtime,
        src: &'a dyn WeightSource,
        opts: &'a LoadOptions,
        count: usize,
    ) -> Self {
        Loader {
            rt,
            src,
            opts,
            // A pre-quantized fp8 checkpoint runs in its own dtype (`StoredFp8::dtype`).
            act: src
                .stored_fp8()
                .map_or(opts.quant.activation_dtype(), |f| f.dtype),
            needs_data: rt.backend() != Backend::Dry,
            count: count as u32,
            index: 0,
            stats: LoadStats::default(),
            dynamic_map: None,
            slice: None,
            fp8_identity: None,
            keep_16bit: false,
        }
    }

    /// A loader for a multimodal tower whose linear layers the checkpoint keeps in 16 bits
    /// (`LoadOptions::require_16bit_tower` has checked that it does).
    pub(crate) fn tower(
        rt: &'a Runtime,
        src: &'a dyn WeightSource,
        opts: &'a LoadOptions,
        count: usize,
    ) -> Self {
        Loader {
            keep_16bit: true,
            ..Loader::new(rt, src, opts, count)
        }
    }

    /// Counts one tensor in the progress report and checks for cancel.
    fn tick(&mut self, name: &str, bytes: u64) -> Result<()> {
        self.rt.check_cancel()?;
        self.rt.progress(Progress::Load {
            index: self.index,
            count: self.count,
            tensor: name.to_string(),
            bytes,
        });
        self.index += 1;
        Ok(())
    }

    fn read(&mut self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        self.tick(
            name,
            shape.iter().product::<usize>() as u64 * self.act.size_bytes(),
        )?;
        let slice = self.slice.filter(|s| !s.is_whole());
        if let Some(sl) = slice {
            if shape != sl.shape() {
                return Err(Error::Request(format!(
                    "tensor {name}: shard {shape:?} does not match its slice {:?}",
                    sl.shape()
                )));
            }
        }
        if self.needs_data {
            let _span = crate::base::timing::span("load: making or reading the weights (host)");
            let t = std::time::Instant::now();
            let d = match slice {
                Some(sl) => sl.cut(&self.src.read_f32(name, &sl.full)?),
                None => self.src.read_f32(name, shape)?,
            };
            self.stats.read_seconds += t.elapsed().as_secs_f64();
            self.stats.source_bytes += self.src.stored_bytes(name);
            Ok(Some(d))
        } else {
            Ok(None)
        }
    }

    /// A checkpoint tensor's values on the host (`None` on a dry device, which reads nothing),
    /// counted in the progress and read statistics: for a parameter that re-lays them out
    /// before it is made (gpt-oss's experts, permuted as vLLM's loader does).
    pub(crate) fn read_host(&mut self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        self.read(name, shape)
    }

    /// A U8 checkpoint tensor's bytes (gpt-oss's MXFP4 blocks and scales), `None` on a dry
    /// device, counted as `read_host` counts.
    pub(crate) fn read_u8_host(&mut self, name: &str, shape: &[usize]) -> Result<Option<Vec<u8>>> {
        self.tick(name, shape.iter().product::<usize>() as u64)?;
        if !self.needs_data {
            return Ok(None);
        }
        let t = std::time::Instant::now();
        let d = self.src.read_u8(name, shape)?;
        self.stats.read_seconds += t.elapsed().as_secs_f64();
        self.stats.source_bytes += d.len() as u64;
        Ok(Some(d))
    }

    /// The stretch a preset's weight `name` of `shape` fills when the GPU makes it itself
    /// (`device::synth`: no host values, no upload), honouring the slice being read; `None`
    /// when the values come from the host (a file, a CPU or dry device, a quantization).
    fn device_fill(&self, name: &str, shape: &[usize]) -> Option<SynthFill> {
        if self.rt.backend() != Backend::Cuda || !matches!(self.act, DType::F16 | DType::BF16) {
            return None;
        }
        let mut f = self.src.synthetic(name)?;
        let numel: usize = shape.iter().product();
        f.count = numel as u64;
        match self.slice.filter(|s| !s.is_whole()) {
            Some(sl) => {
                f.elem0 = (sl.rows.0 * sl.full[1] + sl.cols.0) as u64;
                f.row_len = (sl.cols.1 - sl.cols.0) as u64;
                f.stride = sl.full[1] as u64;
            }
            None => {
                let last = shape.last().copied().unwrap_or(1).max(1) as u64;
                f.row_len = last;
                f.stride = last;
            }
        }
        Some(f)
    }

    /// The stored bytes of `name` (of `shape`, under the slice being read) when the GPU can
    /// take them as they are: a 16-bit tensor stored in the activation dtype, whole or a block
    /// of whole rows. `None` sends the tensor through the host's f32 path.
    fn stored_as_is(&self, name: &str, shape: &[usize]) -> Option<&'a [u8]> {
        if self.rt.backend() != Backend::Cuda {
            return None;
        }
        let src: &'a dyn WeightSource = self.src;
        match self.slice.filter(|s| !s.is_whole()) {
            None => src
                .raw_16bit(name, shape)
                .filter(|(_, d)| *d == self.act)
                .map(|(b, _)| b),
            Some(sl) if sl.cols == (0, sl.full[1]) => {
                let (b, d) = src.raw_16bit(name, &sl.full)?;
                let row = sl.full[1] * 2;
                (d == self.act).then(|| &b[sl.rows.0 * row..(sl.rows.0 + sl.rows.1) * row])
            }
            Some(_) => None,
        }
    }

    /// A weight copied to the GPU as stored, part after part (counted in the progress and the
    /// read statistics like a converted one).
    fn copied_as_is(
        &mut self,
        tensor: &str,
        parts: &[(&str, &[u8])],
        shape: &[usize],
    ) -> Result<Tensor> {
        for (n, b) in parts {
            self.tick(n, b.len() as u64)?;
        }
        let t0 = std::time::Instant::now();
        let _t = crate::base::timing::span("load: 16-bit weights copied as stored");
        let mut t = self.rt.tensor(tensor, Category::Weight, shape, self.act)?;
        let mut offset = 0u64;
        for (n, b) in parts {
            ops::upload_bytes_at(self.rt, &mut t, offset, b)?;
            offset += b.len() as u64;
            self.stats.source_bytes += self.src.stored_bytes(n);
        }
        self.stats.read_seconds += t0.elapsed().as_secs_f64();
        Ok(t)
    }

    /// A weight the GPU makes from its stretches (counted in the progress like a read one).
    fn made_on_device(
        &mut self,
        tensor: &str,
        names: &[&str],
        shape: &[usize],
        fills: &[SynthFill],
    ) -> Result<Tensor> {
        for (n, f) in names.iter().zip(fills) {
            self.tick(n, f.count * self.act.size_bytes())?;
        }
        let _t = crate::base::timing::span("load: weights made on the GPU");
        let mut t = self.rt.tensor(tensor, Category::Weight, shape, self.act)?;
        ops::fill_synthetic(self.rt, &mut t, fills)?;
        Ok(t)
    }

    /// A preset's LLM.int8 layer quantized where the GPU makes it: `load_int8`'s two
    /// allocations, written by `synth_int8_rows` instead of uploaded (no host values).
    fn int8_made_on_device(
        &mut self,
        name: &str,
        n: usize,
        k: usize,
        fill: &SynthFill,
    ) -> Result<Linear> {
        self.tick(name, (n * k) as u64 * self.act.size_bytes())?;
        let _t = crate::base::timing::span("load: int8 weights made on the GPU");
        let mut lin = load_int8(self.rt, name, n, k, None, self.opts)?;
        if let Linear::Int8(l) = &mut lin {
            ops::synth_int8(self.rt, &mut l.cb, &mut l.scb, fill)?;
        }
        Ok(lin)
    }

    /// `f` with the tensor it reads cut to `slice` (a tensor-parallel shard).
    pub(crate) fn sliced<R>(
        &mut self,
        slice: Slice,
        f: impl FnOnce(&mut Self) -> Result<R>,
    ) -> Result<R> {
        self.slice = Some(slice);
        let r = f(self);
        self.slice = None;
        r
    }

    /// A column- or row-parallel linear layer's shard (`slice` of the `[n, k]` weight).
    pub(crate) fn linear_slice(&mut self, name: &str, slice: Slice) -> Result<Linear> {
        let [n, k] = slice.shape();
        self.sliced(slice, |ld| ld.linear(name, n, k))
    }

    /// This rank's rows `first..first + len` of a vocabulary table padded with zero rows to
    /// `padded_rows` (vLLM's VocabParallelEmbedding / ParallelLMHead shard,
    /// vocab_parallel_embedding.py L201-238).
    pub(crate) fn vocab_shard(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        padded_rows: usize,
        first: usize,
        len: usize,
    ) -> Result<Tensor> {
        if first == 0 && len == padded_rows {
            return self.dense_padded(name, rows, cols, padded_rows);
        }
        if let Some(mut f) = self.device_fill(name, &[len, cols]) {
            f.elem0 = (first * cols) as u64;
            f.valid_rows = rows.saturating_sub(first) as u64;
            return self.made_on_device(name, &[name], &[len, cols], &[f]);
        }
        let d = self.read(name, &[rows, cols])?.map(|mut d| {
            d.resize(padded_rows * cols, 0.0);
            d[first * cols..(first + len) * cols].to_vec()
        });
        upload(self.rt, name, &[len, cols], self.act, d)
    }

    /// This rank's elements `first..first + len` of a vocabulary bias `[rows]` zero-padded to
    /// `padded_rows`, as the table it goes with (Phi's `ParallelLMHead(bias=True)`: its bias
    /// has the padded partition's rows, vocab_parallel_embedding.py L539-551 at 0.19).
    pub(crate) fn vocab_bias_shard(
        &mut self,
        name: &str,
        rows: usize,
        padded_rows: usize,
        (first, len): (usize, usize),
    ) -> Result<Tensor> {
        let d = self.read(name, &[rows])?.map(|mut d| {
            d.resize(padded_rows, 0.0);
            d[first..first + len].to_vec()
        });
        upload(self.rt, name, &[len], self.act, d)
    }

    pub(crate) fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        if let Some(f) = self.device_fill(name, shape) {
            return self.made_on_device(name, &[name], shape, &[f]);
        }
        if let Some(b) = self.stored_as_is(name, shape) {
            return self.copied_as_is(name, &[(name, b)], shape);
        }
        let d = self.read(name, shape)?;
        upload(self.rt, name, shape, self.act, d)
    }

    /// Rows of a tensor of any rank (`full`, rows along its first dimension) taken in runs
    /// `parts` (first row, rows) into one parameter of `shape` in `dtype`: the Gated
    /// DeltaNet's `conv1d.weight` `[C, 1, K]` cut into this rank's q, k and v channels
    /// (`mamba_v2_sharded_weight_loader`, 0.10.2 layers/mamba/mamba_mixer2.py), its `A_log`
    /// (f32) and `dt_bias` cut to this rank's heads (`sharded_weight_loader(0)`).
    pub(crate) fn dense_row_parts(
        &mut self,
        name: &str,
        full: &[usize],
        parts: &[(usize, usize)],
        (shape, dtype): (&[usize], DType),
        out_name: &str,
    ) -> Result<Tensor> {
        let row: usize = full.iter().skip(1).product();
        let d = self.read(name, full)?.map(|d| {
            parts
                .iter()
                .flat_map(|&(first, len)| d[first * row..(first + len) * row].to_vec())
                .collect::<Vec<f32>>()
        });
        upload(self.rt, out_name, shape, dtype, d)
    }

    /// A whole tensor kept in `dtype` whatever the activation dtype (DeepSeek's
    /// `e_score_correction_bias`, an f32 `nn.Parameter` in vLLM).
    pub(crate) fn dense_as(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let d = self.read(name, shape)?;
        upload(self.rt, name, shape, dtype, d)
    }

    /// A `[rows, cols]` table stored as `[padded_rows, cols]` with zero rows after it
    /// (vLLM's VocabParallelEmbedding and ParallelLMHead pad the vocabulary to 64 and
    /// zero-fill the padding, vocab_parallel_embedding.py L16, L47-50).
    pub(crate) fn dense_padded(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        padded_rows: usize,
    ) -> Result<Tensor> {
        if let Some(mut f) = self.device_fill(name, &[padded_rows, cols]) {
            f.valid_rows = rows as u64;
            return self.made_on_device(name, &[name], &[padded_rows, cols], &[f]);
        }
        if padded_rows == rows {
            if let Some(b) = self.stored_as_is(name, &[rows, cols]) {
                return self.copied_as_is(name, &[(name, b)], &[rows, cols]);
            }
        }
        let d = self.read(name, &[rows, cols])?.map(|mut d| {
            d.resize(padded_rows * cols, 0.0);
            d
        });
        upload(self.rt, name, &[padded_rows, cols], self.act, d)
    }

    /// 1-D tensors read one after another into one (a fused bias such as `qkv_proj.bias`):
    /// elements `parts[i].0..+parts[i].1` of each, a tensor-parallel rank's share (the whole
    /// with one GPU).
    pub(crate) fn dense_concat_parts(
        &mut self,
        names: &[String],
        lens: &[usize],
        parts: &[(usize, usize)],
        fused_name: &str,
    ) -> Result<Tensor> {
        let mut all: Option<Vec<f32>> = None;
        for (n, (&len, &(first, take))) in names.iter().zip(lens.iter().zip(parts)) {
            if let Some(d) = self.read(n, &[len])? {
                all.get_or_insert_with(Vec::new)
                    .extend_from_slice(&d[first..first + take]);
            }
        }
        let total = parts.iter().map(|p| p.1).sum::<usize>();
        upload(self.rt, fused_name, &[total], self.act, all)
    }

    /// Checkpoint tensors read one after another, each cut to its slice (a tensor-parallel
    /// rank's share), into one 16-bit parameter of `shape` (`FusedMoE`'s `w13_weight` and
    /// `w2_weight`, filled expert by expert).
    pub(crate) fn stacked(
        &mut self,
        parts: &[(String, Slice)],
        shape: &[usize],
        name: &str,
    ) -> Result<Tensor> {
        // A preset's experts made on the GPU, a checkpoint's 16-bit experts copied as stored:
        // the same single allocation as the host path, no host values.
        let fills: Option<Vec<SynthFill>> = parts
            .iter()
            .scan(0u64, |offset, (n, sl)| {
                let f = self
                    .sliced(*sl, |ld| Ok(ld.device_fill(n, &sl.shape())))
                    .ok()
                    .flatten()
                    .map(|mut f| {
                        f.offset = *offset;
                        f
                    });
                *offset += sl.shape().iter().product::<usize>() as u64;
                Some(f)
            })
            .collect();
        if let Some(fills) = fills.filter(|f| !f.is_empty()) {
            let ns: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
            return self.made_on_device(name, &ns, shape, &fills);
        }
        let stored: Option<Vec<(&str, &[u8])>> = parts
            .iter()
            .map(|(n, sl)| {
                self.sliced(*sl, |ld| Ok(ld.stored_as_is(n, &sl.shape())))
                    .ok()
                    .flatten()
                    .map(|b| (n.as_str(), b))
            })
            .collect();
        if let Some(stored) = stored.filter(|s| !s.is_empty()) {
            return self.copied_as_is(name, &stored, shape);
        }
        let mut all: Option<Vec<f32>> = None;
        for (n, sl) in parts {
            if let Some(d) = self.sliced(*sl, |ld| ld.read(n, &sl.shape()))? {
                all.get_or_insert_with(|| Vec::with_capacity(shape.iter().product()))
                    .extend_from_slice(&d);
            }
        }
        upload(self.rt, name, shape, self.act, all)
    }

    /// The runtime the weights load on.
    pub(crate) fn runtime(&self) -> &'a Runtime {
        self.rt
    }

    /// `--quant fp8` on a 16-bit checkpoint: vLLM quantizes each layer as it loads.
    pub(crate) fn fp8_online(&self) -> bool {
        self.opts.quant == Quant::Fp8 && self.src.stored_fp8().is_none()
    }

    /// The block size of a block-wise fp8 checkpoint.
    pub(crate) fn fp8_block(&self) -> Option<BlockSize> {
        self.src.stored_fp8().and_then(|f| f.block)
    }

    /// Block-wise fp8 experts as `Fp8MoEMethod.create_weights` makes them (`block_quant`,
    /// fp8.py L609-718 at 0.19.0; 0.11.0 L496-590 the same order): `w13_weight [E, 2·I, H]`
    /// and `w2_weight [E, H, I]` in float8_e4m3fn (`torch.empty`), then
    /// `w13_weight_scale_inv [E, 2·⌈I/bn⌉, ⌈H/bk⌉]` and `w2_weight_scale_inv [E, ⌈H/bn⌉,
    /// ⌈I/bk⌉]` in f32 (`torch.ones`); the checkpoint's experts are copied in and
    /// `process_weights_after_loading` re-wraps them (TRITON backend: nothing converted,
    /// oracle/fp8.py L457-467 at 0.19.0; 0.11.0 fp8.py L612-660 likewise without DeepGEMM).
    /// `I` is this rank's share of the expert width; vLLM refuses one that is not a
    /// multiple of `bn` (L632-643). Dry only: the codes are not read. Returns
    /// `[w13, w2, w13_scale_inv, w2_scale_inv]`.
    pub(crate) fn experts_fp8_block(
        &mut self,
        (w13_parts, w2_parts): (&[NamedSlice], &[NamedSlice]),
        (e, i, h): (usize, usize, usize),
        prefix: &str,
        block: BlockSize,
    ) -> Result<[Tensor; 4]> {
        let tp = self.rt.tp().map_or(1, |t| t.size);
        // From 0.29 a rank's width the checkpoint's blocks do not divide gets a finer block
        // for its scales, `gcd(bn, bk, I, H)` when at least 32 (`refine_fp8_moe_block_shape`,
        // oracle/fp8.py 0.29.0 L272-304; fp8.py L484-515 and L565-583): the loader upsamples
        // the checkpoint's scales to it on the host (`repeat_interleave`,
        // routed_experts.py L835-848), and only Triton's experts take it.
        let fits = i.is_multiple_of(block.n) && (tp == 1 || i.is_multiple_of(block.k));
        let refined = gcd(gcd(block.n, block.k), gcd(i, h));
        let block = if !fits && self.opts.marlin.minor >= 29 && refined >= 32 {
            BlockSize {
                n: refined,
                k: refined,
            }
        } else {
            block
        };
        if !i.is_multiple_of(block.n) {
            return Err(Error::model(
                self.src.origin(),
                format!(
                    "{prefix}: vLLM refuses it: \"The output_size of gate's and up's weight = {i} is not divisible by weight quantization block_n = {}.\" (Fp8MoEMethod.create_weights, fp8.py L632-638 at 0.19.0, L507-512 at 0.11.0)",
                    block.n
                ),
            ));
        }
        if tp > 1 && !i.is_multiple_of(block.k) {
            return Err(Error::model(
                self.src.origin(),
                format!(
                    "{prefix}: vLLM refuses it: \"The input_size of down's weight = {i} is not divisible by weight quantization block_k = {}.\" (fp8.py L639-644 at 0.19.0)",
                    block.k
                ),
            ));
        }
        if self.needs_data {
            return Err(crate::engine::ops_moe::fp8_block_experts_refused(prefix));
        }
        let rt = self.rt;
        let t =
            |name: String, shape: &[usize], dt: DType| rt.tensor(name, Category::Weight, shape, dt);
        let w13 = t(
            format!("{prefix}.w13_weight"),
            &[e, 2 * i, h],
            DType::F8E4M3,
        )?;
        let w2 = t(format!("{prefix}.w2_weight"), &[e, h, i], DType::F8E4M3)?;
        let (ib_n, ib_k) = (i.div_ceil(block.n), i.div_ceil(block.k));
        let (hb_n, hb_k) = (h.div_ceil(block.n), h.div_ceil(block.k));
        let s13 = t(
            format!("{prefix}.w13_weight_scale_inv"),
            &[e, 2 * ib_n, hb_k],
            DType::F32,
        )?;
        let s2 = t(
            format!("{prefix}.w2_weight_scale_inv"),
            &[e, hb_n, ib_k],
            DType::F32,
        )?;
        for (name, sl) in w13_parts.iter().chain(w2_parts) {
            let [n, k] = sl.shape();
            self.tick(name, (n * k) as u64)?;
        }
        Ok([w13, w2, s13, s2])
    }

    /// A stacked parameter (vLLM's `qkv_proj`, `gate_up_proj`, filled through
    /// `stacked_params_mapping`): one `[Σ nᵢ, k]` weight when it stays 16-bit, the checkpoint's
    /// shards read in order into it; one quantized linear per shard otherwise.
    /// Part i is rows `parts[i].0..+parts[i].1` of the checkpoint's `[rows[i], k]` tensor: a
    /// tensor-parallel rank's share (vLLM's QKVParallelLinear and MergedColumnParallelLinear
    /// weight loaders, linear.py L430-560, L640-800), the whole with one GPU.
    pub(crate) fn fused_parts(
        &mut self,
        names: &[String],
        full_rows: &[usize],
        parts: &[(usize, usize)],
        k: usize,
        fused_name: &str,
    ) -> Result<FusedLinear> {
        let rows: Vec<usize> = parts.iter().map(|p| p.1).collect();
        let rows = &rows[..];
        // A tower kept in 16 bits reads none of the checkpoint's quantized formats.
        let formats = !self.keep_16bit;
        if let (true, Some(block)) = (formats, self.src.stored_fp8().and_then(|f| f.block)) {
            let slices = self.fp8_whole_slices(names, full_rows, parts, k)?;
            let linear = Box::new(self.fp8_block_stored(names, &slices, k, fused_name, block)?);
            return Ok(FusedLinear::Fp8Block {
                linear,
                rows: rows.to_vec(),
            });
        }
        if formats && self.src.stored_fp8().is_some() {
            if names.iter().skip(1).any(|n| *n == names[0]) {
                return Err(Error::model(
                    self.src.origin(),
                    format!("tensor {}: an fp8 checkpoint that stores a stacked layer fused (one weight_scale for its shards) is not read yet", names[0]),
                ));
            }
            let slices: Vec<Slice> = full_rows
                .iter()
                .zip(parts)
                .map(|(&full, &(first, len))| Slice::rows(full, k, first, len))
                .collect();
            let linear = Box::new(self.fp8_stored(names, &slices, k, fused_name)?);
            return Ok(FusedLinear::Fp8 {
                linear,
                rows: rows.to_vec(),
            });
        }
        if let (Some(scheme), true) = (
            self.src.sparse24(),
            formats && names.iter().all(|n| super::is_projection(n)),
        ) {
            let slices: Vec<Slice> = full_rows
                .iter()
                .zip(parts)
                .map(|(&full, &(first, len))| Slice::rows(full, k, first, len))
                .collect();
            let linear = self.sparse24(scheme, names, &slices, fused_name)?;
            return Ok(FusedLinear::Sparse24 {
                linear: Box::new(linear),
                rows: rows.to_vec(),
            });
        }
        if let (Some(flavor), true) = (
            self.src.nvfp4(),
            formats && names.iter().all(|n| super::is_projection(n)),
        ) {
            let slices: Vec<Slice> = full_rows
                .iter()
                .zip(parts)
                .map(|(&full, &(first, len))| Slice::rows(full, k, first, len))
                .collect();
            let linear = self.nvfp4(flavor, names, &slices, fused_name)?;
            return Ok(FusedLinear::Nvfp4 {
                linear: Box::new(linear),
                rows: rows.to_vec(),
            });
        }
        if let (Some(fmt), true) = (
            self.src.packed4(),
            formats && names.iter().all(|n| super::is_projection(n)),
        ) {
            if names.windows(2).any(|w| w[0] == w[1]) {
                return Err(packed4_unsplit(self.src, &names[0]));
            }
            let slices: Vec<Slice> = full_rows
                .iter()
                .zip(parts)
                .map(|(&full, &(first, len))| Slice::rows(full, k, first, len))
                .collect();
            let linear = self.packed4(fmt, names, &slices, fused_name)?;
            return Ok(FusedLinear::Marlin {
                linear: Box::new(linear),
                rows: rows.to_vec(),
            });
        }
        // Shards of one vLLM module: skipped together or not at all.
        let skipped = names.iter().any(|n| self.src.bnb_skipped(n));
        let quantized = !skipped
            && (names.iter().any(|n| {
                self.src.bnb4(n).is_some()
                    || (self.opts.quant == Quant::Int8 && self.src.is_int8(n))
            }) || !(self.opts.quant.unquantized() || self.opts.quant == Quant::Fp8));
        if quantized {
            let shards = names
                .iter()
                .zip(full_rows.iter().zip(parts))
                .map(|(n, (&full, &(first, len)))| {
                    self.linear_slice(n, Slice::rows(full, k, first, len))
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(FusedLinear::Shards(shards));
        }
        let total: usize = rows.iter().sum();
        let fills: Option<Vec<SynthFill>> = names
            .iter()
            .zip(full_rows.iter().zip(parts))
            .scan(0u64, |offset, (n, (&full, &(first, len)))| {
                let f = self
                    .sliced(Slice::rows(full, k, first, len), |ld| {
                        Ok(ld.device_fill(n, &[len, k]))
                    })
                    .ok()
                    .flatten()
                    .map(|mut f| {
                        f.offset = *offset;
                        f
                    });
                *offset += (len * k) as u64;
                Some(f)
            })
            .collect();
        if let Some(fills) = fills {
            let ns: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
            let t = self.made_on_device(fused_name, &ns, &[total, k], &fills)?;
            return Ok(FusedLinear::Dense {
                weight: t,
                rows: rows.to_vec(),
            });
        }
        let stored: Option<Vec<(&str, &[u8])>> = names
            .iter()
            .zip(full_rows.iter().zip(parts))
            .map(|(n, (&full, &(first, len)))| {
                self.sliced(Slice::rows(full, k, first, len), |ld| {
                    Ok(ld.stored_as_is(n, &[len, k]))
                })
                .ok()
                .flatten()
                .map(|b| (n.as_str(), b))
            })
            .collect();
        if let Some(parts) = stored {
            let t = self.copied_as_is(fused_name, &parts, &[total, k])?;
            return Ok(FusedLinear::Dense {
                weight: t,
                rows: rows.to_vec(),
            });
        }
        if self.rt.backend() == Backend::Cuda {
            // Each shard converted straight into its rows of the GPU tensor: no host copy of
            // the whole (concatenating [Σ nᵢ, k] f32 on the host cost page faults and copies of
            // every layer's gate_up, 10 s of a Llama-3-8B load).
            let span = crate::base::timing::span("load: device allocation");
            let mut t = self
                .rt
                .tensor(fused_name, Category::Weight, &[total, k], self.act)?;
            drop(span);
            let mut offset = 0usize;
            for (n, (&full, &(first, len))) in names.iter().zip(full_rows.iter().zip(parts)) {
                let d =
                    self.sliced(Slice::rows(full, k, first, len), |ld| ld.read(n, &[len, k]))?;
                if let Some(d) = d {
                    let _t = crate::base::timing::span("load: upload (all of it)");
                    ops::upload_f32_at(self.rt, &mut t, offset, &d)?;
                    crate::base::background::drop_later(d);
                }
                offset += len * k;
            }
            return Ok(FusedLinear::Dense {
                weight: t,
                rows: rows.to_vec(),
            });
        }
        let mut all: Option<Vec<f32>> = None;
        for (n, (&full, &(first, len))) in names.iter().zip(full_rows.iter().zip(parts)) {
            let d = self.sliced(Slice::rows(full, k, first, len), |ld| ld.read(n, &[len, k]))?;
            if let Some(d) = d {
                all.get_or_insert_with(Vec::new).extend(d);
            }
        }
        Ok(FusedLinear::Dense {
            weight: upload(self.rt, fused_name, &[total, k], self.act, all)?,
            rows: rows.to_vec(),
        })
    }

    /// Experts stored fused over all of them as `[E, A, B]` (`x · W` layout: Llama 4's
    /// `experts.gate_up_proj [E, H, 2I]` and `experts.down_proj [E, I, H]`), made into
    /// `FusedMoE`'s `[E, Σ rows, cols]` as vLLM's loader does (transposed, llama4.py 0.19
    /// L441-450, then each shard's rows narrowed): per expert, the transposed `[B, A]`'s rows
    /// `b_parts` (this rank's gate rows, then its up rows) and columns `a_part`.
    pub(crate) fn experts_transposed(
        &mut self,
        name: &str,
        [e, a, b]: [usize; 3],
        (b_parts, a_part): (&[(usize, usize)], (usize, usize)),
        experts: std::ops::Range<usize>,
        out_name: &str,
    ) -> Result<Tensor> {
        let rows: usize = b_parts.iter().map(|p| p.1).sum();
        let shape = [experts.len(), rows, a_part.1];
        let d = self.read(name, &[e, a, b])?.map(|d| {
            let mut out = Vec::with_capacity(experts.len() * rows * a_part.1);
            for ex in experts.clone() {
                let w = &d[ex * a * b..(ex + 1) * a * b];
                for &(first, len) in b_parts {
                    for r in first..first + len {
                        out.extend((a_part.0..a_part.0 + a_part.1).map(|c| w[c * b + r]));
                    }
                }
            }
            out
        });
        upload(self.rt, out_name, &shape, self.act, d)
    }

    pub(crate) fn linear(&mut self, name: &str, n: usize, k: usize) -> Result<Linear> {
        self.linear_as(name, n, k, true)
    }

    /// A buffer the model makes on the device while it is built, not read from the
    /// checkpoint (vLLM's `register_buffer` under the model's device context): counted with
    /// the weights.
    pub(crate) fn buffer(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.rt.tensor(name, Category::Weight, shape, dtype)
    }

    /// A linear layer's weight: as stored when the checkpoint holds it quantized
    /// (bitsandbytes 4-bit whatever `--quant` says, as vLLM loads it; LLM.int8 under
    /// `--quant int8`), else 16-bit or quantized in flight when `quantize` is set (vLLM's
    /// bitsandbytes target modules).
    pub(crate) fn linear_as(
        &mut self,
        name: &str,
        n: usize,
        k: usize,
        quantize: bool,
    ) -> Result<Linear> {
        // A bitsandbytes checkpoint's skip modules load 16-bit (vLLM's
        // UnquantizedLinearMethod for them: bitsandbytes.py L164 at 0.19.0).
        let quantize = quantize && !self.keep_16bit && !self.src.bnb_skipped(name);
        let slice = self.slice.filter(|s| !s.is_whole());
        if let (true, Some(block)) = (quantize, self.src.stored_fp8().and_then(|f| f.block)) {
            let sl = self.slice.unwrap_or(Slice::whole(n, k));
            let lin = self.fp8_block_stored(&[name.to_string()], &[sl], k, name, block)?;
            return Ok(Linear::Fp8Block(Box::new(lin)));
        }
        if quantize && self.src.stored_fp8().is_some() {
            let sl = self.slice.unwrap_or(Slice::whole(n, k));
            let lin = self.fp8_stored(&[name.to_string()], &[sl], k, name)?;
            return Ok(Linear::Fp8(lin));
        }
        if let (Some(scheme), true) = (self.src.sparse24(), quantize && super::is_projection(name))
        {
            let sl = slice.unwrap_or(Slice::whole(n, k));
            let l = self.sparse24(scheme, &[name.to_string()], &[sl], name)?;
            return Ok(Linear::Sparse24(Box::new(l)));
        }
        if let (Some(flavor), true) = (self.src.nvfp4(), quantize && super::is_projection(name)) {
            let sl = slice.unwrap_or(Slice::whole(n, k));
            let l = self.nvfp4(flavor, &[name.to_string()], &[sl], name)?;
            return Ok(Linear::Nvfp4(Box::new(l)));
        }
        if let (Some(fmt), true) = (self.src.packed4(), quantize && super::is_projection(name)) {
            let sl = slice.unwrap_or(Slice::whole(n, k));
            let l = self.packed4(fmt, &[name.to_string()], &[sl], name)?;
            return Ok(Linear::Marlin(Box::new(l)));
        }
        if let Some(meta) = self.src.bnb4(name) {
            if slice.is_some() {
                return Err(Error::model(
                    self.src.origin(),
                    format!(
                        "tensor {name}: a pre-quantized bitsandbytes 4-bit checkpoint cannot be split across tensor-parallel ranks (its packed codes and block scales do not cut along rows and columns); use --tp 1, or the unquantized checkpoint with --quant nf4"
                    ),
                ));
            }
            return self.bnb4_stored(name, n, k, &meta);
        }
        // A bitsandbytes 8-bit checkpoint loaded as int8 keeps its CB and SCB as stored.
        if self.opts.quant == Quant::Int8 && self.src.is_int8(name) {
            self.rt.check_cancel()?;
            self.rt.progress(Progress::Load {
                index: self.index,
                count: self.count,
                tensor: name.to_string(),
                bytes: (n * k) as u64 + 4 * n as u64,
            });
            self.index += 1;
            let pre = if self.needs_data {
                let t = std::time::Instant::now();
                // A shard cuts CB like any weight; SCB (one scale per output row) follows the
                // rows and is whole for a column cut.
                let d = match slice {
                    Some(sl) => {
                        let (cb, scb) = self.src.read_int8(name, &sl.full)?;
                        (sl.cut(&cb), scb[sl.rows.0..sl.rows.0 + sl.rows.1].to_vec())
                    }
                    None => self.src.read_int8(name, &[n, k])?,
                };
                self.stats.read_seconds += t.elapsed().as_secs_f64();
                self.stats.source_bytes += self.src.stored_bytes(name);
                Some(d)
            } else {
                None
            };
            return load_int8(self.rt, name, n, k, pre, self.opts);
        }
        // fp8 in flight loads 16-bit first: vLLM quantizes after every weight is loaded
        // (`quantize_fp8_after_loading`).
        if !quantize || self.opts.quant.unquantized() || self.opts.quant == Quant::Fp8 {
            if let Some(f) = self.device_fill(name, &[n, k]) {
                return Ok(Linear::Dense(self.made_on_device(
                    name,
                    &[name],
                    &[n, k],
                    &[f],
                )?));
            }
            if let Some(b) = self.stored_as_is(name, &[n, k]) {
                return Ok(Linear::Dense(self.copied_as_is(
                    name,
                    &[(name, b)],
                    &[n, k],
                )?));
            }
            let d = self.read(name, &[n, k])?;
            return Ok(Linear::Dense(upload(self.rt, name, &[n, k], self.act, d)?));
        }
        if matches!(self.opts.quant, Quant::Nf4 | Quant::Fp4) {
            return self.bnb4_in_flight(name, n, k);
        }
        if self.opts.quant == Quant::Int8 {
            if let Some(f) = self.device_fill(name, &[n, k]) {
                return self.int8_made_on_device(name, n, k, &f);
            }
        }
        let d = self.read(name, &[n, k])?;
        load_linear(self.rt, name, n, k, d, self.opts, self.act, &mut self.stats)
    }

    /// A linear layer of a pre-quantized fp8 checkpoint as vLLM 0.6.4's `Fp8LinearMethod.
    /// create_weights` makes it (fp8.py L137-177, `is_checkpoint_fp8_serialized`): the
    /// float8_e4m3fn weight `[Σ nᵢ, k]`, then the `[shards]` f32 `weight_scale` and, under
    /// the static scheme, the `[shards]` f32 `input_scale` (both filled with f32's lowest,
    /// then each shard's scale written at its index by `PerTensorScaleParameter`,
    /// parameter.py L232-250); the checkpoint's codes are copied in shard by shard
    /// (`stacked_params_mapping`, llama.py L353-410). Until `fp8_stored_after_loading` the
    /// returned layer holds the `[shards]` scales (their values in the tensors' host storage
    /// in compute mode). A tensor-parallel cut is refused: vramscope does not shard it yet.
    fn fp8_stored(
        &mut self,
        names: &[String],
        slices: &[Slice],
        k: usize,
        fused_name: &str,
    ) -> Result<Fp8Linear> {
        let f = self.src.stored_fp8().expect("an fp8 checkpoint");
        if let Some(sl) = slices
            .iter()
            .chain(self.slice.as_ref())
            .find(|s| !s.is_whole())
        {
            return Err(Error::model(
                self.src.origin(),
                format!(
                    "tensor {}: a tensor-parallel shard ({:?} of {:?}) of a pre-quantized fp8 checkpoint is not modelled yet; run it with --tp 1",
                    names[0],
                    sl.shape(),
                    sl.full
                ),
            ));
        }
        let rt = self.rt;
        // A compressed-tensors checkpoint names its activations' scheme: dynamic per token
        // (`strategy: token`) is what vLLM's CompressedTensorsW8A8Fp8 runs whatever the
        // release (`act_q_group_shape` PER_TOKEN).
        if f.compressed_tensors && !f.static_activations {
            rt.set_fp8_act_per_token(true);
        }
        let rows: Vec<usize> = slices.iter().map(|s| s.full[0]).collect();
        let total: usize = rows.iter().sum();
        let base = fused_name.trim_end_matches(".weight");
        let shards = rows.len();
        // compressed-tensors int8 w8a8: `ModelWeightParameter(torch.empty([n, k], int8))`
        // (compressed_tensors_w8a8_int8.py L57-65 at 0.11.0); no CUDA kernel here.
        if f.int8 && rt.backend() == Backend::Cuda {
            return Err(Error::Request(format!(
                "{fused_name}: compressed-tensors int8 w8a8 (CUTLASS int8 scaled_mm) has no CUDA kernel here yet; run it on a simulated device (sim:PRESET)"
            )));
        }
        let code_dtype = if f.int8 { DType::I8 } else { DType::F8E4M3 };
        let mut qweight = rt.tensor(fused_name, Category::Weight, &[total, k], code_dtype)?;
        // `PerTensorScaleParameter` (one scale a shard), or compressed-tensors' channel-wise
        // `ChannelQuantScaleParameter` (`[rows, 1]`).
        let scale_shape: &[usize] = if f.channel { &[total, 1] } else { &[shards] };
        let mut weight_scale = rt.tensor(
            format!("{base}.weight_scale"),
            Category::Weight,
            scale_shape,
            DType::F32,
        )?;
        let mut input_scale = if f.static_activations {
            Some(rt.tensor(
                format!("{base}.input_scale"),
                Category::Weight,
                &[shards],
                DType::F32,
            )?)
        } else {
            None
        };
        let mut r0 = 0;
        let (mut ws_all, mut is_all) = (Vec::new(), Vec::new());
        for (name, &n) in names.iter().zip(&rows) {
            self.tick(name, self.src.stored_bytes(name))?;
            if self.needs_data {
                let t = std::time::Instant::now();
                let (codes, ws, is) = self.src.read_fp8(name, &[n, k])?;
                if rt.backend() == Backend::Cuda {
                    let mut rows_part = qweight.part(&qweight.name, r0 * k, &[n, k]);
                    ops::upload_u8(rt, &mut rows_part, &codes)?;
                } else if f.int8 {
                    for (d, &c) in qweight.i8_mut()[r0 * k..(r0 + n) * k]
                        .iter_mut()
                        .zip(&codes)
                    {
                        *d = c as i8;
                    }
                } else {
                    qweight.u8_mut()[r0 * k..(r0 + n) * k].copy_from_slice(&codes);
                }
                ws_all.extend(ws);
                is_all.extend(is);
                self.stats.read_seconds += t.elapsed().as_secs_f64();
                self.stats.source_bytes += self.src.stored_bytes(name);
            }
            if !self.needs_data && f.modelopt {
                ws_all.extend(self.src.read_fp8_weight_scale(name)?);
            }
            r0 += n;
        }
        if self.needs_data {
            // Every shard's scale written at its index (`PerTensorScaleParameter`).
            let put = |t: &mut Tensor, v: &[f32]| match rt.backend() {
                Backend::Cuda => ops::upload_f32(rt, t, v),
                _ => {
                    t.f32_mut().copy_from_slice(v);
                    Ok(())
                }
            };
            put(&mut weight_scale, &ws_all)?;
            if let Some(t) = &mut input_scale {
                put(t, &is_all)?;
            }
        }
        Ok(Fp8Linear {
            qweight,
            weight_scale,
            weight_scale_value: 0.0,
            input_scale: input_scale.map(|t| (t, is_all.iter().copied().fold(0.0, f32::max))),
            out_features: total,
            in_features: k,
            per_channel: f.channel,
            int8: f.int8,
            stored_scales: ws_all,
        })
    }

    /// The shards of a stacked block-wise fp8 layer, each read whole: one stored tensor per
    /// shard (a checkpoint storing the stack fused is refused by name).
    fn fp8_whole_slices(
        &self,
        names: &[String],
        full_rows: &[usize],
        parts: &[(usize, usize)],
        k: usize,
    ) -> Result<Vec<Slice>> {
        if names.iter().skip(1).any(|n| *n == names[0]) {
            return Err(Error::model(
                self.src.origin(),
                format!("tensor {}: a block-wise fp8 checkpoint that stores a stacked layer fused is not read yet", names[0]),
            ));
        }
        Ok(full_rows
            .iter()
            .zip(parts)
            .map(|(&full, &(first, len))| Slice::rows(full, k, first, len))
            .collect())
    }

    /// A linear layer of a block-wise fp8 checkpoint as vLLM 0.8.5's `Fp8LinearMethod.
    /// create_weights` makes it (fp8.py L191-291, `block_quant`): on the first fp8 linear the
    /// process-wide device identity (`maybe_create_device_identity`, L201: `torch.ones(1)`
    /// f32 on the device), then the float8_e4m3fn weight `[Σ nᵢ, k]` and the f32
    /// `weight_scale_inv` `[ceil(Σ nᵢ / bn), ceil(k / bk)]` (L266-279; filled with f32's
    /// lowest in place); no `input_scale` (dynamic only). The checkpoint's shards are copied
    /// in by the weight loader, each shard's scale rows at `ceil(offset / bn)`
    /// (linear.py L760-773, L933-939). `process_weights_after_loading` then re-wraps both as
    /// plain parameters (fp8.py L306-323): nothing more is allocated. 0.11.0 makes the
    /// identity too (fp8.py L265); 0.15.1 and 0.19.0 do not (their `create_weights` has no
    /// `maybe_create_device_identity`), the runtime's `Fp8BlockPath::Op`.
    fn fp8_block_stored(
        &mut self,
        names: &[String],
        slices: &[Slice],
        k: usize,
        fused_name: &str,
        block: BlockSize,
    ) -> Result<Fp8BlockLinear> {
        if let Some(sl) = slices
            .iter()
            .chain(self.slice.as_ref())
            .find(|s| !s.is_whole() && self.needs_data)
        {
            return Err(Error::model(
                self.src.origin(),
                format!(
                    "tensor {}: a tensor-parallel shard ({:?} of {:?}) of a block-wise fp8 checkpoint is not modelled yet; run it with --tp 1",
                    names[0],
                    sl.shape(),
                    sl.full
                ),
            ));
        }
        let rt = self.rt;
        if rt.backend() == Backend::Cuda {
            return Err(crate::quant::fp8_block::cuda_refused());
        }
        let identity = !matches!(
            rt.fp8_block_path(),
            crate::engine::runtime::Fp8BlockPath::Op { .. }
                | crate::engine::runtime::Fp8BlockPath::DeepGemm { .. }
        );
        if identity && self.fp8_identity.is_none() {
            let mut one = rt.tensor(
                "fp8.TORCH_DEVICE_IDENTITY",
                Category::Weight,
                &[1],
                DType::F32,
            )?;
            if rt.backend() == Backend::Cpu {
                one.f32_mut()[0] = 1.0;
            }
            self.fp8_identity = Some(one);
        }
        // A tensor-parallel shard (dry): vLLM's `validate_fp8_block_shape` (utils/fp8_utils.py
        // L1425-1473 at 0.19.0, L750-782 at 0.11.0) wants a row-parallel rank's inputs a
        // multiple of block_k and a column-parallel rank's outputs a multiple of block_n;
        // the shard's grid is then its own blocks.
        for sl in slices.iter().filter(|s| !s.is_whole()) {
            let [n, kk] = sl.shape();
            let (what, size, b) = if kk != sl.full[1] {
                ("input_size_per_partition", kk, block.k)
            } else {
                ("output_partition_size", n, block.n)
            };
            if !size.is_multiple_of(b) {
                return Err(Error::model(
                    self.src.origin(),
                    format!(
                        "tensor {}: vLLM refuses it: \"Weight {what} = {size} is not divisible by weight quantization block_{} = {b}.\" (validate_fp8_block_shape, utils/fp8_utils.py L1425-1473 at 0.19.0)",
                        names[0],
                        if what.starts_with("input") { "k" } else { "n" }
                    ),
                ));
            }
        }
        let rows: Vec<usize> = slices.iter().map(|s| s.shape()[0]).collect();
        let total: usize = rows.iter().sum();
        let base = fused_name.trim_end_matches(".weight");
        let mut qweight = rt.tensor(fused_name, Category::Weight, &[total, k], DType::F8E4M3)?;
        let [nb, kb] = block.grid(total, k);
        let mut scale_inv = rt.tensor(
            format!("{base}.weight_scale_inv"),
            Category::Weight,
            &[nb, kb],
            DType::F32,
        )?;
        let mut r0 = 0;
        for (name, &n) in names.iter().zip(&rows) {
            self.tick(name, self.src.stored_bytes(name))?;
            if self.needs_data {
                let t = std::time::Instant::now();
                let (codes, scales) = self.src.read_fp8_block(name, &[n, k])?;
                qweight.u8_mut()[r0 * k..(r0 + n) * k].copy_from_slice(&codes);
                let s0 = r0.div_ceil(block.n) * kb;
                scale_inv.f32_mut()[s0..s0 + scales.len()].copy_from_slice(&scales);
                self.stats.read_seconds += t.elapsed().as_secs_f64();
                self.stats.source_bytes += self.src.stored_bytes(name);
            }
            r0 += n;
        }
        Ok(Fp8BlockLinear {
            qweight,
            scale_inv,
            block,
            out_features: total,
            in_features: k,
            scales_transposed: false,
            act: self.act,
            ue8m0: false,
        })
    }

    /// An AWQ / GPTQ linear (one layer, or the shards `names` of a stacked one) as
    /// `create_weights` allocates it and the weight loader fills it: each shard's stored
    /// tensors, narrowed to this rank's `slices` (rows: outputs, cols: inputs, as the
    /// `[n, k]` of the layer), in one set of parameters (`MarlinLinear::load`). A cut must
    /// fall on whole 4-bit words and quantization groups, as vLLM's packed and grouped
    /// parameters narrow them; GPTQ's act-order across ranks is refused.
    fn packed4(
        &mut self,
        fmt: marlin::Format,
        names: &[String],
        slices: &[Slice],
        fused_name: &str,
    ) -> Result<MarlinLinear> {
        let k = slices.first().map_or(0, |s| s.cols.1);
        let mut parts = Vec::with_capacity(names.len());
        let mut ns = Vec::with_capacity(names.len());
        for (name, sl) in names.iter().zip(slices) {
            let [full_n, full_k] = sl.full;
            if fmt.group_size == -1 && sl.cols.1 != full_k {
                return Err(Error::model(
                    self.src.origin(),
                    format!(
                        "tensor {name}: a group_size -1 checkpoint split along its {full_k} inputs (vLLM keeps its one group of scales whole on every rank) is not modelled; use --tp 1"
                    ),
                ));
            }
            if !sl.is_whole() {
                let g = fmt.group(full_k);
                let bad = !sl.rows.0.is_multiple_of(PACK4)
                    || !sl.rows.1.is_multiple_of(PACK4)
                    || !sl.cols.0.is_multiple_of(g.max(PACK4))
                    || !sl.cols.1.is_multiple_of(g.max(PACK4))
                    || (fmt.desc_act && sl.cols.1 != full_k);
                if bad {
                    return Err(Error::model(
                        self.src.origin(),
                        format!(
                            "tensor {name}: this rank's part of the [{full_n}, {full_k}] layer (outputs {}..{}, inputs {}..{}) does not fall on whole 4-bit words and groups of {g}{}; vLLM refuses such a split too",
                            sl.rows.0,
                            sl.rows.0 + sl.rows.1,
                            sl.cols.0,
                            sl.cols.0 + sl.cols.1,
                            if fmt.desc_act { " (act-order GPTQ keeps its inputs whole here)" } else { "" }
                        ),
                    ));
                }
            }
            self.tick(name, self.src.stored_bytes(name))?;
            let t = std::time::Instant::now();
            let whole = self
                .src
                .read_packed4(name, full_n, full_k, self.needs_data)?;
            let p = if self.needs_data && !sl.is_whole() {
                whole.cut(&fmt, (full_n, full_k), sl.rows, sl.cols)
            } else {
                whole
            };
            parts.push(p);
            ns.push(sl.rows.1);
            if self.needs_data {
                self.stats.read_seconds += t.elapsed().as_secs_f64();
                self.stats.source_bytes += self.src.stored_bytes(name);
            }
        }
        let total: usize = ns.iter().sum();
        // vLLM checks the stacked parameter's shape (output_size_per_partition = Σ nᵢ).
        if let Some(p) = fmt.shape_problem(total, k) {
            return Err(Error::model(
                self.src.origin(),
                format!("{fused_name}: {p}"),
            ));
        }
        let stacked = self
            .needs_data
            .then(|| marlin::Parts::stack(&fmt, parts, &ns, k));
        MarlinLinear::load(
            self.rt,
            fmt,
            fused_name.trim_end_matches(".weight"),
            (total, k),
            stacked.as_ref(),
            self.act,
            self.opts.marlin,
        )
    }

    /// A 2:4 linear (one layer, or the shards `names` of a stacked one: one
    /// `CompressedTensors24` layer) as `create_weights` allocates it and the loader fills it;
    /// the values read (dense, decompressed from the bitmask form) in compute mode. Read
    /// whole: a tensor-parallel cut is refused by name.
    fn sparse24(
        &mut self,
        scheme: crate::quant::sparse24::Sparse24,
        names: &[String],
        slices: &[Slice],
        fused_name: &str,
    ) -> Result<crate::quant::sparse24::Sparse24Linear> {
        let k = slices.first().map_or(0, |s| s.cols.1);
        let mut parts = Vec::with_capacity(names.len());
        let mut rows = Vec::with_capacity(names.len());
        for (name, sl) in names.iter().zip(slices) {
            let [full_n, full_k] = sl.full;
            if !sl.is_whole() || names.iter().filter(|n| *n == name).count() > 1 {
                return Err(Error::model(
                    self.src.origin(),
                    format!(
                        "tensor {name}: {} weights are read whole, one checkpoint tensor per layer shard; cutting them across tensor-parallel ranks is not modelled yet: use --tp 1",
                        scheme.label()
                    ),
                ));
            }
            self.tick(name, self.src.stored_bytes(name))?;
            let t = std::time::Instant::now();
            let p = self
                .src
                .read_sparse24(name, full_n, full_k, self.needs_data)?;
            if self.needs_data {
                self.stats.read_seconds += t.elapsed().as_secs_f64();
                self.stats.source_bytes += self.src.stored_bytes(name);
            }
            parts.push((p, full_n));
            rows.push(full_n);
        }
        let stacked = self
            .needs_data
            .then(|| crate::quant::sparse24::Parts::stack(parts));
        crate::quant::sparse24::Sparse24Linear::load(
            self.rt,
            scheme,
            fused_name.trim_end_matches(".weight"),
            &rows,
            k,
            self.act,
            stacked,
        )
    }

    /// An NVFP4 linear (one layer, or the shards `names` of a stacked one) as `create_weights`
    /// allocates it and the weight loader fills it (`Nvfp4Linear::load`): each shard's codes
    /// and block scales stacked along the output, one global and input scale per shard. Read
    /// whole: a tensor-parallel cut is refused by name.
    fn nvfp4(
        &mut self,
        flavor: crate::quant::nvfp4::Flavor,
        names: &[String],
        slices: &[Slice],
        fused_name: &str,
    ) -> Result<crate::quant::nvfp4::Nvfp4Linear> {
        let k = slices.first().map_or(0, |s| s.cols.1);
        let mut parts = Vec::with_capacity(names.len());
        let mut total = 0;
        for (name, sl) in names.iter().zip(slices) {
            let [full_n, full_k] = sl.full;
            if !sl.is_whole() || names.iter().filter(|n| *n == name).count() > 1 {
                return Err(Error::model(
                    self.src.origin(),
                    format!(
                        "tensor {name}: {} weights are read whole, one checkpoint tensor per layer shard; cutting them across tensor-parallel ranks is not modelled yet: use --tp 1",
                        flavor.label()
                    ),
                ));
            }
            self.tick(name, self.src.stored_bytes(name))?;
            let t = std::time::Instant::now();
            parts.push(self.src.read_nvfp4(name, full_n, full_k, self.needs_data)?);
            total += full_n;
            if self.needs_data {
                self.stats.read_seconds += t.elapsed().as_secs_f64();
                self.stats.source_bytes += self.src.stored_bytes(name);
            }
        }
        let stacked = self
            .needs_data
            .then(|| crate::quant::nvfp4::Parts::stack(parts));
        crate::quant::nvfp4::Nvfp4Linear::load(
            self.rt,
            flavor,
            fused_name.trim_end_matches(".weight"),
            (total, k),
            names.len(),
            stacked.as_ref(),
            self.opts.marlin,
        )
    }

    /// A pre-quantized 4-bit weight as vLLM's `_quantized_4bit_generator` and
    /// `QuantState.from_dict` put it on the device (loader.py L926-971; bitsandbytes
    /// functional.py L706-754): the packed codes, then the nested offset, nested absmax and
    /// nested code, then the absmax and the code, each its own tensor.
    fn bnb4_stored(&mut self, name: &str, n: usize, k: usize, meta: &Bnb4Meta) -> Result<Linear> {
        self.tick(name, self.src.stored_bytes(name))?;
        let parts = if self.needs_data {
            let t = std::time::Instant::now();
            let p = self.src.read_bnb4(name)?;
            self.stats.read_seconds += t.elapsed().as_secs_f64();
            self.stats.source_bytes += self.src.stored_bytes(name);
            Some(p)
        } else {
            None
        };
        if meta.shape != [n, k] {
            return Err(crate::base::error::Error::model(
                self.src.origin(),
                format!(
                    "tensor {name}: its quant state says shape {:?}, the config implies [{n}, {k}]",
                    meta.shape
                ),
            ));
        }
        let rt = self.rt;
        let packed = put_u8(
            rt,
            name,
            &[meta.packed_len()],
            parts.as_ref().map(|p| &p.packed[..]),
        )?;
        let base = name.to_string();
        let blocks = meta.blocks();
        let (absmax, nested) = match meta.nested_blocksize {
            Some(nb) => {
                let (q, na, nc, off) = match parts.as_ref().map(|p| &p.absmax) {
                    Some(Absmax::Nested {
                        q,
                        nested_absmax,
                        nested_code,
                        offset,
                        ..
                    }) => (
                        Some(&q[..]),
                        Some(&nested_absmax[..]),
                        Some(&nested_code[..]),
                        *offset,
                    ),
                    _ => (None, None, None, meta.offset),
                };
                let offset = put_f32(
                    rt,
                    &format!("{base}.nested_offset"),
                    &[1],
                    Some(&[off][..]).filter(|_| self.needs_data),
                )?;
                let nabs = put_f32(
                    rt,
                    &format!("{base}.nested_absmax"),
                    &[blocks.div_ceil(nb)],
                    na,
                )?;
                let ncode = put_f32(rt, &format!("{base}.nested_quant_map"), &[256], nc)?;
                let absmax = put_u8(rt, &format!("{base}.absmax"), &[blocks], q)?;
                (
                    absmax,
                    Some(Bnb4Nested {
                        absmax: nabs,
                        code: Rc::new(ncode),
                        counts_code: true,
                        offset,
                        offset_value: off,
                        blocksize: nb,
                    }),
                )
            }
            None => {
                let a = match parts.as_ref().map(|p| &p.absmax) {
                    Some(Absmax::F32(a)) => Some(&a[..]),
                    _ => None,
                };
                (put_f32(rt, &format!("{base}.absmax"), &[blocks], a)?, None)
            }
        };
        let code = put_f32(
            rt,
            &format!("{base}.quant_map"),
            &[16],
            parts.as_ref().map(|p| &p.code[..]),
        )?;
        Ok(Linear::Bnb4(Bnb4Linear {
            quant_type: meta.quant_type,
            blocksize: meta.blocksize,
            dtype: meta.dtype,
            packed,
            code,
            absmax,
            nested,
            out_features: n,
            in_features: k,
        }))
    }

    /// vLLM's in-flight 4-bit (`_unquantized_generator`, loader.py L973-1023): the 16-bit
    /// weight goes to the device, `quantize_4bit` (functional.py L1147-1270) allocates the
    /// f32 absmax, the packed codes and the code book; NF4 then double-quantizes as vLLM asks
    /// (`compress_statistics=True`): the offset, the dynamic code book (once per process), the
    /// nested absmax and the u8 absmax, and the f32 absmax is freed. `--quant fp4` is
    /// transformers' FP4 default instead (f32 absmax kept, no double quantization).
    fn bnb4_in_flight(&mut self, name: &str, n: usize, k: usize) -> Result<Linear> {
        let data = self.read(name, &[n, k])?;
        let rt = self.rt;
        let (ty, nested) = match self.opts.quant {
            Quant::Fp4 => (Bnb4Type::Fp4, false),
            _ => (Bnb4Type::Nf4, true),
        };
        let mut parts = None;
        if let Some(w) = &data {
            let t = std::time::Instant::now();
            parts = Some(bnb4::quantize_parts(w, [n, k], ty, nested, self.act));
            self.stats.quantize_seconds += t.elapsed().as_secs_f64();
        }
        let meta = Bnb4Meta {
            quant_type: ty,
            blocksize: bnb4::BLOCKSIZE,
            dtype: self.act,
            shape: [n, k],
            nested_blocksize: nested.then_some(bnb4::NESTED_BLOCKSIZE),
            offset: 0.0,
        };
        // `loaded_weight.cuda()`: the 16-bit weight on the device while it is quantized.
        let staged = upload(rt, &format!("{name}.unquantized"), &[n, k], self.act, None)?;
        let blocks = meta.blocks();
        let (absmax_data, nested_data) = match parts.as_ref().map(|p| &p.absmax) {
            Some(Absmax::F32(a)) => (Some(a.clone()), None),
            Some(Absmax::Nested {
                q,
                nested_absmax,
                offset,
                ..
            }) => (None, Some((q, nested_absmax, *offset))),
            None => (None, None),
        };
        let absmax32 = put_f32(
            rt,
            &format!("{name}.absmax"),
            &[blocks],
            absmax_data.as_deref(),
        )?;
        let packed = put_u8(
            rt,
            name,
            &[meta.packed_len()],
            parts.as_ref().map(|p| &p.packed[..]),
        )?;
        let code = put_f32(
            rt,
            &format!("{name}.quant_map"),
            &[16],
            parts.as_ref().map(|p| &p.code[..]),
        )?;
        let (absmax, nested) = if nested {
            let off = nested_data.map(|d| d.2);
            let offset = put_f32(
                rt,
                &format!("{name}.nested_offset"),
                &[1],
                off.as_ref().map(std::slice::from_ref),
            )?;
            let counts_code = self.dynamic_map.is_none();
            let map = match &self.dynamic_map {
                Some(m) => m.clone(),
                None => {
                    let dm = bnb4::dynamic_map();
                    let m = Rc::new(put_f32(
                        rt,
                        "bitsandbytes.dynamic_map",
                        &[256],
                        self.needs_data.then_some(&dm[..]),
                    )?);
                    self.dynamic_map = Some(m.clone());
                    m
                }
            };
            let nabs = put_f32(
                rt,
                &format!("{name}.nested_absmax"),
                &[blocks.div_ceil(bnb4::NESTED_BLOCKSIZE)],
                nested_data.map(|d| &d.1[..]),
            )?;
            let q = put_u8(
                rt,
                &format!("{name}.absmax"),
                &[blocks],
                nested_data.map(|d| &d.0[..]),
            )?;
            // `del absmax`: the f32 absmax goes once its 8-bit copy exists.
            drop(absmax32);
            (
                q,
                Some(Bnb4Nested {
                    absmax: nabs,
                    code: map,
                    counts_code,
                    offset,
                    offset_value: off.unwrap_or(0.0),
                    blocksize: bnb4::NESTED_BLOCKSIZE,
                }),
            )
        } else {
            (absmax32, None)
        };
        drop(staged);
        Ok(Linear::Bnb4(Bnb4Linear {
            quant_type: ty,
            blocksize: meta.blocksize,
            dtype: meta.dtype,
            packed,
            code,
            absmax,
            nested,
            out_features: n,
            in_features: k,
        }))
    }
}

/// vLLM's in-flight fp8 for one layer, run once every weight is loaded in 16 bits (0.6.4
/// model_loader/loader.py L317-329 calls `process_weights_after_loading` module by module):
/// the fp8 copy and its scale are allocated, then the 16-bit weight is freed (its blocks stay
/// cached in the allocator).
pub(crate) fn fp8_after_loading(rt: &Runtime, lin: &mut Linear) -> Result<()> {
    if let Linear::Dense(w) = lin {
        let q = Fp8Linear::quantize_in_flight(rt, w)?;
        *lin = Linear::Fp8(q);
    }
    Ok(())
}

/// vLLM's `process_weights_after_loading` for an AWQ / GPTQ layer, run once every weight is
/// loaded, module by module (0.6.4 model_loader/loader.py L317-329): the Marlin repack.
pub(crate) fn marlin_after_loading(rt: &Runtime, lin: &mut Linear, act: DType) -> Result<()> {
    if let Linear::Marlin(l) = lin {
        l.after_loading(rt, act)?;
    }
    Ok(())
}

/// `CompressedTensors24.process_weights_after_loading` (decompression, CUTLASS's
/// compression), module by module.
pub(crate) fn sparse24_after_loading(rt: &Runtime, lin: &mut Linear, act: DType) -> Result<()> {
    if let Linear::Sparse24(l) = lin {
        l.after_loading(rt, act)?;
    }
    Ok(())
}

/// `sparse24_after_loading` for a stacked parameter: one layer.
pub(crate) fn sparse24_fused_after_loading(
    rt: &Runtime,
    f: &mut FusedLinear,
    act: DType,
) -> Result<()> {
    if let FusedLinear::Sparse24 { linear, .. } = f {
        linear.after_loading(rt, act)?;
    }
    Ok(())
}

/// NVFP4's `process_weights_after_loading` (the Marlin FP4 repack), module by module.
pub(crate) fn nvfp4_after_loading(rt: &Runtime, lin: &mut Linear, act: DType) -> Result<()> {
    if let Linear::Nvfp4(l) = lin {
        l.after_loading(rt, act)?;
    }
    Ok(())
}

/// `nvfp4_after_loading` for a stacked parameter: repacked whole.
pub(crate) fn nvfp4_fused_after_loading(
    rt: &Runtime,
    f: &mut FusedLinear,
    act: DType,
) -> Result<()> {
    if let FusedLinear::Nvfp4 { linear, .. } = f {
        linear.after_loading(rt, act)?;
    }
    Ok(())
}

/// `marlin_after_loading` for a stacked parameter: repacked whole.
pub(crate) fn marlin_fused_after_loading(
    rt: &Runtime,
    f: &mut FusedLinear,
    act: DType,
) -> Result<()> {
    if let FusedLinear::Marlin { linear, .. } = f {
        linear.after_loading(rt, act)?;
    }
    Ok(())
}

/// Why an AWQ / GPTQ weight is not cut: tensor parallelism and checkpoints that store a
/// layer fused (Phi-3's `qkv_proj.qweight`) are not modelled for these formats.
/// Codes per int32 word of a 4-bit checkpoint.
const PACK4: usize = marlin::PACK;

fn packed4_unsplit(src: &dyn WeightSource, name: &str) -> Error {
    Error::model(
        src.origin(),
        format!(
            "tensor {name}: AWQ / GPTQ weights are read whole, one checkpoint tensor per layer shard; cutting them across tensor-parallel ranks or out of a fused checkpoint tensor is not modelled: use --tp 1"
        ),
    )
}

/// `fp8_after_loading` for a stacked parameter: quantized whole, one scale for its shards.
pub(crate) fn fp8_fused_after_loading(rt: &Runtime, f: &mut FusedLinear) -> Result<()> {
    if let FusedLinear::Dense { weight, rows } = f {
        let linear = Box::new(Fp8Linear::quantize_in_flight(rt, weight)?);
        let rows = std::mem::take(rows);
        *f = FusedLinear::Fp8 { linear, rows };
    }
    Ok(())
}

/// vLLM 0.6.4's `process_weights_after_loading` for a linear layer of a pre-quantized fp8
/// checkpoint (fp8.py L205-248): its shards requantized at their largest scale
/// (`Fp8Linear::requantize_stored`), run once every weight is loaded, module by module
/// (model_loader/loader.py L317-329). `rows` are the layer's shards (`[n]` for o_proj and
/// down_proj). Anything but a layer `Loader::fp8_stored` made passes through.
pub(crate) fn fp8_stored_after_loading(
    rt: &Runtime,
    lin: Fp8Linear,
    rows: &[usize],
    modelopt: bool,
) -> Result<Fp8Linear> {
    if lin.per_channel {
        return fp8_channel_after_loading(rt, lin);
    }
    let Fp8Linear {
        qweight,
        weight_scale,
        input_scale,
        stored_scales,
        ..
    } = lin;
    let host = |t: &Tensor| -> Result<Vec<f32>> {
        match rt.backend() {
            Backend::Cpu => Ok(t.f32().to_vec()),
            Backend::Cuda => ops::cuda(rt, |c| c.download_f32(t)),
            Backend::Dry => Ok(Vec::new()),
        }
    };
    // ModelOpt's method decides on the scales' values, known here in every mode.
    let ws = if modelopt {
        stored_scales
    } else {
        host(&weight_scale)?
    };
    let (is_t, is_v) = match input_scale {
        Some((t, _)) => {
            let v = host(&t)?;
            (Some(t), v)
        }
        None => (None, Vec::new()),
    };
    let after = if modelopt {
        Fp8Linear::requantize_stored_modelopt
    } else {
        Fp8Linear::requantize_stored
    };
    after(
        rt,
        qweight,
        (weight_scale, &ws),
        is_t.map(|t| (t, &is_v[..])),
        rows,
    )
}

/// compressed-tensors' channel-wise fp8 after loading (`CompressedTensorsW8A8Fp8.
/// process_weights_after_loading`, 0.19 compressed_tensors_w8a8_fp8.py): the weight and its
/// `[rows, 1]` scales kept as loaded (`weight.t()` is a view); a static input scale becomes
/// `input_scale.max()`, a new 0-dim tensor replacing the per-shard one.
fn fp8_channel_after_loading(rt: &Runtime, mut lin: Fp8Linear) -> Result<Fp8Linear> {
    if let Some((old, value)) = lin.input_scale.take() {
        rt.set_op("fp8.input_scale_max");
        let mut t = rt.tensor(old.name.clone(), Category::Weight, &[], DType::F32)?;
        match rt.backend() {
            Backend::Cpu => t.f32_mut()[0] = value,
            Backend::Cuda => ops::upload_f32(rt, &mut t, &[value])?,
            Backend::Dry => {}
        }
        drop(old);
        lin.input_scale = Some((t, value));
    }
    Ok(lin)
}

/// `Fp8BlockLinear::after_loading` for a block-wise layer; anything else passes through.
pub(crate) fn fp8_block_after_loading(rt: &Runtime, lin: &mut Linear) -> Result<()> {
    if let Linear::Fp8Block(l) = lin {
        l.after_loading(rt)?;
    }
    Ok(())
}

/// `fp8_block_after_loading` for a stacked parameter: its one grid.
pub(crate) fn fp8_block_after_loading_fused(rt: &Runtime, f: &mut FusedLinear) -> Result<()> {
    if let FusedLinear::Fp8Block { linear, .. } = f {
        linear.after_loading(rt)?;
    }
    Ok(())
}

/// `fp8_stored_after_loading` for a plain linear layer (one shard).
pub(crate) fn fp8_stored_linear_after_loading(
    rt: &Runtime,
    lin: Linear,
    modelopt: bool,
) -> Result<Linear> {
    match lin {
        Linear::Fp8(l) => {
            let rows = [l.out_features];
            Ok(Linear::Fp8(fp8_stored_after_loading(
                rt, l, &rows, modelopt,
            )?))
        }
        other => Ok(other),
    }
}

/// `fp8_stored_after_loading` for a stacked parameter (qkv_proj, gate_up_proj).
pub(crate) fn fp8_stored_fused_after_loading(
    rt: &Runtime,
    f: FusedLinear,
    modelopt: bool,
) -> Result<FusedLinear> {
    match f {
        FusedLinear::Fp8 { linear, rows } => {
            let linear = Box::new(fp8_stored_after_loading(rt, *linear, &rows, modelopt)?);
            Ok(FusedLinear::Fp8 { linear, rows })
        }
        other => Ok(other),
    }
}

/// A weight-category u8 tensor, filled from `data` when given (compute modes).
fn put_u8(rt: &Runtime, name: &str, shape: &[usize], data: Option<&[u8]>) -> Result<Tensor> {
    let mut t = rt.tensor(name, Category::Weight, shape, DType::U8)?;
    if let Some(d) = data {
        match &mut t.storage {
            crate::engine::tensor::Storage::U8(dst) => dst.copy_from_slice(d),
            crate::engine::tensor::Storage::Cuda(_) => ops::upload_u8(rt, &mut t, d)?,
            _ => {}
        }
    }
    Ok(t)
}

/// A weight-category f32 tensor, filled from `data` when given (compute modes).
fn put_f32(rt: &Runtime, name: &str, shape: &[usize], data: Option<&[f32]>) -> Result<Tensor> {
    let mut t = rt.tensor(name, Category::Weight, shape, DType::F32)?;
    if let Some(d) = data {
        match &mut t.storage {
            crate::engine::tensor::Storage::F32(dst) => dst.copy_from_slice(d),
            crate::engine::tensor::Storage::Cuda(_) => ops::upload_f32(rt, &mut t, d)?,
            _ => {}
        }
    }
    Ok(t)
}

/// An LLM.int8 linear from `CB` and `SCB` (computed or as stored): the same two allocations
/// either way.
pub(crate) fn load_int8(
    rt: &Runtime,
    name: &str,
    n: usize,
    k: usize,
    data: Option<(Vec<i8>, Vec<f32>)>,
    opts: &LoadOptions,
) -> Result<Linear> {
    let base = name.trim_end_matches(".weight");
    let mut cb = rt.tensor(name, Category::Weight, &[n, k], DType::I8)?;
    let mut scb = rt.tensor(format!("{base}.SCB"), Category::Weight, &[n], DType::F32)?;
    if let Some((q, s)) = data {
        if rt.backend() == Backend::Cpu {
            if let crate::engine::tensor::Storage::I8(dst) = &mut cb.storage {
                dst.copy_from_slice(&q);
            }
            scb.f32_mut().copy_from_slice(&s);
        } else {
            ops::upload_i8(rt, &mut cb, &q)?;
            ops::upload_f32(rt, &mut scb, &s)?;
        }
    }
    Ok(Linear::Int8(Int8Linear {
        cb,
        scb,
        out_features: n,
        in_features: k,
        threshold: opts.int8_threshold,
        layout: opts.int8_layout,
        state: Default::default(),
    }))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn load_linear(
    rt: &Runtime,
    name: &str,
    n: usize,
    k: usize,
    data: Option<Vec<f32>>,
    opts: &LoadOptions,
    act: DType,
    stats: &mut LoadStats,
) -> Result<Linear> {
    let mut timed = |f: &mut dyn FnMut()| {
        let t = std::time::Instant::now();
        f();
        stats.quantize_seconds += t.elapsed().as_secs_f64();
    };
    match opts.quant {
        Quant::F16 | Quant::BF16 | Quant::F32 | Quant::Fp8 => {
            Ok(Linear::Dense(upload(rt, name, &[n, k], act, data)?))
        }
        Quant::Int8 => {
            let mut q = None;
            if let Some(w) = data {
                timed(&mut || q = Some(crate::quant::int8::quantize_rows(&w, n, k)));
            }
            load_int8(rt, name, n, k, q, opts)
        }
        // The loader quantizes 4-bit itself (`Loader::bnb4_in_flight`).
        Quant::Nf4 | Quant::Fp4 => unreachable!("4-bit weights load through Loader::linear"),
    }
}

/// The greatest common divisor.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Category;
    use crate::quant::fp8::tests::{runtime, trace};
    use crate::quant::int8::TileLayout;

    /// An fp8 checkpoint in memory: each weight's codes, weight_scale and input_scale.
    struct Fp8Source {
        static_act: bool,
        weights: Vec<(&'static str, Vec<u8>, f32, f32)>,
    }

    impl WeightSource for Fp8Source {
        fn origin(&self) -> String {
            "mem".into()
        }
        fn read_f32(&self, name: &str, _: &[usize]) -> Result<Vec<f32>> {
            Err(Error::Request(format!("{name} is fp8")))
        }
        fn stored_fp8(&self) -> Option<crate::quant::fp8::StoredFp8> {
            Some(crate::quant::fp8::StoredFp8 {
                block: None,
                static_activations: self.static_act,
                dtype: DType::BF16,
                channel: false,
                compressed_tensors: false,
                int8: false,
                routers_unquantized: false,
                modelopt: false,
            })
        }
        fn read_fp8(&self, name: &str, _: &[usize]) -> Result<(Vec<u8>, Vec<f32>, Option<f32>)> {
            let (_, c, w, i) = self.weights.iter().find(|w| w.0 == name).unwrap();
            Ok((c.clone(), vec![*w], self.static_act.then_some(*i)))
        }
    }

    fn opts() -> LoadOptions {
        LoadOptions {
            quant: Quant::Fp8,
            int8_threshold: 0.0,
            int8_layout: TileLayout {
                row_pad: 8,
                col_pad: 32,
            },
            attn_scalars: 0,
            marlin: Default::default(),
        }
    }

    #[test]
    fn a_stored_fp8_stack_allocates_its_weight_then_its_shard_scales() {
        let rt = runtime("dry");
        let src = Fp8Source {
            static_act: true,
            weights: vec![],
        };
        let o = opts();
        let mut ld = Loader::new(&rt, &src, &o, 3);
        assert_eq!(ld.act, DType::BF16, "the checkpoint's dtype");
        let names = ["q_proj", "k_proj", "v_proj"].map(|n| format!("l.self_attn.{n}.weight"));
        let from = rt.event_count();
        let f = ld
            .fused_parts(
                &names,
                &[4096, 1024, 1024],
                &[(0, 4096), (0, 1024), (0, 1024)],
                4096,
                "l.self_attn.qkv_proj.weight",
            )
            .unwrap();
        assert_eq!(
            trace(&rt, from),
            vec![
                ("alloc", "l.self_attn.qkv_proj.weight".into(), 6144 * 4096),
                ("alloc", "l.self_attn.qkv_proj.weight_scale".into(), 512),
                ("alloc", "l.self_attn.qkv_proj.input_scale".into(), 512),
            ]
        );
        assert_eq!(f.shard_rows(), vec![4096, 1024, 1024]);
        // The [3] scales as loaded, then one scalar each once processed.
        assert_eq!(f.weight_bytes(), 6144 * 4096 + 12 + 12);
        let f = fp8_stored_fused_after_loading(&rt, f, false).unwrap();
        assert_eq!(f.weight_bytes(), 6144 * 4096 + 4 + 4);
        assert_eq!(rt.stats().allocated, 6144 * 4096 + 512 + 512);
        // A tensor-parallel cut is refused by name.
        let e = ld
            .linear_slice(
                "l.self_attn.o_proj.weight",
                Slice::cols(4096, 4096, 0, 2048),
            )
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tensor l.self_attn.o_proj.weight: a tensor-parallel shard ([4096, 2048] of [4096, 4096]) of a pre-quantized fp8 checkpoint"),
            "{e}"
        );
    }

    #[test]
    fn stored_fp8_shards_on_the_host_come_out_at_the_max_scale_and_compute_with_it() {
        let rt = runtime("compute");
        // gate: codes 2.0 (0x40), -4.0 (0xC8) at scale 1/2; up: the same codes at scale 1.
        let src = Fp8Source {
            static_act: true,
            weights: vec![
                ("l.mlp.gate_proj.weight", vec![0x40, 0xC8], 0.5, 2.0),
                ("l.mlp.up_proj.weight", vec![0x40, 0xC8], 1.0, 3.0),
            ],
        };
        let o = opts();
        let mut ld = Loader::new(&rt, &src, &o, 2);
        let names = ["gate_proj", "up_proj"].map(|n| format!("l.mlp.{n}.weight"));
        let f = ld
            .fused_parts(
                &names,
                &[1, 1],
                &[(0, 1), (0, 1)],
                2,
                "l.mlp.gate_up_proj.weight",
            )
            .unwrap();
        let f = fp8_stored_fused_after_loading(&rt, f, false).unwrap();
        let FusedLinear::Fp8 { linear, rows } = &f else {
            panic!("not fp8")
        };
        assert_eq!(rows, &vec![1, 1]);
        // gate's values (1, -2) at the max scale 1 are codes 0x38, 0xC0.
        assert_eq!(linear.qweight.u8(), &[0x38, 0xC0, 0x40, 0xC8]);
        assert_eq!(linear.weight_scale_value, 1.0);
        assert_eq!(linear.weight_scale.shape, Vec::<usize>::new());
        let (t, v) = linear.input_scale.as_ref().unwrap();
        assert_eq!((t.f32(), *v), (&[3.0f32][..], 3.0));
        // x = (3, 6) at the static scale 3: codes 1.0 and 2.0; gate = 1·1 + 2·(−2) = −3,
        // up = 1·2 + 2·(−4) = −6, each times 3 · 1.
        let x = rt
            .tensor_with_values(
                "x",
                Category::Activation,
                &[1, 2],
                DType::BF16,
                vec![3.0, 6.0],
            )
            .unwrap();
        let out = f
            .forward(&rt, &x, "l.mlp.gate_up_proj", 0, DType::BF16)
            .unwrap();
        assert_eq!(out.f32(), &[-9.0, -18.0]);
    }

    #[test]
    fn in_flight_quantization_allocates_codes_and_scale_then_frees_the_16_bit_weight() {
        let rt = runtime("dry");
        let w = rt
            .tensor(
                "l.qkv_proj.weight",
                Category::Weight,
                &[6144, 4096],
                DType::F16,
            )
            .unwrap();
        let mut lin = Linear::Dense(w);
        let from = rt.event_count();
        fp8_after_loading(&rt, &mut lin).unwrap();
        let t = trace(&rt, from);
        assert_eq!(
            t,
            vec![
                ("alloc", "l.qkv_proj.weight".into(), 6144 * 4096),
                ("alloc", "l.qkv_proj.weight_scale".into(), 512),
                ("free", "l.qkv_proj.weight".into(), 2 * 6144 * 4096),
            ]
        );
        assert_eq!(lin.weight_bytes(), 6144 * 4096 + 4);
        // The 4-byte scale takes a 512-byte block; the freed 16-bit weight stays cached.
        let st = rt.stats();
        assert_eq!(st.allocated, 6144 * 4096 + 512);
        assert!(st.reserved >= 2 * 6144 * 4096 + 6144 * 4096);
    }
}

//! 2:4 sparse compressed-tensors checkpoints (`sparsity_config.sparsity_structure` "2:4",
//! format "dense" or "sparse-24-bitmask"; RedHatAI's `Sparse-Llama-3.1-8B-2of4…`) as vLLM 0.11
//! and 0.15 run them on Hopper through `CompressedTensors24` (docs/reading/vllm-sparse24.md):
//! the weight loaded dense (or as the bitmask form, decompressed after loading), compressed by
//! CUTLASS into its non-zeros `[n, k/2]` and metadata, multiplied by `cutlass_scaled_sparse_mm`.
//! Two schemes: 16-bit weights and activations, and fp8 weights (per channel or per tensor)
//! with dynamic per-token fp8 activations.
//!
//! The stored bitmask form (compressed-tensors `Sparse24BitMaskCompressor`,
//! compressors/sparse_compressors/sparse_24_bitmask.py): `NAME.compressed [n, k/2]` the kept
//! values of each row in order, `NAME.bitmask [n, ceil(k/8)]` U8 with input `8j + b` at bit `b`
//! of byte `j` (`numpy.packbits(…, bitorder="little")`, utils/helpers.py), two bits set in every
//! group of four (`get_24_bytemasks`: the top two magnitudes), `NAME.shape [2, 1]` I64 holding
//! `[n, k]`.

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// How the checkpoint stores its 2:4 weights (`sparsity_config.format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// The weight as a dense `[n, k]` tensor whose zeros make the 2:4 pattern.
    Dense,
    /// `sparse-24-bitmask`: `compressed`, `bitmask`, `shape`.
    Bitmask,
}

impl Format {
    pub fn label(self) -> &'static str {
        match self {
            Format::Dense => "dense",
            Format::Bitmask => "sparse-24-bitmask",
        }
    }
}

/// A 2:4 checkpoint's scheme, read from its `quantization_config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sparse24 {
    pub format: Format,
    /// fp8 weights (`Some(true)`: one scale per output channel, `Some(false)`: one per
    /// tensor) with dynamic per-token fp8 activations; `None`: 16-bit.
    pub fp8_channel: Option<bool>,
    /// The activation dtype (config.json's `torch_dtype`: bfloat16 stays, else float16).
    pub dtype: DType,
}

impl Sparse24 {
    pub fn label(self) -> String {
        format!(
            "compressed-tensors 2:4 sparse ({}, {})",
            self.format.label(),
            match self.fp8_channel {
                None => "16-bit",
                Some(true) => "fp8 channel weights, dynamic per-token fp8 activations",
                Some(false) => "fp8 tensor weights, dynamic per-token fp8 activations",
            }
        )
    }

    /// The dtype vLLM creates the weight in (`_get_params_dtype`, 0.15.1
    /// compressed_tensors_24.py L293-296).
    pub fn weight_dtype(self, act: DType) -> DType {
        if self.fp8_channel.is_some() {
            DType::F8E4M3
        } else {
            act
        }
    }
}

/// A stored 2:4 linear's values: the dense `[n, k]` weight (fp8: the codes' values, unscaled)
/// and, for fp8, its scales (`[n]` per channel or one).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parts {
    pub values: Vec<f32>,
    pub scales: Vec<f32>,
}

impl Parts {
    /// Shards stacked along the output (per-tensor scales spread over their rows, as
    /// `convert_to_channelwise` does after loading).
    pub fn stack(parts: Vec<(Parts, usize)>) -> Parts {
        let mut out = Parts::default();
        for (p, n) in parts {
            out.values.extend(p.values);
            match p.scales.len() {
                0 => {}
                1 => out.scales.extend(std::iter::repeat_n(p.scales[0], n)),
                _ => out.scales.extend(p.scales),
            }
        }
        out
    }
}

/// The first group of four inputs (row, first column) holding more than two non-zeros: a
/// weight that is not 2:4. `None` when every group holds two or fewer.
pub fn first_dense_group(values: &[f32], n: usize, k: usize) -> Option<(usize, usize)> {
    (0..n).find_map(|r| {
        values[r * k..(r + 1) * k]
            .chunks(4)
            .position(|g| g.iter().filter(|v| **v != 0.0).count() > 2)
            .map(|g| (r, 4 * g))
    })
}

/// Zeroes the two smallest magnitudes of every group of four along each row (ties: the
/// earlier input kept), as SparseGPT's 2:4 mask leaves a weight.
pub fn prune(w: &mut [f32], k: usize) {
    for row in w.chunks_exact_mut(k) {
        for g in row.chunks_mut(4) {
            let mut idx: Vec<usize> = (0..g.len()).collect();
            idx.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()).then(a.cmp(&b)));
            for &i in idx.iter().skip(2) {
                g[i] = 0.0;
            }
        }
    }
}

/// The bitmask form of a 2:4 `[n, k]` weight as compressed-tensors writes it: the kept
/// positions of each group of four (its non-zeros, then its earliest zeros, up to two), the
/// indices of the kept values in row-major order, and the packed `[n, ceil(k/8)]` bitmask.
pub fn encode_bitmask(w: &[f32], n: usize, k: usize) -> (Vec<usize>, Vec<u8>) {
    let row_bytes = k.div_ceil(8);
    let mut kept = Vec::with_capacity(n * k / 2);
    let mut mask = vec![0u8; n * row_bytes];
    for r in 0..n {
        for g0 in (0..k).step_by(4) {
            let g = g0..(g0 + 4).min(k);
            let mut keep: Vec<usize> = g.clone().filter(|&c| w[r * k + c] != 0.0).collect();
            keep.extend(g.filter(|&c| w[r * k + c] == 0.0));
            keep.truncate(2);
            keep.sort_unstable();
            for c in keep {
                kept.push(r * k + c);
                mask[r * row_bytes + c / 8] |= 1 << (c % 8);
            }
        }
    }
    (kept, mask)
}

/// Refuses a bitmask that does not set exactly two bits in every group of four inputs
/// (what `get_24_bytemasks` writes, and what makes the values `[n, k/2]`), naming where.
pub fn check_bitmask(mask: &[u8], n: usize, k: usize) -> std::result::Result<(), String> {
    let row_bytes = k.div_ceil(8);
    for r in 0..n {
        for g0 in (0..k).step_by(4) {
            let set = (g0..(g0 + 4).min(k))
                .filter(|&c| mask[r * row_bytes + c / 8] >> (c % 8) & 1 == 1)
                .count();
            if set != 2 {
                return Err(format!(
                    "row {r}, inputs {g0}..{} set {set} bits, expected two of every four (2:4)",
                    (g0 + 4).min(k)
                ));
            }
        }
    }
    Ok(())
}

/// The dense `[n, k]` weight of the bitmask form (`sparse24_bitmask_decompress`: the mask
/// unpacked little-endian, the values put at its set bits in row-major order), after
/// `check_bitmask`.
pub fn decode_bitmask(
    values: &[f32],
    mask: &[u8],
    n: usize,
    k: usize,
) -> std::result::Result<Vec<f32>, String> {
    check_bitmask(mask, n, k)?;
    let row_bytes = k.div_ceil(8);
    let mut out = vec![0f32; n * k];
    let mut next = values.iter();
    for r in 0..n {
        for c in 0..k {
            if mask[r * row_bytes + c / 8] >> (c % 8) & 1 == 1 {
                out[r * k + c] = *next.next().expect("two values of every four");
            }
        }
    }
    Ok(out)
}

/// The shapes CUTLASS's compressor allocates for an `[m, k]` 2:4 operand on Hopper
/// (`StructuredSparseCompressorUtility`, cutlass transform/kernel/sparse_gemm_compressor.hpp,
/// with `Sm90GemmSparseConfig`, gemm/collective/builders/sm90_sparse_config.inl): the
/// non-zeros `[m, round_up(k, 128 / bits(sparse elem)) / 2]` in the weight dtype (K-major:
/// no row alignment), the metadata `[round_up(m, 64), round_up(k, 128) / 8]` U8 (its atom
/// 64 rows by `min(tile K, 128)` = 128 inputs, one byte per eight inputs).
pub fn compressed_shapes(m: usize, k: usize, dtype: DType) -> ([usize; 2], [usize; 2]) {
    // A sparse element of a 16-bit type counts 8 bits, of an 8-bit type 4.
    let align_k = if dtype.size_bytes() >= 2 { 16 } else { 32 };
    (
        [m, k.next_multiple_of(align_k) / 2],
        [m.next_multiple_of(64), k.next_multiple_of(128) / 8],
    )
}

/// The host's copy of a layer's values (compute mode): the dense weight as the GEMM reads it
/// and, for fp8, one scale per output row.
pub struct Host {
    pub values: Vec<f32>,
    pub scales: Vec<f32>,
}

/// A linear layer (or the stacked shards of one) under `CompressedTensors24`: the parameters
/// `create_weights` makes, then, after `after_loading`, CUTLASS's compressed weight and
/// metadata.
pub struct Sparse24Linear {
    pub scheme: Sparse24,
    /// `[n, k]` in the weight dtype as loaded; the non-zeros after.
    pub weight: Tensor,
    /// CUTLASS's metadata, after loading.
    pub meta: Option<Tensor>,
    /// fp8: F32 `[n, 1]` (channel) or `[shards]` (tensor; `[n, 1]` after); 16-bit: F32 `[1]`
    /// of ones.
    pub weight_scale: Tensor,
    /// 16-bit only: F32 `[1]` of ones (fp8's activations are dynamic: none).
    pub input_scale: Option<Tensor>,
    /// The bitmask form's `shape [2, 1]` (kept for good), `compressed [n, k/2]` and
    /// `bitmask [n, k/8]` (freed after decompression).
    pub stored_shape: Option<Tensor>,
    pub stored: Option<(Tensor, Tensor)>,
    /// The output rows of each shard (`logical_widths`).
    pub rows: Vec<usize>,
    pub out_features: usize,
    pub in_features: usize,
    pub host: Option<Host>,
    compressed: bool,
}

impl Sparse24Linear {
    /// `create_weights` (0.15.1 compressed_tensors_24.py L78-193; 0.11.0 the same order):
    /// `weight [n, k]` (`torch.empty`), for the bitmask form `shape [2, 1]` I64,
    /// `compressed [n, k/2]` and `bitmask [n, k/8]` U8 (L100-144); fp8 `weight_scale`
    /// `[n, 1]` or `[shards]` F32 (L147-169, no `input_scale`: dynamic); 16-bit
    /// `weight_scale` and `input_scale` `torch.ones(1)` (L182-191). The loader fills them.
    pub fn load(
        rt: &Runtime,
        scheme: Sparse24,
        base: &str,
        rows: &[usize],
        k: usize,
        act: DType,
        parts: Option<Parts>,
    ) -> Result<Self> {
        rt.set_op("load");
        if rt.backend() == Backend::Cuda {
            return Err(Error::Request(format!(
                "{base}: a {} layer on a CUDA device: vramscope plans 2:4 sparse layers dry and computes them on the CPU (sim:…); CUTLASS's sparse tensor-core GEMM (cutlass_scaled_sparse_mm) is not reproduced on the GPU",
                scheme.label()
            )));
        }
        let n: usize = rows.iter().sum();
        let wd = scheme.weight_dtype(act);
        let t = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        let weight = t("weight", &[n, k], wd)?;
        let (stored_shape, stored) = if scheme.format == Format::Bitmask {
            let s = t("shape", &[2, 1], DType::I64)?;
            let c = t("compressed", &[n, k / 2], wd)?;
            let b = t("bitmask", &[n, k / 8], DType::U8)?;
            (Some(s), Some((c, b)))
        } else {
            (None, None)
        };
        let (weight_scale, input_scale) = match scheme.fp8_channel {
            Some(true) => (t("weight_scale", &[n, 1], DType::F32)?, None),
            Some(false) => (t("weight_scale", &[rows.len()], DType::F32)?, None),
            None => (
                t("weight_scale", &[1], DType::F32)?,
                Some(t("input_scale", &[1], DType::F32)?),
            ),
        };
        let host = match (parts, rt.backend()) {
            (Some(p), Backend::Cpu) => Some(Host {
                values: p.values,
                scales: p.scales,
            }),
            _ => None,
        };
        Ok(Sparse24Linear {
            scheme,
            weight,
            meta: None,
            weight_scale,
            input_scale,
            stored_shape,
            stored,
            rows: rows.to_vec(),
            out_features: n,
            in_features: k,
            host,
            compressed: false,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.nbytes());
        self.weight.nbytes()
            + opt(&self.meta)
            + self.weight_scale.nbytes()
            + opt(&self.input_scale)
            + opt(&self.stored_shape)
            + self
                .stored
                .as_ref()
                .map_or(0, |(c, b)| c.nbytes() + b.nbytes())
    }

    fn base(&self) -> String {
        self.weight
            .name
            .trim_end_matches(".weight")
            .trim_end_matches(".weight_nzs")
            .to_string()
    }

    /// `process_weights_after_loading` (0.15.1 compressed_tensors_24.py L195-245, 0.11.0
    /// L177-226), allocation for allocation:
    ///
    /// 1. The bitmask form, per shard of a stacked layer (`_decompress_bitmask_compressed_weight`,
    ///    L322-392: `torch.split` views): compressed-tensors' `sparse24_bitmask_decompress`
    ///    unpacks the mask on the host (numpy), makes `torch.zeros(shape)` on the host and
    ///    moves it to the GPU (`[nᵢ, k]`), then `decompressed[mask] = values`: `index_put_`
    ///    with the host's boolean mask, whose `nonzero()` indices (two I64 `[nᵢ·k/2]`, one a
    ///    dimension) go to the GPU for the kernel and are freed after. A stacked layer's
    ///    shards are then joined by `combine_shards` (`torch.zeros([n, k])`, each shard copied
    ///    in) while all are held. The dense result replaces the empty `weight`;
    ///    `compressed` and `bitmask` are deleted, `shape` stays.
    /// 2. fp8 per-tensor scales: `convert_to_channelwise` (w8a8_utils.py L68-83), a new F32
    ///    `[n, 1]` replacing the `[shards]` one.
    /// 3. 16-bit: `weight[weight == -0.0] = 0.0`: the comparison's bool `[n, k]`, then a
    ///    `masked_fill_` in place (a scalar value), the mask freed.
    /// 4. `ops.cutlass_sparse_compress(weight)` (_custom_ops.py L912-950 at 0.15.1; csrc
    ///    sparse_scaled_mm_c3x.cuh `cutlass_sparse_compress`): `torch::zeros` metadata then
    ///    non-zeros (`compressed_shapes`), a workspace of the compressor's
    ///    `get_workspace_size` (0 bytes: none allocated); the non-zeros replace the dense
    ///    weight (freed) and the metadata is kept as `meta`.
    pub fn after_loading(&mut self, rt: &Runtime, act: DType) -> Result<()> {
        if self.compressed {
            return Ok(());
        }
        let base = self.base();
        let (n, k) = (self.out_features, self.in_features);
        let wd = self.scheme.weight_dtype(act);
        let t = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        rt.set_op("sparse24.process_weights_after_loading");
        if let Some((compressed, bitmask)) = self.stored.take() {
            rt.set_op("compressed_tensors.sparse24_bitmask_decompress");
            let mut shards = Vec::with_capacity(self.rows.len());
            for (i, &ni) in self.rows.iter().enumerate() {
                let dense = t(&format!("decompressed.{i}"), &[ni, k], wd)?;
                let idx0 = t(&format!("mask_index0.{i}"), &[ni * k / 2], DType::I64)?;
                let idx1 = t(&format!("mask_index1.{i}"), &[ni * k / 2], DType::I64)?;
                drop(idx0);
                drop(idx1);
                shards.push(dense);
            }
            let dense = if shards.len() > 1 {
                rt.set_op("compressed_tensors.combine_shards");
                let combined = t("weight", &[n, k], wd)?;
                drop(shards);
                combined
            } else {
                shards.pop().expect("one shard")
            };
            drop(std::mem::replace(&mut self.weight, dense));
            drop(compressed);
            drop(bitmask);
        }
        if self.scheme.fp8_channel == Some(false) {
            rt.set_op("w8a8_utils.convert_to_channelwise");
            let channel = t("weight_scale", &[n, 1], DType::F32)?;
            drop(std::mem::replace(&mut self.weight_scale, channel));
        }
        if self.scheme.fp8_channel.is_none() {
            rt.set_op("sparse24.negative_zero_fill");
            let mask = t("weight_eq_neg_zero", &[n, k], DType::U8)?;
            drop(mask);
        }
        rt.set_op("cutlass.cutlass_sparse_compress");
        let (nzs_shape, meta_shape) = compressed_shapes(n, k, wd);
        let meta = t("meta", &meta_shape, DType::U8)?;
        let nzs = t("weight_nzs", &nzs_shape, wd)?;
        drop(std::mem::replace(&mut self.weight, nzs));
        self.meta = Some(meta);
        self.compressed = true;
        Ok(())
    }

    /// `apply_weights` (0.15.1 compressed_tensors_24.py L247-291): fp8 quantizes the input per
    /// token (`QuantFP8` dynamic per token: `scaled_fp8_quant` allocates the fp8 `[m, k]` then
    /// its F32 `[m, 1]` scales), then `cutlass_scaled_sparse_mm` allocates the output
    /// `[m, n]` in the activation dtype (_custom_ops.py L953-997 at 0.15.1); the GEMM's
    /// workspace (`gemm_op.get_workspace_size`: 0 for these TMA warp-specialized kernels) is
    /// not allocated. On the host the product of the dense weight (each output row's sum in
    /// f32, as the tensor cores accumulate), then `scale_a · (scale_b · acc)` rounded to the
    /// activation dtype (`ScaledEpilogue`; ones for 16-bit). `rows`: the shards' columns, each
    /// one contiguous block of the output.
    pub fn forward(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        act: DType,
        rows: &[usize],
    ) -> Result<Tensor> {
        rt.check_cancel()?;
        let (m, k, n) = (x.rows(), x.cols(), self.out_features);
        if k != self.in_features {
            return Err(Error::Request(format!(
                "{name}: input has {k} features but the 2:4 weight {} expects {}",
                self.weight.name, self.in_features
            )));
        }
        if !self.compressed {
            return Err(Error::Request(format!(
                "{name}: the 2:4 weight {} was not compressed (process_weights_after_loading did not run)",
                self.weight.name
            )));
        }
        let cpu = rt.backend() == Backend::Cpu;
        let host = || {
            self.host
                .as_ref()
                .ok_or_else(|| Error::Request(format!("{name}: the 2:4 weight has no host values")))
        };
        let mut x_scales = Vec::new();
        let mut quantized = None;
        if self.scheme.fp8_channel.is_some() {
            rt.set_op("fp8.scaled_fp8_quant");
            let mut qinput = rt.tensor(
                format!("{name}.qinput"),
                Category::Activation,
                &[m, k],
                DType::F8E4M3,
            )?;
            let x_scale = rt.tensor(
                format!("{name}.x_scale"),
                Category::Activation,
                &[m, 1],
                DType::F32,
            )?;
            let mut xv = Vec::new();
            if cpu {
                // `dynamic_per_token_scaled_fp8_quant`: each row at max|row| / 448.
                let q = qinput.u8_mut();
                for (row, qr) in x.f32().chunks_exact(k).zip(q.chunks_exact_mut(k)) {
                    let s = super::fp8::dynamic_scale(row);
                    super::fp8::quantize_with_scale(row, s, qr);
                    x_scales.push(s);
                }
                xv = q.iter().map(|&c| super::fp8::decode(c)).collect();
            }
            quantized = Some((qinput, x_scale, xv));
        }
        rt.set_op("cutlass.cutlass_scaled_sparse_mm");
        let mut out =
            rt.tensor_for_overwrite(format!("{name}.out"), Category::Activation, &[m, n], act)?;
        if cpu {
            let h = host()?;
            let w = &h.values[..];
            let decode = |r: std::ops::Range<usize>, buf: &mut [f32]| {
                buf.copy_from_slice(&w[r.start * k..r.end * k]);
            };
            let xv = quantized.as_ref().map_or(x.f32(), |(_, _, v)| &v[..]);
            let o = out.f32_mut();
            if self.scheme.fp8_channel.is_none() {
                super::host_decoded_matmul(rt, xv, (m, k), rows, o, decode, |a| act.round(a))?;
            } else {
                super::host_decoded_matmul(rt, xv, (m, k), rows, o, decode, |a| a)?;
                let (mut at, mut c0) = (0, 0);
                for &nr in rows {
                    for (r, row) in o[at..at + m * nr].chunks_exact_mut(nr).enumerate() {
                        for (c, v) in row.iter_mut().enumerate() {
                            *v = act.round(x_scales[r] * (h.scales[c0 + c] * *v));
                        }
                    }
                    at += m * nr;
                    c0 += nr;
                }
            }
        }
        drop(quantized);
        Ok(out)
    }
}

/// What vramscope reproduces 2:4 checkpoints for: vLLM 0.11 and 0.15 on a Hopper GPU.
/// `arch`: the simulated GPU's architecture and name. Other releases: `Err` with vLLM's own
/// refusal (`release_refusal`); other GPUs: vLLM's capability check.
pub fn check(scheme: Sparse24, release: &str, arch: Option<(&str, &str)>) -> Result<()> {
    let what = format!("a {} checkpoint", scheme.label());
    let minor = release
        .strip_prefix("0.")
        .and_then(|r| r.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    match minor {
        Some(11 | 15) => {}
        Some(m) if m >= 19 => {
            return Err(Error::Request(format!(
                "{what} with --vllm {release}: {}",
                release_refusal(release).unwrap_or_default()
            )))
        }
        _ => {
            return Err(Error::Request(format!(
                "{what} with --vllm {release}: vramscope reproduces CompressedTensors24 under vLLM 0.11 and 0.15 (V1, Hopper); use --vllm 0.15"
            )))
        }
    }
    if let Some((arch, gpu)) = arch {
        match arch {
            "Hopper" => {}
            "Blackwell" => {
                return Err(Error::Request(format!(
                    "{what} on {gpu} (Blackwell): vLLM's capability checks pass (get_min_capability 90, cutlass_sparse_scaled_mm_supported for 9.0 and above) but its CUTLASS 2:4 kernels are the sm90 ones (cutlass_scaled_sparse_mm_sm90, cutlass_sparse_compress_sm90); vramscope models them on Hopper only (H100, H200)"
                )))
            }
            _ => {
                return Err(Error::Request(format!(
                    "{what} on {gpu} ({arch}): vLLM would not start: \"RuntimeError: Quantization scheme is not supported for the current GPU. Min capability: 90.\" (_check_scheme_supported, compressed_tensors.py L335-361 at 0.15.1, called by get_scheme L784; CompressedTensors24.get_min_capability is 90, \"Only cutlass 3.x kernels are implemented so far\", compressed_tensors_24.py L73-76); on an H100 or H200 it runs"
                )))
            }
        }
    }
    Ok(())
}

/// vLLM's own refusal of a 2:4 checkpoint where the release has one: 0.19 (and the releases
/// after it that keep the stub) raise from `CompressedTensors24.__init__`, which `get_scheme`
/// calls for every 2:4 layer. `None` for the releases that run it.
pub fn release_refusal(release: &str) -> Option<String> {
    let minor = release
        .strip_prefix("0.")
        .and_then(|r| r.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())?;
    (minor >= 19).then(|| {
        "vLLM would not start: \"NotImplementedError: Sparse24 models are no longer supported by vLLM\" (CompressedTensors24.__init__, model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_24.py L27 at 0.19.0; releases after 0.19 not checked here)".to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmask_round_trip_keeps_two_of_every_four() {
        let (n, k) = (2, 16);
        let mut w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919) % 23) as f32 - 11.0)
            .collect();
        prune(&mut w, k);
        assert!(first_dense_group(&w, n, k).is_none());
        let (kept, mask) = encode_bitmask(&w, n, k);
        assert_eq!(kept.len(), n * k / 2);
        assert_eq!(mask.len(), n * k / 8);
        let values: Vec<f32> = kept.iter().map(|&i| w[i]).collect();
        assert_eq!(decode_bitmask(&values, &mask, n, k).unwrap(), w);
    }

    #[test]
    fn bitmask_bits_are_little_endian() {
        // Row 0 keeps inputs 0 and 3 of the first group, 5 and 6 of the second: 0b0110_1001.
        let mask = [0b0110_1001u8];
        let d = decode_bitmask(&[1.0, 2.0, 3.0, 4.0], &mask, 1, 8).unwrap();
        assert_eq!(d, [1.0, 0.0, 0.0, 2.0, 0.0, 3.0, 4.0, 0.0]);
    }

    #[test]
    fn a_group_with_three_bits_is_refused() {
        let e = decode_bitmask(&[1.0; 4], &[0b0000_0111], 1, 8).unwrap_err();
        assert!(e.contains("row 0, inputs 0..4 set 3 bits"), "{e}");
    }

    #[test]
    fn cutlass_shapes_pad_metadata_to_its_atom() {
        // Llama-3.1-8B's gate_up: no padding.
        assert_eq!(
            compressed_shapes(28672, 4096, DType::BF16),
            ([28672, 2048], [28672, 512])
        );
        // 100 rows, 96 inputs: metadata rows to 64, inputs to 128.
        assert_eq!(
            compressed_shapes(100, 96, DType::F8E4M3),
            ([100, 48], [128, 16])
        );
    }
}

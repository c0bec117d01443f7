//! Where a model's weights come from: synthetic (seeded, any shape) or a safetensors file
//! (memory-mapped, validated against config.json before anything is allocated).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use safetensors::{Dtype, SafeTensors};

use crate::base::error::{Error, Result};
use crate::device::tensor::DType;

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDtype {
    F32,
    F16,
    BF16,
    /// bitsandbytes LLM.int8 `CB` (row-wise absmax int8 weight, with a `.SCB` sibling).
    I8,
}

impl StoredDtype {
    pub fn size_bytes(self) -> usize {
        match self {
            StoredDtype::F32 => 4,
            StoredDtype::I8 => 1,
            _ => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::F16 => "F16",
            StoredDtype::BF16 => "BF16",
            StoredDtype::I8 => "I8",
        }
    }
}

pub trait WeightSource {
    /// The file or preset, for messages.
    fn origin(&self) -> String;
    /// Reads one tensor, converted to f32 (values exact: F16/BF16 widen losslessly).
    fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;
    /// A tensor stored as F16 or BF16 (`name` of `shape`): its bytes as stored, for a copy
    /// to the GPU without converting (`None` when it is stored otherwise, or not here).
    fn raw_16bit(&self, _name: &str, _shape: &[usize]) -> Option<(&[u8], DType)> {
        None
    }
    /// A preset's tensor a GPU can make itself (`device::synth`): its stream, whether it is a
    /// norm, the dtype its values are rounded to; geometry left at zero for the loader to set.
    /// `None` for weights that come from files.
    fn synthetic(&self, _name: &str) -> Option<crate::device::synth::SynthFill> {
        None
    }
    /// Bytes `name` occupies in the source as stored (with its `.SCB` for int8); 0 when
    /// nothing is read from a file.
    fn stored_bytes(&self, _name: &str) -> u64 {
        0
    }
    /// Whether the values are here (false for a config.json without weights: dry runs only).
    fn has_weights(&self) -> bool {
        true
    }
    /// Whether `name` is stored pre-quantized as LLM.int8 (`CB` + `.SCB`).
    fn is_int8(&self, _name: &str) -> bool {
        false
    }
    /// Whether the linear weight `name` is one a bitsandbytes checkpoint keeps in 16 bits
    /// (its `llm_int8_skip_modules`, matched as vLLM matches them: `quant::bnb_skip`).
    fn bnb_skipped(&self, _name: &str) -> bool {
        false
    }
    /// A multimodal checkpoint whose quantization config leaves a tower or projector layer to
    /// be quantized: the refusal naming the file and the layer (`tower_quant`).
    fn quantized_tower(&self) -> Option<QuantizedTower> {
        None
    }
    /// The quant state of `name` when the checkpoint stores it as bitsandbytes 4-bit.
    fn bnb4(&self, _name: &str) -> Option<crate::quant::bnb4::Bnb4Meta> {
        None
    }
    /// Reads a pre-quantized bitsandbytes 4-bit weight's stored parts.
    fn read_bnb4(&self, name: &str) -> Result<crate::quant::bnb4::Bnb4Parts> {
        Err(Error::model(
            self.origin(),
            format!("tensor {name} is not stored as bitsandbytes 4-bit"),
        ))
    }
    /// A pre-quantized per-tensor fp8 checkpoint's scheme and dtype (`None` otherwise).
    fn stored_fp8(&self) -> Option<crate::quant::fp8::StoredFp8> {
        None
    }
    /// Reads a linear weight of an fp8 checkpoint as stored: its float8_e4m3fn codes
    /// `shape`, its `weight_scale` (one, or one per output row for channel-wise weights) and,
    /// under the static scheme, its `input_scale` (each checked finite and above 0).
    fn read_fp8(&self, name: &str, _shape: &[usize]) -> Result<(Vec<u8>, Vec<f32>, Option<f32>)> {
        Err(Error::model(
            self.origin(),
            format!("tensor {name} is not stored as fp8"),
        ))
    }
    /// A per-tensor fp8 linear weight's stored `weight_scale` alone (checked as `read_fp8`
    /// checks it), for a run without compute that needs the value (ModelOpt FP8); `None`
    /// where the source holds no tensors (a config alone).
    fn read_fp8_weight_scale(&self, _name: &str) -> Result<Option<f32>> {
        Ok(None)
    }
    /// Reads a linear weight of a block-wise fp8 checkpoint as stored: its float8_e4m3fn
    /// codes `shape` and its `weight_scale_inv` grid, row-major (each checked finite and
    /// above 0).
    fn read_fp8_block(&self, name: &str, _shape: &[usize]) -> Result<(Vec<u8>, Vec<f32>)> {
        Err(Error::model(
            self.origin(),
            format!("tensor {name} is not stored as block-wise fp8"),
        ))
    }
    /// The NVFP4 flavor of the checkpoint's quantized linears, when it has one.
    fn nvfp4(&self) -> Option<crate::quant::nvfp4::Flavor> {
        None
    }
    /// The stored NVFP4 tensors of the `[n, k]` linear `name` (its `….weight` name in the
    /// config's naming), shapes, dtypes and scales checked; their values when `data` is set.
    fn read_nvfp4(
        &self,
        name: &str,
        _n: usize,
        _k: usize,
        _data: bool,
    ) -> Result<crate::quant::nvfp4::Parts> {
        Err(Error::model(
            self.origin(),
            format!("tensor {name} is not stored as NVFP4"),
        ))
    }
    /// The 2:4 scheme of the checkpoint's linears, when it is 2:4 sparse.
    fn sparse24(&self) -> Option<crate::quant::sparse24::Sparse24> {
        None
    }
    /// The stored 2:4 linear `name` (`[n, k]`, its `….weight` name in the config's naming):
    /// shapes, dtypes, scales and pattern checked; the dense values when `data` is set.
    fn read_sparse24(
        &self,
        name: &str,
        _n: usize,
        _k: usize,
        _data: bool,
    ) -> Result<crate::quant::sparse24::Parts> {
        Err(Error::model(
            self.origin(),
            format!("tensor {name} is not stored 2:4 sparse"),
        ))
    }
    /// The AWQ / GPTQ format of the checkpoint's quantized linears, when it has one.
    fn packed4(&self) -> Option<crate::quant::marlin::Format> {
        None
    }
    /// The stored AWQ / GPTQ tensors of the `[n, k]` linear `name` (its `….weight` name in
    /// the config's naming), shapes and dtypes checked; their values when `data` is set.
    fn read_packed4(
        &self,
        name: &str,
        _n: usize,
        _k: usize,
        _data: bool,
    ) -> Result<crate::quant::marlin::Parts> {
        Err(Error::model(
            self.origin(),
            format!("tensor {name} is not stored as AWQ or GPTQ"),
        ))
    }
    /// Reads a U8 tensor as stored (gpt-oss's MXFP4 `*_blocks` and `*_scales`), checked to
    /// hold `shape`.
    fn read_u8(&self, name: &str, _shape: &[usize]) -> Result<Vec<u8>> {
        Err(Error::model(
            self.origin(),
            format!("tensor {name} is not stored as U8 here"),
        ))
    }
    /// Reads a pre-quantized LLM.int8 weight as stored: `CB` `[n, k]` and `SCB` `[n]`.
    fn read_int8(&self, name: &str, _shape: &[usize]) -> Result<(Vec<i8>, Vec<f32>)> {
        Err(Error::model(
            self.origin(),
            format!("tensor {name} is not stored as int8"),
        ))
    }
}

/// Seeded synthetic weights: Hugging Face's initialisation (normal, std 0.02; norms at 1),
/// rounded to the stored dtype so a file written from them reads back identically.
pub struct SyntheticWeights {
    pub preset: String,
    pub seed: u64,
    pub dtype: StoredDtype,
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn round_to(dtype: StoredDtype, x: f32) -> f32 {
    match dtype {
        StoredDtype::F32 => x,
        StoredDtype::F16 => half::f16::from_f32(x).to_f32(),
        StoredDtype::BF16 => half::bf16::from_f32(x).to_f32(),
        StoredDtype::I8 => x,
    }
}

/// `round_to` of every value in place (the vectorised conversion; the same values).
pub fn round_slice_to(dtype: StoredDtype, xs: &mut [f32]) {
    match dtype {
        StoredDtype::F16 => DType::F16.round_slice(xs),
        StoredDtype::BF16 => DType::BF16.round_slice(xs),
        StoredDtype::F32 | StoredDtype::I8 => {}
    }
}

/// A word of the stream as a uniform in [0, 1): its top 24 bits times 2⁻²⁴, as rand's
/// `StandardUniform` makes an f32 from `next_u32`.
fn unit_f32(w: u32) -> f32 {
    (w >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// Whether a synthetic tensor is a norm's scale, drawn around 1 rather than 0: every
/// `*norm.weight`, and Llama 4's vision tower's `layernorm_pre.weight` and
/// `layernorm_post.weight` (which would otherwise scale its embeddings and output by ~0.02).
fn is_norm_scale(name: &str) -> bool {
    name.ends_with("norm.weight")
        || name.ends_with(".layernorm_pre.weight")
        || name.ends_with(".layernorm_post.weight")
}

/// Values per chunk when synthetic weights are generated on several threads.
const SYNTHETIC_CHUNK: usize = 1 << 16;

impl SyntheticWeights {
    /// The tensor's values. Each value draws three words of one ChaCha8 stream per tensor;
    /// chunks jump to their place in that stream, so the values are the same however many
    /// threads make them (an 8B preset is ~8e9 values: single-threaded, minutes).
    pub fn generate(&self, name: &str, numel: usize) -> Vec<f32> {
        let seed = self.seed ^ fnv1a(name);
        let is_norm = is_norm_scale(name);
        let mut out = vec![0f32; numel];
        let dtype = self.dtype;
        let fill = |start: usize, chunk: &mut [f32]| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            rng.set_word_pos(3 * start as u128);
            // The stream's words in bulk (the same words, in order, as one `next_u32` per
            // draw); each becomes a uniform in [0, 1) exactly as `random::<f32>()` makes it.
            const BATCH: usize = 1024;
            let mut words = [0u32; 3 * BATCH];
            for out in chunk.chunks_mut(BATCH) {
                let words = &mut words[..3 * out.len()];
                rng.fill(words);
                for (v, w) in out.iter_mut().zip(words.chunks_exact(3)) {
                    // Sum of uniforms: cheap, bell-shaped, std 0.02 (Irwin-Hall with 3 terms).
                    let u: f32 = w.iter().map(|&x| unit_f32(x) - 0.5).sum::<f32>() * 0.04;
                    *v = if is_norm { 1.0 + u } else { u };
                }
                round_slice_to(dtype, out);
            }
        };
        if numel <= SYNTHETIC_CHUNK {
            fill(0, &mut out);
            return out;
        }
        let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
        let per_thread = numel.div_ceil(threads).next_multiple_of(SYNTHETIC_CHUNK);
        std::thread::scope(|s| {
            for (i, chunk) in out.chunks_mut(per_thread).enumerate() {
                let fill = &fill;
                s.spawn(move || fill(i * per_thread, chunk));
            }
        });
        out
    }
}

impl WeightSource for SyntheticWeights {
    fn origin(&self) -> String {
        format!(
            "preset:{} (synthetic weights, seed {})",
            self.preset, self.seed
        )
    }
    fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.generate(name, shape.iter().product()))
    }
    fn read_u8(&self, name: &str, shape: &[usize]) -> Result<Vec<u8>> {
        Ok(crate::quant::mxfp4::synthetic_bytes(
            self.seed,
            name,
            shape.iter().product(),
        ))
    }
    fn synthetic(&self, name: &str) -> Option<crate::device::synth::SynthFill> {
        let rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ fnv1a(name));
        let seed = rng.get_seed();
        let key = std::array::from_fn(|i| {
            u32::from_le_bytes([
                seed[4 * i],
                seed[4 * i + 1],
                seed[4 * i + 2],
                seed[4 * i + 3],
            ])
        });
        let round = match self.dtype {
            StoredDtype::F16 => Some(DType::F16),
            StoredDtype::BF16 => Some(DType::BF16),
            StoredDtype::F32 | StoredDtype::I8 => None,
        };
        Some(crate::device::synth::SynthFill {
            key,
            is_norm: is_norm_scale(name),
            round,
            offset: 0,
            count: 0,
            elem0: 0,
            row_len: 1,
            stride: 1,
            valid_rows: u64::MAX,
        })
    }
}

/// Maps a model file read-only: a regular file only (a FIFO or a device is named as what it
/// is); a missing file is a model error naming it.
pub(crate) fn map_model_file(path: &Path) -> Result<memmap2::Mmap> {
    let (file, _) = crate::base::fsguard::open_regular(path, "file")?;
    // SAFETY: the map is read-only; a file changed under us could only give wrong numbers,
    // and every offset is checked against the map's length before use.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))
}

/// A single `.safetensors` file, memory-mapped.
pub struct SafetensorsFile {
    pub path: PathBuf,
    mmap: memmap2::Mmap,
    index: TensorIndex,
    /// Tensors stored as U8 (bitsandbytes 4-bit codes, absmax and quant-state blobs).
    u8_names: std::collections::HashSet<String>,
    /// Tensors stored as F8_E4M3 (a pre-quantized fp8 checkpoint's linear weights).
    f8_names: std::collections::HashSet<String>,
    /// Tensors stored as I32 (AWQ / GPTQ `qweight`, `qzeros`, `g_idx`).
    i32_names: std::collections::HashSet<String>,
}

fn stored_dtype(d: Dtype) -> Option<StoredDtype> {
    match d {
        Dtype::F32 => Some(StoredDtype::F32),
        Dtype::F16 => Some(StoredDtype::F16),
        Dtype::BF16 => Some(StoredDtype::BF16),
        Dtype::I8 => Some(StoredDtype::I8),
        _ => None,
    }
}

impl SafetensorsFile {
    /// Opens and validates the header: lengths, offsets, dtypes. Reads no tensor data.
    pub fn open(path: &Path) -> Result<Self> {
        let mmap = map_model_file(path)?;
        let len = mmap.len();
        if len < 8 {
            return Err(Error::model(
                path,
                format!("truncated: {len} bytes, too short for a safetensors header"),
            ));
        }
        let index = parse_header(&mmap, path)?;
        // parse_header has validated the file, so this second read of the header succeeds.
        let names_of = |dtype: Dtype| {
            SafeTensors::deserialize(&mmap)
                .map(|st| {
                    st.tensors()
                        .into_iter()
                        .filter(|(_, v)| v.dtype() == dtype)
                        .map(|(n, _)| n)
                        .collect()
                })
                .unwrap_or_default()
        };
        let (u8_names, f8_names) = (names_of(Dtype::U8), names_of(Dtype::F8_E4M3));
        let i32_names = names_of(Dtype::I32);
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            index,
            u8_names,
            f8_names,
            i32_names,
        })
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &String> {
        self.index.keys()
    }

    /// The stored dtype (`None` when it is not a weight dtype) and shape of a tensor.
    pub fn info(&self, name: &str) -> Option<(Option<StoredDtype>, &[usize])> {
        self.index.get(name).map(|(d, s, _)| (*d, s.as_slice()))
    }

    /// A tensor's stored bytes, checked to hold `dtype` and `shape`.
    pub fn raw(&self, name: &str, dtype: StoredDtype, shape: &[usize]) -> Result<&[u8]> {
        let (found_dtype, found, range) = self
            .index
            .get(name)
            .ok_or_else(|| Error::model(&self.path, format!("tensor {name} is missing")))?;
        if found != shape {
            return Err(Error::model(
                &self.path,
                format!("tensor {name} has shape {found:?}, expected {shape:?}"),
            ));
        }
        if *found_dtype != Some(dtype) {
            return Err(Error::model(
                &self.path,
                format!(
                    "tensor {name} is stored as {}, expected {}",
                    found_dtype.map_or("a non-weight dtype", StoredDtype::name),
                    dtype.name()
                ),
            ));
        }
        Ok(&self.mmap[range.clone()])
    }

    /// Whether a tensor is stored as F8_E4M3.
    pub fn is_f8_e4m3(&self, name: &str) -> bool {
        self.f8_names.contains(name)
    }

    /// Whether a tensor is stored as U8.
    pub fn is_u8(&self, name: &str) -> bool {
        self.u8_names.contains(name)
    }

    /// A U8 tensor's shape and bytes; `None` when absent or not U8.
    pub fn raw_u8(&self, name: &str) -> Option<(&[usize], &[u8])> {
        if !self.is_u8(name) {
            return None;
        }
        self.index
            .get(name)
            .map(|(_, s, r)| (s.as_slice(), &self.mmap[r.clone()]))
    }

    /// A float8_e4m3fn weight's codes (safetensors `F8_E4M3`, one byte an element), checked
    /// to hold `shape`; any other stored dtype is refused naming the tensor.
    pub fn raw_f8_e4m3(&self, name: &str, shape: &[usize]) -> Result<&[u8]> {
        let (_, found, range) = self
            .index
            .get(name)
            .ok_or_else(|| Error::model(&self.path, format!("tensor {name} is missing")))?;
        if !self.f8_names.contains(name) {
            return Err(Error::model(
                &self.path,
                format!(
                    "tensor {name} is stored as {}, expected F8_E4M3 (quantization_config says fp8)",
                    self.stored_dtype_name(name)
                ),
            ));
        }
        if found != shape {
            return Err(Error::model(
                &self.path,
                format!("tensor {name} has shape {found:?}, expected {shape:?}"),
            ));
        }
        Ok(&self.mmap[range.clone()])
    }

    /// An I32 tensor's values (AWQ / GPTQ packed words, `g_idx`), checked to hold `shape`;
    /// missing or stored otherwise, refused naming the tensor.
    pub fn raw_i32(&self, name: &str, shape: &[usize]) -> Result<Vec<i32>> {
        let (_, found, range) = self
            .index
            .get(name)
            .ok_or_else(|| Error::model(&self.path, format!("tensor {name} is missing")))?;
        if !self.i32_names.contains(name) {
            return Err(Error::model(
                &self.path,
                format!(
                    "tensor {name} is stored as {}, expected I32",
                    self.stored_dtype_name(name)
                ),
            ));
        }
        if found != shape {
            return Err(Error::model(
                &self.path,
                format!("tensor {name} has shape {found:?}, expected {shape:?}"),
            ));
        }
        Ok(self.mmap[range.clone()]
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// A tensor's stored bytes, whatever its dtype (compressed-tensors' I64 `weight_shape`).
    pub fn raw_bytes(&self, name: &str) -> Option<&[u8]> {
        self.index.get(name).map(|(_, _, r)| &self.mmap[r.clone()])
    }

    /// Whether a tensor is stored as I32.
    pub fn is_i32(&self, name: &str) -> bool {
        self.i32_names.contains(name)
    }

    /// A per-tensor fp8 scale (`weight_scale`, `input_scale`): F32 `[]` or `[1]`, finite and
    /// above 0 (`fp8::checked_scale`); missing or otherwise stored, refused naming the tensor.
    pub fn fp8_scale(&self, name: &str) -> Result<f32> {
        let (dtype, shape) = self
            .info(name)
            .ok_or_else(|| Error::model(&self.path, format!("tensor {name} is missing")))?;
        if dtype != Some(StoredDtype::F32) {
            return Err(Error::model(
                &self.path,
                format!(
                    "tensor {name} is stored as {}, expected F32",
                    self.stored_dtype_name(name)
                ),
            ));
        }
        let shape = shape.to_vec();
        let values = floats_to_f32(StoredDtype::F32, self.raw(name, StoredDtype::F32, &shape)?);
        crate::quant::fp8::checked_scale(&self.path, name, &shape, &values)
    }

    /// A channel-wise fp8 `weight_scale` of `rows` output rows (`[rows, 1]` or `[rows]`),
    /// stored as F32, BF16 or F16 (LLM Compressor writes the checkpoint dtype; vLLM's
    /// `ChannelQuantScaleParameter` holds f32), each checked finite and above 0.
    pub fn fp8_channel_scales(&self, name: &str, rows: usize) -> Result<Vec<f32>> {
        let (dtype, shape) = self
            .info(name)
            .ok_or_else(|| Error::model(&self.path, format!("tensor {name} is missing")))?;
        if shape != [rows, 1] && shape != [rows] {
            return Err(Error::model(
                &self.path,
                format!("tensor {name} has shape {shape:?}, expected [{rows}, 1] (one scale per output channel)"),
            ));
        }
        let dtype = match dtype {
            Some(d @ (StoredDtype::F32 | StoredDtype::BF16 | StoredDtype::F16)) => d,
            _ => {
                return Err(Error::model(
                    &self.path,
                    format!(
                        "tensor {name} is stored as {}, expected F32, BF16 or F16",
                        self.stored_dtype_name(name)
                    ),
                ))
            }
        };
        let shape = shape.to_vec();
        let values = floats_to_f32(dtype, self.raw(name, dtype, &shape)?);
        for &v in &values {
            crate::quant::fp8::checked_scale(&self.path, name, &[], &[v])?;
        }
        Ok(values)
    }

    /// The dtype a tensor's header entry names, as written there (for error messages; parses
    /// the header again, which only the error path does).
    pub fn stored_dtype_name(&self, name: &str) -> String {
        SafeTensors::deserialize(&self.mmap)
            .ok()
            .and_then(|st| st.tensor(name).ok().map(|v| format!("{:?}", v.dtype())))
            .unwrap_or_else(|| "unknown".into())
    }

    /// Stored bytes of one tensor (0 when absent).
    pub fn tensor_bytes(&self, name: &str) -> u64 {
        self.index.get(name).map_or(0, |(_, _, r)| r.len() as u64)
    }

    pub fn total_bytes(&self) -> u64 {
        self.index.values().map(|(_, _, r)| r.len() as u64).sum()
    }
}

/// Element size of a safetensors dtype name, for checking a header before trusting it.
fn st_dtype_size(d: &str) -> Option<u64> {
    Some(match d {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// Checks every tensor entry of a safetensors header against the data actually present,
/// naming the tensor at fault: dtype, shape × dtype = byte size, offsets inside the data,
/// no overlaps.
fn check_header_entries(header: &[u8], data_len: u64, path: &Path) -> Result<()> {
    let HeaderEntries(map) = serde_json::from_slice(header)
        .map_err(|e| Error::model(path, format!("header is not valid JSON: {e}")))?;
    let mut spans: Vec<(u64, u64, &str)> = Vec::with_capacity(map.len());
    for (name, entry) in &map {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: String| Error::model(path, format!("tensor {name}: {what}"));
        let dtype = entry["dtype"]
            .as_str()
            .ok_or_else(|| bad("no dtype".into()))?;
        let size = st_dtype_size(dtype).ok_or_else(|| bad(format!("unknown dtype {dtype}")))?;
        let shape = entry["shape"]
            .as_array()
            .ok_or_else(|| bad("no shape".into()))?;
        let mut numel = 1u64;
        let mut dims = Vec::with_capacity(shape.len().min(8));
        for d in shape {
            let d = d
                .as_u64()
                .ok_or_else(|| bad("shape is not a list of sizes".into()))?;
            dims.push(d);
            numel = numel
                .checked_mul(d)
                .ok_or_else(|| bad(format!("shape {dims:?}... overflows")))?;
        }
        let offs = entry["data_offsets"]
            .as_array()
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
            .ok_or_else(|| bad("data_offsets is not [start, end]".into()))?;
        let (start, end) = offs;
        if end < start {
            return Err(bad(format!("data_offsets [{start}, {end}] run backwards")));
        }
        if end > data_len {
            return Err(bad(format!(
                "data_offsets [{start}, {end}] run past the end of the data ({data_len} bytes): truncated file or bogus offset"
            )));
        }
        let want = numel.checked_mul(size);
        if want != Some(end - start) {
            return Err(bad(format!(
                "{dtype} {dims:?} needs {} bytes but data_offsets [{start}, {end}] hold {}",
                want.map_or("too many".into(), |w| w.to_string()),
                end - start
            )));
        }
        spans.push((start, end, name));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(Error::model(
                path,
                format!("tensor {}: data_offsets overlap tensor {}", w[1].2, w[0].2),
            ));
        }
    }
    let data_end = spans.iter().map(|s| s.1).max().unwrap_or(0);
    check_no_trailing_bytes(path, data_end, 0, data_len, "safetensors")?;
    Ok(())
}

/// Both loaders' rule for bytes after the last tensor's data: none beyond the format's own
/// padding (`pad_to`: GGUF's alignment; 1 for safetensors). Extra bytes mean the header
/// lists fewer tensors than were written (or two files were joined), so the file is refused.
pub(crate) fn check_no_trailing_bytes(
    path: &Path,
    data_end: u64,
    pad_to: u64,
    data_len: u64,
    format: &str,
) -> Result<()> {
    let padded = data_end.div_ceil(pad_to.max(1)) * pad_to.max(1);
    if data_len > padded {
        return Err(Error::model(
            path,
            format!(
                "{} trailing bytes after the last tensor's data: the {format} header accounts for {data_end} bytes of data{}, the file holds {data_len} (a tensor missing from the header, or bytes appended)",
                data_len - padded,
                if padded != data_end {
                    format!(" (padded to {padded})")
                } else {
                    String::new()
                }
            ),
        ));
    }
    Ok(())
}

/// A safetensors header's entries in file order, counted while they are parsed so a header
/// of a million entries stops at the bound instead of being built in memory.
struct HeaderEntries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for HeaderEntries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = HeaderEntries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<HeaderEntries, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    if out.len() as u64 > crate::base::limits::MAX_TENSORS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {} tensor entries (the bound this tool reads)",
                            crate::base::limits::MAX_TENSORS
                        )));
                    }
                    out.push((k, m.next_value()?));
                }
                Ok(HeaderEntries(out))
            }
        }
        d.deserialize_map(Entries)
    }
}

/// Validates a whole safetensors file held in `buf` and lists its tensors: name → (dtype,
/// shape, byte range in `buf`). The header's claims are checked against `buf`'s length.
pub fn parse_header(buf: &[u8], path: &Path) -> Result<TensorIndex> {
    let len = buf.len() as u64;
    if len < 8 {
        return Err(Error::model(
            path,
            format!("truncated: {len} bytes, too short for a safetensors header"),
        ));
    }
    let header_len = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
    if header_len > len - 8 {
        return Err(Error::model(
            path,
            format!("header length {header_len} runs past the end of the file ({len} bytes): truncated or not safetensors"),
        ));
    }
    // Checked first so a huge claimed header is never parsed: real headers are tens of KiB
    // (100k tensors fit in ~10 MiB); safetensors' own limit is 100 MB.
    if header_len > MAX_HEADER_BYTES {
        return Err(Error::model(
            path,
            format!(
                "header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit this tool reads"
            ),
        ));
    }
    let header_end = 8 + header_len as usize;
    check_header_entries(&buf[8..header_end], len - header_end as u64, path)?;
    let st = SafeTensors::deserialize(buf).map_err(|e| Error::model(path, describe_st_error(e)))?;
    let mut index = HashMap::new();
    for (name, view) in st.tensors() {
        // Other dtypes (bitsandbytes' U8 `weight_format`, say) are listed but never read as
        // weights; reading one is an error naming it.
        let dtype = stored_dtype(view.dtype());
        let start = view.data().as_ptr() as usize - buf.as_ptr() as usize;
        let end = start + view.data().len();
        index.insert(name, (dtype, view.shape().to_vec(), start..end));
    }
    Ok(index)
}

/// Largest safetensors JSON header parsed.
const MAX_HEADER_BYTES: u64 = 16 << 20;

/// name → (dtype if readable, shape, byte range)
pub type TensorIndex = HashMap<String, (Option<StoredDtype>, Vec<usize>, std::ops::Range<usize>)>;

fn describe_st_error(e: safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::InvalidHeaderLength => "header length runs past the end of the file".into(),
        E::HeaderTooSmall => "file too small for a safetensors header".into(),
        E::InvalidHeaderDeserialization(msg) => {
            format!("header is not valid safetensors JSON ({msg}); unknown dtype?")
        }
        E::InvalidHeader(msg) => format!("header is not valid UTF-8 JSON ({msg})"),
        E::MetadataIncompleteBuffer => {
            "truncated: the header describes more tensor data than the file holds".into()
        }
        E::InvalidOffset(name) => format!("tensor {name}: data offsets overlap or leave gaps"),
        E::TensorInvalidInfo => "a tensor's byte size does not match its dtype and shape".into(),
        other => format!("not a valid safetensors file: {other}"),
    }
}

/// Converts stored float bytes to f32 (F16/BF16 widen exactly).
pub fn floats_to_f32(dtype: StoredDtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        StoredDtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        StoredDtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        StoredDtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        StoredDtype::I8 => bytes.iter().map(|&b| b as i8 as f32).collect(),
    }
}

#[cfg(test)]
mod synthetic_tests {
    use super::*;

    /// What the GPU makes (the kernel's host reference) is what the host makes: a whole
    /// tensor, a row-parallel slice, a column-parallel slice, and zero padding rows.
    #[test]
    fn the_device_fill_makes_the_hosts_values() {
        for (dtype, name) in [
            (StoredDtype::BF16, "model.layers.3.mlp.down_proj.weight"),
            (StoredDtype::F16, "model.layers.0.input_layernorm.weight"),
        ] {
            let w = SyntheticWeights {
                preset: "tiny".into(),
                seed: 5,
                dtype,
            };
            let (n, k) = (24usize, 40usize);
            let host = w.generate(name, n * k);
            let base = w.synthetic(name).unwrap();
            let whole = crate::device::synth::SynthFill {
                count: (n * k) as u64,
                row_len: k as u64,
                stride: k as u64,
                ..base.clone()
            };
            assert_eq!(crate::device::synth::reference_fill(&whole), host);
            // Rows 5..9, columns 8..28 of the [24, 40] tensor.
            let cut = crate::device::synth::SynthFill {
                count: 4 * 20,
                elem0: (5 * k + 8) as u64,
                row_len: 20,
                stride: k as u64,
                ..base.clone()
            };
            let want: Vec<f32> = (5..9)
                .flat_map(|r| host[r * k + 8..r * k + 28].to_vec())
                .collect();
            assert_eq!(crate::device::synth::reference_fill(&cut), want);
            // Padded to 30 rows: the 6 after the 24 are zero.
            let padded = crate::device::synth::SynthFill {
                count: (30 * k) as u64,
                row_len: k as u64,
                stride: k as u64,
                valid_rows: n as u64,
                ..base
            };
            let got = crate::device::synth::reference_fill(&padded);
            assert_eq!(&got[..n * k], &host[..]);
            assert!(got[n * k..].iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn synthetic_values_do_not_depend_on_how_many_threads_make_them() {
        for (dtype, name) in [
            (StoredDtype::F16, "model.layers.0.mlp.up_proj.weight"),
            (StoredDtype::BF16, "model.layers.1.self_attn.q_proj.weight"),
            (StoredDtype::F32, "model.layers.0.input_layernorm.weight"),
        ] {
            let w = SyntheticWeights {
                preset: "tiny".into(),
                seed: 5,
                dtype,
            };
            let n = 3 * SYNTHETIC_CHUNK + 123;
            let parallel = w.generate(name, n);
            // The same stream drawn in one sequential pass, one `random::<f32>()` per draw.
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5 ^ fnv1a(name));
            let norm = name.ends_with("norm.weight");
            let sequential: Vec<f32> = (0..n)
                .map(|_| {
                    let u: f32 = (0..3).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * 0.04;
                    round_to(dtype, if norm { 1.0 + u } else { u })
                })
                .collect();
            assert!(parallel == sequential, "{name} {dtype:?}");
        }
    }
}

/// A tower layer vLLM would quantize: the config file and the one-line problem.
#[derive(Clone, Debug)]
pub struct QuantizedTower {
    pub path: PathBuf,
    pub problem: String,
}

#[cfg(test)]
mod f8_tests {
    use super::*;
    use safetensors::tensor::TensorView;

    /// A file of (name, dtype, shape, bytes), opened.
    fn file(dir: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> SafetensorsFile {
        let path = dir.join("model.safetensors");
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
        SafetensorsFile::open(&path).unwrap()
    }

    #[test]
    fn an_f8_e4m3_weight_reads_as_its_stored_codes_with_its_scalar_scale() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(
            dir.path(),
            &[
                (
                    "w.weight",
                    Dtype::F8_E4M3,
                    vec![2, 3],
                    vec![0x38, 0xC0, 0x7E, 0, 1, 0x80],
                ),
                (
                    "w.weight_scale",
                    Dtype::F32,
                    vec![],
                    0.5f32.to_le_bytes().to_vec(),
                ),
                (
                    "w.input_scale",
                    Dtype::F32,
                    vec![1],
                    2f32.to_le_bytes().to_vec(),
                ),
            ],
        );
        assert_eq!(
            f.raw_f8_e4m3("w.weight", &[2, 3]).unwrap(),
            &[0x38, 0xC0, 0x7E, 0, 1, 0x80]
        );
        assert_eq!(f.fp8_scale("w.weight_scale").unwrap(), 0.5);
        assert_eq!(f.fp8_scale("w.input_scale").unwrap(), 2.0);
        assert_eq!(f.tensor_bytes("w.weight"), 6);
    }

    #[test]
    fn an_fp8_weight_or_scale_stored_otherwise_is_refused_naming_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(
            dir.path(),
            &[
                ("w.weight", Dtype::F16, vec![1, 2], vec![0; 4]),
                ("v.weight", Dtype::F8_E4M3, vec![1, 2], vec![0; 2]),
                ("w.weight_scale", Dtype::F16, vec![], vec![0, 0x38]),
                (
                    "v.weight_scale",
                    Dtype::F32,
                    vec![],
                    (-1f32).to_le_bytes().to_vec(),
                ),
            ],
        );
        let err = |r: Result<()>| r.unwrap_err().to_string();
        let e = err(f.raw_f8_e4m3("w.weight", &[1, 2]).map(drop));
        assert!(
            e.contains("model.safetensors")
                && e.contains("tensor w.weight is stored as F16, expected F8_E4M3"),
            "{e}"
        );
        let e = err(f.raw_f8_e4m3("v.weight", &[2, 1]).map(drop));
        assert!(
            e.contains("tensor v.weight has shape [1, 2], expected [2, 1]"),
            "{e}"
        );
        let e = err(f.fp8_scale("w.weight_scale").map(drop));
        assert!(
            e.contains("tensor w.weight_scale is stored as F16, expected F32"),
            "{e}"
        );
        let e = err(f.fp8_scale("v.weight_scale").map(drop));
        assert!(
            e.contains("tensor v.weight_scale is -1, expected a finite scale above 0"),
            "{e}"
        );
        let e = err(f.fp8_scale("v.input_scale").map(drop));
        assert!(e.contains("tensor v.input_scale is missing"), "{e}");
    }
}

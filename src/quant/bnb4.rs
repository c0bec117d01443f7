//! bitsandbytes 4-bit (NF4 and FP4) as bitsandbytes 0.44.1 stores and dequantizes it: packed
//! codes (first weight in the high nibble), one absmax per block of 64 weights, and under
//! double quantization (`compress_statistics=True`) those absmax minus their mean quantized
//! again to 8 bits in blocks of 256 with the "dynamic" code book.
//!
//! Sources (bitsandbytes tag 0.44.1): `functional.py` `get_4bit_type` L1043-1112 (the NF4
//! and FP4 code books), `quantize_4bit` L1147-1270 (absmax, packing, double quant),
//! `dequantize_4bit` L1313-1420, `quantize_blockwise` L820-931, `dequantize_blockwise`
//! L934-1000, `create_dynamic_map` L353-400, `QuantState.as_dict`/`from_dict` L706-786;
//! `csrc/kernels.cu` `dDequantizeFP4Tree` L92-117, `dQuantizeFP4` L119-166, `dQuantize`
//! L338-400, `kQuantizeBlockwise` L600-705, `kDequantizeBlockwise` L707-770; `csrc/ops.cu`
//! L86 (4-bit kernels index absmax by element / blocksize).

use super::nf4::{self, NF4_LEVELS};
use super::{dense_matmul, Bnb4Linear};
use crate::base::error::Result;
use crate::device::Backend;
use crate::engine::ops::cuda;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// The 4-bit data type (`quant_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bnb4Type {
    Nf4,
    Fp4,
}

impl Bnb4Type {
    pub fn name(self) -> &'static str {
        match self {
            Bnb4Type::Nf4 => "nf4",
            Bnb4Type::Fp4 => "fp4",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "nf4" => Some(Bnb4Type::Nf4),
            "fp4" => Some(Bnb4Type::Fp4),
            _ => None,
        }
    }

    /// `get_4bit_type(quant_type)`: the 16-entry `quant_map` a checkpoint stores (the FP4
    /// list divided by its absmax, 12, in f32 as `data.div_(data.abs().max())` does; its
    /// "-0" is Python's integer zero, so entry 8 is +0.0).
    pub fn code(self) -> [f32; 16] {
        match self {
            Bnb4Type::Nf4 => NF4_LEVELS,
            Bnb4Type::Fp4 => {
                let raw: [f32; 16] = [
                    0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0.0, -0.0625, -8.0, -12.0, -4.0,
                    -6.0, -2.0, -3.0,
                ];
                raw.map(|v| v / 12.0)
            }
        }
    }

    /// The value code `q` decodes to times `absmax`, as the CUDA kernel computes it: NF4 by
    /// its table, FP4 by `dDequantizeFP4Tree`'s constants (`c * absmax * sign`; written here
    /// as the shortest decimals of the same f32 values).
    pub fn decode(self, q: u8, absmax: f32) -> f32 {
        match self {
            Bnb4Type::Nf4 => NF4_LEVELS[(q & 15) as usize] * absmax,
            Bnb4Type::Fp4 => {
                const MAG: [f32; 8] = [
                    0.0,
                    5.208_333_5e-3,
                    0.666_666_7,
                    1.0,
                    0.333_333_33,
                    0.5,
                    0.166_666_67,
                    0.25,
                ];
                let sign = if q & 8 != 0 { -1.0 } else { 1.0 };
                MAG[(q & 7) as usize] * absmax * sign
            }
        }
    }

    /// The code of a value already divided by its block's absmax (`dQuantizeNF4` /
    /// `dQuantizeFP4`).
    fn encode(self, x: f32) -> u8 {
        match self {
            Bnb4Type::Nf4 => nf4::nearest(x),
            Bnb4Type::Fp4 => {
                let sign = if x < 0.0 { 8 } else { 0 };
                let x = x.abs();
                // dQuantizeFP4's decision tree (thresholds are midpoints of the levels / 12).
                let m = if x > 0.291_666_67 {
                    if x > 0.583_333 {
                        if x > 0.833_333_3 {
                            0b011
                        } else {
                            0b010
                        }
                    } else if x > 0.416_666_7 {
                        0b101
                    } else {
                        0b100
                    }
                } else if x > 0.085_937_5 {
                    if x > 0.208_333_33 {
                        0b111
                    } else {
                        0b110
                    }
                } else if x > 0.002_604_17 {
                    0b001
                } else {
                    0b000
                };
                m + sign
            }
        }
    }
}

/// Blocks of 64 weights share an absmax (`quantize_4bit`'s default, and vLLM's).
pub const BLOCKSIZE: usize = 64;
/// The nested (double-quant) block of absmax values (`quantize_blockwise(absmax, 256)`).
pub const NESTED_BLOCKSIZE: usize = 256;
/// The block sizes bitsandbytes' kernels accept.
pub const VALID_BLOCKSIZES: [usize; 7] = [64, 128, 256, 512, 1024, 2048, 4096];

/// How the absmax of a 4-bit weight is held.
#[derive(Clone, Debug, PartialEq)]
pub enum Absmax {
    /// One f32 per block.
    F32(Vec<f32>),
    /// Double quantization: one u8 per block (8-bit dynamic code of absmax − offset), one f32
    /// per `nested_blocksize` of those, the 256-entry code and the offset.
    Nested {
        q: Vec<u8>,
        nested_absmax: Vec<f32>,
        nested_code: Vec<f32>,
        offset: f32,
        nested_blocksize: usize,
    },
}

/// What a 4-bit weight's quant state says (its JSON blob), enough to size every tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Bnb4Meta {
    pub quant_type: Bnb4Type,
    pub blocksize: usize,
    pub dtype: DType,
    /// `[out, in]`
    pub shape: [usize; 2],
    /// `Some` under double quantization.
    pub nested_blocksize: Option<usize>,
    /// `nested_offset` (0 when not nested).
    pub offset: f32,
}

impl Bnb4Meta {
    pub fn numel(&self) -> usize {
        self.shape[0] * self.shape[1]
    }
    /// Bytes of packed codes: `(n + 1) // 2`.
    pub fn packed_len(&self) -> usize {
        self.numel().div_ceil(2)
    }
    /// Absmax entries: one per block.
    pub fn blocks(&self) -> usize {
        self.numel().div_ceil(self.blocksize)
    }

    /// Reads the `quant_state.bitsandbytes__{ty}` blob as `QuantState.from_dict` does,
    /// checking what vLLM and bitsandbytes would trip over later.
    pub fn from_blob(bytes: &[u8], ty: Bnb4Type) -> std::result::Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("quant state is not JSON: {e}"))?;
        let kind = match &v {
            serde_json::Value::Object(_) => None,
            serde_json::Value::Array(_) => Some("a JSON array"),
            serde_json::Value::String(_) => Some("a JSON string"),
            serde_json::Value::Number(_) => Some("a JSON number"),
            serde_json::Value::Bool(_) => Some("a JSON bool"),
            serde_json::Value::Null => Some("JSON null"),
        };
        if let Some(kind) = kind {
            return Err(format!(
                "quant state is {kind}, expected a JSON object (bitsandbytes' QuantState.as_dict)"
            ));
        }
        let qt = match &v["quant_type"] {
            serde_json::Value::String(s) => s.as_str(),
            serde_json::Value::Null => {
                return Err("quant state has no 'quant_type' (expected \"nf4\" or \"fp4\")".into())
            }
            other => {
                return Err(format!(
                    "quant state's 'quant_type' is {other}, expected a string"
                ))
            }
        };
        if qt != ty.name() {
            return Err(format!(
                "quant state says quant_type '{qt}' but is stored as bitsandbytes__{}",
                ty.name()
            ));
        }
        let blocksize = v["blocksize"]
            .as_u64()
            .ok_or("quant state has no blocksize")? as usize;
        if !VALID_BLOCKSIZES.contains(&blocksize) {
            return Err(format!(
                "quant state blocksize {blocksize} is not one bitsandbytes supports ({VALID_BLOCKSIZES:?})"
            ));
        }
        let dtype = match v["dtype"].as_str() {
            Some("float16") => DType::F16,
            Some("bfloat16") => DType::BF16,
            Some("float32") => DType::F32,
            other => {
                return Err(format!(
                    "quant state dtype {other:?} is not float16, bfloat16 or float32"
                ))
            }
        };
        let shape: Vec<u64> = v["shape"]
            .as_array()
            .map(|a| a.iter().filter_map(|d| d.as_u64()).collect())
            .unwrap_or_default();
        if shape.len() != 2 || shape.iter().any(|&d| d == 0 || d > 1 << 20) {
            return Err(format!("quant state shape {} is not [out, in]", v["shape"]));
        }
        let (nested_blocksize, offset) = if v.get("nested_blocksize").is_some() {
            let nb = v["nested_blocksize"].as_u64().unwrap_or(0) as usize;
            if !VALID_BLOCKSIZES.contains(&nb) {
                return Err(format!(
                    "quant state nested_blocksize {nb} is not one bitsandbytes supports"
                ));
            }
            if v["nested_dtype"].as_str() != Some("float32") {
                return Err(format!(
                    "quant state nested_dtype {} is not float32",
                    v["nested_dtype"]
                ));
            }
            let off = v["nested_offset"]
                .as_f64()
                .filter(|o| o.is_finite())
                .ok_or("quant state has no finite nested_offset")?;
            (Some(nb), off as f32)
        } else {
            (None, 0.0)
        };
        Ok(Bnb4Meta {
            quant_type: ty,
            blocksize,
            dtype,
            shape: [shape[0] as usize, shape[1] as usize],
            nested_blocksize,
            offset,
        })
    }
}

/// A 4-bit weight's stored parts and its quant state's scalars.
#[derive(Clone, Debug, PartialEq)]
pub struct Bnb4Parts {
    pub quant_type: Bnb4Type,
    pub blocksize: usize,
    /// `QuantState.dtype`: what `dequantize_4bit` writes.
    pub dtype: DType,
    /// `[out, in]`
    pub shape: [usize; 2],
    pub packed: Vec<u8>,
    pub code: Vec<f32>,
    pub absmax: Absmax,
}

/// `create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)`: the 256-entry
/// "dynamic" code book double quantization uses, as f32 bits. Its values come from PyTorch's
/// CPU `linspace`, whose vectorised path rounds differently from a plain loop, so they are
/// taken from the library itself: printed by bitsandbytes 0.50.2 (`create_dynamic_map()`,
/// unchanged since 0.44.1) under torch 2.15.0 on x86-64, 2026-11-30.
pub const DYNAMIC_MAP_BITS: [u32; 256] = [
    0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
    0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
    0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
    0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
    0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
    0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
    0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
    0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
    0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
    0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
    0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
    0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
    0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
    0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
    0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
    0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x00000000,
    0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
    0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
    0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
    0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
    0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
    0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
    0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
    0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
    0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
    0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
    0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
    0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
    0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
    0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
    0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
    0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000,
];

/// The dynamic code book as f32.
pub fn dynamic_map() -> [f32; 256] {
    DYNAMIC_MAP_BITS.map(f32::from_bits)
}

/// `dQuantize<0>`: bitsandbytes' binary search for the code of `x` in a sorted 256-entry
/// code book, rounding to the nearer neighbour by midpoint.
fn dquantize(code: &[f32], x: f32) -> u8 {
    let mut pivot = 127usize;
    let mut upper_pivot = 255usize;
    let mut lower_pivot = 0usize;
    let mut lower = -1.0f32;
    let mut upper = 1.0f32;
    let mut val = code[pivot];
    let mut i = 64;
    while i > 0 {
        if x > val {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = code[pivot];
        i >>= 1;
    }
    if upper_pivot == 255 {
        upper = code[upper_pivot];
    }
    if lower_pivot == 0 {
        lower = code[lower_pivot];
    }
    if x > val {
        if x > (upper + val) * 0.5 {
            upper_pivot as u8
        } else {
            pivot as u8
        }
    } else if x < (lower + val) * 0.5 {
        lower_pivot as u8
    } else {
        pivot as u8
    }
}

/// `quantize_blockwise(a, code, blocksize)`: one absmax per block, each value's code of
/// `a * (1 / absmax)`.
pub fn quantize_blockwise(a: &[f32], code: &[f32], blocksize: usize) -> (Vec<u8>, Vec<f32>) {
    let mut q = Vec::with_capacity(a.len());
    let mut absmax = Vec::with_capacity(a.len().div_ceil(blocksize));
    for block in a.chunks(blocksize) {
        let m = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        absmax.push(m);
        let inv = 1.0 / m;
        q.extend(block.iter().map(|&v| dquantize(code, v * inv)));
    }
    (q, absmax)
}

/// `quantize_4bit(w, blocksize, quant_type)` without double quantization: packed codes and
/// each block's absmax. Spread over the cores in runs of whole blocks (the result does not
/// depend on the split).
pub fn quantize(w: &[f32], ty: Bnb4Type, blocksize: usize) -> (Vec<u8>, Vec<f32>) {
    let mut absmax = vec![0f32; w.len().div_ceil(blocksize)];
    let mut packed = vec![0u8; w.len().div_ceil(2)];
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
    let per = absmax.len().div_ceil(threads).max(256);
    std::thread::scope(|s| {
        for ((w, packed), absmax) in w
            .chunks(per * blocksize)
            .zip(packed.chunks_mut(per * blocksize / 2))
            .zip(absmax.chunks_mut(per))
        {
            s.spawn(move || {
                for ((b, p), a) in w
                    .chunks(blocksize)
                    .zip(packed.chunks_mut(blocksize / 2))
                    .zip(absmax.iter_mut())
                {
                    *a = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    // kQuantizeBlockwise multiplies by the reciprocal.
                    let inv = 1.0 / *a;
                    for (pair, byte) in b.chunks(2).zip(p.iter_mut()) {
                        let hi = ty.encode(pair[0] * inv);
                        let lo = pair.get(1).map_or(0, |&v| ty.encode(v * inv));
                        *byte = hi << 4 | lo;
                    }
                }
            });
        }
    });
    (packed, absmax)
}

/// `compress_statistics=True`: `offset = absmax.mean()`, then `quantize_blockwise(absmax −
/// offset, blocksize=256)` with the dynamic map. Returns (u8 codes, nested absmax, offset).
/// The mean is summed in f64 (PyTorch's CUDA reduction order is not reproduced; the offset
/// may differ from bitsandbytes' in its last bit).
pub fn double_quant(absmax: &[f32]) -> (Vec<u8>, Vec<f32>, f32) {
    let offset =
        (absmax.iter().map(|&v| v as f64).sum::<f64>() / absmax.len().max(1) as f64) as f32;
    let centred: Vec<f32> = absmax.iter().map(|&v| v - offset).collect();
    let (q, nested) = quantize_blockwise(&centred, &dynamic_map(), NESTED_BLOCKSIZE);
    (q, nested, offset)
}

/// A weight quantized as bitsandbytes stores it (`quantize_4bit`, blocks of 64), with double
/// quantization when `nested`.
pub fn quantize_parts(
    w: &[f32],
    shape: [usize; 2],
    ty: Bnb4Type,
    nested: bool,
    dtype: DType,
) -> Bnb4Parts {
    let (packed, absmax) = quantize(w, ty, BLOCKSIZE);
    let absmax = if nested {
        let (q, nested_absmax, offset) = double_quant(&absmax);
        Absmax::Nested {
            q,
            nested_absmax,
            nested_code: dynamic_map().to_vec(),
            offset,
            nested_blocksize: NESTED_BLOCKSIZE,
        }
    } else {
        Absmax::F32(absmax)
    };
    Bnb4Parts {
        quant_type: ty,
        blocksize: BLOCKSIZE,
        dtype,
        shape,
        packed,
        code: ty.code().to_vec(),
        absmax,
    }
}

/// The f32 absmax `dequantize_4bit` uses: as stored, or under double quantization
/// `dequantize_blockwise(q, state2) + offset` (`code[q] * nested_absmax[i / 256]`, then the
/// offset added in f32).
pub fn absmax_f32(
    q: &[u8],
    nested_absmax: &[f32],
    nested_code: &[f32],
    offset: f32,
    nested_blocksize: usize,
) -> Vec<f32> {
    q.iter()
        .enumerate()
        .map(|(i, &c)| nested_code[c as usize] * nested_absmax[i / nested_blocksize] + offset)
        .collect()
}

/// `dequantize_4bit` on the host: `out[i] = decode(code_i) * absmax[i / blocksize]`,
/// rounded to `dtype` as the kernel's store does.
pub fn dequantize(
    ty: Bnb4Type,
    packed: &[u8],
    absmax: &[f32],
    blocksize: usize,
    dtype: DType,
    out: &mut [f32],
) {
    for (i, o) in out.iter_mut().enumerate() {
        let byte = packed[i / 2];
        let q = if i % 2 == 0 { byte >> 4 } else { byte & 0x0f };
        *o = dtype.round(ty.decode(q, absmax[i / blocksize]));
    }
}

impl Bnb4Parts {
    /// The weight as `dequantize_4bit` returns it, in f32 holding `self.dtype`'s values.
    pub fn dequantize(&self) -> Vec<f32> {
        let absmax = match &self.absmax {
            Absmax::F32(a) => a.clone(),
            Absmax::Nested {
                q,
                nested_absmax,
                nested_code,
                offset,
                nested_blocksize,
            } => absmax_f32(q, nested_absmax, nested_code, *offset, *nested_blocksize),
        };
        let mut out = vec![0f32; self.shape[0] * self.shape[1]];
        dequantize(
            self.quant_type,
            &self.packed,
            &absmax,
            self.blocksize,
            self.dtype,
            &mut out,
        );
        out
    }
}

impl Bnb4Parts {
    /// The blob's bytes as bitsandbytes' `pack_dict_to_tensor` writes them: Python's
    /// `json.dumps` of the dict, keys in `as_dict`'s order, `", "` and `": "` separators.
    pub fn blob_text(&self) -> String {
        let mut s = format!(
            "{{\"quant_type\": \"{}\", \"blocksize\": {}, \"dtype\": \"{}\", \"shape\": [{}, {}]",
            self.quant_type.name(),
            self.blocksize,
            dtype_name(self.dtype),
            self.shape[0],
            self.shape[1]
        );
        if let Absmax::Nested {
            offset,
            nested_blocksize,
            ..
        } = &self.absmax
        {
            s += &format!(
                ", \"nested_blocksize\": {nested_blocksize}, \"nested_dtype\": \"float32\", \"nested_offset\": {}",
                py_float(*offset as f64)
            );
        }
        s + "}"
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, exponent form below 1e-4 or from
/// 1e16.
fn py_float(v: f64) -> String {
    if v == 0.0 || (1e-4..1e16).contains(&v.abs()) {
        let t = format!("{v}");
        if t.contains('.') || t.contains("inf") || t.contains("NaN") {
            t
        } else {
            t + ".0"
        }
    } else {
        // Rust writes "1.5e-5"; Python writes "1.5e-05".
        let t = format!("{v:e}");
        match t.split_once('e') {
            Some((m, e)) => {
                let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
                format!("{m}e{sign}{digits:0>2}")
            }
            None => t,
        }
    }
}

/// PyTorch's dtype name as `str(dtype).strip("torch.")` writes it.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        _ => "float16",
    }
}

/// `x.to(dtype)` into a new tensor (a 16/32-bit float conversion), as PyTorch allocates it.
pub(crate) fn convert(rt: &Runtime, x: &Tensor, dtype: DType, name: String) -> Result<Tensor> {
    let mut out = rt.tensor(name, x.category, &x.shape, dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            for (o, &v) in out.f32_mut().iter_mut().zip(x.f32()) {
                *o = dtype.round(v);
            }
        }
        Backend::Cuda => cuda(rt, |c| c.convert_float(x, &mut out))?,
    }
    Ok(out)
}

/// `dequantize_4bit(B, quant_state)` into a new `[out, in]` tensor of `quant_state.dtype`;
/// under double quantization it first makes the f32 absmax (`dequantize_blockwise` + offset),
/// freed when it returns.
pub fn dequantize_linear(rt: &Runtime, l: &Bnb4Linear, name: &str) -> Result<Tensor> {
    let blocks = l.absmax.numel();
    let absmax32 = match &l.nested {
        Some(n) => {
            let mut a = rt.tensor(
                format!("{name}.absmax_f32"),
                Category::Workspace,
                &[blocks],
                DType::F32,
            )?;
            match rt.backend() {
                Backend::Dry => {}
                Backend::Cpu => a.f32_mut().copy_from_slice(&absmax_f32(
                    l.absmax.u8(),
                    n.absmax.f32(),
                    n.code.f32(),
                    n.offset_value,
                    n.blocksize,
                )),
                Backend::Cuda => cuda(rt, |c| {
                    c.bnb4_nested_absmax(
                        &l.absmax,
                        &n.absmax,
                        &n.code,
                        &n.offset,
                        n.blocksize,
                        &mut a,
                    )
                })?,
            }
            Some(a)
        }
        None => None,
    };
    let absmax = absmax32.as_ref().unwrap_or(&l.absmax);
    let mut w = rt.tensor(
        format!("{name}.dequant"),
        Category::Workspace,
        &[l.out_features, l.in_features],
        l.dtype,
    )?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => dequantize(
            l.quant_type,
            l.packed.u8(),
            absmax.f32(),
            l.blocksize,
            l.dtype,
            w.f32_mut(),
        ),
        Backend::Cuda => cuda(rt, |c| {
            c.bnb4_dequantize(
                &l.packed,
                absmax,
                l.quant_type == Bnb4Type::Fp4,
                l.blocksize,
                &mut w,
            )
        })?,
    }
    drop(absmax32);
    Ok(w)
}

/// One shard of vLLM's `BitsAndBytesLinearMethod._apply_4bit_weight` (bitsandbytes.py
/// L275-316; the loop around it is `quant::shard_loop`): bitsandbytes' `MatMul4Bit.forward`
/// (autograd/_functions.py L493-520), `dequantize_4bit` → `.to(bf16)` → `F.linear` on the
/// bf16 input, giving a new `[T, n]` bf16 result. (A one-token batch would take bitsandbytes'
/// `gemv_4bit`, which dequantizes inside the kernel; a profile batch never has one token.)
pub fn shard_matmul(rt: &Runtime, l: &Bnb4Linear, xb: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("bnb4.dequantize");
    let w = dequantize_linear(rt, l, name)?;
    let wb = if w.dtype != DType::BF16 {
        let wb = convert(rt, &w, DType::BF16, format!("{name}.dequant_bf16"))?;
        drop(w);
        wb
    } else {
        w
    };
    let y = dense_matmul(rt, xb, &wb, name, DType::BF16)?;
    drop(wb);
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp4_tree_constants_are_the_code_book() {
        // dDequantizeFP4Tree's literals are get_4bit_type("fp4")'s values in f32.
        let code = Bnb4Type::Fp4.code();
        for q in 0..16u8 {
            // == treats the tree's -0.0 for code 8 as the map's 0.0.
            assert_eq!(Bnb4Type::Fp4.decode(q, 1.0), code[q as usize], "{q}");
            assert_eq!(Bnb4Type::Nf4.decode(q, 1.0), NF4_LEVELS[q as usize]);
        }
        // dQuantizeFP4 picks the nearest level.
        for k in 0..=1000 {
            let x = k as f32 / 1000.0;
            let q = Bnb4Type::Fp4.encode(x);
            let best = (0..8u8)
                .map(|c| (c, (Bnb4Type::Fp4.decode(c, 1.0) - x).abs()))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap();
            assert!(
                (Bnb4Type::Fp4.decode(q, 1.0) - x).abs() <= best.1 + 1e-6,
                "{x}: {q} vs {}",
                best.0
            );
            assert_eq!(Bnb4Type::Fp4.encode(-x) & 8, if x > 0.0 { 8 } else { 0 });
        }
    }

    #[test]
    fn blob_text_is_what_python_json_dumps_writes() {
        assert_eq!(py_float(0.5), "0.5");
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(1.5e-5), "1.5e-05");
        assert_eq!(py_float(0.012_5), "0.0125");
        let p = Bnb4Parts {
            quant_type: Bnb4Type::Nf4,
            blocksize: 64,
            dtype: DType::F16,
            shape: [768, 3072],
            packed: vec![],
            code: vec![],
            absmax: Absmax::Nested {
                q: vec![],
                nested_absmax: vec![],
                nested_code: vec![],
                offset: 0.25,
                nested_blocksize: 256,
            },
        };
        assert_eq!(
            p.blob_text(),
            r#"{"quant_type": "nf4", "blocksize": 64, "dtype": "float16", "shape": [768, 3072], "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.25}"#
        );
        let m = Bnb4Meta::from_blob(p.blob_text().as_bytes(), Bnb4Type::Nf4).unwrap();
        assert_eq!(m.nested_blocksize, Some(256));
        assert_eq!(m.offset, 0.25);
        assert_eq!(m.blocks(), 768 * 3072 / 64);
        assert!(Bnb4Meta::from_blob(p.blob_text().as_bytes(), Bnb4Type::Fp4).is_err());
    }

    #[test]
    fn dynamic_map_is_sorted_signed_and_spans_minus_one_to_one() {
        let m = dynamic_map();
        assert!(m.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(m[255], 1.0);
        // The largest magnitude below 1 is the mean of linspace(0.1, 1, 65)'s last two.
        assert_eq!(m[0], -0.992_968_74);
        assert_eq!(m[128], 5.500_000_4e-7);
        assert_eq!(m.iter().filter(|&&v| v == 0.0).count(), 1);
        // Each value's search lands on itself.
        for (i, &v) in m.iter().enumerate() {
            assert_eq!(m[dquantize(&m, v) as usize], v, "{i}");
        }
    }

    #[test]
    fn double_quant_round_trip_is_close_and_sized_as_bitsandbytes() {
        let w: Vec<f32> = (0..64 * 600)
            .map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i / 64) as f32 * 0.01) * 0.02)
            .collect();
        let p = quantize_parts(&w, [600, 64], Bnb4Type::Nf4, true, DType::F16);
        let Absmax::Nested {
            q, nested_absmax, ..
        } = &p.absmax
        else {
            panic!("nested")
        };
        assert_eq!(p.packed.len(), 600 * 32);
        assert_eq!(q.len(), 600);
        assert_eq!(nested_absmax.len(), 3);
        let plain = quantize_parts(&w, [600, 64], Bnb4Type::Nf4, false, DType::F16);
        let (a, b) = (p.dequantize(), plain.dequantize());
        let err = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        // The absmax's 8-bit dynamic code is within 1 % of it, so the values are too.
        let top = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(err < 0.01 * top, "{err} vs {top}");
    }
}

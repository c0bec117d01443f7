//! llama.cpp's GGUF (v2/v3): header and metadata parsed with every length checked against the
//! bytes actually present, so a lying header gives an error, never a panic or a huge
//! allocation; tensors F32/F16/BF16/Q8_0/Q4_0/Q4_1 dequantized to f32 one at a time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::config::ModelConfig;
use super::weights::WeightSource;
use crate::base::error::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
/// Nested arrays deeper than this are refused (no real file nests at all).
const MAX_ARRAY_DEPTH: u32 = 4;
/// Strings kept for display are cut here; longer ones (chat templates) are only skipped.
const MAX_KEPT_STRING: usize = 256;

/// ggml tensor types this loader reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
}

impl GgmlType {
    fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
        }
    }

    /// (elements per block, bytes per block)
    fn block(self) -> (u64, u64) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
        }
    }
}

/// A metadata value as kept for display and for the config; arrays keep only their length
/// (the tokenizer's 49k strings are validated and skipped).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    Array { elem: &'static str, len: u64 },
}

impl MetaValue {
    /// The value's type, for messages ("found a float, expected an integer").
    fn kind(&self) -> &'static str {
        match self {
            MetaValue::Int(_) => "an integer",
            MetaValue::Float(_) => "a float",
            MetaValue::Bool(_) => "a boolean",
            MetaValue::Str(_) => "a string",
            MetaValue::Array { .. } => "an array",
        }
    }
}

impl std::fmt::Display for MetaValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaValue::Int(v) => write!(f, "{v}"),
            MetaValue::Float(v) => write!(f, "{v}"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::Str(s) => write!(f, "{s:?}"),
            MetaValue::Array { elem, len } => write!(f, "[{elem}; {len}]"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    pub name: String,
    /// Innermost first, as GGUF lists them.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte range in the file.
    pub range: std::ops::Range<usize>,
}

impl GgufTensor {
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
    /// PyTorch order: outermost first.
    pub fn torch_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// Everything before the tensor data, validated against the file's length.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufHeader {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<GgufTensor>,
    pub alignment: u64,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, what: impl std::fmt::Display) -> Error {
        Error::model(
            self.path,
            format!("GGUF header at byte {}: {what}", self.pos),
        )
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() as u64 {
            return Err(self.err(format!(
                "{what} needs {n} bytes but only {} remain in the file (truncated or bogus length)",
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8"),
        ))
    }
    fn string(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = self.u64(what)?;
        self.take(n, what)
    }
    fn utf8(&mut self, what: &str) -> Result<String> {
        let b = self.string(what)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| self.err(format!("{what} is not UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<MetaValue> {
        let fixed = |r: &mut Self, n: u64| r.take(n, key).map(|b| b.to_vec());
        Ok(match ty {
            0 => MetaValue::Int(fixed(self, 1)?[0] as i128),
            1 => MetaValue::Int(fixed(self, 1)?[0] as i8 as i128),
            2 => MetaValue::Int(u16::from_le_bytes(fixed(self, 2)?.try_into().unwrap()) as i128),
            3 => MetaValue::Int(i16::from_le_bytes(fixed(self, 2)?.try_into().unwrap()) as i128),
            4 => MetaValue::Int(self.u32(key)? as i128),
            5 => MetaValue::Int(self.u32(key)? as i32 as i128),
            6 => MetaValue::Float(f32::from_bits(self.u32(key)?) as f64),
            7 => MetaValue::Bool(fixed(self, 1)?[0] != 0),
            8 => {
                let b = self.string(key)?;
                let s = String::from_utf8_lossy(&b[..b.len().min(MAX_KEPT_STRING)]).into_owned();
                MetaValue::Str(s)
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!("key {key}: arrays nested too deep")));
                }
                let elem_ty = self.u32(key)?;
                let len = self.u64(key)?;
                let min = min_value_size(elem_ty)
                    .ok_or_else(|| self.err(format!("key {key}: unknown array type {elem_ty}")))?;
                // Bound the element count by the bytes left before looping over it.
                if len.saturating_mul(min) > self.remaining() as u64 {
                    return Err(self.err(format!(
                        "key {key}: array of {len} elements cannot fit in the {} bytes left",
                        self.remaining()
                    )));
                }
                if let Some(size) = fixed_value_size(elem_ty) {
                    self.take(len * size, key)?;
                } else {
                    for _ in 0..len {
                        self.value(elem_ty, key, depth + 1)?;
                    }
                }
                MetaValue::Array {
                    elem: type_name(elem_ty),
                    len,
                }
            }
            10 => MetaValue::Int(self.u64(key)? as i128),
            11 => MetaValue::Int(self.u64(key)? as i64 as i128),
            12 => MetaValue::Float(f64::from_bits(self.u64(key)?)),
            other => return Err(self.err(format!("key {key}: unknown value type {other}"))),
        })
    }
}

fn fixed_value_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn min_value_size(ty: u32) -> Option<u64> {
    match ty {
        8 => Some(8),
        9 => Some(12),
        t => fixed_value_size(t),
    }
}

fn type_name(ty: u32) -> &'static str {
    match ty {
        0 => "u8",
        1 => "i8",
        2 => "u16",
        3 => "i16",
        4 => "u32",
        5 => "i32",
        6 => "f32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "u64",
        11 => "i64",
        12 => "f64",
        _ => "?",
    }
}

impl GgufHeader {
    /// Parses and validates the header of a GGUF file held in `buf` (the whole file).
    pub fn parse(buf: &[u8], path: &Path) -> Result<Self> {
        let mut r = Reader { buf, pos: 0, path };
        if r.take(4, "magic").ok() != Some(MAGIC.as_slice()) {
            return Err(Error::model(path, "not a GGUF file (no 'GGUF' magic)"));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::model(
                path,
                format!("GGUF version {version} is not supported (expected 2 or 3)"),
            ));
        }
        let tensor_count = r.u64("tensor count")?;
        let kv_count = r.u64("metadata count")?;
        // A key-value pair needs at least 13 bytes and a tensor entry 24: counts larger than
        // the file could hold are refused before anything is sized by them.
        if kv_count > r.remaining() as u64 / 13 {
            return Err(Error::model(
                path,
                format!(
                    "metadata count {kv_count} is impossible for a file of {} bytes",
                    buf.len()
                ),
            ));
        }
        if tensor_count > r.remaining() as u64 / 24 {
            return Err(Error::model(
                path,
                format!(
                    "tensor count {tensor_count} is impossible for a file of {} bytes",
                    buf.len()
                ),
            ));
        }
        if kv_count > crate::base::limits::MAX_GGUF_KEYS {
            return Err(Error::model(
                path,
                format!(
                    "metadata count {kv_count} is more than the {} keys this tool reads",
                    crate::base::limits::MAX_GGUF_KEYS
                ),
            ));
        }
        if tensor_count > crate::base::limits::MAX_TENSORS {
            return Err(Error::model(
                path,
                format!(
                    "tensor count {tensor_count} is more than the {} tensors this tool reads",
                    crate::base::limits::MAX_TENSORS
                ),
            ));
        }
        let mut metadata = Vec::with_capacity(kv_count as usize);
        let mut alignment = 32u64;
        let mut keys = std::collections::HashSet::new();
        for _ in 0..kv_count {
            let at = r.pos;
            let key = r.utf8("metadata key")?;
            // llama.cpp keeps the first of two equal keys, other readers the last: refused.
            if !keys.insert(key.clone()) {
                return Err(Error::model(
                    path,
                    format!("metadata key {key} appears twice (second at byte {at})"),
                ));
            }
            let ty = r.u32("metadata value type")?;
            let v = r.value(ty, &key, 0)?;
            if key == "general.alignment" {
                alignment = match v {
                    MetaValue::Int(a) if a > 0 && a <= 1 << 20 && (a as u64).is_power_of_two() => {
                        a as u64
                    }
                    _ => {
                        return Err(Error::model(
                            path,
                            format!("general.alignment {v} is not a power of two up to 1 MiB"),
                        ))
                    }
                };
            }
            metadata.push((key, v));
        }
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        let mut raw_offsets = Vec::with_capacity(tensor_count as usize);
        for i in 0..tensor_count {
            let name = r.utf8(&format!("name of tensor #{i}"))?;
            let n_dims = r.u32(&name)?;
            if !(1..=4).contains(&n_dims) {
                return Err(Error::model(
                    path,
                    format!("tensor {name}: {n_dims} dimensions (expected 1 to 4)"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&name)?);
            }
            let type_id = r.u32(&name)?;
            let offset = r.u64(&name)?;
            let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
                Error::model(
                    path,
                    format!(
                        "tensor {name}: ggml type {type_id} is not supported (expected F32, F16, BF16, Q8_0, Q4_0 or Q4_1)"
                    ),
                )
            })?;
            tensors.push(GgufTensor {
                name,
                dims,
                ggml_type,
                range: 0..0,
            });
            raw_offsets.push(offset);
        }
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;
        let mut seen = std::collections::HashSet::new();
        for (t, &offset) in tensors.iter_mut().zip(&raw_offsets) {
            let name = &t.name;
            if !seen.insert(name.clone()) {
                return Err(Error::model(path, format!("tensor {name} appears twice")));
            }
            let numel = t
                .dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n > 0 && n < 1 << 40)
                .ok_or_else(|| {
                    Error::model(
                        path,
                        format!(
                            "tensor {name}: dimensions {:?} are zero or too large",
                            t.dims
                        ),
                    )
                })?;
            let (block, block_bytes) = t.ggml_type.block();
            if t.dims[0] % block != 0 {
                return Err(Error::model(
                    path,
                    format!(
                        "tensor {name}: innermost dimension {} is not a multiple of the {} block size {block}",
                        t.dims[0],
                        t.ggml_type.name()
                    ),
                ));
            }
            let nbytes = numel / block * block_bytes;
            if offset % alignment != 0 {
                return Err(Error::model(
                    path,
                    format!("tensor {name}: data offset {offset} is not aligned to {alignment}"),
                ));
            }
            let start = data_start.checked_add(offset);
            let end = start.and_then(|s| s.checked_add(nbytes));
            match (start, end) {
                (Some(s), Some(e)) if e <= file_len => t.range = s as usize..e as usize,
                _ => {
                    return Err(Error::model(
                        path,
                        format!(
                            "tensor {name}: data at offset {offset} ({nbytes} bytes of {}) runs past the end of the file ({file_len} bytes)",
                            t.ggml_type.name()
                        ),
                    ))
                }
            }
        }
        let mut order: Vec<&GgufTensor> = tensors.iter().collect();
        order.sort_by_key(|t| t.range.start);
        for w in order.windows(2) {
            if w[1].range.start < w[0].range.end {
                return Err(Error::model(
                    path,
                    format!(
                        "tensor {}: its data overlaps tensor {}",
                        w[1].name, w[0].name
                    ),
                ));
            }
        }
        // Data runs from data_start to the last tensor's end, padded to the alignment.
        let data_end = order.last().map_or(0, |t| t.range.end as u64 - data_start);
        super::weights::check_no_trailing_bytes(
            path,
            data_end,
            alignment,
            file_len.saturating_sub(data_start),
            &format!("GGUF (tensor count {tensor_count})"),
        )?;
        Ok(GgufHeader {
            version,
            metadata,
            tensors,
            alignment,
        })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The model's shape from llama.cpp's metadata keys (`llama.*`).
    pub fn config(&self, path: &Path) -> Result<ModelConfig> {
        let arch = match self.get("general.architecture") {
            Some(MetaValue::Str(a)) => a.clone(),
            _ => {
                return Err(Error::model(
                    path,
                    "metadata general.architecture is missing",
                ))
            }
        };
        if arch != "llama" {
            return Err(Error::model(
                path,
                format!("architecture '{arch}' is not supported (expected llama)"),
            ));
        }
        let int = |k: &str| -> Result<Option<usize>> {
            match self.get(&format!("{arch}.{k}")) {
                None => Ok(None),
                Some(MetaValue::Int(v)) if *v > 0 && *v < 1 << 32 => Ok(Some(*v as usize)),
                Some(v) => Err(Error::model(
                    path,
                    format!(
                        "metadata {arch}.{k} is {v} ({}), expected a positive integer below 2^32",
                        v.kind()
                    ),
                )),
            }
        };
        let need = |k: &str| -> Result<usize> {
            int(k)?.ok_or_else(|| Error::model(path, format!("metadata {arch}.{k} is missing")))
        };
        // Ranges are checked by the config below; a string or an array here is an error.
        let float = |k: &str, default: f64| match self.get(&format!("{arch}.{k}")) {
            // NaN would become JSON null below, and null the default: refused here.
            Some(MetaValue::Float(v)) if v.is_finite() => Ok(*v),
            Some(MetaValue::Int(v)) => Ok(*v as f64),
            None => Ok(default),
            Some(v) => Err(Error::model(
                path,
                format!(
                    "metadata {arch}.{k} is {v} ({}), expected a finite number",
                    v.kind()
                ),
            )),
        };
        let hidden_size = need("embedding_length")?;
        let num_heads = need("attention.head_count")?;
        let num_kv_heads = int("attention.head_count_kv")?.unwrap_or(num_heads);
        let head_dim = int("attention.key_length")?
            .or(int("rope.dimension_count")?)
            .unwrap_or(hidden_size / num_heads);
        let vocab_size = match int("vocab_size")? {
            Some(v) => v,
            None => match self.get("tokenizer.ggml.tokens") {
                Some(MetaValue::Array { len, .. }) if *len > 0 && *len < 1 << 32 => *len as usize,
                _ => {
                    return Err(Error::model(
                        path,
                        format!("neither {arch}.vocab_size nor tokenizer.ggml.tokens is present"),
                    ))
                }
            },
        };
        let tied = !self.tensors.iter().any(|t| t.name == "output.weight");
        let json = serde_json::json!({
            "model_type": "llama",
            "hidden_size": hidden_size,
            "intermediate_size": need("feed_forward_length")?,
            "num_hidden_layers": need("block_count")?,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "head_dim": head_dim,
            "vocab_size": vocab_size,
            "rope_theta": float("rope.freq_base", 10000.0)?,
            "rms_norm_eps": float("attention.layer_norm_rms_epsilon", 1e-5)?,
            "tie_word_embeddings": tied,
            "attention_bias": false,
            "max_position_embeddings": int("context_length")?.unwrap_or(4096),
        });
        ModelConfig::from_hf_json(&json).map_err(|p| Error::model(path, p))
    }
}

/// llama.cpp's tensor name for a Hugging Face one, and whether its rows carry llama.cpp's
/// rotary permutation (Q and K projections).
fn gguf_name(hf: &str) -> Option<(String, bool)> {
    let simple = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(s) = simple {
        return Some((s.to_string(), false));
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let (g, permuted) = match part {
        "input_layernorm.weight" => ("attn_norm.weight", false),
        "self_attn.q_proj.weight" => ("attn_q.weight", true),
        "self_attn.k_proj.weight" => ("attn_k.weight", true),
        "self_attn.v_proj.weight" => ("attn_v.weight", false),
        "self_attn.o_proj.weight" => ("attn_output.weight", false),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", false),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", false),
        "mlp.up_proj.weight" => ("ffn_up.weight", false),
        "mlp.down_proj.weight" => ("ffn_down.weight", false),
        _ => return None,
    };
    Some((format!("blk.{layer}.{g}"), permuted))
}

/// A GGUF file, memory-mapped, read through Hugging Face tensor names.
pub struct GgufFile {
    pub path: PathBuf,
    mmap: memmap2::Mmap,
    pub header: GgufHeader,
    by_name: HashMap<String, usize>,
    /// Head dimension for undoing the Q/K row permutation.
    head_dim: usize,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let mmap = super::weights::map_model_file(path)?;
        let header = GgufHeader::parse(&mmap, path)?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            header,
            by_name,
            head_dim: 0,
        })
    }

    /// Reads the config from the metadata and checks every tensor it implies is present with
    /// the implied shape.
    pub fn config_checked(&mut self) -> Result<ModelConfig> {
        let cfg = self.header.config(&self.path)?;
        cfg.check_layers_present(
            self.header.tensors.iter().map(|t| t.name.as_str()),
            "blk.",
            "llama.block_count",
        )
        .map_err(|p| Error::model(&self.path, p))?;
        for (name, shape) in cfg.tensor_shapes() {
            let (g, _) = gguf_name(&name).ok_or_else(|| {
                Error::model(&self.path, format!("tensor {name} has no GGUF name"))
            })?;
            let t = self.tensor(&g).ok_or_else(|| {
                Error::model(
                    &self.path,
                    format!("tensor {g} ({name}) is missing (the metadata implies {shape:?})"),
                )
            })?;
            if t.torch_shape() != shape {
                return Err(Error::model(
                    &self.path,
                    format!(
                        "tensor {g} has dims {:?} but the metadata implies {:?} (innermost first)",
                        t.dims,
                        shape.iter().rev().collect::<Vec<_>>()
                    ),
                ));
            }
        }
        self.head_dim = cfg.head_dim;
        Ok(cfg)
    }

    pub fn tensor(&self, gguf_name: &str) -> Option<&GgufTensor> {
        self.by_name
            .get(gguf_name)
            .map(|&i| &self.header.tensors[i])
    }

    /// Dequantizes one tensor (by GGUF name) to f32.
    pub fn dequantize(&self, t: &GgufTensor) -> Vec<f32> {
        dequantize(t.ggml_type, &self.mmap[t.range.clone()])
    }
}

/// Dequantizes whole blocks of `ty` (the caller checked the length is a whole number of them).
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    let (_, bb) = ty.block();
    let mut out = Vec::with_capacity(bytes.len() / bb as usize * ty.block().0 as usize);
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap())),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(f16)),
        GgmlType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        // Q8_0: f16 scale d, 32 × i8; x = d·q.
        GgmlType::Q8_0 => {
            for b in bytes.chunks_exact(34) {
                let d = f16(b);
                out.extend(b[2..].iter().map(|&q| d * q as i8 as f32));
            }
        }
        // Q4_0: f16 scale d, 16 bytes; low nibbles are elements 0..16, high 16..32; x = d·(q−8).
        GgmlType::Q4_0 => {
            for b in bytes.chunks_exact(18) {
                let d = f16(b);
                let qs = &b[2..];
                out.extend(qs.iter().map(|&q| d * ((q & 0xF) as f32 - 8.0)));
                out.extend(qs.iter().map(|&q| d * ((q >> 4) as f32 - 8.0)));
            }
        }
        // Q4_1: f16 scale d and min m, 16 bytes, same nibble order; x = d·q + m.
        GgmlType::Q4_1 => {
            for b in bytes.chunks_exact(20) {
                let (d, m) = (f16(b), f16(&b[2..]));
                let qs = &b[4..];
                out.extend(qs.iter().map(|&q| d * (q & 0xF) as f32 + m));
                out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
            }
        }
    }
    out
}

/// Undoes llama.cpp's converter permutation of Q/K rows: within each head, GGUF row `2i + s`
/// holds Hugging Face row `s·(head_dim/2) + i` (rotate_half pairs dimension i with i+half).
pub fn unpermute_rows(w: &[f32], rows: usize, cols: usize, head_dim: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; w.len()];
    for r in 0..rows {
        let (h, within) = (r / head_dim, r % head_dim);
        let (s, i) = (within / half, within % half);
        let src = h * head_dim + 2 * i + s;
        out[r * cols..(r + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
    }
    out
}

impl WeightSource for GgufFile {
    fn origin(&self) -> String {
        self.path.display().to_string()
    }

    fn stored_bytes(&self, name: &str) -> u64 {
        gguf_name(name)
            .and_then(|(g, _)| self.tensor(&g))
            .map_or(0, |t| t.range.len() as u64)
    }

    fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (g, permuted) = gguf_name(name)
            .ok_or_else(|| Error::model(&self.path, format!("tensor {name} has no GGUF name")))?;
        let t = self
            .tensor(&g)
            .ok_or_else(|| Error::model(&self.path, format!("tensor {g} ({name}) is missing")))?;
        if t.torch_shape() != shape {
            return Err(Error::model(
                &self.path,
                format!(
                    "tensor {g} has shape {:?}, expected {shape:?}",
                    t.torch_shape()
                ),
            ));
        }
        let w = self.dequantize(t);
        if permuted && shape.len() == 2 && self.head_dim > 0 {
            Ok(unpermute_rows(&w, shape[0], shape[1], self.head_dim))
        } else {
            Ok(w)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_1_block_dequantizes_low_nibbles_first() {
        let mut b = Vec::new();
        b.extend_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        b.extend_from_slice(&half::f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let x = dequantize(GgmlType::Q4_1, &b);
        assert_eq!(x.len(), 32);
        assert_eq!(x[0], -1.0);
        assert_eq!(x[3], 0.5);
        assert_eq!(x[16], 6.5);
        assert_eq!(x[31], -1.0);
    }

    #[test]
    fn q4_0_and_q8_0_blocks() {
        let mut b = half::f16::from_f32(2.0).to_le_bytes().to_vec();
        b.extend([0x1Fu8; 16]);
        let x = dequantize(GgmlType::Q4_0, &b);
        assert_eq!((x[0], x[16]), (14.0, -14.0));
        let mut b = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let x = dequantize(GgmlType::Q8_0, &b);
        assert_eq!((x[0], x[31]), (-4.0, 3.75));
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp: reshape(heads, 2, hd/2, cols).swapaxes(1, 2); here with 2 heads of 4.
        let (hd, rows, cols) = (4, 8, 1);
        let hf: Vec<f32> = (0..rows).map(|r| r as f32).collect();
        let mut gg = vec![0f32; rows];
        for h in 0..2 {
            for s in 0..2 {
                for i in 0..hd / 2 {
                    gg[h * hd + i * 2 + s] = hf[h * hd + s * hd / 2 + i];
                }
            }
        }
        assert_eq!(gg, vec![0., 2., 1., 3., 4., 6., 5., 7.]);
        assert_eq!(unpermute_rows(&gg, rows, cols, hd), hf);
    }
}

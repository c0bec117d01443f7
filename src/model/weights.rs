//! Where a model's weights come from: synthetic (seeded, any shape) or a safetensors file
//! (memory-mapped, validated against config.json before anything is allocated).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use safetensors::{Dtype, SafeTensors};

use super::config::ModelConfig;
use crate::error::{Error, Result};

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDtype {
    F32,
    F16,
    BF16,
}

impl StoredDtype {
    pub fn size_bytes(self) -> usize {
        match self {
            StoredDtype::F32 => 4,
            _ => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::F16 => "F16",
            StoredDtype::BF16 => "BF16",
        }
    }
}

pub trait WeightSource {
    /// The file or preset, for messages.
    fn origin(&self) -> String;
    /// Reads one tensor, converted to f32 (values exact: F16/BF16 widen losslessly).
    fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;
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
    }
}

impl SyntheticWeights {
    pub fn generate(&self, name: &str, numel: usize) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ fnv1a(name));
        let is_norm = name.ends_with("norm.weight");
        (0..numel)
            .map(|_| {
                // Sum of uniforms: cheap, bell-shaped, std 0.02 (Irwin-Hall with 3 terms).
                let u: f32 = (0..3).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * 0.04;
                let v = if is_norm { 1.0 + u } else { u };
                round_to(self.dtype, v)
            })
            .collect()
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
}

/// A single `.safetensors` file, memory-mapped.
pub struct SafetensorsFile {
    pub path: PathBuf,
    mmap: memmap2::Mmap,
    /// name → (dtype, shape, byte range in the mmap)
    index: HashMap<String, (StoredDtype, Vec<usize>, std::ops::Range<usize>)>,
}

fn stored_dtype(d: Dtype) -> Option<StoredDtype> {
    match d {
        Dtype::F32 => Some(StoredDtype::F32),
        Dtype::F16 => Some(StoredDtype::F16),
        Dtype::BF16 => Some(StoredDtype::BF16),
        _ => None,
    }
}

impl SafetensorsFile {
    /// Opens and validates the header: lengths, offsets, dtypes. Reads no tensor data.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::model(path, "file not found")
            } else {
                Error::io(path, e)
            }
        })?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len < 8 {
            return Err(Error::model(
                path,
                format!("truncated: {len} bytes, too short for a safetensors header"),
            ));
        }
        // SAFETY: the map is read-only; a file changed under us could only give wrong numbers,
        // and every offset is checked against the map's length before use.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let header_len = u64::from_le_bytes(mmap[..8].try_into().expect("8 bytes"));
        if header_len > len - 8 {
            return Err(Error::model(
                path,
                format!("header length {header_len} runs past the end of the file ({len} bytes): truncated or not safetensors"),
            ));
        }
        let st = SafeTensors::deserialize(&mmap)
            .map_err(|e| Error::model(path, describe_st_error(e)))?;
        let data_start = 8 + header_len as usize;
        let mut index = HashMap::new();
        for (name, view) in st.tensors() {
            let dtype = stored_dtype(view.dtype()).ok_or_else(|| {
                Error::model(
                    path,
                    format!(
                        "tensor {name}: dtype {:?} is not supported (expected F32, F16 or BF16)",
                        view.dtype()
                    ),
                )
            })?;
            let start = view.data().as_ptr() as usize - mmap.as_ptr() as usize;
            debug_assert!(start >= data_start);
            let end = start + view.data().len();
            index.insert(name, (dtype, view.shape().to_vec(), start..end));
        }
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            index,
        })
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &String> {
        self.index.keys()
    }

    pub fn info(&self, name: &str) -> Option<(StoredDtype, &[usize])> {
        self.index.get(name).map(|(d, s, _)| (*d, s.as_slice()))
    }

    /// Checks every tensor the config expects is there with the expected shape.
    pub fn check_against(&self, cfg: &ModelConfig) -> Result<()> {
        for (name, shape) in cfg.tensor_shapes() {
            match self.index.get(&name) {
                None => {
                    return Err(Error::model(
                        &self.path,
                        format!("tensor {name} is missing (config.json expects {shape:?})"),
                    ))
                }
                Some((_, found, _)) if *found != shape => {
                    return Err(Error::model(
                        &self.path,
                        format!(
                            "tensor {name} has shape {found:?} but config.json implies {shape:?}"
                        ),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn total_bytes(&self) -> u64 {
        self.index.values().map(|(_, _, r)| r.len() as u64).sum()
    }
}

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

impl WeightSource for SafetensorsFile {
    fn origin(&self) -> String {
        self.path.display().to_string()
    }

    fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (dtype, found, range) = self
            .index
            .get(name)
            .ok_or_else(|| Error::model(&self.path, format!("tensor {name} is missing")))?;
        if found != shape {
            return Err(Error::model(
                &self.path,
                format!("tensor {name} has shape {found:?}, expected {shape:?}"),
            ));
        }
        let bytes = &self.mmap[range.clone()];
        Ok(match dtype {
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
        })
    }
}

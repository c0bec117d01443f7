//! Model shapes, weight files and the Llama-family forward pass.

pub mod config;
pub mod llama;
pub mod presets;
pub mod weights;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use config::ModelConfig;
use weights::{SafetensorsFile, StoredDtype, SyntheticWeights, WeightSource};

/// What `--model` names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelSource {
    /// A built-in shape with seeded synthetic weights.
    Preset { name: String },
    /// A Hugging Face folder, its `config.json`, or its `.safetensors` file.
    Path { path: PathBuf },
    /// A workload of plain allocations (vLLM's `test_memory_profiling`): weights, then a spike
    /// of activation memory in each pass.
    Synthetic {
        weights_bytes: u64,
        spike_bytes: u64,
    },
}

impl ModelSource {
    /// `preset:NAME`, `synthetic:WEIGHTS:SPIKE` (sizes like 512MiB) or a path.
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(name) = s.strip_prefix("preset:") {
            if presets::preset(name).is_none() {
                return Err(Error::Request(format!(
                    "model preset '{name}' is unknown; presets: {}",
                    presets::PRESET_NAMES.join(", ")
                )));
            }
            return Ok(ModelSource::Preset {
                name: name.to_ascii_lowercase(),
            });
        }
        if let Some(rest) = s.strip_prefix("synthetic:") {
            let parts: Vec<&str> = rest.split(':').collect();
            if parts.len() != 2 {
                return Err(Error::Request(format!(
                    "model '{s}': expected synthetic:WEIGHTS:SPIKE, e.g. synthetic:512MiB:1GiB"
                )));
            }
            return Ok(ModelSource::Synthetic {
                weights_bytes: crate::units::parse_bytes(parts[0])?,
                spike_bytes: crate::units::parse_bytes(parts[1])?,
            });
        }
        Ok(ModelSource::Path {
            path: PathBuf::from(s),
        })
    }

    pub fn label(&self) -> String {
        match self {
            ModelSource::Preset { name } => format!("preset:{name}"),
            ModelSource::Path { path } => path.display().to_string(),
            ModelSource::Synthetic {
                weights_bytes,
                spike_bytes,
            } => {
                format!("synthetic:{weights_bytes}:{spike_bytes}")
            }
        }
    }
}

/// The weights file and the config.json of a model on disk.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFiles {
    pub config: PathBuf,
    pub weights: PathBuf,
}

/// Finds config.json and the safetensors file from whichever of them (or their folder) the
/// user picked.
pub fn resolve_files(path: &Path) -> Result<ModelFiles> {
    if !path.exists() {
        return Err(Error::model(path, "file not found"));
    }
    let (dir, weights) = if path.is_dir() {
        (path.to_path_buf(), path.join("model.safetensors"))
    } else if path.file_name().is_some_and(|n| n == "config.json") {
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let w = dir.join("model.safetensors");
        (dir, w)
    } else if path.extension().is_some_and(|e| e == "safetensors") {
        (
            path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            path.to_path_buf(),
        )
    } else {
        return Err(Error::model(
            path,
            "not a model file: pick a folder, its config.json or a .safetensors file",
        ));
    };
    if !weights.exists() {
        return Err(Error::model(
            &weights,
            "weights file not found (expected model.safetensors beside config.json)",
        ));
    }
    let config = dir.join("config.json");
    if !config.exists() {
        return Err(Error::model(
            &config,
            "config.json not found (it must sit beside the weights)",
        ));
    }
    Ok(ModelFiles { config, weights })
}

/// A model ready to load: its shape and where its weights come from.
pub struct OpenedModel {
    pub name: String,
    pub config: ModelConfig,
    pub source: Box<dyn WeightSource>,
}

/// Opens a preset or a file: reads config.json, validates the weights' header against it.
pub fn open(source: &ModelSource, seed: u64) -> Result<OpenedModel> {
    match source {
        ModelSource::Preset { name } => {
            let config = presets::preset(name)
                .ok_or_else(|| Error::Request(format!("model preset '{name}' is unknown")))?;
            Ok(OpenedModel {
                name: name.clone(),
                config,
                source: Box::new(SyntheticWeights {
                    preset: name.clone(),
                    seed,
                    dtype: StoredDtype::F16,
                }),
            })
        }
        ModelSource::Path { path } => {
            let files = resolve_files(path)?;
            let config = ModelConfig::from_hf_file(&files.config)?;
            let st = SafetensorsFile::open(&files.weights)?;
            st.check_against(&config)?;
            let name = files
                .config
                .parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into());
            Ok(OpenedModel {
                name,
                config,
                source: Box::new(st),
            })
        }
        ModelSource::Synthetic { .. } => Err(Error::Request(
            "a synthetic workload has no model config".into(),
        )),
    }
}

/// What `vramscope inspect` prints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Inspection {
    pub path: PathBuf,
    pub config: ModelConfig,
    pub parameters: u64,
    pub tensors: usize,
    /// (dtype, tensor count, bytes)
    pub by_dtype: Vec<(String, usize, u64)>,
}

pub fn inspect(path: &Path) -> Result<Inspection> {
    let files = resolve_files(path)?;
    let config = ModelConfig::from_hf_file(&files.config)?;
    let st = SafetensorsFile::open(&files.weights)?;
    st.check_against(&config)?;
    let mut by: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    let mut params = 0u64;
    let mut count = 0;
    for name in st.tensor_names() {
        let (d, shape) = st.info(name).expect("listed");
        let n: u64 = shape.iter().product::<usize>() as u64;
        params += n;
        count += 1;
        let e = by.entry(d.name()).or_default();
        e.0 += 1;
        e.1 += n * d.size_bytes() as u64;
    }
    Ok(Inspection {
        path: files.weights,
        config,
        parameters: params,
        tensors: count,
        by_dtype: by
            .into_iter()
            .map(|(k, (c, b))| (k.to_string(), c, b))
            .collect(),
    })
}

/// A tensor generated on demand while the file is written, so memory stays at one tensor.
struct LazyTensor<'a> {
    gen: &'a SyntheticWeights,
    name: String,
    shape: Vec<usize>,
}

impl safetensors::View for LazyTensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        match self.gen.dtype {
            StoredDtype::F32 => safetensors::Dtype::F32,
            StoredDtype::F16 => safetensors::Dtype::F16,
            StoredDtype::BF16 => safetensors::Dtype::BF16,
        }
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        let vals = self.gen.generate(&self.name, self.shape.iter().product());
        let mut out = Vec::with_capacity(self.data_len());
        for v in vals {
            match self.gen.dtype {
                StoredDtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
                StoredDtype::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                StoredDtype::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            }
        }
        std::borrow::Cow::Owned(out)
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.gen.dtype.size_bytes()
    }
}

/// Writes `model.safetensors` + `config.json` of a preset with seeded synthetic weights.
pub fn gen_model(preset: &str, dir: &Path, dtype: StoredDtype, seed: u64) -> Result<ModelFiles> {
    let config = presets::preset(preset).ok_or_else(|| {
        Error::Request(format!(
            "model preset '{preset}' is unknown; presets: {}",
            presets::PRESET_NAMES.join(", ")
        ))
    })?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let gen = SyntheticWeights {
        preset: preset.to_string(),
        seed,
        dtype,
    };
    let tensors: Vec<(String, LazyTensor)> = config
        .tensor_shapes()
        .into_iter()
        .map(|(name, shape)| {
            (
                name.clone(),
                LazyTensor {
                    gen: &gen,
                    name,
                    shape,
                },
            )
        })
        .collect();
    let weights = dir.join("model.safetensors");
    let torch_dtype = match dtype {
        StoredDtype::F32 => "float32",
        StoredDtype::F16 => "float16",
        StoredDtype::BF16 => "bfloat16",
    };
    // Written tensor by tensor into a temporary file, renamed into place when complete.
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
    safetensors::serialize_to_file(tensors, None, tmp.path()).map_err(|e| Error::Export {
        path: weights.clone(),
        problem: e.to_string(),
    })?;
    tmp.persist(&weights)
        .map_err(|e| Error::io(&weights, e.error))?;
    let cfg_path = dir.join("config.json");
    let json = serde_json::to_string_pretty(&config.to_hf_json(torch_dtype)).expect("json");
    crate::export::atomic_write(&cfg_path, json.as_bytes())?;
    Ok(ModelFiles {
        config: cfg_path,
        weights,
    })
}

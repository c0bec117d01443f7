//! Model shapes, weight files and the forward passes: readers for Hugging Face folders,
//! safetensors, GGUF and bitsandbytes checkpoints; the model families laid out as vLLM lays
//! them out, one file each in `models/` (with the registry from `model_type` to family) over
//! the layer kinds they share in `layers/`; vLLM's logits processor and sampler.
//!
//! `llama`, `opt` and `CausalLm` are re-exported from `models/` under their old paths.
//!
//! May import: `quant`, `engine`, `device`, `memory`, `base`.

pub mod batch;
pub(crate) mod checkpoint_names;
pub mod config;
pub mod gen_modelopt_fp8;
pub mod gen_nvfp4;
pub mod gen_sparse24;
pub mod gguf;
pub mod layers;
pub(crate) mod loader;
pub mod models;
pub mod presets;
pub mod sampler;
pub mod sharded;
mod tower_quant;
pub mod weights;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};
pub use config::ModelConfig;
pub use loader::LoadOptions;
pub use models::{llama, opt, CausalLm};
use weights::{StoredDtype, SyntheticWeights, WeightSource};

/// What `--model` names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelSource {
    /// A built-in shape with seeded synthetic weights.
    Preset { name: String },
    /// A Hugging Face folder, its `config.json`, index json or any `.safetensors` shard; or a
    /// `.gguf` file.
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
        if s.trim().is_empty() {
            return Err(Error::Request(
                "--model is empty: expected a folder, a model file, preset:NAME or synthetic:WEIGHTS:SPIKE".into(),
            ));
        }
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
                weights_bytes: crate::base::units::parse_bytes(parts[0])?,
                spike_bytes: crate::base::units::parse_bytes(parts[1])?,
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

/// How the weights are stored on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    Safetensors,
    Gguf,
    /// A Hugging Face `config.json` with no weights beside it: enough for a dry run.
    ConfigOnly,
}

/// The files of a model on disk.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFiles {
    pub format: FileFormat,
    /// `config.json` (for GGUF, the .gguf itself: its metadata is the config).
    pub config: PathBuf,
    /// The index json, the single `.safetensors`, or the `.gguf`.
    pub weights: PathBuf,
    /// Every weights file, in order (one for a single file or GGUF).
    pub shards: Vec<PathBuf>,
    /// The index's `weight_map`, when sharded.
    pub index: Option<Vec<(String, String)>>,
}

const INDEX_NAME: &str = "model.safetensors.index.json";

fn is_ext(p: &Path, ext: &str) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// Finds config.json and the weights from whichever the user picked: the folder, its
/// `config.json`, the index json, any shard, a single `.safetensors`, or a `.gguf`.
pub fn resolve_files(path: &Path) -> Result<ModelFiles> {
    crate::base::fsguard::stat(path, "file")?;
    if path.is_file() && is_ext(path, "gguf") {
        return Ok(ModelFiles {
            format: FileFormat::Gguf,
            config: path.to_path_buf(),
            weights: path.to_path_buf(),
            shards: vec![path.to_path_buf()],
            index: None,
        });
    }
    let dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let index_path = if name.ends_with(".index.json") {
        Some(path.to_path_buf())
    } else if dir.join(INDEX_NAME).exists() {
        Some(dir.join(INDEX_NAME))
    } else {
        None
    };
    let picked_single = path.is_file() && is_ext(path, "safetensors");
    if !path.is_dir() && !picked_single && name != "config.json" && !name.ends_with(".index.json") {
        return Err(Error::model(
            path,
            "not a model file: pick a folder, its config.json, the index json, a .safetensors file or a .gguf file",
        ));
    }
    let config = dir.join("config.json");
    let (weights, shards, index) = match index_path {
        Some(ip) => {
            let text = crate::base::fsguard::read_text(
                &ip,
                "index file",
                crate::base::fsguard::INDEX_LIMIT,
            )?;
            let map = sharded::parse_index(&text, &ip)?;
            let mut names: Vec<&str> = map.iter().map(|(_, f)| f.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            if picked_single
                && !names
                    .iter()
                    .any(|n| Some(*n) == path.file_name().and_then(|f| f.to_str()))
            {
                // A lone file beside an unrelated index: take the file by itself.
                (path.to_path_buf(), vec![path.to_path_buf()], None)
            } else {
                let shards: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
                if let Some(missing) = shards.iter().find(|s| !s.exists()) {
                    return Err(Error::model(
                        missing,
                        format!("shard listed in {} is missing", ip.display()),
                    ));
                }
                (ip, shards, Some(map))
            }
        }
        None if picked_single => (path.to_path_buf(), vec![path.to_path_buf()], None),
        None => {
            let single = dir.join("model.safetensors");
            // exists(), not is_file(): a FIFO or a folder by that name is reported as what
            // it is when opened, not as missing.
            if single.exists() {
                (single.clone(), vec![single], None)
            } else {
                let ggufs: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .map_err(|e| Error::io(&dir, e))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| is_ext(p, "gguf"))
                    .collect();
                if ggufs.len() == 1 && path.is_dir() {
                    return resolve_files(&ggufs[0]);
                }
                if config.is_file() && ggufs.is_empty() {
                    // Plan before downloading: the shapes are in config.json.
                    return Ok(ModelFiles {
                        format: FileFormat::ConfigOnly,
                        config: config.clone(),
                        weights: config,
                        shards: Vec::new(),
                        index: None,
                    });
                }
                return Err(Error::model(
                    &single,
                    format!("weights file not found (expected model.safetensors or {INDEX_NAME} beside config.json)"),
                ));
            }
        }
    };
    if !config.exists() {
        return Err(Error::model(
            &config,
            "config.json not found (it must sit beside the weights)",
        ));
    }
    Ok(ModelFiles {
        format: FileFormat::Safetensors,
        config,
        weights,
        shards,
        index,
    })
}

/// A model ready to load: its shape and where its weights come from.
pub struct OpenedModel {
    pub name: String,
    pub config: ModelConfig,
    pub source: Box<dyn WeightSource>,
    /// `llm_int8_threshold` of a bitsandbytes 8-bit checkpoint (what it was made to run with).
    pub stored_int8_threshold: Option<f32>,
}

use config::read_config_json;

/// Opens the files of a model on disk, validating every header against the config.
type Opened = (ModelConfig, Box<dyn WeightSource>, Option<f32>);

fn open_files(files: &ModelFiles) -> Result<Opened> {
    match files.format {
        FileFormat::Gguf => {
            let mut g = gguf::GgufFile::open(&files.weights)?;
            let cfg = g.config_checked()?;
            Ok((cfg, Box::new(g), None))
        }
        FileFormat::Safetensors => {
            let (_, cfg, sq, st) = open_safetensors(files)?;
            let threshold = match sq {
                sharded::StoredQuant::BnbInt8 { threshold } => Some(threshold),
                _ => None,
            };
            Ok((cfg, Box::new(st), threshold))
        }
        FileFormat::ConfigOnly => {
            config_only(config_with_quant_file(&files.config)?, &files.config)
        }
    }
}

/// A model of which only config.json is known (`json`, read from `origin`): its config and the
/// weight source that gives shapes and stored formats for a dry run.
#[allow(clippy::type_complexity)]
fn config_only(
    json: serde_json::Value,
    origin: &Path,
) -> Result<(ModelConfig, Box<dyn WeightSource>, Option<f32>)> {
    let cfg = ModelConfig::from_hf_json(&json).map_err(|p| Error::model(origin, p))?;
    let sq = sharded::stored_quant(&json, origin)?;
    check_fp8_blocks(sq, &cfg, origin)?;
    let threshold = match sq {
        sharded::StoredQuant::BnbInt8 { threshold } => Some(threshold),
        _ => None,
    };
    let fp8 = match sq {
        sharded::StoredQuant::Fp8(f) => Some(f),
        _ => None,
    };
    let bnb4 = match sq {
        sharded::StoredQuant::Bnb4 {
            quant_type,
            double_quant,
        } => {
            let dtype = match json["torch_dtype"].as_str() {
                Some("bfloat16") => crate::engine::tensor::DType::BF16,
                Some("float32") => crate::engine::tensor::DType::F32,
                _ => crate::engine::tensor::DType::F16,
            };
            let shapes = cfg
                .tensor_shapes()
                .into_iter()
                .filter(|(n, s)| is_projection(n) && s.len() == 2)
                .map(|(n, s)| (n, [s[0], s[1]]))
                .collect();
            Some(ConfigOnlyBnb4 {
                gen: Bnb4Gen {
                    quant_type,
                    double_quant,
                },
                dtype,
                shapes,
            })
        }
        _ => None,
    };
    let bnb_skip = bnb_skip_of(&json, sq, origin)?;
    let names = cfg.vllm_names();
    let quantized_tower = tower_quant::quantized_tower_layer(&json, sq, &cfg, origin);
    Ok((
        cfg,
        Box::new(ConfigOnly {
            config: origin.to_path_buf(),
            bnb_skip,
            names,
            int8: threshold.is_some(),
            bnb4,
            fp8,
            packed4: sq.packed4(),
            nvfp4: sq.nvfp4(),
            sparse24: sq.sparse24(),
            quantized_tower,
        }),
        threshold,
    ))
}

/// The weights of a model of which only `config.json` is here: shapes for a dry run, and a
/// clear error for anything that needs values.
struct ConfigOnly {
    config: PathBuf,
    /// A bitsandbytes checkpoint's `llm_int8_skip_modules` (linear layers kept 16-bit).
    bnb_skip: Vec<String>,
    /// A multimodal model's names as vLLM reads them (the skip list is matched under them).
    names: Option<&'static checkpoint_names::VllmNames>,
    /// A bitsandbytes 8-bit checkpoint (its linear layers would be stored as int8).
    int8: bool,
    /// A bitsandbytes 4-bit checkpoint: what its quant states would say.
    bnb4: Option<ConfigOnlyBnb4>,
    /// A pre-quantized fp8 checkpoint: its linear layers would be F8_E4M3 with their scales.
    fp8: Option<crate::quant::fp8::StoredFp8>,
    /// An AWQ / GPTQ checkpoint: every projection stored in that format.
    packed4: Option<crate::quant::marlin::Format>,
    /// An NVFP4 checkpoint: every projection stored in that format.
    nvfp4: Option<crate::quant::nvfp4::Flavor>,
    /// A 2:4 sparse checkpoint: every projection stored in that form.
    sparse24: Option<crate::quant::sparse24::Sparse24>,
    /// The refusal for a multimodal tower layer the quantization config leaves quantized.
    quantized_tower: Option<weights::QuantizedTower>,
}

/// The 4-bit layout `quantization_config` implies for a config-only model: transformers'
/// blocks of 64 (nested blocks of 256) in `torch_dtype`, for every linear weight.
struct ConfigOnlyBnb4 {
    gen: Bnb4Gen,
    dtype: crate::engine::tensor::DType,
    shapes: std::collections::HashMap<String, [usize; 2]>,
}

impl WeightSource for ConfigOnly {
    fn quantized_tower(&self) -> Option<weights::QuantizedTower> {
        self.quantized_tower.clone()
    }
    fn origin(&self) -> String {
        self.config.display().to_string()
    }
    fn read_f32(&self, name: &str, _shape: &[usize]) -> Result<Vec<f32>> {
        Err(Error::model(
            &self.config,
            format!("only config.json is here: reading {name} needs the weights (a dry run, sim:PRESET:dry, needs none)"),
        ))
    }
    fn has_weights(&self) -> bool {
        false
    }
    fn bnb_skipped(&self, name: &str) -> bool {
        checkpoint_names::bnb_weight_skipped(self.names, name, &self.bnb_skip)
    }
    fn is_int8(&self, name: &str) -> bool {
        // The linear layers of the decoder, as bitsandbytes stores them.
        self.int8
            && !self.bnb_skipped(name)
            && name.contains(".layers.")
            && name.ends_with(".weight")
            && !name.contains("norm")
    }
    fn bnb4(&self, name: &str) -> Option<crate::quant::bnb4::Bnb4Meta> {
        let b = self.bnb4.as_ref().filter(|_| !self.bnb_skipped(name))?;
        Some(crate::quant::bnb4::Bnb4Meta {
            quant_type: b.gen.quant_type,
            blocksize: crate::quant::bnb4::BLOCKSIZE,
            dtype: b.dtype,
            shape: *b.shapes.get(name)?,
            nested_blocksize: b
                .gen
                .double_quant
                .then_some(crate::quant::bnb4::NESTED_BLOCKSIZE),
            offset: 0.0,
        })
    }
    fn stored_fp8(&self) -> Option<crate::quant::fp8::StoredFp8> {
        self.fp8
    }
    fn packed4(&self) -> Option<crate::quant::marlin::Format> {
        self.packed4
    }
    fn nvfp4(&self) -> Option<crate::quant::nvfp4::Flavor> {
        self.nvfp4
    }
    fn sparse24(&self) -> Option<crate::quant::sparse24::Sparse24> {
        self.sparse24
    }
    /// No values: a dry run's shapes only (the values need the checkpoint).
    fn read_sparse24(
        &self,
        name: &str,
        _n: usize,
        _k: usize,
        data: bool,
    ) -> Result<crate::quant::sparse24::Parts> {
        if data {
            return Err(Error::model(
                &self.config,
                format!("{name}: config.json only, no weights: a 2:4 checkpoint without its safetensors runs dry only"),
            ));
        }
        Ok(Default::default())
    }
    /// The shapes config.json implies (inputs in whole blocks of 16); no values.
    fn read_nvfp4(
        &self,
        name: &str,
        n: usize,
        k: usize,
        data: bool,
    ) -> Result<crate::quant::nvfp4::Parts> {
        if !k.is_multiple_of(crate::quant::nvfp4::GROUP) {
            return Err(Error::model(
                &self.config,
                format!("{name} [{n}, {k}]: the inputs are not a multiple of NVFP4's blocks of 16"),
            ));
        }
        if data {
            return self.read_f32(name, &[n, k]).map(|_| Default::default());
        }
        Ok(Default::default())
    }
    /// The shapes config.json implies, checked against Marlin's rules; no values.
    fn read_packed4(
        &self,
        name: &str,
        n: usize,
        k: usize,
        data: bool,
    ) -> Result<crate::quant::marlin::Parts> {
        let fmt = self.packed4.ok_or_else(|| {
            Error::model(
                &self.config,
                format!("tensor {name} is not stored as AWQ or GPTQ"),
            )
        })?;
        if let Some(p) = fmt.layout_problem(n, k) {
            return Err(Error::model(&self.config, format!("{name}: {p}")));
        }
        if data {
            return self.read_f32(name, &[n, k]).map(|_| Default::default());
        }
        Ok(Default::default())
    }
}

/// Opens a preset or a file: reads config.json, validates the weights' header against it.
pub fn open(source: &ModelSource, seed: u64) -> Result<OpenedModel> {
    match source {
        ModelSource::Preset { name } if presets::published_fp8_json(name).is_some() => {
            // A checkpoint published block-wise fp8: its config.json, opened as a config-only
            // model (shapes and stored formats; no values).
            let json = presets::published_fp8_json(name).unwrap_or_default();
            let origin = PathBuf::from(format!("preset:{name}"));
            let (config, source, stored_int8_threshold) = config_only(json, &origin)?;
            Ok(OpenedModel {
                name: name.clone(),
                config,
                source,
                stored_int8_threshold,
            })
        }
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
                stored_int8_threshold: None,
            })
        }
        ModelSource::Path { path } => {
            let files = resolve_files(path)?;
            let (mut config, source, stored_int8_threshold) = open_files(&files)?;
            // Qwen2.5-VL's dummy image comes from the image processor's pixel bounds: the
            // checkpoint's preprocessor_config.json where there is one beside config.json.
            if let (Some(mm), Some(dir)) = (config.qwen2_5_vl.as_mut(), files.config.parent()) {
                let pre = dir.join("preprocessor_config.json");
                if let Ok(text) = std::fs::read_to_string(&pre) {
                    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                        Error::Request(format!("{}: not JSON ({e})", pre.display()))
                    })?;
                    mm.read_preprocessor(&v)
                        .map_err(|e| Error::Request(format!("{}: {e}", dir.display())))?;
                }
            }
            // Kimi-VL's dummy image comes from the image processor's `in_token_limit`, read
            // the same way.
            if let (Some(mm), Some(dir)) = (config.kimi_vl.as_mut(), files.config.parent()) {
                let pre = dir.join("preprocessor_config.json");
                if let Ok(text) = std::fs::read_to_string(&pre) {
                    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                        Error::Request(format!("{}: not JSON ({e})", pre.display()))
                    })?;
                    mm.read_preprocessor(&v)
                        .map_err(|e| Error::Request(format!("{}: {e}", dir.display())))?;
                }
            }
            let name = match files.format {
                FileFormat::Gguf => files.weights.file_stem(),
                FileFormat::Safetensors | FileFormat::ConfigOnly => {
                    files.config.parent().and_then(|d| d.file_name())
                }
            }
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
            let name = files
                .config
                .parent()
                .and_then(hub_id_of_snapshot)
                .unwrap_or(name);
            Ok(OpenedModel {
                name,
                config,
                source,
                stored_int8_threshold,
            })
        }
        ModelSource::Synthetic { .. } => Err(Error::Request(
            "a synthetic workload has no model config".into(),
        )),
    }
}

/// The hub id a Hugging Face cache snapshot folder holds (`…/models--ORG--NAME/snapshots/REV`
/// is `ORG/NAME`), so a model found in the cache is named as the user named it, not by its
/// revision hash.
fn hub_id_of_snapshot(dir: &Path) -> Option<String> {
    let snapshots = dir.parent()?;
    if snapshots.file_name()? != "snapshots" {
        return None;
    }
    let repo = snapshots.parent()?.file_name()?.to_str()?;
    let id = repo.strip_prefix("models--")?;
    let (org, name) = id.split_once("--")?;
    (!org.is_empty() && !name.is_empty()).then(|| format!("{org}/{name}"))
}

/// What `vramscope inspect` prints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Inspection {
    pub path: PathBuf,
    pub format: FileFormat,
    pub config: ModelConfig,
    pub parameters: u64,
    pub tensors: usize,
    /// (dtype, tensor count, bytes)
    pub by_dtype: Vec<(String, usize, u64)>,
    /// GGUF metadata (key, value as text); config.json's `quantization_config` for
    /// safetensors.
    pub metadata: Vec<(String, String)>,
    pub shards: usize,
}

pub fn inspect(path: &Path) -> Result<Inspection> {
    let files = resolve_files(path)?;
    let mut by: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
    let mut params = 0u64;
    let mut count = 0;
    let (config, metadata) = match files.format {
        FileFormat::Gguf => {
            let mut g = gguf::GgufFile::open(&files.weights)?;
            let cfg = g.config_checked()?;
            for t in &g.header.tensors {
                params += t.numel();
                count += 1;
                let e = by.entry(t.ggml_type.name().to_string()).or_default();
                e.0 += 1;
                e.1 += t.range.len() as u64;
            }
            let mut md = vec![("GGUF.version".to_string(), g.header.version.to_string())];
            md.extend(
                g.header
                    .metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string())),
            );
            (cfg, md)
        }
        FileFormat::ConfigOnly => {
            let json = config_with_quant_file(&files.config)?;
            let cfg =
                ModelConfig::from_hf_json(&json).map_err(|p| Error::model(&files.config, p))?;
            params = cfg.param_count();
            count = cfg.tensor_shapes().len();
            let md = vec![(
                "weights".to_string(),
                "none here: config.json only (dry runs)".to_string(),
            )];
            (cfg, md)
        }
        FileFormat::Safetensors => {
            let (json, cfg, _, st) = open_safetensors(&files)?;
            for name in st.tensor_names() {
                let (d, shape) = st.info(name).expect("listed");
                let n: u64 = shape.iter().product::<usize>() as u64;
                let bnb4 = st.bnb4(name);
                // bitsandbytes' scales and quant states are not parameters of the model; a
                // 4-bit weight holds its quant state's shape.
                // An AWQ / GPTQ weight counts its codes (8 an int32); zeros, scales and
                // g_idx are not parameters.
                let packed = st.stored_quant.packed4().is_some();
                let packed_part = packed
                    && [
                        ".qzeros",
                        ".scales",
                        ".g_idx",
                        ".weight_zero_point",
                        ".weight_g_idx",
                        ".weight_shape",
                    ]
                    .iter()
                    .any(|s| name.ends_with(s));
                // An NVFP4 weight counts its codes (2 a byte); its block, global and input
                // scales are not parameters.
                let nvfp4 = st.stored_quant.nvfp4().is_some();
                let nvfp4_scale = nvfp4
                    && [
                        ".weight_global_scale",
                        ".input_global_scale",
                        ".weight_scale_2",
                    ]
                    .iter()
                    .any(|s| name.ends_with(s));
                // A 2:4 bitmask weight's kept values stand for twice as many parameters; its
                // mask and shape are not parameters.
                let bitmask24 = st
                    .stored_quant
                    .sparse24()
                    .is_some_and(|s| s.format == crate::quant::sparse24::Format::Bitmask);
                if let Some(m) = &bnb4 {
                    params += m.numel() as u64;
                } else if bitmask24 && name.ends_with(".compressed") {
                    params += 2 * n;
                } else if bitmask24 && (name.ends_with(".bitmask") || name.ends_with(".shape")) {
                } else if nvfp4 && st.is_u8(name) {
                    params += 2 * n;
                } else if nvfp4_scale {
                } else if packed && (name.ends_with(".qweight") || name.ends_with(".weight_packed"))
                {
                    params += n * crate::quant::marlin::PACK as u64;
                } else if ![".SCB", ".weight_scale", ".input_scale", ".weight_scale_inv"]
                    .iter()
                    .any(|s| name.ends_with(s))
                    && !name.contains(".weight.")
                    && !packed_part
                {
                    // fp8's scales are not parameters of the model either.
                    params += n;
                }
                count += 1;
                // U8 and F8_E4M3 (fp8 codes) take a byte an element, I32 four.
                let (u8, f8, i32) = (st.is_u8(name), st.is_f8_e4m3(name), st.is_i32(name));
                let kind = match d {
                    Some(d) => d.name().to_string(),
                    None if u8 => "U8".into(),
                    None if f8 => "F8_E4M3".into(),
                    None if i32 => "I32".into(),
                    // Any other dtype (compressed-tensors' I64 `weight_shape`) as the header
                    // names it, with its stored bytes.
                    None => st.stored_dtype_and_bytes(name).0,
                };
                let bytes = match d {
                    Some(d) => n * d.size_bytes() as u64,
                    None if u8 || f8 => n,
                    None if i32 => 4 * n,
                    None => st.stored_dtype_and_bytes(name).1,
                };
                let e = by.entry(kind).or_default();
                e.0 += 1;
                e.1 += bytes;
            }
            let md = match json.get("quantization_config") {
                Some(q) => vec![("quantization_config".to_string(), q.to_string())],
                None => vec![],
            };
            (cfg, md)
        }
    };
    Ok(Inspection {
        path: files.weights,
        format: files.format,
        config,
        parameters: params,
        tensors: count,
        by_dtype: by.into_iter().map(|(k, (c, b))| (k, c, b)).collect(),
        metadata,
        shards: files.shards.len(),
    })
}

/// What a generated tensor holds.
#[derive(Clone, Copy)]
enum LazyKind {
    /// Synthetic values in the generator's float dtype.
    Float,
    /// LLM.int8 `CB` of the synthetic values.
    Int8Cb,
    /// LLM.int8 `SCB` (row absmax) of the weight `name`.
    Int8Scb,
    /// One part of the weight's bitsandbytes 4-bit form (`Linear4bit._save_to_state_dict`).
    Bnb4(Bnb4Part, Bnb4Gen),
    /// The weight's float8_e4m3fn codes at its per-tensor scale (`gen_model_fp8`).
    Fp8Codes,
    /// Its `weight_scale`, F32 `[]`: absmax / 448.
    Fp8Scale,
    /// Its `input_scale`, F32 `[]`: `GEN_FP8_INPUT_SCALE`.
    Fp8InputScale,
    /// The weight's float8_e4m3fn codes at its blocks' scales (`gen_model_fp8_block`).
    Fp8BlockCodes(crate::quant::fp8_block::BlockSize),
    /// Its `weight_scale_inv`, F32 `[ceil(n / bn), ceil(k / bk)]`: each block's absmax / 448.
    Fp8BlockScaleInv(crate::quant::fp8_block::BlockSize),
    /// The weight's float8_e4m3fn codes, each row at its own scale (`Fp8Gen::Channel`).
    Fp8ChannelCodes,
    /// Its `weight_scale`, F32 `[n, 1]`: each row's absmax / 448.
    Fp8ChannelScale,
    /// The weight's int8 codes, each row at its own scale (`Fp8Gen::Int8Channel`), and its
    /// F32 `[n, 1]` scales.
    Int8ChannelCodes,
    Int8ChannelScale,
    /// One stored tensor of the weight's AWQ / GPTQ form.
    Packed4(Packed4Part, crate::quant::marlin::Format),
    /// gpt-oss's MXFP4 `*_blocks` or `*_scales`, U8 (`quant::mxfp4::synthetic_bytes`).
    Mxfp4,
}

/// The tensors AutoAWQ / AutoGPTQ store for one linear (`g_idx`: GPTQ only).
#[derive(Clone, Copy, PartialEq)]
enum Packed4Part {
    QWeight,
    QZeros,
    Scales,
    GIdx,
    /// compressed-tensors' I64 `weight_shape` `[2]`: the unpacked `[n, k]`.
    Shape,
}

/// The fp8 checkpoint `gen-model` writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fp8Gen {
    /// AutoFP8's per-tensor scales; `true` for the static activation scheme.
    PerTensor(bool),
    /// Block-wise (`weight_block_size`), as Qwen3-FP8 and DeepSeek-V3 are published.
    Block(crate::quant::fp8_block::BlockSize),
    /// compressed-tensors' `FP8_DYNAMIC` scheme (LLM Compressor, RedHatAI's `…-FP8-dynamic`):
    /// one scale per output channel (`[n, 1]` F32), dynamic per-token activations.
    Channel,
    /// compressed-tensors' int8 W8A8 (LLM Compressor's `W8A8` preset, RedHatAI's
    /// `…-quantized.w8a8`): I8 weights, one F32 scale per output channel (`max |row| /
    /// 127.5`, compressed-tensors' symmetric `calculate_qparams`: `max / (255 / 2)`), dynamic
    /// symmetric per-token int8 activations.
    Int8Channel,
}

/// The `input_scale` `gen-model --fp8-static` stores for every linear layer: 8 / 448, so
/// activations up to ±8 quantize without clipping (e4m3 keeps 3 mantissa bits down to
/// 2^-6 · 8 / 448 ≈ 2.8e-4 and subnormals below). A calibrated checkpoint (AutoFP8) stores
/// each layer's observed absmax / 448 instead; any positive value loads the same way.
pub const GEN_FP8_INPUT_SCALE: f32 = 8.0 / 448.0;

/// The tensors `QuantState.as_dict(packed=True)` writes for one weight, besides the codes.
#[derive(Clone, Copy, PartialEq)]
enum Bnb4Part {
    Packed,
    Absmax,
    QuantMap,
    NestedAbsmax,
    NestedQuantMap,
    /// `quant_state.bitsandbytes__{nf4,fp4}`: the JSON of the non-tensor items.
    Blob,
}

/// How `gen-model --bnb-4bit` quantizes: the 4-bit type and whether the absmax is
/// double-quantized (`bnb_4bit_use_double_quant`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bnb4Gen {
    pub quant_type: crate::quant::bnb4::Bnb4Type,
    pub double_quant: bool,
}

/// A tensor generated on demand while the file is written, so memory stays at one tensor.
struct LazyTensor<'a> {
    gen: &'a SyntheticWeights,
    /// The weight the values come from (for `.SCB`, the weight it scales).
    source: String,
    shape: Vec<usize>,
    kind: LazyKind,
}

impl LazyTensor<'_> {
    /// The stored dtype and its element size.
    fn stored(&self) -> (safetensors::Dtype, usize) {
        use safetensors::Dtype as D;
        let float = |d: StoredDtype| match d {
            StoredDtype::F32 => (D::F32, 4),
            StoredDtype::F16 => (D::F16, 2),
            StoredDtype::BF16 => (D::BF16, 2),
            StoredDtype::I8 => (D::I8, 1),
        };
        match self.kind {
            LazyKind::Float => float(self.gen.dtype),
            LazyKind::Int8Cb => (D::I8, 1),
            LazyKind::Int8Scb => (D::F32, 4),
            LazyKind::Fp8Codes => (D::F8_E4M3, 1),
            LazyKind::Fp8Scale | LazyKind::Fp8InputScale => (D::F32, 4),
            LazyKind::Fp8BlockCodes(_) => (D::F8_E4M3, 1),
            LazyKind::Fp8BlockScaleInv(_) => (D::F32, 4),
            LazyKind::Fp8ChannelCodes => (D::F8_E4M3, 1),
            LazyKind::Fp8ChannelScale => (D::F32, 4),
            LazyKind::Int8ChannelCodes => (D::I8, 1),
            LazyKind::Int8ChannelScale => (D::F32, 4),
            LazyKind::Bnb4(part, g) => match part {
                Bnb4Part::Absmax if !g.double_quant => (D::F32, 4),
                Bnb4Part::Packed | Bnb4Part::Absmax | Bnb4Part::Blob => (D::U8, 1),
                _ => (D::F32, 4),
            },
            LazyKind::Packed4(Packed4Part::Scales, _) => (D::F16, 2),
            LazyKind::Packed4(Packed4Part::Shape, _) => (D::I64, 8),
            LazyKind::Packed4(..) => (D::I32, 4),
            LazyKind::Mxfp4 => (D::U8, 1),
        }
    }

    /// The weight's AWQ / GPTQ tensors, quantized round-to-nearest from the stored values
    /// (scales in f16, as AutoAWQ and AutoGPTQ store them).
    /// The tensors of one weight are written one after the other, so the last weight's parts
    /// are kept (per writing thread) rather than made again for each tensor.
    fn packed4_parts(
        &self,
        fmt: crate::quant::marlin::Format,
    ) -> std::rc::Rc<crate::quant::marlin::Parts> {
        use crate::quant::marlin::{Format, Parts};
        use std::rc::Rc;
        thread_local! {
            static LAST: std::cell::RefCell<Option<(String, Format, Rc<Parts>)>> =
                const { std::cell::RefCell::new(None) };
        }
        let key = format!(
            "{}/{:?}/{}/{:?}",
            self.source, self.shape, self.gen.seed, self.gen.dtype
        );
        if let Some(p) = LAST.with_borrow(|l| {
            l.as_ref()
                .filter(|(s, f, _)| *s == key && *f == fmt)
                .map(|(_, _, p)| p.clone())
        }) {
            return p;
        }
        let (n, k) = (self.shape[0], self.shape[1]);
        let w = self.gen.generate(&self.source, n * k);
        let p = Rc::new(crate::quant::marlin::quantize(
            &fmt,
            &w,
            n,
            k,
            crate::engine::tensor::DType::F16,
        ));
        LAST.with_borrow_mut(|l| *l = Some((key, fmt, p.clone())));
        p
    }

    /// The weight's 4-bit form, as `quantize_4bit` makes it from the stored 16-bit values.
    fn bnb4_parts(&self, g: Bnb4Gen) -> crate::quant::bnb4::Bnb4Parts {
        let (n, k) = (self.shape[0], self.shape[1]);
        let w = self.gen.generate(&self.source, n * k);
        let dtype = match self.gen.dtype {
            StoredDtype::BF16 => crate::engine::tensor::DType::BF16,
            StoredDtype::F32 => crate::engine::tensor::DType::F32,
            _ => crate::engine::tensor::DType::F16,
        };
        crate::quant::bnb4::quantize_parts(&w, [n, k], g.quant_type, g.double_quant, dtype)
    }

    /// The shape written to the file (a 4-bit part's own; the generator keeps `[n, k]`).
    fn disk_shape(&self) -> Vec<usize> {
        let numel = || self.shape.iter().product::<usize>();
        let blocks = || numel().div_ceil(crate::quant::bnb4::BLOCKSIZE);
        match self.kind {
            LazyKind::Int8Scb => vec![self.shape[0]],
            // AutoFP8 saves its per-tensor scales as 0-dim tensors.
            LazyKind::Fp8Scale | LazyKind::Fp8InputScale => vec![],
            LazyKind::Fp8BlockScaleInv(b) => b.grid(self.shape[0], self.shape[1]).to_vec(),
            LazyKind::Fp8ChannelScale | LazyKind::Int8ChannelScale => vec![self.shape[0], 1],
            LazyKind::Bnb4(part, g) => match part {
                Bnb4Part::Packed => vec![numel().div_ceil(2), 1],
                Bnb4Part::Absmax => vec![blocks()],
                Bnb4Part::QuantMap => vec![16],
                Bnb4Part::NestedAbsmax => {
                    vec![blocks().div_ceil(crate::quant::bnb4::NESTED_BLOCKSIZE)]
                }
                Bnb4Part::NestedQuantMap => vec![256],
                Bnb4Part::Blob => vec![self.blob(g).len()],
            },
            LazyKind::Packed4(part, fmt) => {
                let (n, k) = (self.shape[0], self.shape[1]);
                let pack = crate::quant::marlin::PACK;
                match part {
                    Packed4Part::QWeight if fmt.compressed_tensors => vec![n, k / pack],
                    Packed4Part::Scales if fmt.compressed_tensors => vec![n, fmt.groups(k)],
                    Packed4Part::QWeight => fmt.qweight_shape(n, k).to_vec(),
                    Packed4Part::QZeros => vec![fmt.groups(k), n / pack],
                    Packed4Part::Scales => vec![fmt.groups(k), n],
                    Packed4Part::GIdx => vec![k],
                    Packed4Part::Shape => vec![2],
                }
            }
            _ => self.shape.clone(),
        }
    }

    /// The quant-state JSON as `pack_dict_to_tensor` writes it (utf-8 bytes of json.dumps).
    fn blob(&self, g: Bnb4Gen) -> Vec<u8> {
        let parts = if g.double_quant {
            self.bnb4_parts(g)
        } else {
            // Only a nested offset needs the values; skip quantizing otherwise.
            crate::quant::bnb4::Bnb4Parts {
                quant_type: g.quant_type,
                blocksize: crate::quant::bnb4::BLOCKSIZE,
                dtype: match self.gen.dtype {
                    StoredDtype::BF16 => crate::engine::tensor::DType::BF16,
                    StoredDtype::F32 => crate::engine::tensor::DType::F32,
                    _ => crate::engine::tensor::DType::F16,
                },
                shape: [self.shape[0], self.shape[1]],
                packed: vec![],
                code: vec![],
                absmax: crate::quant::bnb4::Absmax::F32(vec![]),
            }
        };
        parts.blob_text().into_bytes()
    }
}

impl safetensors::View for LazyTensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.stored().0
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        let mut out = Vec::with_capacity(self.data_len());
        match self.kind {
            LazyKind::Float => {
                for v in self.gen.generate(&self.source, self.shape.iter().product()) {
                    match self.gen.dtype {
                        StoredDtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
                        StoredDtype::F16 => {
                            out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes())
                        }
                        StoredDtype::BF16 => {
                            out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes())
                        }
                        StoredDtype::I8 => unreachable!("int8 is not a generator dtype"),
                    }
                }
            }
            LazyKind::Bnb4(part, g) => {
                use crate::quant::bnb4::Absmax;
                let f32s = |out: &mut Vec<u8>, v: &[f32]| {
                    v.iter()
                        .for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
                };
                if part == Bnb4Part::Blob {
                    out = self.blob(g);
                } else {
                    let p = self.bnb4_parts(g);
                    match (part, &p.absmax) {
                        (Bnb4Part::Packed, _) => out = p.packed,
                        (Bnb4Part::QuantMap, _) => f32s(&mut out, &p.code),
                        (Bnb4Part::Absmax, Absmax::F32(a)) => f32s(&mut out, a),
                        (Bnb4Part::Absmax, Absmax::Nested { q, .. }) => out = q.clone(),
                        (Bnb4Part::NestedAbsmax, Absmax::Nested { nested_absmax, .. }) => {
                            f32s(&mut out, nested_absmax)
                        }
                        (Bnb4Part::NestedQuantMap, Absmax::Nested { nested_code, .. }) => {
                            f32s(&mut out, nested_code)
                        }
                        _ => {}
                    }
                }
            }
            LazyKind::Fp8Codes | LazyKind::Fp8Scale => {
                // `ops.scaled_fp8_quant(w)` of the 16-bit weight: scale absmax / 448, codes
                // by the kernel's clamp-and-round (what vLLM's in-flight fp8 computes).
                let w = self.gen.generate(&self.source, self.shape.iter().product());
                let (codes, scale) = crate::quant::fp8::quantize_per_tensor(&w);
                match self.kind {
                    LazyKind::Fp8Codes => out = codes,
                    _ => out.extend_from_slice(&scale.to_le_bytes()),
                }
            }
            LazyKind::Fp8InputScale => out.extend_from_slice(&GEN_FP8_INPUT_SCALE.to_le_bytes()),
            LazyKind::Fp8ChannelCodes | LazyKind::Fp8ChannelScale => {
                // LLM Compressor's channel-wise fp8: each output row at its absmax / 448.
                let (n, k) = (self.shape[0], self.shape[1]);
                let w = self.gen.generate(&self.source, n * k);
                for row in w.chunks_exact(k) {
                    let (codes, scale) = crate::quant::fp8::quantize_per_tensor(row);
                    match self.kind {
                        LazyKind::Fp8ChannelCodes => out.extend_from_slice(&codes),
                        _ => out.extend_from_slice(&scale.to_le_bytes()),
                    }
                }
            }
            LazyKind::Int8ChannelCodes | LazyKind::Int8ChannelScale => {
                // compressed-tensors' symmetric int8: scale max |row| / 127.5, codes
                // round(w / scale) clamped to [-128, 127].
                let (n, k) = (self.shape[0], self.shape[1]);
                let w = self.gen.generate(&self.source, n * k);
                for row in w.chunks_exact(k) {
                    let m = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    let scale = if m > 0.0 { m / 127.5 } else { 1.0 };
                    match self.kind {
                        LazyKind::Int8ChannelCodes => out.extend(row.iter().map(|&v| {
                            (v / scale).round_ties_even().clamp(-128.0, 127.0) as i8 as u8
                        })),
                        _ => out.extend_from_slice(&scale.to_le_bytes()),
                    }
                }
            }
            LazyKind::Fp8BlockCodes(b) | LazyKind::Fp8BlockScaleInv(b) => {
                let (n, k) = (self.shape[0], self.shape[1]);
                let w = self.gen.generate(&self.source, n * k);
                let (codes, scales) = crate::quant::fp8_block::quantize_weight(&w, n, k, b);
                match self.kind {
                    LazyKind::Fp8BlockCodes(_) => out = codes,
                    _ => scales
                        .iter()
                        .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
                }
            }
            LazyKind::Packed4(part, fmt) => {
                let p = self.packed4_parts(fmt);
                let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let (n, k) = (self.shape[0], self.shape[1]);
                // compressed-tensors keeps the output first: the same words and scales as
                // GPTQ's, transposed (`pack_to_int32` packs along the input of `[n, k]`).
                let transposed = |v: &[i32], rows: usize, cols: usize| -> Vec<i32> {
                    (0..cols)
                        .flat_map(|c| (0..rows).map(move |r| v[r * cols + c]))
                        .collect()
                };
                out = match part {
                    Packed4Part::QWeight if fmt.compressed_tensors => {
                        i32s(&transposed(&p.qweight, k / crate::quant::marlin::PACK, n))
                    }
                    Packed4Part::Scales if fmt.compressed_tensors => {
                        let groups = fmt.groups(k);
                        (0..n)
                            .flat_map(|c| (0..groups).map(move |g| (g, c)))
                            .flat_map(|(g, c)| {
                                half::f16::from_f32(p.scales[g * n + c]).to_le_bytes()
                            })
                            .collect()
                    }
                    Packed4Part::Shape => [n as i64, k as i64]
                        .iter()
                        .flat_map(|x| x.to_le_bytes())
                        .collect(),
                    Packed4Part::QWeight => i32s(&p.qweight),
                    Packed4Part::QZeros => i32s(&p.qzeros),
                    Packed4Part::GIdx => i32s(p.g_idx.as_deref().unwrap_or(&[])),
                    Packed4Part::Scales => p
                        .scales
                        .iter()
                        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                        .collect(),
                };
            }
            LazyKind::Mxfp4 => {
                out = crate::quant::mxfp4::synthetic_bytes(
                    self.gen.seed,
                    &self.source,
                    self.shape.iter().product(),
                )
            }
            LazyKind::Int8Cb | LazyKind::Int8Scb => {
                // Both carry the weight's [n, k]; the scales are written as [n] (`OnDisk`).
                let (n, k) = (self.shape[0], self.shape[1]);
                let w = self.gen.generate(&self.source, n * k);
                let (cb, scb) = crate::quant::int8::quantize_rows(&w, n, k);
                match self.kind {
                    LazyKind::Int8Cb => out.extend(cb.iter().map(|&q| q as u8)),
                    _ => scb
                        .iter()
                        .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
                }
            }
        }
        std::borrow::Cow::Owned(out)
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.stored().1
    }
}

/// What `gen-model` writes.
#[derive(Clone, Debug)]
pub struct GenOptions {
    pub dtype: StoredDtype,
    pub seed: u64,
    /// Number of `.safetensors` shards (1: a single `model.safetensors`).
    pub shards: usize,
    /// Store the projection weights as a bitsandbytes 8-bit checkpoint (int8 `CB` + `SCB`,
    /// `quantization_config.load_in_8bit`); embeddings, norms and lm_head stay 16-bit.
    pub bnb_int8: bool,
    /// With a bitsandbytes checkpoint: modules kept in `dtype` and listed in
    /// `llm_int8_skip_modules` (as Unsloth's dynamic 4-bit checkpoints keep some layers).
    pub bnb_skip_modules: Vec<String>,
}

/// Writes `model.safetensors` + `config.json` of a preset with seeded synthetic weights.
pub fn gen_model(preset: &str, dir: &Path, dtype: StoredDtype, seed: u64) -> Result<ModelFiles> {
    gen_model_with(
        preset,
        dir,
        &GenOptions {
            dtype,
            seed,
            shards: 1,
            bnb_int8: false,
            bnb_skip_modules: Vec::new(),
        },
    )
}

/// The weights transformers quantizes with bitsandbytes: every `nn.Linear` but the lm_head
/// (for OPT also fc1/fc2 and project_in/out).
fn is_projection(name: &str) -> bool {
    (name.starts_with("model.layers.") && name.ends_with("_proj.weight"))
        || (name.starts_with("model.decoder.")
            && [
                "_proj.weight",
                ".fc1.weight",
                ".fc2.weight",
                ".project_in.weight",
                ".project_out.weight",
            ]
            .iter()
            .any(|s| name.ends_with(s)))
}

/// Whether a tensor `gen-model` stored under `stored` is a projection of the language
/// model's layers (by its config name, whatever layout the family is stored in), for the
/// writers that rewrite a 16-bit checkpoint's projections.
pub(crate) fn is_stored_projection(config: &ModelConfig, stored: &str) -> bool {
    let name = config
        .vllm_names()
        .map_or(stored, |n| n.unpublished_name(stored));
    name.starts_with("model.layers.") && name.ends_with("_proj.weight")
}

/// Writes a preset with seeded synthetic weights: one file or `shards` files with an index,
/// 16/32-bit or as a bitsandbytes 8-bit checkpoint.
pub fn gen_model_with(preset: &str, dir: &Path, opts: &GenOptions) -> Result<ModelFiles> {
    let config = preset_config(preset)?;
    gen_model_config(&config, preset, dir, opts)
}

/// `gen_model_with` for any shape: weights seeded by `seed_name` (a preset's name gives that
/// preset's values) and `opts.seed`.
pub fn gen_model_config(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
) -> Result<ModelFiles> {
    gen_model_config_with(config, seed_name, dir, opts, None)
}

/// A preset's shape for `gen-model`, or the error naming the presets.
fn preset_config(preset: &str) -> Result<ModelConfig> {
    presets::preset(preset).ok_or_else(|| {
        Error::Request(format!(
            "model preset '{preset}' is unknown; presets: {}",
            presets::PRESET_NAMES.join(", ")
        ))
    })
}

/// `gen_model_with` writing a pre-quantized bitsandbytes 4-bit checkpoint, as transformers
/// saves one (`Linear4bit._save_to_state_dict`, `quantization_config.load_in_4bit`): each
/// linear's packed codes and quant state; embeddings, norms and lm_head in `opts.dtype`.
pub fn gen_model_bnb4(
    preset: &str,
    dir: &Path,
    opts: &GenOptions,
    bnb4: Bnb4Gen,
) -> Result<ModelFiles> {
    let config = preset_config(preset)?;
    gen_model_config_with(&config, preset, dir, opts, Some(bnb4))
}

/// `gen_model_with` writing a pre-quantized per-tensor fp8 checkpoint as AutoFP8 saves one
/// (and vLLM 0.6.4's `Fp8Config` reads it): every linear layer of the decoder as F8_E4M3
/// codes with a 0-dim F32 `weight_scale` (absmax / 448 of the 16-bit weight, the codes by the
/// bit-exact encoder), plus a 0-dim `input_scale` (`GEN_FP8_INPUT_SCALE`) under
/// `static_activations`; embeddings, norms and lm_head in `opts.dtype`;
/// `quantization_config` `{"quant_method": "fp8", "activation_scheme": ..., "ignored_layers":
/// ["lm_head"]}`.
pub fn gen_model_fp8(
    preset: &str,
    dir: &Path,
    opts: &GenOptions,
    static_activations: bool,
) -> Result<ModelFiles> {
    let config = preset_config(preset)?;
    gen_model_config_fp8(&config, preset, dir, opts, static_activations)
}

/// `gen_model_fp8` for any shape, seeded by `seed_name`.
pub fn gen_model_config_fp8(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
    static_activations: bool,
) -> Result<ModelFiles> {
    gen_model_inner(
        config,
        seed_name,
        dir,
        opts,
        None,
        Some(Fp8Gen::PerTensor(static_activations)),
        None,
    )
}

/// `gen_model_config_with` writing a compressed-tensors `FP8_DYNAMIC` checkpoint as LLM
/// Compressor saves one (RedHatAI's `…-FP8-dynamic`): every linear layer of the decoder as
/// F8_E4M3 codes with an F32 `[n, 1]` `weight_scale` (each row's absmax / 448 of the seeded
/// 16-bit weight); embeddings, norms and lm_head in `opts.dtype`; its `quantization_config`.
pub fn gen_model_config_fp8_channel(
    config: &ModelConfig,
    name: &str,
    dir: &Path,
    opts: &GenOptions,
) -> Result<ModelFiles> {
    gen_model_inner(config, name, dir, opts, None, Some(Fp8Gen::Channel), None)
}

/// `gen_model_config_with` writing a compressed-tensors int8 W8A8 checkpoint as LLM
/// Compressor saves one (RedHatAI's `…-quantized.w8a8`): every linear layer of the decoder
/// as I8 codes with an F32 `[n, 1]` `weight_scale`; the rest in `opts.dtype`.
pub fn gen_model_config_int8_channel(
    config: &ModelConfig,
    name: &str,
    dir: &Path,
    opts: &GenOptions,
) -> Result<ModelFiles> {
    gen_model_inner(
        config,
        name,
        dir,
        opts,
        None,
        Some(Fp8Gen::Int8Channel),
        None,
    )
}

/// `gen_model_with` writing a block-wise fp8 checkpoint as Qwen/Qwen3-8B-FP8 is published
/// (and vLLM 0.8.5's `Fp8Config` reads it): every linear layer of the decoder as F8_E4M3
/// codes with an F32 `weight_scale_inv` of one dequantization multiplier per `block`
/// (`fp8_block::quantize_weight` of the seeded 16-bit values); embeddings, norms and lm_head
/// in `opts.dtype`; `quantization_config` `{"quant_method": "fp8", "activation_scheme":
/// "dynamic", "fmt": "e4m3", "weight_block_size": [bn, bk]}`. A shape vLLM refuses for
/// that block size is refused here too (`fp8_block::model_problem`).
pub fn gen_model_fp8_block(
    preset: &str,
    dir: &Path,
    opts: &GenOptions,
    block: crate::quant::fp8_block::BlockSize,
) -> Result<ModelFiles> {
    let config = preset_config(preset)?;
    gen_model_config_fp8_block(&config, preset, dir, opts, block)
}

/// `gen_model_fp8_block` for any shape, seeded by `seed_name`.
pub fn gen_model_config_fp8_block(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
    block: crate::quant::fp8_block::BlockSize,
) -> Result<ModelFiles> {
    if let Some(p) = crate::quant::fp8_block::model_problem(
        block,
        &config.decoder_linears(),
        (false, crate::quant::fp8_block::Fp8BlockEra::V0_8),
    ) {
        return Err(Error::Request(format!("gen-model --fp8-block: {p}")));
    }
    gen_model_inner(
        config,
        seed_name,
        dir,
        opts,
        None,
        Some(Fp8Gen::Block(block)),
        None,
    )
}

/// `gen_model_with` writing an AWQ (AutoAWQ GEMM) or GPTQ (AutoGPTQ, symmetric) 4-bit
/// checkpoint: every decoder projection's `qweight`, `qzeros`, `scales` (and GPTQ's `g_idx`),
/// quantized round-to-nearest per group from the seeded 16-bit values (`marlin::quantize`);
/// embeddings, norms and lm_head in `opts.dtype`; `quantization_config` as AutoAWQ /
/// AutoGPTQ write it.
pub fn gen_model_packed4(
    preset: &str,
    dir: &Path,
    opts: &GenOptions,
    fmt: crate::quant::marlin::Format,
) -> Result<ModelFiles> {
    let config = preset_config(preset)?;
    gen_model_inner(&config, preset, dir, opts, None, None, Some(fmt))
}

/// `gen_model_packed4` for any shape, seeded by `seed_name`.
pub fn gen_model_config_packed4(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
    fmt: crate::quant::marlin::Format,
) -> Result<ModelFiles> {
    gen_model_inner(config, seed_name, dir, opts, None, None, Some(fmt))
}

/// `gen_model_config`, optionally as a pre-quantized bitsandbytes 4-bit checkpoint.
pub fn gen_model_config_with(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
    bnb4: Option<Bnb4Gen>,
) -> Result<ModelFiles> {
    gen_model_inner(config, seed_name, dir, opts, bnb4, None, None)
}

/// The writer behind `gen_model_config_with`, `gen_model_fp8` (`fp8`: the static scheme or
/// not) and `gen_model_packed4`.
fn gen_model_inner(
    config: &ModelConfig,
    seed_name: &str,
    dir: &Path,
    opts: &GenOptions,
    bnb4: Option<Bnb4Gen>,
    fp8: Option<Fp8Gen>,
    packed4: Option<crate::quant::marlin::Format>,
) -> Result<ModelFiles> {
    if config.phi.is_some()
        && (fp8.is_some() || bnb4.is_some() || packed4.is_some() || opts.bnb_int8)
    {
        return Err(Error::Request(
            "gen-model: model_type 'phi' is written in 16 bits only (its quantized linear layers, with biases, are not modelled yet)".into(),
        ));
    }
    if let (Some(Fp8Gen::Block(_)), true) = (fp8, config.arch == "opt" || config.fused_checkpoint())
    {
        return Err(Error::Request(format!(
            "gen-model --fp8-block: model_type '{}' is not written in that format (Llama-family models with separate projections only)",
            config.arch
        )));
    }
    if fp8.is_some() && (opts.bnb_int8 || bnb4.is_some() || packed4.is_some()) {
        return Err(Error::Request(
            "a checkpoint is either fp8, AWQ / GPTQ or bitsandbytes, not two of them".into(),
        ));
    }
    if packed4.is_some() && (bnb4.is_some() || opts.bnb_int8) {
        return Err(Error::Request(
            "a checkpoint is AWQ / GPTQ or bitsandbytes, not both".into(),
        ));
    }
    if let (Some(fmt), true) = (packed4, config.arch == "opt" || config.fused_checkpoint()) {
        return Err(Error::Request(format!(
            "gen-model --{}: model_type '{}' is not written in that format (Llama-family models with separate projections only)",
            fmt.method.name(),
            config.arch
        )));
    }
    if let Some(fmt) = packed4 {
        for (name, shape) in config.tensor_shapes() {
            if is_projection(&name) && shape.len() == 2 {
                if let Some(p) = fmt.shape_problem(shape[0], shape[1]) {
                    return Err(Error::Request(format!(
                        "gen-model --{}: {name} [{}, {}]: {p}",
                        fmt.method.name(),
                        shape[0],
                        shape[1]
                    )));
                }
            }
        }
    }
    if opts.bnb_int8 && bnb4.is_some() {
        return Err(Error::Request(
            "a checkpoint is either bitsandbytes 8-bit or 4-bit, not both".into(),
        ));
    }
    if opts.shards == 0 || opts.shards > 9999 {
        return Err(Error::Request(format!(
            "shards {}: expected 1 to 9999",
            opts.shards
        )));
    }
    if opts.bnb_int8 && opts.dtype == StoredDtype::BF16 {
        // bitsandbytes 0.44 keeps its 16-bit parts in fp16.
        return Err(Error::Request(
            "a bitsandbytes 8-bit checkpoint stores its other weights in f16 or f32, not bf16"
                .into(),
        ));
    }
    if !opts.bnb_skip_modules.is_empty() && !opts.bnb_int8 && bnb4.is_none() {
        return Err(Error::Request(
            "gen-model: skip modules (llm_int8_skip_modules) belong to a bitsandbytes checkpoint: add --bnb-4bit or --bnb-int8".into(),
        ));
    }
    let kept_16bit =
        |name: &str| crate::quant::bnb_skip::weight_skipped(name, &opts.bnb_skip_modules);
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let gen = SyntheticWeights {
        preset: seed_name.to_string(),
        seed: opts.seed,
        dtype: opts.dtype,
    };
    let mut tensors: Vec<(String, LazyTensor)> = Vec::new();
    for (name, shape) in config.tensor_shapes() {
        if let (Some(fmt), true) = (packed4, is_projection(&name)) {
            let base = name.trim_end_matches(".weight").to_string();
            let mut parts = vec![
                ("qweight", Packed4Part::QWeight),
                ("qzeros", Packed4Part::QZeros),
                ("scales", Packed4Part::Scales),
            ];
            if fmt.method == crate::quant::marlin::Method::Gptq {
                parts.push(("g_idx", Packed4Part::GIdx));
            }
            // LLM Compressor's W4A16 (`PackedQuantizationCompressor.compress_weight`):
            // `weight_packed`, `weight_scale`, `weight_shape`, and `weight_g_idx` under
            // act-order "group"; a symmetric scheme stores no zero point.
            if fmt.compressed_tensors {
                parts = vec![
                    ("weight_packed", Packed4Part::QWeight),
                    ("weight_scale", Packed4Part::Scales),
                    ("weight_shape", Packed4Part::Shape),
                ];
                if fmt.desc_act {
                    parts.push(("weight_g_idx", Packed4Part::GIdx));
                }
            }
            for (suffix, part) in parts {
                tensors.push((
                    format!("{base}.{suffix}"),
                    LazyTensor {
                        gen: &gen,
                        source: name.clone(),
                        shape: shape.clone(),
                        kind: LazyKind::Packed4(part, fmt),
                    },
                ));
            }
        } else if let (Some(g), true) = (bnb4, is_projection(&name) && !kept_16bit(&name)) {
            let mut parts = vec![
                (String::new(), Bnb4Part::Packed),
                (".absmax".into(), Bnb4Part::Absmax),
                (".quant_map".into(), Bnb4Part::QuantMap),
            ];
            if g.double_quant {
                parts.push((".nested_absmax".into(), Bnb4Part::NestedAbsmax));
                parts.push((".nested_quant_map".into(), Bnb4Part::NestedQuantMap));
            }
            parts.push((
                format!(".quant_state.bitsandbytes__{}", g.quant_type.name()),
                Bnb4Part::Blob,
            ));
            for (suffix, part) in parts {
                tensors.push((
                    format!("{name}{suffix}"),
                    LazyTensor {
                        gen: &gen,
                        source: name.clone(),
                        shape: shape.clone(),
                        kind: LazyKind::Bnb4(part, g),
                    },
                ));
            }
        } else if let (Some(f), true) = (fp8, is_projection(&name)) {
            let base = name.trim_end_matches(".weight").to_string();
            let mut parts = match f {
                Fp8Gen::Block(b) => vec![
                    (name.clone(), LazyKind::Fp8BlockCodes(b)),
                    (
                        format!("{base}.weight_scale_inv"),
                        LazyKind::Fp8BlockScaleInv(b),
                    ),
                ],
                Fp8Gen::PerTensor(_) => vec![
                    (name.clone(), LazyKind::Fp8Codes),
                    (format!("{base}.weight_scale"), LazyKind::Fp8Scale),
                ],
                Fp8Gen::Channel => vec![
                    (name.clone(), LazyKind::Fp8ChannelCodes),
                    (format!("{base}.weight_scale"), LazyKind::Fp8ChannelScale),
                ],
                Fp8Gen::Int8Channel => vec![
                    (name.clone(), LazyKind::Int8ChannelCodes),
                    (format!("{base}.weight_scale"), LazyKind::Int8ChannelScale),
                ],
            };
            if f == Fp8Gen::PerTensor(true) {
                parts.push((format!("{base}.input_scale"), LazyKind::Fp8InputScale));
            }
            for (n, kind) in parts {
                tensors.push((
                    n,
                    LazyTensor {
                        gen: &gen,
                        source: name.clone(),
                        shape: shape.clone(),
                        kind,
                    },
                ));
            }
        } else if opts.bnb_int8 && is_projection(&name) && !kept_16bit(&name) {
            let base = name.trim_end_matches(".weight").to_string();
            tensors.push((
                name.clone(),
                LazyTensor {
                    gen: &gen,
                    source: name.clone(),
                    shape: shape.clone(),
                    kind: LazyKind::Int8Cb,
                },
            ));
            tensors.push((
                format!("{base}.SCB"),
                LazyTensor {
                    gen: &gen,
                    source: name,
                    // [n, k] kept so the scales can be recomputed; written as [n] below.
                    shape: shape.clone(),
                    kind: LazyKind::Int8Scb,
                },
            ));
        } else {
            let mxfp4 = config.gpt_oss.as_ref().is_some_and(|g| g.mxfp4)
                && (name.ends_with("_blocks") || name.ends_with("_scales"));
            tensors.push((
                name.clone(),
                LazyTensor {
                    gen: &gen,
                    source: name,
                    shape,
                    kind: if mxfp4 {
                        LazyKind::Mxfp4
                    } else {
                        LazyKind::Float
                    },
                },
            ));
        }
    }
    let torch_dtype = match opts.dtype {
        StoredDtype::F32 => "float32",
        StoredDtype::BF16 => "bfloat16",
        _ => "float16",
    };
    // A multimodal checkpoint in its family's published layout (the values stay seeded by
    // the config name, `LazyTensor::source`).
    if let Some(names) = config.vllm_names() {
        for (name, _) in &mut tensors {
            *name = names.published_name(name);
        }
    }
    let (weights, shards, index) = write_shards(dir, tensors, opts.shards)?;
    let cfg_path = dir.join("config.json");
    let mut json = config.to_hf_json(torch_dtype);
    // The skip list as vLLM matches it: its module names (bitsandbytes.py 0.19 maps none, no
    // `apply_vllm_mapper`), and a multimodal tower kept 16-bit named by its roots.
    let skip_list: Vec<String> = match config.vllm_names() {
        None => opts.bnb_skip_modules.clone(),
        Some(names) => opts
            .bnb_skip_modules
            .iter()
            .map(|m| names.vllm_of_config(m))
            .chain(config.tower_roots())
            .collect(),
    };
    let skip_json = if skip_list.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::json!(skip_list)
    };
    let unquantized = config.unquantized_linears();
    if opts.bnb_int8 {
        json["quantization_config"] = serde_json::json!({
            "quant_method": "bitsandbytes",
            "load_in_8bit": true,
            "load_in_4bit": false,
            "llm_int8_threshold": 6.0,
            "llm_int8_has_fp16_weight": false,
            "llm_int8_skip_modules": skip_json,
        });
    }
    match fp8 {
        // AutoFP8's `quantization_config` (what neuralmagic's fp8 checkpoints carry).
        Some(Fp8Gen::PerTensor(static_act)) => {
            json["quantization_config"] = serde_json::json!({
                "quant_method": "fp8",
                "activation_scheme": if static_act { "static" } else { "dynamic" },
                "ignored_layers": unquantized,
            })
        }
        // What LLM Compressor writes for the FP8_DYNAMIC scheme (RedHatAI's
        // `…-FP8-dynamic` checkpoints).
        Some(Fp8Gen::Channel) => {
            json["quantization_config"] = serde_json::json!({
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "quantization_status": "compressed",
                "global_compression_ratio": null,
                "kv_cache_scheme": null,
                "sparsity_config": {},
                "ignore": unquantized,
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"type": "float", "num_bits": 8, "strategy": "channel",
                        "symmetric": true, "dynamic": false, "group_size": null,
                        "observer": "minmax", "actorder": null, "block_structure": null},
                    "input_activations": {"type": "float", "num_bits": 8, "strategy": "token",
                        "symmetric": true, "dynamic": true, "group_size": null,
                        "observer": null, "actorder": null, "block_structure": null},
                    "output_activations": null,
                }},
            })
        }
        // What LLM Compressor writes for its W8A8 (int8) scheme.
        Some(Fp8Gen::Int8Channel) => {
            json["quantization_config"] = serde_json::json!({
                "quant_method": "compressed-tensors",
                "format": "int-quantized",
                "quantization_status": "compressed",
                "global_compression_ratio": null,
                "kv_cache_scheme": null,
                "sparsity_config": {},
                "ignore": unquantized,
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"type": "int", "num_bits": 8, "strategy": "channel",
                        "symmetric": true, "dynamic": false, "group_size": null,
                        "observer": "minmax", "actorder": null, "block_structure": null},
                    "input_activations": {"type": "int", "num_bits": 8, "strategy": "token",
                        "symmetric": true, "dynamic": true, "group_size": null,
                        "observer": null, "actorder": null, "block_structure": null},
                    "output_activations": null,
                }},
            })
        }
        // Qwen/Qwen3-8B-FP8's.
        Some(Fp8Gen::Block(b)) => {
            json["quantization_config"] = serde_json::json!({
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "weight_block_size": [b.n, b.k],
            })
        }
        None => {}
    }
    if let Some(g) = bnb4 {
        // transformers' BitsAndBytesConfig.to_dict() for load_in_4bit.
        json["quantization_config"] = serde_json::json!({
            "quant_method": "bitsandbytes",
            "_load_in_4bit": true,
            "_load_in_8bit": false,
            "load_in_4bit": true,
            "load_in_8bit": false,
            "bnb_4bit_quant_type": g.quant_type.name(),
            "bnb_4bit_use_double_quant": g.double_quant,
            "bnb_4bit_compute_dtype": "float32",
            "bnb_4bit_quant_storage": "uint8",
            "llm_int8_threshold": 6.0,
            "llm_int8_has_fp16_weight": false,
            "llm_int8_skip_modules": skip_json,
            "llm_int8_enable_fp32_cpu_offload": false,
        });
    }
    if let Some(fmt) = packed4.filter(|f| f.compressed_tensors) {
        // What LLM Compressor writes for its W4A16 preset scheme (RedHatAI's
        // `…-quantized.w4a16`): one group, int4 symmetric, `strategy` group (or channel for
        // group size -1), no activations.
        let (strategy, group_size) = if fmt.group_size < 0 {
            ("channel", serde_json::Value::Null)
        } else {
            ("group", fmt.group_size.into())
        };
        json["quantization_config"] = serde_json::json!({
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "global_compression_ratio": null,
            "kv_cache_scheme": null,
            "sparsity_config": {},
            "ignore": unquantized,
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": true,
                    "strategy": strategy, "group_size": group_size, "dynamic": false,
                    "observer": "minmax", "observer_kwargs": {},
                    "actorder": if fmt.desc_act { serde_json::Value::from("group") } else { serde_json::Value::Null },
                    "block_structure": null},
                "input_activations": null,
                "output_activations": null,
            }},
        });
    } else if let Some(fmt) = packed4 {
        json["quantization_config"] = match fmt.method {
            // transformers' AwqConfig.to_dict() as AutoAWQ saves it.
            crate::quant::marlin::Method::Awq => serde_json::json!({
                "quant_method": "awq",
                "bits": 4,
                "group_size": fmt.group_size,
                "zero_point": true,
                "version": "gemm",
                "modules_to_not_convert": if config.vllm_names().is_some() {
                    serde_json::json!(config.tower_roots())
                } else {
                    serde_json::Value::Null
                },
            }),
            // AutoGPTQ's BaseQuantizeConfig (quantize_config.json) with its quant_method.
            crate::quant::marlin::Method::Gptq => serde_json::json!({
                "quant_method": "gptq",
                "bits": 4,
                "group_size": fmt.group_size,
                "desc_act": fmt.desc_act,
                "sym": true,
                "damp_percent": 0.01,
                "true_sequential": true,
                "static_groups": false,
                "checkpoint_format": "gptq",
            }),
        };
    }
    let text = serde_json::to_string_pretty(&json).expect("json");
    crate::base::atomic::atomic_write(&cfg_path, text.as_bytes())?;
    Ok(ModelFiles {
        format: FileFormat::Safetensors,
        config: cfg_path,
        weights,
        shards,
        index,
    })
}

/// A `.SCB` placeholder keeps its weight's `[n, k]` so it can requantize; on disk it is `[n]`.
struct OnDisk<'a>(LazyTensor<'a>, Vec<usize>);

impl safetensors::View for OnDisk<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.0.dtype()
    }
    fn shape(&self) -> &[usize] {
        &self.1
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        self.0.data()
    }
    fn data_len(&self) -> usize {
        self.1.iter().product::<usize>() * self.0.stored().1
    }
}

type Written = (PathBuf, Vec<PathBuf>, Option<Vec<(String, String)>>);

/// Writes the tensors into `n` files of about equal size (each via a temporary file renamed
/// into place), plus the index when `n > 1`.
fn write_shards(dir: &Path, tensors: Vec<(String, LazyTensor)>, n: usize) -> Result<Written> {
    let tensors: Vec<(String, OnDisk)> = tensors
        .into_iter()
        .map(|(name, t)| {
            let disk = t.disk_shape();
            (name, OnDisk(t, disk))
        })
        .collect();
    use safetensors::View;
    let total: u64 = tensors.iter().map(|(_, t)| t.data_len() as u64).sum();
    let mut groups: Vec<Vec<(String, OnDisk)>> = (0..n).map(|_| Vec::new()).collect();
    let mut acc = 0u64;
    for (name, t) in tensors {
        // Shard i takes the tensors that start in its share of the bytes.
        let g = ((acc as u128 * n as u128) / total.max(1) as u128).min(n as u128 - 1) as usize;
        acc += t.data_len() as u64;
        groups[g].push((name, t));
    }
    let file_name = |i: usize| {
        if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        }
    };
    let mut paths = Vec::with_capacity(n);
    let mut map = Vec::new();
    for (i, group) in groups.into_iter().enumerate() {
        let path = dir.join(file_name(i));
        map.extend(group.iter().map(|(t, _)| (t.clone(), file_name(i))));
        let tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
        safetensors::serialize_to_file(group, None, tmp.path()).map_err(|e| Error::Export {
            path: path.clone(),
            problem: e.to_string(),
        })?;
        tmp.persist(&path).map_err(|e| Error::io(&path, e.error))?;
        paths.push(path);
    }
    if n == 1 {
        return Ok((paths[0].clone(), paths, None));
    }
    let index_path = dir.join(INDEX_NAME);
    let weight_map: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(t, f)| (t.clone(), serde_json::Value::String(f.clone())))
        .collect();
    let json = serde_json::json!({
        "metadata": { "total_size": total },
        "weight_map": weight_map,
    });
    let text = serde_json::to_string_pretty(&json).expect("json");
    crate::base::atomic::atomic_write(&index_path, text.as_bytes())?;
    Ok((index_path, paths, Some(map)))
}

/// config.json and the safetensors file(s) of a model folder, checked against each other.
/// config.json, with ModelOpt's `hf_quant_config.json` beside it read as its
/// `quantization_config` when config.json has none (vLLM 0.19 weight_utils.py L269-307:
/// config.json's `quantization_config` first, then the method's config file; modelopt.py
/// L262-263 names `hf_quant_config.json`).
pub(crate) fn config_with_quant_file(config: &Path) -> Result<serde_json::Value> {
    let mut json = read_config_json(config)?;
    if json.get("quantization_config").is_none_or(|q| q.is_null()) {
        if let Some(hq) = config
            .parent()
            .map(|d| d.join("hf_quant_config.json"))
            .filter(|p| p.is_file())
        {
            let mut q = crate::base::fsguard::read_json_object(
                &hq,
                "hf_quant_config.json",
                crate::base::fsguard::CONFIG_LIMIT,
            )?;
            if q.get("quant_method").is_none() {
                q["quant_method"] = "modelopt".into();
            }
            json["quantization_config"] = q;
        }
    }
    Ok(json)
}

fn open_safetensors(
    files: &ModelFiles,
) -> Result<(
    serde_json::Value,
    ModelConfig,
    sharded::StoredQuant,
    sharded::SafetensorsModel,
)> {
    let json = config_with_quant_file(&files.config)?;
    let cfg = ModelConfig::from_hf_json(&json).map_err(|p| Error::model(&files.config, p))?;
    let sq = sharded::stored_quant(&json, &files.config)?;
    check_fp8_blocks(sq, &cfg, &files.config)?;
    let mut st =
        sharded::SafetensorsModel::open(&files.weights, &files.shards, files.index.as_deref(), sq)?;
    st.bnb_skip = bnb_skip_of(&json, sq, &files.config)?;
    st.quantized_tower = tower_quant::quantized_tower_layer(&json, sq, &cfg, &files.config);
    if let Some(names) = cfg.vllm_names() {
        st.map_names(names)?;
    }
    st.check_against(&cfg)?;
    Ok((json, cfg, sq, st))
}

/// The linear layers a bitsandbytes checkpoint keeps in 16 bits (`llm_int8_skip_modules`;
/// read for bitsandbytes only, as vLLM's `BitsAndBytesConfig` alone reads it).
fn bnb_skip_of(
    json: &serde_json::Value,
    sq: sharded::StoredQuant,
    config: &Path,
) -> Result<Vec<String>> {
    match sq {
        sharded::StoredQuant::Bnb4 { .. } | sharded::StoredQuant::BnbInt8 { .. } => {
            crate::quant::bnb_skip::skip_modules(json, config)
        }
        _ => Ok(Vec::new()),
    }
}

/// A block-wise fp8 checkpoint whose shapes vLLM 0.8.5 refuses as it builds the model
/// (`Fp8LinearMethod.create_weights`, fp8.py L206-229) or fails on in its first forward
/// (`per_token_group_quant_fp8`'s assertion), refused naming config.json before any tensor
/// is read. What depends on the GPU is the procedure's to check.
fn check_fp8_blocks(sq: sharded::StoredQuant, cfg: &ModelConfig, config: &Path) -> Result<()> {
    let sharded::StoredQuant::Fp8(crate::quant::fp8::StoredFp8 {
        block: Some(block), ..
    }) = sq
    else {
        return Ok(());
    };
    // Multi-head latent attention runs under the V1 releases only, whose merged layers may
    // end in a partial block (the fused A projection's 576 rows).
    let era = if cfg.deepseek.is_some() {
        crate::quant::fp8_block::Fp8BlockEra::V0_11
    } else {
        crate::quant::fp8_block::Fp8BlockEra::V0_8
    };
    match crate::quant::fp8_block::model_problem(block, &cfg.decoder_linears(), (false, era)) {
        Some(p) => Err(Error::model(config, p)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod hub_name_tests {
    use std::path::Path;

    #[test]
    fn a_cache_snapshot_is_named_by_its_hub_id_not_its_revision() {
        let snap = Path::new("/c/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/1f290537");
        assert_eq!(
            crate::model::hub_id_of_snapshot(snap).as_deref(),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(
            crate::model::hub_id_of_snapshot(Path::new("/m/Llama-3.1-8B")),
            None
        );
        assert_eq!(
            crate::model::hub_id_of_snapshot(Path::new("/c/x/snapshots/abc")),
            None
        );
    }
}

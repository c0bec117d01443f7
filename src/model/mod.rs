//! Model shapes, weight files and the Llama-family forward pass.

pub mod config;
pub mod gguf;
pub mod llama;
pub mod presets;
pub mod sharded;
pub mod weights;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use config::ModelConfig;
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

/// How the weights are stored on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    Safetensors,
    Gguf,
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
    crate::fsguard::stat(path, "file")?;
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
            let text = crate::fsguard::read_text(&ip, "index file", crate::fsguard::INDEX_LIMIT)?;
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
                sharded::StoredQuant::None => None,
            };
            Ok((cfg, Box::new(st), threshold))
        }
    }
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
                stored_int8_threshold: None,
            })
        }
        ModelSource::Path { path } => {
            let files = resolve_files(path)?;
            let (config, source, stored_int8_threshold) = open_files(&files)?;
            let name = match files.format {
                FileFormat::Gguf => files.weights.file_stem(),
                FileFormat::Safetensors => files.config.parent().and_then(|d| d.file_name()),
            }
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
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
        FileFormat::Safetensors => {
            let (json, cfg, _, st) = open_safetensors(&files)?;
            for name in st.tensor_names() {
                let (d, shape) = st.info(name).expect("listed");
                let n: u64 = shape.iter().product::<usize>() as u64;
                // bitsandbytes' scales are not parameters of the model.
                if !name.ends_with(".SCB") {
                    params += n;
                }
                count += 1;
                let e = by
                    .entry(d.map_or("other", StoredDtype::name).to_string())
                    .or_default();
                e.0 += 1;
                e.1 += n * d.map_or(0, |d| d.size_bytes() as u64);
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
    fn stored(&self) -> StoredDtype {
        match self.kind {
            LazyKind::Float => self.gen.dtype,
            LazyKind::Int8Cb => StoredDtype::I8,
            LazyKind::Int8Scb => StoredDtype::F32,
        }
    }
}

impl safetensors::View for LazyTensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        match self.stored() {
            StoredDtype::F32 => safetensors::Dtype::F32,
            StoredDtype::F16 => safetensors::Dtype::F16,
            StoredDtype::BF16 => safetensors::Dtype::BF16,
            StoredDtype::I8 => safetensors::Dtype::I8,
        }
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
        self.shape.iter().product::<usize>() * self.stored().size_bytes()
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
        },
    )
}

fn is_projection(name: &str) -> bool {
    name.starts_with("model.layers.") && name.ends_with("_proj.weight")
}

/// Writes a preset with seeded synthetic weights: one file or `shards` files with an index,
/// 16/32-bit or as a bitsandbytes 8-bit checkpoint.
pub fn gen_model_with(preset: &str, dir: &Path, opts: &GenOptions) -> Result<ModelFiles> {
    let config = presets::preset(preset).ok_or_else(|| {
        Error::Request(format!(
            "model preset '{preset}' is unknown; presets: {}",
            presets::PRESET_NAMES.join(", ")
        ))
    })?;
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
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let gen = SyntheticWeights {
        preset: seed_name.to_string(),
        seed: opts.seed,
        dtype: opts.dtype,
    };
    let mut tensors: Vec<(String, LazyTensor)> = Vec::new();
    for (name, shape) in config.tensor_shapes() {
        if opts.bnb_int8 && is_projection(&name) {
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
            tensors.push((
                name.clone(),
                LazyTensor {
                    gen: &gen,
                    source: name,
                    shape,
                    kind: LazyKind::Float,
                },
            ));
        }
    }
    let torch_dtype = match opts.dtype {
        StoredDtype::F32 => "float32",
        StoredDtype::BF16 => "bfloat16",
        _ => "float16",
    };
    let (weights, shards, index) = write_shards(dir, tensors, opts.shards)?;
    let cfg_path = dir.join("config.json");
    let mut json = config.to_hf_json(torch_dtype);
    if opts.bnb_int8 {
        json["quantization_config"] = serde_json::json!({
            "quant_method": "bitsandbytes",
            "load_in_8bit": true,
            "load_in_4bit": false,
            "llm_int8_threshold": 6.0,
            "llm_int8_has_fp16_weight": false,
            "llm_int8_skip_modules": null,
        });
    }
    let text = serde_json::to_string_pretty(&json).expect("json");
    crate::export::atomic_write(&cfg_path, text.as_bytes())?;
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
        self.1.iter().product::<usize>() * self.0.stored().size_bytes()
    }
}

type Written = (PathBuf, Vec<PathBuf>, Option<Vec<(String, String)>>);

/// Writes the tensors into `n` files of about equal size (each via a temporary file renamed
/// into place), plus the index when `n > 1`.
fn write_shards(dir: &Path, tensors: Vec<(String, LazyTensor)>, n: usize) -> Result<Written> {
    let tensors: Vec<(String, OnDisk)> = tensors
        .into_iter()
        .map(|(name, t)| {
            let disk = match t.kind {
                LazyKind::Int8Scb => vec![t.shape[0]],
                _ => t.shape.clone(),
            };
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
    crate::export::atomic_write(&index_path, text.as_bytes())?;
    Ok((index_path, paths, Some(map)))
}

/// config.json and the safetensors file(s) of a model folder, checked against each other.
fn open_safetensors(
    files: &ModelFiles,
) -> Result<(
    serde_json::Value,
    ModelConfig,
    sharded::StoredQuant,
    sharded::SafetensorsModel,
)> {
    let json = read_config_json(&files.config)?;
    let cfg = ModelConfig::from_hf_json(&json).map_err(|p| Error::model(&files.config, p))?;
    let sq = sharded::stored_quant(&json, &files.config)?;
    let st =
        sharded::SafetensorsModel::open(&files.weights, &files.shards, files.index.as_deref(), sq)?;
    st.check_against(&cfg)?;
    Ok((json, cfg, sq, st))
}

//! A Hugging Face safetensors checkpoint: one file or shards listed by
//! `model.safetensors.index.json`, each memory-mapped; bitsandbytes 8-bit checkpoints keep
//! their int8 `CB` weights and `.SCB` scales as stored.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::config::ModelConfig;
use super::weights::{floats_to_f32, SafetensorsFile, StoredDtype, WeightSource};
use crate::error::{Error, Result};

/// The `weight_map` of an index file: tensor → shard file name (inside the index's folder).
pub fn parse_index(text: &str, path: &Path) -> Result<Vec<(String, String)>> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::model(path, format!("not valid JSON: {e}")))?;
    let map = v["weight_map"]
        .as_object()
        .ok_or_else(|| Error::model(path, "no \"weight_map\" object"))?;
    if map.len() as u64 > crate::limits::MAX_TENSORS {
        return Err(Error::model(
            path,
            format!(
                "weight_map lists {} tensors, more than the {} this tool reads",
                map.len(),
                crate::limits::MAX_TENSORS
            ),
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::model(path, format!("tensor {tensor}: shard name is not a string"))
        })?;
        // Shards sit beside the index: a path that leaves the folder is refused.
        if file.is_empty()
            || file.contains(['/', '\\'])
            || file == ".."
            || !file.ends_with(".safetensors")
        {
            return Err(Error::model(
                path,
                format!("tensor {tensor}: shard '{file}' is not a .safetensors file name in this folder"),
            ));
        }
        out.push((tensor.clone(), file.to_string()));
    }
    if out.is_empty() {
        return Err(Error::model(path, "weight_map lists no tensors"));
    }
    Ok(out)
}

/// What `quantization_config` in config.json says about the stored weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StoredQuant {
    None,
    /// bitsandbytes LLM.int8 with its `llm_int8_threshold`.
    BnbInt8 {
        threshold: f32,
    },
}

/// Reads `quantization_config`; 4-bit and other methods are refused by name.
pub fn stored_quant(config: &serde_json::Value, path: &Path) -> Result<StoredQuant> {
    let q = &config["quantization_config"];
    if q.is_null() {
        return Ok(StoredQuant::None);
    }
    let method = q["quant_method"].as_str().unwrap_or("bitsandbytes");
    if method != "bitsandbytes" {
        return Err(Error::model(
            path,
            format!("quantization_config.quant_method '{method}' is not supported (expected bitsandbytes)"),
        ));
    }
    if q["load_in_4bit"].as_bool() == Some(true) {
        return Err(Error::model(
            path,
            "pre-quantized bitsandbytes 4-bit checkpoints are not supported; use a 16-bit checkpoint with --quant nf4",
        ));
    }
    if q["load_in_8bit"].as_bool() != Some(true) {
        return Err(Error::model(
            path,
            "quantization_config has neither load_in_8bit nor load_in_4bit set",
        ));
    }
    // "six" or NaN is an error naming the key, not the default.
    let threshold = super::config::float(
        q,
        "llm_int8_threshold",
        6.0,
        |t| (0.0..=f32::MAX as f64).contains(&t),
        "of at least 0",
    )
    .map_err(|p| Error::model(path, format!("quantization_config: {p}")))?
        as f32;
    Ok(StoredQuant::BnbInt8 { threshold })
}

/// All shards of a checkpoint, with each tensor's shard.
pub struct SafetensorsModel {
    /// The index file, or the single weights file.
    pub origin: PathBuf,
    pub shards: Vec<SafetensorsFile>,
    which: HashMap<String, usize>,
    pub stored_quant: StoredQuant,
}

impl SafetensorsModel {
    /// Opens every shard and validates each header; a tensor in two shards, or not in the
    /// shard the index names, is an error.
    pub fn open(
        origin: &Path,
        shard_paths: &[PathBuf],
        index: Option<&[(String, String)]>,
        stored_quant: StoredQuant,
    ) -> Result<Self> {
        let shards = shard_paths
            .iter()
            .map(|p| SafetensorsFile::open(p))
            .collect::<Result<Vec<_>>>()?;
        let mut which = HashMap::new();
        for (i, s) in shards.iter().enumerate() {
            for name in s.tensor_names() {
                if let Some(j) = which.insert(name.clone(), i) {
                    return Err(Error::model(
                        &s.path,
                        format!("tensor {name} is also in {}", shards[j].path.display()),
                    ));
                }
            }
        }
        if let Some(index) = index {
            for (tensor, file) in index {
                let at = which.get(tensor).map(|&i| &shards[i].path);
                if at.and_then(|p| p.file_name()) != Some(std::ffi::OsStr::new(file)) {
                    return Err(Error::model(
                        origin,
                        format!(
                            "tensor {tensor}: the index puts it in {file} but it is {}",
                            at.map_or("in no shard".to_string(), |p| format!("in {}", p.display()))
                        ),
                    ));
                }
            }
        }
        Ok(SafetensorsModel {
            origin: origin.to_path_buf(),
            shards,
            which,
            stored_quant,
        })
    }

    fn shard_of(&self, name: &str) -> Result<&SafetensorsFile> {
        self.which
            .get(name)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| Error::model(&self.origin, format!("tensor {name} is missing")))
    }

    pub fn info(&self, name: &str) -> Option<(Option<StoredDtype>, &[usize])> {
        self.shard_of(name).ok().and_then(|s| s.info(name))
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &String> {
        self.which.keys()
    }

    /// Checks every tensor the config implies is present with the implied shape (and, for a
    /// bitsandbytes 8-bit checkpoint, its `.SCB` scales).
    pub fn check_against(&self, cfg: &ModelConfig) -> Result<()> {
        for s in &self.shards {
            cfg.check_layers_present(
                s.tensor_names().map(String::as_str),
                "model.layers.",
                "config.json's num_hidden_layers",
            )
            .map_err(|p| Error::model(&s.path, p))?;
        }
        for (name, shape) in cfg.tensor_shapes() {
            let s = self.shard_of(&name).map_err(|_| {
                Error::model(
                    &self.origin,
                    format!("tensor {name} is missing (config.json implies {shape:?})"),
                )
            })?;
            let (dtype, found) = s.info(&name).expect("listed");
            if found != shape.as_slice() {
                return Err(Error::model(
                    &s.path,
                    format!("tensor {name} has shape {found:?} but config.json implies {shape:?}"),
                ));
            }
            match dtype {
                None => {
                    return Err(Error::model(
                        &s.path,
                        format!(
                            "tensor {name} has dtype {}, expected F32, F16, BF16 or I8",
                            s.stored_dtype_name(&name)
                        ),
                    ))
                }
                Some(StoredDtype::I8) => {
                    if self.stored_quant == StoredQuant::None {
                        return Err(Error::model(
                            &s.path,
                            format!(
                                "tensor {name} is int8 but config.json has no quantization_config"
                            ),
                        ));
                    }
                    let scb = scb_name(&name);
                    let (sd, ss) = self.info(&scb).ok_or_else(|| {
                        Error::model(
                            &s.path,
                            format!("tensor {name} is int8 but its scales {scb} are missing"),
                        )
                    })?;
                    if sd != Some(StoredDtype::F32) || ss != [shape[0]] {
                        return Err(Error::model(
                            &s.path,
                            format!(
                                "tensor {scb} should be F32 [{}], found {} {ss:?}",
                                shape[0],
                                sd.map_or("?", StoredDtype::name)
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Bytes of all tensors as stored.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(SafetensorsFile::total_bytes).sum()
    }
}

fn scb_name(weight: &str) -> String {
    format!("{}.SCB", weight.trim_end_matches(".weight"))
}

impl WeightSource for SafetensorsModel {
    fn origin(&self) -> String {
        self.origin.display().to_string()
    }

    fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let s = self.shard_of(name)?;
        match s.info(name).and_then(|(d, _)| d) {
            // An 8-bit weight read as floats: W = CB · SCB / 127, row by row.
            Some(StoredDtype::I8) => {
                let (cb, scb) = self.read_int8(name, shape)?;
                let k = shape[1];
                Ok(cb
                    .iter()
                    .enumerate()
                    .map(|(i, &q)| q as f32 * scb[i / k] / 127.0)
                    .collect())
            }
            Some(d) => Ok(floats_to_f32(d, s.raw(name, d, shape)?)),
            None => Err(Error::model(
                &s.path,
                format!(
                    "tensor {name} has dtype {}, expected F32, F16, BF16 or I8",
                    s.stored_dtype_name(name)
                ),
            )),
        }
    }

    fn stored_bytes(&self, name: &str) -> u64 {
        let bytes = |n: &str| self.shard_of(n).map_or(0, |s| s.tensor_bytes(n));
        if self.is_int8(name) {
            bytes(name) + bytes(&scb_name(name))
        } else {
            bytes(name)
        }
    }

    fn is_int8(&self, name: &str) -> bool {
        matches!(self.info(name), Some((Some(StoredDtype::I8), _)))
    }

    fn read_int8(&self, name: &str, shape: &[usize]) -> Result<(Vec<i8>, Vec<f32>)> {
        if shape.len() != 2 {
            return Err(Error::model(
                &self.origin,
                format!("tensor {name}: an int8 weight must be 2-D, expected {shape:?}"),
            ));
        }
        let cb = self
            .shard_of(name)?
            .raw(name, StoredDtype::I8, shape)?
            .iter()
            .map(|&b| b as i8)
            .collect();
        let scb_n = scb_name(name);
        let scb = floats_to_f32(
            StoredDtype::F32,
            self.shard_of(&scb_n)?
                .raw(&scb_n, StoredDtype::F32, &shape[..1])?,
        );
        Ok((cb, scb))
    }
}

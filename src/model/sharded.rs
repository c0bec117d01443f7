//! A Hugging Face safetensors checkpoint: one file or shards listed by
//! `model.safetensors.index.json`, each memory-mapped; bitsandbytes 8-bit checkpoints keep
//! their int8 `CB` weights and `.SCB` scales as stored.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::checkpoint_names::{names_lm_head_or_tower, VllmNames};
use super::config::ModelConfig;
use super::weights::{floats_to_f32, SafetensorsFile, StoredDtype, WeightSource};
use crate::base::error::{Error, Result};
use crate::engine::tensor::DType;
use crate::quant::bnb4::{Absmax, Bnb4Meta, Bnb4Parts, Bnb4Type};
use crate::quant::fp8::StoredFp8;
use crate::quant::fp8_block::BlockSize;
use crate::quant::marlin::{Format, Method, Parts, MARLIN_GROUP_SIZES, PACK};

/// The `weight_map` of an index file: tensor → shard file name (inside the index's folder).
pub fn parse_index(text: &str, path: &Path) -> Result<Vec<(String, String)>> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::model(path, format!("not valid JSON: {e}")))?;
    let map = v["weight_map"]
        .as_object()
        .ok_or_else(|| Error::model(path, "no \"weight_map\" object"))?;
    if map.len() as u64 > crate::base::limits::MAX_TENSORS {
        return Err(Error::model(
            path,
            format!(
                "weight_map lists {} tensors, more than the {} this tool reads",
                map.len(),
                crate::base::limits::MAX_TENSORS
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
    /// bitsandbytes 4-bit (`load_in_4bit`): each weight's quant state says the rest.
    Bnb4 {
        quant_type: Bnb4Type,
        double_quant: bool,
    },
    /// A pre-quantized per-tensor fp8 checkpoint (`quant_method: fp8`): F8_E4M3 linear
    /// weights, each with its F32 `weight_scale` (and `input_scale` under the static scheme).
    Fp8(StoredFp8),
    /// AutoAWQ GEMM 4-bit (`quant_method: awq`, `zero_point: true`, `version: gemm`).
    Awq {
        group_size: i64,
    },
    /// AutoGPTQ symmetric 4-bit (`quant_method: gptq`, `sym: true`).
    Gptq {
        group_size: i64,
        desc_act: bool,
    },
    /// compressed-tensors `pack-quantized` symmetric 4-bit weights, 16-bit activations (LLM
    /// Compressor's W4A16, RedHatAI's `…-quantized.w4a16`): GPTQ's codes and rule in
    /// compressed-tensors' tensors (`Format::compressed_tensors`).
    CtW4a16 {
        group_size: i64,
        desc_act: bool,
    },
    /// gpt-oss's MXFP4 experts (`quant_method: mxfp4`): U8 `*_blocks` and `*_scales`, the
    /// rest 16-bit (model_type gpt_oss only).
    Mxfp4,
    /// NVFP4 linears (`quant::nvfp4`): compressed-tensors' `nvfp4-pack-quantized` or
    /// ModelOpt's `quant_algo: NVFP4`, the lm_head (and embeddings, norms) 16-bit.
    Nvfp4(crate::quant::nvfp4::Flavor),
    /// compressed-tensors 2:4 sparse linears (`quant::sparse24`), 16-bit or fp8, stored dense
    /// or in the bitmask form; the lm_head (and embeddings, norms) 16-bit.
    Sparse24(crate::quant::sparse24::Sparse24),
}

impl StoredQuant {
    /// The 2:4 scheme of the checkpoint's linears, when it is 2:4 sparse.
    pub fn sparse24(&self) -> Option<crate::quant::sparse24::Sparse24> {
        match *self {
            StoredQuant::Sparse24(s) => Some(s),
            _ => None,
        }
    }

    /// The NVFP4 flavor of the checkpoint's quantized linears, when it has one.
    pub fn nvfp4(&self) -> Option<crate::quant::nvfp4::Flavor> {
        match *self {
            StoredQuant::Nvfp4(f) => Some(f),
            _ => None,
        }
    }

    /// The AWQ / GPTQ format every quantized linear of the checkpoint has.
    pub fn packed4(&self) -> Option<Format> {
        match *self {
            StoredQuant::Awq { group_size } => Some(Format {
                method: Method::Awq,
                group_size,
                desc_act: false,
                compressed_tensors: false,
            }),
            StoredQuant::Gptq {
                group_size,
                desc_act,
            } => Some(Format {
                method: Method::Gptq,
                group_size,
                desc_act,
                compressed_tensors: false,
            }),
            StoredQuant::CtW4a16 {
                group_size,
                desc_act,
            } => Some(Format {
                method: Method::Gptq,
                group_size,
                desc_act,
                compressed_tensors: true,
            }),
            _ => None,
        }
    }
}

/// Reads `quantization_config`; other methods are refused by name.
pub fn stored_quant(config: &serde_json::Value, path: &Path) -> Result<StoredQuant> {
    let q = &config["quantization_config"];
    if q.is_null() {
        return Ok(StoredQuant::None);
    }
    // Every key present must hold its type: "true" (a string) is not true.
    let flag = |key: &str| -> Result<Option<bool>> {
        match &q[key] {
            serde_json::Value::Null => Ok(None),
            serde_json::Value::Bool(b) => Ok(Some(*b)),
            other => Err(Error::model(
                path,
                format!("quantization_config.{key} is {other}, expected true or false"),
            )),
        }
    };
    let text = |key: &str| -> Result<Option<&str>> {
        match &q[key] {
            serde_json::Value::Null => Ok(None),
            serde_json::Value::String(s) => Ok(Some(s.as_str())),
            other => Err(Error::model(
                path,
                format!("quantization_config.{key} is {other}, expected a string"),
            )),
        }
    };
    if !q.is_object() {
        return Err(Error::model(
            path,
            format!("quantization_config is {q}, expected an object"),
        ));
    }
    let method = text("quant_method")?.unwrap_or("bitsandbytes");
    if method == "fp8" {
        return fp8_config(config, path).map(StoredQuant::Fp8);
    }
    if method == "compressed-tensors" {
        return compressed_tensors_config(config, path);
    }
    if method == "modelopt" {
        return modelopt_config(config, path);
    }
    if method == "awq" || method == "gptq" {
        return packed4_config(q, method, path);
    }
    if method == "mxfp4" {
        if config["model_type"].as_str() != Some("gpt_oss") {
            return Err(Error::model(
                path,
                format!(
                    "quantization_config.quant_method 'mxfp4' is modelled for model_type gpt_oss only (found {})",
                    config["model_type"]
                ),
            ));
        }
        return Ok(StoredQuant::Mxfp4);
    }
    if method != "bitsandbytes" {
        return Err(Error::model(
            path,
            format!("quantization_config.quant_method '{method}' is not supported (expected bitsandbytes, awq or gptq)"),
        ));
    }
    let (in_8bit, in_4bit) = (flag("load_in_8bit")?, flag("load_in_4bit")?);
    if in_8bit == Some(true) && in_4bit == Some(true) {
        return Err(Error::model(
            path,
            "quantization_config sets both load_in_8bit and load_in_4bit: a checkpoint is one or the other",
        ));
    }
    if in_4bit == Some(true) {
        // vLLM's BitsAndBytesConfig defaults (bitsandbytes.py L11-111): fp4, no double quant.
        let name = text("bnb_4bit_quant_type")?.unwrap_or("fp4");
        let quant_type = Bnb4Type::parse(name).ok_or_else(|| {
            Error::model(
                path,
                format!("quantization_config.bnb_4bit_quant_type '{name}' is not nf4 or fp4"),
            )
        })?;
        return Ok(StoredQuant::Bnb4 {
            quant_type,
            double_quant: flag("bnb_4bit_use_double_quant")?.unwrap_or(false),
        });
    }
    if in_8bit != Some(true) {
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

/// An AWQ or GPTQ `quantization_config`, read as vLLM 0.6.4 reads it: `AWQMarlinConfig` /
/// `GPTQMarlinConfig.from_config` require `bits`, `group_size` and `zero_point` (AWQ) or
/// `desc_act` and `sym` (GPTQ) (awq_marlin.py L88-97, gptq_marlin.py L86-95); the Marlin
/// conversion happens when `is_awq_marlin_compatible` / `is_gptq_marlin_compatible` hold
/// (awq_marlin.py L130-153, gptq_marlin.py L128-149). Everything else, vLLM runs with another
/// kernel (or refuses), which vramscope does not reproduce: refused naming the key.
fn packed4_config(q: &serde_json::Value, method: &str, path: &Path) -> Result<StoredQuant> {
    let key = |k: &str| format!("quantization_config.{k}");
    let missing = |k: &str| {
        Error::model(
            path,
            format!(
                "{} is missing: vLLM's {} config requires it",
                key(k),
                method.to_uppercase()
            ),
        )
    };
    let int = |k: &str| -> Result<i64> {
        match &q[k] {
            serde_json::Value::Null => Err(missing(k)),
            v => v.as_i64().ok_or_else(|| {
                Error::model(path, format!("{} is {v}, expected an integer", key(k)))
            }),
        }
    };
    let flag = |k: &str| -> Result<bool> {
        match &q[k] {
            serde_json::Value::Null => Err(missing(k)),
            serde_json::Value::Bool(b) => Ok(*b),
            v => Err(Error::model(
                path,
                format!("{} is {v}, expected true or false", key(k)),
            )),
        }
    };
    let bits = int("bits")?;
    if bits != 4 {
        return Err(Error::model(
            path,
            format!(
                "{} is {bits}: vramscope reads 4-bit {} checkpoints only (Marlin's 8-bit types are not modelled)",
                key("bits"),
                method.to_uppercase()
            ),
        ));
    }
    let group_size = int("group_size")?;
    if !MARLIN_GROUP_SIZES.contains(&group_size) {
        return Err(Error::model(
            path,
            format!(
                "{} is {group_size}: Marlin takes -1, 32, 64 or 128 (MARLIN_SUPPORTED_GROUP_SIZES, marlin_utils.py L17 at 0.6.4); vLLM runs other group sizes with its plain {method} kernel, which vramscope does not reproduce",
                key("group_size")
            ),
        ));
    }
    let list_set = |k: &str| match &q[k] {
        serde_json::Value::Null => false,
        serde_json::Value::Array(a) => !a.is_empty(),
        _ => true,
    };
    if flag_or(q, "lm_head") {
        return Err(Error::model(
            path,
            format!(
                "{} is true: a quantized lm_head is not modelled",
                key("lm_head")
            ),
        ));
    }
    if method == "awq" {
        if !flag("zero_point")? {
            return Err(Error::model(
                path,
                format!(
                    "{} is false: vLLM's Marlin takes AWQ with zero points only (uint4 with has_zp; marlin_utils.py L28-46), and runs this one with the plain awq kernel, which vramscope does not reproduce",
                    key("zero_point")
                ),
            ));
        }
        match &q["version"] {
            serde_json::Value::Null => {}
            serde_json::Value::String(v) if v.eq_ignore_ascii_case("gemm") => {}
            v => {
                return Err(Error::model(
                    path,
                    format!(
                        "{} is {v}: only AutoAWQ's GEMM layout (qweight [in, out/8]) is what vLLM's AWQ reads",
                        key("version")
                    ),
                ))
            }
        }
        let towers_only = q["modules_to_not_convert"].as_array().is_some_and(|a| {
            a.iter()
                .all(|m| m.as_str().is_some_and(names_lm_head_or_tower))
        });
        if list_set("modules_to_not_convert") && !towers_only {
            return Err(Error::model(
                path,
                format!(
                    "{} is {}: decoder layers left unquantized inside an AWQ checkpoint are not modelled (only a multimodal model's tower and projector)",
                    key("modules_to_not_convert"),
                    q["modules_to_not_convert"]
                ),
            ));
        }
        return Ok(StoredQuant::Awq { group_size });
    }
    let desc_act = flag("desc_act")?;
    if !flag("sym")? {
        return Err(Error::model(
            path,
            format!(
                "{} is false: vLLM's gptq_marlin takes symmetric GPTQ only (TYPE_MAP, gptq_marlin.py L35-38 at 0.6.4) and runs this one with the plain gptq kernel, which vramscope does not reproduce",
                key("sym")
            ),
        ));
    }
    match &q["checkpoint_format"] {
        serde_json::Value::Null => {}
        // gptq_marlin never reads it: a symmetric checkpoint's zeros are ignored either way.
        serde_json::Value::String(v) if v == "gptq" || v == "gptq_v2" => {}
        v => {
            return Err(Error::model(
                path,
                format!(
                    "{} is {v}, expected \"gptq\" or \"gptq_v2\"",
                    key("checkpoint_format")
                ),
            ))
        }
    }
    // vLLM clears desc_act with one group (gptq_marlin.py L48-51).
    Ok(StoredQuant::Gptq {
        group_size,
        desc_act: desc_act && group_size != -1,
    })
}

/// A boolean key that defaults to false.
fn flag_or(q: &serde_json::Value, k: &str) -> bool {
    q[k].as_bool().unwrap_or(false)
}

/// A `quant_method: fp8` config read as vLLM's `Fp8Config.from_config` reads it (0.6.4
/// fp8.py L70-79: `activation_scheme` is required, "static" or "dynamic"; `ignored_layers`
/// optional). `weight_block_size` makes it block-wise (`weight_scale_inv` per block), read
/// as 0.8.5's `Fp8Config.__init__` checks it (fp8.py L70-83: two dimensions, the dynamic
/// scheme); which releases run it is the procedure's to say. `fmt` (DeepSeek-V3's and
/// Qwen3-FP8's "e4m3") is ignored by vLLM, which makes every fp8 weight float8_e4m3fn; any
/// other value would describe weights vLLM reads as something else, so it is refused.
/// `ignored_layers` may name only the lm_head, which is never an fp8 layer (vLLM's
/// `ParallelLMHead` is not a `LinearBase`, fp8.py L83-95); a linear layer left in 16 bits is
/// not read yet.
fn fp8_config(config: &serde_json::Value, path: &Path) -> Result<StoredFp8> {
    let q = &config["quantization_config"];
    let key = |k: &str| format!("quantization_config.{k}");
    match &q["fmt"] {
        serde_json::Value::Null => {}
        serde_json::Value::String(s) if s == "e4m3" => {}
        other => {
            return Err(Error::model(
                path,
                format!(
                    "{} is {other}: vLLM makes every fp8 weight float8_e4m3fn whatever it says, so only \"e4m3\" is read",
                    key("fmt")
                ),
            ))
        }
    }
    let static_activations = match &q["activation_scheme"] {
        serde_json::Value::String(s) if s == "static" || s == "dynamic" => s == "static",
        serde_json::Value::Null => {
            return Err(Error::model(
                path,
                format!(
                    "{} is missing: vLLM's Fp8Config requires it (\"static\" or \"dynamic\")",
                    key("activation_scheme")
                ),
            ))
        }
        other => {
            return Err(Error::model(
                path,
                format!(
                    "{} is {other}, expected \"static\" or \"dynamic\"",
                    key("activation_scheme")
                ),
            ))
        }
    };
    let block = fp8_block_size(q, static_activations, path)?;
    // `ignored_layers`, or `modules_to_not_convert` when it is absent (0.19.0 fp8.py
    // L161-166; Qwen's FP8 MoE checkpoints list their routers and norms there).
    let ignored_key = match (&q["ignored_layers"], &q["modules_to_not_convert"]) {
        (serde_json::Value::Null, serde_json::Value::Null) => None,
        (serde_json::Value::Null, _) => Some("modules_to_not_convert"),
        _ => Some("ignored_layers"),
    };
    let mut gates = std::collections::HashSet::new();
    match ignored_key.map(|k| (k, &q[k])) {
        None => {}
        Some((k, serde_json::Value::Array(names))) => {
            for n in names {
                match n.as_str() {
                    // The lm_head, or a multimodal model's tower and projector, which stay
                    // 16-bit as vramscope loads them.
                    Some(s) if names_lm_head_or_tower(s) => {}
                    // Not linear layers: vLLM's skip list never reaches them.
                    Some(s) if s.ends_with("norm") || s.ends_with("embed_tokens") => {}
                    // A MoE block's router: left 16-bit, as vramscope loads it.
                    Some(s) if s.ends_with(".mlp.gate") => {
                        gates.insert(s.to_string());
                    }
                    _ => {
                        return Err(Error::model(
                            path,
                            format!(
                                "{} lists {n}: a linear layer left in 16 bits inside an fp8 checkpoint is not read yet (only lm_head, embed_tokens, norms and MoE routers mlp.gate)",
                                key(k)
                            ),
                        ))
                    }
                }
            }
        }
        Some((k, other)) => {
            return Err(Error::model(
                path,
                format!("{} is {other}, expected a list of names", key(k)),
            ))
        }
    }
    let layers = config["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
    let routers_unquantized =
        layers > 0 && (0..layers).all(|l| gates.contains(&format!("model.layers.{l}.mlp.gate")));
    // `--dtype auto` (0.6.4 config.py L1811-1836): a missing or float32 torch_dtype runs in
    // float16 (bfloat16 for Gemma 2), any other as it says.
    let dtype = match (
        config["torch_dtype"].as_str(),
        config["model_type"].as_str(),
    ) {
        (Some("bfloat16"), _) => DType::BF16,
        (None | Some("float32"), Some("gemma2")) => DType::BF16,
        _ => DType::F16,
    };
    Ok(StoredFp8 {
        static_activations,
        dtype,
        block,
        channel: false,
        compressed_tensors: false,
        int8: false,
        routers_unquantized,
        modelopt: false,
    })
}

/// The `ignore` / `exclude_modules` list of an NVFP4 checkpoint: only the lm_head (which
/// vramscope keeps 16-bit whatever the list says) is read; a linear layer left 16-bit inside
/// the checkpoint is refused naming it.
fn nvfp4_ignore(list: &serde_json::Value, key: &str, path: &Path) -> Result<()> {
    match list {
        serde_json::Value::Null => Ok(()),
        serde_json::Value::Array(names) => match names
            .iter()
            .find(|n| !n.as_str().is_some_and(names_lm_head_or_tower))
        {
            None => Ok(()),
            Some(n) => Err(Error::model(
                path,
                format!("{key} lists {n}: a linear layer left in 16 bits inside an NVFP4 checkpoint is not read yet (only lm_head and a multimodal model's tower and projector)"),
            )),
        },
        other => Err(Error::model(
            path,
            format!("{key} is {other}, expected a list of names"),
        )),
    }
}

/// compressed-tensors `nvfp4-pack-quantized` (LLM Compressor's NVFP4 preset): one config
/// group targeting Linear, weights and input activations `type: float`, 4-bit, symmetric,
/// `strategy: tensor_group`, `group_size: 16` (`_is_nvfp4_format`, 0.19.0
/// compressed_tensors.py L358-375: `CompressedTensorsW4A4Fp4`, L624-627), no KV-cache scheme,
/// dense. Weight-only NVFP4 (`CompressedTensorsW4A16Fp4`, L593-594) is refused by name.
fn ct_nvfp4_config(q: &serde_json::Value, path: &Path) -> Result<StoredQuant> {
    let refuse = |what: String| -> Result<StoredQuant> {
        Err(Error::model(
            path,
            format!("quantization_config (compressed-tensors NVFP4): {what}"),
        ))
    };
    if !q["kv_cache_scheme"].is_null() {
        return refuse("a kv_cache_scheme (stored fp8 KV scales) is not modelled yet".into());
    }
    let sparse = &q["sparsity_config"];
    if !(sparse.is_null()
        || sparse.as_object().is_some_and(|o| o.is_empty())
        || sparse["format"].as_str() == Some("dense"))
    {
        return refuse(format!("sparsity_config {sparse} is not modelled"));
    }
    let groups = match q["config_groups"].as_object() {
        Some(g) if g.len() == 1 => g,
        Some(g) => {
            return refuse(format!(
                "{} config_groups: only one scheme for every Linear layer is modelled",
                g.len()
            ))
        }
        None => return refuse("config_groups is missing or not an object".into()),
    };
    let (name, g) = groups.iter().next().expect("one group");
    if !g["targets"]
        .as_array()
        .is_some_and(|t| t.iter().any(|x| x.as_str() == Some("Linear")))
    {
        return refuse(format!(
            "config_groups.{name}.targets is {}, expected [\"Linear\"]",
            g["targets"]
        ));
    }
    let nvfp4 = |v: &serde_json::Value| {
        v["type"] == "float"
            && v["num_bits"] == 4
            && v["symmetric"] == true
            && v["strategy"] == "tensor_group"
            && v["group_size"] == 16
    };
    let w = &g["weights"];
    if !nvfp4(w) {
        return refuse(format!(
            "config_groups.{name}.weights is type {} num_bits {} strategy {} group_size {} symmetric {}: NVFP4 is float, 4 bits, tensor_group, 16, symmetric",
            w["type"], w["num_bits"], w["strategy"], w["group_size"], w["symmetric"]
        ));
    }
    let a = &g["input_activations"];
    if a.is_null() {
        return refuse(format!(
            "config_groups.{name} has no input_activations: weight-only NVFP4 (CompressedTensorsW4A16Fp4, NVFP4A16) is not modelled yet"
        ));
    }
    if !nvfp4(a) {
        return refuse(format!(
            "config_groups.{name}.input_activations are not NVFP4 (type {} num_bits {} strategy {} group_size {}): only NVFP4 weights with NVFP4 activations are modelled",
            a["type"], a["num_bits"], a["strategy"], a["group_size"]
        ));
    }
    nvfp4_ignore(&q["ignore"], "quantization_config.ignore", path)?;
    Ok(StoredQuant::Nvfp4(
        crate::quant::nvfp4::Flavor::CompressedTensors,
    ))
}

/// A ModelOpt config (`quant_method: modelopt`), read as vLLM 0.19's
/// `ModelOptQuantConfigBase.from_config` reads it (modelopt.py L278-361): the legacy
/// `{"quantization": {quant_algo, kv_cache_quant_algo, group_size, exclude_modules}}` of
/// `hf_quant_config.json`, or config.json's `{quant_algo, ignore, group_size,
/// kv_cache_scheme}`. NVFP4 with group size 16 and no FP8 KV cache is modelled; FP8 and the
/// other algorithms are refused by name.
fn modelopt_config(config: &serde_json::Value, path: &Path) -> Result<StoredQuant> {
    let q = &config["quantization_config"];
    let legacy = !q["quantization"].is_null();
    let body = if legacy { &q["quantization"] } else { q };
    if !body.is_object() {
        return Err(Error::model(
            path,
            format!("quantization_config.quantization is {body}, expected an object"),
        ));
    }
    let key = |k: &str| {
        if legacy {
            format!("quantization_config.quantization.{k}")
        } else {
            format!("quantization_config.{k}")
        }
    };
    let algo = match &body["quant_algo"] {
        serde_json::Value::String(s) => s.to_ascii_uppercase(),
        serde_json::Value::Null => {
            return Err(Error::model(
                path,
                format!(
                    "{} is missing (vLLM: \"Missing 'quant_algo' in quantization config\")",
                    key("quant_algo")
                ),
            ))
        }
        other => {
            return Err(Error::model(
                path,
                format!("{} is {other}, expected a string", key("quant_algo")),
            ))
        }
    };
    if algo == "FP8" {
        return modelopt_fp8_config(config, body, legacy, path);
    }
    if algo != "NVFP4" {
        return Err(Error::model(
            path,
            format!(
                "{} is '{algo}': ModelOpt NVFP4 and FP8 are modelled; FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, MXFP8 and MIXED_PRECISION are not yet",
                key("quant_algo")
            ),
        ));
    }
    if legacy {
        // 0.19.0 modelopt.py L1043-1055: NVFP4's legacy form must name all three.
        let missing: Vec<&str> = ["group_size", "kv_cache_quant_algo", "exclude_modules"]
            .into_iter()
            .filter(|k| body.get(*k).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(Error::model(
                path,
                format!(
                    "quantization_config.quantization lacks {}: vLLM's ModelOptNvFp4Config requires group_size, kv_cache_quant_algo and exclude_modules in hf_quant_config.json",
                    missing.join(", ")
                ),
            ));
        }
    }
    let kv = if legacy {
        !body["kv_cache_quant_algo"].is_null()
    } else {
        !body["kv_cache_scheme"].is_null()
    };
    if kv {
        let k = if legacy {
            "kv_cache_quant_algo"
        } else {
            "kv_cache_scheme"
        };
        return Err(Error::model(
            path,
            format!(
                "{} is {}: an FP8 KV cache with stored scales (ModelOptFp8KVCacheMethod) is not modelled yet",
                key(k),
                body[k]
            ),
        ));
    }
    match &body["group_size"] {
        serde_json::Value::Null => {}
        v if v == 16 => {}
        other => {
            return Err(Error::model(
                path,
                format!(
                    "{} is {other}: NVFP4 blocks are 16 inputs (Marlin FP4 takes 16 only, FP4_MARLIN_SUPPORTED_GROUP_SIZES)",
                    key("group_size")
                ),
            ))
        }
    }
    let list = if legacy { "exclude_modules" } else { "ignore" };
    nvfp4_ignore(&body[list], &key(list), path)?;
    Ok(StoredQuant::Nvfp4(crate::quant::nvfp4::Flavor::ModelOpt))
}

/// ModelOpt `quant_algo: FP8` (`ModelOptFp8Config`, 0.11.0 modelopt.py L59-201, 0.19.0
/// L366-437): per-tensor F8_E4M3 weights with F32 `weight_scale` and static `input_scale`,
/// read as AutoFP8's static scheme (`StoredFp8` with `modelopt`). An FP8 KV cache
/// (`kv_cache_quant_algo`, or config.json's float 8-bit `kv_cache_scheme`: stored k/v
/// scales, `ModelOptFp8KVCacheMethod`) is refused by name, as is any decoder linear layer
/// the exclusion list leaves 16-bit (`modelopt_fp8::excluded`, as vLLM matches the names).
fn modelopt_fp8_config(
    config: &serde_json::Value,
    body: &serde_json::Value,
    legacy: bool,
    path: &Path,
) -> Result<StoredQuant> {
    let key = |k: &str| {
        if legacy {
            format!("quantization_config.quantization.{k}")
        } else {
            format!("quantization_config.{k}")
        }
    };
    // 0.11.0 reads `kv_cache_quant_algo` in both forms (L140, L146); 0.19.0 config.json's
    // `kv_cache_scheme` (L300-309).
    for k in ["kv_cache_quant_algo", "kv_cache_scheme"] {
        if !body[k].is_null() {
            return Err(Error::model(
                path,
                format!(
                    "{} is {}: ModelOpt's FP8 KV cache with stored k/v scales (ModelOptFp8KVCacheMethod) is not modelled yet",
                    key(k),
                    body[k]
                ),
            ));
        }
    }
    // The legacy file says `exclude_modules`; config.json `ignore` (0.19.0 L296, L312) or
    // `exclude_modules` (0.11.0 L147): both read.
    let mut entries = Vec::new();
    for k in ["exclude_modules", "ignore"] {
        match &body[k] {
            serde_json::Value::Null => {}
            serde_json::Value::Array(a) => {
                for e in a {
                    match e.as_str() {
                        Some(s) => entries.push(s.to_string()),
                        None => {
                            return Err(Error::model(
                                path,
                                format!("{} holds {e}, expected module names", key(k)),
                            ))
                        }
                    }
                }
            }
            other => {
                return Err(Error::model(
                    path,
                    format!("{} is {other}, expected a list of names", key(k)),
                ))
            }
        }
    }
    // A multimodal model's decoder is vLLM's `language_model.model.*`, its layers counted in
    // `text_config`; vLLM maps the list with the model's `hf_to_vllm_mapper` first, each
    // `root*` split into `root` and `root.*` (`apply_vllm_mapper`, modelopt.py 0.19 L220-239).
    let names = ModelConfig::from_hf_json(config)
        .ok()
        .and_then(|c| c.vllm_names());
    let (layers, root) = match names {
        Some(n) => {
            entries = entries
                .iter()
                .flat_map(|e| match e.strip_suffix('*') {
                    Some(r) if !r.ends_with('.') => vec![r.to_string(), format!("{r}.*")],
                    _ => vec![e.clone()],
                })
                .map(|e| n.to_vllm(&e))
                .collect();
            (
                &config["text_config"]["num_hidden_layers"],
                "language_model.",
            )
        }
        None => (&config["num_hidden_layers"], ""),
    };
    let layers = layers.as_u64().unwrap_or(0) as usize;
    let linears: [(&str, &[&str]); 4] = [
        ("self_attn.qkv_proj", &["q_proj", "k_proj", "v_proj"]),
        ("self_attn.o_proj", &[]),
        ("mlp.gate_up_proj", &["gate_proj", "up_proj"]),
        ("mlp.down_proj", &[]),
    ];
    for l in 0..layers {
        for (name, parts) in linears {
            let prefix = format!("{root}model.layers.{l}.{name}");
            let module = name.rsplit_once('.').map_or("", |(m, _)| m);
            let shards: Vec<String> = parts
                .iter()
                .map(|p| format!("{root}model.layers.{l}.{module}.{p}"))
                .collect();
            if crate::quant::modelopt_fp8::excluded(&prefix, &shards, &entries) {
                return Err(Error::model(
                    path,
                    format!(
                        "{} leaves {prefix} in 16 bits (vLLM's is_layer_excluded): a 16-bit linear layer inside a ModelOpt FP8 checkpoint is not modelled yet (only lm_head and non-linear modules may be listed)",
                        key(if legacy { "exclude_modules" } else { "ignore" })
                    ),
                ));
            }
        }
    }
    let dtype = match config["torch_dtype"].as_str() {
        Some("bfloat16") => DType::BF16,
        _ => DType::F16,
    };
    Ok(StoredQuant::Fp8(StoredFp8 {
        static_activations: true,
        dtype,
        block: None,
        channel: false,
        compressed_tensors: false,
        int8: false,
        routers_unquantized: false,
        modelopt: true,
    }))
}

/// A `quant_method: compressed-tensors` config (LLM Compressor's, RedHatAI's) read as vLLM's
/// `CompressedTensorsConfig._get_scheme_from_parts` picks a scheme (0.19.0
/// compressed_tensors.py; 0.11.0 and 0.15.1 the same order): one config group targeting
/// `Linear`, `ignore` naming only the lm_head, no KV-cache scheme, dense. Two schemes are
/// modelled:
///
/// - `format` "float-quantized" (or "naive-quantized"): `CompressedTensorsW8A8Fp8`
///   (`_is_fp8_w8a8`): weights `type: float`, `num_bits: 8`, symmetric, static, `strategy`
///   "channel" or "tensor"; input activations `float` 8-bit, dynamic per token or static per
///   tensor.
/// - `format` "pack-quantized" without input activations: `CompressedTensorsWNA16`
///   (`_is_wNa16_group_channel`): weights `type: int`, 4-bit, symmetric, static, `strategy`
///   "group" (a `group_size` Marlin takes: 32, 64, 128) or "channel"; `actorder` "group"
///   stores `weight_g_idx` (`has_g_idx`, compressed_tensors_wNa16.py L52 at 0.11.0).
///
/// Everything else (int8 w8a8, 8-bit or asymmetric w4a16, w4a8, NVFP4, block or 2:4
/// schemes, weight-only fp8, a KV cache scheme) is refused naming what it is.
fn compressed_tensors_config(config: &serde_json::Value, path: &Path) -> Result<StoredQuant> {
    let q = &config["quantization_config"];
    let refuse = |what: String| -> Result<StoredQuant> {
        Err(Error::model(
            path,
            format!("quantization_config (compressed-tensors): {what}"),
        ))
    };
    if let Some(sq) = ct_sparse24_config(config, path)? {
        return Ok(sq);
    }
    let (packed, int8) = match q["format"].as_str() {
        Some("float-quantized" | "naive-quantized") | None => (false, false),
        Some("pack-quantized") => (true, false),
        Some("int-quantized") => (false, true),
        Some("nvfp4-pack-quantized") => return ct_nvfp4_config(q, path),
        Some(f @ "mixed-precision") => {
            return refuse(format!(
                "format '{f}' (several schemes in one checkpoint) is not modelled yet"
            ))
        }
        // docs/reading/vllm-machete.md, "2:4 sparse".
        Some(f @ "marlin-24") => {
            return refuse(format!(
                "format '{f}' (2:4 sparse 4-bit weights) is not modelled: vLLM 0.11 and 0.15 run it as CompressedTensorsW4A16Sparse24 (gptq_marlin_24, compute capability 8.0), which vramscope does not reproduce yet; from 0.19 vLLM has no scheme for it (\"No compressed-tensors compatible scheme was found\", compressed_tensors.py L680 at 0.19.0)"
            ))
        }
        Some(f) => {
            return refuse(format!(
                "format '{f}' is not modelled yet (fp8 w8a8 'float-quantized' and w4a16 'pack-quantized' are)"
            ))
        }
    };
    if !q["kv_cache_scheme"].is_null() {
        return refuse("a kv_cache_scheme (stored fp8 KV scales) is not modelled yet".into());
    }
    // LLM Compressor writes `{}` (or format "dense") for a dense model.
    let sparse = &q["sparsity_config"];
    let dense = sparse.is_null()
        || sparse.as_object().is_some_and(|o| o.is_empty())
        || sparse["format"].as_str() == Some("dense");
    // What each release does with it: docs/reading/vllm-machete.md, "2:4 sparse".
    if !dense {
        let field = |k: &str| sparse[k].as_str().unwrap_or("?").to_string();
        return refuse(format!(
            "sparsity_config (sparsity_structure '{}', format '{}') is not modelled: vramscope reads 2:4 sparsity (sparsity_structure \"2:4\", format \"dense\" or \"sparse-24-bitmask\", targets [\"Linear\"]) as vLLM 0.11 and 0.15 run it (CompressedTensors24, docs/reading/vllm-sparse24.md); vLLM 0.22 and later refuse any sparsity_config with targets (\"Sparsity support has been removed\", compressed_tensors.py L261-266 at 0.22.1)",
            field("sparsity_structure"),
            field("format")
        ));
    }
    let groups = match q["config_groups"].as_object() {
        Some(g) if g.len() == 1 => g,
        Some(g) => {
            return refuse(format!(
                "{} config_groups: only one scheme for every Linear layer is modelled",
                g.len()
            ))
        }
        None => return refuse("config_groups is missing or not an object".into()),
    };
    let (name, g) = groups.iter().next().expect("one group");
    let targets_linear = g["targets"]
        .as_array()
        .is_some_and(|t| t.iter().any(|x| x.as_str() == Some("Linear")));
    if !targets_linear {
        return refuse(format!(
            "config_groups.{name}.targets is {}, expected [\"Linear\"]",
            g["targets"]
        ));
    }
    let ignore_ok = match &q["ignore"] {
        serde_json::Value::Null => Ok(()),
        serde_json::Value::Array(names) => names
            .iter()
            .find(|n| !n.as_str().is_some_and(names_lm_head_or_tower))
            .map_or(Ok(()), |n| {
                Err(format!(
                    "ignore lists {n}: a linear layer left in 16 bits is not read yet (only lm_head and a multimodal model's tower and projector)"
                ))
            }),
        other => Err(format!("ignore is {other}, expected a list of names")),
    };
    if let Err(e) = ignore_ok {
        return refuse(e);
    }
    if packed {
        return wna16_scheme(name, g, path);
    }
    if int8 {
        return int8_scheme(name, g, config, path);
    }
    let w = &g["weights"];
    let is = |v: &serde_json::Value, k: &str, want: serde_json::Value| v[k] == want;
    let float8 =
        |v: &serde_json::Value| is(v, "type", "float".into()) && is(v, "num_bits", 8.into());
    if !float8(w) {
        return refuse(format!(
            "config_groups.{name}.weights is {} {}-bit: only fp8 (type float, num_bits 8) is modelled yet (int8 w8a8, w4a16 and NVFP4 are not)",
            w["type"], w["num_bits"]
        ));
    }
    if !is(w, "symmetric", true.into()) || is(w, "dynamic", true.into()) {
        return refuse(format!(
            "config_groups.{name}.weights: only symmetric static fp8 weights are modelled"
        ));
    }
    let channel = match w["strategy"].as_str() {
        Some("channel") => true,
        Some("tensor") => false,
        other => {
            return refuse(format!(
                "config_groups.{name}.weights.strategy {other:?} is not modelled yet (channel or tensor)"
            ))
        }
    };
    let a = &g["input_activations"];
    if a.is_null() {
        return refuse(format!(
            "config_groups.{name} has no input_activations: fp8 weight-only (w8a16, FP8 Marlin) is not modelled yet"
        ));
    }
    if !float8(a) {
        return refuse(format!(
            "config_groups.{name}.input_activations is {} {}-bit: only fp8 activations are modelled",
            a["type"], a["num_bits"]
        ));
    }
    let static_activations = match (a["strategy"].as_str(), a["dynamic"].as_bool()) {
        (Some("token"), Some(true)) => false,
        (Some("tensor"), Some(false)) => true,
        (s, d) => {
            return refuse(format!(
                "config_groups.{name}.input_activations strategy {s:?} with dynamic {d:?} is not modelled yet (dynamic per token, or static per tensor)"
            ))
        }
    };
    let dtype = match config["torch_dtype"].as_str() {
        Some("bfloat16") => DType::BF16,
        _ => DType::F16,
    };
    Ok(StoredQuant::Fp8(StoredFp8 {
        static_activations,
        dtype,
        block: None,
        channel,
        compressed_tensors: true,
        int8: false,
        routers_unquantized: false,
        modelopt: false,
    }))
}

/// A 2:4 `sparsity_config` as vLLM 0.11 and 0.15 route it (`get_scheme`, 0.15.1
/// compressed_tensors.py L704-786; `supports_cutlass_24` L833-896; 0.11.0 the same): a
/// `sparsity_structure` "2:4" config with targets and `format` "dense" or "sparse-24-bitmask"
/// makes every targeted Linear a `CompressedTensors24` layer when it is unquantized or 8-bit
/// w8a8 (weights per tensor or channel, activations per tensor or token). Modelled: 16-bit
/// (no `config_groups`) and fp8 weights with dynamic per-token fp8 activations (RedHatAI's
/// `Sparse-Llama-3.1-8B-2of4-FP8-dynamic`). `None` where the config has no 2:4 sparsity;
/// int8 or static activations, weight-only 2:4 and a sparsity `ignore` naming a decoder
/// layer are refused by name.
fn ct_sparse24_config(config: &serde_json::Value, path: &Path) -> Result<Option<StoredQuant>> {
    use crate::quant::sparse24::{Format, Sparse24};
    let q = &config["quantization_config"];
    let sparse = &q["sparsity_config"];
    if sparse["sparsity_structure"].as_str() != Some("2:4") {
        return Ok(None);
    }
    let refuse = |what: String| -> Result<Option<StoredQuant>> {
        Err(Error::model(
            path,
            format!("quantization_config (compressed-tensors 2:4 sparse): {what}"),
        ))
    };
    let format = match sparse["format"].as_str() {
        Some("dense") => Format::Dense,
        Some("sparse-24-bitmask") => Format::Bitmask,
        _ => {
            return refuse(format!(
                "sparsity_config.format {} is not one CompressedTensors24 reads (\"dense\" or \"sparse-24-bitmask\", supports_cutlass_24 at 0.15.1 compressed_tensors.py L854-868)",
                sparse["format"]
            ))
        }
    };
    // `sparsity_scheme_map` has one entry per target (L264-266): none, no 2:4 layer.
    let targets = sparse["targets"].as_array().cloned().unwrap_or_default();
    if targets.is_empty() {
        return Ok(None);
    }
    if !targets.iter().any(|t| t.as_str() == Some("Linear")) {
        return refuse(format!(
            "sparsity_config.targets is {}: only [\"Linear\"] (every linear layer 2:4) is modelled",
            sparse["targets"]
        ));
    }
    if let Some(n) = sparse["ignore"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| !n.as_str().is_some_and(names_lm_head_or_tower))
    {
        return refuse(format!(
            "sparsity_config.ignore lists {n}: a decoder linear layer left dense inside a 2:4 checkpoint is not modelled (only lm_head and a multimodal model's tower and projector)"
        ));
    }
    if !q["kv_cache_scheme"].is_null() {
        return refuse("a kv_cache_scheme (stored fp8 KV scales) is not modelled yet".into());
    }
    let dtype = match config["torch_dtype"].as_str() {
        Some("bfloat16") => DType::BF16,
        _ => DType::F16,
    };
    let groups = q["config_groups"].as_object().cloned().unwrap_or_default();
    if groups.is_empty() {
        return Ok(Some(StoredQuant::Sparse24(Sparse24 {
            format,
            fp8_channel: None,
            dtype,
        })));
    }
    if groups.len() != 1 {
        return refuse(format!(
            "{} config_groups: only one scheme for every Linear layer is modelled",
            groups.len()
        ));
    }
    let (name, g) = groups.iter().next().expect("one group");
    if !g["targets"]
        .as_array()
        .is_some_and(|t| t.iter().any(|x| x.as_str() == Some("Linear")))
    {
        return refuse(format!(
            "config_groups.{name}.targets is {}, expected [\"Linear\"]",
            g["targets"]
        ));
    }
    if let Some(n) = q["ignore"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| !n.as_str().is_some_and(names_lm_head_or_tower))
    {
        return refuse(format!(
            "ignore lists {n}: a linear layer left in 16 bits is not read yet (only lm_head and a multimodal model's tower and projector)"
        ));
    }
    let (w, a) = (&g["weights"], &g["input_activations"]);
    if a.is_null() {
        return refuse(format!(
            "config_groups.{name} has no input_activations: weight-only quantization with a 2:4 sparsity_config (not CompressedTensors24: supports_cutlass_24 is false, L874-876 at 0.15.1) is not modelled yet"
        ));
    }
    let bits8 = |v: &serde_json::Value| v["num_bits"].as_u64() == Some(8);
    if !(bits8(w) && bits8(a)) {
        return refuse(format!(
            "config_groups.{name}: weights {}-bit and activations {}-bit: CompressedTensors24 takes 8-bit weights and activations only (L896 at 0.15.1)",
            w["num_bits"], a["num_bits"]
        ));
    }
    if w["type"].as_str() != Some("float") || a["type"].as_str() != Some("float") {
        return refuse(format!(
            "config_groups.{name}: weights {} and activations {}: int8 w8a8 2:4 (CUTLASS int8 sparse GEMM) is not modelled yet; fp8 (type float) is",
            w["type"], a["type"]
        ));
    }
    if w["symmetric"].as_bool() != Some(true) || w["dynamic"].as_bool() == Some(true) {
        return refuse(format!(
            "config_groups.{name}.weights: only symmetric static fp8 weights are modelled"
        ));
    }
    let channel = match w["strategy"].as_str() {
        Some("channel") => true,
        Some("tensor") => false,
        other => {
            return refuse(format!(
                "config_groups.{name}.weights.strategy {other:?}: CompressedTensors24 takes \"tensor\" or \"channel\" (L878-886 at 0.15.1)"
            ))
        }
    };
    match (a["strategy"].as_str(), a["dynamic"].as_bool()) {
        (Some("token"), Some(true)) => {}
        (s, d) => {
            return refuse(format!(
                "config_groups.{name}.input_activations strategy {s:?} with dynamic {d:?}: only dynamic per-token fp8 activations are modelled for 2:4 (static per-tensor ones are not yet)"
            ))
        }
    }
    Ok(Some(StoredQuant::Sparse24(Sparse24 {
        format,
        fp8_channel: Some(channel),
        dtype,
    })))
}

/// `config_groups.NAME` of an `int-quantized` checkpoint as vLLM picks
/// `CompressedTensorsW8A8Int8` (0.11.0 compressed_tensors.py `_is_dynamic_token_w8a8`
/// L320-332, the scheme at L525-529: 8-bit
/// int weights and activations, weights per channel or tensor and symmetric, activations
/// per token and dynamic). Modelled: channel weights, dynamic symmetric per-token
/// activations (RedHatAI's `…-quantized.w8a8`); per-tensor weights, static or asymmetric
/// activations (`azp_adj`, `cutlass_scaled_mm_azp`) are refused by name.
fn int8_scheme(
    name: &str,
    g: &serde_json::Value,
    config: &serde_json::Value,
    path: &Path,
) -> Result<StoredQuant> {
    let refuse = |what: String| -> Result<StoredQuant> {
        Err(Error::model(
            path,
            format!(
                "quantization_config (compressed-tensors int8 w8a8): config_groups.{name}.{what}"
            ),
        ))
    };
    let (w, a) = (&g["weights"], &g["input_activations"]);
    let int8 = |v: &serde_json::Value| {
        v["type"].as_str() == Some("int") && v["num_bits"].as_u64() == Some(8)
    };
    if !int8(w) {
        return refuse(format!(
            "weights is {} {}-bit: format int-quantized holds int 8-bit weights",
            w["type"], w["num_bits"]
        ));
    }
    if w["symmetric"].as_bool() != Some(true) || w["dynamic"].as_bool() == Some(true) {
        return refuse("weights: only symmetric static int8 weights are modelled".into());
    }
    match w["strategy"].as_str() {
        Some("channel") => {}
        other => {
            return refuse(format!(
                "weights.strategy {other:?} is not modelled yet (channel: one scale per output row)"
            ))
        }
    }
    if a.is_null() {
        return refuse(
            "input_activations is missing: int8 weight-only (w8a16) is not modelled yet".into(),
        );
    }
    if !int8(a) {
        return refuse(format!(
            "input_activations is {} {}-bit: only int8 activations go with int8 weights",
            a["type"], a["num_bits"]
        ));
    }
    if (a["strategy"].as_str(), a["dynamic"].as_bool()) != (Some("token"), Some(true)) {
        return refuse(format!(
            "input_activations strategy {:?} with dynamic {:?}: only dynamic per-token int8 activations are modelled (static ones store input_scale)",
            a["strategy"].as_str(),
            a["dynamic"].as_bool()
        ));
    }
    if a["symmetric"].as_bool() != Some(true) {
        return refuse(
            "input_activations.symmetric is not true: asymmetric activations (zero points, azp_adj, cutlass_scaled_mm_azp) are not modelled yet".into(),
        );
    }
    let dtype = match config["torch_dtype"].as_str() {
        Some("bfloat16") => DType::BF16,
        _ => DType::F16,
    };
    Ok(StoredQuant::Fp8(StoredFp8 {
        static_activations: false,
        dtype,
        block: None,
        channel: true,
        compressed_tensors: true,
        int8: true,
        routers_unquantized: false,
        modelopt: false,
    }))
}

/// `config_groups.NAME` of a `pack-quantized` checkpoint as `CompressedTensorsWNA16` takes it
/// (0.11.0 compressed_tensors.py `_is_wNa16_group_channel` L436-444: no input activations,
/// weights static, strategy channel or group; `format` pack-quantized picks the scheme at
/// L466-481; compressed_tensors_wNa16.py L30-66: 4 or 8 bits,
/// `uint4b8` symmetric, `uint4` with zero points). The 4-bit symmetric form is modelled (the
/// codes and rule GPTQ's Marlin path runs); 8-bit (`uint8b128`) and zero points are refused
/// as the GPTQ / AWQ readers refuse them.
fn wna16_scheme(name: &str, g: &serde_json::Value, path: &Path) -> Result<StoredQuant> {
    let refuse = |what: String| -> Result<StoredQuant> {
        Err(Error::model(
            path,
            format!("quantization_config (compressed-tensors): config_groups.{name}.{what}"),
        ))
    };
    let w = &g["weights"];
    let a = &g["input_activations"];
    if !a.is_null() {
        return refuse(format!(
            "input_activations is {} {}-bit with pack-quantized weights: w4a8 (CutlassW4A8 / Machete with fp8 or int8 activations) is not modelled yet",
            a["type"], a["num_bits"]
        ));
    }
    if w["type"].as_str() != Some("int") {
        return refuse(format!(
            "weights.type is {}: pack-quantized weights are int (vLLM's CompressedTensorsWNA16)",
            w["type"]
        ));
    }
    match w["num_bits"].as_u64() {
        Some(4) => {}
        Some(8) => {
            return refuse(
                "weights.num_bits is 8: w8a16 (Marlin's uint8b128) is not modelled yet, as GPTQ's 8-bit is not".into(),
            )
        }
        _ => {
            return refuse(format!(
                "weights.num_bits is {}: vLLM's CompressedTensorsWNA16 takes 4 or 8 (WNA16_SUPPORTED_BITS)",
                w["num_bits"]
            ))
        }
    }
    match w["symmetric"].as_bool() {
        Some(true) => {}
        Some(false) => {
            return refuse(
                "weights.symmetric is false: zero points (weight_zero_point, Marlin's uint4 with zero points) are not modelled yet for compressed-tensors".into(),
            )
        }
        None => {
            return refuse(format!(
                "weights.symmetric is {}, expected true or false",
                w["symmetric"]
            ))
        }
    }
    if w["dynamic"].as_bool() == Some(true) {
        return refuse("weights.dynamic is true: weights are stored quantized (static)".into());
    }
    let group_size = match (w["strategy"].as_str(), &w["group_size"]) {
        (Some("channel"), _) => -1,
        (Some("group"), v) => match v.as_i64() {
            Some(gs) if [32, 64, 128].contains(&gs) => gs,
            Some(gs) => {
                return refuse(format!(
                    "weights.group_size is {gs}: Marlin takes 32, 64 or 128 (MARLIN_SUPPORTED_GROUP_SIZES); vLLM runs other group sizes with another kernel, which vramscope does not reproduce"
                ))
            }
            None => return refuse(format!("weights.group_size is {v}, expected an integer")),
        },
        (s, _) => {
            return refuse(format!(
                "weights.strategy {s:?} is not modelled (group or channel; vLLM's CompressedTensorsWNA16 takes no other)"
            ))
        }
    };
    // compressed-tensors' ActivationOrdering: "group" keeps `weight_g_idx`; "weight" (and
    // "static") reorder only while quantizing and store none.
    let desc_act = match &w["actorder"] {
        serde_json::Value::Null | serde_json::Value::Bool(false) => false,
        serde_json::Value::Bool(true) => true,
        serde_json::Value::String(s) if s == "group" => true,
        serde_json::Value::String(s) if s == "weight" || s == "static" => false,
        other => {
            return refuse(format!(
                "weights.actorder is {other}, expected null, \"group\", \"weight\" or \"static\""
            ))
        }
    };
    if desc_act && group_size == -1 {
        return refuse(
            "weights.actorder is \"group\" with strategy channel: activation ordering needs group quantization (compressed-tensors refuses it)".into(),
        );
    }
    Ok(StoredQuant::CtW4a16 {
        group_size,
        desc_act,
    })
}

/// `quantization_config.weight_block_size` as vLLM 0.8.5's `Fp8Config.__init__` takes it
/// (fp8.py L70-83): absent, or two dimensions `[block_n, block_k]` under the dynamic scheme.
/// Each must be a positive integer (vLLM divides by them).
fn fp8_block_size(
    q: &serde_json::Value,
    static_activations: bool,
    path: &Path,
) -> Result<Option<BlockSize>> {
    let v = &q["weight_block_size"];
    let bad = |why: String| {
        Err(Error::model(
            path,
            format!("quantization_config.weight_block_size {v}: {why}"),
        ))
    };
    let dims = match v {
        serde_json::Value::Null => return Ok(None),
        serde_json::Value::Array(d) => d,
        _ => return bad("expected a list of two integers [block_n, block_k]".into()),
    };
    if dims.len() != 2 {
        return bad(format!(
            "vLLM refuses it: \"The quantization block size of weight must have 2 dimensions, but got {} dimensions\" (fp8.py L75-78 at 0.8.5)",
            dims.len()
        ));
    }
    let size = |d: &serde_json::Value| d.as_u64().filter(|&x| x > 0 && x <= 1 << 20);
    let (Some(n), Some(k)) = (size(&dims[0]), size(&dims[1])) else {
        return bad("expected two positive integers [block_n, block_k]".into());
    };
    if static_activations {
        return bad("vLLM refuses it: \"The block-wise quantization only supports dynamic activation scheme for now, but got static activation scheme.\" (fp8.py L79-82 at 0.8.5)".into());
    }
    Ok(Some(BlockSize {
        n: n as usize,
        k: k as usize,
    }))
}

/// All shards of a checkpoint, with each tensor's shard.
pub struct SafetensorsModel {
    /// The index file, or the single weights file.
    pub origin: PathBuf,
    pub shards: Vec<SafetensorsFile>,
    which: HashMap<String, usize>,
    pub stored_quant: StoredQuant,
    /// Names the config uses → names the file uses (OPT checkpoints written without the
    /// `model.` prefix, as facebook/opt-* are; a multimodal checkpoint's names as vLLM maps
    /// them, `map_names`).
    alias: HashMap<String, String>,
    /// How vLLM names a multimodal checkpoint's tensors (`map_names`).
    names: Option<&'static VllmNames>,
    /// Whether the file's names are read through `names` (a Hugging Face layout) rather than
    /// as the config's (vramscope's own, `gen-model`'s).
    mapped: bool,
    /// Weights stored as bitsandbytes 4-bit, by their stored name, with their quant state.
    bnb4: HashMap<String, Bnb4Meta>,
    /// A bitsandbytes checkpoint's `llm_int8_skip_modules` (its 16-bit linear layers).
    pub bnb_skip: Vec<String>,
    /// The refusal for a multimodal tower layer the quantization config leaves quantized.
    pub(crate) quantized_tower: Option<super::weights::QuantizedTower>,
}

/// The quant-state blob suffixes `QuantState.as_dict(packed=True)` writes.
const QS_SUFFIXES: [(&str, Bnb4Type); 2] = [
    (".quant_state.bitsandbytes__nf4", Bnb4Type::Nf4),
    (".quant_state.bitsandbytes__fp4", Bnb4Type::Fp4),
];

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
        let mut alias = HashMap::new();
        for name in which.keys() {
            if name.starts_with("decoder.") && !which.contains_key(&format!("model.{name}")) {
                alias.insert(format!("model.{name}"), name.clone());
            }
        }
        let mut m = SafetensorsModel {
            origin: origin.to_path_buf(),
            shards,
            which,
            stored_quant,
            alias,
            names: None,
            mapped: false,
            bnb4: HashMap::new(),
            bnb_skip: Vec::new(),
            quantized_tower: None,
        };
        m.bnb4 = m.read_quant_states()?;
        Ok(m)
    }

    /// Every 4-bit weight's quant state, checked against its stored parts: the packed
    /// codes, absmax (f32, or u8 with nested absmax and code), quant map, as
    /// `QuantState.from_dict` will read them.
    fn read_quant_states(&self) -> Result<HashMap<String, Bnb4Meta>> {
        let mut out = HashMap::new();
        for (blob_name, &i) in &self.which {
            let Some((weight, ty)) = QS_SUFFIXES
                .iter()
                .find_map(|(suf, ty)| blob_name.strip_suffix(suf).map(|w| (w, *ty)))
            else {
                continue;
            };
            let s = &self.shards[i];
            let bad = |what: String| Error::model(&s.path, format!("tensor {weight}: {what}"));
            let (_, blob) = s
                .raw_u8(blob_name)
                .ok_or_else(|| bad(format!("quant state {blob_name} is not U8")))?;
            let meta = Bnb4Meta::from_blob(blob, ty).map_err(bad)?;
            let packed = self.u8_of(weight).ok_or_else(|| {
                bad(format!(
                    "has a 4-bit quant state but is not stored as U8 (found {})",
                    self.dtype_name(weight)
                ))
            })?;
            if packed.iter().product::<usize>() != meta.packed_len() {
                return Err(bad(format!(
                    "U8 {packed:?} holds {} packed bytes but its quant state's shape {:?} needs {}",
                    packed.iter().product::<usize>(),
                    meta.shape,
                    meta.packed_len()
                )));
            }
            let blocks = meta.blocks();
            let f32_len = |part: &str, want: usize| -> Result<()> {
                let n = format!("{weight}.{part}");
                match self.info(&n) {
                    Some((Some(StoredDtype::F32), sh)) if sh.iter().product::<usize>() == want => {
                        Ok(())
                    }
                    Some((d, sh)) => Err(bad(format!(
                        "{n} is {} {sh:?}, expected F32 [{want}] (blocksize {})",
                        d.map_or_else(|| self.dtype_name(&n), |d| d.name().to_string()),
                        meta.blocksize
                    ))),
                    None => Err(bad(format!("{n} is missing"))),
                }
            };
            f32_len("quant_map", 16)?;
            match meta.nested_blocksize {
                None => f32_len("absmax", blocks)?,
                Some(nb) => {
                    let n = format!("{weight}.absmax");
                    match self.u8_of(&n) {
                        Some(sh) if sh.iter().product::<usize>() == blocks => {}
                        Some(sh) => {
                            return Err(bad(format!(
                                "{n} is U8 {sh:?}, expected [{blocks}] (one per block of {})",
                                meta.blocksize
                            )))
                        }
                        None => {
                            return Err(bad(format!(
                                "{n} should be U8 [{blocks}] under double quantization, found {}",
                                self.dtype_name(&n)
                            )))
                        }
                    }
                    f32_len("nested_absmax", blocks.div_ceil(nb))?;
                    f32_len("nested_quant_map", 256)?;
                }
            }
            // One weight, one quant state: two (nf4 and fp4) would make the weight's format
            // depend on the order the names come out of a hash map.
            if out.insert(weight.to_string(), meta).is_some() {
                let blobs = QS_SUFFIXES.map(|(suf, _)| format!("{weight}{suf}"));
                return Err(bad(format!(
                    "two quant states for one weight, {} and {}: a 4-bit weight has exactly one",
                    blobs[0], blobs[1]
                )));
            }
        }
        Ok(out)
    }

    /// The shape of a U8 tensor (`None` when absent or not U8).
    fn u8_of(&self, name: &str) -> Option<Vec<usize>> {
        let name = self.resolve(name);
        let s = self.which.get(name).map(|&i| &self.shards[i])?;
        s.raw_u8(name).map(|(sh, _)| sh.to_vec())
    }

    /// A stored tensor's dtype as the header names it and its bytes (inspect's count of the
    /// dtypes vramscope does not compute with, such as compressed-tensors' I64
    /// `weight_shape`).
    pub fn stored_dtype_and_bytes(&self, name: &str) -> (String, u64) {
        match self.shard_of(name) {
            Ok(s) => {
                let stored = self.resolve(name);
                (s.stored_dtype_name(stored), s.tensor_bytes(stored))
            }
            Err(_) => ("nothing (missing)".into(), 0),
        }
    }

    fn dtype_name(&self, name: &str) -> String {
        match self.shard_of(name) {
            Ok(s) => s.stored_dtype_name(self.resolve(name)),
            Err(_) => "nothing (missing)".into(),
        }
    }

    /// The name the file stores a config name under.
    fn resolve<'a>(&'a self, name: &'a str) -> &'a str {
        self.alias.get(name).map_or(name, String::as_str)
    }

    /// Reads a multimodal checkpoint's names as vLLM 0.19 does (`names`: its
    /// `hf_to_vllm_mapper`, then its module's children), where the file keeps its language
    /// model where vLLM's module does (`language_model.model.*`, transformers 4.52's
    /// `model.language_model.*`, ...): each config name then resolves to the stored name vLLM
    /// loads into that parameter. A file whose names put nothing in vLLM's language model's
    /// body keeps them as they are (vramscope's own layout). Two stored tensors vLLM would load
    /// into one parameter are refused, naming both.
    pub(crate) fn map_names(&mut self, names: &'static VllmNames) -> Result<()> {
        self.names = Some(names);
        if !self.which.keys().any(|n| names.in_language_model_body(n)) {
            return Ok(());
        }
        self.mapped = true;
        let mut stored: Vec<&String> = self.which.keys().collect();
        stored.sort();
        let mut by_config: HashMap<String, &String> = HashMap::new();
        for s in &stored {
            let Some(c) = self.config_of(s) else { continue };
            if let Some(other) = by_config.insert(c, s) {
                return Err(Error::model(
                    &self.shards[self.which[*s]].path,
                    format!(
                        "tensors {other} and {s} both load into {}'s {}: a checkpoint holds one",
                        names.architecture,
                        names.to_vllm(s)
                    ),
                ));
            }
        }
        let alias: Vec<(String, String)> = by_config
            .into_iter()
            .filter(|(c, s)| c != *s)
            .map(|(c, s)| (c, s.clone()))
            .collect();
        self.alias.extend(alias);
        Ok(())
    }

    /// The config's name for a stored tensor, `None` for one vLLM would place outside the
    /// modules the config shapes.
    fn config_of(&self, stored: &str) -> Option<String> {
        match self.names.filter(|_| self.mapped) {
            None => Some(stored.to_string()),
            Some(n) => n.config_name(&n.to_vllm(stored)),
        }
    }

    /// The name the file keeps (or would keep) a config name under: the one a message about a
    /// missing or mis-shaped tensor names. A missing one is named in the layout the file's
    /// other tensors of that module use (the mapper's source or vLLM's own name); failing
    /// those, in 4.52's where the file uses the mapper at all.
    fn stored_name(&self, name: &str) -> String {
        let Some(n) = self.names.filter(|_| self.mapped) else {
            return self.resolve(name).to_string();
        };
        // A stored tensor of this very name that vLLM loads elsewhere is not it.
        let found = self.resolve(name);
        if self.which.contains_key(found) && self.config_of(found).as_deref() == Some(name) {
            return found.to_string();
        }
        let candidates = n.stored_candidates(&n.vllm_of_config(name));
        let in_use = |root: &str| {
            self.which
                .keys()
                .any(|s| s.starts_with(root) && self.config_of(s).is_some())
        };
        if let Some((s, _)) = candidates.iter().find(|(_, root)| in_use(root)) {
            return s.clone();
        }
        let uses_mapper = self.which.keys().any(|s| n.to_vllm(s) != *s);
        let pick = if uses_mapper { 0 } else { candidates.len() - 1 };
        candidates[pick].0.clone()
    }

    /// Refuses a stored tensor the config does not imply and vLLM's loader does not pass over
    /// (`skips`, given the stored name and the language model's name for it), naming the first
    /// such tensor by name and its file, and how many more there are.
    fn check_all_known(
        &self,
        cfg: &ModelConfig,
        architecture: &str,
        skips: impl Fn(&str, Option<&str>) -> bool,
    ) -> Result<()> {
        let expected: std::collections::HashSet<String> =
            cfg.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        let mut unknown: Vec<&String> = self
            .which
            .keys()
            .filter(|s| {
                let c = self.config_of(s);
                !c.as_ref().is_some_and(|c| expected.contains(c)) && !skips(s, c.as_deref())
            })
            .collect();
        unknown.sort();
        let Some(first) = unknown.first() else {
            return Ok(());
        };
        let more = match unknown.len() - 1 {
            0 => String::new(),
            1 => "; 1 more such tensor".into(),
            n => format!("; {n} more such tensors"),
        };
        let embed = cfg
            .tensor_shapes()
            .into_iter()
            .map(|(n, _)| n)
            .find(|n| n.ends_with("embed_tokens.weight"));
        let nested = match embed.map(|e| (self.stored_name(&e), e)) {
            Some((stored, e)) if self.mapped && stored != e && self.which.contains_key(&stored) => {
                format!(" (this one keeps its language model's embedding as {stored})")
            }
            _ => String::new(),
        };
        Err(Error::model(
            &self.shards[self.which[*first]].path,
            format!(
                "tensor {first} is not a parameter of {architecture} as config.json shapes it, and vLLM refuses a checkpoint holding one{nested}{more}"
            ),
        ))
    }

    fn shard_of(&self, name: &str) -> Result<&SafetensorsFile> {
        self.which
            .get(self.resolve(name))
            .map(|&i| &self.shards[i])
            .ok_or_else(|| Error::model(&self.origin, format!("tensor {name} is missing")))
    }

    pub fn info(&self, name: &str) -> Option<(Option<StoredDtype>, &[usize])> {
        self.shard_of(name)
            .ok()
            .and_then(|s| s.info(self.resolve(name)))
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &String> {
        self.which.keys()
    }

    /// Whether a tensor is stored as F8_E4M3 (a pre-quantized fp8 checkpoint's codes).
    pub fn is_f8_e4m3(&self, name: &str) -> bool {
        self.shard_of(name)
            .is_ok_and(|s| s.is_f8_e4m3(self.resolve(name)))
    }

    /// Whether a tensor is stored as I32 (AWQ / GPTQ parts).
    pub fn is_i32(&self, name: &str) -> bool {
        let name = self.resolve(name);
        self.which
            .get(name)
            .is_some_and(|&i| self.shards[i].is_i32(name))
    }

    /// Whether a tensor is stored as U8 (bitsandbytes 4-bit parts).
    pub fn is_u8(&self, name: &str) -> bool {
        self.u8_of(name).is_some()
    }

    /// Checks every tensor the config implies is present with the implied shape (and, for a
    /// bitsandbytes 8-bit checkpoint, its `.SCB` scales).
    pub fn check_against(&self, cfg: &ModelConfig) -> Result<()> {
        for s in &self.shards {
            let names: Vec<String> = s.tensor_names().filter_map(|n| self.config_of(n)).collect();
            cfg.check_layers_present(
                names.iter().map(String::as_str),
                "model.layers.",
                "config.json's num_hidden_layers",
            )
            .map_err(|p| Error::model(&s.path, p))?;
        }
        // A multimodal checkpoint's names are mapped as vLLM maps them (`map_names`), so every
        // tensor is accounted for; a quantized checkpoint's parts are its loader's. Checked
        // before what is missing: a layout vLLM does not map names its own tensors.
        if let Some(n) = self
            .names
            .filter(|_| self.stored_quant == StoredQuant::None)
        {
            self.check_all_known(cfg, n.architecture, |s, c| {
                cfg.multimodal_loader_skips(s, c)
            })?;
        }
        for (name, shape) in cfg.tensor_shapes() {
            if self.stored_quant.nvfp4().is_some()
                && super::is_projection(&name)
                && shape.len() == 2
            {
                self.read_nvfp4(&name, shape[0], shape[1], false)?;
                continue;
            }
            if self.stored_quant.sparse24().is_some()
                && super::is_projection(&name)
                && shape.len() == 2
            {
                self.read_sparse24(&name, shape[0], shape[1], false)?;
                continue;
            }
            if self.stored_quant.packed4().is_some()
                && super::is_projection(&name)
                && shape.len() == 2
            {
                self.read_packed4(&name, shape[0], shape[1], false)?;
                continue;
            }
            let shown = self.stored_name(&name);
            let s = self
                .which
                .get(&shown)
                .map(|&i| &self.shards[i])
                .ok_or_else(|| {
                    Error::model(
                        &self.origin,
                        format!("tensor {shown} is missing (config.json implies {shape:?})"),
                    )
                })?;
            let stored = self.resolve(&name);
            if let StoredQuant::Fp8(f) = self.stored_quant {
                if super::is_projection(&name) {
                    self.check_fp8_linear(&name, &shape, f)?;
                    continue;
                }
            }
            if self.stored_quant == StoredQuant::Mxfp4
                && (name.ends_with("_blocks") || name.ends_with("_scales"))
            {
                self.checked(&name, &shape, &["U8"], "MXFP4: e2m1 pairs and e8m0 scales")?;
                continue;
            }
            if let Some(meta) = self.bnb4.get(stored) {
                if self.stored_quant == StoredQuant::None {
                    return Err(Error::model(
                        &s.path,
                        format!("tensor {name} is bitsandbytes 4-bit but config.json has no quantization_config"),
                    ));
                }
                if let StoredQuant::BnbInt8 { .. } = self.stored_quant {
                    return Err(Error::model(
                        &s.path,
                        format!("tensor {name} is bitsandbytes 4-bit but config.json's quantization_config says 8-bit (load_in_8bit)"),
                    ));
                }
                if meta.shape[..] != shape[..] {
                    return Err(Error::model(
                        &s.path,
                        format!(
                            "tensor {name}: its quant state says shape {:?} but config.json implies {shape:?}",
                            meta.shape
                        ),
                    ));
                }
                continue;
            }
            if s.is_u8(stored) {
                let blobs = QS_SUFFIXES.map(|(suf, _)| format!("{name}{suf}"));
                return Err(Error::model(
                    &s.path,
                    format!(
                        "tensor {name} is U8 (4-bit packed?) but its quant state {} or {} is missing",
                        blobs[0], blobs[1]
                    ),
                ));
            }
            let (dtype, found) = s.info(stored).expect("listed");
            if found != shape.as_slice() {
                return Err(Error::model(
                    &s.path,
                    format!("tensor {shown} has shape {found:?} but config.json implies {shape:?}"),
                ));
            }
            match dtype {
                None => {
                    return Err(Error::model(
                        &s.path,
                        format!(
                            "tensor {name} has dtype {}, expected F32, F16, BF16 or I8",
                            s.stored_dtype_name(stored)
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
                    if let StoredQuant::Bnb4 { .. } = self.stored_quant {
                        return Err(Error::model(
                            &s.path,
                            format!("tensor {name} is int8 but config.json's quantization_config says 4-bit (load_in_4bit)"),
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

    /// A block-wise fp8 linear's scales (vLLM 0.8.5): its `weight_scale_inv` F32 of
    /// `[ceil(n / block_n), ceil(k / block_k)]`, the shape `BlockQuantScaleParameter` has and
    /// the weight loader copies into after asserting it (fp8.py L266-279, parameter.py
    /// `load_qkv_weight` / `load_merged_column_weight` at 0.8.5); a `weight_scale` or
    /// `input_scale` has no parameter to go to. Values are checked when read.
    fn check_fp8_block_scales(&self, base: &str, shape: &[usize], block: BlockSize) -> Result<()> {
        let n = format!("{base}.weight_scale_inv");
        for other in ["weight_scale", "input_scale"] {
            let o = format!("{base}.{other}");
            if self.info(&o).is_some() {
                return Err(Error::model(
                    &self.shard_of(&o)?.path,
                    format!("tensor {o} is stored but the checkpoint is block-wise (weight_block_size): vLLM has no {other} parameter to load it into"),
                ));
            }
        }
        let Some((dtype, found)) = self.info(&n) else {
            return Err(Error::model(
                &self.shard_of(&format!("{base}.weight"))?.path,
                format!("tensor {n} is missing: a block-wise fp8 weight needs its block scales"),
            ));
        };
        let at = &self.shard_of(&n)?.path;
        if dtype != Some(StoredDtype::F32) {
            return Err(Error::model(
                at,
                format!(
                    "tensor {n} is stored as {}, expected F32",
                    self.dtype_name(&n)
                ),
            ));
        }
        let want = block.grid(shape[0], shape[1]);
        if found != want {
            return Err(Error::model(
                at,
                format!(
                    "tensor {n} has shape {found:?}, expected {want:?}: one scale per [{}, {}] block of the {shape:?} weight",
                    block.n, block.k
                ),
            ));
        }
        Ok(())
    }

    /// A linear weight of an fp8 checkpoint: F8_E4M3 of the shape the config implies, its
    /// `weight_scale` (and, under the static scheme, `input_scale`) F32 `[]` or `[1]`, as
    /// vLLM 0.6.4's `PerTensorScaleParameter` loads them (parameter.py L232-250); under the
    /// dynamic scheme a stored `input_scale` has no parameter to go to (fp8.py L167-177
    /// registers `None`), so `load_weights` would fail on it. The scales' values are read (and
    /// checked) when the weights are: a dry run reads headers only.
    fn check_fp8_linear(&self, name: &str, shape: &[usize], f: StoredFp8) -> Result<()> {
        let static_act = f.static_activations;
        let s = self.shard_of(name)?;
        let stored = self.resolve(name);
        let (_, found) = s.info(stored).expect("listed");
        if f.int8 && s.stored_dtype_name(stored) != "I8" {
            return Err(Error::model(
                &s.path,
                format!(
                    "tensor {name} is stored as {}, expected I8 (quantization_config says int8 w8a8)",
                    s.stored_dtype_name(stored)
                ),
            ));
        }
        if !f.int8 && !s.is_f8_e4m3(stored) {
            return Err(Error::model(
                &s.path,
                format!(
                    "tensor {name} is stored as {}, expected F8_E4M3 (quantization_config says fp8)",
                    s.stored_dtype_name(stored)
                ),
            ));
        }
        if found != shape {
            return Err(Error::model(
                &s.path,
                format!("tensor {name} has shape {found:?} but config.json implies {shape:?}"),
            ));
        }
        let base = name.trim_end_matches(".weight");
        if let Some(block) = f.block {
            return self.check_fp8_block_scales(base, shape, block);
        }
        for (part, needed) in [("weight_scale", true), ("input_scale", static_act)] {
            let n = format!("{base}.{part}");
            match (self.info(&n), needed) {
                (None, false) => {}
                (None, true) => {
                    let why = if part == "input_scale" {
                        "activation_scheme static quantizes activations with the stored scale"
                    } else {
                        "an fp8 weight needs its per-tensor scale"
                    };
                    return Err(Error::model(
                        &s.path,
                        format!("tensor {n} is missing: {why}"),
                    ));
                }
                (Some(_), false) => {
                    return Err(Error::model(
                        &self.shard_of(&n)?.path,
                        format!("tensor {n} is stored but activation_scheme is dynamic: vLLM has no input_scale parameter to load it into"),
                    ))
                }
                // compressed-tensors' channel-wise scales: `[n, 1]`, F32 or the checkpoint's
                // 16-bit dtype (checked, with their values, as the weights are read).
                (Some((_, sh)), true) if f.channel && part == "weight_scale" => {
                    if sh != [shape[0], 1] && sh != [shape[0]] {
                        return Err(Error::model(
                            &self.shard_of(&n)?.path,
                            format!(
                                "tensor {n} has shape {sh:?}, expected [{}, 1] (one scale per output channel)",
                                shape[0]
                            ),
                        ));
                    }
                }
                (Some((dtype, sh)), true) => {
                    let at = &self.shard_of(&n)?.path;
                    if dtype != Some(StoredDtype::F32) {
                        return Err(Error::model(
                            at,
                            format!(
                                "tensor {n} is stored as {}, expected F32",
                                self.dtype_name(&n)
                            ),
                        ));
                    }
                    if !(sh.is_empty() || sh == [1]) {
                        return Err(Error::model(
                            at,
                            format!("tensor {n} has shape {sh:?}, expected a per-tensor scale of shape [] or [1]"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Bytes of all tensors as stored.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().map(SafetensorsFile::total_bytes).sum()
    }
}

impl SafetensorsModel {
    /// The shard holding `t`, checked to be stored as `dtypes` (their safetensors names) with
    /// `shape`; `why` says what the shape follows from.
    fn checked(
        &self,
        t: &str,
        shape: &[usize],
        dtypes: &[&str],
        why: &str,
    ) -> Result<(&SafetensorsFile, String)> {
        let s = self.shard_of(t)?;
        let t = self.resolve(t);
        let dtype = s.stored_dtype_name(t);
        if !dtypes.contains(&dtype.as_str()) {
            return Err(Error::model(
                &s.path,
                format!(
                    "tensor {t} is stored as {dtype}, expected {}",
                    dtypes.join(" or ")
                ),
            ));
        }
        let (_, found) = s.info(t).expect("listed");
        if found != shape {
            return Err(Error::model(
                &s.path,
                format!("tensor {t} has shape {found:?}, expected {shape:?} ({why})"),
            ));
        }
        Ok((s, dtype))
    }

    /// compressed-tensors `pack-quantized` (compressed-tensors' `PackedQuantizationCompressor`,
    /// `pack_to_int32`: each value shifted by 8 into 0..15, eight inputs a word along the
    /// last dimension, input `8j + i` at bits `4i`): `weight_packed` I32 `[n, k/8]`,
    /// `weight_scale` F16/BF16 `[n, groups]` (finite, not negative), `weight_shape` I64 `[2]`
    /// holding `[n, k]`, `weight_g_idx` I32 `[k]` under act-order "group". The values come
    /// back in GPTQ's layout (`qweight [k/8, n]`, `scales [groups, n]`): the same codes
    /// transposed, which is what vLLM's `permute_param_layout_` does before the repack.
    fn read_ct_w4a16(
        &self,
        name: &str,
        fmt: Format,
        n: usize,
        k: usize,
        data: bool,
    ) -> Result<Parts> {
        // Each part under the name the file stores it with (a multimodal layout's prefix).
        let [wp, _, ws, gi] =
            Self::packed4_names_of(name, fmt).map(|t| self.resolve(&t).to_string());
        let shape_name = format!(
            "{}.weight_shape",
            name.strip_suffix(".weight").unwrap_or(name)
        );
        let shape_name = self.resolve(&shape_name).to_string();
        let s = self.shard_of(&wp).map_err(|_| {
            Error::model(
                &self.origin,
                format!(
                    "tensor {wp} is missing (config.json's quantization_config says compressed-tensors pack-quantized and implies the [{n}, {k}] linear {name})"
                ),
            )
        })?;
        if let Some(p) = fmt.layout_problem(n, k) {
            let p = p.replace(
                "quantization_config.group_size",
                "config_groups' weights.group_size",
            );
            return Err(Error::model(&s.path, format!("tensor {wp}: {p}")));
        }
        let groups = fmt.groups(k);
        let g = fmt.group(k);
        let (sw, _) = self.checked(&wp, &[n, k / PACK], &["I32"], "8 input features a word")?;
        let (ss, scale_dtype) = self.checked(
            &ws,
            &[n, groups],
            &["F16", "BF16"],
            &format!("one column per group of {g} inputs"),
        )?;
        let (sh, shape_dtype) = self.shard_of(&shape_name).map(|f| (f, f.stored_dtype_name(&shape_name))).map_err(|_| {
            Error::model(
                &s.path,
                format!("tensor {shape_name} is missing (compressed-tensors stores each packed weight's [n, k] beside it)"),
            )
        })?;
        let found: Vec<i64> = match (shape_dtype.as_str(), sh.info(&shape_name).map(|i| i.1)) {
            ("I64", Some([2])) => sh
                .raw_bytes(&shape_name)
                .unwrap_or_default()
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            ("I32", Some([2])) => sh
                .raw_bytes(&shape_name)
                .unwrap_or_default()
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
                .collect(),
            (d, shape) => {
                return Err(Error::model(
                    &sh.path,
                    format!("tensor {shape_name} is {d} {shape:?}, expected I64 [2] (the unpacked weight's [n, k])"),
                ))
            }
        };
        if found != [n as i64, k as i64] {
            return Err(Error::model(
                &sh.path,
                format!("tensor {shape_name} holds {found:?}, but config.json implies the [{n}, {k}] linear {name}"),
            ));
        }
        let g_idx_shard = match self.shard_of(&gi) {
            Ok(_) if fmt.desc_act => Some(self.checked(&gi, &[k], &["I32"], "one per input")?.0),
            Err(_) if fmt.desc_act => {
                return Err(Error::model(
                    &s.path,
                    format!("tensor {gi} is missing: config_groups' weights.actorder is \"group\", so each input's group comes from it"),
                ))
            }
            _ => None,
        };
        if !data {
            return Ok(Parts::default());
        }
        let dtype = if scale_dtype == "BF16" {
            StoredDtype::BF16
        } else {
            StoredDtype::F16
        };
        let stored_scales = floats_to_f32(dtype, ss.raw(&ws, dtype, &[n, groups])?);
        if let Some((i, bad)) = stored_scales
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite() || **v < 0.0)
        {
            return Err(Error::model(
                &ss.path,
                format!(
                    "tensor {ws}[{}, {}] is {bad}: a weight scale is finite and not negative (max |w| / 7.5)",
                    i / groups,
                    i % groups
                ),
            ));
        }
        let mut scales = vec![0f32; groups * n];
        for c in 0..n {
            for grp in 0..groups {
                scales[grp * n + c] = stored_scales[c * groups + grp];
            }
        }
        let packed = sw.raw_i32(&wp, &[n, k / PACK])?;
        let kw = k / PACK;
        let mut qweight = vec![0i32; kw * n];
        for c in 0..n {
            for j in 0..kw {
                qweight[j * n + c] = packed[c * kw + j];
            }
        }
        let g_idx = match g_idx_shard {
            Some(f) => {
                let v = f.raw_i32(&gi, &[k])?;
                if let Some((i, bad)) = v
                    .iter()
                    .enumerate()
                    .find(|(_, &x)| x < 0 || x as usize >= groups)
                {
                    return Err(Error::model(
                        &f.path,
                        format!("tensor {gi}[{i}] is {bad}, expected a group in 0..{groups}"),
                    ));
                }
                Some(v)
            }
            None => None,
        };
        Ok(Parts {
            qweight,
            qzeros: Vec::new(),
            scales,
            g_idx,
        })
    }

    fn packed4_names(name: &str) -> [String; 4] {
        let base = name.strip_suffix(".weight").unwrap_or(name);
        ["qweight", "qzeros", "scales", "g_idx"].map(|p| format!("{base}.{p}"))
    }

    /// The stored names of a packed linear's words, zeros, scales and g_idx: AutoAWQ's and
    /// AutoGPTQ's, or compressed-tensors' (`weight_packed`, `weight_zero_point`,
    /// `weight_scale`, `weight_g_idx`).
    fn packed4_names_of(name: &str, fmt: Format) -> [String; 4] {
        if !fmt.compressed_tensors {
            return Self::packed4_names(name);
        }
        let base = name.strip_suffix(".weight").unwrap_or(name);
        [
            "weight_packed",
            "weight_zero_point",
            "weight_scale",
            "weight_g_idx",
        ]
        .map(|p| format!("{base}.{p}"))
    }
}

fn scb_name(weight: &str) -> String {
    format!("{}.SCB", weight.trim_end_matches(".weight"))
}

impl WeightSource for SafetensorsModel {
    fn quantized_tower(&self) -> Option<super::weights::QuantizedTower> {
        self.quantized_tower.clone()
    }
    fn origin(&self) -> String {
        self.origin.display().to_string()
    }

    fn bnb_skipped(&self, name: &str) -> bool {
        super::checkpoint_names::bnb_weight_skipped(self.names, name, &self.bnb_skip)
    }

    fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        // A 4-bit weight read as floats: bitsandbytes' dequantize_4bit, in its dtype.
        if self.bnb4(name).is_some() {
            return Ok(self.read_bnb4(name)?.dequantize());
        }
        let s = self.shard_of(name)?;
        let name = self.resolve(name);
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

    fn packed4(&self) -> Option<Format> {
        self.stored_quant.packed4()
    }

    fn nvfp4(&self) -> Option<crate::quant::nvfp4::Flavor> {
        self.stored_quant.nvfp4()
    }

    /// compressed-tensors' `weight_packed` U8 `[n, k/2]`, `weight_scale` F8_E4M3 `[n, k/16]`,
    /// `weight_global_scale` and `input_global_scale` F32 `[1]`
    /// (`NVFP4PackedCompressor.compress_weight`); ModelOpt's `weight`, `weight_scale`, and
    /// F32 `[]` `weight_scale_2` and `input_scale`. The block scales must be finite and not
    /// negative (Marlin's S0E5M3 form drops the sign, marlin_utils_fp4.py L75-81), the global
    /// scales finite and above 0.
    fn read_nvfp4(
        &self,
        name: &str,
        n: usize,
        k: usize,
        data: bool,
    ) -> Result<crate::quant::nvfp4::Parts> {
        use crate::quant::nvfp4::{Parts, GROUP};
        let flavor = self.stored_quant.nvfp4().ok_or_else(|| {
            Error::model(
                &self.origin,
                format!("tensor {name} is not stored as NVFP4"),
            )
        })?;
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let [wn, sn, gn, inn] = flavor
            .suffixes()
            .map(|p| self.resolve(&format!("{base}.{p}")).to_string());
        if self.shard_of(&wn).is_err() {
            return Err(Error::model(
                &self.origin,
                format!(
                    "tensor {wn} is missing (the {} checkpoint implies the [{n}, {k}] linear {name})",
                    flavor.label()
                ),
            ));
        }
        if !k.is_multiple_of(GROUP) {
            return Err(Error::model(
                &self.origin,
                format!("tensor {wn}: the [{n}, {k}] linear's {k} inputs are not a multiple of NVFP4's blocks of 16"),
            ));
        }
        let (sw, _) = self.checked(&wn, &[n, k / 2], &["U8"], "two e2m1 codes a byte")?;
        let (ss, _) = self.checked(
            &sn,
            &[n, k / GROUP],
            &["F8_E4M3"],
            "one float8_e4m3fn scale per 16 inputs",
        )?;
        let scalar = flavor.scalar_shape();
        let (sg, _) = self.checked(&gn, scalar, &["F32"], "one global scale")?;
        let (si, _) = self.checked(&inn, scalar, &["F32"], "one input global scale")?;
        let f32_of = |f: &crate::model::weights::SafetensorsFile, t: &str| -> Result<f32> {
            let b = f.raw_bytes(t).unwrap_or(&[]);
            let v = f32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
            if !v.is_finite() || v <= 0.0 {
                return Err(Error::model(
                    &f.path,
                    format!("tensor {t} is {v}: a global scale must be finite and above 0"),
                ));
            }
            Ok(v)
        };
        let global = f32_of(sg, &gn)?;
        let input = f32_of(si, &inn)?;
        let scales = ss.raw_bytes(&sn).unwrap_or(&[]);
        if let Some((i, &c)) = scales
            .iter()
            .enumerate()
            .find(|(_, &c)| c & 0x80 != 0 && c != 0x80 || c & 0x7F == 0x7F)
        {
            return Err(Error::model(
                &ss.path,
                format!(
                    "tensor {sn}[{}, {}] is {}: NVFP4 block scales must be finite and not negative (Marlin's fp8 form drops the sign)",
                    i / (k / GROUP),
                    i % (k / GROUP),
                    crate::quant::fp8::decode(c)
                ),
            ));
        }
        if !data {
            return Ok(Parts::default());
        }
        Ok(Parts {
            codes: sw.raw_bytes(&wn).unwrap_or(&[]).to_vec(),
            scales: scales.to_vec(),
            globals: vec![global],
            inputs: vec![input],
        })
    }

    fn sparse24(&self) -> Option<crate::quant::sparse24::Sparse24> {
        self.stored_quant.sparse24()
    }

    /// A 2:4 linear as compressed-tensors stores it (`quant::sparse24`): the dense `weight
    /// [n, k]`, or `compressed [n, k/2]`, `bitmask [n, k/8]` U8 and `shape [2, 1]` I64
    /// holding `[n, k]`; fp8 weights with their F32 `weight_scale` (`[n, 1]` or one). Shapes,
    /// dtypes, scales and the bitmask's two-of-four are checked always; the dense form's
    /// values (more than two non-zeros in a group of four refused) when `data` is set.
    fn read_sparse24(
        &self,
        name: &str,
        n: usize,
        k: usize,
        data: bool,
    ) -> Result<crate::quant::sparse24::Parts> {
        use crate::quant::sparse24::{self, Format, Parts};
        let sc = self.stored_quant.sparse24().ok_or_else(|| {
            Error::model(
                &self.origin,
                format!("tensor {name} is not stored 2:4 sparse"),
            )
        })?;
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let fp8 = sc.fp8_channel.is_some();
        let value_dtypes: &[&str] = if fp8 {
            &["F8_E4M3"]
        } else {
            &["F16", "BF16", "F32"]
        };
        // create_weights asserts every partition a multiple of 8 for the bitmask form
        // (0.15.1 compressed_tensors_24.py L111-114); cutlass_sparse_compress asserts k is
        // (_custom_ops.py L948), cutlass_scaled_sparse_mm n and k/2 multiples of 16
        // (L984).
        if !n.is_multiple_of(16) || !k.is_multiple_of(32) {
            return Err(Error::model(
                &self.origin,
                format!("tensor {name}: a [{n}, {k}] 2:4 linear: vLLM's CUTLASS 2:4 GEMM needs the outputs a multiple of 16 and the inputs of 32 (cutlass_scaled_sparse_mm asserts bt_nzs.shape[0] % 16 == 0 and bt_nzs.shape[1] % 16 == 0, _custom_ops.py L985 at 0.15.1)"),
            ));
        }
        let floats = |t: &str, shape: &[usize], dtype: &str| -> Result<Vec<f32>> {
            if dtype == "F8_E4M3" {
                let s = self.shard_of(t)?;
                Ok(s.raw_f8_e4m3(self.resolve(t), shape)?
                    .iter()
                    .map(|&c| crate::quant::fp8::decode(c))
                    .collect())
            } else {
                self.read_f32(t, shape)
            }
        };
        let (values, origin, tname) = match sc.format {
            Format::Dense => {
                let w = self.resolve(&format!("{base}.weight")).to_string();
                let (s, dtype) =
                    self.checked(&w, &[n, k], value_dtypes, "the 2:4 weight, dense")?;
                let v = if data {
                    floats(&w, &[n, k], &dtype)?
                } else {
                    Vec::new()
                };
                (v, s.path.clone(), w)
            }
            Format::Bitmask => {
                let [sn, cn, bn] = ["shape", "compressed", "bitmask"]
                    .map(|p| self.resolve(&format!("{base}.{p}")).to_string());
                if self.shard_of(&cn).is_err() {
                    return Err(Error::model(
                        &self.origin,
                        format!("tensor {cn} is missing (the sparse-24-bitmask checkpoint implies the [{n}, {k}] linear {name})"),
                    ));
                }
                let (ss, _) = self.checked(&sn, &[2, 1], &["I64"], "the dense shape [n, k]")?;
                let b = ss.raw_bytes(self.resolve(&sn)).unwrap_or(&[]);
                let dims: Vec<i64> = b
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect();
                if dims != [n as i64, k as i64] {
                    return Err(Error::model(
                        &ss.path,
                        format!("tensor {sn} holds {dims:?}, expected [{n}, {k}] (config.json's shape of {name})"),
                    ));
                }
                let (_, dtype) = self.checked(
                    &cn,
                    &[n, k / 2],
                    value_dtypes,
                    "two kept values of every four inputs",
                )?;
                let (bs, _) = self.checked(&bn, &[n, k / 8], &["U8"], "one bit an input")?;
                let mask = bs.raw_bytes(self.resolve(&bn)).unwrap_or(&[]);
                let bad = |e: String| Error::model(&bs.path, format!("tensor {bn}: {e}"));
                let v = if data {
                    let kept = floats(&cn, &[n, k / 2], &dtype)?;
                    sparse24::decode_bitmask(&kept, mask, n, k).map_err(bad)?
                } else {
                    sparse24::check_bitmask(mask, n, k).map_err(bad)?;
                    Vec::new()
                };
                (v, bs.path.clone(), bn)
            }
        };
        if let Some((r, c)) = data
            .then(|| sparse24::first_dense_group(&values, n, k))
            .flatten()
        {
            return Err(Error::model(
                &origin,
                format!(
                    "tensor {tname}: row {r}, inputs {c}..{} hold more than two non-zeros: the weight is not 2:4 sparse",
                    c + 4
                ),
            ));
        }
        let scales = match sc.fp8_channel {
            None => Vec::new(),
            Some(true) => {
                let t = format!("{base}.weight_scale");
                self.shard_of(&t)?.fp8_channel_scales(self.resolve(&t), n)?
            }
            Some(false) => {
                let t = format!("{base}.weight_scale");
                vec![self.shard_of(&t)?.fp8_scale(self.resolve(&t))?]
            }
        };
        Ok(Parts { values, scales })
    }

    fn read_u8(&self, name: &str, shape: &[usize]) -> Result<Vec<u8>> {
        let (s, _) = self.checked(name, shape, &["U8"], "MXFP4: e2m1 pairs and e8m0 scales")?;
        let stored = self.resolve(name);
        s.raw_u8(stored)
            .map(|(_, b)| b.to_vec())
            .ok_or_else(|| Error::model(&s.path, format!("tensor {name} is not U8")))
    }

    fn raw_16bit(&self, name: &str, shape: &[usize]) -> Option<(&[u8], DType)> {
        if self.bnb4(name).is_some() {
            return None;
        }
        let s = self.shard_of(name).ok()?;
        let name = self.resolve(name);
        let (stored, dt) = match s.info(name)?.0? {
            StoredDtype::F16 => (StoredDtype::F16, DType::F16),
            StoredDtype::BF16 => (StoredDtype::BF16, DType::BF16),
            StoredDtype::F32 | StoredDtype::I8 => return None,
        };
        s.raw(name, stored, shape).ok().map(|b| (b, dt))
    }

    /// AWQ: `qweight` I32 `[k, n/8]`, `qzeros` I32 `[groups, n/8]`, `scales` F16/BF16
    /// `[groups, n]`; GPTQ: `qweight` I32 `[k/8, n]`, the same `qzeros` and `scales`, and
    /// `g_idx` I32 `[k]` (required under act-order: it gives each input's group; without it
    /// vLLM drops it unread). The shape first meets Marlin's rules (`Format::shape_problem`).
    fn read_packed4(&self, name: &str, n: usize, k: usize, data: bool) -> Result<Parts> {
        let fmt = self.stored_quant.packed4().ok_or_else(|| {
            Error::model(
                &self.origin,
                format!("tensor {name} is not stored as AWQ or GPTQ"),
            )
        })?;
        if fmt.compressed_tensors {
            return self.read_ct_w4a16(name, fmt, n, k, data);
        }
        let [qw, qz, sc, gi] = Self::packed4_names(name).map(|t| self.resolve(&t).to_string());
        let s = self.shard_of(&qw).map_err(|_| {
            Error::model(
                &self.origin,
                format!(
                    "tensor {qw} is missing (config.json's quantization_config says {} and implies the [{n}, {k}] linear {name})",
                    fmt.method.name()
                ),
            )
        })?;
        // Marlin's own rules apply to the stacked layer (the loader checks them).
        if let Some(p) = fmt.layout_problem(n, k) {
            return Err(Error::model(&s.path, format!("tensor {qw}: {p}")));
        }
        let groups = fmt.groups(k);
        let g = fmt.group(k);
        let packed_why = match fmt.method {
            Method::Awq => "8 output features a word",
            Method::Gptq => "8 input features a word",
        };
        let group_why = format!("one row per group of {g} inputs");
        let (sq, _) = self.checked(&qw, &fmt.qweight_shape(n, k), &["I32"], packed_why)?;
        let (sz, _) = self.checked(
            &qz,
            &[groups, n / PACK],
            &["I32"],
            &format!("{group_why}, 8 output features a word"),
        )?;
        let (ss, scale_dtype) = self.checked(&sc, &[groups, n], &["F16", "BF16"], &group_why)?;
        let g_idx_shard = match (fmt.method, self.shard_of(&gi)) {
            (Method::Gptq, Ok(_)) => Some(self.checked(&gi, &[k], &["I32"], "one per input")?.0),
            (Method::Gptq, Err(_)) if fmt.desc_act => {
                return Err(Error::model(
                    &s.path,
                    format!("tensor {gi} is missing: quantization_config.desc_act is true, so each input's group comes from it"),
                ))
            }
            _ => None,
        };
        if !data {
            return Ok(Parts::default());
        }
        let dtype = if scale_dtype == "BF16" {
            StoredDtype::BF16
        } else {
            StoredDtype::F16
        };
        let scales = floats_to_f32(dtype, ss.raw(&sc, dtype, &[groups, n])?);
        let g_idx = match g_idx_shard {
            Some(f) if fmt.desc_act => {
                let v = f.raw_i32(&gi, &[k])?;
                if let Some((i, bad)) = v
                    .iter()
                    .enumerate()
                    .find(|(_, &x)| x < 0 || x as usize >= groups)
                {
                    return Err(Error::model(
                        &f.path,
                        format!("tensor {gi}[{i}] is {bad}, expected a group in 0..{groups}"),
                    ));
                }
                Some(v)
            }
            _ => None,
        };
        Ok(Parts {
            qweight: sq.raw_i32(&qw, &fmt.qweight_shape(n, k))?,
            qzeros: sz.raw_i32(&qz, &[groups, n / PACK])?,
            scales,
            g_idx,
        })
    }

    fn stored_bytes(&self, name: &str) -> u64 {
        let bytes = |n: &str| {
            self.shard_of(n)
                .map_or(0, |s| s.tensor_bytes(self.resolve(n)))
        };
        if let (Some(sc), true) = (self.stored_quant.sparse24(), super::is_projection(name)) {
            let base = name.strip_suffix(".weight").unwrap_or(name);
            let parts: &[&str] = match sc.format {
                crate::quant::sparse24::Format::Dense => &["weight", "weight_scale"],
                crate::quant::sparse24::Format::Bitmask => {
                    &["shape", "compressed", "bitmask", "weight_scale"]
                }
            };
            return parts.iter().map(|p| bytes(&format!("{base}.{p}"))).sum();
        }
        if let (Some(flavor), true) = (self.stored_quant.nvfp4(), super::is_projection(name)) {
            let base = name.strip_suffix(".weight").unwrap_or(name);
            return flavor
                .suffixes()
                .iter()
                .map(|p| bytes(&format!("{base}.{p}")))
                .sum();
        }
        if let (Some(fmt), true) = (self.stored_quant.packed4(), super::is_projection(name)) {
            let mut sum: u64 = Self::packed4_names_of(name, fmt)
                .iter()
                .map(|n| bytes(n))
                .sum();
            if fmt.compressed_tensors {
                let base = name.strip_suffix(".weight").unwrap_or(name);
                sum += bytes(&format!("{base}.weight_shape"));
            }
            return sum;
        }
        if self.bnb4(name).is_some() {
            // The packed codes and every `name.*` part (absmax, maps, quant-state blob).
            let stored = self.resolve(name);
            let prefix = format!("{stored}.");
            return bytes(name)
                + self
                    .which
                    .keys()
                    .filter(|k| k.starts_with(&prefix))
                    .map(|k| bytes(k))
                    .sum::<u64>();
        }
        if self.stored_fp8().is_some() && super::is_projection(name) {
            let base = name.trim_end_matches(".weight");
            bytes(name)
                + bytes(&format!("{base}.weight_scale"))
                + bytes(&format!("{base}.input_scale"))
                + bytes(&format!("{base}.weight_scale_inv"))
        } else if self.is_int8(name) {
            bytes(name) + bytes(&scb_name(name))
        } else {
            bytes(name)
        }
    }

    fn bnb4(&self, name: &str) -> Option<Bnb4Meta> {
        self.bnb4.get(self.resolve(name)).cloned()
    }

    fn read_bnb4(&self, name: &str) -> Result<Bnb4Parts> {
        let meta = self.bnb4(name).ok_or_else(|| {
            Error::model(
                &self.origin,
                format!("tensor {name} is not stored as bitsandbytes 4-bit"),
            )
        })?;
        let stored = self.resolve(name);
        let u8s = |n: &str| -> Result<Vec<u8>> {
            let s = self.shard_of(n)?;
            s.raw_u8(n)
                .map(|(_, b)| b.to_vec())
                .ok_or_else(|| Error::model(&s.path, format!("tensor {n} is not U8")))
        };
        let f32s = |n: &str, len: usize| -> Result<Vec<f32>> {
            let s = self.shard_of(n)?;
            let shape = s.info(n).map(|(_, sh)| sh.to_vec()).unwrap_or_default();
            if shape.iter().product::<usize>() != len {
                return Err(Error::model(
                    &s.path,
                    format!("tensor {n} has shape {shape:?}, expected {len} values"),
                ));
            }
            Ok(floats_to_f32(
                StoredDtype::F32,
                s.raw(n, StoredDtype::F32, &shape)?,
            ))
        };
        let blocks = meta.blocks();
        let absmax = match meta.nested_blocksize {
            None => Absmax::F32(f32s(&format!("{stored}.absmax"), blocks)?),
            Some(nb) => Absmax::Nested {
                q: u8s(&format!("{stored}.absmax"))?,
                nested_absmax: f32s(&format!("{stored}.nested_absmax"), blocks.div_ceil(nb))?,
                nested_code: f32s(&format!("{stored}.nested_quant_map"), 256)?,
                offset: meta.offset,
                nested_blocksize: nb,
            },
        };
        Ok(Bnb4Parts {
            quant_type: meta.quant_type,
            blocksize: meta.blocksize,
            dtype: meta.dtype,
            shape: meta.shape,
            packed: u8s(stored)?,
            code: f32s(&format!("{stored}.quant_map"), 16)?,
            absmax,
        })
    }

    fn is_int8(&self, name: &str) -> bool {
        matches!(self.info(name), Some((Some(StoredDtype::I8), _)))
    }

    fn stored_fp8(&self) -> Option<StoredFp8> {
        match self.stored_quant {
            StoredQuant::Fp8(f) => Some(f),
            _ => None,
        }
    }

    fn read_fp8(&self, name: &str, shape: &[usize]) -> Result<(Vec<u8>, Vec<f32>, Option<f32>)> {
        let f = self.stored_fp8().ok_or_else(|| {
            Error::model(
                &self.origin,
                format!("tensor {name}: config.json's quantization_config is not fp8"),
            )
        })?;
        let stored = self.resolve(name);
        let codes = if f.int8 {
            self.shard_of(name)?
                .raw(stored, StoredDtype::I8, shape)?
                .to_vec()
        } else {
            self.shard_of(name)?.raw_f8_e4m3(stored, shape)?.to_vec()
        };
        let base = stored.trim_end_matches(".weight");
        let scale = |part: &str| -> Result<f32> {
            let n = format!("{base}.{part}");
            self.shard_of(&n)?.fp8_scale(&n)
        };
        let input = if f.static_activations {
            Some(scale("input_scale")?)
        } else {
            None
        };
        let weight = if f.channel {
            let n = format!("{base}.weight_scale");
            self.shard_of(&n)?.fp8_channel_scales(&n, shape[0])?
        } else {
            vec![scale("weight_scale")?]
        };
        Ok((codes, weight, input))
    }

    fn read_fp8_weight_scale(&self, name: &str) -> Result<Option<f32>> {
        let n = format!(
            "{}.weight_scale",
            self.resolve(name).trim_end_matches(".weight")
        );
        self.shard_of(&n)?.fp8_scale(&n).map(Some)
    }

    fn read_fp8_block(&self, name: &str, shape: &[usize]) -> Result<(Vec<u8>, Vec<f32>)> {
        let block = self.stored_fp8().and_then(|f| f.block).ok_or_else(|| {
            Error::model(
                &self.origin,
                format!("tensor {name}: config.json's quantization_config is not block-wise fp8"),
            )
        })?;
        let stored = self.resolve(name);
        let codes = self.shard_of(name)?.raw_f8_e4m3(stored, shape)?.to_vec();
        let n = format!("{}.weight_scale_inv", stored.trim_end_matches(".weight"));
        let s = self.shard_of(&n)?;
        let grid = block.grid(shape[0], shape[1]);
        let scales = floats_to_f32(StoredDtype::F32, s.raw(&n, StoredDtype::F32, &grid)?);
        crate::quant::fp8_block::check_block_scales(&s.path, &n, &scales)?;
        Ok((codes, scales))
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
            .raw(self.resolve(name), StoredDtype::I8, shape)?
            .iter()
            .map(|&b| b as i8)
            .collect();
        let scb_n = scb_name(self.resolve(name));
        let scb = floats_to_f32(
            StoredDtype::F32,
            self.shard_of(&scb_n)?
                .raw(&scb_n, StoredDtype::F32, &shape[..1])?,
        );
        Ok((cb, scb))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: serde_json::Value) -> Result<StoredQuant> {
        stored_quant(
            &serde_json::json!({ "quantization_config": q }),
            Path::new("m/config.json"),
        )
    }

    #[test]
    fn awq_and_gptq_configs_parse_as_vllm_reads_them() {
        let awq = parse(serde_json::json!({
            "quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": true,
            "version": "gemm", "modules_to_not_convert": null
        }));
        assert_eq!(awq.unwrap(), StoredQuant::Awq { group_size: 64 });
        let gptq = |group_size: i64, desc_act: bool| {
            parse(serde_json::json!({
                "quant_method": "gptq", "bits": 4, "group_size": group_size,
                "desc_act": desc_act, "sym": true, "checkpoint_format": "gptq"
            }))
            .unwrap()
        };
        assert_eq!(
            gptq(32, true),
            StoredQuant::Gptq {
                group_size: 32,
                desc_act: true
            }
        );
        // One group over all inputs: vLLM clears act-order (gptq_marlin.py L48-51).
        assert_eq!(
            gptq(-1, true).packed4().unwrap(),
            Format {
                method: Method::Gptq,
                group_size: -1,
                desc_act: false,
                compressed_tensors: false,
            }
        );
    }

    #[test]
    fn a_gptq_config_without_desc_act_names_the_key() {
        let e = parse(serde_json::json!({
            "quant_method": "gptq", "bits": 4, "group_size": 128, "sym": true
        }))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("m/config.json")
                && e.contains(
                    "quantization_config.desc_act is missing: vLLM's GPTQ config requires it"
                ),
            "{e}"
        );
        let e = parse(serde_json::json!({
            "quant_method": "gptq", "bits": "4", "group_size": 128, "sym": true, "desc_act": false
        }))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("quantization_config.bits is \"4\", expected an integer"),
            "{e}"
        );
    }
}

//! bitsandbytes' `llm_int8_skip_modules`: the modules a bitsandbytes checkpoint keeps in 16
//! bits (Unsloth's dynamic 4-bit checkpoints keep a few attention and MLP blocks so), and the
//! rule vLLM uses to leave them unquantized.
//!
//! vLLM reads the list from `quantization_config` (`BitsAndBytesConfig.from_config`,
//! 0.19.0 model_executor/layers/quantization/bitsandbytes.py L140-156) and gives a linear
//! layer the unquantized method when `is_layer_skipped_bnb(prefix, skip)` holds (L164,
//! L172-186): a skip entry equals one dot-separated component of the layer's prefix, or
//! equals one of its leading paths. The prefix is vLLM's module, so q/k/v are matched as
//! `qkv_proj` and gate/up as `gate_up_proj` (its `packed_modules_mapping`).

use std::path::Path;

use crate::base::error::{Error, Result};

/// `quantization_config.llm_int8_skip_modules`: absent or null is none; anything but a list
/// of strings is an error naming the key.
pub fn skip_modules(config: &serde_json::Value, path: &Path) -> Result<Vec<String>> {
    let q = &config["quantization_config"];
    match &q["llm_int8_skip_modules"] {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::Array(a) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    Error::model(
                        path,
                        format!(
                            "quantization_config.llm_int8_skip_modules holds {v}, expected module names (strings)"
                        ),
                    )
                })
            })
            .collect(),
        other => Err(Error::model(
            path,
            format!(
                "quantization_config.llm_int8_skip_modules is {other}, expected a list of module names"
            ),
        )),
    }
}

/// vLLM's module prefix of a checkpoint's linear weight: `….q_proj.weight` is a shard of
/// `….qkv_proj`, `….gate_proj.weight` of `….gate_up_proj`.
pub fn vllm_prefix(weight_name: &str) -> String {
    let module = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
    let (parent, last) = module.rsplit_once('.').unwrap_or(("", module));
    let fused = match last {
        "q_proj" | "k_proj" | "v_proj" => "qkv_proj",
        "gate_proj" | "up_proj" => "gate_up_proj",
        other => other,
    };
    if parent.is_empty() {
        fused.to_string()
    } else {
        format!("{parent}.{fused}")
    }
}

/// `is_layer_skipped_bnb` (bitsandbytes.py L172-186 at 0.19.0).
pub fn is_layer_skipped(prefix: &str, skip: &[String]) -> bool {
    if skip.is_empty() {
        return false;
    }
    let components: Vec<&str> = prefix.split('.').collect();
    let substr = skip.iter().any(|m| components.contains(&m.as_str()));
    let leading = (1..=components.len()).any(|i| {
        let p = components[..i].join(".");
        skip.contains(&p)
    });
    substr || leading
}

/// Whether the checkpoint linear `weight_name` stays 16-bit under `skip`.
pub fn weight_skipped(weight_name: &str, skip: &[String]) -> bool {
    is_layer_skipped(&vllm_prefix(weight_name), skip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn shards_are_matched_by_the_vllm_module_they_load_into() {
        assert_eq!(
            vllm_prefix("model.layers.3.self_attn.k_proj.weight"),
            "model.layers.3.self_attn.qkv_proj"
        );
        assert_eq!(
            vllm_prefix("model.layers.3.mlp.up_proj.weight"),
            "model.layers.3.mlp.gate_up_proj"
        );
        assert_eq!(
            vllm_prefix("model.layers.3.mlp.down_proj.weight"),
            "model.layers.3.mlp.down_proj"
        );
    }

    #[test]
    fn a_leading_path_or_a_whole_component_skips_a_layer() {
        let skip = list(&[
            "lm_head",
            "model.layers.0.self_attn",
            "model.layers.2.mlp.down_proj",
        ]);
        assert!(weight_skipped(
            "model.layers.0.self_attn.q_proj.weight",
            &skip
        ));
        assert!(weight_skipped(
            "model.layers.0.self_attn.o_proj.weight",
            &skip
        ));
        assert!(!weight_skipped(
            "model.layers.0.mlp.gate_proj.weight",
            &skip
        ));
        // "model.layers.1" is not a leading path of layer 10 (components, not characters).
        assert!(!weight_skipped(
            "model.layers.10.self_attn.q_proj.weight",
            &list(&["model.layers.1"])
        ));
        assert!(weight_skipped("model.layers.2.mlp.down_proj.weight", &skip));
        assert!(!weight_skipped("model.layers.2.mlp.up_proj.weight", &skip));
        // A bare component matches anywhere: "mlp" keeps every MLP in 16 bits.
        assert!(weight_skipped(
            "model.layers.7.mlp.up_proj.weight",
            &list(&["mlp"])
        ));
        // A checkpoint shard's own name is not vLLM's module: q_proj alone skips nothing.
        assert!(!weight_skipped(
            "model.layers.0.self_attn.q_proj.weight",
            &list(&["model.layers.0.self_attn.q_proj"])
        ));
        assert!(!weight_skipped(
            "model.layers.0.self_attn.q_proj.weight",
            &[]
        ));
    }

    #[test]
    fn the_list_is_read_or_refused_by_name() {
        let p = Path::new("config.json");
        let j = |v: serde_json::Value| serde_json::json!({"quantization_config": v});
        assert!(skip_modules(&j(serde_json::json!({})), p)
            .unwrap()
            .is_empty());
        assert_eq!(
            skip_modules(
                &j(serde_json::json!({"llm_int8_skip_modules": ["lm_head"]})),
                p
            )
            .unwrap(),
            list(&["lm_head"])
        );
        let e = skip_modules(
            &j(serde_json::json!({"llm_int8_skip_modules": "lm_head"})),
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("config.json") && e.contains("expected a list"),
            "{e}"
        );
        let e = skip_modules(&j(serde_json::json!({"llm_int8_skip_modules": [3]})), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds 3"), "{e}");
    }
}

//! Whether vLLM 0.19 keeps a quantized multimodal checkpoint's vision tower and projector in
//! 16 bits. Gemma 3, Mistral 3, LLaVA-NeXT and Qwen2.5-VL hand their tower the model's
//! `quant_config` (gemma3_mm.py 0.19 L515-520, mistral3.py L418-434, llava_next.py L278-295,
//! qwen2_5_vl.py L1136-1140), so each of its linear layers is quantized unless the config's
//! list of unquantized modules covers it, matched as that format matches it; Kimi-VL's and
//! Llama 4's towers get no `quant_config` (kimi_vl.py L319-327, mllama4.py L757-769).
//! vramscope models the 16-bit tower only: a layer the list leaves to be quantized is named.

use std::path::Path;

use super::config::ModelConfig;
use super::sharded::StoredQuant;
use super::weights::QuantizedTower;

/// How a format matches a layer's name against its list of unquantized modules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// `is_layer_skipped`'s full match (quant_utils.py 0.19 L437-491): AutoFP8's
    /// `ignored_layers` (fp8.py L178-182).
    Exact,
    /// `is_layer_skipped(..., skip_with_substr=True)`: AutoAWQ's `modules_to_not_convert`
    /// (awq_marlin.py L263-268), an entry anywhere in the name.
    Substring,
    /// compressed-tensors' `ignore`: the name itself or `re:` a Python regex matched at the
    /// name's start (`should_ignore_layer`, compressed_tensors/utils.py L22-70,
    /// `_is_equal_or_regex_match` L153-171).
    EqualOrRegex,
    /// ModelOpt's `exclude_modules`: a full match, a substring, or an `fnmatch` wildcard
    /// (`is_layer_excluded`, modelopt.py L145-180).
    ModelOpt,
}

/// The list a quantized checkpoint keeps its 16-bit modules in, and how vLLM reads it;
/// `None` where vLLM decides otherwise (GPTQ from the files' dtypes, gptq_marlin.py L302-323,
/// which keep a 16-bit tower 16-bit; bitsandbytes by the loader's skip list).
fn list_of(q: &serde_json::Value, sq: StoredQuant) -> Option<(String, Vec<String>, Rule)> {
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let method = q["quant_method"].as_str().unwrap_or("");
    match (method, sq) {
        (_, StoredQuant::None | StoredQuant::Gptq { .. } | StoredQuant::Mxfp4) => None,
        (_, StoredQuant::Bnb4 { .. } | StoredQuant::BnbInt8 { .. }) => None,
        ("awq", _) => Some((
            "modules_to_not_convert".into(),
            strings(&q["modules_to_not_convert"]),
            Rule::Substring,
        )),
        ("fp8", _) => {
            // `ignored_layers`, or `modules_to_not_convert` where it is absent (fp8.py L161-166).
            let key = if q["ignored_layers"].is_null() {
                "modules_to_not_convert"
            } else {
                "ignored_layers"
            };
            Some((key.into(), strings(&q[key]), Rule::Exact))
        }
        ("modelopt", _) => {
            let body = if q["quantization"].is_object() {
                &q["quantization"]
            } else {
                q
            };
            let key = if body["exclude_modules"].is_null() {
                "ignore"
            } else {
                "exclude_modules"
            };
            Some((key.into(), strings(&body[key]), Rule::ModelOpt))
        }
        _ => Some(("ignore".into(), strings(&q["ignore"]), Rule::EqualOrRegex)),
    }
}

/// The first linear layer of this multimodal checkpoint's tower or projector that vLLM 0.19
/// would quantize under its quantization config (`json`, read from `path`), as a refusal
/// naming the list and the layer; `None` when every one stays 16-bit.
pub(crate) fn quantized_tower_layer(
    json: &serde_json::Value,
    sq: StoredQuant,
    cfg: &ModelConfig,
    path: &Path,
) -> Option<QuantizedTower> {
    let names = cfg.vllm_names()?;
    let cite = if cfg.gemma3_mm.is_some() {
        "gemma3_mm.py L515-520"
    } else if cfg.mistral3.is_some() {
        "mistral3.py L418-434"
    } else if cfg.llava_next.is_some() {
        "llava_next.py L278-295"
    } else if cfg.qwen2_5_vl.is_some() {
        "qwen2_5_vl.py L1136-1140"
    } else {
        return None;
    };
    let (key, list, rule) = list_of(&json["quantization_config"], sq)?;
    // vLLM maps the list with the model's `hf_to_vllm_mapper` before matching
    // (`apply_vllm_mapper`: compressed_tensors.py L122-153, fp8.py L152-154, awq_marlin.py
    // L329-333, modelopt.py L220-239); a regex or wildcard stays as written.
    let list: Vec<String> = list
        .iter()
        .map(|e| {
            if e.starts_with("re:") || e.contains('*') {
                e.clone()
            } else {
                names.to_vllm(e)
            }
        })
        .collect();
    let layer = cfg
        .unquantized_linears()
        .into_iter()
        .skip(1)
        .map(|m| names.to_vllm(&m))
        .find(|layer| !list.iter().any(|e| skips(rule, e, layer)))?;
    Some(QuantizedTower {
        path: path.to_path_buf(),
        problem: format!(
            "quantization_config.{key} leaves the tower layer {layer} to be quantized (vLLM 0.19 hands the {} tower the quant_config, {cite}); only a tower and projector kept in 16 bits are modelled: list them as the published checkpoints do",
            names.architecture
        ),
    })
}

/// Whether the list entry `entry` keeps `layer` (vLLM's name of one linear layer) in 16 bits.
fn skips(rule: Rule, entry: &str, layer: &str) -> bool {
    match rule {
        Rule::Exact => entry == layer,
        Rule::Substring => layer.contains(entry),
        Rule::EqualOrRegex => match entry.strip_prefix("re:") {
            Some(pattern) => regex_match_at_start(pattern, layer),
            None => entry == layer,
        },
        Rule::ModelOpt => entry == layer || layer.contains(entry) || fnmatch(entry, layer),
    }
}

/// Python's `re.match(pattern, text)` for the patterns LLM Compressor recipes write: literal
/// characters, `\.` and other escapes, `.` (any character), `.*`, a final `$`. A pattern with
/// other syntax (classes, groups, alternation) matches nothing here.
fn regex_match_at_start(pattern: &str, text: &str) -> bool {
    if pattern.contains(['[', '(', '|', '+', '?', '{', '^']) {
        return false;
    }
    #[derive(Clone, Copy)]
    enum Tok {
        Any,
        AnyRun,
        Lit(char),
        End,
    }
    let mut toks = Vec::new();
    let mut it = pattern.chars().peekable();
    while let Some(c) = it.next() {
        let t = match c {
            '\\' => Tok::Lit(it.next().unwrap_or('\\')),
            '.' => Tok::Any,
            '$' => Tok::End,
            c => Tok::Lit(c),
        };
        if matches!(t, Tok::Any) && it.peek() == Some(&'*') {
            it.next();
            toks.push(Tok::AnyRun);
        } else {
            toks.push(t);
        }
    }
    fn go(toks: &[Tok], text: &[char]) -> bool {
        match toks.first() {
            None => true,
            Some(Tok::End) => text.is_empty(),
            Some(Tok::Any) => !text.is_empty() && go(&toks[1..], &text[1..]),
            Some(Tok::Lit(c)) => text.first() == Some(c) && go(&toks[1..], &text[1..]),
            Some(Tok::AnyRun) => (0..=text.len()).any(|i| go(&toks[1..], &text[i..])),
        }
    }
    let text: Vec<char> = text.chars().collect();
    go(&toks, &text)
}

/// Python's `fnmatch(name, pattern)` for `*` and `?` wildcards (posix: case kept).
fn fnmatch(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|i| go(&p[1..], &n[i..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some(c) => n.first() == Some(c) && go(&p[1..], &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_regexes_match_from_the_start_of_the_name() {
        let l = "vision_tower.vision_model.encoder.layers.0.mlp.fc1";
        assert!(regex_match_at_start("vision_tower.*", l));
        assert!(regex_match_at_start(".*vision_tower.*", l));
        assert!(regex_match_at_start(r"vision_tower\..*fc1$", l));
        assert!(!regex_match_at_start("multi_modal_projector.*", l));
        assert!(!regex_match_at_start(".*lm_head", l));
    }

    #[test]
    fn modelopt_wildcards_cover_the_root() {
        let l = "vision_tower.transformer.layers.0.attention.q_proj";
        assert!(skips(Rule::ModelOpt, "vision_tower*", l));
        assert!(skips(Rule::ModelOpt, "*transformer.layers.0*", l));
        assert!(!skips(Rule::ModelOpt, "language_model.lm_head", l));
    }

    #[test]
    fn awq_roots_match_anywhere_and_autofp8_names_whole() {
        let l = "visual.blocks.0.attn.qkv";
        assert!(skips(Rule::Substring, "visual", l));
        assert!(!skips(Rule::Exact, "visual", l));
        assert!(skips(Rule::Exact, l, l));
    }
}

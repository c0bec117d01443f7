//! V1's multimodal profile plan: the encoder cache budget and how many dummy items of the
//! maximum feature size `profile_run` encodes (0.10.0: `profile_run` itself,
//! v1/worker/gpu_model_runner.py L2342-2384, and `compute_encoder_budget`,
//! v1/core/encoder_cache_manager.py L172-254; `MultiModalBudget`, v1/worker/utils.py 0.11
//! L24-127; `compute_mm_encoder_budget`, v1/core/encoder_cache_manager.py 0.11 L292-333;
//! multimodal/encoder_budget.py 0.19), and the `vllm serve` flags that change it.

use serde::{Deserialize, Serialize};

use super::vllm::MmProfile;
use crate::base::error::{Error, Result};

/// What the encoder's profile does, for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EncoderPlan {
    /// Tokens one image counts for the budget (its placeholder's or its embeddings').
    pub tokens_per_item: u64,
    /// Embeddings one image's encoder output holds (`mm_tokens_per_image`).
    pub embeds_per_item: u64,
    /// `min(compute budget, cache size)`: the rows of each dummy output held in the encoder
    /// cache (vLLM's log line's "budget of N tokens").
    pub budget_tokens: u64,
    /// Dummy images encoded in one call ("profiled with N image items").
    pub items: u64,
    /// The dummy items' modality: "image", or "video" where V1 profiles a video
    /// (Qwen2.5-VL, `Qwen25VlShape::profile_item`).
    #[serde(default = "image_modality")]
    pub modality: String,
}

fn image_modality() -> String {
    "image".into()
}

impl EncoderPlan {
    /// vLLM's log line (gpu_model_runner.py 0.11 L3344-3351).
    pub fn log_line(&self) -> String {
        format!(
            "Encoder cache will be initialized with a budget of {} tokens, and profiled with {} {} items of the maximum feature size.",
            self.budget_tokens, self.items, self.modality
        )
    }
}

/// The images per prompt `--limit-mm-per-prompt` allows (V1's default 999, config/multimodal.py
/// 0.11 L106-114).
pub const DEFAULT_LIMIT: u64 = 999;

/// The encoder profile V1 runs for a model's images, each `(embeds, placeholder)` tokens
/// (Gemma 3's 256 and 260, Mistral 3's 3025 and 3080), or `None` when every modality is
/// limited to 0 ("All non-text modalities supported by the model have been explicitly
/// disabled via limit_mm_per_prompt. Encoder cache will not be initialized.").
/// `tokens` is `max_num_batched_tokens` (the scheduler's `max_num_encoder_input_tokens` and
/// `encoder_cache_size`, config/scheduler.py 0.11 L201-202), `seqs` `max_num_seqs`.
pub fn plan(
    (embeds, placeholder): (u64, u64),
    profile: MmProfile,
    (tokens, seqs, max_model_len): (u64, u64, u64),
    chunked_prefill: bool,
    limit: Option<u64>,
) -> Option<EncoderPlan> {
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 {
        return None;
    }
    let per_item = if profile.placeholder_tokens {
        placeholder
    } else {
        embeds
    };
    let compute = tokens.max(per_item);
    let cache = tokens.max(per_item);
    let budget = compute.min(cache);
    let (per_prompt, reqs) = if profile.items_capped_by_model_len {
        let reqs = if chunked_prefill {
            seqs
        } else {
            seqs.min(tokens / per_item)
        };
        (limit.min(max_model_len / per_item).max(1), reqs)
    } else {
        // 0.10.0: `max_num_reqs × max_mm_items_per_req` (gpu_model_runner.py L2366-2379).
        (limit, seqs)
    };
    let items = (budget / per_item).min(reqs * per_prompt).max(1);
    Some(EncoderPlan {
        tokens_per_item: per_item,
        embeds_per_item: embeds,
        budget_tokens: budget,
        items,
        modality: image_modality(),
    })
}

/// `--limit-mm-per-prompt`'s value as vLLM takes it: JSON (`{"image": 0}`, or 0.11's
/// `{"image": {"count": 0}}`) or the legacy `image=0,video=1`. Returns the images allowed
/// (`None` when the value does not name images: V1's default).
pub fn parse_limit(v: &str) -> Result<Option<u64>> {
    parse_limit_of(v, "image")
}

/// `--limit-mm-per-prompt`'s count for `modality` ("image", "video"); `None` where the value
/// does not name it.
pub fn parse_limit_of(v: &str, modality: &str) -> Result<Option<u64>> {
    let bad = |why: String| Error::Request(format!("--limit-mm-per-prompt '{v}': {why}"));
    let t = v.trim();
    let mut image = None;
    if t.starts_with('{') {
        let j: serde_json::Value =
            serde_json::from_str(t).map_err(|e| bad(format!("not JSON ({e})")))?;
        let obj = j
            .as_object()
            .ok_or_else(|| bad("expected a JSON object".into()))?;
        for (k, x) in obj {
            let n = match x {
                serde_json::Value::Number(n) => n.as_u64(),
                serde_json::Value::Object(o) => {
                    if let Some(extra) = o.keys().find(|k| k.as_str() != "count") {
                        return Err(bad(format!(
                            "'{k}.{extra}' (a dummy item's size) is not modelled; give a count"
                        )));
                    }
                    o.get("count").and_then(serde_json::Value::as_u64)
                }
                _ => None,
            }
            .ok_or_else(|| bad(format!("'{k}' needs a count of 0 or more")))?;
            if k == modality {
                image = Some(n);
            }
        }
    } else {
        for part in t.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, n) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not MODALITY=COUNT")))?;
            let n: u64 = n
                .trim()
                .parse()
                .map_err(|_| bad(format!("'{n}' is not a count")))?;
            if k.trim() == modality {
                image = Some(n);
            }
        }
    }
    Ok(image)
}

/// `--mm-processor-kwargs`: Gemma 3's processor options. `do_pan_and_scan: false` (the
/// default) is what is modelled; pan-and-scan's crops (more tokens per image, a taller dummy
/// image) and any other key are refused by name.
pub fn check_processor_kwargs(v: &str) -> Result<()> {
    let bad = |why: String| Error::Request(format!("--mm-processor-kwargs '{v}': {why}"));
    let j: serde_json::Value =
        serde_json::from_str(v.trim()).map_err(|e| bad(format!("not JSON ({e})")))?;
    let obj = j
        .as_object()
        .ok_or_else(|| bad("expected a JSON object".into()))?;
    for (k, x) in obj {
        match (k.as_str(), x) {
            // Qwen2.5-VL's image processor bounds (read where the model is one; refused by
            // name for the others, `pixel_bounds_of_kwargs`).
            ("min_pixels" | "max_pixels", serde_json::Value::Number(n))
                if n.as_u64().is_some_and(|n| n > 0) => {}
            ("size", serde_json::Value::Object(_)) => {}
            ("min_pixels" | "max_pixels", _) => {
                return Err(bad(format!("'{k}' needs a positive pixel count")))
            }
            ("do_pan_and_scan", serde_json::Value::Bool(false)) => {}
            ("do_pan_and_scan", _) => {
                return Err(bad(
                    "pan-and-scan's crops ((crops + 1) × 256 tokens an image) are not modelled"
                        .into(),
                ))
            }
            _ => return Err(bad(format!("'{k}' is not modelled"))),
        }
    }
    Ok(())
}

/// The keys of `--mm-processor-kwargs` that set an image processor's pixel bounds
/// (Qwen2.5-VL's `min_pixels`, `max_pixels`, `size`), as a JSON object; `None` when it has
/// none.
pub fn pixel_bounds_of_kwargs(v: &str) -> Option<serde_json::Value> {
    let j: serde_json::Value = serde_json::from_str(v.trim()).ok()?;
    let mut out = serde_json::Map::new();
    for k in ["min_pixels", "max_pixels", "size"] {
        if let Some(x) = j.get(k) {
            out.insert(k.into(), x.clone());
        }
    }
    (!out.is_empty()).then_some(serde_json::Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3's 256 embeddings in a 260-token placeholder.
    fn gemma3() -> (u64, u64) {
        let mm = crate::model::presets::preset("gemma-3-4b-it")
            .unwrap()
            .gemma3_mm
            .unwrap();
        (
            mm.mm_tokens_per_image as u64,
            mm.mm_tokens_per_image as u64 + 4,
        )
    }

    /// Mistral Small 3.1's 3025 embeddings (55 × 55) in a 3080-token placeholder.
    fn mistral3() -> (u64, u64) {
        let mm = crate::model::presets::preset("mistral-small-3.1-24b")
            .unwrap()
            .mistral3
            .unwrap();
        (mm.embeds_per_image() as u64, mm.placeholder_tokens() as u64)
    }

    #[test]
    fn a_pixtral_image_counts_its_breaks_where_the_release_counts_placeholders() {
        assert_eq!(mistral3(), (3025, 3080));
        // 0.11: 16384 // 3080 = 5 images; 0.19: 8192 // 3025 = 2.
        let p = plan(mistral3(), mm("0.11"), (16384, 1024, 131072), true, None).unwrap();
        assert_eq!(
            (p.budget_tokens, p.items, p.tokens_per_item),
            (16384, 5, 3080)
        );
        let p = plan(mistral3(), mm("0.19"), (8192, 1024, 131072), true, None).unwrap();
        assert_eq!(
            (p.budget_tokens, p.items, p.tokens_per_item),
            (8192, 2, 3025)
        );
        // A 2048-token batch is smaller than one image: the budget is the image.
        let p = plan(mistral3(), mm("0.19"), (2048, 256, 131072), true, None).unwrap();
        assert_eq!((p.budget_tokens, p.items), (3025, 1));
    }

    /// Qwen2.5-VL's largest image: 16384 embeddings, as many `<|image_pad|>` tokens.
    #[test]
    fn a_qwen2_5_vl_image_is_larger_than_the_batch_and_the_context() {
        let shape = crate::model::presets::preset("qwen2.5-vl-7b")
            .unwrap()
            .qwen2_5_vl
            .unwrap();
        let item = (shape.embeds_per_image(), shape.embeds_per_image());
        assert_eq!(item, (16384, 16384));
        // 0.19, 8192 batched tokens, --max-model-len 8192: the budget is the image, one item
        // (8192 // 16384 = 0 images a prompt, raised to 1).
        let p = plan(item, mm("0.19"), (8192, 1024, 8192), true, None).unwrap();
        assert_eq!(
            (p.budget_tokens, p.items, p.tokens_per_item),
            (16384, 1, 16384)
        );
        // 0.11 finds the same image another way (`smart_resize` of a 9999999² image down to
        // max_pixels: 3584², qwen2_vl.py 0.11 L956-963); its 16384-token batch holds one.
        let p = plan(item, mm("0.11"), (16384, 1024, 8192), true, None).unwrap();
        assert_eq!((p.budget_tokens, p.items), (16384, 1));
    }

    fn mm(release: &str) -> MmProfile {
        crate::profile::vllm::release(release).unwrap().mm.unwrap()
    }

    #[test]
    fn the_budget_is_the_batch_and_the_items_what_fits_in_it() {
        // 0.11 counts the 260-token placeholder: 16384 // 260 = 63 images.
        let p = plan(gemma3(), mm("0.11"), (16384, 1024, 131072), true, None).unwrap();
        assert_eq!(
            (p.budget_tokens, p.items, p.tokens_per_item),
            (16384, 63, 260)
        );
        // 0.19 counts the 256 embeddings: 8192 // 256 = 32.
        let p = plan(gemma3(), mm("0.19"), (8192, 1024, 131072), true, None).unwrap();
        assert_eq!((p.budget_tokens, p.items), (8192, 32));
        assert_eq!(
            p.log_line(),
            "Encoder cache will be initialized with a budget of 8192 tokens, and profiled with 32 image items of the maximum feature size."
        );
        // A batch smaller than one image: the budget is one image, one item.
        let p = plan(gemma3(), mm("0.19"), (128, 4, 131072), true, None).unwrap();
        assert_eq!((p.budget_tokens, p.items), (256, 1));
        // Two requests of 2 images each bound the items below the budget's 32.
        let p = plan(gemma3(), mm("0.19"), (8192, 2, 131072), true, Some(2)).unwrap();
        assert_eq!(p.items, 4);
        assert!(plan(gemma3(), mm("0.19"), (8192, 2, 131072), true, Some(0)).is_none());
        // 0.10.0 counts the 256 embeddings too: 16384 // 256 = 64 images (Q10's batch).
        let p = plan(gemma3(), mm("0.10"), (16384, 1024, 131072), true, None).unwrap();
        assert_eq!(
            (p.budget_tokens, p.items, p.tokens_per_item),
            (16384, 64, 256)
        );
        // A 512-token context holds 2 images a prompt from 0.11 on; 0.10.0 does not cap
        // the prompt's 999 by it.
        let p = plan(gemma3(), mm("0.19"), (8192, 1, 512), true, None).unwrap();
        assert_eq!(p.items, 2);
        let p = plan(gemma3(), mm("0.10"), (8192, 1, 512), true, None).unwrap();
        assert_eq!(p.items, 32);
    }

    #[test]
    fn limits_parse_as_vllm_takes_them() {
        assert_eq!(parse_limit(r#"{"image":0}"#).unwrap(), Some(0));
        assert_eq!(parse_limit(r#"{"image": {"count": 3}}"#).unwrap(), Some(3));
        assert_eq!(parse_limit("image=2,video=1").unwrap(), Some(2));
        assert_eq!(parse_limit_of("image=2,video=1", "video").unwrap(), Some(1));
        assert_eq!(parse_limit_of(r#"{"image":0}"#, "video").unwrap(), None);
        assert_eq!(parse_limit(r#"{"video":1}"#).unwrap(), None);
        let e = parse_limit(r#"{"image": {"count": 1, "width": 512}}"#).unwrap_err();
        assert!(e.to_string().contains("image.width"), "{e}");
        assert!(parse_limit("image").is_err());
        check_processor_kwargs(r#"{"do_pan_and_scan": false}"#).unwrap();
        check_processor_kwargs(r#"{"max_pixels": 1003520}"#).unwrap();
        let e = check_processor_kwargs(r#"{"max_pixels": -1}"#).unwrap_err();
        assert!(
            e.to_string().contains("'max_pixels' needs a positive"),
            "{e}"
        );
        assert_eq!(
            pixel_bounds_of_kwargs(r#"{"max_pixels": 1003520, "fps": 1}"#),
            Some(serde_json::json!({"max_pixels": 1003520}))
        );
        assert_eq!(
            pixel_bounds_of_kwargs(r#"{"do_pan_and_scan": false}"#),
            None
        );
        let e = check_processor_kwargs(r#"{"do_pan_and_scan": true}"#).unwrap_err();
        assert!(e.to_string().contains("pan-and-scan"), "{e}");
    }
}

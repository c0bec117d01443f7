//! A multimodal checkpoint's tensor names as vLLM 0.19 reads them. Hugging Face checkpoints
//! come in two layouts: transformers before 4.52 saved `language_model.model.*`,
//! `language_model.lm_head.weight`, `vision_tower.*` and `multi_modal_projector.*`;
//! 4.52 and later save `model.language_model.*`, `model.vision_tower.*`,
//! `model.multi_modal_projector.*` and `lm_head.weight`. vLLM renames each stored name with
//! the model's `hf_to_vllm_mapper` into its own module's names and loads those; vramscope's
//! config names the language model's tensors as a `ForCausalLM` does (`model.*`,
//! `lm_head.*`), the tower's and projector's as vLLM does.

use super::config::ModelConfig;

/// Where vLLM's multimodal module keeps its `ForCausalLM` (`self.language_model`).
const LANGUAGE_MODEL: &str = "language_model.";

/// Substrings of tensors `AutoWeightsLoader` drops before loading anything
/// (`ROTARY_EMBEDS_UNUSED_WEIGHTS`, utils.py 0.19 L135-140, L159).
pub(crate) const ROTARY_UNUSED: [&str; 4] = [
    "rotary_pos_emb.inv_freq",
    "rotary_emb.inv_freq",
    "rotary_emb.cos_cached",
    "rotary_emb.sin_cached",
];

/// How one family's checkpoint names reach vLLM's parameters.
#[derive(Debug)]
pub(crate) struct VllmNames {
    /// The architecture, for messages.
    pub architecture: &'static str,
    /// `hf_to_vllm_mapper`'s `orig_to_new_prefix`, in order: `WeightsMapper._map_name`
    /// (utils.py 0.19 L77-82) tries each in turn on the name the ones before left.
    pub hf_to_vllm: &'static [(&'static str, &'static str)],
    /// Whether vramscope's config keeps vLLM's `language_model.` in the language model's
    /// names (Llama 4's does; the others name it as a `ForCausalLM` at the top).
    pub keeps_language_model: bool,
    /// What `gen-model` puts before the language model's config names (`model.*`,
    /// `lm_head.*`) to store them as the family's published checkpoints do; the tower's and
    /// the projector's config names are already theirs.
    pub published_text_root: &'static str,
}

/// Gemma 3 (gemma3_mm.py 0.19 L484-492; `load_weights` hands the renamed tensors to
/// `AutoWeightsLoader`, L634-636).
const GEMMA3: VllmNames = VllmNames {
    architecture: "Gemma3ForConditionalGeneration",
    hf_to_vllm: &[
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("lm_head.", "language_model.lm_head."),
    ],
    keeps_language_model: false,
    // google/gemma-3-4b-it, -12b-it, -27b-it (saved by transformers 4.50, before 4.52's
    // `model.` wrapper): `language_model.model.*` (no lm_head: tied), `vision_tower.*`,
    // `multi_modal_projector.*`, vLLM's own names, which the mapper leaves as they are.
    published_text_root: "language_model.",
};

/// Mistral 3 (mistral3.py 0.19 L375-386, L560-562): 4.52's names, and `model.*` at the top
/// as the language model's (PEFT's text-only saves).
const MISTRAL3: VllmNames = VllmNames {
    architecture: "Mistral3ForConditionalGeneration",
    hf_to_vllm: &[
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("lm_head.", "language_model.lm_head."),
        ("model.", "language_model.model."),
    ],
    keeps_language_model: false,
    // mistralai/Mistral-Small-3.1-24B-Instruct-2503: `language_model.model.*`,
    // `language_model.lm_head.weight`, `vision_tower.*`, `multi_modal_projector.*` (the bare
    // `model.` the mapper also reads is a PEFT LoRA's, mistral3.py 0.19 L382-384).
    published_text_root: "language_model.",
};

/// LLaVA-NeXT (llava_next.py 0.19 L228-237, L584-586), `image_newline` too.
const LLAVA_NEXT: VllmNames = VllmNames {
    architecture: "LlavaNextForConditionalGeneration",
    hf_to_vllm: &[
        ("model.language_model.", "language_model.model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.image_newline", "image_newline"),
        ("lm_head.", "language_model.lm_head."),
    ],
    keeps_language_model: false,
    // llava-hf/llava-v1.6-* and ibm-granite/granite-vision-3.2-2b: `language_model.model.*`
    // (and `language_model.lm_head.weight` where untied), `vision_tower.*`,
    // `multi_modal_projector.*`, `image_newline`; the mapper reads no bare `model.`.
    published_text_root: "language_model.",
};

/// Qwen2.5-VL (qwen2_5_vl.py 0.19 L1021-1030, L1486-1488): the original checkpoints'
/// `model.*`, `visual.*` and `lm_head.weight`, and 4.52's `model.language_model.*` and
/// `model.visual.*`.
const QWEN2_5_VL: VllmNames = VllmNames {
    architecture: "Qwen2_5_VLForConditionalGeneration",
    hf_to_vllm: &[
        ("model.language_model.", "language_model.model."),
        ("model.visual.", "visual."),
        ("lm_head.", "language_model.lm_head."),
        ("model.", "language_model.model."),
    ],
    keeps_language_model: false,
    // Qwen/Qwen2.5-VL-*-Instruct: `model.*`, `visual.*`, `lm_head.weight` (the "original
    // checkpoint" the mapper names, qwen2_5_vl.py 0.19 L1026-1028), the config's own names.
    published_text_root: "",
};

/// Kimi-VL: no mapper; `AutoWeightsLoader` by module name (kimi_vl.py 0.19 L414-416).
const KIMI_VL: VllmNames = VllmNames {
    architecture: "KimiVLForConditionalGeneration",
    hf_to_vllm: &[],
    keeps_language_model: false,
    // moonshotai/Kimi-VL-A3B-Instruct: `language_model.model.*`,
    // `language_model.lm_head.weight`, `vision_tower.*`, `multi_modal_projector.*`; without a
    // mapper a top-level `model.*` names no child of the module (utils.py 0.19 L330-339).
    published_text_root: "language_model.",
};

/// Llama 4: no `hf_to_vllm_mapper`; `_rename_weight_for_modelopt_checkpoint` (mllama4.py 0.19
/// L937-979, called from L981-1001) moves a top-level `model.*` and `lm_head.weight` (ModelOpt's
/// saves) under `language_model.`; `vision_model.*` and `multi_modal_projector.*` are looked
/// up as they are (L1040-1070). transformers saves `Llama4ForConditionalGeneration` with
/// `language_model.*` in every release (no `model.` wrapper), so 4.52's layout never arises.
const LLAMA4: VllmNames = VllmNames {
    architecture: "Llama4ForConditionalGeneration",
    hf_to_vllm: &[
        ("model.", "language_model.model."),
        ("lm_head.weight", "language_model.lm_head.weight"),
    ],
    keeps_language_model: true,
    // meta-llama/Llama-4-Scout-17B-16E-Instruct: `language_model.*`, `vision_model.*`,
    // `multi_modal_projector.*`, the config's own names.
    published_text_root: "",
};

impl VllmNames {
    /// The name vLLM loads a stored tensor as (`WeightsMapper._map_name`'s prefix pass).
    pub fn to_vllm(&self, stored: &str) -> String {
        let mut name = stored.to_string();
        for (from, to) in self.hf_to_vllm {
            if let Some(rest) = name.strip_prefix(from) {
                name = format!("{to}{rest}");
            }
        }
        name
    }

    /// vramscope's config name for a tensor vLLM loads as `vllm`; `None` for one vLLM's
    /// module has no place for (a `model.*` or `lm_head.*` left at the top, where the module
    /// holds `language_model`, `vision_tower` and the projector).
    pub fn config_name(&self, vllm: &str) -> Option<String> {
        if self.keeps_language_model {
            return Some(vllm.to_string());
        }
        match vllm.strip_prefix(LANGUAGE_MODEL) {
            Some(text) => Some(text.to_string()),
            None if is_text(vllm) => None,
            None => Some(vllm.to_string()),
        }
    }

    /// vLLM's name for a config name.
    pub fn vllm_of_config(&self, name: &str) -> String {
        if !self.keeps_language_model && is_text(name) {
            return format!("{LANGUAGE_MODEL}{name}");
        }
        name.to_string()
    }

    /// The stored names vLLM would load as `vllm`, each with the prefix that marks its
    /// layout in a file: the mapper's sources first, in its order, then vLLM's own name (its
    /// module, or `language_model.`'s child).
    pub fn stored_candidates(&self, vllm: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (from, to) in self.hf_to_vllm {
            if let Some(rest) = vllm.strip_prefix(to) {
                let stored = format!("{from}{rest}");
                if self.to_vllm(&stored) == vllm && out.iter().all(|(s, _)| *s != stored) {
                    out.push((stored, from.to_string()));
                }
            }
        }
        let parts = if vllm.starts_with(LANGUAGE_MODEL) {
            2
        } else {
            1
        };
        let root: Vec<&str> = vllm.splitn(parts + 1, '.').take(parts).collect();
        out.push((vllm.to_string(), format!("{}.", root.join("."))));
        out
    }

    /// The name `gen-model` stores a config name under: the family's published layout.
    pub fn published_name(&self, config: &str) -> String {
        if self.keeps_language_model || !is_text(config) {
            return config.to_string();
        }
        format!("{}{config}", self.published_text_root)
    }

    /// The config name of a name `published_name` gave.
    pub fn unpublished_name<'a>(&self, stored: &'a str) -> &'a str {
        match stored.strip_prefix(self.published_text_root) {
            Some(text) if !self.keeps_language_model && is_text(text) => text,
            _ => stored,
        }
    }

    /// Whether a stored name's vLLM name falls in the language model's body
    /// (`language_model.model.*`): the mark of a file in a layout vLLM reads. An
    /// `lm_head.weight` alone is not one: `gen-model` before the published layouts wrote it
    /// beside a top-level `model.*`, which still loads.
    pub fn in_language_model_body(&self, stored: &str) -> bool {
        self.to_vllm(stored)
            .strip_prefix(LANGUAGE_MODEL)
            .is_some_and(|t| t.starts_with("model."))
    }
}

/// The roots of a multimodal checkpoint's modules outside its language model, as the
/// mappers above name them (`vision_tower.`, `multi_modal_projector.`, `image_newline`,
/// `visual.`) and Llama 4 stores them (`vision_model.`, mllama4.py 0.19 L1040-1070).
const NON_TEXT_ROOTS: [&str; 5] = [
    "vision_tower",
    "multi_modal_projector",
    "image_newline",
    "visual",
    "vision_model",
];

/// Whether an entry of a quantization config's list of unquantized modules (`ignore`,
/// `ignored_layers`, `exclude_modules`, `modules_to_not_convert`) names the lm_head or a
/// module outside a multimodal model's language model: in the published layout
/// (`vision_tower.…`), 4.52's (`model.vision_tower.…`, which vLLM's quantization configs map
/// with the model's `hf_to_vllm_mapper` before matching: `apply_vllm_mapper`,
/// compressed_tensors.py 0.19 L122-153, fp8.py L152-154, awq_marlin.py L329-333, modelopt.py
/// L220-239), or as a compressed-tensors regex over either (`re:vision_tower.*`,
/// `re:.*lm_head`). Such an entry leaves no decoder layer in 16 bits.
pub(crate) fn names_lm_head_or_tower(entry: &str) -> bool {
    let name = entry.strip_prefix("re:").unwrap_or(entry);
    let name = name.strip_prefix(".*").unwrap_or(name);
    let name = name.strip_prefix("model.").unwrap_or(name);
    let root = name.split(['.', '*', '$']).next().unwrap_or("");
    name.trim_end_matches(['$', '*']).ends_with("lm_head") || NON_TEXT_ROOTS.contains(&root)
}

/// Whether a tower or projector tensor is an `nn.Linear`'s weight: a 2-D `….weight`, not an
/// embedding table (`position_embedding`) and not the `out_proj` of SigLIP's pooling head,
/// torch's `NonDynamicallyQuantizableLinear` inside `nn.MultiheadAttention`, a class LLM
/// Compressor's `Linear` target does not name (vLLM drops that head, siglip.py 0.19
/// L918-921). Convolutions (4-D, 5-D), norms (1-D) and bare parameters
/// (`mm_input_projection_weight`, `positional_embedding_vlm`) are not linear layers.
fn is_tower_linear(name: &str, shape: &[usize]) -> bool {
    let Some(module) = name.strip_suffix(".weight") else {
        return false;
    };
    shape.len() == 2
        && !module.ends_with("embedding")
        && !module.ends_with("head.attention.out_proj")
}

/// Whether a name is a `ForCausalLM`'s (its two children).
pub(crate) fn is_text(name: &str) -> bool {
    name.starts_with("model.") || name.starts_with("lm_head.")
}

impl ModelConfig {
    /// How vLLM 0.19 names this multimodal checkpoint's tensors; `None` for a text model.
    pub(crate) fn vllm_names(&self) -> Option<&'static VllmNames> {
        if self.gemma3_mm.is_some() {
            Some(&GEMMA3)
        } else if self.mistral3.is_some() {
            Some(&MISTRAL3)
        } else if self.llava_next.is_some() {
            Some(&LLAVA_NEXT)
        } else if self.qwen2_5_vl.is_some() {
            Some(&QWEN2_5_VL)
        } else if self.kimi_vl.is_some() {
            Some(&KIMI_VL)
        } else if self.llama4.as_ref().is_some_and(|l| l.vision.is_some()) {
            Some(&LLAMA4)
        } else {
            None
        }
    }

    /// The linear layers a quantizer leaves in 16 bits, named as this model's checkpoint
    /// names its modules (`published_name`): the lm_head, and in a multimodal model every
    /// linear layer of the tower and the projector. LLM Compressor writes this list as
    /// `ignore` (compressed-tensors 0.10.2 quant_config.py L178-218: every module of a
    /// quantized type left unquantized, by its full name) and AutoFP8 as `ignored_layers`
    /// (ModelOpt names the tower by its roots: `modelopt_excluded`). vLLM 0.19 hands the tower and projector its `quant_config` (gemma3_mm.py L515-520,
    /// mistral3.py L418-434, llava_next.py L278-295, qwen2_5_vl.py L1136-1140; Kimi-VL's and
    /// Llama 4's get none, kimi_vl.py L319-327, mllama4.py L757-769): a linear layer left off
    /// the list would be read as quantized.
    pub(crate) fn unquantized_linears(&self) -> Vec<String> {
        let Some(names) = self.vllm_names() else {
            return vec!["lm_head".to_string()];
        };
        let lm_head = if names.keeps_language_model {
            "language_model.lm_head.weight"
        } else {
            "lm_head.weight"
        };
        let mut out = vec![names.published_name(lm_head)];
        out.extend(
            self.tensor_shapes()
                .into_iter()
                .filter(|(name, shape)| {
                    !is_text(name.strip_prefix(LANGUAGE_MODEL).unwrap_or(name))
                        && is_tower_linear(name, shape)
                })
                .map(|(name, _)| names.published_name(&name)),
        );
        out.iter()
            .map(|n| n.trim_end_matches(".weight").to_string())
            .collect()
    }

    /// The top-level modules of a multimodal checkpoint that hold the linear layers
    /// `unquantized_linears` names besides the lm_head (`vision_tower`,
    /// `multi_modal_projector`; Qwen2.5-VL's `visual`): what AutoAWQ's
    /// `modules_to_not_convert` and a bitsandbytes `llm_int8_skip_modules` name to keep a
    /// tower in 16 bits (vLLM matches them as a substring, quant_utils.py 0.19 L447-449, or a
    /// whole component, bitsandbytes.py L172-186) and ModelOpt as `root*` ("the Nvidia
    /// ModelOpt library use just one wildcard pattern: module_path*", modelopt.py 0.19
    /// L220-239). Empty for a text model.
    pub(crate) fn tower_roots(&self) -> Vec<String> {
        let mut roots: Vec<String> = Vec::new();
        if self.vllm_names().is_none() {
            return roots;
        }
        for m in self.unquantized_linears().iter().skip(1) {
            let root = m.split('.').next().unwrap_or(m).to_string();
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
        roots
    }

    /// ModelOpt's `exclude_modules` for this model: the lm_head by its full name and each
    /// tower root as `root*` (`tower_roots`).
    pub(crate) fn modelopt_excluded(&self) -> Vec<String> {
        let lm_head = self.unquantized_linears().swap_remove(0);
        std::iter::once(lm_head)
            .chain(self.tower_roots().into_iter().map(|r| format!("{r}*")))
            .collect()
    }

    /// Whether vLLM 0.19 passes over a stored tensor the multimodal module has no parameter
    /// for rather than refusing the checkpoint (`config`: its config name where it has one):
    /// the unused rotary buffers anywhere (`AutoWeightsLoader`, utils.py L135-140, L159); in
    /// the language model a bias with no parameter (GPTQ's: llama.py L481-482 and L493-494,
    /// qwen2.py L492-493 and L510-511, gemma3.py L426-427 and L436-437, granite.py L354-355
    /// and L367-368; Llama 4's looks every other tensor up, llama4.py L641 and L719, but for
    /// its experts', L479-483) and, where the embeddings are tied, `lm_head.*`
    /// (`skip_prefixes`, llama.py L592, qwen2.py L598, gemma3.py L518, granite.py L469,
    /// llama4.py L818); SigLIP's pooling head where the tower has none (siglip.py L918-921).
    /// Kimi-VL's language model skips more (`kimi_vl_loader_skips`). Anything else vLLM
    /// refuses: `AutoWeightsLoader` names a tensor no module holds (utils.py L330-339), and
    /// Llama 4 looks the tower's up in its parameters (mllama4.py L1040-1070).
    pub(crate) fn multimodal_loader_skips(&self, stored: &str, config: Option<&str>) -> bool {
        if self.kimi_vl.is_some() {
            let text = config.filter(|c| is_text(c));
            return self.kimi_vl_loader_skips(stored, text);
        }
        if ROTARY_UNUSED.iter().any(|u| stored.contains(u)) {
            return true;
        }
        let Some(config) = config else {
            return false;
        };
        let text = config.strip_prefix(LANGUAGE_MODEL).unwrap_or(config);
        if is_text(text) {
            let bias = text.ends_with(".bias") || text.ends_with("_bias");
            return (bias && self.llama4.is_none())
                || (self.tie_word_embeddings && text.starts_with("lm_head."));
        }
        self.gemma3_mm.is_some()
            && config.starts_with(&format!("{}.head.", super::config::gemma3_mm::TOWER))
    }
}

/// `quant::bnb_skip::weight_skipped` for a weight vramscope's config names `config_name`: a multimodal model's
/// language model is matched under vLLM's module name (`language_model.model.…`), as vLLM
/// 0.19 matches the list as written, mapping none of it (bitsandbytes.py has no
/// `apply_vllm_mapper`; `is_layer_skipped_bnb`, L172-186).
pub(crate) fn bnb_weight_skipped(
    names: Option<&VllmNames>,
    config_name: &str,
    skip: &[String],
) -> bool {
    match names {
        Some(n) => crate::quant::bnb_skip::weight_skipped(&n.vllm_of_config(config_name), skip),
        None => crate::quant::bnb_skip::weight_skipped(config_name, skip),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each layout's names land where vLLM's mapper puts them: 4.52's and the older ones on
    /// the same config names, a `model.*` left at the top nowhere where vLLM maps none.
    #[test]
    fn both_layouts_reach_the_config_names() {
        let g = &GEMMA3;
        let cfg = |s: &str| g.config_name(&g.to_vllm(s));
        for (stored, want) in [
            (
                "model.language_model.norm.weight",
                Some("model.norm.weight"),
            ),
            (
                "language_model.model.norm.weight",
                Some("model.norm.weight"),
            ),
            ("lm_head.weight", Some("lm_head.weight")),
            ("language_model.lm_head.weight", Some("lm_head.weight")),
            (
                "model.vision_tower.vision_model.post_layernorm.bias",
                Some("vision_tower.vision_model.post_layernorm.bias"),
            ),
            ("model.norm.weight", None),
        ] {
            assert_eq!(cfg(stored).as_deref(), want, "{stored}");
        }
        let m = &MISTRAL3;
        assert_eq!(
            m.to_vllm("model.norm.weight"),
            "language_model.model.norm.weight"
        );
        assert_eq!(
            m.to_vllm("model.language_model.norm.weight"),
            "language_model.model.norm.weight"
        );
        let l = &LLAMA4;
        assert_eq!(
            l.config_name(&l.to_vllm("model.layers.0.feed_forward.router.weight")),
            Some("language_model.model.layers.0.feed_forward.router.weight".into())
        );
        assert_eq!(
            l.to_vllm("model.language_model.norm.weight"),
            "language_model.model.language_model.norm.weight"
        );
    }

    /// `gen-model`'s names are vLLM's own where the family publishes them so (no top-level
    /// `model.*` its mapper would leave unmapped), the config's for Qwen2.5-VL and Llama 4,
    /// and each maps back to its config name.
    #[test]
    fn gen_model_names_are_the_published_ones() {
        for (family, config, stored) in [
            (
                &GEMMA3,
                "model.layers.0.mlp.up_proj.weight",
                "language_model.model.layers.0.mlp.up_proj.weight",
            ),
            (&MISTRAL3, "lm_head.weight", "language_model.lm_head.weight"),
            (&LLAVA_NEXT, "image_newline", "image_newline"),
            (
                &KIMI_VL,
                "model.norm.weight",
                "language_model.model.norm.weight",
            ),
            (&QWEN2_5_VL, "model.norm.weight", "model.norm.weight"),
            (
                &QWEN2_5_VL,
                "visual.merger.ln_q.weight",
                "visual.merger.ln_q.weight",
            ),
            (
                &LLAMA4,
                "language_model.lm_head.weight",
                "language_model.lm_head.weight",
            ),
            (
                &GEMMA3,
                "vision_tower.vision_model.post_layernorm.bias",
                "vision_tower.vision_model.post_layernorm.bias",
            ),
        ] {
            assert_eq!(
                family.published_name(config),
                stored,
                "{}",
                family.architecture
            );
            assert_eq!(family.unpublished_name(stored), config);
            let vllm = family.to_vllm(stored);
            assert_eq!(family.config_name(&vllm).as_deref(), Some(config));
        }
    }

    /// The names a missing tensor may be stored under, the mapper's sources before vLLM's own.
    #[test]
    fn a_config_name_has_each_layouts_stored_name() {
        let q = &QWEN2_5_VL;
        let names = |c: &str| -> Vec<String> {
            q.stored_candidates(&q.vllm_of_config(c))
                .into_iter()
                .map(|(s, _)| s)
                .collect()
        };
        assert_eq!(
            names("model.norm.weight"),
            [
                "model.language_model.norm.weight",
                "model.norm.weight",
                "language_model.model.norm.weight"
            ]
        );
        assert_eq!(
            names("visual.merger.ln_q.weight"),
            [
                "model.visual.merger.ln_q.weight",
                "visual.merger.ln_q.weight"
            ]
        );
        let roots: Vec<String> = q
            .stored_candidates("language_model.lm_head.weight")
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        assert_eq!(roots, ["lm_head.", "language_model.lm_head."]);
    }
}

//! Kimi-VL's multimodal checkpoint (`model_type` kimi_vl: `KimiVLForConditionalGeneration`,
//! moonshotai/Kimi-VL-A3B-Instruct, -Thinking, -Thinking-2506): its `text_config` is a
//! DeepSeek-V3-shaped language model (Moonlight: MLA and MoE, read by the deepseek_v3 path),
//! its `vision_config` the MoonViT tower, and `multi_modal_projector` maps each 2 × 2 group of
//! the tower's patches to the language model's width. Read as vLLM 0.19.0 builds it
//! (model_executor/models/kimi_vl.py, moonvit.py; transformers_utils/configs/kimi_vl.py,
//! moonvit.py; transformers has no Kimi-VL):
//!
//! - the tower (`MoonVitPretrainedModel`, moonvit.py 0.19 L533-589): a patch embedding
//!   (`Conv2dLayer` with bias, kernel = stride = `patch_size`), a learnable `[64, 64, D]`
//!   position embedding interpolated bicubically to each image's grid
//!   (`Learnable2DInterpPosEmb`, L99-130), `num_hidden_layers` pre-norm blocks (LayerNorm,
//!   fused `wqkv` with bias, 2D rotary on q and k, packed attention per image, `wo`; LayerNorm,
//!   `fc0`, GELU-tanh, `fc1`; L338-454), `final_layernorm` (L479), the 2 × 2 patch merge
//!   (`patch_merger`, L504-530);
//! - the tower's linears split over tensor-parallel ranks (`wqkv` QKVParallelLinear, `wo`
//!   RowParallelLinear, `fc0` ColumnParallelLinear, `fc1` RowParallelLinear, L315-382); the
//!   patch embedding, position embedding and norms whole on every rank;
//! - the projector (`KimiVLMultiModalProjector`, kimi_vl.py 0.19 L94-129): `pre_norm`
//!   (LayerNorm of the tower's width, eps 1e-5), the `[N, 4 · D]` view, `linear_1` (4D → 4D),
//!   GELU (exact), `linear_2` (4D → text hidden), both `ReplicatedLinear` with bias: whole on
//!   every rank;
//! - an image of `W × H` pixels counts `get_num_image_tokens` (kimi_vl.py 0.19 L163-198):
//!   scaled down to `in_token_limit` patches where it has more, padded to whole 2 × 2 groups of
//!   patches; the dummy image is 1024 × 1024 (`MaxImageTokenMeta`, L87-91).

use serde::{Deserialize, Serialize};

use super::{count_or, ModelConfig};

/// MoonViT's shape (`MoonViTConfig`, transformers_utils/configs/moonvit.py 0.19 L8-33, whose
/// defaults are Kimi-VL-A3B's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoonVitShape {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub patch_size: usize,
    /// `init_pos_emb_height` × `init_pos_emb_width`: the learnable position grid.
    pub pos_emb_height: usize,
    pub pos_emb_width: usize,
    /// `merge_kernel_size` (height, width): patches merged into one token.
    pub merge_kernel: (usize, usize),
}

impl MoonVitShape {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Patches one token merges (4 for 2 × 2).
    pub fn merge_unit(&self) -> usize {
        self.merge_kernel.0 * self.merge_kernel.1
    }

    /// The projector's width: the tower's times the merged patches (4608 for Kimi-VL-A3B).
    pub fn projector_width(&self) -> usize {
        self.hidden_size * self.merge_unit()
    }
}

/// What a `KimiVLForConditionalGeneration` adds to its language model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KimiVlShape {
    pub vision: MoonVitShape,
    /// The `<|media_pad|>` token (`media_placeholder_token_id`, 163605 by default,
    /// configs/kimi_vl.py 0.19 L19).
    pub media_placeholder_token_id: usize,
    /// The image processor's `in_token_limit` (preprocessor_config.json): the patches an image
    /// may have before it is scaled down. 4096 for Kimi-VL-A3B-Instruct and -Thinking (0.8
    /// million pixels), 16384 for -Thinking-2506 (3.2 million).
    pub in_token_limit: usize,
}

/// Where the tower's and projector's tensors sit in the checkpoint (vLLM loads them by these
/// names, `AutoWeightsLoader`, kimi_vl.py 0.19 L414-416).
pub const TOWER: &str = "vision_tower";
pub const PROJECTOR: &str = "multi_modal_projector";

/// The dummy image's side (`MaxImageTokenMeta`, kimi_vl.py 0.19 L87-91).
pub const DUMMY_IMAGE_SIDE: usize = 1024;

/// The published preprocessor_config.json's `in_token_limit` of Kimi-VL-A3B-Instruct.
pub const IN_TOKEN_LIMIT: usize = 4096;

impl KimiVlShape {
    /// The processor's image of `w × h` pixels as patches `(rows, cols)`: scaled down by
    /// `sqrt(in_token_limit / patches)` where `(w // p) · (h // p)` exceeds the limit
    /// (`int(w · scale)`), then padded to whole merge groups (`get_num_image_tokens`,
    /// kimi_vl.py 0.19 L179-197).
    pub fn patch_grid(&self, w: usize, h: usize) -> (usize, usize) {
        let p = self.vision.patch_size;
        let (mut w, mut h) = (w, h);
        let n = (w / p) * (h / p);
        if n > self.in_token_limit {
            let scale = (self.in_token_limit as f64 / n as f64).sqrt();
            (w, h) = ((w as f64 * scale) as usize, (h as f64 * scale) as usize);
        }
        let (kh, kw) = self.vision.merge_kernel;
        let (uh, uw) = (kh * p, kw * p);
        (h.div_ceil(uh) * kh, w.div_ceil(uw) * kw)
    }

    /// `get_num_image_tokens` (kimi_vl.py 0.19 L163-198): the merged tokens of a `w × h` image.
    pub fn num_image_tokens(&self, w: usize, h: usize) -> usize {
        let (rows, cols) = self.patch_grid(w, h);
        rows * cols / self.vision.merge_unit()
    }

    /// The dummy image's patch grid (66 × 66 for Kimi-VL-A3B-Instruct: 1024² pixels hold
    /// 73² = 5329 patches, over 4096, so scaled to 897², padded to 924²).
    pub fn dummy_grid(&self) -> (usize, usize) {
        self.patch_grid(DUMMY_IMAGE_SIDE, DUMMY_IMAGE_SIDE)
    }

    /// The dummy image's tokens (1089 for Kimi-VL-A3B-Instruct), as many `<|media_pad|>`
    /// placeholders as embeddings (`get_replacement`, kimi_vl.py 0.19 L260-274).
    pub fn tokens_per_image(&self) -> usize {
        self.num_image_tokens(DUMMY_IMAGE_SIDE, DUMMY_IMAGE_SIDE)
    }

    /// The image processor's `in_token_limit` from a checkpoint's preprocessor_config.json.
    pub fn read_preprocessor(&mut self, v: &serde_json::Value) -> std::result::Result<(), String> {
        self.in_token_limit = count_or(v, "in_token_limit", self.in_token_limit, 1 << 24)
            .map_err(|e| format!("preprocessor_config.json: {e}"))?;
        for (key, want) in [
            ("patch_size", self.vision.patch_size),
            ("merge_kernel_size", self.vision.merge_kernel.0),
        ] {
            let found = match v.get(key) {
                Some(serde_json::Value::Array(a)) => a.first().and_then(serde_json::Value::as_u64),
                Some(x) => x.as_u64(),
                None => continue,
            };
            if found != Some(want as u64) {
                return Err(format!(
                    "preprocessor_config.json: {key} is {}, the vision_config's is {want}",
                    v[key]
                ));
            }
        }
        Ok(())
    }

    /// The tower's and projector's tensors as the checkpoint stores them.
    pub fn tensor_shapes(&self, text_hidden: usize) -> Vec<(String, Vec<usize>)> {
        let s = &self.vision;
        let (d, i, p) = (s.hidden_size, s.intermediate_size, s.patch_size);
        let pe = format!("{TOWER}.patch_embed");
        let mut out = vec![
            (format!("{pe}.proj.weight"), vec![d, 3, p, p]),
            (format!("{pe}.proj.bias"), vec![d]),
            (
                format!("{pe}.pos_emb.weight"),
                vec![s.pos_emb_height, s.pos_emb_width, d],
            ),
        ];
        for l in 0..s.num_layers {
            let b = format!("{TOWER}.encoder.blocks.{l}");
            for n in ["norm0", "norm1"] {
                out.push((format!("{b}.{n}.weight"), vec![d]));
                out.push((format!("{b}.{n}.bias"), vec![d]));
            }
            out.push((format!("{b}.wqkv.weight"), vec![3 * d, d]));
            out.push((format!("{b}.wqkv.bias"), vec![3 * d]));
            out.push((format!("{b}.wo.weight"), vec![d, d]));
            out.push((format!("{b}.wo.bias"), vec![d]));
            out.push((format!("{b}.mlp.fc0.weight"), vec![i, d]));
            out.push((format!("{b}.mlp.fc0.bias"), vec![i]));
            out.push((format!("{b}.mlp.fc1.weight"), vec![d, i]));
            out.push((format!("{b}.mlp.fc1.bias"), vec![d]));
        }
        out.push((format!("{TOWER}.encoder.final_layernorm.weight"), vec![d]));
        out.push((format!("{TOWER}.encoder.final_layernorm.bias"), vec![d]));
        let w = s.projector_width();
        out.push((format!("{PROJECTOR}.pre_norm.weight"), vec![d]));
        out.push((format!("{PROJECTOR}.pre_norm.bias"), vec![d]));
        out.push((format!("{PROJECTOR}.linear_1.weight"), vec![w, w]));
        out.push((format!("{PROJECTOR}.linear_1.bias"), vec![w]));
        out.push((format!("{PROJECTOR}.linear_2.weight"), vec![text_hidden, w]));
        out.push((format!("{PROJECTOR}.linear_2.bias"), vec![text_hidden]));
        out
    }

    /// Parameters of the tower and projector (vLLM loads every one).
    pub fn param_count(&self, text_hidden: usize) -> u64 {
        self.tensor_shapes(text_hidden)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }

    /// Whether `--tensor-parallel-size tp` divides the tower's heads and MLP (QKVParallelLinear
    /// and ColumnParallelLinear need whole heads and rows a rank).
    pub fn check_tp(&self, tp: usize) -> std::result::Result<(), String> {
        let s = &self.vision;
        if !s.num_heads.is_multiple_of(tp) || !s.intermediate_size.is_multiple_of(tp) {
            return Err(format!(
                "--tensor-parallel-size {tp} does not divide MoonViT's {} heads or its MLP of {}",
                s.num_heads, s.intermediate_size
            ));
        }
        Ok(())
    }
}

impl ModelConfig {
    /// Whether vLLM 0.19 passes over a stored tensor `KimiVLForConditionalGeneration` has no
    /// parameter for rather than refusing the checkpoint: the unused rotary buffers anywhere;
    /// in the language model (`text`: its name there) the multi-token-prediction layers after
    /// the main ones (deepseek_v2.py 0.19 L1468-1470) and a bias with no parameter (GPTQ's,
    /// L1501-1503 and L1607-1609). Anything else it refuses: `AutoWeightsLoader` names a
    /// tensor no module holds (utils.py 0.19 L330-339), `DeepseekV2ForCausalLM.load_weights`
    /// looks each up in its parameters (L1508, L1619).
    pub(crate) fn kimi_vl_loader_skips(&self, stored: &str, text: Option<&str>) -> bool {
        if crate::model::checkpoint_names::ROTARY_UNUSED
            .iter()
            .any(|u| stored.contains(u))
        {
            return true;
        }
        let Some(text) = text else {
            return false;
        };
        let mtp = self
            .deepseek
            .as_ref()
            .map_or(0, |d| d.num_nextn_predict_layers);
        let layer = text
            .strip_prefix("model.layers.")
            .and_then(|r| r.split('.').next()?.parse::<usize>().ok());
        layer.is_some_and(|l| (self.num_layers..self.num_layers + mtp).contains(&l))
            || text.ends_with(".bias")
    }

    /// A `KimiVLConfig`: the language model from `text_config` (deepseek_v3 or deepseek_v2,
    /// read as themselves), MoonViT from `vision_config`.
    pub(super) fn kimi_vl_from_hf_json(v: &serde_json::Value) -> std::result::Result<Self, String> {
        let Some(text @ serde_json::Value::Object(_)) = v.get("text_config") else {
            return Err(
                "model_type kimi_vl needs a text_config object (its language model)".into(),
            );
        };
        // KimiVLConfig builds a DeepseekV2Config from the dict (configs/kimi_vl.py 0.19
        // L29-33); vLLM runs it as `DeepseekV2ForCausalLM` (kimi_vl.py 0.19 L330-335), which
        // reads the V3 keys (noaux_tc, sigmoid scoring) the same way.
        let mut text = text.clone();
        let model_type = text
            .get("model_type")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string);
        match model_type.as_deref() {
            Some("deepseek_v3" | "deepseek_v2") => {}
            None => text["model_type"] = "deepseek_v3".into(),
            Some(other) => {
                return Err(format!(
                    "text_config.model_type is '{other}' in a kimi_vl config: deepseek_v3 or deepseek_v2 are modelled"
                ))
            }
        }
        let mut cfg = Self::from_hf_json(&text).map_err(|e| format!("text_config: {e}"))?;
        let Some(vis @ serde_json::Value::Object(_)) = v.get("vision_config") else {
            return Err(
                "model_type kimi_vl needs a vision_config object (its MoonViT tower)".into(),
            );
        };
        match vis.get("model_type").and_then(serde_json::Value::as_str) {
            None | Some("moonvit") => {}
            Some(other) => {
                return Err(format!(
                    "vision_config.model_type is '{other}', expected 'moonvit' in a kimi_vl config"
                ))
            }
        }
        let e =
            |r: std::result::Result<usize, String>| r.map_err(|e| format!("vision_config: {e}"));
        let merge_kernel = match vis.get("merge_kernel_size") {
            None | Some(serde_json::Value::Null) => (2, 2),
            Some(serde_json::Value::Array(a)) => match a.as_slice() {
                [h, w] => match (h.as_u64(), w.as_u64()) {
                    (Some(h @ 1..=8), Some(w @ 1..=8)) => (h as usize, w as usize),
                    _ => {
                        return Err(format!(
                            "vision_config: merge_kernel_size {a:?} is not two counts of 1 to 8"
                        ))
                    }
                },
                _ => return Err("vision_config: merge_kernel_size must be [height, width]".into()),
            },
            Some(x) => {
                return Err(format!(
                    "vision_config: merge_kernel_size is {x}, expected [height, width]"
                ))
            }
        };
        let vision = MoonVitShape {
            hidden_size: e(count_or(vis, "hidden_size", 1152, 1 << 16))?,
            intermediate_size: e(count_or(vis, "intermediate_size", 4304, 1 << 18))?,
            num_layers: e(count_or(vis, "num_hidden_layers", 27, 1 << 8))?,
            num_heads: e(count_or(vis, "num_attention_heads", 16, 1 << 8))?,
            patch_size: e(count_or(vis, "patch_size", 14, 1 << 8))?,
            pos_emb_height: e(count_or(vis, "init_pos_emb_height", 64, 1 << 10))?,
            pos_emb_width: e(count_or(vis, "init_pos_emb_width", 64, 1 << 10))?,
            merge_kernel,
        };
        if !vision.hidden_size.is_multiple_of(vision.num_heads) {
            return Err(format!(
                "vision_config: hidden_size {} is not a multiple of num_attention_heads {}",
                vision.hidden_size, vision.num_heads
            ));
        }
        // `Rope2DPosEmb` asserts its head dimension divides by 4 (moonvit.py 0.19 L208).
        if !vision.head_dim().is_multiple_of(4) {
            return Err(format!(
                "vision_config: MoonViT's head dimension {} (hidden_size / num_attention_heads) is not a multiple of 4, as its 2D rotary needs",
                vision.head_dim()
            ));
        }
        cfg.kimi_vl = Some(KimiVlShape {
            vision,
            media_placeholder_token_id: count_or(v, "media_placeholder_token_id", 163605, 1 << 24)?,
            in_token_limit: IN_TOKEN_LIMIT,
        });
        Ok(cfg)
    }

    /// The `KimiVLConfig` a loader reads: the language model as its `text_config`, MoonViT's
    /// keys as its `vision_config`.
    pub(super) fn kimi_vl_to_hf_json(
        &self,
        mm: &KimiVlShape,
        torch_dtype: &str,
    ) -> serde_json::Value {
        let text = ModelConfig {
            kimi_vl: None,
            ..self.clone()
        }
        .to_hf_json(torch_dtype);
        let v = &mm.vision;
        serde_json::json!({
            "architectures": ["KimiVLForConditionalGeneration"],
            "model_type": "kimi_vl",
            "media_placeholder_token_id": mm.media_placeholder_token_id,
            "ignore_index": -100,
            "pad_token_id": 0,
            "tie_word_embeddings": self.tie_word_embeddings,
            "text_config": text,
            "vision_config": {
                "model_type": "moonvit",
                "hidden_size": v.hidden_size,
                "intermediate_size": v.intermediate_size,
                "num_hidden_layers": v.num_layers,
                "num_attention_heads": v.num_heads,
                "patch_size": v.patch_size,
                "init_pos_emb_height": v.pos_emb_height,
                "init_pos_emb_width": v.pos_emb_width,
                "merge_kernel_size": [v.merge_kernel.0, v.merge_kernel.1],
            },
            "torch_dtype": torch_dtype,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kimi_vl() -> ModelConfig {
        crate::model::presets::preset("kimi-vl-a3b").unwrap()
    }

    /// MoonViT of Kimi-VL-A3B by hand: the patch embedding 1152 × 3 × 14² + 1152, the position
    /// grid 64 × 64 × 1152, 27 blocks of two LayerNorms (4 × 1152), wqkv 3 × (1152² + 1152), wo
    /// 1152² + 1152, fc0 4304 × 1152 + 4304, fc1 1152 × 4304 + 1152, the final LayerNorm
    /// 2 × 1152; the projector's pre_norm 2 × 1152, linear_1 4608² + 4608, linear_2
    /// 2048 × 4608 + 2048.
    #[test]
    fn moonvit_and_the_projector_count_their_parameters() {
        let c = kimi_vl();
        let mm = c.kimi_vl.as_ref().unwrap();
        let block = 4 * 1152
            + 3 * (1152 * 1152 + 1152)
            + (1152 * 1152 + 1152)
            + (4304 * 1152 + 4304)
            + (1152 * 4304 + 1152);
        let tower = 1152 * 3 * 196 + 1152 + 64 * 64 * 1152 + 27 * block + 2 * 1152;
        let projector = 2 * 1152 + 4608 * 4608 + 4608 + 2048 * 4608 + 2048;
        assert_eq!(tower, 416_866_032);
        assert_eq!(projector, 30_679_808);
        assert_eq!(mm.param_count(2048), (tower + projector) as u64);
        assert_eq!(mm.vision.projector_width(), 4608);
    }

    /// The whole checkpoint: Moonlight-16B-A3B's language model (163840 × 2048 embeddings and
    /// an untied head, 27 MLA layers, a dense first layer of 11264, 26 MoE layers of 64 experts
    /// of 1408 and 2 shared ones) and the vision side: 16.4 billion, as the model card says.
    /// transformers 5.17 counts the same from the same config.json (`scripts/param_count.py`,
    /// meta device, docs/gpu-runs.md run 99): `DeepseekV3ForCausalLM` 15,960,110,208, and
    /// MoonViT's tensors as a `SiglipVisionModel` of the same shapes 416,866,032.
    #[test]
    fn the_checkpoint_holds_16_4_billion_parameters() {
        let c = kimi_vl();
        let vision = c.kimi_vl.as_ref().unwrap().param_count(2048);
        let text = c.param_count() - vision;
        assert_eq!(text, 15_960_110_208);
        assert_eq!(c.param_count(), 16_407_656_048);
    }

    #[test]
    fn the_dummy_image_is_scaled_to_the_token_limit() {
        let mm = kimi_vl().kimi_vl.unwrap();
        // 1024² holds 73² = 5329 patches, over 4096: × sqrt(4096 / 5329), int(897.75) = 897,
        // padded to 924 = 33 × 28: 66 × 66 patches, 33 × 33 tokens.
        assert_eq!(mm.dummy_grid(), (66, 66));
        assert_eq!(mm.tokens_per_image(), 1089);
        // Under the limit an image is only padded: 280 × 420 → 20 × 30 patches, 150 tokens;
        // 300 × 300 → 21 patches padded to 22, 121 tokens.
        assert_eq!(mm.num_image_tokens(420, 280), 150);
        assert_eq!(mm.num_image_tokens(300, 300), 121);
        // -Thinking-2506's limit of 16384 keeps 1024² whole: 1036 = 37 × 28, 1369 tokens.
        let mut big = mm.clone();
        big.read_preprocessor(
            &serde_json::json!({"in_token_limit": 16384, "patch_size": 14,
            "merge_kernel_size": [2, 2]}),
        )
        .unwrap();
        assert_eq!((big.dummy_grid(), big.tokens_per_image()), ((74, 74), 1369));
    }

    #[test]
    fn other_towers_and_language_models_are_refused_by_name() {
        let mut v = crate::model::presets::kimi_vl_a3b_json();
        v["text_config"]["model_type"] = "llama".into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("'llama'"), "{e}");
        let mut v = crate::model::presets::kimi_vl_a3b_json();
        v["vision_config"]["num_attention_heads"] = 64.into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("multiple of 4"), "{e}");
        let mm = kimi_vl().kimi_vl.unwrap();
        let e = mm
            .clone()
            .read_preprocessor(&serde_json::json!({"patch_size": 16}))
            .unwrap_err();
        assert!(e.contains("patch_size"), "{e}");
        assert!(mm.check_tp(3).is_err());
        mm.check_tp(8).unwrap();
    }

    #[test]
    fn the_config_round_trips() {
        let c = kimi_vl();
        let back = ModelConfig::from_hf_json(&c.to_hf_json("bfloat16")).unwrap();
        assert_eq!(back, c);
    }
}

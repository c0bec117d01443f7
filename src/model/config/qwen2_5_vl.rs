//! Qwen2.5-VL's multimodal checkpoint (`model_type` qwen2_5_vl:
//! `Qwen2_5_VLForConditionalGeneration`, Qwen/Qwen2.5-VL-3B/7B/32B/72B-Instruct). The language
//! model is a Qwen2 (vLLM builds `Qwen2ForCausalLM` for it, qwen2_5_vl.py 0.19 L1141-1146)
//! whose rotary embedding is M-RoPE (`mrope_section`: the head's rotary halves split between
//! the temporal, height and width positions; the same weights as Qwen2's). The published
//! config.json keeps the language model's keys at its top level (transformers 4.49); later
//! saves (4.53 on) add them as a `text_config` too, which is read first. `vision_config` is
//! the window-attention ViT vLLM builds as `Qwen2_5_VisionTransformer` (qwen2_5_vl.py 0.19
//! L574-649): a Conv3d patch embedding without bias (temporal patches of 2 frames), `depth`
//! pre-RMSNorm blocks (fused qkv with bias, the output projection with bias, a gated SiLU MLP
//! with biases), window attention except in `fullatt_block_indexes`, and the patch merger
//! (RMSNorm `ln_q`, then `mlp.0` (4d → 4d) GELU `mlp.2` (4d → the language model's width),
//! both with biases) over 2 × 2 patches.

use serde::{Deserialize, Serialize};

use super::{count_or, ModelConfig};

/// The vision tower (`Qwen2_5_VLVisionConfig`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qwen25VisionShape {
    /// Blocks (`depth`, 32 in every published size).
    pub depth: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    /// The attention window's side in pixels (112: 4 × 4 merged tokens).
    pub window_size: usize,
    /// The blocks that attend over the whole image (7, 15, 23, 31).
    pub fullatt_block_indexes: Vec<usize>,
    /// The merger's output width: the language model's `hidden_size`.
    pub out_hidden_size: usize,
}

impl Qwen25VisionShape {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Patches merged into one embedding (`spatial_merge_unit`, 4).
    pub fn merge_unit(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }

    /// Merged tokens along a window's side (`vit_merger_window_size`: `window_size //
    /// spatial_merge_size // patch_size`, qwen2_5_vl.py 0.19 L697-699; 4).
    pub fn merger_window(&self) -> usize {
        self.window_size / self.spatial_merge_size / self.patch_size
    }
}

/// What a `Qwen2_5_VLForConditionalGeneration` adds to its Qwen2 language model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qwen25VlShape {
    pub vision: Qwen25VisionShape,
    /// M-RoPE's split of the head's rotary frequencies (temporal, height, width: 16, 24, 24).
    pub mrope_section: [usize; 3],
    /// `<|image_pad|>` (151655).
    pub image_token_id: usize,
    /// The image processor's `min_pixels` / `max_pixels` (preprocessor_config.json: 3136
    /// and 12845056; `size.shortest_edge` / `size.longest_edge` in vLLM).
    pub min_pixels: u64,
    pub max_pixels: u64,
}

/// The dummy item of V1's encoder profile (`Qwen25VlShape::profile_item`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileItem {
    /// A video (`pixel_values_videos`) rather than an image.
    pub video: bool,
    /// The video's frames (1 for an image).
    pub frames: u64,
    /// Its patch grid (t, h, w).
    pub grid: (u64, u64, u64),
    /// Its embeddings, as many placeholder tokens.
    pub tokens: u64,
}

/// Where the tower's tensors sit in the published checkpoint (vLLM's `hf_to_vllm_mapper` also
/// takes transformers 4.52's `model.visual.`, qwen2_5_vl.py 0.19 L1021-1030; vramscope reads
/// both, checkpoint_names.rs).
pub const TOWER: &str = "visual";

/// The published preprocessor_config.json's pixel bounds (Qwen2.5-VL-3B/7B/32B/72B-Instruct).
pub const MIN_PIXELS: u64 = 3136;
pub const MAX_PIXELS: u64 = 12_845_056;

impl Qwen25VlShape {
    /// The image processor's pixel bounds from a checkpoint's preprocessor_config.json:
    /// `min_pixels` / `max_pixels`, else `size.shortest_edge` / `size.longest_edge` (what
    /// vLLM reads as the processor's `size`, qwen2_vl.py 0.19 L846-852); a bound it leaves out
    /// keeps its value. `Err` names a value that is not a positive count or bounds that
    /// cross.
    pub fn read_preprocessor(&mut self, v: &serde_json::Value) -> std::result::Result<(), String> {
        let size = v.get("size");
        for (key, edge) in [
            ("min_pixels", "shortest_edge"),
            ("max_pixels", "longest_edge"),
        ] {
            let x = v
                .get(key)
                .filter(|x| !x.is_null())
                .or_else(|| size.and_then(|s| s.get(edge)).filter(|x| !x.is_null()));
            if let Some(x) = x {
                let n = x.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                    format!(
                        "preprocessor_config.json: {key} is {x}, expected a positive pixel count"
                    )
                })?;
                if key == "min_pixels" {
                    self.min_pixels = n;
                } else {
                    self.max_pixels = n;
                }
            }
        }
        let unit = (self.vision.patch_size * self.vision.spatial_merge_size) as u64;
        if self.max_pixels < unit * unit || self.min_pixels > self.max_pixels {
            return Err(format!(
                "preprocessor_config.json: min_pixels {} and max_pixels {} leave no image of at least {unit} × {unit} pixels",
                self.min_pixels, self.max_pixels
            ));
        }
        Ok(())
    }

    /// The dummy image vLLM profiles with: `get_image_size_with_most_features` (qwen2_vl.py
    /// 0.19 L914-965): `max_pixels // (28 · 28)` merged tokens, factored into the closest
    /// pair (height ≤ width) whose aspect ratio is at most 200, fewer tokens tried until one
    /// is; each factor times 28 pixels. Returns (width, height): 3584 × 3584 for 12845056.
    pub fn dummy_image(&self) -> (u64, u64) {
        let unit = (self.vision.patch_size * self.vision.spatial_merge_size) as u64;
        let max_seq_len = self.max_pixels / (unit * unit);
        let closest = |n: u64| -> (u64, u64) {
            let mut d = n.isqrt();
            while d > 0 {
                if n.is_multiple_of(d) {
                    return (d, n / d);
                }
                d -= 1;
            }
            (1, n)
        };
        let (mut hf, mut wf) = (1, max_seq_len);
        for seq in (1..=max_seq_len).rev() {
            (hf, wf) = closest(seq);
            if wf as f64 / hf as f64 <= 200.0 {
                break;
            }
        }
        (unit * wf, unit * hf)
    }

    /// The dummy image's patch grid (t, h, w): `_get_vision_info` (qwen2_vl.py 0.19
    /// L829-877) resizes it with `smart_resize` (already a multiple of 28 within the bounds:
    /// unchanged) and pads its one frame to `temporal_patch_size` (one temporal patch).
    pub fn dummy_grid(&self) -> (u64, u64, u64) {
        let (w, h) = self.dummy_image();
        let p = self.vision.patch_size as u64;
        let tp = self.vision.temporal_patch_size as u64;
        let frames = 1 + 1 % tp;
        ((frames / tp).max(1), h / p, w / p)
    }

    /// Patches of the dummy image: the tower's sequence (65536 for 256 × 256).
    pub fn patches_per_image(&self) -> u64 {
        let (t, h, w) = self.dummy_grid();
        t * h * w
    }

    /// Embeddings one dummy image yields after the 2 × 2 merge (`get_max_image_tokens`,
    /// 16384); its placeholder is as many `<|image_pad|>` tokens (`_get_prompt_updates`,
    /// qwen2_vl.py 0.19 L1079-1112: `grid_thw.prod() // merge_size²`).
    pub fn embeds_per_image(&self) -> u64 {
        self.patches_per_image() / self.vision.merge_unit() as u64
    }

    /// Frames of the dummy video V1 sizes for a `max_model_len`-token context
    /// (`get_num_frames_with_most_features` with one video, qwen2_vl.py 0.19 L978-1014; 0.15.1
    /// the same): the most frames of the dummy image's size whose tokens stay within the
    /// context, from 1 (kept even when one frame's tokens exceed it), at most 14
    /// (`_MAX_FRAMES_PER_VIDEO`).
    pub fn video_frames(&self, max_model_len: u64) -> u64 {
        let mut n = 1;
        while n < 14 && self.video_tokens(n + 1) <= max_model_len {
            n += 1;
        }
        n
    }

    /// The patch grid of a dummy video of `frames` frames of the dummy image's size: the
    /// frames padded to a multiple of `temporal_patch_size` (`_get_vision_info`, qwen2_vl.py
    /// 0.19 L864-870; the processor repeats the last frame), one temporal patch per
    /// `temporal_patch_size` frames.
    pub fn video_grid(&self, frames: u64) -> (u64, u64, u64) {
        let (_, h, w) = self.dummy_grid();
        let tp = self.vision.temporal_patch_size as u64;
        let padded = frames + frames % tp;
        ((padded / tp).max(1), h, w)
    }

    /// Embeddings of a dummy video of `frames` frames.
    pub fn video_tokens(&self, frames: u64) -> u64 {
        let (t, h, w) = self.video_grid(frames);
        t * h * w / self.vision.merge_unit() as u64
    }

    /// The dummy item V1's encoder profile runs (`get_modality_with_max_tokens`): among the
    /// modalities whose `--limit-mm-per-prompt` is above 0 (999 by default), the one whose
    /// largest item has the most tokens; a tie goes to the image under 0.15.1 (`max` by
    /// tokens over {image, video}, v1/worker/utils.py L75-79) and to the video from 0.19
    /// (`max` by (tokens, name), multimodal/encoder_budget.py 0.19 L182-185). Under a context
    /// below two frames' tokens (32768 for the published sizes) the video is one frame
    /// padded to one temporal patch: the image's grid. `None`: both limited to 0.
    pub fn profile_item(
        &self,
        max_model_len: u64,
        (images, videos): (Option<u64>, Option<u64>),
        video_wins_ties: bool,
    ) -> Option<ProfileItem> {
        let on = |l: Option<u64>| l.unwrap_or(999) > 0;
        let image = ProfileItem {
            video: false,
            frames: 1,
            grid: self.dummy_grid(),
            tokens: self.embeds_per_image(),
        };
        let frames = self.video_frames(max_model_len);
        let video = ProfileItem {
            video: true,
            frames,
            grid: self.video_grid(frames),
            tokens: self.video_tokens(frames),
        };
        match (on(images), on(videos)) {
            (false, false) => None,
            (true, false) => Some(image),
            (false, true) => Some(video),
            (true, true) => Some(
                if video.tokens > image.tokens || (video.tokens == image.tokens && video_wins_ties)
                {
                    video
                } else {
                    image
                },
            ),
        }
    }

    /// The dummy image's attention windows as `get_window_index_thw` cuts them (qwen2_5_vl.py
    /// 0.19 L696-732): the merged-token grid padded by `w - n % w` (a whole window more when
    /// `n` is already a multiple of it), windows of `merger_window()²` merged tokens, the
    /// empty ones dropped by `unique_consecutive`. Returns (windows holding tokens, entries of
    /// `cu_window_seqlens` with its leading 0, the longest window's patches): 1024, 1025 and
    /// 64 for the 128 × 128 grid.
    pub fn dummy_windows(&self) -> (u64, u64, u64) {
        let (t, h, w) = self.dummy_grid();
        let m = self.vision.spatial_merge_size as u64;
        let ws = self.vision.merger_window() as u64;
        let (lh, lw) = (h / m, w / m);
        let windows = t * lh.div_ceil(ws) * lw.div_ceil(ws);
        let longest = ws.min(lh) * ws.min(lw) * self.vision.merge_unit() as u64;
        (windows, windows + 1, longest)
    }

    /// The tower's rotary width: half the head (`partial_rotary_factor` 0.5, qwen2_5_vl.py 0.19
    /// L607-612; 40 of 80).
    pub fn vision_rotary_dim(&self) -> usize {
        self.vision.head_dim() / 2
    }

    /// Bytes of the tower's `cos_sin_cache` buffer (`get_rope(max_position=8192)`:
    /// `[8192, rotary_dim]` in the model dtype, a non-persistent buffer made with the tower,
    /// rotary_embedding/base.py 0.19 L58-63): 655,360 in bf16.
    pub fn vision_rope_cache_bytes(&self, dtype_bytes: u64) -> u64 {
        8192 * self.vision_rotary_dim() as u64 * dtype_bytes
    }

    /// Bytes of one of an image's rotary tables, cos or sin (`rotary_pos_emb_thw`, then
    /// reordered by the window index in `get_rope_by_thw`: `[patches, rotary_dim]` in the
    /// model dtype, L651-694 and L733-752): 5,242,880 in bf16 for the dummy image. Both stay in
    /// `get_rope_by_thw`'s `lru_cache` after the pass.
    pub fn rotary_table_bytes(&self, dtype_bytes: u64) -> u64 {
        self.patches_per_image() * self.vision_rotary_dim() as u64 * dtype_bytes
    }

    /// Bytes of the runner's `mrope_positions` buffer: int64 `[3, max_num_tokens + 1]` (the
    /// extra column on purpose, to make it non-contiguous), made in `GPUModelRunner.__init__`
    /// and kept (v1/worker/gpu_model_runner.py 0.19 L728-741).
    pub fn mrope_positions_bytes(max_num_tokens: u64) -> u64 {
        3 * (max_num_tokens + 1) * 8
    }

    /// The tower's and merger's tensors as the checkpoint stores them.
    pub fn tensor_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let s = &self.vision;
        let (d, i) = (s.hidden_size, s.intermediate_size);
        let mut out = vec![(
            format!("{TOWER}.patch_embed.proj.weight"),
            vec![
                d,
                s.in_channels,
                s.temporal_patch_size,
                s.patch_size,
                s.patch_size,
            ],
        )];
        for l in 0..s.depth {
            let p = format!("{TOWER}.blocks.{l}");
            out.push((format!("{p}.norm1.weight"), vec![d]));
            out.push((format!("{p}.norm2.weight"), vec![d]));
            out.push((format!("{p}.attn.qkv.weight"), vec![3 * d, d]));
            out.push((format!("{p}.attn.qkv.bias"), vec![3 * d]));
            out.push((format!("{p}.attn.proj.weight"), vec![d, d]));
            out.push((format!("{p}.attn.proj.bias"), vec![d]));
            for n in ["gate_proj", "up_proj"] {
                out.push((format!("{p}.mlp.{n}.weight"), vec![i, d]));
                out.push((format!("{p}.mlp.{n}.bias"), vec![i]));
            }
            out.push((format!("{p}.mlp.down_proj.weight"), vec![d, i]));
            out.push((format!("{p}.mlp.down_proj.bias"), vec![d]));
        }
        let m = d * s.merge_unit();
        out.push((format!("{TOWER}.merger.ln_q.weight"), vec![d]));
        out.push((format!("{TOWER}.merger.mlp.0.weight"), vec![m, m]));
        out.push((format!("{TOWER}.merger.mlp.0.bias"), vec![m]));
        out.push((
            format!("{TOWER}.merger.mlp.2.weight"),
            vec![s.out_hidden_size, m],
        ));
        out.push((
            format!("{TOWER}.merger.mlp.2.bias"),
            vec![s.out_hidden_size],
        ));
        out
    }

    /// Parameters of the tower and merger (676,550,144 for the 7B's).
    pub fn param_count(&self) -> u64 {
        self.tensor_shapes()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum()
    }

    /// Parameters one tensor-parallel rank holds of the tower and merger, as vLLM 0.19 splits
    /// them (`mm_encoder_tp_mode` "weights", the default): `qkv` (QKVParallelLinear), the
    /// MLP's `gate_up_proj` (MergedColumnParallelLinear) and `merger.mlp.0`
    /// (ColumnParallelLinear) split their output rows and biases; `attn.proj`, `down_proj`
    /// and `merger.mlp.2` (RowParallelLinear) their input columns, each rank keeping the whole
    /// bias; the patch embedding (Conv3dLayer) and the RMSNorms are whole on every rank
    /// (qwen2_5_vl.py 0.19 L271-300, L309-350, L492-572). `Err` names the width that does
    /// not divide (vLLM's `divide` asserts).
    pub fn params_per_rank(&self, tp: usize) -> std::result::Result<u64, String> {
        let s = &self.vision;
        let (d, i, m) = (
            s.hidden_size as u64,
            s.intermediate_size as u64,
            (s.hidden_size * s.merge_unit()) as u64,
        );
        for (what, n) in [
            ("num_heads", s.num_heads),
            ("intermediate_size", s.intermediate_size),
            ("the merger's width", s.hidden_size * s.merge_unit()),
        ] {
            if !n.is_multiple_of(tp) {
                return Err(format!(
                    "vision_config: {what} {n} does not split over tensor parallel size {tp} (vLLM's Qwen2_5_VisionTransformer asserts it)"
                ));
            }
        }
        let t = tp as u64;
        let block = 2 * d // norm1, norm2
            + (3 * d * d + 3 * d) / t // qkv
            + d * d / t + d // proj
            + (2 * i * d + 2 * i) / t // gate_up
            + d * i / t + d; // down
        let patch =
            d * (s.in_channels * s.temporal_patch_size * s.patch_size * s.patch_size) as u64;
        let out = s.out_hidden_size as u64;
        let merger = d + (m * m + m) / t + out * m / t + out;
        Ok(patch + s.depth as u64 * block + merger)
    }
}

impl ModelConfig {
    /// A `Qwen2_5_VLConfig`: the Qwen2 language model (its `text_config`, else the top-level
    /// keys), the vision tower from `vision_config`. `preprocessor` is the checkpoint's
    /// preprocessor_config.json where one was found beside it (its `min_pixels` /
    /// `max_pixels`); the published bounds otherwise.
    pub(super) fn qwen2_5_vl_from_hf_json(
        v: &serde_json::Value,
    ) -> std::result::Result<Self, String> {
        let mut text = match v.get("text_config") {
            Some(t @ serde_json::Value::Object(_)) => t.clone(),
            None | Some(serde_json::Value::Null) => {
                let mut t = v.clone();
                if let Some(o) = t.as_object_mut() {
                    o.remove("vision_config");
                }
                t
            }
            Some(other) => {
                return Err(format!(
                    "text_config is {other}, expected an object (the Qwen2 language model)"
                ))
            }
        };
        // M-RoPE: `rope_scaling` {"type": "mrope" (or "default"), "mrope_section": [...]}
        // (transformers 5: `rope_parameters`); the weights are Qwen2's.
        let rs = [text.get("rope_scaling"), text.get("rope_parameters")]
            .into_iter()
            .flatten()
            .find(|r| !r.is_null())
            .cloned();
        let mrope_section = match rs.as_ref().and_then(|r| r.get("mrope_section")) {
            Some(serde_json::Value::Array(a)) if a.len() == 3 => {
                let mut s = [0usize; 3];
                for (k, x) in a.iter().enumerate() {
                    s[k] = x
                        .as_u64()
                        .filter(|n| *n > 0 && *n < 1 << 12)
                        .ok_or_else(|| format!("rope_scaling.mrope_section[{k}] is {x}, expected a positive integer"))?
                        as usize;
                }
                s
            }
            _ => {
                return Err(
                    "model_type qwen2_5_vl needs rope_scaling.mrope_section (three counts: M-RoPE's temporal, height and width sections)"
                        .into(),
                )
            }
        };
        if let Some(kind) = rs
            .as_ref()
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(serde_json::Value::as_str)
        {
            if !matches!(kind, "mrope" | "default") {
                return Err(format!(
                    "rope_scaling '{kind}' on M-RoPE is not modelled (only the plain M-RoPE of the published checkpoints)"
                ));
            }
        }
        if let Some(o) = text.as_object_mut() {
            o.remove("rope_scaling");
            o.remove("rope_parameters");
            o.insert("model_type".into(), "qwen2".into());
            o.insert(
                "architectures".into(),
                serde_json::json!(["Qwen2ForCausalLM"]),
            );
            // The top-level `tie_word_embeddings` rules where text_config leaves it out.
            if !o.contains_key("tie_word_embeddings") {
                if let Some(t) = v.get("tie_word_embeddings") {
                    o.insert("tie_word_embeddings".into(), t.clone());
                }
            }
        }
        let mut cfg = Self::from_hf_json(&text).map_err(|e| format!("qwen2_5_vl: {e}"))?;
        if mrope_section.iter().sum::<usize>() * 2 != cfg.head_dim {
            return Err(format!(
                "rope_scaling.mrope_section {mrope_section:?} does not sum to half the head size {}",
                cfg.head_dim
            ));
        }
        let Some(vis @ serde_json::Value::Object(_)) = v.get("vision_config") else {
            return Err(
                "model_type qwen2_5_vl needs a vision_config object (its vision tower)".into(),
            );
        };
        if let Some(a) = vis.get("hidden_act").filter(|a| !a.is_null()) {
            if a.as_str() != Some("silu") {
                return Err(format!(
                    "vision_config.hidden_act is {a}, expected \"silu\" (the gated MLP modelled)"
                ));
            }
        }
        let e =
            |r: std::result::Result<usize, String>| r.map_err(|e| format!("vision_config: {e}"));
        let depth = e(count_or(vis, "depth", 32, 1 << 8))?;
        let fullatt_block_indexes = match vis.get("fullatt_block_indexes") {
            None | Some(serde_json::Value::Null) => vec![7, 15, 23, 31],
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .filter(|n| (*n as usize) < depth)
                        .map(|n| n as usize)
                        .ok_or_else(|| {
                            format!(
                                "vision_config.fullatt_block_indexes holds {x}, expected a block index below depth {depth}"
                            )
                        })
                })
                .collect::<std::result::Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(format!(
                    "vision_config.fullatt_block_indexes is {other}, expected a list of block indexes"
                ))
            }
        };
        let vision = Qwen25VisionShape {
            depth,
            hidden_size: e(count_or(vis, "hidden_size", 1280, 1 << 16))?,
            intermediate_size: e(count_or(vis, "intermediate_size", 3420, 1 << 18))?,
            num_heads: e(count_or(vis, "num_heads", 16, 1 << 8))?,
            in_channels: e(count_or(
                vis,
                "in_channels",
                vis.get("in_chans")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(3) as usize,
                4,
            ))?,
            patch_size: e(count_or(vis, "patch_size", 14, 1 << 8))?,
            temporal_patch_size: e(count_or(vis, "temporal_patch_size", 2, 16))?,
            spatial_merge_size: e(count_or(vis, "spatial_merge_size", 2, 16))?,
            window_size: e(count_or(vis, "window_size", 112, 1 << 14))?,
            fullatt_block_indexes,
            out_hidden_size: e(count_or(vis, "out_hidden_size", 3584, 1 << 16))?,
        };
        if !vision.hidden_size.is_multiple_of(vision.num_heads)
            || !vision.head_dim().is_multiple_of(4)
        {
            return Err(format!(
                "vision_config: hidden_size {} over {} heads is not a head size divisible by 4 (the 2D rotary embedding's halves)",
                vision.hidden_size, vision.num_heads
            ));
        }
        if vision.out_hidden_size != cfg.hidden_size {
            return Err(format!(
                "vision_config.out_hidden_size {} is not the language model's hidden_size {}",
                vision.out_hidden_size, cfg.hidden_size
            ));
        }
        if vision.merger_window() == 0 {
            return Err(format!(
                "vision_config.window_size {} is below patch_size × spatial_merge_size",
                vision.window_size
            ));
        }
        let image_token_id = count_or(v, "image_token_id", 151655, 1 << 24)?;
        cfg.qwen2_5_vl = Some(Qwen25VlShape {
            vision,
            mrope_section,
            image_token_id,
            min_pixels: MIN_PIXELS,
            max_pixels: MAX_PIXELS,
        });
        Ok(cfg)
    }

    /// The `Qwen2_5_VLConfig` of this shape (`to_hf_json`'s part), laid out as the published
    /// config.json (the language model's keys at the top level).
    pub(super) fn qwen2_5_vl_to_hf_json(
        &self,
        mm: &Qwen25VlShape,
        torch_dtype: &str,
    ) -> serde_json::Value {
        let mut out = ModelConfig {
            qwen2_5_vl: None,
            llava_next: None,
            kimi_vl: None,
            ..self.clone()
        }
        .to_hf_json(torch_dtype);
        let v = &mm.vision;
        out["model_type"] = "qwen2_5_vl".into();
        out["architectures"] = serde_json::json!(["Qwen2_5_VLForConditionalGeneration"]);
        out["image_token_id"] = mm.image_token_id.into();
        out["rope_scaling"] =
            serde_json::json!({"type": "mrope", "mrope_section": mm.mrope_section});
        out["vision_config"] = serde_json::json!({
            "model_type": "qwen2_5_vl",
            "depth": v.depth,
            "hidden_act": "silu",
            "hidden_size": v.hidden_size,
            "intermediate_size": v.intermediate_size,
            "num_heads": v.num_heads,
            "in_chans": v.in_channels,
            "out_hidden_size": v.out_hidden_size,
            "patch_size": v.patch_size,
            "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size,
            "window_size": v.window_size,
            "fullatt_block_indexes": v.fullatt_block_indexes,
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_7b_reads_as_vllm_builds_it() {
        let c = crate::model::presets::preset("qwen2.5-vl-7b").unwrap();
        let mm = c.qwen2_5_vl.as_ref().unwrap();
        assert_eq!(c.arch, "qwen2");
        assert_eq!((c.hidden_size, c.num_layers, c.num_heads), (3584, 28, 28));
        assert_eq!((c.num_kv_heads, c.head_dim, c.vocab_size), (4, 128, 152064));
        assert_eq!(mm.mrope_section, [16, 24, 24]);
        assert_eq!(mm.vision.fullatt_block_indexes, vec![7, 15, 23, 31]);
        assert_eq!(mm.vision.merger_window(), 4);
        // 12845056 // 784 = 16384 merged tokens = 128 × 128: a 3584 × 3584 image, 256 × 256
        // patches in one temporal patch, 16384 embeddings.
        assert_eq!(mm.dummy_image(), (3584, 3584));
        assert_eq!(mm.dummy_grid(), (1, 256, 256));
        assert_eq!(
            (mm.patches_per_image(), mm.embeds_per_image()),
            (65536, 16384)
        );
        // Conv3d 1280 × 3 × 2 × 14 × 14 = 1,505,280; 32 blocks of 19,702,200 (norms 2560,
        // qkv 4,919,040, proj 1,639,680, gate/up 8,762,040, down 4,378,880); the merger's
        // 44,574,464 (ln_q 1280, mlp.0 26,219,520, mlp.2 18,353,664).
        assert_eq!(mm.param_count(), 676_550_144);
        assert_eq!(mm.params_per_rank(1).unwrap(), 676_550_144);
        // 32 × 32 windows of 4 × 4 merged tokens (64 patches) over the 128 × 128 grid (the
        // padding's 33rd row and column of windows empty and dropped).
        assert_eq!(mm.dummy_windows(), (1024, 1025, 64));
        assert_eq!(mm.vision_rotary_dim(), 40);
        assert_eq!(mm.vision_rope_cache_bytes(2), 655_360);
        assert_eq!(mm.rotary_table_bytes(2), 5_242_880);
        assert_eq!(Qwen25VlShape::mrope_positions_bytes(8192), 196_632);
        // The dummy video: one frame within 8192 tokens (two would be 16384 tokens too, but
        // three 32768), the image's grid; 0.19 profiles it (the tie goes to the video),
        // 0.15 the image. 128000 tokens hold 14 frames: 7 temporal patches, 114688 tokens.
        assert_eq!(mm.video_frames(8192), 1);
        assert_eq!(mm.video_frames(16384), 2);
        assert_eq!(mm.video_frames(128000), 14);
        assert_eq!(mm.video_grid(14), (7, 256, 256));
        let v = mm.profile_item(8192, (None, None), true).unwrap();
        assert_eq!((v.video, v.grid, v.tokens), (true, (1, 256, 256), 16384));
        let i = mm.profile_item(8192, (None, None), false).unwrap();
        assert_eq!((i.video, i.grid, i.tokens), (false, (1, 256, 256), 16384));
        let v = mm.profile_item(128000, (None, None), false).unwrap();
        assert_eq!((v.video, v.tokens), (true, 114688));
        let i = mm.profile_item(128000, (None, Some(0)), true).unwrap();
        assert!(!i.video);
        assert!(mm.profile_item(8192, (Some(0), Some(0)), true).is_none());
        // TP 2: the column halves and row halves, the row biases and norms whole.
        assert_eq!(
            mm.params_per_rank(2).unwrap(),
            1_505_280
                + 32 * (2560 + 2_459_520 + 819_200 + 1280 + 4_381_020 + 2_188_800 + 1280)
                + 1280
                + 13_109_760
                + 9_175_040
                + 3584
        );
        // 3420 does not split over 8 (vLLM's divide asserts).
        let e = mm.params_per_rank(8).unwrap_err();
        assert!(e.contains("intermediate_size 3420"), "{e}");
        // All of it: Qwen2.5-7B's 7,615,616,512 and the tower's 676,550,144; in bf16
        // 16,584,333,312 bytes, model.safetensors.index.json's total_size.
        assert_eq!(c.param_count(), 8_292_166_656);
        assert_eq!(c.param_count() * 2, 16_584_333_312);
        let back = ModelConfig::from_hf_json(&c.to_hf_json("bfloat16")).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn a_preprocessor_config_sets_the_pixel_bounds() {
        let mut mm = crate::model::presets::preset("qwen2.5-vl-7b")
            .unwrap()
            .qwen2_5_vl
            .unwrap();
        // 1003520 = 1280 · 28²: 1280 merged tokens, 32 × 40.
        mm.read_preprocessor(&serde_json::json!({"min_pixels": 3136, "max_pixels": 1003520}))
            .unwrap();
        assert_eq!(mm.dummy_image(), (1120, 896));
        assert_eq!(mm.embeds_per_image(), 1280);
        mm.read_preprocessor(
            &serde_json::json!({"size": {"shortest_edge": 3136, "longest_edge": 12845056}}),
        )
        .unwrap();
        assert_eq!(mm.embeds_per_image(), 16384);
        let e = mm
            .read_preprocessor(&serde_json::json!({"max_pixels": "many"}))
            .unwrap_err();
        assert!(e.contains("max_pixels is \"many\""), "{e}");
        let e = mm
            .read_preprocessor(&serde_json::json!({"max_pixels": 100}))
            .unwrap_err();
        assert!(e.contains("leave no image"), "{e}");
    }

    #[test]
    fn the_published_32b_weighs_its_index() {
        let c = crate::model::presets::preset("qwen2.5-vl-32b").unwrap();
        let mm = c.qwen2_5_vl.as_ref().unwrap();
        // MLP 3456 and the merger out to 5120: 688,841,984; with Qwen2.5-32B's
        // 32,763,876,352, 33,452,718,336 (66,905,436,672 bytes in bf16).
        assert_eq!(mm.param_count(), 688_841_984);
        assert_eq!(c.param_count(), 33_452_718_336);
        assert!(mm.params_per_rank(8).is_ok());
    }

    #[test]
    fn what_is_not_modelled_is_refused_by_name() {
        let base = crate::model::presets::qwen25_vl_7b_json();
        let mut v = base.clone();
        v["rope_scaling"] =
            serde_json::json!({"type": "yarn", "factor": 4.0, "mrope_section": [16, 24, 24]});
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("rope_scaling 'yarn'"), "{e}");
        let mut v = base.clone();
        v["rope_scaling"] = serde_json::json!({"type": "mrope"});
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("mrope_section"), "{e}");
        let mut v = base.clone();
        v["vision_config"]["out_hidden_size"] = 2048.into();
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("out_hidden_size 2048"), "{e}");
        let mut v = base.clone();
        v["vision_config"]["fullatt_block_indexes"] = serde_json::json!([7, 40]);
        let e = ModelConfig::from_hf_json(&v).unwrap_err();
        assert!(e.contains("fullatt_block_indexes holds 40"), "{e}");
        // transformers 4.53's save: the language model under text_config as well.
        let mut v = base;
        let mut text = v.clone();
        text.as_object_mut().unwrap().remove("vision_config");
        text["model_type"] = "qwen2_5_vl_text".into();
        v["text_config"] = text;
        let c = ModelConfig::from_hf_json(&v).unwrap();
        assert_eq!(c.param_count(), 8_292_166_656);
    }
}

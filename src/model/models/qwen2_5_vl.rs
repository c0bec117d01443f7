//! Qwen2.5-VL's vision tower as vLLM builds and runs it: `Qwen2_5_VisionTransformer`
//! (qwen2_5_vl.py 0.19 L574-878; 0.15.1 the same forward). The language model is Qwen2's
//! (`llama.rs`), its rotary M-RoPE (the same weights and cache).
//!
//! Weights (made before the language model's, `__init__` L1120-1146): `patch_embed.proj`
//! (`Conv3dLayer`, no bias, whole on every rank), the rotary `cos_sin_cache` `[8192,
//! head_dim / 2]` (a buffer in the model dtype, L607-612), per block `norm1`, `norm2`,
//! `attn.qkv` (QKVParallelLinear with bias: the checkpoint's fused `qkv`, this rank's q, k
//! and v rows), `attn.proj` (RowParallelLinear with bias), `mlp.gate_up_proj`
//! (MergedColumnParallelLinear with bias, from `gate_proj` and `up_proj`), `mlp.down_proj`
//! (RowParallelLinear with bias), then the merger's `ln_q`, `mlp.0` (ColumnParallelLinear)
//! and `mlp.2` (RowParallelLinear), both with biases (L432-572). All in the model dtype.

use std::cell::RefCell;

use crate::base::error::{Error, Result};
use crate::device::cpu_qwen2_5_vl;
use crate::engine::ops_pixtral::RmsNormBody;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_pixtral, ops_qwen2_5_vl as q, ops_tp};
use crate::memory::Category;
use crate::model::config::qwen2_5_vl::TOWER;
use crate::model::config::{ModelConfig, ProfileItem, Qwen25VlShape};
use crate::model::layers::linear::BiasedLinear;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, Loader};
use crate::model::models::vision_check;
use crate::model::weights::WeightSource;
use crate::quant::FusedLinear;

/// The tower's rotary base (`get_rope`'s default θ, transformers'
/// `Qwen2_5_VisionRotaryEmbedding(theta=10000.0)`).
const THETA: f64 = 10000.0;

/// What changes in the tower from one vLLM release to the next
/// (docs/reading/vllm-mm-towers-v021.md §1.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TowerRelease {
    /// The body its RMSNorms run.
    pub norm: RmsNormBody,
    /// How the rotary position ids and the window index reach the device.
    pub rope_ids: q::RopeIds,
    /// Where the uint8 pixels are normalized on the device (0.28 on), if they are.
    pub input_norm: InputNorm,
    /// `second_per_grid_ts` (a video's) stays on the host (0.22 on).
    pub host_second_per_grid: bool,
}

/// The device-side normalization of uint8 pixels (`mm_device_do_normalize`, on by default
/// from 0.28 for Qwen2.5-VL: `supports_mm_device_do_normalize`, qwen2_5_vl.py 0.28 L1259;
/// the processor is called with `do_rescale=False, do_normalize=False`, config/multimodal.py
/// 0.28 L509-515).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputNorm {
    /// The processor rescales and normalizes: floating pixels in the model dtype.
    None,
    /// 0.28-0.29: `FusedInputNorm` (models/vision.py 0.28 L587-733), built after the tower
    /// and called by `_process_image_input` before it; its output is held until the tower
    /// and merger return.
    ModelLevel,
    /// 0.31-0.33: `FusedMMInputNorm` (layers/fusion/mm_input_norm.py 0.31 L209-315), built
    /// before the tower and called inside `visual.forward`; its output dies at the patch
    /// embedding. `cuda`: `forward_cuda` (one output; 0.33 always, its `enabled()` is True;
    /// 0.31 under `--enforce-eager`), else `forward_native`.
    InTower { cuda: bool },
}

impl TowerRelease {
    /// The tower of 0.15 and 0.19 under Inductor.
    pub const V0_19: TowerRelease = TowerRelease {
        norm: RmsNormBody::Static,
        rope_ids: q::RopeIds::HostIndex,
        input_norm: InputNorm::None,
        host_second_per_grid: false,
    };

    /// The tower of vLLM 0.`minor` (0.15 and later), with `--enforce-eager` or not.
    pub fn of(minor: u32, enforce_eager: bool) -> TowerRelease {
        TowerRelease {
            norm: RmsNormBody::of(minor, enforce_eager),
            rope_ids: match minor {
                ..=21 => q::RopeIds::HostIndex,
                22..=28 => q::RopeIds::DeviceCopy,
                _ => q::RopeIds::OnDevice,
            },
            input_norm: match minor {
                ..=27 => InputNorm::None,
                28..=29 => InputNorm::ModelLevel,
                m => InputNorm::InTower {
                    cuda: m >= 33 || enforce_eager,
                },
            },
            host_second_per_grid: minor >= 22,
        }
    }
}

/// One `Qwen2_5_VisionBlock`.
pub struct QwenVisionBlock {
    pub norm1: Tensor,
    pub norm2: Tensor,
    pub qkv: FusedLinear,
    pub qkv_bias: Tensor,
    pub proj: BiasedLinear,
    pub gate_up: FusedLinear,
    pub gate_up_bias: Tensor,
    pub down: BiasedLinear,
}

/// An item's patch grid (t, h, w).
pub type Grid = (usize, usize, usize);

/// The rotary tables `get_rope_by_thw`'s `lru_cache` keeps for a grid: cos and sin in window
/// order, on the device for the rest of the run.
type CachedRope = (Grid, Tensor, Tensor);

/// The vision tower and merger of a `Qwen2_5_VLForConditionalGeneration`.
pub struct Qwen25Vision {
    pub shape: Qwen25VlShape,
    pub act: DType,
    /// The vision RMSNorms' epsilon: the text config's `rms_norm_eps` (L1137).
    pub eps: f32,
    /// This rank's heads and MLP width (all of them with one GPU).
    pub local_heads: usize,
    pub local_inter: usize,
    /// `[D, C, T, p, p]` (read as its `[D, C·T·p·p]` view).
    pub patch_w: Tensor,
    /// `rotary_pos_emb.cos_sin_cache [8192, head_dim / 2]`.
    pub rope_cache: Tensor,
    pub blocks: Vec<QwenVisionBlock>,
    pub ln_q: Tensor,
    pub mlp0: BiasedLinear,
    pub mlp2: BiasedLinear,
    /// `get_rope_by_thw`'s cache.
    rope_tables: RefCell<Vec<CachedRope>>,
    /// The profile's dummy item (`Qwen25VlShape::profile_item`): the dummy image unless set.
    pub profile_item: Option<ProfileItem>,
    /// The release's tower.
    pub release: TowerRelease,
    /// The pixel normalization's `weight` and `bias` (f32 `[3]`), where the release
    /// normalizes on the device.
    pub input_norm: Option<(Tensor, Tensor)>,
}

/// The per-channel `rescale / std` and `-mean / std` of Qwen2.5-VL's and Pixtral's processors
/// (OpenAI CLIP's mean and std, rescale 1/255: the checkpoints' preprocessor_config.json).
pub(crate) fn pixel_norm_values() -> ([f32; 3], [f32; 3]) {
    const MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
    const STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
    let w = [0, 1, 2].map(|c| (1.0 / 255.0 / STD[c]) as f32);
    let b = [0, 1, 2].map(|c| (-MEAN[c] / STD[c]) as f32);
    (w, b)
}

/// One of the pixel normalization's f32 `[3]` buffers (`weight` or `bias`) on the device, with
/// its values for CPU compute.
pub(crate) fn norm_buffer(rt: &Runtime, name: &str, values: [f32; 3]) -> Result<Tensor> {
    rt.tensor_with_values(name, Category::Weight, &[3], DType::F32, values.to_vec())
}

impl Qwen25Vision {
    /// Loads the tower and merger through the framework allocator, in vLLM 0.19's order.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        Self::load_for(rt, cfg, src, opts, TowerRelease::V0_19)
    }

    /// Loads the tower and merger, and the release's pixel normalization buffers where it
    /// has them, through the framework allocator in that release's order.
    pub fn load_for(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
        release: TowerRelease,
    ) -> Result<Self> {
        let shape = cfg.qwen2_5_vl.clone().ok_or_else(|| {
            Error::Request("this config has no vision tower (model_type qwen2_5_vl)".into())
        })?;
        opts.require_16bit_tower(src, "qwen2_5_vl (multimodal)")?;
        let s = &shape.vision;
        let shard = TpShard::of_ranks(rt);
        shape
            .params_per_rank(shard.size)
            .map_err(|e| Error::Request(format!("--tp {}: {e}", shard.size)))?;
        let mut ld = Loader::tower(rt, src, opts, shape.tensor_shapes().len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        // 0.31-0.33: `build_mm_input_norm` is an argument of the tower's constructor, so its
        // two buffers (computed on the host, then `.to(device)`) come first
        // (qwen2_5_vl.py 0.31 L1434-1441, mm_input_norm.py 0.31 L233-256).
        let mut input_norm = match release.input_norm {
            InputNorm::InTower { .. } => {
                let (w, b) = pixel_norm_values();
                Some((
                    norm_buffer(rt, "visual.input_norm.weight", w)?,
                    norm_buffer(rt, "visual.input_norm.bias", b)?,
                ))
            }
            _ => None,
        };
        let (d, i) = (s.hidden_size, s.intermediate_size);
        let patch_w = ld.dense(
            &format!("{TOWER}.patch_embed.proj.weight"),
            &[
                d,
                s.in_channels,
                s.temporal_patch_size,
                s.patch_size,
                s.patch_size,
            ],
        )?;
        let rope_cache = ld.buffer(
            &format!("{TOWER}.rotary_pos_emb.cos_sin_cache"),
            &[8192, shape.vision_rotary_dim()],
            act,
        )?;
        let (h_first, h_len) = (shard.rank * d / shard.size, d / shard.size);
        let (f_first, f_len) = (shard.rank * i / shard.size, i / shard.size);
        let mut blocks = Vec::with_capacity(s.depth);
        for l in 0..s.depth {
            rt.set_layer(Some(l as u32));
            let p = format!("{TOWER}.blocks.{l}");
            let norm1 = ld.dense(&format!("{p}.norm1.weight"), &[d])?;
            let norm2 = ld.dense(&format!("{p}.norm2.weight"), &[d])?;
            // The checkpoint's `qkv` is already fused `[3D, D]`: this rank's rows of each of
            // q, k and v (QKVParallelLinear's loader on the packed `qkv` shard).
            let a = format!("{p}.attn");
            let qkv_parts = [
                (h_first, h_len),
                (d + h_first, h_len),
                (2 * d + h_first, h_len),
            ];
            let qkv = ld.fused_parts(
                &[0, 1, 2].map(|_| format!("{a}.qkv.weight")),
                &[3 * d; 3],
                &qkv_parts,
                d,
                &format!("{a}.qkv.weight"),
            )?;
            let qkv_bias = ld.dense_concat_parts(
                &[0, 1, 2].map(|_| format!("{a}.qkv.bias")),
                &[3 * d; 3],
                &qkv_parts,
                &format!("{a}.qkv.bias"),
            )?;
            let proj = BiasedLinear::load_row(
                &mut ld,
                &format!("{a}.proj"),
                (d, d),
                (h_first, h_len),
                shard.rank,
            )?;
            let m = format!("{p}.mlp");
            let names = |x: &str| ["gate_proj", "up_proj"].map(|n| format!("{m}.{n}.{x}"));
            let gate_up = ld.fused_parts(
                &names("weight"),
                &[i; 2],
                &[(f_first, f_len); 2],
                d,
                &format!("{m}.gate_up_proj.weight"),
            )?;
            let gate_up_bias = ld.dense_concat_parts(
                &names("bias"),
                &[i; 2],
                &[(f_first, f_len); 2],
                &format!("{m}.gate_up_proj.bias"),
            )?;
            let down = BiasedLinear::load_row(
                &mut ld,
                &format!("{m}.down_proj"),
                (d, i),
                (f_first, f_len),
                shard.rank,
            )?;
            blocks.push(QwenVisionBlock {
                norm1,
                norm2,
                qkv,
                qkv_bias,
                proj,
                gate_up,
                gate_up_bias,
                down,
            });
        }
        rt.set_layer(None);
        let mw = d * s.merge_unit();
        let (m_first, m_len) = (shard.rank * mw / shard.size, mw / shard.size);
        let ln_q = ld.dense(&format!("{TOWER}.merger.ln_q.weight"), &[d])?;
        let mlp0 = BiasedLinear::load_column(
            &mut ld,
            &format!("{TOWER}.merger.mlp.0"),
            (mw, mw),
            (m_first, m_len),
        )?;
        let mlp2 = BiasedLinear::load_row(
            &mut ld,
            &format!("{TOWER}.merger.mlp.2"),
            (s.out_hidden_size, mw),
            (m_first, m_len),
            shard.rank,
        )?;
        // 0.28-0.29: `FusedInputNorm.from_model_config` after the tower, under the loader's
        // device context (models/vision.py 0.28 L593-636): `tensor(mean)` and its `· 255`,
        // `tensor(std)` and its `· 255`, `1.0 / std` (`reciprocal`, then `· 1.0`), `-mean`
        // and `/ std`; the kept `weight` and `bias` are buffers, the scaled mean and std die
        // as the constructor returns.
        if release.input_norm == InputNorm::ModelLevel {
            rt.set_op("load.input_norm");
            let (w, b) = pixel_norm_values();
            let t = |name: &str| rt.tensor(name, Category::Weight, &[3], DType::F32);
            let mean = t("input_norm.mean")?;
            let mean255 = t("input_norm.mean_scaled")?;
            drop(mean);
            let std = t("input_norm.std")?;
            let std255 = t("input_norm.std_scaled")?;
            drop(std);
            let recip = t("input_norm.reciprocal")?;
            let weight = norm_buffer(rt, "input_norm.weight", w)?;
            drop(recip);
            let neg = t("input_norm.neg_mean")?;
            let bias = norm_buffer(rt, "input_norm.bias", b)?;
            drop(neg);
            drop(mean255);
            drop(std255);
            input_norm = Some((weight, bias));
        }
        Ok(Qwen25Vision {
            eps: cfg.rms_norm_eps as f32,
            local_heads: s.num_heads / shard.size,
            local_inter: f_len,
            shape,
            act,
            patch_w,
            rope_cache,
            blocks,
            ln_q,
            mlp0,
            mlp2,
            rope_tables: RefCell::new(Vec::new()),
            profile_item: None,
            release,
            input_norm,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        let mut b = self.patch_w.nbytes() + self.rope_cache.nbytes();
        for l in &self.blocks {
            b += l.norm1.nbytes()
                + l.norm2.nbytes()
                + l.qkv.weight_bytes()
                + l.qkv_bias.nbytes()
                + l.proj.weight_bytes()
                + l.gate_up.weight_bytes()
                + l.gate_up_bias.nbytes()
                + l.down.weight_bytes();
        }
        let norm = self
            .input_norm
            .as_ref()
            .map_or(0, |(w, bias)| w.nbytes() + bias.nbytes());
        b + self.ln_q.nbytes() + self.mlp0.weight_bytes() + self.mlp2.weight_bytes() + norm
    }

    /// Bytes of the rotary tables `get_rope_by_thw`'s `lru_cache` holds after a pass (they
    /// stay on the device for the rest of the run).
    pub fn cached_rope_bytes(&self) -> u64 {
        self.rope_tables
            .borrow()
            .iter()
            .map(|(_, c, s)| {
                crate::memory::allocator::round_size(c.nbytes())
                    + crate::memory::allocator::round_size(s.nbytes())
            })
            .sum()
    }

    /// `_process_image_input` on the images of `grids` (t, h, w patches each) whose
    /// `pixel_values [Σ t·h·w, C·T·p·p]` are on the device: `Qwen2_5_VisionTransformer.forward`
    /// (qwen2_5_vl.py 0.19 L774-878). Returns the merged embeddings `[Σ t·h·w / m²,
    /// out_hidden_size]` in the images' order (vLLM splits them into per-image views).
    pub fn encode(
        &self,
        rt: &Runtime,
        pixels: &Tensor,
        grids: &[(usize, usize, usize)],
    ) -> Result<Tensor> {
        let s = &self.shape.vision;
        let (m, ws, unit) = (s.spatial_merge_size, s.merger_window(), s.merge_unit());
        let (heads, hd) = (self.local_heads, s.head_dim());
        let rot = self.shape.vision_rotary_dim();
        let act = self.act;
        let seq: usize = grids.iter().map(|(t, h, w)| t * h * w).sum();
        if pixels.rows() != seq {
            return Err(Error::Request(format!(
                "qwen2_5_vl: {} pixel rows for grids of {seq} patches",
                pixels.rows()
            )));
        }
        rt.set_layer(None);
        // uint8 pixels are normalized first: by the caller before the tower (0.28-0.29, held
        // to the end), or inside it (0.31 on, dying at the patch embedding).
        let normed = match (self.release.input_norm, &self.input_norm) {
            (InputNorm::None, _) | (_, None) => None,
            (kind, Some((w, b))) => {
                let pass = match kind {
                    InputNorm::ModelLevel => q::InputNormPass::Upcast,
                    InputNorm::InTower { cuda: true } => q::InputNormPass::Cuda,
                    _ => q::InputNormPass::Native,
                };
                Some(q::input_norm(
                    rt,
                    pixels,
                    (w, b),
                    pass,
                    act,
                    "vision.input_norm",
                )?)
            }
        };
        // `x.to(device, dtype)`: the processor's output (or the normalized pixels) is
        // already in the model dtype (multimodal/processing/context.py 0.19 L225-237) and on
        // the device: no copy.
        let embeds = q::patch_embed(
            rt,
            normed.as_ref().unwrap_or(pixels),
            &self.patch_w,
            "vision.patch_embed",
        )?;
        let held_input = match self.release.input_norm {
            InputNorm::ModelLevel => normed,
            _ => {
                drop(normed);
                None
            }
        };
        // Per image: the cached rotary tables (made on the first call for a grid), the window
        // index and `cu_seqlens` (host tensors).
        let mut window_index = Vec::with_capacity(seq / unit);
        let mut cu_window = vec![0usize];
        let mut cu_full = vec![0usize];
        let mut per_image = Vec::with_capacity(grids.len());
        for (n, &(t, h, w)) in grids.iter().enumerate() {
            let cached = self
                .rope_tables
                .borrow()
                .iter()
                .position(|(g, _, _)| *g == (t, h, w));
            let at = match cached {
                Some(at) => at,
                None => {
                    let (c, sn) = q::rope_by_thw(
                        rt,
                        (t, h, w),
                        (m, ws),
                        (rot, THETA),
                        act,
                        self.release.rope_ids,
                        &format!("vision.rope_by_thw.{n}"),
                    )?;
                    let mut tables = self.rope_tables.borrow_mut();
                    tables.push(((t, h, w), c, sn));
                    tables.len() - 1
                }
            };
            per_image.push(at);
            let base = window_index.len();
            let (index, lens) = cpu_qwen2_5_vl::window_index((t, h, w), m, ws);
            window_index.extend(index.iter().map(|x| x + base));
            for len in lens {
                let last = *cu_window.last().expect("a leading 0");
                cu_window.push(last + len);
            }
            for _ in 0..t {
                let last = *cu_full.last().expect("a leading 0");
                cu_full.push(last + h * w);
            }
        }
        // `torch.cat` of the per-image tables: copies the blocks read (even of one image).
        let (cos, sin) = {
            let tables = self.rope_tables.borrow();
            let cos: Vec<&Tensor> = per_image.iter().map(|&i| &tables[i].1).collect();
            let sin: Vec<&Tensor> = per_image.iter().map(|&i| &tables[i].2).collect();
            (
                ops_pixtral::cat_rows(rt, &cos, "vision.rotary_pos_emb_cos")?,
                ops_pixtral::cat_rows(rt, &sin, "vision.rotary_pos_emb_sin")?,
            )
        };
        // `invert_permutation` (pinned host memory), the `max_seqlen`s on the host; then
        // `cu_seqlens`, `cu_window_seqlens`, `window_index` and `reverse_indices` to the
        // device (L820-843).
        let mut reverse = vec![0usize; window_index.len()];
        for (i, &w) in window_index.iter().enumerate() {
            reverse[w] = i;
        }
        let dev = [
            q::host_to_device(rt, "vision.cu_seqlens", cu_full.len(), DType::I32)?,
            q::host_to_device(rt, "vision.cu_window_seqlens", cu_window.len(), DType::I32)?,
            q::host_to_device(rt, "vision.window_index", window_index.len(), DType::I64)?,
            q::host_to_device(rt, "vision.reverse_indices", reverse.len(), DType::I64)?,
        ];
        // `hidden_states[window_index]`: the gathered copy; the embeddings die at the rebind.
        let x0 = q::gather_groups(rt, &embeds, &window_index, unit, "vision.window_order")?;
        drop(embeds);
        let mut hidden = x0;
        for (li, b) in self.blocks.iter().enumerate() {
            rt.set_layer(Some(li as u32));
            let l = format!("vision.blocks.{li}");
            let cu = if s.fullatt_block_indexes.contains(&li) {
                &cu_full
            } else {
                &cu_window
            };
            let n1 = ops_pixtral::rms_norm_eager(
                rt,
                &hidden,
                &b.norm1,
                self.eps,
                self.release.norm,
                &format!("{l}.norm1"),
            )?;
            let x_attn = self.attention(rt, b, &n1, (&cos, &sin), cu, (heads, hd), &l)?;
            // The normed input (the call's argument) dies as the attention returns.
            drop(n1);
            let (n2, residual) = q::rms_norm_residual_eager(
                rt,
                &hidden,
                &x_attn,
                &b.norm2,
                self.eps,
                self.release.norm,
                &format!("{l}.norm2"),
            )?;
            let gate_up = b
                .gate_up
                .forward(rt, &n2, &format!("{l}.mlp.gate_up_proj"), 0, act)?;
            let w = self.local_inter;
            let names = ["gate", "up"].map(|n| format!("{l}.mlp.{n}"));
            let bias_names = ["gate", "up"].map(|n| format!("{l}.mlp.{n}_bias"));
            // The bias is in the GEMM's epilogue in vLLM: one output.
            let mut parts = FusedLinear::split(&gate_up, &[w, w], &names);
            for (part, bias) in parts.iter_mut().zip(FusedLinear::split_flat(
                &b.gate_up_bias,
                &[w, w],
                &bias_names,
            )) {
                ops::add_bias(rt, part, &bias)?;
            }
            let a = ops::silu_and_mul_native(rt, &parts[0], &parts[1], &format!("{l}.mlp.act"))?;
            drop(parts);
            let y = b
                .down
                .forward(rt, &a, &format!("{l}.mlp.down_proj"), 0, act)?;
            let y = ops_tp::all_reduce(rt, y, &format!("{l}.mlp.down_proj.all_reduce"))?;
            // `gate_up` and the activation die as the MLP returns.
            drop(a);
            drop(gate_up);
            let out = ops_pixtral::add(rt, &residual, &y, &format!("{l}.out"))?;
            // The MLP's output (a temporary), then the block's locals as it returns; the
            // input as the caller rebinds `hidden_states`.
            drop(y);
            drop(x_attn);
            drop(n2);
            drop(residual);
            hidden = out;
        }
        rt.set_layer(None);
        if act == DType::F16 {
            q::overflow_check(rt, &hidden, "vision.cast_overflow_tensors")?;
        }
        // The merger: `ln_q`, the `[L / m², m² · D]` view, `mlp.0`, GELU, `mlp.2`
        // (nn.Sequential rebinds: each intermediate dies as the next is made).
        let n = ops_pixtral::rms_norm_eager(
            rt,
            &hidden,
            &self.ln_q,
            self.eps,
            self.release.norm,
            "vision.merger.ln_q",
        )?;
        let merged = n.part("vision.merger.view", 0, &[seq / unit, s.hidden_size * unit]);
        let h1 = self
            .mlp0
            .forward(rt, &merged, "vision.merger.mlp.0", 0, act)?;
        drop(merged);
        let g = ops_pixtral::gelu(rt, &h1, "vision.merger.mlp.1")?;
        drop(h1);
        let h2 = self.mlp2.forward(rt, &g, "vision.merger.mlp.2", 0, act)?;
        let h2 = ops_tp::all_reduce(rt, h2, "vision.merger.mlp.2.all_reduce")?;
        drop(g);
        drop(n);
        // The last block's output dies at the rebind; `hidden_states[reverse_indices]` is a
        // copy (the merger's output dies at the rebind).
        drop(hidden);
        let out = q::gather_groups(rt, &h2, &reverse, 1, "vision.reverse_order")?;
        drop(h2);
        // The forward's locals die as it returns: the concatenated tables, the device
        // copies of the indices and `cu_seqlens`.
        drop((cos, sin));
        drop(dev);
        // 0.28-0.29: the normalized pixels die as `_process_image_input` returns.
        drop(held_input);
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        rt: &Runtime,
        b: &QwenVisionBlock,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        cu: &[usize],
        (heads, hd): (usize, usize),
        l: &str,
    ) -> Result<Tensor> {
        let act = self.act;
        let qkv = b.qkv.forward(rt, x, &format!("{l}.attn.qkv"), 0, act)?;
        let w = heads * hd;
        let names = ["q", "k", "v"].map(|n| format!("{l}.attn.{n}"));
        let bias_names = ["q", "k", "v"].map(|n| format!("{l}.attn.{n}_bias"));
        let mut parts = FusedLinear::split(&qkv, &[w; 3], &names);
        for (part, bias) in
            parts
                .iter_mut()
                .zip(FusedLinear::split_flat(&b.qkv_bias, &[w; 3], &bias_names))
        {
            ops::add_bias(rt, part, &bias)?;
        }
        // `qk_reshaped.contiguous()`, then the rotary kernel's new tensor.
        let qk = q::qk_contiguous(rt, &parts[0], &parts[1], &format!("{l}.attn.qk"))?;
        let rotated = q::apply_rope_qk(
            rt,
            &qk,
            (cos, sin),
            (heads, hd),
            &format!("{l}.attn.qk_rotated"),
        )?;
        let rows = x.rows();
        let qr = rotated.part(format!("{l}.attn.q_rot"), 0, &[rows, w]);
        let kr = rotated.part(format!("{l}.attn.k_rot"), rows * w, &[rows, w]);
        let o = q::varlen_attention(
            rt,
            (&qr, &kr, &parts[2]),
            cu,
            (heads, hd),
            &format!("{l}.attn.attn"),
        )?;
        // `rearrange(...).contiguous()` of one batch is already contiguous: no copy.
        let out = b.proj.forward(rt, &o, &format!("{l}.attn.proj"), 0, act)?;
        let out = ops_tp::all_reduce(rt, out, &format!("{l}.attn.proj.all_reduce"))?;
        // The forward's locals die as it returns.
        drop((qr, kr));
        drop(parts);
        drop(qkv);
        drop(qk);
        drop(rotated);
        drop(o);
        Ok(out)
    }
}

/// The runner's dummy inputs for `items` items like `item` (the dummy image of the maximum
/// size, or the dummy video: its frames of that size), batched on the host and moved to the
/// device (`group_and_batch_mm_kwargs`): an image's `pixel_values [items · patches, C·T·p·p]`
/// (a flat field: the items' rows concatenated), a video's `pixel_values_videos` and, until
/// 0.21, `second_per_grid_ts [items]` (host from 0.22, qwen2_5_vl.py 0.22.1 L1099). The
/// pixels are in the model dtype (floating tensors cast to it, multimodal/processing/context.py
/// 0.19 L225-237), or uint8 where the release normalizes them on the device (0.28 on,
/// `mm_device_do_normalize`). `{image,video}_grid_thw` stay on the host in every release
/// (`keep_on_cpu=True`, qwen2_vl.py 0.15.1 L748-755, 0.19.0 L749-756). Returns the device
/// tensors and the items' grids.
pub fn dummy_pixels(
    rt: &Runtime,
    shape: &Qwen25VlShape,
    items: usize,
    item: Option<ProfileItem>,
    act: DType,
    release: TowerRelease,
) -> Result<(Vec<Tensor>, Vec<Grid>)> {
    let s = &shape.vision;
    let (video, (t, h, w)) = item.map_or((false, shape.dummy_grid()), |i| (i.video, i.grid));
    let grid = (t as usize, h as usize, w as usize);
    let k = s.in_channels * s.temporal_patch_size * s.patch_size * s.patch_size;
    rt.set_op("mm_dummy_batch");
    let rows = items * grid.0 * grid.1 * grid.2;
    let px_name = if video {
        "pixel_values_videos"
    } else {
        "pixel_values"
    };
    let px_dtype = match release.input_norm {
        InputNorm::None => act,
        _ => DType::U8,
    };
    let mut out = vec![rt.tensor(px_name, Category::Activation, &[rows, k], px_dtype)?];
    if video && !release.host_second_per_grid {
        out.push(rt.tensor("second_per_grid_ts", Category::Activation, &[items], act)?);
    }
    Ok((out, vec![grid; items]))
}

/// The test images of tests/qwen2_5_vl_reference.rs and scripts/qwen2_5_vl_reference.py:
/// `pixel_values [Σ t·h·w, C·T·p·p]` whose flat element `i` holds `sin(0.013 · i)`.
pub fn test_pixels(rows: usize, k: usize) -> Vec<f32> {
    (0..rows * k)
        .map(|i| (0.013 * i as f64).sin() as f32)
        .collect()
}

/// The merged embeddings of the test images of `grids` through the tower and merger of the
/// checkpoint at `dir`, computed on the CPU (fp32) by the same load and ops a profile runs.
pub fn encode_test_images(
    dir: &std::path::Path,
    grids: &[(usize, usize, usize)],
) -> Result<Vec<f32>> {
    let source = crate::model::ModelSource::Path {
        path: dir.to_path_buf(),
    };
    let opened = crate::model::open(&source, 0)?;
    let shape = opened.config.qwen2_5_vl.clone().ok_or_else(|| {
        Error::Request(format!(
            "{}: not a qwen2_5_vl (multimodal) checkpoint",
            dir.display()
        ))
    })?;
    let (rt, opts) = vision_check::sim_runtime("sim:h100-80gb", crate::quant::Quant::F16)?;
    let v = Qwen25Vision::load(&rt, &opened.config, opened.source.as_ref(), &opts)?;
    let s = &shape.vision;
    let k = s.in_channels * s.temporal_patch_size * s.patch_size * s.patch_size;
    let rows: usize = grids.iter().map(|(t, h, w)| t * h * w).sum();
    let px = rt.tensor_with_values(
        "pixel_values",
        Category::Activation,
        &[rows, k],
        v.act,
        test_pixels(rows, k),
    )?;
    let out = v.encode(&rt, &px, grids)?;
    ops::read_f32(&rt, &out)?
        .ok_or_else(|| Error::Request("the embeddings were not computed (a dry device)".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 7B's tower weighs its parameters and the rotary cache in bf16.
    #[test]
    fn the_tower_weighs_its_parameters() {
        let (cfg, rt, opts, src) = vision_check::preset_on_h100("qwen2.5-vl-7b");
        let v = Qwen25Vision::load(&rt, &cfg, src.source.as_ref(), &opts).unwrap();
        assert_eq!(v.weight_bytes(), 676_550_144 * 2 + 655_360);
    }
}

//! DeepSeek-V2, DeepSeek-V3/R1 and Kimi-K2 (`model_type` deepseek_v2, deepseek_v3, kimi_k2)
//! as vLLM V1 runs them with multi-head latent attention (`vllm/model_executor/models/
//! deepseek_v2.py`, 0.11.0, 0.15.1 and 0.19.0; docs/reading/vllm-mla.md): the embedding, then
//! layers of RMSNorm, MLA (`layers::mla`), RMSNorm and an MLP — dense in the first
//! `first_k_dense_replace` layers, DeepSeek's MoE after (shared experts beside grouped top-k
//! routed ones) — the final norm and an untied lm_head. Layer 0 clones the embedding into the
//! residual (`residual = hidden_states.clone()`, 0.19 L1106-1108); later layers add and
//! normalise in place. The multi-token-prediction layers a checkpoint holds after
//! `num_hidden_layers` are not loaded (0.19 L1468-1470).

use std::cell::{Cell, RefCell};

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::ops_mla::YarnRope;
use crate::engine::ops_moe_v1::MoeKernel;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_grouped_topk};
use crate::model::batch::Batch;
use crate::model::config::{DeepseekShape, ModelConfig};
use crate::model::layers::decoder::enter_layer;
use crate::model::layers::mla::{self, MlaAttention, MlaRun};
use crate::model::layers::mlp::{load_gated, mlp_forward, GatedAct, MlpRun};
use crate::model::layers::moe_deepseek::{self, DeepseekMoe};
use crate::model::layers::rotary::rotary_cache_sized;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, LoadStats, Loader};
use crate::model::weights::WeightSource;
use crate::quant::{FusedLinear, Linear};

/// A DeepSeek layer's MLP: `DeepseekV2MLP` (`gate_up_proj`, `down_proj`) or `DeepseekV2MoE`.
#[allow(clippy::large_enum_variant)]
pub enum DeepseekMlp {
    Dense {
        gate_up: FusedLinear,
        down: Linear,
        /// This rank's share of `intermediate_size`.
        width: usize,
    },
    Moe(DeepseekMoe),
}

/// `DeepseekV2DecoderLayer` (0.19 L1008-1140).
pub struct DeepseekLayer {
    pub attn: MlaAttention,
    pub mlp: DeepseekMlp,
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
}

impl DeepseekLayer {
    pub fn weight_bytes(&self) -> u64 {
        self.attn.weight_bytes()
            + match &self.mlp {
                DeepseekMlp::Dense { gate_up, down, .. } => {
                    gate_up.weight_bytes() + down.weight_bytes()
                }
                DeepseekMlp::Moe(m) => m.weight_bytes(),
            }
            + self.input_layernorm.nbytes()
            + self.post_attention_layernorm.nbytes()
    }
}

pub struct DeepseekModel {
    pub cfg: ModelConfig,
    pub shape: DeepseekShape,
    pub shard: TpShard,
    pub vocab_first_row: usize,
    pub act: DType,
    /// `[Vp / tp, hidden]`
    pub embed: Tensor,
    pub layers: Vec<DeepseekLayer>,
    /// The shared `cos_sin_cache` (`get_rope` caches one instance for every layer).
    pub rope_cache: Tensor,
    pub norm: Tensor,
    /// `ParallelLMHead`, untied: `[Vp / tp, hidden]`.
    pub lm_head: Tensor,
    /// Every MLA layer's 0-dim f32 scale tensors.
    pub attn_scalars: Vec<Tensor>,
    /// Buffers vLLM's attention-backend selection makes while the model is built (see
    /// `profile::vllm::MlaBackend`), kept as long as the model.
    pub backend_buffers: RefCell<Vec<Tensor>>,
    pub load_stats: LoadStats,
    /// A multimodal model's runner buffer `inputs_embeds [max_num_tokens, hidden]` (Kimi-VL:
    /// V1's `GPUModelRunner.inputs_embeds`): when set, a pass starts from its first rows
    /// instead of the embedding.
    pub inputs_embeds: RefCell<Option<Tensor>>,
    /// vLLM V1's profile run: attention skipped, with its workspace of this many tokens.
    pub skip_attention: Cell<bool>,
    pub workspace_tokens: Cell<usize>,
    /// 0.33's TRITON_MLA: the bytes its profile run reserves in the shared workspace (0: none).
    pub logits_reserve: Cell<u64>,
    /// The release's fused MoE and the modular kernel's persistent workspace.
    pub moe_kernel: Cell<MoeKernel>,
    pub moe_workspace: RefCell<Option<Tensor>>,
    /// 0.11.0's process-wide fp8 device identity (f32 `[1]`, fp8.py L265), made with the
    /// first block-wise linear and never freed.
    pub fp8_identity: Option<Tensor>,
    generation: Cell<u32>,
}

impl DeepseekModel {
    /// Loads every weight through the framework allocator in the order vLLM's constructors
    /// make them: the embedding; per layer the attention's parameters, the rotary cache
    /// (layer 0), the attention layer's scalars, the MLP's, `input_layernorm`,
    /// `post_attention_layernorm` (0.19 L1008-1090); the final norm; the lm_head. 16-bit
    /// weights only.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg.deepseek.clone().ok_or_else(|| {
            Error::Request(format!(
                "model_type '{}' has no multi-head latent attention; load it with its own model file",
                cfg.arch
            ))
        })?;
        if rt.backend() == Backend::Cuda && (0..cfg.num_layers).any(|l| cfg.is_moe_layer(l)) {
            return Err(crate::engine::ops_mla::moe_on_cuda());
        }
        let block_fp8 = src.stored_fp8().is_some_and(|f| f.block.is_some());
        if !block_fp8 {
            opts.require_16bit(
                src,
                &cfg.arch,
                "block-wise fp8 checkpoints (DeepSeek-V3, R1, Kimi-K2 as published) are modelled; other quantized forms are not yet",
            )?;
        }
        let started = std::time::Instant::now();
        let shard = TpShard::of(rt, cfg)?;
        let mut ld = Loader::new(rt, src, opts, cfg.tensor_shapes().len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (h, v, vp) = (cfg.hidden_size, cfg.vocab_size, cfg.padded_vocab());
        let (v_first, v_len) = shard.vocab_rows(vp);
        let embed = ld.vocab_shard("model.embed_tokens.weight", v, h, vp, v_first, v_len)?;
        let (f_first, f_len) = shard.mlp_rows(cfg);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut attn_scalars = Vec::new();
        let mut rope_cache = None;
        for l in 0..cfg.num_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            let attn = mla::load(&mut ld, cfg, &shape, &shard, &a)?;
            if rope_cache.is_none() {
                rope_cache = Some(rotary_cache_sized(
                    rt,
                    rope_positions(cfg, &shape),
                    shape.qk_rope_head_dim,
                    act,
                )?);
            }
            attn_scalars.extend(crate::model::loader::attention_scalars(
                rt,
                &format!("{a}.mla_attn"),
                opts.attn_scalars,
            )?);
            let mlp = if cfg.is_moe_layer(l) {
                DeepseekMlp::Moe(moe_deepseek::load_deepseek_moe(&mut ld, cfg, &shard, &p)?)
            } else {
                let (gate_up, down) = load_gated(
                    &mut ld,
                    &format!("{p}.mlp"),
                    (h, cfg.intermediate_size),
                    (f_first, f_len),
                )?;
                DeepseekMlp::Dense {
                    gate_up,
                    down,
                    width: f_len,
                }
            };
            let input_layernorm = ld.dense(&format!("{p}.input_layernorm.weight"), &[h])?;
            let post_attention_layernorm =
                ld.dense(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
            layers.push(DeepseekLayer {
                attn,
                mlp,
                input_layernorm,
                post_attention_layernorm,
            });
        }
        rt.set_layer(None);
        let norm = ld.dense("model.norm.weight", &[h])?;
        let lm_head = ld.vocab_shard("lm_head.weight", v, h, vp, v_first, v_len)?;
        let rope_cache = match rope_cache {
            Some(c) => c,
            None => {
                rotary_cache_sized(rt, rope_positions(cfg, &shape), shape.qk_rope_head_dim, act)?
            }
        };
        if block_fp8 {
            fp8_block_after_loading(rt, &mut layers, act)?;
        }
        Ok(DeepseekModel {
            cfg: cfg.clone(),
            shape,
            shard,
            vocab_first_row: v_first,
            act,
            embed,
            layers,
            rope_cache,
            norm,
            lm_head,
            attn_scalars,
            backend_buffers: RefCell::new(Vec::new()),
            load_stats: LoadStats {
                total_seconds: started.elapsed().as_secs_f64(),
                ..ld.stats
            },
            inputs_embeds: RefCell::new(None),
            skip_attention: Cell::new(false),
            workspace_tokens: Cell::new(0),
            logits_reserve: Cell::new(0),
            moe_kernel: Cell::new(MoeKernel::InPlace {
                indices_freed_late: true,
            }),
            moe_workspace: RefCell::new(None),
            fp8_identity: ld.fp8_identity.take(),
            generation: Cell::new(0),
        })
    }

    /// Bytes of all weights as stored on the device, with the rotary cache, the attention
    /// scalars and the backend's buffers vLLM adds.
    pub fn weight_bytes(&self) -> u64 {
        self.embed.nbytes()
            + self
                .layers
                .iter()
                .map(DeepseekLayer::weight_bytes)
                .sum::<u64>()
            + self.rope_cache.nbytes()
            + self.norm.nbytes()
            + self.lm_head.nbytes()
            + self.attn_scalars.iter().map(|t| t.nbytes()).sum::<u64>()
            + self.fp8_identity.as_ref().map_or(0, |t| t.nbytes())
            + self
                .backend_buffers
                .borrow()
                .iter()
                .map(|t| t.nbytes())
                .sum::<u64>()
    }

    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// The rotary embedding the attention layers share (`get_rope(qk_rope_head_dim,
    /// is_neox_style=False, rope_parameters)`, 0.19 L918-935).
    fn rope(&self) -> YarnRope {
        let d = &self.shape;
        match &d.yarn {
            Some(y) => YarnRope {
                rotary_dim: d.qk_rope_head_dim,
                base: self.cfg.rope_theta,
                factor: y.factor,
                original_max_position: y.original_max_position_embeddings,
                beta_fast: y.beta_fast,
                beta_slow: y.beta_slow,
                mscale: y.cos_sin_mscale(),
            },
            None => YarnRope {
                rotary_dim: d.qk_rope_head_dim,
                base: self.cfg.rope_theta,
                factor: 1.0,
                original_max_position: self.cfg.max_position_embeddings,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: 1.0,
            },
        }
    }

    /// `DeepseekV2Model.forward` (0.19 L1190-1225) over every token of the batch: the hidden
    /// states `[T, hidden]` after the final norm.
    pub fn forward_hidden(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let cfg = &self.cfg;
        let gen = self.generation.get();
        self.generation.set(gen + 1);
        batch.check_ids(cfg.vocab_size)?;
        let positions: Vec<usize> = batch.seq_lens.iter().flat_map(|&n| 0..n).collect();
        rt.set_layer(None);
        let embedded = if let Some(buf) = self.inputs_embeds.borrow().as_ref() {
            buf.part("inputs_embeds", 0, &[batch.tokens(), cfg.hidden_size])
        } else {
            crate::engine::ops_tp::embed_tokens(
                rt,
                &batch.ids,
                &self.embed,
                self.vocab_first_row,
                cfg.vocab_size,
                self.act,
            )?
        };
        let eps = cfg.rms_norm_eps as f32;
        let run = MlaRun {
            positions: &positions,
            seq_lens: &batch.seq_lens,
            act: self.act,
            generation: gen,
            eps,
            rope: self.rope(),
            skip: self
                .skip_attention
                .get()
                .then(|| self.workspace_tokens.get()),
            logits_reserve: (self.skip_attention.get() && self.logits_reserve.get() > 0)
                .then(|| (self.logits_reserve.get(), &self.moe_workspace)),
        };
        let mut hidden = embedded;
        let mut residual: Option<Tensor> = None;
        let gpu = rt.with_device(|d| d.info().name);
        for (li, layer) in self.layers.iter().enumerate() {
            let l = enter_layer(rt, li, self.layers.len())?;
            // L1104-1110: layer 0 clones its input into the residual and normalises it into
            // a new tensor (the model's loop holds the embedding until the layer returns);
            // later layers add and normalise in place.
            // From 0.25 the embedding itself is the residual (no clone, nothing held).
            let (layer_in, held) = match residual.as_mut() {
                None if !rt.mla_rules().layer0_clone => {
                    let n = ops::rms_norm(
                        rt,
                        &hidden,
                        &layer.input_layernorm,
                        eps,
                        &format!("{l}.input_layernorm"),
                    )?;
                    residual = Some(hidden);
                    (n, None)
                }
                None => {
                    residual = Some(ops::clone(rt, &hidden, &format!("{l}.residual"))?);
                    let n = ops::rms_norm(
                        rt,
                        &hidden,
                        &layer.input_layernorm,
                        eps,
                        &format!("{l}.input_layernorm"),
                    )?;
                    (n, Some(hidden))
                }
                Some(r) => {
                    ops::fused_add_rms_norm(rt, &mut hidden, r, &layer.input_layernorm, eps)?;
                    (hidden, None)
                }
            };
            let mut o = mla::forward(
                rt,
                &layer.attn,
                cfg,
                (&self.shape, &self.shard),
                &layer_in,
                &run,
                &l,
            )?;
            // The attention's input dies as `hidden_states` is rebound to its output.
            drop(layer_in);
            let r = residual.as_mut().expect("set in layer 0");
            // "Fix FP16 overflow" (L1114-1124): in fp16 the attention's output, and in layer 0
            // the residual, are scaled by 1 / routed_scaling_factor in place (the MoE and the
            // dense MLPs keep the stream at that scale; the norms undo it).
            let fp16 = self.act == DType::F16;
            let unscale = 1.0 / self.shape.routed_scaling_factor;
            if fp16 {
                ops_grouped_topk::scale_in_place(rt, &mut o, unscale)?;
                if li == 0 {
                    ops_grouped_topk::scale_in_place(rt, r, unscale)?;
                }
            }
            ops::fused_add_rms_norm(rt, &mut o, r, &layer.post_attention_layernorm, eps)?;
            let out = match &layer.mlp {
                DeepseekMlp::Dense {
                    gate_up,
                    down,
                    width,
                } => {
                    let how = MlpRun {
                        width: *width,
                        act: self.act,
                        activation: GatedAct::Silu,
                        frees_gate_up: false,
                        all_reduce: true,
                        generation: gen,
                    };
                    let mut out = mlp_forward(rt, &o, (gate_up, down), &how, &format!("{l}.mlp"))?;
                    drop(o);
                    // L1131-1137: a dense MLP's output scaled too, in fp16.
                    if fp16 {
                        ops_grouped_topk::scale_in_place(rt, &mut out, unscale)?;
                    }
                    out
                }
                DeepseekMlp::Moe(m) => moe_deepseek::deepseek_moe_forward(
                    rt,
                    o,
                    m,
                    &self.local_cfg(),
                    (self.act, self.moe_kernel.get(), Some(&self.moe_workspace)),
                    &l,
                    &gpu,
                )?,
            };
            // The model's loop rebinds its hidden states: layer 0's input (the embedding)
            // dies here.
            drop(held);
            hidden = out;
        }
        rt.set_layer(None);
        if let Some(mut r) = residual {
            ops::fused_add_rms_norm(rt, &mut hidden, &mut r, &self.norm, eps)?;
            drop(r);
            Ok(hidden)
        } else {
            let n = ops::rms_norm(rt, &hidden, &self.norm, eps, "final.norm")?;
            drop(hidden);
            Ok(n)
        }
    }

    /// The shape this rank computes (each expert's width divided over the ranks).
    fn local_cfg(&self) -> ModelConfig {
        self.shard.local_config(&self.cfg)
    }
}

/// Rows of the rotary cache: `original_max_position_embeddings · factor` under YaRN
/// (deepseek_scaling_rope.py L103-106 at 0.19), `max_position_embeddings` without.
fn rope_positions(cfg: &ModelConfig, d: &DeepseekShape) -> usize {
    match &d.yarn {
        Some(y) => (y.original_max_position_embeddings as f64 * y.factor) as usize,
        None => cfg.max_position_embeddings,
    }
}

/// A block-wise fp8 model's `process_weights_after_loading` (0.19.0 model_loader/utils.py
/// L95-118): first every module's quant method in `named_modules` order — per layer
/// `fused_qkv_a_proj` (or `kv_a_proj_with_mqa`), `q_b_proj` (or `q_proj`), `kv_b_proj`,
/// `o_proj`, then the MLP's `gate_up_proj` and `down_proj` (dense, or the shared experts';
/// the router is 16-bit, `GateLinear`/`ReplicatedLinear` with no quant_config, and the
/// TRITON experts keep what they loaded) — which under 0.11.0 on Hopper transposes each
/// grid (`Fp8BlockLinear::after_loading`) and elsewhere makes nothing; then each MLA layer's
/// own `process_weights_after_loading(act_dtype)`, which keeps a 16-bit copy of `kv_b_proj`
/// for W_UK and W_UV (`Fp8BlockLinear::mla_dequantized`: 0.11.0
/// v1/attention/backends/mla/common.py L985-1074, 0.15.1 layers/attention/mla_attention.py
/// L1245-1332, 0.19.0 L710-797).
fn fp8_block_after_loading(rt: &Runtime, layers: &mut [DeepseekLayer], act: DType) -> Result<()> {
    use crate::model::loader::{fp8_block_after_loading as one, fp8_block_after_loading_fused};
    for (l, layer) in layers.iter_mut().enumerate() {
        rt.set_layer(Some(l as u32));
        let a = &mut layer.attn;
        fp8_block_after_loading_fused(rt, &mut a.a_proj)?;
        one(rt, &mut a.q)?;
        one(rt, &mut a.kv_b)?;
        one(rt, &mut a.o)?;
        match &mut layer.mlp {
            DeepseekMlp::Dense { gate_up, down, .. } => {
                fp8_block_after_loading_fused(rt, gate_up)?;
                one(rt, down)?;
            }
            DeepseekMlp::Moe(m) => {
                if let Some(sh) = &mut m.shared {
                    fp8_block_after_loading_fused(rt, &mut sh.gate_up)?;
                    one(rt, &mut sh.down)?;
                }
            }
        }
    }
    for (l, layer) in layers.iter_mut().enumerate() {
        rt.set_layer(Some(l as u32));
        if let Linear::Fp8Block(kv_b) = &layer.attn.kv_b {
            layer.attn.kv_b_dequantized = Some(kv_b.mla_dequantized(rt, act)?);
        }
    }
    rt.set_layer(None);
    Ok(())
}

//! Llama 4's language model (`model_type` llama4_text: `Llama4ForCausalLM`; llama4: the
//! `language_model` of `Llama4ForConditionalGeneration`) as vLLM runs it
//! (`vllm/model_executor/models/llama4.py` and `mllama4.py`, 0.11.0 and 0.19.0): the
//! embedding, then `Llama4DecoderLayer`s — RMSNorm, attention (`layers::attention_llama4`:
//! chunked local on RoPE layers, global on every `no_rope_layer_interval`-th NoPE layer),
//! RMSNorm, and a dense `LlamaMLP` of `intermediate_size_mlp` or the MoE
//! (`layers::moe_llama4`) in every `interleave_moe_layer_step`-th layer — the final norm and
//! the lm_head. Layer 0 normalises the embedding into a new tensor, later layers add and
//! normalise in place (`LlamaModel.forward`, which `Llama4Model` inherits).
//!
//! A `Llama4ForConditionalGeneration` checkpoint's vision tower and projector
//! (`vision_model.`, `multi_modal_projector.`) are `llama4_vision.rs`'s, loaded before this
//! language model by the profile (`--vllm 0.19`).

use std::cell::{Cell, RefCell};

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::ops;
use crate::engine::ops_moe_v1::MoeKernel;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::model::batch::Batch;
use crate::model::config::{Llama4Shape, ModelConfig};
use crate::model::layers::attention_llama4::{self, Llama4Attention, Llama4AttentionRun};
use crate::model::layers::decoder::enter_layer;
use crate::model::layers::mlp::{load_gated, mlp_forward, GatedAct, MlpRun};
use crate::model::layers::moe_llama4::{self, Llama4Moe};
use crate::model::layers::rotary::rotary_cache_sized;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, LoadStats, Loader};
use crate::model::weights::WeightSource;
use crate::quant::{FusedLinear, Linear};

/// A layer's `feed_forward`: `LlamaMLP` or `Llama4MoE`.
#[allow(clippy::large_enum_variant)]
pub enum Llama4FeedForward {
    Dense {
        gate_up: FusedLinear,
        down: Linear,
        /// This rank's share of `intermediate_size_mlp`.
        width: usize,
    },
    Moe(Llama4Moe),
}

/// `Llama4DecoderLayer` (llama4.py 0.19 L293-352).
pub struct Llama4Layer {
    pub attn: Llama4Attention,
    pub feed_forward: Llama4FeedForward,
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
}

impl Llama4Layer {
    pub fn weight_bytes(&self) -> u64 {
        self.attn.weight_bytes()
            + match &self.feed_forward {
                Llama4FeedForward::Dense { gate_up, down, .. } => {
                    gate_up.weight_bytes() + down.weight_bytes()
                }
                Llama4FeedForward::Moe(m) => m.weight_bytes(),
            }
            + self.input_layernorm.nbytes()
            + self.post_attention_layernorm.nbytes()
    }
}

pub struct Llama4Model {
    pub cfg: ModelConfig,
    pub shape: Llama4Shape,
    pub shard: TpShard,
    pub vocab_first_row: usize,
    pub act: DType,
    /// `[Vp / tp, hidden]`
    pub embed: Tensor,
    pub layers: Vec<Llama4Layer>,
    /// The RoPE layers' shared `cos_sin_cache` (`get_rope` caches one instance); `None` when
    /// no layer turns q and k.
    pub rope_cache: Option<Tensor>,
    pub norm: Tensor,
    /// `[Vp / tp, hidden]`; `None` when tied to the embedding.
    pub lm_head: Option<Tensor>,
    /// Every attention layer's 0-dim f32 scale tensors.
    pub attn_scalars: Vec<Tensor>,
    pub load_stats: LoadStats,
    /// vLLM V1's profile run: attention skipped.
    pub skip_attention: Cell<bool>,
    /// The release's fused MoE and the modular kernel's persistent workspace.
    pub moe_kernel: Cell<MoeKernel>,
    pub moe_workspace: RefCell<Option<Tensor>>,
    /// A multimodal checkpoint's runner buffer `inputs_embeds` (V1 with the tower built):
    /// passes start from it instead of the embedding (`LlamaModel.forward`'s
    /// `inputs_embeds`, llama.py 0.19, which `Llama4Model` inherits).
    pub inputs_embeds: RefCell<Option<Tensor>>,
    generation: Cell<u32>,
}

impl Llama4Model {
    /// Loads every weight through the framework allocator in the order vLLM's constructors
    /// make them: the embedding; per layer the attention's `qkv_proj`, `o_proj`, the rotary
    /// cache (first RoPE layer), the attention layer's scalars, the feed-forward's
    /// parameters, `input_layernorm`, `post_attention_layernorm` (llama4.py 0.19 L199-345);
    /// the final norm; the lm_head. 16-bit weights only.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg.llama4.clone().ok_or_else(|| {
            Error::Request(format!(
                "model_type '{}' has no Llama 4 shape; load it with its own model file",
                cfg.arch
            ))
        })?;
        if rt.backend() == Backend::Cuda {
            return Err(crate::engine::ops_llama4::on_cuda());
        }
        opts.require_16bit(
            src,
            &cfg.arch,
            "its fp8 and int4 checkpoints (the published Maverick FP8, compressed-tensors forms) are not modelled yet",
        )?;
        let started = std::time::Instant::now();
        let shard = TpShard::of(rt, cfg)?;
        let mut ld = Loader::new(rt, src, opts, cfg.tensor_shapes().len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let pre = shape.prefix();
        let (h, v, vp) = (cfg.hidden_size, cfg.vocab_size, cfg.padded_vocab());
        let (v_first, v_len) = shard.vocab_rows(vp);
        let embed = ld.vocab_shard(
            &format!("{pre}model.embed_tokens.weight"),
            v,
            h,
            vp,
            v_first,
            v_len,
        )?;
        let (f_first, f_len) = shard.mlp_rows(cfg);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut attn_scalars = Vec::new();
        let mut rope_cache = None;
        for l in 0..cfg.num_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("{pre}model.layers.{l}");
            let attn = attention_llama4::load(&mut ld, cfg, &shape, &shard, (l, &p))?;
            if attn.rope && rope_cache.is_none() {
                // `Llama3RotaryEmbedding` keeps the plain cache's `max_position` rows
                // (llama3_rope.py 0.19 L11-31).
                rope_cache = Some(rotary_cache_sized(
                    rt,
                    cfg.max_position_embeddings,
                    cfg.head_dim,
                    act,
                )?);
            }
            attn_scalars.extend(crate::model::loader::attention_scalars(
                rt,
                &format!("{p}.self_attn.attn"),
                opts.attn_scalars,
            )?);
            let f = format!("{p}.feed_forward");
            let feed_forward = if cfg.is_moe_layer(l) {
                Llama4FeedForward::Moe(moe_llama4::load(&mut ld, cfg, &shard, &f)?)
            } else {
                let (gate_up, down) =
                    load_gated(&mut ld, &f, (h, cfg.intermediate_size), (f_first, f_len))?;
                Llama4FeedForward::Dense {
                    gate_up,
                    down,
                    width: f_len,
                }
            };
            let input_layernorm = ld.dense(&format!("{p}.input_layernorm.weight"), &[h])?;
            let post_attention_layernorm =
                ld.dense(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
            layers.push(Llama4Layer {
                attn,
                feed_forward,
                input_layernorm,
                post_attention_layernorm,
            });
        }
        rt.set_layer(None);
        let norm = ld.dense(&format!("{pre}model.norm.weight"), &[h])?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(ld.vocab_shard(&format!("{pre}lm_head.weight"), v, h, vp, v_first, v_len)?)
        };
        Ok(Llama4Model {
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
            load_stats: LoadStats {
                total_seconds: started.elapsed().as_secs_f64(),
                ..ld.stats
            },
            skip_attention: Cell::new(false),
            moe_kernel: Cell::new(MoeKernel::InPlace {
                indices_freed_late: true,
            }),
            moe_workspace: RefCell::new(None),
            inputs_embeds: RefCell::new(None),
            generation: Cell::new(0),
        })
    }

    /// Bytes of all weights as stored on the device, with the rotary cache and the attention
    /// scalars vLLM adds.
    pub fn weight_bytes(&self) -> u64 {
        self.embed.nbytes()
            + self
                .layers
                .iter()
                .map(Llama4Layer::weight_bytes)
                .sum::<u64>()
            + self.rope_cache.as_ref().map_or(0, |t| t.nbytes())
            + self.norm.nbytes()
            + self.lm_head.as_ref().map_or(0, |t| t.nbytes())
            + self.attn_scalars.iter().map(|t| t.nbytes()).sum::<u64>()
    }

    pub fn lm_head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// `LlamaModel.forward` with `Llama4DecoderLayer`s (llama4.py 0.19 L331-352) over every
    /// token of the batch: the hidden states `[T, hidden]` after the final norm.
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
        let local = self.shard.local_config(cfg);
        let m = local
            .moe
            .clone()
            .ok_or_else(|| Error::Request("llama4: no experts in the config".into()))?;
        let eps = cfg.rms_norm_eps as f32;
        let inv_freq = attention_llama4::inv_freq(cfg, &self.shape);
        let run = Llama4AttentionRun {
            positions: &positions,
            seq_lens: &batch.seq_lens,
            shape: local.attn_shape(),
            inv_freq: &inv_freq,
            shapes: &self.shape,
            eps,
            skip: self.skip_attention.get(),
            generation: gen,
            act: self.act,
        };
        let gpu = rt.with_device(|d| d.info().name);
        let mut residual = embedded;
        let mut hidden: Option<Tensor> = None;
        for (li, layer) in self.layers.iter().enumerate() {
            let l = enter_layer(rt, li, self.layers.len())?;
            // `Llama4DecoderLayer.forward`: layer 0 normalises the embedding into a new
            // tensor; later layers add the previous output into the residual and normalise
            // in place, the model's loop holding that output until the layer returns.
            let (layer_in, fresh) = match hidden.take() {
                None => (
                    ops::rms_norm(
                        rt,
                        &residual,
                        &layer.input_layernorm,
                        eps,
                        &format!("{l}.input_layernorm"),
                    )?,
                    true,
                ),
                Some(mut x) => {
                    ops::fused_add_rms_norm(
                        rt,
                        &mut x,
                        &mut residual,
                        &layer.input_layernorm,
                        eps,
                    )?;
                    (x, false)
                }
            };
            let mut o = attention_llama4::forward(rt, &layer.attn, &layer_in, &run, &l)?;
            let kept = if fresh {
                drop(layer_in);
                None
            } else {
                Some(layer_in)
            };
            ops::fused_add_rms_norm(
                rt,
                &mut o,
                &mut residual,
                &layer.post_attention_layernorm,
                eps,
            )?;
            let out = match &layer.feed_forward {
                Llama4FeedForward::Dense {
                    gate_up,
                    down,
                    width,
                } => {
                    let how = MlpRun {
                        width: *width,
                        act: self.act,
                        activation: GatedAct::Silu,
                        frees_gate_up: true,
                        all_reduce: true,
                        generation: gen,
                    };
                    let out = mlp_forward(rt, &o, (gate_up, down), &how, &format!("{l}.mlp"))?;
                    drop(o);
                    out
                }
                Llama4FeedForward::Moe(moe) => moe_llama4::forward(
                    rt,
                    o,
                    moe,
                    &m,
                    (self.act, self.moe_kernel.get(), &self.moe_workspace),
                    &l,
                    &gpu,
                )?,
            };
            drop(kept);
            hidden = Some(out);
        }
        rt.set_layer(None);
        match hidden {
            Some(mut h) => {
                ops::fused_add_rms_norm(rt, &mut h, &mut residual, &self.norm, eps)?;
                drop(residual);
                Ok(h)
            }
            None => ops::rms_norm(rt, &residual, &self.norm, eps, "final.norm"),
        }
    }
}

//! vLLM's `LlamaForCausalLM` (`model_executor/models/llama.py`, followed from 380e1863 through
//! the V1 releases) and the model files built the same way, each a row of the registry with its
//! twists: Mistral (llama.py itself), Qwen2 and Qwen3 (qwen2.py, qwen3.py: q/k/v bias, per-head
//! q/k norms, Qwen2's MLP), Phi-3 (phi3.py: packed checkpoint names), and the mixtures of
//! experts Mixtral, Qwen2-MoE and Qwen3-MoE (mixtral.py, qwen2_moe.py, qwen3_moe.py at 0.8.5:
//! a sparse block in place of the MLP). The model holds the weights of every Llama-shaped
//! family; Gemma's decoder layers run in `gemma.rs`.
//!
//! The forward pass: embedding, pre-norm decoder layers (RMSNorm, RoPE, causal GQA attention,
//! SwiGLU MLP or a sparse block), final norm; the logits of the last token of each sequence
//! come from `sampler`, as vLLM's profile run computes them.

use std::cell::Cell;

use crate::base::error::{Error, Result};
use crate::engine::ops;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
pub use crate::model::batch::Batch;
use crate::model::config::ModelConfig;
use crate::model::layers::attention::{self, AttentionBuild, AttentionRun, AttentionState};
use crate::model::layers::decoder::{enter_layer, DecoderRun, MoeRun};
pub use crate::model::layers::decoder::{Layer, Mlp};
use crate::model::layers::mlp::{self, GatedAct, MlpRun};
pub use crate::model::layers::moe::{moe_block_forward, MoeBlock, SharedExpert};
use crate::model::layers::norm::RmsNormKind;
use crate::model::layers::rotary::rotary_cache;
pub use crate::model::layers::tp::TpShard;
use crate::model::loader::{
    fp8_after_loading, fp8_block_after_loading, fp8_block_after_loading_fused,
    fp8_fused_after_loading, fp8_stored_fused_after_loading, fp8_stored_linear_after_loading,
    marlin_after_loading, marlin_fused_after_loading, nvfp4_after_loading,
    nvfp4_fused_after_loading, sparse24_after_loading, sparse24_fused_after_loading, Loader,
};
pub use crate::model::loader::{LoadOptions, LoadStats};
use crate::model::models::registry::{Decoder, Family};
use crate::model::weights::WeightSource;
use crate::quant::Quant;

pub struct LlamaModel {
    pub cfg: ModelConfig,
    /// The registry's entry for `cfg.arch`: which decoder and which twists.
    pub family: &'static Family,
    /// The shape this rank computes: heads, KV heads and the MLP width divided over the
    /// tensor-parallel ranks (`cfg` itself with one GPU).
    pub local: ModelConfig,
    /// This rank's first row of the padded vocabulary (0 with one GPU).
    pub vocab_first_row: usize,
    pub quant: Quant,
    pub act: DType,
    /// `None` on a pipeline stage that neither embeds nor ties its lm_head to the embedding.
    pub embed: Option<Tensor>,
    /// This stage's decoder layers (every layer without pipeline parallel); `layers[0]` is the
    /// model's layer `first_layer`.
    pub layers: Vec<Layer>,
    pub first_layer: usize,
    /// The final norm: `None` on a pipeline stage before the last.
    pub norm: Option<Tensor>,
    /// What this pipeline stage builds besides its layers (`None`: no pipeline parallel).
    pub stage: Option<crate::model::layers::pp::StageParts>,
    /// A stage after the first: the runner's `intermediate_tensors`, hidden states and
    /// residual `[max_num_tokens, hidden]` each in the model dtype, made at its first pass and
    /// kept (gpu_model_runner.py 0.19 L5437-5451, `make_empty_intermediate_tensors`).
    pub stage_input: std::cell::RefCell<Option<(Tensor, Tensor)>>,
    /// `[Vp, hidden]`, 16-bit (bitsandbytes leaves it unquantized); `None` when tied to the
    /// embedding.
    pub lm_head: Option<Tensor>,
    /// The rotary embedding's `cos_sin_cache` `[max_position, head_dim]` in the model dtype:
    /// vLLM makes it on the device when it builds the model (rotary_embedding.py
    /// `RotaryEmbedding.__init__`), one per model (`get_rope` caches it), and it stays. Our
    /// kernels compute cos and sin themselves; the buffer is here for its bytes.
    pub rope_cache: Tensor,
    /// Gemma 3's second cache: its global layers' base and linear scaling differ from the
    /// sliding layers', so `get_rope` makes another (rotary_embedding.py L1494-1497 at 0.8.5).
    pub rope_cache_global: Option<Tensor>,
    /// Gemma's `normalizer` buffer (`torch.tensor(hidden_size**0.5)` in the model dtype,
    /// gemma2.py L269-270 at 0.6.4).
    pub normalizer: Option<Tensor>,
    /// vLLM 0.8.5's process-wide fp8 device identity (f32 `[1]`), made with the first fp8
    /// linear of a block-wise checkpoint and never freed.
    pub fp8_identity: Option<Tensor>,
    /// Every attention layer's 0-dim f32 scale tensors (`LoadOptions::attn_scalars` each).
    pub attn_scalars: Vec<Tensor>,
    /// How fast the weights came off the source (zero on a dry run, which reads nothing).
    pub load_stats: LoadStats,
    /// The MLP drops `gate_up` as soon as the activation has read it, before `down_proj`
    /// (vLLM #10339, from 0.6.4 on; Qwen2's MLP never did). Off: 380e1863's MLP, which keeps
    /// it until the MLP returns.
    pub mlp_frees_gate_up: bool,
    /// vLLM V1's profile run: attention layers return zeros without running (no metadata).
    pub skip_attention: std::cell::Cell<bool>,
    /// Gemma 1 and 2 scale the embedding by `normalizer` into a new tensor (vLLM 0.19 on),
    /// not in place.
    pub normalizer_out_of_place: bool,
    /// A multimodal model's runner buffer `inputs_embeds [max_num_tokens, hidden]` (V1's
    /// `GPUModelRunner.inputs_embeds`, gpu_model_runner.py 0.11 L355-358): when set, a pass
    /// starts from a view of it instead of the embedding (`_dummy_run` L3087-3094 with
    /// `supports_mm_inputs`), unscaled (gemma3.py 0.11 L401-402).
    pub inputs_embeds: std::cell::RefCell<Option<Tensor>>,
    /// The release's fused MoE (0.8.5's in place unless set).
    pub moe_kernel: crate::engine::ops_moe_v1::MoeKernel,
    /// V1's modular fused MoE keeps one workspace for every layer, grown in the first MoE
    /// layer of the profile run and never freed (0.19.0 v1/worker/workspace.py).
    pub moe_workspace: std::cell::RefCell<Option<Tensor>>,
    generation: Cell<u32>,
}

impl LlamaModel {
    /// Loads (and quantizes) every weight through the framework allocator, one tensor at a
    /// time, checking each shape against the config.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let started = std::time::Instant::now();
        let family = cfg.family().ok_or_else(|| {
            Error::Request(format!(
                "model_type '{}' has no model file here (expected {})",
                cfg.arch,
                crate::model::models::registry::supported_list()
            ))
        })?;
        let gemma = family.decoder == Decoder::Gemma;
        if cfg.moe.is_some() {
            // The quantized fused-MoE methods are not reproduced, but for block-wise fp8
            // experts (`Fp8MoEMethod` with `block_quant`, dry: `Loader::experts_fp8_block`)
            // and online fp8 ones (`Fp8OnlineMoEMethod`: `quant::fp8_moe`).
            let block_fp8 = src.stored_fp8().is_some_and(|f| f.block.is_some());
            let online_fp8 = opts.quant == Quant::Fp8 && src.stored_fp8().is_none();
            let sixteen = matches!(opts.quant, Quant::F16 | Quant::BF16) || online_fp8;
            let other_fp8 = src.stored_fp8().is_some() && !block_fp8;
            if (!sixteen && !block_fp8)
                || other_fp8
                || src.packed4().is_some()
                || src.nvfp4().is_some()
                || src.sparse24().is_some()
            {
                return Err(Error::Request(format!(
                    "model_type {} (mixture of experts) runs in 16 bits only: vLLM's quantized fused-MoE methods are not modelled yet",
                    cfg.arch
                )));
            }
        }
        let shard = TpShard::of(rt, cfg)?;
        let local = shard.local_config(cfg);
        // A pipeline stage builds its own layers, and the embedding, norm and lm_head only
        // where vLLM does (`PPMissingLayer` elsewhere).
        let pp = rt.pp();
        let (layer_range, stage) = match &pp {
            Some(p) => (
                p.layers.clone(),
                Some(crate::model::layers::pp::StageParts::of(
                    p.stage,
                    p.stages,
                    cfg.tie_word_embeddings,
                )),
            ),
            None => (0..cfg.num_layers, None),
        };
        let builds_embedding = stage.is_none_or(|s| s.embedding);
        let last_stage = stage.is_none_or(|s| s.last);
        let mut ld = Loader::new(rt, src, opts, cfg.loader_reads());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        // vLLM's VocabParallelEmbedding and ParallelLMHead pad the vocabulary to 64 rows
        // (vocab_parallel_embedding.py L16, L47-50): the padding is allocated too.
        let vp = cfg.padded_vocab();
        let (v_first, v_len) = shard.vocab_rows(vp);
        let embed = if builds_embedding {
            Some(ld.vocab_shard("model.embed_tokens.weight", v, h, vp, v_first, v_len)?)
        } else {
            None
        };
        let i_part = shard.mlp_rows(cfg);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let fp8 = src.stored_fp8().is_some() || opts.quant == Quant::Fp8;
        // Block-wise fp8 (0.8.5 and the V1 releases): its Fp8KVCacheMethod.
        let block_fp8 = src.stored_fp8().is_some_and(|f| f.block.is_some());
        let build = AttentionBuild {
            q_part: shard.q_rows(cfg),
            kv_part: shard.kv_rows(cfg),
            fused_checkpoint: family.fused_checkpoint,
            qk_norm: family.qk_norm,
            // Qwen3Attention.__init__ makes q_norm and k_norm after the attention layer,
            // Gemma3Attention before the rotary embedding (gemma3.py L144-170 at 0.8.5).
            qk_norm_first: gemma,
            fp8,
            block_fp8,
            attn_scalars: opts.attn_scalars,
        };
        let mut attn_state = AttentionState::default();
        // In the order vLLM's constructors create the parameters (llama.py at 380e1863):
        // qkv_proj, o_proj (and the rotary cache, with the first layer), gate_up_proj,
        // down_proj, then the two norms.
        for l in layer_range.clone() {
            rt.set_layer(Some(l as u32));
            let p = format!("model.layers.{l}");
            let attn = attention::load(&mut ld, rt, cfg, l, &build, &mut attn_state)?;
            let mlp = match (cfg.moe.as_ref().filter(|_| cfg.is_moe_layer(l)), family.moe) {
                (Some(m), Some(names)) => Mlp::Moe(crate::model::layers::moe::load_moe_block(
                    &mut ld,
                    cfg,
                    (m, names),
                    &shard,
                    &p,
                )?),
                (Some(_), None) => {
                    return Err(Error::Request(format!(
                        "model_type {}: experts in a family with no sparse block",
                        cfg.arch
                    )))
                }
                (None, _) => {
                    let (gate_up, down) =
                        mlp::load_dense(&mut ld, cfg, &p, i_part, family.fused_checkpoint)?;
                    Mlp::Dense { gate_up, down }
                }
            };
            let input_norm = ld.dense(&format!("{p}.input_layernorm.weight"), &[h])?;
            let post_norm = ld.dense(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
            let ff_norms = if family.feedforward_norms {
                Some((
                    ld.dense(&format!("{p}.pre_feedforward_layernorm.weight"), &[h])?,
                    ld.dense(&format!("{p}.post_feedforward_layernorm.weight"), &[h])?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                attn,
                mlp,
                input_norm,
                post_norm,
                ff_norms,
            });
        }
        let AttentionState {
            rope_cache,
            rope_cache_global,
            attn_scalars,
            kv_scales,
        } = attn_state;
        let (rope_cache, rope_cache_global) = match (rope_cache, rope_cache_global) {
            (Some(c), g) => (c, g),
            (None, Some(g)) => (g, None),
            (None, None) => (rotary_cache(rt, cfg, act, cfg.layer_rope(0))?, None),
        };
        rt.set_layer(None);
        let norm = if last_stage {
            Some(ld.dense("model.norm.weight", &[h])?)
        } else {
            None
        };
        // Gemma's `register_buffer("normalizer", ...)` after the final norm: one element in
        // the model dtype.
        let normalizer = if gemma {
            rt.set_op("load");
            Some(rt.tensor("model.normalizer", Category::Weight, &[1], act)?)
        } else {
            None
        };
        // bitsandbytes leaves lm_head in 16 bits.
        let lm_head = if cfg.tie_word_embeddings || !last_stage {
            None
        } else {
            Some(ld.vocab_shard("lm_head.weight", v, h, vp, v_first, v_len)?)
        };
        let first = layer_range.start;
        if block_fp8 {
            // Block-wise fp8: the linears keep what they loaded (0.8.5 fp8.py L306-323; 0.15.1,
            // 0.19.0), or on Hopper under 0.11.0 transpose their grids (fp8_block.rs);
            // each attention layer's `Fp8KVCacheMethod.process_weights_after_loading`
            // (kv_cache.py L49-137, kv-cache dtype auto) compares `q_scale` and then
            // `prob_scale` with 0 (a 0-dim bool on the device each, freed once read, L103 and
            // L110), then deletes k, v, q and prob scales (L134-137), after qkv_proj and
            // o_proj in `named_modules` order.
            for (l, kv) in kv_scales.into_iter().enumerate() {
                rt.set_layer(Some((first + l) as u32));
                // 0.11.0 on Hopper: each linear's grid transposed (`Fp8BlockLinear::
                // after_loading`), qkv_proj and o_proj before the attention's scales.
                let layer = &mut layers[l];
                fp8_block_after_loading_fused(rt, &mut layer.attn.qkv)?;
                fp8_block_after_loading(rt, &mut layer.attn.o)?;
                rt.set_op("fp8.kv_cache_scales");
                for n in ["q_scale_gt_0", "prob_scale_gt_0"] {
                    let flag = rt.tensor(
                        format!("model.layers.{}.self_attn.attn.{n}", first + l),
                        Category::Weight,
                        &[],
                        DType::U8,
                    )?;
                    drop(flag);
                }
                drop(kv);
                if let Mlp::Dense { gate_up, down } = &mut layers[l].mlp {
                    fp8_block_after_loading_fused(rt, gate_up)?;
                    fp8_block_after_loading(rt, down)?;
                }
            }
            rt.set_layer(None);
        } else if let Some(f) = src.stored_fp8() {
            // A stored fp8 checkpoint: each layer's shards requantized at their largest
            // scale (ModelOpt's only where they differ), once every weight is loaded, in
            // `named_modules` order.
            let mo = f.modelopt;
            let t = std::time::Instant::now();
            layers = layers
                .into_iter()
                .enumerate()
                .zip(kv_scales)
                .map(|((l, mut layer), kv)| {
                    rt.set_layer(Some((first + l) as u32));
                    layer.attn.qkv = fp8_stored_fused_after_loading(rt, layer.attn.qkv, mo)?;
                    layer.attn.o = fp8_stored_linear_after_loading(rt, layer.attn.o, mo)?;
                    // `named_modules`: qkv_proj, o_proj, rotary_emb, attn, then the MLP.
                    drop(kv);
                    layer.mlp = match layer.mlp {
                        Mlp::Dense { gate_up, down } => Mlp::Dense {
                            gate_up: fp8_stored_fused_after_loading(rt, gate_up, mo)?,
                            down: fp8_stored_linear_after_loading(rt, down, mo)?,
                        },
                        moe => moe,
                    };
                    Ok(layer)
                })
                .collect::<Result<Vec<_>>>()?;
            rt.set_layer(None);
            ld.stats.quantize_seconds += t.elapsed().as_secs_f64();
        } else if src.sparse24().is_some() {
            // 2:4: each layer decompressed (bitmask form) and compressed by CUTLASS once every
            // weight is loaded, in `named_modules` order.
            let t = std::time::Instant::now();
            for (l, layer) in layers.iter_mut().enumerate() {
                rt.set_layer(Some((first + l) as u32));
                sparse24_fused_after_loading(rt, &mut layer.attn.qkv, act)?;
                sparse24_after_loading(rt, &mut layer.attn.o, act)?;
                if let Mlp::Dense { gate_up, down } = &mut layer.mlp {
                    sparse24_fused_after_loading(rt, gate_up, act)?;
                    sparse24_after_loading(rt, down, act)?;
                }
            }
            rt.set_layer(None);
            ld.stats.quantize_seconds += t.elapsed().as_secs_f64();
        } else if src.nvfp4().is_some() {
            // NVFP4: each layer repacked for Marlin FP4 once every weight is loaded, in
            // `named_modules` order.
            let t = std::time::Instant::now();
            for (l, layer) in layers.iter_mut().enumerate() {
                rt.set_layer(Some((first + l) as u32));
                nvfp4_fused_after_loading(rt, &mut layer.attn.qkv, act)?;
                nvfp4_after_loading(rt, &mut layer.attn.o, act)?;
                if let Mlp::Dense { gate_up, down } = &mut layer.mlp {
                    nvfp4_fused_after_loading(rt, gate_up, act)?;
                    nvfp4_after_loading(rt, down, act)?;
                }
            }
            rt.set_layer(None);
            ld.stats.quantize_seconds += t.elapsed().as_secs_f64();
        } else if src.packed4().is_some() {
            // AWQ / GPTQ: each layer repacked for Marlin once every weight is loaded, in
            // `named_modules` order.
            let t = std::time::Instant::now();
            for (l, layer) in layers.iter_mut().enumerate() {
                rt.set_layer(Some((first + l) as u32));
                marlin_fused_after_loading(rt, &mut layer.attn.qkv, act)?;
                marlin_after_loading(rt, &mut layer.attn.o, act)?;
                if let Mlp::Dense { gate_up, down } = &mut layer.mlp {
                    marlin_fused_after_loading(rt, gate_up, act)?;
                    marlin_after_loading(rt, down, act)?;
                }
            }
            rt.set_layer(None);
            ld.stats.quantize_seconds += t.elapsed().as_secs_f64();
        } else if opts.quant == Quant::Fp8 {
            // In flight, vLLM quantizes once every weight is loaded, in `named_modules` order.
            let t = std::time::Instant::now();
            for ((l, layer), kv) in layers.iter_mut().enumerate().zip(kv_scales) {
                rt.set_layer(Some((first + l) as u32));
                fp8_fused_after_loading(rt, &mut layer.attn.qkv)?;
                fp8_after_loading(rt, &mut layer.attn.o)?;
                drop(kv);
                if let Mlp::Dense { gate_up, down } = &mut layer.mlp {
                    fp8_fused_after_loading(rt, gate_up)?;
                    fp8_after_loading(rt, down)?;
                }
            }
            rt.set_layer(None);
            ld.stats.quantize_seconds += t.elapsed().as_secs_f64();
        }
        Ok(LlamaModel {
            cfg: cfg.clone(),
            family,
            local,
            vocab_first_row: v_first,
            quant: opts.quant,
            act,
            embed,
            layers,
            first_layer: first,
            norm,
            stage,
            stage_input: std::cell::RefCell::new(None),
            lm_head,
            rope_cache,
            rope_cache_global,
            normalizer,
            fp8_identity: ld.fp8_identity.take(),
            attn_scalars,
            load_stats: LoadStats {
                total_seconds: started.elapsed().as_secs_f64(),
                ..ld.stats
            },
            mlp_frees_gate_up: false,
            skip_attention: std::cell::Cell::new(false),
            normalizer_out_of_place: false,
            inputs_embeds: std::cell::RefCell::new(None),
            moe_kernel: crate::engine::ops_moe_v1::MoeKernel::InPlace {
                indices_freed_late: false,
            },
            moe_workspace: std::cell::RefCell::new(None),
            generation: Cell::new(0),
        })
    }

    /// Bytes of all weights as stored on the device.
    pub fn weight_bytes(&self) -> u64 {
        let mut b = self.embed.as_ref().map_or(0, |t| t.nbytes())
            + self.norm.as_ref().map_or(0, |t| t.nbytes())
            + self.rope_cache.nbytes();
        b += self.rope_cache_global.as_ref().map_or(0, |t| t.nbytes());
        b += self.normalizer.as_ref().map_or(0, |t| t.nbytes());
        b += self.fp8_identity.as_ref().map_or(0, |t| t.nbytes());
        b += self.attn_scalars.iter().map(|t| t.nbytes()).sum::<u64>();
        b += self.layers.iter().map(Layer::weight_bytes).sum::<u64>();
        b + self.lm_head.as_ref().map_or(0, |t| t.nbytes())
    }

    /// The output projection over the padded vocabulary, `[Vp, hidden]`: `None` on a
    /// pipeline stage before the last.
    pub fn lm_head(&self) -> Option<&Tensor> {
        if self.stage.is_some_and(|s| !s.last) {
            return None;
        }
        self.lm_head.as_ref().or(self.embed.as_ref())
    }

    /// One forward pass without the sampler: the f32 logits `[seqs, vocab]` of the last token of
    /// each sequence (on rank 0 of a tensor-parallel instance; the other ranks send their shard
    /// and get an error).
    pub fn forward(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let hidden = self.forward_hidden(rt, batch)?;
        let rows = crate::model::sampler::last_token_rows(&batch.seq_lens);
        let head = crate::model::sampler::LogitsHead {
            weight: self.lm_head().ok_or_else(no_lm_head)?,
            bias: None,
            mods: self.cfg.logits_mods(),
        };
        crate::model::sampler::logits_f32(rt, &hidden, head, &rows, self.cfg.vocab_size)?
            .ok_or_else(|| {
                Error::Request("the logits were gathered to tensor-parallel rank 0".into())
            })
    }

    /// How this model's dense MLPs run in generation `gen`.
    fn mlp_run(&self, gen: u32) -> MlpRun {
        let gemma = self.family.decoder == Decoder::Gemma;
        MlpRun {
            width: self.local.intermediate_size,
            act: self.act,
            activation: if gemma {
                GatedAct::GeluTanh
            } else {
                GatedAct::Silu
            },
            // Gemma2MLP/Gemma3MLP keep `gate_up` named until they return, in every release
            // (gemma2.py L78-82 at 0.6.4, L79-83 at 0.8.5; gemma3.py L85-89 at 0.8.5), as
            // Qwen2's MLP does.
            frees_gate_up: self.mlp_frees_gate_up && self.family.mlp_frees_gate_up,
            all_reduce: true,
            generation: gen,
        }
    }

    /// How layer `li`'s attention runs over `batch` in generation `gen`.
    fn attention_run<'a>(
        &self,
        li: usize,
        positions: &'a [usize],
        batch: &'a Batch,
        gen: u32,
    ) -> AttentionRun<'a> {
        let gemma = self.family.decoder == Decoder::Gemma;
        AttentionRun {
            positions,
            seq_lens: &batch.seq_lens,
            shape: crate::device::cpu::AttnShape {
                mods: self.cfg.score_mods(li),
                ..self.local.attn_shape()
            },
            rope: self.cfg.layer_rope(li),
            scaling: self.cfg.rope_scaling.clone(),
            qk_norm: if gemma {
                RmsNormKind::Gemma
            } else {
                RmsNormKind::Rms
            },
            eps: self.local.rms_norm_eps as f32,
            skip: self.skip_attention.get(),
            generation: gen,
            act: self.act,
        }
    }

    /// One forward pass over every token, as vLLM's `LlamaModel.forward`: the final hidden
    /// states `[tokens, hidden]` in the model dtype, after the last norm. The logits come from
    /// `sampler::compute_logits`.
    pub fn forward_hidden(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        // A stage before the last sends its residual on with the hidden states; only the
        // hidden states are asked for here.
        self.forward_stage(rt, batch)
            .map(|(hidden, _residual)| hidden)
    }

    /// One pass of this model, or of this pipeline stage: the final hidden states after the
    /// last norm, or on a stage before the last the hidden states and the residual it sends
    /// to the next stage (llama.py 0.19 L430-433: `IntermediateTensors`, no final norm).
    pub fn forward_stage(&self, rt: &Runtime, batch: &Batch) -> Result<(Tensor, Option<Tensor>)> {
        let cfg = &self.cfg;
        let gen = self.generation.get();
        self.generation.set(gen + 1);
        batch.check_ids(cfg.vocab_size)?;
        let act = self.act;
        let positions: Vec<usize> = batch.seq_lens.iter().flat_map(|&n| 0..n).collect();
        // The GPU's name picks fused MoE's tuned Triton config.
        let gpu = rt.with_device(|d| d.info().name);
        rt.set_layer(None);
        let receives = self.stage.is_some_and(|s| s.receives);
        // A later stage starts from what the previous one sent: its runner's persistent
        // buffers, sliced to the batch (`sync_and_slice_intermediate_tensors`, views).
        let (residual, received) = if receives {
            let (h, r) = self.stage_input(rt, batch.tokens())?;
            (r, Some(h))
        } else if let Some(buf) = self.inputs_embeds.borrow().as_ref() {
            (
                buf.part("inputs_embeds", 0, &[batch.tokens(), cfg.hidden_size]),
                None,
            )
        } else {
            let embed = self.embed.as_ref().ok_or_else(|| {
                Error::Request("the first pipeline stage has no embedding".into())
            })?;
            // The embedding output becomes the residual stream.
            let residual = if rt.tp().is_some() {
                crate::engine::ops_tp::vocab_parallel_embedding(
                    rt,
                    &batch.ids,
                    embed,
                    self.vocab_first_row,
                    cfg.vocab_size,
                    act,
                )?
            } else {
                ops::embedding(rt, &batch.ids, embed, act)?
            };
            (residual, None)
        };
        let attention = |li| self.attention_run(li, &positions, batch, gen);
        let run = DecoderRun {
            layers: &self.layers,
            first_layer: self.first_layer,
            attention: &attention,
            dense: self.mlp_run(gen),
            moe: MoeRun {
                shape: self.local.moe.as_ref(),
                act,
                gpu: &gpu,
                kernel: self.moe_kernel.for_arch(&cfg.arch),
                workspace: &self.moe_workspace,
            },
            final_norm: self.norm.as_ref(),
            eps: cfg.rms_norm_eps as f32,
        };
        if self.stage.is_some() && self.family.decoder != Decoder::Llama {
            return Err(crate::model::layers::pp::refused(&cfg.arch));
        }
        match self.family.decoder {
            Decoder::Gemma => {
                // Gemma 3 always scales into a new tensor; Gemma 1 and 2 in place up to 0.15
                // and into a new one from 0.19 on (`embed_input_ids` returns
                // `embed_tokens(ids) * normalizer`, gemma.py L296, gemma2.py L287 at 0.19).
                let scale_new = cfg.arch == "gemma3_text" || self.normalizer_out_of_place;
                let scale = match self.inputs_embeds.borrow().is_some() {
                    true => None,
                    false => Some(scale_new),
                };
                super::gemma::forward_layers(rt, &run, cfg, act, residual, scale).map(|h| (h, None))
            }
            Decoder::Granite => {
                super::granite::forward_layers(rt, &run, cfg, residual).map(|h| (h, None))
            }
            Decoder::Llama
            | Decoder::Opt
            | Decoder::Phi
            | Decoder::Deepseek
            | Decoder::GptOss
            | Decoder::Llama4
            | Decoder::Qwen3Next => forward_layers(rt, &run, residual, received),
        }
    }

    /// Views of this stage's received hidden states and residual for `tokens` tokens; the
    /// buffers are made at the first pass, `tokens` rows each (the profile pass's
    /// max_num_tokens), and kept.
    fn stage_input(&self, rt: &Runtime, tokens: usize) -> Result<(Tensor, Tensor)> {
        let h = self.cfg.hidden_size;
        let mut cell = self.stage_input.borrow_mut();
        if cell.is_none() {
            rt.set_op("make_empty_intermediate_tensors");
            let make = |name: &str| {
                rt.tensor(
                    format!("intermediate_tensors.{name}"),
                    Category::Activation,
                    &[tokens, h],
                    self.act,
                )
            };
            *cell = Some((make("hidden_states")?, make("residual")?));
        }
        let (hb, rb) = cell.as_ref().expect("made above");
        if tokens > hb.rows() {
            return Err(Error::Request(format!(
                "pipeline stage input: {tokens} tokens, more than the {} of max_num_tokens",
                hb.rows()
            )));
        }
        Ok((
            hb.part("intermediate_tensors.hidden_states", 0, &[tokens, h]),
            rb.part("intermediate_tensors.residual", 0, &[tokens, h]),
        ))
    }
}

/// A stage before the last asked for logits.
fn no_lm_head() -> Error {
    Error::Request(
        "a pipeline stage before the last has no lm_head: the last stage computes the logits"
            .into(),
    )
}

impl LlamaModel {}

/// vLLM's `LlamaModel.forward` (llama.py at 380e1863) from the embedding on: layer 0
/// normalises into a new tensor, every later norm is `fused_add_rms_norm` in place, the final
/// one too.
fn forward_layers(
    rt: &Runtime,
    run: &DecoderRun,
    mut residual: Tensor,
    received: Option<Tensor>,
) -> Result<(Tensor, Option<Tensor>)> {
    let eps = run.eps;
    // A later pipeline stage's first layer finds `residual` given (`intermediate_tensors`)
    // and normalises into it in place, as every later layer does.
    let mut hidden: Option<Tensor> = received;
    let of = run.first_layer + run.layers.len();
    for (i, layer) in run.layers.iter().enumerate() {
        let li = run.first_layer + i;
        let fresh = hidden.is_none();
        let l = enter_layer(rt, li, of)?;
        // LlamaDecoderLayer.forward: `hidden_states` of the previous layer is held by the
        // model's loop until this layer returns.
        let layer_in = match hidden.take() {
            None => ops::rms_norm(
                rt,
                &residual,
                &layer.input_norm,
                eps,
                &format!("{l}.input_norm"),
            )?,
            Some(mut h) => {
                ops::fused_add_rms_norm(rt, &mut h, &mut residual, &layer.input_norm, eps)?;
                h
            }
        };
        let mut o = attention::forward(rt, &layer.attn, &layer_in, &(run.attention)(li), &l)?;
        // Layer 0's normalised input dies here (the decoder rebinds `hidden_states`); a later
        // layer's is the previous layer's output, held by the model's loop.
        let layer_in_kept = if fresh {
            drop(layer_in);
            None
        } else {
            Some(layer_in)
        };
        ops::fused_add_rms_norm(rt, &mut o, &mut residual, &layer.post_norm, eps)?;
        let down = layer.mlp.forward(rt, o, &run.dense, &run.moe, &l)?;
        // The model's loop rebinds its own hidden states: the previous layer's output dies.
        drop(layer_in_kept);
        hidden = Some(down);
    }
    rt.set_layer(None);
    let Some(final_norm) = run.final_norm else {
        // A stage before the last: hidden states and residual go to the next stage as they
        // are (llama.py 0.19 L430-433).
        let out = hidden.ok_or_else(|| Error::Request("a pipeline stage with no layers".into()))?;
        return Ok((out, Some(residual)));
    };
    let mut out = match hidden {
        Some(h) => h,
        None => ops::rms_norm(rt, &residual, final_norm, eps, "final.norm")?,
    };
    if !run.layers.is_empty() {
        ops::fused_add_rms_norm(rt, &mut out, &mut residual, final_norm, eps)?;
    }
    drop(residual);
    Ok((out, None))
}

/// Gemma 2 and 3 through this model's weights and `gemma.rs`'s decoder.
#[cfg(test)]
mod tests {
    use super::{Batch, LlamaModel, LoadOptions};
    use crate::device::{Device, DeviceSpec};
    use crate::engine::runtime::Runtime;
    use crate::memory::EventKind;
    use crate::model::config::ModelConfig;
    use crate::model::weights::{StoredDtype, SyntheticWeights};
    use crate::quant::Quant;

    /// A small Gemma 2 (or Gemma 3 with `arch = "gemma3_text"`): hidden 128, 4 heads over 2 KV
    /// heads of 64, MLP 384, 3 layers, window 4.
    fn small_gemma(arch: &str) -> ModelConfig {
        ModelConfig::from_hf_json(&serde_json::json!({
            "model_type": arch, "hidden_size": 128, "intermediate_size": 384,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 64,
            "sliding_window": 4, "sliding_window_pattern": 2, "query_pre_attn_scalar": 32,
        }))
        .unwrap()
    }

    /// `cfg` loaded in fp16 with seeded weights on a dry simulated H100.
    pub(super) fn dry_load(cfg: &ModelConfig) -> (Runtime, LlamaModel) {
        let device = Device::open(&DeviceSpec::parse("sim:h100-80gb:dry").unwrap()).unwrap();
        let opts = LoadOptions {
            quant: Quant::F16,
            int8_threshold: 0.0,
            int8_layout: device.int8_tile_layout(),
            attn_scalars: 0,
            marlin: Default::default(),
        };
        let rt = Runtime::new(device, std::sync::Arc::default(), None);
        let src = SyntheticWeights {
            preset: "gemma".into(),
            seed: 1,
            dtype: StoredDtype::F16,
        };
        let model = LlamaModel::load(&rt, cfg, &src, &opts).unwrap();
        (rt, model)
    }

    /// The allocations and frees (bytes as the allocator rounds them: 512 at least) of one dry pass of `tokens` tokens in 2 sequences, in fp16, as
    /// (alloc?, tensor, bytes), for layer `layer` (or outside every layer with `None`).
    pub(super) fn dry_trace(
        cfg: &ModelConfig,
        tokens: usize,
        layer: Option<u32>,
    ) -> Vec<(bool, String, u64)> {
        let (rt, model) = dry_load(cfg);
        let from = rt.event_count();
        rt.set_pass(1);
        let batch = Batch::dummy(tokens, 2, cfg.vocab_size);
        let out = model.forward(&rt, &batch).unwrap();
        drop(out);
        rt.events_since(from, |ev| {
            ev.iter()
                .filter(|e| {
                    e.layer == layer && matches!(e.kind, EventKind::Alloc | EventKind::Free)
                })
                .map(|e| (e.kind == EventKind::Alloc, e.tensor.clone(), e.bytes))
                .collect()
        })
    }

    /// Gemma2DecoderLayer.forward at a layer after the first (gemma2.py L215-241 at 0.6.4):
    /// GemmaRMSNorm's new residual sum and output, qkv and attention as for Llama,
    /// post_attention_layernorm's new output, pre_feedforward_layernorm's two, GeGLU with
    /// gate_up kept through down_proj, post_feedforward_layernorm's output; then the previous
    /// layer's output and residual die.
    #[test]
    fn gemma2_layer_allocates_as_vllms_gemma2_decoder_layer() {
        let t = 8u64;
        let h = 128 * 2 * t; // [T, hidden] fp16
        let got = dry_trace(&small_gemma("gemma2"), 8, Some(1));
        let a = |n: &str, b: u64| (true, n.to_string(), b);
        let f = |n: &str, b: u64| (false, n.to_string(), b);
        let qkv = (256 + 2 * 128) * 2 * t;
        let want = vec![
            a("layers.1.input_norm.residual", h),
            a("layers.1.input_norm", h),
            a("layers.1.qkv_proj.out", qkv),
            a("layers.1.attn", 256 * 2 * t),
            a("layers.1.attn.softmax_lse", 512),
            a("layers.1.attn.rng_state", 512),
            f("layers.1.attn.softmax_lse", 512),
            f("layers.1.attn.rng_state", 512),
            a("layers.1.o_proj.out", h),
            f("layers.1.qkv_proj.out", qkv),
            f("layers.1.attn", 256 * 2 * t),
            f("layers.1.input_norm", h),
            a("layers.1.post_attention_norm", h),
            f("layers.1.o_proj.out", h),
            a("layers.1.pre_feedforward_norm.residual", h),
            a("layers.1.pre_feedforward_norm", h),
            f("layers.1.post_attention_norm", h),
            f("layers.1.input_norm.residual", h),
            a("layers.1.gate_up_proj.out", 2 * 384 * 2 * t),
            a("layers.1.act", 384 * 2 * t),
            a("layers.1.down_proj.out", h),
            f("layers.1.act", 384 * 2 * t),
            f("layers.1.gate_up_proj.out", 2 * 384 * 2 * t),
            f("layers.1.pre_feedforward_norm", h),
            a("layers.1.post_feedforward_norm", h),
            f("layers.1.down_proj.out", h),
            f("layers.0.post_feedforward_norm", h),
            f("layers.0.pre_feedforward_norm.residual", h),
        ];
        assert_eq!(got, want);
    }

    /// Gemma 3 adds GemmaRMSNorm over each head of q and k (two new tensors) before the
    /// rotary embedding; its embedding is scaled into a new tensor.
    #[test]
    fn gemma3_adds_per_head_norms_and_a_scaled_embedding_copy() {
        let t = 8u64;
        let got = dry_trace(&small_gemma("gemma3_text"), 8, Some(1));
        let names: Vec<&str> = got.iter().filter(|e| e.0).map(|e| e.1.as_str()).collect();
        assert_eq!(
            &names[..5],
            [
                "layers.1.input_norm.residual",
                "layers.1.input_norm",
                "layers.1.qkv_proj.out",
                "layers.1.q_norm",
                "layers.1.k_norm",
            ]
        );
        assert!(got.contains(&(true, "layers.1.q_norm".into(), 256 * 2 * t)));
        let outside = dry_trace(&small_gemma("gemma3_text"), 8, None);
        let names: Vec<(bool, &str)> = outside.iter().map(|e| (e.0, e.1.as_str())).collect();
        let scaled = names
            .iter()
            .position(|e| *e == (true, "embed.scaled"))
            .unwrap();
        assert_eq!(names[scaled + 1], (false, "embed.out"));
    }

    /// Gemma 2's logits are soft-capped in three out-of-place steps on the `[seqs, vocab]`
    /// logits; Gemma 3 (no final soft-cap) makes none.
    #[test]
    fn final_soft_cap_allocates_three_logit_sized_temporaries() {
        let got = dry_trace(&small_gemma("gemma2"), 8, None);
        let caps: Vec<(bool, &str, u64)> = got
            .iter()
            .filter(|e| e.1.starts_with("logits.soft_cap"))
            .map(|e| (e.0, e.1.as_str(), e.2))
            .collect();
        let b = 2 * 1024 * 2;
        assert_eq!(
            caps,
            [
                (true, "logits.soft_cap.div", b),
                (true, "logits.soft_cap.tanh", b),
                (false, "logits.soft_cap.div", b),
                (true, "logits.soft_cap.mul", b),
                (false, "logits.soft_cap.tanh", b),
                (false, "logits.soft_cap.mul", b),
            ]
        );
        let g3 = dry_trace(&small_gemma("gemma3_text"), 8, None);
        assert!(!g3.iter().any(|e| e.1.starts_with("logits.soft_cap")));
    }

    /// Gemma 3's global layers get their own rotary cache, `max_position · 8` rows long.
    #[test]
    fn gemma3_builds_a_second_scaled_rotary_cache() {
        let mut cfg = small_gemma("gemma3_text");
        cfg.gemma.as_mut().unwrap().rope_linear_factor = Some(8.0);
        let (_rt, m) = dry_load(&cfg);
        assert_eq!(m.rope_cache.shape, [64, 64]);
        assert_eq!(m.rope_cache_global.as_ref().unwrap().shape, [64 * 8, 64]);
        assert_eq!(m.normalizer.as_ref().unwrap().nbytes(), 2);
        let (_rt2, g2) = dry_load(&small_gemma("gemma2"));
        assert!(g2.rope_cache_global.is_none());
    }
}

/// Gemma 1 and Granite through this model's weights and their decoder files.
#[cfg(test)]
mod family_tests {
    use crate::model::config::ModelConfig;

    /// hidden 128, 4 heads over 2 KV heads, MLP 384, 2 layers, 64 positions, and `extra`.
    fn small(model_type: &str, extra: serde_json::Value) -> ModelConfig {
        let mut v = serde_json::json!({
            "model_type": model_type, "hidden_size": 128, "intermediate_size": 384,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 1024, "max_position_embeddings": 64,
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        ModelConfig::from_hf_json(&v).unwrap()
    }

    /// Layer 1's allocations and frees of one dry fp16 pass of 8 tokens in 2 sequences.
    fn layer1_trace(cfg: &ModelConfig) -> Vec<(bool, String, u64)> {
        super::tests::dry_trace(cfg, 8, Some(1))
    }

    fn a(n: &str, b: u64) -> (bool, String, u64) {
        (true, n.to_string(), b)
    }
    fn f(n: &str, b: u64) -> (bool, String, u64) {
        (false, n.to_string(), b)
    }

    /// GraniteDecoderLayer.forward (granite.py L233-251 at 0.19): a plain norm into a new
    /// tensor, attention, the branch times residual_multiplier and the sum (two new), the
    /// post-attention norm (new), the MLP keeping gate_up through down_proj, the second
    /// scaled sum; as the layer returns its attention sum dies, then the loop's input (layer
    /// 0's output).
    #[test]
    fn granite_layer_allocates_as_vllms_granite_decoder_layer() {
        let cfg = small(
            "granite",
            serde_json::json!({"residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
                               "embedding_multiplier": 12.0, "logits_scaling": 16.0}),
        );
        let h = 128 * 2 * 8; // [T, hidden] fp16
        let qkv = (128 + 2 * 64) * 2 * 8;
        let want = vec![
            a("layers.1.input_norm", h),
            a("layers.1.qkv_proj.out", qkv),
            a("layers.1.attn", h),
            a("layers.1.attn.softmax_lse", 512),
            a("layers.1.attn.rng_state", 512),
            f("layers.1.attn.softmax_lse", 512),
            f("layers.1.attn.rng_state", 512),
            a("layers.1.o_proj.out", h),
            f("layers.1.qkv_proj.out", qkv),
            f("layers.1.attn", h),
            f("layers.1.input_norm", h),
            a("layers.1.residual_attn.scaled", h),
            a("layers.1.residual_attn", h),
            f("layers.1.residual_attn.scaled", h),
            f("layers.1.o_proj.out", h),
            a("layers.1.post_attention_norm", h),
            a("layers.1.gate_up_proj.out", 2 * 384 * 2 * 8),
            a("layers.1.act", 384 * 2 * 8),
            a("layers.1.down_proj.out", h),
            f("layers.1.act", 384 * 2 * 8),
            f("layers.1.gate_up_proj.out", 2 * 384 * 2 * 8),
            f("layers.1.post_attention_norm", h),
            a("layers.1.residual_mlp.scaled", h),
            a("layers.1.residual_mlp", h),
            f("layers.1.residual_mlp.scaled", h),
            f("layers.1.down_proj.out", h),
            f("layers.1.residual_attn", h),
            f("layers.0.residual_mlp", h),
        ];
        assert_eq!(layer1_trace(&cfg), want);
    }

    /// GemmaDecoderLayer.forward (gemma.py L238-258 at 0.19): the input add-norm's sum and
    /// output (new), attention over 4 heads of 64 (256 wide, not the hidden 128), the
    /// post-attention add-norm's two (new), GeGLU keeping gate_up through down_proj; then the
    /// loop's hidden states and residual (layer 0's output and sum) die.
    #[test]
    fn gemma1_layer_allocates_as_vllms_gemma_decoder_layer() {
        let cfg = small("gemma", serde_json::json!({"head_dim": 64}));
        assert!(cfg
            .gemma
            .as_ref()
            .is_some_and(|g| g.query_pre_attn_scalar == 64.0));
        let h = 128 * 2 * 8;
        let qkv = (256 + 2 * 128) * 2 * 8;
        let want = vec![
            a("layers.1.input_norm.residual", h),
            a("layers.1.input_norm", h),
            a("layers.1.qkv_proj.out", qkv),
            a("layers.1.attn", 256 * 2 * 8),
            a("layers.1.attn.softmax_lse", 512),
            a("layers.1.attn.rng_state", 512),
            f("layers.1.attn.softmax_lse", 512),
            f("layers.1.attn.rng_state", 512),
            a("layers.1.o_proj.out", h),
            f("layers.1.qkv_proj.out", qkv),
            f("layers.1.attn", 256 * 2 * 8),
            f("layers.1.input_norm", h),
            a("layers.1.post_attention_norm.residual", h),
            a("layers.1.post_attention_norm", h),
            f("layers.1.o_proj.out", h),
            f("layers.1.input_norm.residual", h),
            a("layers.1.gate_up_proj.out", 2 * 384 * 2 * 8),
            a("layers.1.act", 384 * 2 * 8),
            a("layers.1.down_proj.out", h),
            f("layers.1.act", 384 * 2 * 8),
            f("layers.1.gate_up_proj.out", 2 * 384 * 2 * 8),
            f("layers.1.post_attention_norm", h),
            f("layers.0.down_proj.out", h),
            f("layers.0.post_attention_norm.residual", h),
        ];
        assert_eq!(layer1_trace(&cfg), want);
    }

    /// Gemma 1 has two norms a layer and no window, soft-cap or scalar of its own.
    #[test]
    fn gemma1_checkpoint_has_two_norms_a_layer_and_no_caps() {
        let cfg = small("gemma", serde_json::json!({"head_dim": 64}));
        let names: Vec<String> = cfg.tensor_shapes().into_iter().map(|(n, _)| n).collect();
        assert!(!names.iter().any(|n| n.contains("feedforward_layernorm")));
        assert_eq!(cfg.final_logit_softcap(), None);
        assert_eq!(cfg.score_mods(0).window, None);
        assert!(cfg.tie_word_embeddings);
    }

    /// The keys vLLM refuses or does not model are named.
    #[test]
    fn gemma_and_granite_refuse_what_vllm_would_not_run() {
        let bad = |t: &str, extra: serde_json::Value| {
            let mut v = serde_json::json!({
                "model_type": t, "hidden_size": 128, "intermediate_size": 384,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1024,
            });
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            ModelConfig::from_hf_json(&v).unwrap_err()
        };
        let e = bad("gemma", serde_json::json!({"hidden_activation": "gelu"}));
        assert!(e.contains("hidden_activation 'gelu'"), "{e}");
        let e = bad("gemma", serde_json::json!({"tie_word_embeddings": false}));
        assert!(e.contains("tie_word_embeddings false"), "{e}");
        let e = bad("granite", serde_json::json!({"hidden_act": "gelu"}));
        assert!(e.contains("requires silu"), "{e}");
        let e = bad("granite", serde_json::json!({"logits_scaling": 0}));
        assert!(e.contains("logits_scaling"), "{e}");
    }
}

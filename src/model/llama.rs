//! The Llama-family forward pass, written once over device-agnostic ops: embedding, RMSNorm,
//! RoPE, causal GQA attention, SwiGLU MLP, final norm, lm_head on the last token of each
//! sequence (as vLLM's profile run computes logits). Gemma 2 and 3 switch in their own norms
//! (`x · (1 + w)`, four per layer), GeGLU, the scaled embedding and the attention's scale,
//! soft-cap and sliding window (vLLM gemma2.py, gemma3.py).

use std::cell::Cell;

pub use super::batch::Batch;
use super::config::ModelConfig;
use super::loader::{
    fp8_after_loading, fp8_fused_after_loading, fp8_stored_fused_after_loading,
    fp8_stored_linear_after_loading, marlin_after_loading, marlin_fused_after_loading, Loader,
    Slice,
};
pub use super::loader::{LoadOptions, LoadStats};
use super::weights::WeightSource;
use crate::base::error::{Error, Result};
use crate::device::cpu::AttnShape;
use crate::engine::progress::Progress;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_gemma, ops_moe};
use crate::memory::Category;
use crate::quant::{FusedLinear, Linear, Quant};

/// vLLM's `LlamaAttention` (llama.py at 380e1863): `qkv_proj` is a `QKVParallelLinear`, q, k
/// and v stacked into one parameter.
pub struct Attention {
    pub qkv: FusedLinear,
    pub o: Linear,
    /// The `[q + 2·kv]` bias of `qkv_proj` (Qwen2-style `attention_bias`).
    pub bias: Option<Tensor>,
    /// Qwen3's `q_norm` and `k_norm` (`[head_dim]` each, whole on every rank).
    pub qk_norm: Option<(Tensor, Tensor)>,
}

/// vLLM's `LlamaDecoderLayer` (and `MixtralDecoderLayer`, `Qwen3MoeDecoderLayer`).
pub struct Layer {
    pub attn: Attention,
    pub mlp: Mlp,
    pub input_norm: Tensor,
    pub post_norm: Tensor,
    /// Gemma's `pre_feedforward_layernorm` and `post_feedforward_layernorm`.
    pub ff_norms: Option<(Tensor, Tensor)>,
}

/// A decoder layer's MLP: dense (`LlamaMLP`: `gate_up` a `MergedColumnParallelLinear`, `down`
/// a `RowParallelLinear`) or a sparse block of experts. One per layer, so the dense variant's
/// size (its quantized forms inline) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Mlp {
    Dense { gate_up: FusedLinear, down: Linear },
    Moe(MoeBlock),
}

/// vLLM's `MixtralMoE` / `Qwen3MoeSparseMoeBlock`: the router (`ReplicatedLinear [E, H]`,
/// whole on every rank) and `FusedMoE`'s two stacked parameters, `w13_weight [E, 2·I, H]`
/// and `w2_weight [E, H, I]` (I: this rank's share of each expert's width).
pub struct MoeBlock {
    pub gate: Tensor,
    pub w13: Tensor,
    pub w2: Tensor,
    /// Qwen2-MoE's shared expert and its gate.
    pub shared: Option<SharedExpert>,
}

/// Qwen2-MoE's `shared_expert` (a `Qwen2MoeMLP` with `reduce_results=False`: this rank's
/// share of the width in `gate_up` and `down`) and `shared_expert_gate` (a plain
/// `torch.nn.Linear(H, 1)`, whole on every rank, in the model dtype).
pub struct SharedExpert {
    pub gate_up: FusedLinear,
    pub down: Linear,
    pub gate: Tensor,
    /// This rank's share of the shared expert's width.
    pub width: usize,
}

pub struct LlamaModel {
    pub cfg: ModelConfig,
    /// The shape this rank computes: heads, KV heads and the MLP width divided over the
    /// tensor-parallel ranks (`cfg` itself with one GPU).
    pub local: ModelConfig,
    /// This rank's first row of the padded vocabulary (0 with one GPU).
    pub vocab_first_row: usize,
    pub quant: Quant,
    pub act: DType,
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
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
        if cfg.is_gemma() && rt.backend() == crate::device::Backend::Cuda {
            return Err(Error::Request(format!(
                "model_type {} is not supported on CUDA yet (GemmaRMSNorm, GeGLU, soft-capping and sliding-window attention have no kernels); run it on a simulated device (sim:...)",
                cfg.arch
            )));
        }
        if cfg.moe.is_some() {
            if cfg
                .moe
                .as_ref()
                .is_some_and(|m| m.shared_expert_intermediate_size > 0)
                && rt.backend() == crate::device::Backend::Cuda
            {
                return Err(ops_moe::shared_expert_on_cuda());
            }
            // The quantized fused-MoE methods are not reproduced.
            if !matches!(opts.quant, Quant::F16 | Quant::BF16)
                || src.stored_fp8().is_some()
                || src.packed4().is_some()
            {
                return Err(Error::Request(format!(
                    "model_type {} (mixture of experts) runs in 16 bits only: vLLM's quantized fused-MoE methods are not modelled yet",
                    cfg.arch
                )));
            }
        }
        let shard = TpShard::of(rt, cfg)?;
        let local = shard.local_config(cfg);
        let mut ld = Loader::new(rt, src, opts, cfg.loader_reads());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (h, q, kv, v) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.vocab_size);
        // vLLM's VocabParallelEmbedding and ParallelLMHead pad the vocabulary to 64 rows
        // (vocab_parallel_embedding.py L16, L47-50): the padding is allocated too.
        let vp = cfg.padded_vocab();
        let (v_first, v_len) = shard.vocab_rows(vp);
        let embed = ld.vocab_shard("model.embed_tokens.weight", v, h, vp, v_first, v_len)?;
        let (q_part, kv_part, i_part) =
            (shard.q_rows(cfg), shard.kv_rows(cfg), shard.mlp_rows(cfg));
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut rope_cache = None;
        let mut rope_cache_global = None;
        let fp8 = src.stored_fp8().is_some() || opts.quant == Quant::Fp8;
        // Block-wise fp8 is reproduced for vLLM 0.8.5 only: its Fp8KVCacheMethod.
        let block_fp8 = src.stored_fp8().is_some_and(|f| f.block.is_some());
        let mut kv_scales = Vec::new();
        let mut attn_scalars = Vec::new();
        // In the order vLLM's constructors create the parameters (llama.py at 380e1863):
        // qkv_proj, o_proj (and the rotary cache, with the first layer), gate_up_proj,
        // down_proj, then the two norms.
        for l in 0..cfg.num_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("model.layers.{l}");
            let qkv_name = format!("{p}.self_attn.qkv_proj.weight");
            let qkv = if cfg.fused_checkpoint() {
                // This rank's q, k and v rows of the stored [q + 2·kv, h] tensor
                // (QKVParallelLinear.weight_loader with no shard id cuts it the same way).
                let all = q + 2 * kv;
                ld.fused_parts(
                    &[qkv_name.clone(), qkv_name.clone(), qkv_name.clone()],
                    &[all; 3],
                    &[
                        q_part,
                        (q + kv_part.0, kv_part.1),
                        (q + kv + kv_part.0, kv_part.1),
                    ],
                    h,
                    &qkv_name,
                )?
            } else {
                ld.fused_parts(
                    &[
                        format!("{p}.self_attn.q_proj.weight"),
                        format!("{p}.self_attn.k_proj.weight"),
                        format!("{p}.self_attn.v_proj.weight"),
                    ],
                    &[q, kv, kv],
                    &[q_part, kv_part, kv_part],
                    h,
                    &qkv_name,
                )?
            };
            let bias = if cfg.attention_bias {
                Some(ld.dense_concat_parts(
                    &[
                        format!("{p}.self_attn.q_proj.bias"),
                        format!("{p}.self_attn.k_proj.bias"),
                        format!("{p}.self_attn.v_proj.bias"),
                    ],
                    &[q, kv, kv],
                    &[q_part, kv_part, kv_part],
                    &format!("{p}.self_attn.qkv_proj.bias"),
                )?)
            } else {
                None
            };
            // RowParallelLinear: this rank's columns (the heads it computed).
            let op = ld.linear_slice(
                &format!("{p}.self_attn.o_proj.weight"),
                Slice::cols(h, q, q_part.0, q_part.1),
            )?;
            // Qwen3Attention.__init__ makes q_norm and k_norm after the attention layer,
            // Gemma3Attention before the rotary embedding (gemma3.py L144-170 at 0.8.5).
            let qk_norm_first = cfg.is_gemma();
            let mut qk_norm = None;
            for pass in [true, false] {
                if pass == qk_norm_first && cfg.qk_norm() {
                    let hd = cfg.head_dim;
                    qk_norm = Some((
                        ld.dense(&format!("{p}.self_attn.q_norm.weight"), &[hd])?,
                        ld.dense(&format!("{p}.self_attn.k_norm.weight"), &[hd])?,
                    ));
                }
                if pass == qk_norm_first {
                    continue;
                }
                // One cache per distinct (base, scaling): Gemma 3's first sliding layer
                // makes the local one, its first global layer the scaled global one.
                let (theta, factor) = cfg.layer_rope(l);
                let global = factor != 1.0 || theta != cfg.layer_rope(0).0;
                if !global && rope_cache.is_none() {
                    rope_cache = Some(rotary_cache(rt, cfg, act, (theta, factor))?);
                } else if global && rope_cache_global.is_none() {
                    rope_cache_global = Some(rotary_cache(rt, cfg, act, (theta, factor))?);
                }
                // `Attention.__init__`: the release's 0-dim scale tensors, then (fp8) its
                // KV cache method's.
                attn_scalars.extend(super::loader::attention_scalars(
                    rt,
                    &format!("{p}.self_attn.attn"),
                    opts.attn_scalars,
                )?);
                // Under fp8 the attention layer gets `Fp8KVCacheMethod`, whose
                // `create_weights` makes `k_scale` and `v_scale` as `torch.tensor(-1.0)` on
                // the device (0.6.4 kv_cache.py L22-31): two 0-dim f32 tensors, deleted
                // by its `process_weights_after_loading` (L67-68).
                if fp8 {
                    rt.set_op("load");
                    let s = |n: &str| {
                        rt.tensor(
                            format!("{p}.self_attn.attn.{n}"),
                            Category::Weight,
                            &[],
                            DType::F32,
                        )
                    };
                    if block_fp8 {
                        // 0.8.5's `BaseKVCacheMethod.create_weights` makes four, q, k, v and
                        // prob (kv_cache.py L35-43); kept in the order L134-137 deletes them.
                        let (q, k, v, prob) = (
                            s("q_scale")?,
                            s("k_scale")?,
                            s("v_scale")?,
                            s("prob_scale")?,
                        );
                        kv_scales.push(vec![k, v, q, prob]);
                    } else {
                        kv_scales.push(vec![s("k_scale")?, s("v_scale")?]);
                    }
                }
            }
            let mlp = if let Some(m) = cfg.moe.as_ref().filter(|_| cfg.is_moe_layer(l)) {
                Mlp::Moe(load_moe_block(&mut ld, cfg, m, &shard, &p)?)
            } else {
                load_dense_mlp(&mut ld, cfg, &p, i_part)?
            };
            let input_norm = ld.dense(&format!("{p}.input_layernorm.weight"), &[h])?;
            let post_norm = ld.dense(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
            let ff_norms = if cfg.is_gemma() {
                Some((
                    ld.dense(&format!("{p}.pre_feedforward_layernorm.weight"), &[h])?,
                    ld.dense(&format!("{p}.post_feedforward_layernorm.weight"), &[h])?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                attn: Attention {
                    qkv,
                    o: op,
                    bias,
                    qk_norm,
                },
                mlp,
                input_norm,
                post_norm,
                ff_norms,
            });
        }
        let (rope_cache, rope_cache_global) = match (rope_cache, rope_cache_global) {
            (Some(c), g) => (c, g),
            (None, Some(g)) => (g, None),
            (None, None) => (rotary_cache(rt, cfg, act, cfg.layer_rope(0))?, None),
        };
        rt.set_layer(None);
        let norm = ld.dense("model.norm.weight", &[h])?;
        // Gemma's `register_buffer("normalizer", ...)` after the final norm: one element in
        // the model dtype.
        let normalizer = if cfg.is_gemma() {
            rt.set_op("load");
            Some(rt.tensor("model.normalizer", Category::Weight, &[1], act)?)
        } else {
            None
        };
        // bitsandbytes leaves lm_head in 16 bits.
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(ld.vocab_shard("lm_head.weight", v, h, vp, v_first, v_len)?)
        };
        if block_fp8 {
            // Block-wise fp8 at 0.8.5: the linears keep what they loaded (fp8.py L306-323);
            // each attention layer's `Fp8KVCacheMethod.process_weights_after_loading`
            // (kv_cache.py L49-137, kv-cache dtype auto) compares `q_scale` and then
            // `prob_scale` with 0 (a 0-dim bool on the device each, freed once read, L103 and
            // L110), then deletes k, v, q and prob scales (L134-137), after qkv_proj and
            // o_proj in `named_modules` order.
            for (l, kv) in kv_scales.into_iter().enumerate() {
                rt.set_layer(Some(l as u32));
                rt.set_op("fp8.kv_cache_scales");
                for n in ["q_scale_gt_0", "prob_scale_gt_0"] {
                    let flag = rt.tensor(
                        format!("model.layers.{l}.self_attn.attn.{n}"),
                        Category::Weight,
                        &[],
                        DType::U8,
                    )?;
                    drop(flag);
                }
                drop(kv);
            }
            rt.set_layer(None);
        } else if src.stored_fp8().is_some() {
            // A stored fp8 checkpoint: each layer's shards requantized at their largest
            // scale, once every weight is loaded, in `named_modules` order.
            let t = std::time::Instant::now();
            layers = layers
                .into_iter()
                .enumerate()
                .zip(kv_scales)
                .map(|((l, mut layer), kv)| {
                    rt.set_layer(Some(l as u32));
                    layer.attn.qkv = fp8_stored_fused_after_loading(rt, layer.attn.qkv)?;
                    layer.attn.o = fp8_stored_linear_after_loading(rt, layer.attn.o)?;
                    // `named_modules`: qkv_proj, o_proj, rotary_emb, attn, then the MLP.
                    drop(kv);
                    layer.mlp = match layer.mlp {
                        Mlp::Dense { gate_up, down } => Mlp::Dense {
                            gate_up: fp8_stored_fused_after_loading(rt, gate_up)?,
                            down: fp8_stored_linear_after_loading(rt, down)?,
                        },
                        moe => moe,
                    };
                    Ok(layer)
                })
                .collect::<Result<Vec<_>>>()?;
            rt.set_layer(None);
            ld.stats.quantize_seconds += t.elapsed().as_secs_f64();
        } else if src.packed4().is_some() {
            // AWQ / GPTQ: each layer repacked for Marlin once every weight is loaded, in
            // `named_modules` order.
            let t = std::time::Instant::now();
            for (l, layer) in layers.iter_mut().enumerate() {
                rt.set_layer(Some(l as u32));
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
                rt.set_layer(Some(l as u32));
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
            local,
            vocab_first_row: v_first,
            quant: opts.quant,
            act,
            embed,
            layers,
            norm,
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
            generation: Cell::new(0),
        })
    }

    /// Bytes of all weights as stored on the device.
    pub fn weight_bytes(&self) -> u64 {
        let mut b = self.embed.nbytes() + self.norm.nbytes() + self.rope_cache.nbytes();
        b += self.rope_cache_global.as_ref().map_or(0, |t| t.nbytes());
        b += self.normalizer.as_ref().map_or(0, |t| t.nbytes());
        b += self.fp8_identity.as_ref().map_or(0, |t| t.nbytes());
        b += self.attn_scalars.iter().map(|t| t.nbytes()).sum::<u64>();
        for l in &self.layers {
            b += l.input_norm.nbytes() + l.post_norm.nbytes();
            b += l
                .ff_norms
                .as_ref()
                .map_or(0, |(a, c)| a.nbytes() + c.nbytes());
            b += l.attn.qkv.weight_bytes() + l.attn.o.weight_bytes();
            b += match &l.mlp {
                Mlp::Dense { gate_up, down } => gate_up.weight_bytes() + down.weight_bytes(),
                Mlp::Moe(m) => {
                    m.gate.nbytes()
                        + m.w13.nbytes()
                        + m.w2.nbytes()
                        + m.shared.as_ref().map_or(0, |s| {
                            s.gate_up.weight_bytes() + s.down.weight_bytes() + s.gate.nbytes()
                        })
                }
            };
            b += l.attn.bias.as_ref().map_or(0, |t| t.nbytes());
            b += l
                .attn
                .qk_norm
                .as_ref()
                .map_or(0, |(q, k)| q.nbytes() + k.nbytes());
        }
        b + self.lm_head.as_ref().map_or(0, |t| t.nbytes())
    }

    /// The output projection over the padded vocabulary, `[Vp, hidden]`.
    pub fn lm_head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// One forward pass without the sampler: the f32 logits `[seqs, vocab]` of the last token of
    /// each sequence (on rank 0 of a tensor-parallel instance; the other ranks send their shard
    /// and get an error).
    pub fn forward(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let hidden = self.forward_hidden(rt, batch)?;
        let rows = super::sampler::last_token_rows(&batch.seq_lens);
        super::sampler::logits_f32(
            rt,
            &hidden,
            self.lm_head(),
            &rows,
            self.cfg.vocab_size,
            self.cfg.final_logit_softcap(),
        )?
        .ok_or_else(|| Error::Request("the logits were gathered to tensor-parallel rank 0".into()))
    }

    /// One forward pass over every token, as vLLM's `LlamaModel.forward`: the final hidden
    /// states `[tokens, hidden]` in the model dtype, after the last norm. The logits come from
    /// `sampler::compute_logits`.
    /// `LlamaMLP.forward` (and Gemma's GeGLU MLP) on `o`: gate_up, the activation's new
    /// output, down_proj and its all-reduce; the activation dies when `x` is rebound to
    /// down_proj's output, gate_up when the MLP returns (at 380e1863), or as soon as `x` is
    /// rebound to the activation (#10339). The decoder then rebinds `hidden_states` to the
    /// MLP's output: `o` dies.
    fn dense_mlp(
        &self,
        rt: &Runtime,
        o: Tensor,
        (gate_up, down): (&FusedLinear, &Linear),
        l: &str,
        gen: u32,
    ) -> Result<Tensor> {
        let gemma = self.cfg.is_gemma();
        let how = MlpRun {
            width: self.local.intermediate_size,
            act: self.act,
            gemma,
            // Gemma2MLP/Gemma3MLP keep `gate_up` named until they return, in every release
            // (gemma2.py L78-82 at 0.6.4, L79-83 at 0.8.5; gemma3.py L85-89 at 0.8.5).
            frees_gate_up: self.mlp_frees_gate_up && !gemma,
            all_reduce: true,
            generation: gen,
        };
        let out = mlp_forward(rt, &o, (gate_up, down), &how, l)?;
        drop(o);
        Ok(out)
    }

    pub fn forward_hidden(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let cfg = &self.cfg;
        let gen = self.generation.get();
        self.generation.set(gen + 1);
        if batch.ids.iter().any(|&id| id as usize >= cfg.vocab_size) {
            return Err(Error::Request(format!(
                "token id out of range for vocab size {}",
                cfg.vocab_size
            )));
        }
        let act = self.act;
        let eps = cfg.rms_norm_eps as f32;
        let positions: Vec<usize> = batch.seq_lens.iter().flat_map(|&n| 0..n).collect();
        // The GPU's name picks fused MoE's tuned Triton config.
        let gpu = rt.with_device(|d| d.info().name);
        rt.set_layer(None);
        // vLLM's LlamaModel.forward (llama.py at 380e1863): the embedding output becomes the
        // residual stream; layer 0 normalises into a new tensor, every later norm is
        // `fused_add_rms_norm` in place, the final one too.
        let mut residual = if rt.tp().is_some() {
            crate::engine::ops_tp::vocab_parallel_embedding(
                rt,
                &batch.ids,
                &self.embed,
                self.vocab_first_row,
                cfg.vocab_size,
                act,
            )?
        } else {
            ops::embedding(rt, &batch.ids, &self.embed, act)?
        };
        let gemma = cfg.is_gemma();
        // Gemma's RMSNorm (`x · (1 + w)`, a new tensor) or Llama's, for every plain norm below.
        let norm = if gemma {
            ops_gemma::rms_norm
        } else {
            ops::rms_norm
        };
        if gemma {
            // `normalizer` is a tensor in the model dtype, so √hidden is rounded to it first.
            let factor = act.round((cfg.hidden_size as f32).sqrt());
            residual = ops_gemma::scale_embedding(rt, residual, factor, cfg.arch == "gemma2")?;
        }
        // Gemma's residual-sum outputs and its first layer's input (the embedding, held by
        // the model's loop while layer 0 runs).
        let mut gemma_prev_residual: Option<Tensor> = None;
        // What this rank computes: its heads, its KV heads, its part of the MLP.
        let local = &self.local;
        let mut hidden: Option<Tensor> = None;
        let n_layers = self.layers.len() as u32;
        let (q_dim, kv_dim) = (local.q_dim(), local.kv_dim());
        for (li, layer) in self.layers.iter().enumerate() {
            rt.check_cancel()?;
            rt.set_layer(Some(li as u32));
            rt.progress(Progress::Layer {
                layer: li as u32,
                of: n_layers,
            });
            let l = format!("layers.{li}");
            // LlamaDecoderLayer.forward: `hidden_states` of the previous layer is held by the
            // model's loop until this layer returns.
            // Gemma2DecoderLayer.forward (gemma2.py L223-241 at 0.6.4): GemmaRMSNorm returns new
            // tensors (the residual sum too); the caller's hidden states and residual live
            // until the layer returns.
            let mut gemma_prev_hidden = None;
            let layer_in = match (hidden.take(), gemma) {
                (None, _) => norm(
                    rt,
                    &residual,
                    &layer.input_norm,
                    eps,
                    &format!("{l}.input_norm"),
                )?,
                (Some(mut h), false) => {
                    ops::fused_add_rms_norm(rt, &mut h, &mut residual, &layer.input_norm, eps)?;
                    h
                }
                (Some(h), true) => {
                    let (out, sum) = ops_gemma::add_rms_norm(
                        rt,
                        &h,
                        &residual,
                        &layer.input_norm,
                        eps,
                        &format!("{l}.input_norm"),
                    )?;
                    gemma_prev_hidden = Some(h);
                    gemma_prev_residual = Some(std::mem::replace(&mut residual, sum));
                    out
                }
            };
            // LlamaAttention.forward: qkv, its split views, rotary in place, attention, o_proj;
            // qkv and the attention output die when it returns.
            let qkv = layer
                .attn
                .qkv
                .forward(rt, &layer_in, &format!("{l}.qkv_proj"), gen, act)?;
            let rows = [q_dim, kv_dim, kv_dim];
            let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
            let mut qkv_views = FusedLinear::split(&qkv, &rows, &names);
            if let Some(b) = &layer.attn.bias {
                let bias_names = ["q", "k", "v"].map(|n| format!("{l}.{n}_bias"));
                for (x, bv) in
                    qkv_views
                        .iter_mut()
                        .zip(FusedLinear::split_flat(b, &rows, &bias_names))
                {
                    ops::add_bias(rt, x, &bv)?;
                }
            }
            let mut it = qkv_views.into_iter();
            let (Some(mut q), Some(mut k), Some(v)) = (it.next(), it.next(), it.next()) else {
                return Err(Error::Request("qkv split".into()));
            };
            // Qwen3Attention.forward: `q_norm` over each head of q (a new tensor), then
            // `k_norm` over each head of k; the split views stay with qkv.
            // Gemma3Attention.forward the same with GemmaRMSNorm (gemma3.py L192-197 at 0.8.5).
            if let Some((qn, kn)) = &layer.attn.qk_norm {
                let eps = local.rms_norm_eps as f32;
                q = norm(rt, &q, qn, eps, &format!("{l}.q_norm"))?;
                k = norm(rt, &k, kn, eps, &format!("{l}.k_norm"))?;
            }
            let shape = AttnShape {
                mods: cfg.score_mods(li),
                ..local.attn_shape()
            };
            ops::rope(rt, &mut q, &mut k, &positions, shape, cfg.layer_rope(li))?;
            let a = if self.skip_attention.get() {
                ops::attention_skipped(rt, &q, &format!("{l}.attn"))?
            } else {
                ops::attention(rt, &q, &k, &v, &batch.seq_lens, shape, &format!("{l}.attn"))?
            };
            let o = layer
                .attn
                .o
                .forward(rt, &a, &format!("{l}.o_proj"), gen, act)?;
            // RowParallelLinear.forward: the partial sums of the ranks, all-reduced.
            let mut o =
                crate::engine::ops_tp::all_reduce(rt, o, &format!("{l}.o_proj.all_reduce"))?;
            drop((q, k, v));
            drop(qkv);
            drop(a);
            // Layer 0's normalised input dies here (the decoder rebinds `hidden_states`); a
            // later layer's is the previous layer's output, held by the model's loop.
            // Gemma's normalised input is its own new tensor: it dies here at every layer.
            let layer_in_kept = if li == 0 || gemma {
                drop(layer_in);
                None
            } else {
                Some(layer_in)
            };
            let mlp_in = if let Some((pre_ff, _)) = &layer.ff_norms {
                // post_attention_layernorm on the attention output (a new tensor; o_proj's
                // output dies), then pre_feedforward_layernorm with the residual: two new
                // tensors, the post-attention output and the old residual sum dying (layer 0's
                // residual, the embedding, is still held by the model's loop).
                let post = ops_gemma::rms_norm(
                    rt,
                    &o,
                    &layer.post_norm,
                    eps,
                    &format!("{l}.post_attention_norm"),
                )?;
                drop(o);
                let (x, sum) = ops_gemma::add_rms_norm(
                    rt,
                    &post,
                    &residual,
                    pre_ff,
                    eps,
                    &format!("{l}.pre_feedforward_norm"),
                )?;
                drop(post);
                let old = std::mem::replace(&mut residual, sum);
                if li == 0 {
                    gemma_prev_residual = Some(old);
                } else {
                    drop(old);
                }
                x
            } else {
                ops::fused_add_rms_norm(rt, &mut o, &mut residual, &layer.post_norm, eps)?;
                o
            };
            let o = mlp_in;
            let down = match &layer.mlp {
                Mlp::Dense { gate_up, down } => {
                    let out = self.dense_mlp(rt, o, (gate_up, down), &l, gen)?;
                    // The model's loop rebinds its own hidden states: the previous layer's
                    // output dies.
                    drop(layer_in_kept);
                    out
                }
                Mlp::Moe(block) => {
                    let m = local.moe.as_ref().ok_or_else(|| {
                        Error::Request(format!("{l}: a sparse block in a model with no experts"))
                    })?;
                    let out = moe_block_forward(rt, o, block, m, act, &l, &gpu)?;
                    drop(layer_in_kept);
                    out
                }
            };
            let down = match &layer.ff_norms {
                // post_feedforward_layernorm: a new tensor; down_proj's output dies. Then
                // the model's loop rebinds its hidden states and residual: the previous
                // layer's output and residual sum (layer 0: the embedding) die.
                Some((_, post_ff)) => {
                    let out = ops_gemma::rms_norm(
                        rt,
                        &down,
                        post_ff,
                        eps,
                        &format!("{l}.post_feedforward_norm"),
                    )?;
                    drop(down);
                    drop(gemma_prev_hidden.take());
                    drop(gemma_prev_residual.take());
                    out
                }
                None => down,
            };
            hidden = Some(down);
        }
        rt.set_layer(None);
        if gemma {
            // `hidden_states, _ = self.norm(hidden_states, residual)`: two new tensors; the
            // last layer's output dies as the name is rebound, the residual and the sum (`_`)
            // when the model returns.
            let out = match hidden {
                None => ops_gemma::rms_norm(rt, &residual, &self.norm, eps, "final.norm")?,
                Some(h) => {
                    let (out, sum) =
                        ops_gemma::add_rms_norm(rt, &h, &residual, &self.norm, eps, "final.norm")?;
                    drop(h);
                    drop(residual);
                    drop(sum);
                    return Ok(out);
                }
            };
            drop(residual);
            return Ok(out);
        }
        let mut out = match hidden {
            Some(h) => h,
            None => ops::rms_norm(rt, &residual, &self.norm, eps, "final.norm")?,
        };
        if !self.layers.is_empty() {
            ops::fused_add_rms_norm(rt, &mut out, &mut residual, &self.norm, eps)?;
        }
        drop(residual);
        Ok(out)
    }
}

/// How a gated MLP runs: this rank's width, the activation dtype, GeGLU (Gemma) or SiLU,
/// whether `gate_up` dies before `down_proj` (vLLM #10339's Llama MLP) or when the MLP returns,
/// whether `down_proj` all-reduces (`reduce_results`), and the layer's forward count (for the
/// quantized linears).
struct MlpRun {
    width: usize,
    act: DType,
    gemma: bool,
    frees_gate_up: bool,
    all_reduce: bool,
    generation: u32,
}

/// A gated MLP on `x` (which stays alive): `gate_up_proj`, its two halves, the activation into
/// a new tensor, `down_proj` (and its all-reduce over ranks), the activation dying as the name
/// is rebound after `down_proj`, then `gate_up` as the MLP returns (or before `down_proj`).
fn mlp_forward(
    rt: &Runtime,
    x: &Tensor,
    (gate_up, down): (&FusedLinear, &Linear),
    how: &MlpRun,
    l: &str,
) -> Result<Tensor> {
    let (act, gen, i) = (how.act, how.generation, how.width);
    let gate_up = gate_up.forward(rt, x, &format!("{l}.gate_up_proj"), gen, act)?;
    let names = ["gate", "up"].map(|n| format!("{l}.{n}"));
    let mut it = FusedLinear::split(&gate_up, &[i, i], &names).into_iter();
    let (Some(gate), Some(up)) = (it.next(), it.next()) else {
        return Err(Error::Request(format!("{l}: gate_up split")));
    };
    let act_out = if how.gemma {
        ops_gemma::gelu_tanh_and_mul(rt, &gate, &up, &format!("{l}.act"))?
    } else {
        ops::silu_and_mul(rt, &gate, &up, &format!("{l}.act"))?
    };
    drop((gate, up));
    let gate_up = if how.frees_gate_up {
        drop(gate_up);
        None
    } else {
        Some(gate_up)
    };
    let mut out = down.forward(rt, &act_out, &format!("{l}.down_proj"), gen, act)?;
    if how.all_reduce {
        out = crate::engine::ops_tp::all_reduce(rt, out, &format!("{l}.down_proj.all_reduce"))?;
    }
    drop(act_out);
    drop(gate_up);
    Ok(out)
}

/// A sparse block on `x` as vLLM 0.8.5 runs it (`MixtralMoE.forward`, mixtral.py L99-106;
/// `Qwen3MoeSparseMoeBlock.forward`, qwen3_moe.py L128-143): the router's logits, the top-k
/// routing, the experts written into `x` in place (`inplace=True`), the routing's tensors
/// dying as `forward_cuda` returns, the all-reduce over ranks (inside `FusedMoE` for Mixtral,
/// in the block for Qwen3: the same point), then the logits as the block returns. The output
/// is `x` itself (a new tensor when the all-reduce is out of place). `m` is this rank's
/// shape (its share of each expert's width), `layer` names the tensors (`layers.3`), `gpu`
/// picks the Triton config.
pub fn moe_block_forward(
    rt: &Runtime,
    mut x: Tensor,
    block: &MoeBlock,
    m: &crate::model::config::MoeShape,
    act: DType,
    layer: &str,
    gpu: &str,
) -> Result<Tensor> {
    let shared = match &block.shared {
        Some(se) => Some(shared_expert_forward(rt, &x, se, act, layer)?),
        None => None,
    };
    let logits = crate::quant::dense_matmul_as(
        rt,
        &x,
        &block.gate,
        &format!("{layer}.gate"),
        act,
        &format!("{layer}.moe.router_logits"),
        Category::Activation,
    )?;
    let name = format!("{layer}.moe");
    let routing = ops_moe::fused_topk(rt, &logits, m.top_k, m.renormalize, &name)?;
    let experts = ops_moe::Experts {
        w13: &block.w13,
        w2: &block.w2,
        num_experts: m.num_experts,
        width: m.expert_intermediate_size,
    };
    ops_moe::fused_experts(rt, &mut x, &experts, &routing, gpu, &name)?;
    drop(routing);
    let Some(shared) = shared else {
        let out = crate::engine::ops_tp::all_reduce(rt, x, &format!("{layer}.moe.all_reduce"))?;
        drop(logits);
        return Ok(out);
    };
    // Qwen2-MoE: `final_hidden_states + shared_output`, a new tensor, then the all-reduce;
    // as the block returns, the shared output, then the router's logits die; the input (the
    // experts' output, in place) dies as the layer rebinds its hidden states.
    let sum = crate::engine::ops_opt::add(rt, &x, &shared, &format!("{layer}.moe.plus_shared"))?;
    let out = crate::engine::ops_tp::all_reduce(rt, sum, &format!("{layer}.moe.all_reduce"))?;
    drop(shared);
    drop(logits);
    drop(x);
    Ok(out)
}

/// Qwen2-MoE's shared expert on the block's input, scaled by its gate, as vLLM 0.8.5 runs it
/// (qwen2_moe.py L90-94, L146-150): `gate_up_proj`, `SiluAndMul` into a new tensor, `down_proj`
/// (no all-reduce: `reduce_results=False`), the activation dying as `x` is rebound and
/// `gate_up` as the MLP returns; then `shared_expert_gate(x)` (`[M, 1]`), its sigmoid, the
/// gate's logit dying, the product with the shared output (a new `[M, H]`), the sigmoid and the
/// unscaled output dying. 16-bit weights only (MoE models are), so no quantized generation.
fn shared_expert_forward(
    rt: &Runtime,
    x: &Tensor,
    se: &SharedExpert,
    act: DType,
    layer: &str,
) -> Result<Tensor> {
    let how = MlpRun {
        width: se.width,
        act,
        gemma: false,
        frees_gate_up: false,
        all_reduce: false,
        generation: 0,
    };
    let out = mlp_forward(
        rt,
        x,
        (&se.gate_up, &se.down),
        &how,
        &format!("{layer}.shared_expert"),
    )?;
    let g = crate::quant::dense_matmul_as(
        rt,
        x,
        &se.gate,
        &format!("{layer}.shared_expert_gate"),
        act,
        &format!("{layer}.shared_expert_gate.out"),
        Category::Activation,
    )?;
    ops_moe::sigmoid_scale(rt, g, out, &format!("{layer}.shared_expert"))
}

/// `LlamaMLP`'s parameters: `gate_up_proj` (this rank's gate rows, then its up rows) and
/// `down_proj` (its columns).
fn load_dense_mlp(
    ld: &mut Loader,
    cfg: &ModelConfig,
    p: &str,
    i_part: (usize, usize),
) -> Result<Mlp> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let gate_up_name = format!("{p}.mlp.gate_up_proj.weight");
    let gate_up = if cfg.fused_checkpoint() {
        // Gate rows first, then up (MergedColumnParallelLinear's order, and Phi-3's
        // `gate, up = gate_up.chunk(2)`).
        ld.fused_parts(
            &[gate_up_name.clone(), gate_up_name.clone()],
            &[2 * i; 2],
            &[i_part, (i + i_part.0, i_part.1)],
            h,
            &gate_up_name,
        )?
    } else {
        ld.fused_parts(
            &[
                format!("{p}.mlp.gate_proj.weight"),
                format!("{p}.mlp.up_proj.weight"),
            ],
            &[i, i],
            &[i_part, i_part],
            h,
            &gate_up_name,
        )?
    };
    let down = ld.linear_slice(
        &format!("{p}.mlp.down_proj.weight"),
        Slice::cols(h, i, i_part.0, i_part.1),
    )?;
    Ok(Mlp::Dense { gate_up, down })
}

/// A sparse block's parameters in the order vLLM 0.8.5 creates them: Mixtral's router, then
/// its experts (mixtral.py L80-97); Qwen3-MoE's experts, then its router (qwen3_moe.py
/// L113-126). `w13_weight` holds each expert's gate rows then its up rows, `w2_weight` each
/// expert's down columns, this rank's share of the width in both (`FusedMoE._load_w13`,
/// `_load_w2`, layer.py L579-613); the checkpoint names map through
/// `make_expert_params_mapping` (layer.py L890-906).
fn load_moe_block(
    ld: &mut Loader,
    cfg: &ModelConfig,
    m: &crate::model::config::MoeShape,
    shard: &TpShard,
    p: &str,
) -> Result<MoeBlock> {
    let h = cfg.hidden_size;
    let (block, [gate_n, up_n, down_n]) = crate::model::config::MoeShape::names(&cfg.arch);
    let width = m.expert_intermediate_size;
    let (first, len) = shard.expert_rows(width);
    let e = m.num_experts;
    let router = |ld: &mut Loader| ld.dense(&format!("{p}.{block}.gate.weight"), &[e, h]);
    let gate_first = cfg.arch == "mixtral";
    let gate = if gate_first { Some(router(ld)?) } else { None };
    let x = |ex: usize, n: &str| format!("{p}.{block}.experts.{ex}.{n}.weight");
    let w13_parts: Vec<(String, Slice)> = (0..e)
        .flat_map(|ex| [gate_n, up_n].map(|n| (x(ex, n), Slice::rows(width, h, first, len))))
        .collect();
    let w13 = ld.stacked(
        &w13_parts,
        &[e, 2 * len, h],
        &format!("{p}.{block}.experts.w13_weight"),
    )?;
    let w2_parts: Vec<(String, Slice)> = (0..e)
        .map(|ex| (x(ex, down_n), Slice::cols(h, width, first, len)))
        .collect();
    let w2 = ld.stacked(
        &w2_parts,
        &[e, h, len],
        &format!("{p}.{block}.experts.w2_weight"),
    )?;
    let gate = match gate {
        Some(g) => g,
        None => router(ld)?,
    };
    // Qwen2-MoE's shared expert, then its gate (qwen2_moe.py L126-138).
    let shared = match m.shared_expert_intermediate_size {
        0 => None,
        width => {
            let (first, len) = shard.expert_rows(width);
            let x = format!("{p}.{block}.shared_expert");
            let gate_up = ld.fused_parts(
                &[
                    format!("{x}.gate_proj.weight"),
                    format!("{x}.up_proj.weight"),
                ],
                &[width, width],
                &[(first, len), (first, len)],
                h,
                &format!("{x}.gate_up_proj.weight"),
            )?;
            let down = ld.linear_slice(
                &format!("{x}.down_proj.weight"),
                Slice::cols(h, width, first, len),
            )?;
            let gate = ld.dense(&format!("{p}.{block}.shared_expert_gate.weight"), &[1, h])?;
            Some(SharedExpert {
                gate_up,
                down,
                gate,
                width: len,
            })
        }
    };
    Ok(MoeBlock {
        gate,
        w13,
        w2,
        shared,
    })
}

/// vLLM's `RotaryEmbedding._compute_cos_sin_cache` then `.to(dtype)` (rotary_embedding.py at
/// 380e1863), run on the device as the model is built: inv_freq (arange, divide, power,
/// reciprocal), t, the outer product, cos, sin, their concatenation in f32, then the cast; the
/// f32 intermediates die, the cast stays.
///
/// With linear scaling (Gemma 3's global layers) the cache has `max_position · factor` rows
/// (`LinearScalingRotaryEmbedding._compute_cos_sin_cache`, rotary_embedding.py L404-430 at
/// 0.8.5: `t = arange(max_len) / factor`); the `t / factor` and the `torch.cat` of its one-entry
/// list are modelled as the plain cache's steps.
fn rotary_cache(
    rt: &Runtime,
    cfg: &ModelConfig,
    act: DType,
    (_theta, factor): (f64, f64),
) -> Result<Tensor> {
    rt.set_op("rotary_emb.cos_sin_cache");
    let rows = (cfg.max_position_embeddings.max(1) as f64 * factor.max(1.0)) as usize;
    let (pos, rot) = (rows, cfg.head_dim);
    let t32 = |name: &str, shape: &[usize]| {
        rt.tensor(
            format!("rotary_emb.{name}"),
            Category::Weight,
            shape,
            DType::F32,
        )
    };
    let inv_freq = {
        let a = t32("arange", &[rot / 2])?;
        let b = t32("arange_div", &[rot / 2])?;
        drop(a);
        let c = t32("pow", &[rot / 2])?;
        drop(b);
        let inv = t32("inv_freq", &[rot / 2])?;
        drop(c);
        inv
    };
    let t = t32("t", &[pos])?;
    let freqs = t32("freqs", &[pos, rot / 2])?;
    let cos = t32("cos", &[pos, rot / 2])?;
    let sin = t32("sin", &[pos, rot / 2])?;
    let cache32 = t32("cache_f32", &[pos, rot])?;
    drop((inv_freq, t, freqs, cos, sin));
    let cache = rt.tensor(
        "rotary_emb.cos_sin_cache",
        Category::Weight,
        &[pos, rot],
        act,
    )?;
    drop(cache32);
    rt.set_op("load");
    Ok(cache)
}

/// How one tensor-parallel rank's share of a Llama model is cut, as vLLM 380e1863 cuts it
/// (linear.py `QKVParallelLinear` L640-700, `MergedColumnParallelLinear`, `RowParallelLinear`;
/// vocab_parallel_embedding.py `VocabParallelEmbedding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpShard {
    pub rank: usize,
    pub size: usize,
}

impl TpShard {
    /// This runtime's shard, checking that the model divides as vLLM requires
    /// (config.py `verify_with_parallel_config`, linear.py `divide`).
    pub fn of(rt: &Runtime, cfg: &ModelConfig) -> Result<Self> {
        let (rank, size) = rt.tp().map_or((0, 1), |t| (t.rank, t.size));
        let s = TpShard { rank, size };
        s.check(cfg)?;
        Ok(s)
    }

    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        let n = self.size;
        if n <= 1 {
            return Ok(());
        }
        let bad = |what: String| Err(Error::Request(format!("--tp {n}: {what}")));
        if !cfg.num_heads.is_multiple_of(n) {
            return bad(format!(
                "the model's {} attention heads do not divide over {n} GPUs (vLLM requires num_attention_heads % tensor_parallel_size == 0)",
                cfg.num_heads
            ));
        }
        let kv = cfg.num_kv_heads;
        if kv >= n && !kv.is_multiple_of(n) || kv < n && !n.is_multiple_of(kv) {
            return bad(format!(
                "the model's {kv} KV heads and {n} GPUs do not divide either way (vLLM splits KV heads when there are at least as many as GPUs, else replicates each over GPUs: one must divide the other)"
            ));
        }
        if !cfg.intermediate_size.is_multiple_of(n) {
            return bad(format!(
                "the MLP width {} does not divide over {n} GPUs",
                cfg.intermediate_size
            ));
        }
        if let Some(m) = cfg.moe.as_ref() {
            if !m.expert_intermediate_size.is_multiple_of(n) {
                return bad(format!(
                    "each expert's width {} does not divide over {n} GPUs (FusedMoE asserts intermediate_size % tp_size == 0)",
                    m.expert_intermediate_size
                ));
            }
            if m.shared_expert_intermediate_size > 0 && n > m.num_experts {
                // Qwen2MoeSparseMoeBlock.__init__ (qwen2_moe.py L108-111 at 0.8.5).
                return bad(format!(
                    "vLLM refuses it: \"Tensor parallel size {n} is greater than the number of experts {}.\"",
                    m.num_experts
                ));
            }
            if !m.shared_expert_intermediate_size.is_multiple_of(n) {
                return bad(format!(
                    "the shared expert's width {} does not divide over {n} GPUs (MergedColumnParallelLinear)",
                    m.shared_expert_intermediate_size
                ));
            }
        }
        if !cfg.padded_vocab().is_multiple_of(n) {
            return bad(format!(
                "the padded vocabulary ({} rows) does not divide over {n} GPUs",
                cfg.padded_vocab()
            ));
        }
        Ok(())
    }

    /// KV heads on each rank: split, or one head replicated over `size / kv` ranks
    /// (linear.py L664-671, `num_kv_head_replicas`).
    pub fn local_kv_heads(&self, cfg: &ModelConfig) -> usize {
        if cfg.num_kv_heads >= self.size {
            cfg.num_kv_heads / self.size
        } else {
            1
        }
    }

    /// The shape this rank computes.
    pub fn local_config(&self, cfg: &ModelConfig) -> ModelConfig {
        let mut c = cfg.clone();
        c.num_heads = cfg.num_heads / self.size;
        c.num_kv_heads = self.local_kv_heads(cfg);
        c.intermediate_size = cfg.intermediate_size / self.size;
        if let Some(m) = &mut c.moe {
            m.expert_intermediate_size /= self.size;
        }
        c
    }

    /// (first row, rows) of q_proj this rank holds.
    pub fn q_rows(&self, cfg: &ModelConfig) -> (usize, usize) {
        let len = cfg.q_dim() / self.size;
        (self.rank * len, len)
    }

    /// (first row, rows) of k_proj (and v_proj): the rank's KV heads, or the one head it
    /// shares with `size / kv` ranks (`shard_id = tp_rank // num_kv_head_replicas`).
    pub fn kv_rows(&self, cfg: &ModelConfig) -> (usize, usize) {
        let heads = self.local_kv_heads(cfg);
        let first_head = if cfg.num_kv_heads >= self.size {
            self.rank * heads
        } else {
            self.rank / (self.size / cfg.num_kv_heads)
        };
        (first_head * cfg.head_dim, heads * cfg.head_dim)
    }

    /// (first row, rows) of each expert's gate and up projections (and its down projection's
    /// columns) for an expert `width` wide: `intermediate_size_per_partition`
    /// (fused_moe/layer.py L470-472 at 0.8.5).
    pub fn expert_rows(&self, width: usize) -> (usize, usize) {
        let len = width / self.size;
        (self.rank * len, len)
    }

    /// (first row, rows) of gate_proj and up_proj.
    pub fn mlp_rows(&self, cfg: &ModelConfig) -> (usize, usize) {
        let len = cfg.intermediate_size / self.size;
        (self.rank * len, len)
    }

    /// (first row, rows) of the padded vocabulary (embedding and lm_head).
    pub fn vocab_rows(&self, padded_vocab: usize) -> (usize, usize) {
        let len = padded_vocab / self.size;
        (self.rank * len, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, DeviceSpec};
    use crate::memory::EventKind;
    use crate::model::weights::{StoredDtype, SyntheticWeights};

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
    fn dry_load(cfg: &ModelConfig) -> (Runtime, LlamaModel) {
        let device = Device::open(&DeviceSpec::parse("sim:h100-80gb:dry").unwrap()).unwrap();
        let opts = LoadOptions {
            quant: Quant::F16,
            int8_threshold: 0.0,
            int8_layout: device.int8_tile_layout(),
            attn_scalars: 0,
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
    fn dry_trace(cfg: &ModelConfig, tokens: usize, layer: Option<u32>) -> Vec<(bool, String, u64)> {
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

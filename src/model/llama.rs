//! The Llama-family forward pass, written once over device-agnostic ops: embedding, RMSNorm,
//! RoPE, causal GQA attention, SwiGLU MLP, final norm, lm_head on the last token of each
//! sequence (as vLLM's profile run computes logits).

use std::cell::Cell;

pub use super::batch::Batch;
use super::config::ModelConfig;
pub use super::loader::{LoadOptions, LoadStats};
use super::loader::{Loader, Slice};
use super::weights::WeightSource;
use crate::base::error::{Error, Result};
use crate::engine::ops;
use crate::engine::progress::Progress;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
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

/// vLLM's `LlamaDecoderLayer`; `gate_up` is a `MergedColumnParallelLinear`.
pub struct Layer {
    pub attn: Attention,
    pub gate_up: FusedLinear,
    pub down: Linear,
    pub input_norm: Tensor,
    pub post_norm: Tensor,
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
        let shard = TpShard::of(rt, cfg)?;
        let local = shard.local_config(cfg);
        let mut ld = Loader::new(rt, src, opts, cfg.loader_reads());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (h, i, q, kv, v) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.vocab_size,
        );
        // vLLM's VocabParallelEmbedding and ParallelLMHead pad the vocabulary to 64 rows
        // (vocab_parallel_embedding.py L16, L47-50): the padding is allocated too.
        let vp = cfg.padded_vocab();
        let (v_first, v_len) = shard.vocab_rows(vp);
        let embed = ld.vocab_shard("model.embed_tokens.weight", v, h, vp, v_first, v_len)?;
        let (q_part, kv_part, i_part) =
            (shard.q_rows(cfg), shard.kv_rows(cfg), shard.mlp_rows(cfg));
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut rope_cache = None;
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
            if rope_cache.is_none() {
                rope_cache = Some(rotary_cache(rt, cfg, act)?);
            }
            // Qwen3Attention.__init__ makes q_norm and k_norm after the attention layer.
            let qk_norm = if cfg.qk_norm() {
                let hd = cfg.head_dim;
                Some((
                    ld.dense(&format!("{p}.self_attn.q_norm.weight"), &[hd])?,
                    ld.dense(&format!("{p}.self_attn.k_norm.weight"), &[hd])?,
                ))
            } else {
                None
            };
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
            let input_norm = ld.dense(&format!("{p}.input_layernorm.weight"), &[h])?;
            let post_norm = ld.dense(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
            layers.push(Layer {
                attn: Attention {
                    qkv,
                    o: op,
                    bias,
                    qk_norm,
                },
                gate_up,
                down,
                input_norm,
                post_norm,
            });
        }
        let rope_cache = match rope_cache {
            Some(c) => c,
            None => rotary_cache(rt, cfg, act)?,
        };
        rt.set_layer(None);
        let norm = ld.dense("model.norm.weight", &[h])?;
        // bitsandbytes leaves lm_head in 16 bits.
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(ld.vocab_shard("lm_head.weight", v, h, vp, v_first, v_len)?)
        };
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
        for l in &self.layers {
            b += l.input_norm.nbytes() + l.post_norm.nbytes();
            b += l.attn.qkv.weight_bytes() + l.gate_up.weight_bytes();
            b += l.attn.o.weight_bytes() + l.down.weight_bytes();
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
        super::sampler::logits_f32(rt, &hidden, self.lm_head(), &rows, self.cfg.vocab_size)?
            .ok_or_else(|| {
                Error::Request("the logits were gathered to tensor-parallel rank 0".into())
            })
    }

    /// One forward pass over every token, as vLLM's `LlamaModel.forward`: the final hidden
    /// states `[tokens, hidden]` in the model dtype, after the last norm. The logits come from
    /// `sampler::compute_logits`.
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
            if let Some((qn, kn)) = &layer.attn.qk_norm {
                q = ops::rms_norm(
                    rt,
                    &q,
                    qn,
                    local.rms_norm_eps as f32,
                    &format!("{l}.q_norm"),
                )?;
                k = ops::rms_norm(
                    rt,
                    &k,
                    kn,
                    local.rms_norm_eps as f32,
                    &format!("{l}.k_norm"),
                )?;
            }
            ops::rope(
                rt,
                &mut q,
                &mut k,
                &positions,
                local.attn_shape(),
                local.rope_theta,
            )?;
            let a = if self.skip_attention.get() {
                ops::attention_skipped(rt, &q, &format!("{l}.attn"))?
            } else {
                ops::attention(
                    rt,
                    &q,
                    &k,
                    &v,
                    &batch.seq_lens,
                    local.attn_shape(),
                    &format!("{l}.attn"),
                )?
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
            let layer_in_kept = if li == 0 {
                drop(layer_in);
                None
            } else {
                Some(layer_in)
            };
            ops::fused_add_rms_norm(rt, &mut o, &mut residual, &layer.post_norm, eps)?;
            // LlamaMLP.forward: gate_up, SiluAndMul's new output, down_proj; the activation dies
            // when `x` is rebound to down_proj's output, gate_up when the MLP returns (at
            // 380e1863), or as soon as `x` is rebound to the activation (#10339).
            let gate_up = layer
                .gate_up
                .forward(rt, &o, &format!("{l}.gate_up_proj"), gen, act)?;
            let i = local.intermediate_size;
            let names = ["gate", "up"].map(|n| format!("{l}.{n}"));
            let mut it = FusedLinear::split(&gate_up, &[i, i], &names).into_iter();
            let (Some(mut gate), Some(up)) = (it.next(), it.next()) else {
                return Err(Error::Request("gate_up split".into()));
            };
            let act_out = ops::silu_and_mul(rt, &mut gate, &up, &format!("{l}.act"))?;
            drop((gate, up));
            let gate_up = if self.mlp_frees_gate_up {
                drop(gate_up);
                None
            } else {
                Some(gate_up)
            };
            let down = layer
                .down
                .forward(rt, &act_out, &format!("{l}.down_proj"), gen, act)?;
            let down =
                crate::engine::ops_tp::all_reduce(rt, down, &format!("{l}.down_proj.all_reduce"))?;
            drop(act_out);
            drop(gate_up);
            // The decoder rebinds `hidden_states` to the MLP's output: o_proj's output dies;
            // then the model's loop rebinds its own: the previous layer's output dies.
            drop(o);
            drop(layer_in_kept);
            hidden = Some(down);
        }
        rt.set_layer(None);
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

/// vLLM's `RotaryEmbedding._compute_cos_sin_cache` then `.to(dtype)` (rotary_embedding.py at
/// 380e1863), run on the device as the model is built: inv_freq (arange, divide, power,
/// reciprocal), t, the outer product, cos, sin, their concatenation in f32, then the cast; the
/// f32 intermediates die, the cast stays.
fn rotary_cache(rt: &Runtime, cfg: &ModelConfig, act: DType) -> Result<Tensor> {
    rt.set_op("rotary_emb.cos_sin_cache");
    let (pos, rot) = (cfg.max_position_embeddings.max(1), cfg.head_dim);
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

//! The Llama-family forward pass, written once over device-agnostic ops: embedding, RMSNorm,
//! RoPE, causal GQA attention, SwiGLU MLP, final norm, lm_head on the last token of each
//! sequence (as vLLM's profile run computes logits).

use std::cell::Cell;

use super::config::ModelConfig;
use super::loader::Loader;
pub use super::loader::{LoadOptions, LoadStats};
use super::weights::WeightSource;
use crate::error::{Error, Result};
use crate::ops;
use crate::progress::Progress;
use crate::quant::{Linear, Quant};
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub biases: Option<[Tensor; 3]>,
}

pub struct Layer {
    pub input_norm: Tensor,
    pub attn: Attention,
    pub post_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

pub struct LlamaModel {
    pub cfg: ModelConfig,
    pub quant: Quant,
    pub act: DType,
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    /// `[Vp, hidden]`, 16-bit (bitsandbytes leaves it unquantized); `None` when tied to the
    /// embedding.
    pub lm_head: Option<Tensor>,
    /// How fast the weights came off the source (zero on a dry run, which reads nothing).
    pub load_stats: LoadStats,
    generation: Cell<u32>,
}

/// One forward batch: token ids of all sequences laid end to end.
#[derive(Clone, Debug)]
pub struct Batch {
    pub ids: Vec<u32>,
    pub seq_lens: Vec<usize>,
}

impl Batch {
    /// `tokens` split into `seqs` sequences as evenly as vLLM's dummy profile batch does, with
    /// deterministic ids.
    pub fn dummy(tokens: usize, seqs: usize, vocab: usize) -> Self {
        let base = tokens / seqs;
        let seq_lens: Vec<usize> = (0..seqs)
            .map(|i| base + usize::from(i < tokens % seqs))
            .collect();
        let ids = (0..tokens)
            .map(|i| ((i * 7919 + 13) % vocab) as u32)
            .collect();
        Batch { ids, seq_lens }
    }

    pub fn tokens(&self) -> usize {
        self.ids.len()
    }
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
        let mut ld = Loader::new(rt, src, opts, cfg.tensor_shapes().len());
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
        let embed = ld.dense_padded("model.embed_tokens.weight", v, h, vp)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("model.layers.{l}");
            let input_norm = ld.dense(&format!("{p}.input_layernorm.weight"), &[h])?;
            let qp = ld.linear(&format!("{p}.self_attn.q_proj.weight"), q, h)?;
            let kp = ld.linear(&format!("{p}.self_attn.k_proj.weight"), kv, h)?;
            let vp = ld.linear(&format!("{p}.self_attn.v_proj.weight"), kv, h)?;
            let biases = if cfg.attention_bias {
                Some([
                    ld.dense(&format!("{p}.self_attn.q_proj.bias"), &[q])?,
                    ld.dense(&format!("{p}.self_attn.k_proj.bias"), &[kv])?,
                    ld.dense(&format!("{p}.self_attn.v_proj.bias"), &[kv])?,
                ])
            } else {
                None
            };
            let op = ld.linear(&format!("{p}.self_attn.o_proj.weight"), h, q)?;
            let post_norm = ld.dense(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
            let gate = ld.linear(&format!("{p}.mlp.gate_proj.weight"), i, h)?;
            let up = ld.linear(&format!("{p}.mlp.up_proj.weight"), i, h)?;
            let down = ld.linear(&format!("{p}.mlp.down_proj.weight"), h, i)?;
            layers.push(Layer {
                input_norm,
                attn: Attention {
                    q: qp,
                    k: kp,
                    v: vp,
                    o: op,
                    biases,
                },
                post_norm,
                gate,
                up,
                down,
            });
        }
        rt.set_layer(None);
        let norm = ld.dense("model.norm.weight", &[h])?;
        // bitsandbytes leaves lm_head in 16 bits.
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(ld.dense_padded("lm_head.weight", v, h, vp)?)
        };
        Ok(LlamaModel {
            cfg: cfg.clone(),
            quant: opts.quant,
            act,
            embed,
            layers,
            norm,
            lm_head,
            load_stats: LoadStats {
                total_seconds: started.elapsed().as_secs_f64(),
                ..ld.stats
            },
            generation: Cell::new(0),
        })
    }

    /// Bytes of all weights as stored on the device.
    pub fn weight_bytes(&self) -> u64 {
        let mut b = self.embed.nbytes() + self.norm.nbytes();
        for l in &self.layers {
            b += l.input_norm.nbytes() + l.post_norm.nbytes();
            for lin in [
                &l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o, &l.gate, &l.up, &l.down,
            ] {
                b += lin.weight_bytes();
            }
            if let Some(bs) = &l.attn.biases {
                b += bs.iter().map(Tensor::nbytes).sum::<u64>();
            }
        }
        b + self.lm_head.as_ref().map_or(0, Tensor::nbytes)
    }

    /// The output projection over the padded vocabulary, `[Vp, hidden]`.
    pub fn lm_head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// One forward pass without the sampler: the f32 logits `[seqs, vocab]` of the last token of
    /// each sequence.
    pub fn forward(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let hidden = self.forward_hidden(rt, batch)?;
        let rows = super::sampler::last_token_rows(&batch.seq_lens);
        super::sampler::logits_f32(rt, &hidden, self.lm_head(), &rows, self.cfg.vocab_size)
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
        let mut x = ops::embedding(rt, &batch.ids, &self.embed, act)?;
        let n_layers = self.layers.len() as u32;
        for (li, layer) in self.layers.iter().enumerate() {
            rt.check_cancel()?;
            rt.set_layer(Some(li as u32));
            rt.progress(Progress::Layer {
                layer: li as u32,
                of: n_layers,
            });
            let l = format!("layers.{li}");
            let h = ops::rms_norm(rt, &x, &layer.input_norm, eps, &format!("{l}.input_norm"))?;
            let mut q = layer
                .attn
                .q
                .forward(rt, &h, &format!("{l}.q_proj"), gen, act)?;
            let mut k = layer
                .attn
                .k
                .forward(rt, &h, &format!("{l}.k_proj"), gen, act)?;
            let v0 = layer
                .attn
                .v
                .forward(rt, &h, &format!("{l}.v_proj"), gen, act)?;
            drop(h);
            let mut v = v0;
            if let Some([bq, bk, bv]) = &layer.attn.biases {
                ops::add_bias(rt, &mut q, bq)?;
                ops::add_bias(rt, &mut k, bk)?;
                ops::add_bias(rt, &mut v, bv)?;
            }
            ops::rope(rt, &mut q, &mut k, &positions, cfg)?;
            let a = ops::attention(rt, &q, &k, &v, &batch.seq_lens, cfg, &format!("{l}.attn"))?;
            drop((q, k, v));
            let o = layer
                .attn
                .o
                .forward(rt, &a, &format!("{l}.o_proj"), gen, act)?;
            drop(a);
            ops::add_assign(rt, &mut x, &o)?;
            drop(o);
            let h2 = ops::rms_norm(rt, &x, &layer.post_norm, eps, &format!("{l}.post_norm"))?;
            let mut gate = layer
                .gate
                .forward(rt, &h2, &format!("{l}.gate_proj"), gen, act)?;
            let up = layer
                .up
                .forward(rt, &h2, &format!("{l}.up_proj"), gen, act)?;
            drop(h2);
            ops::silu_mul(rt, &mut gate, &up)?;
            drop(up);
            let down = layer
                .down
                .forward(rt, &gate, &format!("{l}.down_proj"), gen, act)?;
            drop(gate);
            ops::add_assign(rt, &mut x, &down)?;
        }
        rt.set_layer(None);
        let xn = ops::rms_norm(rt, &x, &self.norm, eps, "final.norm")?;
        drop(x);
        Ok(xn)
    }
}

//! OPT (`model_type: opt`) as vLLM 380e1863 runs it (`vllm/model_executor/models/opt.py`):
//! token embedding padded to 64 rows (tied to the lm_head), learned positions with an offset
//! of 2, pre-LN (125m) or post-LN (350m) decoder layers of multi-head attention and a ReLU MLP
//! with biases, `project_in`/`project_out` when the embedding is narrower than the hidden
//! size. Every intermediate is allocated through the framework allocator and dropped where
//! Python drops it in opt.py (a local lives until its function returns or it is rebound).
//!
//! One difference in allocation: vLLM fuses q/k/v into `QKVParallelLinear` (one `[3H, H]`
//! weight and one `[T, 3H]` output, split by `chunk` views, opt.py L106-107); here q, k and v
//! are three `[H, H]` weights and three `[T, H]` outputs with the same bytes and lifetimes.

use std::cell::Cell;

use crate::base::error::{Error, Result};
use crate::engine::ops;
use crate::engine::ops_opt;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;
use crate::model::batch::Batch;
use crate::model::config::{ModelConfig, OptShape, OPT_POSITION_OFFSET};
use crate::model::layers::linear::BiasedLinear;
use crate::model::layers::norm::LayerNorm;
use crate::model::loader::{LoadOptions, LoadStats, Loader};
use crate::model::weights::WeightSource;
use crate::quant::{FusedLinear, Linear, Quant};

/// `OPTDecoderLayer` (opt.py L113-185).
pub struct OptLayer {
    /// vLLM's `QKVParallelLinear` (opt.py L78-84): q, k and v stacked, one bias `[3·hidden]`.
    pub qkv: FusedLinear,
    pub qkv_bias: Option<Tensor>,
    pub out: BiasedLinear,
    pub self_attn_layer_norm: LayerNorm,
    pub fc1: BiasedLinear,
    pub fc2: BiasedLinear,
    pub final_layer_norm: LayerNorm,
}

pub struct OptModel {
    pub cfg: ModelConfig,
    /// The shape this rank computes (heads and the MLP width divided over the
    /// tensor-parallel ranks; `cfg` itself with one GPU).
    pub local: ModelConfig,
    /// This rank's first row of the padded vocabulary (0 with one GPU).
    pub vocab_first_row: usize,
    pub shape: OptShape,
    pub quant: Quant,
    pub act: DType,
    /// `[Vp, word_embed_proj_dim]`, rows past the vocabulary zero; also the lm_head.
    pub embed: Tensor,
    /// `[max_position_embeddings + 2, hidden]`
    pub positions: Tensor,
    pub project_out: Option<Linear>,
    pub project_in: Option<Linear>,
    pub final_layer_norm: Option<LayerNorm>,
    pub layers: Vec<OptLayer>,
    /// Every attention layer's 0-dim f32 scale tensors (`LoadOptions::attn_scalars` each).
    pub attn_scalars: Vec<Tensor>,
    pub load_stats: LoadStats,
    generation: Cell<u32>,
}

impl OptModel {
    /// Loads every weight through the framework allocator in the order vLLM's `OPTDecoder`
    /// creates its parameters (opt.py L188-240): embeddings, project_out/in, final norm,
    /// then each layer. q/k/v/out_proj, fc1 and fc2 are quantized as `opts.quant` says
    /// (vLLM's bitsandbytes target modules, opt.py L318-329); embeddings, positions and
    /// norms stay 16-bit; project_in/out stay 16-bit unless the checkpoint stores them
    /// quantized.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg.opt.clone().ok_or_else(|| {
            Error::Request(format!(
                "model_type '{}' is not OPT; load it as a Llama-family model",
                cfg.arch
            ))
        })?;
        let started = std::time::Instant::now();
        // vLLM's OPT is tensor parallel like its Llama (opt.py: QKVParallelLinear, a
        // RowParallelLinear out_proj and fc2, a ColumnParallelLinear fc1, the vocab-parallel
        // embedding tied to the lm_head); positions, project_in/out and the norms are whole.
        let shard = crate::model::layers::tp::TpShard::of(rt, cfg)?;
        let local = shard.local_config(cfg);
        let mut ld = Loader::new(rt, src, opts, cfg.tensor_shapes().len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (h, f, p) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            shape.word_embed_proj_dim,
        );
        let d = "model.decoder";
        let (v_first, v_len) = shard.vocab_rows(cfg.padded_vocab());
        let embed = ld.vocab_shard(
            &format!("{d}.embed_tokens.weight"),
            cfg.vocab_size,
            p,
            cfg.padded_vocab(),
            v_first,
            v_len,
        )?;
        let positions = ld.dense(
            &format!("{d}.embed_positions.weight"),
            &[cfg.max_position_embeddings + OPT_POSITION_OFFSET, h],
        )?;
        let (project_out, project_in) = if p != h {
            (
                Some(ld.linear_as(&format!("{d}.project_out.weight"), p, h, false)?),
                Some(ld.linear_as(&format!("{d}.project_in.weight"), h, p, false)?),
            )
        } else {
            (None, None)
        };
        let norm = |ld: &mut Loader, name: &str| -> Result<LayerNorm> {
            Ok(LayerNorm {
                w: ld.dense(&format!("{name}.weight"), &[h])?,
                b: ld.dense(&format!("{name}.bias"), &[h])?,
            })
        };
        let final_layer_norm = if shape.has_final_norm() {
            Some(norm(&mut ld, &format!("{d}.final_layer_norm"))?)
        } else {
            None
        };
        let bias = shape.enable_bias;
        let (q_first, q_len) = shard.q_rows(cfg);
        let (f_first, f_len) = shard.mlp_rows(cfg);
        // A column-parallel layer: this rank's rows of the weight and of the bias.
        let col = |ld: &mut Loader, name: &str, n: usize, k: usize, first: usize, len: usize| {
            Ok::<_, Error>(BiasedLinear {
                w: ld.linear_slice(
                    &format!("{name}.weight"),
                    crate::model::loader::Slice::rows(n, k, first, len),
                )?,
                b: if bias {
                    Some(ld.dense_concat_parts(
                        &[format!("{name}.bias")],
                        &[n],
                        &[(first, len)],
                        &format!("{name}.bias"),
                    )?)
                } else {
                    None
                },
                adds_bias: true,
            })
        };
        // A row-parallel layer: this rank's columns of the weight, the whole bias.
        let row = |ld: &mut Loader, name: &str, n: usize, k: usize, first: usize, len: usize| {
            Ok::<_, Error>(BiasedLinear {
                w: ld.linear_slice(
                    &format!("{name}.weight"),
                    crate::model::loader::Slice::cols(n, k, first, len),
                )?,
                b: if bias {
                    Some(ld.dense(&format!("{name}.bias"), &[n])?)
                } else {
                    None
                },
                adds_bias: shard.rank == 0,
            })
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut attn_scalars = Vec::new();
        for l in 0..cfg.num_layers {
            rt.set_layer(Some(l as u32));
            let pre = format!("{d}.layers.{l}");
            let a = format!("{pre}.self_attn");
            let proj = |p: &str| ["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.{p}"));
            let part = [(q_first, q_len); 3];
            let qkv = ld.fused_parts(
                &proj("weight"),
                &[h; 3],
                &part,
                h,
                &format!("{a}.qkv_proj.weight"),
            )?;
            let qkv_bias = if bias {
                Some(ld.dense_concat_parts(
                    &proj("bias"),
                    &[h; 3],
                    &part,
                    &format!("{a}.qkv_proj.bias"),
                )?)
            } else {
                None
            };
            let out = row(&mut ld, &format!("{a}.out_proj"), h, h, q_first, q_len)?;
            // OPTAttention.__init__ makes `self.attn` after out_proj (opt.py L92-104 at 0.8.5).
            attn_scalars.extend(crate::model::loader::attention_scalars(
                rt,
                &format!("{a}.attn"),
                opts.attn_scalars,
            )?);
            layers.push(OptLayer {
                qkv,
                qkv_bias,
                out,
                self_attn_layer_norm: norm(&mut ld, &format!("{pre}.self_attn_layer_norm"))?,
                fc1: col(&mut ld, &format!("{pre}.fc1"), f, h, f_first, f_len)?,
                fc2: row(&mut ld, &format!("{pre}.fc2"), h, f, f_first, f_len)?,
                final_layer_norm: norm(&mut ld, &format!("{pre}.final_layer_norm"))?,
            });
        }
        rt.set_layer(None);
        Ok(OptModel {
            cfg: cfg.clone(),
            local,
            vocab_first_row: v_first,
            shape,
            quant: opts.quant,
            act,
            embed,
            positions,
            project_out,
            project_in,
            final_layer_norm,
            layers,
            attn_scalars,
            load_stats: LoadStats {
                total_seconds: started.elapsed().as_secs_f64(),
                ..ld.stats
            },
            generation: Cell::new(0),
        })
    }

    /// Bytes of all weights as stored on the device (the embedding with its padded rows).
    pub fn weight_bytes(&self) -> u64 {
        let mut b = self.embed.nbytes() + self.positions.nbytes();
        b += self.attn_scalars.iter().map(|t| t.nbytes()).sum::<u64>();
        b += [&self.project_out, &self.project_in]
            .iter()
            .filter_map(|l| l.as_ref())
            .map(Linear::weight_bytes)
            .sum::<u64>();
        b += self.final_layer_norm.as_ref().map_or(0, LayerNorm::bytes);
        for l in &self.layers {
            b += l.qkv.weight_bytes() + l.qkv_bias.as_ref().map_or(0, |t| t.nbytes());
            for lin in [&l.out, &l.fc1, &l.fc2] {
                b += lin.weight_bytes();
            }
            b += l.self_attn_layer_norm.bytes() + l.final_layer_norm.bytes();
        }
        b
    }

    /// The tied lm_head: `embed_tokens` (opt.py L341-342), `[Vp, word_embed_proj_dim]`.
    pub fn lm_head(&self) -> &Tensor {
        &self.embed
    }

    /// `OPTDecoder.forward` (opt.py L249-279) over every token of the batch: the decoder
    /// output `[T, word_embed_proj_dim]` in the model dtype, after the final LayerNorm and
    /// project_out.
    pub fn forward_hidden(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let cfg = &self.cfg;
        let gen = self.generation.get();
        self.generation.set(gen + 1);
        batch.check_ids(cfg.vocab_size)?;
        if let Some(&n) = batch
            .seq_lens
            .iter()
            .find(|&&n| n > cfg.max_position_embeddings)
        {
            return Err(Error::Request(format!(
                "a sequence of {n} tokens is longer than OPT's {} learned positions",
                cfg.max_position_embeddings
            )));
        }
        let act = self.act;
        let t = batch.tokens();
        rt.set_layer(None);
        // L258: inputs_embeds = embed_tokens(input_ids) (vocab-parallel with more ranks).
        let inputs_embeds = if rt.tp().is_some() {
            crate::engine::ops_tp::vocab_parallel_embedding(
                rt,
                &batch.ids,
                &self.embed,
                self.vocab_first_row,
                cfg.vocab_size,
                act,
            )?
        } else {
            ops_opt::gather(rt, &batch.ids, &self.embed, act, "embed_tokens.out")?
        };
        // L259 (and L58): embed_positions(positions), which first makes `positions + 2`.
        let shifted = rt.tensor("positions+2", Category::Activation, &[t], DType::I64)?;
        let rows: Vec<u32> = batch
            .seq_lens
            .iter()
            .flat_map(|&n| 0..n)
            .map(|p| (p + OPT_POSITION_OFFSET) as u32)
            .collect();
        let pos_embeds = ops_opt::gather(rt, &rows, &self.positions, act, "embed_positions.out")?;
        drop(shifted);
        // L260-261: project_in rebinds inputs_embeds (the narrow one is freed).
        let inputs_embeds = match &self.project_in {
            Some(lin) => {
                let wide = lin.forward(rt, &inputs_embeds, "project_in", gen, act)?;
                drop(inputs_embeds);
                wide
            }
            None => inputs_embeds,
        };
        // L262. inputs_embeds and pos_embeds stay alive as locals until forward returns.
        let mut hidden = ops_opt::add(rt, &inputs_embeds, &pos_embeds, "embed.sum")?;
        for (li, layer) in self.layers.iter().enumerate() {
            crate::model::layers::decoder::enter_layer(rt, li, self.layers.len())?;
            // L268-271: the layer's input lives until `hidden_states` is rebound to its output.
            let out = self.layer_forward(rt, layer, &hidden, li, gen, batch)?;
            drop(hidden);
            hidden = out;
        }
        rt.set_layer(None);
        let eps = self.shape.layer_norm_eps as f32;
        // L275-276
        if let Some(n) = &self.final_layer_norm {
            let normed = ops_opt::layer_norm(rt, &hidden, &n.w, &n.b, eps, "final_layer_norm")?;
            drop(hidden);
            hidden = normed;
        }
        // L277-278
        if let Some(lin) = &self.project_out {
            let narrow = lin.forward(rt, &hidden, "project_out", gen, act)?;
            drop(hidden);
            hidden = narrow;
        }
        // Returning frees the locals.
        drop((inputs_embeds, pos_embeds));
        Ok(hidden)
    }

    /// `OPTDecoderLayer.forward` (opt.py L155-185) with `OPTAttention.forward` (L101-110).
    fn layer_forward(
        &self,
        rt: &Runtime,
        layer: &OptLayer,
        x: &Tensor,
        li: usize,
        gen: u32,
        batch: &Batch,
    ) -> Result<Tensor> {
        let act = self.act;
        let eps = self.shape.layer_norm_eps as f32;
        let pre_norm = self.shape.do_layer_norm_before;
        let l = format!("layers.{li}");
        // L161 residual = x; L163-164 pre-LN.
        let ln = &layer.self_attn_layer_norm;
        let normed = pre_norm
            .then(|| {
                ops_opt::layer_norm(
                    rt,
                    x,
                    &ln.w,
                    &ln.b,
                    eps,
                    &format!("{l}.self_attn_layer_norm"),
                )
            })
            .transpose()?;
        let h = normed.as_ref().unwrap_or(x);
        // L106-109: qkv, attention, out_proj; qkv and the attention output are freed when
        // OPTAttention.forward returns, after out_proj.
        // `qkv.chunk(3)`: views of one output, the bias added as F.linear (or bitsandbytes'
        // `out += bias`) adds it.
        let qkv = layer
            .qkv
            .forward(rt, h, &format!("{l}.qkv_proj"), gen, act)?;
        // This rank's heads (all of them with one GPU).
        let hd = self.local.num_heads * self.local.head_dim;
        let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
        let mut views = FusedLinear::split(&qkv, &[hd; 3], &names);
        if let Some(b) = &layer.qkv_bias {
            let bias_names = ["q", "k", "v"].map(|n| format!("{l}.{n}_bias"));
            for (x, bv) in views
                .iter_mut()
                .zip(FusedLinear::split_flat(b, &[hd; 3], &bias_names))
            {
                ops::add_bias(rt, x, &bv)?;
            }
        }
        let mut it = views.into_iter();
        let (Some(q), Some(k), Some(v)) = (it.next(), it.next(), it.next()) else {
            return Err(Error::Request("qkv split".into()));
        };
        let a = ops::attention(
            rt,
            &q,
            &k,
            &v,
            &batch.seq_lens,
            self.local.attn_shape(),
            &format!("{l}.attn"),
        )?;
        let o = layer
            .out
            .forward(rt, &a, &format!("{l}.out_proj"), gen, act)?;
        let o = crate::engine::ops_tp::all_reduce(rt, o, &format!("{l}.out_proj.all_reduce"))?;
        drop((q, k, v, qkv, a));
        // L165-168: the LN output is rebound (freed), then residual + attention output.
        drop(normed);
        let mut hs = ops_opt::add(rt, x, &o, &format!("{l}.residual_attn"))?;
        drop(o);
        // L170-171 post-LN.
        if !pre_norm {
            let n = ops_opt::layer_norm(
                rt,
                &hs,
                &ln.w,
                &ln.b,
                eps,
                &format!("{l}.self_attn_layer_norm"),
            )?;
            drop(hs);
            hs = n;
        }
        // L174 residual = hs; L176-177 pre-LN.
        let fln = &layer.final_layer_norm;
        let normed = pre_norm
            .then(|| {
                ops_opt::layer_norm(
                    rt,
                    &hs,
                    &fln.w,
                    &fln.b,
                    eps,
                    &format!("{l}.final_layer_norm"),
                )
            })
            .transpose()?;
        // L178-180: fc1, ReLU (out of place), fc2; each result rebinds hidden_states.
        let f1 = layer.fc1.forward(
            rt,
            normed.as_ref().unwrap_or(&hs),
            &format!("{l}.fc1"),
            gen,
            act,
        )?;
        drop(normed);
        let r = ops_opt::relu(rt, &f1, &format!("{l}.relu"))?;
        drop(f1);
        let f2 = layer.fc2.forward(rt, &r, &format!("{l}.fc2"), gen, act)?;
        let f2 = crate::engine::ops_tp::all_reduce(rt, f2, &format!("{l}.fc2.all_reduce"))?;
        drop(r);
        // L181
        let out = ops_opt::add(rt, &hs, &f2, &format!("{l}.residual_mlp"))?;
        drop(f2);
        // L183-184 post-LN, while the residual is still held.
        let out = if pre_norm {
            out
        } else {
            let n = ops_opt::layer_norm(
                rt,
                &out,
                &fln.w,
                &fln.b,
                eps,
                &format!("{l}.final_layer_norm"),
            )?;
            drop(out);
            n
        };
        drop(hs);
        Ok(out)
    }
}

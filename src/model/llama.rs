//! The Llama-family forward pass, written once over device-agnostic ops: embedding, RMSNorm,
//! RoPE, causal GQA attention, SwiGLU MLP, final norm, lm_head on the last token of each
//! sequence (as vLLM's profile run computes logits).

use std::cell::Cell;

use super::config::ModelConfig;
use super::weights::WeightSource;
use crate::device::Backend;
use crate::error::{Error, Result};
use crate::memory::Category;
use crate::ops;
use crate::progress::Progress;
use crate::quant::int8::{Int8Linear, TileLayout};
use crate::quant::{nf4, Linear, Nf4Linear, Quant};
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

/// Measured while loading: bytes read from the weights' source as stored (after the page
/// cache, before conversion) and the time spent reading and converting them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadStats {
    pub source_bytes: u64,
    pub read_seconds: f64,
    /// Time spent quantizing on the host (int8 rows, NF4 blocks).
    pub quantize_seconds: f64,
    pub total_seconds: f64,
}

impl LoadStats {
    /// Stored bytes per second of reading and converting (mmap → f32 or int8).
    pub fn read_gb_per_s(&self) -> Option<f64> {
        (self.read_seconds > 0.0).then(|| self.source_bytes as f64 / self.read_seconds / 1e9)
    }
    /// Stored bytes per second of the whole load, including device upload and quantization.
    pub fn load_gb_per_s(&self) -> Option<f64> {
        (self.total_seconds > 0.0 && self.source_bytes > 0)
            .then(|| self.source_bytes as f64 / self.total_seconds / 1e9)
    }
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

/// What the loader does with each 2-D projection weight.
pub struct LoadOptions {
    pub quant: Quant,
    pub int8_threshold: f32,
    pub int8_layout: TileLayout,
}

fn upload(
    rt: &Runtime,
    name: &str,
    shape: &[usize],
    dtype: DType,
    data: Option<Vec<f32>>,
) -> Result<Tensor> {
    let mut t = rt.tensor(name, Category::Weight, shape, dtype)?;
    match (rt.backend(), data) {
        // The host keeps f32; values are rounded to the dtype the weight is stored in, as a
        // GPU's fp16/bf16 copy would be.
        (Backend::Cpu, Some(d)) => {
            for (dst, v) in t.f32_mut().iter_mut().zip(d) {
                *dst = match dtype {
                    DType::F16 => half::f16::from_f32(v).to_f32(),
                    DType::BF16 => half::bf16::from_f32(v).to_f32(),
                    _ => v,
                };
            }
        }
        (Backend::Cuda, Some(d)) => ops::upload_f32(rt, &mut t, &d)?,
        _ => {}
    }
    Ok(t)
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
        let act = opts.quant.activation_dtype();
        let mut ld = Loader {
            rt,
            src,
            opts,
            act,
            needs_data: rt.backend() != Backend::Dry,
            count: cfg.tensor_shapes().len() as u32,
            index: 0,
            stats: LoadStats::default(),
        };
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

/// Reads weights one tensor at a time, reporting progress and honouring cancel.
struct Loader<'a> {
    rt: &'a Runtime,
    src: &'a dyn WeightSource,
    opts: &'a LoadOptions,
    act: DType,
    needs_data: bool,
    count: u32,
    index: u32,
    stats: LoadStats,
}

impl Loader<'_> {
    fn read(&mut self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        self.rt.check_cancel()?;
        self.rt.progress(Progress::Load {
            index: self.index,
            count: self.count,
            tensor: name.to_string(),
            bytes: shape.iter().product::<usize>() as u64 * self.act.size_bytes(),
        });
        self.index += 1;
        if self.needs_data {
            let t = std::time::Instant::now();
            let d = self.src.read_f32(name, shape)?;
            self.stats.read_seconds += t.elapsed().as_secs_f64();
            self.stats.source_bytes += self.src.stored_bytes(name);
            Ok(Some(d))
        } else {
            Ok(None)
        }
    }

    fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let d = self.read(name, shape)?;
        upload(self.rt, name, shape, self.act, d)
    }

    /// A `[rows, cols]` table stored as `[padded_rows, cols]` with zero rows after it.
    fn dense_padded(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        padded_rows: usize,
    ) -> Result<Tensor> {
        let d = self.read(name, &[rows, cols])?.map(|mut d| {
            d.resize(padded_rows * cols, 0.0);
            d
        });
        upload(self.rt, name, &[padded_rows, cols], self.act, d)
    }

    fn linear(&mut self, name: &str, n: usize, k: usize) -> Result<Linear> {
        // A bitsandbytes 8-bit checkpoint loaded as int8 keeps its CB and SCB as stored.
        if self.opts.quant == Quant::Int8 && self.src.is_int8(name) {
            self.rt.check_cancel()?;
            self.rt.progress(Progress::Load {
                index: self.index,
                count: self.count,
                tensor: name.to_string(),
                bytes: (n * k) as u64 + 4 * n as u64,
            });
            self.index += 1;
            let pre = if self.needs_data {
                let t = std::time::Instant::now();
                let d = self.src.read_int8(name, &[n, k])?;
                self.stats.read_seconds += t.elapsed().as_secs_f64();
                self.stats.source_bytes += self.src.stored_bytes(name);
                Some(d)
            } else {
                None
            };
            return load_int8(self.rt, name, n, k, pre, self.opts);
        }
        let d = self.read(name, &[n, k])?;
        load_linear(self.rt, name, n, k, d, self.opts, self.act, &mut self.stats)
    }
}

/// An LLM.int8 linear from `CB` and `SCB` (computed or as stored): the same two allocations
/// either way.
fn load_int8(
    rt: &Runtime,
    name: &str,
    n: usize,
    k: usize,
    data: Option<(Vec<i8>, Vec<f32>)>,
    opts: &LoadOptions,
) -> Result<Linear> {
    let base = name.trim_end_matches(".weight");
    let mut cb = rt.tensor(name, Category::Weight, &[n, k], DType::I8)?;
    let mut scb = rt.tensor(format!("{base}.SCB"), Category::Weight, &[n], DType::F32)?;
    if let Some((q, s)) = data {
        if rt.backend() == Backend::Cpu {
            if let crate::tensor::Storage::I8(dst) = &mut cb.storage {
                dst.copy_from_slice(&q);
            }
            scb.f32_mut().copy_from_slice(&s);
        } else {
            ops::upload_i8(rt, &mut cb, &q)?;
            ops::upload_f32(rt, &mut scb, &s)?;
        }
    }
    Ok(Linear::Int8(Int8Linear {
        cb,
        scb,
        out_features: n,
        in_features: k,
        threshold: opts.int8_threshold,
        layout: opts.int8_layout,
        state: Default::default(),
    }))
}

#[allow(clippy::too_many_arguments)]
fn load_linear(
    rt: &Runtime,
    name: &str,
    n: usize,
    k: usize,
    data: Option<Vec<f32>>,
    opts: &LoadOptions,
    act: DType,
    stats: &mut LoadStats,
) -> Result<Linear> {
    let mut timed = |f: &mut dyn FnMut()| {
        let t = std::time::Instant::now();
        f();
        stats.quantize_seconds += t.elapsed().as_secs_f64();
    };
    let cpu = rt.backend() == Backend::Cpu;
    match opts.quant {
        Quant::F16 | Quant::BF16 => Ok(Linear::Dense(upload(rt, name, &[n, k], act, data)?)),
        Quant::Int8 => {
            let mut q = None;
            if let Some(w) = data {
                timed(&mut || q = Some(crate::quant::int8::quantize_rows(&w, n, k)));
            }
            load_int8(rt, name, n, k, q, opts)
        }
        Quant::Nf4 => {
            let base = name.trim_end_matches(".weight");
            let numel = n * k;
            let mut packed =
                rt.tensor(name, Category::Weight, &[nf4::packed_len(numel)], DType::U8)?;
            let mut absmax = rt.tensor(
                format!("{base}.absmax"),
                Category::Weight,
                &[nf4::absmax_len(numel)],
                DType::F32,
            )?;
            if let Some(w) = data {
                let mut pa = None;
                timed(&mut || pa = Some(nf4::quantize(&w)));
                let (p, a) = pa.expect("quantized");
                if cpu {
                    if let crate::tensor::Storage::U8(dst) = &mut packed.storage {
                        dst.copy_from_slice(&p);
                    }
                    absmax.f32_mut().copy_from_slice(&a);
                } else {
                    ops::upload_u8(rt, &mut packed, &p)?;
                    ops::upload_f32(rt, &mut absmax, &a)?;
                }
            }
            Ok(Linear::Nf4(Nf4Linear {
                packed,
                absmax,
                out_features: n,
                in_features: k,
            }))
        }
    }
}

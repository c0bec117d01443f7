//! Qwen3-Next (`model_type` qwen3_next: Qwen3-Next-80B-A3B Instruct and Thinking) as vLLM V1
//! runs it (`vllm/model_executor/models/qwen3_next.py`, 0.10.2 and 0.11.0; docs/models.md):
//! the embedding, then layers of a zero-centred `(1 + w)` RMSNorm, a token mixer — a Gated
//! DeltaNet in three layers of four, gated full attention in the fourth (`layers::gdn`) —
//! written into the layer's `self_attention_output`, a second norm, and the sparse block
//! (512 experts, 10 a token, beside a shared expert scaled by `sigmoid(shared_expert_gate)`)
//! or a dense MLP in `mlp_only_layers`; the final norm and an untied lm_head. The norms are
//! vLLM's `GemmaRMSNorm` (imported as `Qwen3NextRMSNorm`, 0.10.2 L29-30), whose residual add
//! and output are new tensors. The checkpoint's multi-token-prediction weights (`mtp.*`) are
//! skipped (L993-994).
//!
//! V1's profile run follows the release (`engine::rules::GdnRules`): 0.10.2's and 0.11's
//! Gated DeltaNet returns before anything; from 0.15 it runs its projections, the gated norm
//! and `out_proj` around an op that returns early, and 0.19's op warms the prefill kernels up
//! on 16-64 dummy tokens (`layers::gdn::profile_forward`, docs/reading/vllm-qwen3-next-v1.md).
//! From 0.15 the sparse block hands its gate to the modular fused MoE's op
//! (`MoeBlock::gate_in_op`).

use std::cell::{Cell, RefCell};

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::ops_moe_v1::MoeKernel;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops_gdn, ops_gemma};
use crate::model::batch::Batch;
use crate::model::config::{ModelConfig, Qwen3NextShape};
use crate::model::layers::decoder::enter_layer;
use crate::model::layers::gdn::{self, GatedAttention, GatedDeltaNet, MixerRun};
use crate::model::layers::mlp::{load_gated, mlp_forward, GatedAct, MlpRun};
use crate::model::layers::moe::{self, MoeBlock};
use crate::model::layers::rotary::rotary_cache;
use crate::model::layers::tp::TpShard;
use crate::model::loader::{LoadOptions, LoadStats, Loader};
use crate::model::weights::WeightSource;
use crate::quant::{FusedLinear, Linear};

/// A layer's token mixer.
#[allow(clippy::large_enum_variant)]
pub enum Mixer {
    Linear(GatedDeltaNet),
    Full(GatedAttention),
}

/// A layer's MLP: `Qwen3NextSparseMoeBlock` or `Qwen3NextMLP`.
#[allow(clippy::large_enum_variant)]
pub enum NextMlp {
    Dense {
        gate_up: FusedLinear,
        down: Linear,
        width: usize,
    },
    Moe(MoeBlock),
}

/// `Qwen3NextDecoderLayer` (0.10.2 L739-875).
pub struct Qwen3NextLayer {
    pub mixer: Mixer,
    pub mlp: NextMlp,
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
}

impl Qwen3NextLayer {
    pub fn weight_bytes(&self) -> u64 {
        (match &self.mixer {
            Mixer::Linear(g) => g.weight_bytes(),
            Mixer::Full(a) => a.weight_bytes(),
        }) + match &self.mlp {
            NextMlp::Dense { gate_up, down, .. } => gate_up.weight_bytes() + down.weight_bytes(),
            NextMlp::Moe(m) => {
                m.gate.weight_bytes()
                    + m.w13.nbytes()
                    + m.expert_map.as_ref().map_or(0, |t| t.nbytes())
                    + m.w2.nbytes()
                    + m.shared.as_ref().map_or(0, |s| {
                        s.gate_up.weight_bytes() + s.down.weight_bytes() + s.gate.nbytes()
                    })
            }
        } + self.input_layernorm.nbytes()
            + self.post_attention_layernorm.nbytes()
    }
}

pub struct Qwen3NextModel {
    pub cfg: ModelConfig,
    pub shape: Qwen3NextShape,
    pub shard: TpShard,
    pub vocab_first_row: usize,
    pub act: DType,
    pub embed: Tensor,
    pub layers: Vec<Qwen3NextLayer>,
    /// The partial rotary embedding's `cos_sin_cache` (`[max_position, rotary_dim]`).
    pub rope_cache: Tensor,
    pub norm: Tensor,
    /// `None` when tied to the embedding.
    pub lm_head: Option<Tensor>,
    pub attn_scalars: Vec<Tensor>,
    pub load_stats: LoadStats,
    pub skip_attention: Cell<bool>,
    pub moe_kernel: Cell<MoeKernel>,
    pub moe_workspace: RefCell<Option<Tensor>>,
    /// 0.19's warm-up has autotuned FLA's Triton kernels in this process.
    triton_autotuned: Cell<bool>,
    generation: Cell<u32>,
}

impl Qwen3NextModel {
    /// Loads every weight through the framework allocator in the order vLLM's constructors
    /// make them: the embedding; per layer the mixer (the attention's `qkv_proj`, `o_proj`,
    /// the rotary cache with the first, the attention layer's scalars, `q_norm`, `k_norm`;
    /// or the Gated DeltaNet's), the MLP, `input_layernorm`, `post_attention_layernorm`; the
    /// final norm; the lm_head. 16-bit weights only.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg.qwen3_next.clone().ok_or_else(|| {
            Error::Request(format!(
                "model_type '{}' has no Gated DeltaNet layers; load it with its own model file",
                cfg.arch
            ))
        })?;
        if rt.backend() == Backend::Cuda {
            return Err(ops_gdn::on_cuda());
        }
        opts.require_16bit(
            src,
            &cfg.arch,
            "its FP8 checkpoints (Qwen3-Next-80B-A3B-*-FP8) and other quantized forms are not modelled yet",
        )?;
        let started = std::time::Instant::now();
        let shard = TpShard::of(rt, cfg)?;
        for (what, n) in [
            ("linear_num_key_heads", shape.linear_num_key_heads),
            ("linear_num_value_heads", shape.linear_num_value_heads),
        ] {
            if !n.is_multiple_of(shard.size) {
                return Err(Error::Request(format!(
                    "--tp {}: the Gated DeltaNet's {what} {n} do not divide over the GPUs",
                    shard.size
                )));
            }
        }
        let mut ld = Loader::new(rt, src, opts, cfg.tensor_shapes().len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (h, v, vp) = (cfg.hidden_size, cfg.vocab_size, cfg.padded_vocab());
        let (v_first, v_len) = shard.vocab_rows(vp);
        let embed = ld.vocab_shard("model.embed_tokens.weight", v, h, vp, v_first, v_len)?;
        let (f_first, f_len) = shard.mlp_rows(cfg);
        let names = cfg
            .family()
            .and_then(|f| f.moe)
            .ok_or_else(|| Error::Request("qwen3_next: no sparse block layout".into()))?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut attn_scalars = Vec::new();
        let mut rope_cache = None;
        for l in 0..cfg.num_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("model.layers.{l}");
            let mixer = if shape.is_full(l) {
                let a = format!("{p}.self_attn");
                let (qkv, o, heads, kv_heads) = gdn::load_attention(&mut ld, cfg, &shard, &a)?;
                if rope_cache.is_none() {
                    rope_cache = Some(rotary_cache(rt, cfg, act, (cfg.rope_theta, 1.0))?);
                }
                attn_scalars.extend(crate::model::loader::attention_scalars(
                    rt,
                    &format!("{a}.attn"),
                    opts.attn_scalars,
                )?);
                let hd = cfg.head_dim;
                let q_norm = ld.dense(&format!("{a}.q_norm.weight"), &[hd])?;
                let k_norm = ld.dense(&format!("{a}.k_norm.weight"), &[hd])?;
                Mixer::Full(GatedAttention {
                    qkv,
                    o,
                    q_norm,
                    k_norm,
                    heads,
                    kv_heads,
                })
            } else {
                Mixer::Linear(gdn::load_gdn(
                    &mut ld,
                    cfg,
                    &shape,
                    (&shard, rt.gdn_rules()),
                    &format!("{p}.linear_attn"),
                )?)
            };
            let mlp = match cfg.moe.as_ref().filter(|_| cfg.is_moe_layer(l)) {
                Some(m) => NextMlp::Moe(MoeBlock {
                    gate_in_op: true,
                    ..moe::load_moe_block(&mut ld, cfg, (m, names), &shard, &p)?
                }),
                None => {
                    let (gate_up, down) = load_gated(
                        &mut ld,
                        &format!("{p}.mlp"),
                        (h, cfg.intermediate_size),
                        (f_first, f_len),
                    )?;
                    NextMlp::Dense {
                        gate_up,
                        down,
                        width: f_len,
                    }
                }
            };
            let input_layernorm = ld.dense(&format!("{p}.input_layernorm.weight"), &[h])?;
            let post_attention_layernorm =
                ld.dense(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
            layers.push(Qwen3NextLayer {
                mixer,
                mlp,
                input_layernorm,
                post_attention_layernorm,
            });
        }
        rt.set_layer(None);
        let norm = ld.dense("model.norm.weight", &[h])?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(ld.vocab_shard("lm_head.weight", v, h, vp, v_first, v_len)?)
        };
        let rope_cache = match rope_cache {
            Some(c) => c,
            None => rotary_cache(rt, cfg, act, (cfg.rope_theta, 1.0))?,
        };
        Ok(Qwen3NextModel {
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
            triton_autotuned: Cell::new(false),
            generation: Cell::new(0),
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        self.embed.nbytes()
            + self
                .layers
                .iter()
                .map(Qwen3NextLayer::weight_bytes)
                .sum::<u64>()
            + self.rope_cache.nbytes()
            + self.norm.nbytes()
            + self.lm_head.as_ref().map_or(0, |t| t.nbytes())
            + self.attn_scalars.iter().map(|t| t.nbytes()).sum::<u64>()
    }

    pub fn lm_head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// `Qwen3NextModel.forward` (0.10.2 L930-961) over every token: the hidden states
    /// `[T, hidden]` after the final norm.
    pub fn forward_hidden(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let cfg = &self.cfg;
        let gen = self.generation.get();
        self.generation.set(gen + 1);
        batch.check_ids(cfg.vocab_size)?;
        let positions: Vec<usize> = batch.seq_lens.iter().flat_map(|&n| 0..n).collect();
        rt.set_layer(None);
        let embedded = crate::engine::ops_tp::embed_tokens(
            rt,
            &batch.ids,
            &self.embed,
            self.vocab_first_row,
            cfg.vocab_size,
            self.act,
        )?;
        let eps = cfg.rms_norm_eps as f32;
        let run = MixerRun {
            positions: &positions,
            seq_lens: &batch.seq_lens,
            act: self.act,
            generation: gen,
            eps,
            skip: self.skip_attention.get(),
            autotuned: &self.triton_autotuned,
        };
        let local = self.shard.local_config(cfg);
        let gpu = rt.with_device(|d| d.info().name);
        let mut hidden = embedded;
        let mut residual: Option<Tensor> = None;
        for (li, layer) in self.layers.iter().enumerate() {
            let l = enter_layer(rt, li, self.layers.len())?;
            // L827-832: layer 0's residual is its input; later layers add and normalise into
            // two new tensors (GemmaRMSNorm's `forward_static`).
            let normed = match residual.take() {
                None => {
                    let n = ops_gemma::rms_norm(
                        rt,
                        &hidden,
                        &layer.input_layernorm,
                        eps,
                        &format!("{l}.input_layernorm"),
                    )?;
                    residual = Some(hidden);
                    n
                }
                Some(r) => {
                    let (n, sum) = ops_gemma::add_rms_norm(
                        rt,
                        &hidden,
                        &r,
                        &layer.input_layernorm,
                        eps,
                        &format!("{l}.input_layernorm"),
                    )?;
                    drop(r);
                    drop(hidden);
                    residual = Some(sum);
                    n
                }
            };
            // The decoder's `self_attention_output` (to 0.25), or the mixer's own output (0.26 on).
            let mut buffer = if rt.gdn_rules().layer_output_buffer {
                Some(ops_gdn::empty_like(
                    rt,
                    &normed,
                    &format!("{l}.self_attention_output"),
                )?)
            } else {
                None
            };
            let returned = match &layer.mixer {
                Mixer::Linear(g) => gdn::gdn_forward(rt, g, &normed, buffer.as_mut(), &run, &l)?,
                Mixer::Full(a) => {
                    gdn::attention_forward(rt, a, cfg, &normed, buffer.as_mut(), &run, &l)?
                }
            };
            let out = match (buffer, returned) {
                (Some(b), None) => b,
                (None, Some(o)) => o,
                _ => {
                    return Err(Error::Request(format!(
                        "{l}: the mixer left no output (a release whose Gated DeltaNet skips the profile run keeps the layer's output buffer)"
                    )))
                }
            };
            drop(normed);
            let r = residual.take().expect("set above");
            let (n, sum) = ops_gemma::add_rms_norm(
                rt,
                &out,
                &r,
                &layer.post_attention_layernorm,
                eps,
                &format!("{l}.post_attention_layernorm"),
            )?;
            drop(r);
            drop(out);
            residual = Some(sum);
            hidden = match &layer.mlp {
                NextMlp::Dense {
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
                    let o = mlp_forward(rt, &n, (gate_up, down), &how, &format!("{l}.mlp"))?;
                    drop(n);
                    o
                }
                NextMlp::Moe(m) => moe::moe_block_forward_as(
                    rt,
                    n,
                    m,
                    local.moe.as_ref().expect("a sparse block has a shape"),
                    (self.act, self.moe_kernel.get(), Some(&self.moe_workspace)),
                    &l,
                    &gpu,
                )?,
            };
        }
        rt.set_layer(None);
        match residual {
            Some(r) => {
                let (n, sum) =
                    ops_gemma::add_rms_norm(rt, &hidden, &r, &self.norm, eps, "final.norm")?;
                drop((sum, r, hidden));
                Ok(n)
            }
            None => {
                let n = ops_gemma::rms_norm(rt, &hidden, &self.norm, eps, "final.norm")?;
                drop(hidden);
                Ok(n)
            }
        }
    }
}

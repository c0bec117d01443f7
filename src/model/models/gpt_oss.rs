//! gpt-oss (`model_type: "gpt_oss"`: gpt-oss-20b, gpt-oss-120b) as vLLM runs it
//! (`vllm/model_executor/models/gpt_oss.py`, 0.11.0 and 0.19.0): the embedding, then
//! `TransformerBlock`s of RMSNorm (eps 1e-5), `OAIAttention` (q/k/v/o with biases, YaRN in neox
//! style, a learned sink logit per head, a 128-token window on the even layers), RMSNorm and
//! `MLPBlock` (a biased router, top-k then softmax, experts of clamped SwiGLU over gate and up
//! interleaved, with biases), the final norm and an untied lm_head. Layer 0 takes the
//! embedding itself as its residual (`residual = hidden_states`, 0.19 L237-239: no clone);
//! later layers add and normalise in place.
//!
//! The experts are 16-bit (`UnquantizedFusedMoEMethod`) or MXFP4 as published
//! (`Mxfp4MoEMethod`: u8 blocks and scales, rounded and converted per GPU class as
//! `quant::mxfp4::Backend` says); attention, router, embedding and lm_head stay bf16 either
//! way (`Mxfp4Config.get_quant_method` gives linear layers `UnquantizedLinearMethod`, 0.19
//! quantization/mxfp4.py L62-89).

use std::cell::{Cell, RefCell};

use crate::base::error::{Error, Result};
use crate::device::cpu::{AttnShape, ScoreMods};
use crate::engine::ops_gpt_oss::{self, HostExpertsRef, OaiExperts};
use crate::engine::ops_mla::YarnRope;
use crate::engine::ops_moe::Experts;
use crate::engine::ops_moe_v1::MoeKernel;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_tp};
use crate::memory::Category;
use crate::model::batch::Batch;
use crate::model::config::{GptOssShape, ModelConfig};
use crate::model::layers::decoder::enter_layer;
use crate::model::layers::moe::load_expert_map;
use crate::model::layers::rotary::rotary_cache_sized;
use crate::model::layers::tp::{ExpertPlacement, TpShard};
use crate::model::loader::{upload, LoadOptions, LoadStats, Loader, Slice};
use crate::model::weights::WeightSource;
use crate::quant::{mxfp4, FusedLinear, Linear};

/// `OAIAttention` (0.19 L66-155): its parameters in the order its constructor makes them.
pub struct OaiAttention {
    /// `[heads]`, in the model dtype (`torch.empty(num_attention_heads // tp)`).
    pub sinks: Tensor,
    pub qkv: FusedLinear,
    pub qkv_bias: Tensor,
    pub o: Linear,
    pub o_bias: Tensor,
}

/// `MLPBlock` (0.19 L158-221): the router (`GateLinear(bias=True)`) and `FusedMoE`'s
/// parameters.
pub struct OaiMoe {
    pub router: Tensor,
    pub router_bias: Tensor,
    /// `FusedMoE`'s `expert_map` (int32 `[E]`) with expert parallel, made before its
    /// parameters.
    pub expert_map: Option<Tensor>,
    pub experts: ExpertWeights,
}

/// A `FusedMoE`'s parameters as its quant method leaves them after loading (one per layer:
/// the variants' sizes do not matter).
#[allow(clippy::large_enum_variant)]
pub enum ExpertWeights {
    /// `UnquantizedFusedMoEMethod`: `w13 [E, 2I, H]`, `w2 [E, H, I]` and their biases in the
    /// model dtype.
    Dense {
        w13: Tensor,
        w13_bias: Tensor,
        w2: Tensor,
        w2_bias: Tensor,
    },
    Mxfp4(Mxfp4Experts),
}

/// `Mxfp4MoEMethod`'s experts on one layer.
pub struct Mxfp4Experts {
    pub backend: mxfp4::Backend,
    /// The expert sizes after `maybe_roundup_sizes`: hidden, intermediate.
    pub hidden: usize,
    pub width: usize,
    /// The columns of every expert's width this rank loaded (the checkpoint's width on one
    /// GPU): the host experts' width.
    pub loaded_width: usize,
    /// What the device holds: the six parameters `create_weights` makes (u8 blocks and
    /// scales, bf16 biases) until `process_after_loading` converts them, then what is left
    /// of them and the backend's new tensors.
    pub params: Vec<Tensor>,
    /// The dequantized experts at the checkpoint's sizes, f32 on the host (CPU compute only):
    /// `w13 [E, 2I, H]`, `w2 [E, H, I]`, the biases.
    pub host: Option<[Vec<f32>; 4]>,
}

/// `TransformerBlock` (0.19 L224-258).
pub struct GptOssLayer {
    pub attn: OaiAttention,
    pub mlp: OaiMoe,
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
}

impl OaiMoe {
    /// Bytes of the experts' tensors on the device.
    pub fn expert_bytes(&self) -> u64 {
        match &self.experts {
            ExpertWeights::Dense {
                w13,
                w13_bias,
                w2,
                w2_bias,
            } => [w13, w13_bias, w2, w2_bias]
                .iter()
                .map(|t| t.nbytes())
                .sum(),
            ExpertWeights::Mxfp4(x) => x.params.iter().map(|t| t.nbytes()).sum(),
        }
    }
}

impl GptOssLayer {
    pub fn weight_bytes(&self) -> u64 {
        let a = &self.attn;
        let m = &self.mlp;
        a.sinks.nbytes()
            + a.qkv.weight_bytes()
            + a.qkv_bias.nbytes()
            + a.o.weight_bytes()
            + a.o_bias.nbytes()
            + m.router.nbytes()
            + m.router_bias.nbytes()
            + m.expert_map.as_ref().map_or(0, |t| t.nbytes())
            + m.expert_bytes()
            + self.input_layernorm.nbytes()
            + self.post_attention_layernorm.nbytes()
    }
}

pub struct GptOssModel {
    pub cfg: ModelConfig,
    pub shape: GptOssShape,
    pub act: DType,
    /// This rank's share: its heads, its slice of every expert's width, its vocabulary rows.
    pub shard: TpShard,
    /// The routed experts this rank holds (all of them but with expert parallel).
    pub placement: ExpertPlacement,
    pub vocab_first_row: usize,
    /// `VocabParallelEmbedding`: this rank's `[Vp / tp, hidden]`.
    pub embed: Tensor,
    pub layers: Vec<GptOssLayer>,
    /// The YaRN `cos_sin_cache` every layer shares (`get_rope(..., dtype=torch.float32)`:
    /// f32, `original_max_position · factor` rows).
    pub rope_cache: Tensor,
    pub norm: Tensor,
    /// `ParallelLMHead`, untied: `[Vp, hidden]`.
    pub lm_head: Tensor,
    pub attn_scalars: Vec<Tensor>,
    pub load_stats: LoadStats,
    pub skip_attention: Cell<bool>,
    /// The release's fused MoE and the modular kernel's persistent workspace.
    pub moe_kernel: Cell<MoeKernel>,
    pub moe_workspace: RefCell<Option<Tensor>>,
    generation: Cell<u32>,
}

impl GptOssModel {
    /// Loads every weight through the framework allocator in the order vLLM's constructors
    /// make them: the embedding; per layer the rotary cache (layer 0), the sinks, qkv_proj and
    /// its bias, o_proj and its bias, the attention layer's scalars, the router and its bias,
    /// the experts' w13, its bias, w2, its bias (`UnquantizedFusedMoEMethod.create_weights`,
    /// 0.19 unquantized_fused_moe_method.py L150-190), the two norms; the final norm; the
    /// lm_head.
    pub fn load(
        rt: &Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let shape = cfg
            .gpt_oss
            .clone()
            .ok_or_else(|| Error::Request(format!("model_type '{}' is not gpt_oss", cfg.arch)))?;
        if shape.mxfp4 && rt.backend() == crate::device::Backend::Cuda {
            return Err(Error::Request(
                "gpt_oss's MXFP4 experts have no CUDA kernels in vramscope yet (vLLM runs them through triton_kernels, Marlin or FlashInfer): run on a simulated device (sim:…)".into(),
            ));
        }
        let shard = TpShard::of(rt, cfg)?;
        opts.require_16bit(
            src,
            &cfg.arch,
            "only 16-bit gpt-oss checkpoints are modelled so far",
        )?;
        let m = cfg
            .moe
            .clone()
            .ok_or_else(|| Error::Request("gpt_oss without experts".into()))?;
        let started = std::time::Instant::now();
        let mut ld = Loader::new(rt, src, opts, cfg.tensor_shapes().len());
        let act = ld.act;
        rt.set_op("load");
        rt.set_layer(None);
        let (h, v, vp) = (cfg.hidden_size, cfg.vocab_size, cfg.padded_vocab());
        let (q, kv, i, e) = (
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
            m.num_experts,
        );
        let backend = mxfp4::Backend::for_capability((rt.with_device(|d| d.compute_major()), 0));
        let placement = expert_placement(&shard, &shape, e, backend)?;
        let (q_part, kv_part) = (shard.q_rows(cfg), shard.kv_rows(cfg));
        let heads = cfg.num_heads / shard.size;
        // With expert parallel a rank loads its experts whole, `w2_bias` included
        // (`_load_weights_mxfp4`'s `use_ep` branches, 0.19.0 gpt_oss.py L384-500).
        let cut = if placement.mapped {
            ExpertCut {
                start: 0,
                len: i,
                part: i,
                keeps_down_bias: true,
            }
        } else {
            ExpertCut::of(i, (shard.moe.rank, shard.moe.size), shape.mxfp4)
        };
        let (v_first, v_len) = shard.vocab_rows(vp);
        let embed = ld.vocab_shard("model.embed_tokens.weight", v, h, vp, v_first, v_len)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut attn_scalars = Vec::new();
        let mut rope_cache = None;
        for l in 0..cfg.num_layers {
            rt.set_layer(Some(l as u32));
            let p = format!("model.layers.{l}");
            let a = format!("{p}.self_attn");
            if rope_cache.is_none() {
                rope_cache = Some(rotary_cache_sized(
                    rt,
                    rope_rows(&shape),
                    cfg.head_dim,
                    DType::F32,
                )?);
            }
            // The sinks are narrowed to the rank's heads (L505-510).
            let sinks = if shard.size == 1 {
                ld.dense(&format!("{a}.sinks"), &[cfg.num_heads])?
            } else {
                let name = format!("{a}.sinks");
                ld.dense_row_parts(
                    &name,
                    &[cfg.num_heads],
                    &[(shard.rank * heads, heads)],
                    (&[heads], act),
                    &name,
                )?
            };
            let qkv = ld.fused_parts(
                &["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.weight")),
                &[q, kv, kv],
                &[q_part, kv_part, kv_part],
                h,
                &format!("{a}.qkv_proj.weight"),
            )?;
            let qkv_bias = ld.dense_concat_parts(
                &["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.bias")),
                &[q, kv, kv],
                &[q_part, kv_part, kv_part],
                &format!("{a}.qkv_proj.bias"),
            )?;
            let o = ld.linear_slice(
                &format!("{a}.o_proj.weight"),
                Slice::cols(h, q, q_part.0, q_part.1),
            )?;
            let o_bias = ld.dense(&format!("{a}.o_proj.bias"), &[h])?;
            attn_scalars.extend(crate::model::loader::attention_scalars(
                rt,
                &format!("{a}.attn"),
                opts.attn_scalars,
            )?);
            let x = format!("{p}.mlp");
            let router = ld.dense(&format!("{x}.router.weight"), &[e, h])?;
            let router_bias = ld.dense(&format!("{x}.router.bias"), &[e])?;
            let expert_map = load_expert_map(&mut ld, &placement, &format!("{x}.experts"))?;
            let experts = if shape.mxfp4 {
                ExpertWeights::Mxfp4(load_mxfp4(
                    &mut ld,
                    rt,
                    &x,
                    (e, h, i),
                    (&cut, &placement),
                    backend,
                )?)
            } else {
                load_dense(&mut ld, rt, &x, (e, h, i), &cut, act)?
            };
            let input_layernorm = ld.dense(&format!("{p}.input_layernorm.weight"), &[h])?;
            let post_attention_layernorm =
                ld.dense(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
            layers.push(GptOssLayer {
                attn: OaiAttention {
                    sinks,
                    qkv,
                    qkv_bias,
                    o,
                    o_bias,
                },
                mlp: OaiMoe {
                    router,
                    router_bias,
                    expert_map,
                    experts,
                },
                input_layernorm,
                post_attention_layernorm,
            });
        }
        rt.set_layer(None);
        let norm = ld.dense("model.norm.weight", &[h])?;
        let lm_head = ld.vocab_shard("lm_head.weight", v, h, vp, v_first, v_len)?;
        let rope_cache = match rope_cache {
            Some(c) => c,
            None => rotary_cache_sized(rt, rope_rows(&shape), cfg.head_dim, DType::F32)?,
        };
        // `process_weights_after_loading` runs over the modules once every weight is in
        // (0.19 model_loader/utils.py `process_weights_after_loading`, after `load_weights`).
        rt.set_op("process_weights_after_loading");
        let rules = rt.mxfp4_rules();
        for (l, layer) in layers.iter_mut().enumerate() {
            if let ExpertWeights::Mxfp4(x) = &mut layer.mlp.experts {
                rt.set_layer(Some(l as u32));
                x.process_after_loading(
                    rt,
                    &rules,
                    placement.local,
                    &format!("model.layers.{l}.mlp.experts"),
                )?;
            }
        }
        rt.set_layer(None);
        Ok(GptOssModel {
            cfg: cfg.clone(),
            shape,
            act,
            shard,
            placement,
            vocab_first_row: v_first,
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
                .map(GptOssLayer::weight_bytes)
                .sum::<u64>()
            + self.rope_cache.nbytes()
            + self.norm.nbytes()
            + self.lm_head.nbytes()
            + self.attn_scalars.iter().map(|t| t.nbytes()).sum::<u64>()
    }

    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// The rotary embedding (0.19 L83-99: YaRN over `head_dim` with the config's factor,
    /// original positions and betas; mscale `0.1·ln(factor) + 1`).
    fn rope(&self) -> YarnRope {
        let y = &self.shape.yarn;
        YarnRope {
            rotary_dim: self.cfg.head_dim,
            base: self.cfg.rope_theta,
            factor: y.factor,
            original_max_position: y.original_max_position_embeddings,
            beta_fast: y.beta_fast,
            beta_slow: y.beta_slow,
            mscale: crate::model::config::YarnScaling::get_mscale(y.factor, 1.0),
        }
    }

    /// `GptOssModel.forward` (0.19 L288-323) over every token of the batch: the hidden states
    /// `[T, hidden]` after the final norm.
    pub fn forward_hidden(&self, rt: &Runtime, batch: &Batch) -> Result<Tensor> {
        let cfg = &self.cfg;
        let gen = self.generation.get();
        self.generation.set(gen + 1);
        batch.check_ids(cfg.vocab_size)?;
        let positions: Vec<usize> = batch.seq_lens.iter().flat_map(|&n| 0..n).collect();
        rt.set_layer(None);
        let mut hidden = crate::engine::ops_tp::embed_tokens(
            rt,
            &batch.ids,
            &self.embed,
            self.vocab_first_row,
            cfg.vocab_size,
            self.act,
        )?;
        let eps = cfg.rms_norm_eps as f32;
        let rope = self.rope();
        let moe = cfg.moe.as_ref().expect("checked at load");
        let gpu = rt.with_device(|d| d.info().name);
        let mut residual: Option<Tensor> = None;
        for (li, layer) in self.layers.iter().enumerate() {
            let l = enter_layer(rt, li, self.layers.len())?;
            // L237-242: layer 0's residual is its input (no copy), normalised into a new
            // tensor; later layers add and normalise in place.
            let layer_in = match residual.as_mut() {
                None => {
                    let n = ops::rms_norm(
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
                    ops::fused_add_rms_norm(rt, &mut hidden, r, &layer.input_layernorm, eps)?;
                    hidden
                }
            };
            let mut o = self.attention(
                rt,
                layer,
                &layer_in,
                (&positions, &batch.seq_lens),
                li,
                gen,
                &rope,
                &l,
            )?;
            drop(layer_in);
            let r = residual.as_mut().expect("set in layer 0");
            ops::fused_add_rms_norm(rt, &mut o, r, &layer.post_attention_layernorm, eps)?;
            hidden = self.moe(rt, o, layer, (moe.top_k, &gpu), &l)?;
        }
        rt.set_layer(None);
        let mut r = residual.ok_or_else(|| Error::Request("gpt_oss with no layers".into()))?;
        ops::fused_add_rms_norm(rt, &mut hidden, &mut r, &self.norm, eps)?;
        drop(r);
        Ok(hidden)
    }

    /// `OAIAttention.forward` (0.19 L145-155): qkv_proj with its bias, the split views, YaRN in
    /// place, the attention (with sinks, the window on even layers), o_proj with its bias.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        rt: &Runtime,
        layer: &GptOssLayer,
        x: &Tensor,
        (positions, seq_lens): (&[usize], &[usize]),
        li: usize,
        gen: u32,
        rope: &YarnRope,
        l: &str,
    ) -> Result<Tensor> {
        let (act, a) = (self.act, &layer.attn);
        let cfg = &self.shard.local_config(&self.cfg);
        let qkv = a.qkv.forward(rt, x, &format!("{l}.qkv_proj"), gen, act)?;
        let (q_dim, kv_dim) = (cfg.q_dim(), cfg.kv_dim());
        let rows = [q_dim, kv_dim, kv_dim];
        let names = ["q", "k", "v"].map(|n| format!("{l}.{n}"));
        let mut views = FusedLinear::split(&qkv, &rows, &names);
        let bias_names = ["q", "k", "v"].map(|n| format!("{l}.{n}_bias"));
        for (x, b) in views
            .iter_mut()
            .zip(FusedLinear::split_flat(&a.qkv_bias, &rows, &bias_names))
        {
            ops::add_bias(rt, x, &b)?;
        }
        let mut it = views.into_iter();
        let (Some(mut q), Some(mut k), Some(v)) = (it.next(), it.next(), it.next()) else {
            return Err(Error::Request("qkv split".into()));
        };
        let shape = AttnShape {
            heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            mods: ScoreMods {
                window: self
                    .shape
                    .is_sliding(li)
                    .then_some(self.shape.sliding_window),
                ..ScoreMods::default()
            },
        };
        ops_gpt_oss::rope_yarn(
            rt,
            &mut q,
            &mut k,
            positions,
            shape,
            (rope, self.shape.truncate),
        )?;
        let attn = if self.skip_attention.get() {
            ops::attention_skipped(rt, &q, &format!("{l}.attn"))?
        } else {
            ops_gpt_oss::attention_with_sinks(
                rt,
                (&q, &k, &v),
                seq_lens,
                shape,
                &a.sinks,
                &format!("{l}.attn"),
            )?
        };
        let mut o = a.o.forward(rt, &attn, &format!("{l}.o_proj"), gen, act)?;
        // RowParallelLinear adds its bias on rank 0 only, before the all-reduce.
        if self.shard.rank == 0 {
            ops::add_bias(rt, &mut o, &a.o_bias)?;
        }
        let o = ops_tp::all_reduce(rt, o, &format!("{l}.o_proj.all_reduce"))?;
        drop((q, k, v));
        drop(qkv);
        drop(attn);
        Ok(o)
    }

    /// `MLPBlock.forward` (0.19 L205-221): the router's logits with its bias, then the fused
    /// MoE into its output; the logits die as the block returns, the input as the model
    /// rebinds its hidden states.
    fn moe(
        &self,
        rt: &Runtime,
        x: Tensor,
        layer: &GptOssLayer,
        (top_k, gpu): (usize, &str),
        l: &str,
    ) -> Result<Tensor> {
        let m = &layer.mlp;
        let mut logits = crate::quant::dense_matmul_as(
            rt,
            &x,
            &m.router,
            &format!("{l}.router"),
            self.act,
            &format!("{l}.moe.router_logits"),
            Category::Activation,
        )?;
        ops::add_bias(rt, &mut logits, &m.router_bias)?;
        let (alpha, limit) = (
            self.shape.swiglu_alpha as f32,
            self.shape.swiglu_limit as f32,
        );
        let out = match &m.experts {
            ExpertWeights::Dense {
                w13,
                w13_bias,
                w2,
                w2_bias,
            } => {
                let ex = OaiExperts {
                    experts: Experts {
                        w13,
                        w2,
                        num_experts: m.router.shape[0],
                        width: w2.shape[2],
                        first: 0,
                        global: m.router.shape[0],
                        mapped: false,
                        fp8_block: None,
                        fp8_tensor: None,
                        weight_on_input: false,
                    },
                    w13_bias,
                    w2_bias,
                    alpha,
                    limit,
                };
                ops_gpt_oss::moe_experts(
                    rt,
                    x,
                    &logits,
                    &ex,
                    (top_k, self.moe_kernel.get(), &self.moe_workspace, gpu),
                    &format!("{l}.moe"),
                )?
            }
            ExpertWeights::Mxfp4(ex) => {
                let host = ex.host.as_ref().map(|[w13, w2, b13, b2]| HostExpertsRef {
                    w13,
                    w2,
                    b13,
                    b2,
                    hidden: self.cfg.hidden_size,
                    width: ex.loaded_width,
                });
                let p = &self.placement;
                let local = m.expert_map.as_ref().map(|_| p.first..p.first + p.local);
                ops_gpt_oss::moe_experts_mxfp4(
                    rt,
                    x,
                    &logits,
                    host.as_ref(),
                    (top_k, ex.width, alpha, limit),
                    (ex.backend == mxfp4::Backend::Triton, ex.hidden, local),
                    &format!("{l}.moe"),
                )?
            }
        };
        let out = ops_tp::all_reduce(rt, out, &format!("{l}.moe.all_reduce"))?;
        drop(logits);
        Ok(out)
    }
}

/// The experts this rank holds. With expert parallel (and one data-parallel replica) each rank
/// keeps `E / P` whole experts, as `_load_weights_mxfp4`'s `use_ep` branches load them and
/// `determine_expert_map` maps them (docs/reading/vllm-gpt-oss-ep.md §3, §4.1); what vLLM runs
/// there on Hopper from 0.19 is the monolithic Triton kernel with the expert map. The other
/// cases are named: data parallel (the modular `OAITritonExperts` behind the naive dispatch,
/// §4.2-4.3), 16-bit experts, Marlin's and TRT-LLM's experts, and expert counts the ranks do
/// not divide (the loader takes `E // P` experts while the map gives the first `E % P` ranks
/// one more: a size mismatch at load, §3.5).
fn expert_placement(
    shard: &TpShard,
    shape: &GptOssShape,
    e: usize,
    backend: mxfp4::Backend,
) -> Result<ExpertPlacement> {
    let (ep, p) = (shard.moe.ep, shard.moe.size);
    if !ep && p == shard.size {
        return Ok(ExpertPlacement::all(e));
    }
    let what = if ep {
        format!("--enable-expert-parallel over {p} GPUs")
    } else {
        format!("--data-parallel-size {}", p / shard.size.max(1))
    };
    let not = |why: &str| Err(Error::Request(format!("gpt_oss with {what}: {why}")));
    if p != shard.size {
        return not("data parallel (the modular OAITritonExperts behind the naive dispatch, docs/reading/vllm-gpt-oss-ep.md §4.2) is not modelled yet; tensor parallel, and expert parallel over one replica's ranks, are");
    }
    if !shape.mxfp4 {
        return not(
            "16-bit experts with expert parallel are not modelled yet (MXFP4 checkpoints are)",
        );
    }
    if backend != mxfp4::Backend::Triton {
        return not(&format!("the {} MXFP4 experts with an expert map are not modelled yet (Hopper's Triton experts are)", backend.name()));
    }
    if !e.is_multiple_of(p) {
        return not(&format!("vLLM fails at load: gpt_oss.py's loader gives each rank {} of the {e} experts while determine_expert_map gives the first {} ranks one more (a size mismatch)", e / p, e % p));
    }
    Ok(ExpertPlacement::linear(e, shard.moe.rank, p))
}

/// Rows of the YaRN cache: `original_max_position · factor` (YaRNScalingRotaryEmbedding is
/// built over the original positions, 0.19 rotary_embedding/__init__.py L235-270, and
/// `_compute_cos_sin_cache` scales them by the factor).
fn rope_rows(g: &GptOssShape) -> usize {
    (g.yarn.original_max_position_embeddings as f64 * g.yarn.factor) as usize
}

/// `[b, r, c]` row-major to `[b, c, r]`.
fn permute_last_two(d: &[f32], b: usize, r: usize, c: usize) -> Vec<f32> {
    let mut out = vec![0f32; d.len()];
    for bi in 0..b {
        let (src, dst) = (
            &d[bi * r * c..(bi + 1) * r * c],
            &mut out[bi * r * c..(bi + 1) * r * c],
        );
        for ri in 0..r {
            for ci in 0..c {
                dst[ci * r + ri] = src[ri * c + ci];
            }
        }
    }
    out
}

/// The part of every expert's width one tensor-parallel rank loads, as gpt_oss.py's loaders
/// cut it (0.19): `_load_weights_mxfp4` (L366-375) in whole 32-wide MXFP4 blocks,
/// `cdiv(I / 32, tp)` of them a rank and the last rank what is left;
/// `_load_weights_other` (L1000-1004) `cdiv(I, tp)` columns. Into parameters
/// `intermediate_size_per_partition` (`I // tp`, fused_moe/layer.py) wide, which the MXFP4
/// backend then rounds up (`maybe_roundup_sizes`), so the last rank's and the padding's columns
/// stay zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertCut {
    pub start: usize,
    pub len: usize,
    /// `intermediate_size_per_partition`.
    pub part: usize,
    /// Rank 0 loads `w2_bias`; the others zero it "to avoid duplication" (L494-500), since
    /// the ranks' outputs are summed.
    pub keeps_down_bias: bool,
}

impl ExpertCut {
    pub fn of(width: usize, (rank, size): (usize, usize), mxfp4: bool) -> Self {
        let per = if mxfp4 {
            width.div_ceil(mxfp4::BLOCK).div_ceil(size) * mxfp4::BLOCK
        } else {
            width.div_ceil(size)
        };
        let start = (rank * per).min(width);
        ExpertCut {
            start,
            len: ((rank + 1) * per).min(width) - start,
            part: width / size,
            keeps_down_bias: rank == 0,
        }
    }

    fn whole(&self, width: usize) -> bool {
        self.start == 0 && self.len == width
    }
}

/// Rows `r0..r0 + nr` and columns `c0..c0 + nc` of each of `e` row-major `[rows, cols]`
/// blocks of `src`, packed.
fn narrow<T: Copy>(
    src: &[T],
    e: usize,
    [rows, cols]: [usize; 2],
    (r0, nr): (usize, usize),
    (c0, nc): (usize, usize),
) -> Vec<T> {
    let mut out = Vec::with_capacity(e * nr * nc);
    for ex in 0..e {
        for r in r0..r0 + nr {
            let at = (ex * rows + r) * cols + c0;
            out.extend_from_slice(&src[at..at + nc]);
        }
    }
    out
}

/// `UnquantizedFusedMoEMethod`'s experts: `gate_up_proj [E, H, 2I]` permuted to `w13_weight
/// [E, 2I, H]`, `down_proj [E, I, H]` to `w2_weight [E, H, I]` (0.19 gpt_oss.py L984-1012, on
/// the host), each followed by its bias; a rank's share cut first (`cut`).
fn load_dense(
    ld: &mut Loader,
    rt: &Runtime,
    x: &str,
    (e, h, i): (usize, usize, usize),
    cut: &ExpertCut,
    act: DType,
) -> Result<ExpertWeights> {
    let n = cut.len;
    let w13 = ld
        .read_host(&format!("{x}.experts.gate_up_proj"), &[e, h, 2 * i])?
        .map(|d| narrow(&d, e, [h, 2 * i], (0, h), (2 * cut.start, 2 * n)))
        .map(|d| permute_last_two(&d, e, h, 2 * n));
    let w13 = upload(
        rt,
        &format!("{x}.experts.w13_weight"),
        &[e, 2 * n, h],
        act,
        w13,
    )?;
    let (b13, b2) = (
        format!("{x}.experts.gate_up_proj_bias"),
        format!("{x}.experts.down_proj_bias"),
    );
    let whole = cut.whole(i);
    let w13_bias = if whole {
        ld.dense(&b13, &[e, 2 * i])?
    } else {
        let d = ld
            .read_host(&b13, &[e, 2 * i])?
            .map(|d| narrow(&d, e, [1, 2 * i], (0, 1), (2 * cut.start, 2 * n)));
        upload(rt, &b13, &[e, 2 * n], act, d)?
    };
    let w2 = ld
        .read_host(&format!("{x}.experts.down_proj"), &[e, i, h])?
        .map(|d| narrow(&d, e, [i, h], (cut.start, n), (0, h)))
        .map(|d| permute_last_two(&d, e, n, h));
    let w2 = upload(rt, &format!("{x}.experts.w2_weight"), &[e, h, n], act, w2)?;
    let w2_bias = if whole {
        ld.dense(&b2, &[e, h])?
    } else {
        let d = ld.read_host(&b2, &[e, h])?.map(|mut d| {
            if !cut.keeps_down_bias {
                d.fill(0.0);
            }
            d
        });
        upload(rt, &b2, &[e, h], act, d)?
    };
    Ok(ExpertWeights::Dense {
        w13,
        w13_bias,
        w2,
        w2_bias,
    })
}

/// `Mxfp4MoEMethod.create_weights` at the backend's rounded sizes (0.19
/// quantization/mxfp4.py L138-228: `w13_weight`, `w13_weight_scale`, `w2_weight`,
/// `w2_weight_scale` u8, then `w13_bias`, `w2_bias` bf16) filled by `_load_weights_mxfp4`
/// (gpt_oss.py L341-520: `gate_up_proj_blocks [E, 2I, H/32, 16]` viewed as `[E, 2I, H/2]`,
/// the rank's rows `2·start..2·end` (gate and up are interleaved) and `down_proj`'s columns
/// `start/2..end/2`, copied into the leading rows and columns by `FusedMoE.weight_loader`'s
/// MXFP4 branch (fused_moe/layer.py L1034-1043); the padding stays zero). On the CPU the
/// rank's experts are also dequantized to f32 for the math.
fn load_mxfp4(
    ld: &mut Loader,
    rt: &Runtime,
    x: &str,
    (global, h, i): (usize, usize, usize),
    (cut, placement): (&ExpertCut, &ExpertPlacement),
    backend: mxfp4::Backend,
) -> Result<Mxfp4Experts> {
    let (hp, ip) = backend.round_up(&rt.mxfp4_rules(), h, cut.part);
    // This rank's experts of each checkpoint tensor (all of them without expert parallel):
    // `weight[ep_rank_start:ep_rank_end, ...]` (0.19.0 gpt_oss.py L1104-1109, L384-500).
    let e = placement.local;
    let ours = |d: Vec<u8>| -> Vec<u8> {
        let per = d.len() / global;
        d[placement.first * per..(placement.first + e) * per].to_vec()
    };
    let (s, n) = (cut.start, cut.len);
    if n > ip {
        return Err(Error::Request(format!(
            "{x}: a rank's {n} expert columns do not fit the {ip} the MXFP4 backend makes"
        )));
    }
    let b = mxfp4::BLOCK;
    let mut read = |name: &str, shape: &[usize]| {
        ld.read_u8_host(&format!("{x}.experts.{name}"), shape)
            .map(|d| d.map(ours))
    };
    let cut_rows = |d: Option<Vec<u8>>, cols: usize| {
        d.map(|d| narrow(&d, e, [2 * i, cols], (2 * s, 2 * n), (0, cols)))
    };
    let cut_cols = |d: Option<Vec<u8>>, per: usize| {
        d.map(|d| narrow(&d, e, [h, i / per], (0, h), (s / per, n / per)))
    };
    let w13_blocks = cut_rows(
        read("gate_up_proj_blocks", &[global, 2 * i, h / b, b / 2])?,
        h / 2,
    );
    let w13_scales = cut_rows(read("gate_up_proj_scales", &[global, 2 * i, h / b])?, h / b);
    let w2_blocks = cut_cols(read("down_proj_blocks", &[global, h, i / b, b / 2])?, 2);
    let w2_scales = cut_cols(read("down_proj_scales", &[global, h, i / b])?, b);
    let u8_param = |name: &str, shape: [usize; 3], from: Option<&Vec<u8>>, src: [usize; 2]| {
        let mut t = rt.tensor(
            format!("{x}.experts.{name}"),
            Category::Weight,
            &shape,
            DType::U8,
        )?;
        if let (Some(d), crate::engine::tensor::Storage::U8(dst)) = (from, &mut t.storage) {
            pad_into(d, e, src, [shape[1], shape[2]], dst);
        }
        Ok::<Tensor, Error>(t)
    };
    let params = vec![
        u8_param(
            "w13_weight",
            [e, 2 * ip, hp / 2],
            w13_blocks.as_ref(),
            [2 * n, h / 2],
        )?,
        u8_param(
            "w13_weight_scale",
            [e, 2 * ip, hp / b],
            w13_scales.as_ref(),
            [2 * n, h / b],
        )?,
        u8_param("w2_weight", [e, hp, ip / 2], w2_blocks.as_ref(), [h, n / 2])?,
        u8_param(
            "w2_weight_scale",
            [e, hp, ip / b],
            w2_scales.as_ref(),
            [h, n / b],
        )?,
    ];
    let rows =
        |d: Vec<f32>, per: usize| d[placement.first * per..(placement.first + e) * per].to_vec();
    let b13 = ld
        .read_host(&format!("{x}.experts.gate_up_proj_bias"), &[global, 2 * i])?
        .map(|d| narrow(&rows(d, 2 * i), e, [1, 2 * i], (0, 1), (2 * s, 2 * n)));
    let b2 = ld
        .read_host(&format!("{x}.experts.down_proj_bias"), &[global, h])?
        .map(|d| rows(d, h))
        .map(|mut d| {
            if !cut.keeps_down_bias {
                d.fill(0.0);
            }
            d
        });
    let pad_f32 = |d: &Option<Vec<f32>>, rows: usize, to: usize| {
        d.as_ref().map(|v| {
            let mut out = vec![0f32; e * to];
            for (ex, chunk) in v.chunks_exact(rows.max(1)).enumerate().take(e) {
                out[ex * to..ex * to + rows].copy_from_slice(&chunk[..rows]);
            }
            out
        })
    };
    let mut params = params;
    params.push(upload(
        rt,
        &format!("{x}.experts.w13_bias"),
        &[e, 2 * ip],
        DType::BF16,
        pad_f32(&b13, 2 * n, 2 * ip),
    )?);
    params.push(upload(
        rt,
        &format!("{x}.experts.w2_bias"),
        &[e, hp],
        DType::BF16,
        pad_f32(&b2, h, hp),
    )?);
    let host = match (w13_blocks, w13_scales, w2_blocks, w2_scales, b13, b2) {
        (Some(a), Some(sa), Some(c), Some(sc), Some(b13), Some(b2)) => Some([
            mxfp4::dequantize(&a, &sa, e * 2 * n, h),
            mxfp4::dequantize(&c, &sc, e * h, n),
            b13,
            b2,
        ]),
        _ => None,
    };
    Ok(Mxfp4Experts {
        backend,
        hidden: hp,
        width: ip,
        loaded_width: n,
        params,
        host: host.filter(|_| rt.backend() == crate::device::Backend::Cpu),
    })
}

/// Copies `e` row-major `[rows, cols]` blocks of `src` into the leading corner of `e`
/// `[to_rows, to_cols]` blocks of `dst` (zeros elsewhere).
fn pad_into(
    src: &[u8],
    e: usize,
    [rows, cols]: [usize; 2],
    [to_rows, to_cols]: [usize; 2],
    dst: &mut [u8],
) {
    for ex in 0..e {
        for r in 0..rows {
            let s = (ex * rows + r) * cols;
            let d = (ex * to_rows + r) * to_cols;
            dst[d..d + cols].copy_from_slice(&src[s..s + cols]);
        }
    }
}

impl Mxfp4Experts {
    /// `Mxfp4MoEMethod.process_weights_after_loading` on this layer: the backend's new
    /// tensors (`Backend::after_loading`) are made while the loaded ones are still referenced
    /// (the method's locals hold them until it returns), then the replaced ones die.
    fn process_after_loading(
        &mut self,
        rt: &Runtime,
        rules: &mxfp4::Rules,
        experts: usize,
        prefix: &str,
    ) -> Result<()> {
        let plan = self
            .backend
            .after_loading(rules, experts, self.hidden, self.width);
        let mut made = Vec::with_capacity(plan.made.len());
        for t in &plan.made {
            made.push(rt.tensor(
                format!("{prefix}.{} ({})", t.name, self.backend.name()),
                Category::Weight,
                &t.shape,
                t.dtype,
            )?);
        }
        let loaded = std::mem::take(&mut self.params);
        let mut kept = Vec::new();
        let mut dying = Vec::new();
        for (k, t) in loaded.into_iter().enumerate() {
            if plan.freed.contains(&k) {
                dying.push((plan.freed.iter().position(|&f| f == k), t));
            } else {
                kept.push(t);
            }
        }
        dying.sort_by_key(|(p, _)| *p);
        drop(dying);
        kept.extend(made);
        self.params = kept;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ExpertCut;

    /// gpt-oss's 2,880-wide experts cut as `_load_weights_mxfp4` cuts them (whole 32-wide
    /// blocks, `cdiv(90, tp)` a rank): 1,440 over 2 ranks; 736 over 4, the last rank 672;
    /// 384 over 8, the last 192. `_load_weights_other` takes `cdiv(2880, tp)` columns.
    #[test]
    fn ranks_take_whole_mxfp4_blocks_and_the_last_rank_the_rest() {
        let lens = |size: usize, mxfp4: bool| -> Vec<usize> {
            (0..size)
                .map(|r| ExpertCut::of(2880, (r, size), mxfp4).len)
                .collect()
        };
        assert_eq!(lens(2, true), vec![1440, 1440]);
        assert_eq!(lens(4, true), vec![736, 736, 736, 672]);
        assert_eq!(lens(8, true), [vec![384; 7], vec![192]].concat());
        assert_eq!(lens(8, false), vec![360; 8]);
        let c = ExpertCut::of(2880, (3, 4), true);
        assert_eq!((c.start, c.part, c.keeps_down_bias), (2208, 720, false));
        assert!(ExpertCut::of(2880, (0, 4), true).keeps_down_bias);
        // gpt-oss-tiny (96 wide, 3 blocks) over 4 ranks: 32, 32, 32 and nothing.
        assert_eq!(
            (0..4)
                .map(|r| ExpertCut::of(96, (r, 4), true).len)
                .collect::<Vec<_>>(),
            vec![32, 32, 32, 0]
        );
    }
}

//! gpt-oss (`model_type: "gpt_oss"`: gpt-oss-20b, gpt-oss-120b) as vLLM runs it
//! (`vllm/model_executor/models/gpt_oss.py`, 0.11.0 and 0.19.0): the embedding, then
//! `TransformerBlock`s of RMSNorm (eps 1e-5), `OAIAttention` (q/k/v/o with biases, YaRN in neox
//! style, a learned sink logit per head, a 128-token window on the even layers), RMSNorm and
//! `MLPBlock` (a biased router, top-k then softmax, experts of clamped SwiGLU over gate and up
//! interleaved, with biases), the final norm and an untied lm_head. Layer 0 takes the
//! embedding itself as its residual (`residual = hidden_states`, 0.19 L237-239: no clone);
//! later layers add and normalise in place.
//!
//! 16-bit experts only so far: the published MXFP4 experts are refused by name.

use std::cell::{Cell, RefCell};

use crate::base::error::{Error, Result};
use crate::device::cpu::{AttnShape, ScoreMods};
use crate::engine::ops_gpt_oss::{self, OaiExperts};
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
use crate::model::layers::rotary::rotary_cache_sized;
use crate::model::loader::{upload, LoadOptions, LoadStats, Loader, Slice};
use crate::model::weights::WeightSource;
use crate::quant::{FusedLinear, Linear};

/// `OAIAttention` (0.19 L66-155): its parameters in the order its constructor makes them.
pub struct OaiAttention {
    /// `[heads]`, in the model dtype (`torch.empty(num_attention_heads // tp)`).
    pub sinks: Tensor,
    pub qkv: FusedLinear,
    pub qkv_bias: Tensor,
    pub o: Linear,
    pub o_bias: Tensor,
}

/// `MLPBlock` (0.19 L158-221): the router (`GateLinear(bias=True)`) and `FusedMoE`'s four
/// parameters.
pub struct OaiMoe {
    pub router: Tensor,
    pub router_bias: Tensor,
    pub w13: Tensor,
    pub w13_bias: Tensor,
    pub w2: Tensor,
    pub w2_bias: Tensor,
}

/// `TransformerBlock` (0.19 L224-258).
pub struct GptOssLayer {
    pub attn: OaiAttention,
    pub mlp: OaiMoe,
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
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
            + [
                &m.router,
                &m.router_bias,
                &m.w13,
                &m.w13_bias,
                &m.w2,
                &m.w2_bias,
            ]
            .iter()
            .map(|t| t.nbytes())
            .sum::<u64>()
            + self.input_layernorm.nbytes()
            + self.post_attention_layernorm.nbytes()
    }
}

pub struct GptOssModel {
    pub cfg: ModelConfig,
    pub shape: GptOssShape,
    pub act: DType,
    /// `VocabParallelEmbedding`: `[Vp, hidden]`.
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
        if shape.mxfp4 {
            return Err(Error::Request(
                "gpt_oss with MXFP4 experts (quantization_config quant_method mxfp4, as openai/gpt-oss-20b and -120b are published) is not modelled yet: only 16-bit experts run".into(),
            ));
        }
        if rt.tp().is_some() {
            return Err(Error::Request(
                "gpt_oss under tensor parallel is not modelled yet (its interleaved gate/up experts are cut per rank by gpt_oss.py's own loader)".into(),
            ));
        }
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
        let embed = ld.vocab_shard("model.embed_tokens.weight", v, h, vp, 0, vp)?;
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
            let sinks = ld.dense(&format!("{a}.sinks"), &[cfg.num_heads])?;
            let qkv = ld.fused_parts(
                &["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.weight")),
                &[q, kv, kv],
                &[(0, q), (0, kv), (0, kv)],
                h,
                &format!("{a}.qkv_proj.weight"),
            )?;
            let qkv_bias = ld.dense_concat_parts(
                &["q_proj", "k_proj", "v_proj"].map(|n| format!("{a}.{n}.bias")),
                &[q, kv, kv],
                &[(0, q), (0, kv), (0, kv)],
                &format!("{a}.qkv_proj.bias"),
            )?;
            let o = ld.linear_slice(&format!("{a}.o_proj.weight"), Slice::whole(h, q))?;
            let o_bias = ld.dense(&format!("{a}.o_proj.bias"), &[h])?;
            attn_scalars.extend(crate::model::loader::attention_scalars(
                rt,
                &format!("{a}.attn"),
                opts.attn_scalars,
            )?);
            let x = format!("{p}.mlp");
            let router = ld.dense(&format!("{x}.router.weight"), &[e, h])?;
            let router_bias = ld.dense(&format!("{x}.router.bias"), &[e])?;
            // `gate_up_proj [E, H, 2I]` permuted to `w13_weight [E, 2I, H]`, `down_proj
            // [E, I, H]` to `w2_weight [E, H, I]` (0.19 gpt_oss.py L984-1012, on the host).
            let w13_name = format!("{x}.experts.gate_up_proj");
            let w13 = ld
                .read_host(&w13_name, &[e, h, 2 * i])?
                .map(|d| permute_last_two(&d, e, h, 2 * i));
            let w13 = upload(
                rt,
                &format!("{x}.experts.w13_weight"),
                &[e, 2 * i, h],
                act,
                w13,
            )?;
            let w13_bias = ld.dense(&format!("{x}.experts.gate_up_proj_bias"), &[e, 2 * i])?;
            let w2 = ld
                .read_host(&format!("{x}.experts.down_proj"), &[e, i, h])?
                .map(|d| permute_last_two(&d, e, i, h));
            let w2 = upload(rt, &format!("{x}.experts.w2_weight"), &[e, h, i], act, w2)?;
            let w2_bias = ld.dense(&format!("{x}.experts.down_proj_bias"), &[e, h])?;
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
                    w13,
                    w13_bias,
                    w2,
                    w2_bias,
                },
                input_layernorm,
                post_attention_layernorm,
            });
        }
        rt.set_layer(None);
        let norm = ld.dense("model.norm.weight", &[h])?;
        let lm_head = ld.vocab_shard("lm_head.weight", v, h, vp, 0, vp)?;
        let rope_cache = match rope_cache {
            Some(c) => c,
            None => rotary_cache_sized(rt, rope_rows(&shape), cfg.head_dim, DType::F32)?,
        };
        Ok(GptOssModel {
            cfg: cfg.clone(),
            shape,
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
        let mut hidden = ops::embedding(rt, &batch.ids, &self.embed, self.act)?;
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
        let (cfg, act, a) = (&self.cfg, self.act, &layer.attn);
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
        ops::add_bias(rt, &mut o, &a.o_bias)?;
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
        let ex = OaiExperts {
            experts: Experts {
                w13: &m.w13,
                w2: &m.w2,
                num_experts: m.router.shape[0],
                width: self.cfg.intermediate_size,
            },
            w13_bias: &m.w13_bias,
            w2_bias: &m.w2_bias,
            alpha: self.shape.swiglu_alpha as f32,
            limit: self.shape.swiglu_limit as f32,
        };
        let out = ops_gpt_oss::moe_experts(
            rt,
            x,
            &logits,
            &ex,
            (top_k, self.moe_kernel.get(), &self.moe_workspace, gpu),
            &format!("{l}.moe"),
        )?;
        let out = ops_tp::all_reduce(rt, out, &format!("{l}.moe.all_reduce"))?;
        drop(logits);
        Ok(out)
    }
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

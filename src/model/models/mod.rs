//! The model families, one file each, as vLLM's `model_executor/models/` holds them, and the
//! registry from `model_type` to family (`registry.rs`). A family file composes the layer
//! kinds of `model::layers` and names, in its head comment, the vLLM file and releases it
//! follows:
//!
//! - `llama.rs`: Llama and the families vLLM builds the same way (Mistral, Qwen2, Qwen3,
//!   Phi-3, Mixtral, Qwen2-MoE, Qwen3-MoE), their twists rows of the registry;
//! - `gemma.rs`: Gemma 1, Gemma 2 and Gemma 3 (text);
//! - `granite.rs`: Granite;
//! - `opt.rs`: OPT;
//! - `phi.rs`: Phi (phi-1_5, phi-2);
//! - `deepseek_v2.rs`: DeepSeek-V2, V3/R1 and Kimi-K2 (multi-head latent attention);
//! - `gpt_oss.rs`: gpt-oss (attention sinks, sliding layers, clamped-SwiGLU experts).
//! - `llama4.rs`: Llama 4 Scout and Maverick, the language model (chunked local attention).
//! - `qwen3_next.rs`: Qwen3-Next (Gated DeltaNet layers beside gated full attention).

pub mod deepseek_v2;
pub mod gemma;
pub mod gemma3_mm;
pub mod gpt_oss;
pub mod granite;
pub mod kimi_vl;
pub mod llama;
pub mod llama4;
pub mod llama4_vision;
pub mod llava_next;
pub mod mistral3;
pub mod opt;
pub mod phi;
pub mod qwen2_5_vl;
pub mod qwen3_next;
pub mod registry;
pub mod vision_check;

use crate::base::error::Result;
use crate::model::config::ModelConfig;
use crate::model::sampler;
use crate::model::weights::WeightSource;
use registry::Decoder;

/// A loaded causal LM of an architecture vramscope runs, as vLLM's profile run drives it: the
/// forward over every token, then the logits from `lm_head` (see `sampler`).
pub enum CausalLm {
    Llama(Box<llama::LlamaModel>),
    Opt(Box<opt::OptModel>),
    Phi(Box<phi::PhiModel>),
    Deepseek(Box<deepseek_v2::DeepseekModel>),
    GptOss(Box<gpt_oss::GptOssModel>),
    Llama4(Box<llama4::Llama4Model>),
    Qwen3Next(Box<qwen3_next::Qwen3NextModel>),
}

impl CausalLm {
    /// Runs Llama's MLP as vLLM #10339 does (gate_up dropped before down_proj), where the
    /// architecture's vLLM model file has it: Llama and Mistral (llama.py), not Qwen2
    /// (qwen2.py keeps `gate_up` in every release) nor OPT (its fc1 output always dies at
    /// the activation).
    pub fn set_mlp_frees_gate_up(&mut self, yes: bool) {
        if let CausalLm::Llama(m) = self {
            // The registry says whose MLP is Llama's (Qwen3's is Qwen2's: qwen3.py imports
            // `Qwen2MLP`).
            m.mlp_frees_gate_up = yes && m.family.mlp_frees_gate_up;
        }
    }

    /// Scales Gemma 1's and 2's embedding into a new tensor, as vLLM 0.19 on does, or in place.
    pub fn set_normalizer_out_of_place(&mut self, yes: bool) {
        if let CausalLm::Llama(m) = self {
            m.normalizer_out_of_place = yes;
        }
    }

    /// A multimodal model's runner buffer `inputs_embeds`: its passes start from it instead
    /// of the embedding: the Llama-shaped decoders (Gemma 3, Mistral 3, Qwen2.5-VL,
    /// LLaVA-NeXT's), Llama 4 and DeepSeek's (Kimi-VL).
    pub fn set_inputs_embeds(&self, buffer: crate::engine::tensor::Tensor) -> Result<()> {
        match self {
            CausalLm::Llama(m) => {
                *m.inputs_embeds.borrow_mut() = Some(buffer);
                Ok(())
            }
            CausalLm::Llama4(m) => {
                *m.inputs_embeds.borrow_mut() = Some(buffer);
                Ok(())
            }
            CausalLm::Deepseek(m) => {
                *m.inputs_embeds.borrow_mut() = Some(buffer);
                Ok(())
            }
            _ => Err(crate::base::error::Error::Request(
                "the runner's inputs_embeds are modelled for the Llama-shaped, Llama 4 and DeepSeek decoders only".into(),
            )),
        }
    }

    /// FlashInfer's CUTLASS MoE takes each layer's `w13` with its halves swapped: the
    /// `process_weights_after_loading` pass that makes the swapped copies, layer by layer in
    /// module order (`moe::swap_w13_to_w31`).
    pub fn swap_w13_for_flashinfer(&mut self, rt: &crate::engine::runtime::Runtime) -> Result<()> {
        use crate::model::layers::moe::swap_w13_to_w31;
        rt.set_op("process_weights_after_loading");
        let first = |n: usize| n as u32;
        match self {
            CausalLm::Llama(m) => {
                let base = m.first_layer;
                for (l, layer) in m.layers.iter_mut().enumerate() {
                    if let crate::model::layers::decoder::Mlp::Moe(b) = &mut layer.mlp {
                        rt.set_layer(Some(first(base + l)));
                        swap_w13_to_w31(rt, &mut b.w13, b.fp8_scales.as_mut())?;
                    }
                }
            }
            CausalLm::Deepseek(m) => {
                for (l, layer) in m.layers.iter_mut().enumerate() {
                    if let crate::model::models::deepseek_v2::DeepseekMlp::Moe(b) = &mut layer.mlp {
                        rt.set_layer(Some(first(l)));
                        swap_w13_to_w31(rt, &mut b.w13, b.fp8_scales.as_mut())?;
                    }
                }
            }
            CausalLm::Llama4(m) => {
                for (l, layer) in m.layers.iter_mut().enumerate() {
                    if let crate::model::models::llama4::Llama4FeedForward::Moe(b) =
                        &mut layer.feed_forward
                    {
                        rt.set_layer(Some(first(l)));
                        swap_w13_to_w31(rt, &mut b.w13, None)?;
                    }
                }
            }
            CausalLm::Qwen3Next(m) => {
                for (l, layer) in m.layers.iter_mut().enumerate() {
                    if let crate::model::models::qwen3_next::NextMlp::Moe(b) = &mut layer.mlp {
                        rt.set_layer(Some(first(l)));
                        swap_w13_to_w31(rt, &mut b.w13, b.fp8_scales.as_mut())?;
                    }
                }
            }
            CausalLm::GptOss(_) | CausalLm::Opt(_) | CausalLm::Phi(_) => {}
        }
        rt.set_layer(None);
        Ok(())
    }

    /// Runs the mixture-of-experts layers with the release's fused MoE.
    pub fn set_moe_kernel(&mut self, kernel: crate::engine::ops_moe_v1::MoeKernel) {
        match self {
            CausalLm::Llama(m) => m.moe_kernel = kernel,
            CausalLm::Deepseek(m) => m.moe_kernel.set(kernel),
            CausalLm::GptOss(m) => m.moe_kernel.set(kernel),
            CausalLm::Llama4(m) => m.moe_kernel.set(kernel),
            CausalLm::Qwen3Next(m) => m.moe_kernel.set(kernel),
            CausalLm::Opt(_) | CausalLm::Phi(_) => {}
        }
    }

    /// Multi-head latent attention as the release runs it: the profile run's workspace
    /// transient of `workspace_tokens` tokens, and the buffers its backend selection makes
    /// while the model is built (`(name, bytes)`, made now). Nothing for other models.
    /// `logits_reserve`: the bytes the backend asks of the shared workspace in the profile run
    /// (0.33's TRITON_MLA; 0 for none).
    pub fn set_mla_backend(
        &self,
        rt: &crate::engine::runtime::Runtime,
        workspace_tokens: usize,
        buffers: &[(&str, u64)],
        logits_reserve: u64,
    ) -> Result<()> {
        if let CausalLm::Deepseek(m) = self {
            m.workspace_tokens.set(workspace_tokens);
            m.logits_reserve.set(logits_reserve);
            rt.set_op("load");
            for &(name, bytes) in buffers {
                let t = rt.tensor(
                    name,
                    crate::memory::Category::Weight,
                    &[bytes as usize],
                    crate::engine::tensor::DType::U8,
                )?;
                m.backend_buffers.borrow_mut().push(t);
            }
        }
        Ok(())
    }

    /// Runs attention as vLLM V1's profile run does (skipped: zeros of the output's shape), or
    /// for real. OPT's attention always runs (V1's OPT is not modelled).
    pub fn set_skip_attention(&self, yes: bool) {
        match self {
            CausalLm::Llama(m) => m.skip_attention.set(yes),
            CausalLm::Phi(m) => m.skip_attention.set(yes),
            CausalLm::Deepseek(m) => m.skip_attention.set(yes),
            CausalLm::GptOss(m) => m.skip_attention.set(yes),
            CausalLm::Llama4(m) => m.skip_attention.set(yes),
            CausalLm::Qwen3Next(m) => m.skip_attention.set(yes),
            CausalLm::Opt(_) => {}
        }
    }

    /// Loads the architecture `cfg.arch` names, every weight through the framework allocator.
    pub fn load(
        rt: &crate::engine::runtime::Runtime,
        cfg: &ModelConfig,
        src: &dyn WeightSource,
        opts: &llama::LoadOptions,
    ) -> Result<Self> {
        if opts.quant == crate::quant::Quant::F32 && rt.backend() == crate::device::Backend::Cuda {
            return Err(crate::base::error::Error::Request(
                "--dtype float32 on a GPU: vramscope's CUDA kernels run 16-bit activations; \
                 plan float32 on a simulated device (sim:NAME:dry, or sim:NAME for CPU compute)"
                    .into(),
            ));
        }
        let family = cfg.family().ok_or_else(|| {
            crate::base::error::Error::Request(format!(
                "model_type '{}' has no model file here (expected {})",
                cfg.arch,
                registry::supported_list()
            ))
        })?;
        // Pipeline stages are built for the Llama-shaped families; the others are refused by
        // name rather than loaded whole on every stage.
        if rt.pp().is_some() && family.decoder != Decoder::Llama {
            return Err(crate::model::layers::pp::refused(&cfg.arch));
        }
        Ok(match family.decoder {
            Decoder::Opt => CausalLm::Opt(Box::new(opt::OptModel::load(rt, cfg, src, opts)?)),
            Decoder::Phi => CausalLm::Phi(Box::new(phi::PhiModel::load(rt, cfg, src, opts)?)),
            Decoder::Deepseek => CausalLm::Deepseek(Box::new(deepseek_v2::DeepseekModel::load(
                rt, cfg, src, opts,
            )?)),
            Decoder::GptOss => {
                CausalLm::GptOss(Box::new(gpt_oss::GptOssModel::load(rt, cfg, src, opts)?))
            }
            Decoder::Llama4 => {
                CausalLm::Llama4(Box::new(llama4::Llama4Model::load(rt, cfg, src, opts)?))
            }
            Decoder::Qwen3Next => CausalLm::Qwen3Next(Box::new(qwen3_next::Qwen3NextModel::load(
                rt, cfg, src, opts,
            )?)),
            Decoder::Llama | Decoder::Gemma | Decoder::Granite => {
                CausalLm::Llama(Box::new(llama::LlamaModel::load(rt, cfg, src, opts)?))
            }
        })
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            CausalLm::Llama(m) => &m.cfg,
            CausalLm::Opt(m) => &m.cfg,
            CausalLm::Phi(m) => &m.cfg,
            CausalLm::Deepseek(m) => &m.cfg,
            CausalLm::GptOss(m) => &m.cfg,
            CausalLm::Llama4(m) => &m.cfg,
            CausalLm::Qwen3Next(m) => &m.cfg,
        }
    }

    pub fn weight_bytes(&self) -> u64 {
        match self {
            CausalLm::Llama(m) => m.weight_bytes(),
            CausalLm::Opt(m) => m.weight_bytes(),
            CausalLm::Phi(m) => m.weight_bytes(),
            CausalLm::Deepseek(m) => m.weight_bytes(),
            CausalLm::GptOss(m) => m.weight_bytes(),
            CausalLm::Llama4(m) => m.weight_bytes(),
            CausalLm::Qwen3Next(m) => m.weight_bytes(),
        }
    }

    pub fn load_stats(&self) -> llama::LoadStats {
        match self {
            CausalLm::Llama(m) => m.load_stats,
            CausalLm::Opt(m) => m.load_stats,
            CausalLm::Phi(m) => m.load_stats,
            CausalLm::Deepseek(m) => m.load_stats,
            CausalLm::GptOss(m) => m.load_stats,
            CausalLm::Llama4(m) => m.load_stats,
            CausalLm::Qwen3Next(m) => m.load_stats,
        }
    }

    /// The model's output hidden states over every token, `[tokens, hidden]`.
    pub fn forward_hidden(
        &self,
        rt: &crate::engine::runtime::Runtime,
        batch: &llama::Batch,
    ) -> Result<crate::engine::tensor::Tensor> {
        match self {
            CausalLm::Llama(m) => m.forward_hidden(rt, batch),
            CausalLm::Opt(m) => m.forward_hidden(rt, batch),
            CausalLm::Phi(m) => m.forward_hidden(rt, batch),
            CausalLm::Deepseek(m) => m.forward_hidden(rt, batch),
            CausalLm::GptOss(m) => m.forward_hidden(rt, batch),
            CausalLm::Llama4(m) => m.forward_hidden(rt, batch),
            CausalLm::Qwen3Next(m) => m.forward_hidden(rt, batch),
        }
    }

    /// The output projection over the padded vocabulary, `[Vp, hidden]`: `None` on a
    /// pipeline stage before the last.
    pub fn lm_head(&self) -> Option<&crate::engine::tensor::Tensor> {
        match self {
            CausalLm::Llama(m) => m.lm_head(),
            CausalLm::Opt(m) => Some(m.lm_head()),
            CausalLm::Phi(m) => Some(m.lm_head()),
            CausalLm::Deepseek(m) => Some(m.lm_head()),
            CausalLm::GptOss(m) => Some(m.lm_head()),
            CausalLm::Llama4(m) => Some(m.lm_head()),
            CausalLm::Qwen3Next(m) => Some(m.lm_head()),
        }
    }

    /// One pass of this model or pipeline stage: the final hidden states, or on a stage
    /// before the last its hidden states and the residual it sends on.
    pub fn forward_stage(
        &self,
        rt: &crate::engine::runtime::Runtime,
        batch: &llama::Batch,
    ) -> Result<(
        crate::engine::tensor::Tensor,
        Option<crate::engine::tensor::Tensor>,
    )> {
        match self {
            CausalLm::Llama(m) => m.forward_stage(rt, batch),
            other => other.forward_hidden(rt, batch).map(|h| (h, None)),
        }
    }

    /// What the logits are computed from: the lm_head, its bias (Phi's) and the final
    /// soft-cap (Gemma 2's). A pipeline stage before the last has none.
    pub fn logits_head(&self) -> Result<sampler::LogitsHead<'_>> {
        let weight = self.lm_head().ok_or_else(|| {
            crate::base::error::Error::Request(
                "a pipeline stage before the last has no lm_head: the last stage computes the logits"
                    .into(),
            )
        })?;
        Ok(sampler::LogitsHead {
            weight,
            bias: match self {
                CausalLm::Phi(m) => Some(&m.lm_head_bias),
                CausalLm::Llama(_)
                | CausalLm::Opt(_)
                | CausalLm::Deepseek(_)
                | CausalLm::GptOss(_) => None,
                CausalLm::Llama4(_) => None,
                CausalLm::Qwen3Next(_) => None,
            },
            mods: self.config().logits_mods(),
        })
    }

    /// One forward pass without the sampler: the f32 logits `[seqs, vocab]` of the last token
    /// of each sequence.
    pub fn forward(
        &self,
        rt: &crate::engine::runtime::Runtime,
        batch: &llama::Batch,
    ) -> Result<crate::engine::tensor::Tensor> {
        let hidden = self.forward_hidden(rt, batch)?;
        let rows = sampler::last_token_rows(&batch.seq_lens);
        sampler::logits_f32(
            rt,
            &hidden,
            self.logits_head()?,
            &rows,
            self.config().vocab_size,
        )?
        .ok_or_else(|| {
            crate::base::error::Error::Request(
                "the logits were gathered to tensor-parallel rank 0".into(),
            )
        })
    }
}

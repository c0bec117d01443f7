//! One pre-norm decoder layer's weights, as the Llama-shaped and Gemma families hold them: the
//! attention block, the MLP (dense or a sparse block of experts), and the norms around them.
//! Which norms run, and how, is each family file's.

use super::attention::{Attention, AttentionRun};
use super::mlp::{mlp_forward, MlpRun};
use super::moe::{moe_block_forward_as, MoeBlock};
use std::cell::RefCell;

use crate::base::error::{Error, Result};
use crate::engine::ops_moe_v1::MoeKernel;
use crate::engine::progress::Progress;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::model::config::MoeShape;
use crate::quant::{FusedLinear, Linear};

/// Enters layer `li` of `of` in a pass: a cancel is taken here, what follows is tagged with the
/// layer, progress is reported, and the layer's tensor prefix (`layers.3`) comes back.
pub fn enter_layer(rt: &Runtime, li: usize, of: usize) -> Result<String> {
    rt.check_cancel()?;
    rt.set_layer(Some(li as u32));
    rt.progress(Progress::Layer {
        layer: li as u32,
        of: of as u32,
    });
    Ok(format!("layers.{li}"))
}

/// vLLM's `LlamaDecoderLayer` (and `MixtralDecoderLayer`, `Qwen3MoeDecoderLayer`,
/// `Gemma2DecoderLayer`).
pub struct Layer {
    pub attn: Attention,
    pub mlp: Mlp,
    pub input_norm: Tensor,
    pub post_norm: Tensor,
    /// Gemma's `pre_feedforward_layernorm` and `post_feedforward_layernorm`.
    pub ff_norms: Option<(Tensor, Tensor)>,
}

impl Layer {
    pub fn weight_bytes(&self) -> u64 {
        self.input_norm.nbytes()
            + self.post_norm.nbytes()
            + self
                .ff_norms
                .as_ref()
                .map_or(0, |(a, c)| a.nbytes() + c.nbytes())
            + self.attn.weight_bytes()
            + self.mlp.weight_bytes()
    }
}

/// A decoder layer's MLP: dense (`LlamaMLP`: `gate_up` a `MergedColumnParallelLinear`, `down`
/// a `RowParallelLinear`) or a sparse block of experts. One per layer, so the dense variant's
/// size (its quantized forms inline) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Mlp {
    Dense { gate_up: FusedLinear, down: Linear },
    Moe(MoeBlock),
}

/// What a sparse block needs besides its weights: this rank's expert shape, the activation
/// dtype, the GPU's name (it picks fused MoE's tuned Triton config) and the release's routing.
pub struct MoeRun<'a> {
    pub shape: Option<&'a MoeShape>,
    pub act: DType,
    pub gpu: &'a str,
    /// The release's fused MoE.
    pub kernel: MoeKernel,
    /// The modular kernel's persistent workspace, the model's for every layer and pass.
    pub workspace: &'a RefCell<Option<Tensor>>,
}

impl Mlp {
    pub fn weight_bytes(&self) -> u64 {
        match self {
            Mlp::Dense { gate_up, down } => gate_up.weight_bytes() + down.weight_bytes(),
            Mlp::Moe(m) => {
                m.gate.weight_bytes()
                    + m.fp8_tensor.as_ref().map_or(0, |s| s.nbytes())
                    + m.w13.nbytes()
                    + m.expert_map.as_ref().map_or(0, |t| t.nbytes())
                    + m.w2.nbytes()
                    + m.fp8_scales
                        .as_ref()
                        .map_or(0, |[a, b]| a.nbytes() + b.nbytes())
                    + m.shared.as_ref().map_or(0, |s| {
                        s.gate_up.weight_bytes() + s.down.weight_bytes() + s.gate.nbytes()
                    })
            }
        }
    }

    /// The MLP on `x`, which dies once the MLP has run (the decoder rebinds its hidden states
    /// to the output): a dense MLP as `dense` says, or the sparse block.
    pub fn forward(
        &self,
        rt: &Runtime,
        x: Tensor,
        dense: &MlpRun,
        moe: &MoeRun,
        l: &str,
    ) -> Result<Tensor> {
        match self {
            Mlp::Dense { gate_up, down } => {
                let out = mlp_forward(rt, &x, (gate_up, down), dense, l)?;
                drop(x);
                Ok(out)
            }
            Mlp::Moe(block) => {
                let m = moe.shape.ok_or_else(|| {
                    Error::Request(format!("{l}: a sparse block in a model with no experts"))
                })?;
                moe_block_forward_as(
                    rt,
                    x,
                    block,
                    m,
                    (moe.act, moe.kernel, Some(moe.workspace)),
                    l,
                    moe.gpu,
                )
            }
        }
    }
}

/// What a family's loop over its decoder layers needs for one pass: the layers, how each
/// layer's attention runs, how the dense MLPs and the sparse blocks run, the final norm and
/// the norms' eps.
pub struct DecoderRun<'a> {
    pub layers: &'a [Layer],
    /// The model's index of `layers[0]` (a pipeline stage's first layer; 0 without).
    pub first_layer: usize,
    pub attention: &'a dyn Fn(usize) -> AttentionRun<'a>,
    pub dense: MlpRun,
    pub moe: MoeRun<'a>,
    /// `None` on a pipeline stage before the last, which sends its residual on unnormed.
    pub final_norm: Option<&'a Tensor>,
    pub eps: f32,
}

//! Normalisation layers (`model_executor/layers/layernorm.py`): RMSNorm as Llama runs it, Gemma's
//! `x · (1 + w)` variant, and `nn.LayerNorm` with its bias (OPT).

use crate::base::error::Result;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::Tensor;
use crate::engine::{ops, ops_gemma};

/// Which RMSNorm a family's layers use, for the norms that write a new tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmsNormKind {
    /// vLLM's `RMSNorm`: `x / rms(x) · w`.
    Rms,
    /// vLLM's `GemmaRMSNorm`: `x / rms(x) · (1 + w)`.
    Gemma,
}

impl RmsNormKind {
    /// The norm of `x` into a new tensor named `name`.
    pub fn apply(
        self,
        rt: &Runtime,
        x: &Tensor,
        w: &Tensor,
        eps: f32,
        name: &str,
    ) -> Result<Tensor> {
        match self {
            RmsNormKind::Rms => ops::rms_norm(rt, x, w, eps, name),
            RmsNormKind::Gemma => ops_gemma::rms_norm(rt, x, w, eps, name),
        }
    }
}

/// `nn.LayerNorm`'s weight and bias.
pub struct LayerNorm {
    pub w: Tensor,
    pub b: Tensor,
}

impl LayerNorm {
    pub fn bytes(&self) -> u64 {
        self.w.nbytes() + self.b.nbytes()
    }
}

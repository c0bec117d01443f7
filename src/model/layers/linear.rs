//! A linear layer with its optional bias, as vLLM's `ColumnParallelLinear` and
//! `RowParallelLinear` hold one (`model_executor/layers/linear.py`); the quantized weight forms
//! are `quant`'s.

use crate::base::error::Result;
use crate::engine::ops;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::quant::Linear;

/// A linear layer and its optional bias (`enable_bias`).
pub struct BiasedLinear {
    pub w: Linear,
    pub b: Option<Tensor>,
    /// Whether this rank adds the bias: a row-parallel layer holds the whole bias on every
    /// rank but only rank 0 adds it, before the all-reduce (linear.py L1077-1081).
    pub adds_bias: bool,
}

impl BiasedLinear {
    pub fn weight_bytes(&self) -> u64 {
        self.w.weight_bytes() + self.b.as_ref().map_or(0, |t| t.nbytes())
    }

    /// vLLM's linear layers add the bias in the GEMM (unquantized `F.linear(x, w, b)`) or in
    /// place after it (`out += bias`, bitsandbytes.py L266-270 and L312-314): one output.
    pub fn forward(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        gen: u32,
        act: DType,
    ) -> Result<Tensor> {
        let mut y = self.w.forward(rt, x, name, gen, act)?;
        if let (Some(b), true) = (&self.b, self.adds_bias) {
            ops::add_bias(rt, &mut y, b)?;
        }
        Ok(y)
    }
}

//! A linear layer with its optional bias, as vLLM's `ColumnParallelLinear` and
//! `RowParallelLinear` hold one (`model_executor/layers/linear.py`); the quantized weight forms
//! are `quant`'s.

use crate::base::error::Result;
use crate::engine::ops;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::model::loader::{Loader, Slice};
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

    /// A biased `ColumnParallelLinear` `name` of `n` outputs over `k` inputs: this rank's
    /// rows `first .. first + len` of the weight and of the bias.
    pub(crate) fn load_column(
        ld: &mut Loader,
        name: &str,
        (n, k): (usize, usize),
        (first, len): (usize, usize),
    ) -> Result<Self> {
        Ok(BiasedLinear {
            w: ld.linear_slice(&format!("{name}.weight"), Slice::rows(n, k, first, len))?,
            b: Some(ld.dense_concat_parts(
                &[format!("{name}.bias")],
                &[n],
                &[(first, len)],
                &format!("{name}.bias"),
            )?),
            adds_bias: true,
        })
    }

    /// A biased `RowParallelLinear` `name` of `n` outputs over `k` inputs: this rank's
    /// columns `first .. first + len`, the whole bias, added on rank 0 only.
    pub(crate) fn load_row(
        ld: &mut Loader,
        name: &str,
        (n, k): (usize, usize),
        (first, len): (usize, usize),
        rank: usize,
    ) -> Result<Self> {
        Ok(BiasedLinear {
            w: ld.linear_slice(&format!("{name}.weight"), Slice::cols(n, k, first, len))?,
            b: Some(ld.dense(&format!("{name}.bias"), &[n])?),
            adds_bias: rank == 0,
        })
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

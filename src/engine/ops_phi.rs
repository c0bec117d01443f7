//! The ops Phi (phi-1_5, phi-2) needs beyond OPT's and the Llama family's: `nn.LayerNorm` as
//! PyTorch's CUDA kernel allocates it (the output and two f32 statistics) and `gelu_new` into a
//! new tensor. Like `ops`, each allocates through the framework allocator and then runs on the
//! CPU, on CUDA or not at all (dry).

use crate::base::error::Result;
use crate::device::{cpu_gemma, Backend};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// `F.layer_norm(x, [H], w, b, eps)` as PyTorch's `layer_norm_cuda` runs it: `Y =
/// empty_like(x)`, then `mean` and `rstd` as f32 `[T]` (the accumulate type); `F.layer_norm`
/// keeps only `Y`, so the two statistics die as it returns, `mean` first (the tuple's
/// elements in order). OPT's `ops_opt::layer_norm` allocates `Y` alone.
pub fn layer_norm(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f32,
    name: &str,
) -> Result<Tensor> {
    // `Y` and the norm itself are OPT's; the statistics come after `Y` and die at once.
    let out = crate::engine::ops_opt::layer_norm(rt, x, w, b, eps, name)?;
    let rows = [x.rows()];
    let stat = |n: &str| {
        rt.tensor_for_overwrite(
            format!("{name}.{n}"),
            Category::Activation,
            &rows,
            DType::F32,
        )
    };
    let (mean, rstd) = (stat("mean")?, stat("rstd")?);
    drop(mean);
    drop(rstd);
    Ok(out)
}

/// vLLM's `NewGELU.forward_cuda` (activation.py L379-400 at 0.19): `out = empty_like(x)`,
/// then `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, Hugging Face's `gelu_new`.
pub fn gelu_new(rt: &Runtime, x: &Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("gelu_new");
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &x.shape, x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            for (o, &v) in out.f32_mut().iter_mut().zip(x.f32()) {
                *o = cpu_gemma::gelu_tanh(v);
            }
        }
        Backend::Cuda => crate::engine::ops::cuda(rt, |c| c.gelu_tanh(x, &mut out))?,
    }
    Ok(out)
}

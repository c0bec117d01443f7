//! The ops Granite needs beyond Llama's: its multipliers (vLLM granite.py). Like `ops`, each
//! allocates its output through the framework allocator and then runs on the CPU, on CUDA or
//! not at all (dry).

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::ops::cuda;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::Tensor;
use crate::memory::Category;

/// `x *= factor` in place (a Python float: no allocation), as granite.py L307 scales the
/// embedding by `embedding_multiplier` (0.19; L316 at 0.6.4).
pub fn scale_in_place(rt: &Runtime, x: &mut Tensor, factor: f32, op: &'static str) -> Result<()> {
    rt.set_op(op);
    match rt.backend() {
        Backend::Dry => Ok(()),
        Backend::Cpu => {
            x.f32_mut().iter_mut().for_each(|v| *v *= factor);
            Ok(())
        }
        Backend::Cuda => cuda(rt, |c| c.scale_in_place(x, factor)),
    }
}

/// `residual + branch * m` as Python evaluates it (granite.py L245 and L250 at 0.19): the
/// product into a new tensor, the sum into another, the product dying once the sum is made.
/// `branch` and `residual` stay with the caller.
pub fn scaled_residual_add(
    rt: &Runtime,
    residual: &Tensor,
    branch: &Tensor,
    m: f32,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("residual_multiplier");
    if residual.shape != branch.shape {
        return Err(Error::Request(format!(
            "{name}: {:?} + {:?} do not match",
            residual.shape, branch.shape
        )));
    }
    let mut scaled = rt.tensor_for_overwrite(
        format!("{name}.scaled"),
        Category::Activation,
        &branch.shape,
        branch.dtype,
    )?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            for (o, b) in scaled.f32_mut().iter_mut().zip(branch.f32()) {
                *o = b * m;
            }
        }
        Backend::Cuda => cuda(rt, |c| c.scale_into(branch, m, &mut scaled))?,
    }
    let mut sum =
        rt.tensor_for_overwrite(name, Category::Activation, &residual.shape, residual.dtype)?;
    if rt.backend() == Backend::Cuda {
        cuda(rt, |c| c.add(residual, &scaled, &mut sum))?;
    }
    if rt.backend() == Backend::Cpu {
        for ((o, r), t) in sum
            .f32_mut()
            .iter_mut()
            .zip(residual.f32())
            .zip(scaled.f32())
        {
            *o = r + t;
        }
    }
    drop(scaled);
    Ok(sum)
}

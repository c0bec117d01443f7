//! The ops OPT needs beyond the Llama family's (LayerNorm with bias, out-of-place ReLU and
//! add, named row gathers for the token and position embeddings). Like `ops`, each allocates
//! its output through the framework allocator and then runs on the CPU, on CUDA, or not at
//! all (dry).

use crate::base::error::{Error, Result};
use crate::device::cpu;
use crate::device::Backend;
use crate::engine::ops::cuda;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// `table[rows]` (`nn.Embedding` / `F.embedding`) into a new `[rows, cols]` tensor.
pub fn gather(
    rt: &Runtime,
    rows: &[u32],
    table: &Tensor,
    act: DType,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("embedding");
    let cols = table.cols();
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= table.rows()) {
        return Err(Error::Request(format!(
            "{name}: row {r} is outside {} of {} rows",
            table.name,
            table.rows()
        )));
    }
    let mut out = rt.tensor(name, Category::Activation, &[rows.len(), cols], act)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu::embedding(rows, table.f32(), cols, out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.embedding(rows, table, &mut out))?,
    }
    Ok(out)
}

/// `nn.LayerNorm` with weight and bias into a new tensor.
pub fn layer_norm(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f32,
    name: &str,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("layer_norm");
    let mut out = rt.tensor(name, Category::Activation, &x.shape, x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            crate::device::cpu_opt::layer_norm(x.f32(), w.f32(), b.f32(), eps, out.f32_mut())
        }
        Backend::Cuda => cuda(rt, |c| c.layer_norm(x, w, b, eps, &mut out))?,
    }
    Ok(out)
}

/// `nn.ReLU()` (not in place) into a new tensor.
pub fn relu(rt: &Runtime, x: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("relu");
    let mut out = rt.tensor(name, Category::Activation, &x.shape, x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => crate::device::cpu_opt::relu(x.f32(), out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.relu(x, &mut out))?,
    }
    Ok(out)
}

/// `a + b` into a new tensor (OPT's residual adds are not in place).
pub fn add(rt: &Runtime, a: &Tensor, b: &Tensor, name: &str) -> Result<Tensor> {
    rt.set_op("residual_add");
    if a.shape != b.shape {
        return Err(Error::Request(format!(
            "{name}: {:?} + {:?} do not match",
            a.shape, b.shape
        )));
    }
    let mut out = rt.tensor(name, Category::Activation, &a.shape, a.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => crate::device::cpu_opt::add(a.f32(), b.f32(), out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.add(a, b, &mut out))?,
    }
    Ok(out)
}

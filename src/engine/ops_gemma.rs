//! The ops Gemma 2 and Gemma 3 need beyond the Llama family's: GemmaRMSNorm (whose outputs
//! are new tensors, the residual sum too), GeGLU, the embedding's `√hidden` normalizer and
//! tanh soft-capping. Like `ops`, each allocates through the framework allocator and then runs
//! on the CPU, on CUDA (src/device/cuda/families.rs) or not at all (dry).

use crate::base::error::Result;
use crate::device::cpu_gemma;
use crate::device::Backend;
use crate::engine::ops::cuda;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::Tensor;
use crate::memory::Category;

/// `GemmaRMSNorm(x)` with no residual: one new output (vLLM compiles `forward_static` with
/// torch.compile, layernorm.py L193-205 at 0.6.4, so the f32 intermediates live inside one
/// kernel).
pub fn rms_norm(rt: &Runtime, x: &Tensor, w: &Tensor, eps: f32, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("gemma_rms_norm");
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &x.shape, x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu_gemma::gemma_rms_norm(x.f32(), w.f32(), eps, out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.gemma_rms_norm(x, w, eps, &mut out))?,
    }
    Ok(out)
}

/// `GemmaRMSNorm(x, residual)`: `x + residual` is a new tensor (the residual returned), then
/// the normalised output, also new; the caller's `x` and `residual` are left as they were.
/// Returns `(out, residual)`.
pub fn add_rms_norm(
    rt: &Runtime,
    x: &Tensor,
    residual: &Tensor,
    w: &Tensor,
    eps: f32,
    name: &str,
) -> Result<(Tensor, Tensor)> {
    rt.check_cancel()?;
    rt.set_op("gemma_add_rms_norm");
    let mut sum = rt.tensor_for_overwrite(
        format!("{name}.residual"),
        Category::Activation,
        &x.shape,
        x.dtype,
    )?;
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &x.shape, x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu_gemma::gemma_add_rms_norm(
            x.f32(),
            residual.f32(),
            w.f32(),
            eps,
            sum.f32_mut(),
            out.f32_mut(),
        ),
        Backend::Cuda => cuda(rt, |c| {
            c.gemma_add_rms_norm(x, residual, w, eps, (&mut sum, &mut out))
        })?,
    }
    Ok((out, sum))
}

/// vLLM's `GeluAndMul(approximate="tanh").forward_cuda` (activation.py L170-175 at 0.8.5):
/// `out = empty([T, I])`, then `gelu_tanh(gate) · up`.
pub fn gelu_tanh_and_mul(rt: &Runtime, gate: &Tensor, up: &Tensor, name: &str) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("gelu_tanh_and_mul");
    let mut out = rt.tensor_for_overwrite(name, Category::Activation, &gate.shape, gate.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => cpu_gemma::gelu_tanh_mul_into(gate.f32(), up.f32(), out.f32_mut()),
        Backend::Cuda => cuda(rt, |c| c.gelu_tanh_mul(gate, up, &mut out))?,
    }
    Ok(out)
}

/// The embedding times `normalizer`, a buffer in the model dtype (`factor` already rounded to
/// it): Gemma 2 multiplies in place (`hidden_states *= self.normalizer`, gemma2.py L289 at
/// 0.6.4); Gemma 3 into a new tensor, the embedding's output dying (gemma3.py L380 at 0.8.5).
pub fn scale_embedding(rt: &Runtime, x: Tensor, factor: f32, in_place: bool) -> Result<Tensor> {
    rt.set_op("embed.normalizer");
    if in_place {
        let mut x = x;
        match rt.backend() {
            Backend::Dry => {}
            Backend::Cpu => x.f32_mut().iter_mut().for_each(|v| *v *= factor),
            Backend::Cuda => cuda(rt, |c| c.scale_in_place(&mut x, factor))?,
        }
        return Ok(x);
    }
    // The new tensor first, then the embedding's output dies (as `x` leaves this function).
    let mut out =
        rt.tensor_for_overwrite("embed.scaled", Category::Activation, &x.shape, x.dtype)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            for (o, &v) in out.f32_mut().iter_mut().zip(x.f32()) {
                *o = v * factor;
            }
        }
        Backend::Cuda => cuda(rt, |c| c.scale_into(&x, factor, &mut out))?,
    }
    drop(x);
    Ok(out)
}

/// vLLM's `LogitsProcessor` soft-cap (logits_processor.py L72-75 at 0.8.5): `logits / cap`,
/// `tanh`, `· cap`, each out of place, each input dying as the name is rebound. Gemma's
/// vocabularies (256000, 262208) are multiples of 64, so the `[..., :vocab]` view the
/// division reads is every column.
pub fn soft_cap_logits(
    rt: &Runtime,
    logits: Tensor,
    cap: f32,
    category: Category,
) -> Result<Tensor> {
    rt.check_cancel()?;
    rt.set_op("logits.soft_cap");
    let mut x = logits;
    for step in ["div", "tanh", "mul"] {
        let mut out = rt.tensor_for_overwrite(
            format!("logits.soft_cap.{step}"),
            category,
            &x.shape,
            x.dtype,
        )?;
        match (rt.backend(), step) {
            (Backend::Dry, _) => {}
            (Backend::Cpu, "mul") => cpu_gemma::soft_cap(x.f32(), cap, out.f32_mut()),
            // The three steps are computed at once by the last; the first two stand for
            // their allocations.
            (Backend::Cpu, _) => out.f32_mut().copy_from_slice(x.f32()),
            (Backend::Cuda, _) => {
                let n = match step {
                    "div" => 0,
                    "tanh" => 1,
                    _ => 2,
                };
                cuda(rt, |c| c.softcap_step(&x, n, cap, &mut out))?
            }
        }
        x = out;
    }
    Ok(x)
}

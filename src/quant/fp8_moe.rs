//! vLLM's online fp8 experts from 0.19 (`--quantization fp8` on a 16-bit MoE checkpoint:
//! `Fp8OnlineMoEMethod`, quantization/fp8.py L922-1043 at 0.19.0; renamed
//! `Fp8PerTensorOnlineMoEMethod` in quantization/online/fp8.py from 0.25.1, the same tensors;
//! docs/reading/vllm-fp8-online-moe-v021.md): the layer's 16-bit
//! `w13_weight [E, 2·I, H]` and `w2_weight [E, H, I]` are loaded, then each expert is
//! quantized per tensor (`ops.scaled_fp8_quant`) into float8_e4m3fn with one f32 scale per
//! expert and weight, and the 16-bit copies are freed. The 16-bit parameters live on the meta
//! device until the layer's last weight arrives (`initialize_online_processing`,
//! model_loader/reload/layerwise.py L110-182), so the layer is materialized, loaded and
//! quantized at once: only one layer's 16-bit experts are ever on the GPU.

use crate::base::error::Result;
use crate::device::Backend;
use crate::engine::ops_moe::{Fp8Codec, Fp8TensorScales};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

use super::fp8;

/// A layer's per-tensor fp8 experts' scales after `process_weights_after_loading`:
/// `w13_weight_scale [E]` and `w2_weight_scale [E]` (f32), their values on the host (CPU
/// compute; zero otherwise).
pub struct Fp8MoeScales {
    pub w13: Tensor,
    pub w2: Tensor,
    pub w13_values: Vec<f32>,
    pub w2_values: Vec<f32>,
}

impl Fp8MoeScales {
    pub fn nbytes(&self) -> u64 {
        self.w13.nbytes() + self.w2.nbytes()
    }

    /// The fused kernels' view: the scales and vLLM's fp8 codec.
    pub fn view(&self) -> Fp8TensorScales<'_> {
        Fp8TensorScales {
            w13: &self.w13,
            w2: &self.w2,
            w13_values: &self.w13_values,
            w2_values: &self.w2_values,
            codec: codec(),
        }
    }
}

/// `scaled_fp8_quant(x, scale=None)` and float8_e4m3fn's values, as `quant::fp8` has them.
pub fn codec() -> Fp8Codec {
    Fp8Codec {
        quantize: fp8::quantize_per_tensor,
        decode: fp8::decode,
    }
}

pub use crate::engine::rules::OnlineScales;

/// `Fp8OnlineMoEMethod.process_weights_after_loading` (0.19.0 fp8.py L1008-1043) on one
/// layer's 16-bit experts: `empty_like` fp8 `w13 [E, 2·I, H]` and `w2 [E, H, I]`, then
/// `torch.ones(E)` f32 `w13_scale` and `w2_scale`; per expert `scaled_fp8_quant` of its
/// `w13` slice (a new fp8 `[2·I, H]` and a `[1]` f32 scale, _custom_ops.py L1839-1853),
/// copied in and freed (the codes, then the scale, as the tuple's items are stored), then the
/// same for its `w2` slice; `_setup_kernel` converts nothing for TRITON
/// (`convert_to_fp8_moe_kernel_format`, oracle/fp8.py L457-467) and `replace_parameter`
/// swaps in `w13` (freeing the 16-bit one), then `w2`. Returns the fp8 experts and scales.
pub fn quantize_experts(
    rt: &Runtime,
    w13: Tensor,
    w2: Tensor,
    prefix: &str,
) -> Result<(Tensor, Tensor, Fp8MoeScales)> {
    if rt.backend() == Backend::Cuda {
        return Err(crate::base::error::Error::Request(format!(
            "{prefix}: online fp8 experts have no CUDA kernels here yet; run them on a simulated device (sim:PRESET)"
        )));
    }
    let scales = rt.fp8_online_scales();
    if let (OnlineScales::Amax { .. }, Backend::Cpu, Some(tp)) = (scales, rt.backend(), rt.tp()) {
        if tp.size > 1 {
            return Err(crate::base::error::Error::Request(format!(
                "{prefix}: from vLLM 0.28 each expert's fp8 scale is the max over every tensor-parallel rank's shard (an all-reduce at load); the CPU computes one rank: run it dry"
            )));
        }
    }
    rt.set_op("fp8.moe_scaled_fp8_quant");
    let e = w13.shape[0];
    let (n13, h) = (w13.shape[1], w13.shape[2]);
    let i = w2.shape[2];
    let t = |n: &str, shape: &[usize], dt: DType| {
        rt.tensor(format!("{prefix}.{n}"), Category::Weight, shape, dt)
    };
    let mut q13 = t("w13_weight", &[e, n13, h], DType::F8E4M3)?;
    let mut q2 = t("w2_weight", &[e, h, i], DType::F8E4M3)?;
    // 0.28 on: per stack the `[E]` amax (kept to the method's return) and the `[E]` scale.
    let mut amax = Vec::new();
    let (mut s13, mut s2) = match scales {
        OnlineScales::Dynamic => (
            t("w13_weight_scale", &[e], DType::F32)?,
            t("w2_weight_scale", &[e], DType::F32)?,
        ),
        OnlineScales::Amax { .. } => {
            let mut made = Vec::new();
            for w in ["w13", "w2"] {
                let lo = t(&format!("{w}_aminmax_lo"), &[e], w13.dtype)?;
                let hi = t(&format!("{w}_aminmax_hi"), &[e], w13.dtype)?;
                let lo_abs = t(&format!("{w}_lo_abs"), &[e], w13.dtype)?;
                let hi_abs = t(&format!("{w}_hi_abs"), &[e], w13.dtype)?;
                amax.push(t(&format!("{w}_amax"), &[e], w13.dtype)?);
                drop(lo_abs);
                drop(hi_abs);
                drop(lo);
                drop(hi);
                let cast = t(&format!("{w}_amax_f32"), &[e], DType::F32)?;
                let max = t("fp8_max", &[], DType::F32)?;
                made.push(t(&format!("{w}_weight_scale"), &[e], DType::F32)?);
                drop(max);
                drop(cast);
            }
            let s2 = made.pop().expect("two scales");
            let s13 = made.pop().expect("two scales");
            (s13, s2)
        }
    };
    let (mut v13, mut v2) = (vec![0f32; e], vec![0f32; e]);
    for x in 0..e {
        for (src, dst, vals, rows, cols) in [
            (&w13, &mut q13, &mut v13, n13, h),
            (&w2, &mut q2, &mut v2, h, i),
        ] {
            let codes = t("qweight_expert", &[rows, cols], DType::F8E4M3)?;
            let scale = match scales {
                OnlineScales::Dynamic => Some(t("weight_scale_expert", &[1], DType::F32)?),
                OnlineScales::Amax { .. } => None,
            };
            if rt.backend() == Backend::Cpu {
                // The amax's scale is `max|w| / 448` in f32, as the dynamic kernel's.
                let span = x * rows * cols..(x + 1) * rows * cols;
                let (c, s) = fp8::quantize_per_tensor(&src.f32()[span.clone()]);
                dst.u8_mut()[span].copy_from_slice(&c);
                vals[x] = s;
            }
            drop(codes);
            drop(scale);
        }
    }
    if rt.backend() == Backend::Cpu {
        s13.f32_mut().copy_from_slice(&v13);
        s2.f32_mut().copy_from_slice(&v2);
    }
    if scales == (OnlineScales::Amax { early_free: true }) {
        drop(w13);
        drop(w2);
        drop(amax);
    } else {
        drop(amax);
        drop(w13);
        drop(w2);
    }
    Ok((
        q13,
        q2,
        Fp8MoeScales {
            w13: s13,
            w2: s2,
            w13_values: v13,
            w2_values: v2,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp8::tests::{runtime, trace};

    /// One layer of two experts (I = 768, H = 2048): the fp8 stacks and the `[E]` scales,
    /// then per expert its w13 codes and scale made and freed, then its w2's, then the two
    /// 16-bit stacks freed; the scales hold 512-byte blocks.
    #[test]
    fn experts_quantize_one_at_a_time_then_the_16_bit_stacks_go() {
        let rt = runtime("dry");
        let (e, i, h) = (2usize, 768usize, 2048usize);
        let w =
            |n: &str, shape: &[usize]| rt.tensor(n, Category::Weight, shape, DType::BF16).unwrap();
        let w13 = w("x.w13_weight", &[e, 2 * i, h]);
        let w2 = w("x.w2_weight", &[e, h, i]);
        let from = rt.event_count();
        let (q13, q2, s) = quantize_experts(&rt, w13, w2, "x").unwrap();
        let (b13, b2) = ((2 * i * h) as u64, (h * i) as u64);
        let a = |t: &str, b| ("alloc", format!("x.{t}"), b);
        let f = |t: &str, b| ("free", format!("x.{t}"), b);
        let mut want = vec![
            a("w13_weight", e as u64 * b13),
            a("w2_weight", e as u64 * b2),
            a("w13_weight_scale", 512),
            a("w2_weight_scale", 512),
        ];
        for _ in 0..e {
            for b in [b13, b2] {
                want.extend([
                    a("qweight_expert", b),
                    a("weight_scale_expert", 512),
                    f("qweight_expert", b),
                    f("weight_scale_expert", 512),
                ]);
            }
        }
        want.extend([
            f("w13_weight", 2 * e as u64 * b13),
            f("w2_weight", 2 * e as u64 * b2),
        ]);
        assert_eq!(trace(&rt, from), want);
        assert_eq!(q13.nbytes() + q2.nbytes() + s.nbytes(), 2 * (b13 + b2) + 16);
    }

    /// On the host each expert gets its own `max|w| / 448`: an expert ten times larger keeps
    /// its codes and a ten times larger scale.
    #[test]
    fn each_expert_has_its_own_scale() {
        let rt = runtime("compute");
        let (i, h) = (2usize, 4usize);
        let base: Vec<f32> = (0..2 * i * h).map(|v| v as f32 / 16.0 - 0.25).collect();
        let mut all = base.clone();
        all.extend(base.iter().map(|v| v * 10.0));
        let mut w13 = rt
            .tensor("w13", Category::Weight, &[2, 2 * i, h], DType::F32)
            .unwrap();
        w13.f32_mut().copy_from_slice(&all);
        let w2 = rt
            .tensor("w2", Category::Weight, &[2, h, i], DType::F32)
            .unwrap();
        let (q13, _, s) = quantize_experts(&rt, w13, w2, "x").unwrap();
        let n = 2 * i * h;
        assert_eq!(q13.u8()[..n], q13.u8()[n..]);
        assert_eq!(s.w13_values[0], 0.6875 / 448.0);
        assert_eq!(s.w13_values[1], 6.875 / 448.0);
        assert_eq!(s.w13.f32(), &s.w13_values[..]);
    }
}

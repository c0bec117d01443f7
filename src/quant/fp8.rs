//! vLLM's fp8 (`--quantization fp8`, `Fp8LinearMethod`, 0.6.4 fp8.py): float8_e4m3fn
//! weights with one f32 scale per linear layer; on every forward the activation is quantized
//! per tensor (`ops.scaled_fp8_quant`) and CUTLASS multiplies the two into the activation
//! dtype (`ops.cutlass_scaled_mm`, 0.6.4 utils/w8a8_utils.py L84-117).

use std::sync::OnceLock;

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// The largest finite float8_e4m3fn (`torch.finfo(torch.float8_e4m3fn).max`).
pub const E4M3_MAX: f32 = 448.0;

/// c10's `fp8e4m3fn_from_fp32_value` (c10/util/Float8_e4m3fn.h), what a PyTorch cast to
/// float8_e4m3fn does: round to nearest, ties to even; a magnitude of 480 or more (inf, NaN
/// included) becomes NaN (`0x7F` with the sign). The kernels clamp to ±448 before it
/// (`quantize_scaled`), so they never meet that case.
pub fn encode(x: f32) -> u8 {
    const FP8_MAX: u32 = 1087 << 20; // 480.0
    const DENORM_MASK: u32 = 141 << 23; // 2^14: its ulp is e4m3's smallest subnormal, 2^-9
    let mut bits = x.to_bits();
    let sign = bits & 0x8000_0000;
    bits ^= sign;
    let code = if bits >= FP8_MAX {
        0x7F
    } else if bits < (121 << 23) {
        // Below 2^-6, e4m3's smallest normal: the float addition rounds to a multiple of 2^-9.
        let b = (f32::from_bits(bits) + f32::from_bits(DENORM_MASK)).to_bits();
        b.wrapping_sub(DENORM_MASK) as u8
    } else {
        let mant_odd = (bits >> 20) & 1;
        // Rebias the exponent (127 → 7) and round the 20 dropped mantissa bits to even.
        let b = bits
            .wrapping_add(((7i32 - 127) as u32) << 23)
            .wrapping_add(0x7FFFF + mant_odd);
        (b >> 20) as u8
    };
    code | (sign >> 24) as u8
}

/// The value of a float8_e4m3fn code: `0x7F`/`0xFF` are NaN, there is no infinity.
pub fn decode(code: u8) -> f32 {
    table()[code as usize]
}

fn table() -> &'static [f32; 256] {
    static T: OnceLock<[f32; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0f32; 256];
        for (c, v) in t.iter_mut().enumerate() {
            let (e, m) = ((c >> 3) & 0xF, (c & 7) as f32);
            let mag = if e == 15 && c & 7 == 7 {
                f32::NAN
            } else if e == 0 {
                m * 2f32.powi(-9)
            } else {
                (8.0 + m) * 2f32.powi(e as i32 - 10)
            };
            *v = if c & 0x80 != 0 { -mag } else { mag };
        }
        t
    })
}

/// `scaled_fp8_conversion<true>` (csrc/quantization/fp8/common.cu at 0.6.4): `x · inv_scale`
/// clamped to ±448 with `fminf`/`fmaxf` (so a NaN product becomes +448), then converted.
// Not `clamp`: it passes NaN through, where `fminf` (and `f32::min`) gives 448.
#[allow(clippy::manual_clamp)]
pub fn quantize_scaled(x: f32, inv_scale: f32) -> u8 {
    encode((x * inv_scale).min(E4M3_MAX).max(-E4M3_MAX))
}

/// `dynamic_scaled_fp8_quant`'s scale: `segmented_max_reduction` writes `max|x| / 448` (f32
/// division; `fmaxf` skips NaN).
pub fn dynamic_scale(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / E4M3_MAX
}

/// `scaled_fp8_quant_kernel`: every value at the scale's f32 inverse (`1.0f / *scale`).
pub fn quantize_with_scale(x: &[f32], scale: f32, out: &mut [u8]) {
    let inv = 1.0f32 / scale;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = quantize_scaled(v, inv);
    }
}

/// `ops.scaled_fp8_quant(x, scale=None)`: per-tensor dynamic quantization, codes and scale.
pub fn quantize_per_tensor(x: &[f32]) -> (Vec<u8>, f32) {
    let scale = dynamic_scale(x);
    let mut codes = vec![0u8; x.len()];
    quantize_with_scale(x, scale, &mut codes);
    (codes, scale)
}

/// Codes back to values times `scale` (what `per_tensor_dequantize` computes, in f32).
pub fn dequantize(codes: &[u8], scale: f32) -> Vec<f32> {
    codes.iter().map(|&c| decode(c) * scale).collect()
}

/// A checkpoint's per-tensor scale (`weight_scale`, `input_scale`) as vLLM's
/// `PerTensorScaleParameter` takes it: F32 of shape `[]` or `[1]` (0.6.4 parameter.py
/// `_load_into_shard_id` reshapes a 0-dim scale to `[1]`). A scale that is not finite and
/// positive would make every value it multiplies NaN, infinite or zero, so it is refused;
/// the message names the file and the tensor.
pub fn checked_scale(
    file: &std::path::Path,
    tensor: &str,
    shape: &[usize],
    values: &[f32],
) -> Result<f32> {
    if !(shape.is_empty() || shape == [1]) || values.len() != 1 {
        return Err(Error::model(
            file,
            format!(
            "tensor {tensor} has shape {shape:?}, expected a per-tensor scale of shape [] or [1]"
            ),
        ));
    }
    let s = values[0];
    if !(s.is_finite() && s > 0.0) {
        return Err(Error::model(
            file,
            format!("tensor {tensor} is {s}, expected a finite scale above 0"),
        ));
    }
    Ok(s)
}

/// vLLM's `requantize_with_max_scale` (0.6.4 utils/w8a8_utils.py L55-81) on the codes of a
/// fused parameter whose shards (`rows[i]` rows of `k` each) were stored with `scales[i]`:
/// each shard is dequantized to float16 (`per_tensor_dequantize`, L24-29: the code widened
/// to f16, times the f32 scale, rounded to f16) and quantized again at the largest scale
/// (`scaled_fp8_quant` with a given scale). Returns that scale, the one the forward uses.
/// Every checkpoint scale is finite and positive (`checked_scale`), so the
/// "unfused module in checkpoint" test (`weight_scale[-1] > finfo.min`) always holds.
pub fn requantize_with_max_scale(
    codes: &mut [u8],
    k: usize,
    rows: &[usize],
    scales: &[f32],
) -> f32 {
    let max = scales.iter().fold(f32::MIN, |m, &s| m.max(s));
    let inv = 1.0f32 / max;
    let mut start = 0;
    for (&n, &s) in rows.iter().zip(scales) {
        for c in &mut codes[start * k..(start + n) * k] {
            let dq = half::f16::from_f32(decode(*c) * s).to_f32();
            *c = quantize_scaled(dq, inv);
        }
        start += n;
    }
    max
}

/// What a pre-quantized fp8 checkpoint says about itself (vLLM 0.6.4's
/// `Fp8Config.from_config` with `is_checkpoint_fp8_serialized`, fp8.py L70-79): whether its
/// activations are quantized with stored `input_scale`s (`activation_scheme: static`) or per
/// forward (`dynamic`), and the dtype of everything left unquantized and of the activations
/// (config.json's `torch_dtype` as vLLM's `--dtype auto` takes it: bfloat16 stays, float32
/// becomes float16, config.py `_get_and_verify_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredFp8 {
    pub static_activations: bool,
    pub dtype: DType,
    /// `weight_block_size` of a block-wise checkpoint (vLLM 0.8.5): `weight_scale_inv` per
    /// block instead of one `weight_scale` per tensor (`fp8_block` runs it).
    pub block: Option<BlockSize>,
    /// compressed-tensors' `strategy: "channel"` weights: one f32 `weight_scale` per output
    /// row (`[n, 1]`, vLLM's `ChannelQuantScaleParameter`), never requantized
    /// (CompressedTensorsW8A8Fp8, 0.19 compressed_tensors_w8a8_fp8.py).
    pub channel: bool,
    /// A compressed-tensors checkpoint (modelled under the V1 releases only).
    pub compressed_tensors: bool,
    /// compressed-tensors' int8 w8a8 (`format: int-quantized`, vLLM's
    /// CompressedTensorsW8A8Int8): I8 weights with `[n, 1]` channel scales, activations
    /// quantized to int8 per token on every forward (`channel` is set too).
    pub int8: bool,
    /// `ignored_layers` / `modules_to_not_convert` names every layer's `mlp.gate`: the MoE
    /// routers stay 16-bit (Qwen3-MoE passes its quant_config to the router, qwen3_moe.py
    /// L176-182 at 0.19.0, so without this vLLM would make them fp8).
    pub routers_unquantized: bool,
    /// An NVIDIA ModelOpt `quant_algo: FP8` checkpoint (`ModelOptFp8LinearMethod`): the same
    /// tensors as AutoFP8's static scheme, requantized only when a fused layer's shard
    /// scales differ (0.19.0 modelopt.py L499-508).
    pub modelopt: bool,
}

/// `quantization_config.weight_block_size`: `[block_n, block_k]` (output rows, input columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSize {
    pub n: usize,
    pub k: usize,
}

impl BlockSize {
    /// The `weight_scale_inv` shape of an `[n, k]` weight: `[ceil(n / block_n), ceil(k /
    /// block_k)]` (`BlockQuantScaleParameter`, fp8.py L266-271 at 0.8.5).
    pub fn grid(self, n: usize, k: usize) -> [usize; 2] {
        [n.div_ceil(self.n), k.div_ceil(self.k)]
    }
}

/// A linear layer under vLLM's `Fp8LinearMethod` after `process_weights_after_loading`.
pub struct Fp8Linear {
    /// F8E4M3 `[n, k]`; vLLM keeps `qweight.t()`, a view of the same bytes.
    pub qweight: Tensor,
    /// F32 `[1]`, the per-tensor `weight_scale`.
    pub weight_scale: Tensor,
    pub weight_scale_value: f32,
    /// The static activation scheme's `input_scale` (F32 `[1]`) and its value; `None` for
    /// dynamic activations.
    pub input_scale: Option<(Tensor, f32)>,
    pub out_features: usize,
    pub in_features: usize,
    /// `weight_scale` holds one scale per output row (`[n, 1]`, compressed-tensors'
    /// channel strategy) instead of one.
    pub per_channel: bool,
    /// I8 weights and per-token I8 activations (compressed-tensors int8 w8a8) instead of
    /// e4m3.
    pub int8: bool,
    /// The checkpoint's per-shard `weight_scale`s until after loading; read even without
    /// compute for ModelOpt, where whether they are equal decides what is allocated.
    pub stored_scales: Vec<f32>,
}

impl Fp8Linear {
    pub fn weight_bytes(&self) -> u64 {
        self.qweight.nbytes()
            + self.weight_scale.nbytes()
            + self.input_scale.as_ref().map_or(0, |(t, _)| t.nbytes())
    }

    /// vLLM's in-flight `process_weights_after_loading` for one layer (0.6.4 fp8.py
    /// L182-201): `scaled_fp8_quant(layer.weight)` allocates the fp8 copy `[n, k]`, then a
    /// zeroed f32 scale `[1]`; the caller then replaces the 16-bit weight, which frees it.
    pub fn quantize_in_flight(rt: &Runtime, w: &Tensor) -> Result<Self> {
        let (n, k) = (w.shape[0], w.cols());
        rt.set_op("fp8.scaled_fp8_quant");
        let base = w.name.trim_end_matches(".weight").to_string();
        let mut qweight = rt.tensor(w.name.clone(), Category::Weight, &[n, k], DType::F8E4M3)?;
        let mut weight_scale = rt.tensor(
            format!("{base}.weight_scale"),
            Category::Weight,
            &[1],
            DType::F32,
        )?;
        let mut value = 0.0;
        match rt.backend() {
            Backend::Dry => {}
            Backend::Cpu => {
                let (codes, s) = quantize_per_tensor(w.f32());
                qweight.u8_mut().copy_from_slice(&codes);
                weight_scale.f32_mut()[0] = s;
                value = s;
            }
            Backend::Cuda => {
                value = crate::engine::ops::cuda(rt, |c| {
                    c.check_fp8()?;
                    c.fp8_quantize_dynamic(w, &mut weight_scale, &mut qweight)?;
                    Ok(c.download_f32(&weight_scale)?[0])
                })?;
            }
        }
        Ok(Fp8Linear {
            qweight,
            weight_scale,
            weight_scale_value: value,
            input_scale: None,
            out_features: n,
            in_features: k,
            per_channel: false,
            int8: false,
            stored_scales: Vec::new(),
        })
    }

    /// vLLM's `process_weights_after_loading` for a checkpoint stored in fp8 (0.6.4 fp8.py
    /// L205-248, the w8a8 path): `qweight` holds the stored codes of `rows.len()` shards,
    /// `weight_scales` their `[shards]` scales, `input_scales` the static scheme's. In order:
    /// `weight_scale.max()` (a 0-dim f32) and the bool of `weight_scale[-1] > finfo.min`;
    /// per shard `per_tensor_dequantize` (the f16 copy, the f16 product; the copy freed, then
    /// the previous shard's product) and `scaled_fp8_quant` at the max scale (fp8 output,
    /// copied into the weight, freed); on return the bool and the last product; the `[shards]`
    /// weight scale replaced (freed); then `input_scale.max()` replacing the `[shards]` one.
    pub fn requantize_stored(
        rt: &Runtime,
        mut qweight: Tensor,
        weight_scales: (Tensor, &[f32]),
        input_scales: Option<(Tensor, &[f32])>,
        rows: &[usize],
    ) -> Result<Self> {
        let (n, k) = (qweight.shape[0], qweight.cols());
        let base = qweight.name.trim_end_matches(".weight").to_string();
        rt.set_op("fp8.requantize_with_max_scale");
        let scalar = |name: String, dtype| rt.tensor(name, Category::Weight, &[], dtype);
        let mut max_scale = scalar(format!("{base}.weight_scale"), DType::F32)?;
        let unfused = scalar(format!("{base}.unfused_module_in_checkpoint"), DType::U8)?;
        let mut last_dq: Option<Tensor> = None;
        for &w in rows {
            let fake = rt.tensor(
                format!("{base}.fake_qweight"),
                Category::Weight,
                &[w, k],
                DType::F16,
            )?;
            let dq = rt.tensor(
                format!("{base}.weight_dq"),
                Category::Weight,
                &[w, k],
                DType::F16,
            )?;
            drop(fake);
            last_dq = Some(dq);
            let out = rt.tensor(
                format!("{base}.requantized"),
                Category::Weight,
                &[w, k],
                DType::F8E4M3,
            )?;
            drop(out);
        }
        drop(unfused);
        drop(last_dq);
        let (old_scales, scales) = weight_scales;
        let mut value = 0.0;
        if rt.backend() == Backend::Cpu {
            value = requantize_with_max_scale(qweight.u8_mut(), k, rows, scales);
            max_scale.f32_mut()[0] = value;
        } else if rt.backend() == Backend::Cuda {
            value = scales.iter().fold(f32::MIN, |m, &s| m.max(s));
            crate::engine::ops::cuda(rt, |c| {
                c.check_fp8()?;
                let mut r0 = 0;
                for (&n, &s) in rows.iter().zip(scales) {
                    c.fp8_requantize_rows(&mut qweight, r0, n, s, value)?;
                    r0 += n;
                }
                c.upload_f32(&mut max_scale, &[value])
            })?;
        }
        drop(old_scales);
        let input_scale = match input_scales {
            None => None,
            Some((old, values)) => {
                let mut t = scalar(format!("{base}.input_scale"), DType::F32)?;
                let m = values.iter().fold(f32::MIN, |m, &s| m.max(s));
                match rt.backend() {
                    Backend::Cpu => t.f32_mut()[0] = m,
                    Backend::Cuda => crate::engine::ops::cuda(rt, |c| c.upload_f32(&mut t, &[m]))?,
                    Backend::Dry => {}
                }
                drop(old);
                Some((t, m))
            }
        };
        Ok(Fp8Linear {
            qweight,
            weight_scale: max_scale,
            weight_scale_value: value,
            input_scale,
            out_features: n,
            in_features: k,
            per_channel: false,
            int8: false,
            stored_scales: Vec::new(),
        })
    }

    /// `ModelOptFp8LinearMethod.process_weights_after_loading` (0.11.0 modelopt.py L264-273,
    /// 0.15.1 L501-510, 0.19.0 L509-518): `weight_scale.max()` (a 0-dim f32), then
    /// `(weight_scale == weight_scale[0]).all()` (a bool `[shards]` and a 0-dim bool, both
    /// freed once Python has its truth). Equal shard scales (what ModelOpt's export writes
    /// for q/k/v and gate/up) keep the codes as stored; otherwise `requantize_with_max_scale`
    /// runs as AutoFP8's path does (`requantize_stored`), its own max replacing the first.
    /// Then `weight.t()` (a view) and `input_scale.max()`, as there.
    pub fn requantize_stored_modelopt(
        rt: &Runtime,
        qweight: Tensor,
        weight_scales: (Tensor, &[f32]),
        input_scales: Option<(Tensor, &[f32])>,
        rows: &[usize],
    ) -> Result<Self> {
        let base = qweight.name.trim_end_matches(".weight").to_string();
        let (n, k) = (qweight.shape[0], qweight.cols());
        rt.set_op("modelopt_fp8.process_weights_after_loading");
        let scalar = |name: String, dtype| rt.tensor(name, Category::Weight, &[], dtype);
        let mut first_max = scalar(format!("{base}.weight_scale"), DType::F32)?;
        let eq = rt.tensor(
            format!("{base}.weight_scale_eq"),
            Category::Weight,
            &[rows.len()],
            DType::U8,
        )?;
        let all = scalar(format!("{base}.weight_scale_eq_all"), DType::U8)?;
        drop(eq);
        drop(all);
        // No values (a config alone): ModelOpt's export writes a stacked layer's shards at one
        // scale (`preprocess_linear_fusion`), so they are taken as equal.
        let scales = weight_scales.1;
        let (qweight, weight_scale, value) = if scales.iter().all(|&s| s == scales[0]) {
            let value = scales.first().copied().unwrap_or(0.0);
            match rt.backend() {
                Backend::Cpu => first_max.f32_mut()[0] = value,
                Backend::Cuda => {
                    crate::engine::ops::cuda(rt, |c| c.upload_f32(&mut first_max, &[value]))?
                }
                Backend::Dry => {}
            }
            drop(weight_scales.0);
            (qweight, first_max, value)
        } else {
            // The requantized max is made while the first is alive; the first is freed when
            // `max_w_scale` is rebound, before the `[shards]` scale is replaced.
            let lin = Self::requantize_stored(rt, qweight, weight_scales, None, rows)?;
            drop(first_max);
            (lin.qweight, lin.weight_scale, lin.weight_scale_value)
        };
        let input_scale = match input_scales {
            None => None,
            Some((old, values)) => {
                let mut t = scalar(format!("{base}.input_scale"), DType::F32)?;
                let m = values.iter().fold(f32::MIN, |m, &s| m.max(s));
                match rt.backend() {
                    Backend::Cpu => t.f32_mut()[0] = m,
                    Backend::Cuda => crate::engine::ops::cuda(rt, |c| c.upload_f32(&mut t, &[m]))?,
                    Backend::Dry => {}
                }
                drop(old);
                Some((t, m))
            }
        };
        Ok(Fp8Linear {
            qweight,
            weight_scale,
            weight_scale_value: value,
            input_scale,
            out_features: n,
            in_features: k,
            per_channel: false,
            int8: false,
            stored_scales: Vec::new(),
        })
    }

    /// `apply_fp8_linear` on the CUTLASS path (0.6.4 w8a8_utils.py L98-117): `x [m, k] →
    /// [m, n]` in `act`. `scaled_fp8_quant` allocates the fp8 input `[m, k]` and, for dynamic
    /// activations, a zeroed f32 scale `[1]`; `cutlass_scaled_mm` allocates the output; the
    /// fp8 input and then its scale are freed when the function returns. `rows` are the
    /// output features of a fused layer's shards: the host writes each shard's columns as one
    /// contiguous block, as `FusedLinear` lays its output out (one `[n]` for a plain layer).
    pub fn forward(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        act: DType,
        rows: &[usize],
    ) -> Result<Tensor> {
        rt.check_cancel()?;
        let (m, k, n) = (x.rows(), x.cols(), self.out_features);
        if k != self.in_features {
            return Err(Error::Request(format!(
                "{name}: input has {k} features but the fp8 weight {} expects {}",
                self.qweight.name, self.in_features
            )));
        }
        if self.int8 {
            return self.forward_int8(rt, x, name, act, rows);
        }
        if self.per_channel && rt.backend() == Backend::Cuda {
            return Err(Error::Request(format!(
                "{name}: channel-wise fp8 weights (compressed-tensors) have no CUDA kernel here yet; run them on a simulated device (sim:PRESET)"
            )));
        }
        rt.set_op("fp8.scaled_fp8_quant");
        // V1: dynamic activations get one scale per token (`scaled_fp8_quant(x,
        // use_per_token_if_dynamic=True)`: `torch.empty((T, 1), float32)`, 0.19
        // _custom_ops.py L1845-1850), static ones keep the stored per-tensor scale.
        let per_token = self.input_scale.is_none() && rt.fp8_act_per_token();
        let mut qinput = rt.tensor(
            format!("{name}.qinput"),
            Category::Activation,
            &[m, k],
            DType::F8E4M3,
        )?;
        let scale_shape: &[usize] = if per_token { &[m, 1] } else { &[1] };
        let mut x_scale = match self.input_scale {
            Some(_) => None,
            None => Some(rt.tensor(
                format!("{name}.x_scale"),
                Category::Activation,
                scale_shape,
                DType::F32,
            )?),
        };
        let mut xs = 0.0;
        let mut row_scales = Vec::new();
        match rt.backend() {
            Backend::Cpu if per_token => {
                // `dynamic_per_token_scaled_fp8_quant`: each row at max|row| / 448.
                let (xv, q) = (x.f32(), qinput.u8_mut());
                for (r, (row, qr)) in xv.chunks_exact(k).zip(q.chunks_exact_mut(k)).enumerate() {
                    let s = dynamic_scale(row);
                    quantize_with_scale(row, s, qr);
                    row_scales.push(s);
                    if let Some(t) = &mut x_scale {
                        t.f32_mut()[r] = s;
                    }
                }
            }
            Backend::Cpu => {
                xs = match &self.input_scale {
                    Some((_, s)) => *s,
                    None => dynamic_scale(x.f32()),
                };
                quantize_with_scale(x.f32(), xs, qinput.u8_mut());
                if let Some(t) = &mut x_scale {
                    t.f32_mut()[0] = xs;
                }
            }
            Backend::Cuda if per_token => {
                return Err(Error::Request(format!(
                    "{name}: vLLM V1's per-token fp8 activation quantization has no CUDA kernel here yet; run it on a simulated device (sim:PRESET) or with --vllm 0.6.4"
                )))
            }
            Backend::Cuda => {
                crate::engine::ops::cuda(rt, |c| match (&mut x_scale, &self.input_scale) {
                    (Some(t), _) => c.fp8_quantize_dynamic(x, t, &mut qinput),
                    (None, Some((s, _))) => c.fp8_quantize_static(x, s, &mut qinput),
                    (None, None) => unreachable!("a static layer has its input scale"),
                })?
            }
            Backend::Dry => {}
        }
        rt.set_op("fp8.cutlass_scaled_mm");
        let mut out =
            rt.tensor_for_overwrite(format!("{name}.out"), Category::Activation, &[m, n], act)?;
        match rt.backend() {
            Backend::Cpu if per_token => {
                self.cpu_scaled_mm(rt, &qinput, &row_scales, &mut out, act, rows)?
            }
            Backend::Cpu => self.cpu_scaled_mm(rt, &qinput, &[xs], &mut out, act, rows)?,
            Backend::Cuda => {
                let scale = match (&x_scale, &self.input_scale) {
                    (Some(t), _) => t,
                    (None, Some((s, _))) => s,
                    (None, None) => unreachable!("a static layer has its input scale"),
                };
                let (w, ws) = (&self.qweight, &self.weight_scale);
                crate::engine::ops::cuda(rt, |c| {
                    c.fp8_scaled_mm(&qinput, scale, w, ws, &mut out, rows)
                })?
            }
            Backend::Dry => {}
        }
        drop(qinput);
        drop(x_scale);
        Ok(out)
    }

    /// compressed-tensors int8 w8a8 as vLLM's `CutlassScaledMMLinearKernel.apply_weights` runs
    /// it (0.11.0 kernels/scaled_mm/cutlass.py L105-137): `scaled_int8_quant(x)`, dynamic and
    /// symmetric, allocates the int8 input `[m, k]` then its f32 scales `[m, 1]` (one per
    /// token; `_custom_ops.py` `scaled_int8_quant`: `torch.empty_like(input, dtype=int8)`,
    /// then `torch.empty((numel // k, 1), float32)`), `cutlass_scaled_mm` the output `[m, n]`
    /// in `act`; the two are freed on return. Each token at `max |x| / 127`, each value
    /// `x · (127 / max |x|)` rounded to nearest even and clamped to [-128, 127]
    /// (`dynamic_scaled_int8_quant`); the product of the codes (int32 on the GPU; the host's
    /// f32 sums are exact while they stay below 2^24, k up to 1024 at the extreme codes),
    /// then `scale_a[row] ·
    /// (scale_b[col] · acc)` rounded to `act`. No CUDA kernel here: refused by name.
    fn forward_int8(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        act: DType,
        rows: &[usize],
    ) -> Result<Tensor> {
        let (m, k, n) = (x.rows(), x.cols(), self.out_features);
        if rt.backend() == Backend::Cuda {
            return Err(Error::Request(format!(
                "{name}: compressed-tensors int8 w8a8 (CUTLASS int8 scaled_mm) has no CUDA kernel here yet; run it on a simulated device (sim:PRESET)"
            )));
        }
        rt.set_op("int8.scaled_int8_quant");
        let mut qinput = rt.tensor(
            format!("{name}.qinput"),
            Category::Activation,
            &[m, k],
            DType::I8,
        )?;
        let mut x_scale = rt.tensor(
            format!("{name}.x_scale"),
            Category::Activation,
            &[m, 1],
            DType::F32,
        )?;
        let mut row_scales = Vec::new();
        if rt.backend() == Backend::Cpu {
            let (xv, q) = (x.f32(), qinput.i8_mut());
            for (r, (row, qr)) in xv.chunks_exact(k).zip(q.chunks_exact_mut(k)).enumerate() {
                let absmax = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let s = absmax / 127.0;
                let adj = if absmax > 0.0 { 127.0 / absmax } else { 0.0 };
                for (o, &v) in qr.iter_mut().zip(row) {
                    *o = (v * adj).round_ties_even().clamp(-128.0, 127.0) as i8;
                }
                row_scales.push(s);
                x_scale.f32_mut()[r] = s;
            }
        }
        rt.set_op("int8.cutlass_scaled_mm");
        let mut out =
            rt.tensor_for_overwrite(format!("{name}.out"), Category::Activation, &[m, n], act)?;
        if rt.backend() == Backend::Cpu {
            let xv: Vec<f32> = qinput.i8().iter().map(|&c| c as f32).collect();
            let w = self.qweight.i8();
            let decode = |r: std::ops::Range<usize>, buf: &mut [f32]| {
                for (d, &code) in buf.iter_mut().zip(&w[r.start * k..r.end * k]) {
                    *d = code as f32;
                }
            };
            let w_scales = self.weight_scale.f32();
            let o = out.f32_mut();
            super::host_decoded_matmul(rt, &xv, (m, k), rows, o, decode, |a| a)?;
            let (mut at, mut c0) = (0, 0);
            for &nr in rows {
                for (r, row) in o[at..at + m * nr].chunks_exact_mut(nr).enumerate() {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = act.round(row_scales[r] * (w_scales[c0 + c] * *v));
                    }
                }
                at += m * nr;
                c0 += nr;
            }
        }
        drop(qinput);
        drop(x_scale);
        Ok(out)
    }

    /// CUTLASS's fp8 GEMM on the host: the products of decoded codes summed in f32 (each is
    /// exact: 4 + 4 significant bits), then the epilogue `scale_a · (scale_b · acc)`
    /// (`ScaledEpilogue`) rounded to `act`. The weight is decoded a run of rows at a time.
    /// `x_scales`: one per tensor, or one per token (row of the input and of the output).
    fn cpu_scaled_mm(
        &self,
        rt: &Runtime,
        qinput: &Tensor,
        x_scales: &[f32],
        out: &mut Tensor,
        act: DType,
        rows: &[usize],
    ) -> Result<()> {
        let (m, k) = (qinput.rows(), qinput.cols());
        let lut = table();
        let xv: Vec<f32> = qinput.u8().iter().map(|&c| lut[c as usize]).collect();
        let w = self.qweight.u8();
        let ws = self.weight_scale_value;
        let decode = |r: std::ops::Range<usize>, buf: &mut [f32]| {
            for (d, &code) in buf.iter_mut().zip(&w[r.start * k..r.end * k]) {
                *d = lut[code as usize];
            }
        };
        if let ([x_scale], false) = (x_scales, self.per_channel) {
            return super::host_decoded_matmul(rt, &xv, (m, k), rows, out.f32_mut(), decode, |a| {
                act.round(x_scale * (ws * a))
            });
        }
        // Per token or per channel: the plain product, then the epilogue's `scale_a[row] ·
        // (scale_b[col] · acc)` element by element.
        let w_scales: Vec<f32> = if self.per_channel {
            self.weight_scale.f32().to_vec()
        } else {
            vec![ws]
        };
        let o = out.f32_mut();
        super::host_decoded_matmul(rt, &xv, (m, k), rows, o, decode, |a| a)?;
        // `out` holds each shard's columns as its own `[m, rows[i]]` block.
        let (mut at, mut c0) = (0, 0);
        for &n in rows {
            for (r, row) in o[at..at + m * n].chunks_exact_mut(n).enumerate() {
                let xs = x_scales[if x_scales.len() == 1 { 0 } else { r }];
                for (c, v) in row.iter_mut().enumerate() {
                    let wsc = w_scales[if w_scales.len() == 1 { 0 } else { c0 + c }];
                    *v = act.round(xs * (wsc * *v));
                }
            }
            at += m * n;
            c0 += n;
        }
        Ok(())
    }
}

/// Whether vLLM runs fp8 on a GPU of this architecture as vramscope models it (CUTLASS,
/// w8a8), with the reason when not: vLLM needs compute capability 8.0 at all
/// (`Fp8Config.get_min_capability`) and 8.9 for fp8 tensor cores; below that it runs fp8
/// Marlin, weight-only w8a16 (0.6.4 fp8.py L120-121: `not has_device_capability(89)`).
pub fn check_gpu(arch: &str, gpu: &str) -> Result<()> {
    let why = match arch {
        "Ada" | "Hopper" | "Blackwell" => return Ok(()),
        "Ampere" => "compute capability 8.0/8.6 is below the 8.9 that fp8 tensor cores need, so vLLM runs fp8 Marlin (weight-only, w8a16; fp8.py L120-121 at 0.6.4), which vramscope does not reproduce",
        "Turing" => "vLLM refuses fp8 below compute capability 8.0 (Fp8Config.get_min_capability, fp8.py L63-65 at 0.6.4)",
        _ => "its compute capability is not known to vramscope",
    };
    Err(Error::Request(format!(
        "--quant fp8 on {gpu} ({arch}): {why}; use an Ada, Hopper or Blackwell preset (l4, l40s, rtx4090, h100-80gb, h200-141gb)"
    )))
}

/// The releases whose fp8 path vramscope reproduces: 0.6.3 to 0.6.5 allocate alike (fp8.py
/// and `apply_fp8_linear` read the same there); 0.7 adds `maybe_create_device_identity` at
/// the first layer's `create_weights` and 0.8 `Fp8LinearOp`: not yet modelled. The V1
/// releases run the same weights (e4m3, one f32 scale a layer, `scaled_fp8_quant(weight,
/// scale=None)`: 0.19 fp8.py L539-556) with per-token dynamic activations (the runtime's
/// `fp8_act_per_token`; static checkpoints keep their per-tensor input scale). Each layer
/// is quantized as it loads here, as 0.19's `Fp8OnlineLinearMethod` does (meta device); 0.11
/// holds the whole 16-bit model until `process_weights_after_loading` (a load-time peak not
/// modelled) and makes a 4-byte `TORCH_DEVICE_IDENTITY` (w8a8_utils.py L139-143), not
/// modelled either.
pub fn check_release(release: &str, v1: bool) -> Result<()> {
    if v1 || matches!(release, "0.6.3" | "380e1863" | "0.6.4" | "0.6.5") {
        return Ok(());
    }
    Err(Error::Request(format!(
        "--quant fp8 with --vllm {release}: vramscope reproduces fp8 as vLLM 0.6.3 to 0.6.5 and the V1 releases run it; 0.7 and 0.8 allocate differently (a device identity scale at 0.7, Fp8LinearOp at 0.8), not yet modelled: use --vllm 0.6.4 or a V1 release (0.11, 0.15, 0.19, 0.21)"
    )))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_scale_is_one_finite_positive_f32() {
        let file = std::path::Path::new("ckpt/model.safetensors");
        let one = |shape: &[usize]| checked_scale(file, "x.weight_scale", shape, &[0.25]);
        assert_eq!(one(&[]).unwrap(), 0.25);
        assert_eq!(one(&[1]).unwrap(), 0.25);
        let err = |shape: &[usize], v: &[f32]| {
            checked_scale(file, "m.o_proj.weight_scale", shape, v)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[2], &[1.0, 1.0]).starts_with("ckpt/model.safetensors"));
        assert!(err(&[2], &[1.0, 1.0]).contains(
            "tensor m.o_proj.weight_scale has shape [2], expected a per-tensor scale of shape [] or [1]"
        ));
        for (v, shown) in [
            (f32::NAN, "NaN"),
            (f32::INFINITY, "inf"),
            (-0.5, "-0.5"),
            (0.0, "0"),
        ] {
            assert!(
                err(&[], &[v]).contains(&format!(
                    "tensor m.o_proj.weight_scale is {shown}, expected a finite scale above 0"
                )),
                "{v}"
            );
        }
    }

    #[test]
    fn requantizing_at_the_shards_own_scale_keeps_normal_codes() {
        // A single shard (o_proj, down_proj): dequantized to f16 and back at the same scale.
        // With scale 1 every finite code is exact in f16 and comes back unchanged.
        let all: Vec<u8> = (0..=255u8).filter(|&c| c & 0x7F != 0x7F).collect();
        let mut codes = all.clone();
        let s = requantize_with_max_scale(&mut codes, all.len(), &[1], &[1.0]);
        assert_eq!(s, 1.0);
        assert_eq!(codes, all);
    }

    #[test]
    fn a_shard_at_half_the_max_scale_requantizes_one_binade_down() {
        // Shard 0 at scale 1/2, shard 1 at 1 (the max): shard 0's values halve in code space,
        // an exponent step lower for normal codes (2.0 = 0x40 → 1.0 = 0x38); shard 1 stays.
        let mut codes = vec![0x40, 0xC8, 0x40, 0xC8];
        let s = requantize_with_max_scale(&mut codes, 2, &[1, 1], &[0.5, 1.0]);
        assert_eq!(s, 1.0);
        assert_eq!(codes, vec![0x38, 0xC0, 0x40, 0xC8]);
        // The smallest subnormal halved (2^-10) is a tie between 0 and 2^-9: to even, 0.
        let mut tiny = vec![0x01, 0x02];
        requantize_with_max_scale(&mut tiny, 1, &[1, 1], &[0.5, 1.0]);
        assert_eq!(tiny, vec![0x00, 0x02]);
    }

    #[test]
    fn float16_dequantization_can_move_a_code_at_a_tiny_scale() {
        // At scale 2^-24 a code's value falls among float16's subnormals (steps of 2^-24):
        // code 0x01 (2^-9) times 2^-24 = 2^-33 rounds to 0 in f16, so it requantizes to 0.
        let mut codes = vec![0x01, 0x7E];
        let s = 2f32.powi(-24);
        requantize_with_max_scale(&mut codes, 2, &[1], &[s]);
        assert_eq!(codes, vec![0x00, 0x7E]);
    }

    #[test]
    fn encode_matches_hand_worked_codes() {
        // (value, code): sign | exponent (4 bits, bias 7) | mantissa (3 bits).
        let cases: [(f32, u8); 14] = [
            (0.0, 0x00),
            (-0.0, 0x80),
            (1.0, 0x38),          // 2^0: exponent 7
            (-2.0, 0xC0),         // sign, exponent 8
            (448.0, 0x7E),        // 1.75 · 2^8, the largest finite
            (0.015625, 0x08),     // 2^-6, the smallest normal
            (0.013671875, 0x07),  // 7 · 2^-9, the largest subnormal
            (0.0019531, 0x01),    // ≈ 2^-9, the smallest subnormal
            (0.0009765625, 0x00), // 2^-10: a tie between 0 and 2^-9, to even (0)
            (0.0029296875, 0x02), // 1.5 · 2^-9: a tie between 1 and 2 (· 2^-9), to even
            (1.0625, 0x38),       // halfway between 1 and 1.125: to even (1.0)
            (1.1875, 0x3A),       // halfway between 1.125 and 1.25: to even (1.25)
            (464.0, 0x7E),        // halfway between 448 and 480 (NaN's code): to even, 448
            (-300.0, 0xF9),       // 1.171875 · 2^8: nearer 1.125 · 2^8 = 288
        ];
        for (v, c) in cases {
            assert_eq!(encode(v), c, "{v}");
        }
    }

    #[test]
    fn encode_sends_480_and_above_and_nan_to_nan() {
        for v in [470.0, 480.0, 1e6, f32::INFINITY, f32::NAN] {
            assert_eq!(encode(v), 0x7F, "{v}");
        }
        assert_eq!(encode(-480.0), 0xFF);
        assert!(decode(0x7F).is_nan() && decode(0xFF).is_nan());
    }

    #[test]
    fn the_kernel_clamps_so_it_saturates_at_448() {
        // scaled_fp8_conversion: fminf/fmaxf to ±448 before the cast.
        assert_eq!(quantize_scaled(464.0, 1.0), 0x7E);
        assert_eq!(quantize_scaled(1e9, 1.0), 0x7E);
        assert_eq!(quantize_scaled(-1e9, 1.0), 0xFE);
        assert_eq!(quantize_scaled(f32::INFINITY, 1.0), 0x7E);
        // fminf(NaN, 448) is 448.
        assert_eq!(quantize_scaled(f32::NAN, 1.0), 0x7E);
    }

    /// FNV-1a 64, as scripts/fp8_reference.py computes it.
    fn fnv1a64(bytes: impl IntoIterator<Item = u8>) -> u64 {
        bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// PyTorch's own conversion, run once by scripts/fp8_reference.py (torch 2.11.0+cu130 on
    /// the GPU machine's CPU, 2026-12-02, docs/gpu-runs.md run 46): every float16 value cast
    /// to float32 then float8_e4m3fn, and every code decoded to float32 (NaN as 0x7FC00000).
    #[test]
    fn encode_and_decode_equal_pytorchs_on_every_f16_and_every_code() {
        let codes = (0..=u16::MAX).map(|h| encode(half::f16::from_bits(h).to_f32()));
        assert_eq!(fnv1a64(codes), 0xbd57_1fcb_cd35_1aa5);
        let bits = (0..=255u8).flat_map(|c| {
            let v = decode(c);
            let b = if v.is_nan() { 0x7FC0_0000 } else { v.to_bits() };
            b.to_le_bytes()
        });
        assert_eq!(fnv1a64(bits), 0xdad1_d9c5_0f74_9ca5);
        let sample = [
            0x0000, 0x0001, 0x1c00, 0x3c00, 0x5f00, 0x5f80, 0x7bff, 0x7c00, 0x7e00, 0xbc00,
        ]
        .map(|h: u16| encode(half::f16::from_bits(h).to_f32()));
        assert_eq!(sample, [0, 0, 2, 56, 126, 127, 127, 127, 127, 184]);
    }

    #[test]
    fn every_finite_code_round_trips() {
        for c in 0u8..=255 {
            let v = decode(c);
            if v.is_nan() {
                assert_eq!(c & 0x7F, 0x7F);
            } else {
                assert_eq!(encode(v), c, "code {c:#04x} = {v}");
            }
        }
        assert_eq!(decode(0x01), 2f32.powi(-9));
        assert_eq!(decode(0x7E), 448.0);
    }

    #[test]
    fn encode_is_round_to_nearest_even_on_every_interval() {
        // Between consecutive finite codes, the midpoint goes to the even code, points
        // either side of it to the nearer code.
        for c in 0u8..0x7E {
            let (a, b) = (decode(c), decode(c + 1));
            let mid = (a + b) / 2.0;
            let even = if c % 2 == 0 { c } else { c + 1 };
            assert_eq!(encode(mid), even, "mid of {a} and {b}");
            assert_eq!(encode(f32::from_bits(mid.to_bits() - 1)), c);
            assert_eq!(encode(f32::from_bits(mid.to_bits() + 1)), c + 1);
        }
    }

    #[test]
    fn per_tensor_quantization_scales_the_absmax_to_448() {
        let x = [0.5f32, -2.0, 1.0, 0.0];
        let (q, s) = quantize_per_tensor(&x);
        assert_eq!(s, 2.0 / 448.0);
        // -2.0 · (1 / s) = -448 (up to f32 rounding of the inverse, then the clamp).
        assert_eq!(q[1], 0xFE);
        let back = dequantize(&q, s);
        for (a, b) in back.iter().zip(&x) {
            // e4m3 keeps 3 mantissa bits: within 1/16 relative, here exact or nearly.
            assert!((a - b).abs() <= b.abs() / 16.0 + 1e-6, "{a} vs {b}");
        }
        // An all-zero tensor: scale 0, 1/0 = inf, 0 · inf = NaN → clamped to 448; the
        // dequantized values are 448 · 0 = 0.
        let (q, s) = quantize_per_tensor(&[0.0; 3]);
        assert_eq!(s, 0.0);
        assert_eq!(q, vec![0x7E; 3]);
        assert_eq!(dequantize(&q, s), vec![0.0; 3]);
    }

    pub(crate) fn runtime(mode: &str) -> Runtime {
        let spec = crate::device::DeviceSpec::parse(&format!("sim:h100-80gb:{mode}")).unwrap();
        Runtime::new(
            crate::device::Device::open(&spec).unwrap(),
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
            None,
        )
    }

    /// (kind, tensor, block bytes: rounded to 512) of the framework's allocs and frees from
    /// `from` on.
    pub(crate) fn trace(rt: &Runtime, from: usize) -> Vec<(&'static str, String, u64)> {
        use crate::memory::EventKind;
        rt.events_since(from, |evs| {
            evs.iter()
                .filter_map(|e| match e.kind {
                    EventKind::Alloc => Some(("alloc", e.tensor.clone(), e.bytes)),
                    EventKind::Free => Some(("free", e.tensor.clone(), e.bytes)),
                    _ => None,
                })
                .collect()
        })
    }

    #[test]
    fn a_stored_fused_fp8_weight_requantizes_shard_by_shard_at_the_max_scale() {
        let rt = runtime("dry");
        let w = |name: &str, shape: &[usize], dtype| {
            rt.tensor(name, Category::Weight, shape, dtype).unwrap()
        };
        let qweight = w("l.qkv_proj.weight", &[6144, 4096], DType::F8E4M3);
        let ws = w("l.qkv_proj.weight_scale", &[3], DType::F32);
        let is = w("l.qkv_proj.input_scale", &[3], DType::F32);
        let from = rt.event_count();
        let lin = Fp8Linear::requantize_stored(
            &rt,
            qweight,
            (ws, &[0.5, 1.0, 0.25]),
            Some((is, &[2.0, 3.0, 1.0])),
            &[4096, 1024, 1024],
        )
        .unwrap();
        let (q, kv) = (4096 * 4096 * 2, 1024 * 4096 * 2);
        let b = "l.qkv_proj";
        let e = |kind, t: &str, bytes| (kind, format!("{b}.{t}"), bytes);
        let mut want = vec![
            e("alloc", "weight_scale", 512),
            e("alloc", "unfused_module_in_checkpoint", 512),
        ];
        for (i, bytes) in [q, kv, kv].into_iter().enumerate() {
            want.push(e("alloc", "fake_qweight", bytes));
            want.push(e("alloc", "weight_dq", bytes));
            want.push(e("free", "fake_qweight", bytes));
            if i > 0 {
                want.push(e("free", "weight_dq", if i == 1 { q } else { kv }));
            }
            want.push(e("alloc", "requantized", bytes / 2));
            want.push(e("free", "requantized", bytes / 2));
        }
        want.extend([
            e("free", "unfused_module_in_checkpoint", 512),
            e("free", "weight_dq", kv),
            e("free", "weight_scale", 512),
            e("alloc", "input_scale", 512),
            e("free", "input_scale", 512),
        ]);
        assert_eq!(trace(&rt, from), want);
        assert_eq!(lin.weight_bytes(), 6144 * 4096 + 4 + 4);
        assert_eq!(rt.stats().allocated, 6144 * 4096 + 512 + 512);
    }

    #[test]
    fn a_stored_fp8_weight_on_the_host_computes_with_the_requantized_codes() {
        let rt = runtime("compute");
        let mut qweight = rt
            .tensor(
                "l.gate_up_proj.weight",
                Category::Weight,
                &[2, 2],
                DType::F8E4M3,
            )
            .unwrap();
        qweight.u8_mut().copy_from_slice(&[0x40, 0xC8, 0x40, 0xC8]);
        let ws = rt
            .tensor(
                "l.gate_up_proj.weight_scale",
                Category::Weight,
                &[2],
                DType::F32,
            )
            .unwrap();
        let lin =
            Fp8Linear::requantize_stored(&rt, qweight, (ws, &[0.5, 1.0]), None, &[1, 1]).unwrap();
        assert_eq!(lin.qweight.u8(), &[0x38, 0xC0, 0x40, 0xC8]);
        assert_eq!(lin.weight_scale_value, 1.0);
        assert_eq!(lin.weight_scale.f32(), &[1.0]);
        assert!(lin.input_scale.is_none());
    }

    #[test]
    fn one_linear_forward_allocates_fp8_input_scale_and_output_then_frees_the_two() {
        let rt = runtime("dry");
        let w = rt
            .tensor("o_proj.weight", Category::Weight, &[4096, 4096], DType::F16)
            .unwrap();
        let lin = Fp8Linear::quantize_in_flight(&rt, &w).unwrap();
        drop(w);
        let x = rt
            .tensor("x", Category::Activation, &[2048, 4096], DType::F16)
            .unwrap();
        let from = rt.event_count();
        let out = lin
            .forward(&rt, &x, "0.o_proj", DType::F16, &[4096])
            .unwrap();
        assert_eq!(out.shape, vec![2048, 4096]);
        assert_eq!(
            trace(&rt, from),
            vec![
                ("alloc", "0.o_proj.qinput".into(), 2048 * 4096),
                ("alloc", "0.o_proj.x_scale".into(), 512),
                ("alloc", "0.o_proj.out".into(), 2 * 2048 * 4096),
                ("free", "0.o_proj.qinput".into(), 2048 * 4096),
                ("free", "0.o_proj.x_scale".into(), 512),
            ]
        );
    }

    #[test]
    fn host_forward_is_the_scaled_product_of_the_codes() {
        let rt = runtime("compute");
        let (m, k, n) = (3, 40, 5);
        let wv: Vec<f32> = (0..n * k)
            .map(|i| DType::F16.round(((i * 37 % 101) as f32 - 50.0) / 64.0))
            .collect();
        let xv: Vec<f32> = (0..m * k)
            .map(|i| DType::F16.round(((i * 53 % 97) as f32 - 48.0) / 16.0))
            .collect();
        let w = rt
            .tensor_with_values(
                "w.weight",
                Category::Weight,
                &[n, k],
                DType::F16,
                wv.clone(),
            )
            .unwrap();
        let lin = Fp8Linear::quantize_in_flight(&rt, &w).unwrap();
        let x = rt
            .tensor_with_values("x", Category::Activation, &[m, k], DType::F16, xv.clone())
            .unwrap();
        // Two shards (2 and 3 rows): each writes its own `[m, rows]` block.
        let out = lin.forward(&rt, &x, "w", DType::F16, &[2, 3]).unwrap();
        let (wq, ws) = quantize_per_tensor(&wv);
        let (xq, xs) = quantize_per_tensor(&xv);
        assert_eq!(ws, lin.weight_scale_value);
        let mut want = vec![0f32; m * n];
        let (mut block, mut r0) = (0, 0);
        for shard in [2, 3] {
            for r in 0..m {
                for c in 0..shard {
                    // Exact in f64: each product and the sum of 40 of them fit.
                    let acc: f64 = (0..k)
                        .map(|i| decode(xq[r * k + i]) as f64 * decode(wq[(r0 + c) * k + i]) as f64)
                        .sum();
                    want[block + r * shard + c] = DType::F16.round(xs * (ws * acc as f32));
                }
            }
            block += m * shard;
            r0 += shard;
        }
        assert_eq!(out.f32(), &want[..]);
        // And close to the 16-bit product it stands for (e4m3 keeps 3 mantissa bits).
        let exact: f32 = (0..k).map(|i| xv[i] * wv[i]).sum();
        assert!((out.f32()[0] - exact).abs() < 0.1 * exact.abs().max(1.0));
    }

    /// vLLM V1's dynamic activations: one scale per token (`[T, 1]` f32, freed with the fp8
    /// input after the GEMM), each row quantized at its own max / 448 and each output row
    /// scaled back by it, so a row 1000 times smaller than its neighbour keeps its digits
    /// (one per-tensor scale would flush it to e4m3's subnormals).
    #[test]
    fn v1_quantizes_dynamic_activations_per_token() {
        let rt = runtime("compute");
        rt.set_fp8_act_per_token(true);
        let (m, k, n) = (2, 40, 3);
        let wv: Vec<f32> = (0..n * k)
            .map(|i| DType::F16.round(((i * 37 % 101) as f32 - 50.0) / 64.0))
            .collect();
        // Row 1 is row 0 divided by 1024.
        let xv: Vec<f32> = (0..m * k)
            .map(|i| {
                let v = ((i % k * 53 % 97) as f32 - 48.0) / 16.0;
                DType::F16.round(if i < k { v } else { v / 1024.0 })
            })
            .collect();
        let w = rt
            .tensor_with_values(
                "w.weight",
                Category::Weight,
                &[n, k],
                DType::F16,
                wv.clone(),
            )
            .unwrap();
        let lin = Fp8Linear::quantize_in_flight(&rt, &w).unwrap();
        let x = rt
            .tensor_with_values("x", Category::Activation, &[m, k], DType::F16, xv.clone())
            .unwrap();
        let from = rt.event_count();
        let out = lin.forward(&rt, &x, "w", DType::F16, &[n]).unwrap();
        let (wq, ws) = quantize_per_tensor(&wv);
        for r in 0..m {
            let (xq, xs) = quantize_per_tensor(&xv[r * k..(r + 1) * k]);
            for c in 0..n {
                let acc: f64 = (0..k)
                    .map(|i| decode(xq[i]) as f64 * decode(wq[c * k + i]) as f64)
                    .sum();
                let want = DType::F16.round(xs * (ws * acc as f32));
                assert_eq!(out.f32()[r * n + c], want, "row {r} col {c}");
            }
        }
        // Both rows as close to the 16-bit product as e4m3 allows.
        for r in 0..m {
            let exact: f32 = (0..k).map(|i| xv[r * k + i] * wv[i]).sum();
            let got = out.f32()[r * n];
            assert!(
                (got - exact).abs() < 0.1 * exact.abs(),
                "row {r}: {got} vs {exact}"
            );
        }
        let t = trace(&rt, from);
        assert_eq!(t[0], ("alloc", "w.qinput".to_string(), 512));
        assert_eq!(t[1], ("alloc", "w.x_scale".to_string(), 512));
        assert!(t.contains(&("free", "w.x_scale".to_string(), 512)));
    }
}

//! NVFP4 checkpoints (compressed-tensors' `nvfp4-pack-quantized`, ModelOpt's `NVFP4`) as vLLM
//! 0.19 runs them on a GPU without FP4 tensor cores (compute capability 8.0 to 9.x): weight
//! only, through the Marlin FP4 kernel (docs/reading/vllm-nvfp4-modelopt.md). The stored
//! format: e2m1 codes two a byte along the input (`[n, k/2]` U8, input `2j` in byte `j`'s low
//! nibble), one float8_e4m3fn block scale per 16 inputs (`[n, k/16]`), one f32 global scale
//! (a divisor in compressed-tensors, a multiplier in ModelOpt) and one f32 input scale.
//!
//! The repacked tensors are allocated as vLLM allocates them (shape, dtype, order); the host
//! keeps the checkpoint's codes and decoded scales beside them (the allocation is vLLM's, the
//! layout inside it ours).

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

use super::marlin::Kernel;
use super::mxfp4::E2M1;

/// Inputs per block scale (`group_size` 16, compressed_tensors.py L358-375 at 0.19.0).
pub const GROUP: usize = 16;
/// The largest e2m1 value and the largest float8_e4m3fn: a global scale of
/// `E2M1_MAX · E4M3_MAX / amax` lets every block scale fit (compressed-tensors'
/// `generate_gparam`, ModelOpt's `weight_scale_2 = amax / (6 · 448)`).
pub const E2M1_MAX: f32 = 6.0;
pub const E4M3_MAX: f32 = 448.0;

/// Who wrote the checkpoint: the tensors' names and the global scales' sense.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// LLM Compressor (`format: nvfp4-pack-quantized`): `weight_packed`, `weight_scale`,
    /// `weight_global_scale` and `input_global_scale` `[1]`, the global scales divisors.
    CompressedTensors,
    /// NVIDIA ModelOpt (`quant_algo: NVFP4`): `weight`, `weight_scale`, `weight_scale_2` and
    /// `input_scale` `[]`, the global scales multipliers.
    ModelOpt,
}

impl Flavor {
    /// The stored names of the codes, block scales, weight global scale and input scale.
    pub fn suffixes(self) -> [&'static str; 4] {
        match self {
            Flavor::CompressedTensors => [
                "weight_packed",
                "weight_scale",
                "weight_global_scale",
                "input_global_scale",
            ],
            Flavor::ModelOpt => ["weight", "weight_scale", "weight_scale_2", "input_scale"],
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Flavor::CompressedTensors => "compressed-tensors NVFP4",
            Flavor::ModelOpt => "ModelOpt NVFP4",
        }
    }

    /// The shape of a stored global scale: `[1]` (compressed-tensors) or `[]` (ModelOpt).
    pub fn scalar_shape(self) -> &'static [usize] {
        match self {
            Flavor::CompressedTensors => &[1],
            Flavor::ModelOpt => &[],
        }
    }

    /// The multiplier vLLM applies for a stacked layer's stored global scales: `1 / max`
    /// (compressed-tensors' divisors, compressed_tensors_w4a4_nvfp4.py L97-100 at 0.19.0) or
    /// `max` (ModelOpt, modelopt.py L1158-1159), in f32.
    pub fn multiplier(self, stored: &[f32]) -> f32 {
        let m = stored.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        match self {
            Flavor::CompressedTensors => 1.0 / m,
            Flavor::ModelOpt => m,
        }
    }

    /// The value stored for a layer whose values reach `amax`.
    pub fn stored_global(self, amax: f32) -> f32 {
        match self {
            Flavor::CompressedTensors => E2M1_MAX * E4M3_MAX / amax,
            Flavor::ModelOpt => amax / (E2M1_MAX * E4M3_MAX),
        }
    }
}

/// The e2m1 code nearest `v` (ties to the even code, as a float cast rounds).
pub fn e2m1_code(v: f32) -> u8 {
    let a = v.abs();
    let mut best = 0usize;
    for (c, &e) in E2M1[..8].iter().enumerate() {
        let (d, db) = ((a - e).abs(), (a - E2M1[best]).abs());
        if d < db || (d == db && c % 2 == 0 && best % 2 == 1) {
            best = c;
        }
    }
    let sign = if v.is_sign_negative() && best != 0 {
        8
    } else {
        0
    };
    best as u8 | sign
}

/// One stored NVFP4 linear (or the stacked shards of one): codes `[n, k/2]`, block scale
/// codes `[n, k/16]`, each shard's stored global and input scales.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parts {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub globals: Vec<f32>,
    pub inputs: Vec<f32>,
}

impl Parts {
    /// Shards stacked along the output (their rows one after the other).
    pub fn stack(parts: Vec<Parts>) -> Parts {
        let mut out = Parts::default();
        for p in parts {
            out.codes.extend(p.codes);
            out.scales.extend(p.scales);
            out.globals.extend(p.globals);
            out.inputs.extend(p.inputs);
        }
        out
    }
}

/// Quantizes `[n, k]` as LLM Compressor's NVFP4 and ModelOpt do: the global scale from
/// `amax` (the layer's, or a fused group's largest), each block scale
/// `e4m3(block_amax / 6 · G)` with `G = 6 · 448 / amax`, each code `e2m1(w · G / scale)`.
/// Returns the codes `[n, k/2]` and the block scale codes `[n, k/16]`.
pub fn quantize(w: &[f32], n: usize, k: usize, amax: f32) -> (Vec<u8>, Vec<u8>) {
    assert!(k.is_multiple_of(GROUP) && w.len() == n * k);
    let g = E2M1_MAX * E4M3_MAX / amax;
    let mut codes = vec![0u8; n * k / 2];
    let mut scales = Vec::with_capacity(n * k / GROUP);
    for (b, block) in w.chunks_exact(GROUP).enumerate() {
        let bmax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let s = super::fp8::encode((bmax / E2M1_MAX * g).min(E4M3_MAX));
        scales.push(s);
        let sv = super::fp8::decode(s);
        for (i, &v) in block.iter().enumerate() {
            let q = if sv > 0.0 { e2m1_code(v * g / sv) } else { 0 };
            let j = b * GROUP + i;
            codes[j / 2] |= if j.is_multiple_of(2) { q } else { q << 4 };
        }
    }
    (codes, scales)
}

/// Rows `r0..r1` of the `[n, k]` weight as the Marlin FP4 kernel forms it before the global
/// scale: each code's value times its block scale, in the activation dtype (a code has at most
/// two significant bits and a scale four, so the product is exact but where it leaves the
/// dtype's range).
pub fn dequantize_rows(
    codes: &[u8],
    scales: &[f32],
    k: usize,
    (r0, r1): (usize, usize),
    act: DType,
    out: &mut [f32],
) {
    for r in r0..r1 {
        let row = &mut out[(r - r0) * k..(r - r0 + 1) * k];
        for (c, v) in row.iter_mut().enumerate() {
            let j = r * k + c;
            let code = (codes[j / 2] >> (4 * (j % 2))) & 0x0F;
            *v = act.round(E2M1[code as usize] * scales[j / GROUP]);
        }
    }
}

/// The host's copy of a layer's values (compute mode).
pub struct Host {
    pub codes: Vec<u8>,
    /// Block scales decoded from e4m3, `[n, k/16]`.
    pub scales: Vec<f32>,
    /// The global multiplier the kernel applies (`Flavor::multiplier`).
    pub global: f32,
}

/// An NVFP4 linear as `CompressedTensorsW4A4Fp4` / `ModelOptNvFp4LinearMethod` hold it:
/// first the parameters as loaded, then, after `after_loading`, Marlin's.
pub struct Nvfp4Linear {
    pub flavor: Flavor,
    /// U8 `[n, k/2]` as loaded; I32 `[k/16, 2n]` repacked.
    pub weight: Tensor,
    /// F8_E4M3 `[n, k/16]` as loaded; `[k/16, n]` in Marlin's S0E5M3 form after.
    pub weight_scale: Tensor,
    /// F32 `[shards]` as loaded; `[]` after.
    pub weight_global_scale: Tensor,
    /// F32 `[shards]` as loaded; `[]` after.
    pub input_global_scale: Tensor,
    /// After loading: `input_global_scale_inv` and `alpha`, F32 `[]` (unused by Marlin).
    pub input_global_scale_inv: Option<Tensor>,
    pub alpha: Option<Tensor>,
    /// Marlin's I32 `[sms]` workspace.
    pub workspace: Option<Tensor>,
    pub out_features: usize,
    pub in_features: usize,
    pub kernel: Kernel,
    pub host: Option<Host>,
}

impl Nvfp4Linear {
    /// `create_weights` (compressed_tensors_w4a4_nvfp4.py L48-86 at 0.19.0: `weight_packed`,
    /// `weight_global_scale`, `weight_scale`, `input_global_scale`; modelopt.py L1111-1151:
    /// `weight`, `input_scale`, `weight_scale_2`, `weight_scale`), filled by the loader.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        rt: &Runtime,
        flavor: Flavor,
        base: &str,
        (n, k): (usize, usize),
        shards: usize,
        parts: Option<&Parts>,
        kernel: Kernel,
    ) -> Result<Self> {
        rt.set_op("load");
        if rt.backend() == Backend::Cuda {
            return Err(Error::Request(format!(
                "{base}: an {} layer on a CUDA device: vramscope computes NVFP4 on the CPU and plans it dry; the GPU's Marlin FP4 kernel is not reproduced",
                flavor.label()
            )));
        }
        let [wn, sn, gn, inn] = flavor.suffixes();
        let t = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        let w = t(wn, &[n, k / 2], DType::U8)?;
        let (weight_scale, weight_global_scale, input_global_scale) = match flavor {
            Flavor::CompressedTensors => {
                let g = t(gn, &[shards], DType::F32)?;
                let s = t(sn, &[n, k / GROUP], DType::F8E4M3)?;
                let i = t(inn, &[shards], DType::F32)?;
                (s, g, i)
            }
            Flavor::ModelOpt => {
                let i = t(inn, &[shards], DType::F32)?;
                let g = t(gn, &[shards], DType::F32)?;
                let s = t(sn, &[n, k / GROUP], DType::F8E4M3)?;
                (s, g, i)
            }
        };
        let host = match (parts, rt.backend()) {
            (Some(p), Backend::Cpu) => Some(Host {
                codes: p.codes.clone(),
                scales: p.scales.iter().map(|&c| super::fp8::decode(c)).collect(),
                global: flavor.multiplier(&p.globals),
            }),
            _ => None,
        };
        Ok(Nvfp4Linear {
            flavor,
            weight: w,
            weight_scale,
            weight_global_scale,
            input_global_scale,
            input_global_scale_inv: None,
            alpha: None,
            workspace: None,
            out_features: n,
            in_features: k,
            kernel,
            host,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.nbytes());
        self.weight.nbytes()
            + self.weight_scale.nbytes()
            + self.weight_global_scale.nbytes()
            + self.input_global_scale.nbytes()
            + opt(&self.input_global_scale_inv)
            + opt(&self.alpha)
            + opt(&self.workspace)
    }

    fn base(&self) -> String {
        let [wn, ..] = self.flavor.suffixes();
        self.weight
            .name
            .trim_end_matches(&format!(".{wn}"))
            .to_string()
    }

    /// `process_weights_after_loading` on the Marlin backend, allocation for allocation
    /// (docs/reading/vllm-nvfp4-modelopt.md, "Marlin FP4 after loading"): the scheme's 0-dim
    /// scalars, then `prepare_fp4_layer_for_marlin`.
    ///
    /// 0.19 (`kernel.minor` 19): compressed_tensors_w4a4_nvfp4.py L88-111 or modelopt.py
    /// L1153-1171, marlin_utils_fp4.py L203-283; under bf16 `_nvfp4_compute_scale_factor`
    /// (L30-50) makes its f32 copies and mask; a dry run takes every block scale as nonzero
    /// and the factor as 1 (true for a scale grid whose smallest nonzero scale is at least
    /// 2⁻⁶, as a calibrated checkpoint's).
    ///
    /// 0.11 and 0.15: compressed-tensors through `CompressedTensorsW4A16Fp4` (0.11.0
    /// compressed_tensors_w4a16_nvfp4.py L75-92, 0.15.1 L89-107): `weight_scale_2 =
    /// 1 / max(weight_global_scale)`, the input scale kept `[shards]`; their
    /// `prepare_fp4_layer_for_marlin` (0.11.0 marlin_utils_fp4.py L127-192, 0.15.1 L147-220)
    /// casts the global scale to the activation dtype (the kernel's multiplier is rounded to
    /// it), and 0.11's `nvfp4_marlin_process_scales` (L25-56) makes one more copy (its
    /// `permute(0, 2, 1, 3).reshape`).
    pub fn after_loading(&mut self, rt: &Runtime, act: DType) -> Result<()> {
        if self.workspace.is_some() {
            return Ok(());
        }
        let base = self.base();
        rt.set_op("nvfp4.process_weights_after_loading");
        let t = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        let v019 = self.kernel.minor >= 19;
        // The scheme's local that holds the stored global scales' max until it returns.
        let scheme_local = match (v019, self.flavor) {
            (true, Flavor::CompressedTensors) => {
                let inv = t("input_global_scale_inv", &[], DType::F32)?;
                let igs = t("input_global_scale", &[], DType::F32)?;
                drop(std::mem::replace(&mut self.input_global_scale, igs));
                let wmax = t("weight_global_scale_max", &[], DType::F32)?;
                let wgs = t("weight_global_scale", &[], DType::F32)?;
                drop(std::mem::replace(&mut self.weight_global_scale, wgs));
                self.input_global_scale_inv = Some(inv);
                self.alpha = Some(t("alpha", &[], DType::F32)?);
                Some(wmax)
            }
            (true, Flavor::ModelOpt) => {
                let igs = t("input_global_scale", &[], DType::F32)?;
                drop(std::mem::replace(&mut self.input_global_scale, igs));
                let wgs = t("weight_global_scale", &[], DType::F32)?;
                drop(std::mem::replace(&mut self.weight_global_scale, wgs));
                self.alpha = Some(t("alpha", &[], DType::F32)?);
                self.input_global_scale_inv = Some(t("input_global_scale_inv", &[], DType::F32)?);
                None
            }
            // CompressedTensorsW4A16Fp4: `1 / weight_global_scale.max()` (the max a
            // temporary), the stored scales deleted; the input scale stays as loaded.
            (false, _) => {
                let wmax = t("weight_global_scale_max", &[], DType::F32)?;
                let ws2 = t("weight_scale_2", &[], DType::F32)?;
                drop(wmax);
                drop(std::mem::replace(&mut self.weight_global_scale, ws2));
                None
            }
        };
        let held = v019 && self.flavor == Flavor::ModelOpt;
        let deferred = self.prepare_for_marlin(rt, &base, act, v019, held)?;
        drop(scheme_local);
        drop(deferred);
        if let (false, Some(h)) = (v019, self.host.as_mut()) {
            // `weight_scale_2.to(params_dtype)` before the exponent shift.
            h.global = act.round(h.global);
        }
        Ok(())
    }

    /// `prepare_fp4_layer_for_marlin`; returns the replaced global scale when the scheme's
    /// local still holds it (ModelOpt under 0.19), for the caller to free on return.
    fn prepare_for_marlin(
        &mut self,
        rt: &Runtime,
        base: &str,
        act: DType,
        v019: bool,
        global_still_held: bool,
    ) -> Result<Option<Tensor>> {
        let (n, k) = (self.out_features, self.in_features);
        let t = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        rt.set_op("marlin.prepare_fp4_layer_for_marlin");
        let sms = self.kernel.sms.max(1);
        self.workspace = Some(t("workspace", &[sms], DType::I32)?);
        let qweight_t = t("weight_t", &[k / 8, n], DType::I32)?;
        let repacked = t("weight_marlin", &[k / 16, 2 * n], DType::I32)?;
        drop(std::mem::replace(&mut self.weight, repacked));
        let groups = k / GROUP;
        let scale_t = t("weight_scale_t", &[groups, n], DType::F8E4M3)?;
        let scale16 = t("weight_scale_16", &[groups, n], act)?;
        drop(scale_t);
        let perm = t("scale_perm_index", &[64], DType::I64)?;
        let permuted = t("weight_scale_permuted", &[groups, n], act)?;
        drop(perm);
        drop(scale16);
        // nvfp4_marlin_process_scales: `(s >= 0).all()`, `.to(torch.half)` (a copy under
        // bf16), 0.11's permuted copy, the `[0, 2, 1, 3]` gather.
        let ge = t("scales_ge_0", &[groups, n], DType::U8)?;
        let all = t("scales_ge_0_all", &[], DType::U8)?;
        drop(ge);
        drop(all);
        let mut half_copy = (act != DType::F16)
            .then(|| t("weight_scale_half", &[groups, n], DType::F16))
            .transpose()?;
        if self.kernel.minor < 15 {
            let p = t("weight_scale_thread_order", &[groups, n], DType::F16)?;
            drop(half_copy.replace(p));
        }
        let idx = t("fp8_layout_index", &[4], DType::I64)?;
        let gathered = t("weight_scale_fp8_layout", &[groups, n], DType::F16)?;
        drop(idx);
        drop(half_copy);
        if v019 && act == DType::BF16 {
            // _nvfp4_compute_scale_factor: float(), · 2⁷, the mask, any(), the masked
            // gather (its nonzero indices first), min(), the comparison.
            let nonzero = self.host.as_ref().map_or(groups * n, |h| {
                h.scales.iter().filter(|&&s| s > 0.0).count()
            });
            let f = t("sf_float", &[groups, n], DType::F32)?;
            let ws_float = t("sf_ws_float", &[groups, n], DType::F32)?;
            drop(f);
            let mask = t("sf_nonzero_mask", &[groups, n], DType::U8)?;
            let any = t("sf_any", &[], DType::U8)?;
            drop(any);
            let idx = t("sf_nonzero_index", &[nonzero, 1], DType::I64)?;
            let sel = t("sf_selected", &[nonzero], DType::F32)?;
            drop(idx);
            let min_val = t("sf_min", &[], DType::F32)?;
            drop(sel);
            let cmp = t("sf_min_lt_2", &[], DType::U8)?;
            drop(cmp);
            drop(ws_float);
            drop(mask);
            drop(min_val);
        }
        let shifted = t("weight_scale_x128", &[groups, n], DType::F16)?;
        let as_i16 = t("weight_scale_i16", &[groups, n], DType::F16)?;
        drop(shifted);
        drop(gathered);
        let marlin_scales = t("weight_scale_marlin", &[groups, n], DType::F8E4M3)?;
        drop(as_i16);
        drop(permuted);
        drop(std::mem::replace(&mut self.weight_scale, marlin_scales));
        // The global scale: 0.19 `· 2^(bias − 7)` then `/ scale_factor` in f32 (L264-271);
        // 0.11 and 0.15 `.to(params_dtype)` then the shift, in that dtype.
        let (cast, shifted_dtype) = if v019 {
            (None, DType::F32)
        } else {
            (Some(t("weight_scale_2_16", &[], act)?), act)
        };
        let shifted_g = t("weight_global_scale_shifted", &[], shifted_dtype)?;
        drop(cast);
        let g = if v019 {
            let g = t("weight_global_scale_marlin", &[], DType::F32)?;
            drop(shifted_g);
            g
        } else {
            shifted_g
        };
        let old_global = std::mem::replace(&mut self.weight_global_scale, g);
        let deferred = if global_still_held {
            Some(old_global)
        } else {
            drop(old_global);
            None
        };
        drop(qweight_t);
        Ok(deferred)
    }

    /// `apply_fp4_marlin_linear` (marlin_utils_fp4.py L147-200 at 0.19.0): the view of the
    /// input, then `marlin_gemm`'s output `[m, n]` and f32 reduce buffer (no `a_tmp`: no
    /// act-order), as the refactored Marlin kernel allocates them for GPTQ. `rows`: a stacked
    /// layer's shards, each one contiguous block of the output.
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
                "{name}: input has {k} features but the NVFP4 weight {} expects {}",
                self.weight.name, self.in_features
            )));
        }
        if self.workspace.is_none() {
            return Err(Error::Request(format!(
                "{name}: the NVFP4 weight {} was not repacked for Marlin (process_weights_after_loading did not run)",
                self.weight.name
            )));
        }
        rt.set_op("marlin.marlin_gemm_fp4");
        let mut out =
            rt.tensor_for_overwrite(format!("{name}.out"), Category::Activation, &[m, n], act)?;
        let c_tmp = rt.tensor(
            format!("{name}.c_tmp"),
            Category::Activation,
            &[self.kernel.c_tmp_len(m)],
            DType::F32,
        )?;
        if rt.backend() == Backend::Cpu {
            let h = self.host.as_ref().ok_or_else(|| {
                Error::Request(format!("{name}: the NVFP4 weight has no host values"))
            })?;
            let (codes, scales) = (&h.codes[..], &h.scales[..]);
            let decode = |r: std::ops::Range<usize>, buf: &mut [f32]| {
                dequantize_rows(codes, scales, k, (r.start, r.end), act, buf)
            };
            let g = h.global;
            super::host_decoded_matmul(rt, x.f32(), (m, k), rows, out.f32_mut(), decode, |a| {
                act.round(a * g)
            })?;
        }
        drop(c_tmp);
        Ok(out)
    }

    /// The whole `[n, k]` weight as the forward applies it (global scale included), in f32.
    pub fn dequantized(&self, act: DType) -> Option<Vec<f32>> {
        let h = self.host.as_ref()?;
        let (n, k) = (self.out_features, self.in_features);
        let mut w = vec![0f32; n * k];
        dequantize_rows(&h.codes, &h.scales, k, (0, n), act, &mut w);
        w.iter_mut().for_each(|v| *v *= h.global);
        Some(w)
    }
}

/// The releases and GPUs vramscope reproduces NVFP4 for: 0.19's Marlin FP4 on compute
/// capability 8.0 to 9.x; Blackwell (CUTLASS / FlashInfer w4a4), older GPUs and other
/// releases are refused naming why.
pub fn check(flavor: Flavor, release: &str, arch: Option<(&str, &str)>) -> Result<()> {
    let what = format!("a {} checkpoint", flavor.label());
    let minor = release
        .strip_prefix("0.")
        .and_then(|r| r.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    match (minor, flavor) {
        (Some(19), _) | (Some(11 | 15), Flavor::CompressedTensors) => {}
        (Some(11 | 15), Flavor::ModelOpt) => {
            return Err(Error::Request(format!(
                "{what} with --vllm {release}: ModelOptNvFp4LinearMethod picks flashinfer-cutlass whenever FlashInfer is installed, before checking for an FP4 GPU (0.11.0 modelopt.py L851-860, 0.15.1 L1134-1142), so below Blackwell the backend depends on the install; vramscope reproduces vLLM 0.19's choice (Marlin FP4): use --vllm 0.19"
            )))
        }
        _ => {
            return Err(Error::Request(format!(
                "{what} with --vllm {release}: vramscope reproduces NVFP4 under 0.11 and 0.15 (compressed-tensors: CompressedTensorsW4A16Fp4 on Marlin) and 0.19 (select_nvfp4_linear_backend, prepare_fp4_layer_for_marlin); 0.21 on moved the kernels (kernels/linear/nvfp4), not reproduced: use --vllm 0.19"
            )))
        }
    }
    if let Some((arch, gpu)) = arch {
        match arch {
            "Ampere" | "Ada" | "Hopper" => {}
            "Blackwell" => {
                return Err(Error::Request(format!(
                    "{what} on {gpu} (Blackwell): vLLM runs it as w4a4 through FlashInfer/CUTLASS FP4 (swizzled block scales, padded weights, scaled_fp4_quant of the activations), which vramscope does not reproduce; on an A100, L40S, H100 or H200 the same checkpoint runs Marlin FP4 (weight-only), which it does"
                )))
            }
            _ => {
                return Err(Error::Request(format!(
                    "{what} on {gpu} ({arch}): vramscope reproduces vLLM's Marlin FP4 fallback on compute capability 8.0 to 9.x (A100, L40S, H100, H200) only"
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_codes_round_to_nearest() {
        assert_eq!(e2m1_code(0.0), 0);
        assert_eq!(e2m1_code(0.24), 0);
        assert_eq!(e2m1_code(0.26), 1);
        assert_eq!(e2m1_code(2.4), 4);
        assert_eq!(e2m1_code(2.6), 5);
        assert_eq!(e2m1_code(-6.0), 15);
        assert_eq!(e2m1_code(9.0), 7);
        // 2.5 sits between 2 (code 4) and 3 (code 5): the even code.
        assert_eq!(e2m1_code(2.5), 4);
        assert_eq!(e2m1_code(-0.75), 8 | 2);
        for (c, &v) in E2M1.iter().enumerate().skip(1) {
            if c != 8 {
                assert_eq!(e2m1_code(v), c as u8, "{v}");
            }
        }
    }

    #[test]
    fn quantize_and_dequantize_keep_the_values_within_a_step() {
        let (n, k) = (4, 32);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.001)
            .collect();
        let amax = w.iter().fold(0f32, |a, v| a.max(v.abs()));
        let (codes, scales) = quantize(&w, n, k, amax);
        assert_eq!((codes.len(), scales.len()), (n * k / 2, n * k / GROUP));
        let s: Vec<f32> = scales
            .iter()
            .map(|&c| crate::quant::fp8::decode(c))
            .collect();
        let mut d = vec![0f32; n * k];
        dequantize_rows(&codes, &s, k, (0, n), DType::F32, &mut d);
        let g =
            Flavor::CompressedTensors.multiplier(&[Flavor::CompressedTensors.stored_global(amax)]);
        for (b, block) in w.chunks_exact(GROUP).enumerate() {
            let step = s[b] * g; // the widest gap between e2m1 values is 2 (4 → 6): half is 1 step
            for (i, &v) in block.iter().enumerate() {
                let e = (d[b * GROUP + i] * g - v).abs();
                assert!(
                    e <= step * 1.0001,
                    "block {b} {i}: {v} vs {}",
                    d[b * GROUP + i] * g
                );
            }
        }
        // The largest value of the tensor maps to ±6 · its block scale: the scale of that
        // block is amax / 6 · G = 448, exactly.
        assert!(s.contains(&448.0));
        // ModelOpt's multiplier is the stored value.
        let mo = Flavor::ModelOpt.stored_global(amax);
        assert_eq!(Flavor::ModelOpt.multiplier(&[mo, mo * 0.5]), mo);
        assert_eq!(Flavor::CompressedTensors.multiplier(&[2.0, 4.0]), 0.25);
    }

    #[test]
    fn check_names_the_release_and_the_gpu() {
        let f = Flavor::CompressedTensors;
        assert!(check(f, "0.19", Some(("Hopper", "H100"))).is_ok());
        assert!(check(f, "0.15", Some(("Ada", "L40S"))).is_ok());
        assert!(check(f, "0.11", Some(("Ampere", "A100"))).is_ok());
        let e = check(f, "0.21", None).unwrap_err().to_string();
        assert!(
            e.contains("--vllm 0.21") && e.contains("kernels/linear/nvfp4"),
            "{e}"
        );
        let e = check(Flavor::ModelOpt, "0.15", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("flashinfer-cutlass"), "{e}");
        let e = check(f, "0.19", Some(("Blackwell", "B200")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Blackwell") && e.contains("CUTLASS"), "{e}");
        let e = check(Flavor::ModelOpt, "0.19", Some(("Turing", "T4")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ModelOpt NVFP4") && e.contains("8.0 to 9.x"),
            "{e}"
        );
    }

    fn layer(rt: &Runtime, flavor: Flavor, minor: u32) -> Nvfp4Linear {
        let (n, k) = (64, 32);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.003)
            .collect();
        let amax = w.iter().fold(0f32, |a, v| a.max(v.abs()));
        let (codes, scales) = quantize(&w, n, k, amax);
        let parts = Parts {
            codes,
            scales,
            globals: vec![flavor.stored_global(amax); 2],
            inputs: vec![flavor.stored_global(8.0); 2],
        };
        let kernel = Kernel {
            sms: 132,
            minor,
            ..Default::default()
        };
        Nvfp4Linear::load(rt, flavor, "l", (n, k), 2, Some(&parts), kernel).unwrap()
    }

    /// The allocations of 0.19's compressed-tensors path for a stacked `[64, 32]` layer of two
    /// shards in fp16, in order, and what stays; 0.15's keeps a 16-bit global scale (rounded
    /// as the kernel's multiplier is) and the `[2]` input scales.
    #[test]
    fn after_loading_allocates_as_each_release_does() {
        use crate::quant::fp8::tests::{runtime, trace};
        let rt = runtime("compute");
        let from = rt.events_since(0, |e| e.len());
        let mut l = layer(&rt, Flavor::CompressedTensors, 19);
        let g = l.host.as_ref().unwrap().global;
        l.after_loading(&rt, DType::F16).unwrap();
        let names: Vec<String> = trace(&rt, from)
            .iter()
            .map(|(k, t, _)| format!("{k} {}", t.trim_start_matches("l.")))
            .collect();
        let want = [
            "alloc weight_packed",
            "alloc weight_global_scale",
            "alloc weight_scale",
            "alloc input_global_scale",
            "alloc input_global_scale_inv",
            "alloc input_global_scale",
            "free input_global_scale",
            "alloc weight_global_scale_max",
            "alloc weight_global_scale",
            "free weight_global_scale",
            "alloc alpha",
            "alloc workspace",
            "alloc weight_t",
            "alloc weight_marlin",
            "free weight_packed",
            "alloc weight_scale_t",
            "alloc weight_scale_16",
            "free weight_scale_t",
            "alloc scale_perm_index",
            "alloc weight_scale_permuted",
            "free scale_perm_index",
            "free weight_scale_16",
            "alloc scales_ge_0",
            "alloc scales_ge_0_all",
            "free scales_ge_0",
            "free scales_ge_0_all",
            "alloc fp8_layout_index",
            "alloc weight_scale_fp8_layout",
            "free fp8_layout_index",
            "alloc weight_scale_x128",
            "alloc weight_scale_i16",
            "free weight_scale_x128",
            "free weight_scale_fp8_layout",
            "alloc weight_scale_marlin",
            "free weight_scale_i16",
            "free weight_scale_permuted",
            "free weight_scale",
            "alloc weight_global_scale_shifted",
            "alloc weight_global_scale_marlin",
            "free weight_global_scale_shifted",
            "free weight_global_scale",
            "free weight_t",
            "free weight_global_scale_max",
        ];
        assert_eq!(names, want);
        // What stays: 32 · 64 / 2 codes, 2 · 64 fp8 scales, four 0-dim f32, 132 int32.
        assert_eq!(l.weight_bytes(), 1024 + 128 + 16 + 528);
        assert_eq!(l.weight.shape, vec![2, 128]);
        assert_eq!(l.host.as_ref().unwrap().global, g);
        let mut old = layer(&rt, Flavor::CompressedTensors, 15);
        old.after_loading(&rt, DType::F16).unwrap();
        assert_eq!(old.weight_bytes(), 1024 + 128 + 2 + 8 + 528);
        assert_eq!(old.weight_global_scale.dtype, DType::F16);
        assert_eq!(old.host.as_ref().unwrap().global, DType::F16.round(g));
        assert_ne!(DType::F16.round(g), g);
        // The forward's math: the dequantized rows times the global multiplier.
        let d = l.dequantized(DType::F16).unwrap();
        let h = l.host.as_ref().unwrap();
        let code = h.codes[0] & 0x0F;
        assert_eq!(
            d[0],
            DType::F16.round(E2M1[code as usize] * h.scales[0]) * g
        );
    }
}

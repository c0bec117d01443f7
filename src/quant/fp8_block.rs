//! Block-wise fp8 (`Fp8Config` with `weight_block_size`, as DeepSeek-V3 and
//! Qwen/Qwen3-8B-FP8 store it): float8_e4m3fn weights with one f32 dequantization multiplier
//! per `[block_n, block_k]` block (`weight_scale_inv`), activations quantized on every forward
//! per token and group of `block_k` inputs (`per_token_group_quant_fp8`), then CUTLASS's
//! blockwise GEMM on Hopper or Triton's `w8a8_block_fp8_matmul` elsewhere, as vLLM 0.8.5
//! (`apply_w8a8_block_fp8_linear`, utils/fp8_utils.py L33-81 at 0.8.5) and the V1 releases
//! 0.11.0, 0.15.1 and 0.19.0 run it (`Fp8BlockEra`; the V1 forms differ in how Hopper's GEMM
//! pads the tokens: `engine::runtime::Fp8BlockPath`).

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::runtime::{Fp8BlockPath, Runtime};
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

pub use super::fp8::BlockSize;
use super::fp8::{decode, encode, E4M3_MAX};

/// `per_token_group_quant_fp8`'s `eps` (fp8_utils.py L236 at 0.8.5): a group's absmax is at
/// least this, so an all-zero group gets a tiny positive scale, not 0.
pub const GROUP_EPS: f32 = 1e-10;

/// Which release's block-wise fp8 linear runs (a field of `profile::vllm::Release`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8BlockEra {
    /// 0.8.5: `apply_w8a8_block_fp8_linear` (utils/fp8_utils.py L33-81); CUTLASS's blockwise
    /// GEMM on Hopper takes stream-K when k > 3n.
    V0_8,
    /// 0.11.0: the same function (utils/fp8_utils.py L118-184), on Hopper padding the input
    /// by `4 - m % 4` rows first (L157-166) and the weight scales made `[kb, nb]` contiguous
    /// after loading (`maybe_post_process_fp8_weight_block`, L904-925).
    V0_11,
    /// 0.15.1 and 0.19.0: `W8A8BlockFp8LinearOp` (utils/fp8_utils.py L350-593 at 0.19.0,
    /// L351-600 at 0.15.1): quantize with column-major scales, then on Hopper
    /// `padded_cutlass` (L114-149), which pads only a token count that is not a multiple of
    /// 4; the scales stay as stored (`maybe_post_process_fp8_weight_block` runs for DeepGEMM
    /// only, fp8.py L438-439 at 0.19.0, L1604-1629 at 0.15.1).
    V0_15,
    /// 0.21.0-0.23.0 on Hopper: DeepGEMM vendored and on (`VLLM_USE_DEEP_GEMM`, E8M0 too), so
    /// every linear with a bf16 output, `N % 64 == 0` and `K % 128 == 0` runs
    /// `FlashInferFp8DeepGEMMDynamicBlockScaledKernel` (FlashInfer's SM90 block GEMM below
    /// 32 tokens, vLLM's quantization and DeepGEMM's `fp8_gemm_nt` from 32); the others 0.19's
    /// `padded_cutlass` (0.23's `dynamic_padded_cutlass` allocates alike).
    /// docs/reading/vllm-fp8-block-deepgemm.md §1-2.
    V0_21,
    /// 0.24.0-0.33.0: as 0.21, the CUTLASS fallback without padding copies.
    V0_24,
}

impl Fp8BlockEra {
    /// The allocations' form on a GPU: Hopper takes CUTLASS (`cutlass_block_fp8_supported`,
    /// 9.x), Ada Triton with row-major scales (the same bytes, nothing padded); from 0.21
    /// Hopper takes DeepGEMM where a linear is aligned (off Hopper 0.21 on is refused before).
    pub fn path(self, hopper: bool) -> Fp8BlockPath {
        match (self, hopper) {
            (Fp8BlockEra::V0_8, _) | (Fp8BlockEra::V0_11, false) => Fp8BlockPath::Plain,
            (Fp8BlockEra::V0_11, true) => Fp8BlockPath::PadAlways,
            (Fp8BlockEra::V0_15, pad_to_four) => Fp8BlockPath::Op { pad_to_four },
            (Fp8BlockEra::V0_21, _) => Fp8BlockPath::DeepGemm {
                fallback_pads: true,
            },
            (Fp8BlockEra::V0_24, _) => Fp8BlockPath::DeepGemm {
                fallback_pads: false,
            },
        }
    }

    /// 0.21 on (DeepGEMM).
    pub fn deep_gemm(self) -> bool {
        matches!(self, Fp8BlockEra::V0_21 | Fp8BlockEra::V0_24)
    }
}

/// Whether a linear of `n` outputs over `k` inputs runs the dynamic FlashInfer/DeepGEMM kernel
/// under 0.21 on: a bf16 output, `N % 64 == 0`, `K % 128 == 0` (`FlashInferFp8DeepGEMM
/// DynamicBlockScaledKernel.can_implement`: 0.21.0 kernels/linear/scaled_mm/flashinfer.py
/// L81-124, deep_gemm.py L32-82).
pub fn deep_gemm_eligible(act: DType, n: usize, k: usize) -> bool {
    act == DType::BF16 && n.is_multiple_of(64) && k.is_multiple_of(128)
}

/// DeepGEMM's E8M0 scale (`_ceil_to_ue8m0`, 0.21.0 utils/deep_gemm.py L486-487; the CUDA
/// kernel's `SCALE_UE8M0`): the scale `amax / 448` rounded up to a power of two.
pub fn ue8m0_scale(amax: f32) -> f32 {
    let s = amax.max(GROUP_EPS) / E4M3_MAX;
    2f32.powi(s.log2().ceil() as i32)
}

/// `requant_weight_ue8m0_inplace` (0.21.0 utils/fp8_utils.py L932-989): each block's codes
/// dequantized with its scale, then requantized with `2^⌈log2(max(amax, 1e-4) / 448)⌉`
/// (`per_block_cast_to_fp8(…, use_ue8m0=True)`, utils/deep_gemm.py L503-523); codes and
/// scales replaced in place.
pub fn requant_ue8m0(codes: &mut [u8], scales: &mut [f32], n: usize, k: usize, block: BlockSize) {
    let kb = k.div_ceil(block.k);
    for (bi, s) in scales.iter_mut().enumerate() {
        let (br, bc) = (bi / kb, bi % kb);
        let rows = br * block.n..((br + 1) * block.n).min(n);
        let cols = bc * block.k..((bc + 1) * block.k).min(k);
        let mut amax = 0f32;
        for r in rows.clone() {
            for c in cols.clone() {
                amax = amax.max((decode(codes[r * k + c]) * *s).abs());
            }
        }
        let s2 = 2f32.powi((amax.max(1e-4) / E4M3_MAX).log2().ceil() as i32);
        for r in rows.clone() {
            for c in cols.clone() {
                let w = decode(codes[r * k + c]) * *s;
                codes[r * k + c] = encode(w * (1.0 / s2));
            }
        }
        *s = s2;
    }
}

/// One group of `per_token_group_quant_fp8` (the Triton kernel `_per_token_group_quant_fp8`,
/// fp8_utils.py L133-176 at 0.8.5): `s = max(max|y|, eps) / 448`, each code
/// `clamp(y / s, -448, 448)` cast to float8_e4m3fn. Returns `s`. The kernel divides in f32
/// as Triton lowers `/` (`div.full.f32`, within 2 ulp); the host divides exactly, so a value
/// that lands within an ulp of a rounding midpoint could take the other code.
// min/max, not `clamp`: a NaN becomes 448 as with PTX's min/max (which `tl.clamp` without
// NaN propagation lowers to, like the per-tensor kernel's fminf/fmaxf), not a NaN code.
#[allow(clippy::manual_clamp)]
pub fn quantize_group(y: &[f32], codes: &mut [u8]) -> f32 {
    let amax = y.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(GROUP_EPS);
    let s = amax / E4M3_MAX;
    for (c, &v) in codes.iter_mut().zip(y) {
        *c = encode((v / s).min(E4M3_MAX).max(-E4M3_MAX));
    }
    s
}

/// `per_token_group_quant_fp8(x [m, k], group)`: the codes `[m, k]` and the scales, row-major
/// `[m, k / group]` (the GPU's column-major copy holds the same values).
pub fn per_token_group_quant(x: &[f32], k: usize, group: usize) -> (Vec<u8>, Vec<f32>) {
    per_token_group_quant_as(x, k, group, false)
}

/// `per_token_group_quant`, with `use_ue8m0` each group's scale rounded up to a power of two
/// (`ue8m0_scale`; vLLM's `per_token_group_quant.cu` `ComputeGroupScale` with `SCALE_UE8M0`),
/// as DeepGEMM's branch quantizes from 0.21.
#[allow(clippy::manual_clamp)]
pub fn per_token_group_quant_as(
    x: &[f32],
    k: usize,
    group: usize,
    ue8m0: bool,
) -> (Vec<u8>, Vec<f32>) {
    let mut codes = vec![0u8; x.len()];
    let scales = x
        .chunks(group)
        .zip(codes.chunks_mut(group))
        .map(|(y, c)| {
            if !ue8m0 {
                return quantize_group(y, c);
            }
            let s = ue8m0_scale(y.iter().fold(0.0f32, |m, v| m.max(v.abs())));
            for (c, &v) in c.iter_mut().zip(y) {
                *c = encode((v / s).min(E4M3_MAX).max(-E4M3_MAX));
            }
            s
        })
        .collect();
    debug_assert!(k.is_multiple_of(group));
    (codes, scales)
}

/// A weight `[n, k]` quantized as the published block-wise checkpoints are (DeepSeek-V3's
/// and Qwen3-FP8's): per block, `scale = max|w| / 448` (at least `GROUP_EPS / 448`, so an
/// all-zero block keeps a positive scale), codes `clamp(w / scale)` in e4m3; returns the
/// codes and the `weight_scale_inv` grid (the dequantization multipliers, row-major
/// `[ceil(n / bn), ceil(k / bk)]`). Partial blocks at the edges take what is there.
#[allow(clippy::manual_clamp)]
pub fn quantize_weight(w: &[f32], n: usize, k: usize, block: BlockSize) -> (Vec<u8>, Vec<f32>) {
    let [nb, kb] = block.grid(n, k);
    let mut scales = vec![0f32; nb * kb];
    for (r, row) in w.chunks(k).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            let s = &mut scales[(r / block.n) * kb + c / block.k];
            *s = s.max(v.abs());
        }
    }
    for s in &mut scales {
        *s = s.max(GROUP_EPS) / E4M3_MAX;
    }
    let codes = w
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let s = scales[(i / k / block.n) * kb + (i % k) / block.k];
            encode((v / s).min(E4M3_MAX).max(-E4M3_MAX))
        })
        .collect();
    (codes, scales)
}

/// Rows `rows` of an `[n, k]` block-quantized weight as values: each code decoded and
/// multiplied by its block's `weight_scale_inv` in f32 (what the GEMM's `b_s` multiplies).
pub fn dequantize_rows(
    codes: &[u8],
    scales: &[f32],
    k: usize,
    block: BlockSize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let kb = k.div_ceil(block.k);
    for (i, r) in rows.enumerate() {
        let srow = &scales[(r / block.n) * kb..(r / block.n + 1) * kb];
        for (c, (o, &code)) in out[i * k..(i + 1) * k]
            .iter_mut()
            .zip(&codes[r * k..(r + 1) * k])
            .enumerate()
        {
            *o = decode(code) * srow[c / block.k];
        }
    }
}

/// A block-wise checkpoint's `weight_scale_inv` values: each a dequantization multiplier, so
/// one that is not finite and positive would make its block's weights NaN, infinite or zero
/// (vLLM loads it as it is); refused naming the file, the tensor and the element (the
/// block, counted row-major).
pub fn check_block_scales(file: &std::path::Path, tensor: &str, values: &[f32]) -> Result<()> {
    match values.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
        None => Ok(()),
        Some(i) => Err(Error::model(
            file,
            format!(
                "tensor {tensor} holds {} at element {i}, expected finite scales above 0",
                values[i]
            ),
        )),
    }
}

/// A linear layer under vLLM 0.8.5's `Fp8LinearMethod` with `block_quant`: after
/// `process_weights_after_loading` (fp8.py L306-323, CUDA: the same storage re-wrapped as
/// plain `Parameter`s, nothing allocated or copied) it holds what the checkpoint stored.
pub struct Fp8BlockLinear {
    /// F8E4M3 `[n, k]`.
    pub qweight: Tensor,
    /// F32 `[ceil(n / bn), ceil(k / bk)]`, the shards' grids stacked along the rows.
    pub scale_inv: Tensor,
    pub block: BlockSize,
    pub out_features: usize,
    pub in_features: usize,
    /// `scale_inv` holds the grid transposed, `[ceil(k / bk), ceil(n / bn)]` (0.11.0 on
    /// Hopper after loading).
    pub scales_transposed: bool,
    /// The model's activation dtype (DeepGEMM's kernel takes a bf16 output only).
    pub act: DType,
    /// The codes and scales were requantized to power-of-two block scales (0.21 on, DeepGEMM).
    pub ue8m0: bool,
}

impl Fp8BlockLinear {
    pub fn weight_bytes(&self) -> u64 {
        self.qweight.nbytes() + self.scale_inv.nbytes()
    }

    /// `process_weights_after_loading` for a block-wise layer, as the runtime's path says:
    /// 0.11.0 on Hopper makes the scales row-major for CUTLASS,
    /// `Parameter(weight_scale.data.T.contiguous())` (`maybe_post_process_fp8_weight_block`,
    /// utils/fp8_utils.py L921-925): a new `[kb, nb]` grid, then the stored one freed as the
    /// parameter is replaced. Elsewhere both are re-wrapped as they are (0.8.5 fp8.py
    /// L306-323; 0.15.1 and 0.19.0 `replace_parameter` of the same data, 0.19.0 fp8.py
    /// L398-406).
    pub fn after_loading(&mut self, rt: &Runtime) -> Result<()> {
        if let Fp8BlockPath::DeepGemm { .. } = rt.fp8_block_path() {
            // `deepgemm_post_process_fp8_weight_block` (0.21.0 kernels/linear/scaled_mm/
            // deep_gemm.py L84-107): the codes and scales requantized to power-of-two block
            // scales in place (no new persistent tensor; the f32 transients of the requant
            // are load-time only and not modelled), the scale grid kept as stored on SM90.
            let (n, k) = (self.out_features, self.in_features);
            if rt.backend() == Backend::Cpu
                && deep_gemm_eligible(self.act, n, k)
                && !self.scales_transposed
                && !self.ue8m0
            {
                let mut scales = self.host_scales().into_owned();
                requant_ue8m0(self.qweight.u8_mut(), &mut scales, n, k, self.block);
                self.scale_inv.f32_mut().copy_from_slice(&scales);
            }
            self.ue8m0 = deep_gemm_eligible(self.act, n, k);
            return Ok(());
        }
        if rt.fp8_block_path() != Fp8BlockPath::PadAlways || self.scales_transposed {
            return Ok(());
        }
        let [nb, kb] = self.block.grid(self.out_features, self.in_features);
        rt.set_op("fp8.weight_scale_transpose");
        let name = self
            .scale_inv
            .name
            .replace("weight_scale_inv", "weight_scale");
        let mut t = rt.tensor(name, Category::Weight, &[kb, nb], DType::F32)?;
        if rt.backend() == Backend::Cpu {
            let (src, dst) = (self.scale_inv.f32(), t.f32_mut());
            for r in 0..nb {
                for c in 0..kb {
                    dst[c * nb + r] = src[r * kb + c];
                }
            }
        }
        drop(std::mem::replace(&mut self.scale_inv, t));
        self.scales_transposed = true;
        Ok(())
    }

    /// The 16-bit copy of this layer's weight that MLA keeps after loading (W_UK and W_UV are
    /// views of it; docs/reading/vllm-mla.md §4), with the transients that make it, as the
    /// runtime's path says:
    /// - 0.11.0 (`PadAlways`, `Plain`): `get_and_maybe_dequant_weights` runs the layer on an
    ///   identity (v1/attention/backends/mla/common.py L996-1008): `torch.eye(k)` in `act`,
    ///   the block-wise linear's forward on it (on Hopper the input padded by 4 rows: its
    ///   output `[k + 4, n]`, sliced, keeps the padded storage), then `del eye`. The output
    ///   is kept.
    /// - 0.15.1, 0.19.0 (`Op`): `scaled_dequantize` (quantization/utils/quant_utils.py
    ///   L303-314 at 0.15.1, L320-332 at 0.19.0): `group_broadcast` expands the grid along
    ///   the rows (a copy `[n, kb]` f32) then the columns (a copy `[n, k]` f32, the first
    ///   freed as it is rebound), the codes `.to(float32)` (`[n, k]`), their product with the
    ///   expanded scales (`[n, k]` f32, the codes' copy freed), `.to(act)` (`[n, k]`, kept;
    ///   the product freed), and the expanded scales die as the function returns.
    /// - 0.21.0 on (`DeepGemm`): DeepGEMM is used, so `get_and_maybe_dequant_weights` takes the
    ///   identity path again (quantization/utils/quant_utils.py 0.21.0 L363-418, 0.33.0
    ///   L513-575): `torch.eye(k)` in `act`, the layer's own forward on it (this release's
    ///   block-wise linear: DeepGEMM's `fp8_gemm_nt` for the 512 rows), its output `[k, n]`
    ///   kept, then `eye` dies (docs/reading/vllm-fp8-block-deepgemm.md §5).
    pub fn mla_dequantized(&self, rt: &Runtime, act: DType) -> Result<Tensor> {
        rt.check_cancel()?;
        let (n, k) = (self.out_features, self.in_features);
        let base = self.qweight.name.trim_end_matches(".weight").to_string();
        let t = |nm: &str, shape: &[usize], dt: DType| {
            rt.tensor_for_overwrite(format!("{base}.{nm}"), Category::Weight, shape, dt)
        };
        rt.set_op("mla.kv_b_proj_dequantize");
        let kept = match rt.fp8_block_path() {
            Fp8BlockPath::Op { .. } => {
                let kb = k.div_ceil(self.block.k);
                let rows = t("scale_rows_expanded", &[n, kb], DType::F32)?;
                let expanded = t("scale_expanded", &[n, k], DType::F32)?;
                drop(rows);
                let codes = t("weight_f32", &[n, k], DType::F32)?;
                let product = t("weight_dequantized_f32", &[n, k], DType::F32)?;
                drop(codes);
                let kept = t("weight_dequantized", &[n, k], act)?;
                drop(product);
                drop(expanded);
                kept
            }
            Fp8BlockPath::DeepGemm { .. } if deep_gemm_eligible(act, n, k) && k >= 32 => {
                // `forward_deep_gemm`'s sequence over the k identity rows (a multiple of 4:
                // no TMA-aligned scale copy), charged to the weights as the 0.11 path is.
                let kb = k.div_ceil(self.block.k);
                let eye = t("eye", &[k, k], act)?;
                let placeholder = t("eye_input_scale_placeholder", &[1], act)?;
                let codes = t("eye_qinput", &[k, k], DType::F8E4M3)?;
                let scales = t("eye_x_scale", &[k, kb], DType::F32)?;
                let kept = t("weight_dequantized", &[k, n], act)?;
                if !k.is_multiple_of(4) {
                    let a4 = k.next_multiple_of(4);
                    drop(t(
                        "eye_x_scale_tma_aligned",
                        &[k + (kb - 1) * a4],
                        DType::F32,
                    )?);
                }
                drop(codes);
                drop(scales);
                drop(placeholder);
                drop(eye);
                kept
            }
            path => {
                let eye = t("eye", &[k, k], act)?;
                let pad = if path == Fp8BlockPath::PadAlways {
                    4 - k % 4
                } else {
                    0
                };
                let padded = if pad > 0 {
                    Some(t("eye_padded", &[k + pad, k], act)?)
                } else {
                    None
                };
                let codes = t("eye_qinput", &[k + pad, k], DType::F8E4M3)?;
                let scales = t("eye_x_scale", &[k + pad, k / self.block.k], DType::F32)?;
                let kept = t("weight_dequantized", &[k + pad, n], act)?;
                drop(padded);
                drop(codes);
                drop(scales);
                drop(eye);
                kept
            }
        };
        Ok(kept)
    }

    /// The scale grid row-major `[nb, kb]` on the host, as the checkpoint stores it.
    fn host_scales(&self) -> std::borrow::Cow<'_, [f32]> {
        let s = self.scale_inv.f32();
        if !self.scales_transposed {
            return std::borrow::Cow::Borrowed(s);
        }
        let [nb, kb] = self.block.grid(self.out_features, self.in_features);
        let mut out = vec![0f32; nb * kb];
        for r in 0..nb {
            for c in 0..kb {
                out[r * kb + c] = s[c * nb + r];
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// `apply_w8a8_block_fp8_linear` (fp8_utils.py L33-81 at 0.8.5), `x [m, k] → [m, n]` in
    /// `act`: `per_token_group_quant_fp8` allocates the fp8 input `[m, k]` (`empty_like`,
    /// L263) then its f32 scales, `k / bk` per token (column-major on the CUTLASS path,
    /// L266-269, row-major on Triton's, L271-272: the same bytes); the GEMM allocates the
    /// output (`cutlass_scaled_mm`, _custom_ops.py L566, or `w8a8_block_fp8_matmul`'s
    /// `A.new_empty`, fp8_utils.py L476); `.to(input.dtype)` and `.view` allocate nothing
    /// (no bias: refused before); the fp8 input and then its scales are freed as the
    /// function returns (frame locals in order). The V1 releases differ as the runtime's
    /// `Fp8BlockPath` says (padding on Hopper, the order of the frees). `rows`: the output
    /// features of each shard, written as contiguous blocks as `FusedLinear` lays them out.
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
        let bk = self.block.k;
        if !k.is_multiple_of(bk) {
            return Err(Error::Request(format!(
                "{name}: per_token_group_quant_fp8 needs the input's {k} features divisible by block_k = {bk} (fp8_utils.py L254-256 at 0.8.5)"
            )));
        }
        if rt.backend() == Backend::Cuda {
            return Err(cuda_refused());
        }
        let mut path = rt.fp8_block_path();
        let act_t = |nm: &str, shape: &[usize], dt: DType| {
            rt.tensor(format!("{name}.{nm}"), Category::Activation, shape, dt)
        };
        if let Fp8BlockPath::DeepGemm { fallback_pads } = path {
            if deep_gemm_eligible(act, n, k) {
                return self.forward_deep_gemm(rt, x, name, act, rows);
            }
            // CUTLASS's kernel for the others: 0.21-0.23 pad as 0.19 did, 0.24 on not.
            path = Fp8BlockPath::Op {
                pad_to_four: fallback_pads,
            };
        }
        // 0.11.0 on Hopper: `F.pad(input_2d, (0, 0, 0, num_pad))` with `num_pad = 4 - m % 4`
        // (utils/fp8_utils.py L157-166): a new `[m + num_pad, k]` input in `act`, zeros below.
        let pad_rows = match path {
            Fp8BlockPath::PadAlways => 4 - m % 4,
            _ => 0,
        };
        let padded_input = if pad_rows > 0 {
            rt.set_op("fp8.pad");
            let mut t = act_t("padded_input", &[m + pad_rows, k], act)?;
            if rt.backend() == Backend::Cpu {
                t.f32_mut()[..m * k].copy_from_slice(x.f32());
            }
            Some(t)
        } else {
            None
        };
        let mq = m + pad_rows;
        rt.set_op("fp8.per_token_group_quant_fp8");
        let mut qinput = act_t("qinput", &[mq, k], DType::F8E4M3)?;
        let mut x_scale = act_t("x_scale", &[mq, k / bk], DType::F32)?;
        let mut xdq = Vec::new();
        if rt.backend() == Backend::Cpu {
            let (codes, scales) = per_token_group_quant(x.f32(), k, bk);
            xdq = codes
                .iter()
                .enumerate()
                .map(|(i, &c)| decode(c) * scales[i / bk])
                .collect();
            qinput.u8_mut()[..m * k].copy_from_slice(&codes);
            x_scale.f32_mut()[..scales.len()].copy_from_slice(&scales);
            // Padded rows are zeros: every code 0 at `eps / 448`.
            x_scale.f32_mut()[scales.len()..].fill(GROUP_EPS / E4M3_MAX);
        }
        // 0.15.1 / 0.19.0 `padded_cutlass` on Hopper: `torch.zeros` codes and `torch.ones`
        // scales (`[k / bk, m4]`, permuted) at the next multiple of 4, only when m is not one.
        let m4 = m.next_multiple_of(4);
        let pad_copies = if matches!(path, Fp8BlockPath::Op { pad_to_four: true }) && m4 > m {
            rt.set_op("fp8.padded_cutlass");
            Some((
                act_t("padded_qx", &[m4, k], DType::F8E4M3)?,
                act_t("padded_x_scale", &[m4, k / bk], DType::F32)?,
            ))
        } else {
            None
        };
        let out_rows = if pad_copies.is_some() { m4 } else { mq };
        rt.set_op("fp8.block_scaled_mm");
        let mut out = rt.tensor_for_overwrite(
            format!("{name}.out"),
            Category::Activation,
            &[out_rows, n],
            act,
        )?;
        if rt.backend() == Backend::Cpu {
            // Padded rows are zeros and are sliced away.
            self.host_product(rt, &xdq, rows, &mut out.f32_mut()[..m * n], act)?;
        }
        // `output[:m]` is a view: the padded rows' storage stays with it.
        if out_rows > m {
            out.data.shape = vec![m, n];
            if let crate::engine::tensor::Storage::F32(v) = &mut out.data.storage {
                v.truncate(m * n);
            }
        }
        match path {
            Fp8BlockPath::Plain => {
                drop(qinput);
                drop(x_scale);
            }
            Fp8BlockPath::PadAlways => {
                drop(padded_input);
                drop(qinput);
                drop(x_scale);
            }
            Fp8BlockPath::Op { .. } | Fp8BlockPath::DeepGemm { .. } => {
                drop(pad_copies);
                drop(x_scale);
                drop(qinput);
            }
        }
        Ok(out)
    }

    /// The host's product of the dequantized activations `xdq` (`[m, k]`) and this layer's
    /// weights into `out`: the activations as their codes times their group's scale, the
    /// weights as theirs times their block's, summed in f32 and rounded to `act` (CUTLASS's
    /// `Sm90AccFetch` epilogue, Triton's `accumulator.to(...)`, DeepGEMM's bf16 output). The
    /// kernels sum each block of codes first and scale the partial sum: the same value up to
    /// f32 rounding.
    fn host_product(
        &self,
        rt: &Runtime,
        xdq: &[f32],
        rows: &[usize],
        out: &mut [f32],
        act: DType,
    ) -> Result<()> {
        let k = self.in_features;
        let host_scales = self.host_scales();
        let (codes, scales) = (self.qweight.u8(), &host_scales[..]);
        let block = self.block;
        let decode_rows = |r: std::ops::Range<usize>, buf: &mut [f32]| {
            dequantize_rows(codes, scales, k, block, r, buf)
        };
        let m = xdq.len() / k;
        super::host_decoded_matmul(rt, xdq, (m, k), rows, out, decode_rows, |a| act.round(a))
    }

    /// `FlashInferFp8DeepGEMMDynamicBlockScaledKernel.apply_weights` (0.21.0 kernels/linear/
    /// scaled_mm/BlockScaledMMLinearKernel.py L97-141, flashinfer.py L225-309; the same to
    /// 0.33.0; docs/reading/vllm-fp8-block-deepgemm.md §2.3-2.4): a `[1]` placeholder for the
    /// absent input scale (one 512-byte block, alive across the call), then by the token count:
    /// - from 32 tokens, vLLM's `per_token_group_quant_fp8(…, column_major_scales=True,
    ///   use_ue8m0=True)`: the codes `[m, k]` and the scales (`[kb, m]` f32 storage, no TMA
    ///   padding), the output `[m, n]`, and inside DeepGEMM's `fp8_gemm_nt` a TMA-aligned copy
    ///   of the scales (`m + (kb − 1)·a4(m)` f32) only when `m % 4 != 0`; the codes then the
    ///   scales die as the closure returns;
    /// - below 32, FlashInfer's `fp8_blockscale_gemm_sm90` on the 16-bit input: the output and
    ///   its workspace `a4(M̂)·k + a32(m)·kb·4 + n·k + kb·nb·4` bytes (a whole fp8 copy of the
    ///   weight; `M̂` the most tokens any call below 32 has passed in this process, the
    ///   runner being cached), freed as it returns.
    fn forward_deep_gemm(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        act: DType,
        rows: &[usize],
    ) -> Result<Tensor> {
        let (m, k, n) = (x.rows(), x.cols(), self.out_features);
        let bk = self.block.k;
        let kb = k.div_ceil(bk);
        let a4 = |v: usize| v.next_multiple_of(4);
        let act_t = |nm: &str, shape: &[usize], dt: DType| {
            rt.tensor_for_overwrite(format!("{name}.{nm}"), Category::Activation, shape, dt)
        };
        rt.set_op("fp8.deep_gemm_placeholder");
        let placeholder = act_t("input_scale_placeholder", &[1], act)?;
        if m < 32 {
            if rt.backend() == Backend::Cpu {
                return Err(Error::Request(format!(
                    "{name}: FlashInfer's SM90 block GEMM below 32 tokens quantizes the 16-bit input itself (TRT-LLM's fp8CS1x128), whose rounding was not read; CPU compute runs 32 tokens or more under --vllm 0.21 on (dry runs any)"
                )));
            }
            rt.set_op("fp8.flashinfer_blockscale_gemm_sm90");
            let out = act_t("out", &[m, n], act)?;
            let m_hat = rt.note_fp8_flashinfer_rows(a4(m));
            let [nb, _] = self.block.grid(n, k);
            let a32 = m.next_multiple_of(32);
            let ws = m_hat * k + a32 * kb * 4 + n * k + kb * nb * 4;
            drop(act_t("flashinfer_workspace", &[ws], DType::U8)?);
            drop(placeholder);
            return Ok(out);
        }
        rt.set_op("fp8.per_token_group_quant_fp8");
        let mut qinput = act_t("qinput", &[m, k], DType::F8E4M3)?;
        let mut x_scale = act_t("x_scale", &[m, kb], DType::F32)?;
        let mut xdq = Vec::new();
        if rt.backend() == Backend::Cpu {
            let (codes, scales) = per_token_group_quant_as(x.f32(), k, bk, true);
            xdq = codes
                .iter()
                .enumerate()
                .map(|(i, &c)| decode(c) * scales[i / bk])
                .collect();
            qinput.u8_mut().copy_from_slice(&codes);
            x_scale.f32_mut().copy_from_slice(&scales);
        }
        rt.set_op("fp8.deep_gemm_fp8_gemm_nt");
        let mut out = act_t("out", &[m, n], act)?;
        if m % 4 != 0 {
            drop(act_t(
                "x_scale_tma_aligned",
                &[m + (kb - 1) * a4(m)],
                DType::F32,
            )?);
        }
        if rt.backend() == Backend::Cpu {
            // DeepGEMM sums in f32 and writes bf16.
            self.host_product(rt, &xdq, rows, out.f32_mut(), act)?;
        }
        drop(qinput);
        drop(x_scale);
        drop(placeholder);
        Ok(out)
    }
}

/// What vLLM refuses of a block-wise checkpoint's shapes, or what vramscope does not model,
/// for one linear under `era`: `parts` its output partitions (q, k, v; gate, up; or the
/// one), `k` its inputs; `hopper` when the GPU takes CUTLASS's path
/// (`cutlass_block_fp8_supported`, compute capability 9.x). `None` when it runs as modelled.
pub fn layer_problem(
    block: BlockSize,
    parts: &[usize],
    k: usize,
    (hopper, era): (bool, Fp8BlockEra),
) -> Option<String> {
    let n: usize = parts.iter().sum();
    if parts.len() > 1 {
        // create_weights, "Required by column parallel or enabling merged weights"; the V1
        // releases let a merged layer's last partition end in a partial block when it is
        // not split over ranks (`validate_fp8_block_shape`, 0.11.0 utils/fp8_utils.py
        // L768-782, 0.19.0 L1458-1473: MLA's fused q_a / kv_a projection, 1536 + 576).
        let checked = match era {
            Fp8BlockEra::V0_8 => parts,
            _ => &parts[..parts.len() - 1],
        };
        if let Some(p) = checked.iter().find(|&&p| !p.is_multiple_of(block.n)) {
            return Some(format!(
                "vLLM refuses it: \"Weight output_partition_size = {p} is not divisible by weight quantization block_n = {}.\" ({})",
                block.n,
                match era {
                    Fp8BlockEra::V0_8 => "fp8.py L221-229 at 0.8.5",
                    _ => "validate_fp8_block_shape, utils/fp8_utils.py L1425-1473 at 0.19.0, L750-782 at 0.11.0",
                }
            ));
        }
    }
    if !k.is_multiple_of(block.k) {
        return Some(format!(
            "its {k} inputs are not divisible by block_k = {}: per_token_group_quant_fp8 asserts they are (fp8_utils.py L254-256 at 0.8.5), so vLLM fails in its profile run",
            block.k
        ));
    }
    if era != Fp8BlockEra::V0_8 {
        if block != (BlockSize { n: 128, k: 128 }) {
            return Some(format!(
                "the V1 releases' block-wise linear is modelled for [128, 128] blocks only (CUTLASS's blockwise GEMM is built for them, and 0.19.0 keys the layer as kFp8Static128BlockSym, fp8.py L298-301); [{}, {}] is not modelled",
                block.n, block.k
            ));
        }
        // `cutlass_scaled_mm` (_custom_ops.py L657-664 at 0.11.0, L836-844 at 0.19.0) sends
        // a weight whose sides are not multiples of 16 to `triton_scaled_mm`, not modelled.
        if hopper && !(n.is_multiple_of(16) && k.is_multiple_of(16)) {
            return Some(format!(
                "on Hopper a weight of {n} × {k} (not multiples of 16) goes to triton_scaled_mm (_custom_ops.py L836-844 at 0.19.0), not modelled"
            ));
        }
        return None;
    }
    // `shape_supported_by_cutlass` (fp8_utils.py L47-48) tests 128 whatever the block size.
    if hopper && n.is_multiple_of(128) && k.is_multiple_of(128) {
        if block != (BlockSize { n: 128, k: 128 }) {
            return Some(format!(
                "on Hopper this shape takes CUTLASS's blockwise GEMM, built for [128, 128] blocks only (its TORCH_CHECK on the scales' shape fails for [{}, {}])",
                block.n, block.k
            ));
        }
        if k > 3 * n {
            return Some(format!(
                "on Hopper CUTLASS's blockwise GEMM takes its stream-K scheduler when k > 3n ({k} > 3 × {n}), whose workspace vramscope does not model yet"
            ));
        }
    }
    None
}

/// `layer_problem` over a model's decoder linears (`(name, parts, k)` each), as one message
/// naming the first layer vLLM refuses or vramscope does not model.
pub fn model_problem(
    block: BlockSize,
    linears: &[(&str, Vec<usize>, usize)],
    gpu: (bool, Fp8BlockEra),
) -> Option<String> {
    linears.iter().find_map(|(name, parts, k)| {
        layer_problem(block, parts, *k, gpu).map(|p| {
            format!(
                "block-wise fp8 with weight_block_size [{}, {}]: {name} (outputs {parts:?}, {k} inputs): {p}",
                block.n, block.k
            )
        })
    })
}

/// Whether vLLM 0.8.5 runs block-wise fp8 on a GPU of this architecture as vramscope models
/// it. Block quantization turns fp8 Marlin off (fp8.py L182-185), so below compute capability
/// 8.9 there is no kernel with fp8 tensor cores for it; Hopper takes CUTLASS, Ada Triton
/// (`cutlass_scaled_mm_supports_block_fp8` holds on 9.x only); both allocate alike.
pub fn check_gpu(arch: &str, gpu: &str) -> Result<()> {
    let why = match arch {
        "Ada" | "Hopper" => return Ok(()),
        "Blackwell" => "which blockwise GEMM vLLM 0.8.5 takes on compute capability 10.0 was not checked, so it is not modelled yet",
        "Ampere" => "compute capability 8.0/8.6 has no fp8 tensor cores, and vLLM 0.8.5 turns fp8 Marlin off for block-wise checkpoints (fp8.py L182-185), leaving Triton's fp8 matmul, which needs 8.9",
        "Turing" => "vLLM refuses fp8 below compute capability 8.0 (Fp8Config.get_min_capability, fp8.py L93-95 at 0.8.5)",
        _ => "its compute capability is not known to vramscope",
    };
    Err(Error::Request(format!(
        "block-wise fp8 on {gpu} ({arch}): {why}; use a Hopper or Ada preset (h100-80gb, h200-141gb, l40s, l4, rtx4090)"
    )))
}

/// The releases whose block-wise fp8 vramscope reproduces: the release's `fp8_block` era
/// (`era`), 0.8.5 asked as `--vllm 0.8` or `0.8.5` (0.9 shares the 0.8 row for the profile
/// run, but its block-wise linear was not checked against 0.8.5's; the V1 0.10 row has none
/// read), and the V1
/// releases 0.11, 0.15, 0.19 and 0.21 on (DeepGEMM on Hopper). 0.6.3 to 0.6.5 have no
/// `weight_block_size`; 0.6.6 (which shares the 0.6.5 row) reads it but runs Triton only and
/// makes no device identity; 0.7 is not read.
pub fn check_release(era: Option<Fp8BlockEra>, release: &str, asked: &str) -> Result<Fp8BlockEra> {
    match era {
        Some(Fp8BlockEra::V0_8) if !matches!(asked, "0.8" | "0.8.5") => {}
        Some(e) => return Ok(e),
        None => {}
    }
    Err(Error::Request(format!(
        "block-wise fp8 (weight_block_size) with --vllm {asked} (the {release} row): vramscope reproduces it as vLLM 0.8.5, 0.11.0, 0.15.1, 0.19.0 and 0.21.0-0.33.0 load and run it, use --vllm 0.8, 0.11, 0.15, 0.19 or 0.21 on (0.6.3 to 0.6.5 cannot load it; 0.6.6, 0.7, 0.9 and 0.10 read it but are not modelled)"
    )))
}

/// The refusal on a CUDA device: the block-wise kernels are not written yet.
pub fn cuda_refused() -> Error {
    Error::Request(
        "a block-wise fp8 checkpoint on a CUDA device: vramscope's GPU kernels for it (per_token_group_quant_fp8, the blockwise fp8 GEMM) are not written yet; plan it on a simulated GPU (--device sim:h100-80gb:dry, or :compute for the math)".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp8::tests::{runtime, trace};

    const B128: BlockSize = BlockSize { n: 128, k: 128 };

    #[test]
    fn a_group_is_scaled_so_its_absmax_is_448() {
        let y = [0.5f32, -2.0, 1.0, 0.0];
        let mut c = [0u8; 4];
        let s = quantize_group(&y, &mut c);
        assert_eq!(s, 2.0 / 448.0);
        // -2 / (2 / 448) = -448 exactly: e4m3's most negative finite code.
        assert_eq!(c[1], 0xFE);
        assert_eq!(c[3], 0x00);
        // All zero: eps / 448, and every code 0 (not the per-tensor kernel's NaN → 448).
        let s = quantize_group(&[0.0; 3], &mut c[..3]);
        assert_eq!(s, GROUP_EPS / 448.0);
        assert_eq!(&c[..3], &[0, 0, 0]);
    }

    #[test]
    fn each_token_and_group_gets_its_own_scale() {
        // Two tokens of two groups of 2.
        let x = [1.0f32, -4.0, 0.5, 0.25, 8.0, 2.0, -1.0, 3.0];
        let (codes, s) = per_token_group_quant(&x, 4, 2);
        assert_eq!(s, vec![4.0 / 448.0, 0.5 / 448.0, 8.0 / 448.0, 3.0 / 448.0]);
        assert_eq!(codes[1], 0xFE);
        assert_eq!(codes[2], 0x7E);
        assert_eq!(codes[4], 0x7E);
    }

    #[test]
    fn weight_blocks_use_their_own_absmax_with_partial_edge_blocks() {
        // [3, 5] at blocks of [2, 4]: a 2 × 2 grid, the last row and column partial.
        let w: Vec<f32> = (0..15).map(|i| (i as f32 - 7.0) / 4.0).collect();
        let blk = BlockSize { n: 2, k: 4 };
        let (codes, s) = quantize_weight(&w, 3, 5, blk);
        assert_eq!(blk.grid(3, 5), [2, 2]);
        // Block (0,0): rows 0-1, cols 0-3 → |w| of 0,1,2,3,5,6,7,8 → max 7/4.
        assert_eq!(s[0], 1.75 / 448.0);
        // Block (0,1): col 4 of rows 0-1 → (4-7)/4, (9-7)/4 → max 0.75.
        assert_eq!(s[1], 0.75 / 448.0);
        // Block (1,0): row 2 cols 0-3 → (10..13-7)/4 → max 1.5; block (1,1): (14-7)/4.
        assert_eq!(s[2], 1.5 / 448.0);
        assert_eq!(s[3], 1.75 / 448.0);
        let mut back = vec![0f32; 15];
        dequantize_rows(&codes, &s, 5, blk, 0..3, &mut back);
        for (i, (a, b)) in back.iter().zip(&w).enumerate() {
            assert_eq!(*a, decode(codes[i]) * s[(i / 5 / 2) * 2 + (i % 5) / 4]);
            assert!((a - b).abs() <= b.abs() / 16.0 + 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn vllms_shape_rules_for_block_wise_layers() {
        // Merged: every partition divisible by block_n.
        assert!(
            layer_problem(B128, &[4096, 1024, 1024], 4096, (true, Fp8BlockEra::V0_8)).is_none()
        );
        let p = layer_problem(B128, &[128, 64, 64], 128, (false, Fp8BlockEra::V0_8)).unwrap();
        assert!(p.contains("Weight output_partition_size = 64 is not divisible by weight quantization block_n = 128."), "{p}");
        // A single layer may end in a partial block; its inputs may not.
        assert!(layer_problem(B128, &[200], 256, (false, Fp8BlockEra::V0_8)).is_none());
        let p = layer_problem(B128, &[256], 200, (false, Fp8BlockEra::V0_8)).unwrap();
        assert!(
            p.contains("200 inputs are not divisible by block_k = 128"),
            "{p}"
        );
        // Hopper's CUTLASS path: [128, 128] blocks only, no stream-K.
        let p = layer_problem(
            BlockSize { n: 64, k: 64 },
            &[256],
            256,
            (true, Fp8BlockEra::V0_8),
        )
        .unwrap();
        assert!(p.contains("[128, 128] blocks only"), "{p}");
        assert!(layer_problem(
            BlockSize { n: 64, k: 64 },
            &[256],
            256,
            (false, Fp8BlockEra::V0_8)
        )
        .is_none());
        let p = layer_problem(B128, &[4096], 14336, (true, Fp8BlockEra::V0_8)).unwrap();
        assert!(p.contains("stream-K"), "{p}");
        // Qwen3-8B's down_proj: k = 3n exactly, the persistent scheduler.
        assert!(layer_problem(B128, &[4096], 12288, (true, Fp8BlockEra::V0_8)).is_none());
    }

    #[test]
    fn the_forward_allocates_codes_group_scales_and_output_then_frees_the_two() {
        let rt = runtime("dry");
        let w = |name: &str, shape: &[usize], dtype| {
            rt.tensor(name, Category::Weight, shape, dtype).unwrap()
        };
        let lin = Fp8BlockLinear {
            qweight: w("o_proj.weight", &[4096, 4096], DType::F8E4M3),
            scale_inv: w("o_proj.weight_scale_inv", &[32, 32], DType::F32),
            block: B128,
            out_features: 4096,
            in_features: 4096,
            scales_transposed: false,
            act: DType::BF16,
            ue8m0: false,
        };
        assert_eq!(lin.weight_bytes(), 4096 * 4096 + 32 * 32 * 4);
        let x = rt
            .tensor("x", Category::Activation, &[2048, 4096], DType::BF16)
            .unwrap();
        let from = rt.event_count();
        let out = lin
            .forward(&rt, &x, "0.o_proj", DType::BF16, &[4096])
            .unwrap();
        assert_eq!(out.shape, vec![2048, 4096]);
        assert_eq!(
            trace(&rt, from),
            vec![
                ("alloc", "0.o_proj.qinput".into(), 2048 * 4096),
                ("alloc", "0.o_proj.x_scale".into(), 2048 * 32 * 4),
                ("alloc", "0.o_proj.out".into(), 2 * 2048 * 4096),
                ("free", "0.o_proj.qinput".into(), 2048 * 4096),
                ("free", "0.o_proj.x_scale".into(), 2048 * 32 * 4),
            ]
        );
    }

    #[test]
    fn host_forward_is_the_product_of_the_dequantized_codes() {
        let rt = runtime("compute");
        let (m, k, n) = (3, 256, 5);
        let blk = BlockSize { n: 2, k: 128 };
        let (lin, codes, scales, x, xv) = seeded_linear(&rt, (m, k, n), blk);
        let out = lin.forward(&rt, &x, "w", DType::BF16, &[n]).unwrap();
        let (xq, xs) = per_token_group_quant(&xv, k, 128);
        for r in 0..m {
            for c in 0..n {
                let terms: Vec<f64> = (0..k)
                    .map(|i| {
                        let a = decode(xq[r * k + i]) as f64 * xs[r * 2 + i / 128] as f64;
                        let b =
                            decode(codes[c * k + i]) as f64 * scales[(c / 2) * 2 + i / 128] as f64;
                        a * b
                    })
                    .collect();
                let acc: f64 = terms.iter().sum();
                let size: f64 = terms.iter().map(|t| t.abs()).sum();
                let got = out.f32()[r * n + c];
                // bf16 rounding (half an ulp: at most 2^-8 relative, 8 significant bits) of an
                // f32 sum of 256 products of f32-rounded factors (each within 2^-23).
                assert!(
                    (got as f64 - acc).abs() <= acc.abs() / 256.0 + size * 1e-5,
                    "{got} vs {acc}"
                );
                assert_eq!(got, DType::BF16.round(got));
            }
        }
    }

    /// A bf16 linear of `n` outputs over `k` inputs quantized in blocks `blk` from seeded
    /// weights, and a seeded bf16 input of `m` rows: the layer, its codes and scales, the input
    /// and its values.
    fn seeded_linear(
        rt: &Runtime,
        (m, k, n): (usize, usize, usize),
        blk: BlockSize,
    ) -> (Fp8BlockLinear, Vec<u8>, Vec<f32>, Tensor, Vec<f32>) {
        let wv: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
            .collect();
        let xv: Vec<f32> = (0..m * k)
            .map(|i| DType::BF16.round(((i * 53 % 97) as f32 - 48.0) / 16.0))
            .collect();
        let (codes, scales) = quantize_weight(&wv, n, k, blk);
        let mut qweight = rt
            .tensor("w.weight", Category::Weight, &[n, k], DType::F8E4M3)
            .unwrap();
        qweight.u8_mut().copy_from_slice(&codes);
        let grid = blk.grid(n, k);
        let scale_inv = rt
            .tensor_with_values(
                "w.weight_scale_inv",
                Category::Weight,
                &grid,
                DType::F32,
                scales.clone(),
            )
            .unwrap();
        let lin = Fp8BlockLinear {
            qweight,
            scale_inv,
            block: blk,
            out_features: n,
            in_features: k,
            scales_transposed: false,
            act: DType::BF16,
            ue8m0: false,
        };
        let x = rt
            .tensor_with_values("x", Category::Activation, &[m, k], DType::BF16, xv.clone())
            .unwrap();
        (lin, codes, scales, x, xv)
    }

    fn o_proj(rt: &Runtime) -> Fp8BlockLinear {
        let w = |name: &str, shape: &[usize], dtype| {
            rt.tensor(name, Category::Weight, shape, dtype).unwrap()
        };
        Fp8BlockLinear {
            qweight: w("o_proj.weight", &[512, 256], DType::F8E4M3),
            scale_inv: w("o_proj.weight_scale_inv", &[4, 2], DType::F32),
            block: B128,
            out_features: 512,
            in_features: 256,
            scales_transposed: false,
            act: DType::BF16,
            ue8m0: false,
        }
    }

    fn r(bytes: u64) -> u64 {
        bytes.div_ceil(512) * 512
    }

    fn forward_trace(path: Fp8BlockPath, m: usize) -> Vec<(&'static str, String, u64)> {
        let rt = runtime("dry");
        rt.set_fp8_block_path(path);
        let lin = o_proj(&rt);
        let x = rt
            .tensor("x", Category::Activation, &[m, 256], DType::BF16)
            .unwrap();
        let from = rt.event_count();
        let out = lin.forward(&rt, &x, "o", DType::BF16, &[512]).unwrap();
        assert_eq!(out.shape, vec![m, 512]);
        drop(out);
        trace(&rt, from)
    }

    /// 0.21 on, an aligned bf16 linear (o_proj: n 512, k 256): the placeholder's 512-byte
    /// block, the codes, the column-major scales `[kb, m]`, the output; DeepGEMM's TMA-aligned
    /// scale copy `m + (kb − 1)·a4(m)` f32 only off a multiple of 4; the codes, then the
    /// scales, then the placeholder die (flashinfer.py L225-309, BlockScaledMMLinearKernel.py
    /// L97-141 at 0.21.0). Below 32 tokens FlashInfer's SM90 GEMM: the output, then its
    /// workspace `a4(M̂)·k + a32(m)·kb·4 + n·k + kb·nb·4` freed at once, M̂ the most tokens a
    /// call below 32 has passed. A linear DeepGEMM does not take (an fp16 model) runs CUTLASS
    /// as 0.19 did under 0.21-0.23, without the padding copies from 0.24.
    #[test]
    fn v0_21_runs_deep_gemm_from_32_tokens_and_flashinfer_below() {
        let path = Fp8BlockPath::DeepGemm {
            fallback_pads: true,
        };
        for m in [2048u64, 2046] {
            let mut want = vec![
                ("alloc", "o.input_scale_placeholder".into(), 512),
                ("alloc", "o.qinput".into(), r(m * 256)),
                ("alloc", "o.x_scale".into(), r(m * 2 * 4)),
                ("alloc", "o.out".into(), r(2 * m * 512)),
            ];
            if m % 4 != 0 {
                let copy = r(4 * (m + m.next_multiple_of(4)));
                want.push(("alloc", "o.x_scale_tma_aligned".into(), copy));
                want.push(("free", "o.x_scale_tma_aligned".into(), copy));
            }
            want.extend([
                ("free", "o.qinput".into(), r(m * 256)),
                ("free", "o.x_scale".into(), r(m * 2 * 4)),
                ("free", "o.input_scale_placeholder".into(), 512),
                ("free", "o.out".into(), r(2 * m * 512)),
            ]);
            assert_eq!(forward_trace(path, m as usize), want, "{m}");
        }
        // Below 32: 24 then 8 tokens in one process keep M̂ = 24.
        let rt = runtime("dry");
        rt.set_fp8_block_path(path);
        let lin = o_proj(&rt);
        let ws = |m_hat: u64, m: u64| {
            m_hat * 256 + m.next_multiple_of(32) * 2 * 4 + 512 * 256 + 2 * 4 * 4
        };
        for (m, m_hat) in [(24u64, 24u64), (8, 24)] {
            let x = rt
                .tensor("x", Category::Activation, &[m as usize, 256], DType::BF16)
                .unwrap();
            let from = rt.event_count();
            drop(lin.forward(&rt, &x, "o", DType::BF16, &[512]).unwrap());
            assert_eq!(
                trace(&rt, from),
                vec![
                    ("alloc", "o.input_scale_placeholder".into(), 512),
                    ("alloc", "o.out".into(), r(2 * m * 512)),
                    ("alloc", "o.flashinfer_workspace".into(), r(ws(m_hat, m))),
                    ("free", "o.flashinfer_workspace".into(), r(ws(m_hat, m))),
                    ("free", "o.input_scale_placeholder".into(), 512),
                    ("free", "o.out".into(), r(2 * m * 512)),
                ],
                "{m}"
            );
        }
        assert_eq!(ws(24, 24), 6144 + 256 + 131_072 + 32);
        // An fp16 model's linear: CUTLASS, 0.19's order (scales freed first).
        let rt = runtime("dry");
        rt.set_fp8_block_path(Fp8BlockPath::DeepGemm {
            fallback_pads: false,
        });
        let lin = o_proj(&rt);
        let x = rt
            .tensor("x", Category::Activation, &[2046, 256], DType::F16)
            .unwrap();
        let from = rt.event_count();
        drop(lin.forward(&rt, &x, "o", DType::F16, &[512]).unwrap());
        let names: Vec<String> = trace(&rt, from)
            .into_iter()
            .map(|t| format!("{} {}", t.0, t.1))
            .collect();
        assert_eq!(
            names,
            [
                "alloc o.qinput",
                "alloc o.x_scale",
                "alloc o.out",
                "free o.x_scale",
                "free o.qinput",
                "free o.out"
            ]
        );
    }

    /// CPU compute under 0.21 on: after loading the weight blocks hold power-of-two scales,
    /// and the forward quantizes each token group with a power-of-two scale (DeepGEMM's E8M0),
    /// the f32 sum rounded to bf16.
    #[test]
    fn deep_gemm_host_forward_uses_power_of_two_scales_for_weights_and_activations() {
        let rt = runtime("compute");
        rt.set_fp8_block_path(Fp8BlockPath::DeepGemm {
            fallback_pads: false,
        });
        let (m, k, n) = (32, 256, 64);
        let (mut lin, codes, scales, x, xv) = seeded_linear(&rt, (m, k, n), B128);
        lin.after_loading(&rt).unwrap();
        lin.after_loading(&rt).unwrap();
        let (mut wq, mut ws) = (codes.clone(), scales.clone());
        requant_ue8m0(&mut wq, &mut ws, n, k, B128);
        assert_eq!(lin.qweight.u8(), &wq[..]);
        assert_eq!(lin.scale_inv.f32(), &ws[..]);
        let out = lin.forward(&rt, &x, "w", DType::BF16, &[n]).unwrap();
        for r in 0..m {
            let group = |g: usize| &xv[r * k + g * 128..r * k + g * 128 + 128];
            let xs: Vec<f32> = (0..2)
                .map(|g| {
                    let amax = group(g).iter().fold(0f32, |a, v| a.max(v.abs()));
                    2f32.powi((amax / 448.0).log2().ceil() as i32)
                })
                .collect();
            for c in 0..n {
                let acc: f64 = (0..k)
                    .map(|i| {
                        let a = encode(xv[r * k + i] / xs[i / 128]);
                        decode(a) as f64
                            * xs[i / 128] as f64
                            * decode(wq[c * k + i]) as f64
                            * ws[i / 128] as f64
                    })
                    .sum();
                let got = out.f32()[r * n + c] as f64;
                assert!(
                    (got - acc).abs() <= acc.abs() / 256.0 + 1e-3,
                    "{r} {c}: {got} vs {acc}"
                );
            }
        }
    }

    /// `requant_weight_ue8m0_inplace`: every block's scale a power of two at least the
    /// block's `amax / 448`, each weight within e4m3's rounding (a sixteenth) of its value.
    #[test]
    fn deep_gemm_requantizes_weight_blocks_to_power_of_two_scales() {
        let (n, k) = (256, 256);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 4096.0 * (1 + (i / k) / 128) as f32)
            .collect();
        let (mut codes, mut scales) = quantize_weight(&w, n, k, B128);
        let before: Vec<f32> = (0..n * k)
            .map(|i| decode(codes[i]) * scales[(i / k / 128) * 2 + (i % k) / 128])
            .collect();
        requant_ue8m0(&mut codes, &mut scales, n, k, B128);
        for (b, s) in scales.iter().enumerate() {
            assert_eq!(s.log2().fract(), 0.0, "block {b}: {s}");
            let (br, bc) = (b / 2, b % 2);
            let amax = (br * 128..br * 128 + 128)
                .flat_map(|r| (bc * 128..bc * 128 + 128).map(move |c| r * k + c))
                .fold(0f32, |m, i| m.max(before[i].abs()));
            assert!(
                *s >= amax / E4M3_MAX && *s < 2.0 * amax / E4M3_MAX,
                "{s} {amax}"
            );
        }
        for i in 0..n * k {
            let after = decode(codes[i]) * scales[(i / k / 128) * 2 + (i % k) / 128];
            assert!(
                (after - before[i]).abs() <= before[i].abs() / 16.0 + scales[0] * 1e-2,
                "{i}"
            );
        }
        assert_eq!(ue8m0_scale(448.0), 1.0);
        assert_eq!(ue8m0_scale(449.0), 2.0);
        assert_eq!(ue8m0_scale(224.0), 0.5);
    }

    #[test]
    fn v0_11_on_hopper_pads_every_token_count_by_one_to_four_rows_before_quantizing() {
        // 4 - m % 4: 2048 tokens get 4 more rows, 2046 get 2.
        for (m, p) in [(2048u64, 4u64), (2046, 2)] {
            let rows = m + p;
            assert_eq!(
                forward_trace(Fp8BlockPath::PadAlways, m as usize),
                vec![
                    ("alloc", "o.padded_input".into(), r(2 * rows * 256)),
                    ("alloc", "o.qinput".into(), r(rows * 256)),
                    ("alloc", "o.x_scale".into(), r(rows * 2 * 4)),
                    ("alloc", "o.out".into(), r(2 * rows * 512)),
                    ("free", "o.padded_input".into(), r(2 * rows * 256)),
                    ("free", "o.qinput".into(), r(rows * 256)),
                    ("free", "o.x_scale".into(), r(rows * 2 * 4)),
                    // The sliced output keeps its padded storage.
                    ("free", "o.out".into(), r(2 * rows * 512)),
                ]
            );
        }
    }

    #[test]
    fn v0_15_frees_the_scales_first_and_pads_on_hopper_only_off_a_multiple_of_four() {
        let plain = |m: u64| {
            vec![
                ("alloc", "o.qinput".into(), r(m * 256)),
                ("alloc", "o.x_scale".into(), r(m * 2 * 4)),
                ("alloc", "o.out".into(), r(2 * m * 512)),
                ("free", "o.x_scale".into(), r(m * 2 * 4)),
                ("free", "o.qinput".into(), r(m * 256)),
                ("free", "o.out".into(), r(2 * m * 512)),
            ]
        };
        for pad_to_four in [false, true] {
            let path = Fp8BlockPath::Op { pad_to_four };
            assert_eq!(forward_trace(path, 2048), plain(2048));
        }
        assert_eq!(
            forward_trace(Fp8BlockPath::Op { pad_to_four: false }, 2046),
            plain(2046)
        );
        assert_eq!(
            forward_trace(Fp8BlockPath::Op { pad_to_four: true }, 2046),
            vec![
                ("alloc", "o.qinput".into(), r(2046 * 256)),
                ("alloc", "o.x_scale".into(), r(2046 * 2 * 4)),
                ("alloc", "o.padded_qx".into(), r(2048 * 256)),
                ("alloc", "o.padded_x_scale".into(), r(2048 * 2 * 4)),
                ("alloc", "o.out".into(), r(2 * 2048 * 512)),
                ("free", "o.padded_qx".into(), r(2048 * 256)),
                ("free", "o.padded_x_scale".into(), r(2048 * 2 * 4)),
                ("free", "o.x_scale".into(), r(2046 * 2 * 4)),
                ("free", "o.qinput".into(), r(2046 * 256)),
                ("free", "o.out".into(), r(2 * 2048 * 512)),
            ]
        );
    }

    #[test]
    fn eras_pick_the_path_by_gpu() {
        use Fp8BlockEra::*;
        assert_eq!(V0_8.path(true), Fp8BlockPath::Plain);
        assert_eq!(V0_11.path(true), Fp8BlockPath::PadAlways);
        assert_eq!(V0_11.path(false), Fp8BlockPath::Plain);
        assert_eq!(V0_15.path(true), Fp8BlockPath::Op { pad_to_four: true });
        assert_eq!(V0_15.path(false), Fp8BlockPath::Op { pad_to_four: false });
        // V1: no stream-K refusal (the padded kernel), but [128, 128] blocks only.
        assert!(layer_problem(B128, &[4096], 14336, (true, V0_11)).is_none());
        let p = layer_problem(BlockSize { n: 64, k: 64 }, &[256], 256, (false, V0_15)).unwrap();
        assert!(p.contains("[128, 128] blocks only"), "{p}");
        // A merged layer's last partition may end in a partial block from 0.11 on.
        assert!(layer_problem(B128, &[1536, 576], 7168, (true, V0_15)).is_none());
        assert!(layer_problem(B128, &[1536, 576], 7168, (true, V0_8)).is_some());
        assert!(layer_problem(B128, &[576, 1536], 7168, (true, V0_11)).is_some());
    }

    #[test]
    fn v0_11_transposes_the_scale_grid_after_loading_and_computes_the_same() {
        let run = |path: Fp8BlockPath| {
            let rt = runtime("compute");
            rt.set_fp8_block_path(path);
            let (n, k) = (256, 256);
            let wv: Vec<f32> = (0..n * k)
                .map(|i| ((i * 29 % 83) as f32 - 41.0) / (1 + i / 9000) as f32)
                .collect();
            let (codes, scales) = quantize_weight(&wv, n, k, B128);
            let mut qweight = rt
                .tensor("w.weight", Category::Weight, &[n, k], DType::F8E4M3)
                .unwrap();
            qweight.u8_mut().copy_from_slice(&codes);
            let scale_inv = rt
                .tensor_with_values(
                    "w.weight_scale_inv",
                    Category::Weight,
                    &[2, 2],
                    DType::F32,
                    scales.clone(),
                )
                .unwrap();
            let mut lin = Fp8BlockLinear {
                qweight,
                scale_inv,
                block: B128,
                out_features: n,
                in_features: k,
                scales_transposed: false,
                act: DType::BF16,
                ue8m0: false,
            };
            let from = rt.event_count();
            lin.after_loading(&rt).unwrap();
            let loaded = trace(&rt, from);
            let xv: Vec<f32> = (0..3 * k)
                .map(|i| DType::BF16.round(((i * 53 % 97) as f32 - 48.0) / 16.0))
                .collect();
            let x = rt
                .tensor_with_values("x", Category::Activation, &[3, k], DType::BF16, xv)
                .unwrap();
            let out = lin
                .forward(&rt, &x, "w", DType::BF16, &[n])
                .unwrap()
                .f32()
                .to_vec();
            (loaded, lin.scale_inv.f32().to_vec(), scales, out)
        };
        let (loaded, grid, stored, out) = run(Fp8BlockPath::PadAlways);
        assert_eq!(
            loaded,
            vec![
                ("alloc", "w.weight_scale".into(), 512),
                ("free", "w.weight_scale_inv".into(), 512),
            ]
        );
        assert_eq!(grid, vec![stored[0], stored[2], stored[1], stored[3]]);
        let (loaded, _, _, plain) = run(Fp8BlockPath::Plain);
        assert!(loaded.is_empty());
        assert_eq!(out, plain);
    }
}

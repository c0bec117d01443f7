//! MXFP4 (OCP microscaling FP4) as gpt-oss publishes its experts: `*_blocks` of e2m1 codes,
//! two a byte (the low nibble the even element), and `*_scales` of e8m0 exponents, one per 32
//! values; and which of vLLM's MXFP4 MoE backends a GPU runs, with the sizes it rounds the
//! experts' hidden and intermediate dimensions up to (`maybe_roundup_sizes`, before
//! `create_weights` makes the parameters).

use crate::engine::tensor::DType;

/// Values per scale (`OCP_MX_BLOCK_SIZE`).
pub const BLOCK: usize = 32;

/// The 16 e2m1 values by code: sign bit 3, two exponent bits, one mantissa bit (transformers
/// integrations/mxfp4.py `FP4_VALUES`).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Dequantizes `rows` rows of `cols` values: `blocks` holds `cols / 2` bytes a row (element
/// `2j` in byte `j`'s low nibble, `2j + 1` in its high one), `scales` `cols / 32` exponents a
/// row, each value `e2m1 · 2^(scale − 127)` (transformers' `convert_moe_packed_tensors`:
/// `lut[idx]` then `ldexp(·, scale − 127)`), exactly in f32.
pub fn dequantize(blocks: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    assert!(cols.is_multiple_of(BLOCK));
    assert_eq!(blocks.len(), rows * cols / 2);
    assert_eq!(scales.len(), rows * cols / BLOCK);
    let mut out = Vec::with_capacity(rows * cols);
    for (j, &b) in blocks.iter().enumerate() {
        let s = scales[j * 2 / BLOCK] as i32 - 127;
        let f = 2f32.powi(s);
        out.push(E2M1[(b & 0x0F) as usize] * f);
        out.push(E2M1[(b >> 4) as usize] * f);
    }
    out
}

/// vLLM's MXFP4 MoE backends for gpt-oss (0.19 fused_moe/oracle/mxfp4.py L169-375,
/// `_get_priority_backends` and `select_mxfp4_moe_backend` with no env override, no LoRA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// FlashInfer's TRT-LLM kernels, bf16 activations: Blackwell (SM 10.x).
    FlashInferTrtllm,
    /// OpenAI's `triton_kernels` matmul_ogs: SM 9.0 up to 10.x (Hopper), first in line there.
    Triton,
    /// Marlin's MXFP4 GEMM: the fallback below SM 9.0 (Ampere, Ada).
    Marlin,
}

impl Backend {
    /// The backend a GPU of compute capability `(major, minor)` runs under 0.19: TRT-LLM on
    /// SM 10.x, triton_kernels on SM 9.x, Marlin below.
    ///
    /// TRT-LLM's experts need `is_device_capability_family(100)` (0.19
    /// fused_moe/experts/trtllm_mxfp4_moe.py L79-81), triton_kernels `(9, 0) <= cc < (11, 0)`
    /// (gpt_oss_triton_kernels_moe.py L555-565), FlashInfer's CUTLASS MXFP4 with bf16
    /// activations SM 9.0 only (flashinfer_cutlass_moe.py L142-177), Marlin SM 7.5 up: so SM
    /// 11.x and 12.x (Thor, RTX 50) fall through to Marlin. 0.11.0's `get_mxfp4_backend`
    /// (quantization/mxfp4.py L59-107) picks the same on these GPUs with FlashInfer and
    /// triton_kernels installed (as in vLLM's image), TRT-LLM on SM 10.0 only.
    pub fn for_capability(cc: (u32, u32)) -> Backend {
        match cc.0 {
            10 => Backend::FlashInferTrtllm,
            9 => Backend::Triton,
            _ => Backend::Marlin,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::FlashInferTrtllm => "FLASHINFER_TRTLLM_MXFP4_BF16",
            Backend::Triton => "TRITON",
            Backend::Marlin => "MARLIN",
        }
    }

    /// `mxfp4_round_up_hidden_size_and_intermediate_size` (0.19 oracle/mxfp4.py L376-400):
    /// Marlin pads the intermediate size to 128 and the hidden size to 256, TRT-LLM both to
    /// 256, the Triton path the intermediate size to 64 (gpt-oss's 2880 stays, 2880 hidden
    /// becomes 3072 under Marlin and TRT-LLM).
    pub fn round_up(self, rules: &Rules, hidden: usize, intermediate: usize) -> (usize, usize) {
        match self {
            Backend::Marlin => (
                hidden.next_multiple_of(256),
                intermediate.next_multiple_of(128),
            ),
            Backend::FlashInferTrtllm => (
                hidden.next_multiple_of(256),
                intermediate.next_multiple_of(rules.trtllm_width_round),
            ),
            Backend::Triton => (hidden, intermediate.next_multiple_of(64)),
        }
    }

    /// The bytes one MoE layer's `create_weights` makes for `experts` experts of hidden
    /// `h` and width `i` (already rounded): `w13_weight [E, 2I, H/2]` and `w2_weight
    /// [E, H, I/2]` u8, their scales `[E, 2I, H/32]` and `[E, H, I/32]` u8, the biases
    /// `[E, 2I]` and `[E, H]` bf16 (0.19 quantization/mxfp4.py L138-228).
    pub fn layer_bytes(experts: usize, h: usize, i: usize) -> u64 {
        let e = experts as u64;
        let (h, i) = (h as u64, i as u64);
        e * (2 * i * h / 2 + 2 * i * h / BLOCK as u64 + h * i / 2 + h * i / BLOCK as u64)
            + e * 2 * (2 * i + h)
    }
}

pub use crate::engine::rules::Mxfp4Rules as Rules;

/// One tensor `process_weights_after_loading` leaves on the device: its name, shape and dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelTensor {
    pub name: &'static str,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

/// What `Mxfp4MoEMethod.process_weights_after_loading` does to one layer's six parameters
/// (`w13_weight [E, 2I, H/2]`, `w13_weight_scale [E, 2I, H/32]`, `w2_weight [E, H, I/2]`,
/// `w2_weight_scale [E, H, I/32]` u8, `w13_bias [E, 2I]`, `w2_bias [E, H]` bf16, sizes
/// already rounded): the tensors it makes, in order, and which loaded parameters it frees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfterLoading {
    pub made: Vec<KernelTensor>,
    /// Indices into the six loaded parameters, in the order above, that die.
    pub freed: Vec<usize>,
}

impl Backend {
    /// The tensors each backend converts the loaded layer into (0.19
    /// fused_moe/oracle/mxfp4.py `convert_to_mxfp4_moe_kernel_format` L409-767 and
    /// quantization/mxfp4.py `_setup_kernel` L230-290; 0.11.0 quantization/mxfp4.py
    /// `process_weights_after_loading` L302-620) under the release's `rules`: whether
    /// triton_kernels swizzles on Hopper, which `_swizzle_mxfp4` turns off below torch 2.8.1
    /// (0.19 and 0.11.0 quantization/utils/mxfp4_utils.py L34-45 / L28-36; `hopper_swizzles`),
    /// how its value layout pads, whether the loaded scales die.
    ///
    /// - Triton (Hopper): the biases become f32 (`w13_bias.to(torch.float32)`, oracle L724-726,
    ///   `replace_parameter`: the bf16 ones die). Swizzled, `convert_layout` makes new value
    ///   tensors in `HopperMXValueLayout` and scale tensors in `HopperMXScaleLayout`
    ///   (`hopper_value_bytes`, `hopper_scale_bytes`); the loaded weights die (`del
    ///   layer.w13_weight`, oracle L744-745) but the loaded scales stay registered on the
    ///   layer (the swizzled ones live in the `PrecisionConfig`; `replace_parameter` is skipped
    ///   for TRITON_BACKENDS, quantization/mxfp4.py L266-277). Strided (torch < 2.8.1), the
    ///   layout wraps the loaded storage's transposed view: no new weight bytes.
    /// - Marlin: `prepare_moe_mxfp4_layer_for_marlin` (0.19 marlin_utils_fp4.py L520-631)
    ///   repacks the values through `gptq_marlin_repack` (`[K/16, 2N]` int32 per expert: the
    ///   same bytes), the scales into e8m0 (one byte each), the biases in bf16; all six
    ///   replaced.
    /// - TRT-LLM: per expert the rows shuffled (same bytes), the scales interleaved by
    ///   `nvfp4_block_scale_interleave` (no padding at the 256-rounded sizes: its result is
    ///   reshaped back to `[E, 2I, H/32]`, oracle L551-556), the biases f32; all six replaced.
    pub fn after_loading(self, rules: &Rules, experts: usize, h: usize, i: usize) -> AfterLoading {
        let e = experts;
        let t = |name, shape: Vec<usize>, dtype| KernelTensor { name, shape, dtype };
        let same = |bias: DType| {
            vec![
                t("w13_weight", vec![e, 2 * i, h / 2], DType::U8),
                t("w2_weight", vec![e, h, i / 2], DType::U8),
                t("w13_weight_scale", vec![e, 2 * i, h / BLOCK], DType::U8),
                t("w2_weight_scale", vec![e, h, i / BLOCK], DType::U8),
                t("w13_bias", vec![e, 2 * i], bias),
                t("w2_bias", vec![e, h], bias),
            ]
        };
        match self {
            Backend::Marlin => AfterLoading {
                made: same(DType::BF16),
                freed: (0..6).collect(),
            },
            Backend::FlashInferTrtllm => AfterLoading {
                made: same(DType::F32),
                freed: (0..6).collect(),
            },
            Backend::Triton if !rules.swizzle => AfterLoading {
                made: vec![
                    t("w13_bias", vec![e, 2 * i], DType::F32),
                    t("w2_bias", vec![e, h], DType::F32),
                ],
                freed: vec![4, 5],
            },
            Backend::Triton => AfterLoading {
                made: vec![
                    t("w13_bias", vec![e, 2 * i], DType::F32),
                    t("w2_bias", vec![e, h], DType::F32),
                    t(
                        "w13_weight (HOPPER_VALUE)",
                        hopper_value_shape(e, 2 * i, h, rules.value_pad64),
                        DType::U8,
                    ),
                    t(
                        "w13_scale (HOPPER_SCALE)",
                        hopper_scale_shape(e, 2 * i, h, rules.scale_pad4),
                        DType::U8,
                    ),
                    t(
                        "w2_weight (HOPPER_VALUE)",
                        hopper_value_shape(e, h, i, rules.value_pad64),
                        DType::U8,
                    ),
                    t(
                        "w2_scale (HOPPER_SCALE)",
                        hopper_scale_shape(e, h, i, rules.scale_pad4),
                        DType::U8,
                    ),
                ],
                // The bf16 biases, then the loaded w13 and w2 values (and from 0.25.1 their
                // scales).
                freed: if rules.frees_loaded_scales {
                    vec![4, 5, 0, 2, 1, 3]
                } else {
                    vec![4, 5, 0, 2]
                },
            },
        }
    }
}

impl Backend {
    /// Bytes one layer's experts hold once converted: the six loaded parameters at the
    /// rounded sizes (`round_up`, `layer_bytes`) less those freed, plus those made.
    pub fn bytes_after_loading(self, rules: &Rules, experts: usize, h: usize, i: usize) -> u64 {
        let (h, i) = self.round_up(rules, h, i);
        let e = experts as u64;
        let (hh, ii) = (h as u64, i as u64);
        let loaded = [
            e * 2 * ii * hh / 2,
            e * 2 * ii * hh / BLOCK as u64,
            e * hh * ii / 2,
            e * hh * ii / BLOCK as u64,
            e * 2 * ii * 2,
            e * hh * 2,
        ];
        let plan = self.after_loading(rules, experts, h, i);
        let kept: u64 = (0..6)
            .filter(|k| !plan.freed.contains(k))
            .map(|k| loaded[k])
            .sum();
        kept + plan
            .made
            .iter()
            .map(|t| t.shape.iter().product::<usize>() as u64 * t.dtype.size_bytes())
            .sum::<u64>()
    }
}

/// Whether triton_kernels swizzles MXFP4 on Hopper under a release's torch: `_swizzle_mxfp4`
/// falls back to `StridedLayout` when `not is_torch_equal_or_newer("2.8.1")` (0.19
/// mxfp4_utils.py L34-45). `torch` is the release's pin as `profile::vllm` writes it ("2.8"
/// is 0.11's `torch==2.8.0`; "2.6.0 / 2.7.1" reads its first).
pub fn hopper_swizzles(torch: &str) -> bool {
    let mut parts = torch
        .split(|c: char| !c.is_ascii_digit())
        .take_while(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let v = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    v >= (2, 8, 1)
}

/// The bytes `HopperMXValueLayout.swizzle_data` (mma_version 3) makes of one `[E, N, K/2]`
/// u8 value tensor, as `[E, N', K'/2]`: `_swizzle_mxfp4` transposes it to `[E, K/2, N]`;
/// triton_kernels 3.6 (`pad64`) pads both of those dimensions to 64 (`SWIZZLE_ALIGN_M/K`);
/// then, after `.mT`, the `[N, K/2]` tiles are padded to multiples of 16 and 32, regrouped
/// and the bits packed into as many bytes (vLLM 0.19's vendored third_party/triton_kernels
/// tensor_details/layout_details/hopper_value.py L109-182; 3.5.1's, 0.22.1 L99-176, has the
/// tiles only).
pub fn hopper_value_shape(experts: usize, n: usize, k: usize, pad64: bool) -> Vec<usize> {
    let align = if pad64 { 64 } else { 1 };
    vec![
        experts,
        n.next_multiple_of(align).next_multiple_of(16),
        (k / 2).next_multiple_of(align).next_multiple_of(32),
    ]
}

/// The bytes `HopperMXScaleLayout.swizzle_data` (num_warps 8) makes of one `[E, N, K/32]`
/// scale tensor: with `mx_axis` 1 it works on `[E, N, K/32]`, padding N to
/// `2·num_warps·2·8 = 256` and K/32 to 2 (hopper_scale.py L24-48, vendored in 0.19; the same
/// in 3.5.1), after vLLM's own pad of K/32 to 4 from 0.26 (`pad4`).
pub fn hopper_scale_shape(experts: usize, n: usize, k: usize, pad4: bool) -> Vec<usize> {
    let groups = (k / BLOCK).next_multiple_of(if pad4 { 4 } else { 1 });
    vec![experts, n.next_multiple_of(256), groups.next_multiple_of(2)]
}

/// Seeded MXFP4 bytes for a synthetic checkpoint: `*_blocks` any e2m1 pair, `*_scales`
/// exponents 119 to 121 (2^-8 to 2^-6, so values reach ±0.094, about the magnitude of
/// gpt-oss's experts). The same bytes for the same seed and name.
pub fn synthetic_bytes(seed: u64, name: &str, numel: usize) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ h);
    if name.ends_with("_scales") {
        (0..numel).map(|_| rng.random_range(119u8..=121)).collect()
    } else {
        (0..numel).map(|_| rng.random::<u8>()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values transformers 5.25's `convert_moe_packed_tensors` gives for the same bytes
    /// (run on this machine: blocks `[1 expert, 2 rows, 1 group, 16]` with row 0 starting
    /// 0x21, 0xF7, 0x08, 0x9E and row 1 with 0x21, the rest zero; scales 127 and 129; its
    /// output transposed to `[1, 32, 2]`): row 0 0.5, 1.0, 6.0, −6.0, −0.0, 0.0, −4.0, −0.5,
    /// row 1 2.0, 4.0, the rest 0.
    #[test]
    fn dequantizes_nibbles_low_first_times_two_to_the_scale() {
        let mut blocks = vec![0u8; 32];
        blocks[..4].copy_from_slice(&[0x21, 0xF7, 0x08, 0x9E]);
        blocks[16] = 0x21;
        let out = dequantize(&blocks, &[127, 129], 2, 32);
        assert_eq!(&out[..8], &[0.5, 1.0, 6.0, -6.0, -0.0, 0.0, -4.0, -0.5]);
        // Row 1 scales by 2^(129 − 127) = 4.
        assert_eq!(&out[32..34], &[2.0, 4.0]);
        assert!(out[8..32].iter().all(|&x| x == 0.0));
    }

    /// One gpt-oss-20b layer (32 experts) and one gpt-oss-120b layer (128) as each backend
    /// leaves it. Hopper under 0.19 (swizzled): the values padded from 1440 to 1472 bytes a
    /// row, the scales' rows to 256 (5760 → 5888, 2880 → 3072), the loaded scales kept, the
    /// biases f32. Hopper under 0.11 (torch 2.8.0, strided): the loaded bytes with f32 biases.
    /// Ampere (Marlin: 3072 hidden, 2944 wide) and Blackwell (TRT-LLM: 3072 both, f32 biases).
    #[test]
    fn each_backend_leaves_the_bytes_its_conversion_makes() {
        let (h, i) = (2880, 2880);
        for (e, loaded, swizzled, strided, marlin, trtllm) in [
            (
                32,
                423_567_360,
                458_772_480,
                424_120_320,
                461_815_808,
                482_476_032,
            ),
            (
                128,
                1_694_269_440,
                1_835_089_920,
                1_696_481_280,
                1_847_263_232,
                1_929_904_128,
            ),
        ] {
            assert_eq!(Backend::layer_bytes(e, h, i), loaded);
            let r = Rules::V0_19;
            let strided_rules = Rules {
                swizzle: false,
                ..r
            };
            assert_eq!(Backend::Triton.bytes_after_loading(&r, e, h, i), swizzled);
            assert_eq!(
                Backend::Triton.bytes_after_loading(&strided_rules, e, h, i),
                strided
            );
            assert_eq!(Backend::Marlin.bytes_after_loading(&r, e, h, i), marlin);
            assert_eq!(
                Backend::FlashInferTrtllm.bytes_after_loading(&r, e, h, i),
                trtllm
            );
        }
        // The swizzled layouts' shapes for w13 [32, 5760, 1440] and its scales [32, 5760, 90].
        assert_eq!(
            hopper_value_shape(32, 5760, 2880, true),
            vec![32, 5760, 1472]
        );
        assert_eq!(
            hopper_scale_shape(32, 5760, 2880, false),
            vec![32, 5888, 90]
        );
    }

    /// gpt-oss-20b's layer on Hopper release by release (docs/reading/vllm-gpt-oss-v1.md
    /// §3.2), each term from the shape rules by hand: 0.22-0.24's triton_kernels 3.5.1 keeps
    /// the values' bytes (w13 32·5760·1440 = 265,420,800, w2 132,710,400), the swizzled
    /// scales 32·5888·90 = 16,957,440 and 32·3072·90 = 8,847,360, the f32 biases 737,280 and
    /// 368,640, the loaded scales 16,588,800 and 8,294,400 kept; 0.25.1 frees those; 0.26 pads
    /// the swizzled scales' 90 groups to 92 (+376,832 and +196,608). B200 from 0.27.1 rounds
    /// the width to 128 (2944), not 256 (3072).
    #[test]
    fn hopper_layers_follow_the_release() {
        let (e, h, i) = (32, 2880, 2880);
        let kept = 265_420_800 + 132_710_400 + 16_957_440 + 8_847_360 + 737_280 + 368_640;
        for (minor, bytes) in [
            (19, 458_772_480),
            (21, 458_772_480),
            (15, kept + 16_588_800 + 8_294_400),
            (22, kept + 16_588_800 + 8_294_400),
            (24, kept + 16_588_800 + 8_294_400),
            (25, kept),
            (26, kept + 376_832 + 196_608),
            (33, kept + 376_832 + 196_608),
        ] {
            let r = Rules::for_release(minor, true);
            assert_eq!(
                Backend::Triton.bytes_after_loading(&r, e, h, i),
                bytes,
                "0.{minor}"
            );
        }
        assert_eq!(449_925_120, kept + 16_588_800 + 8_294_400);
        assert_eq!(
            Backend::FlashInferTrtllm.round_up(&Rules::for_release(26, true), h, i),
            (3072, 3072)
        );
        assert_eq!(
            Backend::FlashInferTrtllm.round_up(&Rules::for_release(27, true), h, i),
            (3072, 2944)
        );
    }

    #[test]
    fn torch_from_2_8_1_swizzles_on_hopper() {
        assert!(!hopper_swizzles("2.8"));
        assert!(!hopper_swizzles("2.6.0 / 2.7.1"));
        assert!(hopper_swizzles("2.9"));
        assert!(hopper_swizzles("2.10"));
        assert!(hopper_swizzles("2.8.1"));
    }

    #[test]
    fn backends_follow_the_compute_capability_and_round_as_vllm_does() {
        assert_eq!(Backend::for_capability((12, 0)), Backend::Marlin);
        assert_eq!(Backend::for_capability((9, 0)), Backend::Triton);
        assert_eq!(Backend::for_capability((8, 0)), Backend::Marlin);
        assert_eq!(Backend::for_capability((10, 0)), Backend::FlashInferTrtllm);
        let r = Rules::V0_19;
        assert_eq!(Backend::Triton.round_up(&r, 2880, 2880), (2880, 2880));
        assert_eq!(Backend::Marlin.round_up(&r, 2880, 2880), (3072, 2944));
        assert_eq!(
            Backend::FlashInferTrtllm.round_up(&r, 2880, 2880),
            (3072, 3072)
        );
        // gpt-oss-20b's layer under Triton: its index's expert bytes per layer
        // (32 · (5760·1440 + 5760·90 + 2880·1440 + 2880·90) + the biases in bf16).
        assert_eq!(
            Backend::layer_bytes(32, 2880, 2880),
            32 * (5760 * 1440 + 5760 * 90 + 2880 * 1440 + 2880 * 90) + 32 * 2 * (5760 + 2880)
        );
    }
}

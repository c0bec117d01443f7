//! MXFP4 (OCP microscaling FP4) as gpt-oss publishes its experts: `*_blocks` of e2m1 codes,
//! two a byte (the low nibble the even element), and `*_scales` of e8m0 exponents, one per 32
//! values; and which of vLLM's MXFP4 MoE backends a GPU runs, with the sizes it rounds the
//! experts' hidden and intermediate dimensions up to (`maybe_roundup_sizes`, before
//! `create_weights` makes the parameters).

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
    pub fn for_capability(cc: (u32, u32)) -> Backend {
        match cc.0 {
            10.. => Backend::FlashInferTrtllm,
            9 => Backend::Triton,
            _ => Backend::Marlin,
        }
    }

    /// `mxfp4_round_up_hidden_size_and_intermediate_size` (0.19 oracle/mxfp4.py L376-400):
    /// Marlin pads the intermediate size to 128 and the hidden size to 256, TRT-LLM both to
    /// 256, the Triton path the intermediate size to 64 (gpt-oss's 2880 stays, 2880 hidden
    /// becomes 3072 under Marlin and TRT-LLM).
    pub fn round_up(self, hidden: usize, intermediate: usize) -> (usize, usize) {
        match self {
            Backend::Marlin => (
                hidden.next_multiple_of(256),
                intermediate.next_multiple_of(128),
            ),
            Backend::FlashInferTrtllm => (
                hidden.next_multiple_of(256),
                intermediate.next_multiple_of(256),
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

    #[test]
    fn backends_follow_the_compute_capability_and_round_as_vllm_does() {
        assert_eq!(Backend::for_capability((9, 0)), Backend::Triton);
        assert_eq!(Backend::for_capability((8, 0)), Backend::Marlin);
        assert_eq!(Backend::for_capability((10, 0)), Backend::FlashInferTrtllm);
        assert_eq!(Backend::Triton.round_up(2880, 2880), (2880, 2880));
        assert_eq!(Backend::Marlin.round_up(2880, 2880), (3072, 2944));
        assert_eq!(Backend::FlashInferTrtllm.round_up(2880, 2880), (3072, 3072));
        // gpt-oss-20b's layer under Triton: its index's expert bytes per layer
        // (32 · (5760·1440 + 5760·90 + 2880·1440 + 2880·90) + the biases in bf16).
        assert_eq!(
            Backend::layer_bytes(32, 2880, 2880),
            32 * (5760 * 1440 + 5760 * 90 + 2880 * 1440 + 2880 * 90) + 32 * 2 * (5760 + 2880)
        );
    }
}

//! Seeded synthetic weights made where they live: the ChaCha8 stream a preset's weights draw
//! from (`model::weights::SyntheticWeights`), computed per element, so a GPU makes its own
//! copy instead of the host making and uploading it. `chacha8_words` is the host reference of
//! the device kernel (checked against `rand_chacha` here, and the kernel against it on a GPU).

use super::tensor::DType;

/// One stretch of a tensor filled from a source tensor's stream: `count` elements from element
/// `offset` of the tensor, read as rows of `row_len` elements `stride` apart in the source,
/// starting at source element `elem0`; elements of rows at or past `valid_rows` are zero (a
/// padded vocabulary).
#[derive(Clone, Debug, PartialEq)]
pub struct SynthFill {
    /// The ChaCha8 key (the seed as `rand_chacha` expands it), little-endian words.
    pub key: [u32; 8],
    /// Norm weights are 1 + u.
    pub is_norm: bool,
    /// The dtype the values are rounded to before they are stored (the preset's).
    pub round: Option<DType>,
    pub offset: u64,
    pub count: u64,
    pub elem0: u64,
    pub row_len: u64,
    pub stride: u64,
    pub valid_rows: u64,
}

const CONSTANTS: [u32; 4] = [0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574];

fn quarter(x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
    x[a] = x[a].wrapping_add(x[b]);
    x[d] = (x[d] ^ x[a]).rotate_left(16);
    x[c] = x[c].wrapping_add(x[d]);
    x[b] = (x[b] ^ x[c]).rotate_left(12);
    x[a] = x[a].wrapping_add(x[b]);
    x[d] = (x[d] ^ x[a]).rotate_left(8);
    x[c] = x[c].wrapping_add(x[d]);
    x[b] = (x[b] ^ x[c]).rotate_left(7);
}

/// Block `block` of the ChaCha8 stream 0 under `key`.
pub fn chacha8_block(key: &[u32; 8], block: u64) -> [u32; 16] {
    let mut s = [0u32; 16];
    s[..4].copy_from_slice(&CONSTANTS);
    s[4..12].copy_from_slice(key);
    s[12] = block as u32;
    s[13] = (block >> 32) as u32;
    let mut x = s;
    for _ in 0..4 {
        quarter(&mut x, 0, 4, 8, 12);
        quarter(&mut x, 1, 5, 9, 13);
        quarter(&mut x, 2, 6, 10, 14);
        quarter(&mut x, 3, 7, 11, 15);
        quarter(&mut x, 0, 5, 10, 15);
        quarter(&mut x, 1, 6, 11, 12);
        quarter(&mut x, 2, 7, 8, 13);
        quarter(&mut x, 3, 4, 9, 14);
    }
    for (o, i) in x.iter_mut().zip(s) {
        *o = o.wrapping_add(i);
    }
    x
}

/// Words `pos..pos + out.len()` of the stream.
pub fn chacha8_words(key: &[u32; 8], pos: u64, out: &mut [u32]) {
    let mut block = u64::MAX;
    let mut words = [0u32; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let w = pos + i as u64;
        if w / 16 != block {
            block = w / 16;
            words = chacha8_block(key, block);
        }
        *o = words[(w % 16) as usize];
    }
}

/// The values a fill writes, made on the host as the kernel makes them (its reference).
pub fn reference_fill(f: &SynthFill) -> Vec<f32> {
    (0..f.count)
        .map(|e| {
            let (row, col) = (e / f.row_len, e % f.row_len);
            if row >= f.valid_rows {
                return 0.0;
            }
            let mut w = [0u32; 3];
            chacha8_words(&f.key, 3 * (f.elem0 + row * f.stride + col), &mut w);
            let sum: f32 = w
                .iter()
                .map(|&x| (x >> 8) as f32 * (1.0 / (1u32 << 24) as f32) - 0.5)
                .sum();
            let u = sum * 0.04;
            let v = if f.is_norm { 1.0 + u } else { u };
            match f.round {
                Some(DType::F16) => half::f16::from_f32(v).to_f32(),
                Some(DType::BF16) => half::bf16::from_f32(v).to_f32(),
                _ => v,
            }
        })
        .collect()
}

/// The kernel: one element per thread (grid-stride), its three words from one or two blocks,
/// the same f32 operations in the same order as the host (no contraction: `__f*_rn`).
/// Compiled after the CUDA backend's kernel source (its `F16`/`BF16` conversions).
pub const SOURCE: &str = r#"
__device__ __forceinline__ unsigned int vs_rotl(unsigned int x, int n) { return (x << n) | (x >> (32 - n)); }
#define VS_QR(a, b, c, d) \
    a += b; d ^= a; d = vs_rotl(d, 16); c += d; b ^= c; b = vs_rotl(b, 12); \
    a += b; d ^= a; d = vs_rotl(d, 8); c += d; b ^= c; b = vs_rotl(b, 7);
__device__ void vs_chacha8(const unsigned int* key, unsigned long long block, unsigned int* o) {
    unsigned int s[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u,
        key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
        (unsigned int)block, (unsigned int)(block >> 32), 0u, 0u};
    unsigned int x[16];
    #pragma unroll
    for (int i = 0; i < 16; i++) x[i] = s[i];
    #pragma unroll
    for (int r = 0; r < 4; r++) {
        VS_QR(x[0], x[4], x[8], x[12]) VS_QR(x[1], x[5], x[9], x[13])
        VS_QR(x[2], x[6], x[10], x[14]) VS_QR(x[3], x[7], x[11], x[15])
        VS_QR(x[0], x[5], x[10], x[15]) VS_QR(x[1], x[6], x[11], x[12])
        VS_QR(x[2], x[7], x[8], x[13]) VS_QR(x[3], x[4], x[9], x[14])
    }
    #pragma unroll
    for (int i = 0; i < 16; i++) o[i] = x[i] + s[i];
}
__device__ __forceinline__ float vs_unit(unsigned int w) {
    return __fmul_rn((float)(w >> 8), 5.9604644775390625e-8f);
}
// The value of source element `src` (round: 0 none, 1 f16, 2 bf16).
__device__ float vs_value(const unsigned int* key, unsigned long long src, int is_norm, int round) {
    unsigned long long w = 3ull * src;
    unsigned int b[16], words[3];
    vs_chacha8(key, w >> 4, b);
    int i = (int)(w & 15ull);
    for (int j = 0; j < 3; j++) {
        if (i + j == 16) vs_chacha8(key, (w >> 4) + 1ull, b);
        words[j] = b[(i + j) & 15];
    }
    float sum = 0.0f;
    for (int j = 0; j < 3; j++) sum = __fadd_rn(sum, __fsub_rn(vs_unit(words[j]), 0.5f));
    float u = __fmul_rn(sum, 0.04f);
    float v = is_norm ? __fadd_rn(1.0f, u) : u;
    if (round == 1) v = F16::ld(F16::st(v));
    else if (round == 2) v = BF16::ld(BF16::st(v));
    return v;
}
// out_dt: 1 f16, 2 bf16.
extern "C" __global__ void synth_weights(unsigned short* out, unsigned long long count,
    unsigned long long elem0, unsigned long long row_len, unsigned long long stride,
    unsigned long long valid_rows,
    unsigned int k0, unsigned int k1, unsigned int k2, unsigned int k3,
    unsigned int k4, unsigned int k5, unsigned int k6, unsigned int k7,
    int is_norm, int round, int out_dt) {
    unsigned int key[8] = {k0, k1, k2, k3, k4, k5, k6, k7};
    for (unsigned long long e = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         e < count; e += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long row = e / row_len, col = e - row * row_len;
        float v = row < valid_rows ? vs_value(key, elem0 + row * stride + col, is_norm, round) : 0.0f;
        out[e] = out_dt == 2 ? BF16::st(v) : F16::st(v);
    }
}
// LLM.int8's row quantization of a seeded weight `[rows, k]` made in place: each row's
// absolute maximum into `scb`, round(v * 127 / max) clamped to ±127 into `cb` (zero rows
// stay zero), the host's `quant::int8::quantize_rows` operation for operation. One block of
// 256 threads a row; the values are made twice (once for the maximum) rather than stored.
extern "C" __global__ void synth_int8_rows(signed char* cb, float* scb,
    unsigned long long rows, unsigned long long k,
    unsigned long long elem0, unsigned long long stride, unsigned long long valid_rows,
    unsigned int k0, unsigned int k1, unsigned int k2, unsigned int k3,
    unsigned int k4, unsigned int k5, unsigned int k6, unsigned int k7,
    int is_norm, int round) {
    unsigned int key[8] = {k0, k1, k2, k3, k4, k5, k6, k7};
    __shared__ float red[256];
    for (unsigned long long row = blockIdx.x; row < rows; row += gridDim.x) {
        bool valid = row < valid_rows;
        float m = 0.0f;
        for (unsigned long long c = threadIdx.x; c < k; c += blockDim.x) {
            if (valid) m = fmaxf(m, fabsf(vs_value(key, elem0 + row * stride + c, is_norm, round)));
        }
        red[threadIdx.x] = m;
        __syncthreads();
        for (int s = 128; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
            __syncthreads();
        }
        float a = red[0];
        __syncthreads();
        if (threadIdx.x == 0) scb[row] = a;
        for (unsigned long long c = threadIdx.x; c < k; c += blockDim.x) {
            float q = 0.0f;
            if (valid && a > 0.0f) {
                float v = vs_value(key, elem0 + row * stride + c, is_norm, round);
                q = fminf(fmaxf(roundf(__fdiv_rn(__fmul_rn(v, 127.0f), a)), -127.0f), 127.0f);
            }
            cb[row * k + c] = (signed char)q;
        }
    }
}
"#;

pub const NAME: &str = "synth_weights";
pub const INT8_NAME: &str = "synth_int8_rows";

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngCore, SeedableRng};

    #[test]
    fn the_reference_stream_is_rand_chachas() {
        for seed in [0u64, 7, 0x9e37_79b9_7f4a_7c15] {
            let rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let key = key_of(&rng);
            for pos in [0u64, 1, 13, 14, 15, 16, 63, 64, 65, 1000, 3 * 123_457] {
                let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                r.set_word_pos(pos as u128);
                let want: Vec<u32> = (0..40).map(|_| r.next_u32()).collect();
                let mut got = vec![0u32; 40];
                chacha8_words(&key, pos, &mut got);
                assert_eq!(got, want, "seed {seed} pos {pos}");
            }
        }
    }

    fn key_of(rng: &rand_chacha::ChaCha8Rng) -> [u32; 8] {
        let seed = rng.get_seed();
        std::array::from_fn(|i| u32::from_le_bytes(seed[4 * i..4 * i + 4].try_into().unwrap()))
    }
}

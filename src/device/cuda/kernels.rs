//! The elementwise, normalization, quantization and softmax kernels, compiled with NVRTC when
//! the device opens. No CUDA headers are included (users often have none): 16-bit values are
//! `unsigned short` converted with PTX `cvt`, so the same source builds with CUDA 12 and 13.
//! Every kernel comes in an `_f16` and a `_bf16` flavour (`T16` below).

/// Names of the kernels instantiated for both 16-bit types.
pub(crate) const TYPED: &[&str] = &[
    "embedding",
    "rms_norm",
    "add_bias",
    "rope",
    "rope_qk",
    "add_assign",
    "add_assign_v8",
    "rms_norm_v8",
    "rms_norm_v8w",
    "silu_mul_out_v8",
    "silu_mul_out",
    "add_rms_norm_v8",
    "to_f32",
    "from_f32",
    "softmax_causal",
    "softmax_causal_reg",
    "col_absmax",
    "row_quant",
    "col_quant",
    "sub_b",
    "sub_a",
    "int8_dequant",
];

/// Kernels with no 16-bit operand.
pub(crate) const UNTYPED: &[&str] = &["cxb_transform", "pad_copy_i8", "igemm_i8", "fill_random"];

pub(crate) const SOURCE: &str = r#"
typedef unsigned short u16;
typedef unsigned char u8;
typedef signed char i8;

struct F16 {
  static __device__ __forceinline__ float ld(u16 h) { float f; asm("{cvt.f32.f16 %0, %1;}" : "=f"(f) : "h"(h)); return f; }
  static __device__ __forceinline__ u16 st(float f) { u16 h; asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h) : "f"(f)); return h; }
};
struct BF16 {
  static __device__ __forceinline__ float ld(u16 h) { return __uint_as_float(((unsigned)h) << 16); }
  static __device__ __forceinline__ u16 st(float f) {
    // round to nearest even, NaN kept quiet (the same as cvt.rn.bf16.f32, which needs sm_80)
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
  }
};

__device__ __forceinline__ float block_sum(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  int nw = (blockDim.x + 31) >> 5;
  float r = 0.f;
  for (int i = 0; i < nw; i++) r += sh[i];
  return r;
}
__device__ __forceinline__ float block_max(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  int nw = (blockDim.x + 31) >> 5;
  float r = -3.0e38f;
  for (int i = 0; i < nw; i++) r = fmaxf(r, sh[i]);
  return r;
}

// out[r, :] = table[ids[r], :]  (also the gather of the last token of each sequence); an id of
// 0xffffffff writes a zero row (a token another tensor-parallel rank owns: vLLM's masked_fill_).
template <class T> __device__ void embedding(const unsigned* ids, const u16* table, u16* out, long long cols) {
  long long r = blockIdx.x;
  if (ids[r] == 0xffffffffu) {
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = 0;
    return;
  }
  const u16* src = table + (long long)ids[r] * cols;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = src[c];
}

// Hugging Face LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in f32, rounded, times the weight.
template <class T> __device__ void rms_norm(const u16* x, const u16* w, u16* out, int cols, float eps) {
  __shared__ float sh[32];
  const u16* row = x + (long long)blockIdx.x * cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) { float v = T::ld(row[c]); s += v * v; }
  s = block_sum(s, sh);
  float inv = rsqrtf(s / cols + eps);
  u16* o = out + (long long)blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = T::st(T::ld(w[c]) * T::ld(T::st(T::ld(row[c]) * inv)));
}

template <class T> __device__ void add_bias(u16* x, const u16* b, long long n, int cols) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] = T::st(T::ld(x[i]) + T::ld(b[i % cols]));
}

// Rotate-half RoPE (Hugging Face Llama): pairs (i, i + d/2) of each head, angle pos * theta^(-2i/d).
// One block per token: the angles' cos and sin are computed once per pair index (shared by all
// heads) into shared memory, then every head is rotated.
template <class T> __device__ void rope(u16* x, const int* pos, int heads, int hd, float theta) {
  __shared__ float cs[256], sn[256];
  long long t = blockIdx.x;
  int half = hd / 2;
  float p = (float)pos[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float inv = powf(theta, -(float)(2 * i) / (float)hd);
    sincosf(p * inv, &sn[i], &cs[i]);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
    int h = j / half, i = j % half;
    float s = sn[i], c = cs[i];
    u16* base = x + (t * heads + h) * hd;
    float a = T::ld(base[i]), b = T::ld(base[i + half]);
    base[i] = T::st(a * c - b * s);
    base[i + half] = T::st(b * c + a * s);
  }
}

// Both rotations of a token in one block (q's `heads` and k's `kvh` heads), two pairs per thread
// with 32-bit loads (hd % 4 == 0, rows 4-byte aligned); the same arithmetic as `rope`.
template <class T> __device__ void rope_qk(u16* q, u16* k, const int* pos, int heads, int kvh, int hd, float theta) {
  __shared__ float cs[256], sn[256];
  long long t = blockIdx.x;
  int half = hd / 2, quarter = hd / 4;
  float p = (float)pos[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float inv = powf(theta, -(float)(2 * i) / (float)hd);
    sincosf(p * inv, &sn[i], &cs[i]);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < (heads + kvh) * quarter; j += blockDim.x) {
    int h = j / quarter, i = 2 * (j % quarter);
    u16* base = h < heads ? q + (t * heads + h) * hd : k + (t * kvh + (h - heads)) * hd;
    unsigned lo = *(const unsigned*)(base + i), hi = *(const unsigned*)(base + i + half);
    float a0 = T::ld((u16)(lo & 0xffff)), a1 = T::ld((u16)(lo >> 16));
    float b0 = T::ld((u16)(hi & 0xffff)), b1 = T::ld((u16)(hi >> 16));
    float c0 = cs[i], s0 = sn[i], c1 = cs[i + 1], s1 = sn[i + 1];
    *(unsigned*)(base + i) = (unsigned)T::st(a0 * c0 - b0 * s0) | ((unsigned)T::st(a1 * c1 - b1 * s1) << 16);
    *(unsigned*)(base + i + half) = (unsigned)T::st(b0 * c0 + a0 * s0) | ((unsigned)T::st(b1 * c1 + a1 * s1) << 16);
  }
}

template <class T> __device__ void add_assign(u16* x, const u16* y, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] = T::st(T::ld(x[i]) + T::ld(y[i]));
}

// Eight 16-bit values at a time (16-byte loads and stores): n8 = n / 8, pointers 16-byte aligned.
union V8 { uint4 v; u16 h[8]; };

template <class T> __device__ void add_assign_v8(u16* x, const u16* y, long long n8) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
    V8 a, b;
    a.v = ((const uint4*)x)[i];
    b.v = ((const uint4*)y)[i];
#pragma unroll
    for (int e = 0; e < 8; e++) a.h[e] = T::st(T::ld(a.h[e]) + T::ld(b.h[e]));
    ((uint4*)x)[i] = a.v;
  }
}

// SiLU(gate) · up into `out` (vLLM's SiluAndMul output; `out` may be `g`), the activation
// rounded to the dtype first as PyTorch does; 16-byte loads.
template <class T> __device__ void silu_mul_out_v8(const u16* g, const u16* u, u16* out, long long n8) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
    V8 a, b;
    a.v = ((const uint4*)g)[i];
    b.v = ((const uint4*)u)[i];
#pragma unroll
    for (int e = 0; e < 8; e++) {
      float f = T::ld(a.h[e]);
      a.h[e] = T::st(T::ld(T::st(f / (1.f + __expf(-f)))) * T::ld(b.h[e]));
    }
    ((uint4*)out)[i] = a.v;
  }
}

// silu_mul_out_v8 with 2-byte loads (any length or alignment).
template <class T> __device__ void silu_mul_out(const u16* g, const u16* u, u16* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float a = T::ld(g[i]);
    out[i] = T::st(T::ld(T::st(a / (1.f + __expf(-a)))) * T::ld(u[i]));
  }
}

// vLLM's fused_add_rms_norm in one read of each row: residual += x (rounded to the dtype), then
// x = rms_norm(residual) * w, the row held in registers between the two. cols % 8 == 0, cols / 8
// at most 4 * blockDim.x, rows 16-byte aligned.
template <class T> __device__ void add_rms_norm_v8(u16* x, u16* res, const u16* w, int cols, float eps) {
  __shared__ float sh[32];
  uint4* xr = (uint4*)(x + (long long)blockIdx.x * cols);
  uint4* rr = (uint4*)(res + (long long)blockIdx.x * cols);
  const int c8 = cols / 8;
  V8 v[4];
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c < c8) {
      V8 a;
      a.v = xr[c];
      v[j].v = rr[c];
#pragma unroll
      for (int e = 0; e < 8; e++) {
        v[j].h[e] = T::st(T::ld(v[j].h[e]) + T::ld(a.h[e]));
        const float y = T::ld(v[j].h[e]);
        s += y * y;
      }
      rr[c] = v[j].v;
    }
  }
  s = block_sum(s, sh);
  const float inv = rsqrtf(s / cols + eps);
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c < c8) {
      V8 b;
      b.v = ((const uint4*)w)[c];
#pragma unroll
      for (int e = 0; e < 8; e++) b.h[e] = T::st(T::ld(b.h[e]) * T::ld(T::st(T::ld(v[j].h[e]) * inv)));
      xr[c] = b.v;
    }
  }
}

// rms_norm with 16-byte loads: cols % 8 == 0 and rows 16-byte aligned.
template <class T> __device__ void rms_norm_v8(const u16* x, const u16* w, u16* out, int cols, float eps) {
  __shared__ float sh[32];
  const uint4* row = (const uint4*)(x + (long long)blockIdx.x * cols);
  const int c8 = cols / 8;
  float s = 0.f;
  for (int c = threadIdx.x; c < c8; c += blockDim.x) {
    V8 a;
    a.v = row[c];
#pragma unroll
    for (int e = 0; e < 8; e++) { float v = T::ld(a.h[e]); s += v * v; }
  }
  s = block_sum(s, sh);
  float inv = rsqrtf(s / cols + eps);
  uint4* o = (uint4*)(out + (long long)blockIdx.x * cols);
  for (int c = threadIdx.x; c < c8; c += blockDim.x) {
    V8 a, b;
    a.v = row[c];
    b.v = ((const uint4*)w)[c];
#pragma unroll
    for (int e = 0; e < 8; e++) a.h[e] = T::st(T::ld(b.h[e]) * T::ld(T::st(T::ld(a.h[e]) * inv)));
    o[c] = a.v;
  }
}


// rms_norm_v8 for short rows (cols / 8 <= 32, a head's width: Qwen3's q/k norm), one warp a
// row and 8 rows a block of 256 threads.
template <class T> __device__ void rms_norm_v8w(const u16* x, const u16* w, u16* out, int cols, float eps,
                                                long long rows) {
  const long long r = blockIdx.x * 8LL + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31, c8 = cols / 8;
  if (r >= rows) return;
  V8 a;
  float s = 0.f;
  if (lane < c8) {
    a.v = ((const uint4*)(x + r * cols))[lane];
#pragma unroll
    for (int e = 0; e < 8; e++) { float v = T::ld(a.h[e]); s += v * v; }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = rsqrtf(s / cols + eps);
  if (lane < c8) {
    V8 b;
    b.v = ((const uint4*)w)[lane];
#pragma unroll
    for (int e = 0; e < 8; e++) a.h[e] = T::st(T::ld(b.h[e]) * T::ld(T::st(T::ld(a.h[e]) * inv)));
    ((uint4*)(out + r * cols))[lane] = a.v;
  }
}

template <class T> __device__ void to_f32(const u16* x, float* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = T::ld(x[i]);
}

template <class T> __device__ void from_f32(const float* x, u16* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = T::st(x[i]);
}

// Causal softmax of pre-scaled f32 scores, rewritten in place as 16-bit probabilities.
// Row r of batch b holds the scores of query position q0 + r against keys [0, keys); keys
// after the query get probability 0. The 16-bit row starts at the same address as the f32
// row, so element j overwrites f32 element j/2: each step reads a whole stripe before any
// thread writes it.
template <class T> __device__ void softmax_causal(float* s, long long ld, int rows, int keys, int q0) {
  __shared__ float sh[32];
  long long row = (long long)blockIdx.y * rows + blockIdx.x;
  float* x = s + row * ld;
  u16* p = (u16*)x;
  int q = q0 + blockIdx.x;
  int valid = q + 1 < keys ? q + 1 : keys;
  float m = -3.0e38f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_max(m, sh);
  float sum = 0.f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) sum += __expf(x[j] - m);
  sum = block_sum(sum, sh);
  float inv = 1.f / sum;
  for (int j0 = 0; j0 < keys; j0 += blockDim.x) {
    int j = j0 + threadIdx.x;
    float v = (j < valid) ? __expf(x[j] - m) * inv : 0.f;
    __syncthreads();
    if (j < keys) p[j] = T::st(v);
  }
}

// The same with the whole row in registers (keys <= 256 * VPT): one read of the scores
// instead of three. All reads finish at a barrier before any 16-bit write.
template <class T, int VPT> __device__ void softmax_reg_impl(float* s, long long ld, int rows, int keys, int q0) {
  __shared__ float sh[32];
  long long row = (long long)blockIdx.y * rows + blockIdx.x;
  float* x = s + row * ld;
  u16* p = (u16*)x;
  int q = q0 + blockIdx.x;
  int valid = q + 1 < keys ? q + 1 : keys;
  float v[VPT];
  float m = -3.0e38f;
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    int j = i * blockDim.x + threadIdx.x;
    v[i] = j < valid ? x[j] : -3.0e38f;
    m = fmaxf(m, v[i]);
  }
  m = block_max(m, sh);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    int j = i * blockDim.x + threadIdx.x;
    v[i] = j < valid ? __expf(v[i] - m) : 0.f;
    sum += v[i];
  }
  sum = block_sum(sum, sh);
  float inv = 1.f / sum;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    int j = i * blockDim.x + threadIdx.x;
    if (j < keys) p[j] = T::st(v[i] * inv);
  }
}

__constant__ float NF4[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
  -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f,
  0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f,
  0.5626170039176941f, 0.7229568362236023f, 1.0f};

// Column absmax of x [m, k] (double_quant's column statistics, SCAt); scat starts at 0.
template <class T> __device__ void col_absmax(const u16* x, float* scat, int m, int k) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= k) return;
  int r0 = blockIdx.y * 256, r1 = min(m, r0 + 256);
  float v = 0.f;
  for (int r = r0; r < r1; r++) v = fmaxf(v, fabsf(T::ld(x[(long long)r * k + c])));
  atomicMax((int*)&scat[c], __float_as_int(v));
}

// Row-wise int8 of x without its outlier columns (scat[c] >= threshold when threshold > 0).
template <class T> __device__ void row_quant(const u16* x, const float* scat, float thr, i8* ca, float* sca, int k) {
  __shared__ float sh[32];
  long long r = blockIdx.x;
  const u16* row = x + r * k;
  float m = 0.f;
  for (int c = threadIdx.x; c < k; c += blockDim.x) {
    bool out = thr > 0.f && scat[c] >= thr;
    if (!out) m = fmaxf(m, fabsf(T::ld(row[c])));
  }
  m = block_max(m, sh);
  if (threadIdx.x == 0) sca[r] = m;
  float s = m > 0.f ? 127.f / m : 0.f;
  for (int c = threadIdx.x; c < k; c += blockDim.x) {
    bool out = thr > 0.f && scat[c] >= thr;
    ca[r * k + c] = out ? 0 : (i8)rintf(T::ld(row[c]) * s);
  }
}

// Column-wise int8 copy of x (double_quant's CAt).
template <class T> __device__ void col_quant(const u16* x, const float* scat, i8* cat, long long n, int k) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float a = scat[i % k];
    cat[i] = a > 0.f ? (i8)rintf(T::ld(x[i]) * 127.f / a) : 0;
  }
}

// subB [no, n]: the outlier columns of the dequantized weight.
template <class T> __device__ void sub_b(const i8* cb, const float* scb, const long long* idx, u16* sb, int no, int n, int k) {
  long long total = (long long)no * n;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    int j = i / n, r = i % n;
    sb[i] = T::st((float)cb[(long long)r * k + idx[j]] * scb[r] / 127.f);
  }
}

// subA [m, no]: the outlier columns of the input.
template <class T> __device__ void sub_a(const u16* x, const long long* idx, u16* sa, int m, int no, int k) {
  long long total = (long long)m * no;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    int r = i / no, j = i % no;
    sa[i] = x[(long long)r * k + idx[j]];
  }
}

// mm_dequant: int32 accumulators back to 16 bits with the row and weight scales.
template <class T> __device__ void int8_dequant(const int* acc, const float* sca, const float* scb, u16* out, int m, int n) {
  long long total = (long long)m * n;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    int r = i / n, c = i % n;
    out[i] = T::st((float)acc[i] * sca[r] * scb[c] * (1.f / (127.f * 127.f)));
  }
}

#define INST(NAME, SIG, ARGS) \
  extern "C" __global__ void NAME##_f16 SIG { NAME<F16> ARGS; } \
  extern "C" __global__ void NAME##_bf16 SIG { NAME<BF16> ARGS; }

// Rows of up to 256 * 32 keys held in registers.
template <class T> __device__ void softmax_causal_reg(float* s, long long ld, int rows, int keys, int q0) {
  softmax_reg_impl<T, 32>(s, ld, rows, keys, q0);
}

INST(embedding, (const unsigned* ids, const u16* t, u16* o, long long cols), (ids, t, o, cols))
INST(rms_norm, (const u16* x, const u16* w, u16* o, int cols, float eps), (x, w, o, cols, eps))
INST(add_bias, (u16* x, const u16* b, long long n, int cols), (x, b, n, cols))
INST(rope, (u16* x, const int* pos, int heads, int hd, float theta), (x, pos, heads, hd, theta))
INST(rope_qk, (u16* q, u16* k, const int* pos, int heads, int kvh, int hd, float theta), (q, k, pos, heads, kvh, hd, theta))
INST(add_assign, (u16* x, const u16* y, long long n), (x, y, n))
INST(add_assign_v8, (u16* x, const u16* y, long long n8), (x, y, n8))
INST(rms_norm_v8, (const u16* x, const u16* w, u16* o, int cols, float eps), (x, w, o, cols, eps))
INST(rms_norm_v8w, (const u16* x, const u16* w, u16* o, int cols, float eps, long long rows), (x, w, o, cols, eps, rows))
INST(silu_mul_out_v8, (const u16* g, const u16* u, u16* o, long long n8), (g, u, o, n8))
INST(silu_mul_out, (const u16* g, const u16* u, u16* o, long long n), (g, u, o, n))
INST(add_rms_norm_v8, (u16* x, u16* r, const u16* w, int cols, float eps), (x, r, w, cols, eps))
INST(to_f32, (const u16* x, float* o, long long n), (x, o, n))
INST(from_f32, (const float* x, u16* o, long long n), (x, o, n))
INST(softmax_causal, (float* s, long long ld, int rows, int keys, int q0), (s, ld, rows, keys, q0))
INST(softmax_causal_reg, (float* s, long long ld, int rows, int keys, int q0), (s, ld, rows, keys, q0))
INST(col_absmax, (const u16* x, float* s, int m, int k), (x, s, m, k))
INST(row_quant, (const u16* x, const float* s, float thr, i8* ca, float* sca, int k), (x, s, thr, ca, sca, k))
INST(col_quant, (const u16* x, const float* s, i8* cat, long long n, int k), (x, s, cat, n, k))
INST(sub_b, (const i8* cb, const float* scb, const long long* idx, u16* sb, int no, int n, int k), (cb, scb, idx, sb, no, n, k))
INST(sub_a, (const u16* x, const long long* idx, u16* sa, int m, int no, int k), (x, idx, sa, m, no, k))
INST(int8_dequant, (const int* acc, const float* sca, const float* scb, u16* o, int m, int n), (acc, sca, scb, o, m, n))

// CxB: CB [n, k] copied into its padded tile layout [rp, cp], padding zeroed.
extern "C" __global__ void cxb_transform(const i8* cb, i8* cxb, int n, int k, int rp, int cp) {
  long long total = (long long)rp * cp;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    int r = i / cp, c = i % cp;
    cxb[i] = (r < n && c < k) ? cb[(long long)r * k + c] : 0;
  }
}

// A [m, k] into its column-padded copy [m, kp] (C32A), padding zeroed.
extern "C" __global__ void pad_copy_i8(const i8* a, i8* out, int m, int k, int kp) {
  long long total = (long long)m * kp;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    int r = i / kp, c = i % kp;
    out[i] = c < k ? a[(long long)r * k + c] : 0;
  }
}

// Fallback int8 GEMM (used only when cuBLAS refuses int8): acc[m, n] = A[m, kp] . B[n, kp]^T
// with int32 accumulation, 32x32 tiles, four bytes at a time through dp4a.
extern "C" __global__ void igemm_i8(const i8* a, const i8* b, int* acc, int m, int n, int kp) {
  __shared__ int as[32][9];
  __shared__ int bs[32][9];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * 32 + ty, col = blockIdx.x * 32 + tx;
  int s = 0;
  for (int k0 = 0; k0 < kp; k0 += 32) {
    if (tx < 8) {
      as[ty][tx] = (row < m) ? ((const int*)(a + (long long)row * kp + k0))[tx] : 0;
      int brow = blockIdx.x * 32 + ty;
      bs[ty][tx] = (brow < n) ? ((const int*)(b + (long long)brow * kp + k0))[tx] : 0;
    }
    __syncthreads();
    for (int w = 0; w < 8; w++) s = __dp4a(as[ty][w], bs[tx][w], s);
    __syncthreads();
  }
  if (row < m && col < n) acc[(long long)row * n + col] = s;
}

// Deterministic small weights for the benchmark (values do not change its speed).
extern "C" __global__ void fill_random(u16* out, long long n, unsigned seed, int bf) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    float v = ((float)(h & 0xffff) / 65535.f - 0.5f) * 0.04f;
    out[i] = bf ? BF16::st(v) : F16::st(v);
  }
}
"#;

/// One fused causal attention kernel (`{name}_f16` and `{name}_bf16` in `FLASH_SOURCE`), built
/// only on compute capability 8.0 and later: they use `mma.sync` tensor-core and `cp.async` PTX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlashKernel {
    pub name: &'static str,
    /// `VRAMSCOPE_FLASH` value that picks it (`FLASH_DEFAULTS` orders them otherwise).
    pub variant: &'static str,
    pub head_dim: usize,
    pub warps: usize,
    /// Query rows per block.
    pub tile: usize,
    /// Dynamic shared memory per block (0: static only).
    pub smem: usize,
    /// Built only for compute capability 9.0 (wgmma, `compute_90a`).
    pub sm90a: bool,
}

const fn one_tile(
    name: &'static str,
    variant: &'static str,
    d: usize,
    warps: usize,
) -> FlashKernel {
    FlashKernel {
        name,
        variant,
        head_dim: d,
        warps,
        tile: warps * 16,
        smem: 0,
        sm90a: false,
    }
}

/// `flash_attn_wg`: `wg` warpgroups of 64 query rows, double-buffered `bn`-key tiles of K and V
/// (unpadded core-matrix layout) in dynamic shared memory.
const fn warpgroup(
    name: &'static str,
    variant: &'static str,
    d: usize,
    wg: usize,
    bn: usize,
) -> FlashKernel {
    FlashKernel {
        name,
        variant,
        head_dim: d,
        warps: wg * 4,
        tile: wg * 64,
        smem: 4 * bn * d * 2,
        sm90a: true,
    }
}

/// `flash_attn_wgs`: two warpgroups of 64 query rows, 128-key tiles of K and V in three
/// stages in the 128-byte swizzled layout (and 1 KiB to align the swizzle atoms), the two GEMMs
/// of each warpgroup overlapped.
const OVERLAPPED: FlashKernel = FlashKernel {
    name: "flash_attn_d128_wgs",
    variant: "wgs",
    head_dim: 128,
    warps: 8,
    tile: 128,
    smem: 3 * 2 * 128 * 128 * 2 + 1024,
    sm90a: true,
};

/// `flash_attn_ws`: `flash_attn_wgs`'s tiles, warp-specialized: two consumer warpgroups in
/// ping-pong and a producer warpgroup, three K and four V stages (and 1 KiB to align the
/// swizzle atoms).
const WARP_SPECIALIZED: FlashKernel = FlashKernel {
    name: "flash_attn_d128_ws",
    variant: "ws",
    head_dim: 128,
    warps: 12,
    tile: 128,
    smem: 7 * 128 * 128 * 2 + 1024,
    sm90a: true,
};

pub(crate) const FLASH: &[FlashKernel] = &[
    WARP_SPECIALIZED,
    OVERLAPPED,
    warpgroup("flash_attn_d128_wg", "wg", 128, 2, 128),
    one_tile("flash_attn_d32_w8l", "w8l", 32, 8),
    one_tile("flash_attn_d64_w8l", "w8l", 64, 8),
    one_tile("flash_attn_d128_w8l", "w8l", 128, 8),
    one_tile("flash_attn_d32_w4", "w4", 32, 4),
    one_tile("flash_attn_d64_w4", "w4", 64, 4),
    one_tile("flash_attn_d128_w4", "w4", 128, 4),
];

/// The variants tried, in order, when `VRAMSCOPE_FLASH` names none that is built for the head
/// dimension (or none at all): the first one loaded on this GPU runs.
pub(crate) const FLASH_DEFAULTS: &[&str] = &["ws", "w8l"];

/// Head dimensions the fused attention kernel is instantiated for.
#[cfg(test)]
pub(crate) const FLASH_HEAD_DIMS: &[usize] = &[32, 64, 128];

pub(crate) const FLASH_SOURCE: &str = r#"
typedef unsigned short u16;

// FlashAttention-2 style causal GQA attention. One block of WARPS warps per (head, WARPS * 16
// query tile); each warp owns 16 query rows. Key/value tiles of 64 rows stream through shared memory with
// cp.async; S = Q·Kᵀ and O += P·V run on tensor cores (mma.sync m16n8k16, f32 accumulators);
// the softmax is online (running max and sum per row in registers), so no score ever reaches
// global memory. Rows are [tokens, heads * D] (q, o) and [tokens, kv_heads * D] (k, v), the
// pointers already at the sequence's first token.

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }

template <bool BF> __device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  if (BF)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats into one register of 16-bit values, `lo` in the low half.
template <bool BF> __device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r;
  if (BF) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Rows [k0, k0 + 64) of one kv head into shared memory (row stride LD); rows past `len` are
// zero-filled so that masked keys never multiply garbage.
template <int D, int LD, int NT> __device__ __forceinline__ void fa_load(u16* dst, const u16* src, long long kw, int k0, int len) {
  constexpr int CH = D / 8;
#pragma unroll
  for (int i = threadIdx.x; i < 64 * CH; i += NT) {
    int r = i / CH, c = i % CH;
    int row = k0 + r;
    int ok = row < len ? 16 : 0;
    const u16* s = src + (long long)(row < len ? row : 0) * kw + c * 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_u32(dst + r * LD + c * 8)), "l"(s), "r"(ok));
  }
  asm volatile("cp.async.commit_group;");
}

// Q fragments (mma A operand, m16k16 per 16 head dims) of rows r0 and r1 = r0 + 8 of head h;
// rows past `len` read as zero.
template <int D> __device__ __forceinline__ void fa_load_q(unsigned (&qf)[D / 16][4], const u16* q, long long qw, int h,
                                                          int r0, int r1, int t, int len) {
  const u16* qa = q + (long long)r0 * qw + h * D + 2 * t;
  const u16* qc = q + (long long)r1 * qw + h * D + 2 * t;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    qf[kk][0] = r0 < len ? *(const unsigned*)(qa + kk * 16) : 0u;
    qf[kk][1] = r1 < len ? *(const unsigned*)(qc + kk * 16) : 0u;
    qf[kk][2] = r0 < len ? *(const unsigned*)(qa + kk * 16 + 8) : 0u;
    qf[kk][3] = r1 < len ? *(const unsigned*)(qc + kk * 16 + 8) : 0u;
  }
}

// A row pair's start: its Q fragments, output accumulators at zero, running maxima at -inf
// and sums at zero.
template <int D> __device__ __forceinline__ void fa_start(unsigned (&qf)[D / 16][4], float (&of)[D / 8][4], float& m0, float& m1,
                                                        float& l0, float& l1, const u16* q, long long qw, int h, int r0, int r1,
                                                        int t, int len) {
  fa_load_q<D>(qf, q, qw, h, r0, r1, t, len);
#pragma unroll
  for (int i = 0; i < D / 8; i++) of[i][0] = of[i][1] = of[i][2] = of[i][3] = 0.f;
  m0 = m1 = __int_as_float(0xff800000);
  l0 = l1 = 0.f;
}

// One online-softmax step over a key tile's raw scores s (NB groups of 8 keys from k0, the mma
// accumulator layout of rows r0 and r1): causal and length mask where `edge`, new running
// maxima m and sums l, the output accumulators rescaled, and the probabilities packed as the
// next mma's A fragments. Every row has key 0 in its first tile, so the maxima stay finite.
template <bool BF, int NB, int D> __device__ __forceinline__ void fa_softmax(float (&s)[NB][4], unsigned (&pf)[NB / 2][4], float (&of)[D / 8][4],
                                                                          float& m0, float& m1, float& l0, float& l1, bool edge,
                                                                          int k0, int r0, int r1, int t, int len, float scale_log2) {
  const float NEG = __int_as_float(0xff800000);
  float mx0 = m0, mx1 = m1;
#pragma unroll
  for (int n = 0; n < NB; n++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float x = s[n][e];  // raw score: the scale (> 0) is applied in the exponent
      if (edge) {
        int kj = k0 + n * 8 + 2 * t + (e & 1);
        int qi = e < 2 ? r0 : r1;
        if (kj > qi || kj >= len) x = NEG;
      }
      s[n][e] = x;
      if (e < 2) mx0 = fmaxf(mx0, x); else mx1 = fmaxf(mx1, x);
    }
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float a0 = ex2((m0 - mx0) * scale_log2), a1 = ex2((m1 - mx1) * scale_log2);
  m0 = mx0;
  m1 = mx1;
  const float c0 = -m0 * scale_log2, c1 = -m1 * scale_log2;
  l0 *= a0;
  l1 *= a1;
#pragma unroll
  for (int i = 0; i < D / 8; i++) {
    of[i][0] *= a0; of[i][1] *= a0; of[i][2] *= a1; of[i][3] *= a1;
  }
#pragma unroll
  for (int n = 0; n < NB; n++) {
    float p0 = ex2(fmaf(s[n][0], scale_log2, c0)), p1 = ex2(fmaf(s[n][1], scale_log2, c0));
    float p2 = ex2(fmaf(s[n][2], scale_log2, c1)), p3 = ex2(fmaf(s[n][3], scale_log2, c1));
    l0 += p0 + p1;
    l1 += p2 + p3;
    pf[n >> 1][(n & 1) * 2] = pack2<BF>(p0, p1);
    pf[n >> 1][(n & 1) * 2 + 1] = pack2<BF>(p2, p3);
  }
}

// Rows r0 and r1 of the output: the accumulators over the row sums (reduced across the
// quad), rows past `len` not written.
template <bool BF, int D> __device__ __forceinline__ void fa_store_o(u16* o, float (&of)[D / 8][4], float l0, float l1, long long qw,
                                                                  int h, int r0, int r1, int t, int len) {
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = 1.f / l0, i1 = 1.f / l1;
  u16* oa = o + (long long)r0 * qw + h * D + 2 * t;
  u16* oc = o + (long long)r1 * qw + h * D + 2 * t;
#pragma unroll
  for (int dn = 0; dn < D / 8; dn++) {
    if (r0 < len) *(unsigned*)(oa + dn * 8) = pack2<BF>(of[dn][0] * i0, of[dn][1] * i0);
    if (r1 < len) *(unsigned*)(oc + dn * 8) = pack2<BF>(of[dn][2] * i1, of[dn][3] * i1);
  }
}

// WARPS warps of 16 query rows each (a tile of WARPS * 16 queries); LDK: key fragments through
// ldmatrix (one instruction for two mma operands) instead of 32-bit shared loads.
template <bool BF, int D, int WARPS, bool LDK> __device__ void flash_attn(const u16* q, const u16* k, const u16* v, u16* o,
                                                    int len, int heads, int kvh, float scale_log2) {
  constexpr int LD = D + 8;  // padding: conflict-free fragment loads and ldmatrix
  __shared__ __align__(16) u16 ks[64 * LD];
  __shared__ __align__(16) u16 vs[64 * LD];
  const int h = blockIdx.x;
  const int tile = gridDim.y - 1 - blockIdx.y;  // the longest (diagonal-most) tiles first
  const int q0 = tile * WARPS * 16;
  const int kh = h / (heads / kvh);
  const long long qw = (long long)heads * D, kw = (long long)kvh * D;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
  const u16* kb = k + kh * D;
  const u16* vb = v + kh * D;
  fa_load<D, LD, WARPS * 32>(ks, kb, kw, 0, len);
  fa_load<D, LD, WARPS * 32>(vs, vb, kw, 0, len);

  unsigned qf[D / 16][4];
  float of[D / 8][4], m0, m1, l0, l1;
  fa_start<D>(qf, of, m0, m1, l0, l1, q, qw, h, r0, r1, t, len);

  const int qend = q0 + WARPS * 16 < len ? q0 + WARPS * 16 : len;
  const int ntiles = (qend + 63) / 64;
  const int mi = lane >> 3, mr = lane & 7;
  unsigned pf[4][4];
  for (int j = 0; j < ntiles; j++) {
    const int k0 = j * 64;
    // A warp whose 16 rows all precede this key tile gets nothing from it (causal mask).
    const bool active = k0 <= q0 + warp * 16 + 15;
    asm volatile("cp.async.wait_group 1;");
    __syncthreads();
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    if (active) {
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        if (LDK) {
#pragma unroll
          for (int n = 0; n < 8; n += 2) {
            unsigned b0, b1, b2, b3;
            const u16* src = ks + ((n + (mi >> 1)) * 8 + mr) * LD + kk * 16 + (mi & 1) * 8;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(smem_u32(src)));
            mma16816<BF>(s[n], qf[kk], b0, b1);
            mma16816<BF>(s[n + 1], qf[kk], b2, b3);
          }
        } else {
#pragma unroll
          for (int n = 0; n < 8; n++) {
            const u16* kr = ks + (n * 8 + g) * LD + kk * 16 + 2 * t;
            mma16816<BF>(s[n], qf[kk], *(const unsigned*)kr, *(const unsigned*)(kr + 8));
          }
        }
      }
    }
    __syncthreads();
    if (j + 1 < ntiles) fa_load<D, LD, WARPS * 32>(ks, kb, kw, k0 + 64, len);
    else asm volatile("cp.async.commit_group;");

    const bool edge = k0 + 64 > q0 || k0 + 64 > len;
    if (active) {
    fa_softmax<BF, 8, D>(s, pf, of, m0, m1, l0, l1, edge, k0, r0, r1, t, len, scale_log2);
    }

    asm volatile("cp.async.wait_group 1;");
    __syncthreads();
    if (active) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
#pragma unroll
      for (int dn = 0; dn < D / 8; dn += 2) {
        unsigned b0, b1, b2, b3;
        const u16* src = vs + (kk * 16 + (mi & 1) * 8 + mr) * LD + (dn + (mi >> 1)) * 8;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(smem_u32(src)));
        mma16816<BF>(of[dn], pf[kk], b0, b1);
        mma16816<BF>(of[dn + 1], pf[kk], b2, b3);
      }
    }
    }
    __syncthreads();
    if (j + 1 < ntiles) fa_load<D, LD, WARPS * 32>(vs, vb, kw, k0 + 64, len);
    else asm volatile("cp.async.commit_group;");
  }
  asm volatile("cp.async.wait_group 0;");

  fa_store_o<BF, D>(o, of, l0, l1, qw, h, r0, r1, t, len);
}

// Exports NAME_f16 and NAME_bf16: attention kernel template KERNEL<bf16?, D, ARGS...> with THREADS
// threads per block. blockIdx.z picks one of gridDim.z sequences of `len` tokens each, laid one
// after another (a uniform batch in one launch).
#define FA_EXPORT(NAME, THREADS, MINB, KERNEL, D, ...) \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB) NAME##_f16(const u16* q, const u16* k, const u16* v, u16* o, int len, int heads, int kvh, float sl) \
  { const long long z = (long long)blockIdx.z * len; \
    KERNEL<false, D, __VA_ARGS__>(q + z * heads * D, k + z * kvh * D, v + z * kvh * D, o + z * heads * D, len, heads, kvh, sl); } \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB) NAME##_bf16(const u16* q, const u16* k, const u16* v, u16* o, int len, int heads, int kvh, float sl) \
  { const long long z = (long long)blockIdx.z * len; \
    KERNEL<true, D, __VA_ARGS__>(q + z * heads * D, k + z * kvh * D, v + z * kvh * D, o + z * heads * D, len, heads, kvh, sl); }
#define FA_INST(NAME, D, WARPS, LDK, MINB) FA_EXPORT(NAME, WARPS * 32, MINB, flash_attn, D, WARPS, LDK)
// The default: 128-query tiles of 8 warps sharing each key/value tile, key fragments through
// ldmatrix (fastest of the variants measured, docs/gpu-runs.md run 5).
FA_INST(flash_attn_d32_w8l, 32, 8, true, 1)
FA_INST(flash_attn_d64_w8l, 64, 8, true, 1)
FA_INST(flash_attn_d128_w8l, 128, 8, true, 1)
// 64-query tiles of 4 warps, key fragments through 32-bit shared loads (VRAMSCOPE_FLASH=w4).
FA_INST(flash_attn_d32_w4, 32, 4, false, 1)
FA_INST(flash_attn_d64_w4, 64, 4, false, 1)
FA_INST(flash_attn_d128_w4, 128, 4, false, 1)
"#;

/// Hopper-only fused attention on warpgroup MMA, appended to `FLASH_SOURCE` and compiled for
/// `compute_90a` on compute capability 9.0.
pub(crate) const WGMMA_SOURCE: &str = r#"
// wgmma m64n128k16 with A from registers and B through a shared-memory descriptor (f32
// accumulators d[64]); TNSP reads B transposed (MN-major).
#define WGMMA_M64N128K16(TY, TNSP) \
  asm volatile("{ wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, " TNSP "; }" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))
template <bool BF, bool TNSP> __device__ __forceinline__ void wgmma_m64n128k16(float* d, const unsigned* a, unsigned long long desc) {
  if (BF) { if (TNSP) WGMMA_M64N128K16("bf16", "1"); else WGMMA_M64N128K16("bf16", "0"); }
  else { if (TNSP) WGMMA_M64N128K16("f16", "1"); else WGMMA_M64N128K16("f16", "0"); }
}

// Hopper (sm_90a) fused causal GQA attention on warpgroup MMA (wgmma). A block of WG
// warpgroups (4 warps each) owns WG * 64 query rows; each warpgroup computes S = Q·Kᵀ for
// its 64 rows against a BN-key tile with one wgmma m64nBNk16 per 16 head dims (Q from
// registers, K from shared memory), the online softmax in registers as in `flash_attn`, then
// O += P·V with wgmma m64nDk16 (P from registers, V from shared memory, read transposed).
// Key and value tiles are double-buffered, loaded with cp.async into the no-swizzle "core
// matrix" layout wgmma reads: 8 rows × 16 bytes contiguous per core matrix, the D/8 core
// matrices of a row group next to each other.
__device__ __forceinline__ unsigned long long wg_desc(const void* p, unsigned lbo, unsigned sbo) {
  unsigned long long a = smem_u32(p);
  return ((a & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32);
}
template <int N> __device__ __forceinline__ void wg_keep(float* d) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

template <bool BF, int D, int WG, int BN> __device__ void flash_attn_wg(const u16* q, const u16* k, const u16* v, u16* o,
                                                    int len, int heads, int kvh, float scale_log2) {
  constexpr int NT = WG * 128;
  constexpr int TILE = BN * D;  // halves per K or V tile
  static_assert(BN == 128 && D == 128, "both GEMMs are wgmma m64n128k16");
  extern __shared__ __align__(128) u16 smem[];
  const int h = blockIdx.x;
  const int tile = gridDim.y - 1 - blockIdx.y;  // the longest (diagonal-most) tiles first
  const int q0 = tile * WG * 64;
  const int kh = h / (heads / kvh);
  const long long qw = (long long)heads * D, kw = (long long)kvh * D;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wq = q0 + wg * 64;  // this warpgroup's first query row
  const int r0 = wq + warp * 16 + g, r1 = r0 + 8;
  const u16* kb = k + kh * D;
  const u16* vb = v + kh * D;
  // Buffers: K0, V0, K1, V1. Each thread copies 16-byte chunk `lc` of rows lr, lr + RS, ...
  // of a tile into the core-matrix layout, its addresses computed once; rows past `len` are
  // zero-filled.
  constexpr int CH = D / 8, RS = NT / CH, PASSES = BN * CH / NT;
  static_assert(NT % CH == 0 && RS % 8 == 0 && (BN * CH) % NT == 0, "tile shape");
  const int lr = threadIdx.x / CH, lc = threadIdx.x % CH;
  const unsigned sbase = smem_u32(smem) + (((lr >> 3) * CH + lc) * 64 + (lr & 7) * 8) * 2;
  const u16* kt = kb + (long long)lr * kw + lc * 8;
  const u16* vt = vb + (long long)lr * kw + lc * 8;
  auto load = [&](int buf, int k0) {
#pragma unroll
    for (int u = 0; u < PASSES; u++) {
      const bool in = k0 + lr + u * RS < len;
      const long long off = in ? (long long)(k0 + u * RS) * kw : 0;
      const unsigned d = sbase + (buf * 2 * TILE + u * (RS / 8) * CH * 64) * 2;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(kt + off), "r"(in ? 16 : 0));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d + TILE * 2), "l"(vt + off), "r"(in ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;");
  };
  load(0, 0);

  unsigned qf[D / 16][4];
  float of[D / 8][4], m0, m1, l0, l1;
  fa_start<D>(qf, of, m0, m1, l0, l1, q, qw, h, r0, r1, t, len);

  const int qend = q0 + WG * 64 < len ? q0 + WG * 64 : len;
  const int ntiles = (qend + BN - 1) / BN;
  for (int j = 0; j < ntiles; j++) {
    const int k0 = j * BN;
    const u16* ks = smem + (j & 1) * 2 * TILE;
    const u16* vs = ks + TILE;
    asm volatile("cp.async.wait_group 0;");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async writes → wgmma reads
    __syncthreads();
    if (j + 1 < ntiles) load((j + 1) & 1, k0 + BN);
    // A warpgroup whose 64 rows all precede this key tile gets nothing from it (causal mask).
    if (k0 > wq + 63 || wq >= len) continue;
    float s[BN / 8][4];
#pragma unroll
    for (int n = 0; n < BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    wg_keep<BN / 2>(&s[0][0]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)  // K-major B: LBO = next 8 dims, SBO = next 8 keys
      wgmma_m64n128k16<BF, false>(&s[0][0], qf[kk], wg_desc(ks + kk * 128, 128, D * 16));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_keep<BN / 2>(&s[0][0]);

    const bool edge = k0 + BN > wq + warp * 16 || k0 + BN > len;
    unsigned pf[BN / 16][4];
    fa_softmax<BF, BN / 8, D>(s, pf, of, m0, m1, l0, l1, edge, k0, r0, r1, t, len, scale_log2);
    wg_keep<D / 2>(&of[0][0]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)  // MN-major B (V read transposed): LBO = next 8 keys, SBO = next 8 dims
      wgmma_m64n128k16<BF, true>(&of[0][0], pf[kk], wg_desc(vs + kk * 2 * D * 8, D * 16, 128));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_keep<D / 2>(&of[0][0]);
  }
  asm volatile("cp.async.wait_group 0;");

  fa_store_o<BF, D>(o, of, l0, l1, qw, h, r0, r1, t, len);
}

// The online-softmax step of the overlapped kernel, split from the output's rescale: the raw
// scores s become probabilities in place (floats, packed once the P·V still in flight has
// landed), the running maxima and sums move on, and a0, a1 are the factors the output
// accumulators must be multiplied by. The maxima and sums reduce as trees (four independent
// chains a row) so that two warps a scheduler are not held on one long dependency chain.
template <int NB> __device__ __forceinline__ void fa_softmax_p(float (&s)[NB][4], float& m0, float& m1, float& l0, float& l1,
                                                            float& a0, float& a1, bool edge, int k0, int r0, int r1, int t,
                                                            int len, float scale_log2) {
  const float NEG = __int_as_float(0xff800000);
  if (edge) {
#pragma unroll
    for (int n = 0; n < NB; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int kj = k0 + n * 8 + 2 * t + (e & 1);
        if (kj > (e < 2 ? r0 : r1) || kj >= len) s[n][e] = NEG;
      }
    }
  }
  float x[2][4];
#pragma unroll
  for (int i = 0; i < 4; i++) x[0][i] = x[1][i] = NEG;
#pragma unroll
  for (int n = 0; n < NB; n++) {
    const int c = (n & 1) * 2;
    x[0][c] = fmaxf(x[0][c], s[n][0]); x[0][c + 1] = fmaxf(x[0][c + 1], s[n][1]);
    x[1][c] = fmaxf(x[1][c], s[n][2]); x[1][c + 1] = fmaxf(x[1][c + 1], s[n][3]);
  }
  float mx0 = fmaxf(fmaxf(x[0][0], x[0][1]), fmaxf(x[0][2], x[0][3]));
  float mx1 = fmaxf(fmaxf(x[1][0], x[1][1]), fmaxf(x[1][2], x[1][3]));
  mx0 = fmaxf(fmaxf(mx0, m0), __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx1 = fmaxf(fmaxf(mx1, m1), __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  a0 = ex2((m0 - mx0) * scale_log2);
  a1 = ex2((m1 - mx1) * scale_log2);
  m0 = mx0;
  m1 = mx1;
  const float c0 = -mx0 * scale_log2, c1 = -mx1 * scale_log2;
#pragma unroll
  for (int i = 0; i < 4; i++) x[0][i] = x[1][i] = 0.f;
#pragma unroll
  for (int n = 0; n < NB; n++) {
    const int c = (n & 1) * 2;
    s[n][0] = ex2(fmaf(s[n][0], scale_log2, c0)); s[n][1] = ex2(fmaf(s[n][1], scale_log2, c0));
    s[n][2] = ex2(fmaf(s[n][2], scale_log2, c1)); s[n][3] = ex2(fmaf(s[n][3], scale_log2, c1));
    x[0][c] += s[n][0]; x[0][c + 1] += s[n][1];
    x[1][c] += s[n][2]; x[1][c + 1] += s[n][3];
  }
  l0 = fmaf(l0, a0, (x[0][0] + x[0][1]) + (x[0][2] + x[0][3]));
  l1 = fmaf(l1, a1, (x[1][0] + x[1][1]) + (x[1][2] + x[1][3]));
}

template <int N> __device__ __forceinline__ void wg_keep_u(unsigned* r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

// A shared-memory operand descriptor in the 128-byte swizzle mode (bits 62-63 = 1).
__device__ __forceinline__ unsigned long long sw128_desc(unsigned a, unsigned lbo, unsigned sbo) {
  return ((unsigned long long)(a & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | 1ull << 62;
}

// The two GEMMs of a warpgroup's step and the probabilities' packing, shared by the Hopper
// kernels that keep K and V in the 128-byte swizzled layout (shared addresses ks, vs of the
// tile's K and V). S = Q·K and O += P·V are issued, not waited.
template <bool BF, int D, int BN> __device__ __forceinline__ void fa_qk_sw(float (&s)[BN / 8][4], unsigned (&qf)[D / 16][4], unsigned ks) {
#pragma unroll
  for (int n = 0; n < BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  wg_keep<BN / 2>(&s[0][0]);
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++)
    wgmma_m64n128k16<BF, false>(&s[0][0], qf[kk], sw128_desc(ks + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <bool BF, int D, int BN> __device__ __forceinline__ void fa_pv_sw(float (&of)[D / 8][4], unsigned (&pf)[BN / 16][4], unsigned vs) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++)
    wgmma_m64n128k16<BF, true>(&of[0][0], pf[kk], sw128_desc(vs + kk * 2048, BN * 128, 1024));
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <bool BF, int NB> __device__ __forceinline__ void fa_pack(unsigned (&pf)[NB / 2][4], float (&s)[NB][4]) {
#pragma unroll
  for (int n = 0; n < NB; n++) {
    pf[n >> 1][(n & 1) * 2] = pack2<BF>(s[n][0], s[n][1]);
    pf[n >> 1][(n & 1) * 2 + 1] = pack2<BF>(s[n][2], s[n][3]);
  }
}

// flash_attn_wg with the two GEMMs of a warpgroup overlapped (FlashAttention-3's intra-warpgroup
// pipelining): each step issues S = Q·K_j and O += P_(j-1)·V_(j-1) together, runs the softmax
// of S_j while the second is on the tensor cores, and only then rescales O. V_(j-1) and K_j are
// in use while tile j+1 loads, so three stages of K and V (192 KiB). Each warp copies whole
// 128-byte swizzled rows, 512 bytes of shared memory a pass, so the copies do not conflict on
// banks. Each operand is two 64-column halves of 16 KiB (atoms of 8 rows of 128 bytes, row i's
// 16-byte chunks XORed with i). K: SBO 1 KiB (the next 8 keys), LBO unused, 32 bytes a k-step;
// V: LBO 16 KiB (the next 64 dims), SBO 1 KiB (the next 8 keys); the other order gave garbage
// on the H200 (docs/gpu-runs.md run 58). The swizzle is most of the gain over flash_attn_wg.
template <bool BF, int D, int BN> __device__ void flash_attn_wgs(const u16* q, const u16* k, const u16* v, u16* o,
                                                    int len, int heads, int kvh, float scale_log2) {
  constexpr int NT = 256, TILE = BN * D, STAGES = 3;
  static_assert(D == 128 && BN == 128, "both GEMMs are wgmma m64n128k16");
  extern __shared__ __align__(128) u16 smem[];
  const unsigned sm0 = (smem_u32(smem) + 1023) & ~1023u;  // swizzle atoms on 1 KiB boundaries
  const int h = blockIdx.x;
  const int tile = gridDim.y - 1 - blockIdx.y;  // the longest (diagonal-most) tiles first
  const int q0 = tile * 128;
  const int kh = h / (heads / kvh);
  const long long qw = (long long)heads * D, kw = (long long)kvh * D;
  const int wg = threadIdx.x >> 7, wid = threadIdx.x >> 5, warp = wid & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wq = q0 + wg * 64;
  const int r0 = wq + warp * 16 + g, r1 = r0 + 8;
  constexpr int CH = D / 8, RS = NT / CH, PASSES = BN / RS;
  // Warp w copies rows 8 * (w / 4) + (lane % 8) (+ 16 a pass) and chunks 4 * (w % 4) + lane / 8.
  const int lr = (wid >> 2) * 8 + (lane & 7), lc = (wid & 3) * 4 + (lane >> 3);
  const unsigned soff = (lc >> 3) * (BN * 128) + lr * 128 + (((lc & 7) ^ (lr & 7)) * 16);
  constexpr unsigned pass_bytes = RS * 128;
  const u16* kt = k + kh * D + (long long)lr * kw + lc * 8;
  const u16* vt = v + kh * D + (long long)lr * kw + lc * 8;
  auto load = [&](int buf, int k0) {
#pragma unroll
    for (int u = 0; u < PASSES; u++) {
      const bool in = k0 + lr + u * RS < len;
      const long long off = in ? (long long)(k0 + u * RS) * kw : 0;
      const unsigned d = sm0 + buf * 4 * TILE + soff + u * pass_bytes;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(kt + off), "r"(in ? 16 : 0));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d + TILE * 2), "l"(vt + off), "r"(in ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;");
  };
  const int qend = q0 + 128 < len ? q0 + 128 : len;
  const int ntiles = (qend + BN - 1) / BN;
  load(0, 0);
  if (ntiles > 1) load(1, BN); else asm volatile("cp.async.commit_group;");

  unsigned qf[D / 16][4];
  float of[D / 8][4], m0, m1, l0, l1, a0, a1;
  fa_start<D>(qf, of, m0, m1, l0, l1, q, qw, h, r0, r1, t, len);
  float s[BN / 8][4];
  unsigned pf[BN / 16][4];
  auto qk = [&](int stage) { fa_qk_sw<BF, D, BN>(s, qf, sm0 + stage * 4 * TILE); };
  auto pv = [&](int stage) { fa_pv_sw<BF, D, BN>(of, pf, sm0 + stage * 4 * TILE + TILE * 2); };
  auto pack = [&]() { fa_pack<BF, BN / 8>(pf, s); };

  asm volatile("cp.async.wait_group 1;");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async writes → wgmma reads
  __syncthreads();
  qk(0);
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_keep<BN / 2>(&s[0][0]);
  fa_softmax_p<BN / 8>(s, m0, m1, l0, l1, a0, a1, true, 0, r0, r1, t, len, scale_log2);
  pack();
  for (int j = 1; j < ntiles; j++) {
    const int k0 = j * BN;
    asm volatile("cp.async.wait_group 0;");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();  // every warp is past step j-1: the stage of tile j-2 is free
    if (j + 1 < ntiles) load((j + 1) % STAGES, k0 + BN);
    qk(j % STAGES);
    pv((j - 1) % STAGES);
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    wg_keep<BN / 2>(&s[0][0]);
    const bool edge = k0 + BN > wq + warp * 16 || k0 + BN > len;
    fa_softmax_p<BN / 8>(s, m0, m1, l0, l1, a0, a1, edge, k0, r0, r1, t, len, scale_log2);
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_keep<D / 2>(&of[0][0]);
    wg_keep_u<BN / 4>(&pf[0][0]);
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
      of[i][0] *= a0; of[i][1] *= a0; of[i][2] *= a1; of[i][3] *= a1;
    }
    pack();
  }
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  pv((ntiles - 1) % STAGES);
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_keep<D / 2>(&of[0][0]);
  wg_keep_u<BN / 4>(&pf[0][0]);
  asm volatile("cp.async.wait_group 0;");

  fa_store_o<BF, D>(o, of, l0, l1, qw, h, r0, r1, t, len);
}

#define FA_WGS_INST(NAME, D, BN) FA_EXPORT(NAME, 256, 1, flash_attn_wgs, D, BN)
FA_WGS_INST(flash_attn_d128_wgs, 128, 128)

// mbarrier helpers (shared::cta): initialise with an expected arrival count, arrive, wait for
// the completion of the phase of the given parity, and the arrival made when this thread's
// earlier cp.async copies land (one of the expected arrivals).
__device__ __forceinline__ void mb_init(unsigned b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(b), "r"(count) : "memory");
}
__device__ __forceinline__ void mb_arrive(unsigned b) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(b) : "memory");
}
__device__ __forceinline__ void mb_arrive_cp(unsigned b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(b) : "memory");
}
__device__ __forceinline__ void mb_wait(unsigned b, unsigned parity) {
  asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W; }"
               :: "r"(b), "r"(parity) : "memory");
}

// flash_attn_wgs made warp-specialized (FlashAttention-3's structure): warpgroups 0 and 1 are
// consumers of 64 query rows each, warpgroup 2 is a producer that only copies K and V tiles.
// - The producer copies each 128-key tile into its stage (three K stages, four V stages, the
//   128-byte swizzled layout of flash_attn_wgs) with cp.async; each copy arrives on the stage's
//   "full" mbarrier when it lands. It waits on the stage's "empty" mbarrier (one arrival per
//   consumer warp) before reusing it, so it runs up to two tiles ahead with no block-wide
//   barrier. It keeps PREG registers and gives the rest to the consumers (setmaxnreg, CREG).
// - The consumers take turns issuing their GEMMs (named barriers 1 and 2, ping-pong): one
//   warpgroup's softmax runs while the other's S = Q·K_j and O += P_(j-1)·V_(j-1) hold the
//   tensor cores. A wgmma issue only returns once the tensor cores have taken most of its work,
//   so in flash_attn_wgs (both warpgroups in step, a block barrier per tile) the tensor cores
//   sat idle through every softmax; here they idle far less (docs/gpu-runs.md run 63).
template <bool BF, int D, int PREG, int CREG> __device__ void flash_attn_ws(const u16* q, const u16* k, const u16* v, u16* o,
                                                    int len, int heads, int kvh, float scale_log2) {
  constexpr int BN = 128, NTP = 128, TILE = BN * D, KS = 3, VS = 4;
  static_assert(D == 128, "both GEMMs are wgmma m64n128k16");
  extern __shared__ __align__(128) u16 smem[];
  __shared__ __align__(8) unsigned long long bars[2 * (KS + VS)];
  const unsigned sm0 = (smem_u32(smem) + 1023) & ~1023u;  // swizzle atoms on 1 KiB boundaries
  const unsigned kfull = smem_u32(bars), kempty = kfull + 8 * KS, vfull = kempty + 8 * KS, vempty = vfull + 8 * VS;
  if (threadIdx.x == 0) {
    for (int i = 0; i < KS; i++) { mb_init(kfull + 8 * i, NTP); mb_init(kempty + 8 * i, 8); }
    for (int i = 0; i < VS; i++) { mb_init(vfull + 8 * i, NTP); mb_init(vempty + 8 * i, 8); }
  }
  __syncthreads();
  const int h = blockIdx.x;
  const int tile = gridDim.y - 1 - blockIdx.y;  // the longest (diagonal-most) tiles first
  const int q0 = tile * 128;
  const int kh = h / (heads / kvh);
  const long long qw = (long long)heads * D, kw = (long long)kvh * D;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const unsigned kbase = sm0, vbase = sm0 + KS * TILE * 2;
  const int qend = q0 + 128 < len ? q0 + 128 : len;
  const int n = (qend + BN - 1) / BN;  // both consumers need every tile up to the diagonal
  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(PREG));
    // Warp w copies rows lane % 8 (+ 8 a pass) and chunks 4 * w + lane / 8: whole 128-byte
    // swizzled rows, so the shared-memory writes do not conflict on banks.
    constexpr int CH = D / 8, RS = NTP / CH, PASSES = BN / RS;
    const int lr = lane & 7, lc = warp * 4 + (lane >> 3);
    const unsigned soff = (lc >> 3) * (BN * 128) + lr * 128 + (((lc & 7) ^ (lr & 7)) * 16);
    const u16* kt = k + kh * D + (long long)lr * kw + lc * 8;
    const u16* vt = v + kh * D + (long long)lr * kw + lc * 8;
    auto load = [&](const u16* src, unsigned dst, unsigned full, int j) {  // rows past `len` zero-filled
      const int k0 = j * BN;
#pragma unroll
      for (int u = 0; u < PASSES; u++) {
        const bool in = k0 + lr + u * RS < len;
        const long long off = in ? (long long)(k0 + u * RS) * kw : 0;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst + soff + u * RS * 128), "l"(src + off), "r"(in ? 16 : 0));
      }
      mb_arrive_cp(full);
    };
    for (int j = 0; j < n; j++) {
      if (j >= KS) mb_wait(kempty + 8 * (j % KS), ((j / KS) - 1) & 1);
      load(kt, kbase + (j % KS) * TILE * 2, kfull + 8 * (j % KS), j);
      if (j >= VS) mb_wait(vempty + 8 * (j % VS), ((j / VS) - 1) & 1);
      load(vt, vbase + (j % VS) * TILE * 2, vfull + 8 * (j % VS), j);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(CREG));
  const int wq = q0 + wg * 64;
  const int r0 = wq + warp * 16 + g, r1 = r0 + 8;
  const bool leader = lane == 0;  // one arrival a warp on the empty barriers
  unsigned qf[D / 16][4];
  float of[D / 8][4], m0, m1, l0, l1, a0, a1;
  fa_start<D>(qf, of, m0, m1, l0, l1, q, qw, h, r0, r1, t, len);
  float s[BN / 8][4];
  unsigned pf[BN / 16][4];
  auto qk = [&](int j) { fa_qk_sw<BF, D, BN>(s, qf, kbase + (j % KS) * TILE * 2); };
  auto pv = [&](int j) { fa_pv_sw<BF, D, BN>(of, pf, vbase + (j % VS) * TILE * 2); };
  auto pack = [&]() { fa_pack<BF, BN / 8>(pf, s); };
  // Turns: warpgroup w issues after barrier 1 + w, then hands the turn to the other. The
  // second warpgroup opens the first turn and does not hand over its last (no arrival is left
  // pending at exit).
  const int mine = 1 + wg, other = 2 - wg;
  if (wg == 1) asm volatile("bar.arrive %0, 256;" :: "r"(other) : "memory");
  auto turn_begin = [&]() { asm volatile("bar.sync %0, 256;" :: "r"(mine) : "memory"); };
  auto turn_end = [&](bool last) {
    if (!(last && wg == 1)) asm volatile("bar.arrive %0, 256;" :: "r"(other) : "memory");
  };
  // The first tile: S only. Kept out of the loop so that every wgmma wait in the loop has one
  // shape (a conditional wait makes ptxas serialize the wgmmas).
  mb_wait(kfull, 0);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async writes → wgmma reads
  turn_begin();
  qk(0);
  turn_end(false);
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_keep<BN / 2>(&s[0][0]);
  if (leader) mb_arrive(kempty);
  fa_softmax_p<BN / 8>(s, m0, m1, l0, l1, a0, a1, true, 0, r0, r1, t, len, scale_log2);
  pack();
  for (int j = 1; j < n; j++) {
    const int k0 = j * BN;
    mb_wait(kfull + 8 * (j % KS), (j / KS) & 1);
    mb_wait(vfull + 8 * ((j - 1) % VS), ((j - 1) / VS) & 1);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    turn_begin();
    qk(j);
    pv(j - 1);
    turn_end(false);
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    wg_keep<BN / 2>(&s[0][0]);
    if (leader) mb_arrive(kempty + 8 * (j % KS));
    const bool edge = k0 + BN > wq + warp * 16 || k0 + BN > len;
    fa_softmax_p<BN / 8>(s, m0, m1, l0, l1, a0, a1, edge, k0, r0, r1, t, len, scale_log2);
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_keep<D / 2>(&of[0][0]);
    wg_keep_u<BN / 4>(&pf[0][0]);
    if (leader) mb_arrive(vempty + 8 * ((j - 1) % VS));
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
      of[i][0] *= a0; of[i][1] *= a0; of[i][2] *= a1; of[i][3] *= a1;
    }
    pack();
  }
  mb_wait(vfull + 8 * ((n - 1) % VS), ((n - 1) / VS) & 1);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  turn_begin();
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  pv(n - 1);
  turn_end(true);
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_keep<D / 2>(&of[0][0]);
  wg_keep_u<BN / 4>(&pf[0][0]);

  fa_store_o<BF, D>(o, of, l0, l1, qw, h, r0, r1, t, len);
}

// Three warpgroups; the producer keeps 40 registers and the consumers take 232 (128 × 40 +
// 256 × 232 ≤ 64 Ki). Fewer for the producer spill more (24: 156 bytes).
#define FA_WS_INST(NAME, D, PREG, CREG) FA_EXPORT(NAME, 384, 1, flash_attn_ws, D, PREG, CREG)
FA_WS_INST(flash_attn_d128_ws, 128, 40, 232)

#define FA_WG_INST(NAME, D, WG, BN, MINB) FA_EXPORT(NAME, WG * 128, MINB, flash_attn_wg, D, WG, BN)
// Two warpgroups (128-query tiles), 128-key tiles: the fastest of those measured (docs/gpu-runs.md
// runs 11-13: 64-key tiles, one warpgroup per block and the rescale skip were slower).
FA_WG_INST(flash_attn_d128_wg, 128, 2, 128, 1)
"#;

// ----- OPT and bitsandbytes 4-bit (compiled with SOURCE, after it) -----

/// OPT and 4-bit kernels instantiated for both 16-bit types.
pub(crate) const OPT_BNB_TYPED: &[&str] = &["layer_norm", "relu", "add_out", "bnb4_dequant"];

/// OPT and 4-bit kernels with no 16-bit template parameter.
pub(crate) const OPT_BNB_UNTYPED: &[&str] =
    &["bnb4_nested_absmax", "bnb4_dequant_f32", "convert_float"];

/// Appended to `SOURCE` (uses its `F16`, `BF16`, `block_sum` and `INST`).
pub(crate) const OPT_BNB_SOURCE: &str = r#"
// nn.LayerNorm: (x - mean) * rsqrt(var + eps) * w + b, statistics in f32, one block a row.
template <class T> __device__ void layer_norm(const u16* x, const u16* w, const u16* b, u16* out, int cols, float eps) {
  __shared__ float sh[32];
  const u16* row = x + (long long)blockIdx.x * cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += T::ld(row[c]);
  float mean = block_sum(s, sh) / cols;
  float q = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) { float d = T::ld(row[c]) - mean; q += d * d; }
  float inv = rsqrtf(block_sum(q, sh) / cols + eps);
  u16* o = out + (long long)blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    o[c] = T::st((T::ld(row[c]) - mean) * inv * T::ld(w[c]) + T::ld(b[c]));
}

template <class T> __device__ void relu(const u16* x, u16* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = T::st(fmaxf(T::ld(x[i]), 0.f));
}

template <class T> __device__ void add_out(const u16* a, const u16* b, u16* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = T::st(T::ld(a[i]) + T::ld(b[i]));
}

// bitsandbytes kDequantizeBlockwise for NF4 (its table) and FP4 (dDequantizeFP4Tree's
// constants, c * absmax * sign); absmax indexed by element / blocksize (ops.cu L86).
__device__ __forceinline__ float bnb4_value(int q, float a, int fp4) {
  if (!fp4) return NF4[q] * a;
  const float mag[8] = {0.0f, 5.208333333e-03f, 0.66666667f, 1.0f, 0.33333333f, 0.5f, 0.16666667f, 0.25f};
  float sign = (q & 8) ? -1.0f : 1.0f;
  return mag[q & 7] * a * sign;
}

template <class T> __device__ void bnb4_dequant(const u8* packed, const float* absmax, u16* out, long long n, int blocksize, int fp4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    u8 b = packed[i >> 1];
    int q = (i & 1) ? (b & 15) : (b >> 4);
    out[i] = T::st(bnb4_value(q, absmax[i / blocksize], fp4));
  }
}

INST(layer_norm, (const u16* x, const u16* w, const u16* b, u16* o, int cols, float eps), (x, w, b, o, cols, eps))
INST(relu, (const u16* x, u16* o, long long n), (x, o, n))
INST(add_out, (const u16* a, const u16* b, u16* o, long long n), (a, b, o, n))
INST(bnb4_dequant, (const u8* p, const float* a, u16* o, long long n, int bs, int fp4), (p, a, o, n, bs, fp4))

extern "C" __global__ void bnb4_dequant_f32(const u8* packed, const float* absmax, float* out, long long n, int blocksize, int fp4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    u8 b = packed[i >> 1];
    int q = (i & 1) ? (b & 15) : (b >> 4);
    out[i] = bnb4_value(q, absmax[i / blocksize], fp4);
  }
}

// Double-quantized absmax back to f32: dequantize_blockwise (code[q] * nested_absmax[i / nb])
// then `absmax += offset` (offset a device scalar).
extern "C" __global__ void bnb4_nested_absmax(const u8* q, const float* nabs, const float* code, const float* offset, float* out, long long n, int nb) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = code[q[i]] * nabs[i / nb] + offset[0];
}

// x.to(dtype) between float types: kinds 0 = f16, 1 = bf16, 2 = f32.
extern "C" __global__ void convert_float(const void* x, void* out, long long n, int from, int to) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float v = from == 2 ? ((const float*)x)[i] : from == 1 ? BF16::ld(((const u16*)x)[i]) : F16::ld(((const u16*)x)[i]);
    if (to == 2) ((float*)out)[i] = v;
    else ((u16*)out)[i] = to == 1 ? BF16::st(v) : F16::st(v);
  }
}
"#;

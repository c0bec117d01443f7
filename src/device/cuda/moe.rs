//! The fused MoE's math on the GPU, inside vLLM 0.8.5's own buffers: the tokens' expert slots
//! sorted by expert into `sorted_ids` (each expert's run padded to `BLOCK_SIZE_M`, the
//! padding marked `M·k`, as `moe_align_block_size` lays them out) with `expert_ids` naming each
//! block's expert; a grouped GEMM on the tensor cores that gathers its rows through them and
//! writes each slot's row of `intermediate_cache1` (then of cache3, the routing weight applied
//! to the f32 sum before rounding, as the Triton kernel's `MUL_ROUTED_WEIGHT`);
//! `silu_and_mul` from cache1 into cache2; and `moe_sum` of each token's k rows into the
//! block's input. Nothing here allocates.

use cudarc::driver::LaunchConfig;

use super::CudaDevice;
use crate::base::error::Result;
use crate::device::tensor::{DType, TensorData};

/// The elementwise MoE kernels, instantiated for both 16-bit types (in `kernels::SOURCE`'s
/// module).
pub(crate) const TYPED: &[&str] = &[
    "moe_silu_mul",
    "moe_sum",
    "moe_topk_softmax",
    "moe_topk_softmax_w",
    "moe_sigmoid",
    "moe_row_scale",
];

/// The f32 routing kernels (in the same module, no 16-bit type).
pub(crate) const UNTYPED: &[&str] = &["moe_renorm"];

/// Appended to `kernels::SOURCE` (uses its `F16`, `BF16` and `INST`).
pub(crate) const SOURCE: &str = r#"
// cache2[r, j] = silu(cache1[r, j]) * cache1[r, i + j], the silu rounded to T first (vLLM's
// silu_and_mul: its act_and_mul_kernel rounds ACT_FN's result to scalar_t).
template <class T> __device__ void moe_silu_mul(const u16* c1, u16* c2, long long rows, int i) {
  for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < rows * i;
       x += (long long)gridDim.x * blockDim.x) {
    long long r = x / i;
    int j = (int)(x % i);
    float g = T::ld(c1[r * 2 * i + j]);
    float u = T::ld(c1[r * 2 * i + i + j]);
    c2[x] = T::st(T::ld(T::st(g / (1.f + __expf(-g)))) * u);
  }
}

// x[t, c] = the sum of the token's k rows of cache3. vLLM's moe_sum (csrc/moe/moe_align_sum_kernels.cu
// at 0.8.5) adds in the 16-bit type for k = 2, 3, 4 (each partial sum rounded) and hands larger
// k to at::sum_out, which accumulates in f32 and rounds once.
template <class T> __device__ void moe_sum(const u16* c3, u16* x, long long m, int k, int h) {
  for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < m * h;
       q += (long long)gridDim.x * blockDim.x) {
    long long t = q / h;
    int c = (int)(q % h);
    float s = 0.f;
    for (int j = 0; j < k; j++) {
      s += T::ld(c3[(t * k + j) * h + c]);
      if (k <= 4) s = T::ld(T::st(s));
    }
    x[q] = T::st(s);
  }
}

// The router's top-k on the GPU, one thread a token: the logits to f32 (into `gating`, the
// `gating_output.float()` copy, when it is not null), softmax in f32, the k largest by
// probability with ties to the lower expert index (topk_softmax's "lower indices win"), each
// weight the probability over the row's sum; `renorm` divides the k weights by their sum (in
// order), as `ops_moe::host_topk` and `host_renormalize` do on the host.
template <class T> __device__ void moe_topk_softmax(const u16* logits, float* gating, float* w,
    int* ids, long long m, int e, int k, int renorm) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < m;
       r += (long long)gridDim.x * blockDim.x) {
    const u16* row = logits + r * e;
    float mx = __int_as_float(0xff800000);
    for (int j = 0; j < e; j++) {
      float v = T::ld(row[j]);
      if (gating) gating[r * e + j] = v;
      mx = fmaxf(mx, v);
    }
    float sum = 0.f;
    for (int j = 0; j < e; j++) sum += expf(T::ld(row[j]) - mx);
    float pv = __int_as_float(0x7f800000), tot = 0.f;
    int pi = -1;
    for (int q = 0; q < k; q++) {
      float bv = -1.f;
      int bi = -1;
      for (int j = 0; j < e; j++) {
        float v = expf(T::ld(row[j]) - mx);
        bool after = v < pv || (v == pv && j > pi);
        if (after && (v > bv || bi < 0)) { bv = v; bi = j; }
      }
      pv = bv;
      pi = bi;
      float x = bv / sum;
      w[r * k + q] = x;
      ids[r * k + q] = bi;
      tot += x;
    }
    if (renorm) for (int q = 0; q < k; q++) w[r * k + q] = w[r * k + q] / tot;
  }
}

// moe_topk_softmax with one warp a token (e <= 256: lane l holds experts l, l + 32, ...), 8
// tokens a block of 256 threads: the maximum and the sum by warp reductions, then k rounds
// of the largest remaining probability, ties to the lower expert index.
template <class T> __device__ void moe_topk_softmax_w(const u16* logits, float* gating, float* w,
    int* ids, long long m, int e, int k, int renorm) {
  const long long r = blockIdx.x * 8LL + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= m) return;
  const u16* row = logits + r * e;
  const float NEG = __int_as_float(0xff800000);
  float v[8];
  float mx = NEG;
#pragma unroll
  for (int q = 0; q < 8; q++) {
    const int j = lane + 32 * q;
    v[q] = j < e ? T::ld(row[j]) : NEG;
    if (j < e && gating) gating[r * e + j] = v[q];
    mx = fmaxf(mx, v[q]);
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
#pragma unroll
  for (int q = 0; q < 8; q++) {
    v[q] = lane + 32 * q < e ? expf(v[q] - mx) : -1.f;
    sum += v[q] > 0.f ? v[q] : 0.f;
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  float tot = 0.f;
  for (int q = 0; q < k; q++) {
    // This lane's best (the first of equals is the lower index), then the warp's.
    float bv = -1.f;
    int bi = 0x7fffffff;
#pragma unroll
    for (int u = 0; u < 8; u++)
      if (v[u] > bv) { bv = v[u]; bi = lane + 32 * u; }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if ((bi & 31) == lane) v[bi >> 5] = -1.f;
    const float x = bv / sum;
    tot += x;
    if (lane == 0) { w[r * k + q] = x; ids[r * k + q] = bi; }
  }
  if (renorm && lane == 0) for (int q = 0; q < k; q++) w[r * k + q] = w[r * k + q] / tot;
}

// Qwen2-MoE's shared-expert gate: sig = sigmoid(gate) in f32, rounded to T (`F.sigmoid` of the
// [M, 1] logits into a new tensor).
template <class T> __device__ void moe_sigmoid(const u16* g, u16* sig, long long m) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < m; r += (long long)gridDim.x * blockDim.x)
    sig[r] = T::st(1.f / (1.f + expf(-T::ld(g[r]))));
}

// out[r, c] = sig[r] * x[r, c], rounded to T (the [M, 1] sigmoid broadcast over the shared
// expert's [M, H] output, into a new tensor).
template <class T> __device__ void moe_row_scale(const u16* sig, const u16* x, u16* out, long long m, int h) {
  for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < m * h; q += (long long)gridDim.x * blockDim.x)
    out[q] = T::st(T::ld(sig[q / h]) * T::ld(x[q]));
}

// Each row of k weights divided by its sum, into `out` (vLLM 0.8's renormalisation into a new
// tensor).
extern "C" __global__ void moe_renorm(const float* w, float* out, long long m, int k) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < m;
       r += (long long)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int q = 0; q < k; q++) s += w[r * k + q];
    for (int q = 0; q < k; q++) out[r * k + q] = w[r * k + q] / s;
  }
}

INST(moe_topk_softmax, (const u16* logits, float* gating, float* w, int* ids, long long m, int e, int k, int renorm), (logits, gating, w, ids, m, e, k, renorm))
INST(moe_topk_softmax_w, (const u16* logits, float* gating, float* w, int* ids, long long m, int e, int k, int renorm), (logits, gating, w, ids, m, e, k, renorm))
INST(moe_sigmoid, (const u16* g, u16* sig, long long m), (g, sig, m))
INST(moe_row_scale, (const u16* sig, const u16* x, u16* out, long long m, int h), (sig, x, out, m, h))
INST(moe_silu_mul, (const u16* c1, u16* c2, long long rows, int i), (c1, c2, rows, i))
INST(moe_sum, (const u16* c3, u16* x, long long m, int k, int h), (c3, x, m, k, h))
"#;

/// The grouped GEMMs, `moe_gemm{16,64,64w,64x,64y}_{f16,bf16}` (64 rows by 128 outputs a
/// thread block: `64w` on 8 warps of 32 × 32, `64x` on 4 warps of 32 × 64, `64y` on 2 warps of
/// 64 × 64; the others 64 outputs on 4 warps), in the tensor-core module.
pub(crate) const GEMM_NAMES: &[&str] = &[
    "moe_gemm16",
    "moe_gemm64",
    "moe_gemm64w",
    "moe_gemm64x",
    "moe_gemm64y",
];

/// Appended to `kernels::FLASH_SOURCE` (uses its `smem_u32`, `mma16816` and `pack2`), which is
/// built for compute capability 8.0 and later only.
pub(crate) const GEMM_SOURCE: &str = r#"
// C[id, c] = A[id / a_div, :] . W[e, c, :] (times scale[id] when scale is set, on the f32 sum),
// for the BM sorted slots of tile blockIdx.y (ids >= total are padding and write nothing) and
// the BN outputs from blockIdx.x * BN; e = experts[tile * BM / block_m] (BM divides block_m).
// W is [E, n, k] row-major. NW warps; 32 inputs a step through cp.async in ST stages;
// mma.sync m16n8k16 with f32 accumulators. k must be a multiple of 8, n even.
template <bool BF, int BM, int BN, int NW, int ST, int WM>
__device__ void moe_gemm_t(const u16* A, const int* sorted, const int* experts, int block_m, int a_div, const u16* W,
                           u16* C, const float* scale, int n, int k, int total) {
  constexpr int BK = 32, LD = BK + 8, NT = NW * 32;
  constexpr int WN = NW / WM;
  constexpr int MI = BM / WM / 16, NJ = BN / WN / 8;
  __shared__ __align__(16) u16 as[ST][BM * LD];
  __shared__ __align__(16) u16 bs[ST][BN * LD];
  __shared__ int rows[BM];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp / WN, wn = warp % WN;
  const int mi = lane >> 3, mr = lane & 7;
  const int tile0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const u16* We = W + (long long)experts[tile0 / block_m] * n * k;
  for (int r = tid; r < BM; r += NT) rows[r] = sorted[tile0 + r];
  __syncthreads();
  const int nk = (k + BK - 1) / BK;

  float acc[MI][NJ][4];
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  // The tile's gathered rows and the expert's BN weight rows, inputs [k0, k0 + 32), in 16-byte
  // chunks; padding slots, rows past n and inputs past k read as zero.
  auto load = [&](int buf, int k0) {
    for (int i = tid; i < BM * 4; i += NT) {
      int r = i >> 2, c = (i & 3) * 8, id = rows[r];
      bool ok = id < total && k0 + c < k;
      const u16* s = A + (ok ? (long long)(id / a_div) * k + k0 + c : 0);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_u32(&as[buf][r * LD + c])), "l"(s),
                   "r"(ok ? 16 : 0));
    }
    for (int i = tid; i < BN * 4; i += NT) {
      int r = i >> 2, c = (i & 3) * 8;
      bool ok = n0 + r < n && k0 + c < k;
      const u16* s = We + (ok ? (long long)(n0 + r) * k + k0 + c : 0);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_u32(&bs[buf][r * LD + c])), "l"(s),
                   "r"(ok ? 16 : 0));
    }
  };

  // ST - 1 steps in flight: step kt + ST - 1 is loaded into the buffer step kt - 1 used, after
  // the barrier that ends every warp's reads of it.
#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s < nk) load(s, s * BK);
    asm volatile("cp.async.commit_group;");
  }
  for (int kt = 0; kt < nk; kt++) {
    const int buf = kt % ST;
    asm volatile("cp.async.wait_group %0;" :: "n"(ST - 2));
    __syncthreads();
    if (kt + ST - 1 < nk) load((kt + ST - 1) % ST, (kt + ST - 1) * BK);
    asm volatile("cp.async.commit_group;");
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      unsigned af[MI][4];
#pragma unroll
      for (int i = 0; i < MI; i++) {
        const u16* src = &as[buf][(wm * MI * 16 + i * 16 + (mi & 1) * 8 + mr) * LD + kk * 16 + (mi >> 1) * 8];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3]) : "r"(smem_u32(src)));
      }
#pragma unroll
      for (int nn = 0; nn < NJ; nn += 2) {
        unsigned b0, b1, b2, b3;
        const u16* src = &bs[buf][(wn * NJ * 8 + (nn + (mi >> 1)) * 8 + mr) * LD + kk * 16 + (mi & 1) * 8];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(smem_u32(src)));
#pragma unroll
        for (int i = 0; i < MI; i++) {
          mma16816<BF>(acc[i][nn], af[i], b0, b1);
          mma16816<BF>(acc[i][nn + 1], af[i], b2, b3);
        }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;");

#pragma unroll
  for (int i = 0; i < MI; i++) {
    const int r = wm * MI * 16 + i * 16 + g;
    const int id0 = rows[r], id1 = rows[r + 8];
    const float s0 = (scale && id0 < total) ? scale[id0] : 1.f;
    const float s1 = (scale && id1 < total) ? scale[id1] : 1.f;
#pragma unroll
    for (int nn = 0; nn < NJ; nn++) {
      const int c = n0 + wn * NJ * 8 + nn * 8 + 2 * t;
      if (c >= n) continue;
      if (id0 < total) *(unsigned*)(C + (long long)id0 * n + c) = pack2<BF>(acc[i][nn][0] * s0, acc[i][nn][1] * s0);
      if (id1 < total) *(unsigned*)(C + (long long)id1 * n + c) = pack2<BF>(acc[i][nn][2] * s1, acc[i][nn][3] * s1);
    }
  }
}

#define MOE_GEMM_EXPORT(NAME, BF, BM, BN, NW, ST, WM) \
  extern "C" __global__ void __launch_bounds__(NW * 32) NAME(const u16* A, const int* sorted, const int* experts, \
      int block_m, int a_div, const u16* W, u16* C, const float* scale, int n, int k, int total) \
  { moe_gemm_t<BF, BM, BN, NW, ST, WM>(A, sorted, experts, block_m, a_div, W, C, scale, n, k, total); }
MOE_GEMM_EXPORT(moe_gemm16_f16, false, 16, 64, 4, 2, 1)
MOE_GEMM_EXPORT(moe_gemm16_bf16, true, 16, 64, 4, 2, 1)
MOE_GEMM_EXPORT(moe_gemm64_f16, false, 64, 64, 4, 2, 2)
MOE_GEMM_EXPORT(moe_gemm64_bf16, true, 64, 64, 4, 2, 2)
MOE_GEMM_EXPORT(moe_gemm64w_f16, false, 64, 128, 8, 3, 2)
MOE_GEMM_EXPORT(moe_gemm64w_bf16, true, 64, 128, 8, 3, 2)
MOE_GEMM_EXPORT(moe_gemm64x_f16, false, 64, 128, 4, 3, 2)
MOE_GEMM_EXPORT(moe_gemm64x_bf16, true, 64, 128, 4, 3, 2)
MOE_GEMM_EXPORT(moe_gemm64y_f16, false, 64, 128, 2, 3, 1)
MOE_GEMM_EXPORT(moe_gemm64y_bf16, true, 64, 128, 2, 3, 1)
"#;

/// The Hopper grouped GEMMs on warpgroup MMA (in the `compute_90a` module only) and their
/// dynamic shared memory: `moe_gemm_wg{1,2}` (one or two warpgroups of 128 outputs on one
/// 64-row block) and `moe_gemm_wgp` (two 64-row blocks by 256 outputs). Each has
/// `WGMMA_STAGES` stages of its A rows and weight rows, 64 inputs (128 bytes) a row, and 1 KiB
/// to align the swizzle atoms.
pub(crate) const WGMMA_GEMMS: &[(&str, usize)] = &[
    ("moe_gemm_wg1", WGMMA_STAGES * (64 + 128) * 128 + 1024),
    ("moe_gemm_wg2", WGMMA_STAGES * (64 + 256) * 128 + 1024),
    ("moe_gemm_wgp", WGMMA_STAGES * (128 + 256) * 128 + 1024),
];
const WGMMA_STAGES: usize = 4;

/// Appended to `kernels::WGMMA_SOURCE` (uses its `sw128_desc`, and `FLASH_SOURCE`'s
/// `smem_u32` and `pack2`).
pub(crate) const WGMMA_GEMM_SOURCE: &str = r#"
// wgmma m64n128k16 with both operands through shared-memory descriptors (K-major).
#define WGMMA_SS_M64N128K16(TY) \
  asm volatile("{ wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0; }" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "l"(da), "l"(db))
template <bool BF> __device__ __forceinline__ void wgmma_ss_m64n128k16(float* d, unsigned long long da, unsigned long long db) {
  if (BF) WGMMA_SS_M64N128K16("bf16"); else WGMMA_SS_M64N128K16("f16");
}

// moe_gemm_t on Hopper's warpgroup MMA: the 64 sorted slots of tile blockIdx.y (one expert's
// run, BLOCK_SIZE_M a multiple of 64) against the WG * 128 weight rows from blockIdx.x * WG *
// 128; warpgroup w owns outputs [w * 128, w * 128 + 128) of the block, with 64 f32 accumulators a
// thread. Each stage holds the gathered A rows (64 × 64 inputs) and the weight rows (WG * 128 ×
// 64), 128 bytes a row, loaded with cp.async into the 128-byte swizzled layout (atoms of 8 rows
// on 1 KiB boundaries, row i's 16-byte chunks XORed with i), which both descriptors read: SBO
// 1 KiB (the next 8 rows), 32 bytes a k-step. ST stages; the copies run ST - 2 stages ahead, so
// that the stage they overwrite was read by wgmmas every warpgroup has waited for before the
// barrier. n must be a multiple of WG * 128 and k of 64.
template <bool BF, int WG, int ST>
__device__ void moe_gemm_wg_t(const u16* A, const int* sorted, const int* experts, int block_m, int a_div, const u16* W,
                              u16* C, const float* scale, int n, int k, int total) {
  constexpr int NT = WG * 128, RP = NT / 8, AP = 64 / RP, BP = WG * 128 / RP;
  constexpr unsigned A_BYTES = 64 * 128, STAGE = A_BYTES + WG * 128 * 128;
  extern __shared__ __align__(128) unsigned char wg_smem[];
  __shared__ int rows[64];
  const unsigned sm0 = (smem_u32(wg_smem) + 1023) & ~1023u;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int tile0 = blockIdx.y * 64, n0 = blockIdx.x * WG * 128;
  const u16* We = W + (long long)experts[tile0 / block_m] * n * k + (long long)n0 * k;
  if (tid < 64) rows[tid] = sorted[tile0 + tid];
  __syncthreads();
  // This thread copies 16-byte chunk c of rows r0, r0 + RP, ... of each operand.
  const int c = tid & 7, r0 = tid >> 3;
  const u16* asrc[AP];
  bool aok[AP];
#pragma unroll
  for (int p = 0; p < AP; p++) {
    const int id = rows[r0 + p * RP];
    aok[p] = id < total;
    asrc[p] = A + (aok[p] ? (long long)(id / a_div) * k : 0) + c * 8;
  }
  const unsigned sw = (unsigned)(((c ^ (r0 & 7)) << 4) + r0 * 128);  // RP is a multiple of 8
  const u16* bsrc = We + (long long)r0 * k + c * 8;
  const int nk = k / 64;
  auto load = [&](int s, int kt) {
    const unsigned base = sm0 + s * STAGE + sw;
#pragma unroll
    for (int p = 0; p < AP; p++)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(base + p * RP * 128), "l"(asrc[p] + kt * 64),
                   "r"(aok[p] ? 16 : 0));
#pragma unroll
    for (int p = 0; p < BP; p++)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(base + A_BYTES + p * RP * 128),
                   "l"(bsrc + (long long)p * RP * k + kt * 64));
  };

  float d[64];
#pragma unroll
  for (int i = 0; i < 64; i++) d[i] = 0.f;
#pragma unroll
  for (int s = 0; s < ST - 2; s++) {
    if (s < nk) load(s, s);
    asm volatile("cp.async.commit_group;");
  }
  for (int kt = 0; kt < nk; kt++) {
    asm volatile("cp.async.wait_group %0;" :: "n"(ST - 3));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async writes → wgmma reads
    __syncthreads();
    if (kt + ST - 2 < nk) load((kt + ST - 2) % ST, kt + ST - 2);
    asm volatile("cp.async.commit_group;");
    const unsigned a = sm0 + (kt % ST) * STAGE, b = a + A_BYTES + wg * 128 * 128;
    wg_keep<64>(d);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss_m64n128k16<BF>(d, sw128_desc(a + kk * 32, 16, 1024), sw128_desc(b + kk * 32, 16, 1024));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    wg_keep<64>(d);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  wg_keep<64>(d);
  asm volatile("cp.async.wait_group 0;");

  // Thread (warp w, lane 4g + t) holds rows 16w + g and 16w + g + 8, outputs 8j + 2t, 8j + 2t + 1.
  const int warp = (tid >> 5) & 3, g = (tid & 31) >> 2, t = tid & 3;
  const int id0 = rows[warp * 16 + g], id1 = rows[warp * 16 + g + 8];
  const float s0 = (scale && id0 < total) ? scale[id0] : 1.f;
  const float s1 = (scale && id1 < total) ? scale[id1] : 1.f;
  const int cb = n0 + wg * 128 + 2 * t;
#pragma unroll
  for (int j = 0; j < 16; j++) {
    if (id0 < total) *(unsigned*)(C + (long long)id0 * n + cb + 8 * j) = pack2<BF>(d[4 * j] * s0, d[4 * j + 1] * s0);
    if (id1 < total) *(unsigned*)(C + (long long)id1 * n + cb + 8 * j) = pack2<BF>(d[4 * j + 2] * s1, d[4 * j + 3] * s1);
  }
}

#define MOE_GEMM_WG_EXPORT(NAME, BF, WG, ST) \
  extern "C" __global__ void __launch_bounds__(WG * 128) NAME(const u16* A, const int* sorted, const int* experts, \
      int block_m, int a_div, const u16* W, u16* C, const float* scale, int n, int k, int total, int) \
  { moe_gemm_wg_t<BF, WG, ST>(A, sorted, experts, block_m, a_div, W, C, scale, n, k, total); }
MOE_GEMM_WG_EXPORT(moe_gemm_wg1_f16, false, 1, 4)
MOE_GEMM_WG_EXPORT(moe_gemm_wg1_bf16, true, 1, 4)
MOE_GEMM_WG_EXPORT(moe_gemm_wg2_f16, false, 2, 4)
MOE_GEMM_WG_EXPORT(moe_gemm_wg2_bf16, true, 2, 4)
// wgmma m64n256k16 with both operands through shared-memory descriptors (K-major).
#define WGMMA_SS_M64N256K16(TY) \
  asm volatile("{ wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, 0, 0; }" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
               : "l"(da), "l"(db))
template <bool BF> __device__ __forceinline__ void wgmma_ss_m64n256k16(float* d, unsigned long long da, unsigned long long db) {
  if (BF) WGMMA_SS_M64N256K16("bf16"); else WGMMA_SS_M64N256K16("f16");
}
// The grouped GEMM on 128-row tiles: sorted blocks 2y and 2y + 1 (BLOCK_SIZE_M = 64) against
// 256 weight rows from blockIdx.x * 256, warpgroup w on block 2y + w with wgmma m64n256k16 (128
// f32 accumulators a thread). Both warpgroups read one copy of the weight tile when the two
// blocks have one expert, which halves the weights read through L2 against 64-row tiles (the
// bound of moe_gemm_wg_t: each 64-row tile reads its expert's whole n × k). When the blocks
// have two experts the tile runs twice, once a expert, each warpgroup multiplying only in its
// own expert's run. A stage holds the 128 gathered A rows and the 256 weight rows, 64 inputs
// each (48 KiB), in the 128-byte swizzled layout of moe_gemm_wg_t; ST - 2 stages ahead.
template <bool BF, int ST>
__device__ void moe_gemm_wgp_t(const u16* A, const int* sorted, const int* experts, int block_m, int a_div, const u16* W,
                               u16* C, const float* scale, int n, int k, int total, int used) {
  constexpr int NT = 256, RP = NT / 8;
  constexpr unsigned A_BYTES = 128 * 128, STAGE = A_BYTES + 256 * 128;
  extern __shared__ __align__(128) unsigned char wg_smem[];
  __shared__ int rows[128];
  const unsigned sm0 = (smem_u32(wg_smem) + 1023) & ~1023u;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int tile0 = blockIdx.y * 128, n0 = blockIdx.x * 256;
  const bool second = tile0 + 64 < used;
  const int e0 = experts[tile0 / block_m], e1 = second ? experts[(tile0 + 64) / block_m] : e0;
  const int mine = wg ? e1 : e0;
  if (tid < 128) rows[tid] = (tid < 64 || second) ? sorted[tile0 + tid] : total;
  __syncthreads();
  const int c = tid & 7, r0 = tid >> 3;
  const u16* asrc[128 / RP];
  bool aok[128 / RP];
#pragma unroll
  for (int p = 0; p < 128 / RP; p++) {
    const int id = rows[r0 + p * RP];
    aok[p] = id < total;
    asrc[p] = A + (aok[p] ? (long long)(id / a_div) * k : 0) + c * 8;
  }
  const unsigned sw = (unsigned)(((c ^ (r0 & 7)) << 4) + r0 * 128);
  const int nk = k / 64;
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; i++) d[i] = 0.f;

  for (int pass = 0; pass < (e1 != e0 ? 2 : 1); pass++) {
    const int e = pass ? e1 : e0;
    const u16* bsrc = W + (long long)e * n * k + (long long)(n0 + r0) * k + c * 8;
    auto load = [&](int s, int kt) {
      const unsigned base = sm0 + s * STAGE + sw;
#pragma unroll
      for (int p = 0; p < 128 / RP; p++)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(base + p * RP * 128), "l"(asrc[p] + kt * 64),
                     "r"(aok[p] ? 16 : 0));
#pragma unroll
      for (int p = 0; p < 256 / RP; p++)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(base + A_BYTES + p * RP * 128),
                     "l"(bsrc + (long long)p * RP * k + kt * 64));
    };
    __syncthreads();  // the previous pass's reads of every stage are over
#pragma unroll
    for (int s = 0; s < ST - 2; s++) {
      if (s < nk) load(s, s);
      asm volatile("cp.async.commit_group;");
    }
    for (int kt = 0; kt < nk; kt++) {
      asm volatile("cp.async.wait_group %0;" :: "n"(ST - 3));
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
      if (kt + ST - 2 < nk) load((kt + ST - 2) % ST, kt + ST - 2);
      asm volatile("cp.async.commit_group;");
      if (mine == e) {
        const unsigned a = sm0 + (kt % ST) * STAGE + wg * 64 * 128, b = sm0 + (kt % ST) * STAGE + A_BYTES;
        wg_keep<128>(d);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
          wgmma_ss_m64n256k16<BF>(d, sw128_desc(a + kk * 32, 16, 1024), sw128_desc(b + kk * 32, 16, 1024));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        wg_keep<128>(d);
      }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_keep<128>(d);
    asm volatile("cp.async.wait_group 0;");
  }

  const int warp = (tid >> 5) & 3, g = (tid & 31) >> 2, t = tid & 3;
  const int id0 = rows[wg * 64 + warp * 16 + g], id1 = rows[wg * 64 + warp * 16 + g + 8];
  const float s0 = (scale && id0 < total) ? scale[id0] : 1.f;
  const float s1 = (scale && id1 < total) ? scale[id1] : 1.f;
  const int cb = n0 + 2 * t;
#pragma unroll
  for (int j = 0; j < 32; j++) {
    if (id0 < total) *(unsigned*)(C + (long long)id0 * n + cb + 8 * j) = pack2<BF>(d[4 * j] * s0, d[4 * j + 1] * s0);
    if (id1 < total) *(unsigned*)(C + (long long)id1 * n + cb + 8 * j) = pack2<BF>(d[4 * j + 2] * s1, d[4 * j + 3] * s1);
  }
}

#define MOE_GEMM_WGP_EXPORT(NAME, BF, ST) \
  extern "C" __global__ void __launch_bounds__(256) NAME(const u16* A, const int* sorted, const int* experts, \
      int block_m, int a_div, const u16* W, u16* C, const float* scale, int n, int k, int total, int used) \
  { moe_gemm_wgp_t<BF, ST>(A, sorted, experts, block_m, a_div, W, C, scale, n, k, total, used); }
MOE_GEMM_WGP_EXPORT(moe_gemm_wgp_f16, false, 4)
MOE_GEMM_WGP_EXPORT(moe_gemm_wgp_bf16, true, 4)
"#;

/// The grouped GEMM's tiles for 64-row blocks: 64 outputs on 4 warps, 128 on 8 warps (32 × 32
/// each), on 4 (32 × 64) or on 2 (64 × 64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiles {
    /// `mma.sync`, 64 outputs on 4 warps.
    Narrow,
    /// `mma.sync`, 128 outputs on 8 warps of 32 × 32.
    Wide,
    /// `mma.sync`, 128 outputs on 4 warps of 32 × 64.
    Wide4,
    /// `mma.sync`, 128 outputs on 2 warps of 64 × 64.
    Wide2,
    /// `mma.sync` with the tiles chosen by the output width (not the Hopper wgmma kernel).
    Mma,
    /// The Hopper kernel on 64-row tiles only (`moe_gemm_wg{1,2}`).
    Wg64,
}

/// `VRAMSCOPE_MOE_GEMM` = `narrow`, `wide`, `wide4` or `wide2`: those `mma.sync` tiles for every
/// grouped GEMM of 64-row blocks (A/B timing, small models' checks); `mma`: `mma.sync` tiles by
/// the output width, never the Hopper kernel; `wg64`: the Hopper kernel on 64-row tiles only;
/// unset (or anything else): the Hopper kernel where it is built and the shapes allow,
/// otherwise tiles by the output width.
fn moe_gemm_tiles() -> Option<Tiles> {
    static TILES: std::sync::OnceLock<Option<Tiles>> = std::sync::OnceLock::new();
    *TILES.get_or_init(|| match std::env::var("VRAMSCOPE_MOE_GEMM").as_deref() {
        Ok("narrow") => Some(Tiles::Narrow),
        Ok("wide") => Some(Tiles::Wide),
        Ok("wide4") => Some(Tiles::Wide4),
        Ok("wide2") => Some(Tiles::Wide2),
        Ok("mma") => Some(Tiles::Mma),
        Ok("wg64") => Some(Tiles::Wg64),
        _ => None,
    })
}

/// One grouped GEMM, by device address: `a` rows by slot id / `a_div` (`k` wide), `w` the
/// stacked experts `[E, n, k]`, `c` rows by slot id (`n` wide), `scale` (f32 per slot, 0 for
/// none) applied to the sum.
pub struct GroupedGemm {
    pub dtype: DType,
    pub a: u64,
    pub a_div: usize,
    pub w: u64,
    pub c: u64,
    pub scale: u64,
    pub n: usize,
    pub k: usize,
}

/// The slots' layout: `sorted` and `experts` (`moe_align_block_size`'s tensors), the block
/// size, how many sorted entries are in use (`num_tokens_post_pad`), the real slots (M·k).
pub struct Sorted {
    pub sorted: u64,
    pub experts: u64,
    pub block_m: usize,
    pub used: usize,
    pub total: usize,
}

impl CudaDevice {
    /// Whether the grouped GEMM was built (compute capability 8.0 and later).
    pub fn has_moe_gemm(&self) -> bool {
        self.funcs.contains_key("moe_gemm64_bf16")
    }

    /// Whether the Hopper (warpgroup MMA) grouped GEMMs were built.
    pub fn has_wgmma_moe_gemm(&self) -> bool {
        self.funcs.contains_key("moe_gemm_wgp_bf16")
    }

    /// One grouped GEMM over the `s.used` sorted slots, with the kernel `VRAMSCOPE_MOE_GEMM`
    /// forces, else the default for the shape.
    pub fn moe_gemm(&mut self, g: &GroupedGemm, s: &Sorted) -> Result<()> {
        self.moe_gemm_with(g, s, moe_gemm_tiles()).map(|_| ())
    }

    /// `moe_gemm` with the kernel `forced` picks (`None`: the default for the shape); returns
    /// the kernel's name (without its type suffix; empty when there was nothing to do).
    pub fn moe_gemm_with(
        &mut self,
        g: &GroupedGemm,
        s: &Sorted,
        forced: Option<Tiles>,
    ) -> Result<String> {
        if !g.k.is_multiple_of(8) || !g.n.is_multiple_of(2) || !s.block_m.is_multiple_of(16) {
            return Err(self.err(
                "grouped GEMM",
                format!(
                    "needs inputs a multiple of 8 ({}), outputs even ({}) and BLOCK_SIZE_M a multiple of 16 ({})",
                    g.k, g.n, s.block_m
                ),
            ));
        }
        if s.used == 0 {
            return Ok(String::new());
        }
        let bm = if s.block_m.is_multiple_of(64) { 64 } else { 16 };
        // Hopper: warpgroup MMA where the shapes allow: 128-row tiles of 256 outputs, else one
        // 64-row block by 256 or 128 outputs.
        let hopper =
            (bm == 64 && g.k.is_multiple_of(64) && matches!(forced, None | Some(Tiles::Wg64)))
                .then(|| {
                    if g.n.is_multiple_of(256) && forced.is_none() {
                        Some((2, 256, 128))
                    } else if g.n.is_multiple_of(256) {
                        Some((1, 256, 64))
                    } else if g.n.is_multiple_of(128) {
                        Some((0, 128, 64))
                    } else {
                        None
                    }
                })
                .flatten()
                .filter(|&(i, _, _)| self.func(WGMMA_GEMMS[i].0, g.dtype).is_ok());
        let (name, cfg) = match hopper {
            Some((i, bn, rows)) => (
                WGMMA_GEMMS[i].0.to_string(),
                LaunchConfig {
                    grid_dim: ((g.n / bn) as u32, s.used.div_ceil(rows) as u32, 1),
                    block_dim: (if i == 0 { 128 } else { 256 }, 1, 1),
                    shared_mem_bytes: WGMMA_GEMMS[i].1 as u32,
                },
            ),
            None => {
                // Wide tiles (128 outputs on 4 warps of 32 × 64, 3 stages) where there are at
                // least 8 of them a row: 0.90× the time of 64 × 32 tiles on 8 warps, 0.85× 64
                // outputs on 4 warps, for Qwen3-30B-A3B at 8192 tokens on an H100
                // (docs/gpu-runs.md run 77).
                let tiles = match forced {
                    Some(Tiles::Mma | Tiles::Wg64) | None if g.n >= 1024 => Tiles::Wide4,
                    Some(t) => t,
                    None => Tiles::Narrow,
                };
                let (name, bn, threads) = match tiles {
                    Tiles::Wide if bm == 64 => ("moe_gemm64w".to_string(), 128, 256),
                    Tiles::Wide4 if bm == 64 => ("moe_gemm64x".to_string(), 128, 128),
                    Tiles::Wide2 if bm == 64 => ("moe_gemm64y".to_string(), 128, 64),
                    _ => (format!("moe_gemm{bm}"), 64, 128),
                };
                let cfg = LaunchConfig {
                    grid_dim: (g.n.div_ceil(bn) as u32, (s.used / bm) as u32, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                };
                (name, cfg)
            }
        };
        let f = self.func(&name, g.dtype)?;
        let (block_m, a_div, n, k, total, used) = (
            s.block_m as i32,
            g.a_div as i32,
            g.n as i32,
            g.k as i32,
            s.total as i32,
            s.used as i32,
        );
        let args: [&dyn super::KArg; 12] = [
            &g.a, &s.sorted, &s.experts, &block_m, &a_div, &g.w, &g.c, &g.scale, &n, &k, &total,
            &used,
        ];
        // The Hopper kernels also take the sorted slots in use (their last tile may be half).
        let count = if hopper.is_some() { 12 } else { 11 };
        self.launch(f, cfg, &args[..count]).map(|_| name)
    }

    /// The router's top-k softmax of `logits [M, E]` (16-bit) into `weights` and `ids`
    /// (`[M, k]`), the f32 copy of the logits into `gating` when given, the weights
    /// renormalised in place when `renorm` (one thread a token; nothing comes to the host).
    pub fn moe_topk_softmax(
        &mut self,
        logits: &TensorData,
        gating: Option<&mut TensorData>,
        weights: &mut TensorData,
        ids: &mut TensorData,
        renorm: bool,
    ) -> Result<()> {
        let dt = self.half(logits)?;
        let (m, e) = match logits.shape[..] {
            [m, e] => (m, e),
            _ => return Err(self.err("MoE routing", format!("{}: not 2-D", logits.name))),
        };
        let k = weights.numel() / m.max(1);
        if weights.numel() != ids.numel() || k == 0 || k > e {
            return Err(self.err(
                "MoE routing",
                format!(
                    "{}: {} weights for {m} tokens of {e} experts",
                    weights.name,
                    weights.numel()
                ),
            ));
        }
        let g = gating.map_or(0u64, |g| g.cuda_ptr());
        let (lp, wp, ip) = (logits.cuda_ptr(), weights.cuda_ptr(), ids.cuda_ptr());
        // A warp a token up to 256 experts (a thread a token would leave most SMs idle at
        // a few thousand tokens), else a thread a token.
        let (f, cfg) = if e <= 256 {
            let blocks = (m.div_ceil(8) as u32).max(1);
            (
                self.func("moe_topk_softmax_w", dt)?,
                LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                },
            )
        } else {
            (self.func("moe_topk_softmax", dt)?, super::grid(m as u64))
        };
        self.launch(
            f,
            cfg,
            &[
                &lp,
                &g,
                &wp,
                &ip,
                &(m as i64),
                &(e as i32),
                &(k as i32),
                &i32::from(renorm),
            ],
        )
    }

    /// Each row of `k` f32 weights divided by its sum into `out` (`[M, k]` both).
    pub fn moe_renorm(&mut self, w: &TensorData, out: &mut TensorData, k: usize) -> Result<()> {
        let m = (w.numel() / k.max(1)) as i64;
        let f = self.func("moe_renorm", DType::F32)?;
        let (wp, op) = (w.cuda_ptr(), out.cuda_ptr());
        self.launch(f, super::grid(m as u64), &[&wp, &op, &m, &(k as i32)])
    }

    /// `[M, k]` expert ids to the host (the slot layout is built there), refused inside a
    /// CUDA graph capture, which cannot hold the round trip.
    pub fn download_ids(&mut self, ids: &TensorData, name: &str) -> Result<Vec<i32>> {
        if self.is_capturing() {
            return Err(crate::base::error::Error::Request(format!(
                "{name}: the MoE slot layout is built on the host here, which a CUDA graph \
                 cannot capture; profile MoE models on a GPU with --enforce-eager (or on a \
                 simulated device, which models the graphs)"
            )));
        }
        let b = self.download_bytes(ids)?;
        Ok(b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// `silu_and_mul` over `rows` rows of `[gate | up]` (`2·i` wide) at `c1` into `c2`.
    /// `sig = sigmoid(gate)` over `m` 16-bit values (Qwen2-MoE's shared-expert gate).
    pub fn moe_sigmoid(&mut self, gate: &TensorData, sig: &mut TensorData) -> Result<()> {
        let dt = self.half(gate)?;
        let m = gate.numel();
        if sig.numel() != m {
            return Err(self.err(
                "shared-expert gate",
                format!("{}: {} values for {m} logits", sig.name, sig.numel()),
            ));
        }
        let f = self.func("moe_sigmoid", dt)?;
        let (gp, sp) = (gate.cuda_ptr(), sig.cuda_ptr());
        self.launch(f, super::grid(m as u64), &[&gp, &sp, &(m as i64)])
    }

    /// `out[r, :] = sig[r] · x[r, :]` (`x` and `out` `[m, h]`, `sig` `[m, 1]`).
    pub fn moe_row_scale(
        &mut self,
        sig: &TensorData,
        x: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let m = sig.numel();
        let h = x.numel() / m.max(1);
        if x.numel() != m * h || out.numel() != x.numel() {
            return Err(self.err(
                "shared-expert gate",
                format!("{}: {:?} scaled by {m} rows", x.name, x.shape),
            ));
        }
        let f = self.func("moe_row_scale", dt)?;
        let (sp, xp, op) = (sig.cuda_ptr(), x.cuda_ptr(), out.cuda_ptr());
        self.launch(
            f,
            super::grid((m * h) as u64),
            &[&sp, &xp, &op, &(m as i64), &(h as i32)],
        )
    }

    pub fn moe_silu_mul(
        &mut self,
        dt: DType,
        c1: u64,
        c2: u64,
        rows: usize,
        i: usize,
    ) -> Result<()> {
        let f = self.func("moe_silu_mul", dt)?;
        let n = (rows * i) as u64;
        self.launch(f, super::grid(n), &[&c1, &c2, &(rows as i64), &(i as i32)])
    }

    /// `moe_sum`: each of `m` tokens' `k` rows at `c3` (`h` wide) summed into `x`.
    pub fn moe_sum(
        &mut self,
        dt: DType,
        c3: u64,
        x: u64,
        (m, k, h): (usize, usize, usize),
    ) -> Result<()> {
        let f = self.func("moe_sum", dt)?;
        self.launch(
            f,
            super::grid((m * h) as u64),
            &[&c3, &x, &(m as i64), &(k as i32), &(h as i32)],
        )
    }
}

//! AWQ and GPTQ 4-bit weights on the GPU: one fused dequantize-and-multiply kernel on the
//! tensor cores (`mma.sync` m16n8k16, f32 accumulation), reading the checkpoint's own packed
//! layout from the allocations vLLM's Marlin repack makes (`quant::marlin` keeps the stored
//! words inside them). Each 32-input slice of the weight is dequantized into shared memory as
//! the format specifies, `(q − z)·s` (AWQ) or `(q − 8)·s` (GPTQ), rounded once to the
//! activation's 16-bit type, which is the value Marlin multiplies; the kernel takes no
//! workspace and allocates nothing, so the framework allocator sees exactly the tensors
//! `gptq_marlin_gemm` allocates (its output and its two temporaries, made by the caller).

use cudarc::driver::result as drv;
use cudarc::driver::LaunchConfig;

use super::CudaDevice;
use crate::base::error::Result;
use crate::device::tensor::TensorData;

/// The kernels, each with an `_f16` and a `_bf16` flavour.
pub(crate) const NAMES: &[&str] = &["w4_awq", "w4_gptq", "w4_deq_awq", "w4_deq_gptq"];

/// Output rows and columns of one thread block.
const TILE: usize = 128;

/// Rows from which `w4_gemm` dequantizes slices for cuBLAS (vLLM's own AWQ path switches to
/// dequantize-then-matmul at 256 tokens: `FP16_MATMUL_HEURISTIC_CONDITION`, awq.py).
const W4_SLICE_MIN_ROWS: usize = 256;
/// A slice's bytes at most (`VRAMSCOPE_W4=mib:N` sets another for measurements).
pub(super) const W4_SLICE_MAX_BYTES: u64 = 128 << 20;
/// Fewer columns a slice than this and the fused kernel is kept.
const W4_SLICE_MIN_COLS: usize = 128;

/// Appended to `kernels::FLASH_SOURCE` (uses its `smem_u32`, `mma16816` and `pack2`), which is
/// built for compute capability 8.0 and later only, as Marlin itself is.
pub(crate) const SOURCE: &str = r#"
template <bool BF> __device__ __forceinline__ float w4_ld(u16 h) {
  if (BF) return __uint_as_float(((unsigned)h) << 16);
  float f; asm("{cvt.f32.f16 %0, %1;}" : "=f"(f) : "h"(h)); return f;
}
template <bool BF> __device__ __forceinline__ u16 w4_st(float f) {
  u16 h;
  if (BF) asm("{cvt.rn.bf16.f32 %0, %1;}" : "=h"(h) : "f"(f));
  else asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h) : "f"(f));
  return h;
}

// out[m, ns] = x[m, k] . W[c0 .. c0 + ns, :]^T, W the [n, k] weight of the packed words `qw`
// (AWQ: [k, n/8], nibble i of a word holding column 8w + {0,2,4,6,1,3,5,7}[i]; GPTQ: [k/8, n],
// nibble j holding input 8r + j), zeros `qz` ([groups, n/8], AWQ's order; GPTQ's unused:
// uint4b8), scales `sc` [groups, n], the group of input i `gidx[i]` when given, else i / group.
// 128 x 128 output tiles, 8 warps of 64 x 32; 32 inputs a step, double-buffered in shared
// memory: x through cp.async, the weight's words loaded while the step before multiplies and
// dequantized into the other buffer after it.
template <bool BF, bool AWQ> __device__ void w4_gemm(const u16* x, const unsigned* qw, const unsigned* qz, const u16* sc,
                                                     const int* gidx, u16* out, int m, int n, int k, int c0, int ns,
                                                     int group) {
  constexpr int BM = 128, BN = 128, BK = 32, LD = BK + 8;
  __shared__ __align__(16) u16 as[2][BM * LD];
  __shared__ __align__(16) u16 bs[2][BN * LD];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;
  const int mi = lane >> 3, mr = lane & 7;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int nk = k / BK, np = n / 8;

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  // x rows [m0, m0 + 128), inputs [k0, k0 + 32): 512 chunks of 16 bytes, rows past m zero.
  auto load_a = [&](int buf, int k0) {
#pragma unroll
    for (int i = tid; i < BM * BK / 8; i += 256) {
      int r = i >> 2, c = (i & 3) * 8, row = m0 + r;
      const u16* s = x + (long long)(row < m ? row : 0) * k + k0 + c;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_u32(&as[buf][r * LD + c])), "l"(s),
                   "r"(row < m ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;");
  };
  // A step's weight slice in registers: 512 words, two a thread, with what dequantizes them
  // (AWQ: the zero word and the eight columns' scales; GPTQ without act-order: the column's
  // scale), loaded before the step ahead multiplies so that their latency hides behind it.
  // AWQ's threads of a warp take the 32 inputs of one word column (their shared-memory
  // stores then fall in distinct banks); GPTQ's take 32 consecutive columns. Zero past the
  // shard's columns.
  struct __align__(16) Q4 { unsigned a, b, c, d; };
  struct Regs { unsigned w[2], z[2]; Q4 s[2]; };
  auto load_w = [&](Regs& R, int k0) {
#pragma unroll
    for (int j = 0; j < 2; j++) {
      int i = tid + 256 * j;
      R.w[j] = 0u;
      R.z[j] = 0u;
      R.s[j] = Q4{0u, 0u, 0u, 0u};
      if (AWQ) {
        int r = i & 31, col = n0 + (i >> 5) * 8;
        if (col < ns) {
          int kk = k0 + r, grp = kk / group;
          R.w[j] = qw[(long long)kk * np + (c0 + col) / 8];
          R.z[j] = qz[(long long)grp * np + (c0 + col) / 8];
          R.s[j] = *(const Q4*)(sc + (long long)grp * n + c0 + col);
        }
      } else {
        int r = i >> 7, col = n0 + (i & 127);
        if (col < ns) {
          R.w[j] = qw[(long long)((k0 >> 3) + r) * n + c0 + col];
          if (!gidx) R.s[j].a = sc[(long long)((k0 + r * 8) / group) * n + c0 + col];
        }
      }
    }
  };
  // The words dequantized into buffer `buf` as [column][input] 16-bit values.
  auto store_w = [&](const Regs& R, int buf, int k0) {
#pragma unroll
    for (int j = 0; j < 2; j++) {
      int i = tid + 256 * j;
      if (AWQ) {
        int r = i & 31, cl = (i >> 5) * 8;
        u16* dst = &bs[buf][cl * LD + r];
        const unsigned sw[4] = {R.s[j].a, R.s[j].b, R.s[j].c, R.s[j].d};
#pragma unroll
        for (int nib = 0; nib < 8; nib++) {
          int c = ((nib & 3) << 1) | (nib >> 2);  // AutoAWQ's order: nibble nib holds column c
          int q = (R.w[j] >> (4 * nib)) & 15, zz = (R.z[j] >> (4 * nib)) & 15;
          float s = w4_ld<BF>((u16)(sw[c >> 1] >> (16 * (c & 1))));
          dst[c * LD] = w4_st<BF>((float)(q - zz) * s);
        }
      } else {
        int r = i >> 7, cl = i & 127, col = n0 + cl;
        unsigned v[4] = {0u, 0u, 0u, 0u};
        if (col < ns) {
          float s0 = w4_ld<BF>((u16)R.s[j].a);
#pragma unroll
          for (int e = 0; e < 8; e++) {
            float s = gidx ? w4_ld<BF>(sc[(long long)gidx[k0 + r * 8 + e] * n + c0 + col]) : s0;
            unsigned h = w4_st<BF>((float)((int)((R.w[j] >> (4 * e)) & 15) - 8) * s);
            v[e >> 1] |= h << (16 * (e & 1));
          }
        }
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" :: "r"(smem_u32(&bs[buf][cl * LD + r * 8])), "r"(v[0]),
                     "r"(v[1]), "r"(v[2]), "r"(v[3]));
      }
    }
  };

  Regs w;
  load_a(0, 0);
  load_w(w, 0);
  store_w(w, 0, 0);
  for (int kt = 0; kt < nk; kt++) {
    const int buf = kt & 1;
    const bool more = kt + 1 < nk;
    if (more) {
      load_a(buf ^ 1, (kt + 1) * BK);
      load_w(w, (kt + 1) * BK);
      asm volatile("cp.async.wait_group 1;");
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      unsigned af[4][4];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const u16* src = &as[buf][(wm * 64 + i * 16 + (mi & 1) * 8 + mr) * LD + kk * 16 + (mi >> 1) * 8];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3]) : "r"(smem_u32(src)));
      }
#pragma unroll
      for (int nn = 0; nn < 4; nn += 2) {
        unsigned b0, b1, b2, b3;
        const u16* src = &bs[buf][(wn * 32 + (nn + (mi >> 1)) * 8 + mr) * LD + kk * 16 + (mi & 1) * 8];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(smem_u32(src)));
#pragma unroll
        for (int i = 0; i < 4; i++) {
          mma16816<BF>(acc[i][nn], af[i], b0, b1);
          mma16816<BF>(acc[i][nn + 1], af[i], b2, b3);
        }
      }
    }
    if (more) store_w(w, buf ^ 1, (kt + 1) * BK);
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int r = m0 + wm * 64 + i * 16 + g;
#pragma unroll
    for (int nn = 0; nn < 4; nn++) {
      const int c = n0 + wn * 32 + nn * 8 + 2 * t;
      if (c >= ns) continue;
      if (r < m) *(unsigned*)(out + (long long)r * ns + c) = pack2<BF>(acc[i][nn][0], acc[i][nn][1]);
      if (r + 8 < m) *(unsigned*)(out + (long long)(r + 8) * ns + c) = pack2<BF>(acc[i][nn][2], acc[i][nn][3]);
    }
  }
}

#define W4_EXPORT(NAME, BF, AWQ) \
  extern "C" __global__ void __launch_bounds__(256) NAME(const u16* x, const unsigned* qw, const unsigned* qz, \
      const u16* sc, const int* gidx, u16* out, int m, int n, int k, int c0, int ns, int group) \
  { w4_gemm<BF, AWQ>(x, qw, qz, sc, gidx, out, m, n, k, c0, ns, group); }
W4_EXPORT(w4_awq_f16, false, true)
W4_EXPORT(w4_awq_bf16, true, true)
W4_EXPORT(w4_gptq_f16, false, false)
W4_EXPORT(w4_gptq_bf16, true, false)

// The same values as w4_gemm multiplies, for columns [col, col + nc) of W, written into
// `dst` as the [k, nc] row-major matrix Wᵀ of that slice (what cuBLAS then multiplies).
// AWQ: a thread per word (one input, eight columns: one 16-byte store); GPTQ: a thread per
// word (eight inputs of one column: eight stores, a warp's falling in one 64-byte run).
template <bool BF, bool AWQ> __device__ void w4_deq(const unsigned* qw, const unsigned* qz, const u16* sc,
                                                    const int* gidx, u16* dst, int n, int k, int col, int nc,
                                                    int group) {
  const int np = n / 8;
  const long long words = (long long)k * nc / 8;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += (long long)gridDim.x * blockDim.x) {
    if (AWQ) {
      const int wpr = nc / 8, kk = (int)(i / wpr), wc = (int)(i % wpr), c = col + wc * 8, grp = kk / group;
      const unsigned q = qw[(long long)kk * np + c / 8], z = qz[(long long)grp * np + c / 8];
      const uint4 s4 = *(const uint4*)(sc + (long long)grp * n + c);
      const unsigned sw[4] = {s4.x, s4.y, s4.z, s4.w};
      unsigned v[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int nib = 0; nib < 8; nib++) {
        const int cc = ((nib & 3) << 1) | (nib >> 2);  // AutoAWQ's order, as w4_gemm
        const int qq = (q >> (4 * nib)) & 15, zz = (z >> (4 * nib)) & 15;
        const float s = w4_ld<BF>((u16)(sw[cc >> 1] >> (16 * (cc & 1))));
        v[cc >> 1] |= (unsigned)w4_st<BF>((float)(qq - zz) * s) << (16 * (cc & 1));
      }
      *(uint4*)(dst + (long long)kk * nc + wc * 8) = make_uint4(v[0], v[1], v[2], v[3]);
    } else {
      const int r = (int)(i / nc), cl = (int)(i % nc), c = col + cl;
      const unsigned q = qw[(long long)r * n + c];
#pragma unroll
      for (int e = 0; e < 8; e++) {
        const int kk = r * 8 + e, grp = gidx ? gidx[kk] : kk / group;
        const float s = w4_ld<BF>(sc[(long long)grp * n + c]);
        dst[(long long)kk * nc + cl] = w4_st<BF>((float)((int)((q >> (4 * e)) & 15) - 8) * s);
      }
    }
  }
}

#define W4_DEQ_EXPORT(NAME, BF, AWQ) \
  extern "C" __global__ void __launch_bounds__(256) NAME(const unsigned* qw, const unsigned* qz, const u16* sc, \
      const int* gidx, u16* dst, int n, int k, int col, int nc, int group) \
  { w4_deq<BF, AWQ>(qw, qz, sc, gidx, dst, n, k, col, nc, group); }
W4_DEQ_EXPORT(w4_deq_awq_f16, false, true)
W4_DEQ_EXPORT(w4_deq_awq_bf16, true, true)
W4_DEQ_EXPORT(w4_deq_gptq_f16, false, false)
W4_DEQ_EXPORT(w4_deq_gptq_bf16, true, false)
"#;

/// One AWQ or GPTQ linear's device tensors as the kernel reads them.
pub struct W4Weights<'a> {
    /// AWQ (zero points, output-packed words) or GPTQ (`uint4b8`, input-packed words).
    pub awq: bool,
    /// The packed words, in the checkpoint's layout (`[k, n/8]` or `[k/8, n]` words).
    pub qweight: &'a TensorData,
    /// AWQ's zero points `[groups, n/8]` (GPTQ: none).
    pub qzeros: Option<&'a TensorData>,
    /// `[groups, n]` in the activation's 16-bit type.
    pub scales: &'a TensorData,
    /// Act-order's stored `g_idx` `[k]` (the group of each input).
    pub g_idx: Option<&'a TensorData>,
    /// Inputs per group (`k` for one group).
    pub group: usize,
    pub n: usize,
    pub k: usize,
}

impl CudaDevice {
    /// `out = x · Wᵀ` for a 4-bit weight: `x [m, k]`, the output holding each shard's columns
    /// (`rows`, summing to `n`) as one contiguous `[m, rows[i]]` block, as `FusedLinear` lays
    /// it out. Needs compute capability 8.0 (checked by the caller's format check; the kernel
    /// is not built below it).
    pub fn w4_gemm(
        &mut self,
        x: &TensorData,
        w: &W4Weights,
        out: &mut TensorData,
        rows: &[usize],
        scratch: Option<&TensorData>,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let (m, k, n) = (x.rows(), x.cols(), w.n);
        let words = n * k / 8;
        let fits = k == w.k
            && rows.iter().sum::<usize>() == n
            && out.numel() == m * n
            && out.dtype == dt
            && w.scales.dtype == dt
            && w.qweight.nbytes() == (words * 4) as u64
            && w.group > 0
            && k.is_multiple_of(w.group)
            && w.scales.numel() == (k / w.group) * n
            && w.qzeros
                .is_none_or(|z| z.nbytes() == ((k / w.group) * n / 2) as u64)
            && w.g_idx.is_none_or(|g| g.numel() == k)
            && (!w.awq || w.qzeros.is_some());
        if !fits {
            return Err(self.err(
                "4-bit GEMM",
                format!(
                    "{} [{m}, {k}] · {} ({n} × {k}, group {}) into {} {:?} do not fit",
                    x.name, w.qweight.name, w.group, out.name, out.shape
                ),
            ));
        }
        if !k.is_multiple_of(32) || rows.iter().any(|r| !r.is_multiple_of(8)) {
            return Err(self.err(
                "4-bit GEMM",
                format!(
                    "{}: the kernel takes inputs in steps of 32 and shards of whole words (k {k}, rows {rows:?})",
                    w.qweight.name
                ),
            ));
        }
        let f = self
            .func(if w.awq { "w4_awq" } else { "w4_gptq" }, dt)
            .map_err(|_| {
                self.err(
                    "4-bit GEMM",
                    format!(
                        "the 4-bit kernels are not built on compute capability {}.{} (Marlin needs 8.0)",
                        self.cc.0, self.cc.1
                    ),
                )
            })?;
        let (xp, qw, sc) = (x.cuda_ptr(), w.qweight.cuda_ptr(), w.scales.cuda_ptr());
        let qz = w.qzeros.map_or(0u64, |t| t.cuda_ptr());
        let gi = w.g_idx.map_or(0u64, |t| t.cuda_ptr());
        let (mi, ni, ki, gr) = (m as i32, n as i32, k as i32, w.group as i32);
        if let Some((dst, cols)) = self.w4_slices(m, k, scratch) {
            return self.w4_sliced(x, w, out, rows, dst, cols);
        }
        let mut c0 = 0usize;
        for &ns in rows {
            let op = out.cuda_ptr() + (m * c0 * 2) as u64;
            let cfg = LaunchConfig {
                grid_dim: (ns.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let (c0i, nsi) = (c0 as i32, ns as i32);
            self.launch(
                f,
                cfg,
                &[&xp, &qw, &qz, &sc, &gi, &op, &mi, &ni, &ki, &c0i, &nsi, &gr],
            )?;
            c0 += ns;
        }
        Ok(())
    }

    /// Where the weight is dequantized a slice at a time for cuBLAS (`w4_sliced`), and how
    /// many columns a slice holds; `None` keeps the fused kernel. The slices go into the
    /// call's own temporary (Marlin's reduce buffer, Machete's workspace: vLLM allocates it
    /// for the call, the kernel here needs none), so no memory is taken that the dry run does
    /// not count. Only for `W4_SLICE_MIN_ROWS` rows and more, where the GEMM is bound by
    /// arithmetic (below it the fused kernel reads the words once, which is what matters), at
    /// least `W4_SLICE_MIN_COLS` columns a slice, and once cuBLAS holds its framework
    /// workspace (else it would allocate its own, outside the framework's memory).
    fn w4_slices(&self, m: usize, k: usize, scratch: Option<&TensorData>) -> Option<(u64, usize)> {
        let s = scratch?;
        if self.w4_fused || m < W4_SLICE_MIN_ROWS || self.blas_workspace.is_none() {
            return None;
        }
        let bytes = s.nbytes().min(self.w4_slice_bytes) as usize;
        let cols = (bytes / (2 * k)).min(self.w4_slice_cols.unwrap_or(usize::MAX));
        let cols = cols / 8 * 8;
        (cols >= W4_SLICE_MIN_COLS.min(self.w4_slice_cols.unwrap_or(usize::MAX)))
            .then_some((s.cuda_ptr(), cols))
    }

    /// `w4_gemm` as dequantize-then-multiply: each shard's columns a slice of `cols` at a
    /// time, the slice's values (the fused kernel's, rounded once to the 16-bit type) written
    /// as `[k, cols]` into `dst`, then `x · slice` by cuBLAS (f32 accumulation) into the
    /// shard's block of `out` (leading dimension the shard's width).
    fn w4_sliced(
        &mut self,
        x: &TensorData,
        w: &W4Weights,
        out: &mut TensorData,
        rows: &[usize],
        dst: u64,
        cols: usize,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let (m, k, n) = (x.rows(), x.cols(), w.n);
        let deq = self
            .func(if w.awq { "w4_deq_awq" } else { "w4_deq_gptq" }, dt)?
            .clone();
        let ty = super::gemm::blas_type(dt);
        let (qw, sc) = (w.qweight.cuda_ptr(), w.scales.cuda_ptr());
        let qz = w.qzeros.map_or(0u64, |t| t.cuda_ptr());
        let gi = w.g_idx.map_or(0u64, |t| t.cuda_ptr());
        let (ni, ki, gr) = (n as i32, k as i32, w.group as i32);
        let mut c0 = 0usize;
        for &ns in rows {
            let block = out.cuda_ptr() + (m * c0 * 2) as u64;
            // Slices of equal width (whole words), the fewest that fit.
            let width = ns.div_ceil(ns.div_ceil(cols)).next_multiple_of(8);
            let mut cc = 0usize;
            while cc < ns {
                let nc = width.min(ns - cc);
                let (col, nci) = ((c0 + cc) as i32, nc as i32);
                self.launch(
                    &deq,
                    super::grid((k * nc / 8) as u64),
                    &[&qw, &qz, &sc, &gi, &dst, &ni, &ki, &col, &nci, &gr],
                )?;
                let g = super::gemm::Gemm {
                    m,
                    n: nc,
                    k,
                    a: x.cuda_ptr(),
                    a_type: ty,
                    lda: k,
                    stride_a: 0,
                    b: dst,
                    b_type: ty,
                    ldb: nc,
                    stride_b: 0,
                    b_trans: false,
                    c: block + (cc * 2) as u64,
                    c_type: ty,
                    ldc: ns,
                    stride_c: 0,
                    batch: 1,
                    alpha: 1.0,
                    beta: 0.0,
                    compute: cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                };
                // Tuned as `gemm_nt`'s are (graph warm-ups and captures keep cuBLAS's choice).
                if self.tune_gemms && !self.on_side_stream() {
                    self.gemm_tuned(g)?;
                } else {
                    self.gemm(g)?;
                }
                cc += nc;
            }
            c0 += ns;
        }
        Ok(())
    }

    /// Tests: `fused` keeps the fused kernel at every size; `slice_cols` caps the columns of
    /// a dequantized slice (`None`: as the call's temporary allows).
    pub fn set_w4_path(&mut self, fused: bool, slice_cols: Option<usize>) {
        self.w4_fused = fused;
        self.w4_slice_cols = slice_cols;
    }

    /// Copies all of `src`'s bytes into `dst` (same size) on the stream: a stored tensor into
    /// the allocation that replaces it.
    pub fn copy_bytes(&mut self, src: &TensorData, dst: &mut TensorData) -> Result<()> {
        if src.nbytes() != dst.nbytes() {
            return Err(self.err(
                "copy",
                format!(
                    "{} has {} bytes, {} {}",
                    src.name,
                    src.nbytes(),
                    dst.name,
                    dst.nbytes()
                ),
            ));
        }
        // SAFETY: both tensors are live device allocations of `nbytes` bytes.
        unsafe {
            drv::memcpy_dtod_async(
                dst.cuda_ptr(),
                src.cuda_ptr(),
                src.nbytes() as usize,
                self.stream.cu_stream(),
            )
        }
        .map_err(|e| self.err("copy on the GPU", e))
    }

    /// The GPU's architecture as vLLM's capability checks name it (`marlin::check_gpu`).
    pub fn arch(&self) -> &'static str {
        match self.cc {
            (..=6, _) => "Pascal",
            (7, 0..=2) => "Volta",
            (7, _) => "Turing",
            (8, 9) => "Ada",
            (8, _) => "Ampere",
            (9, _) => "Hopper",
            _ => "Blackwell",
        }
    }
}

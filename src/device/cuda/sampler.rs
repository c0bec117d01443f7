//! vLLM's sampler step on the GPU: the kernels behind `model::sampler` (PyTorch's ops in
//! sampler.py L260-274, L417-443, L615-634), over buffers the framework allocator handed out.
//! The sort is a stable LSD radix sort (8 passes of 4 bits, one block per row) that ping-pongs
//! through the same two extra buffers PyTorch's CUB segmented sort takes: the int64
//! `reverse_indices` (the row-wise iota it sorts as values) and the temp storage holding the
//! alternate keys and values (12 bytes per element + 255).

use super::{blocks, grid, CudaDevice, LaunchConfig};
use crate::base::error::Result;
use crate::device::tensor::{DType, TensorData};

/// Kernel names (16-bit operands instantiated `_f16` and `_bf16`).
pub(super) const TYPED: &[&str] = &["narrow_to_f32", "div_rows", "compare_rows_h"];
pub(super) const UNTYPED: &[&str] = &[
    "iota_rows",
    "radix_pass",
    "gather_cols_f32",
    "compare_rows_f",
    "masked_fill_f32",
    "clear_last_col",
    "softmax_rows",
    "cumsum_rows",
    "scatter_rows",
    "index_rows",
    "exponential_fill",
    "div_assign_f32",
    "argmax_rows",
];

const SORT_THREADS: u32 = 512;
const ROW_THREADS: u32 = 1024;

pub(super) const SOURCE: &str = r#"
// ---- sampler (src/device/cuda/sampler.rs) ----
// No CUDA headers: -inf and NaN from their bits.
#define SAMPLER_NEG_INF __int_as_float(0xff800000)
#define SAMPLER_NAN __int_as_float(0x7fc00000)
template <class T> __device__ void narrow_to_f32(const u16* x, float* o, long long rows, int src_cols, int cols) {
  long long n = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long r = i / cols, c = i % cols;
    o[i] = T::ld(x[r * src_cols + c]);
  }
}
template <class T> __device__ void div_rows(float* x, const u16* t, long long rows, int cols) {
  long long n = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] = x[i] / T::ld(t[i / cols]);
}
template <class T> __device__ void compare_rows_h(const float* x, const u16* t, u8* m, long long rows, int cols, int or_equal) {
  long long n = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float th = T::ld(t[i / cols]);
    m[i] = or_equal ? (x[i] <= th) : (x[i] < th);
  }
}
INST(narrow_to_f32, (const u16* x, float* o, long long rows, int src_cols, int cols), (x, o, rows, src_cols, cols))
INST(div_rows, (float* x, const u16* t, long long rows, int cols), (x, t, rows, cols))
INST(compare_rows_h, (const float* x, const u16* t, u8* m, long long rows, int cols, int or_equal), (x, t, m, rows, cols, or_equal))

extern "C" __global__ void iota_rows(long long* v, long long rows, int cols) {
  long long n = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    v[i] = i % cols;
}

// Order-preserving bits of a float (ascending), as CUB's radix sort uses them.
__device__ __forceinline__ unsigned fkey(float f) {
  unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One stable counting-sort pass on 4 bits of every row: each thread owns a contiguous chunk,
// counts its digits, a block-wide exclusive scan in (digit, thread) order gives each thread
// its first slot per digit, and the chunk is scattered in order: stable.
extern "C" __global__ void radix_pass(const float* kin, const long long* vin, float* kout, long long* vout, int cols, int shift) {
  extern __shared__ unsigned sh[];
  unsigned* counts = sh;                 // [16][T]
  unsigned* warp_tot = sh + 16 * blockDim.x;
  const int T = blockDim.x, t = threadIdx.x;
  const long long base = (long long)blockIdx.x * cols;
  const float* k = kin + base;
  const long long* v = vin + base;
  float* ko = kout + base;
  long long* vo = vout + base;
  int per = (cols + T - 1) / T;
  int lo = min(t * per, cols), hi = min(lo + per, cols);
  unsigned cnt[16];
  #pragma unroll
  for (int d = 0; d < 16; d++) cnt[d] = 0;
  for (int i = lo; i < hi; i++) cnt[(fkey(k[i]) >> shift) & 15u]++;
  #pragma unroll
  for (int d = 0; d < 16; d++) counts[d * T + t] = cnt[d];
  __syncthreads();
  unsigned loc[16], s = 0;
  #pragma unroll
  for (int j = 0; j < 16; j++) { loc[j] = counts[t * 16 + j]; s += loc[j]; }
  // block-wide exclusive scan of s
  unsigned x = s;
  int lane = t & 31, w = t >> 5;
  for (int o = 1; o < 32; o <<= 1) { unsigned y = __shfl_up_sync(0xffffffffu, x, o); if (lane >= o) x += y; }
  if (lane == 31) warp_tot[w] = x;
  __syncthreads();
  if (w == 0) {
    int nw = (T + 31) >> 5;
    unsigned z = lane < nw ? warp_tot[lane] : 0u;
    for (int o = 1; o < 32; o <<= 1) { unsigned y = __shfl_up_sync(0xffffffffu, z, o); if (lane >= o) z += y; }
    if (lane < nw) warp_tot[lane] = z;
  }
  __syncthreads();
  unsigned run = x - s + (w > 0 ? warp_tot[w - 1] : 0u);
  __syncthreads();
  #pragma unroll
  for (int j = 0; j < 16; j++) { counts[t * 16 + j] = run; run += loc[j]; }
  __syncthreads();
  #pragma unroll
  for (int d = 0; d < 16; d++) cnt[d] = counts[d * T + t];
  for (int i = lo; i < hi; i++) {
    float kv = k[i];
    unsigned pos = cnt[(fkey(kv) >> shift) & 15u]++;
    ko[pos] = kv;
    vo[pos] = v[i];
  }
}

extern "C" __global__ void gather_cols_f32(const float* x, const long long* col, float* o, long long rows, int cols) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x)
    o[r] = x[r * cols + col[r]];
}
extern "C" __global__ void compare_rows_f(const float* x, const float* t, u8* m, long long rows, int cols, int or_equal) {
  long long n = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float th = t[i / cols];
    m[i] = or_equal ? (x[i] <= th) : (x[i] < th);
  }
}
extern "C" __global__ void masked_fill_f32(float* x, const u8* m, long long n, float value) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    if (m[i]) x[i] = value;
}
extern "C" __global__ void clear_last_col(u8* m, long long rows, int cols) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x)
    m[r * cols + cols - 1] = 0;
}
// Row softmax (log_softmax when `lg`), one block per row, f32 throughout.
extern "C" __global__ void softmax_rows(const float* x, float* o, int cols, int lg) {
  __shared__ float sh[32];
  const float* row = x + (long long)blockIdx.x * cols;
  float* out = o + (long long)blockIdx.x * cols;
  float m = SAMPLER_NEG_INF;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, row[i]);
  m = block_max(m, sh);
  if (m == SAMPLER_NEG_INF) {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = lg ? SAMPLER_NEG_INF : SAMPLER_NAN;
    return;
  }
  float s = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += __expf(row[i] - m);
  s = block_sum(s, sh);
  if (lg) {
    float ls = __logf(s);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = row[i] - m - ls;
  } else {
    float inv = 1.f / s;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = __expf(row[i] - m) * inv;
  }
}
// Inclusive row scan: each thread sums a contiguous chunk, a block scan of the chunk sums,
// then each chunk is written with its offset.
extern "C" __global__ void cumsum_rows(const float* x, float* o, int cols) {
  __shared__ float warp_tot[32];
  const float* row = x + (long long)blockIdx.x * cols;
  float* out = o + (long long)blockIdx.x * cols;
  const int T = blockDim.x, t = threadIdx.x;
  int per = (cols + T - 1) / T;
  int lo = min(t * per, cols), hi = min(lo + per, cols);
  float s = 0.f;
  for (int i = lo; i < hi; i++) s += row[i];
  float xs = s;
  int lane = t & 31, w = t >> 5;
  for (int off = 1; off < 32; off <<= 1) { float y = __shfl_up_sync(0xffffffffu, xs, off); if (lane >= off) xs += y; }
  if (lane == 31) warp_tot[w] = xs;
  __syncthreads();
  if (w == 0) {
    int nw = (T + 31) >> 5;
    float z = lane < nw ? warp_tot[lane] : 0.f;
    for (int off = 1; off < 32; off <<= 1) { float y = __shfl_up_sync(0xffffffffu, z, off); if (lane >= off) z += y; }
    if (lane < nw) warp_tot[lane] = z;
  }
  __syncthreads();
  float acc = xs - s + (w > 0 ? warp_tot[w - 1] : 0.f);
  for (int i = lo; i < hi; i++) { acc += row[i]; out[i] = acc; }
}
extern "C" __global__ void scatter_rows(const float* src, const long long* idx, float* o, long long rows, int cols) {
  long long n = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long r = i / cols;
    o[r * cols + idx[i]] = src[i];
  }
}
extern "C" __global__ void index_rows(const float* src, const long long* rows_idx, float* o, long long rows, int cols) {
  long long n = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long r = i / cols, c = i % cols;
    o[i] = src[rows_idx[r] * cols + c];
  }
}
// -ln(u), u in (0, 1] from splitmix64(seed, index): the same draws as the CPU's.
extern "C" __global__ void exponential_fill(float* q, long long n, unsigned long long seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned long long z = seed ^ ((unsigned long long)i * 0x9E3779B97F4A7C15ull);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = ((float)(z >> 40) + 1.0f) / 16777216.0f;
    q[i] = -logf(u);
  }
}
extern "C" __global__ void div_assign_f32(float* x, const float* q, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] = x[i] / q[i];
}
// First index of each row's maximum.
extern "C" __global__ void argmax_rows(const float* x, long long* o, int cols) {
  __shared__ float bv[1024];
  __shared__ int bi[1024];
  const float* row = x + (long long)blockIdx.x * cols;
  float best = SAMPLER_NEG_INF; int arg = 0x7fffffff;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    float v = row[i];
    if (v > best || (v == best && i < arg)) { best = v; arg = i; }
  }
  bv[threadIdx.x] = best; bi[threadIdx.x] = arg;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      float v = bv[threadIdx.x + s]; int j = bi[threadIdx.x + s];
      if (v > bv[threadIdx.x] || (v == bv[threadIdx.x] && j < bi[threadIdx.x])) { bv[threadIdx.x] = v; bi[threadIdx.x] = j; }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) o[blockIdx.x] = bi[0] == 0x7fffffff ? 0 : bi[0];
}
"#;

fn rows_cols(t: &TensorData) -> (i64, i32) {
    ((t.numel() / t.cols().max(1)) as i64, t.cols() as i32)
}

impl CudaDevice {
    /// `logits[..., :cols].to(torch.float)`: the model-dtype logits without vocabulary padding.
    pub fn sampler_narrow_to_f32(&mut self, x: &TensorData, out: &mut TensorData) -> Result<()> {
        let dt = self.half(x)?;
        let (rows, cols) = rows_cols(out);
        let src_cols = x.cols() as i32;
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("narrow_to_f32", dt)?;
        self.launch(
            f,
            grid((rows * cols as i64) as u64),
            &[&xp, &op, &rows, &src_cols, &cols],
        )
    }

    /// `x.div_(t.unsqueeze(1))` with `t` in the model dtype.
    pub fn sampler_div_rows(&mut self, x: &mut TensorData, t: &TensorData) -> Result<()> {
        let dt = self.half(t)?;
        let (rows, cols) = rows_cols(x);
        let (xp, tp) = (x.cuda_ptr(), t.cuda_ptr());
        let f = self.func("div_rows", dt)?;
        self.launch(f, grid(x.numel() as u64), &[&xp, &tp, &rows, &cols])
    }

    /// Stable ascending row sort of `x` into `values`/`indices` (int64) through PyTorch's two
    /// transient buffers: `reverse_indices` (int64, one per element) and `temp` (alternate values
    /// then alternate keys: 12 bytes per element and more).
    pub fn sampler_sort_rows(
        &mut self,
        x: &TensorData,
        values: &mut TensorData,
        indices: &mut TensorData,
        reverse_indices: &mut TensorData,
        temp: &mut TensorData,
    ) -> Result<()> {
        let (rows, cols) = rows_cols(x);
        let n = x.numel() as u64;
        if temp.nbytes() < 12 * n {
            return Err(self.err(
                "sort",
                format!("temp storage {} B for {n} elements", temp.nbytes()),
            ));
        }
        let iota = self.func("iota_rows", DType::I8)?;
        let rp = reverse_indices.cuda_ptr();
        self.launch(iota, grid(n), &[&rp, &rows, &cols])?;
        let alt_v = temp.cuda_ptr();
        let alt_k = alt_v + 8 * n;
        let (kin, out_k, out_v) = (x.cuda_ptr(), values.cuda_ptr(), indices.cuda_ptr());
        let f = self.func("radix_pass", DType::I8)?;
        let cfg = LaunchConfig {
            grid_dim: (rows.max(1) as u32, 1, 1),
            block_dim: (SORT_THREADS, 1, 1),
            shared_mem_bytes: (16 * SORT_THREADS + 32) * 4,
        };
        for pass in 0..8i32 {
            let (ki, vi) = match pass {
                0 => (kin, rp),
                p if p % 2 == 1 => (alt_k, alt_v),
                _ => (out_k, out_v),
            };
            let (ko, vo) = if pass % 2 == 0 {
                (alt_k, alt_v)
            } else {
                (out_k, out_v)
            };
            let shift = pass * 4;
            self.launch(f, cfg, &[&ki, &vi, &ko, &vo, &cols, &shift])?;
        }
        Ok(())
    }

    /// `x.gather(1, col.unsqueeze(1))` with int64 `col`.
    pub fn sampler_gather_cols(
        &mut self,
        x: &TensorData,
        col: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let (rows, cols) = rows_cols(x);
        let (xp, cp, op) = (x.cuda_ptr(), col.cuda_ptr(), out.cuda_ptr());
        let f = self.func("gather_cols_f32", DType::I8)?;
        self.launch(f, grid(rows as u64), &[&xp, &cp, &op, &rows, &cols])
    }

    /// `x < t.unsqueeze(1)` (`<=` when `or_equal`) into a bool mask; `t` f32 or 16-bit.
    pub fn sampler_compare_rows(
        &mut self,
        x: &TensorData,
        t: &TensorData,
        or_equal: bool,
        mask: &mut TensorData,
    ) -> Result<()> {
        let (rows, cols) = rows_cols(x);
        let oe = i32::from(or_equal);
        let (xp, tp, mp) = (x.cuda_ptr(), t.cuda_ptr(), mask.cuda_ptr());
        let f = match t.dtype {
            DType::F32 => self.func("compare_rows_f", DType::I8)?,
            dt => self.func("compare_rows_h", dt)?,
        };
        self.launch(
            f,
            grid(x.numel() as u64),
            &[&xp, &tp, &mp, &rows, &cols, &oe],
        )
    }

    pub fn sampler_masked_fill(
        &mut self,
        x: &mut TensorData,
        mask: &TensorData,
        value: f32,
    ) -> Result<()> {
        let n = x.numel() as i64;
        let (xp, mp) = (x.cuda_ptr(), mask.cuda_ptr());
        let f = self.func("masked_fill_f32", DType::I8)?;
        self.launch(f, grid(n as u64), &[&xp, &mp, &n, &value])
    }

    /// `mask[:, -1] = False`.
    pub fn sampler_clear_last_col(&mut self, mask: &mut TensorData) -> Result<()> {
        let (rows, cols) = rows_cols(mask);
        let mp = mask.cuda_ptr();
        let f = self.func("clear_last_col", DType::I8)?;
        self.launch(f, grid(rows as u64), &[&mp, &rows, &cols])
    }

    /// Row softmax, or log_softmax when `log`.
    pub fn sampler_softmax(
        &mut self,
        x: &TensorData,
        out: &mut TensorData,
        log: bool,
    ) -> Result<()> {
        let (rows, cols) = rows_cols(x);
        let lg = i32::from(log);
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("softmax_rows", DType::I8)?;
        self.launch(f, blocks(rows as u32, ROW_THREADS), &[&xp, &op, &cols, &lg])
    }

    pub fn sampler_cumsum(&mut self, x: &TensorData, out: &mut TensorData) -> Result<()> {
        let (rows, cols) = rows_cols(x);
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("cumsum_rows", DType::I8)?;
        self.launch(f, blocks(rows as u32, ROW_THREADS), &[&xp, &op, &cols])
    }

    /// `out.scatter_(-1, idx, src)`.
    pub fn sampler_scatter(
        &mut self,
        src: &TensorData,
        idx: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let (rows, cols) = rows_cols(src);
        let (sp, ip, op) = (src.cuda_ptr(), idx.cuda_ptr(), out.cuda_ptr());
        let f = self.func("scatter_rows", DType::I8)?;
        self.launch(f, grid(src.numel() as u64), &[&sp, &ip, &op, &rows, &cols])
    }

    /// `src[rows_idx]` with int64 row indices.
    pub fn sampler_index_rows(
        &mut self,
        src: &TensorData,
        rows_idx: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let (rows, cols) = rows_cols(out);
        let (sp, ip, op) = (src.cuda_ptr(), rows_idx.cuda_ptr(), out.cuda_ptr());
        let f = self.func("index_rows", DType::I8)?;
        self.launch(f, grid(out.numel() as u64), &[&sp, &ip, &op, &rows, &cols])
    }

    /// `q.exponential_()` with the counter-based draws shared with the CPU.
    pub fn sampler_exponential(&mut self, q: &mut TensorData, seed: u64) -> Result<()> {
        let n = q.numel() as i64;
        let qp = q.cuda_ptr();
        let f = self.func("exponential_fill", DType::I8)?;
        self.launch(f, grid(n as u64), &[&qp, &n, &seed])
    }

    pub fn sampler_div_assign(&mut self, x: &mut TensorData, q: &TensorData) -> Result<()> {
        let n = x.numel() as i64;
        let (xp, qp) = (x.cuda_ptr(), q.cuda_ptr());
        let f = self.func("div_assign_f32", DType::I8)?;
        self.launch(f, grid(n as u64), &[&xp, &qp, &n])
    }

    /// `x.argmax(dim=1)` into int64.
    pub fn sampler_argmax(&mut self, x: &TensorData, out: &mut TensorData) -> Result<()> {
        let (rows, cols) = rows_cols(x);
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("argmax_rows", DType::I8)?;
        self.launch(f, blocks(rows as u32, ROW_THREADS), &[&xp, &op, &cols])
    }

    /// Copies host int64 values into a device tensor.
    pub fn upload_i64(&mut self, t: &mut TensorData, values: &[i64]) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload_bytes(t, &bytes)
    }

    /// Host copy of an int64 tensor (the sampled ids' `.cpu()`).
    pub fn download_i64(&mut self, x: &TensorData) -> Result<Vec<i64>> {
        let mut v = vec![0i64; x.numel()];
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        if self.on_side_stream() {
            self.synchronize()?;
        }
        // SAFETY: the tensor holds numel int64 values; the copy waits for earlier kernels.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut v, x.cuda_ptr()) }
            .map_err(|e| self.err("copy from GPU", e))?;
        Ok(v)
    }
}

//! vLLM's fp8 (w8a8, per-tensor scales) on the GPU: `scaled_fp8_quant`'s kernels (the dynamic
//! scale, the quantization, the checkpoint's requantization at the largest scale) and the fp8
//! GEMM with its scaled epilogue on the fp8 tensor cores through cuBLASLt. vLLM 0.6.4 runs
//! CUTLASS's `cutlass_scaled_mm` there; both multiply e4m3 codes exactly and accumulate in f32,
//! then scale by `scale_a · scale_b` into the 16-bit output. The codes are encoded by the same
//! bit-level rounding as `quant::fp8::encode` (c10's), so the GPU's codes equal the host's.

use std::ffi::c_void;

use cudarc::cublaslt::{result as lt, sys as ltsys};
use cudarc::driver::result as drv;

use super::{grid, CudaDevice};
use crate::base::error::Result;
use crate::device::tensor::{DType, TensorData};

/// The fp8 kernels instantiated for both 16-bit types.
pub(crate) const TYPED: &[&str] = &["fp8_absmax", "fp8_quant"];

/// The fp8 kernels with no 16-bit operand.
pub(crate) const UNTYPED: &[&str] = &["fp8_requant"];

/// Appended to `kernels::SOURCE` (uses its `F16`, `BF16`, `block_max` and `INST`).
pub(crate) const SOURCE: &str = r#"
// c10's fp8e4m3fn_from_fp32_value, bit for bit quant::fp8::encode: round to nearest even,
// |x| >= 480 (inf and NaN too) to NaN; subnormals through one float addition.
__device__ __forceinline__ u8 fp8_encode(float x) {
  const unsigned FP8_MAX = 1087u << 20;
  const unsigned DENORM_MASK = 141u << 23;
  unsigned bits = __float_as_uint(x);
  unsigned sign = bits & 0x80000000u;
  bits ^= sign;
  unsigned code;
  if (bits >= FP8_MAX) {
    code = 0x7fu;
  } else if (bits < (121u << 23)) {
    unsigned b = __float_as_uint(__fadd_rn(__uint_as_float(bits), __uint_as_float(DENORM_MASK)));
    code = (b - DENORM_MASK) & 0xffu;
  } else {
    unsigned odd = (bits >> 20) & 1u;
    unsigned b = bits + (unsigned)((7 - 127) << 23) + 0x7ffffu + odd;
    code = (b >> 20) & 0xffu;
  }
  return (u8)(code | (sign >> 24));
}

__device__ __forceinline__ float fp8_decode(u8 c) {
  int e = (c >> 3) & 15, m = c & 7;
  float mag;
  if (e == 15 && m == 7) mag = __int_as_float(0x7fc00000);
  else if (e == 0) mag = (float)m * 0.001953125f;
  else mag = ldexpf(8.0f + (float)m, e - 10);
  return (c & 0x80) ? -mag : mag;
}

// scaled_fp8_conversion<true>: x * inv clamped to +-448 (fminf first: NaN becomes 448).
__device__ __forceinline__ u8 fp8_scaled(float x, float inv) {
  return fp8_encode(fmaxf(fminf(__fmul_rn(x, inv), 448.0f), -448.0f));
}

// dynamic_scaled_fp8_quant's segmented_max_reduction: each block's max|x| / 448 into the
// zeroed scale by an integer atomicMax (non-negative floats order as their bits).
template <class T> __device__ void fp8_absmax(const u16* x, float* scale, long long n) {
  __shared__ float sh[32];
  float m = 0.0f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    m = fmaxf(m, fabsf(T::ld(x[i])));
  m = block_max(m, sh);
  if (threadIdx.x == 0) atomicMax((unsigned*)scale, __float_as_uint(__fdiv_rn(m, 448.0f)));
}

// scaled_fp8_quant_kernel: every value at the scale's f32 inverse.
template <class T> __device__ void fp8_quant(const u16* x, const float* scale, u8* out, long long n) {
  float inv = __fdiv_rn(1.0f, scale[0]);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = fp8_scaled(T::ld(x[i]), inv);
}

INST(fp8_absmax, (const u16* x, float* s, long long n), (x, s, n))
INST(fp8_quant, (const u16* x, const float* s, u8* o, long long n), (x, s, o, n))

// requantize_with_max_scale for one shard: per_tensor_dequantize (code * scale rounded to
// float16), then scaled_fp8_quant at the largest scale's inverse; in place.
extern "C" __global__ void fp8_requant(u8* w, long long n, float scale, float inv_max) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    w[i] = fp8_scaled(F16::ld(F16::st(__fmul_rn(fp8_decode(w[i]), scale))), inv_max);
}

"#;

/// Why this GPU cannot run vLLM's w8a8 fp8 path, or `None` when it can.
fn fp8_refusal(cc: (i32, i32), gpu: &str) -> Option<String> {
    if cc >= (8, 9) {
        return None;
    }
    let why = if cc.0 >= 8 {
        "compute capability 8.0/8.6 is below the 8.9 that fp8 tensor cores need, so vLLM runs fp8 Marlin (weight-only, w8a16; fp8.py L120-121 at 0.6.4), which vramscope does not reproduce"
    } else {
        "vLLM refuses fp8 below compute capability 8.0 (Fp8Config.get_min_capability, fp8.py L63-65 at 0.6.4)"
    };
    Some(format!(
        "--quant fp8 on {gpu} (cc {}.{}): {why}",
        cc.0, cc.1
    ))
}

impl CudaDevice {
    /// Refuses fp8 on a GPU without fp8 tensor cores, naming it and vLLM's reason.
    pub fn check_fp8(&self) -> Result<()> {
        match fp8_refusal(self.cc, &self.name) {
            None => Ok(()),
            Some(why) => Err(crate::base::error::Error::Request(why)),
        }
    }

    /// `scaled_fp8_quant(x)` with a dynamic scale: the zeroed `scale` (F32 `[1]`) gets
    /// `max|x| / 448`, then `codes` (F8E4M3, as many elements as `x`) the values at it.
    pub fn fp8_quantize_dynamic(
        &mut self,
        x: &TensorData,
        scale: &mut TensorData,
        codes: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let sp = scale.cuda_ptr();
        // SAFETY: the scale holds one f32 (checked by the caller's allocation).
        unsafe { drv::memset_d8_async(sp, 0, 4, self.stream.cu_stream()) }
            .map_err(|e| self.err("memset", e))?;
        let xp = x.cuda_ptr();
        let f = self.func("fp8_absmax", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &sp, &n])?;
        self.fp8_quantize_static(x, scale, codes)
    }

    /// `scaled_fp8_quant(x, scale)` at a given device scale (F32 `[1]` or `[]`).
    pub fn fp8_quantize_static(
        &mut self,
        x: &TensorData,
        scale: &TensorData,
        codes: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(x)?;
        if codes.numel() != x.numel() || codes.dtype != DType::F8E4M3 {
            return Err(self.err(
                "fp8 quantization",
                format!("{} cannot hold the codes of {}", codes.name, x.name),
            ));
        }
        let n = x.numel() as i64;
        let (xp, sp, cp) = (x.cuda_ptr(), scale.cuda_ptr(), codes.cuda_ptr());
        let f = self.func("fp8_quant", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &sp, &cp, &n])
    }

    /// `requantize_with_max_scale` on the GPU: rows `[row0, row0 + rows)` of `codes`
    /// (`k` columns), stored at `scale`, requantized in place at `max_scale`.
    pub fn fp8_requantize_rows(
        &mut self,
        codes: &mut TensorData,
        row0: usize,
        rows: usize,
        scale: f32,
        max_scale: f32,
    ) -> Result<()> {
        let k = codes.cols();
        if (row0 + rows) * k > codes.numel() {
            return Err(self.err(
                "fp8 requantization",
                format!("rows {row0}..{} past {}", row0 + rows, codes.name),
            ));
        }
        let p = codes.cuda_ptr() + (row0 * k) as u64;
        let n = (rows * k) as i64;
        let inv = 1.0f32 / max_scale;
        let f = self.func("fp8_requant", DType::F32)?;
        self.launch(f, grid(n as u64), &[&p, &n, &scale, &inv])
    }

    /// The bytes of a tensor, on the host (the codes, for checks).
    pub fn download_bytes(&mut self, x: &TensorData) -> Result<Vec<u8>> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        if self.on_side_stream() {
            self.synchronize()?;
        }
        let mut v = vec![0u8; x.nbytes() as usize];
        // SAFETY: the tensor holds nbytes bytes; the copy waits for the kernels before it.
        unsafe { drv::memcpy_dtoh_sync(&mut v, x.cuda_ptr()) }
            .map_err(|e| self.err("copy from GPU", e))?;
        Ok(v)
    }

    pub(super) fn blaslt(&mut self) -> Result<ltsys::cublasLtHandle_t> {
        if let Some(h) = self.blaslt {
            return Ok(h);
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        let h = lt::create_handle().map_err(|e| self.err("cuBLASLt handle", e))?;
        self.blaslt = Some(h);
        Ok(h)
    }

    /// `cutlass_scaled_mm(qinput, qweight.t(), out_dtype, scale_a, scale_b)`: `out [m, Σ rows]
    /// = (qx [m, k] · qw [Σ rows, k]ᵀ) · x_scale · w_scale` in f32, rounded to the output's
    /// 16-bit type; the output holds each shard's columns as one contiguous `[m, rows[i]]`
    /// block (as `FusedLinear` lays it out). cuBLASLt's fp8 GEMM (TN layout, f32 accumulation,
    /// the two scales as device pointers), without a workspace: vLLM's CUTLASS kernel takes
    /// none from PyTorch's allocator either.
    pub fn fp8_scaled_mm(
        &mut self,
        qx: &TensorData,
        x_scale: &TensorData,
        qw: &TensorData,
        w_scale: &TensorData,
        out: &mut TensorData,
        rows: &[usize],
    ) -> Result<()> {
        let out_dt = self.half(out)?;
        let (m, k) = (qx.rows(), qx.cols());
        let total: usize = rows.iter().sum();
        if qw.cols() != k || qw.rows() != total || out.numel() != m * total {
            return Err(self.err(
                "fp8 GEMM",
                format!(
                    "{} [{m}, {k}] · {} {:?} into {} {:?} do not fit",
                    qx.name, qw.name, qw.shape, out.name, out.shape
                ),
            ));
        }
        if !k.is_multiple_of(16) || rows.iter().any(|r| !r.is_multiple_of(16)) {
            return Err(self.err(
                "fp8 GEMM",
                format!(
                    "{}: fp8 tensor cores need dimensions that are multiples of 16 (k {k}, rows {rows:?})",
                    qw.name
                ),
            ));
        }
        let h = self.blaslt()?;
        let d_type = match out_dt {
            DType::BF16 => ltsys::cudaDataType::CUDA_R_16BF,
            _ => ltsys::cudaDataType::CUDA_R_16F,
        };
        let e4m3 = ltsys::cudaDataType::CUDA_R_8F_E4M3;
        let (a_scale, b_scale) = (w_scale.cuda_ptr(), x_scale.cuda_ptr());
        let stream = self.stream.cu_stream() as ltsys::cudaStream_t;
        let (mut r0, mut block) = (0usize, 0usize);
        for &n in rows {
            let a = qw.cuda_ptr() + (r0 * k) as u64;
            let d = out.cuda_ptr() + (block * out_dt.size_bytes() as usize) as u64;
            // Column-major: Dᵀ [n, m] = op(A) · B with A the weight stored k×n (ld k, op T)
            // and B the input stored k×m (ld k): the TN layout fp8 requires.
            let g = LtGemm {
                n,
                m,
                k,
                a,
                b: qx.cuda_ptr(),
                d,
                a_scale,
                b_scale,
                ab_type: e4m3,
                d_type,
            };
            // SAFETY: every pointer is a live device tensor sized by the shapes checked above;
            // the scales are device f32 scalars.
            unsafe { self.lt_matmul(h, &g, stream) }
                .map_err(|e| self.err("cuBLASLt fp8 GEMM", e))?;
            r0 += n;
            block += m * n;
        }
        Ok(())
    }

    /// One cuBLASLt matmul; its algorithm is chosen once per shape and kept.
    unsafe fn lt_matmul(
        &mut self,
        h: ltsys::cublasLtHandle_t,
        g: &LtGemm,
        stream: ltsys::cudaStream_t,
    ) -> std::result::Result<(), String> {
        let e = |what: &str, err: lt::CublasError| format!("{what}: {err:?}");
        let desc = lt::create_matmul_desc(
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|x| e("descriptor", x))?;
        let layouts = (|| {
            let a = lt::create_matrix_layout(g.ab_type, g.k as u64, g.n as u64, g.k as i64)?;
            let b = lt::create_matrix_layout(g.ab_type, g.k as u64, g.m as u64, g.k as i64)?;
            let d = lt::create_matrix_layout(g.d_type, g.n as u64, g.m as u64, g.n as i64)?;
            Ok::<_, lt::CublasError>((a, b, d))
        })();
        let result = match layouts {
            Err(x) => Err(e("layout", x)),
            Ok((la, lb, ld)) => {
                let r = self.lt_run(h, desc, (la, lb, ld), g, stream);
                let _ = lt::destroy_matrix_layout(la);
                let _ = lt::destroy_matrix_layout(lb);
                let _ = lt::destroy_matrix_layout(ld);
                r
            }
        };
        let _ = lt::destroy_matmul_desc(desc);
        result
    }

    unsafe fn lt_run(
        &mut self,
        h: ltsys::cublasLtHandle_t,
        desc: ltsys::cublasLtMatmulDesc_t,
        (la, lb, ld): (
            ltsys::cublasLtMatrixLayout_t,
            ltsys::cublasLtMatrixLayout_t,
            ltsys::cublasLtMatrixLayout_t,
        ),
        g: &LtGemm,
        stream: ltsys::cudaStream_t,
    ) -> std::result::Result<(), String> {
        use ltsys::cublasLtMatmulDescAttributes_t as A;
        let e = |what: &str, err: lt::CublasError| format!("{what}: {err:?}");
        let set = |attr: A, v: *const c_void, size: usize| {
            lt::set_matmul_desc_attribute(desc, attr, v, size).map_err(|x| e("attribute", x))
        };
        // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let (ta, tb) = (1i32, 0i32);
        let op_size = std::mem::size_of::<i32>();
        set(
            A::CUBLASLT_MATMUL_DESC_TRANSA,
            &ta as *const _ as _,
            op_size,
        )?;
        set(
            A::CUBLASLT_MATMUL_DESC_TRANSB,
            &tb as *const _ as _,
            op_size,
        )?;
        let (pa, pb) = (g.a_scale as *const c_void, g.b_scale as *const c_void);
        let psize = std::mem::size_of::<*const c_void>();
        set(
            A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            &pa as *const _ as _,
            psize,
        )?;
        set(
            A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            &pb as *const _ as _,
            psize,
        )?;
        let key = (g.m, g.n, g.k, g.d_type as u32);
        let algo = match self.lt_algos.get(&key) {
            Some(a) => *a,
            None => {
                let pref = lt::create_matmul_pref().map_err(|x| e("preference", x))?;
                let zero: u64 = 0;
                let r = lt::set_matmul_pref_attribute(
                    pref,
                    ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &zero as *const u64 as _,
                    8,
                )
                .and_then(|_| lt::get_matmul_algo_heuristic(h, desc, la, lb, ld, ld, pref));
                let _ = lt::destroy_matmul_pref(pref);
                let found = r.map_err(|x| e("no fp8 algorithm for this shape", x))?;
                self.lt_algos.insert(key, found.algo);
                found.algo
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        lt::matmul(
            h,
            desc,
            &alpha as *const f32 as _,
            &beta as *const f32 as _,
            g.a as *const c_void,
            la,
            g.b as *const c_void,
            lb,
            g.d as *const c_void,
            ld,
            g.d as *mut c_void,
            ld,
            &algo,
            std::ptr::null_mut(),
            0,
            stream,
        )
        .map_err(|x| e("matmul", x))
    }

    /// Destroys the cuBLASLt handle (at close).
    pub(super) fn drop_blaslt(&mut self) {
        if let Some(h) = self.blaslt.take() {
            // SAFETY: no work is pending (the caller synchronized); not used again.
            let _ = unsafe { lt::destroy_handle(h) };
        }
    }
}

/// One fp8 GEMM in cuBLASLt's column-major terms (see `fp8_scaled_mm`).
struct LtGemm {
    n: usize,
    m: usize,
    k: usize,
    a: u64,
    b: u64,
    d: u64,
    a_scale: u64,
    b_scale: u64,
    ab_type: ltsys::cudaDataType,
    d_type: ltsys::cudaDataType,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_is_refused_below_compute_capability_8_9_with_vllms_reason() {
        assert!(fp8_refusal((9, 0), "H200").is_none());
        assert!(fp8_refusal((8, 9), "L4").is_none());
        let a100 = fp8_refusal((8, 0), "A100").unwrap();
        assert!(
            a100.contains("A100 (cc 8.0)") && a100.contains("Marlin"),
            "{a100}"
        );
        let t4 = fp8_refusal((7, 5), "T4").unwrap();
        assert!(
            t4.contains("refuses fp8 below compute capability 8.0"),
            "{t4}"
        );
    }
}

//! GEMMs in cuBLAS: the handle and its workspace, the row-major `Gemm` over column-major
//! cuBLAS, and the matmuls built on it (16-bit with f32 accumulation, LLM.int8's int8 with
//! int32 accumulation and its 16-bit outlier part).

use std::ffi::c_void;

use cudarc::cublas::{result as blas, sys as bsys};
use cudarc::driver::LaunchConfig;

use super::{grid, CudaDevice};
use crate::base::error::Result;
use crate::device::tensor::{DType, TensorData};
use crate::device::{LibraryWorkspace, WorkspaceBytes};

/// cuBLAS workspace, PyTorch's default on Hopper (`CUBLAS_WORKSPACE_CONFIG=:4096:8`).
const CUBLAS_WORKSPACE_BYTES: u64 = 32 << 20;

/// One GEMM's operands (row-major view), see `CudaDevice::gemm`.
#[derive(Clone, Copy)]
pub(super) struct Gemm {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) a: u64,
    pub(super) a_type: bsys::cudaDataType_t,
    pub(super) lda: usize,
    pub(super) stride_a: i64,
    pub(super) b: u64,
    pub(super) b_type: bsys::cudaDataType_t,
    pub(super) ldb: usize,
    pub(super) stride_b: i64,
    pub(super) b_trans: bool,
    pub(super) c: u64,
    pub(super) c_type: bsys::cudaDataType_t,
    pub(super) ldc: usize,
    pub(super) stride_c: i64,
    pub(super) batch: usize,
    pub(super) alpha: f32,
    pub(super) beta: f32,
    pub(super) compute: bsys::cublasComputeType_t,
}

pub(super) fn blas_type(dt: DType) -> bsys::cudaDataType_t {
    match dt {
        DType::BF16 => bsys::cudaDataType_t::CUDA_R_16BF,
        _ => bsys::cudaDataType_t::CUDA_R_16F,
    }
}

impl CudaDevice {
    /// The workspaces PyTorch takes from its caching allocator on this GPU: cuBLAS 32 MiB on
    /// Hopper (`CUBLAS_WORKSPACE_CONFIG` ":4096:8"), 8.125 MiB before; cuBLASLt 1 MiB. Measured
    /// with torch 2.11 on the H200 (scripts/torch_probe.py, docs/gpu-runs.md run 24).
    pub fn library_workspace_bytes(&self) -> WorkspaceBytes {
        WorkspaceBytes {
            cublas: if self.cc.0 >= 9 {
                CUBLAS_WORKSPACE_BYTES
            } else {
                4096 * 1024 * 2 + 16 * 1024 * 8
            },
            cublaslt: 1 << 20,
        }
    }

    /// Gives cuBLAS a framework block as its workspace (as PyTorch's handle pool does).
    pub fn set_library_workspace(&mut self, which: LibraryWorkspace, ptr: u64, bytes: u64) {
        if which != LibraryWorkspace::Cublas {
            // Our GEMMs use no cuBLASLt epilogue; the block is held as PyTorch holds it.
            return;
        }
        self.blas_workspace = Some((ptr, bytes));
        if let Some(h) = self.blas {
            // SAFETY: the block lives until `clear_library_workspaces`, called before it is freed.
            unsafe { bsys::cublasSetWorkspace_v2(h, ptr as *mut c_void, bytes as usize) };
        }
    }

    /// Detaches the workspace before its block is freed.
    pub fn clear_library_workspaces(&mut self) {
        if self.blas_workspace.take().is_some() {
            let _ = self.synchronize();
            if let Some(h) = self.blas {
                // SAFETY: detaches the workspace; cuBLAS falls back to its own.
                unsafe { bsys::cublasSetWorkspace_v2(h, std::ptr::null_mut(), 0) };
            }
        }
    }

    fn blas(&mut self) -> Result<bsys::cublasHandle_t> {
        if let Some(h) = self.blas {
            return Ok(h);
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| self.err("bind context", e))?;
        let h = blas::create_handle().map_err(|e| self.err("cuBLAS handle", e))?;
        // SAFETY: the handle is new; the null stream and the workspace outlive it.
        unsafe {
            blas::set_stream(h, self.stream.cu_stream() as _)
                .map_err(|e| self.err("cuBLAS stream", e))?;
            if let Some((ws, bytes)) = self.blas_workspace {
                bsys::cublasSetWorkspace_v2(h, ws as *mut c_void, bytes as usize);
            }
        }
        self.blas = Some(h);
        Ok(h)
    }

    /// Row-major GEMM through column-major cuBLAS: `C[m, n] = A[m, k] · B`, with B stored
    /// `[n, k]` when `b_trans` (so `A·Bᵀ`) or `[k, n]` otherwise; strided batches.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm(&mut self, g: Gemm) -> Result<()> {
        let h = self.blas()?;
        let op_b = if g.b_trans {
            bsys::cublasOperation_t::CUBLAS_OP_T
        } else {
            bsys::cublasOperation_t::CUBLAS_OP_N
        };
        let int = matches!(g.compute, bsys::cublasComputeType_t::CUBLAS_COMPUTE_32I);
        let (af, bf) = (g.alpha, g.beta);
        let (ai, bi) = (g.alpha as i32, g.beta as i32);
        let (alpha, beta): (*const c_void, *const c_void) = if int {
            (&ai as *const i32 as _, &bi as *const i32 as _)
        } else {
            (&af as *const f32 as _, &bf as *const f32 as _)
        };
        // C' = Cᵀ (n×m, column-major) = op(B)ᵀ·Aᵀ.
        // SAFETY: pointers are live device tensors and the leading dimensions match their
        // shapes (checked by the callers).
        if g.batch == 1 {
            let r = unsafe {
                blas::gemm_ex(
                    h,
                    op_b,
                    bsys::cublasOperation_t::CUBLAS_OP_N,
                    g.n as i32,
                    g.m as i32,
                    g.k as i32,
                    alpha,
                    g.b as *const c_void,
                    g.b_type,
                    g.ldb as i32,
                    g.a as *const c_void,
                    g.a_type,
                    g.lda as i32,
                    beta,
                    g.c as *mut c_void,
                    g.c_type,
                    g.ldc as i32,
                    g.compute,
                    bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            };
            return r.map_err(|e| self.err("cuBLAS GEMM", e));
        }
        // SAFETY: as above, for each of the strided batches.
        let r = unsafe {
            blas::gemm_strided_batched_ex(
                h,
                op_b,
                bsys::cublasOperation_t::CUBLAS_OP_N,
                g.n as i32,
                g.m as i32,
                g.k as i32,
                alpha,
                g.b as *const c_void,
                g.b_type,
                g.ldb as i32,
                g.stride_b,
                g.a as *const c_void,
                g.a_type,
                g.lda as i32,
                g.stride_a,
                beta,
                g.c as *mut c_void,
                g.c_type,
                g.ldc as i32,
                g.stride_c,
                g.batch as i32,
                g.compute,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        r.map_err(|e| self.err("cuBLAS GEMM", e))
    }

    /// `out [m, n] = x [m, k] · w [n, k]ᵀ` in 16 bits with f32 accumulation.
    pub fn gemm_nt(&mut self, x: &TensorData, w: &TensorData, out: &mut TensorData) -> Result<()> {
        let dt = self.half(x)?;
        let ty = blas_type(dt);
        let (m, k, n) = (x.rows(), x.cols(), w.shape[0]);
        let g = Gemm {
            m,
            n,
            k,
            a: x.cuda_ptr(),
            a_type: ty,
            lda: k,
            stride_a: 0,
            b: w.cuda_ptr(),
            b_type: blas_type(self.half(w)?),
            ldb: k,
            stride_b: 0,
            b_trans: true,
            c: out.cuda_ptr(),
            c_type: ty,
            ldc: n,
            stride_c: 0,
            batch: 1,
            alpha: 1.0,
            beta: 0.0,
            compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        // Graph warm-ups and captures (the side stream) keep cuBLAS's own choice, as PyTorch's
        // do: a tuned algorithm can launch other kernels and change what a graph holds, and
        // timing runs must not be captured.
        if self.tune_gemms && !self.on_side_stream() {
            return self.gemm_tuned(g);
        }
        self.gemm(g)
    }

    /// igemmlt: `out32 [m, n] = C32A [m, kp] · CxB [.., cp]ᵀ` in int8 with int32
    /// accumulation (cuBLAS; a dp4a kernel when cuBLAS refuses), after padding CA into C32A.
    pub fn int8_igemm(
        &mut self,
        ca: &TensorData,
        c32a: &mut TensorData,
        cxb: &TensorData,
        out32: &mut TensorData,
    ) -> Result<()> {
        let (m, k) = (ca.rows(), ca.cols());
        let kp = c32a.cols();
        let n = out32.cols();
        let cp = cxb.cols();
        if cp != kp {
            return Err(self.err(
                "int8 GEMM",
                format!("CxB has {cp} padded columns but C32A has {kp}"),
            ));
        }
        let (src, dst) = (ca.cuda_ptr(), c32a.cuda_ptr());
        let (m32, k32, kp32, n32) = (m as i32, k as i32, kp as i32, n as i32);
        let f = self.func("pad_copy_i8", DType::I8)?;
        self.launch(f, grid((m * kp) as u64), &[&src, &dst, &m32, &k32, &kp32])?;
        let r = self.gemm(Gemm {
            m,
            n,
            k: kp,
            a: dst,
            a_type: bsys::cudaDataType_t::CUDA_R_8I,
            lda: kp,
            stride_a: 0,
            b: cxb.cuda_ptr(),
            b_type: bsys::cudaDataType_t::CUDA_R_8I,
            ldb: cp,
            stride_b: 0,
            b_trans: true,
            c: out32.cuda_ptr(),
            c_type: bsys::cudaDataType_t::CUDA_R_32I,
            ldc: n,
            stride_c: 0,
            batch: 1,
            alpha: 1.0,
            beta: 0.0,
            compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32I,
        });
        if r.is_ok() {
            return Ok(());
        }
        let (bp, cp_) = (cxb.cuda_ptr(), out32.cuda_ptr());
        let f = self.func("igemm_i8", DType::I8)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(32) as u32, m.div_ceil(32) as u32, 1),
            block_dim: (32, 32, 1),
            shared_mem_bytes: 0,
        };
        self.launch(f, cfg, &[&dst, &bp, &cp_, &m32, &n32, &kp32])
    }

    /// `out += subA [m, no] · subB [no, n]` (the 16-bit outlier part).
    pub fn int8_add_outliers(
        &mut self,
        sub_a: &TensorData,
        sub_b: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let ty = blas_type(self.half(out)?);
        let (m, no, n) = (sub_a.rows(), sub_a.cols(), sub_b.cols());
        self.gemm(Gemm {
            m,
            n,
            k: no,
            a: sub_a.cuda_ptr(),
            a_type: ty,
            lda: no,
            stride_a: 0,
            b: sub_b.cuda_ptr(),
            b_type: ty,
            ldb: n,
            stride_b: 0,
            b_trans: false,
            c: out.cuda_ptr(),
            c_type: ty,
            ldc: n,
            stride_c: 0,
            batch: 1,
            alpha: 1.0,
            beta: 1.0,
            compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        })
    }
}

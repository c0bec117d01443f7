//! 16-bit GEMMs with their algorithm timed: the first `x · wᵀ` of each shape runs cuBLASLt's
//! heuristic candidates and cuBLAS's default on its own operands and keeps the fastest for the
//! process (the idea of PyTorch's TunableOp, `PYTORCH_TUNABLEOP_ENABLED=1`). The workspace is
//! cuBLAS's framework block, so no memory is taken that the dry run does not count. It is the
//! default for eager passes; CUDA graph warm-ups and captures keep cuBLAS's own choice, and
//! `VRAMSCOPE_GEMM=default` keeps it for every GEMM.

use std::ffi::c_void;
use std::rc::Rc;

use cudarc::cublaslt::{result as lt, sys as ltsys};
use cudarc::driver::sys as dsys;

use super::gemm::Gemm;
use super::CudaDevice;
use crate::base::error::Result;

/// Candidates asked of cuBLASLt's heuristic per shape.
const CANDIDATES: usize = 8;
/// Timed runs per candidate (after one untimed run).
const RUNS: usize = 3;

/// What a kept algorithm was timed for: the shape, the operands' layout, their types and the
/// workspace it was limited to (a cuBLASLt description holds the leading dimensions).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PickKey {
    mnk: (usize, usize, usize),
    leading: (usize, usize, usize),
    b_trans: bool,
    types: (u32, u32),
    workspace: u64,
}

/// The algorithm kept for one shape.
#[derive(Clone)]
pub(super) enum Pick {
    /// `cublasGemmEx` with cuBLAS's own choice.
    Default,
    /// cuBLASLt with this description (made once per shape) and algorithm.
    Lt(Rc<(Desc, ltsys::cublasLtMatmulAlgo_t)>),
}

/// Whether 16-bit GEMMs are tuned: yes unless `VRAMSCOPE_GEMM=default`. Read once per device.
pub(super) fn tuned_from_env() -> bool {
    tuned(std::env::var("VRAMSCOPE_GEMM").ok().as_deref())
}

fn tuned(setting: Option<&str>) -> bool {
    setting != Some("default")
}

/// One cuBLASLt matmul description of `g` (row-major `C[m, n] = A[m, k] · B[n, k]ᵀ`, i.e.
/// column-major `Cᵀ = op_T(B) · Aᵀ`, or `A · B[k, n]` with `op_N`), destroyed on drop.
pub(super) struct Desc {
    desc: ltsys::cublasLtMatmulDesc_t,
    b: ltsys::cublasLtMatrixLayout_t,
    a: ltsys::cublasLtMatrixLayout_t,
    c: ltsys::cublasLtMatrixLayout_t,
}

impl Desc {
    fn new(g: &Gemm) -> std::result::Result<Desc, String> {
        let e = |what: &str, err: lt::CublasError| format!("cuBLASLt {what}: {err:?}");
        let ty = |t: cudarc::cublas::sys::cudaDataType_t| match t {
            cudarc::cublas::sys::cudaDataType_t::CUDA_R_16BF => ltsys::cudaDataType::CUDA_R_16BF,
            _ => ltsys::cudaDataType::CUDA_R_16F,
        };
        // SAFETY: plain descriptor constructors; each is destroyed by `Drop` (or below when a
        // later one fails).
        unsafe {
            let desc = lt::create_matmul_desc(
                ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                ltsys::cudaDataType::CUDA_R_32F,
            )
            .map_err(|x| e("descriptor", x))?;
            // B `[n, k]` is column-major `[k, n]` taken transposed; B `[k, n]` is `[n, k]`.
            let t = i32::from(g.b_trans); // CUBLAS_OP_T or CUBLAS_OP_N
            let (b_rows, b_cols) = if g.b_trans { (g.k, g.n) } else { (g.n, g.k) };
            let layouts = lt::set_matmul_desc_attribute(
                desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &t as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
            .and_then(|_| {
                let b = lt::create_matrix_layout(
                    ty(g.b_type),
                    b_rows as u64,
                    b_cols as u64,
                    g.ldb as i64,
                )?;
                let a =
                    lt::create_matrix_layout(ty(g.a_type), g.k as u64, g.m as u64, g.lda as i64)?;
                let c =
                    lt::create_matrix_layout(ty(g.c_type), g.n as u64, g.m as u64, g.ldc as i64)?;
                Ok((b, a, c))
            });
            match layouts {
                Ok((b, a, c)) => Ok(Desc { desc, b, a, c }),
                Err(x) => {
                    let _ = lt::destroy_matmul_desc(desc);
                    Err(e("layout", x))
                }
            }
        }
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: each was created in `new` and is not used after this.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

impl CudaDevice {
    /// `gemm_nt`'s GEMM with the algorithm kept for its shape (timed on first use).
    pub(super) fn gemm_tuned(&mut self, g: Gemm) -> Result<()> {
        // Candidates were limited to the workspace at hand, so it is part of the key.
        let ws = self.blas_workspace.map_or(0, |w| w.1);
        let key = PickKey {
            mnk: (g.m, g.n, g.k),
            leading: (g.lda, g.ldb, g.ldc),
            b_trans: g.b_trans,
            types: (g.b_type as u32, g.c_type as u32),
            workspace: ws,
        };
        let pick = match self.gemm_picks.get(&key) {
            Some(p) => p.clone(),
            None => {
                let p = self.tune(&g)?;
                self.gemm_picks.insert(key, p.clone());
                p
            }
        };
        match pick {
            Pick::Default => self.gemm(g),
            Pick::Lt(plan) => self
                .lt_gemm(&g, &plan.0, &plan.1)
                .map_err(|e| self.err("cuBLASLt GEMM", e)),
        }
    }

    fn lt_gemm(
        &mut self,
        g: &Gemm,
        d: &Desc,
        algo: &ltsys::cublasLtMatmulAlgo_t,
    ) -> std::result::Result<(), String> {
        let h = self.blaslt().map_err(|e| e.to_string())?;
        let (ws, ws_bytes) = self.blas_workspace.unwrap_or((0, 0));
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the operands are live device tensors whose shapes the caller checked; the
        // workspace is cuBLAS's framework block, used on this stream only.
        unsafe {
            lt::matmul(
                h,
                d.desc,
                &alpha as *const f32 as _,
                &beta as *const f32 as _,
                g.b as *const c_void,
                d.b,
                g.a as *const c_void,
                d.a,
                g.c as *const c_void,
                d.c,
                g.c as *mut c_void,
                d.c,
                algo,
                ws as *mut c_void,
                ws_bytes as usize,
                self.stream.cu_stream() as ltsys::cudaStream_t,
            )
        }
        .map_err(|x| format!("{x:?}"))
    }

    /// Times cuBLAS's default and cuBLASLt's candidates on `g`'s operands (its output is
    /// written, as the real call will overwrite it) and returns the fastest.
    fn tune(&mut self, g: &Gemm) -> Result<Pick> {
        let d = Desc::new(g).map_err(|e| self.err("GEMM", e))?;
        let h = self.blaslt()?;
        let ws_bytes = self.blas_workspace.map_or(0, |w| w.1);
        // SAFETY: a plain C struct, all zeros is a valid (empty) result.
        let mut found: Vec<ltsys::cublasLtMatmulHeuristicResult_t> = (0..CANDIDATES)
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        let mut returned = 0i32;
        // SAFETY: `found` holds CANDIDATES results; the preference is destroyed below.
        unsafe {
            if let Ok(pref) = lt::create_matmul_pref() {
                let ok = lt::set_matmul_pref_attribute(
                    pref,
                    ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws_bytes as *const u64 as *const c_void,
                    8,
                )
                .is_ok();
                if ok {
                    let _ = ltsys::cublasLtMatmulAlgoGetHeuristic(
                        h,
                        d.desc,
                        d.b,
                        d.a,
                        d.c,
                        d.c,
                        pref,
                        CANDIDATES as i32,
                        found.as_mut_ptr(),
                        &mut returned,
                    );
                }
                let _ = lt::destroy_matmul_pref(pref);
            }
        }
        let mut best = (self.time_runs(|dev| dev.gemm(*g))?, None);
        for r in found.iter().take(returned.max(0) as usize) {
            if r.state != ltsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                continue;
            }
            let algo = r.algo;
            let t = self.time_runs(|dev| {
                dev.lt_gemm(g, &d, &algo)
                    .map_err(|e| dev.err("cuBLASLt GEMM", e))
            });
            // A candidate that fails to run is skipped; the default always remains.
            if let Ok(t) = t {
                if t < best.0 {
                    best = (t, Some(algo));
                }
            }
        }
        Ok(best
            .1
            .map_or(Pick::Default, |algo| Pick::Lt(Rc::new((d, algo)))))
    }

    /// Milliseconds per run of `f` on the stream (one untimed run, then RUNS timed).
    fn time_runs(&mut self, mut f: impl FnMut(&mut Self) -> Result<()>) -> Result<f32> {
        f(self)?;
        let ev = |dev: &Self| {
            dev.stream
                .record_event(Some(dsys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| dev.err("GEMM timing", e))
        };
        let start = ev(self)?;
        for _ in 0..RUNS {
            f(self)?;
        }
        let end = ev(self)?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| self.err("GEMM timing", e))?;
        Ok(ms / RUNS as f32)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gemms_are_tuned_unless_the_default_is_asked_for() {
        assert!(super::tuned(None));
        assert!(super::tuned(Some("tuned")));
        assert!(!super::tuned(Some("default")));
    }
}

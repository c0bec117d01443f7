//! LLM.int8 as bitsandbytes 0.44 does it (`MatMul8bitLt`) inside vLLM's 8-bit linear method:
//! row-wise absmax int8 weights `CB` with fp32 scales `SCB`; a per-layer `MatmulLtState` that
//! vLLM makes anew at generation 0 and 1 and that, on its first forward, keeps `CxB`: a second
//! int8 copy of the weight in the tiled igemmlt layout. With a threshold, input columns holding
//! outliers are computed in 16-bit against `subB`, which the state also keeps.

use std::cell::RefCell;

use crate::base::error::Result;
use crate::device::Backend;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// Row-wise absmax quantization of a `[n, k]` weight: `CB = round(127 w / absmax_row)`.
pub fn quantize_rows(w: &[f32], n: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let mut cb = vec![0i8; n * k];
    let mut scb = vec![0f32; n];
    if k == 0 {
        return (cb, scb);
    }
    // Rows are independent: runs of rows on every core.
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
    let per = n.div_ceil(threads).max(64);
    std::thread::scope(|s| {
        for ((w, cb), scb) in w[..n * k]
            .chunks(per * k)
            .zip(cb.chunks_mut(per * k))
            .zip(scb.chunks_mut(per))
        {
            s.spawn(move || {
                for ((row, out), sc) in w.chunks(k).zip(cb.chunks_mut(k)).zip(scb.iter_mut()) {
                    let a = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    *sc = a;
                    if a > 0.0 {
                        for (c, v) in out.iter_mut().zip(row) {
                            *c = (v * 127.0 / a).round().clamp(-127.0, 127.0) as i8;
                        }
                    }
                }
            });
        }
    });
    (cb, scb)
}

pub use crate::device::TileLayout;

/// What `MatmulLtState` keeps between passes.
#[derive(Default)]
pub struct MatmulLtState {
    pub cxb: Option<Tensor>,
    pub idx: Option<Tensor>,
    pub sub_b: Option<Tensor>,
}

pub struct Int8Linear {
    pub cb: Tensor,
    pub scb: Tensor,
    pub out_features: usize,
    pub in_features: usize,
    pub threshold: f32,
    pub layout: TileLayout,
    pub state: RefCell<Option<MatmulLtState>>,
}

impl Int8Linear {
    /// bitsandbytes 0.44.1 `MatMul8bitLt.forward` (autograd/_functions.py L291-433) on the
    /// bf16 input vLLM passes (`bf_x.unsqueeze(0)`, bitsandbytes.py L238-247): `x [m, k] → [m, n]`
    /// in bf16, every tensor it allocates in its order. `generation` counts this layer's
    /// previous forwards. The caller (`quant::shard_loop`) copies the result into vLLM's
    /// fused fp16 output.
    pub fn forward(&self, rt: &Runtime, x: &Tensor, name: &str, generation: u32) -> Result<Tensor> {
        let (m, k, n) = (x.rows(), self.in_features, self.out_features);
        if generation <= 1 {
            // vLLM: `matmul_states[i] = MatmulLtState()`, the old state (and its CxB) is dropped.
            let old = self.state.borrow_mut().take();
            drop(old);
            *self.state.borrow_mut() = Some(MatmulLtState::default());
        }
        rt.ensure_library_workspaces()?;
        let compute = rt.backend() == Backend::Cpu;
        let gpu = rt.backend() == Backend::Cuda;

        // 1. `F.double_quant(A.to(torch.float16), threshold)` (L322): the fp16 copy of A lives
        // until double_quant returns. Inside (functional.py L2438-2473, L2555-2611):
        // get_colrow_absmax's row and column stats and, with a threshold, its
        // `nnz_block_ptr`; then `out_col` (CAt) and `out_row` (CA). The COO list of outlier
        // values (3 × nnz elements) is not modelled: its size depends on the activations.
        rt.set_op("int8.double_quant");
        let a16 = if x.dtype == DType::F16 {
            None
        } else {
            Some(super::bnb4::convert(
                rt,
                x,
                DType::F16,
                format!("{name}.A_fp16"),
            )?)
        };
        let xa = a16.as_ref().unwrap_or(x);
        let mut sca = rt.tensor(
            format!("{name}.SCA"),
            Category::Activation,
            &[m],
            DType::F32,
        )?;
        let mut scat = rt.tensor(
            format!("{name}.SCAt"),
            Category::Activation,
            &[k],
            DType::F32,
        )?;
        let nnz_ptr = if self.threshold > 0.0 {
            let tiles = m.div_ceil(16) * 16 * k.div_ceil(256) + 1;
            Some(rt.tensor(
                format!("{name}.nnz_block_ptr"),
                Category::Activation,
                &[tiles],
                DType::I32,
            )?)
        } else {
            None
        };
        let mut cat = rt.tensor(
            format!("{name}.CAt"),
            Category::Activation,
            &[m, k],
            DType::I8,
        )?;
        let mut ca = rt.tensor(
            format!("{name}.CA"),
            Category::Activation,
            &[m, k],
            DType::I8,
        )?;
        let outliers: Vec<usize> = if gpu {
            rt.with_device(|d| {
                d.cuda().expect("cuda").int8_double_quant(
                    xa,
                    self.threshold,
                    &mut ca,
                    &mut cat,
                    &mut sca,
                    &mut scat,
                )
            })?
        } else if compute && self.threshold > 0.0 {
            let xs = xa.f32();
            (0..k)
                .filter(|&c| (0..m).any(|r| xs[r * k + c].abs() >= self.threshold))
                .collect()
        } else {
            Vec::new()
        };
        if compute {
            let xs = xa.f32();
            let is_out = |c: usize| outliers.binary_search(&c).is_ok();
            let mut rowmax = vec![0f32; m];
            for r in 0..m {
                rowmax[r] = (0..k)
                    .filter(|&c| !is_out(c))
                    .fold(0.0f32, |a, c| a.max(xs[r * k + c].abs()));
            }
            sca.f32_mut().copy_from_slice(&rowmax);
            if let crate::engine::tensor::Storage::I8(q) = &mut ca.storage {
                for r in 0..m {
                    let s = if rowmax[r] > 0.0 {
                        127.0 / rowmax[r]
                    } else {
                        0.0
                    };
                    for c in 0..k {
                        q[r * k + c] = if is_out(c) {
                            0
                        } else {
                            (xs[r * k + c] * s).round() as i8
                        };
                    }
                }
            }
        }
        drop(nnz_ptr);

        // 2. The state's CxB, built on its first forward and kept.
        let mut state_ref = self.state.borrow_mut();
        let state = state_ref.get_or_insert_with(MatmulLtState::default);
        if state.cxb.is_none() {
            rt.set_op("int8.transform_CxB");
            let (rp, cp) = self.layout.padded(n, k);
            let mut cxb = rt.tensor(
                format!("{name}.CxB"),
                Category::QuantState,
                &[rp, cp],
                DType::I8,
            )?;
            if compute {
                let cb = self.cb.i8();
                if let crate::engine::tensor::Storage::I8(dst) = &mut cxb.storage {
                    for r in 0..n {
                        dst[r * cp..r * cp + k].copy_from_slice(&cb[r * k..(r + 1) * k]);
                    }
                }
            } else if gpu {
                rt.with_device(|d| {
                    d.cuda()
                        .expect("cuda")
                        .int8_transform_cxb(&self.cb, &mut cxb)
                })?;
            }
            state.cxb = Some(cxb);
        }
        // The fp16 copy of A dies when double_quant returns; the outlier steps read A itself
        // (the same values: bf16 → fp16 is exact in range).
        let xa_dtype = xa.dtype;

        // 3. Outlier decomposition: subB (16-bit weight columns of the outliers) kept in state.
        let mut sub_a = None;
        if !outliers.is_empty() {
            rt.set_op("int8.outliers");
            let no = outliers.len();
            let mut idx = rt.tensor(
                format!("{name}.idx"),
                Category::QuantState,
                &[no],
                DType::I64,
            )?;
            if let crate::engine::tensor::Storage::I32(v) = &mut idx.storage {
                for (d, &c) in v.iter_mut().zip(&outliers) {
                    *d = c as i32;
                }
            }
            let mut sub_b = rt.tensor(
                format!("{name}.subB"),
                Category::QuantState,
                &[no, n],
                xa_dtype,
            )?;
            let mut sa = rt.tensor(
                format!("{name}.subA"),
                Category::Activation,
                &[m, no],
                xa_dtype,
            )?;
            if gpu {
                rt.with_device(|d| {
                    d.cuda().expect("cuda").int8_outliers(
                        xa, &outliers, &self.cb, &self.scb, &mut idx, &mut sub_b, &mut sa,
                    )
                })?;
            } else {
                let (cb, scb) = (self.cb.i8(), self.scb.f32());
                let sb = sub_b.f32_mut();
                for (j, &c) in outliers.iter().enumerate() {
                    for r in 0..n {
                        sb[j * n + r] = cb[r * k + c] as f32 * scb[r] / 127.0;
                    }
                }
                let xs = xa.f32();
                let sav = sa.f32_mut();
                for r in 0..m {
                    for (j, &c) in outliers.iter().enumerate() {
                        sav[r * no + j] = xs[r * k + c];
                    }
                }
            }
            state.idx = Some(idx);
            state.sub_b = Some(sub_b);
            sub_a = Some(sa);
        }
        drop(a16);

        // 4. igemmlt on the col32 copy of A, then mm_dequant to fp16 (functional.py
        // L2393-2436: with its own row and column stats, freed when it returns).
        rt.set_op("int8.igemmlt");
        let (_, kp) = TileLayout {
            row_pad: 1,
            col_pad: 32,
        }
        .padded(m, k);
        let mut c32a = rt.tensor(
            format!("{name}.C32A"),
            Category::Activation,
            &[m, kp],
            DType::I8,
        )?;
        let mut out32 = rt.tensor(
            format!("{name}.out32"),
            Category::Activation,
            &[m, n],
            DType::I32,
        )?;
        rt.set_op("int8.mm_dequant");
        let mut out = rt.tensor(
            format!("{name}.out_fp16"),
            Category::Activation,
            &[m, n],
            DType::F16,
        )?;
        let row_stats = rt.tensor(
            format!("{name}.new_row_stats"),
            Category::Activation,
            &[m],
            DType::F32,
        )?;
        let col_stats = rt.tensor(
            format!("{name}.new_col_stats"),
            Category::Activation,
            &[n],
            DType::F32,
        )?;
        if compute {
            let cxb = state.cxb.as_ref().expect("CxB built above").i8();
            let (_, cp) = self.layout.padded(n, k);
            let qa = ca.i8();
            if let crate::engine::tensor::Storage::I32(acc) = &mut out32.storage {
                for r in 0..m {
                    // A scalar int8 GEMM: Cancel is checked every few rows, not once per op.
                    if r % 8 == 0 {
                        rt.check_cancel()?;
                    }
                    let a = &qa[r * k..(r + 1) * k];
                    for c in 0..n {
                        let b = &cxb[c * cp..c * cp + k];
                        acc[r * n + c] = a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum();
                    }
                }
                let (rows, scb) = (sca.f32(), self.scb.f32());
                let o = out.f32_mut();
                for r in 0..m {
                    for c in 0..n {
                        o[r * n + c] = half::f16::from_f32(
                            acc[r * n + c] as f32 * rows[r] * scb[c] / (127.0 * 127.0),
                        )
                        .to_f32();
                    }
                }
            }
            // 5 (below) in bitsandbytes adds subA·subB after the bf16 cast; the host adds it
            // here, before rounding to bf16.
            if let (Some(sa), Some(sb)) = (&sub_a, &state.sub_b) {
                let no = outliers.len();
                let mut extra = vec![0f32; m * n];
                // subA [m, no] · subB [no, n]: subB is stored [no, n], so transpose into [n, no].
                let sbv = sb.f32();
                let mut sbt = vec![0f32; n * no];
                for j in 0..no {
                    for c in 0..n {
                        sbt[c * no + j] = sbv[j * n + c];
                    }
                }
                crate::device::cpu::matmul_nt(sa.f32(), &sbt, &mut extra, m, no, n);
                crate::device::cpu::add_assign(out.f32_mut(), &extra);
            }
        }
        if gpu {
            let cxb = state.cxb.as_ref().expect("CxB built above");
            rt.with_device(|d| {
                let c = d.cuda().expect("cuda");
                c.int8_igemm(&ca, &mut c32a, cxb, &mut out32)?;
                c.int8_dequant(&out32, &sca, &self.scb, &mut out)?;
                // As on the host: the outlier product is added before the bf16 cast.
                match (&sub_a, &state.sub_b) {
                    (Some(sa), Some(sb)) => c.int8_add_outliers(sa, sb, &mut out),
                    _ => Ok(()),
                }
            })?;
        }
        drop((row_stats, col_stats));

        // 5. `output.to(A.dtype)` (bf16), then `output += torch.matmul(subA, subB)` when there
        // are outliers (a new [m, n] product, freed after the add).
        let output = super::bnb4::convert(rt, &out, x.dtype, format!("{name}.out_bf16"))?;
        drop(out);
        if sub_a.is_some() {
            rt.set_op("int8.outliers_matmul");
            let prod = rt.tensor(
                format!("{name}.subA@subB"),
                Category::Activation,
                &[m, n],
                x.dtype,
            )?;
            drop(prod);
        }
        // 6. `clone_func(output.view(output_shape))`: vLLM's input is 3-D, so a clone
        // (L431-432); the locals (CA, CAt, SCA, SCAt, C32A, out32, subA, the pre-clone output)
        // die when forward returns.
        rt.set_op("int8.clone");
        let result = super::bnb4::convert(rt, &output, x.dtype, format!("{name}.out"))?;
        drop((c32a, out32, cat, scat, sca, ca, sub_a));
        drop(output);
        Ok(result)
    }

    /// Bytes this layer's weights take: int8 CB plus fp32 SCB.
    pub fn weight_bytes(&self) -> u64 {
        self.cb.nbytes() + self.scb.nbytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_quantization_keeps_the_row_maximum_exact() {
        let w = [0.5, -1.0, 0.25, 2.0, 1.0, -0.5];
        let (cb, scb) = quantize_rows(&w, 2, 3);
        assert_eq!(scb, vec![1.0, 2.0]);
        assert_eq!(cb, vec![64, -127, 32, 127, 64, -32]);
    }

    #[test]
    fn tiles_pad_rows_and_columns() {
        let t = TileLayout {
            row_pad: 8,
            col_pad: 32,
        };
        assert_eq!(t.padded(4096, 4096), (4096, 4096));
        assert_eq!(t.padded(3, 33), (8, 64));
    }
}

//! Quantization kernels: LLM.int8 (double quantization, the CxB layout, outlier columns,
//! dequantization; its GEMMs are in `gemm`) and bitsandbytes 4-bit dequantization.

use cudarc::driver::{result as drv, LaunchConfig};

use super::{blocks, grid, CudaDevice};
use crate::base::error::Result;
use crate::device::tensor::{DType, TensorData};

/// LLM.int8.
impl CudaDevice {
    /// bitsandbytes' CxB row tile: `col_turing` (8) on Turing and Hopper, `col_ampere` (32)
    /// on compute capability 8.x.
    pub fn cxb_row_pad(&self) -> usize {
        if self.cc.0 == 8 {
            32
        } else {
            8
        }
    }

    /// `F.double_quant`: column absmax (SCAt), the column-wise int8 copy (CAt), and the
    /// row-wise int8 copy without outlier columns (CA, SCA). Returns the outlier columns
    /// (those whose absmax reaches `threshold`; none when it is 0).
    #[allow(clippy::too_many_arguments)]
    pub fn int8_double_quant(
        &mut self,
        x: &TensorData,
        threshold: f32,
        ca: &mut TensorData,
        cat: &mut TensorData,
        sca: &mut TensorData,
        scat: &mut TensorData,
    ) -> Result<Vec<usize>> {
        let dt = self.half(x)?;
        let (m, k) = (x.rows(), x.cols());
        let (xp, cap, catp, scap, scatp) = (
            x.cuda_ptr(),
            ca.cuda_ptr(),
            cat.cuda_ptr(),
            sca.cuda_ptr(),
            scat.cuda_ptr(),
        );
        // SAFETY: scat holds k f32.
        unsafe { drv::memset_d8_async(scatp, 0, k * 4, self.stream.cu_stream()) }
            .map_err(|e| self.err("memset", e))?;
        let (m32, k32) = (m as i32, k as i32);
        let f = self.func("col_absmax", dt)?;
        let cfg = LaunchConfig {
            grid_dim: (k.div_ceil(256) as u32, m.div_ceil(256) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(f, cfg, &[&xp, &scatp, &m32, &k32])?;
        let outliers = if threshold > 0.0 {
            let col = self.download_f32(scat)?;
            (0..k).filter(|&c| col[c] >= threshold).collect()
        } else {
            Vec::new()
        };
        let f = self.func("row_quant", dt)?;
        self.launch(
            f,
            blocks(m as u32, 256),
            &[&xp, &scatp, &threshold, &cap, &scap, &k32],
        )?;
        let n = (m * k) as i64;
        let f = self.func("col_quant", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &scatp, &catp, &n, &k32])?;
        Ok(outliers)
    }

    /// CB `[n, k]` into the padded CxB tile layout `[rp, cp]`.
    pub fn int8_transform_cxb(&mut self, cb: &TensorData, cxb: &mut TensorData) -> Result<()> {
        let (n, k) = (cb.rows() as i32, cb.cols() as i32);
        let (rp, cp) = (cxb.shape[0] as i32, cxb.shape[1] as i32);
        let (src, dst) = (cb.cuda_ptr(), cxb.cuda_ptr());
        let f = self.func("cxb_transform", DType::I8)?;
        self.launch(f, grid(cxb.numel() as u64), &[&src, &dst, &n, &k, &rp, &cp])
    }

    /// Outlier decomposition: `idx` (i64 columns), `subB [no, n]` from CB and SCB, and
    /// `subA [m, no]` from the input.
    #[allow(clippy::too_many_arguments)]
    pub fn int8_outliers(
        &mut self,
        x: &TensorData,
        cols: &[usize],
        cb: &TensorData,
        scb: &TensorData,
        idx: &mut TensorData,
        sub_b: &mut TensorData,
        sub_a: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let bytes: Vec<u8> = cols
            .iter()
            .flat_map(|&c| (c as i64).to_le_bytes())
            .collect();
        self.upload_bytes(idx, &bytes)?;
        let (m, k) = (x.rows() as i32, x.cols() as i32);
        let (no, n) = (cols.len() as i32, cb.rows() as i32);
        let (ip, cbp, scbp, sbp) = (
            idx.cuda_ptr(),
            cb.cuda_ptr(),
            scb.cuda_ptr(),
            sub_b.cuda_ptr(),
        );
        let f = self.func("sub_b", dt)?;
        self.launch(
            f,
            grid(sub_b.numel() as u64),
            &[&cbp, &scbp, &ip, &sbp, &no, &n, &k],
        )?;
        let (xp, sap) = (x.cuda_ptr(), sub_a.cuda_ptr());
        let f = self.func("sub_a", dt)?;
        self.launch(
            f,
            grid(sub_a.numel() as u64),
            &[&xp, &ip, &sap, &m, &no, &k],
        )
    }

    /// mm_dequant: `out = out32 · SCA[row] · SCB[col] / 127²`.
    pub fn int8_dequant(
        &mut self,
        out32: &TensorData,
        sca: &TensorData,
        scb: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(out)?;
        let (m, n) = (out.rows() as i32, out.cols() as i32);
        let (ap, sp, bp, op) = (
            out32.cuda_ptr(),
            sca.cuda_ptr(),
            scb.cuda_ptr(),
            out.cuda_ptr(),
        );
        let f = self.func("int8_dequant", dt)?;
        self.launch(f, grid(out.numel() as u64), &[&ap, &sp, &bp, &op, &m, &n])
    }
}

/// bitsandbytes 4-bit ops (tensors and scalars in, no quantization types).
impl CudaDevice {
    /// A double-quantized absmax back to f32: `code[q] * nested_absmax[i / nested_blocksize]
    /// + offset` (`offset` a one-element f32 tensor).
    pub fn bnb4_nested_absmax(
        &mut self,
        q: &TensorData,
        nested_absmax: &TensorData,
        code: &TensorData,
        offset: &TensorData,
        nested_blocksize: usize,
        out: &mut TensorData,
    ) -> Result<()> {
        let n = q.numel() as i64;
        let nb = nested_blocksize as i32;
        let (qp, ap, cp, op, outp) = (
            q.cuda_ptr(),
            nested_absmax.cuda_ptr(),
            code.cuda_ptr(),
            offset.cuda_ptr(),
            out.cuda_ptr(),
        );
        let f = self.func("bnb4_nested_absmax", DType::F32)?;
        self.launch(f, grid(n as u64), &[&qp, &ap, &cp, &op, &outp, &n, &nb])
    }

    /// bitsandbytes `dequantize_4bit` into `out` (f16, bf16 or f32): NF4, or FP4 when `fp4`.
    pub fn bnb4_dequantize(
        &mut self,
        packed: &TensorData,
        absmax: &TensorData,
        fp4: bool,
        blocksize: usize,
        out: &mut TensorData,
    ) -> Result<()> {
        let n = out.numel() as i64;
        let (bs, fp) = (blocksize as i32, i32::from(fp4));
        let (pp, ap, op) = (packed.cuda_ptr(), absmax.cuda_ptr(), out.cuda_ptr());
        let f = if out.dtype == DType::F32 {
            self.func("bnb4_dequant_f32", DType::F32)?
        } else {
            self.func("bnb4_dequant", self.half(out)?)?
        };
        self.launch(f, grid(n as u64), &[&pp, &ap, &op, &n, &bs, &fp])
    }
}

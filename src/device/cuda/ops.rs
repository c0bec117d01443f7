//! Kernel compilation (NVRTC, once per device) and the kernel launches of the model's
//! elementwise ops, norms, embedding gathers and RoPE.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{sys as dsys, CudaContext, CudaFunction, LaunchConfig};

use super::{aligned16, blocks, families, fp8, grid, kernels, moe, sampler, w4, CudaDevice};
use crate::base::error::Result;
use crate::device::cpu::AttnShape;
use crate::device::tensor::{DType, TensorData};

pub(super) fn compile_kernels(
    ctx: &Arc<CudaContext>,
    cc: (i32, i32),
) -> std::result::Result<HashMap<String, CudaFunction>, String> {
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let source = format!(
        "{}{}{}{}{}{}{}",
        kernels::SOURCE,
        families::SOURCE,
        sampler::SOURCE,
        kernels::OPT_BNB_SOURCE,
        fp8::SOURCE,
        moe::SOURCE,
        crate::device::synth::SOURCE
    );
    // A cubin for this GPU, cached on disk; PTX for the driver to JIT where NVRTC cannot.
    let module = match super::kcache::load_cached(ctx, &source, &format!("sm_{}{}", cc.0, cc.1)) {
        Ok(m) => m,
        Err(_) => {
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts)
                .map_err(|e| format!("NVRTC could not compile the kernels: {e}"))?;
            ctx.load_module(ptx)
                .map_err(|e| format!("loading the kernels: {e}"))?
        }
    };
    let mut names: Vec<String> = kernels::UNTYPED
        .iter()
        .chain(sampler::UNTYPED)
        .chain(kernels::OPT_BNB_UNTYPED)
        .chain(fp8::UNTYPED)
        .chain(moe::UNTYPED)
        .chain(families::UNTYPED)
        .chain([
            &crate::device::synth::NAME,
            &crate::device::synth::INT8_NAME,
        ])
        .map(|s| s.to_string())
        .collect();
    for n in kernels::TYPED
        .iter()
        .chain(sampler::TYPED)
        .chain(kernels::OPT_BNB_TYPED)
        .chain(fp8::TYPED)
        .chain(moe::TYPED)
        .chain(families::TYPED)
    {
        names.push(format!("{n}_f16"));
        names.push(format!("{n}_bf16"));
    }
    let mut funcs = HashMap::new();
    for n in names {
        let f = module
            .load_function(&n)
            .map_err(|e| format!("kernel {n}: {e}"))?;
        funcs.insert(n, f);
    }
    // The fused attention uses sm_80 PTX (mma.sync with bf16, cp.async, ldmatrix); older GPUs
    // keep the cuBLAS attention.
    if cc.0 >= 8 {
        let compile = |src: &str, arch: String| {
            // compute_XY → sm_XY for the cached cubin.
            if let Ok(m) = super::kcache::load_cached(ctx, src, &arch.replace("compute_", "sm_")) {
                return Ok(m);
            }
            let opts = cudarc::nvrtc::CompileOptions {
                options: vec![format!("--gpu-architecture={arch}")],
                ..Default::default()
            };
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
                .map_err(|e| format!("NVRTC could not compile the attention kernels: {e}"))?;
            ctx.load_module(ptx)
                .map_err(|e| format!("loading the attention kernels: {e}"))
        };
        // Hopper also gets the warpgroup-MMA kernels (sm_90a PTX); if that build fails (an
        // older NVRTC), the portable kernels alone.
        let hopper = (cc == (9, 0))
            .then(|| {
                compile(
                    &format!(
                        "{}{}{}{}{}",
                        kernels::FLASH_SOURCE,
                        w4::SOURCE,
                        moe::GEMM_SOURCE,
                        kernels::WGMMA_SOURCE,
                        moe::WGMMA_GEMM_SOURCE
                    ),
                    "compute_90a".into(),
                )
                .ok()
            })
            .flatten();
        let with_wgmma = hopper.is_some();
        let module = match hopper {
            Some(m) => m,
            None => compile(
                &format!(
                    "{}{}{}",
                    kernels::FLASH_SOURCE,
                    w4::SOURCE,
                    moe::GEMM_SOURCE
                ),
                format!("compute_{}{}", cc.0, cc.1),
            )?,
        };
        for n in w4::NAMES.iter().chain(moe::GEMM_NAMES) {
            for suffix in ["f16", "bf16"] {
                let name = format!("{n}_{suffix}");
                let f = module
                    .load_function(&name)
                    .map_err(|e| format!("kernel {name}: {e}"))?;
                funcs.insert(name, f);
            }
        }
        if with_wgmma {
            for (n, smem) in moe::WGMMA_GEMMS {
                for suffix in ["f16", "bf16"] {
                    let name = format!("{n}_{suffix}");
                    let f = module
                        .load_function(&name)
                        .map_err(|e| format!("kernel {name}: {e}"))?;
                    let attr =
                        dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                    if f.set_attribute(attr, *smem as i32).is_ok() {
                        funcs.insert(name, f);
                    }
                }
            }
        }
        for k in kernels::FLASH.iter().filter(|k| with_wgmma || !k.sm90a) {
            for suffix in ["f16", "bf16"] {
                let name = format!("{}_{suffix}", k.name);
                let f = module
                    .load_function(&name)
                    .map_err(|e| format!("kernel {name}: {e}"))?;
                if k.smem > 0 {
                    // Above 48 KiB a kernel must ask for its dynamic shared memory. A GPU
                    // without that much keeps the other kernels (the dispatch checks).
                    let attr =
                        dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                    if f.set_attribute(attr, k.smem as i32).is_err() {
                        continue;
                    }
                }
                funcs.insert(name, f);
            }
        }
    }
    Ok(funcs)
}

impl CudaDevice {
    pub fn embedding(
        &mut self,
        ids: &[u32],
        table: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        self.gather(ids, table, out)
    }

    fn gather(&mut self, rows: &[u32], src: &TensorData, out: &mut TensorData) -> Result<()> {
        let dt = self.half(src)?;
        if rows.is_empty() {
            return Ok(());
        }
        let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
        let ids = self.stage(&bytes)?;
        let cols = src.cols() as i64;
        let (t, o) = (src.cuda_ptr(), out.cuda_ptr());
        let f = self.func("embedding", dt)?;
        self.launch(f, blocks(rows.len() as u32, 256), &[&ids, &t, &o, &cols])
    }

    pub fn gather_rows(
        &mut self,
        x: &TensorData,
        rows: &[u32],
        out: &mut TensorData,
    ) -> Result<()> {
        self.gather(rows, x, out)
    }

    pub fn rms_norm(
        &mut self,
        x: &TensorData,
        w: &TensorData,
        eps: f32,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(x)?;
        // Rows of the weight's length: a model's hidden size, or one head (Qwen3's q/k norm).
        let cols = w.numel() as i32;
        let rows = (x.numel() / w.numel().max(1)) as u32;
        let (xp, wp, op) = (x.cuda_ptr(), w.cuda_ptr(), out.cuda_ptr());
        let v8 = cols % 8 == 0 && aligned16(&[xp, wp, op]);
        if v8 && cols <= 256 {
            // A warp a row: a head's width would leave most of a 256-thread block idle.
            let f = self.func("rms_norm_v8w", dt)?;
            let n = rows as i64;
            return self.launch(
                f,
                blocks(rows.div_ceil(8), 256),
                &[&xp, &wp, &op, &cols, &eps, &n],
            );
        }
        let f = if v8 {
            self.func("rms_norm_v8", dt)?
        } else {
            self.func("rms_norm", dt)?
        };
        self.launch(f, blocks(rows, 256), &[&xp, &wp, &op, &cols, &eps])
    }

    pub fn add_bias(&mut self, x: &mut TensorData, b: &TensorData) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let cols = b.numel() as i32;
        let (xp, bp) = (x.cuda_ptr(), b.cuda_ptr());
        let f = self.func("add_bias", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &bp, &n, &cols])
    }

    pub fn rope(
        &mut self,
        q: &mut TensorData,
        k: &mut TensorData,
        pos: &[usize],
        shape: AttnShape,
        theta: f32,
    ) -> Result<()> {
        let dt = self.half(q)?;
        let bytes: Vec<u8> = pos.iter().flat_map(|&p| (p as i32).to_le_bytes()).collect();
        let pp = self.stage(&bytes)?;
        let hd = shape.head_dim as i32;
        let rows = pos.len() as u32;
        if shape.head_dim > 512 {
            // The kernels keep one token's angles in 256 shared floats.
            return Err(self.err("rope", format!("head_dim {} is over 512", shape.head_dim)));
        }
        let (qp, kp) = (q.cuda_ptr(), k.cuda_ptr());
        if shape.head_dim.is_multiple_of(4) && qp.is_multiple_of(4) && kp.is_multiple_of(4) {
            let (h, kvh) = (shape.heads as i32, shape.kv_heads as i32);
            let f = self.func("rope_qk", dt)?;
            return self.launch(
                f,
                blocks(rows, 256),
                &[&qp, &kp, &pp, &h, &kvh, &hd, &theta],
            );
        }
        for (t, heads) in [(&*q, shape.heads), (&*k, shape.kv_heads)] {
            let xp = t.cuda_ptr();
            let h = heads as i32;
            let f = self.func("rope", dt)?;
            self.launch(f, blocks(rows, 128), &[&xp, &pp, &h, &hd, &theta])?;
        }
        Ok(())
    }

    pub fn add_assign(&mut self, x: &mut TensorData, y: &TensorData) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let (xp, yp) = (x.cuda_ptr(), y.cuda_ptr());
        if n % 8 == 0 && aligned16(&[xp, yp]) {
            let n8 = n / 8;
            let f = self.func("add_assign_v8", dt)?;
            return self.launch(f, grid(n8 as u64), &[&xp, &yp, &n8]);
        }
        let f = self.func("add_assign", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &yp, &n])
    }

    /// `out = silu(g) · u` (vLLM's `SiluAndMul` into its new output), `g` and `u` unchanged.
    pub fn silu_mul_into(
        &mut self,
        g: &TensorData,
        u: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(g)?;
        let n = g.numel() as i64;
        let (gp, up, op) = (g.cuda_ptr(), u.cuda_ptr(), out.cuda_ptr());
        if n % 8 == 0 && aligned16(&[gp, up, op]) {
            let n8 = n / 8;
            let f = self.func("silu_mul_out_v8", dt)?;
            return self.launch(f, grid(n8 as u64), &[&gp, &up, &op, &n8]);
        }
        let f = self.func("silu_mul_out", dt)?;
        self.launch(f, grid(n as u64), &[&gp, &up, &op, &n])
    }

    /// vLLM's `fused_add_rms_norm`: `residual += x`, then `x = rms_norm(residual) · w`, in one
    /// kernel where rows of up to 8192 values allow (otherwise the add, then the norm).
    pub fn add_rms_norm(
        &mut self,
        x: &mut TensorData,
        residual: &mut TensorData,
        w: &TensorData,
        eps: f32,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let cols = w.numel();
        let (xp, rp, wp) = (x.cuda_ptr(), residual.cuda_ptr(), w.cuda_ptr());
        const THREADS: usize = 256;
        if cols > 0
            && cols.is_multiple_of(8)
            && cols / 8 <= 4 * THREADS
            && x.numel().is_multiple_of(cols)
            && aligned16(&[xp, rp, wp])
        {
            let rows = (x.numel() / cols) as u32;
            let cols = cols as i32;
            let f = self.func("add_rms_norm_v8", dt)?;
            return self.launch(
                f,
                blocks(rows, THREADS as u32),
                &[&xp, &rp, &wp, &cols, &eps],
            );
        }
        self.add_assign(residual, x)?;
        self.rms_norm(residual, w, eps, x)
    }

    pub fn to_f32(&mut self, x: &TensorData, out: &mut TensorData) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("to_f32", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &op, &n])
    }

    /// Makes a preset's seeded weights in place: each stretch from its source tensor's
    /// ChaCha8 stream, as the host makes them (`device::synth`), bit for bit.
    pub fn fill_synthetic(
        &mut self,
        t: &mut TensorData,
        fills: &[crate::device::synth::SynthFill],
    ) -> Result<()> {
        let out_dt = match self.half(t)? {
            DType::BF16 => 2i32,
            _ => 1,
        };
        let numel = t.numel() as u64;
        let f = self.func(crate::device::synth::NAME, DType::I8)?;
        for s in fills {
            if s.offset.checked_add(s.count).is_none_or(|end| end > numel) || s.row_len == 0 {
                return Err(self.err(
                    "synthetic weights",
                    format!(
                        "{}: {} elements from {} in a tensor of {numel}",
                        t.name, s.count, s.offset
                    ),
                ));
            }
            if s.count == 0 {
                continue;
            }
            let round = match s.round {
                Some(DType::F16) => 1i32,
                Some(DType::BF16) => 2,
                _ => 0,
            };
            let p = t.cuda_ptr() + 2 * s.offset;
            let k = s.key;
            let norm = i32::from(s.is_norm);
            self.launch(
                f,
                grid(s.count),
                &[
                    &p,
                    &s.count,
                    &s.elem0,
                    &s.row_len,
                    &s.stride,
                    &s.valid_rows,
                    &k[0],
                    &k[1],
                    &k[2],
                    &k[3],
                    &k[4],
                    &k[5],
                    &k[6],
                    &k[7],
                    &norm,
                    &round,
                    &out_dt,
                ],
            )?;
        }
        Ok(())
    }

    /// LLM.int8's `CB [n, k]` and `SCB [n]` of a preset's seeded weight, quantized where it is
    /// made (`device::synth`'s `synth_int8_rows`): the host's `quant::int8::quantize_rows`
    /// bit for bit, into the two tensors the host path uploads into.
    pub fn synth_int8(
        &mut self,
        cb: &mut TensorData,
        scb: &mut TensorData,
        fill: &crate::device::synth::SynthFill,
    ) -> Result<()> {
        let (n, k) = match cb.shape[..] {
            [n, k] => (n as u64, k as u64),
            _ => return Err(self.err("int8 weights", format!("{}: not 2-D", cb.name))),
        };
        if cb.dtype != DType::I8
            || scb.dtype != DType::F32
            || scb.numel() as u64 != n
            || fill.row_len != k
            || fill.count != n * k
            || fill.offset != 0
        {
            return Err(self.err(
                "int8 weights",
                format!(
                    "{}: [{n}, {k}] does not match its stretch or scales",
                    cb.name
                ),
            ));
        }
        if n == 0 || k == 0 {
            return Ok(());
        }
        let f = self.func(crate::device::synth::INT8_NAME, DType::I8)?;
        let round = match fill.round {
            Some(DType::F16) => 1i32,
            Some(DType::BF16) => 2,
            _ => 0,
        };
        let key = fill.key;
        let norm = i32::from(fill.is_norm);
        let cfg = LaunchConfig {
            grid_dim: (n.min(1 << 16) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (pc, ps) = (cb.cuda_ptr(), scb.cuda_ptr());
        self.launch(
            f,
            cfg,
            &[
                &pc,
                &ps,
                &n,
                &k,
                &fill.elem0,
                &fill.stride,
                &fill.valid_rows,
                &key[0],
                &key[1],
                &key[2],
                &key[3],
                &key[4],
                &key[5],
                &key[6],
                &key[7],
                &norm,
                &round,
            ],
        )
    }

    /// Fills a 16-bit tensor with small deterministic values on the GPU (benchmark weights).
    pub fn fill_random(&mut self, t: &mut TensorData, seed: u32) -> Result<()> {
        let bf = i32::from(self.half(t)? == DType::BF16);
        let n = t.numel() as i64;
        let p = t.cuda_ptr();
        let f = self.func("fill_random", DType::I8)?;
        self.launch(f, grid(n as u64), &[&p, &n, &seed, &bf])
    }
}

/// OPT ops (tensors and scalars in).
impl CudaDevice {
    /// `nn.LayerNorm` with bias, one block a row.
    pub fn layer_norm(
        &mut self,
        x: &TensorData,
        w: &TensorData,
        b: &TensorData,
        eps: f32,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let cols = x.cols() as i32;
        let rows = (x.numel() / x.cols()) as u32;
        let (xp, wp, bp, op) = (x.cuda_ptr(), w.cuda_ptr(), b.cuda_ptr(), out.cuda_ptr());
        let f = self.func("layer_norm", dt)?;
        self.launch(f, blocks(rows, 256), &[&xp, &wp, &bp, &op, &cols, &eps])
    }

    pub fn relu(&mut self, x: &TensorData, out: &mut TensorData) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("relu", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &op, &n])
    }

    /// `out = a + b` (same shapes).
    pub fn add(&mut self, a: &TensorData, b: &TensorData, out: &mut TensorData) -> Result<()> {
        let dt = self.half(a)?;
        let n = a.numel() as i64;
        let (ap, bp, op) = (a.cuda_ptr(), b.cuda_ptr(), out.cuda_ptr());
        let f = self.func("add_out", dt)?;
        self.launch(f, grid(n as u64), &[&ap, &bp, &op, &n])
    }

    /// `x.to(out.dtype)` between f16, bf16 and f32 (a copy when they are the same).
    pub fn convert_float(&mut self, x: &TensorData, out: &mut TensorData) -> Result<()> {
        let kind = |d: DType| -> Result<i32> {
            match d {
                DType::F16 => Ok(0),
                DType::BF16 => Ok(1),
                DType::F32 => Ok(2),
                other => Err(self.err("convert", format!("{} is not a float dtype", other.name()))),
            }
        };
        let (from, to) = (kind(x.dtype)?, kind(out.dtype)?);
        let n = x.numel() as i64;
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("convert_float", DType::F32)?;
        self.launch(f, grid(n as u64), &[&xp, &op, &n, &from, &to])
    }
}

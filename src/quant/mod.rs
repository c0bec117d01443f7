//! What each quantization stores, and how its linear layers run and what they keep.
//!
//! May import: `engine`, `device`, `memory`, `base`.

pub mod bnb4;
pub mod bnb_skip;
pub mod fp8;
pub mod fp8_block;
pub mod fp8_moe;
pub mod int8;
pub mod marlin;
pub mod modelopt_fp8;
pub mod mxfp4;
pub mod nf4;
pub mod nvfp4;
pub mod sparse24;

use std::rc::Rc;

use bnb4::Bnb4Type;

use serde::{Deserialize, Serialize};

use crate::base::error::{Error, Result};
use crate::device::{cpu, Backend};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quant {
    F16,
    BF16,
    /// bitsandbytes LLM.int8 (0.44 semantics).
    Int8,
    /// bitsandbytes NF4, blocks of 64, double-quantized absmax (as vLLM quantizes in
    /// flight); a pre-quantized 4-bit checkpoint loads as stored.
    Nf4,
    /// bitsandbytes FP4, blocks of 64, f32 absmax (transformers' `load_in_4bit` default).
    Fp4,
    /// vLLM's `--quantization fp8` on a 16-bit checkpoint: float8_e4m3fn weights, one f32
    /// scale per linear layer, activations quantized per tensor on every forward.
    Fp8,
    /// vLLM's `--dtype float32`: every weight and activation in f32 (V1 releases, where the
    /// attention backend is Triton's).
    F32,
}

impl Quant {
    /// The app's quantization choices (`--dtype float32` is a command-line setting of the
    /// V1 releases only, left out here).
    pub const ALL: [Quant; 6] = [
        Quant::F16,
        Quant::BF16,
        Quant::Int8,
        Quant::Nf4,
        Quant::Fp4,
        Quant::Fp8,
    ];

    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fp16" | "f16" | "float16" => Ok(Quant::F16),
            "bf16" | "bfloat16" => Ok(Quant::BF16),
            "int8" | "bnb8" | "llm.int8" => Ok(Quant::Int8),
            "nf4" | "bnb4" => Ok(Quant::Nf4),
            "fp4" => Ok(Quant::Fp4),
            "fp8" => Ok(Quant::Fp8),
            "fp32" | "f32" | "float32" => Ok(Quant::F32),
            _ => Err(Error::Request(format!(
                "quantization '{s}': expected fp16, bf16, int8, nf4, fp4, fp8 or fp32"
            ))),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Quant::F16 => "fp16",
            Quant::BF16 => "bf16",
            Quant::Int8 => "int8",
            Quant::Nf4 => "nf4",
            Quant::Fp4 => "fp4",
            Quant::Fp8 => "fp8",
            Quant::F32 => "fp32",
        }
    }

    /// Whether the linear layers keep the activation dtype (fp16, bf16, fp32).
    pub fn unquantized(self) -> bool {
        matches!(self, Quant::F16 | Quant::BF16 | Quant::F32)
    }

    /// Dtype of activations and of the weights left unquantized (embeddings, norms, lm_head).
    pub fn activation_dtype(self) -> DType {
        match self {
            Quant::BF16 => DType::BF16,
            Quant::F32 => DType::F32,
            _ => DType::F16,
        }
    }
}

impl std::fmt::Display for Quant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// A bitsandbytes 4-bit linear as its `QuantState` holds it on the device.
pub struct Bnb4Linear {
    pub quant_type: Bnb4Type,
    pub blocksize: usize,
    /// `QuantState.dtype`: what `dequantize_4bit` writes.
    pub dtype: DType,
    /// U8 `[(n·k + 1) / 2]`, two codes a byte.
    pub packed: Tensor,
    /// F32 `[16]` (`quant_map`).
    pub code: Tensor,
    /// F32 `[blocks]`, or U8 `[blocks]` under double quantization.
    pub absmax: Tensor,
    pub nested: Option<Bnb4Nested>,
    pub out_features: usize,
    pub in_features: usize,
}

/// `QuantState.state2` and `offset` of a double-quantized absmax.
pub struct Bnb4Nested {
    /// F32 `[ceil(blocks / blocksize)]`.
    pub absmax: Tensor,
    /// F32 `[256]`, the dynamic code book. Quantizing in flight, bitsandbytes keeps one for
    /// the whole process (`name2qmap["dynamic"]`); a checkpoint gives each weight its own.
    pub code: Rc<Tensor>,
    /// Whether this weight's bytes include `code` (the first holder of a shared one does).
    pub counts_code: bool,
    /// F32 scalar on the device (`absmax.mean()`, or `torch.tensor(nested_offset)`).
    pub offset: Tensor,
    pub offset_value: f32,
    pub blocksize: usize,
}

impl Bnb4Linear {
    pub fn weight_bytes(&self) -> u64 {
        let mut b = self.packed.nbytes() + self.code.nbytes() + self.absmax.nbytes();
        if let Some(n) = &self.nested {
            b += n.absmax.nbytes() + n.offset.nbytes();
            if n.counts_code {
                b += n.code.nbytes();
            }
        }
        b
    }
}

/// A linear layer with PyTorch's `[out_features, in_features]` weight.
// A model holds a few hundred of these; boxing the int8 variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Linear {
    Dense(Tensor),
    Int8(int8::Int8Linear),
    Bnb4(Bnb4Linear),
    Fp8(fp8::Fp8Linear),
    /// Block-wise fp8 as stored (vLLM 0.8.5's `weight_block_size`).
    Fp8Block(Box<fp8_block::Fp8BlockLinear>),
    /// AWQ or GPTQ 4-bit, repacked for Marlin after loading.
    Marlin(Box<marlin::MarlinLinear>),
    /// NVFP4 (compressed-tensors or ModelOpt), repacked for Marlin FP4 after loading.
    Nvfp4(Box<nvfp4::Nvfp4Linear>),
    /// 2:4 sparse (compressed-tensors), compressed by CUTLASS after loading.
    Sparse24(Box<sparse24::Sparse24Linear>),
}

impl Linear {
    pub fn out_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.shape[0],
            Linear::Int8(l) => l.out_features,
            Linear::Bnb4(l) => l.out_features,
            Linear::Fp8(l) => l.out_features,
            Linear::Fp8Block(l) => l.out_features,
            Linear::Marlin(l) => l.out_features,
            Linear::Nvfp4(l) => l.out_features,
            Linear::Sparse24(l) => l.out_features,
        }
    }

    /// Bytes of the stored weight (and its scales).
    pub fn weight_bytes(&self) -> u64 {
        match self {
            Linear::Dense(w) => w.nbytes(),
            Linear::Int8(l) => l.weight_bytes(),
            Linear::Bnb4(l) => l.weight_bytes(),
            Linear::Fp8(l) => l.weight_bytes(),
            Linear::Fp8Block(l) => l.weight_bytes(),
            Linear::Marlin(l) => l.weight_bytes(),
            Linear::Nvfp4(l) => l.weight_bytes(),
            Linear::Sparse24(l) => l.weight_bytes(),
        }
    }

    /// `x [m, in] → [m, out]`; `generation` counts this layer's earlier forwards.
    pub fn forward(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        generation: u32,
        act: DType,
    ) -> Result<Tensor> {
        rt.check_cancel()?;
        match self {
            Linear::Dense(w) => dense_matmul(rt, x, w, name, act),
            Linear::Fp8(l) => l.forward(rt, x, name, act, &[l.out_features]),
            Linear::Fp8Block(l) => l.forward(rt, x, name, act, &[l.out_features]),
            Linear::Marlin(l) => l.forward(rt, x, name, act, &[l.out_features]),
            Linear::Nvfp4(l) => l.forward(rt, x, name, act, &[l.out_features]),
            Linear::Sparse24(l) => l.forward(rt, x, name, act, &[l.out_features]),
            Linear::Int8(_) | Linear::Bnb4(_) => {
                shard_loop(rt, std::slice::from_ref(self), x, name, generation, act)
            }
        }
    }
}

/// vLLM's `QKVParallelLinear` and `MergedColumnParallelLinear` (linear.py): shards stacked
/// along the output into one parameter, filled through `stacked_params_mapping` (llama.py
/// `load_weights`), and one `[tokens, Σ nᵢ]` output that the model then splits into views.
pub enum FusedLinear {
    /// One `[Σ nᵢ, k]` 16-bit weight and one GEMM into one output (`F.linear`).
    Dense { weight: Tensor, rows: Vec<usize> },
    /// bitsandbytes: one quantized linear per shard, run in vLLM's per-shard loop
    /// (bitsandbytes.py `_apply_8bit_weight` L204-273, `_apply_4bit_weight` L275-316). vLLM
    /// keeps the shards' codes in one qweight; here each shard holds its own (the same bytes,
    /// in one allocation per shard).
    Shards(Vec<Linear>),
    /// fp8: vLLM quantizes the stacked parameter as one tensor (one scale for all shards),
    /// and one `apply_fp8_linear` writes the fused output.
    Fp8 {
        linear: Box<fp8::Fp8Linear>,
        rows: Vec<usize>,
    },
    /// Block-wise fp8: the shards' codes and `weight_scale_inv` grids stacked along the
    /// output in one parameter each, one `apply_w8a8_block_fp8_linear` into the fused output.
    Fp8Block {
        linear: Box<fp8_block::Fp8BlockLinear>,
        rows: Vec<usize>,
    },
    /// AWQ / GPTQ: the shards' packed codes, zeros and scales stacked along the output in
    /// one set of parameters (vLLM's `PackedvLLMParameter` with `output_partition_sizes`),
    /// one `gptq_marlin_gemm` into the fused output.
    Marlin {
        linear: Box<marlin::MarlinLinear>,
        rows: Vec<usize>,
    },
    /// NVFP4: the shards' codes and block scales stacked along the output, one global scale
    /// (the shards' largest), one Marlin FP4 GEMM into the fused output.
    Nvfp4 {
        linear: Box<nvfp4::Nvfp4Linear>,
        rows: Vec<usize>,
    },
    /// 2:4 sparse: one `CompressedTensors24` layer for the stacked shards, one sparse GEMM
    /// into the fused output.
    Sparse24 {
        linear: Box<sparse24::Sparse24Linear>,
        rows: Vec<usize>,
    },
}

impl FusedLinear {
    /// Output features of each shard, in order.
    pub fn shard_rows(&self) -> Vec<usize> {
        match self {
            FusedLinear::Dense { rows, .. } => rows.clone(),
            FusedLinear::Shards(s) => s.iter().map(Linear::out_features).collect(),
            FusedLinear::Fp8 { rows, .. } => rows.clone(),
            FusedLinear::Fp8Block { rows, .. } => rows.clone(),
            FusedLinear::Marlin { rows, .. } => rows.clone(),
            FusedLinear::Nvfp4 { rows, .. } => rows.clone(),
            FusedLinear::Sparse24 { rows, .. } => rows.clone(),
        }
    }

    pub fn weight_bytes(&self) -> u64 {
        match self {
            FusedLinear::Dense { weight, .. } => weight.nbytes(),
            FusedLinear::Shards(s) => s.iter().map(Linear::weight_bytes).sum(),
            FusedLinear::Fp8 { linear, .. } => linear.weight_bytes(),
            FusedLinear::Fp8Block { linear, .. } => linear.weight_bytes(),
            FusedLinear::Marlin { linear, .. } => linear.weight_bytes(),
            FusedLinear::Nvfp4 { linear, .. } => linear.weight_bytes(),
            FusedLinear::Sparse24 { linear, .. } => linear.weight_bytes(),
        }
    }

    /// `x [m, k] → [m, Σ nᵢ]`, one output allocation. On a device the output holds each
    /// shard's columns as one contiguous block (`[m, n₀]`, then `[m, n₁]`, ...): the
    /// allocation is vLLM's, the layout inside it ours, so that `split` gives contiguous
    /// views. `FusedLinear::split` makes them.
    pub fn forward(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        generation: u32,
        act: DType,
    ) -> Result<Tensor> {
        rt.check_cancel()?;
        match self {
            FusedLinear::Dense { weight, rows } => {
                rt.ensure_library_workspaces()?;
                rt.set_op_for("matmul", name.rsplit('.').next().unwrap_or(name));
                let (m, k) = (x.rows(), x.cols());
                if weight.cols() != k {
                    return Err(Error::Request(format!(
                        "{name}: input has {k} features but the weight {} expects {}",
                        weight.name,
                        weight.cols()
                    )));
                }
                let total: usize = rows.iter().sum();
                let mut out = rt.tensor_for_overwrite(
                    format!("{name}.out"),
                    Category::Activation,
                    &[m, total],
                    act,
                )?;
                let mut r0 = 0;
                for &n in rows {
                    match rt.backend() {
                        Backend::Dry => {}
                        Backend::Cpu => {
                            let c = rt.cancel_flag();
                            let w = &weight.f32()[r0 * k..(r0 + n) * k];
                            let o = &mut out.f32_mut()[m * r0..m * (r0 + n)];
                            cpu::matmul_nt_cancellable(x.f32(), w, o, (m, k, n), &c)?
                        }
                        Backend::Cuda => {
                            let w = weight.part(&weight.name, r0 * k, &[n, k]);
                            let mut o = out.part(&out.name, m * r0, &[m, n]);
                            crate::engine::ops::cuda(rt, |c| c.gemm_nt(x, &w, &mut o))?
                        }
                    }
                    r0 += n;
                }
                Ok(out)
            }
            FusedLinear::Shards(shards) => shard_loop(rt, shards, x, name, generation, act),
            FusedLinear::Fp8 { linear, rows } => linear.forward(rt, x, name, act, rows),
            FusedLinear::Fp8Block { linear, rows } => linear.forward(rt, x, name, act, rows),
            FusedLinear::Marlin { linear, rows } => linear.forward(rt, x, name, act, rows),
            FusedLinear::Nvfp4 { linear, rows } => linear.forward(rt, x, name, act, rows),
            FusedLinear::Sparse24 { linear, rows } => linear.forward(rt, x, name, act, rows),
        }
    }

    /// Views of consecutive runs of a 1-D tensor (a fused bias), one per shard.
    pub fn split_flat(t: &Tensor, rows: &[usize], names: &[String]) -> Vec<Tensor> {
        let mut r0 = 0;
        rows.iter()
            .zip(names)
            .map(|(&n, nm)| {
                let v = t.part(nm.clone(), r0, &[n]);
                r0 += n;
                v
            })
            .collect()
    }

    /// vLLM's `qkv.split([...], dim=-1)` / `gate_up` halves: views of the fused output, one per
    /// shard, named `{prefix}.{names[i]}`. Dropping them frees nothing; the fused output's
    /// block is freed when it is dropped.
    pub fn split(out: &Tensor, rows: &[usize], names: &[String]) -> Vec<Tensor> {
        let m = out.rows();
        let mut r0 = 0;
        rows.iter()
            .zip(names)
            .map(|(&n, nm)| {
                let v = out.part(nm.clone(), m * r0, &[m, n]);
                r0 += n;
                v
            })
            .collect()
    }
}

/// A weight decoded on the host a run of output rows at a time (`decode(r0..r1, buf)` fills
/// rows `r0..r1` of the `[n, k]` weight as f32), multiplied with `x [m, k]` in f32, and each
/// product passed through `epilogue` into `out`, which holds each shard's columns as one
/// contiguous `[m, rows[i]]` block (as `FusedLinear` lays it out). The host side of the
/// formats whose weights are not kept as f32 (fp8, AWQ/GPTQ).
///
/// Each run of 256 rows is decoded and multiplied on one pool thread, the runs spread over
/// all of them: decoding is most of the work at a pass's few tokens, and one thread decoding
/// for all (as before) left a 16-core host at one core's rate (Llama-3-8B AWQ, 16 tokens:
/// minutes a pass). Every product is the same sum as one whole GEMM's row.
pub(crate) fn host_decoded_matmul(
    rt: &Runtime,
    x: &[f32],
    (m, k): (usize, usize),
    rows: &[usize],
    out: &mut [f32],
    decode: impl Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
    epilogue: impl Fn(f32) -> f32 + Sync,
) -> Result<()> {
    use rayon::prelude::*;
    const CHUNK: usize = 256;
    let cancel = rt.cancel_flag();
    // (first weight row, first column in its shard, rows in the run, shard, its block).
    let mut runs = Vec::new();
    let (mut r0, mut block) = (0, 0);
    for &shard in rows {
        for c0 in (0..shard).step_by(CHUNK) {
            runs.push((r0 + c0, c0, CHUNK.min(shard - c0), shard, block));
        }
        r0 += shard;
        block += m * shard;
    }
    let products: Vec<Vec<f32>> = runs
        .par_iter()
        .map_init(
            || vec![0f32; CHUNK * k],
            |wbuf, &(w0, _, c, _, _)| -> Result<Vec<f32>> {
                if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                    return Err(Error::Cancelled);
                }
                decode(w0..w0 + c, &mut wbuf[..c * k]);
                let mut acc = vec![0f32; m * c];
                cpu::matmul_nt_serial(x, &wbuf[..c * k], &mut acc, m, k, c);
                Ok(acc)
            },
        )
        .collect::<Result<_>>()?;
    for (&(_, c0, c, shard, block), acc) in runs.iter().zip(&products) {
        for r in 0..m {
            let dst = &mut out[block + r * shard + c0..block + r * shard + c0 + c];
            for (d, &a) in dst.iter_mut().zip(&acc[r * c..(r + 1) * c]) {
                *d = epilogue(a);
            }
        }
    }
    Ok(())
}

/// The per-shard loop of vLLM's bitsandbytes linear method: `bf_x = x.to(bf16)`;
/// `out = empty(T, Σ nᵢ)` (fp16 for 8-bit, bf16 for 4-bit); each shard's matmul result copied
/// into its columns of `out` and freed; `out.to(x.dtype)`.
fn shard_loop(
    rt: &Runtime,
    shards: &[Linear],
    x: &Tensor,
    name: &str,
    generation: u32,
    act: DType,
) -> Result<Tensor> {
    let m = x.rows();
    let total: usize = shards.iter().map(Linear::out_features).sum();
    let out_dtype = match shards.first() {
        Some(Linear::Int8(_)) => DType::F16,
        Some(Linear::Bnb4(_)) => DType::BF16,
        _ => act,
    };
    rt.set_op(match shards.first() {
        Some(Linear::Int8(_)) => "int8.matmul",
        _ => "bnb4.matmul",
    });
    let bf_x = (x.dtype != DType::BF16)
        .then(|| bnb4::convert(rt, x, DType::BF16, format!("{name}.bf_x")))
        .transpose()?;
    let xb = bf_x.as_ref().unwrap_or(x);
    let out_name = if out_dtype == act {
        format!("{name}.out")
    } else {
        format!("{name}.out_{}", out_dtype.name())
    };
    let mut out = rt.tensor(out_name, Category::Activation, &[m, total], out_dtype)?;
    let mut r0 = 0;
    for (i, shard) in shards.iter().enumerate() {
        let sname = if shards.len() == 1 {
            name.to_string()
        } else {
            format!("{name}.{i}")
        };
        let y = match shard {
            Linear::Int8(l) => l.forward(rt, xb, &sname, generation)?,
            Linear::Bnb4(l) => bnb4::shard_matmul(rt, l, xb, &sname)?,
            Linear::Dense(w) => dense_matmul(rt, xb, w, &sname, act)?,
            Linear::Fp8(l) => l.forward(rt, xb, &sname, act, &[l.out_features])?,
            Linear::Fp8Block(l) => l.forward(rt, xb, &sname, act, &[l.out_features])?,
            Linear::Marlin(l) => l.forward(rt, xb, &sname, act, &[l.out_features])?,
            Linear::Nvfp4(l) => l.forward(rt, xb, &sname, act, &[l.out_features])?,
            Linear::Sparse24(l) => l.forward(rt, xb, &sname, act, &[l.out_features])?,
        };
        let n = shard.out_features();
        crate::engine::ops::copy_into(rt, &mut out, m * r0, &y)?;
        drop(y);
        r0 += n;
    }
    let out = if out.dtype != act {
        let o = bnb4::convert(rt, &out, act, format!("{name}.out"))?;
        drop(out);
        o
    } else {
        out
    };
    drop(bf_x);
    Ok(out)
}

/// A 16-bit GEMM (cuBLAS on a GPU, which takes its workspace on first use).
pub fn dense_matmul(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    name: &str,
    act: DType,
) -> Result<Tensor> {
    dense_matmul_as(
        rt,
        x,
        w,
        name,
        act,
        &format!("{name}.out"),
        Category::Activation,
    )
}

/// `dense_matmul` with the output's tensor name and category given.
pub fn dense_matmul_as(
    rt: &Runtime,
    x: &Tensor,
    w: &Tensor,
    name: &str,
    act: DType,
    out_name: &str,
    category: Category,
) -> Result<Tensor> {
    rt.ensure_library_workspaces()?;
    rt.set_op_for("matmul", name.rsplit('.').next().unwrap_or(name));
    let (m, k, n) = (x.rows(), x.cols(), w.shape[0]);
    if w.cols() != k {
        return Err(Error::Request(format!(
            "{name}: input has {k} features but the weight {} expects {}",
            w.name,
            w.cols()
        )));
    }
    let mut out = rt.tensor_for_overwrite(out_name, category, &[m, n], act)?;
    match rt.backend() {
        Backend::Dry => {}
        Backend::Cpu => {
            let c = rt.cancel_flag();
            cpu::matmul_nt_cancellable(x.f32(), w.f32(), out.f32_mut(), (m, k, n), &c)?
        }
        Backend::Cuda => rt.with_device(|d| d.cuda().expect("cuda").gemm_nt(x, w, &mut out))?,
    }
    Ok(out)
}

//! What each quantization stores, and how its linear layers run and what they keep.

pub mod bnb4;
pub mod int8;
pub mod nf4;

use std::rc::Rc;

use bnb4::Bnb4Type;

use serde::{Deserialize, Serialize};

use crate::device::{cpu, Backend};
use crate::error::{Error, Result};
use crate::memory::Category;
use crate::runtime::Runtime;
use crate::tensor::{DType, Tensor};

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
}

impl Quant {
    pub const ALL: [Quant; 5] = [Quant::F16, Quant::BF16, Quant::Int8, Quant::Nf4, Quant::Fp4];

    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fp16" | "f16" | "float16" => Ok(Quant::F16),
            "bf16" | "bfloat16" => Ok(Quant::BF16),
            "int8" | "bnb8" | "llm.int8" => Ok(Quant::Int8),
            "nf4" | "bnb4" => Ok(Quant::Nf4),
            "fp4" => Ok(Quant::Fp4),
            _ => Err(Error::Request(format!(
                "quantization '{s}': expected fp16, bf16, int8, nf4 or fp4"
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
        }
    }

    /// Dtype of activations and of the weights left unquantized (embeddings, norms, lm_head).
    pub fn activation_dtype(self) -> DType {
        match self {
            Quant::BF16 => DType::BF16,
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
}

impl Linear {
    pub fn out_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.shape[0],
            Linear::Int8(l) => l.out_features,
            Linear::Bnb4(l) => l.out_features,
        }
    }

    /// Bytes of the stored weight (and its scales).
    pub fn weight_bytes(&self) -> u64 {
        match self {
            Linear::Dense(w) => w.nbytes(),
            Linear::Int8(l) => l.weight_bytes(),
            Linear::Bnb4(l) => l.weight_bytes(),
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
            Linear::Int8(l) => l.forward(rt, x, name, generation, act),
            Linear::Bnb4(l) => bnb4::forward(rt, l, x, name, act),
        }
    }
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
    let mut out = rt.tensor(out_name, category, &[m, n], act)?;
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

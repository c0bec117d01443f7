//! What each quantization stores, and how its linear layers run and what they keep.

pub mod int8;
pub mod nf4;

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
    /// bitsandbytes NF4, blocks of 64.
    Nf4,
}

impl Quant {
    pub const ALL: [Quant; 4] = [Quant::F16, Quant::BF16, Quant::Int8, Quant::Nf4];

    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fp16" | "f16" | "float16" => Ok(Quant::F16),
            "bf16" | "bfloat16" => Ok(Quant::BF16),
            "int8" | "bnb8" | "llm.int8" => Ok(Quant::Int8),
            "nf4" | "bnb4" => Ok(Quant::Nf4),
            _ => Err(Error::Request(format!(
                "quantization '{s}': expected fp16, bf16, int8 or nf4"
            ))),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Quant::F16 => "fp16",
            Quant::BF16 => "bf16",
            Quant::Int8 => "int8",
            Quant::Nf4 => "nf4",
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

pub struct Nf4Linear {
    pub packed: Tensor,
    pub absmax: Tensor,
    pub out_features: usize,
    pub in_features: usize,
}

/// A linear layer with PyTorch's `[out_features, in_features]` weight.
// A model holds a few hundred of these; boxing the int8 variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Linear {
    Dense(Tensor),
    Int8(int8::Int8Linear),
    Nf4(Nf4Linear),
}

impl Linear {
    pub fn out_features(&self) -> usize {
        match self {
            Linear::Dense(w) => w.shape[0],
            Linear::Int8(l) => l.out_features,
            Linear::Nf4(l) => l.out_features,
        }
    }

    /// Bytes of the stored weight (and its scales).
    pub fn weight_bytes(&self) -> u64 {
        match self {
            Linear::Dense(w) => w.nbytes(),
            Linear::Int8(l) => l.weight_bytes(),
            Linear::Nf4(l) => l.packed.nbytes() + l.absmax.nbytes(),
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
            Linear::Nf4(l) => {
                // bitsandbytes' dequantize_4bit: a 16-bit copy of the weight for this matmul.
                rt.set_op("nf4.dequantize");
                let mut w = rt.tensor(
                    format!("{name}.dequant"),
                    Category::Workspace,
                    &[l.out_features, l.in_features],
                    act,
                )?;
                if rt.backend() == Backend::Cpu {
                    nf4::dequantize(l.packed.u8(), l.absmax.f32(), w.f32_mut());
                } else if rt.backend() == Backend::Cuda {
                    rt.with_device(|d| d.cuda().expect("cuda").nf4_dequantize(l, &mut w))?;
                }
                dense_matmul(rt, x, &w, name, act)
            }
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
    let mut out = rt.tensor(format!("{name}.out"), Category::Activation, &[m, n], act)?;
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

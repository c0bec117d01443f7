//! The gated MLP as vLLM's model files build it from its shared layers: `gate_up_proj` a
//! `MergedColumnParallelLinear`, the activation (`SiluAndMul`, or `GeluAndMul(approximate=
//! "tanh")` for Gemma, `model_executor/layers/activation.py`), `down_proj` a
//! `RowParallelLinear` and its all-reduce.

use crate::base::error::{Error, Result};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::engine::{ops, ops_gemma};
use crate::model::config::ModelConfig;
use crate::model::loader::{Loader, Slice};
use crate::quant::{FusedLinear, Linear};

/// The activation between `gate_up_proj`'s halves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatedAct {
    /// `SiluAndMul` (Llama, Qwen, Mixtral's experts).
    Silu,
    /// `SiluAndMul.forward_native`: a `silu` temporary before the product (DeepSeek's shared
    /// experts inside V1's fused-MoE op, custom ops off).
    SiluNative,
    /// `GeluAndMul(approximate="tanh")` (Gemma's GeGLU).
    GeluTanh,
}

/// How a gated MLP runs: this rank's width, the activation dtype, its activation, whether
/// `gate_up` dies before `down_proj` (vLLM #10339's Llama MLP) or when the MLP returns,
/// whether `down_proj` all-reduces (`reduce_results`), and the layer's forward count (for the
/// quantized linears).
pub struct MlpRun {
    pub width: usize,
    pub act: DType,
    pub activation: GatedAct,
    pub frees_gate_up: bool,
    pub all_reduce: bool,
    pub generation: u32,
}

/// A gated MLP on `x` (which stays alive): `gate_up_proj`, its two halves, the activation into
/// a new tensor, `down_proj` (and its all-reduce over ranks), the activation dying as the name
/// is rebound after `down_proj`, then `gate_up` as the MLP returns (or before `down_proj`).
pub fn mlp_forward(
    rt: &Runtime,
    x: &Tensor,
    (gate_up, down): (&FusedLinear, &Linear),
    how: &MlpRun,
    l: &str,
) -> Result<Tensor> {
    let (act, gen, i) = (how.act, how.generation, how.width);
    let gate_up = gate_up.forward(rt, x, &format!("{l}.gate_up_proj"), gen, act)?;
    let names = ["gate", "up"].map(|n| format!("{l}.{n}"));
    let mut it = FusedLinear::split(&gate_up, &[i, i], &names).into_iter();
    let (Some(gate), Some(up)) = (it.next(), it.next()) else {
        return Err(Error::Request(format!("{l}: gate_up split")));
    };
    let act_out = match how.activation {
        GatedAct::GeluTanh => ops_gemma::gelu_tanh_and_mul(rt, &gate, &up, &format!("{l}.act"))?,
        GatedAct::Silu => ops::silu_and_mul(rt, &gate, &up, &format!("{l}.act"))?,
        GatedAct::SiluNative => ops::silu_and_mul_native(rt, &gate, &up, &format!("{l}.act"))?,
    };
    drop((gate, up));
    let gate_up = if how.frees_gate_up {
        drop(gate_up);
        None
    } else {
        Some(gate_up)
    };
    let mut out = down.forward(rt, &act_out, &format!("{l}.down_proj"), gen, act)?;
    if how.all_reduce {
        out = crate::engine::ops_tp::all_reduce(rt, out, &format!("{l}.down_proj.all_reduce"))?;
    }
    drop(act_out);
    drop(gate_up);
    Ok(out)
}

/// `LlamaMLP`'s parameters: `gate_up_proj` (this rank's gate rows, then its up rows) and
/// `down_proj` (its columns). `fused`: the checkpoint stores gate and up as one
/// `gate_up_proj` (Phi-3).
pub(crate) fn load_dense(
    ld: &mut Loader,
    cfg: &ModelConfig,
    p: &str,
    i_part: (usize, usize),
    fused: bool,
) -> Result<(FusedLinear, Linear)> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let gate_up_name = format!("{p}.mlp.gate_up_proj.weight");
    let gate_up = if fused {
        // Gate rows first, then up (MergedColumnParallelLinear's order, and Phi-3's
        // `gate, up = gate_up.chunk(2)`).
        ld.fused_parts(
            &[gate_up_name.clone(), gate_up_name.clone()],
            &[2 * i; 2],
            &[i_part, (i + i_part.0, i_part.1)],
            h,
            &gate_up_name,
        )?
    } else {
        return load_gated(ld, &format!("{p}.mlp"), (h, i), i_part);
    };
    let down = ld.linear_slice(
        &format!("{p}.mlp.down_proj.weight"),
        Slice::cols(h, i, i_part.0, i_part.1),
    )?;
    Ok((gate_up, down))
}

/// A gated MLP stored as `{x}.gate_proj`, `{x}.up_proj` and `{x}.down_proj` (`[width, h]`,
/// `[width, h]`, `[h, width]`): this rank's `part` of the width, gate and up stacked into one
/// `gate_up_proj` (`MergedColumnParallelLinear`), then `down_proj`'s columns
/// (`RowParallelLinear`). Llama's MLP, Qwen2-MoE's shared expert, DeepSeek's dense MLPs and
/// shared experts.
pub(crate) fn load_gated(
    ld: &mut Loader,
    x: &str,
    (h, width): (usize, usize),
    part: (usize, usize),
) -> Result<(FusedLinear, Linear)> {
    let gate_up = ld.fused_parts(
        &[
            format!("{x}.gate_proj.weight"),
            format!("{x}.up_proj.weight"),
        ],
        &[width, width],
        &[part, part],
        h,
        &format!("{x}.gate_up_proj.weight"),
    )?;
    let down = ld.linear_slice(
        &format!("{x}.down_proj.weight"),
        Slice::cols(h, width, part.0, part.1),
    )?;
    Ok((gate_up, down))
}

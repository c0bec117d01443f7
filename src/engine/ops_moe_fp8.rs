//! Per-tensor fp8 experts under vLLM 0.19's modular fused MoE (`--quantization fp8` on a
//! 16-bit MoE checkpoint: `Fp8OnlineMoEMethod`, 0.19.0 quantization/fp8.py L922-1043). The
//! oracle picks `TritonExperts` for weight `kFp8StaticTensorSym` with activation
//! `kFp8DynamicTensorSym` on compute capability 8.9 and above (fused_moe/oracle/fp8.py
//! L57-102, L381-399: FlashInfer TRT-LLM is Blackwell-only and block/static, FlashInfer
//! CUTLASS takes per-tensor fp8 only with static activations, flashinfer_cutlass_moe.py
//! L143-179, DeepGEMM block only, vLLM's CUTLASS removed by `allow_vllm_cutlass=False`;
//! fused_moe.py L1920-1949 lists the scheme). This module holds what differs from 16-bit
//! experts: the activation quantization's buffers, the tuned config's `BLOCK_SIZE_M`, and the
//! math on the host. The fp8 codec comes from the caller (`quant::fp8`), which the engine
//! does not import.

use crate::base::error::{Error, Result};
use crate::device::cpu;
use crate::engine::ops_moe::{Experts, Fp8TensorScales, Routing};
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Tensor};
use crate::memory::Category;

/// `scaled_fp8_quant(A)` as `moe_kernel_quantize_input` runs it for per-tensor fp8
/// (`_fp8_quantize`, fused_moe/utils.py L125-148 at 0.19.0; _custom_ops.py L1839-1853): the
/// codes `[rows, k]` (`torch.empty`), then the scale `[1]` f32.
pub(crate) fn tensor_quant(
    rt: &Runtime,
    rows: usize,
    k: usize,
    names: [&str; 2],
    name: &str,
) -> Result<[Tensor; 2]> {
    rt.set_op("moe.scaled_fp8_quant");
    let t = |nm: &str, shape: &[usize], dt: DType| {
        rt.tensor_for_overwrite(format!("{name}.{nm}"), Category::Activation, shape, dt)
    };
    let codes = t(names[0], &[rows, k], DType::F8E4M3)?;
    let scale = t(names[1], &[1], DType::F32)?;
    Ok([codes, scale])
}

/// `BLOCK_SIZE_M` of the config vLLM 0.19.0 picks for per-tensor fp8 experts
/// (`try_get_optimal_moe_config` with dtype `fp8_w8a8` and no block shape, fused_moe.py
/// L1323-1352): the tuned file `E={e},N={n},device_name={gpu},dtype=fp8_w8a8.json` at the
/// key nearest `m` (ties to the earlier key; an H200-family name reads `NVIDIA_H200`'s,
/// L1018-1029), else `get_default_config`'s per-tensor rule, the 16-bit one: 16 up to 32
/// tokens, 32 up to 96, 64 up to 512, then 128 (L1273-1285).
pub fn block_size_m_fp8_tensor(gpu: &str, e: usize, n: usize, m: usize) -> (usize, String) {
    let mut gpu = gpu
        .split(" (")
        .next()
        .unwrap_or(gpu)
        .trim()
        .replace(' ', "_");
    if gpu.split('_').any(|t| t == "H200") {
        gpu = "NVIDIA_H200".into();
    }
    let file = format!("E={e},N={n},device_name={gpu},dtype=fp8_w8a8.json");
    let tuned = crate::engine::moe_configs_fp8_tensor::TUNED_FP8_TENSOR
        .iter()
        .find(|(r, fe, fn_, fd, _)| *r == "0.19.0" && *fe == e && *fn_ == n && *fd == gpu);
    if let Some((_, _, _, _, keys)) = tuned {
        let mut best = keys[0];
        for &k in &keys[1..] {
            if k.0.abs_diff(m) < best.0.abs_diff(m) {
                best = k;
            }
        }
        return (best.1, format!("{file} in vLLM 0.19.0, key {}", best.0));
    }
    let b = match m {
        0..=32 => 16,
        33..=96 => 32,
        97..=512 => 64,
        _ => 128,
    };
    (b, format!("no {file} in vLLM 0.19.0: get_default_config"))
}

/// The fp8 experts' math on the host for the tokens `rows` of `x` (the whole input: vLLM
/// 0.19 runs one chunk), written into `out`, as `TritonExperts.apply` computes it
/// (fused_moe.py L1997-2134 at 0.19.0): the input quantized per tensor (`prepare`); per slot
/// the first GEMM over the codes (each product exact in f32), `acc · a1_scale · w13_scale[e]`
/// (L541-542) stored in the activation dtype (`intermediate_cache1`); `silu_and_mul` into
/// `intermediate_cache2` (activation dtype); that whole `[T·k, I]` quantized per tensor; the
/// second GEMM, `acc · a2_scale · w2_scale[e] · routing weight` (L554-562) stored in the
/// activation dtype (`intermediate_cache3`); `moe_sum` over the k slots (here in f32, rounded
/// once). Expert parallel is refused (its slots of other ranks' experts are not computed).
pub(crate) fn experts_cpu_fp8(
    rt: &Runtime,
    x: &Tensor,
    out: &mut Tensor,
    ex: &Experts,
    routing: &Routing,
    q: &Fp8TensorScales,
) -> Result<()> {
    if ex.mapped {
        return Err(Error::Request(format!(
            "{}: per-tensor fp8 experts with expert parallel are not modelled on the host",
            ex.w13.name
        )));
    }
    let (m, h) = (x.rows(), x.cols());
    let top_k = routing.ids.cols();
    let i = ex.width;
    let act = x.dtype;
    let (ids, weights) = (routing.ids.i32(), routing.weights.f32());
    let (w13, w2) = (ex.w13.u8(), ex.w2.u8());
    let dec = q.codec.decode;
    let cancel = rt.cancel_flag();
    let (a1q, a1s) = (q.codec.quantize)(x.f32());
    let a1: Vec<f32> = a1q.iter().map(|&c| dec(c)).collect();
    // intermediate_cache2 [M·k, I]: every slot through its expert's first GEMM.
    let mut cache2 = vec![0f32; m * top_k * i];
    let slots_of = |expert: usize| -> Vec<usize> {
        (0..m * top_k)
            .filter(|&s| ids[s] as usize == ex.global_id(expert))
            .collect()
    };
    for expert in 0..ex.num_experts {
        let slots = slots_of(expert);
        if slots.is_empty() {
            continue;
        }
        let p = slots.len();
        let mut xe = Vec::with_capacity(p * h);
        for &s in &slots {
            let r = s / top_k;
            xe.extend_from_slice(&a1[r * h..(r + 1) * h]);
        }
        let we: Vec<f32> = w13[expert * 2 * i * h..(expert + 1) * 2 * i * h]
            .iter()
            .map(|&c| dec(c))
            .collect();
        let mut acc = vec![0f32; p * 2 * i];
        cpu::matmul_nt_cancellable(&xe, &we, &mut acc, (p, h, 2 * i), &cancel)?;
        let ws = q.w13_values[expert];
        for (&s, row) in slots.iter().zip(acc.chunks_exact(2 * i)) {
            let c1: Vec<f32> = row.iter().map(|&a| act.round(a * a1s * ws)).collect();
            let o = &mut cache2[s * i..(s + 1) * i];
            cpu::silu_mul_into(&c1[..i], &c1[i..], o);
            act.round_slice(o);
        }
    }
    let (a2q, a2s) = (q.codec.quantize)(&cache2);
    let a2: Vec<f32> = a2q.iter().map(|&c| dec(c)).collect();
    let mut cache3 = vec![0f32; m * top_k * h];
    for expert in 0..ex.num_experts {
        let slots = slots_of(expert);
        if slots.is_empty() {
            continue;
        }
        let p = slots.len();
        let mut ae = Vec::with_capacity(p * i);
        for &s in &slots {
            ae.extend_from_slice(&a2[s * i..(s + 1) * i]);
        }
        let we: Vec<f32> = w2[expert * h * i..(expert + 1) * h * i]
            .iter()
            .map(|&c| dec(c))
            .collect();
        let mut acc = vec![0f32; p * h];
        cpu::matmul_nt_cancellable(&ae, &we, &mut acc, (p, i, h), &cancel)?;
        let ws = q.w2_values[expert];
        for (&s, row) in slots.iter().zip(acc.chunks_exact(h)) {
            for (d, &a) in cache3[s * h..(s + 1) * h].iter_mut().zip(row) {
                *d = act.round(a * a2s * ws * weights[s]);
            }
        }
    }
    let o = out.f32_mut();
    for r in 0..m {
        for c in 0..h {
            let sum: f32 = (0..top_k).map(|j| cache3[(r * top_k + j) * h + c]).sum();
            o[r * h + c] = act.round(sum);
        }
    }
    Ok(())
}

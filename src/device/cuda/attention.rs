//! Causal GQA attention: the fused flash kernels (compute capability 8.0+) and the chunked
//! cuBLAS path with its score buffer.

use cudarc::cublas::sys as bsys;
use cudarc::driver::LaunchConfig;

use super::gemm::{blas_type, Gemm};
use super::{kernels, CudaDevice};
use crate::base::error::Result;
use crate::device::cpu::AttnShape;
use crate::device::tensor::TensorData;

/// Bound on the attention score buffer (f32 scores of one chunk of query rows);
/// `VRAMSCOPE_ATTN_SCRATCH_MIB` changes it (fewer, larger chunks run faster).
const ATTN_SCRATCH_BYTES: u64 = 64 << 20;

fn attn_scratch_bound() -> u64 {
    std::env::var("VRAMSCOPE_ATTN_SCRATCH_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&m| m > 0)
        .map_or(ATTN_SCRATCH_BYTES, |m| m << 20)
}

/// The fused attention kernel for a head dimension among those `available` (loaded), or `None`
/// where only the cuBLAS path exists. `variant` is `VRAMSCOPE_FLASH`, for measurements; ""
/// or a variant not built for this head dimension gives the first of `FLASH_DEFAULTS`.
fn flash_kernel(
    head_dim: usize,
    variant: &str,
    available: impl Fn(&str) -> bool,
) -> Option<kernels::FlashKernel> {
    let pick = |v: &str| {
        kernels::FLASH
            .iter()
            .find(|k| k.head_dim == head_dim && k.variant == v && available(k.name))
            .copied()
    };
    pick(variant).or_else(|| kernels::FLASH_DEFAULTS.iter().find_map(|v| pick(v)))
}

/// `VRAMSCOPE_FLASH`, read once per device. A name no kernel carries would silently measure
/// the default, so it is said on stderr (and the default runs).
pub(super) fn flash_variant_from_env() -> String {
    let v = std::env::var("VRAMSCOPE_FLASH").unwrap_or_default();
    if !v.is_empty() && !kernels::FLASH.iter().any(|k| k.variant == v) {
        let mut known: Vec<&str> = kernels::FLASH.iter().map(|k| k.variant).collect();
        known.dedup();
        eprintln!(
            "vramscope: VRAMSCOPE_FLASH={v} names no fused attention kernel (known: {}); the default runs",
            known.join(", ")
        );
    }
    v
}

/// The score scale: the layer's own (Gemma's `query_pre_attn_scalar`, Granite's
/// `attention_multiplier`, MLA's YaRN-scaled one) or `1 / √head_dim`.
fn score_scale(shape: &AttnShape) -> f32 {
    shape
        .mods
        .scale
        .unwrap_or(1.0 / (shape.head_dim as f32).sqrt())
}

impl CudaDevice {
    /// Causal GQA attention. On compute capability 8.0+ with a head dimension the fused kernel
    /// is built for, one kernel per sequence keeps the scores on chip (flash attention, no
    /// scratch memory); otherwise `attention_blas`. `VRAMSCOPE_ATTN=blas` forces the latter.
    pub fn attention(
        &mut self,
        q: &TensorData,
        k: &TensorData,
        v: &TensorData,
        seq_lens: &[usize],
        shape: AttnShape,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(q)?;
        let hd = shape.head_dim;
        let kernel = flash_kernel(hd, &self.flash_variant, |n| {
            self.funcs.contains_key(&format!("{n}_f16"))
        });
        // A soft-cap or a sliding window (Gemma) runs through the cuBLAS path's softmax; the
        // score scale alone is the fused kernel's too.
        let fused = shape.kv_heads > 0
            && shape.heads.is_multiple_of(shape.kv_heads)
            && shape.mods.softcap.is_none()
            && shape.mods.window.is_none()
            && !self.attention_blas;
        let Some(kern) = kernel.filter(|_| fused) else {
            return self.attention_blas(q, k, v, seq_lens, shape, out);
        };
        let (heads, kvh) = (shape.heads as i32, shape.kv_heads as i32);
        let (qw, kw) = ((shape.heads * hd) as u64, (shape.kv_heads * hd) as u64);
        let scale_log2 = std::f32::consts::LOG2_E * score_scale(&shape);
        let (qp, kp, vp, op) = (q.cuda_ptr(), k.cuda_ptr(), v.cuda_ptr(), out.cuda_ptr());
        let tile = kern.tile;
        // A uniform batch (every sequence of one length: the profile batch, a decode step's
        // one-token requests) is one launch, a sequence per grid layer.
        let uniform = seq_lens.len() > 1
            && seq_lens.len() <= 65535
            && seq_lens.iter().all(|&l| l == seq_lens[0] && l > 0)
            && seq_lens[0].div_ceil(tile) <= 65535;
        if uniform {
            let len = seq_lens[0];
            let f = self.func(kern.name, dt)?;
            let lc = LaunchConfig {
                grid_dim: (
                    heads as u32,
                    len.div_ceil(tile) as u32,
                    seq_lens.len() as u32,
                ),
                block_dim: (kern.warps as u32 * 32, 1, 1),
                shared_mem_bytes: kern.smem as u32,
            };
            let len32 = len as i32;
            return self.launch(
                f,
                lc,
                &[&qp, &kp, &vp, &op, &len32, &heads, &kvh, &scale_log2],
            );
        }
        let mut start = 0u64;
        for &len in seq_lens {
            if len > 0 {
                let tiles = len.div_ceil(tile);
                if tiles > 65535 {
                    return Err(self.err(
                        "attention",
                        format!(
                            "a sequence of {len} tokens is longer than the fused kernel's grid"
                        ),
                    ));
                }
                let f = self.func(kern.name, dt)?;
                let lc = LaunchConfig {
                    grid_dim: (heads as u32, tiles as u32, 1),
                    block_dim: (kern.warps as u32 * 32, 1, 1),
                    shared_mem_bytes: kern.smem as u32,
                };
                let (qs, ks, vs, os) = (
                    qp + start * qw * 2,
                    kp + start * kw * 2,
                    vp + start * kw * 2,
                    op + start * qw * 2,
                );
                let len32 = len as i32;
                self.launch(
                    f,
                    lc,
                    &[&qs, &ks, &vs, &os, &len32, &heads, &kvh, &scale_log2],
                )?;
            }
            start += len as u64;
        }
        Ok(())
    }

    /// Causal GQA attention in chunks of query rows: scores of a chunk against the keys up to
    /// its end (cuBLAS, f32), causal softmax in place into 16-bit probabilities, then P·V
    /// (cuBLAS) into the output. The score buffer stays under 64 MiB at any length.
    fn attention_blas(
        &mut self,
        q: &TensorData,
        k: &TensorData,
        v: &TensorData,
        seq_lens: &[usize],
        shape: AttnShape,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(q)?;
        let (heads, kvh, hd) = (shape.heads, shape.kv_heads, shape.head_dim);
        let group = heads / kvh;
        let (qw, kw) = (heads * hd, kvh * hd);
        let ty = blas_type(dt);
        let esz = 2u64;
        let scale = score_scale(&shape);
        let (cap, window) = (
            shape.mods.softcap.unwrap_or(0.0),
            shape
                .mods
                .window
                .map_or(0, |w| w.min(i32::MAX as usize) as i32),
        );
        let plain = cap == 0.0 && window == 0;
        let max_len = seq_lens.iter().copied().max().unwrap_or(0);
        if max_len == 0 {
            return Ok(());
        }
        let ld_max = max_len.div_ceil(8) * 8;
        let row_bytes = (kvh * ld_max * 4) as u64;
        let chunk =
            ((attn_scratch_bound() / row_bytes) as usize / 16 * 16).clamp(16.min(ld_max), ld_max);
        let need = row_bytes * chunk as u64;
        if self.attn_scratch.is_none_or(|(_, b)| b < need) {
            if let Some((p, _)) = self.attn_scratch.take() {
                self.free(p);
            }
            let p = self.malloc(need, "attention score buffer")?;
            self.attn_scratch = Some((p, need));
        }
        let s = self.attn_scratch.expect("scratch").0;
        let (qp, kp, vp, op) = (q.cuda_ptr(), k.cuda_ptr(), v.cuda_ptr(), out.cuda_ptr());
        let mut start = 0usize;
        for &len in seq_lens {
            let mut r0 = 0;
            while r0 < len {
                let rows = chunk.min(len - r0);
                let keys = r0 + rows;
                let ld = keys.div_ceil(8) * 8;
                for g in 0..group {
                    // S[b, rows, keys] = scale · Q_b · K_bᵀ over the kv heads b
                    self.gemm(Gemm {
                        m: rows,
                        n: keys,
                        k: hd,
                        a: qp + ((start + r0) * qw + g * hd) as u64 * esz,
                        a_type: ty,
                        lda: qw,
                        stride_a: (group * hd) as i64,
                        b: kp + (start * kw) as u64 * esz,
                        b_type: ty,
                        ldb: kw,
                        stride_b: hd as i64,
                        b_trans: true,
                        c: s,
                        c_type: bsys::cudaDataType_t::CUDA_R_32F,
                        ldc: ld,
                        stride_c: (rows * ld) as i64,
                        batch: kvh,
                        alpha: scale,
                        beta: 0.0,
                        compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    })?;
                    let (ld64, rows32, keys32, q0) =
                        (ld as i64, rows as i32, keys as i32, r0 as i32);
                    // Up to 8192 keys the row fits in registers (one read of the scores).
                    let name = if !plain {
                        "softmax_mods"
                    } else if keys <= 256 * 32 {
                        "softmax_causal_reg"
                    } else {
                        "softmax_causal"
                    };
                    let f = self.func(name, dt)?;
                    let shape = LaunchConfig {
                        grid_dim: (rows as u32, kvh as u32, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    if plain {
                        self.launch(f, shape, &[&s, &ld64, &rows32, &keys32, &q0])?;
                    } else {
                        self.launch(f, shape, &[&s, &ld64, &rows32, &keys32, &q0, &cap, &window])?;
                    }
                    // O_b[rows, hd] = P_b · V_b, P with 16-bit rows of 2·ld elements
                    self.gemm(Gemm {
                        m: rows,
                        n: hd,
                        k: keys,
                        a: s,
                        a_type: ty,
                        lda: 2 * ld,
                        stride_a: (rows * 2 * ld) as i64,
                        b: vp + (start * kw) as u64 * esz,
                        b_type: ty,
                        ldb: kw,
                        stride_b: hd as i64,
                        b_trans: false,
                        c: op + ((start + r0) * qw + g * hd) as u64 * esz,
                        c_type: ty,
                        ldc: qw,
                        stride_c: (group * hd) as i64,
                        batch: kvh,
                        alpha: 1.0,
                        beta: 0.0,
                        compute: bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    })?;
                }
                r0 += rows;
            }
            start += len;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_attention_kernels_cover_the_head_dims_they_claim() {
        let all = |_: &str| true;
        let portable = |n: &str| kernels::FLASH.iter().any(|k| k.name == n && !k.sm90a);
        let name = |hd, v, avail: &dyn Fn(&str) -> bool| flash_kernel(hd, v, avail).map(|k| k.name);
        assert_eq!(name(128, "", &all), Some("flash_attn_d128_ws"));
        assert_eq!(
            name(128, "no-such-variant", &all),
            Some("flash_attn_d128_ws")
        );
        assert_eq!(name(128, "wgs", &all), Some("flash_attn_d128_wgs"));
        assert_eq!(name(128, "wg", &all), Some("flash_attn_d128_wg"));
        assert_eq!(name(128, "", &portable), Some("flash_attn_d128_w8l"));
        assert_eq!(name(128, "w4", &all), Some("flash_attn_d128_w4"));
        // A Hopper-only variant asked for elsewhere falls back to the portable default.
        assert_eq!(name(128, "wg", &portable), Some("flash_attn_d128_w8l"));
        assert_eq!(name(64, "wg", &all), Some("flash_attn_d64_w8l"));
        assert_eq!(name(32, "", &portable), Some("flash_attn_d32_w8l"));
        assert_eq!(name(80, "", &all), None);
        assert_eq!(name(256, "w4", &all), None);
        assert_eq!(name(128, "", &|_: &str| false), None);
        // Every head dimension has a portable default.
        for &hd in kernels::FLASH_HEAD_DIMS {
            assert!(name(hd, "", &portable).is_some(), "head_dim {hd}");
        }
        // Every kernel listed for loading is instantiated once in the source with the shape
        // the dispatch launches it with.
        for k in kernels::FLASH {
            let src = if k.sm90a {
                kernels::WGMMA_SOURCE
            } else {
                kernels::FLASH_SOURCE
            };
            let head = format!("({}, {}, ", k.name, k.head_dim);
            assert_eq!(src.matches(&head).count(), 1, "{head}");
            // FA_INST takes warps, FA_WG_INST warpgroups; the warp-specialized kernel is a
            // producer and two consumer warpgroups, the overlapped one two warpgroups of 64 rows,
            // by construction.
            let shaped = if !k.sm90a {
                format!("FA_INST{head}{}, ", k.warps)
            } else if src.contains(&format!("FA_WG_INST{head}")) {
                format!("FA_WG_INST{head}{}, ", k.warps / 4)
            } else if src.contains(&format!("FA_WS_INST{head}")) {
                assert_eq!((k.warps, k.tile), (12, 128), "{}", k.name);
                assert!(src.contains("FA_EXPORT(NAME, 384, 1, flash_attn_ws,"));
                format!("FA_WS_INST{head}")
            } else {
                assert_eq!((k.warps, k.tile), (8, 128), "{}", k.name);
                head.clone()
            };
            assert_eq!(src.matches(&shaped).count(), 1, "{shaped}");
            assert!(k.smem <= 227 * 1024, "{}", k.name);
        }
        let wg = flash_kernel(128, "wg", all).unwrap();
        assert_eq!((wg.tile, wg.warps, wg.smem), (128, 8, 4 * 128 * 128 * 2));
        // Three stages of a 128-key K and V tile and the 1 KiB that aligns the swizzle atoms.
        let wgs = flash_kernel(128, "wgs", all).unwrap();
        assert_eq!(
            (wgs.tile, wgs.warps, wgs.smem),
            (128, 8, 6 * 128 * 128 * 2 + 1024)
        );
        // Three K and four V stages, the same alignment; three warpgroups.
        let ws = flash_kernel(128, "", all).unwrap();
        assert_eq!(
            (ws.tile, ws.warps, ws.smem),
            (128, 12, 7 * 128 * 128 * 2 + 1024)
        );
    }
}

//! AWQ and GPTQ 4-bit checkpoints as vLLM 0.6.4 runs them on a GPU of compute capability 8.0
//! or more: both are repacked into Marlin's layout at load (`awq_marlin`, `gptq_marlin`) and
//! multiplied by `gptq_marlin_gemm`. This module holds the stored format (packing, the
//! dequantization rule, round-to-nearest quantization for `gen-model`), the layer after
//! `process_weights_after_loading` with that step's allocations, and the forward's.
//!
//! The repacked tensors are allocated as vLLM allocates them (shape, dtype, order); the host
//! and the GPU keep the checkpoint's own layout inside them (the allocation is vLLM's, the
//! layout inside it ours), which is what the CPU forward and the GPU's fused 4-bit kernel
//! (`device::cuda::w4`) dequantize.

use crate::base::error::{Error, Result};
use crate::device::Backend;
use crate::engine::runtime::Runtime;
use crate::engine::tensor::{DType, Storage, Tensor};
use crate::memory::Category;

/// Codes per int32 word (4-bit).
pub const PACK: usize = 8;

/// AutoAWQ's packing order (`WQLinear_GEMM.from_linear`, awq/modules/linear/gemm.py): nibble
/// `i` of a word (bits `4i..4i+4`) holds output column `8·word + AWQ_ORDER[i]`.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// The inverse (`AWQ_REVERSE_ORDER` in AutoAWQ's packing_utils.py): column `c` of a word's
/// eight sits in nibble `AWQ_NIBBLE[c]`.
pub const AWQ_NIBBLE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Marlin's tile along k and n (`GPTQ_MARLIN_TILE`, 0.6.4 utils/marlin_utils.py L12).
pub const MARLIN_TILE: usize = 16;
/// `GPTQ_MARLIN_MIN_THREAD_N` / `_MIN_THREAD_K` / `_MAX_PARALLEL` (marlin_utils.py L13-15).
pub const MIN_THREAD_N: usize = 64;
pub const MIN_THREAD_K: usize = 128;
pub const MAX_PARALLEL: usize = 16;
/// `MARLIN_SUPPORTED_GROUP_SIZES` (marlin_utils.py L17); -1 is one group over all inputs.
pub const MARLIN_GROUP_SIZES: [i64; 4] = [-1, 32, 64, 128];

/// `max_thread_n` of the refactored Marlin kernel (csrc/quantization/marlin/marlin.cuh): the
/// widest n tile, which sizes its fp32 reduce buffer.
pub const MAX_THREAD_N: usize = 256;

/// Which generation of vLLM's Marlin path a release runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Era {
    /// vLLM 0.6.4 (and 380e1863): `marlin_make_workspace`'s `n / 64 · 16` int32 per layer;
    /// `gptq_marlin_gemm` makes `a_tmp [m, k]` always and a `[reduce_max_m(m), n]` f32
    /// reduce buffer.
    #[default]
    V0_6_4,
    /// 0.11 and 0.15: `awq_marlin.py` still repacks AWQ itself (0.11.0 L268-309, 0.15.1
    /// L375), GPTQ goes through `MarlinLinearKernel`; the refactored kernel: one int32 per
    /// SM of workspace (`marlin_make_workspace_new`, 0.11.0 marlin_utils.py L201-209), an
    /// `a_tmp` only under act-order and an f32 reduce buffer of
    /// `sms · min(⌈m/16⌉·16, 64) · 256` values (csrc marlin.cu `marlin_gemm`, "Alloc C tmp
    /// buffer").
    Refactored,
    /// 0.19 on: AWQ is first rewritten into GPTQ's layout (`_convert_awq_to_standard_format`,
    /// 0.19.0 awq_marlin.py L463-471; 0.28.0 auto_awq.py L93-169, L503-511), then both
    /// methods go through `choose_mp_linear_kernel` and `MarlinLinearKernel` (0.28.0
    /// kernels/linear/mixed_precision/marlin.py L86-221), the kernel as in `Refactored`.
    Converted,
}

impl Era {
    /// The era of a release vramscope names (`vllm::Release::name`); `None` for the V0
    /// releases other than 0.6.4, whose AWQ/GPTQ paths are not reproduced.
    pub fn of_release(name: &str) -> Option<Era> {
        if matches!(name, "380e1863" | "0.6.4") {
            return Some(Era::V0_6_4);
        }
        let minor: u32 = name.strip_prefix("0.")?.split('.').next()?.parse().ok()?;
        match minor {
            11..=18 => Some(Era::Refactored),
            19.. => Some(Era::Converted),
            _ => None,
        }
    }
}

/// The release's Marlin generation and the GPU's streaming multiprocessors (its workspace
/// and reduce buffer scale with them; 0 where the device does not say).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kernel {
    pub era: Era,
    pub sms: usize,
    /// The release's minor version (0.11 → 11; 0 where unknown): NVFP4's after-loading
    /// path differs between 0.11, 0.15 and 0.19 (`quant::nvfp4`).
    pub minor: u32,
    /// The GPU is of compute capability 9.0 (Hopper), where `choose_mp_linear_kernel` tries
    /// `MacheteLinearKernel` first (`get_min_capability` 90 and `is_device_capability(90)`,
    /// 0.11.0 kernels/mixed_precision/machete.py L24-36).
    pub hopper: bool,
}

impl Kernel {
    /// Whether the release's `choose_mp_linear_kernel` gives this `[n, k]` layer (this rank's
    /// part) to `MacheteLinearKernel`, as the V1 releases decide it: only on Hopper; only
    /// layers that go through the mixed-precision kernel list at all (GPTQ's
    /// `GPTQMarlinLinearMethod` and compressed-tensors' `CompressedTensorsWNA16` from 0.11;
    /// AWQ from 0.19, whose `AWQMarlinLinearMethod` calls it after converting to GPTQ's
    /// layout; 0.11.0 gptq_marlin.py L313, compressed_tensors_wNa16.py L92; 0.19.0
    /// awq_marlin.py L405); Machete ahead of AllSpark and Marlin in `_POSSIBLE_KERNELS`
    /// (0.11.0 mixed_precision/__init__.py L28-37; 0.19.0 kernels/linear/__init__.py
    /// L132-140; 0.33.0 L539-548); `can_implement` (0.11.0 machete.py L28-56; 0.15.1 to
    /// 0.29.0 L29-64, the same; 0.31.0 L27-54 drops the act-order clause with act-order):
    /// uint4b8 without zero points or uint4 with them
    /// (`query_machete_supported_quant_types`, machete_utils.py L12-16 at 0.15.1), group
    /// size -1, 64 or 128 for fp16/bf16 activations (`query_machete_supported_group_sizes`,
    /// L23-38), k a multiple of 64 and n of 128 (`check_machete_supports_shape`,
    /// `MACHETE_PREPACKED_BLOCK_SHAPE = [64, 128]`, L9, L41-56). Act-order split across
    /// ranks (refused by Machete) never reaches here: the loader refuses that split.
    /// 0.6.4 (`Era::V0_6_4`) is refused apart (`check_gpu`).
    pub fn machete(&self, fmt: &Format, n: usize, k: usize) -> bool {
        let through_mp = match self.era {
            Era::V0_6_4 => false,
            Era::Refactored => fmt.method == Method::Gptq,
            Era::Converted => true,
        };
        self.hopper
            && through_mp
            && matches!(fmt.group_size, -1 | 64 | 128)
            && k.is_multiple_of(64)
            && n.is_multiple_of(128)
    }

    /// The refactored kernel's f32 reduce buffer for `m` rows (`use_fp32_reduce`, on by
    /// default: `USE_FP32_REDUCE_DEFAULT`).
    pub fn c_tmp_len(&self, m: usize) -> usize {
        let rows = m.div_ceil(16) * 16;
        self.sms * rows.min(64) * MAX_THREAD_N
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// AutoAWQ GEMM: asymmetric uint4 with a zero point per group (`awq_marlin`).
    Awq,
    /// AutoGPTQ, symmetric (`uint4b8`: w = (q − 8)·s, `gptq_marlin`).
    Gptq,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Awq => "awq",
            Method::Gptq => "gptq",
        }
    }
}

/// What `quantization_config` fixes for every quantized linear.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    pub method: Method,
    /// As stored: -1 is one group over the whole input.
    pub group_size: i64,
    /// GPTQ act-order (`desc_act`): each input feature's group comes from `g_idx`. vLLM
    /// clears it when `group_size` is -1 (gptq_marlin.py L48-51). compressed-tensors' `actorder:
    /// "group"` (its `has_g_idx`, compressed_tensors_wNa16.py L52 at 0.11.0).
    pub desc_act: bool,
    /// Stored as compressed-tensors `pack-quantized` (LLM Compressor's W4A16, `method` Gptq:
    /// the same uint4b8 codes, `w = (q − 8)·s`): `weight_packed` I32 `[n, k/8]` (eight inputs
    /// a word, input `8j + i` at bits `4i`), `weight_scale` `[n, groups]`, `weight_shape` I64
    /// `[2]`, `weight_g_idx` `[k]` under act-order; vLLM's `CompressedTensorsWNA16`
    /// (compressed_tensors_wNa16.py, 0.11.0 L111-192, 0.15.1 L141-219, 0.19.0 L139-217).
    pub compressed_tensors: bool,
}

impl Format {
    /// Input features per group for a layer of `k` inputs.
    pub fn group(&self, k: usize) -> usize {
        if self.group_size < 0 {
            k
        } else {
            self.group_size as usize
        }
    }

    /// Groups of a layer of `k` inputs (`k` a multiple of the group).
    pub fn groups(&self, k: usize) -> usize {
        k / self.group(k).max(1)
    }

    /// The stored `qweight` shape of an `[n, k]` linear: AWQ packs along the output
    /// (`[k, n/8]`), GPTQ along the input (`[k/8, n]`).
    pub fn qweight_shape(&self, n: usize, k: usize) -> [usize; 2] {
        match self.method {
            Method::Awq => [k, n / PACK],
            Method::Gptq => [k / PACK, n],
        }
    }

    /// What the stored layout of one `[n, k]` linear needs: the group divides the inputs and
    /// eight codes fill each packed int32 (along the output; GPTQ's also along the input).
    pub fn layout_problem(&self, n: usize, k: usize) -> Option<String> {
        let g = self.group(k);
        if g == 0 || !k.is_multiple_of(g) {
            return Some(format!(
                "quantization_config.group_size {} does not divide its {k} input features",
                self.group_size
            ));
        }
        if !n.is_multiple_of(PACK) || (self.method == Method::Gptq && !k.is_multiple_of(PACK)) {
            return Some(format!(
                "its [{n}, {k}] weight does not fill int32 words of {PACK} codes"
            ));
        }
        None
    }

    /// Marlin's shape rules for a layer as vLLM builds it (stacked q/k/v and gate/up count
    /// as one; `verify_marlin_supports_shape`, marlin_utils.py L94-120), after the stored
    /// layout's own (`layout_problem`): the reason it cannot run, if any.
    pub fn shape_problem(&self, n: usize, k: usize) -> Option<String> {
        if let Some(p) = self.layout_problem(n, k) {
            return Some(p);
        }
        if !n.is_multiple_of(MIN_THREAD_N) {
            return Some(format!(
                "its {n} output features are not a multiple of Marlin's min_thread_n {MIN_THREAD_N} (vLLM's verify_marlin_supports_shape refuses it)"
            ));
        }
        if !k.is_multiple_of(MIN_THREAD_K) {
            return Some(format!(
                "its {k} input features are not a multiple of Marlin's min_thread_k {MIN_THREAD_K} (vLLM's verify_marlin_supports_shape refuses it)"
            ));
        }
        None
    }
}

/// One linear's stored tensors (host values; empty in a dry run): `qweight` and `qzeros` as
/// int32 words, `scales` as their f16/bf16 values, GPTQ's `g_idx` when stored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parts {
    pub qweight: Vec<i32>,
    pub qzeros: Vec<i32>,
    pub scales: Vec<f32>,
    pub g_idx: Option<Vec<i32>>,
}

impl Parts {
    /// One tensor-parallel rank's part of a layer stored `[n, k]`-wise: outputs
    /// `rows = (first, len)` (a column-parallel layer) and inputs `cols = (first, len)` (a
    /// row-parallel one), as vLLM's `PackedvLLMParameter` / `GroupQuantScaleParameter` loaders
    /// narrow the stored tensors (AWQ: `qweight [k, n/8]`, `qzeros [groups, n/8]`, `scales
    /// [groups, n]`; GPTQ: `qweight [k/8, n]`, `qzeros [groups, n/8]`, `scales [groups, n]`,
    /// `g_idx [k]`). The caller has checked that the cuts fall on whole words and groups.
    pub fn cut(
        &self,
        fmt: &Format,
        (n, k): (usize, usize),
        rows: (usize, usize),
        cols: (usize, usize),
    ) -> Parts {
        let grid = |data: &[i32], width: usize, r: (usize, usize), c: (usize, usize)| {
            let mut out = Vec::with_capacity(r.1 * c.1);
            for row in r.0..r.0 + r.1 {
                out.extend_from_slice(&data[row * width + c.0..row * width + c.0 + c.1]);
            }
            out
        };
        let gridf = |data: &[f32], width: usize, r: (usize, usize), c: (usize, usize)| {
            let mut out = Vec::with_capacity(r.1 * c.1);
            for row in r.0..r.0 + r.1 {
                out.extend_from_slice(&data[row * width + c.0..row * width + c.0 + c.1]);
            }
            out
        };
        let g = fmt.group(k);
        let groups = (cols.0 / g, cols.1.div_ceil(g));
        let qweight = match fmt.method {
            Method::Awq => grid(
                &self.qweight,
                n / PACK,
                cols,
                (rows.0 / PACK, rows.1 / PACK),
            ),
            Method::Gptq => grid(&self.qweight, n, (cols.0 / PACK, cols.1 / PACK), rows),
        };
        Parts {
            qweight,
            // compressed-tensors' symmetric scheme stores no zeros.
            qzeros: if self.qzeros.is_empty() {
                Vec::new()
            } else {
                grid(
                    &self.qzeros,
                    n / PACK,
                    groups,
                    (rows.0 / PACK, rows.1 / PACK),
                )
            },
            scales: gridf(&self.scales, n, groups, rows),
            g_idx: self
                .g_idx
                .as_ref()
                .map(|v| v[cols.0..cols.0 + cols.1].to_vec()),
        }
    }

    /// Parts of several layers sharing the input (q/k/v, gate/up), `ns[i]` outputs each, as
    /// vLLM's stacked parameter holds them: concatenated along the output dimension. GPTQ's
    /// `g_idx` is one `[k]` parameter that every shard's loads into: the last one stays.
    pub fn stack(fmt: &Format, parts: Vec<Parts>, ns: &[usize], k: usize) -> Parts {
        if parts.len() == 1 {
            return parts.into_iter().next().expect("one");
        }
        let groups = fmt.groups(k);
        // Rows of each stored tensor, and its columns per output feature (words or values).
        let cat = |pick: &dyn Fn(&Parts) -> &Vec<i32>, rows: usize, per_n: f64| -> Vec<i32> {
            let mut out = Vec::new();
            for r in 0..rows {
                for (p, &n) in parts.iter().zip(ns) {
                    let w = (n as f64 * per_n) as usize;
                    out.extend_from_slice(&pick(p)[r * w..(r + 1) * w]);
                }
            }
            out
        };
        let (qrows, qper) = match fmt.method {
            Method::Awq => (k, 1.0 / PACK as f64),
            Method::Gptq => (k / PACK, 1.0),
        };
        let qweight = cat(&|p| &p.qweight, qrows, qper);
        let qzeros = if parts.iter().any(|p| p.qzeros.is_empty()) {
            Vec::new()
        } else {
            cat(&|p| &p.qzeros, groups, 1.0 / PACK as f64)
        };
        let mut scales = Vec::new();
        for r in 0..groups {
            for (p, &n) in parts.iter().zip(ns) {
                scales.extend_from_slice(&p.scales[r * n..(r + 1) * n]);
            }
        }
        let g_idx = parts.iter().rev().find_map(|p| p.g_idx.clone());
        Parts {
            qweight,
            qzeros,
            scales,
            g_idx,
        }
    }
}

/// A nibble of a word.
fn nibble(word: i32, i: usize) -> i32 {
    ((word as u32 >> (4 * i)) & 0xF) as i32
}

/// The format's dequantization of rows `r0..r1` of the `[n, k]` weight (output features),
/// each value rounded to `act` as Marlin's half-precision multiply rounds it:
/// AWQ `w = (q − z)·s` with q and z unpacked in AutoAWQ's order; GPTQ `w = (q − 8)·s`
/// (vLLM's `uint4b8`: gptq_marlin ignores the stored zeros, which a symmetric AutoGPTQ
/// checkpoint stores as 8 − 1 = 7), the group `g_idx[i]` under act-order, `i / group`
/// otherwise. `scales` holds values already in `act`.
#[allow(clippy::too_many_arguments)]
pub fn dequantize_rows(
    fmt: &Format,
    qweight: &[i32],
    qzeros: &[i32],
    scales: &[f32],
    g_idx: Option<&[i32]>,
    (n, k): (usize, usize),
    (r0, r1): (usize, usize),
    act: DType,
    out: &mut [f32],
) {
    let g = fmt.group(k);
    let np = n / PACK;
    for c in r0..r1 {
        let row = &mut out[(c - r0) * k..(c - r0 + 1) * k];
        for (i, w) in row.iter_mut().enumerate() {
            let grp = match g_idx {
                Some(gi) => gi[i] as usize,
                None => i / g,
            };
            let s = scales[grp * n + c];
            let v = match fmt.method {
                Method::Awq => {
                    let q = nibble(qweight[i * np + c / PACK], AWQ_NIBBLE[c % PACK]);
                    let z = nibble(qzeros[grp * np + c / PACK], AWQ_NIBBLE[c % PACK]);
                    (q - z) as f32 * s
                }
                Method::Gptq => {
                    let q = nibble(qweight[(i / PACK) * n + c], i % PACK);
                    (q - 8) as f32 * s
                }
            };
            *w = act.round(v);
        }
    }
}

/// AWQ's rows `r0..r1` as Machete dequantizes them once its zero points hold `zp = -s·z`
/// (`[groups, n]`, already in `act`): `w = q·s + zp`, one fused multiply-add in the
/// activation dtype (the mainloop applies scale and zero to the converted code), so one
/// rounding of the exact `q·s + zp`. `qweight` holds AWQ's words (our layout inside the
/// GPTQ-shaped allocation, `convert_awq_to_standard`). It differs from `(q − z)·s` rounded
/// once by the rounding of `-s·z`: at most half an ulp of the weight's magnitude more.
#[allow(clippy::too_many_arguments)]
pub fn dequantize_rows_machete_zp(
    qweight: &[i32],
    zp: &[f32],
    scales: &[f32],
    (n, k): (usize, usize),
    group: usize,
    (r0, r1): (usize, usize),
    act: DType,
    out: &mut [f32],
) {
    let np = n / PACK;
    for c in r0..r1 {
        let row = &mut out[(c - r0) * k..(c - r0 + 1) * k];
        for (i, w) in row.iter_mut().enumerate() {
            let grp = i / group.max(1);
            let q = nibble(qweight[i * np + c / PACK], AWQ_NIBBLE[c % PACK]);
            *w = act.round(q as f32 * scales[grp * n + c] + zp[grp * n + c]);
        }
    }
}

/// A deterministic act-order permutation of `k` inputs (the order GPTQ would have visited
/// them; `gen-model --desc-act` needs one that every layer of the same input shares).
fn act_order(k: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..k).collect();
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ k as u64;
    for i in (1..k).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p.swap(i, (s % (i as u64 + 1)) as usize);
    }
    p
}

/// Round-to-nearest quantization of an `[n, k]` weight into a checkpoint's tensors, group by
/// group along the input, as AutoAWQ's `pseudo_quantize_tensor` (zero point) and AutoGPTQ's
/// `Quantizer` (symmetric) compute codes, then packed as they pack them. Scales are stored in
/// `scale_dtype`; each code is taken against the stored scale.
pub fn quantize(fmt: &Format, w: &[f32], n: usize, k: usize, scale_dtype: DType) -> Parts {
    use rayon::prelude::*;
    let g = fmt.group(k);
    let groups = k / g;
    // Input features of each group: in order, or act-order's permutation.
    let perm: Vec<usize> = if fmt.desc_act {
        act_order(k)
    } else {
        (0..k).collect()
    };
    let mut g_idx = vec![0i32; k];
    for (j, &i) in perm.iter().enumerate() {
        g_idx[i] = (j / g) as i32;
    }
    // Each output feature's codes, and its (scale, zero) per group, on all cores.
    let mut codes = vec![0u8; n * k];
    let per_out: Vec<Vec<(f32, u8)>> = codes
        .par_chunks_mut(k)
        .enumerate()
        .map(|(c, row)| {
            let wr = &w[c * k..(c + 1) * k];
            (0..groups)
                .map(|grp| {
                    let cols = &perm[grp * g..(grp + 1) * g];
                    let (lo, hi) = cols
                        .iter()
                        .map(|&i| wr[i])
                        .fold((f32::MAX, f32::MIN), |(a, b), v| (a.min(v), b.max(v)));
                    let (s, z) = match fmt.method {
                        Method::Awq => {
                            let s = scale_dtype.round(((hi - lo) / 15.0).max(1e-5));
                            (s, (-(lo / s).round_ties_even()).clamp(0.0, 15.0))
                        }
                        Method::Gptq => {
                            let m = lo.abs().max(hi.abs());
                            let s = if m == 0.0 { 1.0 } else { 2.0 * m / 15.0 };
                            (scale_dtype.round(s), 8.0)
                        }
                    };
                    for &i in cols {
                        row[i] = ((wr[i] / s).round_ties_even() + z).clamp(0.0, 15.0) as u8;
                    }
                    (s, z as u8)
                })
                .collect()
        })
        .collect();
    let mut zeros = vec![0u8; n * groups];
    let mut scales = vec![0f32; n * groups];
    for (c, sz) in per_out.iter().enumerate() {
        for (grp, &(s, z)) in sz.iter().enumerate() {
            scales[grp * n + c] = s;
            zeros[grp * n + c] = z;
        }
    }
    let np = n / PACK;
    let pack_awq = |rows: usize, at: &(dyn Fn(usize, usize) -> u8 + Sync)| -> Vec<i32> {
        let mut out = vec![0i32; rows * np];
        out.par_chunks_mut(np).enumerate().for_each(|(r, words)| {
            for (j, word) in words.iter_mut().enumerate() {
                let mut v = 0u32;
                for (nib, &col) in AWQ_ORDER.iter().enumerate() {
                    v |= (at(r, j * PACK + col) as u32) << (4 * nib);
                }
                *word = v as i32;
            }
        });
        out
    };
    let (qweight, qzeros) = match fmt.method {
        Method::Awq => (
            pack_awq(k, &|i, c| codes[c * k + i]),
            pack_awq(groups, &|grp, c| zeros[grp * n + c]),
        ),
        Method::Gptq => {
            // AutoGPTQ `QuantLinear.pack`: eight input rows a word, row `8·r + j` at bits
            // 4j; zeros stored minus one (v1 format) and packed along the output in order.
            let mut qw = vec![0i32; (k / PACK) * n];
            qw.par_chunks_mut(n).enumerate().for_each(|(r, words)| {
                for (c, word) in words.iter_mut().enumerate() {
                    let mut v = 0u32;
                    for j in 0..PACK {
                        v |= (codes[c * k + r * PACK + j] as u32) << (4 * j);
                    }
                    *word = v as i32;
                }
            });
            let mut qz = vec![0i32; groups * np];
            for grp in 0..groups {
                for j in 0..np {
                    let mut word = 0u32;
                    for b in 0..PACK {
                        word |= ((zeros[grp * n + j * PACK + b] - 1) as u32) << (4 * b);
                    }
                    qz[grp * np + j] = word as i32;
                }
            }
            (qw, qz)
        }
    };
    Parts {
        qweight,
        qzeros,
        scales,
        g_idx: (fmt.method == Method::Gptq).then_some(g_idx),
    }
}

/// An AWQ or GPTQ linear (one layer, or a stacked q/k/v or gate/up) as vLLM's
/// `AWQMarlinLinearMethod` / `MarlinLinearKernel` hold it: first the parameters as loaded,
/// then, after `after_loading`, Marlin's.
pub struct MarlinLinear {
    pub fmt: Format,
    /// I32: stored `[k, n/8]` (AWQ) or `[k/8, n]` (GPTQ); repacked `[k/16, 2n]`.
    pub qweight: Tensor,
    /// `[groups, n]` in the activation dtype (vLLM's `params_dtype`).
    pub scales: Tensor,
    /// I32 `[groups, n/8]`: the stored zeros, then (AWQ) Marlin's; GPTQ's are dropped for
    /// an empty tensor (`None`: a zero-byte tensor takes no block).
    pub qzeros: Option<Tensor>,
    /// GPTQ's I32 `[k]` `g_idx` as loaded, then under act-order the sorted one.
    pub g_idx: Option<Tensor>,
    /// Act-order's I32 `[k]` `g_idx_sort_indices`.
    pub g_idx_sort_indices: Option<Tensor>,
    /// compressed-tensors' I64 `[2]` `weight_shape` (a `BasevLLMParameter` that stays
    /// registered after loading: nothing in `process_weights_after_loading` drops it).
    pub weight_shape: Option<Tensor>,
    /// Marlin's I32 workspace, `n / 64 · 16` (`marlin_make_workspace`) under 0.6.4, one per
    /// SM from 0.11 (`marlin_make_workspace_new`).
    pub workspace: Option<Tensor>,
    pub out_features: usize,
    pub in_features: usize,
    /// The release's kernel generation and the GPU's SMs.
    pub kernel: Kernel,
    /// `choose_mp_linear_kernel` gave this layer to `MacheteLinearKernel` (`Kernel::machete`):
    /// `after_loading` and `forward` make Machete's allocations, not Marlin's.
    pub machete: bool,
    /// `process_weights_after_loading` has run.
    pub prepared: bool,
}

/// Host values of an I32 tensor (compute mode; other backends keep only the allocation).
fn fill_i32(t: &mut Tensor, v: &[i32]) {
    if let Storage::I32(d) = &mut t.storage {
        if d.len() == v.len() {
            d.copy_from_slice(v);
        }
    }
}

impl MarlinLinear {
    /// The parameters `create_weights` makes, filled by the weight loader: AWQ's `qweight`,
    /// `qzeros`, `scales` (awq_marlin.py L192-229); GPTQ's `qweight`, `g_idx`, `qzeros`,
    /// `scales` (gptq_marlin.py L221-260: the qzeros' data is made before the scales'). `base`
    /// names them (`model.layers.0.self_attn.qkv_proj`); `parts` holds the values in compute
    /// modes.
    pub fn load(
        rt: &Runtime,
        fmt: Format,
        base: &str,
        (n, k): (usize, usize),
        parts: Option<&Parts>,
        act: DType,
        kernel: Kernel,
    ) -> Result<Self> {
        rt.set_op("load");
        if rt.backend() == Backend::Cuda {
            crate::engine::ops::cuda(rt, |c| {
                check_gpu(&fmt, kernel.era, c.arch(), &c.info().name, &[(n, k)])
            })?;
            // Machete's AWQ zero points become `-s·z` in the activation dtype, which the
            // 4-bit GPU kernel does not read (it takes packed zeros); GPTQ and
            // compressed-tensors keep the words and scales it reads, in the same allocations.
            if kernel.machete(&fmt, n, k) && fmt.method == Method::Awq {
                return Err(Error::Request(format!(
                    "an AWQ checkpoint on this Hopper GPU: vLLM 0.19 and later run its [{n}, {k}] layers with MacheteLinearKernel, whose zero points are stored as -scale·zero in the activation dtype, which vramscope's 4-bit GPU kernel does not read; plan it on a simulated device (--device sim:h100-sxm, dry or CPU compute), which models Machete's allocations"
                )));
            }
        }
        let groups = fmt.groups(k);
        let w = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        if fmt.compressed_tensors {
            return Self::load_compressed_tensors(rt, fmt, base, (n, k), parts, act, kernel);
        }
        let mut qweight = w("qweight", &fmt.qweight_shape(n, k), DType::I32)?;
        let mut g_idx = match fmt.method {
            Method::Gptq => Some(w("g_idx", &[k], DType::I32)?),
            Method::Awq => None,
        };
        // Both methods make the zeros before the scales.
        let mut qzeros = w("qzeros", &[groups, n / PACK], DType::I32)?;
        let mut scales = w("scales", &[groups, n], act)?;
        if let (Some(p), Backend::Cpu) = (parts, rt.backend()) {
            fill_i32(&mut qweight, &p.qweight);
            fill_i32(&mut qzeros, &p.qzeros);
            let s = scales.f32_mut();
            s.copy_from_slice(&p.scales);
            act.round_slice(s);
            if let (Some(t), Some(v)) = (&mut g_idx, &p.g_idx) {
                fill_i32(t, v);
            }
        } else if let (Some(p), Backend::Cuda) = (parts, rt.backend()) {
            use crate::engine::ops::{upload_f32, upload_i32};
            upload_i32(rt, &mut qweight, &p.qweight)?;
            upload_i32(rt, &mut qzeros, &p.qzeros)?;
            upload_f32(rt, &mut scales, &p.scales)?;
            if let (Some(t), Some(v)) = (&mut g_idx, &p.g_idx) {
                upload_i32(rt, t, v)?;
            }
        }
        Ok(MarlinLinear {
            fmt,
            qweight,
            scales,
            qzeros: Some(qzeros),
            g_idx,
            g_idx_sort_indices: None,
            weight_shape: None,
            workspace: None,
            out_features: n,
            in_features: k,
            kernel,
            machete: kernel.machete(&fmt, n, k),
            prepared: false,
        })
    }

    /// `CompressedTensorsWNA16.create_weights` (0.11.0 compressed_tensors_wNa16.py L111-186;
    /// 0.15.1 L141-212 and 0.19.0 L139-210 the same): `weight_packed` I32 `[n, k/8]`, then
    /// `weight_scale` `[n, groups]` in `params_dtype`; the `torch.zeros([n/8, groups])` of
    /// `zeros_args` is made whatever the scheme (L134-143) and, symmetric, dropped with the
    /// function's locals on return; `weight_shape` I64 `[2]`, then under act-order
    /// `weight_g_idx` I32 `[k]`. The tensors hold GPTQ's layout inside (ours; the
    /// allocations are vLLM's).
    fn load_compressed_tensors(
        rt: &Runtime,
        fmt: Format,
        base: &str,
        (n, k): (usize, usize),
        parts: Option<&Parts>,
        act: DType,
        kernel: Kernel,
    ) -> Result<Self> {
        let groups = fmt.groups(k);
        let w = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        let mut qweight = w("weight_packed", &[n, k / PACK], DType::I32)?;
        let mut scales = w("weight_scale", &[n, groups], act)?;
        let zeros_args = w("zeros_args", &[n / PACK, groups], DType::I32)?;
        let weight_shape = w("weight_shape", &[2], DType::I64)?;
        let mut g_idx = if fmt.desc_act {
            Some(w("weight_g_idx", &[k], DType::I32)?)
        } else {
            None
        };
        drop(zeros_args);
        if let (Some(p), Backend::Cpu) = (parts, rt.backend()) {
            fill_i32(&mut qweight, &p.qweight);
            let s = scales.f32_mut();
            s.copy_from_slice(&p.scales);
            act.round_slice(s);
            if let (Some(t), Some(v)) = (&mut g_idx, &p.g_idx) {
                fill_i32(t, v);
            }
        } else if let (Some(p), Backend::Cuda) = (parts, rt.backend()) {
            use crate::engine::ops::{upload_f32, upload_i32};
            upload_i32(rt, &mut qweight, &p.qweight)?;
            upload_f32(rt, &mut scales, &p.scales)?;
            if let (Some(t), Some(v)) = (&mut g_idx, &p.g_idx) {
                upload_i32(rt, t, v)?;
            }
        }
        Ok(MarlinLinear {
            fmt,
            qweight,
            scales,
            qzeros: None,
            g_idx,
            g_idx_sort_indices: None,
            weight_shape: Some(weight_shape),
            workspace: None,
            out_features: n,
            in_features: k,
            kernel,
            machete: kernel.machete(&fmt, n, k),
            prepared: false,
        })
    }

    pub fn weight_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.nbytes());
        self.qweight.nbytes()
            + self.scales.nbytes()
            + opt(&self.qzeros)
            + opt(&self.g_idx)
            + opt(&self.g_idx_sort_indices)
            + opt(&self.weight_shape)
            + opt(&self.workspace)
    }

    fn base(&self) -> String {
        self.qweight
            .name
            .trim_end_matches(".qweight")
            .trim_end_matches(".weight_packed")
            .trim_end_matches(".repacked")
            .to_string()
    }

    /// `process_weights_after_loading`, allocation for allocation (vLLM 0.6.4):
    ///
    /// AWQ (awq_marlin.py L239-278): the zeroed workspace (`marlin_make_workspace`,
    /// marlin_utils.py L136-144); `awq_marlin_repack`'s I32 `[k/16, 2n]` output (the C++ op's
    /// `{size_k / tile_size, size_n * tile_size / pack_factor}`), replacing `qweight` (a plain
    /// tensor is not the Parameter's type, so `replace_parameter` re-registers and the old
    /// one is freed, layer_utils.py L20-37); `marlin_permute_scales`' output replacing the
    /// scales (L186-196); `awq_to_marlin_zero_points` (L239-259): `unpack_cols`' device copy
    /// `[groups, n]`, the un-interleaved copy (the unpacked one freed), the scale-permuted
    /// and the interleaved copies (`marlin_zero_points`, L217-236, each freeing the one
    /// before), `pack_cols`' `[groups, n/8]` device copy, then the interleaved copy and the
    /// un-interleaved one freed on return, and the stored zeros replaced; `g_idx` and
    /// `g_idx_sort_indices` empty (no block).
    ///
    /// GPTQ on Marlin (kernels/marlin.py L50-110): the workspace; under act-order
    /// `marlin_sort_g_idx` (L169-172: `argsort`'s sort makes I32 values and I64 indices, the
    /// values freed; `.to(int)` copies the indices, the I64 ones freed; `g_idx[indices]`
    /// makes the sorted g_idx, which replaces the stored one; the sort's own scratch space,
    /// which CUDA's sort takes from the caching allocator, is not modelled), otherwise the
    /// stored `g_idx` replaced by an empty one (freed); the stored zeros replaced by an empty
    /// tensor (freed);
    /// `gptq_marlin_repack`'s `[k/16, 2n]` output (assigning `x.data` frees the stored
    /// qweight); the permuted scales (the stored ones freed).
    ///
    /// Each `[:, perm]` indexing with a Python list or numpy array first copies the index to
    /// the device (I64, 64 or 32 elements: a 512-byte block), freed after the op.
    pub fn after_loading(&mut self, rt: &Runtime, act: DType) -> Result<()> {
        if self.prepared {
            return Ok(());
        }
        self.prepared = true;
        if self.machete {
            let base = self.base();
            if self.kernel.era == Era::Converted && self.fmt.method == Method::Awq {
                rt.set_op("marlin.process_weights_after_loading");
                self.convert_awq_to_standard(rt, &base)?;
            }
            return self.machete_after_loading(rt, &base, act);
        }
        let (n, k) = (self.out_features, self.in_features);
        let groups = self.fmt.groups(k);
        let base = self.base();
        let t = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        rt.set_op("marlin.process_weights_after_loading");
        let era = self.kernel.era;
        if era == Era::Converted && self.fmt.method == Method::Awq {
            self.convert_awq_to_standard(rt, &base)?;
        }
        let workspace_len = match era {
            Era::V0_6_4 => n / MIN_THREAD_N * MAX_PARALLEL,
            Era::Refactored | Era::Converted => self.kernel.sms,
        };
        let workspace = t("workspace", &[workspace_len], DType::I32)?;
        let index = |len: usize| t("perm_index", &[len], DType::I64);
        // The permutation of `marlin_permute_scales`: 64 wide with groups smaller than k,
        // `scale_perm_single` (32) for one group.
        let scale_perm_len = if self.fmt.group(k) < k { 64 } else { 32 };
        let repacked_shape = [k / MARLIN_TILE, n * MARLIN_TILE / PACK];
        match self.fmt.method {
            Method::Awq if era == Era::Converted => {
                // MarlinLinearKernel (0.28.0 mixed_precision/marlin.py L183-215): the zero
                // points (`unpack_cols` of the transposed GPTQ-layout zeros, then
                // `marlin_zero_points`' permuted and interleaved copies and `pack_cols`),
                // then `gptq_marlin_repack`, then the permuted scales.
                rt.set_op("marlin.marlin_zero_points");
                let unpacked = t("zp_unpacked", &[groups, n], DType::I32)?;
                let i = index(64)?;
                let permuted = t("zp_permuted", &[groups, n], DType::I32)?;
                drop(i);
                drop(unpacked);
                let i = index(PACK)?;
                let interleaved = t("zp_interleaved", &[groups, n], DType::I32)?;
                drop(i);
                drop(permuted);
                let mut zp = t("marlin_zp", &[groups, n / PACK], DType::I32)?;
                drop(interleaved);
                if let Some(old) = self.qzeros.take() {
                    move_words(rt, &old, &mut zp)?;
                }
                self.qzeros = Some(zp);
                rt.set_op("marlin.gptq_marlin_repack");
                let mut q = t("repacked", &repacked_shape, DType::I32)?;
                move_words(rt, &self.qweight, &mut q)?;
                self.qweight = q;
                rt.set_op("marlin.permute_scales");
                let s = self.permuted_scales(rt, &base, scale_perm_len, act)?;
                self.scales = s;
            }
            Method::Awq => {
                rt.set_op("marlin.awq_marlin_repack");
                let mut q = t("repacked", &repacked_shape, DType::I32)?;
                move_words(rt, &self.qweight, &mut q)?;
                self.qweight = q;
                rt.set_op("marlin.permute_scales");
                let s = self.permuted_scales(rt, &base, scale_perm_len, act)?;
                self.scales = s;
                rt.set_op("marlin.awq_to_marlin_zero_points");
                let unpacked = t("zp_unpacked", &[groups, n], DType::I32)?;
                let i = index(PACK)?;
                let uninterleaved = t("zp_uninterleaved", &[groups, n], DType::I32)?;
                drop(i);
                drop(unpacked);
                let i = index(64)?;
                let permuted = t("zp_permuted", &[groups, n], DType::I32)?;
                drop(i);
                let i = index(PACK)?;
                let interleaved = t("zp_interleaved", &[groups, n], DType::I32)?;
                drop(i);
                drop(permuted);
                let mut zp = t("marlin_zp", &[groups, n / PACK], DType::I32)?;
                drop(interleaved);
                drop(uninterleaved);
                if let Some(old) = self.qzeros.take() {
                    move_words(rt, &old, &mut zp)?;
                }
                self.qzeros = Some(zp);
            }
            Method::Gptq => {
                if self.fmt.desc_act {
                    rt.set_op("marlin.sort_g_idx");
                    let values = t("g_idx_sort_values", &[k], DType::I32)?;
                    let idx64 = t("g_idx_argsort", &[k], DType::I64)?;
                    drop(values);
                    let mut idx = t("g_idx_sort_indices", &[k], DType::I32)?;
                    drop(idx64);
                    let mut sorted = t("g_idx_sorted", &[k], DType::I32)?;
                    // The GPU keeps the stored g_idx in the sorted one's allocation: its kernel
                    // looks each input's group up directly.
                    if let (Some(g), Backend::Cuda) = (&self.g_idx, rt.backend()) {
                        move_words(rt, g, &mut sorted)?;
                    }
                    if let (Some(g), Backend::Cpu) = (&self.g_idx, rt.backend()) {
                        let g = g.i32();
                        let mut order: Vec<usize> = (0..k).collect();
                        order.sort_by_key(|&i| g[i]);
                        for (j, &i) in order.iter().enumerate() {
                            idx.i32_mut()[j] = i as i32;
                            sorted.i32_mut()[j] = g[i];
                        }
                    }
                    self.g_idx = Some(sorted);
                    self.g_idx_sort_indices = Some(idx);
                } else {
                    self.g_idx = None;
                }
                self.qzeros = None;
                rt.set_op("marlin.gptq_marlin_repack");
                // compressed-tensors: `permute_param_layout_` makes `weight_packed` a
                // transposed view, whose `.contiguous()` is a `[k/8, n]` copy that the repack
                // reads and that is freed when the call returns, before `x.data` is
                // assigned (mixed_precision/marlin.py L71-79 at 0.11.0; 0.15.1 and 0.19.0
                // L96-107). GPTQ's `qweight` is already `[k/8, n]`: `.contiguous()` is itself.
                let contiguous = if self.fmt.compressed_tensors {
                    Some(t("weight_packed_contiguous", &[k / PACK, n], DType::I32)?)
                } else {
                    None
                };
                let mut q = t("repacked", &repacked_shape, DType::I32)?;
                move_words(rt, &self.qweight, &mut q)?;
                drop(contiguous);
                self.qweight = q;
                rt.set_op("marlin.permute_scales");
                // The same for `weight_scale` `[n, groups]` (L81-88): one group's `[1, n]`
                // view is contiguous already (no copy), more groups' a `[groups, n]` copy.
                let contiguous = if self.fmt.compressed_tensors && groups > 1 {
                    Some(t("weight_scale_contiguous", &[groups, n], act)?)
                } else {
                    None
                };
                let s = self.permuted_scales(rt, &base, scale_perm_len, act)?;
                drop(contiguous);
                self.scales = s;
            }
        }
        self.workspace = Some(workspace);
        Ok(())
    }

    /// `MacheteLinearKernel.process_weights_after_loading` (0.11.0 kernels/mixed_precision/
    /// machete.py L62-114; 0.15.1 L70-125, and 0.19.0 to 0.29.0 kernels/linear/
    /// mixed_precision/machete.py at the same lines; 0.31.0 L60-95 without act-order),
    /// allocation for allocation:
    ///
    /// - act-order: `torch.argsort(g_idx).to(torch.int)` (the sort's I32 values and I64
    ///   indices, the values freed; the I32 copy, the I64 ones freed), kept for the life of
    ///   the model by the `permute_cols` partial (`self.act_perm`, L70-74);
    /// - `transform_w_q` (L76-91): `permute_param_layout_` is a view; under act-order
    ///   `unpack_quantized_values_into_int32` (quant_utils.py, 0.19.0 L416-436: a zeroed
    ///   `[k, n]` I32, then eight times a `>>` and a `&` copy of the packed words, each
    ///   freed), `x_unpacked[perm, :]` (`[k, n]` I32), `pack_quantized_values_into_int32`
    ///   (L394-413: a zeroed `[k/8, n]` I32, eight times a `&` and a `<<` copy) that replaces
    ///   the stored words (freed); then `x.data.t().contiguous().t()`: GPTQ's row-major
    ///   `[k/8, n]` (and AWQ's converted one) is copied to `[n, k/8]` for the call, while
    ///   compressed-tensors' `[n, k/8]` (and the packed act-order words) already are, so no
    ///   copy; `machete_prepack_B` makes `torch::empty_like(B)`, the same bytes
    ///   (machete_prepack_launcher.cuh `prepack_impl`), the copy is freed when the call
    ///   returns and the stored words when `x.data` takes the prepacked ones; the act-order
    ///   locals `x_unpacked` and `x_perm` are freed as the function returns;
    /// - `transform_w_s` (L93-97): `.contiguous()` of the `[groups, n]` view: GPTQ's and AWQ's
    ///   scales already are; compressed-tensors' `[n, groups]` is copied when it has more
    ///   than one group, the stored scales freed;
    /// - `transform_w_zp` (L99-108, AWQ from 0.19 only): the zeros (`[n/8, groups]` after
    ///   `_convert_awq_to_standard_format`) unpacked to a zeroed `[groups, n]` I32 (eight
    ///   `>>`/`&` copies of `[groups, n/8]`), then `-1.0 * w_s` (`[groups, n]` in the
    ///   activation dtype), `x_unpacked.to(dtype)`, their product, the first two freed; the
    ///   product (the zero points with the scales applied, `-s·z`, in the activation dtype)
    ///   replaces the packed zeros; `x_unpacked` freed on return.
    ///
    /// GPTQ's `g_idx` and `qzeros` and compressed-tensors' `weight_g_idx` and `weight_shape`
    /// are not touched: they stay allocated (Marlin's path empties the first two). No
    /// workspace. The words and scales keep our layout inside vLLM's allocations (the stored
    /// GPTQ/AWQ order, the original `g_idx`): the CPU and the GPU multiply them unpermuted,
    /// the same products Machete sums in the permuted order.
    fn machete_after_loading(&mut self, rt: &Runtime, base: &str, act: DType) -> Result<()> {
        let (n, k) = (self.out_features, self.in_features);
        let groups = self.fmt.groups(k);
        let t = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        rt.set_op("machete.process_weights_after_loading");
        if self.fmt.desc_act {
            let values = t("g_idx_sort_values", &[k], DType::I32)?;
            let idx64 = t("g_idx_argsort", &[k], DType::I64)?;
            drop(values);
            let mut perm = t("machete_perm", &[k], DType::I32)?;
            drop(idx64);
            if let (Some(g), Backend::Cpu) = (&self.g_idx, rt.backend()) {
                let g = g.i32();
                let mut order: Vec<usize> = (0..k).collect();
                order.sort_by_key(|&i| g[i]);
                for (j, &i) in order.iter().enumerate() {
                    perm.i32_mut()[j] = i as i32;
                }
            }
            self.g_idx_sort_indices = Some(perm);
        }
        rt.set_op("machete.prepack_B");
        let mut act_order_locals = Vec::new();
        if self.fmt.desc_act {
            let unpacked = t("machete_unpacked", &[k, n], DType::I32)?;
            for _ in 0..PACK {
                let shifted = t("machete_unpack_shift", &[k / PACK, n], DType::I32)?;
                let masked = t("machete_unpack_mask", &[k / PACK, n], DType::I32)?;
                drop(shifted);
                drop(masked);
            }
            // `x_unpacked[perm, :]`: ATen's `index` takes the I32 index as it is (`make_info`
            // checks index types with `allow_int`, no long copy): the `[k, n]` output only.
            let permuted = t("machete_rows_permuted", &[k, n], DType::I32)?;
            let mut packed = t("machete_packed", &[n, k / PACK], DType::I32)?;
            for _ in 0..PACK {
                let masked = t("machete_pack_mask", &[n, k / PACK], DType::I32)?;
                let shifted = t("machete_pack_shift", &[n, k / PACK], DType::I32)?;
                drop(masked);
                drop(shifted);
            }
            move_words(rt, &self.qweight, &mut packed)?;
            self.qweight = packed;
            act_order_locals.push(unpacked);
            act_order_locals.push(permuted);
        }
        let contiguous = if !self.fmt.desc_act && !self.fmt.compressed_tensors {
            Some(t("qweight_t_contiguous", &[n, k / PACK], DType::I32)?)
        } else {
            None
        };
        let mut prepacked = t("machete_prepacked", &[k / PACK, n], DType::I32)?;
        move_words(rt, &self.qweight, &mut prepacked)?;
        drop(contiguous);
        self.qweight = prepacked;
        drop(act_order_locals);
        if self.fmt.compressed_tensors && groups > 1 {
            rt.set_op("machete.scales_contiguous");
            let mut s = t("weight_scale_contiguous", &[groups, n], act)?;
            match rt.backend() {
                Backend::Cpu => s.f32_mut().copy_from_slice(self.scales.f32()),
                Backend::Cuda => {
                    crate::engine::ops::cuda(rt, |c| c.copy_bytes(&self.scales, &mut s))?
                }
                Backend::Dry => {}
            }
            self.scales = s;
        }
        if self.fmt.method == Method::Awq {
            rt.set_op("machete.zero_points");
            let unpacked = t("machete_zp_unpacked", &[groups, n], DType::I32)?;
            for _ in 0..PACK {
                let shifted = t("machete_zp_shift", &[groups, n / PACK], DType::I32)?;
                let masked = t("machete_zp_mask", &[groups, n / PACK], DType::I32)?;
                drop(shifted);
                drop(masked);
            }
            let neg_scales = t("machete_neg_scales", &[groups, n], act)?;
            let converted = t("machete_zp_converted", &[groups, n], act)?;
            let mut zp = t("machete_zp", &[groups, n], act)?;
            drop(neg_scales);
            drop(converted);
            if let (Some(old), Backend::Cpu) = (&self.qzeros, rt.backend()) {
                // `-1.0 * w_s * z`: the negation is exact, the product rounded to `act`.
                let (zeros, scales) = (old.i32(), self.scales.f32());
                let np = n / PACK;
                for (j, v) in zp.f32_mut().iter_mut().enumerate() {
                    let (grp, c) = (j / n, j % n);
                    let z = nibble(zeros[grp * np + c / PACK], AWQ_NIBBLE[c % PACK]);
                    *v = act.round(-scales[j] * z as f32);
                }
            }
            self.qzeros = Some(zp);
            drop(unpacked);
        }
        Ok(())
    }

    /// The group of each input as Machete's layer holds it: the stored `g_idx` (unsorted;
    /// `MacheteLinearKernel` keeps it and permutes inputs and words instead), act-order only.
    fn machete_g_idx(&self) -> Option<Vec<i32>> {
        self.g_idx
            .as_ref()
            .filter(|_| self.fmt.desc_act)
            .map(|t| t.i32().to_vec())
    }

    /// AWQ through Machete: the zero points with the scales applied (`[groups, n]`, `-s·z`
    /// in the activation dtype) once prepared.
    fn machete_zp(&self) -> Option<&[f32]> {
        (self.machete && self.prepared && self.fmt.method == Method::Awq)
            .then(|| self.qzeros.as_ref().map(|t| t.f32()))
            .flatten()
    }

    /// `MacheteLinearKernel.apply_weights` (0.11.0 machete.py L116-144; 0.15.1 to 0.29.0
    /// L127-159; 0.31.0 L97-126 without act-order): the reshape is a view; under act-order
    /// `ops.permute_cols(x_2d, perm)` (fp16/bf16 with k a multiple of 8, else `x[:, perm]`:
    /// an `[m, k]` copy either way, `torch.empty_like(a)`), held by `x_2d` until the call
    /// returns; `machete_mm` (machete_mm_launcher.cuh `run_impl`) allocates the output
    /// `D [m, n]` in the activation dtype, then its workspace (`machete_workspace_bytes`),
    /// freed when it returns. `rows` as in `forward`.
    fn machete_forward(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        act: DType,
        rows: &[usize],
    ) -> Result<Tensor> {
        let (m, k, n) = (x.rows(), self.in_features, self.out_features);
        rt.set_op("machete.machete_mm");
        let x_perm = if self.fmt.desc_act {
            Some(rt.tensor(
                format!("{name}.act_perm"),
                Category::Activation,
                &[m, k],
                act,
            )?)
        } else {
            None
        };
        let mut out =
            rt.tensor_for_overwrite(format!("{name}.out"), Category::Activation, &[m, n], act)?;
        let ws_bytes = machete_workspace_bytes(m, n, k, self.kernel.sms);
        let workspace = if ws_bytes > 0 {
            Some(rt.tensor(
                format!("{name}.machete_workspace"),
                Category::Activation,
                &[ws_bytes],
                DType::U8,
            )?)
        } else {
            None
        };
        match rt.backend() {
            Backend::Cpu => self.cpu_gemm(rt, x, &mut out, act, rows)?,
            Backend::Cuda => {
                let w = crate::device::cuda::W4Weights {
                    awq: false,
                    qweight: &self.qweight,
                    qzeros: None,
                    scales: &self.scales,
                    g_idx: self.g_idx.as_deref().filter(|_| self.fmt.desc_act),
                    group: self.fmt.group(k),
                    n,
                    k,
                };
                let ws = workspace.as_deref();
                crate::engine::ops::cuda(rt, |c| c.w4_gemm(x, &w, &mut out, rows, ws))?
            }
            Backend::Dry => {}
        }
        drop(workspace);
        drop(x_perm);
        Ok(out)
    }

    /// `_convert_awq_to_standard_format` (0.19.0 awq_marlin.py, 0.28.0 auto_awq.py L93-169):
    /// AWQ's `[k, n/8]` words unpacked to `[k, n/8, 8]` int32 (`>> shifts`, then `& mask`,
    /// then the reorder's index copy, each freeing the one before), shifted back into
    /// `[k/8, 8, n]` and summed into GPTQ's `[k/8, n]` layout; the zeros the same way into
    /// `[n/8, groups]` (their transpose copied before the shift). The reorder index (8 i64)
    /// and the shifts (8 i32) are made first; the unpacked and stored tensors stay referenced
    /// by the function's locals until it returns, when they are freed in the order CPython
    /// clears them. The words keep their AWQ order inside (the layout is ours, the
    /// allocations vLLM's).
    fn convert_awq_to_standard(&mut self, rt: &Runtime, base: &str) -> Result<()> {
        let (n, k) = (self.out_features, self.in_features);
        let groups = self.fmt.groups(k);
        let t = |name: &str, shape: &[usize], dtype| {
            rt.tensor(format!("{base}.{name}"), Category::Weight, shape, dtype)
        };
        rt.set_op("marlin.convert_awq_to_standard_format");
        let reverse_order = t("awq_reverse_order", &[PACK], DType::I64)?;
        let shifts = t("awq_shifts", &[PACK], DType::I32)?;
        let shifted = t("awq_unpacked_shift", &[k, n / PACK, PACK], DType::I32)?;
        let masked = t("awq_unpacked_mask", &[k, n / PACK, PACK], DType::I32)?;
        drop(shifted);
        let unpacked = t("awq_unpacked", &[k, n / PACK, PACK], DType::I32)?;
        drop(masked);
        let packed = t("awq_repacked_shift", &[k / PACK, PACK, n], DType::I32)?;
        let mut new_qw = t("qweight_standard", &[k / PACK, n], DType::I32)?;
        drop(packed);
        move_words(rt, &self.qweight, &mut new_qw)?;
        let old_qw = std::mem::replace(&mut self.qweight, new_qw);
        let mut zp_locals = Vec::new();
        if let Some(qz) = self.qzeros.take() {
            let shifted = t("awq_zp_shift", &[groups, n / PACK, PACK], DType::I32)?;
            let masked = t("awq_zp_mask", &[groups, n / PACK, PACK], DType::I32)?;
            drop(shifted);
            let unpacked_zp = t("awq_zp_unpacked", &[groups, n / PACK, PACK], DType::I32)?;
            drop(masked);
            let transposed = t("awq_zp_transposed", &[n / PACK, PACK, groups], DType::I32)?;
            drop(unpacked_zp);
            let packed = t(
                "awq_zp_repacked_shift",
                &[n / PACK, PACK, groups],
                DType::I32,
            )?;
            let mut new_qz = t("qzeros_standard", &[n / PACK, groups], DType::I32)?;
            drop(packed);
            move_words(rt, &qz, &mut new_qz)?;
            self.qzeros = Some(new_qz);
            zp_locals.push(qz);
            zp_locals.push(transposed);
        }
        // The frame's locals in order: reverse_order, shifts, qw, unpacked, …, qz, unpacked_zp.
        drop(reverse_order);
        drop(shifts);
        drop(old_qw);
        drop(unpacked);
        drop(zp_locals);
        Ok(())
    }

    /// `marlin_permute_scales`: the index on the device, the permuted copy, the index freed;
    /// the caller's replacement then frees the stored scales.
    fn permuted_scales(
        &self,
        rt: &Runtime,
        base: &str,
        perm_len: usize,
        act: DType,
    ) -> Result<Tensor> {
        let i = rt.tensor(
            format!("{base}.perm_index"),
            Category::Weight,
            &[perm_len],
            DType::I64,
        )?;
        let (n, k) = (self.out_features, self.in_features);
        let mut s = rt.tensor(
            format!("{base}.marlin_scales"),
            Category::Weight,
            &[self.fmt.groups(k), n],
            act,
        )?;
        drop(i);
        match rt.backend() {
            Backend::Cpu => s.f32_mut().copy_from_slice(self.scales.f32()),
            Backend::Cuda => crate::engine::ops::cuda(rt, |c| c.copy_bytes(&self.scales, &mut s))?,
            Backend::Dry => {}
        }
        Ok(s)
    }

    /// `apply_awq_marlin_linear` / `apply_gptq_marlin_linear` (marlin_utils.py L276-348):
    /// `x [m, k] → [m, n]` in `act`. The reshapes are views; `gptq_marlin_gemm` (csrc
    /// gptq_marlin.cu at 0.6.4, `use_fp32_reduce` on by default, L22) allocates the output
    /// `c [m, n]`, `a_tmp [m, k]` in the activation dtype and the f32 reduce buffer
    /// `c_tmp [reduce_max_m, n]` (`determine_reduce_max_m`: m rounded up to 16, 32, 48 or
    /// 64, beyond that 64 · min(⌈m/64⌉, 16)); the two temporaries are C++ locals, freed in
    /// reverse order on return. `rows`: a stacked layer's shards, each written as one
    /// contiguous block as `FusedLinear` lays its output out.
    pub fn forward(
        &self,
        rt: &Runtime,
        x: &Tensor,
        name: &str,
        act: DType,
        rows: &[usize],
    ) -> Result<Tensor> {
        rt.check_cancel()?;
        let (m, k, n) = (x.rows(), x.cols(), self.out_features);
        if k != self.in_features {
            return Err(Error::Request(format!(
                "{name}: input has {k} features but the {} weight {} expects {}",
                self.fmt.method.name(),
                self.qweight.name,
                self.in_features
            )));
        }
        if !self.prepared {
            return Err(Error::Request(format!(
                "{name}: the {} weight {} was not repacked for Marlin (process_weights_after_loading did not run)",
                self.fmt.method.name(),
                self.qweight.name
            )));
        }
        if self.machete {
            return self.machete_forward(rt, x, name, act, rows);
        }
        rt.set_op("marlin.gptq_marlin_gemm");
        let mut out =
            rt.tensor_for_overwrite(format!("{name}.out"), Category::Activation, &[m, n], act)?;
        let (a_tmp, c_tmp) = match self.kernel.era {
            Era::V0_6_4 => {
                let a_tmp =
                    rt.tensor(format!("{name}.a_tmp"), Category::Activation, &[m, k], act)?;
                let c_tmp = rt.tensor(
                    format!("{name}.c_tmp"),
                    Category::Activation,
                    &[reduce_max_m(m), n],
                    DType::F32,
                )?;
                (Some(a_tmp), c_tmp)
            }
            // The refactored kernel: the reduce buffer first, `a_tmp` only under act-order
            // (a C++ local declared after it, so freed before it).
            Era::Refactored | Era::Converted => {
                let c_tmp = rt.tensor(
                    format!("{name}.c_tmp"),
                    Category::Activation,
                    &[self.kernel.c_tmp_len(m)],
                    DType::F32,
                )?;
                let a_tmp = match self.g_idx_sort_indices {
                    Some(_) => Some(rt.tensor(
                        format!("{name}.a_tmp"),
                        Category::Activation,
                        &[m, k],
                        act,
                    )?),
                    None => None,
                };
                (a_tmp, c_tmp)
            }
        };
        match rt.backend() {
            Backend::Cpu => self.cpu_gemm(rt, x, &mut out, act, rows)?,
            Backend::Cuda => {
                let w = crate::device::cuda::W4Weights {
                    awq: self.fmt.method == Method::Awq,
                    qweight: &self.qweight,
                    qzeros: self.qzeros.as_deref(),
                    scales: &self.scales,
                    g_idx: self.g_idx.as_deref().filter(|_| self.fmt.desc_act),
                    group: self.fmt.group(k),
                    n,
                    k,
                };
                // The larger temporary takes the dequantized slices (`w4_gemm`).
                let scratch = match &a_tmp {
                    Some(a) if a.nbytes() > c_tmp.nbytes() => a,
                    _ => &c_tmp,
                };
                crate::engine::ops::cuda(rt, |c| c.w4_gemm(x, &w, &mut out, rows, Some(scratch)))?
            }
            Backend::Dry => {}
        }
        match self.kernel.era {
            Era::V0_6_4 => {
                drop(c_tmp);
                drop(a_tmp);
            }
            Era::Refactored | Era::Converted => {
                drop(a_tmp);
                drop(c_tmp);
            }
        }
        Ok(out)
    }

    /// The stored g_idx again from the sorted one and its sort indices (act-order only).
    fn host_g_idx(&self) -> Option<Vec<i32>> {
        let (sorted, idx) = (self.g_idx.as_ref()?, self.g_idx_sort_indices.as_ref()?);
        let mut g = vec![0i32; self.in_features];
        for (&i, &v) in idx.i32().iter().zip(sorted.i32()) {
            g[i as usize] = v;
        }
        Some(g)
    }

    /// The dequantized weight on the host, a run of output rows at a time, multiplied in f32
    /// and rounded to `act`.
    fn cpu_gemm(
        &self,
        rt: &Runtime,
        x: &Tensor,
        out: &mut Tensor,
        act: DType,
        rows: &[usize],
    ) -> Result<()> {
        let (m, k, n) = (x.rows(), self.in_features, self.out_features);
        let zeros: &[i32] = match self.machete_zp() {
            Some(_) => &[],
            None => self.qzeros.as_ref().map_or(&[], |t| t.i32()),
        };
        let g_idx = if self.machete {
            self.machete_g_idx()
        } else {
            self.host_g_idx()
        };
        let (fmt, qweight, scales) = (&self.fmt, self.qweight.i32(), self.scales.f32());
        let zp = self.machete_zp();
        let decode = |r: std::ops::Range<usize>, buf: &mut [f32]| match zp {
            Some(zp) => dequantize_rows_machete_zp(
                qweight,
                zp,
                scales,
                (n, k),
                fmt.group(k),
                (r.start, r.end),
                act,
                buf,
            ),
            None => dequantize_rows(
                fmt,
                qweight,
                zeros,
                scales,
                g_idx.as_deref(),
                (n, k),
                (r.start, r.end),
                act,
                buf,
            ),
        };
        super::host_decoded_matmul(rt, x.f32(), (m, k), rows, out.f32_mut(), decode, |a| {
            act.round(a)
        })
    }

    /// The whole `[n, k]` weight as the forward dequantizes it (compute mode; for tests and
    /// the reference check).
    pub fn dequantized(&self, act: DType) -> Vec<f32> {
        let (n, k) = (self.out_features, self.in_features);
        let mut w = vec![0f32; n * k];
        if let Some(zp) = self.machete_zp() {
            let (qweight, scales) = (self.qweight.i32(), self.scales.f32());
            let g = self.fmt.group(k);
            dequantize_rows_machete_zp(qweight, zp, scales, (n, k), g, (0, n), act, &mut w);
            return w;
        }
        let zeros: &[i32] = self.qzeros.as_ref().map_or(&[], |t| t.i32());
        let g_idx = if self.machete {
            self.machete_g_idx()
        } else if self.prepared {
            self.host_g_idx()
        } else {
            self.g_idx
                .as_ref()
                .filter(|_| self.fmt.desc_act)
                .map(|t| t.i32().to_vec())
        };
        dequantize_rows(
            &self.fmt,
            self.qweight.i32(),
            zeros,
            self.scales.f32(),
            g_idx.as_deref(),
            (n, k),
            (0, n),
            act,
            &mut w,
        );
        w
    }
}

/// The stored words kept in the allocation that replaces them (same element count): copied
/// on the host, or on the GPU.
fn move_words(rt: &Runtime, from: &Tensor, to: &mut Tensor) -> Result<()> {
    match (&from.storage, &mut to.storage) {
        (Storage::I32(src), Storage::I32(dst)) if src.len() == dst.len() => {
            dst.copy_from_slice(src);
            Ok(())
        }
        (Storage::Cuda(_), Storage::Cuda(_)) => {
            crate::engine::ops::cuda(rt, |c| c.copy_bytes(from, to))
        }
        _ => Ok(()),
    }
}

/// Machete's default schedule for an `m × n × k` product (tokens, outputs, inputs): the tile
/// along n, the tile along m and the cluster along n, as the generated dispatch picks it
/// (`mm_dispatch_*`: `M = A.size(0)`, `N = B.size(1)`, `K = A.size(1)`; the conditions of
/// `default_tile_heuristic_config` in csrc/quantization/machete/generate.py, the same for
/// every type; `TileShapeNM` and `ClusterShape` take `tile_shape_mn` and
/// `cluster_shape_mnk` in that order). The csrc is not in the wheel; the table is the one
/// vLLM's generate.py has held since Machete came (0.6.x) and holds at 0.33.
pub fn machete_schedule(m: usize, n: usize, k: usize) -> (usize, usize, usize) {
    match m {
        257.. if k <= 16384 && n <= 4096 => (128, 128, 2),
        257.. => (128, 256, 2),
        129.. if k <= 4096 && n <= 4096 => (128, 64, 2),
        129.. if k <= 8192 && n <= 8192 => (128, 128, 2),
        129.. => (128, 256, 2),
        65.. if k <= 4069 && n <= 4069 => (128, 32, 2),
        65.. if k <= 4069 && n <= 8192 => (128, 64, 2),
        65.. if k >= 8192 && n >= 12288 => (256, 128, 2),
        65.. => (128, 128, 2),
        33.. if k <= 6144 && n <= 6144 => (128, 16, 1),
        33.. if k >= 16384 && n >= 12288 => (256, 64, 2),
        33.. => (128, 64, 2),
        17.. if k <= 12288 && n <= 8192 => (128, 32, 2),
        17.. => (256, 32, 2),
        _ if n >= 26624 => (256, 16, 1),
        _ => (128, 16, 1),
    }
}

/// The bytes of the workspace `machete_mm` allocates (`torch::empty(workspace_size, kU8)`
/// in `run_impl`, machete_mm_launcher.cuh) and frees on return: `GemmUniversal`'s
/// `get_workspace_size` for the cooperative kernel with CUTLASS's stream-K tile scheduler
/// (`TileSchedulerType.StreamK` for every schedule, generate.py), computed on the transposed
/// problem `{N, M, K}` with the tile `(tile_n, tile_m, 64)` (`TileShapeK = 128·8 / 16` for
/// 16-bit activations, machete_mm_kernel.cuh): `PersistentTileSchedulerSm90StreamKParams::
/// get_workspace_component_sizes` (cutlass include/cutlass/gemm/kernel/
/// tile_scheduler_params.h) with Machete's defaults (one split, swizzle 1, the heuristic
/// decomposition, no `hw_info`, so the device's SM count and no occupancy query): output
/// tiles `⌈N/tile_n⌉` (rounded up to the cluster) × `⌈M/tile_m⌉`; CTAs a wave: the SMs with
/// clusters of 1, with clusters of 2 `get_max_cta_occupancy(18, 2, sms)`; stream-K tiles
/// only when the last wave is not full, less than half full and each tile has more than 8
/// k tiles (`get_num_sk_tiles`); then a 128-byte-aligned barrier of 2 warp groups × 32 bits
/// and a reduction buffer of `tile_n × tile_m` f32 per stream-K tile (or per output tile
/// when the heuristic turns to split-K). Data-parallel shapes need none: `torch::empty(0)`
/// takes no block.
pub fn machete_workspace_bytes(m: usize, n: usize, k: usize, sms: usize) -> usize {
    if sms == 0 || m == 0 {
        return 0;
    }
    let (tile_n, tile_m, cluster) = machete_schedule(m, n, k);
    let blocks_n = n.div_ceil(tile_n).div_ceil(cluster) * cluster;
    let blocks_m = m.div_ceil(tile_m);
    let output_tiles = blocks_n * blocks_m;
    let k_tiles = k.div_ceil(64);
    let ctas_per_wave = if cluster == 1 {
        sms
    } else {
        // get_max_cta_occupancy(max_sm_per_gpc = 18, cluster, sms), then whole clusters.
        let per_gpc = 18 - 18 % cluster;
        let gpcs = if sms < 18 { 1 } else { sms / 18 };
        let residual = if sms < 18 { 0 } else { sms % 18 };
        let ctas = (gpcs * per_gpc + residual - residual % cluster).min(sms);
        ctas / cluster * cluster
    };
    let full_waves = output_tiles / ctas_per_wave;
    let total_waves = output_tiles.div_ceil(ctas_per_wave);
    let sk_tiles = if full_waves == total_waves || k_tiles <= 8 {
        0
    } else {
        let tail = output_tiles - full_waves * ctas_per_wave;
        if 2 * tail >= ctas_per_wave {
            0
        } else {
            let dp_waves = full_waves.saturating_sub(1);
            (output_tiles - dp_waves * ctas_per_wave) / cluster * cluster
        }
    };
    let sk_units = ((k_tiles * sk_tiles / 8) / cluster * cluster).min(ctas_per_wave);
    let split_k = sk_units > sk_tiles && sk_tiles != 0 && sk_units.is_multiple_of(sk_tiles);
    let tiles = if split_k { output_tiles } else { sk_tiles };
    let l2 = |b: usize| b.div_ceil(128) * 128;
    let barrier = l2(tiles * 2 * 32 / 8);
    let reduction = l2(tiles * tile_n * tile_m * 4);
    barrier + reduction
}

/// `marlin::determine_reduce_max_m(prob_m, max_par = 16)` (csrc gptq_marlin.cu at 0.6.4).
pub fn reduce_max_m(m: usize) -> usize {
    const TILE_M: usize = 16;
    if m <= 4 * TILE_M {
        m.div_ceil(TILE_M).max(1) * TILE_M
    } else {
        TILE_M * 4 * m.div_ceil(TILE_M * 4).min(MAX_PARALLEL)
    }
}

/// Whether the release (its Marlin `era`) runs this checkpoint with Marlin on a GPU of
/// architecture `arch`, as vramscope models it; the reason when not. Marlin needs compute
/// capability 8.0 (`get_min_capability`, awq_marlin.py L79-81, gptq_marlin.py L78-80).
/// GPTQ goes through `choose_mp_linear_kernel` (0.6.4 kernels/__init__.py L15-74), which
/// tries Machete first: on 9.0 (Hopper) it takes a layer whose group size is 128 or -1 and
/// whose shape tiles ([64, 128], utils/machete_utils.py L7-30); from 0.19 AWQ goes through it
/// too, with zero points, which Machete takes (`query_machete_supported_quant_types(True)`:
/// uint4, uint8; 0.19.0 machete_utils.py L12-16). Machete's prepack is not modelled. From 0.11
/// AllSpark comes before Marlin in the list (0.11.0 kernels/mixed_precision/__init__.py
/// L28-37) but takes uint8b128 only (8-bit), so no 4-bit layer reaches it. `layers` are the
/// `(n, k)` of every quantized linear.
pub fn check_gpu(
    fmt: &Format,
    era: Era,
    arch: &str,
    gpu: &str,
    layers: &[(usize, usize)],
) -> Result<()> {
    if matches!(arch, "Turing" | "Volta" | "Pascal") {
        if fmt.compressed_tensors {
            return Err(Error::Request(format!(
                "a compressed-tensors w4a16 checkpoint on {gpu} ({arch}): vLLM's CompressedTensorsWNA16 needs compute capability 8.0 (get_min_capability, compressed_tensors_wNa16.py L68-71 at 0.11.0); use an Ampere or later preset (a100-80gb, h100-80gb, h200)"
            )));
        }
        return Err(Error::Request(format!(
            "an {} checkpoint on {gpu} ({arch}): vLLM's Marlin kernels need compute capability 8.0 (get_min_capability), below it vLLM runs its {} kernel, which vramscope does not reproduce; use an Ampere or later preset (a100-80gb, h100-80gb, h200)",
            fmt.method.name().to_uppercase(),
            fmt.method.name()
        )));
    }
    // The V1 releases' Machete is modelled (`Kernel::machete`, `MarlinLinear::
    // machete_after_loading`); 0.6.4's choice stays refused.
    let machete_takes_it =
        era == Era::V0_6_4 && fmt.method == Method::Gptq && matches!(arch, "Hopper" | "Blackwell");
    if machete_takes_it && matches!(fmt.group_size, -1 | 128) {
        if let Some((n, k)) = layers
            .iter()
            .find(|(n, k)| k.is_multiple_of(64) && n.is_multiple_of(128))
        {
            let name = match fmt.method {
                _ if fmt.compressed_tensors => "a compressed-tensors w4a16",
                Method::Awq => "an AWQ",
                Method::Gptq => "a GPTQ",
            };
            return Err(Error::Request(format!(
                "{name} checkpoint with group_size {} on {gpu} ({arch}): vLLM 0.6.4 runs its [{n}, {k}] layers with MacheteLinearKernel (choose_mp_linear_kernel tries Machete first on compute capability 9.0), whose 0.6.4 path vramscope does not reproduce; use a V1 release from 0.11 (Machete modelled there) or an Ampere or Ada GPU (Marlin)",
                fmt.group_size,
            )));
        }
    }
    // AllSpark comes before Marlin from 0.11 but takes 8-bit weights only
    // (`ALLSPARK_SUPPORTED_QUANT_TYPES = [scalar_types.uint8b128]`, utils/allspark_utils.py
    // L10 at 0.11.0, 0.15.1 and 0.19.0, checked for compute capability 8.0 to 8.9 at L24-34):
    // every 4-bit layer vramscope reads passes it by for Marlin.
    Ok(())
}

/// From 0.31 vLLM refuses act-order 4-bit checkpoints outright: GPTQ's `desc_act` with
/// groups (`normalize_and_validate_gptq_desc_act`, 0.31.0 utils/gptq_utils.py L23-37: "GPTQ
/// group activation ordering (desc_act=True) is no longer supported") and compressed-tensors'
/// `actorder` "group" or "dynamic" (0.31.0 compressed_tensors.py L330-336); Machete and
/// Marlin lost their `g_idx` paths with it (0.31.0 machete.py, MPLinearKernel.py L14-22).
pub fn check_act_order(fmt: &Format, release: &str) -> Result<()> {
    let minor = release
        .strip_prefix("0.")
        .and_then(|r| r.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    if fmt.desc_act && minor.is_some_and(|m| m >= 31) {
        let what = if fmt.compressed_tensors {
            "a compressed-tensors w4a16 checkpoint with actorder \"group\""
        } else {
            "a GPTQ checkpoint with desc_act true"
        };
        return Err(Error::Request(format!(
            "{what} under --vllm {release}: vLLM 0.31 and later refuse activation ordering (\"no longer supported\", gptq_utils.py normalize_and_validate_gptq_desc_act, compressed_tensors.py L330-336 at 0.31.0); use --vllm 0.29 or earlier, or a checkpoint without act-order"
        )));
    }
    Ok(())
}

/// The releases whose AWQ/GPTQ path vramscope reproduces, with their Marlin generation:
/// 0.6.4 (the default, 380e1863) and the V1 releases from 0.11.
pub fn check_release(release: &str) -> Result<Era> {
    Era::of_release(release).ok_or_else(|| {
        Error::Request(format!(
            "an AWQ or GPTQ checkpoint with --vllm {release}: vramscope reproduces vLLM 0.6.4's Marlin repack and GEMM (awq_marlin.py, kernels/marlin.py) and those of the V1 releases from 0.11; this release's are not checked: use --vllm 0.6.4 or a V1 release from 0.11"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp8::tests::{runtime, trace};

    const AWQ128: Format = Format {
        method: Method::Awq,
        group_size: 128,
        desc_act: false,
        compressed_tensors: false,
    };

    #[test]
    fn awq_packs_columns_in_its_interleaved_order() {
        // Column c of a word in nibble AWQ_NIBBLE[c]: codes 0..7 across eight columns pack
        // as 0x7531_6420 (nibbles 0..7 hold columns 0,2,4,6,1,3,5,7).
        let n = 64;
        let k = 128;
        let fmt = AWQ128;
        // One group a row spanning 0..15 (scale 1, zero 0); from input 2 on, column c holds
        // code c % 8.
        let mut w = vec![0f32; n * k];
        for c in 0..n {
            for i in 0..k {
                w[c * k + i] = match i {
                    0 => 15.0,
                    1 => 0.0,
                    _ => (c % 8) as f32,
                };
            }
        }
        let p = quantize(&fmt, &w, n, k, DType::F16);
        assert_eq!(p.scales[0], 1.0);
        assert_eq!(p.qzeros[0], 0);
        // Row 2 of qweight: codes c % 8 for c in 0..8.
        assert_eq!(p.qweight[2 * (n / PACK)] as u32, 0x7531_6420);
        let mut back = vec![0f32; n * k];
        dequantize_rows(
            &fmt,
            &p.qweight,
            &p.qzeros,
            &p.scales,
            None,
            (n, k),
            (0, n),
            DType::F16,
            &mut back,
        );
        assert_eq!(back, w);
    }

    #[test]
    fn gptq_packs_eight_inputs_a_word_and_subtracts_eight() {
        let (n, k) = (64, 128);
        let fmt = Format {
            method: Method::Gptq,
            group_size: 32,
            desc_act: false,
            compressed_tensors: false,
        };
        // Each group's max |w| is 7.5 · s with s = 2: codes w/2 + 8.
        let w: Vec<f32> = (0..n * k)
            .map(|j| {
                if j % 32 == 0 {
                    15.0
                } else {
                    2.0 * ((j % 15) as f32 - 7.0)
                }
            })
            .collect();
        let p = quantize(&fmt, &w, n, k, DType::F16);
        assert!(p.scales.iter().all(|&s| s == 2.0));
        // Stored zeros: 8 − 1 = 7 in every nibble (AutoGPTQ v1).
        assert!(p.qzeros.iter().all(|&z| z as u32 == 0x7777_7777));
        // g_idx without act-order: i / 32.
        assert_eq!(p.g_idx.as_ref().unwrap()[33], 1);
        let mut back = vec![0f32; n * k];
        dequantize_rows(
            &fmt,
            &p.qweight,
            &p.qzeros,
            &p.scales,
            None,
            (n, k),
            (0, n),
            DType::F16,
            &mut back,
        );
        // 15 is 7.5·2: 7.5 rounds to even (8) → code 16 clamps to 15 → (15 − 8)·2 = 14.
        for (j, (&a, &b)) in back.iter().zip(&w).enumerate() {
            let want = if j % 32 == 0 { 14.0 } else { b };
            assert_eq!(a, want, "{j}");
        }
        // Word 0 of column 0: inputs 0..8 at bits 0, 4, ..., 28.
        let col0: Vec<u32> = (0..8)
            .map(|j| (p.qweight[0] as u32 >> (4 * j)) & 0xF)
            .collect();
        let want: Vec<u32> = (0..8)
            .map(|i| ((w[i] / 2.0).round_ties_even() + 8.0).clamp(0.0, 15.0) as u32)
            .collect();
        assert_eq!(col0, want);
    }

    #[test]
    fn stacking_concatenates_along_the_output() {
        let (k, n0, n1) = (128, 64, 128);
        let w0: Vec<f32> = (0..n0 * k)
            .map(|i| ((i * 7 % 31) as f32 - 15.0) / 64.0)
            .collect();
        let w1: Vec<f32> = (0..n1 * k)
            .map(|i| ((i * 11 % 29) as f32 - 14.0) / 32.0)
            .collect();
        for method in [Method::Awq, Method::Gptq] {
            let fmt = Format {
                method,
                group_size: 64,
                desc_act: false,
                compressed_tensors: false,
            };
            let (p0, p1) = (
                quantize(&fmt, &w0, n0, k, DType::F16),
                quantize(&fmt, &w1, n1, k, DType::F16),
            );
            let deq = |p: &Parts, n| {
                let mut o = vec![0f32; n * k];
                dequantize_rows(
                    &fmt,
                    &p.qweight,
                    &p.qzeros,
                    &p.scales,
                    None,
                    (n, k),
                    (0, n),
                    DType::F16,
                    &mut o,
                );
                o
            };
            let mut want = deq(&p0, n0);
            want.extend(deq(&p1, n1));
            let s = Parts::stack(&fmt, vec![p0, p1], &[n0, n1], k);
            assert_eq!(deq(&s, n0 + n1), want, "{method:?}");
        }
    }

    #[test]
    fn marlin_shape_rules_apply_to_the_stacked_layer_the_layout_to_each_tensor() {
        // A 32-row k_proj is a valid stored tensor; Marlin needs 64-multiples of the stacked
        // qkv_proj's rows and 128-multiples of its inputs.
        assert_eq!(AWQ128.layout_problem(32, 128), None);
        assert_eq!(
            AWQ128.shape_problem(32, 128).unwrap(),
            "its 32 output features are not a multiple of Marlin's min_thread_n 64 (vLLM's verify_marlin_supports_shape refuses it)"
        );
        assert_eq!(AWQ128.shape_problem(96 + 32, 128), None);
        assert_eq!(
            AWQ128.layout_problem(128, 320).unwrap(),
            "quantization_config.group_size 128 does not divide its 320 input features"
        );
        let gptq = Format {
            method: Method::Gptq,
            group_size: -1,
            desc_act: false,
            compressed_tensors: false,
        };
        assert_eq!(gptq.groups(300), 1);
        assert_eq!(
            gptq.layout_problem(64, 300).unwrap(),
            "its [64, 300] weight does not fill int32 words of 8 codes"
        );
        assert!(gptq
            .shape_problem(64, 320)
            .unwrap()
            .contains("min_thread_k 128"));
    }

    #[test]
    fn reduce_buffer_rows_follow_determine_reduce_max_m() {
        let cases = [
            (1, 16),
            (16, 16),
            (17, 32),
            (48, 48),
            (64, 64),
            (65, 128),
            (512, 512),
            (1024, 1024),
            (4096, 1024),
        ];
        for (m, want) in cases {
            assert_eq!(reduce_max_m(m), want, "{m}");
        }
    }

    fn stored(rt: &Runtime, fmt: Format, n: usize, k: usize) -> MarlinLinear {
        MarlinLinear::load(
            rt,
            fmt,
            "l.qkv_proj",
            (n, k),
            None,
            DType::F16,
            Kernel::default(),
        )
        .unwrap()
    }

    #[test]
    fn awq_after_loading_repacks_and_rebuilds_the_zero_points_as_vllm_does() {
        let rt = runtime("dry");
        let (n, k) = (4096, 4096);
        let mut l = stored(&rt, AWQ128, n, k);
        let from = rt.event_count();
        l.after_loading(&rt, DType::F16).unwrap();
        let e = |kind, t: &str, bytes| (kind, format!("l.qkv_proj.{t}"), bytes);
        let (q, g) = ((k * n / 2) as u64, 32u64);
        let zp = g * n as u64 * 4;
        assert_eq!(
            trace(&rt, from),
            vec![
                e("alloc", "workspace", 1024 * 4),
                e("alloc", "repacked", q),
                e("free", "qweight", q),
                e("alloc", "perm_index", 512),
                e("alloc", "marlin_scales", g * n as u64 * 2),
                e("free", "perm_index", 512),
                e("free", "scales", g * n as u64 * 2),
                e("alloc", "zp_unpacked", zp),
                e("alloc", "perm_index", 512),
                e("alloc", "zp_uninterleaved", zp),
                e("free", "perm_index", 512),
                e("free", "zp_unpacked", zp),
                e("alloc", "perm_index", 512),
                e("alloc", "zp_permuted", zp),
                e("free", "perm_index", 512),
                e("alloc", "perm_index", 512),
                e("alloc", "zp_interleaved", zp),
                e("free", "perm_index", 512),
                e("free", "zp_permuted", zp),
                e("alloc", "marlin_zp", zp / 8),
                e("free", "zp_interleaved", zp),
                e("free", "zp_uninterleaved", zp),
                e("free", "qzeros", zp / 8),
            ]
        );
        assert_eq!(l.qweight.shape, vec![256, 8192]);
        assert_eq!(l.weight_bytes(), q + g * n as u64 * 2 + zp / 8 + 4096);
    }

    #[test]
    fn gptq_after_loading_drops_zeros_and_g_idx_without_act_order() {
        let rt = runtime("dry");
        let (n, k) = (4096, 4096);
        let fmt = Format {
            method: Method::Gptq,
            group_size: 128,
            desc_act: false,
            compressed_tensors: false,
        };
        let mut l = stored(&rt, fmt, n, k);
        let from = rt.event_count();
        l.after_loading(&rt, DType::F16).unwrap();
        let e = |kind, t: &str, bytes| (kind, format!("l.qkv_proj.{t}"), bytes);
        let q = (k * n / 2) as u64;
        let s = 32 * n as u64 * 2;
        assert_eq!(
            trace(&rt, from),
            vec![
                e("alloc", "workspace", 4096),
                e("free", "g_idx", 4096 * 4),
                e("free", "qzeros", 32 * 512 * 4),
                e("alloc", "repacked", q),
                e("free", "qweight", q),
                e("alloc", "perm_index", 512),
                e("alloc", "marlin_scales", s),
                e("free", "perm_index", 512),
                e("free", "scales", s),
            ]
        );
        assert_eq!(l.weight_bytes(), q + s + 4096);
    }

    #[test]
    fn gptq_act_order_sorts_g_idx_on_the_device() {
        let rt = runtime("dry");
        let (n, k) = (512, 1024);
        let fmt = Format {
            method: Method::Gptq,
            group_size: 128,
            desc_act: true,
            compressed_tensors: false,
        };
        let mut l = stored(&rt, fmt, n, k);
        let from = rt.event_count();
        l.after_loading(&rt, DType::F16).unwrap();
        let names: Vec<(&str, String)> = trace(&rt, from)
            .into_iter()
            .take(8)
            .map(|(a, t, _)| (a, t.trim_start_matches("l.qkv_proj.").to_string()))
            .collect();
        let want = [
            ("alloc", "workspace"),
            ("alloc", "g_idx_sort_values"),
            ("alloc", "g_idx_argsort"),
            ("free", "g_idx_sort_values"),
            ("alloc", "g_idx_sort_indices"),
            ("free", "g_idx_argsort"),
            ("alloc", "g_idx_sorted"),
            ("free", "g_idx"),
        ];
        assert_eq!(
            names,
            want.iter()
                .map(|(a, t)| (*a, t.to_string()))
                .collect::<Vec<_>>()
        );
        // Kept: repacked codes, scales, the sorted g_idx and its indices, the workspace.
        assert_eq!(
            l.weight_bytes(),
            (k * n / 2) as u64 + 8 * 512 * 2 + 2 * 1024 * 4 + 128 * 4
        );
    }

    #[test]
    fn the_forward_allocates_output_a_tmp_and_the_fp32_reduce_buffer() {
        let rt = runtime("dry");
        let mut l = stored(&rt, AWQ128, 4096, 4096);
        l.after_loading(&rt, DType::F16).unwrap();
        let x = rt
            .tensor("x", Category::Activation, &[2048, 4096], DType::F16)
            .unwrap();
        let from = rt.event_count();
        let out = l
            .forward(&rt, &x, "0.qkv_proj", DType::F16, &[4096])
            .unwrap();
        assert_eq!(out.shape, vec![2048, 4096]);
        assert_eq!(
            trace(&rt, from),
            vec![
                ("alloc", "0.qkv_proj.out".into(), 2 * 2048 * 4096),
                ("alloc", "0.qkv_proj.a_tmp".into(), 2 * 2048 * 4096),
                ("alloc", "0.qkv_proj.c_tmp".into(), 4 * 1024 * 4096),
                ("free", "0.qkv_proj.c_tmp".into(), 4 * 1024 * 4096),
                ("free", "0.qkv_proj.a_tmp".into(), 2 * 2048 * 4096),
            ]
        );
    }

    /// From 0.11 the kernel makes its reduce buffer per SM (an L40S's 142 × 64 rows × 256)
    /// and no `a_tmp` without act-order; 0.19's AWQ is first rewritten into GPTQ's layout,
    /// whose `[k, n/8, 8]` int32 unpackings are freed by the time the repacked layer stands.
    #[test]
    fn v1_releases_allocate_the_refactored_kernels_buffers() {
        let rt = runtime("dry");
        let kernel = Kernel {
            era: Era::Converted,
            sms: 142,
            minor: 19,
            hopper: false,
        };
        let mut l = MarlinLinear::load(
            &rt,
            AWQ128,
            "l.o_proj",
            (4096, 4096),
            None,
            DType::F16,
            kernel,
        )
        .unwrap();
        let from = rt.event_count();
        l.after_loading(&rt, DType::F16).unwrap();
        let t = trace(&rt, from);
        let unpacked = 4096 * 512 * 8 * 4;
        assert!(
            t.contains(&("alloc", "l.o_proj.awq_unpacked".into(), unpacked)),
            "{t:?}"
        );
        assert!(
            t.contains(&("free", "l.o_proj.awq_unpacked".into(), unpacked)),
            "{t:?}"
        );
        // 142 int32, a block of 1024 bytes (the allocator's 512-byte rounding).
        assert!(
            t.contains(&("alloc", "l.o_proj.workspace".into(), 1024)),
            "{t:?}"
        );
        // What stays: the repacked words, the scales, the zero points and the workspace.
        assert_eq!(
            l.weight_bytes(),
            (4096 / 16 * 2 * 4096 * 4 + 32 * 4096 * 2 + 32 * 512 * 4 + 142 * 4) as u64
        );
        let x = rt
            .tensor("x", Category::Activation, &[2048, 4096], DType::F16)
            .unwrap();
        let from = rt.event_count();
        let out = l.forward(&rt, &x, "0.o_proj", DType::F16, &[4096]).unwrap();
        assert_eq!(out.shape, vec![2048, 4096]);
        assert_eq!(
            trace(&rt, from),
            vec![
                ("alloc", "0.o_proj.out".into(), 2 * 2048 * 4096),
                ("alloc", "0.o_proj.c_tmp".into(), 4 * 142 * 64 * 256),
                ("free", "0.o_proj.c_tmp".into(), 4 * 142 * 64 * 256),
            ]
        );
        assert_eq!(Era::of_release("0.11"), Some(Era::Refactored));
        assert_eq!(Era::of_release("0.15"), Some(Era::Refactored));
        assert_eq!(Era::of_release("0.33"), Some(Era::Converted));
        assert_eq!(Era::of_release("0.8"), None);
        assert_eq!(Era::of_release("380e1863"), Some(Era::V0_6_4));
        // Eight rows round up to 16.
        assert_eq!(kernel.c_tmp_len(8), 142 * 16 * 256);
    }

    const GPTQ128: Format = Format {
        method: Method::Gptq,
        group_size: 128,
        desc_act: false,
        compressed_tensors: false,
    };

    const H100: Kernel = Kernel {
        era: Era::Converted,
        sms: 132,
        hopper: true,
        minor: 0,
    };

    /// `choose_mp_linear_kernel` per layer: Machete on Hopper for groups -1, 64 and 128 and
    /// shapes of whole [64, 128] blocks; AWQ only from 0.19 (0.11 and 0.15 repack it for
    /// Marlin in awq_marlin.py); never off Hopper.
    #[test]
    fn machete_takes_hopper_layers_it_can_implement() {
        assert!(H100.machete(&GPTQ128, 6144, 4096));
        assert!(H100.machete(
            &Format {
                group_size: 64,
                ..GPTQ128
            },
            6144,
            4096
        ));
        assert!(H100.machete(
            &Format {
                group_size: -1,
                ..GPTQ128
            },
            6144,
            4096
        ));
        assert!(!H100.machete(
            &Format {
                group_size: 32,
                ..GPTQ128
            },
            6144,
            4096
        ));
        // n not a multiple of 128, k not of 64.
        assert!(!H100.machete(&GPTQ128, 6144 + 64, 4096));
        assert!(!H100.machete(&GPTQ128, 6144, 4096 + 32));
        assert!(H100.machete(&AWQ128, 6144, 4096));
        let v011 = Kernel {
            era: Era::Refactored,
            ..H100
        };
        assert!(v011.machete(&GPTQ128, 6144, 4096));
        assert!(!v011.machete(&AWQ128, 6144, 4096));
        let a100 = Kernel {
            hopper: false,
            sms: 108,
            ..H100
        };
        assert!(!a100.machete(&GPTQ128, 6144, 4096));
        let v064 = Kernel {
            era: Era::V0_6_4,
            ..H100
        };
        assert!(!v064.machete(&GPTQ128, 6144, 4096));
    }

    /// The stream-K workspace: data-parallel shapes take none; Llama-3-8B's gate_up at 8192
    /// tokens on 132 SMs (tile 128 × 256, cluster 2: 224 × 32 = 7168 tiles, 54 full waves of
    /// 132 and a tail of 40, under half a wave, 64 k tiles) covers the last 172 tiles with
    /// stream-K: 172 · 128 · 256 f32 of partials and 172 · 2 · 32 bits of barriers (1,376
    /// bytes, 1,408 aligned to 128).
    #[test]
    fn machete_workspace_follows_cutlass_stream_k() {
        assert_eq!(machete_schedule(8192, 28672, 4096), (128, 256, 2));
        assert_eq!(machete_schedule(8192, 4096, 14336), (128, 128, 2));
        assert_eq!(machete_schedule(48, 4096, 4096), (128, 16, 1));
        assert_eq!(machete_schedule(8, 128256, 4096), (256, 16, 1));
        assert_eq!(machete_workspace_bytes(8192, 6144, 4096, 132), 0);
        assert_eq!(machete_workspace_bytes(8192, 4096, 4096, 132), 0);
        assert_eq!(machete_workspace_bytes(8192, 4096, 14336, 132), 0);
        assert_eq!(
            machete_workspace_bytes(8192, 28672, 4096, 132),
            172 * 128 * 256 * 4 + 1408
        );
        // Few k tiles: never split (4 k tiles ≤ 8).
        assert_eq!(machete_workspace_bytes(8192, 28672, 256, 132), 0);
    }

    /// GPTQ through Machete: the row-major words copied to `[n, k/8]` for the prepack, the
    /// prepacked words (the same bytes) replacing them; scales, zeros and g_idx untouched
    /// and kept; the forward's output alone (a data-parallel shape: no workspace).
    #[test]
    fn machete_prepacks_gptq_and_keeps_the_zeros_and_g_idx() {
        let rt = runtime("dry");
        let mut l = MarlinLinear::load(
            &rt,
            GPTQ128,
            "l.o_proj",
            (4096, 4096),
            None,
            DType::F16,
            H100,
        )
        .unwrap();
        assert!(l.machete);
        let from = rt.event_count();
        l.after_loading(&rt, DType::F16).unwrap();
        let words = 512 * 4096 * 4;
        assert_eq!(
            trace(&rt, from),
            vec![
                ("alloc", "l.o_proj.qweight_t_contiguous".into(), words),
                ("alloc", "l.o_proj.machete_prepacked".into(), words),
                ("free", "l.o_proj.qweight_t_contiguous".into(), words),
                ("free", "l.o_proj.qweight".into(), words),
            ]
        );
        assert_eq!(
            l.weight_bytes(),
            words + 4096 * 4 + 32 * 512 * 4 + 32 * 4096 * 2
        );
        let x = rt
            .tensor("x", Category::Activation, &[8192, 4096], DType::F16)
            .unwrap();
        let from = rt.event_count();
        let out = l.forward(&rt, &x, "0.o_proj", DType::F16, &[4096]).unwrap();
        assert_eq!(out.shape, vec![8192, 4096]);
        assert_eq!(
            trace(&rt, from),
            vec![("alloc", "0.o_proj.out".into(), 2 * 8192 * 4096)]
        );
    }

    /// GPTQ with act-order through Machete: the sort's indices kept (the `permute_cols`
    /// perm), the words unpacked, row-permuted and repacked before the prepack; the stored
    /// g_idx stays. The weight it multiplies equals Marlin's bit for bit, and so does the
    /// CPU forward.
    #[test]
    fn machete_act_order_keeps_the_perm_and_multiplies_marlins_weight() {
        let rt = runtime("compute");
        let (m, n, k) = (5, 128, 256);
        let fmt = Format {
            group_size: 64,
            desc_act: true,
            ..GPTQ128
        };
        let w: Vec<f32> = (0..n * k)
            .map(|j| ((j * 7919) % 31) as f32 / 31.0 - 0.5)
            .collect();
        let p = quantize(&fmt, &w, n, k, DType::F16);
        let load = |kernel| {
            let mut l =
                MarlinLinear::load(&rt, fmt, "l", (n, k), Some(&p), DType::F16, kernel).unwrap();
            let from = rt.event_count();
            l.after_loading(&rt, DType::F16).unwrap();
            (l, trace(&rt, from))
        };
        let (machete, t) = load(Kernel { sms: 4, ..H100 });
        let (marlin, _) = load(Kernel {
            sms: 4,
            hopper: false,
            ..H100
        });
        let kept = |name: &str| {
            t.iter().any(|e| e.0 == "alloc" && e.1 == name)
                && !t.iter().any(|e| e.0 == "free" && e.1 == name)
        };
        assert!(
            kept("l.machete_perm") && kept("l.machete_prepacked"),
            "{t:?}"
        );
        assert!(
            !kept("l.machete_unpacked") && !kept("l.machete_packed"),
            "{t:?}"
        );
        assert_eq!(
            machete.g_idx.as_ref().unwrap().i32(),
            p.g_idx.as_deref().unwrap()
        );
        assert_eq!(
            machete.dequantized(DType::F16),
            marlin.dequantized(DType::F16)
        );
        let mut x = rt
            .tensor("x", Category::Activation, &[m, k], DType::F16)
            .unwrap();
        for (j, v) in x.f32_mut().iter_mut().enumerate() {
            *v = DType::F16.round(((j % 11) as f32 - 5.0) / 8.0);
        }
        let from = rt.event_count();
        let ya = machete.forward(&rt, &x, "a", DType::F16, &[n]).unwrap();
        // permute_cols' [m, k] copy (5 × 256 × 2 bytes), the output (5 × 128 × 2 in a block
        // of 1,536), no workspace (one output tile of 4 k tiles: nothing to split).
        assert_eq!(
            trace(&rt, from),
            vec![
                ("alloc", "a.act_perm".into(), 2560),
                ("alloc", "a.out".into(), 1536),
                ("free", "a.act_perm".into(), 2560),
            ]
        );
        let yb = marlin.forward(&rt, &x, "b", DType::F16, &[n]).unwrap();
        assert_eq!(ya.f32(), yb.f32());
    }

    /// AWQ through Machete (0.19 on): after the conversion to GPTQ's layout, the zero points
    /// end as `[groups, n]` in the activation dtype (`-s·z`); the CPU forward equals the
    /// Marlin layer's within one rounding of the weight.
    #[test]
    fn machete_awq_zero_points_carry_the_scales() {
        let rt = runtime("compute");
        let (m, n, k) = (3, 128, 256);
        let w: Vec<f32> = (0..n * k)
            .map(|j| ((j * 7919) % 23) as f32 / 23.0 - 0.5)
            .collect();
        let p = quantize(&AWQ128, &w, n, k, DType::F16);
        let load = |kernel| {
            let mut l =
                MarlinLinear::load(&rt, AWQ128, "l", (n, k), Some(&p), DType::F16, kernel).unwrap();
            l.after_loading(&rt, DType::F16).unwrap();
            l
        };
        let machete = load(Kernel { sms: 4, ..H100 });
        let marlin = load(Kernel {
            sms: 4,
            hopper: false,
            ..H100
        });
        assert!(machete.machete && !marlin.machete);
        let zp = machete.qzeros.as_ref().unwrap();
        assert_eq!((zp.shape.clone(), zp.dtype), (vec![2, n], DType::F16));
        let (a, b) = (
            machete.dequantized(DType::F16),
            marlin.dequantized(DType::F16),
        );
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / y.abs().max(1e-3))
            .fold(0f32, f32::max);
        assert!(worst <= 2f32.powi(-10), "{worst}");
        let mut x = rt
            .tensor("x", Category::Activation, &[m, k], DType::F16)
            .unwrap();
        for (j, v) in x.f32_mut().iter_mut().enumerate() {
            *v = DType::F16.round(((j % 13) as f32 - 6.0) / 8.0);
        }
        let ya = machete.forward(&rt, &x, "a", DType::F16, &[n]).unwrap();
        let yb = marlin.forward(&rt, &x, "b", DType::F16, &[n]).unwrap();
        let diff: f32 = ya
            .f32()
            .iter()
            .zip(yb.f32())
            .map(|(p, q)| (p - q).powi(2))
            .sum();
        let norm: f32 = yb.f32().iter().map(|q| q * q).sum();
        assert!((diff / norm).sqrt() < 2e-3, "{}", (diff / norm).sqrt());
    }

    #[test]
    fn host_forward_multiplies_the_dequantized_weight() {
        let rt = runtime("compute");
        let (m, n, k) = (3, 128, 256);
        let w: Vec<f32> = (0..n * k)
            .map(|i| DType::F16.round(((i * 37 % 101) as f32 - 50.0) / 256.0))
            .collect();
        let xv: Vec<f32> = (0..m * k)
            .map(|i| DType::F16.round(((i * 53 % 97) as f32 - 48.0) / 16.0))
            .collect();
        for fmt in [
            AWQ128,
            Format {
                method: Method::Gptq,
                group_size: 64,
                desc_act: true,
                compressed_tensors: false,
            },
        ] {
            let p = quantize(&fmt, &w, n, k, DType::F16);
            let mut l = MarlinLinear::load(
                &rt,
                fmt,
                "l.o_proj",
                (n, k),
                Some(&p),
                DType::F16,
                Kernel::default(),
            )
            .unwrap();
            let before = l.dequantized(DType::F16);
            l.after_loading(&rt, DType::F16).unwrap();
            let wq = l.dequantized(DType::F16);
            assert_eq!(before, wq, "{fmt:?}: repacking keeps the weight");
            let x = rt
                .tensor_with_values("x", Category::Activation, &[m, k], DType::F16, xv.clone())
                .unwrap();
            // Two shards of 64 rows: each its own [m, 64] block.
            let out = l.forward(&rt, &x, "o", DType::F16, &[64, 64]).unwrap();
            for (s, r0) in [(0usize, 0usize), (1, 64)] {
                for r in 0..m {
                    for c in 0..64 {
                        let acc: f64 = (0..k)
                            .map(|i| xv[r * k + i] as f64 * wq[(r0 + c) * k + i] as f64)
                            .sum();
                        let got = out.f32()[s * m * 64 + r * 64 + c];
                        assert!(
                            (got - DType::F16.round(acc as f32)).abs()
                                <= 2e-3 * (acc.abs() as f32).max(1.0),
                            "{fmt:?} {r} {c}: {got} vs {acc}"
                        );
                    }
                }
            }
            // And near the 16-bit product: 4-bit codes, within 10 % of the output's scale.
            let exact: Vec<f32> = (0..n)
                .map(|c| (0..k).map(|i| xv[i] * w[c * k + i]).sum())
                .collect();
            let num: f32 = (0..64).map(|c| (out.f32()[c] - exact[c]).powi(2)).sum();
            let den: f32 = (0..64).map(|c| exact[c].powi(2)).sum();
            assert!((num / den).sqrt() < 0.1, "{fmt:?}: {}", (num / den).sqrt());
        }
    }
}

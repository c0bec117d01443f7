//! The kernels of the families beyond Llama's: Gemma's norm `x · (1 + w)`, GeGLU and
//! soft-capping, the scaling Gemma's embedding, Granite's multipliers and DeepSeek's fp16 fix
//! need, the attention softmax with a soft-cap and a sliding window, and multi-head latent
//! attention's GPT-J rotary and key/value assembly. Each does, element for element, what the
//! host kernel of the same op does (src/device/cpu_gemma.rs, src/engine/ops_mla.rs); none
//! allocates.

use super::{blocks, grid, CudaDevice};
use crate::base::error::Result;
use crate::device::tensor::{DType, TensorData};

/// Kernels instantiated for both 16-bit types.
pub(crate) const TYPED: &[&str] = &[
    "gemma_rms_norm",
    "gemma_add_rms_norm",
    "gelu_tanh_mul",
    "gelu_tanh",
    "scale_into",
    "softcap_step",
    "softmax_mods",
    "rope_pairs",
    "rope_table",
    "mla_kv",
    "mla_take_v",
];

/// Kernels on f32 values only.
pub(crate) const UNTYPED: &[&str] = &["scale_into_f32", "softcap_step_f32"];

/// Appended to `kernels::SOURCE` (its `F16`/`BF16`, `block_sum` and `INST` are used).
pub(crate) const SOURCE: &str = r#"
// GemmaRMSNorm: x / rms(x) · (1 + w), the statistics and the product in f32, one row a block.
template <class T> __device__ void gemma_rms_norm(const u16* x, const u16* w, u16* o, int cols, float eps) {
  __shared__ float sh[32];
  long long r = blockIdx.x;
  const u16* xr = x + r * cols;
  float ss = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) { float v = T::ld(xr[j]); ss += v * v; }
  ss = block_sum(ss, sh);
  float inv = rsqrtf(ss / (float)cols + eps);
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    o[r * cols + j] = T::st(T::ld(xr[j]) * inv * (1.f + T::ld(w[j])));
}

// GemmaRMSNorm with a residual: sum = x + r (a new tensor), then the norm of the sum as it is
// stored.
template <class T> __device__ void gemma_add_rms_norm(const u16* x, const u16* res, const u16* w, u16* sum, u16* o, int cols, float eps) {
  __shared__ float sh[32];
  long long r = blockIdx.x;
  float ss = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    long long i = r * cols + j;
    u16 s = T::st(T::ld(x[i]) + T::ld(res[i]));
    sum[i] = s;
    float v = T::ld(s);
    ss += v * v;
  }
  ss = block_sum(ss, sh);
  float inv = rsqrtf(ss / (float)cols + eps);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    long long i = r * cols + j;
    o[i] = T::st(T::ld(sum[i]) * inv * (1.f + T::ld(w[j])));
  }
}

// gelu(gate, approximate="tanh") · up.
template <class T> __device__ void gelu_tanh_mul(const u16* g, const u16* u, u16* o, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float x = T::ld(g[i]);
    float y = 0.5f * x * (1.f + tanhf(0.7978846f * (x + 0.044715f * x * x * x)));
    o[i] = T::st(y * T::ld(u[i]));
  }
}

// gelu(x, approximate="tanh") alone (Phi's gelu_new).
template <class T> __device__ void gelu_tanh(const u16* x, u16* o, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float v = T::ld(x[i]);
    o[i] = T::st(0.5f * v * (1.f + tanhf(0.7978846f * (v + 0.044715f * v * v * v))));
  }
}

// o = x · f (o may be x).
template <class T> __device__ void scale_into(const u16* x, u16* o, float f, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    o[i] = T::st(T::ld(x[i]) * f);
}
extern "C" __global__ void scale_into_f32(const float* x, float* o, float f, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    o[i] = x[i] * f;
}

// One step of the logits' soft-cap: 0 divides by the cap, 1 takes tanh, 2 multiplies by it.
__device__ __forceinline__ float softcap_apply(float v, int step, float cap) {
  return step == 0 ? v / cap : (step == 1 ? tanhf(v) : v * cap);
}
template <class T> __device__ void softcap_step(const u16* x, u16* o, long long n, int step, float cap) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    o[i] = T::st(softcap_apply(T::ld(x[i]), step, cap));
}
extern "C" __global__ void softcap_step_f32(const float* x, float* o, long long n, int step, float cap) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    o[i] = softcap_apply(x[i], step, cap);
}

// The causal softmax of `softmax_causal` with Gemma's changes: scores (already scaled) become
// tanh(s / cap) · cap when cap > 0, and query q sees keys q − window + 1 ..= q only when
// window > 0. Probabilities are written as 16-bit values over the row's first half.
template <class T> __device__ void softmax_mods(float* s, long long ld, int rows, int keys, int q0, float cap, int window) {
  __shared__ float sh[32];
  long long row = (long long)blockIdx.y * rows + blockIdx.x;
  float* x = s + row * ld;
  u16* p = (u16*)x;
  int q = q0 + blockIdx.x;
  int valid = q + 1 < keys ? q + 1 : keys;
  int lo = (window > 0 && q - window + 1 > 0) ? q - window + 1 : 0;
  float m = -3.0e38f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) {
    if (j < lo) continue;
    float v = x[j];
    if (cap > 0.f) { v = tanhf(v / cap) * cap; x[j] = v; }
    m = fmaxf(m, v);
  }
  m = block_max(m, sh);
  float sum = 0.f;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) if (j >= lo) sum += __expf(x[j] - m);
  sum = block_sum(sum, sh);
  float inv = 1.f / sum;
  for (int j0 = 0; j0 < keys; j0 += blockDim.x) {
    int j = j0 + threadIdx.x;
    float v = (j < valid && j >= lo) ? __expf(x[j] - m) * inv : 0.f;
    __syncthreads();
    if (j < keys) p[j] = T::st(v);
  }
}

// DeepSeek's rotary (is_neox_style=False): pairs (2i, 2i + 1) of `heads` slices of each token
// row, slice h starting at h · stride + off; cs holds (cos, sin) of each (token, pair).
template <class T> __device__ void rope_pairs(u16* x, const float* cs, long long row, int heads, int stride, int off, int half, long long tokens) {
  long long n = tokens * heads * half;
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n; j += (long long)gridDim.x * blockDim.x) {
    int i = (int)(j % half);
    long long th = j / half;
    int h = (int)(th % heads);
    long long t = th / heads;
    float c = cs[2 * (t * half + i)], sn = cs[2 * (t * half + i) + 1];
    u16* b = x + t * row + (long long)h * stride + off + 2 * i;
    float a = T::ld(b[0]), bb = T::ld(b[1]);
    b[0] = T::st(a * c - bb * sn);
    b[1] = T::st(bb * c + a * sn);
  }
}

// Rotate-half RoPE from a table: pairs (i, i + rot/2) of the first `rot` dimensions of each
// of `heads` heads of `hd` values in every token row; cs holds (cos, sin) of each (token,
// pair) (Gemma 3's linearly scaled positions, Phi's partial rotary).
template <class T> __device__ void rope_table(u16* x, const float* cs, long long row, int heads, int hd, int rot, long long tokens) {
  int half = rot / 2;
  long long n = tokens * heads * half;
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n; j += (long long)gridDim.x * blockDim.x) {
    int i = (int)(j % half);
    long long th = j / half;
    int h = (int)(th % heads);
    long long t = th / heads;
    float c = cs[2 * (t * half + i)], sn = cs[2 * (t * half + i) + 1];
    u16* b = x + t * row + (long long)h * hd;
    float a = T::ld(b[i]), bb = T::ld(b[i + half]);
    b[i] = T::st(a * c - bb * sn);
    b[i + half] = T::st(bb * c + a * sn);
  }
}

// MLA's prefill keys and values: k = [kv's key part | the shared rope key], v = kv's value
// part padded with zeros to the key's width; kv is [T, heads · (nope + vh)], pe [T, rope].
template <class T> __device__ void mla_kv(const u16* kv, const u16* pe, u16* k, u16* v, long long tokens, int heads, int nope, int rope, int vh) {
  int qk = nope + rope, kvw = nope + vh;
  long long n = tokens * heads * qk;
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n; j += (long long)gridDim.x * blockDim.x) {
    int c = (int)(j % qk);
    long long rh = j / qk;
    long long r = rh / heads;
    const u16* src = kv + rh * kvw;
    k[j] = c < nope ? src[c] : pe[r * rope + (c - nope)];
    v[j] = c < vh ? src[nope + c] : (u16)0;
  }
}

// Each head's first vh values of the attention's [T, heads · qk] output.
template <class T> __device__ void mla_take_v(const u16* full, u16* out, long long tokens, int heads, int qk, int vh) {
  long long n = tokens * heads * vh;
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n; j += (long long)gridDim.x * blockDim.x)
    out[j] = full[(j / vh) * qk + j % vh];
}

INST(gemma_rms_norm, (const u16* x, const u16* w, u16* o, int cols, float eps), (x, w, o, cols, eps))
INST(gemma_add_rms_norm, (const u16* x, const u16* r, const u16* w, u16* s, u16* o, int cols, float eps), (x, r, w, s, o, cols, eps))
INST(gelu_tanh_mul, (const u16* g, const u16* u, u16* o, long long n), (g, u, o, n))
INST(gelu_tanh, (const u16* x, u16* o, long long n), (x, o, n))
INST(scale_into, (const u16* x, u16* o, float f, long long n), (x, o, f, n))
INST(softcap_step, (const u16* x, u16* o, long long n, int step, float cap), (x, o, n, step, cap))
INST(softmax_mods, (float* s, long long ld, int rows, int keys, int q0, float cap, int window), (s, ld, rows, keys, q0, cap, window))
INST(rope_pairs, (u16* x, const float* cs, long long row, int heads, int stride, int off, int half, long long tokens), (x, cs, row, heads, stride, off, half, tokens))
INST(rope_table, (u16* x, const float* cs, long long row, int heads, int hd, int rot, long long tokens), (x, cs, row, heads, hd, rot, tokens))
INST(mla_kv, (const u16* kv, const u16* pe, u16* k, u16* v, long long tokens, int heads, int nope, int rope, int vh), (kv, pe, k, v, tokens, heads, nope, rope, vh))
INST(mla_take_v, (const u16* full, u16* out, long long tokens, int heads, int qk, int vh), (full, out, tokens, heads, qk, vh))
"#;

/// The shapes of one MLA prefill on this rank, as the kernels take them.
#[derive(Clone, Copy, Debug)]
pub struct MlaKvDims {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_head: usize,
}

impl CudaDevice {
    /// GemmaRMSNorm of each row of `w.numel()` values into `out`.
    pub fn gemma_rms_norm(
        &mut self,
        x: &TensorData,
        w: &TensorData,
        eps: f32,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(x)?;
        let cols = w.numel() as i32;
        let rows = (x.numel() / w.numel().max(1)) as u32;
        let (xp, wp, op) = (x.cuda_ptr(), w.cuda_ptr(), out.cuda_ptr());
        let f = self.func("gemma_rms_norm", dt)?;
        self.launch(f, blocks(rows, 256), &[&xp, &wp, &op, &cols, &eps])
    }

    /// `sum = x + residual`, `out = gemma_rms_norm(sum)`.
    pub fn gemma_add_rms_norm(
        &mut self,
        x: &TensorData,
        residual: &TensorData,
        w: &TensorData,
        eps: f32,
        (sum, out): (&mut TensorData, &mut TensorData),
    ) -> Result<()> {
        let dt = self.half(x)?;
        let cols = w.numel() as i32;
        let rows = (x.numel() / w.numel().max(1)) as u32;
        let (xp, rp, wp) = (x.cuda_ptr(), residual.cuda_ptr(), w.cuda_ptr());
        let (sp, op) = (sum.cuda_ptr(), out.cuda_ptr());
        let f = self.func("gemma_add_rms_norm", dt)?;
        self.launch(
            f,
            blocks(rows, 256),
            &[&xp, &rp, &wp, &sp, &op, &cols, &eps],
        )
    }

    /// `out = gelu_tanh(gate) · up`.
    pub fn gelu_tanh_mul(
        &mut self,
        gate: &TensorData,
        up: &TensorData,
        out: &mut TensorData,
    ) -> Result<()> {
        let dt = self.half(gate)?;
        let n = gate.numel() as i64;
        let (gp, up_, op) = (gate.cuda_ptr(), up.cuda_ptr(), out.cuda_ptr());
        let f = self.func("gelu_tanh_mul", dt)?;
        self.launch(f, grid(n as u64), &[&gp, &up_, &op, &n])
    }

    /// `out = gelu_tanh(x)`.
    pub fn gelu_tanh(&mut self, x: &TensorData, out: &mut TensorData) -> Result<()> {
        let dt = self.half(x)?;
        let n = x.numel() as i64;
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        let f = self.func("gelu_tanh", dt)?;
        self.launch(f, grid(n as u64), &[&xp, &op, &n])
    }

    /// `out = x · factor` (16-bit or f32; `out` may be `x`'s own storage through
    /// [`CudaDevice::scale_in_place`]).
    pub fn scale_into(&mut self, x: &TensorData, factor: f32, out: &mut TensorData) -> Result<()> {
        self.scale_ptrs(x, x.cuda_ptr(), out.cuda_ptr(), factor)
    }

    /// `x *= factor` in place.
    pub fn scale_in_place(&mut self, x: &mut TensorData, factor: f32) -> Result<()> {
        let p = x.cuda_ptr();
        self.scale_ptrs(x, p, p, factor)
    }

    fn scale_ptrs(&mut self, x: &TensorData, xp: u64, op: u64, factor: f32) -> Result<()> {
        let n = x.numel() as i64;
        let f = match x.dtype {
            DType::F32 => self.func("scale_into_f32", DType::F32)?,
            _ => self.func("scale_into", self.half(x)?)?,
        };
        self.launch(f, grid(n as u64), &[&xp, &op, &factor, &n])
    }

    /// One step of the logits' soft-cap (`step` 0: `/ cap`, 1: `tanh`, 2: `· cap`) into `out`.
    pub fn softcap_step(
        &mut self,
        x: &TensorData,
        step: i32,
        cap: f32,
        out: &mut TensorData,
    ) -> Result<()> {
        let n = x.numel() as i64;
        let f = match x.dtype {
            DType::F32 => self.func("softcap_step_f32", DType::F32)?,
            _ => self.func("softcap_step", self.half(x)?)?,
        };
        let (xp, op) = (x.cuda_ptr(), out.cuda_ptr());
        self.launch(f, grid(n as u64), &[&xp, &op, &n, &step, &cap])
    }

    /// DeepSeek's rotary in place on `heads` slices of every token row of `x`: slice `h` at
    /// `h · stride + offset`, `cos_sin` the `(cos, sin)` of each token and pair as the host
    /// computes them (staged, not allocated through the framework).
    pub fn rope_pairs(
        &mut self,
        x: &mut TensorData,
        (heads, stride, offset): (usize, usize, usize),
        half: usize,
        cos_sin: &[(f32, f32)],
    ) -> Result<()> {
        let dt = self.half(x)?;
        let row = x.shape.last().copied().unwrap_or(0) as i64;
        let tokens = (x.numel() / (row.max(1) as usize)) as i64;
        if cos_sin.len() as i64 != tokens * half as i64 {
            return Err(self.err(
                "rope_pairs",
                format!(
                    "{} angles for {tokens} tokens of {half} pairs",
                    cos_sin.len()
                ),
            ));
        }
        let bytes: Vec<u8> = cos_sin
            .iter()
            .flat_map(|&(c, s)| c.to_le_bytes().into_iter().chain(s.to_le_bytes()))
            .collect();
        let csp = self.stage(&bytes)?;
        let xp = x.cuda_ptr();
        let (h, st, off, hf) = (heads as i32, stride as i32, offset as i32, half as i32);
        let f = self.func("rope_pairs", dt)?;
        let n = (tokens * heads as i64 * half as i64) as u64;
        self.launch(f, grid(n), &[&xp, &csp, &row, &h, &st, &off, &hf, &tokens])
    }

    /// Rotate-half RoPE of the first `rotary_dim` dimensions of each head of `q` and `k` from
    /// the host's table of `(cos, sin)` per token and pair.
    pub fn rope_table(
        &mut self,
        (q, k): (&mut TensorData, &mut TensorData),
        (heads, kv_heads, head_dim, rotary_dim): (usize, usize, usize, usize),
        cos_sin: &[(f32, f32)],
    ) -> Result<()> {
        let dt = self.half(q)?;
        let half = rotary_dim / 2;
        let tokens = cos_sin.len() / half.max(1);
        let bytes: Vec<u8> = cos_sin
            .iter()
            .flat_map(|&(c, s)| c.to_le_bytes().into_iter().chain(s.to_le_bytes()))
            .collect();
        let csp = self.stage(&bytes)?;
        let (hd, rot, t) = (head_dim as i32, rotary_dim as i32, tokens as i64);
        for (x, h) in [(&*q, heads), (&*k, kv_heads)] {
            let row = (h * head_dim) as i64;
            let (xp, h32) = (x.cuda_ptr(), h as i32);
            let f = self.func("rope_table", dt)?;
            let n = (tokens * h * half) as u64;
            self.launch(f, grid(n), &[&xp, &csp, &row, &h32, &hd, &rot, &t])?;
        }
        Ok(())
    }

    /// MLA's prefill keys and values from `kv` (`[T, heads · (nope + v_head)]`) and the
    /// shared rope key `k_pe` (`[T, rope]`) into `k` and `v` (`[T, heads · (nope + rope)]`).
    pub fn mla_kv(
        &mut self,
        kv: &TensorData,
        k_pe: &TensorData,
        (k, v): (&mut TensorData, &mut TensorData),
        d: MlaKvDims,
    ) -> Result<()> {
        let dt = self.half(kv)?;
        let tokens = (kv.numel() / (d.heads * (d.nope + d.v_head)).max(1)) as i64;
        let (kvp, pp, kp, vp) = (kv.cuda_ptr(), k_pe.cuda_ptr(), k.cuda_ptr(), v.cuda_ptr());
        let (h, nope, rope, vh) = (
            d.heads as i32,
            d.nope as i32,
            d.rope as i32,
            d.v_head as i32,
        );
        let f = self.func("mla_kv", dt)?;
        let n = tokens as u64 * (d.heads * (d.nope + d.rope)) as u64;
        self.launch(
            f,
            grid(n),
            &[&kvp, &pp, &kp, &vp, &tokens, &h, &nope, &rope, &vh],
        )
    }

    /// Each head's first `v_head` values of `full` (`[T, heads · qk]`) into `out`.
    pub fn mla_take_v(
        &mut self,
        full: &TensorData,
        out: &mut TensorData,
        (heads, qk, v_head): (usize, usize, usize),
    ) -> Result<()> {
        let dt = self.half(full)?;
        let tokens = (full.numel() / (heads * qk).max(1)) as i64;
        let (fp, op) = (full.cuda_ptr(), out.cuda_ptr());
        let (h, q, vh) = (heads as i32, qk as i32, v_head as i32);
        let f = self.func("mla_take_v", dt)?;
        let n = tokens as u64 * (heads * v_head) as u64;
        self.launch(f, grid(n), &[&fp, &op, &tokens, &h, &q, &vh])
    }
}

//! Gemma's host kernels (compute mode): GemmaRMSNorm's `x · (1 + w)` in f32, the tanh-approximated
//! GeGLU, and tanh soft-capping. Plain loops: a Gemma pass spends its time in the GEMMs.

/// `x / rms(x) · (1 + w)` per row of `w.len()` values (vLLM's `GemmaRMSNorm.forward_static`,
/// layernorm.py L162-182 at 0.6.4: the `1 + w` and the product in f32, one cast at the end).
pub fn gemma_rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    if cols == 0 {
        return;
    }
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &wi) in o.iter_mut().zip(row).zip(w) {
            *o = v * inv * (1.0 + wi);
        }
    }
}

/// `sum = x + residual`, then `out = gemma_rms_norm(sum)`: GemmaRMSNorm with a residual,
/// which returns both as new tensors.
pub fn gemma_add_rms_norm(
    x: &[f32],
    residual: &[f32],
    w: &[f32],
    eps: f32,
    sum: &mut [f32],
    out: &mut [f32],
) {
    for ((s, a), b) in sum.iter_mut().zip(x).zip(residual) {
        *s = a + b;
    }
    gemma_rms_norm(sum, w, eps, out);
}

/// PyTorch's `gelu(x, approximate="tanh")`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // √(2/π)
    0.5 * x * (1.0 + (K * (x + 0.044_715 * x * x * x)).tanh())
}

/// `out = gelu_tanh(gate) · up` (vLLM's `GeluAndMul(approximate="tanh")`).
pub fn gelu_tanh_mul_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
}

/// `tanh(x / cap) · cap`, element by element, into `out`.
pub fn soft_cap(x: &[f32], cap: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v / cap).tanh() * cap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma_norm_scales_by_one_plus_the_weight() {
        // Row [3, 4]: mean square 12.5, so x / √12.5 = [0.8485, 1.1314]; weights 0 and 0.5
        // scale by 1 and 1.5.
        let mut out = [0.0; 2];
        gemma_rms_norm(&[3.0, 4.0], &[0.0, 0.5], 0.0, &mut out);
        let r = 12.5f32.sqrt();
        assert_eq!(out, [3.0 / r, 4.0 / r * 1.5]);
        let (mut sum, mut out) = ([0.0; 2], [0.0; 2]);
        gemma_add_rms_norm(
            &[1.0, 1.0],
            &[2.0, 3.0],
            &[0.0, 0.5],
            0.0,
            &mut sum,
            &mut out,
        );
        assert_eq!(sum, [3.0, 4.0]);
        assert_eq!(out, [3.0 / r, 4.0 / r * 1.5]);
    }

    #[test]
    fn gelu_tanh_matches_hand_computed_values() {
        // gelu_tanh(1) = 0.5·(1 + tanh(0.7978846·1.044715)) = 0.8411920; gelu_tanh(-1) = -0.1588080;
        // torch.nn.functional.gelu(torch.tensor([1., -1., 3.]), approximate="tanh") gives
        // [0.8411920, -0.1588080, 2.9963627].
        for (x, want) in [
            (1.0, 0.841_192),
            (-1.0, -0.158_808),
            (3.0, 2.996_362_7),
            (0.0, 0.0),
        ] {
            assert!(
                (gelu_tanh(x) - want).abs() < 1e-6,
                "gelu_tanh({x}) = {}",
                gelu_tanh(x)
            );
        }
        let mut out = [0.0; 2];
        gelu_tanh_mul_into(&[1.0, -1.0], &[2.0, 3.0], &mut out);
        assert!((out[0] - 1.682_384).abs() < 1e-6 && (out[1] + 0.476_424).abs() < 1e-6);
    }

    #[test]
    fn soft_cap_is_tanh_scaled_to_the_cap() {
        // 30·tanh(60/30) = 30·0.9640276 = 28.920828; small values pass almost unchanged.
        let mut out = [0.0; 3];
        soft_cap(&[60.0, -0.3, 0.0], 30.0, &mut out);
        assert!((out[0] - 28.920_828).abs() < 1e-4, "{}", out[0]);
        assert!((out[1] + 0.299_990).abs() < 1e-6, "{}", out[1]);
        assert_eq!(out[2], 0.0);
    }
}

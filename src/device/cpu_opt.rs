//! Host kernels of the OPT forward (compute mode): LayerNorm with bias, ReLU, elementwise add.

/// `nn.LayerNorm(cols)` over each row: `(x − mean) / sqrt(var + eps) · w + b`, the variance
/// biased (divided by `cols`), as PyTorch computes it.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    for (row, o) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let mean = row.iter().sum::<f32>() / cols as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cols as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, v), w), b) in o.iter_mut().zip(row).zip(w).zip(b) {
            *o = (v - mean) * inv * w + b;
        }
    }
}

/// `nn.ReLU()` out of place.
pub fn relu(x: &[f32], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = v.max(0.0);
    }
}

/// `out = a + b`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_centres_scales_and_shifts() {
        let x = [1.0, 2.0, 3.0, 4.0, -1.0, -1.0, -1.0, -1.0];
        let mut out = [0.0; 8];
        layer_norm(
            &x,
            &[1.0, 1.0, 2.0, 2.0],
            &[0.0, 0.5, 0.0, 0.0],
            0.0,
            &mut out,
        );
        // mean 2.5, var 1.25
        let s = 1.0 / 1.25f32.sqrt();
        assert!((out[0] + 1.5 * s).abs() < 1e-6);
        assert!((out[1] - (-0.5 * s + 0.5)).abs() < 1e-6);
        assert!((out[3] - 2.0 * 1.5 * s).abs() < 1e-6);
        // a constant row normalizes to the bias (eps keeps it finite)
        let mut out2 = [0.0; 4];
        layer_norm(&x[4..], &[1.0; 4], &[0.25; 4], 1e-5, &mut out2);
        assert_eq!(out2, [0.25; 4]);
    }

    #[test]
    fn relu_and_add() {
        let mut o = [0.0; 3];
        relu(&[-1.0, 0.0, 2.5], &mut o);
        assert_eq!(o, [0.0, 0.0, 2.5]);
        add(&[1.0, 2.0, 3.0], &[0.5, -2.0, 1.0], &mut o);
        assert_eq!(o, [1.5, 0.0, 4.0]);
    }
}

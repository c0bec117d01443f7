//! CPU kernels of LLaVA-NeXT's feature and merge steps (`engine::ops_llava`): the feature
//! layers' concatenation along the width and one image's `spatial_unpad` merge. fp32, as the
//! other CPU kernels.

/// `torch.cat(hs_pool, dim=-1)`: `parts` each `[rows, d]`, written as `[rows, d · parts]`.
pub fn cat_cols(parts: &[&[f32]], (rows, d): (usize, usize), out: &mut [f32]) {
    let k = parts.len();
    for r in 0..rows {
        for (j, p) in parts.iter().enumerate() {
            out[(r * k + j) * d..(r * k + j + 1) * d].copy_from_slice(&p[r * d..(r + 1) * d]);
        }
    }
}

/// `other.view(rows, cols, g, g, h).permute(4, 0, 2, 1, 3).contiguous()`: the tiles
/// `[rows · cols, g², h]` as `[h, rows · g, cols · g]`.
pub fn tiles_to_planes(
    tiles: &[f32],
    (rows, cols, g, h): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    let (hh, ww) = (rows * g, cols * g);
    for (i, v) in tiles.iter().enumerate() {
        let c = i % h;
        let p = (i / h) % (g * g);
        let t = i / (h * g * g);
        let (y, x) = (t / cols * g + p / g, t % cols * g + p % g);
        out[(c * hh + y) * ww + x] = *v;
    }
}

/// `unpad_image`'s window `[top .. top + ch, left .. left + cw]` of the planes `[h, hh, ww]`,
/// each row closed by `newline[c]` (`torch.cat((x, newline.expand(...)), dim=-1)`): `[h, ch,
/// cw + 1]`.
pub fn unpad_with_newline(
    planes: &[f32],
    newline: &[f32],
    (h, hh, ww): (usize, usize, usize),
    (top, left, ch, cw): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    for c in 0..h {
        for y in 0..ch {
            let row = &planes[(c * hh + top + y) * ww + left..][..cw];
            let o = &mut out[(c * ch + y) * (cw + 1)..][..cw + 1];
            o[..cw].copy_from_slice(row);
            o[cw] = newline[c];
        }
    }
}

/// `torch.cat((base, x.flatten(1, 2).transpose(0, 1)))`: `base [b, h]` then the `[h, n]`
/// planes read as `[n, h]`.
pub fn base_then_transposed(base: &[f32], planes: &[f32], (n, h): (usize, usize), out: &mut [f32]) {
    out[..base.len()].copy_from_slice(base);
    let rest = &mut out[base.len()..];
    for t in 0..n {
        for c in 0..h {
            rest[t * h + c] = planes[c * n + t];
        }
    }
}

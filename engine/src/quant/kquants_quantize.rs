//! Quantization to Q4_K, Q5_K and Q6_K, following the approach of llama.cpp's reference
//! quantizers (`quantize_row_q{4,5,6}_K_ref`): per sub-block a weighted least-squares search for
//! scale (and min), then the sub-block scales quantized to 6 (Q4_K/Q5_K) or 8 (Q6_K) bits against
//! one f16 super-scale, and finally the codes recomputed against the stored scales.
//!
//! gguf-py has no quantizer for these types, so bytes are not compared against a reference;
//! the tests check the round-trip error and that gguf-py decodes the bytes to the same values.

use super::QK_K;
use super::kquants::scale_min_k4;
use super::simd::{blocks_out, f16_to_f32, f32_to_f16, nearest_int};

/// Below this magnitude a group is treated as all zeros (ggml `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// Parameters of the scale search of [`make_qkx2`].
struct SearchParams {
    /// Largest code (15 or 31).
    nmax: u8,
    /// First trial offset added to `nmax`.
    rmin: f32,
    /// Step between trials.
    rdelta: f32,
    /// Number of trials after the first.
    nstep: i32,
}

/// Asymmetric fit of `x` to `scale * L - min` with `L` in `0..=nmax`, minimizing the
/// `w`-weighted squared error over a few trial scales. Writes the codes to `l`, returns
/// `(scale, min)` with `min >= 0` (the value subtracted).
fn make_qkx2(x: &[f32; 32], w: &[f32; 32], l: &mut [u8; 32], p: &SearchParams) -> (f32, f32) {
    let nmax = p.nmax as f32;
    let mut min = x.iter().fold(x[0], |a, &v| a.min(v));
    let max = x.iter().fold(x[0], |a, &v| a.max(v));
    let sum_w: f32 = w.iter().sum();
    let sum_x: f32 = x.iter().zip(w).map(|(v, wi)| v * wi).sum();
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        *l = [0; 32];
        return (0.0, -min);
    }
    let code =
        |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, p.nmax as i32);
    let mut iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..32 {
        let li = code(iscale, x[i], min);
        l[i] = li as u8;
        let diff = scale * li as f32 + min - x[i];
        best_error += w[i] * diff * diff;
    }
    let mut laux = [0u8; 32];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..32 {
            let li = code(iscale, x[i], min);
            laux[i] = li as u8;
            let lf = li as f32;
            sum_l += w[i] * lf;
            sum_l2 += w[i] * lf * lf;
            sum_xl += w[i] * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det <= 0.0 {
            continue;
        }
        let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if this_min > 0.0 {
            this_min = 0.0;
            this_scale = sum_xl / sum_l2;
        }
        let mut cur_error = 0f32;
        for i in 0..32 {
            let diff = this_scale * laux[i] as f32 + this_min - x[i];
            cur_error += w[i] * diff * diff;
        }
        if cur_error < best_error {
            *l = laux;
            best_error = cur_error;
            scale = this_scale;
            min = this_min;
        }
    }
    (scale, -min)
}

/// Symmetric fit of 16 values to `scale * (L - 32)`, `L - 32` in `-32..=31`, weights `x^2`
/// (ggml `make_qx_quants` with `rmse_type = 1`). Returns the scale (0 for an all-zero group).
fn make_qx(x: &[f32; 16]) -> f32 {
    const NMAX: f32 = 32.0;
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let fit = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-32, 31) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let (sumlx, suml2) = fit(-NMAX / max);
    let mut scale = if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let (sumlx, suml2) = fit(-(NMAX + 0.1 * is as f32) / max);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Packs 8 6-bit scales and mins as ggml's Q4_K/Q5_K `scales[12]`.
fn pack_scales(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    s[..4].copy_from_slice(&ls[..4]);
    s[4..8].copy_from_slice(&lm[..4]);
    for j in 4..8 {
        s[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
        s[j - 4] |= (ls[j] >> 4) << 6;
        s[j] |= (lm[j] >> 4) << 6;
    }
    s
}

/// The shared Q4_K/Q5_K scale search for one super-block: returns the codes (`0..=nmax`),
/// `d`, `dmin` (f16 bits) and the packed scales.
fn quantize_qk_block(x: &[f32; QK_K], p: &SearchParams) -> ([u8; QK_K], u16, u16, [u8; 12]) {
    let mut codes = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let mut xs = [0f32; 32];
        xs.copy_from_slice(&x[32 * j..32 * j + 32]);
        let av_x = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        let w = xs.map(|v| av_x + v.abs());
        let mut l = [0u8; 32];
        let (s, m) = make_qkx2(&xs, &w, &mut l, p);
        codes[32 * j..32 * j + 32].copy_from_slice(&l);
        scales[j] = s;
        mins[j] = m;
        max_scale = max_scale.max(s);
        max_min = max_min.max(m);
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls = scales.map(|s| nearest_int(inv_scale * s).clamp(0, 63) as u8);
    let lm = mins.map(|m| nearest_int(inv_min * m).clamp(0, 63) as u8);
    let packed = pack_scales(&ls, &lm);
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    let (df, dminf) = (f16_to_f32(d), f16_to_f32(dmin));
    let (sc, mn) = scale_min_k4(&packed);
    for j in 0..8 {
        let dj = df * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dminf * mn[j] as f32;
        for i in 32 * j..32 * j + 32 {
            codes[i] = nearest_int((x[i] + dm) / dj).clamp(0, p.nmax as i32) as u8;
        }
    }
    (codes, d, dmin, packed)
}

pub(super) fn quant_q4_k(src: &[f32]) -> Vec<u8> {
    let params = SearchParams {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
    };
    let mut out = vec![0u8; src.len() / QK_K * 144];
    for (x, b) in blocks_out::<QK_K, 144>(src, &mut out) {
        let (codes, d, dmin, packed) = quantize_qk_block(x, &params);
        b[0..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&dmin.to_le_bytes());
        b[4..16].copy_from_slice(&packed);
        for c in 0..4 {
            for l in 0..32 {
                b[16 + 32 * c + l] = codes[64 * c + l] | (codes[64 * c + 32 + l] << 4);
            }
        }
    }
    out
}

pub(super) fn quant_q5_k(src: &[f32]) -> Vec<u8> {
    let params = SearchParams {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
    };
    let mut out = vec![0u8; src.len() / QK_K * 176];
    for (x, b) in blocks_out::<QK_K, 176>(src, &mut out) {
        let (codes, d, dmin, packed) = quantize_qk_block(x, &params);
        b[0..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&dmin.to_le_bytes());
        b[4..16].copy_from_slice(&packed);
        for c in 0..4 {
            for l in 0..32 {
                let (q1, q2) = (codes[64 * c + l], codes[64 * c + 32 + l]);
                b[48 + 32 * c + l] = (q1 & 0x0f) | ((q2 & 0x0f) << 4);
                b[16 + l] |= ((q1 >> 4) << (2 * c)) | ((q2 >> 4) << (2 * c + 1));
            }
        }
    }
    out
}

pub(super) fn quant_q6_k(src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / QK_K * 210];
    for (x, b) in blocks_out::<QK_K, 210>(src, &mut out) {
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for (ib, s) in scales.iter_mut().enumerate() {
            let mut xs = [0f32; 16];
            xs.copy_from_slice(&x[16 * ib..16 * ib + 16]);
            *s = make_qx(&xs);
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = *s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            // All (near) zero: an all-zero block, as ggml writes it (decodes to zeros).
            continue;
        }
        let iscale = -128.0 / max_scale;
        let d = f32_to_f16(1.0 / iscale);
        let df = f16_to_f32(d);
        let mut codes = [32u8; QK_K];
        for (ib, s) in scales.iter().enumerate() {
            let ls = nearest_int(iscale * s).clamp(-128, 127) as i8;
            b[192 + ib] = ls as u8;
            let dj = df * ls as f32;
            if dj == 0.0 {
                continue;
            }
            for i in 16 * ib..16 * ib + 16 {
                codes[i] = (nearest_int(x[i] / dj).clamp(-32, 31) + 32) as u8;
            }
        }
        b[208..210].copy_from_slice(&d.to_le_bytes());
        for j in 0..2 {
            for l in 0..32 {
                let q = [0, 32, 64, 96].map(|o| codes[128 * j + l + o]);
                b[64 * j + l] = (q[0] & 0x0f) | ((q[2] & 0x0f) << 4);
                b[64 * j + l + 32] = (q[1] & 0x0f) | ((q[3] & 0x0f) << 4);
                b[128 + 32 * j + l] =
                    (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
    }
    out
}

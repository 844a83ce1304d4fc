//! FP8 (e4m3) and NVFP4 (e2m1) weights: the element codes, memra's row-block layouts of the
//! two checkpoint formats, and the activation quantization an FP8 x FP8 product uses.
//!
//! Element codes (bit-level, no lookup of another library):
//! - e4m3 (`float8_e4m3fn`): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
//!   subnormal (`m * 2^-9`); `0x7f` / `0xff` are NaN; no infinities; largest finite 448.
//! - e2m1 (NVFP4 elements): sign, 2 exponent bits (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5, 2,
//!   3, 4, 6 and their negatives.
//!
//! Row-block layouts (what [`super::DType::FP8`] and [`super::DType::NVFP4`] hold; built from a
//! checkpoint's tensors at load, `formats/safetensors/quantized.rs`):
//! - FP8 (36 B per 32 elements of a row): the block's f32 scale (little-endian), 32 e4m3 codes.
//!   Value `fl32(e4m3(q) * scale)`. An HF `fp8` checkpoint's 128 x 128 `weight_scale_inv` block
//!   `[n / 128, k / 128]` becomes the scale of the four 32-element blocks of row `n` it covers:
//!   the same values, in a layout the row-wise reference and `dot_row` read.
//! - NVFP4 (12 B per 16 elements): the block's f32 scale, 8 bytes of e2m1 pairs (element `2i`
//!   in the low nibble of byte `i`, `2i + 1` in the high one). Value `fl32(e2m1(q) * scale)`;
//!   from a ModelOpt checkpoint the scale is `fl32(e4m3(weight_scale) * weight_scale_2)`.
//!
//! Both products (`fl32` = one rounding to f32, round-to-nearest-even) are exactly what the
//! codecs below compute, so the dequantized weights, and through `dot_f32`'s fixed order every
//! CPU product, are defined bit for bit.

use super::simd::{blocks, blocks_out};

/// Elements per FP8 row block.
pub const FP8_BLOCK: usize = 32;
/// Bytes per FP8 row block.
pub const FP8_BLOCK_BYTES: usize = 4 + FP8_BLOCK;
/// Elements per NVFP4 block (ModelOpt's group size).
pub const NVFP4_BLOCK: usize = 16;
/// Bytes per NVFP4 block.
pub const NVFP4_BLOCK_BYTES: usize = 4 + NVFP4_BLOCK / 2;
/// Largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;
/// Largest e2m1 value.
pub const E2M1_MAX: f32 = 6.0;
/// Columns per activation group of the FP8 x FP8 product ([`quantize_act_fp8`]).
pub const ACT_GROUP: usize = 128;

/// The value of an e4m3 (`float8_e4m3fn`) code.
pub const fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0x0f) as i32;
    let m = (b & 0x07) as f32;
    if e == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m * (1.0 / 512.0)
    } else {
        // (1 + m/8) * 2^(e - 7), every step exact in f32.
        let mut p = 1.0f32;
        let mut i = 0;
        while i < e {
            p *= 2.0;
            i += 1;
        }
        (8.0 + m) * p * (1.0 / 1024.0)
    };
    sign * mag
}

/// The value of an e2m1 code (the low 4 bits of `b`).
pub const fn e2m1_to_f32(b: u8) -> f32 {
    const V: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let v = V[(b & 7) as usize];
    if b & 8 != 0 { -v } else { v }
}

const fn e4m3_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_to_f32(i as u8);
        i += 1;
    }
    t
}

/// Every e4m3 code's value.
pub static E4M3: [f32; 256] = e4m3_table();

/// The nearest code among `n` positive codes whose values `value(c)` increase with `c`, ties to
/// the even code (the even mantissa); `a` is finite and `>= 0`, above the last code saturates.
fn nearest_code(a: f32, n: u8, value: impl Fn(u8) -> f32) -> u8 {
    let (mut lo, mut hi) = (0u8, n - 1);
    if a >= value(hi) {
        return hi;
    }
    // Invariant: value(lo) <= a < value(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if value(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (dl, dh) = (a - value(lo), value(hi) - a);
    if dl < dh || (dl == dh && lo.is_multiple_of(2)) {
        lo
    } else {
        hi
    }
}

/// `x` rounded to e4m3: nearest, ties to even, saturating to +-448 (finite overflow), NaN to
/// `0x7f`. The sign of zero is kept. Bit arithmetic; [`f32_to_e4m3_search`] is the same
/// function written as a search over the codes (the tests hold them equal).
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let s = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return s | 0x7e;
    }
    if a < 1.0 / 64.0 {
        // Subnormal codes m * 2^-9 (the scaling is exact); 8 is the smallest normal's code.
        return s | (a * 512.0).round_ties_even() as u8;
    }
    let b = a.to_bits();
    let exp = (b >> 23) as i32 - 127; // -6 ..= 8
    let (keep, rest) = ((b >> 20) & 7, b & 0xf_ffff);
    let up = rest > 0x8_0000 || (rest == 0x8_0000 && keep & 1 == 1);
    // A carry out of the mantissa moves to the next exponent, as the code's order does.
    let code = (((exp + 7) as u32) << 3) + keep + u32::from(up);
    s | code.min(0x7e) as u8
}

/// [`f32_to_e4m3`] as the nearest of the finite codes (ties to the even code), by search.
pub fn f32_to_e4m3_search(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let s = if x.is_sign_negative() { 0x80 } else { 0 };
    // Codes 0..=0x7e are the finite non-negative values in increasing order.
    s | nearest_code(x.abs().min(f32::MAX), 0x7f, |c| E4M3[c as usize])
}

/// `x` rounded to e2m1: nearest, ties to even, saturating to +-6; NaN to 0.
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let s = if x.is_sign_negative() { 8 } else { 0 };
    s | nearest_code(x.abs().min(f32::MAX), 8, e2m1_to_f32)
}

#[inline(always)]
pub(super) fn dequant_fp8(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<FP8_BLOCK_BYTES, FP8_BLOCK>(src, dst) {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for j in 0..FP8_BLOCK {
            out[j] = E4M3[b[4 + j] as usize] * d;
        }
    }
}

#[inline(always)]
pub(super) fn dequant_nvfp4(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<NVFP4_BLOCK_BYTES, NVFP4_BLOCK>(src, dst) {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for i in 0..NVFP4_BLOCK / 2 {
            let q = b[4 + i];
            out[2 * i] = e2m1_to_f32(q) * d;
            out[2 * i + 1] = e2m1_to_f32(q >> 4) * d;
        }
    }
}

/// The scale that maps a group's largest magnitude `amax` onto `max`: `amax / max`, or 1 for an
/// all-zero (or non-finite) group so that its codes are zeros.
pub fn group_scale(amax: f32, max: f32) -> f32 {
    let s = amax / max;
    if s > 0.0 && s.is_finite() { s } else { 1.0 }
}

fn amax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Quantizes to [`super::DType::FP8`] row blocks: per 32 values, scale `amax / 448`, codes
/// `e4m3(x / scale)`.
pub(super) fn quant_fp8(src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / FP8_BLOCK * FP8_BLOCK_BYTES];
    for (v, o) in blocks_out::<FP8_BLOCK, FP8_BLOCK_BYTES>(src, &mut out) {
        let d = group_scale(amax(v), E4M3_MAX);
        o[..4].copy_from_slice(&d.to_le_bytes());
        for j in 0..FP8_BLOCK {
            o[4 + j] = f32_to_e4m3(v[j] / d);
        }
    }
    out
}

/// Quantizes to [`super::DType::NVFP4`] blocks with a global scale `g`: per 16 values the block
/// scale `e4m3(amax / 6 / g)` (the ModelOpt recipe), the stored scale `e4m3 value * g`, codes
/// `e2m1(x / stored)`.
pub fn quant_nvfp4_with(src: &[f32], g: f32) -> (Vec<u8>, Vec<u8>) {
    let n = src.len() / NVFP4_BLOCK;
    let (mut out, mut codes) = (vec![0u8; n * NVFP4_BLOCK_BYTES], Vec::with_capacity(n));
    for (v, o) in blocks_out::<NVFP4_BLOCK, NVFP4_BLOCK_BYTES>(src, &mut out) {
        let sc = f32_to_e4m3(amax(v) / E2M1_MAX / g);
        codes.push(sc);
        let d = E4M3[sc as usize] * g;
        o[..4].copy_from_slice(&d.to_le_bytes());
        for i in 0..NVFP4_BLOCK / 2 {
            let q = |x: f32| if d > 0.0 { f32_to_e2m1(x / d) } else { 0 };
            o[4 + i] = q(v[2 * i]) | (q(v[2 * i + 1]) << 4);
        }
    }
    (out, codes)
}

/// The ModelOpt global scale of values whose largest magnitude is `amax`: `amax / (6 * 448)`.
pub fn nvfp4_global_scale(amax: f32) -> f32 {
    group_scale(amax, E2M1_MAX * E4M3_MAX)
}

/// Quantizes to [`super::DType::NVFP4`] blocks, the global scale taken from `src` itself.
pub(super) fn quant_nvfp4(src: &[f32]) -> Vec<u8> {
    quant_nvfp4_with(src, nvfp4_global_scale(amax(src))).0
}

/// One activation row quantized for an FP8 x FP8 product: per group of [`ACT_GROUP`] columns
/// (the last group may be shorter), `scale = amax / 448` (f32 division; 1 for an all-zero
/// group) and `code = e4m3(x / scale)` (f32 division, nearest-even, saturating). A kernel that
/// quantizes its activations must produce these codes and scales bit for bit
/// (`memra-verify kernels` compares them exactly).
pub fn quantize_act_fp8(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len().div_ceil(ACT_GROUP));
    for g in x.chunks(ACT_GROUP) {
        let s = group_scale(amax(g), E4M3_MAX);
        scales.push(s);
        codes.extend(g.iter().map(|v| f32_to_e4m3(v / s)));
    }
    (codes, scales)
}

/// The FP8 x FP8 product of one weight row (dequantized FP8 values `w`, a whole row of
/// [`super::DType::FP8`] given as codes and per-32 scales) with an activation row quantized by
/// [`quantize_act_fp8`], as the tensor-core kernels define it: per 32-column weight block `b`
/// (in column order), `p_b = sum_j e4m3(wq_j) * e4m3(xq_j)` in f64 (exact: each product has 8
/// significant bits and the 32 of them fit f64's range exactly), then
/// `acc += p_b * w_scale_b * x_scale_group(b)` in f64, rounded to f32 once at the end. This is
/// the reference an FP8 x FP8 kernel is held to within a tolerance (its own accumulation is
/// not f64); docs/VERIFY.md states its distance from the f32-activation product.
pub fn dot_fp8_act_reference(w_codes: &[u8], w_scales: &[f32], x: &[f32]) -> f32 {
    let (xq, xs) = quantize_act_fp8(x);
    let mut acc = 0f64;
    for (b, ws) in w_scales.iter().enumerate() {
        let r = b * FP8_BLOCK..((b + 1) * FP8_BLOCK).min(x.len());
        let mut p = 0f64;
        for j in r.clone() {
            p += E4M3[w_codes[j] as usize] as f64 * E4M3[xq[j] as usize] as f64;
        }
        acc += p * *ws as f64 * xs[r.start / ACT_GROUP] as f64;
    }
    acc as f32
}

/// An `n x k` matrix (row-major) as an HF `fp8` checkpoint stores it: the e4m3 codes `[n, k]`
/// and `weight_scale_inv` `[ceil(n / bn), ceil(k / bk)]` (row-major f32), each block's scale
/// `amax / 448` and its codes `e4m3(x / scale)`.
pub fn quantize_fp8_blocks(
    v: &[f32],
    n: usize,
    k: usize,
    (bn, bk): (usize, usize),
) -> (Vec<u8>, Vec<f32>) {
    let (sn, sk) = (n.div_ceil(bn), k.div_ceil(bk));
    let mut scales = vec![0f32; sn * sk];
    for (bi, s) in scales.iter_mut().enumerate() {
        let (r0, c0) = (bi / sk * bn, bi % sk * bk);
        let mut m = 0f32;
        for r in r0..(r0 + bn).min(n) {
            m = m.max(amax(&v[r * k + c0..r * k + (c0 + bk).min(k)]));
        }
        *s = group_scale(m, E4M3_MAX);
    }
    let codes = v
        .iter()
        .enumerate()
        .map(|(i, x)| f32_to_e4m3(x / scales[(i / k / bn) * sk + (i % k) / bk]))
        .collect();
    (codes, scales)
}

/// A row-major matrix whose rows are a multiple of 16 long, as a ModelOpt NVFP4 checkpoint
/// stores it: packed e2m1 pairs `[n, k / 2]`, `weight_scale` e4m3 codes `[n, k / 16]`, and
/// `weight_scale_2` (the global scale).
pub fn quantize_nvfp4_checkpoint(v: &[f32]) -> (Vec<u8>, Vec<u8>, f32) {
    let g = nvfp4_global_scale(amax(v));
    let (blocks, scale_codes) = quant_nvfp4_with(v, g);
    let packed = blocks
        .chunks_exact(NVFP4_BLOCK_BYTES)
        .flat_map(|b| b[4..].iter().copied())
        .collect();
    (packed, scale_codes, g)
}

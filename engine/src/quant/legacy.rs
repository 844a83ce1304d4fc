//! The 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Layouts (little-endian), `d`/`m` are f16:
//! - Q4_0 (18 B): `d`, 16 bytes of nibbles; element `j < 16` is the low nibble of byte `j`,
//!   element `j + 16` the high nibble. Value `d * (q - 8)`.
//! - Q4_1 (20 B): `d`, `m`, nibbles as Q4_0. Value `d * q + m`.
//! - Q5_0 (22 B): `d`, `qh` (u32, bit `j` = 5th bit of element `j`), nibbles. Value `d * (q - 16)`.
//! - Q5_1 (24 B): `d`, `m`, `qh`, nibbles. Value `d * q + m`.
//! - Q8_0 (34 B): `d`, 32 signed bytes. Value `q * d`.
//!
//! Dequantization and quantization reproduce `gguf.quants` (gguf-py 0.19) bit for bit, including
//! its float operation order (products and sums rounded to f32 one at a time).

use super::simd::{blocks, blocks_out, f16_le, f32_to_f16};

/// Elements per block.
const QK: usize = 32;
/// Half a block: the nibble split point.
const H: usize = QK / 2;

#[inline(always)]
pub(super) fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<18, QK>(src, dst) {
        let d = f16_le(b[0], b[1]);
        for j in 0..H {
            let q = b[2 + j];
            out[j] = d * ((q & 0x0f) as i8 - 8) as f32;
            out[j + H] = d * ((q >> 4) as i8 - 8) as f32;
        }
    }
}

#[inline(always)]
pub(super) fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<20, QK>(src, dst) {
        let d = f16_le(b[0], b[1]);
        let m = f16_le(b[2], b[3]);
        for j in 0..H {
            let q = b[4 + j];
            out[j] = d * (q & 0x0f) as f32 + m;
            out[j + H] = d * (q >> 4) as f32 + m;
        }
    }
}

#[inline(always)]
pub(super) fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<22, QK>(src, dst) {
        let d = f16_le(b[0], b[1]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..H {
            let q = b[6 + j];
            let lo = (q & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
            let hi = (q >> 4) | ((((qh >> (j + H)) & 1) as u8) << 4);
            out[j] = d * (lo as i8 - 16) as f32;
            out[j + H] = d * (hi as i8 - 16) as f32;
        }
    }
}

#[inline(always)]
pub(super) fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<24, QK>(src, dst) {
        let d = f16_le(b[0], b[1]);
        let m = f16_le(b[2], b[3]);
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for j in 0..H {
            let q = b[8 + j];
            let lo = (q & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
            let hi = (q >> 4) | ((((qh >> (j + H)) & 1) as u8) << 4);
            out[j] = d * lo as f32 + m;
            out[j + H] = d * hi as f32 + m;
        }
    }
}

#[inline(always)]
pub(super) fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<34, QK>(src, dst) {
        let d = f16_le(b[0], b[1]);
        for j in 0..QK {
            out[j] = (b[2 + j] as i8) as f32 * d;
        }
    }
}

/// `1 / d`, or 0 when `d == 0` (gguf-py's `np.where(d == 0, 0, 1 / d)`).
#[inline]
fn inv(d: f32) -> f32 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

/// The element of largest magnitude (the first one on ties), with its sign.
#[inline]
fn signed_absmax(x: &[f32; QK]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

/// (min, max) of a block.
#[inline]
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let mut mn = x[0];
    let mut mx = x[0];
    for &v in &x[1..] {
        mn = mn.min(v);
        mx = mx.max(v);
    }
    (mn, mx)
}

/// Packs 32 values < 16 (low 4 bits of values < 32) into 16 nibble bytes.
#[inline]
fn pack_nibbles(q: &[u8; QK], out: &mut [u8]) {
    for (j, o) in out.iter_mut().take(H).enumerate() {
        *o = (q[j] & 0x0f) | (q[j + H] << 4);
    }
}

/// Bit `j` set where `q[j] >= 16`.
#[inline]
fn high_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= ((v >> 4) as u32 & 1) << j;
    }
    qh.to_le_bytes()
}

/// Symmetric codes `trunc(x * id + offset)` clipped to `0..=max`.
#[inline]
fn sym_codes(x: &[f32; QK], id: f32, offset: f32, max: u8) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..QK {
        q[j] = ((x[j] * id + offset).trunc() as u8).min(max);
    }
    q
}

/// Asymmetric codes `trunc((x - min) * id + 0.5)` clipped to `0..=max`.
#[inline]
fn asym_codes(x: &[f32; QK], min: f32, id: f32, max: u8) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..QK {
        q[j] = (((x[j] - min) * id + 0.5).trunc() as u8).min(max);
    }
    q
}

pub(super) fn quant_q4_0(src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / QK * 18];
    for (x, b) in blocks_out::<QK, 18>(src, &mut out) {
        let d = signed_absmax(x) / -8.0;
        let q = sym_codes(x, inv(d), 8.5, 15);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        pack_nibbles(&q, &mut b[2..]);
    }
    out
}

pub(super) fn quant_q4_1(src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / QK * 20];
    for (x, b) in blocks_out::<QK, 20>(src, &mut out) {
        let (mn, mx) = min_max(x);
        let d = (mx - mn) / 15.0;
        let q = asym_codes(x, mn, inv(d), 15);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(mn).to_le_bytes());
        pack_nibbles(&q, &mut b[4..]);
    }
    out
}

pub(super) fn quant_q5_0(src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / QK * 22];
    for (x, b) in blocks_out::<QK, 22>(src, &mut out) {
        let d = signed_absmax(x) / -16.0;
        let q = sym_codes(x, inv(d), 16.5, 31);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..6].copy_from_slice(&high_bits(&q));
        pack_nibbles(&q, &mut b[6..]);
    }
    out
}

pub(super) fn quant_q5_1(src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / QK * 24];
    for (x, b) in blocks_out::<QK, 24>(src, &mut out) {
        let (mn, mx) = min_max(x);
        let d = (mx - mn) / 31.0;
        let q = asym_codes(x, mn, inv(d), 31);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        b[2..4].copy_from_slice(&f32_to_f16(mn).to_le_bytes());
        b[4..8].copy_from_slice(&high_bits(&q));
        pack_nibbles(&q, &mut b[8..]);
    }
    out
}

pub(super) fn quant_q8_0(src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / QK * 34];
    for (x, b) in blocks_out::<QK, 34>(src, &mut out) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = inv(d);
        b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (o, v) in b[2..].iter_mut().zip(x) {
            // Round half away from zero (ggml `roundf`, gguf-py `np_roundf`).
            *o = ((v * id).round() as i8) as u8;
        }
    }
    out
}

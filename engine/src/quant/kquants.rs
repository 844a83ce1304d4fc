//! Dequantization of the 256-element k-quant super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
//!
//! Each function reproduces `gguf.quants` (gguf-py 0.19) bit for bit: the per-sub-block scale is
//! formed first (`d * sc`, `dmin * m`, each rounded to f32), then each value is `scale * q` or
//! `scale * q - min` with one rounding per operation. Layouts are described per function.

use super::QK_K;
use super::simd::{blocks, f16_le};

/// Unpacks the 8 6-bit scales and 8 6-bit mins of Q4_K/Q5_K (ggml `get_scale_min_k4`).
#[inline(always)]
pub(super) fn scale_min_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// The 12 scale bytes of a Q4_K/Q5_K block starting at byte 4.
#[inline(always)]
fn scale_bytes<const B: usize>(b: &[u8; B]) -> [u8; 12] {
    let mut s = [0u8; 12];
    s.copy_from_slice(&b[4..16]);
    s
}

/// Q2_K (84 B): 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit codes,
/// f16 `d`, f16 `dmin`. Element `128 j + 32 s + l` is bits `2s..2s+2` of code byte `32 j + l`;
/// sub-block `e / 16`. Value `(d * sc) * q - (dmin * m)`.
#[inline(always)]
pub(super) fn dequant_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<84, QK_K>(src, dst) {
        let d = f16_le(b[80], b[81]);
        let dmin = f16_le(b[82], b[83]);
        for sub in 0..16 {
            let sc = b[sub];
            let dl = d * (sc & 0x0f) as f32;
            let ml = dmin * (sc >> 4) as f32;
            let (j, s, l0) = (sub / 8, (sub % 8) / 2, (sub % 2) * 16);
            for l in 0..16 {
                let q = (b[16 + 32 * j + l0 + l] >> (2 * s)) & 3;
                out[16 * sub + l] = dl * q as f32 - ml;
            }
        }
    }
}

/// Q3_K (110 B): 32 bytes `hmask`, 64 bytes of 2-bit codes, 12 bytes of 6-bit scales, f16 `d`.
/// Low bits as Q2_K; the high bit of element `32 b + l` is bit `b` of `hmask[l]`, and a CLEAR
/// high bit subtracts 4. Scale `i` is `(low4 | high2 << 4) - 32`. Value `(d * sc) * q`.
#[inline(always)]
pub(super) fn dequant_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<110, QK_K>(src, dst) {
        let d = f16_le(b[108], b[109]);
        for sub in 0..16 {
            let low = if sub < 8 {
                b[96 + sub] & 0x0f
            } else {
                b[96 + sub - 8] >> 4
            };
            let high = (b[104 + sub % 4] >> (2 * (sub / 4))) & 3;
            let dl = d * ((low | (high << 4)) as i8 - 32) as f32;
            let (j, s, l0) = (sub / 8, (sub % 8) / 2, (sub % 2) * 16);
            let hb = sub / 2;
            for l in 0..16 {
                let ql = (b[32 + 32 * j + l0 + l] >> (2 * s)) & 3;
                let qh = ((b[l0 + l] >> hb) & 1) ^ 1;
                let q = ql as i8 - (qh << 2) as i8;
                out[16 * sub + l] = dl * q as f32;
            }
        }
    }
}

/// Q4_K (144 B): f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales/mins, 128 bytes of
/// nibbles. Sub-block `j` (32 values) uses the low (`j` even) or high nibbles of bytes
/// `32 (j / 2) ..`. Value `(d * sc) * q - (dmin * m)`.
#[inline(always)]
pub(super) fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<144, QK_K>(src, dst) {
        let d = f16_le(b[0], b[1]);
        let dmin = f16_le(b[2], b[3]);
        let (sc, mn) = scale_min_k4(&scale_bytes(b));
        for c in 0..4 {
            let d1 = d * sc[2 * c] as f32;
            let m1 = dmin * mn[2 * c] as f32;
            let d2 = d * sc[2 * c + 1] as f32;
            let m2 = dmin * mn[2 * c + 1] as f32;
            for l in 0..32 {
                let q = b[16 + 32 * c + l];
                out[64 * c + l] = d1 * (q & 0x0f) as f32 - m1;
                out[64 * c + 32 + l] = d2 * (q >> 4) as f32 - m2;
            }
        }
    }
}

/// Q5_K (176 B): as Q4_K plus 32 bytes `qh` before the nibbles; bit `j` of `qh[l]` is the 5th
/// bit of element `l` of sub-block `j`.
#[inline(always)]
pub(super) fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<176, QK_K>(src, dst) {
        let d = f16_le(b[0], b[1]);
        let dmin = f16_le(b[2], b[3]);
        let (sc, mn) = scale_min_k4(&scale_bytes(b));
        for c in 0..4 {
            let d1 = d * sc[2 * c] as f32;
            let m1 = dmin * mn[2 * c] as f32;
            let d2 = d * sc[2 * c + 1] as f32;
            let m2 = dmin * mn[2 * c + 1] as f32;
            for l in 0..32 {
                let q = b[48 + 32 * c + l];
                let h = b[16 + l];
                let q1 = (q & 0x0f) | (((h >> (2 * c)) & 1) << 4);
                let q2 = (q >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
                out[64 * c + l] = d1 * q1 as f32 - m1;
                out[64 * c + 32 + l] = d2 * q2 as f32 - m2;
            }
        }
    }
}

/// Q6_K (210 B): 128 bytes low nibbles `ql`, 64 bytes 2-bit highs `qh`, 16 signed scales,
/// f16 `d`. Element `128 j + r`: low nibble of `ql[64 j + r % 64]` (high nibble when
/// `r >= 64`), high bits `2 (r / 32)..` of `qh[32 j + r % 32]`; `q - 32`; value
/// `(d * scale[e / 16]) * q`.
#[inline(always)]
pub(super) fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<210, QK_K>(src, dst) {
        let d = f16_le(b[208], b[209]);
        for j in 0..2 {
            for half in 0..2 {
                let sc = |k: usize| d * (b[192 + 8 * j + half + 2 * k] as i8) as f32;
                let (s0, s1, s2, s3) = (sc(0), sc(1), sc(2), sc(3));
                for l in 16 * half..16 * half + 16 {
                    let (lo, hi, h) = (b[64 * j + l], b[64 * j + l + 32], b[128 + 32 * j + l]);
                    let q1 = ((lo & 0x0f) | ((h & 3) << 4)) as i8 - 32;
                    let q2 = ((hi & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
                    let q3 = ((lo >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                    let q4 = ((hi >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                    out[128 * j + l] = s0 * q1 as f32;
                    out[128 * j + l + 32] = s1 * q2 as f32;
                    out[128 * j + l + 64] = s2 * q3 as f32;
                    out[128 * j + l + 96] = s3 * q4 as f32;
                }
            }
        }
    }
}

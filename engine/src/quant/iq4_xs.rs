//! IQ4_XS: 256-element super-blocks of 4-bit indices into a fixed non-linear table.
//!
//! Layout (136 B): f16 `d`, u16 `scales_h` (2 high bits per sub-block), 4 bytes `scales_l`
//! (a nibble per sub-block), 128 bytes of index nibbles. Sub-block `i` (32 values) has scale
//! `ls = (low4 | high2 << 4) - 32`; its element `l < 16` is `KVALUES[low nibble of qs[16 i + l]]`,
//! element `16 + l` the high nibble. Value `(d * ls) * kvalue`, as gguf-py 0.19.

use super::QK_K;
use super::simd::{blocks, f16_le};

/// The IQ4_NL / IQ4_XS value table (ggml `kvalues_iq4nl`).
const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[inline(always)]
pub(super) fn dequant_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, out) in blocks::<136, QK_K>(src, dst) {
        let d = f16_le(b[0], b[1]);
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        for i in 0..8 {
            let low = (b[4 + i / 2] >> (4 * (i % 2))) & 0x0f;
            let high = ((scales_h >> (2 * i)) & 3) as u8;
            let dl = d * ((low | (high << 4)) as i8 - 32) as f32;
            for l in 0..16 {
                let q = b[8 + 16 * i + l];
                out[32 * i + l] = dl * KVALUES[(q & 0x0f) as usize] as f32;
                out[32 * i + 16 + l] = dl * KVALUES[(q >> 4) as usize] as f32;
            }
        }
    }
}

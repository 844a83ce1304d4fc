//! Random but valid Q4_K / Q6_K super-blocks, drawn straight from the counter-based generator.
//!
//! Running the reference k-quant quantizers over an 8B model takes minutes; synthetic weights do
//! not need a least-squares fit, only valid blocks with sensible magnitudes. Each block's codes
//! and scales come from `draw(key, block * 32 + k)`, so the output is deterministic and
//! independent of the thread count. Dequantized values have mean ~0 and std ~`std`.

use crate::rng::draw;

/// Bytes of a Q4_K / Q6_K super-block of 256 values.
pub const Q4_K_BYTES: usize = 144;
pub const Q6_K_BYTES: usize = 210;

/// Std of a uniform code on 0..=15 (Q4_K) is sqrt(255 / 12); on 0..=63 (Q6_K) sqrt(4095 / 12).
const Q4_CODE_STD: f32 = 4.609_772;
const Q6_CODE_STD: f32 = 18.472_953;

/// ggml's packing of 8 6-bit scales and 8 6-bit mins into 12 bytes (Q4_K / Q5_K).
fn pack_scales_mins(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
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

/// Fills `out` (a whole number of 144-byte blocks) with Q4_K blocks `first_block..`.
/// Value `d * sc * q - dmin * m` with q uniform on 0..=15, sc = m in 32..=63 and
/// dmin = 7.5 d, so each sub-block is centred on 0.
pub fn fill_q4_k(key: u64, first_block: u64, std: f32, out: &mut [u8]) {
    // sc averages 47.5: d * 47.5 * Q4_CODE_STD = std.
    let d = half::f16::from_f32(std / (47.5 * Q4_CODE_STD));
    let dmin = half::f16::from_f32(d.to_f32() * 7.5);
    for (bi, b) in out.chunks_exact_mut(Q4_K_BYTES).enumerate() {
        let base = (first_block + bi as u64) * 32;
        b[0..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&dmin.to_le_bytes());
        let r = draw(key, base);
        let mut sc = [0u8; 8];
        for (j, s) in sc.iter_mut().enumerate() {
            *s = 32 + ((r >> (5 * j)) & 31) as u8;
        }
        b[4..16].copy_from_slice(&pack_scales_mins(&sc, &sc));
        for (k, c) in b[16..].chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&draw(key, base + 1 + k as u64).to_le_bytes());
        }
    }
}

/// Fills `out` (a whole number of 210-byte blocks) with Q6_K blocks `first_block..`.
/// Value `d * sc * (q - 32)` with q uniform on 0..=63 and |sc| in 8..=15, the sign alternating
/// between the 16 sub-blocks so their small offsets cancel.
pub fn fill_q6_k(key: u64, first_block: u64, std: f32, out: &mut [u8]) {
    // |sc| averages 11.5: d * 11.5 * Q6_CODE_STD = std.
    let d = half::f16::from_f32(std / (11.5 * Q6_CODE_STD));
    for (bi, b) in out.chunks_exact_mut(Q6_K_BYTES).enumerate() {
        let base = (first_block + bi as u64) * 32;
        for (k, c) in b[..192].chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&draw(key, base + 1 + k as u64).to_le_bytes());
        }
        let r = draw(key, base);
        for j in 0..16 {
            let mag = 8 + ((r >> (3 * j)) & 7) as i8;
            let sc = if j % 2 == 0 { mag } else { -mag };
            b[192 + j] = sc as u8;
        }
        b[208..210].copy_from_slice(&d.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_engine::quant::{DType, dequantize_row};

    fn stats(dtype: DType, bytes: &[u8]) -> (f64, f64) {
        let n = bytes.len() / dtype.block_bytes() * 256;
        let mut v = vec![0f32; n];
        dequantize_row(dtype, bytes, &mut v).unwrap();
        assert!(v.iter().all(|x| x.is_finite()));
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        (mean, var.sqrt())
    }

    #[test]
    fn direct_blocks_have_the_asked_magnitude() {
        let mut q4 = vec![0u8; 400 * Q4_K_BYTES];
        fill_q4_k(3, 0, 0.02, &mut q4);
        let (m, s) = stats(DType::Q4_K, &q4);
        assert!(
            m.abs() < 0.001 && (s - 0.02).abs() < 0.002,
            "q4_k mean {m} std {s}"
        );
        let mut q6 = vec![0u8; 400 * Q6_K_BYTES];
        fill_q6_k(3, 0, 0.02, &mut q6);
        let (m, s) = stats(DType::Q6_K, &q6);
        assert!(
            m.abs() < 0.001 && (s - 0.02).abs() < 0.002,
            "q6_k mean {m} std {s}"
        );
        // Counter-based: a block depends only on its index.
        let mut tail = vec![0u8; 10 * Q4_K_BYTES];
        fill_q4_k(3, 390, 0.02, &mut tail);
        assert_eq!(&tail[..], &q4[390 * Q4_K_BYTES..]);
    }
}

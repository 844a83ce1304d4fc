//! Plain float storage: F32, F16, BF16 (block size 1).

use super::simd::{blocks, blocks_out, f16_to_f32, f32_to_bf16, f32_to_f16};

/// Elements converted per inner step (lets the compiler unroll and vectorize).
const STEP: usize = 16;

#[inline(always)]
pub(super) fn dequant_f32(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

#[inline(always)]
pub(super) fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

#[inline(always)]
pub(super) fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    let split = dst.len() / STEP * STEP;
    let (head, tail) = dst.split_at_mut(split);
    let (hsrc, tsrc) = src.split_at(split * 2);
    for (b, out) in blocks::<{ 2 * STEP }, STEP>(hsrc, head) {
        for j in 0..STEP {
            out[j] = f32::from_bits((u16::from_le_bytes([b[2 * j], b[2 * j + 1]]) as u32) << 16);
        }
    }
    for (d, c) in tail.iter_mut().zip(tsrc.chunks_exact(2)) {
        *d = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
    }
}

pub(super) fn quant_f32(src: &[f32]) -> Vec<u8> {
    src.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(super) fn quant_f16(src: &[f32]) -> Vec<u8> {
    src.iter()
        .flat_map(|v| f32_to_f16(*v).to_le_bytes())
        .collect()
}

pub(super) fn quant_bf16(src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() * 2];
    for (v, o) in blocks_out::<1, 2>(src, &mut out) {
        *o = f32_to_bf16(v[0]).to_le_bytes();
    }
    out
}

//! Fixed-order f32 dot products.
//!
//! # Summation order (part of the exactness contract)
//!
//! For `n` = the common length and `m = n - n % 16`:
//! 1. 16 lane accumulators `acc[0..16]`, all starting at `+0.0`. For each chunk `c` of 16
//!    elements in order (`c = 0, 16, 32, .. < m`) and each lane `l`:
//!    `acc[l] = acc[l] + (a[c + l] * b[c + l])` (the product rounded to f32, then the sum rounded;
//!    never a fused multiply-add).
//! 2. A fixed pairwise tree: `acc[l] += acc[l + 8]` for `l < 8`, then `acc[l] += acc[l + 4]` for
//!    `l < 4`, then `acc[l] += acc[l + 2]` for `l < 2`, then `s = acc[0] + acc[1]`.
//! 3. The tail in index order: `s = s + a[i] * b[i]` for `i = m .. n`.
//!
//! The result therefore depends only on the two input slices: not on the CPU (the AVX2 and baseline
//! builds run the same operations), the thread, or how the caller batches rows.
//! [`dot_row`] computes exactly `dot_f32(dequantized row, x)` without materializing the row.

use super::simd::multiversion;
use super::{DType, QK_K, check_len};
use crate::error::Result;

/// Lanes of the fixed accumulation order.
pub const DOT_LANES: usize = 16;

/// The 16 running lane sums of step 1.
#[derive(Clone, Copy)]
struct Lanes([f32; DOT_LANES]);

impl Lanes {
    #[inline(always)]
    fn new() -> Self {
        Lanes([0.0; DOT_LANES])
    }

    /// Step 1 over `a` and `b`, whose common length must be a multiple of 16 (extra ignored).
    #[inline(always)]
    fn add_chunks(&mut self, a: &[f32], b: &[f32]) {
        for (ca, cb) in a.chunks_exact(DOT_LANES).zip(b.chunks_exact(DOT_LANES)) {
            let (Ok(ca), Ok(cb)) = (
                <&[f32; DOT_LANES]>::try_from(ca),
                <&[f32; DOT_LANES]>::try_from(cb),
            ) else {
                continue;
            };
            for l in 0..DOT_LANES {
                self.0[l] += ca[l] * cb[l];
            }
        }
    }

    /// Steps 2 and 3: the pairwise tree, then the tail in order.
    #[inline(always)]
    fn finish(self, tail_a: &[f32], tail_b: &[f32]) -> f32 {
        let mut acc = self.0;
        for l in 0..8 {
            acc[l] += acc[l + 8];
        }
        for l in 0..4 {
            acc[l] += acc[l + 4];
        }
        for l in 0..2 {
            acc[l] += acc[l + 2];
        }
        let mut s = acc[0] + acc[1];
        for (x, y) in tail_a.iter().zip(tail_b) {
            s += x * y;
        }
        s
    }
}

multiversion! {
    /// Dot product of `a` and `b` in the fixed order documented in this module. Only the first
    /// `min(a.len(), b.len())` elements take part (callers pass equal lengths).
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let m = n - n % DOT_LANES;
        let (a, b) = (&a[..n], &b[..n]);
        let mut lanes = Lanes::new();
        lanes.add_chunks(&a[..m], &b[..m]);
        lanes.finish(&a[m..], &b[m..])
    }
}

/// Elements dequantized per step of [`dot_row`]: a multiple of every block size and of 16.
const DOT_ROW_CHUNK: usize = QK_K;

/// `dot_f32(&dequantized, x)` for one row `src` of `dtype` holding `x.len()` elements, without
/// writing the dequantized row to memory: bit-identical to dequantizing with
/// [`super::dequantize_row`] and then calling [`dot_f32`]. Errors if `src` is not exactly the bytes of
/// `x.len()` elements.
pub fn dot_row(dtype: DType, src: &[u8], x: &[f32]) -> Result<f32> {
    check_len(dtype, src, x.len())?;
    Ok(dot_row_unchecked(dtype, src, x))
}

multiversion! {
    /// [`dot_row`] after the length check.
    fn dot_row_unchecked(dtype: DType, src: &[u8], x: &[f32]) -> f32 {
        let chunk_bytes = DOT_ROW_CHUNK / dtype.block_size() * dtype.block_bytes();
        // Dequantize DOT_ROW_CHUNK elements at a time and feed the lanes: the same operations
        // in the same order as `dot_f32` on the whole dequantized row.
        with_codec!(dtype, codec => {
            let mut buf = [0f32; DOT_ROW_CHUNK];
            let mut lanes = Lanes::new();
            let mut tail = None;
            for (s, xs) in src.chunks(chunk_bytes).zip(x.chunks(DOT_ROW_CHUNK)) {
                let vals = &mut buf[..xs.len()];
                codec(s, vals);
                let m = xs.len() - xs.len() % DOT_LANES;
                lanes.add_chunks(&vals[..m], &xs[..m]);
                if m < xs.len() {
                    // Only the last chunk can have a tail: the others hold DOT_ROW_CHUNK values.
                    tail = Some(lanes.finish(&vals[m..], &xs[m..]));
                }
            }
            tail.unwrap_or_else(|| lanes.finish(&[], &[]))
        })
    }
}

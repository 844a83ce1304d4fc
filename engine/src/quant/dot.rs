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
//!
//! On x86_64 CPUs with AVX2 and F16C, [`dot_f32`], [`dot_row`], [`dot_row_multi`] and
//! [`dot_rows_f32`] run the hand-written kernels of `super::dot_avx2` (for `dot_row`: F32, F16,
//! BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K); they perform the same operations in the same order,
//! so they return the same bits as [`dot_f32_generic`] and [`dot_row_generic`], the portable
//! paths kept as fallback and oracle.

pub use super::lanes::DOT_LANES;
use super::lanes::Lanes;
use super::simd::multiversion;
use super::{DType, QK_K, check_len, dequantize_unchecked};
use crate::error::{Error, Result};

/// Dot product of `a` and `b` in the fixed order documented in this module. Only the first
/// `min(a.len(), b.len())` elements take part (callers pass equal lengths).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(v) = super::dot_avx2::dot_f32(a, b) {
        return v;
    }
    dot_f32_generic(a, b)
}

multiversion! {
    /// [`dot_f32`] on the portable path only: the oracle of the hand-written kernel.
    pub fn dot_f32_generic(a: &[f32], b: &[f32]) -> f32 {
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
    #[cfg(target_arch = "x86_64")]
    if let Some(v) = super::dot_avx2::dot_row(dtype, src, x) {
        return Ok(v);
    }
    Ok(dot_row_unchecked(dtype, src, x))
}

/// [`dot_row`] on the portable path only (never the hand-written kernels): the oracle the fast
/// kernels are tested against, bit for bit.
pub fn dot_row_generic(dtype: DType, src: &[u8], x: &[f32]) -> Result<f32> {
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

/// `out[i] = dot_row(dtype, src_row, &xs[i * k..(i + 1) * k])` for every `i < out.len()`, bit for
/// bit, dequantizing the row once and reusing it for all activation rows (four per pass on AVX2).
/// Errors if `src_row` is not exactly the bytes of `k` elements or `xs.len() != out.len() * k`.
pub fn dot_row_multi(
    dtype: DType,
    src_row: &[u8],
    xs: &[f32],
    k: usize,
    out: &mut [f32],
) -> Result<()> {
    check_len(dtype, src_row, k)?;
    check_rows(xs, k, out.len())?;
    thread_local! {
        static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let mut run = |row: &mut Vec<f32>| {
        row.clear();
        row.resize(k, 0.0);
        dequantize_for_dot(dtype, src_row, row);
        dot_rows_unchecked(row, xs, out);
    };
    ROW.with(|cell| match cell.try_borrow_mut() {
        Ok(mut row) => run(&mut row),
        Err(_) => run(&mut Vec::new()),
    });
    Ok(())
}

/// `out[i] = dot_f32(a, &xs[i * k..(i + 1) * k])` with `k = a.len()`, bit for bit, several
/// activation rows per pass over `a`. Errors if `xs.len() != out.len() * a.len()`.
pub fn dot_rows_f32(a: &[f32], xs: &[f32], out: &mut [f32]) -> Result<()> {
    check_rows(xs, a.len(), out.len())?;
    dot_rows_unchecked(a, xs, out);
    Ok(())
}

/// Checks that `xs` holds exactly `rows` rows of `k` values.
fn check_rows(xs: &[f32], k: usize, rows: usize) -> Result<()> {
    match rows.checked_mul(k) {
        Some(n) if n == xs.len() => Ok(()),
        _ => Err(Error::Quant(format!(
            "dot of {rows} activation rows of {k} values: got {} values",
            xs.len()
        ))),
    }
}

/// Dequantizes a checked row (values only used in products: NaN payloads may differ from
/// `dequantize_row`).
fn dequantize_for_dot(dtype: DType, src: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::dot_avx2::dequantize(dtype, src, out) {
        return;
    }
    dequantize_unchecked(dtype, src, out);
}

/// [`dot_rows_f32`] after the length check.
fn dot_rows_unchecked(a: &[f32], xs: &[f32], out: &mut [f32]) {
    if a.is_empty() {
        // The empty dot product: every lane +0.0.
        out.fill(0.0);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::dot_avx2::dot_rows(a, xs, out) {
        return;
    }
    for (x, o) in xs.chunks_exact(a.len()).zip(out.iter_mut()) {
        *o = dot_f32(a, x);
    }
}

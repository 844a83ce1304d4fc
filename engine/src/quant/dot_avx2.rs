//! Hand-written AVX2 + F16C kernels for [`super::dot_f32`], [`super::dot_row`],
//! [`super::dot_row_multi`] and [`super::dot_rows_f32`] (x86_64 only, picked at run time by
//! [`available`]).
//!
//! # Exactness
//!
//! Every kernel performs exactly the float operations of the generic path
//! (`dot_f32(&dequantize_row(src), x)`), in the same order:
//! - each element is dequantized with the reference codec's operations (e.g. Q4_1:
//!   `fl(fl(d * q) + m)`; the k-quant sub-block scales `d * sc` and mins `dmin * m` are formed
//!   first, one f32 multiply each); integer codes and f16 values become f32 exactly (`cvtdq2ps`
//!   of small integers, F16C `vcvtph2ps`);
//! - products are rounded to f32 and then added (`mulps` then `addps`: never a fused
//!   multiply-add);
//! - the 16 lane accumulators of `super::dot` are two `__m256` registers, lanes 0-7 and 8-15,
//!   fed one 16-element chunk at a time in index order; the pairwise tree and the tail are the
//!   shared scalar [`Lanes::finish`].
//!
//! Only NaN payloads may differ (which NaN operand propagates is not fixed by Rust either), never
//! whether the result is NaN.
//!
//! `unsafe` here is only: a pointer load or store from a slice that holds the bytes, and the
//! entry points ([`dot_f32`], [`dot_row`], [`dequantize`], [`dot_rows`]) calling the
//! `#[target_feature]` kernels after checking the CPU features. The block kernels also issue a
//! prefetch hint past the current block (into the next row), which never faults.

use std::arch::x86_64::*;

use super::DType;
use super::kquants::scale_min_k4;
use super::lanes::{DOT_LANES, Lanes};
use super::simd::f16_to_f32;

/// True when the CPU has AVX2 and F16C, which every kernel here needs.
#[inline]
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// Whether [`dot_row`] and [`dequantize`] have a kernel for `dtype`.
pub(super) fn has_kernel(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q8_0
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
    )
}

/// `dot_row` for one row whose length was checked (`src` holds exactly `x.len()` elements), or
/// `None` when the CPU lacks AVX2/F16C or `dtype` has no kernel here.
pub(super) fn dot_row(dtype: DType, src: &[u8], x: &[f32]) -> Option<f32> {
    if !has_kernel(dtype) || !available() {
        return None;
    }
    // SAFETY: the kernels only require AVX2 and F16C, which the CPU has (checked just above).
    let v = unsafe {
        match dtype {
            DType::F32 => dot_f32_bytes(src, x),
            DType::F16 => dot_f16(src, x),
            DType::BF16 => dot_bf16(src, x),
            DType::Q4_0 => dot_q4_0(src, x),
            DType::Q4_1 => dot_q4_1(src, x),
            DType::Q8_0 => dot_q8_0(src, x),
            DType::Q4_K => dot_q4_k(src, x),
            DType::Q5_K => dot_q5_k(src, x),
            DType::Q6_K => dot_q6_k(src, x),
            _ => return None,
        }
    };
    Some(v)
}

/// Dequantizes a checked row of a quantized `dtype` (the NaN caveat of the module docs applies, so
/// this is for dot products only, not `dequantize_row`). Returns `false` (nothing written) when
/// the CPU or `dtype` is not covered.
pub(super) fn dequantize(dtype: DType, src: &[u8], out: &mut [f32]) -> bool {
    if dtype.is_float() || !has_kernel(dtype) || !available() {
        return false;
    }
    // SAFETY: the kernels only require AVX2 and F16C, which the CPU has (checked just above).
    unsafe {
        match dtype {
            DType::Q4_0 => deq_q4_0(src, out),
            DType::Q4_1 => deq_q4_1(src, out),
            DType::Q8_0 => deq_q8_0(src, out),
            DType::Q4_K => deq_q4_k(src, out),
            DType::Q5_K => deq_q5_k(src, out),
            DType::Q6_K => deq_q6_k(src, out),
            _ => return false,
        }
    }
    true
}

/// `dot_f32(a, b)` (over the common length), or `None` when the CPU lacks the features.
pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> Option<f32> {
    if !available() {
        return None;
    }
    let n = a.len().min(b.len());
    // SAFETY: the kernel only requires AVX2 and F16C, which the CPU has (checked just above).
    Some(unsafe { dot1(&a[..n], &b[..n]) })
}

/// `out[i] = dot_f32(a, xs[i k .. (i + 1) k])` with `k = a.len() > 0` and
/// `xs.len() == out.len() * k` (checked by the caller). Returns `false` when the CPU lacks the
/// features (nothing written).
pub(super) fn dot_rows(a: &[f32], xs: &[f32], out: &mut [f32]) -> bool {
    if !available() {
        return false;
    }
    // SAFETY: the kernel only requires AVX2 and F16C, which the CPU has (checked just above).
    unsafe { dot_rows_kernel(a, xs, out) };
    true
}

// ---------------------------------------------------------------------------------------------
// Loads, stores and conversions.

/// 16 bytes of `b` at `at`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn bytes16(b: &[u8], at: usize) -> __m128i {
    let s = &b[at..at + 16];
    // SAFETY: `s` holds 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// 8 bytes of `b` at `at`, in the low half.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn bytes8(b: &[u8], at: usize) -> __m128i {
    let s = &b[at..at + 8];
    // SAFETY: `s` holds 8 readable bytes; `loadl` has no alignment requirement.
    unsafe { _mm_loadl_epi64(s.as_ptr().cast()) }
}

/// 8 f32 of `x` at `at`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f32x8(x: &[f32], at: usize) -> __m256 {
    let s = &x[at..at + 8];
    // SAFETY: `s` holds 8 readable f32; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// Stores `v` to `out[at..at + 8]`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn store8(out: &mut [f32], at: usize, v: __m256) {
    let s = &mut out[at..at + 8];
    // SAFETY: `s` holds 8 writable f32; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
}

/// How far ahead of the current block [`prefetch_ahead`] asks for weight bytes.
const PREFETCH_BYTES: usize = 768;

/// Hints the cache to fetch the line [`PREFETCH_BYTES`] past the start of `b`: weights stream
/// row after row, so this runs on into the next row.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn prefetch_ahead(b: &[u8]) {
    // Only a hint: a prefetch never faults, whatever the address.
    _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH_BYTES).cast());
}

/// The little-endian f16 at `b[at..at + 2]` as f32 (exact) in all 8 lanes.
///
/// A broadcast, not `_mm_cvtsi32_si128`: LLVM lowers the latter to an insert into whatever
/// register is free, a false dependency that can chain every block onto the accumulator.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16_splat(b: &[u8], at: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes([b[at], b[at + 1]])))
}

/// The low 8 bytes of `v` as unsigned integers, to f32 (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn u8_ps(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
}

/// The low 8 bytes of `v` as signed integers, to f32 (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn i8_ps(v: __m128i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// The high 8 bytes of `v` moved to the low half.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn high8(v: __m128i) -> __m128i {
    _mm_unpackhi_epi64(v, v)
}

/// Low and high nibbles of the 16 bytes of `q`, each in its own byte.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn nibbles(q: __m128i) -> (__m128i, __m128i) {
    let mask = _mm_set1_epi8(0x0f);
    (
        _mm_and_si128(q, mask),
        _mm_and_si128(_mm_srli_epi16::<4>(q), mask),
    )
}

// ---------------------------------------------------------------------------------------------
// The accumulator.

/// The 16 lane sums of `super::dot` step 1: lanes 0-7 and 8-15.
#[derive(Clone, Copy)]
struct Acc {
    lo: __m256,
    hi: __m256,
}

impl Acc {
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn new() -> Acc {
        Acc {
            lo: _mm256_setzero_ps(),
            hi: _mm256_setzero_ps(),
        }
    }

    /// One 16-element chunk: values `w0` (lanes 0-7) and `w1` (8-15) times `x[at..at + 16]`;
    /// each product rounded, then added.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn add(&mut self, w0: __m256, w1: __m256, x: &[f32], at: usize) {
        self.lo = _mm256_add_ps(self.lo, _mm256_mul_ps(w0, f32x8(x, at)));
        self.hi = _mm256_add_ps(self.hi, _mm256_mul_ps(w1, f32x8(x, at + 8)));
    }

    /// Steps 2 and 3 (tree, then the tail `tail_a[i] * tail_b[i]` in order).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn finish(self, tail_a: &[f32], tail_b: &[f32]) -> f32 {
        let mut a = [0f32; DOT_LANES];
        store8(&mut a, 0, self.lo);
        store8(&mut a, 8, self.hi);
        Lanes(a).finish(tail_a, tail_b)
    }
}

// ---------------------------------------------------------------------------------------------
// Block formats: `decode_*(block, piece)` returns the values of one piece of a block as
// consecutive groups of 8 (a piece is a multiple of 16 elements).

/// Defines the dot kernel `$dot` and the dequantizer `$deq` of a block format with `$bytes`-byte
/// blocks of `$pieces` pieces of `$piece` elements: `$prep(block)` computes what the block's
/// pieces share (its scales), then `$decode(block, &prepared, piece)` the values of each piece.
macro_rules! block_kernels {
    ($dot:ident, $deq:ident, $prep:ident, $decode:ident, $bytes:literal, $pieces:literal x $piece:literal) => {
        #[target_feature(enable = "avx2,f16c")]
        fn $dot(src: &[u8], x: &[f32]) -> f32 {
            let mut acc = Acc::new();
            for (b, xb) in src
                .chunks_exact($bytes)
                .zip(x.chunks_exact($pieces * $piece))
            {
                prefetch_ahead(b);
                let prep = $prep(b);
                for (p, xp) in xb.chunks_exact($piece).enumerate() {
                    let w = $decode(b, &prep, p);
                    for (i, pair) in w.chunks_exact(2).enumerate() {
                        acc.add(pair[0], pair[1], xp, 16 * i);
                    }
                }
            }
            acc.finish(&[], &[])
        }

        #[target_feature(enable = "avx2,f16c")]
        fn $deq(src: &[u8], out: &mut [f32]) {
            for (b, ob) in src
                .chunks_exact($bytes)
                .zip(out.chunks_exact_mut($pieces * $piece))
            {
                let prep = $prep(b);
                for (p, op) in ob.chunks_exact_mut($piece).enumerate() {
                    for (i, v) in $decode(b, &prep, p).into_iter().enumerate() {
                        store8(op, 8 * i, v);
                    }
                }
            }
        }
    };
}

/// Legacy blocks are one piece: nothing to share.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn no_prep(_b: &[u8]) {}

/// Q4_0 (18 B): `d * (q - 8)`; element `j < 16` the low nibble of byte `2 + j`, `j + 16` the high.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn decode_q4_0(b: &[u8], _prep: &(), _piece: usize) -> [__m256; 4] {
    let d = f16_splat(b, 0);
    let (lo, hi) = nibbles(bytes16(b, 2));
    let eight = _mm_set1_epi8(8);
    let (lo, hi) = (_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight));
    let v = |q: __m128i| _mm256_mul_ps(d, i8_ps(q));
    [v(lo), v(high8(lo)), v(hi), v(high8(hi))]
}
block_kernels!(dot_q4_0, deq_q4_0, no_prep, decode_q4_0, 18, 1 x 32);

/// Q4_1 (20 B): `d * q + m`, nibbles as Q4_0 from byte 4.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn decode_q4_1(b: &[u8], _prep: &(), _piece: usize) -> [__m256; 4] {
    let d = f16_splat(b, 0);
    let m = f16_splat(b, 2);
    let (lo, hi) = nibbles(bytes16(b, 4));
    let v = |q: __m128i| _mm256_add_ps(_mm256_mul_ps(d, u8_ps(q)), m);
    [v(lo), v(high8(lo)), v(hi), v(high8(hi))]
}
block_kernels!(dot_q4_1, deq_q4_1, no_prep, decode_q4_1, 20, 1 x 32);

/// Q8_0 (34 B): `q * d`, 32 signed bytes from byte 2.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn decode_q8_0(b: &[u8], _prep: &(), _piece: usize) -> [__m256; 4] {
    let d = f16_splat(b, 0);
    let v = |at: usize| _mm256_mul_ps(i8_ps(bytes8(b, at)), d);
    [v(2), v(10), v(18), v(26)]
}
block_kernels!(dot_q8_0, deq_q8_0, no_prep, decode_q8_0, 34, 1 x 32);

/// The eight sub-block scales `d * sc` and mins `dmin * m` of a Q4_K/Q5_K block, each rounded to
/// f32 as the reference codec does (one multiply per lane).
struct K4Scales {
    d: [f32; 8],
    m: [f32; 8],
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn k4_prep(b: &[u8]) -> K4Scales {
    let mut packed = [0u8; 12];
    packed.copy_from_slice(&b[4..16]);
    let (sc, mn) = scale_min_k4(&packed);
    let mut out = K4Scales {
        d: [0.0; 8],
        m: [0.0; 8],
    };
    let d = _mm256_mul_ps(f16_splat(b, 0), u8_ps(bytes8(&sc, 0)));
    let m = _mm256_mul_ps(f16_splat(b, 2), u8_ps(bytes8(&mn, 0)));
    store8(&mut out.d, 0, d);
    store8(&mut out.m, 0, m);
    out
}

/// The (scale, min) pairs of Q4_K/Q5_K piece `c` (sub-blocks `2c` and `2c + 1`), broadcast.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn k4_scales(k: &K4Scales, c: usize) -> [(__m256, __m256); 2] {
    let s = |j: usize| (_mm256_set1_ps(k.d[j]), _mm256_set1_ps(k.m[j]));
    [s(2 * c), s(2 * c + 1)]
}

/// Q4_K (144 B): piece `c` (64 values) is `(d * sc) * q - (dmin * m)` over the low nibbles
/// (sub-block `2c`) then the high nibbles (`2c + 1`) of bytes `16 + 32c ..`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn decode_q4_k(b: &[u8], k: &K4Scales, c: usize) -> [__m256; 8] {
    let [(d1, m1), (d2, m2)] = k4_scales(k, c);
    let (lo0, hi0) = nibbles(bytes16(b, 16 + 32 * c));
    let (lo1, hi1) = nibbles(bytes16(b, 32 + 32 * c));
    let v = |d: __m256, m: __m256, q: __m128i| _mm256_sub_ps(_mm256_mul_ps(d, u8_ps(q)), m);
    [
        v(d1, m1, lo0),
        v(d1, m1, high8(lo0)),
        v(d1, m1, lo1),
        v(d1, m1, high8(lo1)),
        v(d2, m2, hi0),
        v(d2, m2, high8(hi0)),
        v(d2, m2, hi1),
        v(d2, m2, high8(hi1)),
    ]
}
block_kernels!(dot_q4_k, deq_q4_k, k4_prep, decode_q4_k, 144, 4 x 64);

/// Q5_K (176 B): as Q4_K with the nibbles from byte `48 + 32c` and the 5th bits from bits `2c`
/// and `2c + 1` of `qh` (bytes 16..48).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn decode_q5_k(b: &[u8], k: &K4Scales, c: usize) -> [__m256; 8] {
    let [(d1, m1), (d2, m2)] = k4_scales(k, c);
    let shift = _mm_cvtsi32_si128(2 * c as i32);
    let bit4 = _mm_set1_epi8(0x10);
    // Bits 2c and 2c + 1 of each qh byte moved to bit 4 of their own byte (16-bit shifts by at
    // most 7 keep every selected bit within its byte).
    let highs = |at: usize| {
        let h = _mm_srl_epi16(bytes16(b, at), shift);
        (
            _mm_and_si128(_mm_slli_epi16::<4>(h), bit4),
            _mm_and_si128(_mm_slli_epi16::<3>(h), bit4),
        )
    };
    let (h1a, h2a) = highs(16);
    let (h1b, h2b) = highs(32);
    let (lo0, hi0) = nibbles(bytes16(b, 48 + 32 * c));
    let (lo1, hi1) = nibbles(bytes16(b, 64 + 32 * c));
    let (q1a, q1b) = (_mm_or_si128(lo0, h1a), _mm_or_si128(lo1, h1b));
    let (q2a, q2b) = (_mm_or_si128(hi0, h2a), _mm_or_si128(hi1, h2b));
    let v = |d: __m256, m: __m256, q: __m128i| _mm256_sub_ps(_mm256_mul_ps(d, u8_ps(q)), m);
    [
        v(d1, m1, q1a),
        v(d1, m1, high8(q1a)),
        v(d1, m1, q1b),
        v(d1, m1, high8(q1b)),
        v(d2, m2, q2a),
        v(d2, m2, high8(q2a)),
        v(d2, m2, q2b),
        v(d2, m2, high8(q2b)),
    ]
}
block_kernels!(dot_q5_k, deq_q5_k, k4_prep, decode_q5_k, 176, 4 x 64);

/// The 16 scales `d * scale[i]` of a Q6_K block (one f32 multiply each, as the reference).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q6_prep(b: &[u8]) -> [f32; 16] {
    let d = f16_splat(b, 208);
    let mut out = [0f32; 16];
    store8(&mut out, 0, _mm256_mul_ps(d, i8_ps(bytes8(b, 192))));
    store8(&mut out, 8, _mm256_mul_ps(d, i8_ps(bytes8(b, 200))));
    out
}

/// Q6_K (210 B): piece `p` (32 values: `j = p / 4`, `k = p % 4`) is element `128 j + 32 k + l`:
/// nibble `k / 2` of `ql[64 j + 32 (k % 2) + l]`, bits `2k..2k + 2` of `qh[128 + 32 j + l]` as
/// bits 4-5, minus 32, times `d * scale[2p + l / 16]`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn decode_q6_k(b: &[u8], scales: &[f32; 16], p: usize) -> [__m256; 4] {
    let (j, k) = (p / 4, p % 4);
    let s0 = _mm256_set1_ps(scales[2 * p]);
    let s1 = _mm256_set1_ps(scales[2 * p + 1]);
    let lshift = _mm_cvtsi32_si128(4 * (k / 2) as i32);
    let hshift = _mm_cvtsi32_si128(2 * k as i32);
    let codes = |at: usize| {
        let ql = _mm_and_si128(
            _mm_srl_epi16(bytes16(b, 64 * j + 32 * (k % 2) + at), lshift),
            _mm_set1_epi8(0x0f),
        );
        let qh = _mm_and_si128(
            _mm_srl_epi16(bytes16(b, 128 + 32 * j + at), hshift),
            _mm_set1_epi8(0x03),
        );
        _mm_sub_epi8(_mm_or_si128(ql, _mm_slli_epi16::<4>(qh)), _mm_set1_epi8(32))
    };
    let (qa, qb) = (codes(0), codes(16));
    let v = |s: __m256, q: __m128i| _mm256_mul_ps(s, i8_ps(q));
    [v(s0, qa), v(s0, high8(qa)), v(s1, qb), v(s1, high8(qb))]
}
block_kernels!(dot_q6_k, deq_q6_k, q6_prep, decode_q6_k, 210, 8 x 32);

// ---------------------------------------------------------------------------------------------
// Plain floats: 16 values per step, then the tail in order.

/// Defines a float-row dot kernel: `$conv(bytes of 16 values) -> (lanes 0-7, lanes 8-15)`,
/// `$scalar(byte chunk) -> f32` for the tail, `$size` bytes per value.
macro_rules! float_kernel {
    ($name:ident, $size:literal, $conv:ident, $scalar:expr) => {
        #[target_feature(enable = "avx2,f16c")]
        fn $name(src: &[u8], x: &[f32]) -> f32 {
            let mut acc = Acc::new();
            let bytes = src.chunks_exact(16 * $size);
            let xs = x.chunks_exact(DOT_LANES);
            let (tail_src, tail_x) = (bytes.remainder(), xs.remainder());
            for (b, xc) in bytes.zip(xs) {
                let (w0, w1) = $conv(b);
                acc.add(w0, w1, xc, 0);
            }
            let mut tail = [0f32; DOT_LANES];
            for (t, c) in tail.iter_mut().zip(tail_src.chunks_exact($size)) {
                *t = $scalar(c);
            }
            let n = tail_x.len().min(DOT_LANES);
            acc.finish(&tail[..n], tail_x)
        }
    };
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn conv_f32(b: &[u8]) -> (__m256, __m256) {
    let s = &b[..64];
    // SAFETY: `s` holds 64 readable bytes (16 f32); `loadu` has no alignment requirement.
    unsafe {
        (
            _mm256_loadu_ps(s.as_ptr().cast()),
            _mm256_loadu_ps(s.as_ptr().add(32).cast()),
        )
    }
}
float_kernel!(dot_f32_bytes, 4, conv_f32, |c: &[u8]| f32::from_le_bytes([
    c[0], c[1], c[2], c[3]
]));

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn conv_f16(b: &[u8]) -> (__m256, __m256) {
    (
        _mm256_cvtph_ps(bytes16(b, 0)),
        _mm256_cvtph_ps(bytes16(b, 16)),
    )
}
float_kernel!(dot_f16, 2, conv_f16, |c: &[u8]| f16_to_f32(
    u16::from_le_bytes([c[0], c[1]])
));

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn conv_bf16(b: &[u8]) -> (__m256, __m256) {
    let v = |at: usize| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bytes16(
            b, at,
        ))))
    };
    (v(0), v(16))
}
float_kernel!(dot_bf16, 2, conv_bf16, |c: &[u8]| f32::from_bits(
    (u16::from_le_bytes([c[0], c[1]]) as u32) << 16
));

// ---------------------------------------------------------------------------------------------
// One f32 row against several activation rows.

/// `dot_f32(a, x)` for `a` and `x` of equal length.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dot1(a: &[f32], x: &[f32]) -> f32 {
    let mut acc = Acc::new();
    let ac = a.chunks_exact(DOT_LANES);
    let xc = x.chunks_exact(DOT_LANES);
    let (ta, tx) = (ac.remainder(), xc.remainder());
    for (ca, cx) in ac.zip(xc) {
        acc.add(f32x8(ca, 0), f32x8(ca, 8), cx, 0);
    }
    acc.finish(ta, tx)
}

/// Four dot products `dot_f32(a, x[r])` in one pass over `a` (eight independent accumulator
/// chains; each keeps its own row's order). Every `x[r]` has `a.len()` values.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dot4(a: &[f32], x: [&[f32]; 4]) -> [f32; 4] {
    let mut acc = [Acc::new(); 4];
    let n = a.len();
    let m = n - n % DOT_LANES;
    let chunks = a[..m]
        .chunks_exact(DOT_LANES)
        .zip(x[0][..m].chunks_exact(DOT_LANES))
        .zip(x[1][..m].chunks_exact(DOT_LANES))
        .zip(x[2][..m].chunks_exact(DOT_LANES))
        .zip(x[3][..m].chunks_exact(DOT_LANES));
    for ((((ca, c0), c1), c2), c3) in chunks {
        let (w0, w1) = (f32x8(ca, 0), f32x8(ca, 8));
        acc[0].add(w0, w1, c0, 0);
        acc[1].add(w0, w1, c1, 0);
        acc[2].add(w0, w1, c2, 0);
        acc[3].add(w0, w1, c3, 0);
    }
    let mut out = [0f32; 4];
    for r in 0..4 {
        out[r] = acc[r].finish(&a[m..], &x[r][m..n]);
    }
    out
}

/// See [`dot_rows`]: four activation rows per pass, then one at a time.
#[target_feature(enable = "avx2,f16c")]
fn dot_rows_kernel(a: &[f32], xs: &[f32], out: &mut [f32]) {
    let k = a.len();
    let done = out.len() / 4 * 4;
    let quads = xs.chunks_exact(4 * k).zip(out.chunks_exact_mut(4));
    for (xq, oq) in quads {
        let (x0, r) = xq.split_at(k);
        let (x1, r) = r.split_at(k);
        let (x2, x3) = r.split_at(k);
        oq.copy_from_slice(&dot4(a, [x0, x1, x2, x3]));
    }
    for (x, o) in xs[done * k..].chunks_exact(k).zip(&mut out[done..]) {
        *o = dot1(a, x);
    }
}

//! Shared helpers for the block codecs: runtime AVX2 dispatch, fixed-size block iteration and
//! exact half-precision conversions written so the compiler can vectorize them.
//!
//! Exactness: every helper here computes the same bits on every path. The AVX2 copies are the
//! same Rust source compiled with wider registers; Rust never contracts `a * b + c` into a fused
//! multiply-add and never reassociates float operations, so the order written is the order run.

/// Defines `fn name(args) [-> ret]` whose body is compiled twice: once for the baseline target and
/// once with AVX2 enabled, picked at run time. Both copies perform the same float operations in
/// the same order, so the result does not depend on the CPU (see the module docs).
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    generic($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: `avx2` only requires the AVX2 instruction set, which the CPU has
                    // (checked just above).
                    return unsafe { avx2($($arg),*) };
                }
            }
            generic($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// Pairs each `B`-byte block of `src` with its `N` output values in `dst`, as fixed-size arrays
/// (so the loop bodies have no bounds checks). Stops at the shorter of the two.
#[inline(always)]
pub(crate) fn blocks<'a, const B: usize, const N: usize>(
    src: &'a [u8],
    dst: &'a mut [f32],
) -> impl Iterator<Item = (&'a [u8; B], &'a mut [f32; N])> {
    src.chunks_exact(B)
        .zip(dst.chunks_exact_mut(N))
        .filter_map(|(s, d)| Some((s.try_into().ok()?, d.try_into().ok()?)))
}

/// Pairs each `N` input values of `src` with the `B` bytes of its block in `dst`.
#[inline(always)]
pub(crate) fn blocks_out<'a, const N: usize, const B: usize>(
    src: &'a [f32],
    dst: &'a mut [u8],
) -> impl Iterator<Item = (&'a [f32; N], &'a mut [u8; B])> {
    src.chunks_exact(N)
        .zip(dst.chunks_exact_mut(B))
        .filter_map(|(s, d)| Some((s.try_into().ok()?, d.try_into().ok()?)))
}

/// Exact IEEE binary16 -> binary32 conversion (subnormals, infinities and NaN payloads kept),
/// branch-free so it vectorizes. Same values as numpy's `float16.astype(float32)`.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    // Exponent and mantissa moved into f32 position, then re-biased by 2^(127-15) = 2^112. This
    // is exact for normal numbers and also turns f16 subnormals into the right normal f32.
    let scaled = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    let inf_nan = (em << 13) | 0x7f80_0000;
    let bits = if em >= 0x7c00 {
        inf_nan
    } else {
        scaled.to_bits()
    };
    f32::from_bits(bits | sign)
}

/// Reads a little-endian f16 at `b[0..2]` as f32.
#[inline(always)]
pub(crate) fn f16_le(b0: u8, b1: u8) -> f32 {
    f16_to_f32(u16::from_le_bytes([b0, b1]))
}

/// f32 -> f16 bits, round to nearest even (numpy `astype(float16)`, ggml `GGML_FP32_TO_FP16`).
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// f32 -> bf16 bits exactly as ggml `ggml_compute_fp32_to_bf16` / gguf-py: NaN forced quiet,
/// otherwise round to nearest even.
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let n = x.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        return ((n >> 16) | 64) as u16;
    }
    ((n as u64 + 0x7fff + ((n >> 16) & 1) as u64) >> 16) as u16
}

/// Round half to even, as ggml's `nearest_int` (for |x| < 2^22).
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

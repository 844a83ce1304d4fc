//! The fast dot paths (hand-written AVX2/F16C kernels where the CPU has them) against the
//! portable path and against the definition, bit for bit: `dot_row == dot_row_generic ==
//! dot_f32_generic(dequantize_row)` for every dtype, `dot_f32 == dot_f32_generic`, on random blocks (scales sane or arbitrary) and
//! quantized random data, over many lengths (float rows with tails) and awkward activations; and
//! `dot_row_multi` / `dot_rows_f32` equal to the one-row products.

use memra_engine::error::Error;
use memra_engine::quant::{
    DType, QUANTIZABLE, dequantize_row, dot_f32, dot_f32_generic, dot_row, dot_row_generic,
    dot_row_multi, dot_rows_f32, quantize,
};

/// xorshift64 stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// A finite f16 (sign, exponent 0..=30 so subnormals included, any mantissa).
    fn finite_f16(&mut self) -> [u8; 2] {
        let h = (self.next() as u16 & 0x83ff) | ((self.below(31) as u16) << 10);
        h.to_le_bytes()
    }

    /// Activations: signed values spread over magnitudes 2^-20 .. 2^20, with exact zeros
    /// (both signs) and some plain small values.
    fn activations(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| match self.below(10) {
                0 => 0.0,
                1 => -0.0,
                2 | 3 => self.unit() * 2.0 - 1.0,
                _ => {
                    let mag = (self.unit() + 0.5) * 2f32.powi(self.below(41) as i32 - 20);
                    if self.below(2) == 0 { mag } else { -mag }
                }
            })
            .collect()
    }
}

/// Byte offsets of the f16 scale fields of one block of `d` (none for float types).
fn f16_fields(d: DType) -> &'static [usize] {
    match d {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_XS => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        // f32 scales: random bytes, made sane below.
        DType::F32 | DType::F16 | DType::BF16 | DType::FP8 | DType::NVFP4 => &[],
    }
}

/// Random bytes of `n` elements of `d`; with `sane`, every f16 field (scales, F16 values) is
/// finite and F32/BF16 values are finite too.
fn random_row(rng: &mut Rng, d: DType, n: usize, sane: bool) -> Vec<u8> {
    let bb = d.block_bytes();
    let mut b = rng.bytes(n / d.block_size() * bb);
    if sane {
        match d {
            DType::F16 => b
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&rng.finite_f16())),
            // Clear the top exponent bit: never inf or NaN.
            DType::BF16 => b.chunks_exact_mut(2).for_each(|c| c[1] &= 0xbf),
            DType::F32 => b.chunks_exact_mut(4).for_each(|c| c[3] &= 0xbf),
            _ => {
                for blk in b.chunks_exact_mut(bb) {
                    for &at in f16_fields(d) {
                        blk[at..at + 2].copy_from_slice(&rng.finite_f16());
                    }
                }
            }
        }
    }
    b
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The three ways to compute the product agree; returns whether the result was finite.
fn check(what: &str, d: DType, src: &[u8], x: &[f32]) -> bool {
    let mut row = vec![0f32; x.len()];
    dequantize_row(d, src, &mut row).expect("dequantize_row");
    let want = dot_f32_generic(&row, x);
    assert!(
        same(dot_f32(&row, x), want),
        "{what}: dot_f32 != dot_f32_generic"
    );
    let generic = dot_row_generic(d, src, x).expect("dot_row_generic");
    let fast = dot_row(d, src, x).expect("dot_row");
    assert!(
        same(generic, want),
        "{what}: generic {generic:e} ({:#x}) != dequantize+dot {want:e} ({:#x})",
        generic.to_bits(),
        want.to_bits()
    );
    assert!(
        same(fast, want),
        "{what}: fast {fast:e} ({:#x}) != dequantize+dot {want:e} ({:#x})",
        fast.to_bits(),
        want.to_bits()
    );
    want.is_finite()
}

/// Row lengths to test: whole blocks from 32 to 4096 elements; any length for float types.
fn lengths(d: DType) -> Vec<usize> {
    if d.is_float() {
        (1..=40)
            .chain([63, 255, 256, 257, 576, 999, 1536, 4095, 4096])
            .collect()
    } else {
        let bs = d.block_size();
        [32, 64, 96, 256, 480, 512, 576, 768, 1536, 2048, 4096]
            .into_iter()
            .filter(|n| n % bs == 0)
            .collect()
    }
}

#[test]
fn dot_row_fast_equals_generic_equals_definition() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for d in DType::ALL {
        let mut finite = 0;
        for n in lengths(d) {
            for trial in 0..4 {
                let sane = trial < 3;
                let src = random_row(&mut rng, d, n, sane);
                let x = rng.activations(n);
                let ok = check(&format!("{d} n={n} trial {trial}"), d, &src, &x);
                finite += usize::from(ok && sane);
            }
        }
        // The sane rows must mostly give finite sums, or the comparisons above prove little.
        let sane_cases = 3 * lengths(d).len();
        assert!(
            finite * 10 >= sane_cases * 9,
            "{d}: only {finite} of {sane_cases} sane products finite"
        );
    }
}

#[test]
fn dot_f32_fast_equals_generic() {
    let mut rng = Rng(1234);
    for n in (0..=70).chain([127, 128, 129, 576, 1000, 4095, 4096]) {
        for _ in 0..3 {
            let a = rng.activations(n);
            let b = rng.activations(n + 5);
            let (fast, want) = (dot_f32(&a, &b), dot_f32_generic(&a, &b));
            assert!(same(fast, want), "n={n}: {fast:e} != {want:e}");
            // Only the common prefix counts.
            assert!(same(dot_f32(&b, &a), want), "n={n}: swapped lengths");
        }
    }
}

#[test]
fn dot_row_fast_on_quantized_data() {
    let mut rng = Rng(77);
    for d in QUANTIZABLE {
        for n in lengths(d) {
            // Within f16 range (|v| < 2^15) so F16 stays finite.
            let v: Vec<f32> = rng.activations(n).iter().map(|v| v / 64.0).collect();
            let src = quantize(d, &v).expect("quantize");
            let x = rng.activations(n);
            assert!(
                check(&format!("{d} quantized n={n}"), d, &src, &x),
                "{d}: non-finite"
            );
        }
    }
}

#[test]
fn dot_row_fast_special_values() {
    // Infinities, NaN and extreme magnitudes in the activations: the fast path follows the same
    // operations, so it gives the same (possibly non-finite) result.
    let mut rng = Rng(5);
    for d in DType::ALL {
        let n = if d.is_float() { 67 } else { d.block_size() * 2 };
        for special in [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            1e-45,
            -3e38,
        ] {
            let src = random_row(&mut rng, d, n, true);
            let mut x = rng.activations(n);
            let at = rng.below(n as u64) as usize;
            x[at] = special;
            check(&format!("{d} x[{at}] = {special:e}"), d, &src, &x);
        }
    }
}

#[test]
fn dot_row_multi_equals_dot_row_per_row() {
    let mut rng = Rng(31);
    for d in DType::ALL {
        let bs = d.block_size();
        for n in [bs, 576 / bs * bs, 1000 / bs * bs + bs] {
            let n = if d.is_float() { n + 3 } else { n };
            let src = random_row(&mut rng, d, n, true);
            for m in [1, 2, 3, 4, 5, 7, 8, 9, 13] {
                let xs = rng.activations(m * n);
                let mut out = vec![f32::NAN; m];
                dot_row_multi(d, &src, &xs, n, &mut out).expect("dot_row_multi");
                let mut row = vec![0f32; n];
                dequantize_row(d, &src, &mut row).expect("dequantize_row");
                let mut out_f32 = vec![f32::NAN; m];
                dot_rows_f32(&row, &xs, &mut out_f32).expect("dot_rows_f32");
                for (i, x) in xs.chunks_exact(n).enumerate() {
                    let want = dot_row_generic(d, &src, x).expect("dot_row_generic");
                    let one = dot_row(d, &src, x).expect("dot_row");
                    assert!(same(out[i], want), "{d} n={n} m={m} row {i}: multi");
                    assert!(same(one, want), "{d} n={n} m={m} row {i}: dot_row");
                    assert!(
                        same(out_f32[i], dot_f32_generic(&row, x)),
                        "{d} n={n} m={m} row {i}: dot_rows_f32"
                    );
                }
            }
        }
    }
}

#[test]
fn dot_row_multi_empty_and_errors() {
    let d = DType::Q8_0;
    let src = vec![0u8; 34];
    let mut out = [1f32; 3];
    // No activation rows: nothing to do.
    dot_row_multi(d, &src, &[], 32, &mut []).expect("zero rows");
    // Empty rows: the empty dot product is +0.0.
    dot_rows_f32(&[], &[], &mut out).expect("k = 0");
    assert!(out.iter().all(|v| v.to_bits() == 0));
    let quant_err = |r: Result<(), Error>, what: &str| match r {
        Err(Error::Quant(msg)) => assert!(!msg.is_empty(), "{what}"),
        other => panic!("{what}: expected Error::Quant, got {other:?}"),
    };
    let xs = vec![0f32; 3 * 32];
    quant_err(dot_row_multi(d, &src, &xs[1..], 32, &mut out), "short xs");
    quant_err(dot_row_multi(d, &src[1..], &xs, 32, &mut out), "short row");
    quant_err(dot_row_multi(d, &src, &xs, 31, &mut out), "partial block");
    quant_err(
        dot_rows_f32(&[0.0; 32], &xs[..95], &mut out),
        "dot_rows_f32 short",
    );
    quant_err(
        dot_row_generic(d, &src[1..], &xs[..32]).map(|_| ()),
        "generic short",
    );
}

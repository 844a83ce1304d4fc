//! The KV cache's element format ([`KvDtype`]) and its row codec, shared by the CPU backend's
//! store and the tests; the CUDA kernels (kernels/cu/kvfmt.cuh) store the same bytes.
//!
//! A cache row is one position of one layer's K (or V): `width` = n_kv_heads * head_dim values.
//! - `f32`: 4 bytes per value.
//! - `f16`: IEEE binary16, round to nearest even, saturated to +-65504 (the tensor-core
//!   attention's own rounding of f32 K/V, so an f16 cache gives it the same bits as f32).
//! - `bf16`: round to nearest even (NaN kept quiet).
//! - `q8_0`: ggml's Q8_0 arithmetic per 32 values: d = max|x| / 127, q = round(x * (1 / d)),
//!   stored as the row's `width` int8 quants followed by its `width / 32` f16 scales; a value
//!   reads back as q * f16(d).

use crate::error::{Error, Result};
use crate::quant::simd::{f16_to_f32, f32_to_bf16, f32_to_f16};

/// Values per Q8_0 KV block (one f16 scale each).
pub const Q8_BLOCK: usize = 32;

/// The element format of a KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    /// The default: the tensor-core attention computes in f16 (so an f16 cache changes none of
    /// its bits), and it is 10x closer to the reference than bf16 on SmolLM2 (docs/KV_CACHE.md).
    #[default]
    F16,
    Bf16,
    Q8_0,
}

impl KvDtype {
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Q8_0];

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Q8_0 => "q8_0",
        }
    }

    /// Parses `f32`, `f16`, `bf16` or `q8_0` (also `q8`).
    pub fn parse(s: &str) -> Result<KvDtype> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" | "fp16" => Ok(KvDtype::F16),
            "bf16" => Ok(KvDtype::Bf16),
            "q8_0" | "q8" => Ok(KvDtype::Q8_0),
            _ => Err(Error::Input(format!(
                "KV cache type `{s}`: expected f32, f16, bf16 or q8_0"
            ))),
        }
    }

    /// Whether a row of `width` values can be stored (Q8_0 needs whole blocks).
    pub fn check_width(self, width: usize) -> Result<()> {
        if self == KvDtype::Q8_0 && !width.is_multiple_of(Q8_BLOCK) {
            return Err(Error::Input(format!(
                "q8_0 KV cache: a row of {width} values (KV heads x head_dim) is not a multiple \
                 of {Q8_BLOCK}; use --kv-dtype f16 or bf16"
            )));
        }
        Ok(())
    }

    /// Bytes of one row of `width` values.
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            KvDtype::F32 => width * 4,
            KvDtype::F16 | KvDtype::Bf16 => width * 2,
            KvDtype::Q8_0 => width + width / Q8_BLOCK * 2,
        }
    }

    /// Stores `x` (one row) into `out` (`row_bytes(x.len())` bytes).
    pub fn encode(self, x: &[f32], out: &mut [u8]) {
        match self {
            KvDtype::F32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(x) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            KvDtype::F16 => {
                for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&f32_to_f16(v.clamp(-65504.0, 65504.0)).to_le_bytes());
                }
            }
            KvDtype::Bf16 => {
                for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
                }
            }
            KvDtype::Q8_0 => {
                let (qs, scales) = out.split_at_mut(x.len());
                for (b, (blk, sc)) in x
                    .chunks_exact(Q8_BLOCK)
                    .zip(scales.chunks_exact_mut(2))
                    .enumerate()
                {
                    let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    for (q, &v) in qs[b * Q8_BLOCK..].iter_mut().zip(blk) {
                        *q = ((v * id).round() as i8) as u8;
                    }
                    sc.copy_from_slice(&f32_to_f16(d).to_le_bytes());
                }
            }
        }
    }

    /// Reads values `range` of a stored row of `width` values into `out`.
    pub fn decode(self, row: &[u8], width: usize, range: std::ops::Range<usize>, out: &mut [f32]) {
        let u16_at = |i: usize| u16::from_le_bytes([row[2 * i], row[2 * i + 1]]);
        match self {
            KvDtype::F32 => {
                for (o, i) in out.iter_mut().zip(range) {
                    *o = f32::from_le_bytes(row[4 * i..4 * i + 4].try_into().unwrap());
                }
            }
            KvDtype::F16 => {
                for (o, i) in out.iter_mut().zip(range) {
                    *o = f16_to_f32(u16_at(i));
                }
            }
            KvDtype::Bf16 => {
                for (o, i) in out.iter_mut().zip(range) {
                    *o = f32::from_bits((u16_at(i) as u32) << 16);
                }
            }
            KvDtype::Q8_0 => {
                let scales = &row[width..];
                for (o, i) in out.iter_mut().zip(range) {
                    let b = i / Q8_BLOCK;
                    let d = f16_to_f32(u16::from_le_bytes([scales[2 * b], scales[2 * b + 1]]));
                    *o = (row[i] as i8) as f32 * d;
                }
            }
        }
    }

    /// `x` stored and read back: the values attention sees.
    pub fn round_trip(self, x: &[f32]) -> Vec<f32> {
        let mut bytes = vec![0u8; self.row_bytes(x.len())];
        self.encode(x, &mut bytes);
        let mut out = vec![0f32; x.len()];
        self.decode(&bytes, x.len(), 0..x.len(), &mut out);
        out
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<KvDtype> {
        KvDtype::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Vec<f32> {
        (0..64)
            .map(|i| ((i as f32) * 0.37).sin() * (1.0 + i as f32))
            .collect()
    }

    #[test]
    fn every_format_reads_back_within_its_precision() {
        let x = row();
        for (dt, rel) in [
            (KvDtype::F32, 0.0),
            (KvDtype::F16, 1.0 / 2048.0),
            (KvDtype::Bf16, 1.0 / 256.0),
        ] {
            let y = dt.round_trip(&x);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= a.abs() * rel, "{dt}: {a} -> {b}");
            }
        }
        // Q8_0: an error of at most half a step (max|x| / 254) of the value's block, plus the
        // f16 rounding of the scale.
        let y = KvDtype::Q8_0.round_trip(&x);
        for (blk, yb) in x.chunks(32).zip(y.chunks(32)) {
            let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (a, b) in blk.iter().zip(yb) {
                assert!(
                    (a - b).abs() <= amax / 254.0 * 1.01 + amax / 1024.0,
                    "{a} -> {b}"
                );
            }
        }
        assert_eq!(KvDtype::Q8_0.round_trip(&[0.0; 32]), vec![0.0; 32]);
    }

    #[test]
    fn rows_have_the_stated_sizes_and_layouts() {
        assert_eq!(KvDtype::F32.row_bytes(64), 256);
        assert_eq!(KvDtype::Bf16.row_bytes(64), 128);
        assert_eq!(KvDtype::Q8_0.row_bytes(64), 68);
        // f16 saturates, bf16 keeps the range.
        assert_eq!(
            KvDtype::F16.round_trip(&[1e6, -1e6]),
            vec![65504.0, -65504.0]
        );
        assert_eq!(KvDtype::Bf16.round_trip(&[1e6])[0], 999_424.0);
        // Q8_0: quants first, then the f16 scales.
        let mut x = vec![0f32; 64];
        x[0] = 127.0;
        x[33] = -2.0;
        let mut b = vec![0u8; 68];
        KvDtype::Q8_0.encode(&x, &mut b);
        assert_eq!(b[0] as i8, 127);
        assert_eq!(b[33] as i8, -127);
        assert_eq!(f16_to_f32(u16::from_le_bytes([b[64], b[65]])), 1.0);
        let mut part = [0f32; 2];
        KvDtype::Q8_0.decode(&b, 64, 32..34, &mut part);
        assert_eq!(part[1], -127.0 * f16_to_f32(f32_to_f16(2.0 / 127.0)));
    }

    #[test]
    fn names_parse_and_bad_ones_are_clear_errors() {
        for dt in KvDtype::ALL {
            assert_eq!(KvDtype::parse(dt.name()).unwrap(), dt);
        }
        assert_eq!(KvDtype::default(), KvDtype::F16);
        let e = KvDtype::parse("int4").unwrap_err().to_string();
        assert!(e.contains("int4") && e.contains("q8_0"), "{e}");
        assert!(KvDtype::Q8_0.check_width(48).is_err());
        assert!(KvDtype::Q8_0.check_width(64).is_ok());
    }
}

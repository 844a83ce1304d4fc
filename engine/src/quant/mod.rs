//! Block formats: the ggml tensor types, their block geometry, reference dequantization
//! and quantization from f32 (for synthetic models and tests).
//!
//! Dequantization is exact f32 output of the format's definition (the same values `gguf.quants`
//! produces), so a model stored quantized and the same model stored as the dequantized f32 give
//! bitwise-identical products on the CPU reference backend.

use crate::error::{Error, Result};

/// ggml tensor types, numbered as in the GGUF format.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_XS,
    BF16,
}

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

impl DType {
    /// All types this crate knows.
    pub const ALL: [DType; 14] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_XS,
        DType::BF16,
    ];

    /// The GGUF / ggml type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::IQ4_XS => 23,
            DType::BF16 => 30,
        }
    }

    /// The type for a GGUF / ggml type id, if supported.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.ggml_id() == id)
    }

    /// Lower-case name as used by llama.cpp (`q4_k`, `f16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2_K => "q2_k",
            DType::Q3_K => "q3_k",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
            DType::IQ4_XS => "iq4_xs",
            DType::BF16 => "bf16",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::IQ4_XS => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::IQ4_XS => 136,
        }
    }

    /// Bytes of `n` elements, checked: `None` if `n` is not a multiple of the block size or
    /// the byte count overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if n % bs != 0 {
            return None;
        }
        (n / bs).checked_mul(self.block_bytes() as u64)
    }

    /// True for the types stored as plain floats.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let l = s.to_ascii_lowercase();
        DType::ALL
            .into_iter()
            .find(|d| d.name() == l)
            .ok_or_else(|| Error::Input(format!("unknown tensor type `{s}`")))
    }
}

/// Checks that `src` holds exactly the bytes of `n` elements of `dtype`.
pub(crate) fn check_len(dtype: DType, src: &[u8], n: usize) -> Result<()> {
    match dtype.bytes_for(n as u64) {
        Some(b) if b == src.len() as u64 => Ok(()),
        Some(b) => Err(Error::Quant(format!(
            "{dtype}: {n} elements need {b} bytes, got {}",
            src.len()
        ))),
        None => Err(Error::Quant(format!(
            "{dtype}: {n} elements is not a multiple of the block size {}",
            dtype.block_size()
        ))),
    }
}

/// Dequantizes `dst.len()` elements of `dtype` from `src` into `dst`.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_len(dtype, src, dst.len())?;
    match dtype {
        DType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            Ok(())
        }
        DType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
            Ok(())
        }
        DType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
            Ok(())
        }
        other => Err(Error::Unsupported(format!(
            "dequantization of {other} is not implemented yet"
        ))),
    }
}

/// Quantizes `src` (a multiple of the block size) to `dtype`, returning the bytes.
pub fn quantize(dtype: DType, src: &[f32]) -> Result<Vec<u8>> {
    match dtype {
        DType::F32 => Ok(src.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::F16 => Ok(src
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect()),
        DType::BF16 => Ok(src
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect()),
        other => Err(Error::Unsupported(format!(
            "quantization to {other} is not implemented yet"
        ))),
    }
}

//! Block formats: the ggml tensor types, their block geometry, reference dequantization
//! and quantization from f32 (for synthetic models and tests).
//!
//! Dequantization is exact f32 output of the format's definition (the same values `gguf.quants`
//! produces), so a model stored quantized and the same model stored as the dequantized f32 give
//! bitwise-identical products on the CPU reference backend.

use crate::error::{Error, Result};

/// Evaluates `$body` with `$codec` bound to the whole-block dequantizer of `$dtype`. The codecs
/// are `#[inline(always)]` and called directly, so each is compiled into the (multiversioned)
/// function that uses this macro, with that function's instruction set.
macro_rules! with_codec {
    ($dtype:expr, $codec:ident => $body:expr) => {{
        use $crate::quant::{fp8, iq4_xs, kquants, legacy, simple};
        match $dtype {
            DType::F32 => {
                let $codec = simple::dequant_f32;
                $body
            }
            DType::F16 => {
                let $codec = simple::dequant_f16;
                $body
            }
            DType::BF16 => {
                let $codec = simple::dequant_bf16;
                $body
            }
            DType::Q4_0 => {
                let $codec = legacy::dequant_q4_0;
                $body
            }
            DType::Q4_1 => {
                let $codec = legacy::dequant_q4_1;
                $body
            }
            DType::Q5_0 => {
                let $codec = legacy::dequant_q5_0;
                $body
            }
            DType::Q5_1 => {
                let $codec = legacy::dequant_q5_1;
                $body
            }
            DType::Q8_0 => {
                let $codec = legacy::dequant_q8_0;
                $body
            }
            DType::Q2_K => {
                let $codec = kquants::dequant_q2_k;
                $body
            }
            DType::Q3_K => {
                let $codec = kquants::dequant_q3_k;
                $body
            }
            DType::Q4_K => {
                let $codec = kquants::dequant_q4_k;
                $body
            }
            DType::Q5_K => {
                let $codec = kquants::dequant_q5_k;
                $body
            }
            DType::Q6_K => {
                let $codec = kquants::dequant_q6_k;
                $body
            }
            DType::IQ4_XS => {
                let $codec = iq4_xs::dequant_iq4_xs;
                $body
            }
            DType::FP8 => {
                let $codec = fp8::dequant_fp8;
                $body
            }
            DType::NVFP4 => {
                let $codec = fp8::dequant_nvfp4;
                $body
            }
        }
    }};
}

mod dot;
#[cfg(target_arch = "x86_64")]
mod dot_avx2;
pub mod fp8;
mod iq4_xs;
mod kquants;
mod kquants_quantize;
mod lanes;
mod legacy;
pub mod repack;
pub(crate) mod simd;
mod simple;

pub use dot::{
    DOT_LANES, dot_f32, dot_f32_generic, dot_row, dot_row_generic, dot_row_multi, dot_rows_f32,
};

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
    /// e4m3 weights with an f32 scale per 32 elements of a row (quant/fp8.rs): HF `fp8`
    /// block-scaled checkpoints at load. Not a GGUF type.
    FP8,
    /// e2m1 weights with an f32 scale per 16 elements (quant/fp8.rs): ModelOpt NVFP4
    /// checkpoints at load. Not a GGUF type.
    NVFP4,
}

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

impl DType {
    /// The types memra holds that have no GGUF id: loaded from safetensors checkpoints only.
    pub const HF_ONLY: [DType; 2] = [DType::FP8, DType::NVFP4];

    /// Every GGUF type this crate knows (see also [`Self::HF_ONLY`]).
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

    /// The GGUF / ggml type id; `None` for [`Self::HF_ONLY`] types.
    pub fn gguf_id(self) -> Option<u32> {
        (!DType::HF_ONLY.contains(&self)).then(|| self.ggml_id())
    }

    /// The GGUF / ggml type id (memra-internal ids above 1000 for [`Self::HF_ONLY`] types, which
    /// no GGUF file may hold: [`Self::from_ggml_id`] never returns them).
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::FP8 => 1001,
            DType::NVFP4 => 1002,
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
            DType::FP8 => "fp8",
            DType::NVFP4 => "nvfp4",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => {
                QK_K
            }
            DType::FP8 => fp8::FP8_BLOCK,
            DType::NVFP4 => fp8::NVFP4_BLOCK,
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
            DType::FP8 => fp8::FP8_BLOCK_BYTES,
            DType::NVFP4 => fp8::NVFP4_BLOCK_BYTES,
        }
    }

    /// Bytes of `n` elements, checked: `None` if `n` is not a multiple of the block size or
    /// the byte count overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
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
            .chain(DType::HF_ONLY)
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
///
/// `src` must hold exactly the bytes of `dst.len()` elements (a whole number of blocks); several
/// consecutive rows can be dequantized in one call. The values are exactly those of
/// `gguf.quants.dequantize` (gguf-py 0.19).
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_len(dtype, src, dst.len())?;
    dequantize_unchecked(dtype, src, dst);
    Ok(())
}

simd::multiversion! {
    /// [`dequantize_row`] after the length check.
    pub(super) fn dequantize_unchecked(dtype: DType, src: &[u8], dst: &mut [f32]) {
        with_codec!(dtype, codec => codec(src, dst))
    }
}

/// Dequantizes `rows` rows of `cols` elements each, stored back to back in `src`, into `dst`
/// (row-major, `rows * cols` values). Errors if `cols` is not a multiple of the block size or
/// the lengths do not match.
pub fn dequantize_rows_into(
    dtype: DType,
    src: &[u8],
    rows: usize,
    cols: usize,
    dst: &mut [f32],
) -> Result<()> {
    if !cols.is_multiple_of(dtype.block_size()) {
        return Err(Error::Quant(format!(
            "{dtype}: row length {cols} is not a multiple of the block size {}",
            dtype.block_size()
        )));
    }
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Quant(format!("{dtype}: {rows} x {cols} elements overflow")))?;
    if dst.len() != n {
        return Err(Error::Quant(format!(
            "{dtype}: output holds {} values, {rows} x {cols} = {n} needed",
            dst.len()
        )));
    }
    dequantize_row(dtype, src, dst)
}

/// Types [`quantize`] can produce (also the [`DType::HF_ONLY`] ones, with per-row-block scales).
pub const QUANTIZABLE: [DType; 11] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

/// Quantizes `src` (a multiple of the block size) to `dtype`, returning the bytes.
///
/// F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 give exactly the bytes of `gguf.quants.quantize`;
/// Q4_K, Q5_K and Q6_K follow llama.cpp's reference quantizers (no gguf-py counterpart). Q2_K,
/// Q3_K and IQ4_XS are not supported (`Error::Unsupported`).
pub fn quantize(dtype: DType, src: &[f32]) -> Result<Vec<u8>> {
    if !src.len().is_multiple_of(dtype.block_size()) {
        return Err(Error::Quant(format!(
            "{dtype}: cannot quantize {} values, not a multiple of the block size {}",
            src.len(),
            dtype.block_size()
        )));
    }
    Ok(match dtype {
        DType::F32 => simple::quant_f32(src),
        DType::F16 => simple::quant_f16(src),
        DType::BF16 => simple::quant_bf16(src),
        DType::Q4_0 => legacy::quant_q4_0(src),
        DType::Q4_1 => legacy::quant_q4_1(src),
        DType::Q5_0 => legacy::quant_q5_0(src),
        DType::Q5_1 => legacy::quant_q5_1(src),
        DType::Q8_0 => legacy::quant_q8_0(src),
        DType::Q4_K => kquants_quantize::quant_q4_k(src),
        DType::Q5_K => kquants_quantize::quant_q5_k(src),
        DType::Q6_K => kquants_quantize::quant_q6_k(src),
        DType::FP8 => fp8::quant_fp8(src),
        DType::NVFP4 => fp8::quant_nvfp4(src),
        DType::Q2_K | DType::Q3_K | DType::IQ4_XS => {
            return Err(Error::Unsupported(format!(
                "quantization to {dtype} is not implemented (dequantization is)"
            )));
        }
    })
}

//! GGUF llama files store the q/k projection rows (and biases) of each head permuted for
//! adjacent-pair RoPE; memra keeps the Hugging Face order (half rotation). The one place that
//! converts between the two orders (loader, converters, synthetic models).

use super::{Arch, Role, def};
use crate::error::{Error, Result};
use crate::quant::DType;

/// Whether GGUF files of `arch` store `role`'s rows in the permuted order.
pub fn gguf_permuted(arch: Arch, role: Role) -> bool {
    def(arch).gguf_qk_permuted && role.is_qk()
}

/// Maps HF row `r` of a q or k projection (heads of `head_dim` rows) to its GGUF row.
/// Within a head, HF row `j * half + i` is GGUF row `2 * i + j` (j in 0..2, i in 0..half).
pub fn gguf_row_of_hf_row(r: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let (h, within) = (r / head_dim, r % head_dim);
    let (j, i) = (within / half, within % half);
    h * head_dim + 2 * i + j
}

/// Bytes of one permuted unit of a `dtype` tensor of `shape`: a row of a matrix, one element of
/// a vector (bias). Fails unless the units form whole heads of `head_dim`.
pub fn qk_unit_bytes(shape: &[usize], dtype: DType, head_dim: usize) -> Result<usize> {
    let (units, len) = match shape {
        [n] => (*n, 1),
        [rows, cols] => (*rows, *cols),
        _ => return Err(Error::Weights(format!("q/k tensor of shape {shape:?}"))),
    };
    let unit = dtype.bytes_for(len as u64).unwrap_or(0) as usize;
    if unit == 0 || head_dim == 0 || !units.is_multiple_of(head_dim) {
        return Err(Error::Weights(format!(
            "{dtype} q/k tensor of shape {shape:?}: {units} rows are not whole heads of {head_dim}"
        )));
    }
    Ok(unit)
}

/// Reorders GGUF-order q/k units (`unit` bytes each) into HF order.
pub fn unpermute_qk_rows(data: &[u8], unit: usize, head_dim: usize) -> Vec<u8> {
    let rows = data.len() / unit.max(1);
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        let g = gguf_row_of_hf_row(r, head_dim);
        out.extend_from_slice(&data[g * unit..(g + 1) * unit]);
    }
    out
}

/// Reorders HF-order q/k units into the GGUF order (inverse of [`unpermute_qk_rows`]).
pub fn permute_qk_rows(data: &[u8], unit: usize, head_dim: usize) -> Vec<u8> {
    let rows = data.len() / unit.max(1);
    let mut out = vec![0u8; rows * unit];
    for r in 0..rows {
        let g = gguf_row_of_hf_row(r, head_dim);
        out[g * unit..(g + 1) * unit].copy_from_slice(&data[r * unit..(r + 1) * unit]);
    }
    out
}

/// `data` (a `dtype` tensor of `shape` in GGUF order) in HF order.
pub fn qk_to_hf(data: &[u8], shape: &[usize], dtype: DType, head_dim: usize) -> Result<Vec<u8>> {
    let unit = qk_unit_bytes(shape, dtype, head_dim)?;
    Ok(unpermute_qk_rows(data, unit, head_dim))
}

/// `data` (a `dtype` tensor of `shape` in HF order) in GGUF order.
pub fn qk_to_gguf(data: &[u8], shape: &[usize], dtype: DType, head_dim: usize) -> Result<Vec<u8>> {
    let unit = qk_unit_bytes(shape, dtype, head_dim)?;
    Ok(permute_qk_rows(data, unit, head_dim))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_inverts() {
        let head_dim = 8;
        let data: Vec<u8> = (0..(2 * head_dim * 3) as u8).collect();
        let p = permute_qk_rows(&data, 3, head_dim);
        assert_ne!(p, data);
        assert_eq!(unpermute_qk_rows(&p, 3, head_dim), data);
        // HF rows 0 and 4 (first element of each half) are adjacent in GGUF order.
        assert_eq!(gguf_row_of_hf_row(0, 8), 0);
        assert_eq!(gguf_row_of_hf_row(4, 8), 1);
        assert_eq!(gguf_row_of_hf_row(1, 8), 2);
    }

    #[test]
    fn units_of_matrices_and_vectors() {
        assert_eq!(qk_unit_bytes(&[16, 64], DType::F32, 8).unwrap(), 256);
        assert_eq!(qk_unit_bytes(&[16], DType::F32, 8).unwrap(), 4);
        assert_eq!(qk_unit_bytes(&[16, 64], DType::Q8_0, 8).unwrap(), 68);
        assert!(qk_unit_bytes(&[12, 64], DType::F32, 8).is_err());
        let v: Vec<u8> = (0..64).collect();
        let g = qk_to_gguf(&v, &[16], DType::F32, 8).unwrap();
        assert_eq!(qk_to_hf(&g, &[16], DType::F32, 8).unwrap(), v);
    }
}

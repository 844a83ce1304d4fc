//! Backend-agnostic tensors as loaded from a model file: bytes in their stored block format.

use std::ops::Deref;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::quant::DType;

/// Tensor bytes: a range of a memory-mapped file, or an owned buffer (converted or synthetic data).
#[derive(Clone)]
pub enum Bytes {
    Mapped {
        map: Arc<memmap2::Mmap>,
        start: usize,
        len: usize,
    },
    Owned(Arc<Vec<u8>>),
}

impl Bytes {
    pub fn owned(v: Vec<u8>) -> Self {
        Bytes::Owned(Arc::new(v))
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, start, len } => &map[*start..*start + *len],
            Bytes::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({} bytes)", self.len())
    }
}

/// A named tensor. `shape` is outermost first (numpy / PyTorch order): a weight matrix of a
/// linear layer is `[out_features, in_features]`, each row contiguous in the stored format.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Bytes,
}

impl Tensor {
    /// Builds a tensor, checking that the byte length matches shape and dtype.
    pub fn new(
        name: impl Into<String>,
        dtype: DType,
        shape: Vec<usize>,
        data: Bytes,
    ) -> Result<Self> {
        let name = name.into();
        let n = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
            .ok_or_else(|| Error::Weights(format!("{name}: element count overflows")))?;
        let inner = *shape.last().unwrap_or(&1) as u64;
        let row_bytes = dtype.bytes_for(inner).ok_or_else(|| {
            Error::Weights(format!(
                "{name}: row length {inner} is not a multiple of the {dtype} block size {}",
                dtype.block_size()
            ))
        })?;
        let want = row_bytes
            .checked_mul(n / inner.max(1))
            .ok_or_else(|| Error::Weights(format!("{name}: byte size overflows")))?;
        if want != data.len() as u64 {
            return Err(Error::Weights(format!(
                "{name}: {dtype} {shape:?} needs {want} bytes, got {}",
                data.len()
            )));
        }
        Ok(Tensor {
            name,
            dtype,
            shape,
            data,
        })
    }

    /// An f32 tensor from values.
    pub fn from_f32(name: impl Into<String>, shape: Vec<usize>, values: &[f32]) -> Result<Self> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(name, DType::F32, shape, Bytes::owned(bytes))
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of rows (product of all but the last dimension) and the row length.
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = *self.shape.last().unwrap_or(&1);
        (self.numel() / cols.max(1), cols)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        let (_, cols) = self.rows_cols();
        cols / self.dtype.block_size() * self.dtype.block_bytes()
    }

    /// The stored bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// A 2-D tensor `[rows.len(), cols]` of this tensor's rows `rows`, in that order (stored
    /// bytes copied, any type); an error naming the tensor for a row past its end.
    pub fn take_rows(&self, name: impl Into<String>, rows: &[usize]) -> Result<Tensor> {
        let (n, cols) = self.rows_cols();
        let mut data = Vec::with_capacity(rows.len() * self.row_bytes());
        for &r in rows {
            if r >= n {
                return Err(Error::Weights(format!(
                    "{}: row {r} of {n} does not exist",
                    self.name
                )));
            }
            data.extend_from_slice(self.row(r));
        }
        Tensor::new(name, self.dtype, vec![rows.len(), cols], Bytes::owned(data))
    }

    /// The same bytes as a tensor of `shape` (the same element count; rows of whole blocks).
    pub fn reshaped(&self, shape: Vec<usize>) -> Result<Tensor> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(Error::Weights(format!(
                "{}: shape {:?} cannot be viewed as {shape:?}",
                self.name, self.shape
            )));
        }
        Tensor::new(self.name.clone(), self.dtype, shape, self.data.clone())
    }

    /// All values dequantized to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.numel()];
        crate::quant::dequantize_row(self.dtype, &self.data, &mut out)
            .map_err(|e| Error::Weights(format!("{}: {e}", self.name)))?;
        Ok(out)
    }
}

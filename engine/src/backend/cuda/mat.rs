//! Weight matrices on the device and the one product over them. Everything that knows a
//! matrix's device layout lives here: [`upload_mat`] (the only constructor of [`Mat`]),
//! [`matmul`] (the only product) and [`embed`] (row lookup of the embedding table). Repacked
//! layouts and new product kernels go in behind these three functions.

use cudarc::driver::CudaSlice;

use super::Gpu;
use crate::error::Result;
use crate::quant::DType;
use crate::weights::Tensor;

/// A weight matrix on the device, in its stored block format.
pub struct Mat {
    data: CudaSlice<u8>,
    dtype: DType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// Uploads the 2-D tensor `t`.
pub fn upload_mat(g: &Gpu, t: &Tensor) -> Result<Mat> {
    let (rows, cols) = t.rows_cols();
    Ok(Mat {
        data: g.upload(&t.data)?,
        dtype: t.dtype,
        rows,
        cols,
        row_bytes: t.row_bytes(),
    })
}

/// `y[r][n] = dot(W[n], x[r])` for `m` rows of f32 activations at device addresses `x`, `y`.
pub fn matmul(g: &Gpu, w: &Mat, x: u64, y: u64, m: usize) -> Result<()> {
    g.matmul(
        w.dtype,
        g.ptr(&w.data),
        w.row_bytes,
        x,
        y,
        m,
        w.rows,
        w.cols,
    )
}

/// `y[r] = dequantize(table[tokens[r]])` for `m` rows (`tokens`: u32 device array).
pub fn embed(g: &Gpu, table: &Mat, tokens: u64, y: u64, m: usize) -> Result<()> {
    g.embed(
        table.dtype,
        g.ptr(&table.data),
        table.row_bytes,
        tokens,
        y,
        m,
        table.cols,
    )
}

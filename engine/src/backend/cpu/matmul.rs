//! Matrix products `out[m][n] = dot(W[n], x[m])` over weights in any stored block format.
//!
//! Each weight row is dequantized to exact f32 (fused into the dot for one input row, or once
//! and reused for several: identical bits) and dotted with each input row in the fixed order of
//! [`crate::quant::dot_f32`]. Threads split the output features only, so neither the thread count nor
//! the number of rows M can change a single output bit; and a quantized weight gives the same bits
//! as its dequantized f32 copy.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::quant::{dot_row, dot_row_multi};
use crate::weights::Tensor;

/// Output features per parallel task.
const ROWS_PER_TASK: usize = 16;

/// `x` holds `m` rows of `w.cols`; writes `m` rows of `w.rows` into `out`.
pub fn matmul(
    pool: &rayon::ThreadPool,
    w: &Tensor,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) -> Result<()> {
    let (n, _) = w.rows_cols();
    matmul_rows(pool, w, 0..n, x, m, out)
}

/// [`matmul`] with the weight rows `rows` of `w` (all dimensions but the last flattened: one
/// expert's matrix of a `[n_experts, out, in]` stack) as the matrix.
pub fn matmul_rows(
    pool: &rayon::ThreadPool,
    w: &Tensor,
    rows: std::ops::Range<usize>,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) -> Result<()> {
    let (total, k) = w.rows_cols();
    let (first, n) = (rows.start, rows.len());
    if x.len() != m * k || out.len() != m * n || rows.end > total {
        return Err(Error::Backend {
            backend: "cpu".into(),
            what: format!(
                "matmul {} rows {rows:?} of {total}: input has {} values, output {}, expected {m} x {k} -> {m} x {n}",
                w.name,
                x.len(),
                out.len()
            ),
        });
    }
    // Row-major `[n][m]`; for m = 1 that is the output itself.
    let mut tmp = Vec::new();
    let t: &mut [f32] = if m == 1 {
        out
    } else {
        tmp.resize(n * m, 0f32);
        &mut tmp
    };
    let res: Result<()> = pool.install(|| {
        t.par_chunks_mut(ROWS_PER_TASK * m)
            .enumerate()
            .try_for_each(|(ci, chunk)| {
                for (j, out) in chunk.chunks_mut(m).enumerate() {
                    let r = first + ci * ROWS_PER_TASK + j;
                    if m == 1 {
                        out[0] = dot_row(w.dtype, w.row(r), x)?;
                    } else {
                        dot_row_multi(w.dtype, w.row(r), x, k, out)?;
                    }
                }
                Ok(())
            })
    });
    res?;
    if m > 1 {
        for r in 0..n {
            for mi in 0..m {
                out[mi * n + r] = tmp[r * m + mi];
            }
        }
    }
    Ok(())
}

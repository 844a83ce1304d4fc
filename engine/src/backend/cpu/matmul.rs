//! Matrix products `out[m][n] = dot(W[n], x[m])` over weights in any stored block format.
//!
//! Each weight row is dequantized to exact f32 (or fused into the dot with identical bits) and dotted with each input row in the fixed order
//! of [`super::ops::dot`]. Threads split the output features only, so neither the thread count nor
//! the number of rows M can change a single output bit; and a quantized weight gives the same bits
//! as its dequantized f32 copy.

use rayon::prelude::*;

use super::ops::dot;
use crate::error::{Error, Result};
use crate::quant::{dequantize_row, dot_row};
use crate::weights::Tensor;

/// Output features per parallel task.
const ROWS_PER_TASK: usize = 16;

/// Up to this many input rows, each product is a fused dequantize-dot (`dot_row`, no row buffer);
/// above it the weight row is dequantized once and reused. Both give identical bits.
const FUSED_MAX_M: usize = 2;

/// `x` holds `m` rows of `w.cols`; returns `m` rows of `w.rows`.
pub fn matmul(pool: &rayon::ThreadPool, w: &Tensor, x: &[f32], m: usize) -> Result<Vec<f32>> {
    let (n, k) = w.rows_cols();
    if x.len() != m * k {
        return Err(Error::Backend {
            backend: "cpu".into(),
            what: format!(
                "matmul {}: input has {} values, expected {m} x {k}",
                w.name,
                x.len()
            ),
        });
    }
    let mut t = vec![0f32; n * m];
    let res: Result<()> = pool.install(|| {
        t.par_chunks_mut(ROWS_PER_TASK * m)
            .enumerate()
            .try_for_each(|(ci, chunk)| {
                let mut buf = vec![0f32; if m > FUSED_MAX_M { k } else { 0 }];
                for (j, out) in chunk.chunks_mut(m).enumerate() {
                    let r = ci * ROWS_PER_TASK + j;
                    if m <= FUSED_MAX_M {
                        for (mi, o) in out.iter_mut().enumerate() {
                            *o = dot_row(w.dtype, w.row(r), &x[mi * k..(mi + 1) * k])?;
                        }
                        continue;
                    }
                    dequantize_row(w.dtype, w.row(r), &mut buf)?;
                    for (mi, o) in out.iter_mut().enumerate() {
                        *o = dot(&buf, &x[mi * k..(mi + 1) * k]);
                    }
                }
                Ok(())
            })
    });
    res?;
    if m == 1 {
        return Ok(t);
    }
    let mut out = vec![0f32; m * n];
    for r in 0..n {
        for mi in 0..m {
            out[mi * n + r] = t[r * m + mi];
        }
    }
    Ok(out)
}

//! Throughput of the fused dequantize-dot `quant::dot_row` per dtype, next to the portable path
//! `dot_row_generic` (the code before the AVX2 kernels), in G elements/s of weight.
//!
//! Shapes: a 1536 x 576 matrix (SmolLM2-135M's FFN; 1536 x 512 for the k-quants) per dtype, the 49152 x 576 Q8_0 LM head, and
//! `dot_row_multi` (prefill, 16 activation rows). Every benchmark first checks that the fast
//! and the generic path agree bit for bit. Run: `cargo bench -p memra-engine --bench dot`
//! (filter with e.g. `-- q4_1`).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use memra_engine::quant::{
    DType, dot_f32, dot_f32_generic, dot_row, dot_row_generic, dot_row_multi, quantize,
};
use memra_engine::testing::pseudo_normal;

struct Matrix {
    dtype: DType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
}

impl Matrix {
    fn new(dtype: DType, rows: usize, cols: usize) -> Matrix {
        let bytes = quantize(dtype, &pseudo_normal(rows * cols, 7)).expect("quantize");
        Matrix {
            dtype,
            rows,
            cols,
            bytes,
        }
    }

    fn row(&self, r: usize) -> &[u8] {
        let rb = self.bytes.len() / self.rows;
        &self.bytes[r * rb..(r + 1) * rb]
    }

    /// Sum of all row dots with `f` (so no row can be optimized away).
    fn matvec(
        &self,
        x: &[f32],
        f: fn(DType, &[u8], &[f32]) -> memra_engine::error::Result<f32>,
    ) -> f32 {
        (0..self.rows)
            .map(|r| f(self.dtype, self.row(r), x).expect("dot"))
            .sum()
    }
}

fn bench_matvec(c: &mut Criterion, m: &Matrix, label: &str) {
    let x = pseudo_normal(m.cols, 9);
    for r in 0..m.rows {
        let fast = dot_row(m.dtype, m.row(r), &x).expect("dot_row");
        let slow = dot_row_generic(m.dtype, m.row(r), &x).expect("dot_row_generic");
        assert_eq!(fast.to_bits(), slow.to_bits(), "{} row {r}", m.dtype);
    }
    let mut g = c.benchmark_group(format!("dot_row/{label}"));
    g.throughput(Throughput::Elements((m.rows * m.cols) as u64));
    g.bench_function(format!("{}/fast", m.dtype), |b| {
        b.iter(|| m.matvec(black_box(&x), dot_row))
    });
    g.bench_function(format!("{}/generic", m.dtype), |b| {
        b.iter(|| m.matvec(black_box(&x), dot_row_generic))
    });
    g.finish();
}

fn bench_multi(c: &mut Criterion, m: &Matrix, rows: usize) {
    let xs = pseudo_normal(rows * m.cols, 11);
    let mut out = vec![0f32; rows];
    for r in 0..m.rows {
        dot_row_multi(m.dtype, m.row(r), &xs, m.cols, &mut out).expect("dot_row_multi");
        for (i, o) in out.iter().enumerate() {
            let want = dot_row_generic(m.dtype, m.row(r), &xs[i * m.cols..(i + 1) * m.cols])
                .expect("dot_row_generic");
            assert_eq!(o.to_bits(), want.to_bits(), "{} row {r} x {i}", m.dtype);
        }
    }
    let mut g = c.benchmark_group(format!("dot_row_multi/{}x{}x{rows}", m.rows, m.cols));
    g.throughput(Throughput::Elements((m.rows * m.cols * rows) as u64));
    g.bench_function(format!("{}/multi", m.dtype), |b| {
        b.iter(|| {
            let mut s = 0f32;
            for r in 0..m.rows {
                dot_row_multi(m.dtype, m.row(r), black_box(&xs), m.cols, &mut out)
                    .expect("dot_row_multi");
                s += out[0];
            }
            s
        })
    });
    g.bench_function(format!("{}/per_row_fast", m.dtype), |b| {
        b.iter(|| {
            let mut s = 0f32;
            for r in 0..m.rows {
                for x in black_box(&xs).chunks_exact(m.cols) {
                    s += dot_row(m.dtype, m.row(r), x).expect("dot_row");
                }
            }
            s
        })
    });
    g.finish();
}

/// `dot_f32` (dequantized weights times activations, as in attention or the buffered matmul).
fn bench_dot_f32(c: &mut Criterion, rows: usize, cols: usize) {
    let w = pseudo_normal(rows * cols, 3);
    let x = pseudo_normal(cols, 5);
    for r in w.chunks_exact(cols) {
        assert_eq!(dot_f32(r, &x).to_bits(), dot_f32_generic(r, &x).to_bits());
    }
    let mut g = c.benchmark_group(format!("dot_f32/{rows}x{cols}"));
    g.throughput(Throughput::Elements((rows * cols) as u64));
    for (name, f) in [
        ("fast", dot_f32 as fn(&[f32], &[f32]) -> f32),
        ("generic", dot_f32_generic),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                w.chunks_exact(cols)
                    .map(|r| f(r, black_box(&x)))
                    .sum::<f32>()
            })
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    for d in [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::F16,
        DType::BF16,
        DType::F32,
    ] {
        // K-quant rows hold whole 256-element super-blocks: 512 columns instead of 576.
        let cols = if d.block_size() == 256 { 512 } else { 576 };
        bench_matvec(c, &Matrix::new(d, 1536, cols), &format!("1536x{cols}"));
    }
    bench_matvec(c, &Matrix::new(DType::Q8_0, 49152, 576), "49152x576");
    bench_multi(c, &Matrix::new(DType::Q4_1, 1536, 576), 16);
    bench_dot_f32(c, 1536, 576);
}

criterion_group! {
    name = dot;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(dot);

//! Throughput of the load-time repack into the GPU products' tile layout (`quant::repack::repack`),
//! in MB/s of GGUF bytes read, on an expert stack's shape: 32 experts of 512 x 2048 (qwen3-next's
//! gate / up; the down stacks are 2048 x 512). The CUDA load repacks every product weight through
//! it (engine/src/backend/cuda/mat.rs), so a model's load time is its bytes over this rate.
//! Run: `cargo bench -p memra-engine --bench repack` (filter with e.g. `-- q4_k`).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use memra_engine::quant::DType;
use memra_engine::quant::repack::repack;
use memra_engine::testing::pseudo_bytes;

fn bench(c: &mut Criterion) {
    let (rows, cols) = (32 * 512, 2048);
    let mut g = c.benchmark_group("repack");
    g.measurement_time(Duration::from_secs(4));
    g.sample_size(10);
    for dtype in [
        DType::Q4_K,
        DType::Q6_K,
        DType::Q8_0,
        DType::Q5_0,
        DType::F16,
    ] {
        let rb = dtype.bytes_for(cols as u64).expect("whole blocks") as usize;
        let src = pseudo_bytes(rows * rb, 7);
        g.throughput(Throughput::Bytes(src.len() as u64));
        g.bench_function(format!("{dtype}"), |b| {
            b.iter(|| repack(dtype, black_box(&src), rows, cols).expect("repack"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

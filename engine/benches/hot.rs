//! CPU hot paths outside the products (issue 13): dequantizing one row per format, the sampler
//! over a 49k vocabulary (greedy and top-k/top-p/temperature), the tokenizer (encode and decode
//! of a paragraph) and opening a GGUF file (header, metadata and tensor table). The tokenizer
//! and GGUF cases read the SmolLM2 file named by `MEMRA_TEST_MODEL` (tools/fetch-models.sh)
//! and are left out, with a message, when it is not set.
//! Run: `cargo bench -p memra-engine --bench hot` (filter with e.g. `-- sample`).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use memra_engine::formats::gguf::Gguf;
use memra_engine::quant::{DType, dequantize_row, quantize};
use memra_engine::sampling::{SamplingParams, sample};
use memra_engine::testing::pseudo_normal;
use memra_engine::tokenizer::Tokenizer;

fn dequant(c: &mut Criterion) {
    let cols = 4096;
    let mut g = c.benchmark_group("dequantize_row");
    g.throughput(Throughput::Elements(cols as u64));
    for dtype in [
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        let Ok(row) = quantize(dtype, &pseudo_normal(cols, 3)) else {
            continue; // no quantizer for this type
        };
        let mut out = vec![0f32; cols];
        g.bench_function(dtype.name(), |b| {
            b.iter(|| dequantize_row(dtype, black_box(&row), &mut out).expect("dequantize"))
        });
    }
    g.finish();
}

fn sampler(c: &mut Criterion) {
    let vocab = 49152;
    let logits: Vec<f32> = pseudo_normal(vocab, 5).iter().map(|x| x * 3.0).collect();
    let history: Vec<u32> = (0..256).map(|i| (i * 37 % vocab) as u32).collect();
    let mut g = c.benchmark_group("sample");
    g.throughput(Throughput::Elements(vocab as u64));
    let cases = [
        ("greedy", SamplingParams::default()),
        (
            "temperature_top_k_top_p",
            SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.9,
                seed: 7,
                ..SamplingParams::default()
            },
        ),
        (
            "temperature_full_vocab",
            SamplingParams {
                temperature: 0.7,
                seed: 7,
                ..SamplingParams::default()
            },
        ),
        (
            "penalties",
            SamplingParams {
                temperature: 0.7,
                repetition_penalty: 1.1,
                presence_penalty: 0.5,
                frequency_penalty: 0.2,
                seed: 7,
                ..SamplingParams::default()
            },
        ),
    ];
    for (name, p) in cases {
        let mut pos = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                pos += 1;
                sample(black_box(&logits), &history, &p, pos)
            })
        });
    }
    g.finish();
}

/// The model file for the tokenizer and GGUF cases, when there is one.
fn model() -> Option<PathBuf> {
    let p = memra_engine::settings::var_os("MEMRA_TEST_MODEL").map(PathBuf::from);
    if p.is_none() {
        eprintln!("MEMRA_TEST_MODEL is not set: the tokenizer and gguf_open cases are left out");
    }
    p
}

fn tokenizer(c: &mut Criterion) {
    let Some(path) = model() else { return };
    let gguf = Gguf::open(&path).expect("open the model");
    let tok = Tokenizer::from_gguf(&gguf).expect("its tokenizer");
    let text =
        "The quick brown fox jumps over the lazy dog. Sphinx of black quartz, judge my vow! \
                fn main() { println!(\"{}\", 2 + 2); } -- Ünïcödé, 日本語のテキスト, and emoji 🦀. "
            .repeat(8);
    let ids = tok.encode(&text, false).expect("encode");
    let mut g = c.benchmark_group("tokenizer");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("encode", |b| {
        b.iter(|| tok.encode(black_box(&text), false).expect("encode"))
    });
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("decode", |b| {
        b.iter(|| tok.decode(black_box(&ids)).expect("decode"))
    });
    g.finish();
}

fn gguf_open(c: &mut Criterion) {
    let Some(path) = model() else { return };
    c.bench_function("gguf_open", |b| {
        b.iter(|| Gguf::open(black_box(&path)).expect("open"))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    targets = dequant, sampler, tokenizer, gguf_open
}
criterion_main!(benches);

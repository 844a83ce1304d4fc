//! `synth --dtype fp8|nvfp4 --format hf` and `convert --dtype fp8|nvfp4`: HF checkpoints whose
//! matrices reopen as FP8 / NVFP4 within their quantization step of the synthetic values, the
//! embedding in BF16, independent of the thread count; refused as GGUF; `convert --to gguf` of
//! such a folder writes the matrices as F16 of their exact values.

use memra_bench::convert::{ConvertArgs, convert_gguf_to_hf};
use memra_bench::generate::tensor_values;
use memra_bench::plan::{SynthDType, plan};
use memra_bench::shapes::Shape;
use memra_bench::synth::{Format, SynthArgs, TokenizerSource, synth};
use memra_bench::to_gguf::{ToGgufArgs, convert_hf_to_gguf};
use memra_engine::formats::safetensors::HfModel;
use memra_engine::quant::DType;

fn args(shape: Shape, dtype: SynthDType, out: std::path::PathBuf) -> SynthArgs {
    let tokenizer = TokenizerSource::None { vocab: 256 };
    SynthArgs {
        seed: 3,
        format: Format::Hf,
        ..SynthArgs::new(shape, dtype, out, tokenizer)
    }
}

/// Largest |dequantized - synthetic| over the largest |synthetic| of each tensor.
fn check(m: &HfModel, sd: SynthDType, seed: u64, step: f32) {
    let want = sd.checkpoint_type().unwrap();
    let mut quantized = 0;
    for t in plan(&m.config, sd) {
        let name = t.hf_name();
        let got = match t.role.is_experts() {
            true => memra_engine::loader::hf_expert_stack(m, &name, t.shape[0]),
            false => m.tensor(&name),
        };
        let got = got.unwrap().unwrap();
        assert_eq!(got.dtype, t.dtype, "{name}");
        assert_eq!(got.shape, t.shape, "{name}");
        if t.dtype != want {
            continue;
        }
        quantized += 1;
        let (a, b) = (got.to_f32().unwrap(), tensor_values(seed, &t));
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(err <= step * amax, "{name}: {err} of {amax}");
    }
    assert!(quantized >= 14, "{quantized} quantized tensors");
}

#[test]
fn checkpoints_reopen_within_their_step() {
    let dir = tempfile::tempdir().unwrap();
    for shape in [Shape::TinyLlama, Shape::TinyQwen3, Shape::TinyQwen3Moe] {
        // e4m3: half a step of 2^-3 relative to a 128 x 128 block's largest value; e2m1 with
        // two levels of scales: 1/6 of the tensor's largest value is the coarsest step seen.
        for (sd, step) in [(SynthDType::Fp8, 1.0 / 16.0), (SynthDType::Nvfp4, 0.25)] {
            let out = dir.path().join(format!("{shape}-{}", sd.name()));
            synth(&args(shape, sd, out.clone())).unwrap();
            let m = HfModel::open(&out).unwrap();
            assert!(m.scheme.is_some());
            check(&m, sd, 3, step);
            let embd = m.tensor("model.embed_tokens.weight").unwrap().unwrap();
            assert_eq!(embd.dtype, DType::BF16);
            let w = memra_engine::loader::load_weights(&out).unwrap();
            assert_eq!(w.config, m.config);
        }
    }
}

#[test]
fn checkpoints_do_not_depend_on_threads_and_refuse_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let read = |p: &std::path::Path| std::fs::read(p.join("model.safetensors")).unwrap();
    for sd in [SynthDType::Fp8, SynthDType::Nvfp4] {
        let mut bytes = Vec::new();
        for threads in [1, 3] {
            let out = dir.path().join(format!("{}-{threads}", sd.name()));
            let mut a = args(Shape::TinyLlama, sd, out.clone());
            a.threads = Some(threads);
            synth(&a).unwrap();
            bytes.push(read(&out));
        }
        assert_eq!(bytes[0], bytes[1], "{}", sd.name());
        let mut a = args(Shape::TinyLlama, sd, dir.path().join("x.gguf"));
        a.format = Format::Gguf;
        let e = synth(&a).unwrap_err().to_string();
        assert!(e.contains("--format hf"), "{e}");
    }
}

#[test]
fn convert_writes_checkpoints_that_load() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("m.gguf");
    let mut a = args(Shape::TinyQwen3, SynthDType::F32, gguf.clone());
    a.format = Format::Gguf;
    synth(&a).unwrap();
    let f32w = memra_engine::loader::load_weights(&gguf).unwrap();
    for (d, step) in [(DType::FP8, 1.0 / 16.0), (DType::NVFP4, 0.25)] {
        let out = dir.path().join(d.name());
        let c = ConvertArgs {
            input: gguf.clone(),
            out: out.clone(),
            dtype: Some(d),
            shard_bytes: 1 << 30,
            progress: false,
        };
        convert_gguf_to_hf(&c).unwrap();
        let w = memra_engine::loader::load_weights(&out).unwrap();
        let mut n = 0;
        for ((_, t), (_, u)) in w.iter().zip(f32w.iter()) {
            if t.dtype != d {
                continue;
            }
            n += 1;
            let (x, y) = (t.to_f32().unwrap(), u.to_f32().unwrap());
            let amax = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = x
                .iter()
                .zip(&y)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= step * amax, "{d} {}: {err} of {amax}", t.name);
        }
        assert_eq!(n, 14, "{d}");
        // And back to GGUF: the checkpoint matrices as F16 of their exact values, the rest as is.
        let back = dir.path().join(format!("{}.gguf", d.name()));
        let g = ToGgufArgs {
            input: out.clone(),
            out: back.clone(),
            tokenizer_from: None,
            progress: false,
        };
        convert_hf_to_gguf(&g).unwrap();
        let b = memra_engine::loader::load_weights(&back).unwrap();
        for ((_, t), (_, u)) in w.iter().zip(b.iter()) {
            let want = match t.dtype == d {
                true => DType::F16,
                false => t.dtype,
            };
            assert_eq!(u.dtype, want, "{}", t.name);
            let exact = memra_engine::quant::quantize(want, &t.to_f32().unwrap()).unwrap();
            assert!(u.data[..] == exact[..], "{}", t.name);
        }
    }
}

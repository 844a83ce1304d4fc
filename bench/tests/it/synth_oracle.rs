//! `synth --mtp-oracle`: the streamed file (GGUF and HF folder) loads in the engine, its MTP drafter drafts the
//! model's own greedy picks (>= 90% accepted, tokens identical to plain decoding), its wired
//! tensors equal `oracle_mtp_weights`' (one definition: `oracle_fill`), zero matrices are exact
//! in every type, and the 80B shape plans as the oracle requires.

use std::path::PathBuf;

use memra_bench::generate::tensor_bytes;
use memra_bench::plan::{Init, SynthDType, TensorPlan};
use memra_bench::shapes::Shape;
use memra_bench::synth::{Format, SynthArgs, TokenizerSource, synth, synth_config, synth_plan};
use memra_engine::backend::Device;
use memra_engine::config::Arch;
use memra_engine::generate::{GenRequest, generate};
use memra_engine::loader::load_weights;
use memra_engine::models::random::{OracleFill, oracle_fill, oracle_mtp_weights};
use memra_engine::models::{ModelWeights, Role};
use memra_engine::quant::{DType, dequantize_row};
use memra_engine::spec::generate::{SpecOptions, generate_spec};
use memra_engine::spec::mtp::MtpDrafter;
use memra_engine::testing::small_cpu;

const VOCAB: usize = 256;

fn args(shape: Shape, dtype: SynthDType, out: PathBuf) -> SynthArgs {
    let tokenizer = TokenizerSource::None { vocab: VOCAB };
    SynthArgs {
        seed: 7,
        mtp_oracle: true,
        ..SynthArgs::new(shape, dtype, out, tokenizer)
    }
}

/// Greedy MTP speculation at K = 1..3 on a few prompts: tokens equal plain decoding's; returns
/// (drafted, accepted).
fn speculate(w: &ModelWeights, what: &str) -> (u64, u64) {
    let mut b = small_cpu(w.clone());
    let prompts: [Vec<u32>; 3] = [
        vec![1, 2, 3, 4, 5, 1, 2, 3],
        (0..23).map(|i| (i * 37 % 250) as u32 + 3).collect(),
        vec![200, 17, 99],
    ];
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in prompts {
        let req = GenRequest::greedy(prompt, 24);
        let plain = generate(&mut b, &req, &mut |_| Ok(())).unwrap();
        for k in 1..=3 {
            let mut d = MtpDrafter::new(w, Device::Cpu, 1).unwrap();
            let o = SpecOptions { k, adaptive: false };
            let (s, c) = generate_spec(&mut b, &mut d, &req, o, &mut |_| Ok(())).unwrap();
            assert_eq!(plain.tokens, s.tokens, "{what} k={k}: tokens differ");
            drafted += c.drafted;
            accepted += c.accepted;
        }
    }
    (drafted, accepted)
}

#[test]
fn oracle_files_load_and_their_mtp_drafts_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (Shape::TinyQwen3Next, SynthDType::Q8_0, Format::Gguf),
        (Shape::TinyLlama, SynthDType::Q4KM, Format::Gguf),
        (Shape::TinyQwen3, SynthDType::F16, Format::Gguf),
        (Shape::TinyQwen3Next, SynthDType::F32, Format::Hf),
        (Shape::TinyLlama, SynthDType::BF16, Format::Hf),
    ];
    for (shape, dtype, format) in cases {
        let what = format!("{shape} {} {format:?}", dtype.name());
        let out = dir
            .path()
            .join(format!("{shape}-{}-{format:?}", dtype.name()));
        // --mtp 0 with --mtp-oracle: one MTP layer.
        let a = SynthArgs {
            format,
            ..args(shape, dtype, out.clone())
        };
        let rep = synth(&a).unwrap();
        assert_eq!(rep.config.mtp_layers, 1, "{what}");
        assert!(rep.config.tie_embeddings, "{what}");
        let w = load_weights(&out).unwrap();
        assert_eq!(w.config, rep.config, "{what}");
        assert!(
            w.opt(Role::Output).is_none(),
            "{what}: tied, no output.weight"
        );
        let (d, a) = speculate(&w, &what);
        eprintln!("{what}: {a} of {d} MTP drafts accepted");
        assert!(d > 0 && a * 10 >= d * 9, "{what}: only {a} of {d} accepted");
    }
}

/// The wired tensors of a synthesized file, dequantized, equal `oracle_mtp_weights`' for the
/// same config; a copy equals its source in both.
#[test]
fn synth_wiring_equals_the_engines_oracle() {
    let dir = tempfile::tempdir().unwrap();
    for (shape, dtype) in [
        (Shape::TinyQwen3Next, SynthDType::Q4KM),
        (Shape::TinyLlama, SynthDType::Q8_0),
    ] {
        let out = dir.path().join(format!("{shape}.gguf"));
        let rep = synth(&args(shape, dtype, out.clone())).unwrap();
        let file = load_weights(&out).unwrap();
        let engine = oracle_mtp_weights(&rep.config, 3).unwrap();
        assert_eq!(engine.config, rep.config, "{shape}");
        let mut wired = 0;
        for t in synth_plan(&args(shape, dtype, out.clone()), &rep.config).unwrap() {
            let fill = oracle_fill(&rep.config, t.role);
            let at = format!("{shape} {}", t.gguf_name());
            let (f, e) = (values(&file, t.role), values(&engine, t.role));
            match fill {
                OracleFill::Random => continue,
                OracleFill::CopyOf(of) => {
                    assert_eq!(f, values(&file, of), "{at}: the file's copy");
                    assert_eq!(e, values(&engine, of), "{at}: the engine's copy");
                }
                _ => assert_eq!(f, e, "{at}"),
            }
            wired += 1;
        }
        // Per layer one or more output projections, and the MTP layer's three wired tensors.
        assert!(wired > rep.config.n_layers + 3, "{shape}: {wired} wired");
    }
}

fn values(w: &ModelWeights, role: Role) -> Vec<f32> {
    let t = w.get(role).unwrap();
    let cols = *t.shape.last().unwrap();
    let mut out = vec![0f32; t.shape.iter().product()];
    for (r, row) in out.chunks_mut(cols).enumerate() {
        dequantize_row(t.dtype, t.row(r), row).unwrap();
    }
    out
}

#[test]
fn zero_matrices_are_exact_in_every_type() {
    let cfg = Shape::TinyLlama.config(VOCAB);
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        let t = TensorPlan {
            arch: Arch::Llama,
            role: Role::Down(0),
            shape: vec![3, 512],
            dtype,
            init: Init::Oracle(OracleFill::Zero),
            draws: Role::Down(0),
        };
        let bytes = tensor_bytes(1, &t, &cfg, true, true).unwrap();
        assert_eq!(bytes.len() as u64, t.nbytes(), "{dtype}");
        let mut row = vec![1f32; 512];
        for r in bytes.chunks(bytes.len() / 3) {
            dequantize_row(dtype, r, &mut row).unwrap();
            assert!(row.iter().all(|&v| v == 0.0), "{dtype}");
        }
    }
}

#[test]
fn the_80b_shape_plans_as_the_oracle_requires() {
    let a = args(
        Shape::Qwen3Next80bA3b,
        SynthDType::Q4KM,
        "unused.gguf".into(),
    );
    let cfg = synth_config(&a, 151_936).unwrap();
    assert_eq!((cfg.mtp_layers, cfg.tie_embeddings), (1, true));
    let p = synth_plan(&a, &cfg).unwrap();
    let t = |r: Role| p.iter().find(|t| t.role == r);
    let l = cfg.n_layers;
    assert!(t(Role::Output).is_none());
    assert_eq!(t(Role::TokenEmbd).unwrap().dtype, DType::Q6_K);
    let eh = t(Role::MtpEhProj(l)).unwrap();
    assert_eq!((eh.dtype, eh.shape.clone()), (DType::F32, vec![2048, 4096]));
    assert_eq!(eh.init, Init::Oracle(OracleFill::Identity));
    for r in [Role::DownExps(0), Role::ShexpDown(5), Role::SsmOut(0)] {
        assert_eq!(t(r).unwrap().init, Init::Oracle(OracleFill::Zero), "{r:?}");
    }
    assert_eq!(
        t(Role::AttnOut(3)).unwrap().init,
        Init::Oracle(OracleFill::Zero)
    );
    let norm = t(Role::MtpSharedNorm(l)).unwrap();
    assert_eq!(norm.draws, Role::OutputNorm);
    assert_eq!(norm.dtype, DType::F32);
    assert_eq!(
        t(Role::MtpEnorm(l)).unwrap().init,
        Init::Oracle(OracleFill::Ones)
    );
}

#[test]
fn a_shape_without_mtp_support_is_refused_by_name() {
    let a = args(Shape::TinyGemma3, SynthDType::F16, "unused.gguf".into());
    let e = synth_config(&a, VOCAB).unwrap_err().to_string();
    assert!(
        e.contains("--mtp-oracle") && e.contains("tiny-gemma3"),
        "{e}"
    );
}

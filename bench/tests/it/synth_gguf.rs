//! `synth --format gguf` and `convert`: tiny models of every architecture and several types reopen
//! with the expected config, tensors and bytes; output is deterministic whatever the thread count;
//! GGUF -> HF conversion gives the dequantized, un-permuted tensors.

use std::path::{Path, PathBuf};

use memra_bench::convert::{ConvertArgs, convert_gguf_to_hf};
use memra_bench::generate::{tensor_bytes, tensor_values};
use memra_bench::plan::{SynthDType, plan};
use memra_bench::shapes::Shape;
use memra_bench::synth::{Format, SynthArgs, TokenizerSource, synth};
use memra_engine::config::{Arch, ModelConfig};
use memra_engine::formats::gguf::Gguf;
use memra_engine::formats::safetensors::HfModel;
use memra_engine::models::{Role, gguf_permuted, unpermute_qk_rows};
use memra_engine::quant::DType;

const VOCAB: usize = 256;

fn args(shape: Shape, dtype: SynthDType, seed: u64, out: PathBuf) -> SynthArgs {
    let tokenizer = TokenizerSource::None { vocab: VOCAB };
    SynthArgs {
        seed,
        ..SynthArgs::new(shape, dtype, out, tokenizer)
    }
}

/// Opens a synthetic GGUF and checks config, tensor list, types and bytes against the plan.
fn check_gguf(path: &Path, a: &SynthArgs, cfg: &ModelConfig) {
    let g = Gguf::open(path).unwrap();
    assert_eq!(
        &ModelConfig::from_gguf(&g).unwrap(),
        cfg,
        "{}",
        path.display()
    );
    let p = plan(cfg, a.dtype);
    let names: Vec<String> = g.tensors().iter().map(|t| t.name.clone()).collect();
    let want: Vec<String> = p.iter().map(|t| t.gguf_name()).collect();
    assert_eq!(names, want);
    for t in &p {
        let got = g.tensor(&t.gguf_name()).unwrap();
        assert_eq!(got.dtype, t.dtype, "{}", t.gguf_name());
        assert_eq!(got.shape, t.shape, "{}", t.gguf_name());
        let want = tensor_bytes(a.seed, t, cfg, true, !a.exact_kquants).unwrap();
        assert_eq!(&got.data[..], &want[..], "{}", t.gguf_name());
        let vals = got.to_f32().unwrap();
        assert!(
            vals.iter().all(|v| v.is_finite() && v.abs() < 1.2),
            "{}",
            t.gguf_name()
        );
    }
}

#[test]
fn tiny_models_all_archs_and_types() {
    let dir = tempfile::tempdir().unwrap();
    let dtypes = [
        SynthDType::F32,
        SynthDType::F16,
        SynthDType::BF16,
        SynthDType::Q8_0,
        SynthDType::Q4_0,
        SynthDType::Q4KM,
    ];
    let shapes = [
        Shape::TinyLlama,
        Shape::TinyQwen2,
        Shape::TinyQwen3,
        Shape::TinyQwen2Vl,
        Shape::TinyQwen3Vl,
    ];
    for shape in shapes {
        for dtype in dtypes {
            let out = dir.path().join(format!("{shape}-{}.gguf", dtype.name()));
            let a = args(shape, dtype, 5, out.clone());
            let rep = synth(&a).unwrap();
            assert_eq!(rep.config, shape.config(VOCAB));
            check_gguf(&out, &a, &rep.config);
        }
    }
}

#[test]
fn q4_k_m_on_k_quant_friendly_rows() {
    // SmolLM2's shape cut to 2 layers: 1536-wide down rows take Q4_K/Q6_K, 576-wide ones fall back.
    // Both k-quant paths: random valid blocks (default) and the reference quantizer.
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for exact in [false, true] {
        let out = dir.path().join(format!("s-{exact}.gguf"));
        let mut a = args(Shape::Smollm2_135m, SynthDType::Q4KM, 9, out.clone());
        a.layers = Some(2);
        a.exact_kquants = exact;
        let rep = synth(&a).unwrap();
        check_gguf(&out, &a, &rep.config);
        let g = Gguf::open(&out).unwrap();
        let ty = |n: &str| g.tensor_info(n).unwrap().dtype;
        // use_more_bits(l, 2): layer 0 no, layer 1 (>= 7 * 2 / 8) yes.
        assert_eq!(ty("blk.0.ffn_down.weight"), DType::Q4_K);
        assert_eq!(ty("blk.1.ffn_down.weight"), DType::Q6_K);
        assert_eq!(ty("blk.1.attn_v.weight"), DType::Q8_0); // Q6_K falls back on 576-wide rows
        assert_eq!(ty("blk.0.attn_q.weight"), DType::Q5_0);
        assert_eq!(ty("token_embd.weight"), DType::Q8_0);
        assert_eq!(
            g.get("general.file_type").and_then(|v| v.as_u64()),
            Some(15)
        );
        // Dequantized k-quant weights look like the f32 ones: mean ~0, std ~0.02.
        let v = g.tensor("blk.1.ffn_down.weight").unwrap().to_f32().unwrap();
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let std =
            (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        assert!(
            mean.abs() < 0.001 && (std - 0.02).abs() < 0.003,
            "exact={exact}: mean {mean} std {std}"
        );
        files.push(std::fs::read(&out).unwrap());
    }
    assert_ne!(files[0], files[1]);
}

#[test]
fn deterministic_across_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, threads) in [Some(1), Some(4), None].into_iter().enumerate() {
        let out = dir.path().join(format!("m{i}.gguf"));
        let mut a = args(Shape::TinyLlama, SynthDType::Q8_0, 11, out.clone());
        a.threads = threads;
        synth(&a).unwrap();
        files.push(std::fs::read(&out).unwrap());
    }
    assert_eq!(files[0], files[1]);
    assert_eq!(files[0], files[2]);
    let out = dir.path().join("other.gguf");
    synth(&args(Shape::TinyLlama, SynthDType::Q8_0, 12, out.clone())).unwrap();
    assert_ne!(files[0], std::fs::read(&out).unwrap());
}

#[test]
fn llama3_rope_scaling_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l3.gguf");
    let mut a = args(Shape::Llama3_8b, SynthDType::F16, 1, out.clone());
    a.layers = Some(1);
    let cfg = synth_config_small(&a);
    // Too big to generate in a test at full width: check the metadata of a 1-layer model.
    assert!(cfg.rope_scaling.is_some());
    let rep = synth(&a).unwrap();
    let g = Gguf::open(&out).unwrap();
    assert_eq!(ModelConfig::from_gguf(&g).unwrap(), rep.config);
    assert_eq!(
        rep.config.rope_scaling,
        Shape::Llama3_8b.config(VOCAB).rope_scaling
    );
}

#[test]
fn llama3_rope_scaling_the_llama_cpp_way() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("l3.gguf");
    let mut a = args(Shape::Llama3_8b, SynthDType::F16, 1, out.clone());
    a.layers = Some(1);
    a.llamacpp_rope = true;
    let rep = synth(&a).unwrap();
    let g = Gguf::open(&out).unwrap();
    assert!(g.get("llama.rope.scaling.type").is_none());
    let f = g.tensor("rope_freqs.weight").unwrap();
    assert_eq!(f.dtype, DType::F32);
    assert_eq!(f.shape, vec![64]);
    let f = f.to_f32().unwrap();
    assert_eq!((f[0], f[63]), (1.0, 8.0));
    let mut cfg = rep.config.clone();
    cfg.rope_scaling = None; // the keys are not there; the tensor carries the scaling
    assert_eq!(ModelConfig::from_gguf(&g).unwrap(), cfg);
    // convert recognises the factors and writes rope_scaling into config.json.
    let hf = dir.path().join("hf");
    let c = ConvertArgs {
        input: out,
        out: hf.clone(),
        dtype: None,
        shard_bytes: 1 << 30,
        progress: false,
    };
    convert_gguf_to_hf(&c).unwrap();
    let m = HfModel::open(&hf).unwrap();
    assert_eq!(m.config, rep.config);
    assert!(m.tensor_names().iter().all(|n| !n.contains("rope")));
}

fn synth_config_small(a: &SynthArgs) -> ModelConfig {
    memra_bench::synth::synth_config(a, VOCAB).unwrap()
}

/// Every HF tensor equals the dequantized (and for llama q/k un-permuted) GGUF tensor.
fn check_converted(gguf: &Path, hf: &Path, forced: Option<DType>) {
    let g = Gguf::open(gguf).unwrap();
    let m = HfModel::open(hf).unwrap();
    let cfg = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(m.config, cfg);
    assert_eq!(m.tensor_names().len(), g.tensors().len());
    for info in g.tensors() {
        let role = Role::from_gguf_name(&info.name).unwrap();
        let gt = g.tensor(&info.name).unwrap();
        let ht = m.tensor(&role.hf_name(cfg.arch)).unwrap().unwrap();
        assert_eq!(ht.shape, gt.shape, "{}", info.name);
        let want_dtype = forced.unwrap_or(if gt.dtype.is_float() {
            gt.dtype
        } else {
            DType::F32
        });
        assert_eq!(ht.dtype, want_dtype, "{}", info.name);
        let mut want: Vec<u8> = gt
            .to_f32()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let permuted = gguf_permuted(cfg.arch, role);
        if permuted {
            want = unpermute_qk_rows(&want, gt.shape[1] * 4, cfg.head_dim);
        }
        let want: Vec<f32> = want
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let got = ht.to_f32().unwrap();
        if want_dtype == DType::F32 || want_dtype == gt.dtype {
            assert_eq!(got, want, "{}", info.name);
        } else {
            let q = memra_engine::quant::quantize(want_dtype, &want).unwrap();
            assert_eq!(&ht.data[..], &q[..], "{}", info.name);
        }
    }
}

#[test]
fn convert_gguf_to_hf_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (Shape::TinyLlama, SynthDType::Q8_0, None),
        (Shape::TinyLlama, SynthDType::F16, None),
        (Shape::TinyLlama, SynthDType::Q4_0, Some(DType::BF16)),
        (Shape::TinyQwen2, SynthDType::Q4KM, None),
        (Shape::TinyQwen3, SynthDType::BF16, Some(DType::F32)),
    ];
    for (i, (shape, dtype, forced)) in cases.into_iter().enumerate() {
        let gguf = dir.path().join(format!("m{i}.gguf"));
        synth(&args(shape, dtype, 21, gguf.clone())).unwrap();
        let hf = dir.path().join(format!("m{i}-hf"));
        let c = ConvertArgs {
            input: gguf.clone(),
            out: hf.clone(),
            dtype: forced,
            shard_bytes: if i == 0 { 100_000 } else { 1 << 30 },
            progress: false,
        };
        let rep = convert_gguf_to_hf(&c).unwrap();
        assert_eq!(rep.config, shape.config(VOCAB));
        check_converted(&gguf, &hf, forced);
        if i == 0 {
            assert!(HfModel::open(&hf).unwrap().shard_paths().len() > 1);
        }
    }
}

#[test]
fn gguf_f32_converted_equals_hf_synth() {
    // The same seed gives the same model in both formats: convert(synth gguf) == synth hf.
    let dir = tempfile::tempdir().unwrap();
    for shape in [Shape::TinyLlama, Shape::TinyQwen2, Shape::TinyQwen3] {
        let gguf = dir.path().join(format!("{shape}.gguf"));
        synth(&args(shape, SynthDType::F32, 33, gguf.clone())).unwrap();
        let conv = dir.path().join(format!("{shape}-conv"));
        let c = ConvertArgs {
            input: gguf,
            out: conv.clone(),
            dtype: None,
            shard_bytes: 1 << 30,
            progress: false,
        };
        convert_gguf_to_hf(&c).unwrap();
        let direct = dir.path().join(format!("{shape}-hf"));
        let mut a = args(shape, SynthDType::F32, 33, direct.clone());
        a.format = Format::Hf;
        synth(&a).unwrap();
        let (m1, m2) = (
            HfModel::open(&conv).unwrap(),
            HfModel::open(&direct).unwrap(),
        );
        assert_eq!(m1.config, m2.config);
        let p = plan(&m1.config, SynthDType::F32);
        for t in &p {
            let a = m1.tensor(&t.hf_name()).unwrap().unwrap();
            let b = m2.tensor(&t.hf_name()).unwrap().unwrap();
            assert_eq!(&a.data[..], &b.data[..], "{shape} {}", t.hf_name());
            assert_eq!(a.to_f32().unwrap(), tensor_values(33, t));
        }
        if shape.config(VOCAB).arch == Arch::Llama {
            // The GGUF really is permuted: its q rows differ from the HF ones.
            let g = Gguf::open(&dir.path().join(format!("{shape}.gguf"))).unwrap();
            let gq = g.tensor("blk.0.attn_q.weight").unwrap();
            let hq = m2
                .tensor("model.layers.0.self_attn.q_proj.weight")
                .unwrap()
                .unwrap();
            assert_ne!(&gq.data[..], &hq.data[..]);
        }
    }
}

#[test]
fn convert_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("m.gguf");
    synth(&args(Shape::TinyLlama, SynthDType::F16, 1, gguf.clone())).unwrap();
    let mut c = ConvertArgs {
        input: gguf,
        out: dir.path().join("hf"),
        dtype: Some(DType::Q8_0),
        shard_bytes: 1 << 30,
        progress: false,
    };
    let e = convert_gguf_to_hf(&c).unwrap_err();
    assert!(
        e.to_string().contains("f32, f16, bf16, fp8 or nvfp4"),
        "{e}"
    );
    c.dtype = None;
    c.input = dir.path().join("missing.gguf");
    assert!(convert_gguf_to_hf(&c).is_err());
    assert!(!dir.path().join("hf").exists());
    assert!(!dir.path().join("hf.tmp").exists());
}

#[test]
fn hf_to_gguf_and_back() {
    use memra_bench::to_gguf::{ToGgufArgs, convert_hf_to_gguf};
    let dir = tempfile::tempdir().unwrap();
    for (shape, dtype) in [
        (Shape::TinyLlama, SynthDType::F32),
        (Shape::TinyQwen2, SynthDType::BF16),
        (Shape::TinyQwen3, SynthDType::F16),
    ] {
        let hf = dir.path().join(format!("{shape}-hf"));
        let mut a = args(shape, dtype, 4, hf.clone());
        a.format = Format::Hf;
        synth(&a).unwrap();
        let gguf = dir.path().join(format!("{shape}.gguf"));
        let t = ToGgufArgs {
            input: hf.clone(),
            out: gguf.clone(),
            tokenizer_from: None,
            progress: false,
        };
        convert_hf_to_gguf(&t).unwrap();
        // Same tensors, bytes and order as a GGUF synthesised directly (llama q/k permuted).
        let direct = dir.path().join(format!("{shape}-direct.gguf"));
        synth(&args(shape, dtype, 4, direct.clone())).unwrap();
        let (g1, g2) = (Gguf::open(&gguf).unwrap(), Gguf::open(&direct).unwrap());
        assert_eq!(
            ModelConfig::from_gguf(&g1).unwrap(),
            ModelConfig::from_gguf(&g2).unwrap()
        );
        assert_eq!(g1.tensors().len(), g2.tensors().len());
        for info in g2.tensors() {
            let (x, y) = (
                g1.tensor(&info.name).unwrap(),
                g2.tensor(&info.name).unwrap(),
            );
            assert_eq!((x.dtype, &x.shape), (y.dtype, &y.shape), "{}", info.name);
            assert_eq!(&x.data[..], &y.data[..], "{shape} {}", info.name);
        }
        // And back to HF: identical to the original folder's tensors.
        let back = dir.path().join(format!("{shape}-back"));
        let c = ConvertArgs {
            input: gguf,
            out: back.clone(),
            dtype: None,
            shard_bytes: 1 << 30,
            progress: false,
        };
        convert_gguf_to_hf(&c).unwrap();
        let (m1, m2) = (HfModel::open(&hf).unwrap(), HfModel::open(&back).unwrap());
        assert_eq!(m1.config, m2.config);
        for n in m1.tensor_names() {
            let (x, y) = (
                m1.tensor(&n).unwrap().unwrap(),
                m2.tensor(&n).unwrap().unwrap(),
            );
            assert_eq!(&x.data[..], &y.data[..], "{shape} {n}");
        }
    }
}

#[test]
fn ctx_overrides_the_shapes_context_length() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("long.gguf");
    let mut a = args(Shape::TinyLlama, SynthDType::F16, 1, out.clone());
    a.ctx = Some(131_072);
    let rep = synth(&a).unwrap();
    let g = Gguf::open(&out).unwrap();
    assert_eq!(ModelConfig::from_gguf(&g).unwrap().max_ctx, 131_072);
    assert_eq!(rep.config.max_ctx, 131_072);
    a.ctx = Some(0);
    assert!(synth(&a).is_err(), "a zero context is refused");
}

/// `synth-mmproj --shape` writes every tower shape it names (the tiny ones here; the real-size
/// ones are the same code at other numbers), and memra opens each: Gemma 3's square tower and
/// the Qwen ViT's three members, their token counts and widths; an unknown shape is an error
/// naming the shapes.
#[test]
fn synth_mmproj_writes_every_tiny_tower() {
    let dir = tempfile::tempdir().unwrap();
    for (shape, tokens, width) in [
        ("tiny", 16, 64),
        ("tiny-qwen2vl", 36, 64),
        ("tiny-qwen25vl", 36, 64),
        ("tiny-qwen3vl", 36, 128),
    ] {
        let out = dir.path().join(format!("{shape}.gguf"));
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_memra-bench"))
            .args([
                "synth-mmproj",
                "--shape",
                shape,
                "--text-hidden",
                "64",
                "--dtype",
                "f16",
            ])
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let t = memra_engine::vision::VisionTower::open(&out).unwrap();
        assert_eq!(t.tokens_per_image(), tokens, "{shape}");
        assert_eq!(t.out_width(), width, "{shape}");
    }
    // The Qwen-VL text shapes take the tiny Qwen towers' rows: their input embedding width
    // (Qwen3-VL: main and deepstack rows) and their M-RoPE sections from the GGUF.
    for (shape, tower, deepstack) in [
        ("tiny-qwen2vl", "tiny-qwen25vl", 0),
        ("tiny-qwen3vl", "tiny-qwen3vl", 1),
    ] {
        let text = dir.path().join(format!("{shape}-text.gguf"));
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_memra-bench"))
            .args([
                "synth", "--shape", shape, "--dtype", "q8_0", "--quiet", "--out",
            ])
            .arg(&text)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let c = ModelConfig::from_gguf(&Gguf::open(&text).unwrap()).unwrap();
        let vl = c.vl.unwrap();
        assert_eq!(vl.deepstack, deepstack, "{shape}");
        assert_eq!(vl.sections.sizes.iter().sum::<usize>(), c.head_dim / 2);
        let t = memra_engine::vision::VisionTower::open(&dir.path().join(format!("{tower}.gguf")))
            .unwrap();
        assert_eq!(t.out_width(), c.embed_width(), "{shape} + {tower}");
    }
    let e = memra_bench::synth_mmproj::tower_shape("huge", 64).unwrap_err();
    assert!(e.to_string().contains("qwen25vl-7b"), "{e}");
    // The real-size Qwen2.5-VL-7B shape: 32 blocks of 1280, 1024 tokens at 896 x 896.
    let p = match memra_bench::synth_mmproj::tower_shape("qwen25vl-7b", 3584).unwrap() {
        memra_bench::synth_mmproj::Shape::Qwen(p) => p,
        other => panic!("{other:?}"),
    };
    assert_eq!((p.layers, p.hidden, p.ffn, p.heads), (32, 1280, 3420, 16));
    assert_eq!(p.tokens(896, 896), 1024);
    assert_eq!(p.check().map_err(|e| e.to_string()), Ok(()));
}

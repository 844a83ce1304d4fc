//! FP8 (HF `fp8`, 128 x 128 block scales) and NVFP4 (ModelOpt) checkpoints on the CPU: the
//! element codes against ml_dtypes (verify/fixtures/fp8-reference.json, made by
//! verify/reference/fp8_fixture.py), the reference products against that fixture's float64
//! products, tiny checkpoints through the loader and the engine loop, bit-exactness against
//! the same weights given as F32, the CUDA dequantize-at-load types, and every broken piece of
//! a checkpoint refused with an error naming the tensor.

use std::path::{Path, PathBuf};

use memra_engine::formats::safetensors::HfFolderSpec;
use memra_engine::formats::safetensors::quantized::{Raw, Scheme, build};
use memra_engine::quant::fp8::{
    E4M3, dot_fp8_act_reference, e2m1_to_f32, f32_to_e2m1, f32_to_e4m3, f32_to_e4m3_search,
    quantize_act_fp8,
};
use memra_engine::quant::{DType, dequantize_row, dot_f32, dot_row, dot_row_generic, quantize};
use memra_engine::testing::quant_folder::{Ckpt, Entry, entries_of, write};
use memra_engine::weights::Bytes;
use serde_json::{Value, json};

use crate::common::repo_path;
use crate::tiny_files::{HfParts, load_whole};

fn fixture() -> Value {
    let p = repo_path("verify/fixtures/fp8-reference.json");
    serde_json::from_slice(&std::fs::read(p).expect("fixture")).expect("fixture JSON")
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("integer"))
        .collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    u64s(v)
        .into_iter()
        .map(|b| f32::from_bits(b as u32))
        .collect()
}

fn bytes(v: &Value) -> Vec<u8> {
    u64s(v).into_iter().map(|b| b as u8).collect()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn element_codes_match_ml_dtypes() {
    let f = fixture();
    let e4 = f32s(&f["e4m3_bits"]);
    for (c, want) in e4.iter().enumerate() {
        assert!(same(E4M3[c], *want), "e4m3 {c:#04x}: {} vs {want}", E4M3[c]);
    }
    for (c, want) in f32s(&f["e2m1_bits"]).iter().enumerate() {
        assert!(same(e2m1_to_f32(c as u8), *want), "e2m1 {c}");
    }
    // Rounding to nearest, ties to even, as ml_dtypes' casts.
    let (xi, xo) = (f32s(&f["e4m3_round_in"]), u64s(&f["e4m3_round_out"]));
    for (x, c) in xi.iter().zip(&xo) {
        assert_eq!(f32_to_e4m3(*x) as u64, *c, "e4m3 rounding of {x}");
    }
    let (xi, xo) = (f32s(&f["e2m1_round_in"]), u64s(&f["e2m1_round_out"]));
    for (x, c) in xi.iter().zip(&xo) {
        assert_eq!(f32_to_e2m1(*x) as u64, *c, "e2m1 rounding of {x}");
    }
    // Every finite code is its own value's code; beyond the range saturates.
    for c in (0u8..=255).filter(|c| c & 0x7f != 0x7f) {
        assert_eq!(f32_to_e4m3(E4M3[c as usize]), c);
    }
    // The bit arithmetic equals the search over the codes: around every code and midpoint
    // (a few ulps either side) and on a sweep of magnitudes from 2^-12 to 2^10.
    let mut xs: Vec<f32> = Vec::new();
    for c in 0u8..0x7f {
        let v = E4M3[c as usize];
        let next = if c < 0x7e {
            E4M3[c as usize + 1]
        } else {
            480.0
        };
        for p in [v, (v + next) / 2.0] {
            for d in -3i32..=3 {
                xs.push(f32::from_bits((p.to_bits() as i32 + d).max(0) as u32));
            }
        }
    }
    let mut b = (2f32.powi(-12)).to_bits();
    while b < 2f32.powi(10).to_bits() {
        xs.push(f32::from_bits(b));
        b += 997;
    }
    for x in xs.iter().flat_map(|x| [*x, -*x]) {
        assert_eq!(f32_to_e4m3(x), f32_to_e4m3_search(x), "{x:e}");
    }
    assert_eq!(f32_to_e4m3(1e9), 0x7e);
    assert_eq!(f32_to_e4m3(-500.0), 0xfe);
    assert_eq!(f32_to_e2m1(-7.0), 0xf);
}

fn raw<'a>(dtype: &'a str, shape: &'a [usize], data: Vec<u8>) -> Raw<'a> {
    Raw {
        dtype,
        shape,
        data: Bytes::owned(data),
    }
}

/// A fixture case's `(n, k)`.
fn dims(c: &Value) -> (usize, usize) {
    (
        c["n"].as_u64().unwrap() as usize,
        c["k"].as_u64().unwrap() as usize,
    )
}

/// Checks `t`'s reference products of the fixture case `c`'s `x` against its float64 `y`
/// and the fixed order.
fn check_products(t: &memra_engine::weights::Tensor, c: &Value, what: &str) {
    let x = &f32s(&c["x_bits"]);
    let y: Vec<f64> = c["y"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let ymax = y.iter().fold(0f64, |m, v| m.max(v.abs()));
    let mut worst = 0f64;
    let mut row = vec![0f32; x.len()];
    for (r, want) in y.iter().enumerate() {
        let got = dot_row(t.dtype, t.row(r), x).expect("dot_row");
        dequantize_row(t.dtype, t.row(r), &mut row).expect("dequantize");
        // dot_row is dot_f32 over the dequantized row, bit for bit, on every code path.
        assert_eq!(got.to_bits(), dot_f32(&row, x).to_bits(), "{what} row {r}");
        let generic = dot_row_generic(t.dtype, t.row(r), x).expect("generic");
        assert_eq!(got.to_bits(), generic.to_bits(), "{what} row {r}");
        worst = worst.max((got as f64 - want).abs() / ymax);
    }
    // f32 accumulation of up to 256 products against float64.
    assert!(worst < 1e-6, "{what}: largest error {worst:e} of max |y|");
    eprintln!("{what}: largest error against float64 {worst:.2e} of max |y|");
}

#[test]
fn fp8_block_product_matches_the_float64_reference() {
    let f = fixture();
    let c = &f["fp8"];
    let (n, k) = dims(c);
    let scales: Vec<u8> = f32s(&c["scale_inv_bits"])
        .iter()
        .flat_map(|s| s.to_le_bytes())
        .collect();
    let (wshape, sshape) = ([n, k], [n.div_ceil(128), k.div_ceil(128)]);
    let w = raw("F8_E4M3", &wshape, bytes(&c["codes"]));
    let s = raw("F32", &sshape, scales);
    let get =
        |name: &str| (name == "a.weight_scale_inv").then(|| raw(s.dtype, s.shape, s.data.to_vec()));
    let scheme = Scheme::Fp8Block {
        rows: 128,
        cols: 128,
    };
    let t = build(Path::new("fixture"), scheme, "a.weight", w, &get).expect("build");
    assert_eq!((t.dtype, t.shape.clone()), (DType::FP8, vec![n, k]));
    check_products(&t, c, "fp8 130x256");
}

#[test]
fn nvfp4_product_matches_the_float64_reference() {
    let f = fixture();
    let c = &f["nvfp4"];
    let (n, k) = dims(c);
    let g = f32::from_bits(c["global_bits"].as_u64().unwrap() as u32);
    let (wshape, sshape) = ([n, k / 2], [n, k / 16]);
    let w = raw("U8", &wshape, bytes(&c["packed"]));
    let sc = bytes(&c["scale_codes"]);
    let get = |name: &str| match name {
        "a.weight_scale" => Some(raw("F8_E4M3", &sshape, sc.clone())),
        "a.weight_scale_2" => Some(raw("F32", &[], g.to_le_bytes().to_vec())),
        _ => None,
    };
    let t = build(Path::new("fixture"), Scheme::Nvfp4, "a.weight", w, &get).expect("build");
    assert_eq!((t.dtype, t.shape.clone()), (DType::NVFP4, vec![n, k]));
    check_products(&t, c, "nvfp4 6x64");
}

/// Values of a row: uniform in +-0.05 with every 37th value `outlier` times larger (activation
/// rows have such channels).
fn values_with(n: usize, seed: u32, outlier: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97))
                >> 8;
            let u = h as f32 / (1u32 << 24) as f32 - 0.5;
            if i % 37 == 5 {
                outlier * 0.1 * u
            } else {
                0.1 * u
            }
        })
        .collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    values_with(n, seed, 200.0)
}

#[test]
fn row_block_quantizers_stay_within_their_step() {
    let v = values(512, 1);
    for (d, group, rel) in [
        (DType::FP8, 32, 1.0 / 16.0),
        (DType::NVFP4, 16, 1.0 / 4.0 + 1.0 / 16.0),
    ] {
        let q = quantize(d, &v).expect("quantize");
        assert_eq!(q.len(), 512 / group * d.block_bytes());
        let mut back = vec![0f32; 512];
        dequantize_row(d, &q, &mut back).expect("dequantize");
        for (g, (a, b)) in v.chunks(group).zip(back.chunks(group)).enumerate() {
            let amax = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= rel * amax, "{d} group {g}: {x} -> {y}");
            }
        }
    }
}

/// The activation quantization an FP8 x FP8 product uses, and its distance from the product
/// over f32 activations (docs/VERIFY.md states it).
#[test]
fn fp8_activation_quantization_and_its_error() {
    let x = values_with(4096, 7, 20.0);
    let (codes, scales) = quantize_act_fp8(&x);
    assert_eq!((codes.len(), scales.len()), (4096, 32));
    for (g, s) in scales.iter().enumerate() {
        let amax = x[g * 128..(g + 1) * 128]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(s.to_bits(), (amax / 448.0).to_bits(), "group {g}");
        // The group's largest magnitude maps onto 448 exactly.
        let top = codes[g * 128..(g + 1) * 128]
            .iter()
            .map(|&c| E4M3[c as usize].abs());
        assert_eq!(top.fold(0f32, f32::max), 448.0);
    }
    let (zc, zs) = quantize_act_fp8(&[0.0; 130]);
    assert!(zc.iter().all(|&c| c == 0) && zs == vec![1.0, 1.0]);
    let (mut worst, mut diff, mut top, mut wq) = (0f32, 0f32, 0f32, 0f32);
    for r in 0..64 {
        let w = values_with(4096, 100 + r, 1.0);
        let q = quantize(DType::FP8, &w).expect("quantize");
        let (wc, ws): (Vec<u8>, Vec<f32>) =
            q.chunks(36).fold((Vec::new(), Vec::new()), |mut a, b| {
                a.1.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                a.0.extend_from_slice(&b[4..]);
                a
            });
        let exact = dot_row(DType::FP8, &q, &x).expect("dot");
        let mut deq = vec![0f32; 4096];
        dequantize_row(DType::FP8, &q, &mut deq).expect("dequantize");
        let norm = deq.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum::<f32>();
        let act = dot_fp8_act_reference(&wc, &ws, &x);
        worst = worst.max((act - exact).abs() / norm);
        diff = diff.max((act - exact).abs());
        // The weights' own rounding: FP8 against the values it was quantized from.
        wq = wq.max((exact - dot_f32(&w, &x)).abs());
        top = top.max(exact.abs());
    }
    // e4m3 rounds to 3 mantissa bits: each activation within 2^-4 relative.
    assert!(worst < 1.0 / 16.0, "FP8 x FP8 error {worst:e} of sum |w x|");
    eprintln!(
        "FP8 x FP8 vs FP8 x f32: largest error {worst:.2e} of sum |w x|, {:.2e} of max |out|; \
         FP8 x f32 vs the unquantized weights: {:.2e} of max |out|",
        diff / top,
        wq / top
    );
}

/// A tiny llama (HfParts::valid: F32 weights, a real-shaped tokenizer) as checkpoint `ck`,
/// with `edit` applied to its tensors and `quant` as its quantization_config.
fn folder(
    dir: &Path,
    name: &str,
    ck: Ckpt,
    quant: Value,
    edit: impl FnOnce(&mut Vec<Entry>),
) -> PathBuf {
    let p = HfParts::valid();
    let mut e = entries_of(&p.tensors, ck).expect("entries");
    edit(&mut e);
    let spec = HfFolderSpec {
        config_json: p.config_json.clone(),
        tokenizer_json: Some(p.tokenizer_json.clone()),
        tokenizer_config_json: Some(p.tokenizer_config_json.clone()),
        max_shard_bytes: 1 << 30,
    };
    let out = dir.join(name);
    write(&out, &spec, Some(quant), e).expect("write folder");
    out
}

#[test]
fn tiny_checkpoints_load_serve_and_equal_their_f32_weights() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (Ckpt::Fp8, DType::FP8),
        (Ckpt::Fp8Tensor, DType::FP8),
        (Ckpt::Nvfp4, DType::NVFP4),
    ];
    for (ck, d) in cases {
        let out = folder(dir.path(), &format!("{ck:?}"), ck, ck.config(), |_| {});
        let w = memra_engine::loader::load_weights(&out).expect("load");
        let quantized = w.iter().filter(|(_, t)| t.dtype == d).count();
        // 2 layers x 7 matrices; the tied embedding stays F32.
        assert_eq!(quantized, 14, "{ck:?}");
        // Through the loader, the engine loop and a request (the server's path).
        let s = load_whole(&out).unwrap_or_else(|e| panic!("{ck:?}: {e}"));
        assert_eq!(s.tokens.len(), 3, "{ck:?}: {s:?}");
        // The CPU products over FP8 / NVFP4 rows are exactly those over their values as F32.
        let f32w = memra_engine::testing::quant_folder::as_f32(&w).expect("as f32");
        let (a, b) = (logits(w.clone()), logits(f32w));
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{ck:?}"
        );
        assert!(a.iter().all(|x| x.is_finite()));
        // What the CUDA backend uploads: F16 of the exact values (BF16 past F16's range).
        let wide = w.dequantize_hf_only().expect("dequantize").expect("some");
        // The engine sizes a CUDA KV pool from the weights as uploaded, before they are.
        let fixed = memra_engine::backend::cuda::plan::fixed_bytes;
        assert_eq!(fixed(&w).unwrap(), fixed(&wide).unwrap(), "{ck:?}");
        for ((_, t), (_, u)) in w.iter().zip(wide.iter()) {
            if t.dtype != d {
                assert_eq!(t.dtype, u.dtype);
                continue;
            }
            assert_eq!(u.dtype, DType::F16, "{}", t.name);
            let want = quantize(DType::F16, &t.to_f32().unwrap()).unwrap();
            assert_eq!(&u.data[..], &want[..], "{}", t.name);
        }
    }
    // A tensor with a value beyond F16's range goes up as BF16, its values exact in BF16.
    let w = memra_engine::models::random::random_weights(
        &memra_engine::models::random::tiny_config(memra_engine::config::Arch::Llama, 64),
        1,
        DType::FP8,
    )
    .expect("weights");
    let mut big = false;
    let w = w
        .map_tensors(&mut |t| {
            if t.dtype != DType::FP8 || big {
                return Ok(t.clone());
            }
            big = true;
            let v: Vec<f32> = t.to_f32()?.iter().map(|x| x * 1e6).collect();
            let data = Bytes::owned(quantize(DType::FP8, &v)?);
            memra_engine::weights::Tensor::new(t.name.clone(), DType::FP8, t.shape.clone(), data)
        })
        .expect("map");
    let wide = w.dequantize_hf_only().expect("dequantize").expect("some");
    let types: Vec<DType> = wide.iter().map(|(_, t)| t.dtype).collect();
    assert_eq!(
        types.iter().filter(|d| **d == DType::BF16).count(),
        1,
        "{types:?}"
    );
    for ((_, t), (_, u)) in w.iter().zip(wide.iter()) {
        if u.dtype == DType::BF16 {
            let want = quantize(DType::BF16, &t.to_f32().unwrap()).unwrap();
            assert_eq!(&u.data[..], &want[..], "{}", t.name);
        }
    }
}

/// Every generated position's logits of a fixed prompt on the CPU (2 threads).
fn logits(w: memra_engine::models::ModelWeights) -> Vec<f32> {
    use memra_engine::backend::{Device, KvDtype, open_backend};
    use memra_engine::generate::{GenRequest, generate};
    let mut b = open_backend(Device::Cpu, w, (16, 16, KvDtype::F32), 2).expect("backend");
    let req = GenRequest {
        keep_logits: true,
        ..GenRequest::greedy(vec![1, 5, 9, 30, 2, 17], 4)
    };
    let out = generate(b.as_mut(), &req, &mut |_| Ok(())).expect("generate");
    out.logits.concat()
}

/// An edit of a checkpoint's tensors.
type Edit = Box<dyn FnOnce(&mut Vec<Entry>)>;

/// An edit of the first entry whose name ends with `suffix`.
fn edit_entry(suffix: impl Into<String>, f: impl FnOnce(&mut Entry) + 'static) -> Edit {
    let suffix = suffix.into();
    Box::new(move |e: &mut Vec<Entry>| {
        f(e.iter_mut().find(|x| x.0.name.ends_with(&suffix)).unwrap())
    })
}

/// No edit.
fn keep() -> Edit {
    Box::new(|_: &mut Vec<Entry>| {})
}

fn set_dtype(name: &'static str, st: &'static str) -> impl FnOnce(&mut Vec<Entry>) {
    move |e| {
        let d = &mut e.iter_mut().find(|x| x.0.name == name).expect(name).0;
        d.raw = Some(st);
        d.shape = vec![d.shape.iter().product::<usize>() * 4];
    }
}

#[test]
fn broken_checkpoints_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let q = "model.layers.0.self_attn.q_proj";
    let fp8 = Ckpt::Fp8.config();
    let nv = Ckpt::Nvfp4.config();
    let drop = |n: &'static str| move |e: &mut Vec<Entry>| e.retain(|x| x.0.name != n);
    let cases: Vec<(&str, Ckpt, Value, Edit, &[&str])> = vec![
        (
            "fp8 missing scale",
            Ckpt::Fp8,
            fp8.clone(),
            Box::new(drop("model.layers.0.self_attn.q_proj.weight_scale_inv")),
            &["q_proj.weight", "no scale tensor", "weight_scale_inv"],
        ),
        (
            "fp8 scale shape",
            Ckpt::Fp8,
            fp8.clone(),
            edit_entry("k_proj.weight_scale_inv", |d| d.0.shape = vec![1, 1, 1]),
            &[
                "k_proj.weight_scale_inv",
                "shape [1, 1, 1]",
                "expected [1, 1]",
            ],
        ),
        (
            "fp8 scale dtype",
            Ckpt::Fp8,
            fp8.clone(),
            Box::new(set_dtype(
                "model.layers.1.mlp.up_proj.weight_scale_inv",
                "U8",
            )),
            &["up_proj.weight_scale_inv", "dtype U8"],
        ),
        (
            "fp8 NaN scale",
            Ckpt::Fp8,
            fp8.clone(),
            edit_entry("o_proj.weight_scale_inv", |d| {
                d.1 = f32::NAN.to_le_bytes().to_vec()
            }),
            &["o_proj.weight_scale_inv", "non-finite"],
        ),
        (
            "fp8 NaN code",
            Ckpt::Fp8,
            fp8.clone(),
            edit_entry(format!("{q}.weight"), |d| d.1[77] = 0xff),
            &["q_proj.weight", "NaN code at element 77"],
        ),
        (
            "fp8 block not dividing rows",
            Ckpt::Fp8,
            json!({"quant_method": "fp8", "weight_block_size": [128, 48]}),
            keep(),
            &["weight_block_size [128, 48]", "multiple of 32"],
        ),
        (
            "fp8 fmt",
            Ckpt::Fp8,
            json!({"quant_method": "fp8", "fmt": "e5m2"}),
            keep(),
            &["e5m2"],
        ),
        (
            "unknown method",
            Ckpt::Fp8,
            json!({"quant_method": "gptq"}),
            keep(),
            &["quant_method `gptq`"],
        ),
        (
            "no quantization_config",
            Ckpt::Fp8,
            json!(null),
            keep(),
            &["F8_E4M3", "quantization_config"],
        ),
        (
            "nvfp4 missing scale_2",
            Ckpt::Nvfp4,
            nv.clone(),
            Box::new(drop("model.layers.1.self_attn.v_proj.weight_scale_2")),
            &["v_proj.weight", "weight_scale_2"],
        ),
        (
            "nvfp4 missing block scale",
            Ckpt::Nvfp4,
            nv.clone(),
            Box::new(drop("model.layers.0.mlp.down_proj.weight_scale")),
            &["down_proj.weight", "no scale tensor"],
        ),
        (
            "nvfp4 block scale dtype",
            Ckpt::Nvfp4,
            nv.clone(),
            edit_entry("gate_proj.weight_scale", |d| d.0.raw = Some("U8")),
            &["gate_proj.weight_scale", "dtype U8", "expected F8_E4M3"],
        ),
        (
            "nvfp4 block scale shape",
            Ckpt::Nvfp4,
            nv.clone(),
            edit_entry("q_proj.weight_scale", |d| {
                let n = d.0.shape[0] * d.0.shape[1];
                d.0.shape = vec![n / 2, 2];
            }),
            &["q_proj.weight_scale", "expected [64, 4]"],
        ),
        (
            "nvfp4 scale_2 shape",
            Ckpt::Nvfp4,
            nv.clone(),
            edit_entry("k_proj.weight_scale_2", |d| {
                d.0.shape = vec![2];
                d.1 = [1f32, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
            }),
            &["k_proj.weight_scale_2", "one value"],
        ),
        (
            "nvfp4 group size",
            Ckpt::Nvfp4,
            json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}),
            keep(),
            &["group_size 32"],
        ),
        (
            "nvfp4 as fp8",
            Ckpt::Nvfp4,
            fp8.clone(),
            keep(),
            &["U8", "quantization_config"],
        ),
    ];
    let n = cases.len();
    let mut failed = Vec::new();
    for (i, (name, ck, quant, edit, words)) in cases.into_iter().enumerate() {
        let out = folder(dir.path(), &format!("case{i}"), ck, quant, edit);
        match memra_engine::loader::load_model(&out) {
            Ok(_) => failed.push(format!("{name}: loaded")),
            Err(e) => {
                let msg = e.to_string();
                if let Some(w) = words.iter().find(|w| !msg.contains(*w)) {
                    failed.push(format!("{name}: `{msg}` lacks `{w}`"));
                }
                eprintln!("{name}: {msg}");
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    eprintln!("{n} broken checkpoints, each a clean error");
}

#[test]
fn gguf_cannot_hold_the_checkpoint_types() {
    let mut w = memra_engine::formats::gguf_write::GgufWriter::new(32);
    let e = w
        .add_tensor("x", DType::FP8, &[32, 2])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`x`") && e.contains("fp8"), "{e}");
    assert_eq!(DType::from_ggml_id(DType::NVFP4.ggml_id()), None);
    assert_eq!("nvfp4".parse::<DType>().unwrap(), DType::NVFP4);
}

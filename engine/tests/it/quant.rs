//! Block formats against gguf-py 0.19: every dequantizer bit-exact on random valid blocks and on
//! gguf-py's own quantizations, every gguf-py quantizer byte-exact, k-quant quantizers by round
//! trip, the fixed-order dot products, and the error cases.
//!
//! Fixtures: engine/tests/fixtures/quant/, made by tools/fixtures/make_quant_fixtures.py.
//! `kquant_bytes_decode_identically_in_gguf_py` runs that script (python3 with numpy and gguf,
//! or the interpreter named by `MEMRA_PYTHON`).

use std::path::{Path, PathBuf};
use std::process::Command;

use memra_engine::error::Error;
use memra_engine::quant::{
    DType, QUANTIZABLE, dequantize_row, dequantize_rows_into, dot_f32, dot_row, quantize,
};
use memra_engine::testing::pseudo_normal;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn read_fixture(name: &str) -> Vec<u8> {
    let p = fixture_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "fixture {} missing ({e}); regenerate with python3 tools/fixtures/make_quant_fixtures.py",
            p.display()
        )
    })
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

struct Meta {
    rows: usize,
    cols: usize,
    random_rows: usize,
    json: serde_json::Value,
}

fn meta() -> Meta {
    let json: serde_json::Value =
        serde_json::from_slice(&read_fixture("meta.json")).expect("meta.json is JSON");
    let get = |k: &str| {
        json[k]
            .as_u64()
            .unwrap_or_else(|| panic!("meta.json lacks {k}")) as usize
    };
    Meta {
        rows: get("rows"),
        cols: get("cols"),
        random_rows: get("random_rows"),
        json,
    }
}

fn inputs(m: &Meta) -> Vec<f32> {
    let x = f32s(&read_fixture("input.f32"));
    assert_eq!(x.len(), m.rows * m.cols, "input.f32 size");
    x
}

/// Asserts `got` and `want` are the same f32 bit patterns, naming the first difference.
fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        let n = got
            .iter()
            .zip(want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        panic!(
            "{what}: {n} values differ; first at {i}: got {:e} ({:#010x}), want {:e} ({:#010x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

fn dequant(dtype: DType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    dequantize_row(dtype, bytes, &mut out).unwrap_or_else(|e| panic!("{dtype}: {e}"));
    out
}

fn rms(v: impl Iterator<Item = f32>) -> f64 {
    let (s, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
    (s / n.max(1) as f64).sqrt()
}

#[test]
fn fixture_metadata_covers_every_type() {
    let m = meta();
    assert!(
        m.json["gguf_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("0.19"))
    );
    assert!(m.json["numpy_version"].as_str().is_some());
    for d in DType::ALL {
        assert!(
            m.json["types"][d.name()].is_object(),
            "meta.json has no entry for {d}"
        );
    }
}

#[test]
fn dequantize_random_blocks_bit_exact() {
    let m = meta();
    let n = m.random_rows * m.cols;
    for d in DType::ALL {
        let bytes = read_fixture(&format!("{}.random.bin", d.name()));
        let want = f32s(&read_fixture(&format!("{}.random.deq.f32", d.name())));
        assert_bits_eq(&format!("{d} random blocks"), &dequant(d, &bytes, n), &want);
        // Row by row gives the same values as all rows at once.
        let mut rows = vec![0f32; n];
        dequantize_rows_into(d, &bytes, m.random_rows, m.cols, &mut rows).expect("rows");
        assert_bits_eq(&format!("{d} dequantize_rows_into"), &rows, &want);
    }
}

#[test]
fn quantize_matches_gguf_py_bytes_and_dequantization() {
    let m = meta();
    let x = inputs(&m);
    let mut checked = 0;
    for d in DType::ALL {
        if m.json["types"][d.name()]["quantized"].as_bool() != Some(true) {
            continue;
        }
        checked += 1;
        let want = read_fixture(&format!("{}.quant.bin", d.name()));
        let got = quantize(d, &x).unwrap_or_else(|e| panic!("{d}: {e}"));
        assert_eq!(got.len(), want.len(), "{d}: quantized length");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            let blk = i / d.block_bytes();
            panic!(
                "{d}: byte {i} (block {blk}, row {}) got {:#04x} want {:#04x}",
                blk * d.block_size() / m.cols,
                got[i],
                want[i]
            );
        }
        let deq = f32s(&read_fixture(&format!("{}.quant.deq.f32", d.name())));
        assert_bits_eq(
            &format!("{d} quantized input"),
            &dequant(d, &got, x.len()),
            &deq,
        );
    }
    assert_eq!(
        checked, 8,
        "gguf-py quantizes F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0"
    );
}

#[test]
fn f16_all_bit_patterns_match_half() {
    let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
    let got = dequant(DType::F16, &bytes, 1 << 16);
    for (h, g) in (0..=u16::MAX).zip(&got) {
        let want = half::f16::from_bits(h).to_f32();
        if want.is_nan() {
            assert!(g.is_nan(), "f16 {h:#06x} should be NaN, got {g}");
        } else {
            assert_eq!(g.to_bits(), want.to_bits(), "f16 {h:#06x}");
        }
    }
}

/// Relative RMS error bound of quantize -> dequantize on gaussian-like rows, per type (about 1.2x
/// what the quantizers reach; heavy-tailed fixture rows get 1.6x this).
fn rel_rms_bound(d: DType) -> f64 {
    match d {
        DType::F32 => 0.0,
        DType::F16 => 5e-4,
        DType::BF16 => 3e-3,
        DType::Q8_0 => 0.008,
        DType::Q6_K => 0.025,
        DType::Q5_0 | DType::Q5_1 | DType::Q5_K => 0.055,
        DType::Q4_0 | DType::Q4_1 | DType::Q4_K => 0.11,
        _ => 0.0,
    }
}

#[test]
fn quantize_round_trip_error_is_bounded() {
    let m = meta();
    let fixture_rows = inputs(&m);
    let random = pseudo_normal(16 * 256, 7);
    for d in QUANTIZABLE {
        for (name, x, slack) in [("gaussian", &random, 1.0), ("fixture", &fixture_rows, 1.6)] {
            let q = quantize(d, x).expect("quantize");
            assert_eq!(q.len() as u64, d.bytes_for(x.len() as u64).expect("size"));
            let y = dequant(d, &q, x.len());
            // Per row of 256: the error relative to the row's RMS (rows differ in scale).
            for (r, (xr, yr)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
                let scale = rms(xr.iter().copied());
                let err = rms(xr.iter().zip(yr).map(|(a, b)| a - b));
                let bound = rel_rms_bound(d) * slack;
                assert!(
                    err <= bound * scale,
                    "{d} {name} row {r}: rms error {err:e} > {bound} x rms {scale:e}"
                );
            }
            // Quantizing the dequantized values again changes them by at most the first error.
            let y2 = dequant(d, &quantize(d, &y).expect("requantize"), y.len());
            let first = rms(x.iter().zip(&y).map(|(a, b)| a - b));
            let drift = rms(y.iter().zip(&y2).map(|(a, b)| a - b));
            assert!(
                drift <= first + 1e-12,
                "{d} {name}: requantize drift {drift:e} > {first:e}"
            );
        }
    }
}

#[test]
fn quantize_zero_and_constant_rows() {
    for d in QUANTIZABLE {
        let zeros = vec![0f32; 512];
        let y = dequant(d, &quantize(d, &zeros).expect("quantize"), 512);
        assert!(y.iter().all(|v| *v == 0.0), "{d}: zeros must stay zero");
    }
    // Q4_1/Q5_1 store a constant row as its f16 min with d = 0: exact when the value fits f16.
    for d in [DType::Q4_1, DType::Q5_1, DType::F16, DType::BF16] {
        let c = vec![-1.25f32; 512];
        let y = dequant(d, &quantize(d, &c).expect("quantize"), 512);
        assert!(y.iter().all(|v| *v == -1.25), "{d}: constant row");
    }
}

/// Runs gguf-py (via the fixture script) to dequantize `bytes` of `d`.
fn gguf_py_dequantize(d: DType, bytes: &[u8]) -> Vec<f32> {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("in.bin");
    let dst = dir.path().join("out.f32");
    std::fs::write(&src, bytes).expect("write");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/fixtures/make_quant_fixtures.py");
    let python = memra_engine::settings::var("MEMRA_PYTHON").unwrap_or_else(|| "python3".into());
    let out = Command::new(&python)
        .arg(&script)
        .arg("--dequantize")
        .arg(d.name())
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (install python3 with numpy, gguf==0.19 via tools/test.sh, or set MEMRA_PYTHON): {e}"));
    assert!(
        out.status.success(),
        "gguf-py dequantize failed (needs numpy and gguf==0.19): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    f32s(&std::fs::read(&dst).expect("gguf-py output"))
}

#[test]
fn kquant_bytes_decode_identically_in_gguf_py() {
    let m = meta();
    let mut x = inputs(&m);
    x.extend(pseudo_normal(8 * 256, 11));
    for d in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
        let q = quantize(d, &x).expect("quantize");
        assert_bits_eq(
            &format!("{d} via gguf-py"),
            &dequant(d, &q, x.len()),
            &gguf_py_dequantize(d, &q),
        );
    }
}

/// The documented order of `dot_f32`, written out plainly.
fn dot_reference(a: &[f32], b: &[f32]) -> f32 {
    let m = a.len() / 16 * 16;
    let mut acc = [0f32; 16];
    for i in 0..m {
        acc[i % 16] += a[i] * b[i];
    }
    for w in [8, 4, 2] {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    let mut s = acc[0] + acc[1];
    for i in m..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[test]
fn dot_f32_follows_the_documented_order() {
    let a = pseudo_normal(1000, 3);
    let b = pseudo_normal(1000, 5);
    for n in (0..70).chain([255, 256, 257, 999, 1000]) {
        let got = dot_f32(&a[..n], &b[..n]);
        assert_eq!(
            got.to_bits(),
            dot_reference(&a[..n], &b[..n]).to_bits(),
            "n = {n}"
        );
    }
    // Mismatched lengths use the common prefix.
    assert_eq!(
        dot_f32(&a[..40], &b[..33]).to_bits(),
        dot_f32(&a[..33], &b[..33]).to_bits()
    );
    // Lane order, not a sequential sum: 1e8 and -1e8 share lane 0 and cancel before the 1.0 of
    // lane 1 is added (a left-to-right sum would lose the 1.0 in 1e8 and return 0).
    let mut x = [0f32; 32];
    x[0] = 1e8;
    x[1] = 1.0;
    x[16] = -1e8;
    assert_eq!(dot_f32(&x, &[1f32; 32]), 1.0);
}

#[test]
fn dot_row_equals_dequantize_then_dot() {
    let m = meta();
    let n = m.random_rows * m.cols;
    let x = pseudo_normal(n, 9);
    for d in DType::ALL {
        let bytes = read_fixture(&format!("{}.random.bin", d.name()));
        let row = dequant(d, &bytes, n);
        let want = dot_f32(&row, &x);
        let got = dot_row(d, &bytes, &x).expect("dot_row");
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{d}: dot_row {got:e} != {want:e}"
        );
    }
    // Float rows with a tail (length not a multiple of 16) and longer than one internal chunk.
    for d in [DType::F32, DType::F16, DType::BF16] {
        let v = pseudo_normal(600, 13);
        for len in [1, 15, 17, 255, 257, 600] {
            let q = quantize(d, &v[..len]).expect("quantize");
            let want = dot_f32(&dequant(d, &q, len), &x[..len]);
            let got = dot_row(d, &q, &x[..len]).expect("dot_row");
            assert_eq!(got.to_bits(), want.to_bits(), "{d} len {len}");
        }
    }
}

fn assert_quant_err<T: std::fmt::Debug>(what: &str, r: Result<T, Error>) {
    match r {
        Err(Error::Quant(msg)) => assert!(!msg.is_empty(), "{what}: empty message"),
        other => panic!("{what}: expected Error::Quant, got {other:?}"),
    }
}

#[test]
fn length_errors_are_quant_errors() {
    for d in DType::ALL {
        let bs = d.block_size();
        let bb = d.block_bytes();
        let mut out = vec![0f32; 2 * bs];
        // One byte short, one byte long, and half the blocks.
        for len in [2 * bb - 1, 2 * bb + 1, bb] {
            assert_quant_err(
                &format!("{d} {len} bytes"),
                dequantize_row(d, &vec![0u8; len], &mut out),
            );
        }
        assert_quant_err(&format!("{d} dot_row"), dot_row(d, &vec![0u8; bb], &out));
        if bs > 1 {
            // Element counts that are not whole blocks.
            let mut odd = vec![0f32; bs + 1];
            assert_quant_err(
                &format!("{d} partial block"),
                dequantize_row(d, &vec![0u8; 2 * bb], &mut odd),
            );
            assert_quant_err(&format!("{d} quantize partial"), quantize(d, &odd));
            let mut rows = vec![0f32; 2 * (bs + 1)];
            assert_quant_err(
                &format!("{d} rows partial"),
                dequantize_rows_into(d, &vec![0u8; 4 * bb], 2, bs + 1, &mut rows),
            );
        }
        assert_quant_err(
            &format!("{d} rows wrong output"),
            dequantize_rows_into(d, &vec![0u8; 2 * bb], 2, bs, &mut vec![0f32; 3 * bs]),
        );
        // Empty input is fine.
        dequantize_row(d, &[], &mut []).expect("empty row");
    }
    for d in [DType::Q2_K, DType::Q3_K, DType::IQ4_XS] {
        assert!(
            matches!(quantize(d, &[0f32; 256]), Err(Error::Unsupported(_))),
            "{d}"
        );
    }
}

//! `memra-verify kernels`: every CUDA kernel against the CPU reference on fresh random inputs,
//! odd shapes included. Output buffers are poisoned with NaN before each launch, so an
//! unwritten element fails. Matmul rows are also checked bitwise across M (row invariance).

use memra_engine::backend::cpu::ops;
use memra_engine::backend::cuda::Gpu;
use memra_engine::config::Arch;
use memra_engine::models::random::{splitmix, tiny_config};
use memra_engine::ops::rope::Rope;
use memra_engine::quant::{DType, dequantize_row, dot_row, quantize};
use memra_engine::{Error, Result};

use crate::case::compare;
pub use crate::case::{Case, rand_vec, report};

/// Relative tolerance per weight type. The kernels follow the CPU's operation order, so all are
/// expected to be exact, except F32 (matmul_f32_rows: 8 K chunks, fma, a lane tree: the GPU's
/// own order, within ~K ulps of the CPU's dot_f32, 1e-5 of the largest output at K <= 576).
fn matmul_tol(_d: DType) -> f64 {
    1e-5
}

const MATMUL_TYPES: [DType; 11] = [
    DType::F32,
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
];
const NS: [usize; 5] = [1, 3, 17, 576, 1000];
const MS: [usize; 6] = [1, 2, 7, 8, 9, 33];

fn ks(d: DType) -> Vec<usize> {
    match d.block_size() {
        1 => vec![16, 77, 576],
        32 => vec![32, 96, 576],
        _ => vec![256, 768],
    }
}

fn matmul_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let mut stream = 100;
    for dtype in MATMUL_TYPES {
        for &n in &NS {
            for k in ks(dtype) {
                stream += 1;
                let wv = rand_vec(seed, stream, n * k, 1.0);
                let wq = quantize(dtype, &wv)?;
                let row_bytes = wq.len() / n;
                let mmax = *MS.iter().max().unwrap_or(&1);
                let x = rand_vec(seed, stream + 50_000, mmax * k, 1.0);
                let dw = g.upload(&wq)?;
                let dx = g.upload(&x)?;
                let dy = g.zeros::<f32>(mmax * n)?;
                let mut first: Option<Vec<f32>> = None;
                for &m in &MS {
                    g.fill(g.ptr(&dy), f32::NAN, mmax * n)?;
                    g.matmul(
                        dtype,
                        g.ptr(&dw),
                        row_bytes,
                        g.ptr(&dx),
                        g.ptr(&dy),
                        m,
                        n,
                        k,
                    )?;
                    let got = g.download_range(&dy, 0, m * n)?;
                    let mut want = vec![0f32; m * n];
                    for mi in 0..m {
                        for ni in 0..n {
                            let row = &wq[ni * row_bytes..(ni + 1) * row_bytes];
                            want[mi * n + ni] = dot_row(dtype, row, &x[mi * k..(mi + 1) * k])?;
                        }
                    }
                    let mut c = compare(
                        &format!("matmul_{dtype}"),
                        format!("M={m} N={n} K={k}"),
                        &got,
                        &want,
                        matmul_tol(dtype),
                    );
                    // Row invariance: row 0 has the same bits at every M.
                    c.check_row0(&mut first, &got[..n]);
                    out.push(c);
                }
            }
        }
    }
    Ok(())
}

fn embed_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let vocab = 37;
    for (si, dtype) in MATMUL_TYPES.into_iter().enumerate() {
        for k in ks(dtype) {
            let wv = rand_vec(seed, 900 + si as u64, vocab * k, 1.0);
            let wq = quantize(dtype, &wv)?;
            let row_bytes = wq.len() / vocab;
            let tokens: Vec<u32> = (0..9u64)
                .map(|i| (splitmix(seed, 77, i) % vocab as u64) as u32)
                .collect();
            let (dw, dt) = (g.upload(&wq)?, g.upload(&tokens)?);
            let dy = g.zeros::<f32>(tokens.len() * k)?;
            g.fill(g.ptr(&dy), f32::NAN, tokens.len() * k)?;
            g.embed(
                dtype,
                g.ptr(&dw),
                row_bytes,
                g.ptr(&dt),
                g.ptr(&dy),
                tokens.len(),
                k,
            )?;
            let got = g.download(&dy)?;
            let mut want = vec![0f32; tokens.len() * k];
            for (t, w) in tokens.iter().zip(want.chunks_exact_mut(k)) {
                let r = *t as usize * row_bytes;
                dequantize_row(dtype, &wq[r..r + row_bytes], w)?;
            }
            let shape = format!("rows={} K={k}", tokens.len());
            out.push(compare(&format!("embed_{dtype}"), shape, &got, &want, 0.0));
        }
    }
    Ok(())
}

fn norm_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for (i, &(rows, width)) in [(1, 64), (7, 576), (33, 77), (3, 4096)].iter().enumerate() {
        let x = rand_vec(seed, 1000 + i as u64, rows * width, 2.0);
        let w: Vec<f32> = rand_vec(seed, 1100 + i as u64, width, 0.2)
            .iter()
            .map(|v| 1.0 + v)
            .collect();
        let mut want = vec![0f32; rows * width];
        for (o, r) in want.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
            ops::rms_norm(r, &w, 1e-5, o);
        }
        let (dx, dw) = (g.upload(&x)?, g.upload(&w)?);
        let dy = g.zeros::<f32>(rows * width)?;
        g.fill(g.ptr(&dy), f32::NAN, rows * width)?;
        g.rms_norm(g.ptr(&dx), g.ptr(&dw), g.ptr(&dy), rows, width, 1e-5)?;
        let got = g.download(&dy)?;
        out.push(compare(
            "rms_norm",
            format!("rows={rows} width={width}"),
            &got,
            &want,
            1e-6,
        ));
        // In place (per-head q/k norm).
        g.rms_norm(g.ptr(&dx), g.ptr(&dw), g.ptr(&dx), rows, width, 1e-5)?;
        let got = g.download(&dx)?;
        out.push(compare(
            "rms_norm (in place)",
            format!("rows={rows} width={width}"),
            &got,
            &want,
            1e-6,
        ));
    }
    Ok(())
}

fn rope_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for (i, &(rows, heads, hd)) in [(1, 1, 64), (7, 3, 64), (9, 4, 128)].iter().enumerate() {
        let cfg = tiny_config(Arch::Llama, 10);
        let rope = Rope::new(hd, cfg.rope_theta, None, None);
        let len = 512;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..len {
            let (c, s) = rope.cos_sin(p);
            cos.extend(c);
            sin.extend(s);
        }
        let pos: Vec<u32> = (0..rows as u64)
            .map(|r| (splitmix(seed, 1200 + i as u64, r) % len as u64) as u32)
            .collect();
        let x = rand_vec(seed, 1300 + i as u64, rows * heads * hd, 1.0);
        let mut want = x.clone();
        for (r, row) in want.chunks_exact_mut(heads * hd).enumerate() {
            let (c, s) = rope.cos_sin(pos[r]);
            ops::rope_apply(row, hd, &c, &s);
        }
        let (dx, dp, dc, ds) = (
            g.upload(&x)?,
            g.upload(&pos)?,
            g.upload(&cos)?,
            g.upload(&sin)?,
        );
        g.rope(
            g.ptr(&dx),
            g.ptr(&dp),
            (g.ptr(&dc), g.ptr(&ds), hd / 2),
            rows,
            heads,
            hd,
        )?;
        let got = g.download(&dx)?;
        out.push(compare(
            "rope",
            format!("rows={rows} heads={heads} hd={hd}"),
            &got,
            &want,
            1e-6,
        ));
    }
    // M-RoPE (qwen2vl, qwen3vl): the `*_mrope` kernels.
    super::mrope_check::mrope_cases(g, seed, out)
}

fn elementwise_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for (i, &(rows, width)) in [(1, 17), (33, 1000)].iter().enumerate() {
        let n = rows * width;
        let s = 1400 + 10 * i as u64;
        let (a, b, bias) = (
            rand_vec(seed, s, n, 3.0),
            rand_vec(seed, s + 1, n, 3.0),
            rand_vec(seed, s + 2, width, 1.0),
        );
        let shape = format!("rows={rows} width={width}");
        let (da, db, dbias) = (g.upload(&a)?, g.upload(&b)?, g.upload(&bias)?);
        g.swiglu(g.ptr(&da), g.ptr(&db), n)?;
        let mut want = a.clone();
        ops::swiglu(&mut want, &b);
        out.push(compare(
            "swiglu",
            shape.clone(),
            &g.download(&da)?,
            &want,
            1e-6,
        ));
        gemma_elementwise(g, (&a, &b), &shape, out)?;
        let da = g.upload(&a)?;
        g.add_in_place(g.ptr(&da), g.ptr(&db), n)?;
        let mut want = a.clone();
        ops::add_in_place(&mut want, &b);
        out.push(compare(
            "add_in_place",
            shape.clone(),
            &g.download(&da)?,
            &want,
            0.0,
        ));
        let da = g.upload(&a)?;
        g.add_bias(g.ptr(&da), g.ptr(&dbias), rows, width)?;
        let mut want = a.clone();
        for r in want.chunks_exact_mut(width) {
            ops::add_in_place(r, &bias);
        }
        out.push(compare(
            "add_bias",
            shape.clone(),
            &g.download(&da)?,
            &want,
            0.0,
        ));
        // gather_rows: reversed row order.
        let idx: Vec<u32> = (0..rows as u32).rev().collect();
        let (dsrc, didx) = (g.upload(&a)?, g.upload(&idx)?);
        let ddst = g.zeros::<f32>(n)?;
        g.fill(g.ptr(&ddst), f32::NAN, n)?;
        g.gather_rows(g.ptr(&ddst), g.ptr(&dsrc), g.ptr(&didx), rows, width)?;
        let want: Vec<f32> = idx
            .iter()
            .flat_map(|&r| a[r as usize * width..(r as usize + 1) * width].to_vec())
            .collect();
        out.push(compare(
            "gather_rows",
            shape,
            &g.download(&ddst)?,
            &want,
            0.0,
        ));
    }
    Ok(())
}

/// GeGLU (tanh GELU), scale and softcap against the CPU's ops on `a` (gate / x) and `b` (up),
/// and on `a` x 10 (tanh saturated). `scale` is one rounded product: exact. GeGLU and softcap
/// use the GPU's own tanhf: within 1e-6 (relative to the largest value; docs/VERIFY.md).
fn gemma_elementwise(
    g: &Gpu,
    (a, b): (&[f32], &[f32]),
    shape: &str,
    out: &mut Vec<Case>,
) -> Result<()> {
    let big: Vec<f32> = a.iter().map(|v| v * 10.0).collect();
    let db = g.upload(b)?;
    for (x, what) in [(a, ""), (&big[..], " x10")] {
        let n = x.len();
        let shape = format!("{shape}{what}");
        let dx = g.upload(x)?;
        g.geglu_tanh(g.ptr(&dx), g.ptr(&db), n)?;
        let mut want = x.to_vec();
        ops::geglu_tanh(&mut want, b);
        let got = g.download(&dx)?;
        out.push(compare("geglu_tanh", shape.clone(), &got, &want, 1e-6));
        let dx = g.upload(x)?;
        g.scale(g.ptr(&dx), 25.298_222, n)?;
        let want: Vec<f32> = x.iter().map(|v| v * 25.298_222).collect();
        let got = g.download(&dx)?;
        out.push(compare("scale_in_place", shape.clone(), &got, &want, 0.0));
        for cap in [30.0f32, 2.5] {
            let dx = g.upload(x)?;
            g.softcap(g.ptr(&dx), cap, n)?;
            let mut want = x.to_vec();
            ops::softcap(&mut want, cap);
            let got = g.download(&dx)?;
            let shape = format!("{shape} cap={cap}");
            out.push(compare("softcap", shape, &got, &want, 1e-6));
        }
    }
    Ok(())
}

fn argmax_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    // SmolLM2's vocabulary (float4 loads, the unrolled loop only), a 262,292-float row (the
    // unrolled loop and its tail), an odd width and a row one float past a 16-byte address (the
    // scalar loop).
    for (k, (rows, width, skew)) in [
        (5, 49_152, 0),
        (3, 262_292, 0),
        (4, 1_001, 0),
        (2, 4_096, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let salt = 1500 + 3 * k as u64;
        let mut x = rand_vec(seed, salt, skew + rows * width, 10.0);
        // Row r: a planted maximum at two places; the lower index must win.
        let mut want = Vec::new();
        for r in 0..rows {
            let a = (splitmix(seed, salt + 1, r as u64) % width as u64) as usize;
            let b = (splitmix(seed, salt + 2, r as u64) % width as u64) as usize;
            x[skew + r * width + a] = 50.0;
            x[skew + r * width + b] = 50.0;
            want.push(a.min(b) as f32);
        }
        let dx = g.upload(&x)?;
        let di = g.zeros::<u32>(rows)?;
        g.argmax_rows(g.ptr(&dx) + 4 * skew as u64, g.ptr(&di), rows, width)?;
        let got: Vec<f32> = g.download(&di)?.iter().map(|&v| v as f32).collect();
        out.push(compare(
            "argmax_rows",
            format!("rows={rows} width={width} offset={skew}"),
            &got,
            &want,
            0.0,
        ));
    }
    Ok(())
}

/// A group of kernel cases: appends its cases for device `g` and seed.
type Group = fn(&Gpu, u64, &mut Vec<Case>) -> Result<()>;

/// The kernel gate's case groups by name, in run order (`memra-verify kernels --only`).
pub const GROUPS: [(&str, Group); 16] = [
    ("matmul", matmul_cases),
    ("embed", embed_cases),
    ("norm", norm_cases),
    ("rope", rope_cases),
    ("elementwise", elementwise_cases),
    ("argmax", argmax_cases),
    ("select", super::kernels_select::select_kernel_cases),
    ("attention", super::attention_check::attention_cases),
    ("kv_write", super::kv_write_check::kv_write_cases),
    ("products", super::products_check::product_cases),
    (
        "product_geom",
        super::products_check::product_geometry_cases,
    ),
    ("moe", super::moe_check::moe_cases),
    ("glu", super::glu_check::glu_cases),
    ("fused", super::fused_check::fused_cases),
    ("delta", super::delta_check::delta_cases),
    ("vision", super::vision_check::vision_cases),
];

/// Checks a `--only` list against [`GROUPS`]; an unknown name is an error naming it.
pub fn check_groups(only: &[String]) -> Result<()> {
    match only.iter().find(|o| !GROUPS.iter().any(|(n, _)| n == o)) {
        Some(o) => Err(Error::Input(format!(
            "--only: unknown kernel group `{o}`; groups: {}",
            GROUPS.map(|(n, _)| n).join(", ")
        ))),
        None => Ok(()),
    }
}

/// Runs the kernel checks on device `device` (the groups named in `only`, or every group when
/// it is empty); returns the cases (failures included).
/// The cases of the groups in `only` (all when empty) on CUDA device `device`; with
/// `attn_split`, every attention launch on the CUDA-core split kernel ([`Gpu::force_attn_split`]).
pub fn run(device: usize, seed: u64, only: &[String], attn_split: bool) -> Result<Vec<Case>> {
    check_groups(only)?;
    let mut g = Gpu::open(device)?;
    if attn_split {
        g.force_attn_split();
    }
    let mut out = Vec::new();
    for (name, f) in GROUPS {
        if only.is_empty() || only.iter().any(|o| o == name) {
            f(&g, seed, &mut out)?;
        }
    }
    Ok(out)
}

/// An error for a failed gate.
pub fn gate_error(what: &str) -> Error {
    Error::Input(what.to_string())
}

#[cfg(test)]
mod group_tests {
    use super::*;

    #[test]
    fn only_names_known_groups() {
        assert!(check_groups(&[]).is_ok());
        assert!(check_groups(&["product_geom".into(), "moe".into()]).is_ok());
        let e = check_groups(&["products".into(), "prodcts".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`prodcts`") && e.contains("product_geom"), "{e}");
    }
}

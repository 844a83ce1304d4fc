//! The v2 tensor-core products (kernels/cu/products.cu) against the CPU reference, within the
//! per-type tolerance of docs/VERIFY.md (they keep the GPU's own arithmetic: f16 activations,
//! mma accumulation), and bitwise across M: row 0 has the same bits at every M and launch
//! geometry the device profile picks (EXACTNESS.md, row invariance).

use memra_engine::Result;
use memra_engine::backend::cuda::Gpu;
use memra_engine::backend::cuda::products::ActKind;
use memra_engine::backend::cuda::profile::{self, Launch, Profile};
use memra_engine::models::random::unit;
use memra_engine::quant::{DType, dequantize_row, quantize};

use crate::case::{Case, compare};

/// Tolerance on max |gpu - cpu| / max |cpu| (measured on the H200 over these cases: <= 4.4e-4
/// with f16 activations, q4_k <= 8.8e-4 (its weights are dequantized to f16 before the mma:
/// f16 scale and min per sub-block), q5_k <= 9.6e-4, <= 2.9e-3 with bf16; docs/VERIFY.md).
pub fn product_tol(d: DType) -> f64 {
    match (d, ActKind::of(d)) {
        (_, ActKind::BF16) => 5e-3,
        (DType::Q4_K | DType::Q5_K, _) => 2e-3,
        (_, ActKind::F16) => 1e-3,
    }
}

const TYPES: [DType; 10] = [
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    // Last, so that the types before keep the random streams of earlier sessions.
    DType::Q5_0,
    DType::Q5_1,
];
const NS: [usize; 4] = [1, 17, 576, 1040];
const MS: [usize; 6] = [1, 2, 9, 17, 33, 100];

fn ks(d: DType) -> Vec<usize> {
    match d.block_size() {
        1 => vec![40, 576],
        32 => vec![32, 96, 576],
        _ => vec![256, 768],
    }
}

/// A random `n` x `k` matrix of `dtype` from stream `stream`: its GGUF rows and their
/// dequantized values (the CPU reference's weights).
pub(crate) fn random_matrix(
    dtype: DType,
    n: usize,
    k: usize,
    seed: u64,
    stream: u64,
) -> Result<(Vec<u8>, Vec<f32>)> {
    let wv: Vec<f32> = (0..(n * k) as u64).map(|i| unit(seed, stream, i)).collect();
    let wq = quantize(dtype, &wv)?;
    let rb = wq.len() / n;
    let mut wd = vec![0f32; n * k];
    for r in 0..n {
        dequantize_row(
            dtype,
            &wq[r * rb..(r + 1) * rb],
            &mut wd[r * k..(r + 1) * k],
        )?;
    }
    Ok((wq, wd))
}

/// `x` as the products' activations hold it: f16 (clamped to +-65504) for every weight type
/// but BF16, bf16 for BF16 (products.cu `prep_store`, round to nearest even).
pub(crate) fn act_values(x: &[f32], dtype: DType) -> Vec<f32> {
    x.iter()
        .map(|&v| match dtype {
            DType::BF16 => half::bf16::from_f32(v).to_f32(),
            _ => half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_f32(),
        })
        .collect()
}

pub fn product_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let profile = Profile::for_device(g);
    let mut stream = 9000;
    for dtype in TYPES {
        for &n in &NS {
            for k in ks(dtype) {
                stream += 1;
                let (wq, wd) = random_matrix(dtype, n, k, seed, stream)?;
                let mmax = *MS.iter().max().unwrap_or(&1);
                let x: Vec<f32> = (0..(mmax * k) as u64)
                    .map(|i| unit(seed, stream + 50_000, i))
                    .collect();
                // The reference takes the activations as the products define them: each value
                // rounded to the activation type (f16 clamped to +-65504, bf16 for BF16), so a
                // case differs from it by the accumulation alone, also where the dot product
                // cancels (an N = 1 output near zero).
                let xa = act_values(&x, dtype);
                let w = g.upload_packed(&profile, dtype, &wq, n, k)?;
                let act = g.act_buf(w.act(), mmax, w.kp, true)?;
                let dx = g.upload(&x)?;
                let dy = g.zeros::<f32>(mmax * n)?;
                let mut first: Option<Vec<f32>> = None;
                for &m in &MS {
                    g.prepare(g.ptr(&dx), &act, m, k)?;
                    g.fill(g.ptr(&dy), f32::NAN, mmax * n)?;
                    g.product(&w, &act, g.ptr(&dy), None, m, profile.launch(m, dtype, n))?;
                    let got = g.download_range(&dy, 0, m * n)?;
                    let mut want = vec![0f32; m * n];
                    for mi in 0..m {
                        let xr = &xa[mi * k..(mi + 1) * k];
                        for ni in 0..n {
                            let wr = &wd[ni * k..(ni + 1) * k];
                            let s: f64 =
                                wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                            want[mi * n + ni] = s as f32;
                        }
                    }
                    let mut c = compare(
                        &format!("product_{dtype}"),
                        format!("M={m} N={n} K={k} nseg={}", w.nseg),
                        &got,
                        &want,
                        product_tol(dtype),
                    );
                    c.check_row0(&mut first, &got[..n]);
                    out.push(c);
                }
            }
        }
    }
    Ok(())
}

/// Large-M geometries bitwise against each other on every row: the register-tiled product, the
/// shared-memory product and (sm_90a) the warpgroup product, at M = 300 (several token blocks,
/// the last one partial) over N = 1040 (a partial row block) for the types with a warpgroup
/// kernel, plus the CPU tolerance.
pub fn product_geometry_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let profile = Profile::for_device(g);
    let (m, n) = (300usize, 1040usize);
    // Every type with a warpgroup kernel (the first three keep their streams of session 8).
    let types = [
        DType::F16,
        DType::BF16,
        DType::Q4_K,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q6_K,
    ];
    if let Some(d) = profile::WGMMA_TYPES
        .into_iter()
        .find(|d| !types.contains(d))
    {
        return Err(memra_engine::Error::Input(format!(
            "product_geometry_cases: {d} has a warpgroup kernel but no geometry case"
        )));
    }
    for (i, dtype) in types.into_iter().enumerate() {
        // Several k-tiles (KT = 256 for the K-quants, 64 otherwise) and segments.
        let k = if dtype.block_size() == 256 { 768 } else { 576 };
        let stream = 19_000 + 10 * i as u64;
        let (wq, wd) = random_matrix(dtype, n, k, seed, stream)?;
        let x: Vec<f32> = (0..(m * k) as u64)
            .map(|j| unit(seed, stream + 1, j))
            .collect();
        let mut want = vec![0f32; m * n];
        for mi in 0..m {
            for ni in 0..n {
                let s: f64 = wd[ni * k..(ni + 1) * k]
                    .iter()
                    .zip(&x[mi * k..(mi + 1) * k])
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                want[mi * n + ni] = s as f32;
            }
        }
        let w = g.upload_packed(&profile, dtype, &wq, n, k)?;
        let act = g.act_buf(w.act(), m, w.kp, true)?;
        let dx = g.upload(&x)?;
        let dy = g.zeros::<f32>(m * n)?;
        g.prepare(g.ptr(&dx), &act, m, k)?;
        let mut launches: Vec<(String, Launch)> = vec![
            ("mmq".into(), profile.launch(64, dtype, n)),
            ("smem".into(), profile::smem(4, 2)),
        ];
        if let Some(l) = profile::warpgroup(dtype).filter(|_| profile.wgmma) {
            launches.push(("wgmma".into(), l));
        }
        // The warp-specialized launches (F16 / BF16 on sm_90a): two computing warpgroups, and
        // three (the profile takes it per product where its waves pay).
        if let Some(l) = profile.warp_specialized(dtype).filter(|_| profile.wgmma) {
            launches.push(("wgmma-ws".into(), l));
        }
        if let Some(l) = profile
            .warp_specialized_wide(dtype)
            .filter(|_| profile.wgmma)
        {
            launches.push(("wgmma-ws3".into(), l));
        }
        let mut first: Option<Vec<f32>> = None;
        for (name, l) in launches {
            if !l.fits(dtype, profile.smem_max) {
                continue;
            }
            g.fill(g.ptr(&dy), f32::NAN, m * n)?;
            g.product(&w, &act, g.ptr(&dy), None, m, l)?;
            let got = g.download_range(&dy, 0, m * n)?;
            let mut c = compare(
                &format!("product_geom_{dtype}"),
                format!("{name} M={m} N={n} K={k} nseg={}", w.nseg),
                &got,
                &want,
                product_tol(dtype),
            );
            match &first {
                None => first = Some(got),
                Some(f) => {
                    if let Some(j) = f
                        .iter()
                        .zip(&got)
                        .position(|(a, b)| a.to_bits() != b.to_bits())
                    {
                        c.problem.get_or_insert_with(|| {
                            format!(
                                "row {} column {} differs from the first geometry's bits",
                                j / n,
                                j % n
                            )
                        });
                    }
                }
            }
            out.push(c);
        }
    }
    Ok(())
}

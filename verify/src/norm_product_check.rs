//! The decode products with their input's RMSNorm in the prologue (products.cu `mmqn_<type>`,
//! [`Gpu::product_norm`]) against the launches they replace, bit for bit (EXACTNESS.md): `norm_prep`
//! into a prepared buffer, then the split-K product into the same outputs. M = 1 to 8, types with
//! and without block sums, rows of a width that is not a multiple of 4 (the scalar staging), a
//! fused matrix split over three outputs, and matrices with more row tiles than resident blocks
//! (a block walks several tiles: with the next tile's weights requested early, a whole number of
//! rings per segment, and without).

use memra_engine::Result;
use memra_engine::backend::cuda::Gpu;
use memra_engine::backend::cuda::products::norm_product_fits;
use memra_engine::backend::cuda::profile::Profile;
use memra_engine::models::random::unit;
use memra_engine::quant::DType;

use crate::case::Case;
use crate::products_check::random_matrix;

/// (type, rows, width, outputs' rows): widths of several k-tiles and segments; the long
/// matrices have more row tiles than resident blocks.
const SHAPES: [(DType, usize, usize, &[usize]); 9] = [
    (DType::Q4_K, 1040, 768, &[1040]),
    (DType::Q6_K, 1040, 768, &[400, 400, 240]),
    (DType::Q4_1, 1040, 576, &[1040]),
    (DType::Q5_0, 520, 640, &[520]),
    (DType::Q8_0, 600, 1024, &[300, 300]),
    (DType::F16, 300, 1002, &[300]),
    (DType::BF16, 300, 1000, &[300]),
    (DType::Q4_K, 49_152, 512, &[49_152]),
    (DType::Q4_1, 40_000, 576, &[40_000]),
];

pub fn norm_product_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let profile = Profile::for_device(g);
    for (i, &(dtype, n, k, split)) in SHAPES.iter().enumerate() {
        let stream = 33_000 + 10 * i as u64;
        let (wq, _) = random_matrix(dtype, n, k, seed, stream)?;
        let w = g.upload_packed(&profile, dtype, &wq, n, k)?;
        let mmax = 8;
        let x: Vec<f32> = (0..(mmax * k) as u64)
            .map(|j| 3.0 * unit(seed, stream + 1, j))
            .collect();
        let nw: Vec<f32> = (0..k as u64)
            .map(|j| 1.5 * unit(seed, stream + 2, j))
            .collect();
        let (dx, dnw) = (g.upload(&x)?, g.upload(&nw)?);
        let act = g.act_buf(w.act(), mmax, w.kp, false)?;
        let (uy, fy) = (g.zeros::<f32>(mmax * n)?, g.zeros::<f32>(mmax * n)?);
        let eps = 1e-5f32;
        for m in [1usize, 2, 3, 5, 8] {
            let l = profile.launch(m, dtype, n);
            let shape = format!("M={m} N={n} K={k} nseg={} outputs={split:?}", w.nseg);
            if !norm_product_fits(&w, m, k, &l) {
                out.push(Case {
                    kernel: format!("norm_product_{dtype}"),
                    shape,
                    rel_err: 0.0,
                    tol: 0.0,
                    problem: Some(format!("{l:?} does not take the normed product")),
                });
                continue;
            }
            // Output i at column offset `at` of one buffer, rows of its own width.
            let outs = |base: u64| {
                let mut at = 0;
                split
                    .iter()
                    .map(|&c| {
                        let o = (base + (at * m * 4) as u64, c);
                        at += c;
                        o
                    })
                    .collect::<Vec<_>>()
            };
            g.fill(g.ptr(&uy), f32::NAN, mmax * n)?;
            g.fill(g.ptr(&fy), f32::NAN, mmax * n)?;
            g.norm_prep(g.ptr(&dx), g.ptr(&dnw), None, &act, m, k, eps)?;
            g.product_to(&w, &act, &outs(g.ptr(&uy)), None, m, l)?;
            g.product_norm(&w, (g.ptr(&dx), g.ptr(&dnw), eps, k), &outs(g.ptr(&fy)), m, l)?;
            let want = g.download_range(&uy, 0, m * n)?;
            let got = g.download_range(&fy, 0, m * n)?;
            let problem = match want
                .iter()
                .zip(&got)
                .position(|(a, b)| a.to_bits() != b.to_bits())
            {
                Some(j) => Some(format!(
                    "value {j} is {} where norm_prep + product give {}",
                    got[j], want[j]
                )),
                None if want.iter().any(|v| v.is_nan()) => {
                    Some("an output was not written".into())
                }
                None => None,
            };
            out.push(Case {
                kernel: format!("norm_product_{dtype}"),
                shape,
                rel_err: 0.0,
                tol: 0.0,
                problem,
            });
        }
    }
    Ok(())
}

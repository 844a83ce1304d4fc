//! The SwiGLU epilogue of the warp-specialized product (products.cu `mws_glu_<type>`, issue 8):
//! a gate/up matrix interleaved by 8 (`quant::repack::interleave_glu`) gives, split back into
//! gate and up (`Outs` GLU_ILV), the bits of the plain fused matrix at every launch; and the
//! epilogue's `act(gate) * up`, prepared for the down product, has the bits of the plain product
//! followed by `swiglu_prep` (EXACTNESS.md: the fusion must not move an output bit).

use memra_engine::Result;
use memra_engine::backend::cuda::Gpu;
use memra_engine::backend::cuda::products::ActBuf;
use memra_engine::backend::cuda::profile::Profile;
use memra_engine::models::random::unit;
use memra_engine::quant::DType;
use memra_engine::quant::repack::interleave_glu;

use crate::case::{Case, compare};
use crate::products_check::random_matrix;

/// The first element whose bits differ, as a problem line.
fn first_difference<T: PartialEq>(what: &str, got: &[T], want: &[T]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .map(|i| format!("{what}: element {i} differs from the unfused path's bits"))
}

/// The prepared activations of `a` (values as bytes, block sums), `m` rows.
fn prepared(g: &Gpu, a: &ActBuf, m: usize) -> Result<(Vec<u8>, Vec<u8>)> {
    let values = g.download_range(&a.values, 0, m * a.kp * 2)?;
    let sums = g.download_range(&a.scales, 0, m * (a.kp / 32) * 4)?;
    Ok((values, sums))
}

pub fn glu_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let profile = Profile::for_device(g);
    // 200 features (kp 256: a partial last 64-feature block, zero padding), 576 columns (9
    // k-tiles, several segments), 300 tokens (a partial last 128-token block).
    let (ff, k, m) = (200usize, 576usize, 300usize);
    for (i, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
        let stream = 23_000 + 10 * i as u64;
        let (gq, gd) = random_matrix(dtype, ff, k, seed, stream)?;
        let (uq, _) = random_matrix(dtype, ff, k, seed, stream + 1)?;
        let x: Vec<f32> = (0..(m * k) as u64)
            .map(|j| unit(seed, stream + 2, j))
            .collect();
        let plain = [gq.as_slice(), uq.as_slice()].concat();
        let ilv = interleave_glu(&gq, &uq, ff, gq.len() / ff)?;
        let wp = g.upload_packed(&profile, dtype, &plain, 2 * ff, k)?;
        let wi = g.upload_packed(&profile, dtype, &ilv, 2 * ff, k)?;
        let act = g.act_buf(wp.act(), m, wp.kp, true)?;
        let dx = g.upload(&x)?;
        g.prepare(g.ptr(&dx), &act, m, k)?;
        // The plain fused product (M = 64's launch) into gate, up; its gate against the CPU.
        let (gr, ur) = (g.zeros::<f32>(m * ff)?, g.zeros::<f32>(m * ff)?);
        let small = profile.launch(64, dtype, 2 * ff);
        let outs = [(g.ptr(&gr), ff), (g.ptr(&ur), ff)];
        g.product_to(&wp, &act, &outs, None, m, small)?;
        let (gref, uref) = (
            g.download_range(&gr, 0, m * ff)?,
            g.download_range(&ur, 0, m * ff)?,
        );
        let mut want = vec![0f32; m * ff];
        for (mi, row) in want.chunks_exact_mut(ff).enumerate() {
            let xr = &x[mi * k..(mi + 1) * k];
            for (f, w) in row.iter_mut().enumerate() {
                let dot: f64 = gd[f * k..(f + 1) * k]
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                *w = dot as f32;
            }
        }
        let tol = crate::products_check::product_tol(dtype);
        out.push(compare(
            &format!("glu_plain_{dtype}"),
            format!("gate M={m} FF={ff} K={k}"),
            &gref,
            &want,
            tol,
        ));
        // The interleaved matrix split back, at the same launch and at the warp-specialized one.
        let mut launches = vec![("mmq", small)];
        let ws = profile.warp_specialized(dtype).filter(|_| profile.wgmma);
        let ws3 = profile
            .warp_specialized_wide(dtype)
            .filter(|_| profile.wgmma);
        launches.extend(ws.map(|l| ("ws", l)));
        launches.extend(ws3.map(|l| ("ws3", l)));
        for (name, l) in &launches {
            let (gs, us) = (g.zeros::<f32>(m * ff)?, g.zeros::<f32>(m * ff)?);
            g.fill(g.ptr(&gs), f32::NAN, m * ff)?;
            g.fill(g.ptr(&us), f32::NAN, m * ff)?;
            g.product_glu_split(&wi, &act, (g.ptr(&gs), g.ptr(&us)), m, *l)?;
            let (gv, uv) = (
                g.download_range(&gs, 0, m * ff)?,
                g.download_range(&us, 0, m * ff)?,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            let mut c = compare(
                &format!("glu_split_{dtype}"),
                format!("{name} M={m} FF={ff} K={k}"),
                &gv,
                &gref,
                0.0,
            );
            c.problem = c
                .problem
                .or_else(|| first_difference("gate", &bits(&gv), &bits(&gref)))
                .or_else(|| first_difference("up", &bits(&uv), &bits(&uref)));
            out.push(c);
        }
        // The SwiGLU epilogue (two and three computing warpgroups) against the plain product
        // then swiglu_prep, bitwise.
        if ws.is_none() {
            continue;
        }
        let kp = ff.next_multiple_of(64);
        let want_act = g.act_buf(wp.act(), m, kp, false)?;
        g.swiglu_prep(g.ptr(&gr), g.ptr(&ur), None, &want_act, m, ff)?;
        let (wv, wsum) = prepared(g, &want_act, m)?;
        for (name, l) in [("ws", ws), ("ws3", ws3)] {
            let Some(l) = l else { continue };
            let mut got_act = g.act_buf(wp.act(), m, kp, false)?;
            // Unwritten bytes show: the buffer starts as all ones.
            got_act.values = g.upload(&vec![0xffu8; m * kp * 2])?;
            got_act.scales = g.upload(&vec![0xffu8; m * (kp / 32) * 4])?;
            g.product_glu(&wi, &act, &got_act, m, l)?;
            let (gv, gsum) = prepared(g, &got_act, m)?;
            let as_f32 = |b: &[u8]| b.iter().map(|&x| x as f32).collect::<Vec<f32>>();
            let mut c = compare(
                &format!("glu_epilogue_{dtype}"),
                format!("{name} M={m} FF={ff} K={k} kp={kp}"),
                &as_f32(&gv),
                &as_f32(&wv),
                0.0,
            );
            c.problem = c
                .problem
                .or_else(|| first_difference("prepared values", &gv, &wv))
                .or_else(|| first_difference("block sums", &gsum, &wsum));
            out.push(c);
        }
    }
    Ok(())
}

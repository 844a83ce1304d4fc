//! The fused post-norm and GeGLU kernels (products.cu `add_norm_prep`, `geglu_prep`; Gemma 3's
//! sandwich norms and its GeGLU FFN) against the unfused launches they replace, bit for bit
//! (EXACTNESS.md: a fusion must not move an output bit): `rms_norm` of the sublayer output, then
//! `add_in_place` into the residual, then `norm_prep` of the new residual; `geglu_tanh` then
//! `prepare_h16`. Rows of 1 and 3, widths with and without a partial 32-column block. And the
//! per-head q/k norms with RoPE and the KV write (`rope_kv_norm_<fmt>`, qwen3 / Gemma 3) against
//! `rms_norm` twice then `rope_kv_<fmt>`, for every cache format, whole and partial RoPE. And a
//! decode step's MoE router (`moe_norm_route`: RMSNorm, F32 router product, routing, one launch)
//! against `rms_norm`, `matmul_f32_rows` and `moe_route`, M = 1 to 8, twice in a row (its ticket
//! is left at 0 for the next launch). And qwen3next's fused tails: the gated DeltaNet's output
//! gating prepared for its product (`norm_gate_prep`) against `rms_norm` per head, `swiglu` and
//! `prepare`, and the gated shared expert into the residual (`gated_add`) against `sigmoid_mul`
//! and two `add_in_place`.

use memra_engine::Result;
use memra_engine::backend::KvDtype;
use memra_engine::backend::cuda::Gpu;
use memra_engine::backend::cuda::products::{ActBuf, ActKind};
use memra_engine::ops::rope::Rope;

use crate::case::{Case, bytes_of, rand_vec, same_bytes};
use crate::rope_kv_run::{Heads, Table, rope_kv_bytes, tables};

/// A case that passes when `got` and `want` have the same bits.
fn same_bits(name: &str, shape: String, got: &[u8], want: &[u8]) -> Case {
    same_bytes(name, shape, got, want, "the unfused launches")
}

/// The prepared activations of `a` (`m` rows: values, then block sums) as bytes.
fn prepared(g: &Gpu, a: &ActBuf, m: usize) -> Result<Vec<u8>> {
    let mut out = g.download_range(&a.values, 0, m * a.kp * 2)?;
    out.extend(g.download_range(&a.scales, 0, m * (a.kp / 32) * 4)?);
    Ok(out)
}

pub fn fused_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    rope_norm_cases(g, seed, out)?;
    norm_route_cases(g, seed, out)?;
    delta_tail_cases(g, seed, out)?;
    for (i, &(m, width)) in [(1usize, 640usize), (3, 640), (1, 1000), (3, 2048)]
        .iter()
        .enumerate()
    {
        let st = 31_000 + 10 * i as u64;
        let n = m * width;
        let (o, x) = (rand_vec(seed, st, n, 4.0), rand_vec(seed, st + 1, n, 2.0));
        let (wp, w) = (
            rand_vec(seed, st + 2, width, 1.5),
            rand_vec(seed, st + 3, width, 1.5),
        );
        let kp = width.next_multiple_of(64);
        let (dwp, dw) = (g.upload(&wp)?, g.upload(&w)?);
        let shape = format!("M={m} width={width}");
        // With the next norm prepared, and without.
        for next in [true, false] {
            let (eps_post, eps) = (1e-6f32, 1e-5f32);
            // The unfused launches.
            let (uo, ux, uy) = (g.upload(&o)?, g.upload(&x)?, g.zeros::<f32>(n)?);
            let ua = g.act_buf(ActKind::F16, m, kp, false)?;
            g.rms_norm(g.ptr(&uo), g.ptr(&dwp), g.ptr(&uo), m, width, eps_post)?;
            g.add_in_place(g.ptr(&ux), g.ptr(&uo), n)?;
            if next {
                g.norm_prep(g.ptr(&ux), g.ptr(&dw), Some(g.ptr(&uy)), &ua, m, width, eps)?;
            }
            // The fused one.
            let (fo, fx, fy) = (g.upload(&o)?, g.upload(&x)?, g.zeros::<f32>(n)?);
            let fa = g.act_buf(ActKind::F16, m, kp, false)?;
            let nx = next.then(|| (g.ptr(&dw), g.ptr(&fy), &fa, eps));
            g.add_norm_prep(
                (g.ptr(&fo), g.ptr(&dwp), eps_post),
                g.ptr(&fx),
                nx,
                m,
                width,
            )?;
            let mut want = bytes_of(&g.download_range(&ux, 0, n)?);
            let mut got = bytes_of(&g.download_range(&fx, 0, n)?);
            if next {
                want.extend(bytes_of(&g.download_range(&uy, 0, n)?));
                want.extend(prepared(g, &ua, m)?);
                got.extend(bytes_of(&g.download_range(&fy, 0, n)?));
                got.extend(prepared(g, &fa, m)?);
            }
            let name = if next { "add_norm_prep" } else { "add_norm" };
            out.push(same_bits(name, shape.clone(), &got, &want));
            // `o` is left as it was by the fused kernel.
            let o_after = bytes_of(&g.download_range(&fo, 0, n)?);
            out.push(same_bits(
                "add_norm_keeps_o",
                shape.clone(),
                &o_after,
                &bytes_of(&o),
            ));
        }
        // GeGLU prepared for a product: geglu_tanh then prepare_h16, against geglu_prep.
        let (gv, uv) = (
            rand_vec(seed, st + 4, n, 3.0),
            rand_vec(seed, st + 5, n, 2.0),
        );
        let du = g.upload(&uv)?;
        let ug = g.upload(&gv)?;
        let ua = g.act_buf(ActKind::F16, m, kp, false)?;
        g.geglu_tanh(g.ptr(&ug), g.ptr(&du), n)?;
        g.prepare(g.ptr(&ug), &ua, m, width)?;
        let fg = g.upload(&gv)?;
        let fa = g.act_buf(ActKind::F16, m, kp, false)?;
        let glu = memra_engine::ops::Glu::GeluTanh;
        g.glu_prep(
            glu,
            (g.ptr(&fg), g.ptr(&du)),
            Some(g.ptr(&fg)),
            &fa,
            m,
            width,
        )?;
        let mut want = bytes_of(&g.download_range(&ug, 0, n)?);
        want.extend(prepared(g, &ua, m)?);
        let mut got = bytes_of(&g.download_range(&fg, 0, n)?);
        got.extend(prepared(g, &fa, m)?);
        out.push(same_bits("geglu_prep", shape, &got, &want));
    }
    Ok(())
}

/// `rope_kv_norm_<fmt>` against `rms_norm` of the q heads and of the k heads, then
/// `rope_kv_<fmt>`: Q, K and both caches, bit for bit.
fn rope_norm_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    // (rows, q heads, kv heads, head_dim, rotated pairs): qwen3-like, Gemma 3-like (256),
    // partial RoPE.
    let shapes = [
        (1usize, 8usize, 2usize, 128usize, 64usize),
        (3, 4, 1, 256, 128),
        (3, 4, 2, 64, 16),
    ];
    for (i, &(rows, heads, kv_heads, hd, rot)) in shapes.iter().enumerate() {
        let st = 32_000 + 10 * i as u64;
        let rope = Rope::new(2 * rot, 1.0e6, None, None);
        let (cos, sin) = tables(&rope, 64);
        let table = Table {
            pos: [0u32, 17, 63][..rows].to_vec(),
            sections: None,
            cos,
            sin,
            slot: [4u32, 0, 2][..rows].to_vec(),
            slots: 5,
        };
        let c = Heads::random(seed, st, (rows, heads, kv_heads, hd, rot));
        for kv in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Q8_0] {
            let run = |fused: bool| rope_kv_bytes(g, &c, &table, kv, (true, fused));
            let (want, got) = (run(false)?, run(true)?);
            let shape = format!("rows={rows} heads={heads}/{kv_heads} hd={hd} rot={rot} kv={kv}");
            out.push(same_bits("rope_kv_norm", shape, &got, &want));
        }
    }
    Ok(())
}

/// `moe_norm_route` against rms_norm, matmul_f32_rows and moe_route (then prepare_h16): h, the
/// logits, the expert ids and weights (and the prepared h), bit for bit.
fn norm_route_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    use memra_engine::backend::cuda::moe::Route;
    use memra_engine::quant::DType;
    // (hidden, experts, used, renormalised, shared): qwen3-30b-a3b's router, qwen3-next's (512
    // experts; and with its shared expert folded in: one more router row and slot), 257 experts
    // (a thread's second expert, keys past E in the 4-key scan) and 600 (the block routing).
    let routers = [
        (2048usize, 128usize, 8usize, true, false),
        (1000, 512, 10, false, false),
        (768, 257, 3, true, false),
        (1024, 512, 10, true, true),
        (512, 600, 6, true, true),
    ];
    for (i, &(width, e, k, norm, shared)) in routers.iter().enumerate() {
        let st = 33_000 + 10 * i as u64;
        let r = Route { e, k, norm, shared };
        let (le, ks) = (r.logits(), r.slots());
        let gw = rand_vec(seed, st, width, 1.5);
        let router = rand_vec(seed, st + 1, le * width, 0.2);
        let (dg, dw) = (g.upload(&gw)?, g.upload(&router)?);
        let ticket = g.zeros::<u32>(1)?;
        let eps = 1e-6f32;
        // Rows up to 8 as its shared memory holds them (4 of 2048).
        let fits = |m: &usize| m * width * 4 <= memra_engine::backend::cuda::moe::NORM_ROUTE_SMEM;
        for m in [1usize, 3, 4, 8].into_iter().filter(fits) {
            let x = rand_vec(seed, st + 2 + m as u64, m * width, 2.0);
            let dx = g.upload(&x)?;
            let kp = width.next_multiple_of(64);
            // `prep`: the fused launch also prepares h (bf16 for the 512-expert router), the
            // unfused ones run prepare_h16 after the norm.
            let run = |fused: bool, prep: bool| -> Result<Vec<u8>> {
                let (dh, dl) = (g.zeros::<f32>(m * width)?, g.zeros::<f32>(m * le)?);
                let (ids, wts) = (g.zeros::<u32>(m * ks)?, g.zeros::<f32>(m * ks)?);
                let kind = if i == 1 { ActKind::BF16 } else { ActKind::F16 };
                let act = g.act_buf(kind, m, kp, false)?;
                let (px, ph, pl) = (g.ptr(&dx), g.ptr(&dh), g.ptr(&dl));
                if fused {
                    let idw = (g.ptr(&ticket), g.ptr(&ids), g.ptr(&wts));
                    let xnh = (px, g.ptr(&dg), eps, ph);
                    let a = prep.then_some(&act);
                    g.moe_norm_route(xnh, (g.ptr(&dw), width * 4), pl, idw, (m, width), a, r)?;
                } else {
                    g.rms_norm(px, g.ptr(&dg), ph, m, width, eps)?;
                    g.matmul(DType::F32, g.ptr(&dw), width * 4, ph, pl, m, le, width)?;
                    g.moe_route(pl, (g.ptr(&ids), g.ptr(&wts)), m, r)?;
                    if prep {
                        g.prepare(ph, &act, m, width)?;
                    }
                }
                let mut b = bytes_of(&g.download(&dh)?);
                b.extend(bytes_of(&g.download(&dl)?));
                b.extend(g.download(&ids)?.iter().flat_map(|v| v.to_le_bytes()));
                b.extend(bytes_of(&g.download(&wts)?));
                if prep {
                    b.extend(prepared(g, &act, m)?);
                }
                Ok(b)
            };
            for prep in [false, true] {
                let want = run(false, prep)?;
                let shape = format!("M={m} hidden={width} E={e} k={k} shared={shared} prep={prep}");
                // Twice: the second launch finds the ticket the first left.
                for _ in 0..2 {
                    out.push(same_bits(
                        "moe_norm_route",
                        shape.clone(),
                        &run(true, prep)?,
                        &want,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// qwen3next's fused tails against the launches they replace, bit for bit: `norm_gate_prep`
/// (F16 and BF16 preparation, heads of 64 and 128) and `gated_add` (one gate per row, M 1 and 3).
fn delta_tail_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    for (i, &(m, group, heads)) in [(1usize, 128usize, 4usize), (3, 128, 2), (2, 64, 5)]
        .iter()
        .enumerate()
    {
        let st = 36_000 + 10 * i as u64;
        let (width, eps) = (group * heads, 1e-6f32);
        let n = m * width;
        let (c, z) = (rand_vec(seed, st, n, 3.0), rand_vec(seed, st + 1, n, 4.0));
        let dw = g.upload(&rand_vec(seed, st + 2, group, 1.5))?;
        let kp = width.next_multiple_of(64);
        let shape = format!("M={m} width={width} group={group}");
        for kind in [ActKind::F16, ActKind::BF16] {
            let (uc, uz) = (g.upload(&c)?, g.upload(&z)?);
            let ua = g.act_buf(kind, m, kp, false)?;
            g.rms_norm(g.ptr(&uc), g.ptr(&dw), g.ptr(&uc), n / group, group, eps)?;
            g.swiglu(g.ptr(&uz), g.ptr(&uc), n)?;
            g.prepare(g.ptr(&uz), &ua, m, width)?;
            let (fc, fz) = (g.upload(&c)?, g.upload(&z)?);
            let fa = g.act_buf(kind, m, kp, false)?;
            let cwz = (g.ptr(&fc), g.ptr(&dw), g.ptr(&fz));
            g.norm_gate_prep(cwz, Some(g.ptr(&fz)), &fa, m, width, group, eps)?;
            let mut want = bytes_of(&g.download_range(&uz, 0, n)?);
            want.extend(prepared(g, &ua, m)?);
            let mut got = bytes_of(&g.download_range(&fz, 0, n)?);
            got.extend(prepared(g, &fa, m)?);
            out.push(same_bits(
                "norm_gate_prep",
                format!("{shape} {kind:?}"),
                &got,
                &want,
            ));
        }
        // The shared expert's output `s`, gated per row, into `o` and the residual `x`.
        let rows = m;
        let (s, o, x) = (
            rand_vec(seed, st + 3, n, 2.0),
            rand_vec(seed, st + 4, n, 2.0),
            rand_vec(seed, st + 5, n, 2.0),
        );
        let gates = rand_vec(seed, st + 6, rows, 4.0);
        let dg = g.upload(&gates)?;
        let (us, uo, ux) = (g.upload(&s)?, g.upload(&o)?, g.upload(&x)?);
        g.sigmoid_mul(g.ptr(&us), g.ptr(&dg), rows, width, 1)?;
        g.add_in_place(g.ptr(&uo), g.ptr(&us), n)?;
        g.add_in_place(g.ptr(&ux), g.ptr(&uo), n)?;
        let (fs, fo, fx) = (g.upload(&s)?, g.upload(&o)?, g.upload(&x)?);
        g.gated_add(
            (g.ptr(&fx), g.ptr(&fo)),
            (g.ptr(&fs), g.ptr(&dg)),
            rows,
            width,
            1,
        )?;
        let mut want = bytes_of(&g.download_range(&ux, 0, n)?);
        want.extend(bytes_of(&g.download_range(&uo, 0, n)?));
        want.extend(bytes_of(&s));
        let mut got = bytes_of(&g.download_range(&fx, 0, n)?);
        got.extend(bytes_of(&g.download_range(&fo, 0, n)?));
        got.extend(bytes_of(&g.download_range(&fs, 0, n)?));
        out.push(same_bits("gated_add", shape, &got, &want));
    }
    Ok(())
}

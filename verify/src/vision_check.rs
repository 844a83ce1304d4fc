//! The vision tower's kernels (kernels/cu/vision.cu, launched through
//! `backend::cuda::vision_kernels::TowerKernels`) against float64 references written here, on
//! fresh random inputs with odd shapes (`memra-verify kernels`, group `vision`):
//!
//! - `vit_gemm_mma` (tensor cores): every epilogue (plain, tanh-GELU, added into the output,
//!   and the Qwen ViT's QuickGELU, erf-GELU and SiLU gate times the output), with and without a
//!   bias, K a multiple of 4 or not (the vector and scalar loads) and of the K tile or not (the
//!   weights' zero padding), M and N not multiples of the 128 x 128 tile, the towers' own shapes
//!   among them; against float64 over the f16-rounded inputs (the kernel's own, so only its f32
//!   accumulation is left); row 0 has the same bits at every M (a row's K order does not depend
//!   on the launch) and a second launch gives the same bits;
//! - `vit_qkv_half`: every value the nearest f16 (bit for bit), the head padding zeros;
//! - `vit_layer_norm` (also in place: the same bits), `vit_attn_mma_d<D>` for every head
//!   dimension built (72: Gemma 3's and Qwen3-VL's, 80: Qwen2.5-VL's) over patch counts around
//!   the 128-row query tile, against float64 over the f16 Q / K / V walking the kernel's key
//!   tiles with P rounded to f16 (so what is left is the f32 arithmetic);
//! - `vit_pool` and `vit_patches`: the CPU's exact values (bit for bit);
//! - the Qwen ViT's `qvit_patches` and `qvit_rope` (bit for bit the CPU's formulas) and
//!   `qvit_attn_win_mma_d<D>` for every head dimension built, over windows of several sizes (one
//!   of more than one 128-row query tile, one starting off the key tile) against the same
//!   float64 attention within each window.
//!
//! Every output buffer is poisoned with NaN first, so an unwritten element fails.

use memra_engine::Result;
use memra_engine::backend::cuda::Gpu;
use memra_engine::backend::cuda::vision_kernels::{
    Epilogue, HEAD_DIMS, Product, TowerKernels, half_qkv_len, padded_head, padded_k,
};

use crate::case::{Case, compare, rand_vec};

/// The f32 kernels (LayerNorm) against float64: a few ulps (expf / tanhf are the GPU's own).
pub const VIT_TOL: f64 = 1e-5;

/// The tensor-core product against float64 over the same f16 inputs: the products are exact,
/// what is left is the mma's f32 accumulation over K (its adds are not IEEE round-to-nearest:
/// a few ulps of the running sum per k-step of 16) and the epilogue in f32.
pub const MMA_TOL: f64 = 3e-5;

/// The tensor-core attention against float64 over the same f16 Q / K / V, the same key tiles
/// and P rounded to f16: what is left is the f32 scores and sums, `ex2.approx`, and a p whose
/// f32 and float64 values round to neighbouring f16 values (2^-11 of that p).
pub const ATT_TOL: f64 = 5e-4;

fn f16r(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x)).tanh())
}

/// erf to double precision (Abramowitz-Stegun 7.1.26 is not enough: the series for |x| < 3,
/// the continued fraction of erfc beyond).
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let v = if z < 3.0 {
        // erf(z) = 2/sqrt(pi) sum_n (-1)^n z^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, mut n) = (z, z, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -z * z / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(z) = exp(-z^2) / sqrt(pi) / (z + 1/2 / (z + 1 / (z + 3/2 / (z + ...))))
        let mut f = z;
        for k in (1..60).rev() {
            f = z + (k as f64 / 2.0) / f;
        }
        1.0 - (-z * z).exp() / std::f64::consts::PI.sqrt() / f
    };
    if x < 0.0 { -v } else { v }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A case that fails with `problem` unless `ok`.
fn flag(kernel: &str, shape: String, ok: bool, problem: &str) -> Case {
    Case {
        kernel: kernel.into(),
        shape,
        rel_err: 0.0,
        tol: 0.0,
        problem: (!ok).then(|| problem.to_string()),
    }
}

pub fn vision_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    product_cases(g, seed, out)?;
    layer_norm_cases(g, seed, out)?;
    attention_cases(g, seed, out)?;
    pool_patch_cases(g, seed, out)?;
    qwen_cases(g, seed, out)
}

/// (M, N, K): odd sizes, one tile and a bit, and the towers' shapes (patch rows of a 224 image
/// at Gemma 3's widths: K = 588 patch values, 1152 hidden, 4304 FFN; 300 rows of Qwen2.5-VL's
/// FFN down, K = 3420 not a multiple of the K tile).
const PRODUCTS: [(usize, usize, usize); 8] = [
    (1, 1, 1),
    (5, 3, 17),
    (37, 129, 16),
    (130, 200, 100),
    (129, 130, 33),
    (256, 1152, 588),
    (256, 1152, 4304),
    (300, 1280, 3420),
];

fn product_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let k = TowerKernels { dev: g };
    for (i, &(m, n, kk)) in PRODUCTS.iter().enumerate() {
        let st = 60_000 + 10 * i as u64;
        let x = rand_vec(seed, st, m * kk, 1.0);
        let wf = rand_vec(seed, st + 1, n * kk, 1.0 / (kk as f32).sqrt());
        let bias = rand_vec(seed, st + 2, n, 0.5);
        let y0 = rand_vec(seed, st + 3, m * n, 2.0);
        // The weights as the tower uploads them: f16 rows padded with zeros to kp.
        let kp = padded_k(kk);
        let mut wh = vec![0u16; n * kp];
        for (r, row) in wf.chunks_exact(kk).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                wh[r * kp + j] = half::f16::from_f32(v).to_bits();
            }
        }
        let (dx, dwh, db) = (g.upload(&x)?, g.upload(&wh)?, g.upload(&bias)?);
        let mut dy = g.zeros::<f32>(m * n)?;
        // The products in f64 of the f16 inputs, before the bias.
        let (x16, w16): (Vec<f64>, Vec<f64>) = (
            x.iter().map(|&v| f16r(v) as f64).collect(),
            wf.iter().map(|&v| f16r(v) as f64).collect(),
        );
        let dots: Vec<f64> = (0..m * n)
            .map(|e| {
                let (r, c) = (e / n, e % n);
                (0..kk).map(|j| x16[r * kk + j] * w16[c * kk + j]).sum()
            })
            .collect();
        for (e, has_bias) in [
            (Epilogue::Plain, true),
            (Epilogue::Plain, false),
            (Epilogue::Gelu, true),
            (Epilogue::Add, true),
            (Epilogue::QuickGelu, true),
            (Epilogue::GeluErf, true),
            (Epilogue::MulSilu, false),
        ] {
            let want: Vec<f32> = dots
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    let v = d + if has_bias { bias[i % n] as f64 } else { 0.0 };
                    let y = y0[i] as f64;
                    (match e {
                        Epilogue::Plain => v,
                        Epilogue::Gelu => gelu(v),
                        Epilogue::Add => y + v,
                        Epilogue::QuickGelu => v / (1.0 + (-1.702 * v).exp()),
                        Epilogue::GeluErf => {
                            0.5 * v * (1.0 + erf(v * std::f64::consts::FRAC_1_SQRT_2))
                        }
                        Epilogue::MulSilu => y * v / (1.0 + (-v).exp()),
                    }) as f32
                })
                .collect();
            let mut launch = |rows: usize| -> Result<Vec<f32>> {
                match e {
                    Epilogue::Add | Epilogue::MulSilu => g
                        .stream
                        .memcpy_htod(&y0, &mut dy)
                        .map_err(|x| g.err(format!("upload: {x:?}")))?,
                    _ => g.fill(g.ptr(&dy), f32::NAN, m * n)?,
                }
                k.product(&Product {
                    x: g.ptr(&dx),
                    w: g.ptr(&dwh),
                    bias: has_bias.then(|| g.ptr(&db)),
                    y: g.ptr(&dy),
                    m: rows,
                    n,
                    k: kk,
                    kp,
                    epilogue: e,
                })?;
                g.download_range(&dy, 0, rows * n)
            };
            let got = launch(m)?;
            let shape = format!("M={m} N={n} K={kk} {e:?} bias={has_bias}");
            let mut c = compare("vit_gemm_mma", shape.clone(), &got, &want, MMA_TOL);
            let again = launch(m)?;
            if bits(&again) != bits(&got) && c.problem.is_none() {
                c.problem = Some("a second launch gave other bits".into());
            }
            let mut first = Some(got[..n].to_vec());
            c.check_row0(&mut first, &launch(1)?[..n]);
            out.push(c);
        }
    }
    Ok(())
}

fn layer_norm_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let k = TowerKernels { dev: g };
    for (i, &(rows, width)) in [(1usize, 32usize), (9, 1152), (13, 77), (33, 1000)]
        .iter()
        .enumerate()
    {
        let st = 61_000 + 10 * i as u64;
        let x: Vec<f32> = rand_vec(seed, st, rows * width, 3.0)
            .iter()
            .map(|v| v + 1.5)
            .collect();
        let (w, b) = (
            rand_vec(seed, st + 1, width, 1.0),
            rand_vec(seed, st + 2, width, 0.5),
        );
        let mut want = vec![0f32; rows * width];
        for (o, r) in want.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / width as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / width as f64;
            let inv = 1.0 / (var + 1e-6).sqrt();
            for (c, (o, &v)) in o.iter_mut().zip(r).enumerate() {
                *o = ((v as f64 - mean) * inv * w[c] as f64 + b[c] as f64) as f32;
            }
        }
        let (dx, dw, db) = (g.upload(&x)?, g.upload(&w)?, g.upload(&b)?);
        let dy = g.zeros::<f32>(rows * width)?;
        g.fill(g.ptr(&dy), f32::NAN, rows * width)?;
        let wb = (g.ptr(&dw), g.ptr(&db));
        k.layer_norm(g.ptr(&dx), wb, g.ptr(&dy), rows, width, 1e-6)?;
        let got = g.download(&dy)?;
        let shape = format!("rows={rows} width={width}");
        out.push(compare(
            "vit_layer_norm",
            shape.clone(),
            &got,
            &want,
            VIT_TOL,
        ));
        k.layer_norm(g.ptr(&dx), wb, g.ptr(&dx), rows, width, 1e-6)?;
        let same = bits(&g.download(&dx)?) == bits(&got);
        out.push(flag(
            "vit_layer_norm (in place)",
            shape,
            same,
            "in place differs from out of place",
        ));
    }
    Ok(())
}

/// The attention of query row `i` of head `h` over the keys `keys` of `qkv` (`[rows][3 heads
/// d]`, f32) as the tensor-core kernel computes it, in float64: Q, K and V rounded to f16, the
/// keys in tiles of the kernel's size from the first, a running max per tile, each p =
/// 2^(s log2 e - m) rounded to f16 and summed as rounded; then o / l.
fn attn_row(
    qkv: &[f32],
    heads: usize,
    d: usize,
    i: usize,
    h: usize,
    keys: (usize, usize),
) -> Vec<f64> {
    let wd = heads * d;
    let at = |r: usize, part: usize, c: usize| f16r(qkv[r * 3 * wd + part * wd + h * d + c]) as f64;
    let tile = if padded_head(d) <= 80 { 64 } else { 32 };
    let sl = std::f64::consts::LOG2_E / (d as f64).sqrt();
    let (mut m, mut l) = (f64::NEG_INFINITY, 0.0);
    let mut o = vec![0f64; d];
    for t0 in (keys.0..keys.1).step_by(tile) {
        let ks: Vec<usize> = (t0..(t0 + tile).min(keys.1)).collect();
        let s: Vec<f64> = ks
            .iter()
            .map(|&j| (0..d).map(|c| at(i, 0, c) * at(j, 1, c)).sum::<f64>() * sl)
            .collect();
        let mn = s.iter().cloned().fold(m, f64::max);
        let corr = (m - mn).exp2();
        let p: Vec<f64> = s
            .iter()
            .map(|v| f16r((v - mn).exp2() as f32) as f64)
            .collect();
        l = l * corr + p.iter().sum::<f64>();
        for (c, o) in o.iter_mut().enumerate() {
            *o = *o * corr
                + ks.iter()
                    .zip(&p)
                    .map(|(&j, p)| p * at(j, 2, c))
                    .sum::<f64>();
        }
        m = mn;
    }
    o.iter().map(|v| v / l).collect()
}

/// Runs `f` on `qkv` as the attention reads it (`vit_qkv_half`'s buffer), with that kernel's
/// case: every value the nearest f16, the padding zeros, bit for bit.
fn with_half<R>(
    g: &Gpu,
    qkv: &[f32],
    (rows, heads, d): (usize, usize, usize),
    out: &mut Vec<Case>,
    f: impl FnOnce(u64) -> Result<R>,
) -> Result<R> {
    let k = TowerKernels { dev: g };
    let dp = padded_head(d);
    let wd = heads * d;
    let dq = g.upload(qkv)?;
    // Poisoned with f16 NaNs.
    let half = g.upload(&vec![0x7fffu16; half_qkv_len(rows, heads, d)])?;
    k.half_qkv(g.ptr(&dq), g.ptr(&half), rows, heads, d)?;
    let got = g.download(&half)?;
    let mut want = vec![0u16; got.len()];
    for part in 0..3 {
        for h in 0..heads {
            for r in 0..rows {
                for c in 0..d {
                    want[((part * heads + h) * rows + r) * dp + c] =
                        half::f16::from_f32(qkv[r * 3 * wd + part * wd + h * d + c]).to_bits();
                }
            }
        }
    }
    out.push(flag(
        "vit_qkv_half",
        format!("rows={rows} heads={heads} d={d}"),
        got == want,
        "not the nearest f16 of every value with zero padding",
    ));
    f(g.ptr(&half))
}

fn attention_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let k = TowerKernels { dev: g };
    let mut st = 62_000;
    for &d in HEAD_DIMS {
        for (n, heads) in [(1usize, 1usize), (17, 3), (130, 2), (300, 1)] {
            st += 1;
            let wd = heads * d;
            let qkv = rand_vec(seed, st, n * 3 * wd, 2.0);
            let mut want = vec![0f32; n * wd];
            for i in 0..n {
                for h in 0..heads {
                    for (c, v) in attn_row(&qkv, heads, d, i, h, (0, n))
                        .into_iter()
                        .enumerate()
                    {
                        want[i * wd + h * d + c] = v as f32;
                    }
                }
            }
            let dout = g.zeros::<f32>(n * wd)?;
            let (got, again) = with_half(g, &qkv, (n, heads, d), out, |half| {
                let launch = || -> Result<Vec<f32>> {
                    g.fill(g.ptr(&dout), f32::NAN, n * wd)?;
                    k.attention(half, g.ptr(&dout), n, heads, d)?;
                    g.download(&dout)
                };
                Ok((launch()?, launch()?))
            })?;
            let name = format!("vit_attn_mma_d{d}");
            let shape = format!("n={n} heads={heads}");
            let mut c = compare(&name, shape, &got, &want, ATT_TOL);
            if bits(&again) != bits(&got) && c.problem.is_none() {
                c.problem = Some("a second launch gave other bits".into());
            }
            out.push(c);
        }
    }
    Ok(())
}

fn pool_patch_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let k = TowerKernels { dev: g };
    for (i, &(grid, pool, width)) in [(8usize, 2usize, 32usize), (64, 4, 1152), (12, 3, 37)]
        .iter()
        .enumerate()
    {
        let x = rand_vec(seed, 63_000 + i as u64, grid * grid * width, 2.0);
        let side = grid / pool;
        let inv = 1.0 / (pool * pool) as f32;
        let mut want = vec![0f32; side * side * width];
        for (t, row) in want.chunks_exact_mut(width).enumerate() {
            let (ty, tx) = (t / side, t % side);
            for y in 0..pool {
                for xx in 0..pool {
                    let src = ((ty * pool + y) * grid + tx * pool + xx) * width;
                    for (a, b) in row.iter_mut().zip(&x[src..src + width]) {
                        *a += b;
                    }
                }
            }
            row.iter_mut().for_each(|a| *a *= inv);
        }
        let dx = g.upload(&x)?;
        let dy = g.zeros::<f32>(want.len())?;
        g.fill(g.ptr(&dy), f32::NAN, want.len())?;
        k.pool(g.ptr(&dx), g.ptr(&dy), grid, pool, width)?;
        let shape = format!("grid={grid} pool={pool} width={width}");
        out.push(compare("vit_pool", shape, &g.download(&dy)?, &want, 0.0));
    }
    for (i, &(size, patch)) in [(64usize, 8usize), (42, 14), (896, 14)].iter().enumerate() {
        let px = rand_vec(seed, 63_100 + i as u64, 3 * size * size, 1.0);
        let gs = size / patch;
        let per = 3 * patch * patch;
        let mut want = vec![0f32; gs * gs * per];
        for (p, col) in want.chunks_exact_mut(per).enumerate() {
            let (py, pxx) = (p / gs, p % gs);
            for c in 0..3 {
                for y in 0..patch {
                    let src = c * size * size + (py * patch + y) * size + pxx * patch;
                    let dst = c * patch * patch + y * patch;
                    col[dst..dst + patch].copy_from_slice(&px[src..src + patch]);
                }
            }
        }
        let dp = g.upload(&px)?;
        let dc = g.zeros::<f32>(want.len())?;
        g.fill(g.ptr(&dc), f32::NAN, want.len())?;
        k.patches(g.ptr(&dp), g.ptr(&dc), size, patch)?;
        let shape = format!("size={size} patch={patch}");
        out.push(compare("vit_patches", shape, &g.download(&dc)?, &want, 0.0));
    }
    Ok(())
}

/// The Qwen ViT's kernels: patch rows and the rotary embedding bit for bit, window attention
/// against float64.
fn qwen_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let k = TowerKernels { dev: g };
    // qvit_patches: rows in a shuffled order, two different frames (a video's frame pair).
    for (i, &(w, h, patch)) in [(16usize, 24usize, 4usize), (42, 28, 14), (448, 336, 14)]
        .iter()
        .enumerate()
    {
        let px = rand_vec(seed, 64_000 + i as u64, 3 * w * h, 1.0);
        let px1 = rand_vec(seed, 64_050 + i as u64, 3 * w * h, 1.0);
        let (gw, gh) = (w / patch, h / patch);
        let rows = gw * gh;
        let per = 3 * patch * patch;
        // A permutation: 7 and rows are coprime for these shapes, else the identity.
        let step = if rows % 7 == 0 { 1 } else { 7 };
        let pos: Vec<u32> = (0..rows)
            .map(|r| {
                let p = (r * step + 3) % rows;
                (((p / gw) << 16) | (p % gw)) as u32
            })
            .collect();
        let mut want = vec![0f32; rows * 2 * per];
        for (r, col) in want.chunks_exact_mut(2 * per).enumerate() {
            let (py, pxx) = ((pos[r] >> 16) as usize, (pos[r] & 0xffff) as usize);
            for (f, frame) in [&px, &px1].into_iter().enumerate() {
                for c in 0..3 {
                    for y in 0..patch {
                        let src = (c * h + py * patch + y) * w + pxx * patch;
                        let dst = f * per + c * patch * patch + y * patch;
                        col[dst..dst + patch].copy_from_slice(&frame[src..src + patch]);
                    }
                }
            }
        }
        let (dp, dp1, dpos) = (g.upload(&px)?, g.upload(&px1)?, g.upload(&pos)?);
        let dc = g.zeros::<f32>(want.len())?;
        g.fill(g.ptr(&dc), f32::NAN, want.len())?;
        k.qwen_patches(
            [g.ptr(&dp), g.ptr(&dp1)],
            g.ptr(&dpos),
            g.ptr(&dc),
            rows,
            (w, h),
            patch,
        )?;
        let shape = format!("{w}x{h} patch={patch}");
        out.push(compare(
            "qvit_patches",
            shape,
            &g.download(&dc)?,
            &want,
            0.0,
        ));
    }
    // qvit_rope: the CPU's u c - v s, v c + u s with each product rounded.
    for (i, &(rows, heads, d)) in [(5usize, 3usize, 8usize), (37, 16, 80), (19, 16, 72)]
        .iter()
        .enumerate()
    {
        let wd = heads * d;
        let qkv = rand_vec(seed, 64_100 + i as u64, rows * 3 * wd, 2.0);
        let table = rand_vec(seed, 64_150 + i as u64, rows * d, 1.0);
        let half = d / 2;
        let mut want = qkv.clone();
        for r in 0..rows {
            for part in 0..2 {
                for hd in 0..heads {
                    let o = r * 3 * wd + part * wd + hd * d;
                    for j in 0..half {
                        let (c, s) = (table[(r * half + j) * 2], table[(r * half + j) * 2 + 1]);
                        let (u, v) = (qkv[o + j], qkv[o + j + half]);
                        want[o + j] = u * c - v * s;
                        want[o + j + half] = v * c + u * s;
                    }
                }
            }
        }
        let (dq, dt) = (g.upload(&qkv)?, g.upload(&table)?);
        k.rope(g.ptr(&dq), g.ptr(&dt), rows, heads, d)?;
        let shape = format!("rows={rows} heads={heads} d={d}");
        out.push(compare("qvit_rope", shape, &g.download(&dq)?, &want, 0.0));
    }
    // qvit_attn_win_mma_d<D>: windows of consecutive rows, tiles of at most 128 query rows.
    let mut st = 64_200;
    for &d in HEAD_DIMS {
        for (sizes, heads) in [
            (&[64usize, 64, 32, 16][..], 2usize),
            (&[144, 4, 200][..], 1),
        ] {
            st += 1;
            let n: usize = sizes.iter().sum();
            let wd = heads * d;
            let qkv = rand_vec(seed, st, n * 3 * wd, 2.0);
            let (mut tiles, mut win) = (Vec::new(), Vec::new());
            let mut k0 = 0;
            for &sz in sizes {
                for q in (0..sz).step_by(128) {
                    tiles.extend([k0 + q, k0 + (q + 128).min(sz), k0, k0 + sz].map(|v| v as u32));
                }
                win.extend(std::iter::repeat_n((k0, k0 + sz), sz));
                k0 += sz;
            }
            let mut want = vec![0f32; n * wd];
            for (i, &keys) in win.iter().enumerate() {
                for h in 0..heads {
                    for (c, v) in attn_row(&qkv, heads, d, i, h, keys).into_iter().enumerate() {
                        want[i * wd + h * d + c] = v as f32;
                    }
                }
            }
            let dt = g.upload(&tiles)?;
            let dout = g.zeros::<f32>(n * wd)?;
            g.fill(g.ptr(&dout), f32::NAN, n * wd)?;
            let count = tiles.len() / 4;
            with_half(g, &qkv, (n, heads, d), out, |half| {
                k.window_attention(half, g.ptr(&dout), g.ptr(&dt), count, n, heads, d)
            })?;
            let name = format!("qvit_attn_win_mma_d{d}");
            let shape = format!("windows={sizes:?} heads={heads}");
            out.push(compare(&name, shape, &g.download(&dout)?, &want, ATT_TOL));
        }
    }
    Ok(())
}

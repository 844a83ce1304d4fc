//! The mixture-of-experts kernels (kernels/cu/moe.cu and the expert products `mmq_id_<type>` /
//! `matmul_id_<type>`, driven by `Products::moe` as the backend drives them) against the CPU:
//!
//! - `moe_route`: the expert ids equal the CPU's `route` (softmax, top-k with ties to the lowest
//!   index, renormalised, ascending index) exactly; the weights within [`ROUTE_TOL`]; alone for
//!   routers of 257 to 1024 experts (the one-warp routing up to 512, the block routing above).
//! - `moe_<type>` (v2 tile layout) / `moe_v1_<type>` (stored layout): the whole FFN against an
//!   f64 reference over the dequantized weights (the CPU's routes, each row's experts added in
//!   ascending index), within [`moe_tol`]; every output element written (NaN-poisoned).
//! - Row invariance, bitwise: rows computed alone (M = 1) and in a small batch give the bits they
//!   give inside the full batch, where every expert's row count differs.
//! - `moe_grouped_<type>`: the grouped expert products (pairs sorted by expert, each expert's
//!   pairs one block of rows) against the per-pair products on the same inputs, bitwise, for
//!   several routings ([`Routing`]: all pairs on the first k experts (k = 1: one expert),
//!   uniform, a third of the experts never chosen) and pair counts that are not a multiple of
//!   the token tile; and the grouped output against the f64 reference within [`moe_tol`].

use memra_engine::Result;
use memra_engine::backend::cpu::moe::route;
use memra_engine::backend::cuda::moe::{MoeBufs, Route, group_offsets_len};
use memra_engine::backend::cuda::profile::Profile;
use memra_engine::backend::cuda::{Gpu, Mat, Products};
use memra_engine::ops::{Glu, MoeParams};
use memra_engine::quant::{DType, dequantize_row, quantize};
use memra_engine::weights::{Bytes, Tensor};

use crate::case::{Case, compare, rand_vec};
use crate::products_check::product_tol;

/// Router weights: relative error of the GPU's softmax (expf, its own summation order) and
/// renormalisation against the CPU's.
pub const ROUTE_TOL: f64 = 1e-5;

/// The FFN against the f64 reference: the v2 products' tolerance (f16 / bf16 activations) for
/// each of the two products in a row's chain (gate/up, then down), doubled for the GLU between
/// them; the v1 kernels keep f32 activations (1e-4).
pub fn moe_tol(d: DType, v2: bool) -> f64 {
    if v2 { 4.0 * product_tol(d) } else { 1e-4 }
}

/// (type, v2 layout, experts, used, hidden, expert_ffn, glu).
type Shape = (DType, bool, usize, usize, usize, usize, Glu);

const SHAPES: [Shape; 9] = [
    (DType::Q8_0, true, 8, 2, 64, 96, Glu::Silu),
    (DType::Q8_0, true, 128, 8, 256, 256, Glu::Silu),
    (DType::Q4_K, true, 128, 8, 256, 256, Glu::Silu),
    (DType::Q6_K, true, 16, 4, 256, 512, Glu::Silu),
    (DType::BF16, true, 8, 3, 72, 40, Glu::Silu),
    (DType::F16, true, 8, 3, 72, 40, Glu::GeluTanh),
    (DType::F32, false, 8, 3, 72, 40, Glu::Silu),
    (DType::Q5_0, false, 16, 4, 64, 96, Glu::Silu),
    (DType::Q8_0, false, 8, 2, 64, 96, Glu::GeluTanh),
];

/// Shapes with a shared expert folded in (`experts` and `used` count it): qwen3next-like
/// (a shared expert of the experts' shapes; its real router is 512 + 1 wide).
const SHARED_SHAPES: [Shape; 2] = [
    (DType::Q4_K, true, 17, 5, 256, 256, Glu::Silu),
    (DType::Q8_0, true, 65, 11, 64, 96, Glu::Silu),
];

/// The CPU's sigmoid of a gate (sigmoid_mul's `1 / (1 + exp(-g))`).
fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + (-g).exp())
}

/// Rows of the full batch, and the sub-batches (first row, rows) computed on their own.
const M: usize = 37;
const SUBS: [(usize, usize); 4] = [(0, 1), (13, 1), (36, 1), (3, 5)];

/// A random `[e, rows, cols]` stack in `dtype` and its dequantized values.
fn stack(seed: u64, s: u64, dtype: DType, shape: [usize; 3]) -> Result<(Tensor, Vec<f32>)> {
    let [e, rows, cols] = shape;
    let v = rand_vec(seed, s, e * rows * cols, 0.5);
    let q = quantize(dtype, &v)?;
    let rb = q.len() / (e * rows);
    let mut d = vec![0f32; v.len()];
    for r in 0..e * rows {
        dequantize_row(
            dtype,
            &q[r * rb..(r + 1) * rb],
            &mut d[r * cols..(r + 1) * cols],
        )?;
    }
    let t = Tensor::new(format!("s{s}"), dtype, shape.to_vec(), Bytes::owned(q))?;
    Ok((t, d))
}

fn glu(kind: Glu, g: f64, u: f64) -> f64 {
    match kind {
        Glu::Silu => g / (1.0 + (-g).exp()) * u,
        Glu::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u
        }
    }
}

/// The f64 reference of one row: `x` (h), its routes, the dequantized stacks.
fn reference_row(
    x: &[f32],
    routes: &[(usize, f32)],
    w: [&[f32]; 3],
    (f, h): (usize, usize),
    kind: Glu,
) -> Vec<f32> {
    let dot =
        |row: &[f32], v: &[f64]| -> f64 { row.iter().zip(v).map(|(&a, &b)| a as f64 * b).sum() };
    let xs: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut out = vec![0f64; h];
    for &(e, wt) in routes {
        let a: Vec<f64> = (0..f)
            .map(|j| {
                let r = (e * f + j) * h;
                glu(kind, dot(&w[0][r..r + h], &xs), dot(&w[1][r..r + h], &xs))
            })
            .collect();
        for (c, o) in out.iter_mut().enumerate() {
            let r = (e * h + c) * f;
            *o += wt as f64 * dot(&w[2][r..r + f], &a);
        }
    }
    out.into_iter().map(|v| v as f32).collect()
}

/// Random gate, up and down stacks of `e` experts (`k` per row, hidden `h`, expert FFN `f`;
/// streams s, s + 1, s + 2) uploaded to fresh products: (products, stacks, dequantized values).
fn upload_stacks(
    g: &Gpu,
    profile: &Profile,
    v2: bool,
    (seed, s): (u64, u64),
    dtype: DType,
    [e, k, h, f]: [usize; 4],
) -> Result<(Products, [Mat; 3], [Vec<f32>; 3])> {
    let (tg, dg) = stack(seed, s, dtype, [e, f, h])?;
    let (tu, du) = stack(seed, s + 1, dtype, [e, f, h])?;
    let (td, dd) = stack(seed, s + 2, dtype, [e, h, f])?;
    let mut prods = Products::new(v2, profile.clone());
    let mats = [
        prods.upload_experts(g, &tg, None)?,
        prods.upload_experts(g, &tu, None)?,
        prods.upload_experts(g, &td, Some(k))?,
    ];
    Ok((prods, mats, [dg, du, dd]))
}

/// A `moe` call's zeroed device scratch for up to `rows` rows of `k` pairs each (`e` experts,
/// hidden `h`, expert FFN `f`): f32 `out`, `wts`, `gate`, `up`, `y` and u32 `ids`, `order`,
/// `offs`, allocated by `f32s` / `u32s` (device buffers, read back by the caller).
struct Scratch<F, U> {
    out: F,
    wts: F,
    gate: F,
    up: F,
    y: F,
    ids: U,
    order: U,
    offs: U,
}

impl<F, U> Scratch<F, U> {
    fn new(
        rows: usize,
        [e, k, h, f]: [usize; 4],
        f32s: impl Fn(usize) -> Result<F>,
        u32s: impl Fn(usize) -> Result<U>,
    ) -> Result<Self> {
        let pairs = rows * k;
        Ok(Scratch {
            out: f32s(rows * h)?,
            wts: f32s(pairs)?,
            gate: f32s(pairs * f)?,
            up: f32s(pairs * f)?,
            y: f32s(pairs * h)?,
            ids: u32s(pairs)?,
            order: u32s(pairs)?,
            offs: u32s(group_offsets_len(e))?,
        })
    }

    /// The call's buffers over the inputs `x` and `router` (`pf` / `pu`: a buffer's device
    /// address), nothing routed or prepared, no residual.
    fn bufs(
        &self,
        (x, router): (u64, u64),
        shared: bool,
        pf: impl Fn(&F) -> u64,
        pu: impl Fn(&U) -> u64,
    ) -> MoeBufs {
        let [out, wts, gate, up, y] = [&self.out, &self.wts, &self.gate, &self.up, &self.y].map(pf);
        let [ids, order, offs] = [&self.ids, &self.order, &self.offs].map(pu);
        MoeBufs {
            x,
            router,
            out,
            ids,
            wts,
            gate,
            up,
            y,
            order,
            offs,
            res: 0,
            routed: false,
            prepared: false,
            shared,
        }
    }
}

/// The CPU's routes of one row of logits over `e` routed experts (`k` of them picked); with
/// `shared`, then the shared expert's slot `(e, sigmoid(logits[e]))`.
fn cpu_route(logits: &[f32], e: usize, k: usize, norm: bool, shared: bool) -> Vec<(usize, f32)> {
    let mut r = route(&logits[..e], k, norm);
    if shared {
        r.push((e, sigmoid(logits[e])));
    }
    r
}

/// `moe_route`'s ids (exactly) and weights (within [`ROUTE_TOL`]) against the CPU's `routes`.
fn route_compare(shape: String, ids: &[u32], wts: &[f32], routes: &[(usize, f32)]) -> [Case; 2] {
    let want_ids: Vec<f32> = routes.iter().map(|&(i, _)| i as f32).collect();
    let want_wts: Vec<f32> = routes.iter().map(|&(_, w)| w).collect();
    let got_ids: Vec<f32> = ids.iter().map(|&i| i as f32).collect();
    [
        compare("moe_route ids", shape.clone(), &got_ids, &want_ids, 0.0),
        compare("moe_route wts", shape, wts, &want_wts, ROUTE_TOL),
    ]
}

/// The f64 reference of every row of `x` (`h` values each), row `r` over `routes[r]`.
fn reference(
    x: &[f32],
    routes: &[Vec<(usize, f32)>],
    w: [&[f32]; 3],
    (f, h): (usize, usize),
    kind: Glu,
) -> Vec<f32> {
    let mut want = Vec::with_capacity(routes.len() * h);
    for (r, rt) in routes.iter().enumerate() {
        want.extend(reference_row(&x[r * h..(r + 1) * h], rt, w, (f, h), kind));
    }
    want
}

/// The whole FFN of one shape; with `shared`, the stacks' last expert is a shared expert
/// every row takes as its last slot, weighted by the sigmoid of its last logit (`e` and `k`
/// count it; qwen3next's folded shared expert).
fn one_shape(
    g: &Gpu,
    profile: &Profile,
    (seed, s): (u64, u64),
    sh: Shape,
    shared: bool,
) -> Result<Vec<Case>> {
    let (dtype, v2, e, k, h, f, kind) = sh;
    let ns = shared as usize;
    let p = MoeParams {
        n_experts: e,
        n_used: k,
        // Every other shape without renormalisation (s = 20000 + 10 i).
        norm_topk: (s / 10).is_multiple_of(2),
        glu: kind,
    };
    let (mut prods, mats, [dg, du, dd]) =
        upload_stacks(g, profile, v2, (seed, s), dtype, [e, k, h, f])?;
    prods.reserve(g, M)?;
    let x = rand_vec(seed, s + 3, M * h, 1.0);
    let logits = rand_vec(seed, s + 4, M * e, 2.0);
    let (dx, dr) = (g.upload(&x)?, g.upload(&logits)?);
    let sc = Scratch::new(
        M,
        [e, k, h, f],
        |n| g.zeros::<f32>(n),
        |n| g.zeros::<u32>(n),
    )?;
    // Rows r0.. of the inputs; outputs and scratch from their start.
    let at = |r0: usize| {
        let x = g.ptr(&dx) + (r0 * h * 4) as u64;
        let router = g.ptr(&dr) + (r0 * e * 4) as u64;
        sc.bufs((x, router), shared, |b| g.ptr(b), |b| g.ptr(b))
    };
    let w = [&mats[0], &mats[1], &mats[2]];
    let run = |r0: usize, m: usize| -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
        g.fill(g.ptr(&sc.out), f32::NAN, M * h)?;
        g.fill(g.ptr(&sc.wts), f32::NAN, M * k)?;
        prods.moe(g, w, &at(r0), m, &p)?;
        Ok((
            g.download_range(&sc.out, 0, m * h)?,
            g.download_range(&sc.ids, 0, m * k)?,
            g.download_range(&sc.wts, 0, m * k)?,
        ))
    };
    let (out, ids, wts) = run(0, M)?;
    let routes: Vec<Vec<(usize, f32)>> = logits
        .chunks_exact(e)
        .map(|l| cpu_route(l, e - ns, k - ns, p.norm_topk, shared))
        .collect();
    let shared_tag = if shared { " shared" } else { "" };
    let shape = format!("{dtype} E={e} k={k}{shared_tag} h={h} f={f} {kind:?} M={M}");
    let flat: Vec<(usize, f32)> = routes.iter().flatten().copied().collect();
    let mut cases = Vec::from(route_compare(shape.clone(), &ids, &wts, &flat));
    let want = reference(&x, &routes, [&dg, &du, &dd], (f, h), kind);
    let name = if v2 {
        format!("moe_{dtype}")
    } else {
        format!("moe_v1_{dtype}")
    };
    let mut c = compare(&name, shape.clone(), &out, &want, moe_tol(dtype, v2));
    for (r0, m) in SUBS {
        let (sub, _, _) = run(r0, m)?;
        let full = &out[r0 * h..(r0 + m) * h];
        let same = sub
            .iter()
            .zip(full)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same && c.problem.is_none() {
            c.problem = Some(format!(
                "rows {r0}..{} alone differ from their bits in the batch of {M}",
                r0 + m
            ));
        }
    }
    // Added into a residual in the same launch (MoeBufs::res): res + out, bit for bit.
    let dres = g.upload(&x)?;
    let mut bufs = at(0);
    bufs.res = g.ptr(&dres);
    prods.moe(g, w, &bufs, M, &p)?;
    let res = g.download_range(&dres, 0, M * h)?;
    let added = res
        .iter()
        .zip(x.iter().zip(&out))
        .all(|(r, (a, o))| r.to_bits() == (a + o).to_bits());
    if !added && c.problem.is_none() {
        c.problem = Some("the residual add differs from x + out".into());
    }
    cases.push(c);
    Ok(cases)
}

/// How the router logits of a grouped-vs-per-pair case spread the pairs over the experts.
#[derive(Clone, Copy, Debug)]
enum Routing {
    /// Experts 0..k far ahead of the rest: every row picks them (k = 1: all pairs on one
    /// expert; each expert then gets M pairs, several token tiles).
    First,
    /// Random logits.
    Uniform,
    /// Experts with index divisible by 3 far behind: never picked (empty experts between
    /// non-empty ones).
    SomeEmpty,
}

const ROUTINGS: [Routing; 3] = [Routing::First, Routing::Uniform, Routing::SomeEmpty];

/// (type, experts, used, hidden, expert_ffn, glu) of the grouped cases (v2 layouts).
type GroupShape = (DType, usize, usize, usize, usize, Glu);

const GROUP_SHAPES: [GroupShape; 4] = [
    (DType::Q8_0, 8, 1, 64, 96, Glu::Silu),
    (DType::Q4_K, 128, 8, 256, 256, Glu::Silu),
    (DType::BF16, 8, 3, 72, 40, Glu::GeluTanh),
    (DType::Q6_K, 16, 4, 256, 512, Glu::Silu),
];

/// Rows of the grouped cases: P = rows x k pairs is never a multiple of the 16-pair tile for
/// these k, and 133 rows put several tiles on one expert.
const GROUP_ROWS: [usize; 2] = [37, 133];

fn grouped_shape(
    g: &Gpu,
    profile: &Profile,
    seed: u64,
    s: u64,
    sh: GroupShape,
) -> Result<Vec<Case>> {
    let (dtype, e, k, h, f, kind) = sh;
    let p = MoeParams {
        n_experts: e,
        n_used: k,
        norm_topk: true,
        glu: kind,
    };
    let (mut prods, mats, [dg, du, dd]) =
        upload_stacks(g, profile, true, (seed, s), dtype, [e, k, h, f])?;
    let rows_max = GROUP_ROWS.iter().copied().max().unwrap_or(1);
    prods.reserve(g, rows_max)?;
    let w = [&mats[0], &mats[1], &mats[2]];
    let x = rand_vec(seed, s + 3, rows_max * h, 1.0);
    let dx = g.upload(&x)?;
    let dims = [e, k, h, f];
    let sc = Scratch::new(rows_max, dims, |n| g.zeros::<f32>(n), |n| g.zeros::<u32>(n))?;
    let mut cases = Vec::new();
    for (ri, routing) in ROUTINGS.into_iter().enumerate() {
        for &m in &GROUP_ROWS {
            let mut logits = rand_vec(seed, s + 4 + ri as u64, m * e, 2.0);
            for (i, l) in logits.iter_mut().enumerate() {
                match routing {
                    Routing::First if i % e < k => *l += 40.0,
                    Routing::SomeEmpty if (i % e).is_multiple_of(3) => *l -= 40.0,
                    _ => {}
                }
            }
            let dr = g.upload(&logits)?;
            let inputs = (g.ptr(&dx), g.ptr(&dr));
            let bufs = sc.bufs(inputs, false, |b| g.ptr(b), |b| g.ptr(b));
            let mut run = |grouped: bool| -> Result<Vec<f32>> {
                // Poisoned: a pair the grouped products skip leaves NaN in the output.
                for (buf, n) in [
                    (&sc.out, m * h),
                    (&sc.gate, m * k * f),
                    (&sc.up, m * k * f),
                    (&sc.y, m * k * h),
                ] {
                    g.fill(g.ptr(buf), f32::NAN, n)?;
                }
                prods.profile.moe_grouped = Some(grouped);
                prods.moe(g, w, &bufs, m, &p)?;
                g.download_range(&sc.out, 0, m * h)
            };
            let per_pair = run(false)?;
            let grouped = run(true)?;
            let routes: Vec<Vec<(usize, f32)>> = logits
                .chunks_exact(e)
                .map(|l| route(l, k, p.norm_topk))
                .collect();
            let want = reference(&x, &routes, [&dg, &du, &dd], (f, h), kind);
            let shape = format!("{dtype} E={e} k={k} h={h} f={f} {kind:?} M={m} {routing:?}");
            let mut c = compare(
                &format!("moe_grouped_{dtype}"),
                shape,
                &grouped,
                &want,
                moe_tol(dtype, true),
            );
            if let Some(i) = grouped
                .iter()
                .zip(&per_pair)
                .position(|(a, b)| a.to_bits() != b.to_bits())
                && c.problem.is_none()
            {
                c.problem = Some(format!(
                    "element {i}: grouped {} != per pair {} (bitwise)",
                    grouped[i], per_pair[i]
                ));
            }
            cases.push(c);
        }
    }
    Ok(cases)
}

/// Every MoE case on `g`.
pub fn moe_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    let profile = Profile::for_device(g);
    // The shapes above run per pair or grouped as the profile picks for their M rows (by
    // default grouped only for the 8-of-128 batch of 37, whose sub-batches run per pair: the
    // invariance check there compares the two paths too); the grouped cases force each path.
    // Streams 20_000 + 10 i without a shared expert, 20_500 + 10 i with one.
    for (shapes, base, shared) in [(&SHAPES[..], 20_000, false), (&SHARED_SHAPES, 20_500, true)] {
        for (i, &sh) in shapes.iter().enumerate() {
            let st = base + 10 * i as u64;
            out.extend(one_shape(g, &profile, (seed, st), sh, shared)?);
        }
    }
    for (i, &sh) in GROUP_SHAPES.iter().enumerate() {
        out.extend(grouped_shape(
            g,
            &profile,
            seed,
            21_000 + 10 * i as u64,
            sh,
        )?);
    }
    route_cases(g, seed, out)
}

/// `moe_route` alone against the CPU's `route` for routers wider than the expert stacks above:
/// the one-warp routing (up to 512 experts: 257 and qwen3next's 512) and the block routing
/// (600, 1024), with and without a shared expert's slot (the sigmoid of the row's last logit);
/// ids exactly, weights within [`ROUTE_TOL`], 3 rows each.
fn route_cases(g: &Gpu, seed: u64, out: &mut Vec<Case>) -> Result<()> {
    const ROWS: usize = 3;
    let widths = [
        (257usize, 3usize, true, false),
        (512, 10, false, false),
        (512, 10, true, false),
        (512, 10, true, true),
        (600, 6, true, false),
        (600, 6, false, true),
        (1024, 31, true, true),
    ];
    for (i, &(e, k, norm, shared)) in widths.iter().enumerate() {
        let r = Route { e, k, norm, shared };
        let (le, ks) = (r.logits(), r.slots());
        let logits = rand_vec(seed, 22_000 + i as u64, ROWS * le, 3.0);
        let dl = g.upload(&logits)?;
        let (ids, wts) = (g.zeros::<u32>(ROWS * ks)?, g.zeros::<f32>(ROWS * ks)?);
        g.fill(g.ptr(&wts), f32::NAN, ROWS * ks)?;
        g.moe_route(g.ptr(&dl), (g.ptr(&ids), g.ptr(&wts)), ROWS, r)?;
        let routes: Vec<(usize, f32)> = logits
            .chunks_exact(le)
            .flat_map(|l| cpu_route(l, e, k, norm, shared))
            .collect();
        let shape = format!("E={e} k={k} norm={norm} shared={shared} M={ROWS}");
        let (got_ids, got_wts) = (g.download(&ids)?, g.download(&wts)?);
        out.extend(route_compare(shape, &got_ids, &got_wts, &routes));
    }
    Ok(())
}

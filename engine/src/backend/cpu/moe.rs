//! The mixture-of-experts FFN on the CPU ([`crate::ops::Ops::moe`]): routing (softmax, top-k
//! with ties to the lowest expert index, optional renormalisation) and the chosen experts' gated
//! FFNs, run expert by expert over the rows that chose each.
//!
//! Row invariance: an expert's products over its rows are [`matmul_rows`], whose bits for a row
//! do not depend on how many rows are in the product; each row then adds its experts' outputs
//! onto zero in ascending expert index. So a row's result depends on its own input alone, never
//! on which (or how many) other rows picked the same experts.

use super::matmul::matmul_rows;
use super::ops;
use crate::error::{Error, Result};
use crate::ops::{Glu, MoeParams};
use crate::weights::Tensor;

fn err(what: String) -> Error {
    Error::Backend {
        backend: "cpu".into(),
        what,
    }
}

/// The experts one row uses, as (expert, weight) in ascending expert index: the softmax of
/// `logits` (max subtracted, summed in index order), its `k` highest probabilities (equal
/// probabilities: the lower expert index ranks first), divided by their sum (added in rank
/// order) when `norm`.
pub fn route(logits: &[f32], k: usize, norm: bool) -> Vec<(usize, f32)> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut p: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = p.iter().sum();
    p.iter_mut().for_each(|v| *v /= sum);
    let mut rank: Vec<usize> = (0..p.len()).collect();
    rank.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    rank.truncate(k);
    let mut w: Vec<f32> = rank.iter().map(|&e| p[e]).collect();
    if norm {
        let s: f32 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= s);
    }
    let mut out: Vec<(usize, f32)> = rank.into_iter().zip(w).collect();
    out.sort_by_key(|&(e, _)| e);
    out
}

/// Checks the expert stacks: gate and up `[E, f, h]`, down `[E, h, f]`; returns `(f, h)`.
fn check_stacks(w: [&Tensor; 3], e: usize) -> Result<(usize, usize)> {
    let [gate, up, down] = w;
    let (f, h) = match gate.shape[..] {
        [n, f, h] if n == e => (f, h),
        _ => {
            return Err(err(format!(
                "moe: gate experts {} have shape {:?}, expected [{e}, _, _]",
                gate.name, gate.shape
            )));
        }
    };
    if up.shape != [e, f, h] || down.shape != [e, h, f] {
        return Err(err(format!(
            "moe: up {:?} / down {:?} do not match gate [{e}, {f}, {h}]",
            up.shape, down.shape
        )));
    }
    Ok((f, h))
}

/// The MoE FFN of `m` rows: `x` (`m x h`), `router` (`m x E` logits) into `out` (`m x h`).
pub fn moe(
    pool: &rayon::ThreadPool,
    w: [&Tensor; 3],
    x: &[f32],
    router: &[f32],
    m: usize,
    p: &MoeParams,
    out: &mut [f32],
) -> Result<()> {
    let [gate, up, down] = w;
    let e_n = p.n_experts;
    let (f, h) = check_stacks(w, e_n)?;
    if x.len() != m * h || router.len() != m * e_n || out.len() != m * h {
        return Err(err(format!(
            "moe: {m} rows of x {} / router {} / out {} values for hidden {h}, {e_n} experts",
            x.len(),
            router.len(),
            out.len()
        )));
    }
    if p.n_used == 0 || p.n_used > e_n {
        return Err(err(format!("moe: {} of {e_n} experts", p.n_used)));
    }
    let routes: Vec<Vec<(usize, f32)>> = router
        .chunks_exact(e_n)
        .map(|l| route(l, p.n_used, p.norm_topk))
        .collect();
    out.fill(0.0);
    for e in 0..e_n {
        // (row, weight) of the rows that chose expert e, in row order.
        let rows: Vec<(usize, f32)> = routes
            .iter()
            .enumerate()
            .filter_map(|(r, rt)| rt.iter().find(|(x, _)| *x == e).map(|&(_, w)| (r, w)))
            .collect();
        let n = rows.len();
        if n == 0 {
            continue;
        }
        let xs: Vec<f32> = rows
            .iter()
            .flat_map(|&(r, _)| &x[r * h..(r + 1) * h])
            .copied()
            .collect();
        let (mut g, mut u, mut y) = (vec![0f32; n * f], vec![0f32; n * f], vec![0f32; n * h]);
        matmul_rows(pool, gate, e * f..(e + 1) * f, &xs, n, &mut g)?;
        matmul_rows(pool, up, e * f..(e + 1) * f, &xs, n, &mut u)?;
        match p.glu {
            Glu::Silu => ops::swiglu(&mut g, &u),
            Glu::GeluTanh => ops::geglu_tanh(&mut g, &u),
        }
        matmul_rows(pool, down, e * h..(e + 1) * h, &g, n, &mut y)?;
        for (&(r, wt), yr) in rows.iter().zip(y.chunks_exact(h)) {
            for (o, &v) in out[r * h..(r + 1) * h].iter_mut().zip(yr) {
                *o += wt * v;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_picks_the_largest_and_renormalises() {
        let r = route(&[0.0, 3.0, 1.0, 2.0], 2, true);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3]);
        let s: f32 = r.iter().map(|x| x.1).sum();
        assert!((s - 1.0).abs() < 1e-6, "{r:?}");
        assert!(r[0].1 > r[1].1);
        // Unnormalised: the softmax probabilities themselves.
        let r = route(&[0.0, 0.0], 1, false);
        assert_eq!(r, vec![(0, 0.5)]);
    }

    #[test]
    fn route_ties_go_to_the_lowest_index() {
        let r = route(&[1.0; 8], 3, true);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        let r = route(&[0.5, 2.0, 0.5, 2.0, 2.0, 0.5], 2, false);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3]);
        let r = route(&[0.5, 2.0, 0.5, 2.0, 2.0, 0.5], 4, false);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 3, 4]);
    }

    /// Each row of a batch gives the bits it gives alone, whoever shares its experts.
    #[test]
    fn rows_are_independent_of_the_batch() {
        let (e, f, h, m) = (6, 8, 16, 7);
        let vals = |n: usize, s: u64| -> Vec<f32> {
            (0..n as u64)
                .map(|i| crate::models::random::unit(s, 1, i) * 0.3)
                .collect()
        };
        let t = |name: &str, shape: Vec<usize>, s: u64| {
            let n = shape.iter().product();
            Tensor::from_f32(name, shape, &vals(n, s)).unwrap()
        };
        let (g, u, d) = (
            t("g", vec![e, f, h], 1),
            t("u", vec![e, f, h], 2),
            t("d", vec![e, h, f], 3),
        );
        let p = MoeParams {
            n_experts: e,
            n_used: 2,
            norm_topk: true,
            glu: Glu::Silu,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (x, r) = (vals(m * h, 4), vals(m * e, 5));
        let mut all = vec![0f32; m * h];
        moe(&pool, [&g, &u, &d], &x, &r, m, &p, &mut all).unwrap();
        for i in 0..m {
            let mut one = vec![0f32; h];
            let (xi, ri) = (&x[i * h..(i + 1) * h], &r[i * e..(i + 1) * e]);
            moe(&pool, [&g, &u, &d], xi, ri, 1, &p, &mut one).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all[i * h..(i + 1) * h]), bits(&one), "row {i}");
        }
        // A wrong stack shape is an error, not a panic.
        let bad = t("d", vec![e, f, h], 3);
        assert!(moe(&pool, [&g, &u, &bad], &x, &r, m, &p, &mut all).is_err());
    }

    #[test]
    fn route_survives_non_finite_logits() {
        let r = route(&[f32::NAN, 1.0, f32::INFINITY], 2, true);
        assert_eq!(r.len(), 2);
    }
}

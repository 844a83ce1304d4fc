//! The fast road of [`super::sample`] for rows whose keys are all finite (every ordinary row):
//! the candidate order by a stable two-pass radix sort instead of a comparison sort (with top-k,
//! a selection of the first k and a sort of those), and the weights cut where they can no longer
//! change any sum. It picks exactly the token of the
//! comparison road (the tests compare the two on random rows); a full-vocabulary row costs
//! about a tenth as much, which is what the server's sampled rows pay every step.
//!
//! Why the cut is exact: the weights come in descending order, the first is exactly 1, and the
//! sums are f64 sums in that order. A weight below 2^-60 added to a sum of at least 1 is less
//! than half an ulp of it and leaves it unchanged; its normalized probability, below 2^-59 of the
//! first probability, likewise leaves the top-p running sum and the draw's running sum
//! unchanged. So every sum, the top-p and min-p cut points up to those no-op terms, and the draw
//! are the same with or without the weights below 2^-60, and all later weights are smaller.

/// Weights below this never change a sum (see the module comment).
const NO_OP_WEIGHT: f64 = 1.0 / (1u64 << 60) as f64;

/// Maps an f32 to a u32 whose ascending order is `f32::total_cmp`'s descending order.
fn desc_bits(k: f32) -> u32 {
    let b = k.to_bits();
    let asc = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    !asc
}

/// The candidates of penalized logits `l` (neither NaN nor -inf) in the sampler's order (key
/// `logit / temperature` descending by `total_cmp`, then id ascending), as ids; `None` when some
/// key is infinite (the comparison road orders saturated keys by logit). With `top_k` > 0 only
/// the first `top_k` of the order (a selection, then a sort of those: the same ids as the whole
/// order cut to `top_k`).
pub(super) fn ordered_ids(l: &[f32], temperature: f32, top_k: usize) -> Option<Vec<u32>> {
    let mut a: Vec<(u32, u32)> = Vec::with_capacity(l.len());
    for (i, &v) in l.iter().enumerate() {
        if v.is_nan() || v == f32::NEG_INFINITY {
            continue;
        }
        let key = v / temperature;
        if !key.is_finite() {
            return None;
        }
        a.push((desc_bits(key), i as u32));
    }
    // (key bits, id) ascending is the order below (ids enter ascending, the passes are stable).
    if top_k > 0 && top_k < a.len() {
        a.select_nth_unstable(top_k - 1);
        a.truncate(top_k);
        a.sort_unstable();
        return Some(a.into_iter().map(|(_, id)| id).collect());
    }
    // Stable LSD passes over 16-bit digits; ids enter ascending, so equal keys stay id-ascending.
    let mut b = vec![(0u32, 0u32); a.len()];
    let mut count = vec![0usize; 1 << 16];
    for shift in [0u32, 16] {
        count.iter_mut().for_each(|c| *c = 0);
        for &(k, _) in &a {
            count[((k >> shift) & 0xffff) as usize] += 1;
        }
        let mut at = 0;
        for c in count.iter_mut() {
            let n = *c;
            *c = at;
            at += n;
        }
        for &x in &a {
            let d = ((x.0 >> shift) & 0xffff) as usize;
            b[count[d]] = x;
            count[d] += 1;
        }
        std::mem::swap(&mut a, &mut b);
    }
    Some(a.into_iter().map(|(_, id)| id).collect())
}

/// The weights `exp(key - max key)` in f64 of `ids` (ordered, non-empty), cut before the first
/// weight below 2^-60; returns the kept ids and their weights.
pub(super) fn weights_cut(l: &[f32], temperature: f32, ids: &[u32]) -> (Vec<u32>, Vec<f64>) {
    let key = |id: u32| l[id as usize] / temperature;
    let max = key(ids[0]) as f64;
    let mut kept = Vec::new();
    let mut w = Vec::new();
    for &id in ids {
        let x = (key(id) as f64 - max).exp();
        if x < NO_OP_WEIGHT {
            break;
        }
        kept.push(id);
        w.push(x);
    }
    (kept, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desc_bits_is_total_cmp_reversed() {
        let v = [
            f32::INFINITY,
            3.5,
            1.0,
            f32::MIN_POSITIVE,
            0.0,
            -0.0,
            -f32::MIN_POSITIVE,
            -1.0,
            -1e30,
            f32::NEG_INFINITY,
        ];
        for a in v {
            for b in v {
                assert_eq!(
                    desc_bits(a).cmp(&desc_bits(b)),
                    b.total_cmp(&a),
                    "{a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn order_is_key_descending_then_id() {
        let l = [1.0, 3.0, f32::NAN, 3.0, -0.0, 0.0, f32::NEG_INFINITY, -2.0];
        let ids = ordered_ids(&l, 0.5, 0).unwrap();
        assert_eq!(ids, vec![1, 3, 0, 5, 4, 7]);
        for k in 1..=7 {
            let top = ordered_ids(&l, 0.5, k).unwrap();
            assert_eq!(top, ids[..k.min(ids.len())], "top_k {k}");
        }
        assert!(ordered_ids(&[1.0, f32::INFINITY], 1.0, 0).is_none());
        assert!(ordered_ids(&[1e38, 0.0], 1e-5, 0).is_none());
    }

    #[test]
    fn weights_stop_at_the_no_op_bound() {
        let l = [0.0, -10.0, -41.0, -42.0, -100.0];
        let ids = ordered_ids(&l, 1.0, 0).unwrap();
        let (kept, w) = weights_cut(&l, 1.0, &ids);
        assert_eq!(kept, vec![0, 1, 2]);
        assert_eq!(w[0], 1.0);
        assert!(w[2] >= NO_OP_WEIGHT && (-42.0f64).exp() < NO_OP_WEIGHT);
    }
}

//! Token selection: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
//! penalties. Randomness comes from Philox4x32-10 keyed by the request seed with the token's
//! position as the counter, so a token's draw depends only on (seed, position): plain and
//! speculative decoding, any batch and any chunking draw the same number for the same position.

use crate::error::{Error, Result};

mod order;

/// Temperatures below this are greedy (the same floor as vLLM's `_SAMPLING_EPS`). Above it the
/// distribution is computed in f64 from `(logit - max) / temperature`, which is finite for every
/// accepted temperature and logit; below it `logit / temperature` in f32 (the candidate order,
/// shared with the device's top-k) overflows for ordinary logits.
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// Sampling parameters of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Below [`MIN_TEMPERATURE`] (0 included) means greedy.
    pub temperature: f32,
    /// 0 means no top-k.
    pub top_k: usize,
    /// 1.0 means no top-p.
    pub top_p: f32,
    /// 0.0 means no min-p.
    pub min_p: f32,
    /// 1.0 means none (divides positive logits, multiplies negative ones, for seen tokens).
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl SamplingParams {
    /// Greedy decoding without penalties (the default).
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: 0,
    };
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::GREEDY
    }
}

impl SamplingParams {
    /// Checks ranges; the message names the parameter.
    pub fn validate(&self) -> Result<()> {
        let bad = |name: &str, v: f32, range: &str| {
            Err(Error::Input(format!(
                "{name} = {v} is out of range ({range})"
            )))
        };
        if !(self.temperature.is_finite() && (0.0..=100.0).contains(&self.temperature)) {
            return bad("temperature", self.temperature, "0 to 100");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "greater than 0, at most 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "0 to 1");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 10.0) {
            return bad(
                "repetition_penalty",
                self.repetition_penalty,
                "greater than 0, at most 10",
            );
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad("presence_penalty", self.presence_penalty, "-2 to 2");
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("frequency_penalty", self.frequency_penalty, "-2 to 2");
        }
        Ok(())
    }

    /// Greedy: the temperature is below [`MIN_TEMPERATURE`].
    pub fn is_greedy(&self) -> bool {
        self.temperature < MIN_TEMPERATURE
    }
}

/// Logprob of `token` and the `top` most likely alternatives (descending, lowest id first on
/// ties) under the penalized logits, before temperature: log-softmax in f64, summed in index
/// order, then f32.
pub fn logprobs(
    logits: &[f32],
    history: &[u32],
    params: &SamplingParams,
    token: u32,
    top: usize,
) -> (f32, Vec<(u32, f32)>) {
    let mut l = logits.to_vec();
    apply_penalties(&mut l, history, params);
    let max = l
        .iter()
        .filter(|v| !v.is_nan())
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let mut sum = 0.0f64;
    for &v in &l {
        if !v.is_nan() {
            sum += (v as f64 - max).exp();
        }
    }
    let lse = max + sum.ln();
    let lp = |v: f32| (v as f64 - lse) as f32;
    let own = l.get(token as usize).map_or(f32::NEG_INFINITY, |&v| lp(v));
    let alts = if top > 0 {
        crate::generate::top_k(&l, top)
            .into_iter()
            .map(|(i, v)| (i, lp(v)))
            .collect()
    } else {
        Vec::new()
    };
    (own, alts)
}

/// Philox4x32-10 block function: four 32-bit outputs for a 128-bit counter and a 64-bit key.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        c = [
            ((p1 >> 32) as u32) ^ c[1] ^ k[0],
            p1 as u32,
            ((p0 >> 32) as u32) ^ c[3] ^ k[1],
            p0 as u32,
        ];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// The uniform number in [0, 1) for (seed, position): 24 random bits of the first Philox word.
pub fn uniform(seed: u64, pos: u64) -> f32 {
    let r = philox4x32(
        [pos as u32, (pos >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    );
    (r[0] >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Sets the logit of every token `mask` does not allow to -inf (a structured-output row; ids
/// past the mask's end are not allowed). Bit `t % 32` of word `t / 32` allows token `t`.
pub fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    for (t, l) in logits.iter_mut().enumerate() {
        let allowed = mask.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1);
        if !allowed {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// [`sample`] restricted to the tokens `mask` allows: the logits of the others are -inf first.
/// When the model gives every allowed token -inf (or NaN), the allowed token with the lowest id.
pub fn sample_masked(
    logits: &[f32],
    history: &[u32],
    p: &SamplingParams,
    pos: u64,
    mask: &[u32],
) -> u32 {
    let mut l = logits.to_vec();
    apply_mask(&mut l, mask);
    if l.iter().all(|v| v.is_nan() || *v == f32::NEG_INFINITY) {
        return first_allowed(mask);
    }
    sample(&l, history, p, pos)
}

/// The lowest id `mask` allows (0 when it allows none): [`sample_masked`]'s answer when the
/// model gives every allowed token -inf or NaN.
pub fn first_allowed(mask: &[u32]) -> u32 {
    mask.iter()
        .enumerate()
        .find(|(_, w)| **w != 0)
        .map_or(0, |(i, w)| i as u32 * 32 + w.trailing_zeros())
}

/// Applies repetition, presence and frequency penalties for the tokens in `history`.
pub fn apply_penalties(logits: &mut [f32], history: &[u32], p: &SamplingParams) {
    if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
        return;
    }
    let mut counts: std::collections::BTreeMap<u32, u32> = Default::default();
    for &t in history {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &n) in &counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if p.repetition_penalty != 1.0 {
            *l = if *l > 0.0 {
                *l / p.repetition_penalty
            } else {
                *l * p.repetition_penalty
            };
        }
        *l -= p.presence_penalty + p.frequency_penalty * n as f32;
    }
}

/// Index of the largest logit, lowest index on ties (NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

/// Picks the token at `pos` from `logits` (penalties applied over `history` first).
/// Deterministic: the same inputs always give the same token.
///
/// Candidates are the tokens whose penalized logit is neither NaN nor -inf (probability 0), in
/// the order of the key logit / temperature (f32, `total_cmp`) descending, then id ascending
/// (the device's top-k uses the same order); where the key saturates to +-inf, equal keys are
/// ordered by logit first. Top-k keeps the first k. Weights are `exp(key - max key)` in f64, or,
/// when the largest key saturated, `exp((logit - max logit) / temperature)` in f64 (the +inf
/// logits share everything when there are any): every weight is in [0, 1], the first is 1, so
/// no temperature or logit gives an overflow or a NaN. When no token is a candidate (every logit
/// NaN or -inf), the result is the greedy token.
pub fn sample(logits: &[f32], history: &[u32], p: &SamplingParams, pos: u64) -> u32 {
    let mut l = logits.to_vec();
    apply_penalties(&mut l, history, p);
    if p.is_greedy() {
        return argmax(&l);
    }
    if let Some(ids) = order::ordered_ids(&l, p.temperature, p.top_k) {
        if ids.is_empty() {
            return argmax(&l);
        }
        let (ids, probs) = order::weights_cut(&l, p.temperature, &ids);
        return draw(&ids, probs, p, pos);
    }
    sample_by_comparison(&l, p, pos)
}

/// [`sample`]'s definition, run as written: a comparison sort of every candidate (also the road
/// for rows whose keys saturate).
fn sample_by_comparison(l: &[f32], p: &SamplingParams, pos: u64) -> u32 {
    let mut cand: Vec<Candidate> = l
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan() && **v != f32::NEG_INFINITY)
        .map(|(i, &v)| Candidate {
            id: i as u32,
            key: v / p.temperature,
            logit: v,
        })
        .collect();
    if cand.is_empty() {
        return argmax(l);
    }
    cand.sort_by(|a, b| {
        let saturated = a.key.is_infinite() && a.key == b.key;
        b.key
            .total_cmp(&a.key)
            .then(if saturated {
                b.logit.total_cmp(&a.logit)
            } else {
                std::cmp::Ordering::Equal
            })
            .then(a.id.cmp(&b.id))
    });
    if p.top_k > 0 && p.top_k < cand.len() {
        cand.truncate(p.top_k);
    }
    let probs = weights(&cand, p.temperature);
    let ids: Vec<u32> = cand.iter().map(|c| c.id).collect();
    draw(&ids, probs, p, pos)
}

/// The draw over ordered candidates `ids` with unnormalized weights `probs` (the first is 1):
/// normalize, cut by top-p and min-p, then walk the running sum to the Philox number.
fn draw(ids: &[u32], mut probs: Vec<f64>, p: &SamplingParams, pos: u64) -> u32 {
    let total: f64 = probs.iter().sum();
    // The first weight is 1, so the total is at least 1; the guard keeps a NaN out regardless.
    if !(total.is_finite() && total > 0.0) {
        return ids[0];
    }
    for q in probs.iter_mut() {
        *q /= total;
    }
    let mut keep = probs.len();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, q) in probs.iter().enumerate() {
            acc += q;
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    if p.min_p > 0.0 {
        let floor = probs[0] * p.min_p as f64;
        keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
    }
    let kept = &probs[..keep];
    let total: f64 = kept.iter().sum();
    let u = uniform(p.seed, pos) as f64 * total;
    let mut acc = 0.0;
    for (i, q) in kept.iter().enumerate() {
        acc += q;
        if u < acc {
            return ids[i];
        }
    }
    // Not reached (u < total); the last kept token with a non-zero weight.
    let last = kept.iter().rposition(|&q| q > 0.0).unwrap_or(0);
    ids[last]
}

/// One row for [`sample_rows`]: logits, history, parameters, position.
pub type SampleJob<'a> = (&'a [f32], &'a [u32], &'a SamplingParams, u64);

/// [`sample`] for many rows at once, on up to `available_parallelism` threads when the rows are
/// many and wide (a batch of sampled full-vocabulary rows costs the engine thread otherwise a
/// millisecond-scale sort each). The tokens are those of `sample`, row by row, in order.
pub fn sample_rows(jobs: &[SampleJob]) -> Vec<u32> {
    let one = |j: &SampleJob| sample(j.0, j.1, j.2, j.3);
    let work: usize = jobs.iter().map(|j| j.0.len()).sum();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if jobs.len() < 2 || work < 1 << 16 || threads < 2 {
        return jobs.iter().map(one).collect();
    }
    let per = jobs.len().div_ceil(threads.min(jobs.len()));
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .chunks(per)
            .map(|c| s.spawn(move || c.iter().map(one).collect::<Vec<u32>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// A token that may be sampled: its order key (logit / temperature in f32) and logit.
struct Candidate {
    id: u32,
    key: f32,
    logit: f32,
}

/// The unnormalized weight of each candidate, in [0, 1], the first one 1 (see [`sample`]).
fn weights(cand: &[Candidate], t: f32) -> Vec<f64> {
    let first = &cand[0];
    if first.key.is_finite() {
        let max = first.key as f64;
        return cand.iter().map(|c| (c.key as f64 - max).exp()).collect();
    }
    if first.logit == f32::INFINITY {
        return cand
            .iter()
            .map(|c| if c.logit == f32::INFINITY { 1.0 } else { 0.0 })
            .collect();
    }
    let max = first.logit as f64;
    cand.iter()
        .map(|c| ((c.logit as f64 - max) / t as f64).exp())
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn philox_known_answer() {
        // Random123 known-answer test vectors for philox4x32-10.
        assert_eq!(
            philox4x32([0; 4], [0; 2]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
    }

    #[test]
    fn greedy_takes_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        let p = SamplingParams::default();
        assert_eq!(sample(&[0.5, 0.1, 0.5], &[], &p, 0), 0);
    }

    #[test]
    fn sampling_is_keyed_by_seed_and_position() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 1.0,
            seed: 42,
            ..Default::default()
        };
        let a: Vec<u32> = (0..40).map(|pos| sample(&logits, &[], &p, pos)).collect();
        let b: Vec<u32> = (0..40).map(|pos| sample(&logits, &[], &p, pos)).collect();
        assert_eq!(a, b);
        let mut distinct = a.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 5, "draws should vary by position: {a:?}");
        let p2 = SamplingParams { seed: 43, ..p };
        let c: Vec<u32> = (0..40).map(|pos| sample(&logits, &[], &p2, pos)).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.1, 2.0, 1.9, -1.0];
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: 7,
            ..Default::default()
        };
        for pos in 0..20 {
            assert_eq!(sample(&logits, &[], &p, pos), 1);
        }
    }

    #[test]
    fn min_p_and_top_p_restrict_the_support() {
        let logits = [10.0, 9.5, 0.0, -5.0];
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 0.1,
            seed: 3,
            ..Default::default()
        };
        for pos in 0..50 {
            assert!(sample(&logits, &[], &p, pos) < 2);
        }
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: 3,
            ..Default::default()
        };
        for pos in 0..50 {
            assert_eq!(sample(&logits, &[], &p, pos), 0);
        }
    }

    #[test]
    fn penalties_push_seen_tokens_down() {
        let mut l = vec![2.0, -2.0, 1.0];
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        apply_penalties(&mut l, &[0, 0, 1], &p);
        assert_eq!(l, vec![2.0 / 2.0 - 0.5 - 0.5, -4.0 - 0.5 - 0.25, 1.0]);
    }

    #[test]
    fn tiny_temperatures_are_greedy() {
        // The issue-9 reproduction: 1e-38 returned the last token (f32 overflow, NaN weights).
        let mut logits: Vec<f32> = (0..49_152)
            .map(|i| ((i * 7919) % 1000) as f32 / 50.0 - 8.0)
            .collect();
        logits[321] = 12.0;
        let greedy = argmax(&logits);
        assert_eq!(greedy, 321);
        for t in [1e-38f32, 1e-30, 1e-7, MIN_TEMPERATURE, 1e-4] {
            let p = SamplingParams {
                temperature: t,
                seed: 5,
                ..Default::default()
            };
            for pos in 0..20 {
                assert_eq!(sample(&logits, &[], &p, pos), greedy, "temperature {t}");
            }
        }
    }

    #[test]
    fn infinite_and_nan_logits() {
        let p = SamplingParams {
            temperature: 1.0,
            seed: 11,
            ..Default::default()
        };
        let inf = f32::INFINITY;
        // +inf tokens share all the probability.
        let l = [1.0, inf, f32::NAN, inf, 3e38, f32::NEG_INFINITY];
        let mut seen = [0usize; 6];
        for pos in 0..200 {
            seen[sample(&l, &[], &p, pos) as usize] += 1;
        }
        assert_eq!(seen[0] + seen[2] + seen[4] + seen[5], 0, "{seen:?}");
        assert!(seen[1] > 0 && seen[3] > 0, "{seen:?}");
        // -inf and NaN are never picked while a finite logit exists; huge values do not overflow.
        let l = [f32::NEG_INFINITY, f32::NAN, -3e38, 3e38, f32::NEG_INFINITY];
        for t in [MIN_TEMPERATURE, 1e-3, 1.0, 100.0] {
            let p = SamplingParams {
                temperature: t,
                ..p.clone()
            };
            for pos in 0..50 {
                let tok = sample(&l, &[], &p, pos);
                assert!(tok == 2 || tok == 3, "t {t}: {tok}");
            }
        }
        // Nothing to pick from: the greedy answer.
        let l = [f32::NAN, f32::NEG_INFINITY, f32::NAN];
        assert_eq!(sample(&l, &[], &p, 0), argmax(&l));
    }

    /// Full-vocabulary rows (49,152 logits, a trained model's spread and a wider one that the
    /// weight cut truncates): the radix road and the comparison road pick the same token at
    /// every position, for the server's usual parameters.
    #[test]
    fn radix_road_equals_comparison_road_at_vocabulary_size() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32
        };
        for spread in [12.0f32, 40.0, 160.0] {
            let l: Vec<f32> = (0..49_152).map(|_| (next() - 0.9) * spread).collect();
            for (t, top_p, min_p, top_k) in [
                (0.7, 1.0, 0.0, 0),
                (1.0, 0.9, 0.0, 0),
                (0.8, 0.95, 0.05, 0),
                (1.3, 1.0, 0.0, 1000),
            ] {
                let p = SamplingParams {
                    temperature: t,
                    top_k,
                    top_p,
                    min_p,
                    seed: 11,
                    ..SamplingParams::default()
                };
                for pos in 0..40 {
                    assert_eq!(
                        sample(&l, &[], &p, pos),
                        sample_by_comparison(&l, &p, pos),
                        "spread {spread}, t {t}, top_p {top_p}, pos {pos}"
                    );
                }
            }
        }
    }

    /// Logit values that stress the arithmetic: ordinary, huge, infinite, NaN, and repeated.
    fn logit() -> impl Strategy<Value = f32> {
        prop_oneof![
            6 => -30.0f32..30.0,
            2 => prop::sample::select(vec![0.0f32, 1.0, 1.0, -1.0, 2.5]),
            1 => prop::sample::select(vec![f32::MAX, f32::MIN, 1e30, -1e30, 3e37]),
            1 => prop::sample::select(vec![f32::INFINITY, f32::NEG_INFINITY, f32::NAN]),
        ]
    }

    fn temperature() -> impl Strategy<Value = f32> {
        prop_oneof![
            1 => Just(0.0f32),
            1 => (-45.0f64..-5.0).prop_map(|e| 10f64.powf(e) as f32),
            4 => (-5.0f64..2.0).prop_map(|e| (10f64.powf(e) as f32).max(MIN_TEMPERATURE)),
        ]
    }

    fn params() -> impl Strategy<Value = SamplingParams> {
        (
            temperature(),
            prop_oneof![Just(0usize), 1usize..70],
            prop_oneof![Just(1.0f32), 0.01f32..1.0],
            prop_oneof![Just(0.0f32), 0.0f32..=1.0],
            prop_oneof![Just(1.0f32), 0.01f32..10.0],
            -2.0f32..2.0,
            -2.0f32..2.0,
            any::<u64>(),
        )
            .prop_map(
                |(temperature, top_k, top_p, min_p, rep, pres, freq, seed)| SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    repetition_penalty: rep,
                    presence_penalty: pres,
                    frequency_penalty: freq,
                    seed,
                },
            )
    }

    /// What the parameters allow, by the documented rule: the candidates in order, each with its
    /// probability among the top-k survivors. Its weights come from the logits alone
    /// (`exp((logit - max) / t)` in f64), so they agree with `sample`'s to rounding.
    fn allowed(l: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
        let mut c: Vec<(u32, f32)> = l
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan() && **v > f32::NEG_INFINITY)
            .map(|(i, &v)| (i as u32, v))
            .collect();
        let key = |v: f32| v / p.temperature;
        c.sort_by(|a, b| {
            let (ka, kb) = (key(a.1), key(b.1));
            let tie = if ka.is_infinite() && ka == kb {
                b.1.total_cmp(&a.1)
            } else {
                std::cmp::Ordering::Equal
            };
            kb.total_cmp(&ka).then(tie).then(a.0.cmp(&b.0))
        });
        if p.top_k > 0 {
            c.truncate(p.top_k);
        }
        let max = c.iter().map(|x| x.1).fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = c
            .iter()
            .map(|x| match max == f32::INFINITY {
                true => f64::from(u8::from(x.1 == f32::INFINITY)),
                false => ((x.1 as f64 - max as f64) / p.temperature as f64).exp(),
            })
            .collect();
        let total: f64 = w.iter().sum();
        c.iter().zip(w).map(|(x, w)| (x.0, w / total)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The sampler never returns a token the parameters exclude, and is deterministic.
        #[test]
        fn never_returns_an_excluded_token(
            logits in prop::collection::vec(logit(), 1..60),
            history in prop::collection::vec(0u32..64, 0..12),
            p in params(),
            pos in any::<u64>(),
        ) {
            let tok = sample(&logits, &history, &p, pos);
            prop_assert_eq!(tok, sample(&logits, &history, &p, pos));
            let mut l = logits.clone();
            apply_penalties(&mut l, &history, &p);
            let allowed = allowed(&l, &p);
            if p.is_greedy() || allowed.is_empty() {
                prop_assert_eq!(tok, argmax(&l));
                return Ok(());
            }
            let rank = allowed.iter().position(|a| a.0 == tok);
            // Inside top-k, not NaN, not -inf.
            prop_assert!(rank.is_some(), "{} not allowed: {:?}", tok, allowed);
            let rank = rank.unwrap_or(0);
            let prob = allowed[rank].1;
            prop_assert!(prob > 0.0, "zero-probability token {}", tok);
            // Top-p: the tokens before it hold less than top_p.
            let before: f64 = allowed[..rank].iter().map(|a| a.1).sum();
            prop_assert!(before < p.top_p as f64 + 1e-9, "top-p: {} before", before);
            // Min-p: at least min_p times the most likely token's probability.
            let pmax = allowed.iter().map(|a| a.1).fold(0.0, f64::max);
            prop_assert!(prob >= pmax * p.min_p as f64 * (1.0 - 1e-9), "min-p: {} < {}", prob, pmax);
        }

        /// `top_k`'s partial selection equals a full sort (the order is total).
        #[test]
        fn top_k_equals_a_full_sort(
            logits in prop::collection::vec(logit(), 0..400),
            k in 0usize..90,
        ) {
            let mut all: Vec<(u32, f32)> =
                logits.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            all.truncate(k);
            let got = crate::generate::top_k(&logits, k);
            let bits = |v: &[(u32, f32)]| v.iter().map(|x| (x.0, x.1.to_bits())).collect::<Vec<_>>();
            prop_assert_eq!(bits(&got), bits(&all));
        }

        /// The radix road of `sample` picks exactly the comparison road's token.
        #[test]
        fn radix_road_equals_comparison_road(
            logits in prop::collection::vec(logit(), 1..300),
            p in params(),
            t in prop_oneof![0.05f32..0.5, 0.5f32..2.0, 2.0f32..20.0],
            pos in any::<u64>(),
        ) {
            // Always a sampled (not greedy) temperature: a rejection would starve proptest.
            let p = SamplingParams { temperature: t, ..p };
            prop_assert!(!p.is_greedy());
            let mut l = logits.clone();
            apply_penalties(&mut l, &[], &p);
            prop_assert_eq!(sample(&logits, &[], &p, pos), sample_by_comparison(&l, &p, pos));
        }

        /// As the temperature goes to 0 the sampler returns the greedy token.
        #[test]
        fn low_temperature_is_greedy(
            logits in prop::collection::vec(-30.0f32..30.0, 2..60),
            t_exp in -45.0f64..-2.0,
            p in params(),
            pos in any::<u64>(),
        ) {
            let t = 10f64.powf(t_exp) as f32;
            let p = SamplingParams { temperature: t, ..p };
            let mut l = logits.clone();
            apply_penalties(&mut l, &[], &p);
            let best = argmax(&l);
            let top = l[best as usize];
            let second = l.iter().enumerate().filter(|(i, _)| *i != best as usize)
                .map(|(_, &v)| v).fold(f32::NEG_INFINITY, f32::max);
            // Certain once every other weight underflows: exp(-800) is 0 in f64.
            if p.is_greedy() || (top as f64 - second as f64) / t as f64 > 800.0 {
                prop_assert_eq!(sample(&logits, &[], &p, pos), best);
            }
        }
    }

    #[test]
    fn logprobs_normalize() {
        let logits = [1.0f32, 2.0, 3.0];
        let (lp, top) = logprobs(&logits, &[], &SamplingParams::default(), 2, 2);
        let total: f64 = logits.iter().map(|&v| ((v - 3.0) as f64).exp()).sum();
        assert_eq!(lp, (-(total.ln())) as f32);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0, 2);
        assert!(top[0].1 > top[1].1);
    }

    #[test]
    fn validate_names_the_parameter() {
        let p = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("top_p"));
    }
}

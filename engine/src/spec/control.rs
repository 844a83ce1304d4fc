//! Automatic fallback: per sequence, how many tokens to draft next step (0 = plain decode).
//!
//! A verify step of K drafts costs about `1 + r*K` plain steps, where `r` is the cost of one
//! extra row relative to a step ([`StepCost`] measures it); with acceptance `p` per draft (the
//! chance a draft is accepted given that the one before it was) it yields `1 + p + ... + p^K`
//! tokens. Speculation pays while `p > r` (the K = 1 break-even): below it the sequence decodes
//! plainly for a back-off that doubles each time, then probes again with K = 1. The depth asked
//! for is the K that maximizes tokens per unit of step time under the measured `p` and `r`
//! ([`best_depth`]), capped by a ceiling that grows by one after a fully accepted draft and
//! halves after a fully rejected one. None of this changes output: acceptance makes every K,
//! and no speculation, produce the same tokens.
//!
//! A draft that comes with the length of the suffix match that proposed it (n-gram lookup,
//! [`super::Drafter::draft_matched`]) gets its depth from that instead ([`MatchRates`]): the
//! acceptance of such drafts depends on the match length far more than on the sequence (offline,
//! sampled: 0.35 after a 1-token match, 0.88 after a 4-token one), so the model keeps `p` per
//! match length and each draft is cut to [`best_depth`] under its match length's `p`, up to the
//! request's `k` and room. The per-sequence controller still backs such a sequence off when
//! its drafts do not pay; its ceiling does not cap them (it halves after one rejected 1-token
//! match and would cut the 4-token matches after it: worse in the replay at r <= 0.1).

/// Per-sequence controller.
#[derive(Clone, Debug)]
pub struct SpecControl {
    k_max: usize,
    /// The ceiling on K.
    k: usize,
    /// Decayed counts of accepted drafts and of drafts whose acceptance was decided (the
    /// accepted ones plus the first rejected one of each step): `p = hits / tries`.
    hits: f32,
    tries: f32,
    /// Plain steps left before probing again.
    off: u32,
    /// The next back-off length.
    backoff: u32,
}

/// Weight a step's evidence keeps per later step.
const DECAY: f32 = 0.7;
const MAX_BACKOFF: u32 = 64;

/// The depth (1..=`k_max`) that yields the most tokens per unit of step time when each draft is
/// accepted with probability `p` (given the one before it was) and a row costs `r` of a step:
/// the argmax of `(1 + p + ... + p^K) / (1 + r*K)`.
pub fn best_depth(p: f32, r: f32, k_max: usize) -> usize {
    let (p, r) = (p.clamp(0.0, 1.0) as f64, r.max(0.0) as f64);
    let (mut best, mut best_k) = (0.0f64, 1);
    let (mut tokens, mut pk) = (1.0f64, 1.0f64);
    for k in 1..=k_max.max(1) {
        pk *= p;
        tokens += pk;
        let v = tokens / (1.0 + r * k as f64);
        if v > best * (1.0 + 1e-6) {
            (best, best_k) = (v, k);
        }
    }
    best_k
}

impl SpecControl {
    pub fn new(k_max: usize) -> SpecControl {
        SpecControl {
            k_max: k_max.max(1),
            k: k_max.max(1),
            hits: 1.0,
            tries: 1.0,
            off: 0,
            backoff: 4,
        }
    }

    /// The ceiling on K this step (0: decode plainly, backing off).
    pub fn k(&self) -> usize {
        if self.off > 0 { 0 } else { self.k }
    }

    /// Drafts to ask for this step when a row costs `row_cost` of a step: [`best_depth`] under
    /// the measured acceptance, within the ceiling (0: decode plainly).
    pub fn depth(&self, row_cost: f32) -> usize {
        match self.k() {
            0 => 0,
            k => best_depth(self.rate(), row_cost, k),
        }
    }

    /// Whether the sequence is backing off (low acceptance).
    pub fn backing_off(&self) -> bool {
        self.off > 0
    }

    /// A plain step ran (no draft checked).
    pub fn plain_step(&mut self) {
        if self.off > 0 {
            self.off -= 1;
            if self.off == 0 {
                // Probe: one draft, optimistic rate so one bad probe does not end it at once.
                self.k = 1;
                if self.rate() < 0.5 {
                    (self.hits, self.tries) = (0.5, 1.0);
                }
            }
        }
    }

    /// A verify step checked `drafted` drafts and accepted `accepted`; `row_cost` is `r`.
    pub fn verified(&mut self, drafted: usize, accepted: usize, row_cost: f32) {
        if drafted == 0 {
            return self.plain_step();
        }
        let rejected = usize::from(accepted < drafted);
        self.hits = DECAY * self.hits + accepted as f32;
        self.tries = DECAY * self.tries + (accepted + rejected) as f32;
        if accepted == drafted {
            self.k = (self.k + 1).min(self.k_max);
            self.backoff = 4;
        } else if accepted == 0 {
            self.k = (self.k / 2).max(1);
        }
        if self.rate() < row_cost {
            self.off = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Current estimate of `p`, the acceptance of a draft given the one before it was accepted.
    pub fn rate(&self) -> f32 {
        if self.tries > 0.0 {
            self.hits / self.tries
        } else {
            1.0
        }
    }
}

/// Match-length buckets of [`MatchRates`]: 1, 2, 3 and 4 or more tokens.
pub const MATCH_BUCKETS: usize = 4;
/// Prior acceptance per match-length bucket, greedy and sampled: the offline replay of n-gram
/// drafts on SmolLM2's grounded generations (reports/spec/ngram-sampled-cpu.md).
const MATCH_PRIOR: [[f32; MATCH_BUCKETS]; 2] = [[0.31, 0.60, 0.70, 0.97], [0.35, 0.54, 0.61, 0.88]];
/// Tries the prior weighs as.
const MATCH_PRIOR_TRIES: f32 = 4.0;
/// Weight a draft's evidence keeps per later draft of its bucket (model-wide: about the last
/// 50 decided drafts per bucket count).
const MATCH_DECAY: f32 = 0.98;

/// The acceptance of looked-up drafts per length of the match that proposed them (one table
/// per model and class, greedy or sampled: sampled text leaves a copy more often), and the
/// depth it earns a draft.
#[derive(Clone, Debug)]
pub struct MatchRates {
    /// Decayed (hits, tries) per bucket, counted as [`SpecControl`] counts them.
    rate: [(f32, f32); MATCH_BUCKETS],
}

impl MatchRates {
    /// The prior table: greedy or `sampled`.
    pub fn new(sampled: bool) -> MatchRates {
        let prior = MATCH_PRIOR[usize::from(sampled)];
        MatchRates {
            rate: prior.map(|p| (p * MATCH_PRIOR_TRIES, MATCH_PRIOR_TRIES)),
        }
    }

    /// The bucket of a match of `matched` tokens (0..MATCH_BUCKETS).
    pub fn bucket(matched: usize) -> usize {
        matched.clamp(1, MATCH_BUCKETS) - 1
    }

    /// `p` of a draft proposed by a match of `matched` tokens.
    pub fn rate(&self, matched: usize) -> f32 {
        let (h, t) = self.rate[Self::bucket(matched)];
        if t > 0.0 { h / t } else { 0.0 }
    }

    /// Drafts to keep of a draft proposed by a match of `matched` tokens when a row costs
    /// `row_cost` of a step: [`best_depth`] under the bucket's `p`, at most `cap` (the
    /// request's `k` and room).
    pub fn depth(&self, matched: usize, row_cost: f32, cap: usize) -> usize {
        match cap {
            0 => 0,
            cap => best_depth(self.rate(matched), row_cost, cap),
        }
    }

    /// A draft proposed by a match of `matched` tokens: `accepted` of the `drafted` tokens the
    /// step checked were accepted.
    pub fn verified(&mut self, matched: usize, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let tries = accepted + usize::from(accepted < drafted);
        let r = &mut self.rate[Self::bucket(matched)];
        r.0 = MATCH_DECAY * r.0 + accepted as f32;
        r.1 = MATCH_DECAY * r.1 + tries as f32;
    }
}

/// Online fit of step time = a + b * rows (exponentially forgetting least squares); `r = b / (a +
/// b)` is the cost of one extra row relative to a one-row step.
#[derive(Clone, Debug)]
pub struct StepCost {
    s: [f64; 5],
}

impl Default for StepCost {
    fn default() -> Self {
        StepCost { s: [0.0; 5] }
    }
}

const FORGET: f64 = 0.98;

impl StepCost {
    /// A step of `rows` rows took `secs`.
    pub fn record(&mut self, rows: usize, secs: f64) {
        let x = rows as f64;
        let [w, sx, sy, sxx, sxy] = &mut self.s;
        *w = *w * FORGET + 1.0;
        *sx = *sx * FORGET + x;
        *sy = *sy * FORGET + secs;
        *sxx = *sxx * FORGET + x * x;
        *sxy = *sxy * FORGET + x * secs;
    }

    /// `r`, clamped to 0.05..=1; 0.3 until the fit has seen two different row counts.
    pub fn row_cost(&self) -> f32 {
        self.row_cost_in(1)
    }

    /// The break-even acceptance of a draft in a step of `rows` rows without drafts: the
    /// rows' share of the step's time, `b*rows / (a + b*rows)` (a step of B rows yields B
    /// tokens; a draft row adds `b` to it and `p` tokens, so it pays while `p > b*B / (a +
    /// b*B)`). For one row it is `r`. Clamped to 0.05..=1; until the fit has seen two row
    /// counts, 0.3 for one row and `1 - 0.7^rows` for more.
    pub fn row_cost_in(&self, rows: usize) -> f32 {
        let n = rows.max(1) as f64;
        let [w, sx, sy, sxx, sxy] = self.s;
        let den = w * sxx - sx * sx;
        let prior = (1.0 - 0.7f64.powf(n)) as f32;
        if w < 2.0 || den <= 1e-9 * w * w {
            return prior;
        }
        let b = (w * sxy - sx * sy) / den;
        let a = (sy - b * sx) / w;
        if a + b * n <= 0.0 {
            return prior;
        }
        ((b * n / (a + b * n)) as f32).clamp(0.05, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_on_full_acceptance_and_shrinks_on_rejection() {
        let mut c = SpecControl::new(4);
        assert_eq!(c.k(), 4);
        c.verified(4, 0, 0.1);
        assert_eq!(c.k(), 2);
        c.verified(2, 2, 0.1);
        assert_eq!(c.k(), 3);
    }

    #[test]
    fn switches_off_when_it_does_not_pay_and_probes_again() {
        let mut c = SpecControl::new(4);
        let mut off_at = None;
        for i in 0..20 {
            c.verified(c.k().max(1), 0, 0.5);
            if c.k() == 0 {
                off_at = Some(i);
                break;
            }
        }
        assert!(off_at.is_some(), "never switched off at acceptance 0");
        for _ in 0..4 {
            assert_eq!(c.k(), 0);
            c.plain_step();
        }
        assert_eq!(c.k(), 1, "probes with one draft after the back-off");
        // Good probes keep it on and grow K again.
        for _ in 0..4 {
            c.verified(c.k(), c.k(), 0.5);
        }
        assert_eq!(c.k(), 4);
    }

    #[test]
    fn cheap_rows_keep_low_acceptance_on() {
        let mut c = SpecControl::new(2);
        for _ in 0..50 {
            c.verified(2, 1, 0.2);
        }
        assert!(c.k() > 0);
    }

    #[test]
    fn depth_follows_acceptance_and_row_cost() {
        // Certain acceptance: as deep as allowed; expensive rows and poor acceptance: one.
        assert_eq!(best_depth(1.0, 0.05, 8), 8);
        assert_eq!(best_depth(0.5, 0.3, 8), 1);
        assert_eq!(best_depth(0.0, 0.0, 8), 1);
        let mid = best_depth(0.8, 0.05, 16);
        assert!((4..=10).contains(&mid), "{mid}");
        // The controller: full acceptance on cheap rows asks for the ceiling, a poor record
        // on expensive rows for one draft.
        let mut c = SpecControl::new(8);
        assert_eq!(c.depth(0.02), 8);
        for _ in 0..6 {
            c.verified(4, 1, 0.3);
        }
        assert!(c.k() > 0 && c.depth(0.3) == 1, "{} {}", c.k(), c.depth(0.3));
        // Accepted 1 of 4 each step: about one success per two decided drafts.
        assert!((c.rate() - 0.5).abs() < 0.05, "{}", c.rate());
    }

    #[test]
    fn match_depth_grows_with_the_match_length_from_the_priors() {
        for sampled in [false, true] {
            let m = MatchRates::new(sampled);
            // Before any data: the priors.
            let prior = MATCH_PRIOR[usize::from(sampled)];
            for n in 1..=MATCH_BUCKETS {
                assert!((m.rate(n) - prior[n - 1]).abs() < 1e-6, "{sampled} {n}");
            }
            assert_eq!(m.rate(9), m.rate(4), "4 and more share a bucket");
            let d: Vec<usize> = (1..=4).map(|n| m.depth(n, 0.1, 8)).collect();
            assert!(d.windows(2).all(|w| w[0] <= w[1]), "{sampled} {d:?}");
            assert_eq!(d[0], 1, "{sampled} {d:?}");
            assert!(d[3] >= 6, "{sampled} {d:?}");
            // Dearer rows, shallower drafts.
            assert!(m.depth(3, 0.3, 8) < d[2], "{sampled}");
        }
    }

    #[test]
    fn match_depth_respects_the_cap() {
        let m = MatchRates::new(false);
        assert_eq!(m.depth(4, 0.03, 8), 8);
        assert_eq!(m.depth(4, 0.03, 3), 3);
        assert_eq!(m.depth(4, 0.03, 0), 0);
        assert_eq!(m.depth(1, 0.0, 0), 0);
        assert_eq!(m.depth(1, 0.9, 8), 1);
    }

    #[test]
    fn match_rates_learn_per_bucket() {
        let mut m = MatchRates::new(true);
        let (one, two) = (m.rate(1), m.rate(2));
        // 4-token matches whose first draft is always rejected: that bucket's depth falls to
        // one, the others keep their priors.
        for _ in 0..40 {
            m.verified(4, 8, 0);
        }
        assert!(m.rate(4) < 0.1, "{}", m.rate(4));
        assert_eq!(m.depth(4, 0.1, 8), 1);
        assert_eq!((m.rate(1), m.rate(2)), (one, two));
        // 1-token matches fully accepted: the bucket's `p` climbs and its depth with it.
        for _ in 0..40 {
            m.verified(1, 3, 3);
        }
        assert!(m.rate(1) > 0.9, "{}", m.rate(1));
        assert!(m.depth(1, 0.1, 8) >= 6, "{}", m.depth(1, 0.1, 8));
        // An empty check teaches nothing.
        let before = m.rate(3);
        m.verified(3, 0, 0);
        assert_eq!(m.rate(3), before);
    }

    #[test]
    fn step_cost_fits_a_line() {
        let mut s = StepCost::default();
        assert_eq!(s.row_cost(), 0.3);
        for i in 0..40 {
            let rows = 1 + i % 5;
            s.record(rows, 1.0 + 0.25 * rows as f64);
        }
        assert!((s.row_cost() - 0.2).abs() < 1e-3, "{}", s.row_cost());
        // In a step of 4 rows a draft row must beat 4 * 0.25 / (1 + 4 * 0.25) = 0.5.
        assert!(
            (s.row_cost_in(4) - 0.5).abs() < 1e-3,
            "{}",
            s.row_cost_in(4)
        );
        assert!(s.row_cost_in(64) > 0.9);
        let fresh = StepCost::default();
        assert_eq!(fresh.row_cost_in(1), fresh.row_cost());
        assert!(fresh.row_cost_in(8) > 0.9);
    }
}

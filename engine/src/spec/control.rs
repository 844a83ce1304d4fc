//! Automatic fallback: per sequence, how many tokens to draft next step (0 = plain decode).
//!
//! A verify step of K drafts costs about `1 + r*K` plain steps, where `r` is the cost of one
//! extra row relative to a step ([`StepCost`] measures it); with acceptance rate `p` per draft
//! it yields `1 + p + ... + p^K` tokens. Speculation pays while `p > r` (the K = 1 break-even):
//! below it the sequence decodes plainly for a back-off that doubles each time, then probes again
//! with K = 1. K grows by one after a fully accepted draft and halves after a fully rejected one.
//! None of this changes output: acceptance makes every K, and no speculation, produce the same
//! tokens.

/// Per-sequence controller.
#[derive(Clone, Debug)]
pub struct SpecControl {
    k_max: usize,
    k: usize,
    /// Exponential moving average of accepted / drafted.
    rate: f32,
    /// Plain steps left before probing again.
    off: u32,
    /// The next back-off length.
    backoff: u32,
}

const ALPHA: f32 = 0.3;
const MAX_BACKOFF: u32 = 64;

impl SpecControl {
    pub fn new(k_max: usize) -> SpecControl {
        SpecControl {
            k_max: k_max.max(1),
            k: k_max.max(1),
            rate: 1.0,
            off: 0,
            backoff: 4,
        }
    }

    /// Drafts to ask for this step (0: decode plainly).
    pub fn k(&self) -> usize {
        if self.off > 0 { 0 } else { self.k }
    }

    /// A plain step ran (no draft checked).
    pub fn plain_step(&mut self) {
        if self.off > 0 {
            self.off -= 1;
            if self.off == 0 {
                // Probe: one draft, optimistic rate so one bad probe does not end it at once.
                self.k = 1;
                self.rate = self.rate.max(0.5);
            }
        }
    }

    /// A verify step checked `drafted` drafts and accepted `accepted`; `row_cost` is `r`.
    pub fn verified(&mut self, drafted: usize, accepted: usize, row_cost: f32) {
        if drafted == 0 {
            return self.plain_step();
        }
        let p = accepted as f32 / drafted as f32;
        self.rate = (1.0 - ALPHA) * self.rate + ALPHA * p;
        if accepted == drafted {
            self.k = (self.k + 1).min(self.k_max);
            self.backoff = 4;
        } else if accepted == 0 {
            self.k = (self.k / 2).max(1);
        }
        if self.rate < row_cost {
            self.off = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Current acceptance estimate.
    pub fn rate(&self) -> f32 {
        self.rate
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
        let [w, sx, sy, sxx, sxy] = self.s;
        let den = w * sxx - sx * sx;
        if w < 2.0 || den <= 1e-9 * w * w {
            return 0.3;
        }
        let b = (w * sxy - sx * sy) / den;
        let a = (sy - b * sx) / w;
        if a + b <= 0.0 {
            return 0.3;
        }
        ((b / (a + b)) as f32).clamp(0.05, 1.0)
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
    fn step_cost_fits_a_line() {
        let mut s = StepCost::default();
        assert_eq!(s.row_cost(), 0.3);
        for i in 0..40 {
            let rows = 1 + i % 5;
            s.record(rows, 1.0 + 0.25 * rows as f64);
        }
        assert!((s.row_cost() - 0.2).abs() < 1e-3, "{}", s.row_cost());
    }
}

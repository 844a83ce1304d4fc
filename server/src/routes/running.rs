//! A request between submission and its response (whole or streamed): what generate.rs hands
//! to the response side (generate.rs `collect`, stream.rs) and the latency metrics they record.

use std::sync::Arc;
use std::time::Instant;

use memra_engine::request::EventStream;

use super::shape::Shaper;
use crate::state::{Permit, State};

/// Everything a running request carries to its response.
pub struct Running {
    pub events: EventStream,
    pub shaper: Shaper,
    pub state: Arc<State>,
    pub started: Instant,
    pub permit: Permit,
    /// Tokens received from the engine so far.
    pub tokens: usize,
    /// Whether the finished request's usage went into the metrics.
    pub counted: bool,
}

impl Running {
    /// Counts a finished request's usage (once).
    pub fn count_usage(&mut self, usage: &memra_engine::request::Usage) {
        self.state.metrics.usage(usage);
        self.counted = true;
    }
}

impl Drop for Running {
    /// A request that ends without `Done` (the client left or stalled, an error) still counts
    /// the tokens it generated in `generation_tokens_total`.
    fn drop(&mut self) {
        if !self.counted {
            self.state.metrics.generated(self.tokens);
        }
    }
}

/// Records TTFT (first token) or the inter-token gap.
pub fn observe_token(run: &mut Running, last: &mut Option<Instant>) {
    run.tokens += 1;
    let now = Instant::now();
    match last {
        None => run
            .state
            .metrics
            .first_token(now.duration_since(run.started).as_secs_f64()),
        Some(t) => run
            .state
            .metrics
            .inter_token(now.duration_since(*t).as_secs_f64()),
    }
    *last = Some(now);
}

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
}

/// Records TTFT (first token) or the inter-token gap.
pub fn observe_token(run: &Running, last: &mut Option<Instant>) {
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

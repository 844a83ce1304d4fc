//! Prometheus metrics (OpenMetrics text via `prometheus-client`): requests by status and tenant,
//! queue depth, running sequences, KV blocks, prefix-cache hit tokens, TTFT and inter-token
//! latency histograms, prompt and generated token counters.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use memra_engine::engine::EngineStats;

/// Content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub status: String,
    pub tenant: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    queue_depth: Gauge,
    running: Gauge,
    kv_used: Gauge,
    kv_free: Gauge,
    in_flight: Gauge,
    cached_tokens: Counter,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    spec_drafted: Counter,
    spec_accepted: Counter,
    ttft: Histogram,
    itl: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("memra");
        let m = Metrics {
            requests: Family::default(),
            queue_depth: Gauge::default(),
            running: Gauge::default(),
            kv_used: Gauge::default(),
            kv_free: Gauge::default(),
            in_flight: Gauge::default(),
            cached_tokens: Counter::default(),
            prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            spec_drafted: Counter::default(),
            spec_accepted: Counter::default(),
            ttft: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            itl: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "HTTP requests by route, status and tenant",
            m.requests.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for the scheduler",
            m.queue_depth.clone(),
        );
        registry.register(
            "running_sequences",
            "Sequences being generated",
            m.running.clone(),
        );
        registry.register(
            "kv_blocks_used",
            "KV cache blocks in use",
            m.kv_used.clone(),
        );
        registry.register("kv_blocks_free", "KV cache blocks free", m.kv_free.clone());
        registry.register(
            "http_in_flight",
            "Inference requests being served",
            m.in_flight.clone(),
        );
        registry.register(
            "prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            m.cached_tokens.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens processed",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "generation_tokens",
            "Tokens generated",
            m.generated_tokens.clone(),
        );
        registry.register(
            "spec_draft_tokens",
            "Draft tokens checked by speculative decoding (finished requests)",
            m.spec_drafted.clone(),
        );
        registry.register(
            "spec_accepted_tokens",
            "Draft tokens accepted by speculative decoding (finished requests)",
            m.spec_accepted.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from request arrival to its first generated token",
            m.ttft.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request",
            m.itl.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn request(&self, route: &str, status: u16, tenant: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_string(),
                status: status.to_string(),
                tenant: tenant.to_string(),
            })
            .inc();
    }

    pub fn first_token(&self, secs: f64) {
        self.ttft.observe(secs);
    }

    pub fn inter_token(&self, secs: f64) {
        self.itl.observe(secs);
    }

    /// A finished request's token counts.
    pub fn usage(&self, u: &memra_engine::request::Usage) {
        self.prompt_tokens.inc_by(u.prompt_tokens as u64);
        self.generated_tokens.inc_by(u.completion_tokens as u64);
        self.cached_tokens.inc_by(u.cached_tokens as u64);
        self.spec_drafted.inc_by(u.drafted_tokens as u64);
        self.spec_accepted.inc_by(u.accepted_tokens as u64);
    }

    /// Tokens generated by a request that ended without its usage (cancelled, stalled, failed).
    pub fn generated(&self, n: usize) {
        self.generated_tokens.inc_by(n as u64);
    }

    /// The text exposition, with gauges set from `stats` and `in_flight`.
    pub fn render(&self, stats: &EngineStats, in_flight: usize) -> String {
        let g = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.queue_depth.set(g(stats.queue_depth));
        self.running.set(g(stats.running));
        self.kv_used.set(g(stats.kv_blocks_used));
        self.kv_free.set(g(stats.kv_blocks_free));
        self.in_flight.set(g(in_flight));
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

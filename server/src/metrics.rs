//! Prometheus metrics (OpenMetrics text via `prometheus-client`): requests by status and tenant,
//! queue depth, running sequences, KV blocks, prefix-cache hit tokens, TTFT and inter-token
//! latency histograms, prompt and generated token counters; for routers, each tenant's queue,
//! running sequences and requests in flight, and each model's KV headroom; per model, its
//! speculative decoding: the drafter, drafts checked and accepted (per drafter), verify steps,
//! the acceptance rate and why sequences decoded without drafts.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use memra_engine::engine::EngineStats;

/// Content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub status: String,
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrafterLabels {
    pub model: String,
    pub drafter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MatchLabels {
    pub model: String,
    /// The length of the suffix match that proposed an n-gram draft: `1`, `2`, `3`, `4+`, or
    /// `traffic` for a draft from the traffic store (earlier requests' outputs).
    pub match_len: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    pub model: String,
    pub reason: String,
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
    tenant_queued: Family<TenantLabel, Gauge>,
    tenant_running: Family<TenantLabel, Gauge>,
    tenant_in_flight: Family<TenantLabel, Gauge>,
    /// Tenants seen so far (in a request or the engine's stats): one that has nothing in flight
    /// reads 0 rather than vanishing (bounded by the keyring's tenants: names come only from
    /// authenticated keys).
    tenants_seen: Mutex<BTreeSet<String>>,
    kv_total: Family<ModelLabel, Gauge>,
    kv_cached: Family<ModelLabel, Gauge>,
    kv_headroom_tokens: Family<ModelLabel, Gauge>,
    kv_headroom_ratio: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    spec_drafter: Family<DrafterLabels, Gauge>,
    spec_model_drafted: Family<DrafterLabels, Counter>,
    spec_model_accepted: Family<DrafterLabels, Counter>,
    spec_verify_steps: Family<ModelLabel, Counter>,
    spec_acceptance: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    spec_fallbacks: Family<FallbackLabels, Counter>,
    spec_match_drafted: Family<MatchLabels, Counter>,
    spec_match_accepted: Family<MatchLabels, Counter>,
    /// Serializes the catching up of the engine-total counters (two scrapes at once).
    totals: Mutex<()>,
    /// The drafter series each model shows.
    drafter_shown: Mutex<HashMap<String, DrafterLabels>>,
}

/// Raises counter `c` to the engine's running total `to` (totals only grow).
fn catch_up(c: &Counter, to: u64) {
    let now = c.get();
    if to > now {
        c.inc_by(to - now);
    }
}

/// What `/metrics` reads besides the engine's stats: the server's own in-flight counts and each
/// model's positions per KV block.
pub struct ServerLoad<'a> {
    pub in_flight: usize,
    pub tenants_in_flight: &'a HashMap<String, usize>,
    pub block_size: &'a dyn Fn(&str) -> Option<usize>,
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
            tenant_queued: Family::default(),
            tenant_running: Family::default(),
            tenant_in_flight: Family::default(),
            tenants_seen: Mutex::new(BTreeSet::new()),
            kv_total: Family::default(),
            kv_cached: Family::default(),
            kv_headroom_tokens: Family::default(),
            kv_headroom_ratio: Family::default(),
            spec_drafter: Family::default(),
            spec_model_drafted: Family::default(),
            spec_model_accepted: Family::default(),
            spec_verify_steps: Family::default(),
            spec_acceptance: Family::default(),
            spec_fallbacks: Family::default(),
            spec_match_drafted: Family::default(),
            spec_match_accepted: Family::default(),
            totals: Mutex::new(()),
            drafter_shown: Mutex::new(HashMap::new()),
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
        registry.register(
            "tenant_queue_depth",
            "A tenant's requests admitted by the engine and waiting to run",
            m.tenant_queued.clone(),
        );
        registry.register(
            "tenant_running_sequences",
            "A tenant's sequences being generated",
            m.tenant_running.clone(),
        );
        registry.register(
            "tenant_http_in_flight",
            "A tenant's inference requests being served (tokenizing, queued or running)",
            m.tenant_in_flight.clone(),
        );
        registry.register(
            "kv_blocks_capacity",
            "A model's KV cache blocks",
            m.kv_total.clone(),
        );
        registry.register(
            "kv_blocks_cached",
            "A model's idle KV blocks kept by the prefix cache (free: evicted when needed)",
            m.kv_cached.clone(),
        );
        registry.register(
            "kv_headroom_tokens",
            "Positions a model's free KV blocks hold (prefix-cache blocks count as free)",
            m.kv_headroom_tokens.clone(),
        );
        registry.register(
            "kv_headroom_ratio",
            "A model's free KV blocks over all its blocks (0 to 1)",
            m.kv_headroom_ratio.clone(),
        );
        registry.register(
            "model_spec_drafter",
            "A model's speculative drafter (1): ngram, mtp, draft:FILE or parts joined by + \
             (picked per sequence by measured acceptance); off when it decodes plainly",
            m.spec_drafter.clone(),
        );
        registry.register(
            "model_spec_draft_tokens",
            "Draft tokens a model's verify steps checked, per drafter",
            m.spec_model_drafted.clone(),
        );
        registry.register(
            "model_spec_accepted_tokens",
            "Draft tokens a model accepted (emitted without a step of their own), per drafter",
            m.spec_model_accepted.clone(),
        );
        registry.register(
            "model_spec_verify_steps",
            "Sequence steps of a model that checked at least one draft",
            m.spec_verify_steps.clone(),
        );
        registry.register(
            "model_spec_acceptance_ratio",
            "A model's accepted over checked draft tokens since start (0 to 1)",
            m.spec_acceptance.clone(),
        );
        registry.register(
            "model_spec_fallbacks",
            "Decode steps of sequences that may speculate but checked no draft, by reason: \
             backoff (low acceptance), load (batch at or over the cut-off), no_room (max_tokens, \
             the context, the step's token budget or the KV pool), no_draft (the drafter had \
             nothing), error (the drafter failed)",
            m.spec_fallbacks.clone(),
        );
        registry.register(
            "model_spec_match_draft_tokens",
            "n-gram draft tokens a model's verify steps checked, by the length of the suffix \
             match that proposed the draft (1, 2, 3, 4+; traffic: from earlier requests' outputs)",
            m.spec_match_drafted.clone(),
        );
        registry.register(
            "model_spec_match_accepted_tokens",
            "n-gram draft tokens a model accepted, by the length of the suffix match that \
             proposed the draft (1, 2, 3, 4+; traffic: from earlier requests' outputs)",
            m.spec_match_accepted.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn request(&self, route: &str, status: u16, tenant: &str) {
        if tenant != "-"
            && let Ok(mut seen) = self.tenants_seen.lock()
            && !seen.contains(tenant)
        {
            seen.insert(tenant.to_string());
        }
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

    /// A model's speculation metrics from its engine totals.
    fn spec(&self, m: &memra_engine::engine::ModelStats) {
        let model = m.alias.clone();
        let drafter = if m.spec_drafter.is_empty() {
            "off".to_string()
        } else {
            m.spec_drafter.clone()
        };
        // One series per model: the drafter it reports now.
        if let Ok(mut shown) = self.drafter_shown.lock() {
            let now = DrafterLabels {
                model: model.clone(),
                drafter,
            };
            if let Some(old) = shown.insert(model.clone(), now.clone())
                && old != now
            {
                self.spec_drafter.remove(&old);
            }
            self.spec_drafter.get_or_create(&now).set(1);
        }
        if m.spec_drafter.is_empty() {
            return;
        }
        let Ok(_g) = self.totals.lock() else {
            return;
        };
        for (d, c) in &m.spec_by_drafter {
            let l = DrafterLabels {
                model: model.clone(),
                drafter: d.clone(),
            };
            catch_up(&self.spec_model_drafted.get_or_create(&l), c.drafted);
            catch_up(&self.spec_model_accepted.get_or_create(&l), c.accepted);
        }
        let l = ModelLabel {
            model: model.clone(),
        };
        catch_up(
            &self.spec_verify_steps.get_or_create(&l),
            m.spec_steps_total,
        );
        let ratio = m.spec_accepted_total as f64 / m.spec_drafted_total.max(1) as f64;
        self.spec_acceptance.get_or_create(&l).set(ratio);
        for (reason, n) in m.spec_fallbacks.labeled() {
            let l = FallbackLabels {
                model: model.clone(),
                reason: reason.into(),
            };
            catch_up(&self.spec_fallbacks.get_or_create(&l), n);
        }
        // Series per match length once the model has drafted by lookup (none for a model
        // whose drafts all come from its MTP layers or a draft model).
        if m.spec_by_match.iter().any(|c| c.drafted > 0) || m.spec_by_traffic.drafted > 0 {
            let traffic = std::iter::once((&"traffic", &m.spec_by_traffic));
            for (label, c) in memra_engine::spec::MATCH_LABELS
                .iter()
                .zip(&m.spec_by_match)
                .chain(traffic)
            {
                let l = MatchLabels {
                    model: model.clone(),
                    match_len: (*label).into(),
                };
                catch_up(&self.spec_match_drafted.get_or_create(&l), c.drafted);
                catch_up(&self.spec_match_accepted.get_or_create(&l), c.accepted);
            }
        }
    }

    /// The text exposition, with gauges set from `stats` and `load`.
    pub fn render(&self, stats: &EngineStats, load: &ServerLoad) -> String {
        let g = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.queue_depth.set(g(stats.queue_depth));
        self.running.set(g(stats.running));
        self.kv_used.set(g(stats.kv_blocks_used));
        self.kv_free.set(g(stats.kv_blocks_free));
        self.in_flight.set(g(load.in_flight));
        if let Ok(mut seen) = self.tenants_seen.lock() {
            seen.extend(stats.tenants.keys().cloned());
            seen.extend(load.tenants_in_flight.keys().cloned());
            for t in seen.iter() {
                let l = TenantLabel { tenant: t.clone() };
                let ts = stats.tenants.get(t).copied().unwrap_or_default();
                self.tenant_queued.get_or_create(&l).set(g(ts.queued));
                self.tenant_running.get_or_create(&l).set(g(ts.running));
                let n = load.tenants_in_flight.get(t).copied().unwrap_or(0);
                self.tenant_in_flight.get_or_create(&l).set(g(n));
            }
        }
        for m in &stats.models {
            let l = ModelLabel {
                model: m.alias.clone(),
            };
            self.kv_total.get_or_create(&l).set(g(m.kv_blocks_total));
            self.kv_cached.get_or_create(&l).set(g(m.kv_blocks_cached));
            if let Some(b) = (load.block_size)(&m.alias) {
                let tokens = m.kv_blocks_free.saturating_mul(b);
                self.kv_headroom_tokens.get_or_create(&l).set(g(tokens));
            }
            let ratio = if m.kv_blocks_total == 0 {
                0.0
            } else {
                m.kv_blocks_free as f64 / m.kv_blocks_total as f64
            };
            self.kv_headroom_ratio.get_or_create(&l).set(ratio);
            self.spec(m);
        }
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memra_engine::engine::ModelStats;
    use memra_engine::spec::{SpecCounts, SpecFallbacks};

    fn render(m: &Metrics, models: Vec<ModelStats>) -> String {
        let stats = EngineStats {
            models,
            ..EngineStats::default()
        };
        let tenants = HashMap::new();
        let bs = |_: &str| Some(16);
        m.render(
            &stats,
            &ServerLoad {
                in_flight: 0,
                tenants_in_flight: &tenants,
                block_size: &bs,
            },
        )
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` in\n{text}"))
    }

    fn speculating(drafted: u64, accepted: u64, load: u64) -> ModelStats {
        ModelStats {
            alias: "chat".into(),
            spec_drafted_total: drafted,
            spec_accepted_total: accepted,
            spec_steps_total: drafted / 2,
            spec_fallbacks: SpecFallbacks {
                backoff: 3,
                load,
                no_room: 1,
                no_draft: 7,
                error: 0,
            },
            spec_drafter: "mtp+ngram".into(),
            spec_by_match: [(4, 1), (3, 2), (0, 0), (3, 7)].map(|(d, a)| SpecCounts {
                drafted: d + drafted - 40,
                accepted: a,
                steps: 0,
            }),
            spec_by_traffic: SpecCounts {
                drafted: 5,
                accepted: 4,
                steps: 2,
            },
            spec_by_drafter: vec![
                (
                    "mtp".into(),
                    SpecCounts {
                        drafted: drafted - 10,
                        accepted: accepted - 10,
                        steps: 0,
                    },
                ),
                (
                    "ngram".into(),
                    SpecCounts {
                        drafted: 10,
                        accepted: 10,
                        steps: 0,
                    },
                ),
            ],
            ..ModelStats::default()
        }
    }

    #[test]
    fn speculation_is_reported_per_model_drafter_and_reason() {
        let m = Metrics::new();
        let plain = ModelStats {
            alias: "plain".into(),
            ..ModelStats::default()
        };
        let t = render(&m, vec![speculating(40, 30, 5), plain.clone()]);
        line(
            &t,
            r#"memra_model_spec_drafter{model="chat",drafter="mtp+ngram"} 1"#,
        );
        line(
            &t,
            r#"memra_model_spec_drafter{model="plain",drafter="off"} 1"#,
        );
        line(
            &t,
            r#"memra_model_spec_draft_tokens_total{model="chat",drafter="mtp"} 30"#,
        );
        line(
            &t,
            r#"memra_model_spec_accepted_tokens_total{model="chat",drafter="ngram"} 10"#,
        );
        line(
            &t,
            r#"memra_model_spec_verify_steps_total{model="chat"} 20"#,
        );
        line(
            &t,
            r#"memra_model_spec_acceptance_ratio{model="chat"} 0.75"#,
        );
        for (reason, n) in [("backoff", 3), ("load", 5), ("no_room", 1), ("no_draft", 7)] {
            line(
                &t,
                &format!(
                    r#"memra_model_spec_fallbacks_total{{model="chat",reason="{reason}"}} {n}"#
                ),
            );
        }
        line(
            &t,
            r#"memra_model_spec_fallbacks_total{model="chat",reason="error"} 0"#,
        );
        for (m, d, a) in [
            ("1", 4, 1),
            ("2", 3, 2),
            ("3", 0, 0),
            ("4+", 3, 7),
            ("traffic", 5, 4),
        ] {
            line(
                &t,
                &format!(
                    r#"memra_model_spec_match_draft_tokens_total{{model="chat",match_len="{m}"}} {d}"#
                ),
            );
            line(
                &t,
                &format!(
                    r#"memra_model_spec_match_accepted_tokens_total{{model="chat",match_len="{m}"}} {a}"#
                ),
            );
        }
        assert!(
            !t.contains(r#"memra_model_spec_verify_steps_total{model="plain"}"#),
            "a model that does not speculate has no speculation counters"
        );
        assert!(
            !t.contains(r#"memra_model_spec_match_draft_tokens_total{model="plain""#),
            "a model without n-gram drafts has no match-length counters"
        );
        // Counters follow the engine's totals across scrapes.
        let t = render(&m, vec![speculating(100, 60, 9), plain]);
        line(
            &t,
            r#"memra_model_spec_draft_tokens_total{model="chat",drafter="mtp"} 90"#,
        );
        line(
            &t,
            r#"memra_model_spec_fallbacks_total{model="chat",reason="load"} 9"#,
        );
        line(&t, r#"memra_model_spec_acceptance_ratio{model="chat"} 0.6"#);
        line(
            &t,
            r#"memra_model_spec_match_draft_tokens_total{model="chat",match_len="4+"} 63"#,
        );
        // A model's drafter series follows what it reports (one series per model).
        let t = render(
            &m,
            vec![ModelStats {
                alias: "plain".into(),
                spec_drafter: "ngram".into(),
                ..ModelStats::default()
            }],
        );
        line(
            &t,
            r#"memra_model_spec_drafter{model="plain",drafter="ngram"} 1"#,
        );
        assert!(!t.contains(r#"model="plain",drafter="off""#), "{t}");
    }
}

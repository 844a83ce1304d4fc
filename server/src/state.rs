//! Shared server state: the engine, auth, limits, metrics, the drain flag and the in-flight
//! counters (global and per tenant) behind RAII permits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::auth::{Auth, Tenant};
use crate::engine::Generate;
use crate::errors::ApiError;
use crate::metrics::Metrics;

/// Request limits.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens: usize,
    /// Requests in flight in the whole server (503 above).
    pub max_in_flight: usize,
    /// Default per-tenant in-flight limit (429 above).
    pub tenant_max_in_flight: usize,
    /// How long in-flight requests may take to finish on shutdown.
    pub drain_timeout: Duration,
    /// How long a client may take to send its request body (408 after).
    pub body_timeout: Duration,
    /// How long a stream waits for a client that does not read before cancelling.
    pub stream_write_timeout: Duration,
    /// Open connections (503 and close above).
    pub max_connections: usize,
    /// Tokenizations (template rendering included) running at once; more wait their turn.
    pub tokenize_workers: usize,
    /// How long a request waits for its tokenization before it fails (the work itself, bounded
    /// by the template's fuel, keeps its slot until it ends).
    pub tokenize_timeout: Duration,
    /// Whether inference responses carry `x-memra-cache-key` (a routing key for gateways).
    pub cache_key_header: bool,
    /// Images and video frames (`--media-*`).
    pub media: crate::media::MediaLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            max_tokens: 4096,
            max_in_flight: 256,
            tenant_max_in_flight: 64,
            drain_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            stream_write_timeout: Duration::from_secs(30),
            max_connections: 1024,
            tokenize_workers: default_tokenize_workers(),
            tokenize_timeout: Duration::from_secs(20),
            cache_key_header: false,
            media: crate::media::MediaLimits::default(),
        }
    }
}

impl Limits {
    /// The limits set by the flags.
    pub fn from_args(a: &crate::config::ServeArgs) -> Limits {
        Limits {
            max_body_bytes: a.max_body_bytes,
            max_tokens: a.max_tokens,
            max_in_flight: a.max_in_flight,
            tenant_max_in_flight: a.tenant_max_in_flight,
            drain_timeout: Duration::from_secs(a.drain_timeout_s),
            body_timeout: Duration::from_secs(a.body_timeout_s),
            stream_write_timeout: Duration::from_secs(a.stream_write_timeout_s),
            max_connections: a.max_connections.max(1),
            cache_key_header: a.cache_key_header,
            media: crate::media::MediaLimits {
                image: crate::media::ImageLimits {
                    max_bytes: a.media_max_bytes,
                    max_pixels: a.media_max_pixels,
                },
                max_images: a.media_max_images,
                max_frames: a.media_max_frames,
                video_fps: a.media_video_fps,
                allowed_hosts: a
                    .media_allowed_hosts
                    .as_deref()
                    .unwrap_or("")
                    .split(',')
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
                    .collect(),
            },
            ..Limits::default()
        }
    }
}

/// One tokenizer worker per core (at least 2).
fn default_tokenize_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2)
}

/// Seconds a client is told to wait after a 429 / 503 from the server's own limits.
pub const RETRY_AFTER_S: u64 = 1;

pub struct State {
    pub engine: Arc<dyn Generate>,
    pub auth: Auth,
    pub limits: Limits,
    pub metrics: Metrics,
    draining: AtomicBool,
    /// Flips to true when the drain starts (requests waiting for their first token watch it).
    drain_signal: tokio::sync::watch::Sender<bool>,
    in_flight: AtomicUsize,
    tenants: Mutex<HashMap<String, usize>>,
    /// Permits of the bounded tokenizer pool.
    pub tokenize_pool: Arc<tokio::sync::Semaphore>,
}

/// Holds one in-flight slot (global and tenant) until dropped.
pub struct Permit {
    state: Arc<State>,
    tenant: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut t) = self.state.tenants.lock()
            && let Some(n) = t.get_mut(&self.tenant)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                t.remove(&self.tenant);
            }
        }
    }
}

impl State {
    pub fn new(engine: Arc<dyn Generate>, auth: Auth, limits: Limits) -> State {
        State {
            engine,
            auth,
            metrics: Metrics::new(),
            draining: AtomicBool::new(false),
            drain_signal: tokio::sync::watch::Sender::new(false),
            in_flight: AtomicUsize::new(0),
            tenants: Mutex::new(HashMap::new()),
            tokenize_pool: Arc::new(tokio::sync::Semaphore::new(limits.tokenize_workers.max(1))),
            limits,
        }
    }

    /// `system_fingerprint`: the server version and the engine's device.
    pub fn fingerprint(&self) -> String {
        format!(
            "fp_memra_{}_{}",
            env!("CARGO_PKG_VERSION"),
            self.engine.device()
        )
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.drain_signal.send_replace(true);
    }

    /// Resolves once the drain has started (at once if it already has).
    pub async fn drain_started(&self) {
        let mut rx = self.drain_signal.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Requests in flight per tenant (tenants with none are absent).
    pub fn tenants_in_flight(&self) -> HashMap<String, usize> {
        self.tenants.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The in-flight limit of `tenant`: its keyring entry's, else `--tenant-max-in-flight`. The
    /// one source of this limit: the server checks it here and the engine gets it with each
    /// request (`ValidRequest::tenant_max_in_flight`).
    pub fn tenant_limit(&self, tenant: &Tenant) -> usize {
        tenant
            .max_in_flight
            .unwrap_or(self.limits.tenant_max_in_flight)
    }

    /// Takes an in-flight slot for `tenant`: 503 when draining or the server is full, 429 when
    /// the tenant is at its limit.
    pub fn admit(self: &Arc<Self>, tenant: &Tenant) -> Result<Permit, ApiError> {
        if self.is_draining() {
            return Err(ApiError::from(memra_engine::request::SubmitError::Draining));
        }
        let limit = self.tenant_limit(tenant);
        let mut t = self
            .tenants
            .lock()
            .map_err(|_| ApiError::engine("tenant table poisoned"))?;
        let n = t.entry(tenant.name.clone()).or_insert(0);
        if *n >= limit {
            let e = memra_engine::request::SubmitError::TenantLimit {
                tenant: tenant.name.clone(),
                retry_after_s: RETRY_AFTER_S,
            };
            return Err(ApiError::from(e));
        }
        let prev = self.in_flight.fetch_add(1, Ordering::SeqCst);
        if prev >= self.limits.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let e = memra_engine::request::SubmitError::Overloaded {
                retry_after_s: RETRY_AFTER_S,
            };
            return Err(ApiError::from(e));
        }
        *n += 1;
        Ok(Permit {
            state: self.clone(),
            tenant: tenant.name.clone(),
        })
    }
}

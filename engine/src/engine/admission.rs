//! Tenant-scoped admission control: the one ledger shared by the handle (which admits or refuses
//! at once, on the caller's thread) and the model threads (which report when a request starts
//! running and when it ends). Nothing admitted is dropped: every ticket is returned by
//! [`Admission::finished`] exactly once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::{EngineStats, TenantStats};
use crate::request::SubmitError;

/// Limits on requests in flight. How many of a tenant's requests run at once is the
/// scheduler's (`SchedulerConfig::max_running_per_tenant`); this ledger bounds how many it has
/// admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Requests of one tenant in flight (queued + running) when the request carries no limit of
    /// its own (`ValidRequest::tenant_max_in_flight`); over it: `TenantLimit` (429).
    pub max_in_flight_per_tenant: usize,
    /// Requests waiting across all tenants and models; over it: `Overloaded` (503).
    pub max_queued: usize,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            max_in_flight_per_tenant: 96,
            max_queued: 256,
        }
    }
}

/// An admitted request's slot in the ledger.
#[derive(Debug)]
pub(crate) struct Ticket {
    tenant: String,
    started: bool,
}

#[derive(Debug, Default)]
struct State {
    tenants: HashMap<String, TenantStats>,
    queued: usize,
    running: usize,
    draining: bool,
    finished: u64,
    refused: u64,
    /// Moving average of request durations (s), for retry-after estimates.
    avg_secs: f64,
}

#[derive(Debug)]
pub(crate) struct Admission {
    limits: AdmissionLimits,
    state: Mutex<State>,
}

impl Admission {
    pub(crate) fn new(limits: AdmissionLimits) -> Admission {
        Admission {
            limits,
            state: Mutex::new(State {
                avg_secs: 1.0,
                ..Default::default()
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut g = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }

    /// Admits a request of `tenant`, whose in-flight limit is `tenant_limit` (else the default),
    /// or says why not.
    pub(crate) fn admit(
        &self,
        tenant: &str,
        tenant_limit: Option<usize>,
    ) -> Result<Ticket, SubmitError> {
        let l = &self.limits;
        let tenant_limit = tenant_limit.unwrap_or(l.max_in_flight_per_tenant);
        self.with(|s| {
            if s.draining {
                s.refused += 1;
                return Err(SubmitError::Draining);
            }
            let t = s.tenants.get(tenant).copied().unwrap_or_default();
            // Seconds until a slot frees: the queue ahead drained by the running requests.
            let wait = |ahead: usize, slots: usize| -> u64 {
                let est = s.avg_secs * (1.0 + ahead as f64 / slots.max(1) as f64);
                (est.ceil() as u64).clamp(1, 600)
            };
            if t.queued + t.running >= tenant_limit {
                s.refused += 1;
                let retry_after_s = wait(t.queued, t.running);
                return Err(SubmitError::TenantLimit {
                    tenant: tenant.to_string(),
                    retry_after_s,
                });
            }
            if s.queued >= l.max_queued {
                s.refused += 1;
                let retry_after_s = wait(s.queued, s.running);
                return Err(SubmitError::Overloaded { retry_after_s });
            }
            s.queued += 1;
            s.tenants.entry(tenant.to_string()).or_default().queued += 1;
            Ok(Ticket {
                tenant: tenant.to_string(),
                started: false,
            })
        })
    }

    /// The request started running (first admitted by its model's scheduler).
    pub(crate) fn started(&self, t: &mut Ticket) {
        if t.started {
            return;
        }
        t.started = true;
        self.with(|s| {
            s.queued = s.queued.saturating_sub(1);
            s.running += 1;
            let e = s.tenants.entry(t.tenant.clone()).or_default();
            e.queued = e.queued.saturating_sub(1);
            e.running += 1;
        });
    }

    /// The request ended (finished, failed or cancelled) after `secs` seconds.
    pub(crate) fn finished(&self, t: &Ticket, secs: f64) {
        self.with(|s| {
            if t.started {
                s.running = s.running.saturating_sub(1);
            } else {
                s.queued = s.queued.saturating_sub(1);
            }
            if let Some(e) = s.tenants.get_mut(&t.tenant) {
                if t.started {
                    e.running = e.running.saturating_sub(1);
                } else {
                    e.queued = e.queued.saturating_sub(1);
                }
                if e.running == 0 && e.queued == 0 {
                    s.tenants.remove(&t.tenant);
                }
            }
            s.finished += 1;
            if secs > 0.0 {
                s.avg_secs = 0.9 * s.avg_secs + 0.1 * secs;
            }
        });
    }

    pub(crate) fn set_draining(&self) {
        self.with(|s| s.draining = true);
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.with(|s| s.draining)
    }

    /// The ledger's part of [`EngineStats`].
    pub(crate) fn snapshot(&self) -> EngineStats {
        self.with(|s| EngineStats {
            queue_depth: s.queued,
            requests_finished_total: s.finished,
            requests_refused_total: s.refused,
            tenants: s
                .tenants
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect::<BTreeMap<_, _>>(),
            draining: s.draining,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_and_global_limits() {
        let a = Admission::new(AdmissionLimits {
            max_in_flight_per_tenant: 2,
            max_queued: 3,
        });
        let mut t1 = a.admit("a", None).unwrap();
        let _t2 = a.admit("a", None).unwrap();
        assert!(matches!(
            a.admit("a", None),
            Err(SubmitError::TenantLimit { .. })
        ));
        a.started(&mut t1);
        assert!(matches!(
            a.admit("a", None),
            Err(SubmitError::TenantLimit { .. })
        ));
        let _b = a.admit("b", None).unwrap();
        let _c = a.admit("c", None).unwrap();
        // Queued: a's second, b, c = 3 = the global limit.
        assert!(matches!(
            a.admit("d", None),
            Err(SubmitError::Overloaded { .. })
        ));
        a.finished(&t1, 2.0);
        let s = a.snapshot();
        assert_eq!(s.queue_depth, 3);
        assert_eq!(s.tenants.get("a").copied().unwrap_or_default().running, 0);
        a.set_draining();
        assert_eq!(a.admit("e", None).unwrap_err(), SubmitError::Draining);
    }

    #[test]
    fn a_request_carries_its_tenants_limit() {
        let a = Admission::new(AdmissionLimits {
            max_in_flight_per_tenant: 2,
            max_queued: 1000,
        });
        // The tenant's own limit, above and below the default, is the one applied.
        let big: Vec<Ticket> = (0..200)
            .map(|_| a.admit("big", Some(200)).unwrap())
            .collect();
        assert!(matches!(
            a.admit("big", Some(200)),
            Err(SubmitError::TenantLimit { .. })
        ));
        assert_eq!(a.snapshot().tenants["big"].queued, 200);
        let _s = a.admit("small", Some(1)).unwrap();
        assert!(matches!(
            a.admit("small", Some(1)),
            Err(SubmitError::TenantLimit { .. })
        ));
        a.finished(&big[0], 0.0);
        assert!(a.admit("big", Some(200)).is_ok());
    }
}

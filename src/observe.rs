//! What the layer tells operators: `tracing` events, `metrics` (feature `metrics`), and the
//! `on_limited` hook.

use std::fmt;
use std::time::Duration;

use http::{Extensions, HeaderMap, Method, Request, Uri};
use sha2::{Digest as _, Sha256};

use crate::{Decision, Key};

/// A request that a policy limited, as the [`on_limited`](crate::ThrottleLayerBuilder::on_limited)
/// hook sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Limited<'a> {
    /// The policy that limited it.
    pub policy: &'a str,
    /// Its key.
    pub key: &'a Key,
    /// The decision (with the retry time; for a penalty-box ban, the rest of the ban).
    pub decision: &'a Decision,
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request's extensions (axum's `ConnectInfo`, your authenticated user...).
    pub extensions: &'a Extensions,
}

/// The parts of a request the layer's reports need, whatever its body type.
#[derive(Clone, Copy)]
pub(crate) struct RequestRef<'a> {
    pub(crate) method: &'a Method,
    pub(crate) uri: &'a Uri,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) extensions: &'a Extensions,
}

impl<'a> RequestRef<'a> {
    pub(crate) fn of<B>(request: &'a Request<B>) -> Self {
        RequestRef {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }
}

/// A key as logs show it: rendered, or with [`redact_keys`](crate::ThrottleLayerBuilder::redact_keys)
/// the first 12 hex digits of its SHA-256 (stable, so one client's lines still go together).
pub(crate) struct ShownKey<'a> {
    pub(crate) key: &'a Key,
    pub(crate) redact: bool,
}

impl fmt::Display for ShownKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.redact {
            return fmt::Display::fmt(self.key, f);
        }
        let digest = Sha256::digest(self.key.to_string().as_bytes());
        f.write_str("sha256:")?;
        for b in &digest[..6] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// The metrics of one policy. Names say what they count; the only label is the policy (never the key,
/// so the number of series stays bounded):
///
/// | metric | kind | counts |
/// |---|---|---|
/// | `throttle_requests_allowed_total` | counter | requests a policy admitted |
/// | `throttle_requests_limited_total` | counter | requests a policy limited (429), bans included |
/// | `throttle_requests_banned_total` | counter | of those, requests answered by a penalty-box ban |
/// | `throttle_backend_failures_total` | counter | decisions the backend failed (error or timeout) |
/// | `throttle_backend_latency_seconds` | histogram | time to a backend's decision |
/// | `throttle_requests_forbidden_total` | counter (no label) | requests on a deny list (403) |
#[cfg(feature = "metrics")]
pub(crate) struct PolicyMetrics {
    allowed: metrics::Counter,
    limited: metrics::Counter,
    banned: metrics::Counter,
    failed: metrics::Counter,
    latency: metrics::Histogram,
}

#[cfg(feature = "metrics")]
impl PolicyMetrics {
    fn new(policy: &str) -> Self {
        let label = [("policy", policy.to_owned())];
        PolicyMetrics {
            allowed: metrics::counter!("throttle_requests_allowed_total", &label),
            limited: metrics::counter!("throttle_requests_limited_total", &label),
            banned: metrics::counter!("throttle_requests_banned_total", &label),
            failed: metrics::counter!("throttle_backend_failures_total", &label),
            latency: metrics::histogram!("throttle_backend_latency_seconds", &label),
        }
    }
}

/// Per-policy reporting state: metric handles, made on first use (so that a recorder installed after
/// the layer was built, but before traffic, still gets them).
#[derive(Default)]
pub(crate) struct Reporter {
    #[cfg(feature = "metrics")]
    metrics: std::sync::OnceLock<PolicyMetrics>,
}

impl Reporter {
    #[cfg(feature = "metrics")]
    fn metrics(&self, policy: &str) -> &PolicyMetrics {
        self.metrics.get_or_init(|| PolicyMetrics::new(policy))
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn decision(&self, policy: &str, decision: &Decision, banned: bool) {
        #[cfg(feature = "metrics")]
        {
            let m = self.metrics(policy);
            if decision.allowed {
                m.allowed.increment(1);
            } else {
                m.limited.increment(1);
                if banned {
                    m.banned.increment(1);
                }
            }
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn failure(&self, policy: &str) {
        #[cfg(feature = "metrics")]
        self.metrics(policy).failed.increment(1);
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn latency(&self, policy: &str, took: Duration) {
        #[cfg(feature = "metrics")]
        self.metrics(policy).latency.record(took.as_secs_f64());
    }
}

/// Counts a request on a deny list.
pub(crate) fn forbidden() {
    #[cfg(feature = "metrics")]
    metrics::counter!("throttle_requests_forbidden_total").increment(1);
}

/// Whether backend latency is measured at all (reading the clock twice per request costs ~50 ns).
pub(crate) const MEASURE_LATENCY: bool = cfg!(feature = "metrics");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_keys_are_stable_pseudonyms() {
        let k = Key::from("alice@example.com");
        let shown = ShownKey {
            key: &k,
            redact: true,
        }
        .to_string();
        assert!(shown.starts_with("sha256:") && shown.len() == 19, "{shown}");
        assert!(!shown.contains("alice"));
        assert_eq!(
            shown,
            ShownKey {
                key: &k,
                redact: true
            }
            .to_string()
        );
        assert_eq!(
            ShownKey {
                key: &k,
                redact: false
            }
            .to_string(),
            "alice@example.com"
        );
    }
}

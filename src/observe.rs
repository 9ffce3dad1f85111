//! What the layer tells operators: every `tracing` event of a request's life, `metrics` (feature
//! `metrics`), and what the `on_limited` hook sees. The verdict decides; this module only reports.
//!
//! Abuse stays cheap and quiet here: nothing is labelled per key (bounded series), backend failures
//! are logged at warn at most once a second, and a missing key is warned about once per policy.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac as _};
use http::{Extensions, HeaderMap, Method, Request, Uri};
use sha2::{Digest as _, Sha256};

use crate::decision::Decision;
use crate::error::{BackendError, BuildError};
use crate::key::Key;

/// The operator's secret that turns keys into pseudonyms in logs: `hmac:` and the first 16 hex
/// digits of HMAC-SHA256(secret, key), stable for one secret (so one client's lines still go
/// together, across processes that share the secret) and useless without it.
///
/// A bare hash would not do: there are only 2^32 IPv4 addresses, and hashing them all to find the
/// one behind a logged digest takes seconds. Keep the secret out of the logs' reach (an environment
/// variable, a secret store), and at least [`MIN_LEN`](Self::MIN_LEN) bytes long
/// (`openssl rand -hex 32` makes a good one).
///
/// ```
/// use tower_throttle::{key::PeerIp, ops::RedactionSecret, Policy, Quota, ThrottleLayer};
///
/// let secret = RedactionSecret::new("3f9a0c1e5b7d2468ace13579bdf02468").unwrap();
/// let layer = ThrottleLayer::builder()
///     .policy(Policy::builder("api").key(PeerIp::new()).quota(Quota::per_second(5)).build().unwrap())
///     .redact_keys_with(secret)
///     .build()
///     .unwrap();
/// # let _ = layer;
/// assert!(RedactionSecret::new("hunter2").is_err()); // too short to resist guessing
/// ```
#[derive(Clone)]
pub struct RedactionSecret(Arc<[u8]>);

impl RedactionSecret {
    /// The shortest secret accepted, in bytes.
    pub const MIN_LEN: usize = 16;

    /// A secret of at least [`MIN_LEN`](Self::MIN_LEN) bytes.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, BuildError> {
        let secret = secret.as_ref();
        if secret.len() < Self::MIN_LEN {
            return Err(BuildError::Invalid(format!(
                "the key redaction secret has {} bytes; it needs at least {} (for example \
                 `openssl rand -hex 32`)",
                secret.len(),
                Self::MIN_LEN
            )));
        }
        Ok(RedactionSecret(secret.into()))
    }

    /// The secret in the environment variable `name`; an error naming the variable if it is unset,
    /// not UTF-8 or too short.
    pub fn from_env(name: &str) -> Result<Self, BuildError> {
        let value = std::env::var(name).map_err(|e| {
            BuildError::Invalid(format!(
                "key redaction secret: environment variable {name}: {e}"
            ))
        })?;
        Self::new(value.trim()).map_err(|e| BuildError::Invalid(format!("{name}: {e}")))
    }

    /// A secret made up for one layer (for `redact_keys(true)` without one): pseudonyms are
    /// stable within the layer only.
    pub(crate) fn random() -> Self {
        use std::hash::{BuildHasher as _, Hasher as _};
        // std's RandomState is seeded from the operating system's random source once per thread
        // (and varied per instance): four of them give 256 bits nobody outside can guess.
        let mut seed = Sha256::new();
        for i in 0..4u64 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(i);
            seed.update(h.finish().to_le_bytes());
        }
        seed.update(format!("{:?}{}", Instant::now(), std::process::id()).as_bytes());
        RedactionSecret(seed.finalize().to_vec().into())
    }

    pub(crate) fn hmac(&self) -> Redactor {
        Redactor(Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length"))
    }
}

impl fmt::Debug for RedactionSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RedactionSecret(..)")
    }
}

/// The HMAC of a layer's redaction secret, keyed once.
#[derive(Clone)]
pub(crate) struct Redactor(Hmac<Sha256>);

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

    /// The same view of a request taken apart (the extended path holds its parts, not the request).
    pub(crate) fn of_parts(parts: &'a http::request::Parts) -> Self {
        RequestRef {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }
}

/// A key as logs show it: rendered, or its [`RedactionSecret`] pseudonym under
/// [`redact_keys`](crate::ThrottleLayerBuilder::redact_keys). Computed only when written.
#[derive(Clone, Copy)]
pub(crate) struct ShownKey<'a> {
    pub(crate) key: &'a Key,
    pub(crate) redact: Option<&'a Redactor>,
}

impl fmt::Display for ShownKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(redactor) = self.redact else {
            return fmt::Display::fmt(self.key, f);
        };
        let mut mac = redactor.0.clone();
        mac.update(self.key.to_string().as_bytes());
        let tag = mac.finalize().into_bytes();
        f.write_str("hmac:")?;
        for b in &tag[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// The metrics of one policy. The only label is the policy, never the key, so that the number of
/// series stays bounded; `src/guide/observability.md` lists every metric the crate exports.
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

/// Per-policy reporting state. Metric handles are made on first use, so that a recorder installed
/// after the layer was built, but before traffic, still gets them.
#[derive(Default)]
pub(crate) struct Reporter {
    #[cfg(feature = "metrics")]
    metrics: OnceLock<PolicyMetrics>,
    warned_missing_key: AtomicBool,
    limited_log: OncePerSecond,
}

impl Reporter {
    #[cfg(feature = "metrics")]
    fn metrics(&self, policy: &str) -> &PolicyMetrics {
        self.metrics.get_or_init(|| PolicyMetrics::new(policy))
    }

    #[inline]
    pub(crate) fn decision(
        &self,
        policy: &str,
        key: ShownKey<'_>,
        decision: &Decision,
        delay: Duration,
    ) {
        #[cfg(feature = "metrics")]
        {
            let m = self.metrics(policy);
            if decision.allowed {
                m.allowed.increment(1);
            } else {
                m.limited.increment(1);
                if decision.banned {
                    m.banned.increment(1);
                }
            }
        }
        // Checked here, the event itself out of line: most servers do not log at debug level.
        if tracing::level_enabled!(tracing::Level::DEBUG) {
            log_decision(policy, key, decision, delay);
        }
    }

    /// Logged at info at most once a second per policy (with how many were left out), the others at
    /// debug: a flood from one client would otherwise write a line per request.
    pub(crate) fn limited(
        &self,
        policy: &str,
        key: ShownKey<'_>,
        decision: &Decision,
        dry_run: bool,
    ) {
        let retry_after_secs = decision.retry_after.map(|_| decision.retry_after_secs());
        let banned = decision.banned;
        let message = if dry_run {
            "request would be limited (dry run)"
        } else {
            "request limited"
        };
        sampled!(
            self.limited_log,
            info,
            (policy = %policy, key = %key, retry_after_secs, banned,),
            "{message}"
        );
    }

    pub(crate) fn missing_key(&self, policy: &str, what: &str) {
        if !self.warned_missing_key.swap(true, Ordering::Relaxed) {
            tracing::warn!(policy = %policy, source = %what, "request without a rate-limit key (further ones are logged at debug level)");
        } else {
            tracing::debug!(policy = %policy, source = %what, "request without a rate-limit key");
        }
    }

    /// The backend failed to decide (counted; the log line is the layer's [`ErrorLog`]'s).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn failure(&self, policy: &str) {
        #[cfg(feature = "metrics")]
        self.metrics(policy).failed.increment(1);
    }

    /// Only on the failure path, so the counter is looked up each time.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn fallback(&self, policy: &str, on_error: &'static str, admitted: bool) {
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "throttle_fallback_decisions_total",
            "policy" => policy.to_owned(),
            "on_error" => on_error,
            "outcome" => if admitted { "admitted" } else { "refused" },
        )
        .increment(1);
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn latency(&self, policy: &str, took: Duration) {
        #[cfg(feature = "metrics")]
        self.metrics(policy).latency.record(took.as_secs_f64());
    }
}

/// One policy's counters of one metric, per limit, made once each: a request counted on one
/// allocates nothing (a label's `String`s and the registry's lookup, each time, otherwise).
#[cfg(feature = "metrics")]
#[derive(Default)]
pub(crate) struct LimitCounters(Mutex<Vec<(Box<str>, metrics::Counter)>>);

#[cfg(feature = "metrics")]
impl LimitCounters {
    /// Adds one to the counter `name` of `policy`'s `limit`, made the first time.
    pub(crate) fn increment(&self, name: &'static str, policy: &str, limit: &str) {
        let mut counters = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, counter)) = counters.iter().find(|(known, _)| &**known == limit) {
            return counter.increment(1);
        }
        let labels = [("policy", policy.to_owned()), ("limit", limit.to_owned())];
        let counter = metrics::counter!(name, &labels);
        counter.increment(1);
        counters.push((limit.into(), counter));
    }
}

/// A line logged at `$level` (info, warn) through `$gate` (a [`OncePerSecond`]) with `suppressed`,
/// how many it held back since the last; at debug while it is shut. `$fields` end with a comma.
macro_rules! sampled {
    ($gate:expr, $level:ident, ($($fields:tt)*), $($message:tt)+) => {
        match $gate.open() {
            Some(suppressed) => tracing::$level!($($fields)* suppressed, $($message)+),
            None => tracing::debug!($($fields)* $($message)+),
        }
    };
}
pub(crate) use sampled;

/// A gate that opens at most once a second and counts what it held back, so that a flood writes one
/// line a second at its level and the rest at debug.
#[derive(Default)]
pub(crate) struct OncePerSecond {
    /// Seconds since `start` of the last opening, plus one (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
    start: OnceLock<Instant>,
}

impl OncePerSecond {
    pub(crate) fn open(&self) -> Option<u64> {
        let start = *self.start.get_or_init(Instant::now);
        let now = start.elapsed().as_secs() + 1;
        let last = self.last.load(Ordering::Relaxed);
        if now > last
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Backend errors are logged at warn at most once a second, the rest at debug: a Redis outage under
/// load would otherwise write one line per request. Entering and leaving the failure policy are one
/// line each, also at most once a second, so that a link that flaps does not flood; it is left
/// once the backend has decided with no failure for a second ([`QUIET`]), so that a backend that
/// fails some requests (a Cluster node down, the others up) is one outage, not one a second.
#[derive(Default)]
pub(crate) struct ErrorLog {
    gate: OncePerSecond,
    back_gate: OncePerSecond,
    failing: AtomicBool,
    /// Requests the failure policy answered since it took over.
    answered: AtomicU64,
    since: Mutex<Option<Instant>>,
    /// The last failure: ms since `start`.
    failed_ms: AtomicU64,
    start: OnceLock<Instant>,
}

/// How long the backend decides with no failure before the failure policy is said to be done.
const QUIET: Duration = Duration::from_secs(1);

impl ErrorLog {
    fn now_ms(&self) -> u64 {
        let start = self.start.get_or_init(Instant::now);
        u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn record(&self, policy: &str, error: &BackendError, on_error: &'static str) {
        self.failed_ms.store(self.now_ms(), Ordering::Relaxed);
        self.answered.fetch_add(1, Ordering::Relaxed);
        // Release: a thread that reads `failing` set reads this failure's time too.
        if !self.failing.swap(true, Ordering::Release) {
            *self.since.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
            if self.gate.open().is_none() {
                tracing::debug!(policy, %error, on_error, "rate-limit backend failed again");
                return;
            }
            tracing::warn!(
                policy,
                %error,
                on_error,
                "rate-limit backend failed: the failure policy answers until it decides again"
            );
            return;
        }
        self.aside(policy, error, on_error);
    }

    /// A failure the failure policy does not answer (a shadow limit's, a stream message's): logged
    /// as other failures are, without the failure policy taking over, nor counting it answered.
    pub(crate) fn aside(&self, policy: &str, error: &BackendError, on_error: &'static str) {
        if let Some(suppressed) = self.gate.open() {
            tracing::warn!(
                policy,
                %error,
                on_error,
                suppressed,
                "rate-limit backend failed (further failures this second are logged at debug level)"
            );
        } else {
            tracing::debug!(policy, %error, on_error, "rate-limit backend failed");
        }
    }

    /// Logs, once, that the failure policy no longer answers; one load when it was not answering.
    #[inline]
    pub(crate) fn decided(&self) {
        if self.failing.load(Ordering::Acquire) {
            self.back();
        }
    }

    /// The way back, for the layer: its count is every policy's requests, so no policy is named.
    #[cold]
    fn back(&self) {
        let quiet = self
            .now_ms()
            .saturating_sub(self.failed_ms.load(Ordering::Relaxed));
        if quiet < QUIET.as_millis() as u64 || !self.failing.swap(false, Ordering::Relaxed) {
            return;
        }
        let since = self
            .since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // Up to the last failure, not to this decision (which may come long after).
        let quiet = Duration::from_millis(quiet);
        let after = since
            .map(|s| s.elapsed().saturating_sub(quiet))
            .unwrap_or_default();
        let answered = self.answered.swap(0, Ordering::Relaxed);
        if self.back_gate.open().is_none() {
            tracing::debug!(answered, "rate-limit backend decides again");
            return;
        }
        tracing::warn!(
            after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
            answered,
            "rate-limit backend decides again; the failure policy answered {answered} requests \
             (of every policy) over {after:?}"
        );
    }
}

/// A delayed request on a runtime without timers: the server's misconfiguration, logged each time.
pub(crate) fn no_timers(policy: &str) {
    tracing::error!(policy = %policy, "delay mode needs a tokio runtime with timers enabled (`enable_time`); answering 503");
}

pub(crate) fn forbidden() {
    #[cfg(feature = "metrics")]
    metrics::counter!("throttle_requests_forbidden_total").increment(1);
}

/// Logged at debug level, so that a flood stays quiet; the gate counts what it sheds.
pub(crate) fn shed(partition: &str) {
    tracing::debug!(reason = "overload", partition, "request shed");
}

/// Whether backend latency is measured at all (reading the clock twice per request costs ~50 ns).
pub(crate) const MEASURE_LATENCY: bool = cfg!(feature = "metrics");

// ---- Redis connection state (issue 13) ----

/// The Redis backend called `backend` went up (`Some(path)`: `"cell"`, `"lua"` or `"unknown"`) or
/// down (`None`): the gauge `throttle_backend_up{backend, path}` is 1 for the path in use, 0 for
/// the others.
#[cfg(feature = "redis")]
pub(crate) fn backend_up(backend: &str, path: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    for name in ["cell", "lua", "unknown"] {
        let up = if path == Some(name) { 1.0 } else { 0.0 };
        let backend = backend.to_owned();
        metrics::gauge!("throttle_backend_up", "backend" => backend, "path" => name).set(up);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, path);
}

/// A Redis Cluster primary's breaker closed (`up`) or opened: the gauge
/// `throttle_cluster_node_up{backend, node}` (`node`: the primary's `host:port`) is 1 while its
/// slots' decisions go to it, 0 while they fail fast; 1 again once it leaves the slot map (its
/// replica promoted: none of its slots fail).
#[cfg(feature = "redis")]
pub(crate) fn cluster_node_up(backend: &str, node: &str, up: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("throttle_cluster_node_up", "backend" => backend.to_owned(), "node" => node.to_owned())
        .set(if up { 1.0 } else { 0.0 });
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, node, up);
}

/// Redis evicted `keys` keys since the backend last looked (`INFO stats`): any keys, the
/// limiter's among them.
#[cfg(feature = "redis")]
pub(crate) fn redis_evictions(keys: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("throttle_redis_evicted_keys_total").increment(keys);
    #[cfg(not(feature = "metrics"))]
    let _ = keys;
}

#[inline(never)]
fn log_decision(policy: &str, key: ShownKey<'_>, decision: &Decision, delay: Duration) {
    tracing::debug!(
        policy = %policy,
        key = %key,
        allowed = decision.allowed,
        remaining = decision.remaining,
        delay_ms = delay.as_millis() as u64,
        "rate-limit decision"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_keys_are_stable_pseudonyms_under_one_secret_only() {
        let k = Key::from("alice@example.com");
        let one = RedactionSecret::new("0123456789abcdef0123").unwrap().hmac();
        let other = RedactionSecret::new("fedcba98765432100123").unwrap().hmac();
        let shown = |redact| ShownKey { key: &k, redact }.to_string();
        let pseudonym = shown(Some(&one));
        assert!(
            pseudonym.starts_with("hmac:") && pseudonym.len() == 21,
            "{pseudonym}"
        );
        assert!(!pseudonym.contains("alice"));
        assert_eq!(pseudonym, shown(Some(&one)));
        assert_ne!(pseudonym, shown(Some(&other)));
        assert_eq!(shown(None), "alice@example.com");
        // The HMAC of the rendered key under the secret (RFC 2104), not a bare hash of it.
        let bare = Sha256::digest(b"alice@example.com");
        assert!(!pseudonym.contains(&format!("{:02x}{:02x}", bare[0], bare[1])));
        let random = RedactionSecret::random();
        assert_ne!(random.0, RedactionSecret::random().0);
        assert!(RedactionSecret::new([0u8; 15]).is_err());
        assert_eq!(
            format!("{:?}", RedactionSecret::new([7u8; 16]).unwrap()),
            "RedactionSecret(..)"
        );
    }
}

/// A resolver or an async key extractor (`per_customer.rs`) that failed or took too long, logged at
/// warn at most once a second per policy, the rest at debug.
#[derive(Default)]
pub(crate) struct ResolveLog(OncePerSecond);

impl ResolveLog {
    pub(crate) fn record(&self, policy: &str, what: &str, why: &str, fallback: &'static str) {
        sampled!(
            self.0,
            warn,
            (policy, what, why, fallback,),
            "rate-limit {what} failed"
        );
    }
}

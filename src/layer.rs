//! [`ThrottleLayer`] and its builder.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use tower_layer::Layer;

use crate::access::{AccessList, AddressSource};
use crate::headers::{self, HeaderOptions, RateHeaders, Rejected};
use crate::key::ClientIp;
use crate::observe::{Limited, Reporter, RequestRef, ShownKey};
use crate::offenders::Offenders;
use crate::penalty::PenaltyBox;
use crate::{Backend, BackendError, BuildError, Decision, Key, Policy, Throttle, ThrottleDecision};

#[cfg(feature = "memory")]
use crate::MemoryBackend;

type RejectionFn = dyn Fn(&Rejected<'_>) -> Response<Bytes> + Send + Sync;
type LimitedHook = dyn Fn(&Limited<'_>) + Send + Sync;

/// What to do when the backend cannot decide (an error or, for remote backends, a timeout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnBackendError {
    /// Let the request through (fail open). The default: a limiter outage should not be an API outage.
    #[default]
    Allow,
    /// Reject with `503 Service Unavailable` and `Retry-After: 1` (fail closed).
    Deny,
    /// Decide in this process instead: an in-memory limiter with each policy's own quota takes over
    /// until the backend answers again. Each process then enforces the quota on its own, so the fleet
    /// admits up to `processes × quota` while the backend is down, which is usually the right trade
    /// between an outage and no limit at all.
    #[cfg(feature = "memory")]
    Local,
}

impl OnBackendError {
    /// `"allow"`, `"deny"` or `"local"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnBackendError::Allow => "allow",
            OnBackendError::Deny => "deny",
            #[cfg(feature = "memory")]
            OnBackendError::Local => "local",
        }
    }
}

/// A tower [`Layer`] that rate-limits requests with one or more [`Policy`]s.
///
/// The layer is configuration only: it is cheap to clone, and every service it makes (and every clone
/// of those) shares the same backend, so a server with many connections has one limiter.
///
/// For each request the first policy whose route and methods match decides; a request that no policy
/// matches passes untouched. Admitted responses get `RateLimit-Policy` / `RateLimit` fields; rejected
/// requests get `429 Too Many Requests` with `Retry-After` (see [`headers`](crate::headers)). The inner
/// service is called only once the backend has admitted the request, and it is always the service that
/// `poll_ready` readied.
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_throttle::{key::Header, Policy, Quota, ThrottleLayer};
///
/// let policy = Policy::builder("api")
///     .quota(Quota::per_second(5))
///     .key(Header::new("x-api-key"))
///     .build()
///     .unwrap();
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(ThrottleLayer::new(policy));
/// ```
#[must_use]
pub struct ThrottleLayer<K, B> {
    shared: Arc<Shared<K, B>>,
}

pub(crate) struct Shared<K, B> {
    pub(crate) backend: B,
    pub(crate) policies: Box<[Policy<K>]>,
    pub(crate) responder: Arc<Responder>,
    pub(crate) access: Option<(AccessList, AddressSource)>,
}

/// The part of the configuration that a pending decision needs after `call` has returned.
pub(crate) struct Responder {
    headers: HeaderOptions,
    /// Per policy, in the order of `Shared::policies`.
    policies: Box<[PolicyInfo]>,
    rejection: Option<Arc<RejectionFn>>,
    on_error: OnBackendError,
    redact_keys: bool,
    on_limited: Option<Arc<LimitedHook>>,
    offenders: Option<Offenders>,
    /// Refusals (400, 403, 503) as gRPC trailers-only responses ([`ThrottleLayerBuilder::grpc`]).
    grpc: bool,
    /// The limiter of `OnBackendError::Local`.
    #[cfg(feature = "memory")]
    local: Option<MemoryBackend>,
    errors: ErrorLog,
}

/// Backend errors are logged at warn at most once a second, with the number left out; the others at
/// debug. A Redis outage under load would otherwise write one line per request.
#[derive(Default)]
struct ErrorLog {
    /// Seconds since `start` of the last warn-level line, plus one (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
    start: OnceLock<Instant>,
}

impl ErrorLog {
    fn record(&self, policy: &str, error: &BackendError, on_error: OnBackendError) {
        let start = *self.start.get_or_init(Instant::now);
        let now = start.elapsed().as_secs() + 1;
        let last = self.last.load(Ordering::Relaxed);
        if now > last
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            tracing::warn!(
                policy,
                %error,
                on_error = on_error.as_str(),
                suppressed,
                "rate-limit backend failed (further failures this second are logged at debug level)"
            );
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(policy, %error, on_error = on_error.as_str(), "rate-limit backend failed");
        }
    }
}

struct PolicyInfo {
    name: Arc<str>,
    reporter: Reporter,
    penalty: Option<PenaltyBox>,
    #[cfg(feature = "memory")]
    cost: u64,
    dry_run: bool,
    /// Every admitted request gets a `ThrottleDecision` (dry runs, delay mode, or the layer says so).
    expose_decision: bool,
    tiers: Box<[TierInfo]>,
    limited_body: Bytes,
    warned_missing_key: AtomicBool,
}

/// What the responder needs of one tier's limits.
struct TierInfo {
    name: Option<Arc<str>>,
    limits: Box<[crate::Limit]>,
    names: Box<[Arc<str>]>,
    policy_field: HeaderValue,
    /// `limits[0].max_cost()`, for the decision of a ban.
    limit_value: u64,
    concurrency: bool,
}

/// Whether a tokio timer can be made here: a runtime with its time driver. Delay mode sleeps on one,
/// and without it `tokio::time::sleep` panics, so this tries (only for delayed requests; a timer that
/// is never polled costs next to nothing).
fn timers_available() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
        && std::panic::catch_unwind(|| drop(tokio::time::sleep(std::time::Duration::ZERO))).is_ok()
}

/// The decision of a backend: one limit, or a stack.
pub(crate) enum Decided {
    One(Decision),
    All(Vec<Decision>),
}

/// Where an admitted request's concurrency slot is given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotOwner {
    Backend {
        lease: u64,
    },
    #[cfg(feature = "memory")]
    Local,
}

/// How a request is let through.
pub(crate) struct Admitted {
    pub(crate) headers: Option<RateHeaders>,
    /// Delay mode: how long to wait before calling the service.
    pub(crate) delay: std::time::Duration,
    /// Boxed: it is rarely asked for, and a smaller verdict moves faster on every request.
    pub(crate) decision: Option<Box<ThrottleDecision>>,
    /// A concurrency slot to give back when the response ends.
    pub(crate) slot: Option<SlotOwner>,
}

impl Admitted {
    fn unlimited() -> Self {
        Admitted {
            headers: None,
            delay: std::time::Duration::ZERO,
            decision: None,
            slot: None,
        }
    }
}

pub(crate) enum Verdict {
    Admit(Admitted),
    Reject(Response<Bytes>),
}

impl Responder {
    pub(crate) fn verdict(
        &self,
        index: usize,
        tier: usize,
        result: Result<Decided, BackendError>,
        key: &Key,
        request: RequestRef<'_>,
    ) -> Verdict {
        let info = &self.policies[index];
        let decided = match result {
            Ok(decided) => decided,
            Err(error) => {
                info.reporter.failure(&info.name);
                self.errors.record(&info.name, &error, self.on_error);
                return match self.on_error {
                    OnBackendError::Allow => Verdict::Admit(Admitted::unlimited()),
                    // A dry run never rejects, not even when the backend fails.
                    _ if info.dry_run => Verdict::Admit(Admitted::unlimited()),
                    OnBackendError::Deny => {
                        let mut response = self.problem(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the rate limiter is unavailable; retry shortly",
                        );
                        headers::set_retry_after(response.headers_mut(), 1);
                        if self.grpc {
                            let second = std::time::Duration::from_secs(1);
                            crate::grpc::set_pushback(response.headers_mut(), second);
                        }
                        Verdict::Reject(response)
                    }
                    #[cfg(feature = "memory")]
                    OnBackendError::Local => self.decide_locally(info, tier, key, request),
                };
            }
        };
        let owner = |d: &Decision| SlotOwner::Backend {
            lease: d.lease.unwrap_or(0),
        };
        match decided {
            Decided::One(decision) => {
                let slot = owner(&decision);
                self.decided(info, tier, &mut [decision], key, true, request, slot)
            }
            Decided::All(mut decisions) if decisions.len() == info.tiers[tier].limits.len() => {
                let slot = owner(&decisions[0]);
                self.decided(info, tier, &mut decisions, key, true, request, slot)
            }
            Decided::All(decisions) => {
                let error = BackendError::new(format!(
                    "the backend returned {} decisions for {} stacked limits",
                    decisions.len(),
                    info.tiers[tier].limits.len()
                ));
                self.verdict(index, tier, Err(error), key, request)
            }
        }
    }

    /// `OnBackendError::Local`: the in-memory limiter decides with the same quotas.
    #[cfg(feature = "memory")]
    fn decide_locally(
        &self,
        info: &PolicyInfo,
        tier: usize,
        key: &Key,
        request: RequestRef<'_>,
    ) -> Verdict {
        let Some(local) = &self.local else {
            return Verdict::Admit(Admitted::unlimited());
        };
        let limits = &info.tiers[tier].limits;
        let decided = if limits.len() == 1 {
            local.decide(&limits[0], key, info.cost).map(|d| vec![d])
        } else {
            local.decide_all(limits, key, info.cost)
        };
        match decided {
            Ok(mut decisions) => self.decided(
                info,
                tier,
                &mut decisions,
                key,
                true,
                request,
                SlotOwner::Local,
            ),
            Err(_) => Verdict::Admit(Admitted::unlimited()),
        }
    }

    /// Gives back a concurrency slot taken by the local limiter.
    #[cfg(feature = "memory")]
    pub(crate) fn release_local(&self, index: usize, tier: usize, key: &Key) {
        let info = &self.policies[index];
        if let Some(local) = &self.local {
            Backend::release(local, &info.tiers[tier].limits[0], key, info.cost, 0);
        }
    }

    pub(crate) fn banned(
        &self,
        index: usize,
        tier: usize,
        key: &Key,
        request: RequestRef<'_>,
    ) -> Option<Response<Bytes>> {
        let info = &self.policies[index];
        if info.dry_run {
            return None;
        }
        let rest = info.penalty.as_ref()?.banned(key)?;
        let decision = Decision::banned(info.tiers[tier].limit_value, rest, None, rest);
        let mut decisions = vec![decision; info.tiers[tier].limits.len()];
        let no_slot = SlotOwner::Backend { lease: 0 };
        match self.decided(info, tier, &mut decisions, key, false, request, no_slot) {
            Verdict::Reject(response) => Some(response),
            Verdict::Admit(_) => None,
        }
    }

    pub(crate) fn latency(&self, index: usize, took: std::time::Duration) {
        let info = &self.policies[index];
        info.reporter.latency(&info.name, took);
    }

    #[allow(clippy::too_many_arguments)]
    fn decided(
        &self,
        info: &PolicyInfo,
        tier: usize,
        decisions: &mut [Decision],
        key: &Key,
        strike: bool,
        request: RequestRef<'_>,
        slot: SlotOwner,
    ) -> Verdict {
        let tier_info = &info.tiers[tier];
        // Delay mode: an admitted request waits for the part of its TAT beyond the quota's own
        // tolerance, and what remains is counted against that tolerance, not the delay's.
        let mut delay = std::time::Duration::ZERO;
        for (decision, limit) in decisions.iter_mut().zip(tier_info.limits.iter()) {
            if limit.delay().is_some() {
                delay = delay.max(limit.delay_for(decision));
                if let (Some(tolerance), Some(gcra)) = (limit.tolerance(), limit.gcra()) {
                    let ahead = u64::try_from(decision.reset_after.as_nanos()).unwrap_or(u64::MAX);
                    decision.remaining = (tolerance.saturating_sub(ahead)
                        / gcra.emission_interval())
                    .min(decision.limit);
                }
            }
        }
        let mut decision = match &*decisions {
            [one] => *one,
            all => Decision::combine(all).expect("a tier has at least one limit"),
        };
        if !decision.allowed {
            delay = std::time::Duration::ZERO;
        }
        // The rejection that earns a ban answers with it.
        if let Some(penalty) = &info.penalty {
            if strike && !decision.allowed && !info.dry_run {
                if let Some(ban) = penalty.strike(key) {
                    decision = Decision::banned(
                        decision.limit,
                        ban,
                        decision.retry_after,
                        decision.reset_after,
                    );
                }
            }
        }
        if !delay.is_zero() && !info.dry_run && !timers_available() {
            // No timer to wait on: a misconfigured server, not the client's fault. Admitting at once
            // would let the queue through early.
            tracing::error!(policy = %info.name, "delay mode needs a tokio runtime with timers enabled (`enable_time`); answering 503");
            let mut response = self.problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the rate limiter cannot delay this request",
            );
            headers::set_retry_after(response.headers_mut(), 1);
            return Verdict::Reject(response);
        }
        if !delay.is_zero() && !info.dry_run {
            // The fields go out after the wait: by then the key is that much closer to full.
            for d in decisions.iter_mut() {
                d.reset_after = d.reset_after.saturating_sub(delay);
            }
            decision.reset_after = decision.reset_after.saturating_sub(delay);
        }
        let banned = decision.banned;
        info.reporter.decision(&info.name, &decision, banned);
        let shown = ShownKey {
            key,
            redact: self.redact_keys,
        };
        tracing::debug!(
            policy = %info.name,
            key = %shown,
            allowed = decision.allowed,
            remaining = decision.remaining,
            delay_ms = delay.as_millis() as u64,
            "rate-limit decision"
        );
        let fields = RateHeaders::new(
            self.headers,
            &tier_info.names,
            &tier_info.policy_field,
            decisions,
            &decision,
        );
        if decision.allowed || info.dry_run {
            if !decision.allowed {
                tracing::info!(
                    policy = %info.name,
                    key = %shown,
                    retry_after_secs = decision.retry_after.map(|_| decision.retry_after_secs()),
                    "request would be limited (dry run)"
                );
            }
            let slot = (decision.allowed && tier_info.concurrency).then_some(slot);
            let exposed = info.expose_decision.then(|| ThrottleDecision {
                policy: info.name.clone(),
                tier: tier_info.name.clone(),
                decision,
                enforced: !info.dry_run,
                delayed: delay,
            });
            return Verdict::Admit(Admitted {
                headers: Some(fields),
                // A dry run reports the wait (above) but does not wait.
                delay: if info.dry_run {
                    std::time::Duration::ZERO
                } else {
                    delay
                },
                decision: exposed.map(Box::new),
                slot,
            });
        }
        tracing::info!(
            policy = %info.name,
            key = %shown,
            retry_after_secs = decision.retry_after.map(|_| decision.retry_after_secs()),
            banned,
            "request limited"
        );
        if let Some(offenders) = &self.offenders {
            offenders.record(&info.name, key);
        }
        if let Some(hook) = &self.on_limited {
            hook(&Limited {
                policy: &info.name,
                key,
                decision: &decision,
                method: request.method,
                uri: request.uri,
                headers: request.headers,
                extensions: request.extensions,
            });
        }
        let mut response = match &self.rejection {
            Some(custom) => custom(&Rejected {
                policy: &info.name,
                decision: &decision,
            }),
            None => {
                headers::problem_response(StatusCode::TOO_MANY_REQUESTS, info.limited_body.clone())
            }
        };
        headers::set_retry_after(response.headers_mut(), decision.retry_after_secs());
        fields.apply(response.headers_mut());
        Verdict::Reject(response)
    }

    fn problem(&self, status: StatusCode, detail: &str) -> Response<Bytes> {
        if self.grpc {
            crate::grpc::refusal(status, detail)
        } else {
            headers::problem(status, detail)
        }
    }

    pub(crate) fn forbidden(&self) -> Response<Bytes> {
        crate::observe::forbidden();
        self.problem(
            StatusCode::FORBIDDEN,
            "this client or key is on a deny list",
        )
    }

    pub(crate) fn missing_key(
        &self,
        index: usize,
        what: String,
        status: StatusCode,
    ) -> Response<Bytes> {
        let info = &self.policies[index];
        if !info.warned_missing_key.swap(true, Ordering::Relaxed) {
            tracing::warn!(policy = %info.name, source = %what, "request without a rate-limit key (further ones are logged at debug level)");
        } else {
            tracing::debug!(policy = %info.name, source = %what, "request without a rate-limit key");
        }
        self.problem(
            status,
            &format!(
                "no rate-limit key for policy '{}': expected {what}",
                info.name
            ),
        )
    }
}

#[cfg(feature = "memory")]
impl<K> ThrottleLayer<K, MemoryBackend> {
    /// A layer enforcing one policy with a new in-memory backend and the default options.
    pub fn new(policy: Policy<K>) -> Self {
        Self::builder()
            .policy(policy)
            .build()
            .expect("one policy is a valid configuration")
    }

    /// A builder for several policies, a shared backend or other options; the backend is a new
    /// in-memory one unless [`backend`](ThrottleLayerBuilder::backend) replaces it.
    pub fn builder() -> ThrottleLayerBuilder<K, MemoryBackend> {
        ThrottleLayerBuilder::with_backend(MemoryBackend::new())
    }
}

impl<K, B> ThrottleLayer<K, B> {
    /// The counter of distinct limited keys, if the layer has one.
    pub fn offenders(&self) -> Option<&Offenders> {
        self.shared.responder.offenders.as_ref()
    }

    /// The policies, in the order they are tried.
    pub fn policies(&self) -> &[Policy<K>] {
        &self.shared.policies
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }
}

impl<K, B> Clone for ThrottleLayer<K, B> {
    fn clone(&self) -> Self {
        ThrottleLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<K, B> fmt::Debug for ThrottleLayer<K, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .shared
            .policies
            .iter()
            .map(|p| p.limit().name())
            .collect();
        f.debug_struct("ThrottleLayer")
            .field("policies", &names)
            .finish_non_exhaustive()
    }
}

impl<S, K, B> Layer<S> for ThrottleLayer<K, B> {
    type Service = Throttle<S, K, B>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::from_shared(inner, self.shared.clone())
    }
}

/// Builds a [`ThrottleLayer`].
#[must_use]
pub struct ThrottleLayerBuilder<K, B> {
    backend: B,
    policies: Vec<Policy<K>>,
    headers: HeaderOptions,
    rejection: Option<Arc<RejectionFn>>,
    on_error: OnBackendError,
    access: Option<(AccessList, AddressSource)>,
    redact_keys: bool,
    on_limited: Option<Arc<LimitedHook>>,
    offenders: Option<Offenders>,
    grpc: bool,
    decision_extension: bool,
}

impl<K, B> ThrottleLayerBuilder<K, B> {
    /// A builder using `backend` (share one backend between layers by cloning it).
    pub fn with_backend(backend: B) -> Self {
        ThrottleLayerBuilder {
            backend,
            policies: Vec::new(),
            headers: HeaderOptions {
                ratelimit: true,
                legacy: false,
            },
            rejection: None,
            on_error: OnBackendError::default(),
            access: None,
            redact_keys: false,
            on_limited: None,
            offenders: None,
            grpc: false,
            decision_extension: false,
        }
    }

    /// Replaces the backend.
    pub fn backend<B2>(self, backend: B2) -> ThrottleLayerBuilder<K, B2> {
        ThrottleLayerBuilder {
            backend,
            policies: self.policies,
            headers: self.headers,
            rejection: self.rejection,
            on_error: self.on_error,
            access: self.access,
            redact_keys: self.redact_keys,
            on_limited: self.on_limited,
            offenders: self.offenders,
            grpc: self.grpc,
            decision_extension: self.decision_extension,
        }
    }

    /// Counts the distinct keys each policy limits, per minute, hour and day (see [`Offenders`];
    /// read them with [`Offenders::count`] on a clone, or [`ThrottleLayer::offenders`]).
    pub fn count_offenders(mut self, offenders: Offenders) -> Self {
        self.offenders = Some(offenders);
        self
    }

    /// Shows keys in log events as a stable pseudonym (`sha256:` and 12 hex digits) instead of
    /// themselves, for keys that are personal data (IP addresses, user ids, API keys). Default false.
    pub fn redact_keys(mut self, redact: bool) -> Self {
        self.redact_keys = redact;
        self
    }

    /// Calls `hook` for every request a policy limits (bans included), with the request's parts, the
    /// policy, the key and the decision: to log, alert, or feed a deny list. It runs on the request's
    /// task, so it should be quick; without a hook nothing is spent.
    ///
    /// ```
    /// use tower_throttle::{access::AccessList, Limited, Policy, Quota, ThrottleLayer};
    ///
    /// let lists = AccessList::new();
    /// let deny = lists.clone();
    /// let layer = ThrottleLayer::builder()
    ///     .policy(Policy::builder("api").quota(Quota::per_second(5)).build().unwrap())
    ///     .access_list(lists)
    ///     .on_limited(move |limited: &Limited<'_>| {
    ///         tracing::warn!(policy = limited.policy, path = %limited.uri.path(), "limited");
    ///         if limited.decision.banned && limited.headers.contains_key("x-api-key") {
    ///             // Banned by a penalty: revoke the API key for good (a bounded set of real keys).
    ///             deny.deny_key(limited.key.clone());
    ///         }
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn on_limited<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Limited<'_>) + Send + Sync + 'static,
    {
        self.on_limited = Some(Arc::new(hook));
        self
    }

    /// Allow and deny lists (see [`AccessList`]): a request whose client network or policy key is on
    /// an allow list passes with no limit; one on a deny list (and no allow list) gets `403 Forbidden`.
    /// Networks are matched against the peer address; see
    /// [`access_list_behind`](Self::access_list_behind) for clients behind proxies. Keep a clone of
    /// `lists` to change them while the layer runs.
    pub fn access_list(mut self, lists: AccessList) -> Self {
        self.access = Some((lists, AddressSource::Peer));
        self
    }

    /// Like [`access_list`](Self::access_list), matching networks against the client address that
    /// `client_ip` finds behind trusted proxies.
    pub fn access_list_behind(mut self, lists: AccessList, client_ip: ClientIp) -> Self {
        self.access = Some((lists, AddressSource::Client(client_ip)));
        self
    }

    /// Adds a policy. Policies are tried in the order they are added; the first that matches a request
    /// decides.
    pub fn policy(mut self, policy: Policy<K>) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds several policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy<K>>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// Sends `RateLimit-Policy` and `RateLimit` fields (default: on).
    pub fn ratelimit_headers(mut self, on: bool) -> Self {
        self.headers.ratelimit = on;
        self
    }

    /// Sends `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (default: off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.headers.legacy = on;
        self
    }

    /// Replaces the default 429 response. The middleware adds `Retry-After` (unless the function set
    /// one) and the rate-limit fields.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Response, StatusCode};
    /// use tower_throttle::{headers::Rejected, Policy, Quota, ThrottleLayer};
    ///
    /// let layer = ThrottleLayer::builder()
    ///     .policy(Policy::builder("api").quota(Quota::per_second(5)).build().unwrap())
    ///     .rejection_response(|r: &Rejected<'_>| {
    ///         let mut res = Response::new(Bytes::from(format!("slow down ({})", r.policy)));
    ///         *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    ///         res
    ///     })
    ///     .build()
    ///     .unwrap();
    /// ```
    pub fn rejection_response<F>(mut self, f: F) -> Self
    where
        F: Fn(&Rejected<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.rejection = Some(Arc::new(f));
        self
    }

    /// Answers as a gRPC server: every request the layer stops gets a trailers-only gRPC response
    /// instead of an HTTP error, so that gRPC clients see `RESOURCE_EXHAUSTED` (over the limit) with
    /// `retry-after` and `grpc-retry-pushback-ms` metadata, `UNAVAILABLE` (backend down with
    /// [`OnBackendError::Deny`]), `INVALID_ARGUMENT` (no key) or `PERMISSION_DENIED` (deny list).
    /// See [`grpc`](crate::grpc) for the details.
    ///
    /// This sets the [`rejection_response`](Self::rejection_response) to
    /// [`grpc::resource_exhausted`](crate::grpc::resource_exhausted); a `rejection_response` set
    /// afterwards replaces it for the `429` case only.
    pub fn grpc(mut self) -> Self {
        self.grpc = true;
        self.rejection_response(crate::grpc::resource_exhausted)
    }

    /// Inserts a [`ThrottleDecision`] into every admitted request, for handlers that want to read
    /// it (`Extension<ThrottleDecision>` in axum). Off by default, because it costs an allocation per
    /// request; dry-run and delay-mode policies always insert it.
    pub fn decision_extension(mut self, on: bool) -> Self {
        self.decision_extension = on;
        self
    }

    /// What to do when the backend fails (default: [`OnBackendError::Allow`]).
    pub fn on_backend_error(mut self, on_error: OnBackendError) -> Self {
        self.on_error = on_error;
        self
    }

    /// Builds the layer; at least one policy is required.
    pub fn build(self) -> Result<ThrottleLayer<K, B>, BuildError>
    where
        B: Backend,
    {
        if self.policies.is_empty() {
            return Err(BuildError::Invalid(
                "a throttle layer needs at least one policy".into(),
            ));
        }
        for policy in &self.policies {
            for tier in policy.tiers() {
                match &*tier.limits {
                    [one] => self.backend.validate(one)?,
                    // The backend checks each member of a stack as it will run it.
                    all => self.backend.validate_all(all)?,
                }
            }
        }
        // Every limit, with the names of the stack it belongs to.
        let limits: Vec<(&crate::Limit, Vec<&str>)> = self
            .policies
            .iter()
            .flat_map(|p| p.tiers())
            .flat_map(|t| {
                let stack: Vec<&str> = t.limits.iter().map(|l| l.name()).collect();
                t.limits.iter().map(move |l| (l, stack.clone()))
            })
            .collect();
        for (i, (limit, stack)) in limits.iter().enumerate() {
            // Limits that share a name share their keys' state, which only makes sense with the same
            // rules: a TAT written under a one-hour tolerance would lock users out of a per-second
            // one, and a delayed policy's queue would be erased by one without the delay.
            let Some((other, other_stack)) = limits[..i]
                .iter()
                .find(|(other, _)| other.name() == limit.name())
            else {
                continue;
            };
            if !other.same_rules(limit) {
                return Err(BuildError::Invalid(format!(
                    "policy {:?} appears twice with different rules ({} and {}); policies that share \
                     a name share their keys, so they need one quota, algorithm, delay, lease and \
                     penalty",
                    limit.name(),
                    other.quota(),
                    limit.quota()
                )));
            }
            if stack != other_stack {
                return Err(BuildError::Invalid(format!(
                    "the limit name {:?} is used by two different stacks of quotas ({} and {}); \
                     rename a policy or tier",
                    limit.name(),
                    other_stack.join(" + "),
                    stack.join(" + ")
                )));
            }
        }
        let policies: Box<[Policy<K>]> = self.policies.into();
        let responder = Responder {
            headers: self.headers,
            policies: policies
                .iter()
                .map(|p| PolicyInfo {
                    name: p.name().into(),
                    reporter: Reporter::default(),
                    penalty: p
                        .limit()
                        .penalty()
                        .filter(|_| !self.backend.keeps_penalties())
                        .map(|penalty| PenaltyBox::new(*penalty)),
                    #[cfg(feature = "memory")]
                    cost: p.cost(),
                    dry_run: p.is_dry_run(),
                    expose_decision: self.decision_extension
                        || p.is_dry_run()
                        || p.limit().delay().is_some(),
                    tiers: p
                        .tiers()
                        .iter()
                        .map(|t| TierInfo {
                            name: t.name.clone(),
                            limits: t.limits.clone(),
                            names: t.limits.iter().map(|l| l.name().into()).collect(),
                            policy_field: headers::policy_field(&t.limits),
                            limit_value: t.limits[0].max_cost(),
                            concurrency: t.limits[0].algorithm() == crate::Algorithm::Concurrency,
                        })
                        .collect(),
                    limited_body: headers::limited_body(p.name()),
                    warned_missing_key: AtomicBool::new(false),
                })
                .collect(),
            rejection: self.rejection,
            on_error: self.on_error,
            redact_keys: self.redact_keys,
            on_limited: self.on_limited,
            offenders: self.offenders,
            grpc: self.grpc,
            #[cfg(feature = "memory")]
            local: (self.on_error == OnBackendError::Local).then(MemoryBackend::new),
            errors: ErrorLog::default(),
        };
        Ok(ThrottleLayer {
            shared: Arc::new(Shared {
                backend: self.backend,
                policies,
                responder: Arc::new(responder),
                access: self.access,
            }),
        })
    }
}

impl<K, B> fmt::Debug for ThrottleLayerBuilder<K, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleLayerBuilder")
            .field("policies", &self.policies.len())
            .finish_non_exhaustive()
    }
}

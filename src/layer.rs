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
use crate::{Backend, BackendError, BuildError, Decision, Key, Policy, Throttle};

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
    name: Box<str>,
    reporter: Reporter,
    /// The in-process penalty box, for a policy with a penalty on a backend that keeps none.
    penalty: Option<PenaltyBox>,
    limit_value: u64,
    #[cfg(feature = "memory")]
    limit: crate::Limit,
    #[cfg(feature = "memory")]
    cost: u64,
    policy_field: HeaderValue,
    /// The default 429 body, rendered once.
    limited_body: Bytes,
    warned_missing_key: AtomicBool,
}

/// What the middleware does with a request once its policy has decided.
pub(crate) enum Verdict {
    /// Call the inner service, then add these fields to its response.
    Admit(Option<RateHeaders>),
    /// Answer with this response instead.
    Reject(Response<Bytes>),
}

impl Responder {
    pub(crate) fn verdict(
        &self,
        index: usize,
        result: Result<Decision, BackendError>,
        key: &Key,
        request: RequestRef<'_>,
    ) -> Verdict {
        let info = &self.policies[index];
        let decision = match result {
            Ok(decision) => decision,
            Err(error) => {
                info.reporter.failure(&info.name);
                self.errors.record(&info.name, &error, self.on_error);
                return match self.on_error {
                    OnBackendError::Allow => Verdict::Admit(None),
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
                    OnBackendError::Local => match &self.local {
                        Some(local) => match local.decide(&info.limit, key, info.cost) {
                            Ok(decision) => self.decided(info, decision, key, true, request),
                            Err(_) => Verdict::Admit(None),
                        },
                        None => Verdict::Admit(None),
                    },
                };
            }
        };
        self.decided(info, decision, key, true, request)
    }

    /// The answer to a request whose key is banned (in-process penalty box), if it is.
    pub(crate) fn banned(
        &self,
        index: usize,
        key: &Key,
        request: RequestRef<'_>,
    ) -> Option<Response<Bytes>> {
        let info = &self.policies[index];
        let rest = info.penalty.as_ref()?.banned(key)?;
        let decision = Decision::banned(info.limit_value, rest, None, rest);
        match self.decided(info, decision, key, false, request) {
            Verdict::Reject(response) => Some(response),
            Verdict::Admit(_) => None,
        }
    }

    /// Backend latency, for the metrics.
    pub(crate) fn latency(&self, index: usize, took: std::time::Duration) {
        let info = &self.policies[index];
        info.reporter.latency(&info.name, took);
    }

    /// `strike`: a rejection counts against the key's in-process penalty (not when a ban answered).
    fn decided(
        &self,
        info: &PolicyInfo,
        decision: Decision,
        key: &Key,
        strike: bool,
        request: RequestRef<'_>,
    ) -> Verdict {
        // The rejection that earns a ban answers with it.
        let decision = match &info.penalty {
            Some(penalty) if strike && !decision.allowed => match penalty.strike(key) {
                Some(ban) => Decision::banned(
                    decision.limit,
                    ban,
                    decision.retry_after,
                    decision.reset_after,
                ),
                None => decision,
            },
            _ => decision,
        };
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
            "rate-limit decision"
        );
        let fields = RateHeaders::new(self.headers, &info.name, &info.policy_field, &decision);
        if decision.allowed {
            return Verdict::Admit(Some(fields));
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

    /// One of the layer's own refusals: a problem response, or its gRPC form.
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
        for (i, policy) in self.policies.iter().enumerate() {
            let limit = policy.limit();
            self.backend.validate(limit)?;
            // Policies that share a name share their keys' state, which only makes sense with one
            // quota: a TAT written under a one-hour tolerance would lock users out of a per-second one.
            if let Some(other) = self.policies[..i]
                .iter()
                .map(Policy::limit)
                .find(|other| other.name() == limit.name() && other.quota() != limit.quota())
            {
                return Err(BuildError::Invalid(format!(
                    "policy {:?} appears twice with different quotas ({} and {}); policies that share \
                     a name share their keys, so they need one quota",
                    limit.name(),
                    other.quota(),
                    limit.quota()
                )));
            }
        }
        let policies: Box<[Policy<K>]> = self.policies.into();
        let responder = Responder {
            headers: self.headers,
            policies: policies
                .iter()
                .map(|p| PolicyInfo {
                    name: p.limit().name().into(),
                    reporter: Reporter::default(),
                    penalty: p
                        .limit()
                        .penalty()
                        .filter(|_| !self.backend.keeps_penalties())
                        .map(|penalty| PenaltyBox::new(*penalty)),
                    limit_value: p.limit().max_cost(),
                    #[cfg(feature = "memory")]
                    limit: p.limit().clone(),
                    #[cfg(feature = "memory")]
                    cost: p.cost(),
                    policy_field: headers::policy_field(p.limit()),
                    limited_body: headers::limited_body(p.limit().name()),
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

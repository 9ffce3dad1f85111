//! [`ThrottleLayerBuilder`]: the layer's options, and the checks that make a bad configuration an
//! `Err` when the layer is built rather than a surprise under traffic.

use std::collections::hash_map::{Entry, HashMap};
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use crate::access::{AccessList, AddressSource};
use crate::backend::Backend;
use crate::error::BuildError;
use crate::headers::Rejected;
use crate::key::ClientIp;
use crate::limit::Limit;
use crate::middleware::layer::ThrottleLayer;
use crate::middleware::service::Shared;
use crate::middleware::verdict::{Judge, OnBackendError, Settings};
use crate::observe::Limited;
use crate::offenders::Offenders;
use crate::policy::{check_reachable, Policy};

#[cfg(feature = "memory")]
use crate::backend::MemoryBackend;

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

/// Builds a [`ThrottleLayer`].
#[must_use]
pub struct ThrottleLayerBuilder<K, B> {
    backend: B,
    policies: Vec<Policy<K>>,
    access: Option<(AccessList, AddressSource)>,
    /// What the verdict is made of, besides the policies.
    settings: Settings,
}

impl<K, B> ThrottleLayerBuilder<K, B> {
    /// A builder using `backend` (share one backend between layers by cloning it).
    pub fn with_backend(backend: B) -> Self {
        ThrottleLayerBuilder {
            backend,
            policies: Vec::new(),
            access: None,
            settings: Settings::default(),
        }
    }

    /// Replaces the backend.
    pub fn backend<B2>(self, backend: B2) -> ThrottleLayerBuilder<K, B2> {
        ThrottleLayerBuilder {
            backend,
            policies: self.policies,
            access: self.access,
            settings: self.settings,
        }
    }

    /// Counts the distinct keys each policy limits, per minute, hour and day (see [`Offenders`];
    /// read them with [`Offenders::count`] on a clone, or [`ThrottleLayer::offenders`]).
    pub fn count_offenders(mut self, offenders: Offenders) -> Self {
        self.settings.offenders = Some(offenders);
        self
    }

    /// Shows keys in log events as a stable pseudonym (`sha256:` and 12 hex digits) instead of
    /// themselves, for keys that are personal data (IP addresses, user ids, API keys). Default false.
    pub fn redact_keys(mut self, redact: bool) -> Self {
        self.settings.redact_keys = redact;
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
        self.settings.on_limited = Some(Arc::new(hook));
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
    /// decides, so a policy after one with the same route (or none) and the same methods (or all)
    /// could never apply, and is an error at [`build`](Self::build).
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
        self.settings.headers.ratelimit = on;
        self
    }

    /// Sends `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (default: off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.settings.headers.legacy = on;
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
        self.settings.rejection = Some(Arc::new(f));
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
        self.settings.grpc = true;
        self.rejection_response(crate::grpc::resource_exhausted)
    }

    /// Inserts a [`ThrottleDecision`](crate::ThrottleDecision) into every admitted request, for handlers that want to read
    /// it (`Extension<ThrottleDecision>` in axum). Off by default, because it costs an allocation per
    /// request; dry-run and delay-mode policies always insert it.
    pub fn decision_extension(mut self, on: bool) -> Self {
        self.settings.decision_extension = on;
        self
    }

    /// What to do when the backend fails (default: [`OnBackendError::Allow`]).
    pub fn on_backend_error(mut self, on_error: OnBackendError) -> Self {
        self.settings.on_error = on_error;
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
            // Counting by outcome gives units back: a backend that cannot would count them all.
            if policy.extras().is_some_and(|e| e.outcome.is_some()) && !self.backend.can_refund() {
                return Err(BuildError::Invalid(format!(
                    "policy {:?} counts by outcome (count_only, refund_on), but this backend cannot \
                     give units back (Backend::can_refund)",
                    policy.name()
                )));
            }
            for tier in policy.tiers() {
                match &*tier.limits {
                    [one] => self.backend.validate(one)?,
                    // The backend checks each member of a stack as it will run it.
                    all => self.backend.validate_all(all)?,
                }
            }
        }
        // Every limit, with the names of the stack it belongs to.
        let limits: Vec<(&Limit, Vec<&str>)> = self
            .policies
            .iter()
            .flat_map(|p| p.tiers())
            .flat_map(|t| {
                let stack: Vec<&str> = t.limits.iter().map(|l| l.name()).collect();
                t.limits.iter().map(move |l| (l, stack.clone()))
            })
            .collect();
        // The first limit of each name, looked up by name: a table of many policies builds in
        // linear time.
        let mut first_named: HashMap<&str, &(&Limit, Vec<&str>)> = HashMap::new();
        for entry in &limits {
            let (limit, stack) = entry;
            // Limits that share a name share their keys' state, which only makes sense with the same
            // rules: a TAT written under a one-hour tolerance would lock users out of a per-second
            // one, and a delayed policy's queue would be erased by one without the delay.
            let (other, other_stack) = match first_named.entry(limit.name()) {
                Entry::Vacant(vacant) => {
                    vacant.insert(entry);
                    continue;
                }
                Entry::Occupied(occupied) => *occupied.get(),
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
        check_reachable(&self.policies)?;
        let policies: Box<[Policy<K>]> = self.policies.into();
        let judge = Judge::new(self.settings, &policies, self.backend.keeps_penalties());
        Ok(ThrottleLayer::from_shared(Shared {
            backend: self.backend,
            policies,
            judge: Arc::new(judge),
            access: self.access,
        }))
    }
}

impl<K, B> fmt::Debug for ThrottleLayerBuilder<K, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleLayerBuilder")
            .field("policies", &self.policies.len())
            .finish_non_exhaustive()
    }
}

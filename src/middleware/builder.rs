//! [`ThrottleLayerBuilder`]: the layer's options, and the checks that make a bad configuration an
//! `Err` when the layer is built rather than a surprise under traffic.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use crate::access::{AccessList, AddressSource};
use crate::backend::Backend;
use crate::engine::settings::Settings;
use crate::engine::shared::{InForce, Shared};
use crate::engine::table::Table;
use crate::error::BuildError;
use crate::failure::OnBackendError;
use crate::key::ClientIp;
use crate::middleware::layer::ThrottleLayer;
use crate::near_limit::NearLimit;
use crate::observe::{Limited, RedactionSecret};
use crate::offenders::Offenders;
use crate::or_default::OrDefault;
use crate::overload::{Gate, Overload};
use crate::overrides::cache::Overrides;
use crate::policy::Policy;
use crate::refusal::Refusal;

#[cfg(feature = "memory")]
use crate::backend::MemoryBackend;

#[cfg(feature = "memory")]
impl<K> ThrottleLayer<K, MemoryBackend> {
    /// A layer enforcing one policy with a new in-memory backend and the default options.
    ///
    /// # Panics
    ///
    /// If the policy needs an option only the [builder](Self::builder) sets: an
    /// `under_pressure_only` policy needs the layer's overload gate (the builder's `build` says so
    /// as an error).
    pub fn new(policy: Policy<K>) -> Self {
        Self::builder()
            .policy(policy)
            .build()
            .expect("one policy needs no more than the default options")
    }

    /// A builder for several policies, a shared backend or other options; the backend is a new
    /// in-memory one unless [`backend`](ThrottleLayerBuilder::backend) replaces it.
    pub fn builder() -> ThrottleLayerBuilder<K, MemoryBackend> {
        // Made by `build` (its clock calibrates), only if `backend` does not replace it.
        ThrottleLayerBuilder::with(OrDefault::Default(MemoryBackend::new))
    }
}

/// Builds a [`ThrottleLayer`].
#[must_use]
pub struct ThrottleLayerBuilder<K, B> {
    backend: OrDefault<B>,
    policies: Vec<Policy<K>>,
    access: Option<(AccessList, AddressSource)>,
    /// What the verdict is made of, besides the policies.
    settings: Settings,
    overload: Option<Overload>,
}

impl<K, B> ThrottleLayerBuilder<K, B> {
    /// A builder using `backend` (share one backend between layers by cloning it).
    pub fn with_backend(backend: B) -> Self {
        Self::with(OrDefault::Given(backend))
    }

    fn with(backend: OrDefault<B>) -> Self {
        ThrottleLayerBuilder {
            backend,
            policies: Vec::new(),
            access: None,
            settings: Settings::default(),
            overload: None,
        }
    }

    /// Replaces the backend.
    pub fn backend<B2>(self, backend: B2) -> ThrottleLayerBuilder<K, B2> {
        ThrottleLayerBuilder {
            backend: OrDefault::Given(backend),
            policies: self.policies,
            access: self.access,
            settings: self.settings,
            overload: self.overload,
        }
    }

    /// Counts the distinct keys each policy limits, per minute, hour and day (see [`Offenders`];
    /// read them with [`Offenders::count`] on a clone, or [`ThrottleLayer::offenders`]).
    pub fn count_offenders(mut self, offenders: Offenders) -> Self {
        self.settings.offenders = Some(offenders);
        self
    }

    /// Shows keys in log events as a pseudonym (`hmac:` and 16 hex digits) instead of themselves,
    /// for keys that are personal data (IP addresses, user ids, API keys). Default false.
    ///
    /// Without a secret ([`redact_keys_with`](Self::redact_keys_with)) the layer makes one up:
    /// pseudonyms are then stable within the layer only (two layers show a key apart).
    pub fn redact_keys(mut self, redact: bool) -> Self {
        self.settings.redact_keys = redact;
        self
    }

    /// Redacts keys in log events (as [`redact_keys`](Self::redact_keys)) with the operator's
    /// `secret`: the same pseudonym for the same key in every process that shares the secret, and
    /// none that can be reversed without it. See [`RedactionSecret`].
    pub fn redact_keys_with(mut self, secret: RedactionSecret) -> Self {
        self.settings.redact_keys = true;
        self.settings.redaction_secret = Some(secret);
        self
    }

    /// Calls `hook` for every request a policy limits (bans included), with the request's parts, the
    /// policy, the key and the decision: to log, alert, or feed a deny list. It runs on the request's
    /// task, so it should be quick; without a hook nothing is spent.
    ///
    /// ```
    /// use tower_throttle::{
    ///     key::PeerIp, ops::AccessList, refusal::Limited, Policy, Quota, ThrottleLayer,
    /// };
    ///
    /// let lists = AccessList::new();
    /// let deny = lists.clone();
    /// let layer = ThrottleLayer::builder()
    ///     .policy(Policy::builder("api").key(PeerIp::new()).quota(Quota::per_second(5)).build().unwrap())
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
    pub fn on_limited(mut self, hook: impl Fn(&Limited<'_>) + Send + Sync + 'static) -> Self {
        self.settings.refusals.on_limited = Some(Arc::new(hook));
        self
    }

    /// Calls `hook` for an admitted request that came near a limit of a policy with
    /// [`near_limit`](crate::PolicyBuilder::near_limit): at most once a second per policy (the
    /// event says how many it held back), so that a warning to a customer cannot become a flood.
    ///
    /// ```
    /// use tower_throttle::{key::Header, ops::NearLimit, Policy, Quota, ThrottleLayer};
    ///
    /// let layer = ThrottleLayer::builder()
    ///     .policy(
    ///         Policy::builder("api")
    ///             .key(Header::new("x-api-key"))
    ///             .quota(Quota::per_hour(1000))
    ///             .near_limit(0.8)
    ///             .build()
    ///             .unwrap(),
    ///     )
    ///     .on_near_limit(|near: &NearLimit<'_>| {
    ///         tracing::warn!(policy = near.policy, key = %near.key, "80 % of the hourly quota used");
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn on_near_limit(mut self, hook: impl Fn(&NearLimit<'_>) + Send + Sync + 'static) -> Self {
        self.settings.on_near_limit = Some(Arc::new(hook));
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

    /// Sends the OpenAI-style fields that LLM clients read (default: off):
    /// `x-ratelimit-{limit,remaining,reset}-requests` for a policy's first limit that is not
    /// metered and `x-ratelimit-{limit,remaining,reset}-tokens` for its
    /// [metered](crate::PolicyBuilder::metered) one, `remaining` in the limit's unit (0 while the key
    /// is in debt), `reset` the time until the limit is full again as OpenAI writes it (`6m0s`).
    /// Each is set only if the response does not have it (a proxied upstream's own).
    ///
    /// ```
    /// use tower_throttle::{key::PeerIp, Estimate, Limit, Policy, Quota, ThrottleLayer};
    ///
    /// let chat = Policy::builder("chat")
    ///     .key(PeerIp::new())
    ///     .quota(Quota::per_minute(60))
    ///     .metered(Limit::new("chat.tokens", Quota::per_minute(100_000)).unwrap(), Estimate::fixed(500))
    ///     .build()
    ///     .unwrap();
    /// let layer = ThrottleLayer::builder().policy(chat).openai_headers(true).build();
    /// assert!(layer.is_ok());
    /// ```
    pub fn openai_headers(mut self, on: bool) -> Self {
        self.settings.headers.openai = on;
        self
    }

    /// Answers every request the layer refuses itself — over the limit or banned (`429`), without a
    /// key (`400`, or the [`MissingKey`](crate::policy::MissingKey) status), on a deny list (`403`), the
    /// backend down under [`OnBackendError::Deny`] (`503`) — with `f`'s response. `f` sees why
    /// ([`Refusal::kind`]), what was decided (policy, key, decision, retry time) and the request's
    /// method, URI and headers, so it can negotiate the content (HTML for browsers, JSON for API
    /// clients); [`Refusal::default_response`] is the layer's own answer, for the cases it leaves
    /// alone. The layer adds `Retry-After` (unless `f` set one) to `429` and `503`, and the
    /// rate-limit fields to `429`.
    ///
    /// Without it, refusals cost what they always did (one `Option` check). It is the one hook that
    /// shapes refusals; [`on_limited`](Self::on_limited) only observes them.
    ///
    /// The [`refusal`](crate::refusal) module's example answers browsers in HTML and API clients
    /// as the layer does.
    pub fn refusal_response<F>(mut self, f: F) -> Self
    where
        F: Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.settings.refusals.custom = Some(Arc::new(f));
        self
    }

    /// Answers as a gRPC server: every request the layer stops gets a trailers-only gRPC response
    /// instead of an HTTP error, so that gRPC clients see `RESOURCE_EXHAUSTED` (over the limit) with
    /// `retry-after` and `grpc-retry-pushback-ms` metadata, `UNAVAILABLE` (backend down with
    /// [`OnBackendError::Deny`]), `INVALID_ARGUMENT` (no key) or `PERMISSION_DENIED` (deny list).
    /// See [`grpc`](crate::grpc) for the details.
    ///
    /// The `429` is [`grpc::resource_exhausted`](crate::grpc::resource_exhausted); a
    /// [`refusal_response`](Self::refusal_response) still has the last word.
    pub fn grpc(mut self) -> Self {
        self.settings.refusals.grpc = true;
        // The gRPC 429 replaces the default 429 only.
        self.settings.refusals.rejection = Some(Arc::new(crate::grpc::resource_exhausted));
        self
    }

    /// Inserts a [`PolicyDecision`](crate::policy::PolicyDecision) into every admitted request, for handlers that want to read
    /// it (`Extension<PolicyDecision>` in axum). Off by default, because it costs an allocation per
    /// request; dry-run and delay-mode policies always insert it.
    pub fn decision_extension(mut self, on: bool) -> Self {
        self.settings.decision_extension = on;
        self
    }

    /// Protects the service from overload: an adaptive limit on the requests in flight through
    /// the layer, checked before any policy's limits (see [`Overload`]).
    pub fn overload(mut self, overload: Overload) -> Self {
        self.overload = Some(overload);
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
        let mut settings = self.settings;
        if let Some(overload) = &self.overload {
            settings.overload = Some(Arc::new(Gate::new(overload)?));
        }
        if settings.redact_keys {
            // One secret for the layer's life: the pseudonyms stay the same across reloads, and
            // the top limited keys show the same ones as the logs.
            let secret = settings
                .redaction_secret
                .get_or_insert_with(crate::observe::RedactionSecret::random);
            if let Some(offenders) = &settings.offenders {
                offenders.redact_with(secret.hmac());
            }
        }
        let backend = self.backend.get();
        let table = Table::build(&backend, self.policies, settings.clone(), None)?;
        let overrides = Arc::new(Overrides::new(backend.records()));
        overrides.know(table.limit_names());
        overrides.listen();
        Ok(ThrottleLayer::from_shared(Shared {
            backend,
            table: InForce::new(table),
            access: self.access,
            settings,
            reloading: Default::default(),
            overrides,
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

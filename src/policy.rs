//! [`Policy`]: which requests a limit applies to, what they are keyed by and what they cost; and
//! what a policy is made of besides its [`Quota`]: [tiers](Tier), a [`Budget`] of leased units, a
//! [`Penalty`] box, per-customer quotas ([`QuotaResolver`]), the answer to a request without a key
//! ([`MissingKey`]), the bounds every policy keeps ([`MAX_STACKED_QUOTAS`], [`MAX_UNIT_COUNT`],
//! [`MAX_DELAY`], [`DEFAULT_LEASE`]), and what it decided, as a handler reads it
//! ([`PolicyDecision`], [`LimitDecision`], [`RequestDecisions`]).

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{Method, Request, StatusCode};

use crate::error::BuildError;
use crate::limit::validate_name;
use crate::limit::{Algorithm, Limit};
use crate::methods::methods_of;
use crate::near_limit::NearRule;
use crate::quota::Quota;
use crate::route::Route;
use crate::window::{CalendarWindow, WindowStart};

pub use crate::budget::Budget;
pub use crate::limit::{DEFAULT_LEASE, MAX_DELAY, MAX_STACKED_QUOTAS, MAX_UNIT_COUNT};
pub use crate::penalty::Penalty;
pub use crate::per_customer::{BoxError, QuotaFuture, QuotaResolver};
pub use crate::policy_decision::{LimitDecision, PolicyDecision, RequestDecisions};
pub use crate::quota::QuotaError;

mod body_key;
mod compat;
mod compiled;
mod condition;
pub(crate) mod extras;
mod keyed;
mod limits;
mod options;
mod parts;
mod spec;
mod table;
pub(crate) mod tier;

pub(crate) use compiled::CompiledPolicy;
pub use condition::Condition;
pub(crate) use options::Options;
pub(crate) use parts::NO_KEY;
pub use parts::{MissingKey, NoKey, Tier};
pub(crate) use spec::PolicySpec;
pub(crate) use table::check_table;
pub(crate) use tier::CompiledTier;

/// A limit applied to some requests: a named [`Quota`], a key extractor, and optionally a route,
/// methods and a cost per request.
///
/// ```
/// use http::Method;
/// use tower_throttle::{key::{Header, PeerIp}, Policy, Quota};
///
/// let reply = Policy::builder("reply")
///     .quota(Quota::per_minute(30).with_max_burst(15))
///     .key(Header::new("x-user-id"))
///     .route("/reply")
///     .methods([Method::POST])
///     .cost(1)
///     .build()
///     .unwrap();
/// assert_eq!(reply.limit().name(), "reply");
///
/// // Invalid configuration is an error when the policy is built:
/// let err = Policy::builder("reply").key(PeerIp::new()).quota(Quota::per_second(0)).build().unwrap_err();
/// assert_eq!(err.to_string(), r#"policy "reply": quota count must be at least 1"#);
/// ```
#[derive(Clone, Debug)]
pub struct Policy<K> {
    key: K,
    compiled: Arc<CompiledPolicy>,
}

impl Policy<NoKey> {
    /// Starts a policy called `name` (see [`Limit`] for the rules on names). It needs a quota and a
    /// [`key`](PolicyBuilder::key): what its requests count against.
    pub fn builder(name: impl Into<String>) -> PolicyBuilder<NoKey> {
        let name = name.into();
        let opts = Options {
            name,
            cost: 1,
            ..Options::default()
        };
        PolicyBuilder {
            key: NoKey(()),
            keyed: false,
            opts,
        }
    }
}

impl<K> Policy<K> {
    /// The policy's name.
    pub fn name(&self) -> &str {
        self.compiled.name()
    }

    /// The limit of the default tier's first quota (the only one, unless quotas are stacked).
    pub fn limit(&self) -> &Limit {
        self.compiled.limit()
    }

    /// The limits of the default tier: one per stacked quota, named `{policy}` for a single quota
    /// and `{policy}.{period}` (such as `api.1s` and `api.1d`) for a stack.
    pub fn limits(&self) -> &[Limit] {
        self.compiled.limits()
    }

    /// The limits of tier `name` (named `{policy}.{tier}`, or `{policy}.{tier}.{period}` when
    /// stacked), or `None` for a tier the policy does not have.
    pub fn tier_limits(&self, name: &str) -> Option<&[Limit]> {
        self.compiled.tier_limits(name)
    }

    /// Whether the policy only reports what it would do ([`PolicyBuilder::dry_run`]).
    pub fn is_dry_run(&self) -> bool {
        self.compiled.dry_run
    }

    /// The key extractor.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Units each request costs.
    pub fn cost(&self) -> u64 {
        self.compiled.cost
    }

    /// What happens when a request has no key.
    pub fn missing_key(&self) -> MissingKey {
        self.compiled.missing_key
    }

    /// The route pattern this policy is restricted to, if any.
    pub fn route(&self) -> Option<&str> {
        self.compiled.route()
    }

    /// Whether this policy applies to `request` (its route and method).
    pub fn applies_to<B>(&self, request: &Request<B>) -> bool {
        self.compiled.applies_to(request)
    }

    /// The policy as the engine decides by it.
    pub(crate) fn compiled(&self) -> &Arc<CompiledPolicy> {
        &self.compiled
    }

    /// The policy compiled for a new table: see [`CompiledPolicy::new`].
    pub(crate) fn compile<'p>(
        self,
        decision_extension: bool,
        backend_keeps_penalties: bool,
        previous: impl Iterator<Item = &'p CompiledPolicy>,
    ) -> Policy<K> {
        let spec = Arc::try_unwrap(self.compiled)
            .map_or_else(|shared| shared.spec().clone(), CompiledPolicy::into_spec);
        let compiled =
            CompiledPolicy::new(spec, decision_extension, backend_keeps_penalties, previous);
        Policy {
            key: self.key,
            compiled: Arc::new(compiled),
        }
    }

    pub(crate) fn spec(&self) -> &PolicySpec {
        self.compiled.spec()
    }
}

/// The most [`PolicyBuilder::retry_after_jitter`] adds to a `Retry-After`.
const MAX_RETRY_AFTER_JITTER: Duration = Duration::from_secs(3600);

/// Builds a [`Policy`].
#[derive(Debug)]
#[must_use]
pub struct PolicyBuilder<K> {
    key: K,
    /// Whether [`key`](Self::key) was called: a policy counts requests against a key chosen on
    /// purpose, never against a default that might not work where it runs.
    keyed: bool,
    /// Everything else, which a [`key`](Self::key) call carries over whole.
    pub(crate) opts: Options,
}

impl<K> PolicyBuilder<K> {
    /// Bans keys that are limited too often (see [`Penalty`]).
    pub fn penalty(mut self, penalty: Penalty) -> Self {
        self.opts.penalty = Some(penalty);
        self
    }

    /// The quota (required, unless [`quotas`](Self::quotas) gives several).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.opts.quotas = vec![quota];
        self.opts.extras.quota_keys.clear();
        self
    }

    /// Stacked quotas, such as 10 a second **and** 1,000 a day: a request passes only if every
    /// quota admits it, and a rejection by one consumes none of the others (the backend decides them
    /// in one atomic step). `RateLimit-Policy` and `RateLimit` list every quota. At most 16; each gets
    /// its own limit, named after the policy and its period (`api.1s`, `api.1d`).
    ///
    /// ```
    /// use tower_throttle::{key::PeerIp, Policy, Quota};
    ///
    /// let api = Policy::builder("api")
    ///     .key(PeerIp::new())
    ///     .quotas([Quota::per_second(10), Quota::per_day(1000)])
    ///     .build()
    ///     .unwrap();
    /// let names: Vec<&str> = api.limits().iter().map(|l| l.name()).collect();
    /// assert_eq!(names, ["api.1s", "api.1d"]);
    /// ```
    pub fn quotas(mut self, quotas: impl IntoIterator<Item = Quota>) -> Self {
        self.opts.quotas = quotas.into_iter().collect();
        self.opts.extras.quota_keys.clear();
        self
    }

    /// The algorithm (default [`Algorithm::Gcra`]). For the others, each quota is `count` per
    /// `period` (or `count` in flight) and `max_burst` is not used.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.opts.algorithm = algorithm;
        self
    }

    /// Delay mode, as nginx's `burst` + `delay`: a request beyond the quota's burst waits up to
    /// `max_delay` for its turn instead of being rejected (see [`Limit::with_delay`]). GCRA only.
    /// The wait is a `tokio::time::sleep`, so it needs a tokio runtime with timers (any
    /// `#[tokio::main]` server; without one a delayed request gets a 503). A rejected request's
    /// `Retry-After` says when a retry would be admitted, possibly to wait again then.
    pub fn delay(mut self, max_delay: Duration) -> Self {
        self.opts.delay = Some(max_delay);
        self
    }

    /// Leased budgets for hot keys on Redis (see [`Budget`]): a process takes slices of a hot
    /// key's budget and admits from them locally, never more than Redis granted. GCRA only, one
    /// quota (tiers are fine), no penalty nor delay: the others are refused by `build`.
    /// Per-customer quotas ([`quota_from`](Self::quota_from)) are decided per request as before.
    ///
    /// ```
    /// use tower_throttle::{key::PeerIp, policy::Budget, Policy, Quota};
    ///
    /// let api = Policy::builder("api").key(PeerIp::new()).quota(Quota::per_second(5000)).budget(Budget::new()).build();
    /// assert!(api.is_ok());
    /// ```
    pub fn budget(mut self, budget: Budget) -> Self {
        self.opts.budget = Some(budget);
        self
    }

    /// For [`Algorithm::Concurrency`] on Redis: how long a slot's lease lives if its process dies
    /// before giving it back (default 60 s; see [`Limit::with_lease`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.opts.lease = Some(lease);
        self
    }

    /// Dry run: decide, count, log and send the rate-limit headers, but never reject (nor delay,
    /// nor ban; a [penalty](Self::penalty) is not applied) — for rolling a limit out safely. A
    /// request without a key passes, and so does every request while the backend fails. Requests
    /// that would have been limited are logged at info level ("request would be limited (dry
    /// run)"), counted as limited in the metrics, and carry a [`PolicyDecision`] extension with
    /// `enforced: false`.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.opts.dry_run = dry_run;
        self
    }

    /// Quotas that bite only under pressure: the policy's limits are enforced only while the
    /// layer's [overload gate](crate::overload) says the service is under pressure (a request
    /// was shed within the last second, or the requests in flight are within a tenth of its
    /// limit); otherwise a request over them passes and is counted as would-limit
    /// (`throttle_requests_would_limit_total`), as a [staged](Self::enforce_fraction) policy's
    /// key outside its share. Generous until it matters. The layer must have an overload gate
    /// ([`ThrottleLayerBuilder::overload`](crate::ThrottleLayerBuilder::overload)): without one
    /// the layer fails to build.
    pub fn under_pressure_only(mut self, on: bool) -> Self {
        self.opts.under_pressure = on;
        self
    }

    /// A tier (plan) with its own quotas, such as `"paid"`, chosen per request by a [`Tier`]
    /// extension or the [tier header](Self::tier_header); requests of no known tier get the default
    /// quotas ([`quota`](Self::quota) / [`quotas`](Self::quotas)). Each tier's limits are named
    /// `{policy}.{tier}`, so tiers never share state.
    ///
    /// ```
    /// use tower_throttle::{key::Header, Policy, Quota};
    ///
    /// let api = Policy::builder("api")
    ///     .key(Header::new("x-api-key"))
    ///     .quota(Quota::per_minute(60))
    ///     .tier("paid", [Quota::per_minute(6000)])
    ///     .tier_header("x-plan")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(api.tier_limits("paid").unwrap()[0].name(), "api.paid");
    /// ```
    pub fn tier(
        mut self,
        name: impl Into<String>,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Self {
        self.opts
            .tiers
            .push((name.into(), quotas.into_iter().collect()));
        self
    }

    /// Reads the tier from this request header when no [`Tier`] extension is present. Only use a
    /// header that something you trust sets (a gateway that authenticated the caller) and that
    /// clients cannot send themselves: otherwise anyone can claim the paid tier. A request that
    /// has the header more than once gets the default tier.
    pub fn tier_header(mut self, name: impl Into<String>) -> Self {
        self.opts.tier_header = Some(name.into());
        self
    }

    /// What the policy's requests count against (required): the client's address
    /// ([`PeerIp`](crate::key::PeerIp), or [`ClientIp`](crate::key::ClientIp) behind proxies), a
    /// header, a query parameter, a cookie, a route parameter, one key for everyone
    /// ([`Global`](crate::key::Global)), several of these ([`Composite`](crate::key::Composite)),
    /// a closure — see [`key`](crate::key).
    pub fn key<K2>(self, key: K2) -> PolicyBuilder<K2> {
        PolicyBuilder {
            key,
            keyed: true,
            opts: self.opts,
        }
    }

    /// Units each request costs (default 1; at least 1 and at most the limit).
    pub fn cost(mut self, cost: u64) -> Self {
        self.opts.cost = cost;
        self
    }

    /// Applies the policy to these methods only (default: every method).
    ///
    /// A request's method is compared exactly with each one, as HTTP says (methods are
    /// case-sensitive: `Method::from_bytes(b"get")` is not `GET`), with one addition: `GET`
    /// includes `HEAD`, which runs the same handler in axum. Only the standard methods are accepted
    /// here (`GET`, `HEAD`, `POST`, `PUT`, `DELETE`, `PATCH`, `OPTIONS`, `CONNECT`, `TRACE`):
    /// anything else is an error at [`build`](Self::build), so that a typo such as `PSOT` cannot
    /// leave `POST` unlimited. List other methods with [`custom_methods`](Self::custom_methods).
    ///
    /// ```
    /// use http::Method;
    /// use tower_throttle::{key::PeerIp, Policy, Quota};
    ///
    /// let typo = Method::from_bytes(b"PSOT").unwrap();
    /// let err = Policy::builder("writes")
    ///     .key(PeerIp::new())
    ///     .quota(Quota::per_second(5))
    ///     .methods([typo])
    ///     .build()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains(r#"method "PSOT" is not a standard HTTP method (did you mean "POST"?)"#));
    /// ```
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.opts.methods = Some(methods.into_iter().collect());
        self
    }

    /// Also applies the policy to these non-standard methods, such as WebDAV's `PROPFIND`: the
    /// explicit opt-in that [`methods`](Self::methods) asks for. They are compared exactly (case
    /// included). Standard methods belong in `methods` and are an error here.
    ///
    /// ```
    /// use http::Method;
    /// use tower_throttle::{key::PeerIp, Policy, Quota};
    ///
    /// let dav = Policy::builder("dav")
    ///     .key(PeerIp::new())
    ///     .quota(Quota::per_second(5))
    ///     .methods([Method::PUT])
    ///     .custom_methods([Method::from_bytes(b"PROPFIND").unwrap()])
    ///     .build()
    ///     .unwrap();
    /// let propfind = http::Request::builder().method("PROPFIND").uri("/").body(()).unwrap();
    /// assert!(dav.applies_to(&propfind));
    /// ```
    pub fn custom_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.opts.custom_methods = Some(methods.into_iter().collect());
        self
    }

    /// Applies the policy to one route only, in axum 0.8 path syntax (`/users/{id}`,
    /// `/files/{*path}`, `/v{version}/status`; `{{` and `}}` are literal braces). Only needed for a
    /// layer that holds several policies; a layer added with `route_layer` to one route applies to
    /// that route anyway.
    ///
    /// With the `axum` feature and a layer added by `Router::layer`, the route is compared with the
    /// request's `MatchedPath` up to the names of its parameters (`/users/{user_id}` names the
    /// router's `/users/{id}`): the full path (`/api/users/{id}`), or, for a layer inside
    /// `Router::nest("/api", ..)`, also the nested router's own path (`/users/{id}`). Otherwise
    /// (outside axum, or a layer around the whole router) axum's own matcher (`matchit`) matches
    /// the request's path, exactly as a router holding only this route would: `{name}` is one
    /// segment (an empty one only before more of the path: `/users//posts` matches
    /// `/users/{id}/posts`, `/users/` does not match `/users/{id}`), `{*name}` one or more
    /// characters after the slash (`/files/{*path}` matches neither `/files` nor `/files/`), and
    /// the path is not decoded (`%2F` is not a slash).
    ///
    /// A pattern that no request path can match is an error at [`build`](Self::build): one without
    /// a leading `/`, with a space, control character, `?` or `#`, or in axum 0.7 syntax (`:id`,
    /// `*rest`), which axum 0.8 refuses.
    pub fn route(mut self, pattern: impl Into<String>) -> Self {
        self.opts.route = Some(pattern.into());
        self
    }

    /// Applies the policy only to requests that meet `condition` too (a header, the host, a query
    /// parameter: see [`Condition`]). Called several times, a request must meet every condition;
    /// a request that meets no policy's route, methods and conditions passes unlimited. An invalid
    /// condition is an error when the policy is built.
    pub fn when(mut self, condition: Condition) -> Self {
        self.opts.conditions.push(condition);
        self
    }

    /// Near the limit: an admitted request that leaves one of the policy's limits used to at least
    /// `ratio` (0.8: 80 %) is counted in `throttle_requests_near_limit_total{policy,limit}` and
    /// shown to the layer's [`on_near_limit`](crate::ThrottleLayerBuilder::on_near_limit) hook — a
    /// warning before the 429. A ratio outside (0, 1] is an error when the policy is built.
    pub fn near_limit(mut self, ratio: f64) -> Self {
        self.opts.near_limit = Some(ratio);
        self
    }

    /// With [`near_limit`](Self::near_limit): also name the limits a request came near to its
    /// handler, in the request header
    /// [`x-ratelimit-near`](crate::ops::NEAR_LIMIT_HEADER) (removed from the policy's other
    /// requests, so that a client cannot send it).
    pub fn near_limit_header(mut self, on: bool) -> Self {
        self.opts.near_limit_header = on;
        self
    }

    /// Adds up to `max` at random to each refusal's `Retry-After` (and gRPC pushback): clients
    /// that share a key, or were refused together, then come back spread over `max` instead of in
    /// the same second. Only ever later than the limit asks, never earlier. At most an hour.
    pub fn retry_after_jitter(mut self, max: Duration) -> Self {
        self.opts.retry_after_jitter = Some(max);
        self
    }

    /// Where a fixed window's boundaries fall: on the Unix epoch for every key (the default, "100
    /// per calendar minute"), or at each key's own phase ([`WindowStart::PerKey`]), derived from a
    /// hash of the key (stable; every process and backend agree), so that the keys' windows do not
    /// all reset at one instant. Only for [`Algorithm::FixedWindow`]: another algorithm with
    /// `PerKey` is an error when the policy is built.
    pub fn window_start(mut self, start: WindowStart) -> Self {
        self.opts.window_start = start;
        self
    }

    /// Fixed windows on the calendar of a time zone, with the rules of
    /// [`Limit::with_calendar`](crate::Limit::with_calendar), checked when the policy is built
    /// (feature `calendar`; the policies guide's *Calendar periods*, `guide::policies`).
    ///
    /// ```
    /// use tower_throttle::key::Header;
    /// use tower_throttle::window::CalendarWindow;
    /// use tower_throttle::{Algorithm, Policy, Quota};
    ///
    /// let typo = Policy::builder("daily")
    ///     .key(Header::new("x-customer-id"))
    ///     .algorithm(Algorithm::FixedWindow)
    ///     .quota(Quota::per_day(100))
    ///     .calendar(CalendarWindow::day().timezone("Europe/Pariss"))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(typo.to_string().contains("unknown time zone \"Europe/Pariss\""));
    /// ```
    pub fn calendar(mut self, calendar: CalendarWindow) -> Self {
        self.opts.calendar = Some(calendar);
        self
    }

    /// What to do when a request has no key (default: reject with 400).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.opts.missing_key = missing_key;
        self
    }

    /// Validates the policy.
    pub fn build(mut self) -> Result<Policy<K>, BuildError> {
        validate_name(&self.opts.name)?;
        compat::check(&self.opts.name, &compat::features(&self.opts))?;
        self.check_quota_keys()?;
        let invalid =
            |why: String| BuildError::Invalid(format!("policy {:?}: {why}", self.opts.name));
        if !self.keyed {
            return Err(invalid(NO_KEY.into()));
        }
        let metered = std::mem::take(&mut self.opts.extras.metered);
        if self.opts.quotas.is_empty() && metered.limit.is_none() {
            return Err(invalid("a quota is required".into()));
        }
        let tier_header = self
            .opts
            .tier_header
            .as_deref()
            .map(|h| {
                HeaderName::try_from(h)
                    .map_err(|_| invalid(format!("tier_header {h:?} is not a valid header name")))
            })
            .transpose()?;
        if tier_header.is_some() && self.opts.tiers.is_empty() {
            return Err(invalid("tier_header is set but no tier is defined".into()));
        }
        let mut tiers = Vec::with_capacity(self.opts.tiers.len() + 1);
        let mut limits = match self.opts.quotas.len() {
            0 => Vec::new(),
            _ => self
                .limits_of(
                    &self.opts.name,
                    &self.opts.quotas,
                    &self.opts.extras.quota_keys,
                )?
                .into_vec(),
        };
        let metered = metered.build(&self.opts.name, limits.len())?;
        let metered = match metered {
            Some((limit, rule)) => {
                self.check_metered(&limits, &limit)?;
                limits.push(limit);
                Some(rule)
            }
            None => None,
        };
        tiers.push(CompiledTier::of(None, &limits));
        for (tier, quotas) in &self.opts.tiers {
            validate_name(tier).map_err(|e| invalid(format!("tier: {e}")))?;
            if tier.contains('.') {
                // Limit names join policy, tier and period with dots: "api.paid.1s".
                return Err(invalid(format!("tier {tier:?} may not contain '.'")));
            }
            if tier == "override" {
                // Its limit would be "api.override", where operators' override quotas count.
                return Err(invalid(
                    "tier \"override\" is reserved: the policy's override quotas count under \
                     <policy>.override; rename the tier"
                        .to_owned(),
                ));
            }
            if tiers
                .iter()
                .any(|t| t.name.as_deref() == Some(tier.as_str()))
            {
                return Err(invalid(format!("tier {tier:?} is defined twice")));
            }
            if quotas.is_empty() {
                return Err(invalid(format!("tier {tier:?} has no quota")));
            }
            let limits = self.limits_of(&format!("{}.{tier}", self.opts.name), quotas, &[])?;
            tiers.push(CompiledTier::of(Some(tier.as_str().into()), &limits));
        }
        Self::check_names(&tiers).map_err(invalid)?;
        // The cost is what each request takes from every limit but a metered one (which takes
        // its estimate); a policy with only a metered limit has no other.
        let max_cost = tiers
            .iter()
            .flat_map(|t| t.limits.iter())
            .filter(|l| !l.is_metered())
            .map(Limit::max_cost)
            .min()
            .unwrap_or(if metered.is_some() { u64::MAX } else { 0 });
        if self.opts.cost == 0 || self.opts.cost > max_cost {
            return Err(BuildError::Cost {
                policy: self.opts.name.clone(),
                cost: self.opts.cost,
                limit: max_cost,
            });
        }
        let name: Arc<str> = self.opts.name.as_str().into();
        if let MissingKey::Reject(status) = self.opts.missing_key
            && !status.is_client_error()
        {
            return Err(invalid(format!(
                "a request without a key must be rejected with a 4xx status, not {status}"
            )));
        }
        let methods = methods_of(self.opts.methods, self.opts.custom_methods).map_err(invalid)?;
        let route = self
            .opts
            .route
            .map(|r| Route::parse(&r))
            .transpose()
            .map_err(invalid)?;
        let conditions = self
            .opts
            .conditions
            .into_iter()
            .map(Condition::into_rule)
            .collect::<Result<Box<[_]>, String>>()
            .map_err(|why| invalid(format!("when: {why}")))?;
        let near = match (self.opts.near_limit, self.opts.near_limit_header) {
            (Some(ratio), header) => {
                Some(NearRule::new(&self.opts.name, ratio, header).map_err(BuildError::Invalid)?)
            }
            (None, true) => return Err(invalid("near_limit_header needs near_limit".into())),
            (None, false) => None,
        };
        if let Some(jitter) = self.opts.retry_after_jitter
            && (jitter.is_zero() || jitter > MAX_RETRY_AFTER_JITTER)
        {
            return Err(invalid(format!(
                "retry_after_jitter must be above 0 and at most {MAX_RETRY_AFTER_JITTER:?}, not {jitter:?}"
            )));
        }
        let taken: Vec<&str> = tiers
            .iter()
            .flat_map(|t| t.limits.iter().map(Limit::name))
            .collect();
        let (staged, shadows) = self.opts.rollout.build(
            &self.opts.name,
            self.opts.algorithm,
            self.opts.cost,
            period_label,
            &taken,
        )?;
        drop(taken);
        // A shadow limit counts in the policy's windows: its calendar, each key's own phase.
        let calendar = &self.opts.calendar;
        let shadows = (shadows.into_vec().into_iter())
            .map(|limit| {
                let limit = limit.with_window_start(self.opts.window_start)?;
                calendar
                    .iter()
                    .try_fold(limit, |l, c| l.with_calendar(c.clone()))
            })
            .collect::<Result<_, BuildError>>()?;
        let mut extras = self.opts.extras;
        extras.shadows = shadows;
        let extras = extras.build(&self.opts.name, &tiers[0].limits[0], metered)?;
        let spec = PolicySpec {
            name,
            tiers: tiers.into(),
            tier_header,
            dry_run: self.opts.dry_run,
            under_pressure: self.opts.under_pressure,
            staged,
            cost: self.opts.cost,
            methods,
            route,
            conditions,
            near,
            retry_after_jitter: self.opts.retry_after_jitter,
            missing_key: self.opts.missing_key,
            extras,
        };
        let compiled = CompiledPolicy::new(spec, false, false, std::iter::empty());
        Ok(Policy {
            key: self.key,
            compiled: Arc::new(compiled),
        })
    }
}

/// Limits per customer, async keys and counting by outcome (`per_customer.rs`, `outcome.rs`).
impl<K> PolicyBuilder<K> {
    /// The quota of each request from the request itself: `quota` sees its parts and its key and
    /// returns the customer's quota, or `None` for the policy's own (its [tiers](Self::tier), else
    /// its default quota). The quota takes the policy's algorithm, delay, lease and penalty, and
    /// state stays per key under the policy's name: a customer whose plan changes keeps its state,
    /// rebased on the new quota (a GCRA backlog beyond the new burst counts as a full bucket).
    /// A quota that cannot be enforced (count 0, less than the cost, beyond the backend's range) is
    /// logged and the policy's own applies. The `RateLimit-Policy` field names the quota that applied.
    /// With a single default quota, the customer's and the policy's own quota share the key's state;
    /// a policy's stack of quotas or its tiers count apart (under their own names), so a key that
    /// falls back to them starts afresh there. [`ThrottleHandle::reset`](crate::ops::ThrottleHandle::reset)
    /// forgets both; [`peek`](crate::ops::ThrottleHandle::peek) shows the policy's own limits.
    ///
    /// The quota should be a function of the key (a plan): a key whose requests alternate between
    /// two quotas is decided under each in turn. An example is in the policies guide's *Limits per
    /// customer* (`guide::policies`).
    pub fn quota_from<F>(mut self, quota: F) -> Self
    where
        F: Fn(&http::request::Parts, &crate::key::Key) -> Option<Quota> + Send + Sync + 'static,
    {
        self.opts.extras.quotas.quota_from = Some(Arc::new(quota));
        self
    }

    /// The quota of each request's key from a [`QuotaResolver`], which may
    /// wait (a plan looked up in the application's database; keep a cache, as the resolver's
    /// example does). As [`quota_from`](Self::quota_from) otherwise.
    ///
    /// **When the resolver fails** (an error, or no answer within the
    /// [timeout](Self::resolver_timeout)), the request gets the policy's own quota (its tiers, else
    /// its default), and the failure is logged at warn (at most once a second): a plan database that
    /// is down must neither stop the API nor lift its limits, and the default quota is the one
    /// limit known to be safe for anyone.
    ///
    /// ```
    /// use tower_throttle::{key::Header, Key, Policy, Quota};
    ///
    /// let api = Policy::builder("api")
    ///     .key(Header::new("x-api-key"))
    ///     .quota(Quota::per_second(10))
    ///     .quota_resolver(|_parts: &http::request::Parts, key: &Key| {
    ///         let pro = key.to_string().starts_with("pro_");
    ///         async move { Ok::<_, std::io::Error>(pro.then(|| Quota::per_second(100))) }
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = api;
    /// ```
    pub fn quota_resolver(mut self, resolver: impl crate::per_customer::QuotaResolver) -> Self {
        self.opts.extras.quotas.resolver = Some(Arc::new(resolver));
        self
    }

    /// How long the [quota resolver](Self::quota_resolver) may take (default 100 ms, the Redis
    /// backend's default timeout); past it the policy's own quota applies.
    pub fn resolver_timeout(mut self, timeout: Duration) -> Self {
        self.opts.extras.quotas.resolve_timeout = Some(timeout);
        self
    }

    /// Keys from an [`AsyncKey`](crate::key::AsyncKey) instead of [`key`](Self::key): an API key
    /// validated before it is counted, or an axum extractor the application already has. A request
    /// whose key is refused gets the [missing-key](MissingKey) answer.
    pub fn async_key(mut self, key: crate::key::AsyncKey) -> Self {
        self.opts.extras.async_key = Some(key);
        self.keyed = true;
        self
    }

    /// Counts only the requests whose response `counts` accepts; the others are given back
    /// ([`Adjustment::Refund`](crate::backend::Adjustment::Refund)), exactly under concurrency
    /// (the policies guide's *Counting by outcome*). On a login route,
    /// `count_only(|s| s == 401 || s == 403)` limits failed attempts and never a user who logs in.
    /// A request whose response never comes counts. A gRPC call is judged by the `grpc-status` in
    /// its response headers, as a handler's error is sent (`UNAUTHENTICATED` as `401`,
    /// `PERMISSION_DENIED` as `403`, gRPC's HTTP mapping); a call that sends a body is judged by
    /// its HTTP status. Not for concurrency limits.
    pub fn count_only<F>(mut self, counts: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.opts.extras.outcome.count_only = Some(Arc::new(counts));
        self
    }

    /// Gives back the units of requests whose response `refund` accepts, such as server errors
    /// (`refund_on(|s| s.is_server_error())`): a client is not charged for the server's failures.
    /// As [`count_only`](Self::count_only) otherwise (with both, a response counts when
    /// `count_only` accepts it and `refund_on` does not). A response that never comes counts,
    /// whatever `refund` says, as under `count_only`.
    pub fn refund_on<F>(mut self, refund: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.opts.extras.outcome.refund_on = Some(Arc::new(refund));
        self
    }
}

/// A period as a short label for limit names: `1s`, `500ms`, `1m`, `1h`, `1d`, `90s`.
fn period_label(period: Duration) -> String {
    let nanos = period.as_nanos();
    let units: [(u128, &str); 7] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let (size, unit) = units
        .into_iter()
        .find(|(size, _)| nanos.is_multiple_of(*size))
        .unwrap_or((1, "ns"));
    format!("{}{unit}", nanos / size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PeerIp;

    /// Policy "p" on the peer IP at 5 a second.
    fn p() -> PolicyBuilder<PeerIp> {
        Policy::builder("p")
            .key(PeerIp::new())
            .quota(Quota::per_second(5))
    }

    fn err(builder: PolicyBuilder<PeerIp>) -> String {
        builder.build().unwrap_err().to_string()
    }

    #[test]
    fn methods_are_standard_unless_opted_in() {
        let method = |m: &str| Method::from_bytes(m.as_bytes()).unwrap();
        assert_eq!(
            err(p().methods([method("PSOT")])),
            r#"policy "p": method "PSOT" is not a standard HTTP method (did you mean "POST"?); list a non-standard method in custom_methods"#
        );
        // Methods are case-sensitive: a lowercase `get` is another method.
        assert!(err(p().methods([method("get")])).contains(r#"(did you mean "GET"?)"#));
        assert!(!err(p().methods([method("PROPFIND")])).contains("did you mean"));
        assert!(err(p().custom_methods([Method::POST])).contains("list it in methods"));
        let lower = Method::from_bytes(b"get").unwrap();
        assert!(err(p().custom_methods([lower]))
            .contains(r#""get" is a standard method "GET" (methods are case-sensitive)"#));
        assert!(err(p().custom_methods([])).contains("custom_methods is empty"));

        let propfind = method("PROPFIND");
        let dav = p()
            .methods([Method::GET])
            .custom_methods([propfind.clone()]);
        let dav = dav.build().unwrap();
        let request = |m: &Method| Request::builder().method(m).body(()).unwrap();
        for (m, applies) in [
            (&Method::GET, true),
            (&Method::HEAD, true),
            (&propfind, true),
            (&Method::POST, false),
            (&method("propfind"), false),
        ] {
            assert_eq!(dav.applies_to(&request(m)), applies, "{m}");
        }
        let only_custom = p().custom_methods([propfind.clone()]).build().unwrap();
        assert!(only_custom.applies_to(&request(&propfind)));
        assert!(!only_custom.applies_to(&request(&Method::GET)));
    }

    #[test]
    fn bad_policies_are_errors() {
        let unkeyed = Policy::builder("p").key(PeerIp::new());
        assert!(err(unkeyed).contains("quota is required"));
        let bad_name = Policy::builder("bad name").key(PeerIp::new());
        assert!(err(bad_name.quota(Quota::per_second(5))).contains("may only contain"));
        let server_error = MissingKey::Reject(StatusCode::INTERNAL_SERVER_ERROR);
        for (builder, says) in [
            (p().cost(0), "cost must be at least 1"),
            (p().cost(6), "exceeds the limit 5"),
            (p().methods([]), "methods is empty"),
            (p().route("x"), "must start with '/'"),
            (p().route("/users/:id"), "axum 0.7 syntax"),
            (p().on_missing_key(server_error), "4xx"),
        ] {
            let err = err(builder);
            assert!(err.contains(says), "{err}");
        }
    }
}

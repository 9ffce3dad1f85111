//! Limits per customer: a policy's quota from the request ([`PolicyBuilder::quota_from`], a
//! [`QuotaResolver`] that may be async), and what else a policy may decide per request, off the fast
//! path: an async key ([`AsyncKey`](crate::key::AsyncKey)), a key from the body
//! ([`BodyField`](crate::key::BodyField)) and counting by outcome
//! ([`PolicyBuilder::count_only`]). A policy that uses none of them costs one `Option` check per
//! request.
//!
//! [`PolicyBuilder::quota_from`]: crate::PolicyBuilder::quota_from
//! [`PolicyBuilder::count_only`]: crate::PolicyBuilder::count_only

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::request::Parts;

use crate::error::BuildError;
use crate::key::body::BodyRule;
use crate::key::{AsyncKey, BodyField, Key, KeySpec, DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY};
use crate::limit::{Algorithm, Limit};
use crate::meter::MeterRule;
use crate::observe::ResolveLog;
use crate::outcome::OutcomeRule;
use crate::policy::tier::CompiledTier;
use crate::quota::Quota;

/// An error from a [`QuotaResolver`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future of [`QuotaResolver::resolve`]: the key's quota, `None` for the policy's own.
pub type QuotaFuture = Pin<Box<dyn Future<Output = Result<Option<Quota>, BoxError>> + Send>>;

/// Finds the quota of a request's key, possibly asynchronously (the customer's plan in the
/// application's database): see [`PolicyBuilder::quota_resolver`](crate::PolicyBuilder::quota_resolver).
///
/// Implemented for closures `Fn(&Parts, &Key) -> impl Future<Output = Result<Option<Quota>, E>>`;
/// the future must own what it needs (clone it out of the parts first).
///
/// A resolver is asked for every request of its policy, so it should answer from a cache: the
/// example keeps each plan for a minute and asks the database only on a miss.
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex};
/// use std::time::{Duration, Instant};
/// use http::request::Parts;
/// use tower_throttle::{policy::{QuotaFuture, QuotaResolver}, Key, Quota};
///
/// /// The application's plans table (a database in real life).
/// async fn plan_of(customer: String) -> Result<&'static str, std::io::Error> {
///     Ok(if customer == "acme" { "enterprise" } else { "free" })
/// }
///
/// #[derive(Clone, Default)]
/// struct Plans {
///     cache: Arc<Mutex<HashMap<Key, (Quota, Instant)>>>,
/// }
///
/// impl QuotaResolver for Plans {
///     fn resolve(&self, _parts: &Parts, key: &Key) -> QuotaFuture {
///         let cached = self.cache.lock().unwrap().get(key).copied();
///         if let Some((quota, at)) = cached.filter(|(_, at)| at.elapsed() < Duration::from_secs(60)) {
///             return Box::pin(std::future::ready(Ok(Some(quota))));
///         }
///         let (cache, key) = (self.cache.clone(), key.clone());
///         Box::pin(async move {
///             let quota = match plan_of(key.to_string()).await? {
///                 "enterprise" => Quota::per_second(1000),
///                 _ => Quota::per_second(10),
///             };
///             cache.lock().unwrap().insert(key, (quota, Instant::now()));
///             Ok(Some(quota))
///         })
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let plans = Plans::default();
/// let parts = http::Request::new(()).into_parts().0;
/// let quota = plans.resolve(&parts, &Key::from("acme")).await.unwrap();
/// assert_eq!(quota, Some(Quota::per_second(1000)));
/// assert!(plans.cache.lock().unwrap().contains_key(&Key::from("acme")));
/// # });
/// ```
pub trait QuotaResolver: Send + Sync + 'static {
    /// The quota of `key` for this request, `None` for the policy's own (its tiers, else its
    /// default quota). An error, like an answer slower than the
    /// [resolver timeout](crate::PolicyBuilder::resolver_timeout), gives the policy's own quota.
    fn resolve(&self, parts: &Parts, key: &Key) -> QuotaFuture;
}

impl<F, Fut, E> QuotaResolver for F
where
    F: Fn(&Parts, &Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Quota>, E>> + Send + 'static,
    E: Into<BoxError>,
{
    fn resolve(&self, parts: &Parts, key: &Key) -> QuotaFuture {
        let future = self(parts, key);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

pub(crate) type QuotaFn = dyn Fn(&Parts, &Key) -> Option<Quota> + Send + Sync;

/// How long a resolver may take by default: as long as the Redis backend's default timeout.
pub(crate) const DEFAULT_RESOLVE_TIMEOUT: Duration = Duration::from_millis(100);

/// At most this many distinct per-customer quotas are kept ready per policy (a quota is a plan, so
/// there are few); past it the table starts again.
const MAX_CUSTOM_QUOTAS: usize = 1024;

/// What a policy's builder collects for the per-request features.
#[derive(Default)]
pub(crate) struct ExtrasBuilder {
    pub(crate) quota_from: Option<Arc<QuotaFn>>,
    pub(crate) resolver: Option<Arc<dyn QuotaResolver>>,
    pub(crate) resolve_timeout: Option<Duration>,
    pub(crate) async_key: Option<AsyncKey>,
    /// A key from the body ([`PolicyBuilder::body_key`](crate::PolicyBuilder::body_key)), and
    /// how much of it may be read, for how long.
    pub(crate) body_key: Option<BodyField>,
    pub(crate) max_body: Option<usize>,
    pub(crate) body_timeout: Option<Duration>,
    pub(crate) outcome: OutcomeRule,
    pub(crate) metered: crate::meter::MeteredBuilder,
    /// Shadow limits (`rollout/`), decided beside the policy's own on the extended path.
    pub(crate) shadows: Box<[Limit]>,
    /// The key of each quota that has one of its own
    /// ([`PolicyBuilder::quota_keyed`](crate::PolicyBuilder::quota_keyed)), by the quota's place
    /// (`None`, or missing: the policy's key); empty when none has.
    pub(crate) quota_keys: Vec<Option<KeySpec>>,
}

impl fmt::Debug for ExtrasBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtrasBuilder")
            .field("quota_from", &self.quota_from.is_some())
            .field("resolver", &self.resolver.is_some())
            .field("async_key", &self.async_key)
            .field("body_key", &self.body_key)
            .field("outcome", &self.outcome)
            .field("shadows", &self.shadows)
            .field("quota_keys", &self.quota_keys)
            .finish()
    }
}

impl ExtrasBuilder {
    /// The extras of a policy named `name` whose default limit is `template`, or `None` when it
    /// uses none (its requests then take the fast path). `metered`: the rule of its metered limit,
    /// if it has one (built by [`MeteredBuilder`](crate::meter::MeteredBuilder)).
    pub(crate) fn build(
        self,
        name: &str,
        template: &Limit,
        metered: Option<MeterRule>,
    ) -> Result<Option<Arc<PolicyExtras>>, BuildError> {
        let invalid = |why: &str| BuildError::Invalid(format!("policy {name:?}: {why}"));
        if self.resolve_timeout.is_some() && self.resolver.is_none() {
            return Err(invalid(
                "resolver_timeout is set but there is no quota_resolver",
            ));
        }
        if self.resolve_timeout.is_some_and(|t| t.is_zero()) {
            return Err(invalid("resolver_timeout must be more than 0"));
        }
        if self
            .async_key
            .as_ref()
            .is_some_and(|k| k.timeout_value().is_zero())
        {
            return Err(invalid("the async key's timeout must be more than 0"));
        }
        let keyed = !self.quota_keys.is_empty();
        let body = self
            .body_rule(metered.as_ref())
            .map_err(|why| invalid(&why))?;
        if self.quota_from.is_none()
            && self.resolver.is_none()
            && self.async_key.is_none()
            && body.is_none()
            && !self.outcome.is_set()
            && self.shadows.is_empty()
            && metered.is_none()
            && !keyed
        {
            return Ok(None);
        }
        Ok(Some(Arc::new(PolicyExtras {
            name: name.into(),
            template: template.clone(),
            quota_from: self.quota_from,
            resolver: self.resolver,
            resolve_timeout: self.resolve_timeout.unwrap_or(DEFAULT_RESOLVE_TIMEOUT),
            async_key: self.async_key,
            body,
            outcome: self.outcome.is_set().then(|| Arc::new(self.outcome)),
            metered,
            custom: Mutex::new(HashMap::new()),
            overridden: Mutex::new(HashMap::new()),
            override_name: override_name(name),
            log: ResolveLog::default(),
            shadows: self.shadows,
            limit_keys: keyed.then(|| self.quota_keys.into()),
        })))
    }
}

impl ExtrasBuilder {
    /// What the policy reads from the body (its key, its metered estimate), if anything.
    fn body_rule(&self, metered: Option<&MeterRule>) -> Result<Option<BodyRule>, String> {
        let estimate = metered.and_then(|m| m.estimate.body_field());
        if self.body_key.is_none() && estimate.is_none() {
            if self.max_body.is_some() || self.body_timeout.is_some() {
                return Err(
                    "max_body and body_timeout are set but nothing reads the body (a \
                     body key or a metered estimate from the body)"
                        .into(),
                );
            }
            return Ok(None);
        }
        if self.max_body == Some(0) {
            return Err("max_body must be at least 1 byte".into());
        }
        if self.body_timeout.is_some_and(|t| t.is_zero()) {
            return Err("body_timeout must be more than 0".into());
        }
        Ok(Some(BodyRule {
            key: self.body_key.clone(),
            max: self.max_body.unwrap_or(DEFAULT_MAX_BODY),
            timeout: self.body_timeout.unwrap_or(DEFAULT_BODY_TIMEOUT),
        }))
    }
}

/// The per-request features of one policy.
pub(crate) struct PolicyExtras {
    name: Arc<str>,
    /// The policy's default limit: per-customer limits take its algorithm, delay, lease and
    /// penalty.
    template: Limit,
    pub(crate) quota_from: Option<Arc<QuotaFn>>,
    pub(crate) resolver: Option<Arc<dyn QuotaResolver>>,
    pub(crate) resolve_timeout: Duration,
    pub(crate) async_key: Option<AsyncKey>,
    /// What it reads from the request body.
    pub(crate) body: Option<BodyRule>,
    pub(crate) outcome: Option<Arc<OutcomeRule>>,
    /// The metered limit's rule (its place in the stack, its estimate, its usage header).
    pub(crate) metered: Option<MeterRule>,
    /// The limits of each per-customer quota seen, made once.
    custom: Mutex<HashMap<Quota, Option<Arc<CustomerQuota>>>>,
    /// The limits of each override's quota seen, made once (`Namespace::Override`).
    overridden: Mutex<HashMap<Quota, Option<Arc<CustomerQuota>>>>,
    /// The name override quotas keep their state under.
    override_name: Arc<str>,
    pub(crate) log: ResolveLog,
    pub(crate) shadows: Box<[Limit]>,
    /// The key of each of the default tier's limits that has one of its own, by the limit's
    /// place (`None`, or missing: the policy's key); `None` when none has.
    pub(crate) limit_keys: Option<Box<[Option<KeySpec>]>>,
}

impl fmt::Debug for PolicyExtras {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyExtras")
            .field("quota_from", &self.quota_from.is_some())
            .field("resolver", &self.resolver.is_some())
            .field("async_key", &self.async_key)
            .field("body", &self.body)
            .field("outcome", &self.outcome)
            .field("metered", &self.metered)
            .finish_non_exhaustive()
    }
}

/// Where a quota chosen for one key keeps the key's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Namespace {
    /// A per-customer quota (`quota_from`, a resolver): under the policy's name, so that a key
    /// keeps its state when its plan changes (the GCRA rebases a TAT written under another
    /// quota, the windows read a count above the limit as full).
    Customer,
    /// An operator's override: under `<policy>.override`, so that a key whose limit is raised
    /// starts afresh under the new quota (a refused key's backlog, read under a raised GCRA
    /// quota, would otherwise still fill it), and finds its old state when the override goes.
    Override,
}

/// The name override quotas of policy `name` keep their state under: `<name>.override`, or the
/// policy's own name where that would be too long for a limit's name.
fn override_name(name: &str) -> Arc<str> {
    let own = format!("{name}.override");
    match crate::limit::validate_name(&own) {
        Ok(()) => own.into(),
        Err(_) => name.into(),
    }
}

/// The limit of one per-customer quota, and what the verdict needs of it.
pub(crate) struct CustomerQuota {
    pub(crate) limits: Box<[Limit]>,
    pub(crate) rules: CompiledTier,
}

impl PolicyExtras {
    /// The extras of a policy that uses none: what its requests take down the extended path while
    /// an override or a timed ban names one of its keys (`overrides/`), whose quota overrides
    /// are per-customer quotas.
    pub(crate) fn plain(name: &str, template: &Limit) -> Arc<PolicyExtras> {
        Arc::new(PolicyExtras {
            name: name.into(),
            template: template.clone(),
            quota_from: None,
            resolver: None,
            resolve_timeout: DEFAULT_RESOLVE_TIMEOUT,
            async_key: None,
            outcome: None,
            metered: None,
            custom: Mutex::new(HashMap::new()),
            overridden: Mutex::new(HashMap::new()),
            override_name: override_name(name),
            log: ResolveLog::default(),
            shadows: Box::new([]),
            body: None,
            limit_keys: None,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The limits of a `quota` chosen for one key, with the default limit's algorithm, delay,
    /// lease and penalty, kept in namespace `ns`. `None` for a quota that cannot be enforced
    /// (`validate` is the backend's check) or that `cost` exceeds: the request then gets the
    /// policy's own quota.
    pub(crate) fn custom_tier(
        &self,
        ns: Namespace,
        quota: Quota,
        cost: u64,
        validate: impl FnOnce(&Limit) -> Result<(), BuildError>,
    ) -> Option<Arc<CustomerQuota>> {
        let tiers = match ns {
            Namespace::Customer => &self.custom,
            Namespace::Override => &self.overridden,
        };
        let mut table = tiers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = table.get(&quota) {
            return known.clone();
        }
        let tier = match self.enforceable(ns, quota, cost, validate) {
            Ok(limit) => Some(Arc::new(CustomerQuota {
                rules: CompiledTier::of(None, std::slice::from_ref(&limit)),
                limits: Box::new([limit]),
            })),
            Err(e) => {
                self.log
                    .record(&self.name, "quota", &e.to_string(), "the policy's quota");
                None
            }
        };
        if table.len() >= MAX_CUSTOM_QUOTAS {
            table.clear();
        }
        table.insert(quota, tier.clone());
        tier
    }

    /// The limit of `quota` in namespace `ns`, or why it cannot be enforced for a request of
    /// `cost` (`validate` is the backend's check): what a quota chosen per key is made with, and
    /// what an override's quota is checked with before it is kept.
    pub(crate) fn enforceable(
        &self,
        ns: Namespace,
        quota: Quota,
        cost: u64,
        validate: impl FnOnce(&Limit) -> Result<(), BuildError>,
    ) -> Result<Limit, BuildError> {
        let limit = self.limit_for(ns, quota)?;
        validate(&limit)?;
        if cost > limit.max_cost() {
            return Err(BuildError::Cost {
                policy: self.name.to_string(),
                cost,
                limit: limit.max_cost(),
            });
        }
        Ok(limit)
    }

    /// A limit of namespace `ns` (its name, the policy's algorithm), when the policy may keep
    /// state there: what a reset must forget too. Per-customer quotas: when the policy chooses
    /// quotas per request; overrides: when `overridden` (an override gives the key a quota).
    pub(crate) fn namespace(&self, ns: Namespace, overridden: bool) -> Option<Limit> {
        let used = match ns {
            Namespace::Customer => self.quota_from.is_some() || self.resolver.is_some(),
            Namespace::Override => overridden,
        };
        used.then(|| self.limit_for(ns, *self.template.quota()).ok())?
    }

    fn limit_for(&self, ns: Namespace, quota: Quota) -> Result<Limit, BuildError> {
        let template = &self.template;
        let name = match ns {
            Namespace::Customer => &*self.name,
            Namespace::Override => &*self.override_name,
        };
        let mut limit = Limit::with_algorithm(name, template.algorithm(), quota)?;
        if let Some(penalty) = template.penalty() {
            limit = limit.with_penalty(*penalty);
        }
        if let Some(delay) = template.delay() {
            limit = limit.with_delay(delay)?;
        }
        if let (Algorithm::Concurrency, Some(lease)) = (template.algorithm(), template.lease()) {
            limit = limit.with_lease(lease)?;
        }
        Ok(limit)
    }
}

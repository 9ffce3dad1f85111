//! Quotas per customer: a policy's quota chosen per request ([`PolicyBuilder::quota_from`], a
//! [`QuotaResolver`] that may be async), and the quotas an operator's overrides give single keys. A
//! policy that chooses no quota per key pays nothing for it: its requests never come here.
//!
//! [`PolicyBuilder::quota_from`]: crate::PolicyBuilder::quota_from

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::slice;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::request::Parts;

use crate::error::BuildError;
use crate::key::Key;
use crate::limit::{Algorithm, Limit};
use crate::observe::ResolveLog;
use crate::policy::tier::CompiledTier;
use crate::quota::Quota;
use crate::timer::within;
use crate::window::WindowStart;

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
///             let mut cache = cache.lock().unwrap();
///             // Bounded: every key a client makes up comes here once.
///             if cache.len() >= 100_000 {
///                 cache.retain(|_, (_, at)| at.elapsed() < Duration::from_secs(60));
///                 if cache.len() >= 100_000 {
///                     cache.clear();
///                 }
///             }
///             cache.insert(key, (quota, Instant::now()));
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

/// A policy's quotas chosen per key: its closure or resolver, and the limits of each quota seen (a
/// customer's, or an override's), made once.
pub(crate) struct CustomerQuotas {
    name: Arc<str>,
    /// The policy's default limit: per-customer limits take its algorithm, delay, lease and
    /// penalty.
    template: Limit,
    quota_from: Option<Arc<QuotaFn>>,
    resolver: Option<Arc<dyn QuotaResolver>>,
    resolve_timeout: Duration,
    custom: Mutex<HashMap<Quota, Option<Arc<CompiledTier>>>>,
    overridden: Mutex<HashMap<Quota, Option<Arc<CompiledTier>>>>,
    override_name: Arc<str>,
    log: ResolveLog,
}

/// How a policy chooses a quota per key, as its builder collects it.
#[derive(Clone, Default)]
pub(crate) struct ChoosesQuota {
    pub(crate) quota_from: Option<Arc<QuotaFn>>,
    pub(crate) resolver: Option<Arc<dyn QuotaResolver>>,
    pub(crate) resolve_timeout: Option<Duration>,
}

impl ChoosesQuota {
    pub(crate) fn is_set(&self) -> bool {
        self.quota_from.is_some() || self.resolver.is_some()
    }

    pub(crate) fn invalid(&self) -> Option<&'static str> {
        if self.resolve_timeout.is_some() && self.resolver.is_none() {
            return Some("resolver_timeout is set but there is no quota_resolver");
        }
        if self.resolve_timeout.is_some_and(|t| t.is_zero()) {
            return Some("resolver_timeout must be more than 0");
        }
        None
    }
}

impl std::fmt::Debug for ChoosesQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChoosesQuota")
            .field("quota_from", &self.quota_from.is_some())
            .field("resolver", &self.resolver.is_some())
            .field("resolve_timeout", &self.resolve_timeout)
            .finish()
    }
}

impl CustomerQuotas {
    pub(crate) fn new(name: &str, template: &Limit, options: ChoosesQuota) -> Self {
        CustomerQuotas {
            name: name.into(),
            template: template.clone(),
            quota_from: options.quota_from,
            resolver: options.resolver,
            resolve_timeout: options.resolve_timeout.unwrap_or(DEFAULT_RESOLVE_TIMEOUT),
            custom: Mutex::new(HashMap::new()),
            overridden: Mutex::new(HashMap::new()),
            override_name: override_name(name),
            log: ResolveLog::default(),
        }
    }

    /// Whether the policy's quota per key comes from a resolver (which may have to be awaited).
    pub(crate) fn resolves(&self) -> bool {
        self.resolver.is_some()
    }

    /// The quota of `key` from the policy's closure, at once; `None` for the policy's own, or when
    /// a resolver must be asked ([`quota_of`](Self::quota_of)).
    pub(crate) fn quota_now(&self, parts: &Parts, key: &Key) -> Option<Quota> {
        (self.quota_from.as_ref()?)(parts, key)
    }

    /// The quota of `key` from the policy's closure or resolver; `None` for the policy's own. A
    /// resolver that fails or takes longer than its timeout gives `None` too (logged).
    pub(crate) async fn quota_of(&self, parts: &Parts, key: &Key) -> Option<Quota> {
        let Some(resolver) = &self.resolver else {
            return self.quota_now(parts, key);
        };
        match within(self.resolve_timeout, resolver.resolve(parts, key)).await {
            Some(Ok(quota)) => quota,
            Some(Err(error)) => {
                let why = error.to_string();
                self.log
                    .record(&self.name, "quota resolver", &why, FALLBACK);
                None
            }
            None => {
                let why = format!("no quota within {:?}", self.resolve_timeout);
                self.log
                    .record(&self.name, "quota resolver", &why, FALLBACK);
                None
            }
        }
    }

    /// The limits of a `quota` chosen for one key, kept in namespace `ns`. `None` for a quota that
    /// cannot be enforced (`validate` is the backend's check) or that `cost` exceeds: the request
    /// then gets the policy's own quota.
    pub(crate) fn custom_tier(
        &self,
        ns: Namespace,
        quota: Quota,
        cost: u64,
        validate: impl FnOnce(&Limit) -> Result<(), BuildError>,
    ) -> Option<Arc<CompiledTier>> {
        let tiers = match ns {
            Namespace::Customer => &self.custom,
            Namespace::Override => &self.overridden,
        };
        let mut table = tiers.lock().unwrap_or_else(|p| p.into_inner());
        let tier = match table.get(&quota) {
            Some(known) => known.clone(),
            None => {
                // Of no cost: the caller's is checked below, each time.
                let tier = match self.enforceable(ns, quota, 0, validate) {
                    Ok(limit) => Some(Arc::new(CompiledTier::of(None, slice::from_ref(&limit)))),
                    Err(e) => {
                        self.log
                            .record(&self.name, "quota", &e.to_string(), FALLBACK);
                        None
                    }
                };
                if table.len() >= MAX_CUSTOM_QUOTAS {
                    table.clear();
                }
                table.insert(quota, tier.clone());
                tier
            }
        };
        drop(table);
        // The cost is the caller's (a stream message's, or the policy's): not kept with the quota.
        let tier = tier?;
        if let Err(e) = self.cost_fits(cost, tier.limit_value) {
            self.log
                .record(&self.name, "quota", &e.to_string(), FALLBACK);
            return None;
        }
        Some(tier)
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
        self.cost_fits(cost, limit.max_cost())?;
        Ok(limit)
    }

    /// Whether a request of `cost` fits a quota whose largest cost is `most`.
    fn cost_fits(&self, cost: u64, most: u64) -> Result<(), BuildError> {
        match cost > most {
            true => Err(BuildError::Cost {
                policy: self.name.to_string(),
                cost,
                limit: most,
            }),
            false => Ok(()),
        }
    }

    /// A limit of namespace `ns` (its name, the policy's algorithm), when the policy may keep
    /// state there: what a reset must forget too. Per-customer quotas: when the policy chooses
    /// quotas per request; overrides: always (an override may give any key a quota).
    pub(crate) fn namespace(&self, ns: Namespace) -> Option<Limit> {
        let used = match ns {
            Namespace::Customer => self.quota_from.is_some() || self.resolver.is_some(),
            Namespace::Override => true,
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
            limit = limit
                .with_penalty(*penalty)
                .in_penalty_box(template.penalty_box());
        }
        if let Some(delay) = template.delay() {
            limit = limit.with_delay(delay)?;
        }
        if let (Algorithm::Concurrency, Some(lease)) = (template.algorithm(), template.lease()) {
            limit = limit.with_lease(lease)?;
        }
        // The policy's window boundaries: its calendar, for a quota of the calendar's period (a
        // customer's plan, billed on the policy's day; another period is cut from the epoch),
        // and each key's own phase.
        if let Some(calendar) = template.calendar()
            && let Ok(on_calendar) = limit.clone().with_calendar(calendar.clone())
        {
            limit = on_calendar;
        }
        if template.window().is_some_and(|window| window.is_per_key()) {
            limit = limit.with_window_start(WindowStart::PerKey)?;
        }
        Ok(limit)
    }
}

/// What a request gets when its own quota cannot be enforced.
const FALLBACK: &str = "the policy's quota";

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

/// The name override quotas of policy `name` keep their state under
/// ([`override_state_name`](crate::limit::override_state_name)).
fn override_name(name: &str) -> Arc<str> {
    crate::limit::override_state_name(name).into()
}

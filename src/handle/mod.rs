//! [`ThrottleHandle`]: what an application keeps of a running layer.
//!
//! A reload swaps the layer's whole policy table at once (an `ArcSwap`): each request reads the
//! table once, when the layer's service is called, and is decided by that table to its end, so no
//! request sees half a reload, and requests in flight are never dropped. The cost on the request
//! path: until the first reload, none (the table the layer was built with is read in place); after
//! it, one load of the table (arc-swap's, which shares no reference count with other threads).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::backend::{Backend, Charges, KeyState};
use crate::decision::Decision;
use crate::engine::shared::Shared;
use crate::engine::table::Table;
use crate::error::{BackendError, BuildError};
use crate::key::Key;
use crate::limit::Limit;
use crate::overrides::Override;
use crate::per_customer::Namespace;
use crate::policy::{CompiledPolicy, Policy};
use crate::top::TopKey;

mod key_text;
mod message;
mod overrides;

pub use key_text::KeyFromText;

/// A handle on a running [`ThrottleLayer`](crate::ThrottleLayer) (from
/// [`ThrottleLayer::handle`](crate::ThrottleLayer::handle)): cheap to clone, `Send + Sync`, and
/// valid for as long as the application keeps it (it keeps the layer's backend alive).
///
/// * [`peek`](Self::peek): a key's state under a policy, without consuming anything;
/// * [`reset`](Self::reset): forget a key (its state, its penalty strikes and ban), after a captcha,
///   a login or a support ticket;
/// * [`reload`](Self::reload): replace the policies (an invalid table is refused and the running
///   one stays in force).
///
/// Keys are given as the text the policy extracts ([`KeyFromText`]): the value of a
/// `header:x-user-id` key, the client's address for `ip` and `client-ip` keys, anything for
/// `global`. [`peek_key`](Self::peek_key) and [`reset_key`](Self::reset_key) take a [`Key`] for
/// other extractors.
///
/// ```
/// use tower_throttle::{key::Header, Policy, Quota, ThrottleLayer};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let policy = |count| {
///     Policy::builder("api")
///         .quota(Quota::per_minute(count))
///         .key(Header::new("x-user-id"))
///         .build()
///         .unwrap()
/// };
/// let layer = ThrottleLayer::new(policy(10));
/// let handle = layer.handle();
///
/// let state = handle.peek("api", "alice").await.unwrap();
/// assert_eq!(state.summary().remaining, 10);
/// handle.reset("api", "alice").await.unwrap();
/// assert!(handle.peek("nope", "alice").await.is_err());
///
/// // Twice the quota, from the next request on; an invalid table is refused.
/// handle.reload([policy(20)]).unwrap();
/// assert_eq!(handle.peek("api", "alice").await.unwrap().summary().limit, 20);
/// assert!(handle.reload([policy(5), policy(6)]).is_err());
/// assert_eq!(layer.policies()[0].limit().quota().count(), 20);
/// # });
/// ```
pub struct ThrottleHandle<K, B> {
    shared: Arc<Shared<K, B>>,
}

impl<K, B> ThrottleHandle<K, B> {
    pub(crate) fn new(shared: Arc<Shared<K, B>>) -> Self {
        ThrottleHandle { shared }
    }
}

impl<K, B> Clone for ThrottleHandle<K, B> {
    fn clone(&self) -> Self {
        ThrottleHandle {
            shared: self.shared.clone(),
        }
    }
}

impl<K, B> fmt::Debug for ThrottleHandle<K, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.debug_as(f, "ThrottleHandle")
    }
}

/// The policies of a layer as they stand (a snapshot: a later reload does not change it). Derefs to
/// the slice of policies, in the order they are tried.
pub struct Policies<K>(Arc<Table<K>>);

impl<K> Policies<K> {
    pub(crate) fn of(table: Arc<Table<K>>) -> Self {
        Policies(table)
    }
}

impl<K> Deref for Policies<K> {
    type Target = [Policy<K>];

    fn deref(&self) -> &[Policy<K>] {
        &self.0.policies
    }
}

impl<K> fmt::Debug for Policies<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.policies.iter().map(|p| p.name()))
            .finish()
    }
}

/// Why a [`ThrottleHandle`] call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum HandleError {
    /// No policy of the layer has this name.
    UnknownPolicy(String),
    /// The text is not a key the policy could extract (such as `"bob"` for an `ip` key).
    InvalidKey {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
    /// The backend could not peek or reset.
    Backend(BackendError),
    /// The layer counts no offenders, so it cannot say who is limited most
    /// ([`ThrottleLayerBuilder::count_offenders`](crate::ThrottleLayerBuilder::count_offenders)).
    NotCounted,
    /// An override or ban the policy cannot take: a pattern with a `*` elsewhere than at its end,
    /// a quota its backend cannot enforce or its cost exceeds, a quota for a metered policy, a
    /// ban of no duration.
    InvalidOverride {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
    /// The policy cannot check a message ([`ThrottleHandle::check`]): a concurrency or metered
    /// limit, or a cost it cannot take.
    Unsupported {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::UnknownPolicy(name) => write!(f, "no policy is called {name:?}"),
            HandleError::InvalidKey { policy, reason }
            | HandleError::InvalidOverride { policy, reason } => {
                write!(f, "policy {policy:?}: {reason}")
            }
            HandleError::Backend(e) => write!(f, "backend: {e}"),
            HandleError::NotCounted => {
                f.write_str("the layer counts no limited keys: build it with count_offenders")
            }
            HandleError::Unsupported { policy, reason } => {
                write!(f, "policy {policy:?} cannot check messages: {reason}")
            }
        }
    }
}

impl std::error::Error for HandleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HandleError::Backend(e) => Some(e),
            _ => None,
        }
    }
}

impl From<BackendError> for HandleError {
    fn from(e: BackendError) -> Self {
        HandleError::Backend(e)
    }
}

/// A key's state under every tier of a policy ([`ThrottleHandle::peek`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyState {
    /// The policy.
    pub policy: String,
    /// One per tier: the default tier first, then the named tiers in the order they were given.
    /// Each tier counts under limits of its own, so a key has a state in each. While a quota
    /// [override](ThrottleHandle::set_override) is in force, its state comes first, as a tier
    /// named `override` (then the one [`summary`](Self::summary) shows).
    pub tiers: Vec<TierKeyState>,
    /// The [override](ThrottleHandle::set_override) in force for the key, if any (its own, a
    /// pattern's or the policy-wide `*`).
    pub override_in_force: Option<Override>,
    /// When the key's timed [ban](ThrottleHandle::ban) ends, if one runs.
    pub banned_until: Option<SystemTime>,
}

/// A key's state under one tier's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierKeyState {
    /// The tier's name; `None` for the default tier.
    pub tier: Option<String>,
    /// One per limit of the tier's stack (one for a single quota): the limit's name and the state.
    pub limits: Vec<(String, KeyState)>,
}

impl TierKeyState {
    /// The tier's limits as one state: the fewest remaining, the latest reset and retry, banned if
    /// any is. (A refused request's one-quota figures are the refusing limit's, [`Decision::combine`].)
    pub fn combined(&self) -> KeyState {
        let states = self.limits.iter().map(|(_, s)| s);
        let tightest = states
            .clone()
            .min_by_key(|s| s.remaining)
            .copied()
            .unwrap_or(KeyState::new(0, 0, Duration::ZERO));
        let mut out = tightest;
        out.reset_after = states
            .clone()
            .map(|s| s.reset_after)
            .max()
            .unwrap_or_default();
        out.retry_after = states.clone().filter_map(|s| s.retry_after).max();
        out.banned = states.filter_map(|s| s.banned).max();
        out
    }
}

impl PolicyState {
    /// The default tier's state, combined over its stack ([`TierKeyState::combined`]): what an
    /// admin endpoint shows (`limit`, `remaining`, `reset_after`, `banned`).
    pub fn summary(&self) -> KeyState {
        self.tiers[0].combined()
    }
}

impl<K, B: Backend> ThrottleHandle<K, B> {
    /// The layer's overload gate, if it has one: its limit, the requests in flight and shed per
    /// partition (the example server's `GET /overload`).
    pub fn overload(&self) -> Option<&crate::overload::Gate> {
        self.shared.settings.overload.as_deref()
    }

    /// The policies in force.
    pub fn policies(&self) -> Policies<K> {
        Policies::of(self.shared.table.load_full())
    }

    /// `key`'s state under policy `policy`, every tier and every limit of its stacks (and its
    /// override's quota; not a per-customer quota, which is chosen from a request), without
    /// consuming anything: the backend's state, with the ban of the policy's penalty box when the
    /// layer keeps it (backends that keep penalties report their own). `key` is the text the policy
    /// extracts (see [`KeyFromText`]). A policy whose quotas have keys of their own
    /// ([`quota_keyed`](crate::PolicyBuilder::quota_keyed)) reports each limit under `key` as
    /// that limit's key reads it (an address for a quota keyed by address; a key the policy's own
    /// cannot read is taken by a quota's): peek a user's key for the user's limit, an
    /// organisation's for the organisation's ([`reset`](Self::reset) too).
    pub async fn peek(&self, policy: &str, key: &str) -> Result<PolicyState, HandleError>
    where
        K: KeyFromText,
    {
        let read = self.quota_or_policy_key(policy, key)?;
        self.peek_as(policy, &read, key).await
    }

    /// Like [`peek`](Self::peek), with the [`Key`] itself.
    pub async fn peek_key(&self, policy: &str, key: &Key) -> Result<PolicyState, HandleError> {
        self.peek_as(policy, key, &key.to_string()).await
    }

    /// [`Self::peek_key`], each quota keyed apart reading its own key from `text`.
    async fn peek_as(
        &self,
        policy: &str,
        key: &Key,
        text: &str,
    ) -> Result<PolicyState, HandleError> {
        let table = self.shared.table.load_full();
        let rules = find(&table, policy)?.compiled();
        let ban = rules
            .penalty
            .as_ref()
            .and_then(|penalty| penalty.banned(key));
        let now = SystemTime::now();
        let (override_in_force, timed_ban) = self.shared.overrides.both(rules.name(), key, now);
        let mut tiers = Vec::with_capacity(rules.tiers.len() + 1);
        let custom = (self.shared).override_tier(&rules.overridable, override_in_force, rules.cost);
        // Each limit's state by name, with the ban of the layer's penalty box.
        let shown = |(limit, mut state): (&Limit, KeyState)| {
            // Delay mode: what is left of the quota, as the fields say, not of the delay's room.
            state.remaining =
                limit.remaining_in_quota(state.reset_after, state.remaining, state.limit);
            let state = ban.map_or(state, |rest| state.with_ban(rest));
            (limit.name().to_owned(), state)
        };
        // An override's quota first (it counts against the policy's key alone), then each tier.
        let custom = custom.as_deref().map(|c| (Some("override"), &c.limits[..]));
        let own = rules
            .tiers
            .iter()
            .map(|t| (t.name.as_deref(), &t.limits[..]));
        for (name, limits) in custom.into_iter().chain(own) {
            let mut keys = Vec::new();
            let charges = charges(rules, limits, (key, text), &mut keys);
            let states = self.shared.backend.peek(charges).await?;
            if states.len() != limits.len() {
                return Err(HandleError::Backend(BackendError::new(format!(
                    "the backend returned {} states for {} limits",
                    states.len(),
                    limits.len()
                ))));
            }
            tiers.push(TierKeyState {
                tier: name.map(str::to_owned),
                limits: limits.iter().zip(states).map(shown).collect(),
            });
        }
        Ok(PolicyState {
            policy: rules.name().to_owned(),
            tiers,
            override_in_force,
            banned_until: timed_ban.map(|rest| now + rest),
        })
    }

    /// The `n` keys policy `policy` limited most over the last few minutes, largest first, as
    /// the layer's [`Offenders`](crate::ops::Offenders) counted them (on Redis, every
    /// process's; see [`TOP_WINDOW_MINUTES`](crate::ops::TOP_WINDOW_MINUTES) and [`TOP_CAPACITY`](crate::ops::TOP_CAPACITY) for the window and the bounds). Keys appear as the logs
    /// show them: pseudonyms when the layer redacts keys. An error when no policy has this name or
    /// the layer counts no offenders
    /// ([`count_offenders`](crate::ThrottleLayerBuilder::count_offenders); `Config::layer` does).
    ///
    /// ```
    /// use tower_throttle::{key::Header, ops::Offenders, Policy, Quota, ThrottleLayer};
    /// # use tower::ServiceExt;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let policy = Policy::builder("api")
    ///     .quota(Quota::per_minute(1))
    ///     .key(Header::new("x-user-id"))
    ///     .build()
    ///     .unwrap();
    /// let layer = ThrottleLayer::builder()
    ///     .policy(policy)
    ///     .count_offenders(Offenders::in_memory())
    ///     .build()
    ///     .unwrap();
    /// let handle = layer.handle();
    /// let app = tower::ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|_| async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) });
    /// for user in ["bob", "alice", "alice", "alice", "bob"] {
    ///     let request = http::Request::get("/").header("x-user-id", user).body(String::new()).unwrap();
    ///     app.clone().oneshot(request).await.unwrap();
    /// }
    /// let top = handle.top("api", 10).await.unwrap();
    /// assert_eq!((top[0].key.as_str(), top[0].limited), ("alice", 2));
    /// assert_eq!((top[1].key.as_str(), top[1].limited), ("bob", 1));
    /// # });
    /// ```
    pub async fn top(&self, policy: &str, n: usize) -> Result<Vec<TopKey>, HandleError> {
        find(&self.shared.table.load_full(), policy)?;
        let Some(offenders) = &self.shared.settings.offenders else {
            return Err(HandleError::NotCounted);
        };
        Ok(offenders.top(policy, n).await?)
    }

    /// Forgets `key` under policy `policy`: its state under every tier's limits and its shadow
    /// limits, its penalty strikes and ban (in the backend or in the layer), and what the layer's
    /// local limiter (`OnBackendError::Local`, feature `memory`) knows of it. The key starts again
    /// with its full quota. Limits are state by name: a policy sharing a limit name shares the
    /// reset.
    pub async fn reset(&self, policy: &str, key: &str) -> Result<(), HandleError>
    where
        K: KeyFromText,
    {
        let read = self.quota_or_policy_key(policy, key)?;
        self.reset_as(policy, &read, key).await
    }

    /// Checks one message of a long-lived stream (a WebSocket, SSE or gRPC-stream message) of
    /// `cost` units for `key` under policy `policy` (its default tier: a per-customer quota, which
    /// `quota_from` or a resolver chooses from a request, is not asked), as the layer checks a
    /// request: the same access lists (by key, and by network for a key that is an address),
    /// overrides and timed bans, backend and limits, shadow limits, penalty box, dry run and staged
    /// enforcement, metrics, logs and offender counts. A key on a deny list, blocked by an
    /// override, or under an override's quota too small for `cost`, is refused with no
    /// `retry_after`. The handler then drops the message or closes the
    /// stream on a refusal (`allowed == false`, with `retry_after`). A refusal the policy does not
    /// enforce (a dry run) comes back allowed. `key` is read as an operator types one
    /// ([`KeyFromText`]: as logs show keys, where `org%3Aacme` names `org:acme`, or as a request
    /// carries it): a key a client chose goes to [`check_key`](Self::check_key) as a [`Key`] of its
    /// bytes, or a client could name another's key. The `on_limited` hook is not called (there is
    /// no request to show it).
    ///
    /// An error when no policy has this name, the policy cannot count messages (a concurrency or
    /// metered limit, a cost it cannot take), or the backend fails (then the choice is the
    /// caller's: the layer's failure policy answers requests, not messages).
    ///
    /// ```
    /// use tower_throttle::{key::Header, Policy, Quota, ThrottleLayer};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let layer = ThrottleLayer::new(
    ///     Policy::builder("chat")
    ///         .quota(Quota::per_second(2))
    ///         .key(Header::new("x-user-id"))
    ///         .build()
    ///         .unwrap(),
    /// );
    /// let handle = layer.handle();
    /// // In the WebSocket handler, for each message of user "ann":
    /// assert!(handle.check("chat", "ann", 1).await.unwrap().allowed);
    /// assert!(handle.check("chat", "ann", 1).await.unwrap().allowed);
    /// let third = handle.check("chat", "ann", 1).await.unwrap();
    /// assert!(!third.allowed && third.retry_after.is_some());
    /// # });
    /// ```
    pub async fn check(&self, policy: &str, key: &str, cost: u64) -> Result<Decision, HandleError>
    where
        K: KeyFromText,
    {
        let key = self.key_of(policy, key)?;
        self.check_key(policy, &key, cost).await
    }

    /// Like [`check`](Self::check), with the [`Key`] itself.
    pub async fn check_key(
        &self,
        policy: &str,
        key: &Key,
        cost: u64,
    ) -> Result<Decision, HandleError> {
        let table = self.shared.table.load_full();
        let compiled = find(&table, policy)?.compiled();
        if let Some(reason) = message::unsupported(compiled, cost) {
            return Err(HandleError::Unsupported {
                policy: policy.to_owned(),
                reason,
            });
        }
        let judge = &table.judge;
        let custom = match message::before_backend(&self.shared, judge, compiled, key) {
            Ok(custom) => custom,
            Err(answered) => return Ok(answered),
        };
        if let (None, Some(reason)) = (&custom, message::too_costly(compiled, cost)) {
            return Err(HandleError::Unsupported {
                policy: policy.to_owned(),
                reason,
            });
        }
        let custom = custom.as_deref();
        let backend = &self.shared.backend;
        let decided = judge.message(backend, compiled, key, cost, custom).await;
        Ok(decided?)
    }

    /// Like [`reset`](Self::reset), with the [`Key`] itself.
    pub async fn reset_key(&self, policy: &str, key: &Key) -> Result<(), HandleError> {
        self.reset_as(policy, key, &key.to_string()).await
    }

    /// [`Self::reset_key`], each quota keyed apart reading its own key from `text`.
    async fn reset_as(&self, policy: &str, key: &Key, text: &str) -> Result<(), HandleError> {
        let table = self.shared.table.load_full();
        // The layer's own state first: a request arriving meanwhile is not refused by a ban the
        // backend no longer has.
        let rules = find(&table, policy)?.compiled();
        if let Some(penalty) = &rules.penalty {
            penalty.forget(key);
        }
        // Per-customer quotas keep their state under the policy's name, which a stacked or tiered
        // default does not use; an override's quota keeps it under its own name, whether or not
        // an override is in force now (one set again finds what the key counted).
        let namespaces = [Namespace::Customer, Namespace::Override];
        let quotas = &rules.overridable.quotas;
        let apart: Vec<Limit> = namespaces
            .into_iter()
            .filter_map(|ns| quotas.namespace(ns))
            .collect();
        let mut keys = vec![Vec::new(); rules.tiers.len()];
        let tiers = (rules.tiers.iter().zip(&mut keys))
            .map(|(tier, keys)| charges(rules, &tier.limits, (key, text), keys));
        let all: Vec<Charges<'_>> = tiers
            .chain(apart.iter().map(|limit| Charges::one(limit, key, 0)))
            .collect();
        // What the local limiter counted in the backend's stead is the layer's own too.
        for charges in &all {
            table.judge.fallback.forget(*charges);
        }
        for charges in all {
            self.shared.backend.reset(charges).await?;
        }
        // Shadow limits count the key too: a reset starts their count again.
        for shadow in rules.shadow_limits() {
            self.shared
                .backend
                .reset(Charges::one(shadow, key, 0))
                .await?;
        }
        Ok(())
    }

    /// Replaces the layer's policies. The new table passes the checks of
    /// [`ThrottleLayerBuilder::build`](crate::ThrottleLayerBuilder::build) (the backend's
    /// `validate` included) or is refused with the same error, and the running table stays in
    /// force. Otherwise it is swapped in at once: requests from then on are decided by it, requests
    /// in flight finish with the table they started with.
    ///
    /// What carries over: backends keep state by limit name, so a policy whose name and quota are
    /// unchanged keeps every key's count exactly. A changed quota under the same name reads the
    /// existing state under the new quota: the GCRA's state is a time (the backlog of the key's
    /// TAT), so one request at 2 an hour (half an hour of backlog) counts as two at 4 an hour, and
    /// a backlog beyond the new tolerance counts as a full bucket (rebased); a window's count
    /// counts as it is (one above the new limit as full). A changed algorithm starts the policy's
    /// keys afresh: one algorithm's state means nothing to another. On the memory backend, a
    /// stack's limits count together, apart from the same limits alone: a quota added to or taken
    /// from a policy starts its others' keys afresh (Redis keeps each limit's apart). The layer's
    /// penalty boxes (strikes and bans, when the backend does not keep them) carry over for
    /// policies whose name and penalty are unchanged, and the local limiter of
    /// `OnBackendError::Local` keeps its keys.
    /// The backend is told which limits changed or went ([`Backend::reloaded`]): the Redis backend
    /// drops the decisions it cached under them, in every process sharing the Redis.
    ///
    /// What a reload cannot change: the backend, the access lists (change them live through the
    /// [`AccessList`](crate::ops::AccessList) you gave), and the layer's options (headers,
    /// rejection response, hooks, failure policy, offender counting): those need a new layer.
    pub fn reload(&self, policies: impl IntoIterator<Item = Policy<K>>) -> Result<(), BuildError> {
        let policies: Box<[Policy<K>]> = policies.into_iter().collect();
        // Checked and built under the lock, from the table in force (whose in-process state it
        // takes over); a refused table leaves that one in force.
        let _one_at_a_time = self
            .shared
            .reloading
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = self.shared.table.load_full();
        let table = Table::build(
            &self.shared.backend,
            policies,
            self.shared.settings.clone(),
            Some(&previous),
        )?;
        let changed = previous.changed_in(&table);
        // A reload keeps the overrides (they are not in the policies); a policy it adds may have
        // some already.
        self.shared.overrides.know(table.limit_names());
        self.shared.overrides.reread();
        for gone in previous.policies.iter().map(Policy::name) {
            if table.policies.iter().all(|p| p.name() != gone) && self.shared.overrides.holds(gone)
            {
                tracing::warn!(
                    policy = gone,
                    "the reload removed a policy that has overrides or timed bans: they are out \
                     of force but kept, in force again if a policy of that name comes back; \
                     list and remove them under its name"
                );
            }
        }
        // Kept, but a policy that became metered or keyed apart cannot take a quota override:
        // listed and shown by peek, it would otherwise be ignored without a word.
        for policy in table.policies.iter().map(Policy::compiled) {
            if !policy.overridable.takes_quota_override()
                && (self.shared.overrides.overrides_of(policy.name()).iter())
                    .any(|(_, o)| matches!(o, Override::Quota(_)))
            {
                tracing::warn!(
                    policy = policy.name(),
                    "quota overrides kept by the reload are not applied: the policy is metered or \
                     keyed apart now, and takes unlimited and blocked overrides only"
                );
            }
        }
        self.shared.table.store(table);
        if !changed.is_empty() {
            let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
            self.shared.backend.reloaded(&changed);
        }
        Ok(())
    }

    /// [`Self::key_of`], or else the key of a quota keyed apart that reads `text`.
    fn quota_or_policy_key(&self, policy: &str, text: &str) -> Result<Key, HandleError>
    where
        K: KeyFromText,
    {
        self.key_of(policy, text).or_else(|error| {
            let table = self.shared.table.load_full();
            let rules = find(&table, policy)?.compiled();
            // A pseudonym names no key, whoever reads it.
            let named = !self.pseudonym(text);
            named
                .then(|| quota_key_of(rules, text))
                .flatten()
                .ok_or(error)
        })
    }

    /// Whether `text` is a pseudonym a redacting layer shows (`top`, logs): it names no key it
    /// can find again; taken for a key of those bytes, a reset or a ban would answer done and
    /// touch nobody.
    fn pseudonym(&self, text: &str) -> bool {
        let tag = text.strip_prefix("hmac:");
        let tag = tag.filter(|tag| tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()));
        tag.is_some() && self.shared.table.load_full().judge.redactor.is_some()
    }

    pub(crate) fn key_of(&self, policy: &str, text: &str) -> Result<Key, HandleError>
    where
        K: KeyFromText,
    {
        let table = self.shared.table.load_full();
        let invalid = |reason| HandleError::InvalidKey {
            policy: policy.to_owned(),
            reason,
        };
        if self.pseudonym(text) {
            let why = format!("{text:?} is a pseudonym (keys are redacted): name the key itself");
            return Err(invalid(why));
        }
        find(&table, policy)?
            .key()
            .key_from_text(text)
            .map_err(invalid)
    }
}

/// The charges of nothing for `limits` under `key`; when `rules`' quotas have keys of their own,
/// once per limit, kept in `keys`, as each limit's own key reads `text` (what the operator typed:
/// an address for a quota keyed by address; `key` where it cannot): each limit is peeked and
/// reset under the key given.
fn charges<'a>(
    rules: &CompiledPolicy,
    limits: &'a [Limit],
    (key, text): (&'a Key, &str),
    keys: &'a mut Vec<Key>,
) -> Charges<'a> {
    let Some(specs) = rules.extras.as_ref().and_then(|e| e.limit_keys.as_deref()) else {
        return Charges::stack(limits, key, 0);
    };
    let own = |i: usize| specs.get(i).and_then(Option::as_ref);
    *keys = (0..limits.len())
        .map(|i| match own(i).map(|spec| spec.key_from_text(text)) {
            Some(Ok(read)) => read,
            _ => key.clone(),
        })
        .collect();
    Charges::keyed(limits, keys, 0)
}

/// `text` as the key of one of `rules`' quotas keyed apart, where the policy's own key cannot
/// read it (an organisation's name, on a policy keyed by address).
fn quota_key_of(rules: &CompiledPolicy, text: &str) -> Option<Key> {
    let specs = rules.extras.as_ref()?.limit_keys.as_deref()?;
    specs
        .iter()
        .flatten()
        .find_map(|spec| spec.key_from_text(text).ok())
}

pub(crate) fn find<'t, K>(table: &'t Table<K>, policy: &str) -> Result<&'t Policy<K>, HandleError> {
    let found = table.policies.iter().find(|p| p.name() == policy);
    found.ok_or_else(|| HandleError::UnknownPolicy(policy.to_owned()))
}

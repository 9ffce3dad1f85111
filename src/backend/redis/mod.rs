//! The Redis backend: one limiter shared by every process that talks to the same Redis.
//!
//! `RedisBackend` (here) is a handle on a shared [`RedisState`](state::RedisState), made by
//! [`builder`]. [`conn`] reaches Redis; [`health`] guards against its failures and reports them;
//! [`wire`] is what Redis is sent; [`decide`] decides; [`speedup`] coalesces checks and leases
//! budgets; [`resets`] and [`records`] are what the processes share.
//!
//! `scripts/import_cycles.py` checks that no two files import each other, directly or not.

mod builder;
mod conn;
mod decide;
mod health;
mod records;
mod resets;
mod speedup;
mod state;
mod wire;

// Paths used from outside the backend (offenders, top keys, access lists).
pub(crate) use self::conn::connection;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use self::conn::{server, slot_watch};
use self::decide::check::{DecisionFuture, StackFuture};
use self::decide::refund;
use self::health::watch;
use self::state::RedisState;
use self::wire::args::{self, validate_stack};
use crate::backend::api::Backend;
use crate::backend::charge::{Adjustment, Charges, Decisions, Uses};
use crate::backend::key_state::{PeekFuture, ResetFuture};
use crate::error::{BackendError, BuildError};
use crate::key::Key;
use crate::limit::{Limit, DEFAULT_LEASE};

pub use self::builder::RedisBackendBuilder;
pub use self::health::circuit::CircuitState;
pub use self::health::memory::MemoryReport;
pub use self::health::report::{RedisHealth, RedisNodeHealth};
pub use self::wire::mode::RedisMode;

/// A [`Backend`] on Redis: `CL.THROTTLE` (the redis-cell module) or an equivalent atomic Lua
/// script, on one server, behind Sentinel or on a Cluster. Every decision is one atomic call on the
/// client's keys (`prefix:policy:{key}`), bounded by the [timeout](RedisBackendBuilder::timeout); a
/// failure reaches the layer as a [`BackendError`] ([`OnBackendError`](crate::OnBackendError)
/// decides). The [Redis guide](crate::guide::redis) tells how it decides, fails over and reports
/// its health.
#[derive(Clone)]
pub struct RedisBackend {
    state: Arc<RedisState>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field(
                "topology",
                &if self.state.conn.is_cluster() {
                    "cluster"
                } else {
                    "single"
                },
            )
            .field("mode", &self.state.detector.mode())
            .field("active", &self.active_path())
            .field("prefix", &self.state.prefix)
            .field("timeout", &self.state.timeout)
            .finish()
    }
}

impl RedisBackend {
    /// The default time a decision may take before the layer's failure policy applies: 100 ms.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

    /// The default key prefix: `"throttle"`.
    pub const DEFAULT_PREFIX: &'static str = "throttle";

    /// A backend on `state`, its watchers started (the memory and probes; a Cluster's slot map).
    fn watched(state: Arc<RedisState>) -> Self {
        watch::spawn(&state);
        slot_watch::spawn(&state);
        RedisBackend { state }
    }

    /// A builder: where to connect, mode, prefix, timeout.
    pub fn builder() -> RedisBackendBuilder {
        RedisBackendBuilder::new(Self::DEFAULT_PREFIX, Self::DEFAULT_TIMEOUT)
    }

    /// The path decisions take now: `Cell` or `Lua`, or `None` in `Auto` mode before detection.
    pub fn active_path(&self) -> Option<RedisMode> {
        self.state.detector.active_path()
    }

    /// The configured mode.
    pub fn mode(&self) -> RedisMode {
        self.state.detector.mode()
    }

    /// Where the connection stands: see [`RedisHealth`].
    pub fn health(&self) -> RedisHealth {
        let state = &self.state;
        let (connected, address, last_error) = match state.conn.server() {
            Some(server) => {
                let (address, last_error) = server.attempts.snapshot();
                (server.connected(), address, last_error)
            }
            // A Cluster started lazily, before the background task has connected it.
            None if let Some(lazy) = state.conn.lazy_cluster()
                && !lazy.connected() =>
            {
                (false, None, lazy.attempts.snapshot().1)
            }
            // A Cluster or a user's connection manager: redis-rs reconnects them, and only the
            // calls' outcomes tell whether Redis is reachable.
            None => {
                let (reachable, last_error) = state.breaker.recorder.reachability();
                (reachable, None, last_error)
            }
        };
        let failing = state.breaker.recorder.current();
        RedisHealth {
            connected,
            path: state.detector.active_path(),
            breaker_open: state.breaker.tripped(),
            decisions_failing: failing.is_some(),
            // Not connected: why the connection is down says more than "not connected" does.
            last_error: if connected {
                failing.or(last_error)
            } else {
                last_error.or(failing)
            },
            address,
            nodes: state
                .breaker
                .nodes
                .as_ref()
                .map_or_else(Vec::new, |nodes| nodes.health()),
        }
    }

    /// Reads Redis' `maxmemory-policy` and `evicted_keys` now, as the backend does every 30 s (see
    /// [sizing Redis](crate::guide::redis_sizing)).
    ///
    /// An error when Redis cannot be reached; what Redis refuses (`CONFIG GET`, `INFO`) is `None`.
    pub async fn memory(&self) -> Result<MemoryReport, BackendError> {
        watch::read_memory(&self.state).await
    }

    /// After [`build`](RedisBackendBuilder::build): waits for the background task's first connection
    /// attempt to end, and says whether it connected; `Ok(true)` at once after
    /// [`connect`](RedisBackendBuilder::connect) ([guide](crate::guide::redis#starting-and-reconnecting)).
    ///
    /// An error when Redis refused the configuration, which retrying alone will not fix (a wrong
    /// password, `NOPERM`, mode `Cell` without redis-cell; not a replica); the task still retries.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use tower_throttle::redis::RedisBackend;
    ///
    /// let redis = RedisBackend::builder().url("redis://127.0.0.1:1/").build().unwrap();
    /// // Refused: returns as soon as that is known.
    /// assert!(!redis.first_attempt().await.unwrap());
    /// # }
    /// ```
    pub async fn first_attempt(&self) -> Result<bool, BackendError> {
        let budget = server::attempt_budget(self.state.timeout) + Duration::from_millis(100);
        let conn = &self.state.conn;
        match (conn.server(), conn.lazy_cluster()) {
            (Some(server), _) => {
                server
                    .attempts
                    .first_attempt(budget, || server.connected())
                    .await
            }
            (_, Some(lazy)) => {
                lazy.attempts
                    .first_attempt(budget, || lazy.connected())
                    .await
            }
            _ => Ok(true),
        }
        .map_err(BackendError::new)
    }

    /// Says whether the backend (some clone of it) still exists, without keeping it alive: for
    /// tasks that must not outlive it.
    #[cfg(feature = "config")]
    pub(crate) fn liveness(&self) -> impl Fn() -> bool + Send + 'static {
        let state = Arc::downgrade(&self.state);
        move || state.strong_count() > 0
    }

    /// The backend's connection, shared by the offender counts and the access lists.
    #[cfg(feature = "config")]
    pub(crate) fn connection(&self) -> connection::RedisConnection {
        self.state.conn.clone()
    }

    /// The Redis key that holds `key`'s state under the policy `policy`: `prefix:policy:{key}`.
    pub fn redis_key(&self, policy: &str, key: &Key) -> String {
        args::redis_key(&self.state.prefix, policy, key)
    }

    /// The Redis key that holds `key`'s state under `limit`: [`redis_key`](Self::redis_key) for the
    /// GCRA, with a suffix per algorithm for the others (the
    /// [layout](crate::guide::redis#key-layout)).
    pub fn state_key(&self, limit: &Limit, key: &Key) -> String {
        args::state_key(&self.state.prefix, limit, key)
    }
}

// Beside the type it makes: builder.rs need not know `RedisBackend`.
impl RedisBackendBuilder {
    /// Checks the settings, connects and sets up the path: the eager, fail-fast start
    /// ([guide](crate::guide::redis#starting-and-reconnecting)).
    ///
    /// Fails when the settings are invalid (the message names the setting), when Redis cannot be
    /// reached, or when `Cell` mode is asked of a server without the module.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        Ok(RedisBackend::watched(
            self.validated()?.start_eagerly().await?,
        ))
    }

    /// Checks the settings and returns at once: a background task connects, and until it has, every
    /// call fails at once with a [`BackendError`] (the failure policy answers without waiting). The
    /// lazy start ([guide](crate::guide::redis#starting-and-reconnecting)).
    ///
    /// Fails when the settings are invalid, or outside a tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use tower_throttle::backend::Charges;
    /// use tower_throttle::key::Key;
    /// use tower_throttle::{redis::RedisBackend, Backend, Limit, Quota};
    ///
    /// // Nothing listens on port 1: built anyway, and calls fail at once.
    /// let redis = RedisBackend::builder().url("redis://127.0.0.1:1/").build().unwrap();
    /// let limit = Limit::new("api", Quota::per_second(5)).unwrap();
    /// let alice = Key::from("alice");
    /// assert!(redis.check(Charges::one(&limit, &alice, 1)).await.is_err());
    ///
    /// // Settings are still checked here.
    /// assert!(RedisBackend::builder().url("redis://127.0.0.1:1/").prefix("a b").build().is_err());
    /// # }
    /// ```
    pub fn build(self) -> Result<RedisBackend, BuildError> {
        let state = self
            .validated()
            .and_then(|v| v.start_lazily())
            .map_err(|e| BuildError::Invalid(e.to_string()))?;
        Ok(RedisBackend::watched(state))
    }
}

impl Backend for RedisBackend {
    type Future = RedisFuture;

    // One limit: the GCRA on `gcra.lua` or `CL.THROTTLE`, any other algorithm on the limits script
    // (check.rs); a stack on one key or limits with keys of their own (their keys on one hash
    // tag): one call of the limits script, alone or coalesced.
    fn check(&self, charges: Charges<'_>) -> Self::Future {
        let limits = charges.limits();
        RedisFuture(match (charges.same_key(), charges.same_quantity()) {
            (Some(key), Some(quantity)) => match limits {
                [one] => Checking::One(self.state.check(one, key, quantity), false),
                all => Checking::Many(self.state.check_stack(all, key, quantity, None)),
            },
            (Some(key), None) => {
                let quantities = charges.quantities().unwrap_or_default();
                match (limits, quantities) {
                    // A metered lone limit is a plain check of its estimate, answered as a list.
                    ([one], [quantity]) => {
                        Checking::One(self.state.check(one, key, *quantity), true)
                    }
                    _ => Checking::Many(self.state.check_stack(limits, key, 0, Some(quantities))),
                }
            }
            (None, Some(quantity)) => {
                let keys = charges.keys().unwrap_or_default();
                Checking::Many(self.state.check_keyed(limits, keys, quantity))
            }
            (None, None) => Checking::Many(decide::check::failed(
                "charges with keys of their own take one quantity",
            )),
        })
    }

    fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError> {
        if let [limit] = limits
            && !uses.keys_apart
        {
            if let Some(why) = limit.budget().and_then(|_| limit.budget_error()) {
                return Err(BuildError::Invalid(why));
            }
            return args::validate(self.state.detector.mode(), limit);
        }
        if let Some(leased) = limits.iter().find(|l| l.budget().is_some()) {
            let why = match uses.keys_apart {
                true => "cannot be used with quotas keyed apart",
                false => "takes one quota, not a stack",
            };
            let name = leased.name();
            return Err(BuildError::Invalid(format!(
                "policy {name:?}: a leased budget {why}"
            )));
        }
        // Decided by the limits script (Lua) in every mode: CL.THROTTLE decides one key alone.
        validate_stack(limits)
    }

    // Refunds and settlements: settle.lua, on a spawned task (refund.rs); a concurrency slot given
    // back by its lease.
    fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
        let limits = charges.limits();
        let Some(key) = charges.same_key() else {
            return; // Quotas with keys of their own are neither refunded nor settled.
        };
        match adjustment {
            // A settlement of `-quantity` under every limit.
            Adjustment::Refund { since, admitted } => {
                let back = i64::try_from(charges.quantity(0)).map_or(i64::MIN, |q| -q);
                let deltas = vec![back; limits.len()];
                refund::settle(&self.state, limits, key, &deltas, (since, admitted));
            }
            Adjustment::Settle {
                deltas,
                since,
                admitted,
            } => {
                refund::settle(&self.state, limits, key, deltas, (since, admitted));
            }
            Adjustment::Release { lease } => {
                for (i, limit) in limits.iter().enumerate() {
                    let quantity = charges.quantity(i);
                    if let Some(count) = limit.concurrency()
                        && quantity > 0
                        && lease > 0
                    {
                        let length = limit.lease().unwrap_or(DEFAULT_LEASE);
                        let key = self.state_key(limit, key);
                        self.state
                            .leases
                            .release(key, lease, quantity.min(count), length);
                    }
                }
            }
        }
    }

    // Peeks and resets on the keys the charges are decided on (admin.rs).
    fn peek(&self, charges: Charges<'_>) -> PeekFuture {
        let limits = charges.limits();
        match (charges.keys(), charges.same_key()) {
            // The keys `check_keyed` decides, or `check`'s.
            (Some(keys), _) => {
                (self.state).peek(limits, || self.state.keyed_call(limits, keys, 0, 0))
            }
            (None, Some(key)) => {
                (self.state).peek(limits, || self.state.limits_call(limits, key, 0, None, 0))
            }
            (None, None) => decide::check::failed("no key to peek at"),
        }
    }

    fn reset(&self, charges: Charges<'_>) -> ResetFuture {
        match (charges.keys(), charges.same_key()) {
            (Some(keys), _) => self.state.reset_keyed(charges.limits(), keys),
            (None, Some(key)) => self.state.reset(charges.limits(), key),
            (None, None) => decide::check::failed("no key to reset"),
        }
    }

    fn keeps_penalties(&self) -> bool {
        true
    }

    // Heard by every process sharing the Redis (resets.rs).
    fn reloaded(&self, changed: &[&str]) {
        resets::reloaded(&self.state, changed);
    }

    fn records(&self) -> Option<Arc<dyn crate::backend::Records>> {
        Some(Arc::new(records::RedisRecords(self.state.clone())))
    }
}

/// The future of [`RedisBackend`]'s [`check`](Backend::check): Redis's answer, one decision per
/// charge.
pub struct RedisFuture(Checking);

/// What is awaited: one limit's decision (answered as a list when `true`: a metered lone limit),
/// or a list's.
enum Checking {
    One(DecisionFuture, bool),
    Many(StackFuture),
}

impl fmt::Debug for RedisFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RedisFuture")
    }
}

impl std::future::Future for RedisFuture {
    type Output = Result<Decisions, BackendError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Checking::One(one, false) => one.as_mut().poll(cx).map(|r| r.map(Decisions::One)),
            Checking::One(one, true) => one
                .as_mut()
                .poll(cx)
                .map(|r| r.map(|d| Decisions::Many(vec![d]))),
            Checking::Many(all) => all.as_mut().poll(cx).map(|r| r.map(Decisions::Many)),
        }
    }
}

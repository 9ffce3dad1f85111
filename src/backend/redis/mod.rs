//! The Redis backend: one limiter shared by every process that talks to the same Redis.
//!
//! `RedisBackend` (here) is a handle on a shared [`RedisState`](state::RedisState), made by
//! [`builder`] (the settings and the start-up work of `connect` and `build`). The files are grouped
//! by what they do:
//!
//! - [`conn`]: reaching Redis. One server's own reconnecting connection (a URL, a client or
//!   Sentinel); the connection every call goes through (that server, a user's manager, or a
//!   Cluster, started lazily or not) and redis-cell detection; the one set-up after every connect;
//!   the keepers (one server's, a lazy Cluster's) and their one retry loop, on the one backoff of
//!   every retry; a Cluster's slot map with a breaker per primary, the task that reads it, and
//!   redirections.
//! - [`health`]: guarding against Redis' failures and reporting them. The circuit breaker and
//!   timeout every call runs under; the one recorder of every call's outcome, on one clock, that
//!   the breakers, the gauge and [`RedisBackend::health`] read; the keepers' record of their
//!   attempts; what `health()` reports; and the watch on Redis' memory.
//! - [`wire`]: what Redis is sent. A limit's keys and arguments, the Lua scripts (`*.lua`, with
//!   their shared prelude), the calls that run them and read their replies, and the modes.
//! - [`decide`]: deciding. One check's way (the deny cache, one call under the breaker, on the
//!   path the mode picks), units given back and metered costs settled, concurrency leases, peek and
//!   reset.
//! - [`speedup`]: optional speed-ups. Checks coalesced into one call, and leased budgets of hot
//!   keys.
//! - [`resets`] and [`state`]: what the processes share (resets published and heard) and what
//!   every clone of one backend shares.
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
pub(crate) use self::conn::{connection, redirect};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use self::conn::{server, slot_watch};
use self::decide::refund;
use self::health::watch;
use self::state::RedisState;
use self::wire::args::{self, validate_stack};
use crate::backend::api::{Backend, StackFuture};
use crate::backend::key_state::{PeekFuture, ResetFuture};
use crate::error::{BackendError, BuildError};
use crate::key::Key;
use crate::limit::{Limit, DEFAULT_LEASE};

pub use self::builder::RedisBackendBuilder;
pub use self::decide::check::RedisFuture;
pub use self::health::circuit::CircuitState;
pub use self::health::memory::MemoryReport;
pub use self::health::report::{RedisHealth, RedisNodeHealth};
pub use self::wire::mode::RedisMode;

/// A [`Backend`] on Redis: `CL.THROTTLE` (the redis-cell module) or an equivalent atomic Lua script,
/// on one server or a Redis Cluster. The [Redis guide](crate::guide::redis) tells how to run it
/// (modes, failover, Sentinel, Cluster, batching, budgets), with what was measured.
///
/// Every decision is one atomic command on one key, `prefix:policy:{key}` (a stack's: on one key per
/// limit, all with the same tag; see the [layout](#key-layout)); the braces are a hash tag, so a
/// Cluster routes each decision to the node that owns the key's slot. The user-controlled part is
/// escaped (it contains no `{`, `}`, whitespace or control bytes, so it cannot end the tag or reach
/// another namespace) and bounded: keys longer than 64 bytes are stored by their SHA-256.
///
/// Each call is bounded by the [timeout](RedisBackendBuilder::timeout) (100 ms by default); a timeout
/// or an error reaches the layer as a [`BackendError`], where
/// [`OnBackendError`](crate::OnBackendError) decides (fail open, fail closed or a local limiter).
///
/// # Starting, failover and health
///
/// [`connect`](RedisBackendBuilder::connect) connects before it returns and fails if Redis cannot be
/// reached; [`build`](RedisBackendBuilder::build) returns at once and connects in the background.
/// One server ([`url`](RedisBackendBuilder::url), [`client`](RedisBackendBuilder::client),
/// [`sentinel`](RedisBackendBuilder::sentinel)) is kept connected by a background task: an I/O
/// error, a timeout, or a server that answers `READONLY` (a primary demoted by a failover),
/// `MASTERDOWN` or `LOADING` drops the connection; calls then fail at once while the task connects
/// again (every 50 ms, backing off to 500 ms), resolving the address again (DNS, or the sentinels),
/// checking that the server is a primary (`ROLE`), loading the script and detecting the path before
/// the first decision uses it. A Cluster connection and a user's
/// [`connection_manager`](RedisBackendBuilder::connection_manager) reconnect by redis-rs' own rules.
/// [`health`](RedisBackend::health) tells where it stands.
///
/// # Modes
///
/// - **Lua** (`EVALSHA`, reloaded after `NOSCRIPT`): the server's clock (`TIME`), integer arithmetic,
///   results in nanoseconds. Tolerances (`period / count × (max_burst + 1)`) up to about 52 days.
/// - **Cell** (`CL.THROTTLE`): redis-cell reports whole seconds, truncated; this backend reports the
///   next whole second, never early. Quotas whose period is not a whole number of seconds are sent
///   as the equal rate over whole seconds (5 per 500 ms as 10 per second). On a Cluster it is called
///   from a script that declares the key (the command declares none, so a node would run it on a
///   slot it is migrating away), and is redirected like the Lua path.
/// - **Auto** (the default): Lua, coalesced, when [`coalesce`](RedisBackendBuilder::coalesce) is
///   on (the default; see [`RedisMode::Auto`]); with coalescing off, Cell where the module is
///   loaded, Lua otherwise.
///
/// Both paths store the same value (the TAT in nanoseconds, redis-cell's format) under the same key,
/// so a change of mode loses nothing.
///
/// # Other algorithms and stacks
///
/// The [sliding log](crate::window::sliding_log), [fixed window](crate::window::fixed_window),
/// [sliding window](crate::window::sliding_window) and [concurrency](crate::window::concurrency)
/// limits, and stacks ([`Backend::check_all`]), run a second Lua script in every mode: one call
/// that reads every limit's key, decides, and writes only if every limit admits, so a rejection by
/// one limit of a stack consumes nothing in the others. It computes the functions of
/// [`window`](crate::window) on the server's clock, so the memory backend and Redis agree. A GCRA
/// limit in a stack uses the GCRA script's arithmetic and key, so it shares its state with the same
/// limit checked alone. A stack's [`Penalty`](crate::policy::Penalty) is its first limit's. Stacks
/// hold 1 to 16 limits, never a concurrency limit. What the script cannot compute exactly is refused
/// when the layer is built: window periods that are not a whole number of microseconds (the
/// resolution of `TIME`) or not shorter than 52 days, and sliding windows whose count × period
/// exceeds 2^51 µs (about 26,000 a day) or whose count exceeds 2^41.
///
/// The deny cache holds only the rejections that provably last until their retry time: a fixed
/// window's, and a sliding log's for one unit. The others (and stacks) always reach Redis.
///
/// # Metered limits
///
/// A metered limit ([`Limit::with_max_debt`]) reserves an estimate at admission and settles the
/// real cost after the response ([`Backend::settle`]): one atomic call of `settle.lua` on a task of
/// its own (bounded by the timeout, never retried, as refunds are). A higher cost moves the TAT on by
/// `delta × interval` from `max(TAT, now)`, at most [`max_debt`](Limit::max_debt) units past the
/// burst; a lower one gives back as a refund does. Every path reads a key in debt as refused,
/// `remaining` 0, until it is paid. A stack with one quantity per limit ([`Backend::check_each`]) is
/// one call. A settle forgets this process's cached rejection of the key. Metered limits are GCRA
/// limits without a leased budget; their checks are coalesced, their settles are not (a stack's
/// settle writes several keys, which a Cluster's per-key lanes cannot carry).
///
/// # Key layout
///
/// Every key of one client carries the client's hash tag, so a stack's keys share one Cluster slot
/// and one call decides them. Each algorithm has a key of its own, so a policy whose algorithm
/// changes starts afresh instead of reading another type (`WRONGTYPE`):
///
/// | algorithm | key | value | memory per key | expires |
/// |---|---|---|---|---|
/// | GCRA | `prefix:policy:{key}` | string: the TAT in ns | O(1) | when the TAT passes |
/// | sliding log | `prefix:policy:{key}:log` | ZSET: a member per admitted unit, scored by its time (µs) | O(count): at most `count` members after each admission | a period after the newest unit |
/// | fixed window | `prefix:policy:{key}:fixed` | string `window:count` | O(1) | at the window's end |
/// | sliding window | `prefix:policy:{key}:sliding` | string `window:current:previous` | O(1) | at the end of the next window |
/// | concurrency | `prefix:policy:{key}:concurrency` | ZSET: a member per slot in flight, scored by its lease's end (µs) | O(count) | when its longest lease ends |
/// | penalty | `prefix:policy:{key}:strikes`, `…:ban` | counters | O(1) | `within`, `ban` |
///
/// A stack whose limits have keys of their own
/// ([`PolicyBuilder::quota_keyed`](crate::PolicyBuilder::quota_keyed)) keeps each limit's state
/// under `prefix:limit:{tag}:key` (with the algorithm's suffix), `tag` being the stack's first
/// limit's name: every key of the stack shares one slot, so one script decides the request
/// atomically on a Cluster too, and that policy's decisions all go to the node of that slot.
///
/// Members are `token:i`, with a token drawn per call (unique within a process, random across
/// processes), so the units of one burst stay distinct; rejected requests add none; units that left
/// the window are trimmed at each admission.
///
/// # Concurrency leases
///
/// An admitted request under a concurrency limit takes `quantity` slots, each a member scored by
/// the end of its lease ([`Limit::with_lease`], 60 s by default); its
/// [`Decision::lease`](crate::Decision::lease) is the token. While the request runs, its process
/// renews the lease every third of its length; [`Backend::release`] stops the renewal and removes
/// the members (a `ZREM` on a spawned task, retried with backoff past the breaker until Redis
/// answers or the lease would have ended). The slots of a process that died free themselves within
/// one lease. A check that times out or is dropped before its answer gives back what it may have
/// taken the same way. Whoever calls [`Backend::check`] directly must call `release` for every
/// admitted concurrency decision: until then its lease is renewed (as long as the backend lives).
///
/// # Leased budgets for hot keys
///
/// A GCRA limit with a [`Budget`](crate::policy::Budget) ([`Limit::with_budget`]) is decided locally
/// while its key is hot, from a slice of the key's budget taken in one atomic call (`budget.lua`,
/// which moves the TAT as that many requests would). A process never admits more than Redis granted
/// it; the bounds are [`Budget`](crate::policy::Budget)'s. A [reset](Backend::reset) drops the
/// slices of the key in every process that [hears it](Backend::reset); a slice whose fetch started
/// before a reset heard is not credited.
///
/// ```no_run
/// use tower_throttle::{key::PeerIp, redis::RedisBackend, Policy, Quota, ThrottleLayer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = RedisBackend::builder()
///     .url("redis://127.0.0.1:6379/")
///     .prefix("myapp")
///     .connect()
///     .await?;
/// let layer = ThrottleLayer::builder()
///     .backend(redis)
///     .policy(Policy::builder("api").key(PeerIp::new()).quota(Quota::per_second(5)).build()?)
///     .build()?;
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    state: Arc<RedisState>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("topology", &self.state.conn.topology())
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

    /// The path decisions take now: `Some(RedisMode::Cell)` or `Some(RedisMode::Lua)`, or `None` in
    /// `Auto` mode before the module has been detected.
    pub fn active_path(&self) -> Option<RedisMode> {
        self.state.detector.active_path()
    }

    /// The configured mode.
    pub fn mode(&self) -> RedisMode {
        self.state.detector.mode()
    }

    /// Where the connection stands: connected or not, the path, the breaker, the last error and the
    /// address. See [`RedisHealth`].
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

    /// Reads Redis' `maxmemory-policy` (`CONFIG GET`) and `evicted_keys` (`INFO stats`) now, as the
    /// backend does by itself at start-up and then every 30 s: a policy that can evict the
    /// limiter's keys is logged once as a warning, and evictions since the last read are counted
    /// (`throttle_redis_evicted_keys_total`) and logged. See [`MemoryReport`], and
    /// [Sizing Redis for the limiter](crate::guide::redis_sizing) for the set-up that keeps limits.
    ///
    /// An error when Redis cannot be reached; a Redis that refuses `CONFIG GET` or `INFO` (managed
    /// Redis, ACLs) answers `None` for what it refused.
    pub async fn memory(&self) -> Result<MemoryReport, BackendError> {
        watch::read_memory(&self.state).await
    }

    /// After [`build`](RedisBackendBuilder::build): waits for the background task's first
    /// connection attempt to end (at most one attempt: five timeouts, 250 ms to 5 s) and says
    /// whether it connected. With Redis up, the application then starts with decisions on Redis
    /// instead of sending its first requests to the failure policy; with Redis refusing
    /// connections it returns at once. For a Cluster, the first attempt ends connected only once
    /// the Cluster has formed. `Ok(true)` at once after [`connect`](RedisBackendBuilder::connect)
    /// and for a user's connection manager. `Config::layer` does this.
    ///
    /// An error when Redis answered and refused the configuration, which retrying alone will not
    /// fix: a wrong or missing password (`WRONGPASS`, `NOAUTH`), an ACL user without the commands
    /// the limiter needs (`NOPERM`), or mode `Cell` on a server without redis-cell. (The task
    /// still retries, slowly.) A server that is a replica is not an error here: a failover may
    /// promote it.
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

    /// Whether the backend (some clone of it) still exists, for tasks that must not outlive it.
    #[cfg(feature = "config")]
    pub(crate) fn liveness(&self) -> Liveness {
        Liveness(Arc::downgrade(&self.state))
    }

    /// The backend's connection, shared by the offender counts and the access lists.
    #[cfg(feature = "config")]
    pub(crate) fn connection(&self) -> connection::RedisConnection {
        self.state.conn.clone()
    }

    /// The Redis key that holds `key`'s state under the policy `policy`: `prefix:policy:{key}`.
    pub fn redis_key(&self, policy: &str, key: &Key) -> String {
        self.state.redis_key(policy, key)
    }

    /// The Redis key that holds `key`'s state under `limit`: [`redis_key`](Self::redis_key) for the
    /// GCRA, with a suffix per algorithm for the others (see the [layout](RedisBackend#key-layout)).
    pub fn state_key(&self, limit: &Limit, key: &Key) -> String {
        self.state.state_key(limit, key)
    }
}

/// Says whether a [`RedisBackend`] still exists, without keeping it alive.
#[cfg(feature = "config")]
pub(crate) struct Liveness(std::sync::Weak<RedisState>);

#[cfg(feature = "config")]
impl Liveness {
    pub(crate) fn alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

// Beside the type it makes: the settings and the work are in builder.rs, which does not need to
// know `RedisBackend`.
impl RedisBackendBuilder {
    /// Checks the settings, connects and, in `Auto` mode, detects the redis-cell module: the eager,
    /// fail-fast start. It also waits (as long as connecting may take) for the first attempt to
    /// subscribe to the other processes' resets, so that nothing it decides afterwards is cached
    /// before that subscription; an attempt that fails is logged and retried in the background.
    ///
    /// Fails when the settings are invalid (the message names the setting), when Redis cannot be
    /// reached, or when `Cell` mode is asked of a server without the module. An application that
    /// must start while Redis is down uses [`build`](Self::build) instead.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        Ok(RedisBackend::watched(
            self.validated()?.start_eagerly().await?,
        ))
    }

    /// Checks the settings and returns at once, without connecting: the lazy start, for one server,
    /// Sentinel or a Cluster. Must be called inside a tokio runtime.
    ///
    /// A background task connects (every 50 ms, backing off to 500 ms; each attempt bounded), then
    /// loads the script and detects the path; decisions come from Redis as soon as it has. Until
    /// then every call fails at once with a [`BackendError`], so the layer's failure policy answers
    /// without waiting, and one warning says that Redis is not reachable yet. The task ends when
    /// the backend (every clone) is dropped. A Cluster is in service once it has formed
    /// (`CLUSTER INFO` says `cluster_state:ok`); from then on redis-rs reconnects its nodes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use tower_throttle::key::Key;
    /// use tower_throttle::{redis::RedisBackend, Backend, Limit, Quota};
    ///
    /// // Nothing listens on port 1: built anyway, and calls fail at once.
    /// let redis = RedisBackend::builder().url("redis://127.0.0.1:1/").build().unwrap();
    /// let limit = Limit::new("api", Quota::per_second(5)).unwrap();
    /// assert!(redis.check(&limit, &Key::from("alice"), 1).await.is_err());
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

    fn check(&self, limit: &Limit, key: &Key, quantity: u64) -> Self::Future {
        self.state.check(limit, key, quantity)
    }

    fn keeps_penalties(&self) -> bool {
        true
    }

    fn check_all(&self, limits: &[Limit], key: &Key, quantity: u64) -> StackFuture {
        self.state.check_stack(limits, key, quantity, None)
    }

    fn validate_all(&self, limits: &[Limit]) -> Result<(), BuildError> {
        if limits.len() > 1
            && let Some(leased) = limits.iter().find(|l| l.budget().is_some())
        {
            return Err(BuildError::Invalid(format!(
                "policy {:?}: a leased budget takes one quota, not a stack",
                leased.name()
            )));
        }
        validate_stack(limits)
    }

    // Several keys in one decision: the limits script on keys of one hash tag (check.rs); peeks
    // and resets on the same keys (admin.rs).
    fn check_keyed(&self, limits: &[Limit], keys: &[Key], quantity: u64) -> StackFuture {
        self.state.check_keyed(limits, keys, quantity)
    }

    fn validate_keyed(&self, limits: &[Limit]) -> Result<(), BuildError> {
        if let Some(leased) = limits.iter().find(|l| l.budget().is_some()) {
            return Err(BuildError::Invalid(format!(
                "policy {:?}: a leased budget cannot be used with quotas keyed apart",
                leased.name()
            )));
        }
        // Decided by the limits script (Lua) in every mode, as a stack is: CL.THROTTLE decides
        // one key alone.
        validate_stack(limits)
    }

    fn peek_keyed(&self, limits: &[Limit], keys: &[Key]) -> PeekFuture {
        self.state.peek_keyed(limits, keys)
    }

    fn reset_keyed(&self, limits: &[Limit], keys: &[Key]) -> ResetFuture {
        self.state.reset_keyed(limits, keys)
    }

    fn release(&self, limit: &Limit, key: &Key, quantity: u64, lease: u64) {
        let Some(count) = limit.concurrency() else {
            return;
        };
        if quantity == 0 || lease == 0 {
            return;
        }
        let lease_length = limit.lease().unwrap_or(DEFAULT_LEASE);
        self.state.leases.release(
            self.state_key(limit, key),
            lease,
            quantity.min(count),
            lease_length,
        );
    }

    fn validate(&self, limit: &Limit) -> Result<(), BuildError> {
        if let Some(why) = limit.budget().and_then(|_| limit.budget_error()) {
            return Err(BuildError::Invalid(why));
        }
        args::validate(self.state.detector.mode(), limit)
    }

    fn peek(&self, limits: &[Limit], key: &Key) -> PeekFuture {
        self.state.peek(limits, key)
    }

    fn reset(&self, limits: &[Limit], key: &Key) -> ResetFuture {
        self.state.reset(limits, key)
    }

    // Counting by outcome: settle.lua, on a spawned task (see refund.rs).
    fn refund(&self, limits: &[Limit], key: &Key, quantity: u64, since: Duration) {
        refund::refund(&self.state, limits, key, quantity, since);
    }

    fn can_refund(&self) -> bool {
        true
    }

    // Metered limits: a quantity per limit on the limits script (one limit alone: a plain check,
    // on the path the mode picks), and settle.lua on a spawned task (see refund.rs).
    fn check_each(&self, limits: &[Limit], key: &Key, quantities: &[u64]) -> StackFuture {
        match (limits, quantities) {
            ([limit], [quantity]) => {
                let decided = self.state.check(limit, key, *quantity);
                Box::pin(async move { decided.await.map(|decision| vec![decision]) })
            }
            _ => self.state.check_stack(limits, key, 0, Some(quantities)),
        }
    }

    fn settle(&self, limits: &[Limit], key: &Key, deltas: &[i64], since: Duration) {
        refund::settle(&self.state, limits, key, deltas, since);
    }

    fn can_settle(&self) -> bool {
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

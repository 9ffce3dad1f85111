//! The Redis backend: one limiter shared by every process that talks to the same Redis.

mod deny;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{aio::ConnectionLike, Client, RedisError, Value};

use crate::backend::StackFuture;
use crate::limit::check_stack;
use crate::{Algorithm, Backend, BackendError, BuildError, Decision, Key, Limit};

/// Which implementation of the GCRA the [`RedisBackend`] runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisMode {
    /// `CL.THROTTLE` when the redis-cell module is loaded (on every primary of a Cluster), the Lua
    /// script otherwise. Detected at connect and again after the connection was lost, so a server that
    /// restarts with or without the module is followed. The default.
    #[default]
    Auto,
    /// `CL.THROTTLE`: requires the redis-cell module; decisions report whole seconds. Peeks
    /// (quantity 0) and quantities beyond the limit, which redis-cell 0.2.2 mishandles (a key without
    /// expiry; an overflow that crashes the server), run the Lua script instead, as do limits with a
    /// penalty box or a delay, other algorithms than the GCRA, and stacks.
    Cell,
    /// Always the Lua script (`EVALSHA`): any Redis 7.0 or newer, nanosecond results.
    Lua,
}

impl RedisMode {
    /// `"auto"`, `"cell"` or `"lua"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RedisMode::Auto => "auto",
            RedisMode::Cell => "cell",
            RedisMode::Lua => "lua",
        }
    }
}

impl fmt::Display for RedisMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RedisMode {
    type Err = BuildError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(RedisMode::Auto),
            "cell" => Ok(RedisMode::Cell),
            "lua" => Ok(RedisMode::Lua),
            other => Err(BuildError::Invalid(format!(
                "unknown Redis mode {other:?}: expected \"auto\", \"cell\" or \"lua\""
            ))),
        }
    }
}

/// The Lua path computes `tat - now` and its sums exactly in doubles (53-bit integers) while the
/// tolerance plus one interval stays within 2^52 ns (about 52 days); longer ones are refused.
const LUA_MAX_WINDOW_NS: u64 = 1 << 52;

const SCRIPT: &str = include_str!("gcra.lua");

/// Every algorithm, and stacks of limits: see the script's header.
const LIMITS_SCRIPT: &str = include_str!("limits.lua");
const RENEW_SCRIPT: &str = include_str!("renew.lua");

/// Bounds that keep the limits script's integers exact in doubles (see limits.lua): window periods
/// below 2^52 ns, counts below 2^51, and for the sliding window count × period (µs) below 2^51 and
/// counts below 2^41.
const WINDOW_MAX_PERIOD_NS: u64 = 1 << 52;
const MAX_COUNT: u64 = 1 << 51;
const SLIDING_MAX_COUNT: u64 = 1 << 41;

/// A [`Backend`] on Redis: `CL.THROTTLE` (the redis-cell module) or an equivalent atomic Lua script,
/// on one server or a Redis Cluster.
///
/// Every decision is one atomic command on one key, `prefix:policy:{key}` (a stack's: on one key per
/// limit, all with the same tag; see the [layout](#key-layout)); the braces are a hash tag, so a
/// Cluster routes each decision to the node that owns the key's slot. The user-controlled part is
/// escaped (it contains no `{`, `}`, whitespace or control bytes, so it cannot end the tag or reach
/// another namespace) and bounded: keys longer than 64 bytes are stored by their SHA-256.
///
/// Each call is bounded by the [timeout](RedisBackendBuilder::timeout) (100 ms by default); a timeout
/// or an error reaches the layer as a [`BackendError`], where
/// [`OnBackendError`](crate::OnBackendError) decides (fail open, fail closed or a local limiter). The
/// connection reconnects by itself, so decisions come from Redis again once it is back.
///
/// # Modes
///
/// - **Lua** (`EVALSHA`, reloaded after `NOSCRIPT`): the server's clock (`TIME`), integer arithmetic,
///   results in nanoseconds. Tolerances (`period / count × (max_burst + 1)`) up to about 52 days.
/// - **Cell** (`CL.THROTTLE`): redis-cell reports retry and reset in whole seconds, truncated; this
///   backend reports the next whole second instead, an upper bound that is never early. Quotas whose
///   period is not a whole number of seconds are sent as the equal rate over a whole number of seconds
///   (5 per 500 ms as 10 per second). `CL.THROTTLE` declares no key, so on a Cluster the command is
///   routed by its first argument, the key, to the node that owns its slot; during a resharding the
///   server cannot redirect it, so prefer the Lua path (`RedisMode::Lua`) on clusters that reshard.
/// - **Auto**: Cell when the module is loaded, Lua otherwise.
///
/// Both paths store the same value (the TAT in nanoseconds, redis-cell's format) under the same key,
/// so they agree on every key, and a change of mode loses nothing.
///
/// # Other algorithms and stacks
///
/// The [sliding log](crate::window::sliding_log), [fixed window](crate::window::fixed_window),
/// [sliding window](crate::window::sliding_window) and [concurrency](crate::window::concurrency)
/// limits, and stacks of limits ([`Backend::check_all`]), run a second Lua script in every mode: one
/// `EVALSHA` per decision that reads every limit's key, decides, and writes only if every limit
/// admits, so a rejection by one limit of a stack consumes nothing in the others. It computes the
/// functions of [`window`](crate::window) on the server's clock (windows aligned on multiples of the
/// period since the Unix epoch), so the memory backend and Redis agree. A GCRA limit in a stack uses
/// the GCRA script's arithmetic and key, so it shares its state with the same limit checked alone.
/// A stack's [`Penalty`](crate::Penalty) is its first limit's. Stacks hold 1 to 16 limits, never a
/// concurrency limit. What the script cannot compute exactly is refused when the layer is built:
/// window periods that are not a whole number of microseconds (the resolution of `TIME`) or not
/// shorter than 52 days, and sliding windows whose count × period exceeds 2^51 µs (about 26,000 a
/// day) or whose count exceeds 2^41.
///
/// The deny cache holds only the rejections that provably last until their retry time: a fixed
/// window's, and a sliding log's for one unit. The others (and stacks) always reach Redis, and a
/// concurrency limit is never answered locally.
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
/// Members are `token:i`, with a token drawn per call (unique within a process, random across
/// processes), so the units of one burst, all within one millisecond or one microsecond, stay
/// distinct; rejected requests add none; units that left the window are trimmed at each admission.
///
/// # Concurrency leases
///
/// An admitted request under a concurrency limit takes `quantity` slots, each a member scored by
/// the end of its lease ([`Limit::with_lease`], 60 s by default); its [`Decision::lease`] is the
/// token. While the request runs, its process renews the lease every third of its length, so a
/// long download keeps its slot; [`Backend::release`] stops the renewal and removes the members (a
/// `ZREM`, spawned on the current tokio runtime: it never blocks). Slots whose lease ended count no
/// more, so those of a process that died (and stopped renewing) free themselves within one lease.
/// A release is retried with backoff, past the circuit breaker, until Redis answers or the lease
/// would have ended anyway; a check that times out or is dropped before its answer arrives gives
/// back whatever it may have taken the same way. Whoever calls [`Backend::check`] directly must
/// call `release` for every admitted concurrency decision: until then its lease is renewed (as long
/// as the backend lives).
///
/// ```no_run
/// use tower_throttle::{RedisBackend, Policy, Quota, ThrottleLayer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = RedisBackend::builder()
///     .url("redis://127.0.0.1:6379/")
///     .prefix("myapp")
///     .connect()
///     .await?;
/// let layer = ThrottleLayer::builder()
///     .backend(redis)
///     .policy(Policy::builder("api").quota(Quota::per_second(5)).build()?)
///     .build()?;
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    mode: RedisMode,
    /// In `Auto` mode, which path runs now: `UNKNOWN`, `CELL` or `LUA`.
    active: AtomicU8,
    /// Set when the connection failed: in `Auto` mode the next call detects the module again.
    redetect: AtomicBool,
    /// In `Auto` mode, when to detect again anyway (ms on the breaker's clock): a module loaded at
    /// run time, or a reconnect that redis-rs did silently (RESP3), is noticed within this period.
    next_detect: AtomicU64,
    prefix: Box<str>,
    timeout: Duration,
    script: redis::Script,
    limits_script: redis::Script,
    breaker: Breaker,
    deny: Option<deny::DenyCache>,
    leases: LeaseTokens,
    renew_script: redis::Script,
    /// The renewal task of each concurrency lease held by a request in flight, by token.
    held: std::sync::Mutex<std::collections::HashMap<u64, tokio::task::AbortHandle>>,
}

/// Fails calls at once while Redis is known to be unreachable, instead of letting each wait for its
/// timeout. A call that fails to reach Redis (an I/O error, a dropped connection, a timeout) opens the
/// circuit for 50 ms. Then one call probes while the others still fail fast: if the probe fails too,
/// the circuit stays open twice as long (up to 500 ms); any reply from Redis, even an error reply,
/// closes it. So an outage costs requests nothing beyond the failure policy, and a Redis that comes
/// back is used again within half a second. Only single-server connections use it: on a Cluster one
/// node's trouble must not stop the decisions that other nodes can make.
struct Breaker {
    epoch: Instant,
    /// Milliseconds since `epoch` until which calls fail fast; 0 when closed.
    open_until: AtomicU64,
    /// Failed probes in a row.
    failures: AtomicU32,
    /// When the running probe started (ms since `epoch`), 0 when none. A probe older than the
    /// timeout no longer blocks the next one, even if its future was never finished nor dropped.
    probe_started: AtomicU64,
    probe_limit_ms: u64,
}

const BREAKER_MIN: Duration = Duration::from_millis(50);
const BREAKER_MAX: Duration = Duration::from_millis(500);

/// What a call may do, given the breaker.
enum Admission {
    Closed,
    /// Held until the call ends, for its `Drop`.
    Probe(#[allow(dead_code)] ProbeGuard),
    FailFast,
}

/// Lets the next call probe when this one ends, however it ends (finished, failed or dropped).
struct ProbeGuard {
    inner: Arc<Inner>,
    started: u64,
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        let _ = self.inner.breaker.probe_started.compare_exchange(
            self.started,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

impl Breaker {
    fn new(timeout: Duration) -> Self {
        Breaker {
            epoch: Instant::now(),
            open_until: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            probe_started: AtomicU64::new(0),
            probe_limit_ms: timeout.as_millis() as u64 + 1,
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// A call could not reach Redis.
    fn failed(&self, was_probe: bool) {
        let now = self.now_ms();
        if was_probe {
            let failures = self.failures.fetch_add(1, Ordering::AcqRel).min(8) + 1;
            let wait = BREAKER_MIN.saturating_mul(1 << failures).min(BREAKER_MAX);
            self.open_until
                .store(now + wait.as_millis() as u64, Ordering::Release);
        } else if self
            .open_until
            .compare_exchange(
                0,
                now + BREAKER_MIN.as_millis() as u64,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            // Calls that were already under way when the circuit opened fail too; they say nothing new.
            tracing::warn!("Redis is unreachable; failing fast until a probe gets through");
        }
    }

    /// Redis answered.
    fn answered(&self) {
        if self.open_until.load(Ordering::Acquire) != 0 {
            self.failures.store(0, Ordering::Release);
            self.open_until.store(0, Ordering::Release);
            tracing::info!("Redis answers again; rate-limit decisions come from Redis");
        }
    }
}

/// `Auto` mode detects the module again this often (ms), besides after connection failures.
const DETECT_EVERY_MS: u64 = 30_000;

const UNKNOWN: u8 = 0;
const CELL: u8 = 1;
const LUA: u8 = 2;

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field(
                "topology",
                &match self.inner.conn {
                    Conn::Single(_) => "single",
                    Conn::Cluster(_) => "cluster",
                },
            )
            .field("mode", &self.inner.mode)
            .field("active", &self.active_path())
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

impl RedisBackend {
    /// The default time a decision may take before the layer's failure policy applies: 100 ms.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

    /// The default key prefix: `"throttle"`.
    pub const DEFAULT_PREFIX: &'static str = "throttle";

    /// A builder: where to connect, mode, prefix, timeout.
    pub fn builder() -> RedisBackendBuilder {
        RedisBackendBuilder {
            target: None,
            cluster: false,
            mode: RedisMode::Auto,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            timeout: Self::DEFAULT_TIMEOUT,
            deny_cache: true,
        }
    }

    /// The path decisions take now: `Some(RedisMode::Cell)` or `Some(RedisMode::Lua)`, or `None` in
    /// `Auto` mode before the module has been detected.
    pub fn active_path(&self) -> Option<RedisMode> {
        match self.inner.mode {
            RedisMode::Auto => match self.inner.active.load(Ordering::Relaxed) {
                CELL => Some(RedisMode::Cell),
                LUA => Some(RedisMode::Lua),
                _ => None,
            },
            fixed => Some(fixed),
        }
    }

    /// The configured mode.
    pub fn mode(&self) -> RedisMode {
        self.inner.mode
    }

    /// The Redis key that holds `key`'s state under the policy `policy`: `prefix:policy:{key}`.
    pub fn redis_key(&self, policy: &str, key: &Key) -> String {
        let mut out = String::with_capacity(self.inner.prefix.len() + policy.len() + 48);
        out.push_str(&self.inner.prefix);
        out.push(':');
        out.push_str(policy);
        out.push_str(":{");
        key.render(&mut out);
        out.push('}');
        out
    }

    /// The Redis key that holds `key`'s state under `limit`: [`redis_key`](Self::redis_key) for the
    /// GCRA, with a suffix per algorithm for the others (see the [layout](RedisBackend#key-layout)).
    pub fn state_key(&self, limit: &Limit, key: &Key) -> String {
        let mut out = self.redis_key(limit.name(), key);
        out.push_str(suffix(limit.algorithm()));
        out
    }

    /// One limit of another algorithm than the GCRA, on the limits script.
    ///
    /// The deny cache holds a rejection only where it provably stays one until its retry time,
    /// whatever other processes do (they can only add units): a fixed window's (no unit leaves
    /// before the boundary, which is the retry time), and a sliding log's for one unit (the log is
    /// full, and its oldest unit, whose exit is the retry time, leaves first; `remaining` stays 0
    /// until then). A sliding window's estimate and a larger request's room grow before the retry
    /// time, and a concurrency slot may be released at any moment: those always reach Redis.
    fn check_window(&self, limit: &Limit, key: &Key, quantity: u64) -> RedisFuture {
        // Period and count stand for the GCRA's interval and tolerance: a changed quota misses.
        let fingerprint = match (limit.algorithm(), limit.window()) {
            (Algorithm::FixedWindow, Some(w)) => Some((w.period(), w.limit())),
            (Algorithm::SlidingLog, Some(w)) if quantity == 1 => Some((w.period(), w.limit())),
            _ => None,
        };
        let state_key = self.state_key(limit, key);
        if let (Some((period, count)), Some(deny)) = (fingerprint, self.inner.deny.as_ref()) {
            if let Some(denied) = deny.get(&state_key, quantity, period, count) {
                return Box::pin(std::future::ready(Ok(denied)));
            }
        }
        let penalty = limit.penalty().is_some();
        let inner = self.inner.clone();
        let sent = Instant::now();
        let token = self.inner.leases.next();
        let decided = self.check_limits_as(std::slice::from_ref(limit), key, quantity, token);
        let lease = limit.lease().zip(limit.concurrency());
        // A concurrency check whose answer never arrives (timed out, failed, or dropped by a client
        // that went away) may still have taken slots in Redis under its token: until the answer is
        // in hand, this gives them back.
        let mut unanswered = lease.map(|(lease, count)| Unanswered {
            inner: inner.clone(),
            key: state_key.clone(),
            token,
            quantity: quantity.min(count),
            lease,
        });
        Box::pin(async move {
            let decisions = decided.await;
            if decisions.is_ok() {
                if let Some(unanswered) = &mut unanswered {
                    unanswered.quantity = 0;
                }
            }
            let decision = decisions?
                .pop()
                .ok_or_else(|| BackendError::new("Redis returned no decision"))?;
            // Renewed from now until released: the layer holds the slot from this answer on (a
            // check dropped before it answers starts nothing, and its lease simply expires).
            if let (true, Some((lease, count)), Some(token)) =
                (decision.allowed, lease, decision.lease)
            {
                inner.hold(state_key, token, quantity.min(count), lease);
                return Ok(decision);
            }
            // With a penalty box every rejection must reach Redis to count as a strike; a ban holds.
            let cacheable = !decision.allowed && (!penalty || decision.banned);
            if let (true, Some((period, count)), Some(deny)) =
                (cacheable, fingerprint, inner.deny.as_ref())
            {
                let rejection = deny::Rejection {
                    decision,
                    interval: period,
                    tolerance: count,
                    whole_seconds: false,
                    banned: decision.banned,
                    until_retry: true,
                };
                deny.insert(&state_key, quantity, rejection, sent);
            }
            Ok(decision)
        })
    }

    /// Decides `limits` for `key` with the limits script: one atomic call on keys that share the
    /// client's hash tag.
    fn check_limits(&self, limits: &[Limit], key: &Key, quantity: u64) -> StackFuture {
        let token = self.inner.leases.next();
        self.check_limits_as(limits, key, quantity, token)
    }

    /// [`check_limits`](Self::check_limits) with the token that names the units it adds.
    fn check_limits_as(
        &self,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
        token: u64,
    ) -> StackFuture {
        let mut specs = Vec::with_capacity(limits.len());
        for limit in limits {
            match Spec::of(limit, self.state_key(limit, key)) {
                Ok(spec) => specs.push(spec),
                Err(why) => return Box::pin(std::future::ready(Err(BackendError::new(why)))),
            }
        }
        // The first limit's penalty, on the same keys as the GCRA path's: a policy's ban holds
        // whatever its algorithm.
        let penalty = limits.first().and_then(|first| {
            first
                .penalty()
                .map(|p| (*p, self.redis_key(first.name(), key)))
        });
        let inner = self.inner.clone();
        let call = async move { inner.run_limits(&specs, penalty, quantity, token).await };
        guarded(&self.inner, call)
    }
}

/// The units a concurrency check may have taken in Redis before its answer arrived; dropped with a
/// non-zero `quantity` (no answer), it gives them back.
struct Unanswered {
    inner: Arc<Inner>,
    key: String,
    token: u64,
    quantity: u64,
    lease: Duration,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let key = std::mem::take(&mut self.key);
        self.inner
            .spawn_release(key, self.token, self.quantity, self.lease);
    }
}

/// The key suffix of each algorithm: a policy whose algorithm changes reads a key of its own, never
/// another algorithm's (a ZSET where a string was: WRONGTYPE).
fn suffix(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Gcra => "",
        Algorithm::SlidingLog => ":log",
        Algorithm::FixedWindow => ":fixed",
        Algorithm::SlidingWindow => ":sliding",
        Algorithm::Concurrency => ":concurrency",
    }
}

/// One limit as the limits script takes it: its key, `kind`, limit and two parameters.
struct Spec {
    key: String,
    kind: u8,
    limit: u64,
    a: u64,
    b: u64,
}

const KIND_GCRA: u8 = 0;
const KIND_CONCURRENCY: u8 = 4;

impl Spec {
    /// The script's arguments for `limit`, or why the script cannot enforce it exactly.
    fn of(limit: &Limit, key: String) -> Result<Spec, String> {
        let name = limit.name();
        let too_many = |count: u64| {
            format!("policy {name:?}: the Redis backend supports counts up to 2^51, not {count}")
        };
        let algorithm = limit.algorithm();
        let spec = |kind, limit, a, b| Spec {
            key,
            kind,
            limit,
            a,
            b,
        };
        if let Some(gcra) = limit.gcra() {
            let window = gcra.tolerance().checked_add(gcra.emission_interval());
            if window.is_none_or(|w| w > LUA_MAX_WINDOW_NS) {
                return Err(format!(
                    "policy {name:?}: the Redis backend supports bursts that refill within 52 days \
                     (period / count × (max_burst + 1)); this quota needs {:?}",
                    Duration::from_nanos(gcra.tolerance())
                ));
            }
            return Ok(spec(
                KIND_GCRA,
                gcra.limit(),
                gcra.emission_interval(),
                gcra.tolerance(),
            ));
        }
        if let Some(count) = limit.concurrency() {
            if count > MAX_COUNT {
                return Err(too_many(count));
            }
            let lease = limit.lease().unwrap_or(crate::DEFAULT_LEASE);
            // Rounded up: a lease never ends before the time it was given.
            let lease_us = lease.as_nanos().div_ceil(1000) as u64;
            return Ok(spec(KIND_CONCURRENCY, count, lease_us, 0));
        }
        let Some(window) = limit.window() else {
            return Err(format!(
                "policy {name:?}: the Redis backend cannot enforce algorithm {algorithm:?}"
            ));
        };
        let (period, count) = (window.period(), window.limit());
        // Redis' clock (TIME) counts microseconds: windows cut at finer periods would not fall on
        // the boundaries window.rs computes.
        if period % 1000 != 0 {
            return Err(format!(
                "policy {name:?}: the Redis backend needs the period of a {algorithm} limit to be a \
                 whole number of microseconds, not {:?}",
                Duration::from_nanos(period)
            ));
        }
        if period >= WINDOW_MAX_PERIOD_NS {
            return Err(format!(
                "policy {name:?}: the Redis backend supports {algorithm} periods shorter than 52 days, \
                 not {:?}",
                Duration::from_nanos(period)
            ));
        }
        if count > MAX_COUNT {
            return Err(too_many(count));
        }
        let period_us = period / 1000;
        let kind = match algorithm {
            Algorithm::SlidingLog => 1,
            Algorithm::FixedWindow => 2,
            _ => {
                // The weighted estimate is count × period (µs), exact in a double below 2^51; a
                // retry time's remainder is below count × 1000.
                if count > SLIDING_MAX_COUNT {
                    return Err(format!(
                        "policy {name:?}: the Redis backend supports sliding windows of up to 2^41 \
                         units, not {count}"
                    ));
                }
                if count.checked_mul(period_us).is_none_or(|p| p > MAX_COUNT) {
                    return Err(format!(
                        "policy {name:?}: the Redis backend supports sliding windows whose count × \
                         period stays below 2^51 µs (about 26,000 a day, 600,000 an hour); this one \
                         is {count} per {:?}",
                        Duration::from_nanos(period)
                    ));
                }
                3
            }
        };
        Ok(spec(kind, count, period_us, 0))
    }
}

/// Why `limits` cannot be decided together, if they cannot: the stack rule of every backend
/// ([`check_stack`]), and one of Redis's own.
fn stack_error(limits: &[Limit]) -> Result<(), String> {
    check_stack(limits)?;
    for (i, limit) in limits.iter().enumerate() {
        // Same name and algorithm: the same key, which one call would read twice and write twice.
        if limits[..i]
            .iter()
            .any(|l| l.name() == limit.name() && l.algorithm() == limit.algorithm())
        {
            return Err(format!(
                "policy {:?} appears twice in one stack with algorithm {}: give each its own name",
                limit.name(),
                limit.algorithm()
            ));
        }
    }
    Ok(())
}

/// Lease tokens, unique within the process (a bijection of a counter, offset by a per-process random
/// seed), so that releases of concurrent requests never remove each other's slots. Across processes
/// two tokens collide with probability 2^-64.
struct LeaseTokens {
    seed: u64,
    next: AtomicU64,
}

impl LeaseTokens {
    fn new() -> Self {
        use std::hash::BuildHasher;
        let seed = std::collections::hash_map::RandomState::new()
            .hash_one((std::process::id(), std::time::SystemTime::now()));
        LeaseTokens {
            seed,
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> u64 {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            // splitmix64: distinct counters give distinct tokens. 0 means "no lease".
            let mut z = self
                .seed
                .wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            if z != 0 {
                return z;
            }
        }
    }
}

/// Runs one Redis call under the circuit breaker and the timeout, as [`RedisBackend::check`] does.
fn guarded<T, F>(
    inner: &Arc<Inner>,
    call: F,
) -> Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>
where
    T: Send + 'static,
    F: Future<Output = Result<T, RedisError>> + Send + 'static,
{
    let admission = inner.admit();
    if let Admission::FailFast = admission {
        return Box::pin(std::future::ready(Err(BackendError::new(
            "Redis is unreachable (failing fast until a probe gets through)",
        ))));
    }
    let inner = inner.clone();
    Box::pin(async move {
        let was_probe = matches!(admission, Admission::Probe(_));
        let result = match tokio::time::timeout(inner.timeout, call).await {
            Ok(Ok(value)) => {
                inner.answered();
                Ok(value)
            }
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                    inner.unreachable(was_probe);
                } else {
                    // An error reply (LOADING, OOM, NOPERM...) still proves Redis is there.
                    inner.answered();
                }
                Err(BackendError::with_source("Redis failed to decide", e))
            }
            Err(_) => {
                inner.unreachable(was_probe);
                Err(BackendError::new(format!(
                    "Redis did not decide within {:?}",
                    inner.timeout
                )))
            }
        };
        drop(admission);
        result
    })
}

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[must_use]
pub struct RedisBackendBuilder {
    target: Option<Target>,
    cluster: bool,
    mode: RedisMode,
    prefix: String,
    timeout: Duration,
    deny_cache: bool,
}

enum Target {
    Urls(Vec<String>),
    Client(Box<Client>),
    Manager(ConnectionManager),
    ClusterClient(Box<ClusterClient>),
    ClusterConnection(ClusterConnection),
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("cluster", &self.cluster)
            .field("mode", &self.mode)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("deny_cache", &self.deny_cache)
            .finish_non_exhaustive()
    }
}

impl RedisBackendBuilder {
    /// Connect to this URL: `redis://[user:password@]host:port/[db]`, `rediss://` for TLS, or
    /// `redis+unix:///path`. With [`cluster(true)`](Self::cluster), a seed node of the Cluster.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target = Some(Target::Urls(vec![url.into()]));
        self
    }

    /// Seed nodes of a Redis Cluster (implies [`cluster(true)`](Self::cluster)).
    pub fn cluster_urls<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Some(Target::Urls(urls.into_iter().map(Into::into).collect()));
        self.cluster = true;
        self
    }

    /// Whether the URLs name a Redis Cluster (default `false`: one server).
    pub fn cluster(mut self, cluster: bool) -> Self {
        self.cluster = cluster;
        self
    }

    /// Use this client (for instance one built with custom TLS certificates). A connection manager is
    /// made from it, with this backend's timeout.
    pub fn client(mut self, client: Client) -> Self {
        self.target = Some(Target::Client(Box::new(client)));
        self
    }

    /// Use this connection manager as it is (its own timeouts and reconnect settings apply, under this
    /// backend's timeout).
    pub fn connection_manager(mut self, manager: ConnectionManager) -> Self {
        self.target = Some(Target::Manager(manager));
        self
    }

    /// Use this Cluster client.
    pub fn cluster_client(mut self, client: ClusterClient) -> Self {
        self.target = Some(Target::ClusterClient(Box::new(client)));
        self
    }

    /// Use this Cluster connection as it is.
    pub fn cluster_connection(mut self, connection: ClusterConnection) -> Self {
        self.target = Some(Target::ClusterConnection(connection));
        self
    }

    /// [`RedisMode::Auto`] (default), [`RedisMode::Cell`] or [`RedisMode::Lua`].
    pub fn mode(mut self, mode: RedisMode) -> Self {
        self.mode = mode;
        self
    }

    /// The first part of every key (default `"throttle"`): 1 to 64 of `A-Z a-z 0-9 _ . - : /`, so
    /// that applications sharing a Redis keep apart.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest a decision may take, reconnecting included (default 100 ms). Past it, the call
    /// fails with a timeout and the layer's failure policy answers the request. [`connect`](Self::connect)
    /// itself, once at start-up, may take ten times as long (at least a second) to connect and to
    /// detect the module.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether to keep a local deny cache (default `true`): once Redis limits a key, requests for it
    /// are rejected here, without a round trip, until the retry time Redis gave (for as many units
    /// or more), with the same numbers aged to now. Other processes can only make a key more limited,
    /// so the cache never admits anything Redis would not. A flood from one client then costs Redis
    /// one call per retry period. Only a key reset in Redis by hand is refused here a while longer.
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on;
        self
    }

    /// Checks the settings, connects and, in `Auto` mode, detects the redis-cell module.
    ///
    /// Fails when the settings are invalid (the message names the setting), when Redis cannot be
    /// reached (an application that must start while Redis is down should retry, or start on
    /// another backend), or when `Cell` mode is asked of a server without the module.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        validate_prefix(&self.prefix).map_err(BackendError::new)?;
        if self.timeout.is_zero() {
            return Err(BackendError::new("Redis timeout must be greater than zero"));
        }
        let timeout = self.timeout;
        let target = self.target.ok_or_else(|| {
            BackendError::new("no Redis to connect to: set a url, urls, client or connection")
        })?;
        let tls = match &target {
            Target::Urls(urls) => urls.iter().any(|u| u.starts_with("rediss:")),
            Target::Client(client) => matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::TcpTls { .. }
            ),
            _ => false,
        };
        if tls {
            install_crypto_provider();
        }
        let connecting = async {
            match target {
                Target::Urls(urls) => {
                    if urls.is_empty() {
                        return Err(BackendError::new("no Redis URL given"));
                    }
                    if self.cluster {
                        let client = ClusterClient::builder(urls.clone())
                            .connection_timeout(timeout)
                            .response_timeout(timeout)
                            .build()
                            .map_err(|e| connect_error(&urls.join(", "), e))?;
                        cluster_connect(client).await
                    } else if urls.len() > 1 {
                        Err(BackendError::new(
                            "several Redis URLs given for one server: set cluster = true for a Redis Cluster",
                        ))
                    } else {
                        let client = Client::open(urls[0].as_str())
                            .map_err(|e| connect_error(&urls[0], e))?;
                        single_connect(client, timeout).await
                    }
                }
                Target::Client(client) => single_connect(*client, timeout).await,
                Target::Manager(manager) => Ok(Conn::Single(manager)),
                Target::ClusterClient(client) => cluster_connect(*client).await,
                Target::ClusterConnection(connection) => Ok(Conn::Cluster(connection)),
            }
        };
        // Connecting and detecting get a few timeouts' worth of time: this happens once, at start-up.
        let start_budget = timeout.saturating_mul(10).max(Duration::from_secs(1));
        let conn = tokio::time::timeout(start_budget, connecting)
            .await
            .map_err(|_| {
                BackendError::new(format!(
                    "Redis did not accept a connection within {start_budget:?}"
                ))
            })??;
        let backend = RedisBackend {
            inner: Arc::new(Inner {
                conn,
                mode: self.mode,
                active: AtomicU8::new(UNKNOWN),
                redetect: AtomicBool::new(false),
                next_detect: AtomicU64::new(0),
                prefix: self.prefix.into_boxed_str(),
                timeout,
                script: redis::Script::new(SCRIPT),
                limits_script: redis::Script::new(LIMITS_SCRIPT),
                breaker: Breaker::new(timeout),
                deny: self.deny_cache.then(deny::DenyCache::new),
                leases: LeaseTokens::new(),
                renew_script: redis::Script::new(RENEW_SCRIPT),
                held: Default::default(),
            }),
        };
        let mut conn = backend.inner.conn.clone();
        let probe = async {
            match self.mode {
                RedisMode::Lua => match &mut conn {
                    Conn::Single(c) => backend.inner.script.load_async(c).await.map(drop),
                    Conn::Cluster(c) => backend.inner.script.load_async(c).await.map(drop),
                },
                RedisMode::Cell | RedisMode::Auto => {
                    let loaded = cell_loaded(&mut conn).await?;
                    if self.mode == RedisMode::Cell && !loaded {
                        return Err(RedisError::from((
                            redis::ErrorKind::Client,
                            "mode \"cell\" needs the redis-cell module (CL.THROTTLE), which this Redis has not loaded; use mode \"lua\" or \"auto\"",
                        )));
                    }
                    let inner = &backend.inner;
                    inner
                        .active
                        .store(if loaded { CELL } else { LUA }, Ordering::Relaxed);
                    inner
                        .next_detect
                        .store(inner.breaker.now_ms() + DETECT_EVERY_MS, Ordering::Relaxed);
                    Ok(())
                }
            }
        };
        tokio::time::timeout(start_budget, probe)
            .await
            .map_err(|_| {
                BackendError::new(format!("Redis did not answer within {start_budget:?}"))
            })?
            .map_err(|e| BackendError::with_source("Redis refused the limiter's set-up", e))?;
        Ok(backend)
    }
}

fn validate_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() || prefix.len() > 64 {
        return Err(format!(
            "Redis key prefix {prefix:?} must be 1 to 64 characters"
        ));
    }
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.-:/".contains(&b))
    {
        return Err(format!(
            "Redis key prefix {prefix:?} may contain only A-Z a-z 0-9 _ . - : /"
        ));
    }
    Ok(())
}

/// redis-rs' rustls needs a process-wide crypto provider; ring, unless the application installed one.
fn install_crypto_provider() {
    // Fails only when a provider is installed already, which is then the one used.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn connect_error(url: &str, e: RedisError) -> BackendError {
    BackendError::with_source(
        format!(
            "cannot connect to Redis at {}",
            crate::error::redact_url(url)
        ),
        e,
    )
}

async fn single_connect(client: Client, timeout: Duration) -> Result<Conn, BackendError> {
    let url = client.get_connection_info().addr().to_string();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        // Reconnect quickly after Redis comes back: a limiter that is down costs every request the
        // failure policy.
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(500))
        .set_number_of_retries(3);
    ConnectionManager::new_with_config(client, config)
        .await
        .map(Conn::Single)
        .map_err(|e| connect_error(&url, e))
}

async fn cluster_connect(client: ClusterClient) -> Result<Conn, BackendError> {
    client
        .get_async_connection()
        .await
        .map(Conn::Cluster)
        .map_err(|e| BackendError::with_source("cannot connect to the Redis Cluster", e))
}

/// Whether `CL.THROTTLE` exists (on every primary, for a Cluster).
async fn cell_loaded(conn: &mut Conn) -> Result<bool, RedisError> {
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("INFO").arg("CL.THROTTLE");
    let reply = match conn {
        Conn::Single(manager) => manager.req_packed_command(&cmd).await?,
        Conn::Cluster(cluster) => {
            cluster
                .route_command(
                    cmd,
                    RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllMasters,
                        Some(ResponsePolicy::CombineArrays),
                    )),
                )
                .await?
        }
    };
    // One entry per server asked: the command's description, or nil where it is unknown.
    Ok(match reply {
        Value::Array(entries) => {
            !entries.is_empty() && entries.iter().all(|e| !matches!(e, Value::Nil))
        }
        _ => false,
    })
}

/// A decision and how it was made.
struct Answer {
    decision: Decision,
    /// By `CL.THROTTLE`: durations in whole seconds, rounded up.
    whole_seconds: bool,
    /// By a penalty-box ban.
    banned: bool,
}

/// What a policy's quota becomes on each path.
struct Args {
    penalty: Option<crate::Penalty>,
    /// The limit delays instead of rejecting ([`Limit::with_delay`]): the tolerance includes the
    /// delay, which `CL.THROTTLE` cannot express, so it always runs on Lua.
    delayed: bool,
    interval: u64,
    tolerance: u64,
    limit: u64,
    /// `CL.THROTTLE key max_burst count period`: `None` when the quota has no exact whole-second form.
    cell: Option<CellArgs>,
}

#[derive(Clone, Copy)]
struct CellArgs {
    max_burst: u64,
    count: u64,
    period_secs: u64,
}

impl Args {
    fn new(limit: &Limit) -> Option<Args> {
        let params = limit.gcra()?;
        let delayed = limit.delay().is_some();
        Some(Args {
            penalty: limit.penalty().copied(),
            delayed,
            interval: params.emission_interval(),
            tolerance: params.tolerance(),
            limit: params.limit(),
            cell: cell_args(limit).filter(|_| !delayed),
        })
    }

    fn lua_ok(&self) -> bool {
        self.tolerance
            .checked_add(self.interval)
            .is_some_and(|w| w <= LUA_MAX_WINDOW_NS)
    }
}

/// The quota as `count` per `period_secs` whole seconds, at exactly the same rate: the smallest whole
/// number of seconds that holds a whole number of emissions.
fn cell_args(limit: &Limit) -> Option<CellArgs> {
    const NANOS: u128 = 1_000_000_000;
    let quota = limit.quota();
    let period = quota.period().as_nanos();
    let count = u128::from(quota.count());
    if period == 0 || count == 0 {
        return None;
    }
    // A whole-second period is sent as it is; otherwise count' / secs = count / period, with the
    // smallest such secs: period / gcd(period, count × 10^9).
    let secs = if period.is_multiple_of(NANOS) {
        period / NANOS
    } else {
        period / gcd(period, count * NANOS)
    };
    let scaled_count = count * NANOS * secs / period;
    let max = i64::MAX as u128;
    if secs == 0 || secs > max / NANOS || scaled_count == 0 || scaled_count > max {
        return None;
    }
    // redis-cell divides the period by the count in nanoseconds, like Quota::validate: same interval.
    let cell_interval = secs * NANOS / scaled_count;
    if Some(cell_interval as u64) != limit.gcra().map(|p| p.emission_interval()) {
        return None;
    }
    Some(CellArgs {
        max_burst: quota.max_burst(),
        count: scaled_count as u64,
        period_secs: secs as u64,
    })
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The future of [`RedisBackend::check`].
pub type RedisFuture = Pin<Box<dyn Future<Output = Result<Decision, BackendError>> + Send>>;

impl Backend for RedisBackend {
    type Future = RedisFuture;

    fn check(&self, limit: &Limit, key: &Key, quantity: u64) -> Self::Future {
        let inner = self.inner.clone();
        let Some(args) = Args::new(limit) else {
            return self.check_window(limit, key, quantity);
        };
        // A key known to be limited stays limited, whether Redis answers or not.
        let redis_key = self.redis_key(limit.name(), key);
        if let Some(denied) = inner
            .deny
            .as_ref()
            .and_then(|d| d.get(&redis_key, quantity, args.interval, args.tolerance))
        {
            return Box::pin(std::future::ready(Ok(denied)));
        }
        let guard = self.inner.clone();
        guarded(&guard, async move {
            let sent = Instant::now();
            let Answer {
                decision,
                whole_seconds,
                banned,
            } = inner.decide(&redis_key, &args, quantity).await?;
            // With a penalty box every rejection must reach Redis to count as a strike; a ban,
            // though, holds whatever comes.
            let cacheable = args.penalty.is_none() || banned;
            if let (false, true, Some(cache)) = (decision.allowed, cacheable, &inner.deny) {
                // Timed from when the call was sent: Redis decided after that, so the retry time
                // is held no later than Redis meant.
                let rejection = deny::Rejection {
                    decision,
                    interval: args.interval,
                    tolerance: args.tolerance,
                    whole_seconds,
                    banned,
                    until_retry: false,
                };
                cache.insert(&redis_key, quantity, rejection, sent);
            }
            Ok(decision)
        })
    }

    fn keeps_penalties(&self) -> bool {
        true
    }

    fn check_all(&self, limits: &[Limit], key: &Key, quantity: u64) -> StackFuture {
        if let Err(why) = stack_error(limits) {
            return Box::pin(std::future::ready(Err(BackendError::new(why))));
        }
        self.check_limits(limits, key, quantity)
    }

    fn validate_all(&self, limits: &[Limit]) -> Result<(), BuildError> {
        stack_error(limits).map_err(BuildError::Invalid)?;
        for limit in limits {
            match Args::new(limit) {
                // In a stack the GCRA runs on the limits script, with gcra.lua's arithmetic and bounds.
                Some(args) if !args.lua_ok() => {
                    return Err(BuildError::Invalid(format!(
                        "policy {:?}: the Redis backend supports bursts that refill within 52 days \
                         (period / count × (max_burst + 1)); this quota needs {:?}",
                        limit.name(),
                        Duration::from_nanos(args.tolerance)
                    )))
                }
                Some(_) => {}
                None => {
                    Spec::of(limit, String::new()).map_err(BuildError::Invalid)?;
                }
            }
        }
        Ok(())
    }

    fn release(&self, limit: &Limit, key: &Key, quantity: u64, lease: u64) {
        let Some(count) = limit.concurrency() else {
            return;
        };
        if quantity == 0 || lease == 0 {
            return;
        }
        let renewal = self
            .inner
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&lease);
        if let Some(renewal) = renewal {
            renewal.abort();
        }
        let lease_length = limit.lease().unwrap_or(crate::DEFAULT_LEASE);
        self.inner.spawn_release(
            self.state_key(limit, key),
            lease,
            quantity.min(count),
            lease_length,
        );
    }

    fn validate(&self, limit: &Limit) -> Result<(), BuildError> {
        let Some(args) = Args::new(limit) else {
            return Spec::of(limit, String::new())
                .map(drop)
                .map_err(BuildError::Invalid);
        };
        let lua = || {
            if args.lua_ok() {
                Ok(())
            } else {
                Err(BuildError::Invalid(format!(
                    "policy {:?}: the Lua path of the Redis backend supports bursts that refill within \
                     52 days (period / count × (max_burst + 1)); this quota needs {:?}",
                    limit.name(),
                    Duration::from_nanos(args.tolerance)
                )))
            }
        };
        let cell = || {
            if args.cell.is_some() {
                Ok(())
            } else {
                Err(BuildError::Invalid(format!(
                    "policy {:?}: CL.THROTTLE cannot express this quota exactly (its period must be \
                     a whole number of seconds at the same rate); use mode \"lua\"",
                    limit.name()
                )))
            }
        };
        match self.inner.mode {
            RedisMode::Lua => lua(),
            // A delayed limit runs on Lua in every mode (CL.THROTTLE's whole seconds cannot express
            // its delay).
            RedisMode::Cell if args.delayed => lua(),
            RedisMode::Cell => cell(),
            // Auto may run either path, and a policy that only one path can enforce runs on Lua: so
            // Lua must be able to.
            RedisMode::Auto => lua(),
        }
    }
}

impl Inner {
    fn admit(self: &Arc<Self>) -> Admission {
        if matches!(self.conn, Conn::Cluster(_)) {
            return Admission::Closed;
        }
        let breaker = &self.breaker;
        let until = breaker.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Admission::Closed;
        }
        let now = breaker.now_ms();
        if now < until {
            return Admission::FailFast;
        }
        let running = breaker.probe_started.load(Ordering::Acquire);
        if running != 0 && now < running + breaker.probe_limit_ms {
            return Admission::FailFast;
        }
        match breaker.probe_started.compare_exchange(
            running,
            now,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => Admission::Probe(ProbeGuard {
                inner: self.clone(),
                started: now,
            }),
            Err(_) => Admission::FailFast,
        }
    }

    fn unreachable(&self, was_probe: bool) {
        if self.mode == RedisMode::Auto {
            self.redetect.store(true, Ordering::Relaxed);
        }
        if matches!(self.conn, Conn::Single(_)) {
            self.breaker.failed(was_probe);
        }
    }

    fn answered(&self) {
        if matches!(self.conn, Conn::Single(_)) {
            self.breaker.answered();
        }
    }

    async fn decide(&self, key: &str, args: &Args, quantity: u64) -> Result<Answer, RedisError> {
        let mut conn = self.conn.clone();
        let use_cell = match self.mode {
            RedisMode::Lua => false,
            RedisMode::Cell => true,
            RedisMode::Auto => self.detect_if_due(&mut conn).await?,
        };
        let conn = &mut conn;
        // Peeks (quantity 0) and quantities beyond the limit go to Lua: redis-cell 0.2.2 writes a key
        // without expiry for the first, and for a huge quantity overflows into a negative TAT that
        // crashes the server on the next call. Quotas with no whole-second form, and policies with a
        // penalty box (strikes and bans go with the decision, atomically), go to Lua too.
        match args.cell {
            Some(cell)
                if use_cell && quantity > 0 && quantity <= args.limit && args.penalty.is_none() =>
            {
                match throttle(conn, key, cell, quantity).await {
                    Err(e) if self.mode == RedisMode::Auto && is_unknown_command(&e) => {
                        // The module went away (a restart without it): Lua from now on, and this
                        // request too (the failed command wrote nothing).
                        self.active.store(LUA, Ordering::Relaxed);
                        tracing::warn!("CL.THROTTLE is no longer available; using the Lua script");
                        self.lua(conn, key, args, quantity).await
                    }
                    other => other.map(|decision| Answer {
                        decision,
                        whole_seconds: true,
                        banned: false,
                    }),
                }
            }
            _ => self.lua(conn, key, args, quantity).await,
        }
    }

    /// In `Auto` mode: whether to use `CL.THROTTLE`, detecting the module first when it is unknown,
    /// after a connection failure, or every 30 s. If detection fails, the last known answer stands.
    async fn detect_if_due(&self, conn: &mut Conn) -> Result<bool, RedisError> {
        let now = self.breaker.now_ms();
        let known = self.active.load(Ordering::Relaxed);
        if known == UNKNOWN
            || self.redetect.load(Ordering::Relaxed)
            || now >= self.next_detect.load(Ordering::Relaxed)
        {
            // The flag is cleared only once detection has answered, so a call dropped half-way
            // leaves it for the next one.
            match cell_loaded(conn).await {
                Ok(loaded) => {
                    let path = if loaded { CELL } else { LUA };
                    if known != UNKNOWN && known != path {
                        tracing::info!(
                            cell = loaded,
                            "redis-cell module {}; rate-limit decisions use {}",
                            if loaded { "found" } else { "gone" },
                            if loaded {
                                "CL.THROTTLE"
                            } else {
                                "the Lua script"
                            }
                        );
                    }
                    self.active.store(path, Ordering::Relaxed);
                    self.redetect.store(false, Ordering::Relaxed);
                    self.next_detect
                        .store(now + DETECT_EVERY_MS, Ordering::Relaxed);
                }
                Err(e) if known == UNKNOWN => return Err(e),
                Err(_) => {}
            }
        }
        Ok(self.active.load(Ordering::Relaxed) == CELL)
    }

    /// Removes a request's concurrency units (`token:0..quantity`), on a spawned task. It bypasses the
    /// circuit breaker and retries (each try bounded by the timeout, with backoff) until Redis
    /// answers or the lease would have ended anyway: a release is off every request's path, and a
    /// lost one would hold a slot for the whole lease. Without a runtime the lease simply expires.
    fn spawn_release(self: &Arc<Self>, key: String, token: u64, quantity: u64, lease: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if quantity == 0 {
            return;
        }
        let inner = self.clone();
        let give_up = Instant::now() + lease;
        runtime.spawn(async move {
            let members: Vec<String> = (0..quantity).map(|i| format!("{token}:{i}")).collect();
            let mut backoff = Duration::from_millis(20);
            loop {
                let mut cmd = redis::cmd("ZREM");
                cmd.arg(&key).arg(&members);
                let mut conn = inner.conn.clone();
                let call = async {
                    match &mut conn {
                        Conn::Single(c) => cmd.query_async::<u64>(c).await,
                        Conn::Cluster(c) => cmd.query_async::<u64>(c).await,
                    }
                };
                match tokio::time::timeout(inner.timeout, call).await {
                    Ok(Ok(_)) => return,
                    Ok(Err(e)) if !(e.is_io_error() || e.is_connection_dropped() || e.is_timeout()) => {
                        tracing::debug!(error = %e, "a concurrency slot was not released; its lease will expire");
                        return;
                    }
                    _ => {}
                }
                if Instant::now() + backoff >= give_up {
                    tracing::debug!("Redis stayed unreachable; a concurrency slot will be freed when its lease expires");
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        });
    }

    /// Keeps a request's concurrency leases alive while it runs: extends them every third of the
    /// lease, until [`Backend::release`] stops it (or the backend is dropped, or a lease was lost).
    /// A process that dies stops renewing, and its leases expire.
    fn hold(self: &Arc<Self>, key: String, token: u64, quantity: u64, lease: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(self);
        let lease_us = lease.as_micros().max(1) as u64;
        let every = (lease / 3).max(Duration::from_millis(10));
        let task = runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let mut invocation = inner.renew_script.prepare_invoke();
                invocation.key(&key).arg(token).arg(quantity).arg(lease_us);
                let mut conn = inner.conn.clone();
                let renew = async {
                    match &mut conn {
                        Conn::Single(c) => invocation.invoke_async::<i64>(c).await,
                        Conn::Cluster(c) => invocation.invoke_async::<i64>(c).await,
                    }
                };
                match tokio::time::timeout(inner.timeout, renew).await {
                    // Every lease is gone (ended, or released meanwhile): nothing left to keep.
                    Ok(Ok(0)) => {
                        inner.held_mut().remove(&token);
                        return;
                    }
                    Ok(Ok(_)) => {}
                    // Redis is away: try again at the next tick, while the leases still run.
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "a concurrency lease was not renewed")
                    }
                    Err(_) => tracing::debug!("a concurrency lease was not renewed in time"),
                }
            }
        });
        self.held_mut().insert(token, task.abort_handle());
    }

    fn held_mut(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, tokio::task::AbortHandle>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn run_limits(
        &self,
        specs: &[Spec],
        penalty: Option<(crate::Penalty, String)>,
        quantity: u64,
        token: u64,
    ) -> Result<Vec<Decision>, RedisError> {
        let mut invocation = self.limits_script.prepare_invoke();
        for spec in specs {
            invocation.key(&spec.key);
        }
        let (after, within, ban) = match &penalty {
            Some((penalty, base)) => {
                invocation
                    .key(format!("{base}:strikes"))
                    .key(format!("{base}:ban"));
                (
                    penalty.after(),
                    penalty.within().as_millis().max(1) as u64,
                    penalty.ban().as_millis().max(1) as u64,
                )
            }
            None => (0, 0, 0),
        };
        invocation
            .arg(specs.len())
            .arg(quantity)
            .arg(token)
            .arg(after)
            .arg(within)
            .arg(ban);
        for spec in specs {
            invocation
                .arg(spec.kind)
                .arg(spec.limit)
                .arg(spec.a)
                .arg(spec.b);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = match &mut conn {
            Conn::Single(c) => invocation.invoke_async(c).await?,
            Conn::Cluster(c) => invocation.invoke_async(c).await?,
        };
        if reply.len() != 1 + 5 * specs.len() {
            return Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "the limits script returned a reply of the wrong length",
            )));
        }
        let banned = reply[0] == 1;
        Ok(reply[1..]
            .chunks_exact(5)
            .zip(specs)
            .map(|(r, spec)| {
                let mut decision = from_reply([r[0], r[1], r[2], r[3], r[4]], Duration::from_nanos);
                decision.banned = banned;
                if decision.allowed && spec.kind == KIND_CONCURRENCY {
                    decision = decision.with_lease(token);
                }
                decision
            })
            .collect())
    }

    async fn lua(
        &self,
        conn: &mut Conn,
        key: &str,
        args: &Args,
        quantity: u64,
    ) -> Result<Answer, RedisError> {
        let mut invocation = self.script.key(key);
        invocation
            .arg(args.interval)
            .arg(args.tolerance)
            .arg(args.limit)
            .arg(quantity);
        if let Some(penalty) = &args.penalty {
            // Same hash tag as the state: one slot, one atomic call.
            invocation
                .key(format!("{key}:strikes"))
                .key(format!("{key}:ban"))
                .arg(penalty.after())
                .arg(penalty.within().as_millis().max(1) as u64)
                .arg(penalty.ban().as_millis().max(1) as u64);
        }
        let reply: [i64; 6] = match conn {
            Conn::Single(c) => invocation.invoke_async(c).await?,
            Conn::Cluster(c) => invocation.invoke_async(c).await?,
        };
        let [limited, limit, remaining, retry, reset, banned] = reply;
        let mut decision = from_reply(
            [limited, limit, remaining, retry, reset],
            Duration::from_nanos,
        );
        decision.banned = banned == 1;
        Ok(Answer {
            decision,
            whole_seconds: false,
            banned: banned == 1,
        })
    }
}

async fn throttle(
    conn: &mut Conn,
    key: &str,
    cell: CellArgs,
    quantity: u64,
) -> Result<Decision, RedisError> {
    let mut cmd = redis::cmd("CL.THROTTLE");
    cmd.arg(key)
        .arg(cell.max_burst)
        .arg(cell.count)
        .arg(cell.period_secs)
        .arg(quantity);
    // With no declared key, a Cluster routes the command by its first argument: the key's slot.
    let reply: [i64; 5] = match conn {
        Conn::Single(c) => cmd.query_async(c).await?,
        Conn::Cluster(c) => cmd.query_async(c).await?,
    };
    // Whole seconds, truncated: report the next whole second, which is never early.
    Ok(from_reply(reply, |secs| {
        Duration::from_secs(secs.saturating_add(1))
    }))
}

fn is_unknown_command(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("unknown command"))
}

/// `[limited, limit, remaining, retry_after, reset_after]`, durations converted by `unit`.
fn from_reply(reply: [i64; 5], unit: impl Fn(u64) -> Duration) -> Decision {
    let [limited, limit, remaining, retry_after, reset_after] = reply;
    let limit = limit.max(0) as u64;
    let remaining = remaining.max(0) as u64;
    let reset_after = unit(reset_after.max(0) as u64);
    if limited == 0 {
        Decision::allowed(limit, remaining, reset_after)
    } else {
        let retry_after = u64::try_from(retry_after).ok().map(unit);
        Decision::limited(limit, remaining, retry_after, reset_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    fn cell(quota: Quota) -> Option<(u64, u64, u64)> {
        let limit = Limit::new("t", quota).unwrap();
        cell_args(&limit).map(|c| (c.max_burst, c.count, c.period_secs))
    }

    #[test]
    fn quotas_map_to_whole_second_periods_at_the_same_rate() {
        assert_eq!(cell(Quota::per_second(5)), Some((4, 5, 1)));
        assert_eq!(
            cell(Quota::cl_throttle(15, 30, Duration::from_secs(60))),
            Some((15, 30, 60))
        );
        assert_eq!(
            cell(Quota::per_period(5, Duration::from_millis(500))),
            Some((4, 10, 1))
        );
        assert_eq!(
            cell(Quota::per_period(1, Duration::from_millis(1500))),
            Some((0, 2, 3))
        );
        assert_eq!(
            cell(Quota::per_period(3, Duration::from_millis(700))),
            Some((2, 30, 7))
        );
        assert_eq!(cell(Quota::per_day(1000)), Some((999, 1000, 86_400)));
    }

    #[test]
    fn lease_tokens_are_distinct_and_never_zero() {
        let tokens = LeaseTokens::new();
        let drawn: std::collections::HashSet<u64> = (0..100_000).map(|_| tokens.next()).collect();
        assert_eq!(drawn.len(), 100_000);
        assert!(!drawn.contains(&0));
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(validate_prefix("throttle").is_ok());
        assert!(validate_prefix("app:v2/limits").is_ok());
        for bad in ["", "a b", "a{b}", "x".repeat(65).as_str(), "é"] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn passwords_stay_out_of_messages() {
        use crate::error::redact_url;
        assert_eq!(
            redact_url("rediss://user:s3cret@host:6380/0"),
            "rediss://user:***@host:6380/0"
        );
        assert_eq!(redact_url("redis://host:6379/"), "redis://host:6379/");
    }

    #[test]
    fn cell_replies_round_up_to_whole_seconds() {
        let limited = from_reply([1, 5, 0, 0, 4], |s| Duration::from_secs(s + 1));
        assert!(!limited.allowed);
        assert_eq!(limited.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(limited.retry_after_secs(), 1);
        let never = from_reply([1, 5, 0, -1, 4], Duration::from_secs);
        assert_eq!(never.retry_after, None);
    }
}

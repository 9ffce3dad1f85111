//! [`SingleServer`]: the crate's own reconnecting connection to one server, found by a [`Source`].
//! Why not redis-rs 1.8.1's `ConnectionManager`: it reconnects only after an error redis-rs counts
//! as unrecoverable (`reconnect_if_dropped!`, src/aio/connection_manager.rs:404, by
//! `is_unrecoverable_error`, src/errors/redis_error.rs:393), and a demoted primary answers every
//! write `READONLY`, which is not one, forever; a `Client` from Sentinel
//! (`SentinelClient::async_get_client`, src/sentinel.rs:1356) names the primary found once. This
//! can go once the manager drops its connection on `READONLY`, `MASTERDOWN` and `LOADING` and asks
//! Sentinel at each reconnect.
//!
//! Here those, I/O errors and stalls drop it; reconnect.rs makes it again, calls failing meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisError, Value};
use tokio::sync::Notify;

use crate::backend::redis::health::attempts::{Attempts, Misconfigured};
use crate::backend::redis::health::recorder::Clock;
use crate::error::{redact_url, BackendError};

/// A connection silent this long (and two timeouts) at a call's timeout is made again (frozen).
const STALL_LIMIT: Duration = Duration::from_secs(1);

/// Where the server is found, at every connect: a client's address, or the sentinels' primary.
pub(crate) enum Source {
    Client(Box<Client>),
    Sentinel {
        client: Box<SentinelClient>,
        service: String,
        /// TLS to the sentinels or to the primary: the crypto provider must be installed.
        tls: bool,
        /// The sentinels' URLs, for the one connection that asks where the primary is.
        urls: Vec<String>,
        /// That connection, to `urls[watching]`; made again (on the next sentinel) after an error.
        watch: Option<MultiplexedConnection>,
        watching: usize,
        /// A primary the watched sentinel named that a reconnect would not find (the sentinel
        /// lags), and when to look again, and the wait after that.
        doubted: Option<Doubt>,
    },
}

/// A primary one sentinel names and the others do not confirm: asked about again after a wait
/// that doubles (up to [`DOUBT_AT_MOST`]), not every second.
pub(crate) struct Doubt {
    named: String,
    again: std::time::Instant,
    wait: Duration,
}

/// A confirmation asks every sentinel and the primary they name: at most this often for one
/// doubted name.
const DOUBT_AT_MOST: Duration = Duration::from_secs(8);

impl Source {
    /// What to name in messages: the URL without its password, or the Sentinel service.
    pub(crate) fn describe(&self) -> String {
        match self {
            Source::Client(client) => redact_url(&client.get_connection_info().addr().to_string()),
            Source::Sentinel { service, .. } => format!("Sentinel service {service:?}"),
        }
    }

    /// With Sentinel, where the primary is now (`host:port`), asked on one kept connection to a
    /// sentinel (the next after an error), each step within `timeout`; `None`: no sentinel answered.
    async fn primary_address(&mut self, timeout: Duration) -> Option<String> {
        let Source::Sentinel {
            service,
            urls,
            watch,
            watching,
            ..
        } = self
        else {
            return None;
        };
        for _ in 0..urls.len() {
            if watch.is_none()
                && let Ok(client) = Client::open(urls[*watching].as_str())
            {
                let connecting = attempt_budget(timeout);
                let opened = tokio::time::timeout(connecting, open(&client, timeout)).await;
                *watch = opened.ok().and_then(Result::ok);
            }
            if let Some(conn) = watch.as_mut() {
                let mut cmd = redis::cmd("SENTINEL");
                cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(service.as_str());
                let asked =
                    tokio::time::timeout(timeout, cmd.query_async::<Option<(String, u16)>>(conn))
                        .await;
                if let Ok(Ok(Some((host, port)))) = asked {
                    return Some(format!("{host}:{port}"));
                }
            }
            // No answer (or the sentinel does not know the service): the next sentinel.
            *watch = None;
            *watching = (*watching + 1) % urls.len();
        }
        None
    }

    /// With Sentinel, whether `named` is a primary not to confirm again yet.
    fn doubts(&self, named: &str) -> bool {
        matches!(self, Source::Sentinel { doubted: Some(d), .. }
            if d.named == named && std::time::Instant::now() < d.again)
    }

    /// With Sentinel, `named` was not confirmed (`Some`), or the primary named is the one connected
    /// to again (`None`).
    fn doubt(&mut self, named: Option<&str>) {
        let Source::Sentinel { doubted, .. } = self else {
            return;
        };
        *doubted = named.map(|named| {
            let wait = match doubted.take() {
                Some(d) if d.named == named => (d.wait * 2).min(DOUBT_AT_MOST),
                _ => Duration::from_secs(1),
            };
            let again = std::time::Instant::now() + wait;
            Doubt {
                named: named.to_owned(),
                again,
                wait,
            }
        });
    }

    /// A client for the server to connect to now.
    pub(crate) async fn client(&mut self) -> Result<Client, RedisError> {
        match self {
            Source::Client(client) => Ok((**client).clone()),
            Source::Sentinel { client, .. } => client.async_get_client().await,
        }
    }
}

/// The live connection and where it leads.
#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
    generation: u64,
}

/// Why an attempt failed: Redis unreachable (or slow), or a configuration error.
pub(crate) struct AttemptError {
    pub(crate) error: BackendError,
    pub(crate) misconfigured: Option<Misconfigured>,
}

impl From<BackendError> for AttemptError {
    fn from(error: BackendError) -> Self {
        AttemptError {
            error,
            misconfigured: None,
        }
    }
}

impl AttemptError {
    pub(crate) fn misconfigured(kind: fn(String) -> Misconfigured, message: String) -> Self {
        AttemptError {
            error: BackendError::new(message.clone()),
            misconfigured: Some(kind(message)),
        }
    }

    /// A failure as [`describe`](super::set_up::SetUpError::describe) says it.
    pub(crate) fn described((message, misconfigured): (String, bool)) -> Self {
        match misconfigured {
            true => Self::misconfigured(Misconfigured::Fatal, message),
            false => BackendError::new(message).into(),
        }
    }
}

/// One Redis server behind a connection that the background task makes again whenever it fails.
pub(crate) struct SingleServer {
    live: RwLock<Option<Live>>,
    generation: AtomicU64,
    /// When the connection last answered (or was made): ms on `clock`.
    last_answer: AtomicU64,
    /// When the first call that timed out since then began: ms on `clock`.
    stalled_since: AtomicU64,
    /// The last connection was dropped because the server refused writes (a replica).
    pub(crate) refused_writes: AtomicBool,
    /// The backend's one clock (its state takes this one).
    pub(crate) clock: Clock,
    /// Wakes the task: the connection was dropped.
    pub(crate) lost: Notify,
    pub(crate) timeout: Duration,
    /// The database number commands run in.
    pub(crate) db: i64,
    /// The task's attempts, where it connected last and the last error.
    pub(crate) attempts: Attempts,
    /// The URL or Sentinel service, for messages.
    pub(crate) target: String,
}

impl SingleServer {
    /// Not connected yet.
    pub(crate) fn new(source: &Source, timeout: Duration) -> Self {
        let (db, tls) = match source {
            Source::Client(client) => {
                let info = client.get_connection_info();
                let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
                (info.redis_settings().db(), tls)
            }
            Source::Sentinel { tls, .. } => (0, *tls),
        };
        // Before any connection (the task's, to sentinels too): rustls panics without a provider.
        if tls {
            install_crypto_provider();
        }
        SingleServer {
            live: RwLock::new(None),
            generation: AtomicU64::new(0),
            last_answer: AtomicU64::new(0),
            stalled_since: AtomicU64::new(0),
            refused_writes: AtomicBool::new(false),
            clock: Clock::new(),
            lost: Notify::new(),
            timeout,
            db,
            attempts: Attempts::default(),
            target: source.describe(),
        }
    }

    fn current(&self) -> Option<Live> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn connected(&self) -> bool {
        self.current().is_some()
    }

    /// The backend is gone: drop the connection for those still holding this server.
    pub(crate) fn close(&self) {
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(crate) fn install(&self, conn: MultiplexedConnection, address: String) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.answered();
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = Some(Live { conn, generation });
        self.attempts.connected(Some(address));
    }

    /// Drops the connection of `generation` (not a newer one made meanwhile) and wakes the task.
    fn drop_connection(&self, generation: u64, why: &str) {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            *live = None;
            drop(live);
            self.attempts.lost(why);
            self.lost.notify_one();
        }
    }

    fn answered(&self) {
        self.last_answer
            .store(self.clock.now_ms(), Ordering::Relaxed);
    }

    /// A call's outcome: a reply with a `READONLY`, `MASTERDOWN` or `LOADING` among its values, or
    /// an error that says the server is gone, read-only or not ready, drops the connection.
    fn outcome(&self, generation: u64, result: Result<&[Value], &RedisError>) {
        let values = match result {
            Ok(values) => values,
            Err(error) if must_reconnect(error) => {
                let refused = is_not_primary(error);
                self.refused_writes.store(refused, Ordering::Relaxed);
                return self.drop_connection(generation, &error.to_string());
            }
            Err(error) if error.is_timeout() => return self.timed_out(),
            Err(_) => return,
        };
        self.answered();
        let not_primary = values.iter().find_map(|v| match v {
            Value::ServerError(e) if is_not_primary_code(e.code()) => Some(e),
            _ => None,
        });
        if let Some(e) = not_primary {
            let text = format!("{}: {}", e.code(), e.details().unwrap_or(""));
            self.refused_writes.store(true, Ordering::Relaxed);
            self.drop_connection(generation, &text);
        }
    }

    /// With Sentinel, asks which server is the primary (every second): a different answer drops the
    /// connection, as an old primary may take writes for seconds before its demotion, then lose them.
    /// The answer is one sentinel's, which may lag the others (a failover it has not seen, a
    /// partition's minority side): it is confirmed as a reconnect finds the primary (the first
    /// sentinel whose primary says so itself) before the connection is dropped. Unconfirmed (or
    /// not confirmed in time), the name is doubted: confirmed again after 1 s, then 2, 4... up to
    /// 8 s.
    pub(crate) async fn follow_sentinels(&self, source: &mut Source) {
        let Some(live) = self.current() else { return };
        let Some(named) = source.primary_address(self.timeout).await else {
            return;
        };
        let (current, _) = self.attempts.snapshot();
        let Some(current) = current.filter(|c| *c != named) else {
            source.doubt(None);
            return;
        };
        if source.doubts(&named) {
            return;
        }
        let finding = tokio::time::timeout(attempt_budget(self.timeout), source.client()).await;
        let found = match finding {
            Ok(Ok(client)) => redact_url(&client.get_connection_info().addr().to_string()),
            _ => current.clone(),
        };
        if found == current {
            source.doubt(Some(&named));
            return;
        }
        self.drop_connection(
            live.generation,
            &format!("the sentinels name a new primary, {found}"),
        );
    }

    /// A call timed out: the connection is dropped if calls have gone unanswered for
    /// [`STALL_LIMIT`], counted from the first that timed out since the last answer (an idle
    /// connection's one slow reply is no stall; a connection made since the call started answered
    /// at its making, so is never dropped for it).
    pub(crate) fn timed_out(&self) {
        let Some(live) = self.current() else { return };
        let now = self.clock.now_ms();
        let answered = self.last_answer.load(Ordering::Relaxed);
        let mut stalled = self.stalled_since.load(Ordering::Relaxed);
        if stalled <= answered {
            stalled = now
                .saturating_sub(self.timeout.as_millis() as u64)
                .max(answered);
            self.stalled_since.store(stalled, Ordering::Relaxed);
        }
        let limit = STALL_LIMIT.max(self.timeout.saturating_mul(2));
        if now.saturating_sub(stalled) > limit.as_millis() as u64 {
            self.drop_connection(
                live.generation,
                &format!("Redis did not answer within {:?}", self.timeout),
            );
        }
    }

    /// One command on the live connection, or an error at once without one.
    pub(crate) async fn command(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let Some(mut live) = self.current() else {
            return Err(not_connected());
        };
        let result = live.conn.req_packed_command(cmd).await;
        self.outcome(live.generation, result.as_ref().map(std::slice::from_ref));
        result
    }

    /// A pipeline on the live connection, or an error at once without one.
    pub(crate) async fn pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        let Some(mut live) = self.current() else {
            return Err(not_connected());
        };
        let result = live.conn.req_packed_commands(pipeline, offset, count).await;
        self.outcome(live.generation, result.as_deref());
        result
    }
}

fn not_connected() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "not connected to Redis (reconnecting in the background)",
    ))
}

/// Whether `error` means the connection leads nowhere useful: the server gone, read-only, without a
/// primary or loading (a timeout only once the connection is silent: `timed_out`).
fn must_reconnect(error: &RedisError) -> bool {
    !error.is_timeout() && (is_unreachable(error) || error.is_connection_refusal())
}

/// Whether `error` says Redis cannot answer here for now — the link lost or silent, or the node
/// not a primary (a failover under way) — so that a call is worth trying again, unlike after an
/// error reply.
pub(crate) fn is_unreachable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_timeout()
        || is_not_primary(error)
}

/// `READONLY`, `MASTERDOWN` or `LOADING`: Redis answered, but cannot decide here.
pub(crate) fn is_not_primary(error: &RedisError) -> bool {
    error.code().is_some_and(is_not_primary_code)
}

fn is_not_primary_code(code: &str) -> bool {
    matches!(code, "READONLY" | "MASTERDOWN" | "LOADING")
}

/// The configuration error a Cluster's first connections failed with: redis-rs makes it one I/O
/// error, "Failed to create initial connections", that has the nodes' last error as text only.
fn cluster_nodes_code(error: &RedisError) -> Option<&'static str> {
    let detail = error
        .detail()
        .filter(|_| error.kind() == redis::ErrorKind::Io)?;
    let named = |names: &[&str]| names.iter().any(|name| detail.contains(name));
    if named(&["WRONGPASS", "AuthenticationFailed"]) {
        Some("WRONGPASS")
    } else if named(&["NOAUTH", "NoAuth"]) {
        Some("NOAUTH")
    } else if named(&["NOPERM", "NoPerm"]) {
        Some("NOPERM")
    } else {
        None
    }
}

/// What is wrong with the configuration, if `error` says so (`WRONGPASS`, `NOAUTH`, `NOPERM`).
pub(crate) fn configuration_error(
    error: &RedisError,
    address: &str,
    doing: &str,
) -> Option<String> {
    let code = error.code().or_else(|| cluster_nodes_code(error));
    let auth = error.kind() == redis::ErrorKind::AuthenticationFailed || code == Some("WRONGPASS");
    if auth {
        return Some(format!(
            "Redis at {address} refused the user or password (authentication failed: {error}); fix the password (and user) in the URL or the sentinel node settings"
        ));
    }
    match code {
        Some("NOAUTH") => Some(format!(
            "Redis at {address} requires a password (NOAUTH) and none was given; put it in the URL (redis://user:password@host:port/)"
        )),
        Some("NOPERM") => Some(format!(
            "Redis at {address} does not let this user {doing} (NOPERM: {error}); grant it in the user's ACL (the limiter needs EVALSHA, SCRIPT, COMMAND, ROLE, PING and its keys)"
        )),
        _ => None,
    }
}

/// A connection to `client`'s server, each call bounded by `timeout`: a frozen server holds
/// nothing longer (the backend's own timeout drops the calls). Connecting takes more round trips
/// than a call (TLS's handshake, then logging in): it has an [`attempt_budget`].
pub(crate) async fn open(
    client: &Client,
    timeout: Duration,
) -> Result<MultiplexedConnection, RedisError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(attempt_budget(timeout)))
        .set_response_timeout(Some(timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// What connecting and setting up may take at the start, or in one attempt at a Cluster (two
/// Cluster connections and a script load a call: some twenty round trips): ten timeouts, at least
/// a second.
pub(crate) fn start_budget(timeout: Duration) -> Duration {
    timeout.saturating_mul(10).max(Duration::from_secs(1))
}

/// How long one connection attempt (resolve, connect, check, set up) may take: five timeouts,
/// 250 ms to 5 s (a remote TLS handshake takes round trips; requests fail fast meanwhile).
pub(crate) fn attempt_budget(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(5)
        .max(Duration::from_millis(250))
        .min(Duration::from_secs(5))
}

/// `attempt` within `budget`, or an error naming the `target` (`Redis (…)`).
pub(crate) async fn within<T>(
    budget: Duration,
    target: impl FnOnce() -> String,
    attempt: impl std::future::Future<Output = Result<T, AttemptError>>,
) -> Result<T, AttemptError> {
    tokio::time::timeout(budget, attempt)
        .await
        .unwrap_or_else(|_| {
            let message = format!(
                "{} did not complete a connection within {budget:?}",
                target()
            );
            Err(BackendError::new(message).into())
        })
}

/// redis-rs' rustls needs a process-wide crypto provider; ring, unless the application installed one.
pub(crate) fn install_crypto_provider() {
    // Fails only when a provider is installed already, which is then the one used.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(code: &str) -> RedisError {
        RedisError::from((redis::ErrorKind::Client, "test", code.to_owned()))
    }

    #[test]
    fn which_errors_cost_the_connection() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        assert!(must_reconnect(&io(std::io::ErrorKind::BrokenPipe)));
        assert!(must_reconnect(&io(std::io::ErrorKind::ConnectionRefused)));
        assert!(must_reconnect(&not_connected()));
        // A timeout alone does not: only a connection silent for a while (`timed_out`).
        assert!(!must_reconnect(&io(std::io::ErrorKind::TimedOut)));
        assert!(!must_reconnect(&reply("NOPERM")));
        for code in ["READONLY", "MASTERDOWN", "LOADING"] {
            assert!(is_not_primary_code(code), "{code}");
        }
        assert!(!is_not_primary_code("NOSCRIPT"));
        assert!(!is_not_primary_code("ERR"));
    }
}

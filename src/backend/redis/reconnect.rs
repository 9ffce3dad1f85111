//! The crate's own reconnecting connection to one Redis server (a URL, a `Client` or Sentinel), and
//! the background task that keeps it connected.
//!
//! redis-rs' `ConnectionManager` reconnects only after an I/O error, and to the address it resolved
//! once. A managed Redis or Sentinel fails over by demoting the primary: the old connection stays
//! open and every write answers `READONLY`, forever. Here the connection is dropped on `READONLY`,
//! `MASTERDOWN`, `LOADING`, I/O errors and timeouts, and made again by a background task that
//! resolves the address again (DNS, or the sentinels), checks that the server is a primary, loads
//! the script and detects the path before any decision uses it. While there is no connection, calls
//! fail at once, so the layer's failure policy answers without waiting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisError, Role, Value};
use tokio::sync::Notify;

use super::check::RedisState;
use super::connection::{cell_loaded_on, install_crypto_provider};
use super::mode::RedisMode;
use crate::error::{redact_url, BackendError};

/// Reconnect attempts back off from 50 ms to 500 ms.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// While Redis stays down, "still unreachable" is logged at most this often.
const STILL_DOWN_EVERY: Duration = Duration::from_secs(10);
/// A connection that has not answered anything for this long (and at least two timeouts) when a call
/// times out is dropped and made again: a frozen server, or one a network partition hides. Shorter
/// stalls only open the breaker, as reconnecting would cost as much.
const STALL_LIMIT: Duration = Duration::from_secs(1);
/// The task looks this often whether the backend still exists, while there is nothing to do.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// After a configuration error (a wrong password, missing ACL permissions, a replica, no
/// redis-cell in mode "cell"), attempts go on this slowly: someone has to fix something first.
const MISCONFIGURED_BACKOFF: Duration = Duration::from_secs(5);
/// A replica where the primary should be is a failover under way for this long (retried at the
/// usual pace, so the promotion is noticed within a second); past it, a configuration error.
const REPLICA_GRACE: Duration = Duration::from_secs(30);

/// Where the server is found: a client (its address resolved again at every connect) or the
/// sentinels, asked for the current primary at every connect.
pub(super) enum Source {
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
    },
}

impl Source {
    /// What to name in messages: the URL without its password, or the Sentinel service.
    pub(super) fn describe(&self) -> String {
        match self {
            Source::Client(client) => redact_url(&client.get_connection_info().addr().to_string()),
            Source::Sentinel { service, .. } => format!("Sentinel service {service:?}"),
        }
    }

    fn uses_tls(&self) -> bool {
        match self {
            Source::Client(client) => matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::TcpTls { .. }
            ),
            Source::Sentinel { tls, .. } => *tls,
        }
    }

    /// With Sentinel, where the sentinels say the primary is now (`host:port`), asked on one kept
    /// connection to a sentinel (`SENTINEL GET-MASTER-ADDR-BY-NAME`), the next sentinel after an
    /// error; each step bounded by `timeout`. `None` when no sentinel answered.
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
            if watch.is_none() {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout));
                let opened = match Client::open(urls[*watching].as_str()) {
                    Ok(client) => tokio::time::timeout(
                        timeout,
                        client.get_multiplexed_async_connection_with_config(&config),
                    )
                    .await
                    .ok()
                    .and_then(Result::ok),
                    Err(_) => None,
                };
                *watch = opened;
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

    /// A client for the server to connect to now.
    async fn client(&mut self) -> Result<Client, RedisError> {
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

/// What [`health`](SingleServer::health) reports besides the connection itself.
#[derive(Default)]
struct Record {
    address: Option<String>,
    last_error: Option<(String, SystemTime)>,
    /// The last attempt failed on the configuration, not on reachability (cleared by a connection).
    misconfigured: Option<Misconfigured>,
}

/// A connection attempt that reached Redis and was refused for a reason retrying alone will not
/// fix. Attempts go on (slowly), as someone may fix it, but it is logged as an error and, but for a
/// replica, fails `Config::layer` at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Misconfigured {
    /// The server is a replica: a failover may promote it, so the start stays lazy.
    Replica(String),
    /// Wrong password or user, no password, missing ACL permissions, mode "cell" without the module.
    Fatal(String),
}

/// Why an attempt failed: Redis unreachable (or slow), or a configuration error.
pub(super) struct AttemptError {
    pub(super) error: BackendError,
    pub(super) misconfigured: Option<Misconfigured>,
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
    fn misconfigured(kind: fn(String) -> Misconfigured, message: String) -> Self {
        AttemptError {
            error: BackendError::new(message.clone()),
            misconfigured: Some(kind(message)),
        }
    }
}

/// One Redis server behind a connection that the background task makes again whenever it fails.
pub(crate) struct SingleServer {
    live: RwLock<Option<Live>>,
    generation: AtomicU64,
    /// Connection attempts the task has finished, failed or not.
    attempts: AtomicU64,
    /// When the connection last answered (or was made): ms since `epoch`.
    last_answer: AtomicU64,
    epoch: Instant,
    /// Wakes the task: the connection was dropped.
    lost: Notify,
    timeout: Duration,
    db: i64,
    record: Mutex<Record>,
    /// The URL or Sentinel service, for messages.
    pub(super) target: String,
}

impl SingleServer {
    /// Not connected yet.
    pub(super) fn new(source: &Source, timeout: Duration) -> Self {
        let db = match source {
            Source::Client(client) => client.get_connection_info().redis_settings().db(),
            Source::Sentinel { .. } => 0,
        };
        // Before any connection: rustls panics without a provider, and the task makes the
        // connections (to the sentinels and to the primary they name).
        if source.uses_tls() {
            install_crypto_provider();
        }
        SingleServer {
            live: RwLock::new(None),
            generation: AtomicU64::new(0),
            last_answer: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            epoch: Instant::now(),
            lost: Notify::new(),
            timeout,
            db,
            record: Mutex::default(),
            target: source.describe(),
        }
    }

    fn current(&self) -> Option<Live> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a connection is up.
    pub(super) fn connected(&self) -> bool {
        self.live
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The address of the server connected to last, and the last error with its time.
    pub(super) fn record(&self) -> (Option<String>, Option<(String, SystemTime)>) {
        let record = self.record.lock().unwrap_or_else(|e| e.into_inner());
        (record.address.clone(), record.last_error.clone())
    }

    /// The configuration error the last attempt failed on, if any.
    pub(crate) fn misconfigured(&self) -> Option<Misconfigured> {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .misconfigured
            .clone()
    }

    /// The backend is gone: drop the connection for those still holding this server (an offender
    /// count, an access-list task), and make none again.
    fn close(&self) {
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn note_error(&self, error: &str) {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_error = Some((error.to_owned(), SystemTime::now()));
    }

    fn install(&self, conn: MultiplexedConnection, address: String) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.answered();
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = Some(Live { conn, generation });
        let mut record = self.record.lock().unwrap_or_else(|e| e.into_inner());
        record.address = Some(address);
        record.misconfigured = None;
    }

    /// Drops the connection of `generation` (not a newer one made meanwhile) and wakes the task.
    fn drop_connection(&self, generation: u64, why: &str) {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        if live.as_ref().is_some_and(|l| l.generation == generation) {
            *live = None;
            drop(live);
            self.note_error(why);
            self.lost.notify_one();
        }
    }

    /// A call on the connection failed: drop it if the error says the server is gone, read-only or
    /// not ready.
    fn failed(&self, generation: u64, error: &RedisError) {
        if must_reconnect(error) {
            self.drop_connection(generation, &error.to_string());
        } else if error.is_timeout() {
            self.timed_out();
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn answered(&self) {
        self.last_answer.store(self.now_ms(), Ordering::Relaxed);
    }

    /// The server replied: error replies come as values (`Value::ServerError`), and a `READONLY`,
    /// `MASTERDOWN` or `LOADING` among them drops the connection.
    fn replied(&self, generation: u64, values: &[Value]) {
        self.answered();
        let not_primary = values.iter().find_map(|v| match v {
            Value::ServerError(e) if is_not_primary_code(e.code()) => Some(e),
            _ => None,
        });
        if let Some(e) = not_primary {
            let text = format!("{}: {}", e.code(), e.details().unwrap_or(""));
            self.drop_connection(generation, &text);
        }
    }

    /// `PING` on the live connection, within the timeout: whether it answered.
    async fn ping(&self) -> bool {
        let cmd = redis::cmd("PING");
        let ping = self.command(&cmd);
        matches!(
            tokio::time::timeout(self.timeout, ping).await,
            Ok(Ok(Value::SimpleString(_)
                | Value::BulkString(_)
                | Value::Okay))
        )
    }

    /// With Sentinel, asks the sentinels which server is the primary (every second while
    /// connected): after a failover the old primary may accept writes for seconds until the
    /// sentinels demote it, and those decisions would be lost. A different answer drops the
    /// connection, so the task connects to the new primary (and checks its role then). One kept
    /// connection to a sentinel answers: no connection to the primary is opened to ask.
    async fn follow_sentinels(&self, source: &mut Source) {
        let Some(live) = self.current() else { return };
        let Some(named) = source.primary_address(self.timeout).await else {
            return;
        };
        let (current, _) = self.record();
        if current.is_some_and(|c| c != named) {
            self.drop_connection(
                live.generation,
                &format!("the sentinels name a new primary, {named}"),
            );
        }
    }

    /// A call timed out under the backend's timeout. The connection is dropped if nothing has come
    /// back on it for [`STALL_LIMIT`] (at least two timeouts): a connection made since the call
    /// started is never the one it timed out on.
    pub(super) fn timed_out(&self) {
        let Some(live) = self.current() else { return };
        let silent = self
            .now_ms()
            .saturating_sub(self.last_answer.load(Ordering::Relaxed));
        let limit = STALL_LIMIT.max(self.timeout.saturating_mul(2));
        if silent > limit.as_millis() as u64 {
            self.drop_connection(
                live.generation,
                &format!("Redis did not answer within {:?}", self.timeout),
            );
        }
    }

    /// Waits until a connection is up or the first attempt has ended (at most one attempt's
    /// budget); whether a connection is up, or the configuration error the attempt failed on (a
    /// wrong password, missing permissions, mode "cell" without the module; not a replica, which
    /// a failover may promote).
    pub(super) async fn first_attempt(&self) -> Result<bool, BackendError> {
        let deadline = Instant::now() + attempt_budget(self.timeout) + Duration::from_millis(100);
        while !self.connected()
            && self.attempts.load(Ordering::Acquire) == 0
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if self.connected() {
            return Ok(true);
        }
        match self.misconfigured() {
            Some(Misconfigured::Fatal(message)) => Err(BackendError::new(message)),
            _ => Ok(false),
        }
    }

    /// One command on the live connection, or an error at once without one.
    pub(super) async fn command(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let Some(mut live) = self.current() else {
            return Err(not_connected());
        };
        let result = live.conn.req_packed_command(cmd).await;
        match &result {
            Ok(value) => self.replied(live.generation, std::slice::from_ref(value)),
            Err(e) => self.failed(live.generation, e),
        }
        result
    }

    /// A pipeline on the live connection, or an error at once without one.
    pub(super) async fn pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        let Some(mut live) = self.current() else {
            return Err(not_connected());
        };
        let result = live.conn.req_packed_commands(pipeline, offset, count).await;
        // As for one command: a reply refreshes `last_answer`, and a `READONLY` among the replies
        // drops the connection.
        match &result {
            Ok(values) => self.replied(live.generation, values),
            Err(e) => self.failed(live.generation, e),
        }
        result
    }

    /// The database number commands run in.
    pub(super) fn db(&self) -> i64 {
        self.db
    }
}

/// The error of a call made while there is no connection.
fn not_connected() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "not connected to Redis (reconnecting in the background)",
    ))
}

/// Whether `error` means this connection leads nowhere useful: the server is gone or unreachable,
/// read-only (a demoted primary), without a primary (`MASTERDOWN`), or loading its data set.
/// (Timeouts count only once the connection has been silent for a while: see `timed_out`.)
fn must_reconnect(error: &RedisError) -> bool {
    !error.is_timeout()
        && (error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || is_not_primary(error))
}

/// `READONLY`, `MASTERDOWN` or `LOADING`: Redis answered, but cannot decide here.
pub(super) fn is_not_primary(error: &RedisError) -> bool {
    error.code().is_some_and(is_not_primary_code)
}

fn is_not_primary_code(code: &str) -> bool {
    matches!(code, "READONLY" | "MASTERDOWN" | "LOADING")
}

/// What is wrong with the configuration, if `error` says so: the password or user refused
/// (`WRONGPASS`, or redis-rs' authentication failure), none given (`NOAUTH`), or the ACL user lacks
/// a command (`NOPERM`). `None` for anything a retry may get past.
fn configuration_error(error: &RedisError, address: &str, doing: &str) -> Option<String> {
    let auth =
        error.kind() == redis::ErrorKind::AuthenticationFailed || error.code() == Some("WRONGPASS");
    if auth {
        return Some(format!(
            "Redis at {address} refused the user or password (authentication failed: {error}); fix the password (and user) in the URL or the sentinel node settings"
        ));
    }
    match error.code() {
        Some("NOAUTH") => Some(format!(
            "Redis at {address} requires a password (NOAUTH) and none was given; put it in the URL (redis://user:password@host:port/)"
        )),
        Some("NOPERM") => Some(format!(
            "Redis at {address} does not let this user {doing} (NOPERM: {error}); grant it in the user's ACL (the limiter needs EVALSHA, SCRIPT, COMMAND, ROLE, PING and its keys)"
        )),
        _ => None,
    }
}

/// Connects once: asks the source for the server, connects, checks it is a primary, loads the
/// script and detects the path, then puts the connection in service. Returns the address.
async fn establish(
    source: &mut Source,
    server: &SingleServer,
    state: &RedisState,
) -> Result<String, AttemptError> {
    let client = source.client().await.map_err(|e| {
        BackendError::with_source(format!("cannot find Redis ({})", server.target), e)
    })?;
    let address = redact_url(&client.get_connection_info().addr().to_string());
    let failed =
        |what: &str, doing: &str, e: RedisError| match configuration_error(&e, &address, doing) {
            Some(message) => AttemptError::misconfigured(Misconfigured::Fatal, message),
            None => BackendError::with_source(format!("{what} Redis at {address}"), e).into(),
        };
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(server.timeout))
        // Bounds what a frozen server can hold: calls are dropped by the backend's own timeout.
        .set_response_timeout(Some(server.timeout));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| failed("cannot connect to", "log in", e))?;
    match redis::cmd("ROLE").query_async::<Role>(&mut conn).await {
        Ok(Role::Primary { .. }) => {}
        Ok(_) => {
            return Err(AttemptError::misconfigured(
                Misconfigured::Replica,
                format!(
                    "Redis at {address} is a replica (read-only), not the primary; point the URL at the primary (or use Sentinel)"
                ),
            ))
        }
        Err(e) if e.code() == Some("NOAUTH") => return Err(failed("", "run ROLE", e)),
        // `ROLE` may be renamed or forbidden (managed Redis, ACLs): the calls will tell.
        Err(e) if e.code().is_some() && !is_not_primary(&e) => {}
        Err(e) => return Err(failed("ROLE failed on", "run ROLE", e)),
    }
    let mode = state.detector.mode();
    let loaded = match mode {
        RedisMode::Lua => None,
        RedisMode::Cell | RedisMode::Auto => {
            Some(cell_loaded_on(&mut conn).await.map_err(|e| {
                failed(
                    "cannot detect redis-cell on",
                    "run COMMAND INFO (to detect redis-cell)",
                    e,
                )
            })?)
        }
    };
    if mode == RedisMode::Cell && loaded == Some(false) {
        return Err(AttemptError::misconfigured(Misconfigured::Fatal, format!(
            "mode \"cell\" needs the redis-cell module (CL.THROTTLE), which Redis at {address} has not loaded; load the module or use mode \"lua\" or \"auto\""
        )));
    }
    // Every mode runs the script for some calls (peeks, penalties, quotas with no whole-second form).
    // The GCRA script, loaded on every new connection so that the first decision after a
    // reconnect does not pay for `NOSCRIPT` (the very script `EVALSHA` runs, so the same SHA).
    super::scripts::GCRA
        .load_async(&mut conn)
        .await
        .map_err(|e| {
            failed(
                "cannot load the script on",
                "load the script (SCRIPT LOAD)",
                e,
            )
        })?;
    if let Some(loaded) = loaded {
        state.detector.detected(loaded, &state.breaker);
    }
    server.install(conn, address.clone());
    state.breaker.forget_loss();
    state.breaker.answered();
    state
        .breaker
        .failing
        .connected(state.detector.active_path());
    Ok(address)
}

/// How long one connection attempt (resolve, connect, check, load, detect) may take: several
/// timeouts, at least 250 ms, as a TLS handshake to a remote server takes round trips. Requests do
/// not wait for it: they fail fast meanwhile.
pub(super) fn attempt_budget(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(5)
        .max(Duration::from_millis(250))
        .min(Duration::from_secs(5))
}

/// One attempt, bounded by `budget`.
pub(super) async fn connect_once(
    source: &mut Source,
    server: &SingleServer,
    state: &RedisState,
    budget: Duration,
) -> Result<String, AttemptError> {
    match tokio::time::timeout(budget, establish(source, server, state)).await {
        Ok(result) => result,
        Err(_) => Err(BackendError::new(format!(
            "Redis ({}) did not complete a connection within {budget:?}",
            server.target
        ))
        .into()),
    }
}

/// Keeps `server` connected for as long as the backend (`state`) lives: connects with backoff while
/// there is no connection, then waits until one is dropped. `connected`: the caller connected
/// already (eager start). Logs each transition once, and "still unreachable" at most every 10 s.
pub(super) fn spawn_keeper(
    mut source: Source,
    server: Arc<SingleServer>,
    state: Weak<RedisState>,
    connected: bool,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut first = !connected;
        loop {
            // Connected: wait until the connection is dropped, or the backend is.
            let mut since_sentinels = Instant::now();
            while server.connected() {
                // While the breaker is open on a live connection (calls timed out), probe it
                // often, so that the first calls after Redis recovers are decided there.
                let tripped = state.upgrade().is_some_and(|s| s.breaker.tripped());
                let wait = if tripped { BACKOFF_MIN } else { IDLE_CHECK };
                let _ = tokio::time::timeout(wait, server.lost.notified()).await;
                let Some(strong) = state.upgrade() else {
                    server.close();
                    return;
                };
                if strong.breaker.tripped() && server.ping().await {
                    strong.breaker.answered();
                }
                drop(strong);
                if matches!(source, Source::Sentinel { .. })
                    && since_sentinels.elapsed() >= IDLE_CHECK
                {
                    since_sentinels = Instant::now();
                    // A lost connection interrupts the question: reconnecting comes first.
                    tokio::select! {
                        _ = server.follow_sentinels(&mut source) => {}
                        _ = server.lost.notified() => {}
                    }
                }
            }
            let down_since = Instant::now();
            let (_, last) = server.record();
            if !first {
                let why = last.map(|(e, _)| e).unwrap_or_default();
                tracing::warn!(
                    redis = %server.target,
                    error = %why,
                    "lost the Redis connection; reconnecting (requests follow the failure policy meanwhile)"
                );
                crate::observe::backend_up(None);
            }
            let mut backoff = BACKOFF_MIN;
            let mut last_said = Instant::now();
            let mut attempts = 0u64;
            let mut said_misconfigured: Option<Misconfigured> = None;
            let mut replica_since: Option<Instant> = None;
            loop {
                let Some(strong) = state.upgrade() else {
                    server.close();
                    return;
                };
                let budget = attempt_budget(strong.timeout);
                let result = connect_once(&mut source, &server, &strong, budget).await;
                // Recorded before the attempt counts, so `first_attempt` sees it.
                if let Err(e) = &result {
                    server.note_error(&e.error.to_string());
                    server.record.lock().unwrap_or_else(|e| e.into_inner()).misconfigured =
                        e.misconfigured.clone();
                }
                attempts += 1;
                server.attempts.fetch_add(1, Ordering::AcqRel);
                match result {
                    Ok(address) => {
                        let path = path_name(strong.detector.active_path());
                        tracing::info!(
                            redis = %server.target,
                            %address,
                            path,
                            down_ms = down_since.elapsed().as_millis() as u64,
                            attempts,
                            "connected to Redis; rate-limit decisions come from Redis"
                        );
                        break;
                    }
                    Err(AttemptError {
                        error,
                        misconfigured: Some(wrong),
                    }) if !matches!(wrong, Misconfigured::Replica(_))
                        || replica_since.get_or_insert_with(Instant::now).elapsed()
                            >= REPLICA_GRACE =>
                    {
                        // Redis answered and refused: not an outage. Said once at error level
                        // (again if it changes), and retried slowly, as someone may fix it (or
                        // promote the replica).
                        let text = error.to_string();
                        if first {
                            first = false;
                            crate::observe::backend_up(None);
                        }
                        if said_misconfigured.as_ref() != Some(&wrong) {
                            tracing::error!(
                                redis = %server.target,
                                error = %text,
                                "Redis refused the limiter's configuration; requests follow the failure policy until it is fixed (retrying every {}s)",
                                MISCONFIGURED_BACKOFF.as_secs()
                            );
                            said_misconfigured = Some(wrong);
                            last_said = Instant::now();
                        }
                        drop(strong);
                        tokio::time::sleep(MISCONFIGURED_BACKOFF).await;
                        continue;
                    }
                    Err(AttemptError {
                        error,
                        misconfigured,
                    }) => {
                        // A replica during a failover's first seconds: retried at the usual pace.
                        if misconfigured.is_none() {
                            replica_since = None;
                        }
                        said_misconfigured = None;
                        let text = error.to_string();
                        if first {
                            first = false;
                            crate::observe::backend_up(None);
                            tracing::warn!(
                                redis = %server.target,
                                error = %text,
                                "Redis is not reachable yet; requests follow the failure policy until it answers (connecting in the background)"
                            );
                        } else if last_said.elapsed() >= STILL_DOWN_EVERY {
                            last_said = Instant::now();
                            tracing::warn!(
                                redis = %server.target,
                                error = %text,
                                down_s = down_since.elapsed().as_secs(),
                                attempts,
                                "Redis is still unreachable"
                            );
                        }
                    }
                }
                drop(strong);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            first = false;
        }
    });
}

/// `"cell"`, `"lua"` or `"unknown"`.
pub(super) fn path_name(path: Option<RedisMode>) -> &'static str {
    match path {
        Some(RedisMode::Cell) => "cell",
        Some(RedisMode::Lua) => "lua",
        _ => "unknown",
    }
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

    #[test]
    fn an_attempt_is_bounded() {
        assert_eq!(
            attempt_budget(Duration::from_millis(10)),
            Duration::from_millis(250)
        );
        assert_eq!(
            attempt_budget(Duration::from_millis(100)),
            Duration::from_millis(500)
        );
        assert_eq!(
            attempt_budget(Duration::from_secs(60)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn paths_are_named() {
        assert_eq!(path_name(Some(RedisMode::Cell)), "cell");
        assert_eq!(path_name(Some(RedisMode::Lua)), "lua");
        assert_eq!(path_name(None), "unknown");
    }
}

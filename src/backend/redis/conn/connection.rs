//! The one connection to Redis (one server's own, a user's `ConnectionManager`, or a Cluster's):
//! where it comes from, how it is opened, and which path it offers (redis-cell detection).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{Client, Cmd, Pipeline, RedisError, Value};

use super::lazy_cluster::LazyCluster;
use super::redirect;
use super::server::{install_crypto_provider, SingleServer, Source};
use crate::backend::redis::health::breaker::Breaker;
use crate::backend::redis::wire::mode::{path_of, RedisMode, CELL, LUA, UNKNOWN};
use crate::error::{redact_url, BackendError};

/// What the builder was given to reach Redis, but a [`Source`]: URLs (one server's, or a Cluster's
/// seeds: builder.rs tells), or what redis-rs reconnects (a Cluster's, a connection manager).
pub(crate) enum Target {
    Urls(Vec<String>),
    Manager(ConnectionManager),
    ClusterClient(Box<ClusterClient>),
    ClusterConnection(ClusterConnection),
}

/// The one server `url` names.
pub(crate) fn one_server(urls: &[String]) -> Result<Source, BackendError> {
    match urls {
        [] => Err(BackendError::new("no Redis URL given")),
        [url] => redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map(|info| {
                info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
            })
            .and_then(Client::open)
            .map(|client| Source::Client(Box::new(client)))
            .map_err(|e| connect_error(url, e)),
        _ => Err(BackendError::new(
            "several Redis URLs given for one server: set cluster = true for a Redis Cluster",
        )),
    }
}

/// The connection every call goes through: a cheap handle on one shared connection, cloned by
/// each call for the `&mut` redis-rs asks for; a [`ConnectionLike`], whatever its kind.
#[derive(Clone)]
pub(crate) enum RedisConnection {
    /// A connection manager the user gave: redis-rs reconnects it after I/O errors only.
    Single(ConnectionManager),
    /// One server (a URL, a client or Sentinel) that this crate reconnects after failovers too.
    Server(Arc<SingleServer>),
    /// A Cluster: its connection (at once, or once `build`'s background task has made it).
    Cluster(Arc<LazyCluster>),
}

impl RedisConnection {
    /// A Cluster connected already (by `connect`, or given as it is).
    pub(crate) fn cluster_of(connection: ClusterConnection) -> Self {
        let cluster = LazyCluster::new(String::new());
        cluster.install(connection);
        RedisConnection::Cluster(Arc::new(cluster))
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.lazy_cluster().is_some()
    }

    /// A Cluster, connected or not yet.
    pub(crate) fn lazy_cluster(&self) -> Option<&Arc<LazyCluster>> {
        match self {
            RedisConnection::Cluster(lazy) => Some(lazy),
            _ => None,
        }
    }

    /// A handle on the Cluster's connection (`None` on one server; an error before it is made).
    pub(crate) fn cluster(&self) -> Option<Result<ClusterConnection, RedisError>> {
        let lazy = self.lazy_cluster()?;
        Some(lazy.get().ok_or_else(|| lazy.not_connected()))
    }

    /// The reconnecting server, for one server reached through a URL, a client or Sentinel.
    pub(crate) fn server(&self) -> Option<&Arc<SingleServer>> {
        match self {
            RedisConnection::Server(server) => Some(server),
            _ => None,
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Server(server) => Box::pin(server.command(cmd)),
            RedisConnection::Cluster(lazy) => {
                let (cluster, nodes) = (lazy.get(), lazy.nodes.get().cloned());
                let cluster = cluster.ok_or_else(|| lazy.not_connected());
                Box::pin(
                    async move { redirect::command(&mut cluster?, nodes.as_deref(), cmd).await },
                )
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Server(server) => Box::pin(server.pipeline(pipeline, offset, count)),
            RedisConnection::Cluster(lazy) => {
                let (cluster, nodes) = (lazy.get(), lazy.nodes.get().cloned());
                let cluster = cluster.ok_or_else(|| lazy.not_connected());
                Box::pin(async move {
                    let nodes = nodes.as_deref();
                    redirect::commands(&mut cluster?, nodes, pipeline, offset, count).await
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Server(server) => server.db,
            RedisConnection::Cluster(lazy) => lazy.get().map_or(0, |c| c.get_db()),
        }
    }
}

fn connect_error(url: &str, e: RedisError) -> BackendError {
    BackendError::with_source(format!("cannot connect to Redis at {}", redact_url(url)), e)
}

/// A Cluster client for these seed nodes, with this backend's timeouts.
pub(crate) fn cluster_client(
    urls: &[String],
    timeout: Duration,
) -> Result<ClusterClient, BackendError> {
    if urls.is_empty() {
        return Err(BackendError::new("no Redis URL given"));
    }
    // Before any connection, whether the Cluster is connected now or by a background task: rustls
    // panics without a provider.
    if urls.iter().any(|u| u.starts_with("rediss:")) {
        install_crypto_provider();
    }
    ClusterClient::builder(urls.to_vec())
        // Connecting takes more round trips than a call (TLS's handshake, then logging in).
        .connection_timeout(super::server::attempt_budget(timeout))
        .response_timeout(timeout)
        // Redirections are followed by the backend (redirect.rs), which sends `ASKING` with its
        // command; redis-rs's retries would not (redirect.rs says where, and when this can go).
        .retries(0)
        .build()
        .map_err(|e| connect_error(&urls.join(", "), e))
}

/// Whether `CL.THROTTLE` exists on this server (`cluster`: `None`) or every primary of `cluster`.
pub(crate) async fn cell_loaded<C: ConnectionLike>(
    conn: &mut C,
    cluster: Option<Result<ClusterConnection, RedisError>>,
) -> Result<bool, RedisError> {
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("INFO").arg("CL.THROTTLE");
    let reply = match cluster {
        // The primaries' replies in one array.
        Some(cluster) => {
            let all = MultipleNodeRoutingInfo::AllMasters;
            let routing = RoutingInfo::MultiNode((all, Some(ResponsePolicy::CombineArrays)));
            cluster?.route_command(cmd, routing).await?
        }
        None => conn.req_packed_command(&cmd).await?,
    };
    // One entry per server asked: the command's description, or nil where it is unknown.
    Ok(match reply {
        Value::Array(entries) => {
            !entries.is_empty() && entries.iter().all(|e| !matches!(e, Value::Nil))
        }
        _ => false,
    })
}

/// Whether Redis refused a command it does not know (`CL.THROTTLE` once the module is gone).
pub(crate) fn is_unknown_command(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("unknown command"))
}

/// `Auto` mode detects the module again this often (ms), besides after connection failures.
const DETECT_EVERY_MS: u64 = 30_000;

/// After a failed detection, the next one waits this long (ms), whatever fails meanwhile: while
/// Redis (or one node of a Cluster, which detection asks) does not answer, decisions would
/// otherwise each detect first, and wait for it.
const DETECT_RETRY_MS: u64 = 1_000;

/// The configured [`RedisMode`] and, in `Auto` mode, the path detection found.
pub(crate) struct Detector {
    mode: RedisMode,
    /// What connecting prepares for and decisions run on: `Lua` where detection cannot change the
    /// path (`Auto` with coalescing on: see [`RedisMode::Auto`]); else the mode.
    pub(crate) set_up_mode: RedisMode,
    /// In `Auto` mode, which path runs now: `UNKNOWN`, `CELL` or `LUA`.
    active: AtomicU8,
    /// In `Auto` mode, when to detect again anyway (a module loaded later, a silent reconnect).
    next_detect: AtomicU64,
    /// In `Auto` mode, when a connection failure may make a decision detect again.
    retry_detect: AtomicU64,
    /// A decision is detecting: the others meanwhile take the path known (on a slow link, each
    /// would wait for a detection of its own).
    detecting: AtomicBool,
}

impl Detector {
    /// Nothing detected yet; `coalesce`: whether checks are coalesced (`Auto` then picks Lua).
    pub(crate) fn new(mode: RedisMode, coalesce: bool) -> Self {
        Detector {
            mode,
            set_up_mode: match mode {
                RedisMode::Auto if coalesce => RedisMode::Lua,
                mode => mode,
            },
            active: AtomicU8::new(UNKNOWN),
            next_detect: AtomicU64::new(0),
            retry_detect: AtomicU64::new(0),
            detecting: AtomicBool::new(false),
        }
    }

    pub(crate) fn mode(&self) -> RedisMode {
        self.mode
    }

    /// Whether a decision may take `CL.THROTTLE`: `Cell`, or `Auto` without coalescing.
    pub(crate) fn may_use_cell(&self) -> bool {
        self.set_up_mode != RedisMode::Lua
    }

    /// The path decisions take now: `Cell` or `Lua`, or `None` in `Auto` mode before detection.
    pub(crate) fn active_path(&self) -> Option<RedisMode> {
        match self.set_up_mode {
            RedisMode::Auto => path_of(self.active.load(Ordering::Relaxed)),
            fixed => Some(fixed),
        }
    }

    /// Detection at connect found the module (`loaded`) or not; the next is due in 30 s.
    pub(crate) fn detected(&self, loaded: bool, breaker: &Breaker) {
        self.active
            .store(if loaded { CELL } else { LUA }, Ordering::Relaxed);
        breaker.recorder.set_path(self.active_path());
        self.next_detect.store(
            breaker.recorder.clock.now_ms() + DETECT_EVERY_MS,
            Ordering::Relaxed,
        );
    }

    /// `CL.THROTTLE` answered "unknown command" (a restart without the module): Lua from now on,
    /// and the gauge says so.
    pub(crate) fn cell_gone(&self, breaker: &Breaker) {
        self.active.store(LUA, Ordering::Relaxed);
        breaker.recorder.connected(self.active_path());
        tracing::warn!("CL.THROTTLE is no longer available; using the Lua script");
    }

    /// Whether this decision may use `CL.THROTTLE`: by the mode, or in `Auto` mode by detection.
    /// The first decision waits for it (no path is known yet); a detection due later runs beside
    /// the decisions, which keep the path known meanwhile: carried by a decision, it would make
    /// that decision outlast its timeout on a link slower than half of it. (A path gone meanwhile
    /// is found by the decision it fails: [`Self::cell_gone`].)
    pub(crate) async fn use_cell(
        self: &Arc<Self>,
        conn: &RedisConnection,
        breaker: &Arc<Breaker>,
        timeout: Duration,
    ) -> Result<bool, RedisError> {
        match self.set_up_mode {
            RedisMode::Lua => return Ok(false),
            RedisMode::Cell => return Ok(true),
            RedisMode::Auto => {}
        }
        let now = breaker.recorder.clock.now_ms();
        let known = self.active.load(Ordering::Relaxed);
        let due = known == UNKNOWN
            || now >= self.next_detect.load(Ordering::Relaxed)
            || (breaker.recorder.lost() && now >= self.retry_detect.load(Ordering::Relaxed));
        if due && !self.detecting.swap(true, Ordering::Acquire) {
            // Given back however the detection ends: dropped half-way by a decision's timeout, or
            // never polled (a runtime shutting down).
            let claimed = Detecting(self.clone());
            let detection = claimed.detect(conn.clone(), breaker.clone(), now, timeout);
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) if known != UNKNOWN => drop(runtime.spawn(detection)),
                // Boxed: rare, and it would otherwise swell every check's future.
                _ => Box::pin(detection).await?,
            }
        }
        Ok(self.active.load(Ordering::Relaxed) == CELL)
    }
}

/// A detection under way: [`Detector`]'s `detecting` flag is set while it lives.
struct Detecting(Arc<Detector>);

impl Drop for Detecting {
    fn drop(&mut self) {
        self.0.detecting.store(false, Ordering::Release);
    }
}

impl Detecting {
    /// Detects the module (at most `timeout`), and the path follows; a failed detection leaves the
    /// path known, and the next waits [`DETECT_RETRY_MS`]. Started at `now`.
    async fn detect(
        self,
        mut conn: RedisConnection,
        breaker: Arc<Breaker>,
        now: u64,
        timeout: Duration,
    ) -> Result<(), RedisError> {
        let detector = &*self.0;
        let known = detector.active.load(Ordering::Relaxed);
        let cluster = conn.cluster();
        let detected = tokio::time::timeout(timeout, cell_loaded(&mut conn, cluster)).await;
        match detected.unwrap_or_else(|_| Err(redirect::timed_out())) {
            Ok(loaded) => {
                let (path, found, using) = match loaded {
                    true => (CELL, "found", "CL.THROTTLE"),
                    false => (LUA, "gone", "the Lua script"),
                };
                detector.active.store(path, Ordering::Relaxed);
                if known != path {
                    breaker.recorder.connected(detector.active_path());
                }
                if known != UNKNOWN && known != path {
                    tracing::info!(
                        cell = loaded,
                        "redis-cell module {found}; rate-limit decisions use {using}"
                    );
                }
                // The loss is forgotten once detection answered (a call dropped half-way leaves
                // it).
                breaker.recorder.forget_loss();
                detector
                    .next_detect
                    .store(now + DETECT_EVERY_MS, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if known == UNKNOWN => Err(e),
            Err(_) => {
                let retry = now + DETECT_RETRY_MS;
                detector.retry_detect.store(retry, Ordering::Relaxed);
                detector.next_detect.fetch_max(retry, Ordering::Relaxed);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::redact_url;

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            redact_url("rediss://user:s3cret@host:6380/0"),
            "rediss://user:***@host:6380/0"
        );
        assert_eq!(redact_url("redis://host:6379/"), "redis://host:6379/");
    }
}

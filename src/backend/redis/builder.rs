//! `RedisBackendBuilder`: a Redis backend's settings, their validation, and the start-up work of
//! `connect` (connect and set up) and `build` (leave that to background tasks).

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use std::sync::Arc;

use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, ConnectionInfo, IntoConnectionInfo};

use super::conn::connection::{cluster_client, one_server, RedisConnection, Target};
use super::conn::lazy_cluster::LazyCluster;
use super::conn::reconnect::{connect_once, spawn_cluster_keeper, spawn_keeper};
use super::conn::server::{configuration_error, start_budget, SingleServer, Source};
use super::conn::set_up::{in_service, set_up};
use super::resets::{self, Listen};
use super::state::{RedisState, Settings};
use super::wire::mode::RedisMode;
use crate::error::{redact_url, redact_urls, BackendError};

/// The longest [`RedisBackendBuilder::timeout`]: longer ones are no bound on a request, and
/// overflow the deadlines computed from it.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// Builds a [`RedisBackend`](crate::redis::RedisBackend): see its `builder()`.
#[must_use]
pub struct RedisBackendBuilder {
    /// What to reach, Sentinel aside (URLs are one server's unless `cluster`: `validated` says).
    target: Option<Start>,
    cluster: bool,
    mode: RedisMode,
    prefix: String,
    timeout: Duration,
    deny_cache: bool,
    coalesce: bool,
    sentinel: Option<SentinelSettings>,
    /// Kept apart from `sentinel`, so that `sentinel_node` may come first.
    sentinel_node: Option<SentinelNodeConnectionInfo>,
    /// Where to hear other processes' resets and reloads, when the target cannot say.
    listener: Option<Client>,
    /// What metrics call it; `None`: where it connects.
    name: Option<String>,
}

/// What [`RedisBackendBuilder::sentinel`] was given.
struct SentinelSettings {
    urls: Vec<String>,
    service: String,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("cluster", &self.cluster)
            .field("mode", &self.mode)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("deny_cache", &self.deny_cache)
            .field("coalesce", &self.coalesce)
            .finish_non_exhaustive()
    }
}

impl RedisBackendBuilder {
    /// No target yet; `Auto` mode, the deny cache on, and the given defaults.
    pub(super) fn new(prefix: &str, timeout: Duration) -> Self {
        RedisBackendBuilder {
            target: None,
            cluster: false,
            mode: RedisMode::Auto,
            prefix: prefix.to_owned(),
            timeout,
            deny_cache: true,
            coalesce: true,
            sentinel: None,
            sentinel_node: None,
            listener: None,
            name: None,
        }
    }

    /// Connect to this URL: `redis://[user:password@]host:port/[db]`, `rediss://` for TLS, or
    /// `redis+unix:///path`. With [`cluster(true)`](Self::cluster), a seed node of the Cluster.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target = Some(Start::Other(Target::Urls(vec![url.into()])));
        self
    }

    /// Seed nodes of a Redis Cluster (implies [`cluster(true)`](Self::cluster)).
    pub fn cluster_urls<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.target = Some(Start::Other(Target::Urls(
            urls.into_iter().map(Into::into).collect(),
        )));
        self.cluster = true;
        self
    }

    /// Whether the URLs name a Redis Cluster (default `false`: one server).
    pub fn cluster(mut self, cluster: bool) -> Self {
        self.cluster = cluster;
        self
    }

    /// Use this client (one built with custom TLS certificates, say): one server, kept connected as
    /// a [`url`](Self::url) is, whatever [`cluster`](Self::cluster) says.
    pub fn client(mut self, client: Client) -> Self {
        self.target = Some(Start::Server(Source::Client(Box::new(client))));
        self
    }

    /// Find the primary through Redis Sentinel, on every connection: `sentinels` are their URLs
    /// (`rediss://` for TLS to them and to the primary), `service` the name they monitor. The
    /// primary's own password, user and database: [`sentinel_node`](Self::sentinel_node).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use tower_throttle::redis::RedisBackend;
    ///
    /// let redis = RedisBackend::builder()
    ///     .sentinel(["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"], "mymaster")
    ///     .build() // starts at once; connects in the background
    ///     .unwrap();
    /// # let _ = redis;
    /// # }
    /// ```
    pub fn sentinel<I, S>(mut self, sentinels: I, service: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sentinel = Some(SentinelSettings {
            urls: sentinels.into_iter().map(Into::into).collect(),
            service: service.into(),
        });
        self.cluster = false;
        self
    }

    /// With [`sentinel`](Self::sentinel), before or after it: how to log in to the primary (TLS,
    /// user, password, database). Without it: TLS as the sentinels' URLs say, no password.
    pub fn sentinel_node(mut self, node: SentinelNodeConnectionInfo) -> Self {
        self.sentinel_node = Some(node);
        self
    }

    /// Use this connection manager as it is: redis-rs reconnects it after I/O errors only (not after
    /// a failover by demotion), so prefer [`url`](Self::url) or [`sentinel`](Self::sentinel).
    pub fn connection_manager(mut self, manager: ConnectionManager) -> Self {
        self.target = Some(Start::Other(Target::Manager(manager)));
        self
    }

    /// Use this Cluster client.
    pub fn cluster_client(mut self, client: ClusterClient) -> Self {
        self.target = Some(Start::Other(Target::ClusterClient(Box::new(client))));
        self
    }

    /// Use this Cluster connection as it is.
    pub fn cluster_connection(mut self, connection: ClusterConnection) -> Self {
        self.target = Some(Start::Other(Target::ClusterConnection(connection)));
        self
    }

    /// Where to hear the other processes' resets and reloads (`prefix:resets`): any server of the
    /// Redis (on a Cluster, any node). Needed on a connection given as it is; others listen by
    /// themselves, and this replaces where ([guide](crate::guide::operations#peek-reset-and-reload-a-running-layer)).
    ///
    /// ```
    /// use redis::aio::ConnectionManager;
    /// use tower_throttle::redis::RedisBackend;
    ///
    /// # async fn run(manager: ConnectionManager) -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder()
    ///     .connection_manager(manager)
    ///     .listen_with(redis::Client::open("redis://127.0.0.1:6379/")?)
    ///     .connect()
    ///     .await?;
    /// # drop(redis);
    /// # Ok(())
    /// # }
    /// ```
    pub fn listen_with(mut self, client: Client) -> Self {
        self.listener = Some(client);
        self
    }

    /// The `backend` label of its metrics (`throttle_backend_up{backend, path}`): 1 to 64 printable
    /// characters. By default where it connects, without password (`host:port`, `sentinel:service`,
    /// the seed nodes, or `connection` for a connection given as it is).
    ///
    /// ```
    /// use tower_throttle::redis::RedisBackend;
    ///
    /// let builder = RedisBackend::builder().url("redis://10.0.0.5:6379/").name("sessions");
    /// # drop(builder);
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
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

    /// The longest a decision may take, reconnecting included (default 100 ms); past it the layer's
    /// failure policy answers. [`connect`](Self::connect) may take ten times as long (at least 1 s).
    /// At most an hour.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether to keep a local deny cache (default `true`): a key Redis limited is rejected here,
    /// without a round trip, until the retry time Redis gave ([guide](crate::guide::redis#the-deny-cache)).
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on;
        self
    }

    /// Whether checks that wait on the connection at the same moment go to Redis together, each
    /// decided exactly as alone (default `true`; [guide](crate::guide::redis#modes)). Off, every
    /// check is its own call, and [`RedisMode::Auto`] takes `CL.THROTTLE` where the module is loaded.
    ///
    /// ```
    /// use tower_throttle::redis::{RedisBackend, RedisMode};
    ///
    /// let builder = RedisBackend::builder()
    ///     .url("redis://127.0.0.1:6379/")
    ///     .mode(RedisMode::Lua)
    ///     .coalesce(false);
    /// # drop(builder);
    /// ```
    pub fn coalesce(mut self, on: bool) -> Self {
        self.coalesce = on;
        self
    }

    /// Checks the settings: what [`build`](Self::build) and [`connect`](Self::connect) start from.
    pub(super) fn validated(self) -> Result<Validated, BackendError> {
        validate_prefix(&self.prefix).map_err(BackendError::new)?;
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            let why =
                format!("Redis timeout must be greater than zero and at most {MAX_TIMEOUT:?}");
            return Err(BackendError::new(why));
        }
        if let Some(name) = &self.name {
            validate_name(name).map_err(BackendError::new)?;
        }
        let listener = self.listener;
        let mut listen = None;
        let start = match (self.sentinel, self.target) {
            (Some(_), Some(_)) => {
                return Err(BackendError::new(
                    "set either sentinels or a url, urls, client or connection, not both",
                ))
            }
            (Some(sentinel), None) => {
                let (source, listener) = sentinel_source(sentinel, self.sentinel_node)?;
                listen.get_or_insert(Listen::Sentinel(Box::new(listener)));
                Start::Server(source)
            }
            // (A client names one server whatever `cluster` says.)
            (None, Some(Start::Other(Target::Urls(urls)))) if !self.cluster => {
                Start::Server(one_server(&urls)?)
            }
            (None, Some(start)) => start,
            (None, None) => {
                return Err(BackendError::new(
                    "no Redis to connect to: set a url, urls, sentinels, client or connection",
                ))
            }
        };
        let listen = match listener {
            // On a Cluster, a seed node of a Cluster connection of its own (sharded pub/sub).
            Some(client) if start.is_cluster() => {
                Listen::Shard(vec![client.get_connection_info().clone()])
            }
            Some(client) => Listen::Nodes(vec![client]),
            None => listen.unwrap_or_else(|| start.reset_listeners()),
        };
        let name = self.name.unwrap_or_else(|| start.default_name());
        Ok(Validated {
            listen,
            start,
            settings: Settings {
                name: name.into_boxed_str(),
                mode: self.mode,
                prefix: self.prefix.into_boxed_str(),
                timeout: self.timeout,
                deny_cache: self.deny_cache,
                coalesce: self.coalesce,
            },
        })
    }
}

/// Where a backend starts from: one server this crate reconnects, or what redis-rs reconnects.
pub(super) enum Start {
    Server(Source),
    Other(Target),
}

impl Start {
    /// Where to hear other processes' resets: a URL's or client's server, a Cluster's seeds; none
    /// for a connection given as it is (Sentinel's is made with its source).
    fn reset_listeners(&self) -> Listen {
        match self {
            Start::Server(Source::Client(client)) => Listen::Nodes(vec![(**client).clone()]),
            Start::Other(Target::Urls(urls)) => Listen::Shard(
                urls.iter()
                    .filter_map(|url| url.as_str().into_connection_info().ok())
                    .collect(),
            ),
            _ => Listen::Nodes(Vec::new()),
        }
    }

    /// The `backend` label when none is given: where it connects, without password.
    fn default_name(&self) -> String {
        match self {
            Start::Server(Source::Sentinel { service, .. }) => format!("sentinel:{service}"),
            Start::Server(source) => source.describe(),
            Start::Other(Target::Urls(urls)) => {
                let seeds: Vec<String> = urls.iter().map(|u| address_of(u)).collect();
                seeds.join(",")
            }
            Start::Other(_) => "connection".to_owned(),
        }
    }

    /// Whether decisions go to a Cluster (which publishes with `SPUBLISH`).
    fn is_cluster(&self) -> bool {
        matches!(self, Start::Other(t) if !matches!(t, Target::Manager(_)))
    }
}

/// Settings that passed the checks, and where to start.
pub(super) struct Validated {
    listen: Listen,
    start: Start,
    settings: Settings,
}

impl Settings {
    /// The state of a backend on one reconnecting server, not connected yet.
    fn server_state(self, source: &Source) -> (Arc<RedisState>, Arc<SingleServer>) {
        let server = Arc::new(SingleServer::new(source, self.timeout));
        (
            self.state_on(RedisConnection::Server(server.clone())),
            server,
        )
    }

    /// A Cluster or a user's connection manager, connected and set up (set_up.rs).
    async fn open_other(self, target: Target) -> Result<Arc<RedisState>, BackendError> {
        let budget = start_budget(self.timeout);
        let name = self.name.to_string();
        let connecting = async {
            let (client, described) = match cluster_parts(target, self.timeout)? {
                Ok(parts) => parts,
                Err(given) => return Ok(given),
            };
            let failed = |e| match configuration_error(&e, &described, "connect") {
                Some(message) => BackendError::new(message),
                None => BackendError::with_source("cannot connect to the Redis Cluster", e),
            };
            let connected = client.get_async_connection().await;
            connected.map(RedisConnection::cluster_of).map_err(failed)
        };
        let conn = tokio::time::timeout(budget, connecting)
            .await
            .map_err(|_| {
                BackendError::new(format!(
                    "Redis did not accept a connection within {budget:?}"
                ))
            })??;
        let state = self.state_on(conn);
        let mut conn = state.conn.clone();
        let cluster = conn.cluster();
        tokio::time::timeout(budget, set_up(&mut conn, cluster, &state))
            .await
            .map_err(|_| BackendError::new(format!("Redis did not answer within {budget:?}")))?
            .map_err(|e| e.into_error(&name))?;
        in_service(&state);
        Ok(state)
    }

    /// A Cluster, connected by a background task, or a connection given as it is.
    fn lazy_other(self, target: Target) -> Result<Arc<RedisState>, BackendError> {
        let (client, described) = match cluster_parts(target, self.timeout)? {
            Ok(parts) => parts,
            Err(given) => return Ok(self.state_on(given)),
        };
        let lazy = Arc::new(LazyCluster::new(described));
        let state = self.state_on(RedisConnection::Cluster(lazy.clone()));
        spawn_cluster_keeper(client, lazy, Arc::downgrade(&state));
        Ok(state)
    }

    fn state_on(self, conn: RedisConnection) -> Arc<RedisState> {
        Arc::new(RedisState::new(conn, self))
    }
}

impl Validated {
    /// [`build`](RedisBackendBuilder::build): no connection made here; background tasks make it.
    pub(super) fn start_lazily(self) -> Result<Arc<RedisState>, BackendError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(BackendError::new(
                "a Redis backend must be built inside a tokio runtime (a tokio task keeps its connection)",
            ));
        }
        let seed = self.seed();
        let settings = self.settings;
        let nodes = self.listen;
        let state = match self.start {
            Start::Server(source) => {
                let (state, server) = settings.server_state(&source);
                spawn_keeper(source, server, Arc::downgrade(&state), false);
                state
            }
            Start::Other(target) => settings.lazy_other(target)?,
        };
        // Not waited for: `build` returns at once.
        let _first = listen(&state, seed, nodes);
        Ok(state)
    }

    /// [`connect`](RedisBackendBuilder::connect): connected and set up before it returns.
    pub(super) async fn start_eagerly(self) -> Result<Arc<RedisState>, BackendError> {
        let seed = self.seed();
        let settings = self.settings;
        let nodes = self.listen;
        let budget = start_budget(settings.timeout);
        let state = match self.start {
            Start::Server(mut source) => {
                let (state, server) = settings.server_state(&source);
                connect_once(&mut source, &server, &state, budget)
                    .await
                    .map_err(|e| e.error)?;
                spawn_keeper(source, server, Arc::downgrade(&state), true);
                state
            }
            Start::Other(target) => settings.open_other(target).await?,
        };
        // Listening before it returns (resets.rs says why); one that cannot yet keeps trying.
        if let Some(first) = listen(&state, seed, nodes) {
            let _ = tokio::time::timeout(budget, first).await;
        }
        Ok(state)
    }

    /// A Cluster's first seed URL's settings, with which its open nodes are probed (none for a
    /// Cluster client or connection of the user's).
    fn seed(&self) -> Option<ConnectionInfo> {
        match &self.start {
            Start::Other(Target::Urls(urls)) => urls.first()?.as_str().into_connection_info().ok(),
            _ => None,
        }
    }
}

/// A Cluster's client and how logs name it; or the connection a target gives as it is (a user's
/// connection manager or Cluster connection).
fn cluster_parts(
    target: Target,
    timeout: Duration,
) -> Result<Result<(ClusterClient, String), RedisConnection>, BackendError> {
    Ok(match target {
        Target::Manager(manager) => Err(RedisConnection::Single(manager)),
        Target::ClusterConnection(connection) => Err(RedisConnection::cluster_of(connection)),
        Target::Urls(urls) => Ok((cluster_client(&urls, timeout)?, redact_urls(&urls))),
        Target::ClusterClient(client) => Ok((*client, "a Cluster client".to_owned())),
    })
}

/// What both starts do last: with seed URLs, a Cluster's open nodes probed on connections of
/// their own; the listener started (the receiver hears its first attempt end).
fn listen(
    state: &Arc<RedisState>,
    seed: Option<ConnectionInfo>,
    listen: Listen,
) -> Option<tokio::sync::oneshot::Receiver<()>> {
    if let (Some(nodes), Some(seed)) = (&state.breaker.nodes, seed) {
        nodes.probe_with(seed);
    }
    resets::spawn_listener(listen, Arc::downgrade(state))
}

/// The sentinels' client, twice (the second the reset listener's: it cannot be cloned).
fn sentinel_source(
    sentinel: SentinelSettings,
    node: Option<SentinelNodeConnectionInfo>,
) -> Result<(Source, SentinelClient), BackendError> {
    if sentinel.urls.is_empty() {
        return Err(BackendError::new(
            "sentinels: give at least one sentinel URL",
        ));
    }
    if sentinel.service.trim().is_empty() {
        return Err(BackendError::new(
            "sentinel_service: name the service the sentinels monitor (e.g. \"mymaster\")",
        ));
    }
    let tls = sentinel.urls.iter().any(|u| u.starts_with("rediss:"));
    // TLS to the primary may come from the node settings alone (plain sentinels, TLS primary):
    // the crypto provider is needed then too. redis-rs hides the setting; its `Debug` shows it.
    let node_tls = node
        .as_ref()
        .is_some_and(|n| !format!("{n:?}").contains("tls_mode: None"));
    let node = node.unwrap_or_else(|| {
        let node = SentinelNodeConnectionInfo::default();
        if tls {
            node.set_tls_mode(redis::TlsMode::Secure)
        } else {
            node
        }
    });
    let described = redact_urls(&sentinel.urls);
    let build = || {
        SentinelClient::build(
            sentinel.urls.clone(),
            sentinel.service.clone(),
            Some(node.clone()),
            SentinelServerType::Master,
        )
        .map_err(|e| BackendError::with_source(format!("invalid sentinel URLs ({described})"), e))
    };
    let (client, listener) = (build()?, build()?);
    let source = Source::Sentinel {
        client: Box::new(client),
        service: sentinel.service,
        tls: tls || node_tls,
        urls: sentinel.urls,
        watch: None,
        watching: 0,
        doubted: None,
    };
    Ok((source, listener))
}

/// `host:port` of a URL (its password left out), or the URL redacted when it has no host.
fn address_of(url: &str) -> String {
    match url.into_connection_info() {
        Ok(info) => info.addr().to_string(),
        Err(_) => redact_url(url),
    }
}

fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
        return Err(format!(
            "Redis backend name {name:?} must be 1 to 64 printable characters"
        ));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_to_the_primary_alone_installs_the_crypto_provider() {
        let settings = || SentinelSettings {
            urls: vec!["redis://127.0.0.1:26379".into()],
            service: "mymaster".into(),
        };
        let tls = |(source, _)| matches!(source, Source::Sentinel { tls: true, .. });
        assert!(!tls(sentinel_source(settings(), None).unwrap()));
        let secure = SentinelNodeConnectionInfo::default().set_tls_mode(redis::TlsMode::Secure);
        assert!(tls(sentinel_source(settings(), Some(secure)).unwrap()));
        let plain = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(redis::RedisConnectionInfo::default().set_db(1));
        assert!(!tls(sentinel_source(settings(), Some(plain)).unwrap()));
    }

    #[test]
    fn the_backend_label_names_where_it_connects() {
        let builder = || RedisBackendBuilder::new("p", Duration::from_millis(100));
        let name = |b: RedisBackendBuilder| b.validated().map(|v| v.settings.name);
        let server = builder().url("redis://:secret@10.0.0.5:6379/");
        assert_eq!(&*name(server).unwrap(), "10.0.0.5:6379");
        let cluster = builder().cluster_urls(["redis://a:7000", "redis://u:pw@b:7001"]);
        assert_eq!(&*name(cluster).unwrap(), "a:7000,b:7001");
        let sentinel = builder().sentinel(["redis://127.0.0.1:26379"], "mymaster");
        assert_eq!(&*name(sentinel).unwrap(), "sentinel:mymaster");
        let named = builder().url("redis://10.0.0.5:6379/").name("sessions");
        assert_eq!(&*name(named).unwrap(), "sessions");
        for bad in ["", "a\nb", &"x".repeat(65)] {
            let bad = builder().url("redis://10.0.0.5:6379/").name(bad);
            assert!(name(bad).is_err());
        }
    }

    /// `connect` and `build` start a client alike: as one server this crate reconnects, whatever
    /// `cluster` says (once a redis-rs `ConnectionManager` under `connect`).
    #[test]
    fn a_client_is_one_server_even_with_cluster_set() {
        let client = Client::open("redis://127.0.0.1:6379/").unwrap();
        let builder = RedisBackendBuilder::new("p", Duration::from_millis(100));
        let validated = builder.cluster(true).client(client).validated().unwrap();
        assert!(matches!(validated.start, Start::Server(Source::Client(_))));
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(validate_prefix("throttle").is_ok());
        assert!(validate_prefix("app:v2/limits").is_ok());
        for bad in ["", "a b", "a{b}", "x".repeat(65).as_str(), "é"] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
    }
}

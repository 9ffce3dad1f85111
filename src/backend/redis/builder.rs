//! `RedisBackendBuilder`: the settings of a Redis backend, their validation, and the start-up work of
//! `connect` (open the connection, then load the script or detect the module).

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, RedisError};

use super::check::RedisState;
use super::connection::{cell_loaded, RedisConnection, Target};
use super::mode::RedisMode;
use super::scripts;
use crate::error::BackendError;

/// Builds a [`RedisBackend`](crate::RedisBackend); see
/// [`RedisBackend::builder`](crate::RedisBackend::builder).
#[must_use]
pub struct RedisBackendBuilder {
    target: Option<Target>,
    cluster: bool,
    mode: RedisMode,
    prefix: String,
    timeout: Duration,
    deny_cache: bool,
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
    /// No target yet; `Auto` mode, the deny cache on, and the given defaults.
    pub(super) fn new(prefix: &str, timeout: Duration) -> Self {
        RedisBackendBuilder {
            target: None,
            cluster: false,
            mode: RedisMode::Auto,
            prefix: prefix.to_owned(),
            timeout,
            deny_cache: true,
        }
    }

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

    /// The work of [`connect`](Self::connect): checks the settings, connects and, in `Lua` mode,
    /// loads the script, in `Cell` and `Auto` modes detects the redis-cell module.
    pub(super) async fn open(self) -> Result<RedisState, BackendError> {
        validate_prefix(&self.prefix).map_err(BackendError::new)?;
        if self.timeout.is_zero() {
            return Err(BackendError::new("Redis timeout must be greater than zero"));
        }
        let timeout = self.timeout;
        let target = self.target.ok_or_else(|| {
            BackendError::new("no Redis to connect to: set a url, urls, client or connection")
        })?;
        // Connecting and detecting get a few timeouts' worth of time: this happens once, at start-up.
        let start_budget = timeout.saturating_mul(10).max(Duration::from_secs(1));
        let conn = RedisConnection::open(target, self.cluster, timeout, start_budget).await?;
        let state = RedisState::new(
            conn,
            self.mode,
            self.prefix.into_boxed_str(),
            timeout,
            self.deny_cache,
        );
        let mut conn = state.conn.clone();
        let probe = async {
            match self.mode {
                RedisMode::Lua => scripts::load_gcra(&mut conn).await,
                RedisMode::Cell | RedisMode::Auto => {
                    let loaded = cell_loaded(&mut conn).await?;
                    if self.mode == RedisMode::Cell && !loaded {
                        return Err(RedisError::from((
                            redis::ErrorKind::Client,
                            "mode \"cell\" needs the redis-cell module (CL.THROTTLE), which this Redis has not loaded; use mode \"lua\" or \"auto\"",
                        )));
                    }
                    state.detector.detected(loaded, &state.breaker);
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
        Ok(state)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_checked() {
        assert!(validate_prefix("throttle").is_ok());
        assert!(validate_prefix("app:v2/limits").is_ok());
        for bad in ["", "a b", "a{b}", "x".repeat(65).as_str(), "é"] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
    }
}

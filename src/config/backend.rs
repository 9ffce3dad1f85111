//! Turning `[backend]` into a backend: the memory backend with its cap, or a connection to Redis,
//! and the extra Redis connections that the access lists and the offender counts read through.

use super::schema::BackendConfig;
#[cfg(feature = "redis")]
use super::schema::RedisConfig;
use super::Config;
#[cfg(feature = "redis")]
use crate::access::{AccessList, RedisAccessSync};
use crate::backend::MemoryBackend;
#[cfg(feature = "redis")]
use crate::backend::{RedisBackend, RedisMode};
#[cfg(feature = "redis")]
use crate::error::BackendError;
use crate::error::BuildError;
#[cfg(feature = "redis")]
use crate::offenders::Offenders;
#[cfg(feature = "redis")]
use std::time::Duration;

impl Config {
    /// The in-memory backend with the configured cap; an error if `[backend]` is not `"memory"`.
    pub(super) fn memory_backend(&self) -> Result<MemoryBackend, BuildError> {
        let BackendConfig::Memory { max_keys } = &self.backend else {
            return Err(BuildError::Invalid(format!(
                "the backend is {}, not memory",
                self.backend
            )));
        };
        let mut backend = MemoryBackend::builder();
        if let Some(max_keys) = max_keys {
            backend = backend.max_keys(*max_keys);
        }
        backend.build()
    }
}

#[cfg(feature = "redis")]
impl RedisConfig {
    /// Another connection to this Redis, for the access lists and the offender counts.
    async fn open(&self, purpose: &str) -> Result<ExtraConnection, BackendError> {
        let urls: Vec<String> = self
            .url
            .iter()
            .chain(self.urls.iter().flatten())
            .cloned()
            .collect();
        let failed =
            |e| BackendError::with_source(format!("cannot connect to Redis for {purpose}"), e);
        if self.cluster || self.urls.is_some() {
            let conn = redis::cluster::ClusterClient::new(urls)
                .map_err(failed)?
                .get_async_connection()
                .await
                .map_err(failed)?;
            Ok(ExtraConnection::Cluster(conn))
        } else {
            let url = urls
                .first()
                .ok_or_else(|| BackendError::new("[backend] kind = \"redis\" needs a url"))?;
            let client = redis::Client::open(url.as_str()).map_err(failed)?;
            let conn = redis::aio::ConnectionManager::new(client)
                .await
                .map_err(failed)?;
            Ok(ExtraConnection::Single(conn))
        }
    }

    /// Mirrors the access-list sets from this Redis into `lists`, in a background task.
    pub(super) async fn spawn_access_sync(
        &self,
        sync: RedisAccessSync,
        lists: &AccessList,
    ) -> Result<(), BackendError> {
        match self.open("the access lists").await? {
            ExtraConnection::Single(conn) => sync.spawn(conn, lists).await,
            ExtraConnection::Cluster(conn) => sync.spawn(conn, lists).await,
        }
    }

    /// Distinct limited clients counted in this Redis, under the backend's prefix.
    pub(super) async fn offenders(&self) -> Result<Offenders, BackendError> {
        let prefix = self
            .prefix
            .clone()
            .unwrap_or_else(|| RedisBackend::DEFAULT_PREFIX.to_owned());
        Ok(match self.open("counting limited clients").await? {
            ExtraConnection::Single(conn) => Offenders::redis(conn, prefix),
            ExtraConnection::Cluster(conn) => Offenders::redis_cluster(conn, prefix),
        })
    }

    /// Connects, as [`RedisBackend::builder`] would with these settings.
    pub async fn connect(&self) -> Result<RedisBackend, BackendError> {
        let mode = match &self.mode {
            Some(mode) => mode
                .parse()
                .map_err(|e: BuildError| BackendError::new(format!("[backend] mode: {e}")))?,
            None => RedisMode::Auto,
        };
        let mut builder = RedisBackend::builder().mode(mode);
        builder = match (&self.url, &self.urls) {
            (Some(_), Some(_)) => {
                return Err(BackendError::new(
                    "set either url or urls in [backend], not both",
                ))
            }
            (Some(url), None) => builder.url(url.clone()).cluster(self.cluster),
            (None, Some(urls)) => builder.cluster_urls(urls.clone()),
            (None, None) => {
                return Err(BackendError::new("[backend] kind = \"redis\" needs a url"))
            }
        };
        if let Some(prefix) = &self.prefix {
            builder = builder.prefix(prefix.clone());
        }
        if let Some(ms) = self.timeout_ms {
            builder = builder.timeout(Duration::from_millis(ms));
        }
        if let Some(on) = self.deny_cache {
            builder = builder.deny_cache(on);
        }
        builder.connect().await
    }
}

/// A connection for the access lists or the offender counts, to one server or a Cluster.
#[cfg(feature = "redis")]
enum ExtraConnection {
    Single(redis::aio::ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

//! Turning `[backend]` into a backend: the memory backend with its cap, or a connection to Redis,
//! and the extra Redis connections that the access lists and the offender counts read through.

#[cfg(feature = "redis")]
use super::schema::RedisConfig;
use super::schema::{set, BackendConfig};
use super::Config;
#[cfg(feature = "redis")]
use crate::access::{AccessList, RedisAccessSync};
use crate::backend::memory::state_file::AsMemory;
#[cfg(feature = "redis")]
use crate::backend::redis::{RedisBackend, RedisBackendBuilder, RedisMode};
use crate::backend::Backend;
use crate::backend::{MemoryBackend, MemoryBackendBuilder};
use crate::engine::table::kept_limits;
#[cfg(feature = "redis")]
use crate::error::BackendError;
use crate::error::BuildError;
use crate::limit::Limit;
use crate::middleware::ThrottleLayer;
#[cfg(feature = "redis")]
use crate::offenders::Offenders;
use crate::policy::Policy;
#[cfg(feature = "redis")]
use std::time::Duration;

impl Config {
    /// The in-memory backend with the configured cap; an error if `[backend]` is not `"memory"`.
    pub(super) fn memory_backend(&self) -> Result<MemoryBackend, BuildError> {
        let BackendConfig::Memory { max_keys, .. } = &self.backend else {
            return Err(BuildError::Invalid(format!(
                "the backend is {}, not memory",
                self.backend
            )));
        };
        let backend = MemoryBackend::builder();
        set(backend, *max_keys, MemoryBackendBuilder::max_keys).build()
    }

    /// With `[backend] state_file`: gives `backend`'s keys the state the file kept for `policies`'
    /// limits. A missing file is a first start; a damaged one is logged and ignored. An error when
    /// no file can be written there: found at shutdown, every restart would start afresh.
    pub(super) fn restore_state<K>(
        &self,
        backend: &MemoryBackend,
        policies: &[Policy<K>],
    ) -> Result<(), BuildError> {
        let BackendConfig::Memory {
            state_file: Some(path),
            ..
        } = &self.backend
        else {
            return Ok(());
        };
        writable(path).map_err(|e| {
            BuildError::Invalid(format!(
                "[backend] state_file {:?}: no file can be written there ({e}), so no key would be \
                 kept across a restart",
                path.display()
            ))
        })?;
        match backend.load_state(path, &limits_of(policies)) {
            Ok(keys) => tracing::info!(keys, path = %path.display(), "state_file: keys restored"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(path = %path.display(), "state_file: none yet; every key starts afresh")
            }
            Err(e) => tracing::warn!(
                error = %e,
                path = %path.display(),
                "state_file ignored: every key starts afresh"
            ),
        }
        Ok(())
    }

    /// With `[backend] state_file` and the memory backend: writes the live keys of `layer`'s
    /// policies to the file, for the next process to read when it builds its layer (call it on
    /// graceful shutdown). `Ok(None)` without a state file or on Redis, whose state outlives the
    /// process anyway; `Ok(Some(keys))` once written.
    pub fn save_state<K, B>(&self, layer: &ThrottleLayer<K, B>) -> std::io::Result<Option<usize>>
    where
        B: Backend + AsMemory,
    {
        let BackendConfig::Memory {
            state_file: Some(path),
            ..
        } = &self.backend
        else {
            return Ok(None);
        };
        let Some(memory) = layer.backend().as_memory() else {
            return Ok(None);
        };
        memory
            .save_state(path, &limits_of(&layer.policies()))
            .map(Some)
    }
}

/// Whether a state file can be written at `path`: in its directory, as a save writes it (a file
/// beside it, renamed over it).
fn writable(path: &std::path::Path) -> std::io::Result<()> {
    let name = path.file_name().ok_or(std::io::ErrorKind::InvalidInput)?;
    if path.is_dir() {
        return Err(std::io::ErrorKind::IsADirectory.into());
    }
    // A name of this check's own: two layers built at once from one config each probe theirs.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let probe_number = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut probe = name.to_owned();
    probe.push(format!(".{}-probe{probe_number}.tmp", std::process::id()));
    let probe = path.with_file_name(probe);
    std::fs::File::create_new(&probe)?;
    std::fs::remove_file(&probe)
}

/// Every limit of `policies` that a key's state is kept under.
fn limits_of<K>(policies: &[Policy<K>]) -> Vec<Limit> {
    kept_limits(policies).into_iter().map(|(_, l)| l).collect()
}

#[cfg(feature = "redis")]
impl RedisConfig {
    /// Mirrors the access-list sets from this Redis into `lists`, in a background task, through the
    /// backend's own connection. A first read Redis does not answer is retried for as long as the
    /// backend lives: the task holds its connection, and must not keep it open past the backend.
    pub(super) fn spawn_access_sync(
        &self,
        backend: &RedisBackend,
        sync: RedisAccessSync,
        lists: &AccessList,
    ) {
        let conn = backend.connection();
        let alive = backend.liveness();
        let lists = lists.clone();
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(50);
            let mut warned = false;
            let mut refused = false;
            loop {
                if !alive() {
                    return;
                }
                // Reads, and once that succeeds keeps reading (a read is not made twice: the
                // second failing would start no refresh, for good).
                match sync.clone().spawn(conn.clone(), &lists).await {
                    Ok(()) => return,
                    // Redis answered and refused (NOPERM, WRONGTYPE, NOAUTH...): retrying will not
                    // fix it; said once, at error level, with the reply.
                    Err(e) if is_refusal(&e) => {
                        if !refused {
                            refused = true;
                            tracing::error!(error = %e, "Redis refused to give the access lists; only the local entries apply until this is fixed (check the user's ACL and the sets' type)");
                        }
                    }
                    Err(e) if !warned => {
                        warned = true;
                        tracing::warn!(error = %e, "access lists not read from Redis yet; retrying in the background");
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(wait).await;
                let most = if refused {
                    Duration::from_secs(5)
                } else {
                    Duration::from_secs(1)
                };
                wait = (wait * 2).min(most);
            }
        });
    }

    /// Distinct limited clients counted in this Redis, under the backend's prefix and connection.
    pub(super) fn offenders(&self, backend: &RedisBackend) -> Offenders {
        let prefix = self
            .prefix
            .clone()
            .unwrap_or_else(|| RedisBackend::DEFAULT_PREFIX.to_owned());
        Offenders::redis_on(backend.connection(), prefix)
    }

    /// Connects before returning, as [`RedisBackend::builder`] would with these settings and
    /// [`connect`](crate::redis::RedisBackendBuilder::connect): fails if Redis cannot be reached.
    pub async fn connect(&self) -> Result<RedisBackend, BackendError> {
        self.builder()?.connect().await
    }

    /// The backend as `connect` says: `"lazy"` (default) connects in the background
    /// ([`build`](crate::redis::RedisBackendBuilder::build)) and returns once the first attempt has ended
    /// ([`first_attempt`](RedisBackend::first_attempt): connected, refused, or one attempt's budget
    /// for a frozen Redis; a Cluster's first attempt connects only once the Cluster has formed);
    /// `"eager"` as [`connect`](Self::connect). Either way, an error when Redis refuses the configuration (a wrong or missing
    /// password, missing ACL permissions, mode "cell" without the module).
    pub async fn start(&self) -> Result<RedisBackend, BackendError> {
        let eager = super::schema::one_of(
            "[backend] connect =",
            self.connect.as_deref(),
            &[("lazy", false), ("eager", true)],
        )
        .map_err(BackendError::new)?;
        let builder = self.builder()?;
        if eager {
            builder.connect().await
        } else {
            let backend = builder
                .build()
                .map_err(|e| BackendError::new(e.to_string()))?;
            // Redis up: start on it. Down: go on as soon as the first attempt says so. Refused:
            // fail now, as retrying will not fix it and requests would follow the failure policy.
            backend.first_attempt().await?;
            Ok(backend)
        }
    }

    /// The builder with these settings; an error names the key at fault.
    pub(super) fn builder(&self) -> Result<RedisBackendBuilder, BackendError> {
        let mode = match &self.mode {
            Some(mode) => mode
                .parse()
                .map_err(|e: BuildError| BackendError::new(format!("[backend] mode: {e}")))?,
            None => RedisMode::Auto,
        };
        let mut builder = RedisBackend::builder().mode(mode);
        builder = match (&self.url, &self.urls, &self.sentinels) {
            (Some(_), Some(_), _) => {
                return Err(BackendError::new(
                    "set either url or urls in [backend], not both",
                ))
            }
            (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
                return Err(BackendError::new(
                    "set either sentinels or url/urls in [backend], not both (the sentinels name the primary)",
                ))
            }
            (None, None, Some(sentinels)) => {
                if self.cluster {
                    return Err(BackendError::new(
                        "[backend] sentinels name one primary: cluster = true does not go with them",
                    ));
                }
                let Some(service) = &self.sentinel_service else {
                    return Err(BackendError::new(
                        "[backend] sentinels needs sentinel_service, the name the sentinels monitor (e.g. \"mymaster\")",
                    ));
                };
                let builder = builder.sentinel(sentinels.clone(), service.clone());
                match sentinel_node(self, sentinels) {
                    Some(node) => builder.sentinel_node(node),
                    None => builder,
                }
            }
            (Some(url), None, None) => builder.url(url.clone()).cluster(self.cluster),
            (None, Some(urls), None) => builder.cluster_urls(urls.clone()),
            (None, None, None) => {
                return Err(BackendError::new(
                    "[backend] kind = \"redis\" needs a url (or urls, or sentinels)",
                ))
            }
        };
        if (self.primary_password.is_some() || self.primary_username.is_some())
            && self.sentinels.is_none()
        {
            return Err(BackendError::new(
                "[backend] primary_password and primary_username go with sentinels (with url or urls, the password is in the URL: redis://user:password@host:port/)",
            ));
        }
        builder = set(builder, self.name.clone(), RedisBackendBuilder::name);
        if self.sentinel_service.is_some() && self.sentinels.is_none() {
            return Err(BackendError::new(
                "[backend] sentinel_service needs sentinels, the sentinels' URLs",
            ));
        }
        builder = set(builder, self.prefix.clone(), RedisBackendBuilder::prefix);
        if self.timeout_ms == Some(0) {
            return Err(BackendError::new(
                "[backend] timeout_ms must be more than 0",
            ));
        }
        let timeout = self.timeout_ms.map(Duration::from_millis);
        builder = set(builder, timeout, RedisBackendBuilder::timeout);
        Ok(set(
            builder,
            self.deny_cache,
            RedisBackendBuilder::deny_cache,
        ))
    }
}

/// How to log in to the primary the sentinels name: `primary_password` / `primary_username`, over
/// TLS when the sentinels' URLs are `rediss://` (as without a password). `None`: neither key.
#[cfg(feature = "redis")]
fn sentinel_node(
    config: &RedisConfig,
    sentinels: &[String],
) -> Option<redis::sentinel::SentinelNodeConnectionInfo> {
    if config.primary_password.is_none() && config.primary_username.is_none() {
        return None;
    }
    let mut login = redis::RedisConnectionInfo::default();
    if let Some(password) = &config.primary_password {
        login = login.set_password(password.clone());
    }
    if let Some(username) = &config.primary_username {
        login = login.set_username(username.clone());
    }
    let node =
        redis::sentinel::SentinelNodeConnectionInfo::default().set_redis_connection_info(login);
    Some(if sentinels.iter().any(|u| u.starts_with("rediss:")) {
        node.set_tls_mode(redis::TlsMode::Secure)
    } else {
        node
    })
}

/// Whether Redis answered the access-list read with a refusal (an error reply such as `NOPERM` or
/// `WRONGTYPE`, or a reply of the wrong type), rather than failing to answer.
#[cfg(feature = "redis")]
fn is_refusal(error: &BackendError) -> bool {
    use std::error::Error as _;
    let Some(e) = error
        .source()
        .and_then(|s| s.downcast_ref::<redis::RedisError>())
    else {
        return false;
    };
    let failover = |code: &str| matches!(code, "READONLY" | "MASTERDOWN" | "LOADING");
    // The sets are read in one pipeline: its error replies come together, with their own codes.
    if let Some(replies) = e.clone().into_server_errors() {
        return replies.iter().any(|(_, reply)| !failover(reply.code()));
    }
    (e.code().is_some_and(|code| !failover(code)) && !e.is_io_error() && !e.is_timeout())
        || e.kind() == redis::ErrorKind::UnexpectedReturnType
        || e.kind() == redis::ErrorKind::AuthenticationFailed
}

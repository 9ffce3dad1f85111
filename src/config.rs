//! Per-route policies from TOML (feature `config`). The README documents every key.
//!
//! ```
//! use tower_throttle::config::Config;
//!
//! let config = Config::from_toml(r#"
//!     listen = "127.0.0.1:3000"
//!     [backend]
//!     kind = "memory"
//!     [[route]]
//!     name = "reply"
//!     path = "/reply"
//!     methods = ["POST"]
//!     key = "header:x-user-id"
//!     max_burst = 15
//!     count = 30
//!     period = "60s"
//!     cost = 1
//! "#).unwrap();
//! let layer = config.memory_layer().unwrap();
//! assert_eq!(layer.policies()[0].limit().quota().limit(), 16);
//!
//! let err = Config::from_toml("[[route]]\nname = \"x\"\nkey = \"ip\"\ncount = 0\nperiod = \"1s\"")
//!     .unwrap()
//!     .memory_layer()
//!     .unwrap_err();
//! assert_eq!(err.to_string(), r#"policy "x": quota count must be at least 1"#);
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, StatusCode};
use serde::{Deserialize, Deserializer};

use crate::access::AccessList;
use crate::key::{ClientIp, ForwardedHeader, KeySpec, PeerIp, TrustedProxies};
#[cfg(feature = "redis")]
use crate::offenders::Offenders;
use crate::{
    Algorithm, BuildError, MemoryBackend, MissingKey, OnBackendError, Penalty, Policy, Quota,
    ThrottleLayer, ThrottleLayerBuilder,
};

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Where a server should listen (used by the example server).
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// The backend.
    #[serde(default)]
    pub backend: BackendConfig,
    /// Send `RateLimit-Policy` / `RateLimit` (default true).
    #[serde(default = "yes")]
    pub ratelimit_headers: bool,
    /// Send `X-RateLimit-*` (default false).
    #[serde(default)]
    pub legacy_headers: bool,
    /// Insert a `ThrottleDecision` into every admitted request for handlers to read (default false;
    /// dry-run and delay-mode routes always do).
    #[serde(default)]
    pub decision_extension: bool,
    /// `"allow"` (the default when unset), `"deny"` or `"local"`: what to do when the backend fails.
    #[serde(default, deserialize_with = "some_on_backend_error")]
    pub on_backend_error: Option<OnBackendError>,
    /// Networks of the proxies whose forwarding header is believed, for `key = "client-ip"`:
    /// CIDRs (`"10.0.0.0/8"`, `"::1/128"`) or addresses.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// The header those proxies set: `"x-forwarded-for"` (default), `"forwarded"` or `"x-real-ip"`.
    #[serde(default)]
    pub client_ip_header: Option<String>,
    /// Allow and deny lists.
    #[serde(default)]
    pub access: Option<AccessConfig>,
    /// The policies, tried in order; the first whose path and methods match decides.
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteConfig>,
}

fn yes() -> bool {
    true
}

/// The `[backend]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
#[non_exhaustive]
pub enum BackendConfig {
    /// `kind = "memory"`: the in-memory backend.
    #[non_exhaustive]
    Memory {
        /// The most live keys (default 1,000,000).
        #[serde(default)]
        max_keys: Option<usize>,
    },
    /// `kind = "redis"`: the Redis backend (feature `redis`).
    Redis(RedisConfig),
}

/// The `[backend]` table with `kind = "redis"`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisConfig {
    /// One server, or with `cluster = true` one seed node: `redis://[user:password@]host:port/[db]`,
    /// `rediss://` for TLS.
    #[serde(default)]
    pub url: Option<String>,
    /// Seed nodes of a Cluster (implies `cluster = true`).
    #[serde(default)]
    pub urls: Option<Vec<String>>,
    /// `"auto"` (default), `"cell"` or `"lua"`.
    #[serde(default)]
    pub mode: Option<String>,
    /// The first part of every key (default `"throttle"`).
    #[serde(default)]
    pub prefix: Option<String>,
    /// The longest a decision may take, in milliseconds (default 100).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// `"allow"`, `"deny"` or `"local"`: what to do when Redis fails or times out (default: the
    /// top-level `on_backend_error`, itself `"allow"` by default).
    #[serde(default, deserialize_with = "some_on_backend_error")]
    pub on_error: Option<OnBackendError>,
    /// Whether `url` / `urls` name a Redis Cluster.
    #[serde(default)]
    pub cluster: bool,
    /// Reject keys that Redis limited locally until their retry time (default true).
    #[serde(default)]
    pub deny_cache: Option<bool>,
}

impl RedisConfig {
    /// A configuration for one server at `url`, everything else default.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: Some(url.into()),
            ..Default::default()
        }
    }

    /// The URLs to connect to, with the password hidden: for messages.
    pub fn describe(&self) -> String {
        let urls: Vec<&str> = self
            .url
            .iter()
            .map(String::as_str)
            .chain(self.urls.iter().flatten().map(String::as_str))
            .collect();
        let urls: Vec<String> = urls.iter().map(|u| crate::error::redact_url(u)).collect();
        let mode = self.mode.as_deref().unwrap_or("auto");
        let cluster = if self.cluster || self.urls.is_some() {
            "cluster "
        } else {
            ""
        };
        format!("redis {cluster}{} (mode {mode})", urls.join(", "))
    }

    /// Another connection to this Redis, for the access lists and the offender counts.
    #[cfg(feature = "redis")]
    async fn open(&self, purpose: &str) -> Result<ExtraConnection, crate::BackendError> {
        use crate::BackendError;
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
    #[cfg(feature = "redis")]
    async fn spawn_access_sync(
        &self,
        sync: crate::access::RedisAccessSync,
        lists: &AccessList,
    ) -> Result<(), crate::BackendError> {
        match self.open("the access lists").await? {
            ExtraConnection::Single(conn) => sync.spawn(conn, lists).await,
            ExtraConnection::Cluster(conn) => sync.spawn(conn, lists).await,
        }
    }

    /// Distinct limited clients counted in this Redis, under the backend's prefix.
    #[cfg(feature = "redis")]
    async fn offenders(&self) -> Result<Offenders, crate::BackendError> {
        let prefix = self
            .prefix
            .clone()
            .unwrap_or_else(|| crate::RedisBackend::DEFAULT_PREFIX.to_owned());
        Ok(match self.open("counting limited clients").await? {
            ExtraConnection::Single(conn) => Offenders::redis(conn, prefix),
            ExtraConnection::Cluster(conn) => Offenders::redis_cluster(conn, prefix),
        })
    }

    /// Connects, as [`RedisBackend::builder`](crate::RedisBackend::builder) would with these settings.
    #[cfg(feature = "redis")]
    pub async fn connect(&self) -> Result<crate::RedisBackend, crate::BackendError> {
        use crate::BackendError;
        let mode = match &self.mode {
            Some(mode) => mode
                .parse()
                .map_err(|e: BuildError| BackendError::new(format!("[backend] mode: {e}")))?,
            None => crate::RedisMode::Auto,
        };
        let mut builder = crate::RedisBackend::builder().mode(mode);
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

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig::Memory { max_keys: None }
    }
}

impl fmt::Display for BackendConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendConfig::Memory { max_keys } => {
                write!(f, "memory (max_keys {})", max_keys.unwrap_or(1_000_000))
            }
            BackendConfig::Redis(redis) => f.write_str(&redis.describe()),
        }
    }
}

/// The `[access]` table: allow and deny lists. Networks are matched against the client IP (behind
/// `trusted_proxies` when there are any, else the peer), keys against the matching policy's key.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AccessConfig {
    /// Networks or addresses that bypass every limit.
    #[serde(default)]
    pub allow_networks: Vec<String>,
    /// Networks or addresses answered `403 Forbidden`.
    #[serde(default)]
    pub deny_networks: Vec<String>,
    /// Keys that bypass every limit (a value that is an IP address also matches `ip` and `client-ip`
    /// keys).
    #[serde(default)]
    pub allow_keys: Vec<String>,
    /// Keys answered `403 Forbidden`.
    #[serde(default)]
    pub deny_keys: Vec<String>,
    /// With a Redis backend: also mirror the sets `{<this>}:allow:net`, `:deny:net`, `:allow:key` and
    /// `:deny:key`, read every `redis_refresh` (default `"1s"`).
    #[serde(default)]
    pub redis_sets: Option<String>,
    /// How often the Redis sets are read again.
    #[serde(default, deserialize_with = "some_duration")]
    pub redis_refresh: Option<Duration>,
}

impl AccessConfig {
    /// The static lists.
    pub fn lists(&self) -> Result<AccessList, BuildError> {
        let lists = AccessList::new();
        let bad = |e: crate::key::InvalidCidr| BuildError::Invalid(format!("[access]: {e}"));
        for n in &self.allow_networks {
            lists.allow_network(n).map_err(bad)?;
        }
        for n in &self.deny_networks {
            lists.deny_network(n).map_err(bad)?;
        }
        for k in &self.allow_keys {
            for key in crate::access::keys_named(k.as_bytes()) {
                lists.allow_key(key);
            }
        }
        for k in &self.deny_keys {
            for key in crate::access::keys_named(k.as_bytes()) {
                lists.deny_key(key);
            }
        }
        Ok(lists)
    }
}

/// One `[[route]]`: a policy.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RouteConfig {
    /// The policy name: the namespace of its keys.
    pub name: String,
    /// The route, in axum path syntax; without it the policy applies to every path.
    #[serde(default)]
    pub path: Option<String>,
    /// The methods; without it, every method.
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    /// `"ip"`, `"client-ip"`, `"global"` or `"header:<name>"`.
    #[serde(deserialize_with = "key_spec")]
    pub key: KeySpec,
    /// For `key = "ip"` or `"client-ip"`: group IPv6 clients by this prefix (default 64).
    #[serde(default)]
    pub ipv6_prefix: Option<u8>,
    /// `CL.THROTTLE`'s max_burst (the limit is max_burst + 1); default count - 1. GCRA only.
    #[serde(default)]
    pub max_burst: Option<u64>,
    /// Requests per period (or in flight, for `algorithm = "concurrency"`). Required unless
    /// `quotas` is given.
    #[serde(default)]
    pub count: Option<u64>,
    /// The period, such as `"60s"`, `"1m"`, `"500ms"`, `"1day"`. Required with `count` (except for
    /// `algorithm = "concurrency"`).
    #[serde(default, deserialize_with = "some_duration")]
    pub period: Option<Duration>,
    /// Stacked quotas instead of `count`/`period`/`max_burst`:
    /// `[{ max_burst = 9, count = 10, period = "1s" }, { count = 1000, period = "1d" }]`; a request
    /// must pass every one.
    #[serde(default)]
    pub quotas: Option<Vec<QuotaConfig>>,
    /// `"gcra"` (default), `"sliding-log"`, `"fixed-window"`, `"sliding-window"` or `"concurrency"`.
    #[serde(default)]
    pub algorithm: Option<String>,
    /// `"enforce"` (default), `"dry-run"` (decide and report, never reject) or `"delay"` (GCRA:
    /// requests beyond the burst wait up to `max_delay`).
    #[serde(default)]
    pub mode: Option<String>,
    /// With `mode = "delay"`: the longest a request waits, such as `"2s"`.
    #[serde(default, deserialize_with = "some_duration")]
    pub max_delay: Option<Duration>,
    /// With `algorithm = "concurrency"` on Redis: how long a slot's lease lives if its process dies
    /// (default `"60s"`).
    #[serde(default, deserialize_with = "some_duration")]
    pub lease: Option<Duration>,
    /// Quotas per tier (plan): `[route.tiers.paid]` with `count`/`period`/`max_burst` or `quotas`.
    /// The tier comes from a `Tier` request extension or the `tier_header`; other requests get the
    /// route's own quota.
    #[serde(default)]
    pub tiers: Option<std::collections::BTreeMap<String, TierConfig>>,
    /// The request header naming the tier, such as `"x-plan"`. Only a header that a trusted proxy
    /// sets (and strips from clients).
    #[serde(default)]
    pub tier_header: Option<String>,
    /// Units each request costs (default 1).
    #[serde(default)]
    pub cost: Option<u64>,
    /// `"reject"` (400, the default) or `"allow"`: requests without a key.
    #[serde(default)]
    pub on_missing_key: Option<String>,
    /// `{ after = 3, within = "1m", ban = "10m" }`: a key limited `after` times within `within` is
    /// banned for `ban`.
    #[serde(default)]
    pub penalty: Option<PenaltyConfig>,
}

/// One quota of a stack (`quotas = [...]`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct QuotaConfig {
    /// GCRA only; default count - 1.
    #[serde(default)]
    pub max_burst: Option<u64>,
    /// Requests per period.
    pub count: u64,
    /// The period.
    #[serde(deserialize_with = "duration")]
    pub period: Duration,
}

/// A tier's quotas (`[route.tiers.<name>]`): `count`/`period`/`max_burst`, or `quotas`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TierConfig {
    /// GCRA only; default count - 1.
    #[serde(default)]
    pub max_burst: Option<u64>,
    /// Requests per period.
    #[serde(default)]
    pub count: Option<u64>,
    /// The period.
    #[serde(default, deserialize_with = "some_duration")]
    pub period: Option<Duration>,
    /// Stacked quotas.
    #[serde(default)]
    pub quotas: Option<Vec<QuotaConfig>>,
}

/// The quotas of a route or tier: `quotas`, or `count`/`period`/`max_burst`.
fn quotas_of(
    algorithm: Algorithm,
    count: Option<u64>,
    period: Option<Duration>,
    max_burst: Option<u64>,
    quotas: Option<&[QuotaConfig]>,
) -> Result<Vec<Quota>, String> {
    let gcra = algorithm == Algorithm::Gcra;
    let one = |count: u64, period: Option<Duration>, max_burst: Option<u64>| {
        let period = match (period, algorithm) {
            (Some(period), _) => period,
            // In flight, not per period: any period will do.
            (None, Algorithm::Concurrency) => Duration::from_secs(1),
            (None, _) => return Err("period is required with count".to_owned()),
        };
        let mut quota = Quota::per_period(count, period);
        match max_burst {
            Some(_) if !gcra => Err(format!(
                "max_burst is only used by algorithm \"gcra\", not {:?}; remove it",
                algorithm.as_str()
            )),
            Some(max_burst) => {
                quota = quota.with_max_burst(max_burst);
                Ok(quota)
            }
            None => Ok(quota),
        }
    };
    if let Some(quotas) = quotas {
        if count.is_some() || period.is_some() || max_burst.is_some() {
            return Err("give either quotas or count/period/max_burst, not both".into());
        }
        if quotas.is_empty() {
            return Err("quotas is empty".into());
        }
        return quotas
            .iter()
            .map(|q| one(q.count, Some(q.period), q.max_burst))
            .collect();
    }
    match count {
        Some(count) => Ok(vec![one(count, period, max_burst)?]),
        None => Err("a quota is required: count and period, or quotas".into()),
    }
}

/// A route's `penalty` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PenaltyConfig {
    /// Rejections that earn a ban.
    pub after: u32,
    /// The window they must fall in.
    #[serde(deserialize_with = "duration")]
    pub within: Duration,
    /// The length of the ban.
    #[serde(deserialize_with = "duration")]
    pub ban: Duration,
}

/// A configuration file that does not parse.
#[derive(Debug)]
pub struct ConfigError(String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Parses TOML. Unknown keys are errors, so that a typo does not silently disable a limit.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError(e.to_string()))
    }

    /// The policies, validated.
    pub fn policies(&self) -> Result<Vec<Policy<KeySpec>>, BuildError> {
        let client_ip = self.client_ip()?;
        self.routes
            .iter()
            .map(|route| route.policy_behind(&client_ip))
            .collect()
    }

    /// The client-IP extractor that `trusted_proxies` and `client_ip_header` describe.
    pub fn client_ip(&self) -> Result<ClientIp, BuildError> {
        let trusted = TrustedProxies::new(&self.trusted_proxies)
            .map_err(|e| BuildError::Invalid(format!("trusted_proxies: {e}")))?;
        let mut client_ip = ClientIp::new(trusted);
        if let Some(header) = &self.client_ip_header {
            let header = header
                .parse::<ForwardedHeader>()
                .map_err(|e| BuildError::Invalid(format!("client_ip_header: {e}")))?;
            client_ip = client_ip.header(header);
        }
        Ok(client_ip)
    }

    /// A layer builder with the configured policies and options, on `backend`. The `[access]` lists
    /// are the static ones only (see [`Config::layer`] for the Redis sets).
    pub fn layer_builder<B>(
        &self,
        backend: B,
    ) -> Result<ThrottleLayerBuilder<KeySpec, B>, BuildError> {
        let mut builder = ThrottleLayerBuilder::with_backend(backend);
        if let Some(access) = &self.access {
            builder = self.with_access(builder, access.lists()?)?;
        }
        self.with_options(builder.policies(self.policies()?))
    }

    /// The layer-wide options: header fields, the decision extension, the failure policy.
    fn with_options<B>(
        &self,
        builder: ThrottleLayerBuilder<KeySpec, B>,
    ) -> Result<ThrottleLayerBuilder<KeySpec, B>, BuildError> {
        Ok(builder
            .ratelimit_headers(self.ratelimit_headers)
            .legacy_headers(self.legacy_headers)
            .decision_extension(self.decision_extension)
            .on_backend_error(self.on_error()?))
    }

    fn with_access<B>(
        &self,
        builder: ThrottleLayerBuilder<KeySpec, B>,
        lists: AccessList,
    ) -> Result<ThrottleLayerBuilder<KeySpec, B>, BuildError> {
        Ok(if self.trusted_proxies.is_empty() {
            builder.access_list(lists)
        } else {
            builder.access_list_behind(lists, self.client_ip()?)
        })
    }

    /// The failure policy: `on_error` of a Redis `[backend]`, else the top-level `on_backend_error`.
    pub fn on_error(&self) -> Result<OnBackendError, BuildError> {
        let in_backend = match &self.backend {
            BackendConfig::Redis(redis) => redis.on_error,
            BackendConfig::Memory { .. } => None,
        };
        match (self.on_backend_error, in_backend) {
            (Some(top), Some(backend)) if top != backend => Err(BuildError::Invalid(format!(
                "on_backend_error = {:?} and [backend] on_error = {:?} disagree; set one",
                top.as_str(),
                backend.as_str()
            ))),
            (top, backend) => Ok(backend.or(top).unwrap_or_default()),
        }
    }

    /// The configured layer on the in-memory backend; an error if `[backend]` is not `"memory"`.
    pub fn memory_layer(&self) -> Result<ThrottleLayer<KeySpec, MemoryBackend>, BuildError> {
        self.layer_builder(self.memory_backend()?)?.build()
    }

    fn memory_backend(&self) -> Result<MemoryBackend, BuildError> {
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

    /// The configured backend, memory or Redis (connected), and the layer on it.
    ///
    /// Errors name the setting at fault, or say why Redis could not be reached.
    #[cfg(feature = "redis")]
    pub async fn layer(
        &self,
    ) -> Result<ThrottleLayer<KeySpec, ConfiguredBackend>, Box<dyn std::error::Error + Send + Sync>>
    {
        let policies = self.policies()?;
        let backend = match &self.backend {
            BackendConfig::Memory { .. } => ConfiguredBackend::Memory(self.memory_backend()?),
            BackendConfig::Redis(redis) => ConfiguredBackend::Redis(redis.connect().await?),
        };
        // Distinct limited clients are counted where the limits live.
        let offenders = match &self.backend {
            BackendConfig::Memory { .. } => Offenders::in_memory(),
            BackendConfig::Redis(redis) => redis.offenders().await?,
        };
        let mut builder = self
            .with_options(ThrottleLayerBuilder::with_backend(backend).policies(policies))?
            .count_offenders(offenders);
        if let Some(access) = &self.access {
            let lists = access.lists()?;
            if let Some(sets) = &access.redis_sets {
                let BackendConfig::Redis(redis) = &self.backend else {
                    return Err("[access] redis_sets needs [backend] kind = \"redis\"".into());
                };
                let mut sync = crate::access::RedisAccessSync::new(sets.clone());
                if let Some(every) = access.redis_refresh {
                    sync = sync.every(every);
                }
                redis.spawn_access_sync(sync, &lists).await?;
            }
            builder = self.with_access(builder, lists)?;
        }
        Ok(builder.build()?)
    }
}

#[cfg(feature = "redis")]
enum ExtraConnection {
    Single(redis::aio::ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

/// The backend a [`Config`] names: memory or Redis, one type for both.
#[cfg(feature = "redis")]
#[derive(Clone, Debug)]
pub enum ConfiguredBackend {
    /// `kind = "memory"`.
    Memory(MemoryBackend),
    /// `kind = "redis"`.
    Redis(crate::RedisBackend),
}

#[cfg(feature = "redis")]
impl crate::Backend for ConfiguredBackend {
    type Future = ConfiguredFuture;

    fn check(&self, limit: &crate::Limit, key: &crate::Key, quantity: u64) -> Self::Future {
        match self {
            // Decided here and now: the layer sees a ready future and skips the pending path.
            ConfiguredBackend::Memory(memory) => {
                ConfiguredFuture(FutureKind::Ready(Some(memory.decide(limit, key, quantity))))
            }
            ConfiguredBackend::Redis(redis) => {
                ConfiguredFuture(FutureKind::Redis(redis.check(limit, key, quantity)))
            }
        }
    }

    fn validate(&self, limit: &crate::Limit) -> Result<(), BuildError> {
        match self {
            ConfiguredBackend::Memory(memory) => memory.validate(limit),
            ConfiguredBackend::Redis(redis) => redis.validate(limit),
        }
    }

    fn keeps_penalties(&self) -> bool {
        match self {
            ConfiguredBackend::Memory(memory) => memory.keeps_penalties(),
            ConfiguredBackend::Redis(redis) => redis.keeps_penalties(),
        }
    }

    fn check_all(
        &self,
        limits: &[crate::Limit],
        key: &crate::Key,
        quantity: u64,
    ) -> crate::StackFuture {
        match self {
            ConfiguredBackend::Memory(memory) => memory.check_all(limits, key, quantity),
            ConfiguredBackend::Redis(redis) => redis.check_all(limits, key, quantity),
        }
    }

    fn validate_all(&self, limits: &[crate::Limit]) -> Result<(), BuildError> {
        match self {
            ConfiguredBackend::Memory(memory) => memory.validate_all(limits),
            ConfiguredBackend::Redis(redis) => redis.validate_all(limits),
        }
    }

    fn release(&self, limit: &crate::Limit, key: &crate::Key, quantity: u64, lease: u64) {
        match self {
            ConfiguredBackend::Memory(memory) => memory.release(limit, key, quantity, lease),
            ConfiguredBackend::Redis(redis) => redis.release(limit, key, quantity, lease),
        }
    }
}

/// The future of [`ConfiguredBackend`]: ready at once for memory, Redis's answer otherwise.
#[cfg(feature = "redis")]
pub struct ConfiguredFuture(FutureKind);

#[cfg(feature = "redis")]
enum FutureKind {
    Ready(Option<Result<crate::Decision, crate::BackendError>>),
    Redis(crate::RedisFuture),
}

#[cfg(feature = "redis")]
impl fmt::Debug for ConfiguredFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            FutureKind::Ready(_) => "ConfiguredFuture(ready)",
            FutureKind::Redis(_) => "ConfiguredFuture(redis)",
        })
    }
}

#[cfg(feature = "redis")]
impl std::future::Future for ConfiguredFuture {
    type Output = Result<crate::Decision, crate::BackendError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.get_mut().0 {
            FutureKind::Ready(result) => std::task::Poll::Ready(
                result
                    .take()
                    .expect("ConfiguredFuture polled after completion"),
            ),
            FutureKind::Redis(future) => future.as_mut().poll(cx),
        }
    }
}

impl RouteConfig {
    /// The policy this route describes, with no trusted proxies (`client-ip` is the peer address).
    pub fn policy(&self) -> Result<Policy<KeySpec>, BuildError> {
        self.policy_behind(&ClientIp::default())
    }

    fn policy_behind(&self, client_ip: &ClientIp) -> Result<Policy<KeySpec>, BuildError> {
        let invalid = |what: String| BuildError::Invalid(format!("policy {:?}: {what}", self.name));
        let mut key = self.key.clone();
        if let KeySpec::ClientIp(ip) = &mut key {
            *ip = client_ip.clone();
        }
        match (&mut key, self.ipv6_prefix) {
            (KeySpec::PeerIp(ip), Some(prefix)) => {
                *ip = PeerIp::new()
                    .with_ipv6_prefix(prefix)
                    .map_err(|e| invalid(e.to_string()))?;
            }
            (KeySpec::ClientIp(ip), Some(prefix)) => {
                *ip = ip
                    .clone()
                    .with_ipv6_prefix(prefix)
                    .map_err(|e| invalid(e.to_string()))?;
            }
            (_, Some(_)) => {
                return Err(invalid(
                    "ipv6_prefix only applies to key = \"ip\" or \"client-ip\"".into(),
                ))
            }
            _ => {}
        }
        let algorithm: Algorithm = match &self.algorithm {
            Some(a) => a.parse().map_err(invalid)?,
            None => Algorithm::Gcra,
        };
        let quotas = quotas_of(
            algorithm,
            self.count,
            self.period,
            self.max_burst,
            self.quotas.as_deref(),
        )
        .map_err(invalid)?;
        let mut builder = Policy::builder(self.name.clone())
            .quotas(quotas)
            .algorithm(algorithm)
            .key(key)
            .cost(self.cost.unwrap_or(1));
        match (self.mode.as_deref(), self.max_delay) {
            (None | Some("enforce"), None) => {}
            (Some("dry-run"), None) => builder = builder.dry_run(true),
            (Some("delay"), Some(max_delay)) => builder = builder.delay(max_delay),
            (Some("delay"), None) => {
                return Err(invalid(
                    "mode = \"delay\" needs max_delay, such as \"2s\"".into(),
                ))
            }
            (None | Some("enforce" | "dry-run"), Some(_)) => {
                return Err(invalid(
                    "max_delay is only used with mode = \"delay\"".into(),
                ))
            }
            (Some(other), _) => {
                return Err(invalid(format!(
                    "mode {other:?} is not \"enforce\", \"dry-run\" or \"delay\""
                )))
            }
        }
        if let Some(lease) = self.lease {
            builder = builder.lease(lease);
        }
        for (name, tier) in self.tiers.iter().flatten() {
            let quotas = quotas_of(
                algorithm,
                tier.count,
                tier.period,
                tier.max_burst,
                tier.quotas.as_deref(),
            )
            .map_err(|why| invalid(format!("tier {name:?}: {why}")))?;
            builder = builder.tier(name.clone(), quotas);
        }
        if let Some(header) = &self.tier_header {
            builder = builder.tier_header(header.clone());
        }
        if let Some(path) = &self.path {
            builder = builder.route(path.clone());
        }
        if let Some(methods) = &self.methods {
            let methods = methods
                .iter()
                .map(|m| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| invalid(format!("method {m:?} is not a valid method")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            builder = builder.methods(methods);
        }
        if let Some(p) = &self.penalty {
            let penalty =
                Penalty::new(p.after, p.within, p.ban).map_err(|e| invalid(e.to_string()))?;
            builder = builder.penalty(penalty);
        }
        builder = builder.on_missing_key(match self.on_missing_key.as_deref() {
            None | Some("reject") => MissingKey::Reject(StatusCode::BAD_REQUEST),
            Some("allow") => MissingKey::Allow,
            Some(other) => {
                return Err(invalid(format!(
                    "on_missing_key {other:?} is not \"reject\" or \"allow\""
                )))
            }
        });
        builder.build()
    }
}

fn key_spec<'de, D: Deserializer<'de>>(d: D) -> Result<KeySpec, D::Error> {
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "duration {s:?}: {e} (write e.g. \"60s\", \"1m\", \"500ms\")"
        ))
    })
}

fn on_backend_error<'de, D: Deserializer<'de>>(d: D) -> Result<OnBackendError, D::Error> {
    match String::deserialize(d)?.as_str() {
        "allow" => Ok(OnBackendError::Allow),
        "deny" => Ok(OnBackendError::Deny),
        "local" => Ok(OnBackendError::Local),
        other => Err(serde::de::Error::custom(format!(
            "on_backend_error {other:?} is not \"allow\", \"deny\" or \"local\""
        ))),
    }
}

fn some_on_backend_error<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<OnBackendError>, D::Error> {
    on_backend_error(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_clear() {
        let err = |text: &str| match Config::from_toml(text) {
            Err(e) => e.to_string(),
            Ok(c) => c.memory_layer().unwrap_err().to_string(),
        };
        let route = "[[route]]\nname = \"r\"\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n";
        assert!(err(&format!("{route}colour = 1")).contains("unknown field `colour`"));
        assert!(err(&route.replace("\"ip\"", "\"cookie\"")).contains("is not one of"));
        assert!(err(&route.replace("\"1s\"", "\"soon\"")).contains("duration \"soon\""));
        assert!(err(&route.replace("\"1s\"", "\"0s\"")).contains("quota period"));
        assert!(err(&format!("{route}methods = [\"GE T\"]")).contains("not a valid method"));
        assert!(err(&format!("{route}ipv6_prefix = 200")).contains("ipv6_prefix 200"));
        assert!(err(&format!("{route}{}", route.replace("5", "6"))).contains("appears twice"));
        assert!(err("[backend]\nkind = \"memcached\"").contains("memcached"));
        assert!(err(&format!(
            "[backend]\nkind = \"memory\"\nmax_keys = 0\n{route}"
        ))
        .contains("max_keys"));
        assert!(err("").contains("at least one policy"));
    }
}

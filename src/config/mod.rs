//! Per-route policies from TOML (feature `config`). The guide's
//! [configuration reference](crate::guide::configuration) documents every key.
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
//!
//! Inside: `schema.rs`, the file's tables ([`RouteConfig`], [`BackendConfig`], ...) as serde
//! types; `policies.rs`, a [`Policy`] per route and the access lists; `backend.rs`, `[backend]`
//! turned into a backend (with the feature `redis`, `ConfiguredBackend` holds either kind); and
//! here, [`Config`], which ties them into a layer.

mod backend;
mod logging;
mod metered;
mod options;
mod policies;
mod reload;
mod schema;

use std::fmt;
use std::net::SocketAddr;

use serde::Deserialize;

#[cfg(feature = "redis")]
pub use crate::backend::configured::{BackendHealth, ConfiguredBackend, ConfiguredFuture};
pub use crate::backend::memory::state_file::AsMemory;
pub use logging::{LoggingConfig, RedactKeys};
pub use schema::{
    AccessConfig, BackendConfig, BudgetConfig, BudgetTuning, EstimateConfig, MeteredConfig,
    OverloadConfig, PartitionConfig, PenaltyConfig, QuotaConfig, RedisConfig, RouteConfig,
    TierConfig, WhenConfig,
};

use crate::access::AccessList;
use crate::backend::MemoryBackend;
use crate::error::BuildError;
use crate::failure::OnBackendError;
use crate::key::{ClientIp, ForwardedHeader, KeySpec, TrustedProxies};
use crate::middleware::{ThrottleLayer, ThrottleLayerBuilder};
#[cfg(feature = "redis")]
use crate::offenders::Offenders;
use crate::policy::Policy;

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Where a server should listen (used by the example server).
    pub listen: Option<SocketAddr>,
    /// The backend.
    #[serde(default)]
    pub backend: BackendConfig,
    /// Send `RateLimit-Policy` / `RateLimit` (default true).
    #[serde(default = "schema::yes")]
    pub ratelimit_headers: bool,
    /// Send `X-RateLimit-*` (default false).
    #[serde(default)]
    pub legacy_headers: bool,
    /// Insert a `PolicyDecision` into every admitted request for handlers to read (default false;
    /// dry-run and delay-mode routes always do).
    #[serde(default)]
    pub decision_extension: bool,
    /// `"allow"` (the default when unset), `"deny"` or `"local"`: what to do when the backend fails.
    #[serde(default, deserialize_with = "schema::some_on_backend_error")]
    pub on_backend_error: Option<OnBackendError>,
    /// Networks of the proxies whose forwarding header is believed, for `key = "client-ip"`:
    /// CIDRs (`"10.0.0.0/8"`, `"::1/128"`) or addresses.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// The header those proxies set: `"x-forwarded-for"` (default), `"forwarded"`, `"x-real-ip"`,
    /// `"cf-connecting-ip"`, `"true-client-ip"` or `"fly-client-ip"`.
    pub client_ip_header: Option<String>,
    /// Allow and deny lists.
    pub access: Option<AccessConfig>,
    /// The overload gate: an adaptive limit on the requests in flight.
    pub overload: Option<OverloadConfig>,
    /// How keys appear in log events.
    pub logging: Option<LoggingConfig>,
    /// The `[admin]` table, for the server that runs the layer (the example server reads its admin
    /// token from it). The library checks nothing in it, but that a reload leaves it alone.
    pub admin: Option<toml::Table>,
    /// The `[server]` table, for the server that runs the layer (the example server reads its
    /// listener's limits from it). The library checks nothing in it, but that a reload leaves it
    /// alone.
    pub server: Option<toml::Table>,
    /// The policies, tried in order; the first whose path and methods match decides.
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteConfig>,
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
    /// are the static ones only (see `Config::layer`, feature `redis`, for the Redis sets).
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

    /// The layer-wide options.
    fn with_options<B>(
        &self,
        mut builder: ThrottleLayerBuilder<KeySpec, B>,
    ) -> Result<ThrottleLayerBuilder<KeySpec, B>, BuildError> {
        if let Some(logging) = &self.logging {
            builder = match logging.redaction()? {
                (true, Some(secret)) => builder.redact_keys_with(secret),
                (redact, _) => builder.redact_keys(redact),
            };
        }
        if let Some(overload) = &self.overload {
            builder = builder.overload(overload.overload()?);
        }
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
        if self.access.as_ref().is_some_and(|a| a.redis_sets.is_some()) {
            let why = "[access] redis_sets needs [backend] kind = \"redis\"";
            return Err(BuildError::Invalid(why.into()));
        }
        let layer = self.layer_builder(self.memory_backend()?)?.build()?;
        self.restore_state(layer.backend(), &layer.policies())?;
        Ok(layer)
    }

    /// The configured backend, memory or Redis, and the layer on it. Redis starts as `[backend]
    /// connect` says: lazily by default (at once, connecting in the background, requests following
    /// the failure policy until Redis answers), or `"eager"` (connected before this returns).
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
            BackendConfig::Redis(redis) => ConfiguredBackend::Redis(redis.start().await?),
        };
        // Distinct limited clients are counted where the limits live.
        let offenders = match (&self.backend, &backend) {
            (BackendConfig::Redis(redis), ConfiguredBackend::Redis(on)) => redis.offenders(on),
            _ => Offenders::in_memory(),
        };
        let mut builder = self
            .with_options(ThrottleLayerBuilder::with_backend(backend.clone()).policies(policies))?
            .count_offenders(offenders);
        if let Some(access) = &self.access {
            let lists = access.lists()?;
            if let Some(sets) = &access.redis_sets {
                let (BackendConfig::Redis(redis), ConfiguredBackend::Redis(on)) =
                    (&self.backend, &backend)
                else {
                    return Err("[access] redis_sets needs [backend] kind = \"redis\"".into());
                };
                use crate::access::RedisAccessSync;
                let sync = RedisAccessSync::new(sets.clone());
                let sync = schema::set(sync, access.redis_refresh, RedisAccessSync::every);
                redis.spawn_access_sync(on, sync, &lists);
            }
            builder = self.with_access(builder, lists)?;
        }
        let layer = builder.build()?;
        if let ConfiguredBackend::Memory(memory) = layer.backend() {
            self.restore_state(memory, &layer.policies())?;
        }
        Ok(layer)
    }
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
        assert!(err(&format!("{route}methods = [\"PSOT\"]")).contains("did you mean \"POST\"?"));
        assert!(err(&format!("{route}custom_methods = [\"post\"]")).contains("list it in methods"));
        assert!(err(&format!("{route}ipv6_prefix = 200")).contains("ipv6_prefix 200"));
        assert!(err(&format!("{route}ipv4_prefix = 40"))
            .contains("ipv4_prefix 40 is not between 1 and 32"));
        assert!(err(&format!(
            "{}ipv4_prefix = 24\n",
            route.replace("\"ip\"", "\"global\"")
        ))
        .contains("ipv4_prefix only applies to key = \"ip\""));
        assert!(err(&format!("{route}{}", route.replace("5", "6"))).contains("appears twice"));
        assert!(err("[backend]\nkind = \"memcached\"").contains("memcached"));
        let refresh = "[access]\nredis_sets = \"acl\"\nredis_refresh = \"1ms\"\n";
        let config = Config::from_toml(&format!("{refresh}{route}")).unwrap();
        let why = config
            .access
            .as_ref()
            .unwrap()
            .lists()
            .unwrap_err()
            .to_string();
        assert!(why.contains("redis_refresh is at least 10ms"), "{why}");
        assert!(err(&format!(
            "[backend]\nkind = \"memory\"\nmax_keys = 0\n{route}"
        ))
        .contains("max_keys"));
        assert!(err("").contains("at least one policy"));
    }
}

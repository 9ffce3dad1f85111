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

use crate::key::{KeySpec, PeerIp};
use crate::{
    BuildError, MemoryBackend, MissingKey, OnBackendError, Policy, Quota, ThrottleLayer,
    ThrottleLayerBuilder,
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
    /// `"allow"` (default) or `"deny"`: what to do when the backend fails.
    #[serde(default, deserialize_with = "on_backend_error")]
    pub on_backend_error: OnBackendError,
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
        }
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
    /// `"ip"`, `"global"` or `"header:<name>"`.
    #[serde(deserialize_with = "key_spec")]
    pub key: KeySpec,
    /// For `key = "ip"`: group IPv6 peers by this prefix (default 64).
    #[serde(default)]
    pub ipv6_prefix: Option<u8>,
    /// `CL.THROTTLE`'s max_burst (the limit is max_burst + 1); default count - 1.
    #[serde(default)]
    pub max_burst: Option<u64>,
    /// Requests per period.
    pub count: u64,
    /// The period, such as `"60s"`, `"1m"`, `"500ms"`, `"1day"`.
    #[serde(deserialize_with = "duration")]
    pub period: Duration,
    /// Units each request costs (default 1).
    #[serde(default)]
    pub cost: Option<u64>,
    /// `"reject"` (400, the default) or `"allow"`: requests without a key.
    #[serde(default)]
    pub on_missing_key: Option<String>,
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
        self.routes.iter().map(RouteConfig::policy).collect()
    }

    /// A layer builder with the configured policies and options, on `backend`.
    pub fn layer_builder<B>(
        &self,
        backend: B,
    ) -> Result<ThrottleLayerBuilder<KeySpec, B>, BuildError> {
        Ok(ThrottleLayerBuilder::with_backend(backend)
            .policies(self.policies()?)
            .ratelimit_headers(self.ratelimit_headers)
            .legacy_headers(self.legacy_headers)
            .on_backend_error(self.on_backend_error))
    }

    /// The configured layer on the in-memory backend.
    pub fn memory_layer(&self) -> Result<ThrottleLayer<KeySpec, MemoryBackend>, BuildError> {
        let BackendConfig::Memory { max_keys } = &self.backend;
        let mut backend = MemoryBackend::builder();
        if let Some(max_keys) = max_keys {
            backend = backend.max_keys(*max_keys);
        }
        self.layer_builder(backend.build()?)?.build()
    }
}

impl RouteConfig {
    /// The policy this route describes.
    pub fn policy(&self) -> Result<Policy<KeySpec>, BuildError> {
        let invalid = |what: String| BuildError::Invalid(format!("policy {:?}: {what}", self.name));
        let mut key = self.key.clone();
        match (&mut key, self.ipv6_prefix) {
            (KeySpec::PeerIp(ip), Some(prefix)) => {
                *ip = PeerIp::new()
                    .with_ipv6_prefix(prefix)
                    .map_err(|e| invalid(e.to_string()))?;
            }
            (_, Some(_)) => return Err(invalid("ipv6_prefix only applies to key = \"ip\"".into())),
            _ => {}
        }
        let mut quota = Quota::per_period(self.count, self.period);
        if let Some(max_burst) = self.max_burst {
            quota = quota.with_max_burst(max_burst);
        }
        let mut builder = Policy::builder(self.name.clone())
            .quota(quota)
            .key(key)
            .cost(self.cost.unwrap_or(1));
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

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "period {s:?}: {e} (write e.g. \"60s\", \"1m\", \"500ms\")"
        ))
    })
}

fn on_backend_error<'de, D: Deserializer<'de>>(d: D) -> Result<OnBackendError, D::Error> {
    match String::deserialize(d)?.as_str() {
        "allow" => Ok(OnBackendError::Allow),
        "deny" => Ok(OnBackendError::Deny),
        other => Err(serde::de::Error::custom(format!(
            "on_backend_error {other:?} is not \"allow\" or \"deny\""
        ))),
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
        assert!(err(&route.replace("\"1s\"", "\"soon\"")).contains("period \"soon\""));
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

//! The `[admin]` and `[server]` tables of the configuration file: the example server's own settings,
//! not the layer's. The library keeps them as tables for the server that runs it
//! ([`Config::admin`], [`Config::server`]) and refuses a reload that changes them; this file reads
//! them, once, at start-up.

use std::time::Duration;

use serde::{Deserialize, Deserializer};
use tower_throttle::config::Config;
use tower_throttle::BuildError;

/// The `[admin]` table: how the admin listener is guarded.
///
/// ```toml
/// [admin]
/// token_env = "THROTTLE_ADMIN_TOKEN"   # every admin request needs `Authorization: Bearer <token>`
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AdminConfig {
    /// The environment variable holding the admin token (the token itself never goes in the file).
    #[serde(default)]
    pub token_env: Option<String>,
}

/// The shortest admin token accepted: a short one can be guessed.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

impl AdminConfig {
    /// The token named by `token_env`: `None` without `token_env`, an error when the variable is
    /// unset, not UTF-8, or shorter than [`MIN_ADMIN_TOKEN_LEN`] bytes.
    pub fn token(&self) -> Result<Option<String>, BuildError> {
        self.token_env
            .as_deref()
            .map(|name| admin_token_from_env(name, "[admin] token_env"))
            .transpose()
    }
}

/// The admin token in the environment variable `name`; errors name `setting` (the TOML key or the
/// command-line flag that named the variable).
pub fn admin_token_from_env(name: &str, setting: &str) -> Result<String, BuildError> {
    let invalid = |why: String| BuildError::Invalid(format!("{setting} {name:?}: {why}"));
    let token = std::env::var(name).map_err(|e| match e {
        std::env::VarError::NotPresent => invalid("the environment variable is not set".into()),
        std::env::VarError::NotUnicode(_) => invalid("the value is not UTF-8".into()),
    })?;
    let token = token.trim();
    if token.len() < MIN_ADMIN_TOKEN_LEN {
        return Err(invalid(format!(
            "the token is {} bytes; at least {MIN_ADMIN_TOKEN_LEN} are needed",
            token.len()
        )));
    }
    Ok(token.to_owned())
}

/// The `[server]` table: how the server's listener holds against slow and numerous clients.
///
/// ```toml
/// [server]
/// header_read_timeout = "5s"   # close a connection whose request head has not arrived by then
/// max_connections = 10000      # open connections at most; more wait to be accepted
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ServerConfig {
    /// How long a client may take to send a request head (default 5 s).
    #[serde(deserialize_with = "some_duration")]
    pub header_read_timeout: Option<Duration>,
    /// The most connections open at once (default 10,000); beyond, new connections wait in the
    /// kernel's accept queue until one closes.
    pub max_connections: Option<usize>,
}

impl ServerConfig {
    /// The default `header_read_timeout`.
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default `max_connections`.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

    /// `header_read_timeout`, checked (more than zero, at most an hour: hyper adds it to the
    /// clock, which a larger one overflows, on every connection), or the default.
    pub fn header_read_timeout(&self) -> Result<Duration, BuildError> {
        match self.header_read_timeout {
            Some(d) if d.is_zero() || d > Duration::from_secs(3600) => Err(BuildError::Invalid(
                "[server] header_read_timeout must be more than 0s and at most 1h".into(),
            )),
            Some(d) => Ok(d),
            None => Ok(Self::DEFAULT_HEADER_READ_TIMEOUT),
        }
    }

    /// The largest `max_connections` accepted (far beyond what a process's file descriptors allow).
    pub const MAX_MAX_CONNECTIONS: usize = 10_000_000;

    /// `max_connections`, checked (1 to [`MAX_MAX_CONNECTIONS`](Self::MAX_MAX_CONNECTIONS)), or
    /// the default.
    pub fn max_connections(&self) -> Result<usize, BuildError> {
        match self.max_connections {
            Some(n) if n == 0 || n > Self::MAX_MAX_CONNECTIONS => {
                Err(BuildError::Invalid(format!(
                    "[server] max_connections = {n}: give 1 to {}",
                    Self::MAX_MAX_CONNECTIONS
                )))
            }
            Some(n) => Ok(n),
            None => Ok(Self::DEFAULT_MAX_CONNECTIONS),
        }
    }
}

impl AdminConfig {
    /// The configuration's `[admin]` table (the defaults without one); an unknown key is an error
    /// that names it.
    pub fn of(config: &Config) -> Result<Self, String> {
        table(config.admin.as_ref(), "[admin]")
    }
}

impl ServerConfig {
    /// The configuration's `[server]` table (the defaults without one); an unknown key is an error
    /// that names it.
    pub fn of(config: &Config) -> Result<Self, String> {
        table(config.server.as_ref(), "[server]")
    }
}

fn table<T: Default + for<'de> Deserialize<'de>>(
    table: Option<&toml::Table>,
    name: &str,
) -> Result<T, String> {
    table.map_or_else(
        || Ok(T::default()),
        |t| {
            toml::Value::Table(t.clone())
                .try_into()
                .map_err(|e: toml::de::Error| format!("{name}: {}", e.message()))
        },
    )
}

/// A duration written as `"5s"`, `"1m"`, `"500ms"`.
fn some_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map(Some).map_err(|e| {
        serde::de::Error::custom(format!(
            "duration {s:?}: {e} (write e.g. \"60s\", \"1m\", \"500ms\")"
        ))
    })
}

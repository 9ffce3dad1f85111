//! Errors.

use std::fmt;

use crate::quota::QuotaError;

/// Invalid configuration, reported when a policy, layer or backend is built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// A policy name is not usable.
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A policy's quota is invalid.
    Quota {
        /// The policy.
        policy: String,
        /// Why.
        source: QuotaError,
    },
    /// A policy's cost is zero, or larger than its limit (such requests could never pass).
    Cost {
        /// The policy.
        policy: String,
        /// The cost.
        cost: u64,
        /// The policy's limit (`max_burst + 1`).
        limit: u64,
    },
    /// Anything else, described.
    Invalid(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::InvalidName { name, reason } => {
                write!(f, "policy name {name:?} {reason}")
            }
            BuildError::Quota { policy, source } => write!(f, "policy {policy:?}: {source}"),
            BuildError::Cost {
                policy,
                cost: 0,
                ..
            } => write!(f, "policy {policy:?}: cost must be at least 1"),
            BuildError::Cost {
                policy,
                cost,
                limit,
            } => write!(
                f,
                "policy {policy:?}: cost {cost} exceeds the limit {limit} (max_burst + 1), so no request could pass"
            ),
            BuildError::Invalid(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Quota { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A backend could not decide (Redis unreachable, a timeout, a protocol error).
#[derive(Debug)]
pub struct BackendError {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
    /// Nothing reached the backend (a circuit failing fast, no connection): the call took nothing.
    unsent: bool,
}

impl BackendError {
    /// An error described by `message`.
    pub fn new(message: impl Into<String>) -> Self {
        BackendError {
            message: message.into(),
            source: None,
            unsent: false,
        }
    }

    /// An error described by `message`, caused by `source`.
    pub fn with_source(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        BackendError {
            message: message.into(),
            source: Some(source.into()),
            unsent: false,
        }
    }

    /// This error, of a call that never reached the backend (`unsent`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn unsent_if(mut self, unsent: bool) -> Self {
        self.unsent = unsent;
        self
    }

    /// Whether the call never reached the backend (so took nothing there).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn unsent(&self) -> bool {
        self.unsent
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {source}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// `scheme://user:password@host` becomes `scheme://user:***@host`, for messages and logs.
#[cfg_attr(not(any(feature = "redis", feature = "config")), allow(dead_code))]
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = url[scheme + 3..at].split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Each URL redacted ([`redact_url`]), joined with `", "`.
#[cfg_attr(not(any(feature = "redis", feature = "config")), allow(dead_code))]
pub(crate) fn redact_urls<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> String {
    let urls: Vec<String> = urls.into_iter().map(|u| redact_url(u.as_ref())).collect();
    urls.join(", ")
}

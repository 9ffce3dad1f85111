//! The `[logging]` table: how keys appear in the layer's log events.

use serde::Deserialize;

use crate::error::BuildError;
use crate::observe::RedactionSecret;

/// The `[logging]` table.
///
/// ```toml
/// [logging]
/// redact_keys = { secret_env = "THROTTLE_KEY_SECRET" }   # or true: a secret per layer
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LoggingConfig {
    /// `true` (pseudonyms under a secret made up per layer), `false` (the default: keys as they
    /// are), or `{ secret_env = "VAR" }`: pseudonyms under the secret in the environment variable
    /// `VAR` (at least 16 bytes), the same in every process that shares it.
    pub redact_keys: Option<RedactKeys>,
}

/// `redact_keys` of `[logging]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(
    untagged,
    deny_unknown_fields,
    expecting = "true, false or { secret_env = \"VAR\" }"
)]
#[non_exhaustive]
pub enum RedactKeys {
    /// `true` or `false`.
    Flag(bool),
    /// `{ secret_env = "VAR" }`.
    Secret {
        /// The environment variable holding the secret.
        secret_env: String,
    },
}

impl LoggingConfig {
    /// Whether keys are redacted, and under which secret (`None`: one made up per layer).
    pub(super) fn redaction(&self) -> Result<(bool, Option<RedactionSecret>), BuildError> {
        match &self.redact_keys {
            None | Some(RedactKeys::Flag(false)) => Ok((false, None)),
            Some(RedactKeys::Flag(true)) => Ok((true, None)),
            Some(RedactKeys::Secret { secret_env }) => RedactionSecret::from_env(secret_env)
                .map(|secret| (true, Some(secret)))
                .map_err(|e| BuildError::Invalid(format!("[logging] redact_keys: {e}"))),
        }
    }
}

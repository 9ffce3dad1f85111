//! What the verdict is configured with: the layer-wide [`Settings`] (hooks, headers, failure
//! policy).

use std::sync::Arc;

use crate::headers::HeaderOptions;
use crate::near_limit::NearLimitHook;
use crate::offenders::Offenders;
use crate::overload::Gate;
use crate::refusal::respond::Refusals;

/// What to do when the backend cannot decide (an error or, for remote backends, a timeout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnBackendError {
    /// Let the request through (fail open). The default: a limiter outage should not be an API outage.
    #[default]
    Allow,
    /// Reject with `503 Service Unavailable` and `Retry-After: 1` (fail closed).
    Deny,
    /// Decide in this process instead: an in-memory limiter with each policy's own quota takes over
    /// until the backend answers again. Each process then enforces the quota on its own, so the fleet
    /// admits up to `processes × quota` while the backend is down, which is usually the right trade
    /// between an outage and no limit at all.
    #[cfg(feature = "memory")]
    Local,
}

impl OnBackendError {
    /// `"allow"`, `"deny"` or `"local"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnBackendError::Allow => "allow",
            OnBackendError::Deny => "deny",
            #[cfg(feature = "memory")]
            OnBackendError::Local => "local",
        }
    }
}

/// The layer-wide settings of the verdict, as the builder collects them (cloned for the judge of
/// each policy table a reload builds).
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) headers: HeaderOptions,
    /// How refusals are answered (custom functions, gRPC, the `on_limited` hook).
    pub(crate) refusals: Refusals,
    pub(crate) on_error: OnBackendError,
    pub(crate) redact_keys: bool,
    /// The secret of redacted keys (a random one per layer when `redact_keys` has none).
    pub(crate) redaction_secret: Option<crate::observe::RedactionSecret>,
    pub(crate) on_near_limit: Option<Arc<NearLimitHook>>,
    pub(crate) offenders: Option<Offenders>,
    /// Every admitted request gets a [`PolicyDecision`].
    pub(crate) decision_extension: bool,
    /// The layer's overload gate, one for the layer's life (reloads keep it).
    pub(crate) overload: Option<Arc<Gate>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            headers: HeaderOptions {
                ratelimit: true,
                legacy: false,
                openai: false,
            },
            refusals: Refusals::default(),
            on_error: OnBackendError::default(),
            redact_keys: false,
            redaction_secret: None,
            on_near_limit: None,
            offenders: None,
            decision_extension: false,
            overload: None,
        }
    }
}

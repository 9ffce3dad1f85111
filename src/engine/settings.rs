//! What the verdict is configured with: the layer-wide [`Settings`] (hooks, headers, failure
//! policy) and each tier's [`CompiledTier`]. Below the verdict, the policy and per-customer quotas,
//! which all build or read them.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response};

use crate::headers::{self, HeaderOptions};
use crate::limit::{Algorithm, Limit};
use crate::observe::Limited;
use crate::offenders::Offenders;
use crate::refusal::{Refusal, Rejected};

pub(crate) type RejectionFn = dyn Fn(&Rejected<'_>) -> Response<Bytes> + Send + Sync;
pub(crate) type RefusalFn = dyn Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync;
pub(crate) type LimitedHook = dyn Fn(&Limited<'_>) + Send + Sync;

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
    pub(crate) rejection: Option<Arc<RejectionFn>>,
    /// Answers every refusal (429, 400, 403, 503) when set.
    pub(crate) refusal: Option<Arc<RefusalFn>>,
    pub(crate) on_error: OnBackendError,
    pub(crate) redact_keys: bool,
    /// The secret of redacted keys (a random one per layer when `redact_keys` has none).
    pub(crate) redaction_secret: Option<crate::observe::RedactionSecret>,
    pub(crate) on_limited: Option<Arc<LimitedHook>>,
    pub(crate) offenders: Option<Offenders>,
    /// Refusals (400, 403, 503) as gRPC trailers-only responses.
    pub(crate) grpc: bool,
    /// Every admitted request gets a [`PolicyDecision`].
    pub(crate) decision_extension: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            headers: HeaderOptions {
                ratelimit: true,
                legacy: false,
                openai: false,
            },
            rejection: None,
            refusal: None,
            on_error: OnBackendError::default(),
            redact_keys: false,
            redaction_secret: None,
            on_limited: None,
            offenders: None,
            grpc: false,
            decision_extension: false,
        }
    }
}

/// What the verdict needs of one tier's limits (or of a per-customer quota's).
pub(crate) struct CompiledTier {
    pub(crate) name: Option<Arc<str>>,
    pub(crate) limits: Box<[Limit]>,
    pub(crate) names: Box<[Arc<str>]>,
    pub(crate) policy_field: HeaderValue,
    /// `limits[0].max_cost()`, for the decision of a ban.
    pub(crate) limit_value: u64,
    pub(crate) concurrency: bool,
    /// Whether a limit of the tier is in delay mode (most are not: no request waits).
    pub(crate) delays: bool,
}

impl CompiledTier {
    /// The rules of `limits` (at least one), the tier called `name` (`None`: the default).
    pub(crate) fn of(name: Option<Arc<str>>, limits: &[Limit]) -> Self {
        CompiledTier {
            name,
            limits: limits.into(),
            names: limits.iter().map(|l| l.name().into()).collect(),
            policy_field: headers::policy_field(limits),
            limit_value: limits[0].max_cost(),
            concurrency: limits[0].algorithm() == Algorithm::Concurrency,
            delays: limits.iter().any(|limit| limit.delay().is_some()),
        }
    }
}

//! What the verdict is configured with: the layer-wide [`Settings`].

use std::sync::Arc;

use crate::failure::OnBackendError;
use crate::headers::HeaderOptions;
use crate::near_limit::NearLimitHook;
use crate::offenders::Offenders;
use crate::overload::Gate;
use crate::refusal::respond::Refusals;

/// As the builder collects them; cloned for the judge of each policy table a reload builds.
#[derive(Clone, Default)]
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

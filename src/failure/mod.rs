//! The failure policy: what the layer does when its backend cannot decide ([`OnBackendError`]) —
//! let the request through, refuse it with a `503`, or decide in this process with the same quotas
//! ([`Fallback`]'s local limiter, which a reload keeps). The engine asks it only after a failure,
//! and turns its answer into a verdict.

pub(crate) mod verdict;

use crate::backend::{Adjustment, Charges};

#[cfg(feature = "memory")]
use crate::backend::{Backend, Decisions, MemoryBackend};
#[cfg(feature = "memory")]
use crate::decision::Decision;
#[cfg(feature = "memory")]
use crate::{key::Key, limit::Limit};

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

/// The failure policy of a layer's table, with the local limiter of [`OnBackendError::Local`].
pub(crate) struct Fallback {
    pub(crate) on_error: OnBackendError,
    #[cfg(feature = "memory")]
    local: Option<MemoryBackend>,
}

/// What the failure policy makes of a request its backend could not decide.
pub(crate) enum Fallen {
    /// Through, unlimited.
    Allow,
    /// Refused with a `503` (where the policy enforces refusals).
    Deny,
    /// Decided by the local limiter: a decision for each limit.
    #[cfg(feature = "memory")]
    Decided(Vec<Decision>),
}

impl Fallback {
    pub(crate) fn new(on_error: OnBackendError) -> Self {
        Fallback {
            on_error,
            #[cfg(feature = "memory")]
            local: (on_error == OnBackendError::Local).then(MemoryBackend::new),
        }
    }

    /// What the failure policy makes of a request whose `charges` the backend could not decide:
    /// the local limiter decides the same charges (each limit under its own key, a metered
    /// estimate as reserved), and holds what the layer's policies allow: a limit it cannot take
    /// lets the request through.
    pub(crate) fn decide(&self, charges: Charges<'_>) -> Fallen {
        #[cfg(not(feature = "memory"))]
        let _ = charges;
        match self.on_error {
            OnBackendError::Allow => Fallen::Allow,
            OnBackendError::Deny => Fallen::Deny,
            #[cfg(feature = "memory")]
            OnBackendError::Local => {
                let Some(local) = &self.local else {
                    return Fallen::Allow;
                };
                match local.decide_charges(charges) {
                    Ok(decisions) => Fallen::Decided(Decisions::into_vec(decisions)),
                    Err(_) => Fallen::Allow,
                }
            }
        }
    }

    /// Gives back a concurrency slot the local limiter gave under `limit` (and `lease`).
    #[cfg(feature = "memory")]
    pub(crate) fn release(&self, limit: &Limit, key: &Key, cost: u64, lease: u64) {
        let release = Adjustment::Release { lease };
        self.adjust(Charges::one(limit, key, cost), release);
    }

    /// Adjusts what the local limiter took for a request it decided in the backend's stead (a
    /// refund, a settlement, a slot given back).
    pub(crate) fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
        #[cfg(feature = "memory")]
        if let Some(local) = &self.local {
            local.adjust(charges, adjustment);
        }
        #[cfg(not(feature = "memory"))]
        let _ = (charges, adjustment);
    }

    /// Whether the local limiter decides what the backend could not.
    pub(crate) fn is_local(&self) -> bool {
        #[cfg(feature = "memory")]
        return self.local.is_some();
        #[cfg(not(feature = "memory"))]
        false
    }

    /// Takes over the local limiter of `previous` (the failure policy of the table a reload
    /// replaces): it keeps its keys, as it keys them by limit name, as backends do.
    pub(crate) fn carry_over(&mut self, previous: &Fallback) {
        #[cfg(feature = "memory")]
        if let (Some(local), Some(old)) = (&mut self.local, &previous.local) {
            *local = old.clone();
        }
        #[cfg(not(feature = "memory"))]
        let _ = previous;
    }

    /// Forgets what the local limiter counted of `charges` (their keys under their limits).
    pub(crate) fn forget(&self, charges: Charges<'_>) {
        #[cfg(feature = "memory")]
        if let Some(local) = &self.local {
            let _ = local.reset_now(charges);
        }
        #[cfg(not(feature = "memory"))]
        let _ = charges;
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use super::*;
    use crate::quota::Quota;

    /// Whether `fallback` lets one more request of `key` through under `limits`.
    fn admits(fallback: &Fallback, limits: &[Limit], key: &Key) -> bool {
        match fallback.decide(Charges::stack(limits, key, 1)) {
            Fallen::Decided(decisions) => decisions.iter().all(|d| d.allowed),
            Fallen::Allow => true,
            Fallen::Deny => false,
        }
    }

    #[test]
    fn the_local_limiter_keeps_its_keys_across_a_reload_until_they_are_forgotten() {
        let limits = [Limit::new("api", Quota::per_hour(1)).unwrap()];
        let key = Key::from("k");
        let before = Fallback::new(OnBackendError::Local);
        assert!(admits(&before, &limits, &key));
        assert!(!admits(&before, &limits, &key), "one an hour");
        let mut after = Fallback::new(OnBackendError::Local);
        after.carry_over(&before);
        assert!(
            !admits(&after, &limits, &key),
            "the reloaded table kept the count"
        );
        after.forget(Charges::stack(&limits, &key, 0));
        assert!(admits(&after, &limits, &key), "a reset key starts afresh");
    }
}

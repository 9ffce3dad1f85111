//! [`ConcurrencySlot`]: a request's place under a concurrency limit, given back exactly once.
//!
//! A leaf of the middleware, like tower's `OwnedSemaphorePermit`: the response future holds the slot
//! until the inner service answers, then the response body holds it until the body ends. It knows
//! nothing of either; it only knows how to give itself back.

use std::fmt;

use crate::overload::InFlight;

/// Who gave a request its concurrency slot, and so who takes it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotOwner {
    /// The layer's backend; `lease` names the slot on backends that hand out leases (Redis).
    Backend { lease: u64 },
    /// The in-memory limiter that decides while the backend fails ([`OnBackendError::Local`]).
    ///
    /// [`OnBackendError::Local`]: crate::engine::verdict::OnBackendError::Local
    #[cfg(feature = "memory")]
    Local,
}

/// Gives a slot back to its owner; made by the service, which knows the policy, tier and key.
pub(crate) type Release = Box<dyn FnOnce(SlotOwner) + Send + Sync>;

/// A held concurrency slot; dropping it gives the slot back. However the request ends — a finished or
/// failed body, a response dropped unread, a cancelled request, an error from the service — exactly one
/// drop happens, so the slot is given back exactly once.
pub(crate) struct ConcurrencySlot(Option<(Release, SlotOwner)>);

impl ConcurrencySlot {
    pub(crate) fn new(release: Release, owner: SlotOwner) -> Self {
        ConcurrencySlot(Some((release, owner)))
    }
}

impl ConcurrencySlot {
    /// A place that is not a slot: the request's count in flight through the overload gate, which
    /// ends as a slot is given back.
    pub(crate) fn ending(in_flight: InFlight) -> Self {
        let release: Release = Box::new(move |_| drop(in_flight));
        ConcurrencySlot::new(release, SlotOwner::Backend { lease: 0 })
    }

    /// This slot, whose giving back also ends the request's count in flight.
    pub(crate) fn and_ending(mut self, in_flight: InFlight) -> Self {
        match self.0.take() {
            Some((release, owner)) => {
                let both: Release = Box::new(move |owner| {
                    release(owner);
                    drop(in_flight);
                });
                ConcurrencySlot::new(both, owner)
            }
            None => ConcurrencySlot::ending(in_flight),
        }
    }
}

impl Drop for ConcurrencySlot {
    fn drop(&mut self) {
        if let Some((release, owner)) = self.0.take() {
            release(owner);
        }
    }
}

impl fmt::Debug for ConcurrencySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConcurrencySlot")
    }
}

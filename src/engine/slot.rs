//! [`ConcurrencySlot`]: a request's places — under a concurrency limit, in flight through the
//! overload gate — each given back exactly once.
//!
//! A leaf, like tower's `OwnedSemaphorePermit`: the response future holds the slot until the inner
//! service answers, then the response body until the body ends. It knows nothing of either.

use crate::overload::InFlight;

/// Who gave a request its concurrency slot, and so who takes it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotOwner {
    /// The layer's backend; `lease` names the slot on backends that hand out leases (Redis).
    Backend { lease: u64 },
    /// The in-memory limiter that decides while the backend fails ([`OnBackendError::Local`]).
    ///
    /// [`OnBackendError::Local`]: crate::OnBackendError::Local
    #[cfg(feature = "memory")]
    Local { lease: u64 },
}

/// Gives a slot back to its owner; made by the service, which knows the policy, tier and key.
pub(crate) type Release = Box<dyn FnOnce(SlotOwner) + Send + Sync>;

/// What a request holds until its response ends.
enum Held {
    Slot(Release, SlotOwner),
    /// Its count in flight through the overload gate.
    Counted(InFlight),
    /// Both (boxed: rare, and the others stay as small as a slot alone).
    Both(Box<(Release, SlotOwner, InFlight)>),
}

/// Dropping it gives back what it holds. However the request ends — a finished or failed body, a
/// response dropped unread, a cancelled request, an error from the service — one drop happens.
pub(crate) struct ConcurrencySlot(Option<Held>);

impl ConcurrencySlot {
    pub(crate) fn new(release: Release, owner: SlotOwner) -> Self {
        ConcurrencySlot(Some(Held::Slot(release, owner)))
    }

    /// `slot` (if any), also holding the request's count in flight through the overload gate.
    pub(crate) fn and_counting(slot: Option<Self>, in_flight: InFlight) -> Self {
        match slot.and_then(|mut slot| slot.0.take()) {
            Some(Held::Slot(release, owner)) => {
                ConcurrencySlot(Some(Held::Both(Box::new((release, owner, in_flight)))))
            }
            // A request is counted once: another count is ended at once (never expected).
            Some(held) => {
                in_flight.forget();
                ConcurrencySlot(Some(held))
            }
            None => ConcurrencySlot(Some(Held::Counted(in_flight))),
        }
    }

    /// Called after delay mode's wait: the gate measures the service's latency from here.
    pub(crate) fn called(&mut self) {
        if let Some(in_flight) = self.in_flight() {
            in_flight.called();
        }
    }

    /// The service answered: the count in flight, if any, ends as a sample of its latency (until
    /// then, one dropped is a client that went away, no sample).
    pub(crate) fn answered(&mut self) {
        if let Some(in_flight) = self.in_flight() {
            in_flight.answered();
        }
    }

    /// The service or the body failed: the count in flight, if any, ends as a dropped request.
    pub(crate) fn failed(&mut self) {
        if let Some(in_flight) = self.in_flight() {
            in_flight.failed();
        }
    }

    fn in_flight(&mut self) -> Option<&mut InFlight> {
        match &mut self.0 {
            Some(Held::Counted(in_flight)) => Some(in_flight),
            Some(Held::Both(both)) => Some(&mut both.2),
            Some(Held::Slot(..)) | None => None,
        }
    }
}

impl Drop for ConcurrencySlot {
    fn drop(&mut self) {
        match self.0.take() {
            Some(Held::Slot(release, owner)) => release(owner),
            // The count in flight ends after the slot is given back.
            Some(Held::Both(both)) => {
                let (release, owner, _in_flight) = *both;
                release(owner);
            }
            Some(Held::Counted(_)) | None => {}
        }
    }
}

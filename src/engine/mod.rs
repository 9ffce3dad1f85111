//! The decision engine: what the layer decides for a request, apart from tower's plumbing
//! (`middleware/`). Each file uses only files listed after it (`scripts/import_cycles.py` checks it):
//!
//! * [`extended`]: the async path — the same steps with an async key, a per-customer quota or a
//!   metered limit awaited between them.
//! * [`steps`]: each step of a request, written once, in the order the request meets them.
//! * [`shared`]: what every service of a layer shares.
//! * [`table`]: the policy table in force, and the one function that checks and builds it (for
//!   the builder and for a reload).
//! * `rollout`: a policy's shadow limits, asked beside its own, and the refusals a shadow limit or
//!   a staged policy only counts.
//! * [`verdict`]: what a decision means for the request (admit, delay, reject, ban), with no I/O;
//!   `judge_state`: the judge's in-process state (penalty boxes, local limiter) for the handle.
//! * [`admitted`]: what an admitted request carries.
//! * [`settings`]: the layer-wide settings, hooks and failure policy.
//! * [`slot`]: a concurrency slot, given back exactly once.

pub(crate) mod admitted;
pub(crate) mod extended;
mod judge_state;
mod rollout;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod slot;
pub(crate) mod steps;
pub(crate) mod table;
pub(crate) mod verdict;

pub use settings::OnBackendError;

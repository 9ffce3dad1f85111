//! The decision engine: what the layer decides for a request, apart from tower's plumbing
//! (`middleware/`), around one [`CompiledPolicy`](crate::policy::CompiledPolicy) per policy of the
//! table in force. An admitted or refused request of the synchronous path passes through
//! `middleware/service.rs` (which runs the steps), [`steps`] (each step once), [`verdict`] (what
//! the backend's answer means), `middleware/future.rs` and `middleware/body.rs` (carrying the
//! verdict out), besides [`in_force`] and [`table`] (the table read) and, for a 429, `refuse`; the
//! extended path adds [`extended`]. The backend is asked in one shape, a list of
//! [`Charges`](crate::backend::Charges), whatever the policy. Each file uses only files listed
//! after it (`scripts/import_cycles.py` checks it):
//!
//! * [`extended`]: the async path — the same steps with an async key, a per-customer quota or a
//!   metered limit awaited between them, and what settles such a request after its response.
//! * [`steps`]: each step of a request, written once, in the order the request meets them.
//! * [`shared`]: what every service of a layer shares.
//! * [`in_force`]: the policy table in force, read by every request, replaced by a reload.
//! * [`table`]: the policy table in force, and the one function that checks and compiles it (for
//!   the builder and for a reload).
//! * `judge_state`: the in-process state (penalty boxes, local limiter) for the handle.
//! * `refuse`: the refusals' responses (429, 503, 403, the missing key's 4xx).
//! * [`verdict`]: what a decision means for the request (admit, delay, reject, ban), with no I/O.
//! * [`settings`]: the layer-wide settings, hooks and failure policy.
//! * [`slot`]: a concurrency slot, given back exactly once.

pub(crate) mod extended;
pub(crate) mod in_force;
mod judge_state;
mod refuse;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod slot;
pub(crate) mod steps;
pub(crate) mod table;
pub(crate) mod verdict;

pub use settings::OnBackendError;

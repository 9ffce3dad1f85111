//! The decision engine: what the layer decides for a request, apart from tower's plumbing
//! (`middleware/`), around one [`CompiledPolicy`](crate::policy::CompiledPolicy) per policy of the
//! table in force. An admitted in-memory request runs code of `middleware/service.rs`, [`verdict`],
//! `middleware/future.rs`, `middleware/body.rs` and the fields' `headers.rs` and
//! `header_block.rs`, and a few instructions each of [`steps`], [`shared`], `observe.rs`,
//! `decision.rs`, `limit.rs`, `policy/spec.rs` and `overrides/cache.rs` (inlined accessors;
//! callgrind on a build with line tables:
//! `FILES=1 bash scripts/profile_pass.sh throttle-mem-pass throttle-mem-deny`). A 429 adds
//! `refusal/respond.rs`, the counting in `observe.rs` and [`steps`]; the extended path
//! [`extended`], `policy/extras.rs` and the feature's own file (`outcome.rs` for a count-only
//! limit); an overload gate `overload/` and [`slot`]; a failed backend `failure/`. The backend is asked in one shape, a
//! list of [`Charges`](crate::backend::Charges), whatever the policy. Each file uses only files
//! listed after it (`scripts/import_cycles.py` checks it):
//!
//! * [`extended`]: the steps of a policy with per-request features, synchronous until the first
//!   step that must wait, and what settles such a request after its response.
//! * [`steps`]: each step of a request, written once, in the order the request meets them.
//! * [`shared`]: what every service of a layer shares: the backend, the policy table in force.
//! * [`table`]: the policy table, compiled for the backend (for the builder and for a reload).
//! * [`verdict`]: what a decision means for the request (admit, delay, reject, ban), with no I/O.
//! * [`settings`]: the layer-wide settings of the judge (fields, refusals, hooks, failure policy).
//! * [`slot`]: a concurrency slot, given back exactly once.

pub(crate) mod extended;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod slot;
pub(crate) mod steps;
pub(crate) mod table;
pub(crate) mod verdict;

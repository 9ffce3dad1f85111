//! The decision engine: what the layer decides for a request, apart from tower's plumbing
//! (`middleware/`), around one [`CompiledPolicy`](crate::policy::CompiledPolicy) per policy of the
//! table in force (the table's build-time checks live in `policy/table.rs`, a stream message's
//! check in `handle/message.rs`). An admitted in-memory request runs code of (callgrind on a build
//! with line tables: `FILES=1 bash scripts/profile_pass.sh throttle-mem-pass throttle-mem-deny`)
//! `middleware/service.rs`, [`steps`], [`verdict`], `middleware/future.rs`, `middleware/body.rs`
//! and, a few instructions each, [`shared`] (the table in force), `observe.rs` (its report) and
//! `policy/spec.rs` (the route it matches); its fields `headers.rs` and `header_block.rs`; and
//! one-line accessors of `policy.rs`, `policy/compiled.rs`, `overrides/cache.rs`, `limit.rs` and
//! `decision.rs`. A 429 adds `refusal/respond.rs` (its answer); the extended path adds [`extended`]
//! and the feature's own file (`outcome.rs` for counting by outcome, `key/ahead.rs` for an async
//! key or a key from the body); an overload gate adds `overload/gate.rs` and `overload/limit.rs`
//! (admission, release, the sample) and [`slot`] (the count the response holds); a failed backend
//! adds `failure/` (the failure policy and its verdict). The backend is asked in one shape, a list of
//! [`Charges`](crate::backend::Charges), whatever the policy. Each file uses only files listed
//! after it (`scripts/import_cycles.py` checks it):
//!
//! * [`extended`]: the steps of a policy with per-request features, synchronous until the first
//!   step that must wait (a body, an async key, a resolver, shadow limits, a remote backend), and
//!   what settles such a request after its response.
//! * [`steps`]: each step of a request, written once, in the order the request meets them.
//! * [`shared`]: what every service of a layer shares: the backend, the policy table in force.
//! * [`table`]: the policy table, compiled for the backend (for the builder and for a reload).
//! * [`verdict`]: what a decision means for the request (admit, delay, reject, ban), with no I/O.
//! * [`settings`]: the layer-wide settings the judge reads (fields, refusals, hooks, the failure
//!   policy chosen).
//! * [`slot`]: a concurrency slot, given back exactly once.

pub(crate) mod extended;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod slot;
pub(crate) mod steps;
pub(crate) mod table;
pub(crate) mod verdict;

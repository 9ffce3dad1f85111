//! The decision engine: what the layer decides for a request, apart from tower's plumbing
//! (`middleware/`), around one [`CompiledPolicy`](crate::policy::CompiledPolicy) per policy of the
//! table in force (the table's build-time checks live in `policy/table.rs`, a stream message's
//! check in `handle/message.rs`). An admitted in-memory request passes through (callgrind on a
//! build with line tables) `middleware/service.rs`, [`steps`], [`verdict`], `middleware/future.rs`,
//! `middleware/body.rs`, [`shared`] (the table in force) and `observe.rs` (its report), its fields through
//! `headers.rs` and `header_block.rs`, and one-line accessors of `policy.rs`, `policy/spec.rs`,
//! `policy/compiled.rs` and `overrides/cache.rs`; a 429 adds `refusal/respond.rs`; the extended path adds
//! [`extended`] (and the feature's own file: `outcome.rs` for counting by outcome); an overload
//! gate adds `overload/gate.rs` and `overload/limit.rs` (admission, release, the sample) and
//! [`slot`] (the count the response holds). The backend is asked in one shape, a list of
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
//! * [`settings`]: the layer-wide settings, hooks and failure policy.
//! * [`slot`]: a concurrency slot, given back exactly once.

pub(crate) mod extended;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod slot;
pub(crate) mod steps;
pub(crate) mod table;
pub(crate) mod verdict;

//! The tower middleware, laid out as a request travels through it. Each file uses only files
//! listed after it (`scripts/import_cycles.py` checks it):
//!
//! * [`builder`]: [`ThrottleLayerBuilder`], the layer's options.
//! * [`layer`]: [`ThrottleLayer`], configuration only (and its [`ThrottleHandle`](crate::ops::ThrottleHandle)).
//! * [`service`]: [`Throttle`]: the request's steps in order, deciding at once when the backend
//!   answers at once; `extended`: the same steps with async ones between them (an async key, a
//!   per-customer quota, counting by outcome).
//! * [`future`]: [`ResponseFuture`], which waits for a remote decision and carries the verdict out.
//! * [`steps`]: each step of a request, written once, for both paths and the response future.
//! * [`shared`]: what every service of a layer shares.
//! * [`table`]: the policy table in force, and the one function that checks and builds it (for
//!   the builder and for a reload).
//! * `rollout`: a policy's shadow limits, asked beside its own, and the refusals a shadow limit or
//!   a staged policy only counts.
//! * [`verdict`]: what a decision means for the request (admit, delay, reject, ban), with no I/O;
//!   `judge_state`: the judge's in-process state (penalty boxes, local limiter) for the handle.
//! * [`admitted`]: what an admitted request carries.
//! * [`settings`]: the layer-wide settings, hooks, failure policy and each tier's rules.
//! * [`body`]: [`ThrottleBody`](body::ThrottleBody), the response body, which holds a concurrency slot to its end.
//! * [`slot`]: a concurrency slot, given back exactly once.

pub(crate) mod admitted;
pub mod body;
pub(crate) mod builder;
mod extended;
pub(crate) mod future;
mod judge_state;
pub(crate) mod layer;
mod rollout;
pub(crate) mod service;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod slot;
pub(crate) mod steps;
pub(crate) mod table;
pub(crate) mod verdict;

pub use builder::ThrottleLayerBuilder;
pub use future::ResponseFuture;
pub use layer::ThrottleLayer;
pub use service::Throttle;
pub use settings::OnBackendError;

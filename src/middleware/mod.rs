//! The tower middleware, laid out as a request travels through it. Dependencies run one way:
//!
//! ```text
//! builder ─▶ layer ─▶ service ─▶ future ─▶ body ─▶ slot
//!                        └──────────┴──▶ verdict ─▶ slot
//! ```
//!
//! * [`builder`]: [`ThrottleLayerBuilder`], and build-time validation.
//! * [`layer`]: [`ThrottleLayer`], configuration only.
//! * [`service`]: [`Throttle`]: policy → key → access lists → ban → backend.
//! * [`verdict`]: what a decision means for the request (admit, delay, reject, ban), with no I/O.
//! * [`future`]: [`ResponseFuture`], which carries the verdict out.
//! * [`body`]: [`ThrottleBody`](body::ThrottleBody), the response body, which holds a concurrency slot to its end.
//! * [`slot`]: a concurrency slot, given back exactly once.

pub(crate) mod admitted;
pub mod body;
pub(crate) mod builder;
mod extended;
pub(crate) mod future;
mod judge_state;
pub(crate) mod layer;
pub(crate) mod service;
pub(crate) mod settings;
pub(crate) mod shared;
pub(crate) mod slot;
pub(crate) mod table;
pub(crate) mod verdict;

pub use builder::ThrottleLayerBuilder;
pub use future::ResponseFuture;
pub use layer::ThrottleLayer;
pub use service::Throttle;
pub use settings::OnBackendError;

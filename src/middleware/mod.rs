//! The tower middleware: the skeleton around the decision engine ([`crate::engine`]), as small as
//! tower-http's. Each file uses only files listed after it (`scripts/import_cycles.py` checks it):
//!
//! * `axum_body` (feature `axum`): [`AxumBody`](axum_body::AxumBody), the layer, service and future
//!   that answer with axum's own body, around those below.
//! * [`builder`]: [`ThrottleLayerBuilder`], the layer's options.
//! * [`layer`]: [`ThrottleLayer`], configuration only (and its [`ThrottleHandle`](crate::ops::ThrottleHandle)).
//! * [`service`]: [`Throttle`]: hands each request to the engine, and carries the verdict out at once
//!   when the backend decided at once.
//! * [`future`]: [`ResponseFuture`], which waits for a remote decision and carries the verdict out.
//! * [`body`]: [`ThrottleBody`](body::ThrottleBody), the response body, which holds a concurrency
//!   slot to its end.

#[cfg(feature = "axum")]
pub(crate) mod axum_body;
pub mod body;
pub(crate) mod builder;
pub(crate) mod future;
pub(crate) mod layer;
pub(crate) mod service;

pub use builder::ThrottleLayerBuilder;
pub use future::ResponseFuture;
pub use layer::ThrottleLayer;
pub use service::Throttle;

//! Rate-limiting [tower](https://docs.rs/tower) middleware for HTTP: a key per request, a GCRA decision with the exact
//! semantics of redis-cell's `CL.THROTTLE`, and `429 Too Many Requests` with `Retry-After` and
//! `RateLimit` fields for requests over the limit.
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{body::Body, routing::post, Router};
//! use http::{Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_throttle::{key::Header, Policy, Quota, ThrottleLayer};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! // Each user may post bursts of 16 replies, then 30 a minute.
//! let reply = Policy::builder("reply")
//!     .quota(Quota::per_minute(30).bursts_of(16))
//!     .key(Header::new("x-user-id"))
//!     .build()
//!     .unwrap();
//! let app = Router::new()
//!     .route("/reply", post(|| async { "replied" }))
//!     .route_layer(ThrottleLayer::new(reply));
//!
//! let request = || Request::post("/reply").header("x-user-id", "42").body(Body::empty()).unwrap();
//! for _ in 0..16 {
//!     assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), StatusCode::OK);
//! }
//! let limited = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["retry-after"], "2");
//! assert_eq!(limited.headers()["ratelimit-policy"], r#""reply";q=16;w=32"#);
//! # });
//! ```
//!
//! The [`guide`] has the long form, one page per topic: keys and proxies, algorithms and quotas,
//! policies and the TOML schema, Redis, operator controls, observability, performance, migrating.
//!
//! # A request's life
//!
//! 1. **Policy**: [`Throttle`] (the service a [`ThrottleLayer`] makes) picks the first [`Policy`]
//!    whose route and methods match; no match, no limit.
//! 2. **Key**: the policy's [`key::KeyExtractor`] names what the request counts against (a missing
//!    key is answered as [`MissingKey`] says). [`access`] lists may allow or deny the client or key
//!    outright, and a key in a [`Penalty`] box is answered at once.
//! 3. **Backend**: [`Backend::check`] (or [`Backend::check_all`] for stacked quotas) asks the
//!    backend for each limit's [`Decision`]: the pure algorithms ([`gcra`], [`window`]) in memory,
//!    their Lua twins or `CL.THROTTLE` on Redis.
//! 4. **Verdict**: the layer turns the decisions into a verdict — admit, admit after a delay
//!    ([`PolicyBuilder::delay`]), reject (`429`), ban — or, when the backend failed, what
//!    [`OnBackendError`] says.
//! 5. **Response**: an admitted request calls the inner service and its response gets the
//!    [`headers`] fields (and the request a [`PolicyDecision`] where asked); a refused one gets a
//!    `429` with `Retry-After` (or `403`, `400`, `503`; [`grpc`] status codes for gRPC clients).
//!
//! # Vocabulary
//!
//! Each word means one thing, and each thing has one name:
//!
//! | name | what it means |
//! |---|---|
//! | [`Quota`] | validated parameters: `count` per `period`, `max_burst` |
//! | [`Limit`] | a named quota with its algorithm: what a backend *checks* a request against |
//! | stack | several quotas of one policy ([`PolicyBuilder::quotas`]), checked together |
//! | [`Decision`] | one limit's answer for one request (`CL.THROTTLE`'s reply) |
//! | [`LimitDecision`] | one limit's [`Decision`] with the limit's name, within a [`PolicyDecision`] |
//! | [`PolicyDecision`] | one policy's decision for a request: the combined [`Decision`] and each limit's, as a handler sees it |
//! | [`RequestDecisions`] | every layer's [`PolicyDecision`] for one request, outermost first |
//! | verdict | what the layer does with a request: admit, delay, refuse, ban |
//! | refusal | a request the layer answers itself (`429`, `400`, `403`, `503`): observed by [`ThrottleLayerBuilder::on_limited`] (limits and bans), shaped by [`ThrottleLayerBuilder::refusal_response`] ([`headers::Refusal`]) |
//! | [`Tier`] | a request's tier label; a policy's tier has its own quota or stack |
//! | [`handle::TierKeyState`] | a key's state under one tier's limits, as [`ThrottleHandle`] reads it |
//! | slot | a request's place under a concurrency limit ([`Algorithm::Concurrency`]) |
//! | lease | a concurrency slot's hold on Redis, renewed while its request runs, freed on release ([`Limit::with_lease`], [`Decision::lease`]) |
//! | [`Budget`] slice | units of a hot key's budget a process takes from Redis and admits locally for a [`slice_ttl`](Budget::slice_ttl) |
//! | penalty, ban | [`Penalty`]: a key over its limit too often is refused for a time |
//! | metered limit | a limit whose cost is known after the response ([`PolicyBuilder::metered`]): it *reserves* an [`Estimate`] at admission and is *settled* ([`Backend::settle`]) to what the [`Meter`] says when the response ends |
//! | debt | a metered key charged past its burst: refused until paid back, at most [`Limit::max_debt`] units |
//! | dry run, shadow limit, stage | refusals only counted: a whole policy's ([`PolicyBuilder::dry_run`]), one extra limit's ([`PolicyBuilder::shadow`]), or those of keys outside an enforced share ([`PolicyBuilder::enforce_fraction`]) |
//!
//! # Module map
//!
//! | where | what |
//! |---|---|
//! | `quota.rs`, `limit.rs`, `budget.rs` | [`Quota`] (validated parameters), [`Limit`] (a named quota with its algorithm); the one stack rule ([`MAX_STACKED_QUOTAS`]); a sliced [`Budget`] |
//! | `gcra.rs`, `window.rs`, `decision.rs`, `clock.rs`, `timer.rs` | the pure algorithms (no I/O, time passed in), their [`Decision`], the [`clock`]s; tokio timers without a panic |
//! | `key/` | [`Key`] (`value.rs`), the [`key`] extractors (`extract.rs`, `sources.rs`, `client_ip.rs` with trusted proxies, `async_key.rs`), [`key::KeySpec`] and [`key::Composite`] (`spec.rs`) |
//! | `policy.rs`, `route.rs`, `methods.rs`, `per_customer.rs`, `outcome.rs`, `meter.rs`, `rollout.rs` | [`Policy`]: limits (tiers, stacks), key, route, methods, cost, modes; route patterns matched as axum matches them; per-customer quotas; counting by outcome; metered limits ([`Meter`], [`Estimate`]: a cost settled after the response); shadow limits and staged enforcement |
//! | `policy_decision.rs` | [`PolicyDecision`], [`LimitDecision`], [`RequestDecisions`]: what handlers see |
//! | `access.rs`, `penalty.rs`, `offenders.rs`, `top/` | allow/deny lists, the penalty box, distinct-offender counts, the top limited keys |
//! | `backend/` | the [`Backend`] trait (`api.rs`); `memory/` (GCRA table, general store: `general.rs` → `general_shard.rs` → `entries.rs`), `redis/` (layered from `server.rs` up to `check.rs`, see its docs), the configured backend |
//! | `middleware/` | the tower middleware, one way: `builder` → `layer` → `service` → `extended` → `future` → `steps` (each step of a request, once) → `shared` → `table` → `rollout` → `verdict` → `admitted` → `settings` → `body` → `slot` |
//! | `handle.rs` | [`ThrottleHandle`]: peek at and reset keys, reload the policies of a running layer |
//! | `headers.rs`, `grpc.rs` | what the layer answers: `RateLimit` fields, problem bodies, gRPC status |
//! | `observe.rs` | every `tracing` event and metric of a request's life, and the [`Limited`] hook's view |
//! | `config/` (feature `config`) | TOML: the schema, building policies, wiring the backend, reloading a running layer |
//!
//! Imports go one way: no module imports one that imports it back, directly or around a circle,
//! and no file holds over 500 lines of code without saying why; `scripts/import_cycles.py` checks
//! both in CI.
//! Inside the crate, modules import from the module that defines a name; the re-exports at the root
//! are for users.
//!
//! # Pieces
//!
//! * [`Quota`]: `CL.THROTTLE`'s `max_burst`, `count`, `period`; [`Limit`]: a named quota.
//! * [`gcra::decide`]: the algorithm as a pure function; [`Decision`]: its answer. [`Algorithm`]
//!   and [`window`]: the sliding log, fixed and sliding windows, and the concurrency limit.
//! * [`key`]: what a request counts against ([`key::PeerIp`], [`key::Header`], [`key::Extension`],
//!   [`key::Global`], [`key::QueryParam`], [`key::Cookie`], [`key::PathParam`], [`key::Composite`],
//!   closures).
//! * [`Policy`]: a limit (or [stacked quotas](PolicyBuilder::quotas), or [tiers](Tier)), a key, and
//!   optionally a route, methods and a cost; [delay](PolicyBuilder::delay) and
//!   [dry-run](PolicyBuilder::dry_run) modes; what was decided reaches the handler as a
//!   [`PolicyDecision`] (every layer's, in [`RequestDecisions`]).
//! * Per request: a customer's own quota ([`PolicyBuilder::quota_from`], a [`QuotaResolver`]),
//!   an async key ([`key::AsyncKey`]), counting only some responses
//!   ([`PolicyBuilder::count_only`], [`PolicyBuilder::refund_on`]).
//! * [`Backend`]: where state lives; `MemoryBackend` for one process, `RedisBackend` (feature
//!   `redis`) for many: `CL.THROTTLE` or an equivalent Lua script, one server or a Cluster.
//! * [`ThrottleLayer`] / [`Throttle`]: the tower middleware; [`ThrottleHandle`]: peek, reset and
//!   hot reload while it runs; [`headers`]: what it answers;
//!   [`OnBackendError`]: allow, deny (503) or decide locally when the backend fails; [`grpc`]: the
//!   same answers for gRPC clients (`RESOURCE_EXHAUSTED` with retry metadata);
//!   [`ThrottleLayerBuilder::refusal_response`]: your own answer to every refusal
//!   ([`headers::Refusal`]); [`RedactionSecret`]: keys in logs as HMAC pseudonyms.
//! * `config` (feature `config`): per-route policies from TOML.
//!
//! # Features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `memory` | yes | `MemoryBackend` |
//! | `axum` | no | peer addresses from `ConnectInfo` (needed by `PeerIp` / `ClientIp` in axum), routes from `MatchedPath` |
//! | `config` | no | serde + TOML configuration |
//! | `redis` | no | `RedisBackend`: `CL.THROTTLE` or Lua, one server or a Cluster, TLS |
//! | `metrics` | no | counters and a latency histogram per policy through the `metrics` facade |
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod access;
pub mod backend;
mod budget;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
mod decision;
mod error;
pub mod gcra;
pub mod grpc;
pub mod guide;
mod handle;
mod header_block;
pub mod headers;
pub mod key;
mod limit;
mod meter;
mod methods;
mod middleware;
mod observe;
mod offenders;
mod or_default;
mod outcome;
mod penalty;
mod per_customer;
pub mod policy;
mod policy_decision;
mod quota;
pub mod refusal;
mod rollout;
mod route;
mod timer;
mod top;
pub mod window;

pub use backend::Backend;
#[cfg(feature = "memory")]
pub use backend::MemoryBackend;
pub use decision::Decision;
pub use error::BuildError;
pub use key::Key;
pub use limit::{Algorithm, Limit};
pub use meter::{Estimate, Meter};
pub use middleware::body;
pub use middleware::{
    OnBackendError, ResponseFuture, Throttle, ThrottleLayer, ThrottleLayerBuilder,
};
pub use policy::{Policy, PolicyBuilder};
pub use quota::Quota;

/// The Redis backend (feature `redis`): [`RedisBackend`] shares every decision between the
/// processes of a fleet, on one server, a Cluster or behind Sentinel, with `CL.THROTTLE` or an
/// equivalent Lua script; its builder, health and memory reports.
///
/// The [Redis guide](crate::guide::redis) tells how to run it.
#[cfg(feature = "redis")]
pub mod redis {
    pub use crate::backend::redis::{
        CircuitState, MemoryReport, RedisBackend, RedisBackendBuilder, RedisFuture, RedisHealth,
        RedisMode, RedisNodeHealth,
    };
}

/// Operating a running layer: the [`ThrottleHandle`] (peek at and reset keys, reload the policies,
/// who is limited most), allow and deny lists ([`AccessList`]), distinct offenders
/// ([`Offenders`]), and keys in logs as pseudonyms ([`RedactionSecret`]).
///
/// The [operations guide](crate::guide::operations) shows them together.
pub mod ops {
    #[cfg(feature = "redis")]
    pub use crate::access::RedisAccessSync;
    pub use crate::access::{Access, AccessList};
    pub use crate::handle::{
        HandleError, KeyFromText, Policies, PolicyState, ThrottleHandle, TierKeyState,
    };
    pub use crate::observe::RedactionSecret;
    pub use crate::offenders::{OffenderCounts, Offenders};
    /// How many limited keys the top list tracks per policy.
    pub use crate::top::CAPACITY as TOP_CAPACITY;
    /// The minutes the top list counts over.
    pub use crate::top::WINDOW_MINUTES as TOP_WINDOW_MINUTES;
    pub use crate::top::{TopKey, MAX_TOP};
}

/// The README's code blocks, compiled (and run, where they can be) as doc tests.
#[cfg(all(doctest, feature = "axum", feature = "redis"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

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
//! 2. **Key**: the policy's [key extractor](key::KeyExtractor) names what the request counts
//!    against (a missing key is answered as [`MissingKey`](policy::MissingKey) says). Allow and
//!    deny [lists](ops::AccessList) may decide outright, and a key in a
//!    [`Penalty`](policy::Penalty) box is answered at once.
//! 3. **Backend**: the [`Backend`] gives each [`Limit`]'s [`Decision`]: the pure algorithms
//!    ([`gcra`], [`window`]) in memory, their Lua twins or `CL.THROTTLE` on [`redis`].
//! 4. **Verdict**: admit, admit after a delay ([`PolicyBuilder::delay`]), refuse (`429`), ban — or,
//!    when the backend failed, what [`OnBackendError`] says.
//! 5. **Response**: an admitted request calls the inner service and its response gets the
//!    [`headers`] fields (and the request a [`PolicyDecision`](policy::PolicyDecision) where
//!    asked); a refused one gets a `429` with `Retry-After` (or `403`, `400`, `503`; [`grpc`]
//!    statuses for gRPC clients), shaped by [`refusal`] where you want your own.
//!
//! # Vocabulary
//!
//! Each word means one thing, and each thing has one name. The names at the crate root:
//!
//! | name | what it means |
//! |---|---|
//! | [`ThrottleLayer`] | the tower layer: a table of policies on a backend, attached with `.layer()` |
//! | [`ThrottleLayerBuilder`] | builds a layer: several policies, a shared backend, headers, hooks, the failure policy |
//! | [`Throttle`] | the service a [`ThrottleLayer`] wraps around yours |
//! | [`ResponseFuture`] | the future of a [`Throttle`]'s response |
//! | [`OnBackendError`] | what the layer does when the backend fails: allow, deny (`503`) or decide in memory |
//! | [`Policy`] | which requests a limit applies to (route, methods), what they count against (the key) and what they cost |
//! | [`PolicyBuilder`] | builds a [`Policy`]: quotas, key, route, modes; every mistake is a [`BuildError`] |
//! | [`Quota`] | validated parameters: `count` per `period`, `max_burst` |
//! | [`Limit`] | a named quota with its algorithm: what a backend *checks* a request against |
//! | [`Algorithm`] | how a limit counts: GCRA, sliding log, fixed or sliding window, concurrency |
//! | [`Key`] | what a request is counted against within a policy (an address, a header's value…), shown as [`Key::from_rendered`] reads it back |
//! | [`Decision`] | one limit's answer for one request (`CL.THROTTLE`'s reply) |
//! | [`Backend`] | where key state lives and decisions are made |
//! | [`MemoryBackend`] | the backend of one process (feature `memory`, on by default) |
//! | [`BuildError`] | why a policy, a layer or a backend was refused when built |
//! | [`Meter`] | what a metered limit's response really cost, read when the response ends ([`PolicyBuilder::metered`]) |
//! | [`Estimate`] | what a metered limit reserves at admission, settled to what the [`Meter`] says |
//!
//! And the words of the docs:
//!
//! | word | what it means |
//! |---|---|
//! | stack | several quotas of one policy ([`PolicyBuilder::quotas`]), checked together: a refusal by one charges none |
//! | tier | a plan with its own quota or stack ([`PolicyBuilder::tier`], chosen by a [`policy::Tier`]) |
//! | verdict | what the layer does with a request: admit, delay, refuse, ban |
//! | refusal | a request the layer answers itself (`429`, `400`, `403`, `503`): observed by [`ThrottleLayerBuilder::on_limited`], shaped by [`ThrottleLayerBuilder::refusal_response`] ([`refusal::Refusal`]) |
//! | slot | a request's place under a concurrency limit ([`Algorithm::Concurrency`]) |
//! | overload gate | the layer's adaptive limit on requests in flight, before any quota; a request past it is *shed* ([`overload::Overload`]) |
//! | partition | a share of the overload gate's limit kept for a policy or tier ([`overload::Overload::partition`]) |
//! | lease | a concurrency slot's hold on Redis, renewed while its request runs, freed on release ([`Limit::with_lease`]) |
//! | budget slice | units of a hot key's quota a process takes from Redis and admits locally ([`policy::Budget`]) |
//! | penalty, ban | a key over its limit too often is refused for a time ([`policy::Penalty`]) |
//! | metered limit | a limit whose cost is known after the response: it *reserves* an [`Estimate`] and is *settled* to what the [`Meter`] says |
//! | debt | a metered key charged past its burst: refused until paid back, at most [`Limit::max_debt`] units |
//! | dry run, shadow limit, stage | refusals only counted: a whole policy's ([`PolicyBuilder::dry_run`]), one extra limit's ([`PolicyBuilder::shadow`]), or those of keys outside an enforced share ([`PolicyBuilder::enforce_fraction`]) |
//!
//! # Modules
//!
//! | module | what |
//! |---|---|
//! | [`key`] | the key extractors: the client's address (behind trusted proxies too), headers, query parameters, cookies, route parameters, composites, async keys |
//! | [`policy`] | what a policy is made of besides its quota (tiers, budgets, penalties, per-customer quotas, the answer to a missing key), and what it decided, as a handler reads it |
//! | [`backend`] | the [`Backend`] trait, its futures and [`KeyState`](backend::KeyState); the in-memory backend's builder |
//! | [`redis`] | the Redis backend (feature `redis`): one server, Cluster, Sentinel, TLS; its health |
//! | [`refusal`] | the requests the layer answers itself, for your own answer and for the `on_limited` hook |
//! | [`ops`] | operating a running layer: peek, reset and reload through the handle, who is limited most, offenders, allow and deny lists, keys in logs as pseudonyms |
//! | [`headers`] | the `RateLimit` fields and `Retry-After` the layer writes |
//! | [`grpc`] | the same answers for gRPC clients |
//! | [`body`] | the response body, which holds a concurrency slot to its end |
//! | [`gcra`], [`window`], [`clock`] | the algorithms as pure functions, and the clocks they read |
//! | [`config`] | per-route policies from TOML (feature `config`), hot reload |
//! | [`overload`] | protection from overload: an adaptive limit on requests in flight, partitions with guaranteed shares |
//! | [`guide`] | the long form, one page per topic |
//!
//! Inside `src/`, imports go one way (no module imports one that imports it back, directly or
//! around a circle) and no file holds over 500 lines of code without saying why;
//! `scripts/import_cycles.py` checks both in CI. Modules import from the module that defines a
//! name; the names above are for users.
//!
//! # Features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `memory` | yes | `MemoryBackend` |
//! | `axum` | no | peer addresses from `ConnectInfo` (needed by `PeerIp` / `ClientIp` in axum), routes from `MatchedPath` |
//! | `config` | no | serde + TOML configuration |
//! | `calendar` | no | fixed windows on a time zone's days, ISO weeks or months ([`window::CalendarWindow`]), with `jiff` and its bundled time zone database |
//! | `redis` | no | `RedisBackend`: `CL.THROTTLE` or Lua, one server or a Cluster, TLS |
//! | `metrics` | no | counters and a latency histogram per policy through the `metrics` facade |
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod access;
pub mod backend;
mod backoff;
mod budget;
mod calendar;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
mod decision;
mod engine;
mod error;
mod failure;
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
mod near_limit;
mod observe;
mod offenders;
mod or_default;
mod outcome;
pub mod overload;
mod overrides;
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
pub use failure::OnBackendError;
pub use key::Key;
pub use limit::{Algorithm, Limit};
pub use meter::{Estimate, Meter};
/// The response bodies: [`ThrottleBody`](body::ThrottleBody), which every [`Throttle`] response
/// carries, and [`AxumBody`](body::AxumBody), the layer that answers with axum's own body instead.
pub mod body {
    #[cfg(feature = "axum")]
    pub use crate::middleware::axum_body::AxumBody;
    pub use crate::middleware::body::ThrottleBody;
}
pub use middleware::{ResponseFuture, Throttle, ThrottleLayer, ThrottleLayerBuilder};
pub use policy::{Policy, PolicyBuilder};
pub use quota::Quota;

/// The Redis backend (feature `redis`): [`RedisBackend`](crate::redis::RedisBackend) shares every decision between the
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

/// Operating a running layer: the [`ThrottleHandle`](crate::ops::ThrottleHandle) (peek at and reset keys, reload the policies,
/// who is limited most), allow and deny lists ([`AccessList`](crate::ops::AccessList)), distinct offenders
/// ([`Offenders`](crate::ops::Offenders)), and keys in logs as pseudonyms ([`RedactionSecret`](crate::ops::RedactionSecret)).
///
/// The [operations guide](crate::guide::operations) shows them together.
pub mod ops {
    #[cfg(feature = "redis")]
    pub use crate::access::RedisAccessSync;
    pub use crate::access::{Access, AccessList};
    pub use crate::handle::{
        HandleError, KeyFromText, Policies, PolicyState, ThrottleHandle, TierKeyState,
    };
    pub use crate::near_limit::{NearLimit, NEAR_LIMIT_HEADER};
    pub use crate::observe::RedactionSecret;
    pub use crate::offenders::{OffenderCounts, Offenders};
    pub use crate::overrides::cache::MAX_PATTERNS as MAX_OVERRIDE_PATTERNS;
    pub use crate::overrides::Override;
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

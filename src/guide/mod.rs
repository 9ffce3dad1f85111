//! The guide: one page per topic, each below with its first line as summary. The README is the front
//! page; this is where the details live, rendered on docs.rs.
//!
//! Every Rust block on these pages is a doc test that `cargo test --doc --all-features` compiles and
//! runs (`no_run` where it needs a server; the test suite drives those paths against real ones). The
//! TOML blocks are parsed by the tests named under them.
//!
//! Each page is a Markdown file in `src/guide/` included as the documentation of an empty module, so
//! it reads on GitHub too and its code blocks are doc tests. A page that needs a feature exists only
//! with that feature (docs.rs builds them all): its links and examples then always resolve.
//!
//! # What sets the crate apart
//!
//! - **Exact semantics.** `Quota::cl_throttle(max_burst, count, period)` takes `CL.THROTTLE`'s arguments;
//!   `Quota::per_second(5)` means five a second. Decisions keep nanosecond precision, so 100,000 a second is
//!   an ordinary quota. A unit test replays redis-cell 0.2.2's own test table and gets the same results.
//! - **Honest HTTP.** `Retry-After` is rounded up and is never 0. The fields are Structured Field lists. The
//!   429 body is RFC 9457 `application/problem+json`, and you can replace it with your own function.
//! - **Keeps tower's contract.** The inner service is called only after the request has been admitted, and
//!   it is always the instance that `poll_ready` readied. Rejections are responses, and the service keeps
//!   its inner error type.
//! - **Memory stays bounded.** The in-memory backend evicts keys that have fully refilled by itself, with no
//!   cleanup calls and no background task. It also enforces a cap on live keys, and its behaviour at the
//!   cap is documented.
//! - **Safe keys.** `PeerIp` never reads forwarding headers; `ClientIp` reads them only from trusted
//!   proxies, right to left, so a forged header cannot choose a key. IPv6 clients are grouped by /64.
//!   Long keys are hashed. A request without a key gets a clear 4xx by default (you can let it through
//!   instead), never a 500.
//! - **One limit for many processes.** `RedisBackend` runs `CL.THROTTLE` where the redis-cell module is
//!   loaded and an equivalent atomic Lua script where it is not, on one server or a Redis Cluster, over
//!   TLS if you like. Both paths store the same value, so they agree key for key. A test drives memory,
//!   Lua and `CL.THROTTLE` with the same requests and gets the same decisions.
//! - **Redis trouble is a policy, not an outage.** Each call has a timeout (100 ms by default). On an
//!   error or a timeout the layer lets requests through, answers 503, or hands over to an in-memory
//!   limiter with the same quotas, your choice. While Redis is down, calls fail at once instead of each
//!   waiting for its timeout, and Redis is used again within half a second of coming back. The
//!   failure contract (the page `failure` below, feature `redis`) lists each fault (slow, silent,
//!   torn, reset, refused, frozen, full, failed over, one process cut off) with what the layer
//!   does, how long it takes, what it may over-admit, and the test that proves it.
//!
//! # Adding a page
//!
//! To add a page: write `src/guide/<topic>.md` (a `#` title first, links to public paths such as
//! [`crate::Policy`]) and add one line to the `pages!` list below.

/// Declares each page: a module named `$name` whose documentation is the Markdown file `$file`.
macro_rules! pages {
    ($($(#[$attr:meta])* $name:ident = $file:literal;)*) => {
        $(
            $(#[$attr])*
            #[doc = include_str!($file)]
            pub mod $name {}
        )*
    };
}

pages! {
    #[cfg(feature = "memory")] keys = "keys.md";
    #[cfg(feature = "memory")] algorithms = "algorithms.md";
    #[cfg(feature = "memory")] policies = "policies.md";
    #[cfg(all(feature = "memory", feature = "axum"))] llm_tokens = "llm_tokens.md";
    #[cfg(feature = "config")] configuration = "configuration.md";
    #[cfg(feature = "redis")] redis = "redis.md";
    #[cfg(feature = "redis")] redis_sizing = "redis_sizing.md";
    #[cfg(feature = "redis")] failure = "failure.md";
    #[cfg(feature = "memory")] operations = "operations.md";
    #[cfg(feature = "memory")] observability = "observability.md";
    #[cfg(feature = "memory")] observability_admin = "observability_admin.md";
    #[cfg(feature = "memory")] performance = "performance.md";
    #[cfg(feature = "config")] overload = "overload.md";
    #[cfg(all(feature = "memory", feature = "axum", feature = "redis"))] migrating = "migrating.md";
}

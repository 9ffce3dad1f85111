//! One axum hello-world, served bare or behind one rate limiter, for `scripts/loadtest.sh`.
//!
//! ```text
//! loadtest-server VARIANT [--listen ADDR] [--redis URL] [--workers N]
//! ```
//!
//! Every variant limits per client IP (the TCP peer), on the route `/`. "pass" variants use a quota
//! that the load never reaches; "deny" variants a quota exhausted by the first request (1 an hour,
//! burst 1), so every later request from the one client is answered 429.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{routing::get, Router};

/// A quota the load never reaches: a million a second, bursts of a million.
const PASS_BURST: u64 = 1_000_000;
const PASS_COUNT: u64 = 1_000_000;
const PASS_PERIOD: Duration = Duration::from_secs(1);

const VARIANTS: &[&str] = &[
    "bare",
    "throttle-mem-pass",
    "throttle-mem-deny",
    "throttle-mem-pass-noheaders",
    "throttle-mem-count-only-pass",
    "throttle-mem-overload-pass",
    "throttle-axumbody-pass",
    "throttle-axumbody-deny",
    "throttle-axumbody-pass-noheaders",
    "governor-pass",
    "governor-headers-pass",
    "governor-deny",
    "throttle-lua-pass",
    "throttle-lua-alone-pass",
    "throttle-cell-alone-pass",
    "throttle-lua-lease-pass",
    "throttle-cell-pass",
    "throttle-cell-pass-noheaders",
    "throttle-lua-deny",
    "throttle-lua-deny-nocache",
    "throttle-cell-deny",
    "redis-cell-peer-pass",
    "redis-cell-peer-deny",
    "rate-limiter-peer-pass",
    "rate-limiter-peer-deny",
    "handwritten-cell-pass",
    "handwritten-cell-deny",
];

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

fn pass(variant: &str) -> bool {
    variant.ends_with("-pass")
}

mod throttle {
    use super::*;
    use tower_throttle::key::PeerIp;
    use tower_throttle::redis::{RedisBackend, RedisMode};
    use tower_throttle::{Policy, Quota, ThrottleLayer};

    pub fn quota(pass: bool) -> Quota {
        if pass {
            Quota::cl_throttle(PASS_BURST, PASS_COUNT, PASS_PERIOD)
        } else {
            Quota::cl_throttle(0, 1, Duration::from_secs(3600))
        }
    }

    fn policy(pass: bool) -> Policy<PeerIp> {
        Policy::builder("lt")
            .quota(quota(pass))
            .key(PeerIp::new())
            .build()
            .expect("valid policy")
    }

    pub fn memory(pass: bool) -> Router {
        hello().layer(ThrottleLayer::new(policy(pass)))
    }

    /// The same, without the `RateLimit-Policy` / `RateLimit` fields: what the headers cost.
    pub fn memory_no_headers(pass: bool) -> Router {
        let layer = ThrottleLayer::builder()
            .policy(policy(pass))
            .ratelimit_headers(false)
            .build()
            .expect("valid layer");
        hello().layer(layer)
    }

    /// [`memory`] behind an overload gate that never sheds (its limit far above the load): what
    /// counting every request in flight costs.
    pub fn memory_overload() -> Router {
        let layer = ThrottleLayer::builder()
            .policy(policy(true))
            .overload(tower_throttle::overload::Overload::gradient().limits(10_000, 10_000))
            .build()
            .expect("valid layer");
        hello().layer(layer)
    }

    /// A policy of the extended path (counting by outcome: every response counts), admitted: what
    /// a per-request feature costs over [`memory`].
    pub fn memory_count_only() -> Router {
        let policy = Policy::builder("lt")
            .quota(quota(true))
            .key(PeerIp::new())
            .count_only(|_| true)
            .build()
            .expect("valid policy");
        hello().layer(ThrottleLayer::new(policy))
    }

    /// [`memory`] and [`memory_no_headers`] answering with axum's own body (`axum_body()`), which
    /// axum does not box again.
    pub fn memory_axum_body(pass: bool, fields: bool) -> Router {
        let layer = ThrottleLayer::builder()
            .policy(policy(pass))
            .ratelimit_headers(fields)
            .build()
            .expect("valid layer");
        hello().layer(layer.axum_body())
    }

    /// The backend's timeout: REDIS_TIMEOUT_MS, else the crate's default (a profiler's slow run
    /// needs more).
    fn redis_timeout() -> std::time::Duration {
        let ms = std::env::var("REDIS_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok());
        std::time::Duration::from_millis(ms.unwrap_or(100))
    }

    pub async fn redis(url: &str, mode: RedisMode, pass: bool, deny_cache: bool) -> Router {
        redis_fields(url, mode, pass, deny_cache, true).await
    }

    /// [`redis`], with the `RateLimit` fields on or off.
    pub async fn redis_fields(
        url: &str,
        mode: RedisMode,
        pass: bool,
        deny_cache: bool,
        fields: bool,
    ) -> Router {
        let builder = RedisBackend::builder()
            .url(url)
            .mode(mode)
            .prefix(format!("lt{}", std::process::id()))
            .timeout(redis_timeout());
        let builder = set_deny_cache(builder, deny_cache);
        let backend = builder.connect().await.expect("connect to Redis");
        let layer = ThrottleLayer::builder()
            .backend(backend)
            .policy(policy(pass))
            .ratelimit_headers(fields)
            .build()
            .expect("valid layer");
        hello().layer(layer)
    }

    /// A path with `coalesce(false)`: every check its own script or `CL.THROTTLE` call.
    pub async fn redis_alone(url: &str, mode: RedisMode) -> Router {
        let backend = RedisBackend::builder()
            .url(url)
            .mode(mode)
            .prefix(format!("lt{}", std::process::id()))
            .timeout(redis_timeout())
            .coalesce(false)
            .connect()
            .await
            .expect("connect to Redis");
        let layer = ThrottleLayer::builder()
            .backend(backend)
            .policy(policy(true))
            .build()
            .expect("valid layer");
        hello().layer(layer)
    }

    /// The Lua path with leased budgets (`Budget::new()`: 250 ms leases, slices of up to 1,000).
    pub async fn redis_leased(url: &str) -> Router {
        let backend = RedisBackend::builder()
            .url(url)
            .mode(RedisMode::Lua)
            .prefix(format!("lt{}", std::process::id()))
            .timeout(redis_timeout())
            .connect()
            .await
            .expect("connect to Redis");
        let policy = Policy::builder("lt")
            .quota(quota(true))
            .key(PeerIp::new())
            .budget(tower_throttle::policy::Budget::new())
            .build()
            .expect("valid policy");
        let layer = ThrottleLayer::builder()
            .backend(backend)
            .policy(policy)
            .build()
            .expect("valid layer");
        hello().layer(layer)
    }

    // The deny cache (`RedisBackendBuilder::deny_cache`, on by default).
    fn set_deny_cache(
        builder: tower_throttle::redis::RedisBackendBuilder,
        on: bool,
    ) -> tower_throttle::redis::RedisBackendBuilder {
        builder.deny_cache(on)
    }
}

mod governor_peer {
    use super::*;
    use tower_governor::governor::GovernorConfigBuilder;
    use tower_governor::GovernorLayer;

    /// tower_governor's `use_headers()`: `x-ratelimit-*` headers on every response, the
    /// like-for-like peer of tower-throttle's `RateLimit` fields.
    pub fn router_with_headers() -> Router {
        let config = GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(1_000_000)
            .use_headers()
            .finish()
            .expect("valid governor config");
        hello().layer(GovernorLayer::new(config))
    }

    pub fn router(pass: bool) -> Router {
        let config = if pass {
            // One cell per nanosecond, bursts of a million: never limited.
            GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000)
                .finish()
        } else {
            // tower_governor's per_second(n) means one cell every n seconds: 1 an hour, burst 1.
            GovernorConfigBuilder::default()
                .per_second(3600)
                .burst_size(1)
                .finish()
        }
        .expect("valid governor config");
        hello().layer(GovernorLayer::new(config))
    }
}

mod redis_cell_peer {
    use super::*;
    use axum::http::header;
    use tower_redis_cell::redis_cell::Policy;
    use tower_redis_cell::{
        Error, ProvideRule, ProvideRuleResult, RateLimitConfig, RateLimitLayer, Rule,
    };

    #[derive(Clone)]
    struct ByIp(Policy);

    impl<T> ProvideRule<axum::http::Request<T>> for ByIp {
        fn provide<'a>(&self, req: &'a axum::http::Request<T>) -> ProvideRuleResult<'a> {
            let ip = req
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ci| ci.0.ip().to_string())
                .ok_or("no peer address")?;
            Ok(Some(Rule::new(
                format!("rc{}:{ip}", std::process::id()),
                self.0,
            )))
        }
    }

    pub async fn router(url: &str, pass: bool) -> Router {
        let policy = if pass {
            Policy::new(PASS_BURST as usize, PASS_COUNT as usize, PASS_PERIOD, 1)
        } else {
            Policy::new(0, 1, Duration::from_secs(3600), 1)
        };
        let client = redis::Client::open(url).expect("redis url");
        let conn = redis::aio::ConnectionManager::new(client)
            .await
            .expect("connect to Redis");
        let config = RateLimitConfig::new(ByIp(policy), |err, _req| match err {
            Error::RateLimit(err) => (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, err.details.retry_after.to_string())],
                "too many requests",
            )
                .into_response(),
            Error::ProvideRule(_) => StatusCode::BAD_REQUEST.into_response(),
            _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        });
        hello().layer(RateLimitLayer::new(config, conn))
    }
}

mod rate_limiter_peer {
    use super::*;
    use tower_rate_limiter::{GcraQuota, IpKeyExtractor, RateLimitLayer, RedisGcra};

    pub async fn router(url: &str, pass: bool) -> Router {
        let quota = if pass {
            GcraQuota::new(PASS_COUNT as u32, PASS_PERIOD, PASS_BURST as u32)
        } else {
            GcraQuota::new(1, Duration::from_secs(3600), 1)
        }
        .expect("valid quota");
        let client = redis::Client::open(url).expect("redis url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to Redis");
        let policy =
            RedisGcra::new(conn, quota).with_namespace(format!("trl{}", std::process::id()));
        let layer = RateLimitLayer::builder(IpKeyExtractor::new())
            .policy_name("lt")
            .with_policy(policy)
            .build()
            .expect("valid layer");
        hello().layer(layer)
    }
}

/// The middleware anyone would write by hand: one `CL.THROTTLE` per request on a shared
/// multiplexed connection, 429 with `Retry-After` when limited, errors let through.
mod handwritten {
    use super::*;
    use redis::aio::MultiplexedConnection;

    #[derive(Clone)]
    struct Cell {
        conn: MultiplexedConnection,
        args: (u64, u64, u64),
    }

    async fn throttle(
        State(cell): State<Cell>,
        ConnectInfo(peer): ConnectInfo<SocketAddr>,
        req: Request,
        next: Next,
    ) -> Response {
        let mut conn = cell.conn.clone();
        let (burst, count, period) = cell.args;
        let reply: redis::RedisResult<Vec<i64>> = redis::cmd("CL.THROTTLE")
            .arg(format!("hw{}:{}", std::process::id(), peer.ip()))
            .arg(burst)
            .arg(count)
            .arg(period)
            .arg(1)
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(r) if r.first() == Some(&1) => {
                let retry = r.get(3).copied().unwrap_or(1).max(1);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", retry.to_string())],
                    "too many requests",
                )
                    .into_response()
            }
            _ => next.run(req).await,
        }
    }

    pub async fn router(url: &str, pass: bool) -> Router {
        let client = redis::Client::open(url).expect("redis url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to Redis");
        let args = if pass {
            (PASS_BURST, PASS_COUNT, PASS_PERIOD.as_secs())
        } else {
            (0, 1, 3600)
        };
        hello().layer(axum::middleware::from_fn_with_state(
            Cell { conn, args },
            throttle,
        ))
    }
}

async fn app(variant: &str, redis_url: Option<&str>) -> Result<Router, String> {
    use tower_throttle::redis::RedisMode;
    let redis = || redis_url.ok_or_else(|| format!("{variant} needs --redis URL"));
    let p = pass(variant);
    Ok(match variant {
        "bare" => hello(),
        "throttle-mem-pass" | "throttle-mem-deny" => throttle::memory(p),
        "throttle-mem-pass-noheaders" => throttle::memory_no_headers(true),
        "throttle-mem-overload-pass" => throttle::memory_overload(),
        "throttle-mem-count-only-pass" => throttle::memory_count_only(),
        "throttle-axumbody-pass" | "throttle-axumbody-deny" => throttle::memory_axum_body(p, true),
        "throttle-axumbody-pass-noheaders" => throttle::memory_axum_body(true, false),
        "governor-pass" | "governor-deny" => governor_peer::router(p),
        "governor-headers-pass" => governor_peer::router_with_headers(),
        "throttle-lua-pass" | "throttle-lua-deny" => {
            throttle::redis(redis()?, RedisMode::Lua, p, true).await
        }
        // Every check its own script call: the Lua path without coalesced batches.
        "throttle-lua-alone-pass" => throttle::redis_alone(redis()?, RedisMode::Lua).await,
        // Every check its own CL.THROTTLE call, not pipelined in batches.
        "throttle-cell-alone-pass" => throttle::redis_alone(redis()?, RedisMode::Cell).await,
        "throttle-lua-lease-pass" => throttle::redis_leased(redis()?).await,
        "throttle-lua-deny-nocache" => {
            throttle::redis(redis()?, RedisMode::Lua, false, false).await
        }
        "throttle-cell-pass" | "throttle-cell-deny" => {
            throttle::redis(redis()?, RedisMode::Cell, p, true).await
        }
        // As tower-redis-cell answers an admitted request: without rate-limit fields.
        "throttle-cell-pass-noheaders" => {
            throttle::redis_fields(redis()?, RedisMode::Cell, true, true, false).await
        }
        "redis-cell-peer-pass" | "redis-cell-peer-deny" => {
            redis_cell_peer::router(redis()?, p).await
        }
        "rate-limiter-peer-pass" | "rate-limiter-peer-deny" => {
            rate_limiter_peer::router(redis()?, p).await
        }
        "handwritten-cell-pass" | "handwritten-cell-deny" => handwritten::router(redis()?, p).await,
        other => return Err(format!("unknown variant {other:?}; one of {VARIANTS:?}")),
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut variant = None;
    let mut listen: SocketAddr = "127.0.0.1:3000".parse().unwrap();
    let mut redis_url = None;
    let mut workers: usize = 1;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => {
                listen = args
                    .next()
                    .expect("--listen ADDR")
                    .parse()
                    .expect("address")
            }
            "--redis" => redis_url = Some(args.next().expect("--redis URL")),
            "--workers" => {
                workers = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n >= 1)
                    .expect("--workers N (1 or more)")
            }
            "--list" => {
                for v in VARIANTS {
                    println!("{v}");
                }
                return;
            }
            v => variant = Some(v.to_owned()),
        }
    }
    let variant = variant.unwrap_or_else(|| {
        eprintln!(
            "usage: loadtest-server VARIANT [--listen ADDR] [--redis URL] [--workers N]; --list"
        );
        std::process::exit(2)
    });
    // One worker thread by default (the script pins the server to one core); with --workers N, a
    // multi-threaded runtime of N workers (the script pins it to N cores).
    let rt = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    }
    .expect("runtime");
    rt.block_on(async move {
        let app = match app(&variant, redis_url.as_deref()).await {
            Ok(app) => app,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(2)
            }
        };
        let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
        println!("{variant} listening on {}", listener.local_addr().unwrap());
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
}

//! The example server: per-route policies from TOML, in memory or on Redis.
//!
//! ```text
//! cargo run --example server                       # built-in config, 127.0.0.1:3000, in memory
//! cargo run --example server -- --config my.toml   # your config
//! cargo run --example server -- --listen 127.0.0.1:8080
//! cargo run --example server -- --redis redis://127.0.0.1:6379/   # the built-in routes on Redis
//! cargo run --example server -- --redis redis://127.0.0.1:6379/ --redis-mode lua
//! cargo run --example server -- --config my.toml --admin 127.0.0.1:3001   # peek, reset, reload, health
//! ```
//!
//! Every configured route answers 200 to any method with a body naming the route, after
//! `?sleep_ms=N` or holding one of 16 workers for `?work_ms=N` (a service of bounded capacity, to
//! try `[overload]` on) (or, with
//! `?stream_tokens=N&interval_ms=D`, N server-sent tokens reported on a metered route's meter:
//! `server/stream.rs`); `/metrics` serves
//! the limiter's counters in the Prometheus text format; other paths 404. With `--admin ADDR`, a
//! second listener serves `GET`/`DELETE /limits/{policy}/{key}`, `POST /reload`, `GET /health`,
//! `GET /top/{policy}`, `GET /overview`, overrides and timed bans (`/overrides/…`, `/bans/…`:
//! `server/overrides.rs`) and an admin page at `/` (see `server/admin.rs`), behind a
//! token with `--admin-token-env NAME` (`server/auth.rs`); SIGHUP reloads the `--config` file too.
//! Both listeners close connections whose request head is slow and cap open connections
//! (`[server]`, `server/edge.rs`).
//!
//! Every start-up error is one line on stderr naming where it comes from (the config file and the
//! setting, or the flag), and the exit code is 2.

#[path = "server/admin.rs"]
mod admin;
#[path = "server/auth.rs"]
mod auth;
#[path = "server/edge.rs"]
mod edge;
#[path = "server/host.rs"]
mod host;
#[path = "server/overrides.rs"]
mod overrides;
#[path = "server/settings.rs"]
mod settings;
#[path = "server/stream.rs"]
mod stream;
#[path = "server/view.rs"]
mod view;

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::RawQuery;
use axum::routing::{any, get};
use axum::Extension;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tower_throttle::config::{
    BackendConfig, BackendHealth, Config, ConfiguredBackend, RedisConfig, RouteConfig,
};
use tower_throttle::{policy::PolicyDecision, redis::RedisMode, MemoryBackend, Meter};

const DEFAULT_CONFIG: &str = r#"
listen = "127.0.0.1:3000"
decision_extension = true     # every route's answer shows what the limiter decided

[backend]
kind = "memory"

# Every client IP: bursts of 20, then 10 a second.
[[route]]
name = "index"
path = "/"
key = "ip"
max_burst = 19
count = 10
period = "1s"

# Each user (x-user-id) may post bursts of 16 replies, then 30 a minute.
[[route]]
name = "reply"
path = "/reply"
methods = ["POST"]
key = "header:x-user-id"
max_burst = 15
count = 30
period = "60s"
cost = 1

# Five login attempts a minute per username, read from the JSON body (a spelling with escapes,
# "\u0061lice", is the same user; a body without a username is refused with 400):
#   curl localhost:3000/login -H 'content-type: application/json' -d '{"username":"alice"}'
[[route]]
name = "login"
path = "/login"
methods = ["POST"]
key = "json:username"
count = 5
period = "1m"

# Two downloads at a time per client IP (try several /download?sleep_ms=5000 at once).
[[route]]
name = "download"
path = "/download"
key = "ip"
algorithm = "concurrency"
count = 2

# 10 a second and 1,000 a day per API key, both enforced.
[[route]]
name = "api"
path = "/api/{*rest}"
key = "header:x-api-key"
quotas = [{ count = 10, period = "1s" }, { count = 1000, period = "1d" }]

# 60 requests a minute and 1,000 tokens an hour per API key, tokens settled after the response:
#   curl -N 'localhost:3000/chat?stream_tokens=50&interval_ms=100' -H 'x-api-key: k1'
# streams 50 tokens, each charged as it is sent (an interrupted curl pays what it received).
[[route]]
name = "chat"
path = "/chat"
key = "header:x-api-key"
count = 60
period = "1m"
metered = { charge = "after-response", unit = "tokens", count = 1000, period = "1h", estimate = 1, usage_header = "x-usage-tokens" }
"#;

/// Where `/metrics` is served; no `[[route]]` may take it.
const METRICS_PATH: &str = "/metrics";

/// How often the Prometheus recorder drains its histogram samples when nobody scrapes: without
/// this, every decision's latency sample is kept until the next scrape, and memory grows without
/// bound on a server that is never scraped.
const METRICS_UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The most routes the start-up line lists by name.
const ROUTES_SHOWN: usize = 10;

const USAGE: &str = "usage: server [--config FILE] [--listen HOST:PORT] [--admin HOST:PORT [--admin-token-env NAME]] [--redis URL [--redis-mode auto|cell|lua]]\n\
    --config FILE     the policies, in TOML (default: a built-in set of six routes)\n\
    --listen ADDR     such as 127.0.0.1:3000, [::1]:3000 or localhost:3000 (default: the config's\n\
    \x20                 listen, else 127.0.0.1:3000)\n\
    --admin ADDR      also serve GET/DELETE /limits/{policy}/{key}, POST /reload, GET /health,\n\
    \x20                 GET /top/{policy}, GET /overview, GET /overload and an admin page at /\n\
    \x20                 on ADDR (off by default; keep it on loopback: it can lift any limit)\n\
    --admin-token-env NAME  every admin request needs Authorization: Bearer <the value of $NAME>\n\
    \x20                 (or [admin] token_env in the config); required off loopback\n\
    --redis URL       use Redis at URL (redis:// or rediss://): the file's [backend] Redis settings\n\
    \x20                 with this URL, or Redis's defaults in place of a memory backend\n\
    --redis-mode M    with --redis: auto (default), cell (CL.THROTTLE) or lua";

struct Args {
    config: Option<String>,
    /// As typed, resolved at start-up (it may be a host name).
    listen: Option<String>,
    /// The admin listener's address, as typed.
    admin: Option<String>,
    /// The environment variable holding the admin token.
    admin_token_env: Option<String>,
    redis: Option<String>,
    redis_mode: Option<RedisMode>,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        config: None,
        listen: None,
        admin: None,
        admin_token_env: None,
        redis: None,
        redis_mode: None,
    };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .ok_or_else(|| format!("{arg} needs {what} (try --help)"))
        };
        match arg.as_str() {
            "--config" => parsed.config = Some(value("a file")?),
            "--listen" => {
                let addr = value("an address such as 127.0.0.1:3000 or localhost:3000")?;
                check_listen(&addr)?;
                parsed.listen = Some(addr);
            }
            "--admin" => {
                let addr = value("an address such as 127.0.0.1:3001")?;
                check_listen(&addr).map_err(|e| e.replacen("--listen", "--admin", 1))?;
                parsed.admin = Some(addr);
            }
            "--admin-token-env" => {
                parsed.admin_token_env = Some(value("an environment variable's name")?)
            }
            "--redis" => parsed.redis = Some(value("a URL such as redis://127.0.0.1:6379/")?),
            "--redis-mode" => {
                let mode = value("auto, cell or lua")?;
                parsed.redis_mode =
                    Some(mode.parse().map_err(|_| {
                        format!("--redis-mode {mode:?}: expected auto, cell or lua")
                    })?);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if parsed.admin_token_env.is_some() && parsed.admin.is_none() {
        return Err("--admin-token-env needs --admin".into());
    }
    if parsed.redis_mode.is_some() && parsed.redis.is_none() {
        return Err("--redis-mode needs --redis".into());
    }
    Ok(parsed)
}

/// `--listen` is `HOST:PORT`: an IP address (`[::1]` for IPv6) or a name, and a port.
fn check_listen(addr: &str) -> Result<(), String> {
    let bad = |why: &str| {
        format!(
            "--listen {addr:?}: {why}; expected HOST:PORT, such as 127.0.0.1:3000, [::1]:3000 or localhost:3000"
        )
    };
    if addr.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(bad("no port"));
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if host.contains(':') && !host.starts_with('[') {
        return Err(bad("an IPv6 address needs brackets"));
    }
    port.parse::<u16>()
        .map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    Ok(())
}

/// The addresses `--listen` (or the config's `listen`) names, host names resolved.
async fn listen_addrs(args: &Args, config: &Config) -> Result<Vec<SocketAddr>, String> {
    let Some(addr) = &args.listen else {
        return Ok(vec![config
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 3000)))]);
    };
    resolve("--listen", addr).await
}

/// The addresses of `addr` (`HOST:PORT`, checked), host names resolved; errors name `flag`.
async fn resolve(flag: &str, addr: &str) -> Result<Vec<SocketAddr>, String> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("{flag} {addr:?}: cannot resolve the host: {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("{flag} {addr:?}: the host has no address"));
    }
    Ok(addrs)
}

/// `GET /health` of the admin listener: the backend's state, 200 while decisions come from it,
/// 503 otherwise (for a readiness check), with the reason and the error decisions fail with.
pub(crate) fn health_response(backend: &ConfiguredBackend) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (up, body) = health_json(backend);
    let status = if up {
        axum::http::StatusCode::OK
    } else {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// Whether the backend decides, and its state as `GET /health` shows it.
pub(crate) fn health_json(backend: &ConfiguredBackend) -> (bool, serde_json::Value) {
    let health = backend.health();
    let up = health.is_healthy();
    let body = match &health {
        BackendHealth::Redis(redis) => serde_json::json!({
            "backend": "redis",
            "up": up,
            "reason": redis.reason(),
            "connected": redis.connected,
            "decisions_failing": redis.decisions_failing,
            "path": redis.path_name(),
            "breaker_open": redis.breaker_open,
            "address": redis.address,
            "last_error": redis.last_error.as_ref().map(|(error, _)| error),
            "last_error_unix_ms": redis.last_error.as_ref().and_then(|(_, at)| {
                at.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as u64)
            }),
            // A Cluster's primaries, each with its own breaker (empty on one server).
            "nodes": redis.nodes.iter().map(|node| serde_json::json!({
                "address": node.address,
                "slots": node.slots,
                "slot_count": node.slot_count(),
                "breaker": node.state.name(),
                "last_error": node.last_error.as_ref().map(|(error, _)| error),
            })).collect::<Vec<_>>(),
        }),
        _ => serde_json::json!({ "backend": "memory", "up": up }),
    };
    (up, body)
}

/// Where the configuration came from, to name in errors.
struct Source(String);

impl Source {
    /// `error` in this configuration, on one line.
    fn error(&self, error: impl std::fmt::Display) -> String {
        format!("{}: {}", self.0, one_line(&error.to_string()))
    }
}

/// A message on one line: a TOML parse error's source excerpt (`  |`, `3 | colour = 1`, `  | ^^^`)
/// folds into `line 3, column 1: unknown field ...`, other line breaks into "; ".
fn one_line(message: &str) -> String {
    let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(first) = lines.next() else {
        return String::new();
    };
    let Some(position) = first.strip_prefix("TOML parse error at ") else {
        return std::iter::once(first)
            .chain(lines)
            .collect::<Vec<_>>()
            .join("; ");
    };
    // The excerpt's lines all hold a '|' after an optional line number.
    let is_excerpt = |l: &&str| {
        l.split_once('|')
            .is_some_and(|(n, _)| n.trim().chars().all(|c| c.is_ascii_digit()))
    };
    let what: Vec<&str> = lines.filter(|l| !is_excerpt(l)).collect();
    format!("{position}: {}", what.join("; "))
}

/// Refuses what the server itself would get wrong: a route on `/metrics` (it would never be
/// reached: the scrape endpoint is served there).
fn check_routes(config: &Config, source: &Source) -> Result<(), String> {
    if let Some(route) = config
        .routes
        .iter()
        .find(|r| r.path.as_deref() == Some(METRICS_PATH))
    {
        return Err(source.error(format!(
            "[[route]] {:?}: path = \"{METRICS_PATH}\" is the server's metrics endpoint; choose another path",
            route.name
        )));
    }
    Ok(())
}

/// The workers `?work_ms=N` holds one of: a service of bounded capacity (`WORKERS` / N ms
/// requests a second), whose latency rises once more arrive, to try the `[overload]` gate on.
const WORKERS: usize = 16;
static WORK: std::sync::LazyLock<tokio::sync::Semaphore> =
    std::sync::LazyLock::new(|| tokio::sync::Semaphore::new(WORKERS));

/// The number `name=N` of a query, if it has one.
fn query_number(query: Option<&str>, name: &str) -> Option<u64> {
    let value = query?
        .split('&')
        .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))?;
    value.parse().ok()
}

/// A route's answer: its name, what the limiter decided (dry-run and delay modes show here), after
/// holding the request for `?sleep_ms=N` (at most 10 s; to try `algorithm = "concurrency"`), or
/// one of 16 workers for `?work_ms=N` (at most 10 s; to try `[overload]`); or, with
/// `?stream_tokens=N&interval_ms=D`, N server-sent tokens on the meter (`server/stream.rs`).
async fn answer(
    mut body: String,
    decision: Option<Extension<PolicyDecision>>,
    meter: Option<Extension<Meter>>,
    RawQuery(query): RawQuery,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Some(stream) = stream::requested(query.as_deref(), meter.map(|Extension(m)| m)) {
        return stream;
    }
    let sleep_ms = query_number(query.as_deref(), "sleep_ms").map_or(0, |ms| ms.min(10_000));
    if sleep_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(sleep_ms)).await;
    }
    if let Some(work_ms) = query_number(query.as_deref(), "work_ms") {
        // The semaphore is never closed: `acquire` cannot fail.
        if let Ok(_worker) = WORK.acquire().await {
            let work = std::time::Duration::from_millis(work_ms.min(10_000));
            tokio::time::sleep(work).await;
        }
    }
    if let Some(Extension(d)) = decision {
        body.push_str(&format!(
            "policy {}{}: allowed={} remaining={} enforced={} delayed_ms={}\n",
            d.policy,
            d.tier.map(|t| format!(" (tier {t})")).unwrap_or_default(),
            d.decision.allowed,
            d.decision.remaining,
            d.enforced,
            d.delayed.as_millis()
        ));
    }
    body.into_response()
}

/// The configured paths, each answered by a handler naming its route, in time linear in routes.
///
/// axum panics on a route it cannot accept (a conflict such as `/a/{x}` next to `/a/{y}`, a
/// pattern in the old `/:id` syntax); the panic is caught and its message becomes the error, with
/// the panic hook silenced meanwhile so that no panic text or backtrace reaches the terminal.
fn routes(config: &Config, source: &Source) -> Result<Router, String> {
    let mut added = HashSet::new();
    let paths: Vec<(&str, &RouteConfig)> = config
        .routes
        .iter()
        .filter_map(|route| Some((route.path.as_deref()?, route)))
        // Several policies may share a path (one per method); the path is served once.
        .filter(|(path, _)| added.insert(*path))
        .collect();
    let mut current: Option<&RouteConfig> = None;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // The router is moved, never cloned, from one route to the next: Router::route copies
        // its whole table when the router is shared, which made start-up quadratic in routes.
        let mut router = Router::new();
        for &(path, route) in &paths {
            current = Some(route);
            let body = format!("route {} ({path})\n", route.name);
            let handler = move |decision: Option<Extension<PolicyDecision>>,
                                meter: Option<Extension<Meter>>,
                                query: RawQuery| {
                let body = body.clone();
                async move { answer(body, decision, meter, query).await }
            };
            router = router.route(path, any(handler));
        }
        router
    }));
    std::panic::set_hook(hook);
    built.map_err(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("axum refused it");
        let name = current.map_or("?", |r| r.name.as_str());
        source.error(format!("[[route]] {name:?}: {why}"))
    })
}

/// `/metrics`: the recorder's text, with the distinct limited clients read at scrape time.
fn with_metrics(
    router: Router,
    layer: &tower_throttle::ThrottleLayer<tower_throttle::key::KeySpec, ConfiguredBackend>,
    metrics: PrometheusHandle,
) -> Router {
    let offenders = layer.offenders().cloned();
    let handle = layer.handle();
    // The policies whose counts the last scrape set: one a reload removed reads 0 after it.
    let reported = std::sync::Arc::new(std::sync::Mutex::new(HashSet::<String>::new()));
    let scrape = move || {
        let (offenders, handle, metrics) = (offenders.clone(), handle.clone(), metrics.clone());
        let reported = reported.clone();
        async move {
            // Distinct limited clients, read when scraped (from Redis with a Redis backend), of
            // the policies in force then (a reload may have renamed or added some).
            if let Some(offenders) = &offenders {
                let mut policies: Vec<String> = handle
                    .policies()
                    .iter()
                    .map(|p| p.name().to_owned())
                    .collect();
                policies.dedup();
                // Read together, within a second in all: a slow Redis does not hold the scrape
                // (which would lose `throttle_backend_up` with it), and a count it cannot read is
                // NaN, not the last one read.
                let mut reads = tokio::task::JoinSet::new();
                for policy in &policies {
                    let (offenders, policy) = (offenders.clone(), policy.clone());
                    reads.spawn(async move { (offenders.count(&policy).await.ok(), policy) });
                }
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
                let mut read = HashMap::new();
                while let Ok(Some(done)) =
                    tokio::time::timeout_at(deadline, reads.join_next()).await
                {
                    if let Ok((counts, policy)) = done {
                        read.insert(policy, counts);
                    }
                }
                for policy in &policies {
                    let counts = read.get(policy).copied().flatten();
                    let of = |n: fn(&_) -> u64| counts.as_ref().map_or(f64::NAN, |c| n(c) as f64);
                    for (window, n) in [
                        ("minute", of(|c| c.minute)),
                        ("hour", of(|c| c.hour)),
                        ("day", of(|c| c.day)),
                    ] {
                        metrics::gauge!(
                            "throttle_distinct_limited_clients",
                            "policy" => policy.clone(),
                            "window" => window
                        )
                        .set(n);
                    }
                }
                let mut reported = reported.lock().unwrap_or_else(|e| e.into_inner());
                for gone in reported.iter().filter(|p| !policies.contains(p)) {
                    for window in ["minute", "hour", "day"] {
                        let policy = gone.clone();
                        let labels = [("policy", policy), ("window", window.to_owned())];
                        metrics::gauge!("throttle_distinct_limited_clients", &labels).set(0.0);
                    }
                }
                *reported = policies.into_iter().collect();
            }
            metrics.render()
        }
    };
    // Router::layer runs after routing, so policies see axum's MatchedPath. /metrics is added after
    // the layer, so scraping it is never limited. axum_body(): responses keep axum's own body.
    router
        .layer(layer.clone().axum_body())
        .route(METRICS_PATH, get(scrape))
}

/// What the start-up line says about the backend: for Redis, the path decisions take (in mode
/// auto, what detection found).
fn describe_backend(config: &Config, backend: &ConfiguredBackend) -> String {
    match backend {
        ConfiguredBackend::Redis(redis) => {
            // Unreachable first: mode auto knows its path (Lua) before Redis ever answered.
            let path = match redis.active_path() {
                _ if !redis.health().connected => {
                    "Redis not reachable yet: requests follow the failure policy until it answers"
                }
                Some(RedisMode::Cell) => "decisions by CL.THROTTLE (redis-cell)",
                Some(RedisMode::Lua) => "decisions by the Lua script",
                _ => "decision path not yet detected",
            };
            format!("{}, {path}", config.backend)
        }
        ConfiguredBackend::Memory(_) => config.backend.to_string(),
    }
}

/// The routes by name and path, the first few of them.
fn describe_routes(config: &Config) -> String {
    let mut shown: Vec<String> = config
        .routes
        .iter()
        .take(ROUTES_SHOWN)
        .map(|r| format!("{} {}", r.name, r.path.as_deref().unwrap_or("*")))
        .collect();
    if config.routes.len() > ROUTES_SHOWN {
        shown.push(format!("and {} more", config.routes.len() - ROUTES_SHOWN));
    }
    shown.join(", ")
}

async fn run() -> Result<(), String> {
    let args = parse_args(std::env::args().skip(1))?;
    let (source, text) = match &args.config {
        Some(path) => (
            Source(path.clone()),
            std::fs::read_to_string(path).map_err(|e| format!("--config {path}: {e}"))?,
        ),
        None => (Source("the built-in config".into()), DEFAULT_CONFIG.into()),
    };
    let mut config = Config::from_toml(&text).map_err(|e| source.error(e))?;
    // Everything the file says is checked before anything connects, so that its errors name it
    // (a Redis that is down would otherwise hide them).
    check_routes(&config, &source)?;
    let probe = MemoryBackend::builder()
        .build()
        .map_err(|e| source.error(e))?;
    config
        .layer_builder(probe)
        .and_then(|builder| builder.build())
        .map(drop)
        .map_err(|e| source.error(e))?;
    let mut router = routes(&config, &source)?;
    let edge = edge::of(&config).map_err(|e| source.error(e))?;
    settings::AdminConfig::of(&config).map_err(|e| source.error(e))?;
    // Errors from here on are the backend's: from the flag when --redis replaced it.
    let mut backend_override = None;
    let backend_source = match &args.redis {
        Some(url) => {
            // The file's Redis settings (on_error, prefix, timeout...) with the flag's URL: only
            // one server's URL can be replaced, not Cluster seeds nor Sentinels.
            let mut redis = match &config.backend {
                BackendConfig::Redis(file) if file.urls.is_some() || file.sentinels.is_some() => {
                    let why = "--redis replaces one server's url, and [backend] names Cluster \
                               seeds (urls) or sentinels: change them in the file";
                    return Err(source.error(why));
                }
                BackendConfig::Redis(file) => file.clone(),
                _ => RedisConfig::new(url.clone()),
            };
            redis.url = Some(url.clone());
            if let Some(mode) = args.redis_mode {
                redis.mode = Some(mode.as_str().to_owned());
            }
            config.backend = BackendConfig::Redis(redis);
            backend_override = Some(config.backend.clone());
            // "redis redis://host:6379/ (mode auto)", password hidden: "--" makes it the flag.
            Source(format!("--{}", config.backend))
        }
        None => source,
    };
    // Before the backend: what it reports while connecting (`throttle_backend_up`) is recorded.
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("metrics: {e}"))?;
    let layer = match config.layer().await {
        // The built-in `chat` route is metered: a backend that cannot settle a cost after the
        // response refuses it, and the built-in config then does without it.
        Err(e) if args.config.is_none() && e.to_string().contains("cannot settle") => {
            eprintln!("the built-in metered route \"chat\" is left out: {e}");
            config.routes.retain(|r| r.metered.is_none());
            router = routes(&config, &backend_source)?;
            config.layer().await
        }
        built => built,
    }
    .map_err(|e| backend_source.error(e))?;
    // The overrides and bans kept in Redis, in force before the first request (a layer also reads
    // them on its own, moments after it is built).
    if let Err(e) = layer.handle().refresh_overrides().await {
        tracing::warn!(error = %e, "could not read the overrides and bans yet; they apply once Redis answers");
    }
    let listen = listen_addrs(&args, &config).await?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(METRICS_UPKEEP_EVERY);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    admin::register_reload_metrics();
    let app = with_metrics(router, &layer, metrics.clone())
        .layer(axum::middleware::from_fn(host::require_host));
    let reloader = std::sync::Arc::new(admin::Reloader::new(
        args.config.clone(),
        config.clone(),
        backend_override,
    ));
    admin::reload_on_sighup(layer.handle(), reloader.clone());
    let admin = match &args.admin {
        Some(addr) => {
            let addrs = resolve("--admin", addr).await?;
            let listener = tokio::net::TcpListener::bind(addrs.as_slice())
                .await
                .map_err(|e| {
                    format!("--admin: cannot listen on {}: {e}", describe_addrs(&addrs))
                })?;
            let admin = admin::Admin::new(
                layer.handle(),
                layer.backend().clone(),
                reloader,
                view::History::start(metrics),
            );
            let local = listener.local_addr().map_err(|e| e.to_string())?;
            let token = admin_token(&args, &config)?;
            if token.is_none() && !local.ip().is_loopback() {
                // Anyone who reaches it could lift any client's limit.
                return Err(format!(
                    "--admin {local}: not a loopback address, and no token: set one with --admin-token-env NAME or [admin] token_env"
                ));
            }
            let router = admin.router(token.as_deref().map(auth::AdminToken::new));
            tokio::spawn(edge::serve(listener, router, edge, std::future::pending()));
            format!("; admin on http://{local}")
        }
        None => String::new(),
    };
    let listener = tokio::net::TcpListener::bind(listen.as_slice())
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", describe_addrs(&listen)))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!(
        "tower-throttle example listening on http://{local}{admin}; backend: {}; policies: {}",
        describe_backend(&config, layer.backend()),
        describe_routes(&config)
    );
    // `[backend] state_file`: the memory backend's keys, for the next process. Saved as the signal
    // comes, before the requests in flight are waited for (up to 10 s, when `docker stop` may
    // kill), then again with what they did.
    let save = || match config.save_state(&layer) {
        Ok(Some(keys)) => tracing::info!(keys, "state_file: keys saved"),
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "state_file: keys not saved"),
    };
    let stopping = async {
        shutdown_signal().await;
        save();
    };
    edge::serve(listener, app, edge, stopping).await;
    save();
    Ok(())
}

/// Ctrl-C (SIGINT), or SIGTERM (what `docker stop` and Kubernetes send) on Unix.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The admin token: `--admin-token-env` first, else the config's `[admin] token_env`.
fn admin_token(args: &Args, config: &Config) -> Result<Option<String>, String> {
    match &args.admin_token_env {
        Some(name) => settings::admin_token_from_env(name, "--admin-token-env")
            .map(Some)
            .map_err(|e| e.to_string()),
        None => settings::AdminConfig::of(config)?
            .token()
            .map_err(|e| e.to_string()),
    }
}

fn describe_addrs(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}

#[tokio::main]
async fn main() -> ExitCode {
    // Colour only for a person at a terminal: log files and pipes get plain text.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(
            // redis-rs warns on every redirection that a Cluster answers while a slot moves or a
            // node fails (thousands of lines a second); the backend's own warnings (at most one a
            // second) say what matters.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,redis=error".into()),
        )
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

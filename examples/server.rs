//! The example server: per-route policies from TOML, in memory or on Redis.
//!
//! ```text
//! cargo run --example server                       # built-in config, 127.0.0.1:3000, in memory
//! cargo run --example server -- --config my.toml   # your config
//! cargo run --example server -- --listen 127.0.0.1:8080
//! cargo run --example server -- --redis redis://127.0.0.1:6379/   # the built-in routes on Redis
//! cargo run --example server -- --redis redis://127.0.0.1:6379/ --redis-mode lua
//! ```
//!
//! Every configured route answers 200 to any method with a body naming the route; `/metrics` serves
//! the limiter's counters in the Prometheus text format; other paths 404.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::extract::RawQuery;
use axum::routing::{any, get};
use axum::Extension;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tower_throttle::config::{BackendConfig, Config, RedisConfig};
use tower_throttle::ThrottleDecision;

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

# Five login attempts a minute per client IP, no burst beyond that.
[[route]]
name = "login"
path = "/login"
methods = ["POST"]
key = "ip"
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
"#;

struct Args {
    config: Option<String>,
    listen: Option<SocketAddr>,
    redis: Option<String>,
    redis_mode: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        config: None,
        listen: None,
        redis: None,
        redis_mode: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--config" => args.config = Some(it.next().ok_or("--config needs a file")?),
            "--listen" => {
                let addr = it.next().ok_or("--listen needs an address")?;
                args.listen = Some(
                    addr.parse()
                        .map_err(|e| format!("--listen {addr:?}: {e}"))?,
                );
            }
            "--redis" => args.redis = Some(it.next().ok_or("--redis needs a URL")?),
            "--redis-mode" => {
                args.redis_mode = Some(it.next().ok_or("--redis-mode needs auto, cell or lua")?)
            }
            "-h" | "--help" => {
                println!(
                    "usage: server [--config FILE] [--listen ADDR] [--redis URL [--redis-mode auto|cell|lua]]\n\
                     --redis replaces the configured backend with Redis at URL"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(args)
}

/// A route's answer: its name, what the limiter decided (dry-run and delay modes show here), after
/// holding the request for `?sleep_ms=N` (at most 10 s; to try `algorithm = "concurrency"`).
async fn answer(
    mut body: String,
    decision: Option<Extension<ThrottleDecision>>,
    RawQuery(query): RawQuery,
) -> String {
    let sleep_ms = query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("sleep_ms=")))
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(0, |ms| ms.min(10_000));
    if sleep_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(sleep_ms)).await;
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
    body
}

async fn app(config: &Config, metrics: PrometheusHandle) -> Result<Router, String> {
    let layer = config.layer().await.map_err(|e| e.to_string())?;
    let offenders = layer.offenders().cloned();
    let mut policies: Vec<String> = layer
        .policies()
        .iter()
        .map(|p| p.name().to_owned())
        .collect();
    policies.dedup();
    let mut added = HashSet::new();
    let mut router = Router::new();
    for route in &config.routes {
        let Some(path) = route.path.as_deref() else {
            continue;
        };
        // Several policies may share a path (one per method); the path is served once.
        if !added.insert(path) {
            continue;
        }
        let body = format!("route {} ({path})\n", route.name);
        let handler = move |decision: Option<Extension<ThrottleDecision>>, query: RawQuery| {
            let body = body.clone();
            async move { answer(body, decision, query).await }
        };
        // axum panics on routes it cannot accept (conflicting patterns); report them as errors.
        let with_route = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            router.clone().route(path, any(handler))
        }))
        .map_err(|_| {
            format!("route {path:?} is not a valid axum route or conflicts with another")
        })?;
        router = with_route;
    }
    // Router::layer runs after routing, so policies see axum's MatchedPath. /metrics is added after
    // the layer, so scraping it is never limited.
    let scrape = move || {
        let (offenders, policies, metrics) = (offenders.clone(), policies.clone(), metrics.clone());
        async move {
            // Distinct limited clients, read when scraped (from Redis with a Redis backend).
            if let Some(offenders) = &offenders {
                for policy in &policies {
                    let Ok(counts) = offenders.count(policy).await else {
                        continue;
                    };
                    for (window, n) in [
                        ("minute", counts.minute),
                        ("hour", counts.hour),
                        ("day", counts.day),
                    ] {
                        metrics::gauge!(
                            "throttle_distinct_limited_clients",
                            "policy" => policy.clone(),
                            "window" => window
                        )
                        .set(n as f64);
                    }
                }
            }
            metrics.render()
        }
    };
    Ok(router.layer(layer).route("/metrics", get(scrape)))
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            Config::from_toml(&text).map_err(|e| format!("{path}: {e}"))?
        }
        None => Config::from_toml(DEFAULT_CONFIG).map_err(|e| e.to_string())?,
    };
    if let Some(url) = args.redis {
        let mut redis = RedisConfig::new(url);
        redis.mode = args.redis_mode;
        config.backend = BackendConfig::Redis(redis);
    } else if args.redis_mode.is_some() {
        return Err("--redis-mode needs --redis".into());
    }
    let listen = args
        .listen
        .or(config.listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 3000)));
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("metrics: {e}"))?;
    let app = app(&config, metrics).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let routes: Vec<String> = config
        .routes
        .iter()
        .map(|r| format!("{} {}", r.name, r.path.as_deref().unwrap_or("*")))
        .collect();
    println!(
        "tower-throttle example listening on http://{local}; backend: {}; policies: {}",
        config.backend,
        routes.join(", ")
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
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

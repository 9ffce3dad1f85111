//! Issue 51, deliverable 6: a bounded-capacity axum service, unprotected or behind one overload
//! protection, and the open-loop load that drives it past capacity (`scripts/overload_bench.sh`).
//!
//! ```text
//! overload-bench serve VARIANT [--port P] [--workers N] [--service-ms MS] [--slope F]
//! overload-bench load --url URL --rate R --conns C --seconds S --out FILE
//! ```
//!
//! The service: `N` workers (a FIFO semaphore), each request holds one for `MS` milliseconds
//! (`tokio::time::sleep`), so capacity is `N / MS` and a request beyond it waits for a worker:
//! queueing, not failing, is what an unprotected service does when overloaded. With `--slope F`,
//! the service time grows with the workers busy (`MS × (1 + F × busy / N)`), a service that slows
//! as it gets loaded (lock contention, a shared database). `GET /capacity?workers=M` (outside
//! every protection) takes workers away until `M` are left, or gives them back: a capacity drop
//! mid-run (a node lost, a noisy neighbour), where a static limit set to the old capacity queues.
//!
//! The load is open-loop: requests are due at `R` a second whatever the answers, each sent on the
//! first of `C` keep-alive connections that is free. A request due while every connection is busy
//! is dropped (counted `unsent`), as a client with `C` connections and no queue of its own would:
//! the latency measured is the server's, from the write of the request to the end of the response
//! body.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::error_handling::HandleErrorLayer;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{routing::get, BoxError, Router};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, Mutex, OwnedSemaphorePermit, Semaphore};
use tower::ServiceBuilder;
use tower_resilience_adaptive::{AdaptiveLimiterLayer, Aimd, Vegas};

const VARIANTS: &[&str] = &[
    "none",
    "tower-static-n",
    "tower-static-2n",
    "resilience-vegas",
    "resilience-aimd",
    "resilience-aimd-20ms",
    "throttle-gradient",
    "throttle-aimd",
];

struct Service {
    workers: Arc<Semaphore>,
    /// The workers taken away by `/capacity`.
    taken: Mutex<Option<OwnedSemaphorePermit>>,
    n: u32,
    busy: AtomicU32,
    service: Duration,
    slope: f64,
}

async fn work(State(s): State<Arc<Service>>) -> &'static str {
    let _worker = s.workers.acquire().await.unwrap();
    let busy = s.busy.fetch_add(1, Ordering::Relaxed) + 1;
    let factor = 1.0 + s.slope * f64::from(busy) / f64::from(s.n);
    tokio::time::sleep(s.service.mul_f64(factor)).await;
    s.busy.fetch_sub(1, Ordering::Relaxed);
    "ok"
}

/// `/capacity?workers=M`: gives every worker back, then takes `n - M` away (they are taken as
/// they finish, in turn with the requests waiting for one).
async fn capacity(State(s): State<Arc<Service>>, query: RawQuery) -> String {
    let workers: u32 = query
        .0
        .as_deref()
        .and_then(|q| q.strip_prefix("workers="))
        .and_then(|m| m.parse().ok())
        .unwrap_or(s.n)
        .clamp(1, s.n);
    let mut taken = s.taken.lock().await;
    *taken = None;
    if workers < s.n {
        *taken = s.workers.clone().acquire_many_owned(s.n - workers).await.ok();
    }
    format!("{workers} workers")
}

/// tower's shedding layers answer with an error; a client must see the same 503 from every
/// variant, so the comparison counts refusals alike.
async fn overloaded(_: BoxError) -> impl IntoResponse {
    (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
}

fn resilience<A>(router: Router, algorithm: A) -> Router
where
    A: tower_resilience_adaptive::ConcurrencyAlgorithm + Send + Sync + 'static,
{
    router.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(overloaded))
            .load_shed()
            .layer(AdaptiveLimiterLayer::new(algorithm)),
    )
}

fn app(variant: &str, s: Arc<Service>) -> Router {
    let n = s.n as usize;
    let s_service = s.service;
    let router = Router::new().route("/", get(work)).with_state(s);
    match variant {
        "none" => router,
        // The static limits a user would pick knowing the capacity: the worker count, and twice
        // it (a small queue in front of the workers).
        "tower-static-n" | "tower-static-2n" => {
            let limit = if variant == "tower-static-n" {
                n
            } else {
                2 * n
            };
            router.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(overloaded))
                    .load_shed()
                    .concurrency_limit(limit),
            )
        }
        // tower-resilience-adaptive answers Pending from `poll_ready` at its limit (it waits
        // rather than refuses), so it sheds only behind LoadShed. Vegas and AIMD with their
        // defaults (AIMD's latency threshold: 100 ms), as a user gets them; and AIMD with its
        // threshold set to the goal (2 × the service time), as a user who knows the service
        // would tune it, which the gate does not need.
        "resilience-vegas" => resilience(router, Vegas::builder().build()),
        "resilience-aimd" => resilience(router, Aimd::builder().build()),
        "resilience-aimd-20ms" => resilience(
            router,
            Aimd::builder().latency_threshold(s_service * 2).build(),
        ),
        "throttle-gradient" | "throttle-aimd" => {
            use tower_throttle::key::Global;
            use tower_throttle::overload::Overload;
            use tower_throttle::{Policy, Quota, ThrottleLayer};
            // A quota the load never reaches: only the gate acts. The gate's defaults, as a user
            // gets them.
            let policy = Policy::builder("bench")
                .key(Global)
                .quota(Quota::per_second(1_000_000))
                .build()
                .unwrap();
            let overload = if variant == "throttle-gradient" {
                Overload::gradient()
            } else {
                Overload::aimd()
            };
            let layer = ThrottleLayer::builder()
                .policy(policy)
                .overload(overload)
                .build()
                .unwrap();
            let watched = layer.clone();
            // The limit over time, to tell a limit that converged from one that drifted.
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(500));
                loop {
                    tick.tick().await;
                    if let Some(gate) = watched.overload() {
                        eprintln!("limit {} in_flight {}", gate.limit(), gate.in_flight());
                    }
                }
            });
            router.layer(layer)
        }
        other => panic!("unknown variant {other}; one of {VARIANTS:?}"),
    }
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: Option<T>) -> T {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} needs a value")),
        None => default.unwrap_or_else(|| panic!("{name} is required")),
    }
}

async fn serve(args: &[String]) {
    let variant = args.first().expect("serve VARIANT").clone();
    // Port 0 (the default): any free one, printed on stdout for the script, which then cannot
    // collide with whatever else runs on a shared machine.
    let port: u16 = arg(args, "--port", Some(0));
    let n: u32 = arg(args, "--workers", Some(8));
    let ms: u64 = arg(args, "--service-ms", Some(10));
    let slope: f64 = arg(args, "--slope", Some(0.0));
    let s = Arc::new(Service {
        workers: Arc::new(Semaphore::new(n as usize)),
        taken: Mutex::new(None),
        n,
        busy: AtomicU32::new(0),
        service: Duration::from_millis(ms),
        slope,
    });
    // Outside every protection: the switch must not be shed.
    let switch = Router::new()
        .route("/capacity", get(capacity))
        .with_state(s.clone());
    let app = app(&variant, s).merge(switch);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    println!("{port}");
    eprintln!("overload-bench: {variant} on {port}: {n} workers × {ms} ms, slope {slope}");
    axum::serve(listener, app).await.unwrap();
}

/// One answered request: when it was sent (from the start), its status, its latency.
struct Sample {
    at: Duration,
    status: u16,
    latency: Duration,
}

async fn connection(
    addr: SocketAddr,
) -> Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(send)
}

async fn load(args: &[String]) {
    let url: String = arg(args, "--url", None);
    let rate: f64 = arg(args, "--rate", None);
    let conns: usize = arg(args, "--conns", Some(256));
    let seconds: f64 = arg(args, "--seconds", None);
    let out: String = arg(args, "--out", None);
    let authority = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let addr: SocketAddr = authority.parse().expect("--url http://IP:PORT/");

    // A permit per idle connection: a request due when none is idle is dropped at once rather
    // than queued in the client, whose wait the server's latency would not show.
    let idle = Arc::new(Semaphore::new(conns));
    let (due, rx) = mpsc::channel::<()>(conns);
    let rx = Arc::new(Mutex::new(rx));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..conns {
        let (rx, authority, idle) = (rx.clone(), authority.clone(), idle.clone());
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut errors = 0u64;
            let mut send = None;
            loop {
                // Hold the receiver only while waiting, so the next free connection takes the
                // next request.
                let next = rx.lock().await.recv().await;
                if next.is_none() {
                    break;
                }
                if send.is_none() {
                    send = connection(addr).await;
                }
                let Some(s) = send.as_mut() else {
                    errors += 1;
                    idle.add_permits(1);
                    continue;
                };
                let request = http::Request::get("/")
                    .header(http::header::HOST, &authority)
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let sent = Instant::now();
                let answer = match s.send_request(request).await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        response.into_body().collect().await.ok().map(|_| status)
                    }
                    Err(_) => None,
                };
                idle.add_permits(1);
                match answer {
                    Some(status) => samples.push(Sample {
                        at: sent - start,
                        status,
                        latency: sent.elapsed(),
                    }),
                    None => {
                        errors += 1;
                        send = None;
                    }
                }
            }
            (samples, errors)
        }));
    }

    // Requests fall due on a fixed schedule, whatever the answers (open loop); tokio's timer
    // ticks in milliseconds, so each wake sends every request due by then.
    let total = (rate * seconds) as u64;
    let mut unsent = 0u64;
    for i in 0..total {
        let at = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at.into()).await;
        match idle.try_acquire() {
            Ok(permit) => {
                permit.forget();
                due.send(()).await.unwrap();
            }
            Err(_) => unsent += 1,
        }
    }
    drop(due);
    let mut samples = Vec::new();
    let mut errors = 0;
    for w in workers {
        let (s, e) = w.await.unwrap();
        samples.extend(s);
        errors += e;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(&out).unwrap());
    writeln!(f, "# offered {total} unsent {unsent} errors {errors}").unwrap();
    for s in &samples {
        writeln!(
            f,
            "{:.6},{},{}",
            s.at.as_secs_f64(),
            s.status,
            s.latency.as_micros()
        )
        .unwrap();
    }
    eprintln!(
        "overload-bench load: {url} {rate}/s × {seconds} s: {} answered, {unsent} unsent, {errors} errors",
        samples.len()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default().to_vec();
    match args.first().map(String::as_str) {
        Some("serve") => {
            // One worker thread: the server runs pinned to one core (the script's taskset), and
            // its capacity is set by the workers' semaphore, not the CPU.
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap()
                .block_on(serve(&rest))
        }
        Some("load") => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
            .block_on(load(&rest)),
        _ => {
            eprintln!(
                "usage: overload-bench serve VARIANT [--port P] | load --url URL --rate R \
                 --seconds S --out FILE"
            );
            eprintln!("variants: {VARIANTS:?}");
            std::process::exit(2);
        }
    }
}

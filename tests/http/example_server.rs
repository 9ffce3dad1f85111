//! The example server over real TCP: `cargo run --example server` as a user runs it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::redis as redis_support;

/// The example binary that `cargo test` built next to this test.
pub(crate) fn example_binary() -> PathBuf {
    let mut dir = std::env::current_exe().unwrap();
    dir.pop(); // the test binary
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("examples").join("server");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --all-features`",
        bin.display()
    );
    bin
}

pub(crate) struct Server {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// The start-up line.
    pub(crate) line: String,
}

impl Server {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `within` for the server to exit by itself (after a signal); whether it did.
    pub(crate) fn exited_within(&mut self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start(args: &[&str]) -> Server {
    start_with_env(args, &[])
}

/// Like [`start`], with these environment variables set.
pub(crate) fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(example_binary())
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    let expected = if args.contains(&"--redis") {
        "backend: redis"
    } else if args.contains(&"--config") {
        "backend: " // the file says which; the caller checks
    } else {
        "backend: memory"
    };
    assert!(line.contains(expected), "{line}");
    Server { child, addr, line }
}

/// The admin listener's address from the start-up line (one on every address is reached on
/// loopback).
pub(crate) fn admin_addr(server: &Server) -> SocketAddr {
    let addr: SocketAddr = server
        .line
        .split("admin on http://")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no admin address in {:?}", server.line))
        .parse()
        .unwrap();
    SocketAddr::from(([127, 0, 0, 1], addr.port()))
}

/// A JSON body, or a failure that shows it.
pub(crate) fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

pub(crate) struct Reply {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    send_body(addr, method, path, headers, "").await
}

/// [`send`] with a body.
pub(crate) async fn send_body(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The address as the Host, unless the caller names one.
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

#[tokio::test]
async fn sixteen_replies_then_429_over_tcp() {
    let server = start(&[]);
    let user = [("x-user-id", "alice")];
    for i in 0..16 {
        let r = send(server.addr, "POST", "/reply", &user).await;
        assert_eq!(r.status, 200, "request {i}");
        // The built-in config shows each decision to the handler.
        let remaining = 15 - i;
        assert_eq!(
            r.body,
            format!(
                "route reply (/reply)\npolicy reply: allowed=true remaining={remaining} \
                 enforced=true delayed_ms=0\n"
            )
        );
    }
    let r = send(server.addr, "POST", "/reply", &user).await;
    assert_eq!(r.status, 429);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1);
    for field in ["ratelimit", "ratelimit-policy"] {
        let list = sfv::Parser::parse_list(r.header(field).unwrap().as_bytes()).unwrap();
        assert_eq!(list.len(), 1, "{field}");
    }
    assert_eq!(r.header("ratelimit-policy"), Some(r#""reply";q=16;w=32"#));
    // GET /reply is not limited (the policy is for POST), other paths 404, and / is per IP.
    assert_eq!(send(server.addr, "GET", "/reply", &user).await.status, 200);
    assert_eq!(send(server.addr, "GET", "/nope", &[]).await.status, 404);
    let index = send(server.addr, "GET", "/", &[]).await;
    assert_eq!(index.status, 200);
    assert_eq!(
        index.header("ratelimit-policy"),
        Some(r#""index";q=20;w=2"#)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_over_tcp_admit_exactly_the_limit() {
    let server = start(&[]);
    let addr = server.addr;
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            tokio::spawn(async move {
                send(addr, "POST", "/reply", &[("x-user-id", "bob")])
                    .await
                    .status
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        let status = t.await.unwrap();
        assert!(status == 200 || status == 429, "{status}");
        ok += usize::from(status == 200);
    }
    assert_eq!(ok, 16);
}

#[test]
fn a_bad_config_exits_non_zero_with_the_error() {
    let dir = std::env::temp_dir().join(format!("tower-throttle-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "[[route]]\nname = \"r\"\npath = \"/r\"\nkey = \"ip\"\ncount = 0\nperiod = \"1s\"\n",
    )
    .unwrap();
    let out = Command::new(example_binary())
        .args([
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("quota count must be at least 1"),
        "{stderr}"
    );
}

#[test]
fn a_config_file_is_loaded() {
    let dir = std::env::temp_dir().join(format!("tower-throttle-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ok.toml");
    std::fs::write(
        &file,
        "[[route]]\nname = \"items\"\npath = \"/items/{id}\"\nkey = \"global\"\ncount = 1\nperiod = \"1h\"\n",
    )
    .unwrap();
    let server = start(&["--config", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        assert_eq!(
            send(server.addr, "DELETE", "/items/1", &[]).await.status,
            200
        );
        let r = send(server.addr, "GET", "/items/2", &[]).await;
        assert_eq!(r.status, 429);
        assert_eq!(r.header("retry-after"), Some("3600"));
    });
}

/// Two server processes on one Redis share one limit: 16 replies in all for one user, whichever
/// process serves each request, on each path.
#[tokio::test]
async fn two_processes_share_one_limit_on_redis() {
    let redis = redis_support::RedisServer::start_with_cell();
    let url = redis.url();
    for mode in ["lua", "cell", "auto"] {
        let a = start(&["--redis", &url, "--redis-mode", mode]);
        let b = start(&["--redis", &url, "--redis-mode", mode]);
        let user = format!("user-{mode}");
        let headers = [("x-user-id", user.as_str())];
        let mut statuses = Vec::new();
        for i in 0..24 {
            let server = if i % 3 == 0 { &a } else { &b };
            let r = send(server.addr, "POST", "/reply", &headers).await;
            if r.status == 429 {
                assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
            }
            statuses.push(r.status);
        }
        let passed = statuses.iter().filter(|s| **s == 200).count();
        assert_eq!(passed, 16, "mode {mode}: {statuses:?}");
        assert!(
            statuses[16..].iter().all(|s| *s == 429),
            "mode {mode}: {statuses:?}"
        );
        assert_eq!(
            redis.cli(&["EXISTS", &format!("throttle:reply:{{{user}}}")]),
            "1",
            "mode {mode}"
        );
    }
}

/// Redis down at start-up does not stop the server: it starts, answers by the failure policy, and
/// says so once.
#[tokio::test]
async fn an_unreachable_redis_does_not_stop_the_server() {
    let server = start(&["--redis", "redis://127.0.0.1:1/"]);
    assert!(
        server.line.contains("Redis not reachable yet"),
        "{}",
        server.line
    );
    // The built-in config's failure policy is the default, allow.
    let r = send(server.addr, "POST", "/reply", &[("x-user-id", "1")]).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// `connect = "eager"` keeps the old way: Redis down is a start-up error naming the file.
#[test]
fn an_eager_connect_to_an_unreachable_redis_is_a_start_up_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("eager.toml");
    std::fs::write(
        &file,
        "[backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1/\"\nconnect = \"eager\"\n\n\
         [[route]]\nname = \"r\"\npath = \"/\"\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n",
    )
    .unwrap();
    let out = Command::new(example_binary())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--config",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("eager.toml"), "{stderr}");
    assert!(
        stderr.contains("cannot connect to Redis at 127.0.0.1:1"),
        "{stderr}"
    );
}

/// The example server takes the client-identity keys: trusted proxies, `client-ip`, `[access]`,
/// and a route's penalty.
#[tokio::test]
async fn client_ip_access_lists_and_penalties_from_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("identity.toml");
    std::fs::write(
        &file,
        r#"
trusted_proxies = ["127.0.0.1"]
client_ip_header = "x-forwarded-for"

[access]
deny_networks = ["198.51.100.0/24"]

[[route]]
name = "login"
path = "/login"
key = "client-ip"
ipv6_prefix = 48
count = 2
period = "1m"
penalty = { after = 2, within = "1m", ban = "10m" }
"#,
    )
    .unwrap();
    let server = start(&["--config", file.to_str().unwrap()]);
    let from = |ip: &'static str| [("x-forwarded-for", ip)];
    // The test talks to the server from 127.0.0.1, the trusted proxy.
    assert_eq!(
        send(server.addr, "POST", "/login", &from("198.51.100.7"))
            .await
            .status,
        403
    );
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            send(server.addr, "POST", "/login", &from("203.0.113.5"))
                .await
                .status,
        );
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    let banned = send(server.addr, "POST", "/login", &from("203.0.113.5")).await;
    assert_eq!(banned.header("retry-after"), Some("600"));
    // Another client in another /48 is not affected.
    assert_eq!(
        send(server.addr, "POST", "/login", &from("2001:db8:1::1"))
            .await
            .status,
        200
    );
    assert_eq!(
        send(server.addr, "POST", "/login", &from("2001:db8:1:ffff::1"))
            .await
            .status,
        200
    );
    assert_eq!(
        send(server.addr, "POST", "/login", &from("2001:db8:1:aaaa::1"))
            .await
            .status,
        429
    );
}

/// `/metrics` shows the limiter's counters, per policy, after a burst of limited requests.
#[tokio::test]
async fn metrics_show_allowed_and_limited_requests() {
    let server = start(&[]);
    let user = [("x-user-id", "metrics")];
    for _ in 0..20 {
        send(server.addr, "POST", "/reply", &user).await;
    }
    let metrics = send(server.addr, "GET", "/metrics", &[]).await;
    assert_eq!(metrics.status, 200);
    let line = |name: &str| {
        metrics
            .body
            .lines()
            .find(|l| l.starts_with(name) && l.contains("policy=\"reply\""))
            .unwrap_or_else(|| panic!("no {name} in\n{}", metrics.body))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(line("throttle_requests_allowed_total"), 16.0);
    assert_eq!(line("throttle_requests_limited_total"), 4.0);
    assert!(metrics.body.contains("throttle_backend_latency_seconds"));
    // One user was limited: one distinct limited client this minute, hour and day.
    for window in ["minute", "hour", "day"] {
        let line = metrics
            .body
            .lines()
            .find(|l| {
                l.starts_with("throttle_distinct_limited_clients")
                    && l.contains("policy=\"reply\"")
                    && l.contains(&format!("window=\"{window}\""))
            })
            .unwrap_or_else(|| panic!("no {window} count in\n{}", metrics.body));
        assert!(line.ends_with(" 1"), "{line}");
    }
    // Never a label per key.
    assert!(!metrics.body.contains("metrics\""), "{}", metrics.body);
}

/// The example server's `throttle_requests_allowed_total` of `policy` (0 before its first request).
async fn allowed_total(addr: SocketAddr, policy: &str) -> f64 {
    let metrics = send(addr, "GET", "/metrics", &[]).await;
    let label = format!("policy=\"{policy}\"");
    metrics
        .body
        .lines()
        .find(|l| l.starts_with("throttle_requests_allowed_total") && l.contains(&label))
        .map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// The guide's TOML of every algorithm and mode, as the example server's config.
fn algorithms_config(dir: &std::path::Path) -> PathBuf {
    let page = include_str!("../../src/guide/algorithms.md");
    let section = &page[page.find("## Algorithms and modes").unwrap()..];
    let start = section.find("```toml\n").unwrap() + "```toml\n".len();
    let toml = &section[start..start + section[start..].find("```").unwrap()];
    let file = dir.join("algorithms.toml");
    std::fs::write(&file, toml).unwrap();
    file
}

/// Every algorithm and mode of the guide, over TCP, against the example server with `backend`
/// arguments (none: memory).
async fn every_algorithm_and_mode(backend: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let file = algorithms_config(dir.path());
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(backend);
    let server = start(&args);
    let addr = server.addr;
    let statuses = |n: usize,
                    method: &'static str,
                    path: &'static str,
                    headers: Vec<(&'static str, &'static str)>| async move {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(send(addr, method, path, &headers).await.status);
        }
        out
    };
    let key = |k: &'static str| vec![("x-api-key", k)];

    // Sliding log: 30 a minute.
    let search = statuses(31, "GET", "/search", vec![]).await;
    assert_eq!(
        search.iter().filter(|s| **s == 200).count(),
        30,
        "{search:?}"
    );
    assert_eq!(search[30], 429);
    // Fixed window: 100 a minute. 101 at once from a fresh key: the 101st is refused, unless a
    // window boundary fell inside the burst (windows are aligned on the minute) and all 101 passed.
    // Then the next window has just begun, and a burst from another fresh key cannot straddle a
    // boundary again: it must be refused exactly at its 101st.
    let mut export = statuses(101, "GET", "/export", key("k1")).await;
    if export.iter().all(|s| *s == 200) {
        export = statuses(101, "GET", "/export", key("k1-next-window")).await;
    }
    assert!(export[..100].iter().all(|s| *s == 200), "{export:?}");
    assert_eq!(export[100], 429, "the fixed window must bite: {export:?}");
    // Sliding window: about 600 a minute; 600 at once from nothing pass exactly. Across a window
    // boundary the previous window is weighted out as the burst goes on (one unit every 100 ms of
    // it, more on a slow machine); then, as above, a burst from another fresh key in the window
    // that has just begun cannot straddle a boundary again, and must pass exactly 600.
    let passed = |feed: &[u16]| feed.iter().filter(|s| **s == 200).count();
    let mut feed = statuses(602, "GET", "/feed", key("k1")).await;
    if passed(&feed) > 600 {
        feed = statuses(602, "GET", "/feed", key("k1-next-window")).await;
    }
    assert_eq!(passed(&feed), 600, "{feed:?}");
    assert_eq!(feed[600..], [429, 429]);

    // Concurrency: 2 at a time. Rather than guess when the two slow requests have reached the
    // server, wait for the event: the limiter counted both as allowed, so both hold their slot
    // (asking with a third request instead would race them for the slots).
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(send(addr, "GET", "/download/a?sleep_ms=3000", &[])))
        .collect();
    while allowed_total(addr, "downloads").await < 2.0 {
        assert!(
            !slow.iter().any(|s| s.is_finished()),
            "a slow download finished before both were admitted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let third = send(addr, "GET", "/download/b", &[]).await;
    assert_eq!(third.status, 429);
    assert_eq!(third.header("retry-after"), Some("1"));
    for s in slow {
        assert_eq!(s.await.unwrap().status, 200);
    }
    // The slots come back once the slow bodies are sent: on Redis, by a release that may land
    // just after the client read the body, so wait for it (generously) rather than race it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while send(addr, "GET", "/download/c", &[]).await.status != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slots never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Delay: bursts of 5, then waits of 200 ms each, up to 2 s.
    let mut delays = Vec::new();
    let mut round_trips = Vec::new();
    let first_sent = std::time::Instant::now();
    for _ in 0..7 {
        let sent = std::time::Instant::now();
        let reply = send(addr, "POST", "/login", &[]).await;
        round_trips.push(sent.elapsed());
        assert_eq!(reply.status, 200);
        let delayed: u64 = reply
            .body
            .rsplit("delayed_ms=")
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        delays.push(delayed);
    }
    let all_sent = first_sent.elapsed();
    assert_eq!(delays[..5], [0; 5]);
    // Bounds a busy machine cannot break (slowness only shortens waits and lengthens times):
    // the 7th is due two intervals after the burst began, so it cannot be answered sooner
    // (10 ms of slack for the ms the server truncates and the clocks' granularity) ...
    assert!(
        all_sent >= Duration::from_millis(390),
        "7 logins in {all_sent:?}: {delays:?}"
    );
    // ... each wait is at most one interval (its predecessor was admitted at most one interval
    // before it) and was really waited: the reply took at least as long as it says it waited.
    for i in 5..7 {
        assert!(delays[i] <= 200, "{delays:?}");
        assert!(
            round_trips[i] >= Duration::from_millis(delays[i]),
            "{round_trips:?} {delays:?}"
        );
    }

    // Dry run: never rejects, tells the handler.
    let trial = statuses(25, "GET", "/comments", vec![("x-user-id", "u")]).await;
    assert!(trial.iter().all(|s| *s == 200));
    let last = send(addr, "GET", "/comments", &[("x-user-id", "u")]).await;
    assert!(
        last.body
            .contains("allowed=false remaining=0 enforced=false"),
        "{}",
        last.body
    );

    // Stacked quotas and tiers.
    let api = send(addr, "GET", "/api/items", &key("k2")).await;
    assert_eq!(
        api.header("ratelimit-policy"),
        Some(r#""api.1s";q=10;w=1, "api.1d";q=1000;w=86400"#)
    );
    // A burst of 10, then one every 100 ms: 11 requests in a row from a fresh key pass 10, plus
    // one for every 100 ms they took (a busy machine took more than 100 ms for them once).
    let sent = std::time::Instant::now();
    let free = statuses(11, "GET", "/api/items", key("k3")).await;
    let refilled = (sent.elapsed().as_millis() / 100) as usize;
    let passed = free.iter().filter(|s| **s == 200).count();
    assert!(
        (10..=10 + refilled).contains(&passed),
        "{passed} passed in {:?}: {free:?}",
        sent.elapsed()
    );
    if refilled == 0 {
        assert_eq!(free[10], 429, "{free:?}");
    }
    let paid = send(
        addr,
        "GET",
        "/api/items",
        &[("x-api-key", "k3"), ("x-plan", "paid")],
    )
    .await;
    assert_eq!(paid.status, 200);
    assert!(paid.body.contains("(tier paid)"), "{}", paid.body);
}

#[tokio::test]
async fn every_algorithm_and_mode_in_memory() {
    every_algorithm_and_mode(&[]).await;
}

#[tokio::test]
async fn every_algorithm_and_mode_on_redis_with_redis_cell_loaded() {
    let redis = redis_support::RedisServer::start_with_cell();
    every_algorithm_and_mode(&["--redis", &redis.url()]).await;
}

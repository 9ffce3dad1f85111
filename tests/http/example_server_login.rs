//! The example server's `/login` route, keyed by the JSON body's `username` (its built-in config),
//! over TCP; and its memory with 2,000 requests in flight, each holding a body at the cap.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::example_server::start;

/// `POST path` with a JSON `body`; the status.
pub(crate) async fn post_json(addr: SocketAddr, path: &str, body: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    status_of(&mut stream).await
}

async fn status_of(stream: &mut TcpStream) -> u16 {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8_lossy(&raw);
    raw.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_built_in_login_route_limits_each_username_from_the_json_body() {
    let server = start(&[]);
    let login = |user: &str| format!(r#"{{"username":{user},"password":"hunter2"}}"#);
    for _ in 0..5 {
        assert_eq!(
            post_json(server.addr, "/login", &login(r#""alice""#)).await,
            200
        );
    }
    // The same user re-spelled with escapes shares the budget; another user has their own.
    for alice in [r#""alice""#, r#""\u0061lice""#, r#""al\u0069\u0063e""#] {
        assert_eq!(post_json(server.addr, "/login", &login(alice)).await, 429);
    }
    for _ in 0..5 {
        assert_eq!(
            post_json(server.addr, "/login", &login(r#""bob""#)).await,
            200
        );
    }
    // No username, or two: 400.
    assert_eq!(
        post_json(server.addr, "/login", r#"{"password":"x"}"#).await,
        400
    );
    let two = r#"{"username":"carol","username":"alice"}"#;
    assert_eq!(post_json(server.addr, "/login", two).await, 400);
}

/// The server's resident memory, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

const IN_FLIGHT: usize = 2000;
const CAP: usize = 16 * 1024;

/// 2,000 requests in flight at once, each with a body at the cap (16 KiB) of which all but the last
/// byte has arrived: the layer holds them all (reading, within `body_timeout`), so the server's
/// memory is at its worst. It grows by what 2,000 connections and their bodies need, bounded: at
/// most 160 KiB a request (the body, hyper's buffers, the connection's task); the figure is printed
/// (`--nocapture`). Then the last bytes: every request is decided by its username.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_bodies_at_the_cap_keep_the_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("login.toml");
    std::fs::write(
        &config,
        "[[route]]\nname = \"login\"\npath = \"/login\"\nkey = \"json:username\"\ncount = 1\n\
         period = \"1h\"\nmax_body = 16384\nbody_timeout = \"60s\"\n",
    )
    .unwrap();
    let server = start(&["--config", config.to_str().unwrap()]);
    let addr = server.addr;
    let body = |i: usize| {
        let start = format!(r#"{{"username":"user-{i}","padding":""#);
        let end = r#""}"#;
        format!("{start}{}{end}", "x".repeat(CAP - start.len() - end.len()))
    };
    assert_eq!(body(7).len(), CAP);
    // Warm up (the runtime's threads, the allocator's arenas), then the baseline.
    for i in 0..50 {
        assert_eq!(post_json(addr, "/login", &body(IN_FLIGHT + i)).await, 200);
    }
    let before = rss_kib(server.pid());
    let mut held = Vec::new();
    for i in 0..IN_FLIGHT {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let body = body(i);
        let head = format!(
            "POST /login HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {CAP}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&body.as_bytes()[..CAP - 1]).await.unwrap();
        held.push((stream, body));
    }
    // Until the server has read what was sent (its memory stops growing), at most 20 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut peak = rss_kib(server.pid());
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = rss_kib(server.pid());
        if now <= peak || Instant::now() > deadline {
            peak = peak.max(now);
            break;
        }
        peak = now;
    }
    let grown = peak.saturating_sub(before);
    let per_request = grown * 1024 / IN_FLIGHT as u64;
    println!(
        "RSS with {IN_FLIGHT} bodies of {CAP} bytes in flight: {before} KiB before, {peak} KiB \
         held, +{grown} KiB ({per_request} bytes a request)"
    );
    assert!(per_request < 160 * 1024, "{per_request} bytes a request");
    // The last bytes: every request is decided (a fresh username each: admitted).
    let answers = held.into_iter().map(|(mut stream, body)| {
        tokio::spawn(async move {
            stream.write_all(&body.as_bytes()[CAP - 1..]).await.unwrap();
            status_of(&mut stream).await
        })
    });
    for answer in answers.collect::<Vec<_>>() {
        assert_eq!(answer.await.unwrap(), 200);
    }
}

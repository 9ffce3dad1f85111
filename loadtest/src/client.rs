//! A small keep-alive HTTP/1.1 load generator, for machines without wrk: `scripts/loadtest.sh` uses
//! it when `wrk` is not installed (or with `LOAD_CLIENT=builtin`). Its output has wrk's three lines
//! that the script reads.
//!
//! ```text
//! loadtest-client URL CONNECTIONS SECONDS
//! ```
//!
//! One tokio thread (pinned by the script like wrk's `-t1`), CONNECTIONS connections, each sending
//! `GET` and reading the whole response (by `Content-Length`) before the next, as wrk does.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Requests and non-2xx/3xx answers of one connection.
#[derive(Default)]
struct Counts {
    requests: u64,
    failed: u64,
}

async fn connection(addr: String, host: String, path: String, until: Instant) -> Counts {
    let mut counts = Counts::default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes();
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    stream.set_nodelay(true).ok();
    let mut buf = vec![0u8; 64 * 1024];
    let mut filled = 0;
    while Instant::now() < until {
        stream.write_all(&request).await.expect("write");
        // Read until the head is complete, then the body by Content-Length.
        let (head_end, status, length) = loop {
            if let Some(end) = find(&buf[..filled], b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end]).expect("utf-8 head");
                let status: u16 = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .expect("status");
                let length = head
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                break (end + 4, status, length);
            }
            let n = stream.read(&mut buf[filled..]).await.expect("read");
            assert!(n > 0, "the server closed the connection");
            filled += n;
        };
        while filled < head_end + length {
            let n = stream.read(&mut buf[filled..]).await.expect("read");
            assert!(n > 0, "the server closed the connection");
            filled += n;
        }
        buf.copy_within(head_end + length..filled, 0);
        filled -= head_end + length;
        counts.requests += 1;
        if !(200..400).contains(&status) {
            counts.failed += 1;
        }
    }
    counts
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, connections, seconds] = &args[..] else {
        eprintln!("usage: loadtest-client http://HOST:PORT/PATH CONNECTIONS SECONDS");
        std::process::exit(2)
    };
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let connections: usize = connections.parse().expect("CONNECTIONS");
    let duration = Duration::from_secs_f64(seconds.parse().expect("SECONDS"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let start = Instant::now();
    let until = start + duration;
    let totals = rt.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|_| tokio::spawn(connection(host.into(), host.into(), path.into(), until)))
            .collect();
        let mut totals = Counts::default();
        for task in tasks {
            let c = task.await.expect("connection task");
            totals.requests += c.requests;
            totals.failed += c.failed;
        }
        totals
    });
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "  {} requests in {elapsed:.2}s",
        totals.requests
    );
    if totals.failed > 0 {
        println!("  Non-2xx or 3xx responses: {}", totals.failed);
    }
    println!("Requests/sec: {:.2}", totals.requests as f64 / elapsed);
}

//! A minimal HTTP/1.1 load generator for `scripts/loadtest.sh` where `wrk` is not installed: keep-alive
//! connections each sending `GET` and reading the whole response before the next, on one thread,
//! for a fixed time. It prints the lines of wrk's report that the script reads.
//!
//! ```text
//! loadgen -c CONNECTIONS -d SECONDS URL        # URL: http://HOST:PORT/PATH
//! ```
//!
//! Like `wrk -t1`: one event loop (a current-thread tokio runtime), so the load uses one core.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut connections = 32usize;
    let mut seconds = 2u64;
    let mut url = None;
    // wrk's forms: `-c32` or `-c 32`, `-d2s` or `-d 2`.
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        let mut value = |flag: &str| -> String {
            if arg.len() > flag.len() {
                arg[flag.len()..].to_string()
            } else {
                i += 1;
                args[i].clone()
            }
        };
        if arg.starts_with("-c") {
            connections = value("-c").parse().expect("-c takes a number");
        } else if arg.starts_with("-d") {
            seconds = value("-d")
                .trim_end_matches('s')
                .parse()
                .expect("-d takes seconds");
        } else {
            url = Some(arg.to_string());
        }
        i += 1;
    }
    let url = url.expect("usage: loadgen -c CONNECTIONS -d SECONDS http://HOST:PORT/PATH");
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n\r\n").into_bytes();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let non2xx = Arc::new(AtomicU64::new(0));
    let took = runtime.block_on(async {
        let mut tasks = Vec::new();
        let started = Instant::now();
        for _ in 0..connections {
            let (done, total, non2xx) = (done.clone(), total.clone(), non2xx.clone());
            let (authority, request) = (authority.to_string(), request.clone());
            tasks.push(tokio::spawn(async move {
                let mut stream = TcpStream::connect(&authority).await.expect("connect");
                stream.set_nodelay(true).unwrap();
                let mut buf = vec![0u8; 16 * 1024];
                while !done.load(Ordering::Relaxed) {
                    stream.write_all(&request).await.expect("write");
                    let status = read_response(&mut stream, &mut buf).await;
                    total.fetch_add(1, Ordering::Relaxed);
                    if !(200..400).contains(&status) {
                        non2xx.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        done.store(true, Ordering::Relaxed);
        let took = started.elapsed();
        for task in tasks {
            let _ = task.await;
        }
        took
    });
    let total = total.load(Ordering::Relaxed);
    let non2xx = non2xx.load(Ordering::Relaxed);
    println!("  {total} requests in {:.2}s", took.as_secs_f64());
    if non2xx > 0 {
        println!("  Non-2xx or 3xx responses: {non2xx}");
    }
    println!("Requests/sec: {:.2}", total as f64 / took.as_secs_f64());
}

/// Reads one response (headers, then a `Content-Length` or chunked body) and returns its status.
async fn read_response(stream: &mut TcpStream, buf: &mut [u8]) -> u16 {
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..]).await.expect("read");
        assert!(n > 0, "the server closed the connection");
        len += n;
        let Some(end) = find(&buf[..len], b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end]).expect("an ASCII head");
        let status: u16 = head[9..12].parse().expect("a status code");
        let lower = head.to_ascii_lowercase();
        let body_start = end + 4;
        if let Some(at) = lower.find("content-length:") {
            let value = lower[at + 15..].lines().next().unwrap().trim();
            let body: usize = value.parse().expect("a content length");
            while len < body_start + body {
                let n = stream.read(&mut buf[len..]).await.expect("read");
                assert!(n > 0, "the server closed the connection");
                len += n;
            }
        } else if lower.contains("transfer-encoding: chunked") {
            while find(&buf[body_start..len], b"0\r\n\r\n").is_none() {
                let n = stream.read(&mut buf[len..]).await.expect("read");
                assert!(n > 0, "the server closed the connection");
                len += n;
            }
        }
        return status;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

//! A closed-loop HTTP/1.1 load generator in the manner of `wrk -t1`, for machines without wrk:
//! CONNECTIONS keep-alive connections on one thread, each sending `GET /` as soon as the previous
//! response is read, for SECONDS. Prints wrk's lines that scripts/loadtest.sh reads.
//!
//!   loadgen http://127.0.0.1:PORT/ CONNECTIONS SECONDS
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Counts {
    requests: u64,
    non_2xx: u64,
}

async fn connection(addr: String, until: Instant) -> std::io::Result<Counts> {
    let mut stream = TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let request = format!("GET / HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let mut buf = Vec::with_capacity(4096);
    let mut counts = Counts {
        requests: 0,
        non_2xx: 0,
    };
    while Instant::now() < until {
        stream.write_all(request.as_bytes()).await?;
        // Read one response: headers, then Content-Length bytes of body.
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end]).unwrap_or("");
                let status: u16 = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())
                            .flatten()
                    })
                    .unwrap_or(0);
                let total = end + 4 + length;
                if buf.len() >= total {
                    buf.drain(..total);
                    counts.requests += 1;
                    if !(200..300).contains(&status) {
                        counts.non_2xx += 1;
                    }
                    break;
                }
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(counts);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    Ok(counts)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, connections, seconds] = args.as_slice() else {
        eprintln!("usage: loadgen http://HOST:PORT/ CONNECTIONS SECONDS");
        std::process::exit(2);
    };
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let connections: usize = connections.parse().expect("CONNECTIONS");
    let seconds: f64 = seconds.trim_end_matches('s').parse().expect("SECONDS");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (requests, non_2xx, elapsed) = runtime.block_on(async {
        let start = Instant::now();
        let until = start + Duration::from_secs_f64(seconds);
        let tasks: Vec<_> = (0..connections)
            .map(|_| tokio::spawn(connection(addr.clone(), until)))
            .collect();
        let (mut requests, mut non_2xx) = (0, 0);
        for task in tasks {
            match task.await.unwrap() {
                Ok(c) => {
                    requests += c.requests;
                    non_2xx += c.non_2xx;
                }
                Err(e) => eprintln!("loadgen: a connection failed: {e}"),
            }
        }
        (requests, non_2xx, start.elapsed())
    });
    println!("  {requests} requests in {:.2}s", elapsed.as_secs_f64());
    if non_2xx > 0 {
        println!("  Non-2xx or 3xx responses: {non_2xx}");
    }
    println!(
        "Requests/sec: {:.2}",
        requests as f64 / elapsed.as_secs_f64()
    );
}

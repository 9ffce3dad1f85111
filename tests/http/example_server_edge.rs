//! The example server's edge against slow clients: 1,000 connections that send half a request head
//! are closed once `[server] header_read_timeout` has passed, while normal requests keep being
//! served; past `max_connections`, a new connection waits and is then served.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::example_server::{send, start, Server};

fn server(header_read_timeout: &str, max_connections: usize) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.toml");
    std::fs::write(
        &file,
        format!(
            "[server]\nheader_read_timeout = \"{header_read_timeout}\"\nmax_connections = {max_connections}\n\
             [[route]]\nname = \"reply\"\npath = \"/reply\"\nkey = \"header:x-user-id\"\ncount = 1000000\nperiod = \"1s\"\n"
        ),
    )
    .unwrap();
    let server = start(&["--config", file.to_str().unwrap()]);
    (server, dir)
}

/// A connection that sends the start of a request head, one header, and no blank line.
async fn slow_connection(server: &Server) -> TcpStream {
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /reply HTTP/1.1\r\nx-user-id: slow\r\n")
        .await
        .unwrap();
    stream
}

/// Reads until the server closes the connection (EOF or reset), at most until `deadline`: whether
/// it closed in time.
async fn closed_by(mut stream: TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // hyper may answer 408 before closing.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slow_heads_are_closed_within_the_timeout_while_requests_are_served() {
    let timeout = Duration::from_secs(3);
    let (server, _dir) = server("3s", 10_000);
    let opened = Instant::now();
    let mut slow = Vec::with_capacity(1000);
    for _ in 0..1000 {
        slow.push(slow_connection(&server).await);
    }
    // Served meanwhile, every request, while the 1,000 wait for their timeout (for 1 s, or up to
    // the timeout when opening them was slow on a busy machine; 5 requests at least).
    let serve_until = (opened + timeout).min(Instant::now() + Duration::from_secs(1));
    let mut served = 0;
    while served < 5 || Instant::now() < serve_until {
        let reply = tokio::time::timeout(
            Duration::from_secs(2),
            send(server.addr, "POST", "/reply", &[("x-user-id", "normal")]),
        )
        .await
        .expect("a normal request was not answered within 2 s");
        assert_eq!(reply.status, 200, "{}", reply.body);
        served += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Closed by the timeout, with slack for a busy machine: well before the 35 s they stayed open
    // without one.
    let deadline = Instant::now().max(opened + timeout) + Duration::from_secs(5);
    let closed = futures_join_all(slow.into_iter().map(|s| closed_by(s, deadline))).await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(open, 0, "{open} of 1000 slow connections were still open");
    // And the server still serves.
    let reply = send(server.addr, "POST", "/reply", &[("x-user-id", "after")]).await;
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn past_the_connection_cap_a_client_waits_then_is_served() {
    let (server, _dir) = server("1s", 20);
    let mut slow = Vec::new();
    for _ in 0..20 {
        slow.push(slow_connection(&server).await);
    }
    // The 21st connection is accepted once a slow one is closed, and then served.
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        send(server.addr, "POST", "/reply", &[("x-user-id", "patient")]),
    )
    .await
    .expect("the capped server never served the waiting client");
    assert_eq!(reply.status, 200);
    drop(slow);
}

/// Runs the futures together on this task (no extra dependency for `join_all`).
async fn futures_join_all<F: std::future::Future<Output = bool> + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<bool> {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

/// SIGTERM closes the listener at once and an idle keep-alive connection with it: the server exits
/// without waiting out its grace period for a client that sends nothing more.
#[tokio::test]
async fn sigterm_closes_idle_connections_and_the_listener_at_once() {
    let (mut server, _dir) = server("5s", 100);
    let mut idle = TcpStream::connect(server.addr).await.unwrap();
    idle.write_all(b"GET /reply HTTP/1.1\r\nhost: test\r\nx-user-id: idle\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let read = idle.read(&mut buf).await.unwrap();
    assert!(
        buf[..read].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..read])
    );
    let pid = server.pid().to_string();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(term.unwrap().success());
    let closed = closed_by(idle, Instant::now() + Duration::from_secs(3)).await;
    assert!(closed, "the idle connection was kept past the signal");
    assert!(
        server.exited_within(Duration::from_secs(3)),
        "waited out the grace period"
    );
}

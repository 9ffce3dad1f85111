//! Hostile heads at the example server (issue 27): RFC 9112 §3.2's `Host` rules over HTTP/1.x, and
//! an oversized header list over HTTP/2 (h2c, prior knowledge) answered with 431, not a reset.

use std::net::SocketAddr;

use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::example_server::{send, start};

/// The status of a raw request head, sent as it is.
async fn status_of(addr: SocketAddr, head: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw.split(' ')
        .nth(1)
        .unwrap_or_else(|| panic!("no status in {raw:?}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn http_1_1_needs_exactly_one_host() {
    let server = start(&[]);
    let close = "Connection: close\r\n\r\n";
    assert_eq!(
        status_of(server.addr, &format!("GET / HTTP/1.1\r\n{close}")).await,
        400
    );
    assert_eq!(
        status_of(server.addr, &format!("GET /metrics HTTP/1.1\r\n{close}")).await,
        400
    );
    assert_eq!(
        status_of(
            server.addr,
            &format!("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n{close}")
        )
        .await,
        400
    );
    // HTTP/1.0 may omit it; one Host is the normal case.
    assert_eq!(
        status_of(server.addr, &format!("GET / HTTP/1.0\r\n{close}")).await,
        200
    );
    assert_eq!(send(server.addr, "GET", "/", &[]).await.status, 200);
}

#[tokio::test]
async fn an_oversized_http2_header_list_gets_431() {
    let server = start(&[]);
    let stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = |big: usize| {
        http::Request::builder()
            .uri(format!("http://{}/", server.addr))
            .header("x-big", "x".repeat(big))
            .body(Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let small = sender.send_request(request(10)).await.unwrap();
    assert_eq!(small.status(), 200);
    // Over hyper's 16 KiB header list limit (SETTINGS_MAX_HEADER_LIST_SIZE): a 431 response, and
    // the connection serves on.
    let big = sender.send_request(request(20_000)).await.unwrap();
    assert_eq!(big.status(), 431);
    let again = sender.send_request(request(10)).await.unwrap();
    assert_eq!(again.status(), 200);
}

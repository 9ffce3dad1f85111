//! The example server's metered `chat` route over real TCP: `?stream_tokens=N&interval_ms=D`
//! streams server-sent tokens, each charged as it is sent; a client that hangs up mid-stream is
//! charged what it received; out-of-range streams are 400.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::example_server::{admin_addr, json, send, start};

/// What `key` has been charged on the chat route's tokens, read on the admin listener (a peek
/// takes nothing).
async fn tokens_charged(admin: std::net::SocketAddr, key: &str) -> u64 {
    let state = json(
        &send(admin, "GET", &format!("/limits/chat/{key}"), &[])
            .await
            .body,
    );
    let tokens = &state["tiers"][0]["limits"][1];
    assert_eq!(tokens["name"], "chat.tokens", "{state}");
    tokens["limit"].as_u64().unwrap() - tokens["remaining"].as_u64().unwrap()
}

#[tokio::test]
async fn streamed_tokens_are_charged_as_sent_and_a_hang_up_pays_what_it_received() {
    let server = start(&["--admin", "127.0.0.1:0"]);
    let admin = admin_addr(&server);
    let key = [("x-api-key", "k1")];
    let stream = send(
        server.addr,
        "GET",
        "/chat?stream_tokens=20&interval_ms=1",
        &key,
    )
    .await;
    assert_eq!(stream.status, 200);
    for i in 1..=20 {
        assert!(
            stream.body.contains(&format!("data: token {i}\n\n")),
            "{}",
            stream.body
        );
    }
    assert!(!stream.body.contains("data: token 21"));
    // 1,000 an hour: one token back every 3.6 s, so at most one has drained meanwhile.
    let charged = tokens_charged(admin, "k1").await;
    assert!((19..=20).contains(&charged), "{charged}");
    // The fields name both limits.
    let plain = send(server.addr, "GET", "/chat", &[("x-api-key", "k0")]).await;
    assert!(
        plain.body.starts_with("route chat (/chat)"),
        "{}",
        plain.body
    );

    // A client that reads three tokens of a hundred and hangs up.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let request = "GET /chat?stream_tokens=100&interval_ms=200 HTTP/1.1\r\nHost: test\r\nx-api-key: k2\r\n\r\n";
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("data: token 3\n") {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(tcp);
    // The server finds the connection closed at its next write or two, then settles.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut charged = tokens_charged(admin, "k2").await;
    while charged < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never settled: {charged}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        charged = tokens_charged(admin, "k2").await;
    }
    assert!(
        (3..=5).contains(&charged),
        "charged {charged} for 3 tokens received"
    );

    for bad in [
        "stream_tokens=10001",
        "stream_tokens=5&interval_ms=1001",
        "stream_tokens=x",
    ] {
        let r = send(
            server.addr,
            "GET",
            &format!("/chat?{bad}"),
            &[("x-api-key", "k3")],
        )
        .await;
        assert_eq!(r.status, 400, "{bad}");
    }
}

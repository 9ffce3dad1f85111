//! A WebSocket chat limited per user, inside the stream: the upgrade request and every message
//! count against the policy `chat` (5 a second, bursts of 10). The layer limits the upgrades; the
//! handler asks the layer's handle about each message (`ThrottleHandle::check_key`), answers a message
//! over the rate with a notice instead of an echo, and closes a client that keeps flooding
//! (`1008 policy violation`). The same policy, backend, metrics and logs as the HTTP routes.
//!
//! ```text
//! cargo run --example websocket
//! websocat 'ws://127.0.0.1:3000/ws?user=ann'
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tower_throttle::key::{KeySpec, QueryParam};
use tower_throttle::ops::ThrottleHandle;
use tower_throttle::{Key, MemoryBackend, Policy, Quota, ThrottleLayer};

/// Refusals in a row after which a client is closed: it ignores the notices.
const CLOSE_AFTER: u32 = 5;

type Handle = ThrottleHandle<KeySpec, MemoryBackend>;

#[derive(Deserialize)]
struct User {
    user: String,
}

/// The chat at `/ws?user=<name>`.
fn app() -> Router {
    let quota = Quota::per_second(5).with_max_burst(9);
    let policy = Policy::builder("chat")
        .quota(quota)
        .key(KeySpec::from(QueryParam::new("user")))
        .route("/ws")
        .build()
        .expect("a valid policy");
    let layer = ThrottleLayer::new(policy);
    let handle = layer.handle();
    Router::new()
        .route("/ws", get(upgrade))
        .with_state(handle)
        .layer(layer)
}

async fn upgrade(
    ws: WebSocketUpgrade,
    Query(who): Query<User>,
    State(handle): State<Handle>,
) -> Response {
    ws.on_upgrade(move |socket| chat(socket, handle, who.user))
}

/// Echoes each message the user's rate admits; answers the others with a notice, and closes the
/// stream after [`CLOSE_AFTER`] refusals in a row.
async fn chat(mut socket: WebSocket, handle: Handle, user: String) {
    let mut refused = 0;
    while let Some(Ok(message)) = socket.recv().await {
        let text = match message {
            Message::Text(text) => text,
            Message::Close(_) => return,
            _ => continue,
        };
        // The key as the layer counted the upgrade: the query value's own bytes. (`check` reads
        // text as logs show keys, where `org%3Aacme` names `org:acme`: a value a client chose goes
        // in as a `Key`.)
        let key = Key::from(user.as_bytes());
        let reply = match handle.check_key("chat", &key, 1).await {
            Ok(decision) if !decision.allowed => {
                refused += 1;
                if refused >= CLOSE_AFTER {
                    let close = CloseFrame {
                        code: 1008,
                        reason: "message rate exceeded".into(),
                    };
                    let _ = socket.send(Message::Close(Some(close))).await;
                    return;
                }
                let wait = decision.retry_after.unwrap_or(Duration::ZERO);
                format!("slow down: retry in {} ms", wait.as_millis())
            }
            // Admitted, or the limiter failed: the chat goes on.
            _ => {
                refused = 0;
                format!("echo: {text}")
            }
        };
        if socket.send(Message::Text(reply.into())).await.is_err() {
            return;
        }
    }
}

#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .expect("port 3000 is free");
    println!("ws://127.0.0.1:3000/ws?user=<name>");
    axum::serve(
        listener,
        app().into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .expect("the server runs");
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::Message as Frame;

    /// Serves the chat on a free port.
    async fn serve() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app()).await.unwrap() });
        addr
    }

    #[tokio::test]
    async fn a_flooding_client_is_closed_and_a_polite_one_keeps_chatting() {
        let addr = serve().await;
        let url = |user: &str| format!("ws://{addr}/ws?user={user}");
        // The flood: 40 messages at once. The burst (10, less the upgrade's unit) is echoed, then
        // notices, then the close.
        let started = tokio::time::Instant::now();
        let (mut flood, _) = tokio_tungstenite::connect_async(url("mallory"))
            .await
            .unwrap();
        for i in 0..40 {
            if flood.send(Frame::text(format!("spam {i}"))).await.is_err() {
                break;
            }
        }
        let (mut echoes, mut notices, mut closed) = (0, 0, None);
        while let Some(Ok(frame)) = flood.next().await {
            match frame {
                Frame::Text(text) if text.starts_with("echo: ") => echoes += 1,
                Frame::Text(text) if text.starts_with("slow down") => notices += 1,
                Frame::Close(frame) => {
                    closed = frame;
                    break;
                }
                _ => {}
            }
        }
        let closed = closed.expect("the flooding client is closed");
        assert_eq!(closed.code, CloseCode::Policy);
        assert_eq!(closed.reason.as_str(), "message rate exceeded");
        // The burst, less the upgrade; plus one per 200 ms the flood took (5 a second refill).
        let refilled = (started.elapsed().as_millis() / 200) as u32;
        assert!(
            (9..=9 + refilled).contains(&echoes),
            "{echoes} echoes, {refilled} refilled"
        );
        assert!(notices >= CLOSE_AFTER - 1, "{notices} notices");

        // A polite user, at 4 a second (under 5): every message echoed, the stream stays open.
        let (mut polite, _) = tokio_tungstenite::connect_async(url("ann")).await.unwrap();
        for i in 0..12 {
            polite
                .send(Frame::text(format!("hello {i}")))
                .await
                .unwrap();
            let reply = polite.next().await.unwrap().unwrap();
            assert_eq!(reply, Frame::text(format!("echo: hello {i}")));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        polite.close(None).await.unwrap();
    }

    /// A user whose name reads like a key as logs show it (`org%3Aacme`) spends its own quota, not
    /// that of the user that name would render (`org:acme`).
    #[tokio::test]
    async fn a_name_that_reads_as_a_logged_key_spends_its_own_quota() {
        let addr = serve().await;
        let url = |user: &str| format!("ws://{addr}/ws?user={user}");
        let (mut flood, _) = tokio_tungstenite::connect_async(url("org%253Aacme"))
            .await
            .unwrap();
        for i in 0..40 {
            if flood.send(Frame::text(format!("spam {i}"))).await.is_err() {
                break;
            }
        }
        while let Some(Ok(frame)) = flood.next().await {
            if let Frame::Close(_) = frame {
                break;
            }
        }
        let (mut victim, _) = tokio_tungstenite::connect_async(url("org%3Aacme"))
            .await
            .expect("the upgrade of org:acme is admitted");
        victim.send(Frame::text("hello")).await.unwrap();
        let reply = victim.next().await.unwrap().unwrap();
        assert_eq!(reply, Frame::text("echo: hello"));
    }
}

//! An LLM proxy limited in requests *and* tokens: 60 requests and 10,000 tokens a minute per API
//! key. Each request reserves its `max_tokens` and its prompt's tokens (a token per 4 bytes of
//! the body: an estimate; `max_tokens` bounds only the answer), read by a small middleware before
//! the limiter, and is settled to the upstream's `usage.total_tokens` once answered (from its JSON,
//! or from the last event of a stream that reports usage), so a request that used less gives the
//! rest back and one that used more leaves the key in debt.
//!
//! ```text
//! cargo run --example llm_proxy
//! curl -i localhost:3000/v1/chat/completions -H 'x-api-key: k1' \
//!      -d '{"max_tokens": 400, "messages": [{"role": "user", "content": "hello there"}]}'
//! ```
//!
//! The upstream is a stand-in served by the example itself (on another port), answering as an
//! OpenAI-compatible API does; `UPSTREAM=http://127.0.0.1:8000/v1/chat/completions` points the
//! proxy at another over plain HTTP (a local model server: vLLM, Ollama, llama.cpp), passing on
//! the request's `Authorization`. The guide's page "Limiting tokens for an LLM API"
//! (`tower_throttle::guide::llm_tokens`) walks through it.

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tower_throttle::key::Header;
use tower_throttle::{Estimate, Limit, Meter, Policy, Quota, ThrottleLayer};

/// The largest request body the proxy reads (to find `max_tokens`).
const MAX_BODY: usize = 1 << 20;

/// What a request may cost, from its JSON body: the reservation.
#[derive(Clone, Copy)]
struct Reservation(u64);

#[derive(Clone)]
struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
}

#[tokio::main]
async fn main() {
    let url = match std::env::var("UPSTREAM") {
        Ok(url) => url,
        Err(_) => {
            let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!(
                "http://{}/v1/chat/completions",
                upstream.local_addr().unwrap()
            );
            tokio::spawn(async move { axum::serve(upstream, fake_llm()).await.unwrap() });
            url
        }
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("LLM proxy on http://{}", listener.local_addr().unwrap());
    axum::serve(listener, proxy(url)).await.unwrap();
}

/// The proxy: `max_tokens` is read first, then the limiter reserves it, then the handler
/// forwards the request and reports the upstream's usage on the meter.
fn proxy(url: String) -> Router {
    let chat = Policy::builder("chat")
        .key(Header::new("x-api-key"))
        .quota(Quota::per_minute(60))
        .metered(
            Limit::new("chat.tokens", Quota::per_minute(10_000)).unwrap(),
            Estimate::from_fn(|parts| parts.extensions.get::<Reservation>().map_or(1_000, |r| r.0)),
        )
        .build()
        .unwrap();
    let limiter = ThrottleLayer::builder()
        .policy(chat)
        .openai_headers(true)
        .build()
        .unwrap();
    let upstream = Upstream {
        client: Client::builder(TokioExecutor::new()).build_http(),
        url,
    };
    Router::new()
        .route("/v1/chat/completions", post(forward))
        .with_state(upstream)
        .layer(limiter)
        // Outermost: runs before the limiter, so the estimate can read what it found.
        .layer(middleware::from_fn(read_max_tokens))
}

/// Reads the JSON body's `max_tokens` (1,000 without it), plus a token per 4 bytes of the body
/// for the prompt, into a [`Reservation`] extension, and passes the body on.
async fn read_max_tokens(request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = to_bytes(body, MAX_BODY).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "body too large\n").into_response();
    };
    let max_tokens = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["max_tokens"].as_u64())
        .unwrap_or(1_000);
    let prompt = bytes.len().div_ceil(4) as u64;
    parts
        .extensions
        .insert(Reservation(max_tokens.saturating_add(prompt)));
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Forwards the request upstream, and reports its `usage.total_tokens` on the meter: the
/// reservation is settled to it when this response has been sent.
async fn forward(
    State(upstream): State<Upstream>,
    Extension(meter): Extension<Meter>,
    request: Request,
) -> Response {
    let authorization_sent = request.headers().get(header::AUTHORIZATION).cloned();
    let Ok(body) = to_bytes(request.into_body(), MAX_BODY).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let mut call =
        axum::http::Request::post(&upstream.url).header(header::CONTENT_TYPE, "application/json");
    if let Some(authorization) = authorization_sent {
        call = call.header(header::AUTHORIZATION, authorization);
    }
    let Ok(call) = call.body(Full::new(body)) else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let answer = match upstream.client.request(call).await {
        Ok(answer) => answer,
        // Nothing reported: the reservation stands.
        Err(_) => return StatusCode::BAD_GATEWAY.into_response(),
    };
    let status = answer.status();
    // JSON, or a stream's events (`text/event-stream`), passed on as they came, once whole (a
    // proxy that streams them on would set the meter from the last one as it passes).
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let Ok(bytes) = answer.into_body().collect().await.map(|b| b.to_bytes()) else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    if let Some(total) = total_tokens(&bytes) {
        meter.set(total);
    }
    let mut response = (status, bytes).into_response();
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    response
}

/// The upstream's `usage.total_tokens`: in its JSON answer, or in the last `data:` event of a
/// stream that reports usage (`"stream_options": {"include_usage": true}`).
fn total_tokens(body: &[u8]) -> Option<u64> {
    let total =
        |json: &[u8]| serde_json::from_slice::<Value>(json).ok()?["usage"]["total_tokens"].as_u64();
    total(body).or_else(|| {
        let mut events = body
            .rsplit(|b| *b == b'\n')
            .filter_map(|l| l.strip_prefix(b"data:"));
        events.find_map(|event| total(event.trim_ascii()))
    })
}

/// A stand-in for an OpenAI-compatible API: answers with up to `max_tokens` words, and counts a
/// token per word of the prompt and of the answer.
fn fake_llm() -> Router {
    Router::new().route(
        "/v1/chat/completions",
        post(|Json(request): Json<Value>| async move {
            let prompt: u64 = request["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["content"].as_str())
                .map(|c| c.split_whitespace().count() as u64)
                .sum();
            let max = request["max_tokens"].as_u64().unwrap_or(1_000);
            let words = [
                "the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog",
            ];
            let reply: Vec<&str> = words
                .iter()
                .cycle()
                .take(max.min(200) as usize)
                .copied()
                .collect();
            let completion = reply.len() as u64;
            Json(json!({
                "choices": [{"message": {"role": "assistant", "content": reply.join(" ")}}],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }))
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// Through the proxy: a request reserving its 400 `max_tokens` and its prompt's tokens (a
    /// quarter of its body's bytes) that used 202 is charged 202.
    #[tokio::test]
    async fn the_reservation_is_settled_to_the_upstream_usage() {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/v1/chat/completions",
            upstream.local_addr().unwrap()
        );
        tokio::spawn(async move { axum::serve(upstream, fake_llm()).await.unwrap() });
        let app = proxy(url);
        let body =
            r#"{"max_tokens": 400, "messages": [{"role": "user", "content": "hello there"}]}"#;
        let reserved = 400 + body.len().div_ceil(4) as u64;
        let ask = || {
            axum::http::Request::post("/v1/chat/completions")
                .header("x-api-key", "k1")
                .body(Body::from(body))
                .unwrap()
        };
        let first = app.clone().oneshot(ask()).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        // At admission the reservation was taken.
        let left = (10_000 - reserved).to_string();
        assert_eq!(
            first.headers()["x-ratelimit-remaining-tokens"],
            left.as_str()
        );
        first.into_body().collect().await.unwrap();
        let second = app.clone().oneshot(ask()).await.unwrap();
        // 202 (2 + 200) charged, then the reservation taken again. The rest of the first comes
        // back whole (the key is busy for longer than the request took), and a token drains every
        // 6 ms meanwhile.
        let remaining: u64 = second.headers()["x-ratelimit-remaining-tokens"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let exact = 10_000 - 202 - reserved;
        // (A loaded machine's round trips to the upstream may take a few hundred ms.)
        assert!((exact..=exact + 500).contains(&remaining), "{remaining}");
    }

    #[test]
    fn usage_is_read_from_an_answer_or_the_last_event_of_a_stream() {
        let answer = br#"{"choices": [], "usage": {"total_tokens": 12}}"#;
        assert_eq!(total_tokens(answer), Some(12));
        let stream = b"data: {\"choices\": [{\"delta\": {\"content\": \"hi\"}}]}\n\ndata: {\"choices\": [], \"usage\": {\"total_tokens\": 7}}\n\ndata: [DONE]\n\n";
        assert_eq!(total_tokens(stream), Some(7));
        assert_eq!(total_tokens(b"data: [DONE]\n\n"), None);
    }
}

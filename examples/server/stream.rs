//! `?stream_tokens=N&interval_ms=D` on any route: N server-sent events (`data: token i`), one token
//! each, D ms apart, each reported on the request's [`Meter`] as it is sent — so `curl -N` shows a
//! metered token limit at work, and an interrupted curl is charged the tokens it received.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use tokio::time::{Instant, Sleep};
use tower_throttle::Meter;

/// The most tokens one request may ask for.
const MAX_TOKENS: u64 = 10_000;
/// The longest pause between two tokens.
const MAX_INTERVAL_MS: u64 = 1_000;

/// The stream a query asks for: `None` without `stream_tokens`, a 400 for what is out of range.
pub fn requested(query: Option<&str>, meter: Option<Meter>) -> Option<Response> {
    let params: Vec<(&str, &str)> = query?
        .split('&')
        .filter_map(|p| p.split_once('='))
        .collect();
    let value = |name: &str| params.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let tokens = value("stream_tokens")?;
    let bad = |why: String| Some((StatusCode::BAD_REQUEST, why + "\n").into_response());
    let Some(tokens) = tokens.parse::<u64>().ok().filter(|n| *n <= MAX_TOKENS) else {
        return bad(format!(
            "stream_tokens must be a whole number up to {MAX_TOKENS}"
        ));
    };
    let interval = match value("interval_ms").map(str::parse::<u64>) {
        None => 0,
        Some(Ok(ms)) if ms <= MAX_INTERVAL_MS => ms,
        Some(_) => {
            return bad(format!(
                "interval_ms must be a whole number up to {MAX_INTERVAL_MS}"
            ))
        }
    };
    let body = Tokens {
        left: tokens,
        sent: 0,
        interval: Duration::from_millis(interval),
        pause: None,
        meter,
    };
    Some(
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::new(body),
        )
            .into_response(),
    )
}

/// The events still to send; the pause before the next one.
struct Tokens {
    left: u64,
    sent: u64,
    interval: Duration,
    pause: Option<Pin<Box<Sleep>>>,
    meter: Option<Meter>,
}

impl http_body::Body for Tokens {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        if let Some(pause) = self.pause.as_mut() {
            ready!(pause.as_mut().poll(cx));
        }
        let next = Instant::now() + self.interval;
        match self.pause.as_mut() {
            Some(pause) => pause.as_mut().reset(next),
            None => self.pause = Some(Box::pin(tokio::time::sleep_until(next))),
        }
        self.left -= 1;
        self.sent += 1;
        // Reported as it goes out: a client that hangs up is charged what it was sent.
        if let Some(meter) = &self.meter {
            meter.add(1);
        }
        let event = format!("data: token {}\n\n", self.sent);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}

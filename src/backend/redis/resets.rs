//! Resets heard by every process sharing the Redis: a [reset](crate::Backend::reset) publishes the
//! keys it deleted on the channel `prefix:resets` (`PUBLISH`, which a Cluster broadcasts to every
//! node), and every backend with the same prefix listens there and drops those keys from its deny
//! cache and budget slices. The penalty box lives in Redis (`…:strikes`, `…:ban`, deleted by the
//! reset itself); what a process remembers of a ban is its deny cache's entry.
//!
//! A process that was not listening when a reset was published (its subscription dropped, Redis
//! restarted) cannot know which keys it missed: each time the subscription is (re)made, it drops
//! its whole deny cache and every slice, which only sends more decisions to Redis.
//!
//! The listener holds its own connection (pub/sub takes a connection whole), to the server the
//! backend was given, or to the Cluster's seed nodes in turn. Backends reached through Sentinel, a
//! user's connection manager or a user's Cluster client do not listen (they still publish).

use std::pin::Pin;
use std::sync::Weak;
use std::time::Duration;

use futures_core::Stream;
use redis::aio::ConnectionLike;
use redis::{Client, Msg};

use super::connection::RedisConnection;
use super::state::RedisState;

/// The channel of `prefix`'s resets.
pub(super) fn channel(prefix: &str) -> String {
    format!("{prefix}:resets")
}

/// Tells the other processes that `keys` were reset. Best effort: the reset itself is done, and a
/// process that misses this message drops its caches when it subscribes again.
pub(super) async fn publish(conn: &mut RedisConnection, prefix: &str, keys: &[String]) {
    let mut cmd = redis::cmd("PUBLISH");
    cmd.arg(channel(prefix)).arg(keys.join("\n"));
    if let Err(e) = conn.redirecting().req_packed_command(&cmd).await {
        tracing::warn!(error = %e, "a reset could not be published to the other processes");
    }
}

/// Reconnects back off from 50 ms to 1 s.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Listens for `state`'s resets on `nodes` (tried in turn) for as long as the backend lives.
pub(super) fn spawn_listener(nodes: Vec<Client>, state: Weak<RedisState>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if nodes.is_empty() {
        return;
    }
    runtime.spawn(async move {
        let mut backoff = BACKOFF_MIN;
        for node in nodes.iter().cycle() {
            let Some(channel) = state.upgrade().map(|s| channel(&s.prefix)) else {
                return;
            };
            if let Ok(mut pubsub) = node.get_async_pubsub().await {
                if pubsub.subscribe(&channel).await.is_ok() {
                    backoff = BACKOFF_MIN;
                    // Whatever was published while not subscribed is lost: forget everything.
                    match state.upgrade() {
                        Some(strong) => forget_all(&strong),
                        None => return,
                    }
                    let mut messages = pubsub.into_on_message();
                    while let Some(message) = next(&mut messages, &state).await {
                        let Some(strong) = state.upgrade() else {
                            return;
                        };
                        forget(&strong, &message);
                    }
                    if state.strong_count() == 0 {
                        return;
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    });
}

/// The next message, or `None` when the subscription ends or the backend is gone (looked at every
/// second while no message comes).
async fn next<S>(messages: &mut S, state: &Weak<RedisState>) -> Option<Msg>
where
    S: Stream<Item = Msg> + Unpin,
{
    loop {
        let poll = std::future::poll_fn(|cx| Pin::new(&mut *messages).poll_next(cx));
        match tokio::time::timeout(Duration::from_secs(1), poll).await {
            Ok(message) => return message,
            Err(_) if state.strong_count() == 0 => return None,
            Err(_) => {}
        }
    }
}

/// Drops the keys a reset names from this process's deny cache and budget slices.
fn forget(state: &RedisState, message: &Msg) {
    let Ok(payload) = std::str::from_utf8(message.get_payload_bytes()) else {
        return;
    };
    for key in payload.split('\n') {
        state.budgets.forget(key);
        if let Some(deny) = &state.deny {
            deny.forget(key);
        }
    }
}

/// Drops the whole deny cache and every slice.
fn forget_all(state: &RedisState) {
    state.budgets.forget_all();
    if let Some(deny) = &state.deny {
        deny.clear();
    }
}

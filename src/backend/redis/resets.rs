//! Resets, reloads and records heard by every process sharing the Redis: a reset publishes the
//! keys it deleted on `prefix:resets` (`SPUBLISH` on a Cluster), a reload the limits it changed
//! (every backend drops its cached rejections and slices under them), records.rs a table's name.
//! What a process missed while not listening is unknown: each subscription drops everything.
//!
//! The listener holds a connection of its own: to the server, or the primary the sentinels name (a
//! demoted one still hears: Redis replicates `PUBLISH`); on a Cluster, a RESP3 Cluster connection,
//! which redis-rs moves with the slot. A connection given as it is cannot lend one (redis-rs
//! subscribes only with RESP3 and a push sender): `listen_with` says where, or it only publishes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::SentinelClient;
use redis::{Client, ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::oneshot;

use super::conn::connection::RedisConnection;
use super::state::RedisState;
use crate::backoff::Backoff;
use crate::error::redact_url;

pub(super) fn channel(prefix: &str) -> String {
    format!("{prefix}:resets")
}

/// The first line of a reload's message, before the limits' names; a reset's message is keys,
/// which start with the prefix (which cannot hold `!`).
const RELOAD: &str = "!reload";

/// The first line of a message of records (records.rs) changed; the table's name follows.
pub(super) const RECORDS: &str = "!records\n";

/// A reload changed the limits `changed`: drops what is cached under them, and tells the others.
pub(super) fn reloaded(state: &RedisState, changed: &[&str]) {
    forget_limits(state, changed.iter().copied());
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("a reload outside a tokio runtime is not published to the other processes");
        return;
    };
    let mut message = String::from(RELOAD);
    for name in changed {
        message.push('\n');
        message.push_str(name);
    }
    let cmd = publish_cmd(&state.conn, &state.prefix, message);
    let (mut conn, timeout) = (state.conn.clone(), state.timeout);
    runtime.spawn(async move {
        let sent = tokio::time::timeout(timeout * 10, cmd.query_async::<()>(&mut conn));
        if !matches!(sent.await, Ok(Ok(()))) {
            tracing::warn!("a reload could not be published to the other processes");
        }
    });
}

/// `PUBLISH`, or `SPUBLISH` on a Cluster (routed, as a key would be, by the channel's slot).
pub(super) fn publish_cmd(conn: &RedisConnection, prefix: &str, message: String) -> redis::Cmd {
    let mut cmd = redis::cmd(if conn.is_cluster() {
        "SPUBLISH"
    } else {
        "PUBLISH"
    });
    cmd.arg(channel(prefix)).arg(message);
    cmd
}

/// Where a backend listens.
pub(super) enum Listen {
    /// Servers tried in turn (the one server).
    Nodes(Vec<Client>),
    /// The primary the sentinels name now.
    Sentinel(Box<SentinelClient>),
    /// A Cluster, from these seed nodes (sharded pub/sub).
    Shard(Vec<ConnectionInfo>),
}

/// What a subscription hears: its confirmation (again after a reconnection), or a message.
enum Heard {
    Subscribed,
    Message(Vec<u8>),
}

/// A subscription's events, polled by [`next`].
type Hearing = Box<dyn FnMut(&mut Context<'_>) -> Poll<Option<Heard>> + Send>;

impl Listen {
    /// Subscribes to `channel` on the server of attempt `turn`, or on the Cluster.
    async fn subscribe(
        &mut self,
        turn: usize,
        channel: &str,
        state: &Weak<RedisState>,
    ) -> Result<Hearing, String> {
        let client = match self {
            Listen::Shard(seeds) => return subscribe_sharded(seeds, channel).await,
            Listen::Nodes(nodes) if nodes.is_empty() => None,
            Listen::Nodes(nodes) => Some(nodes[turn % nodes.len()].clone()),
            Listen::Sentinel(sentinel) => sentinel.async_get_client().await.ok(),
        };
        let client = client.ok_or("no server to listen on")?;
        // With Sentinel, the primary decisions are sent to may change while this one still
        // answers (demoted, it hears nothing published on the new one): followed.
        let elsewhere = matches!(self, Listen::Sentinel(_))
            .then(|| redact_url(&client.get_connection_info().addr().to_string()))
            .map(|here| follow_primary(here, state.clone()));
        let pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
        let (mut sink, mut messages) = pubsub.split();
        sink.subscribe(channel).await.map_err(|e| e.to_string())?;
        let ping = move || {
            let mut sink = sink.clone();
            async move { sink.ping::<Value>().await.is_ok() }
        };
        let mut lost = keep_alive(ping, elsewhere);
        let mut confirmed = false;
        Ok(Box::new(move |cx| {
            if !std::mem::replace(&mut confirmed, true) {
                return Poll::Ready(Some(Heard::Subscribed));
            }
            if Pin::new(&mut lost).poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            let message = Pin::new(&mut messages).poll_next(cx);
            message.map(|m| m.map(|m| Heard::Message(m.get_payload_bytes().to_vec())))
        }))
    }
}

/// How often a subscription's connection is pinged, and how long its answer may take.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Pings the subscription's connection every [`KEEP_ALIVE`] (`ping`: whether it answered): a
/// connection lost without a word (a NAT's or balancer's idle timeout, a partition, a frozen
/// node) delivers nothing, and would keep this process deaf to the others' resets, reloads and
/// overrides for good. The receiver hears the first ping that fails (the subscription is made
/// again); the task ends with it.
fn keep_alive<P, F>(
    mut ping: P,
    elsewhere: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
) -> oneshot::Receiver<()>
where
    P: FnMut() -> F + Send + 'static,
    F: Future<Output = bool> + Send,
{
    let (lost, heard) = oneshot::channel();
    let mut elsewhere = elsewhere.unwrap_or_else(|| Box::pin(std::future::pending()));
    tokio::spawn(async move {
        let mut lost = lost;
        loop {
            tokio::select! {
                () = lost.closed() => return,
                () = &mut elsewhere => break,
                () = tokio::time::sleep(KEEP_ALIVE) => {}
            }
            let pinged = tokio::time::timeout(KEEP_ALIVE, ping()).await;
            if !matches!(pinged, Ok(true)) {
                break;
            }
        }
        let _ = lost.send(());
    });
    heard
}

/// Ends once the backend's connection has moved, since the subscription was made, to another
/// primary than `here` (the sentinels named a new one), or the backend is gone; looked at every
/// second, as the connection follows the sentinels. (Only a move ends it: a backend still on its
/// old address while the listener is on the new one is left to catch up.)
fn follow_primary(
    here: String,
    state: Weak<RedisState>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let address = |state: &RedisState| match &state.conn {
        RedisConnection::Server(server) => server.attempts.snapshot().0,
        _ => None,
    };
    let before = state.upgrade().and_then(|state| address(&state));
    Box::pin(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(state) = state.upgrade() else { return };
            let now = address(&state);
            if now.is_some() && now != before && now.as_deref() != Some(here.as_str()) {
                return;
            }
        }
    })
}

/// Sharded pub/sub on a Cluster: one RESP3 Cluster connection whose pushes come here; each
/// `ssubscribe` push confirms a subscription (made again after a disconnection), an `sunsubscribe`
/// ends it (its slot moved).
async fn subscribe_sharded(seeds: &[ConnectionInfo], channel: &str) -> Result<Hearing, String> {
    let (sender, mut pushes) = tokio::sync::mpsc::unbounded_channel::<PushInfo>();
    let client = ClusterClientBuilder::new(seeds.to_vec())
        .use_protocol(ProtocolVersion::RESP3)
        .push_sender(sender)
        .build()
        .map_err(|e| e.to_string())?;
    let mut conn = client
        .get_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    conn.ssubscribe(channel).await.map_err(|e| e.to_string())?;
    // Pinged on the node that owns the channel's slot: redis-rs keeps one connection a node, the
    // one the pushes come on (a plain PING would go to every primary, and fail with any of them).
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        channel,
        SlotAddr::Master,
    )));
    let pinger = conn.clone();
    let ping = move || {
        let (mut conn, route) = (pinger.clone(), route.clone());
        async move { conn.route_command(redis::cmd("PING"), route).await.is_ok() }
    };
    let mut lost = keep_alive(ping, None);
    Ok(Box::new(move |cx| loop {
        // The connection is kept for as long as its pushes are read.
        let _ = &conn;
        if Pin::new(&mut lost).poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        let Some(push) = std::task::ready!(pushes.poll_recv(cx)) else {
            return Poll::Ready(None);
        };
        match (push.kind, push.data.get(1)) {
            (PushKind::SSubscribe, _) => return Poll::Ready(Some(Heard::Subscribed)),
            // The channel's slot moved to another node (a reshard): the node that had it ends the
            // subscription, and redis-rs takes it for ours and never makes it again. Ended here,
            // it is made anew (on the slot's new owner), and what was missed is forgotten.
            (PushKind::SUnsubscribe, _) => return Poll::Ready(None),
            (PushKind::SMessage, Some(Value::BulkString(payload))) => {
                return Poll::Ready(Some(Heard::Message(payload.clone())))
            }
            _ => {}
        }
    }))
}

/// Reconnects back off from 50 ms to 1 s.
const SUBSCRIBING: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// Listens where `listen` says while the backend lives; the receiver hears the first attempt end.
pub(super) fn spawn_listener(
    mut listen: Listen,
    state: Weak<RedisState>,
) -> Option<oneshot::Receiver<()>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    // The end of the first attempt to subscribe, which `connect` waits for (nothing it returns to
    // is cached before the first subscription dropped the caches). Its failure is logged.
    let (done, first) = oneshot::channel();
    let mut done = Some(done);
    // Without a listener too (a Cluster connection of the user's own: nothing is heard).
    runtime.spawn(reread_records(state.clone()));
    if matches!(listen, Listen::Nodes(ref nodes) if nodes.is_empty()) {
        return None;
    }
    runtime.spawn(async move {
        let mut backoff = SUBSCRIBING;
        for turn in 0.. {
            let Some(channel) = state.upgrade().map(|s| channel(&s.prefix)) else {
                return;
            };
            // Bounded: a server that never answers must not stall the listener.
            let subscribing = listen.subscribe(turn, &channel, &state);
            let subscribed = tokio::time::timeout(Duration::from_secs(5), subscribing).await;
            match subscribed.unwrap_or_else(|_| Err("timed out".to_owned())) {
                Ok(mut hearing) => {
                    backoff = SUBSCRIBING;
                    while let Some(event) = next(&mut hearing, &state).await {
                        let Some(strong) = state.upgrade() else {
                            return;
                        };
                        let Heard::Message(payload) = event else {
                            // Subscribed: what it may have missed is forgotten (the first keeps
                            // the slices: they hold units Redis took; at worst one is credited
                            // across a reset at start-up).
                            heard(&strong, None);
                            if let Some(deny) = &strong.deny {
                                deny.forget_prefix("");
                            }
                            match done.take() {
                                Some(done) => drop(done.send(())),
                                None => strong.budgets.forget_prefix(""),
                            }
                            continue;
                        };
                        forget(&strong, &payload);
                    }
                    // The subscription ended: Redis may be gone, and with no request to find out,
                    // health would still say up.
                    let Some(strong) = state.upgrade() else {
                        return;
                    };
                    strong.breaker.recorder.ask_probe();
                }
                Err(why) => {
                    if let Some(done) = done.take() {
                        tracing::warn!(
                            error = why,
                            "cannot listen for other processes' resets yet (SUBSCRIBE); retrying"
                        );
                        let _ = done.send(());
                    }
                }
            }
            tokio::time::sleep(backoff.wait()).await;
        }
    });
    Some(first)
}

/// The next message, or `None` when the subscription ends or the backend is gone.
async fn next<T>(
    poll: &mut impl FnMut(&mut Context<'_>) -> Poll<Option<T>>,
    state: &Weak<RedisState>,
) -> Option<T> {
    loop {
        let poll = std::future::poll_fn(&mut *poll);
        match tokio::time::timeout(Duration::from_secs(1), poll).await {
            Ok(message) => return message,
            Err(_) if state.strong_count() == 0 => return None,
            Err(_) => {}
        }
    }
}

/// Drops what a message names: a reset's keys, a reload's limits, a records table's.
fn forget(state: &RedisState, payload: &[u8]) {
    let Ok(payload) = std::str::from_utf8(payload) else {
        return;
    };
    if let Some(table) = payload.strip_prefix(RECORDS) {
        heard(state, Some(table));
        return;
    }
    let mut lines = payload.split('\n');
    if payload.starts_with(RELOAD) {
        lines.next();
        forget_limits(state, lines);
    } else {
        forget_keys(state, lines);
    }
}

/// Drops the keys a reset deleted from this process's budget slices and deny cache.
pub(super) fn forget_keys<'a>(state: &RedisState, keys: impl Iterator<Item = &'a str>) {
    for key in keys {
        state.budgets.forget(key);
        if let Some(deny) = &state.deny {
            deny.forget(key);
        }
    }
}

/// Drops what is cached under the limits `names`: their keys are `prefix:name:{…}`.
pub(super) fn forget_limits<'a>(state: &RedisState, names: impl Iterator<Item = &'a str>) {
    for name in names {
        let keys = format!("{}:{name}:{{", state.prefix);
        state.budgets.forget_prefix(&keys);
        if let Some(deny) = &state.deny {
            deny.forget_prefix(&keys);
        }
    }
}

/// How often every layer reads its records again unasked.
const REREAD_RECORDS: Duration = Duration::from_secs(60);

/// Tells every layer, every [`REREAD_RECORDS`] while the backend lives, that any table may have
/// changed: a change whose announcement was lost (its writer timed out between writing and
/// telling, a `PUBLISH` refused) is in force everywhere within that time all the same.
async fn reread_records(state: Weak<RedisState>) {
    loop {
        tokio::time::sleep(REREAD_RECORDS).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        heard(&state, None);
    }
}

/// Tells every layer listening that `table` changed (`None`: any may have).
fn heard(state: &RedisState, table: Option<&str>) {
    let mut heard = state
        .records_heard
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    heard.retain(|on_change| on_change(table));
}

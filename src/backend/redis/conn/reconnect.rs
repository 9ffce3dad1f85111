//! The keepers: the task that keeps a [`SingleServer`] connected while its backend lives, each
//! transition logged once; the task that connects a Cluster started by
//! [`build`](crate::redis::RedisBackendBuilder::build) ([`LazyCluster`]) until it has formed
//! (`CLUSTER INFO` says `cluster_state:ok`) and is set up, then installs it and ends (redis-rs
//! reconnects the nodes from then on, as after `connect`); and their one retry loop.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Role};

use super::connection::RedisConnection;
use super::lazy_cluster::LazyCluster;
use super::server::{
    attempt_budget, configuration_error, is_not_primary, open, start_budget, within, AttemptError,
    SingleServer, Source,
};
use super::set_up::{in_service, set_up};
use crate::backend::redis::health::attempts::{Attempts, Misconfigured};
use crate::backend::redis::state::RedisState;
use crate::backend::redis::wire::mode::path_name;
use crate::backoff::Backoff;
use crate::error::{redact_url, BackendError};
use crate::timer::spawn;

/// Connecting (both keepers): every 50 ms, backing off to 500 ms.
const CONNECTING: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
/// While Redis stays down, "still unreachable" is logged at most this often.
const STILL_DOWN_EVERY: Duration = Duration::from_secs(10);
/// The task looks this often whether the backend still exists, while there is nothing to do.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// The wait before reconnecting to a server that refused writes on a connection less than its
/// most (5 s) old, doubling each time in a row.
const SHORT_LIVED: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// Attempts after a configuration error go on this slowly: someone has to fix something first.
const MISCONFIGURED_BACKOFF: Duration = Duration::from_secs(5);
/// A replica where the primary should be is a failover under way this long; then a misconfiguration.
const REPLICA_GRACE: Duration = Duration::from_secs(30);

/// Connects once within `budget` (finds the server, checks it is a primary, sets it up); returns
/// the address.
pub(crate) async fn connect_once(
    source: &mut Source,
    server: &SingleServer,
    state: &RedisState,
    budget: Duration,
) -> Result<String, AttemptError> {
    let target = || format!("Redis ({})", server.target);
    within(budget, target, async {
        let client = source.client().await.map_err(|e| {
            BackendError::with_source(format!("cannot find Redis ({})", server.target), e)
        })?;
        let address = redact_url(&client.get_connection_info().addr().to_string());
        let failed = |what: &str, doing: &str, e: RedisError| match configuration_error(
            &e, &address, doing,
        ) {
            Some(message) => AttemptError::misconfigured(Misconfigured::Fatal, message),
            None => BackendError::with_source(format!("{what} Redis at {address}"), e).into(),
        };
        let mut conn = open(&client, server.timeout)
            .await
            .map_err(|e| failed("cannot connect to", "log in", e))?;
        // The set-up's replies have the attempt's budget: its scripts (about 90 KB) take longer
        // than a decision's timeout on a link that is slow for bytes, not for round trips.
        conn.set_response_timeout(budget);
        match redis::cmd("ROLE").query_async::<Role>(&mut conn).await {
            Ok(Role::Primary { .. }) => {}
            Ok(_) => {
                return Err(AttemptError::misconfigured(
                    Misconfigured::Replica,
                    format!(
                        "Redis at {address} is a replica (read-only), not the primary; point the URL at the primary (or use Sentinel)"
                    ),
                ))
            }
            Err(e) if e.code() == Some("NOAUTH") => return Err(failed("", "run ROLE", e)),
            // `ROLE` may be renamed or forbidden (managed Redis, ACLs): the calls will tell.
            Err(e) if e.code().is_some() && !is_not_primary(&e) => {}
            Err(e) => return Err(failed("ROLE failed on", "run ROLE", e)),
        }
        set_up(&mut conn, None, state)
            .await
            .map_err(|e| AttemptError::described(e.describe(&address)))?;
        conn.set_response_timeout(server.timeout);
        server.install(conn, address.clone());
        in_service(state);
        Ok(address)
    })
    .await
}

/// Keeps `server` connected while the backend lives; `connected`: already (eager start).
pub(crate) fn spawn_keeper(
    mut source: Source,
    server: Arc<SingleServer>,
    state: Weak<RedisState>,
    connected: bool,
) {
    spawn(async move {
        let mut first = !connected;
        let (mut connected_at, mut short_lived) = (Instant::now(), SHORT_LIVED);
        loop {
            // Connected: wait until the connection is dropped, or the backend is.
            let mut since_sentinels = Instant::now();
            while server.connected() {
                // Breaker open on a live connection (calls timed out): probe it often, with a
                // decision (`RedisState::probe`), as often as the breaker lets one through.
                let tripped = state.upgrade().is_some_and(|s| s.breaker.tripped());
                let wait = if tripped {
                    CONNECTING.first()
                } else {
                    IDLE_CHECK
                };
                let _ = tokio::time::timeout(wait, server.lost.notified()).await;
                let Some(strong) = state.upgrade() else {
                    server.close();
                    return;
                };
                if strong.breaker.tripped() {
                    strong.probe().await;
                }
                drop(strong);
                if matches!(source, Source::Sentinel { .. })
                    && since_sentinels.elapsed() >= IDLE_CHECK
                {
                    since_sentinels = Instant::now();
                    // A lost connection interrupts the question: reconnecting comes first.
                    tokio::select! {
                        _ = server.follow_sentinels(&mut source) => {}
                        _ = server.lost.notified() => {}
                    }
                }
            }
            let down_since = Instant::now();
            if !first {
                let why = server.attempts.snapshot().1.map(|(e, _)| e);
                let why = why.unwrap_or_default();
                tracing::warn!(
                    redis = %server.target,
                    error = %why,
                    "lost the Redis connection; reconnecting (requests follow the failure policy meanwhile)"
                );
                if let Some(strong) = state.upgrade() {
                    strong.breaker.recorder.disconnected();
                }
                // A connection that a server refusing writes lost as soon as it was made (it
                // took the set-up: a replica whose `ROLE` is forbidden) is a failed attempt: the
                // next waits, longer each time, no storm of connections and lines. (Not one that
                // the sentinels moved, or a stall dropped.)
                let refused = server.refused_writes.swap(false, Ordering::Relaxed);
                match refused && connected_at.elapsed() < SHORT_LIVED.most() {
                    true => tokio::time::sleep(short_lived.wait()).await,
                    false => short_lived = SHORT_LIVED,
                }
            }
            let mut keep = (source, server.clone());
            let connected = connect_with_backoff(
                &server.target,
                &server.attempts,
                &state,
                &mut first,
                &mut keep,
                attempt_server,
            )
            .await;
            source = keep.0;
            let Some((address, attempts)) = connected else {
                server.close();
                return;
            };
            connected_at = Instant::now();
            if let Some(strong) = state.upgrade() {
                let path = path_name(strong.detector.active_path());
                tracing::info!(
                    redis = %server.target,
                    %address,
                    path,
                    down_ms = down_since.elapsed().as_millis() as u64,
                    attempts,
                    "connected to Redis; rate-limit decisions come from Redis"
                );
            }
        }
    });
}

/// One connection attempt, boxed: attempts are rare.
type Attempt<'a, T> = Pin<Box<dyn Future<Output = Result<T, AttemptError>> + Send + 'a>>;

/// One attempt of a server's keeper: the address connected to.
fn attempt_server(
    (source, server): &mut (Source, Arc<SingleServer>),
    state: Arc<RedisState>,
) -> Attempt<'_, String> {
    Box::pin(async move {
        let budget = attempt_budget(state.timeout);
        connect_once(source, server, &state, budget).await
    })
}

/// Tries `attempt` on `subject` with backoff until it connects, while the backend lives (`None`
/// once gone). A configuration error is said once at error level and retried every 5 s; an
/// outage's first failure (`first`) once, then "still unreachable" at most every 10 s.
async fn connect_with_backoff<S, T>(
    target: &str,
    record: &Attempts,
    state: &Weak<RedisState>,
    first: &mut bool,
    subject: &mut S,
    attempt: fn(&mut S, Arc<RedisState>) -> Attempt<'_, T>,
) -> Option<(T, u64)> {
    let down_since = Instant::now();
    let mut backoff = CONNECTING;
    let mut last_said = Instant::now();
    let mut attempts = 0u64;
    let mut said_misconfigured: Option<Misconfigured> = None;
    let mut replica_since: Option<Instant> = None;
    loop {
        let strong = state.upgrade()?;
        let (error, misconfigured) = match attempt(subject, strong.clone()).await {
            Ok(connected) => {
                *first = false;
                return Some((connected, attempts + 1));
            }
            Err(AttemptError {
                error,
                misconfigured,
            }) => (error.to_string(), misconfigured),
        };
        // A connection is recorded as it is put in service.
        record.failed(error.clone(), misconfigured.clone());
        attempts += 1;
        let first_failure = std::mem::take(first);
        if first_failure {
            strong.breaker.recorder.disconnected();
        }
        match misconfigured {
            Some(wrong)
                if !matches!(wrong, Misconfigured::Replica(_))
                    || replica_since.get_or_insert_with(Instant::now).elapsed()
                        >= REPLICA_GRACE =>
            {
                // Redis answered and refused: said once (again if it changes), retried slowly.
                if said_misconfigured.as_ref() != Some(&wrong) {
                    tracing::error!(
                        redis = %target,
                        %error,
                        "Redis refused the limiter's configuration; requests follow the failure policy until it is fixed (retrying every {}s)",
                        MISCONFIGURED_BACKOFF.as_secs()
                    );
                    said_misconfigured = Some(wrong);
                    last_said = Instant::now();
                }
                drop(strong);
                tokio::time::sleep(MISCONFIGURED_BACKOFF).await;
                continue;
            }
            misconfigured => {
                // A replica during a failover's first seconds: retried at the usual pace.
                if misconfigured.is_none() {
                    replica_since = None;
                }
                said_misconfigured = None;
                if first_failure {
                    tracing::warn!(
                        redis = %target,
                        %error,
                        "Redis is not reachable yet; requests follow the failure policy until it answers (connecting in the background)"
                    );
                } else if last_said.elapsed() >= STILL_DOWN_EVERY {
                    last_said = Instant::now();
                    tracing::warn!(
                        redis = %target,
                        %error,
                        down_s = down_since.elapsed().as_secs(),
                        attempts,
                        "Redis is still unreachable"
                    );
                }
            }
        }
        drop(strong);
        tokio::time::sleep(backoff.wait()).await;
    }
}

/// Connects `lazy` in the background for as long as the backend (`state`) lives.
pub(crate) fn spawn_cluster_keeper(
    client: ClusterClient,
    lazy: Arc<LazyCluster>,
    state: Weak<RedisState>,
) {
    spawn(async move {
        let mut keep = (client, lazy.clone());
        let connected = connect_with_backoff(
            &lazy.target,
            &lazy.attempts,
            &state,
            &mut true,
            &mut keep,
            attempt_cluster,
        )
        .await;
        let (Some((conn, _)), Some(strong)) = (connected, state.upgrade()) else {
            return;
        };
        lazy.install(conn);
        tracing::info!(
            redis = %lazy.target,
            path = path_name(strong.detector.active_path()),
            "connected to the Redis Cluster"
        );
        in_service(&strong);
    });
}

/// One attempt of a Cluster's keeper: the Cluster, once formed, set up.
fn attempt_cluster(
    (client, lazy): &mut (ClusterClient, Arc<LazyCluster>),
    state: Arc<RedisState>,
) -> Attempt<'_, ClusterConnection> {
    Box::pin(async move {
        // At most 10 s: the keeper tries again after it (a Cluster that never answers).
        let budget = start_budget(state.timeout).min(Duration::from_secs(10));
        let attempt = async {
            let conn = formed(client, &lazy.target).await?;
            let cluster = Some(Ok(conn.clone()));
            set_up(
                &mut RedisConnection::cluster_of(conn.clone()),
                cluster,
                &state,
            )
            .await
            .map_err(|e| AttemptError::described(e.describe(&lazy.target)))?;
            Ok(conn)
        };
        let target = || format!("the Redis Cluster ({})", lazy.target);
        within(budget, target, attempt).await
    })
}

/// A connection to the Cluster once formed: a second one, made after `CLUSTER INFO` said so (the
/// slot map of one made before the slots were assigned is empty).
async fn formed(client: &ClusterClient, target: &str) -> Result<ClusterConnection, AttemptError> {
    let failed = |doing: &str, e: RedisError| {
        AttemptError::described(match configuration_error(&e, target, doing) {
            Some(message) => (message, true),
            None => (
                format!("cannot {doing} the Redis Cluster ({target}): {e}"),
                false,
            ),
        })
    };
    let mut probe = client
        .get_async_connection()
        .await
        .map_err(|e| failed("connect to", e))?;
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut probe)
        .await
        .map_err(|e| failed("ask", e))?;
    if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
        return Err(AttemptError::described((
            format!(
                "the Redis Cluster ({target}) has not formed yet (CLUSTER INFO does not say cluster_state:ok)"
            ),
            false,
        )));
    }
    client
        .get_async_connection()
        .await
        .map_err(|e| failed("connect to", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_is_bounded() {
        let ms = Duration::from_millis;
        for (timeout, budget) in [(10, 250), (100, 500), (60_000, 5_000)] {
            assert_eq!(attempt_budget(ms(timeout)), ms(budget), "{timeout} ms");
        }
    }
}

//! The process-wide circuit breaker of one server, and `guarded`: one Redis call under the breaker
//! (on a Cluster, the breaker of the key's primary) and the timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::circuit::{Admission, Circuit};
use super::recorder::{error_text, Clock, Recorder};
use crate::backend::redis::conn::cluster_nodes::{ClusterNodes, Node};
use crate::backend::redis::conn::server::{is_unreachable, SingleServer};
use crate::backend::redis::wire::mode::RedisMode;
use crate::error::BackendError;

/// Fails calls at once while Redis is unreachable, rather than each at its timeout (circuit.rs).
/// One server's only: on a Cluster each primary has its own ([`ClusterNodes`]), picked by the slot.
pub(crate) struct Breaker {
    circuit: Arc<Circuit>,
    /// On a Cluster: the slot map and a breaker per primary (then `circuit` admits every call, and
    /// failures open nothing).
    pub(crate) nodes: Option<Arc<ClusterNodes>>,
    /// The reconnecting server, if any: told about timeouts; its task logs the transitions.
    server: Option<Arc<SingleServer>>,
    /// The record of every call's outcome, which `health()` and the gauge read (recorder.rs).
    pub(crate) recorder: Recorder,
}

impl Breaker {
    /// A closed breaker (disabled with `nodes`, a Cluster's); `server`: the server it guards.
    pub(crate) fn new(
        timeout: Duration,
        nodes: Option<Arc<ClusterNodes>>,
        server: Option<Arc<SingleServer>>,
        mode: RedisMode,
        name: &str,
        clock: Clock,
    ) -> Self {
        Breaker {
            circuit: Arc::new(Circuit::new(timeout, clock)),
            nodes,
            server,
            recorder: Recorder::new(mode, name, clock),
        }
    }

    /// Whether the circuit was opened and no call has got through since.
    pub(crate) fn tripped(&self) -> bool {
        self.circuit.tripped()
    }

    /// One call's outcome, recorded once for the recorder, this breaker and a Cluster node's
    /// (`node`: the call's). `started`: as the call began, the node's clock (a Cluster), else the
    /// circuit's [`last_answer`](Circuit::last_answer).
    fn record(&self, outcome: Outcome, node: Option<&Node>, was_probe: bool, started: u64) {
        // One clock reading for the recorder and the circuit (every breaker reads the same clock).
        let now = self.circuit.now_ms();
        // A call out of time opens a breaker only if its server answered nothing since the call
        // began (slow, not dead: only this call fails), on one server as on a Cluster's node.
        let slow =
            |circuit: &Circuit| outcome.timed_out && !was_probe && circuit.answered_since(started);
        if outcome.answered {
            self.answered_at(now);
        } else {
            // Said once (not by the calls under way); with a reconnecting server, by its task.
            let opens = self.nodes.is_none() && !slow(&self.circuit);
            if opens && self.circuit.failed(was_probe) && self.server.is_none() {
                tracing::warn!("Redis is unreachable; failing fast until a probe gets through");
            }
            // The server may drop a connection that stopped answering.
            if let (true, Some(server)) = (outcome.timed_out, &self.server) {
                server.timed_out();
            }
        }
        if let (Some(node), Some(nodes)) = (node, &self.nodes) {
            match (&outcome.error, outcome.answered && !outcome.slot_not_served) {
                (_, true) | (None, _) => nodes.answered(node),
                (Some(e), false) if slow(&node.circuit) => node.met(e),
                (Some(e), false) => nodes.failed(node, was_probe, e),
            }
        }
        self.recorder.record(outcome.answered, outcome.error, now);
    }

    /// Redis answered.
    pub(crate) fn answered(&self) {
        self.answered_at(self.circuit.now_ms());
    }

    /// Redis answered at `now` (a reading of the backend's clock).
    fn answered_at(&self, now: u64) {
        if self.nodes.is_some() {
            return;
        }
        self.circuit.stamp_answer(now);
        // With a reconnecting server, its task says so (once per reconnection).
        if self.circuit.answered() && self.server.is_none() {
            tracing::info!("Redis answers again; rate-limit decisions come from Redis");
        }
    }

    /// On a Cluster, the primary of `key`'s slot, as the backend's slot map knows it.
    pub(crate) fn node_for(&self, key: &str) -> Option<Arc<Node>> {
        self.nodes.as_ref()?.for_key(key)
    }
}

/// A Redis call under the breaker and the timeout: its answer, or why there is none.
pub(crate) type Guarded<T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>;

/// Runs one Redis call under the breaker (`key`'s primary's, on a Cluster) and the timeout.
pub(crate) fn guarded<T: Send + 'static>(
    breaker: &Arc<Breaker>,
    key: &str,
    timeout: Duration,
    call: impl Future<Output = Result<T, RedisError>> + Send + 'static,
) -> Guarded<T> {
    guarded_on(breaker, breaker.node_for(key), timeout, call)
}

/// [`guarded`], the node picked beforehand ([`Breaker::node_for`]), so a call may own its key.
pub(crate) fn guarded_on<T, F>(
    breaker: &Arc<Breaker>,
    node: Option<Arc<Node>>,
    timeout: Duration,
    call: F,
) -> Guarded<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T, RedisError>> + Send + 'static,
{
    let admission = match (&node, &breaker.nodes) {
        (Some(node), Some(nodes)) => nodes.admit(node),
        _ if breaker.nodes.is_some() => Admission::Closed,
        _ => breaker.circuit.admit(),
    };
    if let Admission::FailFast = admission {
        let message = match &node {
            Some(node) => format!(
                "Redis Cluster node {} is unreachable (failing fast until a probe gets through)",
                node.address
            ),
            None => "Redis is unreachable (failing fast until a probe gets through)".to_owned(),
        };
        // Spends the task's cooperative budget (a yield once in 128 calls): a caller retrying at
        // once on a one-thread runtime must let the probe's task run, or it spins for ever.
        return Box::pin(async move {
            tokio::task::coop::consume_budget().await;
            Err(BackendError::new(message).unsent_if(true))
        });
    }
    let breaker = breaker.clone();
    // Large (a script's or a batch's state machine): boxed once, not copied into two futures.
    let call: Pin<Box<dyn Future<Output = Result<T, RedisError>> + Send>> = Box::pin(call);
    Box::pin(async move {
        let was_probe = matches!(admission, Admission::Probe(_));
        // What an answer after this call's start is told by: one server's last answer (any later
        // one moves it: no clock reading), a Cluster node's clock (its TRYAGAIN record is a time).
        let started = match &node {
            Some(node) => node.circuit.now_ms(),
            None => breaker.circuit.last_answer(),
        };
        let outcome = tokio::time::timeout(timeout, call).await;
        // Out of time after the node answered TRYAGAIN (its record: whichever task sent it).
        let tried_again = node.as_ref().is_some_and(|n| n.tried_again_since(started))
            && match &outcome {
                Ok(Ok(_)) => false,
                Ok(Err(e)) => e.is_timeout(),
                Err(_) => true,
            };
        let (result, outcome) = match outcome {
            // Alive, the keys' slot migrating: only this call fails.
            _ if tried_again => (
                Err(BackendError::new(format!(
                    "Redis did not answer within {timeout:?}: the key's slot is migrating (TRYAGAIN)"
                ))),
                Outcome::answered(Some(format!(
                    "Redis Cluster answered TRYAGAIN (the key's slot is migrating) for {timeout:?}"
                ))),
            ),
            Ok(Ok(value)) => (Ok(value), Outcome::answered(None)),
            Ok(Err(e)) => {
                let error = Some(error_text(&e));
                // Not a primary: Redis answered, but cannot decide here until a failover ends.
                let outcome = if is_unreachable(&e) {
                    Outcome::unreachable(error, e.is_timeout())
                } else {
                    // An error reply (OOM, NOPERM...) still proves Redis is there.
                    Outcome {
                        slot_not_served: slot_not_served(&e, node.as_deref()),
                        ..Outcome::answered(error)
                    }
                };
                let unsent = never_sent(&e);
                let error = BackendError::with_source("Redis call failed", e).unsent_if(unsent);
                (Err(error), outcome)
            }
            Err(_) => (
                Err(BackendError::new(format!(
                    "Redis did not answer within {timeout:?}"
                ))),
                Outcome::unreachable(Some(format!("Redis did not answer within {timeout:?}")), true),
            ),
        };
        breaker.record(outcome, node.as_deref(), was_probe, started);
        drop(admission);
        result
    })
}

/// Whether `error` says the call never left: there was no connection to send it on.
fn never_sent(error: &RedisError) -> bool {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    // redis-rs keeps the I/O error behind an `Arc`, which `source` gives.
    let io = std::error::Error::source(error)
        .and_then(|e| e.downcast_ref::<Shared>())
        .and_then(|e| e.downcast_ref::<std::io::Error>());
    io.is_some_and(|io| io.kind() == std::io::ErrorKind::NotConnected)
}

/// One call's outcome: the one record the recorder, the breaker and the node's breaker read.
struct Outcome {
    /// Redis answered (an error reply included).
    answered: bool,
    /// The call ran out of time without an answer.
    timed_out: bool,
    /// Why the decision failed, if it did.
    error: Option<String>,
    /// On a Cluster, answered that the key's slot is not served: a failure of the node's.
    slot_not_served: bool,
}

impl Outcome {
    fn answered(error: Option<String>) -> Self {
        Outcome {
            answered: true,
            ..Outcome::unreachable(error, false)
        }
    }

    fn unreachable(error: Option<String>, timed_out: bool) -> Self {
        Outcome {
            answered: false,
            timed_out,
            error,
            slot_not_served: false,
        }
    }
}

/// Whether a Cluster's reply says the key's slot is not served: `CLUSTERDOWN`, or a `MOVED` left
/// after redirect.rs to `node` itself, the slot's owner by the backend's map (an owner redis-rs
/// cannot reach: a dead primary). A `MOVED` to another node says the node asked answered, its map
/// read before a move (a reshard): the call fails alone. Not `ASK` nor `TRYAGAIN` (a slot between
/// two live nodes).
fn slot_not_served(e: &RedisError, node: Option<&Node>) -> bool {
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::ClusterDown) => true,
        ErrorKind::Server(ServerErrorKind::Moved) => node.is_none_or(|node| node.named_by(e)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::conn::redirect;
    use crate::backend::redis::conn::redirect::timed_out;

    /// A Lua-mode breaker with a second's timeout, on `nodes` (a Cluster's) or one server.
    fn breaker(nodes: Option<Arc<ClusterNodes>>, clock: Clock) -> Arc<Breaker> {
        let second = Duration::from_secs(1);
        let breaker = Breaker::new(second, nodes, None, RedisMode::Lua, "test", clock);
        Arc::new(breaker)
    }

    /// One server's call out of time opens its breaker only if no call got an answer since it
    /// began: a slow reply among answered ones fails alone, not every call for the next 50 ms.
    #[tokio::test]
    async fn a_timeout_opens_one_servers_breaker_only_if_nothing_answered_since() {
        let clock = Clock::new();
        let breaker = breaker(None, clock);
        let timeout = Duration::from_millis(100);
        let slow = guarded(
            &breaker,
            "k",
            timeout,
            std::future::pending::<Result<(), _>>(),
        );
        let answered = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            guarded(&breaker, "k", timeout, async { Ok::<_, RedisError>(()) }).await
        };
        let (slow, answered) = tokio::join!(slow, answered);
        assert!(slow.unwrap_err().to_string().contains("did not answer"));
        answered.unwrap();
        assert!(!breaker.tripped(), "one slow reply among answers");
        let silent = guarded(
            &breaker,
            "k",
            timeout,
            std::future::pending::<Result<(), _>>(),
        );
        silent.await.unwrap_err();
        assert!(breaker.tripped(), "nothing answered while the call waited");
    }

    /// A `MOVED` to another node than the one the backend's map names (a reshard: redis-rs read
    /// its map on a node that had not heard of the move) fails the call alone; one to the map's
    /// owner itself (a dead primary that redis-rs cannot reach) opens the owner's breaker.
    #[tokio::test]
    async fn a_moved_elsewhere_leaves_the_nodes_breaker_closed() {
        let clock = Clock::new();
        let nodes = Arc::new(ClusterNodes::new(Duration::from_secs(1), "test", clock));
        nodes.install(vec![
            (("10.0.0.7".into(), 7001), vec![(0, 8191)]),
            (("10.0.0.8".into(), 7002), vec![(8192, 16383)]),
        ]);
        let breaker = breaker(Some(nodes.clone()), clock);
        let key = "throttle:api:{k}";
        let slot = crate::backend::redis::conn::cluster_nodes::slot_of(b"k");
        let owner = nodes.for_key(key).unwrap();
        let other = if owner.address.ends_with(":7001") {
            "10.0.0.8:7002"
        } else {
            "10.0.0.7:7001"
        };
        let moved = |to: &str| {
            let reply = format!("-MOVED {slot} {to}\r\n");
            let value = redis::parse_redis_value(reply.as_bytes()).unwrap();
            value.extract_error().unwrap_err()
        };
        let elsewhere = moved(other);
        let call = guarded(&breaker, key, Duration::from_secs(1), async move {
            Err::<(), _>(elsewhere)
        });
        assert!(call.await.is_err());
        assert!(nodes.tripped().is_empty(), "a MOVED elsewhere opened it");
        let to_owner = moved(&owner.address);
        let call = guarded(&breaker, key, Duration::from_secs(1), async move {
            Err::<(), _>(to_owner)
        });
        assert!(call.await.is_err());
        assert_eq!(
            nodes.tripped().len(),
            1,
            "a MOVED to the owner left it closed"
        );
    }

    /// A timeout after the key's node answered `TRYAGAIN` (to any task) is the migrating slot's:
    /// the node's breaker stays closed. Without it, a timeout opens it.
    #[tokio::test(start_paused = true)]
    async fn a_timeout_after_tryagain_is_the_migrating_slots() {
        let clock = Clock::new();
        let nodes = Arc::new(ClusterNodes::new(Duration::from_secs(1), "test", clock));
        nodes.install(vec![(("10.0.0.7".into(), 7001), vec![(0, 16383)])]);
        let breaker = breaker(Some(nodes.clone()), clock);
        let key = "throttle:api:{k}";
        let tried_again = move |nodes: Arc<ClusterNodes>| async move {
            tokio::spawn(async move { redirect::heard_tryagain(&nodes, key) })
                .await
                .unwrap();
        };
        let by_the_check = guarded(&breaker, key, Duration::from_secs(1), {
            let nodes = nodes.clone();
            async move {
                tried_again(nodes).await;
                std::future::pending::<Result<(), RedisError>>().await
            }
        });
        let error = by_the_check.await.unwrap_err().to_string();
        assert!(error.contains("TRYAGAIN"), "the check's timeout: {error}");
        assert!(nodes.tripped().is_empty());
        // The node's record is kept in milliseconds (real ones).
        std::thread::sleep(Duration::from_millis(3));
        let silent = guarded(&breaker, key, Duration::from_secs(1), async {
            Err::<(), _>(timed_out())
        });
        assert!(!silent.await.unwrap_err().to_string().contains("TRYAGAIN"));
        assert!(!nodes.tripped().is_empty());
    }
}

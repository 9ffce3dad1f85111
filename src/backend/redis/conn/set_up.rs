//! The one set-up after every connect, before the connection is put in service ([`in_service`]):
//! detect redis-cell where the mode reads it, refuse mode `cell` without it, load the scripts.
//! A failure fails the attempt alike everywhere: `connect` returns it, the keepers retry.

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Script};

use super::connection::cell_loaded;
use super::server::configuration_error;
use crate::backend::redis::state::RedisState;
use crate::backend::redis::wire::lua;
use crate::backend::redis::wire::mode::RedisMode;
use crate::error::BackendError;

/// Why the set-up failed.
pub(crate) enum SetUpError {
    /// Redis failed a step: what it was doing, and its error.
    Redis(&'static str, RedisError),
    /// Mode `cell` on a Redis without the redis-cell module (on a Cluster: on some primary).
    NoCell,
}

impl SetUpError {
    /// What to say about Redis at `address`, and whether retrying alone will not fix it.
    pub(crate) fn describe(&self, address: &str) -> (String, bool) {
        match self {
            SetUpError::NoCell => (
                format!(
                    "mode \"cell\" needs the redis-cell module (CL.THROTTLE), which Redis at {address} has not loaded (on every primary, for a Cluster); load the module or use mode \"lua\" or \"auto\""
                ),
                true,
            ),
            SetUpError::Redis(doing, e) => match configuration_error(e, address, doing) {
                Some(message) => (message, true),
                None => (format!("cannot {doing} on Redis at {address}: {e}"), false),
            },
        }
    }

    /// The error `connect` returns: the [description](Self::describe), with Redis' own error as
    /// its source (a plain failure's description leaves it to the source, so it is said once).
    pub(crate) fn into_error(self, address: &str) -> BackendError {
        match self {
            SetUpError::Redis(doing, e) => match configuration_error(&e, address, doing) {
                Some(message) => BackendError::with_source(message, e),
                None => {
                    BackendError::with_source(format!("cannot {doing} on Redis at {address}"), e)
                }
            },
            SetUpError::NoCell => BackendError::new(self.describe(address).0),
        }
    }
}

/// Sets up `conn` (just made, not yet in service; a Cluster's, following redirections, with
/// `cluster` to ask every primary) for `state`'s mode (see the module docs). What detection found
/// is recorded last.
pub(crate) async fn set_up(
    conn: &mut (impl ConnectionLike + Send),
    cluster: Option<Result<ClusterConnection, RedisError>>,
    state: &RedisState,
) -> Result<(), SetUpError> {
    let mode = state.detector.set_up_mode;
    let on_cluster = cluster.is_some();
    let loaded = match mode {
        RedisMode::Lua => None,
        _ => Some(
            cell_loaded(conn, cluster)
                .await
                .map_err(|e| SetUpError::Redis("run COMMAND INFO (to detect redis-cell)", e))?,
        ),
    };
    if mode == RedisMode::Cell && loaded == Some(false) {
        return Err(SetUpError::NoCell);
    }
    // Every script a decision, a settlement or a lease may run, whatever the policies: Redis keeps
    // no script across a restart or a failover, and a missing one costs its first call two more
    // round trips (`NOSCRIPT`, `SCRIPT LOAD`): past the timeout on a slow link (issue 50).
    let scripts = [
        lua::GCRA,
        lua::LIMITS,
        lua::GCRA_BATCH,
        lua::LIMITS_BATCH,
        lua::CELL,
        lua::SETTLE,
        lua::BUDGET,
        lua::RENEW,
    ];
    let failed = |e| SetUpError::Redis("load the script (SCRIPT LOAD)", e);
    if on_cluster {
        // One call a script, which redis-rs sends to every primary (a pipeline goes to one).
        for script in scripts {
            Script::new(script)
                .load_async(&mut *conn)
                .await
                .map_err(failed)?;
        }
    } else {
        // One round trip: on a slow link, each round trip of the set-up counts.
        let mut load = redis::pipe();
        for script in scripts {
            load.cmd("SCRIPT").arg("LOAD").arg(script).ignore();
        }
        load.query_async::<()>(&mut *conn).await.map_err(failed)?;
    }
    if let Some(loaded) = loaded {
        state.detector.detected(loaded, &state.breaker);
    }
    Ok(())
}

/// A connection set up is in service, after every connect alike: the loss forgotten, the breaker
/// closed, the gauge up on the path decisions take.
pub(crate) fn in_service(state: &RedisState) {
    state.breaker.recorder.forget_loss();
    state.breaker.answered();
    state
        .breaker
        .recorder
        .connected(state.detector.active_path());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_set_up_quotes_redis_once() {
        let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out");
        let failed = SetUpError::Redis("load the script", RedisError::from(timed_out));
        let text = failed.into_error("127.0.0.1:6379").to_string();
        assert_eq!(
            text,
            "cannot load the script on Redis at 127.0.0.1:6379: read timed out"
        );
    }
}

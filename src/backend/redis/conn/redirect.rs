//! A Redis Cluster's redirections, followed by `RedisConnection` for every command it sends:
//! `ASK` as `ASKING` and the command in one pipeline (nothing can come between them), `MOVED`
//! resent once redis-rs has refreshed its map, `TRYAGAIN` after a short wait. The client is built
//! with `retries(0)` (connection.rs), so redirections reach this code first.
//!
//! Why not redis-rs's retries: redis-rs 1.8.1 sends `ASKING` as a request of its own, then the
//! command (`get_redirected_connection`, src/cluster_handling/async_connection/mod.rs:943): under
//! load another command takes the flag, and the command ping-pongs `MOVED`/`ASK` (9 to 13 % of a
//! migrating key's decisions failed). This can go once redis-rs pipelines `ASKING` with it.
//!
//! What Redis Cluster refuses stays refused: a multi-key command with a key missing on the node
//! asked (`TRYAGAIN` until the slot has moved), `ASK` to a node redis-rs does not know yet.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, ServerErrorKind, Value};

use super::cluster_nodes::ClusterNodes;
use crate::backoff::Backoff;

/// Redirections (`ASK`, `MOVED`) followed for one command before its last error is returned: a slot
/// migration costs at most two (`ASK`, then `MOVED` once the slot has moved).
const MAX_REDIRECTS: u32 = 5;

/// `TRYAGAIN` is retried after 1 ms, doubling to 10 ms, for at most [`TRY_AGAIN_FOR`].
const TRY_AGAIN: Backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(10));
const TRY_AGAIN_FOR: Duration = Duration::from_secs(2);

/// One command, following redirections; `nodes` hears of its `TRYAGAIN`s.
pub(super) async fn command(
    cluster: &mut ClusterConnection,
    nodes: Option<&ClusterNodes>,
    cmd: &Cmd,
) -> Result<Value, RedisError> {
    let mut result = cluster
        .req_packed_command(cmd)
        .await
        .and_then(Value::extract_error);
    let mut redirects = 0;
    let mut last_moved = None;
    let mut try_again = TRY_AGAIN;
    let mut waited = Duration::ZERO;
    loop {
        let error = match result {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        result = match redirection(&error) {
            Some(Redirection::Ask(host, port)) if redirects < MAX_REDIRECTS => {
                redirects += 1;
                asking(cluster, cmd, host, port).await
            }
            // Named twice in a row, the node is an owner redis-rs cannot reach (a dead primary):
            // another try would only cost another slot refresh.
            Some(Redirection::Moved(host, port))
                if redirects < MAX_REDIRECTS
                    && last_moved.as_ref() != Some(&(host.clone(), port)) =>
            {
                redirects += 1;
                last_moved = Some((host, port));
                // By the slot map, which `MOVED` made redis-rs refresh (it sends nothing until
                // done), not by the address: one it has no connection to (a dead primary) would
                // make it reconnect to every node.
                cluster.req_packed_command(cmd).await
            }
            Some(Redirection::TryAgain) if waited < TRY_AGAIN_FOR => {
                // Until the slot is the target's: bounded by the wait. The node answered: a
                // timeout meanwhile is not a dead node's.
                if let (Some(nodes), Some(key)) = (nodes, first_key(cmd)) {
                    nodes.tried_again(key);
                }
                redirects = 0;
                let wait = try_again.wait();
                tokio::time::sleep(wait).await;
                waited += wait;
                cluster.req_packed_command(cmd).await
            }
            _ => return Err(error),
        }
        .and_then(Value::extract_error);
    }
}

/// A pipeline, following redirections: whole, then (redirected) each command alone, as redis-rs
/// hides which ran. Only for what may run twice; a transaction is never split.
pub(super) async fn commands(
    cluster: &mut ClusterConnection,
    nodes: Option<&ClusterNodes>,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> Result<Vec<Value>, RedisError> {
    let error = match cluster.req_packed_commands(pipeline, offset, count).await {
        Ok(values) => return Ok(values),
        Err(error) => error,
    };
    let whole = offset == 0 && count == pipeline.len() && !pipeline.is_transaction();
    if !whole || redirection(&error).is_none() {
        return Err(error);
    }
    let mut values = Vec::with_capacity(count);
    for cmd in pipeline.cmd_iter() {
        // As a pipeline would: an error reply is this command's value, not the pipeline's failure.
        values.push(match command(cluster, nodes, cmd).await {
            Ok(value) => value,
            Err(error) => match (error.kind(), error.clone().into_server_errors()) {
                (ErrorKind::Server(_), Some(errors)) if errors.len() == 1 => {
                    Value::ServerError(errors[0].1.clone())
                }
                _ => return Err(error),
            },
        });
    }
    Ok(values)
}

/// The first key `cmd` names (a script's, after its SHA and count; another command's first
/// argument): its slot's primary is the node that answered.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        Arg::Simple(arg) => arg,
        _ => &[],
    });
    let name = args.next()?;
    let script = [
        &b"EVALSHA"[..],
        b"EVAL",
        b"EVALSHA_RO",
        b"EVAL_RO",
        b"FCALL",
        b"FCALL_RO",
    ]
    .iter()
    .any(|s| name.eq_ignore_ascii_case(s));
    if script {
        args.nth(2)
    } else {
        args.next()
    }
}

/// What a `TRYAGAIN` to a command on `key` tells `nodes` (for the tests).
#[cfg(test)]
pub(crate) fn heard_tryagain(nodes: &ClusterNodes, key: &str) {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg("sha").arg(1).arg(key);
    nodes.tried_again(first_key(&cmd).unwrap());
}

/// `ASK`: `ASKING` and the command, as one pipeline on the importing node's connection.
async fn asking(
    cluster: &mut ClusterConnection,
    cmd: &Cmd,
    host: String,
    port: u16,
) -> Result<Value, RedisError> {
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(cmd.clone());
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    let mut values = cluster.route_pipeline(pipe, 0, 2, route).await?;
    match values.pop() {
        Some(value) if values.len() == 1 => Ok(value),
        _ => Err(unexpected(
            "ASKING and a redirected command returned a reply of the wrong length",
        )),
    }
}

/// A call out of time.
pub(crate) fn timed_out() -> RedisError {
    std::io::Error::from(std::io::ErrorKind::TimedOut).into()
}

/// A reply that is not what the call sends for (a script's reply of the wrong length...).
pub(crate) fn unexpected(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::UnexpectedReturnType, what))
}

/// What a reply asks of the client.
#[derive(Debug, PartialEq)]
enum Redirection {
    /// Once, on this node (host, port), after `ASKING`: the slot is migrating there and the key
    /// has left.
    Ask(String, u16),
    /// From now on, this node (host, port) owns the slot.
    Moved(String, u16),
    /// A multi-key command's keys are on two nodes for a moment, or a script met a key that left
    /// its migrating slot while it ran: again, shortly.
    TryAgain,
}

/// Whether a script failed on a key that was on the node when Redis let the script run and gone
/// once it read it, in a migrating slot: Redis answers then as for a key outside the node's slots.
/// Redis 7.0 checks a script's keys on the clock before the script starts and the script reads on
/// its own (later) clock, so a key that expires between the two fails the script at its first
/// read, before it writes anything a second run would not write the same (every script here reads
/// its keys before it charges; settle.lua's first `EXISTS` and limits.lua's sorted sets, which add
/// before they remove, see to that; a lone GCRA's rebase is the same twice). Sent again, the check
/// finds the key gone and redirects (`ASK`) or waits (`TRYAGAIN`) as for any missing key.
/// Redis 7.2+ and Valkey name a multi-key command's case (`EXISTS`, `MGET`) otherwise.
pub(crate) fn left_mid_script(error: &RedisError) -> bool {
    let says = |t: &str| t.contains("non local key") || t.contains("during rehashing of the slot");
    error.detail().is_some_and(says) || error.code().is_some_and(says)
}

fn redirection(error: &RedisError) -> Option<Redirection> {
    let node = || {
        let (address, _slot) = error.redirect_node()?;
        let (host, port) = address.rsplit_once(':')?;
        Some((host.to_owned(), port.parse().ok()?))
    };
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::Ask) => node().map(|(h, p)| Redirection::Ask(h, p)),
        ErrorKind::Server(ServerErrorKind::Moved) => node().map(|(h, p)| Redirection::Moved(h, p)),
        ErrorKind::Server(ServerErrorKind::TryAgain) => Some(Redirection::TryAgain),
        _ if left_mid_script(error) => Some(Redirection::TryAgain),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    #[test]
    fn redirections_name_their_node() {
        let ask = redirection(&reply("ASK 3999 127.0.0.1:6381"));
        assert_eq!(ask, Some(Redirection::Ask("127.0.0.1".into(), 6381)));
        let moved = redirection(&reply("MOVED 3999 ::1:6381"));
        assert_eq!(moved, Some(Redirection::Moved("::1".into(), 6381)));
        let busy = reply("TRYAGAIN Multiple keys request during rehashing of slot");
        assert_eq!(redirection(&busy), Some(Redirection::TryAgain));
        assert_eq!(redirection(&reply("ERR unknown command")), None);
        assert_eq!(redirection(&reply("ASK garbage")), None);
        // Redis 7.0.15's reply to a script whose key expired between its check and its read.
        let left = reply("ERR Script attempted to access a non local key in a cluster node script: 1a2b, on @user_script:30.");
        assert_eq!(redirection(&left), Some(Redirection::TryAgain));
        // Redis 7.2+ and Valkey, for a multi-key command in a script.
        let split = reply("ERR Unable to execute command 'exists' in script because undeclared keys were accessed during rehashing of the slot script: 1a2b, on @user_script:24.");
        assert_eq!(redirection(&split), Some(Redirection::TryAgain));
        let other_script_error =
            reply("ERR user_script:1: Script attempted to access nonexistent global variable 'x'");
        assert_eq!(redirection(&other_script_error), None);
    }
}

//! The loss bound of asynchronous replication, measured: a primary and its replica, eight callers
//! admitting on one key as fast as they can, the primary killed (SIGKILL) under that load and the
//! replica promoted by hand (`REPLICAOF NO ONE`); then the admissions the callers were told of
//! are compared with those the promoted replica counts. Each admission moves the key's TAT by one
//! emission interval (60 s; the burst is 50,000, far above the few thousand calls of a trial), so
//! the replica's count is exact: `limit - remaining` as `peek` reports it.
//!
//! `cargo test --all-features --test redis -- replication_loss --nocapture` prints the figures (the
//! guide's Redis page quotes them).

use crate::support::failover::{cli, replicate, Load};
use crate::support::redis as redis_support;

use std::time::{Duration, Instant};

use crate::support::asks::Asks;
use redis_support::RedisServer;
use tower_throttle::key::Key;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Limit, Quota,
};

const TRIALS: usize = 5;

/// One unit a minute, 50,000 at once: every call is admitted, and each moves the TAT a minute.
fn steady() -> Limit {
    Limit::new(
        "steady",
        Quota::cl_throttle(50_000, 1, Duration::from_secs(60)),
    )
    .unwrap()
}

async fn connect(server: &RedisServer) -> RedisBackend {
    let builder = RedisBackend::builder().url(server.url());
    builder.mode(RedisMode::Lua).connect().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_forgets_the_admissions_not_yet_replicated() {
    let limit = steady();
    let mut forgotten_per_trial = Vec::new();
    for trial in 0..TRIALS {
        let (mut primary, replica) = (RedisServer::start(), RedisServer::start());
        replicate(replica.port(), primary.port()).await;
        let backend = connect(&primary).await;
        let started = Instant::now();
        let load = Load::start(&backend, &limit, 8, Duration::ZERO);
        load.wait_decided(Duration::ZERO, 3000).await;
        primary.kill();
        let samples = load.finish().await;
        let elapsed = started.elapsed();
        // Acknowledged admissions (every decided call was admitted), and calls whose outcome
        // the caller never learnt (they may or may not have reached the primary).
        let admitted = samples.iter().filter(|s| s.decided).count() as u64;
        let in_doubt = samples.len() as u64 - admitted;

        assert_eq!(cli(replica.port(), &["REPLICAOF", "NO", "ONE"]).await, "OK");
        // Not a test of timeouts: the default 100 ms timed this peek out beside `stress-ng --cpu 2`
        // (the promoted replica had just finished a full resync).
        let promoted = RedisBackend::builder()
            .url(replica.url())
            .mode(RedisMode::Lua)
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let state = promoted
            .peek_all(std::slice::from_ref(&limit), &Key::from("steady"))
            .await
            .unwrap()[0];
        assert!(
            elapsed < Duration::from_secs(60),
            "the count needs under a minute"
        );
        assert!(
            state.remaining > 0,
            "the burst ran out: some calls were refused"
        );
        let recorded = state.limit - state.remaining;
        let forgotten = admitted.saturating_sub(recorded);
        println!(
            "replication_loss trial {trial}: {admitted} admissions acknowledged in {elapsed:.1?} \
             ({:.0}/s), {in_doubt} in doubt; the promoted replica counts {recorded}: \
             {forgotten} forgotten",
            admitted as f64 / elapsed.as_secs_f64()
        );
        // The replica never counts more than was sent to the primary.
        assert!(
            recorded <= admitted + in_doubt,
            "{recorded} > {admitted} + {in_doubt}"
        );
        forgotten_per_trial.push(forgotten);
    }
    forgotten_per_trial.sort_unstable();
    println!(
        "replication_loss: admissions forgotten per failover over {TRIALS} trials: {forgotten_per_trial:?}"
    );
}

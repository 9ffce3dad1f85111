//! Overrides and timed bans on Redis, where two layers on backends of their own stand for two
//! processes of a fleet: a change made through one is in force in the other within a second (with
//! no refusal cached under the old limit), and both find it again after a restart.

use std::time::{Duration, Instant};

use http::StatusCode;
use tower_throttle::ops::Override;
use tower_throttle::redis::{RedisBackend, RedisMode};
use tower_throttle::Quota;

use crate::shared::overrides::{
    an_overridden_concurrency_slot_is_given_back, app, overrides_and_bans_apply, passed, send,
};
use crate::support::redis as redis_support;

async fn backend(url: &str, prefix: &str, mode: RedisMode) -> RedisBackend {
    RedisBackend::builder()
        .url(url)
        .mode(mode)
        .prefix(prefix)
        .deny_cache(true)
        .connect()
        .await
        .unwrap()
}

/// Waits until `check` holds, at most a second; how long it took.
async fn within_a_second<F, Fut>(what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{what}: not within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn on_redis_overrides_and_bans_apply() {
    let server = redis_support::RedisServer::start_with_cell();
    for mode in [RedisMode::Lua, RedisMode::Cell] {
        let prefix = format!("overrides-{}", mode.as_str());
        overrides_and_bans_apply(backend(&server.url(), &prefix, mode).await).await;
    }
}

#[tokio::test]
async fn on_redis_an_overridden_concurrency_slot_is_given_back() {
    let server = redis_support::RedisServer::start();
    let backend = backend(&server.url(), "slots", RedisMode::Lua).await;
    an_overridden_concurrency_slot_is_given_back(backend).await;
}

#[tokio::test]
async fn on_redis_an_override_set_in_one_process_holds_in_the_other_and_after_restarts() {
    let server = redis_support::RedisServer::start();
    let url = server.url();
    let (one, one_handle) = app(backend(&url, "fleet", RedisMode::Lua).await);
    let (two, two_handle) = app(backend(&url, "fleet", RedisMode::Lua).await);
    // Refused in both, with the refusal cached (the deny cache is on).
    assert_eq!(passed(&one, "bob", 3).await, 2);
    assert_eq!(send(&two, "bob").await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&two, "bob").await.0, StatusCode::TOO_MANY_REQUESTS);
    // Unlimited, through the first: through at once there, within a second in the other.
    one_handle
        .set_override("api", "bob", Override::Unlimited)
        .await
        .unwrap();
    assert_eq!(send(&one, "bob").await.0, StatusCode::OK);
    within_a_second("unlimited heard", || async {
        send(&two, "bob").await.0 == StatusCode::OK
    })
    .await;
    assert_eq!(passed(&two, "bob", 10).await, 10);
    // A raised quota for a key refused under the old one, heard by the other: the key starts
    // afresh under its override, and no refusal cached under the old limit outlives it.
    assert_eq!(passed(&two, "carol", 3).await, 2);
    let five = Override::Quota(Quota::per_minute(5));
    one_handle.set_override("api", "carol", five).await.unwrap();
    within_a_second("quota heard", || async {
        send(&two, "carol").await.0 == StatusCode::OK
    })
    .await;
    assert_eq!(passed(&two, "carol", 8).await, 4);
    assert_eq!(
        two_handle
            .peek("api", "carol")
            .await
            .unwrap()
            .override_in_force,
        Some(five)
    );
    // A pattern and a ban, heard by the other.
    one_handle
        .set_override("api", "premium_*", Override::Unlimited)
        .await
        .unwrap();
    one_handle
        .ban("api", "mallory", Duration::from_secs(60))
        .await
        .unwrap();
    within_a_second("pattern and ban heard", || async {
        send(&two, "mallory").await.0 == StatusCode::TOO_MANY_REQUESTS
            && passed(&two, "premium_x", 3).await == 3
    })
    .await;
    assert!(passed(&two, "premium_y", 5).await == 5);
    // Both processes restart: the overrides are read from Redis again.
    drop((one, two, one_handle, two_handle));
    let (three, three_handle) = app(backend(&url, "fleet", RedisMode::Lua).await);
    three_handle.refresh_overrides().await.unwrap();
    assert_eq!(passed(&three, "bob", 10).await, 10);
    assert_eq!(passed(&three, "premium_z", 5).await, 5);
    assert_eq!(
        send(&three, "mallory").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let mut listed: Vec<String> = three_handle
        .overrides("api")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    listed.sort();
    assert_eq!(listed, ["bob", "carol", "premium_*"]);
    assert_eq!(three_handle.bans("api").unwrap().len(), 1);
    // A layer built without awaiting anything reads them on its own, at once.
    let (four, _) = app(backend(&url, "fleet", RedisMode::Lua).await);
    within_a_second("read at start", || async {
        send(&four, "premium_w").await.0 == StatusCode::OK
            && send(&four, "mallory").await.0 == StatusCode::TOO_MANY_REQUESTS
    })
    .await;
}

/// Redis restarted with nothing kept: its records are gone, and so must be what every process
/// held of them. Each reads every table again once its subscription is back, retrying while Redis
/// still fails fast, rather than holding a ban that no longer exists (and that nobody can list in
/// Redis) until the next change.
#[tokio::test]
async fn on_redis_a_restart_that_lost_the_records_is_heard_by_every_process() {
    let mut server = redis_support::RedisServer::start();
    let url = server.url();
    let (one, one_handle) = app(backend(&url, "lost", RedisMode::Lua).await);
    let (two, two_handle) = app(backend(&url, "lost", RedisMode::Lua).await);
    one_handle
        .ban("api", "mallory", Duration::from_secs(600))
        .await
        .unwrap();
    within_a_second("ban heard", || async {
        send(&two, "mallory").await.0 == StatusCode::TOO_MANY_REQUESTS
    })
    .await;
    server.restart();
    crate::support::failover::wait_until(
        Duration::from_secs(15),
        "the lost ban was still held after Redis came back",
        || async {
            one_handle.bans("api").unwrap().is_empty() && two_handle.bans("api").unwrap().is_empty()
        },
    )
    .await;
    // Polled without a request: each would count under the policy's two a minute.
    assert_eq!(send(&one, "mallory").await.0, StatusCode::OK);
    assert_eq!(send(&two, "mallory").await.0, StatusCode::OK);
}

/// A ban that ended over a minute ago leaves the policy's Redis hash at the next read of its bans,
/// so that bans come and go without the hash growing for good; a field written again since the
/// read is kept.
#[tokio::test]
async fn on_redis_ended_bans_leave_the_records() {
    use tower_throttle::Backend;
    let server = redis_support::RedisServer::start();
    let backend = backend(&server.url(), "ended", RedisMode::Lua).await;
    let records = backend.records().expect("Redis keeps records");
    let (_app, handle) = app(backend);
    // Ended two minutes ago (a ban stays a minute past its end: clocks differ).
    let ended = std::time::SystemTime::now() - Duration::from_secs(120);
    let ms = ended
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let written = records.write("bans:api", "mallory", Some(&ms.to_string()));
    written.await.unwrap();
    handle
        .ban("api", "eve", Duration::from_secs(60))
        .await
        .unwrap();
    let fields = || async { records.read("bans:api").await.unwrap() };
    within_a_second("the ended ban removed", || async {
        let kept = fields().await;
        kept.len() == 1 && kept[0].0 == "eve"
    })
    .await;
    // Removed only while unchanged.
    let (eve, value) = fields().await.remove(0);
    let stale = vec![(eve.clone(), "1".to_owned())];
    records.remove_unchanged("bans:api", stale).await.unwrap();
    assert_eq!(fields().await.len(), 1);
    records
        .remove_unchanged("bans:api", vec![(eve, value)])
        .await
        .unwrap();
    assert!(fields().await.is_empty());
}

/// An override Redis keeps but cannot announce (PUBLISH refused) is an error to its writer, and
/// in force in the writer's process all the same.
#[tokio::test]
async fn on_redis_an_override_kept_but_not_told_is_an_error_and_in_force_here() {
    let server = redis_support::RedisServer::start();
    server.cli(&["ACL", "SETUSER", "writer", "on", ">pw", "~*", "&*", "+@all"]);
    let url = server.url().replacen("redis://", "redis://writer:pw@", 1);
    let (app, handle) = app(backend(&url, "untold", RedisMode::Lua).await);
    server.cli(&["ACL", "SETUSER", "writer", "-publish"]);
    let error = handle
        .set_override("api", "bob", Override::Unlimited)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("no permissions to run the 'publish'"),
        "{error}"
    );
    let listed = handle.overrides("api").unwrap();
    assert_eq!(listed, [("bob".to_owned(), Override::Unlimited)]);
    drop(app);
}

/// An override that another process never heard of (its writer could not announce it) is in
/// force there too within a minute: every process reads its tables again unasked.
#[tokio::test]
async fn on_redis_an_untold_override_reaches_the_other_processes_within_a_minute() {
    let server = redis_support::RedisServer::start();
    server.cli(&["ACL", "SETUSER", "writer", "on", ">pw", "~*", "&*", "+@all"]);
    let url = server.url().replacen("redis://", "redis://writer:pw@", 1);
    let (writer, handle) = app(backend(&url, "reread", RedisMode::Lua).await);
    let (other, other_handle) = app(backend(&server.url(), "reread", RedisMode::Lua).await);
    // Told: the other process has read the table since it started.
    handle
        .set_override("api", "alice", Override::Blocked)
        .await
        .unwrap();
    let heard = || other_handle.overrides("api").unwrap().len();
    within_a_second("the told override", || async { heard() == 1 }).await;
    server.cli(&["ACL", "SETUSER", "writer", "-publish"]);
    let told = handle.set_override("api", "bob", Override::Unlimited).await;
    assert!(told.is_err(), "the PUBLISH was refused: {told:?}");
    assert_eq!(heard(), 1);
    let deadline = Instant::now() + Duration::from_secs(75);
    while heard() == 1 {
        assert!(Instant::now() < deadline, "never read again");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut listed = other_handle.overrides("api").unwrap();
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    let want = [("alice", Override::Blocked), ("bob", Override::Unlimited)];
    assert_eq!(listed, want.map(|(k, o)| (k.to_owned(), o)));
    drop((writer, other));
}

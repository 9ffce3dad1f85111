//! `ThrottleLayer::handle`: peek, reset and reload through a running layer, on memory and Redis.
//! Exact counts while the policy table is swapped under 100 concurrent requests; an invalid reload
//! leaves the running table in force; a request in flight finishes with the table it started with.

use std::sync::Arc;

use crate::shared::admin_handle::{
    app, get_as, peek_and_reset_through_the_layer, policy, reload_under_load, table,
    tiers_and_stacks, API_FIELD,
};
use crate::support::asks::Asks;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use tower_throttle::config::Config;
use tower_throttle::key::{Header, PeerIp};
use tower_throttle::{ops::HandleError, Algorithm, MemoryBackend, Policy, Quota, ThrottleLayer};

/// The table of the reload test: `api` never changes (limit 50, no refill during the test);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_reload_under_load_keeps_exact_counts() {
    reload_under_load(MemoryBackend::new()).await;
}

#[tokio::test]
async fn memory_peek_and_reset_through_the_layer() {
    peek_and_reset_through_the_layer(MemoryBackend::new()).await;
}

#[tokio::test]
async fn an_invalid_reload_leaves_the_running_table_in_force() {
    let layer = ThrottleLayer::builder().policies(table(1)).build().unwrap();
    let handle = layer.handle();
    let app = app(layer);
    assert_eq!(get_as(&app, "/other", "u").await.status(), StatusCode::OK);
    // Two policies of one name with different quotas; a policy that can never apply; nothing.
    let mut twice = table(3);
    twice.push(policy("other", "/elsewhere", Quota::per_minute(9)));
    let err = handle.reload(twice).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
    let mut shadowed = table(3);
    shadowed.push(policy("again", "/api", Quota::per_minute(9)));
    assert!(handle.reload(shadowed).is_err());
    assert!(handle.reload(Vec::new()).is_err());
    // Still the first table: `other` at 1 a minute, already spent.
    assert_eq!(handle.policies().len(), 2);
    assert_eq!(
        get_as(&app, "/other", "u").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let response = get_as(&app, "/api", "u").await;
    assert_eq!(response.headers()["ratelimit-policy"], API_FIELD);
}

/// A request admitted under one table finishes under it: its concurrency slot is given back to the
/// limit that gave it, though a reload removed the policy meanwhile.
#[tokio::test]
async fn a_request_in_flight_finishes_with_the_table_it_started_with() {
    let downloads = || {
        Policy::builder("downloads")
            .route("/download")
            .quota(Quota::per_second(1))
            .algorithm(Algorithm::Concurrency)
            .key(Header::new("x-user-id"))
            .build()
            .unwrap()
    };
    let layer = ThrottleLayer::builder()
        .policy(downloads())
        .build()
        .unwrap();
    let handle = layer.handle();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = Arc::new(tokio::sync::Mutex::new(Some(released)));
    let app = Router::new()
        .route(
            "/download",
            get(move || {
                let released = released.clone();
                async move {
                    if let Some(wait) = released.lock().await.take() {
                        wait.await.ok();
                    }
                    "done"
                }
            }),
        )
        .layer(layer);
    let in_flight = tokio::spawn({
        let app = app.clone();
        async move { get_as(&app, "/download", "u").await }
    });
    // Wait until the slot is taken, for 10 s at most: a pipeline that never takes it fails here
    // instead of hanging.
    let taken = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while handle
            .peek("downloads", "u")
            .await
            .unwrap()
            .summary()
            .remaining
            != 0
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(taken.is_ok(), "the request in flight never took its slot");
    handle
        .reload([policy("api", "/api", Quota::per_second(5))])
        .unwrap();
    release.send(()).unwrap();
    let response = in_flight.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["ratelimit-policy"], r#""downloads";q=1"#);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "done"
    );
    // Back under the old policy's limit: reloading it finds its slot free.
    handle.reload([downloads()]).unwrap();
    assert_eq!(
        handle
            .peek("downloads", "u")
            .await
            .unwrap()
            .summary()
            .remaining,
        1
    );
    assert_eq!(
        get_as(&app, "/download", "u").await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn keys_are_given_as_the_text_the_policy_extracts() {
    let by_ip = Policy::builder("by-ip")
        .quota(Quota::per_minute(3))
        .key(PeerIp::new())
        .build()
        .unwrap();
    let layer = ThrottleLayer::new(by_ip);
    let handle = layer.handle();
    let backend = layer.backend().clone();
    let key = PeerIp::new().key_for("2001:db8::1".parse().unwrap());
    assert!(
        backend
            .check_one(&layer.policies()[0].limit().clone(), &key, 1)
            .await
            .unwrap()
            .allowed
    );
    // Any address of the /64 names the key.
    for text in ["2001:db8::1", "2001:db8::ffff"] {
        assert_eq!(
            handle
                .peek("by-ip", text)
                .await
                .unwrap()
                .summary()
                .remaining,
            2
        );
    }
    assert!(matches!(
        handle.peek("by-ip", "alice").await,
        Err(HandleError::InvalidKey { .. })
    ));
}

#[tokio::test]
async fn a_config_reload_applies_routes_and_refuses_what_needs_a_restart() {
    let text = |count: u64| {
        format!(
            "[[route]]\nname = \"api\"\npath = \"/api\"\nkey = \"header:x-user-id\"\n\
             count = {count}\nperiod = \"1h\"\n"
        )
    };
    let running = Config::from_toml(&text(2)).unwrap();
    let layer = running.memory_layer().unwrap();
    let handle = layer.handle();
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(layer);
    assert_eq!(get_as(&app, "/api", "u").await.status(), StatusCode::OK);
    let running = handle.reload_toml(&running, &text(4)).unwrap();
    // The state carries over as the GCRA keeps it, as time: one request at 2 an hour is half an
    // hour of backlog, which at 4 an hour is two requests, so 2 of 4 remain.
    let state = handle.peek("api", "u").await.unwrap().summary();
    assert_eq!((state.limit, state.remaining), (4, 2));
    for _ in 0..2 {
        assert_eq!(get_as(&app, "/api", "u").await.status(), StatusCode::OK);
    }
    assert_eq!(
        get_as(&app, "/api", "u").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for (bad, says) in [
        ("[[route]]\nname = \"api\"".to_owned(), "missing field"),
        (text(0), "count must be at least 1"),
        (
            format!("legacy_headers = true\n{}", text(9)),
            "legacy_headers",
        ),
        (
            format!("[backend]\nkind = \"memory\"\nmax_keys = 5\n{}", text(9)),
            "[backend]",
        ),
    ] {
        let err = handle.reload_toml(&running, &bad).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    }
    assert_eq!(handle.policies()[0].limit().quota().count(), 4);
    handle.reset("api", "u").await.unwrap();
    assert_eq!(get_as(&app, "/api", "u").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn memory_peek_and_reset_cover_every_tier_and_stacked_limit() {
    tiers_and_stacks(MemoryBackend::new()).await;
}

/// Under redacted keys, a pseudonym copied from `top` or a log is refused by name: taken for a
/// key of those bytes, a reset or a ban would answer done and touch nobody; by a quota keyed apart
/// either.
#[tokio::test]
async fn a_pseudonym_is_refused_where_keys_are_redacted() {
    let policy = || {
        Policy::builder("api")
            .key(Header::new("x-user-id"))
            .quota(Quota::per_minute(1))
            .quota_keyed(Quota::per_minute(5), Header::new("x-org-id"))
            .build()
            .unwrap()
    };
    let redacting = ThrottleLayer::builder()
        .policy(policy())
        .redact_keys(true)
        .build()
        .unwrap();
    let pseudonym = "hmac:0123456789abcdef";
    let handle = redacting.handle();
    match handle.reset("api", pseudonym).await {
        Err(HandleError::InvalidKey { reason, .. }) => assert!(reason.contains("pseudonym")),
        other => panic!("{other:?}"),
    }
    assert!(handle
        .ban("api", pseudonym, std::time::Duration::from_secs(60))
        .await
        .is_err());
    // Without redaction it is a key like another.
    let plain = ThrottleLayer::new(policy());
    assert!(plain.handle().reset("api", pseudonym).await.is_ok());
}

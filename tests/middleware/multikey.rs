//! Several keys in one atomic decision on the memory backend (`tests/shared/multikey.rs`; on
//! Redis: `tests/redis/multikey.rs`), and what such a policy cannot be built with.

use tower_throttle::key::Header;
use tower_throttle::policy::Penalty;
use tower_throttle::{BuildError, MemoryBackend, Policy, Quota};

use crate::shared::multikey::{one_user_in_one_org, several_users_in_one_org};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_users_in_one_org_admit_exactly_the_org_limit_and_refusals_charge_no_user() {
    several_users_in_one_org(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_user_in_one_org_admits_exactly_the_user_limit_and_charges_the_org_for_those_only() {
    one_user_in_one_org(MemoryBackend::new()).await;
}

fn keyed() -> tower_throttle::PolicyBuilder<Header> {
    Policy::builder("api")
        .key(Header::new("x-user-id"))
        .quota(Quota::per_minute(10))
        .quota_keyed(Quota::per_minute(1000), Header::new("x-org-id"))
}

fn error(result: Result<Policy<Header>, BuildError>) -> String {
    result.unwrap_err().to_string()
}

#[test]
fn quotas_keyed_apart_are_named_by_their_key_and_refuse_what_they_cannot_be_used_with() {
    let policy = keyed().build().unwrap();
    let names: Vec<&str> = policy.limits().iter().map(|l| l.name()).collect();
    assert_eq!(names, ["api.1m", "api.1m.x-org-id"]);
    let tiers = error(keyed().tier("paid", [Quota::per_minute(100)]).build());
    assert!(tiers.contains("tiers"), "{tiers}");
    let penalty = Penalty::new(
        3,
        std::time::Duration::from_secs(60),
        std::time::Duration::from_secs(60),
    );
    let banned = error(keyed().penalty(penalty.unwrap()).build());
    assert!(banned.contains("penalty"), "{banned}");
    let counted = error(
        keyed()
            .count_only(|s: http::StatusCode| s.is_success())
            .build(),
    );
    assert!(counted.contains("count_only"), "{counted}");
    // A slot held under one key and given back under another would leak: refused.
    let slots = error(
        keyed()
            .algorithm(tower_throttle::Algorithm::Concurrency)
            .build(),
    );
    assert!(slots.contains("concurrency"), "{slots}");
    // Two quotas of one period under one key make one name twice.
    let twice = error(
        keyed()
            .quota_keyed(Quota::per_minute(5), Header::new("x-org-id"))
            .build(),
    );
    assert!(twice.contains("period and key"), "{twice}");
    // `quota` and `quotas` set the stack anew, keys included.
    let plain = keyed().quotas([Quota::per_minute(10)]).build().unwrap();
    assert_eq!(plain.limits()[0].name(), "api");
}

#[test]
fn toml_quota_keys_are_the_route_s_own_quotas_only() {
    use tower_throttle::config::Config;
    let policies = Config::from_toml(crate::shared::multikey::TOML)
        .unwrap()
        .policies()
        .unwrap();
    let names: Vec<&str> = policies[0].limits().iter().map(|l| l.name()).collect();
    assert_eq!(names, ["api.1h.x-user-id", "api.1h.x-org-id"]);
    let tier = r#"
[[route]]
name = "api"
key = "header:x-user-id"
count = 10
period = "1m"
[route.tiers.paid]
quotas = [{ count = 100, period = "1m", key = "header:x-org-id" }]
"#;
    let why = Config::from_toml(tier)
        .unwrap()
        .policies()
        .unwrap_err()
        .to_string();
    assert!(why.contains("not a tier's"), "{why}");
    let body = r#"
[[route]]
name = "api"
key = "header:x-user-id"
quotas = [{ count = 10, period = "1m" }, { count = 100, period = "1m", key = "json:org" }]
"#;
    let why = Config::from_toml(body)
        .unwrap()
        .policies()
        .unwrap_err()
        .to_string();
    assert!(why.contains("body"), "{why}");
}

#[tokio::test]
async fn a_message_check_is_refused_for_quotas_keyed_apart() {
    let layer = tower_throttle::ThrottleLayer::new(keyed().build().unwrap());
    let handle = layer.handle();
    let key = tower_throttle::Key::from("alice");
    let why = handle
        .check_key("api", &key, 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(why.contains("keys of their own"), "{why}");
}

#[tokio::test]
async fn quotas_keyed_apart_take_unlimited_and_blocked_overrides_not_a_quota() {
    use tower_throttle::ops::Override;
    let layer = tower_throttle::ThrottleLayer::new(keyed().build().unwrap());
    let handle = layer.handle();
    let quota = Override::Quota(tower_throttle::Quota::per_minute(100));
    let why = handle
        .set_override("api", "alice", quota)
        .await
        .unwrap_err();
    assert!(why.to_string().contains("keys of their own"), "{why}");
    handle
        .set_override("api", "alice", Override::Unlimited)
        .await
        .unwrap();
    handle
        .set_override("api", "mallory", Override::Blocked)
        .await
        .unwrap();
    assert_eq!(handle.overrides("api").unwrap().len(), 2);
}

/// An override's quota kept from before a reload gave its policy quotas with keys of their own
/// is not applied to it (such a policy takes no quota override): the policy's own quotas decide.
#[tokio::test]
async fn a_quota_override_from_before_keys_apart_is_not_applied() {
    use tower_throttle::ops::Override;
    let one_key = Policy::builder("api")
        .key(Header::new("x-user-id"))
        .quota(Quota::per_minute(2))
        .build()
        .unwrap();
    let layer = tower_throttle::ThrottleLayer::new(one_key);
    let handle = layer.handle();
    let more = Override::Quota(Quota::per_minute(100));
    handle.set_override("api", "alice", more).await.unwrap();
    let (logs, _guard) = crate::support::failover::Logs::capture();
    let keyed = Policy::builder("api")
        .key(Header::new("x-user-id"))
        .quota(Quota::per_minute(2))
        .quota_keyed(Quota::per_minute(1000), Header::new("x-org-id"))
        .build()
        .unwrap();
    handle.reload([keyed]).unwrap();
    assert_eq!(
        logs.count("quota overrides kept by the reload are not applied"),
        1
    );
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let mut request = crate::support::request("/");
        request
            .headers_mut()
            .insert("x-user-id", "alice".parse().unwrap());
        request
            .headers_mut()
            .insert("x-org-id", "acme".parse().unwrap());
        statuses.push(crate::support::status_of(&app, request).await.as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200, 429],
        "2 a minute, not the override's 100"
    );
}

/// `peek` and `reset` of a policy whose quotas have keys of their own read and clear each limit
/// under the key given: a user's key for the user's limit, an organisation's for the
/// organisation's.
#[tokio::test]
async fn peek_and_reset_read_each_keyed_quota_under_the_key_given() {
    let layer = tower_throttle::ThrottleLayer::new(keyed().build().unwrap());
    let handle = layer.handle();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..3 {
        let mut request = crate::support::request("/");
        let headers = request.headers_mut();
        headers.insert("x-user-id", "alice".parse().unwrap());
        headers.insert("x-org-id", "acme".parse().unwrap());
        assert_eq!(crate::support::status_of(&app, request).await, 200);
    }
    let remaining = |state: tower_throttle::ops::PolicyState, limit: usize| {
        state.tiers[0].limits[limit].1.remaining
    };
    assert_eq!(remaining(handle.peek("api", "alice").await.unwrap(), 0), 7);
    assert_eq!(remaining(handle.peek("api", "acme").await.unwrap(), 1), 997);
    assert_eq!(
        remaining(handle.peek("api", "alice").await.unwrap(), 1),
        1000
    );
    handle.reset("api", "alice").await.unwrap();
    assert_eq!(remaining(handle.peek("api", "alice").await.unwrap(), 0), 10);
    assert_eq!(remaining(handle.peek("api", "acme").await.unwrap(), 1), 997);
    handle.reset("api", "acme").await.unwrap();
    assert_eq!(
        remaining(handle.peek("api", "acme").await.unwrap(), 1),
        1000
    );
}

/// A quota keyed by the client's address groups it as the route's prefixes say (a /24 counts as
/// one), under a route keyed otherwise too (the prefixes were refused there, and ignored for the
/// quota's own key).
#[tokio::test]
async fn a_quota_keyed_by_address_takes_the_route_s_prefixes() {
    use crate::support::{from_peer, request, status_of};
    use axum::{routing::get, Router};
    use http::StatusCode;
    use tower_throttle::{config::Config, ThrottleLayer};
    let toml = r#"
[[route]]
name = "api"
key = "header:x-user-id"
ipv4_prefix = 24
quotas = [{ count = 10, period = "1m" }, { count = 1, period = "1m", key = "ip" }]
"#;
    let policies = Config::from_toml(toml).unwrap().policies().unwrap();
    let layer = ThrottleLayer::builder().policies(policies).build().unwrap();
    let handle = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let from = |user: &str, peer: &str| {
        let mut r = from_peer(request("/"), peer);
        r.headers_mut().insert("x-user-id", user.parse().unwrap());
        r
    };
    assert_eq!(
        status_of(&app, from("a", "192.0.2.1:1")).await,
        StatusCode::OK
    );
    // Another user at another address of the same /24: its address quota is spent.
    let same_24 = status_of(&app, from("b", "192.0.2.200:1")).await;
    assert_eq!(same_24, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        status_of(&app, from("c", "192.0.3.1:1")).await,
        StatusCode::OK
    );
    // An operator names the address as the quota's key reads it (the route's key reads text): the
    // peek shows its quota spent, and the reset lifts it.
    let peeked = handle.peek("api", "192.0.2.7").await.unwrap();
    assert_eq!(peeked.tiers[0].limits[1].1.remaining, 0, "{peeked:?}");
    handle.reset("api", "192.0.2.7").await.unwrap();
    assert_eq!(
        status_of(&app, from("d", "192.0.2.9:1")).await,
        StatusCode::OK
    );
}

/// A route with one global quota and one per user: the user's name is peeked and reset under
/// the user's quota (the route's own key reads any text as the one global key).
#[tokio::test]
async fn a_global_route_peeks_and_resets_its_per_user_quota_by_the_user_s_name() {
    use tower_throttle::key::Global;
    let policy = Policy::builder("api")
        .key(Global)
        .quota(Quota::per_minute(100))
        .quota_keyed(Quota::per_minute(2), Header::new("x-user"))
        .build()
        .unwrap();
    let layer = tower_throttle::ThrottleLayer::new(policy);
    let handle = layer.handle();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..2 {
        let mut request = crate::support::request("/");
        request
            .headers_mut()
            .insert("x-user", "alice".parse().unwrap());
        assert_eq!(crate::support::status_of(&app, request).await, 200);
    }
    let user = |state: tower_throttle::ops::PolicyState| state.tiers[0].limits[1].1.remaining;
    assert_eq!(user(handle.peek("api", "alice").await.unwrap()), 0);
    handle.reset("api", "alice").await.unwrap();
    assert_eq!(user(handle.peek("api", "alice").await.unwrap()), 2);
}

/// A route keyed by address with a quota keyed by a header: the header's value is peeked and
/// reset under that quota (it is no address, which the route's key would refuse).
#[tokio::test]
async fn an_address_route_peeks_and_resets_its_header_quota_by_the_header_s_value() {
    use tower_throttle::{config::Config, ThrottleLayer};
    let toml = r#"
[[route]]
name = "api"
key = "ip"
quotas = [{ count = 10, period = "1m" }, { count = 2, period = "1m", key = "header:x-org-id" }]
"#;
    let policies = Config::from_toml(toml).unwrap().policies().unwrap();
    let layer = ThrottleLayer::builder().policies(policies).build().unwrap();
    let handle = layer.handle();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    for peer in ["192.0.2.1:1", "192.0.2.2:1"] {
        let mut request = crate::support::from_peer(crate::support::request("/"), peer);
        request
            .headers_mut()
            .insert("x-org-id", "acme".parse().unwrap());
        assert_eq!(crate::support::status_of(&app, request).await, 200);
    }
    let peeked = handle.peek("api", "acme").await.unwrap();
    assert_eq!(peeked.tiers[0].limits[1].1.remaining, 0, "{peeked:?}");
    handle.reset("api", "acme").await.unwrap();
    let peeked = handle.peek("api", "acme").await.unwrap();
    assert_eq!(peeked.tiers[0].limits[1].1.remaining, 2, "{peeked:?}");
}

/// A quota's own key is written as the route's is: an array is a composite key, and a path
/// parameter is read from the route's path.
#[tokio::test]
async fn a_toml_quota_key_may_be_composite_and_read_the_path() {
    use axum::routing::get;
    use tower_throttle::config::Config;
    let toml = r#"
[[route]]
name = "api"
path = "/teams/{team}"
key = "header:x-user-id"
quotas = [
  { count = 2, period = "1m" },
  { count = 3, period = "1m", key = ["header:x-org-id", "path:team"] },
]
"#;
    let layer = Config::from_toml(toml).unwrap().memory_layer().unwrap();
    let app = axum::Router::new()
        .route("/teams/{team}", get(|| async { "team" }))
        .layer(layer);
    let status = |user: &str, org: &str, team: &str| {
        let request = http::Request::get(format!("/teams/{team}"))
            .header("x-user-id", user)
            .header("x-org-id", org)
            .body(axum::body::Body::empty())
            .unwrap();
        let app = &app;
        async move { crate::support::status_of(app, request).await.as_u16() }
    };
    // Three a minute per organisation and team, whoever asks; two per user.
    let mut statuses = Vec::new();
    for user in ["u1", "u2", "u3", "u4"] {
        statuses.push(status(user, "acme", "red").await);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(status("u4", "acme", "blue").await, 200, "another team");
    assert_eq!(
        status("u4", "other", "red").await,
        200,
        "another organisation"
    );
    assert_eq!(status("u4", "other", "red").await, 429, "u4's own two");
}

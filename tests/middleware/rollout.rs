//! Rolling a limit out, in memory on a frozen manual clock (so every count is exact): a shadow
//! limit never refuses and its would-limits are counted exactly, while the policy's own limits
//! refuse at their own quota; staged enforcement refuses for a stable tenth of 1,000 keys, the
//! same keys in two layers built apart; a dry run is unchanged; bad rollouts are build errors.
//! (On real Redis: tests/redis/rollout.rs.)

use std::collections::BTreeSet;

use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{policy::PolicyDecision, Algorithm, Key, Policy, Quota, ThrottleLayer};

use crate::support::{
    backend, from_user, header, layer_on, sample_or_zero as sample, with_metrics,
};

fn app(policy: Policy<Header>) -> Router {
    let (backend, _clock) = backend();
    Router::new()
        .route(
            "/items",
            get(|d: Option<Extension<PolicyDecision>>| async move {
                d.map_or("-".to_owned(), |Extension(d)| d.enforced.to_string())
            }),
        )
        .layer(layer_on(backend, policy))
}

#[test]
fn a_shadow_limit_never_refuses_and_counts_exactly_what_it_would() {
    // Enforce 100 a minute and 150 an hour (a stack), shadow 50 a minute.
    let policy = Policy::builder("api")
        .quotas([Quota::per_minute(100), Quota::per_hour(150)])
        .shadow(Quota::per_minute(50))
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let ((statuses, other), page) = with_metrics(async {
        let app = app(policy);
        let mut statuses = Vec::new();
        for _ in 0..300 {
            statuses.push(
                app.clone()
                    .oneshot(from_user("ann"))
                    .await
                    .unwrap()
                    .status(),
            );
        }
        // Another key has its own shadow state.
        let other = app
            .clone()
            .oneshot(from_user("bob"))
            .await
            .unwrap()
            .status();
        (statuses, other)
    });
    // The enforced stack alone decides: 100 pass (not 50), the rest are refused; the shadow
    // limit's refusals of requests 51..100 did not stop the stack from counting them.
    assert!(statuses[..100].iter().all(|s| *s == StatusCode::OK));
    assert!(statuses[100..]
        .iter()
        .all(|s| *s == StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(other, StatusCode::OK);
    let would = "throttle_requests_would_limit_total{policy=\"api\",limit=\"api.shadow.1m\"}";
    // Every request reached the backend, so the shadow limit decided all 300: 250 over its 50.
    assert_eq!(sample(&page, would), 250.0, "{page}");
    assert_eq!(
        sample(&page, "throttle_requests_allowed_total{policy=\"api\"}"),
        101.0
    );
    assert_eq!(
        sample(&page, "throttle_requests_limited_total{policy=\"api\"}"),
        200.0
    );
}

/// A reset starts the key's shadow count again, as it does its enforced one.
#[test]
fn a_reset_starts_the_shadow_count_again() {
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(100))
        .shadow(Quota::per_minute(2))
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let (backend, _clock) = backend();
    let layer = layer_on(backend, policy);
    let handle = layer.handle();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .layer(layer);
    let ((), page) = with_metrics(async {
        for _ in 0..3 {
            app.clone().oneshot(from_user("ann")).await.unwrap();
        }
        handle.reset("api", "ann").await.unwrap();
        for _ in 0..2 {
            app.clone().oneshot(from_user("ann")).await.unwrap();
        }
    });
    // One over the shadow quota before the reset; the two after it fit a fresh count.
    let would = "throttle_requests_would_limit_total{policy=\"api\",limit=\"api.shadow.1m\"}";
    assert_eq!(sample(&page, would), 1.0, "{page}");
}

/// The users of 1,000 keys whose second request (of a quota of one) is refused by a layer of its
/// own; every other second request is let through with `enforced: false`.
async fn refused_keys(policy: Policy<Header>) -> BTreeSet<u32> {
    let app = app(policy);
    let mut refused = BTreeSet::new();
    for user in 0..1000u32 {
        let name = format!("user-{user}");
        let first = app.clone().oneshot(from_user(&name)).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        let second = app.clone().oneshot(from_user(&name)).await.unwrap();
        match second.status() {
            StatusCode::TOO_MANY_REQUESTS => {
                refused.insert(user);
            }
            StatusCode::OK => {
                // As a dry run answers: the fields, and a decision that says it was not enforced.
                assert_eq!(header(&second, "ratelimit"), Some(r#""api";r=0;t=60"#));
                let body = crate::support::body_string(second).await;
                assert_eq!(body, "false");
            }
            other => panic!("{other}"),
        }
    }
    refused
}

fn staged(fraction: f64) -> Policy<Header> {
    Policy::builder("api")
        .quota(Quota::per_minute(1))
        .enforce_fraction(fraction)
        .key(Header::new("x-user"))
        .build()
        .unwrap()
}

#[test]
fn staged_enforcement_refuses_for_a_stable_tenth_of_the_keys() {
    let (refused, page) = with_metrics(refused_keys(staged(0.10)));
    assert!(
        (70..=130).contains(&refused.len()),
        "{} of 1000 keys refused",
        refused.len()
    );
    // Exactly the keys the policy says it enforces, and the same keys in a layer built apart.
    let policy = staged(0.10);
    for user in 0..1000u32 {
        let key = Key::from(format!("user-{user}"));
        assert_eq!(
            policy.enforces(&key),
            refused.contains(&user),
            "user-{user}"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert_eq!(runtime.block_on(refused_keys(staged(0.10))), refused);
    // Raising the share only adds keys.
    let twenty = runtime.block_on(refused_keys(staged(0.20)));
    assert!(refused.is_subset(&twenty) && twenty.len() > refused.len());
    // The refusals it enforced are counted as limited; the others only as would-limit.
    let limited = sample(&page, "throttle_requests_limited_total{policy=\"api\"}");
    let would = sample(
        &page,
        "throttle_requests_would_limit_total{policy=\"api\",limit=\"api\"}",
    );
    assert_eq!(limited, refused.len() as f64);
    assert_eq!(would, (1000 - refused.len()) as f64);
}

/// 2 a minute per `x-user`, in a dry run.
fn dry_run() -> Policy<Header> {
    Policy::builder("api")
        .quota(Quota::per_minute(2))
        .dry_run(true)
        .key(Header::new("x-user"))
        .build()
        .unwrap()
}

#[test]
fn a_dry_run_is_unchanged_and_counts_no_would_limit() {
    let policy = dry_run();
    assert_eq!(policy.enforce_fraction(), 0.0);
    let (bodies, page) = with_metrics(async {
        let app = app(policy);
        let mut bodies = Vec::new();
        for _ in 0..5 {
            let res = app.clone().oneshot(from_user("ann")).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            bodies.push(crate::support::body_string(res).await);
        }
        bodies
    });
    assert_eq!(bodies, ["false"; 5]);
    assert_eq!(
        sample(&page, "throttle_requests_limited_total{policy=\"api\"}"),
        3.0
    );
    assert!(
        !page.contains("throttle_requests_would_limit_total"),
        "{page}"
    );
}

/// An operator's ban on a dry-run policy is not enforced, and the request is counted once: as the
/// backend decides it (allowed), not also as limited and banned.
#[test]
fn a_dry_runs_ban_counts_each_request_once() {
    let (_, page) = with_metrics(async {
        let layer = layer_on(backend().0, dry_run());
        let handle = layer.handle();
        handle
            .ban("api", "ann", std::time::Duration::from_secs(3600))
            .await
            .unwrap();
        let app = Router::new()
            .route("/items", get(|| async { "ok" }))
            .layer(layer);
        let res = app.oneshot(from_user("ann")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    });
    let count = |name: &str| sample(&page, &format!("{name}{{policy=\"api\"}}"));
    assert_eq!(count("throttle_requests_allowed_total"), 1.0, "{page}");
    assert_eq!(count("throttle_requests_limited_total"), 0.0, "{page}");
    assert_eq!(count("throttle_requests_banned_total"), 0.0, "{page}");
}

#[test]
fn bad_rollouts_are_build_errors() {
    let q = Quota::per_minute(10);
    let err = |b: tower_throttle::PolicyBuilder<tower_throttle::key::PeerIp>| {
        b.build().unwrap_err().to_string()
    };
    for share in [1.1, -0.01, f64::NAN] {
        let e = err(Policy::builder("api")
            .key(tower_throttle::key::PeerIp::new())
            .quota(q)
            .enforce_fraction(share));
        assert!(
            e.contains("enforce must be a share of keys from 0% to 100%"),
            "{e}"
        );
    }
    assert!(err(Policy::builder("api")
        .key(tower_throttle::key::PeerIp::new())
        .quota(q)
        .dry_run(true)
        .enforce_fraction(0.5))
    .contains("dry_run and enforce"));
    assert!(err(Policy::builder("api")
        .key(tower_throttle::key::PeerIp::new())
        .quota(q)
        .algorithm(Algorithm::Concurrency)
        .shadow(q))
    .contains("a shadow limit needs a rate"));
    assert!(err(Policy::builder("api")
        .key(tower_throttle::key::PeerIp::new())
        .quota(q)
        .shadow(q)
        .shadow(Quota::per_minute(5)))
    .contains("named twice"));
    assert!(err(Policy::builder("api")
        .key(tower_throttle::key::PeerIp::new())
        .quota(q)
        .tier("shadow", [Quota::per_minute(1), Quota::per_hour(10)])
        .shadow(Quota::per_minute(1)))
    .contains("named twice"));
    assert!(err(Policy::builder("api")
        .key(tower_throttle::key::PeerIp::new())
        .quota(q)
        .shadow(Quota::per_minute(2))
        .cost(3))
    .contains("cost 3 exceeds the limit 2"));
    assert!(err(Policy::builder("api")
        .key(tower_throttle::key::PeerIp::new())
        .quota(q)
        .shadow(Quota::per_minute(5))
        .count_only(|s| s == 401))
    .contains("shadow limit"));
    // A layer refuses a shadow limit whose name a limit of another stack has.
    let other = Policy::builder("api.shadow")
        .key(tower_throttle::key::PeerIp::new())
        .route("/other")
        .quotas([Quota::per_second(3), Quota::per_hour(100)])
        .build()
        .unwrap();
    let api = Policy::builder("api")
        .key(tower_throttle::key::PeerIp::new())
        .route("/api")
        .quota(q)
        .shadow(Quota::per_second(3))
        .build()
        .unwrap();
    assert_eq!(api.shadow_limits()[0].name(), "api.shadow.1s");
    let e = ThrottleLayer::builder()
        .policy(api)
        .policy(other)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"api.shadow.1s\" is used by two different stacks"),
        "{e}"
    );
}

/// The TOML keys: `shadow = true` on a quota of the route's stack, `enforce = "10%"` on a route;
/// the guide's example builds; bad values are errors that name the route.
#[test]
fn the_toml_keys_shadow_and_enforce() {
    use tower_throttle::config::Config;

    let guide = include_str!("../../src/guide/configuration.md");
    let at = guide.find("A route that tries a tighter limit").unwrap();
    let start = at + guide[at..].find("```toml\n").unwrap() + "```toml\n".len();
    let toml = &guide[start..start + guide[start..].find("```").unwrap()];
    let policies = Config::from_toml(toml).unwrap().policies().unwrap();
    let names = |limits: &[tower_throttle::Limit]| -> Vec<String> {
        limits.iter().map(|l| l.name().to_owned()).collect()
    };
    assert_eq!(names(policies[0].limits()), ["api"]);
    assert_eq!(names(policies[0].shadow_limits()), ["api.shadow.1m"]);
    assert_eq!(policies[0].shadow_limits()[0].quota().count(), 50);
    assert_eq!(policies[0].enforce_fraction(), 1.0);
    assert!((policies[1].enforce_fraction() - 0.10).abs() < 1e-9);
    // The same keys as the builder's 10 %.
    let built = staged(0.10);
    for user in 0..200 {
        let key = Key::from(format!("user-{user}"));
        assert_eq!(policies[1].enforces(&key), built.enforces(&key));
    }

    let route = |extra: &str| {
        format!("[[route]]\nname = \"api\"\nkey = \"global\"\ncount = 5\nperiod = \"1s\"\n{extra}")
    };
    let err = |toml: String| match Config::from_toml(&toml) {
        Err(e) => e.to_string(),
        Ok(config) => match config.policies() {
            Ok(_) => panic!("accepted:\n{toml}"),
            Err(e) => e.to_string(),
        },
    };
    for bad in ["110%", "-1%", "10", "often"] {
        let e = err(route(&format!("enforce = \"{bad}\"")));
        assert!(
            e.contains("policy \"api\"") && e.contains("is not a percentage"),
            "{bad}: {e}"
        );
    }
    let e = err(route("enforce = \"10%\"\nmode = \"dry-run\""));
    assert!(e.contains("dry_run and enforce"), "{e}");
    let stack = |quotas: &str| {
        format!("[[route]]\nname = \"api\"\nkey = \"global\"\nquotas = [{quotas}]\n")
    };
    let e = err(stack("{ count = 5, period = \"1s\", shadow = true }"));
    assert!(e.contains("at least one must be enforced"), "{e}");
    let e = err(format!(
        "{}[route.tiers.paid]\nquotas = [{{ count = 9, period = \"1s\" }}, \
         {{ count = 5, period = \"1s\", shadow = true }}]\n",
        route("")
    ));
    assert!(
        e.contains("tier \"paid\": shadow = true is for the route's own quotas"),
        "{e}"
    );
}

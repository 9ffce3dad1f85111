//! `ThrottleHandle::check`: messages of a stream under a layer's policy — counted like requests,
//! banned by its penalty box, reported in its metrics, only counted in a dry run; policies that
//! cannot count messages say why.

use std::time::Duration;

use tower_throttle::key::Header;
use tower_throttle::ops::HandleError;
use tower_throttle::policy::Penalty;
use tower_throttle::{Algorithm, Policy, Quota, ThrottleLayer};

use crate::support::{sample_or_zero as sample, with_metrics};

fn layer(policy: Policy<Header>) -> ThrottleLayer<Header, tower_throttle::MemoryBackend> {
    ThrottleLayer::new(policy)
}

fn chat() -> tower_throttle::PolicyBuilder<Header> {
    Policy::builder("chat")
        .quota(Quota::per_hour(3))
        .key(Header::new("x-user"))
}

/// A shadow limit counts messages as it counts requests: their refusals only reported, as
/// would-limit (it never saw them).
#[test]
fn a_shadow_limit_counts_messages_too() {
    let policy = Policy::builder("chat")
        .quota(Quota::per_hour(100))
        .shadow(Quota::per_minute(1))
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let handle = layer(policy).handle();
    let (allowed, page) = with_metrics(async move {
        let mut allowed = Vec::new();
        for _ in 0..3 {
            allowed.push(handle.check("chat", "ann", 1).await.unwrap().allowed);
        }
        allowed
    });
    assert_eq!(allowed, [true, true, true]);
    let would = "throttle_requests_would_limit_total{policy=\"chat\",limit=\"chat.shadow.1m\"}";
    assert_eq!(sample(&page, would), 2.0, "{page}");
}

/// Messages that leave a limit near its end are counted as near-limit requests are.
#[test]
fn a_message_near_its_limit_is_counted() {
    let handle = layer(chat().near_limit(0.6).build().unwrap()).handle();
    let ((), page) = with_metrics(async move {
        for _ in 0..4 {
            handle.check("chat", "ann", 1).await.unwrap();
        }
    });
    // 1 of 3 used: not near; 2 and 3: near; the 4th is refused, which is not near.
    let near = "throttle_requests_near_limit_total{policy=\"chat\",limit=\"chat\"}";
    assert_eq!(sample(&page, near), 2.0, "{page}");
}

#[test]
fn messages_count_like_requests_and_are_reported() {
    let handle = layer(chat().build().unwrap()).handle();
    let (allowed, page) = with_metrics(async move {
        let mut allowed = Vec::new();
        for _ in 0..5 {
            allowed.push(handle.check("chat", "ann", 1).await.unwrap().allowed);
        }
        // Another key has its own count; a cost of 2 takes two units.
        let bob = handle.check("chat", "bob", 2).await.unwrap();
        assert_eq!((bob.allowed, bob.remaining), (true, 1));
        let refused = handle.check("chat", "ann", 1).await.unwrap();
        assert!(refused.retry_after.unwrap() > Duration::from_secs(1000));
        allowed
    });
    assert_eq!(allowed, [true, true, true, false, false]);
    let series = |name: &str| sample(&page, &format!("{name}{{policy=\"chat\"}}"));
    assert_eq!(series("throttle_requests_allowed_total"), 4.0, "{page}");
    assert_eq!(series("throttle_requests_limited_total"), 3.0, "{page}");
}

#[tokio::test]
async fn the_penalty_box_bans_a_flooding_stream_and_a_dry_run_only_counts() {
    let penalty = Penalty::new(2, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    let handle = layer(chat().penalty(penalty).build().unwrap()).handle();
    for _ in 0..3 {
        assert!(handle.check("chat", "mal", 1).await.unwrap().allowed);
    }
    assert!(!handle.check("chat", "mal", 1).await.unwrap().banned);
    let banned = handle.check("chat", "mal", 1).await.unwrap();
    assert!(banned.banned && !banned.allowed, "{banned:?}");
    // The ban (600 s), or the quota's own wait if longer (a unit of 3 an hour: 1,200 s).
    assert!(
        banned.retry_after.unwrap() > Duration::from_secs(1190),
        "{banned:?}"
    );
    // Banned before the backend: still banned, with the rest of the ban.
    let again = handle.check("chat", "mal", 1).await.unwrap();
    let rest = again.retry_after.unwrap();
    assert!(again.banned && rest <= Duration::from_secs(600) && rest > Duration::from_secs(590));

    let dry = layer(chat().dry_run(true).build().unwrap()).handle();
    for _ in 0..6 {
        assert!(dry.check("chat", "ann", 1).await.unwrap().allowed);
    }
}

#[tokio::test]
async fn a_policy_that_cannot_count_messages_says_why() {
    let handle = layer(chat().build().unwrap()).handle();
    let error = |e: HandleError| e.to_string();
    assert_eq!(
        error(handle.check("nope", "ann", 1).await.unwrap_err()),
        "no policy is called \"nope\""
    );
    assert_eq!(
        error(handle.check("chat", "ann", 4).await.unwrap_err()),
        "policy \"chat\" cannot check messages: a message costs 1 to 3 units, not 4"
    );
    // The most it names is a cost it takes.
    assert!(handle.check("chat", "ann", 3).await.unwrap().allowed);
    let slots = Policy::builder("slots")
        .quota(Quota::per_second(2))
        .algorithm(Algorithm::Concurrency)
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let handle = layer(slots).handle();
    assert!(error(handle.check("slots", "ann", 1).await.unwrap_err())
        .contains("a concurrency limit holds a slot per request"));
    // A message cannot wait for its turn as a delayed request does.
    let delayed = chat().delay(Duration::from_secs(5)).build().unwrap();
    let handle = layer(delayed).handle();
    assert!(error(handle.check("chat", "ann", 1).await.unwrap_err())
        .contains("a delayed limit makes a request wait"));
}

/// A message is judged by the same steps as a request: under a staged policy, a refusal for a key
/// outside its share comes back allowed and is counted as would-limit only, and one inside it is
/// refused, counted as limited, and its retry jittered as a request's `Retry-After` is.
#[test]
fn a_staged_policy_counts_messages_as_it_counts_requests() {
    let jitter = Duration::from_secs(600);
    let policy = chat()
        .enforce_fraction(0.5)
        .retry_after_jitter(jitter)
        .build()
        .unwrap();
    let (inside, outside) = (0..100)
        .map(|i| format!("user-{i}"))
        .partition::<Vec<_>, _>(|user| policy.enforces(&tower_throttle::Key::from(user.clone())));
    let (inside, outside) = (inside[0].clone(), outside[0].clone());
    let handle = layer(policy).handle();
    let ((enforced, unenforced), page) = with_metrics(async move {
        for user in [&inside, &outside] {
            for _ in 0..3 {
                assert!(handle.check("chat", user, 1).await.unwrap().allowed);
            }
        }
        let mut enforced = Vec::new();
        for _ in 0..3 {
            enforced.push(handle.check("chat", &inside, 1).await.unwrap());
        }
        let unenforced = handle.check("chat", &outside, 1).await.unwrap();
        (enforced, unenforced)
    });
    // Each refusal: its own wait (a unit of 3 an hour: 1,200 s) with at most the jitter added,
    // never less; three of them all within 2 s of it would be a 1-in-27-million chance.
    let own = Duration::from_secs(1200);
    let retries: Vec<_> = enforced.iter().map(|d| d.retry_after.unwrap()).collect();
    assert!(enforced.iter().all(|d| !d.allowed), "{enforced:?}");
    assert!(retries
        .iter()
        .all(|&r| r + Duration::from_secs(1) >= own && r <= own + jitter));
    assert!(
        retries.iter().any(|&r| r > own + Duration::from_secs(2)),
        "{retries:?}"
    );
    assert!(
        unenforced.allowed && unenforced.remaining == 0,
        "{unenforced:?}"
    );
    let series = |name: &str, labels: &str| sample(&page, &format!("{name}{{{labels}}}"));
    let policy = "policy=\"chat\"";
    assert_eq!(
        series("throttle_requests_allowed_total", policy),
        6.0,
        "{page}"
    );
    assert_eq!(
        series("throttle_requests_limited_total", policy),
        3.0,
        "{page}"
    );
    let limit = "policy=\"chat\",limit=\"chat\"";
    assert_eq!(
        series("throttle_requests_would_limit_total", limit),
        1.0,
        "{page}"
    );
}

/// A message meets the layer's access lists by its key, as a request does: an allowed key is not
/// limited (nor counted), a denied one is refused with no retry, the others are limited.
#[tokio::test]
async fn the_access_lists_answer_messages_by_key() {
    let lists = tower_throttle::ops::AccessList::new();
    lists.allow_key("internal");
    lists.deny_key("stolen");
    let layer = ThrottleLayer::builder()
        .policy(chat().build().unwrap())
        .access_list(lists)
        .build()
        .unwrap();
    let handle = layer.handle();
    for _ in 0..5 {
        assert!(handle.check("chat", "internal", 1).await.unwrap().allowed);
    }
    let denied = handle.check("chat", "stolen", 1).await.unwrap();
    assert!(
        !denied.allowed && denied.retry_after.is_none(),
        "{denied:?}"
    );
    let others: Vec<_> = allowed_in_turn(&handle, "ann", 4).await;
    assert_eq!(others, [true, true, true, false]);
}

/// A policy keyed by address: a message meets the network lists by its key's address, as its
/// upgrade met them by the client's.
#[tokio::test]
async fn the_network_lists_answer_messages_of_a_policy_keyed_by_address() {
    let lists = tower_throttle::ops::AccessList::new();
    lists.allow_network("10.0.0.0/8").unwrap();
    lists.deny_network("203.0.113.0/24").unwrap();
    let policy = Policy::builder("chat")
        .quota(Quota::per_hour(3))
        .key(tower_throttle::key::PeerIp::new())
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .policy(policy)
        .access_list(lists)
        .build()
        .unwrap();
    let handle = layer.handle();
    for _ in 0..5 {
        assert!(handle.check("chat", "10.1.2.3", 1).await.unwrap().allowed);
    }
    let denied = handle.check("chat", "203.0.113.9", 1).await.unwrap();
    assert!(
        !denied.allowed && denied.retry_after.is_none(),
        "{denied:?}"
    );
    let mut others = Vec::new();
    for _ in 0..4 {
        others.push(handle.check("chat", "192.0.2.1", 1).await.unwrap().allowed);
    }
    assert_eq!(others, [true, true, true, false]);
}

async fn allowed_in_turn(
    handle: &tower_throttle::ops::ThrottleHandle<Header, tower_throttle::MemoryBackend>,
    key: &str,
    n: usize,
) -> Vec<bool> {
    let mut allowed = Vec::new();
    for _ in 0..n {
        allowed.push(handle.check("chat", key, 1).await.unwrap().allowed);
    }
    allowed
}

/// A backend that answers a message's stack with a decision short is failing, as for a request:
/// the check returns its error (the caller's choice), not a decision made of part of the stack.
#[tokio::test]
async fn a_backend_that_answers_a_stack_short_fails_the_message() {
    use std::future::{ready, Ready};
    use tower_throttle::backend::{BackendError, Charges, Decisions, Uses};
    use tower_throttle::{Backend, BuildError, Decision, Limit, ThrottleLayerBuilder};

    struct Short;
    impl Backend for Short {
        type Future = Ready<Result<Decisions, BackendError>>;
        fn check(&self, _: Charges<'_>) -> Self::Future {
            let allowed = Decision::allowed(3, 2, Duration::ZERO);
            ready(Ok(Decisions::Many(vec![allowed])))
        }
        // Takes stacks, and answers them short.
        fn validate(&self, _: &[Limit], _: Uses) -> Result<(), BuildError> {
            Ok(())
        }
    }
    let stack = chat().quotas([Quota::per_hour(3), Quota::per_minute(2)]);
    let layer = ThrottleLayerBuilder::with_backend(Short)
        .policy(stack.build().unwrap())
        .build()
        .unwrap();
    let error = layer.handle().check("chat", "ann", 1).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("returned 1 decisions for 2 stacked limits"),
        "{text}"
    );
}

/// A message costing more than an override's quota holds is refused for good (it would pass the
/// policy's more generous quota), and the override still holds for the key's other messages.
#[tokio::test]
async fn a_costly_message_leaves_an_override_in_force() {
    use tower_throttle::ops::Override;
    let handle = layer(chat().quota(Quota::per_minute(100)).build().unwrap()).handle();
    let ten = Override::Quota(Quota::per_minute(10));
    handle.set_override("chat", "abuser", ten).await.unwrap();
    let costly = handle.check("chat", "abuser", 50).await.unwrap();
    assert!(
        !costly.allowed && costly.retry_after.is_none(),
        "{costly:?}"
    );
    assert!(handle.check("chat", "bob", 50).await.unwrap().allowed);
    let mut admitted = 0;
    while handle.check("chat", "abuser", 1).await.unwrap().allowed {
        admitted += 1;
        assert!(admitted <= 100, "the override no longer holds");
    }
    assert_eq!(admitted, 10);
    // A larger override, or none at all, takes a message the policy's own quota could not.
    let thousand = Override::Quota(Quota::per_minute(1000));
    handle.set_override("chat", "vip", thousand).await.unwrap();
    handle
        .set_override("chat", "staff", Override::Unlimited)
        .await
        .unwrap();
    assert!(
        handle.check("chat", "bob", 500).await.is_err(),
        "past the policy's quota"
    );
    assert!(handle.check("chat", "vip", 500).await.unwrap().allowed);
    assert!(handle.check("chat", "staff", 500).await.unwrap().allowed);
}

/// A message of a banned key is refused with the quota the key has under the ban: its
/// override's, as a request's refusal shows it.
#[tokio::test]
async fn a_banned_message_shows_the_keys_override_quota() {
    use tower_throttle::ops::Override;
    let handle = layer(chat().build().unwrap()).handle();
    let raised = Override::Quota(Quota::per_hour(1000));
    handle.set_override("chat", "vip", raised).await.unwrap();
    handle
        .ban("chat", "vip", std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let refused = handle.check("chat", "vip", 1).await.unwrap();
    assert!(!refused.allowed && refused.banned, "{refused:?}");
    assert_eq!(refused.limit, 1000);
}

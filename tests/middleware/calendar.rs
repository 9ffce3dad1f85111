//! A calendar window written in TOML, through the layer on a manual clock: a billing month in
//! Paris anchored on the 31st answers its refusal with `Retry-After` and the `RateLimit` field's
//! `t` at the exact boundary (February 29th 2028 at midnight, Paris time), and the TOML keys'
//! mistakes are errors that say what is wrong.

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use std::time::Duration;
use tower::ServiceExt;

use crate::support::{backend, header, layer_on, request};
use tower_throttle::config::Config;
use tower_throttle::Quota;

fn route(keys: &str) -> Result<tower_throttle::Policy<tower_throttle::key::KeySpec>, String> {
    let text = format!("[[route]]\nname = \"billing\"\nkey = \"header:x-customer\"\n{keys}\n");
    let config = Config::from_toml(&text).map_err(|e| e.to_string())?;
    config.routes[0].policy().map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_billing_month_answers_with_the_exact_boundary() {
    let policy =
        route("count = 2\ncalendar = \"month\"\ntimezone = \"Europe/Paris\"\nanchor_day = 31")
            .unwrap();
    let (backend, clock) = backend();
    // 2028-02-28T12:00+01:00: twelve hours to 2028-02-29T00:00+01:00.
    clock.set(Duration::from_secs(1_835_348_400));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer_on(backend, policy));
    let from = || {
        let mut r = request("/");
        r.headers_mut().insert("x-customer", "c-1".parse().unwrap());
        r
    };
    for _ in 0..2 {
        assert_eq!(
            app.clone().oneshot(from()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    let refused = app.clone().oneshot(from()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), Some("43200"));
    assert_eq!(
        header(&refused, "ratelimit"),
        Some(r#""billing";r=0;t=43200"#)
    );
    // At the boundary the month's quota is back.
    clock.advance(Duration::from_secs(43_200));
    assert_eq!(
        app.clone().oneshot(from()).await.unwrap().status(),
        StatusCode::OK
    );
}

#[test]
fn the_keys_mistakes_are_errors_that_say_what_is_wrong() {
    let error = |keys: &str| route(&format!("count = 2\n{keys}")).unwrap_err();
    assert!(error("calendar = \"year\"")
        .contains(r#"calendar "year" is not one of "day", "week", "month""#));
    assert!(error("calendar = \"day\"\ntimezone = \"Europe/Pariss\"")
        .contains(r#"unknown time zone "Europe/Pariss""#));
    assert!(error("calendar = \"month\"\nanchor_day = 32")
        .contains("anchor_day must be 1 to 31, not 32"));
    assert!(error("calendar = \"month\"\nanchor_day = -1")
        .contains("anchor_day must be 1 to 31, not -1"));
    assert!(error("calendar = \"week\"\nanchor_day = 3")
        .contains(r#"anchor_day is for calendar = "month", not "week""#));
    assert!(error("anchor_day = 3").contains("timezone and anchor_day go with calendar"));
    assert!(error("timezone = \"UTC\"\nperiod = \"1m\"")
        .contains("timezone and anchor_day go with calendar"));
    assert!(error("calendar = \"day\"\nalgorithm = \"gcra\"")
        .contains(r#"calendar windows are fixed windows (algorithm "fixed-window"), not gcra"#));
    assert!(error("calendar = \"day\"\nperiod = \"1h\"")
        .contains(r#"leave the period out (or write "1day")"#));
    assert!(error("calendar = \"day\"\nwindow_start = \"per-key\"").contains("per-key"));
    // The period, when written, is the calendar's.
    let weekly = route("count = 2\ncalendar = \"week\"\nperiod = \"7days\"").unwrap();
    assert_eq!(weekly.limits()[0].calendar().unwrap().zone(), "UTC");
    assert!(route(
        "count = 2\ncalendar = \"month\"\nperiod = \"1month\"\nalgorithm = \"fixed-window\""
    )
    .is_ok());
}

/// A quota override of the calendar's period keeps the policy's calendar: its key's window ends
/// at the same boundary (it was cut from the epoch, 30.44 days long).
#[tokio::test]
async fn an_overridden_quota_keeps_the_calendar() {
    use tower_throttle::ops::Override;
    use tower_throttle::window::CalendarPeriod;
    let policy =
        route("count = 2\ncalendar = \"month\"\ntimezone = \"Europe/Paris\"\nanchor_day = 31")
            .unwrap();
    let (backend, clock) = backend();
    clock.set(Duration::from_secs(1_835_348_400));
    let layer = layer_on(backend, policy);
    let month = Quota::per_period(5, CalendarPeriod::Month.nominal());
    let handle = layer.handle();
    handle
        .set_override("billing", "c-2", Override::Quota(month))
        .await
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let mut from = request("/");
    from.headers_mut()
        .insert("x-customer", "c-2".parse().unwrap());
    let admitted = app.oneshot(from).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(
        header(&admitted, "ratelimit"),
        Some(r#""billing.override";r=4;t=43200"#)
    );
}

/// A shadow quota counts in the policy's calendar windows (its week was cut from the epoch, ending
/// on Thursdays), and one of another period is refused, as an enforced one is.
#[test]
fn a_shadow_quota_keeps_the_calendar() {
    let quotas = |shadow: &str| {
        format!(
            "calendar = \"week\"\ntimezone = \"Europe/Paris\"\nquotas = [\
             {{ count = 10, period = \"7days\" }}, {{ count = 5, period = \"{shadow}\", shadow = true }}]"
        )
    };
    let policy = route(&quotas("7days")).unwrap();
    let shadow = &policy.shadow_limits()[0];
    assert_eq!(shadow.name(), "billing.shadow.7d");
    assert_eq!(shadow.calendar().map(|c| c.zone()), Some("Europe/Paris"));
    let error = route(&quotas("1day")).unwrap_err();
    assert!(error.contains("billing.shadow"), "{error}");
}

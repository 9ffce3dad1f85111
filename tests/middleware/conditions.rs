//! Conditions (`when`) on the memory backend: 1,000 mixed requests routed to exactly the right
//! limits (`tests/shared/conditions.rs`; on Redis: `tests/http/conditions_on_redis.rs`).

use tower_throttle::MemoryBackend;

use crate::shared::conditions::route_exactly;

#[tokio::test]
async fn conditions_route_a_thousand_mixed_requests_to_exactly_the_right_limits() {
    route_exactly(MemoryBackend::new()).await;
}

#[test]
fn bad_conditions_in_toml_are_errors_that_name_the_route() {
    let error = |when: &str| {
        let toml = format!(
            "[[route]]\nname = \"api\"\nkey = \"ip\"\ncount = 1\nperiod = \"1s\"\nwhen = {when}\n"
        );
        match tower_throttle::config::Config::from_toml(&toml) {
            Ok(config) => config.policies().unwrap_err().to_string(),
            Err(error) => error.to_string(),
        }
    };
    assert_eq!(
        error(r#"{ header = { "x client" = "mobile" } }"#),
        r#"policy "api": when: "x client" is not a valid header name"#
    );
    assert_eq!(
        error(r#"{ query = { plan = ["*", "free"] } }"#),
        r#"policy "api": when: "*" (present, any value) stands alone, not in a list of values"#
    );
    assert!(error(r#"{ host = [] }"#).contains("a host condition needs at least one host"));
    assert!(error(r#"{ host = "*.*.org" }"#).contains("is not a host name"));
    assert!(error(r#"{ cookie = { a = "b" } }"#).contains("unknown field `cookie`"));
}

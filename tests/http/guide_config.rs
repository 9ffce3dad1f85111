//! The configuration the guide documents (`src/guide/`) parses and builds as written.

use tower_throttle::config::Config;

use crate::support::redis as redis_support;

/// The first TOML block of `page` after `marker`.
fn toml_block<'a>(page: &'a str, marker: &str) -> &'a str {
    let section = &page[page
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} on the page"))..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    &section[start..start + section[start..].find("```").unwrap()]
}

#[test]
fn the_guide_configuration_file_is_valid() {
    let page = include_str!("../../src/guide/policies.md");
    let toml = toml_block(page, "## The configuration file");
    let config = Config::from_toml(toml).unwrap();
    let layer = config.memory_layer().unwrap();
    let reply = &layer.policies()[0];
    assert_eq!(reply.limit().name(), "reply");
    assert_eq!(reply.limit().quota().limit(), 16);
    assert_eq!(reply.route(), Some("/reply"));
    assert_eq!(config.listen, Some("127.0.0.1:3000".parse().unwrap()));
    assert_eq!(config.trusted_proxies, ["10.0.0.0/8", "::1/128"]);
    assert!(reply.limit().penalty().is_some());
    let access = config.access.as_ref().unwrap();
    assert_eq!(access.deny_networks, ["198.51.100.0/24"]);
}

/// The guide's Redis `[backend]` table parses as written, and connects once its URL points at a
/// running server.
#[tokio::test]
async fn the_guide_redis_backend_table_is_valid() {
    use tower_throttle::config::BackendConfig;
    use tower_throttle::OnBackendError;

    let page = include_str!("../../src/guide/policies.md");
    let toml = toml_block(page, "For Redis, the `[backend]` table is:");
    let config = Config::from_toml(toml).unwrap();
    let BackendConfig::Redis(redis) = &config.backend else {
        panic!("not a redis backend: {:?}", config.backend)
    };
    assert_eq!(redis.url.as_deref(), Some("redis://127.0.0.1:6379/"));
    assert_eq!(redis.mode.as_deref(), Some("auto"));
    assert_eq!(redis.timeout_ms, Some(100));
    assert!(!redis.cluster);
    assert_eq!(config.on_error().unwrap(), OnBackendError::Allow);

    let server = redis_support::RedisServer::start();
    let with_route = format!(
        "{}\n[[route]]\nname = \"api\"\nkey = \"global\"\ncount = 2\nperiod = \"1m\"\n",
        toml.replace("redis://127.0.0.1:6379/", &server.url())
    );
    let layer = Config::from_toml(&with_route)
        .unwrap()
        .layer()
        .await
        .unwrap();
    assert_eq!(layer.policies().len(), 1);

    let bad = toml.replace("mode = \"auto\"", "mode = \"fast\"");
    let err = Config::from_toml(&bad).unwrap().layer().await.unwrap_err();
    assert!(
        err.to_string().contains("unknown Redis mode \"fast\""),
        "{err}"
    );
    let clash = format!("on_backend_error = \"deny\"\n{toml}");
    let err = Config::from_toml(&clash).unwrap().on_error().unwrap_err();
    assert!(err.to_string().contains("disagree"), "{err}");
}

/// The guide's example of every algorithm and mode builds as written.
#[test]
fn the_guide_algorithms_and_modes_are_valid() {
    use std::time::Duration;
    use tower_throttle::Algorithm;

    let page = include_str!("../../src/guide/algorithms.md");
    let section = &page[page.find("## Algorithms and modes").unwrap()..];
    let start = section.find("```toml\n").unwrap() + "```toml\n".len();
    let toml = &section[start..start + section[start..].find("```").unwrap()];
    let config = Config::from_toml(toml).unwrap();
    let layer = config.memory_layer().unwrap();
    let policies = layer.policies();
    let algorithms: Vec<Algorithm> = policies.iter().map(|p| p.limit().algorithm()).collect();
    assert_eq!(
        algorithms,
        [
            Algorithm::SlidingLog,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::Concurrency,
            Algorithm::Gcra,
            Algorithm::Gcra,
            Algorithm::Gcra,
        ]
    );
    assert_eq!(policies[4].limit().delay(), Some(Duration::from_secs(2)));
    assert!(policies[5].is_dry_run());
    assert_eq!(policies[6].limits().len(), 2);
    assert_eq!(policies[6].tier_limits("paid").unwrap().len(), 2);
}

/// The configuration reference's metered route parses and builds a policy of requests and tokens;
/// bad metered keys are errors that name them.
#[test]
fn the_guide_metered_route_is_valid() {
    let page = include_str!("../../src/guide/configuration.md");
    let toml = toml_block(page, "## `metered = { .. }`");
    let config = Config::from_toml(toml).unwrap();
    let policies = config.policies().unwrap();
    let names: Vec<&str> = policies[0].limits().iter().map(|l| l.name()).collect();
    assert_eq!(names, ["chat", "chat.tokens"]);
    let tokens = &policies[0].limits()[1];
    assert!(tokens.is_metered());
    assert_eq!(
        (tokens.quota().count(), tokens.max_debt()),
        (100_000, 100_000)
    );

    let error = |metered: &str| {
        let toml = format!(
            "[[route]]\nname = \"t\"\nkey = \"ip\"\nmetered = {{ count = 10, period = \"1s\", {metered} }}"
        );
        match Config::from_toml(&toml).map(|c| c.policies()) {
            Ok(Ok(_)) => panic!("accepted: {metered}"),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        }
    };
    assert!(error("charge = \"before\"").contains("after-response"));
    assert!(error("unit = \"tokens\"").contains("estimate is required"));
    assert!(error("estimate = 1, usage_header = \"bad header\"").contains("usage_header"));
    // Tokens only: no count or period of the route's own.
    let tokens_only = "[[route]]\nname = \"t\"\nkey = \"ip\"\nmetered = { unit = \"tokens\", count = 10, period = \"1s\", estimate = 2, max_debt = 5 }";
    let policies = Config::from_toml(tokens_only).unwrap().policies().unwrap();
    assert_eq!(policies[0].limits().len(), 1);
    assert_eq!(policies[0].limits()[0].name(), "t.tokens");
    assert_eq!(policies[0].limits()[0].max_debt(), 5);
}

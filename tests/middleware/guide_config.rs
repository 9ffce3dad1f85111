//! The configuration the guide documents (`src/guide/`) parses and builds as written.

use tower_throttle::config::Config;

use crate::shared::guide_config::toml_block;

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
    // The options of a quota of the route's own are refused there, not dropped.
    let refused = |toml: &str| match Config::from_toml(toml) {
        Ok(config) => config.policies().map(|_| ()).unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    for option in [
        "penalty = { after = 3, within = \"1m\", ban = \"1h\" }",
        "calendar = \"day\"",
        "algorithm = \"concurrency\"",
    ] {
        let refused = refused(&format!("{tokens_only}\n{option}"));
        assert!(
            refused.contains("a metered limit alone takes no"),
            "{option}: {refused}"
        );
    }
    // A leased budget, alone or beside a quota of the route's own.
    let with_count =
        tokens_only.replace("key = \"ip\"", "key = \"ip\"\ncount = 60\nperiod = \"1m\"");
    for toml in [tokens_only, &with_count] {
        let refused = refused(&format!("{toml}\nbudget = true"));
        assert!(refused.contains("leased budget"), "{refused}");
    }
}

/// The overload page's configuration builds as written: the gate, its partitions by tier, and a
/// route enforced under pressure only.
#[test]
fn the_guide_overload_configuration_is_valid() {
    let page = include_str!("../../src/guide/overload.md");
    let toml = toml_block(page, "## Configuration");
    let config = Config::from_toml(toml).unwrap();
    let layer = config.memory_layer().unwrap();
    let gate = layer.overload().unwrap();
    assert_eq!(gate.partitions().collect::<Vec<_>>(), ["paid", "default"]);
    assert_eq!(gate.limit(), 40); // ten times min_limit
    assert!(layer.policies()[1].route() == Some("/search"));
}

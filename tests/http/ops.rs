//! What ships in `ops/`: the Prometheus alerting rules pass `promtool check rules` and their unit
//! tests (`promtool test rules`), and every metric the Grafana dashboard and the rules use is one
//! the example server exports (scraped from its `/metrics`, on Redis, after traffic).

use crate::server_settings::{admin_token_from_env, AdminConfig, ServerConfig};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::example_server::{send, start};
use crate::example_server_login::post_json;
use crate::support::redis as redis_support;

fn ops() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/ops"))
}

/// Runs `promtool ARGS` in `ops/`: its output, or a failure that says how to install it.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(ops())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install it with `sudo apt-get install -y prometheus` \
                 (Debian's package; scripts/test.sh installs it)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_alerting_rules_check_and_pass_their_tests() {
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(checked.contains("SUCCESS: 4 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts_test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Every `throttle_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("throttle_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

#[tokio::test]
async fn the_dashboard_and_the_rules_use_only_exported_metrics() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ops().join("grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    // The queries: every `expr` of every panel's targets, and the job variable's query.
    let mut queries = String::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queries.push_str(target["expr"].as_str().unwrap());
            queries.push('\n');
        }
    }
    queries.push_str(
        dashboard["templating"]["list"][1]["definition"]
            .as_str()
            .unwrap(),
    );
    let used_by_dashboard = metric_names(&queries);
    let rules = std::fs::read_to_string(ops().join("alerts.yml")).unwrap();
    let used_by_rules = metric_names(
        &rules
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    assert!(used_by_dashboard.len() >= 7, "{used_by_dashboard:?}");
    assert!(used_by_rules.len() >= 5, "{used_by_rules:?}");

    // The example server on Redis, after allowed and limited requests and a refused reload.
    let redis = redis_support::RedisServer::start();
    let url = redis.url();
    let server = start(&[
        "--redis",
        &url,
        "--redis-mode",
        "lua",
        "--admin",
        "127.0.0.1:0",
    ]);
    for _ in 0..7 {
        post_json(server.addr, "/login", r#"{"username":"alice"}"#).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let exported = loop {
        let scrape = send(server.addr, "GET", "/metrics", &[]).await;
        assert_eq!(scrape.status, 200);
        let exported: BTreeSet<String> = scrape
            .body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(metric_names)
            .collect();
        let missing: Vec<&String> = used_by_dashboard
            .union(&used_by_rules)
            .filter(|n| !exported.contains(*n))
            .collect();
        if missing.is_empty() {
            break exported;
        }
        assert!(
            Instant::now() < deadline,
            "used but not exported: {missing:?}; exported: {exported:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(exported.contains("throttle_backend_up"), "{exported:?}");
    // The rule and the dashboard group by the gauge's `backend` label: the server's Redis, by
    // its address.
    let scrape = send(server.addr, "GET", "/metrics", &[]).await;
    let label = format!("backend=\"127.0.0.1:{}\"", redis.port());
    assert!(
        scrape
            .body
            .lines()
            .any(|l| l.starts_with("throttle_backend_up{") && l.contains(&label)),
        "no {label} on throttle_backend_up: {}",
        scrape.body
    );
}

/// The guide page's `[admin]` and `[server]` block parses as written, with the defaults it states.
#[test]
fn the_guide_admin_and_server_tables_are_valid() {
    let page = include_str!("../../src/guide/observability_admin.md");
    let start = page.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let toml = &page[start..start + page[start..].find("```").unwrap()];
    let config = tower_throttle::config::Config::from_toml(&format!(
        "{toml}\n[[route]]\nname = \"r\"\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n"
    ))
    .unwrap();
    assert_eq!(
        AdminConfig::of(&config).unwrap().token_env.as_deref(),
        Some("ADMIN_TOKEN")
    );
    let server = ServerConfig::of(&config).unwrap();
    assert_eq!(
        server.header_read_timeout().unwrap(),
        ServerConfig::DEFAULT_HEADER_READ_TIMEOUT
    );
    assert_eq!(
        server.max_connections().unwrap(),
        ServerConfig::DEFAULT_MAX_CONNECTIONS
    );
}

/// A bad value or an unknown key in either table is an error that names it.
#[test]
fn bad_admin_and_server_settings_are_clear_errors() {
    let config = |toml: &str| {
        tower_throttle::config::Config::from_toml(&format!(
            "{toml}\n[[route]]\nname = \"r\"\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n"
        ))
        .unwrap()
    };
    let err = ServerConfig::of(&config("[server]\nmax_conections = 5")).unwrap_err();
    assert!(
        err.starts_with("[server]: unknown field `max_conections`"),
        "{err}"
    );
    let err = AdminConfig::of(&config("[admin]\ntoken = \"x\"")).unwrap_err();
    assert!(err.starts_with("[admin]: unknown field `token`"), "{err}");
    let server = ServerConfig::of(&config(
        "[server]\nheader_read_timeout = \"0s\"\nmax_connections = 0",
    ))
    .unwrap();
    assert!(server
        .header_read_timeout()
        .unwrap_err()
        .to_string()
        .contains("header_read_timeout"));
    assert!(server
        .max_connections()
        .unwrap_err()
        .to_string()
        .contains("max_connections"));
    // One hyper would add to the clock on every connection, and overflow it.
    let huge = ServerConfig::of(&config(
        "[server]\nheader_read_timeout = \"10000000000000000000s\"",
    ))
    .unwrap();
    let err = huge.header_read_timeout().unwrap_err().to_string();
    assert!(err.contains("at most 1h"), "{err}");
    let err = admin_token_from_env("TOWER_THROTTLE_NO_SUCH_VAR", "--admin-token-env")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--admin-token-env") && err.contains("not set"),
        "{err}"
    );
}

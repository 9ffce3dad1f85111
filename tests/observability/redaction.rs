//! Keys in logs as HMAC pseudonyms under the operator's secret (builder and `[logging]`), and the
//! one-time warning about forwarding headers reaching a policy keyed on the peer address.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::support::{from_peer, request, status_of};
use axum::{routing::get, Router};
use sha2::{Digest as _, Sha256};
use tower_throttle::config::Config;
use tower_throttle::key::PeerIp;
use tower_throttle::{ops::RedactionSecret, Policy, Quota, ThrottleLayer};

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// What `app` logs at info and above while `peers` each send two requests (one a minute is
/// allowed, so the second is limited and logged).
async fn logs_of(app: Router, peers: &[&str], headers: &[(&'static str, &str)]) -> String {
    logged_while(async {
        for peer in peers {
            for _ in 0..2 {
                let mut r = from_peer(request("/"), peer);
                for (name, value) in headers {
                    r.headers_mut().insert(*name, value.parse().unwrap());
                }
                status_of(&app, r).await;
            }
            // The rejection log opens once a second per policy: a fresh layer per peer would be
            // needed to see each; here one peer's line is enough.
        }
    })
    .await
}

/// What is logged at info and above while `work` runs (on a current-thread runtime).
async fn logged_while(work: impl std::future::Future<Output = ()>) -> String {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    work.await;
    logs.text()
}

fn per_ip() -> Policy<PeerIp> {
    Policy::builder("per-ip")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_minute(1))
        .build()
        .unwrap()
}

fn app_with(secret: Option<&str>) -> Router {
    let builder = ThrottleLayer::builder().policy(per_ip());
    let builder = match secret {
        Some(s) => builder.redact_keys_with(RedactionSecret::new(s).unwrap()),
        None => builder.redact_keys(true),
    };
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(builder.build().unwrap())
}

/// The `key=` field of the "request limited" line.
fn limited_key(logs: &str) -> String {
    let line = logs
        .lines()
        .find(|l| l.contains("request limited"))
        .unwrap_or_else(|| panic!("no rejection logged:\n{logs}"));
    let at = line.find("key=").expect("a key field") + 4;
    line[at..].split_whitespace().next().unwrap().to_owned()
}

const SECRET: &str = "4c1b7f0e9a2d6c3b8e5f1a0d7c2b9e64";

#[tokio::test(flavor = "current_thread")]
async fn an_ipv4_key_is_logged_as_an_hmac_pseudonym_stable_under_one_secret() {
    let one = limited_key(&logs_of(app_with(Some(SECRET)), &["192.0.2.7:1"], &[]).await);
    let again = limited_key(&logs_of(app_with(Some(SECRET)), &["192.0.2.7:1"], &[]).await);
    let other_secret = limited_key(
        &logs_of(
            app_with(Some("another-secret-of-32-characters!")),
            &["192.0.2.7:1"],
            &[],
        )
        .await,
    );
    assert!(one.starts_with("hmac:") && one.len() == 5 + 16, "{one}");
    assert!(!one.contains("192.0.2"), "{one}");
    assert_eq!(
        one, again,
        "one secret, one pseudonym: lines still go together"
    );
    assert_ne!(one, other_secret);
    // A bare hash of the key is what an attacker could recompute for all 2^32 addresses: the
    // pseudonym is not it.
    let bare = Sha256::digest(b"!192.0.2.7");
    let bare_hex: String = bare[..8].iter().map(|b| format!("{b:02x}")).collect();
    assert!(!one.contains(&bare_hex[..12]), "{one} vs {bare_hex}");

    // Without a secret: a pseudonym still, under a secret made up for this layer.
    let made_up = limited_key(&logs_of(app_with(None), &["192.0.2.7:1"], &[]).await);
    assert!(made_up.starts_with("hmac:"), "{made_up}");
    assert_ne!(made_up, one);
}

/// What the handle logs of an operator's overrides and bans names keys as requests' lines do.
#[tokio::test(flavor = "current_thread")]
async fn overrides_and_bans_are_logged_with_the_keys_pseudonym() {
    let layer = ThrottleLayer::builder()
        .policy(per_ip())
        .redact_keys_with(RedactionSecret::new(SECRET).unwrap())
        .build()
        .unwrap();
    let handle = layer.handle();
    let logs = logged_while(async {
        let hour = std::time::Duration::from_secs(3600);
        handle.ban("per-ip", "192.0.2.7", hour).await.unwrap();
        handle.lift_ban("per-ip", "192.0.2.7").await.unwrap();
        let blocked = tower_throttle::ops::Override::Blocked;
        handle
            .set_override("per-ip", "192.0.2.7", blocked)
            .await
            .unwrap();
        handle.remove_override("per-ip", "192.0.2.7").await.unwrap();
    })
    .await;
    let limited = limited_key(&logs_of(app_with(Some(SECRET)), &["192.0.2.7:1"], &[]).await);
    let lines: Vec<&str> = logs.lines().collect();
    assert_eq!(lines.len(), 4, "{logs}");
    for line in lines {
        assert!(!line.contains("192.0.2"), "{line}");
        assert!(
            line.contains(&format!("key={limited}")),
            "{line} vs {limited}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_config_reads_the_secret_from_the_environment_and_refuses_a_short_one() {
    let toml = |var: &str| {
        format!(
            "[logging]\nredact_keys = {{ secret_env = \"{var}\" }}\n[[route]]\nname = \"per-ip\"\n\
             key = \"ip\"\ncount = 1\nperiod = \"1m\"\n"
        )
    };
    // Test-only variables, set once, read by this test only.
    // SAFETY: no other test of this binary reads or writes the environment (this test alone calls
    // `RedactionSecret::from_env`).
    unsafe { std::env::set_var("TT_TEST_REDACTION_SECRET", SECRET) };
    unsafe { std::env::set_var("TT_TEST_SHORT_SECRET", "hunter2") };
    let layer = Config::from_toml(&toml("TT_TEST_REDACTION_SECRET"))
        .unwrap()
        .memory_layer()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let from_config = limited_key(&logs_of(app, &["192.0.2.7:1"], &[]).await);
    let from_builder = limited_key(&logs_of(app_with(Some(SECRET)), &["192.0.2.7:1"], &[]).await);
    assert_eq!(from_config, from_builder);

    let short = Config::from_toml(&toml("TT_TEST_SHORT_SECRET"))
        .unwrap()
        .memory_layer()
        .unwrap_err()
        .to_string();
    assert!(
        short.contains("TT_TEST_SHORT_SECRET") && short.contains("at least 16"),
        "{short}"
    );
    let unset = Config::from_toml(&toml("TT_TEST_UNSET_SECRET"))
        .unwrap()
        .memory_layer()
        .unwrap_err()
        .to_string();
    assert!(unset.contains("TT_TEST_UNSET_SECRET"), "{unset}");
    let flag = Config::from_toml(
        "[logging]\nredact_keys = true\n[[route]]\nname = \"a\"\nkey = \"ip\"\ncount = 1\nperiod = \"1s\"",
    )
    .unwrap();
    assert!(flag.memory_layer().is_ok());
}

/// Behind a proxy every client has the proxy's address: the layer says so, once per process, the
/// first time a request keyed on its peer address carries a forwarding header.
#[tokio::test(flavor = "current_thread")]
async fn forwarding_headers_at_a_peer_keyed_policy_are_warned_about_once() {
    let app = || {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(ThrottleLayer::new(per_ip()))
    };
    let quiet = logs_of(app(), &["10.0.0.1:1"], &[]).await;
    assert!(
        !quiet.contains("forwarding") && !quiet.contains("peer address carries"),
        "{quiet}"
    );

    let proxied = logs_of(
        app(),
        &["10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:1"],
        &[("x-forwarded-for", "203.0.113.7")],
    )
    .await;
    let warnings: Vec<&str> = proxied
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("peer address carries"))
        .collect();
    assert_eq!(warnings.len(), 1, "{proxied}");
    assert!(warnings[0].contains("x-forwarded-for"), "{}", warnings[0]);
    assert!(warnings[0].contains("client-ip"), "{}", warnings[0]);

    let later = logs_of(app(), &["10.0.0.3:1"], &[("forwarded", "for=203.0.113.8")]).await;
    assert!(
        !later.contains("peer address carries"),
        "once per process:\n{later}"
    );
}

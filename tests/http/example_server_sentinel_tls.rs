//! Sentinel over TLS, as a user configures it: a TLS-only primary whose `default` user has a
//! password, three TLS-only sentinels monitoring it, and the example server given only the
//! sentinels' `rediss://` URLs, the service and `primary_password` in its `[backend]` table. The
//! test CA is trusted the way a user's private CA is: `SSL_CERT_FILE` (rustls-native-certs), in the
//! server's process only. A 2 s timeout, as in the other TLS tests: a TLS handshake of a debug
//! build on a busy machine takes longer than the default 100 ms.

use crate::example_server::{send, start_with_env};
use crate::support::failover::{wait_until, Sentinels, SERVICE};
use crate::support::redis::RedisServer;

use std::time::Duration;

const PASSWORD: &str = "primary-s3cret";

#[tokio::test]
async fn the_example_server_finds_a_tls_primary_through_tls_sentinels_with_its_password() {
    let primary = RedisServer::start_tls();
    // The `default` user needs a password now (the harness' own user logs the CLI in).
    primary.cli(&["CONFIG", "SET", "requirepass", PASSWORD]);
    let sentinels = Sentinels::start_tls(&primary, Some(PASSWORD)).await;
    // The sentinels reached the primary over TLS with its password: it is a healthy master to them.
    wait_until(
        Duration::from_secs(20),
        "the sentinels never reached the primary",
        || async {
            let master = sentinels.cli(0, &["SENTINEL", "MASTER", SERVICE]).await;
            let flags = master.lines().skip_while(|l| *l != "flags").nth(1);
            flags == Some("master")
        },
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let config = |password: Option<&str>| {
        let urls: Vec<String> = sentinels.urls().iter().map(|u| format!("{u:?}")).collect();
        let password = password
            .map(|p| format!("primary_password = {p:?}\n"))
            .unwrap_or_default();
        format!(
            "[backend]\nkind = \"redis\"\nsentinels = [{}]\nsentinel_service = \"{SERVICE}\"\n\
             mode = \"lua\"\nconnect = \"eager\"\ntimeout_ms = 2000\n{password}\n\
             [[route]]\nname = \"tls\"\npath = \"/tls\"\nkey = \"global\"\ncount = 3\nperiod = \"1h\"\n",
            urls.join(", ")
        )
    };
    let file = dir.path().join("sentinel-tls.toml");
    std::fs::write(&file, config(Some(PASSWORD))).unwrap();
    let ca = primary.ca_cert_path().unwrap();
    let env = [("SSL_CERT_FILE", ca.to_str().unwrap())];
    let server = start_with_env(&["--config", file.to_str().unwrap()], &env);
    assert!(server.line.contains("backend: redis"), "{}", server.line);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(send(server.addr, "GET", "/tls", &[]).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    // Decided on the primary, through a connection logged in with the password.
    let keys = primary.cli(&["KEYS", "throttle:tls:*"]);
    assert_eq!(keys.lines().count(), 1, "{keys:?}");
    // It listens for other processes' resets there too (over TLS, with the password).
    wait_until(
        Duration::from_secs(10),
        "the server never subscribed to the resets on the primary",
        || async {
            let numsub = primary.cli(&["PUBSUB", "NUMSUB", "throttle:resets"]);
            numsub.lines().nth(1) == Some("1")
        },
    )
    .await;
    drop(server);

    // Without the password the primary refuses the server, which says so and exits.
    std::fs::write(&file, config(None)).unwrap();
    let out = std::process::Command::new(crate::example_server::example_binary())
        .args([
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .envs(env)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("NOAUTH"), "{stderr}");
}

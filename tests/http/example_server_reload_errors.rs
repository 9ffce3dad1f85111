//! A reload the example server refuses says why on one line, as a start-up error does: the JSON
//! error of `POST /reload` (and the warning logged with it) names the file, the line and column and
//! the cause, without the TOML parser's multi-line excerpt (which split the log line into four,
//! two of them a bare `|`). The running configuration stays in force.

use crate::example_server::{admin_addr, json, send, start};
use crate::example_server_admin::CONFIG;

#[tokio::test]
async fn a_refused_reload_says_why_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let server = start(&["--config", file.to_str().unwrap(), "--admin", "127.0.0.1:0"]);
    let admin = admin_addr(&server);

    std::fs::write(&file, CONFIG.replace("\"1m\"", "\"1 fortnight\"")).unwrap();
    let refused = send(admin, "POST", "/reload", &[]).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    let error = json(&refused.body)["error"].as_str().unwrap().to_owned();
    assert!(!error.contains('\n'), "{error:?}");
    assert!(error.starts_with(file.to_str().unwrap()), "{error:?}");
    assert!(error.contains("line 7, column 10"), "{error:?}");
    assert!(
        error.contains("unknown time unit \"fortnight\""),
        "{error:?}"
    );

    // Nothing changed: three replies a minute.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            send(server.addr, "GET", "/reply", &[("x-user-id", "u")])
                .await
                .status,
        );
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
}

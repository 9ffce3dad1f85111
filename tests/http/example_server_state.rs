//! `[backend] state_file`: an in-memory example server stopped with SIGTERM (or SIGINT) writes its
//! live keys, and the next one reads them: a client it refused before the restart is still
//! refused after it, with the same wait; a client it never saw starts afresh. A damaged file is
//! logged and ignored.

use std::time::Duration;

use crate::example_server::{send, start, Server};

const CONFIG: &str = r#"
[backend]
kind = "memory"
state_file = "STATE"

[[route]]
name = "reply"
path = "/reply"
key = "header:x-user-id"
count = 3
period = "1h"
"#;

async fn replies(server: &Server, user: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        let reply = send(server.addr, "GET", "/reply", &[("x-user-id", user)]).await;
        statuses.push(reply.status);
    }
    statuses
}

/// Stops `server` with `signal` and waits for it to exit (it writes its state file first).
fn stop(mut server: Server, signal: &str) {
    let pid = server.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap()
        .success());
    assert!(
        server.exited_within(Duration::from_secs(15)),
        "server {pid} did not exit on {signal}"
    );
}

#[tokio::test]
async fn a_client_refused_before_a_restart_is_refused_after_it() {
    let dir = std::env::temp_dir().join(format!("throttle-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("keys.state");
    let file = dir.join("throttle.toml");
    std::fs::write(&file, CONFIG.replace("STATE", state.to_str().unwrap())).unwrap();
    let config = file.to_str().unwrap();

    let first = start(&["--config", config]);
    assert_eq!(replies(&first, "mallory", 4).await, [200, 200, 200, 429]);
    assert_eq!(replies(&first, "ann", 1).await, [200]);
    stop(first, "-TERM");
    let saved = std::fs::read_to_string(&state).unwrap();
    assert_eq!(
        saved.lines().count(),
        4,
        "a header, two keys and the end: {saved}"
    );

    let second = start(&["--config", config]);
    let refused = send(second.addr, "GET", "/reply", &[("x-user-id", "mallory")]).await;
    assert_eq!(refused.status, 429, "still refused after the restart");
    assert_eq!(
        replies(&second, "ann", 3).await,
        [200, 200, 429],
        "ann had used one"
    );
    assert_eq!(replies(&second, "bob", 4).await, [200, 200, 200, 429]);
    // SIGINT (Ctrl-C) saves too.
    stop(second, "-INT");

    // A damaged file: logged and ignored, every key afresh.
    std::fs::write(&state, "not a state file\n").unwrap();
    let third = start(&["--config", config]);
    assert_eq!(replies(&third, "mallory", 4).await, [200, 200, 200, 429]);
    drop(third);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The state is saved as SIGTERM comes, before the requests in flight are waited for (up to
/// 10 s, by when `docker stop` kills), and again once they are done.
#[tokio::test]
async fn the_state_is_saved_at_once_while_requests_are_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("keys.state");
    let file = dir.path().join("throttle.toml");
    std::fs::write(&file, CONFIG.replace("STATE", state.to_str().unwrap())).unwrap();
    let mut server = start(&["--config", file.to_str().unwrap()]);
    assert_eq!(replies(&server, "mallory", 4).await, [200, 200, 200, 429]);
    let addr = server.addr;
    let held = tokio::spawn(async move {
        send(
            addr,
            "GET",
            "/reply?sleep_ms=5000",
            &[("x-user-id", "slow")],
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = server.pid().to_string();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(term.unwrap().success());
    let mut saved = String::new();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        saved = std::fs::read_to_string(&state).unwrap_or_default();
        if !saved.is_empty() {
            break;
        }
    }
    assert!(saved.contains("mallory"), "not saved within 2 s: {saved:?}");
    assert_eq!(
        held.await.unwrap().status,
        200,
        "the request in flight is answered"
    );
    assert!(server.exited_within(Duration::from_secs(15)));
}

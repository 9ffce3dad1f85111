//! The example server's admin token (`--admin-token-env`, `[admin] token_env`): every admin route
//! answers 401 without `Authorization: Bearer <token>` or with a wrong one, and works with it; the
//! admin listener is refused off loopback without a token.

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use crate::example_server::{admin_addr, example_binary, send, start_with_env};
use crate::example_server_top::ADMIN_CONFIG as CONFIG;

const TOKEN: &str = "test-admin-token-0123456789";

/// Every admin route with a method, and the status it answers with the right token.
const ROUTES: &[(&str, &str, u16)] = &[
    ("GET", "/limits/reply/alice", 200),
    ("DELETE", "/limits/reply/alice", 204),
    ("POST", "/reload", 200),
    ("GET", "/health", 200),
    ("GET", "/top/reply?n=5", 200),
    ("GET", "/overview", 200),
];

async fn every_route_needs_the_token(admin: SocketAddr) {
    let bearer = format!("Bearer {TOKEN}");
    let wrong = format!("Bearer {TOKEN}x");
    let prefix = format!("Bearer {}", &TOKEN[..10]);
    let lower = format!("bearer{TOKEN}");
    for &(method, path, ok) in ROUTES {
        for refused in [
            vec![],
            vec![("authorization", wrong.as_str())],
            vec![("authorization", prefix.as_str())],
            vec![("authorization", lower.as_str())],
            vec![("authorization", "Basic dXNlcjpwYXNz")],
            vec![("x-admin-token", TOKEN)],
        ] {
            let reply = send(admin, method, path, &refused).await;
            assert_eq!(reply.status, 401, "{method} {path} with {refused:?}");
            assert!(reply.body.contains("Bearer"), "{}", reply.body);
        }
        let reply = send(admin, method, path, &[("authorization", &bearer)]).await;
        assert_eq!(reply.status, ok, "{method} {path}: {}", reply.body);
        // The scheme's name is case-insensitive.
        let any_case = bearer.replacen("Bearer", "BEARER", 1);
        let reply = send(admin, method, path, &[("authorization", &any_case)]).await;
        assert_eq!(reply.status, ok, "{method} {path}: {}", reply.body);
    }
    // The page itself is static (a browser cannot send a bearer token when it navigates): it
    // holds no data, and gets everything it shows from the routes above, with the token.
    let page = send(admin, "GET", "/", &[]).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<title>tower-throttle admin</title>"));
    assert!(!page.body.contains("alice") && !page.body.contains(TOKEN));
}

fn config_file(dir: &tempfile::TempDir, text: &str) -> String {
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, text).unwrap();
    file.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_token_flag_guards_every_admin_route() {
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(&dir, CONFIG);
    let server = start_with_env(
        &[
            "--config",
            &file,
            "--admin",
            "127.0.0.1:0",
            "--admin-token-env",
            "THE_ADMIN_TOKEN",
        ],
        &[("THE_ADMIN_TOKEN", TOKEN)],
    );
    every_route_needs_the_token(admin_addr(&server)).await;
}

#[tokio::test]
async fn the_token_from_toml_guards_every_admin_route_and_allows_any_address() {
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(
        &dir,
        &format!("[admin]\ntoken_env = \"TOML_ADMIN_TOKEN\"\n{CONFIG}"),
    );
    // Off loopback (every address): allowed with a token.
    let server = start_with_env(
        &["--config", &file, "--admin", "0.0.0.0:0"],
        &[("TOML_ADMIN_TOKEN", TOKEN)],
    );
    every_route_needs_the_token(admin_addr(&server)).await;
}

/// The one `error:` line of a start that is refused (exit code 2).
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(example_binary())
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

#[test]
fn off_loopback_without_a_token_is_refused() {
    let err = refused_start(&["--admin", "0.0.0.0:0"], &[]);
    assert!(err.contains("not a loopback address"), "{err}");
    assert!(err.contains("--admin-token-env"), "{err}");
}

#[test]
fn a_missing_or_short_token_is_refused() {
    let err = refused_start(
        &[
            "--admin",
            "127.0.0.1:0",
            "--admin-token-env",
            "NO_SUCH_TOKEN_VAR",
        ],
        &[],
    );
    assert!(
        err.contains("--admin-token-env \"NO_SUCH_TOKEN_VAR\"") && err.contains("not set"),
        "{err}"
    );
    let err = refused_start(
        &["--admin", "127.0.0.1:0", "--admin-token-env", "SHORT_TOKEN"],
        &[("SHORT_TOKEN", "abc")],
    );
    assert!(err.contains("at least 16"), "{err}");
    let err = refused_start(&["--admin-token-env", "SHORT_TOKEN"], &[]);
    assert!(err.contains("--admin-token-env needs --admin"), "{err}");
}

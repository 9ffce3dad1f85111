//! The example server as an operator starts it: every start-up error is one line on stderr naming
//! the file and the setting (or the flag), exit code 2, never a panic text; host names in
//! `--listen`; the start-up line names the Redis decision path; no colour codes in a log file.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::support::redis as redis_support;

/// The example binary that `cargo test` built next to this test.
fn example_binary() -> PathBuf {
    let mut dir = std::env::current_exe().unwrap();
    dir.pop(); // the test binary
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("examples").join("server");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --all-features`",
        bin.display()
    );
    bin
}

/// Runs the server with `args` (it is expected to stop at start-up), a backtrace requested, so
/// that a panic would show.
fn run(args: &[&str]) -> Output {
    Command::new(example_binary())
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The one line a failed start printed, checked to be exactly one `error:` line with exit code 2.
fn start_up_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    lines[0].to_owned()
}

/// `text` written to `name` in `dir`; the path as a string.
fn config_file(dir: &Path, name: &str, text: &str) -> String {
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    file.to_str().unwrap().to_owned()
}

/// Runs the server on the config `text` (in a file `name`): its one-line start-up error and the
/// file's path.
fn config_error(name: &str, text: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = config_file(dir.path(), name, text);
    let out = run(&["--config", &file, "--listen", "127.0.0.1:0"]);
    (start_up_error(&out), file)
}

const ROUTE_A: &str =
    "[[route]]\nname = \"a\"\npath = \"/items/{id}\"\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n";

#[test]
fn conflicting_routes_are_one_line_without_a_panic() {
    // Different methods, so the policies do not hide each other (that is refused earlier, see
    // below); the router alone finds the two spellings of one route.
    let a = ROUTE_A.replace("key = ", "methods = [\"GET\"]\nkey = ");
    let other = "[[route]]\nname = \"b\"\npath = \"/items/{item}\"\nmethods = [\"POST\"]\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n";
    let (line, file) = config_error("conflict.toml", &format!("{a}{other}"));
    assert!(
        line.starts_with(&format!("error: {file}: [[route]] \"b\": ")),
        "{line}"
    );
    assert!(line.contains("conflict"), "{line}");
    assert!(line.contains("/items/{id}"), "{line}");
    // Same methods: the second policy could never apply, one line all the same.
    let other = other.replace("methods = [\"POST\"]\n", "");
    let (line, file) = config_error("hidden.toml", &format!("{ROUTE_A}{other}"));
    assert!(line.starts_with(&format!("error: {file}: ")), "{line}");
    assert!(line.contains("policy \"b\" can never apply"), "{line}");
}

#[test]
fn a_route_on_metrics_is_refused() {
    let metrics = "[[route]]\nname = \"scrape\"\npath = \"/metrics\"\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n";
    let (line, file) = config_error("metrics.toml", &format!("{ROUTE_A}{metrics}"));
    assert!(
        line.starts_with(&format!(
            "error: {file}: [[route]] \"scrape\": path = \"/metrics\""
        )),
        "{line}"
    );
}

#[test]
fn an_invalid_access_network_names_access_not_trusted_proxies() {
    let access = "[access]\ndeny_networks = [\"10.0.0.0/33\"]\n";
    let (line, file) = config_error("access.toml", &format!("{ROUTE_A}{access}"));
    assert!(
        line.starts_with(&format!("error: {file}: [access]")),
        "{line}"
    );
    assert!(line.contains("\"10.0.0.0/33\" is not a network"), "{line}");
    assert!(!line.contains("trusted"), "{line}");
    // The trusted proxies keep their own name.
    let proxies = "trusted_proxies = [\"10.0.0.0/33\"]\n";
    let (line, file) = config_error("proxies.toml", &format!("{proxies}{ROUTE_A}"));
    assert!(
        line.starts_with(&format!("error: {file}: trusted_proxies: \"10.0.0.0/33\"")),
        "{line}"
    );
}

#[test]
fn errors_found_after_parsing_name_the_file_and_the_route() {
    let (line, file) = config_error("zero.toml", &ROUTE_A.replace("count = 5", "count = 0"));
    assert_eq!(
        line,
        format!("error: {file}: policy \"a\": quota count must be at least 1")
    );
}

/// The example server reads `[server]` and `[admin]` itself (the library keeps them as tables): an
/// unknown key in either is its start-up error, naming the file and the table.
#[test]
fn unknown_server_and_admin_settings_name_the_file_and_the_table() {
    let (line, file) = config_error(
        "server.toml",
        &format!("[server]\nmax_conections = 5\n{ROUTE_A}"),
    );
    assert_eq!(
        line,
        format!(
            "error: {file}: [server]: unknown field `max_conections`, expected \
             `header_read_timeout` or `max_connections`"
        )
    );
    let (line, file) = config_error("admin.toml", &format!("[admin]\ntoken = \"x\"\n{ROUTE_A}"));
    assert_eq!(
        line,
        format!("error: {file}: [admin]: unknown field `token`, expected `token_env`")
    );
}

#[test]
fn parse_errors_are_one_line_with_the_file_and_the_position() {
    let (line, file) = config_error("typo.toml", &format!("{ROUTE_A}coutn = 5\n"));
    assert!(
        line.starts_with(&format!(
            "error: {file}: line 7, column 1: unknown field `coutn`"
        )),
        "{line}"
    );
}

#[test]
fn a_config_error_with_a_redis_flag_still_names_the_file() {
    // The file is checked before anything connects: the unreachable Redis is not what is reported.
    let (line, file) = {
        let dir = tempfile::tempdir().unwrap();
        let file = config_file(
            dir.path(),
            "zero.toml",
            &ROUTE_A.replace("count = 5", "count = 0"),
        );
        let out = run(&["--config", &file, "--redis", "redis://127.0.0.1:1/"]);
        (start_up_error(&out), file)
    };
    assert!(
        line.starts_with(&format!("error: {file}: policy \"a\"")),
        "{line}"
    );
}

/// `--redis URL` replaces the file's Redis URL only: its failure policy (here `deny`) and prefix
/// stay (a fail-closed file was made fail-open). Cluster seeds or sentinels cannot be replaced by
/// one URL: a start-up error.
#[test]
fn the_redis_flag_keeps_the_files_redis_settings() {
    let dir = tempfile::tempdir().unwrap();
    let backend = "[backend]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1/\"\non_error = \"deny\"\nprefix = \"myapp\"\n";
    let file = config_file(dir.path(), "deny.toml", &format!("{backend}{ROUTE_A}"));
    let unreachable = "redis://127.0.0.1:2/";
    let server = start(&[
        "--config",
        &file,
        "--listen",
        "127.0.0.1:0",
        "--redis",
        unreachable,
    ]);
    assert!(
        server.first_line.contains(unreachable),
        "{}",
        server.first_line
    );
    assert_eq!(send(server.addr(), "GET /items/1"), 503);
    let seeds = backend.replace("url = ", "urls = [\"redis://127.0.0.1:3/\"]\n#");
    let file = config_file(dir.path(), "seeds.toml", &format!("{seeds}{ROUTE_A}"));
    let line = start_up_error(&run(&["--config", &file, "--redis", unreachable]));
    assert!(line.contains("Cluster seeds (urls) or sentinels"), "{line}");
}

#[test]
fn flag_errors_name_the_flag() {
    let line = start_up_error(&run(&[
        "--redis",
        "redis://127.0.0.1:1/",
        "--redis-mode",
        "foo",
    ]));
    assert_eq!(
        line,
        "error: --redis-mode \"foo\": expected auto, cell or lua"
    );
    let line = start_up_error(&run(&["--redis-mode", "lua"]));
    assert_eq!(line, "error: --redis-mode needs --redis");
    let line = start_up_error(&run(&["--config"]));
    assert!(line.starts_with("error: --config needs a file"), "{line}");
    let line = start_up_error(&run(&["--config", "/nonexistent/tt.toml"]));
    assert!(
        line.starts_with("error: --config /nonexistent/tt.toml: "),
        "{line}"
    );
}

#[test]
fn listen_without_a_port_shows_an_example() {
    for bad in ["localhost", "127.0.0.1", "::1:3000", "localhost:http"] {
        let line = start_up_error(&run(&["--listen", bad]));
        assert!(
            line.starts_with(&format!("error: --listen {bad:?}: ")),
            "{line}"
        );
        assert!(
            line.ends_with(
                "expected HOST:PORT, such as 127.0.0.1:3000, [::1]:3000 or localhost:3000"
            ),
            "{line}"
        );
    }
}

/// A running server, killed when dropped.
struct Server {
    child: Child,
    first_line: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server with `args`, stderr piped; waits for its start-up line.
fn start(args: &[&str]) -> Server {
    let mut child = Command::new(example_binary())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first_line)
        .unwrap();
    assert!(
        first_line.starts_with("tower-throttle example listening on http://"),
        "{first_line:?}"
    );
    Server { child, first_line }
}

impl Server {
    fn addr(&self) -> std::net::SocketAddr {
        self.first_line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .unwrap()
            .parse()
            .unwrap()
    }
}

/// One request; the status code.
fn send(addr: std::net::SocketAddr, request_line: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{request_line} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn listen_takes_a_host_name() {
    let server = start(&["--listen", "localhost:0"]);
    let addr = server.addr();
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_eq!(send(addr, "GET /"), 200);
}

#[test]
fn logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let mut server = start(&["--listen", "127.0.0.1:0"]);
    // POST /reply without x-user-id: a warning is logged ("request without a rate-limit key").
    assert_eq!(send(server.addr(), "POST /reply"), 400);
    server.child.kill().unwrap();
    let mut stderr = String::new();
    server
        .child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("request without a rate-limit key"),
        "{stderr:?}"
    );
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
}

#[test]
fn the_start_up_line_names_the_redis_decision_path() {
    let redis = redis_support::RedisServer::start_with_cell();
    let url = redis.url();
    for (mode, path) in [
        // Auto picks the coalesced Lua path, module or not (RedisMode::Auto's rule).
        ("auto", "decisions by the Lua script"),
        ("cell", "decisions by CL.THROTTLE (redis-cell)"),
        ("lua", "decisions by the Lua script"),
    ] {
        let server = start(&[
            "--listen",
            "127.0.0.1:0",
            "--redis",
            &url,
            "--redis-mode",
            mode,
        ]);
        assert!(
            server
                .first_line
                .contains(&format!("backend: redis {url} (mode {mode}), {path};")),
            "{}",
            server.first_line
        );
    }
    let plain = redis_support::RedisServer::start();
    let server = start(&["--listen", "127.0.0.1:0", "--redis", &plain.url()]);
    assert!(
        server
            .first_line
            .contains("(mode auto), decisions by the Lua script;"),
        "{}",
        server.first_line
    );
}

//! The README's Quick start, as a newcomer pastes it: a scratch crate made of README.md's own
//! `Cargo.toml` dependency block and `src/main.rs` block (read from README.md when the test runs, so
//! the README cannot drift), built, started, and driven over TCP: the `/reply` route answers 200s,
//! then 429.
//!
//! The only change to what the README shows: the `tower-throttle` dependency points at this checkout
//! by `path`, keeping the README's features. The scratch crate builds offline into
//! `<target>/tmp/readme-quickstart/` (kept between runs, so only the first run compiles axum and
//! tokio), with this repository's `Cargo.lock`, so it uses the versions the crate is tested with.
//! Every step has a deadline, and the server is killed at the end, pass or fail.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The first build compiles axum, tokio and hyper for the scratch crate; later ones only the crate.
const BUILD_DEADLINE: Duration = Duration::from_secs(1200);
const START_DEADLINE: Duration = Duration::from_secs(30);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// More requests than any sensible Quick-start quota admits at once.
const MAX_REQUESTS: usize = 200;

/// The Quick start's two code blocks: the dependency block and the program.
struct QuickStart {
    dependencies: String,
    main_rs: String,
}

/// The first `toml` block (holding `[dependencies]`) and the first `rust` block of the README's
/// section whose heading starts with `## Quick start`.
fn quick_start(readme: &str) -> QuickStart {
    let section: Vec<&str> = readme
        .lines()
        .skip_while(|line| !line.starts_with("## Quick start"))
        .enumerate()
        .take_while(|(i, line)| *i == 0 || !line.starts_with("## "))
        .map(|(_, line)| line)
        .collect();
    assert!(
        !section.is_empty(),
        "README.md has no `## Quick start` section"
    );

    let mut blocks: Vec<(String, String)> = Vec::new(); // (fence info, body)
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in &section {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), Vec::new())),
            (Some(_), Some(rest)) if rest.trim().is_empty() => {
                let (info, body) = open.take().unwrap();
                blocks.push((info, body.join("\n") + "\n"));
            }
            (Some((_, body)), _) => body.push(line),
            (None, None) => {}
        }
    }
    let block = |lang: &str| {
        blocks
            .iter()
            .find(|(info, body)| {
                info.split(',').next() == Some(lang)
                    && (lang != "toml" || body.contains("[dependencies]"))
            })
            .map(|(_, body)| body.clone())
    };
    let dependencies = block("toml").expect(
        "the README's Quick start shows no ```toml block with [dependencies]: a newcomer cannot \
         know which features to enable",
    );
    let main_rs = block("rust").expect("the README's Quick start has no ```rust block");
    // rustdoc hides lines starting with `# `: a reader never sees them, so the program must not
    // need them.
    for line in main_rs.lines() {
        let trimmed = line.trim_start();
        assert!(
            !(trimmed == "#" || trimmed.starts_with("# ")),
            "the Quick start has a line hidden by rustdoc, which a reader cannot copy: {line:?}"
        );
    }
    QuickStart {
        dependencies,
        main_rs,
    }
}

/// The README's `[dependencies]` block with `tower-throttle` taken from `checkout` (by `path`,
/// instead of the registry version), its features untouched.
fn with_local_tower_throttle(dependencies: &str, checkout: &Path) -> String {
    let path = format!("path = {:?}", checkout.display().to_string());
    let mut found = false;
    let lines: Vec<String> = dependencies
        .lines()
        .map(|line| {
            let Some(value) = line.strip_prefix("tower-throttle").map(str::trim_start) else {
                return line.to_owned();
            };
            let Some(value) = value.strip_prefix('=').map(str::trim) else {
                return line.to_owned();
            };
            found = true;
            if value.starts_with('"') {
                // tower-throttle = "0.1"
                return format!("tower-throttle = {{ {path} }}");
            }
            // tower-throttle = { version = "0.1", features = [..] }
            let start = value
                .find("version")
                .unwrap_or_else(|| panic!("no version in the README's line {line:?}"));
            let rest = &value[start..];
            let quote = rest.find('"').expect("version = \"..\"") + 1;
            let end = start + quote + rest[quote..].find('"').expect("a closing quote") + 1;
            format!(
                "tower-throttle = {}{path}{}",
                &value[..start],
                &value[end..]
            )
        })
        .collect();
    assert!(
        found,
        "the README's Quick start [dependencies] has no `tower-throttle = ..` line:\n{dependencies}"
    );
    lines.join("\n") + "\n"
}

#[test]
fn dependency_lines_point_at_the_checkout_with_the_readme_features() {
    let checkout = Path::new("/src/tower-throttle");
    assert_eq!(
        with_local_tower_throttle(
            "[dependencies]\ntower-throttle = { version = \"0.1\", features = [\"axum\"] }\naxum = \"0.8\"\n",
            checkout
        ),
        "[dependencies]\ntower-throttle = { path = \"/src/tower-throttle\", features = [\"axum\"] }\naxum = \"0.8\"\n"
    );
    assert_eq!(
        with_local_tower_throttle("tower-throttle = \"0.1\"\n", checkout),
        "tower-throttle = { path = \"/src/tower-throttle\" }\n"
    );
}

/// Kills the server however the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `command` to completion within `deadline`, its output in `log`; kills it when time is up.
fn run_with_deadline(mut command: Command, deadline: Duration, log: &Path) {
    let out = fs::File::create(log).unwrap();
    let mut child = command
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("could not run {command:?}: {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} took longer than {deadline:?}; its output:\n{}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "{command:?} failed ({status}); its output:\n{}",
        fs::read_to_string(log).unwrap_or_default()
    );
}

/// One HTTP/1.1 request on a fresh connection: the status code and the raw response head.
fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT).unwrap();
    stream.set_read_timeout(Some(REQUEST_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(REQUEST_TIMEOUT)).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    (status, response)
}

/// The address the server prints (`listening on http://127.0.0.1:PORT`), within the deadline.
fn printed_address(server: &mut Child) -> SocketAddr {
    let stdout = server.stdout.take().unwrap();
    let (lines, printed) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    while let Some(left) = START_DEADLINE.checked_sub(started.elapsed()) {
        let Ok(line) = printed.recv_timeout(left) else {
            break;
        };
        if let Some(at) = line.find("http://") {
            let addr = line[at + "http://".len()..]
                .split(|c: char| c.is_whitespace() || c == '/')
                .next()
                .unwrap();
            return addr
                .parse()
                .unwrap_or_else(|e| panic!("the server printed {line:?}: {addr:?}: {e}"));
        }
    }
    panic!(
        "the Quick start server printed no `http://ADDR` line within {START_DEADLINE:?} \
         (it must print the address it bound, so that LISTEN=127.0.0.1:0 can be used)"
    );
}

#[test]
fn the_readme_quick_start_works_as_pasted() {
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(checkout.join("README.md")).unwrap();
    let quick_start = quick_start(&readme);

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("readme-quickstart");
    let krate = dir.join("crate");
    fs::create_dir_all(krate.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"readme-quickstart\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n# Its own workspace, never a member of one above it.\n[workspace]\n\n{}",
        with_local_tower_throttle(&quick_start.dependencies, checkout)
    );
    fs::write(krate.join("Cargo.toml"), manifest).unwrap();
    fs::write(krate.join("src/main.rs"), &quick_start.main_rs).unwrap();
    // The versions this crate is tested with, and all of them already in cargo's cache.
    fs::copy(checkout.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = dir.join("target");
    let mut build = Command::new(&cargo);
    build
        .args(["build", "--offline", "--manifest-path"])
        .arg(krate.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null());
    run_with_deadline(build, BUILD_DEADLINE, &dir.join("build.log"));

    let binary = target.join("debug").join("readme-quickstart");
    let mut server = Server(
        Command::new(&binary)
            .env("LISTEN", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {}: {e}", binary.display())),
    );
    let addr = printed_address(&mut server.0);

    // As "Then try it" does: user 42 posts replies until the first refusal.
    let mut statuses = Vec::new();
    let mut refusal = String::new();
    for _ in 0..MAX_REQUESTS {
        let (status, response) = request(addr, "POST", "/reply", &[("x-user-id", "42")]);
        statuses.push(status);
        if status != 200 {
            refusal = response;
            break;
        }
    }
    let admitted = statuses.iter().take_while(|s| **s == 200).count();
    let last = *statuses.last().unwrap();
    println!("POST /reply as user 42: {admitted} × 200, then {last}");
    assert!(
        admitted > 0 && last == 429,
        "expected 200s then a 429 from the Quick start's /reply, got {statuses:?}; the refusal:\n{refusal}"
    );
    let refusal_lower = refusal.to_ascii_lowercase();
    assert!(refusal_lower.contains("\r\nretry-after: "), "{refusal}");
    assert!(
        refusal_lower.contains("\r\nratelimit-policy: \"reply\""),
        "{refusal}"
    );

    // Another user is not limited by user 42's replies; the per-IP policy lets a client through.
    let (status, response) = request(addr, "POST", "/reply", &[("x-user-id", "43")]);
    assert_eq!(status, 200, "{response}");
    drop(server);
}

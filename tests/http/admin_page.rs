//! The admin page in a real browser: headless Chromium (Debian's `chromium`), driven over the
//! DevTools protocol through a pipe (`--remote-debugging-pipe`: no port, no WebSocket), loads the
//! page from a running example server (memory and Redis, behind a token), and the test reads what
//! it shows — backend health, the policies with their quotas, the drawn rates, the top limited keys
//! — then peeks and resets a key through the page's own form and buttons, sets an override and a
//! ban through its form and lifts the ban with its button, and checks that the server follows.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::example_server::{admin_addr, send, start_with_env, Server};
use crate::example_server_top::ADMIN_CONFIG as CONFIG;
use crate::support::redis as redis_support;

const TOKEN: &str = "page-test-admin-token-0123";

/// Headless Chromium and one page of it, over the DevTools protocol's pipe transport (JSON
/// messages ending in a NUL byte, on file descriptors 3 and 4 of the browser).
struct Browser {
    child: Child,
    to: ChildStdin,
    from: Receiver<Value>,
    next_id: u64,
    session: Option<String>,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn launch() -> Browser {
        match Command::new("chromium").arg("--version").output() {
            Ok(out) if out.status.success() => {}
            other => panic!(
                "cannot run chromium ({other:?}): install it with `sudo apt-get install -y chromium` \
                 (Debian's package; scripts/test.sh installs it)"
            ),
        }
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new("bash")
            .arg("-c")
            // fd 3: what the browser reads (our pipe to its stdin); fd 4: what it writes.
            .arg(r#"exec chromium "$@" --remote-debugging-pipe 3<&0 4>&1 </dev/null >/dev/null"#)
            .arg("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1280,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, from) = channel();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || loop {
            let mut message = Vec::new();
            match out.read_until(0, &mut message) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    message.pop();
                    if let Ok(value) = serde_json::from_slice::<Value>(&message)
                        && tx.send(value).is_err()
                    {
                        return;
                    }
                }
            }
        });
        let to = child.stdin.take().unwrap();
        let mut browser = Browser {
            child,
            to,
            from,
            next_id: 0,
            session: None,
            _profile: profile,
        };
        browser.open_page();
        browser
    }

    /// A new tab (its own session storage), attached: later calls go to it.
    fn open_page(&mut self) {
        self.session = None;
        let target = self.call("Target.createTarget", json!({ "url": "about:blank" }));
        let attached = self.call(
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        self.session = Some(attached["sessionId"].as_str().unwrap().to_owned());
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        self.to.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no answer from chromium to {method}: {e}"));
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
    }

    /// The value of a JavaScript expression on the page.
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        result["result"]["value"].clone()
    }

    /// Polls the page until `expression` (a string) satisfies `done`: its last value.
    fn wait_for(&mut self, what: &str, expression: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let value = self.eval(expression);
            let text = value.as_str().unwrap_or_default().to_owned();
            if done(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "the page never showed {what}: {value}; status: {}",
                self.eval("document.querySelector('#status').textContent")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status(runtime: &tokio::runtime::Runtime, server: &Server, user: &str) -> u16 {
    runtime
        .block_on(send(server.addr, "POST", "/reply", &[("x-user-id", user)]))
        .status
}

fn the_page_shows_and_resets(extra: &[&str]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let mut args = vec![
        "--config",
        file.to_str().unwrap(),
        "--admin",
        "127.0.0.1:0",
        "--admin-token-env",
        "PAGE_TOKEN",
    ];
    args.extend_from_slice(extra);
    let server = start_with_env(&args, &[("PAGE_TOKEN", TOKEN)]);
    let admin = admin_addr(&server);
    // alice is refused 3 times, bob once.
    let statuses: Vec<u16> = (0..4).map(|_| status(&runtime, &server, "alice")).collect();
    assert_eq!(statuses, [200, 429, 429, 429]);
    assert_eq!(
        [
            status(&runtime, &server, "bob"),
            status(&runtime, &server, "bob")
        ],
        [200, 429]
    );

    let mut browser = Browser::launch();
    // Without the token, the page says so and shows nothing.
    browser.navigate(&format!("http://{admin}/"));
    browser.wait_for(
        "that it needs the token",
        "document.querySelector('#status')?.textContent",
        |t| t.contains("token is missing or wrong"),
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('#policies tbody tr').length"),
        0
    );

    // With the token (in the fragment, which the browser never sends).
    browser.open_page();
    browser.navigate(&format!("http://{admin}/#token={TOKEN}"));
    let health = browser.wait_for(
        "the backend's health",
        "document.querySelector('#health')?.textContent",
        |t| t.contains(" up"),
    );
    let backend = if extra.contains(&"--redis") {
        "redis up (lua)"
    } else {
        "memory up"
    };
    assert!(health.contains(backend), "{health}");
    let reply = browser.wait_for(
        "the reply policy and its quota",
        "document.querySelector('#policies tr[data-policy=reply]')?.textContent",
        |t| !t.is_empty(),
    );
    assert_eq!(reply, "reply/reply1 per 1 min");
    let index =
        browser.eval("document.querySelector('#policies tr[data-policy=index]').textContent");
    assert_eq!(index, "index/10 per 1 s, bursts of 20");
    let top = browser.wait_for(
        "the top limited keys",
        "document.querySelector('#top-reply tbody')?.innerText",
        |t| t.contains("alice") && t.contains("bob"),
    );
    assert_eq!(top.replace('\t', " "), "alice 3\nbob 1", "{top}");
    // The rates are drawn: a chart per policy with its two lines, the limited one off the floor
    // once the counters have been sampled twice.
    browser.wait_for(
        "a rate of refusals in the chart",
        "document.querySelector('#chart-reply polyline.limited')?.getAttribute('points')",
        |points| {
            points
                .split(' ')
                .any(|p| p.split(',').nth(1).is_some_and(|y| y != "88.0"))
        },
    );
    assert!(browser
        .eval("document.querySelector('#chart-index polyline.allowed') !== null")
        .as_bool()
        .unwrap());

    // Peek through the form: bob has nothing left.
    browser.eval(
        "document.querySelector('#peek-policy').value = 'reply';
         document.querySelector('#peek-key').value = 'bob';
         document.querySelector('#peek-button').click()",
    );
    let peeked = browser.wait_for(
        "bob's state",
        "document.querySelector('#peek-result').textContent",
        |r| r.starts_with("reply / bob"),
    );
    assert!(
        peeked.starts_with("reply / bob: 0 of 1 remaining"),
        "{peeked}"
    );
    // A click on a top key peeks it: alice has nothing left either.
    browser.eval("document.querySelector('#top-reply td.key').click()");
    let peeked = browser.wait_for(
        "alice's state",
        "document.querySelector('#peek-result').textContent",
        |r| r.starts_with("reply / alice"),
    );
    assert!(
        peeked.starts_with("reply / alice: 0 of 1 remaining"),
        "{peeked}"
    );
    assert_eq!(
        browser.eval("document.querySelector('#peek-key').value"),
        "alice"
    );
    // Reset through the page's button: the page peeks again and shows the full quota.
    browser.eval("document.querySelector('#reset-button').click()");
    browser.wait_for(
        "the reset",
        "document.querySelector('#peek-result').dataset.reset",
        |r| r == "done",
    );
    let shown = browser.eval("document.querySelector('#peek-result').textContent");
    assert!(
        shown
            .as_str()
            .unwrap()
            .starts_with("Reset. reply / alice: 1 of 1 remaining"),
        "{shown}"
    );
    // And the server lets alice through again; bob, not reset, is still refused.
    assert_eq!(status(&runtime, &server, "alice"), 200);
    assert_eq!(status(&runtime, &server, "bob"), 429);

    // An override through the page's form: bob unlimited, listed, and let through.
    browser.eval(
        "document.querySelector('#override-policy').value = 'reply';
         document.querySelector('#override-key').value = 'bob';
         document.querySelector('#override-kind').value = 'unlimited';
         document.querySelector('#override-button').click()",
    );
    let listed = browser.wait_for(
        "bob's override in the list",
        "document.querySelector('#overrides-reply tbody')?.innerText",
        |t| t.contains("bob"),
    );
    assert!(listed.contains("unlimited"), "{listed}");
    assert_eq!(status(&runtime, &server, "bob"), 200);
    // A 1-hour ban of carol through the form, listed; then lifted with its button.
    browser.eval(
        "document.querySelector('#override-key').value = 'carol';
         document.querySelector('#override-kind').value = 'ban';
         document.querySelector('#override-period').value = '1h';
         document.querySelector('#override-button').click()",
    );
    let listed = browser.wait_for(
        "carol's ban in the list",
        "document.querySelector('#overrides-reply tbody')?.innerText",
        |t| t.contains("carol"),
    );
    assert!(
        listed.contains("banned for 3600 s") || listed.contains("banned for 3599 s"),
        "{listed}"
    );
    assert_eq!(status(&runtime, &server, "carol"), 429);
    browser.eval(
        "[...document.querySelectorAll('#overrides-reply tr')]
           .find((r) => r.textContent.includes('carol')).querySelector('button').click()",
    );
    browser.wait_for(
        "carol's ban lifted",
        "document.querySelector('#overrides-reply')?.innerText",
        |t| !t.contains("carol"),
    );
    assert_eq!(status(&runtime, &server, "carol"), 200);
}

#[test]
fn the_admin_page_in_chromium_in_memory() {
    the_page_shows_and_resets(&[]);
}

#[test]
fn the_admin_page_in_chromium_on_redis() {
    let redis = redis_support::RedisServer::start();
    let url = redis.url();
    the_page_shows_and_resets(&["--redis", &url, "--redis-mode", "lua"]);
}

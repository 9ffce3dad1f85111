//! Rejection events at info (and would-limits: shadow limits, staged policies), with keys redacted on request. In a test binary of its own: `tracing`
//! caches per call site whether anyone listens, so a test without a subscriber running beside this one
//! could make it miss events.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::support::{from_user as from, per_user_policy as policy, status_of};
use axum::{routing::get, Router};
use tower_throttle::ThrottleLayer;

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

async fn logs_of(redact: bool, requests: usize) -> String {
    let layer = ThrottleLayer::builder()
        .policy(policy())
        .redact_keys(redact)
        .build()
        .unwrap();
    logs_through(layer, requests).await
}

/// Collects what this thread logs at info until the guard is dropped.
fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// What `requests` requests of one user through `layer` log at info.
async fn logs_through<B: tower_throttle::Backend>(
    layer: ThrottleLayer<tower_throttle::key::Header, B>,
    requests: usize,
) -> String {
    let (logs, _guard) = capture();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..requests {
        status_of(&app, from("dave@example.com")).await;
    }
    let bytes = logs.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn rejections_are_logged_at_info_with_the_key_or_its_pseudonym() {
    let plain = logs_of(false, 2).await;
    let line = plain
        .lines()
        .find(|l| l.contains("request limited"))
        .unwrap();
    assert!(line.contains("INFO"), "{line}");
    assert!(
        line.contains("policy=api") && line.contains("retry_after_secs=60"),
        "{line}"
    );
    assert!(line.contains("key=dave@example.com"), "{line}");
    assert_eq!(plain.matches("request limited").count(), 1, "{plain}");

    let redacted = logs_of(true, 2).await;
    assert!(!redacted.contains("dave"), "{redacted}");
    let line = redacted
        .lines()
        .find(|l| l.contains("request limited"))
        .unwrap();
    assert!(line.contains("key=hmac:"), "{line}");
}

/// A flood from one client writes a line a second, not a line a request: 200 rejections in well
/// under two seconds give at most two info lines, the first saying how many it left out.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_rejections_logs_at_info_at_most_once_a_second() {
    let flood = logs_of(false, 201).await;
    let lines = flood.matches("request limited").count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} info lines for 200 rejections:\n{flood}"
    );
    assert!(flood.contains("suppressed=0"), "{flood}");
}

/// A shadow limit's would-limits and a staged policy's unenforced refusals are logged as rejections
/// are: at info at most once a second per policy, with the policy, the limit and the key.
#[tokio::test(flavor = "current_thread")]
async fn would_limits_log_at_info_at_most_once_a_second_with_the_limit() {
    use tower_throttle::key::Header;
    use tower_throttle::{Policy, Quota};

    let shadowed = Policy::builder("api")
        .quota(Quota::per_minute(100))
        .shadow(Quota::per_minute(1))
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let logs = logs_through(ThrottleLayer::new(shadowed), 100).await;
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("would be limited"))
        .collect();
    assert!((1..=2).contains(&lines.len()), "{logs}");
    let line = lines[0];
    assert!(
        line.contains("INFO") && line.contains("(shadow limit)"),
        "{line}"
    );
    assert!(
        line.contains("policy=api") && line.contains("limit=api.shadow.1m"),
        "{line}"
    );
    assert!(
        line.contains("key=dave@example.com") && line.contains("suppressed=0"),
        "{line}"
    );
    assert!(!logs.contains("request limited"), "{logs}");

    // A staged policy that enforces no key yet.
    let staged = Policy::builder("api")
        .quota(Quota::per_minute(1))
        .enforce_fraction(0.0)
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let logs = logs_through(ThrottleLayer::new(staged), 3).await;
    let line = logs
        .lines()
        .find(|l| l.contains("would be limited"))
        .unwrap_or_else(|| panic!("{logs}"));
    assert!(
        line.contains("(not enforced for this key yet)") && line.contains("limit=api"),
        "{line}"
    );
    assert_eq!(logs.matches("would be limited").count(), 1, "{logs}");
}

/// A dry run logs the refusals it lets through, as would-be refusals, and nothing for what it
/// admits anyway.
#[tokio::test(flavor = "current_thread")]
async fn a_dry_run_logs_what_it_would_refuse_and_nothing_else() {
    use tower_throttle::key::Header;
    use tower_throttle::{Policy, Quota};

    let dry = Policy::builder("api")
        .quota(Quota::per_minute(1))
        .dry_run(true)
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let logs = logs_through(ThrottleLayer::new(dry), 2).await;
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("request would be limited (dry run)"))
        .collect();
    // The second request, the one a minute's quota of one would refuse: its retry time is there.
    assert_eq!(lines.len(), 1, "{logs}");
    assert!(lines[0].contains("retry_after_secs=60"), "{}", lines[0]);
    assert!(!logs.contains("request limited"), "{logs}");
}

/// A backend that fails while `down` is set, and decides as memory does otherwise.
#[derive(Clone)]
struct Flaky {
    memory: tower_throttle::MemoryBackend,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl tower_throttle::Backend for Flaky {
    type Future = std::future::Ready<
        Result<tower_throttle::backend::Decisions, tower_throttle::backend::BackendError>,
    >;

    fn check(&self, charges: tower_throttle::backend::Charges<'_>) -> Self::Future {
        if self.down.load(std::sync::atomic::Ordering::Relaxed) {
            let error = tower_throttle::backend::BackendError::new("connection refused");
            return std::future::ready(Err(error));
        }
        std::future::ready(self.memory.decide_charges(charges))
    }
}

/// The `api` policy on a backend that fails while `down` is set (it starts set), letting requests
/// through then (`OnBackendError::Allow`).
fn flaky_layer() -> (
    Arc<AtomicBool>,
    ThrottleLayer<tower_throttle::key::Header, Flaky>,
) {
    let down = Arc::new(AtomicBool::new(true));
    let backend = Flaky {
        memory: tower_throttle::MemoryBackend::new(),
        down: down.clone(),
    };
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy())
        .on_backend_error(tower_throttle::OnBackendError::Allow)
        .build()
        .unwrap();
    (down, layer)
}

/// `/items` answering "ok", behind `layer`.
fn items<K, B>(layer: ThrottleLayer<K, B>) -> Router
where
    K: tower_throttle::key::KeyExtractor<axum::body::Body>,
    B: tower_throttle::Backend,
{
    Router::new()
        .route("/items", get(|| async { "ok" }))
        .layer(layer)
}

/// Entering the failure policy and leaving it are a warning each, the second with how many
/// requests the failure policy answered: what an operator reads to see what an outage let through.
#[tokio::test(flavor = "current_thread")]
async fn the_failure_policy_logs_when_it_takes_over_and_when_the_backend_is_back() {
    let (logs, _guard) = capture();
    let (down, layer) = flaky_layer();
    let app = items(layer);
    for _ in 0..5 {
        status_of(&app, from("dave@example.com")).await;
    }
    down.store(false, Ordering::Relaxed);
    // Back once the backend has decided with no failure for a second: not at its first decision.
    status_of(&app, from("dave@example.com")).await;
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains("backend decides again"), "{text}");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for _ in 0..2 {
        status_of(&app, from("dave@example.com")).await;
    }
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let entered = "the failure policy answers until it decides again";
    assert_eq!(text.matches(entered).count(), 1, "{text}");
    let back = text
        .lines()
        .find(|l| l.contains("rate-limit backend decides again"))
        .unwrap_or_else(|| panic!("no line for the way back in\n{text}"));
    // The count is every policy's: the line names none.
    assert!(back.contains("WARN") && !back.contains("policy="), "{back}");
    assert!(back.contains("answered=5"), "{back}");
    assert_eq!(text.matches("backend decides again").count(), 1, "{text}");
}

/// A backend that fails some requests and decides others (a Cluster node down, the others up)
/// is one outage: the failure policy takes over once, and is not said to be done at each decision.
#[tokio::test(flavor = "current_thread")]
async fn a_backend_failing_every_other_request_is_one_outage() {
    // A run in which the machine stalled a second between two requests proves nothing (the
    // backend was quiet that long): tried again, three times at most.
    for _ in 0..3 {
        let (logs, _guard) = capture();
        let (down, layer) = flaky_layer();
        let app = items(layer);
        // The longest from a failing request's start to the end of the decision after it.
        let (mut failed, mut longest) = (std::time::Instant::now(), std::time::Duration::ZERO);
        for i in 0..40 {
            let failing = i % 2 == 0;
            down.store(failing, Ordering::Relaxed);
            if failing {
                failed = std::time::Instant::now();
            }
            status_of(&app, from("dave@example.com")).await;
            if !failing {
                longest = longest.max(failed.elapsed());
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        if longest >= std::time::Duration::from_millis(900) {
            continue;
        }
        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        let entered = "the failure policy answers until it decides again";
        assert_eq!(text.matches(entered).count(), 1, "{text}");
        assert_eq!(text.matches("decides again;").count(), 0, "{text}");
        return;
    }
    panic!("the machine stalled a second in each of three runs");
}

/// A stream message the backend could not decide is logged as a failure, but the failure policy
/// did not answer it: nothing says it took over, nor that it answered any request on the way back.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_message_check_is_no_failure_policy_taking_over() {
    let (logs, _guard) = capture();
    let (down, layer) = flaky_layer();
    let handle = layer.handle();
    let app = items(layer);
    let failed = handle.check("api", "dave@example.com", 1).await;
    assert!(
        matches!(failed, Err(tower_throttle::ops::HandleError::Backend(_))),
        "{failed:?}"
    );
    down.store(false, Ordering::Relaxed);
    status_of(&app, from("dave@example.com")).await;
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("rate-limit backend failed"), "{text}");
    assert!(!text.contains("the failure policy answers"), "{text}");
    assert!(!text.contains("decides again"), "{text}");
}

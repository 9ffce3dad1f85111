//! Helpers for the failover tests (tests/redis/failover.rs, tests/redis/sentinel.rs): a TCP
//! forwarder whose target moves (an address that follows a failover, like DNS), a listener that
//! accepts and never answers (a frozen Redis), Redis Sentinel processes, `redis-cli` without
//! blocking the runtime, a steady load through a backend with its figures, and the log lines a
//! scenario wrote.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::asks::Asks;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower_throttle::key::Key;
use tower_throttle::{redis::RedisBackend, Limit};

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Forwards every connection it accepts to `127.0.0.1:<target>`, the target read when the
/// connection is accepted: switching it moves new connections only, as a DNS change does.
pub struct Forwarder {
    port: u16,
    target: Arc<AtomicU16>,
    accept: JoinHandle<()>,
    pipes: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Forwarder {
    pub async fn start(target: u16) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(AtomicU16::new(target));
        let pipes: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (to, held) = (target.clone(), pipes.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let port = to.load(Ordering::SeqCst);
                let pipe = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                held.lock().unwrap().push(pipe);
            }
        });
        Forwarder {
            port,
            target,
            accept,
            pipes,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// New connections go to `port` from now on.
    pub fn switch_to(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accept.abort();
        for pipe in self.pipes.lock().unwrap().drain(..) {
            pipe.abort();
        }
    }
}

/// Accepts connections and never answers: a frozen Redis.
pub struct FrozenListener {
    port: u16,
    accept: JoinHandle<()>,
}

impl FrozenListener {
    pub async fn start() -> FrozenListener {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        FrozenListener { port, accept }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for FrozenListener {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// `redis-cli -p PORT ARGS`, on a tokio process (the load keeps running meanwhile); stdout trimmed.
pub async fn cli(port: u16, args: &[&str]) -> String {
    let output = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .await
        .expect("redis-cli runs (apt-get install -y redis-tools)");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Polls `check` every 50 ms until it holds, for at most `within`; panics with `what` otherwise.
pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} (waited {within:?})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Makes the server on `replica` a replica of `primary` and waits until the link is up.
pub async fn replicate(replica: u16, primary: u16) {
    cli(replica, &["REPLICAOF", "127.0.0.1", &primary.to_string()]).await;
    wait_until(
        Duration::from_secs(20),
        "the replica never synchronized",
        || async {
            cli(replica, &["INFO", "replication"])
                .await
                .contains("master_link_status:up")
        },
    )
    .await;
}

/// Three `redis-server --sentinel` processes monitoring `mymaster` (quorum 2, down after 1 s,
/// failover timeout 5 s), killed on drop.
pub struct Sentinels {
    children: Vec<Child>,
    ports: Vec<u16>,
    dir: tempfile::TempDir,
    /// Over TLS: the CA that signed their certificate.
    ca: Option<PathBuf>,
}

pub const SERVICE: &str = "mymaster";

impl Sentinels {
    pub async fn start(primary: u16) -> Sentinels {
        Self::launch(primary, None, None).await
    }

    /// Sentinels that speak TLS only, with the certificate of `primary` (a
    /// [`RedisServer::start_tls`](super::redis::RedisServer::start_tls): SAN 127.0.0.1), and reach
    /// it over TLS (`tls-replication yes`), logging in with `password` when given.
    pub async fn start_tls(
        primary: &super::redis::RedisServer,
        password: Option<&str>,
    ) -> Sentinels {
        Self::launch(primary.port(), Some(primary.dir()), password).await
    }

    async fn launch(
        primary: u16,
        tls: Option<&std::path::Path>,
        password: Option<&str>,
    ) -> Sentinels {
        let dir = tempfile::tempdir().unwrap();
        let mut children = Vec::new();
        let mut ports = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf: PathBuf = dir.path().join(format!("sentinel-{i}.conf"));
            let mut file = std::fs::File::create(&conf).unwrap();
            if let Some(certs) = tls {
                let path = |name: &str| certs.join(name).display().to_string();
                writeln!(
                    file,
                    "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                     tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes",
                    path("server.crt"),
                    path("server.key"),
                    path("ca.crt")
                )
                .unwrap();
            } else {
                writeln!(file, "port {port}").unwrap();
            }
            writeln!(
                file,
                "bind 127.0.0.1\ndir {}\nlogfile {}\nsentinel resolve-hostnames no\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 5000\n",
                dir.path().display(),
                dir.path().join(format!("sentinel-{i}.log")).display()
            )
            .unwrap();
            if let Some(password) = password {
                writeln!(file, "sentinel auth-pass {SERVICE} {password}").unwrap();
            }
            let child = Command::new(super::redis::server_binary())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server runs (apt-get install -y redis-server)");
            children.push(child);
            ports.push(port);
        }
        let sentinels = Sentinels {
            children,
            ports,
            dir,
            ca: tls.map(|certs| certs.join("ca.crt")),
        };
        for i in 0..sentinels.ports.len() {
            wait_until(
                Duration::from_secs(10),
                "a sentinel never answered",
                || async { sentinels.cli(i, &["PING"]).await == "PONG" },
            )
            .await;
        }
        sentinels
    }

    /// `redis-cli` to sentinel `i` (over TLS, trusting their CA).
    pub async fn cli(&self, i: usize, args: &[&str]) -> String {
        match &self.ca {
            None => cli(self.ports[i], args).await,
            Some(ca) => {
                let ca = ca.display().to_string();
                let tls = ["--tls", "--cacert", ca.as_str()];
                cli(self.ports[i], &[&tls[..], args].concat()).await
            }
        }
    }

    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.ca.is_some() { "rediss" } else { "redis" };
        self.ports
            .iter()
            .map(|p| format!("{scheme}://127.0.0.1:{p}/"))
            .collect()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// The primary's port as the first sentinel names it.
    pub async fn primary_port(&self) -> Option<u16> {
        let reply = cli(
            self.ports[0],
            &["SENTINEL", "get-master-addr-by-name", SERVICE],
        )
        .await;
        reply.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }

    /// The sentinels' logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for i in 0..3 {
            let log = std::fs::read_to_string(self.dir.path().join(format!("sentinel-{i}.log")))
                .unwrap_or_default();
            let _ = writeln!(all, "--- sentinel {i} ---\n{log}");
        }
        all
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One call of the load: when it started (since the load began), how long it took, and whether
/// Redis decided it (`Ok`) or it failed (the failure policy would have answered).
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Duration,
    pub took: Duration,
    pub decided: bool,
    pub error: Option<String>,
}

/// A steady load on one key through a backend: `workers` tasks, each one check every `every`.
pub struct Load {
    started: Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
}

impl Load {
    pub fn start(backend: &RedisBackend, limit: &Limit, workers: usize, every: Duration) -> Load {
        let started = Instant::now();
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..workers)
            .map(|_| {
                let (backend, limit) = (backend.clone(), limit.clone());
                let (samples, stop) = (samples.clone(), stop.clone());
                tokio::spawn(async move {
                    let key = Key::from("steady");
                    while !stop.load(Ordering::Relaxed) {
                        let sent = Instant::now();
                        let result = backend.check_one(&limit, &key, 1).await;
                        let sample = Sample {
                            at: sent - started,
                            took: sent.elapsed(),
                            decided: result.is_ok(),
                            error: result.err().map(|e| e.to_string()),
                        };
                        samples.lock().unwrap().push(sample);
                        tokio::time::sleep(every).await;
                    }
                })
            })
            .collect();
        Load {
            started,
            samples,
            stop,
            workers,
        }
    }

    /// Time since the load began (to mark a trigger).
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Polls (at most `within`) until `enough` holds of the samples so far; panics with `what`
    /// otherwise. Instead of a fixed sleep: a scenario waits for what it needs to see, however
    /// slow the machine.
    pub async fn wait_for(&self, within: Duration, what: &str, enough: impl Fn(&[Sample]) -> bool) {
        wait_until(within, what, || async {
            enough(&self.samples.lock().unwrap())
        })
        .await;
    }

    /// Waits until `n` calls that started at or after `since` (a [`now`](Self::now)) were decided
    /// by Redis, and the latest call was.
    pub async fn wait_decided(&self, since: Duration, n: usize) {
        let what = format!("{n} calls decided by Redis after {since:?}");
        self.wait_for(Duration::from_secs(20), &what, |samples| {
            let latest = samples.iter().max_by_key(|s| s.at);
            samples
                .iter()
                .filter(|s| s.at >= since && s.decided)
                .count()
                >= n
                && latest.is_some_and(|s| s.decided)
        })
        .await;
    }

    /// Waits until `n` calls failed.
    pub async fn wait_failed(&self, n: usize) {
        let what = format!("{n} failed calls");
        self.wait_for(Duration::from_secs(20), &what, |samples| {
            samples.iter().filter(|s| !s.decided).count() >= n
        })
        .await;
    }

    pub async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers {
            worker.await.unwrap();
        }
        let mut samples = std::mem::take(&mut *self.samples.lock().unwrap());
        samples.sort_by_key(|s| s.at);
        samples
    }
}

/// What a scenario shows: calls by outcome, the slowest, and the recovery after the trigger.
#[derive(Debug)]
pub struct Figures {
    pub decided: usize,
    pub failed: usize,
    pub max_latency: Duration,
    /// From `trigger` to the first call decided by Redis after the last failure; zero when no call
    /// failed; `None` when the load ended on a failure.
    pub recovered_after: Option<Duration>,
    pub first_errors: Vec<String>,
}

impl Figures {
    pub fn of(samples: &[Sample], trigger: Duration) -> Figures {
        let decided = samples.iter().filter(|s| s.decided).count();
        let failed = samples.len() - decided;
        let max_latency = samples.iter().map(|s| s.took).max().unwrap_or_default();
        let last_failure = samples.iter().rposition(|s| !s.decided);
        let recovered_after = match last_failure {
            None => Some(Duration::ZERO),
            Some(i) => samples[i + 1..]
                .iter()
                .find(|s| s.decided)
                .map(|s| s.at.saturating_sub(trigger)),
        };
        let mut first_errors: Vec<String> = Vec::new();
        for e in samples.iter().filter_map(|s| s.error.clone()) {
            if !first_errors.contains(&e) && first_errors.len() < 4 {
                first_errors.push(e);
            }
        }
        Figures {
            decided,
            failed,
            max_latency,
            recovered_after,
            first_errors,
        }
    }

    pub fn print(&self, scenario: &str, logs: &Logs) {
        let lines = logs.lines();
        println!(
            "[{scenario}] calls: {} decided by Redis, {} failed (failure policy); max latency {:?}; recovered {:?} after the trigger; {} log lines",
            self.decided,
            self.failed,
            self.max_latency,
            self.recovered_after,
            lines.len()
        );
        for e in &self.first_errors {
            println!("[{scenario}]   error seen: {e}");
        }
        for line in lines {
            println!("[{scenario}]   log: {line}");
        }
    }
}

/// The log lines written while it is the default subscriber of this thread (a current-thread
/// runtime runs every task there), at INFO and above, without ANSI colours.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Captures this thread's logs until the guard is dropped.
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    pub fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn count(&self, text: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(text)).count()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

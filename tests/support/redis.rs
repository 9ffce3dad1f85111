//! Real Redis servers for integration tests.
//!
//! A test binary reaches it as `crate::support::redis` (see `tests/support/mod.rs`); a test file
//! imports it with
//!
//! ```ignore
//! use crate::support::redis as redis_support;
//! ```
//!
//! Every [`RedisServer`] is one `redis-server` child process listening on 127.0.0.1 only, on a free
//! port, in a temp dir of its own, with no persistence (`save ""`, `appendonly no`). Its config file
//! and log (`redis.conf`, `redis.log`) are in that dir; when a test panics, the end of the log is
//! printed as the server is dropped. The child is killed when the value is dropped, panicking or not.
//!
//! The servers come from Debian's `redis-server`/`redis-tools` packages and the redis-cell module is
//! built by `scripts/test.sh`; nothing here skips a test when they are missing: it panics and says how
//! to get them. The module is `$REDIS_CELL_MODULE`, or by default
//! `<crate>/target/redis-cell/libredis_cell.so`.
//!
//! Everything here is blocking (child processes, `redis-cli`); calling it from a `#[tokio::test]`
//! is fine, it just holds that runtime thread for the few hundred milliseconds a start takes.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// What to do when the servers or the module are missing.
const FIX: &str = "run `bash scripts/test.sh` (it installs redis-server/redis-tools with apt-get and builds the redis-cell module into target/redis-cell)";

/// The ACL user of [`RedisServer::start_tls`], and its password.
pub const TLS_USER: &str = "throttle";
pub const TLS_PASSWORD: &str = "s3cret";

/// How long a server may take to answer after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one `redis-cli` call may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a cluster may take to report `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Fresh ports tried when the chosen one was taken before redis-server bound it.
const START_ATTEMPTS: usize = 5;
/// `cluster-node-timeout` of cluster nodes, in milliseconds (Redis' default is 15000).
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 5000;

/// The redis-cell module: `$REDIS_CELL_MODULE`, or `<crate>/target/redis-cell/libredis_cell.so`.
/// Panics, naming the fix, when the file is missing.
pub fn redis_cell_module() -> PathBuf {
    let path = match std::env::var_os("REDIS_CELL_MODULE") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/redis-cell/libredis_cell.so"),
    };
    if !path.is_file() {
        panic!("the redis-cell module {} is missing: {FIX}", path.display());
    }
    path
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}

/// The server binary every test starts: `$TEST_REDIS_SERVER` (scripts/test.sh points it at the
/// Valkey server it installs into target/valkey/ for the second pass of the Redis tests), or
/// `redis-server` from PATH.
pub fn server_binary() -> PathBuf {
    match std::env::var_os("TEST_REDIS_SERVER") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => PathBuf::from("redis-server"),
    }
}

/// The server the tests are asked to run against: `"valkey"` when `$TEST_REDIS_SERVER` names a
/// `valkey-server`, otherwise `"redis"`. The harness test checks that the started server says so
/// itself (`INFO server`), so a Valkey pass cannot quietly run against Redis.
pub fn expected_server_name() -> &'static str {
    let binary = server_binary();
    let name = binary
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("");
    if name.starts_with("valkey") {
        "valkey"
    } else {
        "redis"
    }
}

fn require_redis_tools() {
    let server = server_binary();
    let found = if server.components().count() > 1 {
        server.is_file()
    } else {
        on_path(&server.to_string_lossy())
    };
    if !found {
        panic!(
            "`{}` is not on PATH (or is not a file): {FIX}",
            server.display()
        );
    }
    if !on_path("redis-cli") {
        panic!("`redis-cli` is not on PATH: {FIX}");
    }
}

#[derive(Clone, Debug)]
struct Options {
    module: Option<PathBuf>,
    tls: bool,
    cluster: bool,
}

/// One `redis-server` child process on 127.0.0.1. See the module docs.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    options: Options,
    conf_path: PathBuf,
    log_path: PathBuf,
    ca_cert: Option<PathBuf>,
    // Last: the directory is removed only after `drop` has killed the child.
    dir: tempfile::TempDir,
}

/// Why a start failed in a way that another try can fix.
enum StartError {
    /// Something else took the port between choosing it and the server binding it.
    PortTaken,
}

impl RedisServer {
    /// A plain Redis server.
    pub fn start() -> RedisServer {
        Self::launch(Options {
            module: None,
            tls: false,
            cluster: false,
        })
    }

    /// A Redis server with the redis-cell module loaded (`CL.THROTTLE`).
    pub fn start_with_cell() -> RedisServer {
        Self::launch(Options {
            module: Some(redis_cell_module()),
            tls: false,
            cluster: false,
        })
    }

    /// A Redis server that speaks TLS only (`port 0`, `tls-port` = [`port`](Self::port)), with a CA
    /// and a server certificate (SAN `IP:127.0.0.1`, `DNS:localhost`) made with the openssl CLI in
    /// its temp dir. Clients need no certificate of their own (`tls-auth-clients no`); they trust
    /// [`ca_cert_path`](Self::ca_cert_path). Besides the passwordless `default` user there is the ACL
    /// user [`TLS_USER`] with the password [`TLS_PASSWORD`] (`~* &* +@all`), which [`url`](Self::url)
    /// and [`cli`](Self::cli) log in as.
    pub fn start_tls() -> RedisServer {
        Self::launch(Options {
            module: None,
            tls: true,
            cluster: false,
        })
    }

    /// The port it listens on (the TLS port of a TLS server).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`, or `rediss://throttle:s3cret@127.0.0.1:PORT/` for a TLS server.
    pub fn url(&self) -> String {
        if self.options.tls {
            format!(
                "rediss://{TLS_USER}:{TLS_PASSWORD}@127.0.0.1:{}/",
                self.port
            )
        } else {
            format!("redis://127.0.0.1:{}/", self.port)
        }
    }

    /// The CA certificate (PEM) that signed a TLS server's certificate; `None` for other servers.
    pub fn ca_cert_path(&self) -> Option<PathBuf> {
        self.ca_cert.clone()
    }

    /// Whether the server process is running (false after [`stop`](Self::stop)).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server's log so far (all its runs: each start and restart is marked with a `==== harness`
    /// line).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The server's temp dir (config, log, certificates, `nodes.conf`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the server (`SHUTDOWN NOSAVE`, then SIGKILL if it has not exited after 10 s) and waits
    /// until its port is closed. Does nothing when it is already stopped.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // The connection closes without a reply, so redis-cli's outcome says nothing: ignore it.
        let _ = run(self.cli_command().args(["SHUTDOWN", "NOSAVE"]), CLI_TIMEOUT);
        if wait_for_exit(&mut child, Duration::from_secs(10)).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        while port_open(self.port) {
            if Instant::now() >= deadline {
                panic!(
                    "port {} is still open {READY_TIMEOUT:?} after redis-server stopped (another process took it?)",
                    self.port
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL), as a crash would: its connections reset, nothing is saved. Does
    /// nothing when it is already stopped; [`restart`](Self::restart) brings it back.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same config (stopping it first if it is
    /// running) and waits until it answers. Nothing persists across a restart but a cluster node's
    /// `nodes.conf` (its cluster identity and slots). Retries for up to 10 s while the port is taken.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(StartError::PortTaken) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(StartError::PortTaken) => panic!(
                    "cannot restart redis-server on port {}: the port stayed taken for {READY_TIMEOUT:?}\n{}",
                    self.port,
                    self.describe_log()
                ),
            }
        }
    }

    /// Runs `redis-cli` against this server (TLS: with `--tls --cacert CA --user throttle --pass
    /// s3cret`) and returns its stdout, trimmed. Multi-bulk replies come one element a line (raw
    /// mode). Panics with redis-cli's stderr when it fails, including on an error reply.
    pub fn cli(&self, args: &[&str]) -> String {
        self.cli_result(args).unwrap_or_else(|err| {
            panic!(
                "redis-cli -p {} {} failed: {err}",
                self.port,
                args.join(" ")
            )
        })
    }

    /// Like [`cli`](Self::cli), but an error reply or a failure to connect is `Err` with the error
    /// text (e.g. `WRONGPASS ...`) instead of a panic.
    pub fn cli_result(&self, args: &[&str]) -> Result<String, String> {
        let output = run(self.cli_command().args(args), CLI_TIMEOUT)?;
        if output.status.success() {
            Ok(output.stdout.trim().to_owned())
        } else {
            let stderr = output.stderr.trim();
            Err(if stderr.is_empty() {
                format!("{} (stdout: {})", output.status, output.stdout.trim())
            } else {
                stderr.to_owned()
            })
        }
    }

    /// `redis-cli` set up to reach this server, without a command.
    fn cli_command(&self) -> Command {
        let mut cmd = Command::new("redis-cli");
        // -e: an error reply makes redis-cli exit non-zero and go to stderr.
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-e"]);
        if let Some(ca) = &self.ca_cert {
            cmd.arg("--tls").arg("--cacert").arg(ca);
            cmd.args([
                "--user",
                TLS_USER,
                "--pass",
                TLS_PASSWORD,
                "--no-auth-warning",
            ]);
        }
        cmd
    }

    fn launch(options: Options) -> RedisServer {
        require_redis_tools();
        let dir = tempfile::Builder::new()
            .prefix("tower-throttle-redis-")
            .tempdir()
            .expect("cannot create a temp dir for redis-server");
        let ca_cert = options.tls.then(|| make_certificates(dir.path()));
        let mut server = RedisServer {
            child: None,
            port: 0,
            conf_path: dir.path().join("redis.conf"),
            log_path: dir.path().join("redis.log"),
            options,
            ca_cert,
            dir,
        };
        for _ in 0..START_ATTEMPTS {
            server.port = if server.options.cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            server.write_config();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(StartError::PortTaken) => continue,
            }
        }
        panic!(
            "redis-server could not bind a free port in {START_ATTEMPTS} attempts\n{}",
            server.describe_log()
        );
    }

    fn write_config(&self) {
        let dir = self.dir.path();
        let mut conf = String::new();
        conf.push_str("bind 127.0.0.1\n");
        if self.options.tls {
            writeln!(conf, "port 0").unwrap();
            writeln!(conf, "tls-port {}", self.port).unwrap();
            writeln!(conf, "tls-cert-file {}", quote(&dir.join("server.crt"))).unwrap();
            writeln!(conf, "tls-key-file {}", quote(&dir.join("server.key"))).unwrap();
            writeln!(conf, "tls-ca-cert-file {}", quote(&dir.join("ca.crt"))).unwrap();
            conf.push_str("tls-auth-clients no\n");
            writeln!(conf, "user {TLS_USER} on >{TLS_PASSWORD} ~* &* +@all").unwrap();
        } else {
            writeln!(conf, "port {}", self.port).unwrap();
        }
        writeln!(conf, "dir {}", quote(dir)).unwrap();
        conf.push_str("daemonize no\n");
        // The log goes to stdout, which is the log file (so are early errors on stderr).
        conf.push_str("logfile \"\"\n");
        conf.push_str("save \"\"\n");
        conf.push_str("appendonly no\n");
        // DEBUG SLEEP etc. from local clients, to simulate a slow server.
        conf.push_str("enable-debug-command local\n");
        // The Auto-mode test unloads and reloads redis-cell at run time.
        conf.push_str("enable-module-command local\n");
        if let Some(module) = &self.options.module {
            writeln!(conf, "loadmodule {}", quote(module)).unwrap();
        }
        if self.options.cluster {
            conf.push_str("cluster-enabled yes\n");
            conf.push_str("cluster-config-file nodes.conf\n");
            writeln!(conf, "cluster-node-timeout {CLUSTER_NODE_TIMEOUT_MS}").unwrap();
        }
        fs::write(&self.conf_path, conf).expect("cannot write redis.conf");
    }

    /// Spawns redis-server with the config file and waits until it answers as itself.
    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("cannot open redis.log");
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        writeln!(
            log,
            "==== harness: starting redis-server on port {} ====",
            self.port
        )
        .unwrap();
        let stdout = log.try_clone().expect("cannot clone the redis.log handle");
        let child = Command::new(server_binary())
            .arg(&self.conf_path)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run redis-server ({err}): {FIX}"));
        let pid = child.id();
        self.child = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().expect("cannot poll redis-server") {
                self.child = None;
                return Err(self.start_failure(status, log_start));
            }
            if self.answers_as(pid) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let mut child = self.child.take().unwrap();
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-server on port {} did not answer within {READY_TIMEOUT:?}\n{}",
                    self.port,
                    self.describe_log()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server exited while starting: a taken port can be retried, anything else panics.
    fn start_failure(&self, status: ExitStatus, log_start: u64) -> StartError {
        let log = self.log();
        let this_run = log.get(log_start as usize..).unwrap_or(&log);
        if this_run.contains("Address already in use") {
            return StartError::PortTaken;
        }
        let lower = this_run.to_lowercase();
        if self.options.tls
            && lower.contains("tls")
            && [
                "not compiled",
                "not supported",
                "not available",
                "bad directive",
            ]
            .iter()
            .any(|phrase| lower.contains(phrase))
        {
            panic!(
                "this redis-server was built without TLS support, so start_tls cannot work (Debian's \
                 redis-server 7.0 has it)\n{}",
                self.describe_log()
            );
        }
        panic!(
            "redis-server exited ({status}) on port {} before it answered\n{}",
            self.port,
            self.describe_log()
        );
    }

    /// Whether the server on our port answers and is our child (not another test's server that
    /// took the port we chose in between).
    fn answers_as(&self, pid: u32) -> bool {
        if !port_open(self.port) {
            return false;
        }
        let Ok(output) = run(
            self.cli_command().args(["INFO", "server"]),
            Duration::from_secs(2),
        ) else {
            return false;
        };
        output.status.success()
            && output
                .stdout
                .lines()
                .any(|line| line.trim() == format!("process_id:{pid}"))
    }

    fn describe_log(&self) -> String {
        format!(
            "--- redis-server log ({}) ---\n{}--- end of log ---",
            self.log_path.display(),
            self.log()
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!(
                "--- last lines of the log of redis-server on port {} ---\n{}\n--- end ---",
                self.port,
                tail.join("\n")
            );
        }
    }
}

/// Three masters, no replicas (or one each: [`start_with_replicas`](Self::start_with_replicas)),
/// `cluster-enabled yes`, each loading the redis-cell module, put
/// together with `redis-cli --cluster create` and started only once every node reports
/// `cluster_state:ok` with all 16384 slots assigned. Cluster bus ports are port + 10000.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::create(3, 0)
    }

    /// Three primaries, each with one replica (`--cluster-replicas 1`): six nodes, the primaries
    /// first.
    pub fn start_with_replicas() -> RedisCluster {
        Self::create(3, 1)
    }

    fn create(primaries: usize, replicas: usize) -> RedisCluster {
        let module = redis_cell_module();
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| {
                RedisServer::launch(Options {
                    module: Some(module.clone()),
                    tls: false,
                    cluster: true,
                })
            })
            .collect();
        let cluster = RedisCluster { nodes };
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        create.args(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port)),
        );
        let replicas = replicas.to_string();
        create.args(["--cluster-replicas", &replicas, "--cluster-yes"]);
        match run(&mut create, Duration::from_secs(60)) {
            Ok(output) if output.status.success() && !output.stdout.contains("[ERR]") => {}
            Ok(output) => panic!(
                "redis-cli --cluster create failed ({})\nstdout:\n{}\nstderr:\n{}\n{}",
                output.status,
                output.stdout,
                output.stderr,
                cluster.describe_logs()
            ),
            Err(err) => panic!(
                "redis-cli --cluster create: {err}\n{}",
                cluster.describe_logs()
            ),
        }
        cluster.wait_until_ok();
        cluster
    }

    /// `redis://127.0.0.1:PORT/` of each node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable nodes, e.g. to stop and restart one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// Waits (up to 30 s) until every running node's `CLUSTER INFO` says `cluster_state:ok`,
    /// `cluster_slots_assigned:16384`, `cluster_slots_ok:16384` and knows all the nodes; panics with
    /// the last answers and the logs otherwise. Use it after restarting a node.
    pub fn wait_until_ok(&self) {
        let wanted = [
            "cluster_state:ok".to_owned(),
            "cluster_slots_assigned:16384".to_owned(),
            "cluster_slots_ok:16384".to_owned(),
            format!("cluster_known_nodes:{}", self.nodes.len()),
        ];
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let infos: Vec<(u16, String)> = self
                .nodes
                .iter()
                .filter(|node| node.is_running())
                .map(|node| {
                    let info = node
                        .cli_result(&["CLUSTER", "INFO"])
                        .unwrap_or_else(|err| err);
                    (node.port, info)
                })
                .collect();
            let ok = infos.iter().all(|(_, info)| {
                let lines: Vec<&str> = info.lines().map(str::trim).collect();
                wanted.iter().all(|w| lines.contains(&w.as_str()))
            });
            if ok {
                return;
            }
            if Instant::now() >= deadline {
                let mut answers = String::new();
                for (port, info) in &infos {
                    writeln!(answers, "--- CLUSTER INFO of 127.0.0.1:{port} ---\n{info}").unwrap();
                }
                panic!(
                    "the cluster did not reach {wanted:?} on every node within {CLUSTER_TIMEOUT:?}\n{answers}{}",
                    self.describe_logs()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn describe_logs(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::describe_log)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A config-file string: double-quoted, with `\` and `"` escaped.
fn quote(path: &Path) -> String {
    let text = path.to_str().expect("temp paths are UTF-8");
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("cannot bind 127.0.0.1:0")
        .port()
}

/// A loopback port P ≤ 55535 such that P and its cluster bus port P + 10000 were both free a moment
/// ago.
fn free_cluster_port() -> u16 {
    for _ in 0..1000 {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("cannot bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        if port > 55535 {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10000)).is_ok() {
            return port;
        }
    }
    panic!("found no free loopback port P <= 55535 with P + 10000 free too");
}

fn port_open(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
}

fn wait_for_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs a command with no stdin, collecting its output; kills it after `timeout`.
fn run(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("cannot run {program} ({err}): {FIX}"));
    let stdout = read_in_background(child.stdout.take().unwrap());
    let stderr = read_in_background(child.stderr.take().unwrap());
    let status = wait_for_exit(&mut child, timeout);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "{program} did not finish within {timeout:?} (stdout: {}, stderr: {})",
            stdout.trim(),
            stderr.trim()
        )),
    }
}

fn read_in_background(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Makes a CA and a server certificate for 127.0.0.1/localhost signed by it (ECDSA P-256, valid for
/// 30 days) in `dir` with the openssl CLI: `ca.crt`, `ca.key`, `server.crt`, `server.key`. Returns the
/// CA certificate's path.
fn make_certificates(dir: &Path) -> PathBuf {
    if !on_path("openssl") {
        panic!(
            "`openssl` is not on PATH (the TLS server's certificates are made with it): run `bash \
             scripts/test.sh` (it installs openssl with apt-get)"
        );
    }
    fs::write(
        dir.join("openssl.cnf"),
        "[req]\n\
         distinguished_name = dn\n\
         prompt = no\n\
         [dn]\n\
         CN = tower-throttle test\n\
         [ca_ext]\n\
         basicConstraints = critical, CA:TRUE\n\
         keyUsage = critical, keyCertSign, cRLSign\n\
         subjectKeyIdentifier = hash\n\
         [server_ext]\n\
         basicConstraints = critical, CA:FALSE\n\
         keyUsage = critical, digitalSignature\n\
         extendedKeyUsage = serverAuth\n\
         subjectAltName = IP:127.0.0.1, DNS:localhost\n\
         subjectKeyIdentifier = hash\n\
         authorityKeyIdentifier = keyid\n",
    )
    .expect("cannot write openssl.cnf");
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-config", "openssl.cnf", "-x509", "-new"][..],
            &key,
            &["-keyout", "ca.key", "-out", "ca.crt", "-days", "30"],
            &[
                "-subj",
                "/CN=tower-throttle test CA",
                "-extensions",
                "ca_ext",
            ],
        ]
        .concat(),
        [
            &["req", "-config", "openssl.cnf", "-new"][..],
            &key,
            &["-keyout", "server.key", "-out", "server.csr"],
            &["-subj", "/CN=localhost"],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "30",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            "server_ext",
        ],
    ];
    for args in steps {
        let output = run(
            Command::new("openssl").args(&args).current_dir(dir),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|err| panic!("openssl {}: {err}", args.join(" ")));
        if !output.status.success() {
            panic!(
                "openssl {} failed ({}):\n{}{}",
                args.join(" "),
                output.status,
                output.stdout,
                output.stderr
            );
        }
    }
    dir.join("ca.crt")
}

//! A TCP proxy on 127.0.0.1 between a client and a real server, with faults switched while traffic
//! flows: what a production link does and a stopped or frozen server does not (issue 50; the
//! toxics of Toxiproxy, by name in brackets).
//!
//! - [`latency`](FaultProxy::latency): each chunk held `base ± jitter` per direction (`latency`),
//!   from a seeded xorshift, so a run is reproducible; chunks keep their order, as TCP does (a chunk
//!   is never delivered before the one ahead of it).
//! - [`bandwidth`](FaultProxy::bandwidth): bytes per second per direction (`bandwidth`).
//! - [`black_hole`](FaultProxy::black_hole): every open connection goes silent, for good (a
//!   half-dead NAT or load balancer: open, nothing forwarded either way); new connections are
//!   accepted and left silent while it lasts (`timeout` with 0). After the heal, new connections work;
//!   the silenced ones stay silent until the client drops them.
//! - [`reset_all`](FaultProxy::reset_all): every connection reset now (RST: `SO_LINGER` 0) (`reset_peer`).
//! - [`cut_replies_after`](FaultProxy::cut_replies_after): each connection open now forwards `n`
//!   more bytes of replies, then is reset (`limit_data`, with a reset, once: later connections are
//!   not cut, so that a client can set one up again).
//! - [`slice_replies`](FaultProxy::slice_replies): replies written one byte at a time (`slicer`).
//! - [`refuse`](FaultProxy::refuse): the listening socket is closed (connections refused), and
//!   bound again on the same port when it ends.
//!
//! Everything runs on the runtime of the test that started it and is bounded: 64 chunks of 16 KiB
//! queued per direction and connection at most. Dropping the proxy stops it: its listener and every
//! connection are closed.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Chunks queued per direction of a connection (each up to [`CHUNK`] bytes).
const QUEUE: usize = 64;
/// The largest chunk read at once.
const CHUNK: usize = 16 * 1024;

/// Which way data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: requests.
    ToServer,
    /// Server to client: replies.
    ToClient,
}

/// A delay of `base ± jitter`, uniform.
#[derive(Clone, Copy, Debug, Default)]
struct Latency {
    base: Duration,
    jitter: Duration,
}

#[derive(Clone, Debug, Default)]
struct Way {
    latency: Latency,
    /// Bytes per second; `None`: unlimited.
    bandwidth: Option<u64>,
}

#[derive(Debug, Default)]
struct Faults {
    up: Way,
    down: Way,
    black_hole: bool,
    /// Connections with a smaller id are silent for good (they were open during a black hole).
    silenced_below: u64,
    /// Bumped by each `reset_all`.
    resets: u64,
    /// Bytes of replies each connection open at the arming forwards before its reset, and the
    /// arming's number (a connection counts from the arming it last saw).
    cut: Option<(usize, u64)>,
    /// Connections with a smaller id were open at the last arming.
    cut_below: u64,
    cuts_armed: u64,
    slice: bool,
    refuse: bool,
    /// A listener bound again after a refusal, for the accept task to take.
    rebound: Option<TcpListener>,
}

struct Shared {
    upstream: SocketAddr,
    seed: u64,
    faults: Mutex<Faults>,
    /// Bumped at every change of `faults`, so that waiting tasks look again.
    changed: watch::Sender<u64>,
    next_id: AtomicU64,
    open: AtomicUsize,
    /// Whether the accept task holds a listener now (false while refusing).
    listening: watch::Sender<bool>,
}

impl Shared {
    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn change(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.faults());
        self.changed.send_modify(|n| *n += 1);
    }

    fn silent(&self, id: u64) -> bool {
        let faults = self.faults();
        faults.black_hole || id < faults.silenced_below
    }

    fn way(&self, direction: Direction) -> Way {
        let faults = self.faults();
        match direction {
            Direction::ToServer => faults.up.clone(),
            Direction::ToClient => faults.down.clone(),
        }
    }
}

/// The proxy: see the module docs. Dropped, it stops.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy on a free loopback port to `127.0.0.1:upstream_port`, jitter drawn from `seed`. Must
    /// be called inside a tokio runtime (its tasks run there).
    pub fn start(upstream_port: u16, seed: u64) -> FaultProxy {
        let listener = bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .expect("the fault proxy cannot bind a loopback port");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port)),
            seed,
            faults: Mutex::new(Faults::default()),
            changed: watch::channel(0).0,
            next_id: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            listening: watch::channel(true).0,
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        FaultProxy {
            addr,
            shared,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PORT/`: the server, through the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Holds each chunk going `direction` for `base ± jitter` (uniform, seeded), in order.
    pub fn latency(&self, direction: Direction, base: Duration, jitter: Duration) {
        assert!(jitter <= base, "a jitter of {jitter:?} around {base:?}");
        self.shared.change(|f| {
            let way = match direction {
                Direction::ToServer => &mut f.up,
                Direction::ToClient => &mut f.down,
            };
            way.latency = Latency { base, jitter };
        });
    }

    /// At most `bytes_per_second` going `direction`; `None`: unlimited.
    pub fn bandwidth(&self, direction: Direction, bytes_per_second: Option<u64>) {
        assert_ne!(bytes_per_second, Some(0));
        self.shared.change(|f| match direction {
            Direction::ToServer => f.up.bandwidth = bytes_per_second,
            Direction::ToClient => f.down.bandwidth = bytes_per_second,
        });
    }

    /// On: every open connection is silent for good, and new ones while it lasts. Off: new
    /// connections work again.
    pub fn black_hole(&self, on: bool) {
        let next = self.shared.next_id.load(Ordering::SeqCst);
        self.shared.change(|f| {
            if f.black_hole && !on {
                // Those accepted during the black hole stay silent too.
                f.silenced_below = f.silenced_below.max(next);
            }
            f.black_hole = on;
        });
    }

    /// Resets every open connection now (RST).
    pub fn reset_all(&self) {
        self.shared.change(|f| f.resets += 1);
    }

    /// `Some(n)`: each connection open now forwards `n` more bytes of replies, then is reset (a
    /// torn reply). Connections accepted later are not cut.
    pub fn cut_replies_after(&self, bytes: Option<usize>) {
        let next = self.shared.next_id.load(Ordering::SeqCst);
        self.shared.change(|f| {
            f.cut_below = next;
            f.cuts_armed += 1;
            f.cut = bytes.map(|n| (n, f.cuts_armed));
        });
    }

    /// Replies written one byte at a time.
    pub fn slice_replies(&self, on: bool) {
        self.shared.change(|f| f.slice = on);
    }

    /// On: the listening socket is closed (connects are refused; one racing the switch is reset).
    /// Off: it is bound again on the same port. Returns once the proxy does as asked.
    pub async fn refuse(&self, on: bool) {
        if on {
            self.shared.change(|f| f.refuse = true);
        } else {
            let deadline = Instant::now() + Duration::from_secs(10);
            let listener = loop {
                match bind(self.addr) {
                    Ok(listener) => break listener,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("fault proxy: binding {} again: {e}", self.addr);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("the fault proxy cannot bind {} again: {e}", self.addr),
                }
            };
            self.shared.change(|f| {
                f.refuse = false;
                f.rebound = Some(listener);
            });
        }
        let mut listening = self.shared.listening.subscribe();
        tokio::time::timeout(
            Duration::from_secs(10),
            listening.wait_for(|listening| *listening != on),
        )
        .await
        .expect("the fault proxy's accept task did not follow")
        .unwrap();
    }

    /// Ends every fault but the silence of connections silenced by a black hole.
    pub async fn heal(&self) {
        if self.shared.faults().refuse {
            self.refuse(false).await;
        }
        self.black_hole(false);
        self.shared.change(|f| {
            f.up = Way::default();
            f.down = Way::default();
            f.cut = None;
            f.slice = false;
        });
    }

    /// Connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.next_id.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the listener and the connections' tasks (a JoinSet, which aborts
        // them as it is dropped).
        self.accept.abort();
    }
}

/// A listening socket on `addr`, with `SO_REUSEADDR` (binding the port again after a refusal).
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    let mut listener = Some(listener);
    let mut changed = shared.changed.subscribe();
    loop {
        // Finished connections leave the set (bounded however many come and go).
        while connections.try_join_next().is_some() {}
        {
            let mut faults = shared.faults();
            if faults.refuse && listener.is_some() {
                listener = None;
                shared.listening.send_replace(false);
            }
            if let Some(rebound) = faults.rebound.take() {
                listener = Some(rebound);
                shared.listening.send_replace(true);
            }
        }
        let Some(open) = &listener else {
            if changed.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            accepted = open.accept() => {
                let Ok((client, _)) = accepted else { continue };
                if shared.faults().refuse {
                    let _ = client.set_zero_linger();
                    continue;
                }
                let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
                connections.spawn(connection(client, id, shared.clone()));
            }
            res = changed.changed() => if res.is_err() { return },
        }
    }
}

/// Counts a connection open while it lives.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a connection ends early: it is reset (a cut, `reset_all`) or an I/O error.
struct Reset;

async fn connection(client: TcpStream, id: u64, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::SeqCst);
    let _open = Open(shared.clone());
    // Dropped with SO_LINGER 0, a socket sends RST: a connection ended here by a fault is reset.
    let _ = client.set_zero_linger();
    let _ = client.set_nodelay(true);
    let mut changed = shared.changed.subscribe();
    let resets = shared.faults().resets;
    let reset = {
        let shared = shared.clone();
        async move {
            while shared.faults().resets == resets {
                if changed.changed().await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = reset => {}
        _ = relay(client, id, &shared) => {}
    }
}

async fn relay(client: TcpStream, id: u64, shared: &Shared) -> Result<(), Reset> {
    if shared.silent(id) {
        return silence(client).await;
    }
    let upstream = TcpStream::connect(shared.upstream)
        .await
        .map_err(|_| Reset)?;
    let _ = upstream.set_zero_linger();
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = upstream.into_split();
    let seed = shared.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    tokio::try_join!(
        direction(
            client_read,
            server_write,
            Direction::ToServer,
            id,
            Rng::new(seed),
            shared
        ),
        direction(
            server_read,
            client_write,
            Direction::ToClient,
            id,
            Rng::new(!seed),
            shared
        ),
    )?;
    Ok(())
}

/// A connection accepted during a black hole: read, never answered, until the client leaves.
async fn silence(mut client: TcpStream) -> Result<(), Reset> {
    let mut buf = [0; 4096];
    loop {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return Err(Reset),
            Ok(_) => {}
        }
    }
}

/// One way of a connection: a reader queues chunks stamped with their arrival, a writer delivers
/// each when due, with the faults of the moment.
async fn direction(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    way: Direction,
    id: u64,
    mut rng: Rng,
    shared: &Shared,
) -> Result<(), Reset> {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let read = async move {
        let mut buf = vec![0; CHUNK];
        loop {
            let n = from.read(&mut buf).await.map_err(|_| Reset)?;
            if n == 0 || tx.send((Instant::now(), buf[..n].to_vec())).await.is_err() {
                return Ok::<(), Reset>(());
            }
        }
    };
    let write = async move {
        let mut due = Instant::now();
        let mut paced = Instant::now();
        let (mut cut_seen, mut cut_left) = (0, usize::MAX);
        while let Some((at, bytes)) = rx.recv().await {
            let Way { latency, bandwidth } = shared.way(way);
            due = due.max(at + latency.draw(&mut rng));
            tokio::time::sleep_until(due).await;
            if shared.silent(id) {
                continue;
            }
            let (slice, cut) = match way {
                Direction::ToClient => {
                    let faults = shared.faults();
                    (faults.slice, faults.cut.filter(|_| id < faults.cut_below))
                }
                Direction::ToServer => (false, None),
            };
            let mut bytes = &bytes[..];
            let mut torn = false;
            if let Some((n, armed)) = cut {
                if armed != cut_seen {
                    (cut_seen, cut_left) = (armed, n);
                }
                if bytes.len() >= cut_left {
                    bytes = &bytes[..cut_left];
                    torn = true;
                }
                cut_left -= bytes.len();
            }
            write_out(&mut to, bytes, slice, bandwidth, &mut paced).await?;
            if torn {
                return Err(Reset);
            }
        }
        let _ = to.shutdown().await;
        Ok(())
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// Writes `bytes`: one at a time when `slice`, paced to `bandwidth` (from `paced` on) if any.
async fn write_out(
    to: &mut OwnedWriteHalf,
    bytes: &[u8],
    slice: bool,
    bandwidth: Option<u64>,
    paced: &mut Instant,
) -> Result<(), Reset> {
    let piece = match (slice, bandwidth) {
        (true, _) => 1,
        // Ten milliseconds' worth at a time.
        (false, Some(rate)) => usize::try_from(rate / 100).unwrap_or(usize::MAX).max(1),
        (false, None) => bytes.len().max(1),
    };
    for part in bytes.chunks(piece) {
        if let Some(rate) = bandwidth {
            *paced = (*paced).max(Instant::now());
            tokio::time::sleep_until(*paced).await;
            *paced += Duration::from_secs_f64(part.len() as f64 / rate as f64);
        }
        to.write_all(part).await.map_err(|_| Reset)?;
        if slice {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

impl Latency {
    /// `base ± jitter`, uniform.
    fn draw(&self, rng: &mut Rng) -> Duration {
        if self.jitter.is_zero() {
            return self.base;
        }
        let span = u64::try_from(self.jitter.as_nanos() * 2).unwrap_or(u64::MAX);
        self.base - self.jitter + Duration::from_nanos(rng.next() % (span + 1))
    }
}

/// xorshift64*, seeded through splitmix64: deterministic, and no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

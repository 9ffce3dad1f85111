//! One million distinct rotating client IPs against the in-memory backend: memory stays within the
//! cap, and legitimate keys are still served correctly.
//!
//! ```sh
//! cargo run --release --example attack                      # max_keys 100,000 and 1,000,000
//! cargo run --release --example attack -- 20000 --keys 200000
//! ```
//!
//! Each configuration runs in a child process of its own, so that its resident set size (VmRSS from
//! /proc/self/status) is not inflated by the previous one. Time is simulated with a `ManualClock`:
//!
//! * the attack: `--keys` distinct IPv4 addresses (default 1,000,000), one request each, at 100,000
//!   requests a second, on the per-IP policy (60 an hour: every attack key stays live for a minute,
//!   longer than the attack, so only the cap bounds memory);
//! * a legitimate API client, on its own policy (100 a second), at a steady 50 a second: it must always
//!   be admitted;
//! * a legitimate IP, on the per-IP policy, one request a second (within its burst): always admitted;
//! * an abusive IP, on the per-IP policy, 10 a second: admitted for its burst of 60, then it must stay
//!   limited for the rest of the attack (no refill in 10 s) — at the cap, it must not be forgotten.
//!
//! Then the clock moves past every key's refill and the backend sweeps: the live count goes back to
//! (nearly) zero.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use tower_throttle::clock::ManualClock;
use tower_throttle::{Key, Limit, MemoryBackend, Quota};

/// Simulated time between two attack requests: 100,000 a second.
const ATTACK_STEP: Duration = Duration::from_micros(10);
/// The legitimate API client: one request every 20 ms (50 a second; its quota is 100 a second).
const LEGIT_EVERY: usize = 2_000;
/// The abusive IP: one request every 100 ms.
const ABUSER_EVERY: usize = 10_000;
/// The legitimate IP: one request a second (10 during the attack, within its burst of 60).
const LEGIT_IP_EVERY: Duration = Duration::from_secs(1);

struct Outcome {
    max_keys: usize,
    keys: usize,
    live: usize,
    max_live_seen: usize,
    rss_before: u64,
    rss_after: u64,
    hwm: u64,
    live_after_sweep: usize,
    rss_after_sweep: u64,
    legit_sent: usize,
    legit_admitted: usize,
    legit_ip_sent: usize,
    legit_ip_admitted: usize,
    abuser_sent: usize,
    abuser_admitted: usize,
    abuser_admitted_after_burst: usize,
    attack_admitted: usize,
    wall: Duration,
}

/// `VmRSS` or `VmHWM` from /proc/self/status, in bytes.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn run(max_keys: usize, keys: usize) -> Outcome {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .max_keys(max_keys)
        .build()
        .unwrap();
    let per_ip = Limit::new("ip", Quota::per_hour(60)).unwrap();
    let api = Limit::new("api", Quota::per_second(100)).unwrap();
    let legit = Key::from("api-key-of-a-paying-customer");
    let legit_ip = Key::from_ip("192.0.2.10".parse().unwrap());
    let abuser = Key::from_ip("198.51.100.66".parse().unwrap());
    let burst = per_ip.quota().limit() as usize;

    let rss_before = status_kib("VmRSS");
    let mut out = Outcome {
        max_keys,
        keys,
        live: 0,
        max_live_seen: 0,
        rss_before,
        rss_after: 0,
        hwm: 0,
        live_after_sweep: 0,
        rss_after_sweep: 0,
        legit_sent: 0,
        legit_admitted: 0,
        legit_ip_sent: 0,
        legit_ip_admitted: 0,
        abuser_sent: 0,
        abuser_admitted: 0,
        abuser_admitted_after_burst: 0,
        attack_admitted: 0,
        wall: Duration::ZERO,
    };
    let legit_ip_every = (LEGIT_IP_EVERY.as_nanos() / ATTACK_STEP.as_nanos()) as usize;
    let start = Instant::now();
    for i in 0..keys {
        // 1.0.0.0 onwards: a fresh address every time.
        let ip = Key::from_ip(IpAddr::V4(Ipv4Addr::from(0x0100_0000 + i as u32)));
        if backend.decide(&per_ip, &ip, 1).unwrap().allowed {
            out.attack_admitted += 1;
        }
        if i % LEGIT_EVERY == 0 {
            out.legit_sent += 1;
            out.legit_admitted += usize::from(backend.decide(&api, &legit, 1).unwrap().allowed);
        }
        if i % legit_ip_every == 0 {
            out.legit_ip_sent += 1;
            let allowed = backend.decide(&per_ip, &legit_ip, 1).unwrap().allowed;
            out.legit_ip_admitted += usize::from(allowed);
        }
        if i % ABUSER_EVERY == 0 {
            out.abuser_sent += 1;
            let allowed = backend.decide(&per_ip, &abuser, 1).unwrap().allowed;
            out.abuser_admitted += usize::from(allowed);
            if out.abuser_sent > burst {
                out.abuser_admitted_after_burst += usize::from(allowed);
            }
        }
        if i % 50_000 == 0 {
            out.max_live_seen = out.max_live_seen.max(backend.len());
        }
        clock.advance(ATTACK_STEP);
    }
    out.wall = start.elapsed();
    out.live = backend.len();
    out.max_live_seen = out.max_live_seen.max(out.live);
    out.rss_after = status_kib("VmRSS");
    out.hwm = status_kib("VmHWM");
    // Every attack key has refilled a minute later; the shards drop them as they are used (here: an
    // explicit sweep, to measure at once).
    clock.advance(Duration::from_secs(3_600));
    backend.sweep();
    out.live_after_sweep = backend.len();
    out.rss_after_sweep = status_kib("VmRSS");
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn print_table(outcomes: &[Outcome]) {
    println!();
    println!(
        "{:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>11} {:>9} {:>9} {:>11} {:>11} {:>9} {:>9} {:>13} {:>12}",
        "max_keys",
        "attack",
        "live",
        "max live",
        "RSS before",
        "RSS after",
        "peak RSS",
        "B/key",
        "B/cap",
        "swept live",
        "swept RSS",
        "legit",
        "legit ip",
        "abuser",
        "decisions/s",
    );
    for o in outcomes {
        let growth = o.rss_after.saturating_sub(o.rss_before);
        let per_key = growth as f64 / o.live.max(1) as f64;
        let decisions = o.keys + o.legit_sent + o.legit_ip_sent + o.abuser_sent;
        println!(
            "{:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>11} {:>9.1} {:>9.1} {:>11} {:>11} {:>9} {:>9} {:>13} {:>12.0}",
            o.max_keys,
            o.keys,
            o.live,
            o.max_live_seen,
            mib(o.rss_before),
            mib(o.rss_after),
            mib(o.hwm),
            per_key,
            growth as f64 / o.max_keys as f64,
            o.live_after_sweep,
            mib(o.rss_after_sweep),
            format!("{}/{}", o.legit_admitted, o.legit_sent),
            format!("{}/{}", o.legit_ip_admitted, o.legit_ip_sent),
            format!("{}/{}", o.abuser_admitted, o.abuser_sent),
            decisions as f64 / o.wall.as_secs_f64(),
        );
    }
    println!();
    for o in outcomes {
        let burst = 60;
        println!(
            "max_keys {}: {} of {} attack keys live at the end (at most {} at any check; cap {}), {} attack \
             requests admitted; legit API client {} (admitted {}/{}), legit IP {} ({}/{}), abuser admitted {} \
             (its burst of {burst}) then {} more in {} requests: {}",
            o.max_keys,
            o.live,
            o.keys,
            o.max_live_seen,
            if o.max_live_seen <= o.max_keys { "respected" } else { "EXCEEDED" },
            o.attack_admitted,
            if o.legit_admitted == o.legit_sent { "always admitted" } else { "REJECTED" },
            o.legit_admitted,
            o.legit_sent,
            if o.legit_ip_admitted == o.legit_ip_sent { "always admitted" } else { "REJECTED" },
            o.legit_ip_admitted,
            o.legit_ip_sent,
            o.abuser_admitted - o.abuser_admitted_after_burst,
            o.abuser_admitted_after_burst,
            o.abuser_sent - burst.min(o.abuser_sent),
            if o.abuser_admitted_after_burst == 0 { "stayed limited" } else { "ESCAPED" },
        );
    }
    println!(
        "\nAt the cap a full shard forgets an eighth of its keys, those nearest to fully refilled (here the \
         oldest attack keys, one request each); they would start over with a full burst. The abuser has \
         used its whole tolerance, so it is kept. RSS is the whole process (allocator included): bytes per \
         key (B/key) = (RSS after - RSS before) / live keys; B/cap = the same growth / max_keys."
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut keys = 1_000_000usize;
    let mut caps = Vec::new();
    let mut child = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--keys" => {
                keys = it
                    .next()
                    .expect("--keys N")
                    .replace('_', "")
                    .parse()
                    .unwrap()
            }
            "--child" => child = true,
            n => caps.push(n.replace('_', "").parse::<usize>().expect("max_keys")),
        }
    }
    if caps.is_empty() {
        caps = vec![100_000, 1_000_000];
    }

    if child {
        // One configuration, reported as one line of numbers for the parent.
        let o = run(caps[0], keys);
        println!(
            "{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
            o.max_keys,
            o.keys,
            o.live,
            o.max_live_seen,
            o.rss_before,
            o.rss_after,
            o.hwm,
            o.live_after_sweep,
            o.rss_after_sweep,
            o.legit_sent,
            o.legit_admitted,
            o.legit_ip_sent,
            o.legit_ip_admitted,
            o.abuser_sent,
            o.abuser_admitted,
            o.abuser_admitted_after_burst,
            o.attack_admitted,
            o.wall.as_nanos(),
        );
        return;
    }

    let exe = std::env::current_exe().unwrap();
    let mut outcomes = Vec::new();
    for cap in caps {
        eprintln!("max_keys {cap}: {keys} rotating IPs...");
        let output = Command::new(&exe)
            .args(["--child", "--keys", &keys.to_string(), &cap.to_string()])
            .output()
            .unwrap();
        assert!(output.status.success(), "child failed: {output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        let n: Vec<u128> = text
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        outcomes.push(Outcome {
            max_keys: n[0] as usize,
            keys: n[1] as usize,
            live: n[2] as usize,
            max_live_seen: n[3] as usize,
            rss_before: n[4] as u64,
            rss_after: n[5] as u64,
            hwm: n[6] as u64,
            live_after_sweep: n[7] as usize,
            rss_after_sweep: n[8] as u64,
            legit_sent: n[9] as usize,
            legit_admitted: n[10] as usize,
            legit_ip_sent: n[11] as usize,
            legit_ip_admitted: n[12] as usize,
            abuser_sent: n[13] as usize,
            abuser_admitted: n[14] as usize,
            abuser_admitted_after_burst: n[15] as usize,
            attack_admitted: n[16] as usize,
            wall: Duration::from_nanos(n[17] as u64),
        });
    }
    print_table(&outcomes);
    let ok = outcomes.iter().all(|o| {
        o.max_live_seen <= o.max_keys
            && o.legit_admitted == o.legit_sent
            && o.legit_ip_admitted == o.legit_ip_sent
            && o.abuser_admitted_after_burst == 0
    });
    if !ok {
        eprintln!("FAILED: see the table");
        std::process::exit(1);
    }
}

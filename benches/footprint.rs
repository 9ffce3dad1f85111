//! Bytes per live key, counted by the global allocator: the in-memory backend against governor's
//! keyed limiter (its default `DashMap` state), one million IPv4 keys each. Then the keys go idle:
//! the memory backend releases them by itself; governor only when told (`retain_recent` and
//! `shrink_to_fit`).
//!
//! ```text
//! cargo bench --bench footprint
//! ```
//!
//! Not a criterion bench: it prints one table. Numbers are exact for a given key count (hash tables
//! grow by doubling, so bytes per key depend on where the count falls between two sizes); it also
//! prints 100k and 500k keys.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use governor::{Quota as GQuota, RateLimiter};
use tower_throttle::clock::ManualClock;
use tower_throttle::{Key, Limit, MemoryBackend, Quota};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Relaxed)
}

fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0a00_0000u32.wrapping_add((i as u32).wrapping_mul(2_654_435_761)))
}

struct Row {
    name: &'static str,
    keys: usize,
    bytes_per_key: f64,
    idle_after: String,
}

fn ours(n: usize) -> Row {
    let clock = ManualClock::new();
    let limit = Limit::new("fp", Quota::per_minute(1)).unwrap();
    let before = live();
    let backend = MemoryBackend::builder()
        .max_keys(2 * n) // no eviction at the cap: every key stays live
        .clock(clock.clone())
        .build()
        .unwrap();
    for i in 0..n {
        let key = Key::from(ip(i));
        assert!(backend.decide(&limit, &key, 1).unwrap().allowed);
    }
    assert_eq!(backend.len(), n);
    let full = live() - before;
    // Every key refills after a minute; the shards drop them during later calls (at most once a
    // second each); `sweep` does the same for all shards at once.
    clock.advance(Duration::from_secs(121));
    backend.sweep();
    assert_eq!(backend.len(), 0);
    let idle = live() - before;
    let row = Row {
        name: "tower-throttle MemoryBackend",
        keys: n,
        bytes_per_key: full as f64 / n as f64,
        idle_after: format!("{idle} B after the keys refill (sweep)"),
    };
    drop(backend);
    row
}

fn governor_keyed<K, F>(name: &'static str, n: usize, key: F) -> Row
where
    K: std::hash::Hash + Eq + Clone,
    F: Fn(usize) -> K,
{
    let clock = FakeRelativeClock::default();
    let before = live();
    let lim = RateLimiter::dashmap_with_clock(
        GQuota::per_minute(NonZeroU32::new(1).unwrap()),
        clock.clone(),
    );
    for i in 0..n {
        assert!(lim.check_key(&key(i)).is_ok());
    }
    assert_eq!(lim.len(), n);
    let full = live() - before;
    clock.advance(Duration::from_secs(121));
    let untouched = live() - before;
    lim.retain_recent();
    lim.shrink_to_fit();
    let idle = live() - before;
    let row = Row {
        name,
        keys: n,
        bytes_per_key: full as f64 / n as f64,
        idle_after: format!(
            "{untouched} B after the keys refill; {idle} B after retain_recent + shrink_to_fit"
        ),
    };
    drop(lim);
    row
}

fn main() {
    // `cargo bench` passes --bench; nothing to parse.
    let mut rows = Vec::new();
    for n in [100_000, 500_000, 1_000_000] {
        rows.push(ours(n));
        rows.push(governor_keyed("governor keyed, IpAddr keys", n, |i| {
            IpAddr::V4(ip(i))
        }));
        rows.push(governor_keyed("governor keyed, Ipv4Addr keys", n, ip));
    }
    println!("| limiter | live keys | bytes/key | idle keys |");
    println!("|---|---:|---:|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.1} | {} |",
            r.name, r.keys, r.bytes_per_key, r.idle_after
        );
    }
}

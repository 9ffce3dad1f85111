//! Rotating client IPs against the in-memory backend (a fast version of `examples/attack.rs`): the
//! live keys never exceed `max_keys`, a legitimate client is always admitted, and a client being
//! limited stays limited while the attack fills the cap.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::{Key, Limit, MemoryBackend, Quota};

const MAX_KEYS: usize = 20_000;
const ATTACK_KEYS: usize = 200_000;

#[test]
fn rotating_ips_stay_within_the_cap_and_legit_clients_are_served() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .max_keys(MAX_KEYS)
        .build()
        .unwrap();
    // Attack keys stay live for a minute: only the cap bounds the map during the attack.
    let per_ip = Limit::new("ip", Quota::per_hour(60)).unwrap();
    let api = Limit::new("api", Quota::per_second(100)).unwrap();
    let legit = Key::from("api-key-of-a-paying-customer");
    let legit_ip = Key::from_ip("192.0.2.10".parse().unwrap());
    let abuser = Key::from_ip("198.51.100.66".parse().unwrap());
    let burst = per_ip.quota().limit();

    let (mut abuser_sent, mut abuser_admitted) = (0u64, 0u64);
    for i in 0..ATTACK_KEYS {
        // 100,000 attack requests a second, each from a new address.
        let ip = Key::from_ip(IpAddr::V4(Ipv4Addr::from(0x0100_0000 + i as u32)));
        assert!(
            backend.decide(&per_ip, &ip, 1).unwrap().allowed,
            "a fresh key has its burst"
        );
        // The legitimate API client: 50 a second, under its quota of 100.
        if i % 2_000 == 0 {
            assert!(
                backend.decide(&api, &legit, 1).unwrap().allowed,
                "legit client rejected at attack request {i}"
            );
        }
        // A legitimate IP on the attacked policy, within its burst.
        if i % 10_000 == 0 {
            assert!(
                backend.decide(&per_ip, &legit_ip, 1).unwrap().allowed,
                "legit IP rejected at attack request {i}"
            );
        }
        // The abuser: 100 a second on the attacked policy; after its burst it must never be
        // admitted again (it refills one request a minute and the attack lasts 2 s).
        if i % 1_000 == 0 {
            abuser_sent += 1;
            let allowed = backend.decide(&per_ip, &abuser, 1).unwrap().allowed;
            abuser_admitted += u64::from(allowed);
            assert_eq!(
                allowed,
                abuser_sent <= burst,
                "abuser request {abuser_sent} (attack request {i})"
            );
        }
        if i % 1_000 == 0 {
            let live = backend.len();
            assert!(live <= MAX_KEYS, "{live} live keys, cap {MAX_KEYS}");
        }
        clock.advance(Duration::from_micros(10));
    }
    assert_eq!(abuser_admitted, burst);
    let live = backend.len();
    assert!(live <= MAX_KEYS, "{live} live keys, cap {MAX_KEYS}");
    assert!(
        live > MAX_KEYS / 2,
        "the cap was reached and a shard forgets only an eighth: {live}"
    );

    // Once every key has refilled, the backend forgets them all.
    clock.advance(Duration::from_secs(3_600));
    backend.sweep();
    assert_eq!(backend.len(), 0);
    assert!(backend.decide(&per_ip, &abuser, 1).unwrap().allowed);
}

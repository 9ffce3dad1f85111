//! The benches' keys: IPv4 addresses in a fixed shuffled order, as a per-IP limiter sees them.

use std::net::Ipv4Addr;

/// A fixed permutation of `n` distinct addresses (Fisher-Yates with a xorshift generator).
pub fn shuffled_ips(n: usize) -> Vec<Ipv4Addr> {
    let mut x: u32 = 0x2545_f491;
    let mut out: Vec<Ipv4Addr> = (0..n as u32)
        .map(|i| Ipv4Addr::from(0x0a00_0000u32.wrapping_add(i)))
        .collect();
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.swap(i, x as usize % (i + 1));
    }
    out
}

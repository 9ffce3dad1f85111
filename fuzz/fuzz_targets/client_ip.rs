//! `ClientIp::resolve` on arbitrary forwarding headers.
//!
//! Input: the first line is the peer address (text; when it is not an address, one of `PEERS` is
//! picked by its first byte), every further line is one header line, sent as `X-Forwarded-For`,
//! `Forwarded` and `X-Real-IP` alike (lines that are not valid header values are dropped).
//!
//! Invariants, for each header kind and several IPv6 prefixes:
//! * it never panics;
//! * from an untrusted peer, the result is the peer (IPv4-mapped peers as IPv4);
//! * from a trusted peer, the result is the peer or an address written in the header text;
//! * the key `ClientIp` extracts is the resolved address grouped as `PeerIp` groups it.
#![no_main]

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tower_throttle::key::{
    ClientIp, ForwardedHeader, KeyExtractor, PeerAddr, PeerIp, TrustedProxies,
};

const TRUSTED: &[&str] = &[
    "10.0.0.0/8",
    "192.168.0.0/16",
    "fd00::/8",
    "::1",
    "::ffff:172.16.0.0/108",
];

const PEERS: &[&str] = &[
    "10.0.0.1",
    "192.168.1.1",
    "172.16.0.9",
    "fd00::1",
    "::ffff:10.0.0.2",
    "::1",
    "198.51.100.1",
    "2001:db8::1",
    "::ffff:203.0.113.1",
];

const KINDS: [(ForwardedHeader, &str); 3] = [
    (ForwardedHeader::XForwardedFor, "x-forwarded-for"),
    (ForwardedHeader::Forwarded, "forwarded"),
    (ForwardedHeader::XRealIp, "x-real-ip"),
];

/// Every address that can be read out of `lines`: tokens between separators (commas, semicolons,
/// `=`, quotes, brackets, whitespace), also with a `:port` after an IPv4 address or a `%zone` after
/// an IPv6 one. Independent of the parser under test, and a superset of what it may return.
fn addresses_in(lines: &[&[u8]]) -> HashSet<IpAddr> {
    let mut found = HashSet::new();
    for line in lines {
        let text = String::from_utf8_lossy(line);
        for token in text.split(|c: char| c.is_whitespace() || ",;=\"[]".contains(c)) {
            let mut candidates = vec![token];
            if let Some((addr, _zone)) = token.split_once('%') {
                candidates.push(addr);
            }
            if let Some((addr, _port)) = token.rsplit_once(':') {
                if addr.parse::<Ipv4Addr>().is_ok() {
                    candidates.push(addr);
                }
            }
            for c in candidates {
                if let Ok(ip) = c.parse::<IpAddr>() {
                    found.insert(ip.to_canonical());
                }
            }
        }
    }
    found
}

fn peer_of(line: &[u8]) -> IpAddr {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            let i = line.first().copied().unwrap_or(0) as usize % PEERS.len();
            PEERS[i].parse().unwrap()
        })
}

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|b| *b == b'\n');
    let peer = peer_of(lines.next().unwrap_or_default());
    let values: Vec<HeaderValue> = lines
        .filter_map(|l| HeaderValue::from_bytes(l).ok())
        .collect();
    let raw: Vec<&[u8]> = values.iter().map(HeaderValue::as_bytes).collect();
    let written = addresses_in(&raw);

    let mut headers = HeaderMap::new();
    for (_, name) in KINDS {
        for v in &values {
            headers.append(HeaderName::from_static(name), v.clone());
        }
    }
    let trusted = TrustedProxies::new(TRUSTED).unwrap();
    let peer_trusted = trusted.contains(peer);
    let prefix = (data.len() % 128) as u8 + 1;

    for (kind, _) in KINDS {
        for ipv6_prefix in [64, prefix] {
            let client_ip = ClientIp::new(trusted.clone())
                .header(kind)
                .with_ipv6_prefix(ipv6_prefix)
                .unwrap();
            let resolved = client_ip.resolve(peer, &headers);
            if !peer_trusted {
                assert_eq!(
                    resolved,
                    peer.to_canonical(),
                    "untrusted peer {peer}, {kind:?}"
                );
            } else {
                assert!(
                    resolved == peer.to_canonical() || written.contains(&resolved),
                    "{kind:?} from {peer}: {resolved} is neither the peer nor written in {raw:?}"
                );
            }

            let mut request = Request::new(());
            *request.headers_mut() = headers.clone();
            request
                .extensions_mut()
                .insert(PeerAddr(SocketAddr::new(peer, 443)));
            let key = client_ip
                .extract(&request)
                .expect("a peer address gives a key");
            let expected = PeerIp::new()
                .with_ipv6_prefix(ipv6_prefix)
                .unwrap()
                .key_for(resolved);
            assert_eq!(key, expected);
            let rendered = key.to_string();
            assert!(rendered.starts_with('!') && rendered.bytes().all(|b| b.is_ascii_graphic()));
        }
    }

    // The same headers with no trusted proxy: always the peer.
    let none = ClientIp::new(TrustedProxies::none());
    for (kind, _) in KINDS {
        assert_eq!(
            none.clone().header(kind).resolve(peer, &headers),
            peer.to_canonical()
        );
    }
});

//! Spoofing attempts against the IP extractors, through a real axum router: forged `X-Forwarded-For`,
//! `Forwarded` and `X-Real-IP` from an untrusted peer, a thousand attacker-written entries through the
//! trusted proxy, garbage, IPv6 rotation inside one prefix, IPv4-mapped IPv6. Each attack sends many
//! more requests than the limit, changing its forged part every time, and must be admitted exactly
//! `LIMIT` times: zero bypasses.

use crate::support::*;
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower_throttle::key::{ClientIp, ForwardedHeader, KeyExtractor, PeerIp, TrustedProxies};
use tower_throttle::{Policy, Quota, ThrottleLayer};

/// `Quota::per_minute(3)`: three at once, then one every 20 s (the clock never moves here).
const LIMIT: usize = 3;
/// Requests per attack.
const ATTEMPTS: usize = 40;
/// The load balancer: the only trusted proxy.
const PROXY: &str = "10.0.0.5:40000";
const FORWARDED_KINDS: [ForwardedHeader; 3] = [
    ForwardedHeader::XForwardedFor,
    ForwardedHeader::Forwarded,
    ForwardedHeader::XRealIp,
];

fn trusted() -> TrustedProxies {
    TrustedProxies::new(["10.0.0.0/8"]).unwrap()
}

fn client_ip() -> ClientIp {
    ClientIp::new(trusted())
}

/// A router limited to `LIMIT` requests a minute per key, on a manual clock.
fn app<K: KeyExtractor<Body>>(key: K) -> Router {
    let (backend, _clock) = backend();
    let policy = Policy::builder("spoof")
        .quota(Quota::per_minute(LIMIT as u64))
        .key(key)
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// A request from `peer` with these header lines (raw bytes, appended in order).
fn request(peer: &str, headers: &[(&str, Vec<u8>)]) -> Request<Body> {
    let mut builder = Request::get("/");
    for (name, value) in headers {
        builder = builder.header(*name, value.as_slice());
    }
    from_peer(builder.body(Body::empty()).unwrap(), peer)
}

fn line(name: &str, value: impl Into<Vec<u8>>) -> (&str, Vec<u8>) {
    (name, value.into())
}

/// Sends one request per attempt; asserts that exactly the first `LIMIT` were admitted.
async fn assert_no_bypass(
    app: &Router,
    attack: &str,
    mut attempt: impl FnMut(usize) -> Request<Body>,
) {
    let mut statuses = Vec::with_capacity(ATTEMPTS);
    for i in 0..ATTEMPTS {
        statuses.push(status_of(app, attempt(i)).await);
    }
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(
        admitted, LIMIT,
        "{attack}: {admitted} admitted: {statuses:?}"
    );
    assert!(
        statuses[..LIMIT].iter().all(|s| *s == StatusCode::OK)
            && statuses[LIMIT..]
                .iter()
                .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{attack}: {statuses:?}"
    );
}

/// Asserts that a fresh client still gets its own full quota (the attack did not land on it).
async fn assert_fresh(app: &Router, what: &str, req: impl Fn() -> Request<Body>) {
    for i in 0..LIMIT {
        assert_eq!(status_of(app, req()).await, StatusCode::OK, "{what}: {i}");
    }
    assert_eq!(
        status_of(app, req()).await,
        StatusCode::TOO_MANY_REQUESTS,
        "{what}: over the limit"
    );
}

/// A different plausible address for each `i`.
fn v4(i: usize) -> String {
    format!(
        "{}.{}.{}.{}",
        1 + i % 200,
        (i / 7) % 256,
        (i / 3) % 256,
        i % 256
    )
}

/// A small deterministic generator for IPv6 interface identifiers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The last 64 bits of an address, as four hextets.
    fn interface_id(&mut self) -> String {
        let n = self.next();
        format!(
            "{:x}:{:x}:{:x}:{:x}",
            n >> 48,
            (n >> 32) & 0xffff,
            (n >> 16) & 0xffff,
            n & 0xffff
        )
    }
}

/// `ip` with a port, as proxies write it: `[v6]:port` or `v4:port`.
fn node(ip: &str, port: usize) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// Every forwarding header at once, each naming `ip` (as the attacker would write it).
fn all_forwarding_headers(ip: &str) -> Vec<(&'static str, Vec<u8>)> {
    let quoted = if ip.contains(':') {
        format!("for=\"[{ip}]\"")
    } else {
        format!("for={ip}")
    };
    vec![
        line("x-forwarded-for", ip),
        line("forwarded", quoted),
        line("x-real-ip", ip),
    ]
}

#[tokio::test]
async fn forged_x_forwarded_for_from_an_untrusted_peer() {
    let app = app(client_ip());
    let attacker = "198.51.100.7";
    assert_no_bypass(&app, "rotating X-Forwarded-For", |i| {
        // A new source port and a new forged client every time; some claim to come through the
        // trusted proxy, some are a thousand entries long.
        let forged = match i % 4 {
            0 => v4(i),
            1 => format!("{}, 10.0.0.9", v4(i)),
            2 => format!("2001:db8:{i:x}::1"),
            _ => (0..1000)
                .map(|j| v4(i * 1000 + j))
                .collect::<Vec<_>>()
                .join(", "),
        };
        request(
            &format!("{attacker}:{}", 1000 + i),
            &[line("x-forwarded-for", forged)],
        )
    })
    .await;
    // The forged addresses never got a key: through the proxy, one of them still has its quota.
    assert_fresh(&app, "a forged address, really behind the proxy", || {
        request(PROXY, &[line("x-forwarded-for", v4(0))])
    })
    .await;
    // And another direct client is unaffected.
    assert_fresh(&app, "another untrusted peer", || {
        request("198.51.100.8:1", &[line("x-forwarded-for", attacker)])
    })
    .await;
}

#[tokio::test]
async fn forged_forwarded_and_x_real_ip_from_an_untrusted_peer() {
    for kind in FORWARDED_KINDS {
        let app = app(client_ip().header(kind));
        let what = format!("{kind:?} from an untrusted peer");
        assert_no_bypass(&app, &what, |i| {
            let mut headers = all_forwarding_headers(&v4(i));
            headers.push(line(
                "forwarded",
                format!("for=\"[2001:db8::{i:x}]:4711\";proto=https, for=10.0.0.9"),
            ));
            request(&format!("203.0.113.66:{}", 2000 + i), &headers)
        })
        .await;
        // IPv4-mapped form of the attacker's address: the same peer.
        assert_eq!(
            status_of(
                &app,
                request(
                    "[::ffff:203.0.113.66]:1",
                    &all_forwarding_headers("9.9.9.9")
                )
            )
            .await,
            StatusCode::TOO_MANY_REQUESTS,
            "{what}: mapped peer"
        );
    }
}

#[tokio::test]
async fn a_thousand_attacker_entries_through_the_trusted_proxy() {
    // The proxy appends the address it saw (the attacker's) to whatever the attacker sent.
    let attacker = "203.0.113.7";
    let forged = |i: usize| -> Vec<String> {
        (0..1000)
            .map(|j| match j % 5 {
                // Some forged entries even claim to be trusted proxies.
                0 => format!("10.{}.{}.{}", j % 256, i % 256, j / 256),
                1 => format!("2001:db8:{:x}::{:x}", i, j),
                _ => v4(i * 1000 + j),
            })
            .collect()
    };

    let xff = app(client_ip());
    assert_no_bypass(&xff, "1,000 X-Forwarded-For entries", |i| {
        let value = format!("{}, {attacker}", forged(i).join(", "));
        request(PROXY, &[line("x-forwarded-for", value)])
    })
    .await;
    // The same, with the attacker's entries on header lines of their own before the proxy's.
    let lines = app(client_ip());
    assert_no_bypass(&lines, "1,000 X-Forwarded-For lines", |i| {
        let mut headers: Vec<_> = forged(i)
            .into_iter()
            .map(|f| line("x-forwarded-for", f))
            .collect();
        headers.push(line("x-forwarded-for", attacker));
        request(PROXY, &headers)
    })
    .await;
    assert_fresh(
        &lines,
        "another client behind the proxy, on a line of its own",
        || {
            request(
                PROXY,
                &[
                    line("x-forwarded-for", "198.51.100.1"),
                    line("x-forwarded-for", "203.0.113.8"),
                ],
            )
        },
    )
    .await;
    // Behind two proxies (the second one also trusted).
    let two_hops = app(client_ip());
    assert_no_bypass(&two_hops, "1,000 entries behind two proxies", |i| {
        let value = format!("{}, {attacker}, 10.0.0.77", forged(i).join(","));
        request(PROXY, &[line("x-forwarded-for", value)])
    })
    .await;
    assert_fresh(&two_hops, "another client behind the two proxies", || {
        request(PROXY, &[line("x-forwarded-for", "203.0.113.8, 10.0.0.77")])
    })
    .await;

    let fwd = app(client_ip().header(ForwardedHeader::Forwarded));
    assert_no_bypass(&fwd, "1,000 Forwarded elements", |i| {
        let elements: Vec<String> = forged(i)
            .into_iter()
            .map(|f| {
                if f.contains(':') {
                    format!("for=\"[{f}]:{i}\"")
                } else {
                    format!("for={f};proto=https")
                }
            })
            .collect();
        let value = format!("{}, for={attacker};by=10.0.0.5", elements.join(", "));
        request(PROXY, &[line("forwarded", value)])
    })
    .await;
    assert_fresh(
        &fwd,
        "another client behind the proxy, in Forwarded",
        || request(PROXY, &[line("forwarded", "for=203.0.113.8;by=10.0.0.5")]),
    )
    .await;
    // A quote the attacker leaves open, which the proxy's element, appended to the same line,
    // falls into: the line names no address (the proxy's key counts, not the forged one).
    let open = app(client_ip().header(ForwardedHeader::Forwarded));
    assert_no_bypass(&open, "a quote left open in Forwarded", |i| {
        let value = format!("for={};x=\", for={attacker}", v4(i));
        request(PROXY, &[line("forwarded", value)])
    })
    .await;

    // The attacker is the key, not the proxy: another client behind the proxy is unaffected.
    assert_fresh(&xff, "another client behind the proxy", || {
        request(PROXY, &[line("x-forwarded-for", "203.0.113.8")])
    })
    .await;
}

#[tokio::test]
async fn garbage_through_the_proxy_counts_against_the_proxy() {
    let garbage = |i: usize| -> Vec<u8> {
        match i % 10 {
            0 => format!("garbage-{i}").into_bytes(),
            1 => format!("{}, not-an-ip-{i}", v4(i)).into_bytes(),
            2 => format!("{} {}", v4(i), v4(i + 1)).into_bytes(),
            3 => b"unknown".to_vec(),
            4 => format!("{},{}", v4(i), "x".repeat(100_000)).into_bytes(),
            5 => {
                let mut v = v4(i).into_bytes();
                v.extend_from_slice(b"\xff\xfe, \x80");
                v
            }
            6 => format!("{}, {}", v4(i), ["10.0.0.9"; 17].join(",")).into_bytes(),
            7 => format!("[{}]:{i}:{i}", v4(i)).into_bytes(),
            8 => Vec::new(),
            _ => format!("{}%25, ::ffff:{}/8", v4(i), v4(i)).into_bytes(),
        }
    };
    for kind in FORWARDED_KINDS {
        let app = app(client_ip().header(kind));
        let what = format!("garbage {kind:?} through the proxy");
        assert_no_bypass(&app, &what, |i| {
            let value = garbage(i);
            let forwarded = match i % 3 {
                0 => value.clone(),
                1 => [b"for=".as_slice(), &value].concat(),
                _ => format!("for=_hidden{i}, for=unknown;proto=http").into_bytes(),
            };
            let mut headers = vec![
                line("x-forwarded-for", value.clone()),
                line("forwarded", forwarded),
                line("x-real-ip", value),
            ];
            if i % 4 == 0 {
                // Two X-Real-IP lines: not one proxy's answer.
                headers.push(line("x-real-ip", v4(i)));
            }
            request(PROXY, &headers)
        })
        .await;
        // Those requests counted against the proxy's own address (the fallback), nothing else.
        assert_eq!(
            status_of(&app, request(PROXY, &[])).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{what}: the proxy's key"
        );
        assert_fresh(&app, &format!("{what}: a client behind the proxy"), || {
            request(PROXY, &all_forwarding_headers("203.0.113.8"))
        })
        .await;
    }
}

#[tokio::test]
async fn ipv6_rotation_inside_one_64() {
    let mut rng = Rng(0x5eed);
    let peer_ip = app(PeerIp::new());
    assert_no_bypass(
        &peer_ip,
        "PeerIp, peers rotating in 2001:db8:1:2::/64",
        |i| {
            let peer = format!("[2001:db8:1:2:{}]:{}", rng.interface_id(), 1000 + i);
            request(&peer, &all_forwarding_headers(&v4(i)))
        },
    )
    .await;
    assert_fresh(&peer_ip, "the next /64", || {
        request("[2001:db8:1:3::1]:1", &[])
    })
    .await;

    let direct = app(client_ip());
    assert_no_bypass(&direct, "ClientIp, peers rotating in one /64", |i| {
        let peer = format!("[2001:db8:1:2:{}]:{}", rng.interface_id(), 1000 + i);
        request(
            &peer,
            &all_forwarding_headers(&format!("2001:db8:{i:x}::1")),
        )
    })
    .await;

    for kind in FORWARDED_KINDS {
        let behind = app(client_ip().header(kind));
        let what = format!("ClientIp, {kind:?} rotating in one /64 behind the proxy");
        assert_no_bypass(&behind, &what, |i| {
            let ip = format!("2001:db8:1:2:{}", rng.interface_id());
            let headers = match i % 3 {
                0 => all_forwarding_headers(&ip),
                1 => vec![
                    line("x-forwarded-for", format!("[{ip}]:{i}")),
                    line("forwarded", format!("for=\"[{ip}]:{i}\";proto=https")),
                    line("x-real-ip", ip.clone()),
                ],
                _ => vec![
                    line("x-forwarded-for", format!("{}, {ip}", v4(i))),
                    line("forwarded", format!("for={}, for=\"[{ip}]\"", v4(i))),
                    line("x-real-ip", format!(" {ip} ")),
                ],
            };
            request(PROXY, &headers)
        })
        .await;
        assert_fresh(&behind, &format!("{what}: the next /64"), || {
            request(PROXY, &all_forwarding_headers("2001:db8:1:3::1"))
        })
        .await;
    }
}

#[tokio::test]
async fn ipv4_mapped_ipv6_is_the_ipv4_address() {
    let peer_ip = app(PeerIp::new());
    assert_no_bypass(&peer_ip, "PeerIp, 1.2.3.4 and ::ffff:1.2.3.4", |i| {
        let peer = if i % 2 == 0 {
            format!("1.2.3.4:{i}")
        } else {
            format!("[::ffff:1.2.3.4]:{i}")
        };
        request(&peer, &[])
    })
    .await;
    assert_fresh(&peer_ip, "the next address, mapped", || {
        request("[::ffff:1.2.3.5]:1", &[])
    })
    .await;

    let direct = app(client_ip());
    assert_no_bypass(&direct, "ClientIp, a mapped and a plain peer", |i| {
        let peer = match i % 3 {
            0 => format!("1.2.3.4:{i}"),
            1 => format!("[::ffff:1.2.3.4]:{i}"),
            _ => format!("[::ffff:102:304]:{i}"),
        };
        request(&peer, &all_forwarding_headers(&v4(i)))
    })
    .await;
    // Another untrusted peer that forges 1.2.3.4 is keyed by its own address.
    assert_fresh(&direct, "another peer forging 1.2.3.4", || {
        request("[::ffff:1.2.3.5]:1", &all_forwarding_headers("1.2.3.4"))
    })
    .await;

    for kind in FORWARDED_KINDS {
        let behind = app(client_ip().header(kind));
        let what = format!("ClientIp, {kind:?}: the forms of 1.2.3.4 behind the proxy");
        let forms = [
            "1.2.3.4",
            "::ffff:1.2.3.4",
            "::FFFF:1.2.3.4",
            "::ffff:102:304",
            "0:0:0:0:0:ffff:0102:0304",
        ];
        assert_no_bypass(&behind, &what, |i| {
            let ip = forms[i % forms.len()];
            // The proxy itself may show up IPv4-mapped too.
            let proxy = if i % 2 == 0 {
                PROXY
            } else {
                "[::ffff:10.0.0.5]:40000"
            };
            let headers = match i % 4 {
                0 | 1 => all_forwarding_headers(ip),
                2 => vec![
                    line(
                        "x-forwarded-for",
                        format!("{}, ::ffff:10.0.0.9", node(ip, i)),
                    ),
                    line(
                        "forwarded",
                        format!("for=\"{}\", for=10.0.0.9", node(ip, i)),
                    ),
                    line("x-real-ip", ip),
                ],
                _ => vec![
                    line("x-forwarded-for", format!("{}, {ip}", v4(i))),
                    line(
                        "forwarded",
                        format!("for={}, for=\"{}\"", v4(i), node(ip, i)),
                    ),
                    line("x-real-ip", ip),
                ],
            };
            request(proxy, &headers)
        })
        .await;
        assert_fresh(&behind, &format!("{what}: the next address"), || {
            request(PROXY, &all_forwarding_headers("::ffff:1.2.3.5"))
        })
        .await;
    }
}

#[tokio::test]
async fn a_48_prefix_groups_the_whole_48() {
    let mut rng = Rng(48);
    let peer_ip = app(PeerIp::new().with_ipv6_prefix(48).unwrap());
    assert_no_bypass(&peer_ip, "PeerIp /48, rotating subnets", |i| {
        let peer = format!("[2001:db8:aa:{:x}:{}]:{i}", i * 977, rng.interface_id());
        request(&peer, &[])
    })
    .await;
    assert_fresh(&peer_ip, "the next /48", || {
        request("[2001:db8:ab::1]:1", &[])
    })
    .await;

    for kind in FORWARDED_KINDS {
        let behind = app(client_ip().header(kind).with_ipv6_prefix(48).unwrap());
        let what = format!("ClientIp /48, {kind:?} rotating subnets");
        assert_no_bypass(&behind, &what, |i| {
            let ip = format!("2001:db8:aa:{:x}:{}", i * 1543, rng.interface_id());
            request(PROXY, &all_forwarding_headers(&ip))
        })
        .await;
        assert_fresh(&behind, &format!("{what}: the next /48"), || {
            request(PROXY, &all_forwarding_headers("2001:db8:ab::1"))
        })
        .await;
    }
    // With the default /64, the same rotation would get a fresh quota in each subnet.
    let per_64 = app(client_ip());
    for i in 0..ATTEMPTS {
        let ip = format!("2001:db8:aa:{:x}::1", i);
        assert_eq!(
            status_of(&per_64, request(PROXY, &all_forwarding_headers(&ip))).await,
            StatusCode::OK
        );
    }
}

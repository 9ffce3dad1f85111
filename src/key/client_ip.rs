//! The client's address behind trusted proxies, from their forwarding header, believed only when
//! the peer is a trusted proxy.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::{HeaderMap, Request};
use ipnet::IpNet;

use super::extract::KeyExtractor;
use super::extract::{InvalidPrefix, OnDuplicate, PeerIp, PEER_ADDRESS_SOURCES};
use super::value::Key;

/// The networks of the proxies in front of the service, whose forwarding headers are believed.
///
/// ```
/// use tower_throttle::key::TrustedProxies;
///
/// let trusted = TrustedProxies::new(["10.0.0.0/8", "::1", "fd00::/8"]).unwrap();
/// assert!(trusted.contains("10.1.2.3".parse().unwrap()));
/// assert!(trusted.contains("::ffff:10.1.2.3".parse().unwrap())); // IPv4-mapped counts as IPv4
/// assert!(!trusted.contains("192.0.2.1".parse().unwrap()));
/// assert!(TrustedProxies::new(["10.0.0.0/33"]).is_err());
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Arc<[IpNet]>,
}

impl TrustedProxies {
    /// Networks in CIDR notation (`"10.0.0.0/8"`, `"2001:db8::/32"`) or single addresses.
    pub fn new<I, S>(cidrs: I) -> Result<Self, InvalidCidr>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = cidrs
            .into_iter()
            .map(|s| parse_net(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TrustedProxies { nets: nets.into() })
    }

    /// No trusted proxies: forwarding headers are never believed.
    pub fn none() -> Self {
        Self::default()
    }

    /// Whether `ip` lies in a trusted network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

impl fmt::Debug for TrustedProxies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.nets.iter().map(|n| n.to_string()))
            .finish()
    }
}

/// A network (`"10.0.0.0/8"`) or an address, truncated to its prefix, IPv4-mapped IPv6 networks as
/// their IPv4 network (addresses are compared in canonical form).
pub(crate) fn parse_net(s: &str) -> Result<IpNet, InvalidCidr> {
    let s = s.trim();
    let net = match s.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => s
            .parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| InvalidCidr(s.to_owned()))?,
    };
    Ok(match net {
        IpNet::V6(v6) => match v6.addr().to_ipv4_mapped() {
            Some(v4) if v6.prefix_len() >= 96 => IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96)
                .map_err(|_| InvalidCidr(s.into()))?,
            _ => net,
        },
        v4 => v4,
    }
    .trunc())
}

/// A network entry (a trusted proxy, an access-list network) that is neither a CIDR network nor an
/// address. The message names the entry only: the caller names the setting it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidCidr(pub String);

impl fmt::Display for InvalidCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a network (\"10.0.0.0/8\", \"fd00::/8\") or an address",
            self.0
        )
    }
}

impl std::error::Error for InvalidCidr {}

/// Which header the trusted proxies set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
    /// `X-Real-IP: client`, set (not appended) by the one proxy in front.
    XRealIp,
    /// `CF-Connecting-IP: client`, set by Cloudflare. Trust Cloudflare's published networks (or the
    /// proxy between it and you, if that one passes the header on unchanged).
    CfConnectingIp,
    /// `True-Client-IP: client`, set by Akamai and by Cloudflare Enterprise.
    TrueClientIp,
    /// `Fly-Client-IP: client`, set by Fly.io's proxy.
    FlyClientIp,
}

impl ForwardedHeader {
    /// Every header, in the order of [`name`](Self::name)'s table.
    const ALL: [ForwardedHeader; 6] = [
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::XRealIp,
        ForwardedHeader::CfConnectingIp,
        ForwardedHeader::TrueClientIp,
        ForwardedHeader::FlyClientIp,
    ];

    /// `"x-forwarded-for"`, `"forwarded"` or `"x-real-ip"`.
    pub fn as_str(self) -> &'static str {
        self.name().as_str()
    }

    fn name(self) -> &'static HeaderName {
        static NAMES: [HeaderName; 6] = [
            HeaderName::from_static("x-forwarded-for"),
            FORWARDED,
            HeaderName::from_static("x-real-ip"),
            HeaderName::from_static("cf-connecting-ip"),
            HeaderName::from_static("true-client-ip"),
            HeaderName::from_static("fly-client-ip"),
        ];
        &NAMES[self as usize]
    }
}

impl FromStr for ForwardedHeader {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.to_ascii_lowercase();
        let found = Self::ALL.into_iter().find(|h| h.as_str() == name);
        found.ok_or_else(|| {
            format!(
                "client IP header {s:?} is not \"x-forwarded-for\", \"forwarded\", \"x-real-ip\", \
                 \"cf-connecting-ip\", \"true-client-ip\" or \"fly-client-ip\""
            )
        })
    }
}

/// The most trusted proxies walked through from the right of a forwarding header (the peer not
/// counted); a chain of that many is not believed (the peer counts).
pub const MAX_HOPS: usize = 16;

/// The client IP: the peer's address, or, when the peer is a [trusted proxy](TrustedProxies), the
/// rightmost address in the forwarding header that is not a trusted proxy itself.
///
/// Everything left of that address was written by the client and is never read, so a forged
/// `X-Forwarded-For` (or a thousand entries of one) cannot choose a key. Entries are read from the
/// right, at most [`MAX_HOPS`] of them; one that is not an address (garbage, `unknown`, an obfuscated
/// `Forwarded` node), that many trusted hops, a header of trusted proxies only, or a missing header,
/// and the peer counts. From an
/// untrusted peer the headers are ignored altogether. The result is grouped like [`PeerIp`]'s (IPv6
/// by prefix, /64 by default; IPv4-mapped addresses as IPv4).
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{ClientIp, Key, KeyExtractor, PeerAddr, TrustedProxies};
///
/// let client_ip = ClientIp::new(TrustedProxies::new(["10.0.0.0/8"]).unwrap());
/// let request = |peer: &str, xff: &str| {
///     let mut r = Request::get("/").header("x-forwarded-for", xff).body(()).unwrap();
///     r.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
///     r
/// };
/// // Behind the load balancer 10.0.0.5, the client is 203.0.113.7, whatever it claimed before.
/// let via_proxy = request("10.0.0.5:4000", "1.2.3.4, 203.0.113.7, 10.0.0.9");
/// assert_eq!(client_ip.extract(&via_proxy), Some(Key::from_ip("203.0.113.7".parse().unwrap())));
/// // A client talking directly cannot choose its key.
/// let direct = request("198.51.100.1:5000", "1.2.3.4");
/// assert_eq!(client_ip.extract(&direct), Some(Key::from_ip("198.51.100.1".parse().unwrap())));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientIp {
    peer: PeerIp,
    trusted: TrustedProxies,
    header: ForwardedHeader,
}

impl ClientIp {
    /// The client IP behind `trusted`, from `X-Forwarded-For`, IPv6 grouped by /64.
    pub fn new(trusted: TrustedProxies) -> Self {
        ClientIp {
            peer: PeerIp::new(),
            trusted,
            header: ForwardedHeader::XForwardedFor,
        }
    }

    /// Reads `header` instead of `X-Forwarded-For`: the one the proxies set (a header they do not set
    /// is whatever the client sent).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by the first `prefix` bits (1 to 128).
    pub fn with_ipv6_prefix(mut self, prefix: u8) -> Result<Self, InvalidPrefix> {
        self.peer = self.peer.with_ipv6_prefix(prefix)?;
        Ok(self)
    }

    /// The trusted proxies.
    pub fn trusted(&self) -> &TrustedProxies {
        &self.trusted
    }

    /// The header read.
    pub fn forwarded_header(&self) -> ForwardedHeader {
        self.header
    }

    /// The IPv6 prefix length.
    pub fn ipv6_prefix(&self) -> u8 {
        self.peer.ipv6_prefix()
    }

    /// Groups IPv4 clients by the first `prefix` bits (1 to 32; 32, the default, = one key per
    /// address).
    pub fn with_ipv4_prefix(mut self, prefix: u8) -> Result<Self, InvalidPrefix> {
        self.peer = self.peer.with_ipv4_prefix(prefix)?;
        Ok(self)
    }

    /// The IPv4 prefix length.
    pub fn ipv4_prefix(&self) -> u8 {
        self.peer.ipv4_prefix()
    }

    /// How client addresses are grouped into keys: the peer IP extractor with these prefixes.
    pub(crate) fn grouping(&self) -> PeerIp {
        self.peer
    }

    /// The client's address for a connection from `peer` with these headers.
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusted.contains(peer) {
            return peer;
        }
        match self.header {
            // One address, set (not appended) by the proxy in front: believed only alone.
            ForwardedHeader::XRealIp
            | ForwardedHeader::CfConnectingIp
            | ForwardedHeader::TrueClientIp
            | ForwardedHeader::FlyClientIp => {
                let values = headers.get_all(self.header.name()).iter();
                let value = OnDuplicate::Refuse.pick(values);
                value
                    .and_then(|v| std::str::from_utf8(v.as_bytes()).ok()?.trim().parse().ok())
                    .map_or(peer, |ip: IpAddr| ip.to_canonical())
            }
            ForwardedHeader::XForwardedFor => self.walk(peer, headers, parse_xff_entry),
            ForwardedHeader::Forwarded => self.walk(peer, headers, parse_forwarded_element),
        }
    }

    /// Walks the entries right to left: the first address that is not a trusted proxy is the client.
    fn walk(
        &self,
        peer: IpAddr,
        headers: &HeaderMap,
        parse: fn(&[u8]) -> Option<IpAddr>,
    ) -> IpAddr {
        let mut trusted_hops = 0;
        for line in headers.get_all(self.header.name()).iter().rev() {
            let line = line.as_bytes();
            // A `Forwarded` value may be quoted and hold a `,` (`host="a, for=6.6.6.6"`): split
            // outside quotes. `X-Forwarded-For` has no quoting.
            let quoting = matches!(self.header, ForwardedHeader::Forwarded);
            let (mut plain, mut quoted);
            let entries: &mut dyn Iterator<Item = &[u8]> = if quoting && line.contains(&b'"') {
                // Read left to right (quotes open there), keeping only the last MAX_HOPS: no more
                // are walked, and a line of a hundred thousand commas allocates nothing.
                let (mut last, mut count) = ([&line[..0]; MAX_HOPS], 0);
                for entry in split_unquoted(line, b',') {
                    last[count % MAX_HOPS] = entry;
                    count += 1;
                }
                let kept = count.min(MAX_HOPS);
                quoted = (1..=kept).map(move |back| last[(count - back) % MAX_HOPS]);
                &mut quoted
            } else {
                plain = line.rsplit(|b| *b == b',');
                &mut plain
            };
            for entry in entries {
                let Some(ip) = parse(entry).map(|ip| ip.to_canonical()) else {
                    return peer;
                };
                if !self.trusted.contains(ip) {
                    return ip;
                }
                trusted_hops += 1;
                if trusted_hops >= MAX_HOPS {
                    return peer;
                }
            }
        }
        // Every entry is a trusted proxy: either the request started inside, or a proxy passed on
        // what its client wrote without adding to it. Only the peer is known for sure.
        peer
    }
}

/// The longest entry worth parsing: `[ffff:...:ffff]:65535` and a little more.
const MAX_ENTRY: usize = 64;

/// One `X-Forwarded-For` entry: an address, also `[v6]:port` or `v4:port` as some proxies write.
fn parse_xff_entry(entry: &[u8]) -> Option<IpAddr> {
    let entry = entry.trim_ascii();
    if entry.len() > MAX_ENTRY {
        return None;
    }
    parse_node(std::str::from_utf8(entry).ok()?)
}

/// An address with an optional port: `192.0.2.1`, `192.0.2.1:80`, `[2001:db8::1]:80`.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    s.parse::<SocketAddr>().ok().map(|a| a.ip()).or_else(|| {
        // `[2001:db8::1]` without a port.
        s.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
    })
}

/// `s` split at each `sep` outside a quoted string (with its `\` escapes): in
/// `for=1.2.3.4;host="x, for=6.6.6.6;y="` the quoted `,` and `;` separate nothing. An unclosed
/// quote runs to the end, and that last piece is empty: it names no address, since a client that
/// leaves a quote open swallows what a proxy appends to its line (`for=6.6.6.6;x=", for=<client>`).
fn split_unquoted(s: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (i, &b) in s.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                _ if b == sep && !quoted => {
                    rest = Some(&s[i + 1..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(if quoted { &s[s.len()..] } else { s })
    })
}

/// One `Forwarded` element: its `for=` parameter, as a node.
fn parse_forwarded_element(element: &[u8]) -> Option<IpAddr> {
    let element = element.trim_ascii();
    if element.len() > 4 * MAX_ENTRY {
        return None;
    }
    let mut found = None;
    for pair in split_unquoted(element, b';') {
        // An empty pair is allowed (`for=192.0.2.43;`): RFC 7239's `[ forwarded-pair ]`.
        if pair.trim_ascii().is_empty() {
            continue;
        }
        let (name, value) = std::str::from_utf8(pair).ok()?.split_once('=')?;
        if name.trim().eq_ignore_ascii_case("for") {
            if found.is_some() {
                return None; // two `for`s: not from a proxy that follows the RFC
            }
            let value = value.trim();
            let value = match value.strip_prefix('"') {
                Some(quoted) => quoted.strip_suffix('"')?,
                None => value,
            };
            // `unknown` and obfuscated identifiers (`_hidden`) name no address; an obfuscated
            // port (`192.0.2.43:_p1`, `[2001:db8::1]:_p1`) hides only the port.
            let value = match value.rsplit_once(":_") {
                Some((node, port))
                    if obfuscated(port) && (node.ends_with(']') || !node.contains(':')) =>
                {
                    node
                }
                _ => value,
            };
            found = Some(parse_node(value)?);
        }
    }
    found
}

/// Whether `port` (after its `_`) is an obfuscated port of RFC 7239: `_` then letters, digits,
/// `.`, `_` or `-`.
fn obfuscated(port: &str) -> bool {
    !port.is_empty()
        && port
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl<B> KeyExtractor<B> for ClientIp {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let peer = PeerIp::peer(request.extensions())?;
        Some(self.peer.key_for(self.resolve(peer, request.headers())))
    }

    fn describe(&self) -> String {
        format!(
            "the client IP (the peer address, or {} from a trusted proxy; {PEER_ADDRESS_SOURCES})",
            self.header.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(trusted: &[&str], header: ForwardedHeader, peer: &str, values: &[&str]) -> String {
        let ci = ClientIp::new(TrustedProxies::new(trusted).unwrap()).header(header);
        let name = header.as_str();
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(
                HeaderName::from_static(name),
                http::HeaderValue::from_bytes(v.as_bytes()).unwrap(),
            );
        }
        ci.resolve(peer.parse().unwrap(), &headers).to_string()
    }

    const XFF: ForwardedHeader = ForwardedHeader::XForwardedFor;
    const FWD: ForwardedHeader = ForwardedHeader::Forwarded;
    const REAL: ForwardedHeader = ForwardedHeader::XRealIp;
    const LB: &[&str] = &["10.0.0.0/8"];

    /// Checks each case (header read, header lines, client resolved) for `peer` behind `trusted`.
    fn check(trusted: &[&str], peer: &str, cases: &[(ForwardedHeader, &[&str], &str)]) {
        for &(header, values, want) in cases {
            let case = format!("{trusted:?} {peer} {header:?} {values:?}");
            assert_eq!(resolve(trusted, header, peer, values), want, "{case}");
        }
    }

    /// [`check`] for peer 10.0.0.1, a trusted load balancer.
    fn behind_lb(cases: &[(ForwardedHeader, &[&str], &str)]) {
        check(LB, "10.0.0.1", cases);
    }

    #[test]
    fn the_rightmost_untrusted_address_is_the_client_however_much_is_forged_before_it() {
        let fwd = r#"for=6.6.6.6, for="[2001:db8::1]:4711";proto=https, for=10.0.0.2"#;
        let forged: Vec<String> = (0..1000)
            .map(|i| format!("1.2.{}.{}", i / 256, i % 256))
            .collect();
        let forged = format!("{}, 203.0.113.7", forged.join(", "));
        let garbage = format!("{}, 203.0.113.7", "x".repeat(100_000));
        behind_lb(&[
            (XFF, &["203.0.113.7"], "203.0.113.7"),
            (XFF, &["6.6.6.6, 203.0.113.7, 10.0.0.2"], "203.0.113.7"),
            // Several header lines are one list, in order.
            (XFF, &["6.6.6.6", "203.0.113.7,10.0.0.2"], "203.0.113.7"),
            (FWD, &[fwd], "2001:db8::1"),
            (XFF, &["[2001:db8::2]:80"], "2001:db8::2"),
            (XFF, &["203.0.113.9:443"], "203.0.113.9"),
            // RFC 7239: an obfuscated port hides the port only; an empty pair is allowed.
            (FWD, &[r#"for="192.0.2.43:_hidden""#], "192.0.2.43"),
            (
                FWD,
                &[r#"for="[2001:db8:cafe::17]:_p1""#],
                "2001:db8:cafe::17",
            ),
            (FWD, &["for=192.0.2.44;"], "192.0.2.44"),
            (FWD, &["proto=https;;for=192.0.2.45"], "192.0.2.45"),
            (REAL, &[" 203.0.113.7 "], "203.0.113.7"),
            // A thousand forged entries, or one huge one, cannot choose the key.
            (XFF, &[&forged], "203.0.113.7"),
            (XFF, &[&garbage], "203.0.113.7"),
        ]);
    }

    #[test]
    fn garbage_and_oversized_headers_fall_back_to_the_peer() {
        for value in [
            "",
            "not-an-ip",
            "1.2.3.4, garbage",
            "unknown",
            "1.2.3.4 5.6.7.8",
        ] {
            behind_lb(&[(XFF, &[value], "10.0.0.1")]);
        }
        for value in [
            "for=unknown",
            "for=_hidden",
            "for=_hidden:_port",
            "for=\"unknown:_p1\"",
            "for=\"1.2.3.4:_p/1\"",
            "by=1.2.3.4",
            "for=1.2.3.4;for=5.6.7.8",
            "for=\"1.2.3.4",
        ] {
            behind_lb(&[(FWD, &[value], "10.0.0.1")]);
        }
        // A `,` or `;` inside a quoted value (a proxy copying the client's Host) is no separator:
        // the client cannot slip in an element or a `for` of its own.
        behind_lb(&[
            (
                FWD,
                &[r#"for=203.0.113.7;host="x, for=6.6.6.6;y=""#],
                "203.0.113.7",
            ),
            (
                FWD,
                &[r#"for=203.0.113.7;host="a;for=6.6.6.6""#],
                "203.0.113.7",
            ),
            (
                FWD,
                &[r#"for=203.0.113.7;host="a\", for=6.6.6.6""#],
                "203.0.113.7",
            ),
            // A quote left open swallows what follows it on the line, what a proxy appended
            // among it too: the line names no address, and the peer counts.
            (
                FWD,
                &[r#"for=203.0.113.7;host="unclosed, for=6.6.6.6"#],
                "10.0.0.1",
            ),
            (FWD, &[r#"for=6.6.6.6;x=", for=203.0.113.7"#], "10.0.0.1"),
            (
                FWD,
                &[r#"for=6.6.6.6;x=", for="[2001:db8::7]""#],
                "10.0.0.1",
            ),
            // A `\` escapes only inside quotes: outside, the `,` after it still separates.
            (
                FWD,
                &[r#"for=6.6.6.6\, for=203.0.113.7;host="x""#],
                "203.0.113.7",
            ),
        ]);
        // MAX_HOPS trusted hops in the header: not believed; one fewer: the client before them.
        let hops = |n| format!("203.0.113.7,{}", vec!["10.0.0.9"; n].join(","));
        behind_lb(&[
            (REAL, &["1.2.3.4", "5.6.7.8"], "10.0.0.1"),
            (REAL, &["1.2.3.4, 5.6.7.8"], "10.0.0.1"),
            (XFF, &[&hops(MAX_HOPS)], "10.0.0.1"),
            (XFF, &[&hops(MAX_HOPS - 1)], "203.0.113.7"),
            // Only trusted addresses (a relay passing on what its client wrote): the peer.
            (XFF, &["10.0.0.7, 10.0.0.9"], "10.0.0.1"),
        ]);
        // No trusted proxy: the peer is the client (other untrusted peers: middleware/spoofing.rs).
        check(&[], "10.0.0.1", &[(XFF, &["1.2.3.4"], "10.0.0.1")]);
    }

    #[test]
    fn ipv4_mapped_addresses_count_as_ipv4() {
        let client = "203.0.113.7";
        let mapped_lb = &["::ffff:10.0.0.0/104"];
        check(
            LB,
            "::ffff:10.0.0.1",
            &[(XFF, &["::ffff:203.0.113.7"], client)],
        );
        check(mapped_lb, "10.0.0.1", &[(XFF, &[client], client)]);
    }

    #[test]
    fn cdn_client_ip_headers_are_believed_only_from_trusted_peers_and_alone() {
        for header in [
            ForwardedHeader::CfConnectingIp,
            ForwardedHeader::TrueClientIp,
            ForwardedHeader::FlyClientIp,
        ] {
            assert_eq!(header.as_str().parse::<ForwardedHeader>(), Ok(header));
            behind_lb(&[
                (header, &["203.0.113.7"], "203.0.113.7"),
                (header, &["1.2.3.4", "5.6.7.8"], "10.0.0.1"),
                (header, &["1.2.3.4, 5.6.7.8"], "10.0.0.1"),
                (header, &["x"], "10.0.0.1"),
            ]);
            check(
                LB,
                "198.51.100.1",
                &[(header, &["203.0.113.7"], "198.51.100.1")],
            );
        }
        assert_eq!(
            "CF-Connecting-IP".parse::<ForwardedHeader>(),
            Ok(ForwardedHeader::CfConnectingIp)
        );
    }

    #[test]
    fn bad_cidrs_are_errors() {
        for bad in ["10.0.0.0/33", "::/129", "ten", "10.0.0.0/8/8", ""] {
            assert!(TrustedProxies::new([bad]).is_err(), "{bad:?}");
        }
        let t = TrustedProxies::new(["10.1.2.3/8"]).unwrap();
        assert!(t.contains("10.200.0.1".parse().unwrap()));
        let err = TrustedProxies::new(["10.0.0.0/8", " ten "]).unwrap_err();
        assert_eq!(err, InvalidCidr("ten".into()));
        assert_eq!(
            err.to_string(),
            r#""ten" is not a network ("10.0.0.0/8", "fd00::/8") or an address"#
        );
    }

    #[test]
    fn header_names_parse_back_and_empty_lists_say_so() {
        let names =
            "x-forwarded-for forwarded x-real-ip cf-connecting-ip true-client-ip fly-client-ip";
        let mut seen = std::collections::HashSet::new();
        for name in names.split(' ') {
            let header: ForwardedHeader = name.parse().unwrap();
            assert_eq!(header.as_str(), name);
            assert_eq!(name.to_ascii_uppercase().parse(), Ok(header));
            assert!(seen.insert(header), "{name}");
        }
        let err = "x-client-ip".parse::<ForwardedHeader>().unwrap_err();
        assert!(err.contains("\"x-client-ip\" is not"), "{err}");
        assert!(TrustedProxies::none().is_empty());
        assert!(!TrustedProxies::new(["10.0.0.0/8"]).unwrap().is_empty());
    }

    #[test]
    fn the_settings_read_back() {
        let trusted = TrustedProxies::new(["10.0.0.0/8", "::ffff:192.168.0.0/112"]).unwrap();
        let ip = ClientIp::new(trusted.clone()).header(ForwardedHeader::Forwarded);
        assert_eq!(
            format!("{:?}", ip.trusted()),
            r#"["10.0.0.0/8", "192.168.0.0/16"]"#
        );
        assert_eq!(format!("{:?}", ip.trusted()), format!("{trusted:?}"));
        assert_eq!(ip.forwarded_header(), ForwardedHeader::Forwarded);
        // The admin handle builds its keys with the IPv6 prefix: a wrong one would peek at another
        // key. A prefix set is read end to end in tests/middleware/spoofing.rs (a /48).
        assert_eq!(ip.ipv6_prefix(), 64);
        assert!(ip.clone().with_ipv6_prefix(0).is_err() && ip.with_ipv6_prefix(129).is_err());
    }

    #[test]
    fn the_extractor_keys_the_resolved_client_and_says_what_it_reads() {
        use super::super::extract::PeerAddr;
        let ci = ClientIp::new(TrustedProxies::new(LB).unwrap());
        let mut request = Request::builder()
            .header("x-forwarded-for", "203.0.113.7")
            .body(())
            .unwrap();
        // No peer address: no key (the policy's missing-key setting decides).
        assert_eq!(ci.extract(&request), None);
        request
            .extensions_mut()
            .insert(PeerAddr("10.0.0.1:443".parse().unwrap()));
        let key = Key::from("203.0.113.7".parse::<IpAddr>().unwrap());
        assert_eq!(ci.extract(&request), Some(key));
        // Named in the error a request without a peer address gets.
        let said = KeyExtractor::<()>::describe(&ci);
        assert!(said.starts_with("the client IP"), "{said}");
        assert!(said.contains("x-forwarded-for"), "{said}");
        assert!(said.contains(PEER_ADDRESS_SOURCES), "{said}");
    }

    #[test]
    fn a_mapped_address_with_a_prefix_shorter_than_96_stays_an_ipv6_network() {
        // Only a prefix of 96 bits or more lies inside the IPv4-mapped range (::ffff:0:0/96) and
        // means an IPv4 network; a shorter one is an IPv6 network like any other (and parsing it
        // must not subtract 96 from its prefix).
        let wide = TrustedProxies::new(["::ffff:10.0.0.0/80"]).unwrap();
        assert_eq!(format!("{wide:?}"), r#"["::/80"]"#);
        assert!(wide.contains("::1".parse().unwrap()));
        assert!(!wide.contains("10.0.0.1".parse().unwrap()));
        let mapped = TrustedProxies::new(["::ffff:10.0.0.0/96"]).unwrap();
        assert_eq!(format!("{mapped:?}"), r#"["0.0.0.0/0"]"#);
    }

    /// Entries are bounded (64 bytes for `X-Forwarded-For`, 256 for a `Forwarded` element), but an
    /// entry as long as the bound is read: a port may have leading zeros, an element many parameters.
    #[test]
    fn entries_as_long_as_the_bound_are_read() {
        let xff = |zeros| format!("198.51.100.7:{}80", "0".repeat(zeros));
        assert_eq!(xff(49).len(), 64);
        let element = |len: usize| {
            let start = "for=198.51.100.7;proto=https;host=";
            format!("{start}{}", "h".repeat(len - start.len()))
        };
        let peer = "10.0.0.1";
        check(
            LB,
            peer,
            &[
                (XFF, &[&xff(49)], "198.51.100.7"),
                (XFF, &[&xff(50)], peer),
                (FWD, &[&element(100)], "198.51.100.7"),
                (FWD, &[&element(256)], "198.51.100.7"),
                (FWD, &[&element(257)], peer),
            ],
        );
    }
}

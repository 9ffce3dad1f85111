//! The [`KeyExtractor`] trait, the built-in extractors and [`OnDuplicate`].

use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{HeaderName, Request};

use super::value::Key;

/// What a key source does when the request carries its value more than once (a header line twice,
/// `?key=a&key=b`, two cookies of the name).
///
/// A value sent twice is ambiguous: a client can put its own `x-user-id` before the one a gateway
/// appends, and be counted as someone else. The default, [`Refuse`](Self::Refuse), treats such a
/// request as having no key (the policy's [`MissingKey`](crate::policy::MissingKey) answer, `400` by
/// default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnDuplicate {
    /// No key (the default).
    #[default]
    Refuse,
    /// The first value counts.
    First,
    /// The last value counts (the one a proxy that appends wrote).
    Last,
}

impl OnDuplicate {
    /// `"refuse"`, `"first"` or `"last"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnDuplicate::Refuse => "refuse",
            OnDuplicate::First => "first",
            OnDuplicate::Last => "last",
        }
    }

    /// What a key source's description adds: `" (once)"` when a second value means no key.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            OnDuplicate::Refuse => " (once)",
            OnDuplicate::First | OnDuplicate::Last => "",
        }
    }

    /// The one value of `values` that counts, or `None`.
    pub(crate) fn pick<T>(self, mut values: impl Iterator<Item = T>) -> Option<T> {
        match self {
            OnDuplicate::Refuse => {
                let first = values.next()?;
                values.next().is_none().then_some(first)
            }
            OnDuplicate::First => values.next(),
            OnDuplicate::Last => values.last(),
        }
    }
}

impl std::str::FromStr for OnDuplicate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "refuse" => Ok(OnDuplicate::Refuse),
            "first" => Ok(OnDuplicate::First),
            "last" => Ok(OnDuplicate::Last),
            _ => Err(format!(
                "on_duplicate {s:?} is not \"refuse\", \"first\" or \"last\""
            )),
        }
    }
}

/// Turns a request into the [`Key`] it counts against, or `None` when it carries none.
///
/// Implemented by the built-in extractors for every body type, by `Arc<dyn KeyExtractor<B>>`, and by
/// every closure `Fn(&Request<B>) -> Option<K>` with `K: Into<Key>`:
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{Key, KeyExtractor};
///
/// // A key per tenant, from the first path segment of /t/{tenant}/...
/// let tenant = |req: &Request<()>| {
///     let mut parts = req.uri().path().split('/').skip(1);
///     (parts.next() == Some("t")).then(|| parts.next()).flatten().map(str::to_owned)
/// };
/// let req = Request::get("/t/acme/orders").body(()).unwrap();
/// assert_eq!(tenant.extract(&req), Some(Key::from("acme")));
/// assert_eq!(tenant.extract(&Request::get("/health").body(()).unwrap()), None);
/// ```
pub trait KeyExtractor<B>: Send + Sync + 'static {
    /// The key of `request`, or `None`.
    fn extract(&self, request: &Request<B>) -> Option<Key>;

    /// Says what the extractor reads, for logs and error bodies ("peer IP", "header x-api-key").
    fn describe(&self) -> String {
        "a custom key extractor".to_owned()
    }
}

impl<B, F, K> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<K> + Send + Sync + 'static,
    K: Into<Key>,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        self(request).map(Into::into)
    }
}

/// A boxed key extractor, to mix extractors of different types in one table of policies.
///
/// ```
/// use std::sync::Arc;
/// use http::Request;
/// use tower_throttle::key::{BoxKeyExtractor, Header, PeerIp};
///
/// let by_ip: BoxKeyExtractor<()> = Arc::new(PeerIp::new());
/// let by_user: BoxKeyExtractor<()> = Arc::new(Header::new("x-user-id"));
/// let by_path: BoxKeyExtractor<()> = Arc::new(|r: &Request<()>| Some(r.uri().path().to_owned()));
/// # let _ = (by_ip, by_user, by_path);
/// ```
pub type BoxKeyExtractor<B> = Arc<dyn KeyExtractor<B>>;

impl<B: 'static> KeyExtractor<B> for Arc<dyn KeyExtractor<B>> {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        (**self).extract(request)
    }

    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// The TCP peer's IP address, with IPv6 addresses grouped by prefix.
///
/// Reads axum's `ConnectInfo<SocketAddr>` (feature `axum`; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`, or use `MockConnectInfo` in tests) or a
/// [`PeerAddr`] request extension (insert it yourself when serving with hyper). IPv4-mapped IPv6 peers count as their IPv4 address.
///
/// A single host usually owns a whole IPv6 /64, so by default every address in one /64 is one key;
/// otherwise one client could rotate through 2^64 addresses to escape the limit.
///
/// It never reads `Forwarded`, `X-Forwarded-For` or `X-Real-IP`: behind a reverse proxy every request
/// would come from the proxy's address, and those headers are written by the client unless a trusted
/// proxy overwrites them.
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{Key, KeyExtractor, PeerAddr, PeerIp};
///
/// let mut req = Request::new(());
/// req.extensions_mut().insert(PeerAddr("[2001:db8:1:2:aaaa::1]:443".parse().unwrap()));
/// let key = PeerIp::new().extract(&req).unwrap();
/// assert_eq!(key.to_string(), "!2001:db8:1:2::");
/// assert_eq!(PeerIp::new().with_ipv6_prefix(128).unwrap().extract(&req).unwrap().to_string(), "!2001:db8:1:2:aaaa::1");
///
/// // IPv4 clients are one key each, unless grouped by a prefix too: a /24 counts a subnet as one.
/// req.extensions_mut().insert(PeerAddr("10.1.2.200:443".parse().unwrap()));
/// assert_eq!(PeerIp::new().extract(&req).unwrap().to_string(), "!10.1.2.200");
/// assert_eq!(PeerIp::new().with_ipv4_prefix(24).unwrap().extract(&req).unwrap().to_string(), "!10.1.2.0");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIp {
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl PeerIp {
    /// The peer IP: IPv4 one key per address, IPv6 grouped by /64.
    pub const fn new() -> Self {
        PeerIp {
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }

    /// Groups IPv6 peers by the first `prefix` bits (1 to 128; 128 = one key per address).
    pub fn with_ipv6_prefix(mut self, prefix: u8) -> Result<Self, InvalidPrefix> {
        InvalidPrefix::check("ipv6_prefix", prefix, 128)?;
        self.ipv6_prefix = prefix;
        Ok(self)
    }

    /// Groups IPv4 peers by the first `prefix` bits (1 to 32; 32, the default, = one key per
    /// address; 24 counts a /24 subnet as one client, as a NAT or a rented block is).
    pub fn with_ipv4_prefix(mut self, prefix: u8) -> Result<Self, InvalidPrefix> {
        InvalidPrefix::check("ipv4_prefix", prefix, 32)?;
        self.ipv4_prefix = prefix;
        Ok(self)
    }

    /// The IPv6 prefix length.
    pub const fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// The IPv4 prefix length.
    pub const fn ipv4_prefix(&self) -> u8 {
        self.ipv4_prefix
    }

    /// The key for a peer address.
    pub fn key_for(&self, ip: IpAddr) -> Key {
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let mask = u32::MAX << (32 - u32::from(self.ipv4_prefix));
                Key::from_ip(IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask)))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX << (128 - u32::from(self.ipv6_prefix));
                Key::from_ip(IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)))
            }
        }
    }

    /// The peer's IP address: only the address is copied out of the extension, not the port.
    pub(crate) fn peer(request_extensions: &http::Extensions) -> Option<IpAddr> {
        #[cfg(feature = "axum")]
        if let Some(info) = request_extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
            return Some(info.0.ip());
        }
        #[cfg(feature = "axum")]
        if let Some(mock) =
            request_extensions.get::<axum::extract::connect_info::MockConnectInfo<SocketAddr>>()
        {
            return Some(mock.0.ip());
        }
        request_extensions.get::<PeerAddr>().map(|p| p.0.ip())
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let peer = Self::peer(request.extensions())?;
        warn_once_if_forwarded(request.headers(), peer);
        Some(self.key_for(peer))
    }

    fn describe(&self) -> String {
        format!("the peer IP address ({PEER_ADDRESS_SOURCES})")
    }
}

static WARNED_FORWARDED: AtomicBool = AtomicBool::new(false);

static FORWARDING_HEADERS: [HeaderName; 3] = [
    http::header::FORWARDED,
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-real-ip"),
];

/// Each thread looks for the forwarding headers in its first `LOOK_FIRST` requests, then in one in
/// `LOOK_EVERY`: the lookups cost 2 % of a hello-world request (BENCHMARKS.md, section 10). Behind
/// a proxy nearly every request carries one, so the warning still comes with the first requests.
const LOOK_FIRST: u32 = 1024;
const LOOK_EVERY: u32 = 64;

thread_local! {
    /// Requests keyed on their peer address by this thread (wrapping).
    static PEER_KEYED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

fn looks_at(seen: u32) -> bool {
    seen < LOOK_FIRST || seen.is_multiple_of(LOOK_EVERY)
}

/// Warns, once per process, that a request keyed on its peer address carries a forwarding header
/// (the most common misconfiguration of a rate limiter): behind a proxy every client has the
/// proxy's address, so they all share one limit. After the warning this is one atomic load.
#[inline]
fn warn_once_if_forwarded(headers: &http::HeaderMap, peer: IpAddr) {
    if WARNED_FORWARDED.load(Ordering::Relaxed) {
        return;
    }
    if looks_at(PEER_KEYED.with(|n| n.replace(n.get().wrapping_add(1)))) {
        warn_if_forwarded(headers, peer);
    }
}

/// The lookups of [`warn_once_if_forwarded`], in the requests it looks at (out of line: the
/// others pay only the check above).
#[inline(never)]
fn warn_if_forwarded(headers: &http::HeaderMap, peer: IpAddr) {
    let Some(header) = FORWARDING_HEADERS.iter().find(|h| headers.contains_key(*h)) else {
        return;
    };
    if !WARNED_FORWARDED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            header = %header,
            peer = %peer,
            "a request keyed on its peer address carries the header {header}: if this server is \
             behind a proxy or load balancer, every client has the proxy's address and shares one \
             limit; key on the client IP behind trusted proxies instead (key::ClientIp, or \
             key = \"client-ip\" with trusted_proxies). If clients reach this server directly, \
             the header is their own and rightly ignored. (Warned once per process.)"
        );
    }
}

/// Where [`PeerIp`] and [`ClientIp`](super::ClientIp) find the peer address, as the `400` answer
/// says it. A build without the `axum` feature cannot see axum's `ConnectInfo` at all, so telling
/// its user to "serve with connect info" would be wrong: it names the feature to enable instead.
pub(crate) const PEER_ADDRESS_SOURCES: &str = peer_address_sources(cfg!(feature = "axum"));

const fn peer_address_sources(axum_feature: bool) -> &'static str {
    if axum_feature {
        "serve axum with into_make_service_with_connect_info::<SocketAddr>(), or insert a \
         key::PeerAddr extension"
    } else {
        "this build of tower-throttle cannot read axum's ConnectInfo: enable its feature \
         `axum` (tower-throttle = { version = \"0.1\", features = [\"axum\"] }); \
         outside axum, insert a key::PeerAddr extension"
    }
}

/// The TCP peer's address, as a request extension, for servers without axum's `ConnectInfo`
/// (plain hyper: insert it per connection). A newtype, so that no other `SocketAddr` extension (a
/// local address, say) is mistaken for the client. Where a request has both, axum's
/// `ConnectInfo` is the one read: to name another client (one the PROXY protocol gives, say),
/// serve without connect info, or use [`ClientIp`](crate::key::ClientIp) behind trusted proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// A prefix length outside 1..=32 (IPv4) or 1..=128 (IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidPrefix {
    setting: &'static str,
    prefix: u8,
    most: u8,
}

impl InvalidPrefix {
    /// `prefix` for `setting`, if it is between 1 and `most`.
    fn check(setting: &'static str, prefix: u8, most: u8) -> Result<(), Self> {
        match (1..=most).contains(&prefix) {
            true => Ok(()),
            false => Err(InvalidPrefix {
                setting,
                prefix,
                most,
            }),
        }
    }

    /// The prefix length given.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

impl fmt::Display for InvalidPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} is not between 1 and {}",
            self.setting, self.prefix, self.most
        )
    }
}

impl std::error::Error for InvalidPrefix {}

/// The value of a request header (an API key, a user id). Missing or empty: no key.
///
/// The raw bytes are the key, so non-UTF-8 values work; values longer than
/// [`MAX_KEY_LEN`](super::MAX_KEY_LEN) are hashed. A header sent more than once is ambiguous (a
/// client can put its own `x-user-id` before the one a gateway appends): no key, so the policy's
/// [`MissingKey`](crate::policy::MissingKey) answer (`400` by default), unless
/// [`on_duplicate`](Self::on_duplicate) says which line counts.
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{Header, Key, KeyExtractor, OnDuplicate};
///
/// let twice = Request::get("/")
///     .header("x-user-id", "client-chosen")
///     .header("x-user-id", "gateway-set")
///     .body(())
///     .unwrap();
/// assert_eq!(Header::new("x-user-id").extract(&twice), None);
/// let last = Header::new("x-user-id").on_duplicate(OnDuplicate::Last);
/// assert_eq!(last.extract(&twice), Some(Key::from("gateway-set")));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    name: HeaderName,
    on_duplicate: OnDuplicate,
}

impl Header {
    /// The header called `name`, in any case (`"X-Api-Key"` is `x-api-key`).
    ///
    /// # Panics
    /// If `name` is not a valid header name; use [`Header::try_new`] for names from configuration.
    pub fn new(name: &str) -> Self {
        Self::try_new(name).unwrap_or_else(|_| panic!("{name:?} is not a valid header name"))
    }

    /// The header called `name` (in any case), or an error if it is not a valid header name.
    pub fn try_new(name: &str) -> Result<Self, http::header::InvalidHeaderName> {
        Ok(Header {
            name: HeaderName::from_bytes(name.as_bytes())?,
            on_duplicate: OnDuplicate::default(),
        })
    }

    /// What a header sent more than once means (default [`OnDuplicate::Refuse`]: no key).
    pub fn on_duplicate(mut self, on_duplicate: OnDuplicate) -> Self {
        self.on_duplicate = on_duplicate;
        self
    }

    /// The header's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl From<HeaderName> for Header {
    fn from(name: HeaderName) -> Self {
        Header {
            name,
            on_duplicate: OnDuplicate::default(),
        }
    }
}

impl<B> KeyExtractor<B> for Header {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let lines = request.headers().get_all(&self.name).iter();
        self.on_duplicate
            .pick(lines)
            .filter(|v| !v.is_empty())
            .map(Key::from)
    }

    fn describe(&self) -> String {
        format!("header {}{}", self.name, self.on_duplicate.describe())
    }
}

/// A value of type `T` in the request's extensions, put there by earlier middleware (for example the
/// authenticated user's id).
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{Extension, Key, KeyExtractor};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl From<UserId> for Key {
///     fn from(u: UserId) -> Key { Key::from(u.0) }
/// }
///
/// let mut req = Request::new(());
/// req.extensions_mut().insert(UserId(7));
/// assert_eq!(Extension::<UserId>::new().extract(&req), Some(Key::from(7u64)));
/// ```
pub struct Extension<T> {
    _type: PhantomData<fn() -> T>,
}

impl<T> Extension<T> {
    /// The extension of type `T`.
    pub const fn new() -> Self {
        Extension { _type: PhantomData }
    }
}

impl<T> Default for Extension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for Extension<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Extension<T> {}

impl<T> fmt::Debug for Extension<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Extension<{}>", std::any::type_name::<T>())
    }
}

impl<B, T> KeyExtractor<B> for Extension<T>
where
    T: Clone + Into<Key> + Send + Sync + 'static,
{
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        request.extensions().get::<T>().cloned().map(Into::into)
    }

    fn describe(&self) -> String {
        format!("the request extension {}", std::any::type_name::<T>())
    }
}

/// One key shared by every request: a limit on the whole route or service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Global;

impl<B> KeyExtractor<B> for Global {
    fn extract(&self, _: &Request<B>) -> Option<Key> {
        Some(Key::global())
    }

    fn describe(&self) -> String {
        "the global key".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::*;

    fn with_peer(addr: &str) -> Request<()> {
        let mut req = Request::new(());
        req.extensions_mut().insert(PeerAddr(addr.parse().unwrap()));
        req
    }

    #[test]
    fn ipv6_peers_in_one_prefix_share_a_key() {
        let ip = PeerIp::new();
        let a = ip.extract(&with_peer("[2001:db8:0:1::1]:1")).unwrap();
        let b = ip
            .extract(&with_peer("[2001:db8:0:1:ffff:ffff:ffff:ffff]:2"))
            .unwrap();
        let c = ip.extract(&with_peer("[2001:db8:0:2::1]:1")).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let p48 = PeerIp::new().with_ipv6_prefix(48).unwrap();
        assert_eq!(
            p48.extract(&with_peer("[2001:db8:0:1::1]:1")),
            p48.extract(&with_peer("[2001:db8:0:2::1]:1"))
        );
        assert!(PeerIp::new().with_ipv6_prefix(129).is_err());
    }

    #[test]
    fn ipv4_peers_are_grouped_by_their_prefix_and_each_family_keeps_its_own() {
        let ip = PeerIp::new().with_ipv4_prefix(24).unwrap();
        let key = |peer: &str| ip.extract(&with_peer(peer)).unwrap().to_string();
        assert_eq!(key("10.1.2.3:1"), "!10.1.2.0");
        assert_eq!(key("10.1.2.255:1"), "!10.1.2.0");
        assert_eq!(key("10.1.3.1:1"), "!10.1.3.0");
        // An IPv4-mapped IPv6 peer is the IPv4 address, grouped as one.
        assert_eq!(key("[::ffff:10.1.2.9]:1"), "!10.1.2.0");
        // The IPv6 prefix stays its own: /64 by default.
        assert_eq!(key("[2001:db8:1:2:aaaa::1]:1"), "!2001:db8:1:2::");
        let both = ip.with_ipv6_prefix(48).unwrap();
        assert_eq!((both.ipv4_prefix(), both.ipv6_prefix()), (24, 48));
        assert_eq!(
            PeerIp::new()
                .with_ipv4_prefix(1)
                .unwrap()
                .key_for("200.1.1.1".parse().unwrap())
                .to_string(),
            "!128.0.0.0"
        );
        assert_eq!(PeerIp::new().ipv4_prefix(), 32);
        let err = PeerIp::new().with_ipv4_prefix(33).unwrap_err();
        assert_eq!(err.to_string(), "ipv4_prefix 33 is not between 1 and 32");
        assert!(PeerIp::new().with_ipv4_prefix(0).is_err());
        assert_eq!(
            PeerIp::new().with_ipv6_prefix(0).unwrap_err().to_string(),
            "ipv6_prefix 0 is not between 1 and 128"
        );
    }

    #[test]
    fn forwarded_headers_are_ignored() {
        let mut req = with_peer("192.0.2.1:80");
        req.headers_mut()
            .insert("x-forwarded-for", "203.0.113.9".parse().unwrap());
        req.headers_mut()
            .insert("x-real-ip", "203.0.113.9".parse().unwrap());
        req.headers_mut()
            .insert("forwarded", "for=203.0.113.9".parse().unwrap());
        assert_eq!(
            PeerIp::new().extract(&req),
            Some(Key::from_ip("192.0.2.1".parse().unwrap()))
        );
        // No peer address: no key, whatever the headers say.
        let (parts, ()) = req.into_parts();
        let mut bare = Request::new(());
        *bare.headers_mut() = parts.headers;
        assert_eq!(PeerIp::new().extract(&bare), None);
    }

    #[test]
    fn a_missing_peer_address_names_the_axum_feature_when_it_is_off() {
        let without = peer_address_sources(false);
        assert!(without.contains("feature `axum`"), "{without}");
        assert!(without.contains(r#"features = ["axum"]"#), "{without}");
        assert!(
            !without.contains("into_make_service_with_connect_info"),
            "{without}"
        );
        let with = peer_address_sources(true);
        assert!(
            with.contains("into_make_service_with_connect_info"),
            "{with}"
        );
        assert_eq!(
            PEER_ADDRESS_SOURCES,
            peer_address_sources(cfg!(feature = "axum"))
        );
        let what = KeyExtractor::<()>::describe(&PeerIp::new());
        assert_eq!(
            what,
            format!("the peer IP address ({PEER_ADDRESS_SOURCES})")
        );
    }

    #[test]
    fn key_specs_from_each_extractor() {
        assert_eq!(KeySpec::from(PeerIp::new()), KeySpec::PeerIp(PeerIp::new()));
        assert_eq!(
            KeySpec::from(Header::new("x-user-id")),
            KeySpec::Header(Header::new("x-user-id"))
        );
        assert_eq!(KeySpec::from(Global), KeySpec::Global);
        let client = super::super::ClientIp::default();
        assert_eq!(KeySpec::from(client.clone()), KeySpec::ClientIp(client));
        // The same keys as the extractors themselves.
        let req = Request::builder()
            .header("x-user-id", "42")
            .extension(PeerAddr("192.0.2.1:80".parse().unwrap()))
            .body(())
            .unwrap();
        assert_eq!(
            KeySpec::from(Header::new("x-user-id")).extract(&req),
            Header::new("x-user-id").extract(&req)
        );
        assert_eq!(
            KeySpec::from(PeerIp::new()).extract(&req),
            PeerIp::new().extract(&req)
        );
    }

    #[test]
    fn header_keys() {
        let h = Header::new("x-api-key");
        let req = Request::builder().header("x-api-key", "").body(()).unwrap();
        assert_eq!(h.extract(&req), None);
        let req = Request::builder()
            .header("x-api-key", &b"\xffbin"[..])
            .body(())
            .unwrap();
        assert_eq!(h.extract(&req), Some(Key::from_bytes(b"\xffbin")));
        assert!(Header::try_new("bad header").is_err());
        let mixed = Header::new("X-Api-Key");
        let req = Request::builder()
            .header("x-api-key", "k")
            .body(())
            .unwrap();
        assert_eq!(mixed.extract(&req), Some(Key::from("k")));
    }

    #[test]
    fn the_forwarding_headers_are_looked_for_first_then_sampled() {
        assert!((0..LOOK_FIRST).all(looks_at));
        assert!(!looks_at(LOOK_FIRST + 1));
        assert!(looks_at(LOOK_FIRST * 2));
        let sampled = (LOOK_FIRST..LOOK_FIRST + 64 * LOOK_EVERY).filter(|&n| looks_at(n));
        assert_eq!(sampled.count(), 64);
    }
}

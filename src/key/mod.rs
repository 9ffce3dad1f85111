//! Keys and key extractors: who a request counts against.
//!
//! A [`KeyExtractor`] turns a request into a [`Key`] (or `None` when the request carries no key, which
//! the policy's [`MissingKey`](crate::MissingKey) setting then handles). Built in:
//!
//! * [`PeerIp`]: the TCP peer address (axum's `ConnectInfo<SocketAddr>` with the `axum` feature, or
//!   a [`PeerAddr`] extension), IPv6 grouped by prefix (/64 by default). It never reads
//!   `X-Forwarded-For` or `X-Real-IP`: a client can write anything there.
//! * [`ClientIp`]: the client behind proxies you trust, from their forwarding header; the peer
//!   address for everyone else.
//! * [`Header`]: a header's value, such as an API key or a user id (sent once: see [`OnDuplicate`]).
//! * [`QueryParam`], [`Cookie`], [`PathParam`]: a query parameter, a cookie, a parameter of the
//!   route (`/orgs/{org}/...`); [`Composite`]: several of these together.
//! * [`Extension`]: a value that earlier middleware (authentication) put in the request's extensions.
//! * [`Global`]: one key for every request.
//! * any closure `Fn(&Request<B>) -> Option<K>` where `K: Into<Key>`.
//!
//! ```
//! use http::Request;
//! use tower_throttle::key::{Header, Key, KeyExtractor};
//!
//! let req = Request::builder().header("x-api-key", "k-123").body(()).unwrap();
//! assert_eq!(Header::new("x-api-key").extract(&req), Some(Key::from("k-123")));
//!
//! let by_path = |req: &Request<()>| Some(req.uri().path().to_owned());
//! assert_eq!(by_path.extract(&req), Some(Key::from("/")));
//! ```
//!
//! To mix extractors of different kinds in one layer's table of policies, convert them into a
//! [`KeySpec`] (`KeySpec::from(PeerIp::new())`), or box them as [`BoxKeyExtractor`]s; [`KeySpec`]
//! shows the compiler error that asks for it.
//!
//! # A key per API client: bearer tokens and JWT claims
//!
//! **After authentication** (the usual place), key on what your authentication middleware verified
//! and put in the request's extensions, such as the JWT's `sub` claim, with [`Extension`]: a
//! client cannot choose it. One user with several tokens shares one limit.
//!
//! ```
//! use http::Request;
//! use tower_throttle::key::{Extension, Key, KeyExtractor};
//!
//! /// Inserted by your authentication layer once the token's signature checked out.
//! #[derive(Clone)]
//! struct Claims {
//!     sub: String,
//! }
//! impl From<Claims> for Key {
//!     fn from(claims: Claims) -> Key {
//!         Key::from(claims.sub)
//!     }
//! }
//!
//! let mut req = Request::new(());
//! req.extensions_mut().insert(Claims { sub: "user-7".into() });
//! assert_eq!(Extension::<Claims>::new().extract(&req), Some(Key::from("user-7")));
//! ```
//!
//! **Before authentication** (to shield the token check itself), key on the `Authorization: Bearer`
//! token with a closure, **hashed** with [`Key::hashed`]: the key is written into Redis key names
//! and may be logged, and a raw token there is a credential anyone reading Redis could replay. A
//! token that nobody has verified yet costs a client nothing to change, so a fresh made-up token is
//! a fresh key: keep a per-IP policy in front of (or stacked with) this one.
//!
//! ```
//! use http::{header::AUTHORIZATION, Request};
//! use tower_throttle::key::{Key, KeyExtractor};
//!
//! let bearer_token = |req: &Request<()>| {
//!     let value = req.headers().get(AUTHORIZATION)?.as_bytes();
//!     // The scheme is case-insensitive (RFC 9110); the token is what follows one space.
//!     let token = value.get(7..).filter(|_| value[..7].eq_ignore_ascii_case(b"bearer "))?;
//!     (!token.is_empty()).then(|| Key::hashed(token))
//! };
//!
//! let req = |auth: &str| Request::builder().header(AUTHORIZATION, auth).body(()).unwrap();
//! let key = bearer_token.extract(&req("Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig")).unwrap();
//! assert_eq!(bearer_token.extract(&req("bearer eyJhbGciOiJIUzI1NiJ9.e30.sig")), Some(key.clone()));
//! assert!(key.to_string().starts_with("#sha256:")); // never the token itself
//! assert!(!key.to_string().contains("eyJ"));
//! assert_eq!(bearer_token.extract(&req("Basic dXNlcjpwYXNz")), None); // no key: 400 by default
//! ```
//!
//! Use it as any extractor: `Policy::builder("api").key(bearer_token)`, with the request type your
//! server's (`&Request<axum::body::Body>` in axum).

mod async_key;
mod client_ip;
mod extract;
mod sources;

pub(crate) use async_key::Found;
pub use async_key::{AsyncKey, DEFAULT_ASYNC_KEY_TIMEOUT};
pub(crate) use client_ip::parse_net;
pub use client_ip::{ClientIp, ForwardedHeader, InvalidCidr, TrustedProxies, MAX_HOPS};
pub use extract::{
    BoxKeyExtractor, Extension, Global, Header, InvalidPrefix, KeyExtractor, KeySpec, PeerAddr,
    PeerIp,
};
pub use sources::{Composite, Cookie, OnDuplicate, PathParam, QueryParam, MAX_KEY_PARTS};

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sha2::{Digest as _, Sha256};

/// Keys longer than this many bytes are replaced by their SHA-256 digest, so that a hostile client
/// cannot make the limiter store (or send to Redis) arbitrarily large keys.
pub const MAX_KEY_LEN: usize = 64;

/// What a request is counted against, within one policy.
///
/// Built from strings, bytes, integers and IP addresses with `From`. Byte strings longer than
/// [`MAX_KEY_LEN`] are stored as their SHA-256 digest, which never equals a short key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Global,
    Ip(IpAddr),
    Bytes(Box<[u8]>),
    Digest(Box<[u8; 32]>),
}

impl Key {
    /// The address of an IP key (for backends that store them compactly).
    #[cfg_attr(not(feature = "memory"), allow(dead_code))]
    pub(crate) fn ip(&self) -> Option<IpAddr> {
        match self.0 {
            Repr::Ip(ip) => Some(ip),
            _ => None,
        }
    }

    /// The one key of [`Global`].
    pub const fn global() -> Self {
        Key(Repr::Global)
    }

    /// A key from arbitrary bytes (not necessarily UTF-8).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        if bytes.len() > MAX_KEY_LEN {
            Key(Repr::Digest(Box::new(Sha256::digest(bytes).into())))
        } else {
            Key(Repr::Bytes(bytes.into()))
        }
    }

    /// A key from the SHA-256 digest of `bytes`, however short: for secrets such as bearer tokens or
    /// session ids, which should not appear in Redis key names or logs. (Keys longer than
    /// [`MAX_KEY_LEN`] are hashed anyway: `Key::hashed(long) == Key::from_bytes(long)`.)
    ///
    /// ```
    /// use tower_throttle::Key;
    ///
    /// let key = Key::hashed(b"s3cret-token");
    /// assert_ne!(key, Key::from("s3cret-token"));
    /// assert!(!key.to_string().contains("s3cret"));
    /// ```
    pub fn hashed(bytes: impl AsRef<[u8]>) -> Self {
        Key(Repr::Digest(Box::new(
            Sha256::digest(bytes.as_ref()).into(),
        )))
    }

    /// An IP address key; IPv4-mapped IPv6 addresses become IPv4.
    pub fn from_ip(ip: IpAddr) -> Self {
        Key(Repr::Ip(ip.to_canonical()))
    }

    /// Writes the key as printable ASCII, unambiguously: IP addresses as text, `*` for the global key,
    /// byte strings with every byte outside `[A-Za-z0-9._~@+=/-]` percent-encoded, digests as
    /// `#sha256:<hex>`. Two different keys never render the same (a byte string never starts with `#`
    /// or `*`, which are percent-encoded, and an IP address never contains `%`), so this is
    /// suitable for building Redis keys and for logs.
    pub fn render(&self, out: &mut String) {
        use fmt::Write as _;
        match &self.0 {
            Repr::Global => out.push('*'),
            Repr::Ip(ip) => {
                // IPs render as text; the `!` prefix keeps them apart from byte strings that look
                // like an address (a header `x-user-id: 10.0.0.1` and the peer 10.0.0.1).
                out.push('!');
                let _ = write!(out, "{ip}");
            }
            Repr::Bytes(bytes) => {
                for &b in bytes.iter() {
                    if b.is_ascii_alphanumeric() || b"._~@+=/-".contains(&b) {
                        out.push(b as char);
                    } else {
                        let _ = write!(out, "%{b:02X}");
                    }
                }
            }
            Repr::Digest(d) => {
                out.push_str("#sha256:");
                for b in d.iter() {
                    let _ = write!(out, "{b:02x}");
                }
            }
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.render(&mut s);
        f.write_str(&s)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::from_bytes(s.as_bytes())
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        if s.len() > MAX_KEY_LEN {
            Key::from_bytes(s.as_bytes())
        } else {
            Key(Repr::Bytes(s.into_bytes().into_boxed_slice()))
        }
    }
}

impl From<&String> for Key {
    fn from(s: &String) -> Self {
        Key::from(s.as_str())
    }
}

impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Self {
        Key::from_bytes(b)
    }
}

impl From<Vec<u8>> for Key {
    fn from(b: Vec<u8>) -> Self {
        if b.len() > MAX_KEY_LEN {
            Key::from_bytes(&b)
        } else {
            Key(Repr::Bytes(b.into_boxed_slice()))
        }
    }
}

impl From<&http::HeaderValue> for Key {
    fn from(v: &http::HeaderValue) -> Self {
        Key::from_bytes(v.as_bytes())
    }
}

macro_rules! int_keys {
    ($($t:ty),*) => {$(
        impl From<$t> for Key {
            fn from(n: $t) -> Self {
                Key::from(n.to_string())
            }
        }
    )*};
}
int_keys!(u16, u32, u64, u128, i16, i32, i64, i128, usize);

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Key::from_ip(ip)
    }
}

impl From<Ipv4Addr> for Key {
    fn from(ip: Ipv4Addr) -> Self {
        Key::from_ip(IpAddr::V4(ip))
    }
}

impl From<Ipv6Addr> for Key {
    fn from(ip: Ipv6Addr) -> Self {
        Key::from_ip(IpAddr::V6(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(k: &Key) -> String {
        k.to_string()
    }

    #[test]
    fn renderings_are_unambiguous_and_printable() {
        let keys = [
            Key::global(),
            Key::from("*"),
            Key::from("10.0.0.1"),
            Key::from("!10.0.0.1"),
            Key::from_ip("10.0.0.1".parse().unwrap()),
            Key::from("a:b"),
            Key::from("a%3Ab"),
            Key::from_bytes(b"\xff\x00\r\n"),
            Key::from("x".repeat(MAX_KEY_LEN + 1)),
            Key::from("#sha256:00"),
            Key::from(""),
        ];
        let mut seen = std::collections::HashSet::new();
        for k in &keys {
            let r = rendered(k);
            assert!(
                r.bytes().all(|b| b.is_ascii_graphic()) || r.is_empty(),
                "{r:?}"
            );
            assert!(
                !r.contains(':') || r.starts_with("#sha256:") || r.starts_with('!'),
                "{r:?}"
            );
            assert!(seen.insert(r.clone()), "two keys render as {r:?}");
        }
    }

    #[test]
    fn long_keys_are_hashed_and_bounded() {
        let long = "u".repeat(10_000);
        let k = Key::from(long.as_str());
        assert_eq!(k, Key::from(long.clone()));
        assert_ne!(k, Key::from("u".repeat(10_001)));
        assert!(rendered(&k).len() < 80);
        let exact = "u".repeat(MAX_KEY_LEN);
        assert_eq!(rendered(&Key::from(exact.as_str())), exact);
    }

    #[test]
    fn hashed_keys_hide_the_secret_and_agree_with_long_keys() {
        let short = Key::hashed("token");
        assert_ne!(short, Key::from("token"));
        assert_eq!(short, Key::hashed(String::from("token")));
        assert!(rendered(&short).starts_with("#sha256:"));
        assert!(!rendered(&short).contains("token"));
        let long = "t".repeat(MAX_KEY_LEN + 1);
        assert_eq!(Key::hashed(&long), Key::from(long.as_str()));
    }

    #[test]
    fn ipv4_mapped_ipv6_is_ipv4() {
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(Key::from(mapped), Key::from(Ipv4Addr::new(192, 0, 2, 7)));
    }
}

//! [`Key`]: what a request counts against, bounded in length, and its conversions.

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

/// Byte strings up to this long are kept inline: extracting a key (a user id, a short token) then
/// allocates nothing, and a `Key` stays 24 bytes.
const INLINE: usize = 22;

// Every byte string has one representation (inline up to `INLINE` bytes, boxed beyond), so the
// derived `Eq` and `Hash` hold.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Global,
    Ip(IpAddr),
    /// `len` bytes, the rest zero.
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Bytes(Box<[u8]>),
    Digest(Box<[u8; 32]>),
}

impl Repr {
    fn inline(bytes: &[u8]) -> Option<Self> {
        let mut inline = [0; INLINE];
        inline.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(Repr::Inline {
            len: bytes.len() as u8,
            bytes: inline,
        })
    }
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

    /// The bytes of a byte-string key (not an address, a digest or the global key).
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Inline { len, bytes } => Some(&bytes[..usize::from(*len)]),
            Repr::Bytes(bytes) => Some(bytes),
            _ => None,
        }
    }

    /// A byte string of at most [`MAX_KEY_LEN`] bytes, keeping its buffer when it is not inline.
    fn owned(bytes: Vec<u8>) -> Self {
        Key(Repr::inline(&bytes).unwrap_or_else(|| Repr::Bytes(bytes.into_boxed_slice())))
    }

    /// The one key of [`Global`](super::Global).
    pub const fn global() -> Self {
        Key(Repr::Global)
    }

    /// A key from arbitrary bytes (not necessarily UTF-8).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        if bytes.len() > MAX_KEY_LEN {
            Key::hashed(bytes)
        } else {
            Key(Repr::inline(bytes).unwrap_or_else(|| Repr::Bytes(bytes.into())))
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
                match ip {
                    // By hand: `Display` for an address goes through the formatter, padding
                    // included, and costs ~1,000 instructions a key on every Redis decision.
                    IpAddr::V4(v4) => push_ipv4(v4.octets(), out),
                    IpAddr::V6(v6) => {
                        let _ = write!(out, "{v6}");
                    }
                }
            }
            Repr::Inline { len, bytes } => render_bytes(&bytes[..usize::from(*len)], out),
            Repr::Bytes(bytes) => render_bytes(bytes, out),
            Repr::Digest(d) => {
                out.push_str("#sha256:");
                for b in d.iter() {
                    let _ = write!(out, "{b:02x}");
                }
            }
        }
    }

    /// A hash of the key that every process computes alike: FNV-1a 64 over the key's rendering,
    /// then MurmurHash3's finaliser, whose output bits all depend on every input bit (FNV-1a's high
    /// bits barely change between `k1` and `k2`).
    pub(crate) fn stable_hash(&self) -> u64 {
        const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut rendered = String::new();
        self.render(&mut rendered);
        let mut h = FNV_OFFSET;
        for b in rendered.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }

    /// The start of a pattern of byte-string keys as [`render`](Self::render) writes keys:
    /// `prefix` as shown (the start of a rendering, `org%3Aacme%3A`), else rendered from the bytes
    /// a request carries (`org:acme:`), so that a key matches when its rendering starts with it.
    pub(crate) fn rendered_prefix(prefix: &str) -> String {
        if Key::from_rendered(prefix).is_some_and(|key| key.bytes().is_some()) {
            return prefix.to_owned();
        }
        let mut out = String::with_capacity(prefix.len());
        render_bytes(prefix.as_bytes(), &mut out);
        out
    }

    /// The key whose [`render`](Self::render)ing (and `Display`, which logs, the top list and the
    /// admin page show) is `text`, or `None` when no key renders as `text`: the inverse of
    /// `render`, so a key copied from a log or from [`top`](crate::ops::ThrottleHandle::top) can be
    /// given back as it is.
    ///
    /// ```
    /// use tower_throttle::Key;
    ///
    /// for key in [Key::from("user 42/x%"), Key::from_ip([127, 0, 0, 1].into()), Key::hashed("t")] {
    ///     assert_eq!(Key::from_rendered(&key.to_string()), Some(key));
    /// }
    /// assert_eq!(Key::from("user 42/x%").to_string(), "user%2042/x%25");
    /// assert_eq!(Key::from_rendered("user 42"), None); // a space is always percent-encoded
    /// ```
    pub fn from_rendered(text: &str) -> Option<Key> {
        if text == "*" {
            return Some(Key::global());
        }
        if let Some(ip) = text.strip_prefix('!') {
            let ip: IpAddr = ip.parse().ok()?;
            // Only the canonical spelling: an address renders one way.
            let key = Key::from_ip(ip);
            return (key.to_string() == text).then_some(key);
        }
        if let Some(hex) = text.strip_prefix("#sha256:") {
            let digits = hex.as_bytes();
            if digits.len() != 64 {
                return None;
            }
            let mut digest = [0u8; 32];
            for (byte, pair) in digest.iter_mut().zip(digits.chunks(2)) {
                *byte = hex_value(pair[0])? << 4 | hex_value(pair[1])?;
            }
            return (hex.bytes().all(|b| !b.is_ascii_uppercase()))
                .then(|| Key(Repr::Digest(Box::new(digest))));
        }
        let mut bytes = Vec::with_capacity(text.len());
        let mut rest = text.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            if b == b'%' {
                let [hi, lo, ..] = *tail else { return None };
                // `render` writes upper-case digits, and escapes only what it must.
                if hi.is_ascii_lowercase() || lo.is_ascii_lowercase() {
                    return None;
                }
                let byte = hex_value(hi)? << 4 | hex_value(lo)?;
                if is_plain(byte) {
                    return None;
                }
                bytes.push(byte);
                rest = &tail[2..];
            } else if is_plain(b) {
                bytes.push(b);
                rest = tail;
            } else {
                return None;
            }
        }
        // Longer byte strings are stored, and rendered, as their digest.
        (bytes.len() <= MAX_KEY_LEN).then(|| Key::from(bytes))
    }
}

/// A byte that [`Key::render`] writes as itself.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._~@+=/-".contains(&b)
}

fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit).to_digit(16).map(|d| d as u8)
}

/// An IPv4 address in dotted decimal, as its `Display` writes it.
fn push_ipv4(octets: [u8; 4], out: &mut String) {
    for (i, o) in octets.into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if o >= 100 {
            out.push(char::from(b'0' + o / 100));
        }
        if o >= 10 {
            out.push(char::from(b'0' + o / 10 % 10));
        }
        out.push(char::from(b'0' + o % 10));
    }
}

/// A byte string as [`Key::render`] writes it.
fn render_bytes(bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        if is_plain(b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
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

macro_rules! key_from {
    ($($t:ty => |$v:ident| $make:expr;)*) => {$(
        impl From<$t> for Key {
            fn from($v: $t) -> Self {
                $make
            }
        }
    )*};
}
key_from! {
    &str => |s| Key::from_bytes(s.as_bytes());
    &String => |s| Key::from_bytes(s.as_bytes());
    &[u8] => |b| Key::from_bytes(b);
    &http::HeaderValue => |v| Key::from_bytes(v.as_bytes());
    String => |s| Key::from(s.into_bytes());
    // Its own buffer kept, unless it is hashed.
    Vec<u8> => |b| if b.len() > MAX_KEY_LEN { Key::hashed(&b) } else { Key::owned(b) };
    IpAddr => |ip| Key::from_ip(ip);
    Ipv4Addr => |ip| Key::from_ip(IpAddr::V4(ip));
    Ipv6Addr => |ip| Key::from_ip(IpAddr::V6(ip));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(k: &Key) -> String {
        k.to_string()
    }

    #[test]
    fn every_rendering_is_printable_unambiguous_and_reads_back_as_its_key_and_nothing_else_does() {
        let mut keys = vec![
            Key::global(),
            Key::from("*"),
            Key::from(""),
            Key::from("10.0.0.1"),
            Key::from("!10.0.0.1"),
            Key::from_ip("10.0.0.1".parse().unwrap()),
            Key::from_ip("2001:db8::7".parse().unwrap()),
            Key::from_ip("::ffff:10.0.0.1".parse().unwrap()),
            Key::from("a:b"),
            Key::from("user 42/x%"),
            Key::from("a%3Ab"),
            Key::from("#sha256:00"),
            Key::from_bytes(b"\xff\x00\r\n"),
            Key::from("x".repeat(MAX_KEY_LEN)),
            Key::from("x".repeat(MAX_KEY_LEN + 1)),
            Key::hashed("secret"),
        ];
        // Every byte, alone and between plain ones; and pseudo-random byte strings.
        keys.extend((0..=255u8).map(|b| Key::from_bytes(&[b'a', b, b'z'])));
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..2_000 {
            let len = (state % 80) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            keys.push(Key::from_bytes(&bytes));
        }
        // Printable, with a colon only after `#sha256` or in an address; no two keys alike.
        let mut seen = std::collections::HashMap::new();
        for key in &keys {
            let text = key.to_string();
            assert_eq!(Key::from_rendered(&text).as_ref(), Some(key), "{text:?}");
            let printable = text.bytes().all(|b| b.is_ascii_graphic()) || text.is_empty();
            let colon =
                !text.contains(':') || text.starts_with("#sha256:") || text.starts_with('!');
            assert!(printable && colon, "{text:?}");
            let other = seen.insert(text.clone(), key);
            assert!(
                other.is_none_or(|other| other == key),
                "two keys render as {text:?}"
            );
        }
        // Texts that no key renders as.
        for text in [
            "a b",
            "%41",
            "%2a",
            "%2",
            "!10.0.0.01",
            "!::ffff:10.0.0.1",
            "!x",
            "#sha256:00",
            "a:b",
            "é",
            "**",
        ] {
            assert_eq!(Key::from_rendered(text), None, "{text:?}");
        }
        assert_eq!(
            Key::from_rendered(&format!("#sha256:{}", "AB".repeat(32))),
            None
        );
    }

    #[test]
    fn addresses_and_escapes_render_as_display_and_percent_encoding_write_them() {
        for ip in [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "10.0.0.1",
            "::1",
            "2001:db8::7",
        ] {
            let addr: IpAddr = ip.parse().unwrap();
            assert_eq!(rendered(&Key::from_ip(addr)), format!("!{addr}"));
        }
        for b in 0..=255u8 {
            let k = Key::from_bytes(&[b]);
            let expected = if b.is_ascii_alphanumeric() || b"._~@+=/-".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            };
            assert_eq!(rendered(&k), expected);
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
    fn short_and_long_byte_strings_are_one_key_however_made() {
        // Inline up to 22 bytes, boxed beyond: each length agrees across the constructors.
        for len in [0, 1, INLINE - 1, INLINE, INLINE + 1, MAX_KEY_LEN] {
            let s = "k".repeat(len);
            let key = Key::from(s.as_str());
            assert_eq!(key, Key::from(s.clone()), "{len}");
            assert_eq!(key, Key::from(s.clone().into_bytes()), "{len}");
            assert_eq!(
                key,
                Key::from(&http::HeaderValue::from_str(&s).unwrap()),
                "{len}"
            );
            assert_eq!(rendered(&key), s, "{len}");
            assert_ne!(key, Key::from("k".repeat(len + 1).as_str()), "{len}");
        }
        assert_eq!(std::mem::size_of::<Key>(), 24);
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

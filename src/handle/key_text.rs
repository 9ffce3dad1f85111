//! [`KeyFromText`]: the key an operator types, as each extractor would extract it from a request.

use std::net::IpAddr;

use http::HeaderValue;

use crate::key::{ClientIp, Composite, Global, Header, Key, KeySpec, PeerIp};

/// A key extractor that can turn the text an operator types into the [`Key`] it extracts from a
/// request, for [`ThrottleHandle::peek`](super::ThrottleHandle::peek) and
/// [`ThrottleHandle::reset`](super::ThrottleHandle::reset).
///
/// Every extractor takes a key as logs, [`ThrottleHandle::top`](super::ThrottleHandle::top) and the
/// admin page show it ([`Key::from_rendered`]: `!` before an address, other bytes
/// percent-encoded), so a key copied from any of them works as it is; and also as the request carries it: an address, a header's
/// value (`user 42`), a composite key's values joined by `|`. Where a text could be either (it
/// holds a `%` followed by two hex digits, and nothing a rendering escapes), it is read as shown.
/// Where the layer redacts keys, what they show is a pseudonym (`hmac:…`), which the handle
/// refuses: it names no key it can find again.
///
/// ```
/// use tower_throttle::ops::KeyFromText;
/// use tower_throttle::key::{Header, PeerIp};
/// use tower_throttle::Key;
///
/// assert_eq!(Header::new("x-user-id").key_from_text("alice").unwrap(), Key::from("alice"));
/// let ip: std::net::IpAddr = "2001:db8::1".parse().unwrap();
/// // IPv6 clients are grouped by /64: any address of the network names its key.
/// assert_eq!(
///     PeerIp::new().key_from_text("2001:db8::1").unwrap(),
///     PeerIp::new().key_for(ip)
/// );
/// assert!(PeerIp::new().key_from_text("alice").is_err());
/// // As the top list shows them:
/// assert_eq!(PeerIp::new().key_from_text("!127.0.0.1"), PeerIp::new().key_from_text("127.0.0.1"));
/// let user = Header::new("x-user-id");
/// assert_eq!(user.key_from_text("user%2042").unwrap(), user.key_from_text("user 42").unwrap());
/// ```
pub trait KeyFromText {
    /// The key this extractor would extract for `text`, or why `text` cannot be one.
    fn key_from_text(&self, text: &str) -> Result<Key, String>;

    /// The start of a pattern (`prefix*`) of this extractor's keys as the records keep it, as
    /// [`Key::render`] writes keys. The default, for byte strings: `prefix` as shown or as a request
    /// carries it (`org%3Aacme%3A` and `org:acme:` alike); an address's starts with `!`
    /// (`10.0.` and `!10.0.` alike).
    fn pattern_from_text(&self, prefix: &str) -> String {
        Key::rendered_prefix(prefix)
    }
}

/// The start of a pattern of addresses, as their keys render (`!10.0.`, `!2001:db8:` in lower
/// case).
fn address_pattern(prefix: &str) -> String {
    let prefix = prefix.to_ascii_lowercase();
    match prefix.starts_with('!') {
        true => prefix,
        false => format!("!{prefix}"),
    }
}

fn parse_ip(text: &str) -> Result<IpAddr, String> {
    // As the top list shows it (`!10.0.0.1`), or as typed.
    if let Some(ip) = Key::from_rendered(text).and_then(|key| key.ip()) {
        return Ok(ip);
    }
    text.trim()
        .parse()
        .map_err(|_| format!("{text:?} is not an IP address"))
}

/// The byte string of `text` as logs show it, if it is one; extractors of values (headers, query
/// parameters, cookies, route parameters) take it before the text as the request carries it.
fn shown_bytes(text: &str) -> Option<Key> {
    Key::from_rendered(text).filter(|key| key.ip().is_none() && *key != Key::global())
}

impl KeyFromText for PeerIp {
    fn key_from_text(&self, text: &str) -> Result<Key, String> {
        parse_ip(text).map(|ip| self.key_for(ip))
    }

    fn pattern_from_text(&self, prefix: &str) -> String {
        address_pattern(prefix)
    }
}

impl KeyFromText for ClientIp {
    fn key_from_text(&self, text: &str) -> Result<Key, String> {
        parse_ip(text).map(|ip| self.grouping().key_for(ip))
    }

    fn pattern_from_text(&self, prefix: &str) -> String {
        address_pattern(prefix)
    }
}

impl KeyFromText for Header {
    fn key_from_text(&self, text: &str) -> Result<Key, String> {
        if let Some(key) = shown_bytes(text) {
            return Ok(key);
        }
        // As the header's value: the same bytes, the same key.
        HeaderValue::from_str(text)
            .map(|value| Key::from(&value))
            .map_err(|_| format!("{text:?} cannot be a header value"))
    }
}

impl KeyFromText for Global {
    fn key_from_text(&self, _: &str) -> Result<Key, String> {
        Ok(Key::global())
    }
}

impl KeyFromText for KeySpec {
    fn key_from_text(&self, text: &str) -> Result<Key, String> {
        match self {
            KeySpec::PeerIp(ip) => ip.key_from_text(text),
            KeySpec::ClientIp(ip) => ip.key_from_text(text),
            KeySpec::Header(header) => header.key_from_text(text),
            KeySpec::Global => Global.key_from_text(text),
            // The value as it is after decoding: the bytes the extractor would count.
            KeySpec::Query(_) | KeySpec::Cookie(_) | KeySpec::Path(_) | KeySpec::Body(_) => {
                if text.is_empty() {
                    return Err("an empty value is no key".to_owned());
                }
                Ok(shown_bytes(text).unwrap_or_else(|| Key::from(text.as_bytes())))
            }
            KeySpec::Composite(composite) => composite.key_from_text(text),
        }
    }

    fn pattern_from_text(&self, prefix: &str) -> String {
        match self {
            KeySpec::PeerIp(_) | KeySpec::ClientIp(_) => address_pattern(prefix),
            KeySpec::Composite(composite) => composite.pattern_from_text(prefix),
            _ => Key::rendered_prefix(prefix),
        }
    }
}

/// How many parts a composite key's bytes join (`<len>:<part>;` each), if they are such a join.
fn joined_parts(mut bytes: &[u8]) -> Option<usize> {
    let mut parts = 0;
    while !bytes.is_empty() {
        let colon = bytes.iter().position(|&b| b == b':')?;
        let len: usize = std::str::from_utf8(&bytes[..colon]).ok()?.parse().ok()?;
        let rest = bytes.get(colon + 1..)?;
        if rest.get(len) != Some(&b';') {
            return None;
        }
        bytes = &rest[len + 1..];
        parts += 1;
    }
    Some(parts)
}

/// A composite key is given as logs show it, or as its parts' texts joined by `|`, one per part, in
/// order (a part whose value holds a `|` can be given only as shown).
impl KeyFromText for Composite {
    fn key_from_text(&self, text: &str) -> Result<Key, String> {
        // As shown: a rendering never holds a `|` (it is percent-encoded), and its bytes are the
        // extractor's join of exactly as many parts, or a long join's digest (`#sha256:…`).
        let joined = |key: &Key| {
            key.bytes()
                .is_none_or(|b| joined_parts(b) == Some(self.parts().len()))
        };
        if let Some(key) = shown_bytes(text).filter(joined) {
            return Ok(key);
        }
        let texts: Vec<&str> = text.split('|').collect();
        if texts.len() != self.parts().len() {
            return Err(format!(
                "{text:?}: a composite key of {} parts is given as their values joined by '|'",
                self.parts().len()
            ));
        }
        Ok(Key::from(join(self, &texts)?))
    }

    /// Whole parts (`acme|*`, joined as the extractor joins them): a part's key starts with its
    /// length, so a pattern that ends inside a part (`ac*`) matches no key.
    fn pattern_from_text(&self, prefix: &str) -> String {
        match prefix
            .strip_suffix('|')
            .map(|whole| whole.split('|').collect::<Vec<_>>())
        {
            Some(texts) if texts.len() < self.parts().len() => match join(self, &texts) {
                Ok(joined) => Key::rendered_prefix(&joined),
                Err(_) => Key::rendered_prefix(prefix),
            },
            _ => Key::rendered_prefix(prefix),
        }
    }
}

/// `composite`'s first parts' `texts` joined as it joins its parts' keys (`<len>:<key>;`).
fn join(composite: &Composite, texts: &[&str]) -> Result<String, String> {
    use std::fmt::Write as _;
    let (mut joined, mut part) = (String::new(), String::new());
    for (spec, text) in composite.parts().iter().zip(texts) {
        part.clear();
        spec.key_from_text(text)?.render(&mut part);
        let _ = write!(joined, "{}:{part};", part.len());
    }
    Ok(joined)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Header, KeyExtractor, KeySpec};

    /// A long composite key is kept as its digest, and named as logs show it.
    #[test]
    fn a_composite_key_kept_as_a_digest_is_named_as_shown() {
        let header = |name: &str| KeySpec::Header(Header::new(name));
        let composite = Composite::new([header("x-org"), header("x-user")]).unwrap();
        let request = http::Request::get("/")
            .header("x-org", "acme")
            .header("x-user", "u".repeat(60))
            .body(())
            .unwrap();
        let key = composite.extract(&request).unwrap();
        assert!(key.bytes().is_none(), "a digest: {key}");
        assert_eq!(composite.key_from_text(&key.to_string()), Ok(key));
    }
}

//! [`KeySpec`]: a built-in key extractor chosen at run time, and [`Composite`], several of them
//! together. The two hold each other, so they live together, above the extractors they choose from.

use std::fmt;

use http::Request;

use super::body::BodyField;
use super::client_ip::ClientIp;
use super::extract::{Global, Header, KeyExtractor, OnDuplicate, PeerIp};
use super::sources::{Cookie, PathParam, QueryParam};
use super::value::Key;

/// Several key sources together, such as an API key and an organization: a request has a key when
/// every part has one, and two requests share a key only when every part is equal (the parts are
/// joined with their lengths, so `("ab", "c")` and `("a", "bc")` differ). The result is bounded like
/// any key.
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{Composite, Header, Key, KeyExtractor, KeySpec, PathParam};
///
/// let per_key_and_org = Composite::new([
///     KeySpec::from(Header::new("x-api-key")),
///     KeySpec::from(PathParam::new("/orgs/{org}/repos", "org").unwrap()),
/// ])
/// .unwrap();
/// let req = |key: &str, path: &str| Request::get(path).header("x-api-key", key).body(()).unwrap();
/// let a = per_key_and_org.extract(&req("k1", "/orgs/acme/repos")).unwrap();
/// assert_eq!(per_key_and_org.extract(&req("k1", "/orgs/acme/repos")), Some(a.clone()));
/// assert_ne!(per_key_and_org.extract(&req("k1", "/orgs/other/repos")), Some(a));
/// assert_eq!(per_key_and_org.extract(&Request::get("/orgs/acme/repos").body(()).unwrap()), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Composite {
    parts: Box<[KeySpec]>,
}

/// The most parts a [`Composite`] key may have.
pub const MAX_KEY_PARTS: usize = 8;

impl Composite {
    /// The parts, in order: at least two, at most [`MAX_KEY_PARTS`], none of them composite.
    pub fn new(parts: impl IntoIterator<Item = KeySpec>) -> Result<Self, String> {
        let parts: Box<[KeySpec]> = parts.into_iter().collect();
        if parts.len() < 2 {
            return Err("a composite key needs at least two parts".into());
        }
        if parts.len() > MAX_KEY_PARTS {
            return Err(format!(
                "a composite key has at most {MAX_KEY_PARTS} parts, not {}",
                parts.len()
            ));
        }
        if parts.iter().any(|p| matches!(p, KeySpec::Composite(_))) {
            return Err("a composite key's parts are not composite themselves".into());
        }
        if parts.iter().any(|p| matches!(p, KeySpec::Body(_))) {
            return Err("a body key (json:, form:) cannot be part of a composite key yet".into());
        }
        Ok(Composite { parts })
    }

    /// The parts.
    pub fn parts(&self) -> &[KeySpec] {
        &self.parts
    }

    pub(crate) fn parts_mut(&mut self) -> &mut [KeySpec] {
        &mut self.parts
    }
}

impl<B> KeyExtractor<B> for Composite {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        use fmt::Write as _;
        let mut joined = String::new();
        let mut part = String::new();
        for spec in self.parts.iter() {
            part.clear();
            KeyExtractor::<B>::extract(spec, request)?.render(&mut part);
            // Length-prefixed: no part's text can run into the next one's.
            let _ = write!(joined, "{}:{part};", part.len());
        }
        Some(Key::from(joined))
    }

    fn describe(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| KeyExtractor::<B>::describe(p))
            .collect();
        format!("all of: {}", parts.join("; "))
    }
}

impl fmt::Display for Composite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{:?}", part.to_string())?;
        }
        f.write_str("]")
    }
}

/// A built-in key extractor chosen at run time, as configuration names it: `"ip"`, `"client-ip"`,
/// `"global"`, `"header:<name>"`, `"query:<name>"`, `"cookie:<name>"` or `"path:<name>"` (a
/// parameter of the policy's route), or several of these together ([`KeySpec::composite`]; an
/// array in the configuration, `key = ["header:x-api-key", "path:org"]`).
///
/// ```
/// use tower_throttle::key::KeySpec;
///
/// let key: KeySpec = "header:x-user-id".parse().unwrap();
/// assert_eq!(key.to_string(), "header:x-user-id");
/// assert_eq!("cookie:session".parse::<KeySpec>().unwrap().to_string(), "cookie:session");
/// assert!("colour:red".parse::<KeySpec>().is_err());
/// // A path parameter needs its route:
/// let org = "path:org".parse::<KeySpec>().unwrap().for_route(Some("/orgs/{org}/repos")).unwrap();
/// assert!("path:org".parse::<KeySpec>().unwrap().for_route(Some("/users/{id}")).is_err());
/// let both = KeySpec::composite(["header:x-api-key".parse().unwrap(), org]).unwrap();
/// assert_eq!(both.to_string(), r#"["header:x-api-key", "path:org"]"#);
/// ```
///
/// # Mixing key kinds in one table of policies
///
/// A layer's policies share one extractor type, so a table that keys one policy by IP and another
/// by a header does not compile:
///
/// ```compile_fail,E0308
/// use tower_throttle::key::{Header, PeerIp};
/// use tower_throttle::{Policy, Quota, ThrottleLayer};
///
/// # fn layer() -> Result<(), tower_throttle::BuildError> {
/// let per_ip = Policy::builder("ip").quota(Quota::per_second(10)).key(PeerIp::new()).build()?;
/// let per_user = Policy::builder("user").quota(Quota::per_second(5)).key(Header::new("x-user-id")).build()?;
/// let layer = ThrottleLayer::builder().policy(per_ip).policy(per_user).build()?;
/// # Ok(()) }
/// ```
///
/// Give every policy a `KeySpec` instead: each built-in extractor converts into one with `From`
/// (`KeySpec::from(PeerIp::new())`), and the keys are the extractors' own; the guide's
/// conditions example (`guide::policies`) mixes two kinds. For
/// extractors of your own (closures, [`Extension`](super::Extension)), use
/// [`BoxKeyExtractor`](super::BoxKeyExtractor) the same way.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySpec {
    /// [`PeerIp`].
    PeerIp(PeerIp),
    /// [`ClientIp`](ClientIp) (`"client-ip"`; the configuration supplies the trusted proxies).
    ClientIp(ClientIp),
    /// [`Header`].
    Header(Header),
    /// [`Global`].
    Global,
    /// [`QueryParam`] (`"query:<name>"`).
    Query(QueryParam),
    /// [`Cookie`] (`"cookie:<name>"`).
    Cookie(Cookie),
    /// [`PathParam`] (`"path:<name>"`; see [`KeySpec::for_route`]).
    Path(PathParam),
    /// [`Composite`] (an array of the others).
    Composite(Composite),
    /// A field of the request body (`"json:<path>"`, `"form:<name>"`), which only the extended
    /// path reads: [`PolicyBuilder::body_key`](crate::PolicyBuilder::body_key) sets it. As a plain
    /// extractor (without `body_key`) it finds no key.
    Body(BodyField),
}

impl KeySpec {
    /// Several sources together (see [`Composite`]).
    pub fn composite(parts: impl IntoIterator<Item = KeySpec>) -> Result<Self, String> {
        Composite::new(parts).map(KeySpec::Composite)
    }

    /// Binds `path:` parameters to the policy's route `pattern`: an error if there is no route or it
    /// has no such parameter. Other keys are returned as they are.
    pub fn for_route(self, pattern: Option<&str>) -> Result<Self, String> {
        match self {
            KeySpec::Path(param) => match pattern {
                Some(pattern) => param.bind(pattern).map(KeySpec::Path),
                None => Err(format!(
                    "key path:{0} needs the route's path, with a parameter {{{0}}}",
                    param.name()
                )),
            },
            KeySpec::Composite(mut composite) => {
                for part in composite.parts_mut() {
                    let unbound = std::mem::replace(part, KeySpec::Global);
                    *part = unbound.for_route(pattern)?;
                }
                Ok(KeySpec::Composite(composite))
            }
            other => Ok(other),
        }
    }

    /// Sets what a value sent twice means for every header, query parameter and cookie source.
    pub fn with_on_duplicate(self, on_duplicate: OnDuplicate) -> Self {
        match self {
            KeySpec::Header(h) => KeySpec::Header(h.on_duplicate(on_duplicate)),
            KeySpec::Query(q) => KeySpec::Query(q.on_duplicate(on_duplicate)),
            KeySpec::Cookie(c) => KeySpec::Cookie(c.on_duplicate(on_duplicate)),
            KeySpec::Composite(mut composite) => {
                for part in composite.parts_mut() {
                    let old = std::mem::replace(part, KeySpec::Global);
                    *part = old.with_on_duplicate(on_duplicate);
                }
                KeySpec::Composite(composite)
            }
            other => other,
        }
    }
}

/// A name for a `query:`, `cookie:` or `path:` key: not empty, printable, no separators.
fn source_name<'a>(spec: &str, name: &'a str) -> Result<&'a str, String> {
    if name.is_empty()
        || name.len() > 256
        || !name.bytes().all(|b| b.is_ascii_graphic())
        || name.contains([';', '=', '&', ',', '"', '{', '}'])
    {
        return Err(format!(
            "key {spec:?}: {name:?} is not a valid name (printable ASCII, no ; = & , \" {{ }})"
        ));
    }
    Ok(name)
}

impl std::str::FromStr for KeySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ip" => Ok(KeySpec::PeerIp(PeerIp::new())),
            "client-ip" => Ok(KeySpec::ClientIp(ClientIp::default())),
            "global" => Ok(KeySpec::Global),
            _ => match s.split_once(':') {
                Some(("header", name)) => Header::try_new(name)
                    .map(KeySpec::Header)
                    .map_err(|_| format!("key {s:?}: {name:?} is not a valid header name")),
                Some(("query", name)) => Ok(KeySpec::Query(QueryParam::new(source_name(s, name)?))),
                Some(("cookie", name)) => Ok(KeySpec::Cookie(Cookie::new(source_name(s, name)?))),
                Some(("path", name)) => {
                    Ok(KeySpec::Path(PathParam::unbound(source_name(s, name)?)))
                }
                Some(("json" | "form", _)) => s.parse().map(KeySpec::Body),
                _ => Err(format!(
                    "key {s:?} is not one of \"ip\", \"client-ip\", \"global\", \"header:<name>\", \
                     \"query:<name>\", \"cookie:<name>\", \"path:<name>\", \"json:<path>\", \
                     \"form:<name>\""
                )),
            },
        }
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySpec::PeerIp(_) => f.write_str("ip"),
            KeySpec::ClientIp(_) => f.write_str("client-ip"),
            KeySpec::Header(h) => write!(f, "header:{}", h.name()),
            KeySpec::Global => f.write_str("global"),
            KeySpec::Query(q) => write!(f, "query:{}", q.name()),
            KeySpec::Cookie(c) => write!(f, "cookie:{}", c.name()),
            KeySpec::Path(p) => write!(f, "path:{}", p.name()),
            KeySpec::Composite(c) => fmt::Display::fmt(c, f),
            KeySpec::Body(field) => fmt::Display::fmt(field, f),
        }
    }
}

macro_rules! spec_of {
    ($($source:ty => $variant:ident),* $(,)?) => {$(
        impl From<$source> for KeySpec {
            fn from(source: $source) -> Self {
                KeySpec::$variant(source)
            }
        }
    )*};
}

spec_of! {
    QueryParam => Query,
    Cookie => Cookie,
    PathParam => Path,
    Composite => Composite,
    PeerIp => PeerIp,
    ClientIp => ClientIp,
    Header => Header,
    BodyField => Body,
}

impl From<Global> for KeySpec {
    fn from(_: Global) -> Self {
        KeySpec::Global
    }
}

impl<B> KeyExtractor<B> for KeySpec {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        match self {
            KeySpec::PeerIp(ip) => ip.extract(request),
            KeySpec::ClientIp(ip) => ip.extract(request),
            KeySpec::Header(h) => h.extract(request),
            KeySpec::Global => Some(Key::global()),
            KeySpec::Query(q) => q.extract(request),
            KeySpec::Cookie(c) => c.extract(request),
            KeySpec::Path(p) => p.extract(request),
            KeySpec::Composite(c) => c.extract(request),
            KeySpec::Body(_) => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            KeySpec::PeerIp(ip) => KeyExtractor::<B>::describe(ip),
            KeySpec::ClientIp(ip) => KeyExtractor::<B>::describe(ip),
            KeySpec::Header(h) => KeyExtractor::<B>::describe(h),
            KeySpec::Global => KeyExtractor::<B>::describe(&Global),
            KeySpec::Query(q) => KeyExtractor::<B>::describe(q),
            KeySpec::Cookie(c) => KeyExtractor::<B>::describe(c),
            KeySpec::Path(p) => KeyExtractor::<B>::describe(p),
            KeySpec::Composite(c) => KeyExtractor::<B>::describe(c),
            KeySpec::Body(field) => field.describe(),
        }
    }
}

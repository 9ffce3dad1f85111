//! Keys from the rest of the request: a query parameter, a cookie, a path parameter of the route.
//!
//! Values are decoded as the application decodes them (query and path parameters as axum's `Query`
//! and `Path` do), so that `acme` and `ac%6De` are one key and not a way around the limit.

use http::header::COOKIE;
use http::Request;

use super::extract::{KeyExtractor, OnDuplicate};
use super::value::Key;
use crate::route::Route;

/// Percent-decodes `bytes` (`%41` is `A`; a `%` not followed by two hex digits stays as it is), and
/// with `plus_is_space` also `+` as a space (form encoding, for query strings).
pub(crate) fn percent_decode(bytes: &[u8], plus_is_space: bool) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// The raw values of the parameter `name` (compared decoded) in `query` (a URI's query, or a form
/// body: bytes, as a body may not be UTF-8), in order.
pub(crate) fn query_values<'q>(query: &'q [u8], name: &'q [u8]) -> impl Iterator<Item = &'q [u8]> {
    query.split(|b| *b == b'&').filter_map(move |pair| {
        let (n, v) = match pair.iter().position(|b| *b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &b""[..]),
        };
        // Most names need no decoding; compare the decoded name only when it has escapes.
        let matches = if n.iter().any(|b| *b == b'%' || *b == b'+') {
            percent_decode(n, true) == name
        } else {
            n == name
        };
        matches.then_some(v)
    })
}

/// The decoded value of the parameter `name` of `query` (a query string or a form body), picked as
/// `on_duplicate` says; `None` if absent or empty.
pub(crate) fn query_value(query: &[u8], name: &[u8], on_duplicate: OnDuplicate) -> Option<Vec<u8>> {
    let value = on_duplicate.pick(query_values(query, name))?;
    Some(percent_decode(value, true)).filter(|v| !v.is_empty())
}

/// A key from non-empty decoded bytes.
fn key_of(bytes: Vec<u8>) -> Option<Key> {
    (!bytes.is_empty()).then(|| Key::from(bytes))
}

/// The constructor and accessors [`QueryParam`] and [`Cookie`] share; the docs are the type's own.
macro_rules! named_source {
    ($source:ident, $new:literal, $on_duplicate:literal, $name:literal) => {
        impl $source {
            #[doc = $new]
            pub fn new(name: impl Into<String>) -> Self {
                $source {
                    name: name.into().into_boxed_str(),
                    on_duplicate: OnDuplicate::default(),
                }
            }

            #[doc = $on_duplicate]
            pub fn on_duplicate(mut self, on_duplicate: OnDuplicate) -> Self {
                self.on_duplicate = on_duplicate;
                self
            }

            #[doc = $name]
            pub fn name(&self) -> &str {
                &self.name
            }
        }
    };
}

/// A query parameter's value (`?api_key=...`), percent-decoded (`+` as a space). Missing or empty:
/// no key; sent twice: as [`OnDuplicate`] says (no key, by default).
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{Key, KeyExtractor, OnDuplicate, QueryParam};
///
/// let by_key = QueryParam::new("api_key");
/// let req = |uri: &str| Request::get(uri).body(()).unwrap();
/// assert_eq!(by_key.extract(&req("/v1?api_key=k%2D1&page=2")), Some(Key::from("k-1")));
/// assert_eq!(by_key.extract(&req("/v1?page=2")), None);
/// assert_eq!(by_key.extract(&req("/v1?api_key=a&api_key=b")), None); // ambiguous
/// let last = QueryParam::new("api_key").on_duplicate(OnDuplicate::Last);
/// assert_eq!(last.extract(&req("/v1?api_key=a&api_key=b")), Some(Key::from("b")));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryParam {
    name: Box<str>,
    on_duplicate: OnDuplicate,
}

named_source!(
    QueryParam,
    "The parameter called `name` (compared after decoding, case-sensitively).",
    "What a parameter given twice means (default [`OnDuplicate::Refuse`]).",
    "The parameter's name."
);

impl<B> KeyExtractor<B> for QueryParam {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let query = request.uri().query()?.as_bytes();
        query_value(query, self.name.as_bytes(), self.on_duplicate).map(Key::from)
    }

    fn describe(&self) -> String {
        format!(
            "query parameter {}{}",
            self.name,
            self.on_duplicate.describe()
        )
    }
}

/// A cookie's value (`Cookie: session=...`), name and value percent-decoded as cookie jars decode
/// them (axum-extra's `CookieJar`: `%73ession=RE%41L` is `session=REAL`). Missing or empty: no
/// key; two cookies of the name: as [`OnDuplicate`] says (no key, by default).
///
/// A cookie is whatever the client sends: key on one your application issued and checks (a session
/// id; hash it with a closure and [`Key::hashed`] if it is a secret), behind a per-IP policy.
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{Cookie, Key, KeyExtractor};
///
/// let by_session = Cookie::new("session");
/// let req = |cookie: &str| Request::get("/").header("cookie", cookie).body(()).unwrap();
/// assert_eq!(by_session.extract(&req("theme=dark; session=s-42")), Some(Key::from("s-42")));
/// assert_eq!(by_session.extract(&req("theme=dark")), None);
/// assert_eq!(by_session.extract(&req("session=a; session=b")), None); // ambiguous
/// // One session however it is spelled, and no way around it by spelling the name.
/// assert_eq!(by_session.extract(&req("session=s%2D42")), Some(Key::from("s-42")));
/// assert_eq!(by_session.extract(&req("session=x; %73ession=s-42")), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cookie {
    name: Box<str>,
    on_duplicate: OnDuplicate,
}

named_source!(
    Cookie,
    "The cookie called `name` (case-sensitively, as browsers send it).",
    "What two cookies of the name mean (default [`OnDuplicate::Refuse`]).",
    "The cookie's name."
);

impl<B> KeyExtractor<B> for Cookie {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let name = self.name.as_bytes();
        // HTTP/2 may split cookies over several header lines; together they are one list.
        let values = request
            .headers()
            .get_all(COOKIE)
            .iter()
            .flat_map(|line| line.as_bytes().split(|b| *b == b';'))
            .filter_map(|pair| {
                let pair = pair.trim_ascii();
                let eq = pair.iter().position(|b| *b == b'=')?;
                let sent = pair[..eq].trim_ascii();
                // Decoded only where it may be: most names are sent plain.
                let named =
                    sent == name || (sent.contains(&b'%') && percent_decode(sent, false) == name);
                named.then(|| pair[eq + 1..].trim_ascii())
            });
        let value = self.on_duplicate.pick(values)?;
        // A quoted value (RFC 6265 allows DQUOTE *cookie-octet DQUOTE) is its content.
        let value = match value {
            [b'"', inner @ .., b'"'] => inner,
            v => v,
        };
        key_of(percent_decode(value, false))
    }

    fn describe(&self) -> String {
        format!("cookie {}{}", self.name, self.on_duplicate.describe())
    }
}

/// A parameter of the policy's route (`org` in `/orgs/{org}/repos`), percent-decoded as axum's
/// `Path` decodes it: a limit per organization, per tenant, per repository.
///
/// The request path is matched against the route pattern (axum's own matcher), so the key is what
/// the handler sees; a path outside the route has no key. Under axum's `Router::nest`, a layer inside
/// the nested router sees the path without its prefix, as the route does.
///
/// ```
/// use http::Request;
/// use tower_throttle::key::{Key, KeyExtractor, PathParam};
///
/// let by_org = PathParam::new("/orgs/{org}/repos", "org").unwrap();
/// let req = |path: &str| Request::get(path).body(()).unwrap();
/// assert_eq!(by_org.extract(&req("/orgs/acme/repos")), Some(Key::from("acme")));
/// assert_eq!(by_org.extract(&req("/orgs/ac%6De/repos")), Some(Key::from("acme")));
/// assert_eq!(by_org.extract(&req("/users/7")), None);
/// assert!(PathParam::new("/orgs/{org}/repos", "team").is_err());
/// ```
#[derive(Clone, Debug)]
pub struct PathParam {
    name: Box<str>,
    /// `None` until [`KeySpec::for_route`] binds a `path:` key of the configuration to its route.
    route: Option<Route>,
}

impl PathParam {
    /// The parameter `name` of the route `pattern` (axum 0.8 syntax); an error if the pattern is
    /// not a route or has no such parameter.
    pub fn new(pattern: &str, name: &str) -> Result<Self, String> {
        PathParam::unbound(name).bind(pattern)
    }

    /// A parameter whose route is not known yet (`path:org` in a configuration).
    pub(crate) fn unbound(name: &str) -> Self {
        PathParam {
            name: name.into(),
            route: None,
        }
    }

    pub(crate) fn bind(mut self, pattern: &str) -> Result<Self, String> {
        let route = Route::parse(pattern)?;
        if !route.has_param(&self.name) {
            return Err(format!(
                "key path:{0}: route {pattern:?} has no parameter {{{0}}}",
                self.name
            ));
        }
        self.route = Some(route);
        Ok(self)
    }

    /// The parameter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The route pattern, once bound.
    pub fn route(&self) -> Option<&str> {
        self.route.as_ref().map(Route::pattern)
    }
}

impl PartialEq for PathParam {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.route() == other.route()
    }
}

impl Eq for PathParam {}

impl<B> KeyExtractor<B> for PathParam {
    fn extract(&self, request: &Request<B>) -> Option<Key> {
        let raw = self.route.as_ref()?.param(request, &self.name)?;
        key_of(percent_decode(raw.as_bytes(), false))
    }

    fn describe(&self) -> String {
        match self.route() {
            Some(route) => format!("path parameter {{{}}} of {route}", self.name),
            None => format!(
                "path parameter {{{}}} (no route: give the policy a path with it)",
                self.name
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::*;

    #[test]
    fn percent_decoding_is_total() {
        assert_eq!(percent_decode(b"a%41%zz%4", false), b"aA%zz%4");
        assert_eq!(percent_decode(b"a+b%2B", true), b"a b+");
        assert_eq!(percent_decode(b"a+b", false), b"a+b");
        assert_eq!(percent_decode(b"%", false), b"%");
        assert_eq!(percent_decode(b"%ff%00", false), b"\xff\x00");
    }

    /// What a missing-key answer says was expected, and a path parameter's route, which a reload
    /// compares (a parameter of another route is another key).
    #[test]
    fn sources_say_what_they_read() {
        let describe = |k: &dyn KeyExtractor<()>| k.describe();
        assert_eq!(
            describe(&QueryParam::new("api_key")),
            "query parameter api_key (once)"
        );
        assert_eq!(describe(&Cookie::new("session")), "cookie session (once)");
        let org = PathParam::new("/orgs/{org}", "org").unwrap();
        assert_eq!((org.name(), org.route()), ("org", Some("/orgs/{org}")));
        assert_eq!(PathParam::unbound("org").route(), None);
        assert_eq!(describe(&org), "path parameter {org} of /orgs/{org}");
        assert_eq!(org, PathParam::new("/orgs/{org}", "org").unwrap());
        assert_ne!(org, PathParam::new("/teams/{org}", "org").unwrap());
        assert_ne!(org, PathParam::unbound("org"));
    }

    #[test]
    fn duplicates_follow_the_rule() {
        let v = || ["a", "b"].into_iter();
        assert_eq!(OnDuplicate::Refuse.pick(v()), None);
        assert_eq!(OnDuplicate::First.pick(v()), Some("a"));
        assert_eq!(OnDuplicate::Last.pick(v()), Some("b"));
        assert_eq!(OnDuplicate::Refuse.pick(["a"].into_iter()), Some("a"));
        assert_eq!(OnDuplicate::Refuse.pick(std::iter::empty::<&str>()), None);
    }

    #[test]
    fn hostile_values_never_panic_and_stay_bounded() {
        let q = QueryParam::new("k");
        let huge = format!("/?k={}", "%41".repeat(20_000));
        let key = KeyExtractor::<()>::extract(&q, &Request::get(&huge).body(()).unwrap()).unwrap();
        assert!(key.to_string().len() < 80);
        for uri in ["/?k", "/?k=", "/?=&&=", "/?k=%", "/?k=%e2%82", "/?%6B=v"] {
            let _ = KeyExtractor::<()>::extract(&q, &Request::get(uri).body(()).unwrap());
        }
        assert_eq!(
            KeyExtractor::<()>::extract(&q, &Request::get("/?%6B=v").body(()).unwrap()),
            Some(Key::from("v"))
        );
        let c = Cookie::new("s");
        for cookie in [
            &b"s"[..],
            b"=",
            b";;;",
            b"s=\"",
            b"s=\"\"",
            b"\xff=\xff; s=\xfe",
        ] {
            let req = Request::get("/")
                .header("cookie", http::HeaderValue::from_bytes(cookie).unwrap())
                .body(())
                .unwrap();
            let _ = KeyExtractor::<()>::extract(&c, &req);
        }
    }

    #[test]
    fn composite_parts_cannot_run_into_each_other() {
        let c = Composite::new([
            KeySpec::from(QueryParam::new("a")),
            KeySpec::from(QueryParam::new("b")),
        ])
        .unwrap();
        let key = |uri: &str| KeyExtractor::<()>::extract(&c, &Request::get(uri).body(()).unwrap());
        assert_ne!(key("/?a=ab&b=c"), key("/?a=a&b=bc"));
        assert_ne!(key("/?a=a%3B1:&b=c"), key("/?a=a&b=1:c"));
        assert_eq!(key("/?a=1"), None);
        assert!(Composite::new([KeySpec::Global]).is_err());
        assert!(Composite::new(vec![KeySpec::Global; MAX_KEY_PARTS + 1]).is_err());
    }
}

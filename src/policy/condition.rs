//! [`Condition`]: what a request must carry for a policy to apply to it, besides its route and
//! methods — a header, the host, a query parameter ([`PolicyBuilder::when`]).
//!
//! Values are compared as the application reads them (query parameters percent-decoded, hosts
//! without their port and in any case). Where a request says a thing twice, the condition holds if
//! any of the values matches: a client cannot step out of a limit by adding a second value.
//!
//! [`PolicyBuilder::when`]: crate::PolicyBuilder::when

use std::net::Ipv6Addr;

use http::header::{HeaderName, HOST};
use http::{HeaderMap, HeaderValue, Uri};

use crate::key::{percent_decode, query_values};

/// A condition a request must meet for a policy to apply to it ([`PolicyBuilder::when`]): a
/// header present or equal to a value, the host, a query parameter present or equal to a value.
/// A policy applies when the request matches its route, its methods and every condition; a
/// request that matches no policy passes unlimited. A policy without conditions pays nothing
/// for them.
///
/// An invalid condition (a header name that is not one, an empty list of values) is an error when
/// the policy is built.
///
/// ```
/// use tower_throttle::{key::PeerIp, policy::Condition, Policy, Quota};
///
/// let mobile = Policy::builder("mobile")
///     .quota(Quota::per_minute(60))
///     .key(PeerIp::new())
///     .when(Condition::header("x-client", "mobile"))
///     .when(Condition::host("*.example.com"))
///     .when(Condition::query_present("plan"))
///     .build()
///     .unwrap();
/// let request = |uri: &str, client: &str| {
///     http::Request::get(uri).header("x-client", client).body(()).unwrap()
/// };
/// assert!(mobile.applies_to(&request("http://api.example.com/?plan=free", "mobile")));
/// assert!(!mobile.applies_to(&request("http://api.example.com/?plan=free", "desktop")));
/// assert!(!mobile.applies_to(&request("http://example.com/?plan=free", "mobile")));
/// assert!(!mobile.applies_to(&request("http://api.example.com/", "mobile")));
///
/// let err = Policy::builder("bad")
///     .quota(Quota::per_minute(60))
///     .key(PeerIp::new())
///     .when(Condition::header("x client", "mobile"))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.to_string(), r#"policy "bad": when: "x client" is not a valid header name"#);
/// ```
///
/// [`PolicyBuilder::when`]: crate::PolicyBuilder::when
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition(Result<Rule, String>);

/// A condition as the policy checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    Header(HeaderName, Values),
    /// Any of these hosts: lowercase, `*.example.com` as `Suffix(".example.com")`.
    Host(Box<[HostPattern]>),
    /// The parameter's decoded name, and its decoded values.
    Query(Box<[u8]>, Values),
}

/// What a header or query parameter must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Values {
    Present,
    OneOf(Box<[Box<[u8]>]>),
}

/// One host a condition admits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HostPattern {
    Exact(Box<str>),
    /// An IPv6 literal (`[::1]` or `::1`): any spelling of the same address (`[0:0::1]`).
    V6(Ipv6Addr),
    /// `*.example.com`: any host ending in `.example.com` (not `example.com` itself).
    Suffix(Box<str>),
}

impl Condition {
    /// The header `name` is present with the value `value` (exactly).
    pub fn header(name: &str, value: impl Into<String>) -> Condition {
        Condition::header_in(name, [value])
    }

    /// The header `name` is present with one of `values`.
    pub fn header_in<V: Into<String>>(
        name: &str,
        values: impl IntoIterator<Item = V>,
    ) -> Condition {
        Condition(header_name(name).and_then(|name| Ok(Rule::Header(name, one_of(values)?))))
    }

    /// The header `name` is present, with any value.
    pub fn header_present(name: &str) -> Condition {
        Condition(header_name(name).map(|name| Rule::Header(name, Values::Present)))
    }

    /// The request's host (its URI's authority or any `Host` header, either of which an application
    /// may route by; without the port, in any case) is `pattern`: a host name such as `api.example.com`, `*.example.com` for every
    /// host under `example.com`, or an IP address (`127.0.0.1`; IPv6 as `[::1]` or `::1`, any
    /// spelling of the same address).
    pub fn host(pattern: &str) -> Condition {
        Condition::host_in([pattern])
    }

    /// The request's host is one of `patterns` (see [`host`](Self::host)).
    pub fn host_in<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Condition {
        let patterns: Result<Box<[HostPattern]>, String> =
            patterns.into_iter().map(host_pattern).collect();
        Condition(patterns.and_then(|patterns| match patterns.is_empty() {
            true => Err("a host condition needs at least one host".into()),
            false => Ok(Rule::Host(patterns)),
        }))
    }

    /// The query parameter `name` is present with the value `value`: the request's name and value
    /// are percent-decoded (`+` as a space) before they are compared with these, which are taken
    /// as written (`Condition::query("plan", "free plan")` matches `?plan=free%20plan`).
    pub fn query(name: &str, value: impl Into<String>) -> Condition {
        Condition::query_in(name, [value])
    }

    /// The query parameter `name` is present with one of `values`.
    pub fn query_in<V: Into<String>>(name: &str, values: impl IntoIterator<Item = V>) -> Condition {
        Condition(query_name(name).and_then(|name| Ok(Rule::Query(name, one_of(values)?))))
    }

    /// The query parameter `name` is present, with any value (`?plan` counts).
    pub fn query_present(name: &str) -> Condition {
        Condition(query_name(name).map(|name| Rule::Query(name, Values::Present)))
    }

    /// The condition as the policy checks it, or why it cannot be checked.
    pub(crate) fn into_rule(self) -> Result<Rule, String> {
        self.0
    }
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::try_from(name).map_err(|_| format!("{name:?} is not a valid header name"))
}

fn query_name(name: &str) -> Result<Box<[u8]>, String> {
    match name.is_empty() {
        true => Err("a query condition needs a parameter name".into()),
        false => Ok(name.as_bytes().into()),
    }
}

fn one_of<V: Into<String>>(values: impl IntoIterator<Item = V>) -> Result<Values, String> {
    let values: Box<[Box<[u8]>]> = values
        .into_iter()
        .map(|v| v.into().into_bytes().into_boxed_slice())
        .collect();
    match values.is_empty() {
        true => Err("a condition needs at least one value".into()),
        false => Ok(Values::OneOf(values)),
    }
}

fn host_pattern(pattern: &str) -> Result<HostPattern, String> {
    if let Some(address) = ipv6_literal(pattern) {
        return Ok(HostPattern::V6(address));
    }
    let lower = pattern.trim_end_matches('.').to_ascii_lowercase();
    let (suffix, name) = match lower.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, lower.as_str()),
    };
    let valid = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !valid {
        return Err(format!(
            "{pattern:?} is not a host name (such as \"api.example.com\") or a wildcard (\"*.example.com\")"
        ));
    }
    Ok(match suffix {
        true => HostPattern::Suffix(format!(".{name}").into()),
        false => HostPattern::Exact(name.into()),
    })
}

impl Rule {
    pub(crate) fn holds(&self, uri: &Uri, headers: &HeaderMap) -> bool {
        match self {
            Rule::Header(name, values) => {
                values.met_by(headers.get_all(name).iter().map(HeaderValue::as_bytes))
            }
            // The URI's authority or any `Host` header: the application may route by either, so
            // a client cannot step out of the limit by sending them different.
            Rule::Host(patterns) => hosts_of(uri, headers).any(|host| {
                patterns.iter().any(|pattern| match pattern {
                    HostPattern::Exact(exact) => host.eq_ignore_ascii_case(exact),
                    HostPattern::V6(address) => ipv6_literal(host) == Some(*address),
                    HostPattern::Suffix(suffix) => {
                        host.len() > suffix.len()
                            && host.is_char_boundary(host.len() - suffix.len())
                            && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                    }
                })
            }),
            Rule::Query(name, values) => uri.query().is_some_and(|query| {
                let mut sent = query_values(query.as_bytes(), name);
                match values {
                    // Present with any value: nothing to decode.
                    Values::Present => sent.next().is_some(),
                    Values::OneOf(_) => values.met_by(sent.map(|v| percent_decode(v, true))),
                }
            }),
        }
    }
}

impl Values {
    /// Whether any of `sent` (a header's lines, a parameter's decoded values) is one of these.
    fn met_by<V: AsRef<[u8]>>(&self, mut sent: impl Iterator<Item = V>) -> bool {
        match self {
            Values::Present => sent.next().is_some(),
            Values::OneOf(wanted) => sent.any(|v| wanted.iter().any(|w| **w == *v.as_ref())),
        }
    }
}

/// The IPv6 address `text` names, bracketed (as a host is sent) or not.
fn ipv6_literal(text: &str) -> Option<Ipv6Addr> {
    let inner = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
    inner.unwrap_or(text).parse().ok()
}

/// The request's hosts without their port (and a trailing dot): its URI's authority (HTTP/2, or an
/// absolute-form request) and each `Host` header.
fn hosts_of<'r>(uri: &'r Uri, headers: &'r HeaderMap) -> impl Iterator<Item = &'r str> {
    let from_headers = headers
        .get_all(HOST)
        .iter()
        .filter_map(|value: &HeaderValue| {
            let text = value.to_str().ok()?;
            // `[::1]:8080` keeps its brackets; `example.com:8080` loses its port.
            Some(match text.rsplit_once(':') {
                Some((host, port))
                    if !host.is_empty()
                        && port.bytes().all(|b| b.is_ascii_digit())
                        && !text.ends_with(']') =>
                {
                    host
                }
                _ => text,
            })
        });
    uri.host()
        .into_iter()
        .chain(from_headers)
        .map(|host| host.strip_suffix('.').unwrap_or(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds(condition: Condition, uri: &str, headers: &[(&str, &str)]) -> bool {
        let uri: Uri = uri.parse().unwrap();
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(HeaderName::try_from(*name).unwrap(), value.parse().unwrap());
        }
        condition.into_rule().unwrap().holds(&uri, &map)
    }

    /// Whether `condition` holds for a request to `/` whose `Host` is `host`.
    fn host_is(condition: &Condition, host: &str) -> bool {
        holds(condition.clone(), "/", &[("host", host)])
    }

    #[test]
    fn headers_match_by_value_and_any_of_a_repeated_header() {
        let mobile = || Condition::header("x-client", "mobile");
        assert!(holds(mobile(), "/", &[("x-client", "mobile")]));
        assert!(!holds(mobile(), "/", &[("x-client", "Mobile")]));
        assert!(!holds(mobile(), "/", &[]));
        // A second value does not take a request out of the limit.
        let twice = [("x-client", "web"), ("x-client", "mobile")];
        assert!(holds(mobile(), "/", &twice));
        let either = || Condition::header_in("x-client", ["mobile", "tablet"]);
        assert!(holds(either(), "/", &[("x-client", "tablet")]));
        assert!(!holds(either(), "/", &[("x-client", "web")]));
        let present = |name| Condition::header_present(name);
        assert!(holds(present("X-Client"), "/", &[("x-client", "")]));
        assert!(!holds(present("x-client"), "/", &[("x-other", "1")]));
    }

    #[test]
    fn hosts_match_without_port_in_any_case_and_wildcards_need_a_label() {
        let api = Condition::host("API.example.com");
        let any = Condition::host("*.example.com");
        let both = Condition::host_in(["a.org", "*.b.org"]);
        let a = Condition::host("a.org");
        for (condition, host, want) in [
            (&api, "api.example.com", true),
            (&api, "Api.Example.Com:8443", true),
            (&api, "example.com", false),
            (&any, "a.example.com", true),
            (&any, "a.b.EXAMPLE.com:80", true),
            (&any, "example.com", false),
            (&any, "badexample.com", false),
            (&both, "a.org", true),
            (&both, "x.b.org", true),
            (&both, "b.org", false),
            (&a, "[::1]:80", false),
        ] {
            assert_eq!(host_is(condition, host), want, "{condition:?} {host}");
        }
        assert!(holds(api.clone(), "http://api.example.com./x", &[]));
        let other_header = [("host", "other.org")];
        assert!(holds(
            api.clone(),
            "https://api.example.com:443/x",
            &other_header
        ));
        assert!(!holds(api, "/", &[]));
    }

    #[test]
    fn a_port_is_dropped_only_when_it_is_digits_and_an_ipv6_literal_keeps_its_brackets() {
        let hosts = |values: &[&str]| {
            let uri = Uri::from_static("/");
            let mut map = HeaderMap::new();
            for value in values {
                map.append(HOST, HeaderValue::from_str(value).unwrap());
            }
            hosts_of(&uri, &map).map(str::to_owned).collect::<Vec<_>>()
        };
        assert_eq!(hosts(&["a.org:8080"]), ["a.org"]);
        assert_eq!(hosts(&["a.org."]), ["a.org"]);
        assert_eq!(hosts(&["a.org.:80"]), ["a.org"]);
        assert_eq!(hosts(&["[::1]:8080"]), ["[::1]"]);
        assert_eq!(hosts(&["[::1]"]), ["[::1]"]);
        assert_eq!(hosts(&["[2001:db8::1]"]), ["[2001:db8::1]"]);
        // Not a port: the value stays whole (and matches no host name).
        assert_eq!(hosts(&["a.org:http"]), ["a.org:http"]);
        assert_eq!(hosts(&[":8080"]), [":8080"]);
        assert_eq!(hosts(&["a.org", "b.org:1"]), ["a.org", "b.org"]);
        let uri = Uri::from_static("http://[::1]:8080/x");
        let none = HeaderMap::new();
        assert_eq!(hosts_of(&uri, &none).collect::<Vec<_>>(), ["[::1]"]);

        let a = Condition::host("a.org");
        assert!(host_is(&a, "a.org:443"));
        assert!(!host_is(&a, "a.org:http"));
        assert!(!host_is(&a, "a.org:4a"));
        assert!(!host_is(&Condition::host("*.a.org"), "x.a.org:x1"));
    }

    #[test]
    fn an_ip_literal_names_its_address_in_any_spelling() {
        let loopback = Condition::host("[::1]");
        let bare = Condition::host_in(["2001:DB8::1"]);
        let v4 = Condition::host("127.0.0.1");
        for (condition, host, want) in [
            (&loopback, "[::1]", true),
            (&loopback, "[::1]:8080", true),
            (&loopback, "[0:0::1]:80", true),
            (&loopback, "[::2]", false),
            // Not bracketed, a Host header's text is not an IPv6 host (a port would be ambiguous).
            (&loopback, "::1", false),
            (&loopback, "localhost", false),
            (&bare, "[2001:db8:0::1]", true),
            (&bare, "[2001:db8::2]:443", false),
            (&v4, "127.0.0.1:8080", true),
            (&v4, "127.0.0.2", false),
            (&v4, "[::ffff:127.0.0.1]", false),
        ] {
            assert_eq!(host_is(condition, host), want, "{condition:?} {host}");
        }
        assert!(holds(loopback.clone(), "http://[0::1]:8080/x", &[]));
        assert!(Condition::host("[::1").into_rule().is_err());
        assert!(Condition::host("[]").into_rule().is_err());
    }

    #[test]
    fn a_wildcard_needs_a_label_before_its_suffix_and_hosts_are_ascii() {
        let any = Condition::host("*.example.com");
        // The suffix alone, leading dot included, is not under it.
        assert!(!host_is(&any, ".example.com"));
        assert!(!host_is(&any, ".example.com:80"));
        assert!(host_is(&any, "x.example.com"));
        assert!(!host_is(&any, "com"));
        // A host that is not ASCII never reaches the comparison: the URI refuses it, and a `Host`
        // header with such bytes is not text (it matches no pattern, and nothing panics).
        assert!("http://\u{e9}.example.com/".parse::<Uri>().is_err());
        assert!(!holds(any.clone(), "/", &[]));
        let mut map = HeaderMap::new();
        let not_ascii = "\u{e9}\u{e9}.example.com".as_bytes();
        map.append(HOST, HeaderValue::from_bytes(not_ascii).unwrap());
        let rule = any.into_rule().unwrap();
        assert!(!rule.holds(&Uri::from_static("/"), &map));
    }

    #[test]
    fn query_parameters_match_decoded_and_any_of_a_repeated_one() {
        let free = || Condition::query("plan", "free plan");
        assert!(holds(free(), "/?plan=free+plan", &[]));
        assert!(holds(free(), "/?a=1&pl%61n=free%20plan", &[]));
        assert!(holds(free(), "/?plan=paid&plan=free+plan", &[]));
        assert!(!holds(free(), "/?plan=paid", &[]));
        assert!(!holds(free(), "/?planx=free+plan", &[]));
        assert!(!holds(free(), "/", &[]));
        let plan = || Condition::query_present("plan");
        assert!(holds(plan(), "/?plan", &[]));
        assert!(holds(plan(), "/?x=1&plan=", &[]));
        assert!(!holds(plan(), "/?x=plan", &[]));
        let a_or_b = Condition::query_in("plan", ["a", "b"]);
        assert!(holds(a_or_b, "/?plan=b", &[]));
    }

    #[test]
    fn a_name_of_pluses_alone_is_decoded_too() {
        // `+` is a space in a query (as axum's `Query` reads it), even when the name has nothing
        // else: the shortcut that skips decoding must not skip it.
        assert!(holds(Condition::query(" ", "1"), "/?+=1", &[]));
        assert!(holds(Condition::query_present("  "), "/?a=1&++", &[]));
        assert!(!holds(Condition::query_present("+"), "/?+=1", &[]));
        // A `%` without two hex digits after it stays as it is.
        assert!(holds(Condition::query_present("%"), "/?%=1", &[]));
    }

    #[test]
    fn invalid_conditions_say_why() {
        let why = |c: Condition| c.into_rule().unwrap_err();
        for (condition, says) in [
            (
                Condition::header("a b", "x"),
                "\"a b\" is not a valid header name",
            ),
            (
                Condition::header_in("a", Vec::<String>::new()),
                "a condition needs at least one value",
            ),
            (
                Condition::query_present(""),
                "a query condition needs a parameter name",
            ),
            (
                Condition::host_in([]),
                "a host condition needs at least one host",
            ),
        ] {
            assert_eq!(why(condition), says);
        }
        for host in ["*.", "a b.org", "*.*.org"] {
            assert!(
                why(Condition::host(host)).contains("is not a host name"),
                "{host}"
            );
        }
    }
}

//! The responses: `429` with `Retry-After`, and the rate-limit header fields.
//!
//! * `Retry-After` (RFC 9110) on a 429: [`Decision::retry_after`] rounded **up** to whole seconds, at
//!   least 1.
//! * `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10, as Structured Field
//!   lists) on admitted and rejected responses, unless switched off:
//!   `RateLimit-Policy: "reply";q=16;w=32` — the policy admits bursts of `q` = `max_burst + 1`
//!   requests and refills completely in `w` seconds (`emission interval × q`), and
//!   `RateLimit: "reply";r=15;t=2` — `r` requests remain, the quota is full again in `t` seconds.
//!   Several layers append several list members.
//! * `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds until full), opt in,
//!   for older clients.
//! * `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, opt in, as OpenAI sends them, for LLM
//!   clients: `requests` for a policy's first limit that is not metered, `tokens` for its
//!   [metered](crate::PolicyBuilder::metered) one (see
//!   [`openai_headers`](crate::ThrottleLayerBuilder::openai_headers)).

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use sfv::{RefBareItem, RefListSerializer};

mod openai;

use crate::decision::ceil_secs;
use crate::decision::Decision;
use crate::header_block::{self, Digits};
use crate::limit::Limit;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Structured Field integers have at most 15 digits.
const SF_INT_MAX: u64 = 999_999_999_999_999;

/// The default 429 body of a policy. It does not depend on the decision (the delay is in
/// `Retry-After`), so the middleware renders it once per policy and every rejection shares it.
pub(crate) fn limited_body(policy: &str) -> Bytes {
    problem_body(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("rate limit of policy '{policy}' exceeded; retry after the delay in Retry-After"),
    )
}

/// An RFC 9457 problem response.
pub(crate) fn problem(status: StatusCode, detail: &str) -> Response<Bytes> {
    problem_response(status, problem_body(status, detail))
}

pub(crate) fn problem_response(status: StatusCode, body: Bytes) -> Response<Bytes> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

fn problem_body(status: StatusCode, detail: &str) -> Bytes {
    let mut escaped = String::with_capacity(detail.len());
    for c in detail.chars() {
        match c {
            '"' => escaped.push_str("\\\""),
            '\\' => escaped.push_str("\\\\"),
            c if c.is_control() => escaped.push(' '),
            c => escaped.push(c),
        }
    }
    Bytes::from(format!(
        r#"{{"type":"about:blank","title":"{}","status":{},"detail":"{}"}}"#,
        status.canonical_reason().unwrap_or(""),
        status.as_u16(),
        escaped
    ))
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct HeaderOptions {
    pub(crate) ratelimit: bool,
    pub(crate) legacy: bool,
    pub(crate) openai: bool,
}

impl Default for HeaderOptions {
    fn default() -> Self {
        HeaderOptions {
            ratelimit: true,
            legacy: false,
            openai: false,
        }
    }
}

/// The header values of one decision, rendered when the decision is made.
#[derive(Debug, Default)]
pub(crate) struct RateHeaders {
    policy: Option<HeaderValue>,
    ratelimit: Option<HeaderValue>,
    legacy: Option<LegacyDigits>,
    /// Boxed: opt in, and the fields travel with every admitted request's future.
    openai: Option<Box<openai::Fields>>,
}

/// The legacy fields' three numbers (limit, remaining, reset) as one run of digits in the thread's
/// block, and where the first two end: 40 bytes where three values take 120, and the fields travel
/// (moved, so copied) with every admitted request.
#[derive(Debug)]
struct LegacyDigits {
    digits: Bytes,
    ends: [u8; 2],
}

impl LegacyDigits {
    /// The digits of `numbers` one after another (at most 60 bytes), and where the first two end.
    fn write(numbers: [u64; 3]) -> (FieldBuf, [u8; 2]) {
        let mut buf = FieldBuf::new();
        let mut ends = [0u8; 2];
        for (i, n) in numbers.into_iter().enumerate() {
            buf.push(Digits::of(n).as_bytes());
            if let Some(end) = ends.get_mut(i) {
                *end = buf.len as u8;
            }
        }
        (buf, ends)
    }

    /// The three values (`None` only if the digits were not digits: never).
    fn values(self) -> Option<[HeaderValue; 3]> {
        let [a, b] = self.ends.map(usize::from);
        let value = |part: Bytes| HeaderValue::from_maybe_shared(part).ok();
        Some([
            value(self.digits.slice(..a))?,
            value(self.digits.slice(a..b))?,
            value(self.digits.slice(b..))?,
        ])
    }
}

/// The `RateLimit-Policy` value of a policy's limits (one list member per stacked quota): rendered
/// once, when the layer is built.
pub(crate) fn policy_field(limits: &[Limit]) -> HeaderValue {
    let mut out = String::new();
    let mut list = RefListSerializer::new(&mut out);
    for limit in limits {
        // The GCRA admits bursts of `limit` and refills completely in its tolerance (without a
        // delay); a window admits `count` per period; a concurrency limit has no window.
        let (quota, window) = match (limit.tolerance(), limit.window()) {
            (Some(tolerance), _) => (limit.max_cost(), Some(tolerance)),
            (None, Some(w)) => (w.limit(), Some(w.period())),
            (None, None) => (limit.max_cost(), None),
        };
        list = list
            .bare_item(&RefBareItem::String(limit.name()))
            .and_then(|s| s.parameter("q", &RefBareItem::Integer(sf_int(quota))))
            .expect("limit names are validated printable ASCII");
        if let Some(window) = window {
            let window = ceil_secs(std::time::Duration::from_nanos(window)).max(1);
            list = list
                .parameter("w", &RefBareItem::Integer(sf_int(window)))
                .expect("an integer parameter always serializes");
        }
    }
    HeaderValue::try_from(out).expect("a structured field is a valid header value")
}

fn sf_int(n: u64) -> i64 {
    n.min(SF_INT_MAX) as i64
}

impl RateHeaders {
    /// The fields of one decision per limit (`names[i]` decided `decisions[i]`); the legacy fields
    /// show the quota of `combined`, the decision that binds (its limit and remaining).
    pub(crate) fn new(
        options: HeaderOptions,
        names: &[Arc<str>],
        policy: &HeaderValue,
        decisions: &[Decision],
        combined: &Decision,
    ) -> Self {
        let mut headers = RateHeaders::default();
        if !options.ratelimit && !options.legacy {
            return headers;
        }
        if !options.legacy {
            headers.ratelimit = match (names, decisions) {
                // One limit: the commonest answer, shared while its numbers hold.
                ([name], [decision]) => header_block::recent_or(
                    name,
                    decision.remaining,
                    decision.reset_after_secs(),
                    || ratelimit_field(names, decisions),
                ),
                _ => ratelimit_field(names, decisions),
            };
        } else {
            let mut buf = FieldBuf::new();
            let ratelimit = options
                .ratelimit
                .then(|| write_ratelimit(names, decisions, &mut buf));
            // One quota's three numbers: the binding one's, whose limit and remaining `combined`'s
            // are (its reset is the whole stack's, which may be another quota's). Looked for by
            // its numbers: a ban refuses every quota after `combined` was made.
            let same =
                |d: &&Decision| (d.limit, d.remaining) == (combined.limit, combined.remaining);
            let binding = Decision::binding(decisions.iter().filter(same)).unwrap_or(combined);
            let reset = binding.reset_after_secs();
            let (digits, ends) = LegacyDigits::write([combined.limit, combined.remaining, reset]);
            // The values of one response go into the thread's block together (header_block.rs).
            match ratelimit {
                Some(Some(field)) => {
                    let [field, digits] = header_block::shared([field, digits.written()]);
                    if let Ok(field) = HeaderValue::from_maybe_shared(field) {
                        headers.ratelimit = Some(field);
                        headers.legacy = Some(LegacyDigits { digits, ends });
                    }
                }
                ratelimit => {
                    if ratelimit.is_some() {
                        // Not written by hand (see ratelimit_field): through sfv.
                        headers.ratelimit = ratelimit_field_sfv(names, decisions);
                    }
                    let [digits] = header_block::shared([digits.written()]);
                    headers.legacy = Some(LegacyDigits { digits, ends });
                }
            }
        }
        if headers.ratelimit.is_some() {
            headers.policy = Some(policy.clone());
        }
        headers
    }

    /// Adds the OpenAI-style fields, if they are switched on (`limits[i]` decided `decisions[i]`).
    pub(crate) fn add_openai(
        &mut self,
        options: HeaderOptions,
        limits: &[Limit],
        decisions: &[Decision],
    ) {
        if options.openai {
            self.openai = Some(Box::new(openai::fields(limits, decisions)));
        }
    }

    /// Adds the fields to a response's headers. RateLimit fields are appended (each layer adds its
    /// list member); the legacy fields are set only if an inner layer has not set them.
    pub(crate) fn apply(self, map: &mut HeaderMap) {
        if self.ratelimit.is_none() && self.legacy.is_none() && self.openai.is_none() {
            return;
        }
        // Room for every field at once: one growth at most, not one per field.
        let fields =
            2 * usize::from(self.ratelimit.is_some()) + 3 * usize::from(self.legacy.is_some());
        map.reserve(fields);
        if let Some(policy) = self.policy {
            map.append(RATELIMIT_POLICY.clone(), policy);
        }
        if let Some(ratelimit) = self.ratelimit {
            map.append(RATELIMIT.clone(), ratelimit);
        }
        if let Some([limit, remaining, reset]) = self.legacy.and_then(LegacyDigits::values)
            && !map.contains_key(&X_RATELIMIT_LIMIT)
        {
            map.insert(X_RATELIMIT_LIMIT.clone(), limit);
            map.insert(X_RATELIMIT_REMAINING.clone(), remaining);
            map.insert(X_RATELIMIT_RESET.clone(), reset);
        }
        // Set only if an inner layer (an upstream's answer, proxied) has not.
        for (name, value) in self.openai.into_iter().flat_map(|f| f.0) {
            if let http::header::Entry::Vacant(entry) = map.entry(name) {
                entry.insert(value);
            }
        }
    }
}

/// The `RateLimit` value of one decision per limit, written by hand on the stack
/// ([`write_ratelimit`]) and copied once into the thread's block of values (`header_block.rs`):
/// this runs for every response, and `sfv`'s serializer costs a `String`, its validation and a
/// second allocation. A unit test checks it equals [`ratelimit_field_sfv`].
fn ratelimit_field(names: &[Arc<str>], decisions: &[Decision]) -> Option<HeaderValue> {
    let mut buf = FieldBuf::new();
    match write_ratelimit(names, decisions, &mut buf) {
        Some(bytes) => header_block::value(bytes),
        None => ratelimit_field_sfv(names, decisions),
    }
}

/// The bytes of [`ratelimit_field`] written by hand into `buf`, or `None` where only `sfv` knows
/// (a name it refuses; longer than the buffer: many stacked quotas with long names).
fn write_ratelimit<'b>(
    names: &[Arc<str>],
    decisions: &[Decision],
    buf: &'b mut FieldBuf,
) -> Option<&'b [u8]> {
    for (i, (name, decision)) in names.iter().zip(decisions).enumerate() {
        if i > 0 {
            buf.push(b", ");
        }
        buf.push(b"\"");
        for &b in name.as_bytes() {
            match b {
                b'"' | b'\\' => buf.push(&[b'\\', b]),
                0x20..=0x7e => buf.push(&[b]),
                _ => return None,
            }
        }
        buf.push(b"\";r=");
        buf.push_int(sf_int(decision.remaining));
        buf.push(b";t=");
        buf.push_int(sf_int(decision.reset_after_secs()));
    }
    buf.as_bytes()
}

/// [`ratelimit_field`] through `sfv`'s serializer.
fn ratelimit_field_sfv(names: &[Arc<str>], decisions: &[Decision]) -> Option<HeaderValue> {
    let mut out = String::with_capacity(names.len() * (names[0].len() + 24));
    let mut list = Ok(RefListSerializer::new(&mut out));
    for (name, decision) in names.iter().zip(decisions) {
        list = list
            .and_then(|s| s.bare_item(&RefBareItem::String(name)))
            .and_then(|s| s.parameter("r", &RefBareItem::Integer(sf_int(decision.remaining))))
            .and_then(|s| {
                let reset = decision.reset_after_secs();
                s.parameter("t", &RefBareItem::Integer(sf_int(reset)))
            });
    }
    list.ok()?;
    HeaderValue::try_from(out).ok()
}

/// A fixed buffer on the stack for one header value; remembers if it overflowed.
struct FieldBuf {
    bytes: [u8; 256],
    len: usize,
    overflowed: bool,
}

impl FieldBuf {
    fn new() -> Self {
        FieldBuf {
            bytes: [0; 256],
            len: 0,
            overflowed: false,
        }
    }

    fn push(&mut self, more: &[u8]) {
        match self.bytes.get_mut(self.len..self.len + more.len()) {
            Some(room) => {
                room.copy_from_slice(more);
                self.len += more.len();
            }
            None => self.overflowed = true,
        }
    }

    /// A non-negative integer in decimal (Structured Field integers here are at most 15 digits).
    fn push_int(&mut self, n: i64) {
        self.push(Digits::of(n.unsigned_abs()).as_bytes());
    }

    fn as_bytes(&self) -> Option<&[u8]> {
        (!self.overflowed).then(|| &self.bytes[..self.len])
    }

    /// What was pushed, for a buffer that cannot have overflowed (at most 256 bytes pushed).
    fn written(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// `Retry-After: seconds` (at least 1) on a refusal, unless its answer set one, or redirects: on a
/// redirection (a custom answer's `303` to a "slow down" page) it means how long to wait before
/// following it.
pub(crate) fn set_retry_after<B>(response: &mut http::Response<B>, seconds: u64) {
    if response.status().is_redirection() {
        return;
    }
    // A test, then an insertion: cheaper than one lookup through the entry API (callgrind,
    // 50 instructions a 429), and every refusal comes here.
    let map = response.headers_mut();
    if !map.contains_key(RETRY_AFTER) {
        map.insert(RETRY_AFTER, retry_after_value(seconds.max(1)));
    }
}

/// How many `Retry-After` values are made once and shared: most refusals wait seconds, not hours.
const SHARED_RETRY_AFTER: usize = 128;

/// `seconds` as a header value, shared below `SHARED_RETRY_AFTER` (a clone is a reference count).
fn retry_after_value(seconds: u64) -> HeaderValue {
    static SHARED: std::sync::LazyLock<Vec<HeaderValue>> = std::sync::LazyLock::new(|| {
        (0..SHARED_RETRY_AFTER as u64)
            .map(HeaderValue::from)
            .collect()
    });
    match usize::try_from(seconds) {
        Ok(at) if at < SHARED_RETRY_AFTER => SHARED[at].clone(),
        _ => HeaderValue::from(seconds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    use crate::refusal::{Refusal, RefusalKind};
    use std::time::Duration;

    const LEGACY_TOO: HeaderOptions = HeaderOptions {
        ratelimit: true,
        legacy: true,
        openai: false,
    };

    /// A 429 refusal of `request`, `default` the layer's answer, naming nothing else.
    fn refusal<'a>(
        request: &'a http::Request<()>,
        default: &'a dyn Fn() -> Response<Bytes>,
    ) -> Refusal<'a> {
        Refusal {
            kind: RefusalKind::Limited,
            status: StatusCode::TOO_MANY_REQUESTS,
            policy: None,
            key: None,
            decision: None,
            retry_after: None,
            detail: "",
            request: crate::observe::RequestRef::of(request),
            default,
        }
    }

    #[test]
    fn retry_after_values_are_the_seconds_shared_or_not() {
        for seconds in [0, 1, 59, 127, 128, 3_600, u64::MAX] {
            assert_eq!(retry_after_value(seconds), HeaderValue::from(seconds));
        }
        let mut response = http::Response::new(());
        set_retry_after(&mut response, 0);
        let map = response.headers();
        assert_eq!(
            map[RETRY_AFTER], "1",
            "never 0: a client would retry at once"
        );
        set_retry_after(&mut response, 30);
        assert_eq!(
            response.headers()[RETRY_AFTER],
            "1",
            "a value already there is kept"
        );
        let mut redirect = http::Response::new(());
        *redirect.status_mut() = http::StatusCode::SEE_OTHER;
        set_retry_after(&mut redirect, 30);
        assert!(!redirect.headers().contains_key(RETRY_AFTER));
    }

    #[test]
    fn refusal_labels_are_the_documented_ones() {
        let labels = [
            RefusalKind::Limited,
            RefusalKind::MissingKey,
            RefusalKind::Denied,
            RefusalKind::Unavailable,
        ]
        .map(RefusalKind::as_str);
        assert_eq!(labels, ["limited", "missing_key", "denied", "unavailable"]);
    }

    #[test]
    fn fields_are_structured_field_lists() {
        let limit = Limit::new("reply", Quota::per_minute(30).with_max_burst(15)).unwrap();
        let policy = policy_field(std::slice::from_ref(&limit));
        assert_eq!(policy, r#""reply";q=16;w=32"#);
        let d = Decision::allowed(16, 15, Duration::from_millis(2001));
        let h = RateHeaders::new(LEGACY_TOO, &["reply".into()], &policy, &[d], &d);
        let mut map = HeaderMap::new();
        h.apply(&mut map);
        assert_eq!(map[&RATELIMIT], r#""reply";r=15;t=3"#);
        let parsed = sfv::Parser::parse_list(map[&RATELIMIT].as_bytes()).unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(map[&X_RATELIMIT_LIMIT], "16");
        assert_eq!(map[&X_RATELIMIT_REMAINING], "15");
        assert_eq!(map[&X_RATELIMIT_RESET], "3");
    }

    #[test]
    fn stacked_quotas_are_list_members() {
        let policy = crate::policy::Policy::builder("api")
            .key(crate::key::PeerIp::new())
            .quotas([Quota::per_second(10), Quota::per_day(1000)])
            .build()
            .unwrap();
        let field = policy_field(policy.limits());
        assert_eq!(field, r#""api.1s";q=10;w=1, "api.1d";q=1000;w=86400"#);
        let names: Vec<Arc<str>> = policy.limits().iter().map(|l| l.name().into()).collect();
        let second = Decision::allowed(10, 9, Duration::from_millis(100));
        let day = Decision::allowed(1000, 999, Duration::from_secs(86));
        let both = Decision::combine(&[second, day]).unwrap();
        let h = RateHeaders::new(LEGACY_TOO, &names, &field, &[second, day], &both);
        let mut map = HeaderMap::new();
        h.apply(&mut map);
        assert_eq!(map[&RATELIMIT], r#""api.1s";r=9;t=1, "api.1d";r=999;t=86"#);
        assert_eq!(map[&X_RATELIMIT_REMAINING], "9");
        // The legacy three describe one quota: the per-second one's reset, not the day's.
        assert_eq!(map[&X_RATELIMIT_LIMIT], "10");
        assert_eq!(map[&X_RATELIMIT_RESET], "1");
        // Refused by the day's quota: its three numbers, whose reset is no earlier than the retry.
        let second = Decision::limited(
            10,
            0,
            Some(Duration::from_millis(400)),
            Duration::from_secs(1),
        );
        let day = Decision::limited(
            1000,
            0,
            Some(Duration::from_secs(20)),
            Duration::from_secs(86),
        );
        let both = Decision::combine(&[second, day]).unwrap();
        let h = RateHeaders::new(LEGACY_TOO, &names, &field, &[second, day], &both);
        let mut map = HeaderMap::new();
        h.apply(&mut map);
        assert_eq!(map[&X_RATELIMIT_LIMIT], "1000");
        assert_eq!(map[&X_RATELIMIT_RESET], "86");
        // The per-second quota refused and earned a ban of a minute, which refuses both: its
        // three numbers still, the ban's reset.
        let second = Decision::limited(
            10,
            0,
            Some(Duration::from_millis(400)),
            Duration::from_secs(1),
        );
        let day = Decision::allowed(1000, 0, Duration::from_secs(86));
        let combined = Decision::combine(&[second, day]).unwrap();
        let ban = Duration::from_secs(60);
        let banned =
            [second, day].map(|d| Decision::banned(d.limit, ban, d.retry_after, d.reset_after));
        let h = RateHeaders::new(LEGACY_TOO, &names, &field, &banned, &combined);
        let mut map = HeaderMap::new();
        h.apply(&mut map);
        assert_eq!(map[&X_RATELIMIT_LIMIT], "10");
        assert_eq!(map[&X_RATELIMIT_RESET], "60");
        let conn = crate::limit::Algorithm::Concurrency;
        let conn = Limit::with_algorithm("dl", conn, Quota::per_second(2)).unwrap();
        assert_eq!(policy_field(&[conn]), r#""dl";q=2"#);
        let delayed = Limit::new("d", Quota::per_second(2))
            .unwrap()
            .with_delay(Duration::from_secs(5))
            .unwrap();
        assert_eq!(
            policy_field(&[delayed]),
            r#""d";q=2;w=1"#,
            "the delay is not the window"
        );
    }

    #[test]
    fn a_json_accept_before_html_prefers_json() {
        let prefers_html = |accept: &str| {
            let request = http::Request::get("/")
                .header("accept", accept)
                .body(())
                .unwrap();
            refusal(&request, &|| Response::new(Bytes::new())).prefers_html()
        };
        // The higher quality wins, then the first named; `q=0` refuses the type.
        assert!(!prefers_html("application/problem+json, text/html"));
        assert!(prefers_html("application/json;q=0.9, text/html"));
        assert!(!prefers_html("text/html;q=0, application/json"));
        assert!(!prefers_html("text/html; Q=0"));
        assert!(prefers_html("application/json;q=0, text/html"));
        assert!(prefers_html("text/html, application/problem+json"));
        assert!(prefers_html("image/png, TEXT/HTML"));
        assert!(prefers_html(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        ));
        assert!(!prefers_html("image/png"));
    }

    #[test]
    fn ordinary_names_take_the_hand_written_ratelimit_field() {
        // The fast path (no `sfv` serializer, no allocation) is the one taken for names made of
        // printable ASCII, escapes included; only a name sfv refuses falls back.
        let d = [Decision::allowed(16, 15, Duration::from_millis(2001))];
        for name in ["api", "q\"uote\\d", "~ !"] {
            let mut buf = FieldBuf::new();
            let names = [Arc::from(name)];
            assert!(write_ratelimit(&names, &d, &mut buf).is_some(), "{name}");
        }
        let mut buf = FieldBuf::new();
        assert!(write_ratelimit(&[Arc::from("caf\u{e9}")], &d, &mut buf).is_none());
    }

    #[test]
    fn the_hand_written_ratelimit_field_is_the_sfv_one() {
        let names: Vec<Arc<str>> = ["a", "api.1s", "q\"uote\\d", &"long".repeat(40)]
            .iter()
            .map(|n| Arc::from(*n))
            .collect();
        let decisions = [
            Decision::allowed(16, 15, Duration::from_millis(2001)),
            Decision::allowed(1, 0, Duration::ZERO),
            Decision::limited(
                u64::MAX,
                u64::MAX,
                Some(Duration::from_secs(5)),
                Duration::from_secs(u64::MAX / 4),
            ),
            Decision::allowed(1000, 999, Duration::from_nanos(1)),
        ];
        for n in 1..=names.len() {
            for first in 0..decisions.len() {
                let ds: Vec<Decision> = (0..n).map(|i| decisions[(first + i) % 4]).collect();
                assert_eq!(
                    ratelimit_field(&names[..n], &ds),
                    ratelimit_field_sfv(&names[..n], &ds),
                    "{n} names from decision {first}"
                );
            }
        }
        // Past the buffer: the same value through sfv.
        let many: Vec<Arc<str>> = (0..20)
            .map(|i| Arc::from(format!("limit-{i:02}")))
            .collect();
        let ds = vec![decisions[0]; 20];
        let long = ratelimit_field(&many, &ds).unwrap();
        assert!(long.len() > 256);
        assert_eq!(Some(long), ratelimit_field_sfv(&many, &ds));
    }

    #[test]
    fn problem_bodies_are_json() {
        let r = problem(StatusCode::BAD_REQUEST, "no \"key\"\n\\");
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["status"], 400);
        assert_eq!(v["detail"], "no \"key\" \\");
    }

    #[test]
    fn a_refusal_gives_the_request_and_the_layers_answer() {
        #[derive(Clone, Debug, PartialEq)]
        struct User(&'static str);
        let mut request = http::Request::post("/search?x=1")
            .header("accept", "application/json")
            .body(())
            .unwrap();
        request.extensions_mut().insert(User("bob"));
        let key = crate::key::Key::from("alice");
        let decision = Decision::limited(5, 0, Some(Duration::from_secs(2)), Duration::ZERO);
        let default = || Response::new(Bytes::from_static(b"the layer's answer"));
        let refusal = |kind, policy| Refusal {
            kind,
            policy,
            key: Some(&key),
            decision: Some(&decision),
            retry_after: Some(Duration::from_millis(1500)),
            detail: "over the limit",
            ..refusal(&request, &default)
        };
        let limited = refusal(RefusalKind::Limited, Some("search"));
        assert_eq!(
            (limited.kind(), limited.status()),
            (RefusalKind::Limited, StatusCode::TOO_MANY_REQUESTS)
        );
        assert_eq!(
            (limited.policy(), limited.key(), limited.decision()),
            (Some("search"), Some(&key), Some(&decision))
        );
        assert_eq!(
            (limited.retry_after(), limited.detail()),
            (Some(Duration::from_millis(1500)), "over the limit")
        );
        assert_eq!(
            (limited.method(), limited.uri().query()),
            (&http::Method::POST, Some("x=1"))
        );
        assert_eq!(limited.extensions().get::<User>(), Some(&User("bob")));
        assert_eq!(limited.headers()["accept"], "application/json");
        assert!(!limited.prefers_html());
        assert_eq!(limited.default_response().body(), "the layer's answer");
        let debug = format!("{limited:?}");
        for part in [
            "Refusal",
            "Limited",
            "\"search\"",
            "over the limit",
            "/search",
        ] {
            assert!(debug.contains(part), "{part} in {debug}");
        }
        let rejected = limited.rejected().unwrap();
        assert_eq!((rejected.policy, rejected.decision), ("search", &decision));
        let response = rejected.default_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(response.body(), &limited_body("search"));
        assert!(refusal(RefusalKind::Denied, Some("search"))
            .rejected()
            .is_none());
        assert!(refusal(RefusalKind::Limited, None).rejected().is_none());
    }
}

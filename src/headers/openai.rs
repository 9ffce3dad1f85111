//! The OpenAI-style rate-limit fields that LLM clients and SDKs read, opt in with
//! [`openai_headers`](crate::ThrottleLayerBuilder::openai_headers). `remaining` is in the limit's
//! unit (0 while the key is in debt); `reset` is the time until the limit is full again.

use std::fmt::Write;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};

use crate::decision::Decision;
use crate::limit::Limit;

/// The six field names: limit, remaining, reset; for requests, then for tokens.
static NAMES: [[HeaderName; 3]; 2] = [
    [
        HeaderName::from_static("x-ratelimit-limit-requests"),
        HeaderName::from_static("x-ratelimit-remaining-requests"),
        HeaderName::from_static("x-ratelimit-reset-requests"),
    ],
    [
        HeaderName::from_static("x-ratelimit-limit-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-tokens"),
        HeaderName::from_static("x-ratelimit-reset-tokens"),
    ],
];

#[derive(Debug)]
pub(crate) struct Fields(pub(crate) Vec<(HeaderName, HeaderValue)>);

/// The fields of one decision per limit (`limits[i]` decided `decisions[i]`).
pub(crate) fn fields(limits: &[Limit], decisions: &[Decision]) -> Fields {
    let requests = limits.iter().position(|l| !l.is_metered());
    let tokens = limits.iter().position(Limit::is_metered);
    let mut out = Vec::with_capacity(6);
    for (names, at) in NAMES.iter().zip([requests, tokens]) {
        let Some(decision) = at.and_then(|i| decisions.get(i)) else {
            continue;
        };
        let [limit, remaining, reset] = names;
        out.push((limit.clone(), HeaderValue::from(decision.limit)));
        out.push((remaining.clone(), HeaderValue::from(decision.remaining)));
        let reset_value = HeaderValue::try_from(duration(decision.reset_after))
            .expect("a duration is a valid header value");
        out.push((reset.clone(), reset_value));
    }
    Fields(out)
}

/// A duration as OpenAI writes it (Go's `time.Duration` format, to the millisecond): `20ms`,
/// `1s`, `1.5s`, `6m0s`, `1h2m3s`. Rounded up, as `Retry-After` is, so a client that waits it out
/// is not early.
fn duration(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let mut out = String::new();
    if hours > 0 {
        let _ = write!(out, "{hours}h");
    }
    if hours > 0 || minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let (secs, millis) = (rest / 1000, rest % 1000);
    let _ = write!(out, "{secs}");
    if millis > 0 {
        let fraction = format!("{millis:03}");
        let _ = write!(out, ".{}", fraction.trim_end_matches('0'));
    }
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    #[test]
    fn durations_are_written_as_openai_writes_them() {
        let ms = Duration::from_millis;
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ms"),
            (ms(20), "20ms"),
            (ms(1000), "1s"),
            (ms(1500), "1.5s"),
            (ms(59_982), "59.982s"),
            (ms(360_000), "6m0s"),
            (ms(3_723_000), "1h2m3s"),
            (ms(3_600_000), "1h0m0s"),
        ] {
            assert_eq!(duration(d), text, "{d:?}");
        }
    }

    #[test]
    fn requests_and_tokens_are_the_plain_and_the_metered_limit() {
        let requests = Limit::new("chat", Quota::per_minute(60)).unwrap();
        let tokens = Limit::new("chat.tokens", Quota::per_minute(100_000))
            .unwrap()
            .with_max_debt(100);
        let decisions = [
            Decision::allowed(60, 59, Duration::from_secs(1)),
            Decision::limited(100_000, 0, None, Duration::from_millis(61_500)),
        ];
        let shown_fields = fields(&[requests, tokens.clone()], &decisions);
        let shown: Vec<(&str, &str)> = shown_fields
            .0
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            shown,
            [
                ("x-ratelimit-limit-requests", "60"),
                ("x-ratelimit-remaining-requests", "59"),
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-limit-tokens", "100000"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "1m1.5s"),
            ]
        );
        // A policy of tokens only has no request fields.
        assert_eq!(fields(&[tokens], &decisions[1..]).0.len(), 3);
    }
}

//! Keys from arbitrary bytes: `Key::from_bytes`, `Key::render`, the `Header` extractor and `KeySpec`.
//!
//! Invariants: a rendered key is printable ASCII, at most 200 bytes, without `{` or `}` (it goes
//! inside a Redis hash tag); equal inputs give equal keys and renderings, different inputs different
//! ones (whichever constructor built them); a header's value is its key; `KeySpec` parsing never
//! panics and its display parses back to the same spec.
#![no_main]

use http::{HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tower_throttle::key::{Header, Key, KeyExtractor, KeySpec, MAX_KEY_LEN};

fn rendered(key: &Key) -> String {
    let mut s = String::new();
    key.render(&mut s);
    s
}

fn check_rendering(bytes: &[u8], r: &str) {
    assert!(r.len() <= 200, "{} bytes: {r:?}", r.len());
    assert!(r.bytes().all(|b| b.is_ascii_graphic()), "{r:?}");
    assert!(!r.contains('{') && !r.contains('}'), "{r:?}");
    if bytes.len() > MAX_KEY_LEN {
        assert!(r.starts_with("#sha256:") && r.len() == 8 + 64, "{r:?}");
    } else {
        assert!(
            !r.starts_with('#') && !r.starts_with('*') && !r.starts_with('!'),
            "{r:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let key = Key::from_bytes(data);
    let r = rendered(&key);
    check_rendering(data, &r);
    assert_eq!(key.to_string(), r);

    // Equal inputs (a copy), any constructor: equal keys, equal renderings.
    let copy = data.to_vec();
    let same = [
        Key::from_bytes(&copy),
        Key::from(data),
        Key::from(data.to_vec()),
    ];
    for other in &same {
        assert_eq!(*other, key);
        assert_eq!(rendered(other), r);
    }
    if let Ok(s) = std::str::from_utf8(data) {
        assert_eq!(Key::from(s), key);
        assert_eq!(Key::from(s.to_owned()), key);
    }

    // Different inputs: different keys, different renderings.
    let (a, b) = data.split_at(data.len() / 2);
    let (ka, kb) = (Key::from_bytes(a), Key::from_bytes(b));
    let (ra, rb) = (rendered(&ka), rendered(&kb));
    check_rendering(a, &ra);
    check_rendering(b, &rb);
    assert_eq!(a == b, ka == kb);
    assert_eq!(a == b, ra == rb, "{a:?} / {b:?} render as {ra:?} / {rb:?}");
    // A byte-string key never renders like the global key or an IP key.
    assert_ne!(r, rendered(&Key::global()));
    if let Ok(ip) = std::str::from_utf8(data)
        .unwrap_or("")
        .parse::<std::net::IpAddr>()
    {
        assert_ne!(key, Key::from_ip(ip));
        assert_ne!(r, rendered(&Key::from_ip(ip)));
    }

    // The Header extractor: the value's bytes are the key; empty is no key.
    if let Ok(value) = HeaderValue::from_bytes(data) {
        let request = Request::builder()
            .header("x-api-key", value)
            .body(())
            .unwrap();
        let extracted = Header::new("X-Api-Key").extract(&request);
        if data.is_empty() {
            assert_eq!(extracted, None);
        } else {
            assert_eq!(extracted, Some(key.clone()));
        }
    }

    // Header names and key specs from arbitrary text: errors, never panics.
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(h) = Header::try_new(s) {
            let request = Request::builder().header(h.name(), "v").body(()).unwrap();
            assert_eq!(h.extract(&request), Some(Key::from("v")));
        }
        for text in [s.to_owned(), format!("header:{s}")] {
            if let Ok(spec) = text.parse::<KeySpec>() {
                let again: KeySpec = spec.to_string().parse().unwrap();
                assert_eq!(again, spec);
                let _ = KeyExtractor::<()>::describe(&spec);
                let _ = spec.extract(&Request::new(()));
            }
        }
    }
});

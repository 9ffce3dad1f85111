//! Keys (and metered estimates) from the request body: [`BodyField`], read as the application
//! reads it (`json.rs`), and reading the body itself (`read.rs`).

mod json;
pub(crate) mod read;

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::HeaderMap;

use super::extract::OnDuplicate;
use super::sources::query_value;
use super::value::Key;

/// How many bytes of a body a policy reads by default for a body key or estimate (16 KiB).
pub const DEFAULT_MAX_BODY: usize = 16 * 1024;

/// How long reading that much may take by default.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(2);

/// A field of the request body, for a key ([`PolicyBuilder::body_key`](crate::PolicyBuilder::body_key))
/// or a metered estimate ([`Estimate::body`](crate::Estimate::body)): `json:<path>`, a member of a
/// JSON body (a dotted path reaches into objects: `json:user.name`), or `form:<name>`, a field of an
/// `application/x-www-form-urlencoded` body.
///
/// Values are compared as the application decodes them, so a key cannot be dodged by spelling it
/// another way: JSON strings are decoded (`"a\u0062c"` is `abc`), JSON numbers have one spelling
/// (`10`, `1e1` and `10.0` are `10`), form names and values are percent-decoded (`+` a space). A body
/// has no key (the policy's [missing-key](crate::policy::MissingKey) answer) when its content type is
/// not JSON (`application/json`, `application/*+json`) for `json:` or not a form for `form:`, when it
/// is not valid JSON, when the field is absent, empty, not a string or number, or given twice
/// (parsers disagree on which one counts), and when the body is larger than the policy's
/// `max_body`, fails, or takes longer than its `body_timeout` to arrive.
///
/// ```
/// use tower_throttle::key::BodyField;
///
/// let user: BodyField = "json:user.name".parse().unwrap();
/// assert_eq!(user.to_string(), "json:user.name");
/// assert_eq!("form:email".parse::<BodyField>().unwrap(), BodyField::form("email").unwrap());
/// assert!("json:".parse::<BodyField>().is_err());
/// assert!("json:a..b".parse::<BodyField>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyField {
    form: bool,
    /// The JSON path's members, outermost first; a form field's name alone.
    path: Box<[Box<str>]>,
}

impl BodyField {
    /// The member at dotted `path` of a JSON body (`"username"`, `"user.name"`).
    pub fn json(path: &str) -> Result<Self, String> {
        let path = path
            .split('.')
            .map(|member| name(&format!("json:{path}"), member))
            .collect::<Result<_, _>>()?;
        Ok(BodyField { form: false, path })
    }

    /// The field `name` of a form body (`application/x-www-form-urlencoded`).
    pub fn form(field: &str) -> Result<Self, String> {
        let field = name(&format!("form:{field}"), field)?;
        Ok(BodyField {
            form: true,
            path: Box::new([field]),
        })
    }

    /// The key this field gives a request with `headers` and the whole `body`.
    pub(crate) fn key(&self, headers: &HeaderMap, body: &[u8]) -> Option<Key> {
        self.value(headers, body).map(Key::from)
    }

    /// The whole number this field holds, for an estimate.
    pub(crate) fn units(&self, headers: &HeaderMap, body: &[u8]) -> Option<u64> {
        units_of(std::str::from_utf8(&self.value(headers, body)?).ok()?)
    }

    /// The field's value: the form field's bytes, decoded, or the JSON scalar's text.
    fn value(&self, headers: &HeaderMap, body: &[u8]) -> Option<Vec<u8>> {
        let content_type = headers.get(CONTENT_TYPE)?.to_str().ok()?;
        let essence = content_type.split(';').next()?.trim().to_ascii_lowercase();
        if self.form {
            (essence == "application/x-www-form-urlencoded").then_some(())?;
            query_value(body, self.path[0].as_bytes(), OnDuplicate::Refuse)
        } else {
            let json = essence == "application/json"
                || (essence.starts_with("application/") && essence.ends_with("+json"));
            json.then_some(())?;
            json::find(body, &self.path).map(String::into_bytes)
        }
    }

    /// What the field is, for the missing-key answer ("expected ...").
    pub(crate) fn describe(&self) -> String {
        if self.form {
            format!("form field {} of the body", self.path[0])
        } else {
            format!("JSON field {} of the body", self.path.join("."))
        }
    }
}

/// A `json:` member or `form:` name: not empty, printable, at most 256 bytes.
fn name(spec: &str, name: &str) -> Result<Box<str>, String> {
    if name.is_empty() || name.len() > 256 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "body field {spec:?}: {name:?} is not a valid name (printable ASCII, not empty)"
        ));
    }
    Ok(name.into())
}

impl std::str::FromStr for BodyField {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("json:") {
            BodyField::json(path)
        } else if let Some(field) = s.strip_prefix("form:") {
            BodyField::form(field)
        } else {
            Err(format!(
                "body field {s:?}: expected \"json:<path>\" or \"form:<name>\""
            ))
        }
    }
}

impl fmt::Display for BodyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.form {
            true => write!(f, "form:{}", self.path[0]),
            false => write!(f, "json:{}", self.path.join(".")),
        }
    }
}

/// What a policy reads from the body: its key, or (`None`) only the estimate its meter names.
#[derive(Clone, Debug)]
pub(crate) struct BodyRule {
    pub(crate) key: Option<BodyField>,
    pub(crate) max: usize,
    pub(crate) timeout: Duration,
}

/// A body as reading left it: the whole of it when it ended within the cap, in time and without
/// an error; `None` otherwise (over the cap, failed, late, or of a type that cannot be read).
pub(crate) type WholeBody = Option<Bytes>;

/// A count of units written as a whole number (`512`, `5e2`); one past `u64` (`1e20`,
/// `99999999999999999999`) is the most there is, so that a cap applies to it rather than a
/// default. `None` for text that is no whole number (a fraction, a negative one).
pub(crate) fn units_of(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Ok(units) = text.parse::<u64>() {
        return Some(units);
    }
    let number: f64 = text.parse().ok()?;
    // Past f64's range (`1e400`) the number reads as infinite, whose fraction is NaN: the most too.
    let whole = number == f64::INFINITY || number.fract() == 0.0;
    (number >= 0.0 && whole).then_some(number as u64) // `as` saturates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, content_type.parse().unwrap());
        h
    }

    #[test]
    fn json_keys_need_a_json_body() {
        let user = BodyField::json("username").unwrap();
        let body = br#"{"username":"a\u0062c"}"#;
        for ct in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
        ] {
            assert_eq!(user.key(&headers(ct), body), Some(Key::from("abc")), "{ct}");
        }
        for ct in ["text/plain", "application/x-www-form-urlencoded", "json"] {
            assert_eq!(user.key(&headers(ct), body), None, "{ct}");
        }
        assert_eq!(user.key(&HeaderMap::new(), body), None);
        let tokens = BodyField::json("max_tokens").unwrap();
        let json = headers("application/json");
        assert_eq!(tokens.units(&json, br#"{"max_tokens":512}"#), Some(512));
        assert_eq!(tokens.units(&json, br#"{"max_tokens":5e2}"#), Some(500));
        assert_eq!(tokens.units(&json, br#"{"max_tokens":-1}"#), None);
        assert_eq!(tokens.units(&json, br#"{"max_tokens":0.5}"#), None);
        // Past what u64 holds: the most there is (the estimate's cap then applies).
        assert_eq!(
            tokens.units(&json, br#"{"max_tokens":1e20}"#),
            Some(u64::MAX)
        );
        // Past f64's range too (a header's `1e400`), not the default.
        assert_eq!(units_of("1e400"), Some(u64::MAX));
        assert_eq!(units_of("-1e400"), None);
    }

    #[test]
    fn form_fields_are_decoded_and_unambiguous() {
        let email = BodyField::form("email").unwrap();
        let form = headers("application/x-www-form-urlencoded");
        let key = |body: &[u8]| email.key(&form, body);
        assert_eq!(key(b"email=a%40b.c&pw=x"), Some(Key::from("a@b.c")));
        assert_eq!(key(b"pw=x&%65mail=a@b.c"), Some(Key::from("a@b.c")));
        assert_eq!(key(b"email=a+b"), Some(Key::from("a b")));
        assert_eq!(key(b"email=a&email=b"), None);
        assert_eq!(key(b"email=&pw=x"), None);
        assert_eq!(key(b"pw=x"), None);
        assert_eq!(key(b"email=\xff\xfe"), Some(Key::from(&b"\xff\xfe"[..])));
        assert_eq!(email.key(&headers("application/json"), b"email=a"), None);
    }

    #[test]
    fn names_are_checked() {
        for bad in [
            "json:",
            "form:",
            "json:a..b",
            "json:.a",
            "form:a b",
            "xml:a",
            "username",
        ] {
            assert!(bad.parse::<BodyField>().is_err(), "{bad}");
        }
        for good in ["json:a", "json:a.b.c", "form:e-mail"] {
            assert_eq!(good.parse::<BodyField>().unwrap().to_string(), good);
        }
    }
}

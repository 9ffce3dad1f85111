//! The value at a dotted path of a JSON document, read as an application's JSON parser reads it
//! (`"a\u0062c"` is `abc`; `10`, `1e1` and `10.0` are `10`). One pass, nothing kept but the value
//! sought: the cost is linear in the document's length, nesting is bounded ([`MAX_DEPTH`]), and a
//! document that is not valid JSON has no value, as the application would reject it.

/// Documents nested this deep are refused (serde_json's default recursion limit: 127 levels read).
pub(crate) const MAX_DEPTH: usize = 128;

/// What the path led to so far.
enum Slot {
    Empty,
    /// A string (decoded) or a number ([`canonical`]), or `None` for another kind of value (an
    /// object, `true`, `null`): no key.
    One(Option<String>),
    /// The path was met twice (a repeated member): ambiguous, so no value.
    Ambiguous,
}

/// The scalar at `path` (object members, outermost first) of the JSON document `doc`; `None` when
/// there is none, or a member on the path appears twice (parsers disagree on which one counts).
pub(crate) fn find(doc: &[u8], path: &[Box<str>]) -> Option<String> {
    std::str::from_utf8(doc).ok()?;
    let mut parser = Parser {
        doc,
        at: 0,
        depth: 0,
        scratch: Vec::new(),
    };
    let mut slot = Slot::Empty;
    parser.value(Some(path), &mut slot)?;
    parser.space();
    if parser.at != doc.len() {
        return None;
    }
    match slot {
        Slot::One(found) => found,
        Slot::Empty | Slot::Ambiguous => None,
    }
}

struct Parser<'a> {
    doc: &'a [u8],
    at: usize,
    depth: usize,
    scratch: Vec<u8>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.doc.get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// One value. `want`: the rest of the path from here (`Some(&[])`: this value is the one
    /// sought), or `None` when the value is only checked and skipped. `None` back: invalid.
    fn value(&mut self, want: Option<&[Box<str>]>, slot: &mut Slot) -> Option<()> {
        self.space();
        match self.peek()? {
            b'{' => self.object(want, slot),
            b'[' => {
                self.nested(|p| p.array())?;
                Self::found(want, slot, None);
                Some(())
            }
            b'"' => {
                let target = want.is_some_and(|w| w.is_empty());
                self.string(target)?;
                if target {
                    // Decoded from valid UTF-8 and whole characters: valid UTF-8.
                    let text = String::from_utf8(std::mem::take(&mut self.scratch)).ok()?;
                    let scalar = (!text.is_empty()).then_some(text);
                    Self::found(want, slot, scalar);
                }
                Some(())
            }
            b't' => self.literal(b"true", want, slot),
            b'f' => self.literal(b"false", want, slot),
            b'n' => self.literal(b"null", want, slot),
            _ => {
                let number = self.number()?;
                if want.is_some_and(|w| w.is_empty()) {
                    Self::found(want, slot, canonical(number));
                }
                Some(())
            }
        }
    }

    /// Records what the path led to, when this value is the one sought.
    fn found(want: Option<&[Box<str>]>, slot: &mut Slot, scalar: Option<String>) {
        if want.is_some_and(|w| w.is_empty()) {
            *slot = match slot {
                Slot::Empty => Slot::One(scalar),
                _ => Slot::Ambiguous,
            };
        }
    }

    fn literal(&mut self, word: &[u8], want: Option<&[Box<str>]>, slot: &mut Slot) -> Option<()> {
        let end = self.at.checked_add(word.len())?;
        (self.doc.get(self.at..end)? == word).then_some(())?;
        self.at = end;
        Self::found(want, slot, None);
        Some(())
    }

    /// Runs `inside` one level deeper, refusing documents nested [`MAX_DEPTH`] deep.
    fn nested(&mut self, inside: impl FnOnce(&mut Self) -> Option<()>) -> Option<()> {
        self.depth += 1;
        if self.depth >= MAX_DEPTH {
            return None;
        }
        let result = inside(self);
        self.depth -= 1;
        result
    }

    /// `open` and the blanks after it; `Some(true)` when `close` follows at once (empty).
    fn open(&mut self, open: u8, close: u8) -> Option<bool> {
        self.eat(open)?;
        self.space();
        Some(self.eat(close).is_some())
    }

    /// After an element or member: past the `,` before the next one (`Some(true)`) or the `close`
    /// that ends them (`Some(false)`); `None` for anything else.
    fn more(&mut self, close: u8) -> Option<bool> {
        self.space();
        let more = self.peek()? == b',';
        (more || self.peek()? == close).then(|| self.at += 1)?;
        Some(more)
    }

    fn array(&mut self) -> Option<()> {
        if self.open(b'[', b']')? {
            return Some(());
        }
        loop {
            self.value(None, &mut Slot::Empty)?;
            if !self.more(b']')? {
                return Some(());
            }
        }
    }

    fn object(&mut self, want: Option<&[Box<str>]>, slot: &mut Slot) -> Option<()> {
        // The object itself is the value sought: no key (but still checked).
        Self::found(want, slot, None);
        let next = want.and_then(|w| w.split_first());
        self.nested(|p| {
            if p.open(b'{', b'}')? {
                return Some(());
            }
            let mut seen = 0;
            loop {
                p.space();
                let decode = next.is_some();
                p.string(decode)?;
                let matches = next.is_some_and(|(head, _)| p.scratch == head.as_bytes());
                p.space();
                p.eat(b':')?;
                if matches {
                    seen += 1;
                    if seen > 1 {
                        *slot = Slot::Ambiguous;
                    }
                    p.value(next.map(|(_, rest)| rest), slot)?;
                } else {
                    p.value(None, &mut Slot::Empty)?;
                }
                if !p.more(b'}')? {
                    return Some(());
                }
            }
        })
    }

    /// A string, checked; with `decode`, its decoded bytes are left in `scratch`.
    fn string(&mut self, decode: bool) -> Option<()> {
        self.scratch.clear();
        self.eat(b'"')?;
        loop {
            let byte = self.peek()?;
            self.at += 1;
            match byte {
                b'"' => return Some(()),
                b'\\' => {
                    let escaped = self.peek()?;
                    self.at += 1;
                    let plain = match escaped {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            let c = self.unicode_escape()?;
                            if decode {
                                let mut buf = [0; 4];
                                self.scratch
                                    .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            }
                            continue;
                        }
                        _ => return None,
                    };
                    if decode {
                        self.scratch.push(plain);
                    }
                }
                0x00..=0x1f => return None,
                other => {
                    if decode {
                        self.scratch.push(other);
                    }
                }
            }
        }
    }

    /// After `\u`: four hex digits, and a second escape when they are a high surrogate.
    fn unicode_escape(&mut self) -> Option<char> {
        let first = self.hex4()?;
        match first {
            0xd800..=0xdbff => {
                self.eat(b'\\')?;
                self.eat(b'u')?;
                let low = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&low) {
                    return None;
                }
                char::from_u32(0x10000 + ((first - 0xd800) << 10) + (low - 0xdc00))
            }
            0xdc00..=0xdfff => None,
            _ => char::from_u32(first),
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let end = self.at.checked_add(4)?;
        let digits = self.doc.get(self.at..end)?;
        let mut n = 0;
        for d in digits {
            n = n << 4 | (*d as char).to_digit(16)?;
        }
        self.at = end;
        Some(n)
    }

    /// A number's text, checked against JSON's grammar.
    fn number(&mut self) -> Option<&str> {
        let start = self.at;
        let _ = self.eat(b'-');
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.peek().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.peek().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        // Checked as UTF-8 by `find`, and only ASCII was read here.
        std::str::from_utf8(&self.doc[start..self.at]).ok()
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }
}

/// A number's one spelling: an integer literal as its digits (`-0` is `0`); any other as the
/// `f64` it reads as, written as an integer when it is one below 2^53, else in Rust's shortest
/// round-trip form. Infinite (an exponent past `f64`): no key.
fn canonical(number: &str) -> Option<String> {
    if number.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return Some(if number == "-0" {
            "0".into()
        } else {
            number.into()
        });
    }
    let value: f64 = number.parse().ok()?;
    if !value.is_finite() {
        return None;
    }
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if value.fract() == 0.0 && value.abs() < EXACT {
        // `as` is exact here: an integral value below 2^53.
        return Some(format!("{}", value as i64));
    }
    Some(format!("{value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<Box<str>> {
        p.split('.').map(Into::into).collect()
    }

    fn at(doc: &str, p: &str) -> Option<String> {
        find(doc.as_bytes(), &path(p))
    }

    fn s(text: &str) -> Option<String> {
        Some(text.into())
    }

    #[test]
    fn strings_are_compared_decoded() {
        assert_eq!(at(r#"{"username":"abc"}"#, "username"), s("abc"));
        assert_eq!(at(r#"{"username":"a\u0062c"}"#, "username"), s("abc"));
        assert_eq!(at(r#"{"user\u006eame":"abc"}"#, "username"), s("abc"));
        assert_eq!(at(r#"{"u":"\ud83d\ude00 \n\"\\\/"}"#, "u"), s("😀 \n\"\\/"));
        assert_eq!(
            at(r#" { "a" : { "b" : "x" } , "c" : [1, {"b": 2}] } "#, "a.b"),
            s("x")
        );
        assert_eq!(at(r#"{"a":{"b":"x"}}"#, "a"), None);
        assert_eq!(at(r#"{"a":""}"#, "a"), None);
    }

    #[test]
    fn numbers_have_one_spelling() {
        for doc in ["10", "1e1", "10.0", "100e-1", "1.0E+1"] {
            assert_eq!(at(&format!(r#"{{"n":{doc}}}"#), "n"), s("10"), "{doc}");
        }
        assert_eq!(at(r#"{"n":-0}"#, "n"), s("0"));
        assert_eq!(at(r#"{"n":-0.0}"#, "n"), s("0"));
        assert_eq!(at(r#"{"n":0.5}"#, "n"), s("0.5"));
        assert_eq!(at(r#"{"n":1e400}"#, "n"), None);
        let long = "9".repeat(5000);
        assert_eq!(at(&format!(r#"{{"n":{long}}}"#), "n"), s(&long));
    }

    #[test]
    fn ambiguous_and_other_values_have_no_key() {
        assert_eq!(at(r#"{"u":"a","u":"b"}"#, "u"), None);
        assert_eq!(at(r#"{"u":{"n":"a"},"u":5}"#, "u.n"), None);
        assert_eq!(at(r#"{"u":"a","v":{"u":"b"}}"#, "u"), s("a"));
        for v in ["true", "false", "null", "[]", "{}", "[\"a\"]"] {
            assert_eq!(at(&format!(r#"{{"u":{v}}}"#), "u"), None, "{v}");
        }
        assert_eq!(at(r#"["u"]"#, "u"), None);
        assert_eq!(at(r#""u""#, "u"), None);
    }

    #[test]
    fn invalid_documents_have_no_key() {
        for doc in [
            r#"{"u":"a",}"#,
            r#"{"u":"a"} x"#,
            r#"{"u":"a""#,
            r#"{"u":"a\x"}"#,
            r#"{"u":"\ud800"}"#,
            r#"{"u":"\udc00"}"#,
            r#"{"u":"\u12"}"#,
            "{\"u\":\"a\tb\"}",
            r#"{"u":01}"#,
            r#"{"u":1.}"#,
            r#"{"u":-}"#,
            r#"{"u":1e}"#,
            r#"{"u" "a"}"#,
            r#"{u:"a"}"#,
            "",
            "{",
            r#"{"u":tru}"#,
        ] {
            assert_eq!(at(doc, "u"), None, "{doc}");
        }
        assert_eq!(find(b"{\"u\":\"\xff\"}", &path("u")), None);
    }

    #[test]
    fn hostile_nesting_is_refused_cheaply() {
        let deep = format!(
            "{{\"u\":\"a\",\"x\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(at(&deep, "u"), None);
        let ok = format!(
            "{{\"u\":\"a\",\"x\":{}{}}}",
            "[".repeat(100),
            "]".repeat(100)
        );
        assert_eq!(at(&ok, "u"), s("a"));
        let objects = format!("{}\"u\":1{}", "{\"a\":".repeat(200), "}".repeat(200));
        assert_eq!(at(&objects, "u"), None);
    }

    #[test]
    fn a_login_body_keeps_its_key_beside_true_false_and_null() {
        let login =
            r#"{"username":"alice","password":"pw","remember":true,"otp":null,"sso":false}"#;
        assert_eq!(at(login, "username"), s("alice"));
        for v in ["true", "false", "null"] {
            let doc = format!(r#"{{"a":[{v},{v}],"u":"k","b":{v}}}"#);
            assert_eq!(at(&doc, "u"), s("k"), "{doc}");
        }
        // A literal cut short, misspelt or run on is not JSON: no key.
        for v in ["t", "tru", "fals", "nul", "True", "nulll", "truefalse"] {
            let doc = format!(r#"{{"u":"k","v":{v}}}"#);
            assert_eq!(at(&doc, "u"), None, "{doc}");
        }
    }

    #[test]
    fn every_short_escape_decodes_to_its_character() {
        assert_eq!(
            at(r#"{"u":"a\b\f\n\r\t\"\\\/z"}"#, "u"),
            s("a\u{8}\u{c}\n\r\t\"\\/z")
        );
        for (escape, plain) in [("b", "\u{8}"), ("f", "\u{c}"), ("r", "\r"), ("t", "\t")] {
            let doc = format!(r#"{{"u":"x\{escape}"}}"#);
            assert_eq!(at(&doc, "u"), s(&format!("x{plain}")), "{doc}");
            // In a member's name too.
            let doc = format!(r#"{{"x\{escape}":"k"}}"#);
            assert_eq!(
                find(doc.as_bytes(), &[format!("x{plain}").into()]),
                s("k"),
                "{doc}"
            );
        }
    }

    #[test]
    fn nesting_is_capped_where_serde_json_caps_it() {
        // The key's object is one level; arrays inside it take the others.
        let arrays = |levels: usize| {
            let inner = levels - 1;
            format!(
                r#"{{"u":"a","x":{}{}}}"#,
                "[".repeat(inner),
                "]".repeat(inner)
            )
        };
        // The key at the deepest level.
        let objects = |levels: usize| {
            let doc = format!(r#"{}"k"{}"#, r#"{"a":"#.repeat(levels), "}".repeat(levels));
            find(doc.as_bytes(), &vec!["a".into(); levels])
        };
        assert_eq!(at(&arrays(MAX_DEPTH - 1), "u"), s("a"));
        assert_eq!(objects(MAX_DEPTH - 1), s("k"));
        assert_eq!(at(&arrays(MAX_DEPTH), "u"), None);
        assert_eq!(objects(MAX_DEPTH), None);
        for levels in [1, 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1] {
            let doc = arrays(levels);
            let read = serde_json::from_str::<serde_json::Value>(&doc).is_ok();
            assert_eq!(at(&doc, "u").is_some(), read, "{levels} levels");
        }
        // Depth is how deep, not how many: siblings do not add up.
        let siblings = format!(r#"{{"u":"a","x":[{}]}}"#, vec!["[[{}]]"; 1000].join(","));
        assert_eq!(at(&siblings, "u"), s("a"));
        let members = format!(
            r#"{{"u":"a",{}}}"#,
            (0..300)
                .map(|i| format!(r#""m{i}":{{"n":[]}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(at(&members, "u"), s("a"));
    }

    #[test]
    fn a_document_has_a_key_exactly_where_serde_json_reads_it() {
        for v in [
            "true",
            "false",
            "null",
            "t",
            "tru",
            "nul",
            "True",
            "nulll",
            "[true,false,null]",
            r#""\b\f\n\r\t\"\\\/""#,
            r#""\a""#,
            r#""\u00e9\ud83d\ude00""#,
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            r#""\u00g1""#,
            "0",
            "-0",
            "1.5e-3",
            "01",
            "1.",
            "-",
            ".5",
            "1e",
            "1E+",
            "[]",
            "{}",
            "[1,]",
            "[,1]",
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{"a":}"#,
            "[1 2]",
            r#""a"#,
            "\"\u{1}\"",
        ] {
            let doc = format!(r#"{{"u":"k","v":{v}}}"#);
            let read = serde_json::from_str::<serde_json::Value>(&doc).is_ok();
            assert_eq!(at(&doc, "u"), read.then(|| "k".to_owned()), "{doc}");
        }
    }
}

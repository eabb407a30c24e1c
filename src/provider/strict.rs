//! Strict JSON parsing into [`Json`]: duplicate keys refused, numbers kept.
//!
//! Two things `serde_json::from_str::<Value>` does are wrong for tool calls:
//!
//! * it silently keeps the last of duplicate object keys, so a response
//!   carrying `{"amount": 1, "amount": 1000}` would reach the ledger as a
//!   clean-looking object while other readers of the same response may have
//!   seen `1`; [`parse`] refuses such documents;
//! * it turns numbers into `u64`/`i64`/`f64`, which changes `-0`, integers
//!   beyond 64 bits and some full-precision doubles; [`parse`] keeps each
//!   number's text (see [`super::json`]).
//!
//! Otherwise the grammar is RFC 8259, as `serde_json` reads it: no comments,
//! no trailing commas, no lone surrogates in `\u` escapes, no raw control
//! characters in strings, numbers that overflow a double are refused ("number
//! out of range"), and nesting is bounded at [`MAX_DEPTH`] (`serde_json`'s
//! recursion limit). Errors carry a fixed description and a position, never
//! the input.

use std::collections::BTreeMap;
use std::fmt;

use super::json::{Json, Object};

/// The message of the duplicate-key error (a fixed text, safe to show).
pub(super) const DUPLICATE_KEY: &str = "duplicate object key";

/// Deepest nesting of arrays and objects accepted (as `serde_json`).
pub(super) const MAX_DEPTH: usize = 128;

/// Why a text is not strict JSON: a fixed description and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SyntaxError {
    /// What went wrong (a fixed text, never input).
    pub(super) what: &'static str,
    /// 1-based line of the problem.
    pub(super) line: usize,
    /// 1-based column (in bytes) of the problem.
    pub(super) column: usize,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at line {} column {}",
            self.what, self.line, self.column
        )
    }
}

/// Parses `text` as one strict JSON value.
pub(super) fn parse(text: &str) -> Result<Json, SyntaxError> {
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
    };
    let value = parser.value(0)?;
    parser.skip_whitespace();
    if parser.at < parser.bytes.len() {
        return Err(parser.error("trailing characters"));
    }
    Ok(value)
}

/// A recursive-descent parser over the bytes of a `&str`.
struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    /// An error at the current position.
    fn error(&self, what: &'static str) -> SyntaxError {
        self.error_at(what, self.at)
    }

    /// An error at byte `offset`.
    fn error_at(&self, what: &'static str, offset: usize) -> SyntaxError {
        let before = &self.bytes[..offset.min(self.bytes.len())];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        SyntaxError {
            what,
            line,
            column: before.len() - line_start + 1,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// One value at nesting `depth` (0 for the document).
    fn value(&mut self, depth: usize) -> Result<Json, SyntaxError> {
        self.skip_whitespace();
        match self.peek() {
            None => Err(self.error("EOF while parsing a value")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Json::String),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'n') => self.literal("null", Json::Null),
            Some(_) => Err(self.error("expected value")),
        }
    }

    fn literal(&mut self, word: &'static str, value: Json) -> Result<Json, SyntaxError> {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(self.error("expected value"))
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.error("recursion limit exceeded"));
        }
        self.at += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Json::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Array(items));
                }
                None => return Err(self.error("EOF while parsing a list")),
                Some(_) => return Err(self.error("expected `,` or `]`")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.error("recursion limit exceeded"));
        }
        self.at += 1; // '{'
        let mut members = BTreeMap::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Json::Object(Object::default()));
        }
        loop {
            self.skip_whitespace();
            let key_at = self.at;
            match self.peek() {
                Some(b'"') => {}
                None => return Err(self.error("EOF while parsing an object")),
                Some(_) => return Err(self.error("key must be a string")),
            }
            let key = self.string()?;
            if members.contains_key(&key) {
                return Err(self.error_at(DUPLICATE_KEY, key_at));
            }
            self.skip_whitespace();
            match self.peek() {
                Some(b':') => self.at += 1,
                None => return Err(self.error("EOF while parsing an object")),
                Some(_) => return Err(self.error("expected `:`")),
            }
            let value = self.value(depth)?;
            members.insert(key, value);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    // A BTreeMap iterates in key order: stored sorted.
                    return Ok(Json::Object(Object::from_members(
                        members.into_iter().collect(),
                    )));
                }
                None => return Err(self.error("EOF while parsing an object")),
                Some(_) => return Err(self.error("expected `,` or `}`")),
            }
        }
    }

    /// A string starting at the opening quote; returns its unescaped text.
    fn string(&mut self) -> Result<String, SyntaxError> {
        self.at += 1; // '"'
        let mut out = String::new();
        let mut start = self.at;
        loop {
            match self.peek() {
                None => return Err(self.error("EOF while parsing a string")),
                Some(b'"') => {
                    out.push_str(&self.text[start..self.at]);
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    out.push_str(&self.text[start..self.at]);
                    self.at += 1;
                    self.escape(&mut out)?;
                    start = self.at;
                }
                Some(0x00..=0x1f) => {
                    return Err(self
                        .error("control character (\\u0000-\\u001F) found while parsing a string"))
                }
                Some(_) => self.at += 1,
            }
        }
    }

    /// One escape sequence after the backslash.
    fn escape(&mut self, out: &mut String) -> Result<(), SyntaxError> {
        let Some(byte) = self.peek() else {
            return Err(self.error("EOF while parsing a string"));
        };
        self.at += 1;
        let plain = match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode_escape(out),
            _ => return Err(self.error_at("invalid escape", self.at - 1)),
        };
        out.push(plain);
        Ok(())
    }

    /// `\uXXXX` (after the `u`), with a following low surrogate when the
    /// first is a high one.
    fn unicode_escape(&mut self, out: &mut String) -> Result<(), SyntaxError> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.bytes[self.at..].starts_with(b"\\u") {
                    return Err(self.error("lone leading surrogate in hex escape"));
                }
                self.at += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error("lone leading surrogate in hex escape"));
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(self.error("lone trailing surrogate in hex escape")),
            other => other,
        };
        let ch = char::from_u32(code).ok_or_else(|| self.error("invalid unicode code point"))?;
        out.push(ch);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, SyntaxError> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = self
                .peek()
                .and_then(|b| char::from(b).to_digit(16))
                .ok_or_else(|| self.error("invalid escape"))?;
            code = code * 16 + digit;
            self.at += 1;
        }
        Ok(code)
    }

    /// A number: RFC 8259 grammar, kept as its text; refused when it
    /// overflows a double.
    fn number(&mut self) -> Result<Json, SyntaxError> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.error("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.error("invalid number"));
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.error("invalid number"));
            }
            self.digits();
        }
        let text = &self.text[start..self.at];
        // Rust's float parser is correctly rounded and handles any length.
        match text.parse::<f64>() {
            Ok(value) if value.is_finite() => Ok(Json::Number(text.to_owned())),
            _ => Err(self.error_at("number out of range", start)),
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &str) -> String {
        parse(text).unwrap().to_text()
    }

    #[test]
    fn numbers_keep_their_text() {
        for number in [
            "0",
            "-0",
            "-0.0",
            "1.0",
            "1E2",
            "1e-7",
            "224.18827276432074",
            "18446744073709551616",
            "-123456789012345678901234567890",
            "0.1000000000000000055511151231257827",
            "1.7976931348623157e308",
            "5e-324",
            "1e-400",
        ] {
            assert_eq!(round_trip(number), number);
            assert_eq!(round_trip(&format!("[{number}]")), format!("[{number}]"));
        }
        for bad in [
            "01", "1.", ".5", "+1", "-", "1e", "1e+", "0x10", "NaN", "Infinity",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let err = parse("[1, 1e400]").unwrap_err();
        assert_eq!(err.to_string(), "number out of range at line 1 column 5");
    }

    #[test]
    fn same_values_as_serde_json_apart_from_numbers() {
        let text = r#"{"b":{},"a":[true,null,"é\u00e9\ud83d\ude00\n\/"],"c":"\u0001"}"#;
        let ours = round_trip(text);
        let theirs =
            serde_json::to_string(&serde_json::from_str::<serde_json::Value>(text).unwrap())
                .unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn duplicate_keys_fail_at_any_depth() {
        let err = parse("{\"a\":{\"x\":1,\n \"x\":2}}").unwrap_err();
        assert_eq!(err.to_string(), "duplicate object key at line 2 column 2");
        assert!(parse(r#"[{"k":1},{"k":2}]"#).is_ok());
        assert!(
            parse(r#"{"k":1,"\u006b":2}"#).is_err(),
            "compared unescaped"
        );
    }

    #[test]
    fn malformed_text_is_refused_without_quoting_it() {
        for bad in [
            "",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "{a:1}",
            "\"unterminated",
            "\"\\x\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"tab\there\"",
            "tru",
            "[] []",
            "// comment\n1",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.to_string().contains(" at line "), "{bad}: {err}");
        }
    }

    #[test]
    fn recursion_limit_applies() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(&ok).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(parse(&deep).unwrap_err().what, "recursion limit exceeded");
        let deeper = format!("{}{}", "{\"a\":".repeat(5_000), "}".repeat(5_000));
        assert!(parse(&deeper).is_err());
    }
}

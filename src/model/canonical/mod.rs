//! RFC 8785 JSON Canonicalization Scheme (JCS) over a strict, bounded parser.
//!
//! Tool-call arguments are hashed into an args digest that decides whether two
//! calls are "the same call". That digest must be identical for semantically
//! equal JSON — `{"b":1,"a":2.0}` and `{"a":2,"b":1}` — so arguments are
//! canonicalised first: members sorted by UTF-16 code units, numbers written
//! the way ECMAScript `Number.prototype.toString` writes them, strings escaped
//! minimally, no whitespace.
//!
//! The arguments come from a model or a remote peer and are therefore
//! untrusted. This module has its own parser rather than using `serde_json`
//! because JCS requires rejecting what `serde_json` silently accepts
//! (duplicate keys: which value "wins" would change the meaning but not the
//! digest). Every refusal is a typed [`JsonError`] carrying only byte offsets
//! and limits — never the input's values, which may be personal data.
//!
//! **Numbers keep every digit.** RFC 8785 reads every number as an IEEE-754
//! double, so `12345678901234567` and `12345678901234568` — two different
//! account numbers — would canonicalise (and digest) alike. Here a number is
//! canonicalised from its exact decimal value: the spelling is normalised
//! (`2.0`, `2`, `20e-1` → `2`; `-0` → `0`; JCS's layout for exponents) but no
//! digit is dropped, so two literals give the same text exactly when they
//! denote the same number. For every literal that is the shortest form of a
//! double — what JSON encoders write — the output is byte-for-byte RFC 8785's.
//! [`canonicalize_legacy`] keeps the double-rounding form of schema version 3,
//! only to recognise digests stored by that version.
//!
//! Use [`canonicalize`] on any JSON text before digesting or comparing it; use
//! [`write_json_string`] when emitting a string that must match JCS escaping.

mod number;
mod raw;
mod validate;

use number::{write_exact, write_number};
pub use raw::object_array_member;
pub use validate::validate;

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Bounds applied while parsing untrusted JSON.
///
/// `max_depth` counts nested arrays and objects (a top-level scalar is depth
/// 0, `[]` is depth 1). The parser is iterative, so any depth is stack-safe;
/// the limit bounds work instead, which is O(bytes × object nesting) because
/// each object's members are buffered for sorting. `max_bytes` bounds the
/// UTF-8 length of the text and is checked before any parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    /// Deepest allowed nesting of arrays and objects.
    pub max_depth: usize,
    /// Largest accepted input, in bytes.
    pub max_bytes: usize,
}

impl Default for JsonLimits {
    /// 64 levels of nesting and 1 MiB of text.
    fn default() -> Self {
        Self {
            max_depth: 64,
            max_bytes: 1_048_576,
        }
    }
}

/// Why a JSON text was refused. Never carries the input's values (privacy:
/// arguments may hold personal data) — only byte offsets and limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonError {
    /// The text is not RFC 8259 JSON; `offset` is the byte where parsing stopped.
    #[error("invalid JSON at byte {offset}: {reason}")]
    Invalid {
        /// Byte offset of the offending input (the input length at end of input).
        offset: usize,
        /// Fixed description of the problem; never contains input text.
        reason: &'static str,
    },
    /// An object repeats a key (compared after unescaping).
    #[error("duplicate object key at byte {offset}")]
    DuplicateKey {
        /// Byte offset of the opening quote of the repeated key.
        offset: usize,
    },
    /// A number literal overflows to infinity.
    #[error("number at byte {offset} is not a finite IEEE-754 double")]
    NonFiniteNumber {
        /// Byte offset of the first character of the number.
        offset: usize,
    },
    /// Arrays/objects nest deeper than [`JsonLimits::max_depth`].
    #[error("JSON nesting deeper than {max}")]
    TooDeep {
        /// The configured limit.
        max: usize,
    },
    /// The text is longer than [`JsonLimits::max_bytes`].
    #[error("JSON text of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Length of the input in bytes.
        size: usize,
        /// The configured limit.
        max: usize,
    },
}

/// Parses `input` strictly and returns its RFC 8785 canonical form.
///
/// The grammar is RFC 8259 with no extensions: any value may be at the top
/// level, whitespace is only space/tab/LF/CR, and no byte-order mark,
/// comments, trailing commas, leading zeros, `NaN`/`Infinity` or unpaired
/// surrogate escapes are accepted.
///
/// # Errors
///
/// - [`JsonError::TooLarge`] if `input.len() > limits.max_bytes` (checked first);
/// - [`JsonError::TooDeep`] if nesting exceeds `limits.max_depth`;
/// - [`JsonError::DuplicateKey`] if an object repeats a key after unescaping;
/// - [`JsonError::NonFiniteNumber`] if a number literal overflows an `f64`;
/// - [`JsonError::Invalid`] for any other grammar violation.
///
/// The first problem in input order is reported.
pub fn canonicalize(input: &str, limits: &JsonLimits) -> Result<String, JsonError> {
    run_parser(input, limits, Numbers::Exact)
}

/// [`canonicalize`] as schema version 3 did it: every number rounded to the
/// nearest IEEE-754 double and written as RFC 8785 writes that double.
/// Different numbers can share this form; it exists only so that digests
/// stored by that version are still recognised.
///
/// # Errors
/// As [`canonicalize`].
pub fn canonicalize_legacy(input: &str, limits: &JsonLimits) -> Result<String, JsonError> {
    run_parser(input, limits, Numbers::NearestDouble)
}

/// How the parser writes numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Numbers {
    /// The exact decimal value, every digit kept.
    Exact,
    /// The nearest double (RFC 8785 as written; schema version 3 digests).
    NearestDouble,
}

fn run_parser(input: &str, limits: &JsonLimits, numbers: Numbers) -> Result<String, JsonError> {
    Parser::bounded(input, limits, numbers)?.run(limits.max_depth)
}

/// Appends `s` as a JSON string literal escaped exactly as RFC 8785 requires.
///
/// Only `"`, `\` and U+0000–U+001F are escaped (`\b \t \n \f \r` short forms,
/// others as lowercase `\u00xx`); everything else, including `/`, non-ASCII
/// and U+2028/U+2029, is written as raw UTF-8.
pub fn write_json_string(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Copy runs of characters that need no escape in one go; only `"`, `\\`
    // and control characters (all ASCII) are escaped.
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0c => "\\f",
            b'\r' => "\\r",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(s.get(run..i).unwrap_or_default());
        if escape.is_empty() {
            out.push_str(&format!("\\u{:04x}", b));
        } else {
            out.push_str(escape);
        }
        run = i + 1;
    }
    out.push_str(s.get(run..).unwrap_or_default());
    out.push('"');
}

/// Object key ordered by UTF-16 code units, as RFC 8785 §3.2.3 requires.
/// Equal code-unit sequences mean equal strings, so `Eq` and `Ord` agree.
#[derive(Default, PartialEq, Eq)]
struct Utf16Key(String);

impl Ord for Utf16Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.encode_utf16().cmp(other.0.encode_utf16())
    }
}

impl PartialOrd for Utf16Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What the walk of a JSON text does with what it reads: the one grammar of
/// this module is walked once ([`Parser::walk`]), and a sink decides whether
/// canonical text is written ([`Canonical`], for [`canonicalize`]) or only
/// the checks are kept ([`validate::Check`], for [`validate`]). Every
/// refusal comes from the walk or from the scalar writers both sinks share,
/// so the two accept the same texts and report the same first error.
trait Sink {
    /// The state of an open object (its members so far).
    type Object;

    /// Structural text: `[`, `]`, `,`, `[]`, `{}`.
    fn raw(&mut self, text: &'static str);

    /// Where a literal or a number is written (writing it is what checks it).
    fn scalar(&mut self) -> &mut String;

    /// Reads the string literal whose opening quote was just consumed.
    fn string(&mut self, parser: &mut Parser<'_>) -> Result<(), JsonError>;

    /// An object with at least one member opens.
    fn open_object(&mut self) -> Self::Object;

    /// A member's key (unescaped); `false` if the object already has it.
    fn key(&mut self, object: &mut Self::Object, key: String) -> bool;

    /// The value of the member whose key came last is complete.
    fn end_member(&mut self, object: &mut Self::Object);

    /// The object closes.
    fn close_object(&mut self, object: Self::Object);
}

/// An open container of the walk.
enum Frame<O> {
    Array,
    Object(O),
}

/// The sink of [`canonicalize`]. Arrays write straight into the current
/// output buffer; an object parks its parent's buffer while each member
/// value is written into a fresh one, then emits the members sorted when it
/// closes.
struct Canonical {
    out: String,
}

/// An open object of [`Canonical`].
struct CanonicalObject {
    parent: String,
    members: BTreeMap<Utf16Key, String>,
    key: Utf16Key,
}

impl Sink for Canonical {
    type Object = CanonicalObject;

    fn raw(&mut self, text: &'static str) {
        self.out.push_str(text);
    }

    fn scalar(&mut self) -> &mut String {
        &mut self.out
    }

    fn string(&mut self, parser: &mut Parser<'_>) -> Result<(), JsonError> {
        parser.string_value(&mut self.out)
    }

    fn open_object(&mut self) -> CanonicalObject {
        CanonicalObject {
            parent: std::mem::take(&mut self.out),
            members: BTreeMap::new(),
            key: Utf16Key::default(),
        }
    }

    fn key(&mut self, object: &mut CanonicalObject, key: String) -> bool {
        let key = Utf16Key(key);
        if object.members.contains_key(&key) {
            return false;
        }
        object.key = key;
        true
    }

    fn end_member(&mut self, object: &mut CanonicalObject) {
        object.members.insert(
            std::mem::take(&mut object.key),
            std::mem::take(&mut self.out),
        );
    }

    fn close_object(&mut self, object: CanonicalObject) {
        self.out = object.parent;
        self.out.push('{');
        for (i, (key, value)) in object.members.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            write_json_string(&mut self.out, &key.0);
            self.out.push(':');
            self.out.push_str(value);
        }
        self.out.push('}');
    }
}

/// Iterative parser over one JSON text. Open containers live in a heap
/// `Vec`, so hostile nesting cannot exhaust the stack.
struct Parser<'a> {
    src: &'a str,
    bytes: &'a [u8],
    pos: usize,
    numbers: Numbers,
}

impl<'a> Parser<'a> {
    /// A parser at the start of `input`, or `TooLarge` before any parsing.
    fn bounded(input: &'a str, limits: &JsonLimits, numbers: Numbers) -> Result<Self, JsonError> {
        if input.len() > limits.max_bytes {
            return Err(JsonError::TooLarge {
                size: input.len(),
                max: limits.max_bytes,
            });
        }
        Ok(Parser {
            src: input,
            bytes: input.as_bytes(),
            pos: 0,
            numbers,
        })
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    /// `Invalid` at the current byte; at end of input the reason says so.
    fn err(&self, reason: &'static str) -> JsonError {
        let reason = self.peek().map_or("unexpected end of input", |_| reason);
        JsonError::Invalid {
            offset: self.pos,
            reason,
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Consumes `byte` if it is next.
    fn bump(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.pos += usize::from(found);
        found
    }

    /// Consumes `byte` after optional whitespace if it is next.
    fn eat(&mut self, byte: u8) -> bool {
        self.skip_ws();
        self.bump(byte)
    }

    /// The canonical form of the whole text.
    fn run(&mut self, max_depth: usize) -> Result<String, JsonError> {
        let mut sink = Canonical {
            out: String::with_capacity(self.bytes.len()),
        };
        self.walk(&mut sink, max_depth)?;
        Ok(sink.out)
    }

    /// Walks the whole text (one value and nothing after it but whitespace),
    /// handing what it reads to `sink`.
    fn walk<S: Sink>(&mut self, sink: &mut S, max_depth: usize) -> Result<(), JsonError> {
        let mut stack: Vec<Frame<S::Object>> = Vec::new();
        'value: loop {
            self.skip_ws();
            match self.peek() {
                Some(b'[' | b'{') if stack.len() >= max_depth => {
                    return Err(JsonError::TooDeep { max: max_depth });
                }
                Some(b'[') => {
                    self.pos += 1;
                    if self.eat(b']') {
                        sink.raw("[]");
                    } else {
                        sink.raw("[");
                        stack.push(Frame::Array);
                        continue 'value;
                    }
                }
                Some(b'{') => {
                    self.pos += 1;
                    if self.eat(b'}') {
                        sink.raw("{}");
                    } else {
                        let mut object = sink.open_object();
                        self.member_key(sink, &mut object)?;
                        stack.push(Frame::Object(object));
                        continue 'value;
                    }
                }
                Some(b'"') => {
                    self.pos += 1;
                    sink.string(self)?;
                }
                Some(b't') => self.literal("true", sink.scalar())?,
                Some(b'f') => self.literal("false", sink.scalar())?,
                Some(b'n') => self.literal("null", sink.scalar())?,
                Some(b'-' | b'0'..=b'9') => self.number(sink.scalar())?,
                _ => return Err(self.err("expected a value")),
            }
            // A value is complete: continue or close the enclosing containers.
            loop {
                match stack.last_mut() {
                    None => {
                        self.skip_ws();
                        if self.pos < self.bytes.len() {
                            return Err(self.err("trailing characters after value"));
                        }
                        return Ok(());
                    }
                    Some(Frame::Array) => {
                        if self.eat(b',') {
                            sink.raw(",");
                            continue 'value;
                        }
                        if !self.eat(b']') {
                            return Err(self.err("expected ',' or ']'"));
                        }
                        sink.raw("]");
                    }
                    Some(Frame::Object(object)) => {
                        sink.end_member(object);
                        if self.eat(b',') {
                            self.member_key(sink, object)?;
                            continue 'value;
                        }
                        if !self.eat(b'}') {
                            return Err(self.err("expected ',' or '}'"));
                        }
                    }
                }
                if let Some(Frame::Object(object)) = stack.pop() {
                    sink.close_object(object);
                }
            }
        }
    }

    /// Parses `"key" :` and hands the key to `sink`, refusing one the
    /// object already has.
    fn member_key<S: Sink>(
        &mut self,
        sink: &mut S,
        object: &mut S::Object,
    ) -> Result<(), JsonError> {
        self.skip_ws();
        let offset = self.pos;
        if !self.bump(b'"') {
            return Err(self.err("expected a string key"));
        }
        let key = self.string()?;
        if !sink.key(object, key) {
            return Err(JsonError::DuplicateKey { offset });
        }
        if !self.eat(b':') {
            return Err(self.err("expected ':'"));
        }
        Ok(())
    }

    fn literal(&mut self, word: &'static str, out: &mut String) -> Result<(), JsonError> {
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        if !rest.starts_with(word.as_bytes()) {
            return Err(self.err("invalid literal"));
        }
        self.pos += word.len();
        out.push_str(word);
        Ok(())
    }

    /// Writes the string literal whose opening quote was just consumed, in
    /// canonical form. One without escapes is canonical as it stands (only
    /// `"`, `\\` and control characters are escaped, and a raw control
    /// character is an error): it is copied, not decoded and re-escaped.
    fn string_value(&mut self, out: &mut String) -> Result<(), JsonError> {
        let start = self.pos;
        let rest = self.bytes.get(start..).unwrap_or_default();
        if let Some(len) = rest
            .iter()
            .position(|&b| matches!(b, b'"' | b'\\' | 0..=0x1f))
        {
            if rest.get(len) == Some(&b'"') {
                // `start` and `start + len` sit next to ASCII bytes.
                let raw = self.src.get(start..start + len);
                let raw = raw.ok_or_else(|| self.err("not a char boundary"))?;
                out.reserve(len + 2);
                out.push('"');
                out.push_str(raw);
                out.push('"');
                self.pos = start + len + 1;
                return Ok(());
            }
        }
        let decoded = self.string()?;
        write_json_string(out, &decoded);
        Ok(())
    }

    /// Parses the rest of a string literal after its opening quote; returns it unescaped.
    fn string(&mut self) -> Result<String, JsonError> {
        let mut s = String::new();
        let mut run = self.pos;
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some(b'"' | b'\\') => {
                    // `run` and `pos` both sit next to ASCII bytes: char boundaries.
                    let chunk = self.src.get(run..self.pos);
                    s.push_str(chunk.ok_or_else(|| self.err("not a char boundary"))?);
                    if self.bump(b'"') {
                        return Ok(s);
                    }
                    self.escape(&mut s)?;
                    run = self.pos;
                }
                Some(0..=0x1f) => return Err(self.err("unescaped control character")),
                Some(_) => self.pos += 1,
            }
        }
    }

    /// Decodes one escape sequence starting at its backslash.
    fn escape(&mut self, s: &mut String) -> Result<(), JsonError> {
        let start = self.pos;
        self.pos += 1; // '\'
        let c = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                let lone = JsonError::Invalid {
                    offset: start,
                    reason: "unpaired surrogate escape",
                };
                let hi = self.hex4()?;
                let code = match hi {
                    0xD800..=0xDBFF => {
                        if !(self.bump(b'\\') && self.bump(b'u')) {
                            return Err(lone);
                        }
                        let lo = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return Err(lone);
                        }
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return Err(lone),
                    _ => hi,
                };
                s.push(char::from_u32(code).ok_or(lone)?);
                return Ok(());
            }
            _ => return Err(self.err("invalid escape")),
        };
        self.pos += 1;
        s.push(c);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let mut v = 0;
        for _ in 0..4 {
            let d = self.peek().and_then(|b| char::from(b).to_digit(16));
            let d = d.ok_or_else(|| self.err("invalid \\u escape"))?;
            v = v * 16 + d;
            self.pos += 1;
        }
        Ok(v)
    }

    fn digits(&mut self) -> Result<(), JsonError> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.err("expected a digit"));
        }
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        Ok(())
    }

    fn number(&mut self, out: &mut String) -> Result<(), JsonError> {
        let start = self.pos;
        self.bump(b'-');
        if !self.bump(b'0') {
            self.digits()?;
        } else if let Some(b'0'..=b'9') = self.peek() {
            return Err(self.err("leading zero in number"));
        }
        if self.bump(b'.') {
            self.digits()?;
        }
        if self.bump(b'e') || self.bump(b'E') {
            let _sign = self.bump(b'+') || self.bump(b'-');
            self.digits()?;
        }
        let text = self.src.get(start..self.pos).unwrap_or_default();
        // `str::parse::<f64>` rounds correctly; overflow yields ±inf.
        let v: f64 = text.parse().map_err(|_| self.err("malformed number"))?;
        if !v.is_finite() {
            return Err(JsonError::NonFiniteNumber { offset: start });
        }
        match self.numbers {
            Numbers::NearestDouble => write_number(out, v),
            Numbers::Exact => {
                if !write_exact(out, text) {
                    return Err(JsonError::Invalid {
                        offset: start,
                        reason: "number exponent out of range",
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(input: &str) -> Result<String, JsonError> {
        canonicalize(input, &JsonLimits::default())
    }

    fn invalid(offset: usize, reason: &'static str) -> JsonError {
        JsonError::Invalid { offset, reason }
    }

    fn nested(depth: usize) -> String {
        "[".repeat(depth) + "0" + &"]".repeat(depth)
    }

    #[test]
    fn rfc8785_sample_object() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50,
                        2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        // RFC 8785 reads 333333333.33333329 as a double (…3333333); the exact
        // form keeps the digit the double loses.
        let expected = r#"{"literals":[null,true,false],"numbers":[333333333.33333329,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
        assert_eq!(canon(input).unwrap(), expected);
        assert_eq!(canon(expected).unwrap(), expected, "idempotent");
        let rfc = expected.replace("333333333.33333329", "333333333.3333333");
        assert_eq!(
            canonicalize_legacy(input, &JsonLimits::default()).unwrap(),
            rfc
        );
    }

    #[test]
    fn rfc8785_utf16_sort_example() {
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let expected = concat!(
            r#"{"\r":"Carriage Return","1":"One","#,
            "\"\u{80}\":\"Control\",",
            "\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",",
            "\"\u{20ac}\":\"Euro Sign\",",
            "\"\u{1f600}\":\"Emoji: Grinning Face\",",
            "\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
        assert_eq!(canon(input).unwrap(), expected);
    }

    #[test]
    fn keys_sort_by_utf16_not_utf8() {
        // UTF-8 bytes would put U+FB33 (EF AC B3) before U+1F600 (F0 9F ...);
        // UTF-16 puts the surrogate D83D before FB33.
        let got = canon("{\"\u{fb33}\":1,\"\u{1f600}\":2,\"\u{ffff}\":3}").unwrap();
        assert_eq!(got, "{\"\u{1f600}\":2,\"\u{fb33}\":1,\"\u{ffff}\":3}");
        assert_eq!(
            canon(r#"{"b":0,"aa":0,"a":0,"":0,"B":0}"#).unwrap(),
            r#"{"":0,"B":0,"a":0,"aa":0,"b":0}"#
        );
    }

    #[test]
    fn semantically_equal_json_canonicalises_identically() {
        let a = canon(r#"{"b":1,"a":2.0}"#).unwrap();
        let b = canon(r#"{"a":2,"b":1}"#).unwrap();
        let c = canon(" \t\r\n{ \"b\" : 1.0e0 , \"a\" : 20E-1 }\n").unwrap();
        assert_eq!(a, r#"{"a":2,"b":1}"#);
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(
            canon(r#"{"z":{"y":[{"b":null,"a":"\u0041"}]},"a":[]}"#).unwrap(),
            r#"{"a":[],"z":{"y":[{"a":"A","b":null}]}}"#
        );
    }

    #[test]
    fn top_level_scalars_and_empty_containers() {
        for (input, expected) in [
            ("1", "1"),
            (" \"x\" ", "\"x\""),
            ("null", "null"),
            ("true", "true"),
            ("false", "false"),
            ("-0", "0"),
            ("-0.0e5", "0"),
            ("1E2", "100"),
            ("1e-400", "1e-400"), // exact: no underflow to zero
            ("[ ]", "[]"),
            ("{ }", "{}"),
            ("[{},[],{\"a\":[]}]", "[{},[],{\"a\":[]}]"),
        ] {
            assert_eq!(canon(input).unwrap(), expected, "{input}");
        }
    }

    /// (IEEE-754 bits, ECMAScript `String(x)` as printed by Node 20).
    /// The first block is RFC 8785 Appendix B; then boundaries of the
    /// layout rules; then exact ties, where Rust's shortest formatting
    /// rounds up but ECMAScript picks the even digit.
    const NUMBERS: &[(u64, &str)] = &[
        (0x0000000000000000, "0"),
        (0x8000000000000000, "0"),
        (0x0000000000000001, "5e-324"),
        (0x8000000000000001, "-5e-324"),
        (0x7fefffffffffffff, "1.7976931348623157e+308"),
        (0xffefffffffffffff, "-1.7976931348623157e+308"),
        (0x4340000000000000, "9007199254740992"),
        (0xc340000000000000, "-9007199254740992"),
        (0x4430000000000000, "295147905179352830000"),
        (0x44b52d02c7e14af5, "9.999999999999997e+22"),
        (0x44b52d02c7e14af6, "1e+23"),
        (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
        (0x444b1ae4d6e2ef4e, "999999999999999700000"),
        (0x444b1ae4d6e2ef4f, "999999999999999900000"),
        (0x444b1ae4d6e2ef50, "1e+21"),
        (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
        (0x3eb0c6f7a0b5ed8d, "0.000001"),
        (0x3eb0c6f7a0b5ed8e, "0.0000010000000000000002"),
        (0x41b3de4355555553, "333333333.3333332"),
        (0x41b3de4355555554, "333333333.33333325"),
        (0x41b3de4355555555, "333333333.3333333"),
        (0x41b3de4355555556, "333333333.3333334"),
        (0x41b3de4355555557, "333333333.33333343"),
        (0xbecbf647612f3696, "-0.0000033333333333333333"),
        (0x43143ff3c1cb0959, "1424953923781206.2"),
        // Layout boundaries and everyday values.
        (0x3e7ad7f29abcaf48, "1e-7"),
        (0x3e8421f5f40d8376, "1.5e-7"),
        (0x3ea0c6f7a0b5ed8d, "5e-7"),
        (0x3eb92a737110e454, "0.0000015"),
        (0x3eb4b3fd5942cd96, "0.000001234"),
        (0x3ee4f8b588e368f0, "0.000009999999999999999"),
        (0x3ee4f8b588e368f1, "0.00001"),
        (0x3fb999999999999a, "0.1"),
        (0xbfb999999999999a, "-0.1"),
        (0x3fd3333333333334, "0.30000000000000004"),
        (0x3fd5555555555555, "0.3333333333333333"),
        (0x3fe0000000000000, "0.5"),
        (0x400921fb54442d18, "3.141592653589793"),
        (0xc005bf0a8b145769, "-2.718281828459045"),
        (0x4011666666666666, "4.35"),
        (0x4023e66666666666, "9.95"),
        (0x4059000000000000, "100"),
        (0xbff8000000000000, "-1.5"),
        (0x405edd2f1a9fbe77, "123.456"),
        (0x41678c29dccccccd, "12345678.9"),
        (0x432fffffffffffff, "4503599627370495.5"),
        (0x4340000000000001, "9007199254740994"),
        (0x4415af1d78b58c40, "100000000000000000000"),
        (0x441ac53a7e04bcda, "123456789012345680000"),
        (0x4454542ba12a337c, "1.5e+21"),
        (0x3e10000000000000, "9.313225746154785e-10"),
        (0x3e60000000000000, "2.9802322387695312e-8"), // 2^-25, exact tie
        (0x54b249ad2594c37d, "1e+100"),
        (0xab2bff2ee48e0530, "-1e-100"),
        (0x7fe1ccf385ebc8a0, "1e+308"),
        (0x000730d67819e8d2, "1e-308"),
        (0x0010000000000000, "2.2250738585072014e-308"),
        (0x000fffffffffffff, "2.225073858507201e-308"),
        // Exact ties between two shortest candidates: round half to even.
        (0x431b7921fda87721, "1933252816936392.2"),
        (0xc2ecfe3fff006044, "-255026567578370.12"),
        (0x43172448cb0634fd, "1628454881692991.2"),
        (0x42a2ba376bf37520, "10295501519290.562"),
        (0xc31e2ae8ce1badfd, "-2122857170004863.2"),
        (0xc305baf09395111a, "-764564617732643.2"),
    ];

    #[test]
    fn numbers_match_ecmascript() {
        for &(bits, expected) in NUMBERS {
            let v = f64::from_bits(bits);
            let mut out = String::new();
            write_number(&mut out, v);
            assert_eq!(out, expected, "{bits:#018x}");
            // Through the parser, from its own text and from a long lexeme.
            assert_eq!(canon(expected).unwrap(), expected, "{bits:#018x}");
            // A long lexeme of the same double: RFC 8785 (legacy) gives the
            // double's shortest form; the exact form keeps the lexeme's value.
            let long = format!("{v:.30e}");
            let legacy = canonicalize_legacy(&long, &JsonLimits::default()).unwrap();
            assert_eq!(legacy, expected, "{bits:#018x}");
            assert_eq!(
                canonicalize_legacy(expected, &JsonLimits::default()).unwrap(),
                expected
            );
        }
    }

    #[test]
    fn numbers_keep_every_digit_and_only_the_spelling_is_normalised() {
        // Different values never share a canonical form …
        for (a, b) in [
            ("12345678901234567", "12345678901234568"),
            ("224.18827276432074", "224.18827276432071"),
            ("18446744073709551616", "18446744073709551617"),
            ("0.10000000000000000001", "0.1"),
            ("1e-400", "0"),
        ] {
            assert_ne!(canon(a).unwrap(), canon(b).unwrap(), "{a} vs {b}");
        }
        assert_eq!(canon("12345678901234567").unwrap(), "12345678901234567");
        assert_eq!(canon("224.18827276432074").unwrap(), "224.18827276432074");
        assert_eq!(
            canon("123456789012345678901234567890").unwrap(),
            "1.2345678901234567890123456789e+29"
        );
        assert_eq!(canon("1e-400").unwrap(), "1e-400");
        // … while equal values in other spellings do.
        for group in [
            &["2", "2.0", "2.000", "20e-1", "0.2E1", "0.2e+1", "200E-2"][..],
            &["0", "-0", "0.0", "-0.0e5", "0e-7"][..],
            &["-1.5", "-15e-1", "-0.15E+1"][..],
            &["100000000000000000000", "1e20", "1E+20", "10e19"][..],
            &["1e21", "1000000000000000000000", "1.0e21"][..],
            &["0.000001", "1e-6", "10e-7"][..],
            &["1e-7", "0.0000001", "1.00e-7"][..],
        ] {
            let first = canon(group[0]).unwrap();
            for other in group {
                assert_eq!(canon(other).unwrap(), first, "{other}");
            }
        }
        assert_eq!(canon("1e21").unwrap(), "1e+21");
        assert_eq!(canon("1e-7").unwrap(), "1e-7");
        // Idempotent.
        for text in [
            "1.2345678901234567890123456789e+29",
            "1e-400",
            "-0.0000033333333333333333",
        ] {
            assert_eq!(canon(text).unwrap(), text);
        }
        // Exponents beyond 32 bits are kept exactly (the value reads as a
        // finite 0.0), zero is zero whatever its exponent; exponents beyond
        // 62 bits are refused, not truncated; overflow is still refused as
        // before.
        assert_eq!(canon("1e-99999999999").unwrap(), "1e-99999999999");
        assert_eq!(canon("1e-2147483649").unwrap(), "1e-2147483649");
        assert_eq!(canon("0e2147483648").unwrap(), "0");
        assert_eq!(canon("-0.0e-99999999999999999999999").unwrap(), "0");
        assert_eq!(
            canon("1e-99999999999999999999"),
            Err(invalid(0, "number exponent out of range"))
        );
        assert_eq!(
            canon("1e400"),
            Err(JsonError::NonFiniteNumber { offset: 0 })
        );
    }

    #[test]
    fn exact_and_legacy_forms_agree_on_every_shortest_double() {
        // Every literal an ECMAScript-conformant encoder writes for a double
        // is its RFC 8785 form: for those, the digest of schema version 3 is
        // unchanged. (Other shortest forms, e.g. Rust's, which rounds exact
        // ties up, are different decimal numbers and digest differently.)
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            if !v.is_finite() {
                continue;
            }
            // The RFC 8785 text of the double is a fixed point of both forms.
            let shortest = format!("{v:e}");
            let rfc = canonicalize_legacy(&shortest, &JsonLimits::default()).unwrap();
            assert_eq!(canon(&rfc).unwrap(), rfc, "{x:#018x}");
        }
    }

    #[test]
    fn tie_rounding_only_applies_to_exact_ties() {
        // 0x3e60000000000000 is 2^-25 = 2.98023223876953125e-8 exactly: a tie.
        // One ulp up is not a tie and keeps Rust's (closest) digits.
        let mut out = String::new();
        write_number(&mut out, f64::from_bits(0x3e60000000000001));
        assert_eq!(out, "2.980232238769532e-8");
        // Odd last digits that are not ties stay odd.
        assert_eq!(
            canon("[3, 0.7, 1e+23, 17e-7]").unwrap(),
            "[3,0.7,1e+23,0.0000017]"
        );
    }

    #[test]
    fn non_finite_numbers_are_refused() {
        assert_eq!(
            canon("1e400"),
            Err(JsonError::NonFiniteNumber { offset: 0 })
        );
        assert_eq!(
            canon(r#"{"n": [0, -1.8e308]}"#),
            Err(JsonError::NonFiniteNumber { offset: 10 })
        );
        let huge = "9".repeat(400);
        assert_eq!(canon(&huge), Err(JsonError::NonFiniteNumber { offset: 0 }));
        assert_eq!(canon("NaN"), Err(invalid(0, "expected a value")));
        assert_eq!(canon("Infinity"), Err(invalid(0, "expected a value")));
        assert_eq!(canon("-Infinity"), Err(invalid(1, "expected a digit")));
    }

    #[test]
    fn string_escaping_is_minimal() {
        let mut out = String::new();
        let all_controls: String = (0u8..0x20).map(char::from).collect();
        write_json_string(&mut out, &all_controls);
        assert_eq!(
            out,
            concat!(
                r#""\u0000\u0001\u0002\u0003\u0004\u0005\u0006\u0007"#,
                r#"\b\t\n\u000b\f\r\u000e\u000f"#,
                r#"\u0010\u0011\u0012\u0013\u0014\u0015\u0016\u0017"#,
                r#"\u0018\u0019\u001a\u001b\u001c\u001d\u001e\u001f""#
            )
        );
        out.clear();
        write_json_string(&mut out, "\"\\/\u{7f}é\u{2028}\u{2029}\u{1f600}");
        assert_eq!(out, "\"\\\"\\\\/\u{7f}é\u{2028}\u{2029}\u{1f600}\"");
        assert_eq!(
            canon(r#""\/\u00e9\u2028\u001F\uD83D\uDE00""#).unwrap(),
            "\"/é\u{2028}\\u001f\u{1f600}\""
        );
    }

    #[test]
    fn surrogate_escapes() {
        assert_eq!(canon(r#""\ud83d\ude00""#).unwrap(), "\"\u{1f600}\"");
        assert_eq!(
            canon(r#"["\ud800"]"#),
            Err(invalid(2, "unpaired surrogate escape"))
        );
        for lone in [
            r#""\udc00""#,
            r#""\ude00\ud83d""#,
            r#""\ud800x""#,
            r#""\ud800\u0041""#,
            r#""\ud800\ud800""#,
            r#""\ud83d\n""#,
        ] {
            assert_eq!(
                canon(lone),
                Err(invalid(1, "unpaired surrogate escape")),
                "{lone}"
            );
        }
        assert_eq!(
            canon(r#""\ud83d"#),
            Err(invalid(1, "unpaired surrogate escape"))
        );
        assert_eq!(
            canon(r#""\ud83d\u"#),
            Err(invalid(9, "unexpected end of input"))
        );
    }

    #[test]
    fn invalid_json_reports_offset_and_reason() {
        let end = "unexpected end of input";
        for (input, offset, reason) in [
            ("", 0, end),
            ("  \n", 3, end),
            ("[", 1, end),
            ("{", 1, end),
            ("[1", 2, end),
            (r#"{"a":1"#, 6, end),
            (r#"{"a""#, 4, end),
            ("\"abc", 4, end),
            ("-", 1, end),
            ("1.", 2, end),
            ("1e+", 3, end),
            (r#""\u12"#, 5, end),
            ("[1,]", 3, "expected a value"),
            ("[,1]", 1, "expected a value"),
            (r#"{"a":1,}"#, 7, "expected a string key"),
            ("{1:2}", 1, "expected a string key"),
            ("{'a':1}", 1, "expected a string key"),
            ("[1 2]", 3, "expected ',' or ']'"),
            (r#"{"a" 1}"#, 5, "expected ':'"),
            (r#"{"a":1 "b":2}"#, 7, "expected ',' or '}'"),
            ("01", 1, "leading zero in number"),
            ("-01", 2, "leading zero in number"),
            ("1.e5", 2, "expected a digit"),
            ("1e", 2, end),
            ("1ex", 2, "expected a digit"),
            ("-a", 1, "expected a digit"),
            ("+1", 0, "expected a value"),
            (".5", 0, "expected a value"),
            ("0x10", 1, "trailing characters after value"),
            ("tru", 0, "invalid literal"),
            ("[nul]", 1, "invalid literal"),
            ("True", 0, "expected a value"),
            ("1 2", 2, "trailing characters after value"),
            ("{}x", 2, "trailing characters after value"),
            ("truex", 4, "trailing characters after value"),
            ("// c\n1", 0, "expected a value"),
            ("/* c */ 1", 0, "expected a value"),
            ("\u{feff}1", 0, "expected a value"),
            ("\u{a0}1", 0, "expected a value"),
            ("\u{c}1", 0, "expected a value"),
            ("[1]\u{b}", 3, "trailing characters after value"),
            ("\"a\nb\"", 2, "unescaped control character"),
            ("\"\t\"", 1, "unescaped control character"),
            ("\"\u{0}\"", 1, "unescaped control character"),
            (r#""\x""#, 2, "invalid escape"),
            (r#""\U0041""#, 2, "invalid escape"),
            (r#""\u12G4""#, 5, "invalid \\u escape"),
        ] {
            assert_eq!(canon(input), Err(invalid(offset, reason)), "{input:?}");
        }
    }

    #[test]
    fn duplicate_keys_are_compared_after_unescaping() {
        assert_eq!(
            canon(r#"{"a":1,"\u0061":2}"#),
            Err(JsonError::DuplicateKey { offset: 7 })
        );
        assert_eq!(
            canon(r#"{"a":1,"b":2,"a":3}"#),
            Err(JsonError::DuplicateKey { offset: 13 })
        );
        assert_eq!(
            canon(r#"{"x":{"\ud83d\ude00":1, "😀":2}}"#),
            Err(JsonError::DuplicateKey { offset: 24 })
        );
        // Same key in sibling objects, or differing only in case, is fine.
        assert_eq!(
            canon(r#"[{"a":1},{"a":2,"A":3}]"#).unwrap(),
            r#"[{"a":1},{"A":3,"a":2}]"#
        );
    }

    #[test]
    fn too_large_is_checked_before_parsing() {
        let limits = JsonLimits {
            max_bytes: 5,
            ..JsonLimits::default()
        };
        assert_eq!(canonicalize("[1,2]", &limits).unwrap(), "[1,2]");
        assert_eq!(
            canonicalize("[1, 2]", &limits),
            Err(JsonError::TooLarge { size: 6, max: 5 })
        );
        // Invalid and oversized: the size check wins.
        assert_eq!(
            canonicalize("{{{{{{", &limits),
            Err(JsonError::TooLarge { size: 6, max: 5 })
        );
        // Size is counted in UTF-8 bytes.
        assert_eq!(
            canonicalize(
                "\"éé\"",
                &JsonLimits {
                    max_bytes: 5,
                    ..limits
                }
            ),
            Err(JsonError::TooLarge { size: 6, max: 5 })
        );
    }

    #[test]
    fn depth_limit_is_exact() {
        for max_depth in [0, 1, 2, 64] {
            let limits = JsonLimits {
                max_depth,
                ..JsonLimits::default()
            };
            let at = nested(max_depth);
            assert_eq!(canonicalize(&at, &limits).unwrap(), at);
            let over = nested(max_depth + 1);
            assert_eq!(
                canonicalize(&over, &limits),
                Err(JsonError::TooDeep { max: max_depth })
            );
        }
        // Objects count too, and scalars do not.
        let limits = JsonLimits {
            max_depth: 2,
            ..JsonLimits::default()
        };
        assert!(canonicalize(r#"{"a":[1,"x",null]}"#, &limits).is_ok());
        assert_eq!(
            canonicalize(r#"[{"a":{}}]"#, &limits),
            Err(JsonError::TooDeep { max: 2 })
        );
        assert_eq!(canon(&nested(64)).unwrap(), nested(64));
        assert_eq!(canon(&nested(65)), Err(JsonError::TooDeep { max: 64 }));
    }

    #[test]
    fn hostile_nesting_is_refused_without_stack_overflow() {
        let deep = "[".repeat(100_000);
        assert_eq!(canon(&deep), Err(JsonError::TooDeep { max: 64 }));
        let deep_objects = r#"{"a":"#.repeat(100_000);
        assert_eq!(canon(&deep_objects), Err(JsonError::TooDeep { max: 64 }));
    }

    #[test]
    fn any_depth_limit_is_stack_safe() {
        // The parser keeps open containers on the heap: even with no depth
        // limit, 100k levels parse on a 64 KiB thread stack.
        let unlimited = JsonLimits {
            max_depth: usize::MAX,
            max_bytes: usize::MAX,
        };
        let handle = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                let arrays = nested(100_000);
                assert_eq!(canonicalize(&arrays, &unlimited).unwrap(), arrays);
                let objects = r#"{"k":["#.repeat(1_000) + &"]}".repeat(1_000);
                assert_eq!(canonicalize(&objects, &unlimited).unwrap(), objects);
            })
            .unwrap();
        handle.join().unwrap();
    }

    #[test]
    fn errors_never_echo_input() {
        for input in [
            r#"{"jane.doe@example.com":1,"jane.doe@example.com":2}"#,
            r#"{"jane.doe@example.com": jane}"#,
            r#"["jane.doe@example.com"#,
            "[jane.doe@example.com]",
        ] {
            let message = canon(input).unwrap_err().to_string();
            assert!(!message.contains("jane"), "{message}");
        }
        assert_eq!(
            JsonError::DuplicateKey { offset: 7 }.to_string(),
            "duplicate object key at byte 7"
        );
    }

    #[test]
    fn no_panics_on_truncations_or_mutations() {
        let doc = r#"{"a":[1,-2.5e-3,true,null,{"\u00e9\ud83d\ude00":"x\n"}],"b":"é"}"#;
        assert!(canon(doc).is_ok());
        for end in (0..doc.len()).filter(|&i| doc.is_char_boundary(i)) {
            let _ = canon(&doc[..end]);
        }
        // Deterministic pseudo-random soup of JSON-ish fragments.
        let pieces = [
            "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "d83d", "1", "-", "0", ".", "e", "+",
            " ", "true", "null", "é", "😀", "\n", "\"k\"", "1e999",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(seed % 24) {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                text.push_str(pieces[(seed >> 33) as usize % pieces.len()]);
            }
            if let Ok(out) = canon(&text) {
                assert_eq!(canon(&out).as_ref(), Ok(&out), "{text:?}");
            }
        }
    }
}

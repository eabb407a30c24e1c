//! A JSON value that keeps every number as the text it arrived in.
//!
//! `serde_json::Value` stores a number as `u64`, `i64` or `f64`, so `-0`
//! comes back as `-0.0`, an integer beyond 64 bits becomes a float and about
//! one full-precision double in ten moves in its last digit. Tool arguments
//! and tool results must reach the other side unchanged, so the provider
//! module parses into [`Json`] instead ([`super::strict::parse`]), where a
//! number is its validated source text and is written back byte for byte.
//! (The alternative, serde_json's `arbitrary_precision` feature, would change
//! number handling for every crate in the build.)
//!
//! Objects keep their members in the order they are stored: the parser stores
//! them sorted by key (UTF-8 byte order, as `serde_json`'s default map did),
//! and the renderers build envelopes in the order the provider documents
//! them. [`Json::write`] writes compact JSON with the string escaping
//! `serde_json` uses, so everything but the numbers renders exactly as
//! before.

use std::fmt::Write as _;

/// A JSON value; numbers are kept as their source text.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number as the exact text it was sent in (valid JSON number grammar,
    /// finite as a double).
    Number(String),
    /// A string (unescaped).
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object.
    Object(Object),
}

/// The members of a JSON object, in stored order, keys unique.
#[derive(Clone, Default, PartialEq, Eq)]
pub(super) struct Object {
    members: Vec<(String, Json)>,
}

/// Shows the shape only: values may be user data.
impl std::fmt::Debug for Json {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Json::Null => "null",
            Json::Bool(_) => "bool",
            Json::Number(_) => "number",
            Json::String(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        };
        write!(f, "Json::{kind}")
    }
}

impl Json {
    /// A string value.
    pub(super) fn str(text: &str) -> Json {
        Json::String(text.to_owned())
    }

    /// An object with `members` in the given order (keys must be distinct).
    pub(super) fn object<K: Into<String>>(members: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Object(Object {
            members: members.into_iter().map(|(k, v)| (k.into(), v)).collect(),
        })
    }

    /// The object, if this is one.
    pub(super) fn as_object(&self) -> Option<&Object> {
        match self {
            Json::Object(object) => Some(object),
            _ => None,
        }
    }

    /// The items, if this is an array.
    pub(super) fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(text) => Some(text),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub(super) fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(value) => Some(*value),
            _ => None,
        }
    }

    /// True for `null`.
    pub(super) fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    /// True for an object.
    pub(super) fn is_object(&self) -> bool {
        matches!(self, Json::Object(_))
    }

    /// Compact JSON text: no whitespace, members in stored order, numbers as
    /// their source text, strings escaped as `serde_json` escapes them.
    pub(super) fn to_text(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    /// Appends the compact JSON text of `self` to `out`.
    pub(super) fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Number(text) => out.push_str(text),
            Json::String(text) => write_string(out, text),
            Json::Array(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Object(object) => {
                out.push('{');
                for (index, (key, value)) in object.members.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    write_string(out, key);
                    out.push(':');
                    value.write(out);
                }
                out.push('}');
            }
        }
    }
}

impl From<Object> for Json {
    fn from(object: Object) -> Json {
        Json::Object(object)
    }
}

impl Object {
    /// An object from members that are already in the order to keep.
    pub(super) fn from_members(members: Vec<(String, Json)>) -> Object {
        Object { members }
    }

    /// The members, in stored order.
    pub(super) fn into_members(self) -> Vec<(String, Json)> {
        self.members
    }

    /// The member `key`.
    pub(super) fn get(&self, key: &str) -> Option<&Json> {
        self.members
            .iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// The member `key`, mutably.
    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        self.members
            .iter_mut()
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// True when `key` is a member.
    pub(super) fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Sets `key` to `value`: replaces an existing member in place, or
    /// appends a new one.
    pub(super) fn set(&mut self, key: &str, value: Json) {
        match self.get_mut(key) {
            Some(slot) => *slot = value,
            None => self.members.push((key.to_owned(), value)),
        }
    }
}

/// Appends `text` as a JSON string: `"` and `\` escaped, control characters
/// as `\b \t \n \f \r` or `\u00xx` (lowercase hex), everything else as is.
/// This is exactly `serde_json`'s escaping.
pub(super) fn write_string(out: &mut String, text: &str) {
    out.push('"');
    let mut start = 0;
    for (index, byte) in text.bytes().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(&text[start..index]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{byte:04x}");
        } else {
            out.push_str(escape);
        }
        start = index + 1;
    }
    out.push_str(&text[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_like_serde_json() {
        let samples = [
            "",
            "plain",
            "quote \" backslash \\ slash /",
            "\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f}\u{7f}",
            "Grüße 👋 東京 \u{2028}\u{2029}",
        ];
        for sample in samples {
            let mut ours = String::new();
            write_string(&mut ours, sample);
            assert_eq!(ours, serde_json::to_string(sample).unwrap());
        }
    }

    #[test]
    fn writes_compact_in_stored_order_with_number_text() {
        let value = Json::object([
            ("z", Json::Number("-0".into())),
            ("a", Json::Array(vec![Json::Null, Json::Bool(true)])),
            ("n", Json::Number("1.0E+40".into())),
            ("s", Json::str("x")),
        ]);
        assert_eq!(
            value.to_text(),
            r#"{"z":-0,"a":[null,true],"n":1.0E+40,"s":"x"}"#
        );
    }

    #[test]
    fn debug_hides_values() {
        assert_eq!(format!("{:?}", Json::str("secret")), "Json::string");
        assert_eq!(format!("{:?}", Json::Number("42".into())), "Json::number");
    }

    #[test]
    fn set_replaces_or_appends() {
        let mut object = Object::default();
        object.set("a", Json::Null);
        object.set("b", Json::Bool(false));
        object.set("a", Json::Bool(true));
        assert_eq!(Json::from(object).to_text(), r#"{"a":true,"b":false}"#);
    }
}

//! The arguments digest: what "the same call" means.
//!
//! Two calls are the same logical call only if their execution ids match *and*
//! their digests match. The digest is SHA-256 over the RFC 8785 canonical JSON
//! of `{"args": <arguments>, "tool": <name>, "version": <n>}`, so key order,
//! whitespace and number spelling (`2.0` vs `2`) do not matter, while any real
//! change of the arguments, the tool or its version does. Numbers are
//! compared by their exact decimal value (see [`super::canonical`]): two
//! argument objects that differ in any digit never share a digest.
//!
//! Schema version 3 digested numbers as IEEE-754 doubles
//! ([`DigestScheme::NearestDouble`]); records it stored keep that scheme and
//! are compared with it, so a replay of such a call still replays — also when
//! the arguments come from today's parser, which keeps numbers that version
//! 3's parser rewrote ([`as_version_3_parsed`]). New records use
//! [`DigestScheme::Exact`].

use super::canonical::{
    canonicalize, canonicalize_legacy, write_json_string, JsonError, JsonLimits,
};
use super::ids::ArgsDigest;

/// How a stored digest was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestScheme {
    /// Numbers read as IEEE-754 doubles (schema version 3 and before).
    NearestDouble,
    /// Numbers by their exact decimal value (every record since version 4).
    Exact,
}

impl DigestScheme {
    /// The integer stored in the database (`NULL` / 1 for
    /// [`DigestScheme::NearestDouble`], 2 for [`DigestScheme::Exact`]).
    pub fn as_i64(self) -> i64 {
        match self {
            DigestScheme::NearestDouble => 1,
            DigestScheme::Exact => 2,
        }
    }

    /// The scheme of a stored integer (a missing value is a version 3 record).
    pub fn from_stored(value: Option<i64>) -> DigestScheme {
        match value {
            Some(2) => DigestScheme::Exact,
            _ => DigestScheme::NearestDouble,
        }
    }
}

/// Arguments in canonical form together with their digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalArgs {
    /// The arguments as RFC 8785 canonical JSON text.
    pub json: String,
    /// SHA-256 of the canonical `{args, tool, version}` document.
    pub digest: ArgsDigest,
}

/// Canonicalises `arguments` (untrusted JSON text) and digests them together
/// with the tool's name and version.
///
/// # Errors
/// [`JsonError`] when the arguments are not strict JSON, repeat a key, hold a
/// non-finite number, nest deeper than `limits.max_depth` or exceed
/// `limits.max_bytes`.
pub fn digest_arguments(
    tool_name: &str,
    tool_version: u32,
    arguments: &str,
    limits: &JsonLimits,
) -> Result<CanonicalArgs, JsonError> {
    digest_with(
        DigestScheme::Exact,
        tool_name,
        tool_version,
        arguments,
        limits,
    )
}

/// [`digest_arguments`] under a given scheme (to compare a new call with a
/// record stored under [`DigestScheme::NearestDouble`]).
///
/// # Errors
/// As [`digest_arguments`].
pub fn digest_with(
    scheme: DigestScheme,
    tool_name: &str,
    tool_version: u32,
    arguments: &str,
    limits: &JsonLimits,
) -> Result<CanonicalArgs, JsonError> {
    let json = match scheme {
        DigestScheme::Exact => canonicalize(arguments, limits)?,
        DigestScheme::NearestDouble => canonicalize_legacy(arguments, limits)?,
    };
    // Keys in canonical (UTF-16) order: "args" < "tool" < "version".
    let mut doc = String::with_capacity(json.len() + tool_name.len() + 40);
    doc.push_str("{\"args\":");
    doc.push_str(&json);
    doc.push_str(",\"tool\":");
    write_json_string(&mut doc, tool_name);
    doc.push_str(",\"version\":");
    doc.push_str(&tool_version.to_string());
    doc.push('}');
    Ok(CanonicalArgs {
        digest: ArgsDigest::of_bytes(doc.as_bytes()),
        json,
    })
}

/// The arguments as the provider parser of schema version 3 handed them
/// over: read into a `serde_json::Value` with `serde_json`'s default number
/// handling and written back. That parser rewrote numbers (`-0` as `-0.0`,
/// integers beyond 64 bits as doubles, and about one 17-digit double in ten
/// moved in its last digit: `224.18827276432074` became `…071`, another
/// double), and version 3 digested what it handed over. Today's parser
/// keeps the text the model sent, so the same model response gives other
/// arguments text; comparing a record stored under
/// [`DigestScheme::NearestDouble`] with this reading too lets the same
/// request still find it. `None` when `serde_json` does not read the text
/// (version 3 could not have produced a record from it then).
///
/// This depends on `serde_json` keeping its default number handling in this
/// build: neither `arbitrary_precision` nor `float_roundtrip` may be enabled
/// in the dependency graph (a test checks it).
#[must_use]
pub fn as_version_3_parsed(arguments: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .map(|value| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(tool: &str, v: u32, args: &str) -> CanonicalArgs {
        digest_arguments(tool, v, args, &JsonLimits::default()).unwrap()
    }

    #[test]
    fn equal_json_digests_alike() {
        let a = d("pay", 1, r#"{"b":1,"a":2.0}"#);
        let b = d("pay", 1, r#"{ "a" : 2, "b" : 1 }"#);
        assert_eq!(a, b);
        assert_eq!(a.json, r#"{"a":2,"b":1}"#);
        assert_eq!(a.digest.as_str().len(), 64);
    }

    #[test]
    fn tool_version_and_args_change_the_digest() {
        let base = d("pay", 1, r#"{"amount":10}"#).digest;
        assert_ne!(base, d("pay", 2, r#"{"amount":10}"#).digest);
        assert_ne!(base, d("refund", 1, r#"{"amount":10}"#).digest);
        assert_ne!(base, d("pay", 1, r#"{"amount":11}"#).digest);
    }

    #[test]
    fn every_digit_counts_but_spelling_does_not() {
        let a = d("pay", 1, r#"{"account":12345678901234567}"#);
        let b = d("pay", 1, r#"{"account":12345678901234568}"#);
        assert_ne!(a.digest, b.digest);
        assert_eq!(a.json, r#"{"account":12345678901234567}"#);
        let legacy = |args: &str| {
            digest_with(
                DigestScheme::NearestDouble,
                "pay",
                1,
                args,
                &JsonLimits::default(),
            )
            .unwrap()
            .digest
        };
        // Version 3 could not tell them apart; records it stored keep that.
        assert_eq!(
            legacy(r#"{"account":12345678901234567}"#),
            legacy(r#"{"account":12345678901234568}"#)
        );
        // For ordinary numbers both schemes give the same digest.
        assert_eq!(
            legacy(r#"{"amount":12.5,"n":3}"#),
            d("pay", 1, r#"{"n":3.0,"amount":12.50}"#).digest
        );
    }

    #[test]
    fn known_digest_is_stable() {
        // sha256 of {"args":{"a":1},"tool":"t","version":1}
        let got = d("t", 1, r#"{"a":1}"#).digest;
        let expect = ArgsDigest::of_bytes(br#"{"args":{"a":1},"tool":"t","version":1}"#);
        assert_eq!(got, expect);
    }

    #[test]
    fn version_3_reading_is_serde_json_default_number_handling() {
        // If a crate in the graph turns on `float_roundtrip` or
        // `arbitrary_precision`, these change and records of version 3 could
        // no longer be recognised: this test is the alarm.
        assert_eq!(
            as_version_3_parsed(
                r#"{"p":224.18827276432074,"n":-0,"b":18446744073709551616,"a":1.50}"#
            )
            .as_deref(),
            Some(r#"{"a":1.5,"b":1.8446744073709552e+19,"n":-0.0,"p":224.18827276432071}"#)
        );
        assert_eq!(as_version_3_parsed("{not json"), None);
    }
}

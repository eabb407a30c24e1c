//! [`validate`]: the checks of [`super::canonicalize`] without building the
//! canonical text, for JSON that is only checked (a tool's result, a job's
//! result, a read-only call's arguments): the same grammar, the same limits,
//! the same first error (it is the same walk, [`Parser::walk`], with a sink
//! that writes nothing), and no member buffered or sorted.

use std::collections::BTreeSet;

use super::{JsonError, JsonLimits, Numbers, Parser, Sink};

/// Accepts exactly the texts [`super::canonicalize`] accepts and refuses
/// every other with the error it would report, without writing the
/// canonical form.
///
/// # Errors
/// As [`super::canonicalize`].
pub fn validate(input: &str, limits: &JsonLimits) -> Result<(), JsonError> {
    let mut check = Check {
        scratch: String::new(),
    };
    Parser::bounded(input, limits, Numbers::Exact)?.walk(&mut check, limits.max_depth)
}

/// The sink of [`validate`]: scalars are written by the same code as for
/// canonical text (which is what checks them) into one scratch buffer and
/// dropped; an object keeps its keys (unescaped) to refuse a repeated one.
pub(super) struct Check {
    scratch: String,
}

impl Sink for Check {
    type Object = BTreeSet<String>;

    fn raw(&mut self, _text: &'static str) {}

    fn scalar(&mut self) -> &mut String {
        self.scratch.clear();
        &mut self.scratch
    }

    fn string(&mut self, parser: &mut Parser<'_>) -> Result<(), JsonError> {
        parser.skip_string()
    }

    fn open_object(&mut self) -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn key(&mut self, keys: &mut BTreeSet<String>, key: String) -> bool {
        keys.insert(key)
    }

    fn end_member(&mut self, _keys: &mut BTreeSet<String>) {}

    fn close_object(&mut self, _keys: BTreeSet<String>) {}
}

impl Parser<'_> {
    /// Checks the string literal whose opening quote was just consumed, as
    /// `string_value` does, without copying it: one without escapes ends at
    /// the first `"` (a raw control character or a backslash sends it to
    /// `string`, which decodes and reports what is wrong).
    fn skip_string(&mut self) -> Result<(), JsonError> {
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        if let Some(len) = rest
            .iter()
            .position(|&b| matches!(b, b'"' | b'\\' | 0..=0x1f))
        {
            if rest.get(len) == Some(&b'"') {
                self.pos += len + 1;
                return Ok(());
            }
        }
        self.string().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::super::canonicalize;
    use super::*;

    /// A small deterministic generator (xorshift) of JSON-like text: valid
    /// documents, and the same with one byte changed, dropped or repeated.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[(self.next() % from.len() as u64) as usize]
        }

        fn value(&mut self, depth: u32, out: &mut String) {
            let kind = if depth > 3 {
                self.next() % 4
            } else {
                self.next() % 6
            };
            match kind {
                0 => out.push_str(self.pick(&[
                    "0",
                    "-0",
                    "1.5",
                    "2e3",
                    "1E400",
                    "-12345678901234567",
                    "0.1e-9999",
                    "01",
                    "1.",
                    "-",
                    "1e",
                    "3.0",
                ])),
                1 => out.push_str(self.pick(&[
                    "\"a\"",
                    "\"\\u00e9\"",
                    "\"\\ud83d\\ude00\"",
                    "\"\\ud83d\"",
                    "\"x\\n\"",
                    "\"\\q\"",
                    "\"é\"",
                    "\"\"",
                ])),
                2 => out.push_str(self.pick(&["true", "false", "null", "nul", "tru"])),
                3 => out.push_str(self.pick(&["[]", "{}", "[ ]", "{ }"])),
                4 => {
                    out.push('[');
                    for i in 0..self.next() % 4 {
                        if i > 0 {
                            out.push_str(self.pick(&[",", ", ", ",,"]));
                        }
                        self.value(depth + 1, out);
                    }
                    out.push(']');
                }
                _ => {
                    out.push('{');
                    for i in 0..self.next() % 4 {
                        if i > 0 {
                            out.push_str(self.pick(&[",", " , "]));
                        }
                        out.push_str(self.pick(&[
                            "\"a\"",
                            "\"b\"",
                            "\"\\u0061\"",
                            "\"a\\u0000\"",
                            "\"\"",
                            "a",
                        ]));
                        out.push_str(self.pick(&[":", " : ", ""]));
                        self.value(depth + 1, out);
                    }
                    out.push('}');
                }
            }
        }
    }

    #[test]
    fn validate_agrees_with_canonicalize_on_every_generated_text() {
        let limits = JsonLimits {
            max_depth: 4,
            max_bytes: 200,
        };
        let mut gen = Gen(0x9e37_79b9_7f4a_7c15);
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let mut text = String::new();
            gen.value(0, &mut text);
            let mut bytes = text.into_bytes();
            if !bytes.is_empty() && gen.next().is_multiple_of(3) {
                let at = (gen.next() % bytes.len() as u64) as usize;
                match gen.next() % 3 {
                    0 => bytes[at] = b"{}[]\",: x\\"[(gen.next() % 10) as usize],
                    1 => {
                        bytes.remove(at);
                    }
                    _ => bytes.insert(at, bytes[at]),
                }
            }
            let Ok(text) = String::from_utf8(bytes) else {
                continue;
            };
            let want = canonicalize(&text, &limits).map(|_| ());
            assert_eq!(validate(&text, &limits), want, "{text:?}");
            if want.is_ok() {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        // Both sides of the comparison were exercised.
        assert!(
            accepted > 2_000 && refused > 2_000,
            "{accepted} / {refused}"
        );
    }

    #[test]
    fn validate_reports_the_first_error_as_canonicalize_does() {
        let limits = JsonLimits::default();
        for text in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":1,"\u0061":2}"#,
            "[1e999]",
            "[1,]",
            "{\"a\":1} x",
            "\"\\ud800\"",
            "",
        ] {
            let err = validate(text, &limits).expect_err(text);
            assert_eq!(Err(err), canonicalize(text, &limits).map(|_| ()), "{text}");
        }
        let small = JsonLimits {
            max_depth: 2,
            max_bytes: 5,
        };
        assert_eq!(
            validate("[[[1]]]", &small),
            Err(JsonError::TooLarge { size: 7, max: 5 })
        );
        assert_eq!(
            validate(
                "[[[]]]",
                &JsonLimits {
                    max_bytes: 64,
                    ..small
                }
            ),
            Err(JsonError::TooDeep { max: 2 })
        );
    }
}

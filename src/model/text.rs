//! How much free text and how long a foreign id the ledger keeps
//! (docs/design.md, "Sizes of stored text").
//!
//! Two kinds of strings reach the ledger from outside besides arguments and
//! results (which have [`crate::model::JsonLimits`]):
//!
//! - **Free text**: the reason of a failure, an unknown outcome or a
//!   rejection, a batch item's error, a job's state label. It explains a
//!   step; it never decides one. A step must always be recordable, so long
//!   text is cut, never refused: [`bounded`] keeps the first bytes (at a
//!   character boundary) and says how long the whole was. A reason is also
//!   copied into the execution's log, and every later step of that execution
//!   rewrites the row, so unbounded text would make each of them cost what
//!   the text costs.
//! - **Foreign ids**: the downstream's id for an effect, a job id, a webhook's
//!   source and event id. They are matched later (a lookup by external id,
//!   a webhook event applied once), so a cut id would match the wrong thing
//!   or nothing, and an empty one would match every other empty one. They
//!   are refused instead ([`check_foreign_id`]): empty, or longer than
//!   [`MAX_FOREIGN_ID_BYTES`].

use std::borrow::Cow;

use super::ids::IdError;

/// The most bytes of a reason (or a batch item's error) the ledger stores.
pub const MAX_REASON_BYTES: usize = 4096;

/// The most bytes of a job's state label the ledger stores.
pub const MAX_LABEL_BYTES: usize = 256;

/// The longest foreign id accepted (external ids, job ids, webhook sources
/// and event ids), in bytes.
pub const MAX_FOREIGN_ID_BYTES: usize = 2048;

/// `text` itself when it fits in `max` bytes; otherwise its longest prefix
/// that ends at a character boundary and leaves room for a marker that says
/// how many bytes the whole text had, followed by that marker. The result is
/// never longer than `max` bytes (for `max` of at least 64).
#[must_use]
pub fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let marker = format!(" [cut: {} bytes in all]", text.len());
    let mut end = max.saturating_sub(marker.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + marker.len());
    out.push_str(text.get(..end).unwrap_or_default());
    out.push_str(&marker);
    Cow::Owned(out)
}

/// A reason as the ledger stores it: [`bounded`] by [`MAX_REASON_BYTES`].
#[must_use]
pub fn bounded_reason(reason: &str) -> Cow<'_, str> {
    bounded(reason, MAX_REASON_BYTES)
}

/// Checks a foreign id (`component` names it in the error).
///
/// # Errors
/// [`IdError::Empty`], or [`IdError::TooLong`] beyond
/// [`MAX_FOREIGN_ID_BYTES`].
pub fn check_foreign_id(component: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { component });
    }
    if value.len() > MAX_FOREIGN_ID_BYTES {
        return Err(IdError::TooLong {
            component,
            len: value.len(),
            max: MAX_FOREIGN_ID_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_as_it_is() {
        assert!(matches!(bounded("why", 64), Cow::Borrowed("why")));
        let exact = "x".repeat(64);
        assert_eq!(bounded(&exact, 64), exact);
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary_and_says_its_length() {
        let text = format!("{}{}", "a".repeat(40), "é".repeat(100));
        for max in 64..120 {
            let cut = bounded(&text, max);
            assert!(cut.len() <= max, "{max}: {}", cut.len());
            assert!(cut.ends_with(&format!(" [cut: {} bytes in all]", text.len())));
            let kept = cut.split(" [cut:").next().unwrap_or_default();
            assert!(text.starts_with(kept), "{max}");
        }
    }

    #[test]
    fn foreign_ids_must_be_non_empty_and_bounded() {
        assert_eq!(
            check_foreign_id("event id", ""),
            Err(IdError::Empty {
                component: "event id"
            })
        );
        let long = "e".repeat(MAX_FOREIGN_ID_BYTES + 1);
        assert_eq!(
            check_foreign_id("event id", &long),
            Err(IdError::TooLong {
                component: "event id",
                len: MAX_FOREIGN_ID_BYTES + 1,
                max: MAX_FOREIGN_ID_BYTES
            })
        );
        assert_eq!(
            check_foreign_id("event id", &"e".repeat(MAX_FOREIGN_ID_BYTES)),
            Ok(())
        );
    }
}

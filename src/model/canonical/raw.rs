//! Slices of a JSON text, without re-encoding anything: the items of an
//! independent batch go to the tool byte for byte as the model sent them.

use super::{JsonError, JsonLimits, Parser};

/// The elements of the array that is member `key` of the top-level object
/// of `text`, each as the exact slice of `text` it occupies (whitespace
/// around it trimmed). `Ok(None)` when `text` is not an object or has no such
/// array member.
///
/// # Errors
/// [`JsonError`] when `text` is not valid JSON within `limits`.
pub fn object_array_member<'a>(
    text: &'a str,
    key: &str,
    limits: &JsonLimits,
) -> Result<Option<Vec<&'a str>>, JsonError> {
    // Validates the whole text (grammar, duplicates, limits) first, so the
    // scan below only has to find boundaries.
    super::canonicalize(text, limits)?;
    let mut p = Parser {
        src: text,
        bytes: text.as_bytes(),
        pos: 0,
        numbers: super::Numbers::Exact,
    };
    if !p.eat(b'{') {
        return Ok(None);
    }
    if p.eat(b'}') {
        return Ok(None);
    }
    loop {
        p.skip_ws();
        if !p.bump(b'"') {
            return Ok(None);
        }
        let name = p.string()?;
        if !p.eat(b':') {
            return Ok(None);
        }
        p.skip_ws();
        if name == key {
            if !p.bump(b'[') {
                return Ok(None);
            }
            let mut items = Vec::new();
            if p.eat(b']') {
                return Ok(Some(items));
            }
            loop {
                p.skip_ws();
                let start = p.pos;
                p.skip_value()?;
                items.push(text.get(start..p.pos).unwrap_or_default());
                if p.eat(b',') {
                    continue;
                }
                if p.eat(b']') {
                    return Ok(Some(items));
                }
                return Ok(None);
            }
        }
        p.skip_value()?;
        if !p.eat(b',') {
            return Ok(None);
        }
    }
}

impl Parser<'_> {
    /// Moves past one (already validated) value.
    fn skip_value(&mut self) -> Result<(), JsonError> {
        let mut depth = 0usize;
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    self.string()?;
                }
                Some(b'[' | b'{') => {
                    self.pos += 1;
                    depth += 1;
                    continue;
                }
                Some(b']' | b'}') => {
                    self.pos += 1;
                    depth = depth.saturating_sub(1);
                }
                Some(b',' | b':') if depth > 0 => {
                    self.pos += 1;
                    continue;
                }
                Some(_) => {
                    while let Some(b) = self.peek() {
                        if matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r' | b':') {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                None => return Err(self.err("unexpected end of input")),
            }
            if depth == 0 {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(text: &str) -> Option<Vec<&str>> {
        object_array_member(text, "items", &JsonLimits::default()).unwrap()
    }

    #[test]
    fn items_come_back_byte_for_byte() {
        let text = r#"{ "to" : "x", "items" : [ {"n": 12345678901234567, "s":"a,]}"} , 2.50 ,"é\u00e9", [[],{}] , null ] , "z":1}"#;
        assert_eq!(
            items(text).unwrap(),
            vec![
                r#"{"n": 12345678901234567, "s":"a,]}"}"#,
                "2.50",
                r#""é\u00e9""#,
                "[[],{}]",
                "null"
            ]
        );
        assert_eq!(items(r#"{"items":[]}"#).unwrap(), Vec::<&str>::new());
        // Escaped key names count as the name they spell.
        assert_eq!(items(r#"{"\u0069tems":[1]}"#).unwrap(), vec!["1"]);
    }

    #[test]
    fn no_items_array_is_none_and_bad_json_is_an_error() {
        assert_eq!(items(r#"{"items":{}}"#), None);
        assert_eq!(items(r#"{"other":[1]}"#), None);
        assert_eq!(items(r#"[{"items":[1]}]"#), None);
        assert_eq!(items("{}"), None);
        assert!(object_array_member(r#"{"items":[1,]}"#, "items", &JsonLimits::default()).is_err());
        assert!(object_array_member(
            r#"{"items":[1],"items":[2]}"#,
            "items",
            &JsonLimits::default()
        )
        .is_err());
    }
}

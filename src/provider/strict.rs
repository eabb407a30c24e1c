//! Strict JSON parsing: duplicate object keys are an error.
//!
//! `serde_json::Value` silently keeps the last of duplicate keys. Arguments are
//! re-serialised from the parsed value before the ledger canonicalises them
//! (and its canonicaliser rejects duplicate keys), so a response carrying
//! `{"amount": 1, "amount": 1000}` would otherwise reach the ledger as a
//! clean-looking object while other readers of the same response may have seen
//! `1`. Parsing through [`from_str`] rejects such documents instead. Everything
//! else (numbers, strings, the recursion limit) is `serde_json`'s own handling.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// The message of the duplicate-key error (a fixed text, safe to show).
pub(super) const DUPLICATE_KEY: &str = "duplicate object key";

/// Parses `text` like `serde_json::from_str::<Value>`, but fails on duplicate
/// object keys.
pub(super) fn from_str(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<Strict>(text).map(|strict| strict.0)
}

/// A [`Value`] deserialised with duplicate-key checking.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

/// Builds a [`Value`], checking object keys for duplicates.
struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(DUPLICATE_KEY));
            }
            let Strict(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_values_as_serde_json() {
        let text = r#"{"a":[1,-2,3.5,1e300,18446744073709551615,true,null,"é\u00e9"],"b":{}}"#;
        assert_eq!(
            from_str(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert!(from_str("1e400").is_err());
    }

    #[test]
    fn duplicate_keys_fail_at_any_depth() {
        let err = from_str(r#"{"a":{"x":1,"x":2}}"#).unwrap_err();
        assert!(err.to_string().starts_with(DUPLICATE_KEY), "{err}");
        assert!(from_str(r#"[{"k":1},{"k":2}]"#).is_ok());
    }

    #[test]
    fn recursion_limit_still_applies() {
        let deep = format!("{}{}", "[".repeat(5_000), "]".repeat(5_000));
        assert!(from_str(&deep).is_err());
    }
}

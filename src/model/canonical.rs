//! TEMPORARY placeholder, being replaced by the strict RFC 8785 implementation.
#![allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonLimits {
    pub max_depth: usize,
    pub max_bytes: usize,
}
impl Default for JsonLimits {
    fn default() -> Self {
        JsonLimits {
            max_depth: 64,
            max_bytes: 1 << 20,
        }
    }
}
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonError {
    #[error("invalid JSON at byte {offset}: {reason}")]
    Invalid { offset: usize, reason: &'static str },
    #[error("duplicate object key at byte {offset}")]
    DuplicateKey { offset: usize },
    #[error("number at byte {offset} is not a finite IEEE-754 double")]
    NonFiniteNumber { offset: usize },
    #[error("JSON nesting deeper than {max}")]
    TooDeep { max: usize },
    #[error("JSON text of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
}
pub fn canonicalize(input: &str, limits: &JsonLimits) -> Result<String, JsonError> {
    if input.len() > limits.max_bytes {
        return Err(JsonError::TooLarge {
            size: input.len(),
            max: limits.max_bytes,
        });
    }
    let v: serde_json::Value = serde_json::from_str(input).map_err(|_| JsonError::Invalid {
        offset: 0,
        reason: "x",
    })?;
    serde_json::to_string(&v).map_err(|_| JsonError::Invalid {
        offset: 0,
        reason: "x",
    })
}
pub fn write_json_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

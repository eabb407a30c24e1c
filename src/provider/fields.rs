//! Shared helpers for walking provider JSON and rendering results.
//!
//! Every accessor takes the JSON path of what it reads so that errors can name
//! the exact field (`content[2].input`) without ever repeating a value. Paths
//! are built the way a reader would write them: `key.key[index].key`, with `$`
//! standing for the document root.

use serde::Serialize;
use serde_json::{Map, Value};

use super::error::{ProviderError, MAX_TAG_CHARS};
use super::ToolResultContent;
use crate::model::Provider;

/// A JSON object.
pub(super) type Object = Map<String, Value>;

/// One tool-call item found in a response, before it is converted.
pub(super) struct RawCall<'a> {
    /// JSON path of the item (e.g. `choices[0].message.tool_calls[1]`).
    pub(super) path: String,
    /// The item itself.
    pub(super) item: &'a Object,
}

/// `prefix.key`, or `key` at the root.
pub(super) fn key_path(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// `prefix[index]`.
pub(super) fn index_path(prefix: &str, index: usize) -> String {
    format!("{prefix}[{index}]")
}

/// The path as shown in errors: `$` for the root.
fn shown(path: &str) -> String {
    if path.is_empty() {
        "$".to_owned()
    } else {
        path.to_owned()
    }
}

/// A structural tag from the input, clipped for an error message.
pub(super) fn clip(tag: &str) -> String {
    tag.chars().take(MAX_TAG_CHARS).collect()
}

/// A description of a JSON parse error that never quotes the input.
///
/// Syntax and end-of-input messages carry a kind and a position only, as does
/// our own duplicate-key message; anything else is summarised.
pub(super) fn json_reason(err: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match err.classify() {
        Category::Syntax | Category::Eof => err.to_string(),
        Category::Io => "I/O error".to_owned(),
        Category::Data if err.to_string().starts_with(super::strict::DUPLICATE_KEY) => {
            err.to_string()
        }
        Category::Data => format!(
            "invalid data at line {} column {}",
            err.line(),
            err.column()
        ),
    }
}

/// Parses a whole response document.
pub(super) fn parse_document(provider: Provider, text: &str) -> Result<Value, ProviderError> {
    super::strict::from_str(text).map_err(|err| ProviderError::InvalidJson {
        provider,
        reason: json_reason(&err),
    })
}

/// `value` as an object, or `WrongType` naming `path`.
pub(super) fn as_object<'a>(
    provider: Provider,
    value: &'a Value,
    path: &str,
) -> Result<&'a Object, ProviderError> {
    value.as_object().ok_or_else(|| ProviderError::WrongType {
        provider,
        field: shown(path),
        expected: "object",
    })
}

/// The field, or `None` when it is absent or `null`.
pub(super) fn optional<'a>(obj: &'a Object, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|value| !value.is_null())
}

/// The field, or `MissingField` when it is absent or `null`.
pub(super) fn required<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<&'a Value, ProviderError> {
    optional(obj, key).ok_or_else(|| ProviderError::MissingField {
        provider,
        field: key_path(prefix, key),
    })
}

/// A required object field.
pub(super) fn required_object<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<&'a Object, ProviderError> {
    let value = required(provider, obj, prefix, key)?;
    as_object(provider, value, &key_path(prefix, key))
}

/// An array field that may be absent or `null` (then `None`).
pub(super) fn optional_array<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<Option<&'a [Value]>, ProviderError> {
    match optional(obj, key) {
        None => Ok(None),
        Some(value) => value
            .as_array()
            .map(|items| Some(items.as_slice()))
            .ok_or_else(|| ProviderError::WrongType {
                provider,
                field: key_path(prefix, key),
                expected: "array",
            }),
    }
}

/// A required array field.
pub(super) fn required_array<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<&'a [Value], ProviderError> {
    optional_array(provider, obj, prefix, key)?.ok_or_else(|| ProviderError::MissingField {
        provider,
        field: key_path(prefix, key),
    })
}

/// The first element of `items` (found at `path`), or `MissingField path[0]`.
pub(super) fn first<'a>(
    provider: Provider,
    items: &'a [Value],
    path: &str,
) -> Result<&'a Value, ProviderError> {
    items.first().ok_or_else(|| ProviderError::MissingField {
        provider,
        field: index_path(path, 0),
    })
}

/// A string field, present and possibly empty.
pub(super) fn required_str<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<&'a str, ProviderError> {
    required(provider, obj, prefix, key)?
        .as_str()
        .ok_or_else(|| ProviderError::WrongType {
            provider,
            field: key_path(prefix, key),
            expected: "string",
        })
}

/// A required, non-empty string field (ids and names).
pub(super) fn non_empty_str<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<&'a str, ProviderError> {
    let text = required_str(provider, obj, prefix, key)?;
    if text.is_empty() {
        return Err(ProviderError::WrongType {
            provider,
            field: key_path(prefix, key),
            expected: "non-empty string",
        });
    }
    Ok(text)
}

/// Compact JSON text of an arguments value that must be an object.
pub(super) fn arguments_from_value(
    provider: Provider,
    value: &Value,
    path: &str,
) -> Result<String, ProviderError> {
    if !value.is_object() {
        return Err(ProviderError::WrongType {
            provider,
            field: shown(path),
            expected: "object",
        });
    }
    to_json(provider, value)
}

/// Compact JSON text of a string-encoded arguments field (OpenAI): the field
/// must be a string whose text parses as a JSON object.
pub(super) fn arguments_from_text(
    provider: Provider,
    value: &Value,
    path: &str,
) -> Result<String, ProviderError> {
    let text = value.as_str().ok_or_else(|| ProviderError::WrongType {
        provider,
        field: shown(path),
        expected: "string holding JSON",
    })?;
    let parsed = super::strict::from_str(text).map_err(|err| ProviderError::ArgumentsNotJson {
        provider,
        field: shown(path),
        reason: json_reason(&err),
    })?;
    if !parsed.is_object() {
        return Err(ProviderError::WrongType {
            provider,
            field: shown(path),
            expected: "string holding a JSON object",
        });
    }
    to_json(provider, &parsed)
}

/// Compact JSON text of anything serialisable.
pub(super) fn to_json<T: Serialize + ?Sized>(
    provider: Provider,
    value: &T,
) -> Result<String, ProviderError> {
    serde_json::to_string(value).map_err(|_| ProviderError::RenderFailed { provider })
}

/// A stored tool result, parsed once for rendering.
pub(super) struct Output {
    /// The result as a JSON value.
    pub(super) value: Value,
    /// The result as text for a model: a JSON string's contents, otherwise the
    /// compact JSON text.
    pub(super) text: String,
    /// Whether the tool reported failure.
    pub(super) is_error: bool,
}

impl Output {
    /// Parses `result.output_json`.
    pub(super) fn parse(
        provider: Provider,
        result: &ToolResultContent,
    ) -> Result<Output, ProviderError> {
        let value = super::strict::from_str(&result.output_json).map_err(|err| {
            ProviderError::ResultNotJson {
                provider,
                reason: json_reason(&err),
            }
        })?;
        let text = match &value {
            Value::String(text) => text.clone(),
            other => to_json(provider, other)?,
        };
        Ok(Output {
            value,
            text,
            is_error: result.is_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_read_naturally() {
        assert_eq!(key_path("", "choices"), "choices");
        assert_eq!(
            key_path(&index_path("choices", 0), "message"),
            "choices[0].message"
        );
        assert_eq!(shown(""), "$");
    }

    #[test]
    fn clip_is_char_safe() {
        let long = "é".repeat(100);
        assert_eq!(clip(&long).chars().count(), MAX_TAG_CHARS);
    }

    #[test]
    fn json_reason_does_not_quote_input() {
        let err = serde_json::from_str::<Value>("{\"secret\": nope}").unwrap_err();
        let reason = json_reason(&err);
        assert!(
            !reason.contains("nope") && !reason.contains("secret"),
            "{reason}"
        );
        assert!(reason.contains("line 1"), "{reason}");
    }

    #[test]
    fn output_text_unwraps_json_strings_only() {
        let string = ToolResultContent {
            output_json: "\"sent \\\"ok\\\"\"".into(),
            is_error: false,
        };
        let out = Output::parse(Provider::OpenAiChat, &string).unwrap();
        assert_eq!(out.text, "sent \"ok\"");
        let object = ToolResultContent {
            output_json: "{ \"a\": [true, null],\n \"b\": 1 }".into(),
            is_error: true,
        };
        let out = Output::parse(Provider::OpenAiChat, &object).unwrap();
        assert_eq!(out.text, r#"{"a":[true,null],"b":1}"#);
        assert!(out.is_error);
    }
}

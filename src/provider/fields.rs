//! Shared helpers for walking provider JSON and rendering results.
//!
//! Every accessor takes the JSON path of what it reads so that errors can name
//! the exact field (`content[2].input`) without ever repeating a value. Paths
//! are built the way a reader would write them: `key.key[index].key`, with `$`
//! standing for the document root.

use super::error::{ProviderError, MAX_TAG_CHARS};
use super::json::Json;
use super::strict::SyntaxError;
use super::ToolResultContent;
use crate::model::Provider;

pub(super) use super::json::Object;

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
pub(super) fn shown(path: &str) -> String {
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

/// A description of a JSON syntax error: a fixed text and a position, never
/// the input.
pub(super) fn json_reason(err: &SyntaxError) -> String {
    err.to_string()
}

/// Parses a whole response document.
pub(super) fn parse_document(provider: Provider, text: &str) -> Result<Json, ProviderError> {
    super::strict::parse(text).map_err(|err| ProviderError::InvalidJson {
        provider,
        reason: json_reason(&err),
    })
}

/// `value` as an object, or `WrongType` naming `path`.
pub(super) fn as_object<'a>(
    provider: Provider,
    value: &'a Json,
    path: &str,
) -> Result<&'a Object, ProviderError> {
    value.as_object().ok_or_else(|| ProviderError::WrongType {
        provider,
        field: shown(path),
        expected: "object",
    })
}

/// The field, or `None` when it is absent or `null`.
pub(super) fn optional<'a>(obj: &'a Object, key: &str) -> Option<&'a Json> {
    obj.get(key).filter(|value| !value.is_null())
}

/// The field, or `MissingField` when it is absent or `null`.
pub(super) fn required<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<&'a Json, ProviderError> {
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

/// An object field that may be absent or `null` (then `None`).
pub(super) fn optional_object<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<Option<&'a Object>, ProviderError> {
    optional(obj, key)
        .map(|value| as_object(provider, value, &key_path(prefix, key)))
        .transpose()
}

/// An array field that may be absent or `null` (then `None`).
pub(super) fn optional_array<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<Option<&'a [Json]>, ProviderError> {
    match optional(obj, key) {
        None => Ok(None),
        Some(value) => value
            .as_array()
            .map(Some)
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
) -> Result<&'a [Json], ProviderError> {
    optional_array(provider, obj, prefix, key)?.ok_or_else(|| ProviderError::MissingField {
        provider,
        field: key_path(prefix, key),
    })
}

/// The first element of `items` (found at `path`), or `MissingField path[0]`.
pub(super) fn first<'a>(
    provider: Provider,
    items: &'a [Json],
    path: &str,
) -> Result<&'a Json, ProviderError> {
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

/// A string field that may be absent or `null` (then `None`).
pub(super) fn optional_str<'a>(
    provider: Provider,
    obj: &'a Object,
    prefix: &str,
    key: &str,
) -> Result<Option<&'a str>, ProviderError> {
    match optional(obj, key) {
        None => Ok(None),
        Some(value) => value
            .as_str()
            .map(Some)
            .ok_or_else(|| ProviderError::WrongType {
                provider,
                field: key_path(prefix, key),
                expected: "string",
            }),
    }
}

/// A boolean field; absent or `null` reads as `false`.
pub(super) fn flag(
    provider: Provider,
    obj: &Object,
    prefix: &str,
    key: &str,
) -> Result<bool, ProviderError> {
    match optional(obj, key) {
        None => Ok(false),
        Some(value) => value.as_bool().ok_or_else(|| ProviderError::WrongType {
            provider,
            field: key_path(prefix, key),
            expected: "boolean",
        }),
    }
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

/// Compact JSON text of an arguments value that must be an object. Numbers
/// keep the text they were sent in.
pub(super) fn arguments_from_value(
    provider: Provider,
    value: &Json,
    path: &str,
) -> Result<String, ProviderError> {
    if !value.is_object() {
        return Err(ProviderError::WrongType {
            provider,
            field: shown(path),
            expected: "object",
        });
    }
    Ok(value.to_text())
}

/// Compact JSON text of a string-encoded arguments field (OpenAI): the field
/// must be a string whose text parses as a JSON object.
pub(super) fn arguments_from_text(
    provider: Provider,
    value: &Json,
    path: &str,
) -> Result<String, ProviderError> {
    let text = value.as_str().ok_or_else(|| ProviderError::WrongType {
        provider,
        field: shown(path),
        expected: "string holding JSON",
    })?;
    let parsed = super::strict::parse(text).map_err(|err| ProviderError::ArgumentsNotJson {
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
    Ok(parsed.to_text())
}

/// A stored tool result, parsed once for rendering.
pub(super) struct Output {
    /// The result as a JSON value (numbers as stored).
    pub(super) value: Json,
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
        let value = super::strict::parse(&result.output_json).map_err(|err| {
            ProviderError::ResultNotJson {
                provider,
                reason: json_reason(&err),
            }
        })?;
        let text = match &value {
            Json::String(text) => text.clone(),
            other => other.to_text(),
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
        let err = super::super::strict::parse("{\"secret\": nope}").unwrap_err();
        let reason = json_reason(&err);
        assert!(
            !reason.contains("nope") && !reason.contains("secret"),
            "{reason}"
        );
        assert_eq!(reason, "expected value at line 1 column 12");
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
            output_json: "{ \"a\": [true, null, -0, 1.50],\n \"b\": 1 }".into(),
            is_error: true,
        };
        let out = Output::parse(Provider::OpenAiChat, &object).unwrap();
        assert_eq!(out.text, r#"{"a":[true,null,-0,1.50],"b":1}"#);
        assert!(out.is_error);
    }
}

//! Model Context Protocol `tools/call` over JSON-RPC 2.0.
//!
//! Input is one request `{jsonrpc: "2.0", id, method: "tools/call", params:
//! {name, arguments?}}` or a JSON-RPC batch array of them (every element must be
//! a `tools/call` request; anything else fails the parse rather than being
//! dropped unanswered). Absent `arguments` read as `{}`.
//!
//! **Call id encoding.** A JSON-RPC id is a string or a number and the response
//! must echo it with the same JSON type, but [`ToolCall::call_id`] is a plain
//! string. The call id is therefore the *JSON text* of the request id: the
//! number `7` becomes `7`, the string `"req-7"` becomes `"req-7"` including its
//! quotes (escaped as `serde_json` writes it). The renderer parses the call id
//! back as JSON, so both types round-trip unambiguously (`7` vs `"7"`).
//!
//! Results go back as a JSON-RPC response carrying a `CallToolResult`: one text
//! content block, `structuredContent` when the output is a JSON object and the
//! call succeeded (an error payload would not match the tool's `outputSchema`),
//! and `isError` always written.

use serde::Serialize;
use serde_json::Value;

use super::error::ProviderError;
use super::fields::{
    arguments_from_value, as_object, clip, index_path, key_path, non_empty_str, optional, required,
    required_object, required_str, to_json, Object, Output, RawCall,
};
use crate::model::{Provider, ToolCall};

const MCP: Provider = Provider::Mcp;

/// Finds the `tools/call` requests of a message or batch.
pub(super) fn locate(root: &Value) -> Result<Vec<RawCall<'_>>, ProviderError> {
    match root {
        Value::Array(batch) if batch.is_empty() => Err(ProviderError::WrongType {
            provider: MCP,
            field: "$".to_owned(),
            expected: "non-empty batch array",
        }),
        Value::Array(batch) => batch
            .iter()
            .enumerate()
            .map(|(index, request)| {
                let path = index_path("", index);
                let item = as_object(MCP, request, &path)?;
                check_request(item, &path)?;
                Ok(RawCall { path, item })
            })
            .collect(),
        Value::Object(item) => {
            check_request(item, "")?;
            Ok(vec![RawCall {
                path: String::new(),
                item,
            }])
        }
        _ => Err(ProviderError::WrongType {
            provider: MCP,
            field: "$".to_owned(),
            expected: "object or batch array",
        }),
    }
}

/// Checks the JSON-RPC envelope: version 2.0, method `tools/call`.
fn check_request(item: &Object, path: &str) -> Result<(), ProviderError> {
    if required_str(MCP, item, path, "jsonrpc")? != "2.0" {
        return Err(ProviderError::WrongType {
            provider: MCP,
            field: key_path(path, "jsonrpc"),
            expected: "\"2.0\"",
        });
    }
    let method = required_str(MCP, item, path, "method")?;
    if method != "tools/call" {
        return Err(ProviderError::UnsupportedMethod {
            provider: MCP,
            field: key_path(path, "method"),
            method: clip(method),
        });
    }
    Ok(())
}

/// Converts one `tools/call` request.
pub(super) fn convert(raw: &RawCall<'_>, position: u32) -> Result<ToolCall, ProviderError> {
    let call_id = match required(MCP, raw.item, &raw.path, "id")? {
        id @ Value::String(_) => to_json(MCP, id)?,
        Value::Number(number) => number.to_string(),
        _ => {
            return Err(ProviderError::WrongType {
                provider: MCP,
                field: key_path(&raw.path, "id"),
                expected: "string or number",
            })
        }
    };
    let params_path = key_path(&raw.path, "params");
    let params = required_object(MCP, raw.item, &raw.path, "params")?;
    let tool_name = non_empty_str(MCP, params, &params_path, "name")?;
    let arguments = match optional(params, "arguments") {
        None => "{}".to_owned(),
        Some(args) => arguments_from_value(MCP, args, &key_path(&params_path, "arguments"))?,
    };
    Ok(ToolCall {
        provider: MCP,
        call_id,
        call_id_derived: false,
        tool_name: tool_name.to_owned(),
        arguments,
        position,
    })
}

/// A JSON-RPC success response to `tools/call`.
#[derive(Serialize)]
pub(super) struct Response<'a> {
    jsonrpc: &'static str,
    id: Value,
    result: CallToolResult<'a>,
}

/// MCP `CallToolResult`.
#[derive(Serialize)]
struct CallToolResult<'a> {
    content: [TextContent<'a>; 1],
    #[serde(rename = "structuredContent", skip_serializing_if = "Option::is_none")]
    structured_content: Option<&'a Value>,
    #[serde(rename = "isError")]
    is_error: bool,
}

/// MCP `TextContent`.
#[derive(Serialize)]
struct TextContent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

/// The JSON-RPC response answering `call`.
pub(super) fn response<'a>(
    call: &ToolCall,
    output: &'a Output,
) -> Result<Response<'a>, ProviderError> {
    let Ok(id @ (Value::String(_) | Value::Number(_))) =
        serde_json::from_str::<Value>(&call.call_id)
    else {
        return Err(ProviderError::InvalidCallId { provider: MCP });
    };
    let structured_content = match &output.value {
        value @ Value::Object(_) if !output.is_error => Some(value),
        _ => None,
    };
    Ok(Response {
        jsonrpc: "2.0",
        id,
        result: CallToolResult {
            content: [TextContent {
                kind: "text",
                text: &output.text,
            }],
            structured_content,
            is_error: output.is_error,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::{
        parse_tool_calls, render_mcp_batch_response, render_tool_result, ParseLimits,
    };
    use super::*;

    fn parse(json: &str) -> Result<Vec<ToolCall>, ProviderError> {
        parse_tool_calls(MCP, json, 0, &ParseLimits::default())
    }

    use super::super::tests::result;

    fn call(id: &str, name: &str, args: &str, position: u32) -> ToolCall {
        super::super::tests::tool_call(MCP, id, false, name, args, position)
    }

    #[test]
    fn batch_keeps_id_types_and_defaults_arguments() {
        let json = include_str!("../../tests/fixtures/providers/mcp_batch.json");
        assert_eq!(
            parse(json).unwrap(),
            vec![
                call(
                    "7",
                    "send_email",
                    r#"{"body":"Minutes attached.","subject":"Minutes","to":"team@example.com"}"#,
                    0
                ),
                call(
                    r#""req-8""#,
                    "create_event",
                    r#"{"start":"2025-04-01T10:00:00Z","title":"Retro"}"#,
                    1
                ),
                call("9", "list_calendars", "{}", 2),
            ]
        );
    }

    #[test]
    fn single_request_with_unicode_string_id() {
        let json = include_str!("../../tests/fixtures/providers/mcp_single_unicode.json");
        assert_eq!(
            parse(json).unwrap(),
            vec![call(
                r#""réq-ü\"1\"""#,
                "get_weather",
                r#"{"city":"Zürich","note":"Grüße 👋 — 天気はどう？ \"heute\""}"#,
                0
            )]
        );
    }

    #[test]
    fn malformed_requests_name_the_field() {
        let missing = include_str!("../../tests/fixtures/providers/mcp_missing_name.json");
        assert_eq!(
            parse(missing),
            Err(ProviderError::MissingField {
                provider: MCP,
                field: "[1].params.name".into()
            })
        );
        let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert_eq!(
            parse(list),
            Err(ProviderError::UnsupportedMethod {
                provider: MCP,
                field: "method".into(),
                method: "tools/list".into()
            })
        );
        let notification = r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"f"}}"#;
        assert_eq!(
            parse(notification),
            Err(ProviderError::MissingField {
                provider: MCP,
                field: "id".into()
            })
        );
        let bad_args = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"f","arguments":"x"}}"#;
        assert_eq!(
            parse(bad_args),
            Err(ProviderError::WrongType {
                provider: MCP,
                field: "params.arguments".into(),
                expected: "object"
            })
        );
        assert!(matches!(parse("[]"), Err(ProviderError::WrongType { .. })));
        let old = r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"f"}}"#;
        assert!(
            matches!(parse(old), Err(ProviderError::WrongType { ref field, .. }) if field == "jsonrpc")
        );
    }

    #[test]
    fn renders_responses_with_original_id_type() {
        let numeric = call("7", "send_email", "{}", 0);
        let string = call(r#""req-8""#, "create_event", "{}", 1);
        let object = result(r#"{"event_id":"evt_9","status":"created"}"#, false);
        let failed = result(r#"{"code":"QUOTA","retry_after_s":30}"#, true);
        assert_eq!(
            render_tool_result(&numeric, &object).unwrap(),
            concat!(
                r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"{\"event_id\":\"evt_9\",\"status\":\"created\"}"}],"#,
                r#""structuredContent":{"event_id":"evt_9","status":"created"},"isError":false}}"#
            )
        );
        assert_eq!(
            render_tool_result(&string, &failed).unwrap(),
            r#"{"jsonrpc":"2.0","id":"req-8","result":{"content":[{"type":"text","text":"{\"code\":\"QUOTA\",\"retry_after_s\":30}"}],"isError":true}}"#
        );
        let text = result(r#""done""#, false);
        let batch = render_mcp_batch_response(&[(&string, &text), (&numeric, &text)]).unwrap();
        assert_eq!(
            batch,
            concat!(
                r#"[{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done"}],"isError":false}},"#,
                r#"{"jsonrpc":"2.0","id":"req-8","result":{"content":[{"type":"text","text":"done"}],"isError":false}}]"#
            )
        );
    }

    #[test]
    fn ids_round_trip_through_parse_and_render() {
        let json = include_str!("../../tests/fixtures/providers/mcp_single_unicode.json");
        let calls = parse(json).unwrap();
        let rendered = render_tool_result(&calls[0], &result("1", false)).unwrap();
        let value: Value = serde_json::from_str(&rendered).unwrap();
        assert_eq!(value["id"], Value::String("réq-ü\"1\"".into()));
        let bad = call("req-8", "f", "{}", 0);
        assert_eq!(
            render_tool_result(&bad, &result("1", false)),
            Err(ProviderError::InvalidCallId { provider: MCP })
        );
    }
}

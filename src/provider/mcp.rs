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
//! back as JSON, so both types round-trip unambiguously (`7` vs `"7"`), and a
//! number id keeps its exact text (`1e3` stays `1e3`).
//!
//! **Protocol versions.** Up to 2025-11-25 the version is negotiated once at
//! `initialize`; from 2026-07-28 every request names its version in
//! `params._meta["io.modelcontextprotocol/protocolVersion"]`, and every
//! result must carry `resultType`. [`McpProtocol::of_request`] reads the
//! version a request declares; [`super::render_mcp_result`] renders for a
//! given version. A request declaring a version this module does not know is
//! refused (`UnsupportedProtocolVersion`): its answer's shape is unknown. JSON-RPC
//! batches exist only up to 2025-03-26, so a batch element that declares a
//! version is refused.
//!
//! Results go back as a JSON-RPC response carrying a `CallToolResult`:
//! `resultType: "complete"` from 2026-07-28 on, one text content block,
//! `structuredContent` when the output is a JSON object and the call
//! succeeded (an error payload would not match the tool's `outputSchema`),
//! and `isError` always written.

use super::error::ProviderError;
use super::fields::{
    arguments_from_value, as_object, clip, index_path, key_path, non_empty_str, optional,
    optional_object, required, required_object, required_str, Object, Output, RawCall,
};
use super::json::Json;
use crate::model::{Provider, ToolCall};

const MCP: Provider = Provider::Mcp;

/// The `_meta` key naming a request's protocol version (2026-07-28 on).
pub(super) const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// An MCP protocol revision whose `tools/call` shapes this module was
/// checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum McpProtocol {
    /// `2024-11-05`.
    V2024_11_05,
    /// `2025-03-26`.
    V2025_03_26,
    /// `2025-06-18`.
    V2025_06_18,
    /// `2025-11-25`.
    V2025_11_25,
    /// `2026-07-28`: versions named per request; results carry `resultType`.
    V2026_07_28,
}

impl McpProtocol {
    /// Every known revision, oldest first.
    pub const ALL: [McpProtocol; 5] = [
        McpProtocol::V2024_11_05,
        McpProtocol::V2025_03_26,
        McpProtocol::V2025_06_18,
        McpProtocol::V2025_11_25,
        McpProtocol::V2026_07_28,
    ];

    /// The version string (`2026-07-28`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            McpProtocol::V2024_11_05 => "2024-11-05",
            McpProtocol::V2025_03_26 => "2025-03-26",
            McpProtocol::V2025_06_18 => "2025-06-18",
            McpProtocol::V2025_11_25 => "2025-11-25",
            McpProtocol::V2026_07_28 => "2026-07-28",
        }
    }

    /// The revision named `version`.
    ///
    /// # Errors
    ///
    /// [`ProviderError::UnsupportedProtocolVersion`] for any other string.
    pub fn parse(version: &str) -> Result<McpProtocol, ProviderError> {
        McpProtocol::ALL
            .into_iter()
            .find(|known| known.as_str() == version)
            .ok_or_else(|| ProviderError::UnsupportedProtocolVersion {
                provider: MCP,
                version: clip(version),
            })
    }

    /// The version a `tools/call` request declares in
    /// `params._meta["io.modelcontextprotocol/protocolVersion"]`, or `None`
    /// when it declares none (a request of a revision up to 2025-11-25, whose
    /// version was negotiated at `initialize`, or a batch).
    ///
    /// # Errors
    ///
    /// As [`super::parse_tool_calls`] for MCP: the same size limit, JSON and
    /// envelope checks, and [`ProviderError::UnsupportedProtocolVersion`] for
    /// an unknown version.
    pub fn of_request(
        request_json: &str,
        limits: &super::ParseLimits,
    ) -> Result<Option<McpProtocol>, ProviderError> {
        let root = super::parse_root(MCP, request_json, limits)?;
        locate(&root)?;
        match &root {
            Json::Object(request) => declared_version(request, ""),
            _ => Ok(None),
        }
    }

    /// True when results of this revision must carry `resultType`.
    fn has_result_type(self) -> bool {
        self >= McpProtocol::V2026_07_28
    }
}

/// Finds the `tools/call` requests of a message or batch.
pub(super) fn locate(root: &Json) -> Result<Vec<RawCall<'_>>, ProviderError> {
    match root {
        Json::Array(batch) if batch.is_empty() => Err(ProviderError::WrongType {
            provider: MCP,
            field: "$".to_owned(),
            expected: "non-empty batch array",
        }),
        Json::Array(batch) => batch
            .iter()
            .enumerate()
            .map(|(index, request)| {
                let path = index_path("", index);
                let item = as_object(MCP, request, &path)?;
                check_request(item, &path)?;
                if declared_version(item, &path)?.is_some() {
                    return Err(ProviderError::WrongType {
                        provider: MCP,
                        field: path,
                        expected: "a request outside a batch (its protocol version has no batches)",
                    });
                }
                Ok(RawCall { path, item })
            })
            .collect(),
        Json::Object(item) => {
            check_request(item, "")?;
            declared_version(item, "")?;
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

/// The protocol version a request declares in `params._meta`, if any.
fn declared_version(item: &Object, path: &str) -> Result<Option<McpProtocol>, ProviderError> {
    let params_path = key_path(path, "params");
    let Some(params) = optional_object(MCP, item, path, "params")? else {
        return Ok(None);
    };
    let meta_path = key_path(&params_path, "_meta");
    let Some(meta) = optional_object(MCP, params, &params_path, "_meta")? else {
        return Ok(None);
    };
    match optional(meta, PROTOCOL_VERSION_KEY) {
        None => Ok(None),
        Some(Json::String(version)) => McpProtocol::parse(version).map(Some),
        Some(_) => Err(ProviderError::WrongType {
            provider: MCP,
            field: key_path(&meta_path, PROTOCOL_VERSION_KEY),
            expected: "string",
        }),
    }
}

/// Converts one `tools/call` request.
pub(super) fn convert(raw: &RawCall<'_>, position: u32) -> Result<ToolCall, ProviderError> {
    let call_id = match required(MCP, raw.item, &raw.path, "id")? {
        id @ (Json::String(_) | Json::Number(_)) => id.to_text(),
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

/// The JSON-RPC response answering `call` under `protocol`.
pub(super) fn response(
    call: &ToolCall,
    output: &Output,
    protocol: McpProtocol,
) -> Result<Json, ProviderError> {
    let id = match super::strict::parse(&call.call_id) {
        Ok(id @ (Json::String(_) | Json::Number(_))) => id,
        _ => return Err(ProviderError::InvalidCallId { provider: MCP }),
    };
    let mut result = Vec::with_capacity(4);
    if protocol.has_result_type() {
        result.push(("resultType", Json::str("complete")));
    }
    result.push((
        "content",
        Json::Array(vec![Json::object([
            ("type", Json::str("text")),
            ("text", Json::str(&output.text)),
        ])]),
    ));
    if let (Json::Object(_), false) = (&output.value, output.is_error) {
        result.push(("structuredContent", output.value.clone()));
    }
    result.push(("isError", Json::Bool(output.is_error)));
    Ok(Json::object([
        ("jsonrpc", Json::str("2.0")),
        ("id", id),
        ("result", Json::object(result)),
    ]))
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
        let value: serde_json::Value = serde_json::from_str(&rendered).unwrap();
        assert_eq!(value["id"], serde_json::Value::String("réq-ü\"1\"".into()));
        let bad = call("req-8", "f", "{}", 0);
        assert_eq!(
            render_tool_result(&bad, &result("1", false)),
            Err(ProviderError::InvalidCallId { provider: MCP })
        );
    }

    #[test]
    fn renders_by_the_protocol_version_the_request_declares() {
        let json = include_str!("../../tests/fixtures/providers/mcp_2026_request.json");
        let limits = ParseLimits::default();
        assert_eq!(
            McpProtocol::of_request(json, &limits),
            Ok(Some(McpProtocol::V2026_07_28))
        );
        let calls = parse(json).unwrap();
        assert_eq!(
            calls,
            vec![call(
                r#""call-weather-0202""#,
                "get_weather",
                r#"{"city":"New York","date":"2026-02-02","elevation_m":10.0}"#,
                0
            )]
        );
        let stored = result(r#"{"temp_f": 72, "sky": "partly cloudy"}"#, false);
        assert_eq!(
            super::super::render_mcp_result(&calls[0], &stored, McpProtocol::V2026_07_28).unwrap(),
            concat!(
                r#"{"jsonrpc":"2.0","id":"call-weather-0202","result":{"resultType":"complete","#,
                r#""content":[{"type":"text","text":"{\"sky\":\"partly cloudy\",\"temp_f\":72}"}],"#,
                r#""structuredContent":{"sky":"partly cloudy","temp_f":72},"isError":false}}"#
            )
        );
        // Earlier revisions render exactly as render_tool_result does.
        for older in &McpProtocol::ALL[..4] {
            assert_eq!(
                super::super::render_mcp_result(&calls[0], &stored, *older),
                render_tool_result(&calls[0], &stored)
            );
        }
        let older_request = include_str!("../../tests/fixtures/providers/mcp_single_unicode.json");
        assert_eq!(McpProtocol::of_request(older_request, &limits), Ok(None));
    }

    #[test]
    fn unknown_versions_and_versioned_batch_elements_are_refused() {
        let future = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"f",
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01"}}}"#;
        let refused = Err(ProviderError::UnsupportedProtocolVersion {
            provider: MCP,
            version: "2099-01-01".into(),
        });
        assert_eq!(parse(future), refused.clone().map(|()| vec![]));
        assert_eq!(
            McpProtocol::of_request(future, &ParseLimits::default()),
            refused.map(|()| None)
        );
        let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"f",
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}]"#;
        assert!(matches!(
            parse(batch),
            Err(ProviderError::WrongType { ref field, .. }) if field == "[0]"
        ));
        assert_eq!(
            McpProtocol::parse("2025-06-18"),
            Ok(McpProtocol::V2025_06_18)
        );
        let chat_call =
            super::super::tests::tool_call(Provider::OpenAiChat, "c", false, "f", "{}", 0);
        assert_eq!(
            super::super::render_mcp_result(
                &chat_call,
                &result("1", false),
                McpProtocol::V2026_07_28
            ),
            Err(ProviderError::ProviderMismatch {
                expected: MCP,
                found: Provider::OpenAiChat
            })
        );
    }

    #[test]
    fn number_ids_keep_their_text() {
        let request = r#"{"jsonrpc":"2.0","id":1e3,"method":"tools/call","params":{"name":"f"}}"#;
        let calls = parse(request).unwrap();
        assert_eq!(calls[0].call_id, "1e3");
        assert_eq!(
            render_tool_result(&calls[0], &result(r#""ok""#, false)).unwrap(),
            r#"{"jsonrpc":"2.0","id":1e3,"result":{"content":[{"type":"text","text":"ok"}],"isError":false}}"#
        );
    }
}

//! Anthropic Messages wire format.
//!
//! A response's `content[]` is a list of typed blocks. `tool_use` blocks
//! (`{id: "toolu_…", name, input: {…}}`) are the calls the client must run.
//! Blocks the client never answers are skipped: `text`, `thinking`,
//! `redacted_thinking`, and the server tools Anthropic runs itself
//! (`server_tool_use`, `mcp_tool_use`, and their `*_tool_result` blocks). Any
//! other block type fails the parse with `UnknownBlockType`, because it might be
//! a call that would otherwise go unanswered.
//!
//! Results go back as `tool_result` blocks, all of one response's results in
//! one `user` message ([`super::render_anthropic_user_message`]). `is_error` is
//! written only when true (the API's default is false), which keeps the output
//! deterministic and minimal.

use serde::Serialize;
use serde_json::Value;

use super::error::ProviderError;
use super::fields::{
    arguments_from_value, as_object, clip, index_path, key_path, non_empty_str, required,
    required_str, Output, RawCall,
};
use crate::model::{Provider, ToolCall};

const ANTHROPIC: Provider = Provider::Anthropic;

/// Block types that need no client answer (besides `*_tool_result`).
const SKIPPED_BLOCKS: &[&str] = &[
    "text",
    "thinking",
    "redacted_thinking",
    "server_tool_use",
    "mcp_tool_use",
    "container_upload",
];

/// Finds the `tool_use` blocks of a Messages response.
pub(super) fn locate(root: &Value) -> Result<Vec<RawCall<'_>>, ProviderError> {
    let obj = as_object(ANTHROPIC, root, "")?;
    let blocks = match required(ANTHROPIC, obj, "", "content")? {
        Value::Array(blocks) => blocks,
        // A plain string content (allowed in request messages) holds no calls.
        Value::String(_) => return Ok(Vec::new()),
        _ => {
            return Err(ProviderError::WrongType {
                provider: ANTHROPIC,
                field: "content".to_owned(),
                expected: "array",
            })
        }
    };
    let mut found = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        let path = index_path("content", index);
        let block = as_object(ANTHROPIC, block, &path)?;
        let kind = required_str(ANTHROPIC, block, &path, "type")?;
        if kind == "tool_use" {
            found.push(RawCall { path, item: block });
        } else if !(SKIPPED_BLOCKS.contains(&kind) || kind.ends_with("_tool_result")) {
            return Err(ProviderError::UnknownBlockType {
                provider: ANTHROPIC,
                field: path,
                block_type: clip(kind),
            });
        }
    }
    Ok(found)
}

/// Converts one `tool_use` block.
pub(super) fn convert(raw: &RawCall<'_>, position: u32) -> Result<ToolCall, ProviderError> {
    let call_id = non_empty_str(ANTHROPIC, raw.item, &raw.path, "id")?;
    let tool_name = non_empty_str(ANTHROPIC, raw.item, &raw.path, "name")?;
    let arguments = arguments_from_value(
        ANTHROPIC,
        required(ANTHROPIC, raw.item, &raw.path, "input")?,
        &key_path(&raw.path, "input"),
    )?;
    Ok(ToolCall {
        provider: ANTHROPIC,
        call_id: call_id.to_owned(),
        call_id_derived: false,
        tool_name: tool_name.to_owned(),
        arguments,
        position,
    })
}

/// A `tool_result` content block.
#[derive(Serialize)]
pub(super) struct ToolResultBlock<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    tool_use_id: &'a str,
    content: &'a str,
    #[serde(skip_serializing_if = "is_false")]
    is_error: bool,
}

/// Serde helper: omit `is_error` when false.
#[allow(clippy::trivially_copy_pass_by_ref)] // serde passes a reference
fn is_false(value: &bool) -> bool {
    !*value
}

/// The `tool_result` block answering `call`.
pub(super) fn block<'a>(call: &'a ToolCall, output: &'a Output) -> ToolResultBlock<'a> {
    ToolResultBlock {
        kind: "tool_result",
        tool_use_id: &call.call_id,
        content: &output.text,
        is_error: output.is_error,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        parse_tool_calls, render_anthropic_user_message, render_tool_result, ParseLimits,
    };
    use super::*;

    fn parse(json: &str) -> Result<Vec<ToolCall>, ProviderError> {
        parse_tool_calls(ANTHROPIC, json, 3, &ParseLimits::default())
    }

    use super::super::tests::result;

    fn call(id: &str, name: &str, args: &str, position: u32) -> ToolCall {
        super::super::tests::tool_call(ANTHROPIC, id, false, name, args, position)
    }

    #[test]
    fn parallel_tool_use_skips_text_and_thinking() {
        let json = include_str!("../../tests/fixtures/providers/anthropic_parallel.json");
        assert_eq!(
            parse(json).unwrap(),
            vec![
                call(
                    "toolu_01A9cXq3Lm7Tz2RkVb8HwN4e",
                    "send_email",
                    r#"{"body":"Running 10 minutes late, start without me.","subject":"Running late","to":"lee@example.com"}"#,
                    0
                ),
                call(
                    "toolu_01F2kPz8Wn5Qy1JdSx6GtM3a",
                    "create_event",
                    r#"{"duration_minutes":45,"start":"2025-05-20T09:10:00-07:00","title":"1:1 with Lee"}"#,
                    1
                ),
                call(
                    "toolu_01K7bRm4Ys9Ve3HtNc2LqD8f",
                    "get_weather",
                    r#"{"city":"San Francisco","units":"imperial"}"#,
                    2
                ),
            ]
        );
    }

    #[test]
    fn unicode_input_survives() {
        let json = include_str!("../../tests/fixtures/providers/anthropic_unicode.json");
        let calls = parse(json).unwrap();
        assert_eq!(
            calls,
            vec![call(
                "toolu_01Uq5nIcOdEzXy7WvT3sRp9b",
                "create_event",
                r#"{"location":"Zürich HB","notes":"Grüße 👋 from Zürich — 会議室 3F, bring the \"blue\" folder","title":"Café ☕ mit Jürg"}"#,
                0
            )]
        );
    }

    #[test]
    fn malformed_blocks_name_the_field() {
        let unknown = include_str!("../../tests/fixtures/providers/anthropic_unknown_block.json");
        assert_eq!(
            parse(unknown),
            Err(ProviderError::UnknownBlockType {
                provider: ANTHROPIC,
                field: "content[1]".into(),
                block_type: "hologram".into()
            })
        );
        let missing = include_str!("../../tests/fixtures/providers/anthropic_missing_name.json");
        assert_eq!(
            parse(missing),
            Err(ProviderError::MissingField {
                provider: ANTHROPIC,
                field: "content[2].name".into()
            })
        );
        let string_input =
            r#"{"content":[{"type":"tool_use","id":"toolu_1","name":"f","input":"{}"}]}"#;
        assert_eq!(
            parse(string_input),
            Err(ProviderError::WrongType {
                provider: ANTHROPIC,
                field: "content[0].input".into(),
                expected: "object"
            })
        );
        let server_tools = r#"{"content":[
            {"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"x"}},
            {"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[]},
            {"type":"text","text":"done"}]}"#;
        assert_eq!(parse(server_tools).unwrap(), vec![]);
    }

    #[test]
    fn renders_blocks_and_one_user_message() {
        let first = call("toolu_01A9cXq3Lm7Tz2RkVb8HwN4e", "send_email", "{}", 0);
        let second = call("toolu_01F2kPz8Wn5Qy1JdSx6GtM3a", "create_event", "{}", 1);
        let ok = result(r#"{"event_id": "evt_77", "status": "created"}"#, false);
        let failed = result(r#""SMTP 550: mailbox unavailable""#, true);
        assert_eq!(
            render_tool_result(&first, &failed).unwrap(),
            r#"{"type":"tool_result","tool_use_id":"toolu_01A9cXq3Lm7Tz2RkVb8HwN4e","content":"SMTP 550: mailbox unavailable","is_error":true}"#
        );
        assert_eq!(
            render_tool_result(&second, &ok).unwrap(),
            r#"{"type":"tool_result","tool_use_id":"toolu_01F2kPz8Wn5Qy1JdSx6GtM3a","content":"{\"event_id\":\"evt_77\",\"status\":\"created\"}"}"#
        );
        // Handed in out of order: rendered in call order.
        let message = render_anthropic_user_message(&[(&second, &ok), (&first, &failed)]).unwrap();
        assert_eq!(
            message,
            concat!(
                r#"{"role":"user","content":["#,
                r#"{"type":"tool_result","tool_use_id":"toolu_01A9cXq3Lm7Tz2RkVb8HwN4e","content":"SMTP 550: mailbox unavailable","is_error":true},"#,
                r#"{"type":"tool_result","tool_use_id":"toolu_01F2kPz8Wn5Qy1JdSx6GtM3a","content":"{\"event_id\":\"evt_77\",\"status\":\"created\"}"}"#,
                r#"]}"#
            )
        );
        assert_eq!(
            render_anthropic_user_message(&[(&first, &failed), (&second, &ok)]).unwrap(),
            message
        );
    }
}

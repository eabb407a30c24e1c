//! Anthropic Messages wire format.
//!
//! A response's `content[]` is a list of typed blocks. `tool_use` blocks
//! (`{id: "toolu_…", name, input: {…}}`) are the calls the client must run,
//! also when code execution made them (`caller`, programmatic tool calling).
//! Blocks the client never answers are skipped: `text`, `thinking`,
//! `redacted_thinking`, `compaction`, `fallback`, `container_upload`, and the
//! server tools Anthropic runs itself (`server_tool_use`, `mcp_tool_use`, and
//! every `*_tool_result` block). Any other block type fails the parse with
//! `UnknownBlockType`, because it might be a call that would otherwise go
//! unanswered.
//!
//! A response that stopped at the token limit (`stop_reason` `max_tokens` or
//! `model_context_window_exceeded`) with a `tool_use` as its last block was
//! cut off inside that call: it is refused with `IncompleteCall`.
//!
//! Results go back as `tool_result` blocks, all of one response's results in
//! one `user` message ([`super::render_anthropic_user_message`]). `is_error` is
//! written only when true (the API's default is false), which keeps the output
//! deterministic and minimal.

use super::error::ProviderError;
use super::fields::{
    arguments_from_value, as_object, clip, index_path, key_path, non_empty_str, optional,
    optional_str, required, required_str, Output, RawCall,
};
use super::json::Json;
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
    "compaction",
    "fallback",
];

/// Stop reasons after which the last block may be cut off.
const TRUNCATING_STOP_REASONS: &[&str] = &["max_tokens", "model_context_window_exceeded"];

/// The stop reason of a turn the API stopped mid-output and says to drop:
/// none of its calls is to be run.
const REFUSAL: &str = "refusal";

/// Finds the `tool_use` blocks of a Messages response.
pub(super) fn locate(root: &Json) -> Result<Vec<RawCall<'_>>, ProviderError> {
    let obj = as_object(ANTHROPIC, root, "")?;
    // Another provider's message would read as "no blocks", its calls
    // dropped: a Chat message's `tool_calls`, a `type` other than
    // `message`.
    if optional(obj, "tool_calls").is_some() {
        return Err(ProviderError::UnknownBlockType {
            provider: ANTHROPIC,
            field: "tool_calls".to_owned(),
            block_type: "tool_calls".to_owned(),
        });
    }
    let content = required(ANTHROPIC, obj, "", "content")?;
    if let Some(kind) = optional_str(ANTHROPIC, obj, "", "type")? {
        if kind != "message" {
            return Err(ProviderError::UnknownBlockType {
                provider: ANTHROPIC,
                field: "type".to_owned(),
                block_type: clip(kind),
            });
        }
    }
    let blocks = match content {
        Json::Array(blocks) => blocks,
        // A plain string content (allowed in request messages) holds no calls.
        Json::String(_) => return Ok(Vec::new()),
        _ => {
            return Err(ProviderError::WrongType {
                provider: ANTHROPIC,
                field: "content".to_owned(),
                expected: "array",
            })
        }
    };
    let mut found = Vec::new();
    let mut last_is_call = false;
    for (index, block) in blocks.iter().enumerate() {
        let path = index_path("content", index);
        let block = as_object(ANTHROPIC, block, &path)?;
        let kind = required_str(ANTHROPIC, block, &path, "type")?;
        last_is_call = kind == "tool_use";
        if last_is_call {
            found.push(RawCall { path, item: block });
        } else if !(SKIPPED_BLOCKS.contains(&kind) || kind.ends_with("_tool_result")) {
            return Err(ProviderError::UnknownBlockType {
                provider: ANTHROPIC,
                field: path,
                block_type: clip(kind),
            });
        }
    }
    let stop_reason = optional_str(ANTHROPIC, obj, "", "stop_reason")?;
    if let (Some(REFUSAL), Some(first)) = (stop_reason, found.first()) {
        return Err(ProviderError::IncompleteCall {
            provider: ANTHROPIC,
            field: first.path.clone(),
        });
    }
    if let (true, Some(reason), Some(last)) = (last_is_call, stop_reason, found.last()) {
        if TRUNCATING_STOP_REASONS.contains(&reason) {
            return Err(ProviderError::IncompleteCall {
                provider: ANTHROPIC,
                field: last.path.clone(),
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

/// The `tool_result` block answering `call`:
/// `{"type":"tool_result","tool_use_id":…,"content":…}` plus
/// `"is_error":true` for a failure.
pub(super) fn block(call: &ToolCall, output: &Output) -> Json {
    let mut members = vec![
        ("type", Json::str("tool_result")),
        ("tool_use_id", Json::str(&call.call_id)),
        ("content", Json::str(&output.text)),
    ];
    if output.is_error {
        members.push(("is_error", Json::Bool(true)));
    }
    Json::object(members)
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

    #[test]
    fn input_numbers_keep_their_digits() {
        let json = include_str!("../../tests/fixtures/providers/anthropic_numbers.json");
        assert_eq!(
            parse(json).unwrap(),
            vec![call(
                "toolu_01Nm4XcQ8vB2rT6yHj9KpL3s",
                "transfer_funds",
                concat!(
                    r#"{"amount":224.18827276432074,"balance_delta":-0,"fee":0.30000000000000004,"#,
                    r#""fx_rate":1.0E-7,"ledger_ref":18446744073709551617,"#,
                    r#""limits":[1e2,-12.000,9007199254740993],"quantity":3.50}"#
                ),
                0
            )]
        );
    }

    #[test]
    fn a_tool_use_cut_off_at_the_token_limit_is_refused() {
        for reason in ["max_tokens", "model_context_window_exceeded"] {
            let cut = format!(
                r#"{{"content":[{{"type":"tool_use","id":"toolu_1","name":"f","input":{{}}}},
                {{"type":"tool_use","id":"toolu_2","name":"g","input":{{"to":"a"}}}}],"stop_reason":"{reason}"}}"#
            );
            assert_eq!(
                parse(&cut),
                Err(ProviderError::IncompleteCall {
                    provider: ANTHROPIC,
                    field: "content[1]".into()
                })
            );
        }
        // A call followed by text was finished before the limit.
        let text_after = r#"{"content":[{"type":"tool_use","id":"toolu_1","name":"f","input":{}},
            {"type":"text","text":"and then"}],"stop_reason":"max_tokens"}"#;
        assert_eq!(
            parse(text_after).unwrap(),
            vec![call("toolu_1", "f", "{}", 0)]
        );
    }

    #[test]
    fn compaction_and_fallback_blocks_are_skipped() {
        let json = r#"{"content":[{"type":"compaction","content":"summary"},
            {"type":"fallback","from":{"model":"a"},"to":{"model":"b"},"trigger":{"type":"refusal"}},
            {"type":"tool_use","id":"toolu_1","name":"f","input":{}}],"stop_reason":"tool_use"}"#;
        assert_eq!(parse(json).unwrap(), vec![call("toolu_1", "f", "{}", 0)]);
    }
}

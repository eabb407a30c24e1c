//! OpenAI Chat Completions wire format.
//!
//! Calls are `choices[0].message.tool_calls[]`, each `{id, type: "function",
//! function: {name, arguments}}`, the arguments a JSON *string* that must
//! itself parse as a JSON object. Only the first choice is read (toolledger
//! requests `n = 1`). A bare assistant `message` object is accepted too. A
//! call without `type` is taken as `function`; any other type (e.g. `custom`
//! free-form tools) is an `UnknownBlockType`. The deprecated single
//! `function_call` field is not read.
//!
//! A choice that ended with `finish_reason` `length` or `content_filter`
//! was cut off: its last call may hold half its arguments, so such a response
//! with calls is refused with `IncompleteCall` rather than parsed.
//!
//! Results go back as `{"role":"tool","tool_call_id":…,"content":"…"}`, the
//! content a plain string. The Responses API lives in [`super::responses`].

use super::error::ProviderError;
use super::fields::{
    arguments_from_text, as_object, clip, first, index_path, key_path, non_empty_str, optional,
    optional_array, optional_str, required, required_array, required_object, Output, RawCall,
};
use super::json::Json;
use crate::model::{Provider, ToolCall};

const CHAT: Provider = Provider::OpenAiChat;

/// Finish reasons after which the last call may be cut off.
const TRUNCATING_FINISH_REASONS: &[&str] = &["length", "content_filter"];

/// Refuses a message of another provider's format handed to the Chat
/// parser, which would otherwise read as "no calls" (its calls dropped): a
/// Chat message has no `type` (Anthropic's `"message"`, a Responses item's
/// `"function_call"`) and no `parts` (a Gemini content), its `role` (when
/// given) is `assistant`, and a `content` array holds no `tool_use` block.
fn refuse_foreign_message(
    message: &super::fields::Object,
    prefix: &str,
) -> Result<(), ProviderError> {
    let foreign = |field: &str, kind: &str| ProviderError::UnknownBlockType {
        provider: CHAT,
        field: key_path(prefix, field),
        block_type: clip(kind),
    };
    if let Some(kind) = optional(message, "type") {
        let kind = match kind {
            Json::String(kind) => kind.as_str(),
            _ => "(not a string)",
        };
        return Err(foreign("type", kind));
    }
    if optional(message, "parts").is_some() {
        return Err(foreign("parts", "parts"));
    }
    match optional_str(CHAT, message, prefix, "role")? {
        None | Some("assistant") => {}
        Some(role) => return Err(foreign("role", role)),
    }
    if let Some(Json::Array(blocks)) = optional(message, "content") {
        for (index, block) in blocks.iter().enumerate() {
            if let Json::Object(block) = block {
                if let Some(Json::String(kind)) = optional(block, "type") {
                    if kind == "tool_use" || kind == "function_call" {
                        return Err(foreign(&index_path("content", index), kind));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Finds the tool calls of a Chat Completions response (or bare message).
pub(super) fn locate_chat(root: &Json) -> Result<Vec<RawCall<'_>>, ProviderError> {
    let obj = as_object(CHAT, root, "")?;
    let (message, prefix, finish_reason) = if obj.contains_key("choices") {
        let choices = required_array(CHAT, obj, "", "choices")?;
        let choice = as_object(CHAT, first(CHAT, choices, "choices")?, "choices[0]")?;
        let message = required_object(CHAT, choice, "choices[0]", "message")?;
        let finish_reason = optional_str(CHAT, choice, "choices[0]", "finish_reason")?;
        (message, "choices[0].message".to_owned(), finish_reason)
    } else if obj.contains_key("role") || obj.contains_key("tool_calls") {
        (obj, String::new(), None)
    } else {
        return Err(ProviderError::MissingField {
            provider: CHAT,
            field: "choices".to_owned(),
        });
    };
    refuse_foreign_message(message, &prefix)?;
    let Some(items) = optional_array(CHAT, message, &prefix, "tool_calls")? else {
        return Ok(Vec::new());
    };
    let list = key_path(&prefix, "tool_calls");
    let mut found = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let path = index_path(&list, index);
        let item = as_object(CHAT, item, &path)?;
        match optional(item, "type") {
            None => {}
            Some(Json::String(kind)) if kind == "function" => {}
            Some(Json::String(kind)) => {
                return Err(ProviderError::UnknownBlockType {
                    provider: CHAT,
                    field: path,
                    block_type: clip(kind),
                })
            }
            Some(_) => {
                return Err(ProviderError::WrongType {
                    provider: CHAT,
                    field: key_path(&path, "type"),
                    expected: "string",
                })
            }
        }
        found.push(RawCall { path, item });
    }
    if let (Some(reason), Some(last)) = (finish_reason, found.last()) {
        if TRUNCATING_FINISH_REASONS.contains(&reason) {
            return Err(ProviderError::IncompleteCall {
                provider: CHAT,
                field: last.path.clone(),
            });
        }
    }
    Ok(found)
}

/// Converts one Chat Completions `tool_calls[]` entry.
pub(super) fn convert_chat(raw: &RawCall<'_>, position: u32) -> Result<ToolCall, ProviderError> {
    let call_id = non_empty_str(CHAT, raw.item, &raw.path, "id")?;
    let function = required_object(CHAT, raw.item, &raw.path, "function")?;
    let function_path = key_path(&raw.path, "function");
    let tool_name = non_empty_str(CHAT, function, &function_path, "name")?;
    let arguments = arguments_from_text(
        CHAT,
        required(CHAT, function, &function_path, "arguments")?,
        &key_path(&function_path, "arguments"),
    )?;
    Ok(ToolCall {
        provider: CHAT,
        call_id: call_id.to_owned(),
        call_id_derived: false,
        tool_name: tool_name.to_owned(),
        arguments,
        position,
    })
}

/// Renders `{"role":"tool","tool_call_id":…,"content":…}`.
pub(super) fn render_chat(call: &ToolCall, output: &Output) -> String {
    Json::object([
        ("role", Json::str("tool")),
        ("tool_call_id", Json::str(&call.call_id)),
        ("content", Json::str(&output.text)),
    ])
    .to_text()
}

#[cfg(test)]
mod tests {
    use super::super::{parse_tool_calls, render_tool_result, ParseLimits, ToolResultContent};
    use super::*;

    fn parse(provider: Provider, json: &str) -> Result<Vec<ToolCall>, ProviderError> {
        parse_tool_calls(provider, json, 0, &ParseLimits::default())
    }

    fn call(provider: Provider, id: &str, name: &str, args: &str, position: u32) -> ToolCall {
        super::super::tests::tool_call(provider, id, false, name, args, position)
    }

    #[test]
    fn chat_parallel_calls_in_order() {
        let json = include_str!("../../tests/fixtures/providers/openai_chat_parallel.json");
        let calls = parse(CHAT, json).unwrap();
        assert_eq!(
            calls,
            vec![
                call(
                    CHAT,
                    "call_Vx3kQ9mT2pL8aR1s",
                    "send_email",
                    r#"{"body":"Hi Sam, the report is attached.","subject":"Q3 report","to":"sam@example.com"}"#,
                    0
                ),
                call(
                    CHAT,
                    "call_Hd7nW4cY6bJ0eF5u",
                    "create_event",
                    r#"{"attendees":["sam@example.com","lee@example.com"],"duration_minutes":30,"start":"2025-03-14T15:00:00+01:00","title":"Q3 review"}"#,
                    1
                ),
                call(
                    CHAT,
                    "call_Pq2zM8gK5tX9vN3o",
                    "get_weather",
                    r#"{"city":"Berlin","units":"metric"}"#,
                    2
                ),
            ]
        );
    }

    #[test]
    fn chat_unicode_survives() {
        let json = include_str!("../../tests/fixtures/providers/openai_chat_unicode.json");
        let calls = parse(CHAT, json).unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(
            calls[0].arguments,
            r#"{"body":"Grüße 👋 from Zürich — 東京で会いましょう 😀","subject":"He said \"ship it\" \\o/","to":"zoë@example.ch"}"#
        );
        let args: serde_json::Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args["body"], "Grüße 👋 from Zürich — 東京で会いましょう 😀");
    }

    #[test]
    fn chat_bare_message_and_no_calls() {
        let message = r#"{"role":"assistant","content":null,"tool_calls":[
            {"id":"call_a1","type":"function","function":{"name":"get_time","arguments":"{}"}}]}"#;
        assert_eq!(
            parse(CHAT, message).unwrap(),
            vec![call(CHAT, "call_a1", "get_time", "{}", 0)]
        );
        let text_only = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}"#;
        assert_eq!(parse(CHAT, text_only).unwrap(), vec![]);
    }

    #[test]
    fn chat_malformed_cases_name_the_field() {
        // The fixture's second call was cut off at the token limit
        // (`finish_reason: length`): refused as incomplete.
        let bad = include_str!("../../tests/fixtures/providers/openai_chat_bad_arguments.json");
        assert_eq!(
            parse(CHAT, bad),
            Err(ProviderError::IncompleteCall {
                provider: CHAT,
                field: "choices[0].message.tool_calls[1]".into()
            })
        );
        // The same text without the truncating finish reason.
        let not_json = bad.replace(
            r#""finish_reason": "length""#,
            r#""finish_reason": "tool_calls""#,
        );
        assert!(matches!(
            parse(CHAT, &not_json),
            Err(ProviderError::ArgumentsNotJson { provider: CHAT, ref field, .. })
                if field == "choices[0].message.tool_calls[1].function.arguments"
        ));
        let missing = include_str!("../../tests/fixtures/providers/openai_chat_missing_name.json");
        assert_eq!(
            parse(CHAT, missing),
            Err(ProviderError::MissingField {
                provider: CHAT,
                field: "choices[0].message.tool_calls[1].function.name".into()
            })
        );
        let array_args = r#"{"choices":[{"message":{"role":"assistant","tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"f","arguments":"[1,2]"}}]}}]}"#;
        assert_eq!(
            parse(CHAT, array_args),
            Err(ProviderError::WrongType {
                provider: CHAT,
                field: "choices[0].message.tool_calls[0].function.arguments".into(),
                expected: "string holding a JSON object"
            })
        );
        let custom = r#"{"choices":[{"message":{"role":"assistant","tool_calls":[
            {"id":"call_1","type":"custom","custom":{"name":"f","input":"x"}}]}}]}"#;
        assert_eq!(
            parse(CHAT, custom),
            Err(ProviderError::UnknownBlockType {
                provider: CHAT,
                field: "choices[0].message.tool_calls[0]".into(),
                block_type: "custom".into()
            })
        );
        assert_eq!(
            parse(CHAT, r#"{"choices":[]}"#),
            Err(ProviderError::MissingField {
                provider: CHAT,
                field: "choices[0]".into()
            })
        );
        assert_eq!(
            parse(CHAT, r#"{"object":"chat.completion"}"#),
            Err(ProviderError::MissingField {
                provider: CHAT,
                field: "choices".into()
            })
        );
        let duplicate = r#"{"role":"assistant","tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}},
            {"id":"call_1","type":"function","function":{"name":"g","arguments":"{}"}}]}"#;
        assert_eq!(
            parse(CHAT, duplicate),
            Err(ProviderError::DuplicateCallId {
                provider: CHAT,
                first: 0,
                second: 1
            })
        );
    }

    #[test]
    fn truncated_choices_with_calls_are_refused() {
        let cut = r#"{"choices":[{"index":0,"finish_reason":"length","message":{"role":"assistant","tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}},
            {"id":"call_2","type":"function","function":{"name":"g","arguments":"{\"to\":\"a\"}"}}]}}]}"#;
        assert_eq!(
            parse(CHAT, cut),
            Err(ProviderError::IncompleteCall {
                provider: CHAT,
                field: "choices[0].message.tool_calls[1]".into()
            })
        );
        let text_only = r#"{"choices":[{"finish_reason":"length","message":{"role":"assistant","content":"Once upon"}}]}"#;
        assert_eq!(parse(CHAT, text_only).unwrap(), vec![]);
    }

    #[test]
    fn argument_numbers_keep_their_digits() {
        let json = r#"{"role":"assistant","tool_calls":[{"id":"call_n","type":"function","function":{"name":"pay",
            "arguments":"{\"amount\": 224.18827276432074, \"big\": 123456789012345678901234567890, \"zero\": -0, \"e\": 1E+2}"}}]}"#;
        assert_eq!(
            parse(CHAT, json).unwrap(),
            vec![call(
                CHAT,
                "call_n",
                "pay",
                r#"{"amount":224.18827276432074,"big":123456789012345678901234567890,"e":1E+2,"zero":-0}"#,
                0
            )]
        );
    }

    #[test]
    fn renders_exact_messages() {
        let chat = call(CHAT, "call_Vx3kQ9mT2pL8aR1s", "send_email", "{}", 0);
        let object = ToolResultContent {
            output_json: r#"{"message_id": "m-42", "status": "sent", "fee": 0.30000000000000004}"#
                .into(),
            is_error: false,
        };
        assert_eq!(
            render_tool_result(&chat, &object).unwrap(),
            r#"{"role":"tool","tool_call_id":"call_Vx3kQ9mT2pL8aR1s","content":"{\"fee\":0.30000000000000004,\"message_id\":\"m-42\",\"status\":\"sent\"}"}"#
        );
        let string = ToolResultContent {
            output_json: r#""SMTP refused: mailbox \"sam\" full""#.into(),
            is_error: true,
        };
        assert_eq!(
            render_tool_result(&chat, &string).unwrap(),
            r#"{"role":"tool","tool_call_id":"call_Vx3kQ9mT2pL8aR1s","content":"SMTP refused: mailbox \"sam\" full"}"#
        );
    }
}

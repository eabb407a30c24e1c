//! OpenAI wire formats: Chat Completions and the Responses API.
//!
//! Both carry a function call's arguments as a JSON *string* that must itself
//! parse as a JSON object, and both take the result back as a plain string.
//!
//! * Chat Completions: calls are `choices[0].message.tool_calls[]`, each
//!   `{id, type: "function", function: {name, arguments}}`. Only the first
//!   choice is read (toolledger requests `n = 1`). A bare assistant `message`
//!   object is accepted too. A call without `type` is taken as `function`; any
//!   other type (e.g. `custom` free-form tools) is an `UnknownBlockType`. The
//!   deprecated single `function_call` field is not read.
//! * Responses: calls are `output[]` items of type `function_call`; the
//!   correlation id is `call_id` (`id` is the item's own `fc_…` id). Items the
//!   client never answers — `message`, `reasoning`, and the hosted tools that
//!   OpenAI runs itself — are skipped. Any other item type (e.g.
//!   `computer_call`, `custom_tool_call`, `local_shell_call`) expects a client
//!   answer this module cannot give, so it fails the parse rather than being
//!   silently dropped.

use serde::Serialize;
use serde_json::Value;

use super::error::ProviderError;
use super::fields::{
    arguments_from_text, as_object, clip, first, index_path, key_path, non_empty_str, optional,
    optional_array, required, required_array, required_object, required_str, Output, RawCall,
};
use crate::model::{Provider, ToolCall};

const CHAT: Provider = Provider::OpenAiChat;
const RESPONSES: Provider = Provider::OpenAiResponses;

/// Responses API output item types that need no client answer.
const SKIPPED_OUTPUT_ITEMS: &[&str] = &[
    "message",
    "reasoning",
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
];

/// Finds the tool calls of a Chat Completions response (or bare message).
pub(super) fn locate_chat(root: &Value) -> Result<Vec<RawCall<'_>>, ProviderError> {
    let obj = as_object(CHAT, root, "")?;
    let (message, prefix) = if obj.contains_key("choices") {
        let choices = required_array(CHAT, obj, "", "choices")?;
        let choice = as_object(CHAT, first(CHAT, choices, "choices")?, "choices[0]")?;
        let message = required_object(CHAT, choice, "choices[0]", "message")?;
        (message, "choices[0].message".to_owned())
    } else if obj.contains_key("role") || obj.contains_key("tool_calls") {
        (obj, String::new())
    } else {
        return Err(ProviderError::MissingField {
            provider: CHAT,
            field: "choices".to_owned(),
        });
    };
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
            Some(Value::String(kind)) if kind == "function" => {}
            Some(Value::String(kind)) => {
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

/// Finds the `function_call` items of a Responses API response.
pub(super) fn locate_responses(root: &Value) -> Result<Vec<RawCall<'_>>, ProviderError> {
    let obj = as_object(RESPONSES, root, "")?;
    let items = required_array(RESPONSES, obj, "", "output")?;
    let mut found = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = index_path("output", index);
        let item = as_object(RESPONSES, item, &path)?;
        let kind = required_str(RESPONSES, item, &path, "type")?;
        if kind == "function_call" {
            found.push(RawCall { path, item });
        } else if !SKIPPED_OUTPUT_ITEMS.contains(&kind) {
            return Err(ProviderError::UnknownBlockType {
                provider: RESPONSES,
                field: path,
                block_type: clip(kind),
            });
        }
    }
    Ok(found)
}

/// Converts one Responses API `function_call` item.
pub(super) fn convert_responses(
    raw: &RawCall<'_>,
    position: u32,
) -> Result<ToolCall, ProviderError> {
    let call_id = non_empty_str(RESPONSES, raw.item, &raw.path, "call_id")?;
    let tool_name = non_empty_str(RESPONSES, raw.item, &raw.path, "name")?;
    let arguments = arguments_from_text(
        RESPONSES,
        required(RESPONSES, raw.item, &raw.path, "arguments")?,
        &key_path(&raw.path, "arguments"),
    )?;
    Ok(ToolCall {
        provider: RESPONSES,
        call_id: call_id.to_owned(),
        call_id_derived: false,
        tool_name: tool_name.to_owned(),
        arguments,
        position,
    })
}

/// A Chat Completions `tool` message.
#[derive(Serialize)]
struct ToolMessage<'a> {
    role: &'static str,
    tool_call_id: &'a str,
    content: &'a str,
}

/// A Responses API `function_call_output` input item.
#[derive(Serialize)]
struct FunctionCallOutput<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    call_id: &'a str,
    output: &'a str,
}

/// Renders `{"role":"tool","tool_call_id":…,"content":…}`.
pub(super) fn render_chat(call: &ToolCall, output: &Output) -> Result<String, ProviderError> {
    super::fields::to_json(
        CHAT,
        &ToolMessage {
            role: "tool",
            tool_call_id: &call.call_id,
            content: &output.text,
        },
    )
}

/// Renders `{"type":"function_call_output","call_id":…,"output":…}`.
pub(super) fn render_responses(call: &ToolCall, output: &Output) -> Result<String, ProviderError> {
    super::fields::to_json(
        RESPONSES,
        &FunctionCallOutput {
            kind: "function_call_output",
            call_id: &call.call_id,
            output: &output.text,
        },
    )
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
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
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
        let bad = include_str!("../../tests/fixtures/providers/openai_chat_bad_arguments.json");
        assert!(matches!(
            parse(CHAT, bad),
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
    fn responses_skip_reasoning_and_keep_call_id() {
        let json = include_str!("../../tests/fixtures/providers/openai_responses_parallel.json");
        let calls = parse(RESPONSES, json).unwrap();
        assert_eq!(
            calls,
            vec![
                call(
                    RESPONSES,
                    "call_9fKd2LmQ7wZx4TbN",
                    "get_weather",
                    r#"{"city":"Lisbon","units":"metric"}"#,
                    0
                ),
                call(
                    RESPONSES,
                    "call_3hRt8YpV1sGc6JuE",
                    "create_event",
                    r#"{"location":"Café Nicola, Lisboa","start":"2025-06-02T19:30:00+01:00","title":"Dinner with Ana"}"#,
                    1
                ),
            ]
        );
    }

    #[test]
    fn responses_unicode_and_malformed() {
        let json = include_str!("../../tests/fixtures/providers/openai_responses_unicode.json");
        let calls = parse(RESPONSES, json).unwrap();
        assert_eq!(
            calls,
            vec![call(
                RESPONSES,
                "call_Uu1cOdE7xYz",
                "send_message",
                r##"{"channel":"#général","text":"Grüße 👋 from Zürich, 你好，世界 and a \"quoted\" word\n"}"##,
                0
            )]
        );
        let bad =
            include_str!("../../tests/fixtures/providers/openai_responses_bad_arguments.json");
        assert!(matches!(
            parse(RESPONSES, bad),
            Err(ProviderError::ArgumentsNotJson { provider: RESPONSES, ref field, .. })
                if field == "output[1].arguments"
        ));
        let computer = r#"{"output":[{"type":"computer_call","id":"cu_1","call_id":"call_1","action":{"type":"click"}}]}"#;
        assert_eq!(
            parse(RESPONSES, computer),
            Err(ProviderError::UnknownBlockType {
                provider: RESPONSES,
                field: "output[0]".into(),
                block_type: "computer_call".into()
            })
        );
        let no_call_id =
            r#"{"output":[{"type":"function_call","id":"fc_1","name":"f","arguments":"{}"}]}"#;
        assert_eq!(
            parse(RESPONSES, no_call_id),
            Err(ProviderError::MissingField {
                provider: RESPONSES,
                field: "output[0].call_id".into()
            })
        );
    }

    #[test]
    fn renders_exact_messages() {
        let chat = call(CHAT, "call_Vx3kQ9mT2pL8aR1s", "send_email", "{}", 0);
        let object = ToolResultContent {
            output_json: r#"{"message_id": "m-42", "status": "sent"}"#.into(),
            is_error: false,
        };
        assert_eq!(
            render_tool_result(&chat, &object).unwrap(),
            r#"{"role":"tool","tool_call_id":"call_Vx3kQ9mT2pL8aR1s","content":"{\"message_id\":\"m-42\",\"status\":\"sent\"}"}"#
        );
        let string = ToolResultContent {
            output_json: r#""SMTP refused: mailbox \"sam\" full""#.into(),
            is_error: true,
        };
        assert_eq!(
            render_tool_result(&chat, &string).unwrap(),
            r#"{"role":"tool","tool_call_id":"call_Vx3kQ9mT2pL8aR1s","content":"SMTP refused: mailbox \"sam\" full"}"#
        );
        let responses = call(RESPONSES, "call_9fKd2LmQ7wZx4TbN", "get_weather", "{}", 0);
        let weather = ToolResultContent {
            output_json: r#"{"temp_c": 21.5, "sky": "clear"}"#.into(),
            is_error: false,
        };
        let first = render_tool_result(&responses, &weather).unwrap();
        assert_eq!(
            first,
            r#"{"type":"function_call_output","call_id":"call_9fKd2LmQ7wZx4TbN","output":"{\"sky\":\"clear\",\"temp_c\":21.5}"}"#
        );
        assert_eq!(render_tool_result(&responses, &weather).unwrap(), first);
    }
}

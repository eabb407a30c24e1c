//! Google Gemini `generateContent` wire format.
//!
//! Calls are the `functionCall: {name, args, id?}` parts of
//! `candidates[0].content.parts[]` (toolledger requests one candidate); text,
//! thought and other parts are skipped. A candidate without `content` or
//! `parts` (e.g. `finishReason: SAFETY`) holds no calls. `args` may be absent
//! for a function without parameters and then reads as `{}`.
//!
//! Gemini often sends no call id. Such a call gets the derived id
//! `gemini_r{round}_p{position}` with `call_id_derived = true`: stable across
//! re-parses of the same response and distinct between rounds. An empty `id`
//! counts as absent.
//!
//! Results go back as `functionResponse` parts, `id` included only for a
//! provider-given id. `response` must be a JSON object: an object result is sent
//! as is, any other value as `{"result": value}`, and a failed call's output
//! always as `{"error": value}` (the documented key for failures). The whole
//! turn is a content of role `user` ([`super::render_gemini_user_turn`]), the
//! role the current documentation uses for function responses.

use serde::Serialize;
use serde_json::{Map, Value};

use super::error::ProviderError;
use super::fields::{
    arguments_from_value, as_object, first, index_path, key_path, non_empty_str, optional,
    optional_array, required_array, Output, RawCall,
};
use crate::model::{Provider, ToolCall};

const GEMINI: Provider = Provider::Gemini;

/// Finds the `functionCall` objects of a `generateContent` response.
pub(super) fn locate(root: &Value) -> Result<Vec<RawCall<'_>>, ProviderError> {
    let obj = as_object(GEMINI, root, "")?;
    let candidates = required_array(GEMINI, obj, "", "candidates")?;
    let candidate = as_object(
        GEMINI,
        first(GEMINI, candidates, "candidates")?,
        "candidates[0]",
    )?;
    let Some(content) = optional(candidate, "content") else {
        return Ok(Vec::new());
    };
    let content_path = "candidates[0].content";
    let content = as_object(GEMINI, content, content_path)?;
    let Some(parts) = optional_array(GEMINI, content, content_path, "parts")? else {
        return Ok(Vec::new());
    };
    let parts_path = key_path(content_path, "parts");
    let mut found = Vec::new();
    for (index, part) in parts.iter().enumerate() {
        let part_path = index_path(&parts_path, index);
        let part = as_object(GEMINI, part, &part_path)?;
        if let Some(call) = optional(part, "functionCall") {
            let path = key_path(&part_path, "functionCall");
            let item = as_object(GEMINI, call, &path)?;
            found.push(RawCall { path, item });
        }
    }
    Ok(found)
}

/// Converts one `functionCall`, deriving its id when Gemini sent none.
pub(super) fn convert(
    raw: &RawCall<'_>,
    position: u32,
    round: u32,
) -> Result<ToolCall, ProviderError> {
    let tool_name = non_empty_str(GEMINI, raw.item, &raw.path, "name")?;
    let arguments = match optional(raw.item, "args") {
        None => "{}".to_owned(),
        Some(args) => arguments_from_value(GEMINI, args, &key_path(&raw.path, "args"))?,
    };
    let given_id = match optional(raw.item, "id") {
        None => None,
        Some(Value::String(id)) if id.is_empty() => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => {
            return Err(ProviderError::WrongType {
                provider: GEMINI,
                field: key_path(&raw.path, "id"),
                expected: "string",
            })
        }
    };
    let call_id_derived = given_id.is_none();
    let call_id = given_id.unwrap_or_else(|| derived_id(round, position));
    Ok(ToolCall {
        provider: GEMINI,
        call_id,
        call_id_derived,
        tool_name: tool_name.to_owned(),
        arguments,
        position,
    })
}

/// The id given to a call Gemini sent without one.
fn derived_id(round: u32, position: u32) -> String {
    format!("gemini_r{round}_p{position}")
}

/// A `functionResponse` part.
#[derive(Serialize)]
pub(super) struct FunctionResponsePart<'a> {
    #[serde(rename = "functionResponse")]
    function_response: FunctionResponse<'a>,
}

/// The body of a `functionResponse` part.
#[derive(Serialize)]
struct FunctionResponse<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    name: &'a str,
    response: Value,
}

/// The `functionResponse` part answering `call`.
pub(super) fn part<'a>(call: &'a ToolCall, output: &Output) -> FunctionResponsePart<'a> {
    let response = match &output.value {
        value if output.is_error => wrap("error", value),
        Value::Object(_) => output.value.clone(),
        value => wrap("result", value),
    };
    FunctionResponsePart {
        function_response: FunctionResponse {
            id: (!call.call_id_derived).then_some(call.call_id.as_str()),
            name: &call.tool_name,
            response,
        },
    }
}

/// `{key: value}`.
fn wrap(key: &str, value: &Value) -> Value {
    let mut map = Map::new();
    map.insert(key.to_owned(), value.clone());
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::super::{
        parse_tool_calls, render_gemini_user_turn, render_tool_result, ParseLimits,
        ToolResultContent,
    };
    use super::*;

    fn parse(json: &str, round: u32) -> Result<Vec<ToolCall>, ProviderError> {
        parse_tool_calls(GEMINI, json, round, &ParseLimits::default())
    }

    fn call(id: &str, derived: bool, name: &str, args: &str, position: u32) -> ToolCall {
        super::super::tests::tool_call(GEMINI, id, derived, name, args, position)
    }

    #[test]
    fn parallel_calls_without_ids_get_derived_ids() {
        let json = include_str!("../../tests/fixtures/providers/gemini_parallel_no_ids.json");
        let calls = parse(json, 2).unwrap();
        assert_eq!(
            calls,
            vec![
                call(
                    "gemini_r2_p0",
                    true,
                    "send_email",
                    r#"{"body":"Landing at 18:40, see you at the gate.","subject":"Flight update","to":"maria@example.com"}"#,
                    0
                ),
                call(
                    "gemini_r2_p1",
                    true,
                    "create_event",
                    r#"{"start":"2025-09-12T18:40:00+02:00","title":"Pick up Maria"}"#,
                    1
                ),
                call(
                    "gemini_r2_p2",
                    true,
                    "get_weather",
                    r#"{"city":"Madrid"}"#,
                    2
                ),
            ]
        );
        // Stable across parses, different per round.
        assert_eq!(parse(json, 2).unwrap(), calls);
        let next_round = parse(json, 3).unwrap();
        assert_eq!(next_round[0].call_id, "gemini_r3_p0");
        assert_ne!(next_round[0].call_id, calls[0].call_id);
    }

    #[test]
    fn provider_ids_and_missing_args() {
        let json = include_str!("../../tests/fixtures/providers/gemini_with_ids.json");
        assert_eq!(
            parse(json, 0).unwrap(),
            vec![
                call(
                    "fc-7b1e2c94",
                    false,
                    "get_weather",
                    r#"{"city":"Tokyo"}"#,
                    0
                ),
                call("fc-0d5a9f13", false, "list_reminders", "{}", 1),
            ]
        );
    }

    #[test]
    fn unicode_args_survive() {
        let json = include_str!("../../tests/fixtures/providers/gemini_unicode.json");
        assert_eq!(
            parse(json, 1).unwrap(),
            vec![call(
                "gemini_r1_p0",
                true,
                "send_message",
                r#"{"text":"Grüße 👋 from Zürich! 明天见 — \"quotes\" & \\backslash","to":"+41 44 123 45 67"}"#,
                0
            )]
        );
    }

    #[test]
    fn malformed_and_empty_candidates() {
        let missing = include_str!("../../tests/fixtures/providers/gemini_missing_name.json");
        assert_eq!(
            parse(missing, 0),
            Err(ProviderError::MissingField {
                provider: GEMINI,
                field: "candidates[0].content.parts[1].functionCall.name".into()
            })
        );
        let list_args = r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"f","args":[1]}}]}}]}"#;
        assert_eq!(
            parse(list_args, 0),
            Err(ProviderError::WrongType {
                provider: GEMINI,
                field: "candidates[0].content.parts[0].functionCall.args".into(),
                expected: "object"
            })
        );
        let blocked = r#"{"candidates":[{"finishReason":"SAFETY","index":0}]}"#;
        assert_eq!(parse(blocked, 0).unwrap(), vec![]);
        assert_eq!(
            parse(r#"{"promptFeedback":{"blockReason":"SAFETY"}}"#, 0),
            Err(ProviderError::MissingField {
                provider: GEMINI,
                field: "candidates".into()
            })
        );
    }

    #[test]
    fn renders_function_responses() {
        let derived = call("gemini_r2_p2", true, "get_weather", "{}", 2);
        let given = call("fc-7b1e2c94", false, "get_weather", "{}", 0);
        let object = ToolResultContent {
            output_json: r#"{"sky":"sunny","temp_c":31}"#.into(),
            is_error: false,
        };
        let scalar = ToolResultContent {
            output_json: "42".into(),
            is_error: false,
        };
        let failed = ToolResultContent {
            output_json: r#""weather service timed out""#.into(),
            is_error: true,
        };
        assert_eq!(
            render_tool_result(&derived, &object).unwrap(),
            r#"{"functionResponse":{"name":"get_weather","response":{"sky":"sunny","temp_c":31}}}"#
        );
        assert_eq!(
            render_tool_result(&given, &scalar).unwrap(),
            r#"{"functionResponse":{"id":"fc-7b1e2c94","name":"get_weather","response":{"result":42}}}"#
        );
        assert_eq!(
            render_tool_result(&given, &failed).unwrap(),
            r#"{"functionResponse":{"id":"fc-7b1e2c94","name":"get_weather","response":{"error":"weather service timed out"}}}"#
        );
        let turn = render_gemini_user_turn(&[(&derived, &object), (&given, &failed)]).unwrap();
        assert_eq!(
            turn,
            concat!(
                r#"{"role":"user","parts":["#,
                r#"{"functionResponse":{"id":"fc-7b1e2c94","name":"get_weather","response":{"error":"weather service timed out"}}},"#,
                r#"{"functionResponse":{"name":"get_weather","response":{"sky":"sunny","temp_c":31}}}"#,
                r#"]}"#
            )
        );
    }
}

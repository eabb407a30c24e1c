//! Google Gemini `generateContent` wire format.
//!
//! Calls are the `functionCall: {name, args, id?}` parts of
//! `candidates[0].content.parts[]` (toolledger requests one candidate); text,
//! thought, code-execution and server `toolCall`/`toolResponse` parts are
//! skipped. A candidate without `content` or `parts` (e.g. `finishReason:
//! SAFETY`) holds no calls. `args` may be absent for a function without
//! parameters and then reads as `{}`.
//!
//! **Calls the server already ran.** With server-side MCP tools declared, the
//! model turn holds a `functionCall`, the `functionResponse` the API got by
//! running it, and the final text. A call answered in the same turn is not
//! the client's to run and is skipped: a `functionResponse` with an `id`
//! answers the call with that id (one naming the id of another tool's call
//! refuses the turn); one without answers the earliest call
//! before it of the same name that is still unanswered. A call left
//! unanswered of a tool the API answered in the same turn is refused
//! (`UnansweredServerCall`): it is as likely the API's call whose answer is
//! missing as the client's, and neither running it nor dropping it is safe.
//!
//! **Streamed fragments.** With `streamFunctionCallArguments`, a call arrives
//! in pieces: `{name, willContinue: true}`, then `{partialArgs: […],
//! willContinue: true}` parts, then `{}`. A single response holding such a
//! piece is refused with `IncompleteCall` (never read as a call with `{}`
//! arguments); [`super::StreamAssembler`] joins the pieces. A candidate
//! without `finishReason` is a stream chunk (the API documents an empty
//! finish reason as "the model has not stopped generating"), so a call in
//! it is refused with `IncompleteCall` too: the API's answer to it may come
//! in a later chunk, which only the assembler sees.
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

use std::collections::{HashMap, HashSet, VecDeque};

use super::error::ProviderError;
use super::fields::{
    arguments_from_value, as_object, first, flag, index_path, key_path, non_empty_str, optional,
    optional_array, optional_str, required_array, Object, Output, RawCall,
};
use super::json::Json;
use crate::model::{Provider, ToolCall};

const GEMINI: Provider = Provider::Gemini;

/// The first candidate of a response: its `parts` (with their path) and
/// whether it carries a `finishReason`. No parts when the candidate has no
/// content.
struct Candidate<'a> {
    parts: &'a [Json],
    parts_path: String,
    finished: bool,
    /// Ended with `STOP`, the one reason after which the turn's calls are
    /// whole and meant: `MAX_TOKENS` may cut the last one, the safety and
    /// blocklist family, `MALFORMED_FUNCTION_CALL` and the rest end a turn
    /// that is not to be acted on.
    stopped: bool,
}

/// Reads the first candidate of a `generateContent` response.
fn candidate(root: &Json) -> Result<Candidate<'_>, ProviderError> {
    let obj = as_object(GEMINI, root, "")?;
    let candidates = required_array(GEMINI, obj, "", "candidates")?;
    let candidate_path = "candidates[0]";
    let candidate = as_object(
        GEMINI,
        first(GEMINI, candidates, "candidates")?,
        candidate_path,
    )?;
    let reason = optional_str(GEMINI, candidate, candidate_path, "finishReason")?;
    let finished = reason.is_some_and(ends_turn);
    let stopped = reason == Some("STOP");
    let content_path = "candidates[0].content";
    let parts = match optional(candidate, "content") {
        None => None,
        Some(content) => {
            let content = as_object(GEMINI, content, content_path)?;
            optional_array(GEMINI, content, content_path, "parts")?
        }
    };
    Ok(Candidate {
        parts: parts.unwrap_or(&[]),
        parts_path: key_path(content_path, "parts"),
        finished,
        stopped,
    })
}

/// Does a `finishReason` end the turn? Empty, and the protobuf spelling of
/// "not stopped" (`FINISH_REASON_UNSPECIFIED`, enum value 0), do not.
pub(super) fn ends_turn(reason: &str) -> bool {
    !reason.is_empty() && reason != "FINISH_REASON_UNSPECIFIED"
}

/// A `functionCall` part of the turn, and whether the API answered it.
struct TurnCall<'a> {
    raw: RawCall<'a>,
    name: &'a str,
    answered: bool,
}

/// Finds the `functionCall` objects of a `generateContent` response that are
/// the client's to run.
///
/// A `functionResponse` in the turn answers the call with its `id`, or,
/// without an id, the earliest call before it of the same name not yet
/// answered. A call left unanswered whose tool the API answered in this
/// turn (any `functionResponse` of that name) is refused ([`ProviderError::UnansweredServerCall`]): it is the
/// API's call whose answer is missing as likely as it is the client's. A
/// candidate without `finishReason` is a stream chunk ("if empty, the model
/// has not stopped generating"): a call in it is refused as incomplete,
/// because an answer in a later chunk cannot be seen here.
pub(super) fn locate(root: &Json) -> Result<Vec<RawCall<'_>>, ProviderError> {
    let Candidate {
        parts,
        parts_path,
        finished,
        stopped,
    } = candidate(root)?;
    let mut calls: Vec<TurnCall<'_>> = Vec::new();
    let mut server_tools: HashSet<&str> = HashSet::new();
    // Which call an answer names, looked up instead of scanned for (a scan
    // per answer made a hostile turn of many calls and many answers
    // quadratic: minutes for 4 MiB): the first call of each id, and per name
    // the calls not answered yet, in order (an entry answered by id since is
    // skipped when it comes up: each is passed over at most once).
    let mut first_of_id: HashMap<&str, usize> = HashMap::new();
    let mut waiting_of_name: HashMap<&str, VecDeque<usize>> = HashMap::new();
    for (index, part) in parts.iter().enumerate() {
        let part_path = index_path(&parts_path, index);
        let part = as_object(GEMINI, part, &part_path)?;
        if let Some(call) = optional(part, "functionCall") {
            let path = key_path(&part_path, "functionCall");
            let item = as_object(GEMINI, call, &path)?;
            check_complete(item, &path)?;
            let id = given_id(item, &path)?;
            let name = non_empty_str(GEMINI, item, &path, "name")?;
            if let Some(id) = id {
                first_of_id.entry(id).or_insert(calls.len());
            }
            waiting_of_name
                .entry(name)
                .or_default()
                .push_back(calls.len());
            calls.push(TurnCall {
                raw: RawCall { path, item },
                name,
                answered: false,
            });
        }
        if let Some(response) = optional(part, "functionResponse") {
            let path = key_path(&part_path, "functionResponse");
            let response = as_object(GEMINI, response, &path)?;
            let id = given_id(response, &path)?;
            let name = non_empty_str(GEMINI, response, &path, "name")?;
            let answered = match id {
                Some(id) => {
                    let at = first_of_id.get(id).copied();
                    // An answer naming a call by id but another tool: the
                    // call may be the API's (misnamed answer) or the
                    // client's (the answer is another call's): neither
                    // running nor dropping it is safe.
                    if let Some(call) = at.and_then(|at| calls.get(at)) {
                        if call.name != name {
                            return Err(ProviderError::UnansweredServerCall {
                                provider: GEMINI,
                                field: call.raw.path.clone(),
                            });
                        }
                    }
                    at
                }
                None => waiting_of_name.get_mut(name).and_then(|waiting| {
                    while let Some(at) = waiting.pop_front() {
                        if calls.get(at).is_some_and(|call| !call.answered) {
                            return Some(at);
                        }
                    }
                    None
                }),
            };
            if let Some(call) = answered.and_then(|at| calls.get_mut(at)) {
                call.answered = true;
            }
            server_tools.insert(name);
        }
    }
    let mut found = Vec::with_capacity(calls.len());
    for call in calls {
        if call.answered {
            continue;
        }
        if server_tools.contains(call.name) {
            return Err(ProviderError::UnansweredServerCall {
                provider: GEMINI,
                field: call.raw.path,
            });
        }
        if !finished || !stopped {
            return Err(ProviderError::IncompleteCall {
                provider: GEMINI,
                field: call.raw.path,
            });
        }
        found.push(call.raw);
    }
    Ok(found)
}

/// A whole call carries neither `willContinue: true` nor `partialArgs`.
fn check_complete(call: &Object, path: &str) -> Result<(), ProviderError> {
    if flag(GEMINI, call, path, "willContinue")? || optional(call, "partialArgs").is_some() {
        return Err(ProviderError::IncompleteCall {
            provider: GEMINI,
            field: path.to_owned(),
        });
    }
    Ok(())
}

/// The provider-given `id` of a call or response (`None` when absent or
/// empty).
fn given_id<'a>(obj: &'a Object, path: &str) -> Result<Option<&'a str>, ProviderError> {
    match optional(obj, "id") {
        None => Ok(None),
        Some(Json::String(id)) if id.is_empty() => Ok(None),
        Some(Json::String(id)) => Ok(Some(id)),
        Some(_) => Err(ProviderError::WrongType {
            provider: GEMINI,
            field: key_path(path, "id"),
            expected: "string",
        }),
    }
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
    let given = given_id(raw.item, &raw.path)?;
    let call_id_derived = given.is_none();
    let call_id = given.map_or_else(|| derived_id(round, position), str::to_owned);
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

/// The `functionResponse` part answering `call`:
/// `{"functionResponse":{"id"?,"name","response"}}`.
pub(super) fn part(call: &ToolCall, output: &Output) -> Json {
    let response = match &output.value {
        value if output.is_error => wrap("error", value),
        value @ Json::Object(_) => value.clone(),
        value => wrap("result", value),
    };
    let mut members = Vec::with_capacity(3);
    if !call.call_id_derived {
        members.push(("id", Json::str(&call.call_id)));
    }
    members.push(("name", Json::str(&call.tool_name)));
    members.push(("response", response));
    Json::object([("functionResponse", Json::object(members))])
}

/// `{key: value}`.
fn wrap(key: &str, value: &Json) -> Json {
    Json::object([(key, value.clone())])
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
        let list_args = r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"f","args":[1]}}]},"finishReason":"STOP"}]}"#;
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

    #[test]
    fn calls_the_server_answered_are_not_returned() {
        let json = include_str!("../../tests/fixtures/providers/gemini_server_mcp.json");
        assert_eq!(
            parse(json, 4).unwrap(),
            vec![call(
                "gemini_r4_p0",
                true,
                "create_event",
                r#"{"start":"2026-02-02T07:00:00-05:00","title":"Shovel the driveway"}"#,
                0
            )]
        );
        // An id-less response answers the earliest unanswered call of its
        // name before it; several answers, several calls.
        let twice = r#"{"candidates":[{"content":{"role":"model","parts":[
            {"functionCall":{"name":"ping","args":{"n":1}}},
            {"functionResponse":{"name":"ping","response":{"ok":true}}},
            {"functionCall":{"name":"ping","args":{"n":2}}},
            {"functionResponse":{"name":"ping","response":{"ok":true}}},
            {"functionCall":{"name":"pong"}}]},"finishReason":"STOP"}]}"#;
        assert_eq!(
            parse(twice, 0).unwrap(),
            vec![call("gemini_r0_p0", true, "pong", "{}", 0)]
        );
        // A response with another id answers nothing, but says the API runs
        // `ping`: the unanswered `ping` call is refused, not run.
        let other = r#"{"candidates":[{"content":{"role":"model","parts":[
            {"functionCall":{"id":"a","name":"ping"}},
            {"functionResponse":{"id":"b","name":"ping","response":{}}}]},"finishReason":"STOP"}]}"#;
        assert_eq!(
            parse(other, 0),
            Err(ProviderError::UnansweredServerCall {
                provider: GEMINI,
                field: "candidates[0].content.parts[0].functionCall".into()
            })
        );
    }

    #[test]
    fn a_call_of_a_tool_the_api_ran_without_its_answer_is_refused() {
        // Two calls of a server tool, one answer: which call is the API's is
        // unknowable, so nothing of the response is returned.
        let one_answer = r#"{"candidates":[{"content":{"role":"model","parts":[
            {"functionCall":{"name":"ping","args":{"n":1}}},
            {"functionCall":{"name":"ping","args":{"n":2}}},
            {"functionResponse":{"name":"ping","response":{"ok":true}}},
            {"functionCall":{"name":"pong"}}]},"finishReason":"STOP"}]}"#;
        assert_eq!(
            parse(one_answer, 0),
            Err(ProviderError::UnansweredServerCall {
                provider: GEMINI,
                field: "candidates[0].content.parts[1].functionCall".into()
            })
        );
        // An answer never reaches back to a later call of its name.
        let answer_first = r#"{"candidates":[{"content":{"role":"model","parts":[
            {"functionResponse":{"name":"ping","response":{"ok":true}}},
            {"functionCall":{"name":"ping"}}]},"finishReason":"STOP"}]}"#;
        assert_eq!(
            parse(answer_first, 0),
            Err(ProviderError::UnansweredServerCall {
                provider: GEMINI,
                field: "candidates[0].content.parts[1].functionCall".into()
            })
        );
        // An answer by id to an earlier call is matched across other parts.
        let by_id = r#"{"candidates":[{"content":{"role":"model","parts":[
            {"functionCall":{"id":"s1","name":"lookup","args":{"q":"x"}}},
            {"functionCall":{"id":"c1","name":"pay","args":{"cents":100}}},
            {"functionResponse":{"id":"s1","name":"lookup","response":{}}}]},"finishReason":"STOP"}]}"#;
        assert_eq!(
            parse(by_id, 0).unwrap(),
            vec![call("c1", false, "pay", r#"{"cents":100}"#, 0)]
        );
    }

    #[test]
    fn a_candidate_that_has_not_finished_holds_no_runnable_call() {
        // A stream chunk: whole call, no finishReason. The API's answer may
        // be in the next chunk, so the call is not handed out.
        let chunk = r#"{"candidates":[{"content":{"role":"model","parts":[
            {"text":"Checking."},
            {"functionCall":{"name":"get_forecast","args":{"city":"Oslo"}}}]}}]}"#;
        assert_eq!(
            parse(chunk, 0),
            Err(ProviderError::IncompleteCall {
                provider: GEMINI,
                field: "candidates[0].content.parts[1].functionCall".into()
            })
        );
        // An empty finishReason is no finish reason.
        let empty = chunk.replace("]}}]}", r#"]},"finishReason":""}]}"#);
        assert!(matches!(
            parse(&empty, 0),
            Err(ProviderError::IncompleteCall { .. })
        ));
        // Text alone without a finishReason holds no call either way.
        let text = r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hi"}]}}]}"#;
        assert_eq!(parse(text, 0).unwrap(), vec![]);
        let finished = chunk.replace("]}}]}", r#"]},"finishReason":"STOP"}]}"#);
        assert_eq!(
            parse(&finished, 0).unwrap(),
            vec![call(
                "gemini_r0_p0",
                true,
                "get_forecast",
                r#"{"city":"Oslo"}"#,
                0
            )]
        );
    }

    #[test]
    fn streamed_fragments_are_never_calls() {
        let chunk = include_str!("../../tests/fixtures/providers/gemini_partial_args_chunk.json");
        assert_eq!(
            parse(chunk, 0),
            Err(ProviderError::IncompleteCall {
                provider: GEMINI,
                field: "candidates[0].content.parts[0].functionCall".into()
            })
        );
        let partial = r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":
            {"partialArgs":[{"jsonPath":"$.celsius","numberValue":21.5}]}}]}}]}"#;
        assert_eq!(
            parse(partial, 0),
            Err(ProviderError::IncompleteCall {
                provider: GEMINI,
                field: "candidates[0].content.parts[0].functionCall".into()
            })
        );
        let finished = r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":
            {"name":"f","args":{"a":1},"willContinue":false}}]},"finishReason":"STOP"}]}"#;
        assert_eq!(
            parse(finished, 0).unwrap(),
            vec![call("gemini_r0_p0", true, "f", r#"{"a":1}"#, 0)]
        );
    }

    #[test]
    fn result_numbers_render_as_stored() {
        let given = call("fc-1", false, "quote", "{}", 0);
        let stored = ToolResultContent {
            output_json: r#"{"price": 224.18827276432074, "lot": 18446744073709551617, "d": -0}"#
                .into(),
            is_error: false,
        };
        assert_eq!(
            render_tool_result(&given, &stored).unwrap(),
            r#"{"functionResponse":{"id":"fc-1","name":"quote","response":{"d":-0,"lot":18446744073709551617,"price":224.18827276432074}}}"#
        );
    }

    #[test]
    fn many_answers_that_match_no_call_take_linear_time() {
        // A turn of 30 000 calls followed by 30 000 answers that match none
        // of them, by name or by id (3.6 MB, under the 4 MiB default limit).
        // Each answer used to scan every call before it: 30 000² steps,
        // about 40 s in a debug build (60 000 of each took 155 s), before
        // the count of calls was even checked. Now it is looked up.
        let n = 30_000;
        let mut parts = Vec::with_capacity(2 * n);
        parts.extend(std::iter::repeat_n(r#"{"functionCall":{"name":"a"}}"#, n));
        for i in 0..n {
            parts.push(if i % 2 == 0 {
                r#"{"functionResponse":{"name":"b"}}"#
            } else {
                r#"{"functionResponse":{"id":"z","name":"c"}}"#
            });
        }
        let doc = format!(
            r#"{{"candidates":[{{"content":{{"parts":[{}]}},"finishReason":"STOP"}}]}}"#,
            parts.join(",")
        );
        let started = std::time::Instant::now();
        let outcome = parse(&doc, 0);
        let took = started.elapsed();
        assert_eq!(
            outcome,
            Err(ProviderError::TooManyCalls {
                provider: GEMINI,
                count: n,
                max: 128
            })
        );
        // A hang guard, not a speed target (those are in the benchmarks):
        // ~0.3 s measured, 31 s before, in a debug build.
        assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    }

    #[test]
    fn answers_are_matched_as_before() {
        // By id: the first call with that id, answered or not; without an id:
        // the earliest unanswered call of that name before the answer.
        let doc = r#"{"candidates":[{"content":{"parts":[
            {"functionCall":{"name":"s","id":"x"}},
            {"functionCall":{"name":"s"}},
            {"functionResponse":{"name":"s","response":{}}},
            {"functionResponse":{"name":"s","response":{}}},
            {"functionCall":{"name":"t","id":"y"}},
            {"functionResponse":{"id":"y","name":"t","response":{}}},
            {"functionCall":{"name":"u"}}
        ]},"finishReason":"STOP"}]}"#;
        assert_eq!(
            parse(doc, 0).unwrap(),
            vec![call("gemini_r0_p0", true, "u", "{}", 0)]
        );
        // An answer before its call answers nothing: the call is refused.
        let early = r#"{"candidates":[{"content":{"parts":[
            {"functionResponse":{"name":"s","response":{}}},
            {"functionCall":{"name":"s"}}
        ]},"finishReason":"STOP"}]}"#;
        assert!(matches!(
            parse(early, 0),
            Err(ProviderError::UnansweredServerCall { .. })
        ));
        // An answer by id marks the first call with that id even when an
        // answer without id took it already; the second call of the name
        // stays unanswered and is refused.
        let taken = r#"{"candidates":[{"content":{"parts":[
            {"functionCall":{"name":"s","id":"x"}},
            {"functionCall":{"name":"s"}},
            {"functionResponse":{"name":"s","response":{}}},
            {"functionResponse":{"id":"x","name":"s","response":{}}}
        ]},"finishReason":"STOP"}]}"#;
        assert!(matches!(
            parse(taken, 0),
            Err(ProviderError::UnansweredServerCall { .. })
        ));
    }

    #[test]
    fn an_answer_by_id_of_another_tool_refuses_the_turn() {
        // `pay` (id x) was taken as answered by a `search` response naming
        // id x, and silently dropped: Ok([]). Whether the API ran `pay` or
        // the answer is another call's cannot be told.
        let doc = r#"{"candidates":[{"content":{"parts":[
            {"functionCall":{"name":"pay","id":"x","args":{"amount":5}}},
            {"functionResponse":{"name":"search","id":"x","response":{}}}
        ]},"finishReason":"STOP"}]}"#;
        assert_eq!(
            parse(doc, 0),
            Err(ProviderError::UnansweredServerCall {
                provider: GEMINI,
                field: "candidates[0].content.parts[0].functionCall".into()
            })
        );
    }
}

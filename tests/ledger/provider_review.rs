//! Review r3: how provider responses become executions (ids, argument
//! digests, streams, refusals). The first tests show defects and fail on the
//! code they were written against; the seeded probes after them held.

use std::collections::{HashMap, HashSet};

use support::*;
use toolledger::ledger::{Begin, CallSpec};
use toolledger::model::{
    digest_arguments, ArgsDigest, ExecutionId, ExecutionIdParts, JsonLimits, OperationId, Provider,
    ToolCall,
};
use toolledger::provider::{parse_tool_calls, ParseLimits, ProviderError, StreamAssembler};
use toolledger_test_support as support;

const ALL: [Provider; 5] = [
    Provider::OpenAiChat,
    Provider::OpenAiResponses,
    Provider::Anthropic,
    Provider::Gemini,
    Provider::Mcp,
];

fn parse(provider: Provider, doc: &str, round: u32) -> Result<Vec<ToolCall>, ProviderError> {
    parse_tool_calls(provider, doc, round, &ParseLimits::default())
}

/// Pushes every chunk, then finishes: the first error of either.
fn assemble<S: AsRef<str>>(
    provider: Provider,
    round: u32,
    chunks: &[S],
) -> Result<Vec<ToolCall>, ProviderError> {
    let mut stream = StreamAssembler::new(provider, round, ParseLimits::default())?;
    for chunk in chunks {
        stream.push(chunk.as_ref())?;
    }
    stream.finish()
}

fn digest(call: &ToolCall) -> ArgsDigest {
    digest_arguments(&call.tool_name, 1, &call.arguments, &JsonLimits::default())
        .unwrap()
        .digest
}

fn exec_id(op: &OperationId, round: u32, call: &ToolCall) -> ExecutionId {
    ExecutionId::derive(&ExecutionIdParts {
        operation: op,
        round,
        call_id: &call.call_id,
        tool_name: &call.tool_name,
        tool_version: 1,
    })
    .unwrap()
}

/// JSON text of `text` as a JSON string.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

// ===========================================================================
// Defects (these fail on the reviewed code)
// ===========================================================================

/// D1. A document of another format that holds tool calls is read as a
/// response without calls, `Ok([])`, instead of being refused: by the Chat
/// parser, anything with a `role` (an Anthropic message, a Gemini content,
/// a Responses item) passes as a bare assistant message without
/// `tool_calls`; by the Anthropic parser, a Chat assistant message (its
/// `content` a string) passes as a message without blocks. The calls
/// vanish; the app believes the model asked for nothing and the model
/// never gets its answers. Everywhere else the module refuses what it
/// cannot classify.
#[test]
fn a_foreign_document_with_calls_is_refused_not_read_as_no_calls() {
    let anthropic_message = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"pay","input":{"cents":100}}],"stop_reason":"tool_use"}"#;
    let chat_message = r#"{"role":"assistant","content":"Paying now.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"pay","arguments":"{\"cents\":100}"}}]}"#;
    // Their own parsers find the call.
    assert_eq!(
        parse(Provider::Anthropic, anthropic_message, 0)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        parse(Provider::OpenAiChat, chat_message, 0).unwrap().len(),
        1
    );
    let misrouted = [
        (Provider::OpenAiChat, anthropic_message),
        // A Gemini candidate's content.
        (
            Provider::OpenAiChat,
            r#"{"role":"model","parts":[{"functionCall":{"name":"pay","args":{"cents":100}}}]}"#,
        ),
        // An OpenAI Responses output item.
        (
            Provider::OpenAiChat,
            r#"{"type":"function_call","role":"assistant","call_id":"call_1","name":"pay","arguments":"{\"cents\":100}"}"#,
        ),
        (Provider::Anthropic, chat_message),
    ];
    let mut read_as_nothing = Vec::new();
    for (provider, doc) in misrouted {
        let outcome = parse(provider, doc, 0);
        if outcome.is_ok() {
            read_as_nothing.push(format!("{provider}: {outcome:?} for {doc}"));
        }
    }
    assert!(
        read_as_nothing.is_empty(),
        "documents holding a call read as:\n{}",
        read_as_nothing.join("\n")
    );
}

/// D2. Anthropic `stop_reason: "refusal"` (a streaming classifier stopped
/// the output mid-way; Anthropic asks clients to drop the refused turn) after
/// a `tool_use` block: the call is returned as runnable, whole and streamed.
/// Chat's `content_filter` and Anthropic's own `max_tokens` refuse the same
/// shape with `IncompleteCall`.
#[test]
fn an_anthropic_refusal_after_a_tool_use_refuses_the_call() {
    let whole = r#"{"role":"assistant","content":[{"type":"text","text":"Paying"},{"type":"tool_use","id":"toolu_1","name":"pay","input":{"cents":100}}],"stop_reason":"refusal"}"#;
    let expected = Err(ProviderError::IncompleteCall {
        provider: Provider::Anthropic,
        field: "content[1]".into(),
    });
    // The same shape with max_tokens is refused (the rule holds there).
    assert_eq!(
        parse(
            Provider::Anthropic,
            &whole.replace("\"refusal\"", "\"max_tokens\""),
            0
        ),
        expected
    );
    let stream = [
        r#"{"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[]}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Paying"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"pay","input":{}}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"cents\":100}"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"refusal"}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    assert_eq!(parse(Provider::Anthropic, whole, 0), expected, "whole");
    assert_eq!(
        assemble(Provider::Anthropic, 0, &stream),
        expected,
        "stream"
    );
}

/// D3. Gemini: any non-empty `finishReason` counts as a clean stop, so a
/// turn the API reports as cut off (`MAX_TOKENS` with the call last),
/// blocked (`SAFETY`) or holding a malformed call
/// (`MALFORMED_FUNCTION_CALL`) hands its call out to run. The other
/// providers refuse their equivalents (Chat `length` / `content_filter`,
/// Anthropic `max_tokens`).
#[test]
fn a_gemini_turn_cut_off_blocked_or_malformed_runs_no_call() {
    // Chat refuses the equivalent finish reasons.
    for reason in ["length", "content_filter"] {
        let chat = format!(
            r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","tool_calls":[{{"id":"c1","type":"function","function":{{"name":"pay","arguments":"{{\"cents\":100}}"}}}}]}},"finish_reason":"{reason}"}}]}}"#
        );
        assert!(matches!(
            parse(Provider::OpenAiChat, &chat, 0),
            Err(ProviderError::IncompleteCall { .. })
        ));
    }
    for reason in ["MAX_TOKENS", "SAFETY", "MALFORMED_FUNCTION_CALL"] {
        let doc = format!(
            r#"{{"candidates":[{{"content":{{"role":"model","parts":[{{"text":"ok"}},{{"functionCall":{{"name":"pay","args":{{"cents":100}}}}}}]}},"finishReason":"{reason}"}}]}}"#
        );
        let expected = Err(ProviderError::IncompleteCall {
            provider: Provider::Gemini,
            field: "candidates[0].content.parts[1].functionCall".into(),
        });
        assert_eq!(
            parse(Provider::Gemini, &doc, 0),
            expected,
            "whole, {reason}"
        );
        assert_eq!(
            assemble(Provider::Gemini, 0, &[doc.as_str()]),
            expected,
            "stream, {reason}"
        );
    }
}

/// D4. A number the provider parser accepts (an exponent beyond 32 bits,
/// `0e2147483648` is 0 and `1e-2147483649` a tiny non-zero value, both
/// finite doubles) is refused by the digest (`number exponent out of
/// range`): `parse_tool_calls` hands out a call that `begin` then cannot
/// record, with an error that says the valid JSON is invalid. The value 0
/// must digest as 0 does (as `-0`, `0.0` and `0e5` do).
#[test]
fn every_number_the_parser_accepts_is_digested_by_its_value() {
    for (spelled, same_as) in [
        ("0e2147483648", Some("0")),
        ("0.0e-2147483649", Some("0")),
        ("1e-2147483649", None),
    ] {
        let doc = format!(
            r#"{{"content":[{{"type":"tool_use","id":"toolu_1","name":"pay","input":{{"cents":{spelled}}}}}]}}"#
        );
        let calls = parse(Provider::Anthropic, &doc, 0).unwrap();
        let outcome = digest_arguments("pay", 1, &calls[0].arguments, &JsonLimits::default());
        assert!(outcome.is_ok(), "{spelled}: {outcome:?}");
        if let Some(plain) = same_as {
            let plain = digest_arguments(
                "pay",
                1,
                &format!(r#"{{"cents":{plain}}}"#),
                &JsonLimits::default(),
            )
            .unwrap();
            assert_eq!(outcome.unwrap().digest, plain.digest, "{spelled}");
        }
    }
}

/// D5. Gemini streamed arguments: the RFC 9535 wildcard `$.*` is read as a
/// member named `*` (the module says wildcards are refused; `$[*]` is):
/// the tool gets an argument the model never named.
#[test]
fn a_gemini_wildcard_path_is_refused_not_read_as_a_member_named_star() {
    let chunks = |path: &str| {
        vec![
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","willContinue":true}}]}}]}"#.to_owned(),
            format!(
                r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"partialArgs":[{{"jsonPath":{},"stringValue":"x"}}],"willContinue":true}}}}]}}}}]}}"#,
                quoted(path)
            ),
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{}}]},"finishReason":"STOP"}]}"#.to_owned(),
        ]
    };
    let refused = |path: &str| {
        assert_eq!(
            assemble(Provider::Gemini, 0, &chunks(path)),
            Err(ProviderError::StreamMismatch {
                provider: Provider::Gemini,
                chunk: 1,
                field:
                    "chunk[1].candidates[0].content.parts[0].functionCall.partialArgs[0].jsonPath"
                        .into(),
                reason: "an unsupported JSON path",
            }),
            "{path}"
        )
    };
    refused("$[*]");
    refused("$.*");
    refused("$.a.*");
}

/// D6. An Anthropic stream cut off at the token limit inside a `tool_use`
/// (fine-grained tool streaming sends the input as generated; Anthropic:
/// "the stream may end mid-way through a parameter") fails at
/// `content_block_stop` with `ArgumentsNotJson`, as if the model had
/// written bad JSON. The same cut in every other shape is `IncompleteCall`
/// (a whole Anthropic response with `max_tokens`, a Chat stream with
/// `finish_reason: length`, a Responses item `incomplete`): the app cannot
/// tell "raise max_tokens" from "the model sent garbage".
#[test]
fn an_anthropic_stream_cut_at_the_token_limit_inside_a_call_is_an_incomplete_call() {
    let anthropic = [
        r#"{"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[]}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"pay","input":{}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"cents\": 10"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    // Chat, the same cut: IncompleteCall.
    let chat = [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"pay","arguments":""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"cents\": 10"}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
    ];
    assert_eq!(
        assemble(Provider::OpenAiChat, 0, &chat),
        Err(ProviderError::IncompleteCall {
            provider: Provider::OpenAiChat,
            field: "choices[0].message.tool_calls[0]".into(),
        })
    );
    assert_eq!(
        assemble(Provider::Anthropic, 0, &anthropic),
        Err(ProviderError::IncompleteCall {
            provider: Provider::Anthropic,
            field: "content[0]".into(),
        })
    );
}

/// D7. An Anthropic stream whose `message_start` already holds the blocks
/// (the module takes them as finished, `anthropic_blocks_in_message_start_
/// are_not_lost`) and the message's `stop_reason: "max_tokens"`: the
/// stream ignores that stop reason and hands out the cut-off `tool_use`;
/// the same message parsed whole is refused (`IncompleteCall`). Streamed
/// and whole responses are promised the same refusals.
#[test]
fn an_anthropic_stop_reason_in_message_start_is_not_ignored() {
    let message = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"toolu_0","name":"pay","input":{"cents":10}}],"stop_reason":"max_tokens"}"#;
    let expected = Err(ProviderError::IncompleteCall {
        provider: Provider::Anthropic,
        field: "content[0]".into(),
    });
    assert_eq!(parse(Provider::Anthropic, message, 0), expected, "whole");
    let stream = [
        format!(r#"{{"type":"message_start","message":{message}}}"#),
        r#"{"type":"message_stop"}"#.to_owned(),
    ];
    assert_eq!(
        assemble(Provider::Anthropic, 0, &stream),
        expected,
        "stream"
    );
}

/// D8. An OpenAI Responses response whose `status` is `failed` or
/// `cancelled` hands out its function calls when parsed whole; the stream
/// of the same response (`response.failed`) is refused
/// (`StreamIncomplete`). A failed or cancelled response (background mode,
/// polled with `GET /responses/{id}`) is not a turn to answer.
#[test]
fn a_failed_or_cancelled_responses_response_hands_out_no_call() {
    let item = r#"{"type":"function_call","call_id":"call_1","name":"pay","arguments":"{\"cents\":100}","status":"completed"}"#;
    let stream = [
        format!(r#"{{"type":"response.output_item.done","output_index":0,"item":{item}}}"#),
        r#"{"type":"response.failed","response":{"status":"failed"}}"#.to_owned(),
    ];
    assert!(assemble(Provider::OpenAiResponses, 0, &stream).is_err());
    for status in ["failed", "cancelled"] {
        let whole = format!(r#"{{"status":"{status}","output":[{item}]}}"#);
        let outcome = parse(Provider::OpenAiResponses, &whole, 0);
        assert!(outcome.is_err(), "{status}: {outcome:?}");
    }
}

/// D9. Gemini `finishReason: "FINISH_REASON_UNSPECIFIED"` is the protobuf
/// name of the empty value (enum 0, what a serializer that writes default
/// values puts in every chunk before the last). The module reads `""` as
/// "not stopped" (the fix of `an_empty_finish_reason_does_not_end_the_
/// stream`), but this spelling as a finish: a chunk's call is handed out by
/// `parse_tool_calls`, and the stream is complete after its first chunk, so
/// an app that stops reading there runs a call whose server answer comes
/// in the next chunk (a second effect for a tool the API runs itself).
#[test]
fn a_gemini_unspecified_finish_reason_does_not_end_the_turn() {
    let first = r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"create_ticket","args":{"title":"x"}}}]},"finishReason":"FINISH_REASON_UNSPECIFIED"}]}"#;
    let answer = r#"{"candidates":[{"content":{"role":"model","parts":[{"functionResponse":{"name":"create_ticket","response":{"id":7}}},{"text":"Done."}]},"finishReason":"STOP"}]}"#;
    assert_eq!(
        parse(Provider::Gemini, first, 0),
        Err(ProviderError::IncompleteCall {
            provider: Provider::Gemini,
            field: "candidates[0].content.parts[0].functionCall".into(),
        })
    );
    let mut stream = StreamAssembler::new(Provider::Gemini, 0, ParseLimits::default()).unwrap();
    stream.push(first).unwrap();
    assert!(!stream.is_complete(), "complete after the first chunk");
    stream.push(answer).unwrap();
    assert_eq!(stream.finish().unwrap(), vec![]);
}

// ===========================================================================
// Seeded probes (these held)
// ===========================================================================

/// A small xorshift generator: every probe is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A JSON value with numbers as `(negative, digits, exponent)`: value =
/// ±digits × 10^exponent, so that it can be spelled many ways exactly.
#[derive(Clone, Debug)]
enum Val {
    Null,
    Bool(bool),
    Num(bool, String, i32),
    Str(String),
    Arr(Vec<Val>),
    Obj(Vec<(String, Val)>),
}

const CHARS: &[char] = &[
    'a', 'b', 'Z', '0', ' ', ':', '#', '%', '/', '"', '\\', '\n', '\t', '\u{1}', '\u{7f}', 'é',
    'ß', '東', '😀', '\u{2028}', '\u{85}', 'e', 'E',
];

fn gen_string(rng: &mut Rng, max: usize) -> String {
    (0..rng.below(max + 1)).map(|_| *rng.pick(CHARS)).collect()
}

fn gen_number(rng: &mut Rng) -> Val {
    let mut digits: String = (0..1 + rng.below(24))
        .map(|i| {
            char::from(
                b'0' + if i == 0 {
                    1 + rng.below(9) as u8
                } else {
                    rng.below(10) as u8
                },
            )
        })
        .collect();
    if rng.chance(8) {
        digits = "0".into();
    }
    // Keep the value's last digit non-zero so that the spellings below are
    // all of one value and a changed digit is always another value.
    if digits != "0" && digits.ends_with('0') {
        digits.pop();
        digits.push('7');
    }
    Val::Num(rng.chance(3), digits, rng.below(60) as i32 - 30)
}

fn gen_val(rng: &mut Rng, depth: usize) -> Val {
    match rng.below(if depth == 0 { 4 } else { 6 }) {
        0 => Val::Null,
        1 => Val::Bool(rng.chance(2)),
        2 => gen_number(rng),
        3 => Val::Str(gen_string(rng, 12)),
        4 => Val::Arr((0..rng.below(4)).map(|_| gen_val(rng, depth - 1)).collect()),
        _ => gen_obj(rng, depth - 1),
    }
}

fn gen_obj(rng: &mut Rng, depth: usize) -> Val {
    let mut seen = HashSet::new();
    let mut members = Vec::new();
    for _ in 0..rng.below(5) {
        let key = gen_string(rng, 6);
        if seen.insert(key.clone()) {
            members.push((key, gen_val(rng, depth)));
        }
    }
    Val::Obj(members)
}

/// Writes `text` as a JSON string, each character raw or escaped at random
/// (`\uXXXX`, surrogate pairs, short escapes, `\/`).
fn write_str(rng: &mut Rng, out: &mut String, text: &str) {
    out.push('"');
    for ch in text.chars() {
        let must = ch == '"' || ch == '\\' || (ch as u32) < 0x20;
        if must || rng.chance(4) {
            match ch {
                '"' if rng.chance(2) => out.push_str("\\\""),
                '\\' if rng.chance(2) => out.push_str("\\\\"),
                '\n' if rng.chance(2) => out.push_str("\\n"),
                '\t' if rng.chance(2) => out.push_str("\\t"),
                '/' if rng.chance(2) => out.push_str("\\/"),
                _ => {
                    let mut units = [0u16; 2];
                    for unit in ch.encode_utf16(&mut units) {
                        if rng.chance(2) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        } else {
                            out.push_str(&format!("\\u{unit:04X}"));
                        }
                    }
                }
            }
        } else {
            out.push(ch);
        }
    }
    out.push('"');
}

/// One of many spellings of ±digits × 10^exp.
fn write_num(rng: &mut Rng, out: &mut String, negative: bool, digits: &str, exp: i32) {
    if negative {
        out.push('-');
    }
    if digits == "0" {
        let zero = ["0", "0.0", "0e5", "0.000E-3", "0E+0"];
        out.push_str(zero[rng.below(zero.len())]);
        return;
    }
    let k = digits.len() as i32;
    match rng.below(5) {
        // digits e exp
        0 => out.push_str(&format!("{digits}e{exp}")),
        // d.ddd E±x
        1 => {
            let (first, rest) = digits.split_at(1);
            let e = exp + k - 1;
            let frac = if rest.is_empty() { "0" } else { rest };
            out.push_str(&format!(
                "{first}.{frac}E{}{e}",
                if e >= 0 { "+" } else { "" }
            ));
        }
        // trailing zeros moved into the exponent
        2 => out.push_str(&format!("{digits}000e{}", exp - 3)),
        // plain decimal when short enough
        _ if (-40..=25).contains(&exp) => {
            if exp >= 0 {
                out.push_str(digits);
                out.extend((0..exp).map(|_| '0'));
                if rng.chance(2) {
                    out.push_str(".0");
                }
            } else {
                let point = k + exp;
                if point > 0 {
                    out.push_str(&digits[..point as usize]);
                    out.push('.');
                    out.push_str(&digits[point as usize..]);
                } else {
                    out.push_str("0.");
                    out.extend((0..-point).map(|_| '0'));
                    out.push_str(digits);
                }
            }
        }
        _ => out.push_str(&format!("0.{digits}e{}", exp + k)),
    }
}

fn ws(rng: &mut Rng, out: &mut String) {
    for _ in 0..rng.below(3) {
        out.push(*rng.pick(&[' ', '\n', '\t', '\r']));
    }
}

/// A random spelling of `val`: member order, whitespace, escapes and number
/// spellings all vary.
fn write_val(rng: &mut Rng, out: &mut String, val: &Val) {
    match val {
        Val::Null => out.push_str("null"),
        Val::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Val::Num(negative, digits, exp) => write_num(rng, out, *negative, digits, *exp),
        Val::Str(text) => write_str(rng, out, text),
        Val::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                write_val(rng, out, item);
                ws(rng, out);
            }
            out.push(']');
        }
        Val::Obj(members) => {
            let mut order: Vec<usize> = (0..members.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            out.push('{');
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                ws(rng, out);
                write_str(rng, out, &members[i].0);
                ws(rng, out);
                out.push(':');
                ws(rng, out);
                write_val(rng, out, &members[i].1);
                ws(rng, out);
            }
            out.push('}');
        }
    }
}

fn spell(rng: &mut Rng, val: &Val) -> String {
    let mut out = String::new();
    write_val(rng, &mut out, val);
    out
}

/// `val` with one leaf changed to another value (`None` if it has no leaf).
fn changed(rng: &mut Rng, val: &Val) -> Option<Val> {
    match val {
        Val::Null => Some(Val::Bool(false)),
        Val::Bool(b) => Some(Val::Bool(!b)),
        Val::Num(negative, digits, exp) => Some(if digits == "0" {
            Val::Num(false, "1".into(), *exp)
        } else {
            let mut d = digits.clone();
            let last = d.pop().unwrap();
            d.push(if last == '9' {
                '8'
            } else {
                char::from(last as u8 + 1)
            });
            Val::Num(*negative, d, *exp)
        }),
        Val::Str(text) => Some(Val::Str(format!("{text}x"))),
        Val::Arr(items) if items.is_empty() => Some(Val::Arr(vec![Val::Null])),
        Val::Arr(items) => {
            let i = rng.below(items.len());
            let mut items = items.clone();
            items[i] = changed(rng, &items[i])?;
            Some(Val::Arr(items))
        }
        Val::Obj(members) if members.is_empty() => Some(Val::Obj(vec![("k".into(), Val::Null)])),
        Val::Obj(members) => {
            let i = rng.below(members.len());
            let mut members = members.clone();
            members[i].1 = changed(rng, &members[i].1)?;
            Some(Val::Obj(members))
        }
    }
}

/// One call of `provider` carrying the spelled arguments `args`.
fn one_call_payload(provider: Provider, id: &str, name: &str, args: &str) -> String {
    match provider {
        Provider::OpenAiChat => format!(
            r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","tool_calls":[{{"id":{},"type":"function","function":{{"name":{},"arguments":{}}}}}]}},"finish_reason":"tool_calls"}}]}}"#,
            quoted(id),
            quoted(name),
            quoted(args)
        ),
        Provider::OpenAiResponses => format!(
            r#"{{"output":[{{"type":"function_call","call_id":{},"name":{},"arguments":{},"status":"completed"}}]}}"#,
            quoted(id),
            quoted(name),
            quoted(args)
        ),
        Provider::Anthropic => format!(
            r#"{{"content":[{{"type":"tool_use","id":{},"name":{},"input":{args}}}],"stop_reason":"tool_use"}}"#,
            quoted(id),
            quoted(name)
        ),
        Provider::Gemini => format!(
            r#"{{"candidates":[{{"content":{{"role":"model","parts":[{{"functionCall":{{"id":{},"name":{},"args":{args}}}}}]}},"finishReason":"STOP"}}]}}"#,
            quoted(id),
            quoted(name)
        ),
        _ => format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":{},"arguments":{args}}}}}"#,
            quoted(id),
            quoted(name)
        ),
    }
}

/// P1. The same arguments in any spelling (member order, whitespace, string
/// escapes, `1.50`/`15e-1`/`0.15E+1`, big integers), sent as an Anthropic
/// `input` object, an OpenAI argument string, Gemini `args` or MCP
/// `arguments`, give one digest; a change of any one leaf gives another.
/// 3,000 seeded objects, 5 spellings each, through all five parsers.
#[test]
fn respelled_arguments_share_one_digest_and_a_changed_leaf_never_does() {
    let mut rng = Rng::new(0x5eed_0003);
    for case in 0..3_000 {
        let val = gen_obj(&mut rng, 3);
        let mut digests = HashSet::new();
        for spelling in 0..5 {
            let args = spell(&mut rng, &val);
            let provider = ALL[(case + spelling) % ALL.len()];
            let calls = parse(provider, &one_call_payload(provider, "c", "pay", &args), 0)
                .unwrap_or_else(|e| panic!("case {case} {provider}: {e:?}\n{args}"));
            // Parsing the call's own arguments text again changes nothing.
            let again = digest_arguments("pay", 1, &args, &JsonLimits::default()).unwrap();
            assert_eq!(digest(&calls[0]), again.digest, "case {case}");
            digests.insert(digest(&calls[0]));
        }
        assert_eq!(digests.len(), 1, "case {case}: {val:?}");
        if let Some(other) = changed(&mut rng, &val) {
            let args = spell(&mut rng, &other);
            let d = digest_arguments("pay", 1, &args, &JsonLimits::default())
                .unwrap()
                .digest;
            assert!(!digests.contains(&d), "case {case}: {val:?} vs {other:?}");
        }
    }
}

const ID_PIECES: &[&str] = &[
    "a",
    ":",
    "%",
    "#",
    "%3A",
    "%25",
    "%23",
    "3A",
    "_",
    "round_0",
    "v1",
    "é",
    "\u{85}",
    "\n",
    "\u{7f}",
    "😀",
    " ",
    "item_1",
    "compensates",
];

fn gen_id(rng: &mut Rng) -> String {
    let mut id: String = (0..1 + rng.below(5))
        .map(|_| *rng.pick(ID_PIECES))
        .collect();
    if rng.chance(50) {
        id = "x".repeat(200) + &id;
    }
    id
}

/// P2. Ids with separators, escapes, controls and escape look-alikes:
/// 200,000 seeded (operation, round, call id, tool, version) tuples, and no
/// two distinct tuples share an execution id or a downstream key; batch
/// item and compensation ids never equal a derived id.
#[test]
fn distinct_identities_never_share_an_execution_id() {
    let mut rng = Rng::new(0x1d5_0003);
    let mut seen: HashMap<ExecutionId, (String, u32, String, String, u32)> = HashMap::new();
    let mut keys = HashMap::new();
    let mut derived = Vec::new();
    for _ in 0..200_000 {
        let op_text = gen_id(&mut rng).replace(|c: char| c.is_control(), "c");
        let op = OperationId::new(op_text.clone()).unwrap();
        let round = rng.below(3) as u32;
        let call_id = gen_id(&mut rng);
        let tool = gen_id(&mut rng);
        let version = 1 + rng.below(2) as u32;
        let Ok(id) = ExecutionId::derive(&ExecutionIdParts {
            operation: &op,
            round,
            call_id: &call_id,
            tool_name: &tool,
            tool_version: version,
        }) else {
            continue;
        };
        let tuple = (op_text, round, call_id, tool, version);
        if let Some(before) = seen.get(&id) {
            assert_eq!(before, &tuple, "two identities share {id}");
        }
        let key = id.downstream_key();
        if let Some(before) = keys.insert(key.clone(), id.clone()) {
            assert_eq!(before, id, "two ids share a downstream key");
        }
        if derived.len() < 2_000 {
            derived.push(id.clone());
        }
        seen.insert(id, tuple);
    }
    for (i, id) in derived.iter().enumerate() {
        assert!(!seen.contains_key(&id.batch_item(0)), "{id}");
        let other = &derived[(i + 1) % derived.len()];
        if let Ok(comp) = ExecutionId::compensation(id, other) {
            assert!(!seen.contains_key(&comp), "{comp}");
        }
    }
}

/// A generated call of a response.
struct GenCall {
    id: Option<String>,
    name: String,
    args: String,
}

const NAMES: &[&str] = &["pay", "send_email", "get_weather", "create_event", "x-y_z"];

fn gen_calls(rng: &mut Rng, ids: bool) -> Vec<GenCall> {
    let mut used = HashSet::new();
    (0..1 + rng.below(4))
        .map(|_| {
            let id = ids.then(|| loop {
                let id = gen_id(rng);
                if used.insert(id.clone()) {
                    break id;
                }
            });
            let val = gen_obj(rng, 2);
            GenCall {
                id,
                name: rng.pick(NAMES).to_string(),
                args: spell(rng, &val),
            }
        })
        .collect()
}

/// Splits `text` at random char boundaries.
fn pieces(rng: &mut Rng, text: &str) -> Vec<String> {
    let mut cuts: Vec<usize> = (0..rng.below(6))
        .map(|_| rng.below(text.len() + 1))
        .filter(|&at| text.is_char_boundary(at))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut start = 0;
    for at in cuts.into_iter().chain([text.len()]) {
        out.push(text[start..at].to_owned());
        start = at;
    }
    out
}

/// The whole response and one random stream of it, for `provider`.
fn response_and_stream(
    rng: &mut Rng,
    provider: Provider,
    calls: &[GenCall],
) -> (String, Vec<String>) {
    let mut stream = Vec::new();
    let whole = match provider {
        Provider::OpenAiChat => {
            let items: Vec<String> = calls
                .iter()
                .map(|c| {
                    format!(
                        r#"{{"id":{},"type":"function","function":{{"name":{},"arguments":{}}}}}"#,
                        quoted(c.id.as_deref().unwrap()),
                        quoted(&c.name),
                        quoted(&c.args)
                    )
                })
                .collect();
            // Fragments of all calls, interleaved at random, grouped into
            // chunks at random.
            let mut queues: Vec<Vec<String>> = calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut q = vec![format!(
                        r#"{{"index":{i},"id":{},"type":"function","function":{{"name":{},"arguments":""}}}}"#,
                        quoted(c.id.as_deref().unwrap()),
                        quoted(&c.name)
                    )];
                    q.extend(pieces(rng, &c.args).into_iter().map(|p| {
                        format!(r#"{{"index":{i},"function":{{"arguments":{}}}}}"#, quoted(&p))
                    }));
                    q.reverse();
                    q
                })
                .collect();
            let mut group = Vec::new();
            while queues.iter().any(|q| !q.is_empty()) {
                let i = rng.below(queues.len());
                if let Some(f) = queues[i].pop() {
                    group.push(f);
                }
                if rng.chance(2) && !group.is_empty() {
                    stream.push(format!(
                        r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{}]}}}}]}}"#,
                        group.join(",")
                    ));
                    group.clear();
                }
            }
            stream.push(format!(
                r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{}]}},"finish_reason":"tool_calls"}}]}}"#,
                group.join(",")
            ));
            stream.push("[DONE]".into());
            format!(
                r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","tool_calls":[{}]}},"finish_reason":"tool_calls"}}]}}"#,
                items.join(",")
            )
        }
        Provider::OpenAiResponses => {
            let mut items = Vec::new();
            for (i, c) in calls.iter().enumerate() {
                let head = format!(
                    r#""type":"function_call","call_id":{},"name":{}"#,
                    quoted(c.id.as_deref().unwrap()),
                    quoted(&c.name)
                );
                let item = format!(
                    r#"{{{head},"arguments":{},"status":"completed"}}"#,
                    quoted(&c.args)
                );
                stream.push(format!(
                    r#"{{"type":"response.output_item.added","output_index":{i},"item":{{{head},"arguments":"","status":"in_progress"}}}}"#
                ));
                for p in pieces(rng, &c.args) {
                    stream.push(format!(
                        r#"{{"type":"response.function_call_arguments.delta","output_index":{i},"delta":{}}}"#,
                        quoted(&p)
                    ));
                }
                if rng.chance(2) {
                    stream.push(format!(
                        r#"{{"type":"response.function_call_arguments.done","output_index":{i},"arguments":{}}}"#,
                        quoted(&c.args)
                    ));
                }
                stream.push(format!(
                    r#"{{"type":"response.output_item.done","output_index":{i},"item":{item}}}"#
                ));
                items.push(item);
            }
            let whole = format!(r#"{{"status":"completed","output":[{}]}}"#, items.join(","));
            stream.push(if rng.chance(2) {
                format!(r#"{{"type":"response.completed","response":{whole}}}"#)
            } else {
                r#"{"type":"response.completed","response":{"status":"completed"}}"#.to_owned()
            });
            whole
        }
        Provider::Anthropic => {
            let mut blocks = Vec::new();
            for (i, c) in calls.iter().enumerate() {
                let head = format!(
                    r#""type":"tool_use","id":{},"name":{}"#,
                    quoted(c.id.as_deref().unwrap()),
                    quoted(&c.name)
                );
                blocks.push(format!(r#"{{{head},"input":{}}}"#, c.args));
                stream.push(format!(
                    r#"{{"type":"content_block_start","index":{i},"content_block":{{{head},"input":{{}}}}}}"#
                ));
                for p in pieces(rng, &c.args) {
                    stream.push(format!(
                        r#"{{"type":"content_block_delta","index":{i},"delta":{{"type":"input_json_delta","partial_json":{}}}}}"#,
                        quoted(&p)
                    ));
                }
                stream.push(format!(r#"{{"type":"content_block_stop","index":{i}}}"#));
            }
            stream.push(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#.into());
            stream.push(r#"{"type":"message_stop"}"#.into());
            format!(
                r#"{{"content":[{}],"stop_reason":"tool_use"}}"#,
                blocks.join(",")
            )
        }
        _ => {
            // Gemini: whole parts, text between them, in chunks grouped at
            // random, as SSE payloads or one JSON array.
            let mut parts = Vec::new();
            for c in calls {
                if rng.chance(2) {
                    parts.push(r#"{"text":"…"}"#.to_owned());
                }
                let id =
                    c.id.as_ref()
                        .map_or(String::new(), |id| format!(r#""id":{},"#, quoted(id)));
                parts.push(format!(
                    r#"{{"functionCall":{{{id}"name":{},"args":{}}}}}"#,
                    quoted(&c.name),
                    c.args
                ));
            }
            let mut chunks = Vec::new();
            let mut group: Vec<String> = Vec::new();
            for part in &parts {
                group.push(part.clone());
                if rng.chance(2) {
                    chunks.push(format!(
                        r#"{{"candidates":[{{"content":{{"role":"model","parts":[{}]}}}}]}}"#,
                        group.join(",")
                    ));
                    group.clear();
                }
            }
            chunks.push(format!(
                r#"{{"candidates":[{{"content":{{"role":"model","parts":[{}]}},"finishReason":"STOP"}}]}}"#,
                group.join(",")
            ));
            if rng.chance(2) {
                stream.push(format!("[{}]", chunks.join(",")));
            } else {
                stream = chunks;
            }
            format!(
                r#"{{"candidates":[{{"content":{{"role":"model","parts":[{}]}},"finishReason":"STOP"}}]}}"#,
                parts.join(",")
            )
        }
    };
    (whole, stream)
}

/// P3. A response parsed twice (a retry after a crash) and streamed in
/// random fragmentations and groupings gives the same calls every time:
/// same execution ids, same argument digests, same positions; ids within a
/// response are distinct, and the same response in the next round gives
/// all-new ids. 1,500 seeded responses per streaming provider (ids with
/// separators, escapes and 200-byte prefixes; Gemini with and without ids).
#[test]
fn a_response_reparsed_or_restreamed_gives_the_same_execution_ids_and_digests() {
    let op = OperationId::new("op:r3#%").unwrap();
    let mut rng = Rng::new(0xfeed_0003);
    for provider in [
        Provider::OpenAiChat,
        Provider::OpenAiResponses,
        Provider::Anthropic,
        Provider::Gemini,
    ] {
        for case in 0..1_500 {
            let ids = provider != Provider::Gemini || rng.chance(2);
            let calls = gen_calls(&mut rng, ids);
            let (whole, stream) = response_and_stream(&mut rng, provider, &calls);
            let identity =
                |parsed: &[ToolCall], round: u32| -> Vec<(ExecutionId, ArgsDigest, u32)> {
                    parsed
                        .iter()
                        .map(|c| (exec_id(&op, round, c), digest(c), c.position))
                        .collect()
                };
            let first = parse(provider, &whole, 3)
                .unwrap_or_else(|e| panic!("{provider} case {case}: {e:?}\n{whole}"));
            assert_eq!(first.len(), calls.len());
            let again = parse(provider, &whole, 3).unwrap();
            assert_eq!(first, again);
            let streamed = assemble(provider, 3, &stream)
                .unwrap_or_else(|e| panic!("{provider} case {case}: {e:?}\n{stream:#?}"));
            assert_eq!(
                identity(&first, 3),
                identity(&streamed, 3),
                "{provider} case {case}"
            );
            let mut distinct = HashSet::new();
            for (id, _, _) in identity(&first, 3) {
                assert!(distinct.insert(id));
            }
            for (id, _, _) in identity(&parse(provider, &whole, 4).unwrap(), 4) {
                assert!(!distinct.contains(&id));
            }
        }
    }
}

/// P4. Every cut of a stream (its first n chunks) either refuses or, once
/// the terminal event is in, gives exactly the whole stream's calls: a
/// stream cut short never hands out fewer, other or half calls. The
/// fixture streams of all four providers, and 300 seeded streams each.
#[test]
fn a_stream_cut_short_never_hands_out_other_calls() {
    let fixtures = [
        (Provider::OpenAiChat, "openai_chat_stream"),
        (Provider::OpenAiResponses, "openai_responses_stream"),
        (Provider::Anthropic, "anthropic_stream"),
        (Provider::Gemini, "gemini_stream"),
        (Provider::Gemini, "gemini_server_mcp_stream"),
    ];
    let check = |provider: Provider, chunks: &[String]| {
        let full = assemble(provider, 0, chunks).unwrap();
        for n in 0..chunks.len() {
            if let Ok(calls) = assemble(provider, 0, &chunks[..n]) {
                assert_eq!(calls, full, "{provider}: the first {n} chunks");
            }
        }
    };
    for (provider, name) in fixtures {
        let path = format!(
            "{}/tests/fixtures/providers/{name}.jsonl",
            env!("CARGO_MANIFEST_DIR")
        );
        let chunks: Vec<String> = std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        check(provider, &chunks);
    }
    let mut rng = Rng::new(0xc07_0003);
    for provider in [
        Provider::OpenAiChat,
        Provider::OpenAiResponses,
        Provider::Anthropic,
        Provider::Gemini,
    ] {
        for _ in 0..300 {
            let calls = gen_calls(&mut rng, true);
            let (_, stream) = response_and_stream(&mut rng, provider, &calls);
            check(provider, &stream);
        }
    }
}

/// P5. Gemini calls without ids are named by round and position. A
/// regenerated response of the same round with the calls in another order
/// never replays one call's stored result for another: the ledger answers
/// `Conflict` (the digests differ), and a response with one of two
/// identical calls removed replays only what it asks.
#[test]
fn gemini_positional_ids_never_replay_another_calls_result() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("gemini.db"));
    let op = op("op_gemini");
    let turn = |calls: &[(&str, &str)]| {
        let parts: Vec<String> = calls
            .iter()
            .map(|(name, args)| format!(r#"{{"functionCall":{{"name":"{name}","args":{args}}}}}"#))
            .collect();
        format!(
            r#"{{"candidates":[{{"content":{{"role":"model","parts":[{}]}},"finishReason":"STOP"}}]}}"#,
            parts.join(",")
        )
    };
    let specs = |doc: &str| -> Vec<CallSpec> {
        parse(Provider::Gemini, doc, 0)
            .unwrap()
            .into_iter()
            .map(|c| CallSpec::new(c, 1))
            .collect()
    };
    let first = specs(&turn(&[
        ("pay", r#"{"cents":100}"#),
        ("pay", r#"{"cents":5000}"#),
    ]));
    for (i, answer) in ledger
        .begin_round(&op, 0, &first)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        let t = ticket(answer);
        ledger
            .commit(
                &current(&ledger, &t.execution_id),
                &format!(r#"{{"paid":{i}}}"#),
                None,
            )
            .unwrap();
    }
    let swapped = specs(&turn(&[
        ("pay", r#"{"cents":5000}"#),
        ("pay", r#"{"cents":100}"#),
    ]));
    for answer in ledger.begin_round(&op, 0, &swapped).unwrap() {
        assert!(matches!(answer, Begin::Conflict { .. }), "{answer:?}");
    }
    let one = specs(&turn(&[("pay", r#"{"cents":100}"#)]));
    match ledger.begin_round(&op, 0, &one).unwrap().remove(0) {
        Begin::Replay(stored) => assert_eq!(stored.result_json, r#"{"paid":0}"#),
        other => panic!("{other:?}"),
    }
}

/// P6. Mutated responses and streams never panic, and whatever parses
/// parses the same again, with digestible or typed-refused arguments: every
/// fixture under every parser, 400 seeded mutations each (cut, duplicated
/// or deleted ranges, inserted structural tokens), and every fixture stream
/// with mutated chunks.
#[test]
fn mutated_responses_and_streams_never_panic() {
    const TOKENS: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "\\",
        "\\u",
        "d83d",
        "null",
        "1e400",
        "-0",
        "0e99999999999",
        "\"type\":\"tool_use\"",
        "\"functionCall\":{}",
        "\"willContinue\":true",
        "\"id\":\"\"",
        "\"finishReason\":\"STOP\"",
        "\"status\":\"in_progress\"",
        "\"index\":0",
        "é",
        "😀",
    ];
    let dir = format!("{}/tests/fixtures/providers", env!("CARGO_MANIFEST_DIR"));
    // `PROVIDER_REVIEW_MUTATIONS` sizes a longer run (and its seed).
    let rounds: usize = std::env::var("PROVIDER_REVIEW_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut rng = Rng::new(0xbad_0003 ^ rounds as u64);
    let mutate = |rng: &mut Rng, text: &str| -> String {
        let mut out = text.to_owned();
        for _ in 0..1 + rng.below(3) {
            let boundaries: Vec<usize> = (0..=out.len())
                .filter(|&i| out.is_char_boundary(i))
                .collect();
            let a = *rng.pick(&boundaries);
            let b = *rng.pick(&boundaries);
            let (a, b) = (a.min(b), a.max(b));
            out = match rng.below(4) {
                0 => format!("{}{}", &out[..a], &out[b..]),
                1 => format!("{}{}{}", &out[..b], &out[a..b], &out[b..]),
                2 => format!("{}{}{}", &out[..a], rng.pick(TOKENS), &out[a..]),
                _ => out[..b].to_owned(),
            };
        }
        out
    };
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".json") {
            for _ in 0..rounds {
                let doc = mutate(&mut rng, &text);
                for provider in ALL {
                    let outcome = parse(provider, &doc, 1);
                    assert_eq!(outcome, parse(provider, &doc, 1));
                    for call in outcome.into_iter().flatten() {
                        let _ = digest_arguments(
                            &call.tool_name,
                            1,
                            &call.arguments,
                            &JsonLimits::default(),
                        );
                    }
                }
            }
        } else if name.ends_with(".jsonl") {
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let provider = match name.split('_').next().unwrap() {
                "openai" if name.contains("responses") => Provider::OpenAiResponses,
                "openai" => Provider::OpenAiChat,
                "anthropic" => Provider::Anthropic,
                _ => Provider::Gemini,
            };
            for _ in 0..rounds {
                let mut chunks: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                let i = rng.below(chunks.len());
                chunks[i] = mutate(&mut rng, &chunks[i]);
                if rng.chance(3) {
                    let j = rng.below(chunks.len());
                    let dup = chunks[j].clone();
                    chunks.insert(j, dup);
                }
                let outcome = assemble(provider, 1, &chunks);
                assert_eq!(outcome, assemble(provider, 1, &chunks));
            }
        }
    }
}

/// P7. One call's arguments text (escapes, a surrogate pair written as two
/// `\u` escapes, a 20-digit integer, `-0`, `1E+2`) split into two and into
/// three fragments at every pair of char boundaries, streamed through Chat,
/// Responses and Anthropic; and one Gemini string argument split into
/// `stringValue` pieces at every boundary: always the call the whole
/// response gives (same execution id, same arguments text, same digest).
#[test]
fn arguments_split_at_every_boundary_assemble_to_the_whole_call() {
    let args = r#"{"to":"zo\u00eb@example.ch","note":"say \"hi\" \ud83d\ude00 \\o/","n":[18446744073709551617,-0,1E+2,0.5e-3],"k":{"x":null}}"#;
    let op = op("op_split");
    let wholes: Vec<(Provider, String)> = [
        Provider::OpenAiChat,
        Provider::OpenAiResponses,
        Provider::Anthropic,
    ]
    .into_iter()
    .map(|p| (p, one_call_payload(p, "call:1#%", "pay", args)))
    .collect();
    let expected: Vec<ToolCall> = wholes
        .iter()
        .map(|(p, doc)| parse(*p, doc, 1).unwrap().remove(0))
        .collect();
    let stream_of = |provider: Provider, parts: &[&str]| -> Vec<String> {
        match provider {
            Provider::OpenAiChat => {
                let mut s = vec![r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call:1#%","type":"function","function":{"name":"pay","arguments":""}}]}}]}"#.to_owned()];
                s.extend(parts.iter().map(|p| format!(r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":{}}}}}]}}}}]}}"#, quoted(p))));
                s.push(
                    r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#
                        .to_owned(),
                );
                s
            }
            Provider::OpenAiResponses => {
                let mut s = vec![r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"call:1#%","name":"pay","arguments":"","status":"in_progress"}}"#.to_owned()];
                s.extend(parts.iter().map(|p| format!(r#"{{"type":"response.function_call_arguments.delta","output_index":0,"delta":{}}}"#, quoted(p))));
                s.push(format!(r#"{{"type":"response.output_item.done","output_index":0,"item":{{"type":"function_call","call_id":"call:1#%","name":"pay","arguments":{},"status":"completed"}}}}"#, quoted(args)));
                s.push(r#"{"type":"response.completed","response":{}}"#.to_owned());
                s
            }
            _ => {
                let mut s = vec![r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"call:1#%","name":"pay","input":{}}}"#.to_owned()];
                s.extend(parts.iter().map(|p| format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"input_json_delta","partial_json":{}}}}}"#, quoted(p))));
                s.push(r#"{"type":"content_block_stop","index":0}"#.to_owned());
                s.push(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#.to_owned());
                s.push(r#"{"type":"message_stop"}"#.to_owned());
                s
            }
        }
    };
    let cuts: Vec<usize> = (0..=args.len())
        .filter(|&i| args.is_char_boundary(i))
        .collect();
    let mut streams = 0;
    for (i, &a) in cuts.iter().enumerate() {
        for &b in &cuts[i..] {
            let parts = [&args[..a], &args[a..b], &args[b..]];
            for ((provider, _), want) in wholes.iter().zip(&expected) {
                let got = assemble(*provider, 1, &stream_of(*provider, &parts)).unwrap();
                assert_eq!(&got[0], want, "{provider} cut at {a}, {b}");
                assert_eq!(exec_id(&op, 1, &got[0]), exec_id(&op, 1, want));
                assert_eq!(digest(&got[0]), digest(want));
                streams += 1;
            }
        }
    }
    assert!(streams > 20_000, "{streams}");
    // All three providers' calls carry one digest.
    let digests: HashSet<_> = expected.iter().map(digest).collect();
    assert_eq!(digests.len(), 1);

    // Gemini: a string argument in `stringValue` pieces cut at every pair
    // of boundaries.
    let text = "Grüße 👋 \"q\" \\ 東京\n\u{2028}end";
    let whole = format!(
        r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"name":"say","args":{{"text":{}}}}}}}]}},"finishReason":"STOP"}}]}}"#,
        quoted(text)
    );
    let want = parse(Provider::Gemini, &whole, 1).unwrap();
    let cuts: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for (i, &a) in cuts.iter().enumerate() {
        for &b in &cuts[i..] {
            let parts = [&text[..a], &text[a..b], &text[b..]];
            let mut chunks = vec![r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"say","willContinue":true}}]}}]}"#.to_owned()];
            for (n, p) in parts.iter().enumerate() {
                chunks.push(format!(
                    r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"partialArgs":[{{"jsonPath":"$.text","stringValue":{},"willContinue":{}}}],"willContinue":true}}}}]}}}}]}}"#,
                    quoted(p),
                    n < 2
                ));
            }
            chunks.push(r#"{"candidates":[{"content":{"parts":[{"functionCall":{}}]},"finishReason":"STOP"}]}"#.to_owned());
            assert_eq!(
                assemble(Provider::Gemini, 1, &chunks).unwrap(),
                want,
                "cut at {a}, {b}"
            );
        }
    }
}

/// P8. A model that names every call `call_0` (every round) gets one
/// execution per round: the repeat of round 1 replays round 1's result
/// only, for every provider's parse of such a response; two calls sharing
/// `call_0` in one response are refused whole (`DuplicateCallId`).
#[test]
fn a_call_id_reused_in_every_round_never_replays_another_rounds_result() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("reuse.db"));
    for provider in [
        Provider::OpenAiChat,
        Provider::OpenAiResponses,
        Provider::Anthropic,
        Provider::Gemini,
        Provider::Mcp,
    ] {
        let op = op(&format!("op_reuse_{provider}"));
        let round_doc = |round: u32| {
            one_call_payload(
                provider,
                "call_0",
                "pay",
                &format!(r#"{{"cents":{}}}"#, (round + 1) * 100),
            )
        };
        for round in 0..3 {
            let calls = parse(provider, &round_doc(round), round).unwrap();
            let t = ticket(
                ledger
                    .begin(&op, round, &CallSpec::new(calls[0].clone(), 1))
                    .unwrap(),
            );
            ledger
                .commit(
                    &current(&ledger, &t.execution_id),
                    &format!(r#"{{"round":{round}}}"#),
                    None,
                )
                .unwrap();
        }
        let again = parse(provider, &round_doc(1), 1).unwrap();
        match ledger
            .begin(&op, 1, &CallSpec::new(again[0].clone(), 1))
            .unwrap()
        {
            Begin::Replay(stored) => assert_eq!(stored.result_json, r#"{"round":1}"#),
            other => panic!("{provider}: {other:?}"),
        }
        // Round 1's arguments offered in round 2: a conflict, not a replay.
        assert!(matches!(
            ledger
                .begin(&op, 2, &CallSpec::new(again[0].clone(), 1))
                .unwrap(),
            Begin::Conflict { .. }
        ));
    }
    let twice = r#"{"content":[{"type":"tool_use","id":"call_0","name":"pay","input":{"cents":1}},{"type":"tool_use","id":"call_0","name":"pay","input":{"cents":2}}]}"#;
    assert_eq!(
        parse(Provider::Anthropic, twice, 0),
        Err(ProviderError::DuplicateCallId {
            provider: Provider::Anthropic,
            first: 0,
            second: 1
        })
    );
}

/// P9. MCP request ids: a number and a string of the same digits are two
/// calls (two execution ids), two spellings of one string (`"7"`,
/// `"\u0037"`) are one; ids holding quotes, escapes, controls and
/// separators come back in the response exactly as the request sent them;
/// an `isError` result never carries `structuredContent`.
#[test]
fn mcp_ids_keep_their_type_and_value_and_come_back_unchanged() {
    use toolledger::provider::{render_mcp_result, McpProtocol, ToolResultContent};
    let op = op("op_mcp");
    let request = |id: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"pay","arguments":{{"cents":1}}}}}}"#
        )
    };
    let id_of = |id: &str| exec_id(&op, 0, &parse(Provider::Mcp, &request(id), 0).unwrap()[0]);
    assert_ne!(id_of("7"), id_of(r#""7""#));
    assert_eq!(id_of(r#""7""#), id_of(r#""\u0037""#));
    let mut rng = Rng::new(0x3c9_0003);
    let mut seen: HashMap<ExecutionId, String> = HashMap::new();
    for _ in 0..2_000 {
        let text = gen_id(&mut rng) + &gen_string(&mut rng, 4);
        let mut spelled = String::new();
        write_str(&mut rng, &mut spelled, &text);
        let calls = parse(Provider::Mcp, &request(&spelled), 0).unwrap();
        let id = exec_id(&op, 0, &calls[0]);
        if let Some(before) = seen.insert(id, text.clone()) {
            assert_eq!(before, text);
        }
        for is_error in [false, true] {
            let rendered = render_mcp_result(
                &calls[0],
                &ToolResultContent {
                    output_json: r#"{"ok":true}"#.into(),
                    is_error,
                },
                McpProtocol::V2025_11_25,
            )
            .unwrap();
            let value: serde_json::Value = serde_json::from_str(&rendered).unwrap();
            assert_eq!(value["id"], serde_json::Value::String(text.clone()));
            assert_eq!(value["result"]["isError"], is_error);
            assert_eq!(
                value["result"].get("structuredContent").is_some(),
                !is_error
            );
        }
    }
}

/// The leaves of `val` as (RFC 9535 path, JSON value text), in document
/// order; `None` if it holds an empty container (no leaf can name it).
fn leaves(rng: &mut Rng, val: &Val, path: String, out: &mut Vec<(String, String)>) -> Option<()> {
    match val {
        Val::Arr(items) if items.is_empty() => None,
        Val::Obj(members) if members.is_empty() => None,
        Val::Arr(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| leaves(rng, item, format!("{path}[{i}]"), out)),
        Val::Obj(members) => members.iter().try_for_each(|(key, item)| {
            let simple = !key.is_empty()
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !key.starts_with(|c: char| c.is_ascii_digit());
            let step = if simple && rng.chance(2) {
                format!(".{key}")
            } else {
                // Bracketed, single-quoted, with the escapes the module reads.
                let mut quoted_key = String::new();
                for ch in key.chars() {
                    match ch {
                        '\'' => quoted_key.push_str("\\'"),
                        '\\' => quoted_key.push_str("\\\\"),
                        '\n' => quoted_key.push_str("\\n"),
                        '\t' => quoted_key.push_str("\\t"),
                        c => quoted_key.push(c),
                    }
                }
                format!("['{quoted_key}']")
            };
            leaves(rng, item, format!("{path}{step}"), out)
        }),
        leaf => {
            let mut text = String::new();
            write_val(rng, &mut text, leaf);
            out.push((path, text));
            Some(())
        }
    }
}

/// P10. Gemini arguments streamed leaf by leaf (`partialArgs` with
/// `$.name`, `['quoted']` and `[index]` paths, strings cut into continued
/// pieces, numbers kept as sent) assemble to the call the whole response
/// gives: same derived id, same digest. 2,000 seeded argument objects.
#[test]
fn gemini_partial_args_assemble_to_the_whole_calls_digest() {
    let mut rng = Rng::new(0x9e3_0003);
    let op = op("op_partial");
    let mut checked = 0;
    for case in 0..2_000 {
        let val = gen_obj(&mut rng, 3);
        let mut paths = Vec::new();
        if leaves(&mut rng, &val, "$".into(), &mut paths).is_none() || paths.is_empty() {
            continue;
        }
        // Control characters in keys cannot be written in a path piece
        // without `\u` escapes, which the module refuses; skip those.
        if paths.iter().any(|(p, _)| {
            p.chars()
                .any(|c| (c as u32) < 0x20 && c != '\n' && c != '\t')
        }) {
            continue;
        }
        let args = spell(&mut rng, &val);
        let whole = format!(
            r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"name":"f","args":{args}}}}}]}},"finishReason":"STOP"}}]}}"#
        );
        let want = parse(Provider::Gemini, &whole, 2).unwrap();
        let mut pieces = Vec::new();
        for (path, text) in &paths {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            match value {
                serde_json::Value::String(s) => {
                    let cut = self::pieces(&mut rng, &s);
                    let last = cut.len() - 1;
                    for (i, p) in cut.iter().enumerate() {
                        pieces.push(format!(
                            r#"{{"jsonPath":{},"stringValue":{},"willContinue":{}}}"#,
                            quoted(path),
                            quoted(p),
                            i < last
                        ));
                    }
                }
                serde_json::Value::Number(_) => pieces.push(format!(
                    r#"{{"jsonPath":{},"numberValue":{text}}}"#,
                    quoted(path)
                )),
                serde_json::Value::Bool(b) => pieces.push(format!(
                    r#"{{"jsonPath":{},"boolValue":{b}}}"#,
                    quoted(path)
                )),
                _ => pieces.push(format!(
                    r#"{{"jsonPath":{},"nullValue":null}}"#,
                    quoted(path)
                )),
            }
        }
        let mut chunks = vec![r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","willContinue":true}}]}}]}"#.to_owned()];
        let mut rest = pieces.as_slice();
        while !rest.is_empty() {
            let n = 1 + rng.below(rest.len().min(3));
            chunks.push(format!(
                r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"partialArgs":[{}],"willContinue":true}}}}]}}}}]}}"#,
                rest[..n].join(",")
            ));
            rest = &rest[n..];
        }
        chunks.push(
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{}}]},"finishReason":"STOP"}]}"#
                .to_owned(),
        );
        let got = assemble(Provider::Gemini, 2, &chunks)
            .unwrap_or_else(|e| panic!("case {case}: {e:?}\n{paths:?}"));
        assert_eq!(
            exec_id(&op, 2, &got[0]),
            exec_id(&op, 2, &want[0]),
            "case {case}"
        );
        assert_eq!(digest(&got[0]), digest(&want[0]), "case {case}: {paths:?}");
        checked += 1;
    }
    assert!(checked > 500, "{checked}");
}

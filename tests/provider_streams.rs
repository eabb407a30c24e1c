//! Streamed responses: chunks assemble into exactly the calls the whole
//! response gives, and a call still in pieces is never returned as runnable.

use proptest::prelude::*;
use toolledger::model::{Provider, ToolCall};
use toolledger::provider::{parse_tool_calls, ParseLimits, ProviderError, StreamAssembler};

fn chunks(name: &str) -> Vec<String> {
    let path = format!(
        "{}/tests/fixtures/providers/{name}.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

fn assemble<S: AsRef<str>>(
    provider: Provider,
    chunks: &[S],
) -> Result<Vec<ToolCall>, ProviderError> {
    let mut stream = StreamAssembler::new(provider, 2, ParseLimits::default())?;
    for chunk in chunks {
        stream.push(chunk.as_ref())?;
    }
    stream.finish()
}

fn call(
    provider: Provider,
    id: &str,
    derived: bool,
    name: &str,
    args: &str,
    position: u32,
) -> ToolCall {
    ToolCall {
        provider,
        call_id: id.into(),
        call_id_derived: derived,
        tool_name: name.into(),
        arguments: args.into(),
        position,
    }
}

#[test]
fn openai_chat_fragments_join_into_calls() {
    let chat = Provider::OpenAiChat;
    assert_eq!(
        assemble(chat, &chunks("openai_chat_stream")).unwrap(),
        vec![
            call(
                chat,
                "call_St1rM7kQ2wX9pL4v",
                false,
                "convert_currency",
                r#"{"amount":224.18827276432074,"from":"EUR","to":"CHF"}"#,
                0
            ),
            call(
                chat,
                "call_St2nW5hJ8cV3bN6m",
                false,
                "send_message",
                r#"{"text":"Grüße 👋, the rate is in","to":"+41 44 123 45 67"}"#,
                1
            ),
        ]
    );
}

#[test]
fn openai_responses_events_join_into_calls() {
    let responses = Provider::OpenAiResponses;
    let expected = vec![
        call(
            responses,
            "call_Rs1vE4nT7sQ2aZ8x",
            false,
            "billing.create_invoice",
            r#"{"amount":1249.90,"customer":"Ada Lovelace","lines":18446744073709551617}"#,
            0,
        ),
        call(
            responses,
            "call_Rs2pK9mB3vC6nD1q",
            false,
            "get_weather",
            r#"{"city":"Zürich","days":-0}"#,
            1,
        ),
    ];
    let all = chunks("openai_responses_stream");
    assert_eq!(assemble(responses, &all).unwrap(), expected);
    // The terminal event alone (a proxy that forwards only it) gives the same.
    assert_eq!(
        assemble(responses, &all[all.len() - 1..]).unwrap(),
        expected
    );
}

#[test]
fn anthropic_input_json_deltas_join_into_calls() {
    let anthropic = Provider::Anthropic;
    assert_eq!(
        assemble(anthropic, &chunks("anthropic_stream")).unwrap(),
        vec![
            call(
                anthropic,
                "toolu_01StA7cXq3Lm7Tz2RkVb8HwN",
                false,
                "book_table",
                r#"{"deposit":0.30000000000000004,"party":4,"restaurant":"Café Nicola","time":"19:30"}"#,
                0
            ),
            call(
                anthropic,
                "toolu_01StB2kPz8Wn5Qy1JdSx6GtM",
                false,
                "list_reminders",
                "{}",
                1
            ),
        ]
    );
}

#[test]
fn anthropic_blocks_in_message_start_are_not_lost() {
    let anthropic = Provider::Anthropic;
    let stream = [
        r#"{"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[{"type":"tool_use","id":"toolu_0","name":"get_weather","input":{"city":"Oslo"}}]}}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"list_reminders","input":{}}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"message_stop"}"#,
    ];
    assert_eq!(
        assemble(anthropic, &stream).unwrap(),
        vec![
            call(
                anthropic,
                "toolu_0",
                false,
                "get_weather",
                r#"{"city":"Oslo"}"#,
                0
            ),
            call(anthropic, "toolu_1", false, "list_reminders", "{}", 1),
        ]
    );
}

#[test]
fn gemini_partial_args_join_into_calls() {
    let gemini = Provider::Gemini;
    let all = chunks("gemini_stream");
    assert_eq!(
        assemble(gemini, &all).unwrap(),
        vec![
            call(
                gemini,
                "fc-9a41d2",
                false,
                "set_thermostat",
                r#"{"celsius":21.50,"note":null,"room":"Living room","schedule":[{"eco":false,"from":"06:30"}]}"#,
                0
            ),
            call(
                gemini,
                "gemini_r2_p1",
                true,
                "get_forecast",
                r#"{"city":"Bern","days":2}"#,
                1
            ),
        ]
    );
    // The same chunks as the JSON array a non-SSE stream returns.
    let array = format!("[{}]", all.join(","));
    assert_eq!(
        assemble(gemini, &[array]).unwrap(),
        assemble(gemini, &all).unwrap()
    );
}

#[test]
fn gemini_server_answers_in_a_later_chunk_still_count() {
    // Server-side MCP, streamed: the call and the API's answer arrive in
    // different chunks. Parsed alone, the first chunk cannot know the call
    // was answered; assembled, it is skipped.
    let gemini = Provider::Gemini;
    let stream = [
        r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"get_forecast","args":{"city":"Oslo"}}}]}}]}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"functionResponse":{"name":"get_forecast","response":{"sky":"clear"}}}]}}]}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Clear skies in Oslo."}]},"finishReason":"STOP"}]}"#,
    ];
    assert_eq!(assemble(gemini, &stream).unwrap(), vec![]);
    assert_eq!(
        parse_tool_calls(gemini, stream[0], 0, &ParseLimits::default())
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn no_chunk_with_a_partial_call_parses_as_a_call() {
    // Parsed one by one, the Gemini chunks give either no calls, the whole
    // call of a chunk, or a refusal: never the streamed call with missing
    // arguments.
    for (index, chunk) in chunks("gemini_stream").iter().enumerate() {
        let parsed = parse_tool_calls(Provider::Gemini, chunk, 2, &ParseLimits::default());
        match index {
            1..=4 => assert!(
                matches!(parsed, Err(ProviderError::IncompleteCall { .. })),
                "chunk {index}: {parsed:?}"
            ),
            5 => assert!(
                matches!(parsed, Err(ProviderError::MissingField { ref field, .. }) if field.ends_with("functionCall.name")),
                "chunk {index}: {parsed:?}"
            ),
            6 => assert_eq!(parsed.unwrap().len(), 1),
            _ => assert_eq!(parsed.unwrap(), vec![]),
        }
    }
}

#[test]
fn a_chat_responses_or_anthropic_event_is_no_response() {
    for (provider, name) in [
        (Provider::OpenAiChat, "openai_chat_stream"),
        (Provider::OpenAiResponses, "openai_responses_stream"),
        (Provider::Anthropic, "anthropic_stream"),
    ] {
        for chunk in chunks(name) {
            let parsed = parse_tool_calls(provider, &chunk, 0, &ParseLimits::default());
            assert!(
                matches!(
                    parsed,
                    Err(ProviderError::MissingField { .. } | ProviderError::InvalidJson { .. })
                ),
                "{name}: {parsed:?}"
            );
        }
    }
}

#[test]
fn streams_without_their_end_give_nothing() {
    for (provider, name, reason) in [
        (
            Provider::OpenAiChat,
            "openai_chat_stream",
            "no chunk carried a finish_reason",
        ),
        (
            Provider::OpenAiResponses,
            "openai_responses_stream",
            "no response.completed event",
        ),
        (
            Provider::Anthropic,
            "anthropic_stream",
            "no message_stop event",
        ),
        (
            Provider::Gemini,
            "gemini_stream",
            "no chunk carried a finishReason",
        ),
    ] {
        let all = chunks(name);
        let mut stream = StreamAssembler::new(provider, 0, ParseLimits::default()).unwrap();
        // Everything up to (not including) the terminal event.
        let cut = all
            .iter()
            .position(|chunk| {
                chunk.contains("finish_reason\":\"")
                    || chunk.contains("response.completed")
                    || chunk.contains("message_stop")
                    || chunk.contains("finishReason")
            })
            .unwrap();
        for chunk in &all[..cut] {
            stream.push(chunk).unwrap();
            assert!(!stream.is_complete(), "{name}");
        }
        assert_eq!(
            stream.finish(),
            Err(ProviderError::StreamIncomplete { provider, reason }),
            "{name}"
        );
    }
}

#[test]
fn a_call_open_at_the_end_is_refused() {
    // Anthropic: the tool_use block never got its content_block_stop.
    let mut anthropic: Vec<String> = chunks("anthropic_stream");
    anthropic.retain(|chunk| chunk != r#"{"type":"content_block_stop","index":1}"#);
    assert_eq!(
        assemble(Provider::Anthropic, &anthropic),
        Err(ProviderError::IncompleteCall {
            provider: Provider::Anthropic,
            field: "content[1]".into()
        })
    );
    // Responses: the item never got its output_item.done.
    let mut responses = chunks("openai_responses_stream");
    responses
        .retain(|chunk| !(chunk.contains("output_item.done") && chunk.contains("get_weather")));
    responses.pop();
    responses.push(r#"{"type":"response.incomplete","response":{"status":"incomplete"}}"#.into());
    assert_eq!(
        assemble(Provider::OpenAiResponses, &responses),
        Err(ProviderError::IncompleteCall {
            provider: Provider::OpenAiResponses,
            field: "output[2]".into()
        })
    );
    // Gemini: the stream ends inside the streamed call.
    let gemini = chunks("gemini_stream");
    let mut cut: Vec<String> = gemini[..5].to_vec();
    cut.push(
        r#"{"candidates":[{"content":{"role":"model","parts":[]},"finishReason":"MAX_TOKENS"}]}"#
            .into(),
    );
    assert_eq!(
        assemble(Provider::Gemini, &cut),
        Err(ProviderError::IncompleteCall {
            provider: Provider::Gemini,
            field: "candidates[0].content.parts[1].functionCall".into()
        })
    );
    // Gemini: the call ends while a string argument is still continuing.
    let mut open_string: Vec<String> = gemini[..3].to_vec();
    open_string.push(gemini[5].clone());
    assert!(matches!(
        assemble(Provider::Gemini, &open_string),
        Err(ProviderError::IncompleteCall { .. })
    ));
    // Chat: the choice stopped at the token limit.
    let mut chat = chunks("openai_chat_stream");
    let length = chat[8].replace("\"tool_calls\"}", "\"length\"}");
    chat[8] = length;
    assert_eq!(
        assemble(Provider::OpenAiChat, &chat),
        Err(ProviderError::IncompleteCall {
            provider: Provider::OpenAiChat,
            field: "choices[0].message.tool_calls[1]".into()
        })
    );
}

#[test]
fn chunks_that_do_not_fit_are_refused_and_poison_the_stream() {
    let mismatch = |provider, chunks: &[&str]| {
        let mut stream = StreamAssembler::new(provider, 0, ParseLimits::default()).unwrap();
        let mut outcome = Ok(());
        for chunk in chunks {
            outcome = stream.push(chunk);
            if outcome.is_err() {
                break;
            }
        }
        let err = outcome.unwrap_err();
        assert_eq!(
            stream.push("{}"),
            Err(ProviderError::StreamIncomplete {
                provider,
                reason: "an earlier chunk was refused"
            })
        );
        assert!(stream.finish().is_err());
        err
    };
    let chat_id_changes = mismatch(
        Provider::OpenAiChat,
        &[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"f","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_b","function":{"arguments":"{}"}}]}}]}"#,
        ],
    );
    assert_eq!(
        chat_id_changes,
        ProviderError::StreamMismatch {
            provider: Provider::OpenAiChat,
            chunk: 1,
            field: "chunk[1].choices[0].delta.tool_calls[0].id".into(),
            reason: "a value that differs from the one sent before"
        }
    );
    let anthropic_stray_delta = mismatch(
        Provider::Anthropic,
        &[
            r#"{"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{"}}"#,
        ],
    );
    assert!(matches!(
        anthropic_stray_delta,
        ProviderError::StreamMismatch {
            reason: "a delta for a block that is not open",
            ..
        }
    ));
    let responses_rewritten = mismatch(
        Provider::OpenAiResponses,
        &[
            r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"call_1","name":"pay","arguments":""}}"#,
            r#"{"type":"response.function_call_arguments.delta","output_index":0,"delta":"{\"amount\":1}"}"#,
            r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","call_id":"call_1","name":"pay","arguments":"{\"amount\":1000}"}}"#,
        ],
    );
    assert!(matches!(
        responses_rewritten,
        ProviderError::StreamMismatch {
            reason: "arguments differ from their deltas",
            ..
        }
    ));
    let gemini_second_value = mismatch(
        Provider::Gemini,
        &[
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"pay","willContinue":true,"partialArgs":[{"jsonPath":"$.amount","numberValue":1}]}}]}}]}"#,
            r#"{"candidates":[{"content":{"parts":[{"functionCall":{"partialArgs":[{"jsonPath":"$.amount","numberValue":1000}]}}]}}]}"#,
        ],
    );
    assert!(matches!(
        gemini_second_value,
        ProviderError::StreamMismatch {
            reason: "a second value for one path",
            ..
        }
    ));
    let after_the_end = mismatch(
        Provider::Anthropic,
        &[
            r#"{"type":"message_stop"}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}"#,
        ],
    );
    assert!(matches!(
        after_the_end,
        ProviderError::StreamMismatch {
            reason: "event after message_stop",
            ..
        }
    ));
}

#[test]
fn an_error_event_ends_the_stream_unusable() {
    for (provider, error) in [
        (
            Provider::Anthropic,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        (
            Provider::OpenAiResponses,
            r#"{"type":"error","code":"server_error","message":"x","sequence_number":3}"#,
        ),
    ] {
        let mut stream = StreamAssembler::new(provider, 0, ParseLimits::default()).unwrap();
        stream.push(error).unwrap();
        assert!(!stream.is_complete());
        assert_eq!(
            stream.finish(),
            Err(ProviderError::StreamIncomplete {
                provider,
                reason: "the provider reported an error"
            })
        );
    }
}

#[test]
fn limits_and_providers() {
    let limits = ParseLimits {
        max_bytes: 64,
        ..ParseLimits::default()
    };
    let mut stream = StreamAssembler::new(Provider::Anthropic, 0, limits).unwrap();
    stream.push(r#"{"type":"ping"}"#).unwrap();
    let big = format!(r#"{{"type":"ping","pad":"{}"}}"#, "x".repeat(60));
    assert!(matches!(
        stream.push(&big),
        Err(ProviderError::TooLarge { max: 64, .. })
    ));
    for provider in [Provider::Mcp, Provider::Custom] {
        assert_eq!(
            StreamAssembler::new(provider, 0, ParseLimits::default()).unwrap_err(),
            ProviderError::Unsupported { provider }
        );
    }
}

#[test]
fn debug_output_hides_arguments() {
    let mut stream = StreamAssembler::new(Provider::Anthropic, 0, ParseLimits::default()).unwrap();
    for chunk in chunks("anthropic_stream").iter().take(9) {
        stream.push(chunk).unwrap();
    }
    let debug = format!("{stream:?}");
    assert!(
        !debug.contains("Nicola") && !debug.contains("0.3"),
        "{debug}"
    );
    assert!(debug.contains("chunks: 9"), "{debug}");
}

/// Splits `text` into pieces at the given (char-boundary-adjusted) points.
fn split(text: &str, cuts: &[prop::sample::Index]) -> Vec<String> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|cut| {
            let mut at = cut.index(text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            at
        })
        .collect();
    points.sort_unstable();
    points.dedup();
    let mut pieces = Vec::new();
    let mut start = 0;
    for point in points.into_iter().chain([text.len()]) {
        pieces.push(text[start..point].to_owned());
        start = point;
    }
    pieces
}

/// JSON text of `text` as a JSON string.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

const ARGUMENTS: &str = r#"{"to": "zoë@example.ch", "amount": 224.18827276432074, "lines": [1e2, -0, 18446744073709551617], "note": "say \"hi\" 👋"}"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// However the arguments are split into fragments, the assembled call is
    /// the one the whole response gives.
    #[test]
    fn any_split_gives_the_whole_response_call(cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12)) {
        let pieces = split(ARGUMENTS, &cuts);
        let limits = ParseLimits::default();

        let whole_chat = format!(
            r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","tool_calls":[{{"id":"call_p","type":"function","function":{{"name":"pay","arguments":{}}}}}]}},"finish_reason":"tool_calls"}}]}}"#,
            quoted(ARGUMENTS)
        );
        let mut chat = vec![r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_p","type":"function","function":{"name":"pay","arguments":""}}]}}]}"#.to_owned()];
        chat.extend(pieces.iter().map(|piece| format!(
            r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":{}}}}}]}}}}]}}"#,
            quoted(piece)
        )));
        chat.push(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.to_owned());
        prop_assert_eq!(
            assemble(Provider::OpenAiChat, &chat).unwrap(),
            parse_tool_calls(Provider::OpenAiChat, &whole_chat, 2, &limits).unwrap()
        );

        let whole_message = format!(
            r#"{{"content":[{{"type":"tool_use","id":"toolu_p","name":"pay","input":{ARGUMENTS}}}],"stop_reason":"tool_use"}}"#
        );
        let mut anthropic = vec![r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_p","name":"pay","input":{}}}"#.to_owned()];
        anthropic.extend(pieces.iter().map(|piece| format!(
            r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"input_json_delta","partial_json":{}}}}}"#,
            quoted(piece)
        )));
        anthropic.push(r#"{"type":"content_block_stop","index":0}"#.to_owned());
        anthropic.push(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#.to_owned());
        anthropic.push(r#"{"type":"message_stop"}"#.to_owned());
        prop_assert_eq!(
            assemble(Provider::Anthropic, &anthropic).unwrap(),
            parse_tool_calls(Provider::Anthropic, &whole_message, 2, &limits).unwrap()
        );

        let item = format!(
            r#"{{"type":"function_call","call_id":"call_p","name":"pay","arguments":{},"status":"completed"}}"#,
            quoted(ARGUMENTS)
        );
        let whole_response = format!(r#"{{"status":"completed","output":[{item}]}}"#);
        let mut responses = vec![r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"call_p","name":"pay","arguments":"","status":"in_progress"}}"#.to_owned()];
        responses.extend(pieces.iter().map(|piece| format!(
            r#"{{"type":"response.function_call_arguments.delta","output_index":0,"delta":{}}}"#,
            quoted(piece)
        )));
        responses.push(format!(r#"{{"type":"response.output_item.done","output_index":0,"item":{item}}}"#));
        responses.push(r#"{"type":"response.completed","response":{"status":"completed"}}"#.to_owned());
        prop_assert_eq!(
            assemble(Provider::OpenAiResponses, &responses).unwrap(),
            parse_tool_calls(Provider::OpenAiResponses, &whole_response, 2, &limits).unwrap()
        );
    }

    /// A Gemini string argument split into any pieces is joined exactly.
    #[test]
    fn gemini_string_pieces_join(cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let text = "Grüße 👋 — \"quoted\" \\ and 東京";
        let pieces = split(text, &cuts);
        let mut chunks = vec![r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"say","willContinue":true}}]}}]}"#.to_owned()];
        let last = pieces.len() - 1;
        for (index, piece) in pieces.iter().enumerate() {
            chunks.push(format!(
                r#"{{"candidates":[{{"content":{{"parts":[{{"functionCall":{{"partialArgs":[{{"jsonPath":"$.text","stringValue":{},"willContinue":{}}}],"willContinue":true}}}}]}}}}]}}"#,
                quoted(piece),
                index != last
            ));
        }
        chunks.push(r#"{"candidates":[{"content":{"parts":[{"functionCall":{}}]},"finishReason":"STOP"}]}"#.to_owned());
        let calls = assemble(Provider::Gemini, &chunks).unwrap();
        prop_assert_eq!(calls.len(), 1);
        prop_assert_eq!(&calls[0].arguments, &format!(r#"{{"text":{}}}"#, quoted(text)));
    }
}

//! Providers: OpenAI, Anthropic, Gemini and MCP tool calls in, results out, streams, exact numbers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use proptest::prelude::*;
use serde_json::Value;
use toolledger::executor::*;
use toolledger::ledger::{Ledger, LedgerConfig, ManualClock};
use toolledger::model::{OperationId, Provider, ToolCall};
use toolledger::provider::{
    parse_tool_calls, render_mcp_result, render_tool_result, McpProtocol, ParseLimits,
    ProviderError, StreamAssembler, ToolResultContent,
};

// ---------------------------------------------------------------------------
// Provider round trips: raw model response → neutral calls → executor →
// provider-shaped tool results; a replay renders byte-identical results and
// runs nothing.
// ---------------------------------------------------------------------------
/// Echoes its arguments back; counts performs per downstream key.
struct Echo {
    name: &'static str,
    side_effect: bool,
    performs: Arc<Mutex<HashMap<String, u32>>>,
    total: AtomicU32,
}

#[async_trait]
impl ToolHandler for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        if self.side_effect {
            ToolDescriptor {
                idempotency_key: true,
                ..ToolDescriptor::side_effect(self.name, 1)
            }
        } else {
            ToolDescriptor::read_only(self.name, 1)
        }
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.total.fetch_add(1, Ordering::SeqCst);
        *self
            .performs
            .lock()
            .unwrap()
            .entry(req.downstream_key.to_string())
            .or_default() += 1;
        Ok(PerformOutcome::Committed {
            result_json: format!(
                r#"{{"ok":true,"tool":"{}","echo":{}}}"#,
                self.name, req.arguments_json
            ),
            external_id: None,
        })
    }
}

const SIDE_EFFECTS: &[&str] = &[
    "send_email",
    "create_event",
    "send_message",
    "send_receipt",
    "transfer_funds",
    // Three different tools: one name in two namespaces, and without one.
    "crm.create_record",
    "billing.create_record",
    "create_record",
];
const READ_ONLY: &[&str] = &[
    "get_weather",
    "list_calendars",
    "list_reminders",
    "lookup_order",
    // Run by Gemini's server in `gemini_server_mcp`: must never run here.
    "get_forecast",
    "get_alerts",
];

fn executor() -> (Executor, Arc<Mutex<HashMap<String, u32>>>) {
    let ledger =
        Ledger::open_in_memory(LedgerConfig::default(), Arc::new(ManualClock::new(0))).unwrap();
    let exec = Executor::new(Arc::new(ledger), ExecutorConfig::default());
    let performs = Arc::new(Mutex::new(HashMap::new()));
    for (names, side_effect) in [(SIDE_EFFECTS, true), (READ_ONLY, false)] {
        for &name in names {
            exec.register(Arc::new(Echo {
                name,
                side_effect,
                performs: performs.clone(),
                total: AtomicU32::new(0),
            }))
            .unwrap();
        }
    }
    (exec, performs)
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/providers/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// Checks the rendered message has the provider's shape for `call`.
fn assert_shape(provider: Provider, call: &ToolCall, rendered: &str) {
    let v: Value = serde_json::from_str(rendered).unwrap();
    match provider {
        Provider::OpenAiChat => {
            assert_eq!(v["role"], "tool");
            assert_eq!(v["tool_call_id"], call.call_id.as_str());
            assert!(v["content"].is_string());
        }
        Provider::OpenAiResponses => {
            assert_eq!(v["type"], "function_call_output");
            assert_eq!(v["call_id"], call.call_id.as_str());
            assert!(v["output"].is_string());
        }
        Provider::Anthropic => {
            assert_eq!(v["type"], "tool_result");
            assert_eq!(v["tool_use_id"], call.call_id.as_str());
        }
        Provider::Gemini => {
            assert_eq!(v["functionResponse"]["name"], call.tool_name.as_str());
            assert!(v["functionResponse"]["response"].is_object());
            assert_eq!(
                v["functionResponse"].get("id").is_some(),
                !call.call_id_derived
            );
        }
        Provider::Mcp => {
            assert_eq!(v["jsonrpc"], "2.0");
            assert_eq!(v["result"]["isError"], false);
            assert_eq!(v["result"]["content"][0]["type"], "text");
        }
        other => panic!("unexpected provider {other}"),
    }
}

/// Runs one fixture through parse, the executor, render and a replay;
/// returns the parsed calls and the total number of performs.
async fn round_trip(provider: Provider, fixture_name: &str) -> (Vec<ToolCall>, u32) {
    let (exec, performs) = executor();
    let op = OperationId::new(format!("op_{fixture_name}")).unwrap();
    let raw = fixture(fixture_name);
    let render_all = |calls: &[ToolCall], outcomes: &[CallOutcome]| -> Vec<String> {
        calls
            .iter()
            .zip(outcomes)
            .map(|(call, out)| {
                let output_json = out
                    .result_json()
                    .unwrap_or_else(|| panic!("{out:?}"))
                    .to_owned();
                render_tool_result(
                    call,
                    &ToolResultContent {
                        output_json,
                        is_error: false,
                    },
                )
                .unwrap()
            })
            .collect()
    };

    let calls = parse_tool_calls(provider, &raw, 3, &ParseLimits::default()).unwrap();
    assert!(!calls.is_empty());
    let first = exec.execute_round(&op, 3, calls.clone()).await.unwrap();
    let rendered = render_all(&calls, &first);
    for (call, text) in calls.iter().zip(&rendered) {
        assert_shape(provider, call, text);
    }
    // Unicode arguments survive the trip: the echoed arguments equal the
    // parsed ones as JSON values.
    for (call, out) in calls.iter().zip(&first) {
        let echoed: Value = serde_json::from_str(out.result_json().unwrap()).unwrap();
        let args: Value = serde_json::from_str(&call.arguments).unwrap();
        assert_eq!(echoed["echo"], args, "{fixture_name}: {}", call.tool_name);
    }
    let effects_after_first: u32 = performs.lock().unwrap().values().sum();

    // The same response again (a retry, a restart): side effects replay and
    // render byte-identical results; only read-only tools run again.
    let again_calls = parse_tool_calls(provider, &raw, 3, &ParseLimits::default()).unwrap();
    assert_eq!(
        again_calls, calls,
        "parsing is deterministic (derived ids too)"
    );
    let second = exec
        .execute_round(&op, 3, again_calls.clone())
        .await
        .unwrap();
    assert_eq!(render_all(&again_calls, &second), rendered);
    let side_effecting = calls
        .iter()
        .filter(|c| SIDE_EFFECTS.contains(&c.tool_name.as_str()))
        .count();
    for (call, out) in calls.iter().zip(&second) {
        let replayed = matches!(out, CallOutcome::Completed { replayed: true, .. });
        assert_eq!(
            replayed,
            SIDE_EFFECTS.contains(&call.tool_name.as_str()),
            "{}",
            call.tool_name
        );
    }
    let effects_after_second: u32 = performs.lock().unwrap().values().sum();
    assert_eq!(
        effects_after_second - effects_after_first,
        (calls.len() - side_effecting) as u32
    );
    // Every side-effecting call ran exactly once, under its own key.
    let recorded = exec.ledger().list(&op).unwrap();
    assert_eq!(recorded.len(), side_effecting);
    for rec in &recorded {
        assert_eq!(performs.lock().unwrap()[rec.downstream_key.as_str()], 1);
    }
    (calls, effects_after_first)
}

#[tokio::test]
async fn openai_chat_parallel_and_unicode() {
    round_trip(Provider::OpenAiChat, "openai_chat_parallel").await;
    round_trip(Provider::OpenAiChat, "openai_chat_unicode").await;
}

#[tokio::test]
async fn openai_responses_parallel_and_unicode() {
    round_trip(Provider::OpenAiResponses, "openai_responses_parallel").await;
    round_trip(Provider::OpenAiResponses, "openai_responses_unicode").await;
}

#[tokio::test]
async fn anthropic_parallel_and_unicode() {
    round_trip(Provider::Anthropic, "anthropic_parallel").await;
    round_trip(Provider::Anthropic, "anthropic_unicode").await;
}

#[tokio::test]
async fn gemini_without_ids_with_ids_and_unicode() {
    round_trip(Provider::Gemini, "gemini_parallel_no_ids").await;
    round_trip(Provider::Gemini, "gemini_with_ids").await;
    round_trip(Provider::Gemini, "gemini_unicode").await;
}

#[tokio::test]
async fn openai_responses_programs_and_namespaces() {
    let (calls, _) = round_trip(Provider::OpenAiResponses, "openai_responses_program").await;
    assert_eq!(names(&calls), ["lookup_order", "send_receipt"]);
    let (calls, performs) =
        round_trip(Provider::OpenAiResponses, "openai_responses_namespace").await;
    assert_eq!(
        names(&calls),
        [
            "crm.create_record",
            "billing.create_record",
            "create_record"
        ]
    );
    // Same function name, three tools, three effects.
    assert_eq!(performs, 3);
}

/// The tool gets the argument text of the call, every digit included.
/// Needs the ledger's canonicaliser to stop rounding through f64 (it hands
/// the tool its canonical form); the provider side is covered by
/// `tests/provider_numbers.rs`.
#[tokio::test]
async fn anthropic_numbers_reach_the_tool() {
    let (exec, _) = executor();
    let op = OperationId::new("op_numbers").unwrap();
    let calls = parse_tool_calls(
        Provider::Anthropic,
        &fixture("anthropic_numbers"),
        0,
        &ParseLimits::default(),
    )
    .unwrap();
    let out = exec.execute_round(&op, 0, calls.clone()).await.unwrap();
    let echoed = out[0].result_json().unwrap();
    assert!(echoed.contains(&calls[0].arguments), "{echoed}");
}

#[tokio::test]
async fn gemini_calls_the_server_ran_never_run_here() {
    let (calls, performs) = round_trip(Provider::Gemini, "gemini_server_mcp").await;
    // get_forecast and get_alerts are registered here too: had they been
    // returned, they would have run a second time.
    assert_eq!(names(&calls), ["create_event"]);
    assert_eq!(performs, 1);
}

fn names(calls: &[ToolCall]) -> Vec<&str> {
    calls.iter().map(|call| call.tool_name.as_str()).collect()
}

#[tokio::test]
async fn mcp_batch_and_single() {
    round_trip(Provider::Mcp, "mcp_batch").await;
    round_trip(Provider::Mcp, "mcp_single_unicode").await;
}

#[tokio::test]
async fn a_malformed_response_records_nothing() {
    let (exec, performs) = executor();
    for (provider, name) in [
        (Provider::OpenAiChat, "openai_chat_bad_arguments"),
        (Provider::OpenAiResponses, "openai_responses_bad_arguments"),
        (Provider::Anthropic, "anthropic_unknown_block"),
        (Provider::Gemini, "gemini_missing_name"),
        (Provider::Mcp, "mcp_missing_name"),
    ] {
        let err =
            parse_tool_calls(provider, &fixture(name), 0, &ParseLimits::default()).unwrap_err();
        assert_eq!(err.provider(), provider, "{name}: {err}");
    }
    assert!(exec.ledger().operations(100).unwrap().is_empty());
    assert!(performs.lock().unwrap().is_empty());
}

/// A payment tool that needs approval and previews amount and target.
struct Pay {
    performs: AtomicU32,
}

#[async_trait]
impl ToolHandler for Pay {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            requires_approval: true,
            idempotency_key: true,
            ..ToolDescriptor::side_effect("pay", 1)
        }
    }
    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.performs.fetch_add(1, Ordering::SeqCst);
        Ok(PerformOutcome::Committed {
            result_json: r#"{"paid":true}"#.into(),
            external_id: Some("pay_1".into()),
        })
    }
    fn approval_preview(&self, arguments_json: &str) -> Option<String> {
        let v: Value = serde_json::from_str(arguments_json).ok()?;
        Some(format!(
            r#"{{"amount":"{} EUR","to":{}}}"#,
            v["amount_cents"].as_u64()? as f64 / 100.0,
            v["to"]
        ))
    }
}

fn anthropic_pay(id: &str, amount_cents: u64) -> String {
    format!(
        r#"{{"id":"msg_1","type":"message","role":"assistant","content":[{{"type":"tool_use","id":"{id}","name":"pay","input":{{"amount_cents":{amount_cents},"to":"Ada"}}}}]}}"#
    )
}

#[tokio::test]
async fn approval_binds_to_the_arguments_the_model_sent() {
    let ledger =
        Ledger::open_in_memory(LedgerConfig::default(), Arc::new(ManualClock::new(0))).unwrap();
    let exec = Executor::new(Arc::new(ledger), ExecutorConfig::default());
    let pay = Arc::new(Pay {
        performs: AtomicU32::new(0),
    });
    exec.register(pay.clone()).unwrap();
    let op = OperationId::new("op_pay").unwrap();
    let parse =
        |raw: &str| parse_tool_calls(Provider::Anthropic, raw, 0, &ParseLimits::default()).unwrap();

    // The model asks to pay 12.50: the app gets a preview and the digest.
    let out = exec
        .execute_round(&op, 0, parse(&anthropic_pay("toolu_1", 1250)))
        .await
        .unwrap();
    let CallOutcome::NeedsApproval {
        execution_id,
        tool_name,
        args_digest,
        preview_json,
    } = &out[0]
    else {
        panic!("{out:?}")
    };
    assert_eq!(tool_name, "pay");
    assert_eq!(
        preview_json.as_deref(),
        Some(r#"{"amount":"12.5 EUR","to":"Ada"}"#)
    );

    // Before the user answers, the model re-sends the same call id with a
    // changed amount: a conflict, and the earlier preview's digest does not
    // match the new arguments.
    let changed = exec
        .execute_round(&op, 0, parse(&anthropic_pay("toolu_1", 99_900)))
        .await
        .unwrap();
    let CallOutcome::Conflict { new_digest, .. } = &changed[0] else {
        panic!("{changed:?}")
    };
    assert!(exec.approve(execution_id, new_digest, None).await.is_err());
    assert_eq!(pay.performs.load(Ordering::SeqCst), 0);

    // The user approves what they were shown: it runs once.
    let done = exec
        .approve(execution_id, args_digest, preview_json.as_deref())
        .await
        .unwrap();
    assert!(
        matches!(
            done,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        ),
        "{done:?}"
    );
    // The approval cannot be replayed onto another execution: the model's
    // next turn asks for a new payment with changed arguments, which needs
    // its own approval.
    let next = exec
        .execute_round(&op, 1, parse(&anthropic_pay("toolu_2", 99_900)))
        .await
        .unwrap();
    let CallOutcome::NeedsApproval {
        execution_id: next_id,
        ..
    } = &next[0]
    else {
        panic!("{next:?}")
    };
    assert!(exec.approve(next_id, args_digest, None).await.is_err());
    assert_eq!(pay.performs.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// Streamed responses: chunks assemble into exactly the calls the whole
// response gives, and a call still in pieces is never returned as runnable.
// ---------------------------------------------------------------------------
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
    // different chunks. Parsed alone, the first chunk cannot know whether the
    // call will be answered, so (no finishReason: the model has not stopped)
    // it is refused, never handed out; assembled, the call is skipped.
    let gemini = Provider::Gemini;
    let stream = [
        r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"get_forecast","args":{"city":"Oslo"}}}]}}]}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"functionResponse":{"name":"get_forecast","response":{"sky":"clear"}}}]}}]}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Clear skies in Oslo."}]},"finishReason":"STOP"}]}"#,
    ];
    assert_eq!(assemble(gemini, &stream).unwrap(), vec![]);
    assert_eq!(
        parse_tool_calls(gemini, stream[0], 0, &ParseLimits::default()),
        Err(ProviderError::IncompleteCall {
            provider: gemini,
            field: "candidates[0].content.parts[0].functionCall".into()
        })
    );
    // Every chunk parsed on its own: no call is ever returned.
    for chunk in stream {
        assert!(!matches!(
            parse_tool_calls(gemini, chunk, 0, &ParseLimits::default()),
            Ok(calls) if !calls.is_empty()
        ));
    }
}

#[tokio::test]
async fn a_gemini_stream_with_server_calls_runs_only_the_clients_call_once() {
    // Server-side MCP and streamed arguments in one stream: two calls the
    // API ran (answered one and two chunks later), then the client's call
    // in pieces. Tools of the server calls' names are registered here too:
    // they must never run.
    let gemini = Provider::Gemini;
    let stream = chunks("gemini_server_mcp_stream");
    for (index, chunk) in stream.iter().enumerate() {
        let parsed = parse_tool_calls(gemini, chunk, 5, &ParseLimits::default());
        assert!(
            !matches!(parsed, Ok(ref calls) if !calls.is_empty()),
            "chunk {index} alone gave a call"
        );
    }
    let assembled = assemble(gemini, &stream).unwrap();
    assert_eq!(
        assembled,
        vec![call(
            gemini,
            "fc-pay-31",
            false,
            "transfer_funds",
            r#"{"amount":224.18827276432074,"iban":"PT50 0002 0123 1234 5678 9015 4","reference":18446744073709551617}"#,
            0
        )]
    );
    let (exec, performs) = executor();
    let op = OperationId::new("op_gemini_stream").unwrap();
    let first = exec.execute_round(&op, 2, assembled.clone()).await.unwrap();
    let echoed = first[0].result_json().unwrap();
    assert!(
        echoed.ends_with(&format!(r#""echo":{}}}"#, assembled[0].arguments)),
        "the tool got the arguments byte for byte"
    );
    let effects = || performs.lock().unwrap().values().sum::<u32>();
    assert_eq!(effects(), 1, "only transfer_funds ran");
    // The stream again (a retry after a crash): a replay, nothing runs.
    let again = assemble(gemini, &stream).unwrap();
    let second = exec.execute_round(&op, 2, again).await.unwrap();
    assert!(matches!(
        second[0],
        CallOutcome::Completed { replayed: true, .. }
    ));
    assert_eq!(effects(), 1);
}

#[test]
fn no_chunk_with_a_partial_call_parses_as_a_call() {
    // Parsed one by one, the Gemini chunks give either no calls or a
    // refusal: never the streamed call with missing arguments, and not even
    // the whole call of chunk 6 (no finishReason: the model had not stopped,
    // an answer from the API could still follow).
    for (index, chunk) in chunks("gemini_stream").iter().enumerate() {
        let parsed = parse_tool_calls(Provider::Gemini, chunk, 2, &ParseLimits::default());
        match index {
            1..=4 | 6 => assert!(
                matches!(parsed, Err(ProviderError::IncompleteCall { .. })),
                "chunk {index}: {parsed:?}"
            ),
            5 => assert!(
                matches!(parsed, Err(ProviderError::MissingField { ref field, .. }) if field.ends_with("functionCall.name")),
                "chunk {index}: {parsed:?}"
            ),
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

// ---------------------------------------------------------------------------
// Numbers reach the other side unchanged: any JSON number round-trips byte
// for byte from the provider payload to the call's arguments, and from the
// tool's stored result to the rendered message, for every provider.
// ---------------------------------------------------------------------------
/// A JSON number text: any sign, integer part, fraction and exponent the
/// grammar allows, including forms `serde_json` rewrites (`-0`, `1E2`,
/// integers beyond 64 bits, 17 significant digits, trailing zeros).
fn number() -> impl Strategy<Value = String> {
    let digits = |min: usize, max: usize| prop::collection::vec(0u8..10, min..max);
    let grammar = (
        any::<bool>(),
        prop_oneof![
            Just(vec![0u8]),
            (1u8..10, digits(0, 40)).prop_map(|(first, mut rest)| {
                rest.insert(0, first);
                rest
            })
        ],
        prop::option::of(digits(1, 25)),
        prop::option::of((
            prop_oneof![Just("e"), Just("E")],
            prop_oneof![Just(""), Just("+"), Just("-")],
            0u32..330,
        )),
    )
        .prop_map(|(negative, int, frac, exp)| {
            let mut text = String::new();
            if negative {
                text.push('-');
            }
            text.extend(int.iter().map(|d| char::from(b'0' + d)));
            if let Some(frac) = frac {
                text.push('.');
                text.extend(frac.iter().map(|d| char::from(b'0' + d)));
            }
            if let Some((e, sign, power)) = exp {
                text.push_str(e);
                text.push_str(sign);
                text.push_str(&power.to_string());
            }
            text
        });
    let doubles = any::<f64>()
        .prop_filter("finite", |v| v.is_finite())
        .prop_flat_map(|v| {
            prop_oneof![
                Just(format!("{v}")),
                Just(format!("{v:e}")),
                Just(format!("{v:.16e}")),
                Just(format!("{v:.17}")),
            ]
        });
    let wide = any::<i128>().prop_map(|v| v.to_string());
    prop_oneof![
        4 => grammar,
        3 => doubles,
        1 => wide,
        1 => prop_oneof![Just("-0".to_owned()), Just("-0.0".to_owned()), Just("224.18827276432074".to_owned())],
    ]
    .prop_filter("finite as a double", |text| {
        text.parse::<f64>().is_ok_and(f64::is_finite)
    })
}

/// JSON text of `text` as a JSON string.
/// The payload of each provider carrying `args` (a JSON object text) as the
/// arguments of one call.
fn payloads(args: &str) -> Vec<(Provider, String)> {
    vec![
        (
            Provider::OpenAiChat,
            format!(
                r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","tool_calls":[{{"id":"c","type":"function","function":{{"name":"f","arguments":{}}}}}]}},"finish_reason":"tool_calls"}}]}}"#,
                quoted(args)
            ),
        ),
        (
            Provider::OpenAiResponses,
            format!(
                r#"{{"output":[{{"type":"function_call","call_id":"c","name":"f","arguments":{}}}]}}"#,
                quoted(args)
            ),
        ),
        (
            Provider::Anthropic,
            format!(r#"{{"content":[{{"type":"tool_use","id":"c","name":"f","input":{args}}}]}}"#),
        ),
        (
            Provider::Gemini,
            format!(
                r#"{{"candidates":[{{"content":{{"role":"model","parts":[{{"functionCall":{{"id":"c","name":"f","args":{args}}}}}]}},"finishReason":"STOP"}}]}}"#
            ),
        ),
        (
            Provider::Mcp,
            format!(
                r#"{{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{{"name":"f","arguments":{args}}}}}"#
            ),
        ),
    ]
}

/// The message each provider of [`payloads`] (in that order) renders for the
/// object result whose compact text is `compact`, answering call `c` of `f`.
fn rendered_forms(compact: &str) -> [String; 5] {
    let text = quoted(compact);
    [
        format!(r#"{{"role":"tool","tool_call_id":"c","content":{text}}}"#),
        format!(r#"{{"type":"function_call_output","call_id":"c","output":{text}}}"#),
        format!(r#"{{"type":"tool_result","tool_use_id":"c","content":{text}}}"#),
        format!(r#"{{"functionResponse":{{"id":"c","name":"f","response":{compact}}}}}"#),
        format!(
            r#"{{"jsonrpc":"2.0","id":"c","result":{{"content":[{{"type":"text","text":{text}}}],"structuredContent":{compact},"isError":false}}}}"#
        ),
    ]
}

/// A side-effecting tool `f` that keeps the arguments text it was handed
/// and answers with a fixed result text.
struct Exact {
    seen: Arc<Mutex<Vec<String>>>,
    result_json: String,
}

#[async_trait]
impl ToolHandler for Exact {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: true,
            ..ToolDescriptor::side_effect("f", 1)
        }
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.seen.lock().unwrap().push(req.arguments_json.clone());
        Ok(PerformOutcome::Committed {
            result_json: self.result_json.clone(),
            external_id: None,
        })
    }
}

/// One call of `provider`'s `payload` through a file-backed ledger: the
/// arguments text the tool was handed, and the rendered result of the first
/// run and of the replay after reopening the file (when nothing runs).
fn through_the_ledger(
    provider: Provider,
    payload: &str,
    result_json: &str,
) -> (String, String, String) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("numbers.db");
    let op = OperationId::new("op_numbers").unwrap();
    let run = |seen: &Arc<Mutex<Vec<String>>>| {
        let ledger = Ledger::open(&path, LedgerConfig::default()).unwrap();
        let exec = Executor::new(Arc::new(ledger), ExecutorConfig::default());
        exec.register(Arc::new(Exact {
            seen: seen.clone(),
            result_json: result_json.to_owned(),
        }))
        .unwrap();
        let call = parse_one(provider, payload);
        let outcomes = runtime
            .block_on(exec.execute_round(&op, 0, vec![call.clone()]))
            .unwrap();
        let output_json = outcomes[0].result_json().unwrap().to_owned();
        render_tool_result(&call, &stored(output_json)).unwrap()
    };
    let first_seen = Arc::new(Mutex::new(Vec::new()));
    let first = run(&first_seen);
    let replay_seen = Arc::new(Mutex::new(Vec::new()));
    let replayed = run(&replay_seen);
    assert!(
        replay_seen.lock().unwrap().is_empty(),
        "a replay runs nothing"
    );
    let mut seen = first_seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "the tool ran once");
    (seen.remove(0), first, replayed)
}

fn parse_one(provider: Provider, payload: &str) -> ToolCall {
    let mut calls = parse_tool_calls(provider, payload, 0, &ParseLimits::default()).unwrap();
    assert_eq!(calls.len(), 1);
    calls.remove(0)
}

fn stored(output_json: String) -> ToolResultContent {
    ToolResultContent {
        output_json,
        is_error: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arguments_keep_every_number_as_sent(n in number(), m in number()) {
        // Spaced and out of order as a model may send them.
        let args = format!(r#"{{ "n" : {n}, "list": [ {m}, {{"deep": {n}}} ] }}"#);
        let expected = format!(r#"{{"list":[{m},{{"deep":{n}}}],"n":{n}}}"#);
        for (provider, payload) in payloads(&args) {
            prop_assert_eq!(&parse_one(provider, &payload).arguments, &expected, "{}", provider);
        }
    }

    #[test]
    fn results_keep_every_number_as_stored(n in number(), m in number()) {
        let result = format!(r#"{{"v": {n}, "a": [{m}]}}"#);
        let compact = format!(r#"{{"a":[{m}],"v":{n}}}"#);
        let text = quoted(&compact);
        let args = "{}";
        let calls: Vec<ToolCall> = payloads(args)
            .into_iter()
            .map(|(provider, payload)| parse_one(provider, &payload))
            .collect();
        for (call, expected) in calls.iter().zip(rendered_forms(&compact)) {
            prop_assert_eq!(render_tool_result(call, &stored(result.clone())).unwrap(), expected);
        }
        // A bare number result: as text for the text-only formats, wrapped
        // for Gemini.
        prop_assert_eq!(
            render_tool_result(&calls[0], &stored(n.clone())).unwrap(),
            format!(r#"{{"role":"tool","tool_call_id":"c","content":{}}}"#, quoted(&n))
        );
        prop_assert_eq!(
            render_tool_result(&calls[3], &stored(n.clone())).unwrap(),
            format!(r#"{{"functionResponse":{{"id":"c","name":"f","response":{{"result":{n}}}}}}}"#)
        );
        prop_assert_eq!(
            render_mcp_result(&calls[4], &stored(result.clone()), McpProtocol::V2026_07_28).unwrap(),
            format!(
                r#"{{"jsonrpc":"2.0","id":"c","result":{{"resultType":"complete","content":[{{"type":"text","text":{text}}}],"structuredContent":{compact},"isError":false}}}}"#
            )
        );
    }

    #[test]
    fn mcp_number_ids_come_back_as_sent(id in number()) {
        let request = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"f"}}}}"#
        );
        let call = parse_one(Provider::Mcp, &request);
        prop_assert_eq!(&call.call_id, &id);
        let rendered = render_tool_result(&call, &stored(r#""ok""#.to_owned())).unwrap();
        prop_assert_eq!(
            rendered,
            format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"ok"}}],"isError":false}}}}"#)
        );
    }
}

proptest! {
    // Each case opens a SQLite file ten times (five providers, run and
    // replay): fewer cases than the parser-only properties above.
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn numbers_cross_the_ledger_unchanged(n in number(), m in number()) {
        // Payload → parse → begin (digest) → the tool's arguments; the
        // tool's result → committed in SQLite → rendered, and after a
        // reopen replayed and rendered again: byte for byte every time.
        let args = format!(r#"{{"n": {n}, "list": [{m}, -0, 224.18827276432074]}}"#);
        let expected_args = format!(r#"{{"list":[{m},-0,224.18827276432074],"n":{n}}}"#);
        let result = format!(r#"{{"a":[{m},18446744073709551617],"v":{n}}}"#);
        for ((provider, payload), expected) in payloads(&args).into_iter().zip(rendered_forms(&result)) {
            let (handed, first, replayed) = through_the_ledger(provider, &payload, &result);
            prop_assert_eq!(&handed, &expected_args, "{}", provider);
            prop_assert_eq!(&first, &expected, "{}", provider);
            prop_assert_eq!(&replayed, &expected, "{}", provider);
        }
    }
}

#[test]
fn the_numbers_named_in_the_issue() {
    // What `serde_json::Value` (default features) makes of them.
    for (sent, serde_json_gives) in [
        ("-0", "-0.0"),
        ("18446744073709551616", "1.8446744073709552e+19"),
        ("224.18827276432074", "224.18827276432071"),
    ] {
        let theirs: serde_json::Value = serde_json::from_str(sent).unwrap();
        assert_eq!(theirs.to_string(), serde_json_gives);
        let args = format!(r#"{{"x":{sent}}}"#);
        for (provider, payload) in payloads(&args) {
            let call = parse_one(provider, &payload);
            assert_eq!(call.arguments, args, "{provider}");
        }
    }
}

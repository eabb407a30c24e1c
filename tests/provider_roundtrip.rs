//! Provider round trips: raw model response → neutral calls → executor →
//! provider-shaped tool results; a replay renders byte-identical results and
//! runs nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::Value;
use toolledger::executor::*;
use toolledger::ledger::{Ledger, LedgerConfig, ManualClock};
use toolledger::model::{OperationId, Provider, ToolCall};
use toolledger::provider::{parse_tool_calls, render_tool_result, ParseLimits, ToolResultContent};

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

//! Bad and hostile input: typed errors, never a panic, nothing recorded lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::Value;
use support::*;
use toolledger::ledger::{
    AttemptId, Begin, CallSpec, Error, Error as LedgerError, Ledger, LedgerConfig, ManualClock,
    Resolution,
};
use toolledger::model::canonical::canonicalize;
use toolledger::model::{
    check_transition, digest_arguments, ArgsDigest, ExecutionId, ExecutionIdParts, ExecutionStatus,
    IdError, JsonError, JsonLimits, OperationId, Provider, ToolCall, Transition,
};
use toolledger::provider::{parse_tool_calls, render_tool_result, ParseLimits, ToolResultContent};
use toolledger_test_support as support;

// ---------------------------------------------------------------------------
// Bad input gets a typed error and loses nothing already recorded.
// ---------------------------------------------------------------------------
fn json_err(ledger: &Ledger, args: &str) -> JsonError {
    match ledger.begin(&op("op"), 0, &spec("c", "t", args)) {
        Err(Error::Json(e)) => e,
        other => panic!("expected a JSON error, got {other:?}"),
    }
}

#[test]
fn malformed_arguments_are_typed_errors_and_record_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    assert!(matches!(
        json_err(&ledger, "{\"a\":"),
        JsonError::Invalid { .. }
    ));
    assert!(matches!(
        json_err(&ledger, "{'a':1}"),
        JsonError::Invalid { .. }
    ));
    assert!(matches!(
        json_err(&ledger, "{\"a\":1,}"),
        JsonError::Invalid { .. }
    ));
    assert!(matches!(
        json_err(&ledger, "{\"a\":1} trailing"),
        JsonError::Invalid { .. }
    ));
    assert!(matches!(
        json_err(&ledger, "{\"a\":NaN}"),
        JsonError::Invalid { .. }
    ));
    assert_eq!(
        json_err(&ledger, r#"{"a":1,"a":2}"#),
        JsonError::DuplicateKey { offset: 7 }
    );
    assert!(matches!(
        json_err(&ledger, r#"{"a":1,"\u0061":2}"#),
        JsonError::DuplicateKey { .. }
    ));
    assert!(matches!(
        json_err(&ledger, r#"{"a":1e999}"#),
        JsonError::NonFiniteNumber { .. }
    ));
    assert!(matches!(
        json_err(&ledger, r#"{"s":"\ud800"}"#),
        JsonError::Invalid { .. }
    ));
    let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
    assert_eq!(json_err(&ledger, &deep), JsonError::TooDeep { max: 64 });
    let hostile = "[".repeat(1_000_000);
    assert!(matches!(
        json_err(&ledger, &hostile),
        JsonError::TooLarge { .. } | JsonError::TooDeep { .. }
    ));
    let big = format!(r#"{{"s":"{}"}}"#, "x".repeat(2 * 1024 * 1024));
    assert!(matches!(
        json_err(&ledger, &big),
        JsonError::TooLarge { max: 1_048_576, .. }
    ));
    assert!(ledger.list(&op("op")).unwrap().is_empty());
    assert_eq!(ledger.operation_status(&op("op")).unwrap(), None);
}

#[test]
fn limits_are_configurable() {
    let config = LedgerConfig {
        json_limits: JsonLimits {
            max_depth: 2,
            max_bytes: 64,
        },
        ..LedgerConfig::default()
    };
    let ledger = Ledger::open_in_memory(config, Arc::new(ManualClock::new(0))).unwrap();
    assert!(ledger
        .begin(&op("ok"), 0, &spec("c", "t", r#"{"a":{"b":1}}"#))
        .is_ok());
    assert_eq!(
        json_err(&ledger, r#"{"a":{"b":[1]}}"#),
        JsonError::TooDeep { max: 2 }
    );
    assert!(matches!(
        json_err(&ledger, &format!(r#"{{"a":"{}"}}"#, "x".repeat(64))),
        JsonError::TooLarge { max: 64, .. }
    ));
}

#[test]
fn one_bad_call_records_nothing_of_its_round() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let good = spec("c1", "send_email", r#"{"to":"a"}"#);
    let bad = spec("c2", "pay", r#"{"amount":}"#);
    assert!(matches!(
        ledger.begin_round(&op("op"), 0, &[good.clone(), bad]),
        Err(Error::Json(_))
    ));
    assert!(ledger.list(&op("op")).unwrap().is_empty());
    // The good call alone still works afterwards.
    assert!(matches!(
        ledger.begin(&op("op"), 0, &good).unwrap(),
        Begin::Execute(_)
    ));
}

#[test]
fn empty_and_oversized_identity_parts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("", "t", "{}")),
        Err(Error::Id(IdError::Empty {
            component: "call id"
        }))
    ));
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("c", "", "{}")),
        Err(Error::Id(IdError::Empty {
            component: "tool name"
        }))
    ));
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec(&"c".repeat(300), "t", "{}")),
        Err(Error::Id(IdError::TooLong {
            component: "call id",
            len: 300,
            max: 256
        }))
    ));
    assert!(ledger.list(&op("op")).unwrap().is_empty());
}

#[test]
fn a_result_that_is_not_json_is_refused_and_the_record_stays_executing() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &spec("c", "t", "{}")).unwrap() else {
        panic!()
    };
    assert!(matches!(
        ledger.commit(&t.attempt_id(), "not json", None),
        Err(Error::Json(_))
    ));
    let rec = ledger.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    assert_eq!(rec.result_json, None);
    ledger
        .commit(&t.attempt_id(), r#""plain string result""#, None)
        .unwrap();
}

#[test]
fn unknown_ids_and_wrong_steps_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let ghost = ExecutionId::parse("op:round_0:nope:t:v1").unwrap();
    assert!(matches!(
        ledger.commit(&current(&ledger, &ghost), "{}", None),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        ledger.mark_delivered(std::slice::from_ref(&ghost)),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(ledger.cancel(&ghost), Err(Error::NotFound(_))));
    assert!(ExecutionId::parse("").is_err());
    assert!(ExecutionId::parse("a\u{0}b").is_err());

    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &spec("c", "t", "{}")).unwrap() else {
        panic!()
    };
    // Delivering a result that never committed is refused, and a batch that
    // contains such an id writes nothing.
    let Begin::Execute(t2) = ledger.begin(&op("op"), 0, &spec("c2", "t", "{}")).unwrap() else {
        panic!()
    };
    ledger.commit(&t2.attempt_id(), "{}", None).unwrap();
    assert!(matches!(
        ledger.mark_delivered(&[t2.execution_id.clone(), t.execution_id.clone()]),
        Err(Error::InvalidTransition {
            from: ExecutionStatus::Executing,
            ..
        })
    ));
    assert_eq!(
        ledger.get(&t2.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    assert!(matches!(
        ledger.approve(&t.execution_id, &t.args_digest, None),
        Err(Error::InvalidTransition { .. })
    ));
}

#[test]
fn control_characters_in_an_operation_id_are_refused() {
    for bad in ["op\0", "op\n1", "\u{7f}"] {
        assert_eq!(
            toolledger::model::OperationId::new(bad),
            Err(IdError::Malformed {
                component: "operation id"
            })
        );
    }
}

#[test]
fn an_absurd_busy_timeout_is_clamped_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let config = LedgerConfig {
        busy_timeout: std::time::Duration::MAX,
        ..LedgerConfig::default()
    };
    let ledger = Ledger::open(&dir.path().join("l.db"), config).unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("c", "t", "{}")).unwrap(),
        Begin::Execute(_)
    ));
}

// ---------------------------------------------------------------------------
// Hostile input: property tests over everything a model, a peer or a
// careless caller can hand the library.
//
// - canonical JSON and the args digest: arbitrary text never panics,
// canonicalisation is idempotent, equal values (whatever their key order,
// whitespace or number spelling) give equal digests;
// - execution ids: separators, empty and very long parts, any unicode and
// NUL bytes either give distinct ids or a typed error;
// - provider payloads: arbitrary bytes and mutated fixtures give typed
// errors, never a panic;
// - the public `Ledger` API called in random orders with random ids: only
// typed domain errors, a committed result never changes, and every
// recorded status change is in the transition table;
// - a 100 MB argument string is refused by size, fast, without copying it.
//
// Case counts are bounded (`ProptestConfig::cases`, about 2,000 cases in all)
// so CI stays fast; `TOOLLEDGER_FUZZ_SCALE=N` multiplies them for a long run.
// ---------------------------------------------------------------------------
/// `cases` property cases, times `TOOLLEDGER_FUZZ_SCALE` (default 1) for a
/// long local run; failures are not persisted to files.
fn config(cases: u32) -> ProptestConfig {
    let scale = std::env::var("TOOLLEDGER_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    ProptestConfig {
        cases: cases.saturating_mul(scale),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn limits() -> JsonLimits {
    JsonLimits::default()
}

// ---------------------------------------------------------------------------
// Canonical JSON and digests
// ---------------------------------------------------------------------------

/// Arbitrary JSON values, a few levels deep.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Renders `v` with every object's members rotated by `turn` (another key
/// order) and spaces around the punctuation.
fn render_rotated(v: &Value, turn: usize, out: &mut String) {
    match v {
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                render_rotated(item, turn, out);
            }
            out.push_str(" ]");
        }
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            if !members.is_empty() {
                let k = turn % members.len();
                members.rotate_left(k);
                members.reverse();
            }
            out.push_str("{\n");
            for (i, (key, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(",\t");
                }
                out.push_str(&serde_json::to_string(key).unwrap());
                out.push_str(" : ");
                render_rotated(value, turn, out);
            }
            out.push_str("\r\n}");
        }
        scalar => out.push_str(&serde_json::to_string(scalar).unwrap()),
    }
}

/// A JSON text with one byte-level mutation, to reach deep parser states.
fn mutate(text: &str, pos: usize, with: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let at = if bytes.is_empty() {
        0
    } else {
        pos % bytes.len()
    };
    bytes.splice(at..(at + 1).min(bytes.len()), with.bytes());
    String::from_utf8_lossy(&bytes).into_owned()
}

const SNIPPETS: &[&str] = &[
    "",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    ",",
    ":",
    "null",
    "-",
    "0",
    "01",
    "1e999",
    "-1e-999",
    "\\u0000",
    "\\ud800",
    "\u{0}",
    "\u{feff}",
    " ",
    "\"a\":1,\"a\":2",
    "1.",
    ".5",
    "tru",
    "💥",
];

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn canonicalize_never_panics_and_is_idempotent(s in any::<String>()) {
        if let Ok(c) = canonicalize(&s, &limits()) {
            prop_assert_eq!(canonicalize(&c, &limits()), Ok(c.clone()));
        }
    }

    #[test]
    fn mutated_json_is_refused_or_canonical(v in arb_json(), pos in any::<usize>(), k in 0..SNIPPETS.len()) {
        let text = mutate(&serde_json::to_string(&v).unwrap(), pos, SNIPPETS[k]);
        if let Ok(c) = canonicalize(&text, &limits()) {
            prop_assert_eq!(canonicalize(&c, &limits()), Ok(c.clone()));
        }
    }

    #[test]
    fn equal_values_in_any_layout_canonicalise_and_digest_alike(v in arb_json(), turn in any::<usize>()) {
        let compact = serde_json::to_string(&v).unwrap();
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        let mut rotated = String::new();
        render_rotated(&v, turn, &mut rotated);
        let c = canonicalize(&compact, &limits()).unwrap();
        prop_assert_eq!(canonicalize(&pretty, &limits()).unwrap(), c.clone());
        prop_assert_eq!(canonicalize(&rotated, &limits()).unwrap(), c.clone());
        prop_assert_eq!(canonicalize(&c, &limits()).unwrap(), c.clone());
        let d1 = digest_arguments("tool", 1, &compact, &limits()).unwrap();
        let d2 = digest_arguments("tool", 1, &rotated, &limits()).unwrap();
        prop_assert_eq!(&d1, &d2);
        // The tool and its version are part of the digest.
        prop_assert_ne!(&d1.digest, &digest_arguments("tool", 2, &compact, &limits()).unwrap().digest);
        prop_assert_ne!(&d1.digest, &digest_arguments("tool2", 1, &compact, &limits()).unwrap().digest);
    }

    #[test]
    fn number_spellings_of_one_value_digest_alike(n in -(1i64 << 53)..(1i64 << 53)) {
        let spellings = [format!("{n}"), format!("{n}.0"), format!("{n}.000"), format!("{n}e0"), format!("{n}E+0")];
        let digests: Vec<_> = spellings
            .iter()
            .map(|s| digest_arguments("t", 1, &format!("{{\"n\":{s}}}"), &limits()).unwrap().digest)
            .collect();
        prop_assert!(digests.windows(2).all(|w| w[0] == w[1]), "{:?}", spellings);
    }
}

// ---------------------------------------------------------------------------
// Execution ids
// ---------------------------------------------------------------------------

/// Id components, biased towards the dangerous ones.
fn arb_part() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[:#%a\\x00\\x1f_]{0,8}",
        any::<String>(),
        "[a-z:]{250,262}",
        "\\PC{1,40}",
    ]
}

type Parts = (String, u32, String, String, u32);

fn arb_parts() -> impl Strategy<Value = Parts> {
    (arb_part(), 0u32..3, arb_part(), arb_part(), 0u32..3)
}

fn derive(p: &Parts) -> Result<ExecutionId, IdError> {
    let op = OperationId::new(p.0.clone())?;
    ExecutionId::derive(&ExecutionIdParts {
        operation: &op,
        round: p.1,
        call_id: &p.2,
        tool_name: &p.3,
        tool_version: p.4,
    })
}

fn valid_part(s: &str) -> bool {
    !s.is_empty() && s.len() <= toolledger::model::ids::MAX_COMPONENT_BYTES
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn ids_are_typed_errors_or_distinct(a in arb_parts(), b in arb_parts()) {
        for p in [&a, &b] {
            // The app's operation id may not hold control characters; the
            // model-facing parts may (they are escaped).
            let op_ok = valid_part(&p.0) && !p.0.contains(char::is_control);
            let valid = op_ok && valid_part(&p.2) && valid_part(&p.3);
            match derive(p) {
                Ok(id) => {
                    prop_assert!(valid);
                    // A derived id survives the store's parser and has no
                    // raw separator-lookalike bytes.
                    prop_assert!(ExecutionId::parse(id.as_str()).is_ok());
                    prop_assert!(!id.as_str().contains('#'));
                    prop_assert!(!id.as_str().chars().any(char::is_control));
                }
                Err(IdError::Empty { .. } | IdError::TooLong { .. }) => prop_assert!(!valid),
                Err(IdError::Malformed { .. }) => prop_assert!(!op_ok),
                Err(other) => prop_assert!(false, "unexpected {:?}", other),
            }
        }
        if let (Ok(x), Ok(y)) = (derive(&a), derive(&b)) {
            prop_assert_eq!(a == b, x == y, "{:?} / {:?} → {} / {}", a, b, x, y);
            prop_assert_eq!(a == b, x.downstream_key() == y.downstream_key());
            // Batch items and compensations never collide with a derived id.
            prop_assert_ne!(x.batch_item(0), y.clone());
            if let Ok(c) = ExecutionId::compensation(&x, &y) { prop_assert_ne!(c, y.clone()); }
        }
    }
}

#[test]
fn separators_inside_components_cannot_collide() {
    let cases: [[&str; 3]; 6] = [
        ["a:b", "c", "t"],
        ["a", "b:c", "t"],
        ["a", "b", "c:t"],
        ["a:round_0:b", "c", "t"],
        ["a%3Ab", "c", "t"],
        ["a", "b\u{0}c", "t"],
    ];
    let ids: Vec<ExecutionId> = cases
        .iter()
        .map(|[op, call, tool]| {
            derive(&((*op).into(), 0, (*call).into(), (*tool).into(), 1)).unwrap()
        })
        .collect();
    for (i, x) in ids.iter().enumerate() {
        for y in &ids[i + 1..] {
            assert_ne!(x, y);
            assert_ne!(x.downstream_key(), y.downstream_key());
        }
    }
    assert!(matches!(
        derive(&("op".into(), 0, String::new(), "t".into(), 1)),
        Err(IdError::Empty { .. })
    ));
    assert!(matches!(
        derive(&("op".into(), 0, "c".repeat(257), "t".into(), 1)),
        Err(IdError::TooLong { .. })
    ));
    // A NUL in a model-chosen part is escaped; in the app's operation id it
    // is refused, typed.
    assert!(derive(&("op".into(), 0, "a\u{0}".into(), "t".into(), 1)).is_ok());
    assert!(derive(&("op\u{0}".into(), 0, "c".into(), "t".into(), 1)).is_err());
}

// ---------------------------------------------------------------------------
// Provider payloads
// ---------------------------------------------------------------------------

const PROVIDERS: [Provider; 6] = [
    Provider::OpenAiChat,
    Provider::OpenAiResponses,
    Provider::Anthropic,
    Provider::Gemini,
    Provider::Mcp,
    Provider::Custom,
];

fn fixtures() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/providers");
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    out.sort();
    assert!(out.len() >= 10, "the provider fixtures are there");
    out
}

/// Parses `text` as every provider: typed errors only; parsed calls carry
/// JSON arguments and render back without a panic.
fn parse_everywhere(text: &str) -> Result<(), TestCaseError> {
    for provider in PROVIDERS {
        match parse_tool_calls(provider, text, 3, &ParseLimits::default()) {
            Ok(calls) => {
                for call in &calls {
                    prop_assert!(canonicalize(&call.arguments, &limits()).is_ok());
                    let content = ToolResultContent {
                        output_json: text.chars().take(64).collect(),
                        is_error: false,
                    };
                    let _ = render_tool_result(call, &content);
                }
            }
            Err(e) => {
                // Displayable, and no panic on the way.
                let _ = e.to_string();
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_never_panic_a_provider_parser(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        parse_everywhere(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn mutated_fixtures_never_panic_a_provider_parser(
        which in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0..SNIPPETS.len(), 0u8..4), 1..6),
    ) {
        let all = fixtures();
        let mut text = all[which.index(all.len())].clone().into_bytes();
        for (at, k, op) in edits {
            let pos = if text.is_empty() { 0 } else { at.index(text.len()) };
            match op {
                0 => { text.splice(pos..pos, SNIPPETS[k].bytes()); }
                1 => { text.truncate(pos); }
                2 => { let end = (pos + 1 + k).min(text.len()); text.drain(pos..end); }
                _ => {
                    if let Some(b) = text.get_mut(pos) { *b ^= 1 << (k % 8); }
                }
            }
        }
        parse_everywhere(&String::from_utf8_lossy(&text))?;
    }
}

#[test]
fn the_unmutated_fixtures_parse_or_fail_typed() {
    for text in fixtures() {
        parse_everywhere(&text).unwrap();
    }
}

// ---------------------------------------------------------------------------
// The Ledger API in random orders
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Begin { call: usize, variant: u8 },
    Approve { call: usize, right_digest: bool },
    Reject { call: usize },
    MarkExecuting { call: usize },
    Commit { call: usize, result: u8 },
    Fail { call: usize, retryable: bool },
    Unknown { call: usize },
    Resolve { call: usize, how: u8 },
    Deliver { call: usize },
    Cancel { call: usize },
    CancelOperation,
    Recover,
    AdvancePastLease,
}

const CALLS: usize = 3;

fn arb_op() -> impl Strategy<Value = Op> {
    let call = 0..CALLS;
    prop_oneof![
        4 => (call.clone(), 0u8..2).prop_map(|(call, variant)| Op::Begin { call, variant }),
        2 => (call.clone(), any::<bool>()).prop_map(|(call, right_digest)| Op::Approve { call, right_digest }),
        1 => call.clone().prop_map(|call| Op::Reject { call }),
        2 => call.clone().prop_map(|call| Op::MarkExecuting { call }),
        3 => (call.clone(), 0u8..3).prop_map(|(call, result)| Op::Commit { call, result }),
        2 => (call.clone(), any::<bool>()).prop_map(|(call, retryable)| Op::Fail { call, retryable }),
        2 => call.clone().prop_map(|call| Op::Unknown { call }),
        2 => (call.clone(), 0u8..3).prop_map(|(call, how)| Op::Resolve { call, how }),
        2 => call.clone().prop_map(|call| Op::Deliver { call }),
        1 => call.clone().prop_map(|call| Op::Cancel { call }),
        1 => Just(Op::CancelOperation),
        1 => Just(Op::Recover),
        1 => Just(Op::AdvancePastLease),
    ]
}

const ALL_TRANSITIONS: [Transition; 10] = [
    Transition::Approve,
    Transition::Reject,
    Transition::Cancel,
    Transition::Start,
    Transition::Retry,
    Transition::Commit,
    Transition::Deliver,
    Transition::MarkUnknown,
    Transition::FailBeforeCommit,
    Transition::SettlePartial,
];

fn hostile_spec(call: usize, variant: u8) -> CallSpec {
    let tc = ToolCall::custom(
        format!("call_{call}"),
        "pay",
        format!(r#"{{"amount":{},"to":"bob"}}"#, 10 + u32::from(variant)),
    );
    let spec = CallSpec::new(tc, 1);
    // Call 2 needs a human.
    if call == 2 {
        spec.with_approval()
    } else {
        spec
    }
}

/// The domain refusals a caller may get; anything else (storage, session)
/// is a failure of the library on a healthy in-memory ledger.
fn is_domain_refusal(e: &LedgerError) -> bool {
    matches!(
        e,
        LedgerError::InvalidTransition { .. }
            | LedgerError::NotFound(_)
            | LedgerError::DigestMismatch { .. }
            | LedgerError::AlreadyCommitted(_)
            | LedgerError::StaleAttempt { .. }
            | LedgerError::NoSuchAttempt { .. }
            | LedgerError::OperationCancelled(_)
    )
}

/// The current attempt of `id`, or with `stale` the one before it.
fn attempt_of(ledger: &Ledger, id: &ExecutionId, stale: bool) -> Result<AttemptId, LedgerError> {
    let current = ledger.get(id)?.map_or(0, |r| r.attempt_count);
    let n = if stale {
        current.saturating_sub(1)
    } else {
        current
    };
    Ok(AttemptId::new(id.clone(), n))
}

fn apply(
    ledger: &Ledger,
    clock: &ManualClock,
    ids: &[ExecutionId],
    op: &Op,
) -> Result<(), LedgerError> {
    let opid = OperationId::new("op_sm").unwrap();
    let wrong = ArgsDigest::parse("0".repeat(64)).unwrap();
    match *op {
        Op::Begin { call, variant } => {
            ledger
                .begin(&opid, 0, &hostile_spec(call, variant))
                .map(|b| {
                    let _: Begin = b;
                })
        }
        Op::Approve { call, right_digest } => {
            let digest = match ledger.get(&ids[call])? {
                Some(rec) if right_digest => rec.args_digest,
                _ => wrong,
            };
            ledger.approve(&ids[call], &digest, Some(r#"{"amount":"10"}"#))
        }
        Op::Reject { call } => {
            let digest = ledger.get(&ids[call])?.map_or(wrong, |r| r.args_digest);
            ledger.reject(&ids[call], &digest, "no")
        }
        Op::MarkExecuting { call } => ledger.mark_executing(&ids[call]).map(|_| ()),
        // `result` 2 is sent by a stale attempt (one before the current).
        Op::Commit { call, result } => ledger
            .commit(
                &attempt_of(ledger, &ids[call], result == 2)?,
                &format!(r#"{{"paid":{result}}}"#),
                Some(&format!("pay_{result}")),
            )
            .map(|_| ()),
        Op::Fail { call, retryable } => {
            let attempt = attempt_of(ledger, &ids[call], false)?;
            ledger.fail_before_commit(&attempt, "refused", retryable)
        }
        Op::Unknown { call } => ledger
            .mark_outcome_unknown(&attempt_of(ledger, &ids[call], false)?, "timeout")
            .map(|_| ()),
        Op::Resolve { call, how } => {
            let resolution = match how {
                0 => Resolution::Found {
                    result_json: r#"{"paid":"found"}"#.into(),
                    external_id: None,
                },
                1 => Resolution::NotFoundRetry,
                _ => Resolution::NotFoundAbandon {
                    reason: "absent".into(),
                },
            };
            let attempt = attempt_of(ledger, &ids[call], false)?;
            ledger.resolve_unknown(&attempt, resolution).map(|_| ())
        }
        Op::Deliver { call } => ledger.mark_delivered(std::slice::from_ref(&ids[call])),
        Op::Cancel { call } => ledger.cancel(&ids[call]).map(|_| ()),
        Op::CancelOperation => ledger.cancel_operation(&opid).map(|_| ()),
        Op::Recover => ledger.recover().map(|_| ()),
        Op::AdvancePastLease => {
            clock.advance(i64::try_from(ledger.config().lease.as_millis()).unwrap() + 1);
            Ok(())
        }
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn the_ledger_api_in_random_orders_keeps_its_invariants(ops in prop::collection::vec(arb_op(), 1..48)) {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let ledger = Ledger::open_in_memory(LedgerConfig::default(), clock.clone()).unwrap();
        let opid = OperationId::new("op_sm").unwrap();
        let ids: Vec<ExecutionId> = (0..CALLS)
            .map(|c| {
                ExecutionId::derive(&ExecutionIdParts {
                    operation: &opid,
                    round: 0,
                    call_id: &format!("call_{c}"),
                    tool_name: "pay",
                    tool_version: 1,
                })
                .unwrap()
            })
            .collect();
        let mut committed: HashMap<usize, String> = HashMap::new();
        for op in &ops {
            if let Err(e) = apply(&ledger, &clock, &ids, op) {
                prop_assert!(is_domain_refusal(&e), "{:?} → {:?}", op, e);
            }
            for (call, id) in ids.iter().enumerate() {
                let Some(rec) = ledger.get(id).unwrap() else { continue };
                // A committed result never changes, and never goes away.
                if let Some(result) = committed.get(&call) {
                    prop_assert!(rec.status.is_committed(), "{:?}: {} after commit", op, rec.status);
                    prop_assert_eq!(rec.result_json.as_deref(), Some(result.as_str()));
                } else if rec.status.is_committed() {
                    committed.insert(call, rec.result_json.clone().unwrap_or_default());
                }
                // Every recorded move is in the table, and the log ends where
                // the record stands.
                let log = ledger.transitions(id).unwrap();
                for t in &log {
                    // A stale attempt's note, one of an effect found after
                    // its call was settled, or the note after a commit over
                    // a retryable failure, records evidence, not a move.
                    if t.transition == "stale_attempt"
                        || t.transition == "found_after_settled"
                        || t.transition == "effect_after_failure"
                    {
                        prop_assert_eq!(t.from, Some(t.to));
                        continue;
                    }
                    match t.from {
                        None => prop_assert!(
                            matches!(t.to, ExecutionStatus::Prepared | ExecutionStatus::Executing),
                            "created as {}", t.to
                        ),
                        Some(from) => prop_assert!(
                            ALL_TRANSITIONS.iter().any(|tr| tr.as_str() == t.transition
                                && check_transition(from, *tr) == Ok(t.to)),
                            "{:?} → {} by {} is not in the table", from, t.to, t.transition
                        ),
                    }
                }
                prop_assert_eq!(log.last().map(|t| t.to), Some(rec.status));
                // Approval binds to the digest: nothing requiring approval
                // ran without one.
                if rec.requires_approval && rec.attempt_count > 0 {
                    prop_assert!(log.iter().any(|t| t.transition == "approve"));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Size bounds
// ---------------------------------------------------------------------------

/// Peak resident set size of this process, in kB (Linux).
fn vm_hwm_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[test]
fn a_100_mb_argument_is_refused_by_size_fast_and_without_a_copy() {
    // Built in place: one 100 MB buffer, so the peak before is just that.
    let mut huge = String::with_capacity(100 * 1024 * 1024 + 16);
    huge.push_str(r#"{"body":""#);
    huge.extend(std::iter::repeat_n('x', 100 * 1024 * 1024));
    huge.push_str(r#""}"#);
    // The call owns the one copy there is; everything below borrows or moves it.
    let spec = CallSpec::new(ToolCall::custom("call_1", "send_email", huge), 1);
    let huge = spec.call.arguments.as_str();
    let before = vm_hwm_kb();
    let started = Instant::now();

    // The canonicaliser, the digest, the ledger, the executor, the parsers.
    assert!(matches!(
        canonicalize(huge, &limits()),
        Err(JsonError::TooLarge { .. })
    ));
    assert!(matches!(
        digest_arguments("t", 1, huge, &limits()),
        Err(JsonError::TooLarge { .. })
    ));
    for provider in PROVIDERS {
        assert!(parse_tool_calls(provider, huge, 0, &ParseLimits::default()).is_err());
    }
    let clock = Arc::new(ManualClock::new(1_000_000));
    let ledger = Ledger::open_in_memory(LedgerConfig::default(), clock).unwrap();
    let op = OperationId::new("op_big").unwrap();
    let err = ledger.begin(&op, 0, &spec).unwrap_err();
    assert!(
        matches!(err, LedgerError::Json(JsonError::TooLarge { .. })),
        "{err:?}"
    );
    assert!(ledger.list(&op).unwrap().is_empty());
    let call = spec.call;
    let exec = toolledger::executor::Executor::new(
        Arc::new(ledger),
        toolledger::executor::ExecutorConfig::default(),
    );
    struct Never;
    #[async_trait::async_trait]
    impl toolledger::executor::ToolHandler for Never {
        fn descriptor(&self) -> toolledger::executor::ToolDescriptor {
            toolledger::executor::ToolDescriptor::side_effect("send_email", 1)
        }
        async fn perform(
            &self,
            _: toolledger::executor::ToolRequest,
        ) -> Result<toolledger::executor::PerformOutcome, toolledger::executor::ToolError> {
            panic!("a refused call must never run");
        }
    }
    exec.register(Arc::new(Never)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt.block_on(exec.execute(&op, 0, call)).unwrap_err();
    assert!(
        matches!(
            err,
            toolledger::executor::Error::Ledger(LedgerError::Json(JsonError::TooLarge { .. }))
        ),
        "{err:?}"
    );

    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "refusing took {took:?}");
    if let (Some(before), Some(after)) = (before, vm_hwm_kb()) {
        let grew_mb = after.saturating_sub(before) / 1024;
        println!("peak RSS grew by {grew_mb} MB while refusing a 100 MB argument");
        // A copy of the argument would add 100 MB.
        assert!(grew_mb < 48, "peak RSS grew by {grew_mb} MB");
    }
}

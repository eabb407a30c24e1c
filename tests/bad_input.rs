//! Bad input gets a typed error and loses nothing already recorded.

use toolledger_test_support as support;

use std::sync::Arc;

use support::*;
use toolledger::ledger::{Begin, Error, Ledger, LedgerConfig, ManualClock};
use toolledger::model::{ExecutionId, ExecutionStatus, IdError, JsonError, JsonLimits};

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

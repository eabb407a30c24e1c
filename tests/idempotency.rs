//! Replay, conflict and identity: the same logical call never runs twice.

use toolledger_test_support as support;

use support::*;
use toolledger::ledger::{Begin, CallSpec};
use toolledger::model::ExecutionStatus;

#[test]
fn replay_returns_the_stored_result_byte_for_byte_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec(
        "call_1",
        "send_email",
        r#"{"to":"a@example.com","body":"Grüße 👋"}"#,
    );
    let Begin::Execute(ticket) = ledger.begin(&op("op_1"), 0, &s).unwrap() else {
        panic!("first begin must execute")
    };
    // Deliberately non-canonical result text: replay must not re-serialise it.
    let result = "{ \"id\" : \"msg_9\",\n \"amount\": 1.50 }";
    ledger
        .commit(&ticket.attempt_id(), result, Some("msg_9"))
        .unwrap();

    let mut executes = 0;
    for _ in 0..5 {
        match ledger.begin(&op("op_1"), 0, &s).unwrap() {
            Begin::Replay(r) => {
                assert_eq!(r.result_json, result);
                assert_eq!(r.external_id.as_deref(), Some("msg_9"));
            }
            Begin::Execute(_) => executes += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(executes, 0);
    // Still replays after delivery and after reopening the file.
    ledger
        .mark_delivered(std::slice::from_ref(&ticket.execution_id))
        .unwrap();
    drop(ledger);
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let rec = ledger.get(&ticket.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::ResultDelivered);
    assert_eq!(rec.attempt_count, 1);
    match ledger.begin(&op("op_1"), 0, &s).unwrap() {
        Begin::Replay(r) => assert_eq!(r.result_json, result),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn equivalent_json_is_the_same_call() {
    let (ledger, _c) = support::open_at(&tempfile::tempdir().unwrap().keep().join("l.db"));
    let a = spec("c", "pay", r#"{"b":1,"a":2.0}"#);
    let b = spec("c", "pay", r#"{ "a": 2, "b": 1 }"#);
    let Begin::Execute(t) = ledger.begin(&op("o"), 0, &a).unwrap() else {
        panic!()
    };
    ledger.commit(&t.attempt_id(), "{}", None).unwrap();
    assert!(matches!(
        ledger.begin(&op("o"), 0, &b).unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn same_id_with_different_arguments_is_a_conflict_with_both_digests() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let first = spec("call_1", "pay", r#"{"amount":10}"#);
    let changed = spec("call_1", "pay", r#"{"amount":1000}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 2, &first).unwrap() else {
        panic!()
    };
    // Conflict while executing …
    match ledger.begin(&op("op"), 2, &changed).unwrap() {
        Begin::Conflict {
            execution_id,
            stored_digest,
            new_digest,
        } => {
            assert_eq!(execution_id, t.execution_id);
            assert_eq!(stored_digest, t.args_digest);
            assert_ne!(new_digest, stored_digest);
        }
        other => panic!("unexpected {other:?}"),
    }
    ledger
        .commit(&t.attempt_id(), r#"{"paid":10}"#, Some("pay_1"))
        .unwrap();
    // … and after commit; the stored record is untouched.
    assert!(matches!(
        ledger.begin(&op("op"), 2, &changed).unwrap(),
        Begin::Conflict { .. }
    ));
    let rec = ledger.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.args_json, r#"{"amount":10}"#);
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"paid":10}"#));
}

#[test]
fn parallel_calls_in_one_round_get_distinct_ids_and_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let mut calls = Vec::new();
    for i in 0..8u32 {
        let mut c = call(
            &format!("call_{i}"),
            "send_email",
            &format!(r#"{{"n":{i}}}"#),
        );
        c.position = i;
        calls.push(CallSpec::new(c, 1));
    }
    // Two calls with identical arguments but different provider ids are still two.
    let mut twin = call("call_twin", "send_email", r#"{"n":0}"#);
    twin.position = 8;
    calls.push(CallSpec::new(twin, 1));
    let answers = ledger.begin_round(&op("op"), 0, &calls).unwrap();
    let mut ids = std::collections::HashSet::new();
    let mut keys = std::collections::HashSet::new();
    for a in &answers {
        let Begin::Execute(t) = a else {
            panic!("{a:?}")
        };
        ids.insert(t.execution_id.clone());
        keys.insert(t.downstream_key.clone());
    }
    assert_eq!(ids.len(), 9);
    assert_eq!(keys.len(), 9);
    let listed = ledger.list(&op("op")).unwrap();
    assert_eq!(
        listed.iter().map(|r| r.position).collect::<Vec<_>>(),
        (0..9).collect::<Vec<_>>()
    );
}

#[test]
fn a_regenerated_round_is_new_executions_not_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("call_1", "send_email", r#"{"to":"a@example.com"}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 1, &s).unwrap() else {
        panic!()
    };
    ledger
        .commit(&t.attempt_id(), r#"{"sent":1}"#, None)
        .unwrap();
    // The model regenerated its turn: round 2, even with the same provider id
    // and arguments, is a new execution that runs.
    match ledger.begin(&op("op"), 2, &s).unwrap() {
        Begin::Execute(t2) => {
            assert_ne!(t2.execution_id, t.execution_id);
            assert_ne!(t2.downstream_key, t.downstream_key);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn ids_with_separators_do_not_collide() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let a = ledger
        .begin(&op("a:round_0:x"), 0, &spec("y", "t", "{}"))
        .unwrap();
    let b = ledger
        .begin(&op("a"), 0, &spec("x:round_0:y", "t", "{}"))
        .unwrap();
    assert!(matches!(a, Begin::Execute(_)));
    assert!(matches!(b, Begin::Execute(_)));
    assert_ne!(a.execution_id(), b.execution_id());
}

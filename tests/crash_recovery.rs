//! Crashes while `executing`: recovery reports `outcome_unknown`, never runs
//! the tool blindly, and a committed record survives anything.
//!
//! Boundaries exercised here (docs/design.md names): `before-request` /
//! `in-flight` (dropped ledger and a child process that aborts while
//! executing), `after-local-commit` (committed then crash: replay).

use toolledger_test_support as support;

use std::process::Command;

use support::*;
use toolledger::ledger::{Begin, Resolution, Resolved};
use toolledger::model::ExecutionStatus;

#[test]
fn dropping_the_ledger_while_executing_leaves_outcome_unknown() {
    // boundary: in-flight (the process "dies" with the request outstanding)
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let s = spec("call_1", "pay", r#"{"amount":5}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    drop(ledger);

    let ledger = open_with(&path, &clock);
    let pending = ledger.recover().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].execution_id, t.execution_id);
    assert_eq!(pending[0].status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(
        pending[0].last_reason.as_deref(),
        Some("owner session died while executing")
    );
    // A retry of the same call must reconcile, not execute.
    match ledger.begin(&op("op"), 0, &s).unwrap() {
        Begin::Reconcile(r) => {
            assert_eq!(r.downstream_key, t.downstream_key);
            assert_eq!(r.attempt, 1);
        }
        other => panic!("unexpected {other:?}"),
    }
    // Lookup found nothing: retry under the same key, attempt 2.
    let Resolved::Retry(t2) = ledger
        .resolve_unknown(&t.attempt_id(), Resolution::NotFoundRetry)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(t2.downstream_key, t.downstream_key);
    assert_eq!(t2.attempt, 2);
    // Attempt 1 is stale now: its late answer is kept as evidence, never
    // recorded as the execution's own.
    assert!(matches!(
        ledger.commit(&t.attempt_id(), r#"{"ok":"late"}"#, None),
        Err(toolledger::ledger::Error::StaleAttempt {
            attempt: 1,
            current_attempt: 2,
            ..
        })
    ));
    ledger
        .commit(&t2.attempt_id(), r#"{"ok":true}"#, None)
        .unwrap();
    let evidence = ledger.evidence(&t.execution_id).unwrap();
    assert_eq!(evidence.len(), 1);
    assert_eq!(evidence[0].attempt, 1);
    assert_eq!(evidence[0].result_json.as_deref(), Some(r#"{"ok":"late"}"#));
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn a_live_second_session_is_in_flight_not_dead() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let extension = open_with(&path, &clock);
    let s = spec("call_1", "pay", r#"{"amount":5}"#);
    assert!(matches!(
        app.begin(&op("op"), 0, &s).unwrap(),
        Begin::Execute(_)
    ));
    assert!(matches!(
        extension.begin(&op("op"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    // recover() in the extension does not steal the live app's row.
    let pending = extension.recover().unwrap();
    assert_eq!(pending[0].status, ExecutionStatus::Executing);
    // However long it takes, and whatever the wall clock does: a held
    // session lock means alive.
    clock.advance(3_600_000);
    clock.step_wall(61_000);
    assert!(matches!(
        extension.begin(&op("op"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    assert!(extension.recover().unwrap()[0].status == ExecutionStatus::Executing);
    // The app goes away: now its attempt is abandoned and reconciled.
    drop(app);
    assert!(matches!(
        extension.begin(&op("op"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
    let rec = extension.get(&pending[0].execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(
        rec.last_reason.as_deref(),
        Some("owner session died while executing")
    );
}

#[test]
fn committed_then_crash_replays_the_stored_result() {
    // boundary: after-local-commit
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let s = spec("call_1", "send_email", r#"{"to":"x@example.com"}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .commit(&t.attempt_id(), r#"{"id":"m1"}"#, Some("m1"))
        .unwrap();
    drop(ledger);
    let ledger = open_with(&path, &clock);
    let pending = ledger.recover().unwrap();
    assert_eq!(pending.len(), 1, "an undelivered result needs attention");
    assert_eq!(pending[0].status, ExecutionStatus::Committed);
    match ledger.begin(&op("op"), 0, &s).unwrap() {
        Begin::Replay(r) => assert_eq!(r.result_json, r#"{"id":"m1"}"#),
        other => panic!("unexpected {other:?}"),
    }
    // Nothing downgrades it: not a failure, not unknown, not a cancellation.
    assert!(ledger
        .fail_before_commit(&t.attempt_id(), "late", true)
        .is_err());
    assert!(ledger
        .mark_outcome_unknown(&t.attempt_id(), "late")
        .is_err());
    assert!(ledger
        .resolve_unknown(&t.attempt_id(), Resolution::NotFoundRetry)
        .is_err());
    assert_eq!(
        ledger.cancel(&t.execution_id).unwrap(),
        toolledger::ledger::CancelOutcome::AlreadyCommitted
    );
    assert!(ledger
        .commit(&t.attempt_id(), r#"{"id":"other"}"#, None)
        .is_err());
    let rec = ledger.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"id":"m1"}"#));
}

/// Runs inside a child process (see the next test): begins a call and dies
/// without unwinding, as a killed app would.
#[test]
fn child_process_begins_and_aborts() {
    let Ok(db) = std::env::var("TOOLLEDGER_CHILD_DB") else {
        return;
    };
    let (ledger, _clock) = open_at(std::path::Path::new(&db));
    let Begin::Execute(t) = ledger
        .begin(&op("op"), 0, &spec("call_1", "pay", r#"{"amount":7}"#))
        .unwrap()
    else {
        std::process::exit(3)
    };
    ledger
        .record_external_id(&t.attempt_id(), "pay_123")
        .unwrap();
    std::process::abort();
}

#[test]
fn a_child_process_that_dies_while_executing_is_recovered_as_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_begins_and_aborts",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_CHILD_DB", &db)
        .status()
        .unwrap();
    assert!(!status.success(), "the child must die abruptly");
    let (ledger, _clock) = open_at(&db);
    let pending = ledger.recover().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].status, ExecutionStatus::OutcomeUnknown);
    // The external id written before the crash survived: reconciliation can use it.
    assert_eq!(pending[0].external_id.as_deref(), Some("pay_123"));
    // Resolve as found: committed, one effect, never re-run.
    let Resolved::Committed(r) = ledger
        .resolve_unknown(
            &current(&ledger, &pending[0].execution_id),
            Resolution::Found {
                result_json: r#"{"paid":7}"#.into(),
                external_id: Some("pay_123".into()),
            },
        )
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(r.external_id.as_deref(), Some("pay_123"));
    assert!(matches!(
        ledger
            .begin(&op("op"), 0, &spec("call_1", "pay", r#"{"amount":7}"#))
            .unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn unknown_outcome_resolved_absent_is_failed_and_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("c", "wire", r#"{"amount":1}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .mark_outcome_unknown(&t.attempt_id(), "timeout")
        .unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
    assert_eq!(
        ledger
            .resolve_unknown(
                &t.attempt_id(),
                Resolution::NotFoundAbandon {
                    reason: "user chose".into()
                }
            )
            .unwrap(),
        Resolved::Failed
    );
    match ledger.begin(&op("op"), 0, &s).unwrap() {
        Begin::Failed { reason, .. } => assert_eq!(reason, "user chose"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn retryable_failure_runs_again_under_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("c", "email", r#"{"n":1}"#);
    let Begin::Execute(t1) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .fail_before_commit(&t1.attempt_id(), "http 503", true)
        .unwrap();
    let Begin::Execute(t2) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    assert_eq!(t2.downstream_key, t1.downstream_key);
    assert_eq!(t2.attempt, 2);
    ledger
        .fail_before_commit(&t2.attempt_id(), "http 400", false)
        .unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Failed { .. }
    ));
    let log = ledger.get(&t1.execution_id).unwrap().unwrap();
    assert_eq!(log.attempt_count, 2);
}

#[test]
fn resume_without_suspend_returns_and_suspend_twice_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let (tx, rx) = std::sync::mpsc::channel();
    let ledger = std::sync::Arc::new(ledger);
    let l2 = ledger.clone();
    std::thread::spawn(move || {
        let _ = tx.send(l2.resume().map(|pending| pending.len()));
    });
    let answer = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("resume() must not block");
    assert_eq!(answer.unwrap(), 0);
    ledger.suspend().unwrap();
    ledger.suspend().unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("c", "t", "{}")),
        Err(toolledger::ledger::Error::Store(
            toolledger::ledger::StorageError::Suspended
        ))
    ));
    ledger.resume().unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("c", "t", "{}")).unwrap(),
        Begin::Execute(_)
    ));
}

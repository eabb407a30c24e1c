//! Cancellation before and after the side effect, and compensation.

use toolledger_test_support as support;

use support::*;
use toolledger::ledger::{Begin, CancelOutcome, Error};
use toolledger::model::{ExecutionStatus, OperationStatus};

#[test]
fn cancelling_an_operation_after_a_commit_keeps_the_effect() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let pay = spec("c1", "pay", r#"{"amount":3}"#);
    let mail = spec("c2", "send_email", r#"{"to":"a"}"#).with_approval();
    let answers = ledger
        .begin_round(&op("op"), 0, &[pay.clone(), mail.clone()])
        .unwrap();
    let Begin::Execute(t) = &answers[0] else {
        panic!()
    };
    ledger
        .commit(&t.attempt_id(), r#"{"paid":3}"#, Some("p1"))
        .unwrap();

    assert_eq!(
        ledger.cancel_operation(&op("op")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    assert_eq!(
        ledger.operation_status(&op("op")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    let recs = ledger.list(&op("op")).unwrap();
    assert_eq!(recs[0].status, ExecutionStatus::Committed);
    assert_eq!(recs[1].status, ExecutionStatus::CancelledBeforeCommit);
    // The committed one still replays; the cancelled one never runs; a new
    // call in the cancelled operation is refused without a record.
    assert!(matches!(
        ledger.begin(&op("op"), 0, &pay).unwrap(),
        Begin::Replay(_)
    ));
    assert!(matches!(
        ledger.begin(&op("op"), 0, &mail).unwrap(),
        Begin::Cancelled { .. }
    ));
    assert!(matches!(
        ledger
            .begin(&op("op"), 1, &spec("c3", "pay", "{}"))
            .unwrap(),
        Begin::Cancelled { .. }
    ));
    assert_eq!(ledger.list(&op("op")).unwrap().len(), 2);
}

#[test]
fn cancelling_while_executing_is_honest_when_the_commit_arrives_later() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let Begin::Execute(t) = ledger
        .begin(&op("op"), 0, &spec("c1", "pay", "{}"))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        ledger.cancel(&t.execution_id).unwrap(),
        CancelOutcome::NotCancellable
    );
    // A call is executing: an effect may exist, so the stop is never
    // reported as plain `Cancelled`.
    assert_eq!(
        ledger.cancel_operation(&op("op")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    // The tool reports its commit after the cancel: the record tells the truth.
    ledger
        .commit(&t.attempt_id(), r#"{"paid":true}"#, None)
        .unwrap();
    assert_eq!(
        ledger.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    assert_eq!(
        ledger.operation_status(&op("op")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

#[test]
fn cancel_without_any_commit_is_plain_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("c1", "pay", "{}").with_approval();
    let Begin::NeedsApproval(r) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    assert_eq!(
        ledger.cancel(&r.execution_id).unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        ledger.cancel(&r.execution_id).unwrap(),
        CancelOutcome::AlreadyFinal
    );
    assert_eq!(
        ledger.cancel_operation(&op("op")).unwrap(),
        OperationStatus::Cancelled
    );
}

#[test]
fn compensation_is_a_new_linked_execution_with_its_own_key_and_approval() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let Begin::Execute(t) = ledger
        .begin(&op("op"), 0, &spec("c1", "pay", r#"{"amount":9}"#))
        .unwrap()
    else {
        panic!()
    };
    let refund = spec("c9", "refund", r#"{"payment":"p1"}"#).with_approval();
    // Nothing to compensate before the commit.
    assert!(matches!(
        ledger.compensate(&t.execution_id, &op("op"), 1, &refund),
        Err(Error::NothingToCompensate(_))
    ));
    ledger
        .commit(&t.attempt_id(), r#"{"payment":"p1"}"#, Some("p1"))
        .unwrap();
    ledger.cancel_operation(&op("op")).unwrap();

    // Compensation is allowed in a cancelled operation? It is a new decision
    // by the app; it is recorded in its own operation here.
    let Begin::NeedsApproval(req) = ledger
        .compensate(&t.execution_id, &op("op_undo"), 0, &refund)
        .unwrap()
    else {
        panic!()
    };
    assert!(req
        .execution_id
        .as_str()
        .ends_with(":compensates:op%3Around_0%3Ac1%3Apay%3Av1"));
    let comp = ledger.get(&req.execution_id).unwrap().unwrap();
    assert_eq!(comp.compensates.as_ref(), Some(&t.execution_id));
    assert_ne!(comp.downstream_key, t.downstream_key);
    assert_eq!(ledger.compensations(&t.execution_id).unwrap().len(), 1);
    // Asking again for the same compensation does not create a second one.
    assert!(matches!(
        ledger
            .compensate(&t.execution_id, &op("op_undo"), 0, &refund)
            .unwrap(),
        Begin::NeedsApproval(_)
    ));
    assert_eq!(ledger.compensations(&t.execution_id).unwrap().len(), 1);
    // The original stays committed.
    assert_eq!(
        ledger.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
}

#[test]
fn a_retryable_failure_after_the_cancel_is_not_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("c1", "pay", r#"{"amount":2}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    // Cancelled while the attempt is in flight (an effect may exist); the
    // attempt then fails retryably.
    assert_eq!(
        ledger.cancel_operation(&op("op")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    ledger
        .fail_before_commit(&t.attempt_id(), "http 429", true)
        .unwrap();
    // A later begin of the same call must not start it again.
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Cancelled { .. }
    ));
    assert_eq!(
        ledger.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::CancelledBeforeCommit
    );
    assert!(ledger.mark_executing(&t.execution_id).is_err());
}

#[test]
fn mark_executing_in_a_cancelled_operation_cancels_instead_of_starting() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("c1", "pay", r#"{"amount":2}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger.cancel_operation(&op("op")).unwrap();
    ledger
        .fail_before_commit(&t.attempt_id(), "http 429", true)
        .unwrap();
    // The retry path of an app that drives the ledger itself.
    assert!(matches!(
        ledger.mark_executing(&t.execution_id),
        Err(toolledger::ledger::Error::OperationCancelled(_))
    ));
    let rec = ledger.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::CancelledBeforeCommit);
    assert_eq!(rec.attempt_count, 1, "no second attempt started");
}

//! Approval binds to the exact arguments (by digest).

use toolledger_test_support as support;

use support::*;
use toolledger::ledger::{Begin, Error};
use toolledger::model::ExecutionStatus;

#[test]
fn approval_bound_to_a_digest_does_not_unlock_changed_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("call_1", "pay", r#"{"amount":10,"to":"bob"}"#).with_approval();
    let Begin::NeedsApproval(req) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    assert_eq!(
        ledger.get(&req.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );
    // Nothing runs before approval, however often it is begun.
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::NeedsApproval(_)
    ));
    assert!(ledger.mark_executing(&req.execution_id).is_err());

    // The model comes back with changed arguments under the same call id.
    let changed = spec("call_1", "pay", r#"{"amount":10000,"to":"mallory"}"#).with_approval();
    let Begin::Conflict { new_digest, .. } = ledger.begin(&op("op"), 0, &changed).unwrap() else {
        panic!()
    };
    // An approval naming the changed digest is refused …
    match ledger.approve(
        &req.execution_id,
        &new_digest,
        Some(r#"{"amount":"100.00 USD"}"#),
    ) {
        Err(Error::DigestMismatch { stored, given, .. }) => {
            assert_eq!(stored, req.args_digest);
            assert_eq!(given, new_digest);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        ledger.get(&req.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );
    // … the original digest works, and then it executes.
    ledger
        .approve(
            &req.execution_id,
            &req.args_digest,
            Some(r#"{"amount":"10.00 USD","to":"bob"}"#),
        )
        .unwrap();
    match ledger.begin(&op("op"), 0, &s).unwrap() {
        Begin::Execute(t) => assert_eq!(t.attempt, 1),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_approval_cannot_be_replayed_onto_another_execution() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let a = spec("call_a", "pay", r#"{"amount":10}"#).with_approval();
    let b = spec("call_b", "pay", r#"{"amount":10}"#).with_approval();
    let answers = ledger.begin_round(&op("op"), 0, &[a, b]).unwrap();
    let (Begin::NeedsApproval(ra), Begin::NeedsApproval(rb)) = (&answers[0], &answers[1]) else {
        panic!()
    };
    // Same arguments, same digest, but approving A leaves B waiting.
    assert_eq!(ra.args_digest, rb.args_digest);
    ledger
        .approve(&ra.execution_id, &ra.args_digest, None)
        .unwrap();
    assert_eq!(
        ledger.get(&rb.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );
    assert!(ledger.mark_executing(&rb.execution_id).is_err());
    assert!(ledger.mark_executing(&ra.execution_id).is_ok());
    // Approving twice is an invalid transition, not a silent success.
    assert!(matches!(
        ledger.approve(&ra.execution_id, &ra.args_digest, None),
        Err(Error::InvalidTransition {
            from: ExecutionStatus::Executing,
            ..
        })
    ));
}

#[test]
fn rejected_calls_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("call_1", "delete_account", "{}").with_approval();
    let Begin::NeedsApproval(req) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .reject(&req.execution_id, &req.args_digest, "user declined")
        .unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Rejected { .. }
    ));
    assert!(ledger.mark_executing(&req.execution_id).is_err());
    assert!(ledger
        .approve(&req.execution_id, &req.args_digest, None)
        .is_err());
}

#[test]
fn a_preview_that_is_not_json_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("call_1", "pay", r#"{"amount":1}"#).with_approval();
    let Begin::NeedsApproval(req) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    assert!(matches!(
        ledger.approve(&req.execution_id, &req.args_digest, Some("{oops")),
        Err(Error::Json(_))
    ));
    assert_eq!(
        ledger.get(&req.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );
}

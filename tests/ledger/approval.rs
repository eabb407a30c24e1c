//! Approval: a call that needs a human waits, runs only with the arguments that were approved, and a rejection is final.

use std::sync::Arc;

use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind};
use serde_json::{json, Value};
use support::*;
use toolledger::executor::{self, CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{self, Begin, Error, Ledger, LedgerConfig};
use toolledger::model::{ArgsDigest, ExecutionStatus, OperationId, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

// ---------------------------------------------------------------------------
// Approval binds to the exact arguments (by digest).
// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
// Approval-required tools through the executor (row 12 of the executor
// matrix): the call waits with the tool's preview, an approval naming other
// arguments is refused and unlocks nothing, and the right approval runs the
// call once.
// ---------------------------------------------------------------------------
fn preview(args: &str) -> String {
    let args: Value = serde_json::from_str(args).unwrap();
    json!({ "summary": format!("pay {} to {}", args["amount"].as_str().unwrap(), args["to"].as_str().unwrap()) })
        .to_string()
}

#[tokio::test]
async fn a_call_needing_approval_runs_once_and_only_for_the_approved_digest() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("l.db"), LedgerConfig::default()).unwrap();
    let exec = Executor::new(Arc::new(ledger), fast_config());
    let desc = ToolDescriptor {
        idempotency_key: true,
        requires_approval: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    let tool = HttpTool::new(desc, Kind::Effect, &service).with_preview(preview);
    exec.register(Arc::new(tool)).unwrap();

    let op = OperationId::new("op_approval").unwrap();
    let call = ToolCall::custom("call_1", "pay", r#"{"amount":"12.50 EUR","to":"Bob"}"#);
    let out = exec.execute(&op, 0, call.clone()).await.unwrap();
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        preview_json,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(
        preview_json.as_deref(),
        Some(r#"{"summary":"pay 12.50 EUR to Bob"}"#)
    );
    assert!(
        service.requests().is_empty(),
        "nothing is sent before approval"
    );
    assert_eq!(
        exec.ledger().get(execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );

    let wrong = ArgsDigest::parse("0".repeat(64)).unwrap();
    let refused = exec
        .approve(execution_id, &wrong, preview_json.as_deref())
        .await;
    assert!(
        matches!(
            refused,
            Err(executor::Error::Ledger(
                ledger::Error::DigestMismatch { .. }
            ))
        ),
        "{refused:?}"
    );
    assert_eq!(
        exec.ledger().get(execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );
    // Asking again still waits for approval; nothing was unlocked.
    let still = exec.execute(&op, 0, call.clone()).await.unwrap();
    assert!(
        matches!(still, CallOutcome::NeedsApproval { .. }),
        "{still:?}"
    );
    assert!(service.requests().is_empty());

    let ran = exec
        .approve(execution_id, args_digest, preview_json.as_deref())
        .await
        .unwrap();
    let CallOutcome::Completed {
        external_id,
        replayed: false,
        ..
    } = &ran
    else {
        panic!("{ran:?}")
    };
    assert_eq!(external_id.as_deref(), Some("eff_1"));
    assert_eq!(
        exec.ledger().get(execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    let replay = exec.execute(&op, 0, call).await.unwrap();
    assert!(
        matches!(replay, CallOutcome::Completed { replayed: true, .. }),
        "{replay:?}"
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
}

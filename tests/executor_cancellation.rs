//! Cancelling an operation while a tool call is in flight (row 10 of the
//! executor matrix): the running call finishes honestly, so if it commits the
//! execution is `committed` and the operation `cancelled_after_side_effect`;
//! no new call starts in the cancelled operation, and a call that provably
//! failed is not tried again after the cancellation.

use toolledger_test_support::downstream;

use std::sync::Arc;

use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind, WAIT};
use toolledger::executor::{CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{Ledger, LedgerConfig};
use toolledger::model::{ExecutionStatus, OperationId, OperationStatus, ToolCall};

fn executor(dir: &tempfile::TempDir) -> Executor {
    let ledger = Ledger::open(&dir.path().join("l.db"), LedgerConfig::default()).unwrap();
    Executor::new(Arc::new(ledger), fast_config())
}

fn keyed() -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("book", 1)
    }
}

fn op() -> OperationId {
    OperationId::new("op_cancel").unwrap()
}

fn book(call_id: &str) -> ToolCall {
    ToolCall::custom(call_id, "book", r#"{"table":4}"#)
}

/// Starts `book("call_1")` in a task and waits until the tool is paused
/// before sending; returns the task and the pause.
async fn start_paused(
    exec: &Executor,
    tool: &HttpTool,
) -> (
    tokio::task::JoinHandle<CallOutcome>,
    downstream::PauseHandle,
) {
    let mut pause = tool.pause_first_perform();
    let run = exec.clone();
    let task = tokio::spawn(async move { run.execute(&op(), 0, book("call_1")).await.unwrap() });
    pause.reached().await;
    (task, pause)
}

#[tokio::test]
async fn a_call_in_flight_when_its_operation_is_cancelled_commits_and_marks_the_side_effect() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir);
    let tool = Arc::new(HttpTool::new(keyed(), Kind::Effect, &service));
    exec.register(tool.clone()).unwrap();

    let (task, pause) = start_paused(&exec, &tool).await;
    // A call is in flight: an effect may exist, so the stop says so.
    assert_eq!(
        exec.cancel_operation(&op()).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    let id = exec.ledger().list(&op()).unwrap()[0].execution_id.clone();
    assert_eq!(
        exec.ledger().get(&id).unwrap().unwrap().status,
        ExecutionStatus::Executing,
        "a call in flight is not cancelled under the tool's feet"
    );

    pause.release();
    let out = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert!(
        matches!(
            out,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        ),
        "{out:?}"
    );
    assert_eq!(
        exec.ledger().get(&id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    assert_eq!(
        exec.ledger().operation_status(&op()).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    assert_eq!(service.effects().len(), 1);

    // No new call starts in the cancelled operation.
    let late = exec.execute(&op(), 0, book("call_2")).await.unwrap();
    assert!(matches!(late, CallOutcome::Cancelled { .. }), "{late:?}");
    assert_eq!(service.posts().len(), 1);
}

#[tokio::test]
async fn a_retryable_refusal_after_the_cancellation_is_not_tried_again() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        throttle: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir);
    let tool = Arc::new(HttpTool::new(keyed(), Kind::Effect, &service));
    exec.register(tool.clone()).unwrap();

    let (task, pause) = start_paused(&exec, &tool).await;
    // A call is in flight: an effect may exist, so the stop says so.
    assert_eq!(
        exec.cancel_operation(&op()).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    pause.release();
    let out = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert!(matches!(out, CallOutcome::Cancelled { .. }), "{out:?}");
    let rec = exec.ledger().list(&op()).unwrap().remove(0);
    assert_eq!(rec.status, ExecutionStatus::CancelledBeforeCommit);
    assert_eq!(
        service.posts().len(),
        1,
        "the refused request was not sent again"
    );
    assert!(service.effects().is_empty());
    assert_eq!(
        exec.ledger().operation_status(&op()).unwrap(),
        Some(OperationStatus::Cancelled)
    );
}

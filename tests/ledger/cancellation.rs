//! Cancellation: nothing starts in a cancelled operation, a stop reports side effects that may have happened, and an unknown outcome after a cancel is never resent.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use downstream::{Behaviour, Downstream, HttpTool, Kind, WAIT};
use support::*;
use toolledger::executor::{CallOutcome, Executor, ToolDescriptor, *};
use toolledger::ledger::{
    Begin, CancelOutcome, Error, JobApplied, JobUpdate, Ledger, LedgerConfig, ManualClock,
};
use toolledger::model::{ExecutionStatus, OperationId, OperationStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

// ---------------------------------------------------------------------------
// Cancellation before and after the side effect, and compensation.
// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
// Cancelling an operation while a tool call is in flight (row 10 of the
// executor matrix): the running call finishes honestly, so if it commits the
// execution is `committed` and the operation `cancelled_after_side_effect`;
// no new call starts in the cancelled operation, and a call that provably
// failed is not tried again after the cancellation.
// ---------------------------------------------------------------------------

fn keyed() -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("book", 1)
    }
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
    let task = tokio::spawn(async move {
        run.execute(&op("op_cancel"), 0, book("call_1"))
            .await
            .unwrap()
    });
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
    let exec = executor_at(&dir.path().join("l.db"));
    let tool = Arc::new(HttpTool::new(keyed(), Kind::Effect, &service));
    exec.register(tool.clone()).unwrap();

    let (task, pause) = start_paused(&exec, &tool).await;
    // A call is in flight: an effect may exist, so the stop says so.
    assert_eq!(
        exec.cancel_operation(&op("op_cancel")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    let id = exec.ledger().list(&op("op_cancel")).unwrap()[0]
        .execution_id
        .clone();
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
        exec.ledger().operation_status(&op("op_cancel")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    assert_eq!(service.effects().len(), 1);

    // No new call starts in the cancelled operation.
    let late = exec
        .execute(&op("op_cancel"), 0, book("call_2"))
        .await
        .unwrap();
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
    let exec = executor_at(&dir.path().join("l.db"));
    let tool = Arc::new(HttpTool::new(keyed(), Kind::Effect, &service));
    exec.register(tool.clone()).unwrap();

    let (task, pause) = start_paused(&exec, &tool).await;
    // A call is in flight: an effect may exist, so the stop says so.
    assert_eq!(
        exec.cancel_operation(&op("op_cancel")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    pause.release();
    let out = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert!(matches!(out, CallOutcome::Cancelled { .. }), "{out:?}");
    let rec = exec.ledger().list(&op("op_cancel")).unwrap().remove(0);
    assert_eq!(rec.status, ExecutionStatus::CancelledBeforeCommit);
    assert_eq!(
        service.posts().len(),
        1,
        "the refused request was not sent again"
    );
    assert!(service.effects().is_empty());
    assert_eq!(
        exec.ledger().operation_status(&op("op_cancel")).unwrap(),
        Some(OperationStatus::Cancelled)
    );
}

// ---------------------------------------------------------------------------
// Unknown outcomes after a cancellation are never resent, and a background
// job the downstream accepted is reported pending after a restart, not
// unknown.
// ---------------------------------------------------------------------------
/// A tool whose first request times out after the downstream saw it (the
/// downstream never commits it), and which counts every request.
struct Flaky {
    requests: AtomicU32,
    key: bool,
    lookup: bool,
}

#[async_trait]
impl ToolHandler for Flaky {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: self.key,
            lookup: self.lookup,
            ..ToolDescriptor::side_effect("wire", 1)
        }
    }
    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        Ok(PerformOutcome::Unknown {
            reason: "timeout".into(),
        })
    }
    async fn lookup(&self, _req: ToolRequest) -> Result<LookupOutcome, ToolError> {
        Ok(LookupOutcome::NotFound)
    }
}

/// An executor on a ledger whose clock stands at 0 (1 ms backoff).
fn manual_executor(path: &std::path::Path) -> Executor {
    manual_executor_with(path, Arc::new(ManualClock::new(0)))
}

fn manual_executor_with(path: &std::path::Path, clock: Arc<ManualClock>) -> Executor {
    let ledger = Ledger::open_with_clock(path, LedgerConfig::default(), clock).unwrap();
    Executor::new(
        Arc::new(ledger),
        ExecutorConfig {
            backoff_base: std::time::Duration::from_millis(1),
            ..ExecutorConfig::default()
        },
    )
}

#[tokio::test]
async fn an_unknown_outcome_after_cancellation_is_not_resent_under_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let exec = manual_executor(&dir.path().join("l.db"));
    let tool = Arc::new(Flaky {
        requests: AtomicU32::new(0),
        key: true,
        lookup: false,
    });
    exec.register(tool.clone()).unwrap();
    let op = OperationId::new("op").unwrap();
    // The first attempt's outcome is unknown and stays so (no lookup): with
    // max_attempts = 1 nothing is resent.
    let exec1 = Executor::new(
        exec.ledger().clone(),
        ExecutorConfig {
            max_attempts: 1,
            ..exec.config().clone()
        },
    );
    exec1.register(tool.clone()).unwrap();
    let out = exec1
        .execute(&op, 0, ToolCall::custom("c", "wire", "{}"))
        .await
        .unwrap();
    assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
    // The outcome is unknown: an effect may exist, so the stop says so.
    assert_eq!(
        exec.cancel_operation(&op).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    // Asked again after the cancel (a retry of the same call): the key would
    // allow a resend, but the user said stop, so it is surfaced instead.
    let again = exec
        .execute(&op, 0, ToolCall::custom("c", "wire", "{}"))
        .await
        .unwrap();
    assert!(matches!(again, CallOutcome::Unknown { .. }), "{again:?}");
    assert_eq!(tool.requests.load(Ordering::SeqCst), 1);
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
}

#[tokio::test]
async fn after_cancellation_a_lookup_that_finds_nothing_cancels_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(0));
    let exec = manual_executor_with(&dir.path().join("l.db"), clock.clone());
    let tool = Arc::new(Flaky {
        requests: AtomicU32::new(0),
        key: true,
        lookup: true,
    });
    let exec1 = Executor::new(
        exec.ledger().clone(),
        ExecutorConfig {
            max_attempts: 1,
            ..exec.config().clone()
        },
    );
    exec1.register(tool.clone()).unwrap();
    exec.register(tool.clone()).unwrap();
    let op = OperationId::new("op").unwrap();
    let out = exec1
        .execute(&op, 0, ToolCall::custom("c", "wire", "{}"))
        .await
        .unwrap();
    assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
    exec.cancel_operation(&op).unwrap();
    // Inside the tool's landing window "not found" proves nothing yet: the
    // outcome stays unknown, with a time to ask again.
    let again = exec
        .execute(&op, 0, ToolCall::custom("c", "wire", "{}"))
        .await
        .unwrap();
    let CallOutcome::Unknown {
        retry_after: Some(wait),
        ..
    } = again
    else {
        panic!("{again:?}")
    };
    assert!(wait <= toolledger::executor::DEFAULT_LANDING_WINDOW);
    clock.advance(i64::try_from(wait.as_millis()).unwrap());
    let again = exec
        .execute(&op, 0, ToolCall::custom("c", "wire", "{}"))
        .await
        .unwrap();
    assert!(matches!(again, CallOutcome::Cancelled { .. }), "{again:?}");
    assert_eq!(tool.requests.load(Ordering::SeqCst), 1);
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::CancelledBeforeCommit);
}

struct Export {
    started: AtomicU32,
}

#[async_trait]
impl ToolHandler for Export {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::side_effect("export_report", 1)
    }
    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(PerformOutcome::JobStarted {
            job_id: format!("job_{n}"),
        })
    }
}

#[tokio::test]
async fn a_started_job_is_pending_after_a_restart_and_a_webhook_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let op = OperationId::new("op").unwrap();
    let tool = Arc::new(Export {
        started: AtomicU32::new(0),
    });
    let id = {
        let exec = manual_executor(&path);
        exec.register(tool.clone()).unwrap();
        let out = exec
            .execute(&op, 0, ToolCall::custom("c", "export_report", "{}"))
            .await
            .unwrap();
        assert!(
            matches!(&out, CallOutcome::Pending { job_id, .. } if job_id == "job_1"),
            "{out:?}"
        );
        out.execution_id().clone()
    }; // the process "dies" with the job running downstream
    let exec = manual_executor(&path);
    exec.register(tool.clone()).unwrap();
    let recovered = exec.recover().await.unwrap().outcomes;
    assert!(
        matches!(recovered.as_slice(), [CallOutcome::Pending { job_id, .. }] if job_id == "job_1"),
        "{recovered:?}"
    );
    // The same call asked again is still pending, and nothing is restarted.
    let again = exec
        .execute(&op, 0, ToolCall::custom("c", "export_report", "{}"))
        .await
        .unwrap();
    assert!(matches!(again, CallOutcome::Pending { .. }), "{again:?}");
    assert_eq!(tool.started.load(Ordering::SeqCst), 1);
    let applied = exec
        .ingest_webhook(
            "reports",
            "evt_1",
            &id,
            &JobUpdate::Succeeded {
                result_json: r#"{"url":"u"}"#.into(),
            },
        )
        .unwrap();
    assert!(matches!(applied, JobApplied::Committed(_)));
    let done = exec
        .execute(&op, 0, ToolCall::custom("c", "export_report", "{}"))
        .await
        .unwrap();
    assert_eq!(done.result_json(), Some(r#"{"url":"u"}"#));
}

//! Unknown outcomes after a cancellation are never resent, and a background
//! job the downstream accepted is reported pending after a restart, not
//! unknown.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use toolledger::executor::*;
use toolledger::ledger::{JobApplied, JobUpdate, Ledger, LedgerConfig, ManualClock};
use toolledger::model::{ExecutionStatus, OperationId, OperationStatus, ToolCall};

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

fn executor(path: &std::path::Path) -> Executor {
    executor_with(path, Arc::new(ManualClock::new(0)))
}

fn executor_with(path: &std::path::Path, clock: Arc<ManualClock>) -> Executor {
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
    let exec = executor(&dir.path().join("l.db"));
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
    let exec = executor_with(&dir.path().join("l.db"), clock.clone());
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
        let exec = executor(&path);
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
    let exec = executor(&path);
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

//! Sizes of stored text, the schedules a review of the first version found
//! wrong: a batch's failure reason inside its partial result stored bounded
//! (Ledger API and executor); a job reported under an unusable id by a stale
//! attempt kept as evidence of an effect (a cancelled operation becomes
//! `cancelled_after_side_effect`), and by a late report for a settled call
//! answered with the stored truth; an encrypted ledger's reasons cut before
//! they are sealed.

use std::sync::Arc;

use async_trait::async_trait;
use support::*;
use toolledger::executor::{
    BatchMode, CallOutcome, CallerStep, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor,
    ToolError, ToolHandler, ToolRequest,
};
use toolledger::ledger::{Resolution, Resolved};
use toolledger::model::text::MAX_REASON_BYTES;
use toolledger::model::{ExecutionStatus, OperationStatus, ToolCall};
use toolledger_test_support as support;

const BIG: usize = 2 << 20;

/// Generous: a partial batch result of two tiny items plus a bounded
/// reason, its JSON escaping and the envelope.
const PARTIAL_BOUND: usize = 2 * MAX_REASON_BYTES + 1024;

fn config() -> ExecutorConfig {
    ExecutorConfig {
        perform_timeout: None,
        ..downstream::fast_config()
    }
}

/// Ledger API: the reason of a batch that stops after some items (a batch
/// item's error, free text) is written into the partial result JSON as it
/// is: neither cut to `MAX_REASON_BYTES` nor kept within the JSON limits.
#[test]
fn a_batch_failure_reason_is_stored_bounded_in_the_partial_result() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let t = ticket(
        ledger
            .begin(
                &op("op"),
                0,
                &spec("b", "t", r#"{"items":[{"n":0},{"n":1}]}"#),
            )
            .unwrap(),
    );
    let a = t.attempt_id();
    ledger
        .record_batch_item(&a, 0, r#"{"ok":0}"#, None)
        .unwrap();
    let long = "r".repeat(BIG);
    let stored = ledger.commit_batch(&a, Some(&long)).unwrap();
    assert!(stored.partial);
    let rec = ledger.get(&a.execution_id).unwrap().unwrap();
    let result = rec.result_json.unwrap();
    let max = ledger.config().json_limits.max_bytes;
    assert!(
        result.len() <= PARTIAL_BOUND && result.len() <= max,
        "partial result stored with {} bytes (JSON limit {max}, reason bound {MAX_REASON_BYTES})",
        result.len()
    );
}

/// A batch tool: item 0 commits, item 1 is refused (not retryable) with a
/// long error text, as an HTML error page.
struct BatchTool {
    reason_len: usize,
}

#[async_trait]
impl ToolHandler for BatchTool {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            batch: BatchMode::Independent,
            ..ToolDescriptor::side_effect("invite_all", 1)
        }
    }

    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        Ok(match req.item_index {
            Some(0) => PerformOutcome::Committed {
                result_json: r#"{"ok":0}"#.into(),
                external_id: None,
            },
            _ => PerformOutcome::FailedBeforeCommit {
                reason: "<html>".repeat(self.reason_len / 6),
                retryable: false,
            },
        })
    }
}

/// Through the executor: a batch item's long error (the tool's text) ends
/// the batch as a partial commit whose stored result holds the whole text.
#[test]
fn through_the_executor_a_batch_items_long_error_is_stored_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let exec = Executor::new(Arc::new(ledger), config());
    exec.register(Arc::new(BatchTool { reason_len: BIG }))
        .unwrap();
    let out = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(exec.execute(
            &op("op"),
            0,
            ToolCall::custom("c", "invite_all", r#"{"items":[{"n":0},{"n":1}]}"#),
        ))
        .unwrap();
    let CallOutcome::Completed {
        execution_id,
        partial,
        ..
    } = out
    else {
        panic!("expected a partial Completed, got {out:?}");
    };
    assert!(partial);
    let rec = exec.ledger().get(&execution_id).unwrap().unwrap();
    let result = rec.result_json.unwrap();
    let max = exec.ledger().config().json_limits.max_bytes;
    assert!(
        result.len() <= PARTIAL_BOUND && result.len() <= max,
        "partial result stored with {} bytes (JSON limit {max}, reason bound {MAX_REASON_BYTES})",
        result.len()
    );
}

/// A render tool: never performed (caller-driven only).
struct Render;

#[async_trait]
impl ToolHandler for Render {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::side_effect("render", 1)
    }

    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        unreachable!("caller-driven only")
    }
}

fn perform_of(step: CallerStep) -> toolledger::executor::CallerAttempt {
    match step {
        CallerStep::Perform(a) => a,
        other => panic!("expected Perform, got {other:?}"),
    }
}

/// The schedule: attempt 1 of a render call becomes unknown, is resolved
/// "not found, retry" (attempt 2), the operation is cancelled, attempt 2 is
/// refused for good, so the operation is plain `cancelled` (nothing can
/// have happened). Then attempt 1's late report arrives: the tool started a
/// job downstream. Returns the operation's status after that report, the
/// evidence kinds kept and the report's answer.
fn late_job_report_after_settled_as_absent(
    call_id: &str,
    job_id: &str,
) -> (Option<OperationStatus>, Vec<String>, CallerStep) {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let exec = Executor::new(Arc::new(ledger), config());
    exec.register(Arc::new(Render)).unwrap();
    let o = op(&format!("op_{call_id}"));
    let a1 = perform_of(exec.start(&o, 0, call(call_id, "render", "{}")).unwrap());
    let id = a1.request.execution_id.clone();
    let step = exec
        .report(&a1, Err(ToolError::new("connection reset")))
        .unwrap();
    assert!(
        matches!(step, CallerStep::Done(CallOutcome::Unknown { .. })),
        "{step:?}"
    );
    let ledger = exec.ledger();
    let Resolved::Retry(t2) = ledger
        .resolve_unknown(&current(ledger, &id), Resolution::NotFoundRetry)
        .unwrap()
    else {
        panic!("expected a retry");
    };
    ledger.cancel_operation(&o).unwrap();
    ledger
        .fail_before_commit(&t2.attempt_id(), "refused", false)
        .unwrap();
    assert_eq!(
        ledger.operation_status(&o).unwrap(),
        Some(OperationStatus::Cancelled),
        "settled as nothing happened before the late report"
    );
    let answer = exec
        .report_attempt(
            &id,
            1,
            Ok(PerformOutcome::JobStarted {
                job_id: job_id.to_owned(),
            }),
        )
        .unwrap();
    let kinds = ledger
        .evidence(&id)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    (ledger.operation_status(&o).unwrap(), kinds, answer)
}

/// A stale attempt's report that it started a job: under a usable job id
/// the job is kept as effect evidence and the cancelled operation becomes
/// `cancelled_after_side_effect`; under an empty job id (the job was
/// started downstream all the same) it is kept as "unknown" evidence, which
/// counts as no effect, and the operation stays plain `cancelled`: the
/// ledger says nothing happened although the tool reported a job started.
#[test]
fn a_stale_job_started_under_an_unusable_id_still_counts_as_an_effect() {
    let (control, control_kinds, control_answer) =
        late_job_report_after_settled_as_absent("good", "job_1");
    assert_eq!(
        control,
        Some(OperationStatus::CancelledAfterSideEffect),
        "control: {control_kinds:?} {control_answer:?}"
    );
    let (status, kinds, answer) = late_job_report_after_settled_as_absent("empty", "");
    assert!(
        matches!(answer, CallerStep::Done(CallOutcome::Failed { .. })),
        "{answer:?}"
    );
    assert_eq!(
        status,
        Some(OperationStatus::CancelledAfterSideEffect),
        "a job was started downstream; evidence kept: {kinds:?} (control: {control_kinds:?})"
    );
}

/// A late duplicate report, by the attempt's own session, that the tool
/// started a job, for a call already settled as failed: under a usable job
/// id the answer is the stored truth (`Failed`); under an empty job id the
/// report is an `InvalidTransition` error.
#[test]
fn a_late_job_report_under_an_unusable_id_answers_the_stored_truth() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let exec = Executor::new(Arc::new(ledger), config());
    exec.register(Arc::new(Render)).unwrap();
    for (call_id, job_id) in [
        ("good", "job_1"),
        ("empty", ""),
        ("long", &*"j".repeat(4096)),
    ] {
        let a1 = perform_of(
            exec.start(&op("op"), 0, call(call_id, "render", "{}"))
                .unwrap(),
        );
        let id = a1.request.execution_id.clone();
        let done = exec
            .report(
                &a1,
                Ok(PerformOutcome::FailedBeforeCommit {
                    reason: "quota".into(),
                    retryable: false,
                }),
            )
            .unwrap();
        assert!(
            matches!(done, CallerStep::Done(CallOutcome::Failed { .. })),
            "{done:?}"
        );
        let late = exec.report_attempt(
            &id,
            1,
            Ok(PerformOutcome::JobStarted {
                job_id: job_id.to_owned(),
            }),
        );
        assert!(
            matches!(late, Ok(CallerStep::Done(CallOutcome::Failed { .. }))),
            "{call_id}: {late:?}"
        );
        assert_eq!(
            exec.ledger().get(&id).unwrap().unwrap().status,
            ExecutionStatus::FailedBeforeCommit
        );
    }
}

/// Checked fine: in an encrypted ledger a long reason is cut before it is
/// sealed (the record, the log line and the stale attempt's evidence), so
/// the file stays small and the reason reads back cut.
#[test]
fn an_encrypted_ledgers_long_reasons_are_cut_before_sealing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let clock = Arc::new(toolledger::ledger::ManualClock::new(1_000_000));
    let key = toolledger::ledger::LedgerKey::generate().unwrap();
    let ledger = toolledger::ledger::Ledger::open_with(
        &db,
        toolledger::ledger::LedgerConfig::default(),
        clock,
        Some(&key),
    )
    .unwrap();
    let long = "é".repeat(BIG);
    for n in 0..3 {
        let t = ticket(
            ledger
                .begin(&op("op"), 0, &spec(&format!("c{n}"), "t", "{}"))
                .unwrap(),
        );
        ledger.mark_outcome_unknown(&t.attempt_id(), &long).unwrap();
        let rec = ledger.get(&t.execution_id).unwrap().unwrap();
        let reason = rec.last_reason.unwrap();
        assert!(reason.len() <= MAX_REASON_BYTES, "{}", reason.len());
        let log = ledger.transitions(&t.execution_id).unwrap();
        let logged = log
            .iter()
            .filter_map(|e| e.reason.as_deref())
            .next()
            .unwrap();
        assert_eq!(logged, reason);
        let Resolved::Retry(t2) = ledger
            .resolve_unknown(&t.attempt_id(), Resolution::NotFoundRetry)
            .unwrap()
        else {
            panic!()
        };
        let _ = ledger.fail_before_commit(&t.attempt_id(), &long, false);
        let ev = ledger.evidence(&t.execution_id).unwrap();
        assert!(ev[0].reason.as_deref().unwrap().len() <= MAX_REASON_BYTES);
        ledger
            .fail_before_commit(&t2.attempt_id(), &long, false)
            .unwrap();
    }
    ledger.checkpoint().unwrap();
    let bytes: u64 = ["", "-wal"]
        .iter()
        .map(|s| {
            let mut p = db.as_os_str().to_owned();
            p.push(s);
            std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
        })
        .sum();
    assert!(bytes < 2 << 20, "{bytes} bytes");
}

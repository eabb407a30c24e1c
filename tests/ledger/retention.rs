//! Retention: prune, tombstones and the file shrinking.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use support::*;
use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{
    Begin, JobUpdate, Ledger, PruneCutoff, PruneOptions, Resolution, PRUNED_EXECUTED_REASON,
    PRUNED_FAILED_REASON, SCHEMA_VERSION as CURRENT_VERSION,
};
use toolledger::model::{ExecutionId, ExecutionStatus, OperationStatus};
use toolledger_test_support as support;

const DAY_MS: i64 = 86_400_000;
const V1_DDL: &str = include_str!("../../src/store/migrations/001_initial.sql");

/// Begins, commits and delivers one call; returns its id.
fn delivered(ledger: &Ledger, op_name: &str, call_id: &str, args: &str) -> ExecutionId {
    let Begin::Execute(t) = ledger
        .begin(&op(op_name), 0, &spec(call_id, "send", args))
        .unwrap()
    else {
        panic!("expected Execute")
    };
    ledger
        .commit(&t.attempt_id(), r#"{"sent":true}"#, Some("msg_1"))
        .unwrap();
    ledger
        .mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    t.execution_id
}

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

#[test]
fn pruned_calls_leave_tombstones_and_a_late_retry_is_refused_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let args = r#"{"to":"a@example.com"}"#;
    let done = delivered(&ledger, "o", "c1", args);

    // A rejected call, a cancelled call and a failed (not retryable) call.
    let pending = ledger
        .begin(&op("o"), 0, &spec("c2", "send", "{}").with_approval())
        .unwrap();
    let Begin::NeedsApproval(req) = pending else {
        panic!()
    };
    ledger
        .reject(&req.execution_id, &req.args_digest, "no")
        .unwrap();
    let Begin::NeedsApproval(req3) = ledger
        .begin(&op("o"), 0, &spec("c3", "send", "{}").with_approval())
        .unwrap()
    else {
        panic!()
    };
    ledger.cancel(&req3.execution_id).unwrap();
    let failed = ticket(
        ledger
            .begin(&op("o"), 0, &spec("c4", "send", "{}"))
            .unwrap(),
    );
    ledger
        .fail_before_commit(&failed.attempt_id(), "refused", false)
        .unwrap();

    clock.advance(31 * DAY_MS);
    let report = ledger
        .prune(Duration::from_secs(30 * 86_400), true)
        .unwrap();
    assert_eq!(report.executions, 4);
    assert_eq!(report.tombstones_written, 4);
    assert!(report.transitions >= 4);
    assert_eq!(report.operations, 1, "the emptied operation goes too");
    assert_eq!(ledger.get(&done).unwrap(), None);
    let tomb = ledger.tombstone(&done).unwrap().unwrap();
    assert_eq!(tomb.final_status, ExecutionStatus::ResultDelivered);

    // The same call, very late: refused, and nothing is recorded again.
    match ledger
        .begin(&op("o"), 0, &spec("c1", "send", args))
        .unwrap()
    {
        Begin::Failed {
            execution_id,
            reason,
        } => {
            assert_eq!(execution_id, done);
            assert_eq!(reason, PRUNED_EXECUTED_REASON);
        }
        other => panic!("a pruned call must not run again: {other:?}"),
    }
    assert_eq!(ledger.get(&done).unwrap(), None);
    // Different arguments under the same id: a conflict, as before pruning.
    assert!(matches!(
        ledger
            .begin(
                &op("o"),
                0,
                &spec("c1", "send", r#"{"to":"b@example.com"}"#)
            )
            .unwrap(),
        Begin::Conflict { .. }
    ));
    // Rejected, cancelled and failed keep their answers.
    assert!(matches!(
        ledger
            .begin(&op("o"), 0, &spec("c2", "send", "{}").with_approval())
            .unwrap(),
        Begin::Rejected { .. }
    ));
    assert!(matches!(
        ledger
            .begin(&op("o"), 0, &spec("c3", "send", "{}").with_approval())
            .unwrap(),
        Begin::Cancelled { .. }
    ));
    assert!(matches!(
        ledger.begin(&op("o"), 0, &spec("c4", "send", "{}")).unwrap(),
        Begin::Failed { reason, .. } if reason == PRUNED_FAILED_REASON
    ));
    // A whole round of late retries, in one begin_round, changes nothing.
    let answers = ledger
        .begin_round(
            &op("o"),
            0,
            &[spec("c1", "send", args), spec("c4", "send", "{}")],
        )
        .unwrap();
    assert!(answers.iter().all(|a| matches!(a, Begin::Failed { .. })));
    assert_eq!(ledger.stats().unwrap().executions_by_status, vec![]);
}

/// A side-effecting tool that counts how often it really ran.
struct Counting(AtomicU32);

#[async_trait]
impl ToolHandler for Counting {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::side_effect("send", 1)
    }

    async fn perform(&self, _request: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(PerformOutcome::Committed {
            result_json: r#"{"sent":true}"#.into(),
            external_id: None,
        })
    }
}

/// `begin` inserts a new call before it reads anything of it, after one
/// read of the operation and the first call's tombstone: a pruned call is
/// refused wherever it sits in a round, and the new calls beside it run.
#[test]
fn a_round_refuses_its_pruned_calls_in_any_position_and_runs_the_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let args = r#"{"to":"a@example.com"}"#;
    let first = delivered(&ledger, "o", "c1", args);
    let last = delivered(&ledger, "o", "c2", args);
    clock.advance(31 * DAY_MS);
    let report = ledger
        .prune(Duration::from_secs(30 * 86_400), true)
        .unwrap();
    assert_eq!(report.tombstones_written, 2);
    assert_eq!(report.operations, 1, "the operation is created again below");

    let answers = ledger
        .begin_round(
            &op("o"),
            0,
            &[
                spec("c1", "send", args),
                spec("c9", "send", args),
                spec("c2", "send", args),
            ],
        )
        .unwrap();
    for (answer, pruned) in [(&answers[0], &first), (&answers[2], &last)] {
        match answer {
            Begin::Failed {
                execution_id,
                reason,
            } => {
                assert_eq!(execution_id, pruned);
                assert_eq!(reason, PRUNED_EXECUTED_REASON);
            }
            other => panic!("a pruned call must not run again: {other:?}"),
        }
        assert_eq!(ledger.get(pruned).unwrap(), None, "nothing recorded again");
    }
    let Begin::Execute(new) = &answers[1] else {
        panic!("the new call runs: {:?}", answers[1])
    };
    assert_eq!(
        ledger.get(&new.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Executing
    );
    assert_eq!(
        ledger.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::Open)
    );
}

#[test]
fn through_the_executor_a_late_retry_of_a_pruned_call_does_not_execute() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let ledger = Arc::new(ledger);
    let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
    let tool = Arc::new(Counting(AtomicU32::new(0)));
    executor.register(tool.clone()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let call = call("c1", "send", r#"{"amount":5}"#);
    let first = rt
        .block_on(executor.execute(&op("o"), 0, call.clone()))
        .unwrap();
    ledger
        .mark_delivered(&[first.execution_id().clone()])
        .unwrap();
    assert_eq!(tool.0.load(Ordering::SeqCst), 1);

    clock.advance(10 * DAY_MS);
    let report = ledger.prune(Duration::from_secs(86_400), true).unwrap();
    assert_eq!(report.executions, 1);

    let late = rt.block_on(executor.execute(&op("o"), 0, call)).unwrap();
    assert!(
        matches!(&late, CallOutcome::Failed { reason, retryable: false, .. } if reason == PRUNED_EXECUTED_REASON),
        "{late:?}"
    );
    assert_eq!(tool.0.load(Ordering::SeqCst), 1, "the tool never ran again");
}

#[test]
fn work_that_needs_attention_is_never_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let o = op("o");
    // executing
    let executing = ticket(ledger.begin(&o, 0, &spec("exec", "t", "{}")).unwrap()).execution_id;
    // outcome_unknown
    let unknown = ticket(ledger.begin(&o, 0, &spec("unk", "t", "{}")).unwrap()).execution_id;
    ledger
        .mark_outcome_unknown(&current(&ledger, &unknown), "timeout")
        .unwrap();
    // committed, not delivered
    let committed = ticket(ledger.begin(&o, 0, &spec("com", "t", "{}")).unwrap()).execution_id;
    ledger
        .commit(&current(&ledger, &committed), "[1]", None)
        .unwrap();
    // prepared, waiting for approval; and approved
    let Begin::NeedsApproval(prepared) = ledger
        .begin(&o, 0, &spec("prep", "t", "{}").with_approval())
        .unwrap()
    else {
        panic!()
    };
    let Begin::NeedsApproval(approved) = ledger
        .begin(&o, 0, &spec("appr", "t", "{}").with_approval())
        .unwrap()
    else {
        panic!()
    };
    ledger
        .approve(&approved.execution_id, &approved.args_digest, None)
        .unwrap();
    // failed, but retryable
    let retry = ticket(ledger.begin(&o, 0, &spec("retry", "t", "{}")).unwrap()).execution_id;
    ledger
        .fail_before_commit(&current(&ledger, &retry), "503", true)
        .unwrap();

    clock.advance(365 * DAY_MS);
    let report = ledger.prune(PruneCutoff::BeforeMs(i64::MAX), true).unwrap();
    assert_eq!(report.executions, 0, "{report:?}");
    assert_eq!(report.operations, 0);
    for (id, status) in [
        (&executing, ExecutionStatus::Executing),
        (&unknown, ExecutionStatus::OutcomeUnknown),
        (&committed, ExecutionStatus::Committed),
        (&prepared.execution_id, ExecutionStatus::Prepared),
        (&approved.execution_id, ExecutionStatus::Approved),
        (&retry, ExecutionStatus::FailedBeforeCommit),
    ] {
        let rec = ledger.get(id).unwrap().expect("still stored");
        assert_eq!(rec.status, status, "{id}");
        assert!(ledger.tombstone(id).unwrap().is_none());
        assert!(!ledger.transitions(id).unwrap().is_empty());
    }
    // Resolving and delivering later still works on the kept rows.
    let resolved = ledger
        .resolve_unknown(
            &current(&ledger, &unknown),
            Resolution::Found {
                result_json: "[2]".into(),
                external_id: None,
            },
        )
        .unwrap();
    assert!(matches!(
        resolved,
        toolledger::ledger::Resolved::Committed(_)
    ));
    ledger
        .mark_delivered(&[committed.clone(), unknown])
        .unwrap();
}

#[test]
fn prune_respects_the_cutoff_and_removes_everything_hanging_off_an_execution() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    // An old execution with an approval, a job and two webhook events.
    let Begin::NeedsApproval(req) = ledger
        .begin(&op("old"), 0, &spec("c", "t", "{}").with_approval())
        .unwrap()
    else {
        panic!()
    };
    ledger
        .approve(
            &req.execution_id,
            &req.args_digest,
            Some(r#"{"amount":"5 EUR"}"#),
        )
        .unwrap();
    let t = ledger.mark_executing(&req.execution_id).unwrap();
    ledger.record_job(&t.attempt_id(), "job_1").unwrap();
    let progress = JobUpdate::Progress {
        state: "queued".into(),
    };
    ledger
        .ingest_webhook("svc", "evt_1", &t.execution_id, &progress)
        .unwrap();
    ledger
        .ingest_webhook(
            "svc",
            "evt_2",
            &t.execution_id,
            &JobUpdate::Succeeded {
                result_json: "{}".into(),
            },
        )
        .unwrap();
    ledger
        .mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    // An independent batch with two items, delivered.
    let b = ticket(
        ledger
            .begin(&op("old"), 1, &spec("b", "batch", "{}"))
            .unwrap(),
    )
    .execution_id;
    ledger
        .record_batch_item(&current(&ledger, &b), 0, "{}", None)
        .unwrap();
    ledger
        .record_batch_item(&current(&ledger, &b), 1, "{}", None)
        .unwrap();
    ledger.commit(&current(&ledger, &b), "[]", None).unwrap();
    ledger.mark_delivered(std::slice::from_ref(&b)).unwrap();

    clock.advance(10 * DAY_MS);
    let young = delivered(&ledger, "young", "c", "{}");
    clock.advance(DAY_MS);

    let mut seen = Vec::new();
    let options = PruneOptions {
        batch_size: 1,
        ..PruneOptions::new(Duration::from_secs(5 * 86_400))
    };
    let report = ledger
        .prune_with(&options, &mut |p| seen.push((p.done, p.total)))
        .unwrap();
    assert_eq!(report.executions, 2);
    assert_eq!(report.approvals, 1);
    assert_eq!(report.jobs, 1);
    assert_eq!(report.webhook_events, 2);
    assert_eq!(report.batch_items, 2);
    // The log entries went with their rows: the approved job logged
    // prepare, approve, start, commit, deliver; the batch start, commit,
    // deliver.
    assert_eq!(report.transitions, 8, "{report:?}");
    assert_eq!(report.operations, 1);
    assert_eq!(seen.last(), Some(&(2, 2)), "{seen:?}");
    assert!(
        ledger.get(&young).unwrap().is_some(),
        "younger than the cutoff"
    );
    assert_eq!(ledger.operation_status(&op("old")).unwrap(), None);
    assert_eq!(
        ledger.operation_status(&op("young")).unwrap(),
        Some(OperationStatus::Open)
    );
    // No orphan is left in any table.
    let conn = Connection::open(dir.path().join("l.db")).unwrap();
    for table in ["approvals", "batch_items", "jobs", "webhook_events"] {
        let orphans: i64 = conn
            .query_row(
                &format!(
                    "SELECT count(*) FROM {table} WHERE execution_id NOT IN
                     (SELECT execution_id FROM executions)"
                ),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(orphans, 0, "{table}");
    }
    // A repeated old webhook event finds nothing to apply: nothing runs.
    assert!(ledger
        .ingest_webhook("svc", "evt_2", &t.execution_id, &progress)
        .is_err());
}

#[test]
fn a_compensated_execution_stays_until_its_compensation_can_go() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let original = delivered(&ledger, "o", "pay", r#"{"amount":5}"#);
    let refund = ledger
        .compensate(&original, &op("o"), 1, &spec("refund", "refund", "{}"))
        .unwrap();
    let refund = ticket(refund).execution_id;
    ledger
        .commit(&current(&ledger, &refund), "{}", None)
        .unwrap();
    clock.advance(10 * DAY_MS);

    // The compensation is committed but not delivered: neither goes.
    let report = ledger.prune(Duration::from_secs(86_400), true).unwrap();
    assert_eq!(report.executions, 0);
    assert_eq!(report.kept_for_compensations, 1);
    assert!(ledger.get(&original).unwrap().is_some());

    ledger
        .mark_delivered(std::slice::from_ref(&refund))
        .unwrap();
    clock.advance(10 * DAY_MS);
    let report = ledger.prune(Duration::from_secs(86_400), true).unwrap();
    assert_eq!(report.executions, 2, "{report:?}");
    assert!(ledger.tombstone(&original).unwrap().is_some());
    assert!(ledger.tombstone(&refund).unwrap().is_some());
}

#[test]
fn without_tombstones_everything_older_than_the_cutoff_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let first = delivered(&ledger, "o", "c1", "{}");
    clock.advance(10 * DAY_MS);
    assert_eq!(
        ledger
            .prune(Duration::from_secs(86_400), true)
            .unwrap()
            .tombstones_written,
        1
    );
    let second = delivered(&ledger, "o", "c2", "{}");
    clock.advance(10 * DAY_MS);
    let report = ledger.prune(Duration::from_secs(86_400), false).unwrap();
    assert_eq!(report.executions, 1);
    assert_eq!(report.tombstones_written, 0);
    assert_eq!(report.tombstones_removed, 1);
    assert_eq!(ledger.tombstone_count().unwrap(), 0);
    assert!(ledger.tombstone(&first).unwrap().is_none());
    assert!(ledger.get(&second).unwrap().is_none());
}

#[test]
fn pruning_shrinks_the_file_after_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let pad = "x".repeat(2000);
    for i in 0..400 {
        let id = delivered(
            &ledger,
            &format!("op_{}", i / 4),
            &format!("c{i}"),
            &format!(r#"{{"note":"{pad}","n":{i}}}"#),
        );
        assert!(id.as_str().contains(&format!("c{i}")));
    }
    ledger.checkpoint().unwrap();
    let before = file_len(&path);
    assert!(before > 1_000_000, "{before}");
    clock.advance(40 * DAY_MS);
    let report = ledger
        .prune(Duration::from_secs(30 * 86_400), true)
        .unwrap();
    assert_eq!(report.executions, 400);
    let after = file_len(&path);
    assert!(
        after * 5 < before,
        "the file should shrink: {before} -> {after} bytes"
    );
    assert_eq!(report.bytes_before, before);
    assert_eq!(report.bytes_after, after);
    let wal = std::fs::metadata(dir.path().join("l.db-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert_eq!(wal, 0, "the WAL was checkpointed and truncated");
    assert_eq!(ledger.tombstone_count().unwrap(), 400);
}

/// A version 1 database, written by the version 1 DDL, with one execution of
/// every kind of dependent row.
fn v1_database(path: &std::path::Path) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL;")
        .unwrap();
    conn.execute_batch(V1_DDL).unwrap();
    conn.execute_batch(
        "PRAGMA user_version = 1;
         INSERT INTO operations VALUES ('o', 'open', 1, 1);
         INSERT INTO rounds VALUES ('o', 0, 1);
         INSERT INTO executions (execution_id, operation_id, round, position, provider,
            provider_call_id, tool_name, tool_version, args_digest, args_json, downstream_key,
            requires_approval, status, attempt_count, result_json, created_ms, updated_ms)
         VALUES ('o:round_0:c1:send:v1', 'o', 0, 0, 'openai_chat', 'c1', 'send', 1,
            'b1d4d3a0a0e6d1d5f7a3a0b4f1e2d3c4b5a6978877665544332211aabbccddee', '{}',
            'tl_000000000000000000000000000000000000000000000000', 0, 'committed', 1,
            '{\"ok\":true}', 1, 2);
         INSERT INTO transitions (execution_id, from_status, to_status, transition, attempt,
            session_id, reason, at_ms)
         VALUES ('o:round_0:c1:send:v1', NULL, 'executing', 'start', 1, 's', 'why|not
100%', 1),
                ('other', NULL, 'executing', 'start', 1, 's', NULL, 1),
                ('o:round_0:c1:send:v1', 'executing', 'committed', 'commit', 1, 's', NULL, 2);
         INSERT INTO webhook_events VALUES ('svc', 'e1', 'o:round_0:c1:send:v1', 2);",
    )
    .unwrap();
}

fn schema(path: &std::path::Path) -> Vec<(String, String, Option<String>)> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn a_v1_database_migrates_to_the_current_version_and_equals_a_fresh_schema() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("v1.db");
    v1_database(&old);
    let (ledger, _clock) = open_at(&old);
    let id = ExecutionId::parse("o:round_0:c1:send:v1").unwrap();
    // The records survived, the log kept its order (and its reasons, with
    // the characters the version 3 log line escapes) and grows after it.
    let rec = ledger.get(&id).unwrap().unwrap();
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"ok":true}"#));
    assert_eq!(rec.status, ExecutionStatus::Committed);
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    let log = ledger.transitions(&id).unwrap();
    let names: Vec<&str> = log.iter().map(|t| t.transition.as_str()).collect();
    assert_eq!(names, ["start", "commit", "deliver"]);
    assert_eq!(log[0].reason.as_deref(), Some("why|not\n100%"));
    assert_eq!(log[0].from, None);
    assert_eq!(log[1].from, Some(ExecutionStatus::Executing));
    assert_eq!(log[1].reason, None);
    assert_eq!(log[2].to, ExecutionStatus::ResultDelivered);
    assert!(
        ledger.recover().unwrap().is_empty(),
        "delivered: nothing needs attention"
    );
    drop(ledger);

    let fresh = dir.path().join("fresh.db");
    drop(open_at(&fresh));
    assert_eq!(schema(&old), schema(&fresh));
    let conn = Connection::open(&old).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, CURRENT_VERSION);
    assert_eq!(CURRENT_VERSION, 5);
    // The pages of the rebuilt tables went back to the file system.
    let free: i64 = conn
        .query_row("PRAGMA freelist_count", [], |r| r.get(0))
        .unwrap();
    assert_eq!(free, 0);
    // The log row that named no execution was kept, not dropped.
    let orphans: i64 = conn
        .query_row(
            "SELECT count(*) FROM transitions_orphaned WHERE execution_id = 'other'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphans, 1);
    let webhooks: i64 = conn
        .query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(webhooks, 1);
    // The append-only guard came along: the log may grow, never change.
    let err = conn
        .execute("UPDATE executions SET history = 'x'", [])
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    let err = conn
        .execute(
            "UPDATE executions SET history = substr(history, 2) || 'x'",
            [],
        )
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    // The attention flag cannot disagree with the status.
    let err = conn
        .execute("UPDATE executions SET needs_attention = 1", [])
        .unwrap_err();
    assert!(err.to_string().contains("CHECK"), "{err}");
}

/// An owner suspended past its lease, in a process the others cannot match,
/// is taken over; the new attempt
/// commits, is delivered and pruned. The old owner then resumes and reports
/// what its attempt did (an effect the world has): that report must not
/// vanish. It is refused, and what it carried is kept somewhere the app can
/// find (evidence of the pruned execution), not dropped with an untyped or
/// misleading answer.
#[test]
#[ignore = "design: a step naming an attempt of a pruned execution gets NotFound and what it carried \
            (result, external id) is dropped; needs a rule for evidence of a tombstoned execution \
            (StaleAttempt has no current attempt to name, evidence outliving its tombstone)"]
fn a_stale_attempt_reporting_after_its_execution_was_pruned_is_refused_and_not_lost() {
    use toolledger::ledger::Error;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let extension = open_with(&path, &clock);
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(t1) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    app.suspend().unwrap();
    // A process the extension cannot match: past the lease, the lease
    // alone decides.
    assert!(pretend_another_process(&path, app.session_id().as_str()));
    clock.advance(60_000);
    let Begin::Reconcile(r) = extension.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    let toolledger::ledger::Resolved::Retry(t2) = extension
        .resolve_unknown(&r.attempt_id(), Resolution::NotFoundRetry)
        .unwrap()
    else {
        panic!()
    };
    extension
        .commit(&t2.attempt_id(), r#"{"paid":2}"#, None)
        .unwrap();
    extension
        .mark_delivered(std::slice::from_ref(&t2.execution_id))
        .unwrap();
    clock.advance(1);
    let report = extension.prune(Duration::ZERO, true).unwrap();
    assert_eq!(report.executions, 1, "{report:?}");
    app.resume().unwrap();
    let late = app.commit(&t1.attempt_id(), r#"{"paid":"late"}"#, Some("pay_9"));
    eprintln!("late commit after prune: {late:?}");
    assert!(
        matches!(late, Err(Error::StaleAttempt { .. })),
        "a report of an attempt that is no longer current is StaleAttempt: {late:?}"
    );
    // What it carried is not dropped.
    let evidence = app.evidence(&t1.execution_id).unwrap();
    assert_eq!(evidence.len(), 1, "the late commit kept as evidence");
    // And the call still answers from its tombstone: never runs again.
    assert!(matches!(
        app.begin(&op("o"), 0, &s).unwrap(),
        Begin::Failed { .. }
    ));
}

/// An execution that ended failed for good but holds the evidence of a
/// stale attempt's late commit is never pruned: the evidence may be the
/// only trace of an effect (the store's PRUNABLE rule).
#[test]
fn an_execution_with_a_stale_attempts_evidence_is_never_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let o = op("o");
    let id = ticket(ledger.begin(&o, 0, &spec("ev", "t", "{}")).unwrap()).execution_id;
    let first = current(&ledger, &id);
    ledger.mark_outcome_unknown(&first, "timeout").unwrap();
    let toolledger::ledger::Resolved::Retry(second) = ledger
        .resolve_unknown(&first, Resolution::NotFoundRetry)
        .unwrap()
    else {
        panic!("not retried")
    };
    ledger
        .fail_before_commit(&second.attempt_id(), "422", false)
        .unwrap();
    // Attempt 1's answer arrives late: refused, kept as evidence.
    assert!(matches!(
        ledger.commit(&first, r#"{"late":1}"#, None),
        Err(toolledger::ledger::Error::StaleAttempt { .. })
    ));
    assert_eq!(ledger.evidence(&id).unwrap().len(), 1);
    // A control that is prunable: failed for good, no evidence.
    let plain = ticket(ledger.begin(&o, 0, &spec("plain", "t", "{}")).unwrap()).execution_id;
    ledger
        .fail_before_commit(&current(&ledger, &plain), "422", false)
        .unwrap();

    clock.advance(365 * DAY_MS);
    let report = ledger.prune(PruneCutoff::BeforeMs(i64::MAX), true).unwrap();
    assert_eq!(report.executions, 1, "only the control: {report:?}");
    assert!(ledger.get(&plain).unwrap().is_none());
    let rec = ledger.get(&id).unwrap().expect("kept for its evidence");
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    assert_eq!(ledger.evidence(&id).unwrap().len(), 1);
}

/// A batch left `failed_before_commit` with committed items (a version 3
/// ledger's partial commit) is never pruned before it is settled: its items
/// happened.
#[test]
fn a_failed_batch_with_committed_items_is_never_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let o = op("o");
    let s = spec("b", "send_all", r#"{"items":[{"n":0},{"n":1},{"n":2}]}"#);
    let t = ticket(ledger.begin(&o, 0, &s).unwrap());
    for i in 0..2 {
        ledger
            .record_batch_item(&t.attempt_id(), i, &format!(r#"{{"item":{i}}}"#), None)
            .unwrap();
    }
    ledger
        .fail_before_commit(&t.attempt_id(), "item 2: refused", false)
        .unwrap();
    let rec = ledger.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);

    clock.advance(365 * DAY_MS);
    let report = ledger.prune(PruneCutoff::BeforeMs(i64::MAX), true).unwrap();
    assert_eq!(report.executions, 0, "{report:?}");
    assert_eq!(ledger.batch_items(&t.execution_id).unwrap().len(), 2);
    // Asked again, it is settled as the partial commit it was.
    let Begin::Replay(r) = ledger.begin(&o, 0, &s).unwrap() else {
        panic!("not a replay")
    };
    assert!(r.partial);
}

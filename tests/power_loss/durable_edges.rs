//! The edges of "durable" that the seeded workload does not reach: the
//! syncs of `suspend()` and of dropping the ledger when SQLite's own
//! checkpoint cannot stand in for them (another connection keeps it from
//! copying, or keeps the ledger's connection from being the last), and the
//! evidence of a stale attempt whose commit would have been deferred.
//! Each test loses every unsynced write at the cut (`Loss::All`).

use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use toolledger::ledger::{Begin, CallSpec, Downstream, Ledger, Resolution, Resolved};
use toolledger::model::{OperationId, ToolCall};
use toolledger_test_support::power_vfs::{Loss, Machine};

use super::{config, cut_and_reopen, deferred_calls, lost_commits};

/// Another process's reader whose transaction began while the WAL was
/// empty (so it holds read lock 0): no checkpoint can copy, or sync, a
/// frame while it lasts.
fn reader_on_an_empty_wal(machine: &Machine, path: &std::path::Path) -> Connection {
    let reader = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY,
        machine.vfs_name(),
    )
    .unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    reader
}

/// `suspend()` syncs the deferred commits itself: its checkpoint does it
/// only when it copies frames, and a reader of another process keeps it
/// from copying any (the checkpoint then fails busy). A power cut right
/// after the suspension loses no acknowledged commit.
#[test]
fn suspend_makes_deferred_commits_durable_when_its_checkpoint_cannot_copy() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let mut cfg = config(&machine, true);
    // The checkpoint waits this long for the reader before it gives up.
    cfg.busy_timeout = Duration::from_millis(50);
    let ledger = Ledger::open(&path, cfg).unwrap();
    deferred_calls(&ledger, 0, 1);
    ledger.sync().unwrap();
    ledger.checkpoint().unwrap(); // TRUNCATE: the WAL is empty
    let reader = reader_on_an_empty_wal(&machine, &path);
    let acked = deferred_calls(&ledger, 1, 3);
    assert!(ledger.has_unsynced_commits());
    let syncs = machine.syncs();
    // The checkpoint is refused (busy); the commits must be durable anyway.
    let suspended = ledger.suspend();
    assert!(
        machine.syncs() > syncs,
        "suspend synced nothing (it returned {suspended:?})"
    );
    machine.cut_now();
    drop(reader);
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_eq!(
        lost_commits(&again, &acked),
        Vec::<String>::new(),
        "suspend returned {suspended:?}"
    );
}

/// Dropping the ledger syncs its deferred commits itself: closing the
/// connection checkpoints (and so syncs) only when it is the file's last,
/// and here another process's connection stays open. A power cut right
/// after the drop loses no acknowledged commit.
#[test]
fn dropping_the_ledger_makes_deferred_commits_durable_while_another_connection_is_open() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let other = Connection::open_with_flags_and_vfs(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE,
        machine.vfs_name(),
    )
    .unwrap();
    // Its first read opens the WAL: from then on it holds the database's
    // shared lock, and the ledger's connection is not the last.
    let _: i64 = other
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    let acked = deferred_calls(&ledger, 0, 2);
    assert!(ledger.has_unsynced_commits());
    drop(ledger);
    machine.cut_now();
    drop(other);
    machine.restart(Loss::All, &mut |_| 0);
    let again = Ledger::open(&path, config(&machine, true)).unwrap();
    assert_eq!(lost_commits(&again, &acked), Vec::<String>::new());
}

/// A stale attempt's result is kept as evidence, and made durable before
/// the refusal returns even for a tool whose own commit would have been
/// deferred: the evidence may be the only trace of the effect. Attempt 1
/// of a lookup tool is superseded (its outcome unknown, resolved "not
/// found, send again"), then reports its result; a power cut right after
/// the refusal keeps the evidence.
#[test]
fn a_stale_attempts_evidence_is_durable_when_its_refusal_returns() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let op = OperationId::new("op").unwrap();
    let call = ToolCall::custom("c1", "pay", r#"{"a":1}"#);
    let spec = CallSpec::new(call, 1).with_downstream(Downstream::lookup());
    let Begin::Execute(first) = ledger.begin(&op, 0, &spec).unwrap() else {
        panic!("not executed");
    };
    let stale = first.attempt_id();
    ledger.mark_outcome_unknown(&stale, "timed out").unwrap();
    let Resolved::Retry(second) = ledger
        .resolve_unknown(&stale, Resolution::NotFoundRetry)
        .unwrap()
    else {
        panic!("not retried");
    };
    assert_eq!(second.attempt, 2);
    let refused = ledger.commit(&stale, r#"{"paid":"late"}"#, Some("pay_1"));
    assert!(
        matches!(refused, Err(toolledger::ledger::Error::StaleAttempt { .. })),
        "{refused:?}"
    );
    assert!(
        !ledger.has_unsynced_commits(),
        "the evidence waits for a sync"
    );
    let again = cut_and_reopen(&machine, ledger, &path);
    let evidence = again.evidence(&first.execution_id).unwrap();
    assert!(
        evidence
            .iter()
            .any(|e| e.attempt == 1 && e.result_json.as_deref() == Some(r#"{"paid":"late"}"#)),
        "the stale attempt's result was lost: {evidence:?}"
    );
}

/// The deadline counts from the oldest commit that is still not durable,
/// not from the newest: the calls of one model response begun in one
/// transaction and committed one after another, each well within the
/// deadline of the one before, make no durable write between them, yet the
/// first is durable within its deadline (the thread syncs during the
/// stream). With a deadline that slid to every new commit, the first would
/// wait until the stream ended.
#[test]
fn the_deadline_counts_from_the_oldest_commit_not_yet_durable() {
    use std::time::Instant;
    const CALLS: usize = 10;
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&machine, true);
    let deadline = Duration::from_millis(300);
    cfg.deferred_commits.deadline = deadline;
    let ledger = Ledger::open(&dir.path().join("l.db"), cfg).unwrap();
    let op = OperationId::new("op").unwrap();
    let specs: Vec<CallSpec> = (0..CALLS)
        .map(|i| {
            let call = ToolCall::custom(format!("c{i}"), "pay", format!(r#"{{"n":{i}}}"#));
            CallSpec::new(call, 1).with_downstream(Downstream::lookup())
        })
        .collect();
    let tickets: Vec<_> = ledger
        .begin_round(&op, 0, &specs)
        .unwrap()
        .into_iter()
        .map(|b| match b {
            Begin::Execute(t) => t,
            other => panic!("not executed: {other:?}"),
        })
        .collect();
    let syncs = machine.syncs();
    let mut previous: Option<Instant> = None;
    let mut longest_gap = Duration::ZERO;
    for t in &tickets {
        ledger.commit(&t.attempt_id(), "{}", None).unwrap();
        if let Some(p) = previous {
            longest_gap = longest_gap.max(p.elapsed());
        }
        previous = Some(Instant::now());
        std::thread::sleep(deadline / 3);
    }
    let during = machine.syncs() - syncs;
    // A stall longer than the deadline between two commits lets even a
    // sliding deadline fall due: the case is then not this test's.
    if longest_gap < deadline {
        assert!(
            during >= 1,
            "{CALLS} commits {:?} apart over {:?}: the first waited past its deadline of {deadline:?}",
            deadline / 3,
            deadline / 3 * (CALLS as u32 - 1)
        );
    } else {
        eprintln!("skipped: a gap of {longest_gap:?} between two commits");
    }
}

/// A neither-tool's commit through the Ledger API is durable when `commit`
/// returns also when the attempt was not handed out by `begin` (here by
/// `mark_executing` after an approval), so the ledger does not know what
/// the tool declared: a power cut right after the commit keeps it.
#[test]
fn a_commit_of_an_attempt_begin_did_not_hand_out_is_durable_at_once() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let op = OperationId::new("op").unwrap();
    let call = ToolCall::custom("c1", "send", r#"{"to":"a"}"#);
    let spec = CallSpec::new(call, 1).with_approval();
    let Begin::NeedsApproval(asked) = ledger.begin(&op, 0, &spec).unwrap() else {
        panic!("no approval asked");
    };
    ledger
        .approve(&asked.execution_id, &asked.args_digest, None)
        .unwrap();
    let ticket = ledger.mark_executing(&asked.execution_id).unwrap();
    let result = r#"{"sent":true}"#;
    ledger.commit(&ticket.attempt_id(), result, None).unwrap();
    assert!(!ledger.has_unsynced_commits(), "the commit was deferred");
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_eq!(
        lost_commits(&again, &[(ticket.execution_id.clone(), result.to_owned())]),
        Vec::<String>::new()
    );
}

/// A tool whose downstream can be looked up (its commit is deferred); the
/// test reports for it by hand.
struct Looked;

#[async_trait::async_trait]
impl toolledger::executor::ToolHandler for Looked {
    fn descriptor(&self) -> toolledger::executor::ToolDescriptor {
        toolledger::executor::ToolDescriptor {
            lookup: true,
            ..toolledger::executor::ToolDescriptor::side_effect("pay", 1)
        }
    }
    async fn perform(
        &self,
        _request: toolledger::executor::ToolRequest,
    ) -> Result<toolledger::executor::PerformOutcome, toolledger::executor::ToolError> {
        Err(toolledger::executor::ToolError::new("reported by the test"))
    }
}

/// A caller-driven round of eight calls (`Executor::start_round`): its begin
/// is one sync for the eight, made before any attempt is handed out; the
/// reports commit without a sync of their own (deferred: a lookup tool);
/// and a power cut right after them loses no intent (each of the eight is
/// there, running or committed, for recovery to reconcile).
#[test]
fn a_caller_driven_round_of_eight_is_one_sync_and_a_cut_after_it_keeps_every_intent() {
    use toolledger::executor::{CallerStep, Executor, ExecutorConfig, PerformOutcome};
    use toolledger::model::ExecutionStatus;
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = std::sync::Arc::new(Ledger::open(&path, config(&machine, true)).unwrap());
    let exec = Executor::new(ledger.clone(), ExecutorConfig::default());
    exec.register(std::sync::Arc::new(Looked)).unwrap();
    let op = OperationId::new("op").unwrap();
    let calls: Vec<ToolCall> = (0..8)
        .map(|i| ToolCall::custom(format!("c{i}"), "pay", format!(r#"{{"n":{i}}}"#)))
        .collect();
    let syncs = machine.syncs();
    let steps = exec.start_round(&op, 0, calls).unwrap();
    assert_eq!(
        machine.syncs() - syncs,
        1,
        "one sync for the round's eight intents"
    );
    let attempts: Vec<_> = steps
        .into_iter()
        .map(|s| match s {
            CallerStep::Perform(a) => a,
            other => panic!("expected Perform, got {other:?}"),
        })
        .collect();
    let syncs = machine.syncs();
    for a in &attempts[..4] {
        let done = exec
            .report(
                a,
                Ok(PerformOutcome::Committed {
                    result_json: r#"{"paid":true}"#.into(),
                    external_id: None,
                }),
            )
            .unwrap();
        assert!(matches!(done, CallerStep::Done(_)), "{done:?}");
    }
    assert_eq!(machine.syncs(), syncs, "the deferred commits add no sync");
    machine.cut_now();
    ledger.abandon();
    drop(exec);
    drop(ledger);
    machine.restart(Loss::All, &mut |_| 0);
    let again = Ledger::open(&path, config(&machine, true)).unwrap();
    for a in &attempts {
        let rec = again.get(&a.request.execution_id).unwrap().unwrap();
        assert!(
            matches!(
                rec.status,
                ExecutionStatus::Executing | ExecutionStatus::Committed
            ),
            "{}: {}",
            a.request.execution_id,
            rec.status
        );
        assert_eq!(rec.downstream_key, a.request.downstream_key);
    }
}

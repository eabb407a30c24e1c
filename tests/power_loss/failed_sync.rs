//! A failed fsync of the WAL (EIO, ENOSPC from the sync). On Linux a
//! failed fsync drops the dirty pages it could not write (they stay in the
//! page cache, marked clean, and never reach the disk) and reports the
//! error once: the next fsync succeeds and proves nothing about the writes
//! before the failed one. The simulated disk models exactly that
//! (`Machine::fail_syncs_of`).
//!
//! In the WAL, the frames the failed sync dropped become a hole: every
//! frame after it, however well synced, is past the end of the log that
//! SQLite's recovery keeps (it stops at the first frame whose checksum
//! fails). So after a failed sync, no later sync may be taken as making
//! anything durable until the dropped frames were written again.
//!
//! Each test fails one sync at one place the ledger syncs, then runs a call
//! of a tool with neither key nor lookup (whose commit is durable when
//! `commit` returns), cuts the power and checks that the acknowledged call
//! survived: otherwise the app runs it again and the effect happens twice.

use std::time::{Duration, Instant};

use toolledger::ledger::{Begin, CallSpec, Downstream, Ledger, LedgerConfig};
use toolledger::model::{ExecutionId, ExecutionIdParts, OperationId, ToolCall};
use toolledger_test_support::power_vfs::Machine;

use super::{config, cut_and_reopen, deferred_calls};

pub(super) const WAL: &str = "l.db-wal";

/// A neither-tool call, begun and committed: `Some` when the ledger
/// acknowledged it (the effect happened, the commit is durable by the
/// ledger's word), `None` when the ledger refused it (nothing sent).
pub(super) fn neither_call(ledger: &Ledger, name: &str) -> Option<(ExecutionId, String)> {
    let op = OperationId::new("op").unwrap();
    let call = ToolCall::custom(name, "send_email", r#"{"to":"a@b.c"}"#);
    let spec = CallSpec::new(call, 1).with_downstream(Downstream::default());
    let ticket = match ledger.begin(&op, 7, &spec) {
        Ok(Begin::Execute(t)) => t,
        Ok(other) => panic!("{name}: not executed: {other:?}"),
        Err(_) => return None,
    };
    // The email is sent here, on the strength of the durable intent.
    let result = format!(r#"{{"sent":"{name}"}}"#);
    ledger.commit(&ticket.attempt_id(), &result, None).ok()?;
    Some((ticket.execution_id, result))
}

/// After the cut: the acknowledged neither-call is there, committed with
/// its result. A missing one is asked for again and sent a second time.
fn assert_survived(again: &Ledger, acked: &(ExecutionId, String), place: &str) {
    let rec = again.get(&acked.0).unwrap();
    let rec = rec.unwrap_or_else(|| {
        panic!(
            "{place}: the acknowledged neither-call {} is gone after the cut (its intent \
             and durable commit were synced after a failed sync, behind the hole it left \
             in the WAL): asked again, the email is sent twice",
            acked.0
        )
    });
    assert!(
        rec.status.is_committed() && rec.result_json.as_deref() == Some(acked.1.as_str()),
        "{place}: acknowledged durable, found {} {:?}",
        rec.status,
        rec.result_json
    );
}

/// The intent's own sync (`Durability::Synced`, `begin`) fails: `begin`
/// reports an error and nothing is sent for that call. The next call's
/// intent sync succeeds, so the ledger takes every frame before it as
/// durable; the next call is sent and committed durably; a power cut then
/// loses it.
#[test]
fn a_failed_intent_sync_is_not_made_good_by_the_next_calls_sync() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let first = neither_call(&ledger, "c_first").expect("a healthy disk");

    machine.fail_syncs_of(WAL, 1);
    assert!(
        neither_call(&ledger, "c_failed").is_none(),
        "begin must fail when its intent's sync failed"
    );
    assert_eq!(
        machine.failing_syncs_left(),
        0,
        "the intent's sync was the one that failed"
    );

    // The disk works again: the ledger wrote its log again and takes calls.
    let acked = neither_call(&ledger, "c_next").expect("a healthy disk again");
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_survived(&again, &first, "intent");
    assert_survived(&again, &acked, "intent");
}

/// `Ledger::sync()` fails (the app's explicit request before losing power);
/// a second `sync()` succeeds and the ledger reports nothing unsynced: the
/// deferred commit it covered is lost to the cut all the same, and so is
/// every later durable call.
#[test]
fn a_failed_explicit_sync_is_not_made_good_by_the_next_one() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let deferred = deferred_calls(&ledger, 0, 2);
    assert!(ledger.has_unsynced_commits());
    machine.fail_syncs_of(WAL, 1);
    assert!(ledger.sync().is_err(), "the sync failed");
    let retried = ledger.sync();
    let unsynced = ledger.has_unsynced_commits();
    let acked = neither_call(&ledger, "c_next");
    assert!(
        retried.is_ok() && !unsynced,
        "the second sync() repairs: {retried:?}, unsynced {unsynced}"
    );
    let acked = acked.expect("a healthy disk again");
    let again = cut_and_reopen(&machine, ledger, &path);
    {
        // The ledger said every commit is durable now.
        for (id, result) in &deferred {
            let rec = again.get(id).unwrap();
            assert!(
                rec.as_ref().is_some_and(|r| r.status.is_committed()
                    && r.result_json.as_deref() == Some(result.as_str())),
                "sync() succeeded after a failed one and has_unsynced_commits() said false, \
                 but the deferred commit of {id} is lost to the cut: {:?}",
                rec.map(|r| r.status)
            );
        }
    }
    assert_survived(&again, &acked, "sync()");
}

/// The background thread's deadline sync fails; it retries one deadline
/// later, that sync succeeds and the ledger reports nothing unsynced. A
/// neither-call made afterwards is acknowledged durable and lost to a cut.
#[test]
fn a_failed_deadline_sync_is_not_made_good_by_its_retry() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let mut cfg: LedgerConfig = config(&machine, true);
    cfg.deferred_commits.deadline = Duration::from_millis(30);
    let ledger = Ledger::open(&path, cfg).unwrap();
    let deferred = deferred_calls(&ledger, 0, 1);
    // The deadline's sync, 30 ms after the commit, is the next one.
    machine.fail_syncs_of(WAL, 1);
    let started = Instant::now();
    while machine.failing_syncs_left() > 0 || ledger.has_unsynced_commits() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the deadline thread neither failed nor retried within 10 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let acked = neither_call(&ledger, "c_next").expect("a healthy disk again");
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_eq!(super::lost_commits(&again, &deferred), Vec::<String>::new());
    assert_survived(&again, &acked, "the deadline thread");
}

/// `suspend()`'s sync of the deferred commits fails; `suspend()` reports
/// it. Its checkpoint then copies the WAL into the database file and syncs
/// that: what the failed sync dropped is written again.
#[test]
fn a_failed_sync_in_suspend_is_made_good_by_its_checkpoint() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let deferred = deferred_calls(&ledger, 0, 2);
    machine.fail_syncs_of(WAL, 1);
    let suspended = ledger.suspend();
    assert!(suspended.is_err(), "suspend() reports the failed sync");
    ledger.resume().unwrap();
    let acked = neither_call(&ledger, "c_next").expect("a healthy disk again");
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_eq!(super::lost_commits(&again, &deferred), Vec::<String>::new());
    assert_survived(&again, &acked, "suspend()");
}

/// The idle checkpoint's sync of the deferred commits fails: the thread
/// skips the checkpoint. A neither-call made afterwards is acknowledged
/// durable and must survive a cut.
#[test]
fn a_failed_sync_before_the_idle_checkpoint_is_not_made_good_later() {
    use toolledger::ledger::IdleCheckpoint;
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let mut cfg: LedgerConfig = config(&machine, true);
    cfg.idle_checkpoint = IdleCheckpoint {
        after: Duration::from_millis(30),
        writes: 4,
    };
    let ledger = Ledger::open(&path, cfg).unwrap();
    let deferred = deferred_calls(&ledger, 0, 3);
    // The idle thread's sync, 30 ms after the last write, is the next one.
    machine.fail_syncs_of(WAL, 1);
    let started = Instant::now();
    while machine.failing_syncs_left() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no idle checkpoint within 10 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let acked = neither_call(&ledger, "c_next").expect("a healthy disk again");
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_eq!(super::lost_commits(&again, &deferred), Vec::<String>::new());
    assert_survived(&again, &acked, "the idle checkpoint");
}

/// SQLite's own sync fails in a neither-tool's durable commit
/// (`synchronous=FULL`): the commit is refused and rolled back, and the next
/// transaction overwrites the frames it had written: no hole, the next
/// acknowledged call survives a cut.
#[test]
fn a_failed_durable_commit_is_rolled_back_and_leaves_no_hole() {
    failed_durable_commit(false, "a durable commit");
}

/// The same failed durable commit, but a deferred commit was written
/// before it under `synchronous=NORMAL`: SQLite's failed sync dropped that
/// commit's frames too, SQLite rolls back only its own transaction, and the
/// deferred commit stays committed in the WAL the OS shows, in front of a
/// hole on the disk.
#[test]
fn a_failed_durable_commit_after_a_deferred_one_is_not_made_good_later() {
    failed_durable_commit(true, "a durable commit after a deferred one");
}

/// A neither-tool's durable commit whose sync fails (after a deferred
/// commit when `deferred_first`); then a neither-call and a cut: nothing
/// acknowledged is lost.
fn failed_durable_commit(deferred_first: bool, place: &str) {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let op = OperationId::new("op").unwrap();
    let spec = CallSpec::new(ToolCall::custom("c_m", "send_email", "{}"), 1);
    let Ok(Begin::Execute(m)) = ledger.begin(&op, 7, &spec) else {
        panic!("not executed");
    };
    let deferred = if deferred_first {
        let deferred = deferred_calls(&ledger, 0, 1);
        assert!(ledger.has_unsynced_commits());
        deferred
    } else {
        Vec::new()
    };
    machine.fail_syncs_of(WAL, 1);
    assert!(ledger.commit(&m.attempt_id(), "{}", None).is_err());
    assert_eq!(machine.failing_syncs_left(), 0);
    let acked = neither_call(&ledger, "c_next").expect("a healthy disk again");
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_eq!(super::lost_commits(&again, &deferred), Vec::<String>::new());
    assert_survived(&again, &acked, place);
}

/// A disk that keeps failing: while the ledger cannot write its log again,
/// every write is refused with the typed I/O error and nothing is sent on
/// the strength of an intent; once the disk works, calls go on, and nothing
/// acknowledged before the failures is lost to a cut.
#[test]
fn a_disk_that_keeps_failing_refuses_every_call_with_the_io_error() {
    use toolledger::ledger::{Error, StorageError};
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let first = neither_call(&ledger, "c_first").expect("a healthy disk");
    let deferred = deferred_calls(&ledger, 0, 2);
    // The intent's sync and the next two repairs' syncs fail.
    machine.fail_syncs_of(WAL, 3);
    let op = OperationId::new("op").unwrap();
    for i in 0..3 {
        let call = ToolCall::custom(format!("c_refused_{i}"), "send_email", "{}");
        let err = ledger
            .begin(&op, 7, &CallSpec::new(call, 1))
            .expect_err("no intent is taken as durable on a failing disk");
        // The first one's intent committed and its sync failed; the next
        // ones were refused before writing (the log could not be written
        // again).
        let io = match &err {
            Error::Store(StorageError::NotDurable(inner)) if i == 0 => &**inner,
            Error::Store(e) => e,
            other => panic!("call {i}: a storage error, got {other:?}"),
        };
        assert!(
            matches!(io, StorageError::Io(_)),
            "call {i}: the typed I/O error, got {err:?}"
        );
        assert!(err.to_string().contains("I/O error"), "{err}");
        assert!(
            ledger.has_unsynced_commits(),
            "nothing is durable by the ledger's word"
        );
    }
    assert_eq!(machine.failing_syncs_left(), 0);
    // The ledger refused two calls before writing anything (the repair
    // failed first): they are not in it.
    for i in 1..3 {
        let call_id = format!("c_refused_{i}");
        let id = ExecutionId::derive(&ExecutionIdParts {
            operation: &op,
            round: 7,
            call_id: &call_id,
            tool_name: "send_email",
            tool_version: 1,
        })
        .unwrap();
        assert!(
            ledger.get(&id).unwrap().is_none(),
            "c_refused_{i} was not written"
        );
    }
    let acked = neither_call(&ledger, "c_after").expect("the disk works again");
    assert!(!ledger.has_unsynced_commits());
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_survived(&again, &first, "before the failures");
    assert_eq!(super::lost_commits(&again, &deferred), Vec::<String>::new());
    assert_survived(&again, &acked, "after the failures");
}

/// The call whose intent sync failed is not left in flight: asked again
/// once the disk works, it is not run as if new (its intent may be on the
/// disk) and not refused as running in this live session for ever.
#[test]
fn the_call_whose_intent_sync_failed_is_answered_when_asked_again() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Ledger::open(&path, config(&machine, true)).unwrap();
    let op = OperationId::new("op").unwrap();
    let spec = CallSpec::new(ToolCall::custom("c_failed", "send_email", "{}"), 1)
        .with_downstream(Downstream::keyed(Duration::MAX));
    machine.fail_syncs_of(WAL, 1);
    assert!(ledger.begin(&op, 7, &spec).is_err());
    let again = ledger.begin(&op, 7, &spec).unwrap();
    // Nobody was handed the first attempt, so no request went out for it:
    // it is recorded as not sent and the call runs now, as attempt 2.
    let Begin::Execute(ticket) = again else {
        panic!("asked again after the failed sync: {again:?}");
    };
    assert_eq!(ticket.attempt, 2);
    let rec = ledger.get(&ticket.execution_id).unwrap().unwrap();
    assert_eq!(rec.attempt_count, 2);
    ledger
        .commit(&ticket.attempt_id(), r#"{"sent":1}"#, None)
        .unwrap();
    // The key tool's commit is deferred; the app's explicit sync makes it
    // durable (the disk works again).
    ledger.sync().unwrap();
    let again = cut_and_reopen(&machine, ledger, &path);
    let rec = again.get(&ticket.execution_id).unwrap().unwrap();
    assert!(rec.status.is_committed(), "{}", rec.status);
}

/// The same with the executor: a call whose `begin` failed on the intent's
/// sync gets the storage error; asked again, it runs once (one effect),
/// not `InFlight`.
#[test]
fn the_executor_runs_a_call_once_after_its_intent_sync_failed() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use toolledger::executor::{
        CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError,
        ToolHandler, ToolRequest,
    };
    struct Send(Arc<AtomicU32>);
    #[async_trait::async_trait]
    impl ToolHandler for Send {
        fn descriptor(&self) -> ToolDescriptor {
            ToolDescriptor::side_effect("send_email", 1)
        }
        async fn perform(&self, _: ToolRequest) -> Result<PerformOutcome, ToolError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(PerformOutcome::Committed {
                result_json: r#"{"sent":true}"#.into(),
                external_id: None,
            })
        }
    }
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ledger = Arc::new(Ledger::open(&path, config(&machine, true)).unwrap());
    let effects = Arc::new(AtomicU32::new(0));
    let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
    executor.register(Arc::new(Send(effects.clone()))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let op = OperationId::new("op").unwrap();
    let call = ToolCall::custom("c1", "send_email", "{}");
    machine.fail_syncs_of(WAL, 1);
    let first = rt.block_on(executor.execute(&op, 0, call.clone()));
    assert!(first.is_err(), "the intent's sync failed: {first:?}");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        0,
        "nothing sent without a durable intent"
    );
    let second = rt.block_on(executor.execute(&op, 0, call.clone())).unwrap();
    assert!(
        matches!(
            second,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        ),
        "{second:?}"
    );
    let third = rt.block_on(executor.execute(&op, 0, call)).unwrap();
    assert!(
        matches!(third, CallOutcome::Completed { replayed: true, .. }),
        "{third:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

//! Crash recovery: a process killed at any point is recovered by the next launch, exactly once.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Weak};

use downstream::{process, Behaviour, CrashPoint, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{CallOutcome, ToolDescriptor};
use toolledger::ledger::{Begin, Ledger, Resolution, Resolved};
use toolledger::model::{ExecutionStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

// ---------------------------------------------------------------------------
// Crashes while `executing`: recovery reports `outcome_unknown`, never runs
// the tool blindly, and a committed record survives anything.
//
// Boundaries exercised here (docs/design.md names): `before-request` /
// `in-flight` (dropped ledger and a child process that aborts while
// executing), `after-local-commit` (committed then crash: replay).
// ---------------------------------------------------------------------------
#[test]
fn dropping_the_ledger_while_executing_leaves_outcome_unknown() {
    // boundary: in-flight (the process "dies" with the request outstanding)
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let s = spec("call_1", "pay", r#"{"amount":5}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    drop(ledger);

    let ledger = open_with(&path, &clock);
    let pending = ledger.recover().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].execution_id, t.execution_id);
    assert_eq!(pending[0].status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(
        pending[0].last_reason.as_deref(),
        Some("owner session died while executing")
    );
    // A retry of the same call must reconcile, not execute.
    match ledger.begin(&op("op"), 0, &s).unwrap() {
        Begin::Reconcile(r) => {
            assert_eq!(r.downstream_key, t.downstream_key);
            assert_eq!(r.attempt, 1);
        }
        other => panic!("unexpected {other:?}"),
    }
    // Lookup found nothing: retry under the same key, attempt 2.
    let Resolved::Retry(t2) = ledger
        .resolve_unknown(&t.attempt_id(), Resolution::NotFoundRetry)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(t2.downstream_key, t.downstream_key);
    assert_eq!(t2.attempt, 2);
    // Attempt 1 is stale now: its late answer is kept as evidence, never
    // recorded as the execution's own.
    assert!(matches!(
        ledger.commit(&t.attempt_id(), r#"{"ok":"late"}"#, None),
        Err(toolledger::ledger::Error::StaleAttempt {
            attempt: 1,
            current_attempt: 2,
            ..
        })
    ));
    ledger
        .commit(&t2.attempt_id(), r#"{"ok":true}"#, None)
        .unwrap();
    let evidence = ledger.evidence(&t.execution_id).unwrap();
    assert_eq!(evidence.len(), 1);
    assert_eq!(evidence[0].attempt, 1);
    assert_eq!(evidence[0].result_json.as_deref(), Some(r#"{"ok":"late"}"#));
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn a_live_second_session_is_in_flight_not_dead() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let extension = open_with(&path, &clock);
    let s = spec("call_1", "pay", r#"{"amount":5}"#);
    assert!(matches!(
        app.begin(&op("op"), 0, &s).unwrap(),
        Begin::Execute(_)
    ));
    assert!(matches!(
        extension.begin(&op("op"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    // recover() in the extension does not steal the live app's row.
    let pending = extension.recover().unwrap();
    assert_eq!(pending[0].status, ExecutionStatus::Executing);
    // However long it takes, and whatever the wall clock does: a held
    // session lock means alive.
    clock.advance(3_600_000);
    clock.step_wall(61_000);
    assert!(matches!(
        extension.begin(&op("op"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    assert!(extension.recover().unwrap()[0].status == ExecutionStatus::Executing);
    // The app goes away: now its attempt is abandoned and reconciled.
    drop(app);
    assert!(matches!(
        extension.begin(&op("op"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
    let rec = extension.get(&pending[0].execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(
        rec.last_reason.as_deref(),
        Some("owner session died while executing")
    );
}

#[test]
fn committed_then_crash_replays_the_stored_result() {
    // boundary: after-local-commit
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let s = spec("call_1", "send_email", r#"{"to":"x@example.com"}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .commit(&t.attempt_id(), r#"{"id":"m1"}"#, Some("m1"))
        .unwrap();
    drop(ledger);
    let ledger = open_with(&path, &clock);
    let pending = ledger.recover().unwrap();
    assert_eq!(pending.len(), 1, "an undelivered result needs attention");
    assert_eq!(pending[0].status, ExecutionStatus::Committed);
    match ledger.begin(&op("op"), 0, &s).unwrap() {
        Begin::Replay(r) => assert_eq!(r.result_json, r#"{"id":"m1"}"#),
        other => panic!("unexpected {other:?}"),
    }
    // Nothing downgrades it: not a failure, not unknown, not a cancellation.
    assert!(ledger
        .fail_before_commit(&t.attempt_id(), "late", true)
        .is_err());
    assert!(ledger
        .mark_outcome_unknown(&t.attempt_id(), "late")
        .is_err());
    assert!(ledger
        .resolve_unknown(&t.attempt_id(), Resolution::NotFoundRetry)
        .is_err());
    assert_eq!(
        ledger.cancel(&t.execution_id).unwrap(),
        toolledger::ledger::CancelOutcome::AlreadyCommitted
    );
    assert!(ledger
        .commit(&t.attempt_id(), r#"{"id":"other"}"#, None)
        .is_err());
    let rec = ledger.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"id":"m1"}"#));
}

/// Runs inside a child process (see the next test): begins a call and dies
/// without unwinding, as a killed app would.
#[test]
fn child_process_begins_and_aborts() {
    let Ok(db) = std::env::var("TOOLLEDGER_CHILD_DB") else {
        return;
    };
    let (ledger, _clock) = open_at(std::path::Path::new(&db));
    let Begin::Execute(t) = ledger
        .begin(&op("op"), 0, &spec("call_1", "pay", r#"{"amount":7}"#))
        .unwrap()
    else {
        std::process::exit(3)
    };
    ledger
        .record_external_id(&t.attempt_id(), "pay_123")
        .unwrap();
    std::process::abort();
}

#[test]
fn a_child_process_that_dies_while_executing_is_recovered_as_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let status = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_recovery::child_process_begins_and_aborts",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_CHILD_DB", &db)
        .status()
        .unwrap();
    assert!(!status.success(), "the child must die abruptly");
    let (ledger, _clock) = open_at(&db);
    let pending = ledger.recover().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].status, ExecutionStatus::OutcomeUnknown);
    // The external id written before the crash survived: reconciliation can use it.
    assert_eq!(pending[0].external_id.as_deref(), Some("pay_123"));
    // Resolve as found: committed, one effect, never re-run.
    let Resolved::Committed(r) = ledger
        .resolve_unknown(
            &current(&ledger, &pending[0].execution_id),
            Resolution::Found {
                result_json: r#"{"paid":7}"#.into(),
                external_id: Some("pay_123".into()),
            },
        )
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(r.external_id.as_deref(), Some("pay_123"));
    assert!(matches!(
        ledger
            .begin(&op("op"), 0, &spec("call_1", "pay", r#"{"amount":7}"#))
            .unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn unknown_outcome_resolved_absent_is_failed_and_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("c", "wire", r#"{"amount":1}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .mark_outcome_unknown(&t.attempt_id(), "timeout")
        .unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
    assert_eq!(
        ledger
            .resolve_unknown(
                &t.attempt_id(),
                Resolution::NotFoundAbandon {
                    reason: "user chose".into()
                }
            )
            .unwrap(),
        Resolved::Failed
    );
    match ledger.begin(&op("op"), 0, &s).unwrap() {
        Begin::Failed { reason, .. } => assert_eq!(reason, "user chose"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn retryable_failure_runs_again_under_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("c", "email", r#"{"n":1}"#);
    let Begin::Execute(t1) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .fail_before_commit(&t1.attempt_id(), "http 503", true)
        .unwrap();
    let Begin::Execute(t2) = ledger.begin(&op("op"), 0, &s).unwrap() else {
        panic!()
    };
    assert_eq!(t2.downstream_key, t1.downstream_key);
    assert_eq!(t2.attempt, 2);
    ledger
        .fail_before_commit(&t2.attempt_id(), "http 400", false)
        .unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &s).unwrap(),
        Begin::Failed { .. }
    ));
    let log = ledger.get(&t1.execution_id).unwrap().unwrap();
    assert_eq!(log.attempt_count, 2);
}

#[test]
fn resume_without_suspend_returns_and_suspend_twice_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let (tx, rx) = std::sync::mpsc::channel();
    let ledger = std::sync::Arc::new(ledger);
    let l2 = ledger.clone();
    std::thread::spawn(move || {
        let _ = tx.send(l2.resume().map(|pending| pending.len()));
    });
    let answer = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("resume() must not block");
    assert_eq!(answer.unwrap(), 0);
    ledger.suspend().unwrap();
    ledger.suspend().unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("c", "t", "{}")),
        Err(toolledger::ledger::Error::Store(
            toolledger::ledger::StorageError::Suspended
        ))
    ));
    ledger.resume().unwrap();
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("c", "t", "{}")).unwrap(),
        Begin::Execute(_)
    ));
}

// ---------------------------------------------------------------------------
// The executor's recovery at docs/design.md's crash boundaries, against a real
// (loopback) downstream: each test kills the first "process" (its runtime,
// executor and ledger) at the named boundary, restarts on the same file and
// calls `Executor::recover()`, then counts the effects at the service.
// (`after-remote-commit` with a key-deduping service is in
// `executor_idempotency_keys.rs`; batches in `executor_batch.rs`.)
// ---------------------------------------------------------------------------

fn desc(key: bool, lookup: bool) -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: key,
        lookup,
        // The loopback service applies a request before it answers, and a
        // dead process's request has been answered (or never sent) by the
        // time the next one starts: nothing lands late.
        landing_window: std::time::Duration::ZERO,
        ..ToolDescriptor::side_effect("create_event", 1)
    }
}

fn call() -> ToolCall {
    ToolCall::custom("call_1", "create_event", r#"{"title":"standup"}"#)
}

/// Process 1: runs the call until the tool hangs at `point`, then dies.
fn crash_at(path: &Path, service: &Downstream, desc: ToolDescriptor, point: CrashPoint) {
    let dead: Weak<Ledger> = process(async {
        let exec = executor_at(path);
        let tool = HttpTool::new(desc, Kind::Effect, service);
        let mut crash = tool.crash_at(None, point);
        exec.register(Arc::new(tool)).unwrap();
        let run = exec.clone();
        tokio::spawn(async move { run.execute(&op("op_crash"), 0, call()).await });
        crash.reached().await;
        Arc::downgrade(exec.ledger())
    });
    assert!(
        dead.upgrade().is_none(),
        "the first process's ledger is gone"
    );
}

/// Process 2: restarts with `desc` and recovers; returns the one outcome,
/// the stored status and the `outcome_unknown` count of its metrics (a dead
/// process's attempt is counted where it is discovered).
fn restart_and_recover(
    path: &Path,
    service: &Downstream,
    desc: ToolDescriptor,
) -> (CallOutcome, ExecutionStatus, u64) {
    process(async {
        let exec = executor_at(path);
        exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, service)))
            .unwrap();
        let mut recovered = exec.recover().await.unwrap().outcomes;
        assert_eq!(recovered.len(), 1);
        let out = recovered.remove(0);
        let status = exec
            .ledger()
            .get(out.execution_id())
            .unwrap()
            .unwrap()
            .status;
        (out, status, exec.metrics().outcome_unknown)
    })
}

#[test]
fn before_request_with_key_support_sends_the_request_once_after_restart() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    crash_at(&path, &service, desc(true, false), CrashPoint::BeforeSend);
    assert!(service.requests().is_empty());

    let (out, status, unknowns) = restart_and_recover(&path, &service, desc(true, false));
    assert_eq!(unknowns, 1, "the dead process left it executing");
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
    assert_eq!(status, ExecutionStatus::Committed);
    assert_eq!(service.posts().len(), 1);
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn before_request_without_key_or_lookup_is_surfaced_as_unknown_and_not_sent() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    crash_at(&path, &service, desc(false, false), CrashPoint::BeforeSend);

    // The executor cannot know the request never left: it must not guess.
    let (out, status, unknowns) = restart_and_recover(&path, &service, desc(false, false));
    assert_eq!(unknowns, 1, "the dead process left it executing");
    assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
    assert_eq!(status, ExecutionStatus::OutcomeUnknown);
    assert!(service.requests().is_empty());
}

#[test]
fn before_request_with_lookup_finds_nothing_and_sends_once() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    crash_at(&path, &service, desc(false, true), CrashPoint::BeforeSend);

    let (out, status, unknowns) = restart_and_recover(&path, &service, desc(false, true));
    assert_eq!(unknowns, 1, "the dead process left it executing");
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
    assert_eq!(status, ExecutionStatus::Committed);
    assert_eq!(service.lookups().len(), 1);
    assert_eq!(service.posts().len(), 1);
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn after_remote_commit_with_lookup_commits_the_found_effect_without_resending() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    crash_at(
        &path,
        &service,
        desc(false, true),
        CrashPoint::AfterResponse,
    );
    assert_eq!(service.effects().len(), 1);

    let (out, status, unknowns) = restart_and_recover(&path, &service, desc(false, true));
    assert_eq!(unknowns, 1, "the dead process left it executing");
    let CallOutcome::Completed {
        external_id,
        replayed: false,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(external_id.as_deref(), Some("eff_1"));
    assert_eq!(status, ExecutionStatus::Committed);
    assert_eq!(service.posts().len(), 1);
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn after_local_commit_the_stored_result_is_replayed_and_nothing_is_sent() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    // Process 1 commits and dies before the model sees (or delivery marks) it.
    let committed = process(async {
        let exec = executor_at(&path);
        exec.register(Arc::new(HttpTool::new(
            desc(false, false),
            Kind::Effect,
            &service,
        )))
        .unwrap();
        exec.execute(&op("op_crash"), 0, call()).await.unwrap()
    });
    let (out, status, unknowns) = restart_and_recover(&path, &service, desc(false, false));
    assert_eq!(unknowns, 0, "it had committed: nothing was unknown");
    let CallOutcome::Completed {
        result_json,
        replayed: true,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(Some(result_json.as_str()), committed.result_json());
    assert_eq!(status, ExecutionStatus::Committed);
    assert_eq!(service.requests().len(), 1);
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn a_call_asked_again_after_a_crash_counts_the_dead_attempt_as_unknown() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    crash_at(&path, &service, desc(true, false), CrashPoint::BeforeSend);
    // The restarted app does not call recover(): the model's retry asks for
    // the same call, which finds the dead process's executing row.
    let (out, unknowns) = process(async {
        let exec = executor_at(&path);
        exec.register(Arc::new(HttpTool::new(
            desc(true, false),
            Kind::Effect,
            &service,
        )))
        .unwrap();
        let out = exec.execute(&op("op_crash"), 0, call()).await.unwrap();
        (out, exec.metrics().outcome_unknown)
    });
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
    assert_eq!(unknowns, 1, "the dead attempt is counted where it is found");
    assert_eq!(service.effects().len(), 1);
}

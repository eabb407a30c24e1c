//! The executor's recovery at docs/design.md's crash boundaries, against a real
//! (loopback) downstream: each test kills the first "process" (its runtime,
//! executor and ledger) at the named boundary, restarts on the same file and
//! calls `Executor::recover()`, then counts the effects at the service.
//! (`after-remote-commit` with a key-deduping service is in
//! `executor_idempotency_keys.rs`; batches in `executor_batch.rs`.)

use toolledger_test_support::downstream;

use std::path::Path;
use std::sync::{Arc, Weak};

use downstream::{fast_config, process, Behaviour, CrashPoint, Downstream, HttpTool, Kind};
use toolledger::executor::{CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{Ledger, LedgerConfig};
use toolledger::model::{ExecutionStatus, OperationId, ToolCall};

fn executor_at(path: &Path) -> Executor {
    let ledger = Ledger::open(path, LedgerConfig::default()).unwrap();
    Executor::new(Arc::new(ledger), fast_config())
}

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

fn op() -> OperationId {
    OperationId::new("op_crash").unwrap()
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
        tokio::spawn(async move { run.execute(&op(), 0, call()).await });
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
        exec.execute(&op(), 0, call()).await.unwrap()
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
        let out = exec.execute(&op(), 0, call()).await.unwrap();
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

//! Adversarial review: approvals racing cancellation and rejection, runs of
//! an approved call from two sessions, cancellation around running and
//! unknown calls, and compensation (twice, of a compensation, rejected).

use std::sync::{Arc, Barrier};
use std::time::Duration;

use downstream::{fast_config, process, Behaviour, Downstream, HttpTool, Kind, WAIT};
use support::*;
use toolledger::executor::{self, CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{self, Begin, Error, Ledger, LedgerConfig};
use toolledger::model::{ExecutionStatus, OperationId, OperationStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

/// The outcome of a spawned executor call, awaited for at most `WAIT`.
async fn joined(
    task: tokio::task::JoinHandle<Result<CallOutcome, executor::Error>>,
) -> CallOutcome {
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

/// How many of `outcomes` ran the tool (a `Completed` that is no replay).
fn fresh_runs(outcomes: &[&CallOutcome]) -> usize {
    outcomes
        .iter()
        .filter(|r| {
            matches!(
                r,
                CallOutcome::Completed {
                    replayed: false,
                    ..
                }
            )
        })
        .count()
}

fn pay_desc(approval: bool) -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        requires_approval: approval,
        lookup: true,
        ..ToolDescriptor::side_effect("pay", 1)
    }
}

fn refund_desc(approval: bool) -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        requires_approval: approval,
        ..ToolDescriptor::side_effect("refund", 1)
    }
}

fn two_execs(path: &std::path::Path, service: &Downstream, approval: bool) -> (Executor, Executor) {
    let a = executor_at(path);
    let b = executor_at(path);
    for e in [&a, &b] {
        e.register(Arc::new(HttpTool::new(
            pay_desc(approval),
            Kind::Effect,
            service,
        )))
        .unwrap();
        e.register(Arc::new(HttpTool::new(
            refund_desc(false),
            Kind::Effect,
            service,
        )))
        .unwrap();
    }
    (a, b)
}

fn status(l: &Ledger, id: &toolledger::model::ExecutionId) -> ExecutionStatus {
    l.get(id).unwrap().unwrap().status
}

fn keyed() -> Behaviour {
    Behaviour {
        idempotency: true,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------
// approve vs cancel_operation vs reject, two sessions, threads.
// ---------------------------------------------------------------------------
#[test]
fn approve_racing_cancel_operation_and_reject_from_two_sessions_is_serialised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (a, clock) = open_at(&path);
    let b = Arc::new(open_with(&path, &clock));
    let a = Arc::new(a);
    for i in 0..12 {
        let o = op(&format!("op_{i}"));
        let s = spec("c1", "pay", r#"{"amount":1}"#).with_approval();
        let Begin::NeedsApproval(req) = a.begin(&o, 0, &s).unwrap() else {
            panic!()
        };
        let gate = Arc::new(Barrier::new(2));
        let (id, dg) = (req.execution_id.clone(), req.args_digest.clone());
        let (a2, g2) = (a.clone(), gate.clone());
        let approver = std::thread::spawn(move || {
            g2.wait();
            a2.approve(&id, &dg, None)
        });
        let (b2, o2, id2, dg2) = (
            b.clone(),
            o.clone(),
            req.execution_id.clone(),
            req.args_digest.clone(),
        );
        let other = std::thread::spawn(move || {
            gate.wait();
            if i % 2 == 0 {
                b2.cancel_operation(&o2).map(Some)
            } else {
                b2.reject(&id2, &dg2, "no").map(|_| None)
            }
        });
        let approved = approver.join().unwrap();
        let other = other.join().unwrap();
        let st = status(&a, &req.execution_id);
        if i % 2 == 0 {
            // cancel always wins in the end (approved is cancellable).
            assert_eq!(other.unwrap(), Some(OperationStatus::Cancelled));
            assert_eq!(st, ExecutionStatus::CancelledBeforeCommit);
            match approved {
                Ok(()) => {}
                Err(Error::InvalidTransition {
                    from: ExecutionStatus::CancelledBeforeCommit,
                    ..
                }) => {}
                e => panic!("{e:?}"),
            }
            assert!(matches!(
                a.begin(&o, 0, &s).unwrap(),
                Begin::Cancelled { .. }
            ));
            assert!(matches!(
                a.mark_executing(&req.execution_id),
                Err(Error::OperationCancelled(_)) | Err(Error::InvalidTransition { .. })
            ));
        } else {
            match (&approved, &other) {
                (
                    Ok(()),
                    Err(Error::InvalidTransition {
                        from: ExecutionStatus::Approved,
                        ..
                    }),
                ) => {
                    assert_eq!(st, ExecutionStatus::Approved)
                }
                (
                    Err(Error::InvalidTransition {
                        from: ExecutionStatus::Rejected,
                        ..
                    }),
                    Ok(None),
                ) => {
                    assert_eq!(st, ExecutionStatus::Rejected);
                    assert!(matches!(
                        a.begin(&o, 0, &s).unwrap(),
                        Begin::Rejected { .. }
                    ));
                }
                x => panic!("{x:?}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Executor::approve from two sessions at once: one perform.
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approve_twice_from_two_sessions_performs_once() {
    let service = Downstream::start(Behaviour {
        latency: Duration::from_millis(50),
        ..keyed()
    });
    let dir = tempfile::tempdir().unwrap();
    let (ea, eb) = two_execs(&dir.path().join("l.db"), &service, true);
    let o = OperationId::new("op").unwrap();
    let call = ToolCall::custom("c1", "pay", r#"{"amount":5}"#);
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        ..
    } = ea.execute(&o, 0, call.clone()).await.unwrap()
    else {
        panic!()
    };
    let (id1, d1, ea2) = (execution_id.clone(), args_digest.clone(), ea.clone());
    let (id2, d2, eb2) = (execution_id.clone(), args_digest.clone(), eb.clone());
    let t1 = tokio::spawn(async move { ea2.approve(&id1, &d1, None).await });
    let t2 = tokio::spawn(async move { eb2.approve(&id2, &d2, None).await });
    let r1 = joined(t1).await;
    let r2 = joined(t2).await;
    let fresh = fresh_runs(&[&r1, &r2]);
    assert_eq!(fresh, 1, "{r1:?} {r2:?}");
    for r in [&r1, &r2] {
        assert!(
            matches!(
                r,
                CallOutcome::Completed { .. } | CallOutcome::InFlight { .. }
            ),
            "{r:?}"
        );
    }
    // A third tap, after the commit: a replay.
    let r3 = eb.approve(&execution_id, &args_digest, None).await.unwrap();
    assert!(
        matches!(r3, CallOutcome::Completed { replayed: true, .. }),
        "{r3:?}"
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
    assert_eq!(
        status(ea.ledger(), &execution_id),
        ExecutionStatus::Committed
    );
}

// ---------------------------------------------------------------------------
// The approval names the original digest after a Conflict with other args.
// ---------------------------------------------------------------------------
#[tokio::test]
async fn approval_after_changed_arguments_runs_only_the_approved_arguments() {
    let service = Downstream::start(keyed());
    let dir = tempfile::tempdir().unwrap();
    let (ea, eb) = two_execs(&dir.path().join("l.db"), &service, true);
    let o = OperationId::new("op").unwrap();
    let orig = ToolCall::custom("c1", "pay", r#"{"amount":5}"#);
    let changed = ToolCall::custom("c1", "pay", r#"{"amount":5000}"#);
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        ..
    } = ea.execute(&o, 0, orig.clone()).await.unwrap()
    else {
        panic!()
    };
    let CallOutcome::Conflict {
        stored_digest,
        new_digest,
        ..
    } = eb.execute(&o, 0, changed.clone()).await.unwrap()
    else {
        panic!()
    };
    assert_eq!(stored_digest, args_digest);
    // Approving the new digest: refused, typed, nothing unlocked.
    let refused = eb.approve(&execution_id, &new_digest, None).await;
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
        status(ea.ledger(), &execution_id),
        ExecutionStatus::Prepared
    );
    assert!(service.posts().is_empty());
    let ran = eb.approve(&execution_id, &args_digest, None).await.unwrap();
    assert!(
        matches!(
            ran,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        ),
        "{ran:?}"
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.effects()[0].body, r#"{"amount":5}"#);
    // The changed call still conflicts after the commit, and never runs.
    assert!(matches!(
        ea.execute(&o, 0, changed).await.unwrap(),
        CallOutcome::Conflict { .. }
    ));
    assert_eq!(service.posts().len(), 1);
}

// ---------------------------------------------------------------------------
// Approving a call of a cancelled operation.
// ---------------------------------------------------------------------------
#[tokio::test]
async fn approving_a_call_of_a_cancelled_operation_runs_nothing() {
    let service = Downstream::start(keyed());
    let dir = tempfile::tempdir().unwrap();
    let (ea, eb) = two_execs(&dir.path().join("l.db"), &service, true);
    let o = OperationId::new("op").unwrap();
    // (1) cancelled while waiting: the approval is refused, typed.
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        ..
    } = ea
        .execute(&o, 0, ToolCall::custom("c1", "pay", r#"{"amount":5}"#))
        .await
        .unwrap()
    else {
        panic!()
    };
    // (2) a second call approved (ledger only) but not run before the cancel.
    let CallOutcome::NeedsApproval {
        execution_id: id2,
        args_digest: d2,
        ..
    } = ea
        .execute(&o, 0, ToolCall::custom("c2", "pay", r#"{"amount":6}"#))
        .await
        .unwrap()
    else {
        panic!()
    };
    ea.ledger().approve(&id2, &d2, None).unwrap();
    assert_eq!(eb.cancel_operation(&o).unwrap(), OperationStatus::Cancelled);
    let r = ea.approve(&execution_id, &args_digest, None).await;
    assert!(
        matches!(
            r,
            Err(executor::Error::Ledger(ledger::Error::InvalidTransition {
                from: ExecutionStatus::CancelledBeforeCommit,
                ..
            }))
        ),
        "{r:?}"
    );
    // The approved one, tapped again after the cancel: where it stands.
    let r2 = ea.approve(&id2, &d2, None).await.unwrap();
    assert!(matches!(r2, CallOutcome::Cancelled { .. }), "{r2:?}");
    let r3 = eb.run_existing(&id2).await.unwrap();
    assert!(matches!(r3, CallOutcome::Cancelled { .. }), "{r3:?}");
    assert_eq!(
        status(ea.ledger(), &execution_id),
        ExecutionStatus::CancelledBeforeCommit
    );
    assert_eq!(
        status(ea.ledger(), &id2),
        ExecutionStatus::CancelledBeforeCommit
    );
    assert_eq!(
        ea.ledger().operation_status(&o).unwrap(),
        Some(OperationStatus::Cancelled)
    );
    assert!(service.requests().is_empty());
}

// ---------------------------------------------------------------------------
// run_existing of an approved call from two sessions, plus an execute.
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_existing_of_an_approved_call_racing_from_sessions_performs_once() {
    let service = Downstream::start(Behaviour {
        latency: Duration::from_millis(40),
        ..keyed()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ea, eb) = two_execs(&path, &service, true);
    let ec = executor_at(&path);
    ec.register(Arc::new(HttpTool::new(
        pay_desc(true),
        Kind::Effect,
        &service,
    )))
    .unwrap();
    for i in 0..4 {
        let o = OperationId::new(format!("op_{i}")).unwrap();
        let call = ToolCall::custom("c1", "pay", format!(r#"{{"amount":{i}}}"#));
        let CallOutcome::NeedsApproval {
            execution_id,
            args_digest,
            ..
        } = ea.execute(&o, 0, call.clone()).await.unwrap()
        else {
            panic!()
        };
        ea.ledger()
            .approve(&execution_id, &args_digest, None)
            .unwrap();
        let (x, y, z) = (ea.clone(), eb.clone(), ec.clone());
        let (i1, i2) = (execution_id.clone(), execution_id.clone());
        let (o3, c3) = (o.clone(), call.clone());
        let t1 = tokio::spawn(async move { x.run_existing(&i1).await });
        let t2 = tokio::spawn(async move { y.run_existing(&i2).await });
        let t3 = tokio::spawn(async move { z.execute(&o3, 0, c3).await });
        let mut fresh = 0;
        for t in [t1, t2, t3] {
            let r = joined(t).await;
            match r {
                CallOutcome::Completed {
                    replayed: false, ..
                } => fresh += 1,
                CallOutcome::Completed { replayed: true, .. } | CallOutcome::InFlight { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(fresh, 1);
        assert_eq!(service.effects().len(), i as usize + 1);
        assert_eq!(service.posts().len(), i as usize + 1);
        assert_eq!(
            status(ea.ledger(), &execution_id),
            ExecutionStatus::Committed
        );
    }
}

// ---------------------------------------------------------------------------
// cancel_operation while running / unknown; late reports; recover.
// ---------------------------------------------------------------------------
#[test]
fn cancel_while_executing_then_late_reports_are_honest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (a, clock) = open_at(&path);
    let b = open_with(&path, &clock);
    // (1) running, cancelled, the commit arrives late.
    let t = ticket(a.begin(&op("o1"), 0, &spec("c", "pay", "{}")).unwrap());
    assert_eq!(
        b.cancel_operation(&op("o1")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    assert_eq!(status(&a, &t.execution_id), ExecutionStatus::Executing);
    a.commit(&t.attempt_id(), r#"{"ok":1}"#, Some("e1"))
        .unwrap();
    assert_eq!(status(&a, &t.execution_id), ExecutionStatus::Committed);
    assert_eq!(
        b.operation_status(&op("o1")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    // Cancelling again does not lose the committed effect.
    assert_eq!(
        b.cancel_operation(&op("o1")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    assert!(matches!(
        b.begin(&op("o1"), 0, &spec("c", "pay", "{}")).unwrap(),
        Begin::Replay(_)
    ));

    // (2) running, cancelled, a late provable failure (retryable): nothing
    // happened, the operation is plain cancelled, no retry starts.
    let t = ticket(a.begin(&op("o2"), 0, &spec("c", "pay", "{}")).unwrap());
    assert_eq!(
        b.cancel_operation(&op("o2")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    a.fail_before_commit(&t.attempt_id(), "429", true).unwrap();
    assert_eq!(
        b.operation_status(&op("o2")).unwrap(),
        Some(OperationStatus::Cancelled)
    );
    assert!(matches!(
        b.begin(&op("o2"), 0, &spec("c", "pay", "{}")).unwrap(),
        Begin::Cancelled { .. }
    ));
    assert_eq!(
        status(&a, &t.execution_id),
        ExecutionStatus::CancelledBeforeCommit
    );
    assert!(matches!(
        b.mark_executing(&t.execution_id),
        Err(Error::OperationCancelled(_)) | Err(Error::InvalidTransition { .. })
    ));

    // (3) running, cancelled, outcome unknown: stays unknown, after-effect;
    // a resolution "found" commits; "not found + retry" never starts.
    let t = ticket(a.begin(&op("o3"), 0, &spec("c", "pay", "{}")).unwrap());
    b.cancel_operation(&op("o3")).unwrap();
    a.mark_outcome_unknown(&t.attempt_id(), "timeout").unwrap();
    assert_eq!(
        b.cancel_operation(&op("o3")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    assert_eq!(status(&a, &t.execution_id), ExecutionStatus::OutcomeUnknown);
    let res = b
        .resolve_unknown(&t.attempt_id(), ledger::Resolution::NotFoundRetry)
        .unwrap();
    assert!(matches!(res, ledger::Resolved::Cancelled), "{res:?}");
    assert_eq!(
        status(&a, &t.execution_id),
        ExecutionStatus::CancelledBeforeCommit
    );
    assert_eq!(
        b.operation_status(&op("o3")).unwrap(),
        Some(OperationStatus::Cancelled)
    );
}

/// The running attempt's own late commit, after its unknown outcome was
/// settled "not found" in the cancelled operation: the effect happened, so it
/// must be kept as evidence and the operation must say
/// `cancelled_after_side_effect` (design.md "Cancellation and partial
/// batches": "A found effect is never dropped ... kept as evidence").
#[test]
fn a_late_commit_after_a_not_found_settlement_in_a_cancelled_operation_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (a, clock) = open_at(&path);
    let b = open_with(&path, &clock);
    let t = ticket(a.begin(&op("o3"), 0, &spec("c", "pay", "{}")).unwrap());
    assert_eq!(
        b.cancel_operation(&op("o3")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    a.mark_outcome_unknown(&t.attempt_id(), "timeout").unwrap();
    let res = b
        .resolve_unknown(&t.attempt_id(), ledger::Resolution::NotFoundRetry)
        .unwrap();
    assert!(matches!(res, ledger::Resolved::Cancelled), "{res:?}");
    assert_eq!(
        b.operation_status(&op("o3")).unwrap(),
        Some(OperationStatus::Cancelled)
    );
    // The tool's response arrives after all: the effect happened.
    let late = a.commit(&t.attempt_id(), r#"{"ok":3}"#, Some("e3"));
    eprintln!("late commit: {late:?}");
    assert!(late.is_err(), "{late:?}");
    assert_eq!(
        status(&a, &t.execution_id),
        ExecutionStatus::CancelledBeforeCommit
    );
    let ev = a.evidence(&t.execution_id).unwrap();
    eprintln!("evidence: {ev:?}");
    assert!(!ev.is_empty(), "the reported effect was dropped");
    assert_eq!(
        b.operation_status(&op("o3")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    assert_eq!(
        b.cancel_operation(&op("o3")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
}

#[test]
fn cancel_then_recover_settles_nothing_by_guessing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (a, clock) = open_at(&path);
    let t = ticket(a.begin(&op("o"), 0, &spec("c", "pay", "{}")).unwrap());
    a.mark_outcome_unknown(&t.attempt_id(), "timeout").unwrap();
    let w = a
        .begin(&op("o"), 0, &spec("w", "pay", "{}").with_approval())
        .unwrap();
    let Begin::NeedsApproval(w) = w else { panic!() };
    a.approve(&w.execution_id, &w.args_digest, None).unwrap();
    assert_eq!(
        a.cancel_operation(&op("o")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    drop(a);
    let b = open_with(&path, &clock);
    let pending = b.recover().unwrap();
    let ids: Vec<_> = pending.iter().map(|r| r.execution_id.clone()).collect();
    assert!(ids.contains(&t.execution_id), "{ids:?}");
    assert_eq!(status(&b, &t.execution_id), ExecutionStatus::OutcomeUnknown);
    assert_eq!(
        status(&b, &w.execution_id),
        ExecutionStatus::CancelledBeforeCommit
    );
    assert!(matches!(
        b.continue_execution(&w.execution_id).unwrap(),
        Begin::Cancelled { .. }
    ));
    assert!(matches!(
        b.continue_execution(&t.execution_id).unwrap(),
        Begin::Reconcile(_)
    ));
    assert_eq!(
        b.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

/// Executor: the post lands, the process dies before it hears the answer,
/// the restarted app cancels the operation (the dead attempt is "running"),
/// then recovers: the lookup finds the effect and commits it, never resending.
#[test]
fn cancel_after_a_crash_mid_call_then_recover_finds_the_effect() {
    let service = Downstream::start(keyed());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let o = OperationId::new("op").unwrap();
    process(async {
        let e = executor_at(&path);
        let tool = HttpTool::new(pay_desc(false), Kind::Effect, &service);
        let mut crash = tool.crash_at(None, downstream::CrashPoint::AfterResponse);
        e.register(Arc::new(tool)).unwrap();
        let (run, o2) = (e.clone(), o.clone());
        tokio::spawn(async move {
            run.execute(&o2, 0, ToolCall::custom("c", "pay", "{}"))
                .await
        });
        crash.reached().await;
    });
    assert_eq!(service.effects().len(), 1);
    let (st, rec) = process(async {
        let e = executor_at(&path);
        e.register(Arc::new(HttpTool::new(
            pay_desc(false),
            Kind::Effect,
            &service,
        )))
        .unwrap();
        let st = e.cancel_operation(&o).unwrap();
        (st, e.recover().await.unwrap())
    });
    assert_eq!(st, OperationStatus::CancelledAfterSideEffect);
    assert!(rec.failed.is_empty(), "{:?}", rec.failed);
    let l = Ledger::open(&path, LedgerConfig::default()).unwrap();
    let id = l.list(&o).unwrap()[0].execution_id.clone();
    assert_eq!(
        status(&l, &id),
        ExecutionStatus::Committed,
        "{:?}",
        rec.outcomes
    );
    assert_eq!(
        l.operation_status(&o).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1, "never resent after the cancel");
}

/// A retry backoff waits while the operation is cancelled: the next attempt
/// never starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_retry_backoff_starts_no_further_attempt() {
    let service = Downstream::start(Behaviour {
        throttle: 1,
        ..keyed()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let e = executor_with(
        &path,
        executor::ExecutorConfig {
            backoff_base: Duration::from_millis(400),
            backoff_max: Duration::from_millis(400),
            ..fast_config()
        },
    );
    e.register(Arc::new(HttpTool::new(
        pay_desc(false),
        Kind::Effect,
        &service,
    )))
    .unwrap();
    let other = executor_at(&path);
    let o = OperationId::new("op").unwrap();
    let (e2, o2) = (e.clone(), o.clone());
    let task =
        tokio::spawn(async move { e2.execute(&o2, 0, ToolCall::custom("c", "pay", "{}")).await });
    let deadline = std::time::Instant::now() + WAIT;
    while service.requests().is_empty() {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Wait until the 429 is recorded (failed_before_commit, retryable).
    loop {
        let l = other.ledger().list(&o).unwrap();
        if l.first()
            .is_some_and(|r| r.status == ExecutionStatus::FailedBeforeCommit)
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{l:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        other.cancel_operation(&o).unwrap(),
        OperationStatus::Cancelled
    );
    let out = joined(task).await;
    assert!(matches!(out, CallOutcome::Cancelled { .. }), "{out:?}");
    assert_eq!(service.posts().len(), 1);
    assert!(service.effects().is_empty());
    let id = out.execution_id().clone();
    assert_eq!(
        status(other.ledger(), &id),
        ExecutionStatus::CancelledBeforeCommit
    );
    assert_eq!(
        other.ledger().operation_status(&o).unwrap(),
        Some(OperationStatus::Cancelled)
    );
}

// ---------------------------------------------------------------------------
// Compensation.
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compensate_twice_concurrently_from_two_sessions_refunds_once() {
    let service = Downstream::start(Behaviour {
        latency: Duration::from_millis(40),
        ..keyed()
    });
    let dir = tempfile::tempdir().unwrap();
    let (ea, eb) = two_execs(&dir.path().join("l.db"), &service, false);
    let o = OperationId::new("op").unwrap();
    let undo = OperationId::new("op_undo").unwrap();
    // The pay is running when the operation is cancelled: after side effect.
    let (ea2, o2) = (ea.clone(), o.clone());
    let pay = tokio::spawn(async move {
        ea2.execute(&o2, 0, ToolCall::custom("c1", "pay", r#"{"amount":9}"#))
            .await
    });
    let deadline = std::time::Instant::now() + WAIT;
    while service.requests().is_empty() {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        eb.cancel_operation(&o).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    let paid = joined(pay).await;
    assert!(
        matches!(
            paid,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        ),
        "{paid:?}"
    );
    let original = paid.execution_id().clone();
    // Nothing begins in the cancelled operation, a compensation included.
    let here = ea
        .compensate(&original, &o, 1, ToolCall::custom("r0", "refund", "{}"))
        .await
        .unwrap();
    assert!(matches!(here, CallOutcome::Cancelled { .. }), "{here:?}");
    assert!(ea.ledger().compensations(&original).unwrap().is_empty());

    let refund = ToolCall::custom("r1", "refund", r#"{"payment":"eff_1"}"#);
    let (x, y) = (ea.clone(), eb.clone());
    let (ox, oy, rx, ry, gx, gy) = (
        undo.clone(),
        undo.clone(),
        refund.clone(),
        refund.clone(),
        original.clone(),
        original.clone(),
    );
    let t1 = tokio::spawn(async move { x.compensate(&gx, &ox, 0, rx).await });
    let t2 = tokio::spawn(async move { y.compensate(&gy, &oy, 0, ry).await });
    let r1 = joined(t1).await;
    let r2 = joined(t2).await;
    let fresh = fresh_runs(&[&r1, &r2]);
    assert_eq!(fresh, 1, "{r1:?} {r2:?}");
    assert_eq!(ea.ledger().compensations(&original).unwrap().len(), 1);
    assert_eq!(service.effects().len(), 2, "one pay, one refund");
    assert_eq!(status(ea.ledger(), &original), ExecutionStatus::Committed);
    let comp = r1.execution_id().clone();
    assert_eq!(status(ea.ledger(), &comp), ExecutionStatus::Committed);
    assert_eq!(
        ea.ledger().operation_status(&o).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );

    // Compensating the compensation (re-charge): its own new execution.
    let again = eb
        .compensate(
            &comp,
            &undo,
            1,
            ToolCall::custom("p2", "pay", r#"{"amount":9}"#),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            again,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        ),
        "{again:?}"
    );
    assert_eq!(ea.ledger().compensations(&comp).unwrap().len(), 1);
    assert_eq!(service.effects().len(), 3);
    // And the same compensation asked again replays.
    let rep = ea.compensate(&original, &undo, 0, refund).await.unwrap();
    assert!(
        matches!(rep, CallOutcome::Completed { replayed: true, .. }),
        "{rep:?}"
    );
    assert_eq!(service.effects().len(), 3);
}

#[tokio::test]
async fn a_compensation_needing_approval_that_is_rejected_never_runs() {
    let service = Downstream::start(keyed());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ea = executor_at(&path);
    ea.register(Arc::new(HttpTool::new(
        pay_desc(false),
        Kind::Effect,
        &service,
    )))
    .unwrap();
    ea.register(Arc::new(HttpTool::new(
        refund_desc(true),
        Kind::Effect,
        &service,
    )))
    .unwrap();
    let eb = executor_at(&path);
    eb.register(Arc::new(HttpTool::new(
        refund_desc(true),
        Kind::Effect,
        &service,
    )))
    .unwrap();
    eb.register(Arc::new(HttpTool::new(
        pay_desc(false),
        Kind::Effect,
        &service,
    )))
    .unwrap();
    let o = OperationId::new("op").unwrap();
    let undo = OperationId::new("undo").unwrap();
    let paid = ea
        .execute(&o, 0, ToolCall::custom("c1", "pay", "{}"))
        .await
        .unwrap();
    let original = paid.execution_id().clone();
    // Not compensable while... well, it committed: cancel after effect.
    assert_eq!(
        ea.cancel_operation(&o).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    let refund = ToolCall::custom("r1", "refund", r#"{"p":1}"#);
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        ..
    } = ea
        .compensate(&original, &undo, 0, refund.clone())
        .await
        .unwrap()
    else {
        panic!()
    };
    ea.ledger()
        .reject(&execution_id, &args_digest, "keep it")
        .unwrap();
    let r = eb.approve(&execution_id, &args_digest, None).await;
    assert!(
        matches!(
            r,
            Err(executor::Error::Ledger(ledger::Error::InvalidTransition {
                from: ExecutionStatus::Rejected,
                ..
            }))
        ),
        "{r:?}"
    );
    let again = eb.compensate(&original, &undo, 0, refund).await.unwrap();
    assert!(matches!(again, CallOutcome::Rejected { .. }), "{again:?}");
    let other_args = eb
        .compensate(
            &original,
            &undo,
            0,
            ToolCall::custom("r1", "refund", r#"{"p":2}"#),
        )
        .await
        .unwrap();
    assert!(
        matches!(other_args, CallOutcome::Conflict { .. }),
        "{other_args:?}"
    );
    assert_eq!(
        status(ea.ledger(), &execution_id),
        ExecutionStatus::Rejected
    );
    assert_eq!(status(ea.ledger(), &original), ExecutionStatus::Committed);
    assert_eq!(service.effects().len(), 1, "only the pay");
    // Recovery does not resurrect the rejected compensation.
    let rec = eb.recover().await.unwrap();
    assert!(rec.failed.is_empty(), "{:?}", rec.failed);
    assert_eq!(service.effects().len(), 1);
    // A compensation of a call that never committed is a typed refusal.
    let CallOutcome::Rejected { .. } = again else {
        unreachable!()
    };
    let nothing = ea
        .compensate(
            &execution_id,
            &undo,
            1,
            ToolCall::custom("r2", "refund", "{}"),
        )
        .await;
    assert!(
        matches!(
            nothing,
            Err(executor::Error::Ledger(ledger::Error::NothingToCompensate(
                _
            )))
        ),
        "{nothing:?}"
    );
}

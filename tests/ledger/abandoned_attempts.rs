//! A caller-driven attempt the caller never sent (`Executor::abandon_attempt`):
//! the caller was interrupted after it got a `Perform` and before the
//! request left. What was true before the attempt stays true: a same-key
//! resend after an unknown outcome leaves it unknown (the next ask resends
//! under the same key: one effect at a deduping downstream); a first
//! attempt is recorded not sent (the next ask runs it once). Before this
//! step a caller could only report the resend `Unknown` (which handed out
//! the next resend at once, until `max_attempts` ended the chain and the
//! call was unknown for good) or `FailedBeforeCommit` (evidence that the
//! earlier request did not land, which an unsent resend is not).

use std::sync::Arc;
use std::time::Duration;

use crate::caller_driven::{drive, pay, perform, tool};
use support::downstream::{Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{
    CallOutcome, CallerAttempt, CallerStep, Executor, PerformOutcome, ToolDescriptor,
};
use toolledger::model::ExecutionStatus;
use toolledger_test_support as support;

fn perform_of(step: CallerStep) -> CallerAttempt {
    match step {
        CallerStep::Perform(a) => a,
        other => panic!("expected Perform, got {other:?}"),
    }
}

fn status(exec: &Executor, a: &CallerAttempt) -> (ExecutionStatus, u32) {
    let rec = exec.ledger().get(&a.request.execution_id).unwrap().unwrap();
    (rec.status, rec.attempt_count)
}

fn key_service() -> Downstream {
    Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    })
}

/// A key tool whose landing window is `window`.
fn key_executor(dir: &std::path::Path, service: &Downstream, window: Duration) -> Executor {
    let exec = executor_at(&dir.join("l.db"));
    let desc = ToolDescriptor {
        idempotency_key: true,
        landing_window: window,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, service)))
        .unwrap();
    exec
}

/// The first attempt is sent (the effect is made) and its caller reports
/// it unknown (it gave up waiting); the report hands out the same-key
/// resend, which the caller never sends.
fn interrupted_after_the_effect(exec: &Executor, service: &Downstream) -> CallerAttempt {
    let a1 = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    assert!(matches!(
        perform(service, &a1.request),
        Ok(PerformOutcome::Committed { .. })
    ));
    let step = exec
        .report(
            &a1,
            Ok(PerformOutcome::Unknown {
                reason: "interrupted".into(),
            }),
        )
        .unwrap();
    let a2 = perform_of(step);
    assert_eq!(a2.request.attempt, 2);
    assert_eq!(a2.request.downstream_key, a1.request.downstream_key);
    a2
}

#[test]
fn an_unsent_resend_leaves_the_call_unknown_and_the_next_ask_resends_it_once() {
    for (window, by_recover) in [
        (Duration::ZERO, false),
        (Duration::from_secs(120), false),
        (Duration::ZERO, true),
        (Duration::from_secs(120), true),
    ] {
        let case = format!("window {window:?}, recover {by_recover}");
        let dir = tempfile::tempdir().unwrap();
        let service = key_service();
        let exec = key_executor(dir.path(), &service, window);
        let a2 = interrupted_after_the_effect(&exec, &service);

        let step = exec
            .abandon_attempt(&a2.request.execution_id, 2, "cancelled")
            .unwrap();
        let CallerStep::Done(CallOutcome::Unknown { attempt: 2, .. }) = step else {
            panic!("{case}: {step:?}")
        };
        // Never failed before commit: the first request made the effect.
        assert_eq!(
            status(&exec, &a2),
            (ExecutionStatus::OutcomeUnknown, 2),
            "{case}"
        );
        if by_recover {
            // `recover()` reconciles it: a resend under the same key (the
            // executor's own tool), deduped; never `Failed`.
            let recovered = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(exec.recover())
                .unwrap();
            assert!(
                matches!(
                    recovered.outcomes.as_slice(),
                    [CallOutcome::Completed { .. }]
                ),
                "{case}: {recovered:?}"
            );
        } else {
            // Asked again: the same key is sent once more, the downstream
            // dedupes it, the call completes with the first effect's result.
            let again = exec.start(&op("op"), 0, pay()).unwrap();
            let (out, performs, _) = drive(&exec, &service, again);
            assert!(
                matches!(out, CallOutcome::Completed { .. }),
                "{case}: {out:?}"
            );
            assert_eq!(performs, 1, "{case}");
        }
        assert_eq!(
            status(&exec, &a2),
            (ExecutionStatus::Committed, 3),
            "{case}"
        );
        assert_eq!(service.effects().len(), 1, "{case}");
        assert_eq!(service.posts().len(), 2, "{case}");
    }
}

#[test]
fn an_unsent_first_attempt_is_not_sent_and_the_next_ask_runs_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let service = key_service();
    let exec = key_executor(dir.path(), &service, Duration::from_secs(120));
    let a1 = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let step = exec
        .abandon_attempt(&a1.request.execution_id, 1, "cancelled")
        .unwrap();
    let CallerStep::Done(CallOutcome::Failed {
        retryable: true, ..
    }) = step
    else {
        panic!("{step:?}")
    };
    assert_eq!(status(&exec, &a1), (ExecutionStatus::FailedBeforeCommit, 1));
    assert!(service.posts().is_empty());
    let (out, performs, _) = drive(&exec, &service, exec.start(&op("op"), 0, pay()).unwrap());
    assert!(matches!(out, CallOutcome::Completed { .. }), "{out:?}");
    assert_eq!(performs, 1);
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn an_abandon_of_an_attempt_not_outstanding_here_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = key_service();
    let exec = executor_at(&path);
    exec.register(tool(&service, true, false)).unwrap();
    let a1 = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let id = a1.request.execution_id.clone();

    // A number this executor did not hand out: the attempt stays running.
    let step = exec.abandon_attempt(&id, 7, "cancelled").unwrap();
    assert!(
        matches!(step, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{step:?}"
    );
    // Another executor (another session) on the same file: not its attempt.
    let other = executor_at(&path);
    other.register(tool(&service, true, false)).unwrap();
    let step = other.abandon_attempt(&id, 1, "cancelled").unwrap();
    assert!(
        matches!(step, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{step:?}"
    );
    assert_eq!(status(&exec, &a1), (ExecutionStatus::Executing, 1));

    // The attempt's own report still commits; an abandon after it answers
    // the stored result and changes nothing.
    let done = exec.report(&a1, perform(&service, &a1.request)).unwrap();
    assert!(
        matches!(done, CallerStep::Done(CallOutcome::Completed { .. })),
        "{done:?}"
    );
    let step = exec.abandon_attempt(&id, 1, "cancelled").unwrap();
    assert!(
        matches!(step, CallerStep::Done(CallOutcome::Completed { .. })),
        "{step:?}"
    );
    assert_eq!(status(&exec, &a1).0, ExecutionStatus::Committed);
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn an_abandoned_resend_counts_towards_max_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let service = key_service();
    let exec = executor_with(
        &dir.path().join("l.db"),
        toolledger::executor::ExecutorConfig {
            max_attempts: 2,
            ..downstream::fast_config()
        },
    );
    exec.register(tool(&service, true, false)).unwrap();
    let a2 = interrupted_after_the_effect(&exec, &service);
    let step = exec
        .abandon_attempt(&a2.request.execution_id, 2, "cancelled")
        .unwrap();
    assert!(
        matches!(step, CallerStep::Done(CallOutcome::Unknown { .. })),
        "{step:?}"
    );
    // No attempts left: the next ask says unknown and sends nothing.
    let again = exec.start(&op("op"), 0, pay()).unwrap();
    assert!(
        matches!(again, CallerStep::Done(CallOutcome::Unknown { .. })),
        "{again:?}"
    );
    assert_eq!(service.posts().len(), 1);
    assert_eq!(service.effects().len(), 1);
}

/// `report_interrupted`: the caller was interrupted while its attempt may
/// have been sent. Unknown, and nothing handed out (a report of `Unknown`
/// answers a same-key resend at once, which an interrupted caller would
/// not run); the next ask resends under the same key, once.
#[test]
fn an_interrupted_attempt_is_unknown_with_nothing_handed_out_and_the_next_ask_resends_it() {
    for window in [Duration::ZERO, Duration::from_secs(120)] {
        let dir = tempfile::tempdir().unwrap();
        let service = key_service();
        let exec = key_executor(dir.path(), &service, window);
        let a1 = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
        assert!(matches!(
            perform(&service, &a1.request),
            Ok(PerformOutcome::Committed { .. })
        ));
        let step = exec
            .report_interrupted(&a1.request.execution_id, 1, "cancelled")
            .unwrap();
        let CallerStep::Done(CallOutcome::Unknown { attempt: 1, .. }) = step else {
            panic!("window {window:?}: {step:?}")
        };
        assert_eq!(
            status(&exec, &a1),
            (ExecutionStatus::OutcomeUnknown, 1),
            "window {window:?}"
        );
        // A second interrupted report of it, or of a number never handed
        // out, changes nothing.
        for n in [1, 2] {
            let again = exec
                .report_interrupted(&a1.request.execution_id, n, "cancelled")
                .unwrap();
            assert!(
                matches!(again, CallerStep::Done(CallOutcome::Unknown { .. })),
                "{again:?}"
            );
        }
        assert_eq!(status(&exec, &a1), (ExecutionStatus::OutcomeUnknown, 1));

        let (out, performs, _) = drive(&exec, &service, exec.start(&op("op"), 0, pay()).unwrap());
        assert!(matches!(out, CallOutcome::Completed { .. }), "{out:?}");
        assert_eq!(performs, 1, "window {window:?}");
        assert_eq!(status(&exec, &a1), (ExecutionStatus::Committed, 2));
        assert_eq!(service.effects().len(), 1, "window {window:?}");
        assert_eq!(service.posts().len(), 2, "window {window:?}");
    }
}

/// With neither key nor lookup, an interrupted attempt stays unknown for
/// the app: the next ask says so and sends nothing.
#[test]
fn an_interrupted_neither_tool_attempt_is_never_resent() {
    let dir = tempfile::tempdir().unwrap();
    let service = Downstream::start(Behaviour::default());
    let exec = executor_at(&dir.path().join("l.db"));
    exec.register(tool(&service, false, false)).unwrap();
    let a1 = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let _ = perform(&service, &a1.request);
    let step = exec
        .report_interrupted(&a1.request.execution_id, 1, "cancelled")
        .unwrap();
    assert!(
        matches!(step, CallerStep::Done(CallOutcome::Unknown { .. })),
        "{step:?}"
    );
    let again = exec.start(&op("op"), 0, pay()).unwrap();
    assert!(
        matches!(again, CallerStep::Done(CallOutcome::Unknown { .. })),
        "{again:?}"
    );
    assert_eq!(service.posts().len(), 1);
}

/// A report under another registered tool's name (a caller mixing up its
/// attempts) would apply that tool's rules to this execution — a key tool's
/// deferred commit to a neither-tool's result, its reconciliation. It is
/// refused before the attempt is taken: the attempt stays outstanding and
/// its own report commits.
#[test]
fn a_report_under_another_tools_name_is_refused_and_changes_nothing() {
    use toolledger::executor::Error;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = key_service();
    let exec = executor_at(&path);
    // "pay": neither key nor lookup; "pay_key": a key tool.
    exec.register(tool(&service, false, false)).unwrap();
    let key_desc = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("pay_key", 1)
    };
    exec.register(Arc::new(HttpTool::new(key_desc, Kind::Effect, &service)))
        .unwrap();
    let a1 = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let outcome = perform(&service, &a1.request);
    let mut renamed = a1.clone();
    renamed.request.tool_name = "pay_key".into();
    let refused = exec.report(&renamed, outcome.clone());
    assert!(
        matches!(refused, Err(Error::CallerDriven(ref name)) if name == "pay_key"),
        "{refused:?}"
    );
    assert_eq!(status(&exec, &a1), (ExecutionStatus::Executing, 1));
    // Not taken: the attempt's own report still commits it (durably: the
    // neither-tool's rules).
    let done = exec.report(&a1, outcome).unwrap();
    assert!(
        matches!(done, CallerStep::Done(CallOutcome::Completed { .. })),
        "{done:?}"
    );
    assert_eq!(status(&exec, &a1).0, ExecutionStatus::Committed);
    assert_eq!(service.effects().len(), 1);
}

//! Caller-driven calls (`Executor::start` / `report` / `report_lookup` /
//! `retry`): the tool runs on the caller's thread, and every exactly-once rule
//! of `execute` still holds — one perform per call, stale reports refused and
//! kept as evidence, a crash between the effect and its report reconciled.
//! Effects are counted at the loopback downstream.

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use downstream::{Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{
    BatchMode, CallOutcome, CallerAttempt, CallerStep, Error as ExecError, Executor, LookupOutcome,
    PerformOutcome, ToolDescriptor, ToolError, ToolRequest,
};
use toolledger::ledger::Error as LedgerError;
use toolledger::model::{ExecutionStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;
use toolledger_test_support::http::{encode, request_blocking};

const TIMEOUT: Duration = Duration::from_secs(5);

/// The caller's own tool, run inline: `POST /effects` with the key.
pub(crate) fn perform(
    service: &Downstream,
    req: &ToolRequest,
) -> Result<PerformOutcome, ToolError> {
    perform_at(service.addr(), req)
}

/// [`perform`] against the downstream at `addr` (a child process knows
/// only its address).
pub(crate) fn perform_at(
    addr: std::net::SocketAddr,
    req: &ToolRequest,
) -> Result<PerformOutcome, ToolError> {
    let resp = request_blocking(
        addr,
        "POST",
        "/effects",
        Some(req.downstream_key.as_str()),
        &req.arguments_json,
        TIMEOUT,
    )
    .map_err(|e| ToolError::new(format!("transport: {e}")))?;
    Ok(match resp.status {
        200..=299 => PerformOutcome::Committed {
            result_json: resp.body,
            external_id: None,
        },
        429 => PerformOutcome::FailedBeforeCommit {
            reason: "throttled".into(),
            retryable: true,
        },
        status => PerformOutcome::Unknown {
            reason: format!("status {status}"),
        },
    })
}

/// The caller's own lookup: `GET /effects?key=…`.
fn lookup(service: &Downstream, req: &ToolRequest) -> Result<LookupOutcome, ToolError> {
    lookup_at(service.addr(), req)
}

/// [`lookup`] against the downstream at `addr`.
pub(crate) fn lookup_at(
    addr: std::net::SocketAddr,
    req: &ToolRequest,
) -> Result<LookupOutcome, ToolError> {
    let target = format!("/effects?key={}", encode(req.downstream_key.as_str()));
    let resp = request_blocking(addr, "GET", &target, None, "", TIMEOUT)
        .map_err(|e| ToolError::new(format!("transport: {e}")))?;
    Ok(match resp.status {
        200 => LookupOutcome::Found {
            result_json: resp.body,
            external_id: None,
        },
        _ => LookupOutcome::NotFound,
    })
}

/// Drives one call to its answer the way a binding's layer does, running
/// the tool and its lookup inline; returns the answer and how many
/// performs and lookups the caller ran. Bounded by the executor's attempts.
pub(crate) fn drive(
    exec: &Executor,
    service: &Downstream,
    first: CallerStep,
) -> (CallOutcome, u32, u32) {
    let (mut performs, mut lookups) = (0, 0);
    let mut step = first;
    for _ in 0..20 {
        step = match step {
            CallerStep::Done(outcome) => return (outcome, performs, lookups),
            CallerStep::Perform(a) => {
                performs += 1;
                exec.report(&a, perform(service, &a.request)).unwrap()
            }
            CallerStep::Lookup(a) => {
                lookups += 1;
                exec.report_lookup(&a, lookup(service, &a.request)).unwrap()
            }
            CallerStep::Retry { attempt, after } => {
                std::thread::sleep(after);
                exec.retry(&attempt).unwrap()
            }
        };
    }
    panic!("the call did not settle in 20 steps");
}

pub(crate) fn tool(service: &Downstream, key: bool, lookup: bool) -> Arc<HttpTool> {
    let desc = ToolDescriptor {
        idempotency_key: key,
        lookup,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    Arc::new(HttpTool::new(desc, Kind::Effect, service))
}

fn executor(path: &Path, service: &Downstream, key: bool, lookup: bool) -> Executor {
    let exec = executor_at(path);
    exec.register(tool(service, key, lookup)).unwrap();
    exec
}

pub(crate) fn pay() -> ToolCall {
    call("call_1", "pay", r#"{"amount":"12.50"}"#)
}

fn perform_of(step: CallerStep) -> CallerAttempt {
    match step {
        CallerStep::Perform(a) => a,
        other => panic!("expected Perform, got {other:?}"),
    }
}

fn committed(result: &str) -> Result<PerformOutcome, ToolError> {
    Ok(PerformOutcome::Committed {
        result_json: result.into(),
        external_id: None,
    })
}

#[test]
fn the_happy_path_performs_once_and_a_repeat_replays_without_a_perform() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir.path().join("l.db"), &service, true, false);
    let first = exec.start(&op("op"), 0, pay()).unwrap();
    let (out, performs, _) = drive(&exec, &service, first);
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
    assert_eq!(performs, 1);

    let again = exec.start(&op("op"), 0, pay()).unwrap();
    let CallerStep::Done(CallOutcome::Completed {
        replayed: true,
        result_json,
        ..
    }) = again
    else {
        panic!("{again:?}")
    };
    assert_eq!(Some(result_json.as_str()), out.result_json());
    assert_eq!(service.effects().len(), 1);
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.attempt_count, 1);
}

#[test]
fn two_callers_of_one_call_get_one_perform() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let exec = executor(&path, &service, true, false);
    // Same executor, then another session on the same file, while the first
    // caller holds its attempt.
    let attempt = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let second = exec.start(&op("op"), 0, pay()).unwrap();
    assert!(
        matches!(second, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{second:?}"
    );
    let other = executor(&path, &service, true, false);
    let third = other.start(&op("op"), 0, pay()).unwrap();
    assert!(
        matches!(third, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{third:?}"
    );
    let out = exec
        .report(&attempt, perform(&service, &attempt.request))
        .unwrap();
    assert!(matches!(
        out,
        CallerStep::Done(CallOutcome::Completed {
            replayed: false,
            ..
        })
    ));
    let later = other.start(&op("op"), 0, pay()).unwrap();
    assert!(matches!(
        later,
        CallerStep::Done(CallOutcome::Completed { replayed: true, .. })
    ));
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
}

#[test]
fn many_threads_starting_one_call_at_once_get_exactly_one_perform() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir.path().join("l.db"), &service, false, false);
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (exec, barrier) = (exec.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                exec.start(&op("op"), 0, pay()).unwrap()
            })
        })
        .collect();
    let steps: Vec<CallerStep> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let performs: Vec<&CallerAttempt> = steps
        .iter()
        .filter_map(|s| match s {
            CallerStep::Perform(a) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(performs.len(), 1, "{steps:?}");
    assert_eq!(
        steps
            .iter()
            .filter(|s| matches!(s, CallerStep::Done(CallOutcome::InFlight { .. })))
            .count(),
        threads - 1
    );
    let a = performs[0].clone();
    let (out, _, _) = drive(
        &exec,
        &service,
        exec.report(&a, perform(&service, &a.request)).unwrap(),
    );
    assert!(matches!(out, CallOutcome::Completed { .. }));
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn a_stale_report_is_refused_kept_as_evidence_and_answered_with_the_current_truth() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir.path().join("l.db"), &service, true, false);
    let a1 = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let id = a1.request.execution_id.clone();
    // Attempt 1 times out (unknown): the key tool is resent as attempt 2.
    let a2 = perform_of(exec.report(&a1, Err(ToolError::new("timed out"))).unwrap());
    assert_eq!(a2.request.attempt, 2);
    assert_eq!(a2.request.downstream_key, a1.request.downstream_key);

    // Attempt 1's answer arrives late: refused, kept, attempt 2 still runs.
    let late = exec.report(&a1, committed(r#"{"late":1}"#)).unwrap();
    assert!(
        matches!(late, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{late:?}"
    );
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.attempt_count),
        (ExecutionStatus::Executing, 2)
    );
    assert_eq!(exec.ledger().evidence(&id).unwrap().len(), 1);

    let done = exec.report(&a2, committed(r#"{"fresh":2}"#)).unwrap();
    let CallerStep::Done(CallOutcome::Completed { result_json, .. }) = done else {
        panic!("{done:?}")
    };
    assert_eq!(result_json, r#"{"fresh":2}"#);
    // Reported again after the commit: still refused, the result stands.
    let again = exec.report(&a1, committed(r#"{"late":1}"#)).unwrap();
    let CallerStep::Done(CallOutcome::Completed {
        result_json,
        replayed: true,
        ..
    }) = again
    else {
        panic!("{again:?}")
    };
    assert_eq!(result_json, r#"{"fresh":2}"#);
    assert_eq!(exec.ledger().evidence(&id).unwrap().len(), 2);

    // An attempt the execution never had is bad input, not evidence.
    let mut forged = a2.clone();
    forged.request.attempt = 9;
    let err = exec.report(&forged, committed("1")).unwrap_err();
    assert!(
        matches!(err, ExecError::Ledger(LedgerError::NoSuchAttempt { .. })),
        "{err:?}"
    );
    assert_eq!(exec.ledger().evidence(&id).unwrap().len(), 2);
}

#[test]
fn another_sessions_report_of_a_live_attempt_is_refused() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let owner = executor(&path, &service, true, false);
    let intruder = executor(&path, &service, true, false);
    let a = perform_of(owner.start(&op("op"), 0, pay()).unwrap());
    let id = a.request.execution_id.clone();
    let refused = intruder.report(&a, committed(r#"{"x":1}"#)).unwrap();
    assert!(
        matches!(refused, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{refused:?}"
    );
    let rec = owner.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    assert_eq!(
        rec.owner_session.as_ref(),
        Some(owner.ledger().session_id())
    );
    assert_eq!(owner.ledger().evidence(&id).unwrap().len(), 1);
    // The owner's own report still applies.
    let done = owner.report(&a, committed(r#"{"y":2}"#)).unwrap();
    assert!(matches!(
        done,
        CallerStep::Done(CallOutcome::Completed {
            replayed: false,
            ..
        })
    ));
}

/// The first process runs the tool (the effect happens downstream) and dies
/// before it reports; the second process asks for the same call.
fn crash_after_effect(key: bool, lookup_tool: bool) -> (Downstream, Executor, CallerStep) {
    let service = Downstream::start(Behaviour {
        idempotency: key,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let first = executor(&path, &service, key, lookup_tool);
    let a = perform_of(first.start(&op("op"), 0, pay()).unwrap());
    assert!(matches!(
        perform(&service, &a.request),
        Ok(PerformOutcome::Committed { .. })
    ));
    first.ledger().abandon();
    drop(first);
    let second = executor(&path, &service, key, lookup_tool);
    let step = second.start(&op("op"), 0, pay()).unwrap();
    // Keep the directory for the test's life.
    std::mem::forget(dir);
    (service, second, step)
}

#[test]
fn a_crash_between_the_effect_and_its_report_is_reconciled_by_a_same_key_resend() {
    let (service, exec, step) = crash_after_effect(true, false);
    let CallerStep::Perform(a2) = &step else {
        panic!("{step:?}")
    };
    assert_eq!(a2.request.attempt, 2);
    let (out, performs, lookups) = drive(&exec, &service, step);
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
    assert_eq!((performs, lookups), (1, 0));
    assert_eq!(
        service.effects().len(),
        1,
        "the downstream deduped the resend"
    );
}

#[test]
fn a_crash_between_the_effect_and_its_report_is_reconciled_by_a_lookup() {
    let (service, exec, step) = crash_after_effect(false, true);
    assert!(matches!(step, CallerStep::Lookup(_)), "{step:?}");
    let (out, performs, lookups) = drive(&exec, &service, step);
    assert!(matches!(out, CallOutcome::Completed { .. }), "{out:?}");
    assert_eq!((performs, lookups), (0, 1));
    assert_eq!(service.posts().len(), 1);
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn a_crash_with_neither_keys_nor_lookup_is_an_unknown_outcome_never_a_resend() {
    let (service, exec, step) = crash_after_effect(false, false);
    let CallerStep::Done(CallOutcome::Unknown { attempt: 1, .. }) = step else {
        panic!("{step:?}")
    };
    // Asked again: still unknown, still nothing sent.
    let again = exec.start(&op("op"), 0, pay()).unwrap();
    assert!(matches!(
        again,
        CallerStep::Done(CallOutcome::Unknown { .. })
    ));
    assert_eq!(service.posts().len(), 1);
}

#[test]
fn a_retryable_failure_waits_then_runs_the_next_attempt_unless_cancelled() {
    let service = Downstream::start(Behaviour {
        throttle: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir.path().join("l.db"), &service, true, false);
    let (out, performs, _) = drive(&exec, &service, exec.start(&op("op"), 0, pay()).unwrap());
    assert!(matches!(out, CallOutcome::Completed { .. }), "{out:?}");
    assert_eq!(performs, 2);
    assert_eq!(service.effects().len(), 1);

    // Throttled, then the operation is cancelled during the wait.
    let service = Downstream::start(Behaviour {
        throttle: 1,
        ..Default::default()
    });
    let exec = executor(&dir.path().join("l2.db"), &service, true, false);
    let a = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let step = exec.report(&a, perform(&service, &a.request)).unwrap();
    let CallerStep::Retry { attempt, .. } = step else {
        panic!("{step:?}")
    };
    exec.cancel_operation(&op("op")).unwrap();
    let after = exec.retry(&attempt).unwrap();
    assert!(
        matches!(after, CallerStep::Done(CallOutcome::Cancelled { .. })),
        "{after:?}"
    );
    assert_eq!(service.effects().len(), 0);
}

#[test]
fn a_read_only_call_records_nothing_and_retries_transient_failures() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    exec.register(Arc::new(HttpTool::new(
        ToolDescriptor::read_only("weather", 1),
        Kind::Read,
        &service,
    )))
    .unwrap();
    let weather = call("call_w", "weather", r#"{"city":"Oslo"}"#);
    let a = perform_of(exec.start(&op("op"), 0, weather).unwrap());
    assert!(a.read_only);
    let retry = exec
        .report(&a, Err(ToolError::new("connection reset")))
        .unwrap();
    let CallerStep::Retry { attempt, .. } = retry else {
        panic!("{retry:?}")
    };
    assert_eq!(attempt.request.attempt, 2);
    let a2 = perform_of(exec.retry(&attempt).unwrap());
    let done = exec.report(&a2, committed(r#"{"temp":3}"#)).unwrap();
    assert!(matches!(
        done,
        CallerStep::Done(CallOutcome::Completed {
            replayed: false,
            ..
        })
    ));
    assert!(exec
        .ledger()
        .get(&a.request.execution_id)
        .unwrap()
        .is_none());
    assert_eq!(
        exec.ledger()
            .stats()
            .unwrap()
            .executions_by_status
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>(),
        0
    );
}

#[test]
fn a_side_effecting_call_passed_off_as_read_only_is_refused_and_records_nothing() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir.path().join("l.db"), &service, true, false);
    let a = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let mut forged = a.clone();
    forged.read_only = true;
    let err = exec.report(&forged, committed("1")).unwrap_err();
    assert!(matches!(err, ExecError::CallerDriven(_)), "{err:?}");
    let rec = exec.ledger().get(&a.request.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    assert_eq!(service.effects().len(), 0);
}

#[test]
fn an_independent_batch_tool_is_refused_before_anything_is_recorded() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    let desc = ToolDescriptor {
        batch: BatchMode::Independent,
        ..ToolDescriptor::side_effect("batch", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, &service)))
        .unwrap();
    let err = exec
        .start(&op("op"), 0, call("c", "batch", r#"{"items":[{}]}"#))
        .unwrap_err();
    assert!(matches!(err, ExecError::CallerDriven(_)), "{err:?}");
    assert_eq!(
        exec.ledger()
            .stats()
            .unwrap()
            .executions_by_status
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>(),
        0
    );
}

#[test]
fn a_report_that_cannot_be_recorded_is_committed_by_the_next_ask_not_in_flight() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let config = toolledger::ledger::LedgerConfig {
        busy_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let ledger = toolledger::ledger::Ledger::open(&path, config).unwrap();
    let exec = Executor::new(Arc::new(ledger), downstream::fast_config());
    exec.register(tool(&service, true, false)).unwrap();
    let a = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let done = perform(&service, &a.request);
    // Another writer holds the lock past the busy timeout: the report fails.
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert!(exec.report(&a, done).is_err());
    holder.execute_batch("ROLLBACK").unwrap();
    drop(holder);
    // Nobody in this process will report attempt 1 now, but the executor
    // kept the result it could not write: the next ask commits it (nothing
    // resent), instead of answering InFlight.
    let step = exec.start(&op("op"), 0, pay()).unwrap();
    let CallerStep::Done(out @ CallOutcome::Completed { replayed: true, .. }) = &step else {
        panic!("{step:?}")
    };
    assert_eq!(
        exec.ledger()
            .get(out.execution_id())
            .unwrap()
            .unwrap()
            .status,
        toolledger::model::ExecutionStatus::Committed
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1, "nothing resent");
}

/// `report_attempt` names the attempt by its fencing token alone (the
/// bindings' report): every rule of `report` holds for it.
fn report_by_token(
    exec: &Executor,
    a: &CallerAttempt,
    outcome: Result<PerformOutcome, ToolError>,
) -> Result<CallerStep, ExecError> {
    exec.report_attempt(&a.request.execution_id, a.request.attempt, outcome)
}

#[test]
fn a_report_by_fencing_token_commits_once_and_a_stale_one_is_refused_and_kept() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir.path().join("l.db"), &service, true, false);
    let a1 = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let id = a1.request.execution_id.clone();
    // Attempt 1 times out (unknown): the key tool is resent as attempt 2.
    let a2 = perform_of(report_by_token(&exec, &a1, Err(ToolError::new("timed out"))).unwrap());
    assert_eq!(a2.request.attempt, 2);
    assert_eq!(a2.request.downstream_key, a1.request.downstream_key);
    // Attempt 1's late answer: refused, kept as evidence, attempt 2 runs on.
    let late = report_by_token(&exec, &a1, committed(r#"{"late":1}"#)).unwrap();
    assert!(
        matches!(late, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{late:?}"
    );
    assert_eq!(exec.ledger().evidence(&id).unwrap().len(), 1);
    let done = report_by_token(&exec, &a2, perform(&service, &a2.request)).unwrap();
    let CallerStep::Done(CallOutcome::Completed {
        result_json,
        replayed: false,
        ..
    }) = done
    else {
        panic!("{done:?}")
    };
    // The committed attempt reported again with another result: the same
    // typed error as `report` gives, the stored result stands, and what was
    // reported is kept as evidence (it may be a second effect).
    let twice = report_by_token(&exec, &a2, committed(r#"{"again":1}"#)).unwrap_err();
    assert!(
        matches!(twice, ExecError::Ledger(LedgerError::AlreadyCommitted(_))),
        "{twice:?}"
    );
    let twice = exec.report(&a2, committed(r#"{"again":1}"#)).unwrap_err();
    assert!(
        matches!(twice, ExecError::Ledger(LedgerError::AlreadyCommitted(_))),
        "{twice:?}"
    );
    // The stale attempt reported again: refused, the committed result stands.
    let again = report_by_token(&exec, &a1, committed(r#"{"again":1}"#)).unwrap();
    let CallerStep::Done(CallOutcome::Completed {
        result_json: stored,
        replayed: true,
        ..
    }) = again
    else {
        panic!("{again:?}")
    };
    assert_eq!(stored, result_json);
    assert_eq!(service.effects().len(), 1);
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.attempt_count),
        (ExecutionStatus::Committed, 2)
    );
    assert_eq!(rec.result_json.as_deref(), Some(result_json.as_str()));
    // An attempt the execution never had is bad input, not evidence.
    let err = exec.report_attempt(&id, 9, committed("1")).unwrap_err();
    assert!(
        matches!(err, ExecError::Ledger(LedgerError::NoSuchAttempt { .. })),
        "{err:?}"
    );
    // Attempt 1's two late reports and attempt 2's two contradicting ones.
    let evidence = exec.ledger().evidence(&id).unwrap();
    assert_eq!(evidence.len(), 4);
    assert_eq!(
        evidence
            .iter()
            .filter(|e| e.attempt == 2 && e.result_json.as_deref() == Some(r#"{"again":1}"#))
            .count(),
        2
    );
}

#[test]
fn a_report_by_fencing_token_from_another_session_is_refused_and_a_refusal_proves_nothing() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let owner = executor(&path, &service, true, false);
    let intruder = executor(&path, &service, true, false);
    let a = perform_of(owner.start(&op("op"), 0, pay()).unwrap());
    let id = a.request.execution_id.clone();
    let refused = report_by_token(&intruder, &a, committed(r#"{"x":1}"#)).unwrap();
    assert!(
        matches!(refused, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{refused:?}"
    );
    let rec = owner.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    // The owner's report by token applies; a second one, not handed out
    // any more, saying "refused" is not taken as proof of anything.
    let done = report_by_token(&owner, &a, committed(r#"{"y":2}"#)).unwrap();
    assert!(
        matches!(
            done,
            CallerStep::Done(CallOutcome::Completed {
                replayed: false,
                ..
            })
        ),
        "{done:?}"
    );
    let refused = Ok(PerformOutcome::FailedBeforeCommit {
        reason: "rejected".into(),
        retryable: false,
    });
    let after = report_by_token(&owner, &a, refused).unwrap();
    let CallerStep::Done(CallOutcome::Completed { result_json, .. }) = after else {
        panic!("{after:?}")
    };
    assert_eq!(result_json, r#"{"y":2}"#);
    let rec = owner.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
}

#[test]
fn a_report_by_fencing_token_is_refused_for_a_read_only_tool_or_an_unknown_execution() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir.path().join("l.db"), &service, true, false);
    exec.register(Arc::new(HttpTool::new(
        ToolDescriptor::read_only("weather", 1),
        Kind::Read,
        &service,
    )))
    .unwrap();
    let read = perform_of(
        exec.start(&op("op"), 0, call("call_w", "weather", "{}"))
            .unwrap(),
    );
    let err = report_by_token(&exec, &read, committed("1")).unwrap_err();
    // Nothing is stored for a read-only call: there is nothing to name.
    assert!(
        matches!(err, ExecError::Ledger(LedgerError::NotFound(_))),
        "{err:?}"
    );
    // An id that names no stored execution.
    let a = perform_of(exec.start(&op("op"), 0, pay()).unwrap());
    let missing = toolledger::model::ExecutionId::parse("nobody:round_0:c:pay:v1").unwrap();
    let err = exec
        .report_attempt(&missing, 1, committed("1"))
        .unwrap_err();
    assert!(
        matches!(err, ExecError::Ledger(LedgerError::NotFound(_))),
        "{err:?}"
    );
    // The real attempt is still outstanding and reportable.
    let rec = exec.ledger().get(&a.request.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    let done = report_by_token(&exec, &a, committed(r#"{"ok":1}"#)).unwrap();
    assert!(matches!(
        done,
        CallerStep::Done(CallOutcome::Completed { .. })
    ));
    assert_eq!(service.effects().len(), 0);
}

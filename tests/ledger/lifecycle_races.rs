//! Lifecycle events (a cancellation, another session's steps) landing
//! between two steps of a flow that is not a first attempt: a same-key
//! resend after an unknown outcome, approvals, compensations, jobs.
//!
//! The moment is made exact with a clock: the executor reads the boot clock
//! between deciding to resend and asking the ledger for the resend, so a
//! clock whose reading runs a hook (another session's step, through its own
//! ledger on the same file) puts that step there, every run. Effects are
//! counted at the downstream.

use std::sync::{Arc, Mutex};

use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{BatchMode, CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{Clock, Ledger, LedgerConfig, ManualClock};
use toolledger::model::{ExecutionStatus, Monotonic, OperationId, OperationStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

type Hook = Box<dyn FnMut() -> bool + Send>;

/// A manual clock whose boot-clock reading first runs an armed hook, until
/// the hook says it is done.
struct RaceClock {
    inner: Arc<ManualClock>,
    hook: Mutex<Option<Hook>>,
}

impl std::fmt::Debug for RaceClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RaceClock")
    }
}

impl RaceClock {
    fn new(inner: Arc<ManualClock>) -> Arc<RaceClock> {
        Arc::new(RaceClock {
            inner,
            hook: Mutex::new(None),
        })
    }

    fn arm(&self, hook: impl FnMut() -> bool + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }
}

impl Clock for RaceClock {
    fn now_ms(&self) -> i64 {
        self.inner.now_ms()
    }

    fn monotonic(&self) -> Monotonic {
        let mut slot = self.hook.lock().unwrap();
        if let Some(hook) = slot.as_mut() {
            if hook() {
                *slot = None;
            }
        }
        drop(slot);
        self.inner.monotonic()
    }
}

/// An executor whose ledger reads `clock`, and another session (its own
/// ledger) on the same file.
fn two_sessions(path: &std::path::Path, clock: &Arc<RaceClock>) -> (Executor, Arc<Ledger>) {
    let ledger =
        Ledger::open_with_clock(path, LedgerConfig::default(), clock.clone()).expect("open");
    let exec = Executor::new(Arc::new(ledger), fast_config());
    let other = Arc::new(open_with(path, &clock.inner));
    (exec, other)
}

/// Arms `clock` to cancel `op` through `other` at the first reading after an
/// execution of `op` became unknown (the executor is between its decision
/// to resend and the resend); the cancellation's answer lands in the slot.
fn cancel_when_unknown(
    clock: &RaceClock,
    other: &Arc<Ledger>,
    op: OperationId,
) -> Arc<Mutex<Option<OperationStatus>>> {
    let answer = Arc::new(Mutex::new(None));
    let (other, slot) = (other.clone(), answer.clone());
    clock.arm(move || {
        let unknown = other
            .list(&op)
            .unwrap()
            .iter()
            .any(|r| r.status == ExecutionStatus::OutcomeUnknown);
        if unknown {
            *slot.lock().unwrap() = Some(other.cancel_operation(&op).unwrap());
        }
        unknown
    });
    answer
}

// ---------------------------------------------------------------------------
// A same-key resend that meets a cancellation
// ---------------------------------------------------------------------------

/// A key tool's request is applied downstream and its answer lost (a 500
/// after the commit): unknown. The executor decides to resend under the key
/// (the downstream dedupes); at that moment another session cancels the
/// operation. Nothing may be sent after the stop, and nothing proved the
/// first request absent: the call must stay unknown, the operation
/// `cancelled_after_side_effect`. It was recorded `cancelled_before_commit`
/// ("not found downstream after cancellation") and the operation plain
/// `cancelled`, with the effect made downstream.
#[tokio::test]
async fn a_same_key_resend_that_meets_a_cancellation_leaves_the_call_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        fail_after_commit: 1,
        ..Behaviour::default()
    });
    let clock = RaceClock::new(Arc::new(ManualClock::new(1_000_000)));
    let (exec, other) = two_sessions(&path, &clock);
    let desc = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("send_email", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, &service)))
        .unwrap();
    let cancelled = cancel_when_unknown(&clock, &other, op("o"));

    let out = exec
        .execute(
            &op("o"),
            0,
            ToolCall::custom("c1", "send_email", r#"{"to":"a@example.com"}"#),
        )
        .await
        .unwrap();

    assert_eq!(
        *cancelled.lock().unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect),
        "the other session cancelled while the call was unknown"
    );
    assert_eq!(service.effects().len(), 1, "the first request was applied");
    assert_eq!(service.posts().len(), 1, "nothing was sent after the stop");
    let rec = &other.list(&op("o")).unwrap()[0];
    let op_status = other.operation_status(&op("o")).unwrap();
    assert!(
        matches!(out, CallOutcome::Unknown { attempt: 1, .. }),
        "{out:?}; stored {:?}, operation {op_status:?}",
        rec.status
    );
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(rec.attempt_count, 1);
    assert_eq!(
        other.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

/// The same race for an independent batch whose first item's outcome is
/// unknown: the item is only resendable (a key, no lookup), the operation
/// is cancelled as the executor moves to resend it. The batch must stay
/// unknown; it was settled as if the item were absent (a cancelled batch,
/// the operation plain `cancelled`) with the item's effect made downstream.
#[tokio::test]
async fn a_batch_items_resend_that_meets_a_cancellation_leaves_the_batch_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        fail_after_commit: 1,
        ..Behaviour::default()
    });
    let clock = RaceClock::new(Arc::new(ManualClock::new(1_000_000)));
    let (exec, other) = two_sessions(&path, &clock);
    let desc = ToolDescriptor {
        idempotency_key: true,
        batch: BatchMode::Independent,
        ..ToolDescriptor::side_effect("invite", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, &service)))
        .unwrap();
    let call = ToolCall::custom("c1", "invite", r#"{"items":[{"to":"a"},{"to":"b"}]}"#);
    // Item 0's answer is lost: the batch is unknown; the executor
    // reconciles item 0 (a resend under its key), and the operation is
    // cancelled as it does.
    let cancelled = cancel_when_unknown(&clock, &other, op("o"));
    let out = exec.execute(&op("o"), 0, call).await.unwrap();

    assert_eq!(
        *cancelled.lock().unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    assert_eq!(service.effects().len(), 1, "item 0 was applied");
    assert_eq!(service.posts().len(), 1, "nothing was sent after the stop");
    let rec = &other.list(&op("o")).unwrap()[0];
    let op_status = other.operation_status(&op("o")).unwrap();
    assert!(
        matches!(out, CallOutcome::Unknown { .. }),
        "{out:?}; stored {:?}, operation {op_status:?}",
        rec.status
    );
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(
        other.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

// ---------------------------------------------------------------------------
// A found effect that meets another resolver's "not found"
// ---------------------------------------------------------------------------

/// A lookup tool whose lookup first lets another session settle the call
/// (the app, after asking the user, says "not there": `NotFoundAbandon`),
/// then asks the downstream.
struct AbandonDuringLookup {
    inner: HttpTool,
    other: Arc<Ledger>,
    attempt: toolledger::ledger::AttemptId,
    settled: Mutex<Option<Result<toolledger::ledger::Resolved, toolledger::ledger::Error>>>,
}

#[async_trait::async_trait]
impl toolledger::executor::ToolHandler for AbandonDuringLookup {
    fn descriptor(&self) -> ToolDescriptor {
        self.inner.descriptor()
    }

    async fn perform(
        &self,
        req: toolledger::executor::ToolRequest,
    ) -> Result<toolledger::executor::PerformOutcome, toolledger::executor::ToolError> {
        self.inner.perform(req).await
    }

    async fn lookup(
        &self,
        req: toolledger::executor::ToolRequest,
    ) -> Result<toolledger::executor::LookupOutcome, toolledger::executor::ToolError> {
        let settled = self.other.resolve_unknown(
            &self.attempt,
            toolledger::ledger::Resolution::NotFoundAbandon {
                reason: "the user saw no payment".into(),
            },
        );
        *self.settled.lock().unwrap() = Some(settled);
        self.inner.lookup(req).await
    }
}

/// Past the landing window of unknown attempt `attempt`, runs `call` through
/// a new executor whose tool (`desc`, at `service`) is reconciled with a
/// lookup, during which the app (a third session, returned) settles the
/// call as absent; checks that the app's settlement came first.
async fn execute_while_the_app_settles(
    path: &std::path::Path,
    clock: &Arc<ManualClock>,
    service: &Downstream,
    desc: ToolDescriptor,
    attempt: toolledger::ledger::AttemptId,
    call: ToolCall,
) -> (
    Arc<Ledger>,
    Result<CallOutcome, toolledger::executor::Error>,
) {
    // Past the landing window: a lookup's answer counts.
    clock.advance(200_000);
    let app = Arc::new(open_with(path, clock));
    let exec = Executor::new(Arc::new(open_with(path, clock)), fast_config());
    let tool = Arc::new(AbandonDuringLookup {
        inner: HttpTool::new(desc, Kind::Effect, service),
        other: app.clone(),
        attempt,
        settled: Mutex::new(None),
    });
    exec.register(tool.clone()).unwrap();
    let out = exec.execute(&op("o"), 0, call).await;
    assert!(
        matches!(
            tool.settled.lock().unwrap().as_ref(),
            Some(Ok(toolledger::ledger::Resolved::Failed))
        ),
        "the app settled the call first"
    );
    (app, out)
}

/// Another session's request was applied downstream and its outcome became
/// unknown. An executor reconciles it with a lookup; while the lookup asks,
/// the app (a third session) settles the call as absent. The lookup finds
/// the effect. The ledger refuses the found result (the call is settled),
/// and it dropped it: no evidence, the execution prunable as a failure with
/// the effect made downstream, and the executor's caller got a bare
/// `InvalidTransition`. The found result must be kept as evidence (which
/// also keeps the execution from being pruned) and the caller told the
/// stored truth.
#[tokio::test]
async fn a_found_effect_refused_because_another_resolver_said_not_found_is_kept_as_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour::default());
    let inner = Arc::new(ManualClock::new(1_000_000));
    let pay = r#"{"amount":"12.50"}"#;
    // Session 1 sends the payment and loses its answer.
    let first = open_with(&path, &inner);
    let t1 = ticket(first.begin(&op("o"), 0, &spec("c1", "pay", pay)).unwrap());
    let sent = support::downstream::request_blocking(
        service.addr(),
        "POST",
        "/effects",
        Some(t1.downstream_key.as_str()),
        pay,
        std::time::Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(sent.status, 201);
    first
        .mark_outcome_unknown(&t1.attempt_id(), "connection reset")
        .unwrap();
    let desc = ToolDescriptor {
        lookup: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    let call = ToolCall::custom("c1", "pay", pay);
    let (app, out) =
        execute_while_the_app_settles(&path, &inner, &service, desc, t1.attempt_id(), call).await;

    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1, "nothing sent again");
    assert_eq!(service.lookups().len(), 1);
    let evidence = app.evidence(&t1.execution_id).unwrap();
    let rec = app.get(&t1.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    assert_eq!(evidence.len(), 1, "the found result is kept; {out:?}");
    assert_eq!(evidence[0].kind, "commit");
    assert_eq!(evidence[0].attempt, 1);
    let found = service.effects()[0].id.clone();
    assert_eq!(evidence[0].external_id.as_deref(), Some(found.as_str()));
    assert!(evidence[0]
        .result_json
        .as_deref()
        .is_some_and(|r| r.contains(&found)));
    assert!(
        matches!(
            out,
            Ok(CallOutcome::Failed {
                retryable: false,
                ..
            })
        ),
        "{out:?}"
    );
    // Kept: a prune of everything finished never takes it.
    let pruned = app
        .prune(toolledger::ledger::PruneCutoff::BeforeMs(i64::MAX), true)
        .unwrap();
    assert_eq!(pruned.executions, 0);
    assert!(app.get(&t1.execution_id).unwrap().is_some());
}

/// An executor's lookup of an unknown call finds nothing (the request never
/// reached the service); while it looked, the app settled the call as
/// absent (`NotFoundAbandon`). The executor then resends under the key, as
/// its "not found" past the window allows: the ledger refuses (the call is
/// settled), and the executor's caller got a bare `InvalidTransition`
/// error for a call whose stored truth is a plain failure. Nothing may be
/// sent, and the caller must be told what is stored.
#[tokio::test]
async fn a_resend_after_a_not_found_meets_another_resolvers_settlement_answers_the_stored_truth() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Behaviour::default()
    });
    let inner = Arc::new(ManualClock::new(1_000_000));
    let pay = r#"{"amount":"12.50"}"#;
    // Session 1 lost its request before it went out: unknown all the same.
    let first = open_with(&path, &inner);
    let t1 = ticket(first.begin(&op("o"), 0, &spec("c1", "pay", pay)).unwrap());
    first
        .mark_outcome_unknown(&t1.attempt_id(), "connection reset")
        .unwrap();
    let desc = ToolDescriptor {
        lookup: true,
        idempotency_key: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    let call = ToolCall::custom("c1", "pay", pay);
    let (app, out) =
        execute_while_the_app_settles(&path, &inner, &service, desc, t1.attempt_id(), call).await;

    assert_eq!(service.lookups().len(), 1);
    assert_eq!(service.posts().len(), 0, "nothing sent");
    let rec = app.get(&t1.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    assert_eq!(rec.attempt_count, 1);
    assert!(
        matches!(
            out,
            Ok(CallOutcome::Failed {
                retryable: false,
                ..
            })
        ),
        "{out:?}"
    );
}

/// Row 23's race for an independent batch: item 0 was applied downstream
/// and the batch's outcome became unknown; while the executor's lookup of
/// the item asks, the app settles the batch as absent. The lookup finds
/// the item. Recording it was refused (the batch is settled) and the item
/// dropped: no evidence, and the executor's caller got a bare
/// `InvalidTransition`. It must be kept as evidence and the caller told the
/// stored truth; nothing is sent.
#[tokio::test]
async fn a_batch_item_found_after_another_resolver_said_not_found_is_kept_as_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour::default());
    let inner = Arc::new(ManualClock::new(1_000_000));
    let args = r#"{"items":[{"to":"a"},{"to":"b"}]}"#;
    let first = open_with(&path, &inner);
    let t1 = ticket(
        first
            .begin(&op("o"), 0, &spec("c1", "invite", args))
            .unwrap(),
    );
    let item_key = t1.execution_id.batch_item(0).downstream_key();
    let sent = support::downstream::request_blocking(
        service.addr(),
        "POST",
        "/effects",
        Some(item_key.as_str()),
        r#"{"to":"a"}"#,
        std::time::Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(sent.status, 201);
    first
        .mark_outcome_unknown(&t1.attempt_id(), "connection reset")
        .unwrap();
    let desc = ToolDescriptor {
        lookup: true,
        batch: BatchMode::Independent,
        ..ToolDescriptor::side_effect("invite", 1)
    };
    let call = ToolCall::custom("c1", "invite", args);
    let (app, out) =
        execute_while_the_app_settles(&path, &inner, &service, desc, t1.attempt_id(), call).await;

    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1, "nothing sent again");
    let rec = app.get(&t1.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    let evidence = app.evidence(&t1.execution_id).unwrap();
    assert_eq!(evidence.len(), 1, "the found item is kept; {out:?}");
    assert_eq!(evidence[0].kind, "batch_item");
    assert_eq!(evidence[0].attempt, 1);
    assert_eq!(evidence[0].item_index, Some(0));
    let found = service.effects()[0].id.clone();
    assert_eq!(evidence[0].external_id.as_deref(), Some(found.as_str()));
    assert!(
        matches!(
            out,
            Ok(CallOutcome::Failed {
                retryable: false,
                ..
            })
        ),
        "{out:?}"
    );
    let pruned = app
        .prune(toolledger::ledger::PruneCutoff::BeforeMs(i64::MAX), true)
        .unwrap();
    assert_eq!(pruned.executions, 0);
}

/// Two sessions' lookups of one unknown attempt: the first finds effect A
/// and commits it; the second finds effect B (another external id: the
/// downstream holds a second effect, or says so). The second is refused
/// (the call is committed), and it was dropped without a trace, its caller
/// told A's result. B must be kept as evidence; the stored result stays A.
/// The same finding again (A) keeps nothing.
#[test]
fn a_different_effect_found_for_a_call_committed_by_another_lookup_is_kept_as_evidence() {
    use toolledger::ledger::{Resolution, Resolved};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (owner, clock) = open_at(&path);
    let t1 = ticket(
        owner
            .begin(&op("o"), 0, &spec("c1", "pay", r#"{"amount":"12.50"}"#))
            .unwrap(),
    );
    owner
        .mark_outcome_unknown(&t1.attempt_id(), "connection reset")
        .unwrap();
    let other = open_with(&path, &clock);
    let found = |ext: &str| Resolution::Found {
        result_json: format!(r#"{{"paid":"{ext}"}}"#),
        external_id: Some(ext.into()),
    };
    assert!(matches!(
        owner.resolve_unknown(&t1.attempt_id(), found("pay_A")),
        Ok(Resolved::Committed(_))
    ));
    let same = other.resolve_unknown(&t1.attempt_id(), found("pay_A"));
    assert!(
        matches!(
            same,
            Err(toolledger::ledger::Error::InvalidTransition {
                from: ExecutionStatus::Committed,
                ..
            })
        ),
        "{same:?}"
    );
    assert_eq!(other.evidence(&t1.execution_id).unwrap().len(), 0);
    let second = other.resolve_unknown(&t1.attempt_id(), found("pay_B"));
    assert!(
        matches!(
            second,
            Err(toolledger::ledger::Error::InvalidTransition {
                from: ExecutionStatus::Committed,
                ..
            })
        ),
        "{second:?}"
    );
    let rec = other.get(&t1.execution_id).unwrap().unwrap();
    assert_eq!(rec.external_id.as_deref(), Some("pay_A"));
    let evidence = other.evidence(&t1.execution_id).unwrap();
    assert_eq!(evidence.len(), 1, "the second effect is kept");
    assert_eq!(evidence[0].kind, "commit");
    assert_eq!(evidence[0].attempt, 1);
    assert_eq!(evidence[0].external_id.as_deref(), Some("pay_B"));
}

/// A job tool's request started a job downstream and its owner died before
/// the job was recorded: unknown. The app, asking the service too early,
/// settles the call as absent; then the job's webhook says it succeeded,
/// with its result. The execution stays as settled (`AlreadyFinal`), but
/// the job's result was dropped: no evidence, the execution prunable as a
/// failure although its effect happened. It must be kept as evidence.
#[test]
fn a_job_result_for_a_call_settled_as_absent_is_kept_as_evidence() {
    use toolledger::ledger::{JobApplied, JobUpdate, Resolution, Resolved};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (owner, clock) = open_at(&path);
    let t1 = ticket(
        owner
            .begin(&op("o"), 0, &spec("c1", "export", r#"{"what":"all"}"#))
            .unwrap(),
    );
    owner.abandon();
    let app = open_with(&path, &clock);
    app.recover().unwrap();
    assert_eq!(
        app.get(&t1.execution_id).unwrap().unwrap().status,
        ExecutionStatus::OutcomeUnknown
    );
    let settled = app
        .resolve_unknown(
            &t1.attempt_id(),
            Resolution::NotFoundAbandon {
                reason: "no export found".into(),
            },
        )
        .unwrap();
    assert_eq!(settled, Resolved::Failed);
    let result = r#"{"export":"job_7","rows":12}"#;
    let applied = app
        .ingest_webhook(
            "exports",
            "evt_1",
            &t1.execution_id,
            &JobUpdate::Succeeded {
                result_json: result.into(),
            },
        )
        .unwrap();
    assert_eq!(
        applied,
        JobApplied::AlreadyFinal(ExecutionStatus::FailedBeforeCommit)
    );
    let evidence = app.evidence(&t1.execution_id).unwrap();
    assert_eq!(evidence.len(), 1, "the job's result is kept");
    assert_eq!(evidence[0].kind, "commit");
    assert_eq!(evidence[0].result_json.as_deref(), Some(result));
    // A repeat of the event is ignored, and keeps nothing twice.
    assert_eq!(
        app.ingest_webhook(
            "exports",
            "evt_1",
            &t1.execution_id,
            &JobUpdate::Succeeded {
                result_json: result.into(),
            },
        )
        .unwrap(),
        JobApplied::DuplicateEvent
    );
    assert_eq!(app.evidence(&t1.execution_id).unwrap().len(), 1);
    let pruned = app
        .prune(toolledger::ledger::PruneCutoff::BeforeMs(i64::MAX), true)
        .unwrap();
    assert_eq!(pruned.executions, 0);
}

/// A caller-driven lookup tool (the caller runs `perform` and `lookup`).
struct CallerLookupPay;

#[async_trait::async_trait]
impl toolledger::executor::ToolHandler for CallerLookupPay {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            lookup: true,
            ..ToolDescriptor::side_effect("pay", 1)
        }
    }

    async fn perform(
        &self,
        _req: toolledger::executor::ToolRequest,
    ) -> Result<toolledger::executor::PerformOutcome, toolledger::executor::ToolError> {
        unreachable!("caller-driven only")
    }
}

fn found_pay() -> Result<toolledger::executor::LookupOutcome, toolledger::executor::ToolError> {
    Ok(toolledger::executor::LookupOutcome::Found {
        result_json: r#"{"paid":"pay_1"}"#.into(),
        external_id: Some("pay_1".into()),
    })
}

/// A caller-driven `pay` (`CallerLookupPay`) whose first attempt lost its
/// answer: reported unknown, the caller handed a `Lookup`. Returns the
/// executor, the app's own ledger on the same file (another session), the
/// execution id and the lookup attempt.
fn caller_driven_pay_at_its_lookup(
    path: &std::path::Path,
) -> (
    Executor,
    Ledger,
    toolledger::model::ExecutionId,
    toolledger::executor::CallerAttempt,
) {
    use toolledger::executor::{CallerStep, PerformOutcome};
    let clock = Arc::new(ManualClock::new(1_000_000));
    let exec = Executor::new(Arc::new(open_with(path, &clock)), fast_config());
    exec.register(Arc::new(CallerLookupPay)).unwrap();
    let app = open_with(path, &clock);
    let call = ToolCall::custom("c1", "pay", r#"{"amount":"12.50"}"#);
    let CallerStep::Perform(a) = exec.start(&op("o"), 0, call).unwrap() else {
        panic!("expected Perform")
    };
    let id = a.request.execution_id.clone();
    let step = exec
        .report(
            &a,
            Ok(PerformOutcome::Unknown {
                reason: "connection reset".into(),
            }),
        )
        .unwrap();
    let CallerStep::Lookup(l) = step else {
        panic!("{step:?}")
    };
    (exec, app, id, l)
}

/// Row 23's race for a caller-driven call: the caller's payment lost its
/// answer (unknown) and it is handed a `Lookup`; while its lookup runs, the
/// app (another session) settles the call as absent. The lookup finds the
/// payment. `report_lookup` saw the row no longer unknown and answered the
/// stored status without asking the ledger: the found payment was dropped,
/// no evidence, the execution prunable as a failure. It must be kept as
/// evidence, as the executor's own lookup keeps it.
#[test]
fn a_caller_driven_found_reported_after_another_resolver_said_not_found_is_kept_as_evidence() {
    use toolledger::executor::CallerStep;
    use toolledger::ledger::{AttemptId, Resolution, Resolved};
    let dir = tempfile::tempdir().unwrap();
    let (exec, app, id, l) = caller_driven_pay_at_its_lookup(&dir.path().join("l.db"));
    let settled = app
        .resolve_unknown(
            &AttemptId::new(id.clone(), 1),
            Resolution::NotFoundAbandon {
                reason: "the user saw no payment".into(),
            },
        )
        .unwrap();
    assert_eq!(settled, Resolved::Failed);

    let step = exec.report_lookup(&l, found_pay()).unwrap();

    assert!(
        matches!(
            step,
            CallerStep::Done(CallOutcome::Failed {
                retryable: false,
                ..
            })
        ),
        "{step:?}"
    );
    let rec = app.get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    let evidence = app.evidence(&id).unwrap();
    assert_eq!(evidence.len(), 1, "the found payment is kept");
    assert_eq!(evidence[0].kind, "commit");
    assert_eq!(evidence[0].attempt, 1);
    assert_eq!(evidence[0].external_id.as_deref(), Some("pay_1"));
    let pruned = app
        .prune(toolledger::ledger::PruneCutoff::BeforeMs(i64::MAX), true)
        .unwrap();
    assert_eq!(pruned.executions, 0);
}

/// The same report when another session resent the call meanwhile (the
/// app's `NotFoundRetry`: attempt 2, running there): the lookup of attempt
/// 1 found the payment. It was dropped without evidence; the executor's
/// own lookup, refused by the fence, keeps it (a stale attempt's commit).
#[test]
fn a_caller_driven_found_for_an_attempt_resent_meanwhile_is_kept_as_evidence() {
    use toolledger::executor::CallerStep;
    use toolledger::ledger::{AttemptId, Resolution, Resolved};
    let dir = tempfile::tempdir().unwrap();
    let (exec, app, id, l) = caller_driven_pay_at_its_lookup(&dir.path().join("l.db"));
    let resent = app
        .resolve_unknown(&AttemptId::new(id.clone(), 1), Resolution::NotFoundRetry)
        .unwrap();
    assert!(matches!(resent, Resolved::Retry(_)), "{resent:?}");

    let step = exec.report_lookup(&l, found_pay()).unwrap();

    assert!(
        matches!(step, CallerStep::Done(CallOutcome::InFlight { .. })),
        "{step:?}"
    );
    let rec = app.get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    assert_eq!(rec.attempt_count, 2);
    let evidence = app.evidence(&id).unwrap();
    assert_eq!(evidence.len(), 1, "the found payment is kept");
    assert_eq!(evidence[0].kind, "commit");
    assert_eq!(evidence[0].attempt, 1);
    assert_eq!(evidence[0].external_id.as_deref(), Some("pay_1"));
}

/// An operation is cancelled while two of its calls are unknown
/// (`cancelled_after_side_effect`). The app settles both as absent, one
/// then the other; between the two, a lookup of the first finds its
/// effect, which is kept as evidence. The operation must say an effect
/// exists: it was plain `cancelled` (the first settlement made it so, the
/// found effect left it so), and the app that trusts the operation's
/// status to know whether anything needs undoing is told nothing happened.
#[test]
fn an_effect_found_after_a_cancelled_call_was_settled_leaves_the_operation_cancelled_after_side_effect(
) {
    use toolledger::ledger::{Resolution, Resolved};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (owner, clock) = open_at(&path);
    let pay = r#"{"amount":"12.50"}"#;
    let t1 = ticket(owner.begin(&op("o"), 0, &spec("c1", "pay", pay)).unwrap());
    let t2 = ticket(owner.begin(&op("o"), 0, &spec("c2", "pay", pay)).unwrap());
    for t in [&t1, &t2] {
        owner
            .mark_outcome_unknown(&t.attempt_id(), "connection reset")
            .unwrap();
    }
    let app = open_with(&path, &clock);
    assert_eq!(
        app.cancel_operation(&op("o")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    let abandon = || Resolution::NotFoundAbandon {
        reason: "the user saw no payment".into(),
    };
    assert_eq!(
        app.resolve_unknown(&t1.attempt_id(), abandon()).unwrap(),
        Resolved::Cancelled
    );
    // The late lookup of c1 finds its payment.
    let late = owner.resolve_unknown(
        &t1.attempt_id(),
        Resolution::Found {
            result_json: r#"{"paid":"pay_1"}"#.into(),
            external_id: Some("pay_1".into()),
        },
    );
    assert!(
        matches!(
            late,
            Err(toolledger::ledger::Error::InvalidTransition {
                from: ExecutionStatus::CancelledBeforeCommit,
                ..
            })
        ),
        "{late:?}"
    );
    assert_eq!(app.evidence(&t1.execution_id).unwrap().len(), 1);
    assert_eq!(
        app.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect),
        "an effect of the operation was found"
    );
    // Settling the other call as absent does not make it plain `cancelled`,
    // nor does cancelling the operation again.
    assert_eq!(
        app.resolve_unknown(&t2.attempt_id(), abandon()).unwrap(),
        Resolved::Cancelled
    );
    assert_eq!(
        app.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    assert_eq!(
        app.cancel_operation(&op("o")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    assert_eq!(
        app.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

/// The operation's only call settled as absent makes a cancelled operation
/// plain `cancelled`; the payment found afterwards makes it
/// `cancelled_after_side_effect` again (an app reading "cancelled" would
/// think nothing needs undoing).
#[test]
fn an_effect_found_after_the_operation_became_plain_cancelled_marks_it_cancelled_after_side_effect()
{
    use toolledger::ledger::{Resolution, Resolved};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (owner, clock) = open_at(&path);
    let t1 = ticket(
        owner
            .begin(&op("o"), 0, &spec("c1", "pay", r#"{"amount":"12.50"}"#))
            .unwrap(),
    );
    owner
        .mark_outcome_unknown(&t1.attempt_id(), "connection reset")
        .unwrap();
    let app = open_with(&path, &clock);
    assert_eq!(
        app.cancel_operation(&op("o")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    assert_eq!(
        app.resolve_unknown(
            &t1.attempt_id(),
            Resolution::NotFoundAbandon {
                reason: "the user saw no payment".into(),
            },
        )
        .unwrap(),
        Resolved::Cancelled
    );
    assert_eq!(
        app.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::Cancelled),
        "nothing could have happened, as far as was known"
    );
    let late = owner.resolve_unknown(
        &t1.attempt_id(),
        Resolution::Found {
            result_json: r#"{"paid":"pay_1"}"#.into(),
            external_id: Some("pay_1".into()),
        },
    );
    assert!(late.is_err(), "{late:?}");
    assert_eq!(app.evidence(&t1.execution_id).unwrap().len(), 1);
    assert_eq!(
        app.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect),
        "the found payment is an effect of the operation"
    );
}

// ---------------------------------------------------------------------------
// Approvals and compensations from two sessions (these held)
// ---------------------------------------------------------------------------

fn approval_tool(service: &Downstream) -> Arc<HttpTool> {
    let desc = ToolDescriptor {
        requires_approval: true,
        idempotency_key: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    Arc::new(HttpTool::new(desc, Kind::Effect, service))
}

/// One waiting call approved at once from two sessions (the phone and its
/// watch extension): one payment. The slower approval approves nothing
/// more and answers where the call stands (the other session running it,
/// or its result replayed), not an error and not a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_approved_from_two_sessions_at_once_pays_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Behaviour::default()
    });
    let a = executor_at(&path);
    let b = executor_at(&path);
    a.register(approval_tool(&service)).unwrap();
    b.register(approval_tool(&service)).unwrap();
    let call = ToolCall::custom("c1", "pay", r#"{"amount":"12.50"}"#);
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        ..
    } = a.execute(&op("o"), 0, call).await.unwrap()
    else {
        panic!("approval expected")
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let run = |exec: Executor| {
        let (id, digest, barrier) = (execution_id.clone(), args_digest.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            exec.approve(&id, &digest, None).await
        })
    };
    let (ra, rb) = (run(a.clone()), run(b.clone()));
    let outs = [ra.await.unwrap(), rb.await.unwrap()];
    let ran = outs
        .iter()
        .filter(|o| {
            matches!(
                o,
                Ok(CallOutcome::Completed {
                    replayed: false,
                    ..
                })
            )
        })
        .count();
    let answered = outs
        .iter()
        .filter(|o| {
            matches!(
                o,
                Ok(CallOutcome::Completed { replayed: true, .. } | CallOutcome::InFlight { .. })
            )
        })
        .count();
    assert_eq!((ran, answered), (1, 1), "{outs:?}");
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
    let rec = a.ledger().get(&execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.attempt_count, 1);
}

/// An approval given while the ledger is suspended is refused
/// (`Suspended`) with nothing written and nothing run; after `resume` the
/// same approval runs the call once, and another session's approval of it
/// meanwhile would have run it instead (here: none).
#[tokio::test]
async fn an_approval_while_suspended_runs_nothing_and_runs_once_after_resume() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Behaviour::default()
    });
    let exec = executor_at(&path);
    exec.register(approval_tool(&service)).unwrap();
    let call = ToolCall::custom("c1", "pay", r#"{"amount":"12.50"}"#);
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        ..
    } = exec.execute(&op("o"), 0, call.clone()).await.unwrap()
    else {
        panic!("approval expected")
    };
    exec.ledger().suspend().unwrap();
    let refused = exec.approve(&execution_id, &args_digest, None).await;
    assert!(
        matches!(
            refused,
            Err(toolledger::executor::Error::Ledger(
                toolledger::ledger::Error::Store(toolledger::ledger::StorageError::Suspended)
            ))
        ),
        "{refused:?}"
    );
    exec.ledger().resume().unwrap();
    assert_eq!(
        exec.ledger().get(&execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );
    assert_eq!(service.posts().len(), 0);
    let out = exec
        .approve(&execution_id, &args_digest, None)
        .await
        .unwrap();
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
    let again = exec.execute(&op("o"), 0, call).await.unwrap();
    assert!(
        matches!(again, CallOutcome::Completed { replayed: true, .. }),
        "{again:?}"
    );
    assert_eq!(service.effects().len(), 1);
}

/// The same compensation asked from two sessions at once (one refund call
/// of the model, retried by the app and its extension): one refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_compensation_asked_from_two_sessions_at_once_refunds_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Behaviour::default()
    });
    let pay = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    let refund = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("refund", 1)
    };
    let a = executor_at(&path);
    let b = executor_at(&path);
    for exec in [&a, &b] {
        exec.register(Arc::new(HttpTool::new(pay.clone(), Kind::Effect, &service)))
            .unwrap();
        exec.register(Arc::new(HttpTool::new(
            refund.clone(),
            Kind::Effect,
            &service,
        )))
        .unwrap();
    }
    let paid = a
        .execute(
            &op("o"),
            0,
            ToolCall::custom("c1", "pay", r#"{"amount":"12.50"}"#),
        )
        .await
        .unwrap();
    let original = paid.execution_id().clone();
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let run = |exec: Executor| {
        let (original, barrier) = (original.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            exec.compensate(
                &original,
                &op("o"),
                1,
                ToolCall::custom("r1", "refund", r#"{"amount":"12.50"}"#),
            )
            .await
        })
    };
    let (ra, rb) = (run(a.clone()), run(b.clone()));
    let outs = [ra.await.unwrap().unwrap(), rb.await.unwrap().unwrap()];
    let ran = outs
        .iter()
        .filter(|o| {
            matches!(
                o,
                CallOutcome::Completed {
                    replayed: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(ran, 1, "{outs:?}");
    assert!(
        outs.iter().all(|o| matches!(
            o,
            CallOutcome::Completed { .. } | CallOutcome::InFlight { .. }
        )),
        "{outs:?}"
    );
    let refunds = service
        .effects()
        .iter()
        .filter(|e| e.body.contains("12.50"))
        .count();
    assert_eq!(refunds, 2, "one payment and one refund");
    assert_eq!(service.posts().len(), 2);
    assert_eq!(a.ledger().compensations(&original).unwrap().len(), 1);
}

/// Approving again a call approved before for the same arguments (a double
/// tap, a retry after the app died between the approval and the run)
/// approves nothing more and answers where the call stands; a rejected
/// call, a call that never waited for an approval and other arguments stay
/// refused, with nothing run.
#[tokio::test]
async fn approving_again_answers_where_the_call_stands_and_runs_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Behaviour::default()
    });
    let exec = executor_at(&path);
    exec.register(approval_tool(&service)).unwrap();
    let plain = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("ship", 1)
    };
    exec.register(Arc::new(HttpTool::new(plain, Kind::Effect, &service)))
        .unwrap();
    let waiting = |call_id: &'static str| {
        let exec = exec.clone();
        async move {
            let call = ToolCall::custom(call_id, "pay", r#"{"amount":"12.50"}"#);
            match exec.execute(&op("o"), 0, call).await.unwrap() {
                CallOutcome::NeedsApproval {
                    execution_id,
                    args_digest,
                    ..
                } => (execution_id, args_digest),
                other => panic!("approval expected: {other:?}"),
            }
        }
    };

    // A double tap after the call ran: its result again, one payment.
    let (id, digest) = waiting("c1").await;
    let first = exec.approve(&id, &digest, None).await.unwrap();
    let CallOutcome::Completed {
        result_json,
        replayed: false,
        ..
    } = &first
    else {
        panic!("{first:?}")
    };
    let again = exec.approve(&id, &digest, None).await.unwrap();
    let CallOutcome::Completed {
        result_json: again_json,
        replayed: true,
        ..
    } = &again
    else {
        panic!("{again:?}")
    };
    assert_eq!(again_json, result_json);
    assert_eq!(service.effects().len(), 1);
    // Other arguments are still refused.
    let wrong = toolledger::model::ArgsDigest::parse("0".repeat(64)).unwrap();
    let mismatch = exec.approve(&id, &wrong, None).await;
    assert!(
        matches!(
            mismatch,
            Err(toolledger::executor::Error::Ledger(
                toolledger::ledger::Error::DigestMismatch { .. }
            ))
        ),
        "{mismatch:?}"
    );

    // Approved, and the app died before the run: approving again runs it,
    // once.
    let (id2, digest2) = waiting("c2").await;
    exec.ledger().approve(&id2, &digest2, None).unwrap();
    let ran = exec.approve(&id2, &digest2, None).await.unwrap();
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
    assert_eq!(exec.ledger().get(&id2).unwrap().unwrap().attempt_count, 1);
    assert_eq!(service.effects().len(), 2);

    // A rejected call stays rejected.
    let (id3, digest3) = waiting("c3").await;
    exec.ledger().reject(&id3, &digest3, "no").unwrap();
    let refused = exec.approve(&id3, &digest3, None).await;
    assert!(
        matches!(
            refused,
            Err(toolledger::executor::Error::Ledger(
                toolledger::ledger::Error::InvalidTransition {
                    from: ExecutionStatus::Rejected,
                    ..
                }
            ))
        ),
        "{refused:?}"
    );

    // A call that never waited for an approval is not "approved again".
    let shipped = exec
        .execute(&op("o"), 0, ToolCall::custom("c4", "ship", r#"{"box":1}"#))
        .await
        .unwrap();
    let CallOutcome::Completed { execution_id, .. } = &shipped else {
        panic!("{shipped:?}")
    };
    let rec = exec.ledger().get(execution_id).unwrap().unwrap();
    let not_waiting = exec.approve(execution_id, &rec.args_digest, None).await;
    assert!(
        matches!(
            not_waiting,
            Err(toolledger::executor::Error::Ledger(
                toolledger::ledger::Error::InvalidTransition {
                    from: ExecutionStatus::ResultDelivered | ExecutionStatus::Committed,
                    ..
                }
            ))
        ),
        "{not_waiting:?}"
    );
    assert_eq!(service.effects().len(), 3);
    assert_eq!(
        exec.ledger().get(&id3).unwrap().unwrap().status,
        ExecutionStatus::Rejected
    );
}

/// A second tap of approve on a call whose outcome became unknown (a tool
/// with no key and no lookup: nothing can settle it but the app), on one
/// that failed for good, and on one whose operation was cancelled after the
/// approval: each answers where the call stands and sends nothing more.
#[tokio::test]
async fn approving_again_after_unknown_failed_or_cancelled_sends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        close_after_commit: 1,
        ..Behaviour::default()
    });
    let exec = executor_at(&path);
    // No key, no lookup.
    let desc = ToolDescriptor {
        requires_approval: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, &service)))
        .unwrap();
    let waiting = |op_name: &'static str| {
        let exec = exec.clone();
        async move {
            let call = ToolCall::custom("c1", "pay", r#"{"amount":"12.50"}"#);
            match exec.execute(&op(op_name), 0, call).await.unwrap() {
                CallOutcome::NeedsApproval {
                    execution_id,
                    args_digest,
                    ..
                } => (execution_id, args_digest),
                other => panic!("approval expected: {other:?}"),
            }
        }
    };
    // Unknown: the request landed, its answer was lost.
    let (id, digest) = waiting("o1").await;
    let first = exec.approve(&id, &digest, None).await.unwrap();
    assert!(matches!(first, CallOutcome::Unknown { .. }), "{first:?}");
    assert_eq!(service.effects().len(), 1);
    let again = exec.approve(&id, &digest, None).await.unwrap();
    assert!(matches!(again, CallOutcome::Unknown { .. }), "{again:?}");
    assert_eq!(
        service.effects().len(),
        1,
        "a second tap resent an unknown call"
    );
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(rec.attempt_count, 1);

    // Approved, then the operation cancelled before it ran: nothing runs.
    let (id2, digest2) = waiting("o2").await;
    exec.ledger().approve(&id2, &digest2, None).unwrap();
    exec.ledger().cancel_operation(&op("o2")).unwrap();
    let cancelled = exec.approve(&id2, &digest2, None).await;
    println!("cancelled: {cancelled:?}");
    assert!(
        matches!(cancelled, Ok(CallOutcome::Cancelled { .. })),
        "{cancelled:?}"
    );
    assert_eq!(service.effects().len(), 1);
    let again = exec.approve(&id2, &digest2, None).await;
    assert!(
        matches!(again, Ok(CallOutcome::Cancelled { .. })),
        "{again:?}"
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(exec.ledger().get(&id2).unwrap().unwrap().attempt_count, 0);
}

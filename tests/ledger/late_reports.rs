//! Caller-driven reports of attempts this executor did not hand out (a
//! result reported to a reopened ledger) and interrupted reports, attacked
//! where they meet another session's moves: the owner's own report landing
//! between the check and the takeover.

use std::sync::{Arc, Mutex};

use support::*;
use toolledger::executor::{
    CallerStep, Executor, PerformOutcome, ToolDescriptor, ToolError, ToolHandler, ToolRequest,
};
use toolledger::ledger::{Clock, Ledger, LedgerConfig, ManualClock};
use toolledger::model::{ExecutionStatus, Monotonic};
use toolledger_test_support as support;

type Hook = Box<dyn FnOnce() + Send>;

/// A shared manual clock that runs a hook (once) at the first reading of
/// the wall clock after it is armed: where a ledger step reads the time
/// before its write transaction, another session moves in between.
#[derive(Debug)]
struct HookClock {
    inner: Arc<ManualClock>,
    hook: Mutex<Option<HookBox>>,
    /// Readings of the wall clock to let pass before the hook runs.
    skip: std::sync::atomic::AtomicUsize,
}

struct HookBox(Hook);

impl std::fmt::Debug for HookBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("hook")
    }
}

impl HookClock {
    fn arm(&self, hook: impl FnOnce() + Send + 'static) {
        *self.hook.lock().unwrap() = Some(HookBox(Box::new(hook)));
    }
}

impl Clock for HookClock {
    fn now_ms(&self) -> i64 {
        use std::sync::atomic::Ordering;
        let skip = self
            .skip
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if skip.is_ok() {
            return self.inner.now_ms();
        }
        let hook = self.hook.lock().unwrap().take();
        if let Some(HookBox(hook)) = hook {
            hook();
        }
        self.inner.now_ms()
    }

    fn monotonic(&self) -> Monotonic {
        self.inner.monotonic()
    }
}

/// An email: neither an idempotency key nor a lookup.
struct Mail;

#[async_trait::async_trait]
impl ToolHandler for Mail {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::side_effect("mail", 1)
    }

    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        unreachable!("caller-driven only")
    }
}

fn config() -> toolledger::executor::ExecutorConfig {
    toolledger::executor::ExecutorConfig {
        perform_timeout: None,
        ..downstream::fast_config()
    }
}

/// A stray `Committed` report (an attempt this executor did not hand out)
/// is checked against the stored row (executing at that attempt, another
/// session's), then `continue_execution` takes the call over. The owner is
/// alive and, in between, reports its own attempt refused (retryable): the
/// row is then `failed_before_commit`, and `continue_execution` *starts the
/// next attempt*, owned by the reporting session, that nobody runs. The
/// owner's caller, retrying after its backoff, gets `InFlight`, as does
/// every other session, for as long as the reporting process lives; and
/// the reporting executor, asked again, turns the never-sent attempt into
/// an unknown outcome for a tool that cannot reconcile it.
#[test]
fn a_stray_report_racing_the_owners_refusal_starts_no_attempt_for_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let base = Arc::new(ManualClock::new(1_000_000));
    let owner = Executor::new(Arc::new(open_with(&path, &base)), config());
    owner.register(Arc::new(Mail)).unwrap();
    let call = call("c1", "mail", r#"{"to":"bob"}"#);
    let CallerStep::Perform(a1) = owner.start(&op("o"), 0, call.clone()).unwrap() else {
        panic!()
    };
    let id = a1.request.execution_id.clone();

    let hooked = Arc::new(HookClock {
        inner: base.clone(),
        hook: Mutex::new(None),
        skip: std::sync::atomic::AtomicUsize::new(0),
    });
    let other_ledger =
        Arc::new(Ledger::open_with_clock(&path, LedgerConfig::default(), hooked.clone()).unwrap());
    let other = Executor::new(other_ledger.clone(), config());
    other.register(Arc::new(Mail)).unwrap();

    // The owner's refusal lands just before the takeover's transaction.
    let owners_answer = Arc::new(Mutex::new(None));
    {
        let owner = owner.clone();
        let id = id.clone();
        let answer = owners_answer.clone();
        hooked.arm(move || {
            let step = owner.report_attempt(
                &id,
                1,
                Ok(PerformOutcome::FailedBeforeCommit {
                    reason: "refused".into(),
                    retryable: true,
                }),
            );
            *answer.lock().unwrap() = Some(step);
        });
    }
    let reported = other
        .report_attempt(
            &id,
            1,
            Ok(PerformOutcome::Committed {
                result_json: r#"{"sent":"stray"}"#.into(),
                external_id: None,
            }),
        )
        .unwrap();
    let owners_answer = owners_answer.lock().unwrap().take().expect("hook ran");
    let Ok(CallerStep::Retry { attempt, .. }) = owners_answer else {
        panic!("owner's report: {owners_answer:?}")
    };

    let rec = owner.ledger().get(&id).unwrap().unwrap();
    assert!(
        !(rec.status == ExecutionStatus::Executing
            && rec.owner_session.as_ref() == Some(other_ledger.session_id())),
        "the stray report ({reported:?}) started attempt {} owned by its own session, \
         which nobody runs",
        rec.attempt_count
    );
    // The owner's caller waits out its backoff and retries: it runs the
    // next attempt itself.
    let step = owner.retry(&attempt).unwrap();
    assert!(
        matches!(&step, CallerStep::Perform(a) if a.request.attempt == 2),
        "owner's retry: {step:?}; record {:?} at {}",
        rec.status,
        rec.attempt_count
    );
}

/// A stray `Committed` report for the current attempt of a session that is
/// suspended inside its lease: the owner is alive; nothing is taken over,
/// the result is evidence, and the owner's own report still commits.
#[test]
fn a_stray_report_of_a_suspended_owners_attempt_inside_its_lease_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let base = Arc::new(ManualClock::new(1_000_000));
    let owner_ledger = Arc::new(open_with(&path, &base));
    let owner = Executor::new(owner_ledger.clone(), config());
    owner.register(Arc::new(Mail)).unwrap();
    let CallerStep::Perform(a1) = owner
        .start(&op("o"), 0, call("c1", "mail", r#"{"to":"bob"}"#))
        .unwrap()
    else {
        panic!()
    };
    let id = a1.request.execution_id.clone();
    owner_ledger.suspend().unwrap();
    base.advance(30_000); // inside the 60 s lease
    let other = Executor::new(Arc::new(open_with(&path, &base)), config());
    other.register(Arc::new(Mail)).unwrap();
    let reported = other
        .report_attempt(
            &id,
            1,
            Ok(PerformOutcome::Committed {
                result_json: r#"{"sent":"stray"}"#.into(),
                external_id: None,
            }),
        )
        .unwrap();
    assert!(
        matches!(
            reported,
            CallerStep::Done(toolledger::executor::CallOutcome::InFlight { .. })
        ),
        "{reported:?}"
    );
    let rec = other.ledger().get(&id).unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.attempt_count),
        (ExecutionStatus::Executing, 1)
    );
    assert_eq!(other.ledger().evidence(&id).unwrap().len(), 1);
    owner_ledger.resume().unwrap();
    let done = owner
        .report_attempt(
            &id,
            1,
            Ok(PerformOutcome::Committed {
                result_json: r#"{"sent":true}"#.into(),
                external_id: None,
            }),
        )
        .unwrap();
    let CallerStep::Done(toolledger::executor::CallOutcome::Completed { result_json, .. }) = done
    else {
        panic!("{done:?}")
    };
    assert_eq!(result_json, r#"{"sent":true}"#);
}

/// A result reported after the ledger was closed and reopened, in an
/// operation cancelled meanwhile: the effect happened, so it is committed
/// and the operation is `cancelled_after_side_effect` (not cancelled as if
/// nothing ran, not left unknown).
#[test]
fn a_report_after_reopening_in_a_cancelled_operation_commits_the_side_effect() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let base = Arc::new(ManualClock::new(1_000_000));
    let first = Executor::new(Arc::new(open_with(&path, &base)), config());
    first.register(Arc::new(Mail)).unwrap();
    let CallerStep::Perform(a1) = first
        .start(&op("o"), 0, call("c1", "mail", r#"{"to":"bob"}"#))
        .unwrap()
    else {
        panic!()
    };
    let id = a1.request.execution_id.clone();
    drop(first);
    let exec = Executor::new(Arc::new(open_with(&path, &base)), config());
    exec.register(Arc::new(Mail)).unwrap();
    exec.cancel_operation(&op("o")).unwrap();
    let reported = exec
        .report_attempt(
            &id,
            1,
            Ok(PerformOutcome::Committed {
                result_json: r#"{"sent":true}"#.into(),
                external_id: None,
            }),
        )
        .unwrap();
    assert!(
        matches!(
            reported,
            CallerStep::Done(toolledger::executor::CallOutcome::Completed { .. })
        ),
        "{reported:?}"
    );
    assert_eq!(
        exec.ledger().operation_status(&op("o")).unwrap(),
        Some(toolledger::model::OperationStatus::CancelledAfterSideEffect)
    );
}

/// An email with a lookup (no idempotency key).
struct LookupMail;

#[async_trait::async_trait]
impl ToolHandler for LookupMail {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            lookup: true,
            ..ToolDescriptor::side_effect("mail", 1)
        }
    }

    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        unreachable!("caller-driven only")
    }
}

/// A result reported after the ledger was reopened (the first session
/// closed) is taken over and settled as found; in between, another
/// session's lookup of the same unknown attempt finds a *different* effect
/// (another external id) and commits it first. The report's result is
/// then the only trace of a second effect downstream, yet it is neither
/// committed nor kept as evidence, and the reporter is told the other
/// result as if it were its own (`or_current` takes the commit for two
/// reconcilers that sent nothing). A report refused by the fence keeps what
/// it carried as evidence; this one should too (or be an error).
#[test]
fn a_reported_result_that_loses_to_a_different_lookup_result_is_kept_as_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let base = Arc::new(ManualClock::new(1_000_000));
    let first = Executor::new(Arc::new(open_with(&path, &base)), config());
    first.register(Arc::new(LookupMail)).unwrap();
    let call = call("c1", "mail", r#"{"to":"bob"}"#);
    let CallerStep::Perform(a1) = first.start(&op("o"), 0, call.clone()).unwrap() else {
        panic!()
    };
    let id = a1.request.execution_id.clone();
    drop(first);

    let hooked = Arc::new(HookClock {
        inner: base.clone(),
        hook: Mutex::new(None),
        skip: std::sync::atomic::AtomicUsize::new(2),
    });
    let exec = Executor::new(
        Arc::new(Ledger::open_with_clock(&path, LedgerConfig::default(), hooked.clone()).unwrap()),
        config(),
    );
    exec.register(Arc::new(LookupMail)).unwrap();
    let third = Executor::new(Arc::new(open_with(&path, &base)), config());
    third.register(Arc::new(LookupMail)).unwrap();
    let theirs = Arc::new(Mutex::new(None));
    {
        let third = third.clone();
        let theirs = theirs.clone();
        let id = id.clone();
        // After the takeover's transaction, before the resolution's.
        hooked.arm(move || {
            let rec = third.ledger().get(&id).unwrap().unwrap();
            assert_eq!(
                rec.status,
                ExecutionStatus::OutcomeUnknown,
                "hook too early"
            );
            let CallerStep::Lookup(l) = third.start(&op("o"), 0, call).unwrap() else {
                panic!("no lookup")
            };
            let step = third
                .report_lookup(
                    &l,
                    Ok(toolledger::executor::LookupOutcome::Found {
                        result_json: r#"{"sent":"found"}"#.into(),
                        external_id: Some("msg-A".into()),
                    }),
                )
                .unwrap();
            *theirs.lock().unwrap() = Some(step);
        });
    }
    let reported = exec.report_attempt(
        &id,
        1,
        Ok(PerformOutcome::Committed {
            result_json: r#"{"sent":"reported"}"#.into(),
            external_id: Some("msg-B".into()),
        }),
    );
    let theirs = theirs.lock().unwrap().take().expect("hook ran");
    assert!(
        matches!(
            theirs,
            CallerStep::Done(toolledger::executor::CallOutcome::Completed { .. })
        ),
        "{theirs:?}"
    );
    let evidence = exec.ledger().evidence(&id).unwrap();
    let kept = evidence
        .iter()
        .any(|e| e.external_id.as_deref() == Some("msg-B"));
    // Refused either way; what matters is that msg-B is not dropped
    // silently with the reporter told msg-A's result as its own.
    assert!(
        kept || reported.is_err(),
        "reported msg-B, answered {reported:?}; the ledger holds msg-A and no evidence of msg-B"
    );
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.external_id.as_deref(), Some("msg-A"));
}

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

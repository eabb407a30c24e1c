//! Review r5 of the twelfth session's executor and ledger fixes (the commit
//! over a retryable failure, the kept unrecorded result, the settling drop
//! of an executor, the lifecycle lock, the caught observer, `NoTimer`, the
//! batch resend's guard, `running_here`). Every effect is counted at a fake
//! downstream inside the tool; every wait is bounded. A test whose doc says
//! FAILS is a defect on the code it was written against.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use support::*;
use tokio::sync::{mpsc, Notify};
use toolledger::executor::{
    CallOutcome, CallerStep, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError,
    ToolHandler, ToolRequest,
};
use toolledger::ledger::{Ledger, LedgerConfig, LedgerEvent, LedgerObserver};
use toolledger::model::{ExecutionId, ExecutionStatus};
use toolledger_test_support as support;

/// A tool with its downstream inside: effects counted per downstream key (a
/// keyed downstream makes one effect per key). `perform` may be held before
/// its effect until `release`; it answers `Committed` with `{"n":<effects>}`.
pub(super) struct Probe {
    desc: ToolDescriptor,
    pub(super) performs: AtomicU32,
    pub(super) effects: Mutex<HashMap<String, u32>>,
    pub(super) hold: Mutex<bool>,
    reached: Mutex<Option<mpsc::UnboundedSender<u32>>>,
    release: Notify,
}

impl Probe {
    pub(super) fn new(desc: ToolDescriptor) -> Arc<Probe> {
        Arc::new(Probe {
            desc,
            performs: AtomicU32::new(0),
            effects: Mutex::new(HashMap::new()),
            hold: Mutex::new(false),
            reached: Mutex::new(None),
            release: Notify::new(),
        })
    }
    pub(super) fn hold(&self) -> mpsc::UnboundedReceiver<u32> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.reached.lock().unwrap() = Some(tx);
        *self.hold.lock().unwrap() = true;
        rx
    }
    pub(super) fn release(&self) {
        *self.hold.lock().unwrap() = false;
        self.release.notify_waiters();
    }
    fn effect_of(&self, key: &str) -> u32 {
        let mut effects = self.effects.lock().unwrap();
        let n = effects.entry(key.to_owned()).or_insert(0);
        if !self.desc.idempotency_key || *n == 0 {
            *n += 1;
        }
        effects.values().sum::<u32>()
    }
    pub(super) fn effects(&self) -> u32 {
        self.effects.lock().unwrap().values().sum()
    }
}

#[async_trait]
impl ToolHandler for Probe {
    fn descriptor(&self) -> ToolDescriptor {
        self.desc.clone()
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.performs.fetch_add(1, Ordering::SeqCst);
        if *self.hold.lock().unwrap() {
            let released = self.release.notified();
            if let Some(tx) = self.reached.lock().unwrap().as_ref() {
                let _ = tx.send(req.attempt);
            }
            if tokio::time::timeout(Duration::from_secs(20), released)
                .await
                .is_err()
            {
                return Err(ToolError::new("never released"));
            }
        }
        let n = self.effect_of(req.downstream_key.as_str());
        Ok(PerformOutcome::Committed {
            result_json: format!(r#"{{"n":{n}}}"#),
            external_id: None,
        })
    }
}

pub(super) fn neither(name: &str) -> ToolDescriptor {
    ToolDescriptor::side_effect(name, 1)
}

fn keyed(name: &str) -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect(name, 1)
    }
}

pub(super) fn config() -> ExecutorConfig {
    ExecutorConfig {
        perform_timeout: Some(Duration::from_secs(20)),
        ..downstream::fast_config()
    }
}

pub(super) fn open(path: &std::path::Path) -> Arc<Ledger> {
    Arc::new(Ledger::open(path, LedgerConfig::default()).unwrap())
}

pub(super) async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("hang: {what} did not finish within 30 s"))
}

pub(super) fn only_id(ledger: &Ledger) -> ExecutionId {
    ledger.list(&op("o")).unwrap().remove(0).execution_id
}

fn committed_with(o: &CallOutcome, result: &str) -> bool {
    matches!(o, CallOutcome::Completed { result_json, .. } if result_json == result)
}

// ---------------------------------------------------------------------------
// 3. An executor dropped while its ledger is suspended.
// ---------------------------------------------------------------------------

/// The app suspends the ledger (backgrounded) while a tool runs; the tool's
/// result comes back and cannot be written (kept with the orphan, row 51).
/// While still in the background the screen's executor is released (its
/// view model cleared), then the app comes back (`resume()`) and asks again
/// through a new executor of the same ledger. The drop's settling write was
/// refused (suspended) and the kept result went with the executor: the
/// call stays `executing` under this live session, `InFlight` to every ask
/// and to `recover()` for the life of the process, and the email's result
/// is lost. Must: the result committed (or at worst the call reconciled),
/// never `InFlight` forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_dropped_while_suspended_loses_its_kept_result_and_strands_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    let mut reached = tool.hold();
    let first = {
        let screen = Executor::new(ledger.clone(), config());
        screen.register(tool.clone()).unwrap();
        let run = {
            let screen = screen.clone();
            tokio::spawn(async move {
                screen
                    .execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#))
                    .await
            })
        };
        bounded("perform reached", reached.recv()).await.unwrap();
        ledger.suspend().unwrap();
        tool.release();
        bounded("execute", run).await.unwrap()
        // `screen` dropped here, the ledger still suspended.
    };
    assert_eq!(tool.effects(), 1, "the email went out");
    ledger.resume().unwrap();
    let next = Executor::new(ledger.clone(), config());
    next.register(tool.clone()).unwrap();
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            bounded(
                "execute",
                next.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)),
            )
            .await
            .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = bounded("recover", next.recover()).await.unwrap();
    let rec = ledger.get(&only_id(&ledger)).unwrap().unwrap();
    eprintln!(
        "first {first:?}\nanswers {answers:?}\nrecover {:?}\nstored {} {:?}",
        recovered.outcomes, rec.status, rec.result_json
    );
    assert_eq!(tool.effects(), 1, "never sent twice");
    assert!(
        answers.iter().any(|a| committed_with(a, r#"{"n":1}"#)),
        "the tool's result was lost and the call answers {answers:?} (stored {})",
        rec.status
    );
}

/// The same without a kept result: the call's task is aborted while its
/// tool runs (an orphan), the ledger is suspended, the executor dropped,
/// the ledger resumed. Row 52 promises the orphan is settled when the last
/// handle goes while the ledger lives on; the write was refused
/// (suspended) and nothing retries it: `InFlight` for the life of the
/// process. Must: reconciled at the next ask (a keyed call resent under
/// its key: one effect, `Completed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_of_an_executor_dropped_while_suspended_is_in_flight_forever() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = Probe::new(keyed("pay"));
    let mut reached = tool.hold();
    {
        let screen = Executor::new(ledger.clone(), config());
        screen.register(tool.clone()).unwrap();
        let run = tokio::spawn(async move {
            screen
                .execute(&op("o"), 0, call("c1", "pay", r#"{"n":1}"#))
                .await
        });
        bounded("perform reached", reached.recv()).await.unwrap();
        ledger.suspend().unwrap();
        run.abort();
        let _ = run.await;
    }
    tool.release();
    ledger.resume().unwrap();
    let next = Executor::new(ledger.clone(), config());
    next.register(tool.clone()).unwrap();
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            bounded(
                "execute",
                next.execute(&op("o"), 0, call("c1", "pay", r#"{"n":1}"#)),
            )
            .await
            .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("answers {answers:?}; effects {}", tool.effects());
    assert!(tool.effects() <= 1, "never two effects");
    assert!(
        answers
            .iter()
            .any(|a| matches!(a, CallOutcome::Completed { .. })),
        "a call nobody runs answers {answers:?}"
    );
}

// ---------------------------------------------------------------------------
// 4. `running_here` is one executor's: a second executor of the ledger.
// ---------------------------------------------------------------------------

/// Row 47: a report of an attempt that `execute` itself runs must answer
/// `InFlight` and change nothing. The app has two executors over its one
/// ledger (a screen's, and the caller-driven adapter's); the adapter
/// reports, for the attempt the screen's `execute` is running, "unknown"
/// (its own wrapper timed out). The second executor does not run it, so
/// `running_here` is false; the session is the owner, so the report is
/// applied: the call becomes `outcome_unknown` under the running perform,
/// whose commit is then refused as stale. The email went out once and its
/// result is known, but the screen's `execute` answers `Unknown` and the
/// row stays unknown (the app must ask the user). Must: `InFlight` to the
/// report, the call committed with the tool's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_from_another_executor_of_the_ledger_steals_a_running_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    let screen = Executor::new(ledger.clone(), config());
    screen.register(tool.clone()).unwrap();
    let adapter = Executor::new(ledger.clone(), config());
    adapter.register(tool.clone()).unwrap();
    let mut reached = tool.hold();
    let run = {
        let screen = screen.clone();
        tokio::spawn(async move {
            screen
                .execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#))
                .await
        })
    };
    bounded("perform reached", reached.recv()).await.unwrap();
    let id = only_id(&ledger);
    let report = adapter.report_attempt(
        &id,
        1,
        Ok(PerformOutcome::Unknown {
            reason: "wrapper timed out".into(),
        }),
    );
    let after_report = ledger.get(&id).unwrap().unwrap().status;
    tool.release();
    let out = bounded("execute", run).await.unwrap().unwrap();
    let rec = ledger.get(&id).unwrap().unwrap();
    eprintln!(
        "report {report:?} (row then {after_report})\nexecute {out:?}\nstored {}",
        rec.status
    );
    assert_eq!(tool.effects(), 1);
    assert!(
        matches!(report, Ok(CallerStep::Done(CallOutcome::InFlight { .. }))),
        "the other executor's report was applied to a running attempt: {report:?}"
    );
    assert!(
        committed_with(&out, r#"{"n":1}"#),
        "{out:?}, stored {}",
        rec.status
    );
}

// ---------------------------------------------------------------------------
// 1. failed_before_commit -> committed, from a new session.
// ---------------------------------------------------------------------------

/// Row 42's case with the ledger closed and opened again in between (the
/// design's own "the app closed or lost its ledger, opened it again, and
/// reports what its tool did"): attempt 1 was reported `FailedBeforeCommit`
/// (a 503 from the proxy), the app's ledger was closed and reopened, and
/// then the backend's own "done" for attempt 1 arrives. The report names
/// the execution's last attempt, nobody sent it since, and its owner
/// session is dead; for an `executing` row that report is the truth
/// (`settle_a_dead_owners_attempt`), here it is only evidence, and the
/// next ask sends the email again. Must: committed, one email.
#[test]
fn a_late_commit_of_a_retryable_failure_reported_after_the_ledger_was_reopened_sends_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let tool = Probe::new(neither("send"));
    let c = call("c1", "send", r#"{"to":"a"}"#);
    let mut effects = 0;
    let id = {
        let exec = Executor::new(open(&path), config());
        exec.register(tool.clone()).unwrap();
        let CallerStep::Perform(a1) = exec.start(&op("o"), 0, c.clone()).unwrap() else {
            panic!("a first attempt")
        };
        effects += 1; // the backend did it; the tool first got a 503
        let refused = exec
            .report(
                &a1,
                Ok(PerformOutcome::FailedBeforeCommit {
                    reason: "503 from the proxy".into(),
                    retryable: true,
                }),
            )
            .unwrap();
        assert!(matches!(refused, CallerStep::Retry { .. }), "{refused:?}");
        a1.request.execution_id.clone()
    };
    let exec = Executor::new(open(&path), config());
    exec.register(tool.clone()).unwrap();
    let late = exec.report_attempt(
        &id,
        1,
        Ok(PerformOutcome::Committed {
            result_json: r#"{"sent":1}"#.into(),
            external_id: None,
        }),
    );
    let next = exec.start(&op("o"), 0, c).unwrap();
    if let CallerStep::Perform(a2) = &next {
        effects += 1;
        let _ = exec.report(
            a2,
            Ok(PerformOutcome::Committed {
                result_json: r#"{"sent":2}"#.into(),
                external_id: None,
            }),
        );
    }
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    eprintln!(
        "late {late:?}\nnext {next:?}\nstored {} {:?}; evidence {}",
        rec.status,
        rec.result_json,
        exec.ledger().evidence(&id).unwrap().len()
    );
    assert_eq!(
        effects, 1,
        "the late commit was kept as evidence and the call sent again"
    );
}

// ---------------------------------------------------------------------------
// 4. The lifecycle lock and an observer that calls back.
// ---------------------------------------------------------------------------

/// An observer that calls `suspend()` when a result was delivered (an app
/// that backgrounds the ledger as soon as nothing is left to hand back;
/// the docs say an observer runs outside every lock and may call the
/// ledger). A delivery marked while suspended is written by `resume()`'s
/// reopening, under the new lifecycle lock: the observer's `suspend()`
/// waits for that lock on the same thread, and `resume()` never returns.
/// Must: no deadlock (the events handed out after the lock is released).
#[test]
fn an_observer_calling_suspend_from_a_delivery_written_by_resume_deadlocks() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tool = Probe::new(neither("send"));
    let exec = Executor::new(ledger.clone(), config());
    exec.register(tool.clone()).unwrap();
    let out = rt
        .block_on(exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)))
        .unwrap();
    assert!(committed_with(&out, r#"{"n":1}"#));
    let id = only_id(&ledger);
    struct SuspendOnDelivery(std::sync::Weak<Ledger>, Mutex<Vec<String>>);
    impl LedgerObserver for SuspendOnDelivery {
        fn on_event(&self, event: &LedgerEvent) {
            if event.to == ExecutionStatus::ResultDelivered {
                if let Some(l) = self.0.upgrade() {
                    let r = l.suspend();
                    self.1.lock().unwrap().push(format!("{r:?}"));
                }
            }
        }
    }
    let observer = Arc::new(SuspendOnDelivery(Arc::downgrade(&ledger), Mutex::default()));
    ledger.set_observer(Some(observer.clone())).unwrap();
    ledger.suspend().unwrap();
    // Marked while suspended: queued, written by the next write.
    let marked = ledger.mark_delivered(std::slice::from_ref(&id));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let ledger = ledger.clone();
        std::thread::spawn(move || {
            let r = ledger.resume().map(|v| v.len());
            let _ = tx.send(format!("{r:?}"));
        });
    }
    let resumed = rx.recv_timeout(Duration::from_secs(10));
    eprintln!(
        "marked {marked:?}; resume {resumed:?}; observer {:?}",
        observer.1.lock().unwrap()
    );
    assert!(
        resumed.is_ok(),
        "resume() did not return within 10 s: the observer's suspend() waits for the \
         lifecycle lock resume() holds on the same thread"
    );
}

// ---------------------------------------------------------------------------
// 4. NoTimer: the other entry points that run a tool.
// ---------------------------------------------------------------------------

/// Row 45 checks for a timer in `execute_round` only. `approve()` (and
/// `run_existing`, `recover`, `resolve_unknown`, `compensate`) run the tool
/// through the same `drive`, whose `perform_guarded` uses
/// `tokio::time::timeout`: on a runtime without a timer the approval is
/// recorded, the call moved to `executing` (its intent written), and then
/// the executor panics. The call was never sent, yet it answers `Unknown`
/// afterwards (an email: the app must ask the user about one it never
/// sent). Must: `Error::NoTimer` before anything is written.
#[test]
fn approve_on_a_runtime_without_timers_panics_after_the_intent() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = Probe::new(ToolDescriptor {
        requires_approval: true,
        ..neither("send")
    });
    let exec = Executor::new(ledger.clone(), config());
    exec.register(tool.clone()).unwrap();
    let timers = tokio::runtime::Runtime::new().unwrap();
    let asked = timers
        .block_on(exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)))
        .unwrap();
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        ..
    } = asked
    else {
        panic!("{asked:?}")
    };
    let no_timer = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let approved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        no_timer.block_on(exec.approve(&execution_id, &args_digest, None))
    }));
    let rec = ledger.get(&execution_id).unwrap().unwrap();
    let again = timers
        .block_on(exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)))
        .unwrap();
    eprintln!(
        "approve: {:?}\nstored after: {}\nasked again: {again:?}; performs {}",
        approved
            .as_ref()
            .map(|r| format!("{r:?}"))
            .map_err(|_| "panicked"),
        rec.status,
        tool.performs.load(Ordering::SeqCst)
    );
    assert!(
        matches!(approved, Ok(Err(toolledger::executor::Error::NoTimer))),
        "approve on a runtime without a timer: {:?}, the call left {}",
        approved
            .as_ref()
            .map(|r| format!("{r:?}"))
            .map_err(|_| "panicked"),
        rec.status
    );
}

/// The keyed variant of the test above: the other executor's report of
/// "unknown" for the running attempt is applied and, the tool having a
/// key, answers with a same-key resend (`Perform`, attempt 2) that the
/// reporting adapter never asked for and does not run. The screen's
/// `perform` then commits attempt 1, refused as stale (kept as evidence):
/// the call is `executing` at attempt 2 under the live session, run by
/// nobody, and answers `InFlight` to the screen and to every later ask
/// (row 47's symptom, through a second executor). Must: the report answers
/// `InFlight` and changes nothing; the screen's `execute` completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_report_from_another_executor_leaves_a_resend_nobody_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = Probe::new(keyed("pay"));
    let screen = Executor::new(ledger.clone(), config());
    screen.register(tool.clone()).unwrap();
    let adapter = Executor::new(ledger.clone(), config());
    adapter.register(tool.clone()).unwrap();
    let mut reached = tool.hold();
    let run = {
        let screen = screen.clone();
        tokio::spawn(async move {
            screen
                .execute(&op("o"), 0, call("c1", "pay", r#"{"n":1}"#))
                .await
        })
    };
    bounded("perform reached", reached.recv()).await.unwrap();
    let id = only_id(&ledger);
    let report = adapter.report_attempt(
        &id,
        1,
        Ok(PerformOutcome::Unknown {
            reason: "wrapper timed out".into(),
        }),
    );
    tool.release();
    let out = bounded("execute", run).await.unwrap().unwrap();
    let again = bounded(
        "execute again",
        screen.execute(&op("o"), 0, call("c1", "pay", r#"{"n":1}"#)),
    )
    .await
    .unwrap();
    let rec = ledger.get(&id).unwrap().unwrap();
    eprintln!(
        "report {report:?}\nexecute {out:?}\nagain {again:?}\nstored {} at attempt {}; evidence {}",
        rec.status,
        rec.attempt_count,
        ledger.evidence(&id).unwrap().len()
    );
    assert_eq!(tool.effects(), 1);
    assert!(
        matches!(report, Ok(CallerStep::Done(CallOutcome::InFlight { .. }))),
        "the other executor's report was applied to a running attempt: {report:?}"
    );
    assert!(
        matches!(out, CallOutcome::Completed { .. }),
        "{out:?}; again {again:?}"
    );
}

/// The app closes down cleanly after a result could not be written (it was
/// suspended while the tool ran, then resumed): it releases its `Ledger`
/// handle first and its executor after (Kotlin, Swift and Python free
/// objects in no fixed order). In the executor's drop its `Arc` is the
/// ledger's last (`strong_count == 1`), so nothing is written, although the
/// ledger is open, resumed and writable at that moment: the kept result is
/// dropped, and the next launch finds a dead owner and reports the email
/// `Unknown` (the app must ask the user about an email whose result it
/// had). Must: the kept result committed while the ledger can still write
/// it; the next launch replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_result_is_lost_when_the_ledger_handle_goes_before_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let tool = Probe::new(neither("send"));
    {
        let ledger = open(&path);
        let exec = Executor::new(ledger.clone(), config());
        exec.register(tool.clone()).unwrap();
        let mut reached = tool.hold();
        let run = {
            let exec = exec.clone();
            tokio::spawn(async move {
                exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#))
                    .await
            })
        };
        bounded("perform reached", reached.recv()).await.unwrap();
        ledger.suspend().unwrap();
        tool.release();
        let first = bounded("execute", run).await.unwrap();
        assert!(first.is_err(), "{first:?}");
        ledger.resume().unwrap();
        drop(ledger); // the app's handle first
        drop(exec); // then the executor: it holds the last Arc
    }
    assert_eq!(tool.effects(), 1);
    let exec = Executor::new(open(&path), config());
    exec.register(tool.clone()).unwrap();
    let again = bounded(
        "execute",
        exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)),
    )
    .await
    .unwrap();
    eprintln!("next launch: {again:?}; effects {}", tool.effects());
    assert_eq!(tool.effects(), 1);
    assert!(
        committed_with(&again, r#"{"n":1}"#),
        "the result the executor held was dropped with it: {again:?}"
    );
}

/// The commit over a retryable failure in an operation cancelled while the
/// attempt was out: committed, the operation `cancelled_after_side_effect`,
/// nothing sent again. PASSES.
#[test]
fn a_late_commit_over_a_failure_in_a_cancelled_operation_is_honest() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Executor::new(open(&dir.path().join("l.db")), config());
    let tool = Probe::new(neither("send"));
    exec.register(tool.clone()).unwrap();
    let c = call("c1", "send", r#"{"to":"a"}"#);
    let CallerStep::Perform(a1) = exec.start(&op("o"), 0, c.clone()).unwrap() else {
        panic!()
    };
    let cancelled = exec.ledger().cancel_operation(&op("o")).unwrap();
    let refused = exec
        .report(
            &a1,
            Ok(PerformOutcome::FailedBeforeCommit {
                reason: "503".into(),
                retryable: true,
            }),
        )
        .unwrap();
    let late = exec
        .report(
            &a1,
            Ok(PerformOutcome::Committed {
                result_json: r#"{"sent":1}"#.into(),
                external_id: None,
            }),
        )
        .unwrap();
    let next = exec.start(&op("o"), 0, c).unwrap();
    let id = a1.request.execution_id.clone();
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    let op_status = exec.ledger().operation_status(&op("o")).unwrap();
    eprintln!(
        "cancel {cancelled:?}; refused {refused:?}; late {late:?}; next {next:?}; \
         stored {} {:?}; op {op_status:?}",
        rec.status, rec.result_json
    );
    assert!(!matches!(next, CallerStep::Perform(_)), "{next:?}");
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(
        op_status,
        Some(toolledger::model::OperationStatus::CancelledAfterSideEffect)
    );
}

/// Row 51 for an independent batch: item 0's result comes back while the
/// app has suspended the ledger (its item record cannot be written), the
/// app resumes and asks again. The atomic path keeps such a result with
/// the orphan; the batch path (`record_batch_item` in `perform_items`)
/// keeps nothing, so the next ask marks the batch unknown and, for a tool
/// with neither key nor lookup, reports `Unknown` for an item whose effect
/// and result were known. Must: item 0 recorded from the kept result, item
/// 1 run, one effect each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_items_result_that_arrives_while_suspended_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = Probe::new(ToolDescriptor {
        batch: toolledger::executor::BatchMode::Independent,
        ..neither("send_all")
    });
    let exec = Executor::new(ledger.clone(), config());
    exec.register(tool.clone()).unwrap();
    let args = r#"{"items":[{"to":"a"},{"to":"b"}]}"#;
    let mut reached = tool.hold();
    let run = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute(&op("o"), 0, call("c1", "send_all", args))
                .await
        })
    };
    bounded("perform reached", reached.recv()).await.unwrap();
    ledger.suspend().unwrap();
    tool.release();
    let first = bounded("execute", run).await.unwrap();
    assert_eq!(tool.effects(), 1, "item 0 went out");
    ledger.resume().unwrap();
    let again = bounded(
        "execute again",
        exec.execute(&op("o"), 0, call("c1", "send_all", args)),
    )
    .await
    .unwrap();
    let id = only_id(&ledger);
    let rec = ledger.get(&id).unwrap().unwrap();
    eprintln!(
        "first {first:?}\nagain {again:?}\nstored {} {:?}; items {:?}; effects {}",
        rec.status,
        rec.result_json,
        ledger.batch_items(&id).unwrap(),
        tool.effects()
    );
    assert!(tool.effects() <= 2, "never an item twice");
    assert!(
        matches!(again, CallOutcome::Completed { partial: false, .. }),
        "item 0's known result was lost: {again:?} (stored {})",
        rec.status
    );
    // Item 0 recorded from the kept result, item 1 run once: both effects,
    // both items, the batch committed.
    assert_eq!(tool.effects(), 2);
    assert_eq!(ledger.batch_items(&id).unwrap().len(), 2);
    assert!(rec.status.is_committed(), "{}", rec.status);
}

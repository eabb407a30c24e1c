//! Reentrancy and lifecycle misuse, as a real app would do by accident
//! (review r1): a tool's `perform` calling back into its own executor or
//! ledger, `suspend()` / `resume()` landing in the middle of a call or of
//! each other, an executor dropped with a call in flight, a runtime without
//! the pieces the executor needs, a panicking observer. Every effect is
//! counted at a fake downstream inside the tool; every test is bounded by a
//! timeout.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use support::*;
use tokio::sync::{mpsc, Notify};
use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{Begin, Ledger, LedgerConfig, LedgerEvent, LedgerObserver};
use toolledger::model::{ExecutionStatus, OperationStatus};
use toolledger_test_support as support;

type HookFut = Pin<Box<dyn Future<Output = ()> + Send>>;
type Hook = Arc<dyn Fn(ToolRequest) -> HookFut + Send + Sync>;

/// A tool with a downstream inside it: effects are counted per downstream
/// key (a keyed downstream makes one effect per key, any other one effect
/// per request). `perform` first runs the armed hook (which may call back
/// into the executor), then optionally waits for `release`, then makes its
/// effect and answers `Committed` with `{"n":<effect number>}`.
struct Probe {
    desc: ToolDescriptor,
    performs: AtomicU32,
    lookups: AtomicU32,
    effects: Mutex<HashMap<String, u32>>,
    hook: Mutex<Option<Hook>>,
    hold: Mutex<bool>,
    /// Only attempts from this number on are held.
    hold_from: AtomicU32,
    /// This many performs make their effect and answer `Unknown` (the
    /// answer was lost on the way back).
    unknown_answers: AtomicU32,
    reached: Mutex<Option<mpsc::UnboundedSender<u32>>>,
    release: Notify,
}

impl Probe {
    fn new(desc: ToolDescriptor) -> Arc<Probe> {
        Arc::new(Probe {
            desc,
            performs: AtomicU32::new(0),
            lookups: AtomicU32::new(0),
            effects: Mutex::new(HashMap::new()),
            hook: Mutex::new(None),
            hold: Mutex::new(false),
            hold_from: AtomicU32::new(0),
            unknown_answers: AtomicU32::new(0),
            reached: Mutex::new(None),
            release: Notify::new(),
        })
    }
    fn arm(&self, hook: impl Fn(ToolRequest) -> HookFut + Send + Sync + 'static) {
        *self.hook.lock().unwrap() = Some(Arc::new(hook));
    }
    /// The next performs stop before their effect until `release`; each
    /// sends its attempt number when it gets there.
    fn hold(&self) -> mpsc::UnboundedReceiver<u32> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.reached.lock().unwrap() = Some(tx);
        *self.hold.lock().unwrap() = true;
        rx
    }
    fn release(&self) {
        *self.hold.lock().unwrap() = false;
        self.release.notify_waiters();
    }
    /// Makes the request's effect downstream; the number of effects so far.
    fn effect(&self, req: &ToolRequest) -> u32 {
        let mut effects = self.effects.lock().unwrap();
        let n = effects.entry(req.downstream_key.to_string()).or_insert(0);
        if !self.desc.idempotency_key || *n == 0 {
            *n += 1;
        }
        effects.values().sum::<u32>()
    }
    fn effects(&self) -> u32 {
        self.effects.lock().unwrap().values().sum()
    }
    fn performs(&self) -> u32 {
        self.performs.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ToolHandler for Probe {
    fn descriptor(&self) -> ToolDescriptor {
        self.desc.clone()
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.performs.fetch_add(1, Ordering::SeqCst);
        let hook = self.hook.lock().unwrap().clone();
        if let Some(hook) = hook {
            hook(req.clone()).await;
        }
        if self
            .unknown_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            self.effect(&req);
            return Ok(PerformOutcome::Unknown {
                reason: "connection reset after the request was sent".into(),
            });
        }
        let held =
            *self.hold.lock().unwrap() && req.attempt >= self.hold_from.load(Ordering::SeqCst);
        if held {
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
        let n = self.effect(&req);
        Ok(PerformOutcome::Committed {
            result_json: format!(r#"{{"n":{n}}}"#),
            external_id: None,
        })
    }
    async fn lookup(
        &self,
        req: ToolRequest,
    ) -> Result<toolledger::executor::LookupOutcome, ToolError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let found = self
            .effects
            .lock()
            .unwrap()
            .get(req.downstream_key.as_str())
            .copied()
            .unwrap_or(0);
        Ok(if found > 0 {
            toolledger::executor::LookupOutcome::Found {
                result_json: r#"{"n":1}"#.into(),
                external_id: None,
            }
        } else {
            toolledger::executor::LookupOutcome::NotFound
        })
    }
}

/// A tool with neither key nor lookup (an email): an unknown outcome goes
/// to the app.
fn neither(name: &str) -> ToolDescriptor {
    ToolDescriptor::side_effect(name, 1)
}

fn keyed(name: &str) -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect(name, 1)
    }
}

fn config() -> ExecutorConfig {
    ExecutorConfig {
        perform_timeout: Some(Duration::from_secs(20)),
        ..downstream::fast_config()
    }
}

fn exec_on(path: &std::path::Path) -> Executor {
    Executor::new(
        Arc::new(Ledger::open(path, LedgerConfig::default()).unwrap()),
        config(),
    )
}

use support::downstream;

/// Bounds a test's awaits.
async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .unwrap_or_else(|_| panic!("hang: {what} did not finish within 30 s"))
}

fn is_completed(o: &CallOutcome) -> bool {
    matches!(o, CallOutcome::Completed { .. })
}

// ---------------------------------------------------------------------------
// A perform calling back into its own executor.
// ---------------------------------------------------------------------------

/// A tool whose `perform` asks its executor for the very call it is running
/// (an agent framework re-dispatching the model's call; a tool that
/// "retries itself"): the inner ask is `InFlight`, nothing runs twice, no
/// deadlock, and the outer call completes. PASSES.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_perform_that_executes_its_own_call_gets_in_flight_and_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    exec.register(tool.clone()).unwrap();
    let inner: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let exec = exec.clone();
        let inner = inner.clone();
        tool.arm(move |req| {
            let exec = exec.clone();
            let inner = inner.clone();
            Box::pin(async move {
                if req.attempt != 1 {
                    return;
                }
                let again = exec
                    .execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#))
                    .await;
                let started = exec.start(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#));
                let recovered = exec.recover().await.map(|r| r.outcomes);
                // A tool that registers a helper tool lazily.
                let registered = exec.register(Probe::new(neither("helper")));
                assert!(registered.is_ok(), "{registered:?}");
                inner
                    .lock()
                    .unwrap()
                    .push(format!("{again:?} | {started:?} | {recovered:?}"));
            })
        });
    }
    let out = bounded(
        "execute",
        exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)),
    )
    .await
    .unwrap();
    let inner = inner.lock().unwrap().clone();
    assert!(is_completed(&out), "{out:?}");
    assert_eq!(tool.effects(), 1);
    assert_eq!(tool.performs(), 1);
    assert_eq!(inner.len(), 1);
    assert_eq!(
        inner[0].matches("in_flight(").count(),
        3,
        "execute, start and recover from inside the perform all say InFlight: {inner:?}"
    );
}

/// A perform that cancels its own operation (the user pressed "stop" and
/// the tool's progress callback runs the app's cancel) and then asks for
/// another call of the same round: the running call finishes honestly
/// (committed, the operation `cancelled_after_side_effect`), the other call
/// is cancelled without running. PASSES.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_perform_that_cancels_its_own_operation_finishes_honestly() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(keyed("pay"));
    exec.register(tool.clone()).unwrap();
    let inner: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let exec = exec.clone();
        let inner = inner.clone();
        tool.arm(move |req| {
            let exec = exec.clone();
            let inner = inner.clone();
            Box::pin(async move {
                if !req.execution_id.as_str().contains("c1") {
                    return;
                }
                let cancelled = exec.cancel_operation(&op("o"));
                let other = exec
                    .execute(&op("o"), 0, call("c2", "pay", r#"{"n":2}"#))
                    .await;
                inner
                    .lock()
                    .unwrap()
                    .push(format!("{cancelled:?} {other:?}"));
            })
        });
    }
    let out = bounded(
        "execute",
        exec.execute(&op("o"), 0, call("c1", "pay", r#"{"n":1}"#)),
    )
    .await
    .unwrap();
    let inner = inner.lock().unwrap().clone();
    assert!(is_completed(&out), "{out:?} / {inner:?}");
    assert_eq!(tool.effects(), 1, "{inner:?}");
    assert!(inner[0].contains("CancelledAfterSideEffect"), "{inner:?}");
    assert!(inner[0].contains("Ok(cancelled(o:round_0:c2"), "{inner:?}");
    assert_eq!(
        exec.ledger().operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

/// A perform during which the app is backgrounded and foregrounded
/// (`suspend()` then `resume()`, e.g. the tool opened a browser for a
/// sign-in): the result that comes back after `resume()` commits, once.
/// PASSES.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_and_resume_inside_a_perform_keeps_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    exec.register(tool.clone()).unwrap();
    let inner: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let exec = exec.clone();
        let inner = inner.clone();
        tool.arm(move |_| {
            let exec = exec.clone();
            let inner = inner.clone();
            Box::pin(async move {
                let s = exec.ledger().suspend();
                let r = exec.ledger().resume().map(|v| v.len());
                inner.lock().unwrap().push(format!("{s:?} {r:?}"));
            })
        });
    }
    let out = bounded(
        "execute",
        exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)),
    )
    .await
    .unwrap();
    assert!(is_completed(&out), "{out:?} {:?}", inner.lock().unwrap());
    assert_eq!(tool.effects(), 1);
    let again = exec
        .execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#))
        .await
        .unwrap();
    assert!(matches!(
        again,
        CallOutcome::Completed { replayed: true, .. }
    ));
}

// ---------------------------------------------------------------------------
// suspend() landing while a call is between begin and commit.
// ---------------------------------------------------------------------------

/// The app is backgrounded while an email is being sent: it calls
/// `suspend()` (as the docs ask, so that iOS does not kill it for a held
/// lock), and the send's answer arrives before the app comes back (iOS
/// gives a backgrounded app time to finish its requests). The tool made
/// its effect and answered `Committed`; the commit meets the suspended
/// store and `execute` returns `Err(Suspended)`. The tool's result is kept
/// nowhere (no evidence, no record): after `resume()`, asking the call again
/// (or `recover()`) turns it into `Unknown`, "its caller stopped waiting",
/// and the app has to ask the user whether an email it sent was sent.
/// Must: the result the tool returned is not lost: it is committed (at the
/// latest when the ledger resumes) and asking again replays it.
/// FAILS on the current code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_that_arrives_while_the_ledger_is_suspended_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
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
    exec.ledger().suspend().unwrap();
    tool.release();
    let first = bounded("execute", run).await.unwrap();
    assert_eq!(tool.effects(), 1, "the email went out");
    exec.ledger().resume().unwrap();
    let recovered = bounded("recover", exec.recover()).await.unwrap();
    let again = bounded(
        "execute again",
        exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)),
    )
    .await
    .unwrap();
    let rec = exec.ledger().list(&op("o")).unwrap().remove(0);
    let evidence = exec.ledger().evidence(&rec.execution_id).unwrap();
    eprintln!(
        "first: {first:?}\nrecover: {:?}\nagain: {again:?}\nstored: {} {:?}; evidence: {}",
        recovered.outcomes,
        rec.status,
        rec.last_reason,
        evidence.len()
    );
    assert_eq!(tool.effects(), 1, "never sent twice");
    assert!(
        matches!(&again, CallOutcome::Completed { result_json, .. } if result_json == r#"{"n":1}"#)
            || matches!(&first, Ok(CallOutcome::Completed { .. })),
        "the tool's committed result was lost: first answer {first:?}, after resume {again:?}, \
         stored {} ({:?})",
        rec.status,
        rec.last_reason
    );
}

// ---------------------------------------------------------------------------
// An executor dropped with a call in flight.
// ---------------------------------------------------------------------------

/// The app builds its `Executor` per screen (or re-creates it to register
/// other tools) over one long-lived `Ledger`. A call's task is cancelled
/// (the user left the screen) while its tool runs, and the screen's executor
/// is dropped. The attempt was this executor's orphan; the new executor of
/// the same ledger knows nothing of it, so the call, `executing` under the
/// live session, answers `InFlight` to every ask and to `recover()` for the
/// life of the process, although nothing runs it (its `perform` future is
/// gone). Must: reconciled as the same executor reconciles its orphan (a
/// keyed call resent under its key: one effect, `Completed`).
/// FAILS on the current code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_of_a_dropped_executor_is_not_in_flight_for_the_life_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Arc::new(Ledger::open(&dir.path().join("l.db"), LedgerConfig::default()).unwrap());
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
        run.abort();
        let _ = run.await;
    }
    tool.release();
    tokio::time::sleep(Duration::from_millis(50)).await;
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
    let recovered = bounded("recover", next.recover()).await.unwrap();
    eprintln!(
        "answers: {answers:?}; recover: {:?}; effects {}",
        recovered.outcomes,
        tool.effects()
    );
    assert!(tool.effects() <= 1, "never two effects");
    assert!(
        answers.iter().any(is_completed),
        "a call nobody runs answers {answers:?} (recover: {:?})",
        recovered.outcomes
    );
}

// ---------------------------------------------------------------------------
// suspend() and resume() racing each other.
// ---------------------------------------------------------------------------

/// Whether a session's lock file is held by someone (tried from here).
fn lock_held(path: &std::path::Path) -> bool {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(_) => true,
    }
}

/// The app's lifecycle callbacks run on different threads (background ->
/// `suspend()` dispatched off the main thread because it syncs; a quick
/// return to the foreground -> `resume()`), so the two overlap. `resume()`
/// takes the session lock first (a no-op while `suspend()` still holds it)
/// and then waits for the store, which `suspend()` is closing; `suspend()`
/// then releases the lock. The ledger ends up open and writing, its
/// session row "active" (resume's register cleared the suspension mark),
/// and its session lock free: to every other session it is dead. Another
/// session's `begin` of a call this live ledger is running takes it over
/// (`Reconcile`: marked `owner session died`, a key tool resent, a
/// neither-tool told `Unknown`) while the owner is about to commit it.
/// Must: whatever order the two land in, a call owned by the ledger is
/// `InFlight` to another session (its lock held, or its suspension mark in
/// force). FAILS on the current code (racy: tries up to 150 times; it
/// usually fails within the first few tries).
#[test]
fn suspend_racing_resume_never_leaves_a_live_owner_looking_dead() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let a = Arc::new(Ledger::open(&path, LedgerConfig::default()).unwrap());
    let b = Ledger::open(&path, LedgerConfig::default()).unwrap();
    let lock = path
        .with_file_name("l.db-sessions")
        .join(format!("{}.lock", a.session_id()));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut found = None;
        for i in 0..150u32 {
            // A is active and running call c<i>.
            a.resume().unwrap();
            let spec = spec(&format!("c{i}"), "send", "{}");
            let t = ticket(a.begin(&op("o"), 0, &spec).unwrap());
            let delay = Duration::from_micros(u64::from(i % 15) * 100);
            let a2 = a.clone();
            let suspender = std::thread::spawn(move || a2.suspend());
            std::thread::sleep(delay);
            let resumed = a.resume().map(|_| ());
            let suspended = suspender.join().unwrap();
            let open = a.get(&t.execution_id).is_ok();
            let held = lock_held(&lock);
            let other = b.begin(&op("o"), 0, &spec).unwrap();
            if !matches!(other, Begin::InFlight { .. }) {
                found = Some(format!(
                    "try {i}: suspend {suspended:?}, resume {resumed:?}; A open={open}, \
                     A's lock held={held}; another session's begin of A's running call: \
                     {other:?}"
                ));
                break;
            }
        }
        let _ = tx.send(found);
    });
    let found = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("hang: the suspend/resume race did not finish within 120 s");
    assert!(
        found.is_none(),
        "a live owner looked dead: {}",
        found.unwrap()
    );
}

// ---------------------------------------------------------------------------
// A runtime without what the executor needs.
// ---------------------------------------------------------------------------

/// An app drives `execute` on a runtime built without timers
/// (`Builder::new_current_thread().build()`, forgetting `enable_time()` /
/// `enable_all()`). The executor's `perform_timeout` needs tokio's timer:
/// `execute` panics ("timers are disabled") — across the public API —
/// after the call's intent was written and before the tool ran. The call
/// is left `executing`; asked again on a proper runtime it is this
/// executor's orphan and becomes `Unknown` ("its caller stopped waiting
/// while it ran"), so the app asks the user about an email that was never
/// sent. Must: a typed error before anything is written (or the call runs),
/// never a panic; a call never sent is never reported as unknown.
/// FAILS on the current code.
#[test]
fn execute_on_a_runtime_without_timers_is_typed_and_leaves_no_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    exec.register(tool.clone()).unwrap();
    let no_timers = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        no_timers.block_on(exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)))
    }));
    let panicked = first.is_err();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let again = rt
        .block_on(async {
            bounded(
                "execute",
                exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)),
            )
            .await
        })
        .unwrap();
    eprintln!(
        "first: panicked={panicked}; again: {again:?}; performs {}",
        tool.performs()
    );
    assert!(tool.effects() <= 1);
    assert!(
        !panicked && !matches!(again, CallOutcome::Unknown { .. }),
        "execute panicked={panicked} on a runtime without timers; the call, never sent \
         (performs before the retry: 0), then answered {again:?}"
    );
}

// ---------------------------------------------------------------------------
// An observer that panics.
// ---------------------------------------------------------------------------

struct PanickingObserver;

impl LedgerObserver for PanickingObserver {
    fn on_event(&self, event: &LedgerEvent) {
        if event.to == ExecutionStatus::Executing {
            panic!("observer bug");
        }
    }
}

/// The app's observer (a logging adapter) has a bug and panics on an event.
/// The docs say an observer that throws is ignored. In Rust the panic
/// leaves `begin` after the intent committed and before the executor got
/// the ticket: no `Running` guard, no orphan, so the call stays `executing`
/// under the live session and answers `InFlight` for the life of the
/// process, `recover()` included, though nothing was sent. Must: the
/// observer's panic is contained (ignored, as a throwing observer is), or
/// at least the call is not left in flight.
/// FAILS on the current code.
#[test]
fn a_panicking_observer_never_leaves_a_call_in_flight_forever() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    exec.register(tool.clone()).unwrap();
    exec.ledger()
        .set_observer(Some(Arc::new(PanickingObserver)))
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)))
    }));
    let panicked = first.is_err();
    exec.ledger().set_observer(None).unwrap();
    let (again, recovered) = rt.block_on(async {
        let again = bounded(
            "execute",
            exec.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)),
        )
        .await
        .unwrap();
        let recovered = bounded("recover", exec.recover()).await.unwrap();
        (again, recovered.outcomes)
    });
    eprintln!(
        "first panicked={panicked}; again {again:?}; recover {recovered:?}; performs {}",
        tool.performs()
    );
    assert!(tool.effects() <= 1);
    assert!(
        !matches!(again, CallOutcome::InFlight { .. }),
        "observer panicked={panicked}; the call (performs: {}) answers {again:?} and recover \
         {recovered:?}, though nothing runs it",
        tool.performs()
    );
}

// ---------------------------------------------------------------------------
// A caller's task cancelled while an independent batch's resend runs.
// ---------------------------------------------------------------------------

/// An independent batch (invitations, one key per item): item 0's answer is
/// lost (the effect was made, the tool says `Unknown`), so the executor
/// reconciles and resends item 0 under its key as attempt 2, and the app's
/// task is cancelled while that resend is on the wire (the user left the
/// screen). A whole-call attempt is guarded (`Running`: an orphan of the
/// executor, reconciled at the next ask), but the batch's resend is started
/// inside the reconciliation (`perform_items(reconcile = true)`), which no
/// guard covers: the execution stays `executing` at attempt 2 under the
/// live session, and every later ask and `recover()` answers `InFlight` for
/// the life of the process, though nothing runs it. Must: reconciled as any
/// orphan is (the items resent under their keys: one effect each,
/// `Completed`). FAILS on the current code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_resend_whose_caller_went_away_is_not_in_flight_for_the_life_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(ToolDescriptor {
        batch: toolledger::executor::BatchMode::Independent,
        ..keyed("invite")
    });
    exec.register(tool.clone()).unwrap();
    tool.unknown_answers.store(1, Ordering::SeqCst);
    tool.hold_from.store(2, Ordering::SeqCst);
    let mut reached = tool.hold();
    let args = r#"{"items":[{"to":"a"},{"to":"b"}]}"#;
    let run = {
        let exec = exec.clone();
        tokio::spawn(async move { exec.execute(&op("o"), 0, call("c1", "invite", args)).await })
    };
    let attempt = bounded("the resend reached", reached.recv()).await.unwrap();
    assert_eq!(attempt, 2, "item 0 resent under its key as attempt 2");
    run.abort();
    let _ = run.await;
    tool.release();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            bounded(
                "execute",
                exec.execute(&op("o"), 0, call("c1", "invite", args)),
            )
            .await
            .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = bounded("recover", exec.recover()).await.unwrap();
    let rec = exec.ledger().list(&op("o")).unwrap().remove(0);
    eprintln!(
        "answers {answers:?}; recover {:?}; stored {} attempt {}; effects {}",
        recovered.outcomes,
        rec.status,
        rec.attempt_count,
        tool.effects()
    );
    assert!(tool.effects() <= 2, "one effect per item");
    assert!(
        answers.iter().any(is_completed),
        "a batch nobody runs answers {answers:?} (recover {:?}; stored {} at attempt {})",
        recovered.outcomes,
        rec.status,
        rec.attempt_count
    );
}

// ---------------------------------------------------------------------------
// A caller-driven report of an attempt `execute` is running.
// ---------------------------------------------------------------------------

/// An app mixes the two ways of running tools: a framework adapter reports
/// every tool request it sees with `report_attempt` (the token: execution
/// id and attempt), including one that `execute` handed to the tool's
/// `perform` (the adapter wraps the tool; the request "timed out" from its
/// point of view, so it reports `Unknown`). The executor applies the report
/// although it handed that attempt to its own `perform`, not to a caller:
/// the call becomes unknown and a same-key resend (attempt 2) is handed out
/// to the adapter, which drops it. `perform` then answers `Committed`: its
/// commit is refused as stale (the result kept only as evidence), `execute`
/// answers `InFlight`, and the call stays `executing` at attempt 2 — run by
/// nobody — answering `InFlight` for the life of the process. Must: a report
/// of an attempt this executor is running itself changes nothing (the
/// current truth), and the committed effect is answered `Completed`.
/// FAILS on the current code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_of_an_attempt_execute_is_running_does_not_steal_it() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(keyed("pay"));
    exec.register(tool.clone()).unwrap();
    let inner: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let exec = exec.clone();
        let inner = inner.clone();
        tool.arm(move |req| {
            let exec = exec.clone();
            let inner = inner.clone();
            Box::pin(async move {
                if req.attempt != 1 {
                    return;
                }
                let step = exec.report_attempt(
                    &req.execution_id,
                    req.attempt,
                    Ok(PerformOutcome::Unknown {
                        reason: "adapter timeout".into(),
                    }),
                );
                inner.lock().unwrap().push(format!("{step:?}"));
            })
        });
    }
    let out = bounded(
        "execute",
        exec.execute(&op("o"), 0, call("c1", "pay", "{}")),
    )
    .await
    .unwrap();
    let again = bounded(
        "execute",
        exec.execute(&op("o"), 0, call("c1", "pay", "{}")),
    )
    .await
    .unwrap();
    let rec = exec.ledger().list(&op("o")).unwrap().remove(0);
    let evidence = exec.ledger().evidence(&rec.execution_id).unwrap();
    eprintln!(
        "report from inside perform: {:?}; execute {out:?}; again {again:?}; stored {} attempt {}; \
         evidence {}; effects {}",
        inner.lock().unwrap(),
        rec.status,
        rec.attempt_count,
        evidence.len(),
        tool.effects()
    );
    assert_eq!(tool.effects(), 1);
    assert!(
        is_completed(&out) || is_completed(&again),
        "the committed payment answers {out:?}, then {again:?} (stored {} at attempt {}, \
         its result only evidence: {})",
        rec.status,
        rec.attempt_count,
        evidence.len()
    );
}

// ---------------------------------------------------------------------------
// A caller-driven report meeting a suspended ledger.
// ---------------------------------------------------------------------------

/// The caller-driven form of the suspended-commit case (Kotlin's and
/// Swift's `SyncTool` walks report from an I/O thread): `start` hands out
/// the attempt, the app is backgrounded (`suspend()`), the tool's answer
/// comes back and its `report` meets the suspended ledger (`Err`). After
/// `resume()` the app does what the docs say, `recover()`, and the walk
/// reports its result again. Must: the result is not lost (the repeat
/// report, or asking the call again, answers `Completed` with it).
/// PASSES: the report while suspended is `Err(Suspended)` and leaves the
/// attempt an orphan, `recover()` after `resume()` turns it `Unknown`, and
/// the repeated report settles it with the result (`Completed`); asking
/// again replays it. (Unlike `execute`, whose result is gone: see
/// `a_result_that_arrives_while_the_ledger_is_suspended_is_not_lost`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_driven_result_reported_into_a_suspended_ledger_is_not_lost() {
    use toolledger::executor::CallerStep;
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    exec.register(tool.clone()).unwrap();
    let c = call("c1", "send", r#"{"to":"a"}"#);
    let CallerStep::Perform(a1) = exec.start(&op("o"), 0, c.clone()).unwrap() else {
        panic!("a first attempt")
    };
    let committed = || {
        Ok(PerformOutcome::Committed {
            result_json: r#"{"sent":1}"#.into(),
            external_id: None,
        })
    };
    // The caller's tool sends the email.
    exec.ledger().suspend().unwrap();
    let first = exec.report(&a1, committed());
    exec.ledger().resume().unwrap();
    let recovered = bounded("recover", exec.recover()).await.unwrap();
    let repeat = exec.report(&a1, committed());
    let again = exec.start(&op("o"), 0, c).unwrap();
    eprintln!(
        "report while suspended: {first:?}\nrecover: {:?}\nreport again: {repeat:?}\n\
         start again: {again:?}",
        recovered.outcomes
    );
    let completed = |s: &CallerStep| {
        matches!(s, CallerStep::Done(CallOutcome::Completed { result_json, .. })
            if result_json == r#"{"sent":1}"#)
    };
    assert!(
        completed(&again),
        "the reported result was lost: report {first:?}, recover {:?}, report again {repeat:?}, \
         start again {again:?}",
        recovered.outcomes
    );
}

// ---------------------------------------------------------------------------
// Reads, retention and an inspector from inside a perform.
// ---------------------------------------------------------------------------

/// A tool whose `perform` reads the ledger (its own record, evidence,
/// transitions), prunes it and opens an `Inspector` on the file (a "what
/// did I already do?" check, a housekeeping hook on every call): nothing
/// deadlocks, the running call is not pruned, and it commits once. PASSES.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_prune_and_an_inspector_inside_a_perform_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let exec = exec_on(&path);
    let tool = Probe::new(keyed("pay"));
    exec.register(tool.clone()).unwrap();
    // An older call, delivered: prunable.
    let old = exec
        .execute(&op("old"), 0, call("c0", "pay", "{}"))
        .await
        .unwrap();
    exec.ledger()
        .mark_delivered(&[old.execution_id().clone()])
        .unwrap();
    // Older than the cutoff "now" of a prune inside the next call.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let inner: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let exec = exec.clone();
        let inner = inner.clone();
        let path = path.clone();
        tool.arm(move |req| {
            let exec = exec.clone();
            let inner = inner.clone();
            let path = path.clone();
            Box::pin(async move {
                if req.execution_id.as_str().starts_with("old") {
                    return;
                }
                let l = exec.ledger();
                let own = l.get(&req.execution_id).map(|r| r.map(|r| r.status));
                let ev = l.evidence(&req.execution_id).map(|e| e.len());
                let tr = l.transitions(&req.execution_id).map(|t| t.len());
                let pruned = l.prune(Duration::ZERO, true).map(|r| r.executions);
                let inspected =
                    toolledger::ledger::Inspector::open(&path).and_then(|i| i.execution_count());
                inner.lock().unwrap().push(format!(
                    "{own:?} {ev:?} {tr:?} pruned {pruned:?} inspected {inspected:?}"
                ));
            })
        });
    }
    let out = bounded(
        "execute",
        exec.execute(&op("o"), 0, call("c1", "pay", "{}")),
    )
    .await
    .unwrap();
    let inner = inner.lock().unwrap().clone();
    eprintln!("{inner:?} {out:?}");
    assert!(is_completed(&out), "{out:?} {inner:?}");
    assert_eq!(tool.effects(), 2);
    assert!(inner[0].starts_with("Ok(Some(Executing))"), "{inner:?}");
    assert!(inner[0].contains("pruned Ok(1)"), "{inner:?}");
    let again = exec
        .execute(&op("o"), 0, call("c1", "pay", "{}"))
        .await
        .unwrap();
    assert!(matches!(
        again,
        CallOutcome::Completed { replayed: true, .. }
    ));
}

// ---------------------------------------------------------------------------
// The runtime shut down mid-call; the ledger closed under a call.
// ---------------------------------------------------------------------------

/// The app's runtime is shut down (a service stopping, a test harness, a
/// UniFFI runtime replaced) while a keyed call's tool waits on the network;
/// the executor and ledger live on and the call is asked again on a new
/// runtime: it is this executor's orphan, reconciled by a resend under its
/// key: one effect, `Completed`. PASSES.
#[test]
fn a_runtime_shut_down_mid_call_leaves_an_orphan_that_is_reconciled() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(keyed("pay"));
    exec.register(tool.clone()).unwrap();
    let mut reached = tool.hold();
    let rt = tokio::runtime::Runtime::new().unwrap();
    {
        let exec = exec.clone();
        rt.spawn(async move { exec.execute(&op("o"), 0, call("c1", "pay", "{}")).await });
    }
    let got = reached.blocking_recv();
    assert_eq!(got, Some(1));
    rt.shutdown_timeout(Duration::from_secs(5));
    tool.release();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let again = rt
        .block_on(async {
            bounded(
                "execute",
                exec.execute(&op("o"), 0, call("c1", "pay", "{}")),
            )
            .await
        })
        .unwrap();
    assert!(is_completed(&again), "{again:?}");
    assert_eq!(tool.effects(), 1);
}

/// The raw Ledger API: the app begins a call, its tool runs on another
/// thread, and meanwhile the app closes the ledger (drops it: the session
/// ends) and opens it again; the tool's thread commits with the ticket it
/// holds. Must: the result is not lost (committed, or refused with a typed
/// error and kept as evidence so the call is not reported as "nothing
/// known"). Records what it saw; PASSES when one of those holds.
#[test]
fn a_commit_after_the_ledger_was_closed_and_reopened_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let first = Ledger::open(&path, LedgerConfig::default()).unwrap();
    let t = ticket(first.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap());
    drop(first);
    let again = Ledger::open(&path, LedgerConfig::default()).unwrap();
    let committed = again.commit(&t.attempt_id(), r#"{"sent":1}"#, None);
    let rec = again.get(&t.execution_id).unwrap().unwrap();
    let evidence = again.evidence(&t.execution_id).unwrap();
    eprintln!(
        "commit after reopen: {committed:?}; stored {}; evidence {}",
        rec.status,
        evidence.len()
    );
    assert!(
        (committed.is_ok() && rec.status == ExecutionStatus::Committed)
            || (committed.is_err() && !evidence.is_empty()),
        "commit {committed:?}, stored {}, evidence {}",
        rec.status,
        evidence.len()
    );
}

/// Two lifecycle callbacks both call `suspend()` at once (a scene and the
/// app delegate; the docs say suspending twice is a no-op). The second
/// one's mark meets the store the first one closed and `suspend()` answers
/// `Err(Store(Suspended))` ("the ledger is suspended") to a caller that
/// asked to suspend it, though the ledger is suspended as asked.
/// Must: `Ok(())` for both (a no-op), as for two suspends in sequence.
/// FAILS on the current code (racy: up to 3,000 tries).
#[test]
fn two_suspends_at_once_both_answer_ok() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(Ledger::open(&dir.path().join("l.db"), LedgerConfig::default()).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut found = None;
        for i in 0..3000u32 {
            a.resume().unwrap();
            let a2 = a.clone();
            let other = std::thread::spawn(move || a2.suspend());
            let mine = a.suspend();
            let theirs = other.join().unwrap();
            if mine.is_err() || theirs.is_err() {
                found = Some(format!("try {i}: {mine:?} / {theirs:?}"));
                break;
            }
        }
        let _ = tx.send(found);
    });
    let found = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("hang: two suspends did not finish within 120 s");
    assert!(
        found.is_none(),
        "a suspend answered an error: {}",
        found.unwrap()
    );
}

// ---------------------------------------------------------------------------
// Caller-driven reports twice and out of order.
// ---------------------------------------------------------------------------

/// A caller-driven walk reports attempt 1 twice, contradicting itself: first
/// a retryable refusal (a proxy's 503 reached the tool first), then — the
/// backend had done it — `Committed` for the same attempt (the tool's
/// callback fires again with the real answer). The second report is
/// refused and kept as evidence of an effect (row 41's rule), the call
/// stays `failed_before_commit`, retryable. The walk then follows the
/// first answer's `Retry`: `retry()` hands out attempt 2 of a tool with
/// neither key nor lookup, and the email goes out a second time.
/// Must: once an attempt is known to have made its effect (evidence of an
/// effect), no further attempt is handed out for a tool that cannot dedupe
/// (the call answers the effect, or `Unknown` for the app), never a resend.
/// FAILS on the current code: the late commit answers `Done(Failed
/// { retryable: true })` (the caller just said it committed), `retry()`
/// hands out attempt 2, two effects, and the call ends `committed` with
/// the second send's result while the first's sits in evidence.
#[test]
fn a_commit_reported_after_a_retryable_refusal_of_the_same_attempt_is_never_sent_again() {
    use toolledger::executor::CallerStep;
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    exec.register(tool.clone()).unwrap();
    let c = call("c1", "send", r#"{"to":"a"}"#);
    let mut effects = 0;
    let CallerStep::Perform(a1) = exec.start(&op("o"), 0, c.clone()).unwrap() else {
        panic!("a first attempt")
    };
    effects += 1; // the backend did it; the answer the tool got first was a 503
    let refused = exec
        .report(
            &a1,
            Ok(PerformOutcome::FailedBeforeCommit {
                reason: "503 from the proxy".into(),
                retryable: true,
            }),
        )
        .unwrap();
    let late = exec.report(
        &a1,
        Ok(PerformOutcome::Committed {
            result_json: r#"{"sent":1}"#.into(),
            external_id: None,
        }),
    );
    let id = a1.request.execution_id.clone();
    let evidence = exec.ledger().evidence(&id).unwrap().len();
    let next = match &refused {
        CallerStep::Retry { attempt, .. } => exec.retry(attempt).unwrap(),
        other => other.clone(),
    };
    if let CallerStep::Perform(a2) = &next {
        effects += 1; // the walk sends attempt 2
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
        "refused -> {refused:?}\nlate commit -> {late:?}\nevidence {evidence}\nretry -> {next:?}\n\
         stored {} {:?}; effects {effects}",
        rec.status, rec.result_json
    );
    assert_eq!(
        effects, 1,
        "after a reported effect (kept as evidence: {evidence}) the call was sent again: \
         late commit {late:?}, then retry {next:?}"
    );
}

//! Caller-driven rounds (`Executor::start_round`): every call of one model
//! response checked first, the side-effecting ones begun in one durable
//! transaction, each call handed its first step; the caller walks the steps
//! as it walks `start`'s. Effects are counted at the loopback downstream.

use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use downstream::{Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{
    BatchMode, CallOutcome, CallerStep, Error as ExecError, Executor, PerformOutcome,
    ToolDescriptor,
};
use toolledger::ledger::{Ledger, LedgerConfig, LedgerEvent, LedgerObserver};
use toolledger::model::{ExecutionStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

use crate::caller_driven::{drive, perform, tool};

fn pay_call(n: u32) -> ToolCall {
    let mut c = call(
        &format!("call_{n}"),
        "pay",
        &format!(r#"{{"amount":"{n}.00"}}"#),
    );
    c.position = n;
    c
}

fn weather() -> Arc<HttpTool> {
    Arc::new(HttpTool::new(
        ToolDescriptor::read_only("weather", 1),
        Kind::Read,
        &Downstream::start(Behaviour::default()),
    ))
}

fn records(exec: &Executor) -> u64 {
    exec.ledger()
        .stats()
        .unwrap()
        .executions_by_status
        .iter()
        .map(|(_, n)| n)
        .sum()
}

fn completed(step: &CallerStep) -> bool {
    matches!(step, CallerStep::Done(CallOutcome::Completed { .. }))
}

#[test]
fn a_round_hands_out_every_call_at_once_each_performs_once_and_a_repeat_replays_all() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    exec.register(tool(&service, true, false)).unwrap();
    exec.register(weather()).unwrap();
    let mut round: Vec<ToolCall> = (0..3).map(pay_call).collect();
    round.push(call("call_w", "weather", r#"{"city":"Oslo"}"#));
    let steps = exec.start_round(&op("op"), 0, round.clone()).unwrap();
    assert_eq!(steps.len(), 4);
    // Every side-effecting call is begun (durable, executing) before any
    // tool runs; the read-only call records nothing.
    for (step, call) in steps.iter().zip(&round).take(3) {
        let CallerStep::Perform(a) = step else {
            panic!("{step:?}")
        };
        assert!(!a.read_only);
        assert_eq!(a.request.attempt, 1);
        let rec = exec.ledger().get(&a.request.execution_id).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Executing);
        assert!(a.request.execution_id.as_str().contains(&call.call_id));
    }
    assert!(matches!(&steps[3], CallerStep::Perform(a) if a.read_only));
    assert_eq!(records(&exec), 3);
    // While they are handed out, another caller of the round gets InFlight
    // for each side-effecting call (and its own read-only attempt).
    let second = exec.start_round(&op("op"), 0, round.clone()).unwrap();
    for step in &second[..3] {
        assert!(
            matches!(step, CallerStep::Done(CallOutcome::InFlight { .. })),
            "{step:?}"
        );
    }
    // The first caller walks its steps, in parallel (the read-only one
    // answered by hand: `drive` posts to the payment downstream).
    let outs: Vec<CallOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = steps
            .into_iter()
            .map(|step| {
                s.spawn(|| match step {
                    CallerStep::Perform(a) if a.read_only => {
                        let ok = Ok(PerformOutcome::Committed {
                            result_json: r#"{"temp":3}"#.into(),
                            external_id: None,
                        });
                        match exec.report(&a, ok).unwrap() {
                            CallerStep::Done(out) => out,
                            other => panic!("{other:?}"),
                        }
                    }
                    step => drive(&exec, &service, step).0,
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        matches!(&outs[3], CallOutcome::Completed { .. }),
        "{:?}",
        outs[3]
    );
    for out in &outs[..3] {
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
    }
    assert_eq!(service.effects().len(), 3);
    let again = exec.start_round(&op("op"), 0, round.clone()).unwrap();
    for (step, out) in again.iter().zip(&outs).take(3) {
        let CallerStep::Done(CallOutcome::Completed {
            replayed: true,
            result_json,
            ..
        }) = step
        else {
            panic!("{step:?}")
        };
        assert_eq!(Some(result_json.as_str()), out.result_json());
    }
    assert_eq!(service.posts().len(), 3, "a replayed round sends nothing");
}

#[test]
fn one_bad_call_stops_the_whole_round_with_nothing_recorded() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    exec.register(tool(&service, true, false)).unwrap();
    exec.register(weather()).unwrap();
    let batch = ToolDescriptor {
        batch: BatchMode::Independent,
        ..ToolDescriptor::side_effect("batch", 1)
    };
    exec.register(Arc::new(HttpTool::new(batch, Kind::Effect, &service)))
        .unwrap();
    let good = || vec![pay_call(0), pay_call(1)];
    type Expected = fn(&ExecError) -> bool;
    let cases: Vec<(ToolCall, Expected)> = vec![
        (call("c_x", "no_such_tool", "{}"), |e| {
            matches!(e, ExecError::UnknownTool(_))
        }),
        (call("c_b", "batch", r#"{"items":[{}]}"#), |e| {
            matches!(e, ExecError::CallerDriven(_))
        }),
        (call("c_j", "pay", r#"{"amount":"#), |e| {
            matches!(e, ExecError::Ledger(_))
        }),
        (call("c_r", "weather", "[1,"), |e| {
            matches!(e, ExecError::Ledger(_))
        }),
        (
            call(
                "c_big",
                "pay",
                &format!(r#"{{"a":"{}"}}"#, "x".repeat(2 << 20)),
            ),
            |e| matches!(e, ExecError::Ledger(_)),
        ),
    ];
    for (bad, expected) in cases {
        for at in 0..3 {
            let mut round = good();
            round.insert(at, bad.clone());
            let err = exec.start_round(&op("op"), 0, round).unwrap_err();
            assert!(expected(&err), "{}: {err:?}", bad.tool_name);
            assert_eq!(records(&exec), 0, "{}", bad.tool_name);
        }
    }
    assert_eq!(service.posts().len(), 0);
    // The good calls alone still run.
    let steps = exec.start_round(&op("op"), 0, good()).unwrap();
    assert!(steps.iter().all(|s| matches!(s, CallerStep::Perform(_))));
}

#[test]
fn an_empty_round_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    assert!(exec
        .start_round(&op("op"), 0, Vec::new())
        .unwrap()
        .is_empty());
    assert_eq!(records(&exec), 0);
}

#[test]
fn threads_starting_one_round_at_once_get_one_perform_per_call() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    exec.register(tool(&service, false, false)).unwrap();
    let threads = 6;
    let barrier = Arc::new(Barrier::new(threads));
    let round: Vec<ToolCall> = (0..4).map(pay_call).collect();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (exec, barrier, round) = (exec.clone(), barrier.clone(), round.clone());
            std::thread::spawn(move || {
                barrier.wait();
                exec.start_round(&op("op"), 0, round).unwrap()
            })
        })
        .collect();
    let all: Vec<Vec<CallerStep>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for call in 0..4 {
        let performs = all
            .iter()
            .filter(|steps| matches!(steps[call], CallerStep::Perform(_)))
            .count();
        let in_flight = all
            .iter()
            .filter(|steps| matches!(steps[call], CallerStep::Done(CallOutcome::InFlight { .. })))
            .count();
        assert_eq!((performs, in_flight), (1, threads - 1), "call {call}");
    }
    for steps in all {
        for step in steps {
            drive(&exec, &service, step);
        }
    }
    assert_eq!(service.effects().len(), 4);
    let again = exec.start_round(&op("op"), 0, round).unwrap();
    assert!(again.iter().all(completed), "{again:?}");
}

/// Takes the write lock from another connection as soon as the round's
/// begin has committed, and holds it for `hold`: the reconciliation that
/// follows in the same `start_round` cannot write.
struct LockAfterBegin {
    path: std::path::PathBuf,
    hold: Duration,
    armed: Mutex<bool>,
    holder: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl LedgerObserver for LockAfterBegin {
    fn on_event(&self, _event: &LedgerEvent) {
        let mut armed = self.armed.lock().unwrap();
        if !*armed {
            return;
        }
        *armed = false;
        let (path, hold) = (self.path.clone(), self.hold);
        let (locked_tx, locked) = mpsc::channel();
        *self.holder.lock().unwrap() = Some(std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked_tx.send(()).unwrap();
            std::thread::sleep(hold);
            conn.execute_batch("ROLLBACK").unwrap();
        }));
        locked.recv().unwrap();
    }
}

impl LockAfterBegin {
    /// Joins the thread that held the lock, if it ran.
    fn released(&self) {
        if let Some(holder) = self.holder.lock().unwrap().take() {
            holder.join().unwrap();
        }
    }
}

/// An executor over `path` with `service`'s key tool, a 300 ms busy timeout
/// and a [`LockAfterBegin`] observer holding the lock for `hold` once armed.
fn executor_locked_after_begin(
    path: &std::path::Path,
    service: &Downstream,
    hold: Duration,
    armed: bool,
) -> (Executor, Arc<LockAfterBegin>) {
    let config = LedgerConfig {
        busy_timeout: Duration::from_millis(300),
        ..LedgerConfig::default()
    };
    let ledger = Ledger::open(path, config).unwrap();
    let observer = Arc::new(LockAfterBegin {
        path: path.to_path_buf(),
        hold,
        armed: Mutex::new(armed),
        holder: Mutex::new(None),
    });
    ledger.set_observer(Some(observer.clone())).unwrap();
    let exec = Executor::new(Arc::new(ledger), downstream::fast_config());
    exec.register(tool(service, true, false)).unwrap();
    (exec, observer)
}

/// Fails when any step is `InFlight`: nothing of the round is left in
/// flight in this live process.
fn none_in_flight(steps: &[CallerStep]) {
    for step in steps {
        assert!(
            !matches!(step, CallerStep::Done(CallOutcome::InFlight { .. })),
            "left in flight in this live process: {step:?}"
        );
    }
}

#[test]
fn a_round_whose_reconciliation_fails_leaves_no_call_in_flight() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    // A first process hands out call 0, the effect happens, and it dies
    // before it reports.
    {
        let first = executor_at(&path);
        first.register(tool(&service, true, false)).unwrap();
        let a = match first.start(&op("op"), 0, pay_call(0)).unwrap() {
            CallerStep::Perform(a) => a,
            other => panic!("{other:?}"),
        };
        assert!(perform(&service, &a.request).is_ok());
        first.ledger().abandon();
    }
    let (exec, observer) =
        executor_locked_after_begin(&path, &service, Duration::from_millis(600), true);
    // Call 1 is new (handed out at once); call 0's dead attempt is marked
    // unknown in the same begin, and its same-key resend cannot be written.
    let round = vec![pay_call(1), pay_call(0), pay_call(2)];
    let err = exec.start_round(&op("op"), 0, round.clone()).unwrap_err();
    assert!(matches!(err, ExecError::Ledger(_)), "{err:?}");
    observer.released();
    // Nothing of the round is left in flight in this process: the next ask
    // runs every call (the handed-out ones were recorded as never sent, or
    // are reconciled as this executor's orphans), and each has one effect.
    let steps = exec.start_round(&op("op"), 0, round.clone()).unwrap();
    none_in_flight(&steps);
    for step in steps {
        let (out, _, _) = drive(&exec, &service, step);
        assert!(matches!(out, CallOutcome::Completed { .. }), "{out:?}");
    }
    assert_eq!(service.effects().len(), 3);
    let again = exec.start_round(&op("op"), 0, round).unwrap();
    assert!(again.iter().all(completed), "{again:?}");
}

/// Two calls of one round with the same call id (a model that repeats a
/// call id): one execution, one Perform, the other answered `InFlight` (the
/// same arguments) or `Conflict` (other arguments); one effect.
#[test]
fn duplicate_call_ids_in_one_round_get_one_perform_and_other_arguments_a_conflict() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    exec.register(tool(&service, true, false)).unwrap();
    let same = vec![pay_call(1), pay_call(1)];
    let steps = exec.start_round(&op("op"), 0, same).unwrap();
    let performs = steps
        .iter()
        .filter(|s| matches!(s, CallerStep::Perform(_)))
        .count();
    assert_eq!(performs, 1, "{steps:?}");
    assert!(
        matches!(&steps[1], CallerStep::Done(CallOutcome::InFlight { .. })),
        "{:?}",
        steps[1]
    );
    for step in steps {
        drive(&exec, &service, step);
    }
    assert_eq!(service.effects().len(), 1);
    let mut other = pay_call(2);
    other.call_id = "call_1".into();
    other.arguments = r#"{"amount":"99.00"}"#.into();
    let again = exec
        .start_round(&op("op2"), 0, vec![pay_call(1), other])
        .unwrap();
    assert!(
        matches!(&again[0], CallerStep::Perform(_)),
        "{:?}",
        again[0]
    );
    assert!(
        matches!(&again[1], CallerStep::Done(CallOutcome::Conflict { .. })),
        "{:?}",
        again[1]
    );
    for step in again {
        drive(&exec, &service, step);
    }
    assert_eq!(service.effects().len(), 2);
    assert_eq!(records(&exec), 2);
}

/// An attempt this executor stopped driving (its `execute` future was
/// dropped mid-perform: an orphan), asked for again in a round whose
/// takeover of it cannot write (another connection holds the write lock
/// just after the round's begin): `start_round` fails, as it may, and the
/// attempt stays this executor's orphan. (Before the fix the takeover
/// forgot the orphan ahead of its write: once the lock was free the call
/// was `executing` under this live session, nobody's, and `InFlight` to
/// every later ask of the process, `recover()` included.)
#[test]
fn an_orphan_whose_takeover_cannot_be_written_stays_an_orphan_not_in_flight() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        latency: Duration::from_millis(400),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (exec, observer) =
        executor_locked_after_begin(&path, &service, Duration::from_millis(1500), false);
    // The caller of call 0 goes away while its tool runs: an orphan.
    let rt = runtime();
    rt.block_on(async {
        let gone = tokio::time::timeout(
            Duration::from_millis(100),
            exec.execute(&op("op"), 0, pay_call(0)),
        )
        .await;
        assert!(gone.is_err(), "{gone:?}");
    });
    drop(rt);
    std::thread::sleep(Duration::from_millis(600));
    *observer.armed.lock().unwrap() = true;
    let round = vec![pay_call(0), pay_call(1)];
    let err = exec.start_round(&op("op"), 0, round.clone());
    assert!(matches!(err, Err(ExecError::Ledger(_))), "{err:?}");
    observer.released();
    let recovered = runtime().block_on(exec.recover()).unwrap();
    assert!(
        !recovered
            .outcomes
            .iter()
            .any(|o| matches!(o, CallOutcome::InFlight { .. })),
        "{:?}",
        recovered.outcomes
    );
    for _ in 0..3 {
        let steps = exec.start_round(&op("op"), 0, round.clone()).unwrap();
        none_in_flight(&steps);
        for step in steps {
            drive(&exec, &service, step);
        }
    }
    assert_eq!(
        service.effects().len(),
        2,
        "one effect per call (the key dedupes)"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

//! A call answered in place (`Executor::start_now`, `Ledger::begin_now`):
//! the replay of a committed call comes back at once on the caller's thread,
//! exactly as `start` answers it, with no write and no effect; everything
//! else — a new call, a store another call holds, a busy file — says "go
//! the normal way" at once instead of waiting, and writes nothing.
//! Effects are counted at the loopback downstream; every wait here is
//! bounded, so a `start_now` that wrongly waits fails instead of hanging.

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use downstream::{Behaviour, Downstream};
use support::*;
use toolledger::executor::{CallOutcome, CallerStep, Error as ExecError, Executor};
use toolledger::ledger::{Error as LedgerError, Ledger, LedgerConfig, StorageError};
use toolledger::model::{ExecutionStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

use crate::caller_driven::{drive, pay, tool};

/// An executor whose ledger waits `busy` for another connection's lock.
fn executor(path: &Path, service: &Downstream, busy: Duration) -> Executor {
    let config = LedgerConfig {
        busy_timeout: busy,
        ..LedgerConfig::default()
    };
    let exec = Executor::new(
        Arc::new(Ledger::open(path, config).unwrap()),
        downstream::fast_config(),
    );
    exec.register(tool(service, true, false)).unwrap();
    exec
}

/// Runs `f` on a thread of its own and waits at most 10 s for it.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} waited (or panicked)"))
}

/// The WAL's length: a write of any kind grows it (nothing checkpoints in
/// between here).
fn wal_len(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

#[test]
fn a_committed_call_is_replayed_in_place_exactly_as_start_answers_it() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let exec = executor(&path, &service, Duration::from_secs(5));
    let (out, performs, _) = drive(&exec, &service, exec.start(&op("op"), 0, pay()).unwrap());
    assert_eq!(performs, 1);
    let id = out.execution_id().clone();

    let wal = wal_len(&path);
    let replays = exec.metrics().replays;
    let now = exec.start_now(&op("op"), 0, &pay()).unwrap();
    let Some(CallerStep::Done(CallOutcome::Completed {
        execution_id,
        result_json,
        replayed: true,
        partial: false,
        ..
    })) = &now
    else {
        panic!("{now:?}")
    };
    assert_eq!(execution_id, &id);
    assert_eq!(Some(result_json.as_str()), out.result_json());
    // Nothing written, the replay counted as `start` counts it, and the
    // same answer as `start`'s.
    assert_eq!(wal_len(&path), wal);
    assert_eq!(exec.metrics().replays, replays + 1);
    assert_eq!(now, Some(exec.start(&op("op"), 0, pay()).unwrap()));
    // No delivery mark queued (`start` queues none either): a write that
    // carries the queue leaves the record committed.
    let _ = exec
        .start(&op("op"), 0, call("call_2", "pay", r#"{"amount":"1"}"#))
        .unwrap();
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.attempt_count, 1);
    // Delivered: still the same replay.
    exec.ledger()
        .mark_delivered(std::slice::from_ref(&id))
        .unwrap();
    assert_eq!(
        exec.start_now(&op("op"), 0, &pay()).unwrap(),
        Some(exec.start(&op("op"), 0, pay()).unwrap())
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
}

#[test]
fn anything_but_a_replay_goes_the_normal_way_and_writes_nothing() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let exec = executor(&path, &service, Duration::from_secs(5));
    exec.register(Arc::new(downstream::HttpTool::new(
        toolledger::executor::ToolDescriptor::read_only("look", 1),
        downstream::Kind::Read,
        &service,
    )))
    .unwrap();
    // Settle the ledger's own first writes (its session row).
    drive(&exec, &service, exec.start(&op("warm"), 0, pay()).unwrap());

    let wal = wal_len(&path);
    // A new call: no operation, no execution, no byte written.
    assert_eq!(exec.start_now(&op("op"), 0, &pay()).unwrap(), None);
    assert_eq!(wal_len(&path), wal);
    assert!(exec.ledger().list(&op("op")).unwrap().is_empty());
    // A read-only tool's call must run its tool.
    let look = call("call_9", "look", "{}");
    assert_eq!(exec.start_now(&op("op"), 0, &look).unwrap(), None);
    // The same call with other arguments than the committed one: `start`
    // answers the conflict; in place it is not answered.
    let (out, performs, _) = drive(&exec, &service, exec.start(&op("op"), 0, pay()).unwrap());
    assert_eq!(performs, 1);
    let other = call("call_1", "pay", r#"{"amount":"99"}"#);
    assert_eq!(exec.start_now(&op("op"), 0, &other).unwrap(), None);
    let wal = wal_len(&path);
    assert!(matches!(
        exec.start(&op("op"), 0, other).unwrap(),
        CallerStep::Done(CallOutcome::Conflict { .. })
    ));
    // An attempt in flight: `start` answers InFlight; in place, nothing.
    let attempt = match exec.start(&op("op"), 1, pay()).unwrap() {
        CallerStep::Perform(a) => a,
        other => panic!("{other:?}"),
    };
    let wal_after = wal_len(&path);
    assert!(wal_after >= wal);
    assert_eq!(exec.start_now(&op("op"), 1, &pay()).unwrap(), None);
    assert_eq!(wal_len(&path), wal_after);
    let _ = exec
        .report(
            &attempt,
            Ok(toolledger::executor::PerformOutcome::Committed {
                result_json: "{}".into(),
                external_id: None,
            }),
        )
        .unwrap();
    // The new call goes the normal way and runs exactly once.
    let (again, performs, _) = drive(&exec, &service, exec.start(&op("op"), 0, pay()).unwrap());
    assert_eq!(performs, 0);
    assert_eq!(again.result_json(), out.result_json());
    assert_eq!(service.effects().len(), 2);
}

#[test]
fn bad_input_and_a_suspended_ledger_give_the_errors_start_gives() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor(&dir.path().join("l.db"), &service, Duration::from_secs(5));
    drive(&exec, &service, exec.start(&op("op"), 0, pay()).unwrap());
    let cases: Vec<ToolCall> = vec![
        call("call_1", "nobody", "{}"),
        call("call_1", "pay", "{not json"),
        call("", "pay", "{}"),
        call(
            "call_1",
            "pay",
            &format!(r#"{{"a":"{}"}}"#, "x".repeat(2 << 20)),
        ),
    ];
    for bad in cases {
        let now = exec.start_now(&op("op"), 0, &bad).unwrap_err();
        let normal = exec.start(&op("op"), 0, bad).unwrap_err();
        assert_eq!(now.to_string(), normal.to_string());
        assert_eq!(
            std::mem::discriminant(&now),
            std::mem::discriminant(&normal)
        );
    }
    assert!(matches!(
        exec.start_now(&op("op"), 0, &call("call_1", "nobody", "{}")),
        Err(ExecError::UnknownTool(_))
    ));
    exec.ledger().suspend().unwrap();
    for c in [pay(), call("call_2", "pay", "{}")] {
        let now = exec.start_now(&op("op"), 0, &c).unwrap_err();
        assert!(
            matches!(
                now,
                ExecError::Ledger(LedgerError::Store(StorageError::Suspended))
            ),
            "{now:?}"
        );
        assert_eq!(
            now.to_string(),
            exec.start(&op("op"), 0, c).unwrap_err().to_string()
        );
    }
    // Bad arguments on a suspended ledger: the arguments are checked before
    // anything is read, by both.
    let bad = call("call_3", "pay", "{not json");
    let now = exec.start_now(&op("op"), 0, &bad).unwrap_err();
    assert!(
        matches!(now, ExecError::Ledger(LedgerError::Json(_))),
        "{now:?}"
    );
    assert_eq!(
        now.to_string(),
        exec.start(&op("op"), 0, bad).unwrap_err().to_string()
    );
    exec.ledger().resume().unwrap();
    assert!(exec.start_now(&op("op"), 0, &pay()).unwrap().is_some());
    assert_eq!(service.effects().len(), 1);
}

#[test]
fn while_another_call_holds_the_store_a_replay_is_not_answered_in_place_and_never_waits() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    // A writer that meets another connection's lock waits up to 30 s for
    // it, holding the store's one connection all that time.
    let exec = executor(&path, &service, Duration::from_secs(30));
    let (out, _, _) = drive(&exec, &service, exec.start(&op("op"), 0, pay()).unwrap());

    // Another connection holds the file's write lock: a replay is a read,
    // answered in place all the same (WAL readers do not wait for writers).
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert!(matches!(
        exec.start_now(&op("op"), 0, &pay()).unwrap(),
        Some(CallerStep::Done(CallOutcome::Completed {
            replayed: true,
            ..
        }))
    ));

    // A new call now waits for that lock on a thread of its own, holding
    // the store's connection.
    let writer = {
        let exec = exec.clone();
        std::thread::spawn(move || {
            exec.start(&op("op"), 0, call("call_2", "pay", r#"{"amount":"2"}"#))
        })
    };
    // From the caller: "would block", at once, every time (the writer holds
    // the connection for up to 30 s). Seen twice 50 ms apart: past the
    // writer's short first transactions, in its long wait.
    let probe = exec.clone();
    let slowest = bounded("start_now while the store is held", move || {
        let deadline = Instant::now() + Duration::from_secs(8);
        let mut slowest = Duration::ZERO;
        let mut blocked_in_a_row = 0;
        while blocked_in_a_row < 2 {
            assert!(Instant::now() < deadline, "the writer never held the store");
            let t = Instant::now();
            let answer = probe.start_now(&op("op"), 0, &pay()).unwrap();
            slowest = slowest.max(t.elapsed());
            match answer {
                None => blocked_in_a_row += 1,
                Some(step) => {
                    assert!(matches!(
                        step,
                        CallerStep::Done(CallOutcome::Completed { replayed: true, .. })
                    ));
                    blocked_in_a_row = 0;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        slowest
    });
    assert!(
        slowest < Duration::from_secs(2),
        "start_now took {slowest:?}"
    );
    assert!(!writer.is_finished(), "the writer stopped waiting");

    // The lock released, the writer's call goes on (once), and the replay
    // is answered in place again.
    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    let first = writer.join().unwrap().unwrap();
    let (second, performs, _) = drive(&exec, &service, first);
    assert_eq!(performs, 1);
    assert!(matches!(
        second,
        CallOutcome::Completed {
            replayed: false,
            ..
        }
    ));
    let again = exec.start_now(&op("op"), 0, &pay()).unwrap();
    let Some(CallerStep::Done(CallOutcome::Completed {
        result_json,
        replayed: true,
        ..
    })) = again
    else {
        panic!("{again:?}")
    };
    assert_eq!(Some(result_json.as_str()), out.result_json());
    assert_eq!(service.effects().len(), 2);
}

/// Argument texts that canonicalise alike, differently or not at all:
/// order, spacing and number spellings of one object, another value, a
/// repeated key (also escaped), out-of-range and exact numbers, a lone
/// surrogate, a BOM, trailing text, the nesting and size limits either side.
fn argument_texts() -> Vec<String> {
    let mut texts: Vec<String> = [
        r#"{"a":1,"b":[1,2]}"#,
        r#"{ "b" : [1,2] , "a" : 1 }"#,
        r#"{"b":[1,2],"a":1.0}"#,
        r#"{"b":[1,2],"a":1e0}"#,
        r#"{"b":[1,2],"a":10e-1}"#,
        r#"{"b":[1,2],"a":2}"#,
        r#"{"a":1,"b":[1,2],"a":1}"#,
        r#"{"a":1,"\u0061":1}"#,
        r#"{"a":1e400}"#,
        r#"{"a":1e-400}"#,
        r#"{"a":-0}"#,
        r#"{"a":123456789012345678901234567890}"#,
        r#"{"a":"\ud800"}"#,
        r#"{"a":"\u00e9"}"#,
        "{\"a\":\"\u{e9}\"}",
        r#"{"a":01}"#,
        r#"{"a":1,}"#,
        "\u{feff}{}",
        "{} ",
        " {}",
        "",
        "null",
        "[]",
        r#"{"a":"x\ny"}"#,
        "{\"a\":\"x\ny\"}",
        r#"{"a":1} {"b":2}"#,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    texts.push(format!("{}1{}", "[".repeat(64), "]".repeat(64)));
    texts.push(format!("{}1{}", "[".repeat(65), "]".repeat(65)));
    texts.push(format!(r#"{{"a":"{}"}}"#, "x".repeat(1 << 20)));
    texts.push(format!(r#"{{"a":"{}"}}"#, "x".repeat((1 << 20) - 8)));
    texts
}

/// On `ledger`, with one committed call: for every text of
/// [`argument_texts`] under the committed call's id, a new id and an empty
/// one, `begin_now` answers a replay exactly as `begin` does, answers
/// nothing where `begin` answers anything else, and fails exactly where
/// `begin` fails, with the same error.
fn compare_begin_now_with_begin(ledger: &Ledger, what: &str) {
    use toolledger::ledger::{Begin, CallSpec};
    use toolledger::model::{OperationId, ToolCall};
    let op = OperationId::new("op").unwrap();
    let first = CallSpec::new(ToolCall::custom("c1", "t", r#"{"a":1,"b":[1,2]}"#), 1);
    let Begin::Execute(t) = ledger.begin(&op, 0, &first).unwrap() else {
        panic!()
    };
    ledger
        .commit(&t.attempt_id(), r#"{"ok":true}"#, None)
        .unwrap();
    let mut mismatches = Vec::new();
    for (i, text) in argument_texts().into_iter().enumerate() {
        for call_id in ["c1", &format!("new{i}"), ""] {
            let spec = CallSpec::new(ToolCall::custom(call_id, "t", text.clone()), 1);
            let now = ledger.begin_now(&op, 0, &spec);
            let normal = ledger.begin(&op, 0, &spec);
            let agree = match (&now, &normal) {
                (Ok(Some(a @ Begin::Replay(_))), Ok(b @ Begin::Replay(_))) => {
                    format!("{a:?}") == format!("{b:?}")
                }
                (Ok(Some(_)), _) => false,
                (Ok(None), Ok(Begin::Replay(_))) => false,
                (Ok(None), Ok(_)) => true,
                (Err(a), Err(b)) => format!("{a:?}") == format!("{b:?}"),
                _ => false,
            };
            if !agree {
                let short: String = text.chars().take(40).collect();
                mismatches.push(format!(
                    "{what} {call_id:?} {short:?}: {now:?} vs {normal:?}"
                ));
            }
        }
    }
    assert_eq!(mismatches, Vec::<String>::new());
}

/// `begin_now` looks the id up before it digests the arguments (only a
/// committed record pays for the digest); it must answer as `begin` does
/// for every input, plain and encrypted (a keyed digest).
#[test]
fn begin_now_agrees_with_begin_on_every_input_plain_and_encrypted() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Ledger::open(&dir.path().join("p.db"), LedgerConfig::default()).unwrap();
    compare_begin_now_with_begin(&plain, "plain");
    let key = toolledger::ledger::LedgerKey::from_bytes(&[3; 32]).unwrap();
    let enc =
        Ledger::open_encrypted(&dir.path().join("e.db"), LedgerConfig::default(), &key).unwrap();
    compare_begin_now_with_begin(&enc, "encrypted");
}

//! Exactly one owner: fencing, liveness, suspension, landing windows, one file identity.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use downstream::{Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{
    BatchMode, CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError,
    ToolHandler, ToolRequest,
};
use toolledger::ledger::{
    Begin, CallSpec, Error, Ledger, LedgerConfig, ManualClock, Resolution, Resolved, Ticket,
};
use toolledger::model::{ExecutionId, ExecutionStatus, OperationStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

fn config() -> ExecutorConfig {
    ExecutorConfig {
        max_attempts: 3,
        read_only_max_attempts: 3,
        perform_timeout: Some(Duration::from_millis(200)),
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(2),
        max_parallel: 4,
    }
}

fn executor_at(path: &Path, clock: &Arc<ManualClock>) -> Executor {
    Executor::new(Arc::new(open_with(path, clock)), config())
}

fn pay_call() -> ToolCall {
    ToolCall::custom("call_1", "pay", r#"{"amount":"12.50","to":"bob"}"#)
}

async fn wait_for(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------
// 1. A slow server that applies the request after the client gave up
// ---------------------------------------------------------------------------

fn lookup_tool(service: &Downstream) -> Arc<HttpTool> {
    let desc = ToolDescriptor {
        lookup: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    Arc::new(HttpTool::new(desc, Kind::Effect, service).with_timeout(Duration::from_secs(5)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_inside_the_landing_window_never_leads_to_a_resend() {
    // The server holds each POST 1.5 s, then applies it; the executor gives
    // up after 200 ms. The tool can look effects up; the server does not
    // dedupe by key.
    let service = Downstream::start(Behaviour {
        post_delay: Duration::from_millis(1_500),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let exec = executor_at(&dir.path().join("l.db"), &clock);
    exec.register(lookup_tool(&service)).unwrap();
    let op = op("op_slow");

    let out = exec.execute(&op, 0, pay_call()).await.unwrap();
    let CallOutcome::Unknown {
        retry_after: Some(wait),
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert!(*wait > Duration::from_secs(100), "{wait:?}");
    assert_eq!(service.posts().len(), 1, "nothing resent");
    assert_eq!(service.lookups().len(), 1, "looked up, found nothing yet");
    // Asked again at once: however far the request got, nothing is resent.
    let again = exec.execute(&op, 0, pay_call()).await.unwrap();
    assert!(
        matches!(
            again,
            CallOutcome::Unknown { .. } | CallOutcome::Completed { .. }
        ),
        "{again:?}"
    );
    assert_eq!(service.posts().len(), 1);
    // The first request lands after the client gave up; asked again, the
    // lookup finds it: one payment, and the model is told.
    wait_for(|| service.effects().len() == 1).await;
    let done = exec.execute(&op, 0, pay_call()).await.unwrap();
    assert!(matches!(done, CallOutcome::Completed { .. }), "{done:?}");
    assert_eq!(service.effects().len(), 1, "one payment");
    assert_eq!(service.posts().len(), 1, "never resent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_lands_is_resent_once_the_window_has_passed() {
    // The POST is held, then dropped without committing.
    let service = Downstream::start(Behaviour {
        post_delay: Duration::from_millis(400),
        close_before_commit: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let exec = executor_at(&dir.path().join("l.db"), &clock);
    exec.register(lookup_tool(&service)).unwrap();
    let op = op("op_lost");
    let out = exec.execute(&op, 0, pay_call()).await.unwrap();
    assert!(
        matches!(
            out,
            CallOutcome::Unknown {
                retry_after: Some(_),
                ..
            }
        ),
        "{out:?}"
    );
    wait_for(|| service.requests().len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(service.effects().is_empty());
    // Inside the window: unknown, not resent.
    clock.advance(119_000);
    let again = exec.execute(&op, 0, pay_call()).await.unwrap();
    assert!(
        matches!(
            again,
            CallOutcome::Unknown {
                retry_after: Some(_),
                ..
            }
        ),
        "{again:?}"
    );
    assert_eq!(service.posts().len(), 1);
    // Past it: "not found" is conclusive; sent again under the same key
    // (that one is slow too, and lands).
    clock.advance(1_000);
    let resent = exec.execute(&op, 0, pay_call()).await.unwrap();
    assert_eq!(service.posts().len(), 2, "{resent:?}");
    wait_for(|| service.effects().len() == 1).await;
    let done = exec.execute(&op, 0, pay_call()).await.unwrap();
    assert!(matches!(done, CallOutcome::Completed { .. }), "{done:?}");
    assert_eq!(service.posts().len(), 2);
    assert_eq!(service.effects().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_key_resend_to_a_deduping_downstream_stays_allowed_in_the_window() {
    let service = Downstream::start(Behaviour {
        post_delay: Duration::from_millis(400),
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000_000));
    let exec = executor_at(&dir.path().join("l.db"), &clock);
    let desc = ToolDescriptor {
        lookup: true,
        idempotency_key: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    exec.register(Arc::new(
        HttpTool::new(desc, Kind::Effect, &service).with_timeout(Duration::from_secs(2)),
    ))
    .unwrap();
    let op = op("op_key");
    // Times out at 200 ms, looks up (not there yet), resends under the same
    // key: the downstream answers both with the one effect.
    let out = exec.execute(&op, 0, pay_call()).await.unwrap();
    assert!(matches!(out, CallOutcome::Completed { .. }), "{out:?}");
    wait_for(|| service.posts().len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(service.effects().len(), 1, "deduped by key");
}

// ---------------------------------------------------------------------------
// 2 & 3. Live, slow, stopped, clock-stepped and suspended owners
// ---------------------------------------------------------------------------

#[test]
fn a_held_lock_means_alive_whatever_the_clocks_say() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let other = open_with(&path, &clock);
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(t) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    // The owner is slow (an hour on the boot clock), the wall clock steps
    // forward 61 s and then back a day: nothing changes hands.
    clock.advance(3_600_000);
    clock.step_wall(61_000);
    assert!(matches!(
        other.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight {
            retry_after: None,
            ..
        }
    ));
    clock.step_wall(-86_400_000);
    assert_eq!(
        other.recover().unwrap()[0].status,
        ExecutionStatus::Executing
    );
    app.commit(&t.attempt_id(), "{}", None).unwrap();
}

/// The child half of `a_stopped_owner_process_is_alive_until_it_dies`: opens
/// the ledger (system clocks), begins a call, says so, and waits.
#[test]
fn child_owns_a_call() {
    let Ok(db) = std::env::var("TOOLLEDGER_CHILD_OWNER") else {
        return;
    };
    let ledger = Ledger::open(Path::new(&db), LedgerConfig::default()).unwrap();
    let Begin::Execute(_) = ledger.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap() else {
        panic!()
    };
    println!("READY");
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn a_stopped_owner_process_is_alive_until_it_dies() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "ownership::child_owns_a_call", "--nocapture"])
        .env("TOOLLEDGER_CHILD_OWNER", &db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().contains("READY")));
    let pid = child.id().to_string();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    };
    // Stopped (SIGSTOP): it cannot renew anything, but it holds its lock.
    signal("-STOP");
    let ledger = Ledger::open(&db, LedgerConfig::default()).unwrap();
    let s = spec("c1", "pay", "{}");
    assert!(matches!(
        ledger.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    assert_eq!(
        ledger.recover().unwrap()[0].status,
        ExecutionStatus::Executing
    );
    signal("-CONT");
    // Killed: now its attempt is abandoned and reconciled.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(matches!(
        ledger.begin(&op("o"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
}

/// The child half of the suspended-process tests: opens the ledger (system
/// clocks, a 300 ms lease), begins a call, suspends, says so with its
/// session id, and waits to be killed.
#[test]
fn child_suspends_owning_a_call() {
    let Ok(db) = std::env::var("TOOLLEDGER_CHILD_SUSPENDS") else {
        return;
    };
    let config = LedgerConfig {
        lease: Duration::from_millis(300),
        ..LedgerConfig::default()
    };
    let ledger = Ledger::open(Path::new(&db), config).unwrap();
    let Begin::Execute(_) = ledger.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap() else {
        panic!()
    };
    ledger.suspend().unwrap();
    println!("READY {}", ledger.session_id());
    std::thread::sleep(Duration::from_secs(60));
}

/// Starts `child_suspends_owning_a_call` on `db`; its process and session id.
fn spawn_suspended_owner(db: &Path) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ownership::child_suspends_owning_a_call",
            "--nocapture",
        ])
        .env("TOOLLEDGER_CHILD_SUSPENDS", db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let session = lines
        .find_map(|l| l.unwrap().strip_prefix("READY ").map(str::to_owned))
        .expect("the child never got ready");
    (child, session)
}

fn signal(child: &std::process::Child, sig: &str) {
    assert!(std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success());
}

#[test]
fn a_suspended_owner_process_past_its_lease_stays_owner_until_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (mut child, session) = spawn_suspended_owner(&db);
    let lock = dir.path().join(format!("l.db-sessions/{session}.lock"));
    let ledger = Ledger::open(&db, LedgerConfig::default()).unwrap();
    let s = spec("c1", "pay", "{}");
    // Far past its 300 ms lease, and frozen (as iOS freezes a suspended
    // app): its process may be thawed and send, so it is still owner.
    std::thread::sleep(Duration::from_millis(600));
    signal(&child, "-STOP");
    match ledger.begin(&op("o"), 0, &s).unwrap() {
        Begin::InFlight {
            retry_after: Some(wait),
            ..
        } => assert_eq!(wait, Duration::from_millis(300)),
        other => panic!("{other:?}"),
    }
    // Nor does recovery take it, or clean its row and lock file away.
    assert_eq!(
        ledger.recover().unwrap()[0].status,
        ExecutionStatus::Executing
    );
    assert!(lock.exists());
    signal(&child, "-CONT");
    // Killed (and reaped): now the call is taken over.
    child.kill().unwrap();
    child.wait().unwrap();
    let Begin::Reconcile(r) = ledger.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    assert_eq!(r.attempt, 1);
    assert_eq!(
        ledger
            .get(&r.execution_id)
            .unwrap()
            .unwrap()
            .last_reason
            .as_deref(),
        Some("owner session suspended past its lease")
    );
}

#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn a_reused_process_id_does_not_keep_a_suspended_owner_alive() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (mut child, session) = spawn_suspended_owner(&db);
    let lock = dir.path().join(format!("l.db-sessions/{session}.lock"));
    // The lock file records the start time of the process that took it.
    let record = std::fs::read_to_string(&lock).unwrap();
    let start: u64 = record
        .lines()
        .find_map(|l| l.strip_prefix("start "))
        .expect("no start time recorded")
        .parse()
        .unwrap();
    let ledger = Ledger::open(&db, LedgerConfig::default()).unwrap();
    let s = spec("c1", "pay", "{}");
    std::thread::sleep(Duration::from_millis(600));
    assert!(matches!(
        ledger.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    // The process now at that id started at another time: it is not the
    // owner's (the owner died and its id was reused).
    std::fs::write(
        &lock,
        record.replace(&format!("start {start}"), &format!("start {}", start + 1)),
    )
    .unwrap();
    assert!(matches!(
        ledger.begin(&op("o"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// An app that began call c1 (`pay`) of operation o and suspended, and an
/// extension on the same file and manual clock.
struct SuspendedApp {
    app: Ledger,
    extension: Ledger,
    s: CallSpec,
    ticket: Ticket,
    clock: Arc<ManualClock>,
    path: std::path::PathBuf,
    /// Declared last: the files go after both ledgers.
    dir: tempfile::TempDir,
}

fn suspended_app() -> SuspendedApp {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let extension = open_with(&path, &clock);
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(ticket) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    app.suspend().unwrap();
    SuspendedApp {
        app,
        extension,
        s,
        ticket,
        clock,
        path,
        dir,
    }
}

#[test]
fn a_suspended_owner_is_alive_until_its_lease_lapses_on_the_boot_clock() {
    let SuspendedApp {
        app,
        extension,
        s,
        dir: _dir,
        path: _path,
        clock,
        ticket: t,
    } = suspended_app();
    // The suspended app holds no lock, yet its call is not up for grabs.
    match extension.begin(&op("o"), 0, &s).unwrap() {
        Begin::InFlight {
            retry_after: Some(wait),
            ..
        } => assert_eq!(wait, Duration::from_secs(60)),
        other => panic!("{other:?}"),
    }
    // A wall-clock step changes nothing; the boot clock does.
    clock.step_wall(3_600_000);
    assert_eq!(
        extension.recover().unwrap()[0].status,
        ExecutionStatus::Executing
    );
    clock.advance(59_999);
    assert!(matches!(
        extension.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    // Past the lease, the app's process still runs it (the app is open in
    // this process): a thawed app may still send, so it stays owner, and
    // the extension is told to ask again in a lease.
    clock.advance(1);
    match extension.begin(&op("o"), 0, &s).unwrap() {
        Begin::InFlight {
            retry_after: Some(wait),
            ..
        } => assert_eq!(wait, Duration::from_secs(60)),
        other => panic!("{other:?}"),
    }
    clock.advance(86_400_000);
    assert!(matches!(
        extension.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    assert_eq!(
        extension.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Executing
    );
    // The process is killed while suspended: past the lease, the call is
    // taken over.
    app.abandon();
    let Begin::Reconcile(r) = extension.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    assert_eq!(r.attempt, 1);
    let rec = extension.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(
        rec.last_reason.as_deref(),
        Some("owner session suspended past its lease")
    );
}

#[test]
fn a_suspended_owner_killed_inside_its_lease_stays_owner_until_the_lease_lapses() {
    let SuspendedApp {
        app,
        extension,
        s,
        dir: _dir,
        path: _path,
        clock,
        ticket: t,
    } = suspended_app();
    app.abandon();
    drop(app);
    // Its request may still be on its way: the lease holds, as before.
    clock.advance(59_999);
    assert!(matches!(
        extension.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    clock.advance(1);
    assert!(matches!(
        extension.begin(&op("o"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
    assert_eq!(
        extension.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::OutcomeUnknown
    );
}

#[test]
fn a_suspended_ledger_dropped_in_a_running_process_is_taken_over_past_its_lease() {
    let SuspendedApp {
        app,
        extension,
        s,
        dir,
        path: _path,
        clock,
        ticket: _,
    } = suspended_app();
    let lock = dir
        .path()
        .join(format!("l.db-sessions/{}.lock", app.session_id()));
    assert!(lock.exists());
    // Dropped while suspended (nothing of it can send any more): its lock
    // file says so, so the process that goes on running does not keep the
    // call.
    drop(app);
    assert!(std::fs::read_to_string(&lock)
        .unwrap()
        .lines()
        .any(|l| l == "closed"));
    clock.advance(59_999);
    assert!(matches!(
        extension.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    clock.advance(1);
    assert!(matches!(
        extension.begin(&op("o"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
}

#[test]
fn a_suspension_whose_mark_the_database_refused_still_keeps_its_live_owner() {
    let SuspendedApp {
        app,
        extension,
        s,
        dir,
        path,
        clock,
        ticket: t,
    } = suspended_app();
    // As if the mark had been refused (a full disk): the row says nothing
    // of the suspension, the lock is free; the lock file says suspended.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE sessions SET suspended_ms = NULL, suspend_lease_ms = NULL
             WHERE session_id = ?1",
            [app.session_id().as_str()],
        )
        .unwrap();
    let lock = dir
        .path()
        .join(format!("l.db-sessions/{}.lock", app.session_id()));
    assert!(std::fs::read_to_string(&lock)
        .unwrap()
        .lines()
        .any(|l| l == "suspended"));
    clock.advance(86_400_000);
    assert!(matches!(
        extension.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight {
            retry_after: None,
            ..
        }
    ));
    assert_eq!(
        extension.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Executing
    );
    // Once its process is gone, dead at once (no lease was recorded).
    app.abandon();
    assert!(matches!(
        extension.begin(&op("o"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
}

#[test]
fn a_suspended_owner_that_comes_back_after_a_takeover_is_fenced() {
    let SuspendedApp {
        app,
        extension,
        s,
        dir: _dir,
        path,
        clock,
        ticket: t1,
    } = suspended_app();
    // The owner runs in a process the extension cannot match (its id now
    // another process's, or another pid namespace): past the lease, the
    // lease alone decides, and the extension takes the call over.
    assert!(pretend_another_process(&path, app.session_id().as_str()));
    clock.advance(60_000);
    let Begin::Reconcile(r) = extension.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    let Resolved::Retry(t2) = extension
        .resolve_unknown(&r.attempt_id(), Resolution::NotFoundRetry)
        .unwrap()
    else {
        panic!()
    };
    app.resume().unwrap();
    // Attempt 1 answers late: refused, kept as evidence, attempt 2 stands.
    let late = app.commit(&t1.attempt_id(), r#"{"paid":"late"}"#, Some("pay_9"));
    assert!(
        matches!(
            late,
            Err(Error::StaleAttempt {
                attempt: 1,
                current_attempt: 2,
                ..
            })
        ),
        "{late:?}"
    );
    assert!(app
        .fail_before_commit(&t1.attempt_id(), "late failure", false)
        .is_err());
    assert!(app.mark_outcome_unknown(&t1.attempt_id(), "late").is_err());
    let rec = app.get(&t1.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    assert_eq!(rec.attempt_count, 2);
    let evidence = app.evidence(&t1.execution_id).unwrap();
    assert_eq!(evidence.len(), 3);
    assert_eq!(evidence[0].kind, "commit");
    assert_eq!(evidence[0].external_id.as_deref(), Some("pay_9"));
    assert!(app
        .transitions(&t1.execution_id)
        .unwrap()
        .iter()
        .any(|e| e.transition == "stale_attempt"));
    // The live attempt finishes normally.
    extension
        .commit(&t2.attempt_id(), r#"{"paid":2}"#, None)
        .unwrap();
    // The app's `owns` says which attempt is whose.
    assert!(!app.owns(&t1.attempt_id()).unwrap());
}

#[test]
fn an_attempt_the_execution_never_had_is_bad_input_not_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let Begin::Execute(t) = ledger.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap() else {
        panic!()
    };
    for attempt in [0, 2, 99] {
        let forged = toolledger::ledger::AttemptId::new(t.execution_id.clone(), attempt);
        assert!(
            matches!(
                ledger.commit(&forged, "{}", None),
                Err(Error::NoSuchAttempt {
                    current_attempt: 1,
                    ..
                })
            ),
            "attempt {attempt}"
        );
    }
    assert!(ledger.evidence(&t.execution_id).unwrap().is_empty());
    assert_eq!(
        ledger.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Executing
    );
}

#[test]
fn a_probe_that_fails_counts_as_alive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let other = open_with(&path, &clock);
    let s = spec("c1", "pay", "{}");
    assert!(matches!(
        app.begin(&op("o"), 0, &s).unwrap(),
        Begin::Execute(_)
    ));
    // The owner's lock file path now names something that cannot be
    // opened for writing: the probe fails, so the owner counts as alive.
    let lock = dir
        .path()
        .join("l.db-sessions")
        .join(format!("{}.lock", app.session_id()));
    std::fs::remove_file(&lock).unwrap();
    std::fs::create_dir(&lock).unwrap();
    assert!(matches!(
        other.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    std::fs::remove_dir(&lock).unwrap();
    // Gone entirely (and not suspended): its process still runs it (it is
    // open here), so it is still alive; once that process is gone (the
    // ledger abandoned, as a kill leaves it), dead.
    assert!(matches!(
        other.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    app.abandon();
    assert!(matches!(
        other.begin(&op("o"), 0, &s).unwrap(),
        Begin::Reconcile(_)
    ));
}

// ---------------------------------------------------------------------------
// 5. One database, one identity, whatever the path
// ---------------------------------------------------------------------------

#[test]
fn a_symlink_or_a_hard_link_is_the_same_ledger() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let real = dir.path().join("a/l.db");
    let (app, clock) = open_at(&real);
    let s = spec("c1", "pay", "{}");
    assert!(matches!(
        app.begin(&op("o"), 0, &s).unwrap(),
        Begin::Execute(_)
    ));
    // Through a symlink: the path resolves to the same file.
    std::os::unix::fs::symlink(&real, dir.path().join("b/link.db")).unwrap();
    let via_link = open_with(&dir.path().join("b/link.db"), &clock);
    assert_eq!(via_link.path(), app.path());
    assert!(matches!(
        via_link.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
    // Through a hard link: SQLite names the WAL after the path, so two
    // names would be two WALs of one file. Refused, typed, untouched.
    std::fs::hard_link(&real, dir.path().join("b/hard.db")).unwrap();
    let err = Ledger::open(&dir.path().join("b/hard.db"), LedgerConfig::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store(toolledger::ledger::StorageError::MultipleLinks { links: 2 })
        ),
        "{err:?}"
    );
    assert!(!dir.path().join("b/hard.db-wal").exists());
    // The ledger opened first goes on; the link removed, the name opens.
    std::fs::remove_file(dir.path().join("b/hard.db")).unwrap();
    assert!(matches!(
        via_link.begin(&op("o"), 0, &s).unwrap(),
        Begin::InFlight { .. }
    ));
}

/// The child half of `a_relative_path_and_a_chdir_never_switch_databases`:
/// opens `l.db` relative to its working directory, commits a call, moves to
/// another directory that has an `l.db` of its own, suspends, resumes, and
/// asks for the call again. Prints the answer.
#[test]
fn child_relative_path_then_chdir() {
    let Ok(dir) = std::env::var("TOOLLEDGER_CHILD_CHDIR") else {
        return;
    };
    let dir = Path::new(&dir);
    std::env::set_current_dir(dir.join("first")).unwrap();
    let ledger = Ledger::open(Path::new("l.db"), LedgerConfig::default()).unwrap();
    let s = spec("c1", "send_email", "{}");
    let Begin::Execute(t) = ledger.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    ledger
        .commit(&t.attempt_id(), r#"{"sent":1}"#, None)
        .unwrap();
    std::env::set_current_dir(dir.join("second")).unwrap();
    ledger.suspend().unwrap();
    ledger.resume().unwrap();
    let answer = match ledger.begin(&op("o"), 0, &s).unwrap() {
        Begin::Replay(_) => "replay",
        Begin::Execute(_) => "execute",
        _ => "other",
    };
    println!("ANSWER={answer}");
}

#[test]
fn a_relative_path_and_a_chdir_never_switch_databases() {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["first", "second"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    // A different ledger where the relative path would point after chdir.
    drop(Ledger::open(&dir.path().join("second/l.db"), LedgerConfig::default()).unwrap());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ownership::child_relative_path_then_chdir",
            "--nocapture",
        ])
        .env("TOOLLEDGER_CHILD_CHDIR", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("ANSWER=replay"), "{stdout}");
    // Nothing was written to the other file.
    let other = Ledger::open(&dir.path().join("second/l.db"), LedgerConfig::default()).unwrap();
    assert!(other.list(&op("o")).unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// 6. Lock files: only cleaned while excluded; dead sessions' files go away
// ---------------------------------------------------------------------------

#[test]
fn killed_launches_leave_no_lock_files_behind_for_long() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let clock = Arc::new(ManualClock::new(1_000));
    let launches: Vec<Ledger> = (0..20).map(|_| open_with(&path, &clock)).collect();
    for ledger in launches {
        ledger.abandon();
    }
    let files = || {
        std::fs::read_dir(dir.path().join("l.db-sessions"))
            .unwrap()
            .count()
    };
    assert_eq!(files(), 20, "a killed process leaves its file");
    let ledger = open_with(&path, &clock);
    assert_eq!(
        files(),
        1,
        "the next launch cleans the dead sessions' files"
    );
    // A live one is never cleaned.
    let live = open_with(&path, &clock);
    drop(open_with(&path, &clock));
    assert_eq!(files(), 2);
    drop((ledger, live));
}

#[test]
fn a_resuming_owner_and_a_cleaner_racing_never_leave_the_owner_invisible() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let clock = Arc::new(ManualClock::new(1_000));
    let app = Arc::new(open_with(&path, &clock));
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(_) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A cleaner: another session running recover() (which cleans dead
    // sessions) as fast as it can.
    let cleaner = {
        let stop = stop.clone();
        let path = path.clone();
        let clock = clock.clone();
        std::thread::spawn(move || {
            let other = open_with(&path, &clock);
            while !stop.load(Ordering::Relaxed) {
                let _ = other.recover();
                // Not a tight loop: SQLite's busy handler polls, and a
                // writer that takes the lock back at once starves it.
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };
    // The owner suspends and resumes; the suspension lapses instantly
    // (lease 0), so a cleaner may judge it dead while it is suspended. Once
    // resumed, it must be visible and alive again every time.
    let mut checks = 0;
    let prober = open_with(&path, &clock);
    for _ in 0..200 {
        app.suspend().expect("suspend");
        clock.advance(61_000);
        app.resume().expect("resume");
        let lock = dir
            .path()
            .join("l.db-sessions")
            .join(format!("{}.lock", app.session_id()));
        assert!(lock.exists(), "the resumed owner's lock file is there");
        // A fresh call of the live owner is in flight to everyone else.
        let s = spec(&format!("fresh_{checks}"), "pay", "{}");
        let Begin::Execute(_) = app.begin(&op("o"), 1, &s).unwrap() else {
            panic!()
        };
        assert!(matches!(
            prober.begin(&op("o"), 1, &s).unwrap(),
            Begin::InFlight { .. }
        ));
        checks += 1;
    }
    stop.store(true, Ordering::Relaxed);
    cleaner.join().unwrap();
    assert_eq!(checks, 200);
}

// ---------------------------------------------------------------------------
// 8 & 9. Cancellation stops what has not started; partial batches
// ---------------------------------------------------------------------------

/// An independent batch tool that records every item it is asked to send,
/// can pause before an item, and fails an item for good when told to.
struct Mailer {
    sent: Mutex<Vec<String>>,
    pause_before: Option<u32>,
    paused: tokio::sync::Notify,
    release: tokio::sync::Notify,
    fail_item: Option<u32>,
    big_results: bool,
}

impl Mailer {
    fn new() -> Mailer {
        Mailer {
            sent: Mutex::new(Vec::new()),
            pause_before: None,
            paused: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
            fail_item: None,
            big_results: false,
        }
    }
    fn sent(&self) -> Vec<String> {
        self.sent.lock().unwrap().clone()
    }
}

#[async_trait]
impl ToolHandler for Mailer {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            batch: BatchMode::Independent,
            idempotency_key: true,
            ..ToolDescriptor::side_effect("send_all", 1)
        }
    }

    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let item = req.item_index.unwrap_or(0);
        if self.pause_before == Some(item) {
            self.paused.notify_one();
            self.release.notified().await;
        }
        if self.fail_item == Some(item) {
            return Ok(PerformOutcome::FailedBeforeCommit {
                reason: "mailbox does not exist".into(),
                retryable: false,
            });
        }
        self.sent.lock().unwrap().push(req.arguments_json.clone());
        let result = if self.big_results {
            format!(r#"{{"item":{item},"pad":"{}"}}"#, "x".repeat(400))
        } else {
            format!(r#"{{"item":{item}}}"#)
        };
        Ok(PerformOutcome::Committed {
            result_json: result,
            external_id: None,
        })
    }
}

const FIVE: &str = r#"{"items":[{"to":"a"},{"to":"b"},{"to":"c"},{"to":"d"},{"to":"e"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_halts_an_independent_batch_before_its_next_item() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let exec = executor_at(&dir.path().join("l.db"), &clock);
    let tool = Arc::new(Mailer {
        pause_before: Some(2),
        ..Mailer::new()
    });
    exec.register(tool.clone()).unwrap();
    let run = exec.clone();
    let task = tokio::spawn(async move {
        run.execute(&op("o"), 0, ToolCall::custom("c1", "send_all", FIVE))
            .await
    });
    tokio::time::timeout(Duration::from_secs(5), tool.paused.notified())
        .await
        .unwrap();
    // Two emails are out, the third is about to go: the user says stop.
    assert_eq!(
        exec.cancel_operation(&op("o")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    tool.release.notify_one();
    let out = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Item 2 was already past the stop check when paused; items 3 and 4
    // never went out.
    let sent = tool.sent();
    assert!(sent.len() <= 3, "{sent:?}");
    let CallOutcome::Completed {
        partial: true,
        result_json,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    let v: serde_json::Value = serde_json::from_str(result_json).unwrap();
    assert_eq!(
        v["partial"]["committed"].as_array().unwrap().len(),
        sent.len()
    );
    assert_eq!(v["partial"]["reason"], "operation cancelled");
    assert_eq!(
        exec.ledger().operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

#[tokio::test]
async fn a_batch_whose_item_fails_for_good_is_a_partial_commit_told_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let exec = executor_at(&dir.path().join("l.db"), &clock);
    let tool = Arc::new(Mailer {
        fail_item: Some(3),
        ..Mailer::new()
    });
    exec.register(tool.clone()).unwrap();
    let out = exec
        .execute(&op("o"), 0, ToolCall::custom("c1", "send_all", FIVE))
        .await
        .unwrap();
    let CallOutcome::Completed {
        partial: true,
        result_json,
        execution_id,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(tool.sent().len(), 3);
    let v: serde_json::Value = serde_json::from_str(result_json).unwrap();
    assert_eq!(v["partial"]["committed"], serde_json::json!([0, 1, 2]));
    assert_eq!(v["partial"]["not_committed"], serde_json::json!([3, 4]));
    assert!(v["partial"]["reason"]
        .as_str()
        .unwrap()
        .contains("item 3: mailbox does not exist"));
    assert_eq!(v["items"][0]["item"], 0);
    assert!(v["items"][3].is_null());
    let rec = exec.ledger().get(execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert!(rec.partial);
    // Asked again: the same partial answer, nothing runs.
    let again = exec
        .execute(&op("o"), 0, ToolCall::custom("c1", "send_all", FIVE))
        .await
        .unwrap();
    assert!(matches!(
        again,
        CallOutcome::Completed {
            partial: true,
            replayed: true,
            ..
        }
    ));
    assert_eq!(tool.sent().len(), 3);
    // A stop now reports the effect; prune keeps the undelivered record and
    // its items; a compensation can still reach it.
    assert_eq!(
        exec.cancel_operation(&op("o")).unwrap(),
        OperationStatus::CancelledAfterSideEffect
    );
    clock.advance(365 * 86_400_000);
    exec.ledger().prune(Duration::from_secs(1), true).unwrap();
    assert_eq!(exec.ledger().batch_items(execution_id).unwrap().len(), 3);
    let refund = exec
        .ledger()
        .compensate(execution_id, &op("undo"), 0, &spec("r1", "unsend", "{}"))
        .unwrap();
    assert!(matches!(refund, Begin::Execute(_)));
}

#[tokio::test]
async fn a_batch_result_over_the_limits_commits_and_does_not_wedge_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let clock = Arc::new(ManualClock::new(1_000));
    let ledger = Ledger::open_with_clock(
        &path,
        LedgerConfig {
            json_limits: toolledger::model::JsonLimits {
                max_depth: 64,
                max_bytes: 1_200,
            },
            ..LedgerConfig::default()
        },
        clock.clone(),
    )
    .unwrap();
    let exec = Executor::new(Arc::new(ledger), config());
    let tool = Arc::new(Mailer {
        big_results: true,
        ..Mailer::new()
    });
    exec.register(tool.clone()).unwrap();
    let out = exec
        .execute(&op("o"), 0, ToolCall::custom("c1", "send_all", FIVE))
        .await
        .unwrap();
    let CallOutcome::Completed { result_json, .. } = &out else {
        panic!("{out:?}")
    };
    assert!(result_json.contains("toolledger_note"), "{result_json}");
    assert_eq!(tool.sent().len(), 5);
    exec.ledger()
        .mark_delivered(std::slice::from_ref(out.execution_id()))
        .unwrap();
    assert!(exec.recover().await.unwrap().outcomes.is_empty());
}

/// Begins `s` (a batch) in operation `o`, round 0, commits its items 0 and 1
/// and then fails it before commit, not retryable: the state a version 3
/// ledger left a partly sent batch in.
fn two_items_then_refused(ledger: &Ledger, s: &CallSpec) -> Ticket {
    let Begin::Execute(t) = ledger.begin(&op("o"), 0, s).unwrap() else {
        panic!()
    };
    for i in 0..2 {
        ledger
            .record_batch_item(&t.attempt_id(), i, &format!(r#"{{"item":{i}}}"#), None)
            .unwrap();
    }
    ledger
        .fail_before_commit(&t.attempt_id(), "item 2: refused", false)
        .unwrap();
    t
}

#[test]
fn a_version_3_batch_left_failed_with_committed_items_is_settled_as_partial() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("c1", "send_all", FIVE);
    let t = two_items_then_refused(&ledger, &s);
    // Asked again: never "failed" (items happened), never run again.
    let Begin::Replay(r) = ledger.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    assert!(r.partial);
    assert!(
        r.result_json.contains(r#""committed":[0,1]"#),
        "{}",
        r.result_json
    );
    assert_eq!(
        ledger.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
}

struct Counting {
    calls: AtomicU32,
    seen: Mutex<Vec<String>>,
    first_fails: bool,
}

#[async_trait]
impl ToolHandler for Counting {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: true,
            ..ToolDescriptor::side_effect("pay", 1)
        }
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push(req.arguments_json.clone());
        if n == 0 && self.first_fails {
            return Ok(PerformOutcome::FailedBeforeCommit {
                reason: "429".into(),
                retryable: true,
            });
        }
        Ok(PerformOutcome::Committed {
            result_json: "{}".into(),
            external_id: None,
        })
    }
}

#[tokio::test]
async fn no_path_starts_a_tool_in_a_cancelled_operation() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let exec = Executor::new(
        Arc::new(open_with(&dir.path().join("l.db"), &clock)),
        ExecutorConfig {
            max_attempts: 1,
            ..config()
        },
    );
    let tool = Arc::new(Counting {
        calls: AtomicU32::new(0),
        seen: Mutex::new(Vec::new()),
        first_fails: true,
    });
    exec.register(tool.clone()).unwrap();
    // Attempt 1 fails retryably and no attempts are left: failed, retryable.
    let out = exec.execute(&op("o"), 0, pay_call()).await.unwrap();
    assert!(
        matches!(
            out,
            CallOutcome::Failed {
                retryable: true,
                ..
            }
        ),
        "{out:?}"
    );
    exec.cancel_operation(&op("o")).unwrap();
    // Neither run_existing, nor the call asked again, nor mark_executing
    // starts it.
    let id = out.execution_id().clone();
    let rerun = exec.run_existing(&id).await.unwrap();
    assert!(matches!(rerun, CallOutcome::Cancelled { .. }), "{rerun:?}");
    let again = exec.execute(&op("o"), 0, pay_call()).await.unwrap();
    assert!(matches!(again, CallOutcome::Cancelled { .. }), "{again:?}");
    assert!(exec.ledger().mark_executing(&id).is_err());
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        exec.ledger().operation_status(&op("o")).unwrap(),
        Some(OperationStatus::Cancelled),
        "nothing happened, and nothing can any more"
    );
}

// ---------------------------------------------------------------------------
// 10. Arguments as the model sent them
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_tool_receives_every_digit_and_different_digits_never_replay() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let exec = executor_at(&dir.path().join("l.db"), &clock);
    let tool = Arc::new(Counting {
        calls: AtomicU32::new(0),
        seen: Mutex::new(Vec::new()),
        first_fails: false,
    });
    exec.register(tool.clone()).unwrap();
    let args = r#"{"account": 12345678901234567, "amount": 2.50}"#;
    let out = exec
        .execute(&op("o"), 0, ToolCall::custom("c1", "pay", args))
        .await
        .unwrap();
    assert!(matches!(out, CallOutcome::Completed { .. }));
    assert_eq!(tool.seen.lock().unwrap()[0], args, "byte for byte");
    // Same value, other spelling: the same call.
    let same = r#"{"amount":2.5,"account":12345678901234567}"#;
    let replay = exec
        .execute(&op("o"), 0, ToolCall::custom("c1", "pay", same))
        .await
        .unwrap();
    assert!(matches!(
        replay,
        CallOutcome::Completed { replayed: true, .. }
    ));
    // One digit differs: not the same call.
    let other = r#"{"account": 12345678901234568, "amount": 2.50}"#;
    let conflict = exec
        .execute(&op("o"), 0, ToolCall::custom("c1", "pay", other))
        .await
        .unwrap();
    assert!(
        matches!(conflict, CallOutcome::Conflict { .. }),
        "{conflict:?}"
    );
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// 11 & 12. Recovery goes on past a bad row; reads never write
// ---------------------------------------------------------------------------

#[tokio::test]
async fn recover_deals_with_every_row_and_reports_the_one_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    // A committed, undelivered call of a tool the next launch registers,
    // and one of a tool it does not.
    for (call, tool) in [("c1", "pay"), ("c2", "retired_tool")] {
        let Begin::Execute(t) = ledger.begin(&op("o"), 0, &spec(call, tool, "{}")).unwrap() else {
            panic!()
        };
        ledger.commit(&t.attempt_id(), "{}", None).unwrap();
    }
    drop(ledger);
    let exec = executor_at(&path, &clock);
    exec.register(Arc::new(Counting {
        calls: AtomicU32::new(0),
        seen: Mutex::new(Vec::new()),
        first_fails: false,
    }))
    .unwrap();
    let recovery = exec.recover().await.unwrap();
    assert_eq!(recovery.outcomes.len(), 1);
    assert!(matches!(
        recovery.outcomes[0],
        CallOutcome::Completed { replayed: true, .. }
    ));
    assert_eq!(recovery.failed.len(), 1);
    assert!(recovery.failed[0]
        .execution_id
        .as_str()
        .contains("retired_tool"));
}

#[test]
fn reads_answer_while_another_connection_holds_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let clock = Arc::new(ManualClock::new(1_000));
    let ledger = Ledger::open_with_clock(
        &path,
        LedgerConfig {
            busy_timeout: Duration::from_millis(50),
            ..LedgerConfig::default()
        },
        clock,
    )
    .unwrap();
    let Begin::Execute(t) = ledger.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap() else {
        panic!()
    };
    ledger.commit(&t.attempt_id(), "{}", None).unwrap();
    ledger
        .mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Every read answers, and tells the delivery already.
    let rec = ledger.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::ResultDelivered);
    assert_eq!(
        ledger.list(&op("o")).unwrap()[0].status,
        ExecutionStatus::ResultDelivered
    );
    let log = ledger.transitions(&t.execution_id).unwrap();
    assert_eq!(log.last().unwrap().transition, "deliver");
    let stats = ledger.stats().unwrap();
    assert!(stats
        .executions_by_status
        .contains(&("result_delivered".to_owned(), 1)));
    assert!(!stats
        .executions_by_status
        .iter()
        .any(|(s, _)| s == "committed"));
    other.execute_batch("ROLLBACK").unwrap();
    // Once the lock is free the mark is written with the next write.
    ledger.checkpoint().unwrap();
    drop(ledger);
    let (again, _) = open_at(&path);
    assert_eq!(
        again.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::ResultDelivered
    );
}

// ---------------------------------------------------------------------------
// 13. One id limit
// ---------------------------------------------------------------------------

#[test]
fn begin_refuses_an_id_the_bindings_would_refuse_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let worst = ":".repeat(256);
    let opid = op(&worst);
    let s = spec(&worst, &worst, "{}");
    assert!(matches!(
        ledger.begin(&opid, 0, &s),
        Err(Error::Id(toolledger::model::IdError::TooLong { .. }))
    ));
    assert!(ledger.list(&opid).unwrap().is_empty());
    // Anything begin hands out is accepted back by the bindings' parser.
    let s = spec(&worst, "t", "{}");
    let Begin::Execute(t) = ledger.begin(&opid, 0, &s).unwrap() else {
        panic!()
    };
    assert!(t.execution_id.as_str().len() > 1500);
    assert_eq!(
        ExecutionId::parse(t.execution_id.as_str()).unwrap(),
        t.execution_id
    );
}

// ---------------------------------------------------------------------------
// 15. Compensation through the executor
// ---------------------------------------------------------------------------

struct Refund {
    approval: bool,
    calls: AtomicU32,
}

#[async_trait]
impl ToolHandler for Refund {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            requires_approval: self.approval,
            idempotency_key: true,
            ..ToolDescriptor::side_effect("refund", 1)
        }
    }
    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(PerformOutcome::Committed {
            result_json: r#"{"refunded":true}"#.into(),
            external_id: Some("re_1".into()),
        })
    }
}

#[tokio::test]
async fn a_compensation_runs_under_the_compensating_tools_own_rules() {
    for approval in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(1_000));
        let exec = executor_at(&dir.path().join("l.db"), &clock);
        exec.register(Arc::new(Counting {
            calls: AtomicU32::new(0),
            seen: Mutex::new(Vec::new()),
            first_fails: false,
        }))
        .unwrap();
        let refund = Arc::new(Refund {
            approval,
            calls: AtomicU32::new(0),
        });
        exec.register(refund.clone()).unwrap();
        let paid = exec.execute(&op("o"), 0, pay_call()).await.unwrap();
        let out = exec
            .compensate(
                paid.execution_id(),
                &op("o"),
                1,
                ToolCall::custom("r1", "refund", r#"{"amount":"12.50"}"#),
            )
            .await
            .unwrap();
        if approval {
            let CallOutcome::NeedsApproval {
                execution_id,
                args_digest,
                ..
            } = out
            else {
                panic!("{out:?}")
            };
            assert_eq!(refund.calls.load(Ordering::SeqCst), 0);
            let done = exec
                .approve(&execution_id, &args_digest, None)
                .await
                .unwrap();
            assert!(matches!(done, CallOutcome::Completed { .. }), "{done:?}");
        } else {
            assert!(matches!(out, CallOutcome::Completed { .. }), "{out:?}");
        }
        assert_eq!(refund.calls.load(Ordering::SeqCst), 1);
        let linked = exec.ledger().compensations(paid.execution_id()).unwrap();
        assert_eq!(linked.len(), 1);
        assert_eq!(linked[0].status, ExecutionStatus::Committed);
    }
}

// ---------------------------------------------------------------------------
// The executor's own orphans
// ---------------------------------------------------------------------------

struct Slow;

#[async_trait]
impl ToolHandler for Slow {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: true,
            ..ToolDescriptor::side_effect("slow", 1)
        }
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        if req.attempt == 1 {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Ok(PerformOutcome::Committed {
            result_json: format!(r#"{{"attempt":{}}}"#, req.attempt),
            external_id: None,
        })
    }
}

#[tokio::test]
async fn an_attempt_whose_caller_went_away_is_reconciled_not_left_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let exec = executor_at(&dir.path().join("l.db"), &clock);
    let exec = Executor::new(
        exec.ledger().clone(),
        ExecutorConfig {
            perform_timeout: None,
            ..config()
        },
    );
    exec.register(Arc::new(Slow)).unwrap();
    let call = ToolCall::custom("c1", "slow", "{}");
    // The caller stops waiting mid-call (its future is dropped).
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        exec.execute(&op("o"), 0, call.clone()),
    )
    .await;
    assert!(gave_up.is_err());
    // Asked again in the same process: nobody is running attempt 1 any
    // more, so it is reconciled (same-key resend) instead of "in flight"
    // until the process ends.
    let out = exec.execute(&op("o"), 0, call).await.unwrap();
    assert_eq!(out.result_json(), Some(r#"{"attempt":2}"#), "{out:?}");
}

/// A payment tool whose first lookup waits until the test releases it,
/// then finds the payment; it never performs.
struct GatedLookup {
    release: Arc<tokio::sync::Notify>,
    lookups: AtomicU32,
    performs: AtomicU32,
}

#[async_trait]
impl ToolHandler for GatedLookup {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            lookup: true,
            ..ToolDescriptor::side_effect("pay", 1)
        }
    }
    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.performs.fetch_add(1, Ordering::SeqCst);
        Ok(PerformOutcome::Committed {
            result_json: r#"{"paid":"again"}"#.into(),
            external_id: None,
        })
    }
    async fn lookup(
        &self,
        _req: ToolRequest,
    ) -> Result<toolledger::executor::LookupOutcome, ToolError> {
        if self.lookups.fetch_add(1, Ordering::SeqCst) == 0 {
            self.release.notified().await;
        }
        Ok(toolledger::executor::LookupOutcome::Found {
            result_json: r#"{"paid":"12.50"}"#.into(),
            external_id: Some("pay_1".into()),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_of_one_unknown_outcome_both_answer_with_the_one_result() {
    // Any session may resolve an unknown outcome under its current attempt.
    // Two do at once (an app's recover() and its extension's): the slower
    // one finds the row already committed by the other. Seen in the live
    // torture run as "Commit is not allowed from result_delivered" handed
    // to the app; the answer is the committed result, and nothing is sent.
    const PAY: &str = r#"{"amount":"12.50","to":"bob"}"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let Begin::Execute(t1) = app.begin(&op("o"), 0, &spec("call_1", "pay", PAY)).unwrap() else {
        panic!()
    };
    app.mark_outcome_unknown(&t1.attempt_id(), "connection reset")
        .unwrap();
    drop(app);

    let tool = Arc::new(GatedLookup {
        release: Arc::new(tokio::sync::Notify::new()),
        lookups: AtomicU32::new(0),
        performs: AtomicU32::new(0),
    });
    let slow = executor_at(&path, &clock);
    let fast = executor_at(&path, &clock);
    slow.register(tool.clone()).unwrap();
    fast.register(tool.clone()).unwrap();
    let first = tokio::spawn({
        let slow = slow.clone();
        async move { slow.execute(&op("o"), 0, call("call_1", "pay", PAY)).await }
    });
    wait_for(|| tool.lookups.load(Ordering::SeqCst) == 1).await;
    let second = fast
        .execute(&op("o"), 0, call("call_1", "pay", PAY))
        .await
        .unwrap();
    assert_eq!(
        second.result_json(),
        Some(r#"{"paid":"12.50"}"#),
        "{second:?}"
    );
    tool.release.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(
        first.result_json(),
        Some(r#"{"paid":"12.50"}"#),
        "{first:?}"
    );
    assert_eq!(
        tool.performs.load(Ordering::SeqCst),
        0,
        "nothing sent again"
    );
    assert_eq!(tool.lookups.load(Ordering::SeqCst), 2);
    let rec = fast.ledger().get(&t1.execution_id).unwrap().unwrap();
    assert!(rec.status.is_committed(), "{:?}", rec.status);
    assert_eq!(rec.attempt_count, 1);
}

/// After a partial commit is settled (from the whole record), every later
/// repeat is answered from the replay's narrow read of the committed row:
/// it must still say partial, with the same result and downstream id, in a
/// plain and an encrypted ledger (sealed result), with the write lock free
/// (a transaction that writes nothing) or held by another connection (a
/// read), and in an operation cancelled since (a commit answers the same).
#[test]
fn a_settled_partial_commit_replays_as_partial_from_the_narrow_read() {
    use toolledger::ledger::LedgerKey;
    let key = LedgerKey::generate().unwrap();
    for encrypted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let ledger = if encrypted {
            Ledger::open_encrypted(&path, LedgerConfig::default(), &key).unwrap()
        } else {
            open_at(&path).0
        };
        let s = spec("c1", "send_all", FIVE);
        let t = two_items_then_refused(&ledger, &s);
        let Begin::Replay(settled) = ledger.begin(&op("o"), 0, &s).unwrap() else {
            panic!()
        };
        assert!(settled.partial);
        let same = |answer: Begin, how: &str| match answer {
            Begin::Replay(r) => {
                assert!(r.partial, "{how} (encrypted: {encrypted}): not partial");
                assert_eq!(r.result_json, settled.result_json, "{how}");
                assert_eq!(r.external_id, settled.external_id, "{how}");
                assert_eq!(r.execution_id, t.execution_id, "{how}");
            }
            other => panic!("{how} (encrypted: {encrypted}): {other:?}"),
        };
        same(ledger.begin(&op("o"), 0, &s).unwrap(), "write lock free");
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        same(ledger.begin(&op("o"), 0, &s).unwrap(), "write lock held");
        holder.execute_batch("ROLLBACK").unwrap();
        ledger.cancel_operation(&op("o")).unwrap();
        same(
            ledger.begin(&op("o"), 0, &s).unwrap(),
            "operation cancelled",
        );
        assert!(matches!(
            ledger
                .begin(&op("o"), 0, &spec("c1", "send_all", r#"{"items":[]}"#))
                .unwrap(),
            Begin::Conflict { .. }
        ));
    }
}

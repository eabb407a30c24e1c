//! Fifth review of the liveness rule (86dbe74). Each `defect_*` test failed
//! on 86dbe74 and passes since the fixes after it (RELIABILITY.md, row 73).

use super::lock_files::*;
use std::time::Duration;

use toolledger::ledger::{Begin, Ledger, LedgerConfig};
use toolledger::model::ExecutionStatus;
use toolledger_test_support::*;

/// A hard link made to a running owner's lock file after it took its lock
/// (a hard-link backup: `cp -al`, `rsync --link-dest`, rsnapshot) makes
/// `write_record` skip every later record (nlink 2): `suspend()` no longer
/// writes `suspended`. With the mark refused (a full disk; simulated as in
/// `ownership::a_suspension_whose_mark_the_database_refused_still_keeps_its_live_owner`,
/// which passes without the link), the free lock file does not say
/// `suspended` and the live owner, whose process runs, is taken over.
#[test]
fn defect_a_hard_link_to_a_running_owners_lock_file_silences_suspended() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let extension = open_with(&path, &clock);
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(t) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    let lock = lock_of(&path, app.session_id().as_str());
    let backup = dir.path().join("backup");
    std::fs::create_dir(&backup).unwrap();
    std::fs::hard_link(&lock, backup.join("app.lock")).unwrap();
    app.suspend().unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE sessions SET suspended_ms = NULL, suspend_lease_ms = NULL
             WHERE session_id = ?1",
            [app.session_id().as_str()],
        )
        .unwrap();
    let says = std::fs::read_to_string(&lock)
        .unwrap()
        .lines()
        .any(|l| l == "suspended");
    let answer = extension.begin(&op("o"), 0, &s).unwrap();
    let status = extension.get(&t.execution_id).unwrap().unwrap().status;
    assert!(
        matches!(answer, Begin::InFlight { .. }) && status == ExecutionStatus::Executing,
        "a suspended live owner (its process runs) was taken over: {}, {status:?}; \
         lock file says suspended: {says}",
        variant(&answer)
    );
}

/// `acquire` takes its own lock with a blocking `flock`: "blocks only while
/// a cleaner holds the file for the instant it takes to delete it". Any
/// other process's probe or clean holds it for an instant too, and a
/// prober frozen in that instant (Android's cached-app freezer, a stopped
/// process) or killed there with a forked child sharing the descriptor
/// keeps it held: `resume()` then waits for as long, with no bound.
/// (Simulated by another open file description holding the flock.)
#[test]
fn defect_resume_waits_without_bound_for_a_frozen_probers_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, _clock) = open_at(&path);
    app.suspend().unwrap();
    let lock = lock_of(&path, app.session_id().as_str());
    let prober = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
    prober.try_lock().unwrap();
    let app = std::sync::Arc::new(app);
    let (tx, rx) = std::sync::mpsc::channel();
    let resumer = {
        let app = app.clone();
        std::thread::spawn(move || {
            let r = app.resume().map(|_| ());
            let _ = tx.send(r);
        })
    };
    let answered = rx.recv_timeout(Duration::from_secs(3));
    drop(prober); // frees it: the thread ends (bounded)
    resumer.join().unwrap();
    assert!(
        answered.is_ok(),
        "resume() still waiting after 3 s for a lock another process's probe held"
    );
}

/// On a full disk the ledger opens and replays (`with_store` ignores a
/// refused registration). A `resume()` on a full disk now fails and
/// suspends the store again: every call, reads and replays included,
/// answers `Suspended` until the disk has room, though a running owner
/// needs no row change to be judged alive (its lock is held).
#[test]
fn defect_a_resume_on_a_full_disk_leaves_even_replays_suspended() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let s = spec("c1", "pay", "{}");
    let t = ticket(app.begin(&op("o"), 0, &s).unwrap());
    app.commit(&t.attempt_id(), r#"{"r":1}"#, None).unwrap();
    app.suspend().unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER full_u BEFORE UPDATE ON sessions BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;
         CREATE TRIGGER full_i BEFORE INSERT ON sessions BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;",
    )
    .unwrap();
    // Control: a ledger opened now (same full disk) replays.
    let other = Ledger::open_with_clock(&path, LedgerConfig::default(), clock.clone()).unwrap();
    let other_replay = other.begin(&op("o"), 0, &s).map(|b| variant(&b));
    let resumed = app.resume().map(|_| ());
    let replay = app.begin(&op("o"), 0, &s).map(|b| variant(&b));
    let read = app.get(&t.execution_id).map(|r| r.map(|r| r.status));
    assert!(
        replay.is_ok() && read.is_ok(),
        "resume: {resumed:?}; then begin (a replay of a committed call): {replay:?}, get: {read:?}; \
         a ledger opened on the same file meanwhile replays: {other_replay:?}"
    );
}

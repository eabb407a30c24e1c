//! Third review of the liveness rule (e5c08b5). Each `defect_*` test failed
//! on e5c08b5 and passes since the fixes after it (RELIABILITY.md, row 71).

use super::lock_files::*;
use std::sync::Arc;
use std::time::Duration;

use toolledger::ledger::{Begin, Ledger, LedgerConfig, ManualClock};
use toolledger::model::ExecutionStatus;
use toolledger_test_support::*;

/// Row 68 for a session without a row: a session whose registration at
/// open was refused (busy) runs a call holding its lock; someone deletes its
/// lock file (the whole sessions directory, as in row 68). `judge` with
/// `Probe::Absent` and no row is `Dead` without asking anything: the
/// running call is handed to another session while its owner holds its
/// lock and is about to send.
#[test]
fn defect_an_unregistered_running_owner_whose_lock_file_was_deleted_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let config = LedgerConfig {
        busy_timeout: Duration::from_millis(50),
        ..LedgerConfig::default()
    };
    let extension = Ledger::open_with_clock(&path, config.clone(), clock.clone()).unwrap();
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let app = Ledger::open_with_clock(&path, config, clock.clone()).unwrap();
    holder.execute_batch("COMMIT").unwrap();
    let session = app.session_id().as_str().to_owned();
    assert_eq!(rows_of(&path, &session), 0, "registration refused");
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(t) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    std::fs::remove_dir_all(dir.path().join("l.db-sessions")).unwrap();

    let answer = extension.begin(&op("o"), 0, &s).unwrap();
    let status = extension.get(&t.execution_id).unwrap().unwrap().status;
    let committed = app.commit(&t.attempt_id(), r#"{"r":1}"#, None);
    assert!(
        matches!(answer, Begin::InFlight { .. }) && status == ExecutionStatus::Executing,
        "a running owner (lock held) was taken over: {}, {status:?}; its own commit: {committed:?}",
        variant(&answer)
    );
}

/// The same hole in the reseal's `InUse` check: an unregistered running
/// session whose lock file was deleted is in no row and in no file, so
/// `others_alive` is false and the ledger is encrypted in place under it.
#[test]
fn defect_an_unregistered_running_session_without_its_file_does_not_stop_encrypt_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let config = LedgerConfig {
        busy_timeout: Duration::from_millis(50),
        ..LedgerConfig::default()
    };
    // System clocks, as `encrypt_in_place` uses (a manual clock's boot id
    // would read as another boot).
    drop(Ledger::open(&path, config.clone()).unwrap());
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let app = Ledger::open(&path, config.clone()).unwrap();
    holder.execute_batch("COMMIT").unwrap();
    assert_eq!(rows_of(&path, app.session_id().as_str()), 0);
    // It runs a call: its first write registers it (since row 71).
    let Begin::Execute(_) = app.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap() else {
        panic!()
    };
    assert_eq!(rows_of(&path, app.session_id().as_str()), 1);
    std::fs::remove_dir_all(dir.path().join("l.db-sessions")).unwrap();
    let key = toolledger::ledger::LedgerKey::generate().unwrap();
    let sealed = Ledger::encrypt_in_place(&path, config, &key);
    assert!(
        sealed.is_err(),
        "encrypted in place under a running session: {sealed:?}"
    );
    drop(app);
}

/// The lock file's record is "rewritten in place, so a full disk does not
/// stop it" (session.rs), but the first record of a fresh lock file needs a
/// block: a session opened on a full disk (SQLite goes on writing into the
/// WAL frames it already has) leaves its lock file empty, and its
/// `suspend()` cannot write `suspended` nor the pid either. Past its lease
/// that file reads as "an older build's empty file, judged by the lease
/// alone" (`Needs::Recorded`): the frozen app, whose process runs on, is
/// taken over and resent to (row 67's two payments), although the row
/// holds its pid.
#[test]
fn defect_a_session_opened_on_a_full_disk_is_judged_by_the_lease_alone() {
    let Some(fs) = Mounted::tmpfs("4m") else {
        eprintln!("no tmpfs (not root): skipped");
        return;
    };
    let path = fs.path().join("l.db");
    let (extension, clock) = open_at(&path);
    // WAL frames to write into later, then the WAL restarted.
    for i in 0..40 {
        let s = spec(&format!("w{i}"), "warm", "{}");
        if let Begin::Execute(t) = extension.begin(&op("warm"), 0, &s).unwrap() {
            extension
                .commit(&t.attempt_id(), r#"{"r":1}"#, None)
                .unwrap();
        }
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    let filler = fill(fs.path());

    let app = open_with(&path, &clock);
    let session = app.session_id().as_str().to_owned();
    let lock = lock_of(&path, &session);
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(t) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    let suspended = app.suspend();
    let record = std::fs::read(&lock).unwrap();
    let row: (i64, Option<i64>) = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT pid, suspended_ms FROM sessions WHERE session_id = ?1",
            [&session],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    std::fs::remove_file(&filler).unwrap();
    clock.advance(3_600_000);
    // The app's process (this one) still runs the session: frozen, not dead.
    let answer = extension.begin(&op("o"), 0, &s).unwrap();
    let status = extension.get(&t.execution_id).unwrap().unwrap().status;
    assert!(
        matches!(answer, Begin::InFlight { .. }) && status == ExecutionStatus::Executing,
        "a frozen live owner was taken over: {}, {status:?} (suspend: {suspended:?}; \
         its row (pid, suspended_ms): {row:?}; its lock file: {} bytes)",
        variant(&answer),
        record.len()
    );
    drop(app);
}

/// Control for the full-disk defect: the same steps with room on the disk
/// keep the frozen owner (passes).
#[test]
fn control_a_session_opened_with_room_stays_owner_past_its_lease() {
    let Some(fs) = Mounted::tmpfs("4m") else {
        eprintln!("no tmpfs (not root): skipped");
        return;
    };
    let path = fs.path().join("l.db");
    let (extension, clock) = open_at(&path);
    let app = open_with(&path, &clock);
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(_) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    app.suspend().unwrap();
    clock.advance(3_600_000);
    let answer = extension.begin(&op("o"), 0, &s).unwrap();
    assert!(matches!(answer, Begin::InFlight { .. }), "{answer:?}");
    drop(app);
}

/// Once a live session's row is gone (deleted by a cleaner that misjudged
/// it, as in the defects above, and its `resume()`'s re-registration
/// refused by a busy file: `registered` stays true), `suspend()` answers
/// `Ok` without any mark: `mark_suspended`'s "no row" (`Ok(false)`) is
/// dropped. Nothing then covers the moments after its process dies while
/// its last request may still land (the lease, design.md).
#[test]
fn defect_suspend_answers_ok_without_a_mark_when_its_row_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (_extension, clock) = open_at(&path);
    let app = open_with(&path, &clock);
    let session = app.session_id().as_str().to_owned();
    // The row gone (as a cleaner's delete would leave it).
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("DELETE FROM sessions WHERE session_id = ?1", [&session])
        .unwrap();
    let suspended = app.suspend();
    let rows = rows_of(&path, &session);
    assert!(
        suspended.is_err() || rows == 1,
        "suspend() answered {suspended:?} and left {rows} rows (no mark)"
    );
    drop(app);
}

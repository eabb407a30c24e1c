//! Fourth review of the liveness rule (87b8d04). Each `defect_*` test failed
//! on 87b8d04 and passes since the fixes after it (RELIABILITY.md, row 72).

use super::lock_files::*;

use toolledger::ledger::{Begin, Ledger, LedgerConfig};
use toolledger::model::ExecutionStatus;
use toolledger_test_support::*;

/// A running owner (its lock held) whose lock file is replaced by a copy of
/// itself (a backup restored, a sync tool, `cp` over it: a new inode at the
/// path, the same bytes). The probe opens the new file and finds it free;
/// no mark, and the record (copied from a running session) does not say
/// `suspended`: `Needs::SaysSuspended` fails, and the live owner, which
/// still holds its lock on the old inode and is about to send, is judged
/// dead at once (row 68 covers a deleted file, not a replaced one).
#[test]
fn defect_a_running_owner_whose_lock_file_was_replaced_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let extension = open_with(&path, &clock);
    let s = spec("c1", "pay", "{}");
    let Begin::Execute(t) = app.begin(&op("o"), 0, &s).unwrap() else {
        panic!()
    };
    let lock = lock_of(&path, app.session_id().as_str());
    let bytes = std::fs::read(&lock).unwrap();
    std::fs::remove_file(&lock).unwrap();
    std::fs::write(&lock, &bytes).unwrap();

    let answer = extension.begin(&op("o"), 0, &s).unwrap();
    let status = extension.get(&t.execution_id).unwrap().unwrap().status;
    let committed = app.commit(&t.attempt_id(), r#"{"r":1}"#, None);
    assert!(
        matches!(answer, Begin::InFlight { .. }) && status == ExecutionStatus::Executing,
        "a running owner (lock held) was taken over: {}, {status:?}; its own commit: {committed:?}",
        variant(&answer)
    );
}

/// Since the lock file holds a record, `acquire` writes 128 bytes at offset
/// 0 of whatever it opened and truncates it to 128 bytes if it is longer.
/// It opens the path with `open_private`, which follows symlinks (the
/// probe and the closing mark use `O_NOFOLLOW`; this open does not). A lock
/// file replaced by a symlink while its session is suspended: `resume()`
/// overwrites and truncates the file the link points to.
#[test]
fn defect_a_symlinked_lock_file_is_written_through_and_truncated_at_resume() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, _clock) = open_at(&path);
    app.suspend().unwrap();
    let victim = dir.path().join("notes.txt");
    let original = "an unrelated file of the app\n".repeat(200);
    std::fs::write(&victim, &original).unwrap();
    let lock = lock_of(&path, app.session_id().as_str());
    std::fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&victim, &lock).unwrap();

    let resumed = app.resume().map(|_| ());
    let after = std::fs::read(&victim).unwrap();
    assert!(
        after == original.as_bytes(),
        "resume() wrote through the symlink: the file is now {} bytes (was {}), starting {:?}; \
         resume: {resumed:?}",
        after.len(),
        original.len(),
        String::from_utf8_lossy(&after[..after.len().min(40)])
    );
}

/// The same with the link pointing at the ledger's own database: the
/// suspended ledger's committed record is destroyed by its own `resume()`.
#[test]
fn defect_a_lock_file_symlinked_to_the_database_loses_its_committed_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, clock) = open_at(&path);
    let s = spec("c1", "pay", "{}");
    let t = ticket(app.begin(&op("o"), 0, &s).unwrap());
    app.commit(&t.attempt_id(), r#"{"r":1}"#, None).unwrap();
    app.suspend().unwrap();
    let lock = lock_of(&path, app.session_id().as_str());
    std::fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&path, &lock).unwrap();

    let resumed = app.resume().map(|_| ());
    let size = std::fs::metadata(&path).map(|m| m.len());
    drop(app);
    let reopened = Ledger::open_with_clock(&path, LedgerConfig::default(), clock.clone());
    let status = reopened
        .as_ref()
        .map(|l| l.get(&t.execution_id).map(|r| r.map(|r| r.status)));
    assert!(
        matches!(status, Ok(Ok(Some(ExecutionStatus::Committed)))),
        "the committed call is gone: {status:?}; resume: {resumed:?}; database size now {size:?}"
    );
}

/// Row 70 says a failed `resume()` lets the lock go. It does when the
/// reopening fails; when the re-registration after it fails (a busy file:
/// another process holds the write lock past `busy_timeout`), `resume()`
/// answers the error with the store open and the session lock held: the
/// ledger is resumed (calls work) although `resume()` said it failed, and
/// an app that takes the error for "still suspended" and is frozen without
/// another `suspend()` holds a file lock while suspended (iOS 0xdead10cc).
#[test]
fn defect_a_resume_whose_registration_is_busy_fails_holding_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let clock = std::sync::Arc::new(toolledger::ledger::ManualClock::new(1_000_000));
    let config = LedgerConfig {
        busy_timeout: std::time::Duration::from_millis(50),
        ..LedgerConfig::default()
    };
    let app = Ledger::open_with_clock(&path, config, clock.clone()).unwrap();
    app.suspend().unwrap();
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let resumed = app.resume().map(|_| ());
    holder.execute_batch("COMMIT").unwrap();
    let lock = lock_of(&path, app.session_id().as_str());
    // Probe the lock as another process would (flock from a new open).
    let file = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
    let held = file.try_lock().is_err();
    let begin = app
        .begin(&op("o"), 0, &spec("c1", "pay", "{}"))
        .map(|b| variant(&b));
    assert!(
        resumed.is_ok() || !held,
        "resume() answered {resumed:?} yet holds the session lock (held: {held}); \
         a begin now answers {begin:?}"
    );
}

/// A session whose registration at open was refused: `suspend()`'s mark
/// write registers it (`register_in`) and marks it, but `registered` is set
/// only after that write returns. A write of another thread that gets the
/// store in between registers again (`ON CONFLICT … suspended_ms = NULL`),
/// erasing the mark just written: the lease is gone (the process check
/// still keeps the owner while its process runs). Stress, bounded.
#[test]
fn defect_a_concurrent_first_write_erases_the_suspension_mark() {
    let mut erased = 0;
    let rounds = 150;
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let clock = std::sync::Arc::new(toolledger::ledger::ManualClock::new(1_000_000));
        let config = LedgerConfig {
            busy_timeout: std::time::Duration::from_millis(20),
            ..LedgerConfig::default()
        };
        drop(Ledger::open_with_clock(&path, config.clone(), clock.clone()).unwrap());
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let app =
            std::sync::Arc::new(Ledger::open_with_clock(&path, config, clock.clone()).unwrap());
        holder.execute_batch("COMMIT").unwrap();
        let writer = {
            let app = app.clone();
            std::thread::spawn(move || {
                for i in 0..100_000 {
                    let s = spec(&format!("c{i}"), "t", "{}");
                    if app.begin(&op("o"), 0, &s).is_err() {
                        break;
                    }
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_micros(200 * (round % 10)));
        let suspended = app.suspend();
        writer.join().unwrap();
        let mark: Option<Option<i64>> = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT suspended_ms FROM sessions WHERE session_id = ?1",
                [app.session_id().as_str()],
                |r| r.get(0),
            )
            .ok();
        if suspended.is_ok() && !matches!(mark, Some(Some(_))) {
            erased += 1;
        }
        drop(app);
    }
    assert_eq!(
        erased, 0,
        "{erased} of {rounds} suspensions answered Ok with no mark left"
    );
}

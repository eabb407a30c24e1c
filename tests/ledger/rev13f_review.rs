//! Sixth review of the liveness rule (cb4d6fa). Each `defect_*` test failed
//! on cb4d6fa and passes since the fixes after it (RELIABILITY.md, row 74).

use super::lock_files::*;
use std::time::{Duration, Instant};

use toolledger::ledger::{Begin, Ledger, LedgerConfig};
use toolledger::model::ExecutionStatus;
use toolledger_test_support::*;

/// cb4d6fa: a suspended ledger's drop writes `closed` only into a file
/// whose identity equals `locked_id`. A suspended app whose lock file was
/// replaced by a copy (the very case row 72 names: a restore, a sync tool)
/// then drops its ledger while its process runs on (Android: the ledger's
/// owner object released while the app is in the background). No
/// `closed` is written anywhere visible; the copy says `suspended` and
/// names the app's process. Another process, past the lease, finds the
/// copy replaced (Absent), asks the process: it runs, so the call of the
/// dropped session stays `InFlight` for as long as the app process lives.
/// (On 86dbe74 `closed` went into the copy, and the call was reconciled.)
#[test]
fn defect_a_suspended_ledger_dropped_after_its_lock_file_was_replaced_keeps_its_call_in_flight() {
    for replaced in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let (app, _clock) = open_at(&path);
        let lock = lock_of(&path, app.session_id().as_str());
        let t = ticket(app.begin(&op("o"), 0, &spec("c1", "pay", "{}")).unwrap());
        app.suspend().unwrap();
        if replaced {
            replace_by_copy(&lock);
        }
        drop(app); // the session is over: nothing can send for it now
        let says = std::fs::read_to_string(&lock).unwrap_or_default();
        let closed = says.lines().any(|l| l == "closed");
        let answer = child_answer(&path);
        let (reader, _) = open_at(&path);
        let status = reader.get(&t.execution_id).unwrap().unwrap().status;
        assert!(
            answer != "InFlight",
            "replaced={replaced}: the call of a dropped (closed) session stays {answer} ({status:?}) \
             while its process runs; lock file says closed: {closed}"
        );
        let _ = status == ExecutionStatus::Executing;
    }
}

/// An unregistered session (its registration at open refused by a busy
/// file) that has only read so far holds its lock; a sync tool replaces its
/// lock file by a copy. `observe` reads the copy as missing (`Absent`),
/// and `judge` with `Absent` and no row is `Dead` without asking the
/// process (whose id is in the copy's record): `others_alive` is false and
/// the ledger is encrypted in place under the running session.
#[test]
fn defect_an_unregistered_running_session_whose_lock_file_was_replaced_does_not_stop_encrypt_in_place(
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let config = LedgerConfig {
        busy_timeout: Duration::from_millis(50),
        ..LedgerConfig::default()
    };
    drop(Ledger::open(&path, config.clone()).unwrap());
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let app = Ledger::open(&path, config.clone()).unwrap();
    holder.execute_batch("COMMIT").unwrap();
    let lock = lock_of(&path, app.session_id().as_str());
    // Control: without the replacement the running session stops it.
    let key = toolledger::ledger::LedgerKey::generate().unwrap();
    assert!(Ledger::encrypt_in_place(&path, config.clone(), &key).is_err());
    replace_by_copy(&lock);
    let sealed = Ledger::encrypt_in_place(&path, config, &key);
    let after = app.stats().map(|_| ());
    assert!(
        sealed.is_err(),
        "encrypted in place under a running (unregistered) session whose lock file was \
         replaced: {sealed:?}; its next read: {after:?}"
    );
    drop(app);
}

/// A session opened on a full disk has an empty lock file (row 71). Room
/// comes back; it begins a call (its row is written then). The disk fills
/// again and the app is suspended: the mark is refused (simulated by a
/// trigger, as the project's full-disk tests do) and `suspended` cannot be
/// written either (the empty file's first record needs a block: real
/// ENOSPC here). `judge`: free lock, a row without a mark, so the file must
/// say `suspended`; it is empty: `Dead` at once, and the frozen app's
/// call is handed over while its process runs. (An empty record, which no
/// exec or death writes, errs towards dead here.)
#[test]
fn defect_a_full_disk_session_whose_mark_is_refused_is_taken_over_at_once() {
    let Some(fs) = Mounted::tmpfs("4m") else {
        eprintln!("no tmpfs (not root): skipped");
        return;
    };
    let path = fs.path().join("l.db");
    let (extension, clock) = open_at(&path);
    for i in 0..40 {
        let s = spec(&format!("w{i}"), "warm", "{}");
        if let Begin::Execute(t) = extension.begin(&op("warm"), 0, &s).unwrap() {
            extension
                .commit(&t.attempt_id(), r#"{"r":1}"#, None)
                .unwrap();
        }
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER full_u BEFORE UPDATE ON sessions WHEN NEW.suspended_ms IS NOT NULL
         BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;",
    )
    .unwrap();
    conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    let filler = fill(fs.path());
    let app = open_with(&path, &clock);
    let lock = lock_of(&path, app.session_id().as_str());
    let len_at_open = std::fs::metadata(&lock).unwrap().len();
    std::fs::remove_file(&filler).unwrap();
    let s = spec("c1", "pay", "{}");
    let t = ticket(app.begin(&op("o"), 0, &s).unwrap());
    let filler = fill(fs.path());
    let suspended = app.suspend();
    let len_after_suspend = std::fs::metadata(&lock).unwrap().len();
    std::fs::remove_file(&filler).unwrap();
    // The app's process (this one) still runs the session: frozen, not dead.
    let answer = extension.begin(&op("o"), 0, &s).unwrap();
    let status = extension.get(&t.execution_id).unwrap().unwrap().status;
    assert!(
        matches!(answer, Begin::InFlight { .. }) && status == ExecutionStatus::Executing,
        "a frozen live owner was taken over at once: {}, {status:?} (suspend: {suspended:?}; \
         lock file {len_at_open} bytes at open, {len_after_suspend} after suspend)",
        variant(&answer)
    );
    drop(app);
}

/// `resume()` against a prober frozen on its lock now fails after 2 s, as
/// `lock_bounded` says "can be asked again". The error reaches the app as
/// `Error::Session("operation would block")`, which the bindings map to
/// `StorageKind::SessionLock` ("the session lock files next to the
/// database could not be used": no hint to retry), and the message of
/// `lock_bounded` is dropped (only `kind().to_string()` is kept).
#[test]
fn defect_a_resume_that_met_a_held_lock_answers_an_untyped_session_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (app, _clock) = open_at(&path);
    app.suspend().unwrap();
    let lock = lock_of(&path, app.session_id().as_str());
    let prober = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
    prober.try_lock().unwrap();
    let started = Instant::now();
    let resumed = app.resume().map(|_| ());
    let waited = started.elapsed();
    drop(prober);
    let shown = format!("{resumed:?}");
    assert!(
        matches!(
            resumed,
            Err(toolledger::ledger::Error::Store(
                toolledger::ledger::StorageError::Busy
            ))
        ),
        "resume after {waited:?}: {shown} (a transient, retryable refusal)"
    );
}

//! Delivery marks: lazy, never a sync of their own, never lost in a way that runs a tool again.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use rusqlite::Connection;
use support::*;
use toolledger::ledger::{Begin, Clock, Error, Ledger};
use toolledger::model::{ExecutionId, ExecutionStatus};
use toolledger_test_support as support;

/// Commit frames in the WAL since it was last restarted: each is one
/// transaction written (and, with `synchronous=FULL`, one sync).
fn wal_commits(db: &Path) -> usize {
    let mut wal = Vec::new();
    let mut name = db.as_os_str().to_os_string();
    name.push("-wal");
    if let Ok(mut f) = File::open(name) {
        f.read_to_end(&mut wal).unwrap();
    }
    if wal.len() < 32 {
        return 0;
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let page = be(&wal[8..12]);
    let salt = &wal[16..24];
    let (mut at, mut commits) = (32, 0);
    while at + 24 + page <= wal.len() {
        let frame = &wal[at..at + 24];
        if &frame[8..16] != salt {
            break;
        }
        if be(&frame[4..8]) != 0 {
            commits += 1;
        }
        at += 24 + page;
    }
    commits
}

/// The stored status, read by a separate plain connection (so nothing of
/// the ledger's own queue can show).
fn stored_status(db: &Path, id: &ExecutionId) -> String {
    Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT status FROM executions WHERE execution_id = ?1",
            [id.as_str()],
            |r| r.get(0),
        )
        .unwrap()
}

fn committed(ledger: &Ledger, op_name: &str, call_id: &str) -> ExecutionId {
    let t = ticket(
        ledger
            .begin(&op(op_name), 0, &spec(call_id, "send_email", "{}"))
            .unwrap(),
    );
    ledger
        .commit(&t.attempt_id(), r#"{"sent":true}"#, None)
        .unwrap();
    t.execution_id
}

#[test]
fn a_mark_rides_in_the_next_begin_and_costs_no_commit_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, _clock) = open_at(&db);
    let first = committed(&ledger, "o", "c1");
    let before = wal_commits(&db);

    ledger.mark_delivered(std::slice::from_ref(&first)).unwrap();
    assert_eq!(wal_commits(&db), before, "marking wrote nothing yet");
    assert_eq!(stored_status(&db, &first), "committed");

    let second = ticket(
        ledger
            .begin(&op("o"), 1, &spec("c2", "send_email", "{}"))
            .unwrap(),
    );
    assert_eq!(
        wal_commits(&db),
        before + 1,
        "the begin's one transaction carried the mark"
    );
    assert_eq!(stored_status(&db, &first), "result_delivered");
    assert_eq!(stored_status(&db, &second.execution_id), "executing");
}

#[test]
fn reads_report_a_mark_at_once_with_the_time_it_was_made() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let id = committed(&ledger, "o", "c1");
    let marked_at = clock.now_ms();
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    clock.advance(60_000);

    let rec = ledger.get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::ResultDelivered);
    assert_eq!(
        rec.updated_ms, marked_at,
        "the mark's time, not the write's"
    );
    let log = ledger.transitions(&id).unwrap();
    let last = log.last().unwrap();
    assert_eq!(last.transition, "deliver");
    assert_eq!(last.at_ms, marked_at);
    assert!(ledger.recover().unwrap().is_empty());
    // Marking again changes nothing and logs nothing.
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    assert_eq!(ledger.transitions(&id).unwrap().len(), log.len());
}

#[test]
fn a_mark_lost_with_the_process_only_replays_the_stored_result() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let clock;
    let id;
    {
        let (ledger, c) = open_at(&db);
        clock = c;
        id = committed(&ledger, "o", "c1");
        ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
        // The process dies before any later write: no destructor runs.
        ledger.abandon();
    }
    let ledger = open_with(&db, &clock);
    let rec = ledger.get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed, "the mark was lost");
    let pending = ledger.recover().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].status, ExecutionStatus::Committed);
    // Asked again, the call replays the stored result; nothing runs.
    match ledger
        .begin(&op("o"), 0, &spec("c1", "send_email", "{}"))
        .unwrap()
    {
        Begin::Replay(r) => assert_eq!(r.result_json, r#"{"sent":true}"#),
        other => panic!("expected Replay, got {other:?}"),
    }
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    assert_eq!(
        ledger.get(&id).unwrap().unwrap().status,
        ExecutionStatus::ResultDelivered
    );
}

#[test]
fn dropping_the_ledger_writes_the_queued_marks() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, _clock) = open_at(&db);
    let id = committed(&ledger, "o", "c1");
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    drop(ledger);
    assert_eq!(stored_status(&db, &id), "result_delivered");
}

#[test]
fn suspend_writes_the_queued_marks_before_closing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, _clock) = open_at(&db);
    let id = committed(&ledger, "o", "c1");
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    ledger.suspend().unwrap();
    assert_eq!(stored_status(&db, &id), "result_delivered");
    ledger.resume().unwrap();
}

#[test]
fn a_mark_for_work_that_has_not_committed_is_refused_and_nothing_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, _clock) = open_at(&db);
    let done = committed(&ledger, "o", "c1");
    let running = ticket(
        ledger
            .begin(&op("o"), 0, &spec("c2", "send_email", "{}"))
            .unwrap(),
    )
    .execution_id;
    let missing = ExecutionId::parse("o:round_9:nope:send_email:v1").unwrap();

    let err = ledger
        .mark_delivered(&[done.clone(), running.clone()])
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidTransition { ref execution_id, from: ExecutionStatus::Executing, .. } if *execution_id == running),
        "{err:?}"
    );
    let err = ledger
        .mark_delivered(&[done.clone(), missing.clone()])
        .unwrap_err();
    assert!(
        matches!(err, Error::NotFound(ref id) if *id == missing),
        "{err:?}"
    );

    // Neither batch left a mark behind, not even for the committed id.
    ledger
        .commit(&current(&ledger, &running), "{}", None)
        .unwrap();
    assert_eq!(stored_status(&db, &done), "committed");
    assert_eq!(
        ledger.get(&done).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
}

#[test]
fn a_failed_write_keeps_the_queued_marks_for_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, _clock) = open_at(&db);
    let id = committed(&ledger, "o", "c1");
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    // This write applies the mark, then fails and rolls back.
    let missing = ExecutionId::parse("o:round_9:nope:send_email:v1").unwrap();
    assert!(matches!(
        ledger.commit(&current(&ledger, &missing), "{}", None),
        Err(Error::NotFound(_))
    ));
    assert_eq!(stored_status(&db, &id), "committed", "rolled back with it");
    // The mark was queued again and goes out with the next write.
    committed(&ledger, "o", "c2");
    assert_eq!(stored_status(&db, &id), "result_delivered");
    assert_eq!(
        ledger
            .transitions(&id)
            .unwrap()
            .iter()
            .filter(|t| t.transition == "deliver")
            .count(),
        1
    );
}

#[test]
fn marks_for_results_committed_elsewhere_are_checked_by_a_read() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (first, clock) = open_at(&db);
    let id = committed(&first, "o", "c1");
    drop(first);
    // Another ledger (another process, or after a restart) marks it.
    let ledger = open_with(&db, &clock);
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    assert_eq!(
        ledger.get(&id).unwrap().unwrap().status,
        ExecutionStatus::ResultDelivered
    );
}

/// A replay is answered from a narrow read of the committed record: it
/// must hand back exactly what was committed (result byte for byte, the
/// downstream's id), delivered or not, whether `begin` found the write
/// lock free (one transaction that writes nothing) or held by another
/// connection (a read), and other arguments must still conflict.
#[test]
fn a_replay_answers_exactly_the_committed_record_with_or_without_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, _clock) = open_at(&db);
    let call = spec("c1", "send_email", r#"{"to":"ada@example.com"}"#);
    let t = ticket(ledger.begin(&op("o"), 0, &call).unwrap());
    let result = r#"{"id":"msg_1","note":"caf\u00e9 ü"}"#;
    ledger
        .commit(&t.attempt_id(), result, Some("ext_1"))
        .unwrap();
    let exact = |answer: Begin| match answer {
        Begin::Replay(r) => {
            assert_eq!(r.execution_id, t.execution_id);
            assert_eq!(r.result_json, result, "byte for byte");
            assert_eq!(r.external_id.as_deref(), Some("ext_1"));
            assert!(!r.partial);
        }
        other => panic!("expected a replay, got {other:?}"),
    };
    let commits = wal_commits(&db);
    exact(ledger.begin(&op("o"), 0, &call).unwrap());
    assert_eq!(wal_commits(&db), commits, "a replay writes nothing");

    let changed = spec("c1", "send_email", r#"{"to":"mallory@example.com"}"#);
    match ledger.begin(&op("o"), 0, &changed).unwrap() {
        Begin::Conflict {
            execution_id,
            stored_digest,
            new_digest,
        } => {
            assert_eq!(execution_id, t.execution_id);
            assert_ne!(stored_digest, new_digest);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }

    ledger
        .mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    exact(ledger.begin(&op("o"), 0, &call).unwrap());
    // The mark is written by the next write; the replay read saw it queued.
    let other = ticket(
        ledger
            .begin(&op("o"), 1, &spec("c2", "send_email", "{}"))
            .unwrap(),
    );
    assert_eq!(stored_status(&db, &t.execution_id), "result_delivered");
    exact(ledger.begin(&op("o"), 0, &call).unwrap());

    // Another connection holds the write lock: the replay is a read.
    let holder = Connection::open(&db).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    exact(ledger.begin(&op("o"), 0, &call).unwrap());
    holder.execute_batch("ROLLBACK").unwrap();
    // An execution that did not commit still answers by its whole record.
    assert!(matches!(
        ledger
            .begin(&op("o"), 1, &spec("c2", "send_email", "{}"))
            .unwrap(),
        Begin::InFlight { ref execution_id, .. } if *execution_id == other.execution_id
    ));
}

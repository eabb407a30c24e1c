//! What needs attention: recover() finds every non-final execution without begin writing an index entry.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use support::*;
use toolledger::ledger::{Begin, Ledger};
use toolledger::model::{ExecutionId, ExecutionStatus};
use toolledger_test_support as support;

const DAY_MS: i64 = 86_400_000;

fn begin(ledger: &Ledger, op_name: &str, round: u32, call_id: &str) -> ExecutionId {
    ticket(
        ledger
            .begin(&op(op_name), round, &spec(call_id, "send_email", "{}"))
            .unwrap(),
    )
    .execution_id
}

fn delivered(ledger: &Ledger, op_name: &str, round: u32, call_id: &str) -> ExecutionId {
    let id = begin(ledger, op_name, round, call_id);
    ledger.commit(&current(ledger, &id), "{}", None).unwrap();
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    id
}

/// (watermark, flag of `id`, rows above the watermark), read by a plain
/// connection.
fn attention_state(db: &Path, id: &ExecutionId) -> (i64, Option<i64>, i64) {
    let conn = Connection::open(db).unwrap();
    let w: i64 = conn
        .query_row("SELECT swept_rowid FROM attention_sweep", [], |r| r.get(0))
        .unwrap();
    let flag: Option<i64> = conn
        .query_row(
            "SELECT needs_attention FROM executions WHERE execution_id = ?1",
            [id.as_str()],
            |r| r.get(0),
        )
        .unwrap();
    let above: i64 = conn
        .query_row(
            "SELECT count(*) FROM executions WHERE rowid > ?1",
            [w],
            |r| r.get(0),
        )
        .unwrap();
    (w, flag, above)
}

fn ids(records: &[toolledger::model::ExecutionRecord]) -> Vec<&ExecutionId> {
    records.iter().map(|r| &r.execution_id).collect()
}

#[test]
fn work_begun_long_ago_is_swept_into_the_index_and_still_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, clock) = open_at(&db);
    let waiting = ticket_or_approval(&ledger);
    let running = begin(&ledger, "old", 1, "running");
    let committed = begin(&ledger, "old", 2, "committed");
    ledger
        .commit(&current(&ledger, &committed), "{}", None)
        .unwrap();
    // Many calls later, begins have swept the old rows into the index.
    for i in 0..600 {
        delivered(&ledger, &format!("op_{}", i / 4), i % 4, &format!("c{i}"));
    }
    // The last delivery mark is written (reads never write it).
    ledger.checkpoint().unwrap();
    let (w, flag, above) = attention_state(&db, &running);
    assert!(w > 256, "the watermark moved past the old rows: {w}");
    assert_eq!(flag, Some(1), "the old executing row is flagged");
    assert!(above <= 256, "few rows above the watermark: {above}");
    let rec = ledger.get(&running).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);

    // The process dies; the next one recovers all three, and nothing else.
    ledger.abandon();
    clock.advance(DAY_MS);
    let ledger = open_with(&db, &clock);
    let pending = ledger.recover().unwrap();
    let mut found = ids(&pending);
    found.sort();
    let mut expected = vec![&waiting, &running, &committed];
    expected.sort();
    assert_eq!(found, expected);
    let running_rec = pending.iter().find(|r| r.execution_id == running).unwrap();
    assert_eq!(running_rec.status, ExecutionStatus::OutcomeUnknown);
    // Delivered: the flag goes, and recover no longer lists it.
    ledger
        .mark_delivered(std::slice::from_ref(&committed))
        .unwrap();
    assert!(!ids(&ledger.recover().unwrap()).contains(&&committed));
    assert_eq!(attention_state(&db, &committed).1, None);
}

/// A call that waits for approval (prepared), begun first.
fn ticket_or_approval(ledger: &Ledger) -> ExecutionId {
    match ledger
        .begin(
            &op("old"),
            0,
            &spec("approve_me", "pay", "{}").with_approval(),
        )
        .unwrap()
    {
        Begin::NeedsApproval(req) => req.execution_id,
        other => panic!("expected NeedsApproval, got {other:?}"),
    }
}

#[test]
fn work_begun_since_the_last_sweep_is_recovered_from_above_the_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, clock) = open_at(&db);
    for i in 0..10 {
        delivered(&ledger, "done", i, "c");
    }
    assert!(ledger.recover().unwrap().is_empty());
    let running = begin(&ledger, "new", 0, "running");
    let (w, flag, above) = attention_state(&db, &running);
    assert_eq!(
        (w, flag, above),
        (10, None, 1),
        "not flagged, above the watermark"
    );
    ledger.abandon();
    clock.advance(DAY_MS);
    let ledger = open_with(&db, &clock);
    let pending = ledger.recover().unwrap();
    assert_eq!(ids(&pending), [&running]);
    assert_eq!(pending[0].status, ExecutionStatus::OutcomeUnknown);
    // recover swept it: now it is in the index.
    assert_eq!(attention_state(&db, &running).1, Some(1));
}

#[test]
fn pruning_the_newest_rows_cannot_hide_a_new_call_below_the_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (ledger, clock) = open_at(&db);
    for i in 0..5 {
        delivered(&ledger, "o", i, "c");
    }
    ledger.recover().unwrap();
    assert_eq!(attention_state(&db, &begin(&ledger, "p", 0, "probe")).0, 5);
    let probe = ExecutionId::parse("p:round_0:probe:send_email:v1").unwrap();
    ledger
        .commit(&current(&ledger, &probe), "{}", None)
        .unwrap();
    ledger.mark_delivered(std::slice::from_ref(&probe)).unwrap();
    ledger.recover().unwrap();

    clock.advance(10 * DAY_MS);
    let report = ledger.prune(Duration::from_secs(86_400), true).unwrap();
    assert_eq!(report.executions, 6);
    // SQLite now hands out row id 1 again: the watermark came down with it.
    let running = begin(&ledger, "later", 0, "running");
    let conn = Connection::open(&db).unwrap();
    let rowid: i64 = conn
        .query_row(
            "SELECT rowid FROM executions WHERE execution_id = ?1",
            [running.as_str()],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rowid, 1, "the row id was reused");
    assert_eq!(attention_state(&db, &running).0, 0);

    ledger.abandon();
    clock.advance(DAY_MS);
    let ledger = open_with(&db, &clock);
    let pending = ledger.recover().unwrap();
    assert_eq!(ids(&pending), [&running]);
    assert_eq!(pending[0].status, ExecutionStatus::OutcomeUnknown);
}

//! Opening files: fresh, current, future, not a database, corrupt.

mod support;

use rusqlite::Connection;
use support::*;
use toolledger::ledger::{Begin, Error, Ledger, LedgerConfig};
use toolledger::store::{self, schema::CURRENT_VERSION};

#[test]
fn an_empty_file_is_migrated_to_the_current_version_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    std::fs::write(&path, b"").unwrap();
    let (ledger, _clock) = open_at(&path);
    drop(ledger);
    let conn = Connection::open(&path).unwrap();
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, CURRENT_VERSION);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        tables,
        [
            "approvals",
            "attention_sweep",
            "batch_items",
            "executions",
            "jobs",
            "operations",
            "tombstones",
            "transitions_orphaned",
            "webhook_events"
        ]
    );
}

#[test]
fn reopening_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let Begin::Execute(t) = ledger.begin(&op("o"), 0, &spec("c", "t", "{}")).unwrap() else {
        panic!()
    };
    ledger.commit(&t.execution_id, "[1]", None).unwrap();
    drop(ledger);
    for _ in 0..3 {
        let l = open_with(&path, &clock);
        assert_eq!(
            l.get(&t.execution_id)
                .unwrap()
                .unwrap()
                .result_json
                .as_deref(),
            Some("[1]")
        );
    }
}

#[test]
fn a_database_from_a_newer_version_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=DELETE; CREATE TABLE future(x); PRAGMA user_version = 99;",
        )
        .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    match Ledger::open(&path, LedgerConfig::default()) {
        Err(Error::Store(store::Error::IncompatibleVersion {
            found: 99,
            supported,
        })) => {
            assert_eq!(supported, CURRENT_VERSION)
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn a_file_that_is_not_a_database_gives_a_typed_error_and_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let junk = b"this is a JPEG, honestly. ".repeat(200);
    std::fs::write(&path, &junk).unwrap();
    match Ledger::open(&path, LedgerConfig::default()) {
        Err(Error::Store(store::Error::NotADatabase)) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), junk);
}

#[test]
fn a_corrupt_database_gives_a_typed_error_and_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let (ledger, _c) = open_at(&path);
        for i in 0..50 {
            let s = spec(
                &format!("c{i}"),
                "t",
                &format!(r#"{{"pad":"{}"}}"#, "x".repeat(500)),
            );
            let _ = ledger.begin(&op("o"), 0, &s).unwrap();
        }
        ledger.suspend().unwrap(); // checkpoint everything into the main file
    }
    let mut bytes = std::fs::read(&path).unwrap();
    // Keep the header valid, scribble over the schema page and data pages.
    for b in bytes.iter_mut().skip(100).take(8000) {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let err = Ledger::open(&path, LedgerConfig::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store(store::Error::Corrupt) | Error::Store(store::Error::NotADatabase)
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn a_missing_directory_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/l.db");
    assert!(matches!(
        Ledger::open(&path, LedgerConfig::default()),
        Err(Error::Store(store::Error::CannotOpen))
    ));
}

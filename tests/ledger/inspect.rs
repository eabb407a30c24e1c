//! Inspector: reading a ledger file without writing to it.

use support::*;
use toolledger::ledger::{Begin, Error, Inspector, PageCursor, StorageError};
use toolledger_test_support as support;

fn commit_one(ledger: &toolledger::ledger::Ledger, call: &str) {
    match ledger
        .begin(&op("op_i"), 0, &spec(call, "send_email", "{}"))
        .unwrap()
    {
        Begin::Execute(t) => {
            ledger.commit(&t.attempt_id(), "{}", None).unwrap();
        }
        other => panic!("expected Execute, got {other:?}"),
    }
}

#[test]
fn an_inspector_opened_before_a_writer_sees_what_the_writer_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let (ledger, _clock) = open_at(&path);
        commit_one(&ledger, "c1");
    }
    assert!(!dir.path().join("l.db-wal").exists(), "closed cleanly");
    // Opened as immutable: no -wal existed.
    let inspector = Inspector::open(&path).unwrap();
    assert_eq!(inspector.execution_count().unwrap(), 1);
    assert!(!dir.path().join("l.db-shm").exists(), "nothing created");
    // A writer starts using the file while the inspector is open.
    let (ledger, _clock) = open_at(&path);
    commit_one(&ledger, "c2");
    // The inspector notices and reads through the shared locks.
    assert_eq!(inspector.execution_count().unwrap(), 2);
    let (page, next) = inspector
        .executions_page(PageCursor::default(), 10)
        .unwrap();
    assert_eq!(page.len(), 2);
    let (rest, _) = inspector.executions_page(next, 10).unwrap();
    assert!(rest.is_empty());
    commit_one(&ledger, "c3");
    assert_eq!(inspector.summary().unwrap().stats.transitions, 6);
}

#[test]
fn an_inspector_refuses_what_is_not_a_ledger_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    assert!(matches!(
        Inspector::open(&missing),
        Err(Error::Store(StorageError::CannotOpen))
    ));
    assert!(!missing.exists(), "an inspector never creates a file");
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![b'x'; 8192]).unwrap();
    assert!(matches!(
        Inspector::open(&junk),
        Err(Error::Store(StorageError::NotADatabase))
    ));
    assert_eq!(std::fs::read(&junk).unwrap(), vec![b'x'; 8192]);
}

#[test]
fn a_migrated_copy_says_which_schema_the_file_has() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    {
        let (ledger, _clock) = open_at(&path);
        commit_one(&ledger, "c1");
    }
    let before = std::fs::read(&path).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let copy = Inspector::open_migrated_copy(&path, scratch.path()).unwrap();
    assert_eq!(
        copy.copied_from_schema(),
        Some(toolledger::ledger::SCHEMA_VERSION)
    );
    assert_eq!(copy.execution_count().unwrap(), 1);
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

/// An empty SQLite file (or one another process is creating right now)
/// holds no ledger yet: a read-only open says so, typed as an older schema
/// (version 0) and worded for what it is, and writes nothing.
#[test]
fn an_inspector_on_a_file_with_no_ledger_yet_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    drop(rusqlite::Connection::open(&path).unwrap());
    let before = std::fs::read(&path).unwrap();
    let Err(err) = Inspector::open(&path) else {
        panic!("an empty file opened as a ledger");
    };
    assert!(
        matches!(
            err,
            Error::Store(StorageError::OlderSchema { found: 0, .. })
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("holds no ledger yet"), "{text}");
    assert!(!text.contains("migrate"), "{text}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

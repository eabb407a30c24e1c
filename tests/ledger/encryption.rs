//! Encryption at rest: values unreadable on disk, keyed digests, a wrong key
//! that changes nothing, encryption in place, key rotation, values bound to
//! their row, and every guarantee (replay, conflicts, tombstones) kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use toolledger_test_support as support;

use support::{op, spec};
use toolledger::ledger::{
    Begin, CallSpec, Error, Ledger, LedgerConfig, LedgerKey, ManualClock, StorageError,
};
use toolledger::model::{digest_arguments, ExecutionStatus, JsonLimits};

const CANARY: &str = "CANARY-7c1e-4111-1111-1111-1111";

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_000_000))
}

fn open(path: &Path, clock: &Arc<ManualClock>, key: Option<&LedgerKey>) -> Ledger {
    Ledger::open_with(path, LedgerConfig::default(), clock.clone(), key).unwrap()
}

fn open_err(path: &Path, key: Option<&LedgerKey>) -> StorageError {
    match Ledger::open_with(path, LedgerConfig::default(), clock(), key) {
        Err(Error::Store(e)) => e,
        other => panic!("expected a storage error, got {:?}", other.map(|_| ())),
    }
}

fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// The bytes of the database and its WAL.
fn disk_bytes(db: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(db).unwrap();
    bytes.extend(std::fs::read(sidecar(db, "-wal")).unwrap_or_default());
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn args() -> String {
    format!(r#"{{"to":"{CANARY}@example.com","amount":"$50"}}"#)
}

/// Plants the canary everywhere a value goes: arguments, an approval
/// preview, an external id, a result, a failure reason (a tool's exception
/// text), a batch-free job id.
fn plant(ledger: &Ledger) -> (CallSpec, CallSpec) {
    let mut approved = spec("call_1", "pay", &args());
    approved.requires_approval = true;
    let Begin::NeedsApproval(request) = ledger.begin(&op("op_1"), 0, &approved).unwrap() else {
        panic!("approval first")
    };
    ledger
        .approve(
            &request.execution_id,
            &request.args_digest,
            Some(&format!(r#"{{"shown":"{CANARY}"}}"#)),
        )
        .unwrap();
    let ticket = ledger.mark_executing(&request.execution_id).unwrap();
    ledger
        .record_external_id(&ticket.attempt_id(), &format!("ext-{CANARY}"))
        .unwrap();
    ledger
        .commit(
            &ticket.attempt_id(),
            &format!(r#"{{"receipt":"{CANARY}"}}"#),
            Some(&format!("ext-{CANARY}")),
        )
        .unwrap();
    let failing = spec("call_2", "email", &args());
    let Begin::Execute(t2) = ledger.begin(&op("op_1"), 0, &failing).unwrap() else {
        panic!("execute")
    };
    ledger
        .fail_before_commit(&t2.attempt_id(), &format!("tool error: {CANARY}"), false)
        .unwrap();
    (approved, failing)
}

#[test]
fn values_are_unreadable_in_the_database_and_its_wal() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let key = LedgerKey::generate().unwrap();
    let c = clock();
    let ledger = open(&db, &c, Some(&key));
    assert!(ledger.is_encrypted());
    let (approved, _) = plant(&ledger);
    // While open (the values sit in the WAL) and after a checkpoint.
    assert!(!contains(&disk_bytes(&db), CANARY), "canary on disk (WAL)");
    ledger.checkpoint().unwrap();
    drop(ledger);
    assert!(!contains(&disk_bytes(&db), CANARY), "canary on disk");
    // Not even the domain part of the address, nor the amount.
    assert!(!contains(&disk_bytes(&db), "example.com"));

    // Everything reads back through the key, byte for byte.
    let ledger = open(&db, &c, Some(&key));
    match ledger.begin(&op("op_1"), 0, &approved).unwrap() {
        Begin::Replay(r) => {
            assert_eq!(r.result_json, format!(r#"{{"receipt":"{CANARY}"}}"#));
            assert_eq!(r.external_id, Some(format!("ext-{CANARY}")));
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let recs = ledger.list(&op("op_1")).unwrap();
    assert_eq!(recs[0].args_json, args());
    let failed = recs
        .iter()
        .find(|r| r.status == ExecutionStatus::FailedBeforeCommit)
        .unwrap();
    assert_eq!(
        failed.last_reason.as_deref(),
        Some(&*format!("tool error: {CANARY}"))
    );
    let log = ledger.transitions(&failed.execution_id).unwrap();
    assert!(log
        .iter()
        .any(|e| e.reason.as_deref() == Some(&*format!("tool error: {CANARY}"))));
}

#[test]
fn the_digest_is_keyed_so_a_guess_cannot_be_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let key = LedgerKey::generate().unwrap();
    let ledger = open(&db, &clock(), Some(&key));
    let low_entropy = r#"{"amount":"$50","to":"A"}"#;
    let Begin::Execute(t) = ledger
        .begin(&op("op"), 0, &spec("c", "pay", low_entropy))
        .unwrap()
    else {
        panic!()
    };
    // What someone holding the file would compute for a guess.
    let guess = digest_arguments("pay", 1, low_entropy, &JsonLimits::default())
        .unwrap()
        .digest;
    assert_ne!(t.args_digest, guess);
    assert!(!contains(&disk_bytes(&db), guess.as_str()));
    // The same call still gets the same digest: replay, not a conflict.
    ledger.commit(&t.attempt_id(), "{}", None).unwrap();
    assert!(matches!(
        ledger
            .begin(
                &op("op"),
                0,
                &spec("c", "pay", r#"{ "to":"A", "amount":"$50" }"#)
            )
            .unwrap(),
        Begin::Replay(_)
    ));
    assert!(matches!(
        ledger
            .begin(
                &op("op"),
                0,
                &spec("c", "pay", r#"{"amount":"$51","to":"A"}"#)
            )
            .unwrap(),
        Begin::Conflict { .. }
    ));
    // Another ledger (another key) digests the same call differently.
    let other = open(
        &dir.path().join("m.db"),
        &clock(),
        Some(&LedgerKey::generate().unwrap()),
    );
    let Begin::Execute(t2) = other
        .begin(&op("op"), 0, &spec("c", "pay", low_entropy))
        .unwrap()
    else {
        panic!()
    };
    assert_ne!(t.args_digest, t2.args_digest);
}

#[test]
fn a_wrong_or_missing_key_is_a_typed_error_that_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let key = LedgerKey::generate().unwrap();
    let ledger = open(&db, &clock(), Some(&key));
    plant(&ledger);
    // Everything in the main file: what SQLite itself does when the last
    // connection closes is not what this test is about.
    ledger.checkpoint().unwrap();
    drop(ledger);
    let before = std::fs::read(&db).unwrap();
    let wal_before = std::fs::read(sidecar(&db, "-wal")).unwrap_or_default();
    let sessions_before: Vec<_> = std::fs::read_dir(sidecar(&db, "-sessions"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();

    let wrong = LedgerKey::generate().unwrap();
    assert!(matches!(
        open_err(&db, Some(&wrong)),
        StorageError::WrongKey
    ));
    assert!(matches!(open_err(&db, None), StorageError::KeyRequired));
    assert!(matches!(
        LedgerKey::from_bytes(&[1; 31]),
        Err(StorageError::InvalidKey)
    ));

    assert_eq!(std::fs::read(&db).unwrap(), before, "database untouched");
    assert_eq!(
        std::fs::read(sidecar(&db, "-wal")).unwrap_or_default(),
        wal_before,
        "WAL untouched"
    );
    let sessions_after: Vec<_> = std::fs::read_dir(sidecar(&db, "-sessions"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert_eq!(sessions_before, sessions_after, "no session left behind");
    // The right key still opens it.
    assert!(open(&db, &clock(), Some(&key)).is_encrypted());
}

#[test]
fn a_key_for_a_plain_ledger_with_records_is_refused_until_it_is_encrypted() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let ledger = open(&db, &clock(), None);
    plant(&ledger);
    drop(ledger);
    let key = LedgerKey::generate().unwrap();
    assert!(matches!(
        open_err(&db, Some(&key)),
        StorageError::NotEncrypted
    ));
}

#[test]
fn a_plain_ledger_is_encrypted_in_place_and_keeps_every_guarantee() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let c = clock();
    let ledger = open(&db, &c, None);
    let (approved, failing) = plant(&ledger);
    // A tombstone: a delivered call, pruned.
    let pruned = spec("call_3", "pay", &args());
    let Begin::Execute(t3) = ledger.begin(&op("op_2"), 0, &pruned).unwrap() else {
        panic!()
    };
    ledger
        .commit(&t3.attempt_id(), &format!(r#"{{"r":"{CANARY}"}}"#), None)
        .unwrap();
    ledger
        .mark_delivered(std::slice::from_ref(&t3.execution_id))
        .unwrap();
    c.advance(3_600_000);
    ledger.prune(Duration::from_secs(60), true).unwrap();
    drop(ledger);
    assert!(
        contains(&disk_bytes(&db), CANARY),
        "the plain ledger shows it"
    );
    let rowids = |db: &Path| -> Vec<(String, i64)> {
        let conn = rusqlite::Connection::open(db).unwrap();
        let mut stmt = conn
            .prepare("SELECT execution_id, rowid FROM executions ORDER BY rowid")
            .unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.map(Result::unwrap).collect()
    };
    let rowids_before = rowids(&db);

    let key = LedgerKey::generate().unwrap();
    Ledger::encrypt_in_place(&db, LedgerConfig::default(), &key).unwrap();
    // The attention sweep and exports page by row id: kept.
    assert_eq!(rowids(&db), rowids_before);
    assert!(
        !contains(&disk_bytes(&db), CANARY),
        "no earlier byte of a value is left in the file or its WAL"
    );
    // Encrypting twice is refused (it needs the key to open now).
    assert!(matches!(
        Ledger::encrypt_in_place(&db, LedgerConfig::default(), &key),
        Err(Error::Store(StorageError::KeyRequired))
    ));

    let ledger = open(&db, &c, Some(&key));
    // Replay of the committed call, byte for byte.
    assert!(matches!(
        ledger.begin(&op("op_1"), 0, &approved).unwrap(),
        Begin::Replay(r) if r.result_json == format!(r#"{{"receipt":"{CANARY}"}}"#)
    ));
    // Conflict detection on the (now keyed) digests.
    let mut changed = approved.clone();
    changed.call.arguments = r#"{"to":"x"}"#.into();
    assert!(matches!(
        ledger.begin(&op("op_1"), 0, &changed).unwrap(),
        Begin::Conflict { .. }
    ));
    // A failed, non-retryable call stays failed.
    assert!(matches!(
        ledger.begin(&op("op_1"), 0, &failing).unwrap(),
        Begin::Failed { .. }
    ));
    // The tombstone still answers a late retry (same args: never runs;
    // other args: a conflict).
    assert!(matches!(
        ledger.begin(&op("op_2"), 0, &pruned).unwrap(),
        Begin::Failed { .. }
    ));
    let mut other = pruned.clone();
    other.call.arguments = r#"{"to":"y"}"#.into();
    assert!(matches!(
        ledger.begin(&op("op_2"), 0, &other).unwrap(),
        Begin::Conflict { .. }
    ));
    // And it goes on working: a new call runs, commits, replays.
    let fresh = spec("call_9", "pay", &args());
    let Begin::Execute(t) = ledger.begin(&op("op_3"), 0, &fresh).unwrap() else {
        panic!()
    };
    ledger.commit(&t.attempt_id(), "{\"ok\":1}", None).unwrap();
    assert!(matches!(
        ledger.begin(&op("op_3"), 0, &fresh).unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn the_key_rotates_and_the_old_one_opens_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let old = LedgerKey::generate().unwrap();
    let ledger = open(&db, &clock(), Some(&old));
    let (approved, _) = plant(&ledger);
    drop(ledger);
    let new = LedgerKey::generate().unwrap();
    let wrong = LedgerKey::generate().unwrap();
    assert!(matches!(
        Ledger::rotate_key(&db, LedgerConfig::default(), &wrong, &new),
        Err(Error::Store(StorageError::WrongKey))
    ));
    Ledger::rotate_key(&db, LedgerConfig::default(), &old, &new).unwrap();
    assert!(matches!(open_err(&db, Some(&old)), StorageError::WrongKey));
    let ledger = open(&db, &clock(), Some(&new));
    assert!(matches!(
        ledger.begin(&op("op_1"), 0, &approved).unwrap(),
        Begin::Replay(r) if r.result_json.contains(CANARY)
    ));
    assert!(!contains(&disk_bytes(&db), CANARY));
}

#[test]
fn encrypting_or_rotating_needs_the_ledger_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let ledger = open(&db, &clock(), None);
    plant(&ledger);
    let key = LedgerKey::generate().unwrap();
    assert!(matches!(
        Ledger::encrypt_in_place(&db, LedgerConfig::default(), &key),
        Err(Error::Store(StorageError::InUse))
    ));
    // Nothing changed: it still opens without a key.
    drop(ledger);
    assert!(!open(&db, &clock(), None).is_encrypted());
}

#[test]
fn a_ciphertext_moved_to_another_row_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let key = LedgerKey::generate().unwrap();
    let ledger = open(&db, &clock(), Some(&key));
    for (i, result) in ["{\"to\":\"alice\"}", "{\"to\":\"mallory\"}"]
        .iter()
        .enumerate()
    {
        let s = spec(&format!("c{i}"), "pay", "{}");
        let Begin::Execute(t) = ledger.begin(&op("op"), 0, &s).unwrap() else {
            panic!()
        };
        ledger.commit(&t.attempt_id(), result, None).unwrap();
    }
    drop(ledger);
    // Someone with the file copies mallory's sealed result over alice's
    // (the schema's own guard is taken off first, as an attacker would).
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch("DROP TRIGGER executions_guard;")
            .unwrap();
        let n = conn
            .execute(
                "UPDATE executions SET result_json =
                   (SELECT result_json FROM executions WHERE execution_id LIKE '%c1%')
                 WHERE execution_id LIKE '%c0%'",
                [],
            )
            .unwrap();
        assert_eq!(n, 1);
    }
    let ledger = open(&db, &clock(), Some(&key));
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("c0", "pay", "{}")),
        Err(Error::Store(StorageError::Undecryptable))
    ));
    // The untouched row still reads.
    assert!(matches!(
        ledger.begin(&op("op"), 0, &spec("c1", "pay", "{}")).unwrap(),
        Begin::Replay(r) if r.result_json.contains("mallory")
    ));
}

#[test]
fn a_writer_that_does_not_know_the_ledger_is_encrypted_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let key = LedgerKey::generate().unwrap();
    drop(open(&db, &clock(), Some(&key)));
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "INSERT INTO operations (operation_id, status, created_ms, updated_ms)
         VALUES ('o', 'open', 1, 1)",
        [],
    )
    .unwrap();
    let err = conn
        .execute(
            "INSERT INTO executions (execution_id, operation_id, round, position, provider,
                provider_call_id, tool_name, tool_version, args_digest, args_json,
                downstream_key, requires_approval, status, attempt_count, created_ms,
                updated_ms)
             VALUES ('o:x', 'o', 0, 0, 'custom', 'c', 't', 1, ?1, '{\"plain\":1}', 'k', 0,
                'prepared', 0, 1, 1)",
            ["a".repeat(64)],
        )
        .unwrap_err();
    assert!(err.to_string().contains("the ledger is encrypted"), "{err}");
}

/// A rotation whose scrub (VACUUM, then a TRUNCATE checkpoint) cannot
/// finish because a reader holds a snapshot (an inspector, a backup tool
/// mid-read): the documented promise of an error is "the ledger stays under
/// `old`". An app that keeps the old key after the error must still open
/// its ledger; otherwise every stored result is lost to it.
#[test]
fn a_rotation_that_reports_an_error_leaves_the_ledger_under_the_key_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let old = LedgerKey::generate().unwrap();
    let ledger = open(&db, &clock(), Some(&old));
    let (approved, _) = plant(&ledger);
    drop(ledger);
    let reader = rusqlite::Connection::open(&db).unwrap();
    reader
        .execute_batch("BEGIN; SELECT count(*) FROM executions;")
        .unwrap();
    let new = LedgerKey::generate().unwrap();
    let rotated = Ledger::rotate_key(&db, LedgerConfig::default(), &old, &new);
    eprintln!("rotation with a reader holding a snapshot: {rotated:?}");
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    // Ok, or the typed "re-keyed, not scrubbed yet": under `new`; any
    // other error: under `old`, as documented.
    let rekeyed = matches!(
        rotated,
        Ok(()) | Err(Error::Store(StorageError::NotScrubbed(_)))
    );
    let under = if rekeyed { &new } else { &old };
    let ledger = Ledger::open_with(&db, LedgerConfig::default(), clock(), Some(under));
    assert!(
        ledger.is_ok(),
        "rotate_key answered {rotated:?}; the ledger must open under the key that answer implies, got {:?}",
        ledger.map(|_| ())
    );
    assert!(matches!(
        ledger.unwrap().begin(&op("op_1"), 0, &approved).unwrap(),
        Begin::Replay(r) if r.result_json.contains(CANARY)
    ));
    // Re-keying again with the new key as both old and new scrubs it.
    if rekeyed {
        Ledger::rotate_key(&db, LedgerConfig::default(), &new, &new).unwrap();
        assert!(!contains(&disk_bytes(&db), CANARY));
    }
}

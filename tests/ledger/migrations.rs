//! Opening files: fresh, current, older (migrated), newer, not a database, corrupt.

use rusqlite::Connection;
use support::*;
use toolledger::ledger::{
    Begin, Error, Ledger, LedgerConfig, StorageError, SCHEMA_VERSION as CURRENT_VERSION,
};
use toolledger_test_support as support;

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
            "evidence",
            "executions",
            "jobs",
            "meta",
            "operations",
            "sessions",
            "tombstones",
            "transitions_orphaned",
            "webhook_events"
        ]
    );
}

/// A new file with the schema of `version` (3 or later) as that version
/// wrote it: the frozen migrations of the repository, applied in order.
/// Version 3's migration has a Rust step between its two SQL parts (writing
/// log lines from old rows): a no-op on the empty tables here.
fn frozen_schema(path: &std::path::Path, version: i64) -> Connection {
    const STEPS: [(i64, &str); 5] = [
        (
            1,
            include_str!("../../src/store/migrations/001_initial.sql"),
        ),
        (
            2,
            include_str!("../../src/store/migrations/002_retention.sql"),
        ),
        (
            3,
            include_str!("../../src/store/migrations/003_hot_path.sql"),
        ),
        (
            3,
            include_str!("../../src/store/migrations/003_hot_path_swap.sql"),
        ),
        (4, include_str!("../../src/store/migrations/004_owners.sql")),
    ];
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL;")
        .unwrap();
    for (_, sql) in STEPS.iter().filter(|(v, _)| *v <= version) {
        conn.execute_batch(sql).unwrap();
    }
    conn.execute_batch(&format!("PRAGMA user_version = {version};"))
        .unwrap();
    conn
}

/// A version 3 database as version 3 wrote it (its own migrations, frozen
/// in the repository), holding: a call committed with a digest of version 3
/// (numbers read as doubles), an `executing` row with a wall-clock lease of a
/// session that is gone, and a tombstone.
fn v3_database(path: &std::path::Path) -> (String, String) {
    let conn = frozen_schema(path, 3);
    // Version 3 digested {"account":12345678901234567} as a double.
    let legacy = toolledger::model::digest_with(
        toolledger::model::DigestScheme::NearestDouble,
        "pay",
        1,
        r#"{"account":12345678901234567}"#,
        &Default::default(),
    )
    .unwrap();
    let committed = "o:round_0:c1:pay:v1".to_owned();
    let running = "o:round_0:c2:pay:v1".to_owned();
    conn.execute("INSERT INTO operations VALUES ('o', 'open', 1, 1)", [])
        .unwrap();
    for (id, status, session, lease, result) in [
        (&committed, "committed", None, None, Some(r#"{"paid":1}"#)),
        (
            &running,
            "executing",
            Some("deadbeef"),
            Some(9_999_999_999_999i64),
            None,
        ),
    ] {
        conn.execute(
            "INSERT INTO executions (execution_id, operation_id, round, position, provider,
                provider_call_id, tool_name, tool_version, args_digest, args_json,
                downstream_key, requires_approval, status, attempt_count, owner_session,
                lease_deadline_ms, result_json, created_ms, updated_ms, history)
             VALUES (?1, 'o', 0, 0, 'custom', 'c', 'pay', 1, ?2, ?3, ?4, 0, ?5, 1, ?6, ?7,
                ?8, 1, 2, '1|start||executing|1|s' || char(10))",
            rusqlite::params![
                id,
                legacy.digest.as_str(),
                legacy.json,
                toolledger::model::ExecutionId::parse(id.as_str())
                    .unwrap()
                    .downstream_key()
                    .as_str(),
                status,
                session,
                lease,
                result
            ],
        )
        .unwrap();
    }
    conn.execute(
        "INSERT INTO tombstones VALUES ('o:round_0:c3:pay:v1', ?1, 'result_delivered', 5)",
        [legacy.digest.as_str()],
    )
    .unwrap();
    (committed, running)
}

#[test]
fn a_call_stored_by_version_3_replays_when_the_parser_now_keeps_its_numbers() {
    // Version 3's parser read arguments through `serde_json::Value`, so the
    // stored arguments text of a call has its numbers rewritten. Today's
    // parser hands over the numbers as sent. The same model response must
    // still find its stored execution: a replay, not a second run.
    use toolledger::model::Provider;
    use toolledger::provider::{parse_tool_calls, ParseLimits};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.db");
    v3_database(&path);
    let sent =
        r#"{"amount": 1249.90, "n": -0, "big": 18446744073709551616, "p": 224.18827276432074}"#;
    let response = format!(
        r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","tool_calls":[{{"id":"c9","type":"function","function":{{"name":"pay","arguments":{}}}}}]}},"finish_reason":"tool_calls"}}]}}"#,
        serde_json::to_string(sent).unwrap()
    );
    // What version 3 stored, and what is parsed now.
    let then = serde_json::from_str::<serde_json::Value>(sent)
        .unwrap()
        .to_string();
    assert_eq!(
        then,
        r#"{"amount":1249.9,"big":1.8446744073709552e+19,"n":-0.0,"p":224.18827276432071}"#
    );
    let [now] = <[_; 1]>::try_from(
        parse_tool_calls(Provider::OpenAiChat, &response, 0, &ParseLimits::default()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        now.arguments,
        r#"{"amount":1249.90,"big":18446744073709551616,"n":-0,"p":224.18827276432074}"#
    );
    let legacy = toolledger::model::digest_with(
        toolledger::model::DigestScheme::NearestDouble,
        "pay",
        1,
        &then,
        &Default::default(),
    )
    .unwrap();
    let conn = Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO executions (execution_id, operation_id, round, position, provider,
            provider_call_id, tool_name, tool_version, args_digest, args_json,
            downstream_key, requires_approval, status, attempt_count, owner_session,
            lease_deadline_ms, result_json, created_ms, updated_ms, history)
         VALUES ('o:round_0:c9:pay:v1', 'o', 0, 0, 'openai_chat', 'c9', 'pay', 1, ?1, ?2,
            ?3, 0, 'committed', 1, NULL, NULL, '{\"paid\":1249.90}', 1, 2,
            '1|start||executing|1|s' || char(10))",
        rusqlite::params![
            legacy.digest.as_str(),
            then,
            toolledger::model::ExecutionId::parse("o:round_0:c9:pay:v1")
                .unwrap()
                .downstream_key()
                .as_str(),
        ],
    )
    .unwrap();
    drop(conn);
    let (ledger, _clock) = open_at(&path);
    let call = toolledger::ledger::CallSpec::new(now, 1);
    match ledger.begin(&op("o"), 0, &call).unwrap() {
        Begin::Replay(r) => assert_eq!(r.result_json, r#"{"paid":1249.90}"#),
        other => panic!("{other:?}"),
    }
    // Other arguments under the same id are still a conflict, never a replay.
    let mut other = call.clone();
    other.call.arguments = other.call.arguments.replace("1249.90", "1249.91");
    assert!(matches!(
        ledger.begin(&op("o"), 0, &other).unwrap(),
        Begin::Conflict { .. }
    ));
}

#[test]
fn a_version_3_ledger_migrates_in_place_and_keeps_what_it_promised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.db");
    let (committed, running) = v3_database(&path);
    let (ledger, _clock) = open_at(&path);
    let args = r#"{"account":12345678901234567}"#;
    let call = |id: &str| spec(id, "pay", args);
    // The digest version 3 stored still matches the same call: a replay.
    match ledger.begin(&op("o"), 0, &call("c1")).unwrap() {
        Begin::Replay(r) => assert_eq!(r.result_json, r#"{"paid":1}"#),
        other => panic!("{other:?}"),
    }
    // The executing row's wall-clock lease (far in the future) no longer
    // decides anything: its owner's lock is gone, so it is abandoned.
    match ledger.begin(&op("o"), 0, &call("c2")).unwrap() {
        Begin::Reconcile(t) => {
            assert_eq!(t.attempt, 1);
            assert!(t.unknown_since.is_some(), "its landing window starts now");
        }
        other => panic!("{other:?}"),
    }
    // The tombstone of version 3 answers under its own digest.
    assert!(matches!(
        ledger.begin(&op("o"), 0, &call("c3")).unwrap(),
        Begin::Failed { .. }
    ));
    // A record of version 3 compares as version 3 did (it cannot tell
    // digits beyond a double apart: documented in the migration) …
    let other_digits = r#"{"account":12345678901234568}"#;
    assert!(matches!(
        ledger
            .begin(&op("o"), 0, &spec("c1", "pay", other_digits))
            .unwrap(),
        Begin::Replay(_)
    ));
    // … while a new call is digested exactly: another account number under
    // the same call id is a conflict, never a replay.
    assert!(matches!(
        ledger.begin(&op("o"), 0, &call("c4")).unwrap(),
        Begin::Execute(_)
    ));
    assert!(matches!(
        ledger
            .begin(&op("o"), 0, &spec("c4", "pay", other_digits))
            .unwrap(),
        Begin::Conflict { .. }
    ));
    drop(ledger);
    // The migrated schema is the fresh one.
    let fresh = dir.path().join("fresh.db");
    drop(open_at(&fresh));
    let schema = |p: &std::path::Path| -> Vec<(String, String, Option<String>)> {
        let conn = Connection::open(p).unwrap();
        let mut stmt = conn
            .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    assert_eq!(schema(&path), schema(&fresh));
    let _ = running;
    let _ = committed;
}

#[test]
fn reopening_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (ledger, clock) = open_at(&path);
    let Begin::Execute(t) = ledger.begin(&op("o"), 0, &spec("c", "t", "{}")).unwrap() else {
        panic!()
    };
    ledger.commit(&t.attempt_id(), "[1]", None).unwrap();
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
        Err(Error::Store(StorageError::IncompatibleVersion {
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
        Err(Error::Store(StorageError::NotADatabase)) => {}
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
            Error::Store(StorageError::Corrupt) | Error::Store(StorageError::NotADatabase)
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
        Err(Error::Store(StorageError::CannotOpen))
    ));
}

/// A version 4 database as version 4 wrote it (its own migrations, frozen in
/// the repository), holding a delivered call and a committed one.
fn v4_database(path: &std::path::Path) -> (String, String) {
    let conn = frozen_schema(path, 4);
    let digest = toolledger::model::digest_arguments("pay", 1, "{}", &Default::default()).unwrap();
    conn.execute("INSERT INTO operations VALUES ('o', 'open', 1, 1)", [])
        .unwrap();
    let delivered = "o:round_0:c1:pay:v1".to_owned();
    let committed = "o:round_0:c2:pay:v1".to_owned();
    for (id, status, history) in [
        (
            &delivered,
            "result_delivered",
            "1|start||executing|1|s\n2|commit|executing|committed|1|s\n3|deliver|committed|result_delivered|1|s\n",
        ),
        (
            &committed,
            "committed",
            "1|start||executing|1|s\n2|commit|executing|committed|1|s\n",
        ),
    ] {
        conn.execute(
            "INSERT INTO executions (execution_id, operation_id, round, position, provider,
                provider_call_id, tool_name, tool_version, args_digest, args_json,
                downstream_key, requires_approval, status, attempt_count, owner_session,
                result_json, created_ms, updated_ms, history, digest_scheme)
             VALUES (?1, 'o', 0, 0, 'custom', 'c', 'pay', 1, ?2, '{}', ?3, 0, ?4, 1, 's',
                '{\"paid\":1}', 1, 3, ?5, 2)",
            rusqlite::params![
                id,
                digest.digest.as_str(),
                toolledger::model::ExecutionId::parse(id.as_str())
                    .unwrap()
                    .downstream_key()
                    .as_str(),
                status,
                history
            ],
        )
        .unwrap();
    }
    (delivered, committed)
}

#[test]
fn a_version_4_ledger_migrates_with_its_statuses_logs_and_guard() {
    use toolledger::model::{ExecutionId, ExecutionStatus};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.db");
    let (delivered, committed) = v4_database(&path);
    let (ledger, _clock) = open_at(&path);
    let delivered = ExecutionId::parse(delivered).unwrap();
    let committed = ExecutionId::parse(committed).unwrap();
    let status = |id: &ExecutionId| ledger.get(id).unwrap().unwrap().status;
    assert_eq!(status(&delivered), ExecutionStatus::ResultDelivered);
    assert_eq!(status(&committed), ExecutionStatus::Committed);
    assert_eq!(ledger.transitions(&delivered).unwrap().len(), 3);
    // The migrated ledger still delivers, through the new guard.
    ledger
        .mark_delivered(std::slice::from_ref(&committed))
        .unwrap();
    ledger.checkpoint().unwrap();
    assert_eq!(status(&committed), ExecutionStatus::ResultDelivered);
    let log = ledger.transitions(&committed).unwrap();
    assert_eq!(log.len(), 3);
    assert_eq!(log[2].to, ExecutionStatus::ResultDelivered);
    drop(ledger);

    let conn = Connection::open(&path).unwrap();
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, CURRENT_VERSION);
    // The guard came along, each refusal with its own message, and a refusal
    // takes its whole transaction with it.
    let refused = |sql: &str| -> String {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        conn.execute("UPDATE operations SET updated_ms = 99", [])
            .unwrap();
        let err = conn.execute(sql, [delivered.as_str()]).unwrap_err();
        if !conn.is_autocommit() {
            conn.execute_batch("ROLLBACK").unwrap();
        }
        let touched: i64 = conn
            .query_row(
                "SELECT count(*) FROM operations WHERE updated_ms = 99",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(touched, 0, "the refused transaction left a write behind");
        err.to_string()
    };
    assert_eq!(
        refused(
            "UPDATE executions SET status = 'committed', history = history || 'x'
             WHERE execution_id = ?1"
        ),
        "toolledger: a committed execution cannot be downgraded"
    );
    assert_eq!(
        refused(
            "UPDATE executions SET status = 'executing', history = history || 'x'
             WHERE execution_id = ?1"
        ),
        "toolledger: a committed execution cannot be downgraded"
    );
    assert_eq!(
        refused(
            "UPDATE executions SET result_json = '{}', history = history || 'x'
             WHERE execution_id = ?1"
        ),
        "toolledger: a committed result cannot be rewritten"
    );
    for rewrite in [
        "UPDATE executions SET history = 'x' WHERE execution_id = ?1",
        "UPDATE executions SET history = substr(history, 2) WHERE execution_id = ?1",
        "UPDATE executions SET history = substr(history, 1, length(history) - 1)
         WHERE execution_id = ?1",
        "UPDATE executions SET history = replace(history, 'deliver', 'delivex')
         WHERE execution_id = ?1",
        // A log never holds the bytes FF FF; the guard's prefix test relies
        // on it and refuses a log that grows by them.
        "UPDATE executions SET history = history || x'FFFF' WHERE execution_id = ?1",
    ] {
        assert_eq!(
            refused(rewrite),
            "toolledger: the transition log is append-only",
            "{rewrite}"
        );
    }
    // What the guard lets through: the log growing, on a delivered row too.
    conn.execute(
        "UPDATE executions SET history = history || '4|note|result_delivered|result_delivered|1|s' || char(10)
         WHERE execution_id = ?1",
        [delivered.as_str()],
    )
    .unwrap();
}

/// A database file in UTF-16 (made by another tool before the ledger
/// opened it) records a whole call: the guard's prefix test does not
/// depend on the file's text encoding (a one-byte bound would become empty
/// text there and refuse every update, the commit after the effect too).
#[test]
fn a_utf16_file_records_a_whole_call() {
    for encoding in ["UTF-16le", "UTF-16be"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u16.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch(&format!(
                "PRAGMA encoding='{encoding}'; CREATE TABLE x(a); DROP TABLE x;"
            ))
            .unwrap();
        let (ledger, _clock) = open_at(&path);
        let Begin::Execute(t) = ledger
            .begin(&op("op"), 0, &spec("c1", "pay", "{}"))
            .unwrap()
        else {
            panic!("not executed");
        };
        ledger.commit(&t.attempt_id(), r#"{"ok":1}"#, None).unwrap();
        ledger
            .mark_delivered(std::slice::from_ref(&t.execution_id))
            .unwrap();
        drop(ledger);
        let (again, _clock) = open_at(&path);
        let rec = again.get(&t.execution_id).unwrap().unwrap();
        assert_eq!(rec.status.as_str(), "result_delivered", "{encoding}");
        assert_eq!(
            rec.result_json.as_deref(),
            Some(r#"{"ok":1}"#),
            "{encoding}"
        );
        let used: String = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA encoding", [], |r| r.get(0))
            .unwrap();
        assert_eq!(used, encoding, "the file kept its encoding");
    }
}

/// A call stored by version 3 (a digest of numbers read as doubles) in a
/// ledger encrypted since: its digest was keyed by the encryption, and a
/// repeat of the call digests it the version 3 way under the keys of the
/// transaction that reads it. It replays (with the stored result), and
/// other arguments conflict.
#[test]
fn a_version_3_call_in_a_ledger_encrypted_since_replays() {
    use toolledger::ledger::LedgerKey;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.db");
    let (committed, _running) = v3_database(&path);
    let key = LedgerKey::generate().unwrap();
    Ledger::encrypt_in_place(&path, LedgerConfig::default(), &key).unwrap();
    let ledger = Ledger::open_encrypted(&path, LedgerConfig::default(), &key).unwrap();
    match ledger
        .begin(
            &op("o"),
            0,
            &spec("c1", "pay", r#"{"account":12345678901234567}"#),
        )
        .unwrap()
    {
        Begin::Replay(r) => {
            assert_eq!(r.execution_id.as_str(), committed);
            assert_eq!(r.result_json, r#"{"paid":1}"#);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    assert!(matches!(
        ledger
            .begin(&op("o"), 0, &spec("c1", "pay", r#"{"account":2}"#))
            .unwrap(),
        Begin::Conflict { .. }
    ));
}

//! Review r2: the ledger file itself, across schema versions and hostile
//! conditions — older files holding calls in every state, a migration
//! killed or out of space, foreign SQLite files, a directory or a dangling
//! symlink at the path, a `-wal` of another database, a `-shm` deleted
//! under a live ledger, lock files deleted under a live owner, a plain
//! session on a ledger encrypted after it opened, flipped bits.
//!
//! Tests named `defect_*` fail on the code they were written against
//! (each states what must hold); the others pass and stay as probes.

use std::path::{Path, PathBuf};

use rusqlite::Connection;
use support::*;
use toolledger::ledger::{Begin, Error, Ledger, LedgerConfig, StorageError};
use toolledger_test_support as support;

fn sha(path: &Path) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

fn tables(path: &Path) -> Vec<String> {
    let c = Connection::open(path).unwrap();
    let mut s = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    let names = s
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|x| x.unwrap())
        .collect();
    names
}

fn flag(db: &Path, name: &str) -> PathBuf {
    PathBuf::from(format!("{}.{name}", db.display()))
}

// ---------------------------------------------------------------------------
// Files of older schema versions holding a call in every state.
// ---------------------------------------------------------------------------
const FROZEN: [(i64, &str); 6] = [
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
    (5, include_str!("../../src/store/migrations/005_guard.sql")),
];

/// A new file with the schema of `version` as that version wrote it.
fn frozen(path: &Path, version: i64) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL;")
        .unwrap();
    for (_, sql) in FROZEN.iter().filter(|(v, _)| *v <= version) {
        conn.execute_batch(sql).unwrap();
    }
    conn.execute_batch(&format!("PRAGMA user_version = {version};"))
        .unwrap();
    conn
}

/// (call id, status, attempt, owner, retryable, result, requires approval)
type Row = (
    &'static str,
    &'static str,
    i64,
    Option<&'static str>,
    Option<i64>,
    Option<&'static str>,
    i64,
);

const STATES: [Row; 11] = [
    ("intent", "executing", 1, Some("deadbeef"), None, None, 0),
    (
        "committed",
        "committed",
        1,
        None,
        None,
        Some(r#"{"r":"committed"}"#),
        0,
    ),
    (
        "delivered",
        "result_delivered",
        1,
        None,
        None,
        Some(r#"{"r":"delivered"}"#),
        0,
    ),
    ("unknown", "outcome_unknown", 1, None, None, None, 0),
    ("pending", "prepared", 0, None, None, None, 1),
    ("approved", "approved", 0, None, None, None, 1),
    ("retry", "failed_before_commit", 1, None, Some(1), None, 0),
    ("failed", "failed_before_commit", 1, None, Some(0), None, 0),
    ("rejected", "rejected", 0, None, None, None, 1),
    ("job", "executing", 1, Some("deadbeef"), None, None, 0),
    ("batch", "executing", 1, Some("deadbeef"), None, None, 0),
];

fn exec_id(call: &str) -> String {
    format!("o:round_0:{call}:send:v1")
}

fn key_of(call: &str) -> String {
    toolledger::model::ExecutionId::parse(exec_id(call))
        .unwrap()
        .downstream_key()
        .as_str()
        .to_owned()
}

fn legacy_digest() -> String {
    toolledger::model::digest_with(
        toolledger::model::DigestScheme::NearestDouble,
        "send",
        1,
        "{}",
        &Default::default(),
    )
    .unwrap()
    .digest
    .as_str()
    .to_owned()
}

/// A file of schema `version` (1, 2 or 3) written as that version wrote
/// it, with one call in every state, a job, a batch with a committed item,
/// an approval, and (version 2 and 3) two tombstones.
fn old_file(path: &Path, version: i64) {
    let conn = frozen(path, version);
    let digest = legacy_digest();
    conn.execute("INSERT INTO operations VALUES ('o', 'open', 1, 1)", [])
        .unwrap();
    if version < 3 {
        conn.execute("INSERT INTO rounds VALUES ('o', 0, 1)", [])
            .unwrap();
    }
    for (i, (call, status, attempt, owner, retryable, result, approval)) in
        STATES.iter().enumerate()
    {
        let id = exec_id(call);
        let lease: Option<i64> = owner.map(|_| 9_999_999_999_999);
        let history = format!("1|start||{status}|{attempt}|s\n");
        if version < 3 {
            conn.execute(
                "INSERT INTO executions (execution_id, operation_id, round, position, provider,
                    provider_call_id, tool_name, tool_version, args_digest, args_json,
                    downstream_key, requires_approval, status, attempt_count, owner_session,
                    lease_deadline_ms, result_json, retryable, last_reason, created_ms, updated_ms)
                 VALUES (?1, 'o', 0, ?2, 'custom', ?3, 'send', 1, ?4, '{}', ?5, ?6, ?7, ?8, ?9,
                    ?10, ?11, ?12, ?13, 1, 2)",
                rusqlite::params![
                    id,
                    i as i64,
                    call,
                    digest,
                    key_of(call),
                    approval,
                    status,
                    attempt,
                    owner,
                    lease,
                    result,
                    retryable,
                    retryable.map(|_| "timeout")
                ],
            )
            .unwrap();
            let seq_sql = if version == 1 {
                "INSERT INTO transitions (execution_id, from_status, to_status, transition,
                    attempt, session_id, reason, at_ms) VALUES (?1, NULL, ?2, 'start', ?3, 's', NULL, 1)"
            } else {
                "INSERT INTO transitions (execution_id, seq, from_status, to_status, transition,
                    attempt, session_id, reason, at_ms) VALUES (?1, 1, NULL, ?2, 'start', ?3, 's', NULL, 1)"
            };
            conn.execute(seq_sql, rusqlite::params![id, status, attempt])
                .unwrap();
        } else {
            conn.execute(
                "INSERT INTO executions (execution_id, operation_id, round, position, provider,
                    provider_call_id, tool_name, tool_version, args_digest, args_json,
                    downstream_key, requires_approval, status, attempt_count, owner_session,
                    lease_deadline_ms, result_json, retryable, last_reason, created_ms, updated_ms,
                    needs_attention, history)
                 VALUES (?1, 'o', 0, ?2, 'custom', ?3, 'send', 1, ?4, '{}', ?5, ?6, ?7, ?8, ?9,
                    ?10, ?11, ?12, ?13, 1, 2,
                    CASE WHEN ?7 IN ('result_delivered','rejected','cancelled_before_commit') THEN NULL ELSE 1 END,
                    ?14)",
                rusqlite::params![id, i as i64, call, digest, key_of(call), approval, status,
                    attempt, owner, lease, result, retryable,
                    retryable.map(|_| "timeout"), history],
            ).unwrap();
        }
    }
    conn.execute(
        "INSERT INTO approvals VALUES (?1, ?2, 'approved', NULL, 1)",
        rusqlite::params![exec_id("approved"), digest],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO approvals VALUES (?1, ?2, 'rejected', NULL, 1)",
        rusqlite::params![exec_id("rejected"), digest],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO jobs VALUES (?1, 'job_1', 'running', 1)",
        [exec_id("job")],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO batch_items VALUES (?1, 0, ?2, '{\"item\":0}', NULL, 1)",
        rusqlite::params![exec_id("batch"), format!("{}#item_0", key_of("batch"))],
    )
    .unwrap();
    if version >= 2 {
        conn.execute(
            "INSERT INTO tombstones VALUES (?1, ?2, 'result_delivered', 5)",
            rusqlite::params![exec_id("pruned_ran"), digest],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO tombstones VALUES (?1, ?2, 'rejected', 5)",
            rusqlite::params![exec_id("pruned_rejected"), digest],
        )
        .unwrap();
    }
}

fn answer_kind(b: &Begin) -> String {
    match b {
        Begin::Execute(t) => format!("Execute(attempt {})", t.attempt),
        Begin::NeedsApproval(_) => "NeedsApproval".into(),
        Begin::Replay(r) => format!("Replay({})", r.result_json),
        Begin::Conflict { .. } => "Conflict".into(),
        Begin::InFlight { .. } => "InFlight".into(),
        Begin::Reconcile(t) => format!("Reconcile(attempt {})", t.attempt),
        Begin::Failed { .. } => "Failed".into(),
        Begin::Rejected { .. } => "Rejected".into(),
        Begin::Cancelled { .. } => "Cancelled".into(),
    }
}

fn classify(r: &Result<Begin, Error>) -> String {
    match r {
        Ok(b) => answer_kind(b),
        Err(Error::Store(StorageError::Sqlite(e))) => format!("UNTYPED Sqlite({e})"),
        Err(e) => format!("{e:?}").chars().take(60).collect(),
    }
}

// ===========================================================================
// Defects
// ===========================================================================

// ---------------------------------------------------------------------------
// 1. The `-shm` deleted under a live ledger: a second process builds a new
//    one, the two processes no longer share WAL locks or the WAL index.
// ---------------------------------------------------------------------------

/// Child: opens the ledger named by TOOLLEDGER_FR_DB, says "opened", waits
/// for "go", begins call c1 (running the tool and committing on Execute:
/// one line in the `.effects` file per effect) and writes its answer;
/// waits for "done".
#[test]
fn child_file_review_begin() {
    let Ok(db) = std::env::var("TOOLLEDGER_FR_DB") else {
        return;
    };
    let db = PathBuf::from(db);
    let (ledger, _clock) = open_at(&db);
    std::fs::write(flag(&db, "opened"), b"").unwrap();
    wait_until("go", || flag(&db, "go").exists());
    let tag = match ledger.begin(&op("o"), 0, &spec("c1", "send", "{}")) {
        Ok(Begin::Execute(t)) => {
            effect(&db, "child");
            let _ = ledger.commit(&t.attempt_id(), r#"{"by":"child"}"#, None);
            "EXECUTE".to_owned()
        }
        Ok(Begin::InFlight { .. }) => "INFLIGHT".to_owned(),
        Ok(other) => format!("OTHER {}", answer_kind(&other)),
        Err(e) => format!("ERR {e:?}"),
    };
    std::fs::write(flag(&db, "answer"), tag).unwrap();
    wait_until("done", || flag(&db, "done").exists());
}

/// The fake downstream: one line per effect.
fn effect(db: &Path, who: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(flag(db, "effects"))
        .unwrap();
    f.write_all(format!("{who}\n").as_bytes()).unwrap();
}

fn effects(db: &Path) -> usize {
    std::fs::read_to_string(flag(db, "effects"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn spawn_child(db: &Path) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "file_review::child_file_review_begin",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_FR_DB", db)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
#[ignore = "open: found by the twelfth session's review, not fixed yet (RELIABILITY.md, open findings)"]
fn defect_a_shm_deleted_under_a_live_ledger_lets_a_second_process_run_the_call_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (a, _clock) = open_at(&db);
    let t0 = ticket(a.begin(&op("o"), 0, &spec("c0", "send", "{}")).unwrap());
    a.commit(&t0.attempt_id(), r#"{"r":0}"#, None).unwrap();
    // Something deletes the -shm while the app has the ledger open (a
    // cleaner of "temporary" files, a backup restore, a user).
    std::fs::remove_file(dir.path().join("l.db-shm")).unwrap();
    // Another process of the app (an extension) opens the ledger.
    let mut child = spawn_child(&db);
    wait_until("child opened", || flag(&db, "opened").exists());
    // The app begins c1 and its tool runs.
    let Begin::Execute(t1) = a.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap() else {
        panic!("the first ask of c1 executes");
    };
    effect(&db, "parent");
    // The other process asks for the same call while the app runs it.
    std::fs::write(flag(&db, "go"), b"").unwrap();
    wait_until("child answer", || flag(&db, "answer").exists());
    let child_answer = std::fs::read_to_string(flag(&db, "answer")).unwrap();
    let parent_commit = a.commit(&t1.attempt_id(), r#"{"by":"parent"}"#, None);
    std::fs::write(flag(&db, "done"), b"").unwrap();
    assert!(child.wait().unwrap().success());
    drop(a);
    let (again, _clock) = open_at(&db);
    let c0 = again.begin(&op("o"), 0, &spec("c0", "send", "{}"));
    // What must hold: the call ran once, the other process was told it is
    // in flight, and the committed c0 is still there.
    assert_eq!(
        (child_answer.as_str(), effects(&db)),
        ("INFLIGHT", 1),
        "parent commit {:?}; c0 after reopening {}",
        parent_commit.map(|_| ()),
        classify(&c0)
    );
    assert_eq!(classify(&c0), r#"Replay({"r":0})"#);
}

// ---------------------------------------------------------------------------
// 2. A ledger created through a dangling symlink: its identity (sessions
//    directory, the `-wal` it watches) is the link's name, while SQLite
//    writes beside the target. The check that the `-wal` was not deleted
//    under the connection (RELIABILITY row 14) never fires.
// ---------------------------------------------------------------------------

/// Child: opens the ledger at TOOLLEDGER_FR_WALGONE (a path, maybe a
/// symlink), commits c0, checkpoints, deletes the `-wal` SQLite writes (what
/// another SQLite library in the process does when it closes the file),
/// runs c1 to its commit, writes what the commit answered, and dies.
#[test]
fn child_file_review_wal_gone() {
    let Ok(db) = std::env::var("TOOLLEDGER_FR_WALGONE") else {
        return;
    };
    let wal = std::env::var("TOOLLEDGER_FR_WALFILE").unwrap();
    let out = std::env::var("TOOLLEDGER_FR_OUT").unwrap();
    let (ledger, _clock) = open_at(Path::new(&db));
    let t0 = ticket(
        ledger
            .begin(&op("o"), 0, &spec("c0", "send", "{}"))
            .unwrap(),
    );
    ledger.commit(&t0.attempt_id(), r#"{"r":0}"#, None).unwrap();
    ledger.checkpoint().unwrap();
    std::fs::remove_file(&wal).unwrap();
    let answer = match ledger.begin(&op("o"), 0, &spec("c1", "send", "{}")) {
        Ok(Begin::Execute(t)) => match ledger.commit(&t.attempt_id(), r#"{"r":1}"#, None) {
            Ok(_) => "COMMITTED".to_owned(),
            Err(e) => format!("COMMIT-ERR {e:?}"),
        },
        Ok(other) => format!("BEGIN {}", answer_kind(&other)),
        Err(e) => format!("BEGIN-ERR {e:?}"),
    };
    std::fs::write(&out, answer).unwrap();
    std::process::abort();
}

fn run_wal_gone(open_path: &Path, wal: &Path, out: &Path) -> String {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "file_review::child_file_review_wal_gone",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_FR_WALGONE", open_path)
        .env("TOOLLEDGER_FR_WALFILE", wal)
        .env("TOOLLEDGER_FR_OUT", out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child dies");
    std::fs::read_to_string(out).unwrap()
}

/// The same steps through the file's own name: the commit to the deleted
/// WAL is noticed and c1 is never lost (passes).
#[test]
fn a_wal_deleted_under_a_ledger_opened_by_its_name_loses_no_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    let answer = run_wal_gone(
        &real,
        &dir.path().join("real.db-wal"),
        &dir.path().join("out"),
    );
    let (again, _clock) = open_at(&real);
    let c1 = classify(&again.begin(&op("o"), 0, &spec("c1", "send", "{}")));
    assert!(
        c1 == r#"Replay({"r":1})"# || !answer.starts_with("COMMITTED"),
        "child: {answer}; c1 after the restart: {c1}"
    );
}

#[test]
fn defect_a_ledger_created_through_a_dangling_symlink_loses_an_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let answer = run_wal_gone(
        &link,
        &dir.path().join("real.db-wal"),
        &dir.path().join("out"),
    );
    let (again, _clock) = open_at(&real);
    let c1 = classify(&again.begin(&op("o"), 0, &spec("c1", "send", "{}")));
    // What must hold (as through the file's name): a commit that answered
    // Ok is never lost; a repeat of c1 replays instead of running again.
    assert!(
        c1 == r#"Replay({"r":1})"# || !answer.starts_with("COMMITTED"),
        "child: {answer}; c1 after the restart: {c1} (a second effect)"
    );
}

#[test]
fn defect_a_dangling_symlink_is_not_resolved_to_the_file_sqlite_writes() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let first = Ledger::open(&link, LedgerConfig::default()).unwrap();
    drop(first);
    // SQLite created real.db, real.db-wal: the ledger's own files (its
    // sessions directory) must sit beside the same name, as they do when
    // the link is opened again now that its target exists.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n == "link.db-sessions"),
        "files: {names:?}"
    );
}

// ---------------------------------------------------------------------------
// 3. A `-wal` of another database beside the ledger (a restored or copied
//    main file next to the -wal of a killed app, or two ledgers' files
//    mixed up): SQLite applies it, and the ledger answers from the other
//    database without a word.
// ---------------------------------------------------------------------------

#[test]
fn defect_a_wal_of_another_ledger_replaces_this_ledgers_records_silently() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b.db");
    {
        let (l, _c) = open_at(&b);
        for i in 1..=3 {
            let t = ticket(
                l.begin(&op("o"), 0, &spec(&format!("b{i}"), "send", "{}"))
                    .unwrap(),
            );
            l.commit(&t.attempt_id(), &format!(r#"{{"b":{i}}}"#), None)
                .unwrap();
        }
    }
    let a = dir.path().join("a.db");
    {
        let (l, _c) = open_at(&a);
        for i in 1..=3 {
            let t = ticket(
                l.begin(&op("o"), 0, &spec(&format!("a{i}"), "send", "{}"))
                    .unwrap(),
            );
            l.commit(&t.attempt_id(), &format!(r#"{{"a":{i}}}"#), None)
                .unwrap();
        }
        std::mem::forget(l); // killed: its commits are in its -wal
    }
    let b_before = sha(&b);
    std::fs::copy(dir.path().join("a.db-wal"), dir.path().join("b.db-wal")).unwrap();
    // What must hold: either the foreign -wal is refused with a typed error
    // (b.db untouched), or b's committed calls still replay.
    match Ledger::open(&b, LedgerConfig::default()) {
        Err(e) => assert_eq!(sha(&b), b_before, "refused ({e:?}) but b.db was changed"),
        Ok(l) => {
            let answers: Vec<String> = ["b1", "b2", "b3"]
                .iter()
                .map(|c| classify(&l.begin(&op("o"), 0, &spec(c, "send", "{}"))))
                .collect();
            assert_eq!(
                answers,
                [
                    r#"Replay({"b":1})"#,
                    r#"Replay({"b":2})"#,
                    r#"Replay({"b":3})"#
                ],
                "b's committed calls are asked for again"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// 4. An SQLite file that is not a ledger (the app's own database, a wrong
//    path) is adopted or half-migrated instead of refused untouched.
// ---------------------------------------------------------------------------

#[test]
fn defect_an_apps_own_sqlite_database_is_adopted_as_a_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let c = Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE contacts(name TEXT); INSERT INTO contacts VALUES ('ann');")
            .unwrap();
    }
    let before = sha(&path);
    let opened = Ledger::open(&path, LedgerConfig::default());
    let ok = opened.is_ok();
    drop(opened);
    // What must hold: refused with a typed error, the file byte for byte
    // as it was (as for a newer ledger or a file that is not a database).
    assert!(
        !ok && sha(&path) == before,
        "opened: {ok}; tables now {:?}",
        tables(&path)
    );
}

#[test]
fn defect_an_sqlite_file_with_its_own_user_version_gets_an_untyped_error_and_is_modified() {
    let mut wrong = Vec::new();
    for (name, setup) in [
        (
            "conflict",
            "CREATE TABLE operations(x); INSERT INTO operations VALUES (1);",
        ),
        (
            "version3",
            "CREATE TABLE notes(x); PRAGMA user_version = 3;",
        ),
        (
            "version5",
            "CREATE TABLE notes(x); PRAGMA user_version = 5;",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch(setup)
            .unwrap();
        let before = sha(&path);
        let outcome = match Ledger::open(&path, LedgerConfig::default()) {
            Err(e) => format!("open: {}", classify(&Err(e))),
            Ok(l) => format!(
                "opened; begin: {}",
                classify(&l.begin(&op("o"), 0, &spec("c", "send", "{}")))
            ),
        };
        // What must hold: a typed refusal at open, nothing written.
        if !(outcome.starts_with("open: ") && !outcome.contains("UNTYPED") && sha(&path) == before)
        {
            let short: String = outcome.chars().take(90).collect();
            wrong.push(format!(
                "{name}: {short}; file changed: {}",
                sha(&path) != before
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// ---------------------------------------------------------------------------
// 5. A directory at the ledger's path is reported as a file with two hard
//    links.
// ---------------------------------------------------------------------------

#[test]
fn defect_a_directory_at_the_path_is_reported_as_a_hard_linked_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    std::fs::create_dir(&path).unwrap();
    let err = Ledger::open(&path, LedgerConfig::default()).unwrap_err();
    assert!(
        matches!(err, Error::Store(StorageError::CannotOpen)),
        "{err:?}: {err}"
    );
}

// ---------------------------------------------------------------------------
// 6. The sessions directory (or a lock file) deleted under a live owner: the
//    owner still holds its lock, on a file nobody can find. The next
//    session judges it dead, takes its running call over, and deletes its
//    row, so every later call of the live session is judged dead too.
// ---------------------------------------------------------------------------

#[test]
fn defect_a_live_owner_whose_lock_file_was_deleted_is_judged_dead() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (a, clock) = open_at(&db);
    let t = ticket(a.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap());
    std::fs::remove_dir_all(dir.path().join("l.db-sessions")).unwrap();
    let b = open_with(&db, &clock);
    let answer = classify(&b.begin(&op("o"), 0, &spec("c1", "send", "{}")));
    let row: i64 = Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM sessions WHERE session_id = ?1",
            [a.session_id().as_str()],
            |r| r.get(0),
        )
        .unwrap();
    a.commit(&t.attempt_id(), r#"{"r":1}"#, None).unwrap();
    // What must hold: A is running c1 (it holds its lock): InFlight, and
    // A's session row stays.
    assert_eq!(
        (answer.as_str(), row),
        ("InFlight", 1),
        "the live owner's call was handed to another session to reconcile"
    );
}

// ---------------------------------------------------------------------------
// 7. A plain session that opened an empty file just before an encrypted one
//    made it an encrypted ledger: every read says the values were altered.
// ---------------------------------------------------------------------------

#[test]
fn defect_a_plain_session_on_a_ledger_encrypted_after_it_opened_reports_tampering() {
    use toolledger::ledger::LedgerKey;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let plain = Ledger::open(&db, LedgerConfig::default()).unwrap();
    let key = LedgerKey::generate().unwrap();
    let keyed = Ledger::open_encrypted(&db, LedgerConfig::default(), &key).unwrap();
    let t = ticket(keyed.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap());
    keyed.commit(&t.attempt_id(), r#"{"r":1}"#, None).unwrap();
    let answers = [
        classify(&plain.begin(&op("o"), 0, &spec("c1", "send", "{}"))),
        classify(&plain.begin(&op("o"), 0, &spec("c2", "send", "{}"))),
        format!(
            "{:?}",
            plain
                .list(&op("o"))
                .map(|v| v.len())
                .map_err(|e| format!("{e:?}"))
        ),
        format!(
            "{:?}",
            plain
                .recover()
                .map(|v| v.len())
                .map_err(|e| format!("{e:?}"))
        ),
    ];
    // What must hold: the plain session is told the ledger is encrypted
    // (KeyRequired, as a new open without the key is), not that its
    // values were altered (Undecryptable), nor a schema guard's refusal.
    for a in &answers {
        assert!(a.contains("KeyRequired"), "{answers:?}");
    }
}

// ===========================================================================
// Probes that pass
// ===========================================================================

/// The answer each state of an old file must get from a repeat of its call.
fn expected(call: &str, version: i64) -> &'static str {
    match call {
        "intent" | "unknown" | "job" | "batch" => "Reconcile(attempt 1)",
        "committed" => r#"Replay({"r":"committed"})"#,
        "delivered" => r#"Replay({"r":"delivered"})"#,
        "pending" => "NeedsApproval",
        "approved" => "Execute(attempt 1)",
        "retry" => "Execute(attempt 2)",
        "failed" => "Failed",
        "rejected" => "Rejected",
        "pruned_ran" if version >= 2 => "Failed",
        "pruned_rejected" if version >= 2 => "Rejected",
        _ => "Execute(attempt 1)", // version 1 had no tombstones
    }
}

fn calls() -> Vec<&'static str> {
    let mut calls: Vec<&str> = STATES.iter().map(|s| s.0).collect();
    calls.extend(["pruned_ran", "pruned_rejected"]);
    calls
}

#[test]
fn files_of_versions_1_to_3_answer_every_state_as_they_stored_it() {
    for version in [1, 2, 3] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        old_file(&path, version);
        let (ledger, _clock) = open_at(&path);
        for call in calls() {
            let got = classify(&ledger.begin(&op("o"), 0, &spec(call, "send", "{}")));
            assert_eq!(got, expected(call, version), "v{version} {call}");
        }
        // The in-flight ones are not handed out again.
        for call in ["intent", "job", "batch", "unknown"] {
            let got = classify(&ledger.begin(&op("o"), 0, &spec(call, "send", "{}")));
            assert_eq!(got, "Reconcile(attempt 1)", "v{version} {call} asked again");
        }
        let log = ledger
            .transitions(&toolledger::model::ExecutionId::parse(exec_id("committed")).unwrap())
            .unwrap();
        assert!(!log.is_empty(), "v{version}: the log came along");
    }
}

/// A version 2 file with `n` extra committed calls (its migration takes
/// about half a second in a debug build) on top of the every-state rows.
fn big_v2(path: &Path, n: i64) {
    old_file(path, 2);
    let conn = Connection::open(path).unwrap();
    let digest = legacy_digest();
    conn.execute(
        "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?1)
         INSERT INTO executions (execution_id, operation_id, round, position, provider,
            provider_call_id, tool_name, tool_version, args_digest, args_json,
            downstream_key, requires_approval, status, attempt_count, result_json,
            created_ms, updated_ms)
         SELECT 'o:round_0:bulk' || i || ':send:v1', 'o', 0, 100 + i, 'custom', 'bulk' || i,
            'send', 1, ?2, '{}', 'tl_' || printf('%048d', i), 0, 'committed', 1,
            '{\"bulk\":' || i || '}', 1, 2 FROM k",
        rusqlite::params![n, digest],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO transitions (execution_id, seq, from_status, to_status, transition,
            attempt, session_id, reason, at_ms)
         SELECT execution_id, 1, NULL, 'executing', 'start', 1, 's', NULL, 1 FROM executions
         WHERE execution_id LIKE 'o:round_0:bulk%'
         UNION ALL
         SELECT execution_id, 2, 'executing', 'committed', 'commit', 1, 's', 'r|x%y', 2
         FROM executions WHERE execution_id LIKE 'o:round_0:bulk%'",
        [],
    )
    .unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
}

#[test]
fn child_file_review_migrate() {
    let Ok(db) = std::env::var("TOOLLEDGER_FR_MIGRATE") else {
        return;
    };
    let _ = Ledger::open(Path::new(&db), LedgerConfig::default());
}

#[test]
fn a_migration_killed_at_any_moment_leaves_the_old_version_whole() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v2.db");
    big_v2(&db, 40_000);
    let mut killed = 0;
    for delay_ms in [5u64, 20, 50, 100, 200, 300, 400, 3000] {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "file_review::child_file_review_migrate",
                "--test-threads=1",
            ])
            .env("TOOLLEDGER_FR_MIGRATE", &db)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill();
        if !child.wait().unwrap().success() {
            killed += 1;
        }
        let v: i64 = Connection::open(&db)
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert!(v == 2 || v == 5, "version {v}");
        if v == 5 {
            break;
        }
    }
    assert!(killed > 0, "no child was killed mid-migration");
    let (l, _c) = open_at(&db);
    for call in calls() {
        let got = classify(&l.begin(&op("o"), 0, &spec(call, "send", "{}")));
        assert_eq!(got, expected(call, 2), "{call}");
    }
    assert_eq!(
        classify(&l.begin(&op("o"), 0, &spec("bulk39999", "send", "{}"))),
        r#"Replay({"bulk":39999})"#
    );
    let n: i64 = Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM executions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 40_011);
}

#[test]
fn a_disk_that_fills_during_a_migration_refuses_typed_and_migrates_later() {
    let src = tempfile::tempdir().unwrap();
    let orig = src.path().join("v2.db");
    big_v2(&orig, 20_000);
    let len = std::fs::metadata(&orig).unwrap().len();
    let mnt = tempfile::tempdir().unwrap();
    let size_kb = len / 1024 + 256;
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size_kb}k"), "tmpfs"])
        .arg(mnt.path())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        println!("SKIPPED: cannot mount a tmpfs");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _unmount = Unmount(mnt.path().to_path_buf());
    let db = mnt.path().join("v2.db");
    std::fs::copy(&orig, &db).unwrap();
    let before = sha(&db);
    let err = Ledger::open(&db, LedgerConfig::default()).unwrap_err();
    assert!(
        matches!(err, Error::Store(StorageError::DiskFull)),
        "{err:?}"
    );
    assert_eq!(sha(&db), before);
    assert!(std::process::Command::new("mount")
        .args(["-o", &format!("remount,size={}k", size_kb * 4)])
        .arg(mnt.path())
        .status()
        .unwrap()
        .success());
    let (l, _c) = open_at(&db);
    for call in calls() {
        let got = classify(&l.begin(&op("o"), 0, &spec(call, "send", "{}")));
        assert_eq!(got, expected(call, 2), "{call}");
    }
}

#[test]
fn a_newer_file_left_with_a_wal_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    {
        let (a, _c) = open_at(&db);
        let t = ticket(a.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap());
        a.commit(&t.attempt_id(), "{}", None).unwrap();
        std::mem::forget(a);
    }
    let c = Connection::open(&db).unwrap();
    c.execute_batch("PRAGMA user_version = 6;").unwrap();
    std::mem::forget(c);
    let wal = dir.path().join("l.db-wal");
    let (before, wal_before) = (sha(&db), sha(&wal));
    let err = Ledger::open(&db, LedgerConfig::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store(StorageError::IncompatibleVersion { found: 6, .. })
        ),
        "{err:?}"
    );
    assert_eq!((sha(&db), sha(&wal)), (before, wal_before));
}

#[test]
fn the_directory_deleted_or_renamed_under_a_live_ledger_refuses_typed_and_loses_nothing() {
    let top = tempfile::tempdir().unwrap();
    let dir = top.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let db = dir.join("l.db");
    let (a, clock) = open_at(&db);
    let t0 = ticket(a.begin(&op("o"), 0, &spec("c0", "send", "{}")).unwrap());
    a.commit(&t0.attempt_id(), "{}", None).unwrap();
    let t1 = ticket(a.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap());
    std::fs::rename(&dir, top.path().join("moved")).unwrap();
    let commit = a.commit(&t1.attempt_id(), r#"{"r":1}"#, None);
    assert!(
        matches!(commit, Err(Error::Store(StorageError::CannotOpen))),
        "{commit:?}"
    );
    let begin = a.begin(&op("o"), 0, &spec("c2", "send", "{}"));
    assert!(
        matches!(begin, Err(Error::Store(StorageError::CannotOpen))),
        "{begin:?}"
    );
    std::fs::create_dir(&dir).unwrap();
    let begin = a.begin(&op("o"), 0, &spec("c3", "send", "{}"));
    assert!(
        matches!(begin, Err(Error::Store(StorageError::CannotOpen))),
        "{begin:?}"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing created at the old path"
    );
    drop(a);
    let m = open_with(&top.path().join("moved/l.db"), &clock);
    assert_eq!(
        classify(&m.begin(&op("o"), 0, &spec("c0", "send", "{}"))),
        "Replay({})"
    );
    assert_eq!(
        classify(&m.begin(&op("o"), 0, &spec("c1", "send", "{}"))),
        "Reconcile(attempt 1)"
    );
}

#[test]
fn flipped_bits_in_the_file_never_panic() {
    let src = tempfile::tempdir().unwrap();
    let db = src.path().join("l.db");
    {
        let (a, _c) = open_at(&db);
        for i in 0..6 {
            let t = ticket(
                a.begin(&op("o"), 0, &spec(&format!("c{i}"), "send", "{}"))
                    .unwrap(),
            );
            a.commit(&t.attempt_id(), &format!(r#"{{"r":{i}}}"#), None)
                .unwrap();
        }
    }
    let bytes = std::fs::read(&db).unwrap();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..200 {
        let off = (rnd() as usize) % bytes.len();
        let bit = (rnd() % 8) as u8;
        let mut b = bytes.clone();
        b[off] ^= 1 << bit;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("l.db");
        std::fs::write(&p, &b).unwrap();
        let ran = std::panic::catch_unwind(|| {
            let clock = std::sync::Arc::new(toolledger::ledger::ManualClock::new(1_000_000));
            if let Ok(l) = Ledger::open_with_clock(&p, LedgerConfig::default(), clock) {
                let _ = l.begin(&op("o"), 0, &spec("c3", "send", "{}"));
                let _ = l.begin(&op("o"), 0, &spec("c9", "send", "{}"));
            }
        });
        assert!(ran.is_ok(), "a flip of bit {bit} at {off} panicked");
    }
}

// ---------------------------------------------------------------------------
// 8. The database file replaced (renamed over) under a live ledger: the
//    ledger checks that its -wal is the one it opened, never that its
//    database file is; it goes on writing, and its -wal is applied to the
//    file now at the path.
// ---------------------------------------------------------------------------

#[test]
#[ignore = "open: found by the twelfth session's review, not fixed yet (RELIABILITY.md, open findings)"]
fn defect_the_database_file_replaced_under_a_live_ledger_is_not_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let other = dir.path().join("other.db");
    {
        let (o, _c) = open_at(&other);
        let t = ticket(o.begin(&op("o"), 0, &spec("x1", "send", "{}")).unwrap());
        o.commit(&t.attempt_id(), r#"{"x":1}"#, None).unwrap();
    }
    let (a, clock) = open_at(&db);
    let t0 = ticket(a.begin(&op("o"), 0, &spec("c0", "send", "{}")).unwrap());
    a.commit(&t0.attempt_id(), r#"{"r":0}"#, None).unwrap();
    // A restore puts another ledger's file at the path while the app runs.
    std::fs::rename(&other, &db).unwrap();
    let a_after = classify(&a.begin(&op("o"), 0, &spec("c1", "send", "{}")));
    // A session opened now reads the file at the path.
    let b = Ledger::open_with_clock(&db, LedgerConfig::default(), clock.clone()).unwrap();
    let x1 = classify(&b.begin(&op("o"), 0, &spec("x1", "send", "{}")));
    // What must hold: the live ledger refuses to write once its file was
    // replaced (typed, as `DatabaseReplaced` after a suspension), and the
    // file at the path answers its own records: x1 replays.
    assert!(
        a_after.contains("DatabaseReplaced") && x1 == r#"Replay({"x":1})"#,
        "the live ledger after the replacement: {a_after}; x1 in the file at the path: {x1}"
    );
}

// ---------------------------------------------------------------------------
// 9. A file cut short (a lost tail page): a damaged record is reported as
//    a raw SQLite conversion error, not as `Corrupt`.
// ---------------------------------------------------------------------------

#[test]
fn defect_a_truncated_file_reports_a_damaged_record_as_an_untyped_error() {
    let src = tempfile::tempdir().unwrap();
    let db = src.path().join("l.db");
    let pad = format!(r#"{{"pad":"{}"}}"#, "x".repeat(300));
    {
        let (a, _c) = open_at(&db);
        for i in 0..40 {
            let t = ticket(
                a.begin(&op("o"), 0, &spec(&format!("c{i}"), "send", &pad))
                    .unwrap(),
            );
            a.commit(&t.attempt_id(), &format!(r#"{{"r":{i}}}"#), None)
                .unwrap();
        }
    }
    let bytes = std::fs::read(&db).unwrap();
    let mut untyped = Vec::new();
    for cut in (1024..bytes.len()).step_by(1024) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("l.db");
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let clock = std::sync::Arc::new(toolledger::ledger::ManualClock::new(1_000_000));
        if let Ok(l) = Ledger::open_with_clock(&p, LedgerConfig::default(), clock) {
            for c in ["c5", "c39"] {
                let got = classify(&l.begin(&op("o"), 0, &spec(c, "send", &pad)));
                if got.contains("UNTYPED") {
                    untyped.push(format!("cut {cut}, {c}: {got}"));
                }
            }
            if let Err(Error::Store(StorageError::Sqlite(e))) = l.recover() {
                untyped.push(format!("cut {cut}, recover: {e}"));
            }
        }
    }
    // What must hold: a damaged file gives `Corrupt` (or `NotADatabase`).
    assert!(untyped.is_empty(), "{untyped:#?}");
}

/// Row 6 with the effects counted: a lookup tool of the live owner, slow
/// to send; the other session follows the executor's rules for a lookup
/// tool (look up, wait out the 120 s landing window, look up again, resend).
#[test]
fn defect_a_live_owner_whose_lock_file_was_deleted_sends_after_another_session_resent() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use toolledger::ledger::{Resolution, Resolved};
    let effects: Mutex<HashMap<String, u32>> = Mutex::new(HashMap::new());
    let send = |k: &str| *effects.lock().unwrap().entry(k.to_owned()).or_default() += 1;
    let found = |k: &str| effects.lock().unwrap().contains_key(k);
    for delete_lock in [false, true] {
        effects.lock().unwrap().clear();
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let (app, clock) = open_at(&db);
        let other = open_with(&db, &clock);
        let s = spec("c1", "pay", r#"{"amount":"12.50"}"#);
        let t = ticket(app.begin(&op("o"), 0, &s).unwrap());
        let key = t.downstream_key.as_str().to_owned();
        if delete_lock {
            std::fs::remove_dir_all(dir.path().join("l.db-sessions")).unwrap();
        }
        // The other session is asked for the same call (the app's tool is
        // slow: it has not sent yet).
        if let Begin::Reconcile(r) = other.begin(&op("o"), 0, &s).unwrap() {
            assert!(!found(&key));
            clock.advance(120_000);
            if !found(&key) {
                if let Resolved::Retry(t2) = other
                    .resolve_unknown(&r.attempt_id(), Resolution::NotFoundRetry)
                    .unwrap()
                {
                    send(&key);
                    other
                        .commit(&t2.attempt_id(), r#"{"paid":2}"#, None)
                        .unwrap();
                }
            }
        }
        // The live owner's tool sends now, and reports.
        send(&key);
        let _ = app.commit(&t.attempt_id(), r#"{"paid":1}"#, None);
        let n = effects.lock().unwrap().get(&key).copied().unwrap_or(0);
        // What must hold, lock file deleted or not: one payment.
        assert_eq!(n, 1, "lock file deleted: {delete_lock}");
    }
}

// ---------------------------------------------------------------------------
// 10. The -wal deleted (by a cleaner, not after another SQLite's full
//     checkpoint) under a live ledger whose last commits are only in it:
//     the ledger reconnects while its old connection (which still has the
//     deleted -wal open, every commit in it) is open, and from then on
//     answers every call, replays included, with a disk I/O error; killed
//     in that state, its acknowledged commits are gone.
// ---------------------------------------------------------------------------

/// Child: commits c0 (not checkpointed), the -wal is deleted, asks for c0
/// again and for c1, writes the answers, and dies.
#[test]
fn child_file_review_wal_rm() {
    let Ok(db) = std::env::var("TOOLLEDGER_FR_WALRM") else {
        return;
    };
    let out = std::env::var("TOOLLEDGER_FR_OUT").unwrap();
    let db = PathBuf::from(db);
    let (ledger, _clock) = open_at(&db);
    let t0 = ticket(
        ledger
            .begin(&op("o"), 0, &spec("c0", "send", "{}"))
            .unwrap(),
    );
    ledger.commit(&t0.attempt_id(), r#"{"r":0}"#, None).unwrap();
    std::fs::remove_file(PathBuf::from(format!("{}-wal", db.display()))).unwrap();
    let again = classify(&ledger.begin(&op("o"), 0, &spec("c0", "send", "{}")));
    let new = classify(&ledger.begin(&op("o"), 0, &spec("c1", "send", "{}")));
    std::fs::write(&out, format!("c0 again: {again}; c1: {new}")).unwrap();
    std::process::abort();
}

#[test]
#[ignore = "open: found by the twelfth session's review, not fixed yet (RELIABILITY.md, open findings)"]
fn defect_a_wal_deleted_under_a_live_ledger_wedges_it_and_a_kill_then_loses_its_commits() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let out = dir.path().join("out");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "file_review::child_file_review_wal_rm",
            "--test-threads=1",
        ])
        .env("TOOLLEDGER_FR_WALRM", &db)
        .env("TOOLLEDGER_FR_OUT", &out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success());
    let live = std::fs::read_to_string(&out).unwrap();
    let (again, _clock) = open_at(&db);
    let c0 = classify(&again.begin(&op("o"), 0, &spec("c0", "send", "{}")));
    // What must hold: the live ledger still answers from what it committed
    // (its connection has the deleted -wal open: a checkpoint through it
    // before reconnecting keeps every commit), and the committed c0 is
    // never asked for again after a kill.
    assert!(
        live.starts_with(r#"c0 again: Replay({"r":0})"#) && c0 == r#"Replay({"r":0})"#,
        "while live: {live}; after the kill, c0: {c0}"
    );
}

/// Retention on a file another session writes: a delivery mark queued in
/// one session for a call another session delivered and pruned meanwhile
/// costs the first session nothing (its next write goes through), and the
/// pruned call is answered from its tombstone.
#[test]
fn a_mark_queued_for_a_call_another_session_pruned_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    let (a, clock) = open_at(&db);
    let b = open_with(&db, &clock);
    let t = ticket(b.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap());
    b.commit(&t.attempt_id(), r#"{"r":1}"#, None).unwrap();
    b.mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap(); // queued in b
    a.mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    let _ = ticket(a.begin(&op("o"), 0, &spec("cx", "send", "{}")).unwrap());
    clock.advance(10_000_000);
    let report = a.prune(std::time::Duration::from_secs(1), true).unwrap();
    assert_eq!(report.executions, 1);
    assert_eq!(
        classify(&b.begin(&op("o"), 0, &spec("c2", "send", "{}"))),
        "Execute(attempt 1)"
    );
    assert_eq!(
        classify(&b.begin(&op("o"), 0, &spec("c1", "send", "{}"))),
        "Failed"
    );
}

// ---------------------------------------------------------------------------
// 11. A FIFO at a lock file's path (named like a session's lock file in the
//     sessions directory): the probe and the cleaner open it for writing
//     without O_NONBLOCK, inside the open's write transaction, and wait for
//     a reader forever.
// ---------------------------------------------------------------------------

#[test]
fn defect_a_fifo_in_the_sessions_directory_hangs_every_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    drop(open_at(&db));
    let fifo = dir
        .path()
        .join("l.db-sessions/0123456789abcdef0123456789abcdef.lock");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let (tx, rx) = std::sync::mpsc::channel();
    let path = db.clone();
    std::thread::spawn(move || {
        let opened = Ledger::open(&path, LedgerConfig::default())
            .map(|_| ())
            .map_err(|e| format!("{e:?}"));
        let _ = tx.send(opened);
    });
    let within = rx.recv_timeout(std::time::Duration::from_secs(5));
    if within.is_err() {
        // Bound the test: a reader held open lets every writer's open
        // through (O_NONBLOCK: 0o4000 on Linux).
        use std::os::unix::fs::OpenOptionsExt;
        let _reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(0o4000)
            .open(&fifo);
        let _ = rx.recv_timeout(std::time::Duration::from_secs(5));
    }
    // What must hold: the open answers (opened, or a typed error) at once.
    assert!(within.is_ok(), "Ledger::open still waiting after 5 s");
}

/// A file of version 1 or 2 encrypted in place on the upgrade (the app
/// turns encryption on with the new build): every state answers as stored,
/// under the key.
#[test]
fn an_old_file_encrypted_in_place_answers_every_state_under_its_key() {
    use toolledger::ledger::LedgerKey;
    for version in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        old_file(&path, version);
        let key = LedgerKey::generate().unwrap();
        let refused = Ledger::open_encrypted(&path, LedgerConfig::default(), &key);
        assert!(
            matches!(refused, Err(Error::Store(StorageError::NotEncrypted))),
            "{:?}",
            refused.err()
        );
        Ledger::encrypt_in_place(&path, LedgerConfig::default(), &key).unwrap();
        let ledger = Ledger::open_encrypted(&path, LedgerConfig::default(), &key).unwrap();
        for call in calls() {
            let got = classify(&ledger.begin(&op("o"), 0, &spec(call, "send", "{}")));
            assert_eq!(got, expected(call, version), "v{version} {call}");
        }
        assert!(!std::fs::read(&path)
            .unwrap()
            .windows(13)
            .any(|w| w == br#"{"r":"commit"#));
    }
}

/// The disk fills at every point of a migration (tmpfs sizes from just
/// above the file to well above what the migration needs): each open either
/// refuses with `DiskFull`, the file untouched at version 2, or migrates it
/// whole; after the space returns every state answers as stored.
#[test]
fn a_disk_that_fills_at_any_point_of_a_migration_never_leaves_it_half_done() {
    let src = tempfile::tempdir().unwrap();
    let orig = src.path().join("v2.db");
    big_v2(&orig, 5_000);
    let len_kb = std::fs::metadata(&orig).unwrap().len() / 1024;
    let mut outcomes = Vec::new();
    for extra_kb in (16..=len_kb * 2).step_by((len_kb / 8).max(16) as usize) {
        let mnt = tempfile::tempdir().unwrap();
        let size_kb = len_kb + extra_kb;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_kb}k"), "tmpfs"])
            .arg(mnt.path())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !mounted {
            println!("SKIPPED: cannot mount a tmpfs");
            return;
        }
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.0)
                    .status();
            }
        }
        let _unmount = Unmount(mnt.path().to_path_buf());
        let db = mnt.path().join("v2.db");
        std::fs::copy(&orig, &db).unwrap();
        let before = sha(&db);
        let opened = Ledger::open(&db, LedgerConfig::default());
        let version = |p: &Path| -> i64 {
            Connection::open(p)
                .unwrap()
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .unwrap()
        };
        match opened {
            Err(Error::Store(StorageError::DiskFull)) => {
                assert_eq!(sha(&db), before, "+{extra_kb} KiB: refused but changed");
                outcomes.push("full");
            }
            Err(e) => {
                assert_eq!(
                    sha(&db),
                    before,
                    "+{extra_kb} KiB: refused ({e:?}) but changed"
                );
                eprintln!("DFULL +{extra_kb} KiB: {e:?}");
                outcomes.push("other error");
            }
            Ok(l) => {
                drop(l);
                assert_eq!(version(&db), 5, "+{extra_kb} KiB");
                outcomes.push("migrated");
            }
        }
        assert!(std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={}k", len_kb * 6)])
            .arg(mnt.path())
            .status()
            .unwrap()
            .success());
        let (l, _c) = open_at(&db);
        for call in calls() {
            let got = classify(&l.begin(&op("o"), 0, &spec(call, "send", "{}")));
            assert_eq!(got, expected(call, 2), "+{extra_kb} KiB: {call}");
        }
    }
    eprintln!("DFULL outcomes {outcomes:?}");
    assert!(outcomes.contains(&"full"), "{outcomes:?}");
}

// ---------------------------------------------------------------------------
// 12. A full disk at open (SQLite cannot grow the -shm) is reported as a
//     disk I/O error ("the ledger writes its log again…"), not `DiskFull`.
// ---------------------------------------------------------------------------

#[test]
fn defect_a_full_disk_at_open_is_reported_as_a_failing_disk() {
    let src = tempfile::tempdir().unwrap();
    let orig = src.path().join("l.db");
    {
        let (l, _c) = open_at(&orig);
        let t = ticket(l.begin(&op("o"), 0, &spec("c1", "send", "{}")).unwrap());
        l.commit(&t.attempt_id(), r#"{"r":1}"#, None).unwrap();
    }
    let mnt = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(mnt.path())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        println!("SKIPPED: cannot mount a tmpfs");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _unmount = Unmount(mnt.path().to_path_buf());
    let db = mnt.path().join("l.db");
    std::fs::copy(&orig, &db).unwrap();
    // Fill what is left.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.path().join("filler")).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        while f.write_all(&[0u8]).is_ok() {}
    }
    let err = Ledger::open(&db, LedgerConfig::default()).unwrap_err();
    // What must hold: the typed full-disk error the fault matrix promises.
    assert!(
        matches!(err, Error::Store(StorageError::DiskFull)),
        "{err:?}: {err}"
    );
}

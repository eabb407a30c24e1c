//! The maintenance commands of the `toolledger` binary on a database "pulled
//! from a device": `stats`, `recover`, `prune`, `export`, plus a tiny `bench`
//! run. Each test runs the built binary as a child process.

use toolledger_test_support as support;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use support::*;
use toolledger::ledger::Begin;

const BIN: &str = env!("CARGO_BIN_EXE_toolledger");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the toolledger binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn ok(args: &[&str]) -> Output {
    let out = run(args);
    assert!(
        out.status.success(),
        "toolledger {args:?} exited {:?}: {}",
        out.status.code(),
        stderr(&out)
    );
    out
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&stdout(&ok(args))).expect("valid JSON")
}

fn ticket(answer: Begin) -> toolledger::ledger::Ticket {
    match answer {
        Begin::Execute(t) => t,
        other => panic!("expected Execute, got {other:?}"),
    }
}

/// A ledger holding: 6 delivered calls, 1 committed but undelivered, 1
/// waiting for approval, and 1 executing in a session that then died. The
/// manual clock stands in 1970, so everything is old by the system clock.
fn device_db(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("device.db");
    {
        let (dead, _clock) = open_at(&path);
        let _ = ticket(
            dead.begin(
                &op("op_a"),
                9,
                &spec("c_dead", "pay", r#"{"amount":"12.50"}"#),
            )
            .unwrap(),
        );
    }
    let (ledger, _clock) = open_at(&path);
    for i in 0..6 {
        let t = ticket(
            ledger
                .begin(
                    &op("op_a"),
                    i,
                    &spec(
                        &format!("c{i}"),
                        "send_email",
                        r#"{"to":"ada@example.com"}"#,
                    ),
                )
                .unwrap(),
        );
        ledger
            .commit(&t.attempt_id(), r#"{"id":"m"}"#, None)
            .unwrap();
        ledger.mark_delivered(&[t.execution_id]).unwrap();
    }
    let t = ticket(
        ledger
            .begin(&op("op_b"), 0, &spec("c_undelivered", "send_email", "{}"))
            .unwrap(),
    );
    ledger.commit(&t.attempt_id(), "{}", None).unwrap();
    let _ = ledger
        .begin(
            &op("op_b"),
            0,
            &spec("c_approve", "pay", "{}").with_approval(),
        )
        .unwrap();
    path
}

#[test]
fn stats_counts_statuses_tools_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    let v = json(&["stats", path, "--json"]);
    assert_eq!(v["executions"], 9);
    assert_eq!(v["executions_by_status"]["result_delivered"], 6);
    assert_eq!(v["executions_by_status"]["committed"], 1);
    assert_eq!(v["executions_by_status"]["prepared"], 1);
    assert_eq!(v["executions_by_status"]["executing"], 1);
    assert_eq!(v["executions_by_tool"]["send_email"], 7);
    assert_eq!(v["executions_by_tool"]["pay"], 2);
    assert_eq!(v["tombstones"], 0);
    assert_eq!(v["schema_version"], toolledger::ledger::SCHEMA_VERSION);
    assert!(v["file_bytes"].as_u64().unwrap() > 0);
    let table = stdout(&ok(&["stats", path]));
    assert!(table.contains("STATUS"), "{table}");
    assert!(table.contains("result_delivered  6"), "{table}");
    assert!(table.contains("send_email"), "{table}");
}

#[test]
fn recover_runs_recovery_and_lists_what_needs_attention() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    let v = json(&["recover", path, "--json"]);
    assert_eq!(v["needs_attention"], 3, "{v:#}");
    let items = v["executions"].as_array().unwrap();
    let status_of = |call: &str| {
        items
            .iter()
            .find(|i| i["execution_id"].as_str().unwrap().contains(call))
            .map(|i| {
                (
                    i["status"].as_str().unwrap().to_owned(),
                    i["next"].as_str().unwrap().to_owned(),
                )
            })
            .unwrap()
    };
    // The dead session's call is now an unknown outcome to reconcile.
    let (status, next) = status_of("c_dead");
    assert_eq!(status, "outcome_unknown");
    assert!(next.contains("reconcile"), "{next}");
    assert_eq!(status_of("c_undelivered").0, "committed");
    assert_eq!(status_of("c_approve").1, "ask for approval");
    assert!(
        items.iter().all(|i| i.get("reason").is_none()),
        "reasons only with --show-args"
    );
    let table = stdout(&ok(&["recover", path]));
    assert!(table.contains("3 execution(s) need attention"), "{table}");
    assert!(table.contains("NEXT"), "{table}");
    let shown = json(&["recover", path, "--json", "--show-args"]);
    assert!(shown["executions"][0].get("reason").is_some());
}

#[test]
fn prune_reports_what_it_removed_and_shows_progress_as_plain_text_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    let out = ok(&[
        "prune",
        path,
        "--older-than",
        "1d",
        "--batch",
        "2",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["executions"], 6, "only the delivered calls: {v:#}");
    assert_eq!(v["tombstones_written"], 6);
    assert_eq!(v["transitions"], 18);
    let progress = stderr(&out);
    assert!(
        !progress.contains('\r'),
        "no bar when stderr is not a terminal"
    );
    assert!(progress.contains("prune: 100% (6/6)"), "{progress}");
    let stats = json(&["stats", path, "--json"]);
    assert_eq!(stats["tombstones"], 6);
    assert_eq!(stats["executions"], 3);
    // A late retry of a pruned call, after the CLI pruned it: refused.
    let (ledger, _clock) = open_at(&db);
    let again = ledger
        .begin(
            &op("op_a"),
            0,
            &spec("c0", "send_email", r#"{"to":"ada@example.com"}"#),
        )
        .unwrap();
    assert!(matches!(again, Begin::Failed { .. }), "{again:?}");
    drop(ledger);
    // Table output, nothing left to prune.
    let table = stdout(&ok(&["prune", path, "--before", "9999999999999"]));
    assert!(table.contains("executions"), "{table}");
    assert!(table.contains("file "), "{table}");
}

#[test]
fn export_writes_json_lines_without_values_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    let out = ok(&["export", path]);
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 9);
    for line in &lines {
        assert!(line["execution_id"].is_string());
        assert!(line["status"].is_string());
        for hidden in ["args", "result", "external_id", "reason"] {
            assert!(line.get(hidden).is_none(), "{hidden} without --show-args");
        }
    }
    assert!(!stdout(&out).contains("ada@example.com"));
    assert!(stderr(&out).contains("9 execution(s) written to stdout"));

    let file = dir.path().join("out.jsonl");
    let out = ok(&[
        "export",
        path,
        "--show-args",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(stdout(&out).is_empty(), "the lines went to the file");
    let text = std::fs::read_to_string(&file).unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(first.get("args").is_some());
    assert!(text.contains("ada@example.com"));
    assert!(
        stderr(&out).contains("export: 9 execution(s)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_input_is_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    for cmd in ["stats", "recover", "export"] {
        let out = run(&[cmd, missing.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        assert!(stderr(&out).contains("no such ledger file"), "{cmd}");
        assert!(!missing.exists(), "{cmd} must not create a ledger");
    }
    let out = run(&["prune", missing.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "prune without a cutoff is a usage error"
    );
    let out = run(&["prune", "x.db", "--older-than", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    let junk = dir.path().join("photo.jpg");
    std::fs::write(&junk, b"not a database at all, just bytes ".repeat(100)).unwrap();
    let before = std::fs::read(&junk).unwrap();
    for cmd in [
        vec!["inspect"],
        vec!["stats"],
        vec!["recover"],
        vec!["export"],
        vec!["prune", "--older-than", "1d"],
    ] {
        let mut args = vec![cmd[0], junk.to_str().unwrap()];
        args.extend_from_slice(&cmd[1..]);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains("not a toolledger database"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(std::fs::read(&junk).unwrap(), before, "left untouched");

    // A database from a newer toolledger: the read-only commands refuse it
    // with the typed error and leave it as it is.
    let newer = dir.path().join("newer.db");
    rusqlite::Connection::open(&newer)
        .unwrap()
        .execute_batch("CREATE TABLE t (x); PRAGMA user_version = 99;")
        .unwrap();
    let before = std::fs::read(&newer).unwrap();
    for cmd in ["inspect", "stats", "export"] {
        let out = run(&[cmd, newer.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        assert!(
            stderr(&out).contains("schema version 99"),
            "{cmd}: {}",
            stderr(&out)
        );
    }
    assert_eq!(std::fs::read(&newer).unwrap(), before, "left untouched");
}

/// The bytes of the database file and of its WAL (empty when absent).
fn file_bytes(db: &Path) -> (Vec<u8>, Vec<u8>) {
    let mut wal = db.as_os_str().to_os_string();
    wal.push("-wal");
    (
        std::fs::read(db).unwrap(),
        std::fs::read(wal).unwrap_or_default(),
    )
}

#[test]
fn inspect_stats_and_export_never_write_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    let before = file_bytes(&db);
    let v = json(&["inspect", path, "--json"]);
    assert_eq!(v["stats"]["executions_by_status"]["result_delivered"], 6);
    let v = json(&["stats", path, "--json"]);
    assert_eq!(v["executions"], 9);
    let lines = stdout(&ok(&["export", path])).lines().count();
    assert_eq!(lines, 9);
    assert!(file_bytes(&db) == before, "the file was written to");
    // Unlike `inspect`, `recover` is a write: it changes the file.
    ok(&["recover", path]);
    assert!(file_bytes(&db) != before);
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn read_only_commands_leave_no_files_beside_a_cleanly_closed_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    let before = names_in(dir.path());
    assert!(
        !before
            .iter()
            .any(|n| n.ends_with("-wal") || n.ends_with("-shm")),
        "{before:?}"
    );
    for args in [
        &["inspect", path][..],
        &["inspect", path, "--json"],
        &["stats", path],
        &["stats", path, "--json"],
        &["export", path],
    ] {
        ok(args);
        assert_eq!(names_in(dir.path()), before, "after {args:?}");
    }
}

#[test]
fn a_ledger_in_use_is_read_with_what_its_owner_committed_and_nothing_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    // A live owner: its committed call sits in the WAL, not yet checkpointed.
    let (ledger, _clock) = open_at(&db);
    let t = ticket(
        ledger
            .begin(&op("op_live"), 0, &spec("c_live", "send_email", "{}"))
            .unwrap(),
    );
    ledger
        .commit(&t.attempt_id(), r#"{"ok":true}"#, None)
        .unwrap();
    let wal = dir.path().join("device.db-wal");
    assert!(wal.is_file());
    let v = json(&["stats", path, "--json"]);
    assert_eq!(v["executions"], 10, "the WAL's commit is seen");
    assert_eq!(v["executions_by_status"]["committed"], 2);
    let lines = stdout(&ok(&["export", path])).lines().count();
    assert_eq!(lines, 10);
    assert!(wal.is_file(), "the owner's WAL is left in place");
    // The owner goes on writing after the reads.
    ledger
        .mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    drop(ledger);
    let v = json(&["stats", path, "--json"]);
    assert_eq!(v["executions_by_status"]["result_delivered"], 7);
}

#[test]
fn an_older_schema_is_read_from_a_migrated_copy_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v1.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL;")
            .unwrap();
        conn.execute_batch(include_str!("../../src/store/migrations/001_initial.sql"))
            .unwrap();
        conn.execute_batch(
            "PRAGMA user_version = 1;
             INSERT INTO operations VALUES ('o', 'open', 1, 1);
             INSERT INTO rounds VALUES ('o', 0, 1);
             INSERT INTO executions (execution_id, operation_id, round, position, provider,
                provider_call_id, tool_name, tool_version, args_digest, args_json,
                downstream_key, requires_approval, status, attempt_count, result_json,
                created_ms, updated_ms)
             VALUES ('o:round_0:c1:send:v1', 'o', 0, 0, 'openai_chat', 'c1', 'send', 1,
                'b1d4d3a0a0e6d1d5f7a3a0b4f1e2d3c4b5a6978877665544332211aabbccddee',
                '{\"secret\":\"hunter2\"}', 'tl_000000000000000000000000000000000000000000000000',
                0, 'committed', 1, '{}', 1, 2);",
        )
        .unwrap();
    }
    let path = db.to_str().unwrap();
    let before = file_bytes(&db);
    let out = ok(&["stats", path, "--json"]);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["executions"], 1);
    assert_eq!(v["executions_by_status"]["committed"], 1);
    assert_eq!(v["schema_version"], 1, "the file's version, not the copy's");
    assert_eq!(v["read_from_migrated_copy"], true);
    assert!(
        stderr(&out).contains("schema version 1") && stderr(&out).contains("migrated copy"),
        "{}",
        stderr(&out)
    );
    let out = ok(&["inspect", path]);
    assert!(
        stdout(&out).contains("o:round_0:c1:send:v1"),
        "{}",
        stdout(&out)
    );
    assert!(!stdout(&out).contains("hunter2"));
    assert!(file_bytes(&db) == before, "the v1 file was written to");
    let version: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 1);
}

#[test]
fn help_version_suggestions_and_completions() {
    let help = ok(&["--help"]);
    for command in [
        "inspect",
        "stats",
        "recover",
        "prune",
        "export",
        "completions",
    ] {
        assert!(stdout(&help).contains(command), "{}", stdout(&help));
    }
    let prune_help = ok(&["prune", "--help"]);
    assert!(stdout(&prune_help).contains("--older-than"));
    assert!(!stdout(&prune_help).contains("--limit"), "help per command");
    let version = ok(&["--version"]);
    assert_eq!(
        stdout(&version).trim(),
        format!("toolledger {}", env!("CARGO_PKG_VERSION"))
    );
    let typo = run(&["inspekt", "x.db"]);
    assert_eq!(typo.status.code(), Some(2));
    assert!(stderr(&typo).contains("inspect"), "{}", stderr(&typo));
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(&ok(&["completions", shell]));
        assert!(script.contains("toolledger"), "{shell}");
        assert!(script.contains("prune"), "{shell}");
    }
    // `--` ends the options: a file named like a flag can be inspected.
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["inspect", "--", dir.path().join("--json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "a missing file, not a flag");
    assert!(stderr(&out).contains("no such ledger file"));
}

#[test]
fn recover_exit_code_says_whether_something_needs_attention() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    let out = run(&["recover", path, "--exit-code"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // Without the flag a listing is a success.
    assert_eq!(run(&["recover", path]).status.code(), Some(0));
    // A ledger with nothing to do: 0 with the flag too.
    let calm = dir.path().join("calm.db");
    drop(open_at(&calm));
    assert_eq!(
        run(&["recover", calm.to_str().unwrap(), "--exit-code"])
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn inspect_never_shows_argument_or_result_values_and_every_json_says_its_format() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let path = db.to_str().unwrap();
    let table = stdout(&ok(&["inspect", path]));
    let value = json(&["inspect", path, "--json"]);
    for text in [table.clone(), value.to_string()] {
        for secret in ["ada@example.com", "12.50"] {
            assert!(!text.contains(secret), "`{secret}` leaked:\n{text}");
        }
    }
    assert!(table.contains("op_a"), "{table}");
    for args in [
        vec!["inspect", path, "--json"],
        vec!["stats", path, "--json"],
        vec!["recover", path, "--json"],
    ] {
        assert_eq!(json(&args)["format_version"], 1, "{args:?}");
    }
    let export = stdout(&ok(&["export", path]));
    for line in export.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["format_version"], 1);
    }
}

/// `export --out` naming the ledger itself, its WAL, or a symlink to the
/// ledger must be refused before anything is opened for writing: the file
/// (or its not yet checkpointed commits) would be truncated.
#[test]
fn export_out_never_overwrites_the_ledger_or_its_wal() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let db_s = db.to_str().unwrap();
    let count = |db: &Path| -> u64 {
        json(&["stats", db.to_str().unwrap(), "--json"])["executions"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(count(&db), 9);
    let mut wal = db.as_os_str().to_os_string();
    wal.push("-wal");
    let link = dir.path().join("link.jsonl");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&db, &link).unwrap();
    // A dangling link to the WAL's name: opening it would create the WAL.
    let to_wal = dir.path().join("to_wal.jsonl");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&wal, &to_wal).unwrap();
    let relative_dir = dir.path().join(".").join("device.db");
    for out in [
        db.clone(),
        relative_dir,
        link.clone(),
        to_wal.clone(),
        std::path::PathBuf::from(&wal),
    ] {
        let before = std::fs::read(&db).unwrap();
        let run_out = run(&["export", db_s, "--out", out.to_str().unwrap()]);
        assert_eq!(
            run_out.status.code(),
            Some(1),
            "--out {}: {}",
            out.display(),
            stderr(&run_out)
        );
        assert!(
            std::fs::read(&db).unwrap() == before,
            "--out {} left the ledger as it was",
            out.display()
        );
        assert_eq!(count(&db), 9, "--out {}: every record kept", out.display());
        assert!(
            !std::path::Path::new(&wal).exists(),
            "--out {} created no WAL",
            out.display()
        );
    }
}

/// The writing commands on a directory, and through a symlink by a
/// relative path: a clear error, or the same ledger (no second WAL or
/// sessions directory under the link's name), nothing lost. (Read-only
/// files are not tried here: the tests may run as root.)
#[test]
fn writing_commands_on_odd_paths_fail_cleanly_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = device_db(dir.path());
    let db_s = db.to_str().unwrap().to_owned();
    let count = |p: &str| -> u64 {
        json(&["stats", p, "--json"])["executions"]
            .as_u64()
            .unwrap()
    };
    // A directory.
    for cmd in [vec!["recover"], vec!["prune", "--older-than", "1d"]] {
        let mut args = vec![cmd[0], dir.path().to_str().unwrap()];
        args.extend_from_slice(&cmd[1..]);
        let out = run(&args);
        eprintln!("{args:?} -> {:?} {}", out.status.code(), stderr(&out));
        assert_eq!(out.status.code(), Some(1));
    }
    // A symlink and a relative path.
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&db, &link).unwrap();
    let out = Command::new(BIN)
        .current_dir(dir.path())
        .args(["recover", "link.db", "--json"])
        .output()
        .unwrap();
    eprintln!(
        "recover link.db -> {:?} {}",
        out.status.code(),
        stderr(&out)
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    eprintln!("files: {names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("link.db-")),
        "no second WAL or sessions dir under the link's name: {names:?}"
    );
    assert_eq!(count(&db_s), 9);
}

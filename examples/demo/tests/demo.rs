//! The demo binary survives a real process death at each of the six crash
//! boundaries with exactly one effect per logical call, never shows argument
//! values, and refuses bad input cleanly.
//!
//! Every test runs the built binary as a child process; a crash is a real
//! `abort()` of that child, and the next child recovers from the files alone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_toolledger-demo");

/// Argument values used by the demo script: none may ever be printed.
const ARGUMENT_VALUES: &[&str] = &[
    "ada.lovelace@example.com",
    "Quarterly report",
    "Q3 numbers",
    "grace.hopper@example.net",
    "Invoice settled",
    "invoice 7731",
    "IBAN",
    "DE44",
    "FR76",
    "EUR",
];

/// The four side-effecting calls of the script.
const EXECUTION_IDS: &[&str] = &[
    "demo_op_1:round_0:call_r0_email:send_email:v1",
    "demo_op_1:round_0:call_r0_pay:pay:v1",
    "demo_op_1:round_1:call_r1_email:send_email:v1",
    "demo_op_1:round_2:call_r2_pay:pay:v1",
];

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the demo binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn demo(db: &Path, extra: &[&str]) -> Output {
    let db = db.to_str().expect("utf-8 temp path");
    let mut args = vec!["--db", db];
    args.extend_from_slice(extra);
    run(&args)
}

/// `logical_calls=<n> side_effects=<n> duplicates=<n>` from the last line.
#[derive(Debug, PartialEq, Eq)]
struct Summary {
    logical_calls: u64,
    side_effects: u64,
    duplicates: u64,
}

fn summary(out: &Output) -> Summary {
    let text = stdout(out);
    let last = text.lines().last().expect("some output");
    let fields: HashMap<&str, u64> = last
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k, v.parse().expect("a number"))
        })
        .collect();
    assert_eq!(fields.len(), 3, "last line: {last}");
    Summary {
        logical_calls: fields["logical_calls"],
        side_effects: fields["side_effects"],
        duplicates: fields["duplicates"],
    }
}

fn sibling(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Reads the transcript independently of the binary: every result handed to
/// the model more than once must be byte-for-byte the same, and every
/// logical call must have been handed over. Returns the number of entries.
fn assert_transcript_consistent(db: &Path) -> usize {
    let text = std::fs::read_to_string(sibling(db, ".transcript")).unwrap();
    let mut first: HashMap<String, String> = HashMap::new();
    let mut entries = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a complete JSON line");
        let id = v["execution_id"].as_str().unwrap().to_owned();
        let result = v["result_json"].as_str().unwrap().to_owned();
        let seen = first.entry(id.clone()).or_insert_with(|| result.clone());
        assert_eq!(*seen, result, "result of {id} changed between hand-overs");
        entries += 1;
    }
    for id in EXECUTION_IDS {
        assert!(first.contains_key(*id), "{id} never reached the model");
    }
    entries
}

fn assert_completed_once(out: &Output) {
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        stdout(out),
        stderr(out)
    );
    let s = summary(out);
    assert_eq!(s.logical_calls, 4);
    assert_eq!(s.side_effects, s.logical_calls, "{}", stdout(out));
    assert_eq!(s.duplicates, 0);
    assert!(stdout(out).contains("completed=4/4"));
    assert!(stdout(out).contains("transcript_mismatches=0"));
}

fn assert_died(out: &Output, boundary: &str) {
    assert!(!out.status.success(), "the crash run must not succeed");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(6), "killed by SIGABRT");
    }
    assert!(
        stdout(out).contains(&format!("CRASH at {boundary}")),
        "{}",
        stdout(out)
    );
}

/// Crash at `boundary` (optionally only for `tool`), recover, and check the
/// recovery took the step docs/design.md prescribes for that boundary.
fn crash_and_recover(boundary: &str, tool: Option<&str>, expected_recovery: &str) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut flags = vec!["--crash-at", boundary];
    if let Some(t) = tool {
        flags.extend_from_slice(&["--crash-tool", t]);
    }
    let crashed = demo(&db, &flags);
    assert_died(&crashed, boundary);

    let recovered = demo(&db, &[]);
    assert_completed_once(&recovered);
    let text = stdout(&recovered);
    let recover_phase = text.split("round 0:").next().unwrap_or_default();
    assert!(
        recover_phase.contains(expected_recovery),
        "expected `{expected_recovery}` while recovering from {boundary}:\n{text}"
    );
    assert_transcript_consistent(&db);

    // And nothing left to do: a further run only replays.
    let again = demo(&db, &[]);
    assert_completed_once(&again);
    assert!(stdout(&again).contains("recover: 0 execution(s) need attention"));
    assert!(!stdout(&again).contains("remote:"), "{}", stdout(&again));
}

#[test]
fn crash_after_prepared_then_approve_and_execute_once() {
    crash_and_recover(
        "after-prepared",
        None,
        "recover: prepared, waiting for approval",
    );
}

#[test]
fn crash_before_request_then_reconcile_not_found_and_retry_same_key() {
    crash_and_recover(
        "before-request",
        None,
        "reconcile: not found at the remote: retry, same key",
    );
    crash_and_recover(
        "before-request",
        Some("pay"),
        "reconcile: not found at the remote: retry, same key",
    );
}

#[test]
fn crash_in_flight_then_reconcile_not_found_and_retry_same_key() {
    // The remote's transaction never committed: nothing is found.
    crash_and_recover(
        "in-flight",
        None,
        "reconcile: not found at the remote: retry, same key",
    );
    crash_and_recover(
        "in-flight",
        Some("pay"),
        "reconcile: not found at the remote: retry, same key",
    );
}

#[test]
fn crash_after_remote_commit_then_commit_the_found_effect() {
    crash_and_recover(
        "after-remote-commit",
        None,
        "reconcile: effect found at the remote by reference",
    );
    // The payment provider does not dedupe: a blind retry would charge twice.
    crash_and_recover(
        "after-remote-commit",
        Some("pay"),
        "reconcile: effect found at the remote by reference",
    );
}

#[test]
fn crash_after_local_commit_then_replay_the_stored_result() {
    crash_and_recover(
        "after-local-commit",
        None,
        "recover: committed, never delivered: replay",
    );
}

#[test]
fn crash_after_model_result_then_replay_the_identical_result() {
    crash_and_recover(
        "after-model-result",
        None,
        "recover: committed, never delivered: replay",
    );
}

#[test]
fn plain_run_without_db_completes() {
    let out = run(&[]);
    assert_completed_once(&out);
    for id in EXECUTION_IDS {
        assert!(stdout(&out).contains(id));
    }
    // Remove the temporary files the run reported.
    let text = stdout(&out);
    if let Some(line) = text.lines().find(|l| l.starts_with("demo: ledger")) {
        let db = PathBuf::from(line.trim_start_matches("demo: ledger").trim());
        if let Some(dir) = db.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn rerunning_a_completed_demo_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let first = demo(&db, &[]);
    assert_completed_once(&first);
    let entries_before = assert_transcript_consistent(&db);

    let third = {
        let second = demo(&db, &[]);
        assert_completed_once(&second);
        demo(&db, &[])
    };
    assert_completed_once(&third);
    assert_eq!(summary(&third), summary(&first));
    let text = stdout(&third);
    assert!(!text.contains("begin: execute"), "{text}");
    assert!(!text.contains("remote:"), "{text}");
    assert!(!text.contains("needs approval"), "{text}");
    // Each run hands every result over twice (script + read-back).
    assert_eq!(assert_transcript_consistent(&db), entries_before * 3);
}

#[test]
fn the_output_never_shows_argument_values() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let out = demo(&db, &[]);
    assert_completed_once(&out);
    let text = stdout(&out);
    for value in ARGUMENT_VALUES {
        assert!(!text.contains(value), "`{value}` leaked:\n{text}");
    }
    // Results (and the external ids in them) are not shown either.
    assert!(!text.contains("msg_0001") && !text.contains("pay_0002"));
    // Every call ended delivered, as the ledger itself says.
    let ledger = toolledger::ledger::Ledger::open(&db, Default::default()).unwrap();
    for id in EXECUTION_IDS {
        let id = toolledger::model::ExecutionId::parse(*id).unwrap();
        let rec = ledger.get(&id).unwrap().unwrap();
        assert_eq!(
            rec.status,
            toolledger::model::ExecutionStatus::ResultDelivered,
            "{id}"
        );
    }
}

#[test]
fn bad_arguments_exit_2_with_usage() {
    for args in [
        &["frobnicate"][..],
        &["--bogus"],
        &["--db"],
        &["--crash-at", "in-flight"],
        &["--crash-tool", "pay"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        // clap names the problem and points at the usage (the usage line
        // itself, or `--help` where it has no single line to show).
        let err = stderr(&out);
        assert!(err.starts_with("error:"), "{args:?}: {err}");
        assert!(
            err.contains("Usage:") || err.contains("--help"),
            "{args:?}: {err}"
        );
    }
    let out = run(&["--db", "x.db", "--crash-at", "sometime"]);
    assert_eq!(out.status.code(), Some(2));
    for name in [
        "after-prepared",
        "before-request",
        "in-flight",
        "after-remote-commit",
        "after-local-commit",
        "after-model-result",
    ] {
        assert!(stderr(&out).contains(name), "{}", stderr(&out));
    }
    assert!(!Path::new("x.db").exists());

    let help = run(&["--help"]);
    assert!(help.status.success());
    assert!(stdout(&help).contains("Usage:"));
    let version = run(&["--version"]);
    assert!(stdout(&version).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn junk_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("notes.db");
    let bytes: Vec<u8> = b"these are my notes, not a database\n"
        .iter()
        .copied()
        .cycle()
        .take(8192)
        .collect();
    std::fs::write(&junk, &bytes).unwrap();
    let junk_str = junk.to_str().unwrap();

    let out = run(&["--db", junk_str]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not a toolledger database"));
    assert_eq!(std::fs::read(&junk).unwrap(), bytes);
    assert!(!sibling(&junk, ".outbox").exists());
    assert!(!sibling(&junk, ".transcript").exists());
}

//! The writing and reading commands on a ledger that a live app has open:
//! nothing of the app's is changed, no lock is left that the app then
//! misses, and the counts are the app's.

use toolledger_test_support as support;

use std::process::{Command, Output};

use serde_json::Value;
use support::*;
use toolledger::ledger::{Begin, PRUNED_EXECUTED_REASON};
use toolledger::model::ExecutionStatus;

const BIN: &str = env!("CARGO_BIN_EXE_toolledger");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("runs")
}

fn json_ok(args: &[&str]) -> Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn cli_stats_recover_and_prune_beside_a_live_app_change_nothing_of_its_and_take_no_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let p = path.to_str().unwrap();
    // The manual clock stands in 1970: everything is old by the CLI's clock.
    let (app, _clock) = open_at(&path);
    let mut done = Vec::new();
    for i in 0..3 {
        let Begin::Execute(t) = app
            .begin(&op("o"), 0, &spec(&format!("d{i}"), "pay", "{}"))
            .unwrap()
        else {
            panic!()
        };
        app.commit(&t.attempt_id(), "{}", None).unwrap();
        app.mark_delivered(std::slice::from_ref(&t.execution_id))
            .unwrap();
        done.push(t.execution_id);
    }
    let Begin::Execute(com) = app.begin(&op("o"), 1, &spec("com", "pay", "{}")).unwrap() else {
        panic!()
    };
    app.commit(&com.attempt_id(), "{}", None).unwrap();
    let Begin::Execute(live) = app.begin(&op("o"), 2, &spec("live", "pay", "{}")).unwrap() else {
        panic!()
    };
    // Writes the queued delivery marks (the CLI reads the file, not the app's queue).
    app.checkpoint().unwrap();

    let stats = json_ok(&["stats", p, "--json"]);
    eprintln!("stats: {stats}");
    assert_eq!(stats["executions"].as_u64(), Some(5), "{stats}");

    let rec = json_ok(&["recover", p, "--json"]);
    eprintln!("recover: {rec}");
    assert_eq!(
        app.get(&live.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Executing,
        "a live owner's call is not turned unknown by the CLI"
    );

    let pruned = json_ok(&["prune", p, "--older-than", "0s", "--json"]);
    eprintln!("prune: {pruned}");
    assert_eq!(pruned["executions"].as_u64(), Some(3), "{pruned}");
    assert_eq!(
        app.get(&com.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    assert_eq!(
        app.get(&live.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Executing
    );
    // The app goes on: commits its live call, writes, answers tombstones.
    app.commit(&live.attempt_id(), "{}", None).unwrap();
    app.mark_delivered(&[com.execution_id.clone(), live.execution_id.clone()])
        .unwrap();
    for (i, id) in done.iter().enumerate() {
        match app
            .begin(&op("o"), 0, &spec(&format!("d{i}"), "pay", "{}"))
            .unwrap()
        {
            Begin::Failed {
                execution_id,
                reason,
            } => {
                assert_eq!(&execution_id, id);
                assert_eq!(reason, PRUNED_EXECUTED_REASON);
            }
            other => panic!("{id} ran again: {other:?}"),
        }
    }
    let Begin::Execute(next) = app.begin(&op("o"), 3, &spec("next", "pay", "{}")).unwrap() else {
        panic!()
    };
    app.commit(&next.attempt_id(), "{}", None).unwrap();
    app.checkpoint().unwrap();
    let stats = json_ok(&["stats", p, "--json"]);
    eprintln!("stats after: {stats}");
    assert_eq!(stats["executions"].as_u64(), Some(3), "{stats}");
    assert_eq!(stats["tombstones"].as_u64(), Some(3), "{stats}");
    // The CLI left no session behind: only the app's lock file.
    let locks: Vec<_> = std::fs::read_dir(dir.path().join("app.db-sessions"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    eprintln!("locks: {locks:?}");
    assert_eq!(locks.len(), 1, "{locks:?}");
}

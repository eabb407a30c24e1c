//! Many threads and many sessions race the same calls: exactly one Execute.

use toolledger_test_support as support;

use std::sync::{Arc, Barrier};
use std::thread;

use support::*;
use toolledger::ledger::Begin;

fn race(
    ledgers: Vec<Arc<toolledger::ledger::Ledger>>,
    threads_per_ledger: usize,
) -> (usize, usize) {
    let total = ledgers.len() * threads_per_ledger;
    let barrier = Arc::new(Barrier::new(total));
    let mut handles = Vec::new();
    for ledger in &ledgers {
        for _ in 0..threads_per_ledger {
            let ledger = ledger.clone();
            let barrier = barrier.clone();
            handles.push(thread::spawn(move || {
                barrier.wait();
                ledger
                    .begin(&op("op"), 0, &spec("call_1", "pay", r#"{"amount":1}"#))
                    .unwrap()
            }));
        }
    }
    let answers: Vec<Begin> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let executes = answers
        .iter()
        .filter(|a| matches!(a, Begin::Execute(_)))
        .count();
    let in_flight = answers
        .iter()
        .filter(|a| matches!(a, Begin::InFlight { .. }))
        .count();
    (executes, in_flight)
}

#[test]
fn threads_sharing_one_ledger_get_exactly_one_execute() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let (executes, in_flight) = race(vec![Arc::new(ledger)], 8);
    assert_eq!((executes, in_flight), (1, 7));
}

#[test]
fn separate_sessions_on_one_file_get_exactly_one_execute() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (first, clock) = open_at(&path);
    let mut ledgers = vec![Arc::new(first)];
    for _ in 0..3 {
        ledgers.push(Arc::new(open_with(&path, &clock)));
    }
    let (executes, in_flight) = race(ledgers, 2);
    assert_eq!((executes, in_flight), (1, 7));
}

/// Child side of the next test: begins the shared call, writes its answer
/// to a file, and keeps its session alive until the parent says done.
#[test]
fn child_races_begin() {
    let Ok(db) = std::env::var("TOOLLEDGER_RACE_DB") else {
        return;
    };
    let (ledger, _clock) = open_at(std::path::Path::new(&db));
    let pid = std::process::id();
    std::fs::write(format!("{db}.ready.{pid}"), b"").unwrap();
    wait_for(|| std::path::Path::new(&format!("{db}.go")).exists());
    let answer = ledger
        .begin(&op("op"), 0, &spec("call_1", "pay", r#"{"amount":1}"#))
        .unwrap();
    let tag = match answer {
        Begin::Execute(_) => "EXECUTE",
        Begin::InFlight { .. } => "INFLIGHT",
        _ => "OTHER",
    };
    std::fs::write(format!("{db}.answer.{pid}"), tag).unwrap();
    wait_for(|| std::path::Path::new(&format!("{db}.done")).exists());
}

/// Polls `cond` for at most 20 s.
fn wait_for(cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn files_with(dir: &std::path::Path, infix: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(infix))
        .collect()
}

#[test]
fn separate_processes_get_exactly_one_execute() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("l.db");
    // Create the schema first so the children race on begin, not on migration.
    drop(open_at(&db));
    let mut children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_races_begin", "--test-threads=1"])
                .env("TOOLLEDGER_RACE_DB", &db)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_for(|| files_with(dir.path(), ".ready.").len() == 4);
    std::fs::write(format!("{}.go", db.display()), b"").unwrap();
    wait_for(|| files_with(dir.path(), ".answer.").len() == 4);
    std::fs::write(format!("{}.done", db.display()), b"").unwrap();
    for child in children.iter_mut() {
        assert!(child.wait().unwrap().success());
    }
    let mut answers: Vec<String> = files_with(dir.path(), ".answer.")
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    answers.sort();
    assert_eq!(answers, ["EXECUTE", "INFLIGHT", "INFLIGHT", "INFLIGHT"]);
}

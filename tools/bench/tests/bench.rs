//! The benchmark binary: a tiny run prints every figure as `name=value`,
//! cleans up after itself, and its strace child mode measures N calls.

use std::process::{Command, Output};

use toolledger::ledger::Ledger;

const BIN: &str = env!("CARGO_BIN_EXE_toolledger-bench");

fn ok(args: &[&str]) -> Output {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("the bench runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_tiny_bench_run_prints_every_figure_as_name_value() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(&[
        "--dir",
        dir.path().to_str().unwrap(),
        "--calls",
        "3",
        "--batches",
        "2",
        "--rounds",
        "3",
        "--samples",
        "20",
        "--recover-rows",
        "200",
        "--paced-bursts",
        "1",
        "--paced-calls",
        "3",
        "--no-strace",
        "--no-callgrind",
    ]);
    let text = stdout(&out);
    for key in [
        "happy_path_vs_floor_ratio=",
        "happy_path_vs_floor1_ratio=",
        "executor_happy_path_vs_floor1_ratio=",
        "syncs_per_call=",
        "instructions_per_call=",
        "replay_p50_us=",
        "round8_syncs=",
        "round8_wal_commits=1",
        "readonly_overhead_us=",
        "readonly_wal_commits=0",
        "replay_wal_commits=0",
        "recover_1m_ms=",
        "bytes_per_execution=",
        "fsyncs_per_call=",
        "peak_rss_kib=",
        "paced_checkpointing_calls=",
        "paced_checkpointing_calls_idle_off=",
        "paced_max_us=",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(key)),
            "missing {key}:\n{text}"
        );
    }
    // The bench cleans up after itself.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // The strace child mode: N calls and the mean.
    let child = ok(&[
        "--only",
        "happy-path",
        "--calls",
        "3",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(stdout(&child).starts_with("mean_us="), "{}", stdout(&child));
    let ledger = Ledger::open(&dir.path().join("happy.db"), Default::default()).unwrap();
    let stats = ledger.stats().unwrap();
    assert_eq!(
        stats.executions_by_status,
        vec![("result_delivered".to_owned(), 3)]
    );
}

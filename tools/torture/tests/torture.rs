//! The CI-sized crash-boundary torture: a few hundred real process deaths.
//!
//! Spawns the `torture` harness binary (tools/torture), which runs the
//! workload in worker processes against a loopback service in its own
//! process, kills the workers at armed crash points and by SIGKILL, restarts
//! them until every run completes, and checks after every run that each
//! logical effect happened exactly once, that the model always got the same
//! result and that no committed record was downgraded.
//!
//! Needs the crash points compiled in:
//!
//! ```text
//! cargo test --features crash-points --test torture
//! ```
//!
//! `TOOLLEDGER_TORTURE_SEED` / `TOOLLEDGER_TORTURE_KILLS` override the seed
//! and the number of kills. The long run is `scripts/torture.sh`.

use std::collections::HashMap;
use std::process::Command;

fn fields(line: &str) -> HashMap<String, u64> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        .collect()
}

#[test]
fn hundreds_of_kills_leave_no_duplicate_no_lost_record_and_one_result_per_call() {
    let seed = std::env::var("TOOLLEDGER_TORTURE_SEED").unwrap_or_else(|_| "20260601".into());
    let kills: u64 = std::env::var("TOOLLEDGER_TORTURE_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_torture"))
        .args([
            "--kills",
            &kills.to_string(),
            "--seed",
            &seed,
            "--jobs",
            "2",
        ])
        .arg("--workdir")
        .arg(dir.path().join("runs"))
        .output()
        .expect("the torture harness starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "torture failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("kills="), "last line: {last}");
    let totals = fields(last);
    assert!(totals["kills"] >= kills, "{last}");
    assert!(totals["logical_calls"] > 0, "{last}");
    assert_eq!(totals["duplicates"], 0, "{last}");
    assert_eq!(totals["lost_records"], 0, "{last}");
    // The harness's app can always ask the service's ground truth, so no
    // unknown outcome is left unresolved.
    assert_eq!(totals["unknown_unresolved"], 0, "{last}");
    let detail = stdout
        .lines()
        .find(|l| l.starts_with("app_resolved_unknowns="))
        .map(fields)
        .unwrap_or_default();
    assert_eq!(detail.get("transcript_mismatches"), Some(&0), "{stdout}");
    assert_eq!(detail.get("downgrades"), Some(&0), "{stdout}");
    assert_eq!(detail.get("undelivered"), Some(&0), "{stdout}");
    // Every named crash point killed at least one worker.
    let points = stdout
        .lines()
        .find_map(|l| l.strip_prefix("crash_points: "))
        .map(fields)
        .unwrap_or_default();
    assert_eq!(points.len(), 7, "{stdout}");
    for (point, n) in &points {
        assert!(*n > 0, "crash point {point} never fired:\n{stdout}");
    }
    let runs = stdout
        .lines()
        .find(|l| l.starts_with("seed="))
        .map(fields)
        .unwrap_or_default();
    assert!(runs.get("sigkills").copied().unwrap_or(0) > 0, "{stdout}");
}

#[test]
fn live_owners_stopped_suspended_and_clock_stepped_leave_no_duplicate() {
    let seed = std::env::var("TOOLLEDGER_TORTURE_SEED").unwrap_or_else(|_| "20261130".into());
    let stops: u64 = std::env::var("TOOLLEDGER_TORTURE_STOPS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(100);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_torture"))
        .args(["--live", "--kills", &stops.to_string(), "--seed", &seed])
        .arg("--workdir")
        .arg(dir.path().join("runs"))
        .output()
        .expect("the torture harness starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "live torture failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    let totals = fields(last);
    assert_eq!(totals["duplicates"], 0, "{last}");
    assert_eq!(totals["lost_records"], 0, "{last}");
    assert_eq!(totals["unknown_unresolved"], 0, "{last}");
    assert!(totals["logical_calls"] > 0, "{last}");
    let live = stdout
        .lines()
        .find_map(|l| l.strip_prefix("live: "))
        .map(fields)
        .unwrap_or_default();
    assert!(live["stops"] >= stops, "{stdout}");
    assert!(live["suspends"] > 0, "{stdout}");
    let detail = stdout
        .lines()
        .find(|l| l.starts_with("app_resolved_unknowns="))
        .map(fields)
        .unwrap_or_default();
    assert_eq!(detail.get("transcript_mismatches"), Some(&0), "{stdout}");
    assert_eq!(detail.get("undelivered"), Some(&0), "{stdout}");
}

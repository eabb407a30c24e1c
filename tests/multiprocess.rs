//! Two OS processes share one ledger file and race the same tool calls
//! through the `Executor` against one counting downstream (a loopback HTTP
//! service in the parent): exactly one process executes each call, the
//! other sees it in flight or replays its stored result, and the service
//! counts exactly one effect per call.
//!
//! The children are this test binary itself, started with an environment
//! variable that turns `child_races_calls` from a no-op into the racer.

use toolledger_test_support::downstream;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use downstream::{Behaviour, Downstream};
use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{Ledger, LedgerConfig};
use toolledger::model::{OperationId, ToolCall};

/// Rounds of the race: (round, number of parallel calls).
const ROUNDS: [(u32, usize); 8] = [
    (0, 1),
    (1, 3),
    (2, 1),
    (3, 2),
    (4, 1),
    (5, 4),
    (6, 1),
    (7, 1),
];

/// A tool that POSTs its arguments to the service (no idempotency key
/// support there: a second POST would be a second effect).
struct Post {
    addr: SocketAddr,
}

#[async_trait]
impl ToolHandler for Post {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::side_effect("create_event", 1)
    }

    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let resp = downstream::request(
            self.addr,
            "POST",
            "/effects".into(),
            Some(req.downstream_key.as_str().to_owned()),
            req.arguments_json.clone(),
            Duration::from_secs(10),
        )
        .await
        .map_err(|e| ToolError::new(format!("transport: {e}")))?;
        if resp.status != 201 {
            return Ok(PerformOutcome::Unknown {
                reason: format!("status {}", resp.status),
            });
        }
        Ok(PerformOutcome::Committed {
            result_json: resp.body,
            external_id: None,
        })
    }
}

fn calls(round: u32, n: usize) -> Vec<ToolCall> {
    (0..n)
        .map(|i| {
            let mut call = ToolCall::custom(
                format!("call_{round}_{i}"),
                "create_event",
                format!(r#"{{"title":"meeting {round}.{i}"}}"#),
            );
            call.position = i as u32;
            call
        })
        .collect()
}

fn executor(db: &Path, addr: SocketAddr) -> Executor {
    let ledger = Ledger::open(db, LedgerConfig::default()).unwrap();
    let exec = Executor::new(Arc::new(ledger), ExecutorConfig::default());
    exec.register(Arc::new(Post { addr })).unwrap();
    exec
}

fn op() -> OperationId {
    OperationId::new("op_race").unwrap()
}

/// Polls `cond` for at most 30 s.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Child side: waits for the go signal, runs every round, writes one line
/// per outcome (`<call id> <label>`), and keeps its session alive until the
/// parent says done (so the other process never mistakes it for dead).
#[test]
fn child_races_calls() {
    let (Ok(db), Ok(addr), Ok(out)) = (
        std::env::var("TOOLLEDGER_MP_DB"),
        std::env::var("TOOLLEDGER_MP_ADDR"),
        std::env::var("TOOLLEDGER_MP_OUT"),
    ) else {
        return;
    };
    let exec = executor(Path::new(&db), addr.parse().unwrap());
    std::fs::write(format!("{out}.ready"), b"").unwrap();
    wait_for("go", || Path::new(&format!("{db}.go")).exists());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut lines = String::new();
    for (round, n) in ROUNDS {
        let outcomes = rt
            .block_on(exec.execute_round(&op(), round, calls(round, n)))
            .unwrap();
        for (call, outcome) in calls(round, n).iter().zip(&outcomes) {
            lines.push_str(&format!("{} {}\n", call.call_id, outcome.label()));
        }
    }
    std::fs::write(&out, lines).unwrap();
    wait_for("done", || Path::new(&format!("{db}.done")).exists());
}

fn spawn_child(db: &Path, addr: SocketAddr, out: &Path) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_races_calls", "--test-threads=1"])
        .env("TOOLLEDGER_MP_DB", db)
        .env("TOOLLEDGER_MP_ADDR", addr.to_string())
        .env("TOOLLEDGER_MP_OUT", out)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn two_processes_racing_the_same_calls_execute_each_exactly_once() {
    // Service latency widens the window in which the other process finds a
    // call executing (and must answer InFlight rather than run it again).
    let service = Downstream::start(Behaviour {
        latency: Duration::from_millis(15),
        ..Behaviour::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    // Create the schema first, so the children race on calls, not migrations.
    drop(Ledger::open(&db, LedgerConfig::default()).unwrap());
    let outs: Vec<PathBuf> = (0..2)
        .map(|i| dir.path().join(format!("out_{i}")))
        .collect();
    let mut children: Vec<_> = outs
        .iter()
        .map(|out| spawn_child(&db, service.addr(), out))
        .collect();
    wait_for("children ready", || {
        outs.iter()
            .all(|o| Path::new(&format!("{}.ready", o.display())).exists())
    });
    std::fs::write(format!("{}.go", db.display()), b"").unwrap();
    wait_for("answers", || outs.iter().all(|o| o.exists()));
    std::fs::write(format!("{}.done", db.display()), b"").unwrap();
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }

    let mut labels: HashMap<String, Vec<String>> = HashMap::new();
    for out in &outs {
        for line in std::fs::read_to_string(out).unwrap().lines() {
            let (call, label) = line.split_once(' ').unwrap();
            labels
                .entry(call.to_owned())
                .or_default()
                .push(label.to_owned());
        }
    }
    let total: usize = ROUNDS.iter().map(|(_, n)| n).sum();
    assert_eq!(labels.len(), total);
    let mut in_flight = 0;
    for (call, mut seen) in labels {
        seen.sort();
        assert_eq!(seen.len(), 2, "{call}: {seen:?}");
        assert!(
            seen == ["completed", "in_flight"] || seen == ["completed", "replayed"],
            "{call}: exactly one process executes, the other waits or replays: {seen:?}"
        );
        in_flight += usize::from(seen[1] == "in_flight");
    }
    println!("{total} calls raced; the loser saw in_flight {in_flight} times, replayed the rest");
    // The service's own count: one effect per call, each under its own key.
    let effects = service.effects();
    assert_eq!(effects.len(), total, "effects == calls");
    let mut keys: Vec<_> = effects.iter().map(|e| e.key.clone().unwrap()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), total);

    // A third process afterwards: everything replays, nothing is sent.
    let exec = executor(&db, service.addr());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (round, n) in ROUNDS {
        for out in rt
            .block_on(exec.execute_round(&op(), round, calls(round, n)))
            .unwrap()
        {
            assert!(
                matches!(out, CallOutcome::Completed { replayed: true, .. }),
                "{out:?}"
            );
        }
    }
    assert_eq!(service.effects().len(), total);
}

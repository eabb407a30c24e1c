//! Concurrency: many threads, tasks, sessions and processes race the same calls; exactly one runs.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use async_trait::async_trait;
use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{Begin, Ledger, LedgerConfig};
use toolledger::model::{ExecutionStatus, OperationId, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

// ---------------------------------------------------------------------------
// Many threads and many sessions race the same calls: exactly one Execute.
// ---------------------------------------------------------------------------
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
    wait_until("the go signal", || {
        std::path::Path::new(&format!("{db}.go")).exists()
    });
    let answer = ledger
        .begin(&op("op"), 0, &spec("call_1", "pay", r#"{"amount":1}"#))
        .unwrap();
    let tag = match answer {
        Begin::Execute(_) => "EXECUTE",
        Begin::InFlight { .. } => "INFLIGHT",
        _ => "OTHER",
    };
    std::fs::write(format!("{db}.answer.{pid}"), tag).unwrap();
    wait_until("the done signal", || {
        std::path::Path::new(&format!("{db}.done")).exists()
    });
}

/// The files of `dir` whose name contains `infix`.
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
                .args([
                    "--exact",
                    "concurrency::child_races_begin",
                    "--test-threads=1",
                ])
                .env("TOOLLEDGER_RACE_DB", &db)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_until("four ready children", || {
        files_with(dir.path(), ".ready.").len() == 4
    });
    std::fs::write(format!("{}.go", db.display()), b"").unwrap();
    wait_until("four answers", || {
        files_with(dir.path(), ".answer.").len() == 4
    });
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

// ---------------------------------------------------------------------------
// One model response with several side-effecting calls (row 11 of the
// executor matrix): each call is its own execution with its own downstream
// key, every call commits exactly one effect, and no more than
// `max_parallel` requests are ever in flight at the service.
// ---------------------------------------------------------------------------
#[tokio::test]
async fn six_parallel_calls_are_six_executions_with_six_keys_and_at_most_two_in_flight() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        // Requests wait for a partner, then take a little while, so that
        // any parallelism the executor allows is visible at the service.
        rendezvous: 2,
        latency: Duration::from_millis(20),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("l.db"), LedgerConfig::default()).unwrap();
    let exec = Executor::new(
        Arc::new(ledger),
        ExecutorConfig {
            max_parallel: 2,
            ..fast_config()
        },
    );
    let desc = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("send_invite", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, &service)))
        .unwrap();

    let op = OperationId::new("op_parallel").unwrap();
    let calls: Vec<ToolCall> = (0..6u32)
        .map(|i| ToolCall {
            position: i,
            ..ToolCall::custom(
                format!("call_{i}"),
                "send_invite",
                format!(r#"{{"guest":{i}}}"#),
            )
        })
        .collect();
    let outcomes = exec.execute_round(&op, 0, calls).await.unwrap();

    assert_eq!(outcomes.len(), 6);
    let ids: HashSet<_> = outcomes.iter().map(|o| o.execution_id().clone()).collect();
    assert_eq!(ids.len(), 6, "separate executions");
    for (i, out) in outcomes.iter().enumerate() {
        let CallOutcome::Completed {
            result_json,
            replayed: false,
            ..
        } = out
        else {
            panic!("{out:?}")
        };
        // Outcomes come back in call order.
        assert!(
            result_json.contains(&format!(r#""guest":{i}"#)),
            "{result_json}"
        );
        let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Committed);
        assert_eq!(rec.attempt_count, 1);
    }
    let effects = service.effects();
    assert_eq!(effects.len(), 6);
    let keys: HashSet<_> = effects.iter().map(|e| e.key.clone().unwrap()).collect();
    assert_eq!(keys.len(), 6, "separate keys");
    assert_eq!(service.posts().len(), 6);
    assert_eq!(service.max_concurrent(), 2);
}

// ---------------------------------------------------------------------------
// Two OS processes share one ledger file and race the same tool calls
// through the `Executor` against one counting downstream (a loopback HTTP
// service in the parent): exactly one process executes each call, the
// other sees it in flight or replays its stored result, and the service
// counts exactly one effect per call.
//
// The children are this test binary itself, started with an environment
// variable that turns `child_races_calls` from a no-op into the racer.
// ---------------------------------------------------------------------------
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
    wait_until("go", || Path::new(&format!("{db}.go")).exists());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut lines = String::new();
    for (round, n) in ROUNDS {
        let outcomes = rt
            .block_on(exec.execute_round(&op("op_race"), round, calls(round, n)))
            .unwrap();
        for (call, outcome) in calls(round, n).iter().zip(&outcomes) {
            lines.push_str(&format!("{} {}\n", call.call_id, outcome.label()));
        }
    }
    std::fs::write(&out, lines).unwrap();
    wait_until("done", || Path::new(&format!("{db}.done")).exists());
}

fn spawn_child(db: &Path, addr: SocketAddr, out: &Path) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "concurrency::child_races_calls",
            "--test-threads=1",
        ])
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
    wait_until("children ready", || {
        outs.iter()
            .all(|o| Path::new(&format!("{}.ready", o.display())).exists())
    });
    std::fs::write(format!("{}.go", db.display()), b"").unwrap();
    wait_until("answers", || outs.iter().all(|o| o.exists()));
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
            .block_on(exec.execute_round(&op("op_race"), round, calls(round, n)))
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

/// Child side of the next tests: for each round, waits for the go signal
/// and opens that round's new ledger file (encrypted with one shared key
/// when `TOOLLEDGER_CREATE_KEY` is set), writing what happened.
#[test]
fn child_creates_ledgers() {
    let Ok(dir) = std::env::var("TOOLLEDGER_CREATE_DIR") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let rounds: u32 = std::env::var("TOOLLEDGER_CREATE_ROUNDS")
        .unwrap()
        .parse()
        .unwrap();
    let key = std::env::var("TOOLLEDGER_CREATE_KEY")
        .ok()
        .map(|_| toolledger::ledger::LedgerKey::from_bytes(&[7; 32]).unwrap());
    let pid = std::process::id();
    for round in 0..rounds {
        // Spinning, not sleeping: the children must start within
        // microseconds of each other for the race to be a race.
        let go = dir.join(format!("go.{round}"));
        let deadline = std::time::Instant::now() + PATIENCE;
        while !go.exists() {
            assert!(std::time::Instant::now() < deadline, "no go signal");
            std::hint::spin_loop();
        }
        let path = dir.join(format!("{round}.db"));
        let opened = match &key {
            Some(key) => Ledger::open_encrypted(&path, LedgerConfig::default(), key),
            None => Ledger::open(&path, LedgerConfig::default()),
        };
        let answer = match opened {
            Ok(ledger) => {
                drop(ledger);
                "ok".to_owned()
            }
            Err(e) => e.to_string(),
        };
        // Written whole, then renamed: the parent never reads half of it.
        let partial = dir.join(format!("partial.{round}.{pid}"));
        std::fs::write(&partial, answer).unwrap();
        std::fs::rename(&partial, dir.join(format!("answer.{round}.{pid}"))).unwrap();
    }
}

/// `children` processes open `rounds` new files in lock-step (each round's
/// file by all of them at once); the answers that were not "ok".
fn create_in_lock_step(children: usize, rounds: u32, encrypted: bool) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let mut procs: Vec<_> = (0..children)
        .map(|_| {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap());
            child
                .args([
                    "--exact",
                    "concurrency::child_creates_ledgers",
                    "--test-threads=1",
                ])
                .env("TOOLLEDGER_CREATE_DIR", dir.path())
                .env("TOOLLEDGER_CREATE_ROUNDS", rounds.to_string())
                .stdout(std::process::Stdio::null());
            if encrypted {
                child.env("TOOLLEDGER_CREATE_KEY", "1");
            }
            child.spawn().unwrap()
        })
        .collect();
    let mut failed = Vec::new();
    for round in 0..rounds {
        std::fs::write(dir.path().join(format!("go.{round}")), b"").unwrap();
        let infix = format!("answer.{round}.");
        wait_until("every answer", || {
            files_with(dir.path(), &infix).len() == children
        });
        for answer in files_with(dir.path(), &infix) {
            let text = std::fs::read_to_string(&answer).unwrap();
            if text != "ok" {
                failed.push(format!("round {round}: {text}"));
            }
        }
    }
    for child in procs.iter_mut() {
        assert!(child.wait().unwrap().success());
    }
    failed
}

/// Processes (an app and its extensions) opening the same ledger file for
/// the first time at the same moment, round after round: every one opens
/// it every time, plain and encrypted under one key. Creating the file
/// switches it from SQLite's rollback journal to WAL and migrates it, and
/// there SQLite answers one of two writers "busy" at once, without waiting,
/// to avoid a deadlock; the store tries again within its busy timeout.
/// (Before it did, 4 of 150 rounds of two processes failed one of them.)
#[test]
fn processes_creating_one_file_at_once_all_open_it() {
    assert_eq!(create_in_lock_step(2, 150, false), Vec::<String>::new());
    assert_eq!(create_in_lock_step(3, 60, false), Vec::<String>::new());
    assert_eq!(create_in_lock_step(3, 60, true), Vec::<String>::new());
}

/// Opening gives up within about one busy timeout, however the tries fall:
/// a file still in SQLite's rollback journal (another tool's empty
/// database), a writer holding its lock and a reader its own. The opener is
/// answered busy at once (it holds a read lock and wants to write) until
/// the writer lets go just before the timeout; the next try then waits in
/// SQLite's busy handler for the reader, only for what is left of the
/// timeout. (A first version gave each try a whole timeout: 1.17 s for a
/// timeout of 600 ms.)
#[test]
fn opening_never_waits_much_longer_than_the_busy_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    // A ledger left in rollback-journal mode: the opener's switch to WAL
    // needs the exclusive lock that the reader below keeps from it.
    drop(Ledger::open(&path, LedgerConfig::default()).unwrap());
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("PRAGMA journal_mode=DELETE;").unwrap();
    }
    let busy = Duration::from_millis(600);
    let writer = rusqlite::Connection::open(&path).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE;").unwrap();
    let reader = rusqlite::Connection::open(&path).unwrap();
    reader
        .execute_batch("BEGIN; SELECT count(*) FROM operations;")
        .unwrap();
    let opener = {
        let path = path.clone();
        thread::spawn(move || {
            let started = std::time::Instant::now();
            let opened = Ledger::open(
                &path,
                LedgerConfig {
                    busy_timeout: busy,
                    ..LedgerConfig::default()
                },
            )
            .map(drop);
            (opened, started.elapsed())
        })
    };
    thread::sleep(busy - Duration::from_millis(60));
    writer.execute_batch("ROLLBACK;").unwrap();
    let (opened, took) = opener.join().unwrap();
    drop(reader);
    assert!(
        matches!(opened, Err(toolledger::ledger::Error::Store(ref e)) if e.to_string().contains("locked")),
        "the reader held its lock throughout: {opened:?}"
    );
    assert!(
        took < busy + busy / 2,
        "opening with a busy timeout of {busy:?} waited {took:?}"
    );
}

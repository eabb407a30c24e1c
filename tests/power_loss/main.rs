//! Power cuts: the durability policy under simulated power loss.
//!
//! The ledger runs on an in-memory disk behind a SQLite VFS
//! (`toolledger_test_support::power_vfs`) that keeps every write since a
//! file's last sync apart. Each seed draws a workload — single calls, rounds
//! of three (those at odd positions of the plan caller-driven:
//! `start_round`, each call walked by the workload), independent batches, approvals, background jobs finished by
//! webhooks (delivered twice), calls through the Ledger API, replays,
//! deadline syncs, suspend/resume, recovery and checkpoints by another
//! process's connection (the WAL then starts over) — over tools of the three
//! downstream classes (idempotency key that never expires, lookup,
//! neither). It runs the workload once without a cut to count the disk's
//! mutating operations, then again for each cut: the power goes off before
//! a seeded operation (or after the last one), the disk keeps what a seeded
//! loss model lets survive of the unsynced writes (none, a prefix, any
//! subset, or torn writes), the machine reboots and a fresh process
//! recovers, asks for every call again and settles everything.
//!
//! Checked after every cut:
//! - the database opens, and `PRAGMA integrity_check` says ok;
//! - on reopening, before any recovery: every downstream effect has its
//!   execution (the intent was durable before the request), every approval
//!   and every background job that was acknowledged is there, and every
//!   acknowledged commit of a neither-tool is committed with its result
//!   (with the policy off: every acknowledged commit of every tool);
//! - after recovery: at most one effect per logical call (per batch item),
//!   every acknowledged result is committed byte for byte, committed ⇔ an
//!   effect, and no call of a key or lookup tool needed the app to resolve
//!   it (reconciliation alone repaired every lost commit).
//!
//! `TOOLLEDGER_POWER_SEEDS=<n>` runs n seeds (CI default below, each with
//! several cuts); `TOOLLEDGER_POWER_SEED=<seed>` replays one, printing what
//! it did. A failing seed prints itself, its cut and the replay command.

mod durable_edges;
mod failed_sync;
mod failed_sync_autocheckpoint;
mod failed_sync_suspend;
mod idle_checkpoint;
mod key_lifetime;
mod key_retry;
mod lifecycle_race;
mod loss_models;
mod world;

use std::sync::Arc;
use std::time::Duration;

use toolledger::ledger::{DeferredCommits, IdleCheckpoint, LedgerConfig};
use toolledger_test_support::power_vfs::{Loss, Machine};
use world::{Plan, Rng};

/// Seeds per CI run, and cuts per seed.
const CI_SEEDS: u64 = 400;
const CUTS_PER_SEED: u64 = 6;
const BASE_SEED: u64 = 17_000;

/// The ledger configuration of one run: the policy on (the default) or off
/// (every commit durable: the two-sync path), no background thread (the
/// workload makes the deadline pass explicitly, and checkpoints happen only
/// where it asks for them or SQLite makes one in a commit, so a seed replays
/// exactly).
fn config(machine: &Machine, deferred: bool) -> LedgerConfig {
    LedgerConfig {
        deferred_commits: DeferredCommits {
            enabled: deferred,
            deadline: Duration::MAX,
            reconcile_within: None,
        },
        idle_checkpoint: IdleCheckpoint::OFF,
        sqlite_vfs: Some(machine.vfs_name().to_owned()),
        ..LedgerConfig::default()
    }
}

/// What one seed found.
#[derive(Debug, Default)]
struct Tally {
    cuts: u64,
    cuts_inside: u64,
    acked: u64,
    effects: u64,
    reconciled: u64,
}

/// Runs seed `seed`: a dry run, then `cuts` runs with a power cut each.
/// `deferred`: the policy on; `lie`: the neither-tools declare a key that
/// never expires (a wrong declaration, which the checks must catch).
fn run_seed(
    seed: u64,
    cuts: u64,
    deferred: bool,
    lie: bool,
    verbose: bool,
) -> Result<Tally, String> {
    let plan = Plan::draw(seed);
    if verbose {
        println!("seed={seed} plan: {:?}", plan.steps);
    }
    // The dry run: no cut; counts the disk's operations.
    let dry = world::run(&plan, None, Loss::All, seed, deferred, lie, verbose)
        .map_err(|e| format!("dry run: {e}"))?;
    let mut tally = Tally::default();
    let mut rng = Rng::new(seed ^ 0xC0FF_EE00);
    for cut in 0..cuts {
        // Before operation k (1..=ops), or after the last one.
        let k = 1 + rng.below(dry.ops + 1);
        let loss = Loss::ALL[rng.below(4) as usize];
        let cut_seed = seed.wrapping_mul(1_000).wrapping_add(cut);
        let found =
            world::run(&plan, Some(k), loss, cut_seed, deferred, lie, verbose).map_err(|e| {
                format!(
                    "cut {cut} (before operation {k} of {}, loss {loss:?}): {e}",
                    dry.ops
                )
            })?;
        tally.cuts += 1;
        tally.cuts_inside += u64::from(k <= dry.ops);
        tally.acked += found.acked;
        tally.effects += found.effects;
        tally.reconciled += found.reconciled;
    }
    Ok(tally)
}

fn seeds_from_env(default: u64) -> u64 {
    std::env::var("TOOLLEDGER_POWER_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

fn run_many(name: &str, deferred: bool, seeds: u64) {
    if let Ok(seed) = std::env::var("TOOLLEDGER_POWER_SEED") {
        let seed: u64 = seed.parse().expect("TOOLLEDGER_POWER_SEED is a number");
        match run_seed(seed, CUTS_PER_SEED, deferred, false, true) {
            Ok(t) => println!("{name} seed={seed} cuts={} ok", t.cuts),
            Err(e) => panic!("{name} seed={seed}: {e}"),
        }
        return;
    }
    let mut total = Tally::default();
    for seed in BASE_SEED..BASE_SEED + seeds {
        match run_seed(seed, CUTS_PER_SEED, deferred, false, false) {
            Ok(t) => {
                total.cuts += t.cuts;
                total.cuts_inside += t.cuts_inside;
                total.acked += t.acked;
                total.effects += t.effects;
                total.reconciled += t.reconciled;
            }
            Err(e) => panic!(
                "{name} seed={seed}: {e}\nreplay: TOOLLEDGER_POWER_SEED={seed} cargo test --test power_loss {name} -- --nocapture"
            ),
        }
    }
    println!(
        "{name}: seeds={seeds} cuts={} (inside the workload {}) acknowledged_results={} effects={} commits_reconciled={} duplicates=0 lost=0",
        total.cuts, total.cuts_inside, total.acked, total.effects, total.reconciled
    );
}

#[test]
fn power_cuts_never_duplicate_an_effect_or_lose_a_result_with_deferred_commits() {
    run_many("deferred", true, seeds_from_env(CI_SEEDS));
}

#[test]
fn power_cuts_never_duplicate_an_effect_or_lose_a_result_with_every_commit_durable() {
    // The two-sync path: fewer seeds, it is the simpler case.
    run_many("durable", false, seeds_from_env(CI_SEEDS) / 4);
}

/// A neither-tool that declares a key that never expires has its commit
/// deferred although nothing downstream dedupes: a lost commit is then
/// resent blindly. The simulation must catch that.
#[test]
fn a_wrong_declaration_that_defers_a_neither_commit_is_caught() {
    let mut caught = None;
    for seed in BASE_SEED..BASE_SEED + 200 {
        if let Err(e) = run_seed(seed, CUTS_PER_SEED, true, true, false) {
            caught = Some((seed, e));
            break;
        }
    }
    let (seed, e) = caught.expect("no seed caught a deferred neither-commit");
    println!("caught at seed {seed}: {e}");
    assert!(
        e.contains("effects") || e.contains("lost"),
        "caught for another reason: {e}"
    );
}

/// The deadline thread makes a deferred commit durable on its own.
#[test]
fn a_deferred_commit_becomes_durable_by_its_deadline() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&machine, true);
    config.deferred_commits.deadline = Duration::from_millis(50);
    let ledger =
        Arc::new(toolledger::ledger::Ledger::open(&dir.path().join("l.db"), config).unwrap());
    let op = toolledger::model::OperationId::new("op").unwrap();
    let call = toolledger::model::ToolCall::custom("c1", "pay", r#"{"a":1}"#);
    let spec = toolledger::ledger::CallSpec::new(call, 1)
        .with_downstream(toolledger::ledger::Downstream::lookup());
    let toolledger::ledger::Begin::Execute(ticket) = ledger.begin(&op, 0, &spec).unwrap() else {
        panic!("not executed");
    };
    let syncs = machine.syncs();
    ledger.commit(&ticket.attempt_id(), "{}", None).unwrap();
    assert_eq!(machine.syncs(), syncs, "the commit itself does not sync");
    assert!(ledger.has_unsynced_commits());
    let started = std::time::Instant::now();
    while ledger.has_unsynced_commits() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the deadline thread never synced"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(machine.syncs(), syncs + 1, "one sync, by the deadline");
    // Nothing lost when the power goes now.
    machine.cut_now();
    ledger.abandon();
    drop(ledger);
    machine.restart(Loss::All, &mut |_| 0);
    let again =
        toolledger::ledger::Ledger::open(&dir.path().join("l.db"), self::config(&machine, true))
            .unwrap();
    let rec = again.get(&ticket.execution_id).unwrap().unwrap();
    assert!(rec.status.is_committed(), "{}", rec.status);
}

/// In a steady stream of calls each deferred commit rides the next call's
/// durable intent, and the deadline counts from the oldest commit still not
/// durable: the deadline thread adds no sync of its own while calls keep
/// coming (it used to make one per deadline, counted from the first commit
/// of the stream), and exactly one after the stream stops.
#[test]
fn the_deadline_thread_adds_no_sync_to_a_steady_stream() {
    use toolledger::ledger::{Begin, CallSpec, Downstream};
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&machine, true);
    let deadline = Duration::from_millis(250);
    config.deferred_commits.deadline = deadline;
    let ledger = toolledger::ledger::Ledger::open(&dir.path().join("l.db"), config).unwrap();
    let op = toolledger::model::OperationId::new("op").unwrap();
    let syncs = machine.syncs();
    let db_syncs = machine.syncs_of("l.db");
    let started = std::time::Instant::now();
    let mut last_commit = started;
    let mut longest_gap = Duration::ZERO;
    let mut calls = 0u64;
    // Three deadlines' worth of calls, few enough (at most 100) that the
    // WAL does not fill up to a checkpoint (which syncs of its own).
    while started.elapsed() < deadline * 3 && calls < 100 {
        let call = toolledger::model::ToolCall::custom(format!("c{calls}"), "pay", "{}");
        let spec = CallSpec::new(call, 1).with_downstream(Downstream::lookup());
        let Begin::Execute(t) = ledger.begin(&op, 0, &spec).unwrap() else {
            panic!("not executed");
        };
        longest_gap = longest_gap.max(last_commit.elapsed());
        ledger.commit(&t.attempt_id(), "{}", None).unwrap();
        last_commit = std::time::Instant::now();
        calls += 1;
        std::thread::sleep(Duration::from_millis(8));
    }
    let during = machine.syncs() - syncs;
    assert_eq!(
        machine.syncs_of("l.db"),
        db_syncs,
        "no checkpoint ran (it syncs of its own)"
    );
    // A stall of the machine longer than the deadline between a commit and
    // the next intent would rightly let the thread sync once.
    if longest_gap < deadline {
        assert_eq!(
            during, calls,
            "one sync per call ({calls} calls), none of the thread's"
        );
    }
    assert!(ledger.has_unsynced_commits(), "the last commit waits");
    let waited = std::time::Instant::now();
    while ledger.has_unsynced_commits() {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the deadline thread never synced the last commit"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        machine.syncs() - syncs,
        during + 1,
        "one sync for the last commit"
    );
}

/// With the policy's default declarations, a key-only tool with an
/// undeclared or 24-hour key keeps a durable commit: two syncs; a lookup
/// tool one.
#[test]
fn the_policy_counts_one_sync_for_a_deferrable_call_and_two_otherwise() {
    use toolledger::ledger::{Begin, CallSpec, Downstream, Ledger};
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("l.db"), config(&machine, true)).unwrap();
    let op = toolledger::model::OperationId::new("op").unwrap();
    let day = Duration::from_secs(86_400);
    let cases = [
        ("neither", Downstream::default(), 2),
        ("key24h", Downstream::keyed(day), 2),
        ("key_forever", Downstream::keyed(Duration::MAX), 1),
        ("lookup", Downstream::lookup(), 1),
    ];
    for (round, (name, downstream, want)) in cases.into_iter().enumerate() {
        // The previous call's deferred commit rides this begin's sync.
        let call = toolledger::model::ToolCall::custom(format!("c_{name}"), name, "{}");
        let spec = CallSpec::new(call, 1).with_downstream(downstream);
        let before = machine.syncs();
        let Begin::Execute(t) = ledger.begin(&op, round as u32, &spec).unwrap() else {
            panic!("not executed");
        };
        ledger.commit(&t.attempt_id(), "{}", None).unwrap();
        ledger
            .mark_delivered(std::slice::from_ref(&t.execution_id))
            .unwrap();
        assert_eq!(machine.syncs() - before, want, "{name}");
    }
}

/// Begins and commits `n` calls of a lookup tool (each commit deferred);
/// returns their ids with the result each was acknowledged with.
fn deferred_calls(
    ledger: &toolledger::ledger::Ledger,
    round: u32,
    n: usize,
) -> Vec<(toolledger::model::ExecutionId, String)> {
    use toolledger::ledger::{Begin, CallSpec, Downstream};
    let op = toolledger::model::OperationId::new("op").unwrap();
    (0..n)
        .map(|i| {
            let call = toolledger::model::ToolCall::custom(
                format!("c{round}_{i}"),
                "pay",
                format!(r#"{{"n":{i}}}"#),
            );
            let spec = CallSpec::new(call, 1).with_downstream(Downstream::lookup());
            let Begin::Execute(t) = ledger.begin(&op, round, &spec).unwrap() else {
                panic!("not executed");
            };
            let result = format!(r#"{{"paid":{i}}}"#);
            ledger.commit(&t.attempt_id(), &result, None).unwrap();
            (t.execution_id, result)
        })
        .collect()
}

/// The power goes off now (every write since its file's last sync is
/// lost), the machine restarts and a new process opens the ledger file.
fn cut_and_reopen(
    machine: &Machine,
    ledger: toolledger::ledger::Ledger,
    path: &std::path::Path,
) -> toolledger::ledger::Ledger {
    machine.cut_now();
    ledger.abandon();
    drop(ledger);
    machine.restart(Loss::All, &mut |_| 0);
    toolledger::ledger::Ledger::open(path, config(machine, true)).unwrap()
}

/// The acknowledged commits (ids and results) that `ledger` does not hold
/// as committed with that result.
fn lost_commits(
    ledger: &toolledger::ledger::Ledger,
    acked: &[(toolledger::model::ExecutionId, String)],
) -> Vec<String> {
    acked
        .iter()
        .filter(|(id, result)| {
            let rec = ledger.get(id).unwrap().expect("the intent was durable");
            !rec.status.is_committed() || rec.result_json.as_deref() != Some(result.as_str())
        })
        .map(|(id, _)| id.to_string())
        .collect()
}

/// `suspend()` makes every deferred commit durable: a power cut right after
/// it, losing every unsynced write, loses no commit; and nothing is written
/// while suspended, the deadline thread included.
#[test]
fn suspend_makes_every_deferred_commit_durable_and_nothing_writes_while_suspended() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let mut cfg = config(&machine, true);
    cfg.deferred_commits.deadline = Duration::from_millis(30);
    let ledger = toolledger::ledger::Ledger::open(&path, cfg).unwrap();
    // The last call's commit is deferred and still unsynced.
    let acked = deferred_calls(&ledger, 0, 3);
    assert!(ledger.has_unsynced_commits());
    ledger.suspend().unwrap();
    assert!(!ledger.has_unsynced_commits());
    // Past the deadline several times over: the thread writes nothing.
    let ops = machine.ops();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(machine.ops(), ops, "a write while suspended");
    let again = cut_and_reopen(&machine, ledger, &path);
    assert_eq!(lost_commits(&again, &acked), Vec::<String>::new());
}

/// Dropping the ledger makes its deferred commits durable and ends the
/// deadline thread: nothing is written after the drop returns, even past
/// the deadline, and a power cut then loses nothing.
#[test]
fn the_deadline_thread_ends_with_the_ledger_and_writes_nothing_after_it() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let mut cfg = config(&machine, true);
    cfg.deferred_commits.deadline = Duration::from_millis(30);
    let ledger = toolledger::ledger::Ledger::open(&path, cfg).unwrap();
    let acked = deferred_calls(&ledger, 0, 2);
    assert!(ledger.has_unsynced_commits());
    drop(ledger);
    let ops = machine.ops();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(machine.ops(), ops, "a write after the ledger was dropped");
    machine.cut_now();
    machine.restart(Loss::All, &mut |_| 0);
    let again = toolledger::ledger::Ledger::open(&path, config(&machine, true)).unwrap();
    assert_eq!(lost_commits(&again, &acked), Vec::<String>::new());
}

/// Without a sync, suspend or deadline, a power cut does lose a deferred
/// commit (the simulation sees the loss it checks for), and recovery
/// reconciles it: the lookup finds the effect, the same result and external
/// id are committed, and no second request is sent.
#[test]
fn a_deferred_commit_lost_to_a_cut_is_reconciled_to_the_same_result() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use toolledger::executor::{
        CallOutcome, Executor, ExecutorConfig, LookupOutcome, PerformOutcome, ToolDescriptor,
        ToolError, ToolHandler, ToolRequest,
    };

    struct Pay {
        sent: Arc<AtomicU32>,
    }
    #[async_trait::async_trait]
    impl ToolHandler for Pay {
        fn descriptor(&self) -> ToolDescriptor {
            ToolDescriptor {
                lookup: true,
                ..ToolDescriptor::side_effect("pay", 1)
            }
        }
        async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
            self.sent.fetch_add(1, Ordering::SeqCst);
            Ok(PerformOutcome::Committed {
                result_json: r#"{"paid":true}"#.into(),
                external_id: Some("pay_1".into()),
            })
        }
        async fn lookup(&self, _req: ToolRequest) -> Result<LookupOutcome, ToolError> {
            Ok(if self.sent.load(Ordering::SeqCst) > 0 {
                LookupOutcome::Found {
                    result_json: r#"{"paid":true}"#.into(),
                    external_id: Some("pay_1".into()),
                }
            } else {
                LookupOutcome::NotFound
            })
        }
    }
    fn completed(out: &CallOutcome) -> (toolledger::model::ExecutionId, String, Option<String>) {
        match out {
            CallOutcome::Completed {
                execution_id,
                result_json,
                external_id,
                ..
            } => (
                execution_id.clone(),
                result_json.clone(),
                external_id.clone(),
            ),
            other => panic!("not completed: {other:?}"),
        }
    }
    let open = |machine: &Machine, path: &std::path::Path, sent: &Arc<AtomicU32>| {
        let ledger =
            Arc::new(toolledger::ledger::Ledger::open(path, config(machine, true)).unwrap());
        let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
        executor
            .register(Arc::new(Pay { sent: sent.clone() }))
            .unwrap();
        (ledger, executor)
    };

    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let sent = Arc::new(AtomicU32::new(0));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let op = toolledger::model::OperationId::new("op").unwrap();
    let call = toolledger::model::ToolCall::custom("c1", "pay", r#"{"a":1}"#);
    let first = {
        let (ledger, executor) = open(&machine, &path, &sent);
        let out = rt.block_on(executor.execute(&op, 0, call.clone())).unwrap();
        assert!(ledger.has_unsynced_commits(), "the commit was deferred");
        // The power goes before anything synced the commit.
        machine.cut_now();
        ledger.abandon();
        completed(&out)
    };
    machine.restart(Loss::All, &mut |_| 0);
    let (ledger, executor) = open(&machine, &path, &sent);
    let id = first.0.clone();
    let rec = ledger.get(&id).unwrap().expect("the intent was durable");
    assert!(
        !rec.status.is_committed(),
        "the cut lost the commit: {}",
        rec.status
    );
    ledger.recover().unwrap();
    let again = rt.block_on(executor.execute(&op, 0, call)).unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 1, "a second request was sent");
    assert_eq!(completed(&again), first);
    let rec = ledger.get(&id).unwrap().unwrap();
    assert!(rec.status.is_committed(), "{}", rec.status);
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"paid":true}"#));
    assert_eq!(rec.external_id.as_deref(), Some("pay_1"));
}

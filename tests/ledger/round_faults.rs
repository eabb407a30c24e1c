//! Rounds (`Executor::start_round`, `Executor::execute_round`) under storage
//! and process faults: a disk that fills up at each point of a round (before
//! or during its begin, between the begin and the performs, between one
//! call's commit and the next, during the delivery marks), a round's owner
//! process stopped (SIGSTOP: alive, holding its lock) while another process
//! asks for the same calls, and one killed (SIGKILL) mid-round whose round
//! a new process asks for again.
//!
//! Effects are counted at the loopback downstream. Where a second effect
//! must be visible, the downstream has no idempotency store (every POST is
//! an effect) and the tool declares neither key nor lookup, or a lookup
//! only.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use downstream::{Behaviour, Downstream};
use support::*;
use toolledger::executor::{
    CallOutcome, CallerAttempt, CallerStep, Error as ExecError, Executor, ExecutorConfig,
    LookupOutcome, PerformOutcome, ToolDescriptor, ToolError, ToolHandler, ToolRequest,
};
use toolledger::ledger::{
    Error as LedgerError, IdleCheckpoint, Ledger, LedgerConfig, StorageError,
};
use toolledger::model::{ExecutionId, ExecutionStatus, ToolCall};
// The caller's tool (`POST /effects` with the downstream key) and its
// lookup (`GET /effects?key=…`), as the caller-driven tests run them.
use crate::caller_driven::{lookup_at as look, perform_at as post};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

/// The landing window of the lookup tool: short, so a wrong takeover would
/// have the time to resend inside a test.
const WINDOW: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------
// Tools and the caller's walk
// ---------------------------------------------------------------------------

/// What the tool's downstream offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Neither key nor lookup; the downstream does not dedupe.
    Neither,
    /// An idempotency key; the downstream dedupes by it.
    Key,
    /// A lookup and no key; the downstream does not dedupe.
    Lookup,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Neither => "neither",
            Class::Key => "key",
            Class::Lookup => "lookup",
        }
    }

    fn parse(s: &str) -> Class {
        match s {
            "neither" => Class::Neither,
            "key" => Class::Key,
            "lookup" => Class::Lookup,
            other => panic!("no class {other}"),
        }
    }

    fn descriptor(self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: self == Class::Key,
            lookup: self == Class::Lookup,
            landing_window: WINDOW,
            ..ToolDescriptor::side_effect("pay", 1)
        }
    }

    fn service(self) -> Downstream {
        Downstream::start(Behaviour {
            idempotency: self == Class::Key,
            ..Default::default()
        })
    }
}

/// A tool the caller runs itself (caller-driven): the executor never calls
/// it back; every call of `perform` or `lookup` is counted (and must not
/// happen).
struct CallerRun {
    desc: ToolDescriptor,
    callbacks: AtomicUsize,
}

#[async_trait]
impl ToolHandler for CallerRun {
    fn descriptor(&self) -> ToolDescriptor {
        self.desc.clone()
    }
    async fn perform(&self, _: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.callbacks.fetch_add(1, Ordering::SeqCst);
        Err(ToolError::new("caller-driven tool called back"))
    }
    async fn lookup(&self, _: ToolRequest) -> Result<LookupOutcome, ToolError> {
        self.callbacks.fetch_add(1, Ordering::SeqCst);
        Err(ToolError::new("caller-driven tool called back"))
    }
}

fn caller_executor(ledger: Ledger, class: Class) -> (Executor, Arc<CallerRun>) {
    let exec = Executor::new(Arc::new(ledger), downstream::fast_config());
    let tool = Arc::new(CallerRun {
        desc: class.descriptor(),
        callbacks: AtomicUsize::new(0),
    });
    exec.register(tool.clone()).unwrap();
    (exec, tool)
}

/// Walks one call's steps to its answer, running the tool inline; the first
/// error of a step is returned (a full disk).
fn walk(exec: &Executor, addr: SocketAddr, first: CallerStep) -> Result<CallOutcome, ExecError> {
    let mut step = first;
    for _ in 0..20 {
        step = match step {
            CallerStep::Done(outcome) => return Ok(outcome),
            CallerStep::Perform(a) => exec.report(&a, post(addr, &a.request))?,
            CallerStep::Lookup(a) => exec.report_lookup(&a, look(addr, &a.request))?,
            CallerStep::Retry { attempt, after } => {
                std::thread::sleep(after);
                exec.retry(&attempt)?
            }
        };
    }
    panic!("the call did not settle in 20 steps");
}

fn walk_round(
    exec: &Executor,
    addr: SocketAddr,
    steps: Vec<CallerStep>,
) -> Vec<Result<CallOutcome, ExecError>> {
    steps.into_iter().map(|s| walk(exec, addr, s)).collect()
}

fn pay_call(n: u32) -> ToolCall {
    let mut c = call(
        &format!("call_{n}"),
        "pay",
        &format!(r#"{{"amount":"{n}.00"}}"#),
    );
    c.position = n;
    c
}

fn round(n: u32) -> Vec<ToolCall> {
    (0..n).map(pay_call).collect()
}

const OP: &str = "op_round";

fn perform_of(step: &CallerStep) -> CallerAttempt {
    match step {
        CallerStep::Perform(a) if !a.read_only => a.clone(),
        other => panic!("expected a side-effecting Perform, got {other:?}"),
    }
}

fn is_disk_full(err: &ExecError) -> bool {
    matches!(
        err,
        ExecError::Ledger(LedgerError::Store(StorageError::DiskFull))
    )
}

#[track_caller]
fn assert_disk_full<T: std::fmt::Debug>(r: Result<T, ExecError>) {
    match r {
        Err(e) if is_disk_full(&e) => {}
        other => panic!("expected StorageError::DiskFull, got {other:?}"),
    }
}

/// The stored status of every call of round `round` of [`OP`], in call order.
fn statuses(ledger: &Ledger, round: u32) -> Vec<ExecutionStatus> {
    let mut recs: Vec<_> = ledger
        .list(&op(OP))
        .unwrap()
        .into_iter()
        .filter(|r| r.round == round)
        .collect();
    recs.sort_by_key(|r| r.position);
    recs.into_iter().map(|r| r.status).collect()
}

/// The stored result of each call of round `round` (None if not committed).
fn results(ledger: &Ledger, round: u32) -> Vec<Option<String>> {
    let mut recs: Vec<_> = ledger
        .list(&op(OP))
        .unwrap()
        .into_iter()
        .filter(|r| r.round == round)
        .collect();
    recs.sort_by_key(|r| r.position);
    recs.into_iter()
        .map(|r| {
            r.status
                .is_committed()
                .then(|| r.result_json.unwrap_or_default())
        })
        .collect()
}

/// The effect id (`eff_N`) in a downstream answer.
fn effect_id(result: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(result).unwrap();
    v["effect_id"].as_str().unwrap().to_owned()
}

/// The number of effects at the downstream per downstream key of round
/// `round`'s calls, in call order.
fn effects_per_call(service: &Downstream, ledger: &Ledger, round: u32) -> Vec<usize> {
    let effects = service.effects();
    let mut recs: Vec<_> = ledger
        .list(&op(OP))
        .unwrap()
        .into_iter()
        .filter(|r| r.round == round)
        .collect();
    recs.sort_by_key(|r| r.position);
    recs.iter()
        .map(|r| {
            effects
                .iter()
                .filter(|e| e.key.as_deref() == Some(r.downstream_key.as_str()))
                .count()
        })
        .collect()
}

fn replayed(out: &CallOutcome) -> Option<&str> {
    match out {
        CallOutcome::Completed {
            replayed: true,
            result_json,
            ..
        } => Some(result_json),
        _ => None,
    }
}

/// Every committed call's stored result names the one effect at the
/// downstream with its key.
fn results_match_effects(service: &Downstream, ledger: &Ledger, round: u32) {
    let effects = service.effects();
    for rec in ledger.list(&op(OP)).unwrap() {
        if rec.round != round || !rec.status.is_committed() {
            continue;
        }
        let result = rec.result_json.clone().unwrap_or_default();
        let effect = effects
            .iter()
            .find(|e| e.id == effect_id(&result))
            .unwrap_or_else(|| panic!("no effect for {result}"));
        assert_eq!(
            effect.key.as_deref(),
            Some(rec.downstream_key.as_str()),
            "{rec:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// A full disk (a size-limited tmpfs, filled)
// ---------------------------------------------------------------------------

/// A mount that is undone on drop.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A 2 MB tmpfs on a new temporary directory; `None` (the test is skipped,
/// saying so) where it cannot be mounted.
fn small_disk() -> Option<(tempfile::TempDir, Mount)> {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(tmp.path())
        .output()
        .ok()?;
    if !out.status.success() {
        println!(
            "SKIPPED: cannot mount a tmpfs ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return None;
    }
    let mount = Mount(tmp.path().to_path_buf());
    Some((tmp, mount))
}

/// Fills the filesystem holding `dir` with one file until ENOSPC, and keeps
/// topping it up until 20 writes in a row, over about 40 ms, found no room:
/// tmpfs counts its blocks per CPU, and space freed on another CPU (a file
/// SQLite deleted or truncated a moment ago) can show up after the first
/// ENOSPC, letting a later write of the test through.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let chunk = vec![0xA5u8; 4096];
    let mut refused = 0;
    for _ in 0..200_000 {
        if refused >= 20 {
            break;
        }
        if f.write_all(&chunk).is_ok() && f.write_all(&[0u8; 1]).is_ok() {
            refused = 0;
        } else {
            refused += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert!(refused >= 20, "the disk never filled");
    path
}

/// Removes the filler and waits (bounded) until 256 KB can be written
/// again (the freed blocks counted on every CPU).
fn unfill(filler: &Path) {
    std::fs::remove_file(filler).unwrap();
    let probe = filler.with_file_name("probe");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let fits = std::fs::write(&probe, vec![0u8; 256 * 1024]).is_ok();
        let _ = std::fs::remove_file(&probe);
        if fits {
            return;
        }
        assert!(Instant::now() < deadline, "the freed space never came back");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The ledger configuration of the full-disk tests: the idle checkpoint is
/// off, so that a WAL backfilled behind a test's back cannot be written over
/// in place (a write that needs no new space) on the "full" disk.
fn disk_config() -> LedgerConfig {
    LedgerConfig {
        idle_checkpoint: IdleCheckpoint::OFF,
        ..LedgerConfig::default()
    }
}

/// A caller-driven executor on a ledger in `dir`, its WAL checkpointed and
/// truncated (so that the next write must grow a file).
fn disk_executor(dir: &Path, class: Class) -> (Executor, Arc<CallerRun>) {
    let ledger = Ledger::open(&dir.join("ledger.db"), disk_config()).unwrap();
    let (exec, tool) = caller_executor(ledger, class);
    settle_wal(&exec);
    (exec, tool)
}

fn settle_wal(exec: &Executor) {
    exec.ledger().suspend().unwrap();
    exec.ledger().resume().unwrap();
}

/// Before (and during) the round's begin: a full disk, then a disk with room
/// for part of the begin's transaction only. Each time the round is refused
/// with `DiskFull`, nothing of it is recorded and nothing is sent; once
/// there is room, every call runs once, and a repeat replays.
#[test]
fn a_disk_full_before_or_during_the_rounds_begin_records_and_sends_nothing() {
    let Some((_tmp, mount)) = small_disk() else {
        return;
    };
    let service = Class::Neither.service();
    let addr = service.addr();
    let (exec, tool) = disk_executor(&mount.0, Class::Neither);
    // 40 calls with 4 KB of arguments each: the begin needs more than 160 KB
    // of WAL.
    let big_round: Vec<ToolCall> = (0..40)
        .map(|n| {
            let mut c = call(
                &format!("call_{n}"),
                "pay",
                &format!(r#"{{"amount":"{n}.00","memo":"{}"}}"#, "m".repeat(4000)),
            );
            c.position = n;
            c
        })
        .collect();
    let filler = fill(&mount.0);
    assert_disk_full(exec.start_round(&op(OP), 0, big_round.clone()));
    assert_disk_full(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(exec.execute_round(&op(OP), 0, big_round.clone())),
    );
    assert!(exec.ledger().list(&op(OP)).unwrap().is_empty());
    // Room for 64 KB: a part of the begin's frames fits, not all of them.
    let len = std::fs::metadata(&filler).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap()
        .set_len(len.saturating_sub(64 * 1024))
        .unwrap();
    assert_disk_full(exec.start_round(&op(OP), 0, big_round.clone()));
    assert!(
        exec.ledger().list(&op(OP)).unwrap().is_empty(),
        "a begin cut by the full disk left no intent"
    );
    assert_eq!(service.posts().len(), 0, "nothing sent without its intent");
    unfill(&filler);
    let steps = exec.start_round(&op(OP), 0, big_round.clone()).unwrap();
    assert_eq!(steps.len(), 40);
    for out in walk_round(&exec, addr, steps) {
        let out = out.unwrap();
        assert!(
            matches!(
                out,
                CallOutcome::Completed {
                    replayed: false,
                    ..
                }
            ),
            "{out:?}"
        );
    }
    assert_eq!(service.effects().len(), 40);
    assert!(effects_per_call(&service, exec.ledger(), 0)
        .iter()
        .all(|n| *n == 1));
    let again = exec.start_round(&op(OP), 0, big_round).unwrap();
    assert!(again
        .iter()
        .all(|s| matches!(s, CallerStep::Done(o) if replayed(o).is_some())));
    assert_eq!(service.posts().len(), 40, "a replay sends nothing");
    assert_eq!(tool.callbacks.load(Ordering::SeqCst), 0);
}

/// Between the begin and the performs: every intent is durable, the disk
/// fills, the caller runs every tool (three effects) and none of the
/// reports can be recorded (`DiskFull`, typed). A repeat while the disk is
/// full fails the same way and sends nothing. Once there is room, the
/// caller that still holds call 0's result reports it again and it commits;
/// calls 1 and 2, whose results the executor kept when they could not be
/// written, are committed by the next ask: their results, nothing resent,
/// for either class. Nothing is left `executing`.
fn disk_fills_between_begin_and_performs(class: Class) {
    let Some((_tmp, mount)) = small_disk() else {
        return;
    };
    let service = class.service();
    let addr = service.addr();
    let (exec, tool) = disk_executor(&mount.0, class);
    let steps = exec.start_round(&op(OP), 0, round(3)).unwrap();
    let attempts: Vec<CallerAttempt> = steps.iter().map(perform_of).collect();
    let filler = fill(&mount.0);
    let mut held = Vec::new();
    for a in &attempts {
        let result = post(addr, &a.request);
        assert!(matches!(result, Ok(PerformOutcome::Committed { .. })));
        held.push(result.clone());
        assert_disk_full(exec.report(a, result));
    }
    assert_eq!(service.effects().len(), 3);
    assert_eq!(statuses(exec.ledger(), 0), [ExecutionStatus::Executing; 3]);
    // Asked again on the full disk: the takeover of the unrecorded attempts
    // cannot be written either.
    assert_disk_full(exec.start_round(&op(OP), 0, round(3)));
    assert_eq!(service.posts().len(), 3);
    assert_eq!(statuses(exec.ledger(), 0), [ExecutionStatus::Executing; 3]);

    unfill(&filler);
    // The caller still holds call 0's result: reported again, it commits.
    let again0 = exec.report(&attempts[0], held[0].clone()).unwrap();
    let CallerStep::Done(CallOutcome::Completed { result_json, .. }) = &again0 else {
        panic!("call 0 re-reported: {again0:?}")
    };
    assert_eq!(effect_id(result_json), "eff_1");
    let outs: Vec<CallOutcome> =
        walk_round(&exec, addr, exec.start_round(&op(OP), 0, round(3)).unwrap())
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert_eq!(replayed(&outs[0]).map(effect_id).as_deref(), Some("eff_1"));
    match class {
        Class::Key | Class::Neither => {
            // The kept results, committed: the effects' own, nothing resent.
            for (n, out) in outs.iter().enumerate().skip(1) {
                let CallOutcome::Completed { result_json, .. } = out else {
                    panic!("call {n}: {out:?}")
                };
                assert_eq!(effect_id(result_json), format!("eff_{}", n + 1));
            }
            assert_eq!(statuses(exec.ledger(), 0), [ExecutionStatus::Committed; 3]);
            assert_eq!(service.posts().len(), 3, "nothing resent");
        }
        Class::Lookup => unreachable!(),
    }
    assert_eq!(effects_per_call(&service, exec.ledger(), 0), [1, 1, 1]);
    results_match_effects(&service, exec.ledger(), 0);
    // A repeat replays what is stored and sends nothing.
    let posts = service.posts().len();
    let repeat = exec.start_round(&op(OP), 0, round(3)).unwrap();
    assert!(
        matches!(&repeat[0], CallerStep::Done(o) if replayed(o).is_some()),
        "{repeat:?}"
    );
    for step in &repeat[1..] {
        assert!(
            matches!(step, CallerStep::Done(o) if replayed(o).is_some()),
            "{step:?}"
        );
    }
    assert_eq!(service.posts().len(), posts);
    assert_eq!(tool.callbacks.load(Ordering::SeqCst), 0);
}

#[test]
fn a_disk_full_between_the_begin_and_the_performs_key_tool() {
    disk_fills_between_begin_and_performs(Class::Key);
}

#[test]
fn a_disk_full_between_the_begin_and_the_performs_neither_tool() {
    disk_fills_between_begin_and_performs(Class::Neither);
}

/// Between one call's commit and the next: call 0 commits, the disk fills,
/// call 1's effect happens and its report fails (`DiskFull`), and the
/// caller gives call 2 back as never sent, which cannot be recorded either
/// (`DiskFull`). Call 0's committed result is intact: read, and replayed
/// alone, on the full disk; the round's repeat, which must take the other
/// two over (a write), is refused, typed. Once there is room, the next ask settles every call:
/// call 1's result, kept by the executor when its report could not be
/// written, is committed (either class); call 2 is resent under its key
/// (key tool) or `Unknown` (neither-tool: its "never sent" was lost with
/// the full disk), nothing resent.
fn disk_fills_between_commits(class: Class) {
    let Some((_tmp, mount)) = small_disk() else {
        return;
    };
    let service = class.service();
    let addr = service.addr();
    let (exec, tool) = disk_executor(&mount.0, class);
    let steps = exec.start_round(&op(OP), 0, round(3)).unwrap();
    let attempts: Vec<CallerAttempt> = steps.iter().map(perform_of).collect();
    let first = walk(&exec, addr, steps[0].clone()).unwrap();
    let first_result = first.result_json().unwrap().to_owned();
    let filler = fill(&mount.0);
    assert_disk_full(exec.report(&attempts[1], post(addr, &attempts[1].request)));
    assert_disk_full(exec.abandon_attempt(
        &attempts[2].request.execution_id,
        attempts[2].request.attempt,
        "its round failed",
    ));
    assert_eq!(service.effects().len(), 2);
    assert_eq!(
        statuses(exec.ledger(), 0),
        [
            ExecutionStatus::Committed,
            ExecutionStatus::Executing,
            ExecutionStatus::Executing
        ]
    );
    assert_eq!(
        results(exec.ledger(), 0)[0].as_deref(),
        Some(first_result.as_str())
    );
    // Call 0 alone replays on the full disk; the round, which must take the
    // other two over, is refused.
    let alone = exec.start(&op(OP), 0, pay_call(0)).unwrap();
    assert!(
        matches!(&alone, CallerStep::Done(o) if replayed(o) == Some(first_result.as_str())),
        "{alone:?}"
    );
    assert_disk_full(exec.start_round(&op(OP), 0, round(3)));
    assert_eq!(service.posts().len(), 2);

    unfill(&filler);
    let outs: Vec<CallOutcome> =
        walk_round(&exec, addr, exec.start_round(&op(OP), 0, round(3)).unwrap())
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert_eq!(replayed(&outs[0]), Some(first_result.as_str()));
    match class {
        Class::Key => {
            let r1 = outs[1].result_json().unwrap();
            assert_eq!(effect_id(r1), "eff_2", "call 1's kept result");
            assert!(matches!(outs[2], CallOutcome::Completed { .. }));
            assert_eq!(statuses(exec.ledger(), 0), [ExecutionStatus::Committed; 3]);
            assert_eq!(effects_per_call(&service, exec.ledger(), 0), [1, 1, 1]);
        }
        Class::Neither => {
            // Call 1's result was kept when its report could not be written:
            // committed now. Call 2 (abandoned, never sent) is unknown.
            assert_eq!(replayed(&outs[1]).map(effect_id).as_deref(), Some("eff_2"));
            assert!(
                matches!(outs[2], CallOutcome::Unknown { .. }),
                "{:?}",
                outs[2]
            );
            assert_eq!(
                statuses(exec.ledger(), 0),
                [
                    ExecutionStatus::Committed,
                    ExecutionStatus::Committed,
                    ExecutionStatus::OutcomeUnknown
                ]
            );
            assert_eq!(effects_per_call(&service, exec.ledger(), 0), [1, 1, 0]);
            assert_eq!(service.posts().len(), 2, "never resent blindly");
        }
        Class::Lookup => unreachable!(),
    }
    results_match_effects(&service, exec.ledger(), 0);
    let posts = service.posts().len();
    let repeat = exec.start_round(&op(OP), 0, round(3)).unwrap();
    assert!(
        matches!(&repeat[0], CallerStep::Done(o) if replayed(o) == Some(first_result.as_str())),
        "{repeat:?}"
    );
    assert!(!repeat
        .iter()
        .any(|s| matches!(s, CallerStep::Perform(_) | CallerStep::Lookup(_))));
    assert_eq!(service.posts().len(), posts, "a repeat sends nothing");
    assert_eq!(tool.callbacks.load(Ordering::SeqCst), 0);
}

#[test]
fn a_disk_full_between_one_calls_commit_and_the_next_key_tool() {
    disk_fills_between_commits(Class::Key);
}

#[test]
fn a_disk_full_between_one_calls_commit_and_the_next_neither_tool() {
    disk_fills_between_commits(Class::Neither);
}

/// During the delivery marks: a round committed, the disk fills, the app
/// marks the results delivered (queued, no write: accepted), reads say
/// `result_delivered`, and the round's repeat replays on the full disk
/// (`start_round` and `execute_round`) with no effect. The next round is
/// refused (`DiskFull`, nothing recorded) and the marks stay queued; once
/// there is room it runs, the marks are written with it, and a new session
/// of the file reads them.
#[test]
fn a_disk_full_during_the_delivery_marks_keeps_the_marks_and_replays() {
    let Some((_tmp, mount)) = small_disk() else {
        return;
    };
    let class = Class::Neither;
    let service = class.service();
    let addr = service.addr();
    let (exec, tool) = disk_executor(&mount.0, class);
    let outs: Vec<CallOutcome> =
        walk_round(&exec, addr, exec.start_round(&op(OP), 0, round(3)).unwrap())
            .into_iter()
            .map(Result::unwrap)
            .collect();
    let stored = results(exec.ledger(), 0);
    settle_wal(&exec);
    let filler = fill(&mount.0);
    let delivered: Vec<ExecutionId> = outs.iter().map(|o| o.execution_id().clone()).collect();
    exec.ledger().mark_delivered(&delivered).unwrap();
    assert_eq!(
        statuses(exec.ledger(), 0),
        [ExecutionStatus::ResultDelivered; 3]
    );
    let steps = exec.start_round(&op(OP), 0, round(3)).unwrap();
    for (step, out) in steps.iter().zip(&outs) {
        assert!(
            matches!(step, CallerStep::Done(o) if replayed(o) == out.result_json()),
            "{step:?}"
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let executed = rt
        .block_on(exec.execute_round(&op(OP), 0, round(3)))
        .unwrap();
    for (got, out) in executed.iter().zip(&outs) {
        assert_eq!(replayed(got), out.result_json(), "{got:?}");
    }
    // The next model response cannot be begun.
    assert_disk_full(exec.start_round(&op(OP), 1, round(2)));
    assert!(statuses(exec.ledger(), 1).is_empty());
    assert_eq!(
        statuses(exec.ledger(), 0),
        [ExecutionStatus::ResultDelivered; 3],
        "the marks stay queued"
    );
    assert_eq!(service.posts().len(), 3);

    unfill(&filler);
    let next: Vec<CallOutcome> =
        walk_round(&exec, addr, exec.start_round(&op(OP), 1, round(2)).unwrap())
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert!(next.iter().all(|o| matches!(
        o,
        CallOutcome::Completed {
            replayed: false,
            ..
        }
    )));
    assert_eq!(service.effects().len(), 5);
    // Written with the next round: another session reads them from the file.
    let other = Ledger::open(&mount.0.join("ledger.db"), LedgerConfig::default()).unwrap();
    assert_eq!(statuses(&other, 0), [ExecutionStatus::ResultDelivered; 3]);
    assert_eq!(results(&other, 0), stored);
    assert_eq!(statuses(&other, 1), [ExecutionStatus::Committed; 2]);
    assert_eq!(tool.callbacks.load(Ordering::SeqCst), 0);
}

/// A tool run by the executor (`execute_round`) that posts to the
/// downstream and fills the disk right after its `fill_at`-th effect.
struct FillingTool {
    desc: ToolDescriptor,
    addr: SocketAddr,
    performs: AtomicUsize,
    fill_at: Mutex<Option<(usize, PathBuf)>>,
}

#[async_trait]
impl ToolHandler for FillingTool {
    fn descriptor(&self) -> ToolDescriptor {
        self.desc.clone()
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let n = self.performs.fetch_add(1, Ordering::SeqCst) + 1;
        let out = post(self.addr, &req);
        let mut fill_at = self.fill_at.lock().unwrap();
        if matches!(&*fill_at, Some((at, _)) if *at == n) {
            let (_, dir) = fill_at.take().unwrap();
            fill(&dir);
        }
        out
    }
    async fn lookup(&self, req: ToolRequest) -> Result<LookupOutcome, ToolError> {
        look(self.addr, &req)
    }
}

/// `execute_round` (the executor runs the tools, one at a time) on a disk
/// that fills right after call 1's effect: call 0 is committed, calls 1 and
/// 2 cannot commit, and the round answers `DiskFull`. Nothing is left
/// `executing` once the round is asked again with room: a result the tool
/// reported and the ledger could not write is committed, a key tool resends
/// an unsent call under the same key (one effect per call), a neither-tool
/// answers `Unknown` for an unsent one and never resends. A repeat replays.
fn execute_round_on_a_filling_disk(class: Class) {
    let Some((_tmp, mount)) = small_disk() else {
        return;
    };
    let service = class.service();
    let ledger = Ledger::open(&mount.0.join("ledger.db"), disk_config()).unwrap();
    let exec = Executor::new(
        Arc::new(ledger),
        ExecutorConfig {
            max_parallel: 1,
            ..downstream::fast_config()
        },
    );
    let tool = Arc::new(FillingTool {
        desc: class.descriptor(),
        addr: service.addr(),
        performs: AtomicUsize::new(0),
        fill_at: Mutex::new(Some((2, mount.0.clone()))),
    });
    exec.register(tool.clone()).unwrap();
    settle_wal(&exec);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_disk_full(rt.block_on(exec.execute_round(&op(OP), 0, round(3))));
    let sent = service.posts().len();
    assert!(sent == 2 || sent == 3, "{sent}");
    let st = statuses(exec.ledger(), 0);
    assert_eq!(st.len(), 3);
    assert_eq!(
        st.iter()
            .filter(|s| **s == ExecutionStatus::Committed)
            .count(),
        1,
        "{st:?}"
    );
    assert!(
        st.iter()
            .all(|s| matches!(s, ExecutionStatus::Committed | ExecutionStatus::Executing)),
        "{st:?}"
    );
    let first_results = results(exec.ledger(), 0);
    // Asked again on the full disk: typed, and nothing more is sent.
    assert_disk_full(rt.block_on(exec.execute_round(&op(OP), 0, round(3))));
    assert_eq!(service.posts().len(), sent);

    unfill(&mount.0.join("filler"));
    let outs = rt
        .block_on(exec.execute_round(&op(OP), 0, round(3)))
        .unwrap();
    let committed_index = first_results.iter().position(Option::is_some).unwrap();
    assert_eq!(
        replayed(&outs[committed_index]),
        first_results[committed_index].as_deref()
    );
    match class {
        Class::Key => {
            assert!(outs
                .iter()
                .all(|o| matches!(o, CallOutcome::Completed { .. })));
            assert_eq!(statuses(exec.ledger(), 0), [ExecutionStatus::Committed; 3]);
            assert_eq!(effects_per_call(&service, exec.ledger(), 0), [1, 1, 1]);
        }
        Class::Neither => {
            // A call that was sent kept its result when it could not be
            // written: committed now. One never sent is unknown.
            let effects = effects_per_call(&service, exec.ledger(), 0);
            for (n, out) in outs.iter().enumerate() {
                if n != committed_index {
                    if effects[n] == 1 {
                        assert!(replayed(out).is_some(), "call {n}: {out:?}");
                    } else {
                        assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
                    }
                }
            }
            let st = statuses(exec.ledger(), 0);
            assert!(
                !st.contains(&ExecutionStatus::Executing),
                "left executing: {st:?}"
            );
            assert_eq!(service.posts().len(), sent, "never resent blindly");
        }
        Class::Lookup => unreachable!(),
    }
    results_match_effects(&service, exec.ledger(), 0);
    let posts = service.posts().len();
    let repeat = rt
        .block_on(exec.execute_round(&op(OP), 0, round(3)))
        .unwrap();
    assert_eq!(
        replayed(&repeat[committed_index]),
        first_results[committed_index].as_deref()
    );
    assert_eq!(service.posts().len(), posts, "a repeat sends nothing");
}

#[test]
fn execute_round_on_a_disk_that_fills_mid_round_key_tool() {
    execute_round_on_a_filling_disk(Class::Key);
}

#[test]
fn execute_round_on_a_disk_that_fills_mid_round_neither_tool() {
    execute_round_on_a_filling_disk(Class::Neither);
}

// ---------------------------------------------------------------------------
// A round's owner process stopped, or killed, mid-round
// ---------------------------------------------------------------------------

const CHILD_VAR: &str = "TOOLLEDGER_ROUND_OWNER_CHILD";

/// The child half of the owner tests: opens the ledger, starts round 0 of
/// three calls, runs and reports call 0, sends call 1 (its effect lands)
/// and says `SENT1`; then waits for `GO` on stdin, reports call 1, runs
/// call 2, says `DONE` and waits for `EXIT` (or is killed).
#[test]
fn round_owner_child() {
    let Ok(spec) = std::env::var(CHILD_VAR) else {
        return;
    };
    let parts: Vec<&str> = spec.split('\t').collect();
    let (db, addr, class) = (
        Path::new(parts[0]),
        parts[1].parse::<SocketAddr>().unwrap(),
        Class::parse(parts[2]),
    );
    let ledger = Ledger::open(db, LedgerConfig::default()).unwrap();
    let (exec, _tool) = caller_executor(ledger, class);
    let steps = exec.start_round(&op(OP), 0, round(3)).unwrap();
    let attempts: Vec<CallerAttempt> = steps.iter().map(perform_of).collect();
    let out0 = walk(&exec, addr, steps[0].clone()).unwrap();
    assert!(matches!(out0, CallOutcome::Completed { .. }), "{out0:?}");
    let sent1 = post(addr, &attempts[1].request);
    say("SENT1");
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    stdin.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "GO");
    let out1 = walk(&exec, addr, exec.report(&attempts[1], sent1).unwrap()).unwrap();
    let out2 = walk(&exec, addr, steps[2].clone()).unwrap();
    let completed = |o: &CallOutcome| {
        matches!(
            o,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        )
    };
    say(&format!("DONE {} {}", completed(&out1), completed(&out2)));
    line.clear();
    let _ = stdin.read_line(&mut line);
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// A child process running [`round_owner_child`], killed when dropped.
struct Owner {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Owner {
    fn spawn(db: &Path, addr: SocketAddr, class: Class) -> Owner {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "round_faults::round_owner_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_VAR,
                format!("{}\t{addr}\t{}", db.display(), class.name()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Owner { child, lines }
    }

    /// Waits (bounded) for a line of the child's that holds `prefix`, and
    /// returns it from there (libtest writes its "test … " before it).
    fn expect(&self, prefix: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find(prefix) {
                        return line[at..].to_owned();
                    }
                }
                Err(e) => panic!("the child never said {prefix}: {e}"),
            }
        }
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// Waits (bounded) for the child to end.
    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the child never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(libc::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A round's owner is stopped (SIGSTOP) after call 0 committed and call 1's
/// effect landed unreported, with call 2 handed out and not sent. Another
/// process asks for the round (`start_round`, `execute_round`, `recover`),
/// again after the landing window: call 0 replays, calls 1 and 2 are
/// `InFlight`, nothing is sent, reconciled or written over. Continued
/// (SIGCONT), the owner finishes: one effect per call, every call
/// committed with the effect its owner saw, and the other process's repeat
/// replays them with no new effect, also after the owner has exited.
fn stopped_round_owner(class: Class) {
    let service = class.service();
    let addr = service.addr();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut owner = Owner::spawn(&db, addr, class);
    owner.expect("SENT1");
    owner.signal(libc::SIGSTOP);
    let (exec, tool) = caller_executor(Ledger::open(&db, LedgerConfig::default()).unwrap(), class);
    let rt = runtime();
    for pass in 0..2 {
        let steps = exec.start_round(&op(OP), 0, round(3)).unwrap();
        assert!(
            matches!(&steps[0], CallerStep::Done(o) if replayed(o).is_some()),
            "pass {pass}: {steps:?}"
        );
        for step in &steps[1..] {
            assert!(
                matches!(step, CallerStep::Done(CallOutcome::InFlight { .. })),
                "pass {pass}: a stopped owner's call was not in flight: {step:?}"
            );
        }
        let outs = rt
            .block_on(exec.execute_round(&op(OP), 0, round(3)))
            .unwrap();
        assert!(replayed(&outs[0]).is_some(), "{outs:?}");
        for out in &outs[1..] {
            assert!(matches!(out, CallOutcome::InFlight { .. }), "{out:?}");
        }
        let recovered = rt.block_on(exec.recover()).unwrap();
        assert!(recovered.failed.is_empty(), "{:?}", recovered.failed);
        assert_eq!(
            statuses(exec.ledger(), 0),
            [
                ExecutionStatus::Committed,
                ExecutionStatus::Executing,
                ExecutionStatus::Executing
            ]
        );
        for rec in exec.ledger().list(&op(OP)).unwrap() {
            assert_ne!(
                rec.owner_session.as_ref(),
                Some(exec.ledger().session_id()),
                "taken over from a live owner: {rec:?}"
            );
            assert_eq!(rec.attempt_count, 1, "{rec:?}");
        }
        assert_eq!(service.posts().len(), 2, "pass {pass}: nothing sent");
        assert!(
            service.lookups().is_empty(),
            "pass {pass}: nothing looked up"
        );
        // Long enough for a wrong takeover's landing window to pass.
        std::thread::sleep(WINDOW + Duration::from_millis(100));
    }
    owner.signal(libc::SIGCONT);
    owner.tell("GO");
    let done = owner.expect("DONE");
    assert_eq!(done, "DONE true true", "the owner committed calls 1 and 2");
    assert_eq!(effects_per_call(&service, exec.ledger(), 0), [1, 1, 1]);
    assert_eq!(service.posts().len(), 3);
    assert_eq!(statuses(exec.ledger(), 0), [ExecutionStatus::Committed; 3]);
    results_match_effects(&service, exec.ledger(), 0);
    let stored = results(exec.ledger(), 0);
    let check_replays = |exec: &Executor| {
        let steps = exec.start_round(&op(OP), 0, round(3)).unwrap();
        for (step, want) in steps.iter().zip(&stored) {
            assert!(
                matches!(step, CallerStep::Done(o) if replayed(o) == want.as_deref()),
                "{step:?}"
            );
        }
    };
    check_replays(&exec);
    owner.tell("EXIT");
    assert!(owner.wait().success());
    check_replays(&exec);
    assert_eq!(service.posts().len(), 3, "a repeat sends nothing");
    assert_eq!(tool.callbacks.load(Ordering::SeqCst), 0);
}

#[test]
fn a_stopped_round_owner_keeps_its_calls_and_finishes_them_neither_tool() {
    stopped_round_owner(Class::Neither);
}

#[test]
fn a_stopped_round_owner_keeps_its_calls_and_finishes_them_lookup_tool() {
    stopped_round_owner(Class::Lookup);
}

/// A round's owner is killed (SIGKILL) after call 0 committed and call 1's
/// effect landed unreported, call 2 handed out and never sent. A new
/// process asks for the round: call 0 replays; a neither-tool answers
/// `Unknown` for calls 1 and 2 and never resends; a key tool resends both
/// under their keys (call 1 deduped to its effect); a lookup tool finds
/// call 1's effect and, for call 2, resends only once the landing window
/// has passed. One effect per call that was sent; a repeat replays.
fn killed_round_owner(class: Class) {
    let service = class.service();
    let addr = service.addr();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut owner = Owner::spawn(&db, addr, class);
    owner.expect("SENT1");
    owner.signal(libc::SIGKILL);
    assert!(!owner.wait().success());
    let (exec, tool) = caller_executor(Ledger::open(&db, LedgerConfig::default()).unwrap(), class);
    let first0 = results(exec.ledger(), 0)[0].clone().unwrap();
    let outs: Vec<CallOutcome> =
        walk_round(&exec, addr, exec.start_round(&op(OP), 0, round(3)).unwrap())
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert_eq!(replayed(&outs[0]), Some(first0.as_str()));
    let found1 = |out: &CallOutcome| {
        let r = out.result_json().unwrap_or_else(|| panic!("{out:?}"));
        assert_eq!(effect_id(r), "eff_2", "call 1 settled with its own effect");
    };
    match class {
        Class::Neither => {
            for out in &outs[1..] {
                assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
            }
            assert_eq!(
                statuses(exec.ledger(), 0),
                [
                    ExecutionStatus::Committed,
                    ExecutionStatus::OutcomeUnknown,
                    ExecutionStatus::OutcomeUnknown
                ]
            );
            assert_eq!(effects_per_call(&service, exec.ledger(), 0), [1, 1, 0]);
            assert_eq!(service.posts().len(), 2, "never resent blindly");
        }
        Class::Key => {
            found1(&outs[1]);
            assert!(matches!(outs[2], CallOutcome::Completed { .. }));
            assert_eq!(statuses(exec.ledger(), 0), [ExecutionStatus::Committed; 3]);
            assert_eq!(effects_per_call(&service, exec.ledger(), 0), [1, 1, 1]);
        }
        Class::Lookup => {
            found1(&outs[1]);
            assert!(
                matches!(
                    outs[2],
                    CallOutcome::Unknown {
                        retry_after: Some(_),
                        ..
                    }
                ),
                "inside the window: {:?}",
                outs[2]
            );
            assert_eq!(service.posts().len(), 2, "nothing resent in the window");
            std::thread::sleep(WINDOW + Duration::from_millis(50));
            let outs = walk_round(&exec, addr, exec.start_round(&op(OP), 0, round(3)).unwrap());
            let out2 = outs[2].as_ref().unwrap();
            assert!(
                matches!(
                    out2,
                    CallOutcome::Completed {
                        replayed: false,
                        ..
                    }
                ),
                "{out2:?}"
            );
            assert_eq!(statuses(exec.ledger(), 0), [ExecutionStatus::Committed; 3]);
            assert_eq!(effects_per_call(&service, exec.ledger(), 0), [1, 1, 1]);
        }
    }
    results_match_effects(&service, exec.ledger(), 0);
    assert!(!statuses(exec.ledger(), 0).contains(&ExecutionStatus::Executing));
    let posts = service.posts().len();
    let stored = results(exec.ledger(), 0);
    for _ in 0..2 {
        let steps = exec.start_round(&op(OP), 0, round(3)).unwrap();
        for (step, want) in steps.iter().zip(&stored) {
            match want {
                Some(want) => assert!(
                    matches!(step, CallerStep::Done(o) if replayed(o) == Some(want.as_str())),
                    "{step:?}"
                ),
                None => assert!(
                    matches!(step, CallerStep::Done(CallOutcome::Unknown { .. })),
                    "{step:?}"
                ),
            }
        }
    }
    assert_eq!(service.posts().len(), posts, "a repeat sends nothing");
    assert_eq!(tool.callbacks.load(Ordering::SeqCst), 0);
}

#[test]
fn a_killed_round_owner_is_reconciled_by_a_new_process_neither_tool() {
    killed_round_owner(Class::Neither);
}

#[test]
fn a_killed_round_owner_is_reconciled_by_a_new_process_key_tool() {
    killed_round_owner(Class::Key);
}

#[test]
fn a_killed_round_owner_is_reconciled_by_a_new_process_lookup_tool() {
    killed_round_owner(Class::Lookup);
}

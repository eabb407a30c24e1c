//! The less-covered flows, attacked: approvals, rounds, jobs and webhooks,
//! retention, recover() with calls in flight, deliveries (effects counted at
//! a keyed downstream).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use support::*;
use tokio::sync::{mpsc, Notify};
use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{Begin, Error, JobApplied, JobUpdate, Ledger, LedgerConfig};
use toolledger::model::{ExecutionId, ExecutionStatus, OperationId, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream::process;

mod batch_recover;
mod dropped_round;
mod job_and_retry_edges;
mod job_order;
mod job_result;
mod job_updates;
mod retry_race;

// ---------------------------------------------------------------------------
// A scripted tool with a keyed downstream that counts effects.
// ---------------------------------------------------------------------------
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Commit,
    FailRetryable,
    FailFinal,
    /// Waits for the gate, then commits.
    Hold,
}

struct Scripted {
    desc: ToolDescriptor,
    script: Mutex<VecDeque<Act>>,
    performs: AtomicU32,
    /// key -> number of effects made under it
    effects: Mutex<HashMap<String, u32>>,
    reached: Mutex<Option<mpsc::UnboundedSender<()>>>,
    release: Arc<Notify>,
}

impl Scripted {
    fn new(desc: ToolDescriptor, script: &[Act]) -> Arc<Scripted> {
        Arc::new(Scripted {
            desc,
            script: Mutex::new(script.iter().copied().collect()),
            performs: AtomicU32::new(0),
            effects: Mutex::new(HashMap::new()),
            reached: Mutex::new(None),
            release: Arc::new(Notify::new()),
        })
    }
    fn gate(&self) -> mpsc::UnboundedReceiver<()> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.reached.lock().unwrap() = Some(tx);
        rx
    }
    fn effects(&self) -> u32 {
        self.effects.lock().unwrap().values().sum()
    }
    fn performs(&self) -> u32 {
        self.performs.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ToolHandler for Scripted {
    fn descriptor(&self) -> ToolDescriptor {
        self.desc.clone()
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.performs.fetch_add(1, Ordering::SeqCst);
        let act = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Act::Commit);
        match act {
            Act::FailRetryable => {
                return Ok(PerformOutcome::FailedBeforeCommit {
                    reason: "throttled".into(),
                    retryable: true,
                })
            }
            Act::FailFinal => {
                return Ok(PerformOutcome::FailedBeforeCommit {
                    reason: "refused".into(),
                    retryable: false,
                })
            }
            Act::Hold => {
                if let Some(tx) = self.reached.lock().unwrap().as_ref() {
                    let _ = tx.send(());
                }
                tokio::time::timeout(Duration::from_secs(10), self.release.notified())
                    .await
                    .map_err(|_| ToolError::new("never released"))?;
            }
            Act::Commit => {}
        }
        let key = match req.item_index {
            Some(i) => format!("{}#{i}", req.downstream_key),
            None => req.downstream_key.to_string(),
        };
        let mut effects = self.effects.lock().unwrap();
        let n = effects.entry(key.clone()).or_insert(0);
        if !self.desc.idempotency_key || *n == 0 {
            *n += 1;
        }
        Ok(PerformOutcome::Committed {
            result_json: format!(r#"{{"key":"{key}"}}"#),
            external_id: Some(key),
        })
    }
}

fn keyed(name: &str) -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect(name, 1)
    }
}

fn config(backoff_ms: u64, max_parallel: usize) -> ExecutorConfig {
    ExecutorConfig {
        max_attempts: 3,
        read_only_max_attempts: 3,
        perform_timeout: Some(Duration::from_secs(20)),
        backoff_base: Duration::from_millis(backoff_ms),
        backoff_max: Duration::from_millis(backoff_ms),
        max_parallel,
    }
}

fn exec_on(path: &std::path::Path, cfg: ExecutorConfig) -> Executor {
    Executor::new(
        Arc::new(Ledger::open(path, LedgerConfig::default()).unwrap()),
        cfg,
    )
}

/// Waits (at most 10 s) until an execution of the test operation, as the
/// ledger of `exec` lists them, is in `status`; its id.
async fn wait_for_status(exec: &Executor, status: ExecutionStatus) -> ExecutionId {
    let started = std::time::Instant::now();
    loop {
        let found = exec
            .ledger()
            .list(&opid())
            .unwrap()
            .into_iter()
            .find(|r| r.status == status);
        if let Some(r) = found {
            return r.execution_id;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no execution reached {status:?} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn opid() -> OperationId {
    OperationId::new("op").unwrap()
}

fn tcall(id: &str, tool: &str, args: &str) -> ToolCall {
    ToolCall::custom(id, tool, args)
}

// ---------------------------------------------------------------------------
// 1. A retry waiting in its backoff while the same call is asked again.
// ---------------------------------------------------------------------------
// ---------------------------------------------------------------------------
// 5. recover() while calls of this process are in flight.
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_while_a_call_runs_in_this_process_neither_resends_nor_marks_it_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(1, 1));
    // Neither key nor lookup: a resend would be a second effect.
    let tool = Scripted::new(ToolDescriptor::side_effect("email", 1), &[Act::Hold]);
    let mut reached = tool.gate();
    exec.register(tool.clone()).unwrap();
    // A round of two: the first holds in perform, the second waits for the
    // semaphore (max_parallel 1) with its intent already `executing`.
    let a = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute_round(
                &opid(),
                0,
                vec![
                    tcall("c1", "email", r#"{"n":1}"#),
                    tcall("c2", "email", r#"{"n":2}"#),
                ],
            )
            .await
        })
    };
    tokio::time::timeout(Duration::from_secs(5), reached.recv())
        .await
        .unwrap();
    let rec = exec.recover().await.unwrap();
    assert!(rec.failed.is_empty(), "{:?}", rec.failed);
    for o in &rec.outcomes {
        assert!(matches!(o, CallOutcome::InFlight { .. }), "{o:?}");
    }
    assert_eq!(rec.outcomes.len(), 2);
    for r in exec.ledger().list(&opid()).unwrap() {
        assert_eq!(r.status, ExecutionStatus::Executing);
    }
    tool.release.notify_one();
    let out = a.await.unwrap().unwrap();
    assert!(
        out.iter().all(|o| matches!(
            o,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        )),
        "{out:?}"
    );
    assert_eq!(tool.performs(), 2);
    assert_eq!(tool.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_during_a_retry_backoff_in_this_process() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(400, 4));
    let tool = Scripted::new(keyed("pay"), &[Act::FailRetryable, Act::Commit]);
    exec.register(tool.clone()).unwrap();
    let a = {
        let exec = exec.clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, tcall("c1", "pay", "{}")).await })
    };
    wait_for_status(&exec, ExecutionStatus::FailedBeforeCommit).await;
    let rec = exec.recover().await.unwrap();
    eprintln!("recover during backoff: {:?}", rec.outcomes);
    let a = a.await.unwrap().unwrap();
    assert!(matches!(a, CallOutcome::Completed { .. }), "{a:?}");
    assert_eq!(tool.effects(), 1);
    assert_eq!(tool.performs(), 2);
}

// ---------------------------------------------------------------------------
// 1. Approvals.
// ---------------------------------------------------------------------------
fn approval_tool(script: &[Act]) -> Arc<Scripted> {
    Scripted::new(
        ToolDescriptor {
            requires_approval: true,
            ..ToolDescriptor::side_effect("pay", 1)
        },
        script,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_approvals_at_once_run_the_call_once() {
    for _round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let exec = exec_on(&dir.path().join("l.db"), config(1, 4));
        let tool = approval_tool(&[]);
        exec.register(tool.clone()).unwrap();
        let CallOutcome::NeedsApproval {
            execution_id,
            args_digest,
            ..
        } = exec
            .execute(&opid(), 0, tcall("c1", "pay", r#"{"amount":5}"#))
            .await
            .unwrap()
        else {
            panic!()
        };
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let exec = exec.clone();
            let (id, d) = (execution_id.clone(), args_digest.clone());
            tasks.push(tokio::spawn(
                async move { exec.approve(&id, &d, None).await },
            ));
        }
        // One approval runs the call; the other answers where it stands
        // (running, or its result replayed), never an error or a second run.
        let mut ran = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(CallOutcome::Completed {
                    replayed: false, ..
                }) => ran += 1,
                Ok(
                    CallOutcome::Completed { replayed: true, .. } | CallOutcome::InFlight { .. },
                ) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(ran, 1);
        assert_eq!(tool.effects(), 1);
    }
}

#[test]
fn reject_racing_approve_in_two_sessions_leaves_one_decision() {
    for _ in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let (l1, clock) = open_at(&path);
        let l2 = open_with(&path, &clock);
        let s = spec("c1", "pay", r#"{"amount":5}"#).with_approval();
        let Begin::NeedsApproval(req) = l1.begin(&op("op"), 0, &s).unwrap() else {
            panic!()
        };
        let (l1, l2) = (Arc::new(l1), Arc::new(l2));
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let t1 = {
            let (l, r, b) = (l1.clone(), req.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                l.approve(&r.execution_id, &r.args_digest, None)
            })
        };
        let t2 = {
            let (l, r, b) = (l2.clone(), req.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                l.reject(&r.execution_id, &r.args_digest, "no")
            })
        };
        let (a, r) = (t1.join().unwrap(), t2.join().unwrap());
        assert!(a.is_ok() ^ r.is_ok(), "{a:?} {r:?}");
        let status = l1.get(&req.execution_id).unwrap().unwrap().status;
        let answer = l2.begin(&op("op"), 0, &s).unwrap();
        if a.is_ok() {
            assert_eq!(status, ExecutionStatus::Approved);
            assert!(matches!(answer, Begin::Execute(_)), "{answer:?}");
        } else {
            assert_eq!(status, ExecutionStatus::Rejected);
            assert!(matches!(answer, Begin::Rejected { .. }), "{answer:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_after_cancel_and_with_a_stale_digest_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(1, 4));
    let tool = approval_tool(&[]);
    exec.register(tool.clone()).unwrap();
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        ..
    } = exec
        .execute(&opid(), 0, tcall("c1", "pay", r#"{"amount":5}"#))
        .await
        .unwrap()
    else {
        panic!()
    };
    // The model changes its mind under the same call id: conflict.
    let changed = exec
        .execute(&opid(), 0, tcall("c1", "pay", r#"{"amount":500}"#))
        .await
        .unwrap();
    let CallOutcome::Conflict { new_digest, .. } = changed else {
        panic!("{changed:?}")
    };
    let stale = exec.approve(&execution_id, &new_digest, None).await;
    assert!(
        matches!(
            stale,
            Err(toolledger::executor::Error::Ledger(
                Error::DigestMismatch { .. }
            ))
        ),
        "{stale:?}"
    );
    exec.cancel_operation(&opid()).unwrap();
    let late = exec.approve(&execution_id, &args_digest, None).await;
    eprintln!("approve after cancel: {late:?}");
    assert!(late.is_err() || matches!(late, Ok(CallOutcome::Cancelled { .. })));
    assert_eq!(
        exec.ledger().get(&execution_id).unwrap().unwrap().status,
        ExecutionStatus::CancelledBeforeCommit
    );
    let again = exec
        .execute(&opid(), 0, tcall("c1", "pay", r#"{"amount":5}"#))
        .await
        .unwrap();
    assert!(matches!(again, CallOutcome::Cancelled { .. }), "{again:?}");
    assert_eq!(tool.performs(), 0);
}

#[test]
fn approve_then_crash_mid_run_then_recover_runs_once_under_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let tool_desc = ToolDescriptor {
        requires_approval: true,
        idempotency_key: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    // The downstream (shared by both "processes").
    let downstream: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    // Life 1: ask, approve, the tool holds (after the effect? before): killed.
    let (id, digest) = process(async {
        let exec = exec_on(&path, config(1, 4));
        let tool = Scripted::new(tool_desc.clone(), &[]);
        exec.register(tool.clone()).unwrap();
        let CallOutcome::NeedsApproval {
            execution_id,
            args_digest,
            ..
        } = exec
            .execute(&opid(), 0, tcall("c1", "pay", r#"{"amount":5}"#))
            .await
            .unwrap()
        else {
            panic!()
        };
        (execution_id, args_digest)
    });
    process(async {
        let exec = exec_on(&path, config(1, 4));
        let tool = Scripted::new(tool_desc.clone(), &[Act::Hold]);
        let mut reached = tool.gate();
        exec.register(tool.clone()).unwrap();
        let e2 = exec.clone();
        let (id2, d2) = (id.clone(), digest.clone());
        let t = tokio::spawn(async move { e2.approve(&id2, &d2, None).await });
        tokio::time::timeout(Duration::from_secs(5), reached.recv())
            .await
            .unwrap();
        // The effect lands downstream, then the process dies.
        downstream
            .lock()
            .unwrap()
            .insert(id.downstream_key().to_string(), 1);
        drop(t);
        // returning drops the runtime: the tool task dies with it.
    });
    let out = process(async {
        let exec = exec_on(&path, config(1, 4));
        let tool = Scripted::new(tool_desc.clone(), &[]);
        // Seed the tool's downstream with the effect of life 2.
        *tool.effects.lock().unwrap() = downstream.lock().unwrap().clone();
        exec.register(tool.clone()).unwrap();
        let rec = exec.recover().await.unwrap();
        (rec, tool.effects(), tool.performs())
    });
    let (rec, effects, performs) = out;
    assert!(rec.failed.is_empty(), "{:?}", rec.failed);
    assert!(
        matches!(rec.outcomes.as_slice(), [CallOutcome::Completed { .. }]),
        "{:?}",
        rec.outcomes
    );
    assert_eq!(effects, 1);
    assert_eq!(performs, 1);
}

// ---------------------------------------------------------------------------
// 2. Rounds.
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_call_id_twice_in_one_round_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(1, 4));
    let tool = Scripted::new(ToolDescriptor::side_effect("email", 1), &[]);
    exec.register(tool.clone()).unwrap();
    let out = exec
        .execute_round(
            &opid(),
            0,
            vec![
                tcall("c1", "email", r#"{"n":1}"#),
                tcall("c1", "email", r#"{"n":1}"#),
            ],
        )
        .await
        .unwrap();
    eprintln!("same id twice: {out:?}");
    assert_eq!(tool.effects(), 1);
    let out = exec
        .execute_round(
            &opid(),
            1,
            vec![
                tcall("c1", "email", r#"{"n":1}"#),
                tcall("c1", "email", r#"{"n":2}"#),
            ],
        )
        .await
        .unwrap();
    eprintln!("same id, other args: {out:?}");
    assert!(matches!(out[1], CallOutcome::Conflict { .. }), "{out:?}");
    assert_eq!(tool.effects(), 2);
    // A round again: replays and one new call.
    let out = exec
        .execute_round(
            &opid(),
            1,
            vec![
                tcall("c1", "email", r#"{"n":1}"#),
                tcall("c9", "email", r#"{"n":9}"#),
            ],
        )
        .await
        .unwrap();
    assert!(
        matches!(out[0], CallOutcome::Completed { replayed: true, .. }),
        "{out:?}"
    );
    assert!(
        matches!(
            out[1],
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        ),
        "{out:?}"
    );
    assert_eq!(tool.effects(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_racing_a_round_run_each_call_once() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let exec_a = exec_on(&path, config(1, 4));
        let exec_b = exec_on(&path, config(1, 4));
        let ta = Scripted::new(ToolDescriptor::side_effect("email", 1), &[]);
        let tb = Scripted::new(ToolDescriptor::side_effect("email", 1), &[]);
        exec_a.register(ta.clone()).unwrap();
        exec_b.register(tb.clone()).unwrap();
        // A round some of whose calls already ran.
        exec_a
            .execute(&opid(), 0, tcall("c0", "email", r#"{"n":0}"#))
            .await
            .unwrap();
        let round: Vec<ToolCall> = (0..4)
            .map(|i| tcall(&format!("c{i}"), "email", &format!(r#"{{"n":{i}}}"#)))
            .collect();
        let (ra, rb) = {
            let (ea, eb) = (exec_a.clone(), exec_b.clone());
            let (r1, r2) = (round.clone(), round.clone());
            let a = tokio::spawn(async move { ea.execute_round(&opid(), 0, r1).await });
            let b = tokio::spawn(async move { eb.execute_round(&opid(), 0, r2).await });
            (a.await.unwrap().unwrap(), b.await.unwrap().unwrap())
        };
        assert_eq!(ta.effects() + tb.effects(), 4, "{ra:?} {rb:?}");
        for (x, y) in ra.iter().zip(&rb) {
            let ok = |o: &CallOutcome| {
                matches!(
                    o,
                    CallOutcome::Completed { .. } | CallOutcome::InFlight { .. }
                )
            };
            assert!(ok(x) && ok(y), "{x:?} {y:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// Batches: a partial failure, then a retry.
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_failing_mid_way_retries_only_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(1, 4));
    let tool = Scripted::new(
        ToolDescriptor {
            batch: toolledger::executor::BatchMode::Independent,
            ..keyed("invite")
        },
        &[Act::Commit, Act::FailRetryable, Act::Commit, Act::FailFinal],
    );
    exec.register(tool.clone()).unwrap();
    let out = exec
        .execute(
            &opid(),
            0,
            tcall("b1", "invite", r#"{"items":[{"a":0},{"a":1},{"a":2}]}"#),
        )
        .await
        .unwrap();
    eprintln!("batch: {out:?}");
    // item 0 ok, item 1 throttled then ok, item 2 refused for good.
    let CallOutcome::Completed {
        partial,
        result_json,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert!(*partial, "{result_json}");
    assert_eq!(tool.effects(), 2);
    // Asked again: replayed, nothing sent.
    let again = exec
        .execute(
            &opid(),
            0,
            tcall("b1", "invite", r#"{"items":[{"a":0},{"a":1},{"a":2}]}"#),
        )
        .await
        .unwrap();
    assert!(matches!(
        again,
        CallOutcome::Completed { replayed: true, .. }
    ));
    assert_eq!(tool.performs(), 4);
}

// ---------------------------------------------------------------------------
// 3. Jobs and webhooks (Ledger API).
// ---------------------------------------------------------------------------
fn started_job(ledger: &Ledger, call_id: &str) -> toolledger::ledger::Ticket {
    let t = ticket(
        ledger
            .begin(&op("op"), 0, &spec(call_id, "render", "{}"))
            .unwrap(),
    );
    ledger.record_job(&t.attempt_id(), "job_1").unwrap();
    t
}

#[test]
fn webhooks_out_of_order_twice_unknown_and_racing_a_poll() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _c) = open_at(&dir.path().join("l.db"));
    let t = started_job(&ledger, "c1");
    let id = t.execution_id.clone();
    // completed before started
    let done = ledger
        .ingest_webhook(
            "svc",
            "ev2",
            &id,
            &JobUpdate::Succeeded {
                result_json: r#"{"url":"u"}"#.into(),
            },
        )
        .unwrap();
    assert!(matches!(done, JobApplied::Committed(_)));
    let late = ledger
        .ingest_webhook(
            "svc",
            "ev1",
            &id,
            &JobUpdate::Progress {
                state: "running".into(),
            },
        )
        .unwrap();
    let job = ledger.job(&id).unwrap();
    eprintln!("late progress: {late:?}; job now {job:?}");
    assert_eq!(
        ledger.get(&id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    // twice
    let twice = ledger
        .ingest_webhook(
            "svc",
            "ev2",
            &id,
            &JobUpdate::Succeeded {
                result_json: r#"{"url":"other"}"#.into(),
            },
        )
        .unwrap();
    assert_eq!(twice, JobApplied::DuplicateEvent);
    // unknown execution
    let nobody = ExecutionId::parse("op:round_0:nope:render:v1").unwrap();
    let e = ledger.ingest_webhook(
        "svc",
        "ev9",
        &nobody,
        &JobUpdate::Progress { state: "x".into() },
    );
    assert!(matches!(e, Err(Error::NotFound(_))), "{e:?}");
    // The result is the first one.
    assert_eq!(
        ledger.get(&id).unwrap().unwrap().result_json.as_deref(),
        Some(r#"{"url":"u"}"#)
    );
}

#[test]
fn a_webhook_and_a_poll_racing_commit_once() {
    for i in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let (l1, clock) = open_at(&path);
        let l2 = Arc::new(open_with(&path, &clock));
        let l1 = Arc::new(l1);
        let t = started_job(&l1, &format!("c{i}"));
        let id = t.execution_id.clone();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let h1 = {
            let (l, id, b) = (l1.clone(), id.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                l.ingest_webhook(
                    "svc",
                    "e",
                    &id,
                    &JobUpdate::Succeeded {
                        result_json: r#"{"w":1}"#.into(),
                    },
                )
            })
        };
        let h2 = {
            let (l, id, b) = (l2.clone(), id.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                l.record_job_update(
                    &id,
                    &JobUpdate::Succeeded {
                        result_json: r#"{"p":1}"#.into(),
                    },
                )
            })
        };
        let (a, b) = (h1.join().unwrap().unwrap(), h2.join().unwrap().unwrap());
        let commits = [&a, &b]
            .iter()
            .filter(|x| matches!(x, JobApplied::Committed(_)))
            .count();
        assert_eq!(commits, 1, "{a:?} {b:?}");
        assert!(
            [&a, &b]
                .iter()
                .any(|x| matches!(x, JobApplied::AlreadyFinal(ExecutionStatus::Committed))),
            "{a:?} {b:?}"
        );
    }
}

#[test]
fn a_webhook_redelivered_after_the_execution_was_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, clock) = open_at(&dir.path().join("l.db"));
    let t = started_job(&ledger, "c1");
    let id = t.execution_id.clone();
    let up = JobUpdate::Succeeded {
        result_json: r#"{"url":"u"}"#.into(),
    };
    ledger.ingest_webhook("svc", "ev1", &id, &up).unwrap();
    ledger.mark_delivered(std::slice::from_ref(&id)).unwrap();
    clock.advance(10_000);
    let rep = ledger.prune(Duration::from_millis(1), true).unwrap();
    assert_eq!(rep.executions, 1);
    let again = ledger.ingest_webhook("svc", "ev1", &id, &up);
    let poll = ledger.record_job_update(&id, &up);
    eprintln!("redelivered after prune: {again:?}; poll {poll:?}");
    // Not applied, not run; the call answers from the tombstone.
    let b = ledger
        .begin(&op("op"), 0, &spec("c1", "render", "{}"))
        .unwrap();
    assert!(matches!(b, Begin::Failed { .. }), "{b:?}");
}

// ---------------------------------------------------------------------------
// 4. Retention.
// ---------------------------------------------------------------------------
#[test]
fn prune_with_a_future_cutoff_racing_replays_in_another_session_never_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (l1, clock) = open_at(&path);
    let n = 40;
    for i in 0..n {
        let t = ticket(
            l1.begin(&op("op"), 0, &spec(&format!("c{i}"), "pay", "{}"))
                .unwrap(),
        );
        l1.commit(&t.attempt_id(), r#"{"ok":1}"#, None).unwrap();
        l1.mark_delivered(std::slice::from_ref(&t.execution_id))
            .unwrap();
    }
    // one still executing, one committed undelivered: never pruned
    let live = ticket(l1.begin(&op("op"), 1, &spec("live", "pay", "{}")).unwrap());
    let und = ticket(l1.begin(&op("op"), 1, &spec("und", "pay", "{}")).unwrap());
    l1.commit(&und.attempt_id(), r#"{"ok":2}"#, None).unwrap();
    let l2 = Arc::new(open_with(&path, &clock));
    let l1 = Arc::new(l1);
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let pruner = {
        let (l, b) = (l1.clone(), barrier.clone());
        std::thread::spawn(move || {
            b.wait();
            let opts = toolledger::ledger::PruneOptions {
                batch_size: 3,
                ..toolledger::ledger::PruneOptions::new(toolledger::ledger::PruneCutoff::BeforeMs(
                    i64::MAX,
                ))
            };
            l.prune_with(&opts, &mut |_| {}).unwrap()
        })
    };
    let replayer = {
        let (l, b) = (l2.clone(), barrier.clone());
        std::thread::spawn(move || {
            b.wait();
            let mut answers = Vec::new();
            for i in 0..n {
                answers.push(
                    l.begin(&op("op"), 0, &spec(&format!("c{i}"), "pay", "{}"))
                        .unwrap(),
                );
            }
            answers
        })
    };
    let report = pruner.join().unwrap();
    let answers = replayer.join().unwrap();
    assert_eq!(report.executions, n as u64, "{report:?}");
    for a in &answers {
        match a {
            Begin::Replay(_) => {}
            Begin::Failed { reason, .. }
                if reason == toolledger::ledger::PRUNED_EXECUTED_REASON => {}
            other => panic!("{other:?}"),
        }
    }
    for i in 0..n {
        let a = l2
            .begin(&op("op"), 0, &spec(&format!("c{i}"), "pay", "{}"))
            .unwrap();
        assert!(matches!(a, Begin::Failed { .. }), "{a:?}");
    }
    assert_eq!(
        l2.get(&live.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Executing
    );
    assert_eq!(
        l2.get(&und.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    // the live call still commits
    l1.commit(&live.attempt_id(), r#"{"ok":3}"#, None).unwrap();
}

#[test]
fn prune_on_an_encrypted_ledger_answers_late_retries_from_the_tombstone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let key = toolledger::ledger::LedgerKey::generate().unwrap();
    let clock = Arc::new(toolledger::ledger::ManualClock::new(1_000_000));
    let l = Ledger::open_with(&path, LedgerConfig::default(), clock.clone(), Some(&key)).unwrap();
    let s = spec("c1", "pay", r#"{"amount":7}"#);
    let t = ticket(l.begin(&op("op"), 0, &s).unwrap());
    l.commit(&t.attempt_id(), r#"{"ok":1}"#, None).unwrap();
    l.mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    let r = l
        .begin(&op("op"), 0, &spec("r1", "pay", "{}").with_approval())
        .unwrap();
    let Begin::NeedsApproval(req) = r else {
        panic!()
    };
    l.reject(&req.execution_id, &req.args_digest, "no").unwrap();
    clock.advance(5_000);
    let rep = l.prune(Duration::from_millis(1), true).unwrap();
    assert_eq!(rep.executions, 2);
    drop(l);
    let l = Ledger::open_with(&path, LedgerConfig::default(), clock.clone(), Some(&key)).unwrap();
    let a = l.begin(&op("op"), 0, &s).unwrap();
    assert!(matches!(a, Begin::Failed { .. }), "{a:?}");
    let c = l
        .begin(&op("op"), 0, &spec("c1", "pay", r#"{"amount":8}"#))
        .unwrap();
    assert!(matches!(c, Begin::Conflict { .. }), "{c:?}");
    let rj = l
        .begin(&op("op"), 0, &spec("r1", "pay", "{}").with_approval())
        .unwrap();
    assert!(matches!(rj, Begin::Rejected { .. }), "{rj:?}");
}

// ---------------------------------------------------------------------------
// 6. Deliveries.
// ---------------------------------------------------------------------------
#[test]
fn delivery_marks_for_unknown_twice_and_across_suspend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let (l, clock) = open_at(&path);
    let nobody = ExecutionId::parse("op:round_0:nope:pay:v1").unwrap();
    assert!(matches!(
        l.mark_delivered(std::slice::from_ref(&nobody)),
        Err(Error::NotFound(_))
    ));
    let t = ticket(l.begin(&op("op"), 0, &spec("c1", "pay", "{}")).unwrap());
    // not committed yet
    assert!(matches!(
        l.mark_delivered(std::slice::from_ref(&t.execution_id)),
        Err(Error::InvalidTransition { .. })
    ));
    l.commit(&t.attempt_id(), r#"{"ok":1}"#, None).unwrap();
    let t2 = ticket(l.begin(&op("op"), 0, &spec("c2", "pay", "{}")).unwrap());
    l.commit(&t2.attempt_id(), r#"{"ok":2}"#, None).unwrap();
    // a batch with one bad id marks nothing
    assert!(l
        .mark_delivered(&[t.execution_id.clone(), nobody.clone()])
        .is_err());
    assert_eq!(
        l.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    l.mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    l.mark_delivered(std::slice::from_ref(&t.execution_id))
        .unwrap();
    l.suspend().unwrap();
    // while suspended
    let m = l.mark_delivered(std::slice::from_ref(&t2.execution_id));
    eprintln!("mark while suspended: {m:?}");
    l.resume().unwrap();
    drop(l);
    let l = open_with(&path, &clock);
    let pending = l.recover().unwrap();
    eprintln!(
        "after reopen: {:?}",
        pending
            .iter()
            .map(|r| (r.provider_call_id.clone(), r.status))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        l.get(&t.execution_id).unwrap().unwrap().status,
        ExecutionStatus::ResultDelivered
    );
    if m.is_ok() {
        assert_eq!(
            l.get(&t2.execution_id).unwrap().unwrap().status,
            ExecutionStatus::ResultDelivered
        );
    }
}

#[test]
fn undelivered_results_come_back_after_a_crash_and_stop_once_marked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let ids = process(async {
        let exec = exec_on(&path, config(1, 4));
        let tool = Scripted::new(ToolDescriptor::side_effect("email", 1), &[]);
        exec.register(tool).unwrap();
        let out = exec
            .execute_round(
                &opid(),
                0,
                vec![tcall("c1", "email", "{}"), tcall("c2", "email", "{}")],
            )
            .await
            .unwrap();
        let ids: Vec<ExecutionId> = out.iter().map(|o| o.execution_id().clone()).collect();
        // c1 handed to the model and marked; c2 not; then killed (abandon).
        exec.ledger().mark_delivered(&ids[..1]).unwrap();
        exec.ledger().abandon();
        ids
    });
    let again = process(async {
        let exec = exec_on(&path, config(1, 4));
        let tool = Scripted::new(ToolDescriptor::side_effect("email", 1), &[]);
        exec.register(tool.clone()).unwrap();
        let rec = exec.recover().await.unwrap();
        let first: Vec<ExecutionId> = rec
            .outcomes
            .iter()
            .map(|o| o.execution_id().clone())
            .collect();
        exec.ledger().mark_delivered(&first).unwrap();
        let rec2 = exec.recover().await.unwrap();
        (first, rec2.outcomes.len(), tool.performs())
    });
    eprintln!("after crash: {again:?} ids {ids:?}");
    assert_eq!(again.2, 0);
    assert!(again.0.contains(&ids[1]));
    assert_eq!(again.1, 0);
}

// ---------------------------------------------------------------------------
// A round whose caller stops waiting while some of its calls wait for a
// parallelism slot: those calls were begun (durably `executing`, owned by
// this live session) but never sent.
// ---------------------------------------------------------------------------
// ---------------------------------------------------------------------------
// A job's webhook handled (in another session) before the tool's JobStarted
// is recorded.

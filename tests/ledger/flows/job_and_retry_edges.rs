//! The edges of the job and retry fixes: a job finished (or failed) by its
//! webhook before its id was recorded, a job id reported on a row marked
//! unknown, `recover()` continuing a batch while its caller waits out a
//! backoff, a retry that wakes onto another caller's orphan, a round's
//! queued call asked for concurrently.

use super::*;

// ---------------------------------------------------------------------------
// A job whose webhook FAILS it before the tool's JobStarted is recorded.
// record_job now answers InvalidTransition{from: FailedBeforeCommit}, which
// or_current passes through only for a committed row: the caller gets an
// error instead of the call's truth (Failed).
// ---------------------------------------------------------------------------
struct FastFailingJob {
    webhook_handler: Arc<Ledger>,
}

#[async_trait]
impl ToolHandler for FastFailingJob {
    fn descriptor(&self) -> ToolDescriptor {
        keyed("render")
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let applied = self
            .webhook_handler
            .ingest_webhook(
                "svc",
                "ev_failed",
                &req.execution_id,
                &JobUpdate::Failed {
                    reason: "render failed".into(),
                },
            )
            .unwrap();
        assert!(matches!(applied, JobApplied::Failed), "{applied:?}");
        Ok(PerformOutcome::JobStarted {
            job_id: "job_1".into(),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failed_by_its_webhook_first_is_reported_failed_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let exec = exec_on(&path, config(1, 4));
    let handler = Arc::new(Ledger::open(&path, LedgerConfig::default()).unwrap());
    exec.register(Arc::new(FastFailingJob {
        webhook_handler: handler.clone(),
    }))
    .unwrap();
    let out = exec.execute(&opid(), 0, tcall("c1", "render", "{}")).await;
    let rec = exec.ledger().list(&opid()).unwrap().pop().unwrap();
    eprintln!("outcome {out:?}; status {}", rec.status);
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    match out {
        Ok(CallOutcome::Failed {
            retryable: false, ..
        }) => {}
        other => panic!("the job failed (recorded), but the caller is told {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// recover() continuing a batch (items committed) while the live caller of
// the same batch in this process sleeps in its backoff: one effect per item,
// the live caller gets the truth.
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_continuing_a_batch_during_the_live_callers_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(400, 4));
    let desc = ToolDescriptor {
        batch: toolledger::executor::BatchMode::Independent,
        ..keyed("invite")
    };
    let tool = Scripted::new(
        desc,
        &[Act::Commit, Act::FailRetryable, Act::Commit, Act::Commit],
    );
    exec.register(tool.clone()).unwrap();
    let args = r#"{"items":[{"a":0},{"a":1},{"a":2}]}"#;
    let a = {
        let exec = exec.clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, tcall("b1", "invite", args)).await })
    };
    wait_for_status(&exec, ExecutionStatus::FailedBeforeCommit).await;
    let rec = exec.recover().await.unwrap();
    eprintln!(
        "recover during batch backoff: {:?} failed {:?}",
        rec.outcomes, rec.failed
    );
    let a = a.await.unwrap();
    eprintln!(
        "live caller: {a:?}; effects {:?}",
        tool.effects.lock().unwrap()
    );
    assert!(tool.effects.lock().unwrap().values().all(|n| *n == 1));
    assert_eq!(tool.effects(), 3);
    assert!(
        matches!(
            a,
            Ok(CallOutcome::Completed { .. } | CallOutcome::InFlight { .. })
        ),
        "{a:?}"
    );
}

// ---------------------------------------------------------------------------
// A retry in backoff overtaken by a repeat whose caller then goes away mid
// attempt (an orphan of this executor): the sleeper wakes and answers
// InFlight from current_outcome, for an attempt nobody in this process will
// finish (take_over_orphan is never asked).
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waking_onto_an_orphan_is_not_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(300, 4));
    let tool = Scripted::new(keyed("pay"), &[Act::FailRetryable, Act::Hold]);
    let mut reached = tool.gate();
    exec.register(tool.clone()).unwrap();
    let c = tcall("c1", "pay", r#"{"amount":1}"#);
    let a = {
        let exec = exec.clone();
        let c = c.clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, c).await })
    };
    wait_for_status(&exec, ExecutionStatus::FailedBeforeCommit).await;
    let b = {
        let exec = exec.clone();
        let c = c.clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, c).await })
    };
    tokio::time::timeout(Duration::from_secs(5), reached.recv())
        .await
        .unwrap();
    b.abort(); // the repeat's caller goes away while attempt 2 runs
    let _ = b.await;
    let a = a.await.unwrap();
    let again = exec.execute(&opid(), 0, c.clone()).await;
    eprintln!(
        "sleeper: {a:?}; next ask: {again:?}; effects {}",
        tool.effects()
    );
    assert!(
        !matches!(a, Ok(CallOutcome::InFlight { .. })),
        "attempt 2 is an orphan (nobody runs it), but the sleeper answers {a:?}"
    );
}

// ---------------------------------------------------------------------------
// The current attempt's job id reported after its row was marked unknown
// (another session found the owner's lease lapsed while it was suspended, or
// a reconciler of this process): record_job now refuses it (InvalidTransition)
// without keeping the job id anywhere, neither on the row nor as evidence.
// Before 8402a88 it was stored (the unknown outcome's best clue).
// ---------------------------------------------------------------------------
#[test]
fn a_job_id_reported_on_an_unknown_row_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _c) = open_at(&dir.path().join("l.db"));
    let t = ticket(
        ledger
            .begin(&op("op"), 0, &spec("c1", "render", "{}"))
            .unwrap(),
    );
    let id = t.execution_id.clone();
    ledger
        .mark_outcome_unknown(&t.attempt_id(), "owner's lease lapsed")
        .unwrap();
    let r = ledger.record_job(&t.attempt_id(), "job_1");
    let rec = ledger.get(&id).unwrap().unwrap();
    let job = ledger.job(&id).unwrap();
    eprintln!(
        "record_job: {r:?}; external id {:?}; job {job:?}",
        rec.external_id
    );
    assert!(
        rec.external_id.as_deref() == Some("job_1") || job.is_some(),
        "the downstream job id of an unknown outcome was dropped ({r:?})"
    );
}

// ---------------------------------------------------------------------------
// The round's early Running guard: a concurrent ask of a call queued for a
// parallelism slot answers InFlight and never takes it over.
// ---------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_round_call_asked_concurrently_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(1, 1));
    let slow = Scripted::new(keyed("slow"), &[Act::Hold, Act::Commit, Act::Commit]);
    let mut reached = slow.gate();
    exec.register(slow.clone()).unwrap();
    let calls = vec![tcall("c1", "slow", "{}"), tcall("c2", "slow", "{}")];
    let round = {
        let exec = exec.clone();
        let calls = calls.clone();
        tokio::spawn(async move { exec.execute_round(&opid(), 0, calls).await })
    };
    tokio::time::timeout(Duration::from_secs(5), reached.recv())
        .await
        .unwrap();
    // One call holds the only slot; the other is begun (durable) and queued.
    let a1 = exec.execute(&opid(), 0, calls[0].clone()).await.unwrap();
    let a2 = exec.execute(&opid(), 0, calls[1].clone()).await.unwrap();
    slow.release.notify_one();
    let round = round.await.unwrap().unwrap();
    eprintln!(
        "concurrent asks: {a1:?} {a2:?}; round {round:?}; performs {}",
        slow.performs()
    );
    assert!(matches!(a1, CallOutcome::InFlight { .. }), "{a1:?}");
    assert!(matches!(a2, CallOutcome::InFlight { .. }), "{a2:?}");
    assert_eq!(slow.performs(), 2);
    assert_eq!(slow.effects(), 2);
}

// A round dropped while its call sleeps in backoff and a repeat runs attempt
// 2: the dropped guard (attempt 1) removes the id from `running`; a third ask
// must still not take attempt 2 over (the orphan's attempt is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_rounds_guard_never_hands_a_live_attempt_over() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(2_000, 4));
    let tool = Scripted::new(keyed("pay"), &[Act::FailRetryable, Act::Hold, Act::Commit]);
    let mut reached = tool.gate();
    let other = Scripted::new(keyed("other"), &[]);
    exec.register(tool.clone()).unwrap();
    exec.register(other.clone()).unwrap();
    let calls = vec![tcall("c1", "pay", "{}"), tcall("c2", "other", "{}")];
    let round = {
        let exec = exec.clone();
        let calls = calls.clone();
        tokio::spawn(async move { exec.execute_round(&opid(), 0, calls).await })
    };
    wait_for_status(&exec, ExecutionStatus::FailedBeforeCommit).await;
    let x = {
        let exec = exec.clone();
        let c = calls[0].clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, c).await })
    };
    tokio::time::timeout(Duration::from_secs(5), reached.recv())
        .await
        .unwrap();
    round.abort();
    let _ = round.await;
    let y = exec.execute(&opid(), 0, calls[0].clone()).await.unwrap();
    tool.release.notify_one();
    let x = x.await.unwrap();
    eprintln!(
        "third ask: {y:?}; repeat {x:?}; performs {}",
        tool.performs()
    );
    assert!(matches!(y, CallOutcome::InFlight { .. }), "{y:?}");
    assert_eq!(tool.performs(), 2);
}

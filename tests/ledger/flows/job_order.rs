//! Jobs whose events arrive out of order: a webhook that finishes the job
//! before the tool's `JobStarted` is recorded, a `Progress` after the end.
//! A finished job stays finished.

use super::*;

// ---------------------------------------------------------------------------
struct FastJob {
    webhook_handler: Arc<Ledger>,
}

#[async_trait]
impl ToolHandler for FastJob {
    fn descriptor(&self) -> ToolDescriptor {
        keyed("render")
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        // The job is accepted and finishes at once; its webhook (which
        // names the execution, e.g. through the job's metadata) is handled
        // by the app's webhook process before this returns.
        let applied = self
            .webhook_handler
            .ingest_webhook(
                "svc",
                "ev_done",
                &req.execution_id,
                &JobUpdate::Succeeded {
                    result_json: r#"{"url":"u"}"#.into(),
                },
            )
            .unwrap();
        assert!(matches!(applied, JobApplied::Committed(_)), "{applied:?}");
        Ok(PerformOutcome::JobStarted {
            job_id: "job_1".into(),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_webhook_committed_it_first_is_not_reported_pending() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let exec = exec_on(&path, config(1, 4));
    let handler = Arc::new(Ledger::open(&path, LedgerConfig::default()).unwrap());
    exec.register(Arc::new(FastJob {
        webhook_handler: handler.clone(),
    }))
    .unwrap();
    let out = exec
        .execute(&opid(), 0, tcall("c1", "render", "{}"))
        .await
        .unwrap();
    let id = out.execution_id().clone();
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    let job = exec.ledger().job(&id).unwrap();
    eprintln!("outcome {out:?}; status {}; job {job:?}", rec.status);
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert!(
        matches!(out, CallOutcome::Completed { .. }),
        "the execution is committed with the job's result, but the caller is told {out:?}"
    );
    assert_eq!(job.map(|j| j.1), Some("succeeded".to_owned()));
}

#[test]
fn a_webhook_that_arrives_before_the_job_id_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _c) = open_at(&dir.path().join("l.db"));
    let t = ticket(
        ledger
            .begin(&op("op"), 0, &spec("c1", "render", "{}"))
            .unwrap(),
    );
    let id = t.execution_id.clone();
    let w = ledger
        .ingest_webhook(
            "svc",
            "ev1",
            &id,
            &JobUpdate::Succeeded {
                result_json: r#"{"url":"u"}"#.into(),
            },
        )
        .unwrap();
    assert!(matches!(w, JobApplied::Committed(_)));
    // The tool's JobStarted is now recorded.
    let r = ledger.record_job(&t.attempt_id(), "job_1");
    let job = ledger.job(&id).unwrap();
    let rec = ledger.get(&id).unwrap().unwrap();
    eprintln!(
        "record_job after commit: {r:?}; job {job:?}; status {}",
        rec.status
    );
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(
        job.as_ref().map(|j| j.1.as_str()),
        Some("succeeded"),
        "the job of a committed execution must not read as started again"
    );
}

#[test]
fn a_late_progress_event_does_not_reopen_a_finished_job() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _c) = open_at(&dir.path().join("l.db"));
    let t = started_job(&ledger, "c1");
    let id = t.execution_id.clone();
    ledger
        .ingest_webhook(
            "svc",
            "ev2",
            &id,
            &JobUpdate::Failed {
                reason: "boom".into(),
            },
        )
        .unwrap();
    // The "running" event, sent earlier, arrives last.
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
    assert_eq!(
        ledger.get(&id).unwrap().unwrap().status,
        ExecutionStatus::FailedBeforeCommit
    );
    assert_eq!(
        late,
        JobApplied::AlreadyFinal(ExecutionStatus::FailedBeforeCommit),
        "JobApplied::Progress means 'the execution is still waiting'"
    );
    assert_eq!(job.map(|j| j.1), Some("failed".to_owned()));
}

fn started_job(ledger: &Ledger, call_id: &str) -> toolledger::ledger::Ticket {
    let t = ticket(
        ledger
            .begin(&op("op"), 0, &spec(call_id, "render", "{}"))
            .unwrap(),
    );
    ledger.record_job(&t.attempt_id(), "job_1").unwrap();
    t
}

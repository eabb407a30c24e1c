//! Job updates attacked: a second `Succeeded` whose result differs from the
//! committed one, a `Progress` that arrives before the tool's `JobStarted`
//! is recorded.

use super::*;

fn started(ledger: &Ledger, call_id: &str) -> toolledger::ledger::Ticket {
    let t = ticket(
        ledger
            .begin(&op("op"), 0, &spec(call_id, "render", "{}"))
            .unwrap(),
    );
    ledger.record_job(&t.attempt_id(), "job_1").unwrap();
    t
}

fn succeeded(result: &str) -> JobUpdate {
    JobUpdate::Succeeded {
        result_json: result.into(),
    }
}

/// The job is committed by its first `Succeeded`; a later one (another
/// event, or polling) carries another result. The stored result stands,
/// but what the downstream reported is an effect found for a call committed
/// with another result: it is kept as evidence (as a resolver's `Found`
/// with another result is), never dropped. The same result again keeps
/// nothing.
#[test]
fn a_later_success_with_another_result_is_kept_as_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _c) = open_at(&dir.path().join("l.db"));
    let t = started(&ledger, "c1");
    let id = t.execution_id.clone();
    let first = ledger
        .ingest_webhook("svc", "e1", &id, &succeeded(r#"{"v":1}"#))
        .unwrap();
    assert!(matches!(first, JobApplied::Committed(_)), "{first:?}");
    // The same result again (polling): nothing kept.
    assert_eq!(
        ledger
            .record_job_update(&id, &succeeded(r#"{"v":1}"#))
            .unwrap(),
        JobApplied::AlreadyFinal(ExecutionStatus::Committed)
    );
    assert!(ledger.evidence(&id).unwrap().is_empty());
    // Another event with another result.
    assert_eq!(
        ledger
            .ingest_webhook("svc", "e2", &id, &succeeded(r#"{"v":2}"#))
            .unwrap(),
        JobApplied::AlreadyFinal(ExecutionStatus::Committed)
    );
    let rec = ledger.get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"v":1}"#));
    let evidence = ledger.evidence(&id).unwrap();
    assert_eq!(evidence.len(), 1, "the other result is kept");
    assert_eq!(evidence[0].kind, "commit");
    assert_eq!(evidence[0].result_json.as_deref(), Some(r#"{"v":2}"#));
    // A repeat of that event keeps nothing twice.
    assert_eq!(
        ledger
            .ingest_webhook("svc", "e2", &id, &succeeded(r#"{"v":2}"#))
            .unwrap(),
        JobApplied::DuplicateEvent
    );
    assert_eq!(ledger.evidence(&id).unwrap().len(), 1);
}

/// The downstream's "queued" webhook is handled before the tool's
/// `JobStarted` is recorded. The job id recorded afterwards must be the
/// job's, not the empty one the early event had nothing better than.
#[test]
fn a_progress_event_before_the_job_is_recorded_keeps_the_job_id() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _c) = open_at(&dir.path().join("l.db"));
    let t = ticket(
        ledger
            .begin(&op("op"), 0, &spec("c1", "render", "{}"))
            .unwrap(),
    );
    let id = t.execution_id.clone();
    assert_eq!(
        ledger
            .ingest_webhook(
                "svc",
                "e0",
                &id,
                &JobUpdate::Progress {
                    state: "queued".into()
                }
            )
            .unwrap(),
        JobApplied::Progress
    );
    ledger.record_job(&t.attempt_id(), "job_1").unwrap();
    let rec = ledger.get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Executing);
    assert_eq!(rec.external_id.as_deref(), Some("job_1"));
    let job = ledger.job(&id).unwrap();
    assert_eq!(
        job.as_ref().map(|j| j.0.as_str()),
        Some("job_1"),
        "the job id of the job row: {job:?}"
    );
}

/// A job tool with a lookup that cannot see a job still running (its
/// effect is not there yet): each `perform` starts one more job downstream.
struct LookupJob {
    jobs: AtomicU32,
}

#[async_trait]
impl ToolHandler for LookupJob {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            lookup: true,
            landing_window: Duration::ZERO,
            ..ToolDescriptor::side_effect("export", 1)
        }
    }
    async fn perform(&self, _req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let n = self.jobs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(PerformOutcome::JobStarted {
            job_id: format!("job_{n}"),
        })
    }
    async fn lookup(
        &self,
        _req: ToolRequest,
    ) -> Result<toolledger::executor::LookupOutcome, ToolError> {
        Ok(toolledger::executor::LookupOutcome::NotFound)
    }
}

/// The downstream's own label for a running job happens to be one of the
/// words the ledger uses for a finished job ("succeeded": the render is
/// done, the upload still running). Recorded as `Progress`, the job is
/// still pending: after a restart, recovery must report it `Pending` and
/// start nothing, not take it for finished, look it up (not found: the job
/// is still running) and start a second job.
#[test]
fn a_progress_label_that_reads_like_an_end_is_still_pending_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let tool = Arc::new(LookupJob {
        jobs: AtomicU32::new(0),
    });
    let call = || ToolCall::custom("c1", "export", "{}");
    let id = process(async {
        let exec = exec_on(&path, config(1, 4));
        exec.register(tool.clone()).unwrap();
        let out = exec.execute(&opid(), 0, call()).await.unwrap();
        assert!(matches!(&out, CallOutcome::Pending { job_id, .. } if job_id == "job_1"));
        for label in ["failed", "succeeded"] {
            assert_eq!(
                exec.record_job_update(
                    out.execution_id(),
                    &JobUpdate::Progress {
                        state: label.into()
                    }
                )
                .unwrap(),
                JobApplied::Progress
            );
        }
        out.execution_id().clone()
    }); // the process dies with the job running downstream
    process(async {
        let exec = exec_on(&path, config(1, 4));
        exec.register(tool.clone()).unwrap();
        let recovered = exec.recover().await.unwrap();
        assert!(recovered.failed.is_empty(), "{:?}", recovered.failed);
        assert!(
            matches!(recovered.outcomes.as_slice(), [CallOutcome::Pending { job_id, .. }] if job_id == "job_1"),
            "{:?}",
            recovered.outcomes
        );
        let again = exec.execute(&opid(), 0, call()).await.unwrap();
        assert!(matches!(again, CallOutcome::Pending { .. }), "{again:?}");
        let rec = exec.ledger().get(&id).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
        assert_eq!(rec.attempt_count, 1);
    });
    assert_eq!(tool.jobs.load(Ordering::SeqCst), 1, "one job downstream");
}

/// A webhook event id is processed once, for the execution it was first
/// applied to. The same `(source, event id)` named for another execution
/// (an app that keys events by their type, a misrouted delivery) is not "a
/// repeat, ignored": answering `DuplicateEvent` would drop the other job's
/// result while it stays pending for ever. It is refused with a typed
/// error, nothing is recorded, and the first execution keeps its event.
#[test]
fn an_event_id_already_used_for_another_execution_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _c) = open_at(&dir.path().join("l.db"));
    let a = started(&ledger, "c1");
    let b = started(&ledger, "c2");
    assert!(matches!(
        ledger
            .ingest_webhook(
                "svc",
                "job.succeeded",
                &a.execution_id,
                &succeeded(r#"{"v":"a"}"#)
            )
            .unwrap(),
        JobApplied::Committed(_)
    ));
    let reused = ledger.ingest_webhook(
        "svc",
        "job.succeeded",
        &b.execution_id,
        &succeeded(r#"{"v":"b"}"#),
    );
    match &reused {
        Err(Error::WebhookEventOfAnotherExecution {
            execution_id,
            event_execution_id,
        }) => {
            assert_eq!(execution_id, &b.execution_id);
            assert_eq!(event_execution_id, &a.execution_id);
        }
        other => panic!("expected WebhookEventOfAnotherExecution, got {other:?}"),
    }
    let rec_b = ledger.get(&b.execution_id).unwrap().unwrap();
    assert_eq!(rec_b.status, ExecutionStatus::Executing);
    assert!(ledger.evidence(&b.execution_id).unwrap().is_empty());
    assert_eq!(
        ledger.job(&b.execution_id).unwrap().map(|j| j.1),
        Some("started".to_owned())
    );
    // Its own event id applies it; the first execution's repeat is ignored.
    assert!(matches!(
        ledger
            .ingest_webhook("svc", "evt_b", &b.execution_id, &succeeded(r#"{"v":"b"}"#))
            .unwrap(),
        JobApplied::Committed(_)
    ));
    assert_eq!(
        ledger
            .ingest_webhook(
                "svc",
                "job.succeeded",
                &a.execution_id,
                &succeeded(r#"{"v":"a"}"#)
            )
            .unwrap(),
        JobApplied::DuplicateEvent
    );
    let rec_a = ledger.get(&a.execution_id).unwrap().unwrap();
    assert_eq!(rec_a.result_json.as_deref(), Some(r#"{"v":"a"}"#));
}

/// A tool that starts a job and polls it to the end, in an app whose
/// webhook handler also applies the job's completion. The webhook lands
/// first and commits the execution with its payload; the tool's own
/// `Committed`, from polling, carries another rendering of the result and
/// the job id.
struct PollsItsJob {
    performs: AtomicU32,
    webhook_handler: Arc<Ledger>,
}

#[async_trait]
impl ToolHandler for PollsItsJob {
    fn descriptor(&self) -> ToolDescriptor {
        keyed("render")
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        self.performs.fetch_add(1, Ordering::SeqCst);
        let applied = self
            .webhook_handler
            .ingest_webhook(
                "svc",
                "ev_done",
                &req.execution_id,
                &succeeded(r#"{"url":"u","via":"webhook"}"#),
            )
            .unwrap();
        assert!(matches!(applied, JobApplied::Committed(_)), "{applied:?}");
        Ok(PerformOutcome::Committed {
            result_json: r#"{"url":"u","via":"poll"}"#.into(),
            external_id: Some("job_1".into()),
        })
    }
}

/// The call committed (by the webhook): the caller gets the stored result,
/// not `AlreadyCommitted`, and what the tool reported (its result, its job
/// id) is kept as evidence, never dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_commit_after_its_webhook_committed_the_call_is_kept_and_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let exec = exec_on(&path, config(1, 4));
    let tool = Arc::new(PollsItsJob {
        performs: AtomicU32::new(0),
        webhook_handler: Arc::new(Ledger::open(&path, LedgerConfig::default()).unwrap()),
    });
    exec.register(tool.clone()).unwrap();
    let out = exec
        .execute(&opid(), 0, ToolCall::custom("c1", "render", "{}"))
        .await;
    let out = match out {
        Ok(out) => out,
        Err(e) => panic!("the call committed, but the caller is told {e:?}"),
    };
    assert_eq!(out.result_json(), Some(r#"{"url":"u","via":"webhook"}"#));
    let id = out.execution_id().clone();
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(
        rec.result_json.as_deref(),
        Some(r#"{"url":"u","via":"webhook"}"#)
    );
    let evidence = exec.ledger().evidence(&id).unwrap();
    assert_eq!(evidence.len(), 1, "the tool's own report is kept");
    assert_eq!(evidence[0].kind, "commit");
    assert_eq!(
        evidence[0].result_json.as_deref(),
        Some(r#"{"url":"u","via":"poll"}"#)
    );
    assert_eq!(evidence[0].external_id.as_deref(), Some("job_1"));
    assert_eq!(
        tool.performs.load(Ordering::SeqCst),
        1,
        "one job downstream"
    );
}

/// A job update for a call that never started (it waits for approval):
/// no job can be running for it, so the update is misrouted. It is refused
/// with a typed error and records nothing, not even its event id, rather
/// than answered `AlreadyFinal(Prepared)` ("already reached a final
/// status") with a `Succeeded` dropped and the event id used up.
#[test]
fn a_job_update_for_a_call_that_never_started_is_refused_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _c) = open_at(&dir.path().join("l.db"));
    let answer = ledger
        .begin(&op("op"), 0, &spec("c1", "render", "{}").with_approval())
        .unwrap();
    let Begin::NeedsApproval(request) = answer else {
        panic!("{answer:?}")
    };
    let id = request.execution_id.clone();
    for (event, update, transition) in [
        (
            "e1",
            succeeded(r#"{"v":1}"#),
            toolledger::model::Transition::Commit,
        ),
        (
            "e2",
            JobUpdate::Failed {
                reason: "boom".into(),
            },
            toolledger::model::Transition::FailBeforeCommit,
        ),
        (
            "e3",
            JobUpdate::Progress {
                state: "queued".into(),
            },
            toolledger::model::Transition::Start,
        ),
    ] {
        let refused = ledger.ingest_webhook("svc", event, &id, &update);
        assert!(
            matches!(
                &refused,
                Err(Error::InvalidTransition { from: ExecutionStatus::Prepared, transition: t, .. })
                    if *t == transition
            ),
            "{event}: {refused:?}"
        );
    }
    let rec = ledger.get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Prepared);
    assert_eq!(ledger.job(&id).unwrap(), None);
    assert!(ledger.evidence(&id).unwrap().is_empty());
    // Approved and started, the job's real event (the same id) applies.
    ledger.approve(&id, &request.args_digest, None).unwrap();
    let t = ledger.mark_executing(&id).unwrap();
    ledger.record_job(&t.attempt_id(), "job_1").unwrap();
    assert!(matches!(
        ledger
            .ingest_webhook("svc", "e1", &id, &succeeded(r#"{"v":1}"#))
            .unwrap(),
        JobApplied::Committed(_)
    ));
}

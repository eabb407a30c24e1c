//! Background jobs and webhooks: a downstream's long-running job, its events applied once.

use std::sync::Arc;

use downstream::{Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{JobApplied, JobUpdate};
use toolledger::model::{ExecutionStatus, OperationId, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

fn render_tool(service: &Downstream) -> HttpTool {
    let desc = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("render_video", 1)
    };
    HttpTool::new(desc, Kind::Job, service)
}

async fn start_job(exec: &Executor) -> (CallOutcome, String) {
    let op = OperationId::new("op_jobs").unwrap();
    let call = ToolCall::custom("call_1", "render_video", r#"{"clip":"a.mov"}"#);
    let out = exec.execute(&op, 0, call).await.unwrap();
    let CallOutcome::Pending { job_id, .. } = &out else {
        panic!("{out:?}")
    };
    let job_id = job_id.clone();
    (out, job_id)
}

#[tokio::test]
async fn a_webhook_delivered_twice_commits_the_job_once() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    exec.register(Arc::new(render_tool(&service))).unwrap();

    let (out, job_id) = start_job(&exec).await;
    let id = out.execution_id().clone();
    assert_eq!(job_id, "eff_1");
    assert_eq!(
        exec.ledger().job(&id).unwrap(),
        Some(("eff_1".to_owned(), "started".to_owned()))
    );

    // Polling reports progress before the webhook arrives.
    let progress = JobUpdate::Progress {
        state: "rendering".into(),
    };
    assert_eq!(
        exec.record_job_update(&id, &progress).unwrap(),
        JobApplied::Progress
    );
    assert_eq!(
        exec.ledger().job(&id).unwrap(),
        Some(("eff_1".to_owned(), "rendering".to_owned()))
    );
    assert_eq!(
        exec.ledger().get(&id).unwrap().unwrap().status,
        ExecutionStatus::Executing
    );

    let done = JobUpdate::Succeeded {
        result_json: r#"{"url":"https://cdn.example/a.mp4"}"#.into(),
    };
    let first = exec
        .ingest_webhook("render_svc", "evt_1", &id, &done)
        .unwrap();
    let JobApplied::Committed(stored) = &first else {
        panic!("{first:?}")
    };
    assert_eq!(stored.result_json, r#"{"url":"https://cdn.example/a.mp4"}"#);
    let second = exec
        .ingest_webhook("render_svc", "evt_1", &id, &done)
        .unwrap();
    assert_eq!(second, JobApplied::DuplicateEvent);
    assert_eq!(exec.metrics().duplicate_webhooks, 1);

    let rec = exec.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.external_id.as_deref(), Some("eff_1"));
    let commits = exec
        .ledger()
        .transitions(&id)
        .unwrap()
        .iter()
        .filter(|e| e.transition == "commit")
        .count();
    assert_eq!(commits, 1);
    assert_eq!(
        exec.ledger().job(&id).unwrap(),
        Some(("eff_1".to_owned(), "succeeded".to_owned()))
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.requests().len(), 1);
}

#[tokio::test]
async fn a_different_event_after_the_commit_changes_nothing() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"));
    exec.register(Arc::new(render_tool(&service))).unwrap();

    let (out, _) = start_job(&exec).await;
    let id = out.execution_id().clone();
    let done = JobUpdate::Succeeded {
        result_json: r#"{"url":"u1"}"#.into(),
    };
    assert!(matches!(
        exec.ingest_webhook("render_svc", "evt_1", &id, &done)
            .unwrap(),
        JobApplied::Committed(_)
    ));
    let late_failure = JobUpdate::Failed {
        reason: "late".into(),
    };
    assert_eq!(
        exec.ingest_webhook("render_svc", "evt_2", &id, &late_failure)
            .unwrap(),
        JobApplied::AlreadyFinal(ExecutionStatus::Committed)
    );
    let rec = exec.ledger().get(&id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"url":"u1"}"#));
    // The call asked again replays the job's result; no second job.
    let op = OperationId::new("op_jobs").unwrap();
    let call = ToolCall::custom("call_1", "render_video", r#"{"clip":"a.mov"}"#);
    let again = exec.execute(&op, 0, call).await.unwrap();
    assert_eq!(again.result_json(), Some(r#"{"url":"u1"}"#));
    assert_eq!(service.requests().len(), 1);
}

/// A restart while the job runs downstream: recovery resends the same key,
/// the service answers with the job it already has, and the webhook that
/// arrives afterwards commits the execution.
#[test]
fn a_restart_while_the_job_runs_finds_the_same_job_and_the_webhook_commits_it() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let id = downstream::process(async {
        let exec = executor_at(&dir.path().join("l.db"));
        exec.register(Arc::new(render_tool(&service))).unwrap();
        let (out, _) = start_job(&exec).await;
        out.execution_id().clone()
    });
    downstream::process(async {
        let exec = executor_at(&dir.path().join("l.db"));
        exec.register(Arc::new(render_tool(&service))).unwrap();
        let recovered = exec.recover().await.unwrap().outcomes;
        assert_eq!(recovered.len(), 1);
        let CallOutcome::Pending { job_id, .. } = &recovered[0] else {
            panic!("{:?}", recovered[0])
        };
        assert_eq!(job_id, "eff_1");
        let done = JobUpdate::Succeeded {
            result_json: r#"{"url":"u1"}"#.into(),
        };
        assert!(matches!(
            exec.ingest_webhook("render_svc", "evt_1", &id, &done)
                .unwrap(),
            JobApplied::Committed(_)
        ));
        assert_eq!(
            exec.ledger().get(&id).unwrap().unwrap().status,
            ExecutionStatus::Committed
        );
    });
    assert_eq!(service.effects().len(), 1, "one job downstream");
}

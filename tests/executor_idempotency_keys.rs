//! The executor against a downstream that dedupes by `Idempotency-Key`
//! (rows 1, 2 and 5 of the executor matrix): replay without a request, a
//! crash after the remote commit recovered by resending the same key, a
//! changed-arguments conflict that never reaches the service (and the
//! service's own 422 guard), and 500s retried under one key.

use toolledger_test_support::downstream;

use std::path::Path;
use std::sync::{Arc, Weak};

use downstream::{fast_config, process, CrashPoint, Downstream, HttpTool, Kind, CLIENT_TIMEOUT};
use toolledger::executor::{CallOutcome, Executor, ExecutorConfig, ToolDescriptor};
use toolledger::ledger::{Ledger, LedgerConfig};
use toolledger::model::{ExecutionStatus, OperationId, ToolCall};

fn keyed() -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("send_email", 1)
    }
}

fn executor_at(path: &Path, config: ExecutorConfig) -> Executor {
    let ledger = Ledger::open(path, LedgerConfig::default()).unwrap();
    Executor::new(Arc::new(ledger), config)
}

fn op() -> OperationId {
    OperationId::new("op_keys").unwrap()
}

fn email(args: &str) -> ToolCall {
    ToolCall::custom("call_1", "send_email", args)
}

fn moves(exec: &Executor, out: &CallOutcome) -> Vec<String> {
    exec.ledger()
        .transitions(out.execution_id())
        .unwrap()
        .iter()
        .map(|e| format!("{}->{}@{}", e.transition, e.to, e.attempt))
        .collect()
}

#[tokio::test]
async fn a_committed_call_is_replayed_from_the_ledger_without_a_second_request() {
    let service = Downstream::start(downstream::Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
        .unwrap();

    let first = exec
        .execute(&op(), 0, email(r#"{"to":"bob"}"#))
        .await
        .unwrap();
    let CallOutcome::Completed {
        replayed: false,
        result_json,
        external_id,
        ..
    } = &first
    else {
        panic!("{first:?}")
    };
    assert_eq!(external_id.as_deref(), Some("eff_1"));

    let again = exec
        .execute(&op(), 0, email(r#"{"to":"bob"}"#))
        .await
        .unwrap();
    let CallOutcome::Completed {
        replayed: true,
        result_json: replayed_json,
        ..
    } = &again
    else {
        panic!("{again:?}")
    };
    assert_eq!(replayed_json, result_json);
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.requests().len(), 1);
    let rec = exec.ledger().get(first.execution_id()).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(
        service.effects()[0].key.as_deref(),
        Some(rec.downstream_key.as_str())
    );
    assert_eq!(exec.metrics().replays, 1);
}

/// Crash boundary `after-remote-commit`: the service committed, the process
/// died before the local commit. Recovery resends the same key and the
/// service answers with the original effect.
#[test]
fn a_crash_after_the_remote_commit_is_recovered_by_resending_the_same_key() {
    let service = Downstream::start(downstream::Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");

    let dead: Weak<Ledger> = process(async {
        let exec = executor_at(&path, fast_config());
        let tool = HttpTool::new(keyed(), Kind::Effect, &service);
        let mut crash = tool.crash_at(None, CrashPoint::AfterResponse);
        exec.register(Arc::new(tool)).unwrap();
        let run = exec.clone();
        tokio::spawn(async move { run.execute(&op(), 0, email(r#"{"to":"bob"}"#)).await });
        crash.reached().await;
        Arc::downgrade(exec.ledger())
    });
    assert!(
        dead.upgrade().is_none(),
        "the first process's ledger is gone"
    );
    assert_eq!(service.effects().len(), 1);

    process(async {
        let exec = executor_at(&path, fast_config());
        exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
            .unwrap();
        let recovered = exec.recover().await.unwrap().outcomes;
        assert_eq!(recovered.len(), 1);
        let out = &recovered[0];
        let CallOutcome::Completed {
            replayed: false,
            external_id,
            ..
        } = out
        else {
            panic!("{out:?}")
        };
        assert_eq!(external_id.as_deref(), Some("eff_1"), "the original effect");
        let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Committed);
        assert_eq!(
            moves(&exec, out),
            [
                "start->executing@1",
                "mark_unknown->outcome_unknown@1",
                "retry->executing@2",
                "commit->committed@2"
            ]
        );
        // A later execute of the same call is a replay.
        let again = exec
            .execute(&op(), 0, email(r#"{"to":"bob"}"#))
            .await
            .unwrap();
        assert!(matches!(
            again,
            CallOutcome::Completed { replayed: true, .. }
        ));
    });
    assert_eq!(service.effects().len(), 1);
    let posts = service.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].key, posts[1].key);
}

#[tokio::test]
async fn changed_arguments_under_a_known_call_id_are_a_conflict_and_never_sent() {
    let service = Downstream::start(downstream::Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
        .unwrap();

    let first = exec
        .execute(&op(), 0, email(r#"{"to":"bob"}"#))
        .await
        .unwrap();
    assert!(matches!(
        first,
        CallOutcome::Completed {
            replayed: false,
            ..
        }
    ));
    let changed = exec
        .execute(&op(), 0, email(r#"{"to":"eve"}"#))
        .await
        .unwrap();
    let CallOutcome::Conflict {
        stored_digest,
        new_digest,
        ..
    } = &changed
    else {
        panic!("{changed:?}")
    };
    assert_ne!(stored_digest, new_digest);
    assert_eq!(
        service.requests().len(),
        1,
        "the conflict never reached the service"
    );
    assert_eq!(service.effects().len(), 1);
    let rec = exec.ledger().get(first.execution_id()).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(&rec.args_digest, stored_digest);
    assert_eq!(exec.metrics().conflicts, 1);
}

#[test]
fn the_service_refuses_a_reused_key_with_another_body_without_an_effect() {
    let service = Downstream::start(downstream::Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let post = |body: &str| {
        downstream::request_blocking(
            service.addr(),
            "POST",
            "/effects",
            Some("tl_same"),
            body,
            CLIENT_TIMEOUT,
        )
        .unwrap()
    };
    let original = post(r#"{"to":"bob"}"#);
    assert_eq!(original.status, 201);
    let repeat = post(r#"{"to":"bob"}"#);
    assert_eq!(
        repeat, original,
        "same key, same body: the original response"
    );
    let changed = post(r#"{"to":"eve"}"#);
    assert_eq!(changed.status, 422);
    assert_eq!(service.effects().len(), 1);
}

#[tokio::test]
async fn server_errors_before_commit_are_retried_under_one_key_until_it_commits_once() {
    let service = Downstream::start(downstream::Behaviour {
        idempotency: true,
        fail_before_commit: 2,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
        .unwrap();

    let out = exec
        .execute(&op(), 0, email(r#"{"to":"bob"}"#))
        .await
        .unwrap();
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
    assert_eq!(service.effects().len(), 1);
    let posts = service.posts();
    assert_eq!(posts.len(), 3);
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert!(
        posts
            .iter()
            .all(|p| p.key.as_deref() == Some(rec.downstream_key.as_str())),
        "every attempt carries the execution's one key"
    );
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.attempt_count, 3);
    assert_eq!(
        moves(&exec, &out),
        [
            "start->executing@1",
            "mark_unknown->outcome_unknown@1",
            "retry->executing@2",
            "mark_unknown->outcome_unknown@2",
            "retry->executing@3",
            "commit->committed@3"
        ]
    );
    assert_eq!(exec.metrics().outcome_unknown, 2);
}

#[tokio::test]
async fn server_errors_past_max_attempts_leave_the_outcome_unknown_without_another_request() {
    let service = Downstream::start(downstream::Behaviour {
        idempotency: true,
        fail_before_commit: 10,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_at(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
        .unwrap();

    let out = exec
        .execute(&op(), 0, email(r#"{"to":"bob"}"#))
        .await
        .unwrap();
    assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
    assert_eq!(service.posts().len(), 3);
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    // Asking again does not send a fourth request.
    let again = exec
        .execute(&op(), 0, email(r#"{"to":"bob"}"#))
        .await
        .unwrap();
    assert!(matches!(again, CallOutcome::Unknown { .. }), "{again:?}");
    assert_eq!(service.posts().len(), 3);
    assert!(service.effects().is_empty());
}

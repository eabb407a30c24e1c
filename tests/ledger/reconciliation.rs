//! Reconciliation of unknown outcomes: lookup, same-key resend, or an honest Unknown.

use std::sync::Arc;
use std::time::Duration;

use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{CallOutcome, Executor, ExecutorConfig, ToolDescriptor};
use toolledger::ledger::Resolution;
use toolledger::model::{ExecutionStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

/// No idempotency key, no lookup: nothing can be asked downstream.
fn blind() -> ToolDescriptor {
    ToolDescriptor::side_effect("pay", 1)
}

/// Lookup by reference, no key dedupe. The loopback service applies a
/// request before it answers (no latency here), so nothing lands after the
/// client gave up: the tool may say so.
fn lookup() -> ToolDescriptor {
    ToolDescriptor {
        lookup: true,
        landing_window: Duration::ZERO,
        ..ToolDescriptor::side_effect("pay", 1)
    }
}

fn pay() -> ToolCall {
    ToolCall::custom("call_1", "pay", r#"{"amount":"12.50","to":"bob"}"#)
}

fn moves(exec: &Executor, out: &CallOutcome) -> Vec<String> {
    exec.ledger()
        .transitions(out.execution_id())
        .unwrap()
        .iter()
        .map(|e| format!("{}->{}@{}", e.transition, e.to, e.attempt))
        .collect()
}

fn status(exec: &Executor, out: &CallOutcome) -> ExecutionStatus {
    exec.ledger()
        .get(out.execution_id())
        .unwrap()
        .unwrap()
        .status
}

#[tokio::test]
async fn a_dropped_connection_after_commit_without_key_or_lookup_is_unknown_and_never_retried() {
    let service = Downstream::start(Behaviour {
        close_after_commit: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(blind(), Kind::Effect, &service)))
        .unwrap();

    let out = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
    assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
    assert_eq!(status(&exec, &out), ExecutionStatus::OutcomeUnknown);
    assert_eq!(service.requests().len(), 1, "not retried blindly");
    assert_eq!(service.effects().len(), 1);

    // The model (or app) asking again does not resend it either.
    let again = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
    assert!(matches!(again, CallOutcome::Unknown { .. }), "{again:?}");
    assert_eq!(service.requests().len(), 1);

    // The user checked: it happened. The app records what was found.
    let effect = &service.effects()[0];
    let resolved = exec
        .resolve_unknown(
            &out.unknown_attempt().unwrap(),
            Resolution::Found {
                result_json: r#"{"paid":true}"#.into(),
                external_id: Some(effect.id.clone()),
            },
        )
        .await
        .unwrap();
    let CallOutcome::Completed {
        result_json,
        external_id,
        replayed: false,
        ..
    } = &resolved
    else {
        panic!("{resolved:?}")
    };
    assert_eq!(result_json, r#"{"paid":true}"#);
    assert_eq!(external_id.as_deref(), Some("eff_1"));
    assert_eq!(status(&exec, &out), ExecutionStatus::Committed);
    assert_eq!(
        moves(&exec, &out),
        [
            "start->executing@1",
            "mark_unknown->outcome_unknown@1",
            "commit->committed@1"
        ]
    );
    assert_eq!(service.requests().len(), 1);
    assert_eq!(service.effects().len(), 1);
    let replay = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
    assert!(matches!(
        replay,
        CallOutcome::Completed { replayed: true, .. }
    ));
}

#[tokio::test]
async fn an_unknown_outcome_the_app_proves_absent_is_recorded_as_failed_before_commit() {
    let service = Downstream::start(Behaviour {
        close_before_commit: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(blind(), Kind::Effect, &service)))
        .unwrap();

    let out = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
    assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
    assert_eq!(service.requests().len(), 1);
    assert!(service.effects().is_empty());

    let resolved = exec
        .resolve_unknown(
            &out.unknown_attempt().unwrap(),
            Resolution::NotFoundAbandon {
                reason: "user found no payment".into(),
            },
        )
        .await
        .unwrap();
    let CallOutcome::Failed {
        reason,
        retryable: false,
        ..
    } = &resolved
    else {
        panic!("{resolved:?}")
    };
    assert_eq!(reason, "user found no payment");
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::FailedBeforeCommit);
    assert_eq!(rec.retryable, Some(false));
    // It stays failed: asking again runs nothing.
    let again = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
    assert!(matches!(again, CallOutcome::Failed { .. }), "{again:?}");
    assert_eq!(service.requests().len(), 1);
    assert!(service.effects().is_empty());
}

#[tokio::test]
async fn a_client_timeout_after_commit_is_settled_by_a_lookup_that_finds_the_effect() {
    let service = Downstream::start(Behaviour {
        hang_after_commit: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(lookup(), Kind::Effect, &service)))
        .unwrap();

    let out = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
    let CallOutcome::Completed {
        external_id,
        replayed: false,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(external_id.as_deref(), Some("eff_1"));
    assert_eq!(status(&exec, &out), ExecutionStatus::Committed);
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
    assert_eq!(service.lookups().len(), 1);
    assert_eq!(
        moves(&exec, &out),
        [
            "start->executing@1",
            "mark_unknown->outcome_unknown@1",
            "commit->committed@1"
        ]
    );
    let m = exec.metrics();
    assert_eq!((m.outcome_unknown, m.reconciled_found), (1, 1));
}

#[tokio::test]
async fn the_executors_perform_timeout_after_commit_is_settled_by_a_lookup() {
    let service = Downstream::start(Behaviour {
        hang_after_commit: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(
        &dir.path().join("l.db"),
        ExecutorConfig {
            perform_timeout: Some(Duration::from_millis(200)),
            ..fast_config()
        },
    );
    let tool = HttpTool::new(lookup(), Kind::Effect, &service).with_timeout(Duration::from_secs(2));
    exec.register(Arc::new(tool)).unwrap();

    let out = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
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
    assert_eq!(status(&exec, &out), ExecutionStatus::Committed);
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert_eq!(
        rec.last_reason.as_deref(),
        Some("timed out waiting for the downstream")
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
}

#[tokio::test]
async fn a_server_error_after_commit_is_settled_by_a_lookup_that_finds_the_effect() {
    let service = Downstream::start(Behaviour {
        fail_after_commit: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(lookup(), Kind::Effect, &service)))
        .unwrap();

    let out = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
    let CallOutcome::Completed {
        external_id,
        replayed: false,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(external_id.as_deref(), Some("eff_1"));
    assert_eq!(status(&exec, &out), ExecutionStatus::Committed);
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
    assert_eq!(service.lookups().len(), 1);
}

#[tokio::test]
async fn a_server_error_before_commit_is_found_absent_by_lookup_and_sent_again_once() {
    let service = Downstream::start(Behaviour {
        fail_before_commit: 1,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(lookup(), Kind::Effect, &service)))
        .unwrap();

    let out = exec.execute(&op("op_unknown"), 0, pay()).await.unwrap();
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
    assert_eq!(status(&exec, &out), ExecutionStatus::Committed);
    assert_eq!(service.effects().len(), 1);
    let posts = service.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].key, posts[1].key);
    assert_eq!(
        moves(&exec, &out),
        [
            "start->executing@1",
            "mark_unknown->outcome_unknown@1",
            "retry->executing@2",
            "commit->committed@2"
        ]
    );
    assert_eq!(exec.metrics().reconciled_not_found, 1);
}

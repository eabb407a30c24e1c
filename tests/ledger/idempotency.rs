//! Idempotency: the same logical call never runs twice; the downstream key, the digest and the executor's whole protocol for a side-effecting call.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use downstream::{fast_config, process, CrashPoint, Downstream, HttpTool, Kind, CLIENT_TIMEOUT};
use support::*;
use toolledger::executor::{CallOutcome, Executor, ExecutorConfig, ToolDescriptor, *};
use toolledger::ledger::{Begin, CallSpec, Ledger, LedgerConfig, ManualClock};
use toolledger::model::{ExecutionStatus, OperationId, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

// ---------------------------------------------------------------------------
// Replay, conflict and identity: the same logical call never runs twice.
// ---------------------------------------------------------------------------
#[test]
fn replay_returns_the_stored_result_byte_for_byte_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec(
        "call_1",
        "send_email",
        r#"{"to":"a@example.com","body":"Grüße 👋"}"#,
    );
    let Begin::Execute(ticket) = ledger.begin(&op("op_1"), 0, &s).unwrap() else {
        panic!("first begin must execute")
    };
    // Deliberately non-canonical result text: replay must not re-serialise it.
    let result = "{ \"id\" : \"msg_9\",\n \"amount\": 1.50 }";
    ledger
        .commit(&ticket.attempt_id(), result, Some("msg_9"))
        .unwrap();

    let mut executes = 0;
    for _ in 0..5 {
        match ledger.begin(&op("op_1"), 0, &s).unwrap() {
            Begin::Replay(r) => {
                assert_eq!(r.result_json, result);
                assert_eq!(r.external_id.as_deref(), Some("msg_9"));
            }
            Begin::Execute(_) => executes += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(executes, 0);
    // Still replays after delivery and after reopening the file.
    ledger
        .mark_delivered(std::slice::from_ref(&ticket.execution_id))
        .unwrap();
    drop(ledger);
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let rec = ledger.get(&ticket.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::ResultDelivered);
    assert_eq!(rec.attempt_count, 1);
    match ledger.begin(&op("op_1"), 0, &s).unwrap() {
        Begin::Replay(r) => assert_eq!(r.result_json, result),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn equivalent_json_is_the_same_call() {
    let (ledger, _c) = support::open_at(&tempfile::tempdir().unwrap().keep().join("l.db"));
    let a = spec("c", "pay", r#"{"b":1,"a":2.0}"#);
    let b = spec("c", "pay", r#"{ "a": 2, "b": 1 }"#);
    let Begin::Execute(t) = ledger.begin(&op("o"), 0, &a).unwrap() else {
        panic!()
    };
    ledger.commit(&t.attempt_id(), "{}", None).unwrap();
    assert!(matches!(
        ledger.begin(&op("o"), 0, &b).unwrap(),
        Begin::Replay(_)
    ));
}

#[test]
fn same_id_with_different_arguments_is_a_conflict_with_both_digests() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let first = spec("call_1", "pay", r#"{"amount":10}"#);
    let changed = spec("call_1", "pay", r#"{"amount":1000}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 2, &first).unwrap() else {
        panic!()
    };
    // Conflict while executing …
    match ledger.begin(&op("op"), 2, &changed).unwrap() {
        Begin::Conflict {
            execution_id,
            stored_digest,
            new_digest,
        } => {
            assert_eq!(execution_id, t.execution_id);
            assert_eq!(stored_digest, t.args_digest);
            assert_ne!(new_digest, stored_digest);
        }
        other => panic!("unexpected {other:?}"),
    }
    ledger
        .commit(&t.attempt_id(), r#"{"paid":10}"#, Some("pay_1"))
        .unwrap();
    // … and after commit; the stored record is untouched.
    assert!(matches!(
        ledger.begin(&op("op"), 2, &changed).unwrap(),
        Begin::Conflict { .. }
    ));
    let rec = ledger.get(&t.execution_id).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::Committed);
    assert_eq!(rec.args_json, r#"{"amount":10}"#);
    assert_eq!(rec.result_json.as_deref(), Some(r#"{"paid":10}"#));
}

#[test]
fn parallel_calls_in_one_round_get_distinct_ids_and_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let mut calls = Vec::new();
    for i in 0..8u32 {
        let mut c = call(
            &format!("call_{i}"),
            "send_email",
            &format!(r#"{{"n":{i}}}"#),
        );
        c.position = i;
        calls.push(CallSpec::new(c, 1));
    }
    // Two calls with identical arguments but different provider ids are still two.
    let mut twin = call("call_twin", "send_email", r#"{"n":0}"#);
    twin.position = 8;
    calls.push(CallSpec::new(twin, 1));
    let answers = ledger.begin_round(&op("op"), 0, &calls).unwrap();
    let mut ids = std::collections::HashSet::new();
    let mut keys = std::collections::HashSet::new();
    for a in &answers {
        let Begin::Execute(t) = a else {
            panic!("{a:?}")
        };
        ids.insert(t.execution_id.clone());
        keys.insert(t.downstream_key.clone());
    }
    assert_eq!(ids.len(), 9);
    assert_eq!(keys.len(), 9);
    let listed = ledger.list(&op("op")).unwrap();
    assert_eq!(
        listed.iter().map(|r| r.position).collect::<Vec<_>>(),
        (0..9).collect::<Vec<_>>()
    );
}

#[test]
fn a_regenerated_round_is_new_executions_not_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let s = spec("call_1", "send_email", r#"{"to":"a@example.com"}"#);
    let Begin::Execute(t) = ledger.begin(&op("op"), 1, &s).unwrap() else {
        panic!()
    };
    ledger
        .commit(&t.attempt_id(), r#"{"sent":1}"#, None)
        .unwrap();
    // The model regenerated its turn: round 2, even with the same provider id
    // and arguments, is a new execution that runs.
    match ledger.begin(&op("op"), 2, &s).unwrap() {
        Begin::Execute(t2) => {
            assert_ne!(t2.execution_id, t.execution_id);
            assert_ne!(t2.downstream_key, t.downstream_key);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn ids_with_separators_do_not_collide() {
    let dir = tempfile::tempdir().unwrap();
    let (ledger, _clock) = open_at(&dir.path().join("l.db"));
    let a = ledger
        .begin(&op("a:round_0:x"), 0, &spec("y", "t", "{}"))
        .unwrap();
    let b = ledger
        .begin(&op("a"), 0, &spec("x:round_0:y", "t", "{}"))
        .unwrap();
    assert!(matches!(a, Begin::Execute(_)));
    assert!(matches!(b, Begin::Execute(_)));
    assert_ne!(a.execution_id(), b.execution_id());
}

// ---------------------------------------------------------------------------
// A first end-to-end run of the executor against in-process fake tools.
// ---------------------------------------------------------------------------
struct Email {
    sent: AtomicU32,
    fail_first_with_unknown: bool,
}

#[async_trait]
impl ToolHandler for Email {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: true,
            ..ToolDescriptor::side_effect("send_email", 1)
        }
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let n = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fail_first_with_unknown && req.attempt == 1 {
            return Err(ToolError::new("connection reset"));
        }
        Ok(PerformOutcome::Committed {
            result_json: format!(r#"{{"message":"m{n}","key":"{}"}}"#, req.downstream_key),
            external_id: Some(format!("m{n}")),
        })
    }
}

fn executor() -> Executor {
    let ledger =
        Ledger::open_in_memory(LedgerConfig::default(), Arc::new(ManualClock::new(0))).unwrap();
    Executor::new(
        Arc::new(ledger),
        ExecutorConfig {
            backoff_base: std::time::Duration::from_millis(1),
            ..ExecutorConfig::default()
        },
    )
}

#[tokio::test]
async fn execute_then_replay() {
    let exec = executor();
    let tool = Arc::new(Email {
        sent: AtomicU32::new(0),
        fail_first_with_unknown: false,
    });
    exec.register(tool.clone()).unwrap();
    let op = OperationId::new("op").unwrap();
    let call = ToolCall::custom("c1", "send_email", r#"{"to":"x"}"#);
    let first = exec.execute(&op, 0, call.clone()).await.unwrap();
    let CallOutcome::Completed {
        replayed: false,
        result_json,
        ..
    } = &first
    else {
        panic!("{first:?}")
    };
    let again = exec.execute(&op, 0, call).await.unwrap();
    let CallOutcome::Completed {
        replayed: true,
        result_json: r2,
        ..
    } = &again
    else {
        panic!("{again:?}")
    };
    assert_eq!(result_json, r2);
    assert_eq!(tool.sent.load(Ordering::SeqCst), 1);
    assert_eq!(exec.metrics().replays, 1);
}

#[tokio::test]
async fn transport_error_with_key_support_retries_under_the_same_key() {
    let exec = executor();
    let tool = Arc::new(Email {
        sent: AtomicU32::new(0),
        fail_first_with_unknown: true,
    });
    exec.register(tool.clone()).unwrap();
    let op = OperationId::new("op").unwrap();
    let out = exec
        .execute(&op, 0, ToolCall::custom("c1", "send_email", "{}"))
        .await
        .unwrap();
    let CallOutcome::Completed { .. } = out else {
        panic!("{out:?}")
    };
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert_eq!(rec.attempt_count, 2);
    let log = exec.ledger().transitions(out.execution_id()).unwrap();
    let moves: Vec<_> = log
        .iter()
        .map(|e| format!("{}->{}@{}", e.transition, e.to, e.attempt))
        .collect();
    assert_eq!(
        moves,
        [
            "start->executing@1",
            "mark_unknown->outcome_unknown@1",
            "retry->executing@2",
            "commit->committed@2"
        ]
    );
}

// ---------------------------------------------------------------------------
// The executor against a downstream that dedupes by `Idempotency-Key`
// (rows 1, 2 and 5 of the executor matrix): replay without a request, a
// crash after the remote commit recovered by resending the same key, a
// changed-arguments conflict that never reaches the service (and the
// service's own 422 guard), and 500s retried under one key.
// ---------------------------------------------------------------------------
fn keyed() -> ToolDescriptor {
    ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("send_email", 1)
    }
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
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
        .unwrap();

    let first = exec
        .execute(&op("op_keys"), 0, email(r#"{"to":"bob"}"#))
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
        .execute(&op("op_keys"), 0, email(r#"{"to":"bob"}"#))
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
        let exec = executor_with(&path, fast_config());
        let tool = HttpTool::new(keyed(), Kind::Effect, &service);
        let mut crash = tool.crash_at(None, CrashPoint::AfterResponse);
        exec.register(Arc::new(tool)).unwrap();
        let run = exec.clone();
        tokio::spawn(async move {
            run.execute(&op("op_keys"), 0, email(r#"{"to":"bob"}"#))
                .await
        });
        crash.reached().await;
        Arc::downgrade(exec.ledger())
    });
    assert!(
        dead.upgrade().is_none(),
        "the first process's ledger is gone"
    );
    assert_eq!(service.effects().len(), 1);

    process(async {
        let exec = executor_with(&path, fast_config());
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
            .execute(&op("op_keys"), 0, email(r#"{"to":"bob"}"#))
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
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
        .unwrap();

    let first = exec
        .execute(&op("op_keys"), 0, email(r#"{"to":"bob"}"#))
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
        .execute(&op("op_keys"), 0, email(r#"{"to":"eve"}"#))
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
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
        .unwrap();

    let out = exec
        .execute(&op("op_keys"), 0, email(r#"{"to":"bob"}"#))
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
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(Arc::new(HttpTool::new(keyed(), Kind::Effect, &service)))
        .unwrap();

    let out = exec
        .execute(&op("op_keys"), 0, email(r#"{"to":"bob"}"#))
        .await
        .unwrap();
    assert!(matches!(out, CallOutcome::Unknown { .. }), "{out:?}");
    assert_eq!(service.posts().len(), 3);
    let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    // Asking again does not send a fourth request.
    let again = exec
        .execute(&op("op_keys"), 0, email(r#"{"to":"bob"}"#))
        .await
        .unwrap();
    assert!(matches!(again, CallOutcome::Unknown { .. }), "{again:?}");
    assert_eq!(service.posts().len(), 3);
    assert!(service.effects().is_empty());
}

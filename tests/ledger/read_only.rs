//! Read-only tools: run directly, record nothing, cost no sync.

use std::sync::Arc;

use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{CallOutcome, Executor, ExecutorConfig, ToolDescriptor};
use toolledger::model::ToolCall;
use toolledger_test_support as support;
use toolledger_test_support::downstream;

fn weather(service: &Downstream) -> Arc<HttpTool> {
    Arc::new(HttpTool::new(
        ToolDescriptor::read_only("weather", 1),
        Kind::Read,
        service,
    ))
}

fn assert_no_records(exec: &Executor) {
    assert!(exec.ledger().list(&op("op_read")).unwrap().is_empty());
    assert!(
        exec.ledger().operations(10).unwrap().is_empty(),
        "a read-only round writes nothing, not even its operation"
    );
}

#[tokio::test]
async fn transient_unavailability_is_retried_inside_the_call_without_any_record() {
    let service = Downstream::start(Behaviour {
        read_unavailable: 2,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(weather(&service)).unwrap();

    let call = ToolCall::custom("call_1", "weather", r#"{"city":"Oslo"}"#);
    let out = exec.execute(&op("op_read"), 0, call).await.unwrap();
    let CallOutcome::Completed {
        result_json,
        replayed: false,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(result_json, r#"{"city":"Oslo","temp_c":21}"#);
    assert_eq!(service.requests().len(), 3);
    assert_eq!(exec.metrics().attempts, 3);
    assert_no_records(&exec);
}

#[tokio::test]
async fn a_permanent_outage_fails_after_exactly_read_only_max_attempts_requests() {
    let service = Downstream::start(Behaviour {
        read_always_unavailable: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(
        &dir.path().join("l.db"),
        ExecutorConfig {
            read_only_max_attempts: 4,
            ..fast_config()
        },
    );
    exec.register(weather(&service)).unwrap();

    let call = ToolCall::custom("call_1", "weather", r#"{"city":"Oslo"}"#);
    let out = exec.execute(&op("op_read"), 0, call).await.unwrap();
    assert!(matches!(out, CallOutcome::Failed { .. }), "{out:?}");
    assert_eq!(service.requests().len(), 4);
    assert_no_records(&exec);
}

#[tokio::test]
async fn a_refused_read_is_not_retried() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let exec = executor_with(&dir.path().join("l.db"), fast_config());
    exec.register(weather(&service)).unwrap();

    let call = ToolCall::custom("call_1", "weather", r#"{"city":""}"#);
    let out = exec.execute(&op("op_read"), 0, call).await.unwrap();
    let CallOutcome::Failed {
        retryable: false, ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(service.requests().len(), 1);
    assert_no_records(&exec);
}

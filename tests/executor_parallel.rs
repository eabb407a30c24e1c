//! One model response with several side-effecting calls (row 11 of the
//! executor matrix): each call is its own execution with its own downstream
//! key, every call commits exactly one effect, and no more than
//! `max_parallel` requests are ever in flight at the service.

use toolledger_test_support::downstream;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind};
use toolledger::executor::{CallOutcome, Executor, ExecutorConfig, ToolDescriptor};
use toolledger::ledger::{Ledger, LedgerConfig};
use toolledger::model::{ExecutionStatus, OperationId, ToolCall};

#[tokio::test]
async fn six_parallel_calls_are_six_executions_with_six_keys_and_at_most_two_in_flight() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        // Requests wait for a partner, then take a little while, so that
        // any parallelism the executor allows is visible at the service.
        rendezvous: 2,
        latency: Duration::from_millis(20),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("l.db"), LedgerConfig::default()).unwrap();
    let exec = Executor::new(
        Arc::new(ledger),
        ExecutorConfig {
            max_parallel: 2,
            ..fast_config()
        },
    );
    let desc = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("send_invite", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, &service)))
        .unwrap();

    let op = OperationId::new("op_parallel").unwrap();
    let calls: Vec<ToolCall> = (0..6u32)
        .map(|i| ToolCall {
            position: i,
            ..ToolCall::custom(
                format!("call_{i}"),
                "send_invite",
                format!(r#"{{"guest":{i}}}"#),
            )
        })
        .collect();
    let outcomes = exec.execute_round(&op, 0, calls).await.unwrap();

    assert_eq!(outcomes.len(), 6);
    let ids: HashSet<_> = outcomes.iter().map(|o| o.execution_id().clone()).collect();
    assert_eq!(ids.len(), 6, "separate executions");
    for (i, out) in outcomes.iter().enumerate() {
        let CallOutcome::Completed {
            result_json,
            replayed: false,
            ..
        } = out
        else {
            panic!("{out:?}")
        };
        // Outcomes come back in call order.
        assert!(
            result_json.contains(&format!(r#""guest":{i}"#)),
            "{result_json}"
        );
        let rec = exec.ledger().get(out.execution_id()).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Committed);
        assert_eq!(rec.attempt_count, 1);
    }
    let effects = service.effects();
    assert_eq!(effects.len(), 6);
    let keys: HashSet<_> = effects.iter().map(|e| e.key.clone().unwrap()).collect();
    assert_eq!(keys.len(), 6, "separate keys");
    assert_eq!(service.posts().len(), 6);
    assert_eq!(service.max_concurrent(), 2);
}

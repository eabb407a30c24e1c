//! A first end-to-end run of the executor against in-process fake tools.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use toolledger::executor::*;
use toolledger::ledger::{Ledger, LedgerConfig, ManualClock};
use toolledger::model::{OperationId, ToolCall};

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

//! Approval-required tools through the executor (row 12 of the executor
//! matrix): the call waits with the tool's preview, an approval naming other
//! arguments is refused and unlocks nothing, and the right approval runs the
//! call once.

use toolledger_test_support::downstream;

use std::sync::Arc;

use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind};
use serde_json::{json, Value};
use toolledger::executor::{CallOutcome, Error, Executor, ToolDescriptor};
use toolledger::ledger::{self, Ledger, LedgerConfig};
use toolledger::model::{ArgsDigest, ExecutionStatus, OperationId, ToolCall};

fn preview(args: &str) -> String {
    let args: Value = serde_json::from_str(args).unwrap();
    json!({ "summary": format!("pay {} to {}", args["amount"].as_str().unwrap(), args["to"].as_str().unwrap()) })
        .to_string()
}

#[tokio::test]
async fn a_call_needing_approval_runs_once_and_only_for_the_approved_digest() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("l.db"), LedgerConfig::default()).unwrap();
    let exec = Executor::new(Arc::new(ledger), fast_config());
    let desc = ToolDescriptor {
        idempotency_key: true,
        requires_approval: true,
        ..ToolDescriptor::side_effect("pay", 1)
    };
    let tool = HttpTool::new(desc, Kind::Effect, &service).with_preview(preview);
    exec.register(Arc::new(tool)).unwrap();

    let op = OperationId::new("op_approval").unwrap();
    let call = ToolCall::custom("call_1", "pay", r#"{"amount":"12.50 EUR","to":"Bob"}"#);
    let out = exec.execute(&op, 0, call.clone()).await.unwrap();
    let CallOutcome::NeedsApproval {
        execution_id,
        args_digest,
        preview_json,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    assert_eq!(
        preview_json.as_deref(),
        Some(r#"{"summary":"pay 12.50 EUR to Bob"}"#)
    );
    assert!(
        service.requests().is_empty(),
        "nothing is sent before approval"
    );
    assert_eq!(
        exec.ledger().get(execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );

    let wrong = ArgsDigest::parse("0".repeat(64)).unwrap();
    let refused = exec
        .approve(execution_id, &wrong, preview_json.as_deref())
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::Ledger(ledger::Error::DigestMismatch { .. }))
        ),
        "{refused:?}"
    );
    assert_eq!(
        exec.ledger().get(execution_id).unwrap().unwrap().status,
        ExecutionStatus::Prepared
    );
    // Asking again still waits for approval; nothing was unlocked.
    let still = exec.execute(&op, 0, call.clone()).await.unwrap();
    assert!(
        matches!(still, CallOutcome::NeedsApproval { .. }),
        "{still:?}"
    );
    assert!(service.requests().is_empty());

    let ran = exec
        .approve(execution_id, args_digest, preview_json.as_deref())
        .await
        .unwrap();
    let CallOutcome::Completed {
        external_id,
        replayed: false,
        ..
    } = &ran
    else {
        panic!("{ran:?}")
    };
    assert_eq!(external_id.as_deref(), Some("eff_1"));
    assert_eq!(
        exec.ledger().get(execution_id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    let replay = exec.execute(&op, 0, call).await.unwrap();
    assert!(
        matches!(replay, CallOutcome::Completed { replayed: true, .. }),
        "{replay:?}"
    );
    assert_eq!(service.effects().len(), 1);
    assert_eq!(service.posts().len(), 1);
}

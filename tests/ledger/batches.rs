//! Independent batches: items run once each; a partly delivered batch says exactly what happened.

use std::path::Path;
use std::sync::{Arc, Weak};

use downstream::{process, Behaviour, CrashPoint, Downstream, HttpTool, Kind};
use serde_json::Value;
use support::*;
use toolledger::executor::{BatchMode, CallOutcome, ToolDescriptor};
use toolledger::ledger::Ledger;
use toolledger::model::{ExecutionId, ExecutionStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

const ITEMS: &str = r#"{"items":[{"n":0},{"n":1},{"n":2},{"n":3},{"n":4}]}"#;

fn batch(lookup: bool, key: bool) -> ToolDescriptor {
    ToolDescriptor {
        lookup,
        idempotency_key: key,
        batch: BatchMode::Independent,
        // The loopback service applies a request before it answers; the dead
        // process's requests have been answered when the next one starts.
        landing_window: std::time::Duration::ZERO,
        ..ToolDescriptor::side_effect("invite_all", 1)
    }
}

fn call() -> ToolCall {
    ToolCall::custom("call_1", "invite_all", ITEMS)
}

/// Process 1: runs the batch until the tool "crashes" at item 3, then dies.
/// Returns the execution id.
fn run_until_crash_at_item_3(
    path: &Path,
    service: &Downstream,
    desc: ToolDescriptor,
    point: CrashPoint,
) -> ExecutionId {
    let (dead, id): (Weak<Ledger>, ExecutionId) = process(async {
        let exec = executor_at(path);
        let tool = HttpTool::new(desc, Kind::Effect, service);
        let mut crash = tool.crash_at(Some(3), point);
        exec.register(Arc::new(tool)).unwrap();
        let run = exec.clone();
        tokio::spawn(async move { run.execute(&op("op_batch"), 0, call()).await });
        crash.reached().await;
        let records = exec.ledger().list(&op("op_batch")).unwrap();
        assert_eq!(records.len(), 1);
        let id = records[0].execution_id.clone();
        assert_eq!(exec.ledger().batch_items(&id).unwrap().len(), 3);
        (Arc::downgrade(exec.ledger()), id)
    });
    assert!(
        dead.upgrade().is_none(),
        "the first process's ledger is gone"
    );
    id
}

/// The keys the service saw on POSTs, per item index 0..5.
fn posts_per_item(service: &Downstream, id: &ExecutionId) -> Vec<usize> {
    let posts = service.posts();
    (0..5)
        .map(|i| {
            let key = Ledger::batch_item_key(id, i);
            posts
                .iter()
                .filter(|p| p.key.as_deref() == Some(key.as_str()))
                .count()
        })
        .collect()
}

fn assert_items_in_order(result_json: &str, id: &ExecutionId) {
    let result: Value = serde_json::from_str(result_json).unwrap();
    let items = result["items"].as_array().unwrap();
    assert_eq!(items.len(), 5);
    for (i, item) in (0u32..).zip(items) {
        assert_eq!(item["body"]["n"], i);
        assert_eq!(
            item["key"].as_str(),
            Some(Ledger::batch_item_key(id, i).as_str())
        );
    }
}

#[test]
fn a_crash_after_item_3_committed_resumes_with_a_lookup_and_never_resends_items_0_to_2() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let id = run_until_crash_at_item_3(
        &path,
        &service,
        batch(true, false),
        CrashPoint::AfterResponse,
    );
    assert_eq!(service.effects().len(), 4, "item 3 committed downstream");

    process(async {
        let exec = executor_at(&path);
        exec.register(Arc::new(HttpTool::new(
            batch(true, false),
            Kind::Effect,
            &service,
        )))
        .unwrap();
        let recovered = exec.recover().await.unwrap().outcomes;
        assert_eq!(recovered.len(), 1);
        let out = &recovered[0];
        let CallOutcome::Completed {
            result_json,
            replayed: false,
            ..
        } = out
        else {
            panic!("{out:?}")
        };
        assert_items_in_order(result_json, &id);
        let rec = exec.ledger().get(&id).unwrap().unwrap();
        assert_eq!(rec.status, ExecutionStatus::Committed);
        assert_eq!(exec.ledger().batch_items(&id).unwrap().len(), 5);
    });
    assert_eq!(service.effects().len(), 5);
    assert_eq!(posts_per_item(&service, &id), [1, 1, 1, 1, 1]);
    let lookups = service.lookups();
    assert_eq!(lookups.len(), 1);
    assert_eq!(
        lookups[0].query,
        [(
            "key".to_owned(),
            Ledger::batch_item_key(&id, 3).as_str().to_owned()
        )]
    );
}

#[test]
fn a_crash_after_item_3_committed_resumes_by_resending_only_item_3s_key() {
    let service = Downstream::start(Behaviour {
        idempotency: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let id = run_until_crash_at_item_3(
        &path,
        &service,
        batch(false, true),
        CrashPoint::AfterResponse,
    );
    assert_eq!(service.effects().len(), 4);

    // This time the app simply asks for the same call again after restart.
    process(async {
        let exec = executor_at(&path);
        exec.register(Arc::new(HttpTool::new(
            batch(false, true),
            Kind::Effect,
            &service,
        )))
        .unwrap();
        let out = exec.execute(&op("op_batch"), 0, call()).await.unwrap();
        let CallOutcome::Completed {
            result_json,
            replayed: false,
            ..
        } = &out
        else {
            panic!("{out:?}")
        };
        assert_items_in_order(result_json, &id);
        assert_eq!(
            exec.ledger().get(&id).unwrap().unwrap().status,
            ExecutionStatus::Committed
        );
    });
    assert_eq!(service.effects().len(), 5);
    assert_eq!(posts_per_item(&service, &id), [1, 1, 1, 2, 1]);
}

#[test]
fn a_crash_before_item_3_left_resumes_by_sending_it_once() {
    let service = Downstream::start(Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let id = run_until_crash_at_item_3(&path, &service, batch(true, false), CrashPoint::BeforeSend);
    assert_eq!(service.effects().len(), 3);

    process(async {
        let exec = executor_at(&path);
        exec.register(Arc::new(HttpTool::new(
            batch(true, false),
            Kind::Effect,
            &service,
        )))
        .unwrap();
        let recovered = exec.recover().await.unwrap().outcomes;
        assert_eq!(recovered.len(), 1);
        let CallOutcome::Completed { result_json, .. } = &recovered[0] else {
            panic!("{:?}", recovered[0])
        };
        assert_items_in_order(result_json, &id);
    });
    assert_eq!(service.effects().len(), 5);
    assert_eq!(posts_per_item(&service, &id), [1, 1, 1, 1, 1]);
    assert_eq!(service.lookups().len(), 1);
}

//! `Executor::recover()` on a batch that delivered some items and waits to
//! retry the rest: never reported as failed.

use super::*;

// ---------------------------------------------------------------------------
// A batch some of whose items committed, killed while it waits to retry the
// next item: what recover() tells the app.
// ---------------------------------------------------------------------------
#[test]
fn recover_never_tells_a_batch_whose_items_committed_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let desc = ToolDescriptor {
        batch: toolledger::executor::BatchMode::Independent,
        ..keyed("invite")
    };
    let args = r#"{"items":[{"a":0},{"a":1}]}"#;
    let downstream = process(async {
        let exec = exec_on(&path, config(5_000, 4));
        let tool = Scripted::new(desc.clone(), &[Act::Commit, Act::FailRetryable]);
        exec.register(tool.clone()).unwrap();
        let e = exec.clone();
        let t =
            tokio::spawn(async move { e.execute(&opid(), 0, tcall("b1", "invite", args)).await });
        wait_for_status(&exec, ExecutionStatus::FailedBeforeCommit).await;
        drop(t);
        let d = tool.effects.lock().unwrap().clone();
        d
    });
    let (rec, status) = process(async {
        let exec = exec_on(&path, config(1, 4));
        let tool = Scripted::new(desc.clone(), &[]);
        *tool.effects.lock().unwrap() = downstream.clone();
        exec.register(tool.clone()).unwrap();
        let rec = exec.recover().await.unwrap();
        let status = exec.ledger().list(&opid()).unwrap()[0].status;
        let after = tool.effects.lock().unwrap().clone();
        (rec, (status, after))
    });
    let (status, after) = status;
    eprintln!("recover: {:?}; status {status}", rec.outcomes);
    assert_eq!(downstream.values().sum::<u32>(), 1, "item 0 was delivered");
    // recover() took the batch up again: item 1 went out once, item 0 was
    // not sent again, the batch is committed and the app is told so.
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(
        after.values().all(|n| *n == 1),
        "one effect per item: {after:?}"
    );
    assert_eq!(status, ExecutionStatus::Committed);
    assert_eq!(rec.outcomes.len(), 1, "{:?}", rec.outcomes);
    assert!(
        matches!(&rec.outcomes[0], CallOutcome::Completed { .. }),
        "{:?}",
        rec.outcomes
    );
    for o in &rec.outcomes {
        assert!(
            !matches!(o, CallOutcome::Failed { .. }),
            "item 0 of the batch happened, but recover() reports it {o:?}"
        );
    }
}

//! A retry waiting out its backoff while the same call is asked for again
//! (the model repeats it, another session, `run_existing` after `recover()`)
//! and that ask runs and commits the next attempt: the sleeper wakes to the
//! current truth (a replay, or `InFlight`), never an error.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_backoff_overtaken_by_a_repeat_of_the_call_reports_the_commit_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(600, 4));
    let tool = Scripted::new(keyed("pay"), &[Act::FailRetryable, Act::Commit]);
    exec.register(tool.clone()).unwrap();
    let c = tcall("c1", "pay", r#"{"amount":1}"#);
    let a = {
        let exec = exec.clone();
        let c = c.clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, c).await })
    };
    // Attempt 1 failed (retryable); A sleeps in its backoff.
    let id = wait_for_status(&exec, ExecutionStatus::FailedBeforeCommit).await;
    // The model (or the app's own retry) asks for the same call again.
    let b = exec.execute(&opid(), 0, c.clone()).await.unwrap();
    assert!(
        matches!(
            b,
            CallOutcome::Completed {
                replayed: false,
                ..
            }
        ),
        "{b:?}"
    );
    let a = a.await.unwrap();
    assert_eq!(tool.effects(), 1);
    assert_eq!(
        exec.ledger().get(&id).unwrap().unwrap().status,
        ExecutionStatus::Committed
    );
    // Expected: the current truth (the stored result), as for a stale step.
    match a {
        Ok(CallOutcome::Completed { .. }) => {}
        other => panic!("the call committed, but the retrying caller got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_backoff_overtaken_by_another_session_reports_the_commit_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let exec_a = exec_on(&path, config(600, 4));
    let exec_b = exec_on(&path, config(600, 4));
    let tool_a = Scripted::new(keyed("pay"), &[Act::FailRetryable]);
    let tool_b = Scripted::new(keyed("pay"), &[Act::Commit]);
    exec_a.register(tool_a.clone()).unwrap();
    exec_b.register(tool_b.clone()).unwrap();
    let c = tcall("c1", "pay", r#"{"amount":1}"#);
    let a = {
        let exec = exec_a.clone();
        let c = c.clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, c).await })
    };
    wait_for_status(&exec_b, ExecutionStatus::FailedBeforeCommit).await;
    let b = exec_b.execute(&opid(), 0, c.clone()).await.unwrap();
    assert!(matches!(b, CallOutcome::Completed { .. }), "{b:?}");
    let a = a.await.unwrap();
    assert_eq!(tool_a.effects() + tool_b.effects(), 1);
    match a {
        Ok(CallOutcome::Completed { .. }) => {}
        other => panic!("the call committed in another session, but A got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_backoff_that_wakes_while_the_repeat_still_runs_is_in_flight_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(300, 4));
    let tool = Scripted::new(keyed("pay"), &[Act::FailRetryable, Act::Hold]);
    let mut reached = tool.gate();
    exec.register(tool.clone()).unwrap();
    let c = tcall("c1", "pay", r#"{"amount":1}"#);
    let a = {
        let exec = exec.clone();
        let c = c.clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, c).await })
    };
    wait_for_status(&exec, ExecutionStatus::FailedBeforeCommit).await;
    // The repeat starts attempt 2, which is still running when A wakes.
    let b = {
        let exec = exec.clone();
        let c = c.clone();
        tokio::spawn(async move { exec.execute(&opid(), 0, c).await })
    };
    tokio::time::timeout(Duration::from_secs(5), reached.recv())
        .await
        .unwrap();
    let a = a.await.unwrap();
    tool.release.notify_one();
    let b = b.await.unwrap().unwrap();
    assert!(matches!(b, CallOutcome::Completed { .. }), "{b:?}");
    assert_eq!(tool.effects(), 1);
    match a {
        Ok(CallOutcome::InFlight { .. } | CallOutcome::Completed { .. }) => {}
        other => panic!("attempt 2 is running in this process, but A got {other:?}"),
    }
}

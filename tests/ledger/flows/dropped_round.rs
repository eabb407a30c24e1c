//! A round dropped while some of its calls wait for a parallelism slot: the
//! calls begun and never sent are this executor's orphans, reconciled when
//! asked for again, not `InFlight` until the process ends.

use super::*;

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_round_does_not_leave_its_unsent_calls_in_flight_for_the_life_of_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_on(&dir.path().join("l.db"), config(1, 1));
    let tool = Scripted::new(keyed("pay"), &[Act::Hold]);
    let mut reached = tool.gate();
    exec.register(tool.clone()).unwrap();
    let round = vec![
        tcall("c1", "pay", r#"{"n":1}"#),
        tcall("c2", "pay", r#"{"n":2}"#),
    ];
    {
        let exec = exec.clone();
        let round = round.clone();
        let run = tokio::spawn(async move { exec.execute_round(&opid(), 0, round).await });
        tokio::time::timeout(Duration::from_secs(5), reached.recv())
            .await
            .unwrap();
        // The app gives up on the round (its own timeout, a cancelled task).
        run.abort();
        let _ = run.await;
    }
    assert_eq!(tool.performs(), 1, "c2 was never sent");
    for r in exec.ledger().list(&opid()).unwrap() {
        eprintln!(
            "after abort: {} {} {:?}",
            r.provider_call_id,
            r.status,
            exec.ledger()
                .transitions(&r.execution_id)
                .unwrap()
                .iter()
                .map(|t| (t.transition.clone(), t.to, t.reason.clone()))
                .collect::<Vec<_>>()
        );
    }
    // c2 is asked for again, and again later: nothing can be running it.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            exec.execute(&opid(), 0, tcall("c2", "pay", r#"{"n":2}"#))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered = exec.recover().await.unwrap();
    eprintln!(
        "c2 asked again: {answers:?}; recover: {:?}; performs {}",
        recovered.outcomes,
        tool.performs()
    );
    assert!(
        answers.iter().any(|o| matches!(
            o,
            CallOutcome::Completed { .. } | CallOutcome::Unknown { .. }
        )),
        "c2 (never sent) answers InFlight for the life of the process: {answers:?}"
    );
}

//! A retried attempt of a finite key (after a provable failure) commits
//! durably: the key's life runs from its *first* request, which went out
//! with attempt 1, not with the retry's `begin` (docs/design.md: the policy
//! "counts a key's life from the `begin` of the execution's first attempt
//! ... and takes it as unknown otherwise"). Counting it from the retry
//! would defer a commit whose key may be about to expire: lost to a power
//! cut, it is reconciled by a resend the downstream no longer dedupes.

use std::time::Duration;

use toolledger::ledger::{Begin, CallSpec, Downstream, Ledger};
use toolledger::model::{OperationId, ToolCall};
use toolledger_test_support::power_vfs::{Loss, Machine};

#[test]
fn a_retried_attempts_commit_of_a_finite_key_is_durable() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    // A 25-hour key, an app that reconciles within the hour: the first
    // attempt's own commit may be deferred (its key's age is known).
    let cfg = || {
        let mut cfg = super::config(&machine, true);
        cfg.deferred_commits.deadline = Duration::from_secs(60);
        cfg.deferred_commits.reconcile_within = Some(Duration::from_secs(3600));
        cfg
    };
    let ledger = Ledger::open(&path, cfg()).unwrap();
    let op = OperationId::new("op").unwrap();
    let spec = CallSpec::new(ToolCall::custom("c1", "pay", r#"{"cents":500}"#), 1)
        .with_downstream(Downstream::keyed(Duration::from_secs(25 * 3600)));
    let Begin::Execute(first) = ledger.begin(&op, 0, &spec).unwrap() else {
        panic!("not executed");
    };
    // The downstream refused attempt 1 (a 503): retryable, same key.
    ledger
        .fail_before_commit(&first.attempt_id(), "503", true)
        .unwrap();
    let Begin::Execute(retry) = ledger.begin(&op, 0, &spec).unwrap() else {
        panic!("the retry was not handed out");
    };
    assert_eq!(retry.attempt, 2);
    assert_eq!(retry.downstream_key, first.downstream_key, "same key");
    ledger
        .commit(&retry.attempt_id(), r#"{"paid":true}"#, None)
        .unwrap();
    assert!(
        !ledger.has_unsynced_commits(),
        "a retry's commit of a finite key was deferred (its key's age counted from the retry)"
    );
    // The power goes now: the commit is there after the restart.
    machine.cut_now();
    ledger.abandon();
    drop(ledger);
    machine.restart(Loss::All, &mut |_| 0);
    let again = Ledger::open(&path, cfg()).unwrap();
    let rec = again.get(&retry.execution_id).unwrap().unwrap();
    assert!(rec.status.is_committed(), "lost to the cut: {}", rec.status);
}

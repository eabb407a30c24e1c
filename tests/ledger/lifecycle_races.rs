//! Lifecycle events (a cancellation, another session's steps) landing
//! between two steps of a flow that is not a first attempt: a same-key
//! resend after an unknown outcome, approvals, compensations, jobs.
//!
//! The moment is made exact with a clock: the executor reads the boot clock
//! between deciding to resend and asking the ledger for the resend, so a
//! clock whose reading runs a hook (another session's step, through its own
//! ledger on the same file) puts that step there, every run. Effects are
//! counted at the downstream.

use std::sync::{Arc, Mutex};

use downstream::{fast_config, Behaviour, Downstream, HttpTool, Kind};
use support::*;
use toolledger::executor::{BatchMode, CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{Clock, Ledger, LedgerConfig, ManualClock};
use toolledger::model::{ExecutionStatus, Monotonic, OperationId, OperationStatus, ToolCall};
use toolledger_test_support as support;
use toolledger_test_support::downstream;

type Hook = Box<dyn FnMut() -> bool + Send>;

/// A manual clock whose boot-clock reading first runs an armed hook, until
/// the hook says it is done.
struct RaceClock {
    inner: Arc<ManualClock>,
    hook: Mutex<Option<Hook>>,
}

impl std::fmt::Debug for RaceClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RaceClock")
    }
}

impl RaceClock {
    fn new(inner: Arc<ManualClock>) -> Arc<RaceClock> {
        Arc::new(RaceClock {
            inner,
            hook: Mutex::new(None),
        })
    }

    fn arm(&self, hook: impl FnMut() -> bool + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }
}

impl Clock for RaceClock {
    fn now_ms(&self) -> i64 {
        self.inner.now_ms()
    }

    fn monotonic(&self) -> Monotonic {
        let mut slot = self.hook.lock().unwrap();
        if let Some(hook) = slot.as_mut() {
            if hook() {
                *slot = None;
            }
        }
        drop(slot);
        self.inner.monotonic()
    }
}

/// An executor whose ledger reads `clock`, and another session (its own
/// ledger) on the same file.
fn two_sessions(path: &std::path::Path, clock: &Arc<RaceClock>) -> (Executor, Arc<Ledger>) {
    let ledger =
        Ledger::open_with_clock(path, LedgerConfig::default(), clock.clone()).expect("open");
    let exec = Executor::new(Arc::new(ledger), fast_config());
    let other = Arc::new(open_with(path, &clock.inner));
    (exec, other)
}

/// Arms `clock` to cancel `op` through `other` at the first reading after an
/// execution of `op` became unknown (the executor is between its decision
/// to resend and the resend); the cancellation's answer lands in the slot.
fn cancel_when_unknown(
    clock: &RaceClock,
    other: &Arc<Ledger>,
    op: OperationId,
) -> Arc<Mutex<Option<OperationStatus>>> {
    let answer = Arc::new(Mutex::new(None));
    let (other, slot) = (other.clone(), answer.clone());
    clock.arm(move || {
        let unknown = other
            .list(&op)
            .unwrap()
            .iter()
            .any(|r| r.status == ExecutionStatus::OutcomeUnknown);
        if unknown {
            *slot.lock().unwrap() = Some(other.cancel_operation(&op).unwrap());
        }
        unknown
    });
    answer
}

// ---------------------------------------------------------------------------
// A same-key resend that meets a cancellation
// ---------------------------------------------------------------------------

/// A key tool's request is applied downstream and its answer lost (a 500
/// after the commit): unknown. The executor decides to resend under the key
/// (the downstream dedupes); at that moment another session cancels the
/// operation. Nothing may be sent after the stop, and nothing proved the
/// first request absent: the call must stay unknown, the operation
/// `cancelled_after_side_effect`. It was recorded `cancelled_before_commit`
/// ("not found downstream after cancellation") and the operation plain
/// `cancelled`, with the effect made downstream.
#[tokio::test]
async fn a_same_key_resend_that_meets_a_cancellation_leaves_the_call_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        fail_after_commit: 1,
        ..Behaviour::default()
    });
    let clock = RaceClock::new(Arc::new(ManualClock::new(1_000_000)));
    let (exec, other) = two_sessions(&path, &clock);
    let desc = ToolDescriptor {
        idempotency_key: true,
        ..ToolDescriptor::side_effect("send_email", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, &service)))
        .unwrap();
    let cancelled = cancel_when_unknown(&clock, &other, op("o"));

    let out = exec
        .execute(
            &op("o"),
            0,
            ToolCall::custom("c1", "send_email", r#"{"to":"a@example.com"}"#),
        )
        .await
        .unwrap();

    assert_eq!(
        *cancelled.lock().unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect),
        "the other session cancelled while the call was unknown"
    );
    assert_eq!(service.effects().len(), 1, "the first request was applied");
    assert_eq!(service.posts().len(), 1, "nothing was sent after the stop");
    let rec = &other.list(&op("o")).unwrap()[0];
    let op_status = other.operation_status(&op("o")).unwrap();
    assert!(
        matches!(out, CallOutcome::Unknown { attempt: 1, .. }),
        "{out:?}; stored {:?}, operation {op_status:?}",
        rec.status
    );
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(rec.attempt_count, 1);
    assert_eq!(
        other.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

/// The same race for an independent batch whose first item's outcome is
/// unknown: the item is only resendable (a key, no lookup), the operation
/// is cancelled as the executor moves to resend it. The batch must stay
/// unknown; it was settled as if the item were absent (a cancelled batch,
/// the operation plain `cancelled`) with the item's effect made downstream.
#[tokio::test]
async fn a_batch_items_resend_that_meets_a_cancellation_leaves_the_batch_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let service = Downstream::start(Behaviour {
        idempotency: true,
        fail_after_commit: 1,
        ..Behaviour::default()
    });
    let clock = RaceClock::new(Arc::new(ManualClock::new(1_000_000)));
    let (exec, other) = two_sessions(&path, &clock);
    let desc = ToolDescriptor {
        idempotency_key: true,
        batch: BatchMode::Independent,
        ..ToolDescriptor::side_effect("invite", 1)
    };
    exec.register(Arc::new(HttpTool::new(desc, Kind::Effect, &service)))
        .unwrap();
    let call = ToolCall::custom("c1", "invite", r#"{"items":[{"to":"a"},{"to":"b"}]}"#);
    // Item 0's answer is lost: the batch is unknown; the executor
    // reconciles item 0 (a resend under its key), and the operation is
    // cancelled as it does.
    let cancelled = cancel_when_unknown(&clock, &other, op("o"));
    let out = exec.execute(&op("o"), 0, call).await.unwrap();

    assert_eq!(
        *cancelled.lock().unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
    assert_eq!(service.effects().len(), 1, "item 0 was applied");
    assert_eq!(service.posts().len(), 1, "nothing was sent after the stop");
    let rec = &other.list(&op("o")).unwrap()[0];
    let op_status = other.operation_status(&op("o")).unwrap();
    assert!(
        matches!(out, CallOutcome::Unknown { .. }),
        "{out:?}; stored {:?}, operation {op_status:?}",
        rec.status
    );
    assert_eq!(rec.status, ExecutionStatus::OutcomeUnknown);
    assert_eq!(
        other.operation_status(&op("o")).unwrap(),
        Some(OperationStatus::CancelledAfterSideEffect)
    );
}

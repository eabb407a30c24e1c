//! A key tool whose key lifetime is finite defers its commit only when the
//! key lives at least `DeferredCommits::deadline` plus
//! `DeferredCommits::reconcile_within` (docs/design.md, "The key's
//! lifetime"). A key's lifetime runs from its *first request*
//! (`ToolDescriptor::key_lifetime`: "how long the downstream honours an
//! idempotency key after its first request"), but the policy compares it
//! with the time from the *commit*: when the first request went out long
//! before the commit (an attempt whose outcome was unknown, resent under the
//! same key hours later), a deferred commit lost to a power cut is
//! reconciled by a resend under a key the downstream has forgotten: a
//! second effect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use toolledger::executor::{
    CallOutcome, Executor, ExecutorConfig, PerformOutcome, ToolDescriptor, ToolError, ToolHandler,
    ToolRequest,
};
use toolledger::ledger::{Begin, CallSpec, Clock, Downstream, Ledger, LedgerConfig, ManualClock};
use toolledger::model::{OperationId, ToolCall};
use toolledger_test_support::power_vfs::{Loss, Machine};

const HOUR_MS: i64 = 3_600_000;
const KEY_LIFE: Duration = Duration::from_secs(25 * 3600);

/// A payment service that dedupes by key for 25 hours after a key's first
/// request (on the test's wall clock).
struct Service {
    clock: Arc<ManualClock>,
    first_seen: Mutex<HashMap<String, i64>>,
    effects: AtomicU32,
}

impl Service {
    fn request(&self, key: &str) -> String {
        let now = self.clock.now_ms();
        let mut seen = self.first_seen.lock().unwrap();
        let life = i64::try_from(KEY_LIFE.as_millis()).unwrap();
        match seen.get(key) {
            Some(&first) if now - first < life => {}
            _ => {
                seen.insert(key.to_owned(), now);
                self.effects.fetch_add(1, Ordering::SeqCst);
            }
        }
        r#"{"paid":true}"#.to_owned()
    }
}

struct Pay(Arc<Service>);

#[async_trait::async_trait]
impl ToolHandler for Pay {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            idempotency_key: true,
            key_lifetime: Some(KEY_LIFE),
            ..ToolDescriptor::side_effect("pay", 1)
        }
    }
    async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
        let result_json = self.0.request(req.downstream_key.as_str());
        Ok(PerformOutcome::Committed {
            result_json,
            external_id: None,
        })
    }
}

/// The app promises to reconcile within an hour of any restart; the
/// deadline is a minute: a 25-hour key qualifies for a deferred commit.
fn cfg(machine: &Machine) -> LedgerConfig {
    let mut cfg = super::config(machine, true);
    cfg.deferred_commits.deadline = Duration::from_secs(60);
    cfg.deferred_commits.reconcile_within = Some(Duration::from_secs(3600));
    cfg
}

#[test]
fn a_deferred_commit_of_a_key_near_its_expiry_is_resent_after_the_key_expired() {
    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let service = Arc::new(Service {
        clock: clock.clone(),
        first_seen: Mutex::new(HashMap::new()),
        effects: AtomicU32::new(0),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let open = || {
        let ledger =
            Arc::new(Ledger::open_with_clock(&path, cfg(&machine), clock.clone()).unwrap());
        let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
        executor.register(Arc::new(Pay(service.clone()))).unwrap();
        (ledger, executor)
    };
    let op = OperationId::new("op").unwrap();
    let call = ToolCall::custom("c1", "pay", r#"{"cents":500}"#);

    // t = 0: attempt 1's request under the key is applied downstream, and
    // the app is killed before the answer (its intent was durable).
    {
        let ledger = Ledger::open_with_clock(&path, cfg(&machine), clock.clone()).unwrap();
        let spec = CallSpec::new(call.clone(), 1).with_downstream(Downstream::keyed(KEY_LIFE));
        let Begin::Execute(t) = ledger.begin(&op, 0, &spec).unwrap() else {
            panic!("not executed");
        };
        service.request(t.downstream_key.as_str());
        ledger.abandon();
    }
    assert_eq!(service.effects.load(Ordering::SeqCst), 1);

    // t = 24.5 h: the app runs again and reconciles at once (well within
    // its promised hour): the executor resends under the same key (the
    // service answers with the first effect) and commits. The key has 30
    // minutes left, less than deadline + reconcile_within (61 min), so by
    // the ledger's own rule this commit must be durable.
    clock.advance(24 * HOUR_MS + HOUR_MS / 2);
    let (ledger, executor) = open();
    ledger.recover().unwrap();
    let second = rt.block_on(executor.execute(&op, 0, call.clone())).unwrap();
    assert!(
        matches!(second, CallOutcome::Completed { .. }),
        "second: {second:?}"
    );
    assert_eq!(service.effects.load(Ordering::SeqCst), 1);
    let deferred = ledger.has_unsynced_commits();

    // The power goes before the deadline; the machine is up again and the
    // app reconciles 40 minutes later, well within its promised hour.
    machine.cut_now();
    ledger.abandon();
    drop((ledger, executor));
    machine.restart(Loss::All, &mut |_| 0);
    clock.advance(40 * 60_000);
    let (ledger, executor) = open();
    ledger.recover().unwrap();
    let third = rt.block_on(executor.execute(&op, 0, call)).unwrap();
    assert_eq!(
        service.effects.load(Ordering::SeqCst),
        1,
        "two payments: the commit made 30 minutes before the key expired was deferred \
         (has_unsynced_commits() = {deferred}), lost to the cut, and reconciled by a resend \
         under the key after it expired ({third:?})"
    );
}

/// The same 25-hour key, and this time the commit is of the first attempt
/// itself: its request went out, the device slept for 24.5 hours with the
/// app frozen inside the tool (the boot clock counts the sleep; a process's
/// `Instant` on Linux, Android and Apple does not), and the answer came on
/// waking. The key then has 30 minutes left, less than deadline +
/// reconcile_within, so the commit must be durable: a power cut before the
/// deadline must not lead to a resend under the expired key.
#[test]
fn a_first_attempts_key_age_counts_the_time_the_device_slept() {
    /// Sends the request, then the device sleeps before the answer.
    struct SleepyPay(Arc<Service>);
    #[async_trait::async_trait]
    impl ToolHandler for SleepyPay {
        fn descriptor(&self) -> ToolDescriptor {
            Pay(self.0.clone()).descriptor()
        }
        async fn perform(&self, req: ToolRequest) -> Result<PerformOutcome, ToolError> {
            let result_json = self.0.request(req.downstream_key.as_str());
            self.0.clock.advance(24 * HOUR_MS + HOUR_MS / 2);
            Ok(PerformOutcome::Committed {
                result_json,
                external_id: None,
            })
        }
    }

    let machine = Machine::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let service = Arc::new(Service {
        clock: clock.clone(),
        first_seen: Mutex::new(HashMap::new()),
        effects: AtomicU32::new(0),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let op = OperationId::new("op").unwrap();
    let call = ToolCall::custom("c1", "pay", r#"{"cents":700}"#);

    let ledger = Arc::new(Ledger::open_with_clock(&path, cfg(&machine), clock.clone()).unwrap());
    let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
    executor
        .register(Arc::new(SleepyPay(service.clone())))
        .unwrap();
    let first = rt.block_on(executor.execute(&op, 0, call.clone())).unwrap();
    assert!(
        matches!(first, CallOutcome::Completed { .. }),
        "first: {first:?}"
    );
    assert_eq!(service.effects.load(Ordering::SeqCst), 1);
    let deferred = ledger.has_unsynced_commits();

    // The power goes before the deadline; the app reconciles 40 minutes
    // later, within its promised hour, after the key expired.
    machine.cut_now();
    ledger.abandon();
    drop((ledger, executor));
    machine.restart(Loss::All, &mut |_| 0);
    clock.advance(40 * 60_000);
    let ledger = Arc::new(Ledger::open_with_clock(&path, cfg(&machine), clock.clone()).unwrap());
    let executor = Executor::new(ledger.clone(), ExecutorConfig::default());
    executor.register(Arc::new(Pay(service.clone()))).unwrap();
    ledger.recover().unwrap();
    let again = rt.block_on(executor.execute(&op, 0, call)).unwrap();
    assert_eq!(
        service.effects.load(Ordering::SeqCst),
        1,
        "two payments: the first attempt's commit, 30 minutes before its key expired, was \
         deferred (has_unsynced_commits() = {deferred}), lost to the cut, and reconciled by a \
         resend under the expired key ({again:?})"
    );
}

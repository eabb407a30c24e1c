//! Review r7 of the latest executor/ledger commits (Takeover::Continue, the
//! kept batch item, the settling drop, the in-process registry). Every effect is counted at a fake
//! downstream inside the tool; every wait is bounded. A test whose doc says
//! FAILS is a defect on the code it was written against.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use support::*;
use toolledger::executor::{CallOutcome, Executor, ToolDescriptor};
use toolledger::ledger::{Ledger, LedgerEvent, LedgerObserver};
use toolledger_test_support as support;

// The fixture (a held tool counting effects, the config, the bounded wait)
// is the reentrancy-fixes review's.
use super::fixes12_review::{bounded, config, neither, only_id, open, Probe};

fn batch_tool() -> Arc<Probe> {
    Probe::new(ToolDescriptor {
        batch: toolledger::executor::BatchMode::Independent,
        ..neither("send_all")
    })
}

const ARGS: &str = r#"{"items":[{"to":"a"},{"to":"b"}]}"#;

/// Item 0 of an independent batch comes back while the ledger is suspended
/// (kept with the orphan), then the screen's executor is dropped while
/// still suspended. The drop's `record_batch_item` is refused (suspended)
/// and the item's result is not stranded (only the orphan, without it):
/// resume() marks the batch unknown and item 0, whose effect and result
/// were known, is lost. Must: item 0 recorded after resume (stranded with
/// the orphan as the atomic kept result is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_batch_item_of_an_executor_dropped_while_suspended_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = batch_tool();
    let mut reached = tool.hold();
    let first = {
        let screen = Executor::new(ledger.clone(), config());
        screen.register(tool.clone()).unwrap();
        let run = {
            let screen = screen.clone();
            tokio::spawn(async move {
                screen
                    .execute(&op("o"), 0, call("c1", "send_all", ARGS))
                    .await
            })
        };
        bounded("perform reached", reached.recv()).await.unwrap();
        ledger.suspend().unwrap();
        tool.release();
        bounded("execute", run).await.unwrap()
    };
    assert_eq!(tool.effects(), 1, "item 0 went out");
    ledger.resume().unwrap();
    let next = Executor::new(ledger.clone(), config());
    next.register(tool.clone()).unwrap();
    let again = bounded(
        "execute again",
        next.execute(&op("o"), 0, call("c1", "send_all", ARGS)),
    )
    .await
    .unwrap();
    let id = only_id(&ledger);
    let rec = ledger.get(&id).unwrap().unwrap();
    let items = ledger.batch_items(&id).unwrap();
    eprintln!(
        "first {first:?}\nagain {again:?}\nstored {} items {items:?} effects {}",
        rec.status,
        tool.effects()
    );
    assert!(tool.effects() <= 2, "never an item twice");
    assert!(
        items.iter().any(|(i, _, _)| *i == 0),
        "item 0's known result was lost: {again:?} (stored {}, items {items:?})",
        rec.status
    );
}

/// The kept item's orphan is asked for twice at once (two turns of the
/// same conversation, the UI retrying). Both asks find the orphan in
/// `take_over_orphan` before either removes it; the second
/// `record_batch_item` of item 0 is `ON CONFLICT DO NOTHING` (Ok), so both
/// answer `Continue` and both perform item 1. Must: item 1 performed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_asks_all_continue_a_kept_batch_item_orphan() {
    let mut worst = 0;
    let mut log = Vec::new();
    for round in 0..600 {
        let dir = tempfile::tempdir().unwrap();
        let ledger = open(&dir.path().join("l.db"));
        let tool = batch_tool();
        let exec = Executor::new(ledger.clone(), config());
        exec.register(tool.clone()).unwrap();
        let mut reached = tool.hold();
        let run = {
            let exec = exec.clone();
            tokio::spawn(async move {
                exec.execute(&op("o"), 0, call("c1", "send_all", ARGS))
                    .await
            })
        };
        bounded("perform reached", reached.recv()).await.unwrap();
        ledger.suspend().unwrap();
        tool.release();
        let _ = bounded("execute", run).await.unwrap();
        *tool.hold.lock().unwrap() = false;
        ledger.resume().unwrap();
        let barrier = Arc::new(tokio::sync::Barrier::new(3));
        let mut asks = Vec::new();
        for _ in 0..3 {
            let exec = exec.clone();
            let barrier = barrier.clone();
            asks.push(tokio::spawn(async move {
                barrier.wait().await;
                exec.execute(&op("o"), 0, call("c1", "send_all", ARGS))
                    .await
            }));
        }
        let mut answers = Vec::new();
        for a in asks {
            answers.push(bounded("ask", a).await.unwrap());
        }
        let e = tool.effects();
        worst = worst.max(e);
        if e > 2 {
            log.push(format!(
                "round {round}: effects {e} per key {:?} answers {answers:?}",
                tool.effects.lock().unwrap()
            ));
        }
    }
    eprintln!("{log:#?}");
    assert!(worst <= 2, "an item performed twice: {log:#?}");
}

/// Item 0 kept (suspended when it came back); the app resumes, and only
/// then the screen's executor is released (dropped) before any ask. The
/// drop records item 0 (writable now) and marks the orphan unknown, so the
/// next executor reconciles item 1, which was never sent, as the uncertain
/// one: a tool with neither key nor lookup answers `Unknown` although every
/// fact is known (item 0 recorded, item 1 never sent). Must: as through
/// the live executor (`Continue`): item 1 run once, the batch committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_batch_item_recorded_by_the_drop_still_leaves_the_batch_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = batch_tool();
    let mut reached = tool.hold();
    {
        let screen = Executor::new(ledger.clone(), config());
        screen.register(tool.clone()).unwrap();
        let run = {
            let screen = screen.clone();
            tokio::spawn(async move {
                screen
                    .execute(&op("o"), 0, call("c1", "send_all", ARGS))
                    .await
            })
        };
        bounded("perform reached", reached.recv()).await.unwrap();
        ledger.suspend().unwrap();
        tool.release();
        let _ = bounded("execute", run).await.unwrap();
        ledger.resume().unwrap();
    }
    let next = Executor::new(ledger.clone(), config());
    next.register(tool.clone()).unwrap();
    let again = bounded(
        "execute again",
        next.execute(&op("o"), 0, call("c1", "send_all", ARGS)),
    )
    .await
    .unwrap();
    let id = only_id(&ledger);
    let rec = ledger.get(&id).unwrap().unwrap();
    let items = ledger.batch_items(&id).unwrap();
    eprintln!(
        "again {again:?}\nstored {} items {items:?} effects {}",
        rec.status,
        tool.effects()
    );
    assert!(tool.effects() <= 2, "never an item twice");
    assert_eq!(
        items.len(),
        2,
        "items {items:?}, answer {again:?}, stored {}",
        rec.status
    );
    assert!(rec.status.is_committed(), "{}", rec.status);
}

/// The kept item's orphan is taken over by `Executor::recover()` (resume,
/// then recover) rather than an ask: `Continue` through `recover_one`.
/// Must: item 1 once, committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_continues_a_kept_batch_item_orphan_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = batch_tool();
    let exec = Executor::new(ledger.clone(), config());
    exec.register(tool.clone()).unwrap();
    let mut reached = tool.hold();
    let run = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute(&op("o"), 0, call("c1", "send_all", ARGS))
                .await
        })
    };
    bounded("perform reached", reached.recv()).await.unwrap();
    ledger.suspend().unwrap();
    tool.release();
    let _ = bounded("execute", run).await.unwrap();
    ledger.resume().unwrap();
    let r = bounded("recover", exec.recover()).await.unwrap();
    let again = bounded(
        "execute again",
        exec.execute(&op("o"), 0, call("c1", "send_all", ARGS)),
    )
    .await
    .unwrap();
    let id = only_id(&ledger);
    let rec = ledger.get(&id).unwrap().unwrap();
    eprintln!(
        "recover {:?} {:?}\nagain {again:?}\nstored {} effects {}",
        r.outcomes,
        r.failed,
        rec.status,
        tool.effects()
    );
    assert_eq!(tool.effects(), 2);
    assert!(rec.status.is_committed(), "{}", rec.status);
}

/// Item 0 kept (suspended), the app resumes and cancels the operation,
/// then asks again: `Continue` must not run item 1 after the stop. Must:
/// item 0 recorded, item 1 never performed, a partial commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_after_a_cancel_runs_no_further_item() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = batch_tool();
    let exec = Executor::new(ledger.clone(), config());
    exec.register(tool.clone()).unwrap();
    let mut reached = tool.hold();
    let run = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute(&op("o"), 0, call("c1", "send_all", ARGS))
                .await
        })
    };
    bounded("perform reached", reached.recv()).await.unwrap();
    ledger.suspend().unwrap();
    tool.release();
    let _ = bounded("execute", run).await.unwrap();
    ledger.resume().unwrap();
    let cancelled = exec.cancel_operation(&op("o"));
    let again = bounded(
        "execute again",
        exec.execute(&op("o"), 0, call("c1", "send_all", ARGS)),
    )
    .await;
    let id = only_id(&ledger);
    let rec = ledger.get(&id).unwrap().unwrap();
    let items = ledger.batch_items(&id).unwrap();
    eprintln!(
        "cancel {cancelled:?}\nagain {again:?}\nstored {} items {items:?} performs {}",
        rec.status,
        tool.performs.load(Ordering::SeqCst)
    );
    assert_eq!(
        tool.performs.load(Ordering::SeqCst),
        1,
        "no item after the stop"
    );
    assert_eq!(items.len(), 1);
}

/// The kept item is the batch's last one: `Continue` must commit the batch
/// without performing anything again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_with_the_last_item_kept_commits_without_a_perform() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = batch_tool();
    let exec = Executor::new(ledger.clone(), config());
    exec.register(tool.clone()).unwrap();
    let args = r#"{"items":[{"to":"a"}]}"#;
    let mut reached = tool.hold();
    let run = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute(&op("o"), 0, call("c1", "send_all", args))
                .await
        })
    };
    bounded("perform reached", reached.recv()).await.unwrap();
    ledger.suspend().unwrap();
    tool.release();
    let _ = bounded("execute", run).await.unwrap();
    ledger.resume().unwrap();
    let again = bounded(
        "execute again",
        exec.execute(&op("o"), 0, call("c1", "send_all", args)),
    )
    .await
    .unwrap();
    let id = only_id(&ledger);
    let rec = ledger.get(&id).unwrap().unwrap();
    eprintln!(
        "again {again:?} stored {} performs {}",
        rec.status,
        tool.performs.load(Ordering::SeqCst)
    );
    assert_eq!(tool.performs.load(Ordering::SeqCst), 1);
    assert!(
        matches!(again, CallOutcome::Completed { partial: false, .. }),
        "{again:?}"
    );
    assert!(rec.status.is_committed(), "{}", rec.status);
}

/// Suspended twice: item 0 kept, `Continue` runs item 1, which is kept too
/// (suspended again while it ran). Must: the third ask records item 1 and
/// commits the batch without performing anything again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_whose_next_item_is_kept_again_commits_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = batch_tool();
    let exec = Executor::new(ledger.clone(), config());
    exec.register(tool.clone()).unwrap();
    for round in 0..2 {
        let mut reached = tool.hold();
        let run = {
            let exec = exec.clone();
            tokio::spawn(async move {
                exec.execute(&op("o"), 0, call("c1", "send_all", ARGS))
                    .await
            })
        };
        bounded("perform reached", reached.recv()).await.unwrap();
        ledger.suspend().unwrap();
        tool.release();
        let r = bounded("execute", run).await.unwrap();
        eprintln!("round {round}: {r:?}");
        ledger.resume().unwrap();
    }
    let again = bounded(
        "execute again",
        exec.execute(&op("o"), 0, call("c1", "send_all", ARGS)),
    )
    .await
    .unwrap();
    let id = only_id(&ledger);
    let rec = ledger.get(&id).unwrap().unwrap();
    let items = ledger.batch_items(&id).unwrap();
    eprintln!(
        "again {again:?} stored {} items {items:?} performs {}",
        rec.status,
        tool.performs.load(Ordering::SeqCst)
    );
    assert_eq!(tool.performs.load(Ordering::SeqCst), 2);
    assert_eq!(items.len(), 2);
    assert!(
        matches!(again, CallOutcome::Completed { partial: false, .. }),
        "{again:?}"
    );
}

/// An observer that suspends the ledger on its first event (the app goes
/// to the background as the first move is heard).
struct SuspendOnce {
    ledger: Mutex<Option<std::sync::Weak<Ledger>>>,
    fired: AtomicU32,
}

impl LedgerObserver for SuspendOnce {
    fn on_event(&self, _event: &LedgerEvent) {
        let l = self
            .ledger
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|w| w.upgrade());
        if let Some(l) = l {
            if self.fired.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = l.suspend();
            }
        }
    }
}

/// A dropped executor's kept result is stranded (suspended); `resume()`
/// settles it (commit: an event) and the observer suspends the ledger
/// from that event. Must: no hang; the result committed once; a later
/// `resume()` works and the call answers its committed result (one effect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_suspending_during_settle_stranded_neither_hangs_nor_loses() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir.path().join("l.db"));
    let tool = Probe::new(neither("send"));
    let obs = Arc::new(SuspendOnce {
        ledger: Mutex::new(None),
        fired: AtomicU32::new(0),
    });
    ledger.set_observer(Some(obs.clone())).unwrap();
    let mut reached = tool.hold();
    {
        let screen = Executor::new(ledger.clone(), config());
        screen.register(tool.clone()).unwrap();
        let run = {
            let screen = screen.clone();
            tokio::spawn(async move {
                screen
                    .execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#))
                    .await
            })
        };
        bounded("perform reached", reached.recv()).await.unwrap();
        ledger.suspend().unwrap();
        tool.release();
        let _ = bounded("execute", run).await.unwrap();
    }
    *obs.ledger.lock().unwrap() = Some(Arc::downgrade(&ledger));
    let l2 = ledger.clone();
    let first = bounded("resume", tokio::task::spawn_blocking(move || l2.resume()))
        .await
        .unwrap();
    let l3 = ledger.clone();
    let second = bounded(
        "resume again",
        tokio::task::spawn_blocking(move || l3.resume()),
    )
    .await
    .unwrap();
    let next = Executor::new(ledger.clone(), config());
    next.register(tool.clone()).unwrap();
    let again = bounded(
        "execute",
        next.execute(&op("o"), 0, call("c1", "send", r#"{"to":"a"}"#)),
    )
    .await
    .unwrap();
    let rec = ledger.get(&only_id(&ledger)).unwrap().unwrap();
    eprintln!(
        "first {first:?}\nsecond {second:?}\nagain {again:?}\nstored {} events {}",
        rec.status,
        obs.fired.load(Ordering::SeqCst)
    );
    assert!(second.is_ok(), "{second:?}");
    assert!(
        obs.fired.load(Ordering::SeqCst) >= 1,
        "the observer heard the settling"
    );
    assert_eq!(tool.effects(), 1);
    assert!(
        matches!(again, CallOutcome::Completed { ref result_json, .. } if result_json == r#"{"n":1}"#),
        "{again:?}"
    );
}

//! The deadline of deferred commits: a thread that syncs the WAL at the
//! latest [`super::DeferredCommits::deadline`] after the oldest deferred
//! commit not durable yet, when nothing else (a durable write, `suspend()`,
//! `sync()`) made it durable first.
//!
//! The thread is started by the first deferred commit (a ledger that never
//! defers one never has it), sleeps while nothing is pending, holds only a
//! weak reference to the store, and is stopped and joined when the ledger is
//! dropped or abandoned. It measures the deadline on this process's
//! monotonic time: it bounds how long a commit stays exposed to a power cut,
//! which is a matter of real time, not of the ledger's injected clock.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::store::{DeferredDue, Store};

/// One ledger's deadline thread.
#[derive(Debug)]
pub(super) struct Flusher {
    deadline: Duration,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// When the oldest pending deferred commit must be durable.
    due: Option<Instant>,
    /// Set when the ledger goes away: the thread ends.
    stop: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic elsewhere cannot leave it torn.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Flusher {
    /// A flusher with this deadline (`Duration::MAX`: never starts).
    pub(super) fn new(deadline: Duration) -> Flusher {
        Flusher {
            deadline,
            shared: Arc::new(Shared::default()),
            thread: Mutex::new(None),
        }
    }

    /// After a deferred commit: sync by `now + deadline` unless something
    /// else does first (the sync is skipped then). If the thread cannot be
    /// started, the commit becomes durable with the next durable write,
    /// `suspend()`, `sync()` or when the ledger is dropped.
    pub(super) fn arm(&self, store: &Arc<Store>) {
        if self.deadline == Duration::MAX {
            return;
        }
        {
            let mut state = lock(&self.shared.state);
            if state.stop {
                return;
            }
            if state.due.is_none() {
                state.due = Instant::now().checked_add(self.deadline);
                self.shared.wake.notify_one();
            }
        }
        let mut thread = lock(&self.thread);
        if thread.is_none() {
            let shared = self.shared.clone();
            let store = Arc::downgrade(store);
            *thread = std::thread::Builder::new()
                .name("toolledger-sync".into())
                .spawn({
                    let deadline = self.deadline;
                    move || run(&shared, &store, deadline)
                })
                .ok();
        }
    }

    /// Ends the thread (without a sync of its own) and waits for it.
    pub(super) fn stop(&self) {
        lock(&self.shared.state).stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = lock(&self.thread).take() {
            // The thread never panics (nothing in it unwraps); a join error
            // would only say it did, and there is nothing to do about it.
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared, store: &Weak<Store>, deadline: Duration) {
    loop {
        {
            let mut state = lock(&shared.state);
            loop {
                if state.stop {
                    return;
                }
                match state.due {
                    None => {
                        state = shared
                            .wake
                            .wait(state)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    Some(due) => {
                        let now = Instant::now();
                        if now >= due {
                            state.due = None;
                            break;
                        }
                        state = shared
                            .wake
                            .wait_timeout(state, due - now)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                }
            }
        }
        let Some(store) = store.upgrade() else {
            return;
        };
        // The deadline counts from the oldest commit still not durable: a
        // durable write since (the next call's intent) synced the commit
        // that armed it, so in a steady stream of calls this thread syncs
        // nothing of its own. A suspended store synced on suspending (the
        // sync is refused and nothing is pending). A sync that failed
        // otherwise (a disk error) is tried again one deadline later, unless
        // a durable write, `suspend()` or `sync()` made the commits durable
        // meanwhile.
        let next = match store.sync_deferred_due(deadline) {
            Ok(DeferredDue::Nothing | DeferredDue::Synced) => None,
            Ok(DeferredDue::At(due)) => Some(due),
            Err(_) if store.has_unsynced() => Instant::now().checked_add(deadline),
            Err(_) => None,
        };
        if let Some(next) = next {
            let mut state = lock(&shared.state);
            state.due = Some(state.due.map_or(next, |due| due.min(next)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `stop` wakes a thread that sleeps on a far deadline and joins it:
    /// the thread never outlives its ledger.
    #[test]
    fn stop_ends_a_thread_that_waits_for_a_far_deadline() {
        let store = Arc::new(Store::open_in_memory().expect("in-memory store"));
        let flusher = Arc::new(Flusher::new(Duration::from_secs(3600)));
        flusher.arm(&store);
        assert!(lock(&flusher.thread).is_some(), "the first arm starts it");
        let (done, stopped) = std::sync::mpsc::channel();
        let f = flusher.clone();
        std::thread::spawn(move || {
            f.stop();
            let _ = done.send(());
        });
        stopped
            .recv_timeout(Duration::from_secs(10))
            .expect("stop() joined the thread instead of waiting an hour");
        assert!(lock(&flusher.thread).is_none());
        // Stopped for good: arming again starts nothing.
        flusher.arm(&store);
        assert!(lock(&flusher.thread).is_none());
        // The thread held the store only weakly.
        assert_eq!(Arc::strong_count(&store), 1);
    }
}

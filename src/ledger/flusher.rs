//! The ledger's background thread, for two jobs that must not wait for the
//! next call:
//!
//! - The deadline of deferred commits: it syncs the WAL at the latest
//!   [`super::DeferredCommits::deadline`] after the oldest deferred commit not
//!   durable yet, when nothing else (a durable write, `suspend()`, `sync()`)
//!   made it durable first.
//! - The idle checkpoint ([`super::IdleCheckpoint`]): once enough write
//!   transactions piled up in the WAL and then the ledger wrote nothing for a
//!   while, it checkpoints, so that no call pays SQLite's checkpoint in its
//!   commit.
//!
//! The thread is started by the first deferred commit or by the write that
//! makes a checkpoint worth it (a ledger that never needs either never has
//! it), sleeps while nothing is pending, holds only a weak reference to the
//! store, and is stopped and joined when the ledger is dropped or abandoned.
//! It measures time on this process's monotonic clock: the deadline bounds
//! how long a commit stays exposed to a power cut, and idleness is about the
//! machine's real time, neither about the ledger's injected clock.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::IdleCheckpoint;
use crate::store::{DeferredDue, IdleCheckpointRun, Store};

/// One ledger's background thread.
#[derive(Debug)]
pub(super) struct Flusher {
    deadline: Duration,
    idle: IdleCheckpoint,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// What the times below count from.
    epoch: Instant,
    /// When the last write began, in nanoseconds since `epoch`.
    last_write_ns: AtomicU64,
    /// Write transactions begun since the last idle checkpoint.
    writes: AtomicU32,
}

#[derive(Debug, Default)]
struct State {
    /// When the oldest pending deferred commit must be durable.
    due: Option<Instant>,
    /// When to look whether the ledger is idle enough to checkpoint.
    idle_due: Option<Instant>,
    /// Set when the ledger goes away: the thread ends.
    stop: bool,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            epoch: Instant::now(),
            last_write_ns: AtomicU64::new(0),
            writes: AtomicU32::new(0),
        }
    }

    /// When the last write began.
    fn last_write(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.last_write_ns.load(Ordering::Acquire))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic elsewhere cannot leave it torn.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Flusher {
    /// A flusher with this deadline (`Duration::MAX`: no deferred-commit
    /// sync) and idle checkpoint ([`IdleCheckpoint::OFF`]: none); with
    /// neither it never starts.
    pub(super) fn new(deadline: Duration, idle: IdleCheckpoint) -> Flusher {
        Flusher {
            deadline,
            idle,
            shared: Arc::new(Shared::new()),
            thread: Mutex::new(None),
        }
    }

    /// Before every write transaction: notes when it began and, at the
    /// write that makes a checkpoint worth it, asks the thread to look for
    /// an idle moment. A few atomic operations otherwise.
    pub(super) fn note_write(&self, store: &Arc<Store>) {
        if !self.idle.is_on() {
            return;
        }
        let shared = &self.shared;
        let since = u64::try_from(shared.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        shared.last_write_ns.store(since, Ordering::Release);
        let writes = shared
            .writes
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if writes != self.idle.writes.max(1) {
            return;
        }
        {
            let mut state = lock(&shared.state);
            if state.stop {
                return;
            }
            if state.idle_due.is_none() {
                state.idle_due = Instant::now().checked_add(self.idle.after);
                shared.wake.notify_one();
            }
        }
        self.start(store);
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
        self.start(store);
    }

    /// Starts the thread unless it runs (or could not be started: then
    /// deferred commits wait for the next durable write, `suspend()`,
    /// `sync()` or the ledger's drop, and SQLite checkpoints in a commit).
    fn start(&self, store: &Arc<Store>) {
        let mut thread = lock(&self.thread);
        if thread.is_none() {
            let shared = self.shared.clone();
            let store = Arc::downgrade(store);
            *thread = std::thread::Builder::new()
                .name("toolledger-sync".into())
                .spawn({
                    let (deadline, idle) = (self.deadline, self.idle);
                    move || run(&shared, &store, deadline, idle)
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

/// What woke the thread.
enum Job {
    /// The deferred commits' deadline.
    Sync,
    /// A look at whether the ledger is idle.
    Idle,
}

fn run(shared: &Shared, store: &Weak<Store>, deadline: Duration, idle: IdleCheckpoint) {
    loop {
        let job = {
            let mut state = lock(&shared.state);
            loop {
                if state.stop {
                    return;
                }
                let next = match (state.due, state.idle_due) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let Some(next) = next else {
                    state = shared
                        .wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                    continue;
                };
                let now = Instant::now();
                if now >= next {
                    if state.due.is_some_and(|due| now >= due) {
                        state.due = None;
                        break Job::Sync;
                    }
                    state.idle_due = None;
                    break Job::Idle;
                }
                state = shared
                    .wake
                    .wait_timeout(state, next - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        };
        let Some(store) = store.upgrade() else {
            return;
        };
        match job {
            Job::Sync => {
                // The deadline counts from the oldest commit still not
                // durable: a durable write since (the next call's intent)
                // synced the commit that armed it, so in a steady stream of
                // calls this thread syncs nothing of its own. A suspended
                // store synced on suspending (the sync is refused and
                // nothing is pending). A sync that failed otherwise (a disk
                // error) is tried again one deadline later, unless a durable
                // write, `suspend()` or `sync()` made the commits durable
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
            Job::Idle => {
                // Idle: nothing written for `idle.after`, asked again under
                // the store's lock. A write that began since skips it; the
                // look is made again `idle.after` after that write. Done,
                // failed (a full disk: SQLite's own checkpoint in a commit
                // remains) or with nothing to do, the count starts again:
                // the next look comes after as many writes.
                let quiet = || Instant::now().duration_since(shared.last_write()) >= idle.after;
                match store.checkpoint_idle(quiet) {
                    Ok(IdleCheckpointRun::NotIdle) => {
                        let again = shared.last_write().checked_add(idle.after);
                        let mut state = lock(&shared.state);
                        state.idle_due = state.idle_due.or(again);
                    }
                    Ok(IdleCheckpointRun::Done) | Err(_) => {
                        shared.writes.store(0, Ordering::Relaxed);
                    }
                }
            }
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
        let flusher = Arc::new(Flusher::new(Duration::from_secs(3600), IdleCheckpoint::OFF));
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

    /// The longest idle time the bindings can give (`u64::MAX` ms) panics
    /// nowhere: the look is due in half a billion years (or never, where
    /// the clock cannot hold that), the thread sleeps on it, and `stop`
    /// ends it at once.
    #[test]
    fn the_longest_idle_time_never_fires_and_never_panics() {
        let store = Arc::new(Store::open_in_memory().expect("in-memory store"));
        let idle = IdleCheckpoint {
            after: Duration::from_millis(u64::MAX),
            writes: 1,
        };
        assert!(idle.is_on());
        let flusher = Flusher::new(Duration::MAX, idle);
        flusher.note_write(&store);
        flusher.note_write(&store);
        assert!(
            lock(&flusher.thread).is_some(),
            "the threshold write starts it"
        );
        let year = Duration::from_secs(365 * 86_400);
        let far = Instant::now().checked_add(year).expect("a year ahead");
        assert!(lock(&flusher.shared.state)
            .idle_due
            .is_none_or(|due| due > far));
        flusher.stop();
        assert!(lock(&flusher.thread).is_none());
    }
}

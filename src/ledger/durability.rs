//! The durability policy: how durable a call's commit must be before
//! `commit` returns, by what the tool's downstream offers.
//!
//! The intent (`executing` with its key) is always durable before the request
//! leaves. The commit need not always be: a committed record can only be lost
//! to a power cut or an OS crash (a killed app loses nothing, its WAL write
//! is already in the OS), and then recovery finds the durable intent, marks
//! the outcome unknown and reconciles it. Where reconciliation gets the same
//! effect back without a second one — the downstream dedupes by the key for
//! longer than the ledger could take to reconcile, or the effect can be looked
//! up — the commit is *deferred*: written without a sync, durable with the
//! next durable write, `suspend()`, [`super::Ledger::sync`] or at the latest
//! [`DeferredCommits::deadline`] later. Everywhere else (no key and no
//! lookup, a key that may expire first, or an undeclared downstream) the
//! commit is durable at once. docs/design.md has the argument.

use std::time::Duration;

/// What a tool's downstream offers to settle an unknown outcome: what the
/// ledger needs to know about a call to choose how durable its commit must
/// be. The default (no key, no lookup) keeps every commit durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Downstream {
    /// The downstream deduplicates requests by the call's key.
    pub idempotency_key: bool,
    /// The effect can be looked up downstream (found or provably absent).
    pub lookup: bool,
    /// How long the downstream honours a key after its first request (its
    /// idempotency window, e.g. 24 h); `Some(Duration::MAX)` for keys that
    /// never expire; `None` when not declared (taken as too short to defer a
    /// commit on the key alone).
    pub key_lifetime: Option<Duration>,
}

impl Downstream {
    /// A downstream that dedupes by key for `lifetime` (`Duration::MAX`:
    /// for ever).
    pub fn keyed(lifetime: Duration) -> Downstream {
        Downstream {
            idempotency_key: true,
            key_lifetime: Some(lifetime),
            ..Downstream::default()
        }
    }

    /// A downstream where the effect can be looked up.
    pub fn lookup() -> Downstream {
        Downstream {
            lookup: true,
            ..Downstream::default()
        }
    }
}

/// When deferred commits are allowed, and how soon they become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeferredCommits {
    /// Off: every commit is durable before it returns (two syncs for a
    /// side-effecting call, as before the policy).
    pub enabled: bool,
    /// The longest a deferred commit stays without a sync: a background
    /// thread of the ledger syncs this long after it unless a durable write,
    /// `suspend()`, `sync()` or closing the ledger made it durable first.
    /// Measured on this process's monotonic time. `Duration::MAX`: no
    /// thread; only those events make it durable (deterministic tests).
    pub deadline: Duration,
    /// How soon after any restart the app is sure to call `recover()` (an
    /// app that starts at boot, a service). A lost deferred commit is
    /// reconciled then at the latest, so a key-only tool whose key lives at
    /// least `deadline` plus this long may defer its commit. `None`: nothing
    /// is promised (an app the user may not open for weeks), so only keys
    /// that never expire qualify.
    pub reconcile_within: Option<Duration>,
}

/// The default [`DeferredCommits::deadline`]: one second.
pub const DEFAULT_DEFERRED_DEADLINE: Duration = Duration::from_secs(1);

impl Default for DeferredCommits {
    fn default() -> Self {
        DeferredCommits {
            enabled: true,
            deadline: DEFAULT_DEFERRED_DEADLINE,
            reconcile_within: None,
        }
    }
}

/// The WAL checkpoint taken off the calls' path.
///
/// SQLite copies the write-ahead log into the database file (a checkpoint)
/// inside the commit that takes the log past 1,000 pages: about once every
/// 250 side-effecting calls, that call pays the copy and two syncs (on a
/// phone, milliseconds). With this on, once the ledger has made `writes`
/// write transactions since its last checkpoint and then written nothing for
/// `after`, a background thread of the ledger checkpoints instead (SQLite's
/// PASSIVE mode: it never waits for another connection and never blocks
/// one's readers), so the next write starts the log over and no call pays
/// the copy. A ledger that is never idle that long keeps SQLite's checkpoint
/// in the commit. Before it checkpoints, the thread syncs the deferred
/// commits not durable yet (an idle ledger has nothing left for their
/// deadline); the checkpoint itself is not relied on for durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleCheckpoint {
    /// How long the ledger must have written nothing. `Duration::MAX`: off
    /// (no thread; deterministic storage simulations).
    pub after: Duration,
    /// How many write transactions since the last checkpoint make one worth
    /// its syncs (at least 1).
    pub writes: u32,
}

impl IdleCheckpoint {
    /// Never checkpoint from the background: only SQLite's own checkpoint
    /// (in a commit), `checkpoint()`, `prune()` and `suspend()`.
    pub const OFF: IdleCheckpoint = IdleCheckpoint {
        after: Duration::MAX,
        writes: u32::MAX,
    };

    /// True when a background checkpoint can happen.
    pub fn is_on(&self) -> bool {
        self.after != Duration::MAX && self.writes != u32::MAX
    }
}

impl Default for IdleCheckpoint {
    /// After 128 write transactions (about 64 calls, a quarter of what makes
    /// SQLite checkpoint in a commit) and a quarter of a second without a
    /// write.
    fn default() -> Self {
        IdleCheckpoint {
            after: Duration::from_millis(250),
            writes: 128,
        }
    }
}

/// How durable one commit must be when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitSync {
    /// Synced before `commit` returns.
    Now,
    /// Written without a sync; durable within the deadline.
    Deferred,
}

impl DeferredCommits {
    /// The policy: how durable the commit of a call to `downstream` must be.
    /// A lookup finds the effect itself, so a lost commit is always found
    /// again; a key protects only while the downstream still honours it,
    /// which must outlast the time to reconcile. A key's lifetime runs from
    /// its first request: `key_age` is how long ago that was (`None`: not
    /// known, as for an attempt after the first), and a finite key defers
    /// only when what is left of its life outlasts the deadline plus
    /// [`DeferredCommits::reconcile_within`].
    pub fn commit_sync(&self, downstream: &Downstream, key_age: Option<Duration>) -> CommitSync {
        if !self.enabled {
            return CommitSync::Now;
        }
        if downstream.lookup {
            return CommitSync::Deferred;
        }
        let key_outlasts = match (downstream.key_lifetime, self.reconcile_within, key_age) {
            (Some(life), _, _) if life == Duration::MAX => true,
            (Some(life), Some(within), Some(age)) => {
                life >= age.saturating_add(self.deadline).saturating_add(within)
            }
            _ => false,
        };
        if downstream.idempotency_key && key_outlasts {
            CommitSync::Deferred
        } else {
            CommitSync::Now
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn only_a_lost_commit_that_reconciliation_repairs_is_deferred() {
        let policy = DeferredCommits::default();
        let cases = [
            (Downstream::default(), CommitSync::Now),
            (Downstream::lookup(), CommitSync::Deferred),
            (Downstream::keyed(Duration::MAX), CommitSync::Deferred),
            // A 24-hour key store and an app that may stay closed longer.
            (Downstream::keyed(DAY), CommitSync::Now),
            (
                Downstream {
                    idempotency_key: true,
                    ..Downstream::default()
                },
                CommitSync::Now,
            ),
            (
                Downstream {
                    lookup: true,
                    ..Downstream::keyed(DAY)
                },
                CommitSync::Deferred,
            ),
            // A lifetime without a key protects nothing.
            (
                Downstream {
                    key_lifetime: Some(Duration::MAX),
                    ..Downstream::default()
                },
                CommitSync::Now,
            ),
        ];
        for (downstream, want) in cases {
            assert_eq!(
                policy.commit_sync(&downstream, Some(Duration::ZERO)),
                want,
                "{downstream:?}"
            );
        }
    }

    #[test]
    fn a_finite_key_qualifies_only_when_the_app_promises_to_reconcile_in_time() {
        let policy = DeferredCommits {
            reconcile_within: Some(Duration::from_secs(3600)),
            ..DeferredCommits::default()
        };
        assert_eq!(
            policy.commit_sync(&Downstream::keyed(DAY), Some(Duration::ZERO)),
            CommitSync::Deferred
        );
        // Must outlast the deadline plus the promised time.
        assert_eq!(
            policy.commit_sync(
                &Downstream::keyed(Duration::from_secs(3600)),
                Some(Duration::ZERO)
            ),
            CommitSync::Now
        );
        assert_eq!(
            policy.commit_sync(
                &Downstream::keyed(Duration::from_secs(3601)),
                Some(Duration::ZERO)
            ),
            CommitSync::Deferred
        );
    }

    #[test]
    fn a_finite_key_counts_its_life_from_its_first_request() {
        let policy = DeferredCommits {
            reconcile_within: Some(Duration::from_secs(3600)),
            ..DeferredCommits::default()
        };
        let key = Downstream::keyed(DAY);
        let hours = |h: u64| Some(Duration::from_secs(h * 3600));
        // A day-long key sent 22 h ago has 2 h left: more than an hour and
        // a second.
        assert_eq!(policy.commit_sync(&key, hours(22)), CommitSync::Deferred);
        // Sent 23 h ago: one hour left, not enough for the deadline too.
        assert_eq!(policy.commit_sync(&key, hours(23)), CommitSync::Now);
        assert_eq!(policy.commit_sync(&key, hours(30)), CommitSync::Now);
        // The first request's time not known: a finite key cannot defer.
        assert_eq!(policy.commit_sync(&key, None), CommitSync::Now);
        // Keys that never expire and lookups do not depend on it.
        assert_eq!(
            policy.commit_sync(&Downstream::keyed(Duration::MAX), None),
            CommitSync::Deferred
        );
        assert_eq!(
            policy.commit_sync(&Downstream::lookup(), None),
            CommitSync::Deferred
        );
        assert_eq!(
            policy.commit_sync(&key, Some(Duration::MAX)),
            CommitSync::Now
        );
    }

    #[test]
    fn switched_off_every_commit_is_durable() {
        let policy = DeferredCommits {
            enabled: false,
            ..DeferredCommits::default()
        };
        assert_eq!(
            policy.commit_sync(&Downstream::lookup(), Some(Duration::ZERO)),
            CommitSync::Now
        );
        assert_eq!(
            policy.commit_sync(&Downstream::keyed(Duration::MAX), Some(Duration::ZERO)),
            CommitSync::Now
        );
    }
}

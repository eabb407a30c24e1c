//! [`Dao`]: every query the ledger runs, against one open transaction.
//!
//! A `Dao` only exists inside `Store::read` / `Store::write`, so every method
//! runs in the caller's transaction. The methods live beside the table they
//! touch: `operations.rs`, `executions.rs` (with `history.rs`, the transition
//! log), `attention.rs`, `approvals.rs`, `jobs.rs`, `retention.rs`,
//! `sessions.rs`, `diagnostics.rs`. Status updates are guarded by the expected
//! current status (`WHERE status = ?`) and report whether a row changed, so a
//! lost race is visible instead of silently overwriting.

use std::cell::RefCell;

use rusqlite::Connection;

use super::crypt::Keys;
use super::events::MoveEvent;
use super::hot::{self, Hot, HotSql};

/// Queries over one open transaction.
pub struct Dao<'a> {
    pub(super) tx: &'a Connection,
    /// The connection's held hot-path statements (`None`: a bare
    /// connection, whose `Dao` uses rusqlite's cache for them too).
    pub(super) hot: Option<&'a Hot>,
    /// The ledger's keys when it is encrypted: value columns are sealed on
    /// the way in and opened on the way out (`codec`).
    pub(super) keys: Option<&'a Keys>,
    /// Status moves made in this transaction, when someone observes them;
    /// handed out only after the commit.
    pub(super) events: Option<RefCell<Vec<MoveEvent>>>,
}

impl<'a> Dao<'a> {
    pub(super) fn new(tx: &'a Connection) -> Dao<'a> {
        Dao {
            tx,
            hot: None,
            keys: None,
            events: None,
        }
    }

    pub(super) fn with_keys(
        tx: &'a Connection,
        hot: Option<&'a Hot>,
        keys: Option<&'a Keys>,
        observe: bool,
    ) -> Dao<'a> {
        Dao {
            tx,
            hot,
            keys,
            events: observe.then(|| RefCell::new(Vec::new())),
        }
    }

    /// The digest stored for `plain` under this transaction's keys: the same
    /// in a plain ledger, keyed (HMAC) in an encrypted one. The keys are the
    /// ones the transaction was begun with, so a caller that holds the
    /// connection never waits for the keys' lock (a re-key takes that lock
    /// first and then the connection).
    pub fn stored_digest(&self, plain: &crate::model::ArgsDigest) -> crate::model::ArgsDigest {
        match self.keys {
            Some(keys) => keys.keyed_digest(plain),
            None => plain.clone(),
        }
    }

    /// Runs `f` on the hot-path statement `which` (held by the connection,
    /// or from rusqlite's cache on a bare connection).
    pub(super) fn hot<T>(
        &self,
        which: HotSql,
        f: impl FnOnce(&mut rusqlite::Statement<'_>) -> rusqlite::Result<T>,
    ) -> super::error::Result<T> {
        hot::run(self.hot, self.tx, which, f)
    }

    /// Rows changed by this connection so far (to tell whether a
    /// transaction wrote anything).
    pub fn total_changes(&self) -> u64 {
        self.tx.total_changes()
    }
}

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

/// Queries over one open transaction.
pub struct Dao<'a> {
    pub(super) tx: &'a Connection,
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
            keys: None,
            events: None,
        }
    }

    pub(super) fn with_keys(tx: &'a Connection, keys: Option<&'a Keys>, observe: bool) -> Dao<'a> {
        Dao {
            tx,
            keys,
            events: observe.then(|| RefCell::new(Vec::new())),
        }
    }

    /// Rows changed by this connection so far (to tell whether a
    /// transaction wrote anything).
    pub fn total_changes(&self) -> u64 {
        self.tx.total_changes()
    }
}

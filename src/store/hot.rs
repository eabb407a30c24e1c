//! The statements of a side-effecting call's happy path, prepared once per
//! connection and held for its life.
//!
//! rusqlite's statement cache costs about 1,300 instructions per use (the
//! SQL text hashed twice and copied into a new key, an LRU node moved out
//! and back, the bindings cleared), against a call of about ten statements
//! that each cost a few thousand to run. These statements are held in fixed
//! slots instead: a use is a `RefCell` borrow. Everything else keeps using
//! the cache.
//!
//! A held statement borrows the connection for as long as the connection
//! lives, which the borrow checker cannot express inside one struct. So the
//! slots hold `Statement<'static>` and [`super::Open`] keeps the invariants
//! that make that sound: the connection is boxed (its address never
//! changes while the `Open` moves), the slots are declared before it (so
//! they are finalized first when the `Open` is dropped), they are emptied
//! before the connection is closed explicitly, and a slot is only ever
//! filled from, and lent together with, that same connection (`Hot` is
//! private to the store, and `Dao` gets both from one `Open`).

use std::cell::{RefCell, RefMut};

use rusqlite::{Connection, PrepFlags, Statement};

use super::error::Result;

/// One statement of the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HotSql {
    /// `BEGIN IMMEDIATE` (every write).
    BeginImmediate,
    /// `COMMIT` (every transaction).
    Commit,
    /// `begin`'s one read: the operation and whether the call's id is taken.
    OperationAndTaken,
    /// `begin`'s insert of a new execution.
    InsertExecution,
    /// The delivery mark.
    Deliver,
    /// The happy commit of a running attempt.
    CommitRunning,
    /// A replay's read: what answers for a committed execution.
    StoredAnswer,
}

/// How many [`HotSql`] statements there are.
const SLOTS: usize = 7;

impl HotSql {
    fn slot(self) -> usize {
        match self {
            HotSql::BeginImmediate => 0,
            HotSql::Commit => 1,
            HotSql::OperationAndTaken => 2,
            HotSql::InsertExecution => 3,
            HotSql::Deliver => 4,
            HotSql::CommitRunning => 5,
            HotSql::StoredAnswer => 6,
        }
    }

    /// The statement's SQL text.
    pub(super) fn sql(self) -> &'static str {
        match self {
            HotSql::BeginImmediate => "BEGIN IMMEDIATE",
            HotSql::Commit => "COMMIT",
            HotSql::OperationAndTaken => {
                "SELECT (SELECT status FROM operations WHERE operation_id = ?1),
                    EXISTS (SELECT 1 FROM executions WHERE execution_id = ?2)
                    OR EXISTS (SELECT 1 FROM tombstones WHERE execution_id = ?2)"
            }
            HotSql::InsertExecution => {
                // `ON CONFLICT (execution_id) DO NOTHING` covers only the
                // primary key: any other constraint still fails the statement.
                "INSERT INTO executions (execution_id, operation_id, round, position, provider,
                    provider_call_id, tool_name, tool_version, args_digest, args_json,
                    downstream_key, requires_approval, status, attempt_count, owner_session,
                    compensates, created_ms, updated_ms, history, digest_scheme)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17, ?17, ?18, 2)
                 ON CONFLICT (execution_id) DO NOTHING"
            }
            HotSql::Deliver => {
                // `OR FAIL`: see migration 005 (no statement journal).
                "UPDATE OR FAIL executions SET status = 'result_delivered', updated_ms = ?2,
                    history = history || ?3, needs_attention = NULL
                 WHERE execution_id = ?1 AND status = 'committed'"
            }
            HotSql::CommitRunning => {
                // `external_id IS ?5`: equal, or both none. A cancelled
                // operation's status moves too, which the general path does.
                // `OR FAIL`: see migration 005 (no statement journal).
                "UPDATE OR FAIL executions SET status = 'committed', updated_ms = ?3,
                    unknown_since_ms = NULL, unknown_boot = NULL, result_json = ?4,
                    external_id = ?5, history = history || ?6
                 WHERE execution_id = ?1 AND status = 'executing' AND attempt_count = ?2
                   AND owner_session = ?7 AND (external_id IS NULL OR external_id IS ?5)
                   AND NOT EXISTS (SELECT 1 FROM operations o
                                   WHERE o.operation_id = executions.operation_id
                                     AND o.status = 'cancelled')"
            }
            HotSql::StoredAnswer => {
                "SELECT status, args_digest, digest_scheme, result_json, external_id, partial
                 FROM executions WHERE execution_id = ?1"
            }
        }
    }
}

/// The held statements of one connection (see the module documentation for
/// why `'static` and what keeps it sound).
pub(super) struct Hot {
    slots: [RefCell<Option<Statement<'static>>>; SLOTS],
}

// SAFETY: the statements are used only together with their connection, under
// the store's mutex (as the connection itself, which is `Send`); rusqlite's
// own statement cache is `Send` on the same grounds.
unsafe impl Send for Hot {}

impl std::fmt::Debug for Hot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hot").finish_non_exhaustive()
    }
}

impl Hot {
    /// No statement prepared yet.
    pub(super) fn new() -> Hot {
        Hot {
            slots: Default::default(),
        }
    }

    /// Finalizes every held statement (before the connection closes).
    pub(super) fn clear(&self) {
        for slot in &self.slots {
            if let Ok(mut held) = slot.try_borrow_mut() {
                *held = None;
            }
        }
    }

    /// Runs `f` on the held statement `which` of `conn`, preparing it at its
    /// first use. `conn` must be the connection of the `Open` that holds
    /// `self`. A statement already lent out (a use inside a use) is taken
    /// from rusqlite's cache instead.
    pub(super) fn with<T>(
        &self,
        conn: &Connection,
        which: HotSql,
        f: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let Some(slot) = self.slots.get(which.slot()) else {
            return cached(conn, which, f);
        };
        let Ok(mut held) = slot.try_borrow_mut() else {
            return cached(conn, which, f);
        };
        if held.is_none() {
            let stmt =
                conn.prepare_with_flags(which.sql(), PrepFlags::SQLITE_PREPARE_PERSISTENT)?;
            // SAFETY: extends the statement's borrow of `conn` to the life
            // of the slot. `conn` is the boxed connection of the `Open` that
            // owns `self`: it does not move, and it outlives the slot (the
            // slots are dropped first, and cleared before an explicit close;
            // see the module documentation).
            let stmt = unsafe { std::mem::transmute::<Statement<'_>, Statement<'static>>(stmt) };
            *held = Some(stmt);
        }
        match RefMut::filter_map(held, Option::as_mut) {
            Ok(mut stmt) => Ok(f(&mut stmt)?),
            Err(_) => cached(conn, which, f),
        }
    }
}

/// Runs `f` on `which` from rusqlite's statement cache.
fn cached<T>(
    conn: &Connection,
    which: HotSql,
    f: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<T>,
) -> Result<T> {
    let mut stmt = conn.prepare_cached(which.sql())?;
    Ok(f(&mut stmt)?)
}

/// How a [`super::Dao`] runs a hot statement: held, or from the cache when
/// the `Dao` was made without the held ones (a bare connection).
pub(super) fn run<T>(
    hot: Option<&Hot>,
    conn: &Connection,
    which: HotSql,
    f: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<T>,
) -> Result<T> {
    match hot {
        Some(hot) => hot.with(conn, which, f),
        None => cached(conn, which, f),
    }
}

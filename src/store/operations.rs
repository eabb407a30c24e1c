//! The `operations` table: one row per user-visible turn of the agent
//! (`open`, `completed`, `cancelled`, `cancelled_after_side_effect`).

use rusqlite::{params, OptionalExtension};

use super::dao::Dao;
use super::error::Result;
use super::hot::HotSql;
use crate::model::{ExecutionId, OperationId, OperationStatus};

impl Dao<'_> {
    /// Creates the operation if it does not exist; returns its status.
    ///
    /// # Errors
    /// Storage errors.
    pub fn ensure_operation(&self, op: &OperationId, now_ms: i64) -> Result<OperationStatus> {
        // Read first: an existing operation (every call after the first of a
        // turn) costs no write at all.
        if let Some(status) = self.operation_status(op)? {
            return Ok(status);
        }
        self.insert_operation(op, now_ms)?;
        Ok(OperationStatus::Open)
    }

    /// Creates an operation that does not exist yet, `open`.
    ///
    /// # Errors
    /// Storage errors (an existing one is a constraint error).
    pub fn insert_operation(&self, op: &OperationId, now_ms: i64) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO operations (operation_id, status, created_ms, updated_ms)
                 VALUES (?1, 'open', ?2, ?2)",
            )?
            .execute(params![op, now_ms])?;
        Ok(())
    }

    /// The operation's status, if it exists, and whether `id` is taken (by
    /// a stored execution or a tombstone): what `begin` reads before it
    /// inserts a new call, in one statement of index lookups (no row of an
    /// execution is read).
    ///
    /// # Errors
    /// Storage errors.
    pub fn operation_and_taken(
        &self,
        op: &OperationId,
        id: &ExecutionId,
    ) -> Result<(Option<OperationStatus>, bool)> {
        self.hot(HotSql::OperationAndTaken, |stmt| {
            stmt.query_row(params![op, id], |r| Ok((r.get(0)?, r.get(1)?)))
        })
    }

    /// Whether `id` is taken by a stored execution or a tombstone (index
    /// lookups only).
    ///
    /// # Errors
    /// Storage errors.
    pub fn execution_id_taken(&self, id: &ExecutionId) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM executions WHERE execution_id = ?1)
                    OR EXISTS (SELECT 1 FROM tombstones WHERE execution_id = ?1)",
            )?
            .query_row([id], |r| r.get(0))?)
    }

    /// The operation's status, if it exists.
    ///
    /// # Errors
    /// Storage errors.
    pub fn operation_status(&self, op: &OperationId) -> Result<Option<OperationStatus>> {
        Ok(self
            .tx
            .prepare_cached("SELECT status FROM operations WHERE operation_id = ?1")?
            .query_row([op], |r| r.get(0))
            .optional()?)
    }

    /// Sets the operation's status.
    ///
    /// # Errors
    /// Storage errors.
    pub fn set_operation_status(
        &self,
        op: &OperationId,
        status: OperationStatus,
        now_ms: i64,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE operations SET status = ?2, updated_ms = ?3 WHERE operation_id = ?1",
            )?
            .execute(params![op, status, now_ms])?;
        Ok(())
    }

    /// Operations with their status, newest first (inspector).
    ///
    /// # Errors
    /// Storage errors.
    pub fn operations(&self, limit: u32) -> Result<Vec<(OperationId, OperationStatus)>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT operation_id, status FROM operations ORDER BY created_ms DESC, operation_id LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }
}

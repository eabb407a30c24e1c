//! Pruning (`Ledger::prune`): which executions may go, deleting them with
//! everything that hangs off them, and the `tombstones` that answer a very
//! late retry afterwards.

use rusqlite::{params, OptionalExtension};

use super::dao::Dao;
use super::error::Result;
use crate::model::{ArgsDigest, DigestScheme, ExecutionId, ExecutionStatus, OperationId};

/// What is left of a pruned execution: enough for `begin` to refuse a very
/// late retry, nothing of its arguments or result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    /// The pruned execution.
    pub execution_id: ExecutionId,
    /// The digest of its arguments.
    pub args_digest: ArgsDigest,
    /// The terminal status it had when pruned.
    pub final_status: ExecutionStatus,
    /// How its digest was computed.
    pub digest_scheme: DigestScheme,
    /// When it was pruned, ms since the Unix epoch.
    pub pruned_ms: i64,
}

/// One execution that `prune` may delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneCandidate {
    /// Position in the scan (the row id); the next page starts after it.
    pub cursor: i64,
    /// The execution.
    pub execution_id: ExecutionId,
    /// Its operation.
    pub operation_id: OperationId,
    /// Its round.
    pub round: u32,
    /// The digest of its arguments.
    pub args_digest: ArgsDigest,
    /// Its terminal status.
    pub status: ExecutionStatus,
}

/// Rows deleted with one pruned execution.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedRows {
    /// Transition log entries.
    pub transitions: u64,
    /// Approval decisions.
    pub approvals: u64,
    /// Independent-batch item records.
    pub batch_items: u64,
    /// Background job records.
    pub jobs: u64,
    /// Processed webhook events.
    pub webhook_events: u64,
}

/// The terminal statuses `prune` may remove (a `failed_before_commit` row only
/// when it is not retryable). Everything else needs attention or may still
/// run, and is never pruned.
///
/// Never prunable, whatever the status: an execution with evidence of a
/// stale attempt (it may be the only trace of an effect), and one that is not
/// delivered but has committed batch items (a partial commit of a version 3
/// ledger recorded as failed or cancelled: its items happened).
const PRUNABLE: &str = "(status IN ('result_delivered','rejected','cancelled_before_commit')
        OR (status = 'failed_before_commit' AND retryable IS NOT 1))
    AND NOT EXISTS (SELECT 1 FROM evidence v WHERE v.execution_id = executions.execution_id)
    AND (status = 'result_delivered'
         OR NOT EXISTS (SELECT 1 FROM batch_items b WHERE b.execution_id = executions.execution_id))";

impl Dao<'_> {
    /// The tombstone of a pruned execution, if any.
    ///
    /// # Errors
    /// Storage errors.
    pub fn tombstone(&self, id: &ExecutionId) -> Result<Option<Tombstone>> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT args_digest, final_status, pruned_ms, digest_scheme FROM tombstones
                 WHERE execution_id = ?1",
            )?
            .query_row([id], |r| {
                Ok(Tombstone {
                    execution_id: id.clone(),
                    args_digest: r.get(0)?,
                    final_status: r.get(1)?,
                    pruned_ms: r.get(2)?,
                    digest_scheme: r.get(3)?,
                })
            })
            .optional()?)
    }

    /// How many executions last updated before `cutoff_ms` are prunable.
    ///
    /// # Errors
    /// Storage errors.
    pub fn count_prunable(&self, cutoff_ms: i64) -> Result<u64> {
        let sql = format!("SELECT count(*) FROM executions WHERE updated_ms < ?1 AND ({PRUNABLE})");
        Ok(self
            .tx
            .prepare_cached(&sql)?
            .query_row([cutoff_ms], |r| r.get(0))?)
    }

    /// The next `limit` prunable executions after `cursor`, in row order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn prune_candidates(
        &self,
        cutoff_ms: i64,
        cursor: i64,
        limit: u32,
    ) -> Result<Vec<PruneCandidate>> {
        let sql = format!(
            "SELECT rowid, execution_id, operation_id, round, args_digest, status
             FROM executions WHERE rowid > ?1 AND updated_ms < ?2 AND ({PRUNABLE})
             ORDER BY rowid LIMIT ?3"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![cursor, cutoff_ms, limit], |r| {
            Ok(PruneCandidate {
                cursor: r.get(0)?,
                execution_id: r.get(1)?,
                operation_id: r.get(2)?,
                round: r.get(3)?,
                args_digest: r.get(4)?,
                status: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// True when some execution compensates `id` (it must outlive them).
    ///
    /// # Errors
    /// Storage errors.
    pub fn has_compensations(&self, id: &ExecutionId) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM executions WHERE compensates = ?1)")?
            .query_row([id], |r| r.get(0))?)
    }

    /// Deletes one execution with its approvals, batch items, job, webhook
    /// events and transition log, leaving `tombstone` (when given) in its
    /// place. Only a prunable (terminal) row is deleted; returns `None` when
    /// the row is missing or no longer prunable.
    ///
    /// # Errors
    /// Storage errors.
    pub fn prune_execution(
        &self,
        id: &ExecutionId,
        tombstone_pruned_ms: Option<i64>,
    ) -> Result<Option<PrunedRows>> {
        let sql = format!(
            "SELECT args_digest, status,
                    length(history) - length(replace(history, char(10), '')), digest_scheme
             FROM executions WHERE execution_id = ?1 AND ({PRUNABLE})"
        );
        let found: Option<(String, String, u64, Option<i64>)> = self
            .tx
            .prepare_cached(&sql)?
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .optional()?;
        let Some((digest, status, log_entries, scheme)) = found else {
            return Ok(None);
        };
        let delete =
            |sql: &str| -> Result<u64> { Ok(self.tx.prepare_cached(sql)?.execute([id])? as u64) };
        let rows = PrunedRows {
            approvals: delete("DELETE FROM approvals WHERE execution_id = ?1")?,
            batch_items: delete("DELETE FROM batch_items WHERE execution_id = ?1")?,
            jobs: delete("DELETE FROM jobs WHERE execution_id = ?1")?,
            webhook_events: delete("DELETE FROM webhook_events WHERE execution_id = ?1")?,
            transitions: log_entries,
        };
        if let Some(pruned_ms) = tombstone_pruned_ms {
            self.tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO tombstones
                        (execution_id, args_digest, final_status, pruned_ms, digest_scheme)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?
                .execute(params![id, digest, status, pruned_ms, scheme])?;
        }
        delete("DELETE FROM executions WHERE execution_id = ?1")?;
        Ok(Some(rows))
    }

    /// Deletes the operation if no execution is left in it and it is `open`
    /// or `completed` (a cancelled operation keeps refusing new calls, so it
    /// stays). Returns how many operations were deleted (0 or 1).
    ///
    /// # Errors
    /// Storage errors.
    pub fn prune_empty_operation(&self, op: &OperationId) -> Result<u64> {
        let (start, end) = op.execution_id_range();
        let deleted = self
            .tx
            .prepare_cached(
                "DELETE FROM operations WHERE operation_id = ?1
                 AND status IN ('open','completed')
                 AND NOT EXISTS (SELECT 1 FROM executions
                                 WHERE execution_id >= ?2 AND execution_id < ?3)",
            )?
            .execute(params![op, start, end])?;
        Ok(deleted as u64)
    }

    /// Deletes tombstones written before `cutoff_ms`; returns how many.
    ///
    /// # Errors
    /// Storage errors.
    pub fn delete_tombstones_before(&self, cutoff_ms: i64) -> Result<u64> {
        Ok(self
            .tx
            .prepare_cached("DELETE FROM tombstones WHERE pruned_ms < ?1")?
            .execute([cutoff_ms])? as u64)
    }

    /// Number of tombstones.
    ///
    /// # Errors
    /// Storage errors.
    pub fn tombstone_count(&self) -> Result<u64> {
        Ok(self
            .tx
            .query_row("SELECT count(*) FROM tombstones", [], |r| r.get(0))?)
    }

    /// Returns free pages to the file system (the database was created with
    /// `auto_vacuum=INCREMENTAL`) and says how many. In WAL mode the file
    /// shrinks at the next checkpoint.
    ///
    /// # Errors
    /// Storage errors.
    pub fn incremental_vacuum(&self) -> Result<u64> {
        // The pragma frees one page per step (one result row each): it must
        // be stepped to the end, which `execute_batch` does not do.
        let mut stmt = self.tx.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = stmt.query([])?;
        let mut freed = 0;
        while rows.next()?.is_some() {
            freed += 1;
        }
        Ok(freed)
    }
}

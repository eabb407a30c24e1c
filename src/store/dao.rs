//! Data access: every query the ledger runs, against one open transaction.
//!
//! A [`Dao`] only exists inside `Store::read` / `Store::write`, so every
//! method here runs in the caller's transaction. Status updates are guarded by
//! the expected current status (`WHERE status = ?`) and report whether a row
//! changed, so a lost race is visible instead of silently overwriting.

use rusqlite::types::Type;
use rusqlite::{named_params, params, OptionalExtension, Row, Transaction};

use super::error::{Error, Result};
use crate::model::{
    ArgsDigest, DownstreamKey, ExecutionId, ExecutionRecord, ExecutionStatus, OperationId,
    OperationStatus, Provider, SessionId, Transition, TransitionEntry,
};

/// Queries over one open transaction.
pub struct Dao<'a> {
    tx: &'a Transaction<'a>,
}

/// A new execution row, written by `begin`.
#[derive(Debug, Clone)]
pub struct NewExecution<'a> {
    /// Its id.
    pub execution_id: &'a ExecutionId,
    /// Its operation.
    pub operation_id: &'a OperationId,
    /// Round within the operation.
    pub round: u32,
    /// Position within the round.
    pub position: u32,
    /// Provider of the call.
    pub provider: Provider,
    /// Provider call id.
    pub provider_call_id: &'a str,
    /// Tool name.
    pub tool_name: &'a str,
    /// Tool version.
    pub tool_version: u32,
    /// Digest of the canonical arguments.
    pub args_digest: &'a ArgsDigest,
    /// Canonical arguments.
    pub args_json: &'a str,
    /// Downstream idempotency key.
    pub downstream_key: &'a DownstreamKey,
    /// Whether approval is required.
    pub requires_approval: bool,
    /// Initial status (`prepared` or `executing`).
    pub status: ExecutionStatus,
    /// Attempts started (1 when created `executing`).
    pub attempt_count: u32,
    /// Owner session when `executing`.
    pub owner_session: Option<&'a SessionId>,
    /// Lease deadline when `executing`.
    pub lease_deadline_ms: Option<i64>,
    /// The execution this one compensates.
    pub compensates: Option<&'a ExecutionId>,
    /// Now, ms since the epoch.
    pub now_ms: i64,
}

/// Row counts for the inspector and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Number of operations.
    pub operations: u64,
    /// Number of executions per status name.
    pub executions_by_status: Vec<(String, u64)>,
    /// Rows in the transition log.
    pub transitions: u64,
}

/// The columns `row_to_record` reads, as a literal so hot queries can be
/// built with `concat!` (no formatting per call).
macro_rules! execution_columns {
    () => {
        "execution_id, operation_id, round, position, provider, \
    provider_call_id, tool_name, tool_version, args_digest, args_json, downstream_key, \
    requires_approval, status, attempt_count, owner_session, lease_deadline_ms, external_id, \
    result_json, last_reason, retryable, compensates, created_ms, updated_ms"
    };
}

const EXECUTION_COLUMNS: &str = execution_columns!();

fn bad(col: usize, what: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, Type::Text, what.to_owned().into())
}

fn row_to_record(row: &Row<'_>) -> rusqlite::Result<ExecutionRecord> {
    let provider: String = row.get(4)?;
    let status: String = row.get(12)?;
    let owner: Option<String> = row.get(14)?;
    let compensates: Option<String> = row.get(20)?;
    Ok(ExecutionRecord {
        execution_id: ExecutionId::from_stored(row.get(0)?),
        operation_id: OperationId::from_stored(row.get(1)?),
        round: row.get(2)?,
        position: row.get(3)?,
        provider: Provider::parse(&provider).ok_or_else(|| bad(4, "unknown provider"))?,
        provider_call_id: row.get(5)?,
        tool_name: row.get(6)?,
        tool_version: row.get(7)?,
        args_digest: ArgsDigest::from_stored(row.get(8)?),
        args_json: row.get(9)?,
        downstream_key: DownstreamKey::from_stored(row.get(10)?),
        requires_approval: row.get(11)?,
        status: ExecutionStatus::parse(&status).ok_or_else(|| bad(12, "unknown status"))?,
        attempt_count: row.get(13)?,
        owner_session: owner.map(SessionId::from_stored),
        lease_deadline_ms: row.get(15)?,
        external_id: row.get(16)?,
        result_json: row.get(17)?,
        last_reason: row.get(18)?,
        retryable: row.get(19)?,
        compensates: compensates.map(ExecutionId::from_stored),
        created_ms: row.get(21)?,
        updated_ms: row.get(22)?,
    })
}

impl<'a> Dao<'a> {
    pub(super) fn new(tx: &'a Transaction<'a>) -> Dao<'a> {
        Dao { tx }
    }

    /// Creates the operation if it does not exist; returns its status.
    ///
    /// # Errors
    /// Storage errors.
    pub fn ensure_operation(&self, op: &OperationId, now_ms: i64) -> Result<OperationStatus> {
        self.tx
            .prepare_cached(
                "INSERT INTO operations (operation_id, status, created_ms, updated_ms)
                 VALUES (?1, 'open', ?2, ?2) ON CONFLICT(operation_id) DO NOTHING",
            )?
            .execute(params![op.as_str(), now_ms])?;
        self.operation_status(op)?
            .ok_or_else(|| Error::InvalidData("operation vanished".into()))
    }

    /// The operation's status, if it exists.
    ///
    /// # Errors
    /// Storage errors.
    pub fn operation_status(&self, op: &OperationId) -> Result<Option<OperationStatus>> {
        let name: Option<String> = self
            .tx
            .prepare_cached("SELECT status FROM operations WHERE operation_id = ?1")?
            .query_row([op.as_str()], |r| r.get(0))
            .optional()?;
        name.map(|n| {
            OperationStatus::parse(&n).ok_or_else(|| Error::InvalidData("operation status".into()))
        })
        .transpose()
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
            .execute(params![op.as_str(), status.as_str(), now_ms])?;
        Ok(())
    }

    /// Records the round if it is new.
    ///
    /// # Errors
    /// Storage errors.
    pub fn ensure_round(&self, op: &OperationId, round: u32, now_ms: i64) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO rounds (operation_id, round, created_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT(operation_id, round) DO NOTHING",
            )?
            .execute(params![op.as_str(), round, now_ms])?;
        Ok(())
    }

    /// Reads one execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        const SQL: &str = concat!(
            "SELECT ",
            execution_columns!(),
            " FROM executions WHERE execution_id = ?1"
        );
        Ok(self
            .tx
            .prepare_cached(SQL)?
            .query_row([id.as_str()], row_to_record)
            .optional()?)
    }

    /// Inserts a new execution and logs its creation.
    ///
    /// # Errors
    /// Storage errors (a duplicate id is a constraint error).
    pub fn insert_execution(&self, new: &NewExecution<'_>, session: &SessionId) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO executions (execution_id, operation_id, round, position, provider,
                    provider_call_id, tool_name, tool_version, args_digest, args_json,
                    downstream_key, requires_approval, status, attempt_count, owner_session,
                    lease_deadline_ms, compensates, created_ms, updated_ms)
                 VALUES (:id, :op, :round, :pos, :provider, :call, :tool, :version, :digest,
                    :args, :key, :approval, :status, :attempts, :owner, :lease, :comp, :now, :now)",
            )?
            .execute(named_params! {
                ":id": new.execution_id.as_str(),
                ":op": new.operation_id.as_str(),
                ":round": new.round,
                ":pos": new.position,
                ":provider": new.provider.as_str(),
                ":call": new.provider_call_id,
                ":tool": new.tool_name,
                ":version": new.tool_version,
                ":digest": new.args_digest.as_str(),
                ":args": new.args_json,
                ":key": new.downstream_key.as_str(),
                ":approval": new.requires_approval,
                ":status": new.status.as_str(),
                ":attempts": new.attempt_count,
                ":owner": new.owner_session.map(SessionId::as_str),
                ":lease": new.lease_deadline_ms,
                ":comp": new.compensates.map(ExecutionId::as_str),
                ":now": new.now_ms,
            })?;
        self.log(
            new.execution_id,
            None,
            new.status,
            if new.status == ExecutionStatus::Executing {
                "start"
            } else {
                "prepare"
            },
            new.attempt_count,
            session,
            None,
            new.now_ms,
        )
    }

    /// Moves an execution from `from` to `to` (already checked against the
    /// transition table by the caller) and logs it. Leaving `executing`
    /// clears the owner and lease; entering it sets them and the attempt.
    /// Returns false when the row was not in `from` (a lost race).
    ///
    /// # Errors
    /// Storage errors, or [`Error::Guard`] if the schema refuses the move.
    #[allow(clippy::too_many_arguments)]
    pub fn move_status(
        &self,
        id: &ExecutionId,
        from: ExecutionStatus,
        transition: Transition,
        to: ExecutionStatus,
        change: &StatusFields<'_>,
        session: &SessionId,
        now_ms: i64,
    ) -> Result<bool> {
        let executing = to == ExecutionStatus::Executing;
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE executions SET status = :to, updated_ms = :now,
                    attempt_count = COALESCE(:attempt, attempt_count),
                    owner_session = CASE WHEN :executing THEN :owner ELSE NULL END,
                    lease_deadline_ms = CASE WHEN :executing THEN :lease ELSE NULL END,
                    result_json = COALESCE(:result, result_json),
                    external_id = COALESCE(:external, external_id),
                    last_reason = COALESCE(:reason, last_reason),
                    retryable = COALESCE(:retryable, retryable)
                 WHERE execution_id = :id AND status = :from",
            )?
            .execute(named_params! {
                ":id": id.as_str(),
                ":from": from.as_str(),
                ":to": to.as_str(),
                ":now": now_ms,
                ":attempt": change.attempt,
                ":executing": executing,
                ":owner": session.as_str(),
                ":lease": change.lease_deadline_ms,
                ":result": change.result_json,
                ":external": change.external_id,
                ":reason": change.reason,
                ":retryable": change.retryable,
            })?;
        if changed == 0 {
            return Ok(false);
        }
        let attempt: u32 = match change.attempt {
            Some(a) => a,
            None => self
                .tx
                .prepare_cached("SELECT attempt_count FROM executions WHERE execution_id = ?1")?
                .query_row([id.as_str()], |r| r.get(0))?,
        };
        self.log(
            id,
            Some(from),
            to,
            transition.as_str(),
            attempt,
            session,
            change.reason,
            now_ms,
        )?;
        Ok(true)
    }

    /// Stores the downstream's id for the effect as soon as it is known.
    /// Returns false when the row is missing or holds a different id.
    ///
    /// # Errors
    /// Storage errors.
    pub fn set_external_id(&self, id: &ExecutionId, external: &str, now_ms: i64) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE executions SET external_id = ?2, updated_ms = ?3
                 WHERE execution_id = ?1 AND (external_id IS NULL OR external_id = ?2)",
            )?
            .execute(params![id.as_str(), external, now_ms])?;
        Ok(changed == 1)
    }

    /// Extends the lease of an `executing` row owned by `session`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn renew_lease(
        &self,
        id: &ExecutionId,
        session: &SessionId,
        deadline_ms: i64,
    ) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE executions SET lease_deadline_ms = ?3
                 WHERE execution_id = ?1 AND status = 'executing' AND owner_session = ?2",
            )?
            .execute(params![id.as_str(), session.as_str(), deadline_ms])?;
        Ok(changed == 1)
    }

    /// Records an approval decision bound to a digest.
    ///
    /// # Errors
    /// Storage errors.
    pub fn record_approval(
        &self,
        id: &ExecutionId,
        digest: &ArgsDigest,
        approved: bool,
        preview_json: Option<&str>,
        now_ms: i64,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO approvals (execution_id, args_digest, decision, preview_json, decided_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(execution_id, args_digest) DO UPDATE SET
                    decision = excluded.decision, preview_json = excluded.preview_json,
                    decided_ms = excluded.decided_ms",
            )?
            .execute(params![
                id.as_str(),
                digest.as_str(),
                if approved { "approved" } else { "rejected" },
                preview_json,
                now_ms
            ])?;
        Ok(())
    }

    /// The approval preview recorded for `(id, digest)`, if approved.
    ///
    /// # Errors
    /// Storage errors.
    pub fn approval(
        &self,
        id: &ExecutionId,
        digest: &ArgsDigest,
    ) -> Result<Option<Option<String>>> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT preview_json FROM approvals
                 WHERE execution_id = ?1 AND args_digest = ?2 AND decision = 'approved'",
            )?
            .query_row(params![id.as_str(), digest.as_str()], |r| r.get(0))
            .optional()?)
    }

    /// Every execution of an operation, in round and position order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_of(&self, op: &OperationId) -> Result<Vec<ExecutionRecord>> {
        let sql = format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions WHERE operation_id = ?1
             ORDER BY round, position, execution_id"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map([op.as_str()], row_to_record)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Executions whose status means the app still has something to do:
    /// awaiting approval or execution, executing, unknown, retryable
    /// failures, and committed results not yet delivered.
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_needing_attention(&self) -> Result<Vec<ExecutionRecord>> {
        let sql = format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions
             WHERE status IN ('prepared','approved','executing','outcome_unknown',
                              'failed_before_commit','committed')
             ORDER BY created_ms, execution_id"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map([], row_to_record)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Compensations recorded for `original`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn compensations_of(&self, original: &ExecutionId) -> Result<Vec<ExecutionRecord>> {
        let sql = format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions WHERE compensates = ?1 ORDER BY created_ms"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map([original.as_str()], row_to_record)?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// The transition log of one execution, oldest first.
    ///
    /// # Errors
    /// Storage errors.
    pub fn transitions_of(&self, id: &ExecutionId) -> Result<Vec<TransitionEntry>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT from_status, to_status, transition, attempt, reason, at_ms FROM transitions
             WHERE execution_id = ?1 ORDER BY seq",
        )?;
        let rows = stmt.query_map([id.as_str()], |r| {
            let from: Option<String> = r.get(0)?;
            let to: String = r.get(1)?;
            Ok(TransitionEntry {
                from: match from {
                    Some(f) => {
                        Some(ExecutionStatus::parse(&f).ok_or_else(|| bad(0, "unknown status"))?)
                    }
                    None => None,
                },
                to: ExecutionStatus::parse(&to).ok_or_else(|| bad(1, "unknown status"))?,
                transition: r.get(2)?,
                attempt: r.get(3)?,
                reason: r.get(4)?,
                at_ms: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Counts for the inspector.
    ///
    /// # Errors
    /// Storage errors.
    pub fn stats(&self) -> Result<StoreStats> {
        let operations: u64 = self
            .tx
            .query_row("SELECT count(*) FROM operations", [], |r| r.get(0))?;
        let transitions: u64 = self
            .tx
            .query_row("SELECT count(*) FROM transitions", [], |r| r.get(0))?;
        let mut stmt = self.tx.prepare_cached(
            "SELECT status, count(*) FROM executions GROUP BY status ORDER BY status",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(StoreStats {
            operations,
            executions_by_status: rows.collect::<rusqlite::Result<Vec<_>>>()?,
            transitions,
        })
    }

    /// Operations with their status, newest first (inspector).
    ///
    /// # Errors
    /// Storage errors.
    pub fn operations(&self, limit: u32) -> Result<Vec<(OperationId, OperationStatus)>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT operation_id, status FROM operations ORDER BY created_ms DESC, operation_id LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit], |r| {
            let status: String = r.get(1)?;
            Ok((
                OperationId::from_stored(r.get(0)?),
                OperationStatus::parse(&status).ok_or_else(|| bad(1, "operation status"))?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Records the completion of one item of an independent batch.
    /// Returns false if the item was already recorded (nothing changes).
    ///
    /// # Errors
    /// Storage errors.
    pub fn insert_batch_item(
        &self,
        id: &ExecutionId,
        index: u32,
        item_key: &DownstreamKey,
        result_json: &str,
        external_id: Option<&str>,
        now_ms: i64,
    ) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "INSERT INTO batch_items (execution_id, item_index, item_key, result_json,
                    external_id, committed_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(execution_id, item_index) DO NOTHING",
            )?
            .execute(params![
                id.as_str(),
                index,
                item_key.as_str(),
                result_json,
                external_id,
                now_ms
            ])?;
        Ok(changed == 1)
    }

    /// The completed items of a batch: `(index, result JSON, external id)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn batch_items(&self, id: &ExecutionId) -> Result<Vec<(u32, String, Option<String>)>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT item_index, result_json, external_id FROM batch_items
             WHERE execution_id = ?1 ORDER BY item_index",
        )?;
        let rows = stmt.query_map([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Creates or updates the background job of an execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn upsert_job(
        &self,
        id: &ExecutionId,
        job_id: &str,
        state: &str,
        now_ms: i64,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO jobs (execution_id, job_id, state, updated_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(execution_id) DO UPDATE SET state = excluded.state,
                    updated_ms = excluded.updated_ms",
            )?
            .execute(params![id.as_str(), job_id, state, now_ms])?;
        Ok(())
    }

    /// The background job of an execution: `(job id, state)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn job(&self, id: &ExecutionId) -> Result<Option<(String, String)>> {
        Ok(self
            .tx
            .prepare_cached("SELECT job_id, state FROM jobs WHERE execution_id = ?1")?
            .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    /// Records a webhook event; returns false when `(source, event_id)` was
    /// already processed.
    ///
    /// # Errors
    /// Storage errors.
    pub fn insert_webhook_event(
        &self,
        source: &str,
        event_id: &str,
        id: &ExecutionId,
        now_ms: i64,
    ) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "INSERT INTO webhook_events (source, event_id, execution_id, received_ms)
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT(source, event_id) DO NOTHING",
            )?
            .execute(params![source, event_id, id.as_str(), now_ms])?;
        Ok(changed == 1)
    }

    #[allow(clippy::too_many_arguments)]
    fn log(
        &self,
        id: &ExecutionId,
        from: Option<ExecutionStatus>,
        to: ExecutionStatus,
        transition: &str,
        attempt: u32,
        session: &SessionId,
        reason: Option<&str>,
        now_ms: i64,
    ) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO transitions (execution_id, seq, from_status, to_status, transition,
                    attempt, session_id, reason, at_ms)
                 VALUES (?1, (SELECT coalesce(max(seq), 0) + 1 FROM transitions
                              WHERE execution_id = ?1),
                    ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                id.as_str(),
                from.map(ExecutionStatus::as_str),
                to.as_str(),
                transition,
                attempt,
                session.as_str(),
                reason,
                now_ms
            ])?;
        Ok(())
    }
}

/// The columns a status move may set besides the status.
#[derive(Debug, Clone, Default)]
pub struct StatusFields<'a> {
    /// New attempt number (entering `executing`).
    pub attempt: Option<u32>,
    /// New lease deadline (entering `executing`).
    pub lease_deadline_ms: Option<i64>,
    /// Result JSON (entering `committed`).
    pub result_json: Option<&'a str>,
    /// External id (commit, or found by reconciliation).
    pub external_id: Option<&'a str>,
    /// Reason (failures, unknown outcomes, rejections).
    pub reason: Option<&'a str>,
    /// Whether a failure may be retried.
    pub retryable: Option<bool>,
}

// ---------------------------------------------------------------------------
// Retention, size and maintenance queries (`Ledger::prune`, the inspector and
// the benchmark).
// ---------------------------------------------------------------------------

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

/// The size of the database file as SQLite sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DbSize {
    /// Bytes per page.
    pub page_size: u64,
    /// Pages in the file (including free ones).
    pub page_count: u64,
    /// Free pages (reclaimable by an incremental vacuum).
    pub freelist_count: u64,
}

impl DbSize {
    /// Total bytes (`page_size * page_count`).
    pub fn bytes(&self) -> u64 {
        self.page_size.saturating_mul(self.page_count)
    }
}

/// The terminal statuses `prune` may remove (a `failed_before_commit` row only
/// when it is not retryable). Everything else needs attention or may still
/// run, and is never pruned.
const PRUNABLE: &str = "status IN ('result_delivered','rejected','cancelled_before_commit')
        OR (status = 'failed_before_commit' AND retryable IS NOT 1)";

impl Dao<'_> {
    /// The tombstone of a pruned execution, if any.
    ///
    /// # Errors
    /// Storage errors.
    pub fn tombstone(&self, id: &ExecutionId) -> Result<Option<Tombstone>> {
        self.tx
            .prepare_cached(
                "SELECT args_digest, final_status, pruned_ms FROM tombstones
                 WHERE execution_id = ?1",
            )?
            .query_row([id.as_str()], |r| {
                let status: String = r.get(1)?;
                Ok(Tombstone {
                    execution_id: id.clone(),
                    args_digest: ArgsDigest::from_stored(r.get(0)?),
                    final_status: ExecutionStatus::parse(&status)
                        .ok_or_else(|| bad(1, "unknown status"))?,
                    pruned_ms: r.get(2)?,
                })
            })
            .optional()
            .map_err(Error::from)
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
            let status: String = r.get(5)?;
            Ok(PruneCandidate {
                cursor: r.get(0)?,
                execution_id: ExecutionId::from_stored(r.get(1)?),
                operation_id: OperationId::from_stored(r.get(2)?),
                round: r.get(3)?,
                args_digest: ArgsDigest::from_stored(r.get(4)?),
                status: ExecutionStatus::parse(&status).ok_or_else(|| bad(5, "unknown status"))?,
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
            .query_row([id.as_str()], |r| r.get(0))?)
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
            "SELECT args_digest, status FROM executions WHERE execution_id = ?1 AND ({PRUNABLE})"
        );
        let found: Option<(String, String)> = self
            .tx
            .prepare_cached(&sql)?
            .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((digest, status)) = found else {
            return Ok(None);
        };
        let delete = |sql: &str| -> Result<u64> {
            Ok(self.tx.prepare_cached(sql)?.execute([id.as_str()])? as u64)
        };
        let rows = PrunedRows {
            approvals: delete("DELETE FROM approvals WHERE execution_id = ?1")?,
            batch_items: delete("DELETE FROM batch_items WHERE execution_id = ?1")?,
            jobs: delete("DELETE FROM jobs WHERE execution_id = ?1")?,
            webhook_events: delete("DELETE FROM webhook_events WHERE execution_id = ?1")?,
            transitions: delete("DELETE FROM transitions WHERE execution_id = ?1")?,
        };
        if let Some(pruned_ms) = tombstone_pruned_ms {
            self.tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO tombstones
                        (execution_id, args_digest, final_status, pruned_ms)
                     VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![id.as_str(), digest, status, pruned_ms])?;
        }
        delete("DELETE FROM executions WHERE execution_id = ?1")?;
        Ok(Some(rows))
    }

    /// Deletes the round if no execution is left in it, then the operation if
    /// it has no round left and is `open` or `completed` (a cancelled
    /// operation keeps refusing new calls, so it stays). Returns how many
    /// operations were deleted (0 or 1).
    ///
    /// # Errors
    /// Storage errors.
    pub fn prune_empty_round(&self, op: &OperationId, round: u32) -> Result<u64> {
        self.tx
            .prepare_cached(
                "DELETE FROM rounds WHERE operation_id = ?1 AND round = ?2
                 AND NOT EXISTS (SELECT 1 FROM executions WHERE operation_id = ?1 AND round = ?2)",
            )?
            .execute(params![op.as_str(), round])?;
        let deleted = self
            .tx
            .prepare_cached(
                "DELETE FROM operations WHERE operation_id = ?1
                 AND status IN ('open','completed')
                 AND NOT EXISTS (SELECT 1 FROM rounds WHERE operation_id = ?1)",
            )?
            .execute([op.as_str()])?;
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

    /// Page size, page count and free pages.
    ///
    /// # Errors
    /// Storage errors.
    pub fn size(&self) -> Result<DbSize> {
        let get = |pragma: &str| -> Result<u64> {
            Ok(self
                .tx
                .query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))?)
        };
        Ok(DbSize {
            page_size: get("page_size")?,
            page_count: get("page_count")?,
            freelist_count: get("freelist_count")?,
        })
    }

    /// Every execution, in row order, `limit` at a time after `cursor`
    /// (export). Returns `(cursor, record)` pairs.
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_page(&self, cursor: i64, limit: u32) -> Result<Vec<(i64, ExecutionRecord)>> {
        let sql = format!(
            "SELECT {EXECUTION_COLUMNS}, rowid FROM executions WHERE rowid > ?1
             ORDER BY rowid LIMIT ?2"
        );
        let mut stmt = self.tx.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![cursor, limit], |r| {
            Ok((r.get(23)?, row_to_record(r)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Number of executions.
    ///
    /// # Errors
    /// Storage errors.
    pub fn execution_count(&self) -> Result<u64> {
        Ok(self
            .tx
            .query_row("SELECT count(*) FROM executions", [], |r| r.get(0))?)
    }

    /// Executions per tool name, most used first (inspector).
    ///
    /// # Errors
    /// Storage errors.
    pub fn executions_by_tool(&self) -> Result<Vec<(String, u64)>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT tool_name, count(*) AS n FROM executions GROUP BY tool_name
             ORDER BY n DESC, tool_name",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// The oldest creation and newest update time of any execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn execution_time_range(&self) -> Result<Option<(i64, i64)>> {
        let range: (Option<i64>, Option<i64>) = self.tx.query_row(
            "SELECT min(created_ms), max(updated_ms) FROM executions",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(range.0.zip(range.1))
    }

    /// The schema version of the open database.
    ///
    /// # Errors
    /// Storage errors.
    pub fn schema_version(&self) -> Result<i64> {
        Ok(self.tx.query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    /// Bytes used per table and index (SQLite's `dbstat`), largest first
    /// (the benchmark's size breakdown).
    ///
    /// # Errors
    /// Storage errors.
    pub fn bytes_per_object(&self) -> Result<Vec<(String, u64)>> {
        let mut stmt = self.tx.prepare(
            "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY sum(pgsize) DESC",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// `EXPLAIN QUERY PLAN` of the scan behind `recover()`, one line per step
    /// (the benchmark and a test check that it uses the partial index).
    ///
    /// # Errors
    /// Storage errors.
    pub fn attention_query_plan(&self) -> Result<Vec<String>> {
        let sql = format!(
            "EXPLAIN QUERY PLAN SELECT {EXECUTION_COLUMNS} FROM executions
             WHERE status IN ('prepared','approved','executing','outcome_unknown',
                              'failed_before_commit','committed')
             ORDER BY created_ms, execution_id"
        );
        let mut stmt = self.tx.prepare(&sql)?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(3))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Benchmark support: appends `count` delivered executions (8 per
    /// operation, 4 per round, each with its 3 transition log entries) to the
    /// real tables in one statement per table, for building a large history
    /// quickly. Ids are `hist_<batch>_op_<n>:round_<r>:call_<c>:send_email:v1`.
    /// Not for applications: nothing is validated.
    ///
    /// # Errors
    /// Storage errors.
    #[doc(hidden)]
    pub fn fill_history_for_bench(
        &self,
        batch: &str,
        count: u64,
        start_ms: i64,
        result_json: &str,
        session: &SessionId,
    ) -> Result<()> {
        let ops = count.div_ceil(8);
        // Ids are zero-padded so rows arrive in key order (fast B-tree appends).
        self.tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
             INSERT INTO operations (operation_id, status, created_ms, updated_ms)
             SELECT printf('hist_%s_op_%08d', ?1, i), 'completed', ?3 + i * 8, ?3 + i * 8 FROM n",
            params![batch, ops, start_ms],
        )?;
        self.tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
             INSERT INTO rounds (operation_id, round, created_ms)
             SELECT printf('hist_%s_op_%08d', ?1, i / 2), i % 2, ?3 + i * 4 FROM n",
            params![batch, ops * 2, start_ms],
        )?;
        self.tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2),
             ids(i, op, rnd, pos, id) AS (
                SELECT i, printf('hist_%s_op_%08d', ?1, i / 8), (i % 8) / 4, i % 4,
                       printf('hist_%s_op_%08d:round_%d:call_%d:send_email:v1',
                              ?1, i / 8, (i % 8) / 4, i % 4)
                FROM n)
             INSERT INTO executions (execution_id, operation_id, round, position, provider,
                provider_call_id, tool_name, tool_version, args_digest, args_json,
                downstream_key, requires_approval, status, attempt_count, external_id,
                result_json, created_ms, updated_ms)
             SELECT id, op, rnd, pos, 'custom', printf('call_%d', pos), 'send_email', 1,
                lower(hex(randomblob(32))),
                printf('{\"subject\":\"Report %d\",\"to\":\"user%d@example.com\"}', i, i),
                'tl_' || substr(lower(hex(randomblob(24))), 1, 48), 0, 'result_delivered', 1, printf('msg_%d', i), ?4,
                ?3 + i, ?3 + i + 1
             FROM ids",
            params![batch, count, start_ms, result_json],
        )?;
        self.tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
             INSERT INTO transitions (execution_id, seq, from_status, to_status, transition,
                attempt, session_id, reason, at_ms)
             SELECT printf('hist_%s_op_%08d:round_%d:call_%d:send_email:v1',
                           ?1, (i / 3) / 8, ((i / 3) % 8) / 4, (i / 3) % 4),
                i % 3 + 1,
                CASE i % 3 WHEN 0 THEN NULL WHEN 1 THEN 'executing' ELSE 'committed' END,
                CASE i % 3 WHEN 0 THEN 'executing' WHEN 1 THEN 'committed'
                           ELSE 'result_delivered' END,
                CASE i % 3 WHEN 0 THEN 'start' WHEN 1 THEN 'commit' ELSE 'deliver' END,
                1, ?4, NULL, ?3 + i / 3
             FROM n",
            params![batch, count * 3, start_ms, session.as_str()],
        )?;
        Ok(())
    }
}
